//! Totals of the dump-time state and of the trace, as `torch.cuda.memory_summary()` reports them.

use rayon::prelude::*;

use crate::types::*;

/// Dump-time totals of one device, computed from `segments`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceTotals {
    pub device: u32,
    /// Sum of `active_allocated` block sizes (`memory_allocated()`).
    pub allocated_bytes: u64,
    /// Sum of segment sizes (`memory_reserved()`).
    pub reserved_bytes: u64,
    /// Allocated plus pending-free blocks.
    pub active_bytes: u64,
    /// Requested bytes of active blocks.
    pub requested_bytes: u64,
    /// Segments as torch counts them (`segment.all.current`): expandable segments are not
    /// counted (see `pools.expandable_segments`).
    pub segment_count: u64,
    pub block_count: u64,
    pub blocks_allocated: u64,
    pub blocks_pending_free: u64,
    pub blocks_inactive: u64,
    pub inactive_bytes: u64,
    /// Inactive bytes in segments that also hold active blocks (split, reusable only by fits).
    pub inactive_split_bytes: u64,
    pub largest_free_block: u64,
    pub pools: PoolCounts,
    pub trace_entries: u64,
    /// Some sum of sizes passed 2^64 − 1 and stays there (a crafted file: sizes are at most
    /// [`crate::MAX_SIZE`] each, but a file may list many).
    pub saturated: bool,
}

/// `a + b`, held at `u64::MAX` (and `saturated` set) instead of wrapping.
fn sum(a: u64, b: u64, saturated: &mut bool) -> u64 {
    a.checked_add(b).unwrap_or_else(|| {
        *saturated = true;
        u64::MAX
    })
}

/// Segments and bytes per pool.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolCounts {
    pub small_segments: u64,
    pub small_bytes: u64,
    pub large_segments: u64,
    pub large_bytes: u64,
    /// Every private pool (a graph's own and the program's together).
    pub private_segments: u64,
    pub private_bytes: u64,
    /// The part of the private pools the program created (`MemPool`, `graph_pool_handle()`:
    /// `(0, N)` ids); the rest are graphs' own pools (`(N, 0)`).
    pub user_pool_segments: u64,
    pub user_pool_bytes: u64,
    pub expandable_segments: u64,
    pub expandable_bytes: u64,
}

impl PoolCounts {
    /// Segments and bytes of the graphs' own private pools (`(N, 0)` ids): the private pools
    /// the program did not create.
    pub fn graph_private(&self) -> (u64, u64) {
        (
            self.private_segments.saturating_sub(self.user_pool_segments),
            self.private_bytes.saturating_sub(self.user_pool_bytes),
        )
    }
}

/// Facts about a device's trace.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TraceFacts {
    pub device: u32,
    pub entries: u64,
    pub first_time_us: Option<i64>,
    pub last_time_us: Option<i64>,
    pub first_action: Option<Action>,
    pub last_action: Option<Action>,
    /// Counts per action, in [`Action`] order.
    pub actions: Vec<(Action, u64)>,
    pub events_without_time: u64,
    /// Events with a stack (frames, or a legacy history): none in a trace recorded without
    /// stacks or with `context="state"`.
    pub events_with_frames: u64,
    /// Proven that `free_requested` entries were left out (`skip_actions`): none was recorded,
    /// yet a `free_completed` follows an `alloc` of the same address, so its request lay
    /// between them inside the recorded stretch. A short ring (the legacy
    /// `_record_memory_history(True)` keeps one entry) can hold a completion without its
    /// request and prove nothing.
    pub free_requests_skipped: bool,
    /// Proven that `alloc` entries were left out: none was recorded, yet one address is freed
    /// twice (two requests or two completions), and a block must be allocated again before it
    /// can be freed again.
    pub allocs_skipped: bool,
}

impl TraceFacts {
    /// Events of `action` counted.
    pub fn count(&self, action: Action) -> u64 {
        self.actions.iter().filter(|(a, _)| *a == action).map(|(_, c)| c).sum()
    }

    /// Completions and no request: `free_requested` left out, or a ring too short to hold one.
    pub fn may_lack_requests(&self) -> bool {
        self.count(Action::FreeRequested) == 0 && self.count(Action::FreeCompleted) > 0
    }

    /// Frees and no allocation: `alloc` left out, or a ring too short to hold one.
    pub fn may_lack_allocs(&self) -> bool {
        self.count(Action::Alloc) == 0 && self.count(Action::FreeCompleted) + self.count(Action::FreeRequested) > 0
    }
}

impl DeviceTotals {
    /// The dump-time totals of `segments` (one device's), as [`Snapshot::device_totals`] counts
    /// them; `trace_entries` is left 0.
    pub fn of_segments<'a>(device: u32, segments: impl IntoIterator<Item = &'a Segment>) -> DeviceTotals {
        let mut t = DeviceTotals { device, ..Default::default() };
        for seg in segments {
            t.add_segment(seg);
        }
        t
    }

    fn add_segment(&mut self, seg: &Segment) {
        let t = self;
        if !seg.is_expandable {
            t.segment_count += 1;
        }
        t.reserved_bytes = sum(t.reserved_bytes, seg.total_size, &mut t.saturated);
        let (count, bytes) = if seg.is_private_pool() {
            (&mut t.pools.private_segments, &mut t.pools.private_bytes)
        } else if seg.is_expandable {
            (&mut t.pools.expandable_segments, &mut t.pools.expandable_bytes)
        } else if seg.segment_type == SegmentType::Small {
            (&mut t.pools.small_segments, &mut t.pools.small_bytes)
        } else {
            (&mut t.pools.large_segments, &mut t.pools.large_bytes)
        };
        *count += 1;
        let mut saturated = false;
        *bytes = sum(*bytes, seg.total_size, &mut saturated);
        if seg.pool_kind() == crate::PoolKind::UserCreated {
            t.pools.user_pool_segments += 1;
            t.pools.user_pool_bytes = sum(t.pools.user_pool_bytes, seg.total_size, &mut saturated);
        }
        t.saturated |= saturated;
        // torch counts neither expandable segments nor their free blocks as split segments.
        let split = seg.blocks.len() > 1 && !seg.is_expandable;
        for b in &seg.blocks {
            t.block_count += 1;
            match b.state {
                BlockState::Allocated => {
                    t.blocks_allocated += 1;
                    t.allocated_bytes = sum(t.allocated_bytes, b.size, &mut t.saturated);
                    t.active_bytes = sum(t.active_bytes, b.size, &mut t.saturated);
                    t.requested_bytes = sum(t.requested_bytes, b.requested_size, &mut t.saturated);
                }
                BlockState::PendingFree => {
                    t.blocks_pending_free += 1;
                    t.active_bytes = sum(t.active_bytes, b.size, &mut t.saturated);
                    t.requested_bytes = sum(t.requested_bytes, b.requested_size, &mut t.saturated);
                }
                BlockState::Inactive => {
                    t.blocks_inactive += 1;
                    t.inactive_bytes = sum(t.inactive_bytes, b.size, &mut t.saturated);
                    t.largest_free_block = t.largest_free_block.max(b.size);
                    if split {
                        t.inactive_split_bytes = sum(t.inactive_split_bytes, b.size, &mut t.saturated);
                    }
                }
            }
        }
    }
}

impl Snapshot {
    /// Totals per device (sorted by device), for every device with segments or events.
    pub fn device_totals(&self) -> Vec<DeviceTotals> {
        // One pass over the segments, whatever the number of devices.
        let mut by: std::collections::BTreeMap<u32, DeviceTotals> =
            self.device_ids().into_iter().map(|d| (d, DeviceTotals { device: d, ..Default::default() })).collect();
        for seg in &self.segments {
            if let Some(t) = by.get_mut(&seg.device) {
                t.add_segment(seg);
            }
        }
        for t in by.values_mut() {
            t.trace_entries = self.trace(t.device).map_or(0, |tr| tr.entries());
        }
        by.into_values().collect()
    }

    /// Per device trace, its [`DeviceTrace::facts`].
    pub fn trace_facts(&self) -> Vec<TraceFacts> {
        self.traces.iter().map(DeviceTrace::facts).collect()
    }
}

/// What [`TraceFacts`] and the allocation addresses need of a trace, added up event by event:
/// what a summary read keeps instead of the events (a few hundred bytes against 48 per event).
#[derive(Clone, Debug, Default)]
pub struct TraceTally {
    entries: u64,
    min_time_us: Option<i64>,
    max_time_us: Option<i64>,
    first_action: Option<Action>,
    last_action: Option<Action>,
    counts: [u64; ALL_ACTIONS.len()],
    events_without_time: u64,
    events_with_frames: u64,
    /// Addresses of `alloc` events (distinct: the caching allocator hands the same addresses
    /// out again and again, so there are far fewer than events).
    alloc_addresses: rustc_hash::FxHashSet<u64>,
    skips: SkipEvidence,
}

/// What proves that a stretch of a trace was recorded with actions left out
/// ([`TraceFacts::free_requests_skipped`], [`TraceFacts::allocs_skipped`]). A ring keeps its
/// entries in order and without gaps, so an `alloc` and a later free of one address inside it
/// have everything the allocator recorded between them inside it too.
///
/// Gathered only while it can matter: while the stretch has seen no `free_requested` (else
/// requests were recorded) or no `alloc` (else allocations were). In a trace that records both
/// it stops after each stretch's first few events.
#[derive(Clone, Debug, Default)]
struct SkipEvidence {
    /// A completion of an address allocated earlier in the stretch, before any request.
    completion_after_alloc: bool,
    /// One address freed twice by the same action with no allocation of it in the stretch.
    freed_twice: bool,
    /// `(address, is_completion)` of the frees of addresses the stretch had not allocated
    /// before them: what an earlier stretch's allocations or frees may match on merging.
    unallocated_frees: rustc_hash::FxHashSet<(u64, bool)>,
}

impl SkipEvidence {
    /// A free (a completion or a request) of `addr`, after a stretch that allocated
    /// `allocated`. Whether requests or allocations were recorded after all is for
    /// [`TraceTally::facts`] to weigh, with the whole trace's counts.
    fn note_free(&mut self, allocated: &rustc_hash::FxHashSet<u64>, addr: u64, completion: bool) {
        if allocated.contains(&addr) {
            self.completion_after_alloc |= completion;
        } else if !self.unallocated_frees.insert((addr, completion)) {
            self.freed_twice = true;
        }
    }
}

impl TraceTally {
    #[inline]
    pub fn add(&mut self, e: &TraceEvent) {
        self.count(e);
        let action = e.action();
        if action == Action::Alloc {
            self.alloc_addresses.insert(e.addr);
        } else if matches!(action, Action::FreeRequested | Action::FreeCompleted)
            && (self.counts[action_index(Action::FreeRequested)] == 0 || self.counts[action_index(Action::Alloc)] == 0)
        {
            self.skips.note_free(&self.alloc_addresses, e.addr, action == Action::FreeCompleted);
        }
    }

    /// [`TraceTally::add`] without keeping the address: what [`TraceFacts`] need.
    #[inline]
    fn count(&mut self, e: &TraceEvent) {
        self.entries += 1;
        self.counts[action_index(e.action())] += 1;
        if e.has_time() {
            self.min_time_us = Some(self.min_time_us.map_or(e.time_us, |t| t.min(e.time_us)));
            self.max_time_us = Some(self.max_time_us.map_or(e.time_us, |t| t.max(e.time_us)));
        } else {
            self.events_without_time += 1;
        }
        self.events_with_frames += (e.stack != crate::StackId::EMPTY) as u64;
        self.first_action.get_or_insert(e.action());
        self.last_action = Some(e.action());
    }

    /// Add `later`, the tally of the events that follow these.
    pub fn merge(&mut self, later: &TraceTally) {
        self.entries += later.entries;
        self.min_time_us = match (self.min_time_us, later.min_time_us) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.max_time_us = match (self.max_time_us, later.max_time_us) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        self.first_action = self.first_action.or(later.first_action);
        self.last_action = later.last_action.or(self.last_action);
        for (c, l) in self.counts.iter_mut().zip(later.counts) {
            *c += l;
        }
        self.events_without_time += later.events_without_time;
        self.events_with_frames += later.events_with_frames;
        // The later stretch's frees of addresses it had not allocated, matched against these
        // events (what they allocated, what they freed unallocated).
        for &(addr, completion) in &later.skips.unallocated_frees {
            self.skips.note_free(&self.alloc_addresses, addr, completion);
        }
        self.skips.completion_after_alloc |= later.skips.completion_after_alloc;
        self.skips.freed_twice |= later.skips.freed_twice;
        self.alloc_addresses.extend(&later.alloc_addresses);
    }

    /// Events counted.
    pub fn entries(&self) -> u64 {
        self.entries
    }

    /// Events counted that have a stack.
    pub fn events_with_frames(&self) -> u64 {
        self.events_with_frames
    }

    /// Approximate bytes held (for a reader's object budget).
    pub fn retained_bytes(&self) -> u64 {
        200 + self.alloc_addresses.capacity() as u64 * 9 + self.skips.unallocated_frees.capacity() as u64 * 17
    }

    pub fn facts(&self, device: u32) -> TraceFacts {
        TraceFacts {
            device,
            entries: self.entries,
            first_time_us: self.min_time_us,
            last_time_us: self.max_time_us,
            first_action: self.first_action,
            last_action: self.last_action,
            actions: ALL_ACTIONS.iter().map(|&a| (a, self.counts[action_index(a)])).filter(|(_, c)| *c > 0).collect(),
            events_without_time: self.events_without_time,
            events_with_frames: self.events_with_frames,
            free_requests_skipped: self.counts[action_index(Action::FreeRequested)] == 0
                && self.skips.completion_after_alloc,
            allocs_skipped: self.counts[action_index(Action::Alloc)] == 0 && self.skips.freed_twice,
        }
    }

    pub fn summary(&self, device: u32) -> TraceSummary {
        let mut alloc_addresses: Vec<u64> = self.alloc_addresses.iter().copied().collect();
        alloc_addresses.sort_unstable();
        TraceSummary { facts: self.facts(device), alloc_addresses }
    }
}

impl DeviceTrace {
    /// Its entry count, time range, action counts, stacked events. Taken from what the reader
    /// counted as it read ([`DeviceTrace::summary`]), else computed from the events.
    pub fn facts(&self) -> TraceFacts {
        match &self.summary {
            Some(s) => s.facts.clone(),
            // Counted in parallel runs merged in order (the merge keeps first and last).
            None => {
                let facts = self
                    .events
                    .par_iter()
                    .fold(TraceTally::default, |mut t, e| {
                        t.count(e);
                        t
                    })
                    .reduce(TraceTally::default, |mut a, b| {
                        a.merge(&b);
                        a
                    })
                    .facts(self.device);
                if facts.may_lack_requests() || facts.may_lack_allocs() {
                    // Whether actions were left out needs the addresses: one more pass, only
                    // over a trace that has no requests or no allocations at all.
                    let mut tally = TraceTally::default();
                    self.events.iter().for_each(|e| tally.add(e));
                    return tally.facts(self.device);
                }
                facts
            }
        }
    }

    /// Number of entries (also when a summary read kept only their counts).
    pub fn entries(&self) -> u64 {
        self.summary.as_ref().map_or(self.events.len() as u64, |s| s.facts.entries)
    }

    /// For each of `addresses` (ascending, distinct): whether an `alloc` event of this trace
    /// names it. One pass over the events for any number of addresses, where
    /// [`DeviceTrace::alloc_addresses`] would sort every allocation's.
    pub fn allocates_any_of(&self, addresses: &[u64]) -> Vec<bool> {
        match &self.summary {
            Some(s) => addresses.iter().map(|a| s.alloc_addresses.binary_search(a).is_ok()).collect(),
            None => self
                .events
                .par_iter()
                .fold(
                    || vec![false; addresses.len()],
                    |mut seen, e| {
                        if e.action() == Action::Alloc {
                            if let Ok(k) = addresses.binary_search(&e.addr) {
                                seen[k] = true;
                            }
                        }
                        seen
                    },
                )
                .reduce(
                    || vec![false; addresses.len()],
                    |mut a, b| {
                        a.iter_mut().zip(b).for_each(|(x, y)| *x |= y);
                        a
                    },
                ),
        }
    }

    /// Distinct addresses of `alloc` events, ascending.
    pub fn alloc_addresses(&self) -> Vec<u64> {
        match &self.summary {
            Some(s) => s.alloc_addresses.clone(),
            None => {
                let mut a: Vec<u64> =
                    self.events.iter().filter(|e| e.action() == Action::Alloc).map(|e| e.addr).collect();
                a.sort_unstable();
                a.dedup();
                a
            }
        }
    }
}

fn action_index(a: Action) -> usize {
    a as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use Action::{Alloc, FreeCompleted, FreeRequested};

    fn tally(events: &[(Action, u64)]) -> TraceTally {
        let mut t = TraceTally::default();
        events.iter().for_each(|&(a, addr)| t.add(&TraceEvent::new(a, addr)));
        t
    }

    /// (free_requests_skipped, allocs_skipped) of `events` read whole, and read as two
    /// stretches merged at every split point, as the parallel reader merges its chunks.
    fn proofs(events: &[(Action, u64)]) -> (bool, bool) {
        let f = tally(events).facts(0);
        let whole = (f.free_requests_skipped, f.allocs_skipped);
        for cut in 0..=events.len() {
            let mut first = tally(&events[..cut]);
            first.merge(&tally(&events[cut..]));
            let m = first.facts(0);
            assert_eq!((m.free_requests_skipped, m.allocs_skipped), whole, "split at {cut} of {events:?}");
        }
        whole
    }

    #[test]
    fn skipped_actions_are_proven_only_by_the_order_of_one_address() {
        // A ring of one completion: nothing proven.
        assert_eq!(proofs(&[(FreeCompleted, 1)]), (false, false));
        // Completions of blocks allocated before the window, then an allocation: nothing.
        assert_eq!(proofs(&[(FreeCompleted, 1), (FreeCompleted, 2), (Alloc, 3)]), (false, false));
        // An allocation and a later completion of it with no request between: requests skipped.
        assert_eq!(proofs(&[(FreeCompleted, 9), (Alloc, 1), (Alloc, 2), (FreeCompleted, 1)]), (true, false));
        // The same with the request recorded: nothing skipped.
        assert_eq!(proofs(&[(Alloc, 1), (FreeRequested, 1), (FreeCompleted, 1)]), (false, false));
        // No allocation, one address freed twice: allocations skipped.
        assert_eq!(proofs(&[(FreeRequested, 1), (FreeRequested, 2), (FreeRequested, 1)]), (false, true));
        // Freed, allocated again, freed again: nothing skipped.
        assert_eq!(proofs(&[(FreeCompleted, 1), (Alloc, 1), (FreeCompleted, 1)]), (true, false));
        assert_eq!(
            proofs(&[(FreeRequested, 1), (FreeCompleted, 1), (Alloc, 1), (FreeRequested, 1), (FreeCompleted, 1)]),
            (false, false)
        );
    }
}
