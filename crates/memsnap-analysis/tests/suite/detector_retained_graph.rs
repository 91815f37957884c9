//! retained_graph: graphs kept past their backward (see src/detectors/retained_graph.rs).
//! Synthetic traces of the script in `common/scenario.rs`: positives and near misses.

use crate::common;

use common::prelude::*;

// ------------------------------------------------------------------------------------------
// The builder's traces are healthy on their own

#[test]
fn clean_training_has_no_suspects() {
    let mut p = Program::new(2);
    train(&mut p, Train::default());
    validate(&mut p, 3, Grad::NoGrad, false);
    let a = analyze_snapshot(&p.t.finish());
    assert_no_suspects(&a);
    let d = &a.devices[0];
    assert_eq!(d.phases.backward_passes, 6, "{}", describe(&a));
    assert_eq!(d.phases.iterations, 6, "{}", describe(&a));
    assert_eq!(d.phases.eval_windows.len(), 1, "{}", describe(&a));
}

// ------------------------------------------------------------------------------------------
// retained_graph

/// `loss.backward(retain_graph=True)` and `history.append(loss)`: every step's graph, with the
/// activations of every operation of the forward pass, stays alive.
#[test]
fn retained_graph_every_activation_kept_each_step() {
    let mut p = Program::new(2);
    let o = Train { retain_graph: true, keep_loss: true, ..Train::default() };
    let steps = train(&mut p, o);
    let a = analyze_snapshot(&p.t.finish());
    let s = the_one(&a, SuspectKind::RetainedGraph);
    // `backward(retain_graph=True)` frees none of the graph: named at the backward line.
    assert_site(&s, TRAIN, 18, &a);
    assert_eq!(s.severity, Severity::Leak, "{}", describe(&a));
    assert!(matches!(s.facts, Evidence::RetainedGraph { hold: GraphHold::RetainedByBackward, .. }));
    assert!(s.growth_bytes_per_iteration.unwrap() > steps.saved_bytes, "{}", describe(&a));
    // Every step's graph is kept, with its inputs and loss (members of the same graph).
    assert!(s.bytes >= 5 * steps.saved_bytes, "{}", describe(&a));
    assert!(s.confidence >= 0.5 && s.confidence <= 1.0);
    assert!(!s.stack.is_empty() && !s.advice.is_empty() && !s.evidence.is_empty());
    for k in [SuspectKind::NoGradMissing, SuspectKind::ReferenceLeak, SuspectKind::UnreleasedGradient] {
        assert_none_of(&a, k);
    }
    assert_eq!(a.suspects()[0].kind, SuspectKind::RetainedGraph, "{}", describe(&a));
}

/// Near miss: the same loop with the graph freed by backward (`loss.item()` kept). Its
/// high-water mark comes back every step.
#[test]
fn retained_graph_near_miss_activations_freed_in_backward() {
    let mut p = Program::new(2);
    train(&mut p, Train::default());
    assert_no_suspects(&analyze_snapshot(&p.t.finish()));
}

/// Near miss: activations so large that this clean run's peak is as high as the leaking run's.
#[test]
fn retained_graph_near_miss_same_high_peak() {
    let mut leak = Program::new(2);
    train(&mut leak, Train { retain_graph: true, keep_loss: true, ..Train::default() });
    let leak_peak = leak.t.peak_allocated;
    let mut p = Program::new(12);
    train(&mut p, Train::default());
    assert!(p.t.peak_allocated >= leak_peak, "{} < {leak_peak}", p.t.peak_allocated);
    assert_no_suspects(&analyze_snapshot(&p.t.finish()));
}

/// Near miss for the leak: `retain_graph=True`, but the loss is not kept, so each graph dies
/// when `loss` is rebound next step. Not a leak, but the peak holds two graphs: severity `peak`.
#[test]
fn retained_graph_near_miss_retain_graph_without_keeping_the_loss() {
    let mut p = Program::new(2);
    train(&mut p, Train { retain_graph: true, ..Train::default() });
    let a = analyze_snapshot(&p.t.finish());
    let s = the_one(&a, SuspectKind::RetainedGraph);
    assert_eq!(s.severity, Severity::Peak, "{}", describe(&a));
    assert!(s.growth_bytes_per_iteration.is_none());
    assert!(s.peak_without.is_some_and(|w| w < a.devices[0].peak.allocated), "{}", describe(&a));
    assert_eq!(a.suspects().len(), 1, "{}", describe(&a));
}

// ------------------------------------------------------------------------------------------
// Python that the autograd engine runs inside a backward pass

const CHECKPOINT: &str = "/usr/lib/python3.11/site-packages/torch/utils/checkpoint.py";
const GRAPH: &str = "/usr/lib/python3.11/site-packages/torch/autograd/graph.py";

/// Activation checkpointing: during backward, the engine's thread recomputes a forward region
/// through `nn.Module` calls under `torch/utils/checkpoint.py`, with no user loop on the stack.
/// Those allocations belong to the backward (they must not open forward passes or evaluation
/// windows, nor close the backward window), and the program is clean.
#[test]
fn checkpoint_recomputation_belongs_to_the_backward() {
    let mut p = Program::new(2);
    let recompute = [
        (common::program::LINEAR, 125, "forward"),
        CALL,
        WRAP,
        (MODEL, 22, "forward"),
        CALL,
        WRAP,
        (CHECKPOINT, 1125, "recompute_fn"),
        (GRAPH, 400, "unpack_hook"),
    ];
    for _ in 0..5 {
        let x = p.batch(&[top(15)]);
        let pass = p.forward(&[top(16)], Grad::Enabled, false);
        let loss = p.loss(&[top(17)]);
        // The launch, then the recomputed region (freed inside the backward), then the rest.
        let launch = chain(&[
            &[(common::program::AUTOGRAD, 220, "_make_grads"), (common::program::AUTOGRAD, 347, "backward")],
            &[top(18)],
        ]);
        let seed = p.t.alloc(2 * MIB, &launch);
        let r = p.t.alloc(4 * MIB, &recompute);
        p.t.free(r, &recompute);
        p.t.free(seed, &[]);
        p.backward(&[top(18)], &[&pass], false);
        p.step(&[top(19)]);
        p.zero_grad(&[top(20)], ZeroGrad::SetToNone);
        p.t.free(pass.logits, &[top(23)]);
        p.t.free(loss, &[top(23)]);
        p.t.free(x, &[top(23)]);
    }
    let snap = p.t.finish();
    let stacks = StackTable::new(&snap);
    let phases = find_phases(&snap.traces[0].events, &stacks, &[]);
    assert_eq!(phases.forwards.len(), 5, "recomputation opened forward passes: {:?}", phases.forwards);
    assert!(phases.eval_windows.is_empty(), "{:?}", phases.eval_windows);
    let a = analyze_snapshot(&snap);
    assert_no_suspects(&a);
}

/// The engine-run rule looks at where the user's frames are, not at the outermost frame: a custom
/// `autograd.Function` called from the user's loop under `python -m` (runpy outermost, a library
/// frame) is the user's forward, while a checkpoint recomputation has no user frame outside the
/// autograd machinery.
#[test]
fn engine_run_python_is_told_by_the_user_frames_outside_autograd() {
    const FUNCTION: &str = "/usr/lib/python3.11/site-packages/torch/autograd/function.py";
    const RUNPY: &str = "/usr/lib/python3.11/runpy.py";
    let mut t = TraceBuilder::new();
    let custom = [
        (MODEL, 33, "forward"),
        (FUNCTION, 575, "apply"),
        (MODEL, 22, "forward"),
        CALL,
        WRAP,
        (TRAIN, 16, "main"),
        (RUNPY, 88, "_run_code"),
        (RUNPY, 198, "_run_module_as_main"),
    ];
    let recompute =
        [(MODEL, 22, "forward"), CALL, WRAP, (CHECKPOINT, 1125, "recompute_fn"), (GRAPH, 400, "unpack_hook")];
    let a = t.stack(&custom);
    let b = t.stack(&recompute);
    let snap = t.finish();
    let table = StackTable::new(&snap);
    assert!(!table.get(a).recompute, "a custom Function called from the user's loop is not engine-run");
    assert!(table.get(b).recompute, "a checkpoint recomputation is engine-run");
}

/// One loss over two passes (`model(x)` and `aux(x)`), `backward(retain_graph=True)` and
/// `history.append(loss)`: the backward frees neither graph, and the first pass, with the aux
/// pass between it and the backward, is retained with it, not an evaluation without no_grad.
#[test]
fn retained_graph_over_two_passes_of_one_loss() {
    let mut p = Program::new(2);
    let o = Train { retain_graph: true, keep_loss: true, two_calls: true, ..Train::default() };
    let steps = train(&mut p, o);
    let a = analyze_snapshot(&p.t.finish());
    let s = the_one(&a, SuspectKind::RetainedGraph);
    assert_site(&s, TRAIN, 18, &a);
    assert_eq!(s.severity, Severity::Leak, "{}", describe(&a));
    assert!(s.growth_bytes_per_iteration.unwrap() > 2 * steps.saved_bytes, "{}", describe(&a));
    assert_none_of(&a, SuspectKind::NoGradMissing);
    assert_none_of(&a, SuspectKind::ReferenceLeak);
}

// ------------------------------------------------------------------------------------------
// retained_graph: read from the dump alone (no trace, or one without stacks)

/// 8 grad-on passes whose graphs a list keeps, read from the dump alone: their saved tensors
/// were made by five different operations of the model (embedding, norm, linear, GELU, residual
/// add), each alive 8 times or more: kept graphs, at the line that ran the model.
#[test]
fn retained_graph_seen_at_dump() {
    let mut p = Program::new(2);
    for _ in 0..8 {
        let _ = p.forward(&[top(30)], Grad::Enabled, false);
    }
    let a = analyze_snapshot(&dump_alone(p.t.finish()));
    let s = the_one(&a, SuspectKind::RetainedGraph);
    assert_site(&s, TRAIN, 30, &a);
    assert!(
        matches!(
            s.facts,
            Evidence::RetainedGraph { hold: GraphHold::SeenAtDump, operations: Some(5), graphs: None, .. }
        ),
        "{}",
        describe(&a)
    );
    assert_none_of(&a, SuspectKind::ReferenceLeak);
}

/// Near miss: a forward hook keeps each block's `fc2` output of 8 no-grad passes, read from the
/// dump alone: one operation's output per layer (the `Linear` line), not what autograd saves:
/// kept outputs, `reference_leak`.
#[test]
fn retained_graph_near_miss_hook_outputs_at_dump() {
    let mut p = Program::new(2);
    for _ in 0..8 {
        let _ = p.forward(&[top(30)], Grad::NoGrad, true);
    }
    let a = analyze_snapshot(&dump_alone(p.t.finish()));
    assert_none_of(&a, SuspectKind::RetainedGraph);
    let _ = the_one(&a, SuspectKind::ReferenceLeak);
}

/// Near miss, with a trace whose events carry no stacks (`context="state"`): the same 8 kept
/// passes of five operations, but this model's operations make one block each, so the trace
/// shows no twins (two blocks of one size that one operation makes one right after the other,
/// as a norm's statistics are): what a hook on every module would keep, `reference_leak`, whose
/// evidence counts the operations and says they may be graphs.
#[test]
fn retained_graph_near_miss_operations_without_twins() {
    let mut p = Program::new(2);
    for _ in 0..8 {
        let _ = p.forward(&[top(30)], Grad::Enabled, false);
    }
    let a = analyze_snapshot(&common::recording::without_event_stacks(p.t.finish()));
    assert_none_of(&a, SuspectKind::RetainedGraph);
    let s = the_one(&a, SuspectKind::ReferenceLeak);
    assert!(matches!(s.facts, Evidence::ReferenceLeak { operations: Some(5), .. }), "{}", describe(&a));
}
