//! The allocator-cache section (src/cache.rs): what the cache holds at the dump, what
//! `empty_cache()` would return, and segments made while the cache held their size in blocks
//! that could not take the request. Synthetic traces of large-pool requests; the real fixtures'
//! numbers are checked against the live process in `tests/cli/analyze.rs`.

use crate::common;

use common::prelude::*;
use memsnap_analysis::{analyze_with, cache_words, AllocatorCache, SegmentMade, Thresholds};

fn cache(snap: &memsnap_model::Snapshot, th: &Thresholds) -> AllocatorCache {
    let replay = memsnap_replay::replay(snap);
    let a = analyze_with(snap, &replay, th);
    a.devices[0].cache.clone().expect("a cache section")
}

/// Two 40 MiB tensors (a segment each: the second does not fit in the first's), both freed,
/// then a 60 MiB one: neither cached 40 MiB block can take it, so a third segment is made while
/// 80 MiB sit cached free. The two free segments are what `empty_cache()` returns.
fn larger_shape_after_smaller() -> memsnap_model::Snapshot {
    freed_then(&[40 * MIB, 40 * MIB], 60 * MIB)
}

#[test]
fn a_segment_made_beside_cache_that_does_not_fit() {
    let c = cache(&larger_shape_after_smaller(), &Thresholds::DEFAULT);
    assert_eq!((c.reserved, c.allocated, c.cached_free), (140 * MIB, 60 * MIB, 80 * MIB));
    assert_eq!((c.free_segments, c.free_segment_bytes, c.hole_bytes), (2, 80 * MIB, 0));
    assert_eq!(c.empty_cache_returns, 80 * MIB);
    let g = c.growth.as_ref().expect("a trace with allocations");
    assert_eq!((g.made, g.made_bytes), (3, 140 * MIB));
    assert_eq!((g.made_while_cached, g.made_while_cached_bytes), (1, 60 * MIB));
    assert_eq!(
        g.largest_while_cached,
        Some(SegmentMade { event_index: 8, size: 60 * MIB, cached_free_before: 80 * MIB })
    );
    // Reserved peaked at 140 MiB, allocated at 80 MiB: 43% above, past the 35% threshold. The
    // peak is reached by the `segment_alloc`, which the trace records before the `alloc` it serves.
    assert_eq!((g.peak_reserved, g.peak_allocated, g.allocated_at_peak_reserved), (140 * MIB, 80 * MIB, 0));
    assert!(g.excess);
    let words = cache_words(&c).join("\n");
    assert!(words.contains("expandable_segments:True"), "{words}");
    assert!(words.contains("1 of them (60.00 MiB) while at least its own size sat cached free"), "{words}");
}

/// Near miss: the same program where the larger tensor fits in what is cached (two 40 MiB
/// tensors freed, then a 30 MiB one): no segment is made beside the cache, and reserved stays
/// where the allocated peak put it.
#[test]
fn near_miss_a_smaller_shape_reuses_the_cache() {
    let c = cache(&freed_then(&[40 * MIB, 40 * MIB], 30 * MIB), &Thresholds::DEFAULT);
    let g = c.growth.as_ref().unwrap();
    assert_eq!((g.made, g.made_while_cached, g.excess), (2, 0, false));
    // The 30 MiB block split one segment: 10 MiB of hole beside it, the other segment free.
    assert_eq!((c.free_segments, c.free_segment_bytes, c.hole_bytes), (1, 40 * MIB, 10 * MIB));
    assert!(!cache_words(&c).join("\n").contains("expandable_segments"));
}

/// A segment made when the cache held less than its size is growth, not a mismatch of blocks.
#[test]
fn near_miss_growth_with_too_little_cached() {
    let g = cache(&freed_then(&[40 * MIB], 60 * MIB), &Thresholds::DEFAULT).growth.unwrap();
    assert_eq!((g.made, g.made_while_cached), (2, 0));
}

/// `empty_cache()` during the trace: the released segments are counted, and the cache at the
/// dump holds only what came after.
#[test]
fn segments_released_by_empty_cache() {
    let mut t = TraceBuilder::new();
    let a = t.alloc(40 * MIB, &[top(10)]);
    t.free(a, &[top(11)]);
    t.empty_cache(&[top(12)]);
    t.alloc(20 * MIB, &[top(13)]);
    let c = cache(&t.finish(), &Thresholds::DEFAULT);
    let g = c.growth.as_ref().unwrap();
    assert_eq!((g.released, g.released_bytes), (1, 40 * MIB));
    assert_eq!((c.reserved, c.allocated, c.cached_free), (20 * MIB, 20 * MIB, 0));
    assert!(cache_words(&c)[0].contains("caches nothing"), "{:?}", cache_words(&c));
}

/// The threshold decides the advice, not the facts: past it the same program gets none.
#[test]
fn reserved_excess_share_decides_the_advice() {
    let th = Thresholds { reserved_excess_share: 0.5, ..Thresholds::DEFAULT };
    let c = cache(&larger_shape_after_smaller(), &th);
    let g = c.growth.as_ref().unwrap();
    assert_eq!((g.made_while_cached, g.excess), (1, false));
    assert!(!cache_words(&c).join("\n").contains("expandable_segments"));
}

/// Near miss: the same program with the 60 MiB tensor made on a side stream. The allocator
/// keeps a pool per stream, so the 80 MiB cached on the default stream could never serve it:
/// its segment is growth, not a mismatch of blocks.
#[test]
fn near_miss_cache_on_another_stream_could_not_serve() {
    let mut snap = larger_shape_after_smaller();
    let side = snap.intern_context(memsnap_model::EventContext { stream: 7, ..Default::default() });
    let n = snap.traces[0].events.len();
    // The last two events: the side stream's segment_alloc and the alloc it serves.
    for e in &mut snap.traces[0].events[n - 2..] {
        e.set_context(side);
    }
    let last = snap.segments.iter_mut().max_by_key(|s| s.address).unwrap();
    assert_eq!(last.total_size, 60 * MIB);
    last.stream = 7;
    let replay = memsnap_replay::replay(&snap);
    assert!(replay.devices[0].check.matches_snapshot, "the side-stream program replays exactly");
    let c = cache(&snap, &Thresholds::DEFAULT);
    let g = c.growth.as_ref().unwrap();
    assert_eq!((g.made, g.made_while_cached), (3, 0));
}

fn block(address: u64, size: u64, state: memsnap_model::BlockState) -> memsnap_model::Block {
    memsnap_model::Block {
        address,
        size,
        requested_size: size,
        state,
        stack: memsnap_model::StackId::EMPTY,
        address_derived: false,
    }
}

fn segment(address: u64, blocks: Vec<memsnap_model::Block>, expandable: bool) -> memsnap_model::Segment {
    let total: u64 = blocks.iter().map(|b| b.size).sum();
    memsnap_model::Segment {
        device: 0,
        address,
        total_size: total,
        allocated_size: 0,
        active_size: 0,
        requested_size: 0,
        stream: 0,
        segment_type: memsnap_model::SegmentType::Large,
        pool_id: (0, 0),
        is_expandable: expandable,
        stack: memsnap_model::StackId::EMPTY,
        blocks,
    }
}

/// `empty_cache()` first waits for the streams of blocks freed but still in use, so a segment
/// whose only non-free block is pending goes back whole, and in an expandable segment a pending
/// block merges with its free neighbour before the whole pages are unmapped (20 MiB pages in
/// the large pool, counted from the segment's start).
#[test]
fn empty_cache_waits_for_blocks_still_in_use_by_a_stream() {
    use memsnap_model::BlockState::{Allocated, Inactive, PendingFree};
    let base = 1u64 << 40;
    let plain =
        segment(base, vec![block(base, 30 * MIB, PendingFree), block(base + 30 * MIB, 10 * MIB, Inactive)], false);
    let e = base + (1 << 32);
    let expandable = segment(
        e,
        vec![
            block(e, 10 * MIB, Inactive),
            block(e + 10 * MIB, 30 * MIB, PendingFree),
            block(e + 40 * MIB, 20 * MIB, Allocated),
        ],
        true,
    );
    let c = memsnap_analysis::cache_at_dump([&plain, &expandable]);
    assert_eq!((c.free_segments, c.free_segment_bytes, c.pending_free_bytes), (1, 10 * MIB, 60 * MIB));
    // The free 10 MiB alone holds no whole page; merged with the pending 30 MiB, 0-40 MiB holds two.
    assert_eq!(c.expandable_unmappable_bytes, 40 * MIB);
    assert_eq!(c.empty_cache_returns, 40 * MIB + 40 * MIB);
    assert_eq!(c.cached_free, c.reserved - c.allocated);
    assert_eq!((c.reserved, c.allocated), (100 * MIB, 20 * MIB));
}

/// Near miss of the advice: the program of `a_segment_made_beside_cache_that_does_not_fit` at a
/// tenth of the sizes. Requests of 1-10 MiB are served from 20 MiB segments, so all three fit in
/// one: reserved peaks 60% above allocated, past the share, but the 12 MiB above it is the
/// allocator's granularity, less than the partly used segments any program keeps
/// (`reserved_excess_min_bytes`), not blocks of the wrong shape.
#[test]
fn a_small_excess_is_the_allocators_granularity_not_advice() {
    let c = cache(&freed_then(&[4 * MIB, 4 * MIB], 6 * MIB), &Thresholds::DEFAULT);
    let g = c.growth.as_ref().unwrap();
    assert_eq!((g.peak_reserved, g.peak_allocated, g.made, g.made_while_cached), (20 * MIB, 8 * MIB, 1, 0));
    assert!(!g.excess);
    assert!(!cache_words(&c).join("\n").contains("expandable_segments"));
    let th = Thresholds { reserved_excess_min_bytes: 4 * MIB, ..Thresholds::DEFAULT };
    assert!(cache(&freed_then(&[4 * MIB, 4 * MIB], 6 * MIB), &th).growth.unwrap().excess);
}

/// A segment whose listed blocks do not cover it (a file PyTorch did not write as it is): the
/// bytes no block covers are their own part, so the parts still add up and the words say why.
#[test]
fn segment_bytes_no_block_covers_are_said() {
    use memsnap_model::BlockState::Allocated;
    let base = 1u64 << 40;
    let mut seg = segment(base, vec![block(base, 512, Allocated)], false);
    seg.total_size = 2 * MIB;
    let c = memsnap_analysis::cache_at_dump([&seg]);
    assert_eq!(
        (c.reserved, c.allocated, c.cached_free, c.unlisted_bytes),
        (2 * MIB, 512, 2 * MIB - 512, 2 * MIB - 512)
    );
    assert_eq!((c.hole_bytes, c.free_segments, c.empty_cache_returns), (0, 0, 0));
    let words = cache_words(&c).join("\n");
    assert!(words.contains("in no block the segment table lists"), "{words}");
    assert!(!words.contains("not live tensors: ."), "{words}");
}
