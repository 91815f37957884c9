//! Suspects as typed facts. Detectors decide from numbers and return an [`Evidence`]; the words a
//! user reads (`evidence`, `advice`) are rendered from it by [`crate::render`], never parsed back.

use std::cmp::Ordering;

use serde::Serialize;

use crate::site::Site;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SuspectKind {
    Oom,
    RetainedGraph,
    NoGradMissing,
    UnreleasedGradient,
    ReferenceLeak,
    Fragmentation,
}

impl SuspectKind {
    pub fn name(self) -> &'static str {
        match self {
            SuspectKind::Oom => "oom",
            SuspectKind::RetainedGraph => "retained_graph",
            SuspectKind::NoGradMissing => "no_grad_missing",
            SuspectKind::UnreleasedGradient => "unreleased_gradient",
            SuspectKind::ReferenceLeak => "reference_leak",
            SuspectKind::Fragmentation => "fragmentation",
        }
    }

    /// Every kind, in ranking order.
    pub const ALL: [SuspectKind; 6] = [
        SuspectKind::Oom,
        SuspectKind::RetainedGraph,
        SuspectKind::NoGradMissing,
        SuspectKind::UnreleasedGradient,
        SuspectKind::ReferenceLeak,
        SuspectKind::Fragmentation,
    ];

    pub fn parse(s: &str) -> Option<SuspectKind> {
        SuspectKind::ALL.into_iter().find(|k| k.name() == s)
    }

    /// Kinds about live memory held by references (as opposed to events and allocator states).
    pub fn is_leak(self) -> bool {
        matches!(
            self,
            SuspectKind::RetainedGraph
                | SuspectKind::NoGradMissing
                | SuspectKind::UnreleasedGradient
                | SuspectKind::ReferenceLeak
        )
    }
}

/// How bad a suspect is, from what its memory does over time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    /// Grows every iteration and is still held at the end: without bound.
    Leak,
    /// Held at the dump, many times over from one line, in a file whose trace records no
    /// allocation (`enabled="state"`, or recording stopped before the dump): the blocks say what
    /// is alive, not when it was made, so a store at its capacity (an LRU, a replay buffer, a
    /// cached dataset) and one that grows without bound look the same. What is held is a fact;
    /// whether it grows is not known (record with `enabled="all"` to tell).
    Held,
    /// Inflates the peak and is released later (or is an event that failed: an OOM).
    Peak,
    /// Held but bounded: memory a phase never uses.
    Waste,
}

impl Severity {
    pub const ALL: [Severity; 4] = [Severity::Leak, Severity::Held, Severity::Peak, Severity::Waste];

    pub fn name(self) -> &'static str {
        match self {
            Severity::Leak => "leak",
            Severity::Held => "held",
            Severity::Peak => "peak",
            Severity::Waste => "waste",
        }
    }

    pub fn parse(s: &str) -> Option<Severity> {
        Severity::ALL.into_iter().find(|k| k.name() == s)
    }
}

/// What repeats in a growth: training iterations, or forward passes of an evaluation window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Occurrence {
    Iteration,
    Pass,
    /// A call of the user's function that runs the model several times (a decoding loop inside
    /// `generate()`): see `Lifecycle::call_groups`.
    Call,
}

impl Occurrence {
    pub fn name(self) -> &'static str {
        match self {
            Occurrence::Iteration => "iteration",
            Occurrence::Pass => "pass",
            Occurrence::Call => "call",
        }
    }

    pub fn plural_name(self) -> &'static str {
        match self {
            Occurrence::Iteration => "iterations",
            Occurrence::Pass => "passes",
            Occurrence::Call => "calls",
        }
    }
}

/// What keeps a graph alive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GraphHold {
    /// The backward that ran right after the pass freed none of its saved tensors:
    /// `backward(retain_graph=True)`.
    RetainedByBackward,
    /// Retained by the backward that ran right after the pass and differentiated again by a
    /// later backward before any other pass ran (`retain_graph=True` was needed: GradNorm's
    /// `autograd.grad` calls), yet still alive afterwards: a reference keeps it.
    RetainedThenKept,
    /// No backward ran through it (evaluation with grad on) and a Python reference keeps it.
    KeptReference,
    /// Graphs kept for a backward that had not run yet when the trace ended (at an OOM, or with
    /// the training call site's backward still to come).
    AwaitingBackward,
    /// Training passes whose backward the program skipped (`UnitFate::Abandoned`: an exception or
    /// a `continue` between forward and backward), and a reference keeps their graphs.
    SkippedBackward,
    /// Read from the dump alone (no trace, or one without stacks): the blocks alive at the dump
    /// were made inside the model call by many different operations, several passes' worth
    /// each, which is what autograd saves for a backward (`detectors/state_only.rs`). Which
    /// reference keeps the graphs, and whether a backward ran, the file cannot say.
    SeenAtDump,
}

/// Where the tensors of a reference leak come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LeakOrigin {
    /// Outputs or intermediates of forward passes whose graphs a backward already freed.
    TrainedForward,
    /// Outputs of forward passes run without grad (`no_grad`, `inference_mode`).
    NoGradForward,
    /// Outputs or inputs of grad-on forward passes that no backward ran through, kept after
    /// their graphs were let go (a detached output, the batch, kept by a reference).
    ReleasedGraphForward,
    /// Tensors made by the user's code outside any model call.
    UserCode,
    /// Tensors made by the autograd engine that are not gradients of parameters (a backward hook
    /// keeping `grad_output`, the `.grad` that `retain_grad()` gives a kept activation).
    Backward,
    /// Tensors made by a backward that `torch.autograd.grad` ran (directly, or under
    /// `torch.func.grad`), not of any parameter's size: what it returned (gradients with respect
    /// to inputs or activations, per-example gradients from `vmap`), kept by the caller.
    GradResults,
    /// The `.grad` of leaves the user's code made with `requires_grad` and keeps: the backward
    /// gives each leaf a gradient of its size, which lives as long as the leaf.
    LeafGradients,
    /// Tensors made by a thread the program started (`threading.Thread`, a thread pool's
    /// worker) beside the main loop, kept by a reference.
    WorkerThread,
    /// Parameters and buffers of models built at one line round after round (a sweep, k-fold,
    /// an ensemble trained one member at a time), every one still allocated: each model built is
    /// kept, not only the one the loop variable holds.
    ModelsKept,
    /// No stacks recorded: growth measured, origin unknown.
    Unattributed,
    /// Optimizer state (moments, momentum buffers) made in every iteration and kept: the
    /// optimizer is handed new parameters each iteration and keeps their state.
    OptimizerState,
    /// Optimizer state made again for parameters already met, every few iterations, and kept:
    /// new optimizers over the same parameters (restarts) while the old ones stay referenced.
    OptimizerStateRemade,
    /// Optimizer state kept after its parameters were freed, made by steps in several
    /// iterations: an optimizer holds its parameters, so state that outlives them is held
    /// without the optimizer (a stored `state_dict()`, whose state entries are the live
    /// tensors, not copies), once per model let go (a sweep).
    OptimizerStateOrphaned,
    /// Tensors the user's own code run by an optimizer step (a `step` they wrote, a step hook)
    /// made in every iteration for the same parameters and kept: a history of updates,
    /// gradients or parameter copies, not state.
    OptimizerKeepsPerStep,
    /// L-BFGS's history of update directions (`torch.optim.LBFGS`): a new pair of vectors the
    /// size of all parameters each step, kept up to `history_size` pairs, then the oldest
    /// dropped. It grows by design and is bounded: severity `waste`.
    OptimizerHistory,
    /// One tensor re-made larger from its previous version every iteration and kept
    /// (`x = torch.cat([x, new])`): each allocation frees the one before, the live size grows.
    Regrown,
    /// Dump-time state only (no trace): many live blocks from one line.
    StateOnly,
    /// A trace without stacks (`context="state"`) whose dump names the live blocks' lines: many
    /// live blocks from one line, as for `StateOnly`.
    DumpStacksOnly,
}

/// Where gradients are held.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GradientHold {
    /// New gradients of every step kept (references to `.grad` stored, then `zero_grad`).
    /// `sets_before_trace`: like sets made before a wrapped ring's first event and still alive,
    /// beyond the model's own copies, counted as earlier steps (0 when the trace decides alone).
    /// `returned_by_grad_call`: the sets are what `torch.autograd.grad` returned, not `.grad`.
    KeptEachStep { blocks_per_step: u64, distinct_sizes: usize, sets_before_trace: usize, returned_by_grad_call: bool },
    /// The last step's gradients stay allocated through an evaluation window. `every_step`: such
    /// windows come about once per iteration (no-grad passes the step itself runs: acting in
    /// reinforcement learning, a teacher, a target network, an evaluation every step).
    /// `share_of_allocated`: their bytes over the most allocated while the window ran.
    ThroughEvaluation { window_start: u32, passes: usize, share_of_allocated: f64, every_step: bool },
    /// Read from the dump alone (no trace, or one without stacks): more blocks without a Python
    /// frame, of parameters' sizes, than there are parameters (`detectors/state_only.rs`).
    /// `generations`: the fewest such blocks per parameter over `distinct_sizes` sizes.
    SeenAtDump { generations: usize, distinct_sizes: usize },
    /// Made by the line's first backward and never made again, while its later backwards made
    /// the other gradients again in `remade_in` iterations: parameters that require grad but
    /// that no optimizer clears (`.grad` accumulated into, never read).
    NeverCleared { remade_in: usize, distinct_sizes: usize },
}

/// Why an OOM happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OomCause {
    /// A cached free block was large enough (another stream or pool held it).
    FreeBlockLargeEnough,
    /// Enough was cached free, but in pieces: fragmentation.
    Fragmented,
    /// The device had room: a per-process limit or memory outside this allocator stopped it.
    ProcessLimit,
    /// The device was full.
    DeviceFull,
}

/// A holder of memory at a moment: its label and bytes.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Holder {
    pub label: String,
    pub bytes: u64,
}

/// How iterations were delimited (for the words of growth evidence).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct IterationsBy {
    /// `backward`, `forward`, `annotation` or `loop`.
    pub source: &'static str,
    pub site: Option<Site>,
    pub annotation: Option<String>,
}

/// Blocks alive at the dump, made before the trace's first event, of the sizes the suspect's kept
/// blocks have, whose dump stacks name the suspect's line the same way its kept blocks do (the
/// line that ran the model, for kept outputs; the user's line, for user code). When the ring
/// buffer wrapped, the trace shows only the last part of a leak: the allocator kept the stack of
/// every block still allocated that was made while recording was on, so the earlier part is
/// these (blocks made before recording started have no stack, and are not counted). They
/// are not in the suspect's bytes (no occurrence of them was seen), only said.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct BeforeTrace {
    pub blocks: u64,
    pub bytes: u64,
}

/// A line's kept tensors let go only by resets: everything it had kept freed at once, then kept
/// again one per iteration (an accumulator set back at an epoch's end, a list emptied). The level
/// rises through every period, by as much again for each iteration the period has.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Cleared {
    /// Resets seen in the trace.
    pub clears: usize,
    /// The most iterations one reset ended: from the first whose tensors it let go to the one it
    /// ran in.
    pub longest_period: usize,
}

/// A line that lets go of what it holds as it makes new tensors (a dict entry overwritten, a list
/// slot rebound), while what it holds at the start of its occurrences keeps rising: a store that
/// gains entries besides updating those it has (a dict gaining keys, a list appended to). Counted
/// over the line's tensors made in the trace, alive at the start of each occurrence it allocated
/// in (see `reference_leak::held_level`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct HeldLevel {
    /// The line's tensors made in the trace, alive at the start of an occurrence measured, and
    /// let go after it (entries overwritten or evicted; not the statement's temporaries).
    pub let_go: u64,
    /// Its tensors alive at the start of the first occurrence measured, and their bytes.
    pub first_blocks: u64,
    pub first_bytes: u64,
    /// The same at the start of the last occurrence.
    pub last_blocks: u64,
    pub last_bytes: u64,
    /// Occurrences measured, the later half of them, and of those the ones that began with more
    /// of the line's bytes alive than any earlier occurrence.
    pub occurrences: usize,
    pub later: usize,
    pub new_highs: usize,
}

/// The facts behind a suspect, per kind.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Evidence {
    RetainedGraph {
        hold: GraphHold,
        /// Forward passes whose graphs were held; read from the dump alone
        /// (`GraphHold::SeenAtDump`), the iterations of the trace the held blocks were made in,
        /// and `None` when the file has no iterations to count them by.
        graphs: Option<usize>,
        /// Of their blocks, those autograd saved that outlived the point where the graph should
        /// have been freed.
        held_blocks: u64,
        /// The line that runs the model.
        forward_call: Option<Site>,
        /// The `.backward()` line (for `RetainedByBackward`).
        backward_line: Option<Site>,
        /// The first scalar the user keeps that roots the graph (a loss, a running sum).
        root: Option<Site>,
        /// Lines inside the model whose saved tensors are held, largest first (up to 3).
        held_lines: Vec<Site>,
        /// Read from the dump alone (`GraphHold::SeenAtDump`): the operations inside the model
        /// call whose blocks are alive several times each. Absent otherwise.
        #[serde(skip_serializing_if = "Option::is_none")]
        operations: Option<usize>,
        /// Read from the dump alone: user lines outside the model whose tensors, made before
        /// each kept pass, the graphs hold as the passes' inputs (`state_only::inputs_of_graphs`).
        #[serde(skip_serializing_if = "Vec::is_empty")]
        input_lines: Vec<Site>,
    },
    NoGradMissing {
        /// Forward passes no backward consumed, and evaluation windows they form.
        passes: usize,
        windows: usize,
        /// Median over those passes of the blocks alive when the pass returned, of its blocks.
        survived_blocks: u32,
        pass_blocks: u32,
        /// Median bytes saved per pass.
        saved_bytes_per_pass: u64,
        call_site: Option<Site>,
        /// The evaluation's own line when the call site also runs training passes: the
        /// innermost user frame outward of the model call that these passes run through and no
        /// training pass from that call site does (`render_image` calling a `render_rays` that
        /// training calls too). `None` when the call site runs no training pass.
        reached_from: Option<Site>,
        /// Their graphs are also held afterwards (a retained_graph suspect says by what).
        graphs_held: bool,
    },
    ReferenceLeak {
        origin: LeakOrigin,
        blocks: u64,
        /// Occurrences that left blocks behind, of those that allocated at this site.
        occurrences: usize,
        eligible: usize,
        occurrence: Occurrence,
        /// Where the largest kept block was made, when that is not the line the suspect names:
        /// a kept model output is named at the line that calls the model, and this is the
        /// statement inside the model that made it (the model's own code may be what keeps it).
        made_at: Option<Site>,
        /// Blocks alive at the dump that the same line made before the trace began (see
        /// [`BeforeTrace`]); absent when there are none.
        #[serde(skip_serializing_if = "Option::is_none")]
        before_trace: Option<BeforeTrace>,
        /// Read from the dump alone: the different operations inside one model call that made
        /// these blocks, each several times, as autograd's saved tensors are, when the trace
        /// shows none of the twin blocks (a norm's statistics) that only autograd keeps; so
        /// they read as outputs kept per module (a hook on every module), or else as the graphs
        /// of a model that saves no such twins (no norm, or norms in eval mode). Absent
        /// otherwise (see `detectors/state_only.rs`).
        #[serde(skip_serializing_if = "Option::is_none")]
        operations: Option<usize>,
        /// For a tensor re-made larger ([`LeakOrigin::Regrown`]): how many tensors the line
        /// re-makes, one per call of the line in a pass (each layer of a model running it), or
        /// 1. Absent for other origins.
        #[serde(skip_serializing_if = "Option::is_none")]
        tensors: Option<usize>,
        /// When the line's kept tensors were let go only all at once, now and then (see
        /// [`Cleared`]); absent otherwise.
        #[serde(skip_serializing_if = "Option::is_none")]
        cleared: Option<Cleared>,
        /// When the line overwrites most of what it holds and the share of occurrences that keep
        /// something to the end is too small to tell, yet what it holds rose at the start of its
        /// occurrences through the trace (see [`HeldLevel`]); absent otherwise.
        #[serde(skip_serializing_if = "Option::is_none")]
        level: Option<HeldLevel>,
        /// Other lines whose kept tensors were kept in exactly the same occurrences, each too
        /// few bytes to report alone: one record holding them all (a replay buffer's transition
        /// tuple), counted in this suspect's blocks and bytes. Empty otherwise.
        #[serde(skip_serializing_if = "Vec::is_empty")]
        kept_with: Vec<Site>,
    },
    UnreleasedGradient {
        hold: GradientHold,
        blocks: u64,
        backward_line: Option<Site>,
        /// The user's line whose call finally freed them (`zero_grad` at the start of the next
        /// step), when frees were recorded with stacks.
        released_at: Option<Site>,
    },
    Fragmentation {
        reserved: u64,
        allocated: u64,
        inactive_split: u64,
        largest_free_block: u64,
        peak_reserved: u64,
        allocated_at_peak_reserved: Option<u64>,
        cached_free_at_end: u64,
    },
    Oom {
        count: usize,
        event: u32,
        requested: u64,
        allocated: u64,
        reserved: u64,
        cached_free: u64,
        largest_free_block: u64,
        device_free: u64,
        cause: OomCause,
        holders: Vec<Holder>,
        user_chain: Vec<Site>,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub struct Suspect {
    pub kind: SuspectKind,
    pub severity: Severity,
    pub confidence: f64,
    pub device: u32,
    /// Bytes at stake: held at the end of the trace (leaks, waste), the most held at once (peak
    /// problems), or the request (OOMs).
    pub bytes: u64,
    /// Of the suspect's memory, bytes live at the peak of allocated memory.
    pub bytes_at_peak: u64,
    /// Peak of allocated memory had this suspect's blocks never been allocated (`None`: not
    /// measurable, e.g. no trace).
    pub peak_without: Option<u64>,
    /// Median growth per occurrence of the suspect's live bytes (leaks).
    pub growth_bytes_per_iteration: Option<u64>,
    pub growth_unit: Occurrence,
    pub site: Option<Site>,
    /// The stack of a representative block, innermost first.
    pub stack: Vec<Site>,
    /// How iterations were found (context for growth).
    pub iterations: Option<IterationsBy>,
    pub facts: Evidence,
    /// Rendered from `facts` (see [`crate::render`]).
    pub evidence: String,
    pub advice: String,
}

/// Ranking: OOMs first, then leaks, peak problems, waste; then by bytes at stake, then kind and
/// site (deterministic).
pub fn rank(a: &Suspect, b: &Suspect) -> Ordering {
    let oom = |s: &Suspect| s.kind != SuspectKind::Oom;
    oom(a)
        .cmp(&oom(b))
        .then(a.severity.cmp(&b.severity))
        .then(b.bytes.cmp(&a.bytes))
        .then(a.kind.cmp(&b.kind))
        .then(a.site.cmp(&b.site))
        .then(a.device.cmp(&b.device))
}
