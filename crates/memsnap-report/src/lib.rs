//! Reports people attach to bug reports: one self-contained HTML page or one SVG image with the
//! verdict (suspects at the user's line), a timeline of allocated/reserved/active bytes, the
//! peak attributed by category and site, a live-memory flamegraph and the segment map at the
//! peak, and the caveats.
//!
//! Plain data in, strings out: [`build`] turns a snapshot with its replay and analysis into a
//! [`Report`], whose [`Report::html`] and [`Report::svg`] render the same content. Nothing here
//! touches files or the environment. Output is deterministic: the same input gives the same
//! bytes on every machine and thread count (colours come from a stable hash, ties are sorted,
//! and nothing records a time or a local path; only the snapshot's own frame paths and the
//! input's file name appear). Reports stay small on huge dumps: series are sampled to at most
//! a few thousand points, the segment map is capped, and at most 64 devices are drawn
//! ([`MAX_DRAWN_DEVICES`]).
//!
//! [`flame`] also serves `memsnap flamegraph`: folded stacks as text, or an SVG icicle chart.

mod drawn;
pub mod flame;
mod html;
pub mod interactive;
pub mod segmap;
mod svg;
pub mod text;
pub mod timeline;

use memsnap_analysis::SuspectKind;
use memsnap_analysis::{Analysis, Category, DeviceAnalysis, LiveBlock, MemoryGraph, Site, StackTable, Suspect};
use memsnap_model::{classify_filename, clip, Action, FrameKind, Snapshot};
use memsnap_replay::{DeviceReplay, Replay};
use rayon::prelude::*;

pub use drawn::{drawn_devices, Drawn, DrawnDevice, MAX_DRAWN_DEVICES};
pub use flame::{flamegraph_svg, folded_text, FlameOptions};

use crate::text::{fmt_bytes, fmt_count, fmt_seconds, pct};

/// What a report is made of. `file_name` is shown as given: pass the input's file name, not a
/// path of the machine that makes the report.
pub struct ReportInput<'a> {
    pub snapshot: &'a Snapshot,
    pub replay: &'a Replay,
    pub analysis: &'a Analysis,
    pub file_name: &'a str,
    /// Size of the file as stored, and of the pickle inside it.
    pub file_bytes: u64,
    pub pickle_bytes: u64,
    /// Caveats about the file itself (what it lacks), shown with the devices' own.
    pub file_caveats: &'a [String],
}

/// Size limits and layout.
#[derive(Clone, Debug)]
pub struct ReportOptions {
    /// Most points per timeline series (buckets keep their maximum).
    pub max_points: usize,
    /// Most segments drawn in the segment map (the largest; the rest are counted).
    pub max_segments: usize,
    /// Sites drawn as stacked areas in the timeline.
    pub top_sites: usize,
    /// Sites listed in the peak attribution table.
    pub table_sites: usize,
    /// Width of the figures in pixels.
    pub width: f64,
    /// What the timeline's x axis measures.
    pub x_axis: timeline::XAxis,
}

impl Default for ReportOptions {
    fn default() -> Self {
        ReportOptions {
            max_points: 2000,
            max_segments: 200,
            top_sites: 6,
            table_sites: 15,
            width: 1160.0,
            x_axis: timeline::XAxis::Events,
        }
    }
}

/// An SVG figure with its size.
#[derive(Clone, Debug)]
pub struct Figure {
    pub svg: String,
    pub width: f64,
    pub height: f64,
}

impl Figure {
    fn from_svg(svg: String, width: f64) -> Figure {
        let height = svg
            .split_once("height=\"")
            .and_then(|(_, rest)| rest.split_once('"'))
            .and_then(|(h, _)| h.parse::<f64>().ok())
            .unwrap_or(0.0);
        Figure { svg, width, height }
    }
}

/// A suspect as the report shows it.
#[derive(Clone, Debug)]
pub struct SuspectView {
    pub kind: String,
    /// `leak`, `peak` or `waste`.
    pub severity: String,
    /// Peak of allocated memory without this suspect's blocks.
    pub peak_without: Option<u64>,
    /// What growth is counted per (`iteration` or `pass`).
    pub growth_unit: String,
    pub confidence: f64,
    pub device: u32,
    pub bytes: u64,
    pub bytes_at_peak: u64,
    pub growth_bytes_per_iteration: Option<u64>,
    /// `file.py:12 (function)` with the path shortened, and the full path.
    pub site_short: Option<String>,
    pub site_full: Option<String>,
    /// Frames innermost first, and whether each is the user's own code.
    pub stack: Vec<(String, bool)>,
    pub evidence: String,
    pub advice: String,
    pub is_leak: bool,
}

impl SuspectView {
    fn of(s: &Suspect) -> SuspectView {
        SuspectView {
            kind: s.kind.name().to_string(),
            severity: s.severity.name().to_string(),
            peak_without: s.peak_without,
            growth_unit: s.growth_unit.name().to_string(),
            confidence: s.confidence,
            device: s.device,
            bytes: s.bytes,
            bytes_at_peak: s.bytes_at_peak,
            growth_bytes_per_iteration: s.growth_bytes_per_iteration,
            site_short: s.site.as_ref().map(|x| x.short()),
            site_full: s.site.as_ref().map(site_full),
            stack: s.stack.iter().map(|x| (site_full(x), classify_filename(&x.filename) == FrameKind::User)).collect(),
            evidence: s.evidence.clone(),
            advice: s.advice.clone(),
            is_leak: s.kind.is_leak() && s.severity == memsnap_analysis::Severity::Leak,
        }
    }
}

/// `/full/path/file.py:12 in function`, the names [`clip`]ped.
fn site_full(x: &Site) -> String {
    format!("{}:{} in {}", clip(&x.filename), x.line, clip(&x.function))
}

/// One row of the peak attribution by site.
#[derive(Clone, Debug)]
pub struct SiteRow {
    pub label: String,
    pub full: String,
    pub bytes: u64,
    pub blocks: u64,
}

/// Everything shown for one device.
#[derive(Clone, Debug)]
pub struct DeviceReport {
    pub device: u32,
    /// Key numbers: (label, value, hover detail).
    pub facts: Vec<(String, String, String)>,
    pub timeline: Option<Figure>,
    pub categories: Figure,
    pub peak_allocated: u64,
    pub sites: Vec<SiteRow>,
    /// Sites beyond the table: (count, bytes, blocks).
    pub sites_rest: Option<(usize, u64, u64)>,
    /// Allocated bytes at the peak by the labels the program put on its allocations: per label
    /// kind that any live block carries (`user_metadata`, `compile_context`), its values
    /// largest first, `None` for blocks without one.
    pub labels: Vec<LabelTable>,
    pub flamegraph: Figure,
    /// The segment map at the peak; also at the end when fragmentation is suspected, and at the
    /// last OOM when there was one.
    pub segments: Vec<Figure>,
    /// What the allocator caches beyond the live blocks, as `analyze` says it (empty for a
    /// profiler-converted file).
    pub cache: Vec<String>,
    pub caveats: Vec<String>,
}

/// One label kind's column of the peak: (kind, [(label or `None`, bytes)]).
pub type LabelTable = (&'static str, Vec<(Option<String>, u64)>);

/// A whole report, ready to render as HTML or SVG.
#[derive(Clone, Debug)]
pub struct Report {
    pub file_name: String,
    /// One line about the file: devices, events, producer.
    pub subtitle: String,
    pub suspects: Vec<SuspectView>,
    pub devices: Vec<DeviceReport>,
    pub file_caveats: Vec<String>,
    pub width: f64,
}

impl Report {
    /// A single self-contained HTML page (inline CSS and SVG, no scripts, no external resources).
    pub fn html(&self) -> String {
        html::render(self)
    }

    /// The same content as one SVG image.
    pub fn svg(&self) -> String {
        svg::render(self)
    }
}

/// Folded stacks of live blocks (`outer;…;inner`, bytes), sorted by path. User frames start with
/// `*` when `mark_user` is set (the SVG renderer colours them; plain folded output leaves it off).
pub fn live_folded(snap: &Snapshot, stacks: &StackTable, blocks: &[LiveBlock], mark_user: bool) -> Vec<(String, u64)> {
    MemoryGraph::build(snap, blocks).folded(snap, stacks, mark_user)
}

/// Build the report. Devices are built in parallel and kept in device order.
pub fn build(input: &ReportInput<'_>, opts: &ReportOptions) -> Report {
    let snap = input.snapshot;
    let analysis = input.analysis;
    let drawn = drawn_devices(analysis, input.replay);
    let devices: Vec<DeviceReport> =
        drawn.devices.par_iter().map(|&(da, d)| device_report(snap, analysis, da, d, opts)).collect();
    let events: usize = snap.traces.iter().map(|t| t.events.len()).sum();
    let subtitle = format!(
        "PyTorch CUDA memory snapshot · {} · {} device{} · {} trace events · {} pickle ({})",
        fmt_bytes(input.file_bytes),
        fmt_count(drawn.of as u64),
        if drawn.of == 1 { "" } else { "s" },
        fmt_count(events as u64),
        fmt_bytes(input.pickle_bytes),
        snap.source.producer.name()
    );
    // A device caveat that says what a file caveat already says (same topic before the colon)
    // is dropped when there is one device: the file-level wording carries the numbers.
    let mut devices = devices;
    if devices.len() == 1 {
        let topics: Vec<&str> = input.file_caveats.iter().filter_map(|c| c.split_once(':').map(|x| x.0)).collect();
        devices[0].caveats.retain(|c| !c.split_once(':').is_some_and(|(t, _)| topics.contains(&t)));
    }
    Report {
        file_name: input.file_name.to_string(),
        subtitle,
        suspects: analysis.suspects().into_iter().map(SuspectView::of).collect(),
        devices,
        file_caveats: input.file_caveats.iter().cloned().chain(drawn.caveat).collect(),
        width: opts.width,
    }
}

fn device_report(
    snap: &Snapshot,
    analysis: &Analysis,
    da: &DeviceAnalysis,
    d: &DeviceReplay,
    opts: &ReportOptions,
) -> DeviceReport {
    let stacks = &analysis.stacks;
    let events = snap.trace(d.device).map_or(&[][..], |t| &t.events[..]);
    let phases = &da.trace_phases;

    let timeline = timeline::sample(snap, stacks, phases, d, da, opts.max_points, opts.top_sites, opts.x_axis)
        .map(|t| Figure::from_svg(timeline::render(&t, opts.width as u32), opts.width));

    let peak = &da.peak;
    let (folded, hidden_native) = without_native_frames(live_folded(snap, stacks, &da.peak_blocks, true));
    let when = match peak.time_us.zip(events.first().filter(|e| e.has_time())) {
        Some((t, first)) => format!(
            "after event {} ({} into the trace)",
            fmt_count(peak.event_index.unwrap_or(0) as u64),
            fmt_seconds((t - first.time_us) as f64 / 1e6)
        ),
        None => match peak.event_index {
            Some(i) => format!("after event {}", fmt_count(i as u64)),
            None => "at the start of the trace".into(),
        },
    };
    let (flame_svg, _) = flame::render(
        &folded,
        &FlameOptions {
            width: opts.width,
            title: format!("Live memory at the peak by stack, device {}", d.device),
            subtitle: format!(
                "{} in {} {} {when}. Outermost frame on top; frameless backward allocations sit under the .backward() line that launched them.{}",
                fmt_bytes(peak.allocated),
                fmt_count(da.peak_blocks.len() as u64),
                memsnap_model::agree(da.peak_blocks.len() as u64, "block", "blocks"),
                if hidden_native { " C++ frames hidden (memsnap flamegraph --native shows them)." } else { "" }
            ),
            root_label: "all allocated memory at the peak".into(),
            ..FlameOptions::default()
        },
    );
    let flamegraph = Figure::from_svg(flame_svg, opts.width);

    let mut moments: Vec<(Option<usize>, String)> = vec![(d.peaks.allocated.event_index, "peak".into())];
    if let Some(i) = events
        .iter()
        .rposition(|e| e.action() == Action::Oom)
        .filter(|_| da.suspects.iter().any(|s| s.kind == SuspectKind::Oom))
    {
        moments.push((Some(i), format!("out-of-memory error (event {})", fmt_count(i as u64))));
    }
    if da.suspects.iter().any(|s| s.kind == SuspectKind::Fragmentation) && !events.is_empty() {
        moments.push((Some(events.len() - 1), "end of the trace (as dumped)".into()));
    }
    // A moment whose layout is the same as an earlier one's (an OOM right at the peak) is not
    // drawn twice.
    let mut maps: Vec<(memsnap_replay::MemoryMap, &str)> = Vec::new();
    for (at, when) in &moments {
        let map = d.state_after(*at);
        if !maps.iter().any(|(m, _)| m.segments == map.segments) {
            maps.push((map, when));
        }
    }
    let segments = maps
        .iter()
        .map(|(map, when)| {
            let seg =
                segmap::build(snap, stacks, phases, d, map, when, opts.max_segments, segmap::bar_width(opts.width));
            Figure::from_svg(segmap::render(&seg, opts.width), opts.width)
        })
        .collect();

    let categories = Figure::from_svg(categories_svg(da, opts.width), opts.width);
    let sites: Vec<SiteRow> = peak
        .by_site
        .iter()
        .take(opts.table_sites)
        .map(|s| SiteRow {
            label: s.label.clone(),
            full: s.site.as_ref().map_or_else(|| s.label.clone(), site_full),
            bytes: s.bytes,
            blocks: s.blocks,
        })
        .collect();
    let sites_rest = (peak.by_site.len() > opts.table_sites).then(|| {
        let rest = &peak.by_site[opts.table_sites..];
        (rest.len(), rest.iter().map(|s| s.bytes).sum(), rest.iter().map(|s| s.blocks).sum())
    });

    let mut caveats = da.caveats.clone();
    for diag in d.diagnostics.iter().take(3) {
        caveats.push(format!("replay diagnostic: {diag}"));
    }
    if d.diagnostic_count > 3 {
        caveats.push(format!("{} more replay diagnostics", d.diagnostic_count - 3));
    }

    DeviceReport {
        device: d.device,
        facts: facts(snap, da, d),
        timeline,
        categories,
        peak_allocated: peak.allocated,
        sites,
        sites_rest,
        labels: [("user_metadata", &peak.by_metadata), ("compile region", &peak.by_compile_region)]
            .into_iter()
            .filter(|(_, by)| !by.is_empty())
            .map(|(kind, by)| (kind, by.clone()))
            .collect(),
        flamegraph,
        segments,
        cache: da.cache.as_ref().map(memsnap_analysis::cache_words).unwrap_or_default(),
        caveats,
    }
}

/// Drop C++ frames from stacks that also have Python frames (`stacks="all"` interleaves
/// dozens of interpreter and dispatcher frames that bury the Python ones). Returns the merged
/// stacks, sorted, and whether anything was dropped.
pub fn without_native_frames(folded: Vec<(String, u64)>) -> (Vec<(String, u64)>, bool) {
    use flame::{classify, FrameClass};
    let mut dropped = false;
    let mut merged: std::collections::BTreeMap<String, u64> = std::collections::BTreeMap::new();
    for (path, bytes) in folded {
        let frames: Vec<&str> = path.split(';').collect();
        let kept: Vec<&str> = frames.iter().copied().filter(|f| classify(f) != FrameClass::Native).collect();
        let path = if kept.len() < frames.len()
            && kept.iter().any(|f| matches!(classify(f), FrameClass::User | FrameClass::Library))
        {
            dropped = true;
            kept.join(";")
        } else {
            path
        };
        *merged.entry(path).or_default() += bytes;
    }
    (merged.into_iter().collect(), dropped)
}

fn facts(snap: &Snapshot, da: &DeviceAnalysis, d: &DeviceReplay) -> Vec<(String, String, String)> {
    let events = snap.trace(d.device).map_or(&[][..], |t| &t.events[..]);
    let totals = d.series.after(d.event_count.checked_sub(1));
    let mut v = vec![
        (
            "peak allocated".to_string(),
            fmt_bytes(d.peaks.allocated.value),
            format!("{} bytes; torch.cuda.max_memory_allocated() over the trace", fmt_count(d.peaks.allocated.value)),
        ),
        (
            "peak reserved".to_string(),
            fmt_bytes(d.peaks.reserved.value),
            format!("{} bytes; torch.cuda.max_memory_reserved() over the trace", fmt_count(d.peaks.reserved.value)),
        ),
        (
            "allocated at dump".to_string(),
            fmt_bytes(totals.allocated),
            format!("{} bytes", fmt_count(totals.allocated)),
        ),
        ("reserved at dump".to_string(), fmt_bytes(totals.reserved), format!("{} bytes", fmt_count(totals.reserved))),
    ];
    let span = match (events.iter().find(|e| e.has_time()), events.iter().rev().find(|e| e.has_time())) {
        (Some(a), Some(b)) => format!(" in {}", fmt_seconds((b.time_us - a.time_us) as f64 / 1e6)),
        _ => String::new(),
    };
    v.push((
        "trace events".to_string(),
        format!("{}{span}", fmt_count(events.len() as u64)),
        "allocator events recorded by _record_memory_history".into(),
    ));
    let p = &da.phases;
    let how = match (&p.iteration_site, &p.iteration_annotation) {
        (Some(site), _) => format!("delimited by {:?} at {}", p.iteration_source, site.short()).to_lowercase(),
        (None, Some(n)) => format!("delimited by the annotation {:?}", clip(n)),
        _ => "no repeating iteration found".into(),
    };
    v.push(("iterations".to_string(), fmt_count(p.iterations as u64), how));
    v.push((
        "fwd · bwd · optim · eval".to_string(),
        format!("{} · {} · {} · {}", p.forward_passes, p.backward_passes, p.optimizer_steps, p.eval_windows.len()),
        "forward passes, backward passes, optimizer steps, evaluation windows".into(),
    ));
    v.push((
        "replay check".to_string(),
        if d.check.matches_snapshot {
            "matches the snapshot".to_string()
        } else {
            format!("{} differences", d.check.mismatch_count)
        },
        "the replayed layout after the last event compared with the dump's segment table, block by block".into(),
    ));
    v
}

/// Category colours, in [`Category::ALL`] order, then cached free.
const CATEGORY_COLORS: [&str; 7] = ["#8c96a8", "#e07a5f", "#f2cc8f", "#3d85c6", "#81b29a", "#b48ead", "#f1f1f1"];

pub fn category_title(c: Category) -> &'static str {
    match c {
        Category::PreTrace => "allocated before the trace",
        Category::Gradients => "gradients",
        Category::OptimizerState => "optimizer state",
        Category::Activations => "activations",
        Category::Temporaries => "temporaries",
        Category::Other => "other long-lived",
    }
}

/// Reserved memory at the peak as one stacked bar: each category of allocated memory, then
/// cached free (reserved but not allocated).
fn categories_svg(da: &DeviceAnalysis, width: f64) -> String {
    use std::fmt::Write as _;
    use text::{escape, num, text_width};
    let m = &da.peak;
    let mut parts: Vec<(String, u64, &str)> = Vec::new();
    for (j, (c, b)) in m.by_category.iter().enumerate() {
        if *b > 0 {
            parts.push((category_title(*c).to_string(), *b, CATEGORY_COLORS[j.min(5)]));
        }
    }
    parts.push(("cached free (reserved, not allocated)".into(), m.cached_free, CATEGORY_COLORS[6]));
    let total: u64 = parts.iter().map(|p| p.1).sum::<u64>().max(1);
    let bar_w = width - 20.0;
    // Legend rows: swatch, name, bytes, percent.
    let mut rows: Vec<Vec<(f64, usize)>> = vec![Vec::new()];
    let mut x = 0.0;
    let labels: Vec<String> =
        parts.iter().map(|(n, b, _)| format!("{n}: {} ({}%)", fmt_bytes(*b), pct(*b, m.reserved.max(1)))).collect();
    for (j, l) in labels.iter().enumerate() {
        let w = 19.0 + text_width(l, 12.0) + 22.0;
        if x + w > bar_w && !rows.last().unwrap().is_empty() {
            rows.push(Vec::new());
            x = 0.0;
        }
        rows.last_mut().unwrap().push((x, j));
        x += w;
    }
    let h = 44.0 + 30.0 + 20.0 * rows.len() as f64 + 4.0;
    let mut s = String::new();
    text::open_figure(&mut s, width, h, "categories");
    let _ = writeln!(
        s,
        r##"<text x="10" y="18" font-size="15" font-weight="600" fill="#1a1a1a">What the peak is made of, device {}</text>"##,
        da.device
    );
    let _ = writeln!(
        s,
        r##"<text x="10" y="35" font-size="12" fill="#555555">{} reserved at the peak: {} allocated + {} cached free</text>"##,
        fmt_bytes(m.reserved),
        fmt_bytes(m.allocated),
        fmt_bytes(m.cached_free)
    );
    let mut bx = 10.0;
    for (j, (name, b, c)) in parts.iter().enumerate() {
        let w = bar_w * *b as f64 / total as f64;
        let _ = writeln!(
            s,
            r##"<rect x="{}" y="44" width="{}" height="24" fill="{c}" stroke="#ffffff" stroke-width="1"><title>{}</title></rect>"##,
            num(bx),
            num(w),
            escape(&format!(
                "{name}\n{} ({} bytes), {}% of reserved",
                fmt_bytes(*b),
                fmt_count(*b),
                pct(*b, m.reserved.max(1))
            ))
        );
        let short = text::fit(&labels[j], w - 8.0, 11.0);
        if w > 60.0 && !short.is_empty() {
            let dark = matches!(*c, "#3d85c6" | "#8c96a8" | "#e07a5f" | "#b48ead");
            let _ = writeln!(
                s,
                r##"<text x="{}" y="60" font-size="11" fill="{}">{}</text>"##,
                num(bx + 4.0),
                if dark { "#ffffff" } else { "#1a1a1a" },
                escape(&short)
            );
        }
        bx += w;
    }
    let _ = writeln!(
        s,
        r##"<rect x="10" y="44" width="{}" height="24" fill="none" stroke="#9a9a9a" stroke-width="0.6"/>"##,
        num(bar_w)
    );
    let mut y = 78.0;
    for row in rows {
        for (x, j) in row {
            let _ = writeln!(
                s,
                r##"<rect x="{}" y="{}" width="14" height="11" fill="{}" stroke="#999999" stroke-width="0.5"/><text x="{}" y="{}" font-size="12" fill="#222222">{}</text>"##,
                num(10.0 + x),
                num(y + 2.0),
                parts[j].2,
                num(29.0 + x),
                num(y + 12.0),
                escape(&labels[j])
            );
        }
        y += 20.0;
    }
    s.push_str("</svg>\n");
    s
}
