//! Goldens: the whole output of real runs, compared byte for byte with `tests/golden/`, so a
//! change to what a user reads shows in review. Most are runs that find something (a verdict
//! with its evidence and fix, a failed gate, a diff), not only clean runs.
//! `UPDATE_EXPECT=1 cargo test --profile ci --test cli golden` rewrites them (expect-test).

use crate::common::{memsnap, root};

/// Run `memsnap ARGS` (paths relative to the repository root, which the output quotes) and
/// compare stdout with `tests/golden/NAME`, and the exit code with `code`.
fn golden(name: &str, args: &[&str], code: i32) {
    let run = memsnap(args);
    assert_eq!(run.code, Some(code), "memsnap {}: {}", args.join(" "), run.stderr);
    expect_test::expect_file![root().join("tests/golden").join(name)].assert_eq(&run.stdout);
}

#[test]
fn golden_analyze_retained_graph() {
    golden("analyze_s03_retained_graph.txt", &["analyze", "fixtures/dev/s03_loss_history_leak.pickle.xz"], 0);
}

#[test]
fn golden_analyze_no_grad_missing() {
    golden("analyze_s02_no_grad_missing.txt", &["analyze", "fixtures/dev/s02_val_no_grad_missing.pickle.xz"], 0);
}

#[test]
fn golden_analyze_reference_leak() {
    golden("analyze_s06_closure_cache.txt", &["analyze", "fixtures/dev/s06_closure_cache.pickle.xz"], 0);
}

#[test]
fn golden_analyze_fragmentation() {
    golden("analyze_s07_fragmentation.txt", &["analyze", "fixtures/dev/s07_fragmentation.pickle.xz"], 0);
}

#[test]
fn golden_analyze_oom_json() {
    golden("analyze_s08_oom.json", &["analyze", "fixtures/dev/s08_oom.pickle.xz", "--json"], 0);
}

#[test]
fn golden_analyze_clean() {
    golden("analyze_s01_clean.txt", &["analyze", "fixtures/dev/s01_clean_train.pickle.xz"], 0);
}

#[test]
fn golden_check_fails_on_a_leak() {
    golden(
        "check_s03_fail_on_leaks.txt",
        &["check", "fixtures/dev/s03_loss_history_leak.pickle.xz", "--fail-on", "leaks", "--max-peak", "1GiB"],
        1,
    );
}

#[test]
fn golden_diff_clean_against_leak() {
    golden(
        "diff_s01_s03.txt",
        &["diff", "fixtures/dev/s01_clean_train.pickle.xz", "fixtures/dev/s03_loss_history_leak.pickle.xz"],
        0,
    );
}

#[test]
fn golden_summary_ring_wrap() {
    golden("summary_s11_ring_wrap.txt", &["summary", "fixtures/dev/s11_ring_wrap.pickle.xz"], 0);
}

#[test]
fn golden_segments_at_peak() {
    golden("segments_s07_peak.txt", &["segments", "fixtures/dev/s07_fragmentation.pickle.xz", "--at", "peak"], 0);
}

#[test]
fn golden_flamegraph_folded() {
    golden("flamegraph_s10_folded.txt", &["flamegraph", "fixtures/dev/s10_streams.pickle.xz", "--folded"], 0);
}
