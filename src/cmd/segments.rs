//! `memsnap segments FILE [--at MOMENT] [--json] [--device D]`: the segment map
//! at a moment of the trace, rebuilt by the exact replay, with per-segment allocated, free and
//! fragmentation (the `_memory_viz segsum` view, at any time rather than only at dump).

use std::fmt::Write as _;

use memsnap_analysis::{find_phases, StackTable};
use memsnap_model::{BlockState, SegmentType, Snapshot, TraceEvent};
use memsnap_replay::{DeviceReplay, MemoryMap, SegmentStats, SegmentView};
use serde_json::{json, Value};

use crate::emit::{emit, emit_json, shown_path};
use crate::exit::Exit;
use crate::load::load;
use crate::moment::At;
use crate::pipeline::file_name;
use crate::pipeline::select_devices;
use crate::text::{fmt_bytes, since_start, trace_origin};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub snapshot: crate::args::SnapshotFile,
    /// When: `end` (after the last event, as dumped), `peak` (peak allocated bytes), `start`
    /// (before the first event), `oom`, `event:N`, `+1.25s` (after the trace start),
    /// `iteration:K` or `us:EPOCH` (the layout after the last event at or before it).
    #[arg(long, default_value = "end", value_parser = crate::moment::parse)]
    pub at: At,
    /// Machine-readable output (`memsnap docs json`), blocks included.
    #[arg(long)]
    pub json: bool,
    /// Only this device.
    #[arg(long)]
    pub device: Option<u32>,
}

/// The layout `at` names, for one device.
fn state(at: At, snap: &Snapshot, d: &DeviceReplay) -> anyhow::Result<MemoryMap> {
    Ok(match at {
        At::Start => d.state_after(None),
        At::Peak => d.state_at_peak(),
        At::End => d.state_at_end(),
        _ => {
            let events = events(snap, d.device);
            let iteration_starts = || {
                let annotations = snap.annotations_by_device().remove(&d.device).unwrap_or_default();
                find_phases(events, &StackTable::new(snap), &annotations).boundaries
            };
            let idx = at
                .resolve(events, d.peaks.allocated.event_index, iteration_starts)
                .map_err(|e| anyhow::anyhow!("device {}: {e}", d.device))?;
            d.state_after(idx)
        }
    })
}

pub fn run(args: &Args) -> anyhow::Result<Exit> {
    let loaded = load(&args.snapshot.file)?;
    let snap = &loaded.snapshot;
    let replay = memsnap_replay::replay(snap);
    let devices = select_devices(&replay, args.device)?;
    let maps: Vec<(&DeviceReplay, MemoryMap)> =
        devices.into_iter().map(|d| Ok((d, state(args.at, snap, d)?))).collect::<anyhow::Result<_>>()?;
    if args.json {
        let doc = json!({
            "schema_version": 1,
            "command": "segments",
            "file": file_name(&loaded.path),
            "at": args.at.name(),
            "devices": maps.iter().map(|(d, m)| device_json(snap, d, m)).collect::<Vec<_>>(),
        });
        let mut s = serde_json::to_string_pretty(&doc)?;
        s.push('\n');
        emit_json(&s)?;
    } else {
        let mut s = String::new();
        let _ = writeln!(s, "memsnap segments: {} (at {})", shown_path(&loaded.path), args.at.name());
        for (d, m) in &maps {
            device_text(&mut s, snap, d, m);
        }
        emit(&s)?;
    }
    Ok(Exit::SUCCESS)
}

fn events(snap: &Snapshot, device: u32) -> &[TraceEvent] {
    snap.trace(device).map_or(&[], |t| t.events.as_slice())
}

fn type_name(t: SegmentType) -> &'static str {
    match t {
        SegmentType::Small => "small",
        SegmentType::Large => "large",
        SegmentType::Unknown => "?",
    }
}

fn state_name(s: BlockState) -> &'static str {
    match s {
        BlockState::Allocated => "active_allocated",
        BlockState::PendingFree => "active_pending_free",
        BlockState::Inactive => "inactive",
    }
}

/// Which moment the map shows, in words.
fn moment_line(snap: &Snapshot, d: &DeviceReplay, m: &MemoryMap) -> String {
    match m.event_index {
        None => "before the first event".into(),
        Some(i) => {
            let events = events(snap, d.device);
            let e = &events[i];
            let time = match (e.has_time(), trace_origin(events)) {
                (true, Some(origin)) => format!(" at {}", since_start(e.time_us, origin)),
                _ => String::new(),
            };
            format!("after event {i} of {} ({}){time}", d.event_count, e.action().name())
        }
    }
}

/// One character per 1/40 of the segment: `#` allocated, `+` pending free, `.` free; a cell
/// takes the state that covers most of it.
fn bar(s: &SegmentView) -> String {
    const CELLS: u64 = 40;
    let mut cover = [[0u64; 3]; CELLS as usize];
    for b in &s.blocks {
        let k = match b.state {
            BlockState::Allocated => 0,
            BlockState::PendingFree => 1,
            BlockState::Inactive => 2,
        };
        let (start, end) = (b.address - s.address, b.address - s.address + b.size);
        for (c, cell) in cover.iter_mut().enumerate() {
            let c = c as u64;
            let (lo, hi) = (s.total_size * c / CELLS, s.total_size * (c + 1) / CELLS);
            cell[k] += end.min(hi).saturating_sub(start.max(lo));
        }
    }
    cover
        .iter()
        .map(|c| {
            let most = (0..3).max_by_key(|&k| (c[k], std::cmp::Reverse(k))).unwrap_or(2);
            ['#', '+', '.'][most]
        })
        .collect()
}

/// How much larger than shown the blocks in the map that existed before the trace may be.
fn uncertain_bytes(d: &DeviceReplay, m: &MemoryMap) -> u64 {
    let blocks = || m.segments.iter().flat_map(|s| &s.blocks);
    d.start
        .uncertain_blocks
        .iter()
        .filter(|u| {
            blocks().any(|b| b.address == u.address && b.lifetime.is_some_and(|k| d.blocks[k].alloc_event().is_none()))
        })
        .map(|u| u.size_max - u.size_assumed)
        .sum()
}

fn device_text(s: &mut String, snap: &Snapshot, d: &DeviceReplay, m: &MemoryMap) {
    let _ = writeln!(s, "\ndevice {}: {}", d.device, moment_line(snap, d, m));
    if !d.check.matches_snapshot {
        let _ = writeln!(
            s,
            "  warning: the replay does not reproduce the snapshot ({} differences)",
            d.check.mismatch_count
        );
    }
    let uncertain = uncertain_bytes(d, m);
    if uncertain > 0 {
        let _ = writeln!(
            s,
            "  note: blocks from before the trace may be up to {} larger than shown (sizes not in the trace)",
            fmt_bytes(uncertain)
        );
    }
    let _ = writeln!(
        s,
        "{:<16} {:<5} {:>5} {:>11} {:>11} {:>11} {:>11} {:>11} {:>5} {:>11} {:>5}  map (# allocated, + pending, . free)",
        "address", "type", "flags", "size", "allocated", "requested", "pending", "free", "holes", "largest", "frag"
    );
    let mut total = SegmentStats::default();
    let mut reserved = 0;
    for seg in &m.segments {
        let st = seg.stats();
        reserved += seg.total_size;
        total.allocated_bytes += st.allocated_bytes;
        total.requested_bytes += st.requested_bytes;
        total.pending_free_bytes += st.pending_free_bytes;
        total.free_bytes += st.free_bytes;
        total.free_blocks += st.free_blocks;
        total.largest_free_bytes = total.largest_free_bytes.max(st.largest_free_bytes);
        let mut kind = String::new();
        if seg.is_expandable {
            kind.push('e');
        }
        match memsnap_model::PoolKind::of(seg.pool_id) {
            memsnap_model::PoolKind::Default => {}
            memsnap_model::PoolKind::GraphPrivate => kind.push('g'),
            memsnap_model::PoolKind::UserCreated => kind.push('u'),
            memsnap_model::PoolKind::Private => kind.push('p'),
        }
        if seg.stream != 0 {
            kind.push('s');
        }
        let _ = writeln!(
            s,
            "{:<#16x} {:<5} {:>5} {:>11} {:>11} {:>11} {:>11} {:>11} {:>5} {:>11} {:>4.0}%  [{}]",
            seg.address,
            type_name(seg.segment_type),
            kind,
            fmt_bytes(seg.total_size),
            fmt_bytes(st.allocated_bytes),
            fmt_bytes(st.requested_bytes),
            fmt_bytes(st.pending_free_bytes),
            fmt_bytes(st.free_bytes),
            st.free_blocks,
            fmt_bytes(st.largest_free_bytes),
            st.fragmentation * 100.0,
            bar(seg)
        );
    }
    // As `_memory_viz segsum`: free memory is cached free blocks ("external") plus what rounding
    // and unsplit blocks add to allocations ("internal"). A file may claim a requested size above
    // its block's size (PyTorch never writes one): no internal waste is then counted for it.
    let internal = total.allocated_bytes.saturating_sub(total.requested_bytes);
    let free = total.free_bytes + internal;
    let _ = writeln!(s, "segments: {}  (flags: e expandable, g CUDA graph's private pool, u user-created pool (MemPool, graph_pool_handle), p other private pool, s side stream)", m.segments.len());
    let _ = writeln!(s, "total_reserved: {}", fmt_bytes(reserved));
    let _ = writeln!(
        s,
        "total_allocated: {} (requested {})",
        fmt_bytes(total.allocated_bytes),
        fmt_bytes(total.requested_bytes)
    );
    if total.pending_free_bytes > 0 {
        let _ = writeln!(s, "total_pending_free: {}", fmt_bytes(total.pending_free_bytes));
    }
    let _ = writeln!(
        s,
        "total_free: {} ({:.1}% internal); largest free block {}",
        fmt_bytes(free),
        if free > 0 { internal as f64 * 100.0 / free as f64 } else { 0.0 },
        fmt_bytes(total.largest_free_bytes)
    );
}

fn device_json(snap: &Snapshot, d: &DeviceReplay, m: &MemoryMap) -> Value {
    let time_us = m.event_index.and_then(|i| {
        let e = &events(snap, d.device)[i];
        e.has_time().then_some(e.time_us)
    });
    let segments: Vec<Value> = m
        .segments
        .iter()
        .map(|seg| {
            let st = seg.stats();
            json!({
                "address": seg.address,
                "total_size": seg.total_size,
                "segment_type": type_name(seg.segment_type),
                "stream": seg.stream,
                "pool_id": [seg.pool_id.0, seg.pool_id.1],
                "is_expandable": seg.is_expandable,
                "allocated_bytes": st.allocated_bytes,
                "requested_bytes": st.requested_bytes,
                "pending_free_bytes": st.pending_free_bytes,
                "free_bytes": st.free_bytes,
                "free_blocks": st.free_blocks,
                "largest_free_bytes": st.largest_free_bytes,
                "fragmentation": (st.fragmentation * 1e4).round() / 1e4,
                "blocks": seg.blocks.iter().map(|b| json!({
                    "address": b.address,
                    "size": b.size,
                    "requested_size": b.requested_size,
                    "state": state_name(b.state),
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({
        "device": d.device,
        "event_index": m.event_index,
        "time_us": time_us,
        "replay_matches_snapshot": d.check.matches_snapshot,
        "uncertain_bytes": uncertain_bytes(d, m),
        "reserved_bytes": m.segments.iter().map(|s| s.total_size).sum::<u64>(),
        "segments": segments,
    })
}
