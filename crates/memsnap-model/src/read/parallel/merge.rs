//! Merging decoded chunks into the builder and the VM's memo, in input order.
//!
//! A chunk's batches are taken whole while every reference to an earlier chunk resolves to what
//! the decoder assumed (a list, a frame dict, a string); the first batch with one that does not
//! ends the merge there and is left to the VM, which reports it as the sequential reader would.
//! Then what the chunk interns is interned in the order the sequential reader would have met
//! it ([`First`]), its events are converted, and one memo entry is pushed per `MEMOIZE`.

use memsnap_pickle::{ErrorKind, Heap, ListStore, MemoRef, Store, StoreView, Value};

use super::super::{Builder, Contexts, Key};
use super::decode::{ActionRef, Chunk, First, FrameField, FrameRef, Mark, Packed, Raw, Slot, StackRef, Text};
use crate::types::{Action, EventContext, Frame, FrameId, StackId, StrId, TraceEvent};

const UNMAPPED: u32 = u32::MAX;

pub(super) struct Merged {
    /// The state after the last batch taken (`None`: none was).
    pub last: Option<Mark>,
    /// Whether every batch of the chunk was taken.
    pub whole: bool,
    /// The snapshot-wide ids of the chunk's strings and stacks, for [`convert`].
    pub maps: Option<Maps>,
}

/// Merge `chunk`: check its batches, intern what they intern, push their memo entries and
/// hand out record ids for their events, which [`convert`] then makes (on any thread).
pub(super) fn merge(b: &mut Builder, store: &mut Store<'_, '_>, chunk: &Chunk) -> Result<Merged, ErrorKind> {
    let taken: usize = {
        let view = store.view();
        let mut from = Mark::default();
        let mut n = 0;
        for mark in &chunk.marks {
            if !batch_resolves(b, view, chunk, &from, mark) {
                break;
            }
            from = *mark;
            n += 1;
        }
        n
    };
    let Some(&last) = taken.checked_sub(1).map(|i| &chunk.marks[i]) else {
        return Ok(Merged { last: None, whole: chunk.marks.is_empty(), maps: None });
    };
    let mut m = Maps::new(chunk);
    for first in &chunk.firsts[..last.firsts] {
        replay(b, store, chunk, &mut m, *first);
    }
    let record0 = b.records;
    b.records += last.events as u32;
    for u in &chunk.unknown[..last.unknown] {
        let name = &chunk.strs[u.key as usize];
        *b.unknown_keys.entry(format!("device_traces[][].{name}")).or_default() += 1;
    }
    push_slots(b, store, chunk, &mut m, &chunk.slots[..last.slots], record0)?;
    Ok(Merged { last: Some(last), whole: taken == chunk.marks.len(), maps: Some(m) })
}

/// What [`convert`] made of a chunk's events.
#[derive(Default)]
pub(in crate::read) struct Converted {
    /// The events' tally (all a summary read keeps of them).
    pub tally: crate::TraceTally,
    pub unknown_actions: Vec<String>,
    /// The streams and labels of the chunk's events, numbered for the chunk alone (see
    /// [`Contexts::absorb`]); `None` when the chunk had more than a table holds.
    pub contexts: Option<Contexts>,
}

/// Convert the first `n` events of a merged chunk (read-only on the builder: everything they
/// refer to was interned by [`merge`]): into `place` (`n` long) when events are kept, else into
/// `out`'s tally; the rest of what they tell goes to `out`.
pub(super) fn convert(
    b: &Builder,
    view: StoreView<'_, '_>,
    chunk: &Chunk,
    m: &Maps,
    n: usize,
    out: &mut Converted,
    place: &mut [TraceEvent],
) {
    out.tally = crate::TraceTally::default();
    out.unknown_actions.clear();
    let mut contexts = out.contexts.take().unwrap_or_default();
    contexts.clear();
    let mut fits = true;
    let mut device_frees = chunk.device_frees.iter().peekable();
    for (k, ev) in chunk.events[..n].iter().enumerate() {
        let device_free = device_frees.next_if(|&&(i, _)| i as usize == k).map(|&(_, f)| f);
        let (mut e, context) = event(b, view, chunk, m, ev, device_free, &mut out.unknown_actions);
        match contexts.intern(context) {
            Some(id) => e.set_context(id),
            None => fits = false,
        }
        out.tally.add(&e);
        if b.keep_events {
            place[k] = e;
        }
    }
    out.contexts = fits.then_some(contexts);
}

/// Chunk id → snapshot-wide id, filled as the merge meets them.
pub(super) struct Maps {
    strs: Vec<u32>,
    frames: Vec<u32>,
    stacks: Vec<u32>,
    /// Heap string made for a chunk string (for memo entries and rebuilt dicts).
    heap_strs: Vec<u32>,
}

impl Maps {
    fn new(chunk: &Chunk) -> Maps {
        Maps {
            strs: vec![UNMAPPED; chunk.strs.len()],
            frames: vec![UNMAPPED; chunk.frames.len()],
            stacks: vec![UNMAPPED; chunk.stacks.len()],
            heap_strs: vec![UNMAPPED; chunk.strs.len()],
        }
    }
}

// --- checks: does every reference of a batch resolve as the decoder assumed?

/// The batch between marks `from` and `to`.
fn batch_resolves(b: &mut Builder, view: StoreView<'_, '_>, chunk: &Chunk, from: &Mark, to: &Mark) -> bool {
    let firsts = &chunk.firsts[from.firsts..to.firsts];
    chunk.slot_refs[from.slot_refs..to.slot_refs].iter().all(|&i| {
        let e = &chunk.events[i as usize];
        stack_resolves(view, e.stack.get()) && action_resolves(view, e.action.get())
    }) && firsts.iter().all(|f| match *f {
        First::Text(t) => text_resolves(view, t),
        First::Stack(s) => chunk.stacks[s as usize].iter().all(|f| frame_resolves(b, view, chunk, *f)),
        First::HeapList(id) => heap_list_resolves(b, view, id),
    })
}

fn text_resolves(view: StoreView<'_, '_>, t: Text) -> bool {
    match t {
        Text::Slot(g) => matches!(view.memo_get(g as usize), Some(MemoRef::Value(Value::Str(_) | Value::None))),
        // `fix_up` resolves every reference of the batches it leaves.
        Text::Pending(_) => false,
        Text::Empty | Text::Local(_) => true,
    }
}

fn action_resolves(view: StoreView<'_, '_>, a: ActionRef) -> bool {
    match a {
        ActionRef::Slot(g) => matches!(view.memo_get(g as usize), Some(MemoRef::Value(Value::Str(_)))),
        ActionRef::Pending(_) => false,
        ActionRef::Known(_) | ActionRef::Unknown(_) => true,
    }
}

fn stack_resolves(view: StoreView<'_, '_>, s: StackRef) -> bool {
    match s {
        StackRef::Slot(g) => match view.memo_get(g as usize) {
            Some(MemoRef::LazyList(_)) => true,
            Some(MemoRef::Value(Value::List(id))) => {
                matches!(view.heap.list(id), ListStore::Frozen(_)) || view.heap.list(id).is_empty()
            }
            _ => false,
        },
        StackRef::Pending(_) => false,
        // A chunk's own stacks are checked where they are logged (`First::Stack`).
        StackRef::Empty | StackRef::Known(_) | StackRef::Local(_) | StackRef::Heap(_) => true,
    }
}

fn frame_resolves(b: &mut Builder, view: StoreView<'_, '_>, chunk: &Chunk, f: FrameRef) -> bool {
    match f {
        FrameRef::Local(lf) => chunk.frames[lf as usize].fields.iter().all(|field| match field {
            FrameField::Filename(t) | FrameField::Name(t) => text_resolves(view, *t),
            FrameField::Line(_) => true,
        }),
        FrameRef::Heap(d) => heap_frame_resolves(b, view.heap, d),
        FrameRef::Slot(g) => match view.memo_get(g as usize) {
            Some(MemoRef::Value(Value::Dict(d))) => heap_frame_resolves(b, view.heap, d),
            _ => false,
        },
        FrameRef::Pending(_) => false,
    }
}

/// Whether [`Builder::frame`] would convert heap dict `d` (without interning anything).
fn heap_frame_resolves(b: &mut Builder, heap: &Heap<'_>, d: u32) -> bool {
    if b.frame_cache.contains_key(&d) {
        return true;
    }
    heap.dict(d).iter().all(|&(k, v)| match b.key(heap, k) {
        Key::Filename | Key::Name => matches!(v, Value::Str(_) | Value::None),
        Key::Line => v == Value::None || heap.as_i128(v).is_some(),
        _ => true,
    })
}

fn heap_list_resolves(b: &mut Builder, view: StoreView<'_, '_>, id: u32) -> bool {
    match view.heap.list(id) {
        ListStore::Frozen(_) => true,
        ListStore::Records { .. } => false,
        ListStore::Values(vals) => vals.iter().all(|v| match v {
            Value::Dict(d) => heap_frame_resolves(b, view.heap, *d),
            _ => false,
        }),
    }
}

// --- interning, in the sequential reader's order

fn replay(b: &mut Builder, store: &mut Store<'_, '_>, chunk: &Chunk, m: &mut Maps, first: First) {
    match first {
        First::Text(t) => {
            text_id(b, store.view(), chunk, m, t);
        }
        First::Stack(s) => {
            if m.stacks[s as usize] != UNMAPPED {
                return;
            }
            let mut frames = Vec::with_capacity(chunk.stacks[s as usize].len());
            for &f in &chunk.stacks[s as usize] {
                frames.push(frame_id(b, store.view(), chunk, m, f));
            }
            m.stacks[s as usize] = b.intern_stack(frames).0;
        }
        First::HeapList(id) => {
            // As the builder converts an entry whose frames list the VM holds: the list's
            // stack, then the list frozen with it.
            let list = Value::List(id);
            if let Ok(sid) = b.stack(store.heap(), list) {
                if matches!(store.heap().list(id), ListStore::Values(v) if !v.is_empty()) {
                    store.freeze_list(id, sid.0);
                    b.stack_cache.remove(&id);
                }
            }
        }
    }
}

fn text_id(b: &mut Builder, view: StoreView<'_, '_>, chunk: &Chunk, m: &mut Maps, t: Text) -> StrId {
    match t {
        Text::Empty => StrId::EMPTY,
        Text::Local(s) => {
            if m.strs[s as usize] == UNMAPPED {
                m.strs[s as usize] = b.intern(&chunk.strs[s as usize]);
            }
            StrId(m.strs[s as usize])
        }
        Text::Slot(g) => match memo_value(view, g) {
            Some(Value::Str(s)) => b.heap_str_id(view.heap, s),
            _ => StrId::EMPTY,
        },
        // Checked away by `batch_resolves`.
        Text::Pending(_) => StrId::EMPTY,
    }
}

/// The value of memo entry `g` (checked to be one by `batch_resolves`).
fn memo_value(view: StoreView<'_, '_>, g: u32) -> Option<Value> {
    match view.memo_get(g as usize) {
        Some(MemoRef::Value(v)) => Some(v),
        _ => None,
    }
}

fn frame_id(b: &mut Builder, view: StoreView<'_, '_>, chunk: &Chunk, m: &mut Maps, f: FrameRef) -> FrameId {
    match f {
        FrameRef::Local(lf) => {
            if m.frames[lf as usize] == UNMAPPED {
                let mut frame = Frame { filename: StrId::EMPTY, line: 0, name: StrId::EMPTY };
                for field in &chunk.frames[lf as usize].fields {
                    match *field {
                        FrameField::Filename(t) => frame.filename = text_id(b, view, chunk, m, t),
                        FrameField::Name(t) => frame.name = text_id(b, view, chunk, m, t),
                        FrameField::Line(l) => frame.line = l,
                    }
                }
                m.frames[lf as usize] = b.add_frame(frame).0;
            }
            FrameId(m.frames[lf as usize])
        }
        FrameRef::Heap(d) => b.frame(view.heap, Value::Dict(d)).unwrap_or(FrameId(0)),
        FrameRef::Slot(g) => match memo_value(view, g) {
            Some(v @ Value::Dict(_)) => b.frame(view.heap, v).unwrap_or(FrameId(0)),
            _ => FrameId(0),
        },
        // Checked away by `batch_resolves`.
        FrameRef::Pending(_) => FrameId(0),
    }
}

// --- events and memo entries

fn event(
    b: &Builder,
    view: StoreView<'_, '_>,
    chunk: &Chunk,
    m: &Maps,
    e: &super::decode::RawEvent,
    device_free: Option<u64>,
    unknown_actions: &mut Vec<String>,
) -> (TraceEvent, EventContext) {
    let stack = match e.stack.get() {
        StackRef::Empty => StackId::EMPTY,
        StackRef::Known(s) => s,
        StackRef::Local(s) => StackId(m.stacks[s as usize]),
        StackRef::Heap(id) => match view.heap.list(id) {
            ListStore::Frozen(t) => StackId(*t),
            _ => StackId::EMPTY,
        },
        StackRef::Slot(g) => match view.memo_get(g as usize) {
            Some(MemoRef::LazyList(t)) => StackId(t),
            Some(MemoRef::Value(Value::List(id))) => match view.heap.list(id) {
                ListStore::Frozen(t) => StackId(*t),
                _ => StackId::EMPTY,
            },
            _ => StackId::EMPTY,
        },
        // Resolved by `fix_up` in every batch the merge takes.
        StackRef::Pending(_) => StackId::EMPTY,
    };
    let text = |t: Text| match t {
        Text::Empty => StrId::EMPTY,
        Text::Local(s) => StrId(m.strs[s as usize]),
        // Interned by the replay already: found in the builder's cache.
        Text::Slot(g) => match memo_value(view, g) {
            Some(Value::Str(s)) => b.cached_str_id(s).unwrap_or(StrId::EMPTY),
            _ => StrId::EMPTY,
        },
        Text::Pending(_) => StrId::EMPTY,
    };
    let cc = text(e.compile_context.get());
    let um = text(e.user_metadata.get());
    let action = match e.action.get() {
        ActionRef::Known(a) => a,
        ActionRef::Unknown(s) => {
            unknown_actions.push(chunk.strs[s as usize].clone());
            Action::Other
        }
        ActionRef::Slot(g) => match view.memo_get(g as usize) {
            Some(MemoRef::Value(Value::Str(s))) => {
                let name = view.heap.str(s);
                let a = Action::parse(name);
                if a == Action::Other {
                    unknown_actions.push(name.to_string());
                }
                a
            }
            _ => Action::Other,
        },
        ActionRef::Pending(_) => Action::Other,
    };
    let addr = match (action, device_free) {
        (Action::Oom, Some(f)) => f,
        _ => e.addr,
    };
    let mut ev = TraceEvent::new(action, addr);
    ev.size = e.size;
    ev.time_us = e.time_us;
    ev.stack = stack;
    let context = EventContext {
        stream: e.stream,
        compile_context: if Some(cc) == b.na_id { StrId::EMPTY } else { cc },
        user_metadata: um,
    };
    (ev, context)
}

fn push_slots(
    b: &mut Builder,
    store: &mut Store<'_, '_>,
    chunk: &Chunk,
    m: &mut Maps,
    slots: &[Packed<Slot>],
    record0: u32,
) -> Result<(), ErrorKind> {
    // Frame dicts hold strings memoized after them: rebuilt once every entry is pushed.
    let mut pending: Vec<(usize, u32)> = Vec::new();
    store.reserve_memo(slots.len());
    for slot in slots {
        match slot.get() {
            Slot::Entry(e) => store.memoize(Value::Record(record0 + e))?,
            Slot::Str(s) => {
                let v = heap_str(store, chunk, m, s);
                store.memoize(v)?
            }
            Slot::List(None) => store.memoize_lazy_list(0)?,
            Slot::List(Some(s)) => store.memoize_lazy_list(m.stacks[s as usize])?,
            Slot::Frame(f) => pending.push((store.memoize_pending()?, f)),
            Slot::Tuple(t) => {
                let items = chunk.tuples[t as usize].iter().map(|r| raw_value(store, chunk, m, *r)).collect();
                let v = store.add_tuple(items);
                store.memoize(v)?
            }
        }
    }
    for (idx, f) in pending {
        let items: Vec<(Value, Value)> = chunk.frames[f as usize]
            .items
            .iter()
            .map(|&(k, v)| (raw_value(store, chunk, m, k), raw_value(store, chunk, m, v)))
            .collect();
        let v = store.add_dict(items, idx);
        store.rememoize(idx, v)?;
        if let (Value::Dict(d), fid) = (v, m.frames[f as usize]) {
            if fid != UNMAPPED {
                b.frame_cache.insert(d, FrameId(fid));
            }
        }
    }
    Ok(())
}

fn heap_str(store: &mut Store<'_, '_>, chunk: &Chunk, m: &mut Maps, s: u32) -> Value {
    if m.heap_strs[s as usize] == UNMAPPED {
        let Value::Str(id) = store.add_str(chunk.strs[s as usize].to_string()) else { unreachable!() };
        m.heap_strs[s as usize] = id;
    }
    Value::Str(m.heap_strs[s as usize])
}

fn raw_value(store: &mut Store<'_, '_>, chunk: &Chunk, m: &mut Maps, r: Raw) -> Value {
    match r {
        Raw::None => Value::None,
        Raw::Bool(v) => Value::Bool(v),
        // The decoder keeps only integers that fit 64 bits in rebuilt objects.
        Raw::Int(i) => Value::Int(i as i64),
        Raw::Float(f) => Value::Float(f),
        Raw::Str(s) => heap_str(store, chunk, m, s),
        Raw::Memo(g) => match store.view().memo_get(g as usize) {
            Some(MemoRef::Value(v)) => v,
            _ => Value::None,
        },
        Raw::Local(rank) => match store.view().memo_get((chunk.base + rank) as usize) {
            Some(MemoRef::Value(v)) => v,
            _ => Value::None,
        },
    }
}
