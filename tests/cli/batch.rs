//! `memsnap batch`: one row per input file over directories, globs and bad files; exit codes;
//! JSONL and CSV (Parquet in batch_parquet.rs); byte-identical output for every `--jobs` and
//! memory budget.

use crate::common;

use std::path::Path;

use common::{memsnap, root};

use serde_json::Value;

fn jsonl(text: &str) -> Vec<Value> {
    text.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"))).collect()
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// The names a directory walk picks, as docs/batch.md states the rule.
fn snapshot_name(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    let base = [".gz", ".gzip", ".zst", ".zstd", ".xz"].iter().find_map(|e| lower.strip_suffix(e)).unwrap_or(&lower);
    !name.starts_with('.') && (base.ends_with(".pickle") || base.ends_with(".pkl"))
}

/// Snapshot-named files under `dir` (given relative to the root), walked like batch walks:
/// entries sorted by name, directories entered where they sort.
fn walk(dir: &Path) -> Vec<String> {
    let mut names: Vec<_> = std::fs::read_dir(root().join(dir)).unwrap().map(|e| e.unwrap().file_name()).collect();
    names.sort();
    let mut out = Vec::new();
    for n in names {
        let rel = dir.join(&n);
        if root().join(&rel).is_dir() {
            if !n.to_string_lossy().starts_with('.') {
                out.extend(walk(&rel));
            }
        } else if snapshot_name(&n.to_string_lossy()) {
            out.push(rel.display().to_string());
        }
    }
    out
}

/// A few unreadable files of our own, so the test does not depend on what fixtures/hostile
/// holds at the moment; plus sidecars a directory walk must skip.
fn bad_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let good = std::fs::read(root().join("fixtures/multi/m02_ddp_rank0.pickle")).unwrap();
    std::fs::write(dir.path().join("a_truncated.pickle"), &good[..good.len() / 2]).unwrap();
    std::fs::write(dir.path().join("b_json.pkl"), b"{\"segments\": []}").unwrap();
    std::fs::write(dir.path().join("c_empty.pickle.gz"), b"").unwrap();
    std::fs::write(dir.path().join("d_garbage.pickle.xz"), b"\xfd7zXZ\x00garbage").unwrap();
    std::fs::write(dir.path().join("notes.txt"), b"not a snapshot").unwrap();
    std::fs::write(dir.path().join("e.truth.json"), b"{}").unwrap();
    std::fs::write(dir.path().join(".hidden.pickle"), &good).unwrap();
    dir
}

#[test]
fn rows_for_every_file_including_unreadable_ones_and_exit_2() {
    let bad = bad_dir();
    let out = tempfile::tempdir().unwrap();
    let rows_path = out.path().join("rows.jsonl");
    let mut dirs = vec!["fixtures/dev", "fixtures/multi"];
    if root().join("fixtures/hostile").is_dir() {
        dirs.push("fixtures/hostile");
    } else {
        eprintln!("note: fixtures/hostile is absent; using only the test's own bad files");
    }
    let mut args = vec!["batch"];
    args.extend(&dirs);
    args.extend([s(bad.path()), "-o", s(&rows_path)]);
    let r = memsnap(&args);
    assert_eq!(r.code, Some(2), "{}", r.stderr);
    assert!(r.stdout.is_empty(), "rows go to -o, not stdout: {}", r.stdout);
    let rows = jsonl(&std::fs::read_to_string(&rows_path).unwrap());

    let mut expected: Vec<String> = dirs.iter().flat_map(|d| walk(Path::new(d))).collect();
    for n in ["a_truncated.pickle", "b_json.pkl", "c_empty.pickle.gz", "d_garbage.pickle.xz"] {
        expected.push(bad.path().join(n).display().to_string());
    }
    let paths: Vec<&str> = rows.iter().map(|r| r["path"].as_str().unwrap()).collect();
    assert_eq!(paths, expected, "one row per snapshot file, in walk order; sidecars and hidden files skipped");

    for row in &rows {
        assert_eq!(row["schema_version"], 1);
        let path = row["path"].as_str().unwrap();
        // fixtures/hostile/README.md: files named ok_* are valid but adversarial.
        let readable =
            path.starts_with("fixtures/dev/") || path.starts_with("fixtures/multi/") || path.contains("/ok_");
        if readable {
            assert!(row["error"].is_null(), "{path}: {}", row["error"]);
            assert!(!row["devices"].as_array().unwrap().is_empty(), "{path}");
            // A file without a trace cannot establish its peak: null, never the dump value.
            match row["peak_allocated_bytes"].as_u64() {
                Some(peak) => assert!(peak >= row["per_device"][0]["allocated_bytes"].as_u64().unwrap()),
                None => assert!(path.contains("/ok_"), "{path}: a traced snapshot has a peak"),
            }
            assert!(row["file_bytes"].as_u64().unwrap() > 0);
        } else {
            // Every other hostile file and every bad file of ours is unreadable: an error row that
            // says why, and no figures.
            let e = row["error"].as_str().unwrap_or_else(|| panic!("{path}: expected an error row"));
            assert!(!e.is_empty() && !e.contains(path), "{path}: the reason without the path: {e}");
            assert!(row["devices"].is_null() && row["peak_allocated_bytes"].is_null(), "{path}");
        }
    }
    let errors = rows.iter().filter(|r| !r["error"].is_null()).count();
    assert!(r.stderr.contains(&format!("{} rows ({errors} unreadable)", rows.len())), "{}", r.stderr);
}

#[test]
fn readable_inputs_exit_0_and_two_ddp_ranks_show_the_odd_one_out() {
    let r = memsnap(&["batch", "fixtures/multi/m02_ddp_rank0.pickle", "fixtures/multi/m02_ddp_rank1.pickle"]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let rows = jsonl(&r.stdout);
    assert_eq!(rows.len(), 2, "JSON Lines on stdout by default");
    let (r0, r1) = (&rows[0], &rows[1]);
    assert_eq!(r0["path"], "fixtures/multi/m02_ddp_rank0.pickle");
    assert_eq!((r0["devices"].clone(), r1["devices"].clone()), (serde_json::json!([0]), serde_json::json!([1])));
    // Truth (fixtures/multi/README.md): at dump and torch's max_allocated per rank.
    assert_eq!((r0["allocated_bytes"].as_u64(), r0["reserved_bytes"].as_u64()), (Some(144_384_512), Some(299_892_736)));
    assert_eq!((r1["allocated_bytes"].as_u64(), r1["reserved_bytes"].as_u64()), (Some(434_107_392), Some(538_968_064)));
    assert_eq!(r0["peak_allocated_bytes"].as_u64(), Some(237_790_720));
    assert_eq!(r1["peak_allocated_bytes"].as_u64(), Some(487_775_744));
    assert_eq!(r1["peak_device"], 1);
    // The planted leak is on rank 1 only.
    assert_eq!(r0["suspect_count"], 0);
    assert_eq!(r0["top_suspects"], serde_json::json!([]));
    // Rank 1 may have more than one suspect (the held-out forward also lacks no_grad); the
    // planted retained_graph is among them, on device 1, at the generator's line.
    let top = r1["top_suspects"].as_array().unwrap();
    assert_eq!(top.len(), r1["suspect_count"].as_u64().unwrap().min(3) as usize);
    let leak =
        top.iter().find(|s| s["kind"] == "retained_graph").unwrap_or_else(|| panic!("no retained_graph: {top:?}"));
    assert_eq!(leak["device"], 1);
    assert_eq!(leak["severity"], "leak", "{leak}");
    assert!(leak["site"]["filename"].as_str().unwrap().ends_with("m02_ddp.py"), "{leak}");
    assert!(r1["caveats"].as_array().unwrap().iter().any(|c| c.as_str().unwrap().contains("trace starts mid-run")));
}

#[test]
fn identical_bytes_for_every_job_count_and_budget() {
    let bad = bad_dir();
    let out = tempfile::tempdir().unwrap();
    // Parquet is converted from the JSON Lines rows at the end: the same rows, the same bytes.
    for ext in ["jsonl", "csv", "parquet"] {
        let mut outputs = Vec::new();
        for (jobs, budget) in [("1", None), ("2", None), ("4", None), ("3", Some("1B"))] {
            let path = out.path().join(format!("rows-{jobs}.{ext}"));
            let mut args = vec![
                "batch",
                "fixtures/dev",
                "fixtures/multi",
                "fixtures/extra",
                s(bad.path()),
                "-o",
                s(&path),
                "--jobs",
                jobs,
            ];
            if let Some(b) = budget {
                args.extend(["--max-inflight-bytes", b]);
            }
            let r = memsnap(&args);
            assert_eq!(r.code, Some(2), "{}", r.stderr);
            outputs.push(std::fs::read(&path).unwrap());
        }
        assert!(outputs[0].len() > 1000);
        assert_eq!(outputs[0].starts_with(b"PAR1"), ext == "parquet", "{ext}");
        for o in &outputs[1..] {
            assert!(o == &outputs[0], "{ext}: output differs between job counts");
        }
    }
}

/// A minimal RFC 4180 reader: enough for the rows batch writes.
fn csv_rows(text: &str) -> Vec<Vec<String>> {
    let mut rows = Vec::new();
    let (mut row, mut field, mut quoted, mut chars) = (Vec::new(), String::new(), false, text.chars().peekable());
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                field.push('"');
                chars.next();
            }
            ('"', _) => quoted = !quoted,
            (',', false) => row.push(std::mem::take(&mut field)),
            ('\n', false) => {
                row.push(std::mem::take(&mut field));
                rows.push(std::mem::take(&mut row));
            }
            _ => field.push(c),
        }
    }
    rows
}

#[test]
fn csv_has_a_header_and_one_line_per_file() {
    let bad = bad_dir();
    let out = tempfile::tempdir().unwrap();
    let path = out.path().join("rows.csv");
    let r = memsnap(&["batch", "fixtures/multi", s(&bad.path().join("b_json.pkl")), "-o", s(&path)]);
    assert_eq!(r.code, Some(2), "{}", r.stderr);
    let text = std::fs::read_to_string(&path).unwrap();
    let rows = csv_rows(&text);
    let header = &rows[0];
    assert_eq!(header[0], "path");
    assert_eq!(header.last().unwrap(), "error");
    assert!(rows.iter().all(|r| r.len() == header.len()), "every line has every column");
    let col = |name: &str| header.iter().position(|h| h == name).unwrap_or_else(|| panic!("no column {name}"));
    let body = &rows[1..];
    assert_eq!(body.len(), 4, "three snapshots in fixtures/multi and the bad file");
    let rank1 = body.iter().find(|r| r[0].ends_with("m02_ddp_rank1.pickle")).unwrap();
    assert_eq!(rank1[col("devices")], "1");
    assert_eq!(rank1[col("allocated_bytes")], "434107392");
    let kinds: Vec<&str> = rank1[col("top_suspect_kinds")].split(';').collect();
    let sites: Vec<&str> = rank1[col("top_suspect_sites")].split(';').collect();
    let severities: Vec<&str> = rank1[col("top_suspect_severities")].split(';').collect();
    assert_eq!((kinds.len(), severities.len()), (sites.len(), sites.len()), "{rank1:?}");
    let leak = kinds.iter().position(|k| *k == "retained_graph").unwrap_or_else(|| panic!("{rank1:?}"));
    assert!(sites[leak].contains("m02_ddp.py:"), "{rank1:?}");
    assert_eq!(severities[leak], "leak", "{rank1:?}");
    assert_eq!(rank1[col("suspect_count")].parse::<usize>().unwrap().min(3), kinds.len());
    assert!(rank1[col("caveats")].contains("trace starts mid-run"));
    assert_eq!(rank1[col("error")], "");
    let m01 = body.iter().find(|r| r[0].ends_with("m01_two_gpu_pipeline.pickle")).unwrap();
    assert_eq!(m01[col("devices")], "0;1");
    let bad_row = body.last().unwrap();
    assert!(bad_row[0].ends_with("b_json.pkl"));
    assert!(bad_row[col("error")].contains("byte 0"), "{:?}", bad_row);
    assert_eq!(bad_row[col("allocated_bytes")], "");
    // --format overrides the extension.
    let r = memsnap(&["batch", "fixtures/multi/m02_ddp_rank0.pickle", "--format", "csv"]);
    assert_eq!(r.code, Some(0));
    assert!(r.stdout.starts_with("path,file_bytes,"), "{}", r.stdout);
}

#[test]
fn globs_explicit_files_missing_paths_and_duplicates() {
    let bad = bad_dir();
    // A quoted glob is expanded by memsnap; an explicitly named file is always tried, whatever
    // its name; a pattern matching nothing and a missing path are error rows.
    let pattern = "fixtures/multi/m02_*.pickle";
    let notes = bad.path().join("notes.txt");
    let r = memsnap(&[
        "batch",
        pattern,
        s(&notes),
        "fixtures/multi/nothing*.pickle",
        "fixtures/no/such.pickle",
        "fixtures/multi/m02_ddp_rank0.pickle",
    ]);
    assert_eq!(r.code, Some(2), "{}", r.stderr);
    let rows = jsonl(&r.stdout);
    let paths: Vec<&str> = rows.iter().map(|r| r["path"].as_str().unwrap()).collect();
    assert_eq!(
        paths,
        [
            "fixtures/multi/m02_ddp_rank0.pickle",
            "fixtures/multi/m02_ddp_rank1.pickle",
            s(&notes),
            "fixtures/multi/nothing*.pickle",
            "fixtures/no/such.pickle"
        ],
        "the repeated rank0 file gets one row"
    );
    assert!(rows[0]["error"].is_null() && rows[1]["error"].is_null());
    assert!(rows[2]["error"].as_str().unwrap().contains("byte 0"), "{}", rows[2]);
    assert_eq!(rows[3]["error"], "no file matches this pattern");
    assert!(rows[4]["error"].as_str().unwrap().contains("No such file"), "{}", rows[4]);
    assert!(rows[4]["file_bytes"].is_null());
}

#[test]
fn empty_directory_is_a_warning_not_an_error() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("README.md"), "# nothing here").unwrap();
    let r = memsnap(&["batch", s(dir.path())]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(r.stdout.is_empty());
    assert!(r.stderr.contains("no snapshot files"), "{}", r.stderr);
}

#[test]
fn bad_arguments_exit_2() {
    for args in [
        &["batch", "fixtures/multi", "--jobs", "0"][..],
        &["batch", "fixtures/multi", "--max-inflight-bytes", "lots"],
        &["batch", "fixtures/multi", "-o", "/nonexistent-dir/rows.csv"],
        &["batch"],
    ] {
        let r = memsnap(args);
        assert_eq!(r.code, Some(2), "{args:?}: {}", r.stderr);
        assert!(r.stdout.is_empty());
    }
}

#[test]
#[cfg_attr(not(memsnap_shared), ignore = "needs ../shared beside the checkout")]
fn shared_dev_snapshots_match_truth() {
    let dev = root().join("../shared/snapshots/dev");
    assert!(dev.is_dir(), "{} is gone since the build detected it (touch build.rs)", dev.display());
    let r = memsnap(&["batch", "../shared/snapshots/dev", "--jobs", "2"]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let rows = jsonl(&r.stdout);
    assert_eq!(rows.len(), walk(Path::new("../shared/snapshots/dev")).len());
    assert!(rows.len() >= 10);
    for row in &rows {
        let path = root().join(row["path"].as_str().unwrap());
        let name = path.file_name().unwrap().to_str().unwrap();
        let stem = name.split('.').next().unwrap();
        let truth: Value =
            serde_json::from_str(&std::fs::read_to_string(path.with_file_name(format!("{stem}.truth.json"))).unwrap())
                .unwrap();
        assert!(row["error"].is_null(), "{name}: {}", row["error"]);
        assert_eq!(row["allocated_bytes"], truth["at_dump"]["allocated"], "{name}");
        assert_eq!(row["reserved_bytes"], truth["at_dump"]["reserved"], "{name}");
        assert_eq!(row["file_bytes"].as_u64(), Some(std::fs::metadata(&path).unwrap().len()), "{name}");
    }
}

/// A row says how bad each top suspect is: a file recorded with `enabled="state"` (z08, an
/// inference cache) holds many blocks from one line, `held` (growth not known), not `leak`.
#[test]
fn a_row_gives_each_top_suspect_its_severity() {
    let z08 = common::fixture("extra3/z08_state_only_inference_cache.pickle.xz");
    let r = memsnap(&["batch", z08.to_str().unwrap()]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let rows = jsonl(&r.stdout);
    let top = rows[0]["top_suspects"].as_array().unwrap();
    assert!(!top.is_empty() && top.iter().all(|s| s["kind"] == "reference_leak" && s["severity"] == "held"), "{top:?}");
}
