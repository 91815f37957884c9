//! `memsnap report -o report.html`: the interactive page (docs/report.md, "The interactive
//! page") is one self-contained file — the static report plus a data blob and a script, no
//! reference to anything outside it — whose blob says what the replay says, with every string
//! from the file escaped; `--static` keeps the script-free page. The page in a browser is tested
//! by tests/browser.

use crate::common;

use std::path::Path;

use common::{fixture, memsnap};
use serde_json::Value;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The page of `fixture` on stdout, with its blob parsed.
fn page(fixture_name: &str, extra: &[&str]) -> (String, Option<Value>) {
    let mut args = vec!["report".to_string(), s(&fixture(fixture_name)).to_string(), "-o".into(), "-".into()];
    args.extend(extra.iter().map(|a| a.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let r = memsnap(&args);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let html = r.stdout;
    let open = "<script type=\"application/json\" id=\"memsnap-data\">";
    let blob = html.find(open).map(|at| {
        let rest = &html[at + open.len()..];
        let text = &rest[..rest.find("</script>").expect("the blob ends")];
        serde_json::from_str(text).expect("the blob is JSON")
    });
    (html, blob)
}

#[test]
fn interactive_report_is_one_self_contained_page() {
    let (html, blob) = page("dev/s03_loss_history_leak.pickle.xz", &[]);
    let blob = blob.expect("a data blob");
    // The static report is all there, and the script comes after it.
    assert!(html.starts_with("<!DOCTYPE html>"));
    assert!(html.contains("retained_graph") && html.contains("<svg"), "the static content");
    assert!(html.find("id=\"memsnap-data\"").unwrap() > html.find("<h3>Caveats</h3>").unwrap());
    assert_eq!(html.matches("<script").count(), 2, "the blob and the script, both inline");
    assert!(!html.contains("<script src") && !html.contains("<link") && !html.contains("@import"));
    assert!(html.contains("Content-Security-Policy\" content=\"default-src 'none'"), "no fetch is allowed");
    // Nothing outside the page is named (the SVG namespace is a name, not a fetch).
    let urls: Vec<&str> = html.match_indices("http").map(|(i, _)| &html[i..(i + 40).min(html.len())]).collect();
    assert!(
        urls.iter().all(|u| u.starts_with("http://www.w3.org/2000/svg") || u.starts_with("http-equiv")),
        "{urls:?}"
    );
    assert!(html.contains("<section class=\"ms-device\" data-device=\"0\">"));
    // The blob: every event of this small trace, its blocks and its suspect.
    let d = &blob["devices"][0];
    assert_eq!(blob["format"], 1);
    assert_eq!(d["events"], 8727);
    assert_eq!(d["windows"].as_array().unwrap().len(), d["windows_total"].as_u64().unwrap() as usize);
    assert_eq!(d["blocks"]["size"].as_array().unwrap().len(), d["blocks_total"].as_u64().unwrap() as usize);
    assert_eq!(d["peak"]["allocated"], 2_057_739_264u64, "1.92 GiB, as analyze says");
    let q = d["quantum"].as_u64().unwrap();
    let top = d["levels"][0]["amax"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).max().unwrap();
    assert_eq!(top * q, 2_057_739_264, "the pyramid keeps the peak");
    let sus = &blob["suspects"][0];
    assert_eq!(sus["kind"], "retained_graph");
    assert!(sus["blocks"].as_array().unwrap().len() > 100, "the leak's blocks are named");
    assert!(sus["evidence"].as_str().unwrap().contains("retain_graph=True"));
}

#[test]
fn static_keeps_the_script_free_page() {
    let (html, blob) = page("dev/s03_loss_history_leak.pickle.xz", &["--static"]);
    assert!(blob.is_none());
    assert!(!html.contains("<script"));
    assert!(!html.contains("Content-Security-Policy"));
    // The same static content as the interactive page carries.
    let (interactive, _) = page("dev/s03_loss_history_leak.pickle.xz", &[]);
    let verdict =
        |h: &str| h[h.find("<section class=\"card verdict").unwrap()..h.find("</section>").unwrap()].to_string();
    assert_eq!(verdict(&html), verdict(&interactive));
    // SVG is always static.
    let (svg, blob) = page("dev/s03_loss_history_leak.pickle.xz", &["--format", "svg"]);
    assert!(svg.starts_with("<svg ") && blob.is_none() && !svg.contains("<script"));
}

#[test]
fn interactive_report_of_two_devices_and_of_an_oom() {
    let (html, blob) = page("multi/m01_two_gpu_pipeline.pickle", &[]);
    let blob = blob.unwrap();
    let devices: Vec<u64> = blob["devices"].as_array().unwrap().iter().map(|d| d["device"].as_u64().unwrap()).collect();
    assert_eq!(devices, [0, 1]);
    for d in devices {
        assert!(html.contains(&format!("<section class=\"ms-device\" data-device=\"{d}\">")));
    }
    let (_, blob) = page("dev/s08_oom.pickle.xz", &[]);
    let blob = blob.unwrap();
    let oom = blob["suspects"].as_array().unwrap().iter().find(|s| s["kind"] == "oom").expect("an OOM suspect");
    let event = oom["event"].as_u64().unwrap();
    assert_eq!(oom["moment"].as_u64(), Some(event));
    assert!(blob["devices"][0]["ooms"].as_array().unwrap().iter().any(|e| e.as_u64() == Some(event)));
}

#[test]
fn interactive_report_escapes_every_string_of_the_file() {
    // The escapes fixture: ESC, bidi overrides, zero-width and C1 characters in file and
    // function names, keys and settings.
    let (html, blob) = page("hostile/ok_terminal_escapes.pickle.xz", &[]);
    let open = html.find("id=\"memsnap-data\">").unwrap();
    let text = &html[open + "id=\"memsnap-data\">".len()..];
    let text = &text[..text.find("</script>").unwrap()];
    for c in ['<', '>', '&', '\u{2028}', '\u{2029}', '\u{202e}', '\u{2066}', '\u{200b}', '\u{1b}', '\u{9b}', '\u{7f}'] {
        assert!(!text.contains(c), "{c:?} raw in the blob");
    }
    // Escaped, not lost: the names come back whole from the JSON.
    let blob = blob.unwrap();
    let strings: Vec<&str> = blob["strings"].as_array().unwrap().iter().filter_map(|v| v.as_str()).collect();
    assert!(
        strings.contains(
            &"/workspace/\x1b]0;TITLE\x07\x1b[2J\u{9b}31m\u{202e}evil\u{2066}\u{200b}\x7f\nFORGED LINE\r\ttrain.py"
        ),
        "{strings:?}"
    );
}

#[test]
fn interactive_report_is_the_same_on_one_and_two_threads() {
    // (tests/cli/report.rs compares every format on three files; this is the OOM and the
    // expandable segments, whose maps the blob rebuilds.)
    let dir = tempfile::tempdir().unwrap();
    for input in ["dev/s08_oom.pickle.xz", "dev/s09_expandable.pickle.xz"] {
        let mut outs = Vec::new();
        for threads in ["1", "2"] {
            let out = dir.path().join(format!("{threads}.html"));
            let r = common::memsnap_env(
                None,
                &["report", s(&fixture(input)), "-o", s(&out)],
                None,
                &[("RAYON_NUM_THREADS", threads)],
            );
            assert_eq!(r.code, Some(0), "{}", r.stderr);
            outs.push(std::fs::read(&out).unwrap());
        }
        assert!(outs[0] == outs[1], "{input}: the page differs between 1 and 2 threads");
    }
}

#[test]
fn detail_takes_the_moment_grammar() {
    let input = fixture("dev/s03_loss_history_leak.pickle.xz");
    let r = memsnap(&["report", s(&input), "-o", "-", "--detail", "iteration:3", "--detail", "peak"]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let r = memsnap(&["report", s(&input), "-o", "-", "--detail", "event:99999"]);
    assert_eq!(r.code, Some(2));
    assert!(r.stderr.contains("--detail event:99999") && r.stderr.contains("events 0 to 8726"), "{}", r.stderr);
    let r = memsnap(&["report", s(&input), "-o", "-", "--detail", "noon"]);
    assert_eq!(r.code, Some(2));
}
