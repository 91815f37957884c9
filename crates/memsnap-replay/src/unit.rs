//! Units of independent work: a segment (from `segment_alloc`, or from before the trace, to
//! `segment_free` or the dump), or an expandable segment's address range. Blocks never cross
//! units, so units replay in parallel.
//!
//! Units are replayed in groups: each group walks the trace once in order and feeds every
//! event it owns to that unit. Reading the trace in order keeps memory access sequential, which
//! matters more than anything else at millions of events.

use memsnap_model::{Action, BlockState, Segment, TraceEvent};

use crate::effects::{add, Delta, Effect, Effects, CHUNK};
use crate::layout::{Layout, State};
use crate::output::{BlockLifetime, DiagnosticKind, Log, SegmentLifetime, Totals, UncertainBlock};
use crate::rules::Rules;
use crate::start::{Meta, StartBounds, StartWalk, UnitStart};

/// A unit, as routing built it.
pub(crate) struct Unit {
    /// Addresses routed to this unit.
    pub start: u64,
    pub end: u64,
    pub expandable: bool,
    pub meta: Meta,
    /// Memory reserved before the first event, by address.
    pub reserved_at_start: Vec<(u64, u64)>,
    /// Indices (in the snapshot's `segments`) of the dump-time segments in this unit.
    pub finals: Vec<usize>,
    /// Number of events routed to the unit.
    pub event_count: usize,
}

/// `owner` value of events that belong to no unit.
pub(crate) const NO_UNIT: u32 = u32::MAX;

/// A dump-time segment as the replay sees it, for the self-check.
#[derive(Clone, Debug)]
pub(crate) struct EndSegment {
    pub address: u64,
    pub size: u64,
    pub blocks: Vec<(u64, u64, BlockState)>,
}

/// What one unit produced.
pub(crate) struct Outcome {
    /// Blocks from before the trace (by address), then blocks in allocation order.
    pub blocks: Vec<BlockLifetime>,
    pub segments: Vec<SegmentLifetime>,
    /// Counters before the first event.
    pub start: Totals,
    /// Ranges reserved, and blocks active (the first `start_blocks` of `blocks`), before the
    /// first event.
    pub start_segments: usize,
    pub start_blocks: usize,
    pub uncertain: Vec<UncertainBlock>,
    /// The layout after the last event.
    pub end: Vec<EndSegment>,
    pub diagnostics: Log,
}

/// A mapped range of an expandable segment that is still mapped.
struct Extent {
    address: u64,
    size: u64,
    created: Option<u32>,
}

struct Replayer<'a> {
    unit: &'a Unit,
    rules: &'a Rules,
    layout: Layout,
    blocks: Vec<BlockLifetime>,
    segments: Vec<SegmentLifetime>,
    /// Mapped ranges of an expandable unit; cut where `segment_unmap` removes memory.
    extents: Vec<Extent>,
    /// Counters before the first event.
    start: Totals,
    uncertain: Vec<UncertainBlock>,
    diagnostics: Log,
}

/// What a group of units produced (besides its events' [`Effects`]).
pub(crate) struct GroupOutcome {
    /// Per chunk of the trace ([`CHUNK`] events), the sum of the group's deltas.
    pub chunk_sums: Vec<Delta>,
    /// One per member, in the order of `members`.
    pub outcomes: Vec<Outcome>,
}

/// Replay the units `members`; `owner` gives each event's unit. Each event's effect goes to
/// `effects`.
pub(crate) fn replay_group(
    members: &[u32],
    units: &[Unit],
    owner: &[u32],
    segments: &[Segment],
    events: &[TraceEvent],
    rules: &Rules,
    effects: &Effects,
) -> GroupOutcome {
    let mut slot = vec![NO_UNIT; units.len()];
    for (k, &u) in members.iter().enumerate() {
        slot[u as usize] = k as u32;
    }
    // Visit the group's events in trace order (or reversed), with the member's slot.
    let mine = |i: usize| {
        let u = owner[i];
        if u == NO_UNIT {
            return None;
        }
        let k = slot[u as usize];
        (k != NO_UNIT).then_some(k as usize)
    };

    // Units reserved before the first event: walk back from the dump to their start.
    let mut walks: Vec<Option<StartWalk>> = members
        .iter()
        .map(|&u| {
            let unit = &units[u as usize];
            (!unit.reserved_at_start.is_empty()).then(|| {
                let finals: Vec<&Segment> = unit.finals.iter().map(|&k| &segments[k]).collect();
                StartWalk::new(&finals)
            })
        })
        .collect();
    if walks.iter().any(Option::is_some) {
        for i in (0..events.len()).rev() {
            if let Some(w) = mine(i).and_then(|k| walks[k].as_mut()) {
                w.undo(i as u32, &events[i]);
            }
        }
    }
    let mut bounds: Vec<Option<StartBounds>> = walks
        .into_iter()
        .zip(members)
        .map(|(w, &u)| w.map(|w| w.bound(&units[u as usize].reserved_at_start, rules)))
        .collect();
    if bounds.iter().flatten().any(|b| !b.is_exact()) {
        for (i, e) in events.iter().enumerate() {
            if e.action() == Action::Alloc {
                if let Some(b) = mine(i).and_then(|k| bounds[k].as_mut()) {
                    b.narrow(i as u32, e);
                }
            }
        }
    }

    let mut replayers: Vec<Replayer> = members
        .iter()
        .zip(bounds)
        .map(|(&u, b)| Replayer::new(&units[u as usize], rules, b.map(StartBounds::finish)))
        .collect();
    let mut chunk_sums = vec![[0i64; 4]; events.len().div_ceil(CHUNK)];
    for (i, e) in events.iter().enumerate() {
        if let Some(k) = mine(i) {
            let f = replayers[k].apply(i as u32, e);
            add(&mut chunk_sums[i / CHUNK], f.delta());
            effects.store(i, f);
        }
    }
    GroupOutcome { chunk_sums, outcomes: replayers.into_iter().map(Replayer::finish).collect() }
}

impl<'a> Replayer<'a> {
    fn new(unit: &'a Unit, rules: &'a Rules, start: Option<UnitStart>) -> Replayer<'a> {
        let mut r = Replayer {
            unit,
            rules,
            layout: Layout::default(),
            blocks: Vec::new(),
            segments: Vec::new(),
            extents: Vec::new(),
            start: Totals::default(),
            uncertain: Vec::new(),
            diagnostics: Log::default(),
        };
        if let Some(start) = start {
            r.lay_out_start(start);
        }
        r
    }

    fn lay_out_start(&mut self, start: UnitStart) {
        let unit = self.unit;
        let mut blocks = start.blocks.iter().peekable();
        for &(range_start, range_end) in &unit.reserved_at_start {
            self.start.reserved = self.start.reserved.saturating_add(range_end - range_start);
            if unit.expandable {
                self.extents.push(Extent { address: range_start, size: range_end - range_start, created: None });
            }
            let mut at = range_start;
            while let Some(b) = blocks.next_if(|b| b.address < range_end) {
                if b.address > at {
                    self.layout.push(at, b.address - at, State::Free, 0);
                }
                let state = if b.pending { State::Pending } else { State::Allocated };
                self.layout.push(b.address, b.size, state, self.blocks.len() as u32);
                self.blocks.push(BlockLifetime::before_trace(b.address, b.size, b.requested_size, b.stack, b.pending));
                if !b.pending {
                    self.start.allocated = self.start.allocated.saturating_add(b.size);
                }
                self.start.active = self.start.active.saturating_add(b.size);
                self.start.requested = self.start.requested.saturating_add(b.requested_size);
                at = b.address + b.size;
            }
            if at < range_end {
                self.layout.push(at, range_end - at, State::Free, 0);
            }
        }
        if !unit.expandable {
            self.segments.push(self.segment_record(unit.start, unit.end - unit.start, None));
        }
        self.uncertain = start.uncertain;
        self.diagnostics = start.diagnostics;
    }

    fn finish(mut self) -> Outcome {
        let end = self.end_layout();
        for x in std::mem::take(&mut self.extents) {
            let record = self.segment_record(x.address, x.size, x.created);
            self.segments.push(record);
        }
        self.segments.sort_by_key(|s| (s.address, s.created_event.map_or(0, |c| u64::from(c) + 1)));
        Outcome {
            start_blocks: self.blocks.iter().take_while(|b| b.alloc_event().is_none()).count(),
            blocks: self.blocks,
            segments: self.segments,
            start: self.start,
            start_segments: self.unit.reserved_at_start.len(),
            uncertain: self.uncertain,
            end,
            diagnostics: self.diagnostics,
        }
    }

    fn segment_record(&self, address: u64, size: u64, created: Option<u32>) -> SegmentLifetime {
        SegmentLifetime {
            address,
            size,
            stream: self.unit.meta.stream,
            pool_id: self.unit.meta.pool_id,
            segment_type: self.unit.meta.segment_type,
            is_expandable: self.unit.expandable,
            created_event: created,
            released_event: None,
        }
    }

    fn diagnose(&mut self, i: u32, address: u64, kind: DiagnosticKind) {
        self.diagnostics.push(Some(i as usize), address, kind);
    }

    fn apply(&mut self, i: u32, e: &TraceEvent) -> Effect {
        match e.action() {
            Action::Alloc => self.alloc(i, e),
            Action::FreeRequested => match self.layout.get(e.addr) {
                Some(n) if n.state == State::Allocated => {
                    let (size, lifetime) = (n.size, n.lifetime);
                    self.layout.set_state(e.addr, State::Pending);
                    self.blocks[lifetime as usize].set_free_requested(i);
                    Effect::new(size, Effect::ALLOCATED, 0)
                }
                _ => {
                    self.diagnose(i, e.addr, DiagnosticKind::UnknownFree);
                    Effect::NONE
                }
            },
            Action::FreeCompleted => match self.layout.get(e.addr) {
                Some(n) if n.state != State::Free => {
                    // A block freed without `free_requested` (not seen from PyTorch) stops
                    // counting as allocated here as well.
                    let flags =
                        if n.state == State::Allocated { Effect::ACTIVE | Effect::ALLOCATED } else { Effect::ACTIVE };
                    let (size, lifetime) = (n.size, n.lifetime);
                    self.layout.release(e.addr);
                    let block = &mut self.blocks[lifetime as usize];
                    block.set_free_completed(i);
                    Effect::new(size, flags, block.requested_size)
                }
                _ => {
                    self.diagnose(i, e.addr, DiagnosticKind::UnknownFree);
                    Effect::NONE
                }
            },
            Action::SegmentAlloc => {
                if !self.layout.add_free(e.addr, e.size) {
                    self.diagnose(i, e.addr, DiagnosticKind::SegmentOverlaps);
                }
                self.segments.push(self.segment_record(e.addr, e.size, Some(i)));
                Effect::new(e.size, Effect::RESERVED | Effect::GROWS, 0)
            }
            Action::SegmentFree => {
                let whole_and_free =
                    self.layout.get(e.addr).is_some_and(|n| n.state == State::Free && n.size == e.size);
                if !(whole_and_free && self.layout.remove_free(e.addr, e.size)) {
                    self.diagnose(i, e.addr, DiagnosticKind::SegmentNotFree);
                    self.layout.clear_range(self.unit.start, self.unit.end);
                }
                if let Some(s) = self.segments.last_mut() {
                    s.released_event = Some(i);
                }
                Effect::new(e.size, Effect::RESERVED, 0)
            }
            Action::SegmentMap => {
                if !self.layout.add_free(e.addr, e.size) {
                    self.diagnose(i, e.addr, DiagnosticKind::SegmentOverlaps);
                }
                self.extents.push(Extent { address: e.addr, size: e.size, created: Some(i) });
                Effect::new(e.size, Effect::RESERVED | Effect::GROWS, 0)
            }
            Action::SegmentUnmap => {
                if !self.layout.remove_free(e.addr, e.size) {
                    self.diagnose(i, e.addr, DiagnosticKind::UnmapNotFree);
                }
                self.unmap_extents(i, e.addr, e.addr + e.size);
                Effect::new(e.size, Effect::RESERVED, 0)
            }
            Action::Snapshot | Action::Oom | Action::Annotate | Action::Other => Effect::NONE,
        }
    }

    fn alloc(&mut self, i: u32, e: &TraceEvent) -> Effect {
        let rounded = self.rules.round_size(e.size);
        let lifetime = self.blocks.len() as u32;
        let rules = self.rules;
        let split = |block: u64| rules.should_split(rounded, block);
        let mut size = self.layout.allocate(e.addr, rounded, lifetime, split);
        if size.is_none() {
            self.diagnose(i, e.addr, DiagnosticKind::AllocOverlaps);
            if self.layout.split_free_at(e.addr) {
                size = self.layout.allocate(e.addr, rounded, lifetime, split);
            }
        }
        let Some(size) = size else { return Effect::NONE };
        self.blocks.push(BlockLifetime::allocated_at(i, e.addr, size, e.size, e.stack));
        Effect::new(size, Effect::ALLOCATED | Effect::ACTIVE | Effect::GROWS, e.size)
    }

    /// Record that `[start, end)` was unmapped at event `i`: every mapped extent it overlaps
    /// ends there, and the parts outside the range live on as extents of their own.
    fn unmap_extents(&mut self, i: u32, start: u64, end: u64) {
        let mut kept = Vec::with_capacity(self.extents.len() + 1);
        for x in std::mem::take(&mut self.extents) {
            let x_end = x.address + x.size;
            if x_end <= start || end <= x.address {
                kept.push(x);
                continue;
            }
            let (cut_start, cut_end) = (x.address.max(start), x_end.min(end));
            let mut record = self.segment_record(cut_start, cut_end - cut_start, x.created);
            record.released_event = Some(i);
            self.segments.push(record);
            if x.address < cut_start {
                kept.push(Extent { address: x.address, size: cut_start - x.address, created: x.created });
            }
            if cut_end < x_end {
                kept.push(Extent { address: cut_end, size: x_end - cut_end, created: x.created });
            }
        }
        self.extents = kept;
    }

    /// The layout after the last event, as segments: the unit's segment, or each contiguous run
    /// of mapped memory of an expandable segment.
    fn end_layout(&self) -> Vec<EndSegment> {
        let mut out: Vec<EndSegment> = Vec::new();
        for n in self.layout.blocks() {
            let state = match n.state {
                State::Free => BlockState::Inactive,
                State::Allocated => BlockState::Allocated,
                State::Pending => BlockState::PendingFree,
            };
            match out.last_mut() {
                Some(s) if s.address + s.size == n.addr => {
                    s.size += n.size;
                    s.blocks.push((n.addr, n.size, state));
                }
                _ => out.push(EndSegment { address: n.addr, size: n.size, blocks: vec![(n.addr, n.size, state)] }),
            }
        }
        out
    }
}
