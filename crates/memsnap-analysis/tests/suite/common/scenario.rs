//! The training script that the detector tests (`tests/detector_*.rs`) run, built with
//! [`super::program`]:
//!
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

#![allow(dead_code)]

use super::program::{chain, top, Grad, Pass, Program, ZeroGrad, CALL, MODEL, TRAIN, WRAP};
use super::{Blk, Fr, GRANULE};
use memsnap_analysis::{analyze, Analysis, Suspect, SuspectKind};
use memsnap_model::Snapshot;

// ------------------------------------------------------------------------------------------
// Helpers

/// Tensors of `freed` bytes allocated at line 10 (each in a segment of its own when it does not
/// fit in what is free), all freed at line 11, then one of `then` bytes at line 12: whether the
/// allocator can serve the last from its cache or must make a segment beside it
/// (`tests/allocator_cache.rs`).
pub fn freed_then(freed: &[u64], then: u64) -> Snapshot {
    let mut t = super::TraceBuilder::new();
    let blocks: Vec<Blk> = freed.iter().map(|&bytes| t.alloc(bytes, &[top(10)])).collect();
    for b in blocks {
        t.free(b, &[top(11)]);
    }
    t.alloc(then, &[top(12)]);
    t.finish()
}

/// Replay (asserting the replay reproduces the builder's final segment table) and analyse.
pub fn analyze_snapshot(snap: &Snapshot) -> Analysis {
    let replay = memsnap_replay::replay(snap);
    for d in &replay.devices {
        assert!(d.check.matches_snapshot, "replay self-check failed: {:?}", d.check.mismatches);
        assert_eq!(d.diagnostic_count, 0, "replay diagnostics: {:?}", d.diagnostics);
    }
    analyze(snap, &replay)
}

pub fn describe(a: &Analysis) -> String {
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

pub fn of_kind(a: &Analysis, kind: SuspectKind) -> Vec<&Suspect> {
    a.suspects().into_iter().filter(|s| s.kind == kind).collect()
}

/// The one suspect of `kind`, failing with the whole list otherwise.
pub fn the_one(a: &Analysis, kind: SuspectKind) -> Suspect {
    let v = of_kind(a, kind);
    assert_eq!(v.len(), 1, "expected one {} suspect, got:{}", kind.name(), describe(a));
    v[0].clone()
}

pub fn assert_site(s: &Suspect, file: &str, line: u32, a: &Analysis) {
    let site = s.site.as_ref().unwrap_or_else(|| panic!("{} has no site:{}", s.kind.name(), describe(a)));
    assert_eq!((site.filename.as_str(), site.line), (file, line), "site of {}:{}", s.kind.name(), describe(a));
}

pub fn assert_no_suspects(a: &Analysis) {
    assert!(a.suspects().is_empty(), "a clean trace has no suspects, got:{}", describe(a));
}

pub fn assert_none_of(a: &Analysis, kind: SuspectKind) {
    assert!(of_kind(a, kind).is_empty(), "no {} expected, got:{}", kind.name(), describe(a));
}

// ------------------------------------------------------------------------------------------
// The training loop

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Keep {
    /// Not kept: freed in the same step.
    No,
    /// Kept for one step: freed when the next step replaces it.
    OneStep,
    /// Kept for good (appended to a list).
    Forever,
    /// Kept for good from this step on (a leak that starts after a warm-up); before it, freed
    /// in the same step.
    From(usize),
    /// Kept for good every n-th step (`if step % n == 0: samples.append(...)`); otherwise freed
    /// in the same step.
    Every(usize),
    /// Kept for good in the first n steps only (a fixed sample); afterwards freed in the same step.
    /// With `From`, `Every` and `FirstN` the last step's copy is never freed: at the dump the
    /// loop's variable still holds it.
    FirstN(usize),
    /// Kept in a bounded cache of n entries: the oldest is let go when a new one comes.
    Lru(usize),
}

#[derive(Clone, Copy, Debug)]
pub struct Train {
    pub steps: usize,
    pub retain_graph: bool,
    /// `history.append(loss)` (the tensor) instead of `loss.item()`.
    pub keep_loss: bool,
    pub zero: ZeroGrad,
    /// What a forward hook on `fc2` does with the output.
    pub hook: Keep,
    /// `snaps.append(logits.detach().clone())` (Forever) vs `last = ...` (OneStep).
    pub clone: Keep,
    /// `zero_grad` at the start of the step (before the forward pass) instead of after `step()`.
    pub zero_at_start: bool,
    /// A second model call per step (`aux(x)`, line 26) whose output feeds the same loss.
    pub two_calls: bool,
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
pub struct Steps {
    /// Bytes of the saved tensors of one forward pass.
    pub saved_bytes: u64,
    /// Bytes of the fc2 outputs of one pass (what the hook sees).
    pub fc2_bytes: u64,
    pub logits_bytes: u64,
}

pub const HOOK: Fr = (TRAIN, 12, "hook");

/// One plain training iteration of `train.py`: the batch (line 15), the model call (16), the
/// loss (17) and `.backward()` (18), then `after_backward` (the optimizer's step, or what a test
/// adds there), `zero_grad` (20) with `zero`, and the batch, logits and loss let go (23).
pub fn step_with(p: &mut Program, zero: ZeroGrad, after_backward: impl FnOnce(&mut Program)) {
    let x = p.batch(&[top(15)]);
    let pass = p.forward(&[top(16)], Grad::Enabled, false);
    let loss = p.loss(&[top(17)]);
    p.backward(&[top(18)], &[&pass], false);
    after_backward(p);
    p.zero_grad(&[top(20)], zero);
    p.t.free(x, &[top(23)]);
    p.t.free(pass.logits, &[top(23)]);
    p.t.free(loss, &[top(23)]);
}

pub fn train(p: &mut Program, o: Train) -> Steps {
    let mut out = Steps::default();
    let mut hooked: Vec<Blk> = Vec::new();
    let mut last_clone: Option<Blk> = None;
    let mut cache: std::collections::VecDeque<Blk> = Default::default();
    for step in 0..o.steps {
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
            let kept = match o.clone {
                Keep::From(k) => step >= k,
                Keep::Every(n) => step % n == 0,
                Keep::FirstN(n) => step < n,
                _ => true,
            };
            match o.clone {
                // The last step's copy is still held by the loop's variable at the dump.
                _ if !kept && step + 1 < o.steps => p.t.free(c, &[top(22)]),
                _ if !kept => {}
                Keep::OneStep => {
                    if let Some(prev) = last_clone.replace(c) {
                        p.t.free(prev, &[top(22)]);
                    }
                }
                Keep::Lru(n) => {
                    cache.push_back(c);
                    if cache.len() > n {
                        let oldest = cache.pop_front().unwrap();
                        p.t.free(oldest, &[top(22)]);
                    }
                }
                _ => {}
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
pub fn validate(p: &mut Program, passes: usize, grad: Grad, keep_logits: bool) -> u64 {
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

/// Evaluation passes of a detector-like model after training: per layer, one tensor autograd
/// saves (from `saving_lines` distinct lines over 20 layers) and four temporaries of code it
/// saves nothing for (anchors, box decoding, NMS), freed within the pass; each pass's detections
/// are kept in a list, so what survived it stays. 20 of its 100 blocks survive a pass: under the
/// 30% share.
pub fn detector_evaluation(p: &mut Program, saving_lines: u32) {
    let user = [(TRAIN, 30, "validate"), top(40)];
    let model = |line: u32| chain(&[&[(MODEL, line, "forward"), CALL, WRAP], &user]);
    for _ in 0..4 {
        p.batch(&[(TRAIN, 29, "validate"), top(40)]);
        for layer in 0..20 {
            // Kept for good: the list of detections holds the graph.
            p.t.alloc(GRANULE, &model(100 + layer % saving_lines));
            for k in 0..4 {
                let tmp = p.t.alloc(GRANULE, &model(200 + k));
                p.t.free(tmp, &model(204));
            }
        }
    }
}
