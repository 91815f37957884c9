//! Labels the program put on its allocations, as a second way to group memory beside the
//! allocating line: `user_metadata` (a string the program sets with
//! `torch.cuda.memory._set_memory_metadata`, copied by the allocator into every trace entry
//! recorded while it is set) and `compile_context` (the `torch.compile` region, e.g.
//! "Torch-Compiled Region: 0/0", active when the allocation was made). Both are properties of
//! the allocation event, so a block's label is its `alloc` event's; blocks from before the trace
//! have none. The metadata is per thread: what autograd's engine thread allocates during a
//! backward pass carries none, even inside a labelled phase (fixture `formats/f04_metadata`: its
//! 1,535 unlabelled entries are exactly the frameless backward ones), so "(no label)" is not
//! "outside every phase".
//!
//! An `annotate` entry (torch >= 2.14, `torch.cuda.memory._annotate_tensor`) labels an
//! allocation after the fact: its `addr` is the tensor's storage, which is the block's address,
//! and its `user_metadata` the text. From that event until the block is freed, the block's
//! metadata label is the newest such text ([`Annotations`]); before it, its `alloc` event's.
//!
//! A label that is set for a while is also a named phase: [`label_spans`] gives, per distinct
//! value, the first and last event that carried it.

use std::collections::{BTreeMap, HashMap};

use memsnap_model::{Action, Snapshot, StrId, TraceEvent};
use memsnap_replay::BlockLifetime;

/// Which label of a trace entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LabelKind {
    /// `user_metadata`.
    Metadata,
    /// `compile_context` ("N/A" and absent are no label).
    CompileRegion,
}

impl LabelKind {
    pub const ALL: [LabelKind; 2] = [LabelKind::Metadata, LabelKind::CompileRegion];

    pub fn name(self) -> &'static str {
        match self {
            LabelKind::Metadata => "user_metadata",
            LabelKind::CompileRegion => "compile_context",
        }
    }

    fn of(self, snap: &Snapshot, e: &TraceEvent) -> StrId {
        let c = snap.context(e);
        match self {
            LabelKind::Metadata => c.user_metadata,
            LabelKind::CompileRegion => c.compile_context,
        }
    }
}

/// The `annotate` entries of one device's trace, by address: (event index, text), in trace
/// order. Empty for files without them (every release through 2.13).
#[derive(Default)]
pub struct Annotations {
    by_address: HashMap<u64, Vec<(u32, StrId)>>,
}

impl Annotations {
    pub fn of(snap: &Snapshot, events: &[TraceEvent]) -> Annotations {
        let mut by_address: HashMap<u64, Vec<(u32, StrId)>> = HashMap::new();
        for (i, e) in events.iter().enumerate() {
            if e.action() != Action::Annotate {
                continue;
            }
            let text = snap.context(e).user_metadata;
            if text != StrId::EMPTY {
                by_address.entry(e.addr).or_default().push((i as u32, text));
            }
        }
        Annotations { by_address }
    }

    /// The newest text given to block `b` at or before event `t` (`None`: the start) while it
    /// was allocated.
    fn newest(&self, b: &BlockLifetime, t: Option<u32>) -> Option<StrId> {
        let t = t?;
        let notes = self.by_address.get(&b.address)?;
        let after_alloc = |i: u32| b.alloc_event().is_none_or(|a| i > a);
        let before_free = |i: u32| b.freed_at().is_none_or(|f| i < f);
        notes.iter().rev().find(|&&(i, _)| i <= t && after_alloc(i) && before_free(i)).map(|&(_, s)| s)
    }
}

/// The label of a block after event `t`: for metadata, the newest `annotate` text it got by
/// then, else its `alloc` event's; `None` when it has none (or no `alloc` event).
pub fn label_of(
    snap: &Snapshot,
    events: &[TraceEvent],
    annotations: &Annotations,
    b: &BlockLifetime,
    t: Option<u32>,
    kind: LabelKind,
) -> Option<StrId> {
    if kind == LabelKind::Metadata {
        if let Some(s) = annotations.newest(b, t) {
            return Some(s);
        }
    }
    let e = events.get(b.alloc_event()? as usize)?;
    let id = kind.of(snap, e);
    (id != StrId::EMPTY).then_some(id)
}

/// Bytes per label of each kind, added block by block (in the one pass over a moment's live
/// blocks that also sums sites and categories).
#[derive(Default)]
pub struct LabelTally {
    /// Indexed by `LabelKind as usize`.
    by: [BTreeMap<Option<StrId>, u64>; LabelKind::ALL.len()],
}

impl LabelTally {
    pub fn add(
        &mut self,
        snap: &Snapshot,
        events: &[TraceEvent],
        annotations: &Annotations,
        b: &BlockLifetime,
        t: Option<u32>,
    ) {
        for kind in LabelKind::ALL {
            *self.by[kind as usize].entry(label_of(snap, events, annotations, b, t, kind)).or_default() += b.size;
        }
    }

    /// Bytes per label of `kind`, largest first (then by name); blocks without a label are one
    /// entry named `None`. Empty when no block had a label, so files without labels show
    /// nothing.
    pub fn bytes(&self, snap: &Snapshot, kind: LabelKind) -> Vec<(Option<String>, u64)> {
        let by = &self.by[kind as usize];
        if by.keys().all(Option::is_none) {
            return Vec::new();
        }
        let mut out: Vec<(Option<String>, u64)> =
            by.iter().map(|(id, bytes)| (id.map(|id| snap.str(id).to_string()), *bytes)).collect();
        out.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        out
    }
}

/// One value of a label over the trace: the events that carried it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LabelSpan {
    pub kind: LabelKind,
    pub name: String,
    pub first_event: u32,
    pub last_event: u32,
    /// Entries that carried it.
    pub events: u64,
}

/// Every label value of the trace, in order of first appearance (`annotate` entries aside).
pub fn label_spans(snap: &Snapshot, events: &[TraceEvent]) -> Vec<LabelSpan> {
    let mut spans: Vec<LabelSpan> = Vec::new();
    let mut index: BTreeMap<(LabelKind, StrId), usize> = BTreeMap::new();
    for (i, e) in events.iter().enumerate() {
        // An annotation names one block, not a stretch of the run.
        if e.action() == Action::Annotate {
            continue;
        }
        for kind in LabelKind::ALL {
            let id = kind.of(snap, e);
            if id == StrId::EMPTY {
                continue;
            }
            let k = *index.entry((kind, id)).or_insert_with(|| {
                spans.push(LabelSpan {
                    kind,
                    name: snap.str(id).to_string(),
                    first_event: i as u32,
                    last_event: i as u32,
                    events: 0,
                });
                spans.len() - 1
            });
            spans[k].last_event = i as u32;
            spans[k].events += 1;
        }
    }
    spans
}

/// A stretch of the trace under one label: from an entry carrying it to the last entry before
/// another value of the same kind appears. Entries with no label (autograd's engine thread, which
/// does not see the main thread's metadata) do not end a run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LabelRun {
    pub kind: LabelKind,
    pub name: String,
    pub first_event: u32,
    pub last_event: u32,
    /// Entries in the run that carried the label.
    pub events: u64,
}

/// The runs of every label kind, in order of their first entry: what a timeline shows as named
/// phases. A label set for training and another for evaluation, alternating, gives one run per
/// stretch ([`label_spans`] would give two overlapping spans).
pub fn label_runs(snap: &Snapshot, events: &[TraceEvent]) -> Vec<LabelRun> {
    let mut runs: Vec<LabelRun> = Vec::new();
    for kind in LabelKind::ALL {
        let mut open: Option<(StrId, u32, u32, u64)> = None;
        let close = |open: Option<(StrId, u32, u32, u64)>, runs: &mut Vec<LabelRun>| {
            if let Some((id, first, last, n)) = open {
                runs.push(LabelRun {
                    kind,
                    name: snap.str(id).to_string(),
                    first_event: first,
                    last_event: last,
                    events: n,
                });
            }
        };
        for (i, e) in events.iter().enumerate() {
            let i = i as u32;
            let id = kind.of(snap, e);
            if e.action() == Action::Annotate || id == StrId::EMPTY {
                continue;
            }
            match &mut open {
                Some((cur, _, last, n)) if *cur == id => {
                    *last = i;
                    *n += 1;
                }
                _ => {
                    close(open.take(), &mut runs);
                    open = Some((id, i, i, 1));
                }
            }
        }
        close(open, &mut runs);
    }
    runs.sort_by_key(|r| (r.first_event, r.kind));
    runs
}
