//! unreleased_gradient: gradients kept each step, or through evaluation (src/detectors/unreleased_gradient.rs).
//! Synthetic traces of the script in `common/scenario.rs`: positives and near misses.

use crate::common;

use common::prelude::*;

// ------------------------------------------------------------------------------------------
// unreleased_gradient: growth

/// `grad_log.append({n: p.grad ...})` with `zero_grad(set_to_none=True)`: every backward
/// allocates new gradients and none is ever freed.
#[test]
fn unreleased_gradient_new_grads_kept_each_step() {
    let mut p = Program::new(2);
    train(&mut p, Train { zero: ZeroGrad::SetToNoneButReferenced, ..Train::default() });
    let params = p.param_bytes();
    let a = analyze_snapshot(&p.t.finish());
    let s = the_one(&a, SuspectKind::UnreleasedGradient);
    // Frameless backward allocations are attributed to the `.backward()` line.
    assert_site(&s, TRAIN, 18, &a);
    assert_eq!(s.growth_bytes_per_iteration, Some(params), "{}", describe(&a));
    assert!(s.bytes >= 5 * params && s.bytes <= 6 * params, "{}", describe(&a));
    for k in [SuspectKind::RetainedGraph, SuspectKind::NoGradMissing, SuspectKind::ReferenceLeak] {
        assert_none_of(&a, k);
    }
}

/// Near miss: `zero_grad(set_to_none=False)`: gradients allocated by the first backward and
/// reused by every later one.
#[test]
fn unreleased_gradient_near_miss_grads_allocated_once_and_reused() {
    let mut p = Program::new(2);
    train(&mut p, Train { zero: ZeroGrad::InPlace, ..Train::default() });
    assert_no_suspects(&analyze_snapshot(&p.t.finish()));
}

/// A gradient log that starts after a warm-up (q01): `zero_grad(set_to_none=True)` each step,
/// and from iteration 8 of 12 on the gradients are also stored, so each later backward makes new
/// ones and the stored sets stay: kept in 4 of 12 iterations, every one from the start of the log
/// to the end. Growth is measured from where the log started: one set per iteration.
#[test]
fn unreleased_gradient_log_started_after_a_warm_up() {
    let mut p = Program::new(2);
    for it in 0..12 {
        let zero = if it >= 8 { ZeroGrad::SetToNoneButReferenced } else { ZeroGrad::SetToNone };
        step_with(&mut p, zero, |_| {});
    }
    let params = p.param_bytes();
    let a = analyze_snapshot(&p.t.finish());
    let s = the_one(&a, SuspectKind::UnreleasedGradient);
    assert_site(&s, TRAIN, 18, &a);
    assert_eq!(s.severity, memsnap_analysis::Severity::Leak, "{}", describe(&a));
    assert_eq!(s.growth_bytes_per_iteration, Some(params), "{}", describe(&a));
}

/// Near miss: layers unfrozen with `zero_grad(set_to_none=False)` (q03): the gradients are made
/// once and reused, and the first backward after each unfreezing (iterations 4 and 8 of 12) makes
/// the new layer's gradients, kept as `.grad` to the end: kept in scattered iterations, not in a
/// run that goes on to the end.
#[test]
fn unreleased_gradient_near_miss_layers_unfrozen_with_gradients_kept_in_place() {
    let mut p = Program::new(2);
    for it in 0..12 {
        step_with(&mut p, ZeroGrad::InPlace, |p| {
            if it == 4 || it == 8 {
                // The unfrozen layer's weight and bias gradients, made by the same backward.
                p.t.alloc(4 * MIB, &[]);
                p.t.alloc(2 * MIB, &[]);
            }
        });
    }
    assert_none_of(&analyze_snapshot(&p.t.finish()), SuspectKind::UnreleasedGradient);
}

// ------------------------------------------------------------------------------------------
// unreleased_gradient: through evaluation

/// `zero_grad(set_to_none=False)`, then a `no_grad` evaluation: parameter-sized gradients are
/// allocated while the evaluation runs.
#[test]
fn unreleased_gradient_grads_alive_through_eval() {
    let mut p = Program::new(2);
    train(&mut p, Train { steps: 5, zero: ZeroGrad::InPlace, ..Train::default() });
    validate(&mut p, 4, Grad::NoGrad, false);
    let params = p.param_bytes();
    let a = analyze_snapshot(&p.t.finish());
    let s = the_one(&a, SuspectKind::UnreleasedGradient);
    assert_site(&s, TRAIN, 18, &a);
    assert_eq!(s.growth_bytes_per_iteration, None, "{}", describe(&a));
    assert_eq!(s.bytes, params, "{}", describe(&a));
    assert_eq!(a.suspects().len(), 1, "{}", describe(&a));
}

/// Near miss: `zero_grad(set_to_none=True)` after the step frees the gradients before eval.
#[test]
fn unreleased_gradient_near_miss_grads_freed_before_eval() {
    let mut p = Program::new(2);
    train(&mut p, Train { steps: 5, ..Train::default() });
    validate(&mut p, 4, Grad::NoGrad, false);
    assert_no_suspects(&analyze_snapshot(&p.t.finish()));
}

/// `zero_grad(set_to_none=True)` at the start of each step: the last step's gradients are
/// still allocated during the evaluation that follows (a true, if common, suspect).
#[test]
fn unreleased_gradient_grads_zeroed_at_step_start_alive_through_eval() {
    let mut p = Program::new(2);
    train(&mut p, Train { steps: 5, zero_at_start: true, ..Train::default() });
    validate(&mut p, 4, Grad::NoGrad, false);
    let params = p.param_bytes();
    let a = analyze_snapshot(&p.t.finish());
    let s = the_one(&a, SuspectKind::UnreleasedGradient);
    assert_site(&s, TRAIN, 18, &a);
    assert_eq!(s.growth_bytes_per_iteration, None, "{}", describe(&a));
    assert_eq!(s.bytes, params, "{}", describe(&a));
    assert_eq!(a.suspects().len(), 1, "{}", describe(&a));
}

/// Near miss for the evaluation windows: two model calls per step (from two lines) feed one
/// loss and one backward, gradients kept with `set_to_none=False`, no evaluation at all. The
/// first call is followed by another call before its backward, yet it is a training pass.
#[test]
fn two_model_calls_per_step_are_training_not_evaluation() {
    let mut p = Program::new(2);
    train(&mut p, Train { zero: ZeroGrad::InPlace, two_calls: true, ..Train::default() });
    let a = analyze_snapshot(&p.t.finish());
    assert!(a.devices[0].phases.eval_windows.is_empty(), "{}", describe(&a));
    assert_no_suspects(&a);
}

// ------------------------------------------------------------------------------------------
// unreleased_gradient: read from the dump alone (no trace, or one without stacks)

/// `grad_log.append(...)` each step, recorded with `context="state"` (no stack on any trace
/// event, the dump's blocks with theirs): 6 backward passes' gradients are alive, each without a
/// Python frame (the engine's thread) and of a parameter's size, 6 per parameter where a program
/// holds 1; the latest set is the current `.grad`s, the other 5 kept.
#[test]
fn unreleased_gradient_kept_grads_seen_at_dump() {
    let mut p = Program::new(2);
    train(&mut p, Train { zero: ZeroGrad::SetToNoneButReferenced, ..Train::default() });
    let params = p.param_bytes();
    let a = analyze_snapshot(&without_event_stacks(p.t.finish()));
    let s = the_one(&a, SuspectKind::UnreleasedGradient);
    assert!(
        matches!(
            s.facts,
            Evidence::UnreleasedGradient {
                hold: memsnap_analysis::GradientHold::SeenAtDump { generations: 6, .. },
                ..
            }
        ),
        "{}",
        describe(&a)
    );
    assert_eq!(s.bytes, 5 * params, "{}", describe(&a));
    assert!(s.confidence <= 0.5, "{}", describe(&a));
}

/// Near miss: the same program with no trace at all (`enabled="state"`): under `stacks="python"`
/// a gradient's block has no frame, as has every block made before recording (a model and its
/// optimizer state made before `_record_memory_history`), so frameless blocks are not counted.
#[test]
fn unreleased_gradient_near_miss_frameless_blocks_without_a_trace() {
    let mut p = Program::new(2);
    train(&mut p, Train { zero: ZeroGrad::SetToNoneButReferenced, ..Train::default() });
    assert_none_of(&analyze_snapshot(&dump_alone(p.t.finish())), SuspectKind::UnreleasedGradient);
}

/// Near miss: `zero_grad(set_to_none=False)` each step, recorded with `context="state"`: only
/// the current gradients are alive, one per parameter.
#[test]
fn unreleased_gradient_near_miss_current_grads_at_dump() {
    let mut p = Program::new(2);
    train(&mut p, Train { zero: ZeroGrad::InPlace, ..Train::default() });
    assert_none_of(&analyze_snapshot(&without_event_stacks(p.t.finish())), SuspectKind::UnreleasedGradient);
}
