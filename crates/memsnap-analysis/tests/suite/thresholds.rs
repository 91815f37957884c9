//! Every threshold matters: for each field of [`Thresholds`], a synthetic program whose verdict
//! holds with the default and changes when that one number is moved past what the program
//! shows. A rule that a mutation of its threshold leaves unchanged is not tested.
//! (`scalar_root_bytes` needs blocks smaller than this builder's 2 MiB granule: the real-fixture
//! scorecard covers it, where x04, y07 and z12 are named at their running sums.)

use crate::common;

use common::program::{top, Grad, Program, ZeroGrad};
use common::recording::dump_alone;
use common::scenario::*;
use common::{TraceBuilder, MIB};
use memsnap_analysis::{analyze_with, Analysis, Severity, SuspectKind, Thresholds};
use memsnap_model::Snapshot;

fn run(snap: &Snapshot, th: &Thresholds) -> Analysis {
    let replay = memsnap_replay::replay(snap);
    analyze_with(snap, &replay, th)
}

fn has(a: &Analysis, kind: SuspectKind, severity: Severity) -> bool {
    a.suspects().iter().any(|s| s.kind == kind && s.severity == severity)
}

fn retained_each_step() -> Snapshot {
    let mut p = Program::new(2);
    train(&mut p, Train { retain_graph: true, keep_loss: true, ..Train::default() });
    p.t.finish()
}

fn retained_until_next_step() -> Snapshot {
    let mut p = Program::new(2);
    train(&mut p, Train { retain_graph: true, ..Train::default() });
    p.t.finish()
}

fn eval_keeps_logits() -> Snapshot {
    let mut p = Program::new(2);
    train(&mut p, Train::default());
    validate(&mut p, 4, Grad::Enabled, true);
    p.t.finish()
}

fn eval_builds_graphs_and_drops_them() -> Snapshot {
    let mut p = Program::new(2);
    train(&mut p, Train::default());
    validate(&mut p, 4, Grad::Enabled, false);
    p.t.finish()
}

fn grads_kept() -> Snapshot {
    let mut p = Program::new(2);
    train(&mut p, Train { zero: ZeroGrad::SetToNoneButReferenced, ..Train::default() });
    p.t.finish()
}

fn grads_through_eval() -> Snapshot {
    let mut p = Program::new(2);
    train(&mut p, Train { steps: 5, zero: ZeroGrad::InPlace, ..Train::default() });
    validate(&mut p, 4, Grad::NoGrad, false);
    p.t.finish()
}

fn clone_kept() -> Snapshot {
    let mut p = Program::new(2);
    train(&mut p, Train { clone: Keep::Forever, ..Train::default() });
    p.t.finish()
}

fn holes() -> Snapshot {
    let mut t = TraceBuilder::with_segment(256 * MIB);
    let bufs: Vec<_> = (0..16).map(|_| t.alloc(16 * MIB, &[top(12)])).collect();
    for (k, b) in bufs.into_iter().enumerate() {
        if k % 2 == 1 {
            t.free(b, &[top(13)]);
        }
    }
    t.finish()
}

/// Two 40 MiB tensors freed, then a 60 MiB one that neither cached block can take: reserved
/// peaks 43% above the allocated peak.
/// A copy kept every third step of 16 (`if step % 3 == 0: samples.append(...)`), never let go.
fn clone_kept_every_third_step() -> Snapshot {
    let mut p = Program::new(2);
    train(&mut p, Train { steps: 16, clone: Keep::Every(3), ..Train::default() });
    p.t.finish()
}

/// A cache of the last 14 copies over 16 steps: it evicts (so only the share of steps that kept
/// a copy, 14 of 16, can make it growth), and it is full only from the last steps on, too late
/// to be seen at its capacity (`at_capacity` in `reference_leak.rs`): a cache that has not
/// filled within the trace cannot be told from a leak.
fn clone_cached_14_of_16() -> Snapshot {
    let mut p = Program::new(2);
    train(&mut p, Train { steps: 16, clone: Keep::Lru(14), ..Train::default() });
    p.t.finish()
}

fn cache_does_not_fit() -> Snapshot {
    freed_then(&[40 * MIB, 40 * MIB], 60 * MIB)
}

/// (threshold, program, the thresholds it is judged with, the mutation, the verdict).
/// An inference service recorded with `enabled="state"`: ten model outputs from one request
/// line are alive at the dump, and the trace is empty.
fn state_only_cache() -> Snapshot {
    let mut p = Program::new(2);
    for _ in 0..10 {
        let pass = p.forward(&[top(30)], Grad::NoGrad, false);
        let _ = pass;
    }
    dump_alone(p.t.finish())
}

/// The graphs of 10 grad-on passes kept to the dump (a list of losses), read from the dump alone:
/// five operations of the model (embedding, norm, linear, GELU, residual add) each made 10 or more
/// of the live blocks.
fn state_only_graphs() -> Snapshot {
    let mut p = Program::new(2);
    for _ in 0..10 {
        let _ = p.forward(&[top(30)], Grad::Enabled, false);
    }
    dump_alone(p.t.finish())
}

fn detector_eval_keeps_detections() -> Snapshot {
    let mut p = Program::new(2);
    train(&mut p, Train::default());
    detector_evaluation(&mut p, 20);
    p.t.finish()
}

type Case = (&'static str, fn() -> Snapshot, fn(&mut Thresholds), fn(&mut Thresholds), fn(&Analysis) -> bool);

fn default(_: &mut Thresholds) {}

const CASES: &[Case] = &[
    (
        "min_suspect_bytes",
        clone_kept,
        default,
        |t| t.min_suspect_bytes = 1 << 40,
        |a| has(a, SuspectKind::ReferenceLeak, Severity::Leak),
    ),
    // With a byte floor above the leak, it is reported only because it repeats often enough.
    (
        "small_leak_occurrences",
        clone_kept,
        |t| {
            t.min_suspect_bytes = 1 << 40;
            t.small_leak_occurrences = 5
        },
        |t| t.small_leak_occurrences = 100,
        |a| has(a, SuspectKind::ReferenceLeak, Severity::Leak),
    ),
    (
        "min_pass_blocks",
        eval_keeps_logits,
        default,
        |t| t.min_pass_blocks = 1000,
        |a| has(a, SuspectKind::NoGradMissing, Severity::Leak),
    ),
    (
        "min_saved_blocks",
        eval_keeps_logits,
        default,
        |t| t.min_saved_blocks = 1000,
        |a| has(a, SuspectKind::NoGradMissing, Severity::Leak),
    ),
    (
        "saved_fraction",
        eval_keeps_logits,
        default,
        |t| t.saved_fraction = 1.01,
        |a| has(a, SuspectKind::NoGradMissing, Severity::Leak),
    ),
    // 20% of the passes' blocks survive, from 20 lines: grad on only by the count of lines.
    (
        "min_saved_stacks",
        detector_eval_keeps_detections,
        default,
        |t| t.min_saved_stacks = 21,
        |a| has(a, SuspectKind::NoGradMissing, Severity::Leak),
    ),
    (
        "sparse_saved_fraction",
        detector_eval_keeps_detections,
        default,
        |t| t.sparse_saved_fraction = 0.25,
        |a| has(a, SuspectKind::NoGradMissing, Severity::Leak),
    ),
    // The evaluation passes keep as many blocks as the training passes save; away from the
    // peak, that comparison is what makes their graphs waste.
    (
        "training_saved_share",
        eval_builds_graphs_and_drops_them,
        default,
        |t| t.training_saved_share = 1.5,
        |a| has(a, SuspectKind::NoGradMissing, Severity::Waste),
    ),
    (
        "min_peak_share",
        retained_until_next_step,
        default,
        |t| t.min_peak_share = 0.99,
        |a| has(a, SuspectKind::RetainedGraph, Severity::Peak),
    ),
    (
        "min_leak_occurrences",
        retained_each_step,
        default,
        |t| t.min_leak_occurrences = 100,
        |a| has(a, SuspectKind::RetainedGraph, Severity::Leak),
    ),
    (
        "leak_occurrence_share",
        clone_cached_14_of_16,
        default,
        |t| t.leak_occurrence_share = 1.5,
        |a| has(a, SuspectKind::ReferenceLeak, Severity::Leak),
    ),
    (
        "unevicted_leak_share",
        clone_kept_every_third_step,
        default,
        |t| t.unevicted_leak_share = 0.5,
        |a| has(a, SuspectKind::ReferenceLeak, Severity::Leak),
    ),
    (
        "min_held_graphs",
        eval_keeps_logits,
        default,
        |t| t.min_held_graphs = 100,
        |a| has(a, SuspectKind::RetainedGraph, Severity::Leak),
    ),
    (
        "min_gradients_per_step",
        grads_kept,
        default,
        |t| t.min_gradients_per_step = 100,
        |a| has(a, SuspectKind::UnreleasedGradient, Severity::Leak),
    ),
    (
        "grad_waste_share",
        grads_through_eval,
        default,
        |t| t.grad_waste_share = 0.99,
        |a| has(a, SuspectKind::UnreleasedGradient, Severity::Waste),
    ),
    (
        "fragmentation_min_split_bytes",
        holes,
        default,
        |t| t.fragmentation_min_split_bytes = 1 << 40,
        |a| has(a, SuspectKind::Fragmentation, Severity::Waste),
    ),
    (
        "fragmentation_min_split_share",
        holes,
        default,
        |t| t.fragmentation_min_split_share = 0.9,
        |a| has(a, SuspectKind::Fragmentation, Severity::Waste),
    ),
    (
        "fragmentation_max_allocated_share",
        holes,
        default,
        |t| t.fragmentation_max_allocated_share = 0.1,
        |a| has(a, SuspectKind::Fragmentation, Severity::Waste),
    ),
    (
        "reserved_excess_share",
        cache_does_not_fit,
        default,
        |t| t.reserved_excess_share = 0.5,
        |a| a.devices[0].cache.as_ref().and_then(|c| c.growth.as_ref()).is_some_and(|g| g.excess),
    ),
    (
        "reserved_excess_min_bytes",
        cache_does_not_fit,
        default,
        |t| t.reserved_excess_min_bytes = 1 << 30,
        |a| a.devices[0].cache.as_ref().and_then(|c| c.growth.as_ref()).is_some_and(|g| g.excess),
    ),
    (
        "state_min_same_site_blocks",
        state_only_cache,
        default,
        |t| t.state_min_same_site_blocks = 100,
        // Without a trace, what is held is stated, whether it grows is not known.
        |a| has(a, SuspectKind::ReferenceLeak, Severity::Held),
    ),
    (
        "state_graph_min_ops",
        state_only_graphs,
        default,
        |t| t.state_graph_min_ops = 6,
        |a| has(a, SuspectKind::RetainedGraph, Severity::Leak) && !has(a, SuspectKind::ReferenceLeak, Severity::Held),
    ),
    (
        "state_only_confidence",
        state_only_cache,
        default,
        |t| t.state_only_confidence = 0.9,
        |a| a.suspects().iter().any(|s| s.kind == SuspectKind::ReferenceLeak && s.confidence <= 0.5),
    ),
];

#[test]
fn each_threshold_changes_a_verdict() {
    let mut failures = Vec::new();
    for (name, make, base, mutate, holds) in CASES {
        let snap = make();
        let mut th = Thresholds::DEFAULT;
        base(&mut th);
        if !holds(&run(&snap, &th)) {
            failures
                .push(format!("{name}: the verdict does not hold before the mutation:{}", describe(&run(&snap, &th))));
            continue;
        }
        mutate(&mut th);
        if holds(&run(&snap, &th)) {
            failures.push(format!("{name}: moving it did not change the verdict"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
