//! `memsnap summary FILE [--json]`: dump-time totals per device, pools, block states, trace
//! coverage, allocator settings, producer, and what the file lacks.

use std::fmt::Write as _;

use memsnap_model::{printable, shown, DeviceTotals, TraceFacts};
use serde_json::{json, Value};

use crate::emit::{emit, shown_path};
use crate::exit::Exit;
use crate::load::{load_summary, Loaded};
use crate::pipeline::{file_name, lacks};
use crate::text::{fmt_bytes, since_start, utc};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub snapshot: crate::args::SnapshotFile,
    /// Machine-readable output (`memsnap docs json`).
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &Args) -> anyhow::Result<Exit> {
    let loaded = load_summary(&args.snapshot.file)?;
    if args.json {
        write_summary_json(&mut std::io::BufWriter::new(crate::emit::Stdout), &loaded)?;
    } else {
        emit(&summary_text(&loaded))?;
    }
    crate::emit::leave(loaded);
    Ok(Exit::SUCCESS)
}

fn summary_text(l: &Loaded) -> String {
    let snap = &l.snapshot;
    let totals = snap.device_totals();
    let facts = snap.trace_facts();
    let mut s = String::new();
    let rule = "|===========================================================================|";
    let thin = "|---------------------------------------------------------------------------|";
    let _ = writeln!(s, "memsnap summary: {}", shown_path(&l.path));
    let _ = writeln!(
        s,
        "file: {} bytes ({}, {} pickle bytes), pickle protocol {}, producer {}",
        l.file_bytes,
        if l.compression == crate::input::Compression::None {
            "uncompressed".to_string()
        } else {
            format!("{} compressed", l.compression.name())
        },
        l.pickle_bytes,
        snap.source.protocol,
        snap.source.producer.name()
    );
    let _ = match snap.device_type() {
        Some(d) => writeln!(s, "device type: {}; said by {}", d.device_type.title(), d.evidence),
        None => writeln!(s, "device type: not said by the file"),
    };
    if totals.is_empty() {
        let _ = writeln!(s, "no devices: the snapshot has no segments and no trace events");
    }
    let cpu = snap.profiler_cpu_device();
    let reserved_known = !snap.profiler_converted();
    let empty_cache = empty_cache_returns(snap);
    for t in &totals {
        let _ = writeln!(s, "{rule}");
        let title = if cpu == Some(t.device) {
            format!("memsnap summary, device ID {} (CPU memory)", t.device)
        } else {
            format!("memsnap summary, device ID {}", t.device)
        };
        let _ = writeln!(s, "|{:^75}|", title);
        let _ = writeln!(s, "{rule}");
        let _ = writeln!(s, "| {:<24}| {:>22} | {:>22} |", "Metric (at dump)", "bytes", "");
        let _ = writeln!(s, "{thin}");
        // The last four come from the segments, which a profiler-converted file makes up.
        for (name, v, from_segments) in [
            ("Allocated memory", t.allocated_bytes, false),
            ("Active memory", t.active_bytes, false),
            ("Requested memory", t.requested_bytes, false),
            ("GPU reserved memory", t.reserved_bytes, true),
            ("Inactive (cached free)", t.inactive_bytes, true),
            ("Inactive split bytes", t.inactive_split_bytes, true),
            ("Largest free block", t.largest_free_block, true),
            ("empty_cache() returns", empty_cache.get(&t.device).copied().unwrap_or(0), true),
        ] {
            if from_segments && !reserved_known {
                let _ = writeln!(s, "| {:<24}| {:>22} | {:>22} |", name, "not established", "");
            } else {
                let _ = writeln!(s, "| {:<24}| {:>22} | {:>22} |", name, v, fmt_bytes(v));
            }
        }
        let _ = writeln!(s, "{thin}");
        let _ = writeln!(s, "| {:<24}| {:>22} | {:>22} |", "Segments by pool", "segments", "bytes");
        for (name, c, b) in [
            ("small (2 MiB)", t.pools.small_segments, t.pools.small_bytes),
            ("large", t.pools.large_segments, t.pools.large_bytes),
            ("graph-private pools", t.pools.graph_private().0, t.pools.graph_private().1),
            ("user pools (MemPool)", t.pools.user_pool_segments, t.pools.user_pool_bytes),
            ("expandable", t.pools.expandable_segments, t.pools.expandable_bytes),
        ] {
            let _ = writeln!(s, "| {:<24}| {:>22} | {:>22} |", format!("  {name}"), c, fmt_bytes(b));
        }
        let all_segments =
            t.pools.small_segments + t.pools.large_segments + t.pools.private_segments + t.pools.expandable_segments;
        let _ = writeln!(s, "| {:<24}| {:>22} | {:>22} |", "  total", all_segments, fmt_bytes(t.reserved_bytes));
        let _ = writeln!(s, "{thin}");
        let _ = writeln!(s, "| {:<24}| {:>22} | {:>22} |", "Blocks by state", "blocks", "");
        for (name, c) in [
            ("active_allocated", t.blocks_allocated),
            ("active_pending_free", t.blocks_pending_free),
            ("inactive", t.blocks_inactive),
            ("total", t.block_count),
        ] {
            let _ = writeln!(s, "| {:<24}| {:>22} | {:>22} |", format!("  {name}"), c, "");
        }
        let _ = writeln!(s, "{rule}");
    }
    if snap.host.present {
        let h = &snap.host;
        let _ = writeln!(
            s,
            "\nPinned host memory (not in any device total): {}, {} reserved, {} allocated; {} host trace entries",
            memsnap_model::count_of(h.segments, "segment"),
            fmt_bytes(h.reserved_bytes),
            fmt_bytes(h.allocated_bytes),
            h.trace_entries
        );
    }
    let _ = writeln!(s, "\nTrace");
    if facts.is_empty() {
        let _ = writeln!(s, "  (none)");
    }
    for f in &facts {
        let span = match (f.first_time_us, f.last_time_us) {
            (Some(a), Some(b)) => format!("{:.3} s", (b - a) as f64 / 1e6),
            _ => "-".into(),
        };
        let first = f.first_time_us.map_or(String::new(), |t| format!(" at {}", utc(t)));
        let last = match (f.first_time_us, f.last_time_us) {
            (Some(a), Some(b)) => format!(" at {}", since_start(b, a)),
            _ => String::new(),
        };
        let _ = writeln!(
            s,
            "  device {}: {} entries, span {}, first {}{first}, last {}{last}",
            f.device,
            f.entries,
            span,
            f.first_action.map_or("-", |a| a.name()),
            f.last_action.map_or("-", |a| a.name()),
        );
        if !f.actions.is_empty() {
            let parts: Vec<String> = f.actions.iter().map(|(a, c)| format!("{} {}", a.name(), c)).collect();
            let _ = writeln!(s, "    {}", parts.join(", "));
        }
    }
    let _ = writeln!(s, "\nAllocator settings");
    if snap.settings.raw.is_empty() {
        let _ = writeln!(s, "  (not in file)");
    }
    for (k, v) in &snap.settings.raw {
        let v = if v.is_empty() { "''" } else { v.as_str() };
        let _ = writeln!(s, "  {}: {}", shown(k), shown(v));
    }
    if !snap.annotations.is_empty() {
        let _ = writeln!(s, "\nAnnotations: {} external annotation events", snap.annotations.len());
    }
    let lacks = lacks(snap);
    let _ = writeln!(s, "\nCaveats");
    if lacks.is_empty() {
        let _ = writeln!(s, "  none: full trace with Python stacks");
    }
    for c in lacks {
        let _ = writeln!(s, "  - {}", printable(&c));
    }
    if !snap.source.unknown_keys.is_empty() || !snap.source.unknown_actions.is_empty() {
        let _ = writeln!(s, "\nTolerated unknown content");
        for (k, c) in &snap.source.unknown_keys {
            let _ = writeln!(s, "  key {}: {c}", shown(k));
        }
        for (k, c) in &snap.source.unknown_actions {
            let _ = writeln!(s, "  action {}: {c}", shown(k));
        }
    }
    s
}

/// What `torch.cuda.empty_cache()` called at the dump would return, by device (see
/// `memsnap_analysis::cache_at_dump`); one pass over the segments.
fn empty_cache_returns(snap: &memsnap_model::Snapshot) -> std::collections::BTreeMap<u32, u64> {
    snap.segments_by_device()
        .into_iter()
        .map(|(d, ks)| (d, memsnap_analysis::cache_at_dump(ks.iter().map(|&k| &snap.segments[k])).empty_cache_returns))
        .collect()
}

/// One device's object; `reserved_known` false (a profiler-converted file) makes the numbers
/// that come from its made-up segments null.
fn device_json(t: &DeviceTotals, f: Option<&TraceFacts>, empty_cache: u64, reserved_known: bool) -> Value {
    let known = |v: u64| reserved_known.then_some(v);
    json!({
        "device": t.device,
        "allocated_bytes": t.allocated_bytes,
        "reserved_bytes": known(t.reserved_bytes),
        "active_bytes": t.active_bytes,
        "requested_bytes": t.requested_bytes,
        "inactive_bytes": known(t.inactive_bytes),
        "inactive_split_bytes": known(t.inactive_split_bytes),
        "largest_free_block": known(t.largest_free_block),
        "empty_cache_returns_bytes": known(empty_cache),
        "segment_count": t.segment_count,
        "block_count": t.block_count,
        "blocks_by_state": {
            "active_allocated": t.blocks_allocated,
            "active_pending_free": t.blocks_pending_free,
            "inactive": t.blocks_inactive,
        },
        "segments_by_pool": {
            "small": {"segments": t.pools.small_segments, "bytes": t.pools.small_bytes},
            "large": {"segments": t.pools.large_segments, "bytes": t.pools.large_bytes},
            "private": {"segments": t.pools.private_segments, "bytes": t.pools.private_bytes},
            "graph_private": {"segments": t.pools.graph_private().0, "bytes": t.pools.graph_private().1},
            "user_created": {"segments": t.pools.user_pool_segments, "bytes": t.pools.user_pool_bytes},
            "expandable": {"segments": t.pools.expandable_segments, "bytes": t.pools.expandable_bytes},
        },
        "trace_entries": t.trace_entries,
        "trace": f.map(|f| json!({
            "entries": f.entries,
            "first_time_us": f.first_time_us,
            "last_time_us": f.last_time_us,
            "first_action": f.first_action.map(|a| a.name()),
            "last_action": f.last_action.map(|a| a.name()),
            "actions": f.actions.iter().map(|(a, c)| (a.name().to_string(), json!(c))).collect::<serde_json::Map<_, _>>(),
            "events_without_time": f.events_without_time,
        })),
    })
}

/// The summary as JSON; each device's object is built as it is written.
fn write_summary_json(out: &mut dyn std::io::Write, l: &Loaded) -> std::io::Result<()> {
    let snap = &l.snapshot;
    let facts = snap.trace_facts();
    let totals = snap.device_totals();
    let reserved_known = !snap.profiler_converted();
    let empty_cache = empty_cache_returns(snap);
    let device = |i: usize| {
        let t = &totals[i];
        let f = memsnap_model::find_device(&facts, t.device, |f| f.device);
        device_json(t, f, empty_cache.get(&t.device).copied().unwrap_or(0), reserved_known)
    };
    let fields = summary_fields(l);
    crate::json_stream::write_pretty(out, fields.as_object().expect("an object"), "devices", totals.len(), &device)
}

/// Every top-level field of the summary JSON but `devices`.
fn summary_fields(l: &Loaded) -> Value {
    let snap = &l.snapshot;
    json!({
        "schema_version": 1,
        "command": "summary",
        // Only the file name: output must not depend on where the machine keeps the file.
        "file": file_name(&l.path),
        "pickle_bytes": l.pickle_bytes,
        "pickle_protocol": snap.source.protocol,
        "producer": snap.source.producer.name(),
        "device_type": snap.device_type().map(|d| json!({"name": d.device_type.name(), "evidence": d.evidence})),
        "allocator_settings": snap.settings.raw,
        "annotations": snap.annotations.len(),
        "host_memory": snap.host.present.then(|| json!({
            "segments": snap.host.segments,
            "reserved_bytes": snap.host.reserved_bytes,
            "allocated_bytes": snap.host.allocated_bytes,
            "trace_entries": snap.host.trace_entries,
        })),
        "caveats": lacks(snap),
        "unknown_keys": snap.source.unknown_keys,
        "unknown_actions": snap.source.unknown_actions,
    })
}
