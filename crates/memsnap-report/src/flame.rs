//! Flamegraphs of live memory: folded-stack text and an SVG icicle chart.
//!
//! The renderer is our own rather than `inferno`'s: inferno's SVG embeds JavaScript for zoom and
//! search and sizes its text with its own font metrics, while the report must read with scripts
//! disabled, use only `<title>` for hover details, mark the user's frames in their own colours,
//! and be byte-identical everywhere. An icicle (root on top, callees below) from folded stacks is
//! a short tree walk; the folded text we emit is the standard format, so inferno,
//! `flamegraph.pl` and speedscope can still draw it.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::text::{escape, fit, fmt_bytes, fmt_count, fnv1a, hsl, num, open_figure, pct};

/// Folded stacks as text: one `outer;…;inner BYTES` line per distinct stack, in the given order
/// (memsnap sorts them by path), bytes as the sample count. Frame names are untrusted text:
/// control and bidi characters in them are written as visible escapes
/// ([`memsnap_model::printable`]), so every line stays one line and a terminal showing it is
/// not driven by the file.
pub fn folded_text(folded: &[(String, u64)]) -> String {
    let mut s = String::new();
    for (path, bytes) in folded {
        let _ = writeln!(s, "{} {bytes}", memsnap_model::printable(path));
    }
    s
}

/// How an SVG flamegraph looks.
#[derive(Clone, Debug)]
pub struct FlameOptions {
    /// Total width in pixels.
    pub width: f64,
    /// Heading drawn above the chart (empty: none).
    pub title: String,
    /// A line under the heading (empty: none).
    pub subtitle: String,
    /// Label of the root bar.
    pub root_label: String,
    pub frame_height: f64,
    pub font_size: f64,
    /// Frames narrower than this (pixels) are not drawn (their bytes still count above).
    pub min_width: f64,
    /// Frames deeper than this are not drawn (the chart says how many were left out).
    pub max_depth: usize,
}

/// How deep a default chart draws stacks: Python's default recursion limit, so a real
/// program's stacks (tens of frames, a few hundred with C++ frames) are drawn whole, while a
/// file's made-up stack of 100 000 frames does not make an SVG of 100 000 rows.
pub const MAX_DRAWN_DEPTH: usize = 1000;

impl Default for FlameOptions {
    fn default() -> Self {
        FlameOptions {
            width: 1160.0,
            title: String::new(),
            subtitle: String::new(),
            root_label: "all live memory".into(),
            frame_height: 17.0,
            font_size: 11.0,
            min_width: 0.5,
            max_depth: MAX_DRAWN_DEPTH,
        }
    }
}

/// Which colour family a frame belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameClass {
    /// The user's own code (folded label starts with `*`).
    User,
    /// Python frames of libraries and the standard library.
    Library,
    /// C++ frames (`stacks="all"`).
    Native,
    /// Frames memsnap adds: `[autograd engine]`, `[allocated before the trace]`, ….
    Synthetic,
    Root,
}

/// Classify a folded-stack frame label (`*` marks user frames, `[…]` memsnap's own).
pub fn classify(label: &str) -> FrameClass {
    if label.starts_with('*') {
        return FrameClass::User;
    }
    if label.starts_with('[') {
        return FrameClass::Synthetic;
    }
    // `name (file:line)`: look at the file.
    let file = label.rfind(" (").map_or("", |i| label[i + 2..].trim_end_matches(')'));
    let file = file.rsplit_once(':').map_or(file, |(f, _)| f);
    let native = file.is_empty()
        || file == "??"
        || [".cpp", ".h", ".cu", ".cc", ".hpp", ".cuh"].iter().any(|e| file.ends_with(e))
        || file.contains(".so");
    if native {
        FrameClass::Native
    } else {
        FrameClass::Library
    }
}

/// The fill colour of a frame: the family sets the hue range, a hash of the label picks within
/// it, so the same frame has the same colour in every report.
pub fn frame_color(label: &str) -> String {
    let class = classify(label);
    let h = fnv1a(label.trim_start_matches('*'));
    let a = (h & 0xffff) as f64 / 65535.0;
    let b = ((h >> 16) & 0xffff) as f64 / 65535.0;
    match class {
        // Warm and saturated: the user's code stands out.
        FrameClass::User => hsl(8.0 + 32.0 * a, 0.82, 0.56 + 0.08 * b),
        // Cool and muted: the libraries recede.
        FrameClass::Library => hsl(195.0 + 30.0 * a, 0.32, 0.76 + 0.07 * b),
        FrameClass::Native => hsl(95.0 + 30.0 * a, 0.18, 0.76 + 0.06 * b),
        FrameClass::Synthetic => hsl(265.0 + 20.0 * a, 0.30, 0.78 + 0.05 * b),
        FrameClass::Root => "#d6d6d6".into(),
    }
}

struct Node {
    name: String,
    bytes: u64,
    children: BTreeMap<String, usize>,
}

/// A tree of frames from folded stacks; node 0 is the root.
struct Tree {
    nodes: Vec<Node>,
}

impl Tree {
    fn build(folded: &[(String, u64)]) -> Tree {
        let mut nodes = vec![Node { name: String::new(), bytes: 0, children: BTreeMap::new() }];
        for (path, bytes) in folded {
            nodes[0].bytes += bytes;
            let mut at = 0;
            let frames: Vec<&str> = if path.is_empty() { vec!["[unknown]"] } else { path.split(';').collect() };
            for f in frames {
                let next = match nodes[at].children.get(f) {
                    Some(&n) => n,
                    None => {
                        let n = nodes.len();
                        nodes.push(Node { name: f.to_string(), bytes: 0, children: BTreeMap::new() });
                        nodes[at].children.insert(f.to_string(), n);
                        n
                    }
                };
                nodes[next].bytes += bytes;
                at = next;
            }
        }
        Tree { nodes }
    }

    /// Children by bytes (descending), ties by name: the heaviest callee first, always in the
    /// same order.
    fn sorted_children(&self, n: usize) -> Vec<usize> {
        let mut c: Vec<usize> = self.nodes[n].children.values().copied().collect();
        c.sort_by(|&a, &b| {
            self.nodes[b].bytes.cmp(&self.nodes[a].bytes).then_with(|| self.nodes[a].name.cmp(&self.nodes[b].name))
        });
        c
    }
}

/// A frame placed on the canvas.
struct Placed {
    node: usize,
    depth: usize,
    x: f64,
    w: f64,
}

/// Render folded stacks as an icicle SVG (a complete `<svg>` element with `xmlns`).
pub fn flamegraph_svg(folded: &[(String, u64)], opts: &FlameOptions) -> String {
    render(folded, opts).0
}

/// The SVG and its height.
pub(crate) fn render(folded: &[(String, u64)], opts: &FlameOptions) -> (String, f64) {
    let tree = Tree::build(folded);
    let total = tree.nodes[0].bytes;
    let pad = 10.0;
    let chart_w = opts.width - 2.0 * pad;

    // Place frames breadth-agnostic with an explicit stack (stacks can be hundreds deep).
    let mut placed: Vec<Placed> = Vec::new();
    let mut todo: Vec<Placed> = vec![Placed { node: 0, depth: 0, x: pad, w: chart_w }];
    // Frames below the deepest drawn row that would have been drawn.
    let mut cut = 0u64;
    while let Some(p) = todo.pop() {
        if p.depth >= opts.max_depth {
            cut += below(&tree, p.node, chart_w, total, opts.min_width);
            placed.push(p);
            continue;
        }
        let mut x = p.x;
        let mut kids = Vec::new();
        for c in tree.sorted_children(p.node) {
            let w = if total == 0 { 0.0 } else { chart_w * tree.nodes[c].bytes as f64 / total as f64 };
            if w >= opts.min_width {
                kids.push(Placed { node: c, depth: p.depth + 1, x, w });
            }
            x += w;
        }
        placed.push(p);
        // Reverse so the heaviest child is placed (and written) first.
        todo.extend(kids.into_iter().rev());
    }
    let max_depth = placed.iter().map(|p| p.depth).max().unwrap_or(0);

    let mut subtitle_text = opts.subtitle.clone();
    if cut > 0 {
        let note = format!(
            "Stacks are drawn {} frames deep: {} deeper {} not drawn (the folded text has them all).",
            opts.max_depth,
            fmt_count(cut),
            memsnap_model::agree(cut, "frame is", "frames are")
        );
        subtitle_text = if subtitle_text.is_empty() { note } else { format!("{subtitle_text} {note}") };
    }
    let subtitle = if subtitle_text.is_empty() {
        Vec::new()
    } else {
        crate::text::wrap(&subtitle_text, opts.width - 2.0 * pad, 12.0)
    };
    let mut head = 0.0;
    if !opts.title.is_empty() {
        head += 24.0;
    }
    head += 18.0 * subtitle.len() as f64;
    let legend_h = 22.0;
    let top = head + legend_h;
    let height = top + (max_depth + 1) as f64 * opts.frame_height + pad;

    let mut s = String::new();
    open_figure(&mut s, opts.width, height, "flamegraph");
    let mut y = 0.0;
    if !opts.title.is_empty() {
        y += 18.0;
        let _ = writeln!(
            s,
            r##"<text x="{pad}" y="{}" font-size="15" font-weight="600" fill="#1a1a1a">{}</text>"##,
            num(y),
            escape(&opts.title)
        );
        y += 6.0;
    }
    for line in &subtitle {
        y += 14.0;
        let _ =
            writeln!(s, r##"<text x="{pad}" y="{}" font-size="12" fill="#444444">{}</text>"##, num(y), escape(line));
        y += 4.0;
    }
    // Legend.
    let mut lx = pad;
    let ly = y + 6.0;
    for (label, sample) in [
        ("your code", "*x"),
        ("libraries (torch, Python)", "x (torch/nn/functional.py:1)"),
        ("native (C++)", "x (??:0)"),
        ("added by memsnap", "[x]"),
    ] {
        let _ = writeln!(
            s,
            r##"<rect x="{}" y="{}" width="12" height="12" fill="{}" stroke="#888888" stroke-width="0.5"/><text x="{}" y="{}" font-size="11" fill="#333333">{}</text>"##,
            num(lx),
            num(ly),
            frame_color(sample),
            num(lx + 16.0),
            num(ly + 10.0),
            escape(label)
        );
        lx += 16.0 + crate::text::text_width(label, 11.0) + 18.0;
    }
    let _ = writeln!(
        s,
        r##"<text x="{}" y="{}" font-size="11" fill="#666666" text-anchor="end">width = bytes; hover a frame for details</text>"##,
        num(opts.width - pad),
        num(ly + 10.0)
    );

    for p in &placed {
        let node = &tree.nodes[p.node];
        let (label, class) = if p.node == 0 {
            (format!("{}: {}", opts.root_label, fmt_bytes(total)), FrameClass::Root)
        } else {
            (node.name.trim_start_matches('*').to_string(), classify(&node.name))
        };
        let fill = if p.node == 0 { frame_color_root() } else { frame_color(&node.name) };
        let y = top + p.depth as f64 * opts.frame_height;
        let who = match class {
            FrameClass::User => "\nyour code",
            FrameClass::Library => "\nlibrary",
            FrameClass::Native => "\nnative",
            FrameClass::Synthetic => "\nadded by memsnap (no such frame in the file)",
            FrameClass::Root => "",
        };
        let title = format!(
            "{label}\n{} ({} bytes), {}% of live memory{who}",
            fmt_bytes(node.bytes),
            fmt_count(node.bytes),
            pct(node.bytes, total)
        );
        let stroke = if class == FrameClass::User {
            r##" stroke="#8a2a0a" stroke-width="0.6""##
        } else {
            r##" stroke="#ffffff" stroke-width="0.5""##
        };
        let _ = write!(
            s,
            r#"<g><title>{}</title><rect x="{}" y="{}" width="{}" height="{}" fill="{}"{stroke}/>"#,
            escape(&title),
            num(p.x),
            num(y),
            num(p.w),
            num(opts.frame_height - 1.0),
            fill
        );
        // Bold text is wider than the estimate assumes.
        let size = if class == FrameClass::User { opts.font_size * 1.1 } else { opts.font_size };
        let text = fit(&label, p.w - 6.0, size);
        if !text.is_empty() {
            let weight = if class == FrameClass::User { r#" font-weight="600""# } else { "" };
            let _ = write!(
                s,
                r##"<text x="{}" y="{}" font-size="{}" fill="#111111"{weight}>{}</text>"##,
                num(p.x + 3.0),
                num(y + opts.frame_height - 5.0),
                num(opts.font_size),
                escape(&text)
            );
        }
        s.push_str("</g>\n");
    }
    s.push_str("</svg>\n");
    (s, height)
}

/// Frames under `node` that are wide enough to draw: what a chart cut at `node`'s row leaves out.
fn below(tree: &Tree, node: usize, chart_w: f64, total: u64, min_width: f64) -> u64 {
    let mut n = 0;
    let mut todo = vec![node];
    while let Some(at) = todo.pop() {
        for &c in tree.nodes[at].children.values() {
            let w = if total == 0 { 0.0 } else { chart_w * tree.nodes[c].bytes as f64 / total as f64 };
            if w >= min_width {
                n += 1;
                todo.push(c);
            }
        }
    }
    n
}

fn frame_color_root() -> String {
    "#d6d6d6".into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes() {
        assert_eq!(classify("*<module> (train.py:3)"), FrameClass::User);
        assert_eq!(classify("forward (torch/nn/modules/linear.py:134)"), FrameClass::Library);
        assert_eq!(classify("at::empty (??:0)"), FrameClass::Native);
        assert_eq!(classify("[autograd engine]"), FrameClass::Synthetic);
    }

    #[test]
    fn tree_sums_and_orders() {
        let folded = vec![("a;b".to_string(), 10), ("a;c".to_string(), 30), ("d".to_string(), 5)];
        let t = Tree::build(&folded);
        assert_eq!(t.nodes[0].bytes, 45);
        let kids: Vec<&str> = t.sorted_children(0).iter().map(|&n| t.nodes[n].name.as_str()).collect();
        assert_eq!(kids, ["a", "d"]);
        let a = t.nodes[0].children["a"];
        let kids: Vec<&str> = t.sorted_children(a).iter().map(|&n| t.nodes[n].name.as_str()).collect();
        assert_eq!(kids, ["c", "b"]);
    }

    #[test]
    fn deep_stacks_are_cut_and_the_chart_says_so() {
        let deep: Vec<String> = (0..30).map(|k| format!("f{k}")).collect();
        let folded = vec![(deep.join(";"), 100), ("a;b".to_string(), 100)];
        let opts = FlameOptions { max_depth: 10, ..FlameOptions::default() };
        let svg = flamegraph_svg(&folded, &opts);
        // Rows 1..=10 of the deep stack (f0..f9) are drawn, f10..f29 are not.
        assert!(svg.contains(">f9<") && !svg.contains(">f10<"), "{svg}");
        assert!(svg.contains("Stacks are drawn 10 frames deep: 20 deeper frames are not drawn"), "{svg}");
        let whole = flamegraph_svg(&folded, &FlameOptions::default());
        assert!(whole.contains(">f29<") && !whole.contains("deeper"), "{whole}");
    }

    #[test]
    fn svg_escapes_frame_names() {
        let folded = vec![("*<module> (t.py:1);x & y (torch/a.py:2)".to_string(), 100)];
        let svg = flamegraph_svg(&folded, &FlameOptions::default());
        assert!(svg.contains("&lt;module&gt;"));
        assert!(svg.contains("x &amp; y"));
        assert!(!svg.contains("<module>"));
    }
}
