//! `fragmentation`: reserved memory the allocator holds but cannot hand out.
//!
//! Mechanism. The caching allocator splits a segment to serve a smaller request and can only
//! return whole segments to the driver (`empty_cache()`). Free blocks inside segments that also
//! hold live blocks ("inactive split") serve only requests that fit in the hole. When they are a
//! large share of reserved memory while little of it is allocated, the process holds memory it
//! can neither use for larger requests nor give back. (Holes are normal between the steps of a
//! training loop, where the next step reuses them: hence a share of all reserved memory, not of
//! the pinned segments alone. Wholly free segments are plain cache: `empty_cache()` returns
//! them.) Read from the dump-time segment table (exact), thresholds in [`Thresholds`].
//! Named at the line that allocated most of the live blocks pinning split segments.
//! Near misses: free bytes in wholly free segments (`empty_cache()` returns them); few holes;
//! one hole holding most of the split bytes, which serves requests up to its size as cache does.
//!
//! [`Thresholds`]: crate::Thresholds

use std::collections::BTreeMap;

use memsnap_model::{BlockState, FrameId, StackId};

use super::{Context, Detector, Finding};
use crate::evidence::{Evidence, Occurrence, Severity, SuspectKind};

pub struct Fragmentation;

impl Detector for Fragmentation {
    fn kind(&self) -> SuspectKind {
        SuspectKind::Fragmentation
    }

    fn detect(&self, cx: &Context) -> Vec<Finding> {
        let th = cx.thresholds;
        // A profiler-converted file's segments are address ranges, not cudaMalloc'd memory:
        // their "free" bytes are gaps between tensors, never cached memory.
        if cx.snap.profiler_converted() {
            return Vec::new();
        }
        let Some(t) = cx.totals else { return Vec::new() };
        let reserved = t.reserved_bytes;
        if reserved == 0 {
            return Vec::new();
        }
        let split = t.inactive_split_bytes;
        let share = split as f64 / reserved as f64;
        let allocated_share = t.allocated_bytes as f64 / reserved as f64;
        if split < th.fragmentation_min_split_bytes
            || share < th.fragmentation_min_split_share
            || allocated_share > th.fragmentation_max_allocated_share
        {
            return Vec::new();
        }
        // The live blocks that pin split segments, by the line that allocated them: long-lived
        // tensors allocated between short-lived ones are what keeps the holes from merging.
        let state = end_state(cx);
        let largest_hole = state
            .segments
            .iter()
            .filter(is_pinned)
            .flat_map(|seg| seg.blocks.iter().filter(|b| b.state == BlockState::Inactive).map(|b| b.size))
            .max()
            .unwrap_or(0);
        if largest_hole as f64 > th.fragmentation_max_largest_hole_share * split as f64 {
            return Vec::new();
        }
        let mut pinning: BTreeMap<FrameId, (u64, StackId)> = BTreeMap::new();
        for (size, life) in pinning_blocks(&state) {
            let Some(life) = life.map(|i| &cx.replay.blocks[i]) else { continue };
            let stack = cx.event_stack(life);
            let info = cx.stacks.get(stack);
            if let Some(line) = info.forward_call.or(info.site) {
                let e = pinning.entry(line).or_insert((0, stack));
                e.0 += size;
            }
        }
        let pin = pinning.iter().max_by(|a, b| a.1 .0.cmp(&b.1 .0).then(b.0.cmp(a.0))).map(|(f, (_, s))| (*f, *s));
        let pr = cx.replay.peaks.reserved;
        vec![Finding {
            occurrences: 0,
            kind: SuspectKind::Fragmentation,
            severity: Severity::Waste,
            confidence: (0.4 + share).min(0.9),
            blocks: Vec::new(),
            occurrence: Occurrence::Iteration,
            boundaries: Vec::new(),
            bytes: Some(split),
            site: pin.map(|p| cx.site(p.0)),
            stack: pin.map_or(StackId::EMPTY, |p| p.1),
            facts: Evidence::Fragmentation {
                reserved,
                allocated: t.allocated_bytes,
                inactive_split: split,
                largest_free_block: t.largest_free_block,
                peak_reserved: pr.value,
                allocated_at_peak_reserved: pr.event_index.map(|i| cx.replay.series.after(Some(i)).allocated),
                cached_free_at_end: cx.end.cached_free,
            },
        }]
    }
}

/// The segment table after the trace's last event (the dump's).
fn end_state(cx: &Context) -> memsnap_replay::MemoryMap {
    cx.replay.state_after((!cx.events.is_empty()).then(|| cx.events.len() - 1))
}

/// A segment split between live blocks and free ones.
fn is_pinned(seg: &&memsnap_replay::SegmentView) -> bool {
    seg.blocks.iter().any(|b| b.state == BlockState::Inactive)
        && seg.blocks.iter().any(|b| b.state == BlockState::Allocated)
}

/// The live blocks in `state`'s split segments: `(size, index into the replay's blocks)`.
fn pinning_blocks(state: &memsnap_replay::MemoryMap) -> Vec<(u64, Option<usize>)> {
    state
        .segments
        .iter()
        .filter(is_pinned)
        .flat_map(|seg| seg.blocks.iter().filter(|b| b.state == BlockState::Allocated).map(|b| (b.size, b.lifetime)))
        .collect()
}

/// Whether at least `fragmentation_leak_pin_share` of the live bytes pinning split segments are
/// `leak_blocks` (the blocks of the device's `leak` suspects): the split is then the leak's
/// footprint (see [`Thresholds::fragmentation_leak_pin_share`]).
///
/// [`Thresholds::fragmentation_leak_pin_share`]: crate::Thresholds
pub(crate) fn pinned_by_leaks(cx: &Context, leak_blocks: &rustc_hash::FxHashSet<usize>) -> bool {
    let pins = pinning_blocks(&end_state(cx));
    let total: u64 = pins.iter().map(|p| p.0).sum();
    let by_leaks: u64 = pins.iter().filter(|p| p.1.is_some_and(|i| leak_blocks.contains(&i))).map(|p| p.0).sum();
    total > 0 && by_leaks as f64 >= cx.thresholds.fragmentation_leak_pin_share * total as f64
}
