//! Reading a device from its dump alone: a file with no trace (`enabled="state"`), or a trace
//! whose events carry no stacks while the dump's blocks do (`context="state"`: the allocator keeps
//! a stack only for blocks still allocated).
//!
//! Mechanism. Then no event can be placed in a pass or an iteration: what speaks is the blocks
//! alive at the dump, each with the stack that made it, grouped by the line that made them (the
//! line that ran the model, for tensors made inside a model call). A trace without stacks still
//! says *when* each live block was made: a group made in only a few parts of it did not
//! accumulate (see [`read`]), a code path that made its few blocks in one iteration made them
//! once, and one that made them in many iterations repeated ([`sift_by_iteration`]).
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
//! blocks from one line.
//!
//! A forward hook on every leaf module keeps one output per module call, and so as many
//! different operations' tensors as a graph (s36: a CNN's convolutions, norms, activations,
//! poolings). What tells autograd apart is what it saves that no module returns: a norm's
//! statistics (`batch_norm`'s mean and inverse deviation per channel, `layer_norm`'s per row),
//! two blocks of one size that one call of an operation makes one right after the other, with
//! one stack ([`twins`]). So
//! with a trace (its events without stacks) a group reads as graphs only when its blocks show
//! at least `min_leak_occurrences` such twins; without them it stays `reference_leak`'s, and
//! says that it could be graphs of a model that saves no twins (no norm, or a batch norm in
//! eval mode, which uses its running statistics: an evaluation without `no_grad`, z29, n02,
//! s22). Twins are enough on their own, too: a model of fewer operations (an LSTM or GRU
//! cell, whose saved gates come in twins; a small MLP with a norm) kept graphs show them (z03,
//! u12, g01, u14, v11), and no module returns them. The exception is an operation with two
//! outputs of one size that a user keeps (an LSTM's `(h, c)` kept detached each step), which
//! would read as graphs. Without a trace nothing tells them apart, and the count of operations
//! decides. A
//! user's `saved_tensors_hooks` that stashes every saved tensor keeps what a graph keeps: q08's
//! model has no norm and reads as kept tensors, as it should; with norms it would read as graphs.
//! Hooks on modules of one type and shape that run one after the other (a layer's `q_proj`,
//! `k_proj` and `v_proj` without grouped keys: s40) make outputs of one operation and size with
//! no allocation between, but from different caller lines; twins are one call's, of one stack.
//!
//! Gradients are made by the autograd engine's own thread, which runs no Python: their blocks
//! have no Python frame, and each has its parameter's size. A program holds one gradient per
//! parameter (the current `.grad`s); more blocks of a parameter's size without a Python frame are
//! gradients of earlier backward passes that something keeps (a log of `p.grad`), read as
//! `unreleased_gradient` ([`kept_gradients`]). Gradient accumulation adds into the same `.grad`,
//! and optimizer state is made by Python code, so neither is counted.

use std::collections::{BTreeMap, BTreeSet};

use memsnap_model::{Action, FrameId, StackId};

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
    /// The stack it is shown with (`group_stack`: the largest block's of a repeating code path).
    pub stack: StackId,
    /// Set when the blocks are kept graphs' saved tensors (see the module comment).
    pub graph: Option<GraphShape>,
    /// The operations that made the blocks, when they are as many as kept graphs' but the
    /// trace shows no twins ([`twins`]): outputs kept per module, or graphs without twins.
    pub operations_without_twins: Option<usize>,
}

/// What makes a group read as kept graphs.
pub(crate) struct GraphShape {
    /// Operations inside the model call that made blocks alive at least `min_leak_occurrences`
    /// times each.
    pub ops: usize,
    /// When the group's blocks were made, per stretch of the trace ([`stretches_made_in`];
    /// `None` without a trace that has iterations): [`GraphShape::iterations`] counts them, and
    /// [`inputs_of_graphs`] reads the batch made before each.
    stretches: Option<GraphStretches>,
    /// The lines inside the model whose blocks are alive, most bytes first (up to 3).
    pub lines: Vec<FrameId>,
    /// User lines whose blocks joined as the passes' inputs ([`inputs_of_graphs`]).
    pub input_lines: Vec<FrameId>,
}

impl GraphShape {
    /// The iterations of the trace the group's blocks were made in, the stretch before the
    /// first boundary counted as one (`None` without a trace that has iterations): how many
    /// passes' graphs are kept, when one pass runs per iteration. A boundary found by the
    /// optimizer's step ends a pass's iteration, so the first pass comes before it.
    pub fn iterations(&self) -> Option<usize> {
        self.stretches.as_ref().map(|s| s.first_made.len())
    }
}

/// A device read from its dump alone: what both detectors (`reference_leak`, `retained_graph`)
/// and the caveats take, computed once per device ([`Context::state_reading`]).
pub(crate) struct StateReading {
    /// How the dump is read ([`reading`]).
    pub origin: LeakOrigin,
    /// The groups ([`read`]).
    pub groups: Vec<Group>,
    /// The groups a trace without stacks shows to be a working set, not growth, of at least
    /// `min_suspect_bytes`: `(line, blocks, bytes, why)`, said in caveats.
    pub working_sets: Vec<(FrameId, usize, u64, WorkingSet)>,
}

/// This device read from its dump alone, `None` when its trace can be read ([`reading`]). With a
/// trace without stacks, the groups the trace shows to be a working set ([`working_set`]) are
/// not groups but working sets.
///
/// Where groups read as kept graphs, a group whose every block a loss function made joins the
/// largest of them: the loss's saved tensors (the log-probabilities `cross_entropy` saves) belong
/// to the graph that runs from the loss back through the model, so they are kept with it, and
/// read alone they would name the loss line as a second leak. So does a group that holds the
/// batch the kept passes were fed ([`inputs_of_graphs`]), for the same reason.
pub(crate) fn read(cx: &Context) -> Option<StateReading> {
    let origin = reading(cx)?;
    let mut working_sets = Vec::new();
    let mut groups = Vec::new();
    let in_flight = stretch_stopped_by_oom(cx);
    for g in state_groups(cx) {
        if origin == LeakOrigin::DumpStacksOnly {
            if let Some(why) = working_set(cx, &g) {
                let bytes = g.blocks.iter().map(|&bi| cx.replay.blocks[bi].size).sum();
                if bytes >= cx.thresholds.min_suspect_bytes {
                    working_sets.push((g.line, g.blocks.len(), bytes, why));
                }
                continue;
            }
        }
        let LineBlocks { line, blocks, stack, .. } = g;
        let (graph, operations_without_twins) = match shape(cx, &blocks, in_flight) {
            Shape::Graph(g) => (Some(g), None),
            Shape::OperationsWithoutTwins(ops) => (None, Some(ops)),
            Shape::Tensors => (None, None),
        };
        groups.push(Group { line, graph, operations_without_twins, blocks, stack });
    }
    Some(StateReading { origin, groups: with_graph_parts_joined(cx, groups), working_sets })
}

/// `groups` with each group whose every block a loss function made, or that holds the inputs of
/// the kept passes ([`inputs_of_graphs`]), joined to the largest group read as kept graphs, when
/// there is one (see [`read`]).
fn with_graph_parts_joined(cx: &Context, groups: Vec<Group>) -> Vec<Group> {
    let bytes = |g: &Group| g.blocks.iter().map(|&bi| cx.replay.blocks[bi].size).sum::<u64>();
    let Some(largest_graph) = (0..groups.len())
        .filter(|&i| groups[i].graph.is_some())
        .max_by_key(|&i| (bytes(&groups[i]), std::cmp::Reverse(i)))
    else {
        return groups;
    };
    let graph_stretches = groups[largest_graph].graph.as_ref().and_then(|g| g.stretches.clone());
    let mut joined = Vec::new();
    let mut input_lines = Vec::new();
    let mut kept = Vec::with_capacity(groups.len());
    let mut graph_at = 0;
    for (i, g) in groups.into_iter().enumerate() {
        let loss = g.graph.is_none() && g.blocks.iter().all(|&bi| block_info(cx, bi).loss);
        let inputs =
            g.graph.is_none() && !loss && graph_stretches.as_ref().is_some_and(|gs| inputs_of_graphs(cx, gs, &g));
        if inputs {
            input_lines.push(g.line);
        }
        if loss || inputs {
            joined.extend(g.blocks);
            continue;
        }
        if i == largest_graph {
            graph_at = kept.len();
        }
        kept.push(g);
    }
    kept[graph_at].blocks.extend(joined);
    kept[graph_at].blocks.sort_unstable();
    if let Some(shape) = kept[graph_at].graph.as_mut() {
        shape.input_lines = input_lines;
    }
    kept
}

/// Per stretch of the trace between iteration boundaries (the one before the first counted, as
/// [`GraphShape::iterations`] counts them), the first allocation event of `blocks` made in it,
/// and whether some were made before the trace; `None` without a trace that has iterations.
fn stretches_made_in(cx: &Context, blocks: &[usize]) -> Option<GraphStretches> {
    if cx.phases.boundaries.len() < 2 {
        return None;
    }
    let mut out = GraphStretches { first_made: BTreeMap::new(), before_trace: false };
    for &bi in blocks {
        let Some(at) = cx.replay.blocks[bi].alloc_event() else {
            out.before_trace = true;
            continue;
        };
        let e = out.first_made.entry(cx.phases.stretch_of(at)).or_insert(at);
        *e = (*e).min(at);
    }
    Some(out)
}

/// When kept graphs' blocks were made: per stretch of the trace ([`stretches_made_in`]), the
/// first allocation event; and whether some were made before the trace (a ring that wrapped).
#[derive(Clone)]
struct GraphStretches {
    first_made: BTreeMap<usize, u32>,
    before_trace: bool,
}

/// Whether group `g` holds the inputs of the kept passes whose graphs' blocks were first made at
/// `graph` (per stretch of the trace: [`stretches_made_in`]), so that the graphs hold it.
///
/// Mechanism: autograd saves what an operation's backward needs, and for the first operation of
/// a model that is the batch itself (a convolution or a linear layer saves its input to compute
/// its weight's gradient; `mse_loss` saves its target, `cross_entropy` its class indices). So a
/// kept graph keeps the batch its pass was fed, made by the user's code before the pass, one set
/// per pass. Read alone, such a group names the batch line as a second leak, which no reference
/// but the graph keeps (the full trace's `retained_graph` counts these blocks in the graph too).
/// The group must be user code outside any model call, made in at least `min_leak_occurrences`
/// stretches, each one the graphs were made in, the same number of blocks in each (the last
/// stretch at least as many: the loop's variables hold all of its batch at the dump), and every
/// block made before the first block of its stretch's graph: what the code derives from a pass
/// after it (a kept prediction) is not an input of it. Blocks made before the trace (a ring that
/// wrapped) count as one more stretch where the graphs also have blocks from before it.
fn inputs_of_graphs(cx: &Context, graph: &GraphStretches, g: &Group) -> bool {
    let user_code = |bi: usize| {
        let info = block_info(cx, bi);
        info.python && !info.forward && !info.loss && !info.optimizer && !info.construction && !info.backward_launch
    };
    if !g.blocks.iter().all(|&bi| user_code(bi)) {
        return false;
    }
    let mut per_stretch: BTreeMap<usize, usize> = BTreeMap::new();
    let mut before_trace = false;
    for &bi in &g.blocks {
        let Some(at) = cx.replay.blocks[bi].alloc_event() else {
            if !graph.before_trace {
                return false;
            }
            before_trace = true;
            continue;
        };
        let stretch = cx.phases.stretch_of(at);
        match graph.first_made.get(&stretch) {
            Some(&graph_from) if at < graph_from => *per_stretch.entry(stretch).or_default() += 1,
            _ => return false,
        }
    }
    let stretches = per_stretch.len() + usize::from(before_trace);
    // The last stretch may hold more: the loop's variables still hold its batch at the dump,
    // also the tensors of it the pass did not save (an attention mask the model turned into
    // another tensor).
    let last = per_stretch.pop_last();
    let mut counts = per_stretch.values();
    let first = counts.next().copied().or(last.map(|(_, n)| n));
    stretches >= cx.thresholds.min_leak_occurrences
        && counts.all(|&n| Some(n) == first)
        && last.is_none_or(|(_, n)| Some(n) >= first)
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

/// How a group's blocks read (see the module comment).
enum Shape {
    /// Kept graphs.
    Graph(GraphShape),
    /// As many operations as kept graphs, but a trace that shows no twins ([`twins`]).
    OperationsWithoutTwins(usize),
    /// Tensors kept by a reference.
    Tensors,
}

/// The stretch of the trace (the last iteration) that an out-of-memory error stopped, when the
/// trace has iterations and its last one holds an OOM.
///
/// A dump the out-of-memory observer wrote stops the iteration under way, which holds its own
/// pass's saved tensors awaiting its backward: one pass's graph, which would show as many
/// operations' tensors and twins as kept graphs do (s81's logits kept every step read as graphs
/// beside the pass in flight), so [`shape`] leaves out what that iteration made. (Leaving the
/// last iteration out at every dump was tried: a window of a few iterations then has too few
/// twins left to show graphs that are kept, g01 cut to its last half.)
fn stretch_stopped_by_oom(cx: &Context) -> Option<usize> {
    let last = cx.phases.boundaries.len();
    let oom = cx.events.iter().rposition(|e| e.action() == Action::Oom)?;
    (last >= 2 && cx.phases.stretch_of(oom as u32) == last).then_some(last)
}

/// The shape of `blocks` (see the module comment), leaving out what stretch `in_flight` made
/// ([`stretch_stopped_by_oom`]).
fn shape(cx: &Context, blocks: &[usize], in_flight: Option<usize>) -> Shape {
    let th = cx.thresholds;
    // Per operation (the innermost Python frame: the library or model line that ran it), the
    // live blocks it made inside a model call.
    let mut per_op: BTreeMap<FrameId, usize> = BTreeMap::new();
    let mut per_line: BTreeMap<FrameId, u64> = BTreeMap::new();
    // (allocation event, call stack, size) of those made in the trace
    let mut made_in_trace: Vec<(u32, StackId, u64)> = Vec::new();
    for &bi in blocks {
        let b = &cx.replay.blocks[bi];
        if in_flight.is_some() && b.alloc_event().map(|at| cx.phases.stretch_of(at)) == in_flight {
            continue;
        }
        let stack = dump_stack(cx, b);
        let info = cx.stacks.get(stack);
        let Some(op) = info.innermost_python.filter(|_| info.forward) else { continue };
        *per_op.entry(op).or_default() += 1;
        if let Some(line) = info.module_call.or(info.site) {
            *per_line.entry(line).or_default() += b.size;
        }
        if let Some(at) = b.alloc_event() {
            made_in_trace.push((at, stack, b.size));
        }
    }
    let repeated: Vec<usize> = per_op.into_values().filter(|&n| n >= th.min_leak_occurrences).collect();
    let many_ops = repeated.len() as u64 >= th.state_graph_min_ops;
    // Twins need a trace; without one, the count of operations decides alone.
    let has_twins = (!made_in_trace.is_empty()).then(|| twins(cx, made_in_trace) >= th.min_leak_occurrences);
    match (many_ops, has_twins) {
        (false, Some(true)) | (true, None | Some(true)) => {}
        (false, _) => return Shape::Tensors,
        (true, Some(false)) => return Shape::OperationsWithoutTwins(repeated.len()),
    }
    let mut lines: Vec<(FrameId, u64)> = per_line.into_iter().collect();
    lines.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    Shape::Graph(GraphShape {
        ops: repeated.len(),
        stretches: stretches_made_in(cx, blocks),
        lines: lines.into_iter().take(3).map(|(l, _)| l).collect(),
        input_lines: Vec::new(),
    })
}

/// Pairs of blocks `made` (allocation event, call stack, size) by one call of one operation, of
/// the same size, one right after the other: the same stack, no allocation between them in the
/// trace. A norm makes its statistics that way (`batch_norm`'s saved mean and inverse deviation
/// per channel, `layer_norm`'s mean and reciprocal deviation per row), as does a line that
/// computes an expression of several operations; autograd saves them for the backward, and no
/// hook, output list or cache sees them, since a module returns its output only. Hooks on every
/// leaf module (s36) keep as many different operations' tensors as a graph does, one output per
/// module call; two modules of one type and shape called one after the other (a Llama layer's
/// `q_proj`, `k_proj` and `v_proj`: s40) make outputs of one operation and size with no
/// allocation between, but from different lines of the caller, so with different stacks: one
/// operation's allocations all carry the stack of its one call.
fn twins(cx: &Context, mut made: Vec<(u32, StackId, u64)>) -> usize {
    made.sort_unstable();
    made.windows(2)
        .filter(|w| {
            let ((a, stack_a, size_a), (b, stack_b, size_b)) = (w[0], w[1]);
            stack_a == stack_b
                && size_a == size_b
                && cx.events[a as usize + 1..b as usize].iter().all(|e| e.action() != Action::Alloc)
        })
        .count()
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
/// before it, except, for a size construction code made while recording, those without a Python
/// frame: the dump gives the parameters of a model built while recording their construction
/// stack, so blocks of their size made before the trace without one are the engine's, the
/// gradients of backward passes the ring no longer holds (bf02 under `context="state"`), while a
/// model built before recording leaves no construction stack to go by (bf03, still missed). Without a trace,
/// a block made before recording has no stack at all, like a gradient under `stacks="python"`
/// (the model and its optimizer state, made before recording, would pass for gradients), so only
/// blocks with native frames and no Python one count: the engine's, under `stacks="all"`.
pub(crate) fn kept_gradients(cx: &Context, origin: LeakOrigin) -> Option<KeptGradients> {
    let th = cx.thresholds;
    let traced = origin == LeakOrigin::DumpStacksOnly;
    let mut built: BTreeSet<u64> = BTreeSet::new();
    let mut params: BTreeMap<u64, usize> = BTreeMap::new();
    let mut before: BTreeMap<u64, Vec<(u32, usize)>> = BTreeMap::new();
    let mut frameless: BTreeMap<u64, Vec<(u32, usize)>> = BTreeMap::new();
    for (bi, b, stack) in live_blocks_with_stacks(cx) {
        let info = cx.stacks.get(stack);
        let made = b.alloc_event();
        if info.construction {
            built.insert(b.size);
            *params.entry(b.size).or_default() += 1;
        } else if traced && made.is_none() && !info.python {
            before.entry(b.size).or_default().push((0, bi));
        } else if traced && made.is_none() {
            *params.entry(b.size).or_default() += 1;
        } else if !info.python && (traced || stack != StackId::EMPTY) {
            frameless.entry(b.size).or_default().push((made.unwrap_or(0), bi));
        }
    }
    // Frameless blocks from before the trace are parameters unless construction code made some
    // of their size while recording.
    for (size, blocks) in before {
        if built.contains(&size) {
            frameless.entry(size).or_default().extend(blocks);
        } else {
            *params.entry(size).or_default() += blocks.len();
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

/// Live blocks at the dump from one line, before they are read ([`state_groups`]).
struct LineBlocks {
    line: FrameId,
    /// Indices into the replay's blocks, ascending.
    blocks: Vec<usize>,
    /// The stack it is shown with ([`group_stack`]).
    stack: StackId,
    /// A code path made them over the trace's iterations as growth does (the "repeated" of
    /// [`sift_by_iteration`]).
    repeated: bool,
}

/// The state-only groups, by line: those of at least `state_min_same_site_blocks` live blocks,
/// or whose blocks one code path made over iterations ([`sift_by_iteration`]). Blocks of
/// transformers' KV cache are left out: a model holds one
/// key and one value tensor per layer while it decodes (a 32-layer model, 64 blocks from the
/// line that runs it), so at a dump taken during or right after generation they are many
/// blocks from one line, and a dump alone cannot tell one request's cache from caches kept
/// across requests (n24; [`state_kv_cache`] says so in a caveat).
///
/// Blocks that construction code made (a model built or copied: `Module.to`, `__init__`,
/// `copy.deepcopy`) count only where one line built them in iterations as growth does (the
/// "repeated" of [`sift_by_iteration`]). Mechanism: a model built once is the program's model,
/// however many blocks it has, and one rebuilt each round while the last is rebound away has
/// one copy alive, made in one iteration; a line whose models from round after round are all
/// still alive keeps a model per round (a teacher `copy.deepcopy`'d each generation into a
/// list: aa10; a sweep storing each model it trains: n07), which the trace shows by when each
/// was made.
fn state_groups(cx: &Context) -> Vec<LineBlocks> {
    // By line, and whether construction code made them: each block with its stack.
    let mut by: BTreeMap<(FrameId, bool), Vec<(usize, StackId)>> = BTreeMap::new();
    // The parameters and buffers construction code made, as counts per size.
    let mut constructed: BTreeMap<u64, usize> = BTreeMap::new();
    for (bi, b, stack) in live_blocks_with_stacks(cx) {
        let info = cx.stacks.get(stack);
        if info.construction {
            *constructed.entry(b.size).or_default() += 1;
        }
        if info.optimizer || info.backward_launch || info.recompute || info.kv_cache {
            continue;
        }
        // What a hook or a dispatch handler the user wrote made is the handler's, named at its
        // own line as with stacks on the trace's events (`StackInfo::in_module_hook`); the rest
        // of a model call's blocks at the line that ran the model.
        let handler = info.in_module_hook || info.in_dispatch_handler;
        let Some(line) = (if handler { info.site } else { info.forward_call.or(info.site) }) else { continue };
        by.entry((line, info.construction)).or_default().push((bi, stack));
    }
    by.into_iter()
        .filter_map(|((line, construction), made)| {
            // Copies built round after round are all kept or rebound away one at a time (one
            // alive, never repeated); a store of a few is bounded by sizes ([`working_set`]). So
            // a construction line's rounds are told as a site's whose kept tensors nothing let
            // go (`Context::is_unevicted_growth`): a model per generation of 4 steps (aa10).
            let share =
                if construction { cx.thresholds.unevicted_leak_share } else { cx.thresholds.leak_occurrence_share };
            let (made, repeated) = sift_by_iteration(cx, made, share);
            let per_parameter_state = one_parameter_set(cx, &made, &constructed);
            let kept = repeated
                || !construction
                    && !per_parameter_state
                    && made.len() as u64 >= cx.thresholds.state_min_same_site_blocks;
            kept.then(|| LineBlocks {
                line,
                stack: group_stack(cx, &made),
                blocks: made.iter().map(|m| m.0).collect(),
                repeated,
            })
        })
        .collect()
}

/// Do `made`'s blocks make at most one copy of the parameters and buffers construction code
/// made (per size, no more blocks than those), so that the line holds per-parameter state?
///
/// Mechanism. A buffer per parameter (an optimizer's moments, an EMA's or SWA's shadow weights,
/// DP-SGD's clipped-gradient accumulators, a copy of the weights to restore) is made once, by
/// one line, and updated in place: one whole set alive at the dump, however many steps ran.
/// What grows keeps a set per step (a log of gradients, a model per round), more blocks of the
/// parameters' sizes than the parameters themselves. So a line holding no more than one set is
/// told as a construction line's copies are: by repeats the trace shows, not by its count of
/// live blocks (bh03's accumulators, 78 blocks from one list comprehension, read as kept
/// tensors before). With no construction stack in the dump (a model built before recording)
/// nothing is known of the parameters, and the line is read by its count as before.
fn one_parameter_set(cx: &Context, made: &[(usize, StackId)], constructed: &BTreeMap<u64, usize>) -> bool {
    let mut per_size: BTreeMap<u64, usize> = BTreeMap::new();
    for &(bi, _) in made {
        *per_size.entry(cx.replay.blocks[bi].size).or_default() += 1;
    }
    !per_size.is_empty() && per_size.iter().all(|(size, &n)| constructed.get(size).is_some_and(|&c| n <= c))
}

/// The stack a group is shown with: that of its largest block among the code paths (stacks)
/// that left at least `min_leak_occurrences` of its blocks, else of its largest block. A leak's
/// code path keeps what it makes again and again; a path with one or two live blocks is more
/// likely a first call's state, such as the cuBLAS workspace the model's first matmul made (32
/// MiB, larger than any kept attention map: aa05 cut to its last fifth named the workspace's
/// `Linear` instead of the softmax whose maps the closures keep).
fn group_stack(cx: &Context, kept: &[(usize, StackId)]) -> StackId {
    let mut per_stack: BTreeMap<StackId, usize> = BTreeMap::new();
    for &(_, stack) in kept {
        *per_stack.entry(stack).or_default() += 1;
    }
    let largest = |among: &[(usize, StackId)]| {
        among.iter().max_by_key(|(bi, _)| (cx.replay.blocks[*bi].size, std::cmp::Reverse(*bi))).map(|m| m.1)
    };
    let repeating: Vec<(usize, StackId)> =
        kept.iter().filter(|m| per_stack[&m.1] >= cx.thresholds.min_leak_occurrences).copied().collect();
    largest(&repeating).or_else(|| largest(kept)).unwrap_or(StackId::EMPTY)
}

/// What a trace (without stacks) that has iterations tells of a group's `blocks` (each with
/// its dump stack), by the iteration each was made in: the blocks less those of code paths that made them once, and
/// whether some code path made blocks in at least `min_leak_occurrences` different iterations.
/// Without a trace, or with fewer iteration boundaries than `min_leak_occurrences`, the blocks
/// as they are and `false`.
///
/// Made once: a stack with fewer than `min_leak_occurrences` live blocks, all made within one
/// iteration. Such blocks are state made on a first call and kept since (cuBLAS's 32 MiB
/// workspace, made by the first matmul of a stream; cuDNN's dropout state, made the first time
/// a GRU runs: z25), or the last iteration's tensors still bound. A leak runs the path that
/// makes what it keeps once per iteration or per batch, so its stack has blocks from several
/// iterations, or at least `min_leak_occurrences` of them (an evaluation loop between two
/// optimizer steps). Left in, a first call's large blocks lend their bytes and their count to
/// a line's repetition (z25: 40 MiB of the GRU's state beside eight 512-byte losses kept
/// detached).
///
/// Made before the trace, all of them: a stack whose live blocks were all made before the
/// trace's first event kept nothing over its iterations (at least `min_leak_occurrences` of
/// them), however many it holds: what a path keeps again and again, it keeps in such a trace
/// too. A first call's state made before the window of a ring that wrapped, or before recording
/// began (z25's GRU state beside its kept losses, cut to its last half), is not growth: the
/// trace's blocks are the evidence of keeping, and those made before it count only beside them,
/// as with stacks on the trace's events (`made_before_trace`). A trace of fewer iterations
/// (shorter than one: aa05 cut to its last fifth holds no forward pass; or none found: p03's
/// decoding) may not have run the path at all, and its blocks stay.
///
/// Repeated: a path that kept what it made in at least `min_leak_occurrences` iterations, in at
/// least `share` (`leak_occurrence_share`, or for construction `unevicted_leak_share`: see
/// [`state_groups`]) of those from the first it kept in to the end of the trace, and
/// on to that end (no longer gap after the last than between two), is growth by itself, however
/// few its blocks (z04: one hook output kept per iteration, 7 blocks, under the
/// `state_min_same_site_blocks` that a dump alone needs; p07: a leak that starts after a warm-up,
/// in the trace's last two thirds only). The share and the gap are the full trace's tests of
/// growth (`Context::is_growth`, `Context::is_unevicted_growth`): a cache keyed by shape adds
/// an entry only when a new shape comes, ever more rarely (p11's masks per sequence length, made
/// in 5 of 24 iterations).
/// What holds repeated blocks bounded still shows as a working set ([`working_set`]).
fn sift_by_iteration(cx: &Context, mut blocks: Vec<(usize, StackId)>, share: f64) -> (Vec<(usize, StackId)>, bool) {
    let bounds = &cx.phases.boundaries;
    let occurrences = cx.thresholds.min_leak_occurrences;
    if !cx.traced || bounds.len() < occurrences {
        return (blocks, false);
    }
    // Per stack: live blocks, and the iterations they were made in (`None` for a block made
    // before the trace).
    let mut per_stack: BTreeMap<StackId, (usize, BTreeSet<Option<usize>>)> = BTreeMap::new();
    for &(bi, stack) in &blocks {
        let iteration = cx.replay.blocks[bi].alloc_event().map(|a| bounds.partition_point(|&x| x <= a));
        let (n, made_in) = per_stack.entry(stack).or_default();
        *n += 1;
        made_in.insert(iteration);
    }
    let made_once = |(n, made_in): &(usize, BTreeSet<Option<usize>>)| {
        *n < occurrences && made_in.len() == 1 && !made_in.contains(&None) || made_in.iter().all(Option::is_none)
    };
    blocks.retain(|(_, stack)| !made_once(&per_stack[stack]));
    let last = bounds.len();
    let repeated = per_stack.values().any(|(_, made_in)| {
        let kept: Vec<usize> = made_in.iter().flatten().copied().collect();
        let (Some(&first), Some(&latest)) = (kept.first(), kept.last()) else { return false };
        let widest_gap = kept.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0);
        kept.len() >= occurrences
            && kept.len() as f64 >= share * (last + 1 - first) as f64
            && last - latest <= widest_gap
    });
    (blocks, repeated)
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

/// Equal parts, by event index, that a trace in which no iteration was found is cut into for the
/// working-set troughs (`stretches`). Mechanism: without stacks on the events a loop with no
/// backward (a server, a decoding loop) shows no iteration, since a model call cannot be placed;
/// a leak there still adds blocks of its sizes request after request, so the low points of later
/// parts rise, while a store at its capacity replaces its entries, so they level off. Eight parts
/// of a ring of thousands of events are hundreds of events each, longer than one request's
/// temporaries, so each part has its low point (bb06 in `context="state"`: an LRU under a byte
/// budget, full by the seventh of 40 batches). Named `parts` in the words of `Level`, `Filled`
/// and `Plateau`, which then say "part" where they say "iteration".
const PARTS_WITHOUT_ITERATIONS: u64 = 8;

/// Why a trace without stacks shows a group to be a working set, not growth. `parts`: the
/// stretches are equal parts of a trace in which no iteration was found
/// (`PARTS_WITHOUT_ITERATIONS`), not its iterations.
pub(crate) enum WorkingSet {
    /// Every block was made in the trace, in only this many (fewer than `min_leak_occurrences`)
    /// of as many equal parts of it, by event index: a leak repeats, and a group made in a few
    /// parts of the trace did not accumulate while the rest of it ran (the last request's KV
    /// cache, a cache made once).
    MadeInParts(usize),
    /// Blocks of the group's sizes, of any line, were at most one more at the dump
    /// (`at_dump`) than in the trough of an iteration of the trace's first half (`earlier`, the
    /// most there: the fewest alive during that iteration, once its temporaries of those sizes
    /// were freed): what holds them is bounded (a pool or queue with a maximum length, a dict
    /// of the latest output per module), though its blocks were made all along the trace (s33,
    /// s37). A leak adds blocks of its sizes every iteration, so by the dump it has added one per
    /// later iteration at least; a bounded store's count differs by what the last iteration
    /// left bound at the dump (s37: the loop's last loss, one block). Counted by size because
    /// the trace's events have no stacks: a block made and freed in the trace has no line;
    /// other lines' blocks of the same sizes add to both counts.
    Level { at_dump: usize, earlier: usize, parts: bool },
    /// Blocks of the group's sizes, of any line, were exactly `level` at the trough of each of
    /// the trace's last `iterations` iterations (its second half, at least
    /// `min_leak_occurrences` of them) and at most one more at the dump (`at_dump`), though
    /// fewer earlier: what holds them filled up during the trace's first half and then stopped
    /// growing, as a cache does at its capacity, replacing its entries (l06: an LRU of 48
    /// spectrograms, full by the fifth of ten steps). A leak that keeps at least every other
    /// iteration adds a block within any three, so its low points rise over those iterations;
    /// the one more is, as for `Level`, what the last iteration left bound.
    Filled { at_dump: usize, level: usize, iterations: usize, parts: bool },
    /// The bytes of all blocks within the group's range of sizes, of any line, were at most
    /// `bytes` at the trough of each of the trace's last `iterations` iterations (the last half
    /// of its second half, at least 2), a level the trough of an earlier iteration reached, and
    /// at the dump no more than one of the group's largest blocks above it: a store bounded by
    /// its bytes or its count whose entries differ in size (s01 in `context="state"`: an LRU of
    /// encoder states of varying lengths within a byte budget) holds bytes that rise and fall as
    /// entries are replaced, while its blocks' sizes change, so counts by size (`Level`,
    /// `Filled`) miss it; its swings can make a new high within the second half (s54 cut to a
    /// ring window), not above the whole trace's earlier troughs. A leak that keeps a block at
    /// least every other iteration raises the trough of one of any two iterations above every
    /// earlier one; blocks of other lines within the range are counted too (as for `Level`) and
    /// can hide a small leak among a larger store's swings, or a leak that begins after a
    /// larger in-range store was let go.
    Plateau { bytes: u64, iterations: usize, parts: bool },
}

/// Whether the trace (without stacks) shows `group` to be a working set (see [`WorkingSet`]).
/// Levels are judged over the stretches [`stretches`] gives: at least `min_leak_occurrences`
/// iteration boundaries (two iterations or more), or, where no iteration was found at all, equal
/// parts of the trace; a group made in few parts of the trace is a working set only if no code
/// path of it repeated over iterations ([`sift_by_iteration`]: a leak that starts late in the
/// trace, p07).
fn working_set(cx: &Context, group: &LineBlocks) -> Option<WorkingSet> {
    let blocks = &group.blocks;
    if let Some(k) = made_in_parts(cx, blocks).filter(|_| !group.repeated) {
        return Some(WorkingSet::MadeInParts(k));
    }
    let (bounds, parts) = stretches(cx)?;
    let sizes: BTreeSet<u64> = blocks.iter().map(|&bi| cx.replay.blocks[bi].size).collect();
    let (troughs, at_dump) = troughs(cx, &bounds, |b| sizes.contains(&b.size).then_some(1));
    let (first_half, second_half) = troughs.split_at(troughs.len().div_ceil(2));
    let earlier = first_half.iter().copied().max().unwrap_or(0);
    if at_dump <= earlier + 1 {
        return Some(WorkingSet::Level { at_dump: at_dump.max(0) as usize, earlier: earlier.max(0) as usize, parts });
    }
    let level = second_half.iter().copied().min().unwrap_or(0);
    if second_half.len() >= cx.thresholds.min_leak_occurrences
        && second_half.iter().all(|&t| t == level)
        && at_dump <= level + 1
    {
        return Some(WorkingSet::Filled {
            at_dump: at_dump.max(0) as usize,
            level: level.max(0) as usize,
            iterations: second_half.len(),
            parts,
        });
    }
    plateau(cx, &bounds, &sizes, second_half.len(), parts)
}

/// The stretches the working-set troughs are read over, and whether they are equal parts of the
/// trace: its iterations, when there are at least `min_leak_occurrences` boundaries; else, when
/// no iteration was found at all, `PARTS_WITHOUT_ITERATIONS` equal parts by event index; else
/// none (a trace of one or two iterations is too short to show a level).
fn stretches(cx: &Context) -> Option<(Vec<u32>, bool)> {
    let bounds = &cx.phases.boundaries;
    if bounds.len() >= cx.thresholds.min_leak_occurrences {
        return Some((bounds.clone(), false));
    }
    let n = cx.events.len() as u64;
    if bounds.len() >= 2 || n < PARTS_WITHOUT_ITERATIONS * 2 {
        return None;
    }
    Some(((0..=PARTS_WITHOUT_ITERATIONS).map(|k| (k * n / PARTS_WITHOUT_ITERATIONS) as u32).collect(), true))
}

/// [`WorkingSet::Plateau`] for a group of block `sizes`, judged over the last half of the trace's
/// last `iterations` stretches (`bounds`).
fn plateau(cx: &Context, bounds: &[u32], sizes: &BTreeSet<u64>, iterations: usize, parts: bool) -> Option<WorkingSet> {
    if iterations < cx.thresholds.min_leak_occurrences {
        return None;
    }
    let (&smallest, &largest) = (sizes.first()?, sizes.last()?);
    let (troughs, at_dump) = troughs(cx, bounds, |b| (smallest..=largest).contains(&b.size).then_some(b.size as i64));
    // The later part: the last half of those iterations; the earlier, every iteration before.
    let (earlier, later) = troughs.split_at(troughs.len() - (iterations - iterations / 2));
    let high = earlier.iter().copied().max()?;
    (later.iter().all(|&t| t <= high) && at_dump <= high + largest as i64).then_some(WorkingSet::Plateau {
        bytes: high.max(0) as u64,
        iterations: later.len(),
        parts,
    })
}

/// Per stretch of the trace between consecutive `bounds` (its iterations, or equal parts), the
/// least total `weight` of the blocks alive during it (its trough, once the stretch's own
/// temporaries are freed), and the total alive at the dump. `weight` picks the blocks counted and
/// what each weighs; those made before the trace are alive from its start.
fn troughs(
    cx: &Context,
    bounds: &[u32],
    weight: impl Fn(&memsnap_replay::BlockLifetime) -> Option<i64>,
) -> (Vec<i64>, i64) {
    let mut alive: i64 = 0;
    let mut steps: Vec<(u32, i64)> = Vec::new();
    for b in &cx.replay.blocks {
        let Some(w) = weight(b) else { continue };
        match b.alloc_event() {
            Some(a) => steps.push((a, w)),
            None => alive += w,
        }
        if let Some(f) = b.freed_at() {
            steps.push((f, -w));
        }
    }
    steps.sort_unstable();
    let mut next = 0;
    let troughs = bounds
        .windows(2)
        .map(|w| {
            while next < steps.len() && steps[next].0 < w[0] {
                alive += steps[next].1;
                next += 1;
            }
            let mut trough = alive;
            while next < steps.len() && steps[next].0 < w[1] {
                alive += steps[next].1;
                trough = trough.min(alive);
                next += 1;
            }
            trough
        })
        .collect();
    let at_dump = alive + steps[next..].iter().map(|s| s.1).sum::<i64>();
    (troughs, at_dump)
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
