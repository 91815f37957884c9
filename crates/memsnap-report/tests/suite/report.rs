//! The report on real snapshots (`fixtures/dev`, `fixtures/extra`): goldens, determinism across
//! thread counts, well-formed SVG, the s03 verdict, and flamegraph sums.
//!
//! Regenerate the goldens with `UPDATE_EXPECT=1 cargo test --profile ci -p memsnap-report`.

use std::io::Read;
use std::path::{Path, PathBuf};

use memsnap_analysis::{analyze, Analysis};
use memsnap_model::{read_snapshot, Snapshot};
use memsnap_replay::{replay, Replay};
use memsnap_report::{build, live_folded, Report, ReportInput, ReportOptions};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Read a fixture, decompressing xz by its magic bytes.
fn load(rel: &str) -> Snapshot {
    let path = root().join("fixtures").join(rel);
    let raw = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let data = if raw.starts_with(&[0xfd, b'7', b'z', b'X', b'Z', 0]) {
        let mut out = Vec::new();
        xz2::read::XzDecoder::new(&raw[..]).read_to_end(&mut out).unwrap();
        out
    } else {
        raw
    };
    read_snapshot(&data).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

struct Done {
    snap: Snapshot,
    replay: Replay,
    analysis: Analysis,
    name: String,
}

fn analyzed(rel: &str) -> Done {
    let snap = load(rel);
    let replay = replay(&snap);
    let analysis = analyze(&snap, &replay);
    let name = Path::new(rel).file_name().unwrap().to_string_lossy().into_owned();
    Done { snap, replay, analysis, name }
}

fn report(d: &Done) -> Report {
    let input = ReportInput {
        snapshot: &d.snap,
        replay: &d.replay,
        analysis: &d.analysis,
        file_name: &d.name,
        file_bytes: 1000,
        pickle_bytes: 2000,
        file_caveats: &[],
    };
    build(&input, &ReportOptions::default())
}

fn dev_fixtures() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(root().join("fixtures/dev"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".pickle.xz"))
        .map(|n| format!("dev/{n}"))
        .collect();
    v.sort();
    v
}

/// Compare with `tests/golden/NAME`; `UPDATE_EXPECT=1` rewrites it (expect-test).
fn check_golden(name: &str, actual: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden").join(name);
    expect_test::expect_file![path].assert_eq(actual);
}

fn parse_xml(what: &str, svg: &str) {
    if let Err(e) = roxmltree::Document::parse(svg) {
        panic!("{what}: not well-formed XML: {e}");
    }
}

#[test]
fn golden_svg_reports() {
    for name in ["s10_streams", "s12_cuda_graph"] {
        let d = analyzed(&format!("dev/{name}.pickle.xz"));
        check_golden(&format!("{name}.report.svg"), &report(&d).svg());
    }
}

#[test]
fn golden_folded_flamegraph() {
    let d = analyzed("dev/s12_cuda_graph.pickle.xz");
    let da = &d.analysis.devices[0];
    let folded = live_folded(&d.snap, &d.analysis.stacks, &da.peak_blocks, false);
    check_golden("s12_cuda_graph.peak.folded", &memsnap_report::folded_text(&folded));
}

#[test]
fn identical_bytes_on_one_and_two_threads() {
    let run = |threads: usize, rel: &str| {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        pool.install(|| {
            let d = analyzed(rel);
            let r = report(&d);
            (r.html(), r.svg())
        })
    };
    for rel in [
        "dev/s03_loss_history_leak.pickle.xz",
        "dev/s07_fragmentation.pickle.xz",
        "extra/x05_clean_lm_stacks_all.pickle.xz",
    ] {
        let one = run(1, rel);
        let two = run(2, rel);
        assert!(one.0 == two.0, "{rel}: HTML differs between 1 and 2 threads");
        assert!(one.1 == two.1, "{rel}: SVG differs between 1 and 2 threads");
        let again = run(2, rel);
        assert!(two == again, "{rel}: two runs differ");
    }
}

#[test]
fn every_dev_report_is_well_formed_escaped_and_small() {
    let here = root().canonicalize().unwrap().display().to_string();
    for rel in dev_fixtures() {
        let d = analyzed(&rel);
        let r = report(&d);
        let svg = r.svg();
        parse_xml(&rel, &svg);
        let html = r.html();
        assert!(html.starts_with("<!DOCTYPE html>"), "{rel}");
        // Every figure inside the page is well-formed too.
        let mut rest = html.as_str();
        while let Some(i) = rest.find("<svg ") {
            let end = rest[i..].find("</svg>\n</div>").expect("figure end") + i + "</svg>".len();
            parse_xml(&format!("{rel} (HTML figure)"), &rest[i..end]);
            rest = &rest[end..];
        }
        for (what, text) in [("html", &html), ("svg", &svg)] {
            assert!(!text.contains("<module>"), "{rel} {what}: unescaped frame name");
            assert!(!text.contains("<script"), "{rel} {what}: script");
            assert!(
                !text.contains("href=") && !text.contains("src=") && !text.contains("url("),
                "{rel} {what}: external resource"
            );
            assert!(!text.contains(&here), "{rel} {what}: names a local path");
            assert!(text.len() < 600_000, "{rel} {what}: {} bytes", text.len());
        }
    }
}

#[test]
fn s03_report_names_retained_graph_at_the_backward_line() {
    let d = analyzed("dev/s03_loss_history_leak.pickle.xz");
    let r = report(&d);
    let top = &r.suspects[0];
    assert_eq!(top.kind, "retained_graph");
    assert!(top.site_short.as_deref().unwrap().contains("s03_loss_history_leak.py:19"), "{:?}", top.site_short);
    assert!(top.growth_bytes_per_iteration.unwrap() > 100 << 20);
    for text in [r.html(), r.svg()] {
        let verdict = &text[..text.find("Device 0").unwrap()];
        assert!(verdict.contains("retained_graph"));
        assert!(verdict.contains("s03_loss_history_leak.py:19"));
        assert!(verdict.contains("per iteration"));
        // The chart's caption carries the growth too.
        assert!(text.contains("retained_graph at workspace/lmtrain/s03_loss_history_leak.py:19 (&lt;module&gt;): +"));
        // Ten iterations are numbered above the chart.
        assert!(text.contains("iteration 10 of 10"));
    }
}

#[test]
fn folded_stacks_sum_to_allocated_at_the_peak() {
    for rel in dev_fixtures().into_iter().chain(["extra/x03_inference_cache_leak.pickle.xz".to_string()]) {
        let d = analyzed(&rel);
        for da in &d.analysis.devices {
            let folded = live_folded(&d.snap, &d.analysis.stacks, &da.peak_blocks, false);
            let sum: u64 = folded.iter().map(|(_, b)| b).sum();
            let peak = d.replay.device(da.device).unwrap().peaks.allocated.value;
            assert_eq!(sum, peak, "{rel} device {}", da.device);
            assert!(folded.windows(2).all(|w| w[0].0 < w[1].0), "{rel}: folded lines not sorted and distinct");
            assert!(folded.iter().all(|(p, _)| !p.contains('\n') && !p.is_empty()));
        }
    }
}

#[test]
fn flamegraph_svg_parses_and_marks_user_frames() {
    let d = analyzed("dev/s03_loss_history_leak.pickle.xz");
    let da = &d.analysis.devices[0];
    let folded = live_folded(&d.snap, &d.analysis.stacks, &da.peak_blocks, true);
    let svg = memsnap_report::flamegraph_svg(&folded, &memsnap_report::FlameOptions::default());
    parse_xml("flamegraph", &svg);
    assert!(svg.contains("your code"));
    assert!(svg.contains("&lt;module&gt; (workspace/lmtrain/s03_loss_history_leak.py:19)"));
}

#[test]
fn device_without_trace_still_reports() {
    // The bare segment list has no trace: no timeline, but the rest renders.
    let d = analyzed("variants/s12_bare_segments.pickle");
    let r = report(&d);
    assert!(r.devices.iter().all(|dev| dev.timeline.is_none()));
    parse_xml("bare segments", &r.svg());
    assert!(r.html().contains("No trace for this device"));
}

/// f04 sets `_set_memory_metadata("phase=train")` and `("phase=eval")` around two epochs of
/// training and evaluation (fixtures/gen/f04_metadata.py): the chart shows the four stretches,
/// in order, with the label's name in the hover text (the event ranges are the file's own,
/// counted from its trace with Python).
#[test]
fn labelled_phases_are_bands_on_the_timeline() {
    let d = analyzed("formats/f04_metadata.pickle.xz");
    let svg = report(&d).svg();
    let bands: Vec<&str> = svg.match_indices("<title>user_metadata").map(|(i, _)| &svg[i..i + 90]).collect();
    let want = [
        "&quot;phase=train&quot;: events 0–1,471",
        "&quot;phase=eval&quot;: events 1,472–1,665",
        "&quot;phase=train&quot;: events 1,666–3,070",
        "&quot;phase=eval&quot;: events 3,071–3,264",
    ];
    assert_eq!(bands.len(), want.len(), "{bands:?}");
    for (got, want) in bands.iter().zip(want) {
        assert!(got.contains(want), "{got} lacks {want}");
    }
    assert!(svg.contains("labelled phases (user_metadata, compile regions)"));
    // The HTML report groups the peak by the same labels.
    let html = report(&d).html();
    assert!(html.contains("Who holds the peak: allocated bytes by user_metadata"));
    assert!(html.contains("<code>phase=train</code>"));
    // A file without labels draws none.
    let plain = report(&analyzed("dev/s01_clean_train.pickle.xz")).svg();
    assert!(!plain.contains("labelled phases"));
    assert!(!report(&analyzed("dev/s01_clean_train.pickle.xz")).html().contains("bytes by user_metadata"));
}
