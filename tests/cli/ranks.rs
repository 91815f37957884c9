//! `memsnap ranks` and `memsnap diff RUN_A RUN_B`: the real DDP ranks of fixtures/multi (rank 1
//! has the planted leak) and the four-rank job of fixtures/ranks (rank 2 leaks after warmup,
//! dumped at iterations 3, 6 and 9): peaks equal the live processes' to the byte, the odd rank
//! out and why, growth over the run, producers' file names, unreadable and duplicate files,
//! run-against-run diffs, and the same bytes for every thread count.

use crate::common;

use common::{fixture, memsnap, memsnap_env};

use serde_json::Value;

const RANK0: &str = "fixtures/multi/m02_ddp_rank0.pickle";
const RANK1: &str = "fixtures/multi/m02_ddp_rank1.pickle";
const JOB: &str = "fixtures/ranks/r01_job";
const FIXED: &str = "fixtures/ranks/r01_job_fixed";

fn json(args: &[&str]) -> Value {
    let r = memsnap(args);
    assert_eq!(r.code, Some(0), "{args:?}: {}", r.stderr);
    serde_json::from_str(&r.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", r.stdout))
}

fn truth(job: &str) -> Value {
    let text = std::fs::read_to_string(common::root().join(job).join("truth.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn keys(v: &Value) -> Vec<&str> {
    let mut k: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    k.sort_unstable();
    k
}

fn kinds(rank: &Value) -> Vec<&str> {
    rank["suspects"].as_array().unwrap().iter().map(|s| s["kind"].as_str().unwrap()).collect()
}

/// A temporary directory with `files` copied in under new names: (fixture path, new relative path).
fn job_dir(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (from, to) in files {
        let to = dir.path().join(to);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(common::root().join(from), &to).unwrap();
    }
    dir
}

fn snapshot(job: &str, iteration: u32, rank: u32) -> String {
    format!("{job}/iteration_{iteration}/rank{rank}_memory_snapshot.pickle.xz")
}

#[test]
fn ddp_rank1_is_the_odd_one_out_for_its_retained_graph() {
    let r = memsnap(&["ranks", RANK0, RANK1]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let t = &r.stdout;
    assert!(t.starts_with("memsnap ranks: 2 ranks (2 files)\n\nRANKS\n"), "{t}");
    // fixtures/multi/README.md: max_allocated 237,790,720 (rank 0) and 487,775,744 (rank 1).
    assert!(t.contains("imbalance: 2.05 (max 465.18 MiB on rank 1, median 226.77 MiB, over 2 ranks)"), "{t}");
    let odd = t.lines().find(|l| l.starts_with("  odd one out:")).unwrap();
    assert!(
        odd.starts_with("  odd one out: rank 1. Rank 1 alone has retained_graph at fixtures/gen/m02_ddp.py:55"),
        "{odd}"
    );
    assert!(odd.contains("is 2.05 times the median of 2 ranks (226.77 MiB)."), "{odd}");

    let j = json(&["ranks", "--json", RANK0, RANK1]);
    let ranks = j["ranks"].as_array().unwrap();
    assert_eq!(ranks.iter().map(|r| r["rank"].as_u64().unwrap()).collect::<Vec<_>>(), [0, 1]);
    assert_eq!(ranks[0]["peak_allocated"], 237_790_720u64);
    assert_eq!(ranks[1]["peak_allocated"], 487_775_744u64);
    assert_eq!(ranks[1]["device"], 1);
    assert!(kinds(&ranks[0]).is_empty());
    assert!(kinds(&ranks[1]).contains(&"retained_graph"));
    let odd = j["odd_ones"].as_array().unwrap();
    assert_eq!(odd.len(), 1, "{odd:?}");
    assert_eq!(odd[0]["rank"], 1);
    assert!(odd[0]["why"].as_str().unwrap().contains("retained_graph"), "{}", odd[0]["why"]);
    assert!(odd[0]["alone"]
        .as_array()
        .unwrap()
        .iter()
        .any(|a| a["kind"] == "retained_graph" && a["kind_alone"] == true));
    assert_eq!(j["imbalance"]["ratio"], 2.051);
    // No iteration folders: no per-iteration parts.
    assert!(j.get("iterations").is_none() && j.get("growth_over_run").is_none());
}

#[test]
fn four_rank_job_peaks_equal_the_live_processes_to_the_byte() {
    for job in [JOB, FIXED] {
        peaks_equal_truth(job);
    }
}

fn peaks_equal_truth(job: &str) {
    let t = truth(job);
    let j = json(&["ranks", "--json", job]);
    let ranks = j["ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), 12);
    let mut checked = 0;
    for r in t["ranks"].as_array().unwrap() {
        for d in r["dumps"].as_array().unwrap() {
            let row = ranks
                .iter()
                .find(|x| x["rank"] == r["rank"] && x["iteration"] == d["iteration"])
                .unwrap_or_else(|| panic!("no row for rank {} iteration {}", r["rank"], d["iteration"]));
            assert_eq!(row["peak_allocated"], d["max_allocated"], "{row}");
            assert_eq!(row["peak_reserved"], d["max_reserved"], "{row}");
            assert_eq!(row["allocated_at_dump"], d["allocated"], "{row}");
            assert_eq!(row["reserved_at_dump"], d["reserved"], "{row}");
            assert_eq!(row["iteration_label"], format!("iteration_{}", d["iteration"]));
            checked += 1;
        }
    }
    assert_eq!(checked, 12);
    // Rows in iteration order, then rank order.
    let order: Vec<(u64, u64)> =
        ranks.iter().map(|r| (r["iteration"].as_u64().unwrap(), r["rank"].as_u64().unwrap())).collect();
    let mut sorted = order.clone();
    sorted.sort_unstable();
    assert_eq!(order, sorted);
}

#[test]
fn four_rank_job_rank2_is_odd_at_every_iteration_after_warmup() {
    let t = truth(JOB);
    let planted: Vec<u64> =
        t["planted_lines"].as_array().unwrap().iter().map(|p| p["line"].as_u64().unwrap()).collect();
    let j = json(&["ranks", "--json", JOB]);
    let iterations = j["iterations"].as_array().unwrap();
    assert_eq!(iterations.iter().map(|i| i["iteration"].as_u64().unwrap()).collect::<Vec<_>>(), [3, 6, 9]);
    // Iteration 3 is the end of warmup: nothing planted has run, the four ranks are alike.
    assert_eq!(iterations[0]["odd_ones"], serde_json::json!([]));
    assert_eq!(iterations[0]["imbalance"]["ratio"], 1.0);
    for it in &iterations[1..] {
        let odd = it["odd_ones"].as_array().unwrap();
        assert_eq!(odd.len(), 1, "{it}");
        assert_eq!(odd[0]["rank"], 2);
        assert_eq!(odd[0]["iteration"], it["iteration"]);
        let why = odd[0]["why"].as_str().unwrap();
        assert!(why.starts_with("Rank 2 alone has retained_graph at fixtures/gen/r01_ranks_job.py:"), "{why}");
        assert!(why.contains("no_grad_missing") && why.contains("times the median of 4 ranks"), "{why}");
        assert_eq!(it["imbalance"]["max_rank"], 2);
    }
    // The top-level imbalance and odd ones are those of the last iteration.
    assert_eq!(j["imbalance"], iterations[2]["imbalance"]);
    assert_eq!(j["odd_ones"], iterations[2]["odd_ones"]);
    // Rank 2's suspects are at the planted lines; the clean ranks have none.
    for r in j["ranks"].as_array().unwrap() {
        if r["rank"] == 2 && r["iteration"] != 3 {
            for s in r["suspects"].as_array().unwrap() {
                assert!(planted.contains(&s["site"]["line"].as_u64().unwrap()), "{s}");
            }
            assert!(kinds(r).contains(&"retained_graph"), "{r}");
        } else {
            assert!(kinds(r).is_empty(), "{r}");
        }
    }
    // Growth over the run: each rank's peak at 3, 6, 9; only rank 2 grows.
    let g = &j["growth_over_run"];
    assert_eq!(g["iteration_labels"], serde_json::json!(["iteration_3", "iteration_6", "iteration_9"]));
    let dumps = |rank: usize| -> Vec<Value> {
        t["ranks"][rank]["dumps"].as_array().unwrap().iter().map(|d| d["max_allocated"].clone()).collect()
    };
    for row in g["ranks"].as_array().unwrap() {
        let rank = row["rank"].as_u64().unwrap() as usize;
        assert_eq!(row["peak_allocated"].as_array().unwrap(), &dumps(rank));
        if rank == 2 {
            assert_eq!(row["change"], 511_627_776u64 - 222_936_576);
        } else {
            assert_eq!(row["change"], 0);
        }
    }

    let r = memsnap(&["ranks", JOB]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let text = &r.stdout;
    assert!(
        text.starts_with("memsnap ranks: 4 ranks, 3 iterations (12 files)\n\nITERATION 3 (iteration_3)\n"),
        "{text}"
    );
    assert_eq!(text.matches("  odd one out: rank 2. Rank 2 alone has retained_graph").count(), 2, "{text}");
    assert_eq!(text.matches("  odd one out: none").count(), 1, "{text}");
    let growth = text.split("GROWTH OVER THE RUN (peak allocated at each iteration)\n").nth(1).unwrap();
    let rank2 = growth.lines().find(|l| l.trim_start().starts_with("2 ")).unwrap();
    assert_eq!(
        rank2.split_whitespace().collect::<Vec<_>>(),
        ["2", "212.61", "MiB", "330.74", "MiB", "487.93", "MiB", "+275.32", "MiB"],
        "{rank2}"
    );
    // truth.json in the folder is not a snapshot: skipped, and said so.
    assert!(r.stderr.contains("1 other file in the directories skipped"), "{}", r.stderr);
}

#[test]
fn json_has_the_documented_keys() {
    let j = json(&["ranks", "--json", JOB]);
    assert_eq!(
        keys(&j),
        ["command", "files", "growth_over_run", "imbalance", "iterations", "odd_ones", "ranks", "schema_version"]
    );
    assert_eq!(j["command"], "ranks");
    assert_eq!(j["schema_version"], 1);
    assert_eq!(
        keys(&j["ranks"][0]),
        [
            "allocated_at_dump",
            "device",
            "devices",
            "error",
            "file",
            "growth",
            "iteration",
            "iteration_label",
            "peak_allocated",
            "peak_reserved",
            "rank",
            "reserved_at_dump",
            "suspects"
        ]
    );
    let suspect = &j["ranks"].as_array().unwrap().iter().find(|r| !kinds(r).is_empty()).unwrap()["suspects"][0];
    assert_eq!(
        keys(suspect),
        ["bytes", "device", "growth_bytes_per_iteration", "growth_unit", "kind", "label", "severity", "site"]
    );
    assert_eq!(keys(&j["odd_ones"][0]), ["alone", "iteration", "iteration_label", "peak_ratio", "rank", "why"]);
    assert_eq!(keys(&j["imbalance"]), ["max_peak_allocated", "max_rank", "median_peak_allocated", "ranks", "ratio"]);
    assert_eq!(keys(&j["iterations"][0]), ["imbalance", "iteration", "iteration_label", "odd_ones", "ranks"]);
    // Growth is allocated at the end of the trace minus at its start: the recording began before
    // any allocation, so it is the allocated bytes at dump.
    for r in j["ranks"].as_array().unwrap() {
        assert_eq!(r["growth"], r["allocated_at_dump"], "{r}");
    }
}

#[test]
fn producers_file_names_are_read_as_ranks() {
    // Megatron-LM's OOM snapshots.
    let dir = job_dir(&[(RANK0, "snapshot_oom_rank-0.pickle"), (RANK1, "snapshot_oom_rank-1.pickle")]);
    let p = dir.path().to_str().unwrap();
    let j = json(&["ranks", "--json", p]);
    assert_eq!(j["odd_ones"][0]["rank"], 1);
    assert!(j["ranks"][1]["file"].as_str().unwrap().ends_with("snapshot_oom_rank-1.pickle"));
    // Composer's rank{rank}.{batch}: the batch is the iteration.
    let dir = job_dir(&[
        (&snapshot(JOB, 3, 0), "rank0.3.memory_snapshot.pickle.xz"),
        (&snapshot(JOB, 3, 2), "rank2.3.memory_snapshot.pickle.xz"),
        (&snapshot(JOB, 9, 0), "rank0.9.memory_snapshot.pickle.xz"),
        (&snapshot(JOB, 9, 2), "rank2.9.memory_snapshot.pickle.xz"),
    ]);
    let j = json(&["ranks", "--json", dir.path().to_str().unwrap()]);
    let labels: Vec<&str> =
        j["iterations"].as_array().unwrap().iter().map(|i| i["iteration_label"].as_str().unwrap()).collect();
    assert_eq!(labels, ["batch 3", "batch 9"]);
    assert_eq!(j["odd_ones"][0]["rank"], 2);
    // `_r3` and a folder per rank.
    let dir = job_dir(&[(RANK0, "a/snap_r0.pickle"), (RANK1, "rank_1/snapshot.pickle")]);
    let j = json(&["ranks", "--json", dir.path().to_str().unwrap()]);
    assert_eq!(j["ranks"].as_array().unwrap().iter().map(|r| r["rank"].as_u64().unwrap()).collect::<Vec<_>>(), [0, 1]);
}

#[test]
fn files_without_a_rank_or_with_the_same_rank_are_refused() {
    // fixtures/multi also holds the one-process pipeline, which is nobody's rank.
    let r = memsnap(&["ranks", "fixtures/multi"]);
    assert_eq!(r.code, Some(2));
    assert!(r.stdout.is_empty());
    assert_eq!(r.stderr.lines().count(), 1, "{}", r.stderr);
    assert!(
        r.stderr.starts_with("memsnap: error: cannot tell the rank of 1 file: fixtures/multi/m01_two_gpu_pipeline.pickle (no rank in its name or folders"),
        "{}",
        r.stderr
    );
    let dir = job_dir(&[(RANK0, "rank0.pickle"), (RANK0, "old/rank_0.pickle"), (RANK1, "rank1.pickle")]);
    let r = memsnap(&["ranks", dir.path().to_str().unwrap()]);
    assert_eq!(r.code, Some(2));
    assert!(r.stderr.starts_with("memsnap: error: two files for one rank: "), "{}", r.stderr);
    assert!(r.stderr.contains("old/rank_0.pickle and ") && r.stderr.contains("/rank0.pickle"), "{}", r.stderr);
    let r = memsnap(&["ranks", "fixtures/ranks/no_such_run"]);
    assert_eq!(r.code, Some(2));
    assert!(r.stderr.starts_with("memsnap: error: fixtures/ranks/no_such_run: "), "{}", r.stderr);
}

#[test]
fn an_unreadable_rank_is_reported_in_its_row_and_the_others_analysed() {
    let dir = job_dir(&[
        (&snapshot(JOB, 9, 0), "rank0.pickle.xz"),
        (&snapshot(JOB, 9, 1), "rank1.pickle.xz"),
        (&snapshot(JOB, 9, 2), "rank2.pickle.xz"),
    ]);
    let bytes = std::fs::read(fixture("ranks/r01_job/iteration_9/rank3_memory_snapshot.pickle.xz")).unwrap();
    std::fs::write(dir.path().join("rank3.pickle.xz"), &bytes[..bytes.len() / 2]).unwrap();
    let p = dir.path().to_str().unwrap();

    let r = memsnap(&["ranks", p]);
    assert_eq!(r.code, Some(2), "{}", r.stderr);
    assert!(r.stdout.starts_with("memsnap ranks: 4 ranks (4 files, 1 unreadable)\n"), "{}", r.stdout);
    let row = r.stdout.lines().find(|l| l.trim_start().starts_with("3 ")).unwrap();
    assert!(row.starts_with("     3  unreadable: ") && row.ends_with("rank3.pickle.xz"), "{row}");
    // The readable ranks are compared among themselves.
    assert!(r.stdout.contains("over 3 ranks") && r.stdout.contains("odd one out: rank 2."), "{}", r.stdout);
    assert_eq!(r.stderr.lines().count(), 1, "{}", r.stderr);
    assert!(r.stderr.starts_with("memsnap: error: ") && r.stderr.contains("rank3.pickle.xz: "), "{}", r.stderr);

    let r = memsnap(&["ranks", "--json", p]);
    assert_eq!(r.code, Some(2));
    let j: Value = serde_json::from_str(&r.stdout).unwrap();
    let ranks = j["ranks"].as_array().unwrap();
    assert!(ranks[3]["error"].is_string() && ranks[3]["peak_allocated"].is_null(), "{}", ranks[3]);
    for r in &ranks[..3] {
        assert!(r["error"].is_null() && r["peak_allocated"].is_u64(), "{r}");
    }
    assert_eq!(j["imbalance"]["ranks"], 3);
}

#[test]
fn diff_of_two_iteration_folders_pairs_the_ranks() {
    let (a, b) = (format!("{JOB}/iteration_3"), format!("{JOB}/iteration_9"));
    let r = memsnap(&["diff", &a, &b]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let t = &r.stdout;
    assert!(t.starts_with(&format!("memsnap diff: {a} -> {b} (4 pairs of files, paired by rank)\n")), "{t}");
    let appeared: Vec<&str> = t.lines().filter(|l| l.trim_start().starts_with("appeared:")).collect();
    assert_eq!(appeared.len(), 2, "{t}");
    assert!(appeared[0].contains("retained_graph at fixtures/gen/r01_ranks_job.py:105"), "{t}");
    let rank2 = t.lines().find(|l| l.trim_start().starts_with("2 ")).unwrap();
    assert!(rank2.contains("212.61 MiB") && rank2.contains("487.93 MiB") && rank2.contains("+275.32 MiB"), "{rank2}");
    assert!(t.ends_with(&format!("in full: memsnap diff {} {}\n", snapshot(JOB, 3, 2), snapshot(JOB, 9, 2))), "{t}");

    let j = json(&["diff", "--json", &a, &b]);
    assert_eq!(j["pairing"], "rank");
    let ranks = j["ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), 4);
    for r in ranks {
        // Each pair's diff is the two-file diff of its files.
        let two =
            json(&["diff", "--json", r["before"]["file"].as_str().unwrap(), r["after"]["file"].as_str().unwrap()]);
        assert_eq!(r["diff"], two);
        let appeared = r["diff"]["suspects"]["appeared"].as_array().unwrap();
        assert_eq!(appeared.is_empty(), r["rank"] != 2, "{r}");
    }
}

#[test]
fn diff_of_two_runs_pairs_rank_and_iteration_and_names_the_unpaired() {
    let j = json(&["diff", "--json", JOB, FIXED]);
    assert_eq!(j["pairing"], "rank_and_iteration");
    let ranks = j["ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), 12);
    for r in ranks {
        assert_eq!(r["before"]["iteration"], r["after"]["iteration"]);
        let vanished: Vec<&str> =
            r["diff"]["suspects"]["vanished"].as_array().unwrap().iter().map(|s| s["kind"].as_str().unwrap()).collect();
        let leaked = r["rank"] == 2 && r["before"]["iteration"] != 3;
        assert_eq!(vanished.contains(&"retained_graph"), leaked, "{r}");
    }
    // A rank one run lacks is named, not compared.
    let dir = job_dir(&[(&snapshot(JOB, 9, 0), "rank0.pickle.xz"), (&snapshot(JOB, 9, 2), "rank2.pickle.xz")]);
    let r = memsnap(&["diff", &format!("{FIXED}/iteration_9"), dir.path().to_str().unwrap()]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(r.stdout.contains("\nonly in before (not compared):\n  rank 1, iteration_9 (fixtures/ranks/r01_job_fixed/iteration_9/rank1_memory_snapshot.pickle.xz)\n  rank 3, iteration_9"), "{}", r.stdout);
    // A run of several iterations against one iteration: which to pair is not guessed.
    let r = memsnap(&["diff", JOB, &format!("{FIXED}/iteration_9")]);
    assert_eq!(r.code, Some(2));
    assert!(
        r.stderr.contains("has dumps of several iterations (iteration_3, iteration_6, iteration_9)"),
        "{}",
        r.stderr
    );
    // A directory against a file.
    let r = memsnap(&["diff", JOB, RANK0]);
    assert_eq!(r.code, Some(2));
    assert!(r.stderr.starts_with(&format!("memsnap: error: {JOB} is a directory and {RANK0} is not")), "{}", r.stderr);
}

#[test]
fn output_is_the_same_for_every_thread_count() {
    let inputs: [&[&str]; 4] =
        [&["ranks", JOB], &["ranks", "--json", FIXED], &["ranks", RANK1, RANK0], &["diff", "--json", JOB, FIXED]];
    for args in inputs {
        let one = memsnap_env(None, args, None, &[("RAYON_NUM_THREADS", "1")]);
        let two = memsnap_env(None, args, None, &[("RAYON_NUM_THREADS", "2")]);
        assert_eq!(one.code, Some(0), "{args:?}: {}", one.stderr);
        assert!(one.stdout_bytes == two.stdout_bytes, "{args:?} differs between 1 and 2 threads");
    }
}
