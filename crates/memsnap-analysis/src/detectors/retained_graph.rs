//! `retained_graph`: autograd graphs kept alive past the point where they should be freed.
//!
//! Mechanism. A graph's saved tensors are freed by the backward that runs through it. Three
//! lifecycle facts (see `lifecycle.rs`) mean a graph was kept instead:
//! - the pass was followed by its backward, which freed none of its blocks
//!   (`backward(retain_graph=True)`): held until `loss` is rebound next step (severity `peak`), or
//!   for good when the loss or output is also stored (`leak`). Site: the `.backward()` line.
//! - the pass ran with grad on, no backward ever consumed it, and its blocks are still alive two
//!   passes later, after any rebound variable let go: a Python reference (a list of losses, a
//!   running `total += loss`) keeps the graph. Site: the first kept scalar (the loss or sum the
//!   user holds), else the line that ran the model.
//!   Training passes whose backward the program skipped (`UnitFate::Abandoned`: an exception or
//!   `continue` between forward and backward) are held the same way when their graph outlives
//!   them (a stored exception's traceback keeps the frame that holds the loss).
//!   Either way the graph is held only when most of what the pass saved is (`Lifecycle::
//!   graph_held`): a detached output or the inputs kept after the graph was let go are tensors
//!   held by a reference (`reference_leak`), not a graph.
//! - the same, for passes awaiting a deferred backward that had not run when the trace ended
//!   (at an OOM): what filled memory.
//!
//! Claims: blocks of units with those fates that are alive past their graph's end, and, for a
//! retaining backward's graphs, what they keep without their passes having allocated it (their
//! inputs, a create_graph backward's saved tensors: `Context::held_by_retained_graph`). Near misses:
//! a graph freed by its backward; a graph rebound each step (at most one alive at a time).

use std::collections::BTreeMap;

use memsnap_model::{FrameId, StackId};

use super::{state_only, Context, Detector, Finding, HeldBy};
use crate::evidence::{Evidence, GraphHold, Occurrence, Severity, SuspectKind};
use crate::lifecycle::{BlockFate, UnitFate};

pub struct RetainedGraph;

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Key {
    Backward(Option<FrameId>),
    Kept(Option<FrameId>),
    Awaiting(Option<FrameId>),
    Skipped(Option<FrameId>),
}

#[derive(Default)]
struct Group {
    units: Vec<usize>,
    blocks: Vec<usize>,
    /// Kept-to-the-end blocks per occurrence.
    kept_occurrences: std::collections::BTreeSet<usize>,
    eligible: usize,
    /// Candidate scalar roots (allocation event, block).
    roots: Vec<(u32, usize)>,
    lines: BTreeMap<FrameId, u64>,
    largest: (u64, StackId),
    backward_line: Option<FrameId>,
    /// Units retained by a backward that another backward followed before any pass ran (see
    /// [`differentiated_again`]).
    differentiated_again: usize,
}

impl Detector for RetainedGraph {
    fn kind(&self) -> SuspectKind {
        SuspectKind::RetainedGraph
    }

    fn detect(&self, cx: &Context) -> Vec<Finding> {
        // Read from the dump alone, graphs show as many operations' saved tensors alive at the
        // dump (`state_only`): the only shape of this kind such a file can show.
        if let Some(state) = cx.state_reading() {
            return state.groups.iter().filter_map(|g| seen_at_dump(cx, g)).collect();
        }
        let lc = cx.lifecycle;
        let th = cx.thresholds;
        let mut groups: BTreeMap<Key, Group> = BTreeMap::new();
        let key_of = |u: usize| {
            let unit = &lc.units[u];
            match unit.fate {
                UnitFate::RetainedByBackward { backward } => Some(Key::Backward(cx.phases.backwards[backward].line)),
                // A reference keeps the graph only when it keeps what the graph saved; a kept
                // detached output or input of a graph let go is `reference_leak`'s.
                UnitFate::Unconsumed if unit.grad_on && lc.graph_held(u) => Some(Key::Kept(unit.call_site)),
                // A training pass whose backward was skipped: held only by a reference.
                UnitFate::Abandoned if lc.graph_held(u) => Some(Key::Skipped(unit.call_site)),
                UnitFate::AwaitingBackward => Some(Key::Awaiting(unit.call_site)),
                _ => None,
            }
        };
        for (u, unit) in lc.units.iter().enumerate() {
            let Some(key) = key_of(u) else { continue };
            let g = groups.entry(key).or_default();
            g.eligible += 1;
            if let UnitFate::RetainedByBackward { backward } = unit.fate {
                g.backward_line = cx.phases.backwards[backward].line;
                g.differentiated_again += differentiated_again(cx, backward) as usize;
            }
            let mut held_any = false;
            for ub in &lc.blocks[u] {
                let b = &cx.replay.blocks[ub.block];
                // A root is a scalar the user's own line made from the pass's result and carried
                // past the pass (a running `total = total + loss`), not one a library saved
                // inside a loss function. The first one is where the keeping starts.
                let info = cx.stacks.get(cx.event_stack(b));
                let after_pass = b.alloc_event().is_some_and(|a| a >= unit.pass_span.end);
                if after_pass
                    && ub.fate != BlockFate::Temporary
                    && b.size <= th.scalar_root_bytes
                    && info.site.is_some()
                    && info.site == info.innermost_python
                {
                    g.roots.push((b.alloc_event().unwrap_or(0), ub.block));
                }
                if !matches!(ub.fate, BlockFate::Kept | BlockFate::ReleasedLater(_)) {
                    continue;
                }
                held_any = true;
                g.blocks.push(ub.block);
                let stack = cx.event_stack(b);
                let info = cx.stacks.get(stack);
                if ub.fate == BlockFate::Kept {
                    let occ = match key {
                        Key::Backward(_) => cx.iteration_of(b).unwrap_or(u),
                        _ => u,
                    };
                    g.kept_occurrences.insert(occ);
                }
                if ub.in_pass {
                    if let Some(line) = info.module_call.or(info.site) {
                        *g.lines.entry(line).or_default() += b.size;
                    }
                }
                if b.size > g.largest.0 {
                    g.largest = (b.size, stack);
                }
            }
            if held_any {
                g.units.push(u);
            }
        }

        // What the held retained graphs keep without having allocated it in their passes: their
        // inputs, a create_graph backward's saved tensors, those inputs' gradients
        // (`Context::held_by_retained_graph`).
        let claimed: std::collections::BTreeSet<usize> =
            groups.values().flat_map(|g| g.blocks.iter().copied()).collect();
        for (bi, by) in cx.held_by_retained_graph().iter().enumerate() {
            let b = &cx.replay.blocks[bi];
            // The group, and the occurrence the block counts in, as the graph's own blocks do:
            // a retaining backward's iteration, an unconsumed pass's unit.
            let (key, occurrence) = match by {
                Some(HeldBy::Backward(k)) => (Key::Backward(cx.phases.backwards[*k as usize].line), cx.iteration_of(b)),
                Some(HeldBy::Pass(u)) => match key_of(*u as usize) {
                    Some(key) => (key, Some(*u as usize)),
                    None => continue,
                },
                None => continue,
            };
            let Some(g) = groups.get_mut(&key) else { continue };
            if claimed.contains(&bi) {
                continue;
            }
            g.blocks.push(bi);
            if let Some(occurrence) = occurrence {
                g.kept_occurrences.insert(occurrence);
            }
        }
        let mut out = Vec::new();
        for (key, g) in groups {
            if g.units.len() < th.min_held_graphs {
                continue;
            }
            let kept_occurrences = g.kept_occurrences.len();
            let growing = cx.is_growth(kept_occurrences, g.eligible);
            let severity = if growing { Severity::Leak } else { Severity::Peak };
            let (hold, occurrence, call) = match key {
                Key::Backward(_) if g.differentiated_again == g.eligible => {
                    (GraphHold::RetainedThenKept, Occurrence::Iteration, None)
                }
                Key::Backward(_) => (GraphHold::RetainedByBackward, Occurrence::Iteration, None),
                Key::Kept(c) => (GraphHold::KeptReference, Occurrence::Pass, c),
                Key::Awaiting(c) => (GraphHold::AwaitingBackward, Occurrence::Pass, c),
                Key::Skipped(c) => (GraphHold::SkippedBackward, Occurrence::Pass, c),
            };
            let first_unit = &lc.units[g.units[0]];
            let forward_call = call.or(first_unit.call_site);
            let root = g.roots.iter().min().map(|&(_, bi)| bi);
            let root_stack = root.map(|bi| cx.event_stack(&cx.replay.blocks[bi]));
            let mut root_site = root_stack.and_then(|s| cx.stacks.get(s).site);
            // A step left by an exception: a small value made after the pass in a function the
            // step called, not in the function that ran the model, outlives that call only
            // because the exception's traceback holds the callee's frame (ax01: a loss helper's
            // length check, `short = out_lens < tgt_lens`, then the raise). The frames hold the
            // graph, not that value, so it is no root, and the pass is where to look. A value
            // made in the step's own function is carried by it (af14's logged `d_loss`).
            if hold == GraphHold::SkippedBackward
                && root_site.zip(forward_call).is_some_and(|(r, f)| !same_function(cx, r, f))
            {
                root_site = None;
            }
            let (site, stack) = match hold {
                GraphHold::RetainedByBackward => (g.backward_line, cx.backward_stack(g.backward_line)),
                // The value that holds the graph, when the user's code made one after the pass;
                // else the retaining backward, as in the plain case (u11: `autograd.grad(...,
                // create_graph=True)` then `loss.backward()`, its kept value made after that).
                GraphHold::RetainedThenKept => match (root_site, root_stack) {
                    (Some(r), Some(s)) => (Some(r), s),
                    _ => (g.backward_line, cx.backward_stack(g.backward_line)),
                },
                _ => match (root_site, root_stack) {
                    (Some(r), Some(s)) => (Some(r), s),
                    _ => (forward_call, g.largest.1),
                },
            };
            let boundaries = match occurrence {
                Occurrence::Iteration if cx.phases.boundaries.len() >= 2 => cx.iteration_boundaries(),
                _ => g.units.iter().map(|&u| lc.units[u].span.start).collect(),
            };
            let mut lines: Vec<(FrameId, u64)> = g.lines.into_iter().collect();
            lines.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
            let facts = Evidence::RetainedGraph {
                hold,
                graphs: Some(g.units.len()),
                held_blocks: g.blocks.len() as u64,
                forward_call: forward_call.map(|f| cx.site(f)),
                backward_line: g.backward_line.map(|f| cx.site(f)),
                root: root_site.map(|f| cx.site(f)),
                held_lines: lines.iter().take(3).map(|(f, _)| cx.site(*f)).collect(),
                operations: None,
                input_lines: Vec::new(),
            };
            out.push(Finding {
                kind: SuspectKind::RetainedGraph,
                severity,
                confidence: cx.growth_confidence(g.units.len(), g.eligible),
                blocks: g.blocks,
                occurrence,
                boundaries,
                bytes: None,
                site: site.map(|f| cx.site(f)),
                stack,
                facts,
                occurrences: kept_occurrences,
            });
        }
        out
    }
}

/// Whether two frames are lines of one function (same file, same function name).
fn same_function(cx: &Context, a: FrameId, b: FrameId) -> bool {
    let (fa, fb) = (cx.snap.frame(a), cx.snap.frame(b));
    fa.filename == fb.filename && fa.name == fb.name
}

/// A state-only group with the shape of kept graphs (`state_only::GraphShape`): a leak, since
/// several passes' graphs are alive, at the confidence of what rests on the dump alone. Site: the
/// line that ran the model; the reference that keeps the graphs is not in the file.
fn seen_at_dump(cx: &Context, g: &state_only::Group) -> Option<Finding> {
    let shape = g.graph.as_ref()?;
    Some(Finding {
        kind: SuspectKind::RetainedGraph,
        severity: Severity::Leak,
        confidence: cx.thresholds.state_only_confidence,
        occurrence: Occurrence::Pass,
        boundaries: Vec::new(),
        bytes: None,
        site: Some(cx.site(g.line)),
        stack: g.stack,
        facts: Evidence::RetainedGraph {
            hold: GraphHold::SeenAtDump,
            graphs: shape.iterations(),
            held_blocks: g.blocks.len() as u64,
            forward_call: Some(cx.site(g.line)),
            backward_line: None,
            root: None,
            held_lines: shape.lines.iter().map(|&f| cx.site(f)).collect(),
            operations: Some(shape.ops),
            input_lines: shape.input_lines.iter().map(|&f| cx.site(f)).collect(),
        },
        occurrences: 0,
        blocks: g.blocks.clone(),
    })
}

/// Whether another backward pass (any line: `backward`, `autograd.grad`) started after backward
/// `b` and before the next forward pass: the graph `b` retained was differentiated again, so
/// `retain_graph=True` was what that needed, not the bug. A graph still alive after such a step
/// is held by a reference to its tensors (j07: GradNorm's per-task losses appended to a history
/// list), and the line to name is that value's or the model call's, not the backward's. A
/// retaining backward followed by another forward pass before the next backward (a GAN's
/// discriminator step, then the generator's) is the plain case: nothing needed the graph kept.
fn differentiated_again(cx: &Context, b: usize) -> bool {
    let backwards = &cx.phases.backwards;
    let Some(next) = backwards.get(b + 1) else { return false };
    let end = backwards[b].span.end;
    let units = &cx.lifecycle.units;
    let next_pass = units.partition_point(|u| u.pass_span.start < end);
    units.get(next_pass).is_none_or(|u| next.span.start < u.pass_span.start)
}
