//! Names the suspects of a memory snapshot: which line of the user's code holds memory, and why.
//!
//! Built on the exact replay ([`memsnap_replay`]): every block's lifetime is attributed to the
//! user's frame that allocated it (frameless backward allocations to the `.backward()` line
//! that launched them), phases are found from the trace alone (iterations, forward, backward,
//! optimizer, evaluation), and detectors look for what separates a leak from a high-water mark:
//! bytes from one site that are still alive after iteration after iteration.
//!
//! Results are plain data (no IO, no serialization); [`analyze`] never fails on odd data — what
//! it cannot know becomes a caveat.

mod attribution;
mod cache;
mod detectors;
mod evidence;
mod graph;
mod labels;
mod lifecycle;
mod median;
mod phases;
mod render;
mod site;
mod stacks;
mod thresholds;

use std::collections::{BTreeMap, BTreeSet};

use memsnap_model::{BlockState, Snapshot, StackId};
use memsnap_replay::{DeviceReplay, Replay};
use rayon::prelude::*;

pub use attribution::{alloc_phase, attr_label, attribute, categorize, gradient_sizes, AllocPhase, Attr, Category};
pub use cache::{allocator_cache, cache_at_dump, AllocatorCache, ReservedGrowth, SegmentMade};
pub use detectors::{Context, Detector, Finding, REGISTRY};
pub use evidence::{
    rank, BeforeTrace, Cleared, Evidence, GradientHold, GraphHold, HeldLevel, Holder, IterationsBy, LeakOrigin,
    Occurrence, OomCause, Severity, Suspect, SuspectKind,
};
pub use graph::{frame_label, LiveBlock, MemoryGraph, Node, AUTOGRAD, NO_FRAMES, PRE_TRACE};
pub use labels::{label_of, label_runs, label_spans, Annotations, LabelKind, LabelRun, LabelSpan, LabelTally};
pub use lifecycle::{lifecycle, BlockFate, Lifecycle, Unit, UnitBlock, UnitFate};
pub use phases::{find_phases, Backward, ForwardPass, IterationSource, Phases, Span};
pub use render::cache_words;
pub use site::{short_path, Site};
pub use stacks::{StackInfo, StackTable};
pub use thresholds::Thresholds;

/// Bytes held by one attribution at a moment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SiteBytes {
    pub attr: Attr,
    pub label: String,
    /// The user's frame (`None` for pre-trace, frameless or library-only memory).
    pub site: Option<Site>,
    pub bytes: u64,
    pub blocks: u64,
}

/// What was allocated at one moment, and by whom.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Moment {
    /// Event index after which the moment is taken (`None`: before the first event).
    pub event_index: Option<u32>,
    pub time_us: Option<i64>,
    pub allocated: u64,
    pub reserved: u64,
    /// Sorted by bytes (descending), then label.
    pub by_site: Vec<SiteBytes>,
    /// Bytes per category, in [`Category::ALL`] order; `cached_free` is reserved − allocated.
    pub by_category: Vec<(Category, u64)>,
    /// Bytes per phase that allocated them, in [`AllocPhase::ALL`] order.
    pub by_phase: Vec<(AllocPhase, u64)>,
    /// Bytes per `user_metadata` value of the allocation (`None`: no label), largest first;
    /// empty when no live block has one ([`LabelTally::bytes`]).
    pub by_metadata: Vec<(Option<String>, u64)>,
    /// The same per `torch.compile` region (`compile_context`).
    pub by_compile_region: Vec<(Option<String>, u64)>,
    pub cached_free: u64,
}

/// Phase facts for the report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PhaseSummary {
    pub iterations: usize,
    pub iteration_source: IterationSource,
    pub iteration_site: Option<Site>,
    pub iteration_annotation: Option<String>,
    /// Event index where each iteration starts.
    pub iteration_starts: Vec<u32>,
    pub backward_passes: usize,
    pub forward_passes: usize,
    pub eval_windows: Vec<Span>,
    /// Optimizer steps the trace shows ([`Phases::steps_shown`]).
    pub optimizer_steps: usize,
    /// Every `user_metadata` and `compile_context` value of the trace, as named phases.
    pub labels: Vec<LabelSpan>,
}

/// Analysis of one device.
pub struct DeviceAnalysis {
    pub device: u32,
    /// The trace records allocations, so the replayed peaks are measured. Without (a state-only
    /// recording, a legacy file) the file cannot establish the peak.
    pub peak_known: bool,
    pub suspects: Vec<Suspect>,
    pub peak: Moment,
    pub end: Moment,
    pub phases: PhaseSummary,
    /// The phases found in the trace, which `phases` summarises: for callers that attribute
    /// blocks again (reports, other moments) without finding them anew.
    pub trace_phases: Phases,
    /// The sizes a gradient may have ([`gradient_sizes`]), for callers that categorize blocks
    /// again ([`categorize`]).
    pub gradient_sizes: BTreeSet<u64>,
    pub caveats: Vec<String>,
    /// Live blocks at the peak, attributed (for flamegraphs and the report).
    pub peak_blocks: Vec<LiveBlock>,
    pub end_blocks: Vec<LiveBlock>,
    /// What the caching allocator holds beyond the live blocks at the dump, and how reserved
    /// memory grew; `None` for a profiler-converted file (its segments are address ranges, not
    /// cached memory).
    pub cache: Option<AllocatorCache>,
}

pub struct Analysis {
    pub devices: Vec<DeviceAnalysis>,
    pub stacks: StackTable,
}

impl Analysis {
    /// Every suspect of every device, ranked.
    pub fn suspects(&self) -> Vec<&Suspect> {
        let mut v: Vec<&Suspect> = self.devices.iter().flat_map(|d| d.suspects.iter()).collect();
        v.sort_by(|a, b| rank(a, b));
        v
    }
}

/// How many sites a moment lists before grouping the rest.
pub const TOP_SITES: usize = 25;

/// Analyse every device of a snapshot with its replay.
pub fn analyze(snap: &Snapshot, replay: &Replay) -> Analysis {
    analyze_with(snap, replay, &Thresholds::DEFAULT)
}

/// [`analyze`] with other thresholds (tests mutate them to show each one matters).
pub fn analyze_with(snap: &Snapshot, replay: &Replay, thresholds: &Thresholds) -> Analysis {
    analyze_prepared(snap, replay, Prepared::new(snap), thresholds)
}

/// What the analysis reads of the trace alone, without the replay: the stack table and each
/// device's phases, label spans and annotations. A caller that replays can build it side by side with the
/// replay (`rayon::join`) and hand it to [`analyze_prepared`].
pub struct Prepared {
    stacks: StackTable,
    /// By device, ascending: phases, label spans and annotations of its trace (empty without one).
    devices: BTreeMap<u32, PreparedDevice>,
}

impl Prepared {
    pub fn new(snap: &Snapshot) -> Prepared {
        let stacks = StackTable::new(snap);
        let annotations = snap.annotations_by_device();
        let devices = snap
            .device_ids()
            .par_iter()
            .map(|&device| {
                let annotations = annotations.get(&device).map_or(&[][..], |a| &a[..]);
                (device, Prepared::device(snap, &stacks, device, annotations))
            })
            .collect();
        Prepared { stacks, devices }
    }

    fn device(
        snap: &Snapshot,
        stacks: &StackTable,
        device: u32,
        annotations: &[memsnap_model::Annotation],
    ) -> PreparedDevice {
        let events = snap.trace(device).map_or(&[][..], |tr| &tr.events[..]);
        let (phases, (labels, notes)) = rayon::join(
            || find_phases(events, stacks, annotations),
            || rayon::join(|| label_spans(snap, events), || Annotations::of(snap, events)),
        );
        PreparedDevice { phases, labels, notes }
    }
}

/// What [`Prepared`] holds of one device.
struct PreparedDevice {
    phases: Phases,
    labels: Vec<LabelSpan>,
    /// The `annotate` entries' texts by block address.
    notes: Annotations,
}

/// [`analyze_with`] on what [`Prepared::new`] made of the same snapshot.
pub fn analyze_prepared(snap: &Snapshot, replay: &Replay, prepared: Prepared, thresholds: &Thresholds) -> Analysis {
    let Prepared { stacks, mut devices } = prepared;
    let totals = snap.device_totals();
    let mut work: Vec<(&DeviceReplay, PreparedDevice)> = replay
        .devices
        .iter()
        .map(|d| {
            // A replay of the same snapshot has the same devices; any other is prepared here.
            let prepared = devices.remove(&d.device).unwrap_or_else(|| {
                let annotations = snap.annotations_by_device().remove(&d.device).unwrap_or_default();
                Prepared::device(snap, &stacks, d.device, &annotations)
            });
            (d, prepared)
        })
        .collect();
    let dump_stacks = dump_stacks(snap, &stacks);
    let segments = snap.segments_by_device();
    let devices = work
        .par_drain(..)
        .map(|(d, prepared)| {
            let dump = DeviceDump {
                totals: memsnap_model::find_device(&totals, d.device, |t| t.device),
                segments: segments.get(&d.device).map_or(&[][..], |v| &v[..]),
            };
            analyze_device(snap, &stacks, d, dump, prepared, thresholds, &dump_stacks)
        })
        .collect();
    Analysis { devices, stacks }
}

/// The dump's stack of every block that has user frames, by `(device, address)`, built only when
/// some device's trace has allocations and none of them has a user frame (`context="state"`:
/// the allocator keeps stacks only for blocks still allocated); empty otherwise. Built once for
/// all devices: one pass over the segments.
fn dump_stacks(snap: &Snapshot, stacks: &StackTable) -> rustc_hash::FxHashMap<(u32, u64), StackId> {
    let stackless = snap.traces.iter().any(|t| {
        let mut allocs = t.events.iter().filter(|e| e.action() == memsnap_model::Action::Alloc).peekable();
        allocs.peek().is_some() && allocs.all(|e| stacks.userless(e.stack))
    });
    if !stackless {
        return Default::default();
    }
    snap.segments
        .iter()
        .flat_map(|s| s.blocks.iter().map(move |b| (s.device, b)))
        .filter(|(_, b)| !stacks.userless(b.stack))
        .map(|(dev, b)| ((dev, b.address), b.stack))
        .collect()
}

/// `b`, with the dump's stack when it is alive at the dump and the dump has a stack for its
/// address that its trace event lacks (`dump_stacks` is empty unless the trace's allocations
/// have no user frames, as with `context="state"`). Mechanism: a block never freed before the
/// dump is the dump's block at that address, and the allocator kept that block's stack.
pub(crate) fn with_dump_stack(
    b: &memsnap_replay::BlockLifetime,
    device: u32,
    dump_stacks: &rustc_hash::FxHashMap<(u32, u64), StackId>,
) -> memsnap_replay::BlockLifetime {
    let mut b = *b;
    if b.free_completed_event().is_none() {
        if let Some(&stack) = dump_stacks.get(&(device, b.address)) {
            b.stack = stack;
        }
    }
    b
}

/// Blocks allocated (not pending) after event `t` (`None`: at the start).
fn live_at(d: &DeviceReplay, t: Option<u32>) -> impl Iterator<Item = &memsnap_replay::BlockLifetime> {
    d.blocks.iter().filter(move |b| b.state_after(t) == Some(BlockState::Allocated))
}

/// Live memory at chosen moments of a snapshot's devices, without the analysis (what a
/// flamegraph needs). The dump's stacks (`dump_stacks`) are gathered once for the snapshot, so
/// that a file of many devices costs one pass over its segments, not one per device.
pub struct Moments<'a> {
    snap: &'a Snapshot,
    stacks: &'a StackTable,
    dump_stacks: rustc_hash::FxHashMap<(u32, u64), StackId>,
}

impl<'a> Moments<'a> {
    pub fn new(snap: &'a Snapshot, stacks: &'a StackTable) -> Moments<'a> {
        Moments { snap, stacks, dump_stacks: dump_stacks(snap, stacks) }
    }

    /// The moment after event `t` of device `d` (`None`: before the first event): bytes by site
    /// and category, and the live blocks; as the analysis finds them at its peak and end.
    pub fn at(&self, phases: &Phases, d: &DeviceReplay, t: Option<u32>) -> (Moment, Vec<LiveBlock>) {
        let events = self.snap.trace(d.device).map_or(&[][..], |tr| &tr.events[..]);
        let annotations = Annotations::of(self.snap, events);
        let param_sizes = detectors::parameter_sizes(self.stacks, phases, d, events);
        let grad_sizes = gradient_sizes(self.stacks, &d.blocks, &param_sizes);
        moment_with(self.snap, self.stacks, phases, &grad_sizes, d, t, &annotations, &self.dump_stacks)
    }
}

/// The moment after event `t` ([`Moments::at`]), with the device's annotations and the dump's
/// stacks already gathered.
#[allow(clippy::too_many_arguments)]
fn moment_with(
    snap: &Snapshot,
    stacks: &StackTable,
    phases: &Phases,
    gradient_sizes: &BTreeSet<u64>,
    d: &DeviceReplay,
    t: Option<u32>,
    annotations: &Annotations,
    dump_stacks: &rustc_hash::FxHashMap<(u32, u64), StackId>,
) -> (Moment, Vec<LiveBlock>) {
    let events = snap.trace(d.device).map_or(&[][..], |tr| &tr.events[..]);
    let totals = d.series.after(t.map(|i| i as usize));
    let mut by_attr: BTreeMap<Attr, (u64, u64)> = BTreeMap::new();
    let mut by_cat: BTreeMap<Category, u64> = BTreeMap::new();
    let mut by_phase: BTreeMap<AllocPhase, u64> = BTreeMap::new();
    let mut live = Vec::new();
    let mut labels = LabelTally::default();
    for b in live_at(d, t) {
        let b = &with_dump_stack(b, d.device, dump_stacks);
        labels.add(snap, events, annotations, b, t);
        let (attr, stack) = attribute(events, phases, stacks, b);
        let e = by_attr.entry(attr).or_default();
        e.0 += b.size;
        e.1 += 1;
        *by_cat.entry(categorize(events, phases, stacks, gradient_sizes, b, attr)).or_default() += b.size;
        *by_phase.entry(alloc_phase(events, phases, stacks, b, attr)).or_default() += b.size;
        live.push(LiveBlock { address: b.address, size: b.size, attr, stack });
    }
    let mut by_site: Vec<SiteBytes> = by_attr
        .into_iter()
        .map(|(attr, (bytes, blocks))| SiteBytes {
            attr,
            label: attr_label(snap, attr),
            site: match attr {
                Attr::Site(f) | Attr::Backward(Some(f)) => Some(Site::of(snap, f)),
                _ => None,
            },
            bytes,
            blocks,
        })
        .collect();
    by_site.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.label.cmp(&b.label)));
    live.sort_by_key(|b| b.address);
    let m = Moment {
        event_index: t,
        time_us: t.and_then(|i| events.get(i as usize)).filter(|e| e.has_time()).map(|e| e.time_us),
        allocated: totals.allocated,
        reserved: totals.reserved,
        by_site,
        by_category: Category::ALL.iter().map(|c| (*c, by_cat.get(c).copied().unwrap_or(0))).collect(),
        by_phase: AllocPhase::ALL.iter().map(|p| (*p, by_phase.get(p).copied().unwrap_or(0))).collect(),
        by_metadata: labels.bytes(snap, LabelKind::Metadata),
        by_compile_region: labels.bytes(snap, LabelKind::CompileRegion),
        cached_free: totals.reserved.saturating_sub(totals.allocated),
    };
    (m, live)
}

/// A device's part of the dump: its totals, and its segments (indices into
/// `Snapshot::segments`).
struct DeviceDump<'a> {
    totals: Option<&'a memsnap_model::DeviceTotals>,
    segments: &'a [usize],
}

fn analyze_device(
    snap: &Snapshot,
    stacks: &StackTable,
    d: &DeviceReplay,
    dump: DeviceDump<'_>,
    prepared: PreparedDevice,
    thresholds: &Thresholds,
    dump_stacks: &rustc_hash::FxHashMap<(u32, u64), StackId>,
) -> DeviceAnalysis {
    let PreparedDevice { phases, labels, notes } = prepared;
    let trace = snap.trace(d.device);
    let events = trace.map_or(&[][..], |tr| &tr.events[..]);
    // What the reader counted of the events (stacked ones, actions), not counted again here.
    let facts = trace.map(|tr| tr.facts()).unwrap_or_default();
    let peak_t = d.peaks.allocated.event_index.map(|i| i as u32);
    let end_t = if events.is_empty() { None } else { Some(events.len() as u32 - 1) };
    // The parameters' sizes, then the two moments (which categorize by the sizes a gradient
    // may have), beside the lifecycle: all read the replay and the phases only (the lifecycle
    // takes longest; the others, a pass over the events among them, fit beside it).
    let at = |grad_sizes: &BTreeSet<u64>, t: Option<u32>| {
        moment_with(snap, stacks, &phases, grad_sizes, d, t, &notes, dump_stacks)
    };
    // Without a trace the peak is the dump, and so is the end.
    let peak_and_end = |grad_sizes: &BTreeSet<u64>| {
        if events.is_empty() {
            let (peak, peak_blocks) = at(grad_sizes, peak_t);
            ((peak.clone(), peak_blocks.clone()), (peak, peak_blocks))
        } else {
            rayon::join(|| at(grad_sizes, peak_t), || at(grad_sizes, end_t))
        }
    };
    let ((((peak, peak_blocks), (end, end_blocks)), (param_sizes, gradient_sizes)), lifecycle) = rayon::join(
        || {
            let param_sizes = detectors::parameter_sizes(stacks, &phases, d, events);
            let grad_sizes = gradient_sizes(stacks, &d.blocks, &param_sizes);
            (peak_and_end(&grad_sizes), (param_sizes, grad_sizes))
        },
        || lifecycle::lifecycle(events, &snap.contexts, stacks, &phases, d, thresholds),
    );
    let mut caveats = Vec::new();
    if events.is_empty() {
        caveats
            .push("no trace for this device: only the dump-time state is known, no leak can be measured".to_string());
    } else {
        if !d.start.trace_complete {
            let n = d.start.blocks as u64;
            caveats.push(format!(
                "trace starts mid-run: {} before the first event ({} of {} are uncertain); {} no allocation stack",
                memsnap_model::plural(n, "block existed", "blocks existed"),
                memsnap_model::bytes_exact(d.start.uncertain_bytes),
                if n == 1 { "its size" } else { "their sizes" },
                if n == 1 { "it has" } else { "they have" }
            ));
        }
        if facts.events_with_frames == 0 {
            // Does a block alive at the dump name a line, by its own stack (allocated before
            // the trace) or the dump's (`dump_stacks`)? A pass over this device's blocks, not a
            // scan of every device's segments.
            let dump_framed =
                live_at(d, end_t).any(|b| !stacks.userless(with_dump_stack(b, d.device, dump_stacks).stack));
            caveats.push(if dump_framed {
                "no stacks in the trace: only the blocks alive at the dump name their lines (as with context=\"state\"); tables and suspects use those, and memory freed before the dump shows as \"no frames recorded\"".to_string()
            } else {
                "no stacks recorded: allocations cannot be attributed to lines of code".to_string()
            });
        }
        let (state_blocks, state_bytes, streams) =
            lifecycle::per_stream_state_totals(&lifecycle, events, &snap.contexts, d);
        if state_blocks > 0 {
            caveats.push(format!(
                "{} ({}) on {} look like a library's workspace made once per stream and kept by the library, not by a reference (cuBLAS keeps one per stream it runs a matmul on); not counted as a leak. If the program takes a new `torch.cuda.Stream()` each step (a pool of 32, handed out in turn), each stream gets one: make the streams once, before the loop",
                memsnap_model::count_of(state_blocks, "block"),
                memsnap_model::format_bytes(state_bytes, 2),
                memsnap_model::count_of(streams as u64, "side stream")
            ));
        }
        if phases.boundaries.len() < 2 {
            caveats.push("no repeating iterations found (no repeated backward or forward call): growth per iteration cannot be measured".to_string());
        }
        let backward_bytes: u64 =
            peak.by_site.iter().filter(|s| matches!(s.attr, Attr::Backward(_))).map(|s| s.bytes).sum();
        if backward_bytes > 0 {
            caveats.push(format!(
                "{} at the peak were allocated by the autograd engine without Python frames; they are attributed to the .backward() line that launched them",
                memsnap_model::bytes_exact(backward_bytes)
            ));
        }
        if let (count @ 1.., Some((before, after))) =
            (phases.unnamed_launches.count, phases.unnamed_launches.first_between)
        {
            let line = |f: Option<memsnap_model::FrameId>| {
                f.map_or_else(|| "code with no user frame".to_string(), |f| site::short_of(snap, f))
            };
            caveats.push(format!(
                "{} allocated nothing from Python at {} launch, so the trace does not record the launching line (a call handed its seed: `torch.autograd.grad(..., grad_outputs=v)`, `t.backward(g)`, `vjp_fn(v)`; or a backward launched from another device's trace); the engine's blocks are attributed to a backward at an unknown line. The first was launched between {} and {}",
                memsnap_model::plural(count as u64, "backward pass", "backward passes"),
                if count == 1 { "its" } else { "their" },
                line(before),
                after.map_or_else(|| "the end of the trace".to_string(), line)
            ));
        }
        if !d.check.matches_snapshot {
            caveats.push(format!(
                "replay does not reproduce the dump-time segment table ({}): totals over time may be approximate",
                memsnap_model::plural(d.check.mismatch_count as u64, "difference", "differences")
            ));
        }
    }
    caveats.extend(lifecycle::undecided_passes(&lifecycle, thresholds).into_iter().map(|(site, passes, saved)| {
        format!(
            "{} at {} ran with grad on and no backward, each between trained passes of the same code (or, the last, after one) that saved as many tensors (the same module mode, so no dropout or batch-norm difference): training steps whose backward was skipped (an exception, a `continue`) or a one-batch evaluation run through the training code without `torch.no_grad()`; the allocations cannot tell which. Each graph ({}) lived until the next pass rebound its variables; if this is an evaluation, run it under `torch.no_grad()`",
            memsnap_model::plural(passes as u64, "forward pass", "forward passes"),
            site.map_or_else(|| "an unknown line".to_string(), |f| site::short_of(snap, f)),
            memsnap_model::format_bytes(saved, 2)
        )
    }));
    let peak_known = facts.count(memsnap_model::Action::Alloc) > 0;
    let cx = detectors::Context {
        snap,
        stacks,
        phases: &phases,
        replay: d,
        events,
        lifecycle: &lifecycle,
        thresholds,
        totals: dump.totals,
        end: &end,
        param_sizes,
        traced: peak_known,
        dump_stacks,
        kept_backward: Default::default(),
        retained_held: Default::default(),
        state_read: Default::default(),
        chains: Default::default(),
    };
    let suspects = detectors::detect(&cx);
    let working_sets = cx.state_reading().map_or(&[][..], |s| &s.working_sets[..]);
    caveats.extend(working_sets.iter().map(|&(line, blocks, bytes, ref why)| {
        let head = format!(
            "{} alive at the dump ({}) come from {}",
            memsnap_model::plural(blocks as u64, "block", "blocks"),
            memsnap_model::format_bytes(bytes, 2),
            site::short_of(snap, line)
        );
        match why {
            detectors::state_only::WorkingSet::MadeInParts(parts) => format!(
                "{head}, yet the trace shows them all made in {parts} of its {} equal parts: they did not accumulate while the rest of the trace ran (a working set still held, such as the last request's cache), so they are not reported as a leak",
                thresholds.min_leak_occurrences
            ),
            detectors::state_only::WorkingSet::Level { at_dump, earlier, parts } => format!(
                "{head}, yet blocks of their sizes did not grow over the trace ({at_dump} alive at the dump, {earlier} at the low point of {} in its first half): what holds them is bounded (a pool, a queue with a maximum length, the latest output per module), so they are not reported as a leak",
                if *parts { "an equal part of the trace (no iteration was found)" } else { "an iteration" }
            ),
            detectors::state_only::WorkingSet::Filled { at_dump, level, iterations, parts } => format!(
                "{head}, yet blocks of their sizes stopped growing during the trace ({level} alive at the low point of each of its last {iterations} {}, {at_dump} at the dump): what holds them filled up and then kept its size (a cache at its capacity, replacing entries), so they are not reported as a leak",
                stretch_words(*parts)
            ),
            detectors::state_only::WorkingSet::Plateau { bytes, iterations, parts } => format!(
                "{head}, yet the blocks within their range of sizes stopped growing during the trace (at the low point of each of its last {iterations} {} at most {}, a level an earlier one's low point reached, and no more at the dump than one such block above it): what holds them is bounded by its bytes or its entries and replaces them (a cache of entries of varying sizes), so they are not reported as a leak",
                stretch_words(*parts),
                memsnap_model::format_bytes(*bytes, 2)
            ),
        }
    }));
    // Kept graphs read from the dump alone: the trace has no stack to place a backward, so a
    // pass's graph kept after its backward (a loss kept without `.item()`) and a pass that never
    // reached one (an evaluation run without `no_grad`, its loss kept) leave the same blocks.
    caveats.extend(suspects.iter().filter_map(|f| match (&f.facts, &f.site) {
        (evidence::Evidence::RetainedGraph { hold: evidence::GraphHold::SeenAtDump, .. }, Some(site)) => Some(format!(
            "the graphs kept from the model call at {} are read from the dump alone, which cannot tell whether their passes were training passes kept by a reference after their backward or passes run without `torch.no_grad()` that no backward went through (an evaluation: `no_grad_missing`); if that line evaluates, wrap it in `torch.no_grad()`",
            site.short()
        )),
        _ => None,
    }));
    if let Some((blocks, bytes)) = detectors::state_only::state_kv_cache(&cx) {
        caveats.push(format!(
            "{} alive at the dump ({}) hold transformers' KV cache (`cache_utils.py`): without a trace that says when they were made, one generation's cache cannot be told from caches kept across requests, so they are not read as a leak; record with a trace (`_record_memory_history(enabled=\"all\")`) to tell",
            memsnap_model::plural(blocks as u64, "block", "blocks"),
            memsnap_model::format_bytes(bytes, 2)
        ));
    }
    caveats.extend(detectors::reference_leak::input_growth(&cx).into_iter().map(|(line, input, passes)| {
        format!(
            "the tensor made at {} before each forward pass grew from {} to {} over the trace, and the passes it feeds grew with it ({} to {} allocated per pass): memory climbs because the shapes of the work grow (a length curriculum, growing images, decoding without a KV cache), not because a reference keeps tensors; whether the growth stops is up to the schedule, which the snapshot does not show",
            site::short_of(snap, line),
            memsnap_model::format_bytes(input[0], 2),
            memsnap_model::format_bytes(input[1], 2),
            memsnap_model::format_bytes(passes[0], 2),
            memsnap_model::format_bytes(passes[1], 2)
        )
    }));
    if !peak_known {
        caveats.push(
            "without allocations in the trace the peak cannot be established from this file (peaks are null in JSON); suspects rest on the dump-time state only"
                .to_string(),
        );
    } else if !d.start.trace_complete {
        caveats.push(format!(
            "the trace starts mid-run ({}): peaks are those within the trace, the process may have peaked earlier",
            snap.mid_run_cause()
        ));
    }
    let phase_summary = PhaseSummary {
        iterations: phases.iteration_count(),
        iteration_source: phases.iteration_source,
        iteration_site: phases.iteration_line.map(|f| Site::of(snap, f)),
        iteration_annotation: phases.iteration_annotation.clone(),
        iteration_starts: phases.boundaries.clone(),
        backward_passes: phases.backwards.len(),
        forward_passes: phases.forwards.len(),
        eval_windows: phases.eval_windows.clone(),
        optimizer_steps: phases.steps_shown(events),
        labels,
    };
    let cache = (!snap.profiler_converted()).then(|| {
        cache::allocator_cache(snap, dump.segments.iter().map(|&k| &snap.segments[k]), d, peak_known, thresholds)
    });
    DeviceAnalysis {
        device: d.device,
        peak_known,
        suspects,
        peak,
        end,
        phases: phase_summary,
        trace_phases: phases,
        gradient_sizes,
        caveats,
        peak_blocks,
        end_blocks,
        cache,
    }
}

/// The words for the stretches a working set was read over: iterations, or equal parts of a
/// trace in which no iteration was found (`detectors::state_only::WorkingSet`).
fn stretch_words(parts: bool) -> &'static str {
    if parts {
        "equal parts (no iteration was found)"
    } else {
        "iterations"
    }
}
