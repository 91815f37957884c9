//! `memsnap check`: exit 0 when every gate passes, 1 with one stdout line per failed gate, 2 for
//! unreadable input or a malformed gate.

use crate::common;

use common::{memsnap, memsnap_in, root, Run};

const ALL_KINDS: [&str; 6] =
    ["oom", "retained_graph", "no_grad_missing", "unreleased_gradient", "reference_leak", "fragmentation"];
const RANK0: &str = "fixtures/multi/m02_ddp_rank0.pickle";
const RANK1: &str = "fixtures/multi/m02_ddp_rank1.pickle";
/// Peak allocated / reserved bytes of rank 1 (torch's max_allocated and the reserved at dump,
/// fixtures/multi/README.md).
const RANK1_PEAK: u64 = 487_775_744;
const RANK1_RESERVED: u64 = 538_968_064;

/// Kinds of the suspects `analyze` names in `file`, one entry per suspect.
fn suspect_kinds(file: &str) -> Vec<String> {
    let r = memsnap(&["analyze", "--json", file]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    v["suspects"].as_array().unwrap().iter().map(|s| s["kind"].as_str().unwrap().to_string()).collect()
}

/// `(args, exit code, failure lines on stdout)`: each case is data.
fn check(args: &[&str], code: i32, lines: usize) -> Run {
    let r = memsnap(args);
    assert_eq!(r.code, Some(code), "{args:?}\nstdout: {}\nstderr: {}", r.stdout, r.stderr);
    assert_eq!(r.stdout.lines().count(), lines, "{args:?}: {}", r.stdout);
    r
}

#[test]
fn gates_pass() {
    let r = check(&["check", RANK0, "--max-peak", "1GiB", "--max-reserved", "1GB", "--fail-on", "all"], 0, 0);
    assert!(r.stderr.contains("passed"), "{}", r.stderr);
    let peak = RANK1_PEAK.to_string();
    let reserved = RANK1_RESERVED.to_string();
    // A limit equal to the peak passes: a gate fails only when the peak exceeds it.
    check(&["check", RANK1, "--max-peak", &peak, "--max-reserved", &reserved], 0, 0);
    // Kinds that rank 1 does not have (comma-separated and repeated) pass.
    let present = suspect_kinds(RANK1);
    let absent: Vec<&str> = ALL_KINDS.into_iter().filter(|k| !present.iter().any(|p| p == k)).collect();
    assert!(absent.len() >= 2, "{present:?}");
    let first = absent[..absent.len() - 1].join(",");
    check(&["check", RANK1, "--fail-on", &first, "--fail-on", absent[absent.len() - 1]], 0, 0);
}

#[test]
fn each_failed_gate_is_one_line_and_exit_1() {
    let below = (RANK1_PEAK - 1).to_string();
    let r = check(&["check", RANK1, "--max-peak", &below], 1, 1);
    assert!(r.stdout.starts_with(&format!("{RANK1}: max-peak failed: device 1 peak allocated")), "{}", r.stdout);
    assert!(r.stdout.contains(&format!("({RANK1_PEAK} bytes) > limit")), "{}", r.stdout);

    let r = check(
        &["check", RANK1, "--max-peak", "400MiB", "--max-reserved", "500MB", "--fail-on", "retained_graph"],
        1,
        3,
    );
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert!(
        lines[0].contains("max-peak failed") && lines[0].contains("limit 400.00 MiB (419430400 bytes)"),
        "{}",
        lines[0]
    );
    assert!(lines[1].contains("max-reserved failed") && lines[1].contains("(500000000 bytes)"), "{}", lines[1]);
    assert!(
        lines[2].contains("fail-on retained_graph (leak) found: device 1") && lines[2].contains("m02_ddp.py:"),
        "{}",
        lines[2]
    );
    assert!(r.stderr.contains("FAILED (3 failures)"), "{}", r.stderr);

    // `leaks` is the severity `leak`: one line per suspect that grows without bound (rank 1 has
    // the planted retained_graph); rank 0 has none.
    let kinds = suspect_kinds(RANK1);
    assert!(kinds.iter().any(|k| k == "retained_graph"), "{kinds:?}");
    let out = memsnap(&["analyze", "--json", RANK1]).json();
    let growing = out["suspects"].as_array().unwrap().iter().filter(|s| s["severity"] == "leak").count();
    assert!(growing >= 1);
    let r = check(&["check", RANK1, "--fail-on", "leaks"], 1, growing);
    assert!(r.stdout.lines().all(|l| l.contains("(leak) found: device 1")), "{}", r.stdout);
    assert_eq!(suspect_kinds(RANK0), Vec::<String>::new());
    check(&["check", RANK0, "--fail-on", "leaks"], 0, 0);
    check(&["check", RANK0, "--fail-on", "all"], 0, 0);
    // A compressed dev fixture with an OOM, and 1.5G read as binary (1.5 × 2^30).
    let r = check(&["check", "fixtures/dev/s08_oom.pickle.xz", "--fail-on", "oom", "--max-peak", "1.5G"], 1, 2);
    assert!(r.stdout.contains("limit 1.50 GiB (1610612736 bytes)"), "{}", r.stdout);
}

#[test]
fn stdin_is_read_with_dash() {
    let data = std::fs::read(root().join(RANK1)).unwrap();
    let r = memsnap_in(None, &["check", "-", "--fail-on", "retained_graph"], Some(&data));
    assert_eq!(r.code, Some(1), "{}", r.stderr);
    assert!(r.stdout.starts_with("-: fail-on retained_graph (leak) found"), "{}", r.stdout);
}

#[test]
fn unknown_kind_lists_the_valid_ones_and_exits_2() {
    for file in [RANK0, "fixtures/no/such.pickle"] {
        let r = check(&["check", file, "--fail-on", "oom,retaind_graph"], 2, 0);
        assert!(r.stderr.contains("unknown suspect kind or severity \"retaind_graph\""), "{}", r.stderr);
        for kind in ALL_KINDS {
            assert!(r.stderr.contains(kind), "{kind} missing from: {}", r.stderr);
        }
    }
}

#[test]
fn unreadable_input_and_malformed_gates_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let good = std::fs::read(root().join(RANK0)).unwrap();
    let truncated = dir.path().join("truncated.pickle");
    std::fs::write(&truncated, &good[..good.len() / 3]).unwrap();
    let truncated = truncated.to_str().unwrap();
    let r = check(&["check", truncated, "--max-peak", "1GiB"], 2, 0);
    assert!(r.stderr.starts_with("memsnap: error: ") && r.stderr.contains("truncated.pickle"), "{}", r.stderr);
    assert_eq!(r.stderr.lines().count(), 1, "one line: {}", r.stderr);
    check(&["check", "fixtures/no/such.pickle", "--max-peak", "1GiB"], 2, 0);
    if root().join("fixtures/hostile/torch_save_zip.pt").exists() {
        check(&["check", "fixtures/hostile/torch_save_zip.pt", "--fail-on", "all"], 2, 0);
    }
    // No gate at all, a size that is not one, an empty kind list.
    check(&["check", RANK0], 2, 0);
    check(&["check", RANK0, "--max-peak", "20 gigs"], 2, 0);
    check(&["check", RANK0, "--max-peak", "-1"], 2, 0);
    check(&["check", RANK0, "--fail-on", ""], 2, 0);
}

/// z10 zeroes gradients at the top of the step and evaluates under `no_grad`, so the last
/// step's gradients (17.5 MiB, 9% of what the evaluation allocates at most) stay resident
/// through the evaluation: a true `unreleased_gradient` of severity `waste`. `--fail-on leaks`
/// passes it; naming the severity or the kind fails it.
#[test]
fn fail_on_leaks_passes_bounded_waste_and_severities_can_be_named() {
    let z10 = "fixtures/extra3/z10_grads_through_eval_waste.pickle.xz";
    check(&["check", z10, "--fail-on", "leaks"], 0, 0);
    let r = check(&["check", z10, "--fail-on", "waste"], 1, 1);
    assert!(r.stdout.contains("fail-on unreleased_gradient (waste) found"), "{}", r.stdout);
    check(&["check", z10, "--fail-on", "unreleased_gradient"], 1, 1);
    check(&["check", z10, "--fail-on", "peak"], 0, 0);
}

/// A file without a trace cannot establish its peak: `--max-peak` fails with a message instead
/// of passing on the dump-time value.
#[test]
fn max_peak_without_a_trace_fails_with_a_message() {
    let f = "fixtures/hostile/ok_shared_frames_tuple.pickle.xz";
    if !root().join(f).exists() {
        eprintln!("skipped: {f} absent");
        return;
    }
    let r = check(&["check", f, "--max-peak", "100TiB"], 1, 1);
    assert!(r.stdout.contains("is unknown: the file has no trace"), "{}", r.stdout);
}
