//! The replay against the real snapshots in `../shared/snapshots/dev/`: every counter PyTorch
//! reported at dump time, the peaks, and the self-check.

use std::path::{Path, PathBuf};

use crate::common;

use common::{map_layout, snapshot_layout};
use memsnap_model::{read_snapshot, BlockState, Snapshot};
use memsnap_replay::{replay, DeviceReplay};

/// The shared dev snapshots (the tests that call this are ignored when the build found none).
fn dev_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/snapshots/dev");
    assert!(dir.is_dir(), "{} is gone since the build detected it (touch build.rs)", dir.display());
    dir
}

/// Every dev snapshot with its truth file (`cpp_pickler.cpp.pickle` shares `cpp_pickler`'s).
fn dev_files(dir: &Path) -> Vec<(String, PathBuf, PathBuf)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if let Some(stem) = name.strip_suffix(".pickle") {
            let truth_stem = stem.strip_suffix(".cpp").unwrap_or(stem);
            out.push((stem.to_string(), path.clone(), dir.join(format!("{truth_stem}.truth.json"))));
        }
    }
    out.sort();
    out
}

struct Truth {
    allocated: u64,
    reserved: u64,
    max_allocated: u64,
    max_reserved: u64,
    active: u64,
}

fn truth(path: &Path) -> Truth {
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let at = &v["at_dump"];
    let get = |k: &str| at[k].as_u64().unwrap_or_else(|| panic!("{}: at_dump.{k}", path.display()));
    Truth {
        allocated: get("allocated"),
        reserved: get("reserved"),
        max_allocated: get("max_allocated"),
        max_reserved: get("max_reserved"),
        active: get("active_bytes"),
    }
}

fn load(path: &Path) -> Snapshot {
    read_snapshot(&std::fs::read(path).unwrap()).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn device0(snapshot: &Snapshot) -> DeviceReplay {
    let mut r = replay(snapshot);
    assert_eq!(r.devices.len(), 1, "the dev files use one device");
    r.devices.remove(0)
}

/// Every dev file: end counters, peaks, and the self-check, to the byte. Each of these traces
/// covers its process's peak (s11's ring buffer wrapped, but after the peak; s08's OOM creates
/// no block), so the peaks must match too.
#[test]
#[cfg_attr(not(memsnap_shared), ignore = "needs ../shared beside the checkout")]
fn dev_files_replay_exactly() {
    let dir = dev_dir();
    let mut failures = Vec::new();
    for (name, path, truth_path) in dev_files(&dir) {
        let t = truth(&truth_path);
        let snapshot = load(&path);
        let d = device0(&snapshot);
        let end = d.series.after(d.event_count.checked_sub(1));
        let row = format!(
            "{name}: peak allocated {} (truth {}), peak reserved {} (truth {}), end allocated {} (truth {}), \
             end reserved {} (truth {}), active {} (truth {}), matches {} ({} mismatches: {:?}), diagnostics {:?}",
            d.peaks.allocated.value,
            t.max_allocated,
            d.peaks.reserved.value,
            t.max_reserved,
            end.allocated,
            t.allocated,
            end.reserved,
            t.reserved,
            end.active,
            t.active,
            d.check.matches_snapshot,
            d.check.mismatch_count,
            d.check.mismatches.iter().map(ToString::to_string).collect::<Vec<_>>(),
            d.diagnostics.iter().map(ToString::to_string).collect::<Vec<_>>(),
        );
        // The snapshot's own blocks give requested bytes (no truth file has them).
        let requested: u64 = snapshot
            .segments
            .iter()
            .flat_map(|s| &s.blocks)
            .filter(|b| b.state != BlockState::Inactive)
            .map(|b| b.requested_size)
            .sum();
        let exact = d.peaks.allocated.value == t.max_allocated
            && end.requested == requested
            && d.peaks.reserved.value == t.max_reserved
            && end.allocated == t.allocated
            && end.reserved == t.reserved
            && end.active == t.active
            && d.check.matches_snapshot
            && d.diagnostic_count == 0;
        eprintln!("{} {row}", if exact { "exact" } else { "NOT EXACT" });
        eprintln!(
            "    start: complete {}, segments {}, blocks {}, uncertain {} blocks / {} bytes; peak at event {:?}",
            d.start.trace_complete,
            d.start.segments,
            d.start.blocks,
            d.start.uncertain_blocks.len(),
            d.start.uncertain_bytes,
            d.peaks.allocated.event_index
        );
        if !exact {
            failures.push(row);
        }
    }
    assert!(failures.is_empty(), "not exact:\n{}", failures.join("\n"));
}

/// The layout rebuilt from lifetimes after the last event is the snapshot's segment table.
#[test]
#[cfg_attr(not(memsnap_shared), ignore = "needs ../shared beside the checkout")]
fn state_at_end_is_the_snapshot() {
    let dir = dev_dir();
    for (name, path, _) in dev_files(&dir) {
        let snapshot = load(&path);
        let d = device0(&snapshot);
        assert!(
            map_layout(&d.state_at_end()) == snapshot_layout(&snapshot),
            "{name}: state_at_end differs from the snapshot"
        );
    }
}

/// 1 and 3 threads give the same replay, on every dev file.
#[test]
#[cfg_attr(not(memsnap_shared), ignore = "needs ../shared beside the checkout")]
fn thread_count_does_not_change_the_result() {
    let dir = dev_dir();
    let pool = |n| rayon::ThreadPoolBuilder::new().num_threads(n).build().unwrap();
    let (one, three) = (pool(1), pool(3));
    for (name, path, _) in dev_files(&dir) {
        let snapshot = load(&path);
        assert!(one.install(|| replay(&snapshot)) == three.install(|| replay(&snapshot)), "{name}");
    }
}
