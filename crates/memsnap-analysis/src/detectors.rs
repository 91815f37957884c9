//! The detectors. Each returns suspects with numbers in words (evidence) and a concrete fix
//! (advice). Rules are documented in `docs/detectors.md`.
//!
//! A leak is growth: bytes from one site still allocated at the end of the trace that were
//! allocated in iteration after iteration. A high-water mark that comes back every iteration
//! is not a leak, and neither is state allocated once (optimizer state, caches).

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};

use memsnap_model::{Action, BlockState, FrameId, Snapshot, StackId, TraceEvent};
use memsnap_replay::DeviceReplay;

use crate::attribution::{attr_label, attribute, Attr, Site};
use crate::phases::Phases;
use crate::stacks::StackTable;
use crate::Moment;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
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

    /// Leak kinds (growth of live memory), as opposed to events and states.
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

#[derive(Clone, Debug, PartialEq)]
pub struct Suspect {
    pub kind: SuspectKind,
    pub confidence: f64,
    pub device: u32,
    /// Bytes at stake (still allocated at the end, or at the moment of the event for OOMs).
    pub bytes: u64,
    /// Of those, bytes that were live at the peak of allocated memory.
    pub bytes_at_peak: u64,
    pub growth_bytes_per_iteration: Option<u64>,
    pub site: Option<Site>,
    /// The stack of a representative block, innermost first.
    pub stack: Vec<Site>,
    pub evidence: String,
    pub advice: String,
}

/// Ranking: OOMs first, then by bytes at stake, then kind and site (deterministic).
pub fn rank(a: &Suspect, b: &Suspect) -> Ordering {
    let oom = |s: &Suspect| s.kind != SuspectKind::Oom;
    oom(a)
        .cmp(&oom(b))
        .then(b.bytes.cmp(&a.bytes))
        .then(a.kind.cmp(&b.kind))
        .then(a.site.cmp(&b.site))
        .then(a.device.cmp(&b.device))
}

pub fn fmt_bytes(b: u64) -> String {
    memsnap_model::format_bytes(b, 1)
}

fn stack_sites(snap: &Snapshot, stack: StackId) -> Vec<Site> {
    snap.stack(stack).frames.iter().map(|&f| Site::of(snap, f)).collect()
}

pub(crate) fn detect(
    snap: &Snapshot,
    stacks: &StackTable,
    phases: &Phases,
    d: &DeviceReplay,
    events: &[TraceEvent],
    end: &Moment,
) -> Vec<Suspect> {
    let mut out = Vec::new();
    out.extend(oom(snap, stacks, phases, d, events));
    out.extend(growth(snap, stacks, phases, d, events));
    out.extend(grads_through_eval(snap, stacks, phases, d, events, &out));
    out.extend(fragmentation(snap, d, end));
    out.sort_by(rank);
    out
}

// ------------------------------------------------------------------------------------------
// Growth: retained_graph, no_grad_missing, unreleased_gradient, reference_leak

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum GroupKey {
    /// No frames at all (recorded without stacks): growth can be measured, not attributed.
    Unattributed,
    Backward(Option<FrameId>),
    Forward(Option<FrameId>),
    Site(FrameId),
}

/// What a growth group is found to be: everything of a suspect but its numbers.
struct Verdict {
    kind: SuspectKind,
    site: Option<Site>,
    stack: Vec<Site>,
    evidence: String,
    advice: String,
}

/// Marks an occurrence number as an evaluation pass index rather than an iteration index.
const EVAL_PASS: usize = 1 << 40;

#[derive(Default)]
struct Group {
    /// Occurrences (iterations, or forward passes for evaluation passes) with survivors.
    occurrences: BTreeSet<usize>,
    bytes: u64,
    blocks: u64,
    bytes_at_peak: u64,
    eval_bytes: u64,
    /// Survivor bytes per inner site (the user line inside the model / the site).
    inner: BTreeMap<FrameId, u64>,
    /// Survivor bytes that were the last allocation of their forward pass (the model output).
    output_bytes: u64,
    /// Distinct operations (innermost Python frames) the survivors were allocated by.
    ops: BTreeSet<FrameId>,
    /// Survivor bytes whose size is a parameter's (gradients, rather than activation grads).
    param_sized_bytes: u64,
    /// Survivor bytes allocated inside a loss function.
    loss_bytes: u64,
    largest: (u64, StackId),
    first_event: u32,
    last_event: u32,
    per_occurrence: BTreeMap<usize, u64>,
}

fn growth(
    snap: &Snapshot,
    stacks: &StackTable,
    phases: &Phases,
    d: &DeviceReplay,
    events: &[TraceEvent],
) -> Vec<Suspect> {
    let n_iter = phases.iteration_count();
    if n_iter < 3 || events.is_empty() {
        return Vec::new();
    }
    let last_iter = n_iter - 1;
    let peak_t = d.peaks.allocated.event_index.map(|i| i as u32);
    let param_sizes = parameter_sizes(stacks, phases, d, events);
    // Which iterations / eval passes allocated anything, per group (the eligible occurrences).
    let mut eligible: BTreeMap<GroupKey, BTreeSet<usize>> = BTreeMap::new();
    // Inner sites allocated by trained forward passes, per call site (for coverage).
    let mut forward_inner: BTreeMap<Option<FrameId>, BTreeSet<FrameId>> = BTreeMap::new();
    // Survivors first (key, occurrence, eval, block), aggregated below once one-off sizes are
    // set aside.
    let mut survivors: Vec<(GroupKey, usize, bool, &memsnap_replay::BlockLifetime)> = Vec::new();

    for b in &d.blocks {
        let Some(a) = b.alloc_event else { continue };
        let Some(it) = phases.iteration_of(a) else { continue };
        let (attr, _) = attribute(events, phases, stacks, b);
        let info = stacks.get(events[a as usize].stack);
        let (key, occurrence, eval) = match attr {
            Attr::Backward(line) => (GroupKey::Backward(line), it, false),
            Attr::Site(_) if info.forward => {
                let (pass, fwd) = match phases.forward_at(a) {
                    Some((k, f)) => (k, Some(*f)),
                    None => (usize::MAX, None),
                };
                let eval = fwd.is_some_and(|f| !f.trained);
                if let (Some(_), Some(op)) = (fwd, info.innermost_python) {
                    forward_inner.entry(info.forward_call).or_default().insert(op);
                }
                // Evaluation passes repeat within one iteration: count passes, not iterations
                // (tagged so the two never collide when one line does both).
                let occ = if eval { EVAL_PASS | pass } else { it };
                (GroupKey::Forward(info.forward_call), occ, eval)
            }
            Attr::Site(site) => {
                // Work around evaluation passes (the batch before, the loss and metrics after)
                // repeats per pass too: tag it with the next pass when that is an evaluation
                // pass, else with the previous one when that was.
                let k = phases.forwards.partition_point(|f| f.span.start <= a);
                if phases.forwards.get(k).is_some_and(|f| !f.trained) {
                    (GroupKey::Site(site), EVAL_PASS | k, true)
                } else if k > 0 && !phases.forwards[k - 1].trained {
                    (GroupKey::Site(site), EVAL_PASS | (k - 1), true)
                } else {
                    (GroupKey::Site(site), it, false)
                }
            }
            Attr::NoFrames => (GroupKey::Unattributed, it, false),
            _ => continue,
        };
        if it == last_iter && !eval {
            continue;
        }
        eligible.entry(key).or_default().insert(occurrence);
        if b.free_requested_event.is_none() && b.free_completed_event.is_none() {
            survivors.push((key, occurrence, eval, b));
        }
    }

    // A leak repeats. Blocks of a size that survives from a single occurrence while the group
    // has several are one-off state (a library workspace made by the first backward, a lazily
    // created buffer), not growth.
    let mut size_occ: BTreeMap<(GroupKey, u64), BTreeSet<usize>> = BTreeMap::new();
    let mut group_occ: BTreeMap<GroupKey, BTreeSet<usize>> = BTreeMap::new();
    for &(key, occ, _, b) in &survivors {
        size_occ.entry((key, b.size)).or_default().insert(occ);
        group_occ.entry(key).or_default().insert(occ);
    }
    let one_off = |key: GroupKey, size: u64| {
        group_occ.get(&key).is_some_and(|o| o.len() >= 3) && size_occ.get(&(key, size)).is_some_and(|o| o.len() == 1)
    };

    let mut groups: BTreeMap<GroupKey, Group> = BTreeMap::new();
    for &(key, occurrence, eval, b) in &survivors {
        if one_off(key, b.size) {
            continue;
        }
        let Some(a) = b.alloc_event else { continue };
        let info = stacks.get(events[a as usize].stack);
        let attr = attribute(events, phases, stacks, b).0;
        let g = groups.entry(key).or_insert_with(|| Group { first_event: a, ..Group::default() });
        g.occurrences.insert(occurrence);
        *g.per_occurrence.entry(occurrence).or_default() += b.size;
        g.bytes += b.size;
        g.blocks += 1;
        if eval {
            g.eval_bytes += b.size;
        }
        if b.state_after(peak_t) == Some(BlockState::Allocated) {
            g.bytes_at_peak += b.size;
        }
        if param_sizes.contains(&b.size) {
            g.param_sized_bytes += b.size;
        }
        // The model's output: allocated by the pass's last operation (an operation may allocate
        // several tensors, e.g. layer_norm's output, mean and rstd).
        if let Some((_, f)) = phases.forward_at(a) {
            // An operation is identified by its frame and the model line that called it (every
            // Linear layer allocates at the same line of torch/nn/modules/linear.py).
            let last = f.last_alloc.map(|la| stacks.get(events[la as usize].stack));
            if last.is_some_and(|l| {
                l.innermost_python.is_some()
                    && l.innermost_python == info.innermost_python
                    && l.module_call == info.module_call
            }) {
                g.output_bytes += b.size;
            }
        }
        let inner = match attr {
            Attr::Site(s) => info.module_call.unwrap_or(s),
            Attr::Backward(Some(l)) => l,
            _ => FrameId(u32::MAX),
        };
        *g.inner.entry(inner).or_default() += b.size;
        if let Some(op) = info.innermost_python {
            g.ops.insert(op);
        }
        if info.loss {
            g.loss_bytes += b.size;
        }
        if b.size > g.largest.0 {
            g.largest = (b.size, events[a as usize].stack);
        }
        g.first_event = g.first_event.min(a);
        g.last_event = g.last_event.max(a);
    }

    let iter_desc = match phases.iteration_source {
        crate::IterationSource::Backward => format!(
            "iterations are delimited by the backward pass at {}",
            phases.iteration_line.map_or("?".to_string(), |f| Site::of(snap, f).short())
        ),
        crate::IterationSource::Forward => format!(
            "iterations are delimited by the forward call at {}",
            phases.iteration_line.map_or("?".to_string(), |f| Site::of(snap, f).short())
        ),
        crate::IterationSource::Annotation => {
            format!(
                "iterations are delimited by the annotation {:?}",
                phases.iteration_annotation.as_deref().unwrap_or("")
            )
        }
        crate::IterationSource::None => String::new(),
    };

    let mut out: Vec<Suspect> = Vec::new();
    // Occurrence sets of each suspect in `out` (iterations; empty for evaluation passes, which
    // count passes instead).
    let mut occurrence_sets: Vec<BTreeSet<usize>> = Vec::new();
    for (key, g) in groups {
        let elig = eligible.get(&key).map_or(0, |s| s.len());
        let occ = g.occurrences.len();
        let ratio = if elig == 0 { 0.0 } else { occ as f64 / elig as f64 };
        let strong = occ >= 3 && ratio >= 0.5 || occ >= 2 && elig >= 2 && ratio >= 0.99;
        if !strong {
            continue;
        }
        // Growth is steady when most occurrences leave bytes of the same order behind.
        let vals: Vec<u64> = g.per_occurrence.values().copied().collect();
        let median = {
            let mut v = vals.clone();
            v.sort_unstable();
            v[v.len() / 2]
        };
        let steady = vals.iter().filter(|&&x| x * 4 >= median && x <= median * 4).count() as f64 / vals.len() as f64;
        let growth = g.bytes / occ as u64;
        let confidence = (0.45 + 0.05 * occ.min(8) as f64 + 0.15 * ratio.min(1.0) + 0.1 * steady).min(0.97);
        let stack = stack_sites(snap, g.largest.1);
        let top_inner: Vec<String> = {
            let mut v: Vec<(&FrameId, &u64)> = g.inner.iter().filter(|(f, _)| f.0 != u32::MAX).collect();
            v.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
            v.iter().take(3).map(|(f, _)| Site::of(snap, **f).short()).collect()
        };
        let base = format!(
            "{} blocks ({}) allocated in {} of {} {} are still allocated at the end of the trace (about {} left behind per {}); {}",
            g.blocks,
            fmt_bytes(g.bytes),
            occ,
            elig,
            if g.eval_bytes * 2 > g.bytes { "evaluation forward passes" } else { "iterations" },
            fmt_bytes(growth),
            if g.eval_bytes * 2 > g.bytes { "pass" } else { "iteration" },
            iter_desc
        );
        let verdict = match key {
            GroupKey::Unattributed => Verdict {
                kind: SuspectKind::ReferenceLeak,
                site: None,
                stack: Vec::new(),
                evidence: format!("{base}. The trace has no stacks for them, so the line that allocates them cannot be named."),
                advice: "Record with stacks: `torch.cuda.memory._record_memory_history(max_entries=100000, stacks=\"python\")`, dump again, and memsnap will name the line; meanwhile look for tensors appended to lists or caches every iteration.".into(),
            },
            // Kept gradients come one per parameter: several blocks per step, of parameter sizes.
            GroupKey::Backward(line) if g.param_sized_bytes * 2 >= g.bytes && g.blocks >= 2 * occ as u64 => Verdict {
                kind: SuspectKind::UnreleasedGradient,
                site: line.map(|f| Site::of(snap, f)),
                stack: line.map(|_| stack).unwrap_or_default(),
                evidence: format!(
                    "{base}. They were allocated by the autograd engine during {} and have the sizes of parameters: gradients, never released.",
                    attr_label(snap, Attr::Backward(line))
                ),
                advice: "Do not keep references to `.grad` tensors (e.g. `{n: p.grad}` in a log): store `p.grad.detach().clone().cpu()` or a norm (`p.grad.norm().item()`), and clear grads with `optimizer.zero_grad(set_to_none=True)` / `param.grad = None` right after `optimizer.step()`.".into(),
            },
            GroupKey::Backward(line) => Verdict {
                kind: SuspectKind::ReferenceLeak,
                site: line.map(|f| Site::of(snap, f)),
                stack: line.map(|_| stack).unwrap_or_default(),
                evidence: format!(
                    "{base}. They were allocated by the autograd engine during {}, but not with the sizes of parameters: gradients of activations (`grad_output`/`grad_input`) kept from inside the backward pass — typically by a backward hook or `register_hook` callback that stores them.",
                    attr_label(snap, Attr::Backward(line))
                ),
                advice: "Look for backward hooks (`register_full_backward_hook`, `register_hook`, `Tensor.register_hook`) that append tensors to a list or dict; store `t.detach().cpu()` or a statistic (`t.norm().item()`) instead, or clear the container every step.".into(),
            },
            GroupKey::Forward(call) => {
                let eval = g.eval_bytes * 2 > g.bytes;
                // Coverage is measured in operations (innermost Python frames), which differ from
                // layer to layer even when the whole model is library code.
                let covered = g.ops.len();
                let total_inner = forward_inner.get(&call).map_or(covered, |s| s.len().max(covered));
                let coverage = if total_inner == 0 { 0.0 } else { covered as f64 / total_inner as f64 };
                let call_site = call.map(|f| Site::of(snap, f));
                // Without no_grad, activations saved for backward survive at many lines of the
                // model; if only the output survives, the graph is not the problem (e.g. under
                // inference_mode), a reference to the output is.
                let outputs = g.output_bytes * 2 > g.bytes;
                let broad = !outputs && (covered >= 2 && coverage >= 0.5 || covered >= 6 && coverage >= 0.25);
                if eval && broad {
                    Verdict {
                        kind: SuspectKind::NoGradMissing,
                        site: call_site,
                        stack,
                        evidence: format!(
                            "{base}. These forward passes are never followed by a backward pass, yet {} of the {} operations they run ({}) left activations alive: autograd saved them for a backward that never comes.",
                            covered,
                            total_inner,
                            top_inner.join(", ")
                        ),
                        advice: "Wrap the whole evaluation loop in `with torch.no_grad():` (or `torch.inference_mode()`), not just the model call, and keep only detached results: `preds.append(out.argmax(-1).detach().cpu())`, `losses.append(loss.item())`.".into(),
                    }
                } else if broad {
                    Verdict {
                        kind: SuspectKind::RetainedGraph,
                        site: call_site,
                        stack,
                        evidence: format!(
                            "{base}. The survivors come from {covered} of the {total_inner} operations that allocate inside this forward pass (at {}): the saved tensors of each step's autograd graph are kept alive.",
                            top_inner.join(", ")
                        ),
                        advice: "Something keeps each step's graph alive: a loss or output stored with its history (a list, dict, log or closure) or `backward(retain_graph=True)`. Store `loss.item()` / `out.detach()` instead, and drop `retain_graph=True` unless a second backward really needs it.".into(),
                    }
                } else {
                    let (inner, _) = g
                        .inner
                        .iter()
                        .filter(|(f, _)| f.0 != u32::MAX)
                        .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))
                        .map(|(f, b)| (*f, *b))
                        .unwrap_or((FrameId(u32::MAX), 0));
                    // A kept model output is best fixed where the model is called.
                    let site = if inner.0 == u32::MAX || outputs { call_site } else { Some(Site::of(snap, inner)) };
                    Verdict {
                        kind: SuspectKind::ReferenceLeak,
                        site,
                        stack,
                        evidence: format!(
                            "{base}. Only {covered} of the {total_inner} operations that allocate in these forward passes (called at {}) leave memory behind ({}), so no autograd graph holds them: {} referenced from somewhere that outlives the step (a cache, closure, hook or list).",
                            call.map_or("?".to_string(), |f| Site::of(snap, f).short()),
                            top_inner.join(", "),
                            if outputs { "the model's outputs are" } else { "these intermediate outputs are" }
                        ),
                        advice: "Find what keeps the output of this line alive (a forward hook appending to a list, a dict cache, a closure, a global) and drop or bound it: `del` the reference, clear the cache each step, or keep `t.detach().cpu()` / a summary statistic instead of the GPU tensor.".into(),
                    }
                }
            }
            GroupKey::Site(site) => {
                let loss = g.loss_bytes * 2 > g.bytes;
                // A kept loss that still holds what the loss function saved for backward is a
                // retained graph; a kept scalar alone (backward already freed the graph's
                // tensors) is a plain reference leak, fixed the same way.
                let heavy = growth > 64 << 10;
                let kind = if loss && heavy { SuspectKind::RetainedGraph } else { SuspectKind::ReferenceLeak };
                let evidence = if loss && heavy {
                    format!("{base}. They are allocated inside the loss function called at this line: a loss kept as a tensor keeps its autograd graph and what the loss saved for backward.")
                } else if loss {
                    format!("{base}. They are the loss values computed at this line ({} each): the loss tensor is kept (e.g. appended to a list) instead of its value.", fmt_bytes(growth))
                } else {
                    format!("{base}. Tensors created at this line stay referenced after the iteration that made them.")
                };
                let advice = if loss {
                    "Keep the number, not the tensor: `losses.append(loss.item())` (or `loss.detach()`); accumulate with `total += loss.item()`.".to_string()
                } else {
                    "Find what keeps the tensors created at this line alive (a list, dict cache, closure or global) and drop or bound it: `del` the reference, or keep `t.detach().cpu()` / a summary instead of the GPU tensor.".to_string()
                };
                Verdict {
                    kind,
                    site: Some(Site::of(snap, site)),
                    stack,
                    evidence,
                    advice,
                }
            }
        };
        // Growth without stacks cannot be placed; say so with a capped confidence.
        let confidence = if key == GroupKey::Unattributed { confidence.min(0.5) } else { confidence };
        let suspect = Suspect {
            kind: verdict.kind,
            confidence,
            device: d.device,
            bytes: g.bytes,
            bytes_at_peak: g.bytes_at_peak,
            growth_bytes_per_iteration: Some(growth),
            site: verdict.site,
            stack: verdict.stack,
            evidence: verdict.evidence,
            advice: verdict.advice,
        };

        occurrence_sets.push(g.occurrences.clone());
        out.push(suspect);
    }
    merge_into_retained_graph(out, &occurrence_sets)
}

/// A retained forward graph also keeps the inputs and loss of each step alive (they are saved
/// tensors of the same graph): suspects at other lines whose survivors come from the same
/// iterations are folded into the retained-graph suspect instead of being listed as leaks of
/// their own.
fn merge_into_retained_graph(mut out: Vec<Suspect>, occ: &[BTreeSet<usize>]) -> Vec<Suspect> {
    let mut keep = vec![true; out.len()];
    // Graph suspects, largest first: a retained graph absorbs other lines' retained loss
    // tensors and kept inputs; a missing no_grad absorbs the inputs and metrics its passes keep.
    let mut mains: Vec<usize> = (0..out.len())
        .filter(|&i| {
            matches!(out[i].kind, SuspectKind::RetainedGraph | SuspectKind::NoGradMissing) && !occ[i].is_empty()
        })
        .collect();
    mains.sort_by(|&a, &b| out[b].bytes.cmp(&out[a].bytes).then(a.cmp(&b)));
    for main in mains {
        if !keep[main] || (out[main].kind == SuspectKind::RetainedGraph && !is_forward_graph(&out[main])) {
            continue;
        }
        let mut folded: Vec<(Site, u64)> = Vec::new();
        for i in 0..out.len() {
            // Survivors from the same steps (one stray occurrence allowed: the last batch of a
            // loop often stays referenced by its loop variable).
            let outside = occ[i].difference(&occ[main]).count();
            if i == main
                || !keep[i]
                || occ[i].is_empty()
                || outside > (occ[i].len() / 5).max(1)
                || outside == occ[i].len()
            {
                continue;
            }
            let absorbs = match out[main].kind {
                SuspectKind::RetainedGraph => {
                    matches!(out[i].kind, SuspectKind::RetainedGraph | SuspectKind::ReferenceLeak)
                }
                _ => out[i].kind == SuspectKind::ReferenceLeak,
            };
            if absorbs {
                if let Some(site) = out[i].site.clone() {
                    folded.push((site, out[i].bytes));
                }
                keep[i] = false;
            }
        }
        if folded.is_empty() {
            continue;
        }
        let extra: u64 = folded.iter().map(|f| f.1).sum();
        let list: Vec<String> = folded.iter().map(|(s, b)| format!("{} ({})", s.short(), fmt_bytes(*b))).collect();
        let occurrences = occ[main].len().max(1) as u64;
        let m = &mut out[main];
        m.bytes += extra;
        m.growth_bytes_per_iteration = Some(m.bytes / occurrences);
        m.evidence.push_str(&format!(
            " The same {} also left behind tensors from {} — kept by the same graphs; in all {} per {}.",
            if m.kind == SuspectKind::RetainedGraph { "steps" } else { "passes" },
            list.join(", "),
            fmt_bytes(m.bytes / occurrences),
            if m.kind == SuspectKind::RetainedGraph { "iteration" } else { "pass" },
        ));
    }
    let mut i = 0;
    out.retain(|_| {
        i += 1;
        keep[i - 1]
    });
    out
}

/// A retained-graph suspect about a forward pass (not about a kept loss at one line): only those
/// absorb the rest of their graph.
fn is_forward_graph(s: &Suspect) -> bool {
    s.evidence.contains("operations that allocate inside this forward pass")
}

/// Sizes of parameters: blocks alive at the end that were allocated before the trace, or before
/// the first backward pass outside forward and optimizer (model setup). Gradients have these
/// sizes; a backward block of another size is an activation gradient or a library workspace.
fn parameter_sizes(stacks: &StackTable, phases: &Phases, d: &DeviceReplay, events: &[TraceEvent]) -> BTreeSet<u64> {
    let first_backward = phases.backwards.first().map_or(u32::MAX, |b| b.span.start);
    d.blocks
        .iter()
        .filter(|b| b.free_requested_event.is_none() && b.free_completed_event.is_none())
        .filter(|b| match b.alloc_event {
            None => true,
            Some(a) => {
                let info = stacks.get(events[a as usize].stack);
                a < first_backward && info.python && !info.forward && !info.optimizer && !info.backward_launch
            }
        })
        .map(|b| b.size)
        .collect()
}

// ------------------------------------------------------------------------------------------
// Gradients resident through evaluation

fn grads_through_eval(
    snap: &Snapshot,
    stacks: &StackTable,
    phases: &Phases,
    d: &DeviceReplay,
    events: &[TraceEvent],
    found: &[Suspect],
) -> Option<Suspect> {
    if phases.backwards.is_empty() {
        return None;
    }
    // Gradients have the sizes of parameters. Parameters are blocks alive at the end that were
    // allocated before the trace or outside forward, backward and optimizer; a backward block of
    // another size kept for good is a library workspace (e.g. cuBLAS), not a gradient.
    let param_sizes = parameter_sizes(stacks, phases, d, events);
    // The evaluation window (among the first 64) where the most backward-allocated bytes were
    // still allocated when it began.
    // (bytes, blocks, window index, bytes per backward line)
    type Best = (u64, u64, usize, BTreeMap<Option<FrameId>, u64>);
    let mut best: Option<Best> = None;
    for (wi, w) in phases.eval_windows.iter().enumerate().take(64) {
        if !phases.backwards.iter().any(|b| b.span.end <= w.start) {
            continue;
        }
        let t = Some(w.start);
        let mut bytes = 0;
        let mut blocks = 0;
        let mut lines: BTreeMap<Option<FrameId>, u64> = BTreeMap::new();
        for b in &d.blocks {
            let Some(a) = b.alloc_event else { continue };
            if a >= w.start || b.state_after(t) != Some(BlockState::Allocated) {
                continue;
            }
            if !param_sizes.contains(&b.size) {
                continue;
            }
            if let (Attr::Backward(line), _) = attribute(events, phases, stacks, b) {
                bytes += b.size;
                blocks += 1;
                *lines.entry(line).or_default() += b.size;
            }
        }
        if best.as_ref().is_none_or(|x| bytes > x.0) {
            best = Some((bytes, blocks, wi, lines));
        }
    }
    let (bytes, blocks, wi, lines) = best?;
    let w = phases.eval_windows[wi];
    let allocated = d.series.after(Some(w.start as usize)).allocated;
    if bytes < (1 << 20) || bytes * 100 < allocated {
        return None;
    }
    let line = lines.iter().max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0))).and_then(|(l, _)| *l);
    // A growth suspect at the same line already says it; do not repeat.
    if found.iter().any(|s| s.kind == SuspectKind::UnreleasedGradient && s.site == line.map(|f| Site::of(snap, f))) {
        return None;
    }
    let passes = phases.forwards.iter().filter(|f| !f.trained && w.contains(f.span.start)).count();
    let stack = line
        .and_then(|_| phases.backwards.iter().find(|b| b.line == line))
        .map(|b| stack_sites(snap, events[b.span.start as usize].stack))
        .unwrap_or_default();
    let peak_t = d.peaks.allocated.event_index.map(|i| i as u32);
    let at_peak: u64 = d
        .blocks
        .iter()
        .filter(|b| {
            b.alloc_event.is_some_and(|a| a < w.start) && b.state_after(Some(w.start)) == Some(BlockState::Allocated)
        })
        .filter(|b| b.state_after(peak_t) == Some(BlockState::Allocated) && param_sizes.contains(&b.size))
        .filter(|b| matches!(attribute(events, phases, stacks, b).0, Attr::Backward(_)))
        .map(|b| b.size)
        .sum();
    let share = bytes as f64 / allocated.max(1) as f64;
    Some(Suspect {
        kind: SuspectKind::UnreleasedGradient,
        confidence: (0.55 + 2.0 * share).min(0.9),
        device: d.device,
        bytes,
        bytes_at_peak: at_peak,
        growth_bytes_per_iteration: None,
        site: line.map(|f| Site::of(snap, f)),
        stack,
        evidence: format!(
            "When evaluation began (event {}, {} forward passes without backward), {} blocks ({}, {:.0}% of allocated memory) allocated by {} were still allocated: gradients held through a phase that never uses them.",
            w.start,
            passes,
            blocks,
            fmt_bytes(bytes),
            100.0 * bytes as f64 / allocated.max(1) as f64,
            attr_label(snap, Attr::Backward(line))
        ),
        advice: "Release gradients before evaluating: call `optimizer.zero_grad(set_to_none=True)` right after `optimizer.step()` (not at the start of the next step, and not with `set_to_none=False`), or `model.zero_grad(set_to_none=True)` before the evaluation loop.".into(),
    })
}

// ------------------------------------------------------------------------------------------
// Fragmentation

fn fragmentation(snap: &Snapshot, d: &DeviceReplay, end: &Moment) -> Option<Suspect> {
    let t = snap.device_totals().into_iter().find(|t| t.device == d.device)?;
    let reserved = t.reserved_bytes;
    if reserved == 0 {
        return None;
    }
    let split = t.inactive_split_bytes;
    let frac = split as f64 / reserved as f64;
    let alloc_frac = t.allocated_bytes as f64 / reserved as f64;
    if split < (32 << 20) || frac < 0.3 || alloc_frac > 0.6 {
        return None;
    }
    let pr = d.peaks.reserved;
    let at_pr = pr.event_index.map(|i| d.series.after(Some(i)).allocated);
    Some(Suspect {
        kind: SuspectKind::Fragmentation,
        confidence: (0.4 + frac).min(0.9),
        device: d.device,
        bytes: split,
        bytes_at_peak: 0,
        growth_bytes_per_iteration: None,
        site: None,
        stack: Vec::new(),
        evidence: format!(
            "At dump {} is reserved but only {} allocated; {} ({:.0}% of reserved) is free but inside split segments that also hold live blocks, so neither new allocations larger than the holes nor empty_cache() can use it. Largest free block {}. Reserved peaked at {}{}.",
            fmt_bytes(reserved),
            fmt_bytes(t.allocated_bytes),
            fmt_bytes(split),
            100.0 * frac,
            fmt_bytes(t.largest_free_block),
            fmt_bytes(pr.value),
            at_pr.map_or(String::new(), |a| format!(" while {} was allocated", fmt_bytes(a)))
        ),
        advice: format!(
            "Set `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` so segments grow instead of splitting; make tensor sizes uniform (pad or bucket variable-length batches); keep long-lived tensors from being allocated between short-lived ones (allocate them up front); call `torch.cuda.empty_cache()` only at phase boundaries. ({} cached free at the end.)",
            fmt_bytes(end.cached_free)
        ),
    })
}

// ------------------------------------------------------------------------------------------
// OOM

fn oom(snap: &Snapshot, stacks: &StackTable, phases: &Phases, d: &DeviceReplay, events: &[TraceEvent]) -> Vec<Suspect> {
    let ooms: Vec<usize> = events.iter().enumerate().filter(|(_, e)| e.action == Action::Oom).map(|(i, _)| i).collect();
    let Some(&first) = ooms.first() else { return Vec::new() };
    // Report the last OOM raised under the user's code (frameless ones are usually internal
    // requests the library retries, e.g. cuDNN workspaces); else the last OOM.
    let i = ooms
        .iter()
        .rev()
        .copied()
        .find(|&k| stacks.get(events[k].stack).site.is_some())
        .unwrap_or(*ooms.last().unwrap_or(&first));
    let e = &events[i];
    let before = if i == 0 { None } else { Some(i - 1) };
    let totals = d.series.after(before);
    let cached_free = totals.reserved.saturating_sub(totals.allocated);
    let map = d.state_after(before);
    let largest_free = map
        .segments
        .iter()
        .flat_map(|s| s.blocks.iter())
        .filter(|b| b.state == BlockState::Inactive)
        .map(|b| b.size)
        .max()
        .unwrap_or(0);
    // Who held memory: top sites of live blocks at that moment.
    let t = before.map(|x| x as u32);
    let mut by: BTreeMap<Attr, u64> = BTreeMap::new();
    for b in d.blocks.iter().filter(|b| b.state_after(t) == Some(BlockState::Allocated)) {
        *by.entry(attribute(events, phases, stacks, b).0).or_default() += b.size;
    }
    let mut top: Vec<(Attr, u64)> = by.into_iter().collect();
    top.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let holders: Vec<String> =
        top.iter().take(3).map(|(a, b)| format!("{} {}", fmt_bytes(*b), attr_label(snap, *a))).collect();
    // The line that asked: the OOM's own stack, else the last framed event before it.
    let stack = if e.stack != StackId::EMPTY {
        e.stack
    } else {
        events[..i]
            .iter()
            .rev()
            .take(10_000)
            .find(|x| stacks.get(x.stack).site.is_some())
            .map_or(StackId::EMPTY, |x| x.stack)
    };
    // Inside a model, the line that ran the model is the actionable one; the frames below it
    // are in the stack.
    let info = stacks.get(stack);
    let site = info.forward_call.or(info.site).map(|f| Site::of(snap, f));
    let chain: Vec<String> =
        snap.stack(stack).frames.iter().filter(|f| stacks.is_user(**f)).map(|&f| Site::of(snap, f).short()).collect();
    let requested = e.size;
    let device_free = e.device_free();
    let cause = if largest_free >= requested {
        "a free cached block was large enough, so this is unexpected (the allocator may have been limited by another stream or pool)".to_string()
    } else if cached_free >= requested {
        format!(
            "{} was cached free but the largest free block was only {}: fragmentation",
            fmt_bytes(cached_free),
            fmt_bytes(largest_free)
        )
    } else if device_free >= requested {
        format!(
            "the device itself still had {} free, so a per-process limit (`torch.cuda.set_per_process_memory_fraction`) or memory held outside this allocator stopped it",
            fmt_bytes(device_free)
        )
    } else {
        format!("the device had only {} free: the GPU was full", fmt_bytes(device_free))
    };
    let advice = if cached_free >= requested && largest_free < requested {
        "Set `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` to avoid fragmentation, or free the largest holders listed in the evidence before this allocation.".to_string()
    } else {
        "Reduce what is live at this point: the largest holders are listed in the evidence (free or move them to CPU first); otherwise reduce the batch size or sequence length, use activation checkpointing or mixed precision, or raise the process memory limit.".to_string()
    };
    vec![Suspect {
        kind: SuspectKind::Oom,
        confidence: 1.0,
        device: d.device,
        bytes: requested,
        bytes_at_peak: 0,
        growth_bytes_per_iteration: None,
        site,
        stack: stack_sites(snap, stack),
        evidence: format!(
            "{} OOM event{} on device {}; the last one under user code{} asked for {} (event {}) while {} was allocated and {} reserved ({} cached free, largest free block {}); {}. Memory was held by: {}.",
            ooms.len(),
            if ooms.len() == 1 { "" } else { "s" },
            d.device,
            if chain.is_empty() { String::new() } else { format!(" ({})", chain.join(" <- ")) },
            fmt_bytes(requested),
            i,
            fmt_bytes(totals.allocated),
            fmt_bytes(totals.reserved),
            fmt_bytes(cached_free),
            fmt_bytes(largest_free),
            cause,
            if holders.is_empty() { "nothing".to_string() } else { holders.join("; ") }
        ),
        advice,
    }]
}
