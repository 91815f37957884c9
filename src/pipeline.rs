//! The pipeline the commands share: load a file, replay it, analyse it; the per-device figures
//! that batch rows, check gates and diffs compare; which devices a command shows; and the
//! caveats about what a file lacks.

use memsnap_analysis::Analysis;
use memsnap_model::{Snapshot, StackId};
use memsnap_replay::{DeviceReplay, Replay};

use crate::load::Loaded;

/// Everything the analysis commands share: the loaded file, its replay and its analysis.
pub struct Analyzed {
    pub loaded: Loaded,
    pub replay: Replay,
    pub analysis: Analysis,
    /// What the file lacks ([`lacks`]).
    pub file_caveats: Vec<String>,
}

pub fn analyze_file(path: &std::path::Path) -> Result<Analyzed, crate::load::LoadError> {
    analyze_file_capped(path, None)
}

/// [`analyze_file`] of an input held to `cap` pickle bytes (see [`crate::load::load_capped`]).
pub fn analyze_file_capped(path: &std::path::Path, cap: Option<u64>) -> Result<Analyzed, crate::load::LoadError> {
    let loaded = crate::load::load_capped(path, cap)?;
    let snap = &loaded.snapshot;
    let phase = crate::progress::phase("replaying the allocator");
    // What needs no replay (phases, labels, the file's caveats) is found while it runs.
    let ((replay, prepared), file_caveats) = rayon::join(
        || rayon::join(|| memsnap_replay::replay(snap), || memsnap_analysis::Prepared::new(snap)),
        || lacks(snap),
    );
    phase.set_message("analysing");
    let analysis = memsnap_analysis::analyze_prepared(snap, &replay, prepared, &memsnap_analysis::Thresholds::DEFAULT);
    phase.finish_and_clear();
    Ok(Analyzed { loaded, replay, analysis, file_caveats })
}

/// The numbers of one device that batch rows, check gates and diff share.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceFigures {
    pub device: u32,
    /// `memory_allocated()` / `memory_reserved()` at dump.
    pub allocated_bytes: u64,
    pub reserved_bytes: u64,
    /// Largest allocated / reserved bytes over the replayed trace, and never below the dump.
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
    /// The file has a trace for this device, so the peaks are measured; without one only the
    /// dump is known and the peaks above are the dump-time values (reported as null in JSON).
    pub peak_known: bool,
}

/// Per-device figures, in the analysis' device order (ascending).
pub fn device_figures(a: &Analyzed) -> Vec<DeviceFigures> {
    let totals = a.loaded.snapshot.device_totals();
    a.analysis
        .devices
        .iter()
        .map(|da| {
            let t = memsnap_model::find_device(&totals, da.device, |t| t.device);
            let allocated_bytes = t.map_or(0, |t| t.allocated_bytes);
            let reserved_bytes = t.map_or(0, |t| t.reserved_bytes);
            let peaks = a.replay.device(da.device).map(|r| r.peaks).unwrap_or_default();
            DeviceFigures {
                device: da.device,
                allocated_bytes,
                reserved_bytes,
                peak_allocated_bytes: peaks.allocated.value.max(allocated_bytes),
                peak_reserved_bytes: peaks.reserved.value.max(reserved_bytes),
                peak_known: da.peak_known,
            }
        })
        .collect()
}

/// The devices to show: all, or the one asked for.
pub(crate) fn select_devices(replay: &Replay, device: Option<u32>) -> anyhow::Result<Vec<&DeviceReplay>> {
    let devices: Vec<&DeviceReplay> =
        replay.devices.iter().filter(|d| device.is_none() || device == Some(d.device)).collect();
    match device {
        Some(want) if devices.is_empty() => anyhow::bail!("device {want} is not in the snapshot"),
        _ => Ok(devices),
    }
}

pub fn file_name(p: &std::path::Path) -> String {
    if p.as_os_str() == "-" {
        return "-".into();
    }
    p.file_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| p.display().to_string())
}

/// Caveats about what the file lacks, as short sentences.
pub fn lacks(snap: &Snapshot) -> Vec<String> {
    let mut out = Vec::new();
    let events: u64 = snap.traces.iter().map(|t| t.entries()).sum();
    if !snap.source.has_trace_key || events == 0 {
        out.push("no trace: history was not recorded (_record_memory_history) or is empty; only the dump-time state is known".into());
    } else {
        if snap.source.events_with_frames == 0 {
            let dump_framed = snap.segments.iter().flat_map(|s| &s.blocks).any(|b| b.stack != StackId::EMPTY);
            out.push(if dump_framed {
                // `context="state"` records stacks for the blocks alive at the dump only.
                "no stacks in the trace: its events carry no frames, only the blocks alive at the dump do (as with context=\"state\"): \
                 lines are known for memory still held at the dump, not for memory freed before it"
                    .into()
            } else {
                "no stacks: trace events carry no frames (recorded with stacks=None or context=None)".into()
            });
        }
        let (blocks, bytes) = pre_trace_blocks(snap);
        if blocks > 0 {
            out.push(format!(
                "trace starts mid-run: {} ({}, {bytes} bytes) alive at dump were allocated before the first event ({}); they have no allocation stack",
                memsnap_model::count_of(blocks, "block"),
                memsnap_model::format_bytes(bytes, 2),
                snap.mid_run_cause()
            ));
        }
        // `_record_memory_history(skip_actions=[...])` leaves whole actions out (fixture f03).
        // Without free_requested a free is seen only when it completes, which is when the
        // allocator reuses the block: the replay stays exact, but "freed but pending" is unknown.
        // A ring of a few entries (the legacy `_record_memory_history(True)` keeps one) lacks
        // actions without skipping any: said only where the trace proves it.
        let facts = snap.trace_facts();
        if facts.iter().any(|f| f.free_requests_skipped) {
            out.push("no free_requested entries (recorded with skip_actions): frees are seen when they complete, so memory freed but still pending on another stream is not told apart".into());
        }
        if facts.iter().any(|f| f.allocs_skipped) {
            out.push("no alloc entries (recorded with skip_actions): blocks have no allocation stack and the peak cannot be established".into());
        }
        let untimed: u64 = facts.iter().map(|f| f.events_without_time).sum();
        if snap.profiler_converted() {
            out.push(profiler_caveat(snap));
        } else if untimed > 0 {
            out.push(format!("{untimed} trace events have no time_us (torch < 2.2 or a profiler-made file)"));
        }
    }
    let saturated: Vec<String> =
        snap.device_totals().iter().filter(|t| t.saturated).map(|t| t.device.to_string()).collect();
    if !saturated.is_empty() {
        out.push(format!(
            "sizes add up past 2^64 - 1 bytes on device {}: those totals are held at 18446744073709551615 (no real snapshot comes near)",
            saturated.join(", ")
        ));
    }
    if snap.source.has_cpp_frames {
        out.push(
            "C++ stacks present (stacks=\"all\"): native frames are shown but never named as the user's site".into(),
        );
    }
    if snap.source.legacy_history {
        out.push("legacy format (torch <= 2.0): block history instead of frames".into());
    }
    if snap.source.bare_segment_list {
        out.push("bare list of segments: no trace, no settings".into());
    }
    if snap.source.derived_addresses > 0 {
        out.push(format!(
            "{} blocks had no address; derived from segment address + sizes",
            snap.source.derived_addresses
        ));
    }
    out
}

/// Blocks allocated at dump time that have no `alloc` event in their device's trace: they
/// predate the trace. Returns (blocks, bytes).
pub fn pre_trace_blocks(snap: &Snapshot) -> (u64, u64) {
    use memsnap_model::BlockState;
    let mut blocks = 0;
    let mut bytes = 0;
    // Per traced device: its trace and its allocated blocks, (address, size) (only those
    // addresses are looked for among the trace's allocations).
    type Allocated = Vec<(u64, u64)>;
    let mut traced: std::collections::HashMap<u32, (&memsnap_model::DeviceTrace, Allocated)> =
        snap.traces.iter().filter(|tr| tr.entries() > 0).map(|tr| (tr.device, (tr, Vec::new()))).collect();
    for seg in &snap.segments {
        let Some((_, live)) = traced.get_mut(&seg.device) else { continue };
        live.extend(seg.blocks.iter().filter(|b| b.state == BlockState::Allocated).map(|b| (b.address, b.size)));
    }
    for (tr, live) in traced.values() {
        let mut addresses: Vec<u64> = live.iter().map(|b| b.0).collect();
        addresses.sort_unstable();
        addresses.dedup();
        let seen = tr.allocates_any_of(&addresses);
        for &(address, size) in live {
            if addresses.binary_search(&address).is_ok_and(|k| !seen[k]) {
                blocks += 1;
                bytes += size;
            }
        }
    }
    (blocks, bytes)
}

/// What a file made by `_profile_to_snapshot` cannot say (crates/memsnap-model/src/origin.rs).
fn profiler_caveat(snap: &Snapshot) -> String {
    let cpu = snap
        .profiler_cpu_device()
        .map_or(String::new(), |d| format!("; device {d} is CPU memory, which the converter files after the GPUs"));
    format!(
        "converted from profiler output (torch.cuda._memory_viz._profile_to_snapshot): each device's one segment is the address range of the tensors the profiler saw, not memory reserved from the GPU, so reserved is not established (null in JSON); the trace lists tensors made and destroyed, without times (a tensor written in place shows as freed and allocated again at its address), and frames name Python functions only, without files or lines{cpu}"
    )
}

/// Reserved bytes as the file establishes them: `None` for a profiler-converted file, whose
/// segments are made-up address ranges.
pub fn reserved_known(snap: &Snapshot, bytes: u64) -> Option<u64> {
    (!snap.profiler_converted()).then_some(bytes)
}
