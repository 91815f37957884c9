//! reference_leak: tensors no graph holds, kept step after step (src/detectors/reference_leak.rs).
//! Synthetic traces of the script in `common/scenario.rs`: positives and near misses.

use crate::common;
use crate::common::program::{LINEAR, MODULE};
use crate::common::GRANULE;

use common::prelude::*;

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
    // All six steps' copies are kept, and all are user code at line 22 (outside the model
    // calls), whether or not a step's training unit holds them.
    assert_eq!(s.bytes, 6 * steps.logits_bytes, "{}", describe(&a));
    for k in [SuspectKind::RetainedGraph, SuspectKind::NoGradMissing, SuspectKind::UnreleasedGradient] {
        assert_none_of(&a, k);
    }
}

/// A forward hook on `fc2` that stores `out.clone()` (t09): the copy is made by the hook's own
/// line, which the module machinery ran; that line, not the model's, is the site.
#[test]
fn reference_leak_forward_hook_clone_named_at_the_hook() {
    let mut p = Program::new(2);
    let hook = chain(&[
        &[HOOK, (common::program::MODULE, 1846, "inner"), CALL, WRAP, (MODEL, 24, "forward"), CALL, WRAP],
        &[(MODEL, 42, "forward"), CALL, WRAP, top(16)],
    ]);
    let mut copies = 0;
    for _ in 0..6 {
        let x = p.batch(&[top(15)]);
        let pass = p.forward(&[top(16)], Grad::Enabled, false);
        p.t.alloc(p.act, &hook);
        copies += p.act;
        let loss = p.loss(&[top(17)]);
        p.backward(&[top(18)], &[&pass], false);
        p.step(&[top(19)]);
        p.zero_grad(&[top(20)], ZeroGrad::SetToNone);
        p.t.free(x, &[top(23)]);
        p.t.free(pass.logits, &[top(23)]);
        p.t.free(loss, &[top(23)]);
    }
    let a = analyze_snapshot(&p.t.finish());
    let s = the_one(&a, SuspectKind::ReferenceLeak);
    assert_site(&s, TRAIN, 12, &a);
    assert_eq!(s.bytes, copies, "{}", describe(&a));
}

/// A parameter made and handed to the optimizer (`add_param_group`) every step (t06): the step
/// at line 19 makes Adam state (two moments) for a parameter it has not seen, every iteration,
/// and keeps it. Optimizer state made once (every other test here) is not growth.
#[test]
fn reference_leak_optimizer_state_made_every_step() {
    let mut p = Program::new(2);
    let adam = common::program::ADAM;
    let init = |line: u32| {
        chain(&[
            &[(adam, line, "_init_group"), (adam, 238, "step")],
            &[(common::program::OPTIMIZER, 81, "_use_grad"), (common::program::OPTIMIZER, 533, "wrapper"), top(19)],
        ])
    };
    let size = 2 * MIB;
    for _ in 0..6 {
        step_with(&mut p, ZeroGrad::SetToNone, |p| {
            p.step(&[top(19)]);
            for line in [178, 182] {
                p.t.alloc(size, &init(line));
            }
        });
    }
    let a = analyze_snapshot(&p.t.finish());
    let s = the_one(&a, SuspectKind::ReferenceLeak);
    assert_site(&s, TRAIN, 19, &a);
    assert_eq!(s.growth_bytes_per_iteration, Some(2 * size), "{}", describe(&a));
    assert!(
        matches!(s.facts, Evidence::ReferenceLeak { origin: memsnap_analysis::LeakOrigin::OptimizerState, .. }),
        "{}",
        describe(&a)
    );
}

/// Near miss: SGD with momentum while layers are unfrozen one group at a time (gradual
/// unfreezing): from iteration 4 and from iteration 8 one more group has gradients, so the step
/// makes a momentum buffer for it and keeps it, in iterations 0, 4 and 8 of 12, and allocates
/// nothing in the others (SGD's update is in place). The buffers have the same size each time
/// (identical groups), but each is made while more gradients are alive than the time before: new
/// parameters meeting the optimizer, not the same ones met again (see the restarts below).
#[test]
fn reference_leak_near_miss_optimizer_state_for_unfrozen_layers() {
    let mut p = Program::new(2);
    let mut unfrozen = 0;
    for it in 0..12 {
        if it > 0 && it % 4 == 0 {
            unfrozen += 1;
        }
        let mut group_grads = Vec::new();
        step_with(&mut p, ZeroGrad::SetToNone, |p| {
            // The unfrozen groups' gradients, made by the same backward (no frames).
            group_grads.extend((0..unfrozen).map(|_| p.t.alloc(2 * MIB, &[])));
            if it % 4 == 0 {
                p.t.alloc(2 * MIB, &sgd_momentum());
            }
        });
        for g in group_grads {
            p.t.free(g, &[top(20)]);
        }
    }
    let a = analyze_snapshot(&p.t.finish());
    assert_none_of(&a, SuspectKind::ReferenceLeak);
}

/// Momentum buffer made by SGD's step at `train.py:19`.
fn sgd_momentum() -> Vec<Fr> {
    const SGD: &str = "/usr/lib/python3.11/site-packages/torch/optim/sgd.py";
    chain(&[
        &[(SGD, 400, "_multi_tensor_sgd"), (SGD, 310, "sgd"), (SGD, 130, "step")],
        &[(common::program::OPTIMIZER, 81, "_use_grad"), (common::program::OPTIMIZER, 533, "wrapper"), top(19)],
    ])
}

/// Warm restarts by a new optimizer every 4 iterations, each also kept in a list (q06): the step
/// at line 19 makes the same state again (two 2 MiB buffers) for the same gradients in
/// iterations 0, 4 and 8 of 12, and none of it is freed. When the old optimizer is dropped instead
/// (`drop_old`), its state is freed when the next one is made: bounded (q15).
fn restarts(drop_old: bool) -> memsnap_analysis::Analysis {
    let mut p = Program::new(2);
    let mut state = Vec::new();
    for it in 0..12 {
        step_with(&mut p, ZeroGrad::SetToNone, |p| {
            if it % 4 == 0 {
                if drop_old {
                    for b in state.drain(..) {
                        p.t.free(b, &[top(14)]);
                    }
                }
                state.push(p.t.alloc(2 * MIB, &sgd_momentum()));
                state.push(p.t.alloc(2 * MIB, &sgd_momentum()));
            }
        });
    }
    analyze_snapshot(&p.t.finish())
}

#[test]
fn reference_leak_optimizer_state_made_again_by_kept_restarted_optimizers() {
    let a = restarts(false);
    let s = the_one(&a, SuspectKind::ReferenceLeak);
    assert_site(&s, TRAIN, 19, &a);
    assert!(
        matches!(
            s.facts,
            Evidence::ReferenceLeak {
                origin: memsnap_analysis::LeakOrigin::OptimizerStateRemade,
                blocks: 6,
                occurrences: 3,
                ..
            }
        ),
        "{}",
        describe(&a)
    );
}

#[test]
fn reference_leak_near_miss_restarted_optimizer_dropped() {
    assert_none_of(&restarts(true), SuspectKind::ReferenceLeak);
}

/// A `step` the user wrote (an `Optimizer` subclass, run by `Optimizer`'s step wrapper from line
/// 19): its line 33 makes a momentum buffer per parameter at the first step (state), and, when
/// `keep_updates`, line 35 makes each step's update and keeps it in a history (k04). 12
/// iterations, two parameters.
fn custom_optimizer(keep_updates: bool) -> memsnap_analysis::Analysis {
    let own = |line: u32| {
        chain(&[
            &[(TRAIN, line, "step")],
            &[(common::program::OPTIMIZER, 81, "_use_grad"), (common::program::OPTIMIZER, 533, "wrapper"), top(19)],
        ])
    };
    let mut p = Program::new(2);
    for it in 0..12 {
        step_with(&mut p, ZeroGrad::SetToNone, |p| {
            for _ in 0..2 {
                if it == 0 {
                    p.t.alloc(2 * MIB, &own(33));
                }
                let update = p.t.alloc(2 * MIB, &own(35));
                if !keep_updates {
                    p.t.free(update, &own(36));
                }
            }
        });
    }
    analyze_snapshot(&p.t.finish())
}

/// The user's own optimizer keeping every step's update: made for the same parameters each
/// iteration (no more gradients alive), so not state for new parameters (`OptimizerState`, whose
/// advice is about `add_param_group`) but something its step keeps.
#[test]
fn reference_leak_own_optimizer_keeps_an_update_per_step() {
    let a = custom_optimizer(true);
    let s = the_one(&a, SuspectKind::ReferenceLeak);
    assert_site(&s, TRAIN, 35, &a);
    assert!(
        matches!(
            s.facts,
            Evidence::ReferenceLeak {
                origin: memsnap_analysis::LeakOrigin::OptimizerKeepsPerStep,
                occurrences: 12,
                ..
            }
        ),
        "{}",
        describe(&a)
    );
    assert_eq!(s.growth_bytes_per_iteration, Some(4 * MIB), "{}", describe(&a));
}

/// Near miss: the same optimizer without the history: its buffers are made once (k05).
#[test]
fn reference_leak_near_miss_own_optimizer_state_made_once() {
    assert_none_of(&custom_optimizer(false), SuspectKind::ReferenceLeak);
}

/// `torch.optim`'s SGD making its momentum buffers in every iteration for the same gradients: a
/// new optimizer each iteration, the old ones kept. The same parameters are met again, so the
/// words are those of re-made state, not of new parameters.
#[test]
fn reference_leak_new_optimizer_every_iteration_is_state_made_again() {
    let mut p = Program::new(2);
    for _ in 0..12 {
        step_with(&mut p, ZeroGrad::SetToNone, |p| {
            p.t.alloc(2 * MIB, &sgd_momentum());
            p.t.alloc(2 * MIB, &sgd_momentum());
        });
    }
    let a = analyze_snapshot(&p.t.finish());
    let s = the_one(&a, SuspectKind::ReferenceLeak);
    assert_site(&s, TRAIN, 19, &a);
    assert!(
        matches!(s.facts, Evidence::ReferenceLeak { origin: memsnap_analysis::LeakOrigin::OptimizerStateRemade, .. }),
        "{}",
        describe(&a)
    );
}

/// Near miss: `last = logits.detach().clone()`: the previous copy dies when it is replaced.
#[test]
fn reference_leak_near_miss_user_line_tensor_replaced_next_step() {
    let mut p = Program::new(2);
    train(&mut p, Train { clone: Keep::OneStep, ..Train::default() });
    assert_no_suspects(&analyze_snapshot(&p.t.finish()));
}

/// A leak that starts after a warm-up: the copy at line 22 is made every step but kept only
/// from step 10 of 16 on, a minority of the steps; none of the kept copies is ever let go, and
/// they go on to the end. Growth is measured from the first kept step.
#[test]
fn reference_leak_kept_only_after_a_warm_up() {
    let mut p = Program::new(2);
    let steps = train(&mut p, Train { steps: 16, clone: Keep::From(10), ..Train::default() });
    let a = analyze_snapshot(&p.t.finish());
    let s = the_one(&a, SuspectKind::ReferenceLeak);
    assert_site(&s, TRAIN, 22, &a);
    assert_eq!(s.bytes, 6 * steps.logits_bytes, "{}", describe(&a));
    assert_eq!(s.growth_bytes_per_iteration, Some(steps.logits_bytes), "{}", describe(&a));
}

/// A mixture of experts whose layer appends its expert's output to a module-level list (n35):
/// the output is made inside the module call, and its size differs every step (the tokens
/// routed to the expert vary), so no (stack, size) pair recurs. Lazily made state comes in the
/// iteration where its line first allocates; these come in every later one too, and every one
/// is counted (before, each was taken for a one-off and the suspect was lost).
#[test]
fn reference_leak_expert_outputs_of_a_new_size_every_step() {
    let mut p = Program::new(2);
    let expert = chain(&[
        &[(LINEAR, 125, "forward"), CALL, WRAP, (MODEL, 30, "forward"), CALL, WRAP, (MODEL, 42, "forward")],
        &[CALL, WRAP, top(16)],
    ]);
    let mut kept = 0;
    for step in 0..8u64 {
        let x = p.batch(&[top(15)]);
        let pass = p.forward(&[top(16)], Grad::Enabled, false);
        // Still inside the model call: the expert's output, kept by the layer's list.
        p.t.alloc((1 + step) * GRANULE, &expert);
        kept += (1 + step) * GRANULE;
        let loss = p.loss(&[top(17)]);
        p.backward(&[top(18)], &[&pass], false);
        p.step(&[top(19)]);
        p.zero_grad(&[top(20)], ZeroGrad::SetToNone);
        for b in [x, pass.logits, loss] {
            p.t.free(b, &[top(23)]);
        }
    }
    let a = analyze_snapshot(&p.t.finish());
    let s = the_one(&a, SuspectKind::ReferenceLeak);
    // Step 0's output is the only block of its line in the iteration where that line first
    // allocated: it reads as lazily made state and is left out.
    assert_eq!(s.bytes, kept - GRANULE, "{}", describe(&a));
}

/// A slow leak: a copy kept every third step (6 of 16 steps), never let go.
#[test]
fn reference_leak_kept_every_third_step() {
    let mut p = Program::new(2);
    let steps = train(&mut p, Train { steps: 16, clone: Keep::Every(3), ..Train::default() });
    let a = analyze_snapshot(&p.t.finish());
    let s = the_one(&a, SuspectKind::ReferenceLeak);
    assert_site(&s, TRAIN, 22, &a);
    assert_eq!(s.bytes, 6 * steps.logits_bytes, "{}", describe(&a));
}

/// Near miss: the copies of the first 4 steps are kept as a fixed sample, and then none: the
/// set stopped growing 12 steps before the end. The last step's copy is alive at the dump too
/// (the loop's variable), as in every real loop (p09).
#[test]
fn reference_leak_near_miss_first_steps_kept_as_a_fixed_sample() {
    let mut p = Program::new(2);
    train(&mut p, Train { steps: 16, clone: Keep::FirstN(4), ..Train::default() });
    assert_no_suspects(&analyze_snapshot(&p.t.finish()));
}

/// Near miss: a cache of the last 4 copies. At the dump the last 4 steps' copies are alive, as
/// after a late-starting leak, but the cache let the older ones go 4 steps after they were made:
/// bounded by its policy.
#[test]
fn reference_leak_near_miss_bounded_cache_evicts() {
    let mut p = Program::new(2);
    train(&mut p, Train { steps: 16, clone: Keep::Lru(4), ..Train::default() });
    assert_no_suspects(&analyze_snapshot(&p.t.finish()));
}

/// A model whose `forward` is wrapped by the user's decorator (the frame inside the module call
/// is `wrapper`, not `forward`) and makes its output in that frame itself (a head tied to the
/// embedding: `F.linear(h, self.wte.weight)`). `_call_impl` calls it from the line it calls every
/// other module's `forward` from, so it is the model's forward, not a hook: the kept output is
/// named where the model is called, as for an undecorated model.
#[test]
fn reference_leak_decorated_forward_output_named_at_the_call() {
    let mut p = Program::new(2);
    let mut kept = Vec::new();
    for _ in 0..6 {
        let x = p.batch(&[top(15)]);
        let pass = p.forward(&[top(16)], Grad::NoGrad, false);
        let head =
            chain(&[&[(common::program::FUNCTIONAL, 2380, "linear"), (MODEL, 44, "wrapper"), CALL, WRAP, top(16)]]);
        kept.push(p.t.alloc(2 * p.act, &head));
        p.t.free(pass.logits, &[top(23)]);
        p.t.free(x, &[top(23)]);
    }
    let a = analyze_snapshot(&p.t.finish());
    let s = the_one(&a, SuspectKind::ReferenceLeak);
    assert_site(&s, TRAIN, 16, &a);
}

/// An inference service whose loop makes each request's input at line 25 and runs the model
/// (line 23, without grad) only when the request's prompt is not cached yet, keeping the output
/// in the cache: `prompts` distinct prompts over `requests` requests. With 5 prompts over 24
/// requests the model runs in the first 5 and never again while the loop goes on (q26): bounded
/// by the keys. With a new prompt every request the model runs, and the cache grows, to the end.
fn prompt_cache(prompts: usize, requests: usize) -> memsnap_analysis::Analysis {
    let mut p = Program::new(2);
    for req in 0..requests {
        let q = p.t.alloc(2 * MIB, &[top(25)]);
        if req < prompts {
            p.forward(&[top(23)], Grad::NoGrad, false);
        }
        p.t.free(q, &[top(26)]);
    }
    analyze_snapshot(&p.t.finish())
}

#[test]
fn reference_leak_cache_of_every_prompt_grows_to_the_end() {
    let a = prompt_cache(24, 24);
    let s = the_one(&a, SuspectKind::ReferenceLeak);
    assert_site(&s, TRAIN, 23, &a);
}

#[test]
fn reference_leak_near_miss_cache_full_while_the_loop_goes_on() {
    assert_none_of(&prompt_cache(5, 24), SuspectKind::ReferenceLeak);
}

/// Near miss: a dataset that caches each sample on the GPU at its first read (line 30, user code)
/// fills during the first epoch, 4 of 12 iterations, and only hits afterwards while training goes
/// on (q36): bounded by the dataset, though every block the line made is kept.
#[test]
fn reference_leak_near_miss_dataset_cached_on_first_read() {
    let mut p = Program::new(2);
    for it in 0..12 {
        if it < 4 {
            p.t.alloc(2 * MIB, &[top(30)]);
        }
        step_with(&mut p, ZeroGrad::SetToNone, |_| {});
    }
    assert_none_of(&analyze_snapshot(&p.t.finish()), SuspectKind::ReferenceLeak);
}

/// L-BFGS's history (q54): every step at line 19 keeps a new pair of flat vectors the size of
/// all parameters (`old_dirs`, `old_stps`), up to `history_size` pairs. It grows every iteration,
/// by design, and is bounded: said as `waste` with its own origin, never as a leak, whose
/// words would send the user after `add_param_group`.
#[test]
fn reference_leak_lbfgs_history_is_bounded_waste() {
    const LBFGS: &str = "/usr/lib/python3.11/site-packages/torch/optim/lbfgs.py";
    let mut p = Program::new(2);
    let history = chain(&[
        &[(LBFGS, 390, "step")],
        &[(common::program::OPTIMIZER, 81, "_use_grad"), (common::program::OPTIMIZER, 533, "wrapper"), top(19)],
    ]);
    for _ in 0..8 {
        step_with(&mut p, ZeroGrad::SetToNone, |p| {
            for _ in 0..2 {
                p.t.alloc(2 * MIB, &history);
            }
        });
    }
    let a = analyze_snapshot(&p.t.finish());
    let s = the_one(&a, SuspectKind::ReferenceLeak);
    assert_site(&s, TRAIN, 19, &a);
    assert_eq!(s.severity, memsnap_analysis::Severity::Waste, "{}", describe(&a));
    assert!(
        matches!(s.facts, Evidence::ReferenceLeak { origin: memsnap_analysis::LeakOrigin::OptimizerHistory, .. }),
        "{}",
        describe(&a)
    );
}

/// A sweep: every round builds a model at `train.py:50` (`Net().cuda()`: construction frames),
/// trains 5 steps and either keeps it in a list of results (`keep`) or lets the next round's
/// build rebind it. Returns the bytes of one model.
fn sweep(p: &mut Program, rounds: usize, keep: bool) -> u64 {
    let build = [(MODULE, 1155, "<lambda>"), (MODULE, 942, "_apply"), (MODULE, 1155, "cuda"), top(50)];
    let sizes = [GRANULE, 2 * GRANULE, 2 * GRANULE];
    let mut previous: Vec<Blk> = Vec::new();
    for _ in 0..rounds {
        let model: Vec<Blk> = sizes.iter().map(|&s| p.t.alloc(s, &build)).collect();
        if !keep {
            for b in previous.drain(..) {
                p.t.free(b, &build);
            }
        }
        previous = model;
        train(p, Train { steps: 5, ..Train::default() });
    }
    sizes.iter().sum()
}

/// Models built round after round and all kept (fixtures/extra11/n07): the parameters of every
/// round, at the build line, origin `models_kept`. The rounds come every 5 iterations and the
/// trace ends 4 iterations after the last build: no longer than the line's own pause, so not a
/// fill that stopped.
#[test]
fn reference_leak_models_built_each_round_and_kept() {
    let mut p = Program::new(2);
    let model = sweep(&mut p, 4, true);
    let a = analyze_snapshot(&p.t.finish());
    let s = the_one(&a, SuspectKind::ReferenceLeak);
    assert_site(&s, TRAIN, 50, &a);
    assert_eq!(s.bytes, 4 * model, "{}", describe(&a));
    assert!(
        matches!(s.facts, Evidence::ReferenceLeak { origin: memsnap_analysis::LeakOrigin::ModelsKept, .. }),
        "{}",
        describe(&a)
    );
}

/// Near miss: each round's model is let go when the next one is built (n08): one alive at a time.
#[test]
fn reference_leak_near_miss_models_rebuilt_and_rebound() {
    let mut p = Program::new(2);
    sweep(&mut p, 4, false);
    assert_none_of(&analyze_snapshot(&p.t.finish()), SuspectKind::ReferenceLeak);
}

// ------------------------------------------------------------------------------------------
// Read from the dump, with a trace whose events carry no stacks (`context="state"`)

/// What `_record_memory_history(context="state")` holds of `p`'s run: the trace without a stack
/// on any event, the optimizer's steps annotated as PyTorch annotates them.
fn recorded_with_state_context(p: Program) -> Snapshot {
    without_event_stacks(with_step_annotations(p.t.finish()))
}

/// A copy kept every step for 6 steps: 6 blocks from one line at the dump, fewer than a dump
/// alone needs to suspect a line (`state_min_same_site_blocks`, 8), but the trace says they were
/// made in 6 different iterations, one in each: growth.
#[test]
fn state_context_copy_kept_every_step_is_growth_though_few() {
    let mut p = Program::new(2);
    let steps = train(&mut p, Train { steps: 6, clone: Keep::Forever, ..Train::default() });
    let a = analyze_snapshot(&recorded_with_state_context(p));
    let s = the_one(&a, SuspectKind::ReferenceLeak);
    assert_site(&s, TRAIN, 22, &a);
    assert_eq!(s.bytes, 6 * steps.logits_bytes, "{}", describe(&a));
}

/// Near miss: a mask cached per sequence length (`masks[T] = ...`, line 33), made only when a
/// new length comes: 5 lengths over 16 steps, in steps 0, 1, 2, 9 and 13, each of its own size.
/// Made in 5 iterations, but in fewer than half of those from the first on: a cache keyed by
/// shape that fills ever more slowly (p11), not growth, and 5 blocks are too few for a dump
/// alone to suspect their line.
#[test]
fn state_context_near_miss_cache_keyed_by_shape() {
    let mut p = Program::new(2);
    let new_length_at = [(0, 6), (1, 7), (2, 9), (9, 11), (13, 13)];
    for step in 0..16 {
        if let Some(&(_, granules)) = new_length_at.iter().find(|(at, _)| *at == step) {
            p.t.alloc(granules * GRANULE, &[(TRAIN, 33, "<module>")]);
        }
        step_with(&mut p, ZeroGrad::SetToNone, |p| p.step(&[top(19)]));
    }
    assert_no_suspects(&analyze_snapshot(&recorded_with_state_context(p)));
}

/// A hook keeps one `fc2` output per block and step, and the model's first call made a 32 MiB
/// workspace inside it that stays (cuBLAS's, made by a stream's first matmul): both are blocks
/// of the model call's line at the dump. The workspace's code path made one block, in the first
/// iteration: state made once, not part of what grows, so the suspect's bytes are the outputs'
/// alone (z25, n29: a first call's 33 MiB counted in).
#[test]
fn state_context_state_made_on_a_first_call_is_not_counted_in_growth() {
    let mut p = Program::new(2);
    let cublas =
        chain(&[&[(LINEAR, 125, "forward"), CALL, WRAP, (MODEL, 22, "forward"), CALL, WRAP], &[CALL, WRAP, top(16)]]);
    p.t.alloc(32 * MIB, &cublas);
    let steps = train(&mut p, Train { steps: 6, hook: Keep::Forever, ..Train::default() });
    let a = analyze_snapshot(&recorded_with_state_context(p));
    let s = the_one(&a, SuspectKind::ReferenceLeak);
    assert_site(&s, TRAIN, 16, &a);
    assert_eq!(s.bytes, 6 * steps.fc2_bytes, "{}", describe(&a));
}

/// Bytes of one cached feature: a size no other block of the program has.
const FEATURE: u64 = 5 * GRANULE;

/// `cache[key] = feature` for 3 new keys a step (line 30), the least recently used entry evicted
/// past `capacity` after each insertion; `steps` training steps.
fn feature_cache(steps: usize, capacity: usize) -> Program {
    let mut p = Program::new(2);
    let mut cache = std::collections::VecDeque::new();
    for _ in 0..steps {
        for _ in 0..3 {
            cache.push_back(p.t.alloc(FEATURE, &[(TRAIN, 30, "<module>")]));
            if cache.len() > capacity {
                let oldest = cache.pop_front().unwrap();
                p.t.free(oldest, &[(TRAIN, 31, "<module>")]);
            }
        }
        step_with(&mut p, ZeroGrad::SetToNone, |p| p.step(&[top(19)]));
    }
    p
}

/// A cache that fills during the first half of the trace (3 entries a step, 18 at most: full at
/// the sixth of ten steps) and
/// then keeps its size, replacing entries: at the dump 18 blocks from one line, more than in any
/// iteration of the first half, but exactly 18 at the low point of each iteration of the second:
/// it stopped growing (l06: an LRU of spectrograms), a working set said in a caveat.
#[test]
fn state_context_cache_full_by_mid_trace_is_a_working_set() {
    let a = analyze_snapshot(&recorded_with_state_context(feature_cache(10, 18)));
    assert_no_suspects(&a);
    let caveats = &a.devices[0].caveats;
    assert!(caveats.iter().any(|c| c.contains("stopped growing during the trace")), "{caveats:?}");
}

/// Near miss: the same cache with room for every entry: it grows by 3 blocks every step to the
/// end, a leak.
#[test]
fn state_context_near_miss_cache_that_never_fills_grows() {
    let a = analyze_snapshot(&recorded_with_state_context(feature_cache(10, 100)));
    let s = the_one(&a, SuspectKind::ReferenceLeak);
    assert_site(&s, TRAIN, 30, &a);
    assert_eq!(s.bytes, 30 * FEATURE, "{}", describe(&a));
}

/// `cache[key] = feature` for 3 new keys a step (line 30), features of varying sizes (4 to 32
/// granules, drawn by a fixed generator), the least recently used entries evicted while the
/// cache holds more than `budget` bytes; `steps` training steps. With the bytes held at the end.
fn feature_cache_by_bytes(steps: usize, budget: u64) -> (Program, u64) {
    let mut p = Program::new(2);
    let mut cache = std::collections::VecDeque::new();
    let (mut held, mut draw) = (0u64, 7u64);
    for _ in 0..steps {
        for _ in 0..3 {
            draw = (draw * 1_103_515_245 + 12_345) % (1 << 31);
            let size = (4 + (draw >> 16) % 29) * GRANULE;
            cache.push_back((p.t.alloc(size, &[(TRAIN, 30, "<module>")]), size));
            held += size;
            while held > budget && cache.len() > 1 {
                let (oldest, size) = cache.pop_front().unwrap();
                p.t.free(oldest, &[(TRAIN, 31, "<module>")]);
                held -= size;
            }
        }
        step_with(&mut p, ZeroGrad::SetToNone, |p| p.step(&[top(19)]));
    }
    (p, held)
}

/// A cache bounded by bytes whose entries vary in size (s01: encoder states of varying lengths
/// in an LRU under a byte budget), full by the fourth of twelve steps: the dump's entries have
/// sizes that earlier entries did not, so no count by size stays level, but the bytes within
/// their range of sizes stop rising (`WorkingSet::Plateau`), a working set said in a caveat.
#[test]
fn state_context_cache_bounded_by_bytes_with_entries_of_varying_sizes_is_a_working_set() {
    let a = analyze_snapshot(&recorded_with_state_context(feature_cache_by_bytes(12, 160 * GRANULE).0));
    assert_no_suspects(&a);
    let caveats = &a.devices[0].caveats;
    assert!(caveats.iter().any(|c| c.contains("within their range of sizes stopped growing")), "{caveats:?}");
}

/// Near miss: the same cache with a budget it never reaches: the bytes within its range of
/// sizes rise every step, a leak.
#[test]
fn state_context_near_miss_cache_of_varying_sizes_that_never_fills_grows() {
    let (p, held) = feature_cache_by_bytes(12, u64::MAX);
    let a = analyze_snapshot(&recorded_with_state_context(p));
    let s = the_one(&a, SuspectKind::ReferenceLeak);
    assert_site(&s, TRAIN, 30, &a);
    assert_eq!(s.bytes, held, "{}", describe(&a));
}

/// One iteration of the scripted training step that also makes `kept` bytes at a user line
/// outside the model (the loss's insides, l.21) and returns that block; `step`: whether the
/// optimizer steps (with gradient accumulation it steps once every few backwards).
fn step_keeping(p: &mut Program, kept: u64, step: bool) -> Blk {
    let x = p.batch(&[top(15)]);
    let pass = p.forward(&[top(16)], Grad::Enabled, false);
    let inside = p.t.alloc(kept, &[top(21)]);
    let loss = p.loss(&[top(17)]);
    p.backward(&[top(18)], &[&pass], false);
    if step {
        p.step(&[top(19)]);
        p.zero_grad(&[top(20)], ZeroGrad::SetToNone);
    }
    p.t.free(x, &[top(23)]);
    p.t.free(pass.logits, &[top(23)]);
    p.t.free(loss, &[top(23)]);
    inside
}

/// An accumulator reset at each epoch's end (am05: `total_loss += loss` keeps, through the
/// accumulated graph, what a hand-written loss put on `ctx`): 8 steps keep one block each, all
/// let go at once, then 5 more are kept. A reset lets go of everything kept before it, a cache
/// of its oldest only: the steps since the reset are read for growth, the reset said.
#[test]
fn reference_leak_accumulator_reset_each_epoch() {
    let mut p = Program::new(2);
    let kept = 8 * GRANULE;
    let mut epoch = Vec::new();
    for _ in 0..8 {
        epoch.push(step_keeping(&mut p, kept, true));
    }
    for b in epoch.drain(..) {
        p.t.free(b, &[top(24)]);
    }
    for _ in 0..5 {
        epoch.push(step_keeping(&mut p, kept, true));
    }
    let a = analyze_snapshot(&p.t.finish());
    let s = the_one(&a, SuspectKind::ReferenceLeak);
    assert_site(&s, TRAIN, 21, &a);
    match &s.facts {
        Evidence::ReferenceLeak { cleared: Some(c), .. } => {
            assert_eq!((c.clears, c.longest_period), (1, 8), "{}", describe(&a))
        }
        other => panic!("no reset said: {other:?}\n{}", describe(&a)),
    }
}

/// Near miss: gradient accumulation over 6 backwards per optimizer step, what each micro-batch
/// made outside the model kept until the step, then let go: the step's working set. The same
/// resets as above, but each over one optimizer step, not three.
#[test]
fn reference_leak_near_miss_micro_batches_kept_until_the_step() {
    let mut p = Program::new(2);
    let kept = 8 * GRANULE;
    let mut window = Vec::new();
    for _ in 0..3 {
        for micro in 0..6 {
            window.push(step_keeping(&mut p, kept, micro == 5));
        }
        for b in window.drain(..) {
            p.t.free(b, &[top(24)]);
        }
    }
    // The dump lands after 4 micro-batches of the next step.
    for _ in 0..4 {
        window.push(step_keeping(&mut p, kept, false));
    }
    let a = analyze_snapshot(&p.t.finish());
    assert_none_of(&a, SuspectKind::ReferenceLeak);
}
