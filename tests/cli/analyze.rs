//! `memsnap analyze --json` on the real snapshots in `fixtures/`: the replayed peaks equal what
//! the live process reported (`NAME.truth.json`), the replay reproduces each file's segment
//! table, and the suspects name the planted bug at the user's line — and nothing on clean runs.

use crate::common;

use std::path::{Path, PathBuf};

use common::{files_in, fixture, memsnap, root};
use serde_json::Value;

/// The leak kinds: growth of live memory (as opposed to `oom` and `fragmentation`).
const LEAK_KINDS: [&str; 4] = ["retained_graph", "no_grad_missing", "unreleased_gradient", "reference_leak"];

/// `memsnap analyze PATH --json`, parsed.
fn analyze(path: &Path) -> Value {
    let p = path.to_str().expect("utf-8 path");
    memsnap(&["analyze", p, "--json"]).json()
}

/// Every fixture snapshot: the dev set (xz-compressed copies), the extra single-GPU scenarios
/// and the multi-GPU ones.
fn all_fixtures() -> Vec<PathBuf> {
    let mut v = files_in(&fixture("dev"), |n| n.ends_with(".pickle.xz"));
    v.extend(files_in(&fixture("extra"), |n| n.ends_with(".pickle.xz")));
    v.extend(files_in(&fixture("multi"), |n| n.ends_with(".pickle")));
    v.extend(files_in(&fixture("extra2"), |n| n.ends_with(".pickle.xz")));
    v.extend(files_in(&fixture("formats"), |n| n.ends_with(".pickle.xz")));
    v.extend(files_in(&fixture("cache"), |n| n.ends_with(".pickle.xz")));
    v
}

/// The one `.pickle.xz` of fixture folder `dir` whose name starts with `prefix`.
fn fixture_with_prefix(dir: &str, prefix: &str) -> PathBuf {
    files_in(&fixture(dir), |n| n.starts_with(prefix) && n.ends_with(".pickle.xz"))
        .pop()
        .unwrap_or_else(|| panic!("no {dir}/{prefix}*.pickle.xz"))
}

/// `s01_clean_train` for `.../s01_clean_train.pickle.xz`; `cpp_pickler.cpp` keeps its `.cpp`.
fn stem(path: &Path) -> String {
    let name = path.file_name().unwrap().to_str().unwrap();
    name.trim_end_matches(".xz").trim_end_matches(".pickle").to_string()
}

/// The truth file beside a snapshot (`cpp_pickler.cpp.pickle` shares `cpp_pickler`'s).
fn truth_of(path: &Path) -> Value {
    let stem = stem(path);
    let truth_stem = stem.strip_suffix(".cpp").unwrap_or(&stem);
    let t = path.with_file_name(format!("{truth_stem}.truth.json"));
    serde_json::from_slice(&std::fs::read(&t).unwrap_or_else(|e| panic!("{}: {e}", t.display()))).unwrap()
}

/// The fixture whose name starts with `prefix` (e.g. `s03`, `x02`, `m02_ddp_rank1`).
fn find(prefix: &str) -> PathBuf {
    let hits: Vec<PathBuf> = all_fixtures().into_iter().filter(|p| stem(p).starts_with(prefix)).collect();
    assert_eq!(hits.len(), 1, "one fixture named {prefix}*: {hits:?}");
    hits.into_iter().next().unwrap()
}

/// Truth counters of `device`: `at_dump_per_device[device]` where the file has it, else the
/// top-level `at_dump` (single-device files).
fn truth_for_device(truth: &Value, device: u64, devices_in_output: usize) -> &Value {
    match truth.get("at_dump_per_device") {
        Some(per) => per.get(device.to_string()).unwrap_or_else(|| panic!("no truth for device {device}")),
        None => {
            assert_eq!(devices_in_output, 1, "a truth file without at_dump_per_device is for one device");
            &truth["at_dump"]
        }
    }
}

fn check_peaks(path: &Path, out: &Value, truth: &Value, failures: &mut Vec<String>) {
    let devices = out["devices"].as_array().expect("devices");
    assert!(!devices.is_empty(), "{}: no devices", path.display());
    // A profiler-converted file holds the tensors the profiler saw, not the allocator's blocks:
    // the live process's counters are not its numbers, and its reserved bytes are unknown.
    if truth["producer"] == "profiler_converted" {
        for d in devices {
            if !d["cache"].is_null() {
                failures.push(format!("{}: a profiler-converted file has no allocator cache: {d}", path.display()));
            }
            if !d["peak_reserved_bytes"].is_null()
                || !d["reserved_bytes"].is_null()
                || d["peak_allocated_bytes"].is_null()
            {
                failures.push(format!(
                    "{}: a profiler-converted file has a peak allocated and no reserved: {d}",
                    path.display()
                ));
            }
        }
        return;
    }
    if let Some(listed) = truth.get("devices").and_then(Value::as_array) {
        let got: Vec<u64> = devices.iter().map(|d| d["device"].as_u64().unwrap()).collect();
        let want: Vec<u64> = listed.iter().map(|d| d.as_u64().unwrap()).collect();
        if got != want {
            failures.push(format!("{}: devices {got:?}, truth {want:?}", path.display()));
        }
    }
    for d in devices {
        let dev = d["device"].as_u64().unwrap();
        let t = truth_for_device(truth, dev, devices.len());
        let row = |k: &str, tk: &str| (d[k].as_u64(), t[tk].as_u64());
        for (k, tk) in [("peak_allocated_bytes", "max_allocated"), ("peak_reserved_bytes", "max_reserved")] {
            let (got, want) = row(k, tk);
            if got.is_none() || got != want {
                failures.push(format!("{} device {dev}: {k} {got:?}, truth {tk} {want:?}", path.display()));
            }
        }
        check_cache(path, dev, &d["cache"], t, truth, failures);
        if d["replay_matches_snapshot"] != Value::Bool(true) {
            failures.push(format!(
                "{} device {dev}: replay_matches_snapshot {} ({} mismatches)",
                path.display(),
                d["replay_matches_snapshot"],
                d["replay_mismatches"]
            ));
        }
    }
}

/// The allocator-cache section against the live process: its reserved and allocated bytes are
/// `memory_reserved()` and `memory_allocated()` at the dump, its parts add up to the cached free
/// bytes, and where the generator called `torch.cuda.empty_cache()` right after the dump
/// (`truth.cache`), the bytes it says that call returns are the bytes it returned.
fn check_cache(path: &Path, dev: u64, cache: &Value, t: &Value, truth: &Value, failures: &mut Vec<String>) {
    let n = |k: &str| cache[k].as_u64().unwrap_or_else(|| panic!("{}: cache.{k} in {cache}", path.display()));
    let (reserved, allocated) = (n("reserved_bytes"), n("allocated_bytes"));
    if Some(reserved) != t["reserved"].as_u64() || Some(allocated) != t["allocated"].as_u64() {
        failures.push(format!(
            "{} device {dev}: cache reserved {reserved} allocated {allocated}, truth {} {}",
            path.display(),
            t["reserved"],
            t["allocated"]
        ));
    }
    let parts: u64 =
        ["free_segment_bytes", "hole_bytes", "expandable_free_bytes", "private_pool_free_bytes", "pending_free_bytes"]
            .iter()
            .map(|k| n(k))
            .sum();
    // PyTorch's blocks tile their segments: nothing is left unlisted in a file it wrote.
    if parts != n("cached_free_bytes") || n("cached_free_bytes") != reserved - allocated || n("unlisted_bytes") != 0 {
        failures.push(format!("{} device {dev}: cache parts {parts} do not add up: {cache}", path.display()));
    }
    let Some(live) = truth.get("cache") else { return };
    let returned = live["empty_cache_returned"].as_u64().expect("empty_cache_returned");
    if n("empty_cache_returns_bytes") != returned {
        failures.push(format!(
            "{} device {dev}: empty_cache_returns_bytes {}, the live process's empty_cache() returned {returned}",
            path.display(),
            n("empty_cache_returns_bytes")
        ));
    }
    // Every segment the process made (`segment.all.allocated`) is in the trace; segments of
    // expandable segments are mapped ranges, which torch does not count as segments.
    let made = cache["growth"]["segments_made"].as_u64();
    if n("expandable_free_bytes") == 0 && made != live["segments_allocated_total"].as_u64() {
        failures.push(format!(
            "{} device {dev}: segments_made {made:?}, truth segment.all.allocated {}",
            path.display(),
            live["segments_allocated_total"]
        ));
    }
}

fn suspects(out: &Value) -> &Vec<Value> {
    out["suspects"].as_array().expect("suspects")
}

fn describe(out: &Value) -> String {
    suspects(out)
        .iter()
        .map(|s| {
            format!(
                "\n  {} device {} at {}:{} bytes={} growth={}",
                s["kind"].as_str().unwrap_or("?"),
                s["device"],
                s["site"]["filename"].as_str().unwrap_or("-"),
                s["site"]["line"],
                s["bytes"],
                s["growth_bytes_per_iteration"]
            )
        })
        .collect()
}

/// Whether a suspect's site is `file` (a file name or the tail of a path) at `line`.
fn at(s: &Value, file: &str, line: u64) -> bool {
    let f = s["site"]["filename"].as_str().unwrap_or("");
    (f == file || f.ends_with(&format!("/{file}"))) && s["site"]["line"].as_u64() == Some(line)
}

/// The suspects of `kind`.
fn of_kind<'a>(out: &'a Value, kind: &str) -> Vec<&'a Value> {
    suspects(out).iter().filter(|s| s["kind"] == kind).collect()
}

/// The one `reference_leak` of `out`, required to be of severity `leak` at `script:line`.
fn the_one_leak<'a>(out: &'a Value, script: &str, line: u64) -> &'a Value {
    let leaks = of_kind(out, "reference_leak");
    assert!(
        leaks.len() == 1 && at(leaks[0], script, line) && leaks[0]["severity"] == "leak",
        "expected one reference_leak [leak] at {script}:{line}, got:{}",
        describe(out)
    );
    leaks[0]
}

/// Analyse the fixture `prefix` and require a `kind` suspect at `file:line`; returns the output.
fn expect_suspect(prefix: &str, kind: &str, file: &str, line: u64) -> Value {
    let out = analyze(&find(prefix));
    assert!(
        of_kind(&out, kind).iter().any(|s| at(s, file, line)),
        "{prefix}: expected {kind} at {file}:{line}, got:{}",
        describe(&out)
    );
    out
}

fn assert_no_leaks(name: &str, out: &Value) {
    let leaks: Vec<&Value> =
        suspects(out).iter().filter(|s| LEAK_KINDS.contains(&s["kind"].as_str().unwrap_or(""))).collect();
    assert!(leaks.is_empty(), "{name}: no leak suspects expected, got:{}", describe(out));
}

// ------------------------------------------------------------------------------------------
// Peaks and the self-check

/// For every fixture and every device: replayed peak allocated / reserved equal
/// `max_memory_allocated()` / `max_memory_reserved()` of the live process, and the replay
/// reproduces the dump-time segment table.
#[test]
fn every_fixture_peaks_equal_truth_and_replay_matches() {
    let files = all_fixtures();
    assert!(files.len() >= 26, "fixtures missing: {files:?}");
    let mut failures = Vec::new();
    for path in &files {
        let out = analyze(path);
        check_peaks(path, &out, &truth_of(path), &mut failures);
    }
    assert!(failures.is_empty(), "{} of {} files differ:\n{}", failures.len(), files.len(), failures.join("\n"));
}

/// Snapshots in the shared dev set that have no copy in `fixtures/dev` (all of them do today,
/// including s09, s11 and s16, so this usually checks nothing).
#[test]
#[cfg_attr(not(memsnap_shared), ignore = "needs ../shared beside the checkout")]
fn shared_dev_snapshots_not_in_fixtures_peaks_equal_truth() {
    let dir = root().join("../shared/snapshots/dev");
    assert!(dir.is_dir(), "{} is gone since the build detected it (touch build.rs)", dir.display());
    let copied: Vec<String> =
        files_in(&fixture("dev"), |n| n.ends_with(".pickle.xz")).iter().map(|p| stem(p)).collect();
    let mut failures = Vec::new();
    let mut checked = 0;
    for path in files_in(&dir, |n| n.ends_with(".pickle")) {
        if copied.contains(&stem(&path)) {
            continue;
        }
        checked += 1;
        let out = analyze(&path);
        check_peaks(&path, &out, &truth_of(&path), &mut failures);
    }
    eprintln!("{checked} shared dev snapshots without a fixture copy checked");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

// ------------------------------------------------------------------------------------------
// Suspects on the dev set

#[test]
fn s02_no_grad_missing_at_the_validation_forward_line() {
    expect_suspect("s02", "no_grad_missing", "s02_val_no_grad_missing.py", 20);
}

#[test]
/// s03 runs `loss.backward(retain_graph=True)` (line 19) and keeps every loss: the backward
/// frees none of the graph, so the suspect is named at the backward line, with the growth the
/// live process showed between steps (178,553,856 bytes = the truth's phase-to-phase delta).
fn s03_retained_graph_at_the_backward_line_ranked_first() {
    let out = expect_suspect("s03", "retained_graph", "s03_loss_history_leak.py", 19);
    let first = &suspects(&out)[0];
    assert!(
        first["kind"] == "retained_graph" && at(first, "s03_loss_history_leak.py", 19),
        "s03: retained_graph at line 19 must be ranked first, got:{}",
        describe(&out)
    );
    assert_eq!(first["severity"], "leak", "{}", describe(&out));
    assert_eq!(first["growth_bytes_per_iteration"].as_u64(), Some(178_553_856), "{}", describe(&out));
}

#[test]
fn s04_unreleased_gradient_at_the_backward_line() {
    expect_suspect("s04", "unreleased_gradient", "s04_grad_kept.py", 19);
}

#[test]
fn s05_unreleased_gradient_during_evaluation() {
    expect_suspect("s05", "unreleased_gradient", "s05_grads_during_eval.py", 18);
}

#[test]
fn s06_reference_leak_at_the_line_whose_output_the_hook_keeps() {
    expect_suspect("s06", "reference_leak", "common.py", 31);
}

#[test]
fn s07_fragmentation_and_no_leak() {
    let out = analyze(&find("s07"));
    assert!(!of_kind(&out, "fragmentation").is_empty(), "s07: expected fragmentation, got:{}", describe(&out));
    assert_no_leaks("s07", &out);
}

#[test]
fn s08_oom_at_the_user_line() {
    let out = expect_suspect("s08", "oom", "s08_oom.py", 20);
    assert_eq!(suspects(&out)[0]["kind"], "oom", "an OOM is ranked first:{}", describe(&out));
}

/// Clean runs (and runs whose only issue is not a leak) have no leak suspects.
#[test]
fn clean_runs_have_no_leak_suspects() {
    let clean = [
        "s01_clean_train",
        "s10_streams",
        "s12_cuda_graph",
        "s13_compile",
        "s15_annotations",
        "cpp_pickler.cpp",
        "cpp_pickler",
        "x05_clean_lm_stacks_all",
        "m01_two_gpu_pipeline",
        "m02_ddp_rank0",
        "y01_grad_accum_clean",
        "y02_transformer_clean",
        "y04_lru_cache_bounded",
    ];
    let mut failures = Vec::new();
    for name in clean {
        let path = all_fixtures().into_iter().find(|p| stem(p) == name).unwrap_or_else(|| panic!("no fixture {name}"));
        let out = analyze(&path);
        let leaks: Vec<&Value> =
            suspects(&out).iter().filter(|s| LEAK_KINDS.contains(&s["kind"].as_str().unwrap_or(""))).collect();
        if !leaks.is_empty() {
            failures.push(format!("{name}:{}", describe(&out)));
        }
    }
    assert!(failures.is_empty(), "leak suspects on clean runs:\n{}", failures.join("\n"));
}

// ------------------------------------------------------------------------------------------
// Suspects on the extra and multi-GPU scenarios

#[test]
fn x02_no_grad_missing_in_the_cnn_eval_loop() {
    expect_suspect("x02", "no_grad_missing", "x02_cnn_eval_no_grad_missing.py", 22);
}

#[test]
fn x03_reference_leak_in_the_inference_cache() {
    expect_suspect("x03", "reference_leak", "x03_inference_cache_leak.py", 25);
}

/// Other phrasings of the same bugs (fixtures/extra2).
#[test]
fn y05_reference_leak_in_a_metrics_helper() {
    let out = expect_suspect("y05", "reference_leak", "y05_metrics_leak.py", 22);
    assert_eq!(of_kind(&out, "reference_leak")[0]["growth_bytes_per_iteration"], 4_194_304, "{}", describe(&out));
}

#[test]
fn y06_reference_leak_of_tensors_a_backward_hook_keeps() {
    // The kept `grad_output` tensors are made by the autograd engine (no Python frames): named
    // at the `.backward()` line, as a reference leak rather than gradients (not parameter-sized).
    let out = expect_suspect("y06", "reference_leak", "y06_hook_grad_leak.py", 33);
    assert_eq!(of_kind(&out, "reference_leak")[0]["growth_bytes_per_iteration"], 2_097_152, "{}", describe(&out));
    assert!(of_kind(&out, "unreleased_gradient").is_empty(), "{}", describe(&out));
}

/// A GAN (two models, alternating updates, `.detach()` of fakes) has no growth. Its script zeroes
/// grads just before each backward (as the DCGAN tutorial does), so the last step's gradients
/// are still allocated during the final `no_grad` sampling: the one (non-growth) suspect.
#[test]
fn y03_gan_has_no_growth_only_grads_held_through_sampling() {
    let out = analyze(&find("y03"));
    for s in suspects(&out) {
        assert_eq!(s["kind"], "unreleased_gradient", "{}", describe(&out));
        assert!(s["growth_bytes_per_iteration"].is_null(), "{}", describe(&out));
    }
}

#[test]
fn y07_no_grad_missing_and_the_kept_loss() {
    expect_suspect("y07", "no_grad_missing", "y07_eval_no_grad_missing_list_of_losses.py", 27);
    // The running sum `val_loss += loss` (line 29) is the first value of the user's that carries
    // the graph past a pass.
    expect_suspect("y07", "retained_graph", "y07_eval_no_grad_missing_list_of_losses.py", 29);
}

#[test]
fn x06_oom() {
    let out = analyze(&find("x06"));
    assert!(!of_kind(&out, "oom").is_empty(), "x06: expected oom, got:{}", describe(&out));
}

#[test]
fn m02_rank1_retained_graph_on_device_1() {
    let out = analyze(&find("m02_ddp_rank1"));
    let rg = of_kind(&out, "retained_graph");
    assert!(
        rg.iter().any(|s| s["device"] == 1),
        "m02 rank 1: expected retained_graph on device 1, got:{}",
        describe(&out)
    );
    assert!(suspects(&out).iter().all(|s| s["device"] == 1), "rank 1's file has device 1 only:{}", describe(&out));
}

// ------------------------------------------------------------------------------------------
// The bench file: a 512-byte loss kept per step among a million events

#[test]
#[cfg_attr(not(memsnap_shared), ignore = "needs ../shared beside the checkout")]
fn huge_bench_file_finds_the_512_byte_loss_kept_per_step() {
    let path = root().join("../shared/bench/huge_python_stacks.pickle.xz");
    assert!(path.is_file(), "{} is absent", path.display());
    if cfg!(debug_assertions) {
        eprintln!("skipped in a debug build (about 1.5 s in release): run with --release");
        return;
    }
    let out = analyze(&path);
    let truth: Value =
        serde_json::from_slice(&std::fs::read(root().join("../shared/bench/huge_python_stacks.truth.json")).unwrap())
            .unwrap();
    let mut failures = Vec::new();
    check_peaks(&path, &out, &truth, &mut failures);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    let leak = of_kind(&out, "reference_leak");
    assert!(
        leak.iter().any(|s| at(s, "common.py", 126) && s["growth_bytes_per_iteration"].as_u64() == Some(512)),
        "expected reference_leak of 512 B per iteration at common.py:126, got:{}",
        describe(&out)
    );
}

/// The analysis is identical for any number of threads: devices and segments are replayed in
/// parallel and merged deterministically.
#[test]
fn analyze_json_is_identical_for_one_and_several_threads() {
    for prefix in ["m01_two_gpu_pipeline", "s03", "s08"] {
        let path = find(prefix);
        let p = path.to_str().expect("utf-8 path");
        let run = |threads: &str| {
            let out = std::process::Command::new(env!("CARGO_BIN_EXE_memsnap"))
                .args(["analyze", p, "--json"])
                .env("RAYON_NUM_THREADS", threads)
                .output()
                .expect("run memsnap");
            assert!(out.status.success(), "{prefix}: {}", String::from_utf8_lossy(&out.stderr));
            out.stdout
        };
        let one = run("1");
        assert!(!one.is_empty());
        for threads in ["2", "4"] {
            assert!(one == run(threads), "{prefix}: output differs between 1 and {threads} threads");
        }
    }
}

/// Text output is for reading: times after the trace start, sizes humanised with the exact
/// count beside them, "1 block" not "1 blocks", and evidence wrapped to `$COLUMNS` (one line
/// per paragraph without it, as in a pipe).
#[test]
fn analyze_text_reads_as_prose() {
    let file = fixture("dev/s03_loss_history_leak.pickle.xz");
    let args = ["analyze", file.to_str().unwrap()];
    let plain = common::memsnap(&args);
    assert_eq!(plain.code, Some(0), "{}", plain.stderr);
    assert!(plain.stdout.contains(", time +0.357383 s;"), "{}", plain.stdout);
    assert!(!plain.stdout.contains(" us;"), "epoch microseconds in text: {}", plain.stdout);
    assert!(plain.stdout.contains("uncertain at start: 0 bytes"), "{}", plain.stdout);
    assert!(!plain.stdout.lines().any(|l| l.contains(" 1 blocks")), "{}", plain.stdout);
    let evidence = plain.stdout.lines().find(|l| l.trim_start().starts_with("evidence:")).expect("an evidence line");
    assert!(evidence.len() > 200, "unwrapped without COLUMNS: {evidence}");

    let narrow = common::memsnap_env(None, &args, None, &[("COLUMNS", "72")]);
    assert_eq!(narrow.code, Some(0), "{}", narrow.stderr);
    let (verdict, _) = narrow.stdout.split_once("\nDEVICE").unwrap();
    let (_, suspects) = verdict.split_once("VERDICT\n").unwrap();
    for line in suspects.lines().filter(|l| !l.trim_start().starts_with("at ") && !l.contains("] (confidence")) {
        assert!(line.chars().count() <= 72 || !line.trim().contains(' '), "line past 72 columns: {line:?}");
    }
    // Wrapping moves words, never changes them.
    let words = |s: &str| s.split_whitespace().map(str::to_string).collect::<Vec<_>>();
    assert_eq!(words(&narrow.stdout), words(&plain.stdout));
    assert!(narrow.stdout.lines().count() > plain.stdout.lines().count() + 5);
}

/// `user_metadata` and `compile_context` group live memory: the groups of a moment add up to
/// its allocated bytes, a label's phase spans the events that carried it, and `--by` makes the
/// text table group by the label.
#[test]
fn labels_group_memory_and_name_phases() {
    for (file, key, kind, example) in [
        ("dev/s15_annotations.pickle.xz", "by_metadata", "user_metadata", "step=1"),
        ("dev/s13_compile.pickle.xz", "by_compile_region", "compile_context", "Torch-Compiled Region: 0/0"),
    ] {
        let out = analyze(&fixture(file));
        let d = &out["devices"][0];
        for moment in ["peak", "end"] {
            let groups = d[moment][key].as_array().unwrap();
            let sum: u64 = groups.iter().map(|g| g["bytes"].as_u64().unwrap()).sum();
            assert_eq!(sum, d[moment]["allocated_bytes"].as_u64().unwrap(), "{file} {moment}");
        }
        let labels = d["phases"]["labels"].as_array().unwrap();
        let l = labels.iter().find(|l| l["name"] == example).unwrap_or_else(|| panic!("{file}: {labels:?}"));
        assert_eq!(l["kind"], kind);
        assert!(l["first_event"].as_u64() <= l["last_event"].as_u64());
        assert!(l["events"].as_u64().unwrap() > 0);
    }
    // A file without labels has none.
    let clean = analyze(&fixture("dev/s01_clean_train.pickle.xz"));
    assert!(clean["devices"][0]["peak"]["by_metadata"].as_array().unwrap().is_empty());
    assert!(clean["devices"][0]["phases"]["labels"].as_array().unwrap().is_empty());

    let f = fixture("dev/s15_annotations.pickle.xz");
    let text = memsnap(&["analyze", f.to_str().unwrap(), "--by", "metadata"]);
    assert_eq!(text.code, Some(0), "{}", text.stderr);
    assert!(text.stdout.contains("Allocated at peak by user_metadata ("), "{}", text.stdout);
    assert!(text.stdout.contains("\"step=1\""), "{}", text.stdout);
}

#[test]
fn a_state_only_trace_names_the_lines_of_memory_held_at_the_dump() {
    // `context="state"`: the trace's events carry no frames, the dump's blocks do. A block alive
    // at the dump is the dump's block at its address, so the tables name its line; what was freed
    // before the dump (the peak's temporaries) stays "no frames recorded", and the caveats say so.
    let out = analyze(&fixture("extra5/v10_context_state_dedup_cache_leak.pickle.xz"));
    let d = &out["devices"][0];
    let end = d["end"]["by_site"].as_array().unwrap();
    assert!(!end.iter().any(|s| s["label"] == "no frames recorded"), "end: {end:?}");
    let held: u64 = end.iter().filter(|s| !s["site"].is_null()).map(|s| s["bytes"].as_u64().unwrap()).sum();
    assert!(held >= 73 << 20, "the 73 MiB held at the dump is named at lines: {end:?}");
    let peak = d["peak"]["by_site"].as_array().unwrap();
    let frameless: u64 =
        peak.iter().filter(|s| s["label"] == "no frames recorded").map(|s| s["bytes"].as_u64().unwrap()).sum();
    assert_eq!(frameless, 16 << 20, "only the peak's temporaries, freed before the dump, lack a line: {peak:?}");
    let caveats = d["caveats"].to_string();
    assert!(caveats.contains("only the blocks alive at the dump name their lines"), "{caveats}");
    assert!(!caveats.contains("cannot be attributed to lines of code"), "{caveats}");
}

#[test]
fn a_trace_without_stacks_counts_iterations_by_the_optimizer_step_not_by_a_region_per_layer() {
    // s42: a transformer trained 8 steps, recorded with `context="state"`, each of its 6 blocks
    // run inside `record_function("block")`: 48 "block" regions, 8 optimizer steps. The steps are
    // the iterations (the most frequent region made 48 before).
    let out = analyze(&fixture_with_prefix("extra28b", "s42_"));
    let p = &out["devices"][0]["phases"];
    assert_eq!(p["iteration_source"], "annotation", "{p}");
    assert_eq!(p["iteration_annotation"], "Optimizer.step#AdamW.step", "{p}");
    assert_eq!(p["iterations"], 8, "{p}");
}

#[test]
fn a_leak_read_from_dump_stacks_says_in_which_iterations_the_trace_made_its_blocks() {
    // s43 (`context="state"`): a list keeps each step's last block output. The dump's stacks name
    // the line; the trace's events, found by address, say when each kept block was made: 7 of
    // its 8 blocks in the trace's 8 iterations, one each, the other before the first optimizer
    // step that starts the first iteration.
    let out = analyze(&fixture_with_prefix("extra28b", "s43_"));
    let s = &out["suspects"][0];
    assert_eq!(s["kind"], "reference_leak", "{s}");
    assert_eq!(s["facts"]["origin"], "dump_stacks_only", "{s}");
    assert_eq!((s["facts"]["blocks"].as_u64(), s["facts"]["occurrences"].as_u64()), (Some(8), Some(7)), "{s}");
    assert_eq!(s["facts"]["eligible"], 8, "{s}");
    assert!(s["evidence"].as_str().unwrap().contains("say when they were made: in 7 of 8 iterations"), "{s}");
    // Without a trace (`enabled="state"`) nothing says when: none of none, and no such words.
    let z08 = analyze(&fixture("extra3/z08_state_only_inference_cache.pickle.xz"));
    let leak = z08["suspects"].as_array().unwrap().iter().find(|s| s["facts"]["origin"] == "state_only");
    let leak = leak.expect("a state-only reference_leak");
    assert_eq!(
        (leak["facts"]["occurrences"].as_u64(), leak["facts"]["eligible"].as_u64()),
        (Some(0), Some(0)),
        "{leak}"
    );
    assert!(!leak["evidence"].as_str().unwrap().contains("say when"), "{leak}");
}

#[test]
fn kept_graphs_read_from_the_dump_hold_the_batch_their_passes_were_fed() {
    // s48 (`context="state"`): a GroupNorm denoiser's losses kept in a list, backward with
    // `retain_graph=True`. The graphs hold each step's `noisy` (the first convolution saved it)
    // and `clean` (`mse_loss` saved its target), made by the loop at lines 38-39 before the pass:
    // they join the graphs, not two leaks of their own.
    let out = analyze(&fixture_with_prefix("extra28c", "s48_"));
    let suspects = out["suspects"].as_array().unwrap();
    let kinds: Vec<&str> = suspects.iter().map(|s| s["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["retained_graph"], "{}", out["suspects"]);
    let mut inputs: Vec<u64> =
        suspects[0]["facts"]["input_lines"].as_array().unwrap().iter().map(|l| l["line"].as_u64().unwrap()).collect();
    inputs.sort_unstable();
    assert_eq!(inputs, [38, 39], "{}", suspects[0]);
    assert!(suspects[0]["evidence"].as_str().unwrap().contains("with the passes' inputs made before each pass"));
    // s52 (HF BERT): the token batches join too, though the last step's holds one more tensor
    // at the dump (the attention mask the model did not save, still bound to the loop's variable).
    let s52 = analyze(&fixture_with_prefix("extra28d", "s52_"));
    assert_eq!(s52["suspects"].as_array().unwrap().len(), 1, "{}", s52["suspects"]);
    assert_eq!(s52["suspects"][0]["facts"]["input_lines"][0]["line"], 40, "{}", s52["suspects"]);
    // s50: tensors the loop keeps that the model made are kept outputs, not inputs: still a
    // reference_leak, its iterations the optimizer's steps (6), not the micro-batch regions (24).
    let s50 = analyze(&fixture_with_prefix("extra28c", "s50_"));
    assert_eq!(s50["suspects"][0]["kind"], "reference_leak", "{}", s50["suspects"]);
    assert_eq!(s50["devices"][0]["phases"]["iterations"], 6, "{}", s50["devices"][0]["phases"]);
}

#[test]
fn a_growing_input_whose_passes_grow_with_it_is_shape_growth_not_a_leak() {
    // A sequence-length curriculum: the batch is re-made larger each step and the previous one
    // freed on rebinding (a chain like `queue = torch.cat([queue, k])`), but the passes it feeds
    // grow with it. No suspect; a caveat says memory grows with the shapes.
    let out = analyze(&fixture("extra6/u04_seq_len_curriculum_clean.pickle.xz"));
    assert!(out["suspects"].as_array().unwrap().is_empty(), "{}", out["suspects"]);
    let caveats = out["devices"][0]["caveats"].to_string();
    assert!(caveats.contains("u04_seq_len_curriculum_clean.py:20"), "{caveats}");
    assert!(caveats.contains("the shapes of the work grow"), "{caveats}");
    // The MoCo queue fed from its own past, used after the model, stays a leak.
    let v12 = analyze(&fixture("extra5/v12_midtrain_ring_moco_queue_cat_leak.pickle.xz"));
    assert_eq!(v12["suspects"][0]["kind"], "reference_leak", "{}", v12["suspects"]);
    assert_eq!(v12["suspects"][0]["site"]["line"], 52, "{}", v12["suspects"]);
}

#[test]
fn a_state_only_trace_tells_a_working_set_made_at_the_end_from_growth() {
    // `context="state"`: the last request's bounded KV cache (17 blocks from the model call line)
    // was made in the last third of the trace: not reported, said in a caveat. v10's cache,
    // filled over the whole trace, stays a leak.
    let out = analyze(&fixture("extra6/u05_inference_mode_sliding_kv_context_state_clean.pickle.xz"));
    assert!(out["suspects"].as_array().unwrap().is_empty(), "{}", out["suspects"]);
    let caveats = out["devices"][0]["caveats"].to_string();
    assert!(caveats.contains("did not accumulate"), "{caveats}");
    assert!(caveats.contains("u05_inference_mode_sliding_kv_context_state_clean.py:62"), "{caveats}");
    let v10 = analyze(&fixture("extra5/v10_context_state_dedup_cache_leak.pickle.xz"));
    assert_eq!(v10["suspects"][0]["kind"], "reference_leak", "{}", v10["suspects"]);
}

#[test]
fn a_retained_graph_over_two_passes_keeps_both_and_their_inputs() {
    // DCGAN: D on real and D on fake form one loss, `d_loss.backward(retain_graph=True)`, the
    // logged `d_loss` keeps both passes' graphs and what they saved (the real batch, G's output):
    // one retained_graph at the backward line, no no_grad_missing, no reference_leak.
    let out = analyze(&fixture("extra6/u14_dcgan_retain_graph_logged_d_loss_leak.pickle.xz"));
    let s = out["suspects"].as_array().unwrap();
    assert_eq!(s.len(), 1, "{}", out["suspects"]);
    assert_eq!(s[0]["kind"], "retained_graph");
    assert_eq!(s[0]["severity"], "leak");
    assert_eq!(s[0]["site"]["line"], 30);
    // With the inputs the graph saved, the growth is the live process's (the truth's phases:
    // `memory_allocated()` grew by 22,553,088 bytes per step).
    assert_eq!(s[0]["growth_bytes_per_iteration"], 22_553_088u64, "{}", out["suspects"]);
    // A saliency from `autograd.grad(..., create_graph=True)` kept as a tensor: the backward's
    // own saved tensors and `x.grad` are the graph's, not a hook's tensors or kept gradients.
    let u11 = analyze(&fixture("extra6/u11_input_grad_create_graph_history_leak.pickle.xz"));
    let kinds: Vec<&str> = u11["suspects"].as_array().unwrap().iter().map(|s| s["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["retained_graph"], "{}", u11["suspects"]);
}

/// A model that computes its loss and returns `(logits, loss)` (nanoGPT's shape): a kept output
/// is named at the line that ran the model, not at the model's own line that made it (its head).
/// The output is told by being a statement of the model's own `forward`, like the loss that
/// ended the pass (`reference_leak.rs`, `model_depth`). The model's line that made the largest
/// kept block is given too (`facts.made_at`, and in the words): the model's own code may be what
/// keeps it.
#[test]
fn kept_outputs_of_a_model_returning_logits_and_loss_are_named_at_the_call() {
    for (dir, prefix, line, made) in [
        ("extra7", "t01_", 23, ("vcommon.py", 65)),
        ("extra7", "t02_", 45, ("t02_logging_memory_handler_tensor_args_leak.py", 34)),
        ("extra7", "t12_", 41, ("vcommon.py", 65)),
        ("extra6", "u08_", 28, ("vcommon.py", 65)),
    ] {
        let path = fixture_with_prefix(dir, prefix);
        let script = format!("{}.py", stem(&path));
        let out = analyze(&path);
        let leaks = of_kind(&out, "reference_leak");
        assert!(
            !leaks.is_empty() && leaks.iter().all(|s| at(s, &script, line)),
            "{prefix}: expected reference_leak at {script}:{line}, got:{}",
            describe(&out)
        );
        for s in &leaks {
            let made_at = &s["facts"]["made_at"];
            assert!(
                made_at["filename"].as_str().is_some_and(|f| f.ends_with(made.0)) && made_at["line"] == made.1,
                "{prefix}: expected made_at {}:{}, got {made_at}",
                made.0,
                made.1
            );
            let words = format!("made inside the model, at fixtures/gen/{}:{}", made.0, made.1);
            assert!(s["evidence"].as_str().is_some_and(|e| e.contains(&words)), "{prefix}: {}", s["evidence"]);
        }
    }
}

/// Leaks in shapes the whole-trace share missed or misplaced (fixtures/extra8, real runs): one
/// that starts after a warm-up (kept in 6 of 16 steps, growth measured from the first kept step:
/// 2 MiB per step, as the live process grew), one that keeps one step in three (recorded with
/// `stacks="python"` and with `stacks="all"`), an inference service that caches results after 16
/// of 24 requests (growth per pass from where the keeping resumed: 1 MiB), and the kept
/// output of a model whose `forward` is decorated (a frame named `wrapper`, told from a hook by
/// the line of `_call_impl` that called it). Each is named at the line that runs the model.
#[test]
fn late_periodic_and_decorated_forward_leaks_are_named_at_the_call() {
    for (prefix, line, growth) in [
        ("p07_", 38, Some(2 << 20)),
        ("p08_", 34, None),
        ("p13_", 34, None),
        ("p14_", 21, Some(1 << 20)),
        ("p06_", 54, Some(4 << 20)),
    ] {
        let path = fixture_with_prefix("extra8", prefix);
        let script = format!("{}.py", stem(&path));
        let out = analyze(&path);
        let leak = the_one_leak(&out, &script, line);
        assert_eq!(leak["growth_bytes_per_iteration"].as_u64(), growth, "{prefix}:{}", describe(&out));
    }
}

/// Gradients held through passes without grad: an evaluation between epochs (z10: 3 windows in 9
/// iterations) is called one; no-grad passes the step itself runs, once per iteration (p05: a
/// DQN's acting forward), are said to be that (`facts.hold.every_step`). As many windows as
/// iterations, all after the last step (aa02: a CUDA-graph warm-up's no-grad passes, then a
/// no-grad capture), are not once per step.
#[test]
fn gradients_held_through_no_grad_passes_say_whether_each_step_runs_them() {
    for (set, prefix, every_step, words) in [
        ("extra3", "z10_", false, "When evaluation began"),
        ("extra8", "p05_", true, "When the passes without grad that each step runs"),
        ("extra30", "aa02_", false, "When evaluation began"),
    ] {
        let path = fixture_with_prefix(set, prefix);
        let out = analyze(&path);
        let waste = of_kind(&out, "unreleased_gradient");
        assert!(waste.len() == 1 && waste[0]["severity"] == "waste", "{prefix}:{}", describe(&out));
        let hold = &waste[0]["facts"]["hold"];
        assert_eq!(hold["through_evaluation"]["every_step"], every_step, "{prefix}: {hold}");
        assert!(
            waste[0]["evidence"].as_str().is_some_and(|e| e.starts_with(words)),
            "{prefix}: {}",
            waste[0]["evidence"]
        );
    }
}

/// Optimizers re-created for warm restarts (fixtures/extra9, real runs): kept in a list, each
/// keeps its Adam state, made again for the same parameters every 4 steps (q06: named at the
/// `step()` line, origin `optimizer_state_remade`, 5 of 20 iterations); dropped at each restart,
/// the old state is freed (q15); identical blocks unfrozen one by one under one AdamW make state
/// of the same sizes again, but each time for parameters that just gained gradients (q16). The
/// two near misses have no reference_leak.
#[test]
fn optimizers_recreated_and_kept_are_told_from_restarts_and_unfreezing() {
    let path = fixture_with_prefix("extra9", "q06_");
    let script = format!("{}.py", stem(&path));
    let out = analyze(&path);
    let leak = the_one_leak(&out, &script, 28);
    let facts = &leak["facts"];
    assert_eq!(facts["origin"], "optimizer_state_remade", "{facts}");
    assert_eq!((facts["occurrences"].as_u64(), facts["eligible"].as_u64()), (Some(5), Some(20)), "{facts}");
    for prefix in ["q15_", "q16_"] {
        let out = analyze(&fixture_with_prefix("extra9", prefix));
        assert!(of_kind(&out, "reference_leak").is_empty(), "{prefix}:{}", describe(&out));
    }
}

/// A hand-written optimizer (fixtures/extra10, real runs) that keeps every step's update in a
/// history (k04): tensors its own `step` made at line 33 in every iteration, for the same
/// parameters, kept: origin `optimizer_keeps_per_step` (not `optimizer_state`, whose words are
/// about `add_param_group`), +6 MiB per iteration (the model's size: the update of every
/// parameter). The same optimizer without the history makes its buffers once (k05): no leak.
#[test]
fn an_optimizer_that_keeps_its_updates_is_told_from_one_handed_new_parameters() {
    let path = fixture_with_prefix("extra10", "k04_");
    let script = format!("{}.py", stem(&path));
    let out = analyze(&path);
    let leak = the_one_leak(&out, &script, 33);
    assert_eq!(leak["facts"]["origin"], "optimizer_keeps_per_step", "{}", leak["facts"]);
    assert_eq!(leak["growth_bytes_per_iteration"].as_u64(), Some(6_304_256), "{}", describe(&out));
    let clean = analyze(&fixture_with_prefix("extra10", "k05_"));
    assert!(of_kind(&clean, "reference_leak").is_empty(), "k05:{}", describe(&clean));
}

/// A leak whose start fell out of the ring buffer (real runs): the trace shows its last
/// iterations, and the dump's stacks name the line of the earlier kept blocks too, which the
/// evidence adds up (`facts.before_trace`). u07 keeps 40 clones of 1 MiB (its truth file): 7
/// made in the trace, 33 before it. k10 keeps 30 feature maps of 1 MiB under a 600-event ring;
/// the 32 MiB cuBLAS workspace its first model call made, also alive and named at that line,
/// is not of a size the leak keeps and is left out. A leak seen whole has no such field.
#[test]
fn a_leak_that_began_before_the_trace_says_how_much_more_it_keeps() {
    let out = analyze(&fixture_with_prefix("extra6", "u07_"));
    let leak = of_kind(&out, "reference_leak")[0];
    assert_eq!(leak["bytes"].as_u64(), Some(7 << 20), "{}", describe(&out));
    let bt = &leak["facts"]["before_trace"];
    assert_eq!((bt["blocks"].as_u64(), bt["bytes"].as_u64()), (Some(33), Some(33 << 20)), "{bt}");
    assert!(leak["evidence"].as_str().unwrap().contains("A further 33 blocks (33.00 MiB)"), "{}", leak["evidence"]);

    let out = analyze(&fixture_with_prefix("extra10", "k10_"));
    let bt = &of_kind(&out, "reference_leak")[0]["facts"]["before_trace"];
    let blocks = bt["blocks"].as_u64().unwrap_or(0);
    assert!(blocks >= 20 && bt["bytes"].as_u64() == Some(blocks << 20), "k10: {bt}");

    let whole = analyze(&fixture_with_prefix("extra10", "k07_"));
    assert!(of_kind(&whole, "reference_leak")[0]["facts"].get("before_trace").is_none(), "{}", describe(&whole));

    // Kept masks whose shape follows the batch (l03, real run: 32 x L x L for varying L, 20 made
    // before recording was switched back on): those of a size within the kept ones' range count,
    // 17 of the 20; the 3 smaller than any mask made in the trace do not.
    let out = analyze(&fixture_with_prefix("extra21", "l03_"));
    let bt = &of_kind(&out, "reference_leak")[0]["facts"]["before_trace"];
    assert_eq!((bt["blocks"].as_u64(), bt["bytes"].as_u64()), (Some(17), Some(35_648_512)), "l03: {bt}");
}

/// A cache keyed by the prompt (q26, real run: 5 prompts over 24 requests, the model run only on a
/// miss) fills in the first 5 requests and stops while the loop goes on: bounded by the keys,
/// not a leak.
#[test]
fn a_cache_that_stopped_missing_while_the_loop_went_on_is_not_a_leak() {
    let out = analyze(&fixture_with_prefix("extra9", "q26_"));
    assert!(of_kind(&out, "reference_leak").is_empty(), "{}", describe(&out));
}

/// A reservoir of 256 slots (s13, real run: filled by `append` at l.74 until full, then written
/// at random slots at l.81; the ring holds the last 9 of 30 steps): each store at l.81 frees the
/// slot's old tensor at the very next event, one made at l.74 or before the trace, so l.81's
/// tensors replace others' and memory stays level: not a leak. The near miss (s08, real run): a
/// pool of fooled examples appended to every step replaces nothing and stays a leak, its
/// iterations delimited by the training step's `loss.backward()` (l.101, followed by the
/// optimizer's step), not by the attack's five `autograd.grad` calls a step (l.77).
#[test]
fn slots_overwritten_by_another_line_than_the_one_that_filled_them_are_not_a_leak() {
    let out = analyze(&fixture_with_prefix("extra25", "s13_"));
    assert!(of_kind(&out, "reference_leak").is_empty(), "{}", describe(&out));
    let path = fixture_with_prefix("extra25", "s08_");
    let script = format!("{}.py", stem(&path));
    let out = analyze(&path);
    let leaks = of_kind(&out, "reference_leak");
    assert!(leaks.len() == 1 && at(leaks[0], &script, 104), "{}", describe(&out));
    let phases = &out["devices"][0]["phases"];
    assert_eq!(phases["iteration_site"]["line"], 101, "{phases}");
    assert_eq!(phases["iterations"], 7, "{phases}");
}

/// A `TorchDispatchMode` that appends every matmul's output to a dict of lists (s17, real run:
/// 9 outputs a step, 35,651,584 bytes a step by `memory_allocated()`): PyTorch runs the mode's
/// `__torch_dispatch__` from inside each op of the model's forward, so the kept blocks' stacks
/// run through the model's lines and the mode's. The handler keeps them: one suspect at its
/// line (l.59), not one per model line that happened to call a watched op, and the growth per
/// iteration is the live process's.
#[test]
fn what_a_dispatch_mode_keeps_is_named_at_the_handler() {
    let path = fixture_with_prefix("extra26", "s17_");
    let script = format!("{}.py", stem(&path));
    let out = analyze(&path);
    let s = suspects(&out);
    assert!(s.len() == 1 && at(&s[0], &script, 59), "{}", describe(&out));
    assert_eq!(s[0]["kind"], "reference_leak", "{}", describe(&out));
    assert_eq!(s[0]["growth_bytes_per_iteration"], 35_651_584u64, "{}", describe(&out));
}

/// A width sweep (s24, real run: five MLPs trained in turn with AdamW, each run's
/// `opt.state_dict()` stored in a results dict, then `del model, opt`): the parameters and
/// gradients are freed, the moments stay (100 tensors, 432,341,032 bytes by the live process).
/// An optimizer holds its parameters, so state that outlives them is held without it: one
/// suspect at the `step()` line that made the state (l.62), origin `optimizer_state_orphaned`.
/// The near miss (s21, real run): population-based training replaces its worst member by a
/// `deepcopy` of the best, model and optimizer state, and drops the old member: no suspect.
#[test]
fn optimizer_state_kept_after_its_model_was_deleted_is_a_leak() {
    let path = fixture_with_prefix("extra27", "s24_");
    let script = format!("{}.py", stem(&path));
    let out = analyze(&path);
    let s = suspects(&out);
    assert!(s.len() == 1 && at(&s[0], &script, 62), "{}", describe(&out));
    assert_eq!(s[0]["facts"]["origin"], "optimizer_state_orphaned", "{}", describe(&out));
    assert_eq!(s[0]["facts"]["blocks"], 100, "{}", describe(&out));
    let out = analyze(&fixture_with_prefix("extra26", "s21_"));
    assert!(suspects(&out).is_empty(), "{}", describe(&out));
}

/// Lottery-ticket pruning with `torch.nn.utils.prune` (s10, real run: each round's masks kept by
/// a history list, the network evaluated under `no_grad` before each pruning): pruning's forward
/// pre-hook re-makes every pruned weight (`weight_orig * mask`) before each forward and keeps it
/// as a module attribute, so those blocks outlive even a no-grad pass. They are the hook's
/// attributes, not saved tensors: the evaluations read as run without grad, and the kept masks
/// are named at the pruning call (l.81) with that origin, not as outputs of grad-on passes.
#[test]
fn a_library_hooks_module_attributes_are_not_saved_tensors() {
    let path = fixture_with_prefix("extra25", "s10_");
    let script = format!("{}.py", stem(&path));
    let out = analyze(&path);
    let leaks = of_kind(&out, "reference_leak");
    assert!(leaks.len() == 1 && at(leaks[0], &script, 81), "{}", describe(&out));
    assert_eq!(leaks[0]["facts"]["origin"], "no_grad_forward", "{}", describe(&out));
}

/// An LRU cache of spectrograms that fills in four steps and then evicts one for every miss
/// (l06, real run: 8-13 new entries a step into a capacity of 48, kept from 9 of 10 steps):
/// its tensors alive stop rising while it goes on making them, so it is full, not leaking. The
/// near miss (e01, real run): one `generate` call keeps every step's scores while its KV cache
/// is re-made and let go each step; the scores alive rise at every step, so it stays a leak.
#[test]
fn an_lru_cache_at_its_capacity_is_not_a_leak_and_scores_kept_beside_a_kv_cache_are() {
    let out = analyze(&fixture_with_prefix("extra21", "l06_"));
    assert!(of_kind(&out, "reference_leak").is_empty(), "{}", describe(&out));
    // Bounded by bytes (s01, real run: states of 12-256 KiB under an 8 MiB budget): the count
    // moves between 84 and 103 and the bytes stay a few KiB under the budget.
    let out = analyze(&fixture_with_prefix("extra22", "s01_"));
    assert!(of_kind(&out, "reference_leak").is_empty(), "{}", describe(&out));
    let path = fixture_with_prefix("extra18", "e01_");
    let script = format!("{}.py", stem(&path));
    let out = analyze(&path);
    let leaks = of_kind(&out, "reference_leak");
    assert!(leaks.len() == 1 && at(leaks[0], &script, 43), "{}", describe(&out));
    // The 112 score tensors `generate` made before the ring's first event are the same line's
    // (the dump's stacks): 8 MiB in the trace, 56 MiB before it, the 64 MiB the program kept.
    let bt = &leaks[0]["facts"]["before_trace"];
    assert_eq!((bt["blocks"].as_u64(), bt["bytes"].as_u64()), (Some(112), Some(58_720_256)), "e01: {bt}");
}

/// Speculative decoding (j08, real run, a ring of 5000 events): every round keeps the draft's
/// stacked probabilities (l.50) and the target's softmax (l.53), made by the user's code beside
/// the passes; the trace holds 5 of the 72 rounds, under 1 MiB per line. The 67 rounds before it
/// are the same lines' (the dump's stacks) and count towards what is at stake, so both are named.
#[test]
fn a_leak_mostly_before_a_wrapped_ring_is_weighed_with_what_the_dump_names() {
    let path = fixture_with_prefix("extra23", "j08_");
    let script = format!("{}.py", stem(&path));
    let out = analyze(&path);
    let leaks = of_kind(&out, "reference_leak");
    for line in [50, 53] {
        let s = leaks.iter().find(|s| at(s, &script, line)).unwrap_or_else(|| panic!("l.{line}: {}", describe(&out)));
        assert_eq!(s["facts"]["before_trace"]["blocks"].as_u64(), Some(67), "{}", describe(&out));
    }
}

/// A line search's trial evaluations run by `optimizer.step(closure)` (i09, real run, in
/// `fixtures/limits`): the closure's forward passes sit under `torch/optim/` frames, and are
/// forward passes all the same (the module call is inside the optimizer's frame), so the trials'
/// kept graphs are found: retained_graph and no_grad_missing at the closure's model call, the
/// latter reached from the step's `closure()` call (l.63).
#[test]
fn forward_passes_a_step_closure_runs_are_forward_passes() {
    let path = common::fixture("limits").join("i09_armijo_line_search_closure_trials_keep_loss_graphs_leak.pickle.xz");
    let script = format!("{}.py", stem(&path));
    let out = analyze(&path);
    for kind in ["retained_graph", "no_grad_missing"] {
        let found = of_kind(&out, kind);
        assert!(found.len() == 1 && at(found[0], &script, 97), "{kind}: {}", describe(&out));
    }
}

/// GradNorm (j07, real run): `backward(retain_graph=True)`, then three `autograd.grad` calls
/// through the same graph; the step's task-loss vector goes to a history list, which keeps every
/// graph. Keeping the graph was needed for the second differentiation, so the suspect names the
/// kept value (`task_losses`, l.81), not the backward; and the `autograd.grad` calls, the most
/// frequent backward line, are one step with it, not three more iterations: the growth per
/// iteration is the live process's (`memory_allocated()` rose by 42,522,112 bytes a step).
#[test]
fn a_graph_differentiated_twice_and_kept_by_a_list_is_named_at_the_kept_value() {
    let path = fixture_with_prefix("extra20", "j07_");
    let script = format!("{}.py", stem(&path));
    let out = analyze(&path);
    let s = suspects(&out);
    assert_eq!(s.len(), 1, "{}", describe(&out));
    assert!(at(&s[0], &script, 81), "{}", describe(&out));
    assert_eq!(s[0]["facts"]["hold"], "retained_then_kept", "{}", describe(&out));
    assert_eq!(s[0]["growth_bytes_per_iteration"], 42_522_112u64, "{}", describe(&out));
}

/// Recording stopped before the dump (`_record_memory_history(enabled=None)`, q18, real run)
/// leaves an empty trace: the dump's blocks still name the lines that made them, so the kept
/// logits are found from the state, and no peak can be established: null in JSON, "not
/// established" in text, and no "at peak" table that would be the dump under another name.
#[test]
fn recording_stopped_before_the_dump_finds_the_leak_from_the_state_and_claims_no_peak() {
    let path = fixture_with_prefix("extra9", "q18_");
    let script = format!("{}.py", stem(&path));
    let out = analyze(&path);
    let leaks = of_kind(&out, "reference_leak");
    assert!(leaks.len() == 1 && at(leaks[0], &script, 26), "{}", describe(&out));
    assert_eq!(leaks[0]["facts"]["origin"], "state_only");
    assert!(out["devices"][0]["peak_allocated_bytes"].is_null(), "{}", out["devices"][0]);
    let text = common::memsnap(&["analyze", path.to_str().unwrap()]);
    assert_eq!(text.code, Some(0), "{}", text.stderr);
    assert!(text.stdout.contains("peak allocated not established"), "{}", text.stdout);
    assert!(!text.stdout.contains("Allocated at peak"), "{}", text.stdout);
}

/// A dataset that caches each sample on the GPU at its first read (q36, real run): the line
/// allocates only on a miss, fills during the first of three epochs and keeps all it made; the
/// training goes on twice as long without it. Bounded by the dataset, not a leak.
#[test]
fn a_gpu_dataset_cache_full_after_the_first_epoch_is_not_a_leak() {
    let out = analyze(&fixture_with_prefix("extra9", "q36_"));
    assert!(of_kind(&out, "reference_leak").is_empty(), "{}", describe(&out));
}

/// L-BFGS's history of update directions (q54, real run: `history_size=100`, 14 steps of 4
/// inner iterations): the optimizer keeps a new pair of flat vectors each iteration, so its state
/// grows all run, by design and up to `history_size`. Said as `waste` with origin
/// `optimizer_history`, so a CI gate on leaks passes it.
#[test]
fn lbfgs_history_is_bounded_waste_not_a_leak() {
    let path = fixture_with_prefix("extra9", "q54_");
    let out = analyze(&path);
    let found = of_kind(&out, "reference_leak");
    assert!(found.len() == 1 && found[0]["severity"] == "waste", "{}", describe(&out));
    assert_eq!(found[0]["facts"]["origin"], "optimizer_history");
    let check = common::memsnap(&["check", path.to_str().unwrap(), "--fail-on", "leaks"]);
    assert_eq!(check.code, Some(0), "{}{}", check.stdout, check.stderr);
}

/// A gradient log started at step 13 of 20 (q56, real run): 7 of 20 backward iterations keep
/// their gradients, every one from the log's start to the end. Named at the `.backward()` line
/// (the gradients' maker), growing by the logged weights' gradients per iteration from the log's
/// start: 512×1024, three 1024×1024 and one 1×1024 float32 weights, 14 MiB + 4 KiB.
#[test]
fn a_gradient_log_started_late_is_a_leak() {
    let path = fixture_with_prefix("extra9", "q56_");
    let script = format!("{}.py", stem(&path));
    let out = analyze(&path);
    let found = of_kind(&out, "unreleased_gradient");
    assert!(found.len() == 1 && at(found[0], &script, 26) && found[0]["severity"] == "leak", "{}", describe(&out));
    assert_eq!(found[0]["growth_bytes_per_iteration"].as_u64(), Some((14 << 20) + 4096), "{}", describe(&out));
}

/// A detector (fixtures/extra11, real runs): Faster R-CNN's forward also runs much code autograd
/// saves nothing for (anchors, box decoding, sampling, NMS), so only 22-25% of a pass's blocks
/// outlive it even with grad on, under the 30% share that reads as "grad on". Its survivors
/// still come from some 37 allocation stacks (a no-grad pass keeps outputs and cache writes from
/// a handful). n02 validates every 3 steps in eval mode without `no_grad` and keeps the
/// detections: its graphs, found as a missing `no_grad` kept with its graph, at the model line
/// (l.31), not as outputs "run without grad".
#[test]
fn a_detector_evaluated_with_grad_on_is_not_taken_for_a_no_grad_pass() {
    let path = fixture_with_prefix("extra11", "n02_");
    let script = format!("{}.py", stem(&path));
    let out = analyze(&path);
    for kind in ["no_grad_missing", "retained_graph"] {
        let found = of_kind(&out, kind);
        assert!(
            found.len() == 1 && at(found[0], &script, 31) && found[0]["severity"] == "leak",
            "n02: expected one {kind} [leak] at {script}:31, got:{}",
            describe(&out)
        );
    }
    assert!(of_kind(&out, "reference_leak").is_empty(), "{}", describe(&out));
    let clean = analyze(&fixture_with_prefix("extra11", "n01_"));
    assert!(of_kind(&clean, "no_grad_missing").is_empty() && of_kind(&clean, "retained_graph").is_empty());
    // RetinaNet evaluated without `no_grad`, only numbers kept (n33): a peak at l.37; Faster
    // R-CNN's `no_grad` validation (n32) keeps a few stacks' detections: grad off, nothing.
    let path = fixture_with_prefix("extra11", "n33_");
    let script = format!("{}.py", stem(&path));
    let out = analyze(&path);
    let found = of_kind(&out, "no_grad_missing");
    assert!(found.len() == 1 && at(found[0], &script, 37) && found[0]["severity"] == "peak", "n33:{}", describe(&out));
    let clean = analyze(&fixture_with_prefix("extra11", "n32_"));
    assert!(of_kind(&clean, "no_grad_missing").is_empty() && of_kind(&clean, "retained_graph").is_empty());
}

/// A render without `no_grad` (fixtures/extra12, real runs) through the function training calls
/// too (`render_rays`, whose model call is l.67 in o06 and l.64 in o15). o06's render (1.39 GiB
/// of graphs) stays under training's own peak: waste, said so, not dropped; o15's larger render
/// sets the peak. Both name the render's own line (l.101, l.98), which no training pass goes
/// through, as where `no_grad` belongs. A clean twin (o05) renders under `no_grad`.
#[test]
fn graphs_of_an_evaluation_through_shared_code_are_named_at_the_evaluation() {
    for (prefix, severity, call, eval) in [("o06_", "waste", 67, 101), ("o15_", "peak", 64, 98)] {
        let path = fixture_with_prefix("extra12", prefix);
        let script = format!("{}.py", stem(&path));
        let out = analyze(&path);
        let found = of_kind(&out, "no_grad_missing");
        assert!(
            found.len() == 1 && at(found[0], &script, call) && found[0]["severity"] == severity,
            "{prefix}: expected one no_grad_missing [{severity}] at {script}:{call}, got:{}",
            describe(&out)
        );
        assert_eq!(found[0]["facts"]["reached_from"]["line"].as_u64(), Some(eval), "{}", describe(&out));
        let advice = found[0]["advice"].as_str().unwrap();
        assert!(advice.contains(&format!("{script}:{eval}")), "{prefix}: {advice}");
    }
    assert!(of_kind(&analyze(&fixture_with_prefix("extra12", "o05_")), "no_grad_missing").is_empty());
}

/// Activation checkpointing (fixtures/extra13, real runs): autograd saves only each checkpointed
/// block's input and the head's tensors, so an evaluation pass run with grad on keeps few of the
/// blocks it makes, under both shares that read as grad on. It keeps as many as the checkpointed
/// training passes save, which is the measure: g01's kept validation losses hold their graphs
/// (a missing `no_grad`, the graph kept) at the validation line, not outputs of no-grad passes;
/// its twin g02 (`no_grad` validation, `.item()`) has neither.
#[test]
fn checkpointed_evaluation_with_grad_on_is_measured_against_checkpointed_training() {
    let path = fixture_with_prefix("extra13", "g01_");
    let script = format!("{}.py", stem(&path));
    let out = analyze(&path);
    for kind in ["no_grad_missing", "retained_graph"] {
        let found = of_kind(&out, kind);
        assert!(
            found.len() == 1 && at(found[0], &script, 93) && found[0]["severity"] == "leak",
            "g01: expected one {kind} [leak] at {script}:93, got:{}",
            describe(&out)
        );
    }
    assert!(of_kind(&out, "reference_leak").is_empty(), "{}", describe(&out));
    let clean = analyze(&fixture_with_prefix("extra13", "g02_"));
    for kind in ["no_grad_missing", "retained_graph", "reference_leak"] {
        assert!(of_kind(&clean, kind).is_empty(), "g02:{}", describe(&clean));
    }
}

/// `best_models.append(copy.deepcopy(model))` whenever the score improves (fixtures/extra13,
/// g05): each copy's parameters come from `Parameter.__deepcopy__`, a model built as much as one
/// constructed, so the kept copies are named as models kept, at the copy's line; rebinding
/// `best_model = copy.deepcopy(model)` (g06) keeps one copy and is clean.
#[test]
fn deep_copies_of_a_model_kept_in_a_list_are_models_kept() {
    let path = fixture_with_prefix("extra13", "g05_");
    let script = format!("{}.py", stem(&path));
    let out = analyze(&path);
    let found = of_kind(&out, "reference_leak");
    assert!(
        found.len() == 1 && at(found[0], &script, 55) && found[0]["facts"]["origin"] == "models_kept",
        "g05:{}",
        describe(&out)
    );
    assert!(of_kind(&analyze(&fixture_with_prefix("extra13", "g06_")), "reference_leak").is_empty());
}

/// A learning-rate sweep (fixtures/extra11, real runs) that builds a model per trial, every 15
/// training steps, and stores each in its results (n07): the models' parameters, made by
/// `.cuda()` at l.27, from 4 of 4 trials, origin `models_kept`. The trials' rhythm is not a fill
/// that stopped: the 14 steps after the last build are fewer than the pause between two builds.
/// Storing only the scores (n08) leaves one model alive at a time: no leak.
#[test]
fn models_built_and_kept_round_after_round_are_a_leak() {
    let path = fixture_with_prefix("extra11", "n07_");
    let script = format!("{}.py", stem(&path));
    let out = analyze(&path);
    let leak = the_one_leak(&out, &script, 27);
    assert_eq!(leak["facts"]["origin"], "models_kept", "{}", leak["facts"]);
    assert_eq!(leak["bytes"].as_u64(), Some(4 * 16_793_600), "{}", describe(&out));
    let clean = analyze(&fixture_with_prefix("extra11", "n08_"));
    assert!(of_kind(&clean, "reference_leak").is_empty(), "n08:{}", describe(&clean));
}

/// `retain_grad()` on an activation the loop keeps (fixtures/extra10/k01, real run): the kept
/// activations' `.grad`, made by the engine, are a leak at the backward line (l.40) of 16 x
/// 2 MiB. The backward line also holds the last step's parameter gradients and the cuBLAS
/// workspace its first backward made (52 MiB more): alive at the dump, but not kept by a
/// reference, so not counted. Its near miss logs only the norm (k02): no leak.
#[test]
fn kept_activation_gradients_count_without_the_current_parameter_gradients() {
    let path = fixture_with_prefix("extra10", "k01_");
    let script = format!("{}.py", stem(&path));
    let out = analyze(&path);
    let leaks = of_kind(&out, "reference_leak");
    let backward = leaks.iter().find(|s| at(s, &script, 40)).unwrap_or_else(|| panic!("{}", describe(&out)));
    assert_eq!(backward["facts"]["origin"], "backward", "{}", backward["facts"]);
    assert_eq!(backward["bytes"].as_u64(), Some(16 * (2 << 20)), "{}", describe(&out));
    let clean = analyze(&fixture_with_prefix("extra10", "k02_"));
    assert!(of_kind(&clean, "reference_leak").is_empty(), "k02:{}", describe(&clean));
}

/// A state-only recording (`enabled="state"`, fixtures/extra11, real runs) dumped while a GPT-2
/// decodes (n24): the 8 blocks of transformers' KV cache come from the line that runs the model,
/// as many blocks as a leak would leave, but a dump alone cannot tell one generation's cache
/// from caches kept across requests: no suspect, and a caveat says why. A state-only leak of
/// kept feature maps (n25) is still found at its line (l.23, 24 x 2 MiB).
#[test]
fn a_state_only_dump_during_generation_is_not_a_leak_of_its_kv_cache() {
    let out = analyze(&fixture_with_prefix("extra11", "n24_"));
    assert!(of_kind(&out, "reference_leak").is_empty(), "{}", describe(&out));
    let caveats = out["devices"][0]["caveats"].to_string();
    assert!(caveats.contains("8 blocks alive at the dump (2.25 MiB) hold transformers' KV cache"), "{caveats}");

    let path = fixture_with_prefix("extra11", "n25_");
    let script = format!("{}.py", stem(&path));
    let out = analyze(&path);
    let leaks = of_kind(&out, "reference_leak");
    let fmaps = leaks.iter().find(|s| at(s, &script, 23)).unwrap_or_else(|| panic!("{}", describe(&out)));
    assert_eq!(fmaps["facts"]["origin"], "state_only", "{}", fmaps["facts"]);
    assert_eq!(fmaps["bytes"].as_u64(), Some(24 * (2 << 20)), "{}", describe(&out));
}

#[test]
fn a_hooks_kept_copies_made_before_a_ring_window_are_counted_in_its_evidence() {
    // r04 (ring of ~7 steps): a forward hook added every epoch keeps a clone of its first output
    // (l.46, inside the model call). 3 clones are made in the window; the dump names l.46 for 4
    // more made before it, which the evidence counts (`facts.before_trace`), as it does for a
    // pass's outputs and user code: 7 clones of 8.27 MiB, what the program keeps.
    let out = analyze(&fixture_with_prefix("extra29", "r04_"));
    let s = &out["suspects"][0];
    assert_eq!((s["kind"].as_str(), s["site"]["line"].as_u64()), (Some("reference_leak"), Some(46)), "{s}");
    assert_eq!(s["facts"]["blocks"], 3, "{s}");
    assert_eq!(s["facts"]["before_trace"]["blocks"], 4, "{s}");
    assert_eq!(s["facts"]["before_trace"]["bytes"], 34_668_544, "{s}");
}

#[test]
fn blocks_an_earlier_occurrence_of_the_same_code_path_made_before_a_ring_window_are_counted() {
    // aa05 (ring of ~3 of 16 steps): closures keep the attention maps of a softmax (l.42) inside
    // an attention module; the suspect is named at the module's call in the block (l.56), which
    // is neither the line that ran the model nor the innermost user line. The dump has 27 more
    // maps made before the window by the same stack, frame for frame: what the program keeps.
    let out = analyze(&fixture_with_prefix("extra30", "aa05_"));
    let s = &out["suspects"][0];
    assert_eq!((s["kind"].as_str(), s["site"]["line"].as_u64()), (Some("reference_leak"), Some(56)), "{s}");
    assert_eq!(s["facts"]["blocks"], 5, "{s}");
    assert_eq!(s["facts"]["before_trace"]["blocks"], 27, "{s}");
    assert_eq!(s["facts"]["before_trace"]["bytes"], 27 * 4 * 1024 * 1024, "{s}");
}

/// Per-example gradients from `torch.func` (real runs, fixtures/extra31 and extra9). Under
/// `vmap(grad(..))` the autograd engine runs `nll_loss_backward`'s Python decomposition on its
/// own thread: a stack of torch's decomposition frames alone, which must not end the backward
/// window, or the engine's frameless allocations after it (the gradients) read as made by no
/// line. s75 keeps each step's per-example gradients for an audit: one reference_leak at the
/// `vmap(grad(..))` call (line 39), origin `grad_results` (not a backward hook's tensors, and not
/// parameter gradients: no parameter has their sizes). q10 uses and frees them within the step:
/// no suspect, and its peak names the call, with the gradients as temporaries.
#[test]
fn per_example_gradients_from_torch_func_are_placed_at_the_call() {
    let path = fixture_with_prefix("extra31", "s75_");
    let script = format!("{}.py", stem(&path));
    let out = analyze(&path);
    let leak = the_one_leak(&out, &script, 39);
    assert_eq!(leak["facts"]["origin"], "grad_results", "{}", leak["facts"]);
    assert!(of_kind(&out, "unreleased_gradient").is_empty(), "s75:{}", describe(&out));

    let clean = analyze(&fixture_with_prefix("extra9", "q10_"));
    assert!(clean["suspects"].as_array().unwrap().is_empty(), "q10:{}", describe(&clean));
    let peak = &clean["devices"][0]["peak"];
    let top = &peak["by_site"][0];
    assert_eq!(top["site"]["line"], 32, "q10's largest site at the peak: {top}");
    assert!(top["label"].as_str().unwrap().starts_with("backward launched at"), "{top}");
    assert_eq!(peak["by_category"]["temporaries"].as_u64(), Some(68_554_240), "{}", peak["by_category"]);
}

/// A hook the autograd engine runs in the middle of a backward pass (real run, fixtures/extra31
/// s82: `head.weight.register_hook(lambda g, feat=feat: ...)` registered every step and never
/// removed) allocates with the hook's frames alone: nothing in Python called it. Such a stack
/// must not end the backward window, or the saved tensors the engine frees after the hook read
/// as never freed, a graph kept (`retained_graph`, as s82 read). What leaks is each step's
/// `feat`, returned by the model and held by the closures: one reference_leak at the model call
/// (line 43), 2 MiB per iteration, and no retained_graph. A module's full backward hook that
/// clones each step's `grad_output` (s93, run through `torch/utils/hooks.py`) is named at its
/// clone line; optimizers stepped per parameter from `register_post_accumulate_grad_hook` (s94,
/// clean) are counted as steps, one per backward, though the engine runs them.
#[test]
fn a_hook_run_by_the_engine_does_not_end_the_backward_pass() {
    let path = fixture_with_prefix("extra31", "s82_");
    let script = format!("{}.py", stem(&path));
    let out = analyze(&path);
    assert!(of_kind(&out, "retained_graph").is_empty(), "s82:{}", describe(&out));
    let leak = the_one_leak(&out, &script, 43);
    assert_eq!(leak["growth_bytes_per_iteration"].as_u64(), Some(2 << 20), "{}", describe(&out));

    let path = fixture_with_prefix("extra31", "s93_");
    let out = analyze(&path);
    assert_eq!(suspects(&out).len(), 1, "s93:{}", describe(&out));
    the_one_leak(&out, &format!("{}.py", stem(&path)), 24);

    let clean = analyze(&fixture_with_prefix("extra31", "s94_"));
    assert!(suspects(&clean).is_empty(), "s94:{}", describe(&clean));
    let phases = &clean["devices"][0]["phases"];
    assert_eq!(
        (phases["backward_passes"].as_u64(), phases["optimizer_steps"].as_u64()),
        (Some(16), Some(16)),
        "{phases}"
    );
}

/// An evaluation run by a thread the program started (ab09: a `threading.Thread` worker under
/// `no_grad`; ab11: a `ThreadPoolExecutor`'s) interleaves its model calls with the training
/// step's events in one trace. They are the worker's, not passes of the loop: before, they cut
/// the training passes and backwards apart and ab09 read as `no_grad_missing` and
/// `retained_graph` at the training line. A worker that keeps its logits (ab10) is named at its
/// model call, with the worker's own words, and so is a producer whose unbounded queue outruns
/// the loop (ab15), at its line.
#[test]
fn a_worker_threads_model_calls_are_not_passes_of_the_training_loop() {
    for clean in ["ab09_", "ab11_"] {
        let out = analyze(&fixture_with_prefix("extra32", clean));
        assert!(suspects(&out).is_empty(), "{clean}:{}", describe(&out));
    }
    for (prefix, line) in [("ab10_", 37), ("ab15_", 33)] {
        let path = fixture_with_prefix("extra32", prefix);
        let out = analyze(&path);
        assert_eq!(suspects(&out).len(), 1, "{prefix}:{}", describe(&out));
        let leak = the_one_leak(&out, &format!("{}.py", stem(&path)), line);
        assert_eq!(leak["facts"]["origin"], "worker_thread", "{}", describe(&out));
    }
}

/// A training loop run whole in a thread (as Ray Train runs the user's function): its passes
/// and backwards are the program's, not a worker's beside them. ab19 is clean; ab18's kept
/// logits are a trained pass's outputs at its model call. So are a server's `generate` calls
/// run in a thread per request while the script's thread runs no model (ab20 clean; ab21 keeps
/// every request's scores, named at the `generate` call, which read as nothing while the
/// thread's calls were not passes).
#[test]
fn passes_run_only_by_a_started_thread_stay_the_programs() {
    let clean = analyze(&fixture_with_prefix("extra32", "ab20_"));
    assert!(suspects(&clean).is_empty(), "ab20:{}", describe(&clean));
    let path = fixture_with_prefix("extra32", "ab21_");
    let out = analyze(&path);
    let leak = the_one_leak(&out, &format!("{}.py", stem(&path)), 24);
    assert_eq!(leak["facts"]["origin"], "no_grad_forward", "{}", describe(&out));
    assert_eq!(suspects(&out).len(), 1, "ab21:{}", describe(&out));

    let clean = analyze(&fixture_with_prefix("extra32", "ab19_"));
    assert!(suspects(&clean).is_empty(), "ab19:{}", describe(&clean));
    assert_eq!(clean["devices"][0]["phases"]["backward_passes"].as_u64(), Some(20), "{}", describe(&clean));
    let path = fixture_with_prefix("extra32", "ab18_");
    let out = analyze(&path);
    let leak = the_one_leak(&out, &format!("{}.py", stem(&path)), 27);
    assert_eq!(leak["facts"]["origin"], "trained_forward", "{}", describe(&out));
}

/// `torch.func.grad` runs `autograd.grad(create_graph=True)` and lets the graph go as the
/// transform returns, from its own frames: those frees are its backward's, so a functional
/// training loop (ab01) keeps no graph, and one that keeps every step's weight dict (ab02) is
/// named at the update line as a kept tensor, not as kept graphs.
#[test]
fn a_torch_func_transform_frees_its_graph_within_its_backward() {
    let out = analyze(&fixture_with_prefix("extra32", "ab01_"));
    assert!(suspects(&out).is_empty(), "ab01:{}", describe(&out));
    let path = fixture_with_prefix("extra32", "ab02_");
    let out = analyze(&path);
    assert!(of_kind(&out, "retained_graph").is_empty(), "ab02:{}", describe(&out));
    the_one_leak(&out, &format!("{}.py", stem(&path)), 40);
}

/// A new `torch.cuda.Stream()` each step (ab05): cuBLAS makes a workspace on every stream of
/// the pool it first runs a matmul on and keeps it, 96 blocks on 32 streams, held by no
/// reference. Said as a device caveat, not a leak (before: two reference_leaks, 2 GiB).
#[test]
fn a_workspace_per_side_stream_is_a_caveat_not_a_leak() {
    let out = analyze(&fixture_with_prefix("extra32", "ab05_"));
    assert!(suspects(&out).is_empty(), "ab05:{}", describe(&out));
    let caveats = out["devices"][0]["caveats"].to_string();
    assert!(caveats.contains("96 blocks (2.03 GiB) on 32 side streams"), "{caveats}");
}

/// FGSM's perturbation leaves (`torch.zeros_like(x, requires_grad=True)`) kept every step
/// (ab08): the leaf is named at its line, and the `.grad` the backward gave each one (of its
/// size, alive as long as it) at the backward's line, with the leaf's words, not a hook's.
#[test]
fn a_kept_leaf_keeps_its_grad_and_says_so() {
    let path = fixture_with_prefix("extra32", "ab08_");
    let script = format!("{}.py", stem(&path));
    let out = analyze(&path);
    let leaks = of_kind(&out, "reference_leak");
    let origin_at = |line: u64| leaks.iter().find(|s| at(s, &script, line)).map(|s| s["facts"]["origin"].clone());
    assert_eq!(origin_at(26), Some(Value::from("user_code")), "{}", describe(&out));
    assert_eq!(origin_at(27), Some(Value::from("leaf_gradients")), "{}", describe(&out));
}

/// Backward passes whose launch allocates nothing from Python: a vectorized
/// `autograd.functional.jacobian` hands its batched backward the seeds it made (ac09), a
/// Hessian-vector product its Rademacher vectors (ac04). The engine's frameless run is still a
/// backward pass: the forward it runs through is not an evaluation (ac09 read before as five
/// evaluation windows, the gradients alive through them as waste), and its line is named where
/// the trace shows the call in progress (the `jacobian` call).
#[test]
fn a_backward_handed_its_seed_is_still_a_backward() {
    let path = fixture_with_prefix("extra33", "ac09_");
    let out = analyze(&path);
    let phases = &out["devices"][0]["phases"];
    assert_eq!(phases["backward_passes"], 30, "25 training backwards and 5 silent ones: {phases}");
    assert_eq!(phases["evaluation_windows"], 0, "{phases}");
    assert!(suspects(&out).is_empty(), "ac09:{}", describe(&out));
    // The kept Hessian-vector products: gradients of every step kept, not blocks "recorded
    // without stacks" (the file has stacks; the engine's allocations have no Python frames).
    let path = fixture_with_prefix("extra33", "ac04_");
    let script = format!("{}.py", stem(&path));
    let out = analyze(&path);
    // The launch line is not in the trace; a caveat says so, and between which lines it lies.
    let caveats = out["devices"][0]["caveats"].to_string();
    assert!(
        caveats.contains("10 backward passes allocated nothing from Python")
            && caveats.contains(&format!("launched between fixtures/gen/{script}:27 (hutchinson) and")),
        "{caveats}"
    );
    let kept = of_kind(&out, "unreleased_gradient");
    assert_eq!(kept.len(), 1, "{}", describe(&out));
    assert_eq!(kept[0]["severity"], "leak", "{}", describe(&out));
    assert!(of_kind(&out, "reference_leak").is_empty(), "{}", describe(&out));
    // FSDP2's post-backward hooks, run by the engine on its thread with no user frame, end the
    // window they run in: the engine's work after them is the same backward going on, named
    // after its launch, not a launch of its own (ad05: 48 such runs).
    let out = analyze(&fixture_with_prefix("extra34", "ad05_"));
    let caveats = out["devices"][0]["caveats"].to_string();
    assert!(!caveats.contains("allocated nothing from Python"), "{caveats}");
}

/// A trace with no backward pass and no model call (CUDA-graph replays allocate nothing:
/// `torch.compile(mode="reduce-overhead")`, a hand-captured `CUDAGraph`; plain tensor code)
/// still has a loop: its iterations are read from the statements that allocate, and what a line
/// keeps from every one of them is a leak (read before as nothing: no iterations). The clean
/// twins stay clean, and so does a simulation whose single allocating statement calls a
/// function (its iterations read one level in) and that memoises a mask per grid size.
#[test]
fn a_loop_without_model_calls_still_has_iterations() {
    for (prefix, line) in [("ac08_", 28), ("ac19_", 37), ("ac17_", 25)] {
        let path = fixture_with_prefix("extra33", prefix);
        let script = format!("{}.py", stem(&path));
        let out = analyze(&path);
        assert_eq!(out["devices"][0]["phases"]["iteration_source"], "loop", "{prefix}");
        let leaks = of_kind(&out, "reference_leak");
        assert!(leaks.iter().any(|s| at(s, &script, line)), "{prefix}:{}", describe(&out));
    }
    for prefix in ["ac18_", "ac20_", "ac21_"] {
        let out = analyze(&fixture_with_prefix("extra33", prefix));
        assert!(suspects(&out).is_empty(), "{prefix}:{}", describe(&out));
    }
    let out = analyze(&fixture_with_prefix("extra33", "ac21_"));
    assert_eq!(out["devices"][0]["phases"]["iterations"], 60, "one per simulation step");
}

/// Gradients held through an evaluation are waste in proportion to what the evaluation
/// allocated: 1.2 MiB of a small CNN's gradients beside a 100 MiB evaluation would not move its
/// peak (x01, a clean CNN with `zero_grad` at the step's start), while the fixtures planted as
/// waste hold 8-14% of theirs.
#[test]
fn gradients_that_are_a_sliver_of_the_evaluation_are_not_waste() {
    let out = analyze(&fixture_with_prefix("extra", "x01_"));
    assert!(of_kind(&out, "unreleased_gradient").is_empty(), "x01:{}", describe(&out));
    let out = analyze(&fixture_with_prefix("extra3", "z10_"));
    let waste = of_kind(&out, "unreleased_gradient");
    assert_eq!(waste.len(), 1, "{}", describe(&out));
    let share = waste[0]["facts"]["hold"]["through_evaluation"]["share_of_allocated"].as_f64().unwrap();
    assert!(share > 0.05, "{share}");
}

/// Under iterations read from the loop's statements alone, a line whose kept blocks are sizes
/// it also made and let go keeps a sample by policy; `topk`'s values and indices are its
/// results, beside seven scratch buffers of other sizes: a leak (ad09: a plain-tensor service
/// keeping every request's `topk`; read before as nothing). Its clean twin stays clean.
#[test]
fn a_results_scratch_is_not_a_sample_of_like_tensors() {
    let path = fixture_with_prefix("extra34", "ad09_");
    let script = format!("{}.py", stem(&path));
    let out = analyze(&path);
    assert_eq!(out["devices"][0]["phases"]["iteration_source"], "loop");
    assert!(of_kind(&out, "reference_leak").iter().any(|s| at(s, &script, 31)), "{}", describe(&out));
    let out = analyze(&fixture_with_prefix("extra34", "ad10_"));
    assert!(suspects(&out).is_empty(), "ad10:{}", describe(&out));
}

/// Fragmentation is holes too scattered to serve requests: one hole that holds most of the
/// split bytes (ad10: the 164 MiB of 167 that a setup step's freed input left) serves every
/// request up to its size, as cache does, while the planted fragmentation (s07, z14) leaves its
/// largest hole 9-15% of them.
#[test]
fn one_large_hole_is_cache_not_fragmentation() {
    let out = analyze(&fixture_with_prefix("extra34", "ad10_"));
    assert!(of_kind(&out, "fragmentation").is_empty(), "ad10:{}", describe(&out));
    for (set, prefix) in [("dev", "s07_"), ("extra3", "z14_")] {
        let out = analyze(&fixture_with_prefix(set, prefix));
        assert_eq!(of_kind(&out, "fragmentation").len(), 1, "{prefix}:{}", describe(&out));
    }
}

/// A recurrence unrolled in the training loop (ad03: `h = cell(x[:, t], h)` 96 model calls a
/// batch, one backward) runs each call site again before its backward: the backward frees their
/// saved tensors, so every call was trained, not an evaluation window (read before as 16). The
/// optimizer steps are Adam's 16, not those and the `zero_grad` calls between forward and
/// backward, which only free (read before as 31); an SGD whose steps allocate nothing shows one
/// step per iteration through its `zero_grad` (ab05: 44).
#[test]
fn a_recurrence_unrolled_in_the_loop_is_trained_by_its_one_backward() {
    let out = analyze(&fixture_with_prefix("extra34", "ad03_"));
    let phases = &out["devices"][0]["phases"];
    assert_eq!(phases["forward_passes"], 1536, "{phases}");
    assert_eq!(phases["evaluation_windows"], 0, "{phases}");
    assert_eq!(phases["optimizer_steps"], 16, "{phases}");
    assert!(suspects(&out).is_empty(), "ad03:{}", describe(&out));
    let out = analyze(&fixture_with_prefix("extra32", "ab05_"));
    assert_eq!(out["devices"][0]["phases"]["optimizer_steps"], 44);
}

/// A value let go as its function returns is no replaced cache entry: af18's evaluation function
/// copies its input (`x = xb.clone().requires_grad_()`), appends the saliency map it computes to
/// a global list and returns; the copy is freed at the caller's line right after the map was
/// made, of the map's size. The store test asks that the free hold the new tensor's line (read
/// before as a cache at capacity, so nothing).
#[test]
fn a_local_freed_at_return_is_not_a_replaced_entry() {
    let path = fixture_with_prefix("extra36", "af18_");
    let script = format!("{}.py", stem(&path));
    let out = analyze(&path);
    assert!(of_kind(&out, "reference_leak").iter().any(|s| at(s, &script, 33)), "{}", describe(&out));
}

/// Optimizers remade per stage while the old ones stay referenced, after a head of another width
/// was swapped in (af16: three Adams over the same backbone, made every 10 steps): state made
/// again for the same parameters is counted per optimizer, not per iteration, and a changed head
/// beside the repeated backbone sizes does not hide it (read before as nothing). One optimizer
/// handed a new parameter each iteration (t06) stays "new parameters", not restarts.
#[test]
fn optimizers_remade_per_stage_and_kept_are_a_leak() {
    let path = fixture_with_prefix("extra36", "af16_");
    let script = format!("{}.py", stem(&path));
    let out = analyze(&path);
    let found = of_kind(&out, "reference_leak");
    assert!(found.iter().any(|s| at(s, &script, 63)), "{}", describe(&out));
    assert_eq!(found[0]["facts"]["origin"], "optimizer_state_remade", "{}", describe(&out));
    let out = analyze(&fixture_with_prefix("extra7", "t06_"));
    assert_eq!(of_kind(&out, "reference_leak")[0]["facts"]["origin"], "optimizer_state", "{}", describe(&out));
}

/// A discriminator updated every other step whose loss is logged as a tensor (af14): the skipped
/// steps' graphs are kept, and with them the real batch and the generated images their
/// convolutions saved; the last skipped pass, with no later pass of its line, is one more skipped
/// step, not an evaluation. One retained_graph at the loss line (read before as that, plus two
/// kept-input reference leaks, a missing `no_grad` and gradients held through "evaluation").
#[test]
fn a_skipped_steps_graph_holds_its_inputs_and_its_last_pass_is_no_evaluation() {
    let path = fixture_with_prefix("extra36", "af14_");
    let script = format!("{}.py", stem(&path));
    let out = analyze(&path);
    let all = suspects(&out);
    assert_eq!(all.len(), 1, "{}", describe(&out));
    assert!(of_kind(&out, "retained_graph").iter().any(|s| at(s, &script, 70)), "{}", describe(&out));
}

/// What a model's own `forward` makes in a loop is an intermediate, not a result: ag08's decoder
/// appends each decoding step's attention weights (a softmax in its own `forward`, 24 a pass) to
/// a list of its own. Named at the softmax line inside the model (read before as an output, at
/// the decoder call). A compiled model's returned features, made outside any submodule under
/// `torch.compile`'s wrapper, stay an output at the model call (aa01).
#[test]
fn a_models_own_loop_makes_intermediates_not_results() {
    let path = fixture_with_prefix("extra37", "ag08_");
    let script = format!("{}.py", stem(&path));
    let out = analyze(&path);
    assert!(of_kind(&out, "reference_leak").iter().any(|s| at(s, &script, 61)), "{}", describe(&out));
    let path = fixture_with_prefix("extra30", "aa01_");
    let script = format!("{}.py", stem(&path));
    let out = analyze(&path);
    assert!(of_kind(&out, "reference_leak").iter().any(|s| at(s, &script, 71)), "{}", describe(&out));
}

/// A tensor the model's own `forward` re-makes larger each step is one tensor that grows: ah11's
/// MoCo module does `self.queue = torch.cat([self.queue, k])` inside its `forward` and never
/// slices it. Each step's queue frees the one before it, so no block outlives an iteration, yet
/// the live queue grows by one batch of keys per step (read as clean before: chains were read
/// outside model calls only). Its twin slicing the queue to the last K rows (ah10) stays clean.
#[test]
fn a_tensor_a_model_re_makes_larger_each_step_is_a_leak() {
    let path = fixture_with_prefix("extra38", "ah11_");
    let script = format!("{}.py", stem(&path));
    let out = analyze(&path);
    let leak = the_one_leak(&out, &script, 71);
    assert_eq!(leak["facts"]["origin"], "regrown", "{leak}");
    assert_eq!(leak["growth_bytes_per_iteration"].as_u64(), Some(1 << 20), "{leak}");
    let out = analyze(&fixture_with_prefix("extra38", "ah10_"));
    assert!(suspects(&out).iter().all(|s| s["severity"] != "leak"), "{}", describe(&out));
}

/// One line that re-makes one tensor per call (each of aj04's three layers running
/// `self.mem = torch.cat([self.mem, x.detach()], 1)`, never sliced) is read as one leak of three
/// tensors: each version is paired with the one its statement replaced, not with the line's
/// previous block (the layer before's memory, of the same size), which read as no chain at all.
/// Its twin that slices the memory (aj03) stays clean.
#[test]
fn one_line_re_making_a_tensor_per_layer_is_one_leak_of_several_tensors() {
    let path = fixture_with_prefix("extra40", "aj04_");
    let script = format!("{}.py", stem(&path));
    let out = analyze(&path);
    let leak = the_one_leak(&out, &script, 59);
    assert_eq!(leak["facts"]["origin"], "regrown", "{leak}");
    assert_eq!(leak["facts"]["tensors"], 3, "{leak}");
    let out = analyze(&fixture_with_prefix("extra40", "aj03_"));
    assert!(suspects(&out).iter().all(|s| s["severity"] != "leak"), "{}", describe(&out));
}

/// An LSTM language model returns its logits and its two states: under `inference_mode` those 3
/// blocks outlive each pass (carried to the next chunk), as few as autograd saves of a small
/// pass. ak18 was read as evaluation with grad on (3 of 9 blocks kept); a pass is read so from
/// 4 survivors on. Its twin without no_grad (ak17) still reads as both.
#[test]
fn an_rnn_returning_its_states_under_inference_mode_is_not_read_as_grad_on() {
    let out = analyze(&fixture_with_prefix("extra41", "ak18_"));
    assert!(suspects(&out).is_empty(), "{}", describe(&out));
    let out = analyze(&fixture_with_prefix("extra41", "ak17_"));
    assert_eq!(of_kind(&out, "no_grad_missing").len(), 1, "{}", describe(&out));
    assert_eq!(of_kind(&out, "retained_graph").len(), 1, "{}", describe(&out));
}

/// A cache filled at its first reads and then only read, of which a wrapped ring kept the last
/// two filling steps (al10): the like blocks made before the trace count as one more occurrence
/// for its stopping as they do for its growth, and eight steps read from the full cache. Read
/// before as a leak. Its twin with new keys every step (al09) is one.
#[test]
fn a_cache_full_before_the_ring_wrapped_and_only_read_since_is_bounded() {
    let out = analyze(&fixture_with_prefix("extra42", "al10_"));
    assert!(suspects(&out).iter().all(|s| s["severity"] != "leak"), "{}", describe(&out));
    let path = fixture_with_prefix("extra42", "al09_");
    let script = format!("{}.py", stem(&path));
    the_one_leak(&analyze(&path), &script, 63);
}

/// A ring that holds one validation pass of a trainer whose callback keeps every pass's outputs
/// (al06: 7,000 entries, 2 training steps): the 24 like blocks made before the trace by the same
/// line and alive at the dump are the outputs of earlier passes, as many as they hold the blocks
/// one pass keeps in the trace. Read before as no leak (one pass, plus one for all of them, is
/// too few to show growth); so was s45 (kept in `fixtures/limits` until now).
#[test]
fn outputs_kept_before_a_short_ring_count_as_the_passes_that_made_them() {
    let path = fixture_with_prefix("extra42", "al06_");
    let script = format!("{}.py", stem(&path));
    let out = analyze(&path);
    let leak = the_one_leak(&out, &script, 74);
    assert_eq!(leak["facts"]["before_trace"]["blocks"], 24, "{leak}");
    // A ring of one and a half steps over a residual MLP that appends one hidden state per step
    // (s45): the window's one tap and 15 made before it, at the line that made `h`.
    let path = fixture_with_prefix("extra28b", "s45_");
    let script = format!("{}.py", stem(&path));
    let out = analyze(&path);
    let leak = the_one_leak(&out, &script, 36);
    assert_eq!(leak["facts"]["before_trace"]["blocks"], 15, "{leak}");
}

/// An accumulator reset at every epoch's end (am05: `self.total_loss += loss`, whose hand-written
/// loss keeps its 3 MiB softmax on `ctx` through the accumulated graph): the first epoch's kept
/// tensors were let go all at once by the reset, which read before as a bounded cache evicting,
/// so nothing was reported but fragmentation. A reset lets go of everything kept before it, a
/// cache only of its oldest; the leak is read in the steps since the reset, the reset said in
/// `facts.cleared`. Its near miss, an evaluation's outputs gathered for an epoch-end metric and
/// reset after `compute()` (ai09), stays clean: passes are not asked.
#[test]
fn an_accumulator_reset_each_epoch_still_leaks_through_the_epoch() {
    let path = fixture_with_prefix("extra43", "am05_");
    let script = format!("{}.py", stem(&path));
    let out = analyze(&path);
    let leak = the_one_leak(&out, &script, 66);
    assert_eq!(leak["facts"]["cleared"]["clears"], 1, "{leak}");
    assert_eq!(leak["facts"]["cleared"]["longest_period"], 8, "{leak}");
    assert!(suspects(&out).iter().all(|s| s["kind"] != "fragmentation"), "{}", describe(&out));
    let out = analyze(&fixture_with_prefix("extra39", "ai09_"));
    assert!(suspects(&out).iter().all(|s| s["severity"] != "leak"), "{}", describe(&out));
}

/// A replay buffer appending `(obs, action, reward, next_obs, done)` each step without a
/// capacity (an10): five lines of 4-16 KiB a step, none of them 1 MiB at the dump, kept in the
/// very same passes: one record, one finding of them all (`facts.kept_with`), 1.88 MiB and
/// 48 KiB a step. Read before as no leak. Its twin with a preallocated ring (an09) has none.
#[test]
fn small_tensors_kept_together_each_step_are_one_record() {
    let path = fixture_with_prefix("extra44", "an10_");
    let script = format!("{}.py", stem(&path));
    let out = analyze(&path);
    let leak = the_one_leak(&out, &script, 109);
    assert_eq!(leak["facts"]["kept_with"].as_array().map(Vec::len), Some(4), "{leak}");
    assert!(leak["bytes"].as_u64().unwrap() >= 1 << 20, "{leak}");
    let out = analyze(&fixture_with_prefix("extra44", "an09_"));
    assert!(suspects(&out).iter().all(|s| s["severity"] != "leak"), "{}", describe(&out));
}

/// A greedy decode without `no_grad` whose stacked logits (with their graph) are kept (an08, in
/// `fixtures/limits` for the line of its graph):
/// the decoder's one-block calls beside each step's cell (the embedding lookup, the output head)
/// share the region's grad mode; what they keep is the kept graph's. Read before as three
/// reference leaks more ("passes run without grad") beside the graph's two findings.
#[test]
fn small_calls_beside_a_kept_graph_are_not_passes_without_grad() {
    let out = analyze(
        &common::fixture("limits")
            .join("an08_gru_seq2seq_greedy_eval_without_no_grad_decoded_logits_kept_leak.pickle.xz"),
    );
    assert!(of_kind(&out, "reference_leak").is_empty(), "{}", describe(&out));
    assert_eq!(of_kind(&out, "no_grad_missing").len(), 1, "{}", describe(&out));
    assert_eq!(of_kind(&out, "retained_graph").len(), 1, "{}", describe(&out));
}

/// The reset rule on other shapes: am05's bug with plain SGD, whose step allocates nothing, over
/// two resets (ap03) is read; micro-batches' detached logits kept until the optimizer step of a
/// gradient accumulation and then cleared (ap01: 6 micro-batches a step) are the step's working
/// set (model outputs: the rule does not ask them).
#[test]
fn a_reset_over_optimizer_steps_leaks_and_one_per_step_is_a_working_set() {
    let path = fixture_with_prefix("extra46", "ap03_");
    let script = format!("{}.py", stem(&path));
    let out = analyze(&path);
    let leak = the_one_leak(&out, &script, 60);
    assert_eq!(leak["facts"]["cleared"]["clears"], 2, "{leak}");
    let out = analyze(&fixture_with_prefix("extra46", "ap01_"));
    assert!(suspects(&out).iter().all(|s| s["severity"] != "leak"), "{}", describe(&out));
}

/// GradNorm's gradient norms logged with their `create_graph` graph every step (ak06, kept in
/// `fixtures/limits` for its line): the gradients `torch.autograd.grad` returned, of the shared
/// layer's parameter sizes, are saved by the norms taken of them, so the logged graph keeps them.
/// Read before as a second suspect, kept parameter gradients (`unreleased_gradient [leak]`, whose
/// fix speaks of `.grad` references the program never made); now they are the graph's.
#[test]
fn gradients_that_autograd_grad_returned_and_a_kept_graph_saved_are_the_graphs() {
    let path = common::fixture("limits").join("ak06_gradnorm_gnorm_with_graph_logged_every_step_leak.pickle.xz");
    let out = analyze(&path);
    assert!(of_kind(&out, "unreleased_gradient").is_empty(), "{}", describe(&out));
    let graphs = of_kind(&out, "retained_graph");
    assert_eq!(graphs.len(), 1, "{}", describe(&out));
    assert_eq!(graphs[0]["severity"], "leak", "{}", describe(&out));
    // The norms' 9 create_graph gradients a step (24 MiB) are among its bytes now.
    assert!(graphs[0]["bytes"].as_u64().unwrap() > 400 << 20, "{}", describe(&out));
}

/// Read from the dump's stacks alone (`context="state"`), what a forward hook the user wrote
/// keeps is named at the hook's line, as with stacks on the trace's events: ah13's attention
/// clones, made inside the model call by the hook (read before at the training forward's line).
/// The model output the submodule's own statement made (ah22, with stacks on the events) is
/// named at the model's line that called the block, with that statement given as `made_at`.
#[test]
fn a_hooks_clones_read_from_the_dump_are_named_at_the_hook() {
    let path = fixture_with_prefix("extra38", "ah13_");
    let script = format!("{}.py", stem(&path));
    let out = analyze(&path);
    the_one_leak(&out, &script, 45);
    let path = fixture_with_prefix("extra38", "ah22_");
    let script = format!("{}.py", stem(&path));
    let out = analyze(&path);
    let leak = the_one_leak(&out, &script, 72);
    assert_eq!(leak["facts"]["made_at"]["line"], 59, "{leak}");
}

/// Split segments pinned mostly by a reported leak's tensors are that leak's footprint, not a
/// fragmentation suspect of their own: ah13's kept hook clones, carved out between each step's
/// activations, leave 240 MiB of holes beside them (read before as `fragmentation [waste]`
/// beside the leak, advising an allocator setting). Fragmentation that no leak pins stays:
/// z14's variable-length batches.
#[test]
fn holes_a_leak_pins_are_the_leaks_not_fragmentation() {
    let out = analyze(&fixture_with_prefix("extra38", "ah13_"));
    assert!(of_kind(&out, "fragmentation").is_empty(), "{}", describe(&out));
    assert_eq!(of_kind(&out, "reference_leak").len(), 1, "{}", describe(&out));
    let out = analyze(&fixture_with_prefix("extra3", "z14_"));
    assert_eq!(of_kind(&out, "fragmentation").len(), 1, "{}", describe(&out));
}

/// Parameters that require grad but that no optimizer clears get a `.grad` from their first
/// backward, accumulated into ever after, while the optimizer's gradients are dropped by
/// `zero_grad()` and made again each step: s11's linear probe over a ResNet backbone never
/// frozen, ao06's teacher run with grad (in `limits/`: its teacher pass is not named), named at
/// the `.backward()` line. Made once by every backward of the program (s89: no `zero_grad` at
/// all; u01: `set_to_none=False`), gradients are no such fact; nor is the engine thread's cuBLAS
/// workspace, made once beside gradients made again (g02), which is not held through its
/// evaluation either: it is held for good, and g02 (clean) has no unreleased_gradient at all.
#[test]
fn gradients_no_optimizer_clears_are_named_at_the_backward_line() {
    for (set, prefix, line) in [("extra25", "s11_", 75), ("limits", "ao06_", 106)] {
        let out = analyze(&fixture_with_prefix(set, prefix));
        let waste = of_kind(&out, "unreleased_gradient");
        assert!(
            waste.len() == 1
                && waste[0]["severity"] == "waste"
                && waste[0]["site"]["line"] == line
                && waste[0]["facts"]["hold"]["never_cleared"]["remade_in"].as_u64() >= Some(3),
            "{prefix}:{}",
            describe(&out)
        );
    }
    for (set, prefix) in [("extra31", "s89_"), ("extra6", "u01_"), ("extra13", "g02_")] {
        let out = analyze(&fixture_with_prefix(set, prefix));
        assert!(
            of_kind(&out, "unreleased_gradient").iter().all(|s| s["facts"]["hold"].get("never_cleared").is_none()),
            "{prefix}:{}",
            describe(&out)
        );
    }
    let out = analyze(&fixture_with_prefix("extra13", "g02_"));
    assert!(of_kind(&out, "unreleased_gradient").is_empty(), "g02:{}", describe(&out));
}

/// ax01 (`fixtures/limits`, kept there for another misreading): a CTC trainer keeps
/// `sys.exc_info()` of every step a loss helper rejects after the forward. The skipped steps'
/// graphs are held by the tracebacks' frames; the helper made a small length check (l.114)
/// before raising, alive only because its frame is held. That value is no root: the suspect is
/// at the pass (l.133), and its words name no value as the root. af14's kept `d_loss`, made in
/// the step's own function (the same line as the pass), stays the root.
#[test]
fn a_graph_an_exception_keeps_is_named_at_its_pass_not_at_a_value_the_raising_helper_made() {
    let path = fixture_with_prefix("limits", "ax01_");
    let script = format!("{}.py", stem(&path));
    let out = analyze(&path);
    let graphs = of_kind(&out, "retained_graph");
    assert_eq!(graphs.len(), 1, "{}", describe(&out));
    let g = graphs[0];
    assert_eq!(g["facts"]["hold"], "skipped_backward", "{g}");
    assert!(at(g, &script, 133), "{g}");
    assert!(g["facts"]["root"].is_null(), "{g}");
    assert!(!g["evidence"].as_str().unwrap().contains("rooted at"), "{g}");

    let path = fixture_with_prefix("extra36", "af14_");
    let out = analyze(&path);
    let g = of_kind(&out, "retained_graph")[0];
    assert_eq!(
        (g["facts"]["hold"].as_str(), g["facts"]["root"]["line"].as_u64()),
        (Some("skipped_backward"), Some(70)),
        "{g}"
    );
}

/// ba03 (a blind probe): a monitor appends three `torch.autograd.grad` results every second
/// step, and the ring holds five iterations, so two kept gradient sets, one short of growth.
/// Eighteen earlier sets are alive from before the ring, without stacks (the engine's thread
/// has no Python frames): counted as whole copies of the kept set beyond the model's own, they
/// make it a leak at the `autograd.grad` line. A clean program whose ring wrapped (ba04, with an
/// EMA copy of its generator and Adam moments made before the ring) gains no such leak.
#[test]
fn gradient_sets_kept_from_before_a_wrapped_ring_count_as_earlier_steps() {
    let path = fixture_with_prefix("extra54", "ba03_");
    let script = format!("{}.py", stem(&path));
    let out = analyze(&path);
    let grads = of_kind(&out, "unreleased_gradient");
    assert_eq!(grads.len(), 1, "{}", describe(&out));
    let g = grads[0];
    assert_eq!(g["severity"], "leak", "{g}");
    assert!(at(g, &script, 126), "{g}");
    let before = g["facts"]["hold"]["kept_each_step"]["sets_before_trace"].as_u64().unwrap();
    assert!(before >= 10, "{g}");
    assert!(g["evidence"].as_str().unwrap().contains("made before the trace began"), "{g}");
    // What it keeps is what `torch.autograd.grad` returned, not `.grad`: the advice says so.
    assert_eq!(g["facts"]["hold"]["kept_each_step"]["returned_by_grad_call"], true, "{g}");
    assert!(g["advice"].as_str().unwrap().contains("`torch.autograd.grad` returns"), "{g}");

    let clean = analyze(&fixture_with_prefix("extra54", "ba04_"));
    assert!(of_kind(&clean, "unreleased_gradient").iter().all(|s| s["severity"] != "leak"), "{}", describe(&clean));
}

/// Eight federated clients trained in turn at one `.backward()` line each keep their own `.grad`
/// between rounds (bd01, clean). A ring shorter than a round shows each client's new set kept to
/// the end, as a log of gradients would; but every new set took the place of the set that
/// client had when the ring began, so as many sets are alive at the dump as then: no growth,
/// and no first backward's set "never made again". A log of gradients that began late (q56)
/// adds a set per kept step, and cut to its last half still reads as one.
#[test]
fn gradient_sets_that_replace_those_alive_when_a_ring_began_are_no_growth() {
    if common::without_python3("gradient_sets_that_replace_those_alive_when_a_ring_began_are_no_growth: no python3") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let clients = fixture_with_prefix("extra55", "bd01_");
    for setting in ["last50", "last20"] {
        let out =
            memsnap(&["analyze", "--json", common::rewritten(dir.path(), setting, &clients).to_str().unwrap()]).json();
        assert!(of_kind(&out, "unreleased_gradient").is_empty(), "bd01 ({setting}): {}", describe(&out));
    }
    // Under `context="state"` the log's gradients from before the ring have no stack; the dump
    // gives the workers' parameters their construction stack, so those of their sizes without
    // one are gradients, not parameters (bf02), while bf01's one set per worker stays clean.
    for (prefix, leaks) in [("bf01_", false), ("bf02_", true)] {
        let path = fixture_with_prefix("extra56", prefix);
        let out =
            memsnap(&["analyze", "--json", common::rewritten(dir.path(), "context-state", &path).to_str().unwrap()])
                .json();
        let found = of_kind(&out, "unreleased_gradient").iter().any(|g| g["severity"] == "leak");
        assert_eq!(found, leaks, "{prefix} (context-state): {}", describe(&out));
    }
    let log = fixture_with_prefix("extra9", "q56_");
    let out = memsnap(&["analyze", "--json", common::rewritten(dir.path(), "last50", &log).to_str().unwrap()]).json();
    let grads = of_kind(&out, "unreleased_gradient");
    assert!(grads.iter().any(|g| g["severity"] == "leak"), "q56 (last50): {}", describe(&out));
}

/// A small model's grad mode is read from its own training passes: autograd saves the same
/// tensors whether or not a backward follows, so a pass from a call site that trains keeps its
/// outputs and its saved tensors when run with grad on, its outputs alone under `no_grad`
/// (`lifecycle::SiteTraining`). bi04 acts with an RL policy of three linears (two ReLU outputs
/// saved, one tensor returned: 3 blocks alive of 5, under `min_saved_blocks`) through the
/// `sample` the update also calls, without `no_grad`, and the environment keeps every acting
/// graph; bj01 plans with a world model through the training's `predict` helper, without
/// `no_grad`, keeping each plan's cost. Both read as outputs kept by a reference before; both
/// now name the acting or planning line. bj02, bj01 planning under `no_grad`, stays clean.
#[test]
fn small_models_grad_on_passes_are_read_by_their_call_sites_training() {
    for (dir, prefix, script, line) in [
        ("extra57", "bi04_", "bi04_sac_vectorized_gpu_pendulum_preallocated_replay_twin_q_targets_act_without_no_grad_env_state_chains_graphs_leak.py", 191),
        ("limits", "bj01_", "bj01_mpc_world_model_shared_predict_helper_planning_without_no_grad_keeps_plan_costs_leak.py", 69),
    ] {
        let out = memsnap(&["analyze", "--json", fixture_with_prefix(dir, prefix).to_str().unwrap()]).json();
        let named = of_kind(&out, "no_grad_missing").into_iter().any(|s| {
            s["severity"] == "leak"
                && s["stack"].as_array().is_some_and(|st| {
                    st.iter().any(|f| {
                        f["filename"].as_str().is_some_and(|n| n.ends_with(script)) && f["line"].as_u64() == Some(line)
                    })
                })
        });
        assert!(named, "{prefix}: no no_grad_missing leak through line {line}: {}", describe(&out));
    }
    let clean = memsnap(&["analyze", "--json", fixture_with_prefix("extra57", "bj02_").to_str().unwrap()]).json();
    assert!(suspects(&clean).is_empty(), "bj02: {}", describe(&clean));
}

/// One copy of the parameters held by one line is per-parameter state (moments, an EMA's
/// shadow, DP-SGD's accumulators), made once and updated in place; growth keeps a copy per
/// step (`state_only::one_parameter_set`). Read from the dump alone: bj03's EMA (40 blocks from
/// one list comprehension) is no leak, while bj04, the same program keeping a snapshot of the
/// weights every other step, still reads as a leak at the snapshot line and not at the EMA's.
/// bh03's DP-SGD accumulators under `context="state"` likewise read clean.
#[test]
fn one_copy_of_the_parameters_from_a_line_is_state_read_from_the_dump() {
    if common::without_python3("one_copy_of_the_parameters_from_a_line_is_state_read_from_the_dump: no python3") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let read = |prefix: &str, setting: &str| {
        let path = fixture_with_prefix("extra57", prefix);
        memsnap(&["analyze", "--json", common::rewritten(dir.path(), setting, &path).to_str().unwrap()]).json()
    };
    let ema = read("bj03_", "no-trace");
    assert!(suspects(&ema).is_empty(), "bj03 (no-trace): {}", describe(&ema));
    let snapshots = read("bj04_", "no-trace");
    let script = "bj04_context_state_transformer_classifier_weight_ema_plus_weight_snapshot_every_2_steps_kept_leak.py";
    let leaks = of_kind(&snapshots, "reference_leak");
    assert!(
        leaks.len() == 1 && at(leaks[0], script, 75),
        "bj04 (no-trace): the snapshot line alone: {}",
        describe(&snapshots)
    );
    let accumulators = read("bh03_", "context-state");
    assert!(suspects(&accumulators).is_empty(), "bh03 (context-state): {}", describe(&accumulators));
}

/// A pass on one thread is not ended by another thread's allocations (`phases::Suspended`):
/// the interpreter switches threads inside a model call, and the pass goes on when its thread
/// resumes. bn01-bn03 score 24 batches on a `Scorer` thread while the script's thread
/// preprocesses the next ones on the GPU (under `context="all"` and `context="alloc"`): 24
/// passes each, bn01 and bn03 (`inference_mode` in the thread) clean, bn02 (grad on in the
/// thread) `no_grad_missing` at the model call. bg04's batcher thread, cut by its clients'
/// allocations, no longer reads as one pass run with grad, and bg01's thread-pool passes, one
/// per query, stay apart.
#[test]
fn another_threads_allocations_do_not_end_a_pass() {
    let read = |dir: &str, prefix: &str| {
        memsnap(&["analyze", "--json", fixture_with_prefix(dir, prefix).to_str().unwrap()]).json()
    };
    let passes = |out: &serde_json::Value| out["devices"][0]["phases"]["forward_passes"].as_u64();
    for prefix in ["bn01_", "bn03_"] {
        let out = read("extra58", prefix);
        assert_eq!(passes(&out), Some(24), "{prefix}: {}", describe(&out));
        assert!(suspects(&out).is_empty(), "{prefix}: {}", describe(&out));
    }
    let grad_on = read("extra58", "bn02_");
    assert_eq!(passes(&grad_on), Some(24), "bn02: {}", describe(&grad_on));
    let script =
        "bn02_two_thread_image_scorer_producer_preprocesses_on_gpu_scorer_thread_grad_on_no_grad_missing_peak.py";
    let named = of_kind(&grad_on, "no_grad_missing");
    assert!(named.len() == 1 && at(named[0], script, 56), "bn02: {}", describe(&grad_on));
    let batcher = read("extra57", "bg04_");
    assert!(of_kind(&batcher, "no_grad_missing").is_empty(), "bg04: {}", describe(&batcher));
    assert_eq!(passes(&batcher), Some(60), "bg04: {}", describe(&batcher));
    let pool = read("extra57", "bg01_");
    assert_eq!(passes(&pool), Some(10), "bg01: {}", describe(&pool));
}
