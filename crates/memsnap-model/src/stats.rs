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
}

impl TraceTally {
    #[inline]
    pub fn add(&mut self, e: &TraceEvent) {
        self.count(e);
        if e.action() == Action::Alloc {
            self.alloc_addresses.insert(e.addr);
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
        200 + self.alloc_addresses.capacity() as u64 * 9
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
            None => self
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
                .facts(self.device),
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
