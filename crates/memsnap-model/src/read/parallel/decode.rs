//! Decoding one chunk of trace batches, on its own thread.
//!
//! A chunk is a run of whole batches of one trace list: `MARK entry… APPENDS` (or `entry
//! APPEND`), each entry `EMPTY_DICT MEMOIZE MARK (key value)… SETITEMS`. The decoder reads
//! exactly what [`Builder::compact`](super::super::Builder) would make of the same bytes, but
//! into tables of its own: strings, frames and stacks are numbered per chunk and given their
//! snapshot-wide ids when the chunks are merged in order ([`super::merge`]).
//!
//! Memo references are resolved by where the index falls:
//! - below the window's base: an object the VM holds (read through a shared [`StoreView`]);
//! - at or above it, in the window's first chunk: an object of this chunk ([`Slot`]);
//! - at or above it, in a later chunk: an object of this chunk or of an earlier one. Which,
//!   the chunk cannot tell while it decodes: its own base is the window's base plus every
//!   `MEMOIZE` of the chunks before it, and those are counted by their own decoders at the
//!   same time. So the reference is kept as [`Pending`] (with what it must be: a string, a
//!   frame dict, a frames list) and [`fix_up`] resolves it once the chunks before are
//!   counted: to an object of this chunk, checked as the decoder would have, or to one of an
//!   earlier chunk, kept as a reference ([`StackRef::Slot`], [`FrameRef::Slot`],
//!   [`Text::Slot`]) and checked at the merge. A chunk thus needs no walk of its own bytes
//!   before it decodes them, only a walk to its first batch (most of a window is walked
//!   once).
//!
//! Anything outside this grammar ends the chunk at the start of the batch that holds it; the
//! VM reads that batch itself. So the decoder never has to agree with the VM on an error, only
//! on what valid batches make.

use std::hash::{Hash, Hasher};

use memsnap_pickle::scan::{self, Counts};
use memsnap_pickle::{MemoRef, StoreView, Value};
use rustc_hash::{FxHashMap, FxHasher};

use super::super::{key_of, Key};
use crate::types::{Action, StackId, ALL_ACTIONS, MAX_ADDRESS, MAX_SIZE, NO_TIME};

/// Longest string a chunk takes (the VM's own cap is 16 MiB; a longer one is the VM's to
/// refuse).
const MAX_STRING: usize = 1 << 20;
/// LONG1 integers up to this many bytes (an i128, like the VM).
const MAX_LONG: usize = 16;

/// A string as an event or frame refers to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Text {
    /// `None` where a string may be: the empty string id.
    Empty,
    /// An entry of the chunk's string table.
    Local(u32),
    /// The string in a memo entry of an earlier chunk of the window.
    Slot(u32),
    /// Not yet known (an entry of [`Chunk::pending`]).
    Pending(u32),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum FrameRef {
    /// A frame dict read in this chunk.
    Local(u32),
    /// A frame dict the VM holds (heap dict id).
    Heap(u32),
    /// A frame dict in a memo entry of an earlier chunk of the window.
    Slot(u32),
    /// Not yet known (an entry of [`Chunk::pending`]).
    Pending(u32),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum StackRef {
    /// No frames (an empty or `None` frames value).
    Empty,
    /// A stack the builder already made (a frozen list's token).
    Known(StackId),
    /// A stack of the chunk's table.
    Local(u32),
    /// A list the VM holds that was never converted (heap list id).
    Heap(u32),
    /// A list in a memo entry of an earlier chunk of the window.
    Slot(u32),
    /// Not yet known (an entry of [`Chunk::pending`]).
    Pending(u32),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ActionRef {
    Known(Action),
    /// An action this version does not know, with its name (string table entry).
    Unknown(u32),
    /// The string in a memo entry of an earlier chunk of the window.
    Slot(u32),
    /// Not yet known (an entry of [`Chunk::pending`]).
    Pending(u32),
}

/// One trace entry, as the builder would convert it, with chunk-local references packed in 32
/// bits each ([`Packed`]): 48 bytes, where the plain enums and an `Option<u64>` took 80. A
/// window holds about 100 000 of these between its decode and its merge, the largest part of a
/// `summary`'s memory after the memo. An `oom` entry's `device_free` is kept aside
/// ([`Chunk::device_frees`]): one entry in hundreds of thousands has one.
#[derive(Clone, Copy, Debug)]
pub(super) struct RawEvent {
    pub addr: u64,
    pub size: u64,
    pub stream: u64,
    pub time_us: i64,
    pub stack: Packed<StackRef>,
    pub compile_context: Packed<Text>,
    pub user_metadata: Packed<Text>,
    pub action: Packed<ActionRef>,
}

const _: () = assert!(std::mem::size_of::<RawEvent>() == 48);

/// Bits of a [`Packed`] reference's payload; its tag takes the 3 above them.
const PAYLOAD_BITS: u32 = 29;
const PAYLOAD_MASK: u32 = (1 << PAYLOAD_BITS) - 1;

/// A reference enum in 32 bits: its variant in the top 3, its `u32` payload in the other 29.
/// A payload that does not fit (an id or memo index of 2^29 or more, far beyond any real
/// snapshot's) stops the batch, which the VM then reads.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) struct Packed<T>(u32, std::marker::PhantomData<T>);

/// An enum of at most 8 variants, each with a `u32` payload or none.
pub(super) trait Pack: Copy {
    fn parts(self) -> (u32, u32);
    fn from_parts(tag: u32, payload: u32) -> Self;
}

impl<T: Pack> Packed<T> {
    fn new(v: T) -> R<Self> {
        let (tag, payload) = v.parts();
        debug_assert!(tag < 8);
        if payload > PAYLOAD_MASK {
            return Err(Stop);
        }
        Ok(Packed((tag << PAYLOAD_BITS) | payload, std::marker::PhantomData))
    }

    #[inline]
    pub fn get(self) -> T {
        T::from_parts(self.0 >> PAYLOAD_BITS, self.0 & PAYLOAD_MASK)
    }
}

impl<T: Pack + std::fmt::Debug> std::fmt::Debug for Packed<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.get().fmt(f)
    }
}

impl Pack for Slot {
    fn parts(self) -> (u32, u32) {
        match self {
            Slot::Entry(e) => (0, e),
            Slot::Str(s) => (1, s),
            Slot::List(None) => (2, 0),
            Slot::List(Some(s)) => (3, s),
            Slot::Frame(f) => (4, f),
            Slot::Tuple(t) => (5, t),
        }
    }
    fn from_parts(tag: u32, p: u32) -> Self {
        match tag {
            0 => Slot::Entry(p),
            1 => Slot::Str(p),
            3 => Slot::List(Some(p)),
            4 => Slot::Frame(p),
            5 => Slot::Tuple(p),
            _ => Slot::List(None),
        }
    }
}

impl Pack for Text {
    fn parts(self) -> (u32, u32) {
        match self {
            Text::Empty => (0, 0),
            Text::Local(s) => (1, s),
            Text::Slot(g) => (2, g),
            Text::Pending(p) => (3, p),
        }
    }
    fn from_parts(tag: u32, p: u32) -> Self {
        match tag {
            1 => Text::Local(p),
            2 => Text::Slot(p),
            3 => Text::Pending(p),
            _ => Text::Empty,
        }
    }
}

impl Pack for StackRef {
    fn parts(self) -> (u32, u32) {
        match self {
            StackRef::Empty => (0, 0),
            StackRef::Known(s) => (1, s.0),
            StackRef::Local(s) => (2, s),
            StackRef::Heap(id) => (3, id),
            StackRef::Slot(g) => (4, g),
            StackRef::Pending(p) => (5, p),
        }
    }
    fn from_parts(tag: u32, p: u32) -> Self {
        match tag {
            1 => StackRef::Known(StackId(p)),
            2 => StackRef::Local(p),
            3 => StackRef::Heap(p),
            4 => StackRef::Slot(p),
            5 => StackRef::Pending(p),
            _ => StackRef::Empty,
        }
    }
}

impl Pack for ActionRef {
    fn parts(self) -> (u32, u32) {
        match self {
            ActionRef::Known(a) => (0, a as u32),
            ActionRef::Unknown(s) => (1, s),
            ActionRef::Slot(g) => (2, g),
            ActionRef::Pending(p) => (3, p),
        }
    }
    fn from_parts(tag: u32, p: u32) -> Self {
        match tag {
            1 => ActionRef::Unknown(p),
            2 => ActionRef::Slot(p),
            3 => ActionRef::Pending(p),
            _ => ActionRef::Known(ALL_ACTIONS.get(p as usize).copied().unwrap_or(Action::Other)),
        }
    }
}

/// A value kept to rebuild a memoized frame dict or tuple in the VM's heap.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Raw {
    None,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(u32),
    /// Whatever a memo entry holds (index into the memo).
    Memo(u32),
    /// The chunk's own memo entry of this rank (the chunk's base is added at the merge).
    Local(u32),
}

/// What a frame dict says, in the order it says it (the builder interns in that order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum FrameField {
    Filename(Text),
    Name(Text),
    Line(u32),
}

#[derive(Clone, Debug, Default)]
pub(super) struct LocalFrame {
    pub fields: Vec<FrameField>,
    /// The dict's items, to rebuild it in the heap.
    pub items: Vec<(Raw, Raw)>,
}

/// What one `MEMOIZE` of the chunk stored.
#[derive(Clone, Copy, Debug)]
pub(super) enum Slot {
    /// A trace entry (index into the chunk's events).
    Entry(u32),
    Str(u32),
    /// A frames list: its stack, or `None` while it is being read or when it is empty.
    List(Option<u32>),
    Frame(u32),
    /// A tuple of scalars (index into the chunk's tuples).
    Tuple(u32),
}

/// Something the builder interns, at the point of the entries where it would first meet it;
/// replayed in this order by the merge so that ids come out as the sequential reader's.
#[derive(Clone, Copy, Debug)]
pub(super) enum First {
    /// A `compile_context` or `user_metadata` string.
    Text(Text),
    /// A stack of the chunk's table.
    Stack(u32),
    /// A list the VM holds, converted here for the first time.
    HeapList(u32),
}

/// A reference a chunk made to a memo entry at or above the window's base before its own base
/// was known, and what the decoder needs it to be.
#[derive(Clone, Copy, Debug)]
pub(super) struct Pending {
    /// The memo index.
    g: u32,
    want: Want,
    /// The chunk's `MEMOIZE`s before the fetch: an entry of the chunk at or past this rank was
    /// not memoized yet (the VM would refuse the fetch).
    memoized: u32,
    /// The batch that first made it (index into [`Chunk::marks`]): where the chunk ends if it
    /// does not resolve.
    batch: u32,
}

/// What a [`Pending`] reference must resolve to, as the decoder accepts it where it was read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Want {
    /// A string (an event's or a frame's text).
    Text,
    /// An action's name.
    Action,
    /// A `frames` list.
    Stack,
    /// A frame dict.
    Frame,
    /// The value of an ignored key: a string or a tuple of this chunk, or anything earlier.
    Value,
}

/// A [`Pending`] reference resolved.
#[derive(Clone, Copy, Debug)]
enum Resolved {
    Text(Text),
    Action(ActionRef),
    Stack(StackRef),
    Frame(FrameRef),
    Value,
    /// Not what the decoder accepts there: the chunk ends before the batch that made it.
    Fails,
}

/// A key this version does not know, or an action: counted like the builder counts them.
#[derive(Clone, Copy, Debug)]
pub(super) struct Unknown {
    pub key: u32,
}

/// The chunk's state after each batch, so the merge can end a chunk at a batch boundary.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Mark {
    /// Offset in the window just after the batch.
    pub end: usize,
    pub events: usize,
    pub slot_refs: usize,
    pub slots: usize,
    pub firsts: usize,
    pub unknown: usize,
    pub stacks: usize,
    pub counts: Counts,
    pub frame_end: Option<usize>,
}

/// A decoded chunk. Its vectors are kept from one window to the next (cleared, not freed),
/// so a large file does not fault in fresh pages for every window.
#[derive(Default)]
pub(in crate::read) struct Chunk {
    /// Memo index of the first `MEMOIZE` of the chunk (set by [`fix_up`] for all but a
    /// window's first chunk).
    pub(super) base: u32,
    pub(super) start: usize,
    pub(super) events: Vec<RawEvent>,
    /// `device_free` of the `oom` entries, by event index, in order (it becomes the event's
    /// address).
    pub(super) device_frees: Vec<(u32, u64)>,
    /// The events whose stack or action is a memo entry of an earlier chunk
    /// ([`StackRef::Slot`], [`ActionRef::Slot`]), the only ones the merge must check, or that
    /// hold a [`Pending`] reference, the only ones [`fix_up`] rewrites: listed here so that
    /// neither reads every event.
    pub(super) slot_refs: Vec<u32>,
    pub(super) slots: Vec<Packed<Slot>>,
    /// Strings read from the window or the VM's heap (a few per chunk: the same ones recur).
    pub(super) strs: Vec<String>,
    pub(super) frames: Vec<LocalFrame>,
    pub(super) stacks: Vec<Vec<FrameRef>>,
    pub(super) tuples: Vec<Vec<Raw>>,
    pub(super) firsts: Vec<First>,
    pub(super) unknown: Vec<Unknown>,
    /// State after each whole batch, in order.
    pub(super) marks: Vec<Mark>,
    /// References whose target is not known while the chunk decodes, for [`fix_up`].
    pending: Vec<Pending>,
    resolved: Vec<Resolved>,
    /// Whether the chunk ended exactly where the next one starts.
    pub(super) complete: bool,
    /// Whether the batch that ended it ran past the end of the window (so more input may
    /// continue it).
    pub(super) ran_out: bool,
    // The decoder's lookup tables, kept with the chunk for reuse.
    str_ids: FxHashMap<String, u32>,
    stack_ids: FxHashMap<u64, Vec<u32>>,
    /// Per string of the table: whether a [`First::Text`] was logged for it.
    logged: Vec<bool>,
    frames_buf: Vec<FrameRef>,
}

impl Chunk {
    fn reset(&mut self, start: usize, base: u32) {
        self.base = base;
        self.start = start;
        self.events.clear();
        self.device_frees.clear();
        self.slot_refs.clear();
        self.slots.clear();
        self.strs.clear();
        self.frames.clear();
        self.stacks.clear();
        self.tuples.clear();
        self.firsts.clear();
        self.unknown.clear();
        self.marks.clear();
        self.pending.clear();
        self.complete = false;
        self.ran_out = false;
        self.str_ids.clear();
        self.stack_ids.clear();
        self.logged.clear();
    }
}

/// Everything a decoder reads besides its bytes.
#[derive(Clone, Copy)]
pub(super) struct Window<'d, 's, 'a> {
    pub data: &'d [u8],
    pub store: StoreView<'s, 'a>,
    /// Memo length when the window was taken: indices below it are the VM's.
    pub vm_memo: u32,
}

/// A malformed or unexpected construct: the batch is left to the VM.
struct Stop;

type R<T> = Result<T, Stop>;

/// Read the chunk that starts at `start` (a batch boundary) up to `stop` (the next chunk's
/// start), into `chunk`. `base` is its memo base when known (the window's first chunk); else
/// references at or above the window's base wait for [`fix_up`].
pub(super) fn decode(w: Window<'_, '_, '_>, start: usize, stop: usize, base: Option<u32>, chunk: &mut Chunk) {
    chunk.reset(start, base.unwrap_or(0));
    let mut d = Decoder {
        w,
        base,
        pos: start,
        counts: Counts::default(),
        frame_end: None,
        chunk,
        key_cache: [(u32::MAX, Key::Other); KEY_CACHE],
        text_cache: [(u32::MAX, 0); KEY_CACHE],
        vm_cache: [(u32::MAX, MemoRef::LazyList(0)); VM_CACHE],
        pending_cache: [(u32::MAX, Want::Value, 0); PENDING_CACHE],
        last_literal: ("", u32::MAX),
        ran_out: false,
    };
    while d.pos < stop {
        let mark = d.mark();
        d.ran_out = false;
        if d.batch().is_err() {
            d.chunk.ran_out = d.ran_out;
            d.restore(mark);
            break;
        }
        let m = d.mark();
        d.chunk.marks.push(m);
    }
    d.chunk.complete = d.pos == stop;
}

/// Give chunk `chunk` (decoded without its base) its base, and resolve its [`Pending`]
/// references: to its own objects, checked as the decoder checks them, or to an earlier
/// chunk's, as references for the merge to check. A reference that does not resolve ends the
/// chunk before the batch that first made it, as a failed check in the decoder would have.
pub(super) fn fix_up(chunk: &mut Chunk, base: u32) {
    chunk.base = base;
    if chunk.pending.is_empty() {
        return;
    }
    let mut resolved = std::mem::take(&mut chunk.resolved);
    resolved.clear();
    let mut fails_at = u32::MAX;
    for p in &chunk.pending {
        let r = resolve_pending(chunk, base, p);
        if matches!(r, Resolved::Fails) {
            fails_at = fails_at.min(p.batch);
        }
        resolved.push(r);
    }
    let text = |t: Text| match t {
        Text::Pending(p) => match resolved[p as usize] {
            Resolved::Text(t) => t,
            _ => t,
        },
        t => t,
    };
    for &i in &chunk.slot_refs {
        let e = &mut chunk.events[i as usize];
        if let StackRef::Pending(p) = e.stack.get() {
            if let Resolved::Stack(s) = resolved[p as usize] {
                e.stack = Packed::new(s).unwrap_or(e.stack);
            }
        }
        if let ActionRef::Pending(p) = e.action.get() {
            if let Resolved::Action(a) = resolved[p as usize] {
                e.action = Packed::new(a).unwrap_or(e.action);
            }
        }
        e.compile_context = Packed::new(text(e.compile_context.get())).unwrap_or(e.compile_context);
        e.user_metadata = Packed::new(text(e.user_metadata.get())).unwrap_or(e.user_metadata);
    }
    for stack in &mut chunk.stacks {
        for f in stack.iter_mut() {
            if let FrameRef::Pending(p) = *f {
                if let Resolved::Frame(r) = resolved[p as usize] {
                    *f = r;
                }
            }
        }
    }
    for frame in &mut chunk.frames {
        for field in &mut frame.fields {
            match field {
                FrameField::Filename(t) | FrameField::Name(t) => *t = text(*t),
                FrameField::Line(_) => {}
            }
        }
    }
    for first in &mut chunk.firsts {
        if let First::Text(t) = first {
            *t = text(*t);
        }
    }
    if (fails_at as usize) < chunk.marks.len() {
        chunk.marks.truncate(fails_at as usize);
        chunk.complete = false;
        chunk.ran_out = false;
    }
    chunk.resolved = resolved;
}

/// What pending reference `p` of `chunk` (whose base is `base`) is.
fn resolve_pending(chunk: &Chunk, base: u32, p: &Pending) -> Resolved {
    let Some(rank) = p.g.checked_sub(base) else {
        return match p.want {
            Want::Text => Resolved::Text(Text::Slot(p.g)),
            Want::Action => Resolved::Action(ActionRef::Slot(p.g)),
            Want::Stack => Resolved::Stack(StackRef::Slot(p.g)),
            Want::Frame => Resolved::Frame(FrameRef::Slot(p.g)),
            Want::Value => Resolved::Value,
        };
    };
    // A batch the decoder gave up on leaves its references behind, past the slots it took:
    // they fail at or after the chunk's end, which changes nothing.
    let Some(slot) = chunk.slots.get(rank as usize).filter(|_| rank < p.memoized) else {
        return Resolved::Fails;
    };
    match (p.want, slot.get()) {
        (Want::Text, Slot::Str(s)) => Resolved::Text(Text::Local(s)),
        (Want::Action, Slot::Str(s)) => Resolved::Action(match Action::parse(&chunk.strs[s as usize]) {
            Action::Other => ActionRef::Unknown(s),
            a => ActionRef::Known(a),
        }),
        (Want::Stack, Slot::List(None)) => Resolved::Stack(StackRef::Empty),
        (Want::Stack, Slot::List(Some(s))) => Resolved::Stack(StackRef::Local(s)),
        (Want::Frame, Slot::Frame(f)) => Resolved::Frame(FrameRef::Local(f)),
        (Want::Value, Slot::Str(_) | Slot::Tuple(_)) => Resolved::Value,
        _ => Resolved::Fails,
    }
}

const KEY_CACHE: usize = 64;
const VM_CACHE: usize = 256;
const PENDING_CACHE: usize = 256;

struct Decoder<'d, 's, 'a, 'c> {
    w: Window<'d, 's, 'a>,
    /// The chunk's memo base, when known.
    base: Option<u32>,
    pos: usize,
    counts: Counts,
    frame_end: Option<usize>,
    chunk: &'c mut Chunk,
    /// Memo index → key, for the VM's key strings (direct-mapped).
    key_cache: [(u32, Key); KEY_CACHE],
    /// Memo index → string table entry, for the VM's strings fetched as values (an action,
    /// the empty `user_metadata` of every entry).
    text_cache: [(u32, u32); KEY_CACHE],
    /// Memo index → entry, for the VM's entries the chunk fetches (direct-mapped): the same
    /// frame dicts and strings recur, and a lookup in the packed memo costs several loads.
    vm_cache: [(u32, MemoRef); VM_CACHE],
    /// (memo index, want) → [`Pending`] entry (direct-mapped): the frames a chunk brings in
    /// are fetched again by many of its entries, and one entry each keeps their stacks one
    /// (a stack is told from another by its frames' references).
    pending_cache: [(u32, Want, u32); PENDING_CACHE],
    /// The last string read literally, and its entry (the `'N/A'` every entry writes anew).
    last_literal: (&'d str, u32),
    /// Whether a read went past the end of the window.
    ran_out: bool,
}

/// What a memo reference is, seen from the chunk.
enum Got {
    Local(Slot),
    Vm(MemoRef),
    Earlier(u32),
    /// At or above the window's base, the chunk's base unknown: see [`Decoder::defer`].
    Pending(u32),
}

impl<'d> Decoder<'d, '_, '_, '_> {
    fn mark(&self) -> Mark {
        Mark {
            end: self.pos,
            events: self.chunk.events.len(),
            slot_refs: self.chunk.slot_refs.len(),
            slots: self.chunk.slots.len(),
            firsts: self.chunk.firsts.len(),
            unknown: self.chunk.unknown.len(),
            stacks: self.chunk.stacks.len(),
            counts: self.counts,
            frame_end: self.frame_end,
        }
    }

    fn restore(&mut self, m: Mark) {
        self.pos = m.end;
        self.chunk.events.truncate(m.events);
        while self.chunk.device_frees.last().is_some_and(|&(i, _)| i as usize >= m.events) {
            self.chunk.device_frees.pop();
        }
        self.chunk.slot_refs.truncate(m.slot_refs);
        self.chunk.slots.truncate(m.slots);
        // Strings and frames a failed batch added stay in the tables unreferenced (only what
        // the log and the events point at is ever given an id); its new stacks go, since a
        // stack is logged only when it is new.
        for f in &self.chunk.firsts[m.firsts..] {
            if let First::Text(Text::Local(s)) = f {
                self.chunk.logged[*s as usize] = false;
            }
        }
        self.chunk.stacks.truncate(m.stacks);
        self.chunk.stack_ids.retain(|_, ids| {
            ids.retain(|&id| (id as usize) < m.stacks);
            !ids.is_empty()
        });
        self.chunk.firsts.truncate(m.firsts);
        self.chunk.unknown.truncate(m.unknown);
        self.counts = m.counts;
        self.frame_end = m.frame_end;
    }

    // --- bytes and opcodes

    /// The next opcode, past any `FRAME` headers (whose frames must lie inside the window).
    #[inline(always)]
    fn op(&mut self) -> R<u8> {
        loop {
            let Some(&b) = self.w.data.get(self.pos) else {
                self.ran_out = true;
                return Err(Stop);
            };
            if b != scan::FRAME {
                self.pos += 1;
                self.counts.opcodes += 1;
                self.counts.memoize += (b == scan::MEMOIZE) as u64;
                return Ok(b);
            }
            let Some(len) = self.w.data.get(self.pos + 1..self.pos + 9) else {
                self.ran_out = true;
                return Err(Stop);
            };
            let n = u64::from_le_bytes(len.try_into().map_err(|_| Stop)?);
            let end = (self.pos as u64 + 9).checked_add(n).ok_or(Stop)?;
            if end > self.w.data.len() as u64 {
                self.ran_out = true;
                return Err(Stop);
            }
            self.pos += 9;
            self.counts.opcodes += 1;
            self.counts.frames += 1;
            self.frame_end = Some(end as usize);
        }
    }

    /// The next opcode without taking it.
    #[inline(always)]
    fn peek(&mut self) -> Option<u8> {
        let (pos, counts, fe) = (self.pos, self.counts, self.frame_end);
        let op = self.op().ok();
        (self.pos, self.counts, self.frame_end) = (pos, counts, fe);
        op
    }

    #[inline(always)]
    fn expect(&mut self, op: u8) -> R<()> {
        if self.op()? == op {
            Ok(())
        } else {
            Err(Stop)
        }
    }

    #[inline(always)]
    fn take(&mut self, n: usize) -> R<&'d [u8]> {
        let data: &'d [u8] = self.w.data;
        let end = self.pos.checked_add(n).ok_or(Stop)?;
        let Some(s) = data.get(self.pos..end) else {
            self.ran_out = true;
            return Err(Stop);
        };
        self.pos = end;
        Ok(s)
    }

    #[inline(always)]
    fn arg<const N: usize>(&mut self) -> R<[u8; N]> {
        self.take(N)?.try_into().map_err(|_| Stop)
    }

    /// The string argument of a string opcode already taken.
    fn string_arg(&mut self, op: u8) -> R<&'d str> {
        let n = match op {
            0x8c => self.arg::<1>()?[0] as usize,
            b'X' => u32::from_le_bytes(self.arg()?) as usize,
            _ => return Err(Stop),
        };
        if n > MAX_STRING {
            return Err(Stop);
        }
        std::str::from_utf8(self.take(n)?).map_err(|_| Stop)
    }

    /// A `MEMOIZE` if one follows: stores `slot`.
    #[inline]
    fn maybe_memoize(&mut self, slot: Slot) -> R<()> {
        if self.w.data.get(self.pos) == Some(&scan::MEMOIZE) {
            self.pos += 1;
            self.counts.opcodes += 1;
            self.counts.memoize += 1;
            self.chunk.slots.push(Packed::new(slot)?);
        } else if self.w.data.get(self.pos) == Some(&scan::FRAME) && self.peek() == Some(scan::MEMOIZE) {
            let _ = self.op();
            self.chunk.slots.push(Packed::new(slot)?);
        }
        Ok(())
    }

    /// A string written out (its opcode `op` taken): in the chunk's table, memoized when a
    /// `MEMOIZE` follows; the string and its table entry.
    fn literal(&mut self, op: u8) -> R<(&'d str, u32)> {
        let s = self.string_arg(op)?;
        let id = self.intern(s);
        self.maybe_memoize(Slot::Str(id))?;
        Ok((s, id))
    }

    fn memoize(&mut self, slot: Slot) -> R<()> {
        self.expect(scan::MEMOIZE)?;
        self.chunk.slots.push(Packed::new(slot)?);
        Ok(())
    }

    /// The memo index of a `BINGET`/`LONG_BINGET` already taken.
    #[inline(always)]
    fn get_arg(&mut self, op: u8) -> R<u32> {
        Ok(match op {
            scan::BINGET => self.arg::<1>()?[0] as u32,
            scan::LONG_BINGET => u32::from_le_bytes(self.arg()?),
            _ => return Err(Stop),
        })
    }

    #[inline]
    fn resolve(&mut self, g: u32) -> R<Got> {
        if g < self.w.vm_memo {
            let c = &mut self.vm_cache[g as usize % VM_CACHE];
            if c.0 != g {
                *c = (g, self.w.store.memo_get(g as usize).ok_or(Stop)?);
            }
            return Ok(Got::Vm(c.1));
        }
        match self.base {
            Some(base) if g >= base => {
                self.chunk.slots.get((g - base) as usize).map(|p| Got::Local(p.get())).ok_or(Stop)
            }
            Some(_) => Ok(Got::Earlier(g)),
            None => Ok(Got::Pending(g)),
        }
    }

    /// A [`Pending`] entry for memo index `g` wanted as `want`: the one a recent fetch of the
    /// same made, else a new one. An index fetched again later may get an entry of its own;
    /// each is checked on its own, and the first fails first.
    fn defer(&mut self, g: u32, want: Want) -> u32 {
        let c = &mut self.pending_cache[g as usize % PENDING_CACHE];
        if c.0 == g && c.1 == want {
            return c.2;
        }
        let p = self.chunk.pending.len() as u32;
        *c = (g, want, p);
        let memoized = self.chunk.slots.len() as u32;
        let batch = self.chunk.marks.len() as u32;
        self.chunk.pending.push(Pending { g, want, memoized, batch });
        p
    }

    // --- tables

    /// A string of the window in the chunk's table.
    fn intern(&mut self, s: &'d str) -> u32 {
        if self.last_literal.1 != u32::MAX && self.last_literal.0 == s {
            return self.last_literal.1;
        }
        let id = self.intern_copy(s);
        self.last_literal = (s, id);
        id
    }

    /// A string of the VM's memo entry `g` (a heap string `s`) in the chunk's table.
    #[inline]
    fn vm_text(&mut self, g: u32, s: u32) -> u32 {
        let c = self.text_cache[g as usize % KEY_CACHE];
        if c.0 == g {
            return c.1;
        }
        let heap = self.w.store.heap;
        let id = self.intern_copy(heap.str(s));
        self.text_cache[g as usize % KEY_CACHE] = (g, id);
        id
    }

    /// A string in the chunk's table (copied: the window and the heap do not outlive it).
    fn intern_copy(&mut self, s: &str) -> u32 {
        if let Some(&id) = self.chunk.str_ids.get(s) {
            return id;
        }
        let id = self.chunk.strs.len() as u32;
        self.chunk.strs.push(s.to_string());
        self.chunk.logged.push(false);
        self.chunk.str_ids.insert(s.to_string(), id);
        id
    }

    /// A string the builder interns as an event's text: logged the first time.
    fn log_text(&mut self, t: Text) {
        match t {
            Text::Empty => {}
            Text::Local(s) => {
                if !self.chunk.logged[s as usize] {
                    self.chunk.logged[s as usize] = true;
                    self.chunk.firsts.push(First::Text(t));
                }
            }
            Text::Slot(_) | Text::Pending(_) => self.chunk.firsts.push(First::Text(t)),
        }
    }

    /// The chunk's stack of `frames`, logged as a [`First`] when it is new.
    fn stack_of(&mut self, frames: &[FrameRef]) -> u32 {
        let mut h = FxHasher::default();
        frames.hash(&mut h);
        let key = h.finish();
        if let Some(ids) = self.chunk.stack_ids.get(&key) {
            for &id in ids {
                if self.chunk.stacks[id as usize] == frames {
                    return id;
                }
            }
        }
        let id = self.chunk.stacks.len() as u32;
        self.chunk.stacks.push(frames.to_vec());
        self.chunk.stack_ids.entry(key).or_default().push(id);
        self.chunk.firsts.push(First::Stack(id));
        id
    }

    // --- the grammar

    fn batch(&mut self) -> R<()> {
        match self.op()? {
            scan::MARK => {
                let mut n = 0;
                loop {
                    match self.op()? {
                        scan::EMPTY_DICT => self.entry()?,
                        scan::APPENDS if n > 0 => return Ok(()),
                        _ => return Err(Stop),
                    }
                    n += 1;
                }
            }
            scan::EMPTY_DICT => {
                self.entry()?;
                self.expect(scan::APPEND)
            }
            _ => Err(Stop),
        }
    }

    /// A dict key: literal or fetched, and where it came from (see [`Decoder::key_from`]).
    fn key(&mut self) -> R<(Key, Raw)> {
        let op = self.op()?;
        self.key_from(op)
    }

    /// A dict key whose first opcode `op` was taken, with the key as a value to rebuild (its
    /// table entry, or the memo index it was fetched from).
    #[inline(always)]
    fn key_from(&mut self, op: u8) -> R<(Key, Raw)> {
        match op {
            scan::BINGET | scan::LONG_BINGET => {
                let g = self.get_arg(op)?;
                let c = &mut self.key_cache[g as usize % KEY_CACHE];
                if c.0 == g {
                    return Ok((c.1, Raw::Memo(g)));
                }
                let k = match self.resolve(g)? {
                    Got::Local(Slot::Str(s)) => key_of(&self.chunk.strs[s as usize]),
                    Got::Vm(MemoRef::Value(Value::Str(s))) => {
                        let k = key_of(self.w.store.heap.str(s));
                        self.key_cache[g as usize % KEY_CACHE] = (g, k);
                        k
                    }
                    _ => return Err(Stop),
                };
                Ok((k, Raw::Memo(g)))
            }
            0x8c | b'X' => {
                let (s, id) = self.literal(op)?;
                Ok((key_of(s), Raw::Str(id)))
            }
            _ => Err(Stop),
        }
    }

    /// The string table entry of a key read as `raw` (for counting unknown keys).
    fn key_name(&mut self, raw: Raw) -> R<u32> {
        match raw {
            Raw::Str(id) => Ok(id),
            Raw::Memo(g) => match self.resolve(g)? {
                Got::Local(Slot::Str(s)) => Ok(s),
                Got::Vm(MemoRef::Value(Value::Str(s))) => {
                    let heap = self.w.store.heap;
                    Ok(self.intern_copy(heap.str(s)))
                }
                _ => Err(Stop),
            },
            _ => Err(Stop),
        }
    }

    /// A scalar value (an opcode already taken).
    #[inline(always)]
    fn scalar(&mut self, op: u8) -> R<Raw> {
        Ok(match op {
            b'N' => Raw::None,
            0x88 => Raw::Bool(true),
            0x89 => Raw::Bool(false),
            b'K' => Raw::Int(self.arg::<1>()?[0] as i128),
            b'M' => Raw::Int(u16::from_le_bytes(self.arg()?) as i128),
            b'J' => Raw::Int(i32::from_le_bytes(self.arg()?) as i128),
            0x8a => {
                let n = self.arg::<1>()?[0] as usize;
                if n > MAX_LONG {
                    return Err(Stop);
                }
                Raw::Int(memsnap_pickle::long_value(self.take(n)?).ok_or(Stop)?)
            }
            b'G' => Raw::Float(f64::from_be_bytes(self.arg()?)),
            _ => return Err(Stop),
        })
    }

    /// A scalar kept to rebuild a dict or tuple in the heap, whose integers are 64-bit (a wider
    /// one is the VM's to read).
    fn small_scalar(&mut self, op: u8) -> R<Raw> {
        match self.scalar(op)? {
            Raw::Int(i) if i64::try_from(i).is_err() => Err(Stop),
            v => Ok(v),
        }
    }

    /// Any value of an ignored key: a scalar, a string, a memo reference or a tuple of those.
    fn value(&mut self) -> R<Raw> {
        let op = self.op()?;
        match op {
            0x8c | b'X' => Ok(Raw::Str(self.literal(op)?.1)),
            scan::BINGET | scan::LONG_BINGET => {
                let g = self.get_arg(op)?;
                match self.resolve(g)? {
                    // A list or a dict fetched into an ignored key would be shared with what
                    // holds it: not what a trace entry does.
                    Got::Local(Slot::Str(_)) | Got::Local(Slot::Tuple(_)) | Got::Earlier(_) => Ok(Raw::Memo(g)),
                    Got::Pending(g) => {
                        self.defer(g, Want::Value);
                        Ok(Raw::Memo(g))
                    }
                    Got::Vm(MemoRef::Value(v)) if !matches!(v, Value::List(_) | Value::Dict(_) | Value::Set(_)) => {
                        Ok(Raw::Memo(g))
                    }
                    _ => Err(Stop),
                }
            }
            b')' => self.tuple(Vec::new()),
            _ => {
                let first = self.small_scalar(op)?;
                // Up to three scalars and TUPLE1–3: a small tuple (e.g. a pool id).
                let mut items = vec![first];
                loop {
                    match self.peek() {
                        Some(t @ 0x85..=0x87) if (t - 0x84) as usize == items.len() => {
                            let _ = self.op();
                            return self.tuple(items);
                        }
                        Some(b'N' | 0x88 | 0x89 | b'K' | b'M' | b'J' | 0x8a | b'G') if items.len() < 3 => {
                            let op = self.op()?;
                            items.push(self.small_scalar(op)?);
                        }
                        _ if items.len() == 1 => return Ok(first),
                        _ => return Err(Stop),
                    }
                }
            }
        }
    }

    fn tuple(&mut self, items: Vec<Raw>) -> R<Raw> {
        let id = self.chunk.tuples.len() as u32;
        self.chunk.tuples.push(items);
        if self.peek() != Some(scan::MEMOIZE) {
            // Only memoized tuples can be fetched again; an unmemoized one is gone.
            return Ok(Raw::None);
        }
        self.memoize(Slot::Tuple(id))?;
        Ok(Raw::Local(self.chunk.slots.len() as u32 - 1))
    }

    /// A string value (or `None`): literal, or fetched.
    fn text(&mut self) -> R<Text> {
        Ok(self.text_raw()?.0)
    }

    /// [`Decoder::text`], with the value to rebuild: `None`, its table entry when written out,
    /// or the memo index it was fetched from.
    fn text_raw(&mut self) -> R<(Text, Raw)> {
        let op = self.op()?;
        match op {
            b'N' => Ok((Text::Empty, Raw::None)),
            0x8c | b'X' => {
                let id = self.literal(op)?.1;
                Ok((Text::Local(id), Raw::Str(id)))
            }
            scan::BINGET | scan::LONG_BINGET => {
                let g = self.get_arg(op)?;
                let t = match self.resolve(g)? {
                    Got::Local(Slot::Str(s)) => Text::Local(s),
                    Got::Vm(MemoRef::Value(Value::Str(s))) => Text::Local(self.vm_text(g, s)),
                    Got::Vm(MemoRef::Value(Value::None)) => return Ok((Text::Empty, Raw::None)),
                    Got::Earlier(g) => Text::Slot(g),
                    Got::Pending(g) => Text::Pending(self.defer(g, Want::Text)),
                    _ => return Err(Stop),
                };
                Ok((t, Raw::Memo(g)))
            }
            _ => Err(Stop),
        }
    }

    fn action(&mut self) -> R<ActionRef> {
        let op = self.op()?;
        match op {
            0x8c | b'X' => {
                let (s, id) = self.literal(op)?;
                Ok(match Action::parse(s) {
                    Action::Other => ActionRef::Unknown(id),
                    a => ActionRef::Known(a),
                })
            }
            scan::BINGET | scan::LONG_BINGET => {
                let g = self.get_arg(op)?;
                match self.resolve(g)? {
                    Got::Local(Slot::Str(s)) => Ok(match Action::parse(&self.chunk.strs[s as usize]) {
                        Action::Other => ActionRef::Unknown(s),
                        a => ActionRef::Known(a),
                    }),
                    Got::Vm(MemoRef::Value(Value::Str(s))) => {
                        let id = self.vm_text(g, s);
                        Ok(match Action::parse(&self.chunk.strs[id as usize]) {
                            Action::Other => ActionRef::Unknown(id),
                            a => ActionRef::Known(a),
                        })
                    }
                    Got::Earlier(g) => Ok(ActionRef::Slot(g)),
                    Got::Pending(g) => Ok(ActionRef::Pending(self.defer(g, Want::Action))),
                    _ => Err(Stop),
                }
            }
            _ => Err(Stop),
        }
    }

    fn int(&mut self) -> R<i128> {
        let op = self.op()?;
        match self.scalar(op)? {
            Raw::Int(i) => Ok(i),
            Raw::Bool(b) => Ok(b as i128),
            _ => Err(Stop),
        }
    }

    fn entry(&mut self) -> R<()> {
        let index = self.chunk.events.len() as u32;
        self.memoize(Slot::Entry(index))?;
        self.expect(scan::MARK)?;
        let mut addr = 0;
        let mut size = 0;
        let mut stream = 0;
        let mut time_us = NO_TIME;
        let mut stack = StackRef::Empty;
        let mut compile_context = Text::Empty;
        let mut user_metadata = Text::Empty;
        let mut action = ActionRef::Known(Action::Other);
        let mut device_free = None;
        let mut action_seen = false;
        let mut frames_seen = false;
        loop {
            let op = self.op()?;
            if op == scan::SETITEMS {
                break;
            }
            let (key, key_raw) = self.key_from(op)?;
            match key {
                Key::Action => {
                    action = self.action()?;
                    action_seen = true;
                }
                Key::Addr => addr = u64_in(self.int()?, MAX_ADDRESS)?,
                Key::Size => size = u64_in(self.int()?, MAX_SIZE)?,
                Key::Stream => {
                    let i = self.int()?;
                    if i < i64::MIN as i128 || i > u64::MAX as i128 {
                        return Err(Stop);
                    }
                    stream = i as u64;
                }
                Key::TimeUs => {
                    let op = self.op()?;
                    time_us = match self.scalar(op)? {
                        Raw::None => NO_TIME,
                        Raw::Int(i) if i >= i64::MIN as i128 && i <= i64::MAX as i128 && i != NO_TIME as i128 => {
                            i as i64
                        }
                        Raw::Bool(b) => b as i64,
                        Raw::Float(f) if f.is_finite() && f as i64 != NO_TIME => f as i64,
                        _ => return Err(Stop),
                    }
                }
                Key::Frames => {
                    // The builder freezes only the last of two `frames` lists: left to it.
                    if std::mem::replace(&mut frames_seen, true) {
                        return Err(Stop);
                    }
                    stack = self.frames()?;
                }
                Key::CompileContext => {
                    compile_context = self.text()?;
                    self.log_text(compile_context);
                }
                Key::UserMetadata => {
                    user_metadata = self.text()?;
                    self.log_text(user_metadata);
                }
                Key::DeviceFree => device_free = Some(u64_in(self.int()?, u64::MAX)?),
                // A list value (`forward_frames`) stops the window: the VM reads it.
                Key::Unneeded => {
                    self.value()?;
                }
                Key::Filename | Key::Line | Key::Name | Key::Other => {
                    let key = self.key_name(key_raw)?;
                    self.chunk.unknown.push(Unknown { key });
                    self.value()?;
                }
            }
        }
        if !action_seen {
            return Err(Stop);
        }
        let ev = RawEvent {
            addr,
            size,
            stream,
            time_us,
            stack: Packed::new(stack)?,
            compile_context: Packed::new(compile_context)?,
            user_metadata: Packed::new(user_metadata)?,
            action: Packed::new(action)?,
        };
        if matches!(stack, StackRef::Slot(_) | StackRef::Pending(_))
            || matches!(action, ActionRef::Slot(_) | ActionRef::Pending(_))
            || matches!(compile_context, Text::Pending(_))
            || matches!(user_metadata, Text::Pending(_))
        {
            self.chunk.slot_refs.push(index);
        }
        if let Some(f) = device_free {
            self.chunk.device_frees.push((index, f));
        }
        self.chunk.events.push(ev);
        Ok(())
    }

    /// A `frames` value.
    fn frames(&mut self) -> R<StackRef> {
        let op = self.op()?;
        match op {
            b'N' => Ok(StackRef::Empty),
            scan::BINGET | scan::LONG_BINGET => {
                let g = self.get_arg(op)?;
                match self.resolve(g)? {
                    Got::Local(Slot::List(None)) => Ok(StackRef::Empty),
                    Got::Local(Slot::List(Some(s))) => Ok(StackRef::Local(s)),
                    Got::Vm(MemoRef::LazyList(0)) => Ok(StackRef::Empty),
                    Got::Vm(MemoRef::LazyList(t)) => Ok(StackRef::Known(StackId(t))),
                    Got::Vm(MemoRef::Value(Value::List(id))) => match self.w.store.heap.list(id) {
                        memsnap_pickle::ListStore::Frozen(t) => Ok(StackRef::Known(StackId(*t))),
                        l if l.is_empty() => Ok(StackRef::Empty),
                        memsnap_pickle::ListStore::Values(_) => {
                            self.chunk.firsts.push(First::HeapList(id));
                            Ok(StackRef::Heap(id))
                        }
                        memsnap_pickle::ListStore::Records { .. } => Err(Stop),
                    },
                    Got::Vm(MemoRef::Value(Value::None)) => Ok(StackRef::Empty),
                    Got::Earlier(g) => Ok(StackRef::Slot(g)),
                    Got::Pending(g) => Ok(StackRef::Pending(self.defer(g, Want::Stack))),
                    _ => Err(Stop),
                }
            }
            scan::EMPTY_LIST => {
                let slot = self.chunk.slots.len();
                self.memoize(Slot::List(None))?;
                let mut frames = std::mem::take(&mut self.chunk.frames_buf);
                frames.clear();
                let r = self.frame_list(&mut frames);
                let stack = match r {
                    Ok(()) if frames.is_empty() => Ok(StackRef::Empty),
                    Ok(()) => {
                        let id = self.stack_of(&frames);
                        self.chunk.slots[slot] = Packed::new(Slot::List(Some(id)))?;
                        Ok(StackRef::Local(id))
                    }
                    Err(e) => Err(e),
                };
                self.chunk.frames_buf = frames;
                stack
            }
            _ => Err(Stop),
        }
    }

    /// The items of a fresh frames list, after its `EMPTY_LIST MEMOIZE`.
    fn frame_list(&mut self, frames: &mut Vec<FrameRef>) -> R<()> {
        loop {
            match self.peek() {
                Some(scan::MARK) => {
                    let _ = self.op();
                    let mut n = 0;
                    loop {
                        let op = self.op()?;
                        if op == scan::APPENDS && n > 0 {
                            break;
                        }
                        frames.push(self.frame_ref(op)?);
                        n += 1;
                    }
                }
                Some(scan::EMPTY_DICT) => {
                    let op = self.op()?;
                    frames.push(self.frame_ref(op)?);
                    self.expect(scan::APPEND)?;
                }
                Some(scan::BINGET | scan::LONG_BINGET) => {
                    // One fetched frame then APPEND, or the entry's next key (the list is
                    // empty): only the APPEND tells.
                    let (pos, counts, fe) = (self.pos, self.counts, self.frame_end);
                    let op = self.op()?;
                    self.get_arg(op)?;
                    let appended = self.peek() == Some(scan::APPEND);
                    (self.pos, self.counts, self.frame_end) = (pos, counts, fe);
                    if !appended {
                        return Ok(());
                    }
                    let op = self.op()?;
                    frames.push(self.frame_ref(op)?);
                    self.expect(scan::APPEND)?;
                }
                _ => return Ok(()),
            }
        }
    }

    fn frame_ref(&mut self, op: u8) -> R<FrameRef> {
        match op {
            scan::BINGET | scan::LONG_BINGET => {
                let g = self.get_arg(op)?;
                match self.resolve(g)? {
                    Got::Local(Slot::Frame(f)) => Ok(FrameRef::Local(f)),
                    Got::Vm(MemoRef::Value(Value::Dict(d))) => Ok(FrameRef::Heap(d)),
                    Got::Earlier(g) => Ok(FrameRef::Slot(g)),
                    Got::Pending(g) => Ok(FrameRef::Pending(self.defer(g, Want::Frame))),
                    _ => Err(Stop),
                }
            }
            scan::EMPTY_DICT => {
                let id = self.chunk.frames.len() as u32;
                self.memoize(Slot::Frame(id))?;
                let mut frame = LocalFrame::default();
                if self.peek() == Some(scan::MARK) {
                    let _ = self.op();
                    loop {
                        if self.peek() == Some(scan::SETITEMS) {
                            let _ = self.op();
                            break;
                        }
                        self.frame_item(&mut frame)?;
                    }
                } else {
                    // One item: key value SETITEM.
                    self.frame_item(&mut frame)?;
                    self.expect(b's')?;
                }
                self.chunk.frames.push(frame);
                Ok(FrameRef::Local(id))
            }
            _ => Err(Stop),
        }
    }

    fn frame_item(&mut self, frame: &mut LocalFrame) -> R<()> {
        let (key, key_raw) = self.key()?;
        match key {
            Key::Filename | Key::Name => {
                let (t, raw) = self.text_raw()?;
                frame.fields.push(if key == Key::Filename { FrameField::Filename(t) } else { FrameField::Name(t) });
                frame.items.push((key_raw, raw));
            }
            Key::Line => {
                let op = self.op()?;
                let v = self.small_scalar(op)?;
                let line = match v {
                    Raw::Int(l) => l.clamp(0, u32::MAX as i128) as u32,
                    Raw::Bool(b) => b as u32,
                    Raw::None => 0,
                    _ => return Err(Stop),
                };
                frame.fields.push(FrameField::Line(line));
                frame.items.push((key_raw, v));
            }
            // A frame dict with a trace entry's keys: the builder would try it as an entry.
            Key::Action
            | Key::Addr
            | Key::Size
            | Key::Stream
            | Key::TimeUs
            | Key::Frames
            | Key::CompileContext
            | Key::UserMetadata
            | Key::DeviceFree
            | Key::Unneeded => return Err(Stop),
            Key::Other => {
                let v = self.value()?;
                frame.items.push((key_raw, v));
            }
        }
        Ok(())
    }
}

/// A non-negative integer at most `max`.
fn u64_in(i: i128, max: u64) -> R<u64> {
    if i >= 0 && i <= max as i128 {
        Ok(i as u64)
    } else {
        Err(Stop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip<T: Pack + PartialEq + std::fmt::Debug>(v: T) {
        assert_eq!(Packed::new(v).ok().map(Packed::get), Some(v));
    }

    /// Every variant reads back as it was packed, up to the largest payload; one past it stops
    /// the batch (the VM reads it) rather than wrapping into another reference.
    #[test]
    fn packed_references_read_back() {
        for t in [Text::Empty, Text::Local(0), Text::Local(7), Text::Slot(PAYLOAD_MASK)] {
            round_trip(t);
        }
        for s in [
            StackRef::Empty,
            StackRef::Known(StackId(3)),
            StackRef::Local(PAYLOAD_MASK),
            StackRef::Heap(9),
            StackRef::Slot(1 << 20),
        ] {
            round_trip(s);
        }
        for a in ALL_ACTIONS {
            round_trip(ActionRef::Known(a));
        }
        round_trip(ActionRef::Unknown(5));
        round_trip(ActionRef::Slot(6));
        for s in [Slot::Entry(1), Slot::Str(2), Slot::List(None), Slot::List(Some(0)), Slot::Frame(4), Slot::Tuple(5)] {
            assert_eq!(Packed::new(s).ok().map(|p| p.get().parts()), Some(s.parts()));
        }
        assert!(Packed::new(Text::Slot(PAYLOAD_MASK + 1)).is_err());
        assert!(Packed::new(StackRef::Known(StackId(u32::MAX))).is_err());
    }
}
