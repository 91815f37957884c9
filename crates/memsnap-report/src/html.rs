//! The report as one self-contained HTML page: inline CSS and SVG, no scripts, no external
//! fonts or images. `<details>` folds long stacks without JavaScript.

use std::fmt::Write as _;

use crate::text::{escape, fmt_bytes, fmt_count, pct};
use crate::{Report, SuspectView};

const CSS: &str = r#"
:root{--fg:#1a1a1a;--muted:#5b6068;--line:#e3e5e8;--bad:#b3261e;--warn:#a15c00}
*{box-sizing:border-box}
body{margin:0;background:#f4f5f7;color:var(--fg);font:14px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif}
main{max-width:1220px;margin:0 auto;padding:18px 20px 40px}
h1{font-size:22px;margin:4px 0 2px;font-weight:650;word-break:break-all}
h2{font-size:18px;margin:26px 0 8px;font-weight:650}
h3{font-size:15px;margin:0 0 8px;font-weight:650}
.sub{color:var(--muted);margin:0 0 10px}
.card{background:#fff;border:1px solid var(--line);border-radius:8px;padding:14px 18px;margin:12px 0}
.fig{background:#fff;border:1px solid var(--line);border-radius:8px;padding:8px 10px;margin:12px 0;overflow-x:auto}
.fig svg{display:block;max-width:100%;height:auto}
.verdict.ok{border-left:6px solid #2e7d32}
.verdict.bad{border-left:6px solid var(--bad)}
.verdict h2{margin:0 0 6px}
.suspect{border-top:1px solid var(--line);padding:12px 0 6px}
.suspect:first-of-type{border-top:0}
.kind{display:inline-block;font-weight:700;color:#fff;background:var(--bad);border-radius:4px;padding:1px 8px;font-size:13px;letter-spacing:.2px}
.kind.other{background:var(--warn)}
.conf{color:var(--muted);font-size:13px;margin-left:6px}
.where{font-size:16px;margin:6px 0 2px}
.where code{font-size:15px;background:#fff4e5;border:1px solid #f3d9b1;border-radius:4px;padding:1px 6px;color:#7a2e00}
.nums{margin:4px 0}
.nums b{font-variant-numeric:tabular-nums}
.growth{color:var(--bad);font-weight:700}
.suspect p{margin:6px 0;max-width:1100px}
.label{font-weight:650}
code{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:13px}
details{margin:4px 0 2px}
summary{cursor:pointer;color:var(--muted)}
details li.user{color:#7a2e00;font-weight:700}
details ol{margin:4px 0;padding-left:26px;font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12.5px;color:#333}
.facts{display:grid;grid-template-columns:repeat(4,1fr);gap:8px 12px;margin:0}
.facts div{background:#fff;border:1px solid var(--line);border-radius:8px;padding:8px 12px}
.facts dt{color:var(--muted);font-size:12px;text-transform:uppercase;letter-spacing:.4px}
.facts dd{margin:0;font-size:16px;font-weight:600;font-variant-numeric:tabular-nums}
table{border-collapse:collapse;width:100%}
th,td{text-align:left;padding:4px 10px;border-bottom:1px solid #eef0f2;vertical-align:top}
th{color:var(--muted);font-weight:600;font-size:12px;text-transform:uppercase;letter-spacing:.4px}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
td.site{word-break:break-word}
.bar{display:inline-block;height:9px;background:#3b6fb6;border-radius:2px;vertical-align:middle}
ul.caveats{margin:4px 0;padding-left:22px}
ul.caveats li{margin:3px 0}
footer{color:var(--muted);font-size:12px;margin-top:24px}
"#;

pub fn render(r: &Report) -> String {
    let mut s = String::new();
    s.push_str("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n");
    s.push_str("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n");
    let _ = writeln!(s, "<title>memsnap report: {}</title>", escape(&r.file_name));
    let _ = writeln!(s, "<style>{CSS}</style>\n</head>\n<body>\n<main>");
    let _ = writeln!(s, "<h1>Memory report: {}</h1>", escape(&r.file_name));
    let _ = writeln!(s, "<p class=\"sub\">{}</p>", escape(&r.subtitle));

    verdict(&mut s, r);

    for d in &r.devices {
        let _ = writeln!(s, "<h2>Device {}</h2>", d.device);
        s.push_str("<dl class=\"facts\">\n");
        for (k, v, title) in &d.facts {
            let _ = writeln!(s, "<div title=\"{}\"><dt>{}</dt><dd>{}</dd></div>", escape(title), escape(k), escape(v));
        }
        s.push_str("</dl>\n");
        match &d.timeline {
            Some(f) => figure(&mut s, &f.svg),
            None => s.push_str("<div class=\"card\">No trace for this device: there is no timeline, only the state at dump time.</div>\n"),
        }
        figure(&mut s, &d.categories.svg);
        // Sites at the peak.
        s.push_str("<div class=\"card\">\n<h3>Who holds the peak: allocated bytes by the user's line</h3>\n");
        s.push_str("<table>\n<thead><tr><th>site (innermost frame of your code)</th><th class=\"num\">bytes</th><th class=\"num\">share</th><th class=\"num\">blocks</th></tr></thead>\n<tbody>\n");
        let max = d.sites.first().map_or(1, |x| x.bytes.max(1));
        for row in &d.sites {
            let w = (120.0 * row.bytes as f64 / max as f64).max(1.0);
            let _ = writeln!(
                s,
                "<tr><td class=\"site\" title=\"{}\"><code>{}</code></td><td class=\"num\" title=\"{} bytes\">{} <span class=\"bar\" style=\"width:{:.0}px\"></span></td><td class=\"num\">{}%</td><td class=\"num\">{}</td></tr>",
                escape(&row.full),
                escape(&row.label),
                fmt_count(row.bytes),
                fmt_bytes(row.bytes),
                w,
                pct(row.bytes, d.peak_allocated),
                fmt_count(row.blocks)
            );
        }
        if let Some((n, bytes, blocks)) = d.sites_rest {
            let _ = writeln!(
                s,
                "<tr><td class=\"site\">{} more sites</td><td class=\"num\">{}</td><td class=\"num\">{}%</td><td class=\"num\">{}</td></tr>",
                fmt_count(n as u64),
                fmt_bytes(bytes),
                pct(bytes, d.peak_allocated),
                fmt_count(blocks)
            );
        }
        s.push_str("</tbody>\n</table>\n</div>\n");
        for (kind, by) in &d.labels {
            let _ =
                writeln!(s, "<div class=\"card\">\n<h3>Who holds the peak: allocated bytes by {}</h3>", escape(kind));
            s.push_str("<table>\n<thead><tr><th>label</th><th class=\"num\">bytes</th><th class=\"num\">share</th></tr></thead>\n<tbody>\n");
            for (label, bytes) in by {
                let _ = writeln!(
                    s,
                    "<tr><td class=\"site\"><code>{}</code></td><td class=\"num\" title=\"{} bytes\">{}</td><td class=\"num\">{}%</td></tr>",
                    escape(label.as_deref().unwrap_or("(no label)")),
                    fmt_count(*bytes),
                    fmt_bytes(*bytes),
                    pct(*bytes, d.peak_allocated)
                );
            }
            s.push_str("</tbody>\n</table>\n</div>\n");
        }
        figure(&mut s, &d.flamegraph.svg);
        for f in &d.segments {
            figure(&mut s, &f.svg);
        }
        if !d.cache.is_empty() {
            s.push_str("<div class=\"card\">\n<h3>The allocator's cache: reserved beyond the live tensors</h3>\n<ul class=\"caveats\">\n");
            for line in &d.cache {
                let _ = writeln!(s, "<li>{}</li>", escape(line));
            }
            s.push_str("</ul>\n</div>\n");
        }
    }

    // Caveats.
    let any = !r.file_caveats.is_empty() || r.devices.iter().any(|d| !d.caveats.is_empty());
    s.push_str("<div class=\"card\">\n<h3>Caveats</h3>\n");
    if any {
        s.push_str("<ul class=\"caveats\">\n");
        for c in &r.file_caveats {
            let _ = writeln!(s, "<li>{}</li>", escape(c));
        }
        for d in &r.devices {
            for c in &d.caveats {
                let prefix = if r.devices.len() > 1 { format!("device {}: ", d.device) } else { String::new() };
                let _ = writeln!(s, "<li>{}{}</li>", escape(&prefix), escape(c));
            }
        }
        s.push_str("</ul>\n");
    } else {
        s.push_str("<p>None: the trace covers the whole run, every allocation has a stack and the replay reproduces the dump exactly.</p>\n");
    }
    s.push_str("</div>\n");
    let _ = writeln!(
        s,
        "<footer>Made by memsnap {} from {}. Numbers are replayed from the allocator trace to the byte; hover charts for details.</footer>",
        env!("CARGO_PKG_VERSION"),
        escape(&r.file_name)
    );
    s.push_str("</main>\n</body>\n</html>\n");
    s
}

fn figure(s: &mut String, svg: &str) {
    s.push_str("<div class=\"fig\">\n");
    s.push_str(svg);
    s.push_str("</div>\n");
}

fn verdict(s: &mut String, r: &Report) {
    let bad = !r.suspects.is_empty();
    let _ = writeln!(s, "<section class=\"card verdict {}\">", if bad { "bad" } else { "ok" });
    if !bad {
        s.push_str("<h2>Verdict: no suspects</h2>\n<p>No leak, fragmentation or out-of-memory event was found. The peak below is what the program needs; see what it is made of to make it smaller.</p>\n");
    } else {
        let _ = writeln!(
            s,
            "<h2>Verdict: {} suspect{}</h2>",
            r.suspects.len(),
            if r.suspects.len() == 1 { "" } else { "s" }
        );
        for sp in &r.suspects {
            suspect(s, sp, r.devices.len() > 1);
        }
    }
    s.push_str("</section>\n");
}

fn suspect(s: &mut String, sp: &SuspectView, multi: bool) {
    s.push_str("<div class=\"suspect\">\n");
    let _ = write!(
        s,
        "<div><span class=\"kind{}\">{}</span><span class=\"conf\">{} · confidence {:.2}",
        if sp.is_leak || sp.kind == "oom" { "" } else { " other" },
        escape(&sp.kind),
        escape(&sp.severity),
        sp.confidence
    );
    if multi {
        let _ = write!(s, " · device {}", sp.device);
    }
    s.push_str("</span></div>\n");
    match (&sp.site_short, &sp.site_full) {
        (Some(short), Some(full)) => {
            let _ =
                writeln!(s, "<div class=\"where\">at <code title=\"{}\">{}</code></div>", escape(full), escape(short));
        }
        _ => s.push_str("<div class=\"where\">no line of your code on the stack</div>\n"),
    }
    let mut nums = Vec::new();
    if sp.kind == "oom" {
        nums.push(format!("<b>{}</b> at stake", fmt_bytes(sp.bytes)));
    } else if sp.is_leak {
        nums.push(format!("<b>{}</b> still allocated at the end of the trace", fmt_bytes(sp.bytes)));
    } else if sp.severity == "held" {
        nums.push(format!("<b>{}</b> held at the dump, growth not known (no trace)", fmt_bytes(sp.bytes)));
    } else if sp.severity == "peak" {
        nums.push(format!("<b>{}</b> held at once, released later", fmt_bytes(sp.bytes)));
    } else {
        nums.push(format!("<b>{}</b>", fmt_bytes(sp.bytes)));
    }
    if let Some(g) = sp.growth_bytes_per_iteration {
        nums.push(format!("<span class=\"growth\">+{} per {}</span>", fmt_bytes(g), escape(&sp.growth_unit)));
    }
    if sp.bytes_at_peak > 0 {
        nums.push(format!("{} of it live at the peak", fmt_bytes(sp.bytes_at_peak)));
    }
    let _ = writeln!(s, "<div class=\"nums\">{}</div>", nums.join(" · "));
    let _ = writeln!(s, "<p><span class=\"label\">Evidence.</span> {}</p>", escape(&sp.evidence));
    let _ = writeln!(s, "<p><span class=\"label\">Fix.</span> {}</p>", escape(&sp.advice));
    if !sp.stack.is_empty() {
        let _ = writeln!(
            s,
            "<details><summary>allocation stack ({} frames, innermost first; your code in bold)</summary><ol>",
            sp.stack.len()
        );
        for (f, user) in &sp.stack {
            if *user {
                let _ = writeln!(s, "<li class=\"user\">{}</li>", escape(f));
            } else {
                let _ = writeln!(s, "<li>{}</li>", escape(f));
            }
        }
        s.push_str("</ol></details>\n");
    }
    s.push_str("</div>\n");
}
