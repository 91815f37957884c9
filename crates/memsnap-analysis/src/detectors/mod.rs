//! The detectors: one module per suspect kind, each a [`Detector`] in [`REGISTRY`].
//!
//! A detector reads the typed facts of one device in a [`Context`] (the replay's block
//! lifetimes, the phases, the [`Lifecycle`] of every forward pass) and returns [`Finding`]s:
//! the blocks it blames, typed [`Evidence`], a site and a severity. [`detect`] measures every
//! finding the same way (bytes, growth, the peak without it) and renders its words. To add a
//! detector: write a module with a type implementing [`Detector`], add it to [`REGISTRY`], add
//! its `Evidence` variant and its words in `render.rs`, and its tests in
//! `tests/detector_<name>.rs` (a positive and a near miss per rule).
//!
//! Detectors are disjoint by construction: each claims blocks by a lifecycle fact no other
//! claims (see each module), except that `no_grad_missing` and `retained_graph` may name the same
//! evaluation graphs, which have both causes (grad was on, and a reference keeps them).

mod fragmentation;
mod no_grad_missing;
mod oom;
pub(crate) mod reference_leak;
mod retained_graph;
pub(crate) mod state_only;
mod unreleased_gradient;

use std::collections::BTreeSet;

use memsnap_model::{DeviceTotals, FrameId, Snapshot, StackId, TraceEvent};
use memsnap_replay::{BlockLifetime, DeviceReplay};

use crate::attribution::{attribute, Attr};
use crate::evidence::{rank, Evidence, IterationsBy, Occurrence, Severity, Suspect, SuspectKind};
use crate::lifecycle::Lifecycle;
pub(super) use crate::median::median;
use crate::phases::{IterationSource, Phases};
use crate::render;
use crate::site::Site;
use crate::stacks::StackTable;
use crate::thresholds::Thresholds;
use crate::Moment;

/// Everything a detector may read about one device.
pub struct Context<'a> {
    pub snap: &'a Snapshot,
    pub stacks: &'a StackTable,
    pub phases: &'a Phases,
    pub replay: &'a DeviceReplay,
    pub events: &'a [TraceEvent],
    pub lifecycle: &'a Lifecycle,
    pub thresholds: &'a Thresholds,
    /// Dump-time totals of this device.
    pub totals: Option<&'a DeviceTotals>,
    pub end: &'a Moment,
    /// Sizes of parameters (see [`parameter_sizes`]).
    pub param_sizes: BTreeSet<u64>,
    /// The trace records allocations (false for state-only recordings: only the dump speaks).
    pub traced: bool,
    /// The dump's stacks of blocks by `(device, address)` when some trace has no stack on any
    /// allocation (`context="state"`), else empty.
    pub dump_stacks: &'a rustc_hash::FxHashMap<(u32, u64), StackId>,
    /// [`Context::kept_backward_groups`], computed on first use.
    pub kept_backward: std::sync::OnceLock<Vec<BackwardGroup>>,
    /// [`Context::held_by_retained_graph`], computed on first use.
    pub retained_held: std::sync::OnceLock<Vec<Option<HeldBy>>>,
    /// [`Context::state_reading`], computed on first use.
    pub(crate) state_read: std::sync::OnceLock<Option<state_only::StateReading>>,
    /// [`Context::growing_chains`], computed on first use.
    pub(crate) chains: std::sync::OnceLock<Vec<reference_leak::Chain>>,
}

/// The held graph that keeps a block it did not allocate in its pass
/// ([`Context::held_by_retained_graph`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeldBy {
    /// The graphs a retaining backward (index into [`Phases::backwards`]) went through.
    ///
    /// [`Phases::backwards`]: crate::phases::Phases
    Backward(u32),
    /// The graph of unit `u` (index into `Lifecycle::units`), which no backward consumed and a
    /// reference holds: a stored loss of a pass never backpropagated, a skipped training step.
    Pass(u32),
}

/// A detector: reads a [`Context`], returns findings.
pub trait Detector: Sync {
    fn kind(&self) -> SuspectKind;
    fn detect(&self, cx: &Context) -> Vec<Finding>;
}

/// Every detector, in the order they run (the order does not change results: findings are ranked
/// afterwards).
pub static REGISTRY: &[&dyn Detector] = &[
    &oom::Oom,
    &retained_graph::RetainedGraph,
    &no_grad_missing::NoGradMissing,
    &unreleased_gradient::UnreleasedGradient,
    &reference_leak::ReferenceLeak,
    &fragmentation::Fragmentation,
];

/// What a detector found, before measurement.
pub struct Finding {
    pub kind: SuspectKind,
    pub severity: Severity,
    pub confidence: f64,
    /// Indices into `DeviceReplay::blocks` of the memory this finding is about.
    pub blocks: Vec<usize>,
    /// What growth is counted per.
    pub occurrence: Occurrence,
    /// Event indices where occurrences start (for growth); empty: no growth.
    pub boundaries: Vec<u32>,
    /// Bytes at stake when the blocks do not say it (an OOM's request, fragmentation's split
    /// bytes, gradients at the start of an evaluation window).
    pub bytes: Option<u64>,
    pub site: Option<Site>,
    pub stack: StackId,
    pub facts: Evidence,
    /// Occurrences that left memory behind (0 where not counted).
    pub occurrences: usize,
}

/// Run every detector on one device, measure and render the findings, rank them.
pub fn detect(cx: &Context) -> Vec<Suspect> {
    // Detectors are independent (they read the context only): run side by side, collected in
    // registry order.
    use rayon::prelude::*;
    // Each suspect with the blocks of a `leak` or `held` finding (for the fragmentation check below).
    let found: Vec<Vec<(Suspect, Vec<usize>)>> = REGISTRY
        .par_iter()
        .map(|d| {
            d.detect(cx)
                .into_iter()
                .filter_map(|f| {
                    let held_to_the_end = matches!(f.severity, Severity::Leak | Severity::Held);
                    let blocks = if held_to_the_end { f.blocks.clone() } else { Vec::new() };
                    finish(cx, f).map(|s| (s, blocks))
                })
                .collect()
        })
        .collect();
    let found: Vec<(Suspect, Vec<usize>)> = found.into_iter().flatten().collect();
    // Split segments pinned mostly by a reported leak's tensors are that leak's footprint.
    let leak_blocks: rustc_hash::FxHashSet<usize> = found.iter().flat_map(|(_, b)| b.iter().copied()).collect();
    let leak_pinned = |s: &Suspect| {
        s.kind == SuspectKind::Fragmentation
            && !leak_blocks.is_empty()
            && fragmentation::pinned_by_leaks(cx, &leak_blocks)
    };
    let mut out: Vec<Suspect> = found.into_iter().map(|(s, _)| s).filter(|s| !leak_pinned(s)).collect();
    out.sort_by(rank);
    out
}

/// The live bytes of a set of blocks over the trace.
pub struct Measured {
    /// Still allocated after the last event.
    pub at_end: u64,
    /// The most allocated at once.
    pub max_live: u64,
    /// Allocated right after the peak of allocated memory.
    pub at_peak: u64,
    /// Median of the per-occurrence deltas.
    pub growth: Option<u64>,
    /// Peak of allocated memory minus these blocks, at every moment.
    pub peak_without: Option<u64>,
}

/// How many of `eligible` (ascending) lie strictly between occurrences `a` and `b`.
pub fn occurrences_between(eligible: &[usize], a: usize, b: usize) -> usize {
    eligible.partition_point(|&e| e < b).saturating_sub(eligible.partition_point(|&e| e <= a))
}

/// Measure a set of blocks against the device's series.
pub fn measure(cx: &Context, blocks: &[usize], boundaries: &[u32]) -> Measured {
    let d = cx.replay;
    let n = d.series.len();
    let mut deltas: Vec<(u32, i64)> = Vec::with_capacity(blocks.len() * 2);
    let mut live0: i64 = 0;
    for &bi in blocks {
        let b = &d.blocks[bi];
        let size = b.size as i64;
        match b.alloc_event() {
            Some(a) => deltas.push((a, size)),
            None => live0 += size,
        }
        if let Some(f) = b.freed_at() {
            deltas.push((f, -size));
        }
    }
    deltas.sort_unstable();
    let peak_idx = d.peaks.allocated.event_index;
    let mut live = live0;
    let mut max_live = live0.max(0) as u64;
    let mut at_peak = if peak_idx.is_none() { live0.max(0) as u64 } else { 0 };
    let mut peak_without =
        if n == 0 { None } else { Some(d.series.start.allocated.saturating_sub(live0.max(0) as u64)) };
    let mut k = 0;
    let mut bounds = boundaries.iter().copied().peekable();
    let mut at_bounds: Vec<i64> = Vec::new();
    for t in 0..n {
        while bounds.peek().is_some_and(|&b| b as usize <= t) {
            at_bounds.push(live);
            bounds.next();
        }
        while k < deltas.len() && deltas[k].0 as usize == t {
            live += deltas[k].1;
            k += 1;
        }
        let l = live.max(0) as u64;
        max_live = max_live.max(l);
        if peak_idx == Some(t) {
            at_peak = l;
        }
        let without = d.series.allocated(t).saturating_sub(l);
        peak_without = Some(peak_without.map_or(without, |p: u64| p.max(without)));
    }
    for _ in bounds {
        at_bounds.push(live);
    }
    let at_end = live.max(0) as u64;
    if !boundaries.is_empty() {
        at_bounds.push(live);
    }
    let mut diffs: Vec<i64> = at_bounds.windows(2).map(|w| w[1] - w[0]).collect();
    diffs.sort_unstable();
    let growth = (!diffs.is_empty()).then(|| diffs[diffs.len() / 2]).filter(|&g| g > 0).map(|g| g as u64);
    Measured { at_end, max_live, at_peak, growth, peak_without }
}

/// Does memory measured as `m` (`bytes` at stake) raise the peak by `min_peak_share` of it or
/// more? Away from the peak, memory that is released costs nothing.
fn raises_peak(cx: &Context, m: &Measured, bytes: u64) -> bool {
    let peak = cx.replay.peaks.allocated.value;
    let gain = m.peak_without.map_or(bytes, |w| peak.saturating_sub(w)).max(m.at_peak);
    gain as f64 >= cx.thresholds.min_peak_share * peak as f64
}

/// Measure, threshold and render one finding.
fn finish(cx: &Context, f: Finding) -> Option<Suspect> {
    let m = measure(cx, &f.blocks, &f.boundaries);
    let bytes = f.bytes.unwrap_or(match f.severity {
        Severity::Leak | Severity::Held => m.at_end,
        Severity::Peak | Severity::Waste => m.max_live,
    });
    let many = f.severity == Severity::Leak && f.occurrences >= cx.thresholds.small_leak_occurrences;
    // What the same line kept before a wrapped ring's first event counts towards what is at
    // stake (the dump's stacks name it: `facts.before_trace`), though not in `bytes`, which
    // are the trace's: j08 keeps 20 MiB of draft probabilities, 1.4 MiB of them in the trace.
    let before_trace = match &f.facts {
        Evidence::ReferenceLeak { before_trace: Some(bt), .. } => bt.bytes,
        _ => 0,
    };
    if f.kind.is_leak() && bytes.saturating_add(before_trace) < cx.thresholds.min_suspect_bytes && !many {
        return None;
    }
    if f.kind.is_leak() && f.severity == Severity::Peak && !raises_peak(cx, &m, bytes) {
        return None;
    }
    let growth = if f.severity == Severity::Leak { m.growth } else { None };
    // Without allocations in the trace there is no peak to compare with.
    let peak_without = if f.blocks.is_empty() || !cx.traced { None } else { m.peak_without };
    let stack = stack_sites(cx.snap, f.stack);
    let mut s = Suspect {
        kind: f.kind,
        severity: f.severity,
        confidence: f.confidence,
        device: cx.replay.device,
        bytes,
        bytes_at_peak: m.at_peak,
        peak_without,
        growth_bytes_per_iteration: growth,
        growth_unit: f.occurrence,
        site: f.site,
        stack,
        iterations: iterations_by(cx),
        facts: f.facts,
        evidence: String::new(),
        advice: String::new(),
    };
    s.evidence = render::evidence(&s, cx.replay.peaks.allocated.value);
    s.advice = render::advice(&s);
    Some(s)
}

pub fn stack_sites(snap: &Snapshot, stack: StackId) -> Vec<Site> {
    snap.stack(stack).frames.iter().map(|&f| Site::of(snap, f)).collect()
}

fn iterations_by(cx: &Context) -> Option<IterationsBy> {
    let p = cx.phases;
    let source = match p.iteration_source {
        IterationSource::Backward => "backward",
        IterationSource::Forward => "forward",
        IterationSource::Annotation => "annotation",
        IterationSource::Loop => "loop",
        IterationSource::None => return None,
    };
    Some(IterationsBy {
        source,
        site: p.iteration_line.map(|f| Site::of(cx.snap, f)),
        annotation: p.iteration_annotation.clone(),
    })
}

// ------------------------------------------------------------------------------------------
// Facts shared by several detectors.

impl Context<'_> {
    pub fn site(&self, f: FrameId) -> Site {
        Site::of(self.snap, f)
    }

    /// The stack an event was recorded with.
    pub fn event_stack(&self, b: &BlockLifetime) -> StackId {
        b.alloc_event().and_then(|a| self.events.get(a as usize)).map_or(b.stack, |e| e.stack)
    }

    pub fn attr(&self, b: &BlockLifetime) -> Attr {
        attribute(self.events, self.phases, self.stacks, b).0
    }

    /// The iteration a block was allocated in.
    pub fn iteration_of(&self, b: &BlockLifetime) -> Option<usize> {
        b.alloc_event().and_then(|a| self.phases.iteration_of(a))
    }

    /// Iteration starts (the last iteration runs to the end of the trace, which `measure`
    /// closes by itself).
    pub fn iteration_boundaries(&self) -> Vec<u32> {
        self.phases.boundaries.clone()
    }

    /// Confidence of a growth finding: more occurrences and a larger share of them leaving memory
    /// behind make it surer. Ceiling 0.97: a snapshot never proves which reference holds memory.
    pub fn growth_confidence(&self, kept: usize, eligible: usize) -> f64 {
        let share = if eligible == 0 { 0.0 } else { kept as f64 / eligible as f64 };
        (0.5 + 0.05 * kept.min(8) as f64 + 0.1 * share.min(1.0)).min(0.97)
    }

    /// Are `kept` occurrences out of `eligible` growth (see [`Thresholds`])?
    pub fn is_growth(&self, kept: usize, eligible: usize) -> bool {
        kept >= self.thresholds.min_leak_occurrences
            && kept as f64 >= self.thresholds.leak_occurrence_share * eligible.max(1) as f64
    }

    /// Growth of a site none of whose kept tensors was ever let go (see
    /// [`Thresholds::unevicted_leak_share`]): `kept` and `eligible` are distinct, ascending
    /// occurrences. At least `min_leak_occurrences` kept, in at least that share of the eligible
    /// occurrences from the first kept one on, and the kept occurrences go on to the end: no more
    /// eligible occurrences after the last kept one than between two kept ones. The last eligible
    /// occurrence is left out: when the snapshot is dumped the loop's variables still hold what
    /// it made (`x`, `out` of the final step), which says nothing about keeping.
    ///
    /// [`Thresholds::unevicted_leak_share`]: crate::Thresholds
    pub fn is_unevicted_growth(&self, kept: &[usize], eligible: &[usize]) -> bool {
        self.kept_on_to_the_end(kept, eligible)
            .is_some_and(|(kept, from_first)| kept as f64 >= self.thresholds.unevicted_leak_share * from_first as f64)
    }

    /// Generations made again and again, each kept (a new optimizer made per stage while the
    /// earlier ones stay referenced, with their state): at least `min_leak_occurrences` of them
    /// among the eligible occurrences, going on to the end as [`Context::is_unevicted_growth`]
    /// asks. No share of the occurrences: a generation is made once per stage, an epoch or a
    /// task of many iterations, and what repeats is the generation, not the iteration.
    pub fn is_kept_generations(&self, generations: &[usize], eligible: &[usize]) -> bool {
        self.kept_on_to_the_end(generations, eligible).is_some()
    }

    /// `kept` without the final eligible occurrence, when at least `min_leak_occurrences` of them
    /// go on to the end (no more eligible occurrences after the last kept one than between two
    /// kept ones): their number, and the eligible occurrences from the first kept one on.
    fn kept_on_to_the_end(&self, kept: &[usize], eligible: &[usize]) -> Option<(usize, usize)> {
        let (&final_occurrence, eligible) = eligible.split_last()?;
        let kept = &kept[..kept.partition_point(|&k| k < final_occurrence)];
        let (&first, &last) = (kept.first()?, kept.last()?);
        if kept.len() < self.thresholds.min_leak_occurrences {
            return None;
        }
        let from_first = eligible.len() - eligible.partition_point(|&e| e < first);
        let after_last = eligible.len() - eligible.partition_point(|&e| e <= last);
        let widest_gap = kept.windows(2).map(|w| occurrences_between(eligible, w[0], w[1])).max().unwrap_or(0);
        (after_last <= widest_gap).then_some((kept.len(), from_first))
    }

    /// This device read from its dump alone (`state_only::read`), `None` when its trace can be
    /// read: the groups `reference_leak` and `retained_graph` both take, and the working sets the
    /// caveats name.
    pub(crate) fn state_reading(&self) -> Option<&state_only::StateReading> {
        self.state_read.get_or_init(|| state_only::read(self)).as_ref()
    }

    /// User lines outside model calls whose re-made tensor grows, each replacing the last
    /// ([`reference_leak::chains`]): asked by the detector and by the input-growth caveat. Like
    /// the other lazily made facts here, made on one thread (rayon inside a `OnceLock`'s
    /// initialization could run another job that waits on the same lock).
    pub(crate) fn growing_chains(&self) -> &[reference_leak::Chain] {
        self.chains.get_or_init(|| reference_leak::chains(self))
    }

    /// Kept backward-allocated blocks, grouped by backward line, with whether they look like
    /// parameter gradients kept step after step (`looks_like_gradients`), once the
    /// current gradients are left out (`gradient_generations`).
    pub fn kept_backward_groups(&self) -> &[BackwardGroup] {
        self.kept_backward.get_or_init(|| self.group_kept_backward())
    }

    /// Per block of the replay: the held graph (a retaining backward's, or an unconsumed pass's)
    /// that keeps the block to the end though no forward pass of that graph allocated it.
    ///
    /// Mechanism. A pass whose graph a retaining backward kept (`retain_graph=True`;
    /// `create_graph=True` implies it) and a reference still holds (*retained by backward*,
    /// [`Lifecycle::graph_held`]) keeps every tensor its operations saved, and three kinds of
    /// them were not allocated by the pass itself (the first also for a pass no backward ran
    /// through whose graph a reference holds: a loss stored from an evaluation with grad on, a
    /// skipped training step's, as a discriminator's loss logged on the steps it is not updated:
    /// af14, whose real batch and generated images its convolutions saved):
    /// - its inputs, made in its step before it (the batch, or the generator's output fed to a
    ///   discriminator; not the optimizer state a step in between made): the first convolution
    ///   or linear saves its input;
    /// - what the retaining backward allocated and that outlives it, but for parameter-sized
    ///   blocks (the gradients): with `create_graph=True` the backward records a graph of its
    ///   own whose operations save their tensors (the gradients of every layer), kept as long as
    ///   its result is (a plain retaining backward leaves only parameter gradients); so does a
    ///   backward that ran after it before the next forward pass, through the same graphs;
    /// - the gradient of such an input that requires grad (`x.requires_grad_()` for a saliency or
    ///   gradient penalty): a later backward accumulates it into `x.grad`, of exactly `x`'s size,
    ///   and it lives as long as `x` does.
    ///
    /// One-off blocks whose stack and size never recur (a cuBLAS workspace made the first time an
    /// operation runs) are none of these, as in the lifecycle. None of them is a separate
    /// reference: they are the graph's, reported as
    /// `retained_graph`, not as a `reference_leak` or kept gradients.
    pub fn held_by_retained_graph(&self) -> &[Option<HeldBy>] {
        self.retained_held.get_or_init(|| self.find_retained_held())
    }

    fn find_retained_held(&self) -> Vec<Option<HeldBy>> {
        use crate::lifecycle::UnitFate;
        let lc = self.lifecycle;
        let bs = &self.replay.blocks;
        let mut out = vec![None; bs.len()];
        // (the end of the backward before the pass, the pass start, the held graph)
        let windows: Vec<(u32, u32, HeldBy)> = lc
            .units
            .iter()
            .enumerate()
            .filter_map(|(u, unit)| {
                let by = match unit.fate {
                    UnitFate::RetainedByBackward { backward } => HeldBy::Backward(backward as u32),
                    UnitFate::Unconsumed if unit.grad_on => HeldBy::Pass(u as u32),
                    UnitFate::Abandoned => HeldBy::Pass(u as u32),
                    _ => return None,
                };
                if !lc.graph_held(u) {
                    return None;
                }
                let k = self.phases.backwards.partition_point(|b| b.span.end <= unit.pass_span.start);
                let since = k.checked_sub(1).map_or(0, |k| self.phases.backwards[k].span.end);
                Some((since, unit.pass_span.start, by))
            })
            .collect();
        if windows.is_empty() {
            return out;
        }
        // Backward → the retaining backward whose graphs it went through: each retaining
        // backward itself, and the backwards that ran after one before the next forward pass
        // began. Those went through the same graphs (a second `autograd.grad` over the first's
        // `create_graph=True` result, as a PDE residual's second derivative does), and with
        // `create_graph=True` they record a graph of their own on the first's, whose saved
        // tensors the same reference keeps (r01: 68 MiB a step of the second derivative's
        // products, read before as the engine's blocks kept apart).
        let mut retaining: std::collections::BTreeMap<usize, usize> = Default::default();
        for backward in windows.iter().filter_map(|w| match w.2 {
            HeldBy::Backward(k) => Some(k as usize),
            HeldBy::Pass(_) => None,
        }) {
            let end = self.phases.backwards[backward].span.end;
            let forwards = &self.phases.forwards;
            let next_pass =
                forwards.get(forwards.partition_point(|f| f.span.start < end)).map_or(u32::MAX, |f| f.span.start);
            for k in
                (backward..self.phases.backwards.len()).take_while(|&k| self.phases.backwards[k].span.start < next_pass)
            {
                retaining.entry(k).or_insert(backward);
            }
        }
        // The first window (by pass start) that holds event `a`. Windows come in pass order and
        // where their inputs may start (the end of the backward before the pass) never goes
        // back, so the first window that starts after `a` is the only one that can hold it: a
        // binary search, not a scan of every window per block (a program that retains the
        // graphs of thousands of passes has as many windows).
        let input_window = |a: u32| -> Option<HeldBy> {
            let w = windows.get(windows.partition_point(|w| w.1 <= a))?;
            (w.0 <= a).then_some(w.2)
        };
        // (iteration, size) of the inputs, with their graph's backward
        let mut inputs: std::collections::BTreeMap<(usize, u64), HeldBy> = Default::default();
        for (bi, b) in bs.iter().enumerate() {
            let Some(a) = b.alloc_event().filter(|_| b.freed_at().is_none()) else { continue };
            // A library's workspace made the first time an operation ran (cuBLAS), not a
            // graph's tensor.
            if lc.is_one_off(bi) {
                continue;
            }
            if matches!(self.attr(b), Attr::Backward(_)) {
                let k = self.phases.backward_index_at(a);
                // Parameter gradients (the last step's, alive at the end) are no part of a graph.
                // What `torch.autograd.grad` returns is no parameter's `.grad`, whatever its size:
                // with `create_graph=True` the operations run on it save it (a gradient norm
                // saves its input: ak06's norms logged with their graph keep the gradients they
                // were taken of).
                let returned = k.is_some_and(|k| {
                    let start = self.phases.backwards[k].span.start;
                    self.events.get(start as usize).is_some_and(|e| self.stacks.get(e.stack).grad_call)
                });
                if self.param_sizes.contains(&b.size) && !returned {
                    continue;
                }
                out[bi] = k.and_then(|k| retaining.get(&k)).map(|&k| HeldBy::Backward(k as u32));
            } else if let Some(bw) = input_window(a) {
                // Optimizer state made by the step between the two passes is no input.
                let info = self.stacks.get(self.events[a as usize].stack);
                if info.optimizer || info.construction || info.recompute {
                    continue;
                }
                out[bi] = Some(bw);
                if let Some(it) = self.iteration_of(b) {
                    inputs.insert((it, b.size), bw);
                }
            }
        }
        // A graph's saved tensors come back with every step it is kept; an engine block of a size
        // kept once is a workspace the backward's first matmul made (cuBLAS, on the engine's
        // thread), whose stack, frameless, says nothing.
        let mut engine_sizes: rustc_hash::FxHashMap<u64, u32> = Default::default();
        for (bi, b) in bs.iter().enumerate() {
            if out[bi].is_some() && matches!(self.attr(b), Attr::Backward(_)) {
                *engine_sizes.entry(b.size).or_default() += 1;
            }
        }
        for (bi, b) in bs.iter().enumerate() {
            if out[bi].is_some() && matches!(self.attr(b), Attr::Backward(_)) && engine_sizes.get(&b.size) == Some(&1) {
                out[bi] = None;
            }
        }
        for (bi, b) in bs.iter().enumerate() {
            if out[bi].is_none()
                && b.alloc_event().is_some()
                && b.freed_at().is_none()
                && matches!(self.attr(b), Attr::Backward(_))
            {
                out[bi] = self.iteration_of(b).and_then(|it| inputs.get(&(it, b.size)).copied());
            }
        }
        out
    }

    fn group_kept_backward(&self) -> Vec<BackwardGroup> {
        let mut groups: Vec<BackwardGroup> = Vec::new();
        let held = self.held_by_retained_graph();
        for (bi, b) in self.replay.blocks.iter().enumerate() {
            if b.alloc_event().is_none() || b.freed_at().is_some() || held[bi].is_some() {
                continue;
            }
            let Attr::Backward(line) = self.attr(b) else { continue };
            let Some(it) = self.iteration_of(b) else { continue };
            let g = match groups.iter_mut().position(|g| g.line == line) {
                Some(i) => &mut groups[i],
                None => {
                    groups.push(BackwardGroup { line, ..BackwardGroup::default() });
                    groups.last_mut().expect("just pushed")
                }
            };
            g.blocks.push(bi);
            g.kept_iterations.insert(it);
            if self.param_sizes.contains(&b.size) {
                g.sizes.insert(b.size);
            }
        }
        let last = self.phases.iteration_count().checked_sub(1);
        for g in &mut groups {
            if !self.looks_like_gradients(&g.blocks) {
                continue;
            }
            // Without the gradients of the last `generations` iterations (see below).
            let generations = self.gradient_generations(g.line);
            let earlier: Vec<usize> = g
                .blocks
                .iter()
                .copied()
                .filter(|&bi| {
                    self.iteration_of(&self.replay.blocks[bi])
                        .zip(last)
                        .is_some_and(|(it, last)| it + generations <= last)
                })
                .collect();
            g.gradient_like = self.looks_like_gradients(&earlier);
        }
        groups.sort_by_key(|g| g.line);
        groups
    }

    /// Whether kept backward blocks look like parameter gradients: at least
    /// `min_gradients_per_step` per iteration they come from, of two or more parameter sizes,
    /// at least half of their bytes in blocks of parameter sizes.
    fn looks_like_gradients(&self, blocks: &[usize]) -> bool {
        let (mut bytes, mut param_sized_bytes) = (0u64, 0u64);
        let mut iterations = BTreeSet::new();
        let mut sizes = BTreeSet::new();
        for &bi in blocks {
            let b = &self.replay.blocks[bi];
            bytes += b.size;
            iterations.extend(self.iteration_of(b));
            if self.param_sizes.contains(&b.size) {
                param_sized_bytes += b.size;
                sizes.insert(b.size);
            }
        }
        let per_step = blocks.len() as u64 / iterations.len().max(1) as u64;
        per_step >= self.thresholds.min_gradients_per_step && sizes.len() >= 2 && param_sized_bytes * 2 >= bytes
    }

    /// For how many iterations a parameter's gradient from backward line `line` lives in this
    /// program (at least 1): the median over the parameter-sized blocks of that line the trace
    /// saw made and freed, in iterations from the one that made it to the one that freed it.
    ///
    /// Mechanism. A gradient lives from the backward that makes it to the `zero_grad` that drops
    /// it, and the last ones are alive at the end in every program, held in `.grad`: one
    /// iteration's in a plain loop, but as many as there are models trained in turn, each with
    /// its own backward and `zero_grad` (an ensemble's members: d03), or micro-batches whose
    /// gradients accumulate before one step. Those made in the last that many iterations are
    /// current gradients, not kept ones; counted as kept, they made one tensor per step of a
    /// parameter's size (a hook's `grad_output`: y06) read as gradients once the trace held few
    /// steps (y06's last 50%: 13 blocks over 3 steps, 10 of them the last step's `.grad`s), and
    /// an ensemble's last round read as gradients kept step after step (d03's last 20%). Kept
    /// gradients are never freed, so they do not lengthen the median.
    fn gradient_generations(&self, line: Option<FrameId>) -> usize {
        let mut lives: Vec<usize> = self
            .replay
            .blocks
            .iter()
            .filter(|b| b.freed_at().is_some() && self.param_sizes.contains(&b.size))
            .filter(|b| matches!(self.attr(b), Attr::Backward(l) if l == line))
            .filter_map(|b| {
                let made = self.iteration_of(b)?;
                let freed = self.phases.iteration_of(b.freed_at()?)?;
                Some(freed.saturating_sub(made))
            })
            .collect();
        lives.sort_unstable();
        lives.get(lives.len().saturating_sub(1) / 2).copied().unwrap_or(1).max(1)
    }

    /// Iterations in which a backward launched at `line` ran.
    pub fn backward_iterations(&self, line: Option<FrameId>) -> BTreeSet<usize> {
        self.phases
            .backwards
            .iter()
            .filter(|b| b.line == line)
            .filter_map(|b| self.phases.iteration_of(b.span.start))
            .collect()
    }

    /// The stack of the allocation that launched the first backward from `line`.
    pub fn backward_stack(&self, line: Option<FrameId>) -> StackId {
        self.phases
            .backwards
            .iter()
            .find(|b| b.line == line)
            .and_then(|b| self.events.get(b.span.start as usize))
            .map_or(StackId::EMPTY, |e| e.stack)
    }
}

/// Kept blocks allocated by backward passes from one line.
#[derive(Default)]
pub struct BackwardGroup {
    pub line: Option<FrameId>,
    pub blocks: Vec<usize>,
    pub kept_iterations: BTreeSet<usize>,
    /// The parameter sizes among its blocks' sizes.
    pub sizes: BTreeSet<u64>,
    pub gradient_like: bool,
}

/// Sizes of parameters: blocks alive at the end that were allocated before the trace, or before
/// the first backward pass outside forward and optimizer (model setup). Gradients have these
/// sizes; a backward block of another size is an activation gradient or a library workspace.
pub fn parameter_sizes(stacks: &StackTable, phases: &Phases, d: &DeviceReplay, events: &[TraceEvent]) -> BTreeSet<u64> {
    let first_backward = phases.backwards.first().map_or(u32::MAX, |b| b.span.start);
    // Lines that allocate again once training runs make data (each step's batch), not
    // parameters: a parameter is made once, before its first backward. A first batch kept to the
    // end (held by a graph) does not make its size a parameter's.
    let recurring: rustc_hash::FxHashSet<StackId> = events
        .iter()
        .skip(first_backward as usize)
        .filter(|e| e.action() == memsnap_model::Action::Alloc)
        .map(|e| e.stack)
        .collect();
    d.blocks
        .iter()
        .filter(|b| b.freed_at().is_none())
        .filter(|b| match b.alloc_event() {
            None => true,
            Some(a) => {
                let info = stacks.get(events[a as usize].stack);
                a < first_backward
                    && info.python
                    && !info.forward
                    && !info.optimizer
                    && !info.backward_launch
                    && !recurring.contains(&events[a as usize].stack)
            }
        })
        .map(|b| b.size)
        .collect()
}
