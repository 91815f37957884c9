//! The data blob as the text of a `<script type="application/json">` element.
//!
//! The HTML parser ends such an element at the first `</script` and reads `<!--` specially, so
//! the JSON must never contain `<`; `>` and `&` are escaped too, as are U+2028 and U+2029 (line
//! terminators to older JavaScript parsers) and every character that changes how text around it
//! is shown ([`memsnap_model::is_display_unsafe`]: controls, bidi overrides, zero-width
//! characters), so the page's bytes carry none of them raw. Outside strings JSON has none of
//! these characters, so escaping them everywhere as `\uXXXX` keeps the JSON's meaning.

use std::fmt::Write as _;

/// `data` as JSON, safe inside a script element.
pub fn to_script_text<T: serde::Serialize>(data: &T) -> String {
    let json = serde_json::to_string(data).expect("the page data serialises");
    escape(&json)
}

/// Escape the characters above in JSON text.
pub fn escape(json: &str) -> String {
    let mut out = String::with_capacity(json.len() + json.len() / 64);
    for c in json.chars() {
        if matches!(c, '<' | '>' | '&' | '\u{2028}' | '\u{2029}') || memsnap_model::is_display_unsafe(c) {
            let mut units = [0u16; 2];
            for u in c.encode_utf16(&mut units) {
                let _ = write!(out, "\\u{u:04x}");
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_can_close_the_element_or_hide_text() {
        let hostile = "</script><script>alert(1)</script><!-- \u{202e}evil\u{2066} \u{2028} & \x1b[2J \u{e0041}";
        let text = to_script_text(&vec![hostile]);
        for bad in ["<", ">", "&", "\u{202e}", "\u{2066}", "\u{2028}", "\x1b", "\u{e0041}"] {
            assert!(!text.contains(bad), "{bad:?} in {text}");
        }
        assert!(text.contains("\\u003c/script\\u003e"));
        // Still the same JSON.
        let back: Vec<String> = serde_json::from_str(&text).unwrap();
        assert_eq!(back, vec![hostile.to_string()]);
    }
}
