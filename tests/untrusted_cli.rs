//! Untrusted strings in outputs: file and function names from the snapshot never reach a
//! terminal as controls from a report, and a 4 MiB name never makes a 100 MB report.
//!
//! The snapshots are `fixtures/hostile/ok_terminal_escapes.pickle.xz` and
//! `ok_long_names.pickle.xz`, made by `fixtures/gen/make_untrusted.py` (which holds the exact
//! strings).

mod common;

use std::path::Path;

use common::{fixture, memsnap};

const ESCAPES: &str = "hostile/ok_terminal_escapes.pickle.xz";
const LONG: &str = "hostile/ok_long_names.pickle.xz";

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

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
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
fn a_4_mib_name_gives_small_reports() {
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
}
