//! The layout before the first event, for traces that begin mid-run (the trace is a ring
//! buffer). The final segment table is walked back over the trace: segment and block events
//! are undone, and what remains existed before the trace began.

use std::collections::BTreeMap;

use memsnap_model::{Action, BlockState, Segment, SegmentType, Snapshot, StackId, TraceEvent};

use crate::layout::AddrMap;
use crate::output::{DiagnosticKind, Log, UncertainBlock};
use crate::rules::Rules;

/// Where a segment came from, for display: the snapshot's own record when the segment is still
/// there at dump, otherwise what the trace says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Meta {
    pub stream: u64,
    pub pool_id: (u64, u64),
    pub segment_type: SegmentType,
}

impl Meta {
    pub fn of_segment(s: &Segment) -> Meta {
        Meta { stream: s.stream, pool_id: s.pool_id, segment_type: s.segment_type }
    }

    /// What a segment event tells: the stream, and the pool from the size (small-pool
    /// segments are 2 MiB, and no large-pool segment is).
    pub fn of_event(snapshot: &Snapshot, e: &TraceEvent) -> Meta {
        let segment_type = if e.size == 2 << 20 { SegmentType::Small } else { SegmentType::Large };
        Meta { stream: snapshot.context(e).stream, pool_id: (0, 0), segment_type }
    }
}

/// Memory reserved before the first event.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Reserved {
    pub start: u64,
    pub end: u64,
    pub expandable: bool,
    pub meta: Meta,
}

/// Walk the segment events back from the final segment table: undo `segment_alloc` and
/// `segment_map`, re-create what `segment_free` and `segment_unmap` released. Contiguous mapped
/// memory of expandable segments is kept as one range.
pub(crate) fn reserved_at_start(
    snapshot: &Snapshot,
    finals: &[&Segment],
    events: &[TraceEvent],
    segment_events: &[u32],
    log: &mut Log,
) -> Vec<Reserved> {
    let mut ranges: BTreeMap<u64, Reserved> = BTreeMap::new();
    for s in finals {
        let r = Reserved {
            start: s.address,
            end: s.address + s.total_size,
            expandable: s.is_expandable,
            meta: Meta::of_segment(s),
        };
        ranges.insert(s.address, r);
    }
    let mut clash = |i: u32, addr: u64| log.push(Some(i as usize), addr, DiagnosticKind::StartConflict);
    for &i in segment_events.iter().rev() {
        let e = &events[i as usize];
        let (start, end) = (e.addr, e.addr.saturating_add(e.size));
        match e.action() {
            Action::SegmentAlloc => match ranges.get(&start) {
                Some(r) if !r.expandable && r.end == end => {
                    ranges.remove(&start);
                }
                _ => clash(i, start),
            },
            Action::SegmentFree => {
                if overlapping(&ranges, start, end) {
                    clash(i, start);
                } else {
                    ranges.insert(start, Reserved { start, end, expandable: false, meta: Meta::of_event(snapshot, e) });
                }
            }
            Action::SegmentMap => {
                let holder = ranges.range(..=start).next_back().map(|(_, r)| *r);
                match holder {
                    Some(r) if r.expandable && r.end >= end => {
                        ranges.remove(&r.start);
                        if r.start < start {
                            ranges.insert(r.start, Reserved { end: start, ..r });
                        }
                        if end < r.end {
                            ranges.insert(end, Reserved { start: end, ..r });
                        }
                    }
                    _ => clash(i, start),
                }
            }
            Action::SegmentUnmap => {
                if overlapping(&ranges, start, end) {
                    clash(i, start);
                    continue;
                }
                let mut merged = Reserved { start, end, expandable: true, meta: Meta::of_event(snapshot, e) };
                if let Some(before) = ranges.range(..start).next_back().map(|(_, r)| *r) {
                    if before.expandable && before.end == start {
                        ranges.remove(&before.start);
                        merged.start = before.start;
                        merged.meta = before.meta;
                    }
                }
                if let Some(after) = ranges.get(&end).copied() {
                    if after.expandable {
                        ranges.remove(&end);
                        merged.end = after.end;
                        merged.meta = after.meta;
                    }
                }
                ranges.insert(merged.start, merged);
            }
            _ => {}
        }
    }
    ranges.into_values().collect()
}

fn overlapping(ranges: &BTreeMap<u64, Reserved>, start: u64, end: u64) -> bool {
    ranges.range(..end).next_back().is_some_and(|(_, r)| r.end > start)
}

/// A block active before the first event.
#[derive(Clone, Copy, Debug)]
pub(crate) struct StartBlock {
    pub address: u64,
    pub size: u64,
    pub requested_size: u64,
    pub pending: bool,
    pub stack: StackId,
}

/// What one unit held before the first event.
#[derive(Default)]
pub(crate) struct UnitStart {
    /// By address.
    pub blocks: Vec<StartBlock>,
    pub uncertain: Vec<UncertainBlock>,
    pub diagnostics: Log,
}

/// Known so far about a block active at the start, while walking back.
struct Found {
    /// Exact size when the block is still in the final table.
    size: Option<u64>,
    requested_size: u64,
    pending: bool,
    stack: StackId,
    /// Event that made it free (`free_completed`), when freed during the trace.
    freed_at: u32,
}

/// The walk back from a unit's blocks at dump to its blocks before the first event: undo each
/// `alloc`, re-create each freed block.
pub(crate) struct StartWalk {
    active: AddrMap<Found>,
    diagnostics: Log,
}

impl StartWalk {
    pub fn new(finals: &[&Segment]) -> StartWalk {
        let mut active: AddrMap<Found> = AddrMap::default();
        for b in finals.iter().flat_map(|s| &s.blocks) {
            if b.state != BlockState::Inactive {
                let found = Found {
                    size: Some(b.size),
                    requested_size: b.requested_size,
                    pending: b.state == BlockState::PendingFree,
                    stack: b.stack,
                    freed_at: u32::MAX,
                };
                active.insert(b.address, found);
            }
        }
        StartWalk { active, diagnostics: Log::default() }
    }

    /// Undo event `i`; call for the unit's events from the last to the first.
    pub fn undo(&mut self, i: u32, e: &TraceEvent) {
        let known = match e.action() {
            Action::Alloc => self.active.remove(&e.addr).is_some(),
            Action::FreeCompleted => {
                let found =
                    Found { size: None, requested_size: e.size, pending: true, stack: StackId::EMPTY, freed_at: i };
                self.active.insert(e.addr, found).is_none()
            }
            Action::FreeRequested => self.active.get_mut(&e.addr).map(|f| f.pending = false).is_some(),
            _ => true,
        };
        if !known {
            self.diagnostics.push(Some(i as usize), e.addr, DiagnosticKind::StartConflict);
        }
    }

    /// The blocks found, each with the sizes it can have had. Sizes of blocks freed during the
    /// trace are not in the final table: they are at least the rounded request, at most what
    /// the rules allow to be handed out whole, and never reach past the next block or the end
    /// of the reserved range.
    pub fn bound(self, ranges: &[(u64, u64)], rules: &Rules) -> StartBounds {
        let mut found: Vec<(u64, Found)> = self.active.into_iter().collect();
        found.sort_unstable_by_key(|(a, _)| *a);
        let mut diagnostics = self.diagnostics;
        let mut bounds: Vec<Bound> = Vec::with_capacity(found.len());
        for (k, (addr, f)) in found.iter().enumerate() {
            let Some(&(_, range_end)) = ranges.iter().find(|(s, e)| s <= addr && addr < e) else {
                diagnostics.push(None, *addr, DiagnosticKind::StartConflict);
                continue;
            };
            let limit = found.get(k + 1).map_or(range_end, |(next, _)| (*next).min(range_end)) - addr;
            let (min, max) = match f.size {
                Some(size) => (size, size),
                None => {
                    let rounded = rules.round_size(f.requested_size);
                    (rounded, rules.max_whole_block(rounded))
                }
            };
            if min > limit {
                diagnostics.push(None, *addr, DiagnosticKind::StartConflict);
            }
            let min = min.min(limit);
            bounds.push(Bound { address: *addr, min, max: max.min(limit).max(min), found: k });
        }
        StartBounds { found, bounds, diagnostics }
    }
}

/// The possible sizes of a block at the start; the replay assumes `min`.
struct Bound {
    address: u64,
    min: u64,
    max: u64,
    /// Index in [`StartBounds::found`].
    found: usize,
}

pub(crate) struct StartBounds {
    found: Vec<(u64, Found)>,
    /// By address.
    bounds: Vec<Bound>,
    diagnostics: Log,
}

impl StartBounds {
    pub fn is_exact(&self) -> bool {
        self.bounds.iter().all(|b| b.min == b.max)
    }

    /// Narrow the bounds with allocation event `i`: an allocation inside a block's possible
    /// extent, made before the block was freed, ends the block. Call for the unit's `alloc`
    /// events.
    pub fn narrow(&mut self, i: u32, e: &TraceEvent) {
        let k = self.bounds.partition_point(|b| b.address < e.addr);
        if let Some(b) = k.checked_sub(1).map(|k| &mut self.bounds[k]) {
            if i < self.found[b.found].1.freed_at && e.addr < b.address + b.max {
                b.max = (e.addr - b.address).max(b.min);
            }
        }
    }

    pub fn finish(self) -> UnitStart {
        let mut out = UnitStart { diagnostics: self.diagnostics, ..UnitStart::default() };
        for b in &self.bounds {
            let f = &self.found[b.found].1;
            if b.max > b.min {
                out.uncertain.push(UncertainBlock {
                    address: b.address,
                    requested_size: f.requested_size,
                    size_assumed: b.min,
                    size_max: b.max,
                });
            }
            out.blocks.push(StartBlock {
                address: b.address,
                size: b.min,
                requested_size: f.requested_size,
                pending: f.pending,
                stack: f.stack,
            });
        }
        out
    }
}
