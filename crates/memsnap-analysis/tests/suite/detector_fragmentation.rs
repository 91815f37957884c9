//! fragmentation: split free blocks that neither serve nor return (src/detectors/fragmentation.rs).
//! Synthetic traces of the script in `common/scenario.rs`: positives and near misses.

use crate::common;

use common::prelude::*;

// ------------------------------------------------------------------------------------------
// fragmentation

/// Sixteen 16 MiB buffers, every other one freed: live blocks scattered between free holes.
fn buffers(t: &mut TraceBuilder, free: impl Fn(usize) -> bool) {
    let bufs: Vec<Blk> = (0..16).map(|_| t.alloc(16 * MIB, &[top(12)])).collect();
    for (k, b) in bufs.into_iter().enumerate() {
        if free(k) {
            t.free(b, &[top(13)]);
        }
    }
}

/// One 256 MiB segment, half of it free in 16 MiB holes between live blocks.
#[test]
fn fragmentation_live_blocks_between_free_holes() {
    let mut t = TraceBuilder::with_segment(256 * MIB);
    buffers(&mut t, |k| k % 2 == 1);
    let snap = t.finish();
    let totals = &snap.device_totals()[0];
    assert_eq!(
        (totals.allocated_bytes, totals.reserved_bytes, totals.inactive_split_bytes),
        (128 * MIB, 256 * MIB, 128 * MIB)
    );
    let a = analyze_snapshot(&snap);
    let s = the_one(&a, SuspectKind::Fragmentation);
    assert_eq!(s.bytes, 128 * MIB, "{}", describe(&a));
    // Named at the line whose live blocks pin the holes.
    assert_site(&s, TRAIN, 12, &a);
    assert!(
        matches!(s.facts, Evidence::Fragmentation { largest_free_block, .. } if largest_free_block == 16 * MIB),
        "largest free block in the facts:{}",
        describe(&a)
    );
    assert!(s.evidence.contains("16.00 MiB"), "and in the words:{}", describe(&a));
    assert_eq!(a.suspects().len(), 1, "{}", describe(&a));
}

/// Near miss: the same free bytes, but in a segment that is wholly free (reusable whole, and
/// releasable by `empty_cache()`).
#[test]
fn fragmentation_near_miss_free_bytes_in_wholly_free_segment() {
    let mut t = TraceBuilder::with_segment(128 * MIB);
    t.segment(128 * MIB, &[]);
    buffers(&mut t, |k| k >= 8);
    let snap = t.finish();
    let totals = &snap.device_totals()[0];
    assert_eq!((totals.allocated_bytes, totals.reserved_bytes, totals.inactive_split_bytes), (128 * MIB, 256 * MIB, 0));
    assert_no_suspects(&analyze_snapshot(&snap));
}

/// Near miss: holes between live blocks, but under 30% of reserved (allocated 69%).
#[test]
fn fragmentation_near_miss_few_holes() {
    let mut t = TraceBuilder::with_segment(256 * MIB);
    buffers(&mut t, |k| k % 3 == 1);
    let snap = t.finish();
    assert_eq!(snap.device_totals()[0].inactive_split_bytes, 80 * MIB);
    assert_no_suspects(&analyze_snapshot(&snap));
}
