//! Who allocated a block: the user's line, or the `.backward()` line for frameless backward
//! allocations, and which category of memory it is.

use std::collections::BTreeSet;

use memsnap_model::{FrameId, Snapshot, StackId, TraceEvent};
use memsnap_replay::BlockLifetime;

use crate::phases::Phases;
use crate::site::short_of;
use crate::stacks::StackTable;

/// Attribution of one block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Attr {
    /// Allocated during a backward pass launched at this line (`None`: launch line unknown).
    Backward(Option<FrameId>),
    /// Allocated under this user frame (innermost user frame of the stack).
    Site(FrameId),
    /// Has Python frames but none of the user's (e.g. a library's own cache).
    Library,
    /// Alive before the trace began: no allocation event, no stack.
    PreTrace,
    /// Allocated in the trace without frames, outside any backward pass.
    NoFrames,
}

/// Memory categories at a moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Category {
    /// Alive before the trace: whatever was made before recording began. The model's parameters
    /// and buffers and the optimizer state as a rule, but in a ring that wrapped anything older
    /// than the ring too (kept activations and graphs: bp02 holds 1.08 GiB of them), so it is
    /// named by when it was made, not guessed as parameters.
    PreTrace,
    /// Made by a backward pass, outliving it, of a parameter's size.
    Gradients,
    OptimizerState,
    Activations,
    /// Short-lived allocations outside forward passes: backward scratch freed within its backward
    /// pass, optimizer-step scratch, and other tensors freed in the iteration that made them.
    Temporaries,
    /// Long-lived allocations outside those phases: never freed, or freed in a later iteration;
    /// and what a backward pass made and kept of no parameter's size (a library's workspace).
    Other,
}

impl Category {
    pub const ALL: [Category; 6] = [
        Category::PreTrace,
        Category::Gradients,
        Category::OptimizerState,
        Category::Activations,
        Category::Temporaries,
        Category::Other,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Category::PreTrace => "pre_trace",
            Category::Gradients => "gradients",
            Category::OptimizerState => "optimizer_state",
            Category::Activations => "activations",
            Category::Temporaries => "temporaries",
            Category::Other => "other",
        }
    }
}

/// The phase that allocated a block (for explaining a peak).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AllocPhase {
    /// Before the trace began.
    PreTrace,
    /// A forward pass that a backward later ran through.
    TrainingForward,
    /// A forward pass no backward ran through (evaluation, inference).
    EvaluationForward,
    Backward,
    Optimizer,
    /// The user's code between those.
    Other,
}

impl AllocPhase {
    pub const ALL: [AllocPhase; 6] = [
        AllocPhase::PreTrace,
        AllocPhase::TrainingForward,
        AllocPhase::EvaluationForward,
        AllocPhase::Backward,
        AllocPhase::Optimizer,
        AllocPhase::Other,
    ];

    pub fn name(self) -> &'static str {
        match self {
            AllocPhase::PreTrace => "pre_trace",
            AllocPhase::TrainingForward => "training_forward",
            AllocPhase::EvaluationForward => "evaluation_forward",
            AllocPhase::Backward => "backward",
            AllocPhase::Optimizer => "optimizer",
            AllocPhase::Other => "other",
        }
    }
}

/// The stack that allocated `b` at event `a`: the event's, unless it names no user line and the
/// block's own does. A block allocated in the trace carries its event's stack, so the two differ
/// only where the caller gave the block the dump's stack: a `context="state"` trace has no frames
/// on its events, but a block alive at the dump is the dump's block at its address, whose stack
/// the allocator kept ([`crate::with_dump_stack`]).
fn alloc_stack(events: &[TraceEvent], stacks: &StackTable, b: &BlockLifetime, a: u32) -> StackId {
    let ev = events.get(a as usize).map_or(b.stack, |e| e.stack);
    if ev != b.stack && stacks.userless(ev) && !stacks.userless(b.stack) {
        b.stack
    } else {
        ev
    }
}

/// The phase that allocated `b`, attributed `attr` (by [`attribute`]).
pub fn alloc_phase(
    events: &[TraceEvent],
    phases: &Phases,
    stacks: &StackTable,
    b: &BlockLifetime,
    attr: Attr,
) -> AllocPhase {
    let Some(a) = b.alloc_event() else { return AllocPhase::PreTrace };
    if matches!(attr, Attr::Backward(_)) {
        return AllocPhase::Backward;
    }
    let info = stacks.get(alloc_stack(events, stacks, b, a));
    if info.optimizer {
        return AllocPhase::Optimizer;
    }
    match phases.forward_at(a) {
        Some((_, f)) if f.trained => AllocPhase::TrainingForward,
        Some(_) => AllocPhase::EvaluationForward,
        None => AllocPhase::Other,
    }
}

/// Attribution of a block, and the stack that explains it.
pub fn attribute(events: &[TraceEvent], phases: &Phases, stacks: &StackTable, b: &BlockLifetime) -> (Attr, StackId) {
    let Some(a) = b.alloc_event() else {
        // Allocated before the trace: the dump's segment table still carries the block's own
        // allocation frames (state-only recordings, wrapped ring buffers, memory made before
        // recording started), so it can be placed at the user's line all the same.
        let info = stacks.get(b.stack);
        return match info.site {
            Some(s) => (Attr::Site(s), b.stack),
            None => (Attr::PreTrace, b.stack),
        };
    };
    let ev_stack = alloc_stack(events, stacks, b, a);
    let info = stacks.get(ev_stack);
    if !info.python || info.backward_launch || info.recompute {
        if let Some(bw) = phases.backward_at(a) {
            let launch = events.get(bw.span.start as usize).map_or(StackId::EMPTY, |e| e.stack);
            return (Attr::Backward(bw.line), launch);
        }
    }
    if let Some(s) = info.site {
        return (Attr::Site(s), ev_stack);
    }
    if info.python {
        return (Attr::Library, ev_stack);
    }
    (Attr::NoFrames, ev_stack)
}

/// The category of block `b`, attributed `attr`: what kind of memory it is, from the phase it
/// was allocated in and how long it lived (it does not depend on the moment it is looked at).
/// `gradient_sizes`: the sizes a gradient may have ([`gradient_sizes`]).
pub fn categorize(
    events: &[TraceEvent],
    phases: &Phases,
    stacks: &StackTable,
    gradient_sizes: &BTreeSet<u64>,
    b: &BlockLifetime,
    attr: Attr,
) -> Category {
    let Some(a) = b.alloc_event() else { return Category::PreTrace };
    let freed = b.freed_at();
    // Lives past the iteration that made it: never freed, or freed in a later one. Asked only
    // where it decides (two binary searches, over millions of blocks).
    let outlives_iteration = || match freed {
        None => true,
        Some(f) => match (phases.iteration_of(a), phases.iteration_of(f)) {
            (Some(x), Some(y)) => y > x,
            _ => false,
        },
    };
    match attr {
        Attr::Backward(_) => {
            // Outliving its backward pass is what a gradient does; the rest is scratch. A
            // gradient has its parameter's size: a block the backward made and kept of no
            // parameter's size is a library's state, such as the cuBLAS workspace the engine's
            // thread makes at its first matmul (32 MiB on an H100) and keeps, which after
            // `zero_grad(set_to_none=True)` read as 32 MiB of gradients, or what
            // `torch.autograd.grad` returned (per-example gradients: q10), used and freed in
            // the iteration like any temporary. With no parameter size known, every block that
            // outlives its backward counts.
            let end = phases.backward_at(a).map_or(a + 1, |bw| bw.span.end);
            if freed.is_some_and(|f| f < end) {
                Category::Temporaries
            } else if gradient_sizes.is_empty() || gradient_sizes.contains(&b.size) {
                Category::Gradients
            } else if outlives_iteration() {
                Category::Other
            } else {
                Category::Temporaries
            }
        }
        _ => {
            let info = stacks.get(alloc_stack(events, stacks, b, a));
            if info.optimizer {
                // Optimizer state lives across steps; step scratch dies within one.
                let long = match freed {
                    None => true,
                    Some(f) => match (phases.iteration_of(a), phases.iteration_of(f)) {
                        (Some(x), Some(y)) => y > x,
                        _ => !phases.in_optimizer(f),
                    },
                };
                if long {
                    Category::OptimizerState
                } else {
                    Category::Temporaries
                }
            } else if info.forward {
                Category::Activations
            } else if outlives_iteration() {
                Category::Other
            } else {
                Category::Temporaries
            }
        }
    }
}

/// The sizes a gradient may have: the parameters' sizes (`param_sizes`, from the blocks alive
/// from before the first backward: `parameter_sizes`), and those of every block that model
/// construction made in the trace (`StackInfo::construction`: a model built or copied later, as
/// a sweep builds one per run, whose parameters were not yet made at the first backward).
pub fn gradient_sizes(stacks: &StackTable, blocks: &[BlockLifetime], param_sizes: &BTreeSet<u64>) -> BTreeSet<u64> {
    let mut sizes = param_sizes.clone();
    sizes.extend(
        blocks.iter().filter(|b| b.alloc_event().is_some() && stacks.get(b.stack).construction).map(|b| b.size),
    );
    sizes
}

/// A readable label for an attribution.
pub fn attr_label(snap: &Snapshot, attr: Attr) -> String {
    match attr {
        Attr::Backward(Some(f)) => format!("backward launched at {}", short_of(snap, f)),
        Attr::Backward(None) => "backward pass (launch line unknown)".into(),
        Attr::Site(f) => short_of(snap, f),
        Attr::Library => "library code (no user frame)".into(),
        Attr::PreTrace => "allocated before the trace".into(),
        Attr::NoFrames => "no frames recorded".into(),
    }
}
