//! `memsnap summary --json` against ground truth and across encodings of the same snapshot.
//!
//! - Every real snapshot in `fixtures/{dev,multi,extra}` (and `../shared/snapshots/dev` when
//!   present): per-device allocated/reserved bytes, segment and allocation counts equal the
//!   numbers the live process reported at dump time (`*.truth.json`).
//! - `fixtures/variants/` (made by `fixtures/gen/make_variants.py` from `s12_cuda_graph`): the
//!   same object re-pickled at protocols 0–5 and compressed gives the same summary; reshaped
//!   copies (legacy history, bare segment list, …) give the summary each shape implies.

use crate::common;

use std::path::{Path, PathBuf};

use common::{files_in, fixture, memsnap, memsnap_in, summary_json};
use serde_json::{json, Value};

// ------------------------------------------------------------------------------------------
// Truth

/// `NAME.truth.json` beside `NAME.pickle[.xz]` (`cpp_pickler.cpp.pickle` shares
/// `cpp_pickler.truth.json` with its Python-path twin).
fn truth_path(snapshot: &Path) -> PathBuf {
    let name = snapshot.file_name().unwrap().to_str().unwrap();
    let stem = &name[..name.find(".pickle").expect("a .pickle file")];
    let stem = stem.strip_suffix(".cpp").unwrap_or(stem);
    snapshot.with_file_name(format!("{stem}.truth.json"))
}

/// Compare one snapshot's summary with its truth file; returns the mismatches.
fn check_truth(snapshot: &Path) -> Vec<String> {
    let name = snapshot.display().to_string();
    let truth: Value = serde_json::from_slice(&std::fs::read(truth_path(snapshot)).unwrap()).unwrap();
    let out = summary_json(snapshot);
    // Multi-device truth files have `at_dump_per_device`; the others are one device (0).
    let per_device: Vec<(u64, &Value)> = match truth.get("at_dump_per_device").and_then(Value::as_object) {
        Some(m) => m.iter().map(|(d, v)| (d.parse().unwrap(), v)).collect(),
        None => vec![(truth.get("at_dump_device").and_then(Value::as_u64).unwrap_or(0), &truth["at_dump"])],
    };
    let devices = out["devices"].as_array().expect("devices");
    let mut bad = Vec::new();
    let got_ids: Vec<u64> = devices.iter().map(|d| d["device"].as_u64().unwrap()).collect();
    let want_ids: Vec<u64> = {
        let mut v: Vec<u64> = per_device.iter().map(|(d, _)| *d).collect();
        v.sort_unstable();
        v
    };
    if got_ids != want_ids {
        bad.push(format!("{name}: devices {got_ids:?}, truth has {want_ids:?}"));
    }
    for (dev, t) in per_device {
        let Some(d) = devices.iter().find(|d| d["device"] == dev) else { continue };
        let mut eq = |what: &str, got: &Value, want: &Value| {
            if got != want {
                bad.push(format!("{name}: device {dev}: {what} = {got}, truth {want}"));
            }
        };
        eq("allocated_bytes", &d["allocated_bytes"], &t["allocated"]);
        eq("reserved_bytes", &d["reserved_bytes"], &t["reserved"]);
        if let Some(n) = t.get("segment_count") {
            eq("segment_count", &d["segment_count"], n);
        }
        if let Some(n) = t.get("allocation_count") {
            eq("blocks_by_state.active_allocated", &d["blocks_by_state"]["active_allocated"], n);
        }
        if let Some(n) = t.get("active_bytes") {
            eq("active_bytes", &d["active_bytes"], n);
        }
        // Sanity: the numbers are real (a reader that finds nothing cannot pass by accident).
        assert!(t["allocated"].as_u64().unwrap() > 0, "{name}: truth without allocations");
    }
    bad
}

fn snapshots_in(dir: &Path) -> Vec<PathBuf> {
    files_in(dir, |n| n.contains(".pickle") && !n.ends_with(".json"))
}

#[test]
fn every_committed_snapshot_matches_its_truth() {
    let mut checked = 0;
    let mut bad = Vec::new();
    for (dir, at_least) in [("dev", 17), ("multi", 3), ("extra", 6)] {
        let files = snapshots_in(&fixture(dir));
        assert!(files.len() >= at_least, "fixtures/{dir}: {} snapshots, expected {at_least}", files.len());
        for f in files {
            bad.extend(check_truth(&f));
            checked += 1;
        }
    }
    assert!(bad.is_empty(), "{} of {checked} snapshots disagree with truth:\n{}", bad.len(), bad.join("\n"));
}

#[test]
#[cfg_attr(not(memsnap_shared), ignore = "needs ../shared beside the checkout")]
fn shared_dev_snapshots_match_their_truth() {
    let dir = common::root().join("../shared/snapshots/dev");
    assert!(dir.is_dir(), "{} is gone since the build detected it (touch build.rs)", dir.display());
    let files = files_in(&dir, |n| n.ends_with(".pickle"));
    assert!(files.len() >= 17, "{}: only {} snapshots", dir.display(), files.len());
    let bad: Vec<String> = files.iter().flat_map(|f| check_truth(f)).collect();
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

// ------------------------------------------------------------------------------------------
// Variants of one snapshot

fn base() -> Value {
    summary_json(&fixture("dev/s12_cuda_graph.pickle.xz"))
}

fn variant(name: &str) -> Value {
    summary_json(&fixture(&format!("variants/{name}")))
}

/// The summary without the fields that describe the encoding rather than the content.
fn content(v: &Value) -> Value {
    let mut v = v.clone();
    let o = v.as_object_mut().unwrap();
    for k in ["file", "pickle_bytes", "pickle_protocol", "producer"] {
        assert!(o.remove(k).is_some(), "summary lacks {k}");
    }
    v
}

fn device0(v: &Value) -> &Value {
    let devs = v["devices"].as_array().unwrap();
    assert_eq!(devs.len(), 1, "one device expected: {v}");
    &devs[0]
}

#[test]
fn base_variant_is_the_real_file() {
    // The variants are made from fixtures/dev/s12_cuda_graph: pin what that file holds, so the
    // comparisons below compare something (9 segments, a private pool, a trace).
    let b = base();
    let d = device0(&b);
    assert_eq!(d["allocated_bytes"], 104_354_816);
    assert_eq!(d["reserved_bytes"], 111_149_056);
    assert_eq!(d["segment_count"], 9);
    assert_eq!(d["block_count"], 18);
    assert_eq!(d["blocks_by_state"], json!({"active_allocated": 13, "active_pending_free": 0, "inactive": 5}));
    assert!(d["segments_by_pool"]["private"]["segments"].as_u64().unwrap() > 0);
    assert_eq!(d["trace_entries"], 61);
    assert_eq!(b["pickle_protocol"], 4);
    assert_eq!(b["producer"], "python-pickler");
    assert_eq!(b["unknown_keys"], json!({}));
}

#[test]
fn repickled_and_compressed_copies_give_identical_json() {
    let b = base();
    let want = content(&b);
    let p4_bytes = std::fs::metadata(fixture("variants/s12_p4.pickle")).unwrap().len();
    assert_eq!(b["pickle_bytes"], p4_bytes, "the base is the protocol-4 file, xz-compressed");
    let cases: &[(&str, u64)] = &[
        ("s12_p0.pickle", 0),
        // Protocol 1 has no PROTO opcode: it reads as protocol 0.
        ("s12_p1.pickle", 0),
        ("s12_p2.pickle", 2),
        ("s12_p3.pickle", 3),
        ("s12_p4.pickle", 4),
        ("s12_p5.pickle", 5),
        ("s12_p4.pickle.gz", 4),
        ("s12_p4.pickle.xz", 4),
        ("s12_p4.pickle.zst", 4),
        // zstd data under a .pickle name: detected by magic bytes, not by name.
        ("s12_p4_zstd_misnamed.pickle", 4),
        // Three NUL bytes after STOP, as in files embedded by _memory_viz.
        ("s12_trailing_nul.pickle", 4),
        // A frame filename with invalid UTF-8 (surrogatepass): decoded lossily, never fatal.
        ("s12_surrogate_filename.pickle", 4),
    ];
    for &(name, protocol) in cases {
        let v = variant(name);
        assert_eq!(v["pickle_protocol"], protocol, "{name}");
        assert_eq!(content(&v), want, "{name}: summary differs from the original");
    }
    assert_eq!(variant("s12_trailing_nul.pickle")["pickle_bytes"], p4_bytes + 3);
    for name in ["s12_p4.pickle.gz", "s12_p4.pickle.xz", "s12_p4.pickle.zst"] {
        assert_eq!(variant(name)["pickle_bytes"], p4_bytes, "{name}: decompressed size");
    }
}

#[test]
fn stdin_gives_the_same_summary_as_the_file() {
    for name in ["s12_p4.pickle.xz", "s12_p0.pickle", "s12_p4.pickle.zst"] {
        let bytes = std::fs::read(fixture(&format!("variants/{name}"))).unwrap();
        let run = memsnap_in(None, &["summary", "-", "--json"], Some(&bytes));
        let v = run.json();
        assert_eq!(v["file"], "-");
        assert_eq!(content(&v), content(&base()), "{name} through stdin");
    }
}

/// A snapshot saved with `torch.save(torch.cuda.memory._snapshot(), path)` on the GPU machine
/// (fixtures/gen/make_torch_save.py): a zip whose first entry, `data.pkl`, is the snapshot's
/// pickle. Read compressed, raw and through stdin, its totals are the live process's
/// (`t01_torch_save_snapshot.live.json`), and its producer is said.
#[test]
fn a_snapshot_saved_with_torch_save_is_read() {
    let live: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("formats/t01_torch_save_snapshot.live.json")).unwrap())
            .unwrap();
    let xz = fixture("formats/t01_torch_save_snapshot.pt.xz");
    let raw = common::unxz(&xz);
    assert!(raw.starts_with(b"PK\x03\x04"), "a zip archive");
    let dir = tempfile::tempdir().unwrap();
    let pt = dir.path().join("snap.pt");
    std::fs::write(&pt, &raw).unwrap();
    let from_stdin = memsnap_in(None, &["summary", "-", "--json"], Some(&raw)).json();
    for v in [summary_json(&xz), summary_json(&pt), from_stdin] {
        assert_eq!(v["producer"], "torch-save", "{v}");
        assert_eq!(v["pickle_protocol"], 2, "{v}");
        let d = device0(&v);
        assert_eq!(d["allocated_bytes"], live["allocated"], "{v}");
        assert_eq!(d["reserved_bytes"], live["reserved"], "{v}");
    }
}

#[test]
fn legacy_history_blocks_without_trace() {
    let b = base();
    let v = variant("s12_legacy_history.pickle");
    let (bd, vd) = (device0(&b), device0(&v));
    for k in [
        "allocated_bytes",
        "reserved_bytes",
        "active_bytes",
        "segment_count",
        "block_count",
        "blocks_by_state",
        "segments_by_pool",
    ] {
        assert_eq!(vd[k], bd[k], "{k}");
    }
    // requested_size now comes from history[-1].real_size.
    assert_eq!(vd["requested_bytes"], bd["requested_bytes"]);
    assert_eq!(vd["trace_entries"], 0);
    assert_eq!(vd["trace"], Value::Null);
    let caveats = v["caveats"].to_string();
    assert!(caveats.contains("legacy format (torch <= 2.0)"), "{caveats}");
    assert!(caveats.contains("no trace"), "{caveats}");
    assert_eq!(v["unknown_keys"], json!({}), "history is a known key");
}

#[test]
fn bare_list_of_segments() {
    let b = base();
    let v = variant("s12_bare_segments.pickle");
    let mut vd = device0(&v).clone();
    let mut bd = device0(&b).clone();
    for d in [&mut vd, &mut bd] {
        let o = d.as_object_mut().unwrap();
        o.remove("trace");
        o.remove("trace_entries");
    }
    assert_eq!(vd, bd, "dump-time state is all in the segments");
    assert_eq!(device0(&v)["trace_entries"], 0);
    assert_eq!(v["allocator_settings"], json!({}));
    assert!(v["caveats"].to_string().contains("bare list of segments"), "{}", v["caveats"]);
}

#[test]
fn blocks_without_address() {
    let b = base();
    let v = variant("s12_no_block_address.pickle");
    // Addresses derived from segment address + sizes give the same layout, so the same totals.
    assert_eq!(v["devices"], b["devices"]);
    let mut want = b["caveats"].as_array().unwrap().clone();
    want.push(json!("18 blocks had no address; derived from segment address + sizes"));
    assert_eq!(v["caveats"], Value::Array(want));
}

#[test]
fn active_awaiting_free_is_pending() {
    let b = base();
    let v = variant("s12_awaiting_free.pickle");
    let (bd, vd) = (device0(&b), device0(&v));
    assert_eq!(vd["blocks_by_state"], json!({"active_allocated": 10, "active_pending_free": 3, "inactive": 5}));
    // Pending blocks stay active (and requested) but are no longer allocated.
    assert_eq!(vd["active_bytes"], bd["active_bytes"]);
    assert_eq!(vd["requested_bytes"], bd["requested_bytes"]);
    assert_eq!(vd["reserved_bytes"], bd["reserved_bytes"]);
    assert!(vd["allocated_bytes"].as_u64() < bd["allocated_bytes"].as_u64());
    assert_eq!(v["unknown_keys"], json!({}));
}

#[test]
fn unknown_top_level_key_and_trace_action_are_counted() {
    let b = base();
    let v = variant("s12_unknown_key_action.pickle");
    assert_eq!(v["unknown_keys"], json!({"memsnap_test_extension": 1}));
    assert_eq!(v["unknown_actions"], json!({"teleport": 1}));
    let (bd, vd) = (device0(&b), device0(&v));
    assert_eq!(vd["trace_entries"], 62);
    assert_eq!(vd["trace"]["actions"]["other"], 1);
    assert_eq!(vd["trace"]["last_action"], "other");
    for k in
        ["allocated_bytes", "reserved_bytes", "active_bytes", "requested_bytes", "blocks_by_state", "segments_by_pool"]
    {
        assert_eq!(vd[k], bd[k], "{k}");
    }
}

#[test]
fn text_summary_reports_the_same_numbers() {
    let run = memsnap(&["summary", fixture("dev/s12_cuda_graph.pickle.xz").to_str().unwrap()]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let allocated = run.stdout.lines().find(|l| l.contains("Allocated memory")).expect("Allocated memory row");
    assert!(allocated.contains("104354816"), "{allocated}");
    let reserved = run.stdout.lines().find(|l| l.contains("GPU reserved memory")).expect("reserved row");
    assert!(reserved.contains("111149056"), "{reserved}");
    assert!(run.stdout.contains("pickle protocol 4, producer python-pickler"), "{}", run.stdout);
}

#[test]
fn completions_and_man_page_cover_every_command() {
    let commands =
        ["summary", "analyze", "timeline", "segments", "trace", "report", "flamegraph", "batch", "check", "diff"];
    let bash = common::memsnap(&["completions", "bash"]);
    assert_eq!(bash.code, Some(0), "{}", bash.stderr);
    for c in commands {
        assert!(bash.stdout.contains(&format!("memsnap,{c}")), "bash completion lacks {c}");
    }
    assert!(bash.stdout.contains("--max-inflight-bytes"), "options are completed too");
    for shell in ["zsh", "fish", "elvish", "powershell"] {
        let run = common::memsnap(&["completions", shell]);
        assert_eq!(run.code, Some(0), "{shell}: {}", run.stderr);
        assert!(run.stdout.contains("flamegraph"), "{shell}");
    }
    assert_eq!(common::memsnap(&["completions", "tcsh"]).code, Some(2));
    let man = common::memsnap(&["man"]);
    assert_eq!(man.code, Some(0), "{}", man.stderr);
    assert!(man.stdout.contains(".TH memsnap 1"), "roff header");
    for c in commands {
        assert!(man.stdout.contains(&format!("memsnap\\-{c}")), "man page lacks {c}");
    }
}

/// `--sequential-reader` (the VM alone) prints what the parallel reader prints, for the summary
/// read (no events kept) and for `analyze`, which keeps them; on files of several frames.
#[test]
fn the_sequential_reader_prints_the_same() {
    let mut compared = 0;
    let pickles = |d: &str| files_in(&fixture(d), |n| n.ends_with(".pickle.xz") || n.ends_with(".pickle"));
    for f in pickles("dev").into_iter().chain(pickles("extra")).take(12) {
        let path = f.to_string_lossy().into_owned();
        for cmd in [["summary", "--json"], ["analyze", "--json"]] {
            let parallel = memsnap(&[cmd[0], &path, cmd[1]]);
            let sequential = memsnap(&["--sequential-reader", cmd[0], &path, cmd[1]]);
            assert_eq!(parallel.code, Some(0), "{path}: {}", parallel.stderr);
            assert!(parallel.stdout == sequential.stdout, "{path}: {} differs with --sequential-reader", cmd[0]);
            compared += 1;
        }
    }
    assert!(compared >= 20, "compared {compared}");
}

/// Private pools are told apart by their id, as the live process's own `pool.snapshot()` /
/// `memory_snapshot(pool_id)` counted them: pools the program created (`MemPool`) `(0, N)`, and
/// the pool a CUDA graph captured without `pool=` made for itself `(N, 0)`.
#[test]
fn user_created_and_graph_private_pools_are_counted_apart() {
    let truth = |name: &str| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(fixture(&format!("formats/{name}.truth.json"))).unwrap()).unwrap()
    };
    let pools = |name: &str| {
        summary_json(&fixture(&format!("formats/{name}.pickle.xz")))["devices"][0]["segments_by_pool"].clone()
    };

    let t = truth("f01_mempool");
    let (mut segments, mut bytes) = (0, 0);
    for pool in t["mempools"].as_object().unwrap().values() {
        segments += pool["snapshot_segments"].as_u64().unwrap();
        bytes += pool["snapshot_total_size"].as_u64().unwrap();
    }
    let p = pools("f01_mempool");
    assert_eq!(
        (p["user_created"]["segments"].as_u64().unwrap(), p["user_created"]["bytes"].as_u64().unwrap()),
        (segments, bytes)
    );
    assert_eq!(p["graph_private"]["segments"], 0);
    assert_eq!(p["private"]["bytes"].as_u64().unwrap(), bytes);

    let t = truth("f02_cuda_graph_pool");
    let p = pools("f02_cuda_graph_pool");
    assert_eq!(p["graph_private"]["segments"], t["graph_pool_snapshot"]["segments"]);
    assert_eq!(p["graph_private"]["bytes"], t["graph_pool_snapshot"]["total_size"]);
    assert_eq!(p["user_created"]["segments"], 0);
}

/// A trace recorded with `skip_actions=["free_requested"]` replays exactly (the peaks-equal-truth
/// test covers it) and says what it lacks; a full trace does not.
#[test]
fn a_trace_without_free_requested_says_so() {
    let caveats = |f: &str| summary_json(&fixture(f))["caveats"].to_string();
    assert!(caveats("formats/f03_skip_actions.pickle.xz").contains("no free_requested entries"));
    assert!(!caveats("dev/s01_clean_train.pickle.xz").contains("free_requested"));
}

/// The legacy `_record_memory_history(True)` records a ring of one entry (`keep1`): s01's is a
/// `free_completed`, which proves nothing was skipped, and no allocation is in the trace, so all
/// live memory is pre-trace ("all of it"). The same file with requests left out whole still
/// says so, and so does its newest fifth, where allocations and completions of the same blocks
/// lie inside the window.
#[test]
fn a_ring_of_one_entry_is_not_taken_for_skipped_actions() {
    if common::without_python3(
        "a_ring_of_one_entry_is_not_taken_for_skipped_actions: no python3 to rewrite the fixture",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let s01 = fixture("dev/s01_clean_train.pickle.xz");
    let path = |setting: &str| common::rewritten(dir.path(), setting, &s01);
    let caveats = |setting: &str| summary_json(&path(setting))["caveats"].to_string();
    assert!(!caveats("keep1").contains("skip_actions"), "{}", caveats("keep1"));
    assert!(caveats("skip-free-requested").contains("no free_requested entries"));
    assert!(caveats("skip-free-requested+last20").contains("no free_requested entries"));
    let text = memsnap(&["analyze", path("keep1").to_str().unwrap()]).stdout;
    assert!(!text.contains("skip_actions"), "{text}");
    assert!(text.contains("By category at end: pre-trace (all of it: the trace records no allocation)"), "{text}");
}

/// Pinned host memory (`host_segments`, `host_traces`: torch >= 2.14) is reported on its own and
/// never mixed into a device total. g01 is the real f01 with host keys added in that shape
/// (fixtures/gen/make_formats.py), so its device numbers are f01's.
#[test]
fn host_memory_is_reported_apart_from_the_devices() {
    let with = summary_json(&fixture("formats/g01_host_memory.pickle.xz"));
    let without = summary_json(&fixture("formats/f01_mempool.pickle.xz"));
    let truth: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("formats/g01_host_memory.truth.json")).unwrap()).unwrap();
    assert_eq!(with["host_memory"], truth["host_memory"]);
    assert_eq!(without["host_memory"], serde_json::Value::Null);
    assert_eq!(with["devices"], without["devices"]);
    let unknown = with["unknown_keys"].as_array().cloned().unwrap_or_default();
    assert!(unknown.is_empty(), "{unknown:?}");
}

/// A file made by `torch.cuda._memory_viz._profile_to_snapshot` (real: fixture f07, PyTorch
/// 2.11) is recognised: its segments are address ranges the converter made up, so reserved and
/// everything drawn from the segments are null with a caveat, the device past the GPUs is named
/// CPU memory, no fragmentation is claimed of the made-up free space, and frames that carry only
/// a function name are shown by it.
#[test]
fn a_profiler_converted_file_claims_no_reserved_memory() {
    let path = fixture("formats/f07_profiler_converted.pickle.xz");
    let s = summary_json(&path);
    let caveats = s["caveats"].to_string();
    assert!(caveats.contains("converted from profiler output"), "{caveats}");
    assert!(caveats.contains("device 1 is CPU memory"), "{caveats}");
    assert!(!caveats.contains("have no time_us"), "one caveat, not two: {caveats}");
    for d in s["devices"].as_array().unwrap() {
        for k in ["reserved_bytes", "inactive_bytes", "inactive_split_bytes", "largest_free_block"] {
            assert!(d[k].is_null(), "{k}: {}", d[k]);
        }
        assert!(d["allocated_bytes"].as_u64().unwrap() > 0);
    }
    assert!(s["device_type"].is_null(), "the converter writes nothing that names the device");
    let text = memsnap(&["summary", path.to_str().unwrap()]).stdout;
    assert!(text.contains("device ID 1 (CPU memory)"), "{text}");
    assert!(text.contains("GPU reserved memory     |        not established"), "{text}");

    let a = memsnap(&["analyze", path.to_str().unwrap(), "--json"]).json();
    assert_eq!(a["suspects"], serde_json::json!([]), "no suspects on this clean run");
    let peak = &a["devices"][0]["peak"];
    assert!(peak["reserved_bytes"].is_null() && peak["by_category"]["cached_free"].is_null());
    let text = memsnap(&["analyze", path.to_str().unwrap()]).stdout;
    assert!(text.contains("  <built-in function linear>\n"), "function-only site: {text}");
    assert!(!text.contains("none:0"), "{text}");
}

/// Anomaly mode (`torch.autograd.set_detect_anomaly(True)`, real fixture f08) adds
/// `forward_frames` to trace entries, segments and blocks: read as known keys, and the planted
/// retained graph is still found at the backward line.
#[test]
fn anomaly_mode_forward_frames_are_known() {
    let path = fixture("formats/f08_anomaly_forward_frames.pickle.xz");
    let s = summary_json(&path);
    assert_eq!(s["unknown_keys"], serde_json::json!({}), "{}", s["unknown_keys"]);
    assert_eq!(s["device_type"]["name"], "cuda");
}

/// `annotate` entries (torch >= 2.14, `_annotate_tensor`; fixture g02 is the real f04 with them
/// added in that shape by fixtures/gen/make_formats.py) label the live block at their address
/// until it is freed, the newest text winning; one given after its block's free labels nothing.
/// They allocate nothing: the peaks test holds g02 to f04's truth.
#[test]
fn annotations_label_the_blocks_they_name() {
    let path = fixture("formats/g02_annotate.pickle.xz");
    let truth: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("formats/g02_annotate.truth.json")).unwrap()).unwrap();
    let s = summary_json(&path);
    assert_eq!(s["unknown_actions"], json!({}), "annotate is a known action");
    let actions = &s["devices"][0]["trace"]["actions"];
    assert_eq!(actions["annotate"], truth["annotate_entries"]);

    let a = memsnap(&["analyze", path.to_str().unwrap(), "--json"]).json();
    let end = &a["devices"][0]["end"]["by_metadata"];
    let bytes = |label: &str| {
        end.as_array().unwrap().iter().find(|l| l["label"] == label).map(|l| l["bytes"].as_u64().unwrap())
    };
    for (label, want) in truth["annotated"].as_object().unwrap() {
        assert_eq!(bytes(label), want.as_u64(), "{label} in {end}");
    }
    assert_eq!(bytes("kv-cache/0"), None, "the newer text replaced it");
    assert_eq!(bytes("stale"), None, "an annotation after the free labels nothing");
    let phases = a["devices"][0]["phases"]["labels"].to_string();
    assert!(!phases.contains("kv-cache"), "an annotation is not a phase: {phases}");
}

/// The segment table flags each segment's pool by its id: `u` for the MemPools of f01 (ids
/// `(0, 1)`, `(0, 2)`), `g` for the CUDA graph's own pool of f02 (`(1, 0)`), as many as the
/// summary counts.
#[test]
fn segment_table_flags_pools_by_kind() {
    let flagged = |name: &str, flag: char| {
        let path = fixture(&format!("formats/{name}.pickle.xz"));
        let out = memsnap(&["segments", path.to_str().unwrap()]).stdout;
        out.lines()
            .filter(|l| l.starts_with("0x") && l.split_whitespace().nth(2).is_some_and(|k| k.contains(flag)))
            .count() as u64
    };
    let pools = |name: &str| {
        summary_json(&fixture(&format!("formats/{name}.pickle.xz")))["devices"][0]["segments_by_pool"].clone()
    };
    let user = pools("f01_mempool")["user_created"]["segments"].as_u64().unwrap();
    assert!(user > 0);
    assert_eq!(flagged("f01_mempool", 'u'), user);
    assert_eq!(flagged("f01_mempool", 'g'), 0);
    assert_eq!(
        flagged("f02_cuda_graph_pool", 'g'),
        pools("f02_cuda_graph_pool")["graph_private"]["segments"].as_u64().unwrap()
    );
}

/// `summary` says what `torch.cuda.empty_cache()` right after the dump returns: on the three
/// `fixtures/cache` runs, the live process's drop in `memory_reserved()` (expandable segments
/// included: whole 20 MiB pages of their free blocks).
#[test]
fn empty_cache_returns_what_the_live_process_got_back() {
    let files = common::files_in(&common::fixture("cache"), |n| n.ends_with(".pickle.xz"));
    assert_eq!(files.len(), 3, "{files:?}");
    for path in files {
        let truth_path = path.to_str().unwrap().replace(".pickle.xz", ".truth.json");
        let truth: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&truth_path).unwrap()).unwrap();
        let out = common::summary_json(&path);
        assert_eq!(
            out["devices"][0]["empty_cache_returns_bytes"],
            truth["cache"]["empty_cache_returned"],
            "{}",
            path.display()
        );
    }
}
