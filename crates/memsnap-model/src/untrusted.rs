//! Strings from a snapshot (file and function names, keys, actions, allocator settings) and
//! paths are untrusted: they may hold terminal escapes, bidi overrides or newlines, and they may
//! be megabytes long. This is the one place that decides how they are shown:
//!
//! - [`clip`] caps a string at [`MAX_SHOWN_CHARS`] characters (the first and last parts, and
//!   the original length), for every report, flamegraph and text output;
//! - [`printable`] turns every character that could change how a terminal shows the rest into a
//!   visible escape (`\x1b`, `\n`, `\u{202e}`), for text outputs; [`shown`] does both;
//! - [`escape_controls`] is the safety net at the text output boundary (C0 but `\n`, DEL, C1);
//! - [`json_safe`] is the same net for serialized JSON, with `\u` escapes that keep the value.
//!
//! JSON keeps the real strings; HTML and SVG have their own escaping.

use std::borrow::Cow;
use std::fmt::Write as _;

/// Most characters of one untrusted string that a report, flamegraph or text output shows. A
/// longer string keeps its first [`CLIP_HEAD`] characters and its end, joined by
/// `…[N chars]…` (N the original length), in exactly this many characters.
pub const MAX_SHOWN_CHARS: usize = 512;

/// Characters kept from the start of a clipped string (the rest of [`MAX_SHOWN_CHARS`], less
/// the marker, comes from its end: a file name's extension and a function's tail stay visible).
pub const CLIP_HEAD: usize = 320;

/// Whether `c` changes how a terminal (or an editor) shows the text around it, or hides text:
/// C0 controls (newline, CR and tab included), DEL, C1 controls, bidi embeddings, overrides and
/// isolates, zero-width and other invisible format characters, line and paragraph separators,
/// and tag characters.
pub fn is_display_unsafe(c: char) -> bool {
    matches!(c,
        '\0'..='\x1f'
        | '\x7f'..='\u{9f}'
        | '\u{ad}'
        | '\u{61c}'
        | '\u{180e}'
        | '\u{200b}'..='\u{200f}'
        | '\u{2028}'..='\u{202e}'
        | '\u{2060}'..='\u{206f}'
        | '\u{feff}'
        | '\u{fff9}'..='\u{fffb}'
        | '\u{e0000}'..='\u{e007f}')
}

fn push_escape(out: &mut String, c: char) {
    match c {
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        '\0'..='\x1f' | '\x7f' => {
            let _ = write!(out, "\\x{:02x}", c as u32);
        }
        _ => {
            let _ = write!(out, "\\u{{{:x}}}", c as u32);
        }
    }
}

fn escape_where(s: &str, unsafe_char: impl Fn(char) -> bool) -> Cow<'_, str> {
    let Some(first) = s.char_indices().find(|&(_, c)| unsafe_char(c)).map(|(i, _)| i) else {
        return Cow::Borrowed(s);
    };
    let mut out = String::with_capacity(s.len() + 16);
    out.push_str(&s[..first]);
    for c in s[first..].chars() {
        if unsafe_char(c) {
            push_escape(&mut out, c);
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// `s` with every [display-unsafe](is_display_unsafe) character as a visible escape: `\n`,
/// `\r`, `\t`, `\x1b` (other C0 and DEL), `\u{9b}` (C1), `\u{202e}` (the others). Backslashes
/// are left as they are: this is for reading, not for parsing back.
pub fn printable(s: &str) -> Cow<'_, str> {
    if s.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        return Cow::Borrowed(s);
    }
    escape_where(s, is_display_unsafe)
}

/// `s` cut to [`MAX_SHOWN_CHARS`] characters when longer: its first [`CLIP_HEAD`] characters,
/// `…[N chars]…`, and its last characters.
pub fn clip(s: &str) -> Cow<'_, str> {
    if s.len() <= MAX_SHOWN_CHARS {
        return Cow::Borrowed(s);
    }
    let n = s.chars().count();
    if n <= MAX_SHOWN_CHARS {
        return Cow::Borrowed(s);
    }
    let marker = format!("…[{n} chars]…");
    let tail = MAX_SHOWN_CHARS - CLIP_HEAD - marker.chars().count();
    let head_end = s.char_indices().nth(CLIP_HEAD).map_or(s.len(), |(i, _)| i);
    let tail_start = s.char_indices().rev().nth(tail - 1).map_or(0, |(i, _)| i);
    let mut out = String::with_capacity(head_end + marker.len() + (s.len() - tail_start));
    out.push_str(&s[..head_end]);
    out.push_str(&marker);
    out.push_str(&s[tail_start..]);
    Cow::Owned(out)
}

/// An untrusted string as a text output shows it: [`clip`]ped, then [`printable`].
pub fn shown(s: &str) -> Cow<'_, str> {
    match clip(s) {
        Cow::Borrowed(b) => printable(b),
        Cow::Owned(o) => Cow::Owned(printable(&o).into_owned()),
    }
}

/// The safety net of text output: C0 controls other than `\n`, DEL and C1 controls as visible
/// escapes, whatever put them there. (Untrusted strings are [`shown`] before they are
/// formatted, which also escapes their newlines; this catches what slipped through.)
pub fn escape_controls(text: &str) -> Cow<'_, str> {
    let b = text.as_bytes();
    let clean = b.iter().enumerate().all(|(i, &x)| match x {
        b'\n' => true,
        0..=0x1f | 0x7f => false,
        // U+0080..U+009F are 0xC2 0x80..0x9F in UTF-8.
        0xc2 => !matches!(b.get(i + 1), Some(0x80..=0x9f)),
        _ => true,
    });
    if clean {
        return Cow::Borrowed(text);
    }
    escape_where(text, |c| c != '\n' && matches!(c, '\0'..='\x1f' | '\x7f'..='\u{9f}'))
}

/// Serialized JSON with every [display-unsafe](is_display_unsafe) character written as a `\u`
/// escape, so that a terminal showing it is not driven by the file's strings. The value is
/// unchanged: a JSON reader gets the very same strings back. (Outside strings, JSON has only
/// ASCII punctuation and whitespace, and serde_json already escapes C0 inside them.)
pub fn json_safe(json: &str) -> Cow<'_, str> {
    if json.bytes().all(|b| b != 0x7f && b.is_ascii()) {
        return Cow::Borrowed(json);
    }
    // serde_json writes raw newlines and tabs only between tokens (pretty printing).
    let unsafe_char = |c: char| is_display_unsafe(c) && !matches!(c, '\n' | '\t' | '\r' | ' ');
    if !json.chars().any(unsafe_char) {
        return Cow::Borrowed(json);
    }
    let mut out = String::with_capacity(json.len() + 16);
    for c in json.chars() {
        if unsafe_char(c) {
            let mut units = [0u16; 2];
            for u in c.encode_utf16(&mut units) {
                let _ = write!(out, "\\u{:04x}", u);
            }
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printable_escapes_what_drives_a_terminal() {
        assert!(matches!(printable("train.py:12 (step)"), Cow::Borrowed(_)));
        assert!(matches!(printable("données/モデル.py"), Cow::Borrowed(_)));
        assert_eq!(printable("a\x1b]0;T\x07\x1b[2Jb"), "a\\x1b]0;T\\x07\\x1b[2Jb");
        assert_eq!(printable("l1\nl2\r\tx\x7f"), "l1\\nl2\\r\\tx\\x7f");
        assert_eq!(printable("\u{9b}31m \u{85}"), "\\u{9b}31m \\u{85}");
        assert_eq!(
            printable("\u{202e}evil\u{2066}\u{200b}\u{feff}\u{e0041}"),
            "\\u{202e}evil\\u{2066}\\u{200b}\\u{feff}\\u{e0041}"
        );
        for c in (0u32..0x20).chain(0x7f..0xa0).chain([0x202a, 0x202e, 0x2066, 0x2069, 0x200b, 0x2028]) {
            let c = char::from_u32(c).unwrap();
            let p = printable(&c.to_string()).into_owned();
            assert!(p.starts_with('\\') && p.chars().all(|x| x.is_ascii_graphic()), "{c:?} -> {p:?}");
        }
    }

    #[test]
    fn clip_keeps_both_ends_and_the_length() {
        let short = "x".repeat(MAX_SHOWN_CHARS);
        assert!(matches!(clip(&short), Cow::Borrowed(_)));
        // Multi-byte characters are counted as characters, not bytes.
        let wide = "é".repeat(MAX_SHOWN_CHARS);
        assert!(matches!(clip(&wide), Cow::Borrowed(_)));
        let long = format!("/start/{}/end.py", "n".repeat(4 << 20));
        let c = clip(&long);
        assert_eq!(c.chars().count(), MAX_SHOWN_CHARS);
        assert!(c.starts_with("/start/nnn"), "{c}");
        assert!(c.ends_with("nnn/end.py"), "{c}");
        assert!(c.contains(&format!("…[{} chars]…", long.len())), "{c}");
        let wide = "é".repeat(MAX_SHOWN_CHARS + 1);
        let c = clip(&wide);
        assert_eq!(c.chars().count(), MAX_SHOWN_CHARS);
        assert!(c.contains(&format!("…[{} chars]…", MAX_SHOWN_CHARS + 1)));
        // Escaping comes after clipping: a long hostile string stays short.
        let hostile = "\x1b".repeat(1 << 20);
        assert!(shown(&hostile).len() < 5 * MAX_SHOWN_CHARS);
    }

    #[test]
    fn the_safety_net_keeps_newlines_and_text() {
        assert!(matches!(escape_controls("a b\nc é モ\n"), Cow::Borrowed(_)));
        assert_eq!(escape_controls("a\x1b[2J\tb\r\n\x7f\u{9b}\u{202e}"), "a\\x1b[2J\\tb\\r\n\\x7f\\u{9b}\u{202e}");
        // 0xC2 followed by a byte outside C1 (U+00A0..U+00BF) is plain text.
        assert!(matches!(escape_controls("\u{a0}\u{bf}"), Cow::Borrowed(_)));
    }

    #[test]
    fn json_safe_keeps_the_value() {
        let v = "k\x1b\u{9b}\x7f\u{202e}\u{e0041}\n";
        let json = format!("{{\n  \"{}\": 1\n}}", v.replace('\x1b', "\\u001b").replace('\n', "\\n"));
        let safe = json_safe(&json);
        assert!(safe.is_ascii(), "{safe}");
        assert!(!safe.contains('\x7f'));
        assert!(safe.contains("\\u009b") && safe.contains("\\u007f") && safe.contains("\\u202e"));
        assert!(safe.contains("\\udb40\\udc41"), "a tag character as a surrogate pair: {safe}");
        assert!(matches!(json_safe("{\"a\": \"é\"}\n"), Cow::Borrowed(_)));
    }
}
