//! `memsnap analyze FILE [--json]`: replay the trace exactly, then name the suspects. Text output
//! puts the verdict first, then peak attribution by site and category, then caveats.

use std::fmt::Write as _;

use memsnap_analysis::Moment;
use memsnap_model::{agree, clip, printable, shown};
use serde_json::{json, Value};

use crate::emit::{emit, shown_path};
use crate::exit::Exit;
use crate::json::{site_json, suspect_json};
use crate::pipeline::{analyze_file, file_name, Analyzed};
use crate::text::{category_title_in, fmt_bytes, since_start, trace_origin, wrap, wrap_width};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub snapshot: crate::args::SnapshotFile,
    /// Machine-readable output (`memsnap docs json`).
    #[arg(long)]
    pub json: bool,
    /// Sites listed per moment in the text output.
    #[arg(long, default_value_t = 10)]
    pub top: usize,
    /// What the text tables at the peak and the end group live memory by: the allocating line
    /// (site), the `user_metadata` the program set (metadata), or the `torch.compile` region.
    #[arg(long, value_enum, default_value_t = By::Site)]
    pub by: By,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum By {
    Site,
    Metadata,
    CompileRegion,
}

/// Labels listed per moment and label kind, and named phases listed per device, in text.
const TOP_LABELS: usize = 8;

/// A label value as text: quoted (it is the program's string), or "(no label)".
fn label_text(label: Option<&str>) -> String {
    label.map_or_else(|| "(no label)".to_string(), |l| format!("{:?}", clip(l)))
}

/// `label 1.00 MiB, …` for the first [`TOP_LABELS`], then how many more.
fn labels_line(labels: &[(Option<String>, u64)]) -> String {
    let mut parts: Vec<String> = labels
        .iter()
        .take(TOP_LABELS)
        .map(|(l, b)| format!("{} {}", printable(&label_text(l.as_deref())), fmt_bytes(*b)))
        .collect();
    if labels.len() > TOP_LABELS {
        let rest: u64 = labels[TOP_LABELS..].iter().map(|x| x.1).sum();
        parts.push(format!("{} more {}", labels.len() - TOP_LABELS, fmt_bytes(rest)));
    }
    parts.join(", ")
}

fn labels_json(labels: &[(Option<String>, u64)]) -> Value {
    Value::Array(labels.iter().map(|(l, b)| json!({"label": l, "bytes": b})).collect())
}

pub fn run(args: &Args) -> anyhow::Result<Exit> {
    let a = analyze_file(&args.snapshot.file)?;
    if args.json {
        write_analysis_json(&mut std::io::BufWriter::new(crate::emit::Stdout), &a)?;
    } else {
        emit(&analysis_text(&a, args.top, args.by))?;
    }
    crate::emit::leave(a);
    Ok(Exit::SUCCESS)
}

fn moment_json(m: &Moment, top: usize, reserved_known: bool) -> Value {
    let mut sites: Vec<Value> = m
        .by_site
        .iter()
        .take(top)
        .map(
            |s| json!({"label": s.label, "site": s.site.as_ref().map(site_json), "bytes": s.bytes, "blocks": s.blocks}),
        )
        .collect();
    if m.by_site.len() > top {
        let rest = &m.by_site[top..];
        sites.push(json!({
            "label": format!("{} other sites", rest.len()),
            "site": null,
            "bytes": rest.iter().map(|s| s.bytes).sum::<u64>(),
            "blocks": rest.iter().map(|s| s.blocks).sum::<u64>(),
        }));
    }
    let mut cats = serde_json::Map::new();
    for (c, b) in &m.by_category {
        cats.insert(c.name().to_string(), json!(b));
    }
    cats.insert("cached_free".into(), json!(reserved_known.then_some(m.cached_free)));
    json!({
        "event_index": m.event_index,
        "time_us": m.time_us,
        "allocated_bytes": m.allocated,
        "reserved_bytes": reserved_known.then_some(m.reserved),
        "by_site": sites,
        "by_category": cats,
        "by_phase": m.by_phase.iter().map(|(p, b)| (p.name().to_string(), json!(b))).collect::<serde_json::Map<_, _>>(),
        "by_metadata": labels_json(&m.by_metadata),
        "by_compile_region": labels_json(&m.by_compile_region),
    })
}

/// What the allocator's cache holds at the dump and how reserved memory grew (`docs/json.md`).
fn cache_json(c: &memsnap_analysis::AllocatorCache) -> Value {
    json!({
        "reserved_bytes": c.reserved,
        "allocated_bytes": c.allocated,
        "cached_free_bytes": c.cached_free,
        "free_segments": c.free_segments,
        "free_segment_bytes": c.free_segment_bytes,
        "hole_bytes": c.hole_bytes,
        "expandable_free_bytes": c.expandable_free_bytes,
        "expandable_unmappable_bytes": c.expandable_unmappable_bytes,
        "private_pool_free_bytes": c.private_free_bytes,
        "pending_free_bytes": c.pending_free_bytes,
        "unlisted_bytes": c.unlisted_bytes,
        "empty_cache_returns_bytes": c.empty_cache_returns,
        "growth": c.growth.as_ref().map(|g| json!({
            "peak_reserved_bytes": g.peak_reserved,
            "peak_allocated_bytes": g.peak_allocated,
            "allocated_at_peak_reserved_bytes": g.allocated_at_peak_reserved,
            "segments_made": g.made,
            "segment_bytes_made": g.made_bytes,
            "segments_made_while_cached": g.made_while_cached,
            "segment_bytes_made_while_cached": g.made_while_cached_bytes,
            "largest_made_while_cached": g.largest_while_cached.map(|l| json!({
                "event_index": l.event_index,
                "bytes": l.size,
                "cached_free_before_bytes": l.cached_free_before,
            })),
            "reserved_excess": g.excess,
            "segments_released": g.released,
            "segment_bytes_released": g.released_bytes,
        })),
        "text": memsnap_analysis::cache_words(c),
    })
}

/// The analysis as JSON; each device's object is built as it is written.
fn write_analysis_json(out: &mut dyn std::io::Write, a: &Analyzed) -> std::io::Result<()> {
    let snap = &a.loaded.snapshot;
    let totals = snap.device_totals();
    let reserved_known = !snap.profiler_converted();
    let device = |i: usize| {
        let da = &a.analysis.devices[i];
        {
            let r = a.replay.device(da.device);
            let t = memsnap_model::find_device(&totals, da.device, |t| t.device);
            let peaks = r.map(|r| r.peaks).unwrap_or_default();
            // Without a trace the replay knows only the dump: no peak can be established.
            let peak_known = da.peak_known;
            json!({
                "device": da.device,
                "allocated_bytes": t.map_or(0, |t| t.allocated_bytes),
                "reserved_bytes": reserved_known.then(|| t.map_or(0, |t| t.reserved_bytes)),
                "trace_entries": t.map_or(0, |t| t.trace_entries),
                "peak_allocated_bytes": peak_known.then_some(peaks.allocated.value),
                "peak_reserved_bytes": (peak_known && reserved_known).then_some(peaks.reserved.value),
                "peak_active_bytes": peak_known.then_some(peaks.active.value),
                "peak_requested_bytes": peak_known.then_some(peaks.requested.value),
                "peak_time_us": peaks.allocated.time_us,
                "peak_event_index": peaks.allocated.event_index,
                "peak_reserved_time_us": peaks.reserved.time_us,
                "replay_matches_snapshot": r.is_some_and(|r| r.check.matches_snapshot),
                "replay_mismatches": r.map_or(0, |r| r.check.mismatch_count),
                "replay_diagnostics": r.map_or(0, |r| r.diagnostic_count),
                "trace_complete": r.is_some_and(|r| r.start.trace_complete),
                "uncertain_bytes_at_start": r.map_or(0, |r| r.start.uncertain_bytes),
                "phases": {
                    "iterations": da.phases.iterations,
                    "iteration_source": format!("{:?}", da.phases.iteration_source).to_lowercase(),
                    "iteration_site": da.phases.iteration_site.as_ref().map(site_json),
                    "iteration_annotation": da.phases.iteration_annotation,
                    "backward_passes": da.phases.backward_passes,
                    "forward_passes": da.phases.forward_passes,
                    "evaluation_windows": da.phases.eval_windows.len(),
                    "optimizer_steps": da.phases.optimizer_steps,
                    "labels": da.phases.labels.iter().map(|l| json!({
                        "kind": l.kind.name(),
                        "name": l.name,
                        "first_event": l.first_event,
                        "last_event": l.last_event,
                        "events": l.events,
                    })).collect::<Vec<_>>(),
                },
                "peak": moment_json(&da.peak, memsnap_analysis::TOP_SITES, reserved_known),
                "end": moment_json(&da.end, memsnap_analysis::TOP_SITES, reserved_known),
                "cache": da.cache.as_ref().map(cache_json),
                "suspects": da.suspects.iter().map(suspect_json).collect::<Vec<_>>(),
                "caveats": da.caveats,
            })
        }
    };
    let fields = json!({
        "schema_version": 1,
        "command": "analyze",
        "file": file_name(&a.loaded.path),
        "pickle_bytes": a.loaded.pickle_bytes,
        "pickle_protocol": snap.source.protocol,
        "producer": snap.source.producer.name(),
        "suspects": a.analysis.suspects().into_iter().map(suspect_json).collect::<Vec<_>>(),
        "caveats": a.file_caveats,
    });
    let fields = fields.as_object().expect("an object");
    crate::json_stream::write_pretty(out, fields, "devices", a.analysis.devices.len(), &device)
}

fn analysis_text(a: &Analyzed, top: usize, by: By) -> String {
    let snap = &a.loaded.snapshot;
    let mut s = String::new();
    let _ = writeln!(s, "memsnap analyze: {}", shown_path(&a.loaded.path));
    let suspects = a.analysis.suspects();
    let width = wrap_width();
    let _ = writeln!(s, "\nVERDICT");
    if suspects.is_empty() {
        let _ = writeln!(s, "  No suspects: no leak, fragmentation or OOM found.");
    }
    for (i, sp) in suspects.iter().enumerate() {
        let site = sp.site.as_ref().map_or("(no user frame)".to_string(), |x| {
            format!("{}:{} in {}", shown(&x.filename), x.line, shown(&x.function))
        });
        let growth = sp
            .growth_bytes_per_iteration
            .map_or(String::new(), |g| format!(", +{}/{}", fmt_bytes(g), sp.growth_unit.name()));
        let _ = writeln!(
            s,
            "  {}. {} [{}] (confidence {:.2}, device {}) {}{}\n     at {}",
            i + 1,
            sp.kind.name(),
            sp.severity.name(),
            sp.confidence,
            sp.device,
            fmt_bytes(sp.bytes),
            growth,
            site
        );
        let _ = writeln!(s, "{}", wrap("     evidence: ", &printable(&sp.evidence), 15, width));
        let _ = writeln!(s, "{}", wrap("     fix: ", &printable(&sp.advice), 10, width));
    }
    for da in &a.analysis.devices {
        let r = a.replay.device(da.device);
        let _ = writeln!(s, "\nDEVICE {}", da.device);
        let origin = snap.trace(da.device).and_then(|t| trace_origin(&t.events));
        // The trace records allocations (else every live block is pre-trace).
        let traced_allocations = da.peak_known;
        if let Some(r) = r {
            let pk = r.peaks.allocated;
            let reserved = match crate::pipeline::reserved_known(snap, r.peaks.reserved.value) {
                Some(v) => format!("{} ({v} bytes)", fmt_bytes(v)),
                None => "not established".to_string(),
            };
            if da.peak_known {
                let _ = writeln!(
                    s,
                    "  peak allocated {} ({} bytes) at event {}{}; peak reserved {reserved}",
                    fmt_bytes(pk.value),
                    pk.value,
                    pk.event_index.map_or("-".into(), |i| i.to_string()),
                    pk.time_us.zip(origin).map_or(String::new(), |(t, o)| format!(", time {}", since_start(t, o))),
                );
            } else {
                // As in JSON (null): without allocations in the trace the file holds no peak.
                let _ = writeln!(s, "  peak allocated not established; peak reserved not established");
            }
            let _ = writeln!(
                s,
                "  replay matches snapshot: {}; trace complete: {}; uncertain at start: {}",
                if r.check.matches_snapshot { "yes" } else { "NO" },
                if r.start.trace_complete { "yes" } else { "no" },
                memsnap_model::bytes_exact(r.start.uncertain_bytes)
            );
        }
        let p = &da.phases;
        let _ = writeln!(
            s,
            "  phases: {} iterations ({}), {} backward passes, {} forward passes, {} evaluation windows, {} optimizer steps",
            p.iterations,
            match (&p.iteration_site, &p.iteration_annotation) {
                (Some(site), _) => format!("by {:?} at {}", p.iteration_source, printable(&site.short())).to_lowercase(),
                (None, Some(n)) => format!("by annotation {}", printable(&format!("{:?}", clip(n)))),
                _ => "none found".into(),
            },
            p.backward_passes,
            p.forward_passes,
            p.eval_windows.len(),
            p.optimizer_steps
        );
        if !p.labels.is_empty() {
            let named: Vec<String> = p
                .labels
                .iter()
                .take(TOP_LABELS)
                .map(|l| {
                    format!(
                        "{} {} events {}-{}",
                        l.kind.name(),
                        printable(&label_text(Some(&l.name))),
                        l.first_event,
                        l.last_event
                    )
                })
                .collect();
            let more = p.labels.len().saturating_sub(TOP_LABELS);
            let more = if more > 0 { format!(" and {more} more") } else { String::new() };
            let line = format!("{}{more}", named.join("; "));
            let _ = writeln!(s, "{}", wrap("  labelled phases: ", &line, 4, width));
        }
        // Without a peak (no allocations in the trace) the peak moment is the dump: said once.
        let moments =
            if da.peak_known { &[("at peak", &da.peak), ("at end", &da.end)][..] } else { &[("at end", &da.end)][..] };
        for &(title, m) in moments {
            let labels = match by {
                By::Site => None,
                By::Metadata => Some(("user_metadata", &m.by_metadata)),
                By::CompileRegion => Some(("compile region", &m.by_compile_region)),
            };
            let reserved = crate::pipeline::reserved_known(snap, m.reserved)
                .map_or("reserved not established".to_string(), |r| format!("{} reserved", fmt_bytes(r)));
            let _ = writeln!(
                s,
                "\n  Allocated {} by {} ({} allocated, {reserved}):",
                title,
                labels.map_or("site", |l| l.0),
                fmt_bytes(m.allocated),
            );
            if let Some((_, labels)) = labels {
                if labels.is_empty() {
                    let _ = writeln!(s, "    (no live block carries this label)");
                }
                for (label, bytes) in labels.iter().take(top) {
                    let _ = writeln!(s, "    {:>12}  {}", fmt_bytes(*bytes), printable(&label_text(label.as_deref())));
                }
            }
            for site in m.by_site.iter().take(top).filter(|_| labels.is_none()) {
                let _ = writeln!(
                    s,
                    "    {:>12}  {:>6} {:<6}  {}",
                    fmt_bytes(site.bytes),
                    site.blocks,
                    agree(site.blocks, "block", "blocks"),
                    printable(&site.label)
                );
            }
            if m.by_site.len() > top && labels.is_none() {
                let rest = &m.by_site[top..];
                let _ = writeln!(
                    s,
                    "    {:>12}  {:>6} {:<6}  ({} more sites)",
                    fmt_bytes(rest.iter().map(|x| x.bytes).sum()),
                    rest.iter().map(|x| x.blocks).sum::<u64>(),
                    agree(rest.iter().map(|x| x.blocks).sum(), "block", "blocks"),
                    rest.len()
                );
            }
            let cats: Vec<String> = m
                .by_category
                .iter()
                .filter(|(_, b)| *b > 0)
                .map(|(c, b)| format!("{} {}", category_title_in(*c, traced_allocations), fmt_bytes(*b)))
                .chain(
                    crate::pipeline::reserved_known(snap, m.cached_free)
                        .map(|c| format!("cached free {}", fmt_bytes(c))),
                )
                .collect();
            let _ = writeln!(s, "  By category {}: {}", title, cats.join(", "));
            let by_phase: Vec<String> = m
                .by_phase
                .iter()
                .filter(|(_, b)| *b > 0)
                .map(|(p, b)| format!("{} {}", p.name().replace('_', " "), fmt_bytes(*b)))
                .collect();
            if !by_phase.is_empty() {
                let _ = writeln!(s, "  By phase that allocated {}: {}", title, by_phase.join(", "));
            }
            for (name, labels) in [("user_metadata", &m.by_metadata), ("compile region", &m.by_compile_region)] {
                if !labels.is_empty() {
                    let _ = writeln!(s, "{}", wrap(&format!("  By {name} {title}: "), &labels_line(labels), 4, width));
                }
            }
        }
        if let Some(c) = &da.cache {
            let _ = writeln!(s, "\n  Allocator cache:");
            for line in memsnap_analysis::cache_words(c) {
                let _ = writeln!(s, "{}", wrap("    - ", &printable(&line), 6, width));
            }
        }
        if !da.caveats.is_empty() {
            let _ = writeln!(s, "\n  Caveats:");
            for c in &da.caveats {
                let _ = writeln!(s, "{}", wrap("    - ", &printable(c), 6, width));
            }
        }
    }
    let file_caveats = &a.file_caveats;
    if !file_caveats.is_empty() {
        let _ = writeln!(s, "\nFILE CAVEATS");
        for c in file_caveats {
            let _ = writeln!(s, "{}", wrap("  - ", &printable(c), 4, width));
        }
    }
    s
}
