//! `memsnap timeline FILE [--csv|--json] [--every N] [--device D]`: allocated, reserved, active
//! and requested bytes after each trace event, from the exact replay.

use std::fmt::Write as _;

use memsnap_analysis::LabelRun;
use memsnap_model::{printable, TraceEvent};
use memsnap_replay::{DeviceReplay, Peak};
use serde_json::{json, Value};

use crate::emit::{emit, emit_json, shown_path};
use crate::exit::Exit;
use crate::load::load;
use crate::pipeline::file_name;
use crate::pipeline::select_devices;
use crate::text::{fmt_bytes, since_start, trace_origin};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub snapshot: crate::args::SnapshotFile,
    /// One CSV row per event: device,event,time_us,action,allocated,reserved,active,requested.
    #[arg(long, conflicts_with = "json")]
    pub csv: bool,
    /// Machine-readable output (`memsnap docs json`): per device, columns of equal length.
    #[arg(long)]
    pub json: bool,
    /// Keep every Nth event (and always the last); the peaks are computed over all events.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub every: u64,
    /// Only this device.
    #[arg(long)]
    pub device: Option<u32>,
}

/// Rows are written in pieces of about this many bytes, so that a 12 M-event timeline never
/// sits in memory as one string.
const PIECE: usize = 1 << 20;

pub fn run(args: &Args) -> anyhow::Result<Exit> {
    let loaded = load(&args.snapshot.file)?;
    let snap = &loaded.snapshot;
    let replay = memsnap_replay::replay(snap);
    let devices = select_devices(&replay, args.device)?;
    let every = args.every as usize;
    let events_of = |d: &DeviceReplay| snap.trace(d.device).map_or(&[][..], |t| t.events.as_slice());

    let mut out = String::with_capacity(PIECE + 4096);
    if args.json {
        let head = json!({
            "schema_version": 1,
            "command": "timeline",
            "file": file_name(&loaded.path),
            "every": every,
        });
        let head = serde_json::to_string(&head)?;
        // The series can hold millions of values: write them out piece by piece instead of
        // building one JSON tree.
        let _ = write!(out, "{},\"devices\":[", &head[..head.len() - 1]);
        for (k, d) in devices.iter().enumerate() {
            if k > 0 {
                out.push(',');
            }
            let labels = memsnap_analysis::label_runs(snap, events_of(d));
            write_device_json(&mut out, d, events_of(d), &labels, every)?;
        }
        out.push_str("]}\n");
        emit_json(&out)?;
        return Ok(Exit::SUCCESS);
    }

    if args.csv {
        out.push_str("device,event,time_us,action,allocated,reserved,active,requested\n");
    } else {
        let _ = writeln!(out, "memsnap timeline: {}", shown_path(&loaded.path));
    }
    for d in devices {
        let events = events_of(d);
        let origin = trace_origin(events);
        if !args.csv {
            header(&mut out, d, events, &memsnap_analysis::label_runs(snap, events));
        }
        for i in kept(d.event_count, every) {
            let e = &events[i];
            let t = d.series.after(Some(i));
            if args.csv {
                let time = if e.has_time() { e.time_us.to_string() } else { String::new() };
                let _ = writeln!(
                    out,
                    "{},{i},{time},{},{},{},{},{}",
                    d.device,
                    e.action().name(),
                    t.allocated,
                    t.reserved,
                    t.active,
                    t.requested
                );
            } else {
                let time = match origin {
                    Some(o) if e.has_time() => since_start(e.time_us, o),
                    _ => String::new(),
                };
                let _ = writeln!(
                    out,
                    "{i:>10} {time:>17}  {:<15}{:>12}{:>12}{:>12}{:>12}",
                    e.action().name(),
                    fmt_bytes(t.allocated),
                    fmt_bytes(t.reserved),
                    fmt_bytes(t.active),
                    fmt_bytes(t.requested)
                );
            }
            if out.len() >= PIECE {
                emit(&out)?;
                out.clear();
            }
        }
    }
    emit(&out)?;
    Ok(Exit::SUCCESS)
}

/// Indices of the events shown: every `every`th, and the last.
fn kept(n: usize, every: usize) -> impl Iterator<Item = usize> {
    (0..n).filter(move |&i| i % every == 0 || i + 1 == n)
}

fn header(out: &mut String, d: &DeviceReplay, events: &[TraceEvent], labels: &[LabelRun]) {
    let s = &d.start;
    let _ = writeln!(out, "\ndevice {}: {}", d.device, memsnap_model::count_of(d.event_count as u64, "event"));
    let _ = writeln!(
        out,
        "  start: allocated {}, reserved {}; trace complete: {}; uncertain at start: {} in {}",
        fmt_bytes(d.series.start.allocated),
        fmt_bytes(d.series.start.reserved),
        if s.trace_complete { "yes" } else { "no" },
        fmt_bytes(s.uncertain_bytes),
        memsnap_model::count_of(s.uncertain_blocks.len() as u64, "block")
    );
    let _ = writeln!(
        out,
        "  replay matches snapshot: {}{}",
        if d.check.matches_snapshot { "yes" } else { "NO" },
        if d.check.matches_snapshot { String::new() } else { format!(" ({} differences)", d.check.mismatch_count) }
    );
    for (name, p) in [
        ("allocated", d.peaks.allocated),
        ("reserved", d.peaks.reserved),
        ("active", d.peaks.active),
        ("requested", d.peaks.requested),
    ] {
        let _ = writeln!(out, "  peak {name:<10} {:>12} ({} bytes) {}", fmt_bytes(p.value), p.value, when(&p, events));
    }
    // The stretches the program named (`_set_memory_metadata`, torch.compile regions).
    for l in labels {
        let _ = writeln!(
            out,
            "  labelled phase: {} {} from event {} to {} ({})",
            l.kind.name(),
            printable(&format!("{:?}", l.name)),
            l.first_event,
            l.last_event,
            memsnap_model::plural(l.events, "entry carries it", "entries carry it")
        );
    }
    let _ = writeln!(
        out,
        "\n{:>10} {:>17}  {:<15}{:>12}{:>12}{:>12}{:>12}",
        "event", "time", "action", "allocated", "reserved", "active", "requested"
    );
}

fn when(p: &Peak, events: &[TraceEvent]) -> String {
    match p.event_index {
        None => "at the start".into(),
        Some(i) => format!(
            "after event {i} ({}){}",
            events[i].action().name(),
            p.time_us.zip(trace_origin(events)).map_or(String::new(), |(t, o)| format!(" at {}", since_start(t, o)))
        ),
    }
}

fn peak_json(p: &Peak) -> Value {
    json!({"bytes": p.value, "event_index": p.event_index, "time_us": p.time_us})
}

/// A named column and how to write its value for an event.
type Column<'a> = (&'a str, &'a dyn Fn(&mut String, usize));

/// One device as JSON: facts, then the series as columns of equal length.
fn write_device_json(
    out: &mut String,
    d: &DeviceReplay,
    events: &[TraceEvent],
    labels: &[LabelRun],
    every: usize,
) -> anyhow::Result<()> {
    let facts = json!({
        "device": d.device,
        "events": d.event_count,
        "trace_complete": d.start.trace_complete,
        "uncertain_bytes_at_start": d.start.uncertain_bytes,
        "replay_matches_snapshot": d.check.matches_snapshot,
        "start": {
            "allocated": d.series.start.allocated,
            "reserved": d.series.start.reserved,
            "active": d.series.start.active,
            "requested": d.series.start.requested,
        },
        "peaks": {
            "allocated": peak_json(&d.peaks.allocated),
            "reserved": peak_json(&d.peaks.reserved),
            "active": peak_json(&d.peaks.active),
            "requested": peak_json(&d.peaks.requested),
        },
        "labels": labels.iter().map(|l| json!({
            "kind": l.kind.name(),
            "name": l.name,
            "first_event": l.first_event,
            "last_event": l.last_event,
            "entries": l.events,
        })).collect::<Vec<_>>(),
    });
    let facts = serde_json::to_string(&facts)?;
    let _ = write!(out, "{},\"series\":{{", &facts[..facts.len() - 1]);
    let number = |out: &mut String, v: u64| {
        let _ = write!(out, "{v}");
    };
    let columns: [Column; 7] = [
        ("event", &|out, i| number(out, i as u64)),
        ("time_us", &|out, i| {
            let e = &events[i];
            let _ = if e.has_time() { write!(out, "{}", e.time_us) } else { write!(out, "null") };
        }),
        ("action", &|out, i| {
            let _ = write!(out, "\"{}\"", events[i].action().name());
        }),
        ("allocated", &|out, i| number(out, d.series.after(Some(i)).allocated)),
        ("reserved", &|out, i| number(out, d.series.after(Some(i)).reserved)),
        ("active", &|out, i| number(out, d.series.after(Some(i)).active)),
        ("requested", &|out, i| number(out, d.series.after(Some(i)).requested)),
    ];
    for (c, (name, value)) in columns.iter().enumerate() {
        let _ = write!(out, "{}\"{name}\":[", if c > 0 { "," } else { "" });
        for (k, i) in kept(d.event_count, every).enumerate() {
            if k > 0 {
                out.push(',');
            }
            value(out, i);
            if out.len() >= PIECE {
                emit_json(out)?;
                out.clear();
            }
        }
        out.push(']');
    }
    out.push_str("}}");
    Ok(())
}
