//! Each detector on small synthetic traces built in code: a positive, and a near miss that must
//! not fire. The traces are what a training script does (see `common/program.rs`): forward
//! passes through `nn.Module` calls, `.backward()` launched under `torch/autograd` with frameless
//! engine allocations, Adam steps, `zero_grad`, evaluation loops. The script, `/home/u/train.py`:
//!
//! ```text
//!  9  model = Net().cuda()
//! 12  def hook(mod, inp, out): cache.append(out)        # forward hook on every block's fc2
//! 13  for step in range(N):
//! 14      opt.zero_grad(set_to_none=True)                # one scenario zeroes here, not at 20
//! 15      x = torch.randint(...)
//! 16      logits = model(x)                              # + aux(x) in the two-call scenario
//! 17      loss = F.cross_entropy(logits, y)
//! 18      loss.backward()                                # retain_graph=True in one scenario
//! 19      opt.step()
//! 20      opt.zero_grad(set_to_none=...)
//! 21      history.append(loss)                           # or loss.item()
//! 22      snaps.append(logits.detach().clone())          # or `last = ...`
//! 23      del x, logits, loss
//! 26  def aux(x): return model(x.flip(0))               # a second model call feeding the loss
//! 28  def validate():
//! 29      x = torch.randint(...)
//! 30      logits = model(x)                              # with or without torch.no_grad()
//! 31      loss = F.cross_entropy(logits, y)
//! 32      losses.append(loss.item()); preds.append(logits)   # or del logits
//! 40  history.append(validate())
//! ```

mod common;

use common::program::{chain, top, Grad, Pass, Program, ZeroGrad, CALL, MODEL, TRAIN, WRAP};
use common::{Blk, Fr, TraceBuilder, MIB};
use memsnap_analysis::{analyze, find_phases, Analysis, Evidence, GraphHold, Severity, StackTable, Suspect, SuspectKind};
use memsnap_model::Snapshot;

// ------------------------------------------------------------------------------------------
// Helpers

/// Replay (asserting the replay reproduces the builder's final segment table) and analyse.
fn analyze_snapshot(snap: &Snapshot) -> Analysis {
    let replay = memsnap_replay::replay(snap);
    for d in &replay.devices {
        assert!(d.check.matches_snapshot, "replay self-check failed: {:?}", d.check.mismatches);
        assert_eq!(d.diagnostic_count, 0, "replay diagnostics: {:?}", d.diagnostics);
    }
    analyze(snap, &replay)
}

fn describe(a: &Analysis) -> String {
    let mut s = String::new();
    for x in a.suspects() {
        s.push_str(&format!(
            "\n  {} at {} bytes={} growth={:?} conf={:.2}: {}",
            x.kind.name(),
            x.site.as_ref().map_or("-".to_string(), |s| format!("{}:{}", s.filename, s.line)),
            x.bytes,
            x.growth_bytes_per_iteration,
            x.confidence,
            x.evidence
        ));
    }
    let d = &a.devices[0];
    s.push_str(&format!(
        "\n  phases: {} iterations ({:?}), {} backward, {} forward, eval windows {:?}",
        d.phases.iterations,
        d.phases.iteration_source,
        d.phases.backward_passes,
        d.phases.forward_passes,
        d.phases.eval_windows
    ));
    s
}

fn of_kind(a: &Analysis, kind: SuspectKind) -> Vec<&Suspect> {
    a.suspects().into_iter().filter(|s| s.kind == kind).collect()
}

/// The one suspect of `kind`, failing with the whole list otherwise.
fn the_one(a: &Analysis, kind: SuspectKind) -> Suspect {
    let v = of_kind(a, kind);
    assert_eq!(v.len(), 1, "expected one {} suspect, got:{}", kind.name(), describe(a));
    v[0].clone()
}

fn assert_site(s: &Suspect, file: &str, line: u32, a: &Analysis) {
    let site = s.site.as_ref().unwrap_or_else(|| panic!("{} has no site:{}", s.kind.name(), describe(a)));
    assert_eq!((site.filename.as_str(), site.line), (file, line), "site of {}:{}", s.kind.name(), describe(a));
}

fn assert_no_suspects(a: &Analysis) {
    assert!(a.suspects().is_empty(), "a clean trace has no suspects, got:{}", describe(a));
}

fn assert_none_of(a: &Analysis, kind: SuspectKind) {
    assert!(of_kind(a, kind).is_empty(), "no {} expected, got:{}", kind.name(), describe(a));
}

// ------------------------------------------------------------------------------------------
// The training loop

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Keep {
    /// Not kept: freed in the same step.
    No,
    /// Kept for one step: freed when the next step replaces it.
    OneStep,
    /// Kept for good (appended to a list).
    Forever,
}

#[derive(Clone, Copy, Debug)]
struct Train {
    steps: usize,
    retain_graph: bool,
    /// `history.append(loss)` (the tensor) instead of `loss.item()`.
    keep_loss: bool,
    zero: ZeroGrad,
    /// What a forward hook on `fc2` does with the output.
    hook: Keep,
    /// `snaps.append(logits.detach().clone())` (Forever) vs `last = ...` (OneStep).
    clone: Keep,
    /// `zero_grad` at the start of the step (before the forward pass) instead of after `step()`.
    zero_at_start: bool,
    /// A second model call per step (`aux(x)`, line 26) whose output feeds the same loss.
    two_calls: bool,
}

impl Default for Train {
    fn default() -> Self {
        Train {
            steps: 6,
            retain_graph: false,
            keep_loss: false,
            zero: ZeroGrad::SetToNone,
            hook: Keep::No,
            clone: Keep::No,
            zero_at_start: false,
            two_calls: false,
        }
    }
}

/// What the loop left behind, for expectations.
#[derive(Default)]
struct Steps {
    /// Bytes of the saved tensors of one forward pass.
    saved_bytes: u64,
    /// Bytes of the fc2 outputs of one pass (what the hook sees).
    fc2_bytes: u64,
    logits_bytes: u64,
}

const HOOK: Fr = (TRAIN, 12, "hook");

fn train(p: &mut Program, o: Train) -> Steps {
    let mut out = Steps::default();
    let mut hooked: Vec<Blk> = Vec::new();
    let mut last_clone: Option<Blk> = None;
    for _ in 0..o.steps {
        if o.zero_at_start {
            p.zero_grad(&[top(14)], o.zero);
        }
        let x = p.batch(&[top(15)]);
        let pass: Pass = p.forward(&[top(16)], Grad::Enabled, o.hook != Keep::No);
        let aux = o.two_calls.then(|| p.forward(&[(TRAIN, 26, "aux"), top(16)], Grad::Enabled, false));
        out.saved_bytes = pass.saved_bytes;
        out.fc2_bytes = pass.fc2_bytes;
        out.logits_bytes = 2 * p.act;
        if o.hook == Keep::OneStep {
            // The hook replaces the cache entry: last step's outputs die inside this forward.
            let hook_stack = chain(&[
                &[HOOK, CALL, WRAP, (MODEL, 24, "forward"), CALL, WRAP, (MODEL, 42, "forward"), CALL, WRAP],
                &[top(16)],
            ]);
            for b in hooked.drain(..) {
                p.t.free(b, &hook_stack);
            }
        }
        hooked.extend(pass.fc2.iter().copied());
        let loss = p.loss(&[top(17)]);
        let passes: Vec<&Pass> = std::iter::once(&pass).chain(aux.as_ref()).collect();
        p.backward(&[top(18)], &passes, o.retain_graph);
        p.step(&[top(19)]);
        if !o.zero_at_start {
            p.zero_grad(&[top(20)], o.zero);
        }
        // 22: a detached copy of the logits.
        if o.clone != Keep::No {
            let c = p.t.alloc(2 * p.act, &[top(22)]);
            if o.clone == Keep::OneStep {
                if let Some(prev) = last_clone.replace(c) {
                    p.t.free(prev, &[top(22)]);
                }
            }
        }
        // 23: del x, logits, loss. A kept loss keeps a retained graph (and x, saved by the
        // embedding) alive; a loss that dies takes a retained graph with it.
        let graph_alive = o.retain_graph && o.keep_loss;
        if !graph_alive {
            p.t.free(x, &[top(23)]);
            if o.retain_graph {
                for &s in pass.saved.iter().rev() {
                    p.t.free(s, &[top(23)]);
                }
            }
        }
        p.t.free(pass.logits, &[top(23)]);
        if let Some(aux) = &aux {
            p.t.free(aux.logits, &[top(23)]);
        }
        if !o.keep_loss {
            p.t.free(loss, &[top(23)]);
        }
    }
    out
}

/// `validate()` from `train.py:40`: `passes` forward passes at `train.py:30`. With
/// `keep_logits`, each pass's logits are appended to a list that outlives the loop (with grad
/// enabled, each keeps its graph: the saved activations and the input); otherwise they are
/// reduced with `.item()` and freed. The loss is always reduced with `.item()`. Returns the
/// bytes each pass leaves behind in the forward pass (saved tensors and logits).
fn validate(p: &mut Program, passes: usize, grad: Grad, keep_logits: bool) -> u64 {
    let frames = |line: u32| [(TRAIN, line, "validate"), top(40)];
    let mut left_per_pass = 0;
    for _ in 0..passes {
        let x = p.batch(&frames(29));
        let pass = p.forward(&frames(30), grad, false);
        let loss = p.loss(&frames(31));
        p.t.free(loss, &frames(32));
        if keep_logits {
            left_per_pass = pass.saved_bytes + 2 * p.act;
            if grad == Grad::NoGrad {
                p.t.free(x, &frames(32));
            }
        } else {
            p.t.free(pass.logits, &frames(32));
            for &s in pass.saved.iter().rev() {
                p.t.free(s, &frames(32));
            }
            p.t.free(x, &frames(32));
        }
    }
    left_per_pass
}

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
    assert!(s.growth_bytes_per_iteration.is_some_and(|g| g >= per_pass && g <= per_pass + (4 << 20)), "{}", describe(&a));
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
    assert!(s.growth_bytes_per_iteration.is_some_and(|g| g >= per_pass && g <= per_pass + (4 << 20)), "{}", describe(&a));
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

/// Near miss: grad enabled in evaluation, but nothing is kept, so every pass's graph dies with
/// its outputs (wasteful at the peak, not a leak).
#[test]
fn no_grad_missing_near_miss_grad_enabled_nothing_kept() {
    let mut p = Program::new(2);
    epochs(&mut p, Grad::Enabled, false);
    let a = analyze_snapshot(&p.t.finish());
    for k in [
        SuspectKind::NoGradMissing,
        SuspectKind::RetainedGraph,
        SuspectKind::ReferenceLeak,
        SuspectKind::UnreleasedGradient,
    ] {
        assert_none_of(&a, k);
    }
}

// ------------------------------------------------------------------------------------------
// reference_leak

/// A forward hook on `fc2` appends its output to a list: one operation's output per block per
/// step survives; nothing else of the graph does.
#[test]
fn reference_leak_hook_keeps_one_output_per_step() {
    let mut p = Program::new(2);
    let steps = train(&mut p, Train { hook: Keep::Forever, ..Train::default() });
    let a = analyze_snapshot(&p.t.finish());
    let s = the_one(&a, SuspectKind::ReferenceLeak);
    // The user line whose output the hook keeps: `h = self.fc2(h)` in the block's forward.
    assert_site(&s, MODEL, 24, &a);
    assert_eq!(s.growth_bytes_per_iteration, Some(steps.fc2_bytes), "{}", describe(&a));
    assert!(s.bytes >= 5 * steps.fc2_bytes && s.bytes <= 6 * steps.fc2_bytes, "{}", describe(&a));
    for k in [SuspectKind::RetainedGraph, SuspectKind::NoGradMissing, SuspectKind::UnreleasedGradient] {
        assert_none_of(&a, k);
    }
}

/// Near miss: the hook overwrites its cache, so each output lives one step.
#[test]
fn reference_leak_near_miss_hook_keeps_last_step_only() {
    let mut p = Program::new(2);
    train(&mut p, Train { hook: Keep::OneStep, ..Train::default() });
    assert_no_suspects(&analyze_snapshot(&p.t.finish()));
}

/// `snaps.append(logits.detach().clone())` at a user line outside the model.
#[test]
fn reference_leak_user_line_tensor_kept_each_step() {
    let mut p = Program::new(2);
    let steps = train(&mut p, Train { clone: Keep::Forever, ..Train::default() });
    let a = analyze_snapshot(&p.t.finish());
    let s = the_one(&a, SuspectKind::ReferenceLeak);
    assert_site(&s, TRAIN, 22, &a);
    assert_eq!(s.growth_bytes_per_iteration, Some(steps.logits_bytes), "{}", describe(&a));
    assert_eq!(s.bytes, 5 * steps.logits_bytes, "{}", describe(&a));
    for k in [SuspectKind::RetainedGraph, SuspectKind::NoGradMissing, SuspectKind::UnreleasedGradient] {
        assert_none_of(&a, k);
    }
}

/// Near miss: `last = logits.detach().clone()`: the previous copy dies when it is replaced.
#[test]
fn reference_leak_near_miss_user_line_tensor_replaced_next_step() {
    let mut p = Program::new(2);
    train(&mut p, Train { clone: Keep::OneStep, ..Train::default() });
    assert_no_suspects(&analyze_snapshot(&p.t.finish()));
}

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
    assert!(s.site.is_none());
    assert!(matches!(s.facts, Evidence::Fragmentation { largest_free_block, .. } if largest_free_block == 16 * MIB), "largest free block in the facts:{}", describe(&a));
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
    assert!(matches!(s.facts, Evidence::Oom { requested, .. } if requested == big), "requested size in the facts:{}", describe(&a));
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
