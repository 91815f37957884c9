//! `unreleased_gradient`: parameter gradients held when nothing needs them.
//!
//! Mechanism. A backward allocates one gradient per parameter (the autograd engine, so without
//! Python frames under `stacks="python"`; memsnap attributes them to the `.backward()` line) of
//! the parameter's size. `zero_grad(set_to_none=True)` drops them; `optimizer.step()` reads them.
//! Three facts are reported:
//! - kept each step: gradients of step after step still allocated at the end (references to
//!   `p.grad` stored in a log, then `zero_grad` makes new ones), in half the iterations or in
//!   every one from a warm-up's end on (`kept_to_the_end_since`): severity `leak`.
//!   Gradients are told from a backward hook's tensor by coming several per step, of two or more
//!   parameter sizes. In a wrapped ring, sets that took the place of sets alive when it began
//!   are the `.grad`s of several models trained in turn, not growth
//!   (`replaced_sets_alive_at_start`).
//! - through evaluation: when an evaluation window starts after training, the last step's
//!   gradients are still allocated (`zero_grad` at the start of the step, or
//!   `set_to_none=False`): bounded, severity `waste`. Named at the line whose call finally frees
//!   them (the late `zero_grad`), read from the stacks of their free events, else at the
//!   `.backward()` line.
//!
//! - never cleared: the first backward of a line made gradients that no later one made again,
//!   while the later ones made the others again step after step: parameters that require grad
//!   but that no optimizer clears (a teacher run with grad, a backbone never frozen), their
//!   `.grad` made once and accumulated into, never read: bounded, severity `waste`, named at the
//!   `.backward()` line.
//!
//! Claims: kept gradient-like backward blocks; for the waste facts, the gradients alive at the
//! window start, or made once and never cleared. Near misses: gradients allocated once and
//! reused by every backward (`set_to_none=False`, or no `zero_grad`); gradients freed before the
//! evaluation starts; a window made only by checkpoint recomputation (that is backward); the
//! static gradients of a backward captured in a CUDA graph, which live in the graph's private
//! pool as long as the graph does, and a lone parameter-sized block a backward left beside the
//! gradients, such as the engine thread's cuBLAS workspace (aa02).

use std::collections::{BTreeMap, BTreeSet};

use memsnap_model::{BlockState, FrameId};
use rayon::prelude::*;

use super::{state_only, Context, Detector, Finding};
use crate::attribution::Attr;
use crate::evidence::{Evidence, GradientHold, Occurrence, Severity, SuspectKind};
use crate::lifecycle::UnitFate;

/// The fewest gradients made once that read as a model's parameters no optimizer clears. A
/// model's parameters come at least as a weight and a bias in each of two layers; what else a
/// backward makes once and never frees is one or two library workspaces (the autograd engine
/// thread's cuBLAS workspace, 32 MiB on an H100, made by its first matmul: g02).
const MIN_UNCLEARED_GRADIENTS: usize = 4;

/// Copies of a model's parameter set that its own state may hold, made before a trace began
/// (`sets_made_before_trace`): the parameters, two optimizer moments (Adam), the current
/// gradients and one more copy of the model (an EMA or a teacher).
const OWN_PARAMETER_SET_COPIES: usize = 5;

/// Gradient sets a level may differ by without a set kept or let go
/// (`replaced_sets_alive_at_start`): between `zero_grad` and the backward that makes them again,
/// one model of several trained in turn has none.
const SETS_IN_FLIGHT: usize = 1;

pub struct UnreleasedGradient;

impl Detector for UnreleasedGradient {
    fn kind(&self) -> SuspectKind {
        SuspectKind::UnreleasedGradient
    }

    fn detect(&self, cx: &Context) -> Vec<Finding> {
        // Read from the dump alone, kept gradients show as more blocks without a Python frame
        // of parameters' sizes than there are parameters (`state_only`).
        if let Some(origin) = state_only::reading(cx) {
            return state_only::kept_gradients(cx, origin).map(|k| seen_at_dump(cx, k)).into_iter().collect();
        }
        let mut out = Vec::new();
        let mut leak_lines = Vec::new();
        for g in cx.kept_backward_groups().iter().filter(|g| g.gradient_like) {
            let iterations = cx.backward_iterations(g.line);
            let eligible = iterations.len();
            let kept = g.kept_iterations.len();
            let by_share = cx.is_growth(kept, eligible);
            let run = kept_to_the_end_since(cx, &g.kept_iterations, &iterations);
            // A wrapped ring may hold too few of the line's backwards: then the like gradient
            // sets alive from before its first event are earlier ones, counted as occurrences.
            // Asked only where they could decide (every occurrence in the trace kept).
            let before = if !by_share && run.is_none() && kept == eligible { sets_made_before_trace(cx, g) } else { 0 };
            let with_before = before > 0 && cx.is_growth(kept + before, eligible + before);
            if !by_share && run.is_none() && !with_before {
                continue;
            }
            // Growth read from the trace alone, in a wrapped ring, may be sets that took the
            // place of sets alive when the ring began (each of several models' own gradients).
            if !with_before && replaced_sets_alive_at_start(cx, g) {
                continue;
            }
            // A log that started late grows from where it started.
            let from = run.and_then(|k| cx.phases.boundaries.get(k)).copied();
            let boundaries = match from {
                Some(f) if !by_share => cx.iteration_boundaries().into_iter().filter(|&b| b >= f).collect(),
                _ => cx.iteration_boundaries(),
            };
            // Sets that `torch.autograd.grad` returned (its backward's first event is made under
            // that call), not `.grad` attributes: the fix differs.
            let returned_by_grad_call = cx.stacks.get(cx.backward_stack(g.line)).grad_call;
            leak_lines.push(g.line);
            out.push(Finding {
                occurrences: g.kept_iterations.len(),
                kind: SuspectKind::UnreleasedGradient,
                severity: Severity::Leak,
                confidence: cx.growth_confidence(g.kept_iterations.len(), eligible),
                occurrence: Occurrence::Iteration,
                boundaries,
                bytes: None,
                site: g.line.map(|f| cx.site(f)),
                stack: cx.backward_stack(g.line),
                facts: Evidence::UnreleasedGradient {
                    hold: GradientHold::KeptEachStep {
                        blocks_per_step: g.blocks.len() as u64 / g.kept_iterations.len().max(1) as u64,
                        distinct_sizes: g.sizes.len(),
                        sets_before_trace: before,
                        returned_by_grad_call,
                    },
                    blocks: g.blocks.len() as u64,
                    backward_line: g.line.map(|f| cx.site(f)),
                    released_at: None,
                },
                blocks: g.blocks.clone(),
            });
        }
        let (made_once, uncleared) = never_cleared(cx, &leak_lines);
        out.extend(through_evaluation(cx, &leak_lines, &made_once));
        out.extend(uncleared);
        out
    }
}

/// Gradient sets like those the group keeps per iteration, alive at the dump and made before the
/// trace began, beyond a model's own copies (`OWN_PARAMETER_SET_COPIES`).
///
/// Mechanism. The autograd engine makes gradients on its own thread, without Python frames, so
/// blocks made before a wrapped ring's first event carry no line to match them by (the dump
/// keeps a block's stack, and these have none): what is left is their sizes. Gradients come in
/// sets of the parameters' sizes, one per parameter, and a kept set is alive at the dump. So the
/// pre-trace blocks without a user frame, alive at the dump, count as whole copies of one
/// iteration's kept set (the fewest over its sizes, each size taken as often as the set has it);
/// the model's parameters, optimizer moments, gradients and an EMA copy are such copies too,
/// and are not counted. ba03: a monitor that appends three `torch.autograd.grad` results every
/// second step, two of them in a ring of five iterations, eighteen made before it.
fn sets_made_before_trace(cx: &Context, g: &super::BackwardGroup) -> usize {
    let per_set = one_kept_set(cx, g);
    if per_set.len() < 2 {
        return 0;
    }
    let before = whole_copies(
        &per_set,
        cx.replay
            .blocks
            .iter()
            .filter(|b| b.alloc_event().is_none() && b.freed_at().is_none() && cx.stacks.userless(b.stack)),
    );
    before.saturating_sub(OWN_PARAMETER_SET_COPIES)
}

/// Whether the whole copies of the part of a set every kept iteration holds
/// (`kept_in_every_iteration`), alive at the dump whoever made them, are at most
/// [`SETS_IN_FLIGHT`] more than those alive when the trace began.
///
/// Mechanism. A parameter has one `.grad`: `zero_grad(set_to_none=True)` drops it and the next
/// backward that reaches the parameter makes a new one of its size. So gradients kept because
/// they are the `.grad` of several models (federated clients, an ensemble's members, each
/// trained in turn at one `.backward()` line) are bounded by the models: each new set takes the
/// place of the set that model had, and a ring shorter than one round of the models shows only
/// the new sets, kept to the end, as growth would. What tells them apart is the level: a log of
/// gradients adds a set per kept step, while replacing sets leaves as many alive at the dump as
/// when the ring began (those made before it, of the same sizes, are let go in it), less the
/// one set a step may have dropped and not yet made again. Parameters and optimizer moments of
/// those sizes are alive at both ends and cancel. A trace from the program's start has no set
/// alive at its start, so this never clears growth there. bd01: eight federated clients' kept
/// gradients in a ring of one round (`fixtures/extra55`).
fn replaced_sets_alive_at_start(cx: &Context, g: &super::BackwardGroup) -> bool {
    let per_set = kept_in_every_iteration(cx, g);
    if per_set.len() < 2 {
        return false;
    }
    let blocks = &cx.replay.blocks;
    let at_start = whole_copies(&per_set, blocks.iter().filter(|b| b.alloc_event().is_none() && !b.pending_at_start()));
    let at_dump = whole_copies(&per_set, blocks.iter().filter(|b| b.freed_at().is_none()));
    at_start > 0 && at_dump <= at_start + SETS_IN_FLIGHT
}

/// Per kept iteration, size → count of the gradients (blocks of parameter sizes) the line kept
/// in it: one set each.
fn kept_sets(cx: &Context, g: &super::BackwardGroup) -> BTreeMap<usize, BTreeMap<u64, usize>> {
    let mut per_iteration: BTreeMap<usize, BTreeMap<u64, usize>> =
        g.kept_iterations.iter().map(|&it| (it, BTreeMap::new())).collect();
    for &bi in &g.blocks {
        let b = &cx.replay.blocks[bi];
        if !g.sizes.contains(&b.size) {
            continue;
        }
        if let Some(set) = cx.iteration_of(b).and_then(|it| per_iteration.get_mut(&it)) {
            *set.entry(b.size).or_default() += 1;
        }
    }
    per_iteration
}

/// Size → count of the gradients the line kept in its last kept iteration: one set.
fn one_kept_set(cx: &Context, g: &super::BackwardGroup) -> BTreeMap<u64, usize> {
    kept_sets(cx, g).pop_last().map(|(_, set)| set).unwrap_or_default()
}

/// Size → count of the gradients the line kept in each of its kept iterations (the fewest over
/// them): the part of a set every kept step holds. The last step's set also holds the current
/// `.grad`s, which a log of some of them (q01) does not keep every step.
fn kept_in_every_iteration(cx: &Context, g: &super::BackwardGroup) -> BTreeMap<u64, usize> {
    let mut sets = kept_sets(cx, g).into_values();
    let Some(mut common) = sets.next() else { return BTreeMap::new() };
    for set in sets {
        common.retain(|size, n| match set.get(size) {
            Some(&m) => {
                *n = (*n).min(m);
                true
            }
            None => false,
        });
    }
    common
}

/// How many whole copies of `per_set` (size → count) `blocks` hold: the fewest over its sizes,
/// each size taken as often as the set has it.
fn whole_copies<'b>(
    per_set: &BTreeMap<u64, usize>,
    blocks: impl Iterator<Item = &'b memsnap_replay::BlockLifetime>,
) -> usize {
    let mut found: BTreeMap<u64, usize> = BTreeMap::new();
    for b in blocks {
        if per_set.contains_key(&b.size) {
            *found.entry(b.size).or_default() += 1;
        }
    }
    per_set.iter().map(|(s, &n)| found.get(s).copied().unwrap_or(0) / n).min().unwrap_or(0)
}

/// Gradients the first backward of a line made and kept to the end, none of which a later
/// backward of that line made again, while the later ones made the line's other gradients again
/// in at least `min_leak_occurrences` iterations.
///
/// Mechanism. `optimizer.zero_grad()` (`set_to_none=True`, the default) drops the `.grad` of the
/// parameters the optimizer holds, so the next backward makes them again. A parameter that
/// requires grad but is in no optimizer gets its `.grad` from the first backward that reaches
/// it, and every later backward accumulates into that tensor in place: made once, alive to the
/// end, never read, beside gradients made again every step. That is a teacher whose forward ran
/// with grad and whose output was not detached, or a backbone meant to be frozen whose
/// `requires_grad` was never turned off (ao06). Near misses: `zero_grad(set_to_none=False)`
/// keeps every gradient made once, and none is made again; a trace that begins after the first
/// backward has them as blocks from before it (ag14, in `fixtures/limits`); what
/// `torch.autograd.grad` returns is no `.grad`.
///
/// Returns every block made once so (workspaces too, which the floor of
/// `MIN_UNCLEARED_GRADIENTS` leaves unreported), and the findings.
fn never_cleared(cx: &Context, leak_lines: &[Option<FrameId>]) -> (BTreeSet<usize>, Vec<Finding>) {
    let min_once = cx.thresholds.min_gradients_per_step;
    let mut made_once = BTreeSet::new();
    let mut findings = Vec::new();
    for g in cx.kept_backward_groups().iter().filter(|g| !leak_lines.contains(&g.line)) {
        let Some(first_backward) = cx.phases.backwards.iter().find(|b| b.line == g.line) else { continue };
        if cx.stacks.get(cx.backward_stack(g.line)).grad_call {
            continue;
        }
        let Some(first) = cx.phases.iteration_of(first_backward.span.start) else { continue };
        let once: Vec<usize> = g
            .blocks
            .iter()
            .copied()
            .filter(|&bi| {
                let b = &cx.replay.blocks[bi];
                cx.param_sizes.contains(&b.size)
                    && cx.iteration_of(b) == Some(first)
                    && !cx.lifecycle.in_private_pool(bi)
            })
            .collect();
        if once.is_empty() {
            continue;
        }
        // Iterations after the first in which this line's backward made gradients again: blocks
        // of parameter sizes that outlived the backward that made them (a gradient lives on as
        // `.grad` until `zero_grad`; an activation's gradient of a parameter's size is freed
        // inside the backward).
        let its: Vec<usize> = cx
            .replay
            .blocks
            .par_iter()
            .filter_map(|b| {
                if !cx.param_sizes.contains(&b.size) {
                    return None;
                }
                let a = b.alloc_event()?;
                let k = cx.phases.backward_index_at(a)?;
                let outlived = b.freed_at().is_none_or(|f| f >= cx.phases.backwards[k].span.end);
                let it = cx.phases.iteration_of(a).filter(|&it| it >= first && outlived)?;
                (cx.attr(b) == Attr::Backward(g.line)).then_some(it)
            })
            .collect();
        let mut made: BTreeMap<usize, u64> = BTreeMap::new();
        for it in its {
            *made.entry(it).or_default() += 1;
        }
        let made_first = made.remove(&first).unwrap_or(0);
        let remade = made.values().filter(|&&n| n >= min_once).count();
        if remade < cx.thresholds.min_leak_occurrences {
            continue;
        }
        made_once.extend(once.iter().copied());
        // Gradients made once are made beside those made again: the first backward made them
        // and the others, later ones the others alone. A first backward that made no more than
        // later ones do made a set like theirs: that of one of several models trained in turn
        // at this line (federated clients, an ensemble's members) that the trace, a ring
        // shorter than one round of them, does not show again (bd01 cut to its last half).
        let mut later: Vec<u64> = made.values().copied().collect();
        later.sort_unstable();
        let typical_later = later.get(later.len() / 2).copied().unwrap_or(0);
        if made_first < typical_later + once.len() as u64 {
            continue;
        }
        let sizes: BTreeSet<u64> = once.iter().map(|&bi| cx.replay.blocks[bi].size).collect();
        if once.len() < MIN_UNCLEARED_GRADIENTS || sizes.len() < 2 {
            continue;
        }
        let bytes: u64 = once.iter().map(|&bi| cx.replay.blocks[bi].size).sum();
        // Held for the whole run, they are measured against what the program holds at rest, at
        // the dump (its parameters, optimizer state and these), not against a step's peak.
        let at_dump = cx.replay.series.after(cx.replay.series.len().checked_sub(1)).allocated;
        let share = bytes as f64 / at_dump.max(1) as f64;
        if bytes < cx.thresholds.min_suspect_bytes || share < cx.thresholds.grad_waste_share {
            continue;
        }
        findings.push(Finding {
            occurrences: 0,
            kind: SuspectKind::UnreleasedGradient,
            severity: Severity::Waste,
            confidence: waste_confidence(share),
            occurrence: Occurrence::Iteration,
            boundaries: Vec::new(),
            bytes: Some(bytes),
            site: g.line.map(|f| cx.site(f)),
            stack: cx.backward_stack(g.line),
            facts: Evidence::UnreleasedGradient {
                hold: GradientHold::NeverCleared { remade_in: remade, distinct_sizes: sizes.len() },
                blocks: once.len() as u64,
                backward_line: g.line.map(|f| cx.site(f)),
                released_at: None,
            },
            blocks: once,
        });
    }
    (made_once, findings)
}

/// The first iteration of the run of the backward line's iterations, each of which kept
/// gradients, that ends with the last but one (the last iteration's gradients are alive at any
/// dump), when the run has at least `min_leak_occurrences` iterations.
///
/// Mechanism. A gradient log (`grad_hist.append({n: p.grad ...})` with `zero_grad(set_to_none=
/// True)`) keeps a new set of gradients every step it runs, so one that starts after a warm-up
/// keeps them in every iteration from its start to the end, though in fewer than half of all
/// (q56 starts at step 13 of 20; a block the first backward made once, such as a workspace, may
/// also be kept, before the run). The near miss: layers unfrozen with
/// `zero_grad(set_to_none=False)`, whose first backward makes gradients that stay as `.grad`,
/// keep them in a few scattered iterations, one per unfreezing (q03), not in every iteration up
/// to the end.
fn kept_to_the_end_since(cx: &Context, kept: &BTreeSet<usize>, iterations: &BTreeSet<usize>) -> Option<usize> {
    let &last = iterations.last()?;
    let run: Vec<usize> = iterations.range(..last).rev().take_while(|i| kept.contains(i)).copied().collect();
    (run.len() >= cx.thresholds.min_leak_occurrences).then(|| *run.last().unwrap_or(&last))
}

/// Do the windows of passes without backward come about once per iteration (one starting in
/// every iteration but perhaps one, with 3 iterations or more)? Then they are passes the training
/// step itself runs without grad, not an evaluation phase between epochs. Counted by where the
/// windows start, not by how many there are: a warm-up's few no-grad passes and a no-grad graph
/// capture after the last step are as many windows as a short run has iterations, all in its
/// last (aa02).
fn every_step(cx: &Context) -> bool {
    let iterations = cx.phases.iteration_count();
    let mut with_window: Vec<usize> =
        cx.phases.eval_windows.iter().filter_map(|w| cx.phases.iteration_of(w.start)).collect();
    with_window.dedup();
    iterations >= 3 && with_window.len() + 1 >= iterations
}

/// Gradients alive at the start of the evaluation window (among the first 64) where they held the
/// most bytes.
fn through_evaluation(
    cx: &Context,
    leak_lines: &[Option<FrameId>],
    never_cleared: &BTreeSet<usize>,
) -> Option<Finding> {
    let phases = cx.phases;
    let d = cx.replay;
    // Windows with a real evaluation pass: an unconsumed forward pass inside.
    let real = |w: &crate::phases::Span| {
        cx.lifecycle.units.iter().any(|u| u.fate == UnitFate::Unconsumed && w.contains(u.pass_span.start))
    };
    // (bytes, window index, its blocks, bytes by user line)
    type Best = (u64, usize, Vec<usize>, BTreeMap<Option<FrameId>, u64>);
    let mut best: Option<Best> = None;
    for (wi, w) in phases.eval_windows.iter().enumerate().take(64) {
        if !phases.backwards.iter().any(|b| b.span.end <= w.start) || !real(w) {
            continue;
        }
        let t = Some(w.start);
        // Candidates: (block, the backward pass that made it, its user line).
        let mut candidates: Vec<(usize, Option<usize>, Option<FrameId>)> = Vec::new();
        for (bi, b) in d.blocks.iter().enumerate() {
            let Some(a) = b.alloc_event() else { continue };
            if a >= w.start || b.state_after(t) != Some(BlockState::Allocated) || !cx.param_sizes.contains(&b.size) {
                continue;
            }
            // A captured backward's static gradients are its CUDA graph's, not the program's to
            // release (`Lifecycle::in_private_pool`).
            if cx.lifecycle.in_private_pool(bi) {
                continue;
            }
            // What a line's first backward made and kept while its later ones made their
            // gradients again is held for good, not until a late `zero_grad`: gradients no
            // optimizer clears, or the engine thread's library workspace (`never_cleared`: g02).
            if never_cleared.contains(&bi) {
                continue;
            }
            if let Attr::Backward(line) = cx.attr(b) {
                candidates.push((bi, phases.backward_index_at(a), line));
            }
        }
        // Gradient sets. A backward makes every parameter's gradient at once, one block each,
        // of the parameters' sizes; the gradients alive at the window are such sets, one per
        // backward whose `.grad`s are still held (one per model trained in turn: a GAN's two,
        // an ensemble's members). A block a backward left alone is not one: a library's
        // workspace, made by the engine thread's first matmul and never freed (cuBLAS's 32 MiB
        // on an H100: aa02, the NeRFs o05, o06, o15). A pass's blocks count as a set with at
        // least `min_gradients_per_step` of them of two or more sizes, as kept gradients must
        // (`Context::looks_like_gradients`).
        let mut per_pass: BTreeMap<Option<usize>, (u64, BTreeSet<u64>)> = BTreeMap::new();
        for &(bi, pass, _) in &candidates {
            let e = per_pass.entry(pass).or_default();
            e.0 += 1;
            e.1.insert(d.blocks[bi].size);
        }
        let is_set = |pass: &Option<usize>| {
            per_pass.get(pass).is_some_and(|(n, sizes)| *n >= cx.thresholds.min_gradients_per_step && sizes.len() >= 2)
        };
        let mut bytes = 0;
        let mut blocks = Vec::new();
        let mut lines: BTreeMap<Option<FrameId>, u64> = BTreeMap::new();
        for &(bi, _, line) in candidates.iter().filter(|c| is_set(&c.1)) {
            bytes += d.blocks[bi].size;
            blocks.push(bi);
            *lines.entry(line).or_default() += d.blocks[bi].size;
        }
        if best.as_ref().is_none_or(|x| bytes > x.0) {
            best = Some((bytes, wi, blocks, lines));
        }
    }
    let (bytes, wi, blocks, lines) = best?;
    let w = phases.eval_windows[wi];
    // What releasing them would save is their bytes at the evaluation's own high-water mark:
    // the share is of the most allocated while the window ran (a Jacobian's batched backward, a
    // long generation), not of what was allocated as it began.
    let window_high = (w.start..w.end.min(d.series.len() as u32))
        .map(|i| d.series.allocated(i as usize))
        .max()
        .unwrap_or_else(|| d.series.after(Some(w.start as usize)).allocated);
    let share = bytes as f64 / window_high.max(1) as f64;
    if bytes < cx.thresholds.min_suspect_bytes || share < cx.thresholds.grad_waste_share {
        return None;
    }
    let line = lines.iter().max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0))).and_then(|(l, _)| *l);
    if leak_lines.contains(&line) {
        return None;
    }
    let passes = phases.forwards.iter().filter(|f| !f.trained && w.contains(f.span.start)).count();
    // Where they were finally freed: the user's line on the stacks of their free events (with
    // `context="all"` frees carry the stack of the code that freed). That line is the fix.
    let mut freers: BTreeMap<FrameId, (u32, memsnap_model::StackId)> = BTreeMap::new();
    // With `context="alloc"` a free carries the allocation's stack, which names no freer.
    for &bi in blocks.iter().filter(|_| !phases.free_stacks_from_alloc) {
        let Some(f) = d.blocks[bi].free_requested_event() else { continue };
        let stack = cx.events[f as usize].stack;
        if let Some(site) = cx.stacks.get(stack).site {
            let e = freers.entry(site).or_insert((0, stack));
            e.0 += 1;
        }
    }
    let released = freers.iter().max_by(|a, b| a.1 .0.cmp(&b.1 .0).then(b.0.cmp(a.0))).map(|(f, (_, s))| (*f, *s));
    Some(Finding {
        occurrences: 0,
        kind: SuspectKind::UnreleasedGradient,
        severity: Severity::Waste,
        confidence: waste_confidence(share),
        occurrence: Occurrence::Iteration,
        boundaries: Vec::new(),
        bytes: Some(bytes),
        site: released.map(|r| r.0).or(line).map(|f| cx.site(f)),
        stack: released.map_or_else(|| cx.backward_stack(line), |r| r.1),
        facts: Evidence::UnreleasedGradient {
            hold: GradientHold::ThroughEvaluation {
                window_start: w.start,
                passes,
                share_of_allocated: share,
                every_step: every_step(cx),
            },
            blocks: blocks.len() as u64,
            backward_line: line.map(|f| cx.site(f)),
            released_at: released.map(|r| cx.site(r.0)),
        },
        blocks,
    })
}

/// Confidence in a waste fact whose gradients are `share` of the memory they are weighed
/// against: 0.55 plus twice the share, at most 0.9 (reached at 17.5%). The larger the share,
/// the less the bytes can be a workspace or another stray block of a parameter's size.
fn waste_confidence(share: f64) -> f64 {
    (0.55 + 2.0 * share).min(0.9)
}

/// Kept gradients read from the dump alone: a leak (several backward passes' gradients are
/// alive), at the confidence of what rests on the dump alone. No line: the engine's thread has
/// none, and the `.backward()` line is on no event of such a file.
fn seen_at_dump(cx: &Context, k: state_only::KeptGradients) -> Finding {
    Finding {
        occurrences: 0,
        kind: SuspectKind::UnreleasedGradient,
        severity: Severity::Leak,
        confidence: cx.thresholds.state_only_confidence,
        occurrence: Occurrence::Iteration,
        boundaries: Vec::new(),
        bytes: None,
        site: None,
        stack: memsnap_model::StackId::EMPTY,
        facts: Evidence::UnreleasedGradient {
            hold: GradientHold::SeenAtDump { generations: k.generations, distinct_sizes: k.sizes },
            blocks: k.blocks.len() as u64,
            backward_line: None,
            released_at: None,
        },
        blocks: k.blocks,
    }
}
