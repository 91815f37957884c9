//! The life of every forward-pass block relative to autograd.
//!
//! Mechanism. With grad enabled, each operation of a forward pass saves tensors for backward
//! (inputs of `linear`/`matmul`, outputs of `softmax`/`gelu`, dropout masks, the `log_softmax`
//! of a loss). They stay alive after the pass returns, referenced by the graph, until a backward
//! runs through it: `backward()` frees each saved tensor as it consumes it (unless
//! `retain_graph=True`). Under `no_grad` / `inference_mode` nothing is saved and a pass leaves only
//! its outputs behind. So, per forward pass (a *unit*: the module calls from one call site plus
//! the user code that follows it before the next pass or backward, where losses and metrics are
//! computed):
//!
//! - **consumed**: a backward pass freed some of its blocks: a healthy graph. Its blocks still
//!   alive after that backward are held by Python references, not by the graph.
//! - **retained by backward**: grad was on, the next thing to run was a backward, and that backward
//!   freed none of its blocks: the graph was kept (`retain_graph=True`, or `create_graph=True`).
//! - **awaiting backward**: grad was on and no backward consumed it, but the trace ends at an OOM
//!   after it, or its call site trains (an earlier pass from it was consumed) and no backward has
//!   run since: a deferred backward that had not come yet (gradient accumulation over kept losses).
//! - **unconsumed**: no backward ever consumed it: evaluation or inference.
//!
//! "Grad was on" is read from the pass itself: how many of its blocks outlived it.

use memsnap_model::{Action, EventContext, FrameId, TraceEvent};
use memsnap_replay::DeviceReplay;
use rayon::prelude::*;
use rustc_hash::{FxHashMap, FxHashSet};

use crate::median::median;
use crate::phases::{Phases, Span};
use crate::stacks::StackTable;
use crate::thresholds::Thresholds;

/// How a unit's graph ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnitFate {
    /// Backward pass number `backward` (index into [`Phases::backwards`]) freed its saved tensors.
    Consumed { backward: usize },
    /// Backward pass number `backward` ran right after it and freed none of its blocks.
    RetainedByBackward { backward: usize },
    /// No backward yet; the program was about to run one (see module docs).
    AwaitingBackward,
    /// A training pass whose backward the program skipped: grad on, unconsumed, between two
    /// passes run by the same code path (same user frames from the model call outwards) that
    /// backward consumed. Not an evaluation: see `abandoned_training_passes`.
    Abandoned,
    /// No backward ever ran through it.
    Unconsumed,
}

/// One forward pass and the user code after it.
#[derive(Clone, Debug)]
pub struct Unit {
    /// Index into [`Phases::forwards`].
    pub pass: usize,
    /// The module calls.
    pub pass_span: Span,
    /// From the pass start to the next pass or backward start.
    pub span: Span,
    pub call_site: Option<FrameId>,
    pub fate: UnitFate,
    /// Blocks allocated inside the module calls, and of those, alive when the pass returned.
    pub pass_blocks: u32,
    pub survived_pass: u32,
    /// Bytes of the pass's blocks alive when it returned (what autograd saved, with grad on).
    pub saved_bytes: u64,
    /// Grad was enabled (many blocks outlived the pass, or blocks from many allocation stacks:
    /// see `Thresholds::min_saved_stacks`; under activation checkpointing, about as many as the
    /// checkpointed training passes keep: `Thresholds::training_saved_share`; for a small model,
    /// as many as its call site's training passes keep: `SiteTraining`).
    pub grad_on: bool,
    /// A block of this unit still allocated after this event is held by more than a rebound
    /// variable or the evaluation loop's own list: the end of the second unit after this one, or
    /// of the first pass after its evaluation window, whichever is later (or the trace end).
    pub horizon: u32,
    /// The pass was under way when the trace began (see [`begun_before_trace`]): what it made
    /// and saved before then is not in the trace, so its own blocks cannot tell its grad mode
    /// (see [`Lifecycle::call_site_runs_without_grad`]).
    pub begun_before_trace: bool,
}

/// Where one block of a unit ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockFate {
    /// Freed before its unit ended.
    Temporary,
    /// Freed by a backward pass.
    FreedByBackward,
    /// Alive after the point where the graph should have let it go (the consuming backward, the
    /// backward that retained it, or the unit's horizon), then freed at this event.
    ReleasedLater(u32),
    /// Alive after that point and never freed within the trace.
    Kept,
    /// Freed after its unit ended but before that point (a rebound variable).
    Released,
}

/// One block's place in the lifecycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnitBlock {
    /// Index into `DeviceReplay::blocks`.
    pub block: usize,
    /// Allocated inside the module calls (not in the user code after them).
    pub in_pass: bool,
    pub fate: BlockFate,
}

/// The lifecycle of every unit of one device.
pub struct Lifecycle {
    pub units: Vec<Unit>,
    /// Blocks of each unit, in allocation order.
    pub blocks: Vec<Vec<UnitBlock>>,
    /// Unit of each block of `DeviceReplay::blocks` (`u32::MAX`: none).
    pub unit_of_block: Vec<u32>,
    /// One-off blocks, ascending: never freed, no other block of the trace has their
    /// allocation stack and size, and made in the iteration where their stack first allocated
    /// (a library's workspace or lazily made state, created the first time an operation runs).
    /// Autograd does not free them, and nothing repeats them. A block of a later iteration is
    /// not one: what a line keeps round after round can differ in size every time (tensors of
    /// a varying number of rows, such as a mixture of experts' per-expert outputs, and blocks
    /// the allocator did not split, whose size depends on the free block they came from).
    /// Also a library's state made once per side stream ([`Lifecycle::per_stream_state`]).
    pub one_off: Vec<usize>,
    /// A library's state made once per side stream, ascending (see [`per_stream_state`]).
    pub per_stream_state: Vec<usize>,
    /// Whether each block of `DeviceReplay::blocks` lives in a private pool (see
    /// [`Lifecycle::in_private_pool`]).
    pub private: Vec<bool>,
}

impl Lifecycle {
    /// Does `block` live in a private pool? Mechanism: what a CUDA graph's capture allocates
    /// comes from the graph's private pool and stays at its address for every replay (a
    /// captured backward's gradients are the graph's static gradients), so neither autograd nor
    /// the program can release it while the graph lives (`zero_grad(set_to_none=True)` would
    /// only leave the replays writing to memory no tensor names).
    pub fn in_private_pool(&self, block: usize) -> bool {
        self.private.get(block).copied().unwrap_or(false)
    }

    pub fn unit_of(&self, block: usize) -> Option<usize> {
        self.unit_of_block.get(block).copied().filter(|&u| u != u32::MAX).map(|u| u as usize)
    }

    /// Is `block` a one-off block (see [`Lifecycle::one_off`])?
    pub fn is_one_off(&self, block: usize) -> bool {
        self.one_off.binary_search(&block).is_ok()
    }

    /// Does a reference hold unit `u`'s graph, rather than a few of its tensors?
    ///
    /// Mechanism. A graph is one object: whatever keeps it (its loss, an output with its
    /// `grad_fn`, a frame whose locals hold them) keeps every tensor it saved, so all the blocks
    /// that outlived the pass stay together. A detached output (`logits.detach()`), or the
    /// inputs, kept after the graph was let go hold only themselves: one or two of the pass's
    /// surviving blocks, while its saved tensors are freed when the variables are rebound. So
    /// the graph counts as held when at least half of the blocks that outlived the pass are
    /// still allocated past the unit's horizon.
    pub fn graph_held(&self, u: usize) -> bool {
        let held = self.blocks[u]
            .iter()
            .filter(|b| b.in_pass && matches!(b.fate, BlockFate::Kept | BlockFate::ReleasedLater(_)))
            .count();
        held > 0 && 2 * held >= self.units[u].survived_pass as usize
    }

    /// Did every other pass from unit `u`'s call site run without grad (no backward used it,
    /// and too few of its blocks outlived it for autograd's saved tensors)? Grad mode belongs to
    /// the code path (`torch.no_grad()` around the loop, `inference_mode` in a service), so a
    /// pass seen only in part ([`Unit::begun_before_trace`]) takes its call site's. False when
    /// no other pass came from that call site.
    pub fn call_site_runs_without_grad(&self, u: usize) -> bool {
        let site = self.units[u].call_site;
        let mut others = self.units.iter().enumerate().filter(|&(k, o)| k != u && o.call_site == site).peekable();
        others.peek().is_some() && others.all(|(_, o)| o.fate == UnitFate::Unconsumed && !o.grad_on)
    }

    /// The *call* of each unit: consecutive units made by one invocation of the user function
    /// that runs the model several times (a decoding loop inside `generate()`, a sliding window
    /// over a long input), numbered in order.
    ///
    /// Mechanism. Python stacks have no invocation ids, but an invocation is visible as a run:
    /// passes from the same model call line, all called through the same line one user frame
    /// further out (the call of the helper, `forward_caller`), with every allocation between
    /// them also made under that line (the helper's own code: sampling, concatenation). An
    /// allocation made outside it (the next request's input, made by the caller's loop) ends
    /// the call. A pass whose model call line has no user caller of its own (the model run by
    /// the loop itself) is a call of its own, so ordinary loops keep one call per pass.
    pub fn call_groups(&self, events: &[TraceEvent], stacks: &StackTable) -> Vec<usize> {
        let caller = |u: &Unit| stacks.get(events[u.pass_span.start as usize].stack).forward_caller;
        // Whether each unit continues the call of the one before: decided for every unit on its
        // own (in parallel: each looks at the allocations between two passes), then numbered.
        let continues: Vec<bool> = self
            .units
            .par_iter()
            .enumerate()
            .map(|(k, u)| {
                let Some(p) = k.checked_sub(1).map(|p| &self.units[p]) else { return false };
                match (caller(p), caller(u)) {
                    (Some(pc), Some(c)) if pc == c && p.call_site == u.call_site => events
                        [p.pass_span.end as usize..u.pass_span.start as usize]
                        .iter()
                        .filter(|e| e.action() == Action::Alloc && !stacks.userless(e.stack))
                        .all(|e| stacks.contains(e.stack, c)),
                    _ => false,
                }
            })
            .collect();
        let mut group = 0usize;
        continues
            .iter()
            .enumerate()
            .map(|(k, &same)| {
                if !same && k > 0 {
                    group += 1;
                }
                group
            })
            .collect()
    }
}

/// Build the lifecycle of one device's forward passes.
pub fn lifecycle(
    events: &[TraceEvent],
    contexts: &[EventContext],
    stacks: &StackTable,
    phases: &Phases,
    d: &DeviceReplay,
    th: &Thresholds,
) -> Lifecycle {
    let n = events.len() as u32;
    let fw = &phases.forwards;
    // Unit spans: a pass, then user code until the next pass or backward starts.
    let mut units: Vec<Unit> = fw
        .iter()
        .enumerate()
        .map(|(k, f)| {
            let next_pass = fw.get(k + 1).map_or(n, |g| g.span.start);
            let j = phases.backwards.partition_point(|b| b.span.start < f.span.end);
            let next_bw = phases.backwards.get(j).map_or(n, |b| b.span.start);
            Unit {
                pass: k,
                pass_span: f.span,
                span: Span { start: f.span.start, end: next_pass.min(next_bw).max(f.span.end) },
                call_site: f.call_site,
                fate: UnitFate::Unconsumed,
                pass_blocks: 0,
                survived_pass: 0,
                saved_bytes: 0,
                grad_on: false,
                horizon: n,
                begun_before_trace: false,
            }
        })
        .collect();
    if let Some(first) = units.first_mut() {
        first.begun_before_trace = begun_before_trace(first.pass_span, events, stacks, phases, d);
    }
    // The next unit from the same call site, for each unit.
    let mut next_same_site = vec![None; units.len()];
    {
        let mut last: FxHashMap<Option<FrameId>, usize> = FxHashMap::default();
        for k in (0..units.len()).rev() {
            next_same_site[k] = last.insert(units[k].call_site, k);
        }
    }
    for k in 0..units.len() {
        units[k].horizon = units.get(k + 2).map_or(n, |u| u.span.end);
        // A variable bound to a pass's result (`outputs = model(x)`, `loss = criterion(...)`) is
        // rebound when the loop body runs again: by the next pass from the same call site and the
        // code right after it. A loss computed by a module (`nn.CrossEntropyLoss`) is a pass of
        // its own, so with a pass between (an evaluation batch followed by training) "two units
        // later" falls short of that rebinding.
        if let Some(nx) = next_same_site[k] {
            let rebound = units.get(nx + 1).map_or(n, |u| u.span.end);
            units[k].horizon = units[k].horizon.max(rebound);
        }
        // In an evaluation window, outputs collected by the loop die when the loop returns: a
        // graph is held by something else only if it outlives the window too (up to the end of
        // the first pass after it). Windows and units are sorted by start.
        let start = units[k].pass_span.start;
        let w = phases.eval_windows.partition_point(|w| w.start <= start);
        if let Some(w) = w.checked_sub(1).map(|w| phases.eval_windows[w]).filter(|w| w.contains(start)) {
            let first_after = units.partition_point(|u| u.span.start < w.end);
            let after = units.get(first_after).map_or(n, |u| u.span.end);
            units[k].horizon = units[k].horizon.max(after);
        }
    }
    let unit_at = |i: u32| -> Option<usize> {
        let k = units.partition_point(|u| u.span.start <= i);
        (k > 0 && units[k - 1].span.contains(i)).then(|| k - 1)
    };

    // Which blocks belong to a unit: allocations inside the module calls, and Python-framed
    // allocations of the code after them that is neither optimizer nor backward.
    // Inputs made after a backward (or at the start) and before the next pass belong to that
    // pass: `x, y = next(batches)` then `model(x)`.
    let next_unit = |a: u32| -> Option<usize> {
        let k = units.partition_point(|u| u.span.start <= a);
        let u = units.get(k)?;
        let j = phases.backwards.partition_point(|b| b.span.start <= a);
        phases.backwards.get(j).is_none_or(|b| b.span.start >= u.span.start).then_some(k)
    };
    // Blocks that are not autograd's to free: private pools (CUDA graphs own their memory), and
    // one-off blocks (see `Lifecycle::one_off`).
    let private = private_pool_blocks(d);
    // How often each (stack, size) pair was allocated, and the first allocation of each stack
    // (lazily made state comes the first time its line runs): one pass, counted per thread and
    // joined, as there are millions of blocks but few stacks.
    type Counts = FxHashMap<(memsnap_model::StackId, u64), u32>;
    type Firsts = FxHashMap<memsnap_model::StackId, u32>;
    let (recurrence, first_alloc): (Counts, Firsts) = d
        .blocks
        .par_iter()
        .filter_map(|b| b.alloc_event().map(|a| (b.stack, b.size, a)))
        .fold(
            || (Counts::default(), Firsts::default()),
            |(mut counts, mut firsts), (stack, size, a)| {
                *counts.entry((stack, size)).or_default() += 1;
                firsts.entry(stack).and_modify(|f| *f = (*f).min(a)).or_insert(a);
                (counts, firsts)
            },
        )
        .reduce(
            || (Counts::default(), Firsts::default()),
            |(mut counts, mut firsts), (more_counts, more_firsts)| {
                for (k, n) in more_counts {
                    *counts.entry(k).or_default() += n;
                }
                for (s, f) in more_firsts {
                    firsts.entry(s).and_modify(|g| *g = (*g).min(f)).or_insert(f);
                }
                (counts, firsts)
            },
        );
    let one_off: Vec<usize> = d
        .blocks
        .par_iter()
        .enumerate()
        .filter(|(_, b)| b.freed_at().is_none())
        .filter_map(|(bi, b)| {
            let a = b.alloc_event()?;
            let stack = b.stack;
            let first = first_alloc.get(&stack).copied().unwrap_or(a);
            (recurrence.get(&(stack, b.size)) == Some(&1) && phases.iteration_of(a) == phases.iteration_of(first))
                .then_some(bi)
        })
        .collect();
    let per_stream_state = per_stream_state(events, contexts, d);
    let mut one_off = one_off;
    one_off.extend(&per_stream_state);
    one_off.sort_unstable();
    one_off.dedup();
    // Lines that make a pass's inputs: those allocating in the gap before a pass (after a
    // backward, or before the first pass). When the same line allocates again right after a
    // pass, it is making the next pass's inputs, not computing on this pass's result.
    // Gathered per thread and joined: few stacks qualify, and the stack's kind (an index) is
    // looked at before where the block lies (binary searches over the units).
    let input_stacks: FxHashSet<memsnap_model::StackId> = d
        .blocks
        .par_iter()
        .filter_map(|b| b.alloc_event().map(|a| (a, b.stack)))
        .fold(FxHashSet::default, |mut set, (a, s)| {
            let info = stacks.get(s);
            let maker = info.python && !info.forward && !info.optimizer && !info.backward_launch && !info.recompute;
            if maker && !set.contains(&s) && !phases.on_worker(a) && unit_at(a).is_none() && next_unit(a).is_some() {
                set.insert(s);
            }
            set
        })
        .reduce(FxHashSet::default, |mut a, b| {
            a.extend(b);
            a
        });
    // Where each backward's own frees may end. Under `context="alloc"` a free carries its
    // block's allocation stack, not where it was freed, so no free closes a backward window: the
    // next Python-framed allocation does. When that allocation is the user's own code (the
    // program went on: the next step's batch, an optimizer step), or the trace ends, the frees
    // after the backward's last allocation may be the program's as much as the backward's:
    // `zero_grad`, names rebound as the next step begins (with a fused optimizer that allocates
    // nothing, nothing else comes between). Autograd frees a node's saved tensors right after
    // the node runs, between the gradients it allocates, so a backward that frees what a pass
    // saved does so before its last allocation (bar the last node's); counting the later frees
    // would read a `retain_graph=True` backward as one that freed the pass (z01 recorded with
    // `context="alloc"`). A window closed by library code without a user frame (FSDP's hooks,
    // which the engine runs inside the backward) keeps its frees: the backward is still running.
    let backward_frees_end: Vec<u32> = phases
        .backwards
        .iter()
        .map(|bw| {
            let closer = events.get(bw.span.end as usize).map(|e| stacks.get(e.stack));
            // A backward a `torch.func` transform runs (`grad`, `jacrev`) frees the graph when the
            // transform returns, after its last allocation and before the program's next one
            // (ab01 recorded with `context="alloc"`): all its window's frees are its own.
            let in_transform = events.get(bw.span.start as usize).is_some_and(|e| stacks.get(e.stack).under_transform);
            if !phases.free_stacks_from_alloc || in_transform || closer.is_some_and(|c| c.site.is_none()) {
                return bw.span.end;
            }
            let span = &events[bw.span.start as usize..bw.span.end as usize];
            span.iter().rposition(|e| e.action() == Action::Alloc).map_or(bw.span.end, |k| bw.span.start + k as u32)
        })
        .collect();
    let mut unit_of_block = vec![u32::MAX; d.blocks.len()];
    let mut members: Vec<Vec<(usize, bool)>> = vec![Vec::new(); units.len()];
    let mut consumer: Vec<Option<usize>> = vec![None; units.len()];
    // Each block's unit, decided on its own (in parallel), then gathered in block order: the
    // blocks placed, as (block, unit, in the pass, the backward that consumed it).
    let placed: Vec<(u32, u32, bool, Option<u32>)> = d
        .blocks
        .par_iter()
        .enumerate()
        .filter_map(|(bi, b)| {
            let a = b.alloc_event()?;
            let stack = b.stack;
            let info = stacks.get(stack);
            if !info.python
                || info.recompute
                || info.backward_launch
                || info.optimizer
                || private[bi]
                || phases.on_worker(a)
            {
                return None;
            }
            if one_off.binary_search(&bi).is_ok() {
                return None;
            }
            let here = unit_at(a)
                .filter(|&u| info.forward || !input_stacks.contains(&stack) || units[u].pass_span.contains(a));
            let u = here.or_else(|| if info.forward { None } else { next_unit(a) })?;
            let in_pass = units[u].pass_span.contains(a) && info.forward;
            if !in_pass && info.forward {
                return None;
            }
            // Only the module calls' own blocks tell which backward ran through the pass: code
            // after a pass may already be making the next pass's inputs, which that pass's
            // backward frees.
            let consumed_by = b.freed_at().filter(|_| in_pass).and_then(|f| {
                let bw = phases.backward_index_at(f)?;
                (phases.backwards[bw].span.start > a && f < backward_frees_end[bw]).then_some(bw)
            });
            Some((bi as u32, u as u32, in_pass, consumed_by.map(|bw| bw as u32)))
        })
        .collect();
    // Per unit, its blocks that a backward freed: tensors autograd saved for it.
    let mut freed_by_backward = vec![0u32; units.len()];
    for (bi, u, in_pass, consumed_by) in placed {
        unit_of_block[bi as usize] = u;
        members[u as usize].push((bi as usize, in_pass));
        if let Some(bw) = consumed_by.map(|bw| bw as usize) {
            let c = &mut consumer[u as usize];
            *c = Some(c.map_or(bw, |c: usize| c.min(bw)));
            freed_by_backward[u as usize] += 1;
        }
    }
    let alive_after = |b: &memsnap_replay::BlockLifetime, t: u32| b.freed_at().is_none_or(|f| f > t);

    // Grad evidence: what survived each pass, from how many stacks, and whether the pass ran
    // under activation checkpointing.
    let evidence: Vec<(u32, bool)> = units
        .par_iter_mut()
        .zip(&members)
        .map(|(unit, members)| {
            let last_pass_event = unit.pass_span.end.saturating_sub(1);
            let mut saved_stacks = FxHashSet::default();
            let mut checkpointed = false;
            for &(bi, in_pass) in members {
                let b = &d.blocks[bi];
                if !in_pass {
                    continue;
                }
                unit.pass_blocks += 1;
                let stack = b.alloc_event().map(|_| b.stack);
                checkpointed |= stack.is_some_and(|s| stacks.get(s).checkpointed);
                // A module hook's tensors that outlive the pass are module attributes it set
                // (pruning's `weight = weight_orig * mask`, re-made before every forward and
                // replacing the last one), alive whatever the grad mode: not saved tensors (s10:
                // evaluations under `no_grad` of a pruned network read as run with grad).
                let hook_attribute = stack.is_some_and(|s| stacks.get(s).made_by_module_hook);
                if alive_after(b, last_pass_event) && !hook_attribute {
                    unit.survived_pass += 1;
                    unit.saved_bytes += b.size;
                    if let Some(s) = stack {
                        saved_stacks.insert(s);
                    }
                }
            }
            (saved_stacks.len() as u32, checkpointed)
        })
        .collect();
    // Under activation checkpointing autograd saves only each checkpointed segment's input (the
    // segment runs again in the backward) and what lies outside the segments, so a pass with
    // grad on keeps a few blocks of the many it makes: below both shares above. What the
    // checkpointed training passes (consumed by a backward) keep is then the measure: a pass
    // run with grad on keeps about as many, one under `no_grad` only its outputs.
    let mut trained: Vec<u32> = units
        .iter()
        .zip(&consumer)
        .zip(&evidence)
        .filter(|((_, c), (_, checkpointed))| c.is_some() && *checkpointed)
        .map(|((u, _), _)| u.survived_pass)
        .collect();
    trained.sort_unstable();
    let checkpointed_training_saves = trained.get(trained.len() / 2).copied();
    let site_training = site_training(&units, &consumer, &freed_by_backward);
    // A backward that freed some pass's saved tensors ran without `retain_graph=True`, which
    // keeps the saved tensors of every node the backward reaches or of none: a grad-on pass right
    // before it whose tensors it did not free was not reached. Its graph does not feed that loss
    // (an off-task head scored with grad on, a metric's forward), so the backward retained
    // nothing of it: the pass is unconsumed, like any grad-on pass no backward ran through.
    let mut frees_saved = vec![false; phases.backwards.len()];
    for &bw in consumer.iter().flatten() {
        frees_saved[bw] = true;
    }
    // Fates.
    units.par_iter_mut().zip(&consumer).zip(&evidence).for_each(|((unit, consumer), &(saved_stacks, checkpointed))| {
        let share = |f: f64| unit.survived_pass as f64 >= f * unit.pass_blocks as f64;
        let saves_like_checkpointed_training = checkpointed
            && checkpointed_training_saves
                .is_some_and(|r| f64::from(unit.survived_pass) >= th.training_saved_share * f64::from(r));
        let saves_like_its_training = site_training.get(&unit.call_site).is_some_and(|t| {
            t.saved >= SITE_SAVED_MIN && unit.survived_pass >= t.grad_on_floor(th.training_saved_share)
        });
        unit.grad_on = unit.pass_blocks >= th.min_pass_blocks
            && (unit.survived_pass >= th.min_saved_blocks
                && (share(th.saved_fraction)
                    || saved_stacks >= th.min_saved_stacks && share(th.sparse_saved_fraction)
                    || saves_like_checkpointed_training)
                || saves_like_its_training);
        unit.fate = match *consumer {
            Some(bw) => UnitFate::Consumed { backward: bw },
            None => {
                let next = phases.backwards.partition_point(|b| b.span.start < unit.span.end);
                match phases.backwards.get(next) {
                    Some(b) if unit.grad_on && b.span.start == unit.span.end && !frees_saved[next] => {
                        UnitFate::RetainedByBackward { backward: next }
                    }
                    _ => UnitFate::Unconsumed,
                }
            }
        };
    });

    retained_together(phases, &mut units);
    abandoned_training_passes(events, stacks, &mut units);

    // Awaiting backward: unconsumed grad-on units after the last backward, when the trace ends at
    // an OOM, or when their call site trains.
    let last_bw_start = phases.backwards.last().map(|b| b.span.start);
    let last_oom = events.iter().rposition(|e| e.action() == Action::Oom).map(|i| i as u32);
    let mut site_last_consumed: Vec<(Option<FrameId>, u32)> = Vec::new();
    for unit in &units {
        if matches!(unit.fate, UnitFate::Consumed { .. }) {
            match site_last_consumed.iter_mut().find(|s| s.0 == unit.call_site) {
                Some(s) => s.1 = s.1.max(unit.span.start),
                None => site_last_consumed.push((unit.call_site, unit.span.start)),
            }
        }
    }
    for unit in units.iter_mut() {
        if unit.fate != UnitFate::Unconsumed || !unit.grad_on {
            continue;
        }
        let after_last_backward = last_bw_start.is_none_or(|s| s < unit.span.start);
        let oom_after = last_oom.is_some_and(|o| o >= unit.span.start);
        let site_trains = site_last_consumed.iter().any(|s| s.0 == unit.call_site && s.1 < unit.span.start);
        // A pass that raised an OOM never reached its backward: the exception unwound it.
        let interrupted =
            events[unit.span.start as usize..unit.span.end as usize].iter().any(|e| e.action() == Action::Oom);
        if interrupted || after_last_backward && (oom_after || site_trains) {
            unit.fate = UnitFate::AwaitingBackward;
        }
    }

    let blocks = members
        .par_iter()
        .enumerate()
        .map(|(u, m)| {
            let unit = &units[u];
            let letgo = match unit.fate {
                UnitFate::Consumed { backward } | UnitFate::RetainedByBackward { backward } => {
                    phases.backwards[backward].span.end.saturating_sub(1)
                }
                UnitFate::AwaitingBackward | UnitFate::Unconsumed | UnitFate::Abandoned => {
                    unit.horizon.saturating_sub(1)
                }
            };
            m.iter()
                .map(|&(bi, in_pass)| {
                    let b = &d.blocks[bi];
                    let end = if in_pass { unit.pass_span.end } else { unit.span.end };
                    let fate = match b.freed_at() {
                        Some(f) if f < end => BlockFate::Temporary,
                        Some(f) if phases.backward_at(f).is_some() && f <= letgo => BlockFate::FreedByBackward,
                        Some(f) if f <= letgo => BlockFate::Released,
                        Some(f) => BlockFate::ReleasedLater(f),
                        None => BlockFate::Kept,
                    };
                    UnitBlock { block: bi, in_pass, fate }
                })
                .collect()
        })
        .collect();
    Lifecycle { units, blocks, unit_of_block, one_off, per_stream_state, private }
}

/// Whether the pass of `span`, the trace's first unit, was under way when the trace began.
///
/// Mechanism. A ring buffer that wrapped (`max_entries`), or recording started from another
/// thread, can open the trace in the middle of a forward pass. Inside a forward the blocks freed
/// are that pass's own temporaries, made earlier in the same pass; a pass that frees a block made
/// before the trace's first event, inside its module calls, began before it. The free may come
/// before the pass's first allocation, where the pass is found (a free's stack is its
/// allocation's under `context="alloc"`, and no free is placed by its stack then): a free of
/// such a block from inside a module call, before any backward, counts too. Such a pass is seen
/// in part: the blocks it made and saved before the trace are missing, so the share of its
/// blocks that outlive it says nothing of its grad mode.
fn begun_before_trace(
    span: Span,
    events: &[TraceEvent],
    stacks: &StackTable,
    phases: &Phases,
    d: &DeviceReplay,
) -> bool {
    let first_phase = phases.backwards.first().is_none_or(|b| b.span.start >= span.end);
    first_phase
        && d.blocks.iter().any(|b| {
            b.alloc_event().is_none()
                && b.freed_at().is_some_and(|f| {
                    span.contains(f) || f < span.start && stacks.get(events[f as usize].stack).module_call.is_some()
                })
        })
}

/// Tensors a call site's training passes must leave for their backward to free (median) before
/// the site's own training tells another pass's grad mode (2): with one, a pass that differs
/// from its outputs by a single block would read as grad on.
const SITE_SAVED_MIN: u32 = 2;

/// What the training passes of one call site (consumed by a backward) leave: medians of the
/// blocks alive when the pass returned, and of those that the backward freed.
struct SiteTraining {
    survived: u32,
    saved: u32,
}

impl SiteTraining {
    /// The blocks a pass from this site keeps when it runs with grad on.
    ///
    /// Mechanism. Autograd saves the same tensors whether or not a backward follows, so a pass
    /// run with grad on keeps what the site's training passes keep: their outputs and their
    /// saved tensors (those their backward freed). Under `no_grad` only the outputs survive,
    /// `survived - saved` of them. A small model (an RL agent's three-layer policy, which saves
    /// two activations and returns one tensor) keeps too few blocks for the shares of
    /// `Thresholds`, whose measures hold for deep models; its own training says how many it
    /// saves. With grad on a pass keeps its outputs and at least `share` of the saved ones.
    fn grad_on_floor(&self, share: f64) -> u32 {
        self.survived.saturating_sub(self.saved) + (share * f64::from(self.saved)).ceil() as u32
    }
}

/// [`SiteTraining`] per call site (a user frame) that has training passes.
fn site_training(
    units: &[Unit],
    consumer: &[Option<usize>],
    freed_by_backward: &[u32],
) -> FxHashMap<Option<FrameId>, SiteTraining> {
    let mut by_site: FxHashMap<Option<FrameId>, (Vec<u32>, Vec<u32>)> = FxHashMap::default();
    for ((unit, consumer), &saved) in units.iter().zip(consumer).zip(freed_by_backward) {
        // Passes with no user frame outward of the model call (run by library code) share the
        // site `None` whatever model they run: their medians would mix models.
        if consumer.is_some() && unit.call_site.is_some() {
            let site = by_site.entry(unit.call_site).or_default();
            site.0.push(unit.survived_pass);
            site.1.push(saved);
        }
    }
    by_site
        .into_iter()
        .map(|(site, (mut survived, mut saved))| {
            (site, SiteTraining { survived: median(&mut survived), saved: median(&mut saved) })
        })
        .collect()
}

/// Mark unconsumed grad-on units that feed a retaining backward together with the pass right
/// before it.
///
/// Mechanism. A loss can combine several passes run one after the other (a GAN discriminator on
/// real and on generated images, two views through a siamese encoder): one backward then runs
/// through all of them. With `retain_graph=True` that backward frees none of their saved tensors,
/// so no free says which passes it ran through; the pass right before it is *retained by
/// backward*. An earlier grad-on pass after the previous backward, followed only by grad-on
/// passes of other call sites up to that backward (none from its own: a second batch through the
/// same line would be another step's), was not run for nothing: it belongs to the same retained
/// graph.
fn retained_together(phases: &Phases, units: &mut [Unit]) {
    for i in 0..units.len() {
        if units[i].fate != UnitFate::Unconsumed || !units[i].grad_on {
            continue;
        }
        let next = phases.backwards.partition_point(|b| b.span.start < units[i].span.end);
        let Some(bw) = phases.backwards.get(next) else { continue };
        let later = &units[i + 1..];
        let between = &later[..later.partition_point(|u| u.span.start < bw.span.start)];
        let Some(last) = between.last() else { continue };
        let together = last.fate == (UnitFate::RetainedByBackward { backward: next })
            && between.iter().all(|u| {
                u.grad_on
                    && u.call_site != units[i].call_site
                    && matches!(u.fate, UnitFate::Unconsumed | UnitFate::RetainedByBackward { .. })
            });
        if together {
            units[i].fate = UnitFate::RetainedByBackward { backward: next };
        }
    }
}

/// Mark unconsumed grad-on units that are training passes whose backward was skipped.
///
/// Mechanism. Grad mode is a property of the code path: the training step runs its forward with
/// grad on so that its backward can run. When the very same code path (the same user frames from
/// the model call outwards, so the same loop body and the same helper) runs a pass that no
/// backward consumes, right between two of its passes that backward did consume, control flow
/// left the step between the forward and the backward: an exception caught by the loop (a
/// non-finite loss), a `continue` on a bad batch, a conditional backward. That pass is not an
/// evaluation pass, and `no_grad` is not the fix (it would stop the training step from
/// training). If its graph outlives it, a reference keeps it (a stored exception's traceback
/// holds the frame whose locals hold the loss): `retained_graph`.
///
/// An evaluation loop that shares its code path with training (a `for phase in ("train",
/// "val")` loop without `set_grad_enabled`) runs its passes in a row, so its passes are not
/// between two consumed ones. A one-batch evaluation there is, and is told apart by what the
/// pass saved: evaluation runs the model in eval mode (`model.eval()`), where dropout allocates
/// no mask and batch norm saves no batch statistics, so its pass leaves fewer tensors alive than
/// the training passes around it. A skipped step runs in train mode and saves exactly as many
/// (the count does not depend on the batch's shape); so a pass is taken for a skipped step only
/// when it left as many blocks alive as one of its two neighbours. A model whose forward is the
/// same in both modes (no dropout, no batch norm) gives no such sign: such a pass stays
/// *abandoned*, and `undecided_passes` says it may be either.
///
/// The last pass of a call site has no later pass to stand between, nor its first an earlier
/// one. When the same code path already skipped its backward between two consumed passes, the
/// program's control flow is known to skip there (a discriminator updated every other step,
/// whose loss is still computed each step: af14); a first or last pass of that code path that
/// saved as many tensors as its one neighbour, itself consumed or skipped, is one more such
/// step, cut off by the end of the trace or by its start (a ring that wrapped).
fn abandoned_training_passes(events: &[TraceEvent], stacks: &StackTable, units: &mut [Unit]) {
    let chain = |u: &Unit| stacks.get(events[u.pass_span.start as usize].stack).caller_chain;
    let consumed = |u: &Unit| matches!(u.fate, UnitFate::Consumed { .. });
    // The unit before and after each one from the same call site, found in two walks (a search
    // per unit would cost units² on a trace whose call sites do not repeat).
    let (mut prev, mut next) = (vec![None; units.len()], vec![None; units.len()]);
    let mut last: FxHashMap<Option<FrameId>, usize> = FxHashMap::default();
    for (k, u) in units.iter().enumerate() {
        prev[k] = last.insert(u.call_site, k);
    }
    last.clear();
    for (k, u) in units.iter().enumerate().rev() {
        next[k] = last.insert(u.call_site, k);
    }
    let mut marks = Vec::new();
    for k in 0..units.len() {
        let u = &units[k];
        if u.fate != UnitFate::Unconsumed || !u.grad_on || u.call_site.is_none() {
            continue;
        }
        let c = chain(u);
        if c == 0 {
            continue;
        }
        if let (Some(p), Some(n)) = (prev[k].map(|p| &units[p]), next[k].map(|n| &units[n])) {
            // The same module mode: a skipped step saved as many tensors as the steps around it.
            let same_saving = u.survived_pass == p.survived_pass || u.survived_pass == n.survived_pass;
            if consumed(p) && consumed(n) && chain(p) == c && chain(n) == c && same_saving {
                marks.push(k);
            }
        }
    }
    // The first and the last pass of a code path that skipped its backward elsewhere (see
    // above): one neighbour only.
    let skipping: FxHashSet<(Option<FrameId>, u64)> =
        marks.iter().map(|&k| (units[k].call_site, chain(&units[k]))).collect();
    let marked: FxHashSet<usize> = marks.iter().copied().collect();
    let mut at_the_ends = Vec::new();
    for k in 0..units.len() {
        let u = &units[k];
        if u.fate != UnitFate::Unconsumed || !u.grad_on || !skipping.contains(&(u.call_site, chain(u))) {
            continue;
        }
        let neighbour = match (prev[k], next[k]) {
            (Some(p), None) => p,
            (None, Some(n)) => n,
            _ => continue,
        };
        let other = &units[neighbour];
        let consumed_or_skipped = consumed(other) || marked.contains(&neighbour);
        if consumed_or_skipped && chain(other) == chain(u) && other.survived_pass == u.survived_pass {
            at_the_ends.push(k);
        }
    }
    for k in marks.into_iter().chain(at_the_ends) {
        units[k].fate = UnitFate::Abandoned;
    }
}

/// Abandoned passes (see `abandoned_training_passes`) whose graphs no reference kept, per call
/// site: `(call site, passes, largest bytes saved by one)`, for sites whose passes saved at least
/// `min_suspect_bytes`.
///
/// Mechanism. Such a pass is either a training step whose backward the program skipped or a
/// one-batch evaluation run through the training code with grad on: the same code path, the
/// same module mode, as many saved tensors; nothing in the allocations tells them apart. Its
/// graph lives until the loop rebinds its variables, as a skipped step's does, so neither
/// `no_grad_missing` nor `retained_graph` can be named; the caveat says both readings.
pub fn undecided_passes(lc: &Lifecycle, th: &Thresholds) -> Vec<(Option<FrameId>, usize, u64)> {
    let mut out: Vec<(Option<FrameId>, usize, u64, bool)> = Vec::new();
    // A call site's last pass has its graph alive at the end of the trace whatever holds it (the
    // loop's variables still bind it): it says nothing about a reference.
    let mut last_of_site: FxHashMap<Option<FrameId>, usize> = FxHashMap::default();
    for (u, unit) in lc.units.iter().enumerate() {
        last_of_site.insert(unit.call_site, u);
    }
    for (u, unit) in lc.units.iter().enumerate() {
        if unit.fate != UnitFate::Abandoned {
            continue;
        }
        let held = lc.graph_held(u) && last_of_site.get(&unit.call_site) != Some(&u);
        match out.iter_mut().find(|o| o.0 == unit.call_site) {
            Some(o) => {
                o.1 += 1;
                o.2 = o.2.max(unit.saved_bytes);
                o.3 |= held;
            }
            None => out.push((unit.call_site, 1, unit.saved_bytes, held)),
        }
    }
    out.into_iter().filter(|o| !o.3 && o.2 >= th.min_suspect_bytes).map(|o| (o.0, o.1, o.2)).collect()
}

/// For each block of `d.blocks`: does it live in a private pool (CUDA graph capture)?
fn private_pool_blocks(d: &DeviceReplay) -> Vec<bool> {
    let mut ranges: Vec<(u64, u64)> = d
        .segments
        .iter()
        .filter(|s| s.pool_id != (0, 0))
        .map(|s| (s.address, s.address.saturating_add(s.size)))
        .collect();
    ranges.sort_unstable();
    if ranges.is_empty() {
        return vec![false; d.blocks.len()];
    }
    d.blocks
        .par_iter()
        .map(|b| {
            let k = ranges.partition_point(|r| r.0 <= b.address);
            k > 0 && b.address < ranges[k - 1].1
        })
        .collect()
}

/// The blocks of a library's state made once per side stream, ascending. cuBLAS keeps a
/// workspace per (handle, stream) pair, made through the caching allocator by the first matmul
/// on that stream, after the operation's output, and never freed
/// (`torch._C._cuda_clearCublasWorkspaces()` aside); cuBLASLt does the same. A loop that takes
/// `torch.cuda.Stream()` anew each step (a pool of 32 streams per priority, handed out in turn)
/// so makes one workspace per stream until every stream of the pool has one: memory that steps
/// up at the matmul lines for 32 steps and then stays (ab05 on an H100: 65 MiB per step, the
/// forward's cuBLAS and cuBLASLt workspaces, 32 and 1 MiB, and the backward's 32 MiB), held by
/// no reference. Such a block is kept, lies on a side stream (the default stream's is the
/// ordinary one-off), is the only block of its stack and size on its stream, follows an
/// allocation of the same operation (same stack, same stream) with nothing allocated between,
/// and has a like block (same stack and size) on another side stream.
fn per_stream_state(events: &[TraceEvent], contexts: &[EventContext], d: &DeviceReplay) -> Vec<usize> {
    let stream = |e: &TraceEvent| contexts.get(e.context().0 as usize).map_or(0, |c| c.stream);
    let mut state = Vec::new();
    // Without stacks on the events (`context="state"`) "the same operation" cannot be told: any
    // allocation on the stream would do, and a kept output would pass for a workspace.
    if contexts.iter().all(|c| c.stream == 0) || events.iter().all(|e| e.stack == memsnap_model::StackId::EMPTY) {
        return state;
    }
    let side = |a: u32| stream(&events[a as usize]) != 0;
    let mut count: FxHashMap<(memsnap_model::StackId, u64, u64), u32> = FxHashMap::default();
    for b in &d.blocks {
        if let Some(a) = b.alloc_event().filter(|&a| side(a)) {
            *count.entry((b.stack, b.size, stream(&events[a as usize]))).or_default() += 1;
        }
    }
    let after_same_op = |a: u32| {
        let e = &events[a as usize];
        events[..a as usize]
            .iter()
            .rev()
            .find(|p| !matches!(p.action(), Action::SegmentAlloc | Action::SegmentMap))
            .is_some_and(|p| p.action() == Action::Alloc && p.stack == e.stack && stream(p) == stream(e))
    };
    for (bi, b) in d.blocks.iter().enumerate() {
        let Some(a) = b.alloc_event().filter(|&a| b.freed_at().is_none() && side(a)) else { continue };
        if count.get(&(b.stack, b.size, stream(&events[a as usize]))) == Some(&1) && after_same_op(a) {
            state.push(bi);
        }
    }
    // Per stream: the same operation's block on two side streams at least (one side stream's
    // first matmul is the ordinary one-off; a block the optimizer made once is its state).
    let mut streams_of: FxHashMap<(memsnap_model::StackId, u64), u32> = FxHashMap::default();
    for &bi in &state {
        *streams_of.entry((d.blocks[bi].stack, d.blocks[bi].size)).or_default() += 1;
    }
    state.retain(|&bi| streams_of[&(d.blocks[bi].stack, d.blocks[bi].size)] >= 2);
    state
}

/// What [`Lifecycle::per_stream_state`] holds: (blocks, bytes, side streams).
pub fn per_stream_state_totals(
    lc: &Lifecycle,
    events: &[TraceEvent],
    contexts: &[EventContext],
    d: &DeviceReplay,
) -> (u64, u64, usize) {
    let streams: FxHashSet<u64> = lc
        .per_stream_state
        .iter()
        .filter_map(|&bi| d.blocks[bi].alloc_event())
        .map(|a| contexts.get(events[a as usize].context().0 as usize).map_or(0, |c| c.stream))
        .collect();
    let bytes = lc.per_stream_state.iter().map(|&bi| d.blocks[bi].size).sum();
    (lc.per_stream_state.len() as u64, bytes, streams.len())
}
