//! `memsnap diff`: the two DDP ranks (devices 0 and 1, matched by position) show rank 1's
//! planted leak appearing; text and JSON; index matching, identity, and unreadable input.

use crate::common;

use common::memsnap;

use serde_json::Value;

fn json(args: &[&str]) -> Value {
    let r = memsnap(args);
    assert_eq!(r.code, Some(0), "{args:?}: {}", r.stderr);
    serde_json::from_str(&r.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", r.stdout))
}

const RANK0: &str = "fixtures/multi/m02_ddp_rank0.pickle";
const RANK1: &str = "fixtures/multi/m02_ddp_rank1.pickle";
const PIPELINE: &str = "fixtures/multi/m01_two_gpu_pipeline.pickle";

#[test]
fn ddp_ranks_text_shows_the_leak_appearing() {
    let r = memsnap(&["diff", RANK0, RANK1]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let t = &r.stdout;
    assert!(t.starts_with(&format!("memsnap diff: {RANK0} -> {RANK1}\n")), "{t}");
    assert!(t.contains("note: device indices differ (before: 0; after: 1); devices are matched by position"), "{t}");
    // Every suspect of rank 1 appears (rank 0 has none), the planted retained_graph among them.
    let rank1_suspects = json(&["analyze", "--json", RANK1])["suspects"].as_array().unwrap().len();
    let appeared: Vec<&str> = t.lines().filter(|l| l.trim_start().starts_with("appeared:")).collect();
    assert_eq!(appeared.len(), rank1_suspects, "{t}");
    assert!(appeared.iter().any(|l| l.contains("retained_graph on device 1") && l.contains("m02_ddp.py:")), "{t}");
    assert!(t.contains(&format!("({rank1_suspects} appeared, 0 vanished; matched by kind and site)")), "{t}");
    assert!(!t.contains("vanished:"), "{t}");
    assert!(t.contains("DEVICE 0 (before) vs DEVICE 1 (after)"), "{t}");
    // Peaks per fixtures/multi/README.md: 237,790,720 -> 487,775,744 bytes.
    let peak = t.lines().find(|l| l.trim_start().starts_with("peak allocated")).unwrap();
    assert!(peak.contains("226.77 MiB") && peak.contains("465.18 MiB") && peak.contains("+238.40 MiB"), "{peak}");
    assert!(t.contains("By category at peak:") && t.contains("Sites at end, largest changes first"), "{t}");

    // The other way round the leak vanishes.
    let r = memsnap(&["diff", RANK1, RANK0]);
    assert_eq!(r.code, Some(0));
    assert_eq!(
        r.stdout.lines().filter(|l| l.trim_start().starts_with("vanished:")).count(),
        rank1_suspects,
        "{}",
        r.stdout
    );
    assert!(!r.stdout.contains("appeared:"));
}

#[test]
fn ddp_ranks_json_agrees_with_analyze() {
    let d = json(&["diff", "--json", RANK0, RANK1]);
    let a0 = json(&["analyze", "--json", RANK0]);
    let a1 = json(&["analyze", "--json", RANK1]);
    assert_eq!(d["schema_version"], 1);
    assert_eq!(d["command"], "diff");
    assert_eq!(d["before"]["file"], "m02_ddp_rank0.pickle");
    assert_eq!(d["after"]["devices"], serde_json::json!([1]));
    assert_eq!(d["device_matching"], "position");
    assert_eq!(d["notes"].as_array().unwrap().len(), 1);
    assert_eq!(d["unmatched_devices"], serde_json::json!({"before": [], "after": []}));

    let dev = &d["devices"][0];
    assert_eq!((dev["before_device"].as_u64(), dev["after_device"].as_u64()), (Some(0), Some(1)));
    let (b, a) = (&a0["devices"][0], &a1["devices"][0]);
    for (key, from) in
        [("peak_allocated_bytes", "peak_allocated_bytes"), ("peak_reserved_bytes", "peak_reserved_bytes")]
    {
        assert_eq!(dev[key]["before"], b[from], "{key}");
        assert_eq!(dev[key]["after"], a[from], "{key}");
        assert_eq!(
            dev[key]["change"].as_i64().unwrap(),
            a[from].as_i64().unwrap() - b[from].as_i64().unwrap(),
            "{key}"
        );
    }
    assert_eq!(dev["end_allocated_bytes"]["after"], a["end"]["allocated_bytes"]);
    assert_eq!(dev["end_reserved_bytes"]["before"], b["end"]["reserved_bytes"]);
    for cat in ["activations", "gradients", "optimizer_state", "pre_trace", "temporaries", "other", "cached_free"] {
        let c = &dev["peak"]["by_category"][cat];
        assert_eq!(c["before"], b["peak"]["by_category"][cat], "{cat}");
        assert_eq!(c["after"], a["peak"]["by_category"][cat], "{cat}");
    }
    // Sites: only changed ones, largest change first, and each one's numbers add up.
    let sites = dev["end"]["by_site"].as_array().unwrap();
    assert!(!sites.is_empty());
    let changes: Vec<i64> = sites.iter().map(|s| s["change"].as_i64().unwrap()).collect();
    assert!(changes.windows(2).all(|w| w[0].abs() >= w[1].abs()), "{changes:?}");
    for s in sites {
        assert_ne!(s["change"], 0);
        assert_eq!(
            s["after_bytes"].as_i64().unwrap() - s["before_bytes"].as_i64().unwrap(),
            s["change"].as_i64().unwrap()
        );
    }

    // The planted leak appears: rank 0 has no suspect, so exactly rank 1's suspects appear, in
    // analyze's form and rank order, the planted retained_graph on device 1 among them.
    assert_eq!(a0["suspects"], serde_json::json!([]));
    assert_eq!(d["suspects"]["appeared"], a1["suspects"]);
    let appeared = d["suspects"]["appeared"].as_array().unwrap();
    assert!(appeared.iter().any(|s| s["kind"] == "retained_graph" && s["device"] == 1), "{appeared:?}");
    assert_eq!(d["suspects"]["vanished"], serde_json::json!([]));
    assert_eq!(d["suspects"]["persisting"], serde_json::json!([]));
}

#[test]
fn same_file_twice_changes_nothing() {
    let d = json(&["diff", "--json", RANK1, RANK1]);
    assert_eq!(d["device_matching"], "index");
    assert_eq!(d["notes"], serde_json::json!([]));
    let dev = &d["devices"][0];
    for key in ["peak_allocated_bytes", "peak_reserved_bytes", "end_allocated_bytes", "end_reserved_bytes"] {
        assert_eq!(dev[key]["change"], 0, "{key}");
    }
    assert_eq!(dev["peak"]["by_site"], serde_json::json!([]));
    assert_eq!(d["suspects"]["appeared"], serde_json::json!([]));
    assert_eq!(d["suspects"]["vanished"], serde_json::json!([]));
    let persisting = d["suspects"]["persisting"].as_array().unwrap();
    assert!(persisting.iter().any(|p| p["kind"] == "retained_graph"), "{persisting:?}");
    assert!(persisting.iter().all(|p| p["change"] == 0 && p["before_bytes"] == p["after_bytes"]), "{persisting:?}");
    let r = memsnap(&["diff", RANK1, RANK1]);
    assert!(
        r.stdout.contains("Sites at peak: no change") && r.stdout.contains("persisting: retained_graph"),
        "{}",
        r.stdout
    );
}

#[test]
fn devices_matched_by_index_when_one_side_is_a_subset() {
    // The pipeline file has devices 0 and 1; rank 1's file has device 1 only.
    let d = json(&["diff", "--json", PIPELINE, RANK1]);
    assert_eq!(d["device_matching"], "index");
    assert_eq!(d["devices"].as_array().unwrap().len(), 1);
    assert_eq!(
        (d["devices"][0]["before_device"].as_u64(), d["devices"][0]["after_device"].as_u64()),
        (Some(1), Some(1))
    );
    assert_eq!(d["unmatched_devices"]["before"][0]["device"], 0);
    assert!(d["notes"][0].as_str().unwrap().contains("device 0 only in before"), "{}", d["notes"]);
    let r = memsnap(&["diff", PIPELINE, RANK1]);
    assert!(r.stdout.contains("DEVICE 0 (only before)"), "{}", r.stdout);
}

#[test]
fn compressed_inputs_and_errors() {
    // A leak fixed between two runs: the suspect vanishes and the peak drops.
    let d = json(&[
        "diff",
        "--json",
        "fixtures/dev/s03_loss_history_leak.pickle.xz",
        "fixtures/dev/s01_clean_train.pickle.xz",
    ]);
    let vanished = d["suspects"]["vanished"].as_array().unwrap();
    assert!(vanished.iter().any(|s| s["kind"] == "retained_graph"), "{vanished:?}");
    assert!(d["devices"][0]["peak_allocated_bytes"]["change"].as_i64().unwrap() < 0);

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.pickle");
    std::fs::write(&bad, b"\x80\x04not really").unwrap();
    for args in [
        &["diff", RANK0, bad.to_str().unwrap()][..],
        &["diff", "fixtures/no/such.pickle", RANK1],
        &["diff", "-", "-"],
        &["diff", RANK0],
    ] {
        let r = memsnap(args);
        assert_eq!(r.code, Some(2), "{args:?}: {}", r.stderr);
        assert!(r.stdout.is_empty(), "{args:?}");
    }
    let r = memsnap(&["diff", RANK0, bad.to_str().unwrap()]);
    assert!(r.stderr.starts_with("memsnap: error: ") && r.stderr.contains("bad.pickle"), "{}", r.stderr);
}
