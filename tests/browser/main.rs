//! The interactive report in a real browser: Debian's headless chromium, driven over the
//! DevTools protocol ([`cdp`]). Each test writes a report with the built binary, opens it from
//! `file://`, works it as a reader would (real mouse moves, clicks and wheel turns) and checks
//! what the page then shows — and that it logged no error, opened no dialog and asked for
//! nothing over the network. Where `/usr/bin/chromium` is absent each test prints a note and
//! passes (`.ci/run` installs it).
//!
//! A binary of its own: it needs a browser and takes seconds per test, so `--test cli` stays
//! quick. `MEMSNAP_SCREENSHOTS=DIR` makes `screenshots` write the PNGs of the docs into DIR.

mod cdp;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};

use cdp::{problems, Browser, Page};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `memsnap report INPUT -o OUT` (plus `extra`), failing the test when it fails. `MEMSNAP_BIN`
/// names another binary to run (to measure the release build's pages).
fn report(input: &Path, out: &Path, extra: &[&str]) {
    let bin =
        std::env::var_os("MEMSNAP_BIN").map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_memsnap")), PathBuf::from);
    let o = Command::new(bin)
        .arg("report")
        .arg(input)
        .arg("-o")
        .arg(out)
        .args(extra)
        .arg("--quiet")
        .output()
        .expect("run memsnap");
    assert!(o.status.success(), "memsnap report {}: {}", input.display(), String::from_utf8_lossy(&o.stderr));
}

/// A report of `fixture` opened in a new tab: (browser, tab, URL, the report's path, its dir).
fn open(fixture: &str) -> Option<(Browser, Page, String, PathBuf, tempfile::TempDir)> {
    let mut b = cdp::launch()?;
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("report.html");
    report(&root().join("fixtures").join(fixture), &out, &[]);
    let page = b.page();
    let (url, _) = page.open(&mut b, &out);
    Some((b, page, url, out, dir))
}

fn assert_clean(b: &mut Browser, page: &Page, url: &str) {
    b.drain();
    let p = problems(&b.events, &page.session, url);
    assert!(p.is_empty(), "the page logged errors or made requests: {p:#?}");
}

/// `section.ms-device[data-device=D] SEL`.
fn sel(device: u32, s: &str) -> String {
    format!("section.ms-device[data-device=\"{device}\"] {s}")
}

fn num(v: &Value) -> f64 {
    match v {
        Value::String(s) => s.parse().unwrap_or_else(|_| panic!("not a number: {s:?}")),
        v => v.as_f64().unwrap_or_else(|| panic!("not a number: {v}")),
    }
}

/// A data attribute of an element, as a number.
fn data(b: &mut Browser, page: &Page, selector: &str, key: &str) -> f64 {
    num(&page.eval(b, &format!("document.querySelector({}).dataset.{key}", json!(selector))))
}

fn text(b: &mut Browser, page: &Page, selector: &str) -> String {
    page.eval(b, &format!("document.querySelector({}).textContent", json!(selector))).as_str().unwrap_or("").to_string()
}

/// The viewport point of event `e` on the timeline of `device` (on the allocated line's level
/// of height: the middle of the plot), after scrolling the chart into view.
fn point_of_event(b: &mut Browser, page: &Page, device: u32, e: f64) -> (f64, f64) {
    let tl = sel(device, "canvas.ms-tl");
    page.centre(b, &tl);
    let v = page.eval(
        b,
        &format!(
            "(() => {{ const c = document.querySelector({}); const r = c.getBoundingClientRect(); const d = c.dataset; return [r.left + (+d.plotLeft) + ({e} + 0.5 - d.v0) / (d.v1 - d.v0) * d.plotWidth, r.top + (+d.plotTop) + d.plotHeight / 2]; }})()",
            json!(tl)
        ),
    );
    (num(&v[0]), num(&v[1]))
}

#[test]
fn zoom_hover_moment_and_suspect_on_a_real_leak() {
    let Some((mut b, page, url, _out, _dir)) = open("dev/s03_loss_history_leak.pickle.xz") else { return };
    let tl = sel(0, "canvas.ms-tl");
    let n = page.eval(&mut b, "memsnap.data.devices[0].events");
    let n = num(&n);
    assert_eq!(data(&mut b, &page, &tl, "visibleEvents"), n, "the whole run is visible at first");

    // Zoom into iteration 3 with the toolbar (a real click on its button).
    page.eval(&mut b, &format!("document.querySelector({}).value = '3'", json!(sel(0, ".ms-iter"))));
    page.click_on(&mut b, &sel(0, ".ms-zoom-iter"));
    let its = page.eval(&mut b, "memsnap.data.devices[0].phases.iterations");
    let (a, z) = (num(&its[2]), num(&its[3]));
    let visible = data(&mut b, &page, &tl, "visibleEvents");
    assert!(
        visible < n && visible >= z - a && visible <= (z - a) * 1.1,
        "iteration 3 is events {a}–{z}; {visible} visible"
    );
    assert_eq!(page.eval(&mut b, &format!("document.querySelector({}).dataset.mode", json!(tl))), json!("events"));
    assert!(text(&mut b, &page, &sel(0, ".ms-info")).contains("one by one"));

    // The wheel zooms further in around the pointer.
    let (x, y) = point_of_event(&mut b, &page, 0, (a + z) / 2.0);
    page.wheel(&mut b, x, y, -500.0);
    page.settle(&mut b);
    let closer = data(&mut b, &page, &tl, "visibleEvents");
    assert!(closer < visible, "wheel: {closer} events visible, was {visible}");

    // Hover an allocation made by the user's code: the tooltip names it and its stack.
    let e = page.eval(
        &mut b,
        "(() => { const ex = memsnap.explorer(0), m = ex.m; for (const w of m.windows) for (let j = 0; j < w.act.length; j++) { const e = w.first + j; const st = memsnap.data.stacks[w.stack[j]] || []; if (w.act[j] === 'a' && e >= ex.v0 && e + 1 <= ex.v1 && st.some(f => f >= 0 && memsnap.data.frames[f][3] === 0)) return e; } return null; })()",
    );
    let e = num(&e);
    let (x, y) = point_of_event(&mut b, &page, 0, e);
    page.move_to(&mut b, x, y);
    let tip = text(&mut b, &page, "#ms-tip");
    let shown = page.eval(&mut b, "!document.getElementById('ms-tip').classList.contains('ms-hidden')");
    assert_eq!(shown, json!(true));
    assert!(tip.contains("alloc"), "{tip}");
    assert!(tip.contains("s03_loss_history_leak.py:"), "the user's frame in the tooltip: {tip}");
    assert!(tip.contains("allocation stack (your frames)"), "{tip}");
    let user = page.eval(&mut b, "Array.from(document.querySelectorAll('#ms-tip li.ms-user')).map(l => l.textContent)");
    let user: Vec<&str> = user.as_array().unwrap().iter().filter_map(|v| v.as_str()).collect();
    assert!(!user.is_empty() && user.iter().all(|f| f.contains(".py:")), "the stack shows the user's frames: {user:?}");
    assert!(user.iter().any(|f| f.contains("workspace/lmtrain/")), "{user:?}");

    // Move the moment with a click on the chart: the segment map follows.
    let seg = sel(0, "canvas.ms-segmap");
    let before = (text(&mut b, &page, &sel(0, ".ms-segsum")), data(&mut b, &page, &seg, "allocated"));
    page.eval(&mut b, &format!("document.querySelector({}).click()", json!(sel(0, ".ms-whole"))));
    page.settle(&mut b);
    let (x, y) = point_of_event(&mut b, &page, 0, 5.0);
    page.click(&mut b, x, y);
    page.settle(&mut b);
    let moment = data(&mut b, &page, &seg, "moment");
    assert!(moment < 200.0, "the moment moved to the clicked event: {moment}");
    let after = (text(&mut b, &page, &sel(0, ".ms-segsum")), data(&mut b, &page, &seg, "allocated"));
    assert_ne!(before, after, "the segment map changed with the moment");
    // And with the slider.
    page.eval(
        &mut b,
        &format!(
            "(() => {{ const s = document.querySelector({}); s.value = String(s.max); s.dispatchEvent(new Event('input')); }})()",
            json!(sel(0, ".ms-slider"))
        ),
    );
    page.settle(&mut b);
    assert_eq!(data(&mut b, &page, &seg, "moment"), n - 1.0);
    assert!(data(&mut b, &page, &seg, "allocated") > after.1);

    // Click the verdict's suspect: its blocks are marked on the timeline and the segment map,
    // with its evidence and fix beside.
    page.click_on(&mut b, ".verdict .suspect .ms-show-suspect");
    assert_eq!(data(&mut b, &page, &tl, "suspect"), 0.0);
    let highlighted = data(&mut b, &page, &seg, "highlighted");
    assert!(highlighted > 0.0, "suspect blocks outlined in the segment map");
    let panel = text(&mut b, &page, &sel(0, ".ms-panel"));
    assert!(panel.contains("retained_graph") && panel.contains("Evidence.") && panel.contains("Fix."), "{panel}");
    assert!(text(&mut b, &page, &sel(0, ".ms-segsum")).contains("of the selected suspect"));

    // The flamegraph zooms on a click and finds frames.
    let flame = sel(0, "canvas.ms-flame");
    page.eval(
        &mut b,
        &format!(
            "(() => {{ const i = document.querySelector({}); i.value = 'linear'; i.dispatchEvent(new Event('input')); }})()",
            json!(sel(0, ".ms-flame-search"))
        ),
    );
    assert!(data(&mut b, &page, &flame, "matched") > 0.0, "search finds linear layers");
    let (fx, fy) = page.centre(&mut b, &flame);
    let top = page.eval(&mut b, &format!("document.querySelector({}).getBoundingClientRect().top", json!(flame)));
    page.click(&mut b, fx, num(&top) + 2.0 + 17.0 * 1.5);
    page.settle(&mut b);
    let focus = page.eval(&mut b, &format!("document.querySelector({}).dataset.focus", json!(flame)));
    assert_ne!(focus, json!(""), "a click on a frame zooms to it ({fx}, {fy})");

    // Tables sort and filter; a click on a site marks its blocks like a suspect's.
    page.click_on(&mut b, &sel(0, "table.ms-sites th[data-key=\"blocks\"]"));
    let th = page.eval(
        &mut b,
        &format!("document.querySelector({}).className", json!(sel(0, "table.ms-sites th[data-key=\"blocks\"]"))),
    );
    assert!(th.as_str().unwrap().contains("ms-sorted"));
    let rows = data(&mut b, &page, &sel(0, "table.ms-sites"), "rows");
    page.eval(
        &mut b,
        &format!(
            "(() => {{ const i = document.querySelector({}); i.value = 'common.py:31'; i.dispatchEvent(new Event('input')); }})()",
            json!(sel(0, ".ms-site-filter"))
        ),
    );
    assert_eq!(data(&mut b, &page, &sel(0, "table.ms-sites"), "rows"), 1.0, "the filter keeps one of {rows} sites");
    page.click_on(&mut b, &sel(0, "table.ms-sites tbody tr.ms-row"));
    assert_ne!(page.eval(&mut b, &format!("document.querySelector({}).dataset.site", json!(tl))), json!(""));
    assert!(data(&mut b, &page, &seg, "highlighted") > 0.0, "the site's blocks outlined");

    assert_clean(&mut b, &page, &url);
}

#[test]
fn two_devices_get_a_picker() {
    let Some((mut b, page, url, _out, _dir)) = open("multi/m01_two_gpu_pipeline.pickle") else { return };
    let buttons = page.eval(&mut b, "document.querySelectorAll('.ms-picker .ms-device-button').length");
    assert_eq!(buttons, json!(2));
    let hidden = |b: &mut Browser, d: u32| {
        page.eval(
            b,
            &format!(
                "document.querySelector('section.ms-device[data-device=\"{d}\"]').classList.contains('ms-hidden')"
            ),
        )
    };
    page.click_on(&mut b, ".ms-picker .ms-device-button[data-device=\"1\"]");
    assert_eq!(hidden(&mut b, 0), json!(true));
    assert_eq!(hidden(&mut b, 1), json!(false));
    assert!(data(&mut b, &page, &sel(1, "canvas.ms-tl"), "visibleEvents") > 0.0);
    assert!(data(&mut b, &page, &sel(1, "canvas.ms-segmap"), "segments") > 0.0);
    page.click_on(&mut b, ".ms-picker .ms-device-button[data-device=\"0\"]");
    assert_eq!(hidden(&mut b, 0), json!(false));
    assert_clean(&mut b, &page, &url);
}

#[test]
fn a_static_report_has_no_script_and_still_opens() {
    let Some(mut b) = cdp::launch() else { return };
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("static.html");
    report(&root().join("fixtures/dev/s07_fragmentation.pickle.xz"), &out, &["--static"]);
    let html = std::fs::read_to_string(&out).unwrap();
    assert!(!html.contains("<script"), "--static writes no script");
    let page = b.page();
    let url = format!("file://{}", out.display());
    b.call(Some(&page.session), "Page.navigate", json!({ "url": url }));
    // No script, so no ready signal: wait for the document itself (not a fixed time: under the
    // load of the other browser tests a 300 ms sleep was too short).
    let loaded = format!("location.href === {} && document.readyState === 'complete'", json!(url));
    page.wait_for(&mut b, &loaded, std::time::Instant::now() + Duration::from_secs(30));
    assert_eq!(page.eval(&mut b, "document.querySelectorAll('svg.timeline').length"), json!(1));
    assert_clean(&mut b, &page, &url);
}

/// The docs' screenshots of the interactive report (`MEMSNAP_SCREENSHOTS=docs` writes
/// `docs/interactive-*.png`); without the variable, nothing is written.
#[test]
fn screenshots() {
    let Ok(dir) = std::env::var("MEMSNAP_SCREENSHOTS") else { return };
    let Some((mut b, page, url, _out, _tmp)) = open("dev/s03_loss_history_leak.pickle.xz") else { return };
    let dir = root().join(dir);
    // Tall enough for each figure to fit the viewport.
    page.resize(&mut b, 1280, 1700);
    let shot = |b: &mut Browser, name: &str, selector: &str| {
        let r = page.eval(
            b,
            &format!(
                "(() => {{ const e = document.querySelector({}); e.scrollIntoView({{block: 'start'}}); const r = e.getBoundingClientRect(); return [r.left + scrollX, r.top + scrollY, r.width, r.height]; }})()",
                json!(selector)
            ),
        );
        page.settle(b);
        page.screenshot(
            b,
            &dir.join(name),
            Some((num(&r[0]) - 4.0, num(&r[1]) - 4.0, num(&r[2]) + 8.0, num(&r[3]) + 8.0)),
        );
    };
    // The whole run with the suspect selected, then one iteration with a tooltip.
    page.click_on(&mut b, ".verdict .suspect .ms-show-suspect");
    shot(&mut b, "interactive-timeline.png", &sel(0, ".ms-explorer"));
    page.eval(&mut b, &format!("document.querySelector({}).value = '4'", json!(sel(0, ".ms-iter"))));
    page.click_on(&mut b, &sel(0, ".ms-zoom-iter"));
    let e = page.eval(
        &mut b,
        "(() => { const ex = memsnap.explorer(0), m = ex.m; for (const w of m.windows) for (let j = 0; j < w.act.length; j++) { const e = w.first + j; const st = memsnap.data.stacks[w.stack[j]] || []; if (w.act[j] === 'a' && e >= ex.v0 + (ex.v1 - ex.v0) * 0.3 && e + 1 <= ex.v1 && w.size[j] >= 1048576 && st.some(f => f >= 0 && memsnap.data.frames[f][3] === 0)) return e; } return null; })()",
    );
    let (x, y) = point_of_event(&mut b, &page, 0, num(&e));
    page.click(&mut b, x, y);
    page.move_to(&mut b, x, y);
    let r = page.eval(
        &mut b,
        &format!("(() => {{ const r = document.querySelector({}).getBoundingClientRect(); return [r.left + scrollX, r.top + scrollY, r.width, r.height]; }})()", json!(sel(0, ".ms-explorer"))),
    );
    page.screenshot(
        &mut b,
        &dir.join("interactive-zoom.png"),
        Some((num(&r[0]) - 4.0, num(&r[1]) - 4.0, num(&r[2]) + 8.0, num(&r[3]) + 8.0)),
    );
    page.move_to(&mut b, 2.0, 2.0);
    shot(&mut b, "interactive-moment.png", &sel(0, ".ms-at"));
    assert_clean(&mut b, &page, &url);
}

/// The page of the 1.07 GB bench file (12.3 M events, 4.1 M blocks, 4,400 iterations): at most
/// [`PAGE_LIMIT`] bytes, ready (within [`HANG_GUARD`]), without errors, and the iteration of the
/// peak is there event by event. How fast it opens is printed and recorded in docs/report.md,
/// not asserted: this test shares two cores with the other browser tests, and a page that opens
/// in 0.4 s on a quiet machine took 2.7 s under that load.
#[test]
#[cfg_attr(not(memsnap_shared), ignore = "needs ../shared beside the checkout")]
fn the_bench_file_gives_a_small_page_that_opens() {
    const PAGE_LIMIT: u64 = 15 << 20;
    /// Only a page that never becomes ready fails on time.
    const HANG_GUARD: Duration = Duration::from_secs(30);
    let Some(mut b) = cdp::launch() else { return };
    let dir = tempfile::tempdir().unwrap();
    let page = b.page();
    let out = dir.path().join("bench.html");
    // The smaller bench file first (its figures are printed, as docs/report.md quotes them).
    for name in ["huge_python_stacks", "giant_python_stacks"] {
        let input = root().join(format!("../shared/bench/{name}.pickle.xz"));
        let start = std::time::Instant::now();
        report(&input, &out, &[]);
        let made = start.elapsed();
        let size = std::fs::metadata(&out).unwrap().len();
        b.drain();
        b.events.clear();
        let (url, elapsed) = page.open(&mut b, &out);
        let script_ms = num(&page.eval(&mut b, "window.memsnapOpenMs"));
        eprintln!(
            "{name}: page of {size} bytes made in {made:?}; ready {elapsed:?} after the navigate command, the script done {script_ms:.0} ms after navigation start"
        );
        assert!(size <= PAGE_LIMIT, "{name}: {size} bytes");
        assert!(elapsed < HANG_GUARD, "{name}: not ready after {elapsed:?}");
        assert_clean(&mut b, &page, &url);
    }
    let input = root().join("../shared/bench/giant_python_stacks.pickle.xz");
    let url = format!("file://{}", out.display());
    let tl = sel(0, "canvas.ms-tl");
    page.click_on(&mut b, &sel(0, ".ms-zoom-peak"));
    assert_eq!(page.eval(&mut b, &format!("document.querySelector({}).dataset.mode", json!(tl))), json!("events"));
    assert!(data(&mut b, &page, &tl, "visibleEvents") <= 1000.0);
    // An iteration far from the embedded windows: drawn from the finest level, and it says so.
    page.eval(&mut b, &format!("document.querySelector({}).value = '2000'", json!(sel(0, ".ms-iter"))));
    page.click_on(&mut b, &sel(0, ".ms-zoom-iter"));
    let visible = data(&mut b, &page, &tl, "visibleEvents");
    assert!(visible < 10_000.0, "one iteration: {visible} events");
    let mode = page.eval(&mut b, &format!("document.querySelector({}).dataset.mode", json!(tl)));
    assert!(mode == json!("buckets") || mode == json!("mixed"), "{mode}");
    assert!(text(&mut b, &page, &sel(0, ".ms-info")).contains("1 point = 256 events"));
    assert_clean(&mut b, &page, &url);
    // Asked for with --detail, the same iteration is there event by event.
    report(&input, &out, &["--detail", "iteration:2000"]);
    b.drain();
    b.events.clear();
    let (url, _) = page.open(&mut b, &out);
    page.eval(&mut b, &format!("document.querySelector({}).value = '2000'", json!(sel(0, ".ms-iter"))));
    page.click_on(&mut b, &sel(0, ".ms-zoom-iter"));
    assert_eq!(page.eval(&mut b, &format!("document.querySelector({}).dataset.mode", json!(tl))), json!("events"));
    assert_clean(&mut b, &page, &url);
}

/// Frame names and labels that try to close the data element, run script, load an image and
/// reverse the text around them.
const HOSTILE_FILE: &str = "/workspace/</script><script>window.__pwned=1</script>\u{202e}evil.py";
const HOSTILE_NAME: &str = "<img src=x onerror=\"window.__pwned=2\">step\u{2066}";
const HOSTILE_LABEL: &str = "</script><!--<script>window.__pwned=3</script>";

/// A small snapshot whose every allocation carries the hostile names (pickled by serde_pickle):
/// one 2 MiB segment, three 512-byte allocations, one freed.
fn hostile_snapshot() -> Vec<u8> {
    use serde_pickle::{HashableValue as HV, SerOptions, Value as PV};
    let st = |s: &str| PV::String(s.into());
    let dict = |items: Vec<(&str, PV)>| {
        PV::Dict(
            items.into_iter().map(|(k, v)| (HV::String(k.into()), v)).collect::<std::collections::BTreeMap<_, _>>(),
        )
    };
    let frames = || {
        PV::List(vec![
            dict(vec![("filename", st(HOSTILE_FILE)), ("line", PV::I64(7)), ("name", st(HOSTILE_NAME))]),
            dict(vec![("filename", st("/workspace/train.py")), ("line", PV::I64(3)), ("name", st("<module>"))]),
        ])
    };
    let a: i64 = 0x7f00_0000_0000;
    let seg: i64 = 2 << 20;
    let event = |action: &str, addr: i64, size: i64, t: i64| {
        dict(vec![
            ("action", st(action)),
            ("addr", PV::I64(addr)),
            ("size", PV::I64(size)),
            ("stream", PV::I64(0)),
            ("time_us", PV::I64(1_700_000_000_000_000 + t)),
            ("frames", frames()),
            ("compile_context", st("N/A")),
            ("user_metadata", st(HOSTILE_LABEL)),
        ])
    };
    let block = |addr: i64, size: i64, state: &str| {
        dict(vec![
            ("address", PV::I64(addr)),
            ("size", PV::I64(size)),
            ("requested_size", PV::I64(if state == "inactive" { 0 } else { 500 })),
            ("state", st(state)),
            ("frames", if state == "inactive" { PV::List(vec![]) } else { frames() }),
        ])
    };
    let top = dict(vec![
        (
            "segments",
            PV::List(vec![dict(vec![
                ("device", PV::I64(0)),
                ("address", PV::I64(a)),
                ("total_size", PV::I64(seg)),
                ("allocated_size", PV::I64(1024)),
                ("active_size", PV::I64(1024)),
                ("requested_size", PV::I64(1000)),
                ("stream", PV::I64(0)),
                ("segment_type", st("large")),
                ("segment_pool_id", PV::Tuple(vec![PV::I64(0), PV::I64(0)])),
                ("is_expandable", PV::Bool(false)),
                ("frames", frames()),
                (
                    "blocks",
                    PV::List(vec![
                        block(a, 512, "inactive"),
                        block(a + 512, 512, "active_allocated"),
                        block(a + 1024, 512, "active_allocated"),
                        block(a + 1536, seg - 1536, "inactive"),
                    ]),
                ),
            ])]),
        ),
        (
            "device_traces",
            PV::List(vec![PV::List(vec![
                event("segment_alloc", a, seg, 0),
                event("alloc", a, 500, 10),
                event("alloc", a + 512, 500, 20),
                event("free_requested", a, 500, 30),
                event("free_completed", a, 500, 40),
                event("alloc", a + 1024, 500, 50),
            ])]),
        ),
        ("allocator_settings", dict(vec![("PYTORCH_CUDA_ALLOC_CONF", st(""))])),
    ]);
    serde_pickle::value_to_vec(&top, SerOptions::new()).unwrap()
}

#[test]
fn hostile_frame_names_stay_text() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("hostile.pickle");
    std::fs::write(&input, hostile_snapshot()).unwrap();
    let out = dir.path().join("hostile.html");
    report(&input, &out, &[]);
    let html = std::fs::read_to_string(&out).unwrap();
    // Two script elements, the blob and the app; nothing from the file opens another.
    assert_eq!(html.matches("<script").count(), 2, "only the page's own scripts");
    assert_eq!(html.matches("</script>").count(), 2);
    assert!(!html.contains("<img"), "no markup from the file");
    for c in ['\u{202e}', '\u{2066}'] {
        assert!(!html.contains(c), "{c:?} raw in the page");
    }
    let Some(mut b) = cdp::launch() else { return };
    let page = b.page();
    let (url, _) = page.open(&mut b, &out);
    assert_eq!(page.eval(&mut b, "typeof window.__pwned"), json!("undefined"));
    assert_eq!(page.eval(&mut b, "document.querySelectorAll('img, script:not(#memsnap-data)').length"), json!(1));
    // The names are shown as text: in the tooltip of an allocation, and the labels' strip.
    let (x, y) = point_of_event(&mut b, &page, 0, 1.0);
    page.move_to(&mut b, x, y);
    let tip = text(&mut b, &page, "#ms-tip");
    assert!(tip.contains("alloc"), "{tip}");
    assert!(tip.contains("</script><script>window.__pwned=1</script>\u{202e}evil.py"), "{tip}");
    assert!(tip.contains("<img src=x onerror=\"window.__pwned=2\">step\u{2066}"), "{tip}");
    let labels = page.eval(&mut b, "memsnap.data.devices[0].phases.labels[0][1]");
    assert_eq!(labels, json!(HOSTILE_LABEL));
    assert_eq!(page.eval(&mut b, "typeof window.__pwned"), json!("undefined"));
    assert_clean(&mut b, &page, &url);
}

/// Every real fixture's page (the dev set, the formats, two-device and state-only files, the
/// hostile files that still read) opens and takes a round of use — wheel, hover, a click, the
/// slider, the colourings, every device — without an error or a request.
#[test]
fn every_fixture_page_works_without_errors() {
    let Some(mut b) = cdp::launch() else { return };
    let dir = tempfile::tempdir().unwrap();
    let mut inputs: Vec<PathBuf> = Vec::new();
    for sub in ["dev", "formats", "multi", "extra3", "extra4"] {
        for e in std::fs::read_dir(root().join("fixtures").join(sub)).unwrap() {
            let p = e.unwrap().path();
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            if name.ends_with(".pickle.xz") || name.ends_with(".pickle") {
                inputs.push(p);
            }
        }
    }
    for name in ["ok_terminal_escapes.pickle.xz", "ok_long_names.pickle.xz", "ok_trace_below_dump.pickle"] {
        inputs.push(root().join("fixtures/hostile").join(name));
    }
    inputs.sort();
    let page = b.page();
    let round = r#"(async () => {
        const frame = () => new Promise(r => requestAnimationFrame(() => r()));
        const ui = (sel) => Array.from(document.querySelectorAll(sel));
        for (const sec of ui('section.ms-device')) {
            memsnap.showDevice(+sec.dataset.device);
            const c = sec.querySelector('canvas.ms-tl');
            if (c) {
                const r = c.getBoundingClientRect(), x = r.left + r.width / 2, y = r.top + 100;
                c.dispatchEvent(new WheelEvent('wheel', { clientX: x, clientY: y, deltaY: -300, bubbles: true, cancelable: true }));
                c.dispatchEvent(new MouseEvent('mousemove', { clientX: x, clientY: y, bubbles: true }));
                c.dispatchEvent(new MouseEvent('mousemove', { clientX: x, clientY: r.top + 262, bubbles: true }));
                c.dispatchEvent(new MouseEvent('mousedown', { clientX: x, clientY: y, bubbles: true }));
                c.dispatchEvent(new MouseEvent('mouseup', { clientX: x, clientY: y, bubbles: true }));
            }
            const s = sec.querySelector('.ms-slider');
            if (s) { s.value = '0'; s.dispatchEvent(new Event('input')); await frame(); }
            for (const mode of ['category', 'site', 'state']) {
                const sel = sec.querySelector('.ms-colorby');
                if (sel) { sel.value = mode; sel.dispatchEvent(new Event('change')); }
            }
            const seg = sec.querySelector('canvas.ms-segmap');
            if (seg) {
                const r = seg.getBoundingClientRect();
                seg.dispatchEvent(new MouseEvent('mousemove', { clientX: r.left + 200, clientY: r.top + 10, bubbles: true }));
                seg.dispatchEvent(new MouseEvent('click', { clientX: r.left + 200, clientY: r.top + 10, bubbles: true }));
            }
            const fl = sec.querySelector('canvas.ms-flame');
            if (fl) {
                const r = fl.getBoundingClientRect();
                fl.dispatchEvent(new MouseEvent('click', { clientX: r.left + 20, clientY: r.top + 30, bubbles: true }));
            }
            for (const b of sec.querySelectorAll('.ms-sus')) { b.click(); await frame(); }
            await frame();
        }
        return true;
    })()"#;
    for input in &inputs {
        let out = dir.path().join("r.html");
        report(input, &out, &[]);
        b.drain();
        b.events.clear();
        let (url, _) = page.open(&mut b, &out);
        assert_eq!(page.eval(&mut b, round), json!(true), "{}", input.display());
        b.drain();
        let p = problems(&b.events, &page.session, &url);
        assert!(p.is_empty(), "{}: {p:#?}", input.display());
    }
}
