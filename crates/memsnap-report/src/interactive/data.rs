//! The model the page's script reads: per device the counter pyramid, the detailed windows, the
//! phases, the blocks and segments with their lifetimes; for the page the suspects (in the
//! verdict's order), and one table of stacks, frames and strings shared by every device.
//!
//! Tables are columns of integers (one array per field), which the browser parses quickly and
//! which keep the blob small. Byte counts of a device are in units of its `quantum`, the
//! greatest common divisor of every byte count the device embeds (512 on real files, whose
//! blocks are multiples of 512 bytes), so they stay exact and short. Offsets of blocks are from
//! the start of their segment, addresses and streams are hex strings: JavaScript numbers are
//! exact only up to 2^53.

use std::collections::{BTreeMap, BTreeSet};

use memsnap_analysis::{
    attr_label, attribute, categorize, label_runs, Attr, Category, DeviceAnalysis, Phases, Site, StackTable, Suspect,
};
use memsnap_model::{classify_filename, clip, FrameId, FrameKind, Snapshot, StackId, StrId};
use memsnap_replay::DeviceReplay;
use rayon::prelude::*;
use serde::Serialize;

use super::{blocks, detail, pyramid, share};
use super::{
    MAX_BLOCKS, MAX_OOMS, MAX_PHASE_LABELS, MAX_SEGMENTS, MAX_SPANS, MAX_STACKS, MAX_STACK_FRAMES, PYRAMID_BUCKETS,
    RAW_EVENTS, TOP_BUCKETS, WINDOW_EVENTS,
};
use crate::ReportInput;

/// Bumped when the blob's layout changes (the script checks it).
pub const FORMAT: u32 = 1;

/// Everything the script reads.
#[derive(Clone, Debug, Serialize)]
pub struct PageData {
    pub format: u32,
    pub file: String,
    pub budgets: Budgets,
    /// Category names and colours, in [`Category::ALL`] order.
    pub categories: Vec<CategoryData>,
    pub strings: Vec<String>,
    /// `[filename, line, name, kind]`: string indices, the line, and 0 for the user's code, 1
    /// for a library, 2 for C++.
    pub frames: Vec<[u32; 4]>,
    /// Frame indices, innermost first; a last negative entry `-k` says `k` more frames were
    /// left out ([`MAX_STACK_FRAMES`]).
    pub stacks: Vec<Vec<i64>>,
    /// Distinct stacks the embedded blocks and events have; more than `stacks.len()` when
    /// [`MAX_STACKS`] cut some (their references are -1).
    pub stacks_total: usize,
    /// In the verdict's order.
    pub suspects: Vec<SuspectData>,
    pub devices: Vec<DeviceData>,
}

/// The limits the page was made with, to say what was left out.
#[derive(Clone, Debug, Serialize)]
pub struct Budgets {
    pub pyramid_buckets: usize,
    pub raw_events: usize,
    pub window_events: usize,
    pub blocks: usize,
    pub stacks: usize,
    pub stack_frames: usize,
    pub segments: usize,
}

#[derive(Clone, Debug, Serialize)]
pub struct CategoryData {
    pub name: &'static str,
    pub color: &'static str,
}

#[derive(Clone, Debug, Serialize)]
pub struct SuspectData {
    pub device: u32,
    pub kind: &'static str,
    pub severity: &'static str,
    /// `file.py:12 (function)`.
    pub site: Option<String>,
    pub evidence: String,
    pub advice: String,
    /// Embedded blocks (indices into the device's blocks) the suspect is about.
    pub blocks: Vec<u32>,
    /// Blocks and bytes it is about, embedded or not.
    pub blocks_matched: usize,
    pub bytes_matched: u64,
    /// The out-of-memory event, for an OOM.
    pub event: Option<u32>,
    /// The moment to show it at: its OOM, the peak for peak problems, else the end.
    pub moment: Option<u32>,
}

#[derive(Clone, Debug, Serialize)]
pub struct DeviceData {
    pub device: u32,
    pub events: usize,
    pub quantum: u64,
    /// `time_us` of the first timed event (times of events are differences from it).
    pub t0: Option<i64>,
    pub peak: PeakData,
    /// Coarsest first.
    pub levels: Vec<LevelData>,
    pub windows: Vec<WindowData>,
    /// Windows of [`WINDOW_EVENTS`] the trace has.
    pub windows_total: usize,
    /// Hex, sorted; streams of segments and events are indices into it.
    pub streams: Vec<String>,
    pub phases: PhaseData,
    pub ooms: Vec<u32>,
    pub ooms_total: usize,
    pub pools: Vec<String>,
    pub segments: SegmentColumns,
    pub segments_total: usize,
    pub blocks: BlockColumns,
    pub blocks_total: usize,
    /// The size of the largest block left out (0 when none is).
    pub blocks_omitted_largest: u64,
    /// `[label, full]` of each site embedded blocks are attributed to.
    pub sites: Vec<[String; 2]>,
}

#[derive(Clone, Debug, Serialize)]
pub struct PeakData {
    pub allocated_event: Option<usize>,
    /// Bytes (not quantised).
    pub allocated: u64,
    pub reserved_event: Option<usize>,
    pub reserved: u64,
}

/// One pyramid level, values in quanta.
#[derive(Clone, Debug, Serialize)]
pub struct LevelData {
    pub bucket: usize,
    pub amin: Vec<u64>,
    pub amax: Vec<u64>,
    pub rmax: Vec<u64>,
    pub xmax: Vec<u64>,
}

/// One detailed window: byte columns in quanta, `stack` indices into the page's stacks.
#[derive(Clone, Debug, Serialize)]
pub struct WindowData {
    pub first: usize,
    /// Allocated, reserved, active before the first event.
    pub start: [u64; 3],
    pub act: String,
    pub da: Vec<i64>,
    pub dr: Vec<i64>,
    pub dx: Vec<i64>,
    /// Bytes, not quantised (requests are not multiples of anything).
    pub size: Vec<u64>,
    pub stream: Vec<u32>,
    pub stack: Vec<i64>,
    pub dt: Vec<Option<i64>>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct PhaseData {
    pub iterations: Vec<u32>,
    /// How iterations were found, in words.
    pub iterations_by: String,
    /// `[start, end)` event spans.
    pub backward: Vec<[u32; 2]>,
    pub forward: Vec<[u32; 2]>,
    pub optimizer: Vec<[u32; 2]>,
    pub eval: Vec<[u32; 2]>,
    /// `[kind, name, first event, last event]` (inclusive).
    pub labels: Vec<(String, String, u32, u32)>,
    pub labels_total: usize,
    /// External annotations (`record_function` ranges): `[name, first event, last event]`.
    pub annotations: Vec<(String, u32, u32)>,
    /// Spans left out of each list past [`MAX_SPANS`].
    pub spans_omitted: usize,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct SegmentColumns {
    pub addr: Vec<String>,
    pub size: Vec<u64>,
    pub stream: Vec<u32>,
    pub pool: Vec<u32>,
    pub expandable: Vec<u8>,
    pub created: Vec<Option<u32>>,
    pub released: Vec<Option<u32>>,
}

/// Blocks sorted by allocation event (blocks from before the trace first).
#[derive(Clone, Debug, Default, Serialize)]
pub struct BlockColumns {
    /// Segment index (-1: in no embedded segment) and offset from its start, in quanta.
    pub seg: Vec<i64>,
    pub off: Vec<u64>,
    pub size: Vec<u64>,
    /// Bytes of the block the program did not ask for (size − requested), not quantised.
    pub pad: Vec<u64>,
    /// Allocation event as the difference from the previous block's (-1 before the trace; the
    /// first block's from -1).
    pub a: Vec<i64>,
    /// Free request and completed free as differences from the allocation event (`null`: not
    /// freed in the trace).
    pub f: Vec<Option<i64>>,
    pub c: Vec<Option<i64>>,
    /// Blocks freed before the trace but pending at its start.
    pub pending: Vec<u32>,
    /// The stack the block hangs from (the launching stack for frameless backward blocks).
    pub stack: Vec<i64>,
    /// 0 the user's line, 1 library code, 2 a backward pass, 3 before the trace, 4 no frames.
    pub who: Vec<u8>,
    pub site: Vec<u32>,
    /// Index in [`Category::ALL`].
    pub cat: Vec<u8>,
}

/// What a suspect gives its device's builder.
struct SuspectIn<'a> {
    rank: usize,
    suspect: &'a Suspect,
}

/// What the page embeds beyond its defaults.
#[derive(Clone, Debug, Default)]
pub struct Detail {
    /// (device, event): embed the iteration holding the event one event at a time, first.
    pub focus: Vec<(u32, usize)>,
}

/// Build the page's model.
pub fn build(input: &ReportInput<'_>, detail: &Detail) -> PageData {
    let snap = input.snapshot;
    let analysis = input.analysis;
    let annotations = snap.annotations_by_device();
    let ranked = analysis.suspects();
    // The devices the report draws (the page wraps the report's device sections).
    let devices = crate::drawn_devices(analysis, input.replay).devices;
    let all_events: usize = devices.iter().map(|(_, d)| d.event_count).sum();
    let all_blocks: usize = devices.iter().map(|(_, d)| d.blocks.len()).sum();
    let built: Vec<(DeviceData, Vec<(usize, SuspectData)>)> = devices
        .par_iter()
        .map(|(da, d)| {
            let suspects: Vec<SuspectIn> = ranked
                .iter()
                .enumerate()
                .filter(|(_, s)| s.device == d.device)
                .map(|(rank, s)| SuspectIn { rank, suspect: s })
                .collect();
            let budgets = DeviceBudgets {
                pyramid: share(PYRAMID_BUCKETS, d.event_count, all_events),
                raw: share(RAW_EVENTS, d.event_count, all_events),
                blocks: share(MAX_BLOCKS, d.blocks.len(), all_blocks),
                focus: detail.focus.iter().filter(|f| f.0 == d.device).map(|f| f.1).collect(),
            };
            let annotations = annotations.get(&d.device).map_or(&[][..], |a| &a[..]);
            device(snap, &analysis.stacks, da, d, annotations, &suspects, &budgets)
        })
        .collect();
    let mut suspects: Vec<(usize, SuspectData)> = built.iter().flat_map(|(_, s)| s.iter().cloned()).collect();
    suspects.sort_by_key(|(rank, _)| *rank);
    let mut devices: Vec<DeviceData> = built.into_iter().map(|(d, _)| d).collect();
    let StackTables { strings, frames, stacks, total: stacks_total } = stack_table(snap, &mut devices);
    PageData {
        format: FORMAT,
        file: clip(input.file_name).into_owned(),
        budgets: Budgets {
            pyramid_buckets: PYRAMID_BUCKETS,
            raw_events: RAW_EVENTS,
            window_events: WINDOW_EVENTS,
            blocks: MAX_BLOCKS,
            stacks: MAX_STACKS,
            stack_frames: MAX_STACK_FRAMES,
            segments: MAX_SEGMENTS,
        },
        categories: Category::ALL
            .iter()
            .enumerate()
            .map(|(j, c)| CategoryData { name: crate::category_title(*c), color: crate::CATEGORY_COLORS[j.min(5)] })
            .collect(),
        strings,
        frames,
        stacks,
        stacks_total,
        suspects: suspects.into_iter().map(|(_, s)| s).collect(),
        devices,
    }
}

struct DeviceBudgets {
    pyramid: usize,
    raw: usize,
    blocks: usize,
    focus: Vec<usize>,
}

fn device(
    snap: &Snapshot,
    stacks: &StackTable,
    da: &DeviceAnalysis,
    d: &DeviceReplay,
    annotations: &[memsnap_model::Annotation],
    suspects: &[SuspectIn<'_>],
    budgets: &DeviceBudgets,
) -> (DeviceData, Vec<(usize, SuspectData)>) {
    let events = snap.trace(d.device).map_or(&[][..], |t| &t.events[..]);
    let n = events.len().min(d.series.len());
    let phases = &da.trace_phases;
    let levels = pyramid::build(&d.series, n, TOP_BUCKETS, budgets.pyramid);
    let t0 = events[..n].iter().find(|e| e.has_time()).map(|e| e.time_us);
    let chosen = if n == 0 {
        Vec::new()
    } else {
        detail::choose(d, events, &phases.boundaries, n, WINDOW_EVENTS, budgets.raw, &budgets.focus)
    };
    let windows: Vec<detail::Window> =
        chosen.par_iter().map(|&w| detail::window(snap, &d.series, events, n, w, WINDOW_EVENTS, t0)).collect();
    let ranges: Vec<(usize, usize)> = windows.iter().map(|w| (w.first, w.first + w.actions.len())).collect();
    // With every event embedded, finer levels would repeat the windows: the script draws any view
    // narrower than the coarsest level's buckets from the events themselves.
    let mut levels = levels;
    if windows.len() == n.div_ceil(WINDOW_EVENTS) {
        levels.truncate(1);
    }

    // Suspects' blocks first, then the rest of the budget.
    let matched: Vec<Vec<usize>> =
        suspects.iter().map(|s| blocks::suspect_blocks(snap, stacks, phases, events, d, s.suspect)).collect();
    let first: Vec<usize> = matched.iter().flatten().copied().collect::<BTreeSet<usize>>().into_iter().collect();
    let mut kept = blocks::select(d, &first, &ranges, budgets.blocks);
    kept.sort_by_key(|&i| (d.blocks[i].alloc_event().map_or(-1, |a| a as i64), i));
    let mut embedded = vec![u32::MAX; d.blocks.len()];
    for (j, &i) in kept.iter().enumerate() {
        embedded[i] = j as u32;
    }
    let omitted_largest: u64 =
        d.blocks.iter().enumerate().filter(|(i, _)| embedded[*i] == u32::MAX).map(|(_, b)| b.size).max().unwrap_or(0);

    // Segments, streams, pools.
    let seg_kept = blocks::select_segments(d, MAX_SEGMENTS);
    let seg_refs: Vec<&memsnap_replay::SegmentLifetime> = seg_kept.iter().map(|&i| &d.segments[i]).collect();
    let mut streams: BTreeSet<u64> = seg_refs.iter().map(|s| s.stream).collect();
    for w in &windows {
        streams.extend(w.stream.iter().copied());
    }
    let streams: Vec<u64> = streams.into_iter().collect();
    let stream_index = |s: u64| streams.binary_search(&s).unwrap_or(0) as u32;
    let pool_names: Vec<String> = seg_refs.iter().map(|s| pool(s)).collect::<BTreeSet<String>>().into_iter().collect();

    // Blocks: attribution, category, site, segment.
    let per: Vec<(Attr, StackId, Category, Option<usize>)> = kept
        .par_iter()
        .map(|&i| {
            let b = &d.blocks[i];
            let (attr, stack) = attribute(events, phases, stacks, b);
            let cat = categorize(events, phases, stacks, &da.gradient_sizes, b, attr);
            (attr, stack, cat, blocks::segment_of(&seg_refs, b))
        })
        .collect();
    let attrs: BTreeSet<Attr> = per.iter().map(|p| p.0).collect();
    let mut sites: Vec<(String, Attr, String)> = attrs
        .into_iter()
        .map(|a| {
            let full = match a {
                Attr::Site(f) | Attr::Backward(Some(f)) => crate::site_full(&Site::of(snap, f)),
                _ => String::new(),
            };
            (clip(&attr_label(snap, a)).into_owned(), a, full)
        })
        .collect();
    sites.sort();
    let site_index: BTreeMap<Attr, u32> = sites.iter().enumerate().map(|(j, s)| (s.1, j as u32)).collect();

    let mut cols = BlockColumns::default();
    let mut prev_a: i64 = -1;
    for (j, &i) in kept.iter().enumerate() {
        let b = &d.blocks[i];
        let (attr, stack, cat, seg) = per[j];
        let a = b.alloc_event().map_or(-1, |a| a as i64);
        cols.seg.push(seg.map_or(-1, |s| s as i64));
        cols.off.push(seg.map_or(0, |s| b.address - seg_refs[s].address));
        cols.size.push(b.size);
        cols.pad.push(b.size.saturating_sub(b.requested_size));
        cols.a.push(a - prev_a);
        prev_a = a;
        cols.f.push(b.free_requested_event().map(|e| e as i64 - a));
        cols.c.push(b.free_completed_event().map(|e| e as i64 - a));
        if b.pending_at_start() {
            cols.pending.push(j as u32);
        }
        cols.stack.push(stack.0 as i64);
        cols.who.push(match attr {
            Attr::Site(_) => 0,
            Attr::Library => 1,
            Attr::Backward(_) => 2,
            Attr::PreTrace => 3,
            Attr::NoFrames => 4,
        });
        cols.site.push(site_index[&attr]);
        cols.cat.push(Category::ALL.iter().position(|c| *c == cat).unwrap_or(0) as u8);
    }

    let mut segs = SegmentColumns::default();
    for s in &seg_refs {
        segs.addr.push(format!("{:x}", s.address));
        segs.size.push(s.size);
        segs.stream.push(stream_index(s.stream));
        segs.pool.push(pool_names.binary_search(&pool(s)).unwrap_or(0) as u32);
        segs.expandable.push(s.is_expandable as u8);
        segs.created.push(s.created_event);
        segs.released.push(s.released_event);
    }

    // One quantum for every byte count that is quantised.
    let mut q = 0u64;
    for l in &levels {
        l.values().for_each(|v| q = gcd(q, v));
    }
    for w in &windows {
        w.start.iter().for_each(|&v| q = gcd(q, v));
        for v in w.allocated.iter().chain(&w.reserved).chain(&w.active) {
            q = gcd(q, v.unsigned_abs());
        }
    }
    cols.size.iter().chain(&cols.off).chain(&segs.size).for_each(|&v| q = gcd(q, v));
    let q = q.max(1);
    let qi = q as i64;
    for v in cols.size.iter_mut().chain(cols.off.iter_mut()) {
        *v /= q;
    }
    let quantise = |v: &[u64]| v.iter().map(|x| x / q).collect::<Vec<u64>>();

    let wins: Vec<WindowData> = windows
        .iter()
        .map(|w| WindowData {
            first: w.first,
            start: w.start.map(|v| v / q),
            act: w.actions.clone(),
            da: w.allocated.iter().map(|v| v / qi).collect(),
            dr: w.reserved.iter().map(|v| v / qi).collect(),
            dx: w.active.iter().map(|v| v / qi).collect(),
            size: w.size.clone(),
            stream: w.stream.iter().map(|&s| stream_index(s)).collect(),
            stack: w.stack.iter().map(|s| s.0 as i64).collect(),
            dt: if t0.is_some() { w.time.clone() } else { Vec::new() },
        })
        .collect();

    let sus: Vec<(usize, SuspectData)> = suspects
        .iter()
        .zip(&matched)
        .map(|(s, m)| {
            let sp = s.suspect;
            let event = match &sp.facts {
                memsnap_analysis::Evidence::Oom { event, .. } => Some(*event),
                _ => None,
            };
            let moment = event.or(match sp.severity {
                memsnap_analysis::Severity::Peak => d.peaks.allocated.event_index.map(|i| i as u32),
                _ => n.checked_sub(1).map(|i| i as u32),
            });
            let mut idx: Vec<u32> = m.iter().map(|&i| embedded[i]).filter(|&j| j != u32::MAX).collect();
            idx.sort_unstable();
            (
                s.rank,
                SuspectData {
                    device: d.device,
                    kind: sp.kind.name(),
                    severity: sp.severity.name(),
                    site: sp.site.as_ref().map(|x| clip(&x.short()).into_owned()),
                    evidence: sp.evidence.clone(),
                    advice: sp.advice.clone(),
                    blocks: idx,
                    blocks_matched: m.len(),
                    bytes_matched: m.iter().map(|&i| d.blocks[i].size).sum(),
                    event,
                    moment,
                },
            )
        })
        .collect();

    let ooms: Vec<u32> = events[..n]
        .iter()
        .enumerate()
        .filter(|(_, e)| e.action() == memsnap_model::Action::Oom)
        .map(|(i, _)| i as u32)
        .collect();

    let data = DeviceData {
        device: d.device,
        events: n,
        quantum: q,
        t0,
        peak: PeakData {
            allocated_event: d.peaks.allocated.event_index,
            allocated: d.peaks.allocated.value,
            reserved_event: d.peaks.reserved.event_index,
            reserved: d.peaks.reserved.value,
        },
        levels: levels
            .iter()
            .map(|l| LevelData {
                bucket: l.bucket,
                amin: quantise(&l.allocated_min),
                amax: quantise(&l.allocated_max),
                rmax: quantise(&l.reserved_max),
                xmax: quantise(&l.active_max),
            })
            .collect(),
        windows: wins,
        windows_total: n.div_ceil(WINDOW_EVENTS),
        streams: streams.iter().map(|s| format!("{s:x}")).collect(),
        phases: phase_data(snap, da, phases, events, n, annotations),
        ooms_total: ooms.len(),
        ooms: ooms.into_iter().take(MAX_OOMS).collect(),
        pools: pool_names,
        segments: segs,
        segments_total: d.segments.len(),
        blocks: cols,
        blocks_total: d.blocks.len(),
        blocks_omitted_largest: omitted_largest,
        sites: sites.into_iter().map(|(label, _, full)| [label, full]).collect(),
    };
    (data, sus)
}

fn gcd(a: u64, b: u64) -> u64 {
    let (mut a, mut b) = (a, b);
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// A segment's pool as the segment map names it.
fn pool(s: &memsnap_replay::SegmentLifetime) -> String {
    crate::segmap::pool_name(s.segment_type, s.pool_id, s.is_expandable)
}

fn phase_data(
    snap: &Snapshot,
    da: &DeviceAnalysis,
    phases: &Phases,
    events: &[memsnap_model::TraceEvent],
    n: usize,
    annotations: &[memsnap_model::Annotation],
) -> PhaseData {
    let mut omitted = 0;
    let mut spans = |v: &mut dyn Iterator<Item = [u32; 2]>| {
        let all: Vec<[u32; 2]> = v.collect();
        omitted += all.len().saturating_sub(MAX_SPANS);
        all.into_iter().take(MAX_SPANS).collect::<Vec<_>>()
    };
    let p = &da.phases;
    let iterations_by = match (&p.iteration_site, &p.iteration_annotation) {
        (Some(site), _) => format!("delimited by {:?} at {}", p.iteration_source, site.short()).to_lowercase(),
        (None, Some(a)) => format!("delimited by the annotation {:?}", clip(a)),
        _ => "no repeating iteration found".into(),
    };
    let backward = spans(&mut phases.backwards.iter().map(|b| [b.span.start, b.span.end]));
    let forward = spans(&mut phases.forwards.iter().map(|f| [f.span.start, f.span.end]));
    let optimizer = spans(&mut phases.optimizer_steps.iter().map(|s| [s.start, s.end]));
    let eval = spans(&mut phases.eval_windows.iter().map(|s| [s.start, s.end]));
    let iterations: Vec<u32> = phases.boundaries.iter().copied().filter(|&b| (b as usize) < n).collect();
    omitted += iterations.len().saturating_sub(MAX_SPANS);
    let runs = label_runs(snap, &events[..n]);
    PhaseData {
        iterations: iterations.into_iter().take(MAX_SPANS).collect(),
        iterations_by,
        backward,
        forward,
        optimizer,
        eval,
        labels_total: runs.len(),
        labels: runs
            .into_iter()
            .take(MAX_PHASE_LABELS)
            .map(|r| (r.kind.name().to_string(), clip(&r.name).into_owned(), r.first_event, r.last_event))
            .collect(),
        annotations: annotation_spans(events, n, annotations),
        spans_omitted: omitted,
    }
}

/// External annotations (START/END pairs by name, by time) as event ranges: from the first
/// event at or after the start to the last event at or before the end. Needs times that never
/// go back; an unmatched START runs to the end of the trace.
fn annotation_spans(
    events: &[memsnap_model::TraceEvent],
    n: usize,
    annotations: &[memsnap_model::Annotation],
) -> Vec<(String, u32, u32)> {
    let events = &events[..n];
    if n == 0
        || annotations.is_empty()
        || !events.iter().all(|e| e.has_time())
        || !events.windows(2).all(|w| w[0].time_us <= w[1].time_us)
    {
        return Vec::new();
    }
    let mut sorted: Vec<&memsnap_model::Annotation> = annotations.iter().collect();
    sorted.sort_by(|a, b| a.time_us.cmp(&b.time_us).then(b.start.cmp(&a.start)).then(a.name.cmp(&b.name)));
    let mut open: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
    let mut out: Vec<(String, u32, u32)> = Vec::new();
    let first_at = |t: i64| events.partition_point(|e| e.time_us < t).min(n - 1) as u32;
    let last_at = |t: i64| events.partition_point(|e| e.time_us <= t).saturating_sub(1) as u32;
    for a in sorted {
        if a.start {
            open.entry(a.name.as_str()).or_default().push(a.time_us);
        } else if let Some(t) = open.get_mut(a.name.as_str()).and_then(|v| v.pop()) {
            let (lo, hi) = (first_at(t), last_at(a.time_us));
            if lo <= hi {
                out.push((clip(&a.name).into_owned(), lo, hi));
            }
        }
    }
    for (name, starts) in open {
        for t in starts {
            out.push((clip(name).into_owned(), first_at(t), n as u32 - 1));
        }
    }
    out.sort_by(|a, b| a.1.cmp(&b.1).then(a.2.cmp(&b.2)).then(a.0.cmp(&b.0)));
    out.truncate(MAX_PHASE_LABELS);
    out
}

/// The page's stack table: the stacks the devices' blocks and windows name (raw [`StackId`]s in
/// their `stack` columns, rewritten here to indices into the table, -1 past [`MAX_STACKS`]),
/// their frames and the frames' strings, each table in id order.
fn stack_table(snap: &Snapshot, devices: &mut [DeviceData]) -> StackTables {
    let mut uses: BTreeMap<u32, u64> = BTreeMap::new();
    for d in devices.iter() {
        for &s in d.blocks.stack.iter().chain(d.windows.iter().flat_map(|w| w.stack.iter())) {
            *uses.entry(s as u32).or_default() += 1;
        }
    }
    let total = uses.len();
    let mut ids: Vec<(u32, u64)> = uses.into_iter().collect();
    if ids.len() > MAX_STACKS {
        // The most used stacks, then in id order.
        ids.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        ids.truncate(MAX_STACKS);
        ids.sort_by_key(|x| x.0);
    }
    let ids: Vec<u32> = ids.into_iter().map(|x| x.0).collect();
    let remap = |s: &mut i64| *s = ids.binary_search(&(*s as u32)).map_or(-1, |j| j as i64);
    for d in devices.iter_mut() {
        d.blocks.stack.iter_mut().for_each(remap);
        for w in &mut d.windows {
            w.stack.iter_mut().for_each(remap);
        }
    }
    let valid = |id: u32| (id as usize) < snap.stacks.len();
    let frame_ids: Vec<FrameId> = ids
        .iter()
        .filter(|&&id| valid(id))
        .flat_map(|&id| snap.stack(StackId(id)).frames.iter().take(MAX_STACK_FRAMES).copied())
        .collect::<BTreeSet<FrameId>>()
        .into_iter()
        .collect();
    let str_ids: Vec<StrId> = frame_ids
        .iter()
        .flat_map(|&f| [snap.frame(f).filename, snap.frame(f).name])
        .collect::<BTreeSet<StrId>>()
        .into_iter()
        .collect();
    let str_index = |s: StrId| str_ids.binary_search(&s).unwrap_or(0) as u32;
    let frames: Vec<[u32; 4]> = frame_ids
        .iter()
        .map(|&f| {
            let fr = snap.frame(f);
            let kind = match classify_filename(snap.str(fr.filename)) {
                FrameKind::User => 0,
                FrameKind::Library => 1,
                FrameKind::Native => 2,
            };
            [str_index(fr.filename), fr.line, str_index(fr.name), kind]
        })
        .collect();
    let stacks: Vec<Vec<i64>> = ids
        .iter()
        .map(|&id| {
            if !valid(id) {
                return Vec::new();
            }
            let all = &snap.stack(StackId(id)).frames;
            let mut v: Vec<i64> = all
                .iter()
                .take(MAX_STACK_FRAMES)
                .map(|f| frame_ids.binary_search(f).map_or(-1, |j| j as i64))
                .collect();
            if all.len() > MAX_STACK_FRAMES {
                v.push(-((all.len() - MAX_STACK_FRAMES) as i64));
            }
            v
        })
        .collect();
    let strings = str_ids.iter().map(|&s| clip(snap.str(s)).into_owned()).collect();
    StackTables { strings, frames, stacks, total }
}

/// [`PageData`]'s `strings`, `frames`, `stacks` and `stacks_total`.
struct StackTables {
    strings: Vec<String>,
    frames: Vec<[u32; 4]>,
    stacks: Vec<Vec<i64>>,
    total: usize,
}
