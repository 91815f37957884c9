//! Recording settings and control flow that change what a trace says (fixtures/extra4):
//! `context="alloc"` frees, a training step whose backward is skipped, and a model run several
//! times per call of a helper. Synthetic traces of the script in `common/scenario.rs`.

use crate::common;

use common::prelude::*;
use common::GRANULE;

/// A clean training loop recorded with `context="alloc"`: the activations freed by backward carry
/// the forward's frames. They must not end the backward window nor make the training passes
/// look unconsumed (w10 was named `no_grad_missing` at its training forward).
#[test]
fn context_alloc_frees_keep_training_passes_trained() {
    let mut p = Program::new(2);
    train(&mut p, Train::default());
    validate(&mut p, 3, Grad::NoGrad, false);
    let snap = as_context_alloc(p.t.finish());
    let a = analyze_snapshot(&snap);
    assert_no_suspects(&a);
    let d = &a.devices[0];
    assert_eq!(d.phases.backward_passes, 6, "{}", describe(&a));
    assert_eq!(d.phases.iterations, 6, "{}", describe(&a));
    assert_eq!(d.phases.eval_windows.len(), 1, "{}", describe(&a));
}

/// The same with graphs kept by `retain_graph=True` + a kept loss: still found, at the backward.
#[test]
fn context_alloc_frees_keep_retained_graph_found() {
    let mut p = Program::new(2);
    train(&mut p, Train { retain_graph: true, keep_loss: true, ..Train::default() });
    let a = analyze_snapshot(&as_context_alloc(p.t.finish()));
    let s = the_one(&a, SuspectKind::RetainedGraph);
    assert_site(&s, TRAIN, 18, &a);
    assert_none_of(&a, SuspectKind::NoGradMissing);
}

/// One training step: `x = batch()`, `loss = f(model(x))`, and either backward/step/zero_grad or
/// (skipped) nothing, with the skipped step's graph kept by a reference (a stored exception).
fn step(p: &mut Program, skip_backward: bool) {
    let x = p.batch(&[top(15)]);
    let pass = p.forward(&[top(16)], Grad::Enabled, false);
    let loss = p.loss(&[top(17)]);
    if skip_backward {
        return; // graph, input and loss stay alive
    }
    p.backward(&[top(18)], &[&pass], false);
    p.step(&[top(19)]);
    p.zero_grad(&[top(20)], ZeroGrad::SetToNone);
    p.t.free(x, &[top(23)]);
    p.t.free(pass.logits, &[top(23)]);
    p.t.free(loss, &[top(23)]);
}

/// w09: every third step raises between forward and backward and its graph is kept. The skipped
/// passes run the training code path (same call site, same callers) between consumed passes:
/// a retained graph, not an evaluation without `no_grad`.
#[test]
fn skipped_backward_with_kept_graph_is_retained_graph_not_no_grad_missing() {
    let mut p = Program::new(2);
    for k in 0..10 {
        step(&mut p, k % 3 == 1);
    }
    let a = analyze_snapshot(&p.t.finish());
    let s = the_one(&a, SuspectKind::RetainedGraph);
    assert_eq!(s.severity, Severity::Leak, "{}", describe(&a));
    assert!(matches!(s.facts, Evidence::RetainedGraph { hold: GraphHold::SkippedBackward, .. }), "{}", describe(&a));
    assert_none_of(&a, SuspectKind::NoGradMissing);
}

/// Near miss of the rule above: an evaluation run by a different code path (`validate()`, another
/// call site) keeping its graphs is still `no_grad_missing`.
#[test]
fn evaluation_between_training_steps_is_still_no_grad_missing() {
    let mut p = Program::new(2);
    for _ in 0..4 {
        step(&mut p, false);
        validate(&mut p, 1, Grad::Enabled, true);
    }
    step(&mut p, false);
    let a = analyze_snapshot(&p.t.finish());
    assert!(!of_kind(&a, SuspectKind::NoGradMissing).is_empty(), "{}", describe(&a));
}

/// w05: a helper runs the model `tokens` times per request under no_grad; the request's last
/// pass output is kept (a per-session cache). Per pass it is one pass in `tokens`; per call of
/// the helper it repeats every time: a reference leak counted per call.
fn serve(p: &mut Program, requests: usize, tokens: usize, keep: bool) {
    let gen = |line: u32| [(TRAIN, line, "generate"), top(50)];
    for _ in 0..requests {
        let prompt = p.batch(&[top(48)]);
        let mut last: Option<Pass> = None;
        let mut token: Option<Blk> = None;
        for _ in 0..tokens {
            if let Some(prev) = last.take() {
                p.t.free(prev.logits, &gen(45));
            }
            let pass = p.forward(&gen(44), Grad::NoGrad, false);
            for &s in pass.saved.iter().rev() {
                p.t.free(s, &gen(44));
            }
            last = Some(pass);
            // 46: `ids = logits.argmax(-1)`, the next step's input (the helper's own code).
            if let Some(t) = token.replace(p.t.alloc(GRANULE, &gen(46))) {
                p.t.free(t, &gen(46));
            }
        }
        if let Some(t) = token {
            p.t.free(t, &[top(52)]);
        }
        if !keep {
            if let Some(prev) = last.take() {
                p.t.free(prev.logits, &[top(52)]);
            }
        }
        p.t.free(prompt, &[top(52)]);
    }
}

#[test]
fn cache_kept_per_helper_call_is_a_reference_leak_per_call() {
    let mut p = Program::new(2);
    serve(&mut p, 5, 8, true);
    let a = analyze_snapshot(&p.t.finish());
    let s = the_one(&a, SuspectKind::ReferenceLeak);
    assert_eq!(s.severity, Severity::Leak, "{}", describe(&a));
    assert_eq!(s.growth_unit, memsnap_analysis::Occurrence::Call, "{}", describe(&a));
    assert_eq!(s.growth_bytes_per_iteration, Some(2 * p.act), "{}", describe(&a));
}

/// Near miss: the same server dropping each request's output keeps nothing.
#[test]
fn cache_dropped_per_helper_call_is_clean() {
    let mut p = Program::new(2);
    serve(&mut p, 5, 8, false);
    assert_no_suspects(&analyze_snapshot(&p.t.finish()));
}

/// A no-grad evaluation that keeps every pass's logits, recorded with `context="alloc"`: a
/// no-grad layer frees its input once its output is made, so the pass's last free (the final
/// norm's output, freed after the logits are allocated) comes after its last allocation, with the
/// allocation's stack. It belongs to the pass: read without it, the pass ended at the logits
/// and the norm's output outlived it, as a grad-on pass's saved tensor would (q33's rollouts,
/// recorded this way, read as `no_grad_missing`). Same passes and suspects as with free-time
/// stacks.
#[test]
fn context_alloc_frees_keep_no_grad_passes_no_grad() {
    let build = || {
        let mut p = Program::new(2);
        train(&mut p, Train::default());
        validate(&mut p, 6, Grad::NoGrad, true);
        p.t.finish()
    };
    let plain = analyze_snapshot(&build());
    let alloc = analyze_snapshot(&as_context_alloc(build()));
    let kinds =
        |a: &memsnap_analysis::Analysis| a.suspects().iter().map(|s| (s.kind, s.site.clone())).collect::<Vec<_>>();
    assert_eq!(kinds(&alloc), kinds(&plain), "{}", describe(&alloc));
    assert_none_of(&alloc, SuspectKind::NoGradMissing);
    let spans = |a: &memsnap_analysis::Analysis| {
        a.devices[0].trace_phases.forwards.iter().map(|f| (f.span.start, f.span.end)).collect::<Vec<_>>()
    };
    assert_eq!(spans(&alloc), spans(&plain));
}

/// A clean training loop recorded with `context="alloc"` and without `free_requested` entries:
/// the frees are seen only as completions, which carry the allocation's stacks. They must still
/// tell that the stacks are the allocations' (else the backward's frees of the saved tensors
/// read as the forward pass running again, as k01 read so: 32 passes, none trained, its saved
/// tensors "never freed", a retained graph).
#[test]
fn frees_seen_as_completions_keep_training_passes_trained() {
    let mut p = Program::new(2);
    train(&mut p, Train::default());
    validate(&mut p, 3, Grad::NoGrad, false);
    let a = analyze_snapshot(&without_free_requests(as_context_alloc(p.t.finish())));
    assert_no_suspects(&a);
    let d = &a.devices[0];
    assert_eq!(d.phases.backward_passes, 6, "{}", describe(&a));
    assert_eq!(d.phases.eval_windows.len(), 1, "{}", describe(&a));
}
