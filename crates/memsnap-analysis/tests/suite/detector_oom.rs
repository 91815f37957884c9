//! oom: the failed allocation, explained (src/detectors/oom.rs).
//! Synthetic traces of the script in `common/scenario.rs`: positives and near misses.

use crate::common;

use common::prelude::*;

// ------------------------------------------------------------------------------------------
// oom

/// Three steps, then a forward pass with a batch too large: `fc1` cannot get its output.
fn oom_run(fails: bool) -> (Snapshot, u64) {
    let mut p = Program::new(2);
    train(&mut p, Train { steps: 3, ..Train::default() });
    let big = 256 * MIB;
    let fc1 = chain(&[
        &[
            (common::program::LINEAR, 125, "forward"),
            CALL,
            WRAP,
            (MODEL, 22, "forward"),
            CALL,
            WRAP,
            (MODEL, 42, "forward"),
            CALL,
            WRAP,
        ],
        &[top(16)],
    ]);
    let x = p.batch(&[top(15)]);
    if fails {
        p.t.oom(big, 100 * MIB, &fc1);
    } else {
        let b = p.t.alloc(big, &fc1);
        p.t.free(b, &[top(16)]);
    }
    p.t.free(x, &[top(23)]);
    (p.t.finish(), big)
}

#[test]
fn oom_event_explained_at_the_user_line() {
    let (snap, big) = oom_run(true);
    let a = analyze_snapshot(&snap);
    let s = the_one(&a, SuspectKind::Oom);
    // The line that ran the model (the frames below it are in the stack).
    assert_site(&s, TRAIN, 16, &a);
    assert_eq!(s.bytes, big);
    assert_eq!(s.confidence, 1.0);
    assert!(s.stack.iter().any(|f| f.filename == MODEL && f.line == 22), "{:?}", s.stack);
    assert!(
        matches!(s.facts, Evidence::Oom { requested, .. } if requested == big),
        "requested size in the facts:{}",
        describe(&a)
    );
    assert!(s.evidence.contains("256.00 MiB"), "requested size in the evidence:{}", describe(&a));
    assert!(s.evidence.contains("100.00 MiB"), "device free in the evidence:{}", describe(&a));
    assert_eq!(a.suspects()[0].kind, SuspectKind::Oom);
    assert_eq!(a.suspects().len(), 1, "{}", describe(&a));
}

/// Near miss: the same large allocation succeeds (a new segment).
#[test]
fn oom_near_miss_large_allocation_succeeds() {
    let (snap, _) = oom_run(false);
    assert_no_suspects(&analyze_snapshot(&snap));
}
