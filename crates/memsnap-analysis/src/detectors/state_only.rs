//! Reading a device from its dump alone: a file with no trace (`enabled="state"`), or a trace
//! whose events carry no stacks while the dump's blocks do (`context="state"`: the allocator keeps
//! a stack only for blocks still allocated).
//!
//! Mechanism. Then no event can be placed in a pass or an iteration: what speaks is the blocks
//! alive at the dump, each with the stack that made it, grouped by the line that made them (the
//! line that ran the model, for tensors made inside a model call). A trace without stacks still
//! says *when* each live block was made: a group made in only a few parts of it did not
//! accumulate (see [`groups`]).
//!
//! Two shapes of group, told apart by what holds the intermediate tensors of a forward pass. A
//! model's operations make tensors that die when the pass returns unless something holds them.
//! Autograd holds, per pass, what each operation saved for the backward: the inputs of its
//! matmuls, the outputs of its activations and softmaxes, its dropout masks, its norms'
//! statistics, made by many different operations of the model. A hook, a returned
//! `hidden_states` tuple or a cache holds the output of one operation, per layer. So a group
//! whose live blocks were made inside a model call by at least `state_graph_min_ops` different
//! operations, each alive at least `min_leak_occurrences` times, is kept graphs: the tensors
//! autograd saved in several passes (an operation of every layer is alive once per layer and
//! pass), alive because something references a tensor that carries
//! the graph (a loss or an output kept without `.item()` / `.detach()`), read as
//! `retained_graph` (its `GraphHold::SeenAtDump`). The rest is `reference_leak`'s: many live
//! blocks from one line. A user's `saved_tensors_hooks` that stashes every saved tensor looks the
//! same from the dump (q08), and so reads as graphs kept.
//!
//! Gradients are made by the autograd engine's own thread, which runs no Python: their blocks
//! have no Python frame, and each has its parameter's size. A program holds one gradient per
//! parameter (the current `.grad`s); more blocks of a parameter's size without a Python frame are
//! gradients of earlier backward passes that something keeps (a log of `p.grad`), read as
//! `unreleased_gradient` ([`kept_gradients`]). Gradient accumulation adds into the same `.grad`,
//! and optimizer state is made by Python code, so neither is counted.

use std::collections::{BTreeMap, BTreeSet};

use memsnap_model::{FrameId, StackId};

use super::Context;
use crate::evidence::LeakOrigin;

/// How this device must be read from its dump alone, if it must: no allocation in its trace
/// (`LeakOrigin::StateOnly`), or allocations without stacks while the dump's blocks have them
/// (`LeakOrigin::DumpStacksOnly`). `None` when the trace can be read.
pub(crate) fn reading(cx: &Context) -> Option<LeakOrigin> {
    if !cx.traced {
        Some(LeakOrigin::StateOnly)
    } else if stacks_only_at_dump(cx) {
        Some(LeakOrigin::DumpStacksOnly)
    } else {
        None
    }
}

/// Live blocks at the dump from one line.
pub(crate) struct Group {
    /// The line that made them (the line that ran the model, for tensors made inside one).
    pub line: FrameId,
    /// Indices into the replay's blocks.
    pub blocks: Vec<usize>,
    /// The stack of the largest block the line made.
    pub stack: StackId,
    /// Set when the blocks are kept graphs' saved tensors (see the module comment).
    pub graph: Option<GraphShape>,
}

/// What makes a group read as kept graphs.
pub(crate) struct GraphShape {
    /// Operations inside the model call that made blocks alive at least `min_leak_occurrences`
    /// times each.
    pub ops: usize,
    /// The iterations of the trace the group's blocks were made in, the stretch before the
    /// first boundary counted as one (`None` without a trace that has iterations): how many
    /// passes' graphs are kept, when one pass runs per iteration.
    pub iterations: Option<usize>,
    /// The lines inside the model whose blocks are alive, most bytes first (up to 3).
    pub lines: Vec<FrameId>,
}

/// The groups of this device, read as `origin` says (from [`reading`]). With a trace without
/// stacks, not those whose blocks were all made in the trace and in fewer than
/// `min_leak_occurrences` of as many equal parts of it: a leak repeats, and a group made in a
/// few parts of the trace did not accumulate while the rest of it ran; it is the working set the
/// program held at the dump (the last request's KV cache, a cache made once), said in a caveat
/// ([`state_working_sets`]).
///
/// Where groups read as kept graphs, a group whose every block a loss function made joins the
/// largest of them: the loss's saved tensors (the log-probabilities `cross_entropy` saves) belong
/// to the graph that runs from the loss back through the model, so they are kept with it, and
/// read alone they would name the loss line as a second leak.
pub(crate) fn groups(cx: &Context, origin: LeakOrigin) -> Vec<Group> {
    let groups: Vec<Group> = state_groups(cx)
        .into_iter()
        .filter(|(_, (blocks, _))| origin != LeakOrigin::DumpStacksOnly || made_in_parts(cx, blocks).is_none())
        .map(|(line, (blocks, stack))| Group { line, graph: graph_shape(cx, &blocks), blocks, stack })
        .collect();
    let bytes = |g: &Group| g.blocks.iter().map(|&bi| cx.replay.blocks[bi].size).sum::<u64>();
    let Some(largest_graph) = (0..groups.len())
        .filter(|&i| groups[i].graph.is_some())
        .max_by_key(|&i| (bytes(&groups[i]), std::cmp::Reverse(i)))
    else {
        return groups;
    };
    let mut loss_blocks = Vec::new();
    let mut kept = Vec::with_capacity(groups.len());
    let mut graph_at = 0;
    for (i, g) in groups.into_iter().enumerate() {
        if g.graph.is_none() && g.blocks.iter().all(|&bi| block_info(cx, bi).loss) {
            loss_blocks.extend(g.blocks);
            continue;
        }
        if i == largest_graph {
            graph_at = kept.len();
        }
        kept.push(g);
    }
    kept[graph_at].blocks.extend(loss_blocks);
    kept[graph_at].blocks.sort_unstable();
    kept
}

/// The stack facts of live block `bi` (its stack as [`dump_stack`] reads it).
fn block_info(cx: &Context, bi: usize) -> crate::stacks::StackInfo {
    cx.stacks.get(dump_stack(cx, &cx.replay.blocks[bi]))
}

/// The stack of block `b`: the dump's where the block's own has no frames
/// ([`crate::with_dump_stack`]).
fn dump_stack(cx: &Context, b: &memsnap_replay::BlockLifetime) -> StackId {
    crate::with_dump_stack(b, cx.replay.device, cx.dump_stacks).stack
}

/// The shape of kept graphs, when `blocks` have it (see the module comment).
fn graph_shape(cx: &Context, blocks: &[usize]) -> Option<GraphShape> {
    let th = cx.thresholds;
    // Per operation (the innermost Python frame: the library or model line that ran it), the
    // live blocks it made inside a model call.
    let mut per_op: BTreeMap<FrameId, usize> = BTreeMap::new();
    let mut per_line: BTreeMap<FrameId, u64> = BTreeMap::new();
    for &bi in blocks {
        let info = block_info(cx, bi);
        let Some(op) = info.innermost_python.filter(|_| info.forward) else { continue };
        *per_op.entry(op).or_default() += 1;
        if let Some(line) = info.module_call.or(info.site) {
            *per_line.entry(line).or_default() += cx.replay.blocks[bi].size;
        }
    }
    let repeated: Vec<usize> = per_op.into_values().filter(|&n| n >= th.min_leak_occurrences).collect();
    if (repeated.len() as u64) < th.state_graph_min_ops {
        return None;
    }
    let mut lines: Vec<(FrameId, u64)> = per_line.into_iter().collect();
    lines.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    Some(GraphShape {
        ops: repeated.len(),
        // Stretches of the trace between iteration boundaries, the one before the first
        // included: a boundary found by the optimizer's step ends a pass's iteration, so the
        // first pass comes before it.
        iterations: (cx.phases.boundaries.len() >= 2).then(|| {
            let bounds = &cx.phases.boundaries;
            blocks
                .iter()
                .filter_map(|&bi| cx.replay.blocks[bi].alloc_event())
                .map(|a| bounds.partition_point(|&b| b <= a))
                .collect::<BTreeSet<usize>>()
                .len()
        }),
        lines: lines.into_iter().take(3).map(|(l, _)| l).collect(),
    })
}

/// Gradients of earlier backward passes alive at the dump, read from the dump alone (see the
/// module comment).
pub(crate) struct KeptGradients {
    /// The kept blocks: per parameter size, those without a Python frame beyond one per
    /// parameter (the latest made are left out as the current gradients).
    pub blocks: Vec<usize>,
    /// Parameter sizes that have kept gradients.
    pub sizes: usize,
    /// The fewest blocks without a Python frame per parameter, over those sizes: the gradients
    /// of at least this many backward passes are alive, the current ones included.
    pub generations: usize,
}

/// Kept gradients, when at least `min_gradients_per_step` parameter sizes have, per parameter of
/// that size, at least `min_leak_occurrences` blocks without a Python frame beyond the current
/// gradient (a leak repeats, and a backward makes gradients of several sizes). Parameters are the
/// live blocks made by construction code (`Module.to`, `__init__`) and, with a trace, those made
/// before it. Without a trace, a block made before recording has no stack at all, like a
/// gradient under `stacks="python"` (the model and its optimizer state, made before recording,
/// would pass for gradients), so only blocks with native frames and no Python one count: the
/// engine's, under `stacks="all"`.
pub(crate) fn kept_gradients(cx: &Context, origin: LeakOrigin) -> Option<KeptGradients> {
    let th = cx.thresholds;
    let traced = origin == LeakOrigin::DumpStacksOnly;
    let mut params: BTreeMap<u64, usize> = BTreeMap::new();
    let mut frameless: BTreeMap<u64, Vec<(u32, usize)>> = BTreeMap::new();
    for (bi, b, stack) in live_blocks_with_stacks(cx) {
        let info = cx.stacks.get(stack);
        let made = b.alloc_event();
        if info.construction || (traced && made.is_none()) {
            *params.entry(b.size).or_default() += 1;
        } else if !info.python && (traced || stack != StackId::EMPTY) {
            frameless.entry(b.size).or_default().push((made.unwrap_or(0), bi));
        }
    }
    let mut blocks = Vec::new();
    let (mut sizes, mut generations) = (0usize, usize::MAX);
    for (size, mut made) in frameless {
        let Some(&n) = params.get(&size) else { continue };
        if made.len() < (th.min_leak_occurrences + 1) * n {
            continue;
        }
        made.sort_unstable();
        generations = generations.min(made.len() / n);
        sizes += 1;
        blocks.extend(made[..made.len() - n].iter().map(|&(_, bi)| bi));
    }
    if (sizes as u64) < th.min_gradients_per_step {
        return None;
    }
    blocks.sort_unstable();
    Some(KeptGradients { blocks, sizes, generations })
}

/// Does this device's trace have allocations, none with a user frame, while some block alive at
/// the dump has the dump's stack (`Context::dump_stacks`)?
fn stacks_only_at_dump(cx: &Context) -> bool {
    if cx.dump_stacks.is_empty() {
        return false;
    }
    let allocs = || cx.events.iter().filter(|e| e.action() == memsnap_model::Action::Alloc);
    if allocs().next().is_none() || allocs().any(|e| !cx.stacks.userless(e.stack)) {
        return false;
    }
    let dev = cx.replay.device;
    cx.replay.blocks.iter().any(|b| b.freed_at().is_none() && cx.dump_stacks.contains_key(&(dev, b.address)))
}

/// The state-only groups of at least `state_min_same_site_blocks` live blocks: line -> (blocks,
/// the stack of the largest). Blocks of transformers' KV cache are left out: a model holds one
/// key and one value tensor per layer while it decodes (a 32-layer model, 64 blocks from the
/// line that runs it), so at a dump taken during or right after generation they are many
/// blocks from one line, and a dump alone cannot tell one request's cache from caches kept
/// across requests (n24; [`state_kv_cache`] says so in a caveat).
fn state_groups(cx: &Context) -> BTreeMap<FrameId, (Vec<usize>, StackId)> {
    let mut by: BTreeMap<FrameId, (Vec<usize>, StackId, u64)> = BTreeMap::new();
    for (bi, b, stack) in live_blocks_with_stacks(cx) {
        let info = cx.stacks.get(stack);
        if info.construction || info.optimizer || info.backward_launch || info.recompute || info.kv_cache {
            continue;
        }
        let Some(line) = info.forward_call.or(info.site) else { continue };
        let e = by.entry(line).or_insert((Vec::new(), stack, 0));
        e.0.push(bi);
        if b.size > e.2 {
            e.1 = stack;
            e.2 = b.size;
        }
    }
    by.into_iter()
        .filter(|(_, (blocks, _, _))| blocks.len() as u64 >= cx.thresholds.state_min_same_site_blocks)
        .map(|(line, (blocks, stack, _))| (line, (blocks, stack)))
        .collect()
}

/// KV-cache blocks alive at the dump that the state-only reading left out (see [`state_groups`]):
/// `(blocks, bytes)`, when the file is read from its state alone (no trace, or one without
/// stacks) and there are any.
pub(crate) fn state_kv_cache(cx: &Context) -> Option<(usize, u64)> {
    reading(cx)?;
    let (n, bytes) = live_blocks_with_stacks(cx)
        .filter(|&(_, _, stack)| cx.stacks.get(stack).kv_cache)
        .fold((0usize, 0u64), |(n, s), (_, b, _)| (n + 1, s + b.size));
    (n > 0).then_some((n, bytes))
}

/// The blocks alive at the dump, with their stacks ([`dump_stack`]), as the state-only reading
/// sees them.
fn live_blocks_with_stacks<'c>(
    cx: &'c Context,
) -> impl Iterator<Item = (usize, &'c memsnap_replay::BlockLifetime, StackId)> + 'c {
    cx.replay
        .blocks
        .iter()
        .enumerate()
        .filter(|(_, b)| b.freed_at().is_none())
        .map(|(bi, b)| (bi, b, dump_stack(cx, b)))
}

/// `Some(k)` when every block was made in the trace and they fall in only `k` (fewer than
/// `min_leak_occurrences`) of as many equal parts of it, by event index.
fn made_in_parts(cx: &Context, blocks: &[usize]) -> Option<usize> {
    let n = cx.events.len() as u64;
    let parts = cx.thresholds.min_leak_occurrences as u64;
    if n == 0 || parts == 0 {
        return None;
    }
    let made: Option<BTreeSet<u64>> =
        blocks.iter().map(|&bi| cx.replay.blocks[bi].alloc_event().map(|a| a as u64 * parts / n)).collect();
    made.filter(|m| (m.len() as u64) < parts).map(|m| m.len())
}

/// Groups that a trace without stacks shows to be a working set, not growth (see
/// [`groups`]): `(line, blocks, bytes, parts of the trace they were made in)`.
pub(crate) fn state_working_sets(cx: &Context) -> Vec<(FrameId, usize, u64, usize)> {
    if reading(cx) != Some(LeakOrigin::DumpStacksOnly) {
        return Vec::new();
    }
    state_groups(cx)
        .into_iter()
        .filter_map(|(line, (blocks, _))| {
            let parts = made_in_parts(cx, &blocks)?;
            let bytes = blocks.iter().map(|&bi| cx.replay.blocks[bi].size).sum();
            (bytes >= cx.thresholds.min_suspect_bytes).then_some((line, blocks.len(), bytes, parts))
        })
        .collect()
}
