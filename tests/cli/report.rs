//! `memsnap report` and `memsnap flamegraph` through the built binary: output files, formats,
//! identical bytes on 1 and 2 threads, flamegraph sums (the goldens are in golden.rs).

use crate::common;

use std::path::Path;
use std::process::Command;

use common::{fixture, memsnap, root};

/// Run memsnap with `RAYON_NUM_THREADS=threads`; returns (exit code, stderr).
fn run_threads(threads: usize, args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_memsnap"))
        .args(args)
        .current_dir(root())
        .env("RAYON_NUM_THREADS", threads.to_string())
        .output()
        .expect("run memsnap");
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn report_writes_html_and_svg_by_extension() {
    let dir = tempfile::tempdir().unwrap();
    let input = fixture("dev/s03_loss_history_leak.pickle.xz");
    for (name, head) in [("r.html", "<!DOCTYPE html>"), ("r.svg", "<svg ")] {
        let out = dir.path().join(name);
        let run = memsnap(&["report", s(&input), "-o", s(&out)]);
        assert_eq!(run.code, Some(0), "{}", run.stderr);
        let text = std::fs::read_to_string(&out).unwrap();
        assert!(text.starts_with(head), "{name}");
        assert!(text.contains("retained_graph"));
        assert!(text.contains("s03_loss_history_leak.py:17"));
        // Only the input's file name, never where it or the output lives on this machine.
        assert!(text.contains("s03_loss_history_leak.pickle.xz"));
        assert!(!text.contains(s(&root().join("fixtures"))), "{name} names a local path");
        assert!(!text.contains(s(dir.path())), "{name} names a local path");
    }
    // --format wins over the extension.
    let out = dir.path().join("report.txt");
    let run = memsnap(&["report", s(&input), "-o", s(&out), "--format", "svg"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(std::fs::read_to_string(&out).unwrap().starts_with("<svg "));
}

#[test]
fn report_refuses_an_unknown_extension_and_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let input = fixture("dev/s12_cuda_graph.pickle.xz");
    let run = memsnap(&["report", s(&input), "-o", s(&dir.path().join("r.pdf"))]);
    assert_eq!(run.code, Some(2));
    assert!(run.stderr.contains("--format"), "{}", run.stderr);
    let run = memsnap(&["report", s(&fixture("hostile/empty.pickle")), "-o", s(&dir.path().join("r.html"))]);
    assert_eq!(run.code, Some(2));
    assert!(!dir.path().join("r.html").exists());
}

#[test]
fn one_and_two_threads_give_identical_bytes() {
    let dir = tempfile::tempdir().unwrap();
    for input in
        ["dev/s03_loss_history_leak.pickle.xz", "dev/s10_streams.pickle.xz", "multi/m01_two_gpu_pipeline.pickle"]
    {
        let input = fixture(input);
        for (name, extra) in [
            ("r.html", vec!["report"]),
            ("r.svg", vec!["report"]),
            ("f.svg", vec!["flamegraph"]),
            ("f.folded", vec!["flamegraph", "--folded"]),
        ] {
            let mut outs = Vec::new();
            for threads in [1, 2] {
                let out = dir.path().join(format!("{threads}-{name}"));
                let mut args: Vec<&str> = extra.clone();
                args.extend([s(&input), "-o", s(&out)]);
                let (code, err) = run_threads(threads, &args);
                assert_eq!(code, Some(0), "{err}");
                outs.push(std::fs::read(&out).unwrap());
            }
            assert!(outs[0] == outs[1], "{}: {name} differs between 1 and 2 threads", input.display());
        }
    }
}

fn folded_sum(text: &str) -> u64 {
    text.lines().map(|l| l.rsplit_once(' ').expect("`stack bytes`").1.parse::<u64>().expect("bytes")).sum()
}

#[test]
fn folded_flamegraph_sums_to_allocated_bytes() {
    for input in
        ["dev/s03_loss_history_leak.pickle.xz", "dev/s08_oom.pickle.xz", "extra/x03_inference_cache_leak.pickle.xz"]
    {
        let input = fixture(input);
        let json = memsnap(&["analyze", s(&input), "--json"]).json();
        let dev = &json["devices"][0];
        let peak = dev["peak_allocated_bytes"].as_u64().unwrap();
        let end = dev["allocated_bytes"].as_u64().unwrap();

        let run = memsnap(&["flamegraph", s(&input), "--folded"]);
        assert_eq!(run.code, Some(0), "{}", run.stderr);
        assert_eq!(folded_sum(&run.stdout), peak, "{}: peak", input.display());
        assert!(!run.stdout.contains('*'), "folded output carries no user marks");

        let run = memsnap(&["flamegraph", s(&input), "--folded", "--at", "end"]);
        assert_eq!(folded_sum(&run.stdout), end, "{}: end", input.display());

        // The peak's time (first event at that time) and its event index give the same sum
        // as `--at peak` when no later event shares the time.
        let idx = dev["peak_event_index"].as_u64().unwrap();
        let run = memsnap(&["flamegraph", s(&input), "--folded", "--at", &format!("event:{idx}")]);
        assert_eq!(folded_sum(&run.stdout), peak, "{}: event:{idx}", input.display());
        let t = dev["peak_time_us"].as_i64().unwrap();
        let run = memsnap(&["flamegraph", s(&input), "--folded", "--at", &format!("us:{t}")]);
        assert_eq!(run.code, Some(0), "{}", run.stderr);
        assert!(folded_sum(&run.stdout) > 0);
    }
}

#[test]
fn flamegraph_svg_and_devices() {
    let input = fixture("multi/m01_two_gpu_pipeline.pickle");
    let run = memsnap(&["flamegraph", s(&input)]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(run.stdout.starts_with("<svg "));
    assert!(run.stdout.contains("[cuda:1]"), "two devices: each stack starts with its device");
    let run = memsnap(&["flamegraph", s(&input), "--device", "1", "--folded"]);
    assert!(run.stdout.lines().all(|l| !l.starts_with("[cuda:")));
    let run = memsnap(&["flamegraph", s(&input), "--device", "7"]);
    assert_eq!(run.code, Some(2));
    let run = memsnap(&["flamegraph", s(&input), "--at", "noon"]);
    assert_eq!(run.code, Some(2));
}

#[test]
fn flamegraph_refuses_an_output_name_it_would_not_honour() {
    // `-o x.png` used to write an SVG under a PNG name: now an error before any work, and
    // nothing is written.
    let dir = tempfile::tempdir().unwrap();
    let input = fixture("dev/s10_streams.pickle.xz");
    for name in ["x.png", "x.html", "x"] {
        let out = dir.path().join(name);
        let run = memsnap(&["flamegraph", s(&input), "-o", s(&out)]);
        assert_eq!(run.code, Some(2), "{name}: {}", run.stderr);
        assert!(run.stderr.contains("cannot tell the format from the extension; use .svg"), "{}", run.stderr);
        assert!(!out.exists(), "{name} was written");
    }
    // --folded says the format whatever the name.
    let out = dir.path().join("stacks.data");
    let run = memsnap(&["flamegraph", s(&input), "--folded", "-o", s(&out)]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(std::fs::read_to_string(&out).unwrap().lines().all(|l| l.rsplit_once(' ').is_some()));
}

#[test]
fn segments_and_flamegraph_share_one_moment_grammar() {
    let input = fixture("dev/s03_loss_history_leak.pickle.xz");
    let last = 8726; // the trace has events 0..=8726
    for cmd in [&["segments"][..], &["flamegraph", "--folded"]] {
        for at in ["start", "peak", "end", "event:5000", "+0.1s", "+250ms", "iteration:2", "us:1795964642000000"] {
            let mut args = cmd.to_vec();
            args.extend_from_slice(&[s(&input), "--at", at]);
            let run = memsnap(&args);
            assert_eq!(run.code, Some(0), "{args:?}: {}", run.stderr);
        }
        // Outside the trace, or ambiguous: exit 2 and the valid range.
        for (at, says) in [
            ("event:99999", format!("this device's trace has events 0 to {last}")),
            ("+5s", "outside the trace, which runs from us:".to_string()),
            ("iteration:999", "there are iterations 1 to".to_string()),
            ("oom", "no out-of-memory event".to_string()),
            ("12", "a bare number is ambiguous".to_string()),
        ] {
            let mut args = cmd.to_vec();
            args.extend_from_slice(&[s(&input), "--at", at]);
            let run = memsnap(&args);
            assert_eq!(run.code, Some(2), "{args:?}: {}", run.stderr);
            assert!(run.stderr.contains(&says), "{args:?}: {}", run.stderr);
        }
    }
    // The moment is the event named (segments used to reject event:N), and a relative time
    // names the last event at or before it, as its epoch time does.
    let at =
        |m: &str| memsnap(&["segments", s(&input), "--at", m, "--json"]).json()["devices"][0]["event_index"].clone();
    assert_eq!(at("event:5000"), 5000);
    assert_eq!(at("start"), serde_json::Value::Null);
    assert_eq!(at("+0.1s"), at("us:1795964641995029"), "+0.1s after the first event at us:1795964641895029");
}

#[test]
fn flamegraph_hides_native_frames_unless_asked() {
    // A stacks="all" recording: C++ and interpreter frames (`?? :0`, `.cpp`) interleave the
    // Python ones. Hidden by default, merged into the Python stacks; --native keeps them. The
    // bytes are the same either way.
    let input = fixture("extra/x05_clean_lm_stacks_all.pickle.xz");
    let plain = memsnap(&["flamegraph", s(&input), "--folded"]);
    let native = memsnap(&["flamegraph", s(&input), "--folded", "--native"]);
    assert_eq!(plain.code, Some(0), "{}", plain.stderr);
    assert!(native.stdout.contains("??"), "the recording has native frames");
    assert!(!plain.stdout.contains("??"), "{}", plain.stdout);
    assert_eq!(folded_sum(&plain.stdout), folded_sum(&native.stdout));
    let svg = memsnap(&["flamegraph", s(&input)]);
    assert!(svg.stdout.contains("C++ frames hidden (--native shows them)"));
}
