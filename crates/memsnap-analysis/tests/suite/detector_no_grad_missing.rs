//! no_grad_missing: forward passes no backward consumes, run with grad (src/detectors/no_grad_missing.rs).
//! Synthetic traces of the script in `common/scenario.rs`: positives and near misses.

use crate::common;
use crate::common::GRANULE;
use memsnap_analysis::{analyze_with, Thresholds};

use common::prelude::*;

// ------------------------------------------------------------------------------------------
// no_grad_missing

fn epochs(p: &mut Program, grad: Grad, keep: bool) -> u64 {
    let mut left = 0;
    for _ in 0..2 {
        train(p, Train { steps: 4, ..Train::default() });
        left = validate(p, 3, grad, keep);
    }
    left
}

/// Training, then one validation loop without `torch.no_grad()` that keeps each batch's logits:
/// the activations of every operation of every evaluation pass stay alive.
#[test]
fn no_grad_missing_eval_after_training_keeps_activations() {
    let mut p = Program::new(2);
    train(&mut p, Train::default());
    let per_pass = validate(&mut p, 4, Grad::Enabled, true);
    let a = analyze_snapshot(&p.t.finish());
    let s = the_one(&a, SuspectKind::NoGradMissing);
    assert_site(&s, TRAIN, 30, &a);
    // The kept activations, plus each pass's input batch (line 29), folded in as kept by the
    // same graphs.
    assert!(s.bytes > 4 * per_pass && s.bytes <= 4 * per_pass + 4 * (4 << 20), "{}", describe(&a));
    // Grows by one pass's activations per pass (the median of the per-pass deltas).
    assert!(
        s.growth_bytes_per_iteration.is_some_and(|g| g >= per_pass && g <= per_pass + (4 << 20)),
        "{}",
        describe(&a)
    );
    assert_eq!(s.severity, Severity::Leak);
    for k in [SuspectKind::ReferenceLeak, SuspectKind::UnreleasedGradient] {
        assert_none_of(&a, k);
    }
}

/// The same bug in a validation loop after every epoch (two epochs of four steps and three
/// evaluation passes): six passes leave their activations behind.
#[test]
fn no_grad_missing_eval_every_epoch_keeps_activations() {
    let mut p = Program::new(2);
    let per_pass = epochs(&mut p, Grad::Enabled, true);
    let snap = p.t.finish();
    let a = analyze_snapshot(&snap);
    // No evaluation pass is taken for a training pass: the last pass of the first epoch's
    // validation is followed by training passes from another line, and their backward passes
    // do not train it.
    let phases = find_phases(&snap.traces[0].events, &StackTable::new(&snap), &[]);
    let trained: Vec<bool> = phases
        .forwards
        .iter()
        .filter(|f| f.call_site.is_some_and(|c| snap.frame(c).line == 30))
        .map(|f| f.trained)
        .collect();
    assert_eq!(trained, [false; 6], "`trained` of the six validation passes");
    let s = the_one(&a, SuspectKind::NoGradMissing);
    assert_site(&s, TRAIN, 30, &a);
    // The kept activations, plus each pass's input batch (line 29).
    assert!(s.bytes > 6 * per_pass && s.bytes <= 6 * per_pass + 6 * (4 << 20), "{}", describe(&a));
    assert_site(&the_one(&a, SuspectKind::RetainedGraph), TRAIN, 30, &a);
    // Grows by one pass's activations per pass (the median of the per-pass deltas).
    assert!(
        s.growth_bytes_per_iteration.is_some_and(|g| g >= per_pass && g <= per_pass + (4 << 20)),
        "{}",
        describe(&a)
    );
    assert_eq!(s.severity, Severity::Leak);
    for k in [SuspectKind::ReferenceLeak, SuspectKind::UnreleasedGradient] {
        assert_none_of(&a, k);
    }
}

/// Near miss: the same validation under `torch.no_grad()`, results reduced with `.item()`.
#[test]
fn no_grad_missing_near_miss_no_grad_frees_activations() {
    let mut p = Program::new(2);
    epochs(&mut p, Grad::NoGrad, false);
    assert_no_suspects(&analyze_snapshot(&p.t.finish()));
}

/// Grad enabled in evaluation, but nothing is kept, so every pass's graph dies with its
/// outputs: no leak, and no peak either (training's own step, saved tensors and gradients,
/// sets it). Each pass still holds a graph as large as a training pass's for nothing: waste,
/// with the pass's saved bytes (o06: a NeRF render without `no_grad` under training's peak).
#[test]
fn no_grad_missing_grad_enabled_nothing_kept_is_waste() {
    let mut p = Program::new(2);
    epochs(&mut p, Grad::Enabled, false);
    let a = analyze_snapshot(&p.t.finish());
    let s = the_one(&a, SuspectKind::NoGradMissing);
    assert_eq!(s.severity, Severity::Waste, "{}", describe(&a));
    assert!(s.evidence.contains("did not set the peak"), "{}", s.evidence);
    for k in [SuspectKind::RetainedGraph, SuspectKind::ReferenceLeak, SuspectKind::UnreleasedGradient] {
        assert_none_of(&a, k);
    }
}

/// Near miss: a shallow model evaluated under `no_grad` whose pass returns three of the nine
/// tensors it makes (an LSTM's output and its two states, z21): a third of its blocks survive
/// it, the share autograd's saved tensors reach, yet the training passes keep ten. Away from
/// the peak, only a pass that keeps about what training saves is said to hold graphs.
#[test]
fn no_grad_missing_near_miss_few_outputs_of_a_shallow_model_off_peak() {
    let run = |th: &Thresholds| {
        let mut p = Program::new(2);
        train(&mut p, Train::default());
        let user = [(TRAIN, 43, "<module>")];
        let model = |line: u32| chain(&[&[(MODEL, line, "forward"), CALL, WRAP], &user]);
        let size = 2 * p.act;
        let made: Vec<Blk> = (0..9).map(|k| p.t.alloc(size, &model(60 + k))).collect();
        for &b in &made[..6] {
            p.t.free(b, &model(70));
        }
        // `logits, h = model(x, h)`, read with `.item()`, then `del logits, h`.
        p.t.alloc(GRANULE, &[(TRAIN, 44, "<module>")]);
        for &b in &made[6..] {
            p.t.free(b, &[(TRAIN, 45, "<module>")]);
        }
        let snap = p.t.finish();
        analyze_with(&snap, &memsnap_replay::replay(&snap), th)
    };
    assert_none_of(&run(&Thresholds::DEFAULT), SuspectKind::NoGradMissing);
    // Three survivors are below `min_saved_blocks`; counted as saved, and without the comparison
    // with training, the outputs read as graphs held for nothing.
    let loose = run(&Thresholds { min_saved_blocks: 3, ..Thresholds::DEFAULT });
    assert_none_of(&loose, SuspectKind::NoGradMissing);
    let loose = run(&Thresholds { training_saved_share: 0.0, min_saved_blocks: 3, ..Thresholds::DEFAULT });
    assert_eq!(the_one(&loose, SuspectKind::NoGradMissing).severity, Severity::Waste, "{}", describe(&loose));
}

// ------------------------------------------------------------------------------------------
// Deferred backward and passes that never reached their backward

/// Gradient accumulation by deferred backward: four passes keep their losses, then one
/// `torch.stack(losses).mean().backward()` runs through all four. Each pass is consumed by that
/// backward (it frees their saved tensors), so none is an evaluation pass.
#[test]
fn deferred_backward_over_kept_losses_is_training_not_evaluation() {
    let mut p = Program::new(2);
    for _ in 0..4 {
        let mut passes = Vec::new();
        let mut kept = Vec::new();
        for _ in 0..4 {
            let x = p.batch(&[top(15)]);
            passes.push(p.forward(&[top(16)], Grad::Enabled, false));
            kept.push((x, p.loss(&[top(17)])));
        }
        let refs: Vec<&Pass> = passes.iter().collect();
        p.backward(&[top(18)], &refs, false);
        p.step(&[top(19)]);
        p.zero_grad(&[top(20)], ZeroGrad::SetToNone);
        for (pass, (x, loss)) in passes.iter().zip(kept) {
            p.t.free(pass.logits, &[top(23)]);
            p.t.free(loss, &[top(23)]);
            p.t.free(x, &[top(23)]);
        }
    }
    let a = analyze_snapshot(&p.t.finish());
    assert_no_suspects(&a);
}

/// Near miss of the above: the same loop whose fourth group of passes never gets its backward
/// because an allocation fails first (the trace ends at the OOM). Those graphs were awaiting
/// their backward: `retained_graph` names what filled memory; it is not an evaluation loop.
#[test]
fn passes_awaiting_backward_at_an_oom_are_not_evaluation() {
    let mut p = Program::new(2);
    for round in 0..3 {
        let mut passes = Vec::new();
        for _ in 0..4 {
            p.batch(&[top(15)]);
            passes.push(p.forward(&[top(16)], Grad::Enabled, false));
            p.loss(&[top(17)]);
        }
        if round < 2 {
            let refs: Vec<&Pass> = passes.iter().collect();
            p.backward(&[top(18)], &refs, false);
            p.step(&[top(19)]);
        } else {
            p.t.oom(512 * MIB, 10 * MIB, &[top(16)]);
        }
    }
    let a = analyze_snapshot(&p.t.finish());
    assert_none_of(&a, SuspectKind::NoGradMissing);
    let s = the_one(&a, SuspectKind::RetainedGraph);
    assert!(matches!(s.facts, Evidence::RetainedGraph { hold: GraphHold::AwaitingBackward, .. }), "{}", describe(&a));
    assert!(!of_kind(&a, SuspectKind::Oom).is_empty());
}

/// With grad on, autograd saves tensors all through the model, so the survivors come from 20
/// lines: grad on despite the low share (Faster R-CNN in fixtures/extra11/n02: 22% of its blocks
/// from ~37 stacks). What each pass keeps is then its graph: a missing `no_grad`, not outputs
/// of a no-grad pass kept by a reference.
#[test]
fn no_grad_missing_detector_evaluation_saves_few_blocks_from_many_lines() {
    let mut p = Program::new(2);
    train(&mut p, Train::default());
    detector_evaluation(&mut p, 20);
    let a = analyze_snapshot(&p.t.finish());
    let s = the_one(&a, SuspectKind::NoGradMissing);
    assert_site(&s, TRAIN, 30, &a);
    assert_eq!(s.severity, Severity::Leak);
    assert_none_of(&a, SuspectKind::ReferenceLeak);
}

/// Near miss: the same share of survivors from two lines (a cache written by every layer at one
/// line, as a KV cache is, and its outputs) is what a no-grad pass keeps: not grad on, so the
/// kept blocks are tensors held by a reference.
#[test]
fn no_grad_missing_near_miss_few_survivors_from_few_lines_are_not_grad() {
    let mut p = Program::new(2);
    train(&mut p, Train::default());
    detector_evaluation(&mut p, 2);
    let a = analyze_snapshot(&p.t.finish());
    assert_none_of(&a, SuspectKind::NoGradMissing);
    assert_none_of(&a, SuspectKind::RetainedGraph);
    // Tensors of passes run without grad, kept by a reference: the model's own `forward` makes
    // them in a loop over its layers (20 a pass, at two statements), so they are intermediates,
    // not one result: 40 at each statement that made them (`MAX_RESULT_RUNS`; a decoder's
    // per-step attention weights, fixtures/extra37/ag08).
    let leaks = of_kind(&a, SuspectKind::ReferenceLeak);
    for line in [100, 101] {
        assert!(
            leaks.iter().any(|s| s.site.as_ref().is_some_and(|f| f.line == line) && s.bytes == 40 * GRANULE),
            "{}",
            describe(&a)
        );
    }
}
