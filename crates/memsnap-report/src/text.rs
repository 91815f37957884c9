//! Text helpers shared by every renderer: escaping, byte and number formats, stable hashes and
//! colours, and a width estimate for laying text out in SVG (which cannot wrap or measure).

use std::fmt::Write as _;

/// Escape text for XML and HTML (element content and double- or single-quoted attributes).
/// Characters XML 1.0 forbids (most control characters, lone `U+FFFE`/`U+FFFF`) become
/// `U+FFFD`, so text from a snapshot can never make the document ill-formed; so do DEL and the
/// C1 controls (XML discourages them, and a terminal shown the page would obey them). Bidi
/// controls and other invisible format characters ([`memsnap_model::is_display_unsafe`])
/// become character references: a browser shows the same text, a terminal gets no raw control.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            '\t' | '\n' => out.push(c),
            '\r' => out.push_str("&#13;"),
            c if (c as u32) < 0x20 || ('\x7f'..='\u{9f}').contains(&c) || c == '\u{FFFE}' || c == '\u{FFFF}' => {
                out.push('\u{FFFD}')
            }
            c if memsnap_model::is_display_unsafe(c) => {
                let _ = write!(out, "&#x{:X};", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}

/// `1.92 GiB`, `512 B`: [`memsnap_model::format_bytes`] at the one precision of every output (two
/// decimals, as `torch.cuda.memory_summary()`). The crate's only byte formatter, kept as a
/// wrapper because every renderer prints sizes (some fifty call sites), so none can pick another
/// precision.
pub fn fmt_bytes(b: u64) -> String {
    memsnap_model::format_bytes(b, 2)
}

/// `1,234,567`.
pub fn fmt_count(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    // Digits before the first comma: 1–3.
    let head = (s.len() - 1) % 3 + 1;
    out.push_str(&s[..head]);
    for group in s.as_bytes()[head..].chunks(3) {
        out.push(',');
        out.push_str(std::str::from_utf8(group).unwrap_or(""));
    }
    out
}

/// Percentage with one decimal, `0.0` when the whole is zero.
pub fn pct(part: u64, whole: u64) -> String {
    if whole == 0 {
        "0.0".into()
    } else {
        format!("{:.1}", part as f64 * 100.0 / whole as f64)
    }
}

/// A duration in seconds, readable: `850 ms`, `12.4 s`, `3 min 20 s`.
pub fn fmt_seconds(s: f64) -> String {
    if s < 1.0 {
        format!("{:.0} ms", s * 1000.0)
    } else if s < 120.0 {
        format!("{s:.1} s")
    } else {
        let m = (s / 60.0).floor();
        format!("{m:.0} min {:.0} s", s - m * 60.0)
    }
}

/// FNV-1a: a stable hash (the same on every machine, build and run), for colours.
pub fn fnv1a(s: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// `#rrggbb` from hue (degrees), saturation and lightness (0–1).
pub fn hsl(h: f64, s: f64, l: f64) -> String {
    let c = (1.0 - (2.0 * l - 1.0).abs()) * s;
    let hp = (h.rem_euclid(360.0)) / 60.0;
    let x = c * (1.0 - (hp % 2.0 - 1.0).abs());
    let (r, g, b) = match hp as u32 {
        0 => (c, x, 0.0),
        1 => (x, c, 0.0),
        2 => (0.0, c, x),
        3 => (0.0, x, c),
        4 => (x, 0.0, c),
        _ => (c, 0.0, x),
    };
    let m = l - c / 2.0;
    let to = |v: f64| ((v + m) * 255.0).round().clamp(0.0, 255.0) as u8;
    format!("#{:02x}{:02x}{:02x}", to(r), to(g), to(b))
}

/// Estimated width in pixels of `s` in a sans-serif font of `size` px. SVG text cannot be
/// measured without a renderer, so the widths are DejaVu Sans's (what Linux browsers fall back
/// to, and wider than Helvetica, Segoe UI or Roboto): text laid out with them may end a little
/// early elsewhere, but does not overflow.
pub fn text_width(s: &str, size: f64) -> f64 {
    s.chars().map(|c| char_em(c) * size).sum()
}

/// Advance widths of printable ASCII (from `' '` to `'~'`) in DejaVu Sans, in em.
const ASCII_EM: [f32; 95] = [
    0.3185, 0.401, 0.460, 0.838, 0.636, 0.950, 0.780, 0.275, 0.390, 0.390, 0.500, 0.838, 0.3185, 0.361, 0.3185,
    0.337, // ␠!"#$%&'()*+,-./
    0.636, 0.636, 0.636, 0.636, 0.636, 0.636, 0.636, 0.636, 0.636, 0.636, 0.337, 0.337, 0.838, 0.838, 0.838,
    0.531, // 0-9:;<=>?
    1.000, 0.709, 0.686, 0.698, 0.770, 0.632, 0.575, 0.775, 0.752, 0.295, 0.295, 0.656, 0.557, 0.863, 0.748,
    0.787, // @A-O
    0.603, 0.787, 0.695, 0.635, 0.611, 0.732, 0.684, 0.989, 0.685, 0.611, 0.685, 0.390, 0.337, 0.390, 0.838,
    0.500, // P-Z[\]^_
    0.500, 0.613, 0.635, 0.550, 0.635, 0.615, 0.352, 0.635, 0.634, 0.278, 0.278, 0.579, 0.278, 0.974, 0.634,
    0.612, // `a-o
    0.635, 0.635, 0.411, 0.521, 0.392, 0.634, 0.592, 0.818, 0.592, 0.592, 0.525, 0.636, 0.337, 0.636,
    0.838, // p-z{|}~
];

fn char_em(c: char) -> f64 {
    match c {
        ' '..='~' => ASCII_EM[c as usize - 0x20] as f64,
        '·' => 0.3185,
        '…' | '—' | '×' | '∝' | '−' => 1.0,
        // CJK and other wide characters.
        c if (c as u32) >= 0x1100 => 1.0,
        _ => 0.7,
    }
}

/// `s` cut to fit `px` at `size`, ending with `…` when cut; empty when not even one character
/// and the ellipsis fit.
pub fn fit(s: &str, px: f64, size: f64) -> String {
    if text_width(s, size) <= px {
        return s.to_string();
    }
    let budget = px - char_em('…') * size;
    let mut w = 0.0;
    let mut out = String::new();
    for c in s.chars() {
        w += char_em(c) * size;
        if w > budget {
            break;
        }
        out.push(c);
    }
    if out.is_empty() {
        return String::new();
    }
    out.push('…');
    out
}

/// `s` cut to fit `px` in a monospace font of `size` px (DejaVu Sans Mono: 0.602 em a character).
pub fn fit_mono(s: &str, px: f64, size: f64) -> String {
    let max = (px / (0.61 * size)).floor().max(0.0) as usize;
    let n = s.chars().count();
    if n <= max {
        return s.to_string();
    }
    if max < 2 {
        return String::new();
    }
    let mut out: String = s.chars().take(max - 1).collect();
    out.push('…');
    out
}

/// Greedy word wrap to lines no wider than `px` (a word longer than a line is cut with `fit`).
pub fn wrap(s: &str, px: f64, size: f64) -> Vec<String> {
    wrap_with(s, px, px, size)
}

/// Word wrap where the first line is `first_px` wide and the others `px`.
pub fn wrap_with(s: &str, first_px: f64, px: f64, size: f64) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    let width = |lines: &Vec<String>| if lines.is_empty() { first_px } else { px };
    for para in s.split('\n') {
        let mut line = String::new();
        for word in para.split(' ').filter(|w| !w.is_empty()) {
            let candidate = if line.is_empty() { word.to_string() } else { format!("{line} {word}") };
            if text_width(&candidate, size) <= width(&lines) {
                line = candidate;
            } else {
                if !line.is_empty() {
                    lines.push(std::mem::take(&mut line));
                }
                let w = width(&lines);
                line = if text_width(word, size) <= w { word.to_string() } else { fit(word, w, size) };
            }
        }
        lines.push(line);
    }
    lines
}

/// The font stack of every figure.
pub const FONT: &str = "system-ui, -apple-system, 'Segoe UI', Roboto, Helvetica, Arial, sans-serif";

/// Open a standalone figure: the `<svg>` element, tagged with `class`, and its white background.
pub fn open_figure(s: &mut String, width: f64, height: f64, class: &str) {
    let (w, h) = (num(width), num(height));
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="{FONT}" class="{class}">"#
    );
    let _ = writeln!(s, r##"<rect x="0" y="0" width="{w}" height="{h}" fill="#ffffff"/>"##);
}

/// A number for an SVG attribute: at most two decimals, no trailing zeros, never `-0`.
pub fn num(v: f64) -> String {
    let r = (v * 100.0).round() / 100.0;
    let r = if r == 0.0 { 0.0 } else { r };
    let mut s = String::new();
    let _ = write!(s, "{r:.2}");
    while s.ends_with('0') {
        s.pop();
    }
    if s.ends_with('.') {
        s.pop();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup_and_control_characters() {
        assert_eq!(escape("<module> & \"x\" 'y'\u{1}"), "&lt;module&gt; &amp; &quot;x&quot; &#39;y&#39;\u{FFFD}");
        assert_eq!(escape("a\x7fb\u{9b}c\u{a0}"), "a\u{FFFD}b\u{FFFD}c\u{a0}");
        assert_eq!(escape("\u{202e}evil\u{2066}\u{200b}"), "&#x202E;evil&#x2066;&#x200B;");
    }

    #[test]
    fn formats() {
        assert_eq!(fmt_bytes(512), "512 B");
        assert_eq!(fmt_bytes(2057739264), "1.92 GiB");
        assert_eq!(fmt_count(1234567), "1,234,567");
        assert_eq!(num(1.0), "1");
        assert_eq!(num(-0.001), "0");
        assert_eq!(num(2.345), "2.35");
        assert_eq!(hsl(0.0, 1.0, 0.5), "#ff0000");
    }

    #[test]
    fn wraps_and_fits() {
        let lines = wrap("aaa bbb ccc ddd", text_width("aaa bbb", 10.0) + 0.1, 10.0);
        assert_eq!(lines, vec!["aaa bbb", "ccc ddd"]);
        assert!(fit("a long label that does not fit", 40.0, 10.0).ends_with('…'));
        assert_eq!(fit("abcdef", 1.0, 10.0), "");
    }
}
