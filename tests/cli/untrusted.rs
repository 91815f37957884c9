//! Untrusted strings in outputs (docs/format.md, "Untrusted strings and outputs"): file and
//! function names, keys, actions and allocator settings from the snapshot, and paths, never
//! reach a terminal as controls (escapes, bidi overrides, newlines that forge lines), and a
//! 4 MiB name never makes a 4 MiB line or a 100 MB report.
//!
//! The snapshots are `fixtures/hostile/ok_terminal_escapes.pickle.xz` and
//! `ok_long_names.pickle.xz`, made by `fixtures/gen/make_untrusted.py` (which holds the exact
//! strings quoted below).

use crate::common;

use std::path::Path;

use common::{fixture, memsnap, memsnap_in, Run};

const ESCAPES: &str = "hostile/ok_terminal_escapes.pickle.xz";
const LONG: &str = "hostile/ok_long_names.pickle.xz";

/// The user's file name in ok_terminal_escapes, as the generator wrote it and as text outputs
/// must show it.
const FILE_RAW: &str =
    "/workspace/\x1b]0;TITLE\x07\x1b[2J\u{9b}31m\u{202e}evil\u{2066}\u{200b}\x7f\nFORGED LINE\r\ttrain.py";
const FILE_SHOWN: &str =
    "\\x1b]0;TITLE\\x07\\x1b[2J\\u{9b}31m\\u{202e}evil\\u{2066}\\u{200b}\\x7f\\nFORGED LINE\\r\\ttrain.py";
const FUNC_SHOWN: &str = "step\\x1b[31mRED\\x1b[0m\\u{202e}\\u{85}\\nFORGED";

/// Characters a terminal would obey or that change how the text around them is shown.
fn active(c: char) -> bool {
    matches!(c,
        '\0'..='\x1f' | '\x7f'..='\u{9f}' | '\u{200b}'..='\u{200f}' | '\u{2028}'..='\u{202e}'
        | '\u{2066}'..='\u{2069}' | '\u{feff}')
}

/// No byte below 0x20 but `\n` (and `\t` where `tabs` allows), no DEL, and no C1, bidi or
/// zero-width character in `bytes`.
fn assert_inert_with(what: &str, bytes: &[u8], tabs: bool) {
    for (i, &b) in bytes.iter().enumerate() {
        let ok = b == b'\n' || (tabs && b == b'\t') || (b >= 0x20 && b != 0x7f);
        assert!(ok, "{what}: byte {b:#04x} at {i}: {:?}", String::from_utf8_lossy(&bytes[i.saturating_sub(80)..]));
    }
    let text = String::from_utf8_lossy(bytes);
    if let Some((i, c)) = text.char_indices().find(|&(_, c)| active(c) && c != '\n' && !(tabs && c == '\t')) {
        panic!("{what}: {c:?} at {i}");
    }
}

fn assert_inert(what: &str, run: &Run) {
    assert!(!run.stderr.contains("panicked"), "{what}: {}", run.stderr);
    assert_inert_with(&format!("{what} (stdout)"), &run.stdout_bytes, false);
    assert_inert_with(&format!("{what} (stderr)"), &run.stderr_bytes, false);
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn every_text_output_shows_controls_from_the_file_as_escapes() {
    let f = fixture(ESCAPES);
    let f = s(&f);
    let runs: Vec<(&str, Vec<&str>, i32)> = vec![
        ("analyze", vec!["analyze", f], 0),
        ("trace", vec!["trace", f], 0),
        ("check", vec!["check", f, "--fail-on", "all"], 1),
        ("diff", vec!["diff", f, f], 0),
        ("summary", vec!["summary", f], 0),
        ("segments", vec!["segments", f, "--at", "peak"], 0),
        ("timeline", vec!["timeline", f], 0),
        ("timeline --csv", vec!["timeline", f, "--csv"], 0),
        ("flamegraph --folded", vec!["flamegraph", f, "--folded", "-o", "-"], 0),
        ("batch csv", vec!["batch", f, "--format", "csv"], 0),
        ("batch jsonl", vec!["batch", f], 0),
    ];
    for (what, args, code) in &runs {
        let r = memsnap(args);
        assert_eq!(r.code, Some(*code), "{what}: {}", r.stderr);
        assert_inert(what, &r);
        let out = &r.stdout;
        // The escapes are visible where the names are shown.
        match *what {
            "analyze" => {
                assert!(out.contains(&format!("at /workspace/{FILE_SHOWN}:19 in {FUNC_SHOWN}\n")), "{out}");
                assert!(!out.lines().any(|l| l.starts_with("FORGED")), "a name forged a line: {out}");
            }
            "check" => assert!(out.contains(&format!("{FILE_SHOWN}:19 in {FUNC_SHOWN}")), "{out}"),
            "trace" => assert!(out.contains(&format!("  {FILE_SHOWN}:18 {FUNC_SHOWN}\n")), "{out}"),
            "diff" => assert!(out.contains(FILE_SHOWN), "{out}"),
            "summary" => {
                for want in [
                    "  conf\\x1b[2J: v\\x1b]0;SET\\x07\\u{202e}\\u{9b}\n",
                    "  key \\x1b]0;KEY\\x07key\\n: 1\n",
                    "  key device_traces[][].ev\\x1b[2Jkey: 1\n",
                    "  action act\\x1b[2J\\x07: 1\n",
                ] {
                    assert!(out.contains(want), "{want:?} in {out}");
                }
            }
            "flamegraph --folded" => {
                // `;` (the frame separator) and newlines in names become `,` first.
                let frame = "step\\x1b[31mRED\\x1b[0m\\u{202e}\\u{85},FORGED (/workspace/\\x1b]0,TITLE\\x07\\x1b[2J";
                assert!(out.contains(frame), "{out}");
                // Still one stack per line, the count after the last space.
                for line in out.lines() {
                    let (path, count) = line.rsplit_once(' ').unwrap_or_else(|| panic!("{line}"));
                    assert!(!path.is_empty() && count.parse::<u64>().is_ok(), "{line}");
                }
            }
            "batch csv" => assert!(out.contains(&format!("{FILE_SHOWN}:19 ({FUNC_SHOWN})")), "{out}"),
            "batch jsonl" => {
                // JSON keeps the real string (escaped as JSON, which the check above allows).
                let row: serde_json::Value = serde_json::from_str(out.trim_end()).unwrap();
                assert_eq!(row["top_suspects"][0]["site"]["filename"], FILE_RAW);
            }
            _ => {}
        }
    }
}

#[test]
fn json_keeps_the_real_strings_without_raw_controls() {
    let r = memsnap(&["summary", s(&fixture(ESCAPES)), "--json"]);
    // Pretty-printed JSON: newlines between tokens only.
    assert_inert("summary --json", &r);
    let v = r.json();
    assert_eq!(v["allocator_settings"]["conf\x1b[2J"], "v\x1b]0;SET\x07\u{202e}\u{9b}");
    assert_eq!(v["unknown_keys"]["\x1b]0;KEY\x07key\n"], 1);
    assert_eq!(v["unknown_actions"]["act\x1b[2J\x07"], 1);
    let r = memsnap(&["analyze", s(&fixture(ESCAPES)), "--json"]);
    assert_inert("analyze --json", &r);
    assert_eq!(r.json()["suspects"][0]["site"]["filename"], FILE_RAW);
}

#[test]
fn html_and_svg_carry_no_terminal_controls() {
    for format in ["html", "svg"] {
        let r = memsnap(&["report", s(&fixture(ESCAPES)), "-o", "-", "--format", format]);
        assert_eq!(r.code, Some(0), "{}", r.stderr);
        // Markup keeps tabs and newlines of the names as text; nothing else.
        assert_inert_with(format, &r.stdout_bytes, true);
        assert!(r.stdout.contains("&#x202E;evil&#x2066;&#x200B;"), "{format}: bidi controls as references");
    }
}

#[test]
fn paths_are_escaped_in_headers_errors_and_batch_lines() {
    let dir = tempfile::tempdir().unwrap();
    let name = "snap\x1b]0;PATH\x07\u{202e}\n.pickle.xz";
    let path = dir.path().join(name);
    std::fs::copy(fixture(ESCAPES), &path).unwrap();
    let shown = "snap\\x1b]0;PATH\\x07\\u{202e}\\n.pickle.xz";
    for cmd in ["analyze", "summary", "trace", "segments", "timeline"] {
        let r = memsnap(&[cmd, s(&path)]);
        assert_eq!(r.code, Some(0), "{cmd}: {}", r.stderr);
        assert_inert(cmd, &r);
        let first = r.stdout.lines().next().unwrap();
        assert!(first.starts_with(&format!("memsnap {cmd}: ")) && first.contains(shown), "{cmd}: {first}");
    }
    // An unreadable file: the one error line quotes the path, escaped.
    let bad = dir.path().join("bad\x1b[2J\n\u{9b}.pickle");
    std::fs::write(&bad, b"{\"not\": \"a pickle\"}").unwrap();
    let r = memsnap(&["summary", s(&bad)]);
    assert_eq!(r.code, Some(2));
    assert_inert("error line", &r);
    assert_eq!(r.stderr.lines().count(), 1, "{}", r.stderr);
    assert!(r.stderr.contains("bad\\x1b[2J\\n\\u{9b}.pickle: byte 0"), "{}", r.stderr);
    // batch: the CSV cell, the error row, the summary line on stderr.
    let out = dir.path().join("rows\x1b]0;OUT\x07.csv");
    let r = memsnap(&["batch", s(&path), s(&bad), "-o", s(&out)]);
    assert_eq!(r.code, Some(2), "{}", r.stderr);
    assert_inert("batch", &r);
    assert!(r.stderr.contains("rows\\x1b]0;OUT\\x07.csv"), "{}", r.stderr);
    let rows = std::fs::read(&out).unwrap();
    assert_inert_with("batch rows", &rows, false);
    let rows = String::from_utf8(rows).unwrap();
    assert!(rows.contains(shown) && rows.contains("bad\\x1b[2J\\n\\u{9b}.pickle"), "{rows}");
    assert_eq!(rows.lines().count(), 3, "a header and two rows: {rows}");
}

#[test]
fn csv_cells_that_a_spreadsheet_would_run_are_neutralised() {
    let dir = tempfile::tempdir().unwrap();
    let good = ["=HYPERLINK(\"x\").pickle.xz", "+1.pickle.xz", "@SUM(1).pickle.xz"];
    for n in good {
        std::fs::copy(fixture("dev/s12_cuda_graph.pickle.xz"), dir.path().join(n)).unwrap();
    }
    std::fs::write(dir.path().join("-2+3.pickle"), b"not a pickle").unwrap();
    let mut args = vec!["batch", "--format", "csv", "--"];
    args.extend(good);
    args.push("-2+3.pickle");
    let r = memsnap_in(Some(dir.path()), &args, None);
    assert_eq!(r.code, Some(2), "{}", r.stderr);
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(lines.len(), 5, "{}", r.stdout);
    assert!(lines[1].starts_with("\"'=HYPERLINK(\"\"x\"\").pickle.xz\","), "{}", lines[1]);
    assert!(lines[2].starts_with("'+1.pickle.xz,"), "{}", lines[2]);
    assert!(lines[3].starts_with("'@SUM(1).pickle.xz,"), "{}", lines[3]);
    assert!(lines[4].starts_with("'-2+3.pickle,12,"), "{}", lines[4]);
    // Numbers stay numbers.
    let size = std::fs::metadata(fixture("dev/s12_cuda_graph.pickle.xz")).unwrap().len();
    assert!(lines[2].starts_with(&format!("'+1.pickle.xz,{size},")), "{}", lines[2]);
}

/// Largest line of `text`, in bytes.
fn longest_line(text: &str) -> usize {
    text.lines().map(str::len).max().unwrap_or(0)
}

#[test]
fn a_4_mib_name_gives_small_outputs() {
    let f = fixture(LONG);
    let f = s(&f);
    let dir = tempfile::tempdir().unwrap();
    for (name, limit) in [("report.html", 1 << 20), ("report.svg", 1 << 20), ("flame.svg", 256 << 10)] {
        let out = dir.path().join(name);
        let cmd = if name.starts_with("flame") { "flamegraph" } else { "report" };
        let r = memsnap(&[cmd, f, "-o", s(&out)]);
        assert_eq!(r.code, Some(0), "{name}: {}", r.stderr);
        let text = std::fs::read_to_string(&out).unwrap();
        assert!(text.len() < limit, "{name}: {} bytes", text.len());
        assert!(text.contains(" chars]…"), "{name}: a clipped name says how long it was");
    }
    let r = memsnap(&["analyze", f]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(r.stdout.len() < 64 << 10, "analyze: {} bytes", r.stdout.len());
    assert!(r.stdout.contains("…[4194326 chars]…"), "the file name, clipped");
    assert!(r.stdout.contains("nnnn.py:19 in ffff"), "its end and the function's start");
    assert!(r.stdout.contains("…[4194304 chars]…"), "the function name, clipped");
    // The longest lines hold a file and a function name, each clipped to 512 characters.
    for args in [vec!["trace", f], vec!["flamegraph", f, "--folded", "-o", "-"], vec!["check", f, "--fail-on", "all"]] {
        let r = memsnap(&args);
        assert!(r.code == Some(0) || r.code == Some(1), "{args:?}: {}", r.stderr);
        let n = longest_line(&r.stdout);
        assert!(n < 4 * 512 + 400, "{args:?}: a line of {n} bytes");
    }
}
