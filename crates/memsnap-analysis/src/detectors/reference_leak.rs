//! `reference_leak`: tensors that no autograd graph holds, kept by a Python reference, step after
//! step.
//!
//! Mechanism. After a backward has consumed a graph, or when a pass ran without grad, nothing of
//! autograd holds its tensors: if they stay allocated, a reference does (a forward hook storing
//! outputs, a metrics dict, a cache, a closure, a global list). What is kept is outputs or
//! intermediates, never saved tensors (those are `retained_graph`'s). Claims, for blocks still
//! allocated at the end of the trace:
//! - blocks of forward passes a backward consumed, or of passes run without grad, or of grad-on
//!   passes no backward ran through whose graph the program let go (`Lifecycle::graph_held`:
//!   only a detached output or the inputs stay; a skipped step's payload kept for debugging);
//! - tensors made by the user's code outside any model call (not construction, not optimizer);
//! - tensors made by the autograd engine that are not parameter gradients (a backward hook);
//! - with no stacks at all, growth that cannot be placed;
//! - a tensor re-made larger from its previous version every iteration (`x = torch.cat([x, new])`,
//!   see `regrown`): one block alive at a time, growing;
//!
//! and they must come from `min_leak_occurrences` occurrences or more (a leak repeats).
//! With no trace at all, or one without stacks, it reads the dump (`state_only`): many live blocks
//! from one line.
//! Near misses: the last step's tensors alive at the dump; a bounded cache that evicts.

use std::collections::{BTreeMap, BTreeSet};

use memsnap_model::{Action, BlockState, FrameId, StackId};
use memsnap_replay::BlockLifetime;
use rayon::prelude::*;
use rustc_hash::{FxHashMap, FxHashSet};

use super::{state_only, Context, Detector, Finding};
use crate::attribution::Attr;
use crate::evidence::{BeforeTrace, Cleared, Evidence, HeldLevel, LeakOrigin, Occurrence, Severity, SuspectKind};
use crate::lifecycle::{BlockFate, UnitFate};
use crate::phases::IterationSource;

pub struct ReferenceLeak;

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Key {
    Line(Option<FrameId>, Origin),
    Unattributed,
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Origin {
    Trained,
    NoGrad,
    GraphReleased,
    User,
    Backward,
    Optimizer,
    Construction,
    Worker,
}

impl Origin {
    /// The finding's origin where the group's origin alone decides it; `None` for optimizer
    /// state, whose kind depends on what the group shows (L-BFGS history, state remade or
    /// orphaned).
    fn leak_origin(self) -> Option<LeakOrigin> {
        match self {
            Origin::Trained => Some(LeakOrigin::TrainedForward),
            Origin::NoGrad => Some(LeakOrigin::NoGradForward),
            Origin::GraphReleased => Some(LeakOrigin::ReleasedGraphForward),
            Origin::User => Some(LeakOrigin::UserCode),
            Origin::Backward => Some(LeakOrigin::Backward),
            Origin::Construction => Some(LeakOrigin::ModelsKept),
            Origin::Worker => Some(LeakOrigin::WorkerThread),
            Origin::Optimizer => None,
        }
    }
}

#[derive(Default)]
struct Group {
    blocks: Vec<usize>,
    /// Occurrences (iterations or passes) that left a block allocated, and all occurrences the
    /// line allocated in: each pushed when it differs from the last one pushed (blocks come in
    /// runs of one occurrence), made distinct and sorted by [`Groups::finish`].
    kept: Vec<usize>,
    eligible: Vec<usize>,
    largest: (u64, StackId),
    pass_occurrences: bool,
    /// A block of the site that was not kept lived on past the end of the occurrence after its
    /// own, then was let go: something held it and then evicted it (a bounded cache, a queue).
    evicted: bool,
    /// Those blocks (see [`at_capacity`]).
    evicted_blocks: Vec<usize>,
}

/// Push `x` unless it is the last element already.
fn push_new(v: &mut Vec<usize>, x: usize) {
    if v.last() != Some(&x) {
        v.push(x);
    }
}

/// Groups by key, as a table with a hash index: millions of blocks are added one by one, nearly
/// always to the group of the block before, so the last group found is tried first.
#[derive(Default)]
struct Groups {
    table: Vec<(Key, Group)>,
    index: FxHashMap<Key, usize>,
    last: Option<usize>,
}

impl Groups {
    fn get(&mut self, key: Key) -> &mut Group {
        let at = match self.last.filter(|&i| self.table[i].0 == key) {
            Some(i) => i,
            None => {
                let next = self.table.len();
                let i = *self.index.entry(key).or_insert(next);
                if i == next {
                    self.table.push((key, Group::default()));
                }
                i
            }
        };
        self.last = Some(at);
        &mut self.table[at].1
    }

    /// Add block `bi` of `size` bytes, allocated in occurrence `occ`; `kept`: still allocated
    /// where it should have been let go; `evicted`: see [`Group::evicted`].
    #[allow(clippy::too_many_arguments)]
    fn add(
        &mut self,
        key: Key,
        bi: usize,
        size: u64,
        occ: usize,
        kept: bool,
        evicted: bool,
        pass: bool,
        stack: StackId,
    ) {
        let g = self.get(key);
        push_new(&mut g.eligible, occ);
        g.pass_occurrences = pass;
        g.evicted |= evicted;
        if evicted {
            g.evicted_blocks.push(bi);
        }
        if kept {
            push_new(&mut g.kept, occ);
            g.blocks.push(bi);
            if size > g.largest.0 {
                g.largest = (size, stack);
            }
        }
    }

    /// These groups followed by `later`'s, as if `later`'s blocks had been added after these.
    fn then(mut self, later: Groups) -> Groups {
        for (key, l) in later.table {
            let g = self.get(key);
            g.blocks.extend(l.blocks);
            g.kept.extend(l.kept);
            g.eligible.extend(l.eligible);
            if l.largest.0 > g.largest.0 {
                g.largest = l.largest;
            }
            g.pass_occurrences = l.pass_occurrences;
            g.evicted |= l.evicted;
            g.evicted_blocks.extend(l.evicted_blocks);
        }
        self
    }

    /// The groups in key order, with distinct, ascending occurrences.
    fn finish(mut self) -> Vec<(Key, Group)> {
        for (_, g) in &mut self.table {
            for v in [&mut g.kept, &mut g.eligible] {
                v.sort_unstable();
                v.dedup();
            }
        }
        self.table.sort_by_key(|(k, _)| *k);
        self.table
    }
}

impl Detector for ReferenceLeak {
    fn kind(&self) -> SuspectKind {
        SuspectKind::ReferenceLeak
    }

    fn detect(&self, cx: &Context) -> Vec<Finding> {
        // A state-only recording (`enabled="state"`) has no allocation in its trace, at most a
        // marker entry: only the dump can speak.
        // A trace whose events carry no stacks while the dump's blocks do (recorded with
        // `context="state"`: the allocator keeps a stack only for blocks still allocated) cannot
        // place any event, but the dump can speak as in a state-only file, with each live
        // block's stack read from the dump by its address. Groups shaped like kept autograd
        // graphs are `retained_graph`'s (see `state_only`).
        if let Some(state) = cx.state_reading() {
            return state
                .groups
                .iter()
                .filter(|g| g.graph.is_none())
                .map(|g| state_only_finding(cx, state.origin, g))
                .collect();
        }
        let lc = cx.lifecycle;
        // Kept outputs of no-grad passes counted per call of the helper that runs the model
        // several times (see `Lifecycle::call_groups`): used when a pass-level count shows no
        // repetition because only one pass per call keeps something (the last decoding step's
        // KV cache, stored per request).
        let calls = lc.call_groups(cx.events, cx.stacks);
        // Kept only because a retained graph that a reference holds keeps them: its inputs, what
        // its create_graph backward saved, their gradients (`Context::held_by_retained_graph`).
        let held = cx.held_by_retained_graph();
        // The first event of occurrence `k`: a unit (`pass`), or an iteration.
        let occurrence_start = |k: usize, pass: bool| {
            if pass {
                lc.units.get(k).map(|u| u.span.start)
            } else {
                cx.phases.boundaries.get(k).copied()
            }
        };
        // Freed at or after the start of the second occurrence after `occ`: a rebound variable
        // lets its tensor go in the next occurrence, an evicting cache or queue later.
        let evicted_after = |freed: Option<u32>, occ: usize, pass: bool| {
            freed.zip(occurrence_start(occ + 2, pass)).is_some_and(|(f, s)| f >= s)
        };
        // Blocks are grouped in parallel runs merged in order, so every group lists its blocks in
        // the order of a sequential pass: forward passes' blocks first, then the others.
        // Forward passes whose graphs no longer hold their tensors (and, per call, those of
        // no-grad passes).
        let (in_passes, per_call) = lc
            .units
            .par_iter()
            .enumerate()
            .fold(
                || (Groups::default(), Groups::default()),
                |(mut groups, mut per_call), (u, unit)| {
                    let origin = match unit.fate {
                        UnitFate::Consumed { .. } => Origin::Trained,
                        UnitFate::Unconsumed | UnitFate::Abandoned if beside_held_graph(cx, u) => {
                            return (groups, per_call)
                        }
                        // Seen in part: its grad mode is its call site's where every other pass
                        // from there ran without grad (a service's `no_grad` requests), and
                        // unknown otherwise (an evaluation with grad on, its first blocks cut,
                        // keeps too few to look it).
                        UnitFate::Unconsumed | UnitFate::Abandoned
                            if unit.begun_before_trace && lc.call_site_runs_without_grad(u) =>
                        {
                            Origin::NoGrad
                        }
                        UnitFate::Unconsumed | UnitFate::Abandoned if unit.begun_before_trace => {
                            return (groups, per_call)
                        }
                        UnitFate::Unconsumed if !unit.grad_on => Origin::NoGrad,
                        // Grad on, no backward, and the graph let go: what stays is held by a
                        // reference to the tensors themselves (a detached output, the inputs).
                        UnitFate::Unconsumed | UnitFate::Abandoned if !lc.graph_held(u) => Origin::GraphReleased,
                        _ => return (groups, per_call),
                    };
                    let last_op =
                        cx.phases.forwards[unit.pass].last_alloc.map(|la| cx.stacks.get(cx.events[la as usize].stack));
                    // Asked only of blocks the model's own code made (see `runs_per_stack`).
                    let runs = std::cell::OnceCell::new();
                    for ub in &lc.blocks[u] {
                        let b = &cx.replay.blocks[ub.block];
                        let stack = cx.event_stack(b);
                        let info = cx.stacks.get(stack);
                        // A kept model output is fixed where the model is called; an intermediate
                        // where the model's code made it. An output is what the pass's last
                        // operation made, or, when that operation is a statement of the model's
                        // own `forward` (a model that computes its loss and returns
                        // `(logits, loss)`; own: at depth one, or, under a wrapper such as
                        // `torch.compile`'s, made outside any submodule, its innermost module call
                        // the model call itself), what another such statement made: the model's
                        // top-level results, where intermediates come from its submodules, or
                        // from a statement the `forward` runs in a loop (attention weights per
                        // decoding step, kept by the model in a list of its own: ag08). What a
                        // hook or a dispatch handler made is fixed at its own line, and so is
                        // what the model's own code made outside a submodule that is no output.
                        let own_code = info.module_call.is_some() && info.module_call == unit.call_site;
                        let once = !own_code
                            || runs
                                .get_or_init(|| runs_per_stack(cx, &lc.blocks[u]))
                                .get(&stack)
                                .is_none_or(|&n| n <= MAX_RESULT_RUNS);
                        let output = ub.in_pass
                            && last_op.is_some_and(|l| {
                                l.innermost_python.is_some()
                                    && l.innermost_python == info.innermost_python
                                    && l.module_call == info.module_call
                                    || (l.model_depth == 1 && info.model_depth == 1
                                        || own_code && l.module_call == unit.call_site)
                                        && once
                            });
                        let line = if !ub.in_pass || info.in_module_hook || info.in_dispatch_handler {
                            info.site
                        } else if output {
                            unit.call_site.or(info.site)
                        } else if own_code {
                            info.site.or(info.module_call)
                        } else {
                            info.module_call.or(info.site)
                        };
                        // A trained unit's blocks count in its pass's iteration: iterations start
                        // at their first forward pass, so what the loop makes for the pass before
                        // calling the model (the batch, a mask) would otherwise fall in the
                        // previous iteration, or in none for the first one.
                        let (occ, pass) = match origin {
                            Origin::NoGrad | Origin::GraphReleased => (u, true),
                            _ => match cx.phases.iteration_of(cx.phases.forwards[unit.pass].span.start) {
                                Some(it) => (it, false),
                                None => continue,
                            },
                        };
                        let kept = ub.fate == BlockFate::Kept;
                        let evicted = !kept && evicted_after(b.freed_at(), occ, pass);
                        if kept && origin == Origin::Trained && held[ub.block].is_some() {
                            continue;
                        }
                        // A training unit also holds what the user's code made for the pass
                        // outside the module calls (the batch, a mask): not forward outputs. The
                        // occurrence is the iteration either way, as for user code elsewhere.
                        // A model built before the pass (`.cuda()` of a new model, then its
                        // first step) is construction, whatever pass follows it.
                        let origin = match origin {
                            _ if !ub.in_pass && info.construction && !info.forward => Origin::Construction,
                            Origin::Trained if !ub.in_pass => Origin::User,
                            _ => origin,
                        };
                        groups.add(Key::Line(line, origin), ub.block, b.size, occ, kept, evicted, pass, stack);
                        if origin == Origin::NoGrad {
                            per_call.add(
                                Key::Line(line, origin),
                                ub.block,
                                b.size,
                                calls[u],
                                kept,
                                evicted,
                                false,
                                stack,
                            );
                        }
                    }
                    (groups, per_call)
                },
            )
            .reduce(|| (Groups::default(), Groups::default()), |(a, b), (c, d)| (a.then(c), b.then(d)));
        // Tensors outside forward passes.
        let gradient_lines: Vec<Option<FrameId>> =
            cx.kept_backward_groups().iter().filter(|g| g.gradient_like).map(|g| g.line).collect();
        // What a backward line keeps that no reference does: the parameters' gradients of the
        // last iteration (`.grad`, alive until the next `zero_grad`) and one-off blocks (the
        // cuBLAS workspace its first backward made). Left out of what the engine's kept blocks
        // count (k01: 32 MiB of kept activation gradients, beside 52 MiB of those).
        let current_grads = current_parameter_gradients(cx);
        let legitimately_kept = |bi: usize| lc.is_one_off(bi) || current_grads.binary_search(&bi).is_ok();
        let outside = cx
            .replay
            .blocks
            .par_iter()
            .enumerate()
            .fold(Groups::default, |mut groups, (bi, b)| {
                if lc.unit_of(bi).is_some() || held[bi].is_some() {
                    return groups;
                }
                let Some(it) = cx.iteration_of(b) else { return groups };
                let stack = cx.event_stack(b);
                let info = cx.stacks.get(stack);
                let key = match cx.attr(b) {
                    // A thread the program started (an evaluation worker): a model output it
                    // made is placed at the worker's model call, anything else at its line.
                    Attr::Site(s) if b.alloc_event().is_some_and(|a| cx.phases.on_worker(a)) => {
                        Key::Line(info.forward_call.or(Some(s)), Origin::Worker)
                    }
                    Attr::Backward(line) if !gradient_lines.contains(&line) => {
                        if legitimately_kept(bi) {
                            return groups;
                        }
                        Key::Line(line, Origin::Backward)
                    }
                    Attr::Site(s) if !info.optimizer && !info.forward && !info.construction && !info.recompute => {
                        Key::Line(Some(s), Origin::User)
                    }
                    // Optimizer state is made lazily, the first time a step meets a parameter
                    // with a gradient: once for a fixed set of parameters (one iteration, or a
                    // few when layers are unfrozen later), and in every iteration only when the
                    // optimizer is handed new parameters every iteration and keeps them
                    // (`add_param_group` in the loop). Its scratch is freed within the step.
                    Attr::Site(s) if info.optimizer && !info.forward && !info.construction && !info.recompute => {
                        Key::Line(Some(s), Origin::Optimizer)
                    }
                    // A model built at this line (`Module.__init__`, `.to()`/`.cuda()`) between
                    // iterations: its parameters and buffers. Built once, it is not growth;
                    // built again and again while the earlier ones are rebound away, one copy is
                    // alive at a time (n08); every copy kept is a model kept per round (a sweep
                    // or k-fold loop that stores each trained model: n07).
                    Attr::Site(s) if info.construction && !info.optimizer && !info.forward && !info.recompute => {
                        Key::Line(Some(s), Origin::Construction)
                    }
                    Attr::NoFrames => Key::Unattributed,
                    _ => return groups,
                };
                let kept = b.freed_at().is_none();
                groups.add(key, bi, b.size, it, kept, !kept && evicted_after(b.freed_at(), it, false), false, stack);
                groups
            })
            .reduce(Groups::default, Groups::then);
        let mut groups: BTreeMap<Key, Group> = in_passes.then(outside).finish().into_iter().collect();
        // Optimizer state grows only when the optimizer is handed new parameters iteration after
        // iteration. A step makes state for every parameter it has not seen with a gradient, so
        // a bounded set also makes state in a few scattered iterations (layers unfrozen one group
        // per epoch, a head first trained late), and an optimizer without scratch (SGD) allocates
        // nothing in the others: its own iterations would all count as kept. So its share is
        // taken over every iteration from the first it made state in to the end of the trace.
        let iterations = cx.phases.iteration_count();
        for (key, g) in groups.iter_mut() {
            if let (Key::Line(_, Origin::Optimizer), Some(&first)) = (key, g.kept.first()) {
                g.eligible = (first..iterations.max(first + 1)).collect();
            }
        }

        // Optimizer state made again for parameters the optimizer had already met (see
        // `remade_state`), per `step()` line.
        let remade: BTreeMap<Key, Vec<usize>> = groups
            .iter()
            .filter(|(key, g)| {
                matches!(key, Key::Line(_, Origin::Optimizer))
                    && !g.evicted
                    && g.kept.len() >= cx.thresholds.min_leak_occurrences
            })
            .map(|(key, g)| (*key, remade_state(cx, g)))
            .collect();

        // Optimizer state kept after its parameters were freed (see `orphaned_state`), per
        // `step()` line.
        let orphaned: BTreeMap<Key, Vec<usize>> = groups
            .iter()
            .filter(|(key, g)| {
                matches!(key, Key::Line(_, Origin::Optimizer))
                    && !g.evicted
                    && g.kept.len() >= cx.thresholds.min_leak_occurrences
            })
            .map(|(key, g)| (*key, orphaned_state(cx, g)))
            .filter(|(_, its)| its.len() >= cx.thresholds.min_leak_occurrences)
            .collect();

        // Lines that let go of what they kept only by resetting it (see `cleared_at_once`), each
        // asked once: growth and the finding's facts read the same answer.
        let cleared: BTreeMap<Key, Cleared> =
            groups.iter().filter_map(|(key, g)| Some((*key, cleared_at_once(cx, key, g)?))).collect();

        // Lines that overwrite what they hold, kept in too small a share of their occurrences to
        // tell, yet holding more at the start of each (see `held_level`), each asked once.
        // (Also asked, below, of lines that grow by their share of kept occurrences and read as
        // full: indexed with the others.)
        let let_go =
            LetGoIndex::of(cx, groups.iter().filter(|(key, g)| may_hold_a_rising_level(cx, key, g)).map(|(_, g)| g));
        let asked: BTreeSet<Key> = groups
            .iter()
            .filter(|(key, g)| {
                may_hold_a_rising_level(cx, key, g)
                    && !cx.is_growth(g.kept.len(), g.eligible.len())
                    && !cleared.contains_key(key)
            })
            .map(|(key, _)| *key)
            .collect();
        let levels: BTreeMap<Key, (HeldLevel, Vec<usize>)> = asked
            .iter()
            .filter_map(|key| {
                let g = &groups[key];
                Some((*key, held_level(cx, g, &let_go, |k| occurrence_start(k, g.pass_occurrences))?))
            })
            .collect();

        // A wrapped ring's trace may hold too few of a line's occurrences; the like blocks the
        // line kept alive from before the trace's first event are earlier ones
        // (`made_before_trace`): for outputs of passes, as many as they hold the blocks an
        // occurrence keeps in the trace, at least one (al06: a trainer's validation outputs, 8
        // blocks a pass, 24 made before a ring that holds one validation pass); for user code,
        // one. Unless a block of like size made before the trace was let go once the line had
        // begun keeping in the trace (`let_go_since`): perhaps a store that evicts what it held.
        // (`made_before_trace` finds blocks only for outputs of passes and for user code.)
        let occurrences_before_the_trace = |key: &Key, g: &Group| -> Option<usize> {
            let Key::Line(Some(line), o) = *key else { return None };
            let origin = o.leak_origin()?;
            let first_kept = g.blocks.iter().filter_map(|&bi| cx.replay.blocks[bi].alloc_event()).min()?;
            let before = made_before_trace(cx, line, origin, &g.blocks)?;
            if let_go_since(cx, &g.blocks, first_kept) {
                return None;
            }
            // Only for outputs of passes whose graphs no longer hold them (run without grad, or
            // already backpropagated): what user code made may be saved by a graph kept with
            // it (a loss's `log_softmax` awaiting a deferred backward: z07, u11 cut to their
            // last fifth), which the dump cannot tell from a kept reference.
            if origin == LeakOrigin::UserCode {
                return Some(1);
            }
            let per_occurrence = (g.blocks.len() / g.kept.len().max(1)).max(1) as u64;
            Some((before.blocks / per_occurrence).max(1) as usize)
        };
        // Asked once per group (each question scans the replay's blocks), and only of groups
        // that one more occurrence would make grow, or that kept in every occurrence the trace
        // holds.
        let grows_with_before_trace: BTreeSet<Key> = groups
            .iter()
            .filter(|(key, g)| {
                !g.evicted
                    && !cx.is_growth(g.kept.len(), g.eligible.len())
                    && (cx.is_growth(g.kept.len() + 1, g.eligible.len() + 1) || g.kept.len() == g.eligible.len())
                    && occurrences_before_the_trace(key, g)
                        .is_some_and(|n| cx.is_growth(g.kept.len() + n, g.eligible.len() + n))
            })
            .map(|(key, _)| *key)
            .collect();
        // Growth: kept in a large enough share of the occurrences; or, for tensors of forward
        // passes and of user code, none of which was ever let go, kept on to the end of the
        // trace (a leak that starts after a warm-up, or keeps one step in a few); or, for
        // optimizer state, made again and again for the same parameters and never let go, on
        // to the end; or, in a wrapped ring, kept in a large enough share once the like blocks
        // the line kept before the trace count as one more occurrence.
        // Iterations read from the loop's statements alone (no backward, no model call: see
        // `phases::loop_iterations`) come with no pass to tell a working set from growth; there a
        // line that keeps a sample of like tensors it makes and lets go holds them by a policy
        // (`kept_by_sampling`).
        let loop_only = cx.phases.iteration_source == IterationSource::Loop;
        let sampled = if loop_only { kept_by_sampling(cx, &groups) } else { BTreeSet::new() };
        let grows_anyhow = |key: &Key, g: &Group| {
            if sampled.contains(key) {
                return false;
            }
            cx.is_growth(g.kept.len(), g.eligible.len())
                || matches!(key, Key::Line(_, Origin::Trained | Origin::NoGrad | Origin::GraphReleased | Origin::User))
                    && cx.is_unevicted_growth(&g.kept, &g.eligible)
                    && (!g.evicted || cleared.contains_key(key))
                || remade.get(key).is_some_and(|r| cx.is_kept_generations(r, &g.eligible))
                || orphaned.contains_key(key)
                || grows_with_before_trace.contains(key)
                || levels.contains_key(key)
        };
        // Unless the line stopped making what it keeps while the loop went on for as long again:
        // a fill that stopped (a cache keyed by the input once every key was met, a dataset
        // cached on the GPU at its first read), bounded by the keys; or what it keeps is a cache
        // full to its capacity (`at_capacity`). Asked only of groups that would grow (few).
        let mut stopped_filling: BTreeSet<Key> = BTreeSet::new();
        for (key, g) in groups.iter().filter(|(key, g)| grows_anyhow(key, g)) {
            let line = match key {
                Key::Line(l, _) => *l,
                Key::Unattributed => None,
            };
            let stopped = if g.pass_occurrences {
                loop_went_on_without_the_model(cx, line, &g.eligible)
            } else {
                iterations_went_on_without_the_line(cx, &g.eligible, grows_with_before_trace.contains(key))
            };
            let built_into_model = matches!(key, Key::Line(_, Origin::Construction)) && built_into_the_model(cx, g);
            // A rising level was read over the whole trace: it is what `at_capacity` asks, read
            // from every occurrence rather than from those that kept something. So a line read
            // as full over a stretch of its kept occurrences is not, where what it holds at every
            // start still reached new highs to the end (a store counting its own short-lived
            // entries as let go while it also gains entries).
            let start = |k| occurrence_start(k, g.pass_occurrences);
            // A line asked above whose level did not rise is not asked again.
            let full = !levels.contains_key(key)
                && at_capacity(cx, g, start)
                && (asked.contains(key)
                    || !(may_hold_a_rising_level(cx, key, g) && held_level(cx, g, &let_go, start).is_some()));
            let per_shape = loop_only && matches!(key, Key::Line(_, Origin::User)) && keyed_by_shape(cx, g);
            if stopped || built_into_model || full || per_shape {
                stopped_filling.insert(*key);
            }
        }
        let grows = |key: &Key, g: &Group| !stopped_filling.contains(key) && grows_anyhow(key, g);
        // Per-call counts replace per-pass counts where only they show repetition.
        let mut call_keys: BTreeSet<Key> = BTreeSet::new();
        for (key, pc) in per_call.finish() {
            let passes = groups.get(&key);
            let pass_growth = passes.is_some_and(|g| grows(&key, g));
            if !pass_growth && pc.eligible.len() < lc.units.len() && cx.is_growth(pc.kept.len(), pc.eligible.len()) {
                groups.insert(key, pc);
                call_keys.insert(key);
            }
        }

        let mut out = Vec::new();
        let mut reported: BTreeSet<Option<FrameId>> = BTreeSet::new();
        for (key, g) in &groups {
            if let Key::Line(l, _) = key {
                if grows(key, g) {
                    reported.insert(*l);
                }
            }
        }
        out.extend(regrown(cx, &reported));
        // Kept blocks the user's code made, by size, with their allocations: among them a leaf
        // made with `requires_grad` and kept (FGSM's `delta`, a gradient-penalty `xhat`).
        let mut user_kept: FxHashMap<u64, Vec<u32>> = FxHashMap::default();
        for (key, g) in &groups {
            if matches!(key, Key::Line(_, Origin::User)) {
                for &bi in &g.blocks {
                    let b = &cx.replay.blocks[bi];
                    if let Some(a) = b.alloc_event() {
                        user_kept.entry(b.size).or_default().push(a);
                    }
                }
            }
        }
        // The engine's kept blocks are kept leaves' `.grad`s: AccumulateGrad gives a leaf a
        // gradient of its own size in the backward, and it lives as long as the leaf. In every
        // iteration the group kept something, a kept block pairs with a kept block of its size
        // that the user's code made before it, since the start of the iteration before (a
        // leaf made for the pass before the model is called falls in the previous iteration,
        // which starts at the pass: ab08's `delta`). A one-off block beside them, such as the
        // first backward's cuBLAS workspace, pairs with nothing.
        let leaf_gradients = |g: &Group| {
            let paired: BTreeSet<usize> = g
                .blocks
                .iter()
                .filter_map(|&bi| {
                    let b = &cx.replay.blocks[bi];
                    let (it, a) = (cx.iteration_of(b)?, b.alloc_event()?);
                    let since = it.checked_sub(1).and_then(|p| cx.phases.boundaries.get(p)).copied().unwrap_or(0);
                    user_kept.get(&b.size).is_some_and(|made| made.iter().any(|&m| since <= m && m < a)).then_some(it)
                })
                .collect();
            !g.kept.is_empty() && g.kept.iter().all(|it| paired.contains(it))
        };
        // Lines each keeping too little to report, but in the very same occurrences (see
        // `kept_together`): one finding, at the line that keeps the most, holding them all.
        let together = kept_together(cx, &groups, |key, g| grows(key, g) && !call_keys.contains(key));
        let mut companions: BTreeMap<Key, Vec<Option<FrameId>>> = BTreeMap::new();
        for (leader, members) in &together {
            for member in members {
                if let Some(m) = groups.remove(member) {
                    let l = groups.get_mut(leader).expect("a leader is a group");
                    l.blocks.extend(m.blocks);
                    l.blocks.sort_unstable();
                    if m.largest.0 > l.largest.0 {
                        l.largest = m.largest;
                    }
                    if let Key::Line(line, _) = member {
                        companions.entry(*leader).or_default().push(*line);
                    }
                }
            }
        }
        for (key, g) in groups {
            if !grows(&key, &g) {
                continue;
            }
            let (line, origin) = match key {
                Key::Line(l, o) => (
                    l,
                    // Optimizer state (`None`): which kind it is depends on what the group shows.
                    match o.leak_origin() {
                        Some(LeakOrigin::Backward) if cx.stacks.get(cx.backward_stack(l)).grad_call => {
                            LeakOrigin::GradResults
                        }
                        Some(LeakOrigin::Backward) if leaf_gradients(&g) => LeakOrigin::LeafGradients,
                        Some(origin) => origin,
                        None if cx.stacks.get(g.largest.1).lbfgs => LeakOrigin::OptimizerHistory,
                        None if orphaned.contains_key(&key) => LeakOrigin::OptimizerStateOrphaned,
                        // Made in every iteration for the same parameters: no new parameters,
                        // so not their state. The user's own step keeps something per step
                        // (k04), or a new optimizer is made each iteration.
                        None if remade.get(&key).is_some_and(|r| r.len() == g.kept.len()) => {
                            if cx.stacks.get(g.largest.1).optimizer_code {
                                LeakOrigin::OptimizerKeepsPerStep
                            } else {
                                LeakOrigin::OptimizerStateRemade
                            }
                        }
                        None if cx.is_growth(g.kept.len(), g.eligible.len()) => LeakOrigin::OptimizerState,
                        None => LeakOrigin::OptimizerStateRemade,
                    },
                ),
                Key::Unattributed => (None, LeakOrigin::Unattributed),
            };
            let occurrence = if call_keys.contains(&key) {
                Occurrence::Call
            } else if g.pass_occurrences {
                Occurrence::Pass
            } else {
                Occurrence::Iteration
            };
            let boundaries = if call_keys.contains(&key) {
                // One boundary per call: the start of its first unit.
                let mut seen = BTreeSet::new();
                lc.units
                    .iter()
                    .enumerate()
                    .filter(|(u, _)| g.eligible.binary_search(&calls[*u]).is_ok() && seen.insert(calls[*u]))
                    .map(|(_, unit)| unit.span.start)
                    .collect()
            } else if g.pass_occurrences || cx.phases.boundaries.len() < 2 {
                lc.units.iter().filter(|u| g.eligible.binary_search(&u.pass).is_ok()).map(|u| u.span.start).collect()
            } else {
                cx.iteration_boundaries()
            };
            // Growth that starts late (only the rule for tensors never let go found it) is
            // measured from where the keeping that goes on to the end began: the first kept
            // occurrence after the longest pause between two (a block kept once at the start, then
            // nothing until a warm-up ended), else the first kept one.
            let level = levels.get(&key);
            let boundaries: Vec<u32> = match resumed_after_longest_pause(&g.kept, &g.eligible) {
                Some(first)
                    if !call_keys.contains(&key)
                        && !cx.is_growth(g.kept.len(), g.eligible.len())
                        && level.is_none() =>
                {
                    let from = occurrence_start(first, g.pass_occurrences);
                    boundaries.into_iter().filter(|&b| from.is_none_or(|f| b >= f)).collect()
                }
                _ => boundaries,
            };
            // A kept output is named at the line that calls the model, an intermediate at the
            // model's line that called the submodule that made it; the statement inside that made
            // it may be what keeps it (`self.trace.append(h)` in the model's own forward, a
            // router's `probs` appended to a list of its module's: ah08), so it is said too.
            let largest = cx.stacks.get(g.largest.1);
            let made_at = match origin {
                LeakOrigin::TrainedForward | LeakOrigin::NoGradForward | LeakOrigin::ReleasedGraphForward
                    if line.is_some()
                        && (largest.forward_call == line || largest.module_call == line)
                        && largest.site != line =>
                {
                    largest.site.map(|made| cx.site(made))
                }
                _ => None,
            };
            let mut confidence = match level {
                Some((l, _)) => cx.growth_confidence(l.new_highs, l.later),
                None => cx.growth_confidence(g.kept.len(), g.eligible.len()),
            };
            if origin == LeakOrigin::Unattributed {
                confidence = confidence.min(cx.thresholds.state_only_confidence);
            }
            out.push(Finding {
                occurrences: g.kept.len(),
                kind: SuspectKind::ReferenceLeak,
                // L-BFGS's history grows by design and stops at `history_size` pairs: bounded.
                severity: if origin == LeakOrigin::OptimizerHistory { Severity::Waste } else { Severity::Leak },
                confidence,
                occurrence,
                boundaries,
                bytes: None,
                site: line.map(|f| cx.site(f)),
                stack: match origin {
                    LeakOrigin::Backward | LeakOrigin::GradResults | LeakOrigin::LeafGradients => {
                        cx.backward_stack(line)
                    }
                    _ => g.largest.1,
                },
                facts: Evidence::ReferenceLeak {
                    origin,
                    blocks: g.blocks.len() as u64,
                    occurrences: g.kept.len(),
                    eligible: g.eligible.len(),
                    occurrence,
                    made_at,
                    before_trace: line.and_then(|l| made_before_trace(cx, l, origin, &g.blocks)),
                    operations: None,
                    tensors: None,
                    cleared: cleared.get(&key).copied(),
                    level: level.map(|(l, _)| *l),
                    kept_with: companions
                        .remove(&key)
                        .unwrap_or_default()
                        .into_iter()
                        .flatten()
                        .map(|f| cx.site(f))
                        .collect(),
                },
                // A rising level is measured over all the line's tensors made in the trace: the
                // growth per occurrence is what it held more at each start.
                blocks: level.map_or(g.blocks, |(_, held)| held.clone()),
            });
        }
        out
    }
}

/// Whether unit `u` allocated too few blocks for its grad mode to be read from them
/// (`min_pass_blocks`) and the unit right before or after it, with no backward between them,
/// ran with grad on, unconsumed, its graph held ([`Lifecycle::graph_held`]).
///
/// Mechanism. Grad mode is the thread's, set by `torch.no_grad()` / `inference_mode()` around
/// a region of code, not per module call: module calls that run one after the other with no
/// backward between share it. A call of one or two blocks between large ones (an embedding
/// lookup before each decoder cell's step, an output head after it: an08's greedy decode
/// without `no_grad`, its steps kept through the stacked logits) is no pass run without grad,
/// and what it keeps is saved by the graph its neighbours' kept graphs belong to, which
/// `retained_graph` and `no_grad_missing` read; not a reference of its own.
///
/// [`Lifecycle::graph_held`]: crate::lifecycle::Lifecycle::graph_held
fn beside_held_graph(cx: &Context, u: usize) -> bool {
    let lc = cx.lifecycle;
    let unit = &lc.units[u];
    if unit.pass_blocks >= cx.thresholds.min_pass_blocks {
        return false;
    }
    let backwards_before = |e: u32| cx.phases.backwards.partition_point(|b| b.span.start < e);
    let held = |v: usize| {
        let n = &lc.units[v];
        n.grad_on && n.fate == UnitFate::Unconsumed && lc.graph_held(v)
    };
    let before = u
        .checked_sub(1)
        .is_some_and(|p| held(p) && backwards_before(lc.units[p].span.end) == backwards_before(unit.span.start));
    let after = u + 1 < lc.units.len()
        && held(u + 1)
        && backwards_before(unit.span.end) == backwards_before(lc.units[u + 1].span.start);
    before || after
}

/// Groups that grow (`grows`) yet each keep less than `min_suspect_bytes`, in the very same
/// occurrences as at least one other such group of the same kind of occurrence, whose kept bytes
/// together reach it: per set, the group keeping the most (the leader) and the others.
///
/// Mechanism. One Python object appended per step keeps every tensor it refers to, made at as
/// many lines: a replay buffer's `(obs, action, reward, next_obs, done)` transition (an10: five
/// lines of 4-16 KiB a step, 48 KiB a step together, none of them 1 MiB after 40 steps). The
/// tensors of one record are kept in the same occurrences and let go together, or never;
/// lines kept by separate references rarely keep in exactly the same occurrences unless each
/// keeps in every one, and there the record's size is what grows. Lines that keep enough alone
/// are left as they are, each its own finding. Not where the program keeps graphs to the end
/// (a block `Context::held_by_retained_graph` gives to a held graph is alive at the end): small
/// tensors kept beside them in the same steps are likely more of their inputs (r01's candidate
/// points and their `requires_grad` copies, saved by the kept residuals' `create_graph` graphs),
/// which that reading may miss, not a record.
fn kept_together(
    cx: &Context,
    groups: &BTreeMap<Key, Group>,
    grows: impl Fn(&Key, &Group) -> bool,
) -> BTreeMap<Key, Vec<Key>> {
    let held = cx.held_by_retained_graph();
    if cx.replay.blocks.iter().zip(held).any(|(b, h)| h.is_some() && b.freed_at().is_none()) {
        return BTreeMap::new();
    }
    let kept_bytes = |g: &Group| g.blocks.iter().map(|&bi| cx.replay.blocks[bi].size).sum::<u64>();
    // Per kind of occurrence and kept occurrences: (kept bytes, key) of each such group.
    type Members = Vec<(u64, Key)>;
    let mut sets: BTreeMap<(bool, &[usize]), Members> = BTreeMap::new();
    for (key, g) in groups {
        let tensors =
            matches!(key, Key::Line(Some(_), Origin::Trained | Origin::NoGrad | Origin::GraphReleased | Origin::User));
        let bytes = kept_bytes(g);
        if tensors && bytes < cx.thresholds.min_suspect_bytes && grows(key, g) {
            sets.entry((g.pass_occurrences, g.kept.as_slice())).or_default().push((bytes, *key));
        }
    }
    let mut out = BTreeMap::new();
    for (_, mut members) in sets {
        if members.len() < 2 || members.iter().map(|m| m.0).sum::<u64>() < cx.thresholds.min_suspect_bytes {
            continue;
        }
        // The most bytes first; equal bytes in key order (deterministic).
        members.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        let leader = members[0].1;
        out.insert(leader, members[1..].iter().map(|m| m.1).collect());
    }
    out
}

/// Whether group `g`, whose occurrences are training iterations, let go of what it kept only by
/// clearing it: every block it let go late ([`Group::evicted`]) was freed together with every
/// block of the group made before it, before the group's next allocation, and each such clear let
/// go of blocks made in at least `min_leak_occurrences` iterations.
///
/// Mechanism. An accumulator the program resets now and then (`self.total_loss += loss` set back
/// to 0 at the epoch's end, a list of a step's outputs emptied once per epoch) drops every
/// reference it held at once: the allocator records the frees of all its tensors in a row, with
/// nothing of the line made between them. Until the reset it keeps one per iteration, so the
/// level rises by that much every step, for as many steps as the period has (am05: 4 MiB per
/// step of an 8-step epoch, the softmax kept by a hand-written loss's `ctx` through the
/// accumulated graph). A bounded cache or queue instead lets go of its oldest entries while it
/// keeps later ones ([`at_capacity`]): there a kept block made before the free fails the test.
/// Asked only of what the user's code made outside the model in training iterations (the loss's
/// insides, what it derived from the batch), not of passes' tensors: the model's outputs, or an
/// evaluation's, are what an epoch-end metric gathers and resets after `compute()` (Lightning's
/// `training_step_outputs` cleared in `on_train_epoch_end`; torchmetrics' states over the
/// validation split: ai09), a working set bounded by the epoch by design; and where the
/// trace shows optimizer steps, only of resets that at least `min_leak_occurrences` of them ran
/// before, since the first tensor they let go was made: with gradient accumulation, each
/// micro-batch is an iteration (a backward) and what the micro-batches keep until the step that
/// uses their summed gradients, then let go, is that step's working set.
fn cleared_at_once(cx: &Context, key: &Key, g: &Group) -> Option<Cleared> {
    if !matches!(key, Key::Line(_, Origin::User)) || g.pass_occurrences || g.evicted_blocks.is_empty() {
        return None;
    }
    let blocks = &cx.replay.blocks;
    let mut made: Vec<u32> =
        g.blocks.iter().chain(&g.evicted_blocks).filter_map(|&bi| blocks[bi].alloc_event()).collect();
    made.sort_unstable();
    // The clears, keyed by the group's next allocation after their frees (`u32::MAX`: none):
    // the iterations that made what each let go (those it let go within two iterations of their
    // own are not among the late ones), the last iteration it ran in, and the events of the
    // first of those tensors' allocation and of the last free.
    #[derive(Default)]
    struct Clear {
        made_in: BTreeSet<usize>,
        ran_in: usize,
        first_made: u32,
        freed: u32,
    }
    let mut clears: BTreeMap<u32, Clear> = BTreeMap::new();
    for &bi in &g.evicted_blocks {
        let (made_at, freed) = (blocks[bi].alloc_event()?, blocks[bi].freed_at()?);
        let next = made.get(made.partition_point(|&m| m < freed)).copied().unwrap_or(u32::MAX);
        let clear = clears.entry(next).or_insert(Clear { first_made: made_at, ..Clear::default() });
        clear.made_in.insert(cx.iteration_of(&blocks[bi])?);
        clear.ran_in = clear.ran_in.max(cx.phases.iteration_of(freed)?);
        clear.first_made = clear.first_made.min(made_at);
        clear.freed = clear.freed.max(freed);
    }
    let steps = &cx.phases.optimizer_steps;
    let steps_between = |c: &Clear| steps.iter().filter(|s| c.first_made < s.start && s.start < c.freed).count();
    let made_before = |next: u32| move |bi: &&usize| blocks[**bi].alloc_event().is_some_and(|a| a < next);
    let all_let_go = |next: u32| {
        !g.blocks.iter().any(|bi| made_before(next)(&bi))
            && g.evicted_blocks
                .iter()
                .filter(made_before(next))
                .all(|&bi| blocks[bi].freed_at().is_some_and(|f| f < next))
    };
    // A period: from the first iteration whose tensors a clear let go to the one it ran in.
    let period = |c: &Clear| c.made_in.first().map_or(0, |&first| c.ran_in.saturating_sub(first) + 1);
    let least = cx.thresholds.min_leak_occurrences;
    clears
        .iter()
        .all(|(&next, c)| {
            c.made_in.len() >= least && (steps.is_empty() || steps_between(c) >= least) && all_let_go(next)
        })
        .then(|| Cleared { clears: clears.len(), longest_period: clears.values().map(period).max().unwrap_or(0) })
}

/// The last iteration's parameter gradients among the blocks the autograd engine made and kept
/// to the end, ascending block indices.
///
/// Mechanism. A backward gives every parameter that has none a gradient of its size, which
/// stays in `.grad` until the next `zero_grad(set_to_none=True)`: at the dump, those of the last
/// iteration are alive, held by the parameters. A kept activation gradient can have a
/// parameter's size too (y06 keeps a 512 x 1024 `grad_output` beside a 1024 x 512 weight), so
/// per backward line and size, only what the last iteration kept beyond what the iteration
/// before it kept (a leak keeps as many each iteration) is taken for gradients.
fn current_parameter_gradients(cx: &Context) -> Vec<usize> {
    let Some(last) = cx.phases.iteration_count().checked_sub(1) else { return Vec::new() };
    // (line, size) -> (blocks of the iteration before the last, blocks of the last), from the
    // engine's kept blocks per backward line (parameter-sized ones are never held by a graph).
    let mut counts: BTreeMap<(Option<FrameId>, u64), (usize, Vec<usize>)> = BTreeMap::new();
    for g in cx.kept_backward_groups() {
        for &bi in &g.blocks {
            let b = &cx.replay.blocks[bi];
            if !cx.param_sizes.contains(&b.size) {
                continue;
            }
            match cx.iteration_of(b) {
                Some(it) if it == last => counts.entry((g.line, b.size)).or_default().1.push(bi),
                Some(it) if it + 1 == last => counts.entry((g.line, b.size)).or_default().0 += 1,
                _ => {}
            }
        }
    }
    let mut out: Vec<usize> = counts
        .into_values()
        // Which of the last iteration's blocks of a size are the gradients does not change any
        // count: the ones after as many as the iteration before kept.
        .flat_map(|(before, last)| last.into_iter().skip(before))
        .collect();
    out.sort_unstable();
    out
}

/// Did the iterations go on after the last one in which the line allocated, for at least as many
/// iterations as it allocated in (and `min_leak_occurrences`), and for longer than the line ever
/// paused while it allocated? `eligible`: the iterations the line allocated in, ascending.
///
/// Mechanism. A line that fills a cache on a miss (`if i not in self.gpu: self.gpu[i] =
/// x.cuda()`, a dataset cached on the GPU at its first read: q36) allocates only while keys are
/// new, and keeps all it made, so counted over the iterations it allocated in it looks like a
/// leak; once every key has been met it allocates no more while training goes on. A leak keeps
/// making what it keeps for as long as the program runs (p08 keeps one step in three to the end).
/// The near miss: the same line with new keys every iteration (a cache keyed by a request id).
/// A line that keeps something once every few iterations (a model built and kept per trial of a
/// sweep, every 15 training steps: n07) has not stopped while the iterations after its last
/// allocation are no more than its own pause between two allocations. `before_trace`: the line's
/// like blocks made before a wrapped ring's first event count as one more occurrence, as they do
/// for its growth (al10: a dataset cached at its first read, of which the ring kept only the
/// last two filling steps and the eight that read from the full cache).
fn iterations_went_on_without_the_line(cx: &Context, eligible: &[usize], before_trace: bool) -> bool {
    let Some(&last) = eligible.last() else { return false };
    let after = cx.phases.iteration_count().saturating_sub(last + 1);
    let longest_pause = eligible.windows(2).map(|w| w[1] - w[0] - 1).max().unwrap_or(0);
    let occurrences = eligible.len() + usize::from(before_trace);
    occurrences >= cx.thresholds.min_leak_occurrences && after >= occurrences && after > longest_pause
}

/// The groups most of whose kept blocks have a size that blocks the same line made and let go
/// also had: the line keeps a sample of like tensors (every 17th of a list of randomly sized
/// tensors, to fragment the cache: s07).
///
/// Mechanism. A forgotten reference keeps a statement's result, whose shape the statement gives
/// every result, while the scratch the operation makes and frees beside it has other shapes
/// (`torch.topk` keeps its values and indices and frees seven buffers of other sizes: ad09). A
/// line whose kept blocks are sizes it also let go made like tensors and chose which to keep.
/// Asked only where iterations come from the loop's statements alone: with passes, what a
/// training step keeps some of the time (hard examples) is judged by its passes. One walk over
/// the blocks gathers the sizes every line let go.
fn kept_by_sampling(cx: &Context, groups: &BTreeMap<Key, Group>) -> BTreeSet<Key> {
    let mut let_go: FxHashMap<FrameId, FxHashSet<u64>> = FxHashMap::default();
    for b in cx.replay.blocks.iter().filter(|b| b.freed_at().is_some() && b.alloc_event().is_some()) {
        if let Attr::Site(line) = cx.attr(b) {
            let_go.entry(line).or_default().insert(b.size);
        }
    }
    groups
        .iter()
        .filter(|(key, g)| {
            let Key::Line(Some(line), _) = key else { return false };
            let sizes = let_go.get(line);
            let like =
                g.blocks.iter().filter(|&&bi| sizes.is_some_and(|s| s.contains(&cx.replay.blocks[bi].size))).count();
            2 * like >= g.blocks.len().max(1)
        })
        .map(|(key, _)| *key)
        .collect()
}

/// Whether what a user line keeps is a cache keyed by the shape of the work: its kept blocks all
/// differ in size, and it allocated in no more than half the iterations from its first on.
///
/// Mechanism. A cache keyed by shape (a boundary mask per grid size, a workspace or kernel per
/// resolution: `if n not in masks: masks[n] = ...`) makes one tensor the first time a shape
/// comes and reuses it every time the shape comes back: one block per distinct size, made only
/// in the iterations where the shape was new, and bounded by the shapes the program uses. A
/// forgotten reference keeps what the iterations made, whose sizes repeat when the shapes do
/// (a fixed batch), or which it makes in every iteration when they vary (variable lengths).
/// Asked only where iterations come from the loop's statements alone (ac21's simulation): in a
/// training loop a line that keeps some of its batches, of varying lengths (hard examples),
/// would read the same, and caches there are judged by the loop going on without the line
/// (`iterations_went_on_without_the_line`) and by their passes.
fn keyed_by_shape(cx: &Context, g: &Group) -> bool {
    let (Some(&first), iterations) = (g.eligible.first(), cx.phases.iteration_count()) else { return false };
    let mut sizes: Vec<u64> = g.blocks.iter().map(|&bi| cx.replay.blocks[bi].size).collect();
    sizes.sort_unstable();
    let distinct = sizes.windows(2).all(|w| w[0] != w[1]);
    sizes.len() >= 2 && distinct && 2 * g.eligible.len() <= iterations.saturating_sub(first)
}

/// Whether the modules built at a line, build after build, were added to what the program runs
/// (progressive growing: a block or a layer added per stage; continual learning: a head added
/// per task and evaluated ever after), not kept aside.
///
/// Mechanism: a module that is run allocates its outputs (and, with grad on, what autograd
/// saves for it) in every forward pass it runs in, and a model called once per module (a head
/// per task) runs one more pass for each. So once the built modules are in use, what the program
/// repeats allocates more after each build than before it: the training passes allocate more
/// blocks (the model grew deeper or wider), or each evaluation runs more passes (every head or
/// member so far is evaluated). A copy kept aside (a list of trained models, snapshots kept for
/// an ensemble that is never run, a deep copy of the best model) is run by neither: both stay as
/// they were. Measured per stretch between two builds: the median count of blocks the passes
/// of the training call site (the site with the most passes, ties to the first seen) allocate,
/// and the median count of passes of the evaluation windows. One of the two must rise across
/// every build that has a stretch measured on both sides, and across at least
/// [`MIN_GROWN_BUILDS`] builds.
///
/// Limits: a sweep that keeps every model it trains and builds each one deeper than the last
/// also makes the passes after each build allocate more; so does an evaluation whose number of
/// batches grows with time for another reason. Both read as growth, not as a leak.
fn built_into_the_model(cx: &Context, g: &Group) -> bool {
    let units = &cx.lifecycle.units;
    let Some(site) = crate::phases::most_frequent(units.iter().map(|u| u.call_site)) else { return false };
    // A build: the first allocation of the line's kept blocks after each number of passes.
    let mut builds: BTreeMap<usize, u32> = BTreeMap::new();
    for &bi in &g.blocks {
        let Some(a) = cx.replay.blocks[bi].alloc_event() else { continue };
        let passes_before = units.partition_point(|u| u.pass_span.start < a);
        builds.entry(passes_before).and_modify(|t| *t = (*t).min(a)).or_insert(a);
    }
    let times: Vec<u32> = builds.into_values().collect();
    let median = |mut counts: Vec<u32>| (!counts.is_empty()).then(|| super::median(&mut counts));
    // Units and evaluation windows are in start order: each stretch is found by binary search,
    // so the measures cost the stretches' lengths, not a scan of every pass per build.
    let passes_starting = |from: u32, to: u32| -> &[crate::lifecycle::Unit] {
        let lo = units.partition_point(|u| u.pass_span.start <= from);
        let hi = units.partition_point(|u| u.pass_span.start < to);
        &units[lo..hi.max(lo)]
    };
    let training_blocks = |from: u32, to: u32| -> Option<u32> {
        median(passes_starting(from, to).iter().filter(|u| u.call_site == site).map(|u| u.pass_blocks).collect())
    };
    let evaluation_passes = |from: u32, to: u32| -> Option<u32> {
        let windows = &cx.phases.eval_windows;
        let lo = windows.partition_point(|w| w.start <= from);
        let hi = windows.partition_point(|w| w.start < to);
        median(
            windows[lo..hi.max(lo)]
                .iter()
                .map(|w| {
                    let first = units.partition_point(|u| u.pass_span.start < w.start);
                    let end = units.partition_point(|u| u.pass_span.start < w.end);
                    end.saturating_sub(first) as u32
                })
                .collect(),
        )
    };
    rises_with_every_build(&times, training_blocks) || rises_with_every_build(&times, evaluation_passes)
}

/// Whether `measure` over the stretch after each build (up to the next one) is above its value
/// over the stretch before it (from the build before), for every build with both stretches
/// measured, and for at least [`MIN_GROWN_BUILDS`] of them.
fn rises_with_every_build(times: &[u32], measure: impl Fn(u32, u32) -> Option<u32>) -> bool {
    let mut risen = 0;
    for (j, &t) in times.iter().enumerate() {
        let prev = j.checked_sub(1).map_or(0, |p| times[p]);
        let next = times.get(j + 1).copied().unwrap_or(u32::MAX);
        match (measure(prev, t), measure(t, next)) {
            (Some(before), Some(after)) if after > before => risen += 1,
            (Some(_), Some(_)) => return false,
            _ => {}
        }
    }
    risen >= MIN_GROWN_BUILDS
}

/// Whether a line that lets some of its long-lived tensors go (an evicting cache), whose new
/// tensors replace older ones ([`replaced_blocks`]), or that lets go tensors made before the
/// trace ([`let_go_from_before_the_trace`]), is full to its capacity, not leaking: from the start
/// of a kept occurrence to the start of its last kept occurrence, the two and those between them
/// at least `min_leak_occurrences` (as many as a leak needs), what it made less what it let go
/// or replaced rose by at most [`CAPACITY_RISE_SHARE`] of what it made in between that is still
/// alive at the end, in number or in bytes.
///
/// Mechanism: a cache bounded by its number of entries (an LRU that `popitem`s the oldest, a
/// queue with a `maxlen`) or by their bytes (evicting until the total fits a budget) lets old
/// tensors go for every new one once it is full, so what it holds stops rising while it goes on
/// making and keeping new tensors; each occurrence still keeps a few to the end (l06: 8-13 new
/// spectrograms per step into an LRU of 48, kept from 9 of 10 steps; s01: documents' states of
/// 12-256 KiB under an 8 MiB budget, 84-103 entries, the bytes a few KiB under the budget at
/// every step), which the share of kept occurrences alone reads as a leak. A leak's tensors alive
/// rise by all it keeps. Both counts are taken at occurrences' starts, where the line's
/// short-lived tensors that live into the next occurrences (a decoding step's KV cache, re-made
/// each pass and freed two passes later: e01) are alive in like numbers; the end of the trace is
/// not such a point. `start(k)`: the first event of occurrence `k`. The limit: a leak that lets
/// go most of what it keeps (a dict whose keys are mostly replaced, new ones added now and then)
/// reads as full over a short stretch of kept occurrences; such a line is read by what it holds
/// at every occurrence's start instead ([`held_level`]) when it keeps too rarely to grow by share.
fn at_capacity(cx: &Context, g: &Group, start: impl Fn(usize) -> Option<u32>) -> bool {
    let blocks = &cx.replay.blocks;
    let own = OwnLetGo::of(cx, g);
    let replaced: Vec<usize> =
        replaced_blocks(cx, g, &start).into_iter().filter(|bi| own.blocks.binary_search(bi).is_err()).collect();
    let before_trace = let_go_from_before_the_trace(cx, g, &own, &start);
    if g.evicted_blocks.is_empty() && replaced.is_empty() && before_trace.is_empty() {
        return false;
    }
    // The events of the long-lived blocks made, let go and kept to the end, in order, with the
    // running total of their bytes: the count and bytes before any event in a binary search (a
    // group may hold millions of blocks and be asked at each of its kept occurrences). In `i128`:
    // millions of sizes of up to 2^48 bytes each may be summed.
    let events = |mut v: Vec<(u32, u64)>| -> Vec<(u32, i128)> {
        v.sort_unstable();
        let mut total = 0i128;
        v.into_iter()
            .map(|(e, size)| {
                total += i128::from(size);
                (e, total)
            })
            .collect()
    };
    let at = |of: &[usize], event: fn(&memsnap_replay::BlockLifetime) -> Option<u32>| -> Vec<(u32, u64)> {
        of.iter().filter_map(|&bi| event(&blocks[bi]).map(|e| (e, blocks[bi].size))).collect()
    };
    let kept_made = at(&g.blocks, |b| b.alloc_event());
    let made = events([kept_made.as_slice(), &at(&own.blocks, |b| b.alloc_event())].concat());
    let kept = events(kept_made);
    let let_go = events(
        [at(&own.blocks, |b| b.freed_at()), at(&replaced, |b| b.freed_at()), at(&before_trace, |b| b.freed_at())]
            .concat(),
    );
    // Number and bytes of `v`'s entries before event `t`.
    let before = |v: &[(u32, i128)], t: u32| {
        let n = v.partition_point(|&(e, _)| e < t);
        (n as i128, n.checked_sub(1).map_or(0, |i| v[i].1))
    };
    // What the line made minus what it let go (its own or others' it replaced), before `t`.
    let net_at = |t: u32| {
        let ((m, mb), (l, lb)) = (before(&made, t), before(&let_go, t));
        (m - l, mb - lb)
    };
    let Some(last) = g.kept.last().and_then(|&k| start(k)) else { return false };
    let (count, bytes) = net_at(last);
    let (kept_by_last, kept_bytes_by_last) = before(&kept, last);
    let earlier = (g.kept.len() + 1).saturating_sub(cx.thresholds.min_leak_occurrences);
    g.kept[..earlier].iter().filter_map(|&k| start(k)).any(|t| {
        let (n, b) = net_at(t);
        let (kept_by_t, kept_bytes_by_t) = before(&kept, t);
        let (kept_between, kept_bytes_between) = (kept_by_last - kept_by_t, kept_bytes_by_last - kept_bytes_by_t);
        let within = |rise: i128, kept: i128| rise as f64 <= CAPACITY_RISE_SHARE * kept as f64;
        kept_between > 0 && (within(count - n, kept_between) || within(bytes - b, kept_bytes_between))
    })
}

/// What a line that overwrites what it holds held at the start of each occurrence it allocated
/// in, when that kept rising through the trace: the level's facts and the line's tensors made in
/// the trace (kept to the end and let go), sorted, which the finding measures. `None` when the
/// level did not rise so, or where it cannot be read.
///
/// Mechanism: a store whose entries are written again and again (`protos[c] = 0.9 * protos[c] +
/// 0.1 * m`, `state[sid] = update(state[sid], x)`, `bank[i] = ...`) drops each old value as its
/// key or slot is written, a step or two after it was made, so most of the occurrences that made
/// a tensor kept to the end are the last few, and the share of kept occurrences is too small to
/// read as growth (at01's prototypes: 7 of 29 steps; at02's sessions: 3 of 30), while the line
/// lets go long-lived tensors and so reads as a bounded cache. What tells them apart is what the
/// line holds: counted at the start of each occurrence (where its temporaries are gone and each
/// entry is alive once), a cache full to its capacity holds as much from one occurrence to the
/// next, and a store that also gains entries (new keys every step, an `append` beside the
/// updates) holds more and more, to the end. So the level must reach a new high, in bytes, at the
/// start of at least `leak_occurrence_share` of the later half of the occurrences (a cache that
/// filled within the first half reaches none there: at05's LRU of 20 entries full at its fifth
/// step; a bounded store whose size wanders reaches few: at03's sessions, closed after five
/// turns), and hold `min_leak_occurrences` more tensors at the last start than at the first.
/// Asked over at least twice `min_leak_occurrences` occurrences, from the first that starts after
/// the last tensor of the line's sizes made before the trace was let go: in a wrapped ring the
/// line replaces entries it made before the trace, which have no stack, and until they are all
/// gone its level counted from the trace alone would rise by the replacements (at04's bank, cut
/// by its ring to 22 of 30 steps, is counted from the second of them on).
fn held_level(
    cx: &Context,
    g: &Group,
    index: &LetGoIndex,
    start: impl Fn(usize) -> Option<u32>,
) -> Option<(HeldLevel, Vec<usize>)> {
    let min = cx.thresholds.min_leak_occurrences;
    let blocks = &cx.replay.blocks;
    let own = index.own(cx, g);
    let sizes = size_range(cx, g.blocks.iter().chain(&own.blocks))?;
    // Counted from the first start after the last tensor of the line's sizes made before the
    // trace was let go: from there on, what the line holds is all made in the trace.
    let last_from_before = index.last_let_go_from_before(&sizes);
    let starts: Vec<u32> =
        g.eligible.iter().filter_map(|&k| start(k)).filter(|&s| last_from_before.is_none_or(|f| s > f)).collect();
    if starts.len() < 2 * min {
        return None;
    }
    let mut held: Vec<usize> = g.blocks.iter().chain(&own.blocks).copied().collect();
    held.sort_unstable();
    held.dedup();
    // Each tensor's allocation and free, in event order: (event, bytes, count) changes. Bytes
    // in `i128`: sizes of up to 2^48 bytes each (`MAX_SIZE`), millions of them summed.
    let mut changes: Vec<(u32, i128, i64)> = Vec::with_capacity(2 * held.len());
    for &bi in &held {
        let b = &blocks[bi];
        let size = i128::from(b.size);
        changes.extend(b.alloc_event().map(|a| (a, size, 1)));
        changes.extend(b.freed_at().map(|f| (f, -size, -1)));
    }
    changes.sort_unstable();
    // The line's tensors alive at each start (made before it, not freed before it).
    let mut levels: Vec<(i128, i64)> = Vec::with_capacity(starts.len());
    let (mut bytes, mut count, mut next) = (0i128, 0i64, 0usize);
    for &t in &starts {
        while next < changes.len() && changes[next].0 < t {
            bytes += changes[next].1;
            count += changes[next].2;
            next += 1;
        }
        levels.push((bytes, count));
    }
    let half = levels.len() / 2;
    let mut highest = levels[..half].iter().map(|&(b, _)| b).max().unwrap_or(i128::MIN);
    let mut new_highs = 0;
    for &(b, _) in &levels[half..] {
        if b > highest {
            new_highs += 1;
            highest = b;
        }
    }
    let later = levels.len() - half;
    let (first, last) = (levels[0], levels[levels.len() - 1]);
    let rose = last.1 - first.1 >= min as i64 && last.0 > first.0;
    (rose && new_highs as f64 >= cx.thresholds.leak_occurrence_share * later as f64).then(|| {
        // Entries let go: alive at the start of an occurrence, so not the statement's temporaries.
        let let_go = own
            .blocks
            .iter()
            .filter(|&&bi| {
                let b = &blocks[bi];
                let (Some(made), Some(freed)) = (b.alloc_event(), b.freed_at()) else { return false };
                let k = starts.partition_point(|&s| s <= made);
                starts.get(k).is_some_and(|&s| s <= freed)
            })
            .count() as u64;
        // Levels are counts and sums of live tensors: never below zero.
        let to_u64 = |b: i128| u64::try_from(b).unwrap_or(u64::MAX);
        let level = HeldLevel {
            let_go,
            first_blocks: first.1.max(0) as u64,
            first_bytes: to_u64(first.0),
            last_blocks: last.1.max(0) as u64,
            last_bytes: to_u64(last.0),
            occurrences: levels.len(),
            later,
            new_highs,
        };
        (level, held)
    })
}

/// Whether group `g` is one [`held_level`] reads: a line's tensors of forward passes or of user
/// code (the stores a reference keeps), some kept to the end and some let go late (so it reads
/// as a bounded cache), over at least twice `min_leak_occurrences` occurrences.
fn may_hold_a_rising_level(cx: &Context, key: &Key, g: &Group) -> bool {
    let stores = matches!(
        key,
        Key::Line(Some(_), Origin::Trained | Origin::NoGrad | Origin::GraphReleased | Origin::User | Origin::Worker)
    );
    stores && g.evicted && !g.blocks.is_empty() && g.eligible.len() >= 2 * cx.thresholds.min_leak_occurrences
}

/// The blocks made in the trace and let go in it, by the stack that made them, for the stacks
/// of the groups [`held_level`] reads; and the blocks made before the trace and let go in it, by
/// size. Built in one pass over the blocks for all those groups: a file may hold thousands of
/// lines that let something go late, and a pass per line would cost as many passes over
/// millions of blocks.
struct LetGoIndex {
    by_stack: FxHashMap<StackId, Vec<usize>>,
    /// (size, event that let it go), sorted.
    from_before: Vec<(u64, u32)>,
}

impl LetGoIndex {
    fn of<'g>(cx: &Context, groups: impl Iterator<Item = &'g Group>) -> LetGoIndex {
        let blocks = &cx.replay.blocks;
        let mut by_stack: FxHashMap<StackId, Vec<usize>> =
            groups.flat_map(|g| OwnLetGo::stacks(cx, g)).map(|s| (s, Vec::new())).collect();
        let mut from_before = Vec::new();
        if !by_stack.is_empty() {
            for (bi, b) in blocks.iter().enumerate() {
                let Some(freed) = b.freed_at() else { continue };
                if b.alloc_event().is_none() {
                    from_before.push((b.size, freed));
                } else if let Some(own) = by_stack.get_mut(&cx.event_stack(b)) {
                    own.push(bi);
                }
            }
        }
        from_before.sort_unstable();
        LetGoIndex { by_stack, from_before }
    }

    /// [`OwnLetGo::of`] `g`, for a group the index was built for.
    fn own(&self, cx: &Context, g: &Group) -> OwnLetGo {
        let stacks = OwnLetGo::stacks(cx, g);
        // A block has one stack: the stacks' lists are disjoint, each ascending.
        let mut own: Vec<usize> = stacks.iter().filter_map(|s| self.by_stack.get(s)).flatten().copied().collect();
        own.sort_unstable();
        OwnLetGo { stacks, blocks: own }
    }

    /// The last event that let go a block made before the trace with a size in `sizes`.
    fn last_let_go_from_before(&self, sizes: &std::ops::RangeInclusive<u64>) -> Option<u32> {
        let lo = self.from_before.partition_point(|&(size, _)| size < *sizes.start());
        let hi = self.from_before.partition_point(|&(size, _)| size <= *sizes.end());
        self.from_before[lo..hi].iter().map(|&(_, freed)| freed).max()
    }
}

/// What group `g`'s own statements made in the trace and let go in it: every block allocated at
/// a stack of one of the group's blocks (kept or evicted) and freed before the end, sorted, and
/// those stacks.
///
/// Mechanism: a store's statement makes the entries it keeps and, in a store that overwrites
/// them, the entries it later lets go; how long a let-go entry lived says nothing of whose it
/// was. A dict entry overwritten whenever its key comes again lives a step or two (aq16's class
/// prototypes, most of the 40 classes met in every batch), so it is neither kept to the end nor
/// evicted past the occurrence after its own, yet it is the store's own: counted with what the
/// store made and let go, and never as another line's block of the store's sizes.
struct OwnLetGo {
    stacks: FxHashSet<StackId>,
    blocks: Vec<usize>,
}

impl OwnLetGo {
    fn of(cx: &Context, g: &Group) -> OwnLetGo {
        let blocks = &cx.replay.blocks;
        let stacks = OwnLetGo::stacks(cx, g);
        let own = (0..blocks.len())
            .filter(|&bi| {
                let b = &blocks[bi];
                b.alloc_event().is_some() && b.freed_at().is_some() && stacks.contains(&cx.event_stack(b))
            })
            .collect();
        OwnLetGo { stacks, blocks: own }
    }

    /// The stacks of group `g`'s blocks, kept or evicted: its own statements.
    fn stacks(cx: &Context, g: &Group) -> FxHashSet<StackId> {
        g.blocks.iter().chain(&g.evicted_blocks).map(|&bi| cx.event_stack(&cx.replay.blocks[bi])).collect()
    }
}

/// Blocks not of group `g` that one of its allocations replaced: freed by the trace's very next
/// event, of the new block's size, and made before the occurrence that made the new block (or
/// before the trace).
///
/// Mechanism: storing a new tensor into an occupied slot (`slots[j] = x.clone()`, a dict entry
/// overwritten) drops the old value's last reference as the store completes, so the caching
/// allocator records its free right after the new block's allocation. A cache whose entries are
/// filled at one line and replaced at another (a reservoir filled by `append` until full, then
/// written at random slots: s13) lets go of the filling line's tensors at the replacing line,
/// and the replacing line alone reads as growth. Made before the occurrence: a temporary of the
/// same size freed after the copy that outlives it (`(a * b).clone()`) is no replacement. Let go
/// by the store: where frees carry the freeing code's stack (`context="all"`), the old value's
/// free holds the new block's line (the statement that stored it, or a helper it called to
/// store it); a function's local let go as the function returns right after its last
/// allocation is freed at its caller's line, no store (af18: an evaluation function's input copy,
/// freed at the call once the function's kept saliency map was made).
fn replaced_blocks(cx: &Context, g: &Group, start: &impl Fn(usize) -> Option<u32>) -> Vec<usize> {
    let blocks = &cx.replay.blocks;
    let starts: Vec<u32> = g.eligible.iter().filter_map(|&k| start(k)).collect();
    // The event right after each allocation of the group, when it is a free: the new block's
    // size and the start of the occurrence that made it.
    let mut wanted: FxHashMap<u32, (u64, u32)> = FxHashMap::default();
    for &bi in g.blocks.iter().chain(&g.evicted_blocks) {
        let b = &blocks[bi];
        let Some(made) = b.alloc_event() else { continue };
        let next = made + 1;
        let is_free = cx
            .events
            .get(next as usize)
            .is_some_and(|e| matches!(e.action(), Action::FreeRequested | Action::FreeCompleted));
        let occurrence = starts[..starts.partition_point(|&s| s <= made)].last();
        if let (true, Some(&occurrence)) = (is_free, occurrence) {
            wanted.insert(next, (b.size, occurrence));
        }
    }
    if wanted.is_empty() {
        return Vec::new();
    }
    let own: FxHashSet<usize> = g.evicted_blocks.iter().copied().collect();
    // Whether the free at `free` can be the store of the block allocated right before it.
    let let_go_by_the_store = |free: u32| {
        let stack_of = |e: u32| cx.events.get(e as usize).map(|e| e.stack);
        let (Some(freed_by), Some(new)) = (stack_of(free), stack_of(free - 1)) else { return true };
        let Some(line) = cx.stacks.get(new).site else { return true };
        cx.phases.free_stacks_from_alloc || freed_by == StackId::EMPTY || cx.snap.stack(freed_by).frames.contains(&line)
    };
    (0..blocks.len())
        .filter(|bi| !own.contains(bi))
        .filter(|&bi| {
            let b = &blocks[bi];
            b.freed_at().is_some_and(|f| {
                wanted.get(&f).is_some_and(|&(size, occurrence)| {
                    b.size == size && b.alloc_event().is_none_or(|made| made < occurrence)
                }) && let_go_by_the_store(f)
            })
        })
        .collect()
}

/// Blocks made before the trace that group `g`'s cache let go in it: of a size within the range
/// the group makes, freed at a free stack where no block of such a size made in the trace is
/// freed but the group's own let-go ones, in at least `min_leak_occurrences` of the gaps its
/// occurrences' starts cut the trace into. Empty otherwise.
///
/// Mechanism: a trace that starts mid-run (a ring of `max_entries` that wrapped, or recording
/// started late) begins with a full cache's entries already made; for every entry it makes and
/// keeps, it evicts one of those, and a block made before the trace has no allocation stack to
/// name the line. What frees them is on the free's own stack (`context="all"` records it): the
/// eviction's line (`popitem`, a deque's `append`, a generator dropped at the end of its epoch:
/// i07), where no other tensor of those sizes made in the trace is let go, at a steady pace, one
/// or a few per occurrence; of sizes the trace's part of the run may not have made (documents
/// of many lengths: s01). A leak lets nothing go; the tensors in flight when the trace began (a
/// pass's activations) are freed once, in its first occurrence. Frees recorded without stacks
/// (`context="state"`, `stacks=None`) share the empty stack with every other free and are never
/// counted. With `context="alloc"` a free carries its block's allocation stack
/// (`phases::free_stacks_are_alloc_stacks`): a block made before the trace is then let go at the
/// stack that made it, and the same test asks that no other block of those sizes made in the
/// trace die with that stack. A block made before recording began has no allocation context,
/// so its free carries no stack (the empty one), shared only with the blocks made in the trace
/// without frames (the autograd engine's): the empty stack is then a stack like any other. A
/// block made while recording, whose allocation a ring that wrapped dropped, is let go with the
/// stack that made it, which names the line: such a block counts when that line is one of the
/// group's (every block of the group's line dies with its stack, so the test of other blocks
/// dying with it would reject all; s33's and i07's stores cut to their last half).
/// Measured on every fixture cut to its last 70, 50, 35, 20 and 10% of trace entries (a ring
/// that wrapped): clean programs read as leaking went from 5, 10 (at 50, 20%) to 0, 1.
fn let_go_from_before_the_trace(
    cx: &Context,
    g: &Group,
    own: &OwnLetGo,
    start: &impl Fn(usize) -> Option<u32>,
) -> Vec<usize> {
    let blocks = &cx.replay.blocks;
    let free_stack = |b: &memsnap_replay::BlockLifetime| {
        b.freed_at()
            .and_then(|f| cx.events.get(f as usize))
            .map(|e| e.stack)
            .filter(|&s| s != StackId::EMPTY || cx.phases.free_stacks_from_alloc)
    };
    // The range of the group's sizes (see above).
    let Some(sizes) = size_range(cx, g.blocks.iter().chain(&g.evicted_blocks)) else { return Vec::new() };
    // Free stacks of blocks made before the trace, of the group's sizes; then those where a block
    // of such a size made in the trace, not one of the group's own ([`OwnLetGo`]), is freed too.
    let mut candidates: Vec<(usize, StackId)> = Vec::new();
    let mut stacks: FxHashSet<StackId> = FxHashSet::default();
    for (bi, b) in blocks.iter().enumerate() {
        if b.alloc_event().is_none() && sizes.contains(&b.size) {
            if let Some(s) = free_stack(b) {
                candidates.push((bi, s));
                stacks.insert(s);
            }
        }
    }
    if candidates.is_empty() {
        return Vec::new();
    }
    let shared: FxHashSet<StackId> = blocks
        .iter()
        .filter(|b| b.alloc_event().is_some() && !own.stacks.contains(&cx.event_stack(b)) && sizes.contains(&b.size))
        .filter_map(|b| free_stack(b).filter(|s| stacks.contains(s)))
        .collect();
    let own_sites = lines_named_by_frees(cx, g.blocks.iter().chain(&g.evicted_blocks));
    let made_by_group = |s: StackId| cx.stacks.get(s).site.is_some_and(|site| own_sites.contains(&site));
    let let_go: Vec<usize> =
        candidates.into_iter().filter(|&(_, s)| !shared.contains(&s) || made_by_group(s)).map(|(bi, _)| bi).collect();
    // Between which of the group's occurrence starts they were let go (a line outside the
    // passes runs before the pass it is counted with, so before its start).
    let starts: Vec<u32> = g.eligible.iter().filter_map(|&k| start(k)).collect();
    let gaps: BTreeSet<usize> =
        let_go.iter().filter_map(|&bi| blocks[bi].freed_at()).map(|f| starts.partition_point(|&s| s <= f)).collect();
    if gaps.len() < cx.thresholds.min_leak_occurrences {
        return Vec::new();
    }
    let_go
}

/// The lines that made `blocks` (indices into the replay's blocks), where a free names the line
/// that made what it lets go: under `context="alloc"` (`phases::free_stacks_are_alloc_stacks`)
/// a free carries its block's allocation stack. Empty otherwise: a free's stack is then where
/// the program let go, which says nothing of the line that made the block.
fn lines_named_by_frees<'b>(cx: &Context, blocks: impl IntoIterator<Item = &'b usize>) -> FxHashSet<FrameId> {
    if !cx.phases.free_stacks_from_alloc {
        return FxHashSet::default();
    }
    blocks.into_iter().filter_map(|&bi| cx.stacks.get(cx.replay.blocks[bi].stack).site).collect()
}

/// From the smallest to the largest size of `blocks` (indices into the replay's blocks); `None`
/// for none.
fn size_range<'b>(cx: &Context, blocks: impl IntoIterator<Item = &'b usize>) -> Option<std::ops::RangeInclusive<u64>> {
    let mut sizes = blocks.into_iter().map(|&bi| cx.replay.blocks[bi].size);
    let first = sizes.next()?;
    let (lo, hi) = sizes.fold((first, first), |(lo, hi), s| (lo.min(s), hi.max(s)));
    Some(lo..=hi)
}

/// The most a full cache's tensors alive may rise, as a share of the tensors it made and kept
/// meanwhile ([`at_capacity`]): a leak's rise by all of them (1.0); a full cache's by what one
/// entry's size or an eviction's timing moves them (s01: 36 KB against about 1 MB kept over the
/// last steps, 0.03); a quarter leaves room for that jitter and none for a leak.
const CAPACITY_RISE_SHARE: f64 = 0.25;

/// Builds after which what the program repeats must allocate more for a line's models to read
/// as in use ([`built_into_the_model`]): one rise could be a change of batch or shapes that
/// happened to follow a build; two, each right after a build, are the models'.
const MIN_GROWN_BUILDS: usize = 2;

/// Did the program's loop go on, without running the model from this line, for at least as many
/// rounds as the model ran? `units`: the passes (indices into `Lifecycle::units`) the line
/// `own_line` ran, ascending.
///
/// Mechanism. A cache keyed by the input (`if key not in cache: cache[key] = model(x)`) runs the
/// model only on a miss, so its passes are not the loop's iterations: each keeps its output, and
/// once every key has been met the model is no longer called while the loop goes on (q26: 5
/// prompts, 24 requests). A leak keeps what the model makes for as long as the program runs it.
/// The loop's own rounds are seen as another user line outside any model call (the request's
/// input, a buffer) that allocated between every two of the passes, and after the last one as
/// many times again as it did in those gaps (at most per gap, times the passes): what the line
/// that keeps the outputs makes is not a round (w10 clones a state dict after each pass). The
/// near miss: a cache switched on late, or one that keeps every request, whose model runs to the
/// end (p14). The cost: an evaluation that keeps its outputs every epoch and then stops, while
/// training that shares its data line goes on as long again, is no longer called growth.
fn loop_went_on_without_the_model(cx: &Context, own_line: Option<FrameId>, units: &[usize]) -> bool {
    let lc = cx.lifecycle;
    let spans: Vec<crate::phases::Span> = units.iter().filter_map(|&u| lc.units.get(u)).map(|u| u.pass_span).collect();
    let Some(last) = spans.last() else { return false };
    if spans.len() < cx.thresholds.min_leak_occurrences {
        return false;
    }
    // The user line of an allocation outside any model call, optimizer step or backward.
    let loop_line = |i: usize| -> Option<FrameId> {
        let e = &cx.events[i];
        if e.action() != memsnap_model::Action::Alloc {
            return None;
        }
        let info = cx.stacks.get(e.stack);
        if info.forward || info.optimizer || info.backward_launch || info.construction {
            return None;
        }
        info.site
    };
    // Per line: (the gaps between passes it allocated in, the most allocations in one gap).
    let mut in_gaps: BTreeMap<FrameId, (usize, usize)> = BTreeMap::new();
    for w in spans.windows(2) {
        let mut here: BTreeMap<FrameId, usize> = BTreeMap::new();
        for i in w[0].end as usize..w[1].start as usize {
            if let Some(line) = loop_line(i).filter(|&l| Some(l) != own_line) {
                *here.entry(line).or_default() += 1;
            }
        }
        for (line, n) in here {
            let e = in_gaps.entry(line).or_default();
            e.0 += 1;
            e.1 = e.1.max(n);
        }
    }
    // The lines that allocated in every gap, with their most allocations per round.
    let gaps = spans.len() - 1;
    let per_round: BTreeMap<FrameId, usize> =
        in_gaps.into_iter().filter(|(_, (n, _))| *n == gaps).map(|(l, (_, most))| (l, most)).collect();
    if per_round.is_empty() {
        return false;
    }
    let mut after: BTreeMap<FrameId, usize> = BTreeMap::new();
    for i in last.end as usize..cx.events.len() {
        if let Some(line) = loop_line(i).filter(|l| per_round.contains_key(l)) {
            *after.entry(line).or_default() += 1;
        }
    }
    // As many rounds again after the last pass as there were passes.
    after.iter().any(|(line, &n)| n >= spans.len() * per_round[line])
}

/// Blocks alive at the dump, allocated before the trace began, that `line` made as the suspect's
/// `kept` blocks were made (see [`BeforeTrace`]): for outputs of passes, blocks made inside a
/// model call from `line`; for user code, blocks whose innermost user line is `line`, outside
/// model calls. Their stacks are the dump's: the allocator keeps one for every block still
/// allocated that was made while recording was on. Only blocks of a size within those the kept
/// ones have (from the smallest to the largest): a leak keeps like tensors each time, whose
/// shapes may follow the batch (l03: masks of 32 x L x L for lengths L that vary per batch, half
/// of the sizes made before the trace never made in it), while the first call of a line may also
/// have made a one-off block that stays for good (the cuBLAS workspace of the first matmul, 32
/// MiB, k10, beside 1 MiB kept maps), which no reference of the user's keeps.
fn made_before_trace(cx: &Context, line: FrameId, origin: LeakOrigin, kept: &[usize]) -> Option<BeforeTrace> {
    let sizes = size_range(cx, kept)?;
    let user_code = |info: &crate::stacks::StackInfo| {
        !info.forward && !info.optimizer && !info.backward_launch && !info.construction && info.site == Some(line)
    };
    // A pass's kept blocks include what the user's code made right before or after its model
    // calls (j08: the draft's stacked probabilities, the target's softmax, kept per round of
    // speculative decoding), named at that user line, and what user code a module ran inside
    // the call made, named at its own line (a forward hook's `output.clone()`: r04).
    let matches = |info: &crate::stacks::StackInfo| match origin {
        LeakOrigin::TrainedForward | LeakOrigin::NoGradForward | LeakOrigin::ReleasedGraphForward => {
            info.forward && (info.forward_call == Some(line) || info.site == Some(line)) || user_code(info)
        }
        LeakOrigin::UserCode => user_code(info),
        _ => false,
    };
    // Or made by the very code path that made a kept block in the trace (the same stack, frame
    // for frame): an earlier occurrence of the same keeping, wherever the suspect is named along
    // that path (aa05: maps of a softmax inside an attention module, named at the module's call
    // in the block, kept by closures: 27 made before a ring of about three steps). Only stacks
    // with a user frame: every block made while recording was off has none, as has every
    // block the autograd engine made, so an empty stack says nothing of the code path (y06).
    let kept_stacks: BTreeSet<StackId> = kept
        .iter()
        .map(|&bi| cx.event_stack(&cx.replay.blocks[bi]))
        .filter(|&stack| !cx.stacks.userless(stack))
        .collect();
    let (blocks, bytes) = cx
        .replay
        .blocks
        .iter()
        .filter(|b| {
            b.alloc_event().is_none()
                && b.freed_at().is_none()
                && sizes.contains(&b.size)
                && (matches(&cx.stacks.get(b.stack)) || kept_stacks.contains(&b.stack))
        })
        .fold((0u64, 0u64), |(n, s), b| (n + 1, s + b.size));
    (blocks > 0).then_some(BeforeTrace { blocks, bytes })
}

/// Whether a block made before the trace, of a size within those of `kept`, was let go by the
/// program at or after event `from` (the first of `kept` made in the trace). Its free names no
/// line it was made at (its allocation is not in the trace), so any such block counts. A store
/// bounded by a policy (an LRU, a pool, a replay buffer) evicts entries made before the trace as
/// it inserts new ones, so after its first insertion in the trace (l06, s33, v08 cut to their
/// last 20-50%); a leak lets none of its own go. Frees inside a backward pass or an optimizer's
/// step do not count: there autograd lets go the saved tensors of the graph it runs through,
/// and `zero_grad` the gradients, not the program's code a store's entries: what a pass had in
/// flight when the trace began, or the step before's gradients, of the kept tensors' sizes by
/// chance (t03 cut to its last fifth keeps a 4 MiB gradient mask per step, the size of its
/// widest weight's gradient, which `zero_grad` and the backward's hooks let go; it was held
/// back). A leak whose kept tensors are made inside a pass that began before the trace is still
/// held back when too few occurrences are in the trace (s45, `fixtures/limits`). Under
/// `context="alloc"` (`phases::free_stacks_are_alloc_stacks`) no free says where the program is,
/// so the windows of backward passes and optimizer steps stretch over the program's frees that
/// follow them; but each free carries the stack that made its block, so a block the kept
/// tensors' own line made counts wherever it was let go (s33 cut to its last half: its pool's
/// evictions fell in the backward windows).
fn let_go_since(cx: &Context, kept: &[usize], from: u32) -> bool {
    let Some(sizes) = size_range(cx, kept) else { return false };
    let by_program = |f: u32| cx.phases.backward_at(f).is_none() && !cx.phases.in_optimizer(f);
    let kept_sites = lines_named_by_frees(cx, kept);
    let made_by_kept_line = |f: u32| {
        cx.events.get(f as usize).and_then(|e| cx.stacks.get(e.stack).site).is_some_and(|s| kept_sites.contains(&s))
    };
    cx.replay.blocks.iter().any(|b| {
        b.alloc_event().is_none()
            && sizes.contains(&b.size)
            && b.freed_at().is_some_and(|f| f >= from && (by_program(f) || made_by_kept_line(f)))
    })
}

/// The iterations in which the optimizer state kept from one `step()` line was made for
/// parameters the optimizer had already met: the first iteration that kept state, and each later
/// one whose kept state repeats, size for size, at least [`REMADE_REPEATED_SHARE`] of the first
/// one's bytes, made while no more gradient bytes were alive than at the first beyond the bytes
/// of the sizes it does not repeat.
///
/// Mechanism. An optimizer makes its state (Adam: two moments the size of each parameter; SGD
/// with momentum: one buffer) the first time its `step()` meets a parameter with a gradient, so
/// one optimizer makes each parameter's state once. State made again, of the same sizes, for as
/// many gradients as the first time, is a new optimizer over the same parameters (a restart, an
/// optimizer re-created per epoch or task); if none of it is ever freed, something keeps the old
/// optimizers (a list, their schedulers). The near misses: an optimizer dropped when the next is
/// made frees its state (evicted, `q15`); layers unfrozen one by one make state of the same sizes
/// again (identical blocks) but for parameters that just gained gradients, so more gradient
/// bytes are alive at each such step than at the first (`q16`). A model changed between
/// optimizers (a head of another width swapped in, the backbone kept: af16) makes state of new
/// sizes beside the repeated ones, and gradients for the new parameters alone: no more bytes
/// than their state, since a parameter's state is at least its size (SGD's momentum; Adam's two
/// moments are twice it). One optimizer handed a new parameter of the same size each iteration
/// (`add_param_group`: t06) makes state of repeated sizes too, but for a tensor made since, that
/// lives on: state made again is for old parameters only when new tensors of the repeated sizes,
/// lasting and made neither by a backward nor by an optimizer, are at most
/// `1 - REMADE_REPEATED_SHARE` of the repeated bytes.
fn remade_state(cx: &Context, g: &Group) -> Vec<usize> {
    let blocks = &cx.replay.blocks;
    // Per iteration: the sizes of the state kept from it, and the first event that made it.
    let mut made: BTreeMap<usize, (Vec<u64>, u32)> = BTreeMap::new();
    for &bi in &g.blocks {
        let b = &blocks[bi];
        let (Some(it), Some(at)) = (cx.iteration_of(b), b.alloc_event()) else { continue };
        let e = made.entry(it).or_insert((Vec::new(), at));
        e.0.push(b.size);
        e.1 = e.1.min(at);
    }
    if made.len() < cx.thresholds.min_leak_occurrences {
        return Vec::new();
    }
    for (sizes, _) in made.values_mut() {
        sizes.sort_unstable();
    }
    // Parameter gradients: parameter-sized blocks the autograd engine made.
    let gradients: Vec<(u32, Option<u32>, u64)> = blocks
        .iter()
        .filter(|b| cx.param_sizes.contains(&b.size) && matches!(cx.attr(b), Attr::Backward(_)))
        .filter_map(|b| Some((b.alloc_event()?, b.freed_at(), b.size)))
        .collect();
    let gradient_bytes_at =
        |t: u32| -> u64 { gradients.iter().filter(|(a, f, _)| *a < t && f.is_none_or(|f| f > t)).map(|g| g.2).sum() };
    let mut made = made.into_iter();
    let Some((first, (first_sizes, first_at))) = made.next() else { return Vec::new() };
    let first_gradients = gradient_bytes_at(first_at);
    let first_bytes: u64 = first_sizes.iter().sum();
    // Tensors that may be new parameters: of the first state's sizes, made by neither the
    // backward nor an optimizer, alive to the end of the trace; (made, size), in order.
    let size_set: FxHashSet<u64> = first_sizes.iter().copied().collect();
    let mut lasting: Vec<(u32, u64)> = blocks
        .iter()
        .filter(|b| b.freed_at().is_none() && size_set.contains(&b.size))
        .filter(|b| !matches!(cx.attr(b), Attr::Backward(_)) && !cx.stacks.get(cx.event_stack(b)).optimizer)
        .filter_map(|b| Some((b.alloc_event()?, b.size)))
        .collect();
    lasting.sort_unstable();
    let mut kept = vec![first];
    let mut previous = first_at;
    for (it, (sizes, at)) in made {
        let repeated = repeated_bytes(&first_sizes, &sizes);
        let new_sizes = sizes.iter().sum::<u64>() - repeated;
        // New parameters of the repeated sizes made since the previous state: their own state.
        let since = &lasting[lasting.partition_point(|l| l.0 < previous)..lasting.partition_point(|l| l.0 < at)];
        let new_parameters: u64 = since.iter().filter(|l| sizes.binary_search(&l.1).is_ok()).map(|l| l.1).sum();
        let remade = repeated as f64 >= REMADE_REPEATED_SHARE * first_bytes as f64
            && new_parameters as f64 <= (1.0 - REMADE_REPEATED_SHARE) * repeated as f64
            && gradient_bytes_at(at) <= first_gradients + new_sizes;
        if remade {
            kept.push(it);
            previous = at;
        }
    }
    kept
}

/// In how many runs each stack made a pass's blocks (`blocks`: one unit's), in allocation order:
/// a run is a stack's allocations with no other stack's between them. A statement of the model's
/// own `forward` that came back more than `MAX_RESULT_RUNS` times between other statements ran in
/// a loop inside the pass (a decoder's step), not once as a result does; a compiled graph makes
/// all its buffers in one run, from one stack.
fn runs_per_stack(cx: &Context, blocks: &[crate::lifecycle::UnitBlock]) -> FxHashMap<StackId, u32> {
    let mut in_pass: Vec<(u32, StackId)> = blocks
        .iter()
        .filter(|ub| ub.in_pass)
        .filter_map(|ub| {
            let b = &cx.replay.blocks[ub.block];
            Some((b.alloc_event()?, cx.event_stack(b)))
        })
        .collect();
    in_pass.sort_unstable();
    let mut runs: FxHashMap<StackId, u32> = FxHashMap::default();
    let mut previous = None;
    for &(_, stack) in &in_pass {
        if previous != Some(stack) {
            *runs.entry(stack).or_default() += 1;
        }
        previous = Some(stack);
    }
    runs
}

/// Runs of allocations one stack of a model's own `forward` may make in a pass and still be a
/// statement run once (2): a statement makes its tensors in one run (an operation and its
/// scratch, `topk`'s values and indices), or two when a helper it calls is called again by
/// another; one run in a Python loop inside the pass comes back once per step (ag08: 24).
const MAX_RESULT_RUNS: u32 = 2;

/// Share of the first optimizer state's bytes that state made later must repeat, size for size,
/// to be the same parameters' state made again (0.9): a model changed between two optimizers
/// changes a few layers (a new head), not most of its parameters.
const REMADE_REPEATED_SHARE: f64 = 0.9;

/// Bytes of the sizes two ascending lists share, each size counted as often as both hold it.
fn repeated_bytes(a: &[u64], b: &[u64]) -> u64 {
    let (mut i, mut j, mut bytes) = (0, 0, 0);
    while i < a.len() && j < b.len() {
        match a[i].cmp(&b[j]) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => {
                bytes += a[i];
                i += 1;
                j += 1;
            }
        }
    }
    bytes
}

/// The iterations whose kept optimizer state, from one `step()` line, outlived its parameters:
/// at least half its bytes in blocks of sizes that parameter-sized blocks alive when the state
/// was made had, all freed since, with no block of that size but optimizer state alive at the
/// end of the trace.
///
/// Mechanism. An optimizer makes a parameter's state with the parameter's shape (Adam:
/// `zeros_like(p)` twice) and holds the parameter itself in its groups, so while the optimizer
/// lives its parameters do. State still allocated after every tensor of its size but state
/// was freed is held without its optimizer: `opt.state_dict()` stored (its state entries are
/// the live tensors; the parameters become indices), or the state dicts copied out of
/// `opt.state`. Made again for each new model of a sweep whose models are deleted (s24), it
/// grows by a model's state per model. Parameters: blocks built at construction (`.cuda()`,
/// `Module.__init__`) or made before the trace. Conservative where another tensor of a state
/// block's size is alive at the end (the teacher of a distillation, a copy): not orphaned.
fn orphaned_state(cx: &Context, g: &Group) -> Vec<usize> {
    let blocks = &cx.replay.blocks;
    let own: FxHashSet<usize> = g.blocks.iter().copied().collect();
    let sizes: FxHashSet<u64> = g.blocks.iter().map(|&bi| blocks[bi].size).collect();
    // Per size: the (made, freed) events of parameter-like blocks freed in the trace, and
    // whether a block other than optimizer state is alive at the end.
    let mut freed_params: FxHashMap<u64, Vec<(Option<u32>, u32)>> = FxHashMap::default();
    let mut alive_at_end: FxHashSet<u64> = FxHashSet::default();
    for (bi, b) in blocks.iter().enumerate() {
        if !sizes.contains(&b.size) || own.contains(&bi) {
            continue;
        }
        let info = cx.stacks.get(cx.event_stack(b));
        match b.freed_at() {
            None if !info.optimizer => {
                alive_at_end.insert(b.size);
            }
            Some(freed) if info.construction || b.alloc_event().is_none() => {
                freed_params.entry(b.size).or_default().push((b.alloc_event(), freed));
            }
            _ => {}
        }
    }
    // Per iteration: kept state bytes, and those of it orphaned.
    let mut per_iteration: BTreeMap<usize, (u64, u64)> = BTreeMap::new();
    for &bi in &g.blocks {
        let b = &blocks[bi];
        let (Some(it), Some(made)) = (cx.iteration_of(b), b.alloc_event()) else { continue };
        let its_parameter_freed = !alive_at_end.contains(&b.size)
            && freed_params.get(&b.size).is_some_and(|ps| {
                ps.iter().any(|&(p_made, p_freed)| p_made.is_none_or(|m| m < made) && p_freed > made)
            });
        let e = per_iteration.entry(it).or_default();
        e.0 += b.size;
        if its_parameter_freed {
            e.1 += b.size;
        }
    }
    per_iteration
        .into_iter()
        .filter(|(_, (all, orphaned))| *orphaned * 2 >= *all && *all > 0)
        .map(|(it, _)| it)
        .collect()
}

/// The kept occurrence that follows the longest run of eligible occurrences that kept nothing
/// (the first such run when several are as long), or the first kept one when no such run exists:
/// `kept` and `eligible` ascending and distinct.
fn resumed_after_longest_pause(kept: &[usize], eligible: &[usize]) -> Option<usize> {
    let mut best = (0, *kept.first()?);
    for w in kept.windows(2) {
        let p = super::occurrences_between(eligible, w[0], w[1]);
        if p > best.0 {
            best = (p, w[1]);
        }
    }
    Some(best.1)
}

/// Tensors re-made larger from their previous version, iteration after iteration, and never
/// let go: `queue = torch.cat([queue, k])`, `buf = torch.cat([buf, new])`.
///
/// Mechanism. Such a line allocates the new, larger tensor while the old one is still alive
/// (it is the input of the `cat`), then the rebinding frees the old one. No block survives from
/// one iteration to the next, so counting kept blocks per iteration sees nothing, yet the one
/// live tensor grows by what each iteration appends. Per user line outside model calls, the
/// blocks in allocation order form a *chain* when each is freed only after the next one from
/// the line was allocated and is smaller than it; the chain must end in a block alive at the end
/// of the trace and span `min_leak_occurrences` iterations or more, at least
/// `leak_occurrence_share` of those the line allocated in. The suspect's blocks are the chain,
/// so its live bytes are the tensor's size at each moment and its growth the median increase per
/// iteration. A buffer that grows within one evaluation and dies with it ends freed: not a
/// chain to the end. Lines already reported by the per-iteration count are left alone.
///
/// A chain whose blocks are the inputs of forward passes that grew with them is not one tensor
/// fed from its own past but a workload whose shapes grow (`input_growth`): a sequence-length
/// curriculum, progressive resizing, decoding without a KV cache (`ids = torch.cat([ids, tok])`
/// then `model(ids)`). Memory climbs because the shapes do; no reference keeps anything. It is
/// said in a caveat instead ([`input_growth`]).
fn regrown(cx: &Context, reported: &BTreeSet<Option<FrameId>>) -> Vec<Finding> {
    let mut out = Vec::new();
    for grown in cx.growing_chains().iter().filter(|c| !reported.contains(&Some(c.site))) {
        let (site, eligible) = (grown.site, grown.eligible);
        // Every tensor's versions together, in allocation order: the suspect's blocks.
        let mut chain = grown.tensors.concat();
        chain.sort_unstable();
        if grown.tensors.iter().any(|t| feeds_growing_passes(cx, t).is_some()) {
            continue;
        }
        let bs = &cx.replay.blocks;
        let last = *chain.last().unwrap();
        let iters: BTreeSet<usize> = chain.iter().filter_map(|&bi| cx.iteration_of(&bs[bi])).collect();
        let stack = cx.event_stack(&bs[last]);
        out.push(Finding {
            occurrences: iters.len(),
            kind: SuspectKind::ReferenceLeak,
            severity: Severity::Leak,
            confidence: cx.growth_confidence(iters.len(), eligible),
            occurrence: Occurrence::Iteration,
            boundaries: cx.iteration_boundaries(),
            bytes: None,
            site: Some(cx.site(site)),
            stack,
            facts: Evidence::ReferenceLeak {
                origin: LeakOrigin::Regrown,
                blocks: chain.len() as u64,
                occurrences: iters.len(),
                eligible,
                occurrence: Occurrence::Iteration,
                made_at: None,
                before_trace: None,
                operations: None,
                tensors: Some(grown.tensors.len()),
                cleared: None,
                level: None,
                kept_with: Vec::new(),
            },
            blocks: chain,
        });
    }
    out
}

/// Did the program hold more as the re-made tensors grew? Between the starts of the iteration
/// after the chain's first version and of the one that made its last, the allocated level must
/// rise by `regrown_level_share` of what the versions alive at those two moments grew (see
/// [`Thresholds::regrown_level_share`]: a tensor that grows while another shrinks as much moved
/// bytes, it did not leak them). Chains over fewer iterations than that leave it unsaid (yes).
///
/// [`Thresholds::regrown_level_share`]: crate::Thresholds
fn held_more(cx: &Context, chain: &[usize]) -> bool {
    let bs = &cx.replay.blocks;
    let (Some(first), Some(last)) =
        (chain.first().and_then(|&b| cx.iteration_of(&bs[b])), chain.last().and_then(|&b| cx.iteration_of(&bs[b])))
    else {
        return true;
    };
    if last < first + 2 {
        return true;
    }
    // (bytes of the chain's versions allocated, allocated level) just before an event.
    let before = |s: u32| {
        let t = s.checked_sub(1);
        let held: u64 = chain
            .iter()
            .map(|&b| &bs[b])
            .filter(|b| b.state_after(t) == Some(BlockState::Allocated))
            .map(|b| b.size)
            .sum();
        (held, cx.replay.series.after(t.map(|i| i as usize)).allocated)
    };
    let (held_then, level_then) = before(cx.phases.iteration_span(first + 1).start);
    let (held_now, level_now) = before(cx.phases.iteration_span(last).start);
    let grew = held_now.saturating_sub(held_then) as f64;
    level_now.saturating_sub(level_then) as f64 >= cx.thresholds.regrown_level_share * grew
}

/// Lines whose re-made, growing tensor is the input of forward passes that grew with it: `(line,
/// bytes of its first and last block, bytes the passes they fed allocated)`. Said in a caveat:
/// memory grows with the shapes of the work, which the snapshot shows; whether the schedule ever
/// stops growing it does not.
pub(crate) fn input_growth(cx: &Context) -> Vec<(FrameId, [u64; 2], [u64; 2])> {
    if state_only::reading(cx).is_some() {
        return Vec::new();
    }
    let bs = &cx.replay.blocks;
    cx.growing_chains()
        .iter()
        .filter_map(|grown| {
            // The tensor that grew the most speaks for the line.
            let chain =
                grown.tensors.iter().max_by_key(|t| bs[*t.last().unwrap()].size.saturating_sub(bs[t[0]].size))?;
            let passes = feeds_growing_passes(cx, chain)?;
            let last = bs[*chain.last().unwrap()].size;
            (last >= cx.thresholds.min_suspect_bytes).then_some((grown.site, [bs[chain[0]].size, last], passes))
        })
        .collect()
}

/// Mechanism. A pass reads its input, and what it allocates (activations, saved tensors,
/// outputs) is an affine function of the input's size whose size-independent part holds no
/// activation: so when the input grows, the pass grows by at least as many bytes as the input
/// did (its first layer's output alone is as large as the input for any layer that keeps the
/// length: embeddings, linears, convolutions, attention). A tensor fed from its own past (a
/// MoCo queue) and used after the model leaves the passes as they were. The chain's first and
/// last blocks must each be alive when the next pass after them starts (`x = next(batches)`,
/// then `model(x)`); the answer is the bytes those two passes allocated inside their module
/// calls, when the later one allocated at least the input's growth more.
fn feeds_growing_passes(cx: &Context, chain: &[usize]) -> Option<[u64; 2]> {
    let lc = cx.lifecycle;
    let bs = &cx.replay.blocks;
    // The first pass that starts after the block was made, while it is still alive.
    let pass_bytes = |bi: usize| -> Option<u64> {
        let a = bs[bi].alloc_event()?;
        let u = lc.units.partition_point(|u| u.pass_span.start <= a);
        let unit = lc.units.get(u)?;
        bs[bi]
            .freed_at()
            .is_none_or(|f| f > unit.pass_span.start)
            .then(|| lc.blocks[u].iter().filter(|b| b.in_pass).map(|b| bs[b.block].size).sum())
    };
    let (first, last) = (*chain.first()?, *chain.last()?);
    let (p0, p1) = (pass_bytes(first)?, pass_bytes(last)?);
    (p1.saturating_sub(p0) >= bs[last].size.saturating_sub(bs[first].size)).then_some([p0, p1])
}

/// A user line's re-made, growing tensors (see [`chains`]).
pub(crate) struct Chain {
    pub(crate) site: FrameId,
    /// Each tensor's versions (block indices in allocation order), the last alive at the end.
    pub(crate) tensors: Vec<Vec<usize>>,
    /// The iterations growth is counted against: those the line allocated in, or for a line
    /// inside a model call those from its first allocation to the end.
    pub(crate) eligible: usize,
}

/// Candidate chains (see [`regrown`]): per user line, the versions of the tensor it re-makes
/// larger, when that is growth. Asked by [`regrown`] and by [`input_growth`]; made once per
/// context ([`Context::growing_chains`]).
///
/// A line inside a model call (the model's own code re-making a tensor it holds, as a MoCo
/// module's `self.queue = torch.cat([self.queue, k])` in its `forward`: ah11) counts too, with a
/// stricter share: the chain must grow in `leak_occurrence_share` of the iterations from the
/// line's first allocation to the end of the trace, not of those the line allocated in (so a
/// buffer the model re-made from empty after letting an earlier version go, a bank reset every
/// epoch, is counted from before its reset). A model's intermediates die with their pass
/// (backward frees them, or the next pass's output replaces the previous one at the same size),
/// so a chain across passes is a tensor the model keeps; but a model also keeps bounded caches
/// it re-makes larger only when a longer input than any before comes (a rotary table, a causal
/// mask), at ever rarer iterations, while a queue fed every step grows in every one.
/// transformers' KV cache (re-made larger each token, let go with its request) is left out.
///
/// The line's blocks in allocation order are one tensor's versions when each is freed after the
/// next was made. When they are not, the line may re-make several tensors, one per call (each
/// layer of a model running `self.mem = torch.cat([self.mem, h])`: aj04), or make a temporary
/// beside each version; then [`versions_per_call`] pairs each version with its own previous one.
pub(crate) fn chains(cx: &Context) -> Vec<Chain> {
    // Each line's blocks, in allocation order. One thread: this runs inside a `OnceLock`'s
    // initialization, where a thread waiting on rayon's jobs could pick up one that asks for the
    // same lock.
    let mut by: BTreeMap<(FrameId, bool), Vec<usize>> = BTreeMap::new();
    for (bi, b) in cx.replay.blocks.iter().enumerate() {
        if b.alloc_event().is_none() {
            continue;
        }
        let info = cx.stacks.get(b.stack);
        let user_code = info.python
            && !(info.kv_cache || info.optimizer || info.construction || info.recompute || info.backward_launch);
        if let Some(site) = info.site.filter(|_| user_code) {
            by.entry((site, info.forward)).or_default().push(bi);
        }
    }
    let mut out = Vec::new();
    for ((site, in_model), blocks) in by {
        let bs = &cx.replay.blocks;
        // Blocks are in allocation order. Walk back from the last one while the chain holds.
        let Some(&last) = blocks.last() else { continue };
        if bs[last].freed_at().is_some() {
            continue;
        }
        let eligible = if in_model {
            let first = blocks.iter().find_map(|&bi| cx.iteration_of(&bs[bi]));
            first.map_or(0, |first| cx.phases.iteration_count().saturating_sub(first))
        } else {
            blocks.iter().filter_map(|&bi| cx.iteration_of(&bs[bi])).collect::<BTreeSet<usize>>().len()
        };
        let grows = |chain: &[usize]| {
            let iters: BTreeSet<usize> = chain.iter().filter_map(|&bi| cx.iteration_of(&bs[bi])).collect();
            cx.is_growth(iters.len(), eligible)
        };
        let mut chain = vec![last];
        for w in blocks.windows(2).rev() {
            let (prev, next) = (&bs[w[0]], &bs[w[1]]);
            let replaced = prev.freed_at().zip(next.alloc_event()).is_some_and(|(f, a)| f > a);
            if w[1] != *chain.last().unwrap() || !replaced || prev.size >= next.size {
                break;
            }
            chain.push(w[0]);
        }
        chain.reverse();
        let tensors = if grows(&chain) {
            vec![chain]
        } else {
            let per_call: Vec<Vec<usize>> = versions_per_call(cx, &blocks)
                .into_iter()
                .filter(|(t, reset)| grows(t) && beyond_reset(bs, t, *reset) && held_more(cx, t))
                .map(|(t, _)| t)
                .collect();
            if per_call.len() >= 2 {
                per_call
            } else {
                Vec::new()
            }
        };
        if tensors.is_empty() {
            continue;
        }
        out.push(Chain { site, tensors, eligible });
    }
    out
}

/// Does a chain grow past the version it replaced when the tensor was last re-made no larger
/// (`reset`: that version's requested size)? A tensor re-made from itself only grows; one re-made
/// smaller was reset (a bank emptied each epoch) or is re-made from data whose size comes and goes
/// (a random graph's edges). Growth since then is unbounded only once it passes the size the line
/// had made before: until then, the program has already held that much.
fn beyond_reset(bs: &[BlockLifetime], chain: &[usize], reset: Option<u64>) -> bool {
    reset.is_none_or(|r| chain.last().is_some_and(|&l| bs[l].requested_size > r))
}

/// The versions of each tensor one line re-makes larger, when the line re-makes several (one
/// per call in a pass) or makes a temporary beside each version: per block alive at the end,
/// its versions in allocation order, back to the first one, with the requested size of a
/// version it replaced that was no smaller (a reset, see [`beyond_reset`]).
///
/// Mechanism. `x = torch.cat([x, new])` allocates the new version while the old one is its
/// input, and the rebinding frees the old one before the statement is done, so before the line
/// runs again (for the next layer, or the next step). So a version's previous one is a smaller
/// block of the line, made before it and freed after it was made but before the line's next
/// allocation. A temporary the line made for the same statement (`F.normalize(k)` inside the
/// `cat`) is freed in that window too and is smaller than the previous version once the tensor
/// has grown past one addition: the largest candidate is taken. Each block is one tensor's
/// version at most.
fn versions_per_call(cx: &Context, blocks: &[usize]) -> Vec<(Vec<usize>, Option<u64>)> {
    let bs = &cx.replay.blocks;
    let mut frees: Vec<(u32, usize)> = blocks.iter().filter_map(|&bi| Some((bs[bi].freed_at()?, bi))).collect();
    frees.sort_unstable();
    let mut taken = vec![false; blocks.len()];
    let position = |bi: usize| blocks.binary_search(&bi).expect("a block of the line");
    let mut out = Vec::new();
    for (start, &last) in blocks.iter().enumerate().rev() {
        if taken[start] || bs[last].freed_at().is_some() {
            continue;
        }
        taken[start] = true;
        let mut versions = vec![last];
        let mut reset = None;
        let mut at = start;
        loop {
            let bi = blocks[at];
            let Some(made) = bs[bi].alloc_event() else { break };
            let line_runs_again = blocks.get(at + 1).and_then(|&n| bs[n].alloc_event()).unwrap_or(u32::MAX);
            let from = frees.partition_point(|&(f, _)| f <= made);
            let (smaller, larger): (Vec<_>, Vec<_>) = frees[from..]
                .iter()
                .take_while(|&&(f, _)| f < line_runs_again)
                .filter(|&&(_, p)| p < bi && !taken[position(p)])
                .partition(|&&(_, p)| bs[p].requested_size < bs[bi].requested_size);
            let previous = smaller.into_iter().max_by_key(|&&(f, p)| (bs[p].requested_size, std::cmp::Reverse(f)));
            let Some(&(_, p)) = previous else {
                reset = larger.iter().map(|&&(_, p)| bs[p].requested_size).min();
                break;
            };
            at = position(p);
            taken[at] = true;
            versions.push(p);
        }
        if versions.len() > 1 {
            versions.reverse();
            out.push((versions, reset));
        }
    }
    out
}

/// A state-only group that is not shaped like kept graphs: many live blocks from one line.
/// Without stacks in the trace its events still say when each block was made: the iterations
/// that made some of them (of all the trace's iterations). Without a trace, none (0 of 0).
///
/// Without a trace the group is `held`, not `leak`: many blocks from one line alive at once are
/// what a full bounded store (an LRU, a replay buffer, a dataset cached on the GPU) holds as much
/// as what a forgotten reference keeps, and only *when* they were made tells the two apart (42 of
/// the 353 clean scored fixtures, emptied of their traces, read as leaks before: bounded stores
/// all). With a trace whose events carry no stacks, the groups that reach here were made over the
/// trace's iterations ([`state_only::read`] drops the working sets), so they are leaks.
fn state_only_finding(cx: &Context, origin: LeakOrigin, g: &state_only::Group) -> Finding {
    let made_in: BTreeSet<usize> = g.blocks.iter().filter_map(|&bi| cx.iteration_of(&cx.replay.blocks[bi])).collect();
    let iterations = if made_in.is_empty() { 0 } else { cx.phases.iteration_count() };
    Finding {
        occurrences: 0,
        kind: SuspectKind::ReferenceLeak,
        severity: if origin == LeakOrigin::StateOnly { Severity::Held } else { Severity::Leak },
        confidence: cx.thresholds.state_only_confidence,
        occurrence: Occurrence::Iteration,
        boundaries: Vec::new(),
        bytes: None,
        site: Some(cx.site(g.line)),
        stack: g.stack,
        facts: Evidence::ReferenceLeak {
            origin,
            blocks: g.blocks.len() as u64,
            occurrences: made_in.len(),
            eligible: iterations,
            occurrence: Occurrence::Iteration,
            made_at: None,
            before_trace: None,
            operations: g.operations_without_twins,
            tensors: None,
            cleared: None,
            level: None,
            kept_with: Vec::new(),
        },
        blocks: g.blocks.clone(),
    }
}
