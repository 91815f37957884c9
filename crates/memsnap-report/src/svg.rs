//! The report as one SVG image, for places that accept only images. Same content as the HTML
//! page; SVG cannot wrap text, so paragraphs are wrapped here with a conservative width
//! estimate, and the figures are placed one under the other.

use std::fmt::Write as _;

use crate::text::{escape, fit, fit_mono, fmt_bytes, fmt_count, num, pct, text_width, FONT};
use crate::{Figure, Report, SuspectView};

const MONO: &str = "ui-monospace, SFMono-Regular, Menlo, Consolas, monospace";

/// How a run of text looks.
#[derive(Clone, Copy)]
struct Style<'a> {
    size: f64,
    fill: &'a str,
    weight: &'a str,
    family: &'a str,
}

fn st<'a>(size: f64, fill: &'a str, weight: &'a str, family: &'a str) -> Style<'a> {
    Style { size, fill, weight, family }
}

/// A page laid out top to bottom.
struct Doc {
    body: String,
    y: f64,
    /// Left edge and usable width of the content.
    x: f64,
    w: f64,
}

impl Doc {
    fn gap(&mut self, h: f64) {
        self.y += h;
    }

    fn text(&mut self, x: f64, style: Style<'_>, text: &str, title: Option<&str>) {
        let t = title.map_or(String::new(), |t| format!("<title>{}</title>", escape(t)));
        let fam = if style.family == FONT { String::new() } else { format!(" font-family=\"{}\"", style.family) };
        let wt = if style.weight.is_empty() { String::new() } else { format!(" font-weight=\"{}\"", style.weight) };
        let _ = writeln!(
            self.body,
            r#"<text x="{}" y="{}" font-size="{}" fill="{}"{wt}{fam}>{t}{}</text>"#,
            num(x),
            num(self.y + style.size),
            num(style.size),
            style.fill,
            escape(text)
        );
    }

    fn line(&mut self, size: f64, fill: &str, weight: &str, text: &str) {
        self.text(self.x, st(size, fill, weight, FONT), text, None);
        self.y += size * 1.45;
    }

    /// A wrapped paragraph, optionally with a bold lead-in on the first line.
    fn para(&mut self, indent: f64, size: f64, fill: &str, lead: &str, text: &str) {
        let lead_w = if lead.is_empty() { 0.0 } else { text_width(lead, size) * 1.1 + size * 0.3 };
        let width = self.w - indent;
        let lines = crate::text::wrap_with(text, width - lead_w, width, size);
        if !lead.is_empty() {
            self.text(self.x + indent, st(size, fill, "700", FONT), lead, None);
        }
        for (j, l) in lines.iter().enumerate() {
            let x = if j == 0 { self.x + indent + lead_w } else { self.x + indent };
            self.text(x, st(size, fill, "", FONT), l, None);
            self.y += size * 1.45;
        }
    }

    fn figure(&mut self, f: &Figure) {
        let _ = writeln!(
            self.body,
            r##"<rect x="{}" y="{}" width="{}" height="{}" fill="#ffffff" stroke="#e3e5e8" rx="6"/>"##,
            num(self.x - 8.0),
            num(self.y - 6.0),
            num(f.width + 16.0),
            num(f.height + 12.0)
        );
        let _ = writeln!(self.body, r#"<g transform="translate({},{})">"#, num(self.x), num(self.y));
        self.body.push_str(&f.svg);
        self.body.push_str("</g>\n");
        self.y += f.height + 20.0;
    }
}

pub fn render(r: &Report) -> String {
    let margin = 20.0;
    let width = r.width + 2.0 * margin;
    let mut d = Doc { body: String::new(), y: 16.0, x: margin, w: r.width };

    d.line(22.0, "#1a1a1a", "650", &format!("Memory report: {}", r.file_name));
    d.line(13.0, "#5b6068", "", &r.subtitle);
    d.gap(8.0);

    // Verdict.
    let top = d.y;
    d.gap(10.0);
    let body_start = d.body.len();
    d.x += 16.0;
    d.w -= 32.0;
    if r.suspects.is_empty() {
        d.line(18.0, "#1a1a1a", "650", "Verdict: no suspects");
        d.para(0.0, 13.0, "#1a1a1a", "", "No leak, fragmentation or out-of-memory event was found. The peak below is what the program needs; see what it is made of to make it smaller.");
    } else {
        d.line(
            18.0,
            "#1a1a1a",
            "650",
            &format!("Verdict: {} suspect{}", r.suspects.len(), if r.suspects.len() == 1 { "" } else { "s" }),
        );
        for sp in &r.suspects {
            suspect(&mut d, sp, r.devices.len() > 1);
        }
    }
    d.x -= 16.0;
    d.w += 32.0;
    let verdict_body = d.body.split_off(body_start);
    let colour = if r.suspects.is_empty() { "#2e7d32" } else { "#b3261e" };
    let _ = writeln!(
        d.body,
        r##"<rect x="{}" y="{}" width="{}" height="{}" fill="#ffffff" stroke="#e3e5e8" rx="6"/><rect x="{}" y="{}" width="6" height="{}" fill="{colour}"/>"##,
        num(margin - 8.0),
        num(top),
        num(r.width + 16.0),
        num(d.y - top + 4.0),
        num(margin - 8.0),
        num(top),
        num(d.y - top + 4.0)
    );
    d.body.push_str(&verdict_body);
    d.gap(18.0);

    for dev in &r.devices {
        d.line(18.0, "#1a1a1a", "650", &format!("Device {}", dev.device));
        // Facts as a grid of four columns.
        let cols = 4;
        let cw = (r.width + 16.0 + 10.0) / cols as f64;
        for chunk in dev.facts.chunks(cols) {
            for (j, (k, v, title)) in chunk.iter().enumerate() {
                let x = margin - 8.0 + j as f64 * cw;
                let _ = writeln!(
                    d.body,
                    r##"<g><title>{}</title><rect x="{}" y="{}" width="{}" height="42" fill="#ffffff" stroke="#e3e5e8" rx="6"/></g>"##,
                    escape(title),
                    num(x),
                    num(d.y),
                    num(cw - 10.0)
                );
                d.text(x + 10.0, st(10.5, "#5b6068", "", FONT), &k.to_uppercase(), None);
                let save = d.y;
                d.y += 15.0;
                d.text(x + 10.0, st(15.0, "#1a1a1a", "600", FONT), &fit(v, cw - 28.0, 15.0), None);
                d.y = save;
            }
            d.gap(50.0);
        }
        d.gap(10.0);
        match &dev.timeline {
            Some(f) => d.figure(f),
            None => d.line(
                13.0,
                "#1a1a1a",
                "",
                "No trace for this device: there is no timeline, only the state at dump time.",
            ),
        }
        d.figure(&dev.categories);

        // Sites table.
        let top = d.y;
        let start = d.body.len();
        d.gap(8.0);
        d.line(15.0, "#1a1a1a", "650", "Who holds the peak: allocated bytes by the user's line");
        let (c_bytes, c_share, c_blocks) = (r.width - 300.0, r.width - 150.0, r.width - 20.0);
        let header = |d: &mut Doc| {
            d.text(d.x, st(11.0, "#5b6068", "600", FONT), "SITE (INNERMOST FRAME OF YOUR CODE)", None);
            for (x, t) in [(c_bytes, "BYTES"), (c_share, "SHARE"), (c_blocks, "BLOCKS")] {
                let _ = writeln!(
                    d.body,
                    r##"<text x="{}" y="{}" font-size="11" fill="#5b6068" font-weight="600" text-anchor="end">{t}</text>"##,
                    num(d.x + x),
                    num(d.y + 11.0)
                );
            }
            d.y += 18.0;
        };
        header(&mut d);
        let max = dev.sites.first().map_or(1, |x| x.bytes.max(1));
        let mut rows: Vec<(String, String, u64, String, String, String)> = dev
            .sites
            .iter()
            .map(|s| {
                (
                    s.label.clone(),
                    s.full.clone(),
                    s.bytes,
                    fmt_bytes(s.bytes),
                    format!("{}%", pct(s.bytes, dev.peak_allocated)),
                    fmt_count(s.blocks),
                )
            })
            .collect();
        if let Some((n, bytes, blocks)) = dev.sites_rest {
            rows.push((
                format!("{} more sites", fmt_count(n as u64)),
                String::new(),
                0,
                fmt_bytes(bytes),
                format!("{}%", pct(bytes, dev.peak_allocated)),
                fmt_count(blocks),
            ));
        }
        for (label, full, bytes, b, share, blocks) in rows {
            let title = if full.is_empty() { None } else { Some(full.as_str()) };
            d.text(d.x, st(12.5, "#1a1a1a", "", MONO), &fit_mono(&label, c_bytes - 240.0, 12.5), title);
            if bytes > 0 {
                let bw = (110.0 * bytes as f64 / max as f64).max(1.0);
                let _ = writeln!(
                    d.body,
                    r##"<rect x="{}" y="{}" width="{}" height="9" fill="#3b6fb6" rx="2"/>"##,
                    num(d.x + c_bytes - 115.0),
                    num(d.y + 4.0),
                    num(bw)
                );
            }
            for (x, t) in [(c_bytes - 122.0, b.as_str()), (c_share, share.as_str()), (c_blocks, blocks.as_str())] {
                let _ = writeln!(
                    d.body,
                    r##"<text x="{}" y="{}" font-size="12.5" fill="#1a1a1a" text-anchor="end">{}</text>"##,
                    num(d.x + x),
                    num(d.y + 12.5),
                    escape(t)
                );
            }
            d.y += 12.5 * 1.55;
        }
        let table = d.body.split_off(start);
        let _ = writeln!(
            d.body,
            r##"<rect x="{}" y="{}" width="{}" height="{}" fill="#ffffff" stroke="#e3e5e8" rx="6"/>"##,
            num(margin - 8.0),
            num(top - 6.0),
            num(r.width + 16.0),
            num(d.y - top + 12.0)
        );
        d.body.push_str(&table);
        d.gap(26.0);

        d.figure(&dev.flamegraph);
        for f in &dev.segments {
            d.figure(f);
        }
        if !dev.cache.is_empty() {
            d.line(15.0, "#1a1a1a", "650", "The allocator's cache: reserved beyond the live tensors");
            for c in &dev.cache {
                d.para(14.0, 12.5, "#1a1a1a", "•", c);
            }
            d.gap(18.0);
        }
    }

    // Caveats.
    d.line(15.0, "#1a1a1a", "650", "Caveats");
    let mut any = false;
    for c in &r.file_caveats {
        any = true;
        d.para(14.0, 12.5, "#1a1a1a", "•", c);
    }
    for dev in &r.devices {
        for c in &dev.caveats {
            any = true;
            let text = if r.devices.len() > 1 { format!("device {}: {c}", dev.device) } else { c.clone() };
            d.para(14.0, 12.5, "#1a1a1a", "•", &text);
        }
    }
    if !any {
        d.para(0.0, 12.5, "#1a1a1a", "", "None: the trace covers the whole run, every allocation has a stack and the replay reproduces the dump exactly.");
    }
    d.gap(8.0);
    d.line(
        11.5,
        "#5b6068",
        "",
        &format!(
            "Made by memsnap {} from {}. Numbers are replayed from the allocator trace to the byte.",
            env!("CARGO_PKG_VERSION"),
            r.file_name
        ),
    );
    d.gap(6.0);

    let height = d.y;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="{FONT}">"#,
        w = num(width),
        h = num(height)
    );
    let _ = writeln!(s, "<title>memsnap report: {}</title>", escape(&r.file_name));
    let _ = writeln!(s, r##"<rect x="0" y="0" width="{}" height="{}" fill="#f4f5f7"/>"##, num(width), num(height));
    s.push_str(&d.body);
    s.push_str("</svg>\n");
    s
}

fn suspect(d: &mut Doc, sp: &SuspectView, multi: bool) {
    d.gap(8.0);
    let badge = if sp.is_leak || sp.kind == "oom" { "#b3261e" } else { "#a15c00" };
    let bw = text_width(&sp.kind, 13.0) * 1.2 + 16.0;
    let _ = writeln!(
        d.body,
        r#"<rect x="{}" y="{}" width="{}" height="20" rx="4" fill="{badge}"/>"#,
        num(d.x),
        num(d.y),
        num(bw)
    );
    d.y += 2.0;
    d.text(d.x + 8.0, st(13.0, "#ffffff", "700", FONT), &sp.kind, None);
    let conf = if multi {
        format!("{} · confidence {:.2} · device {}", sp.severity, sp.confidence, sp.device)
    } else {
        format!("{} · confidence {:.2}", sp.severity, sp.confidence)
    };
    d.text(d.x + bw + 8.0, st(13.0, "#5b6068", "", FONT), &conf, None);
    d.y += 24.0;
    match (&sp.site_short, &sp.site_full) {
        (Some(short), Some(full)) => {
            d.text(d.x, st(15.0, "#1a1a1a", "", FONT), "at", None);
            d.text(d.x + 20.0, st(15.0, "#7a2e00", "600", MONO), short, Some(full));
        }
        _ => d.text(d.x, st(15.0, "#1a1a1a", "", FONT), "no line of your code on the stack", None),
    }
    d.y += 15.0 * 1.5;
    let mut nums = Vec::new();
    if sp.kind == "oom" {
        nums.push(format!("{} at stake", fmt_bytes(sp.bytes)));
    } else if sp.is_leak {
        nums.push(format!("{} still allocated at the end of the trace", fmt_bytes(sp.bytes)));
    } else if sp.severity == "held" {
        nums.push(format!("{} held at the dump, growth not known (no trace)", fmt_bytes(sp.bytes)));
    } else if sp.severity == "peak" {
        nums.push(format!("{} held at once, released later", fmt_bytes(sp.bytes)));
    } else {
        nums.push(fmt_bytes(sp.bytes));
    }
    if let Some(g) = sp.growth_bytes_per_iteration {
        nums.push(format!("+{} per {}", fmt_bytes(g), sp.growth_unit));
    }
    if sp.bytes_at_peak > 0 {
        nums.push(format!("{} of it live at the peak", fmt_bytes(sp.bytes_at_peak)));
    }
    d.line(13.5, if sp.growth_bytes_per_iteration.is_some() { "#b3261e" } else { "#1a1a1a" }, "600", &nums.join(" · "));
    d.para(0.0, 13.0, "#1a1a1a", "Evidence.", &sp.evidence);
    d.para(0.0, 13.0, "#1a1a1a", "Fix.", &sp.advice);
    if !sp.stack.is_empty() {
        let shown = sp.stack.len().min(12);
        d.line(
            12.0,
            "#5b6068",
            "",
            &format!(
                "Allocation stack (innermost first, your code in bold{}):",
                if shown < sp.stack.len() { format!("; first {shown} of {}", sp.stack.len()) } else { String::new() }
            ),
        );
        for (f, user) in sp.stack.iter().take(shown) {
            let w = d.w - 16.0;
            let (fill, weight) = if *user { ("#7a2e00", "700") } else { ("#333333", "") };
            d.text(d.x + 16.0, st(11.5, fill, weight, MONO), &fit_mono(f, w, 11.5), Some(f));
            d.y += 11.5 * 1.45;
        }
    }
}
