//! `ranks` as text (a table per iteration, then the growth over the run) and as JSON (the schema
//! is in docs/ranks.md).

use std::fmt::Write as _;

use memsnap_model::{plural, printable};
use serde_json::{json, Value};

use super::compare::{Group, Imbalance, Odd, Row};
use crate::job::names::Iteration;
use crate::json::site_json;
use crate::size::format_change;
use crate::text::fmt_bytes;

/// A ratio as JSON: three decimals are more than a reader compares, and fewer digits than the
/// float's keep the output short.
fn ratio_json(r: Option<f64>) -> Value {
    json!(r.map(|r| (r * 1000.0).round() / 1000.0))
}

fn iteration_heading(it: Option<&Iteration>) -> String {
    match it {
        Some(it) => format!("ITERATION {} ({})", it.number, printable(&it.label)),
        None => "RANKS".to_string(),
    }
}

fn imbalance_line(im: Option<&Imbalance>) -> String {
    match im {
        None => "imbalance: unknown (no rank with a known peak)".to_string(),
        Some(im) => format!(
            "imbalance: {} (max {} on rank {}, median {}, over {})",
            im.ratio.map_or("n/a".to_string(), |r| format!("{r:.2}")),
            fmt_bytes(im.max),
            im.max_rank,
            fmt_bytes(im.median),
            plural(im.ranks as u64, "rank", "ranks")
        ),
    }
}

fn group_text(s: &mut String, g: &Group, several: bool) {
    let heading = match g.iteration {
        None if several => "WITHOUT AN ITERATION (files outside iteration folders)".to_string(),
        it => iteration_heading(it),
    };
    let _ = writeln!(s, "\n{heading}");
    let _ = writeln!(
        s,
        "  {:>4}  {:>14}  {:>14}  {:>14}  {:>17}  {:>16}  {:>8}  file",
        "rank", "peak allocated", "peak reserved", "growth", "allocated at dump", "reserved at dump", "suspects"
    );
    let mut unknown_peaks = Vec::new();
    for r in &g.rows {
        let file = printable(&r.member.shown);
        match &r.result {
            Err(e) => {
                let _ = writeln!(s, "  {:>4}  unreadable: {}  {file}", r.rank(), printable(e));
            }
            Ok(f) => {
                let peak = |v: u64| if f.peak_known { fmt_bytes(v) } else { "-".to_string() };
                if !f.peak_known {
                    unknown_peaks.push(r.rank().to_string());
                }
                let _ = writeln!(
                    s,
                    "  {:>4}  {:>14}  {:>14}  {:>14}  {:>17}  {:>16}  {:>8}  {file}",
                    r.rank(),
                    peak(f.peak_allocated),
                    peak(f.peak_reserved),
                    f.growth.map_or("-".to_string(), |g| format_change(i128::from(g))),
                    fmt_bytes(f.allocated_at_dump),
                    fmt_bytes(f.reserved_at_dump),
                    f.suspects.len(),
                );
            }
        }
    }
    let with_suspects: Vec<&&Row> =
        g.rows.iter().filter(|r| r.result.as_ref().is_ok_and(|f| !f.suspects.is_empty())).collect();
    if !with_suspects.is_empty() {
        let _ = writeln!(s, "  suspects:");
        for r in with_suspects {
            let Ok(f) = &r.result else { continue };
            for (i, sp) in f.suspects.iter().enumerate() {
                let growth = sp
                    .growth_bytes_per_iteration
                    .map_or(String::new(), |g| format!(", +{}/{}", fmt_bytes(g), sp.growth_unit));
                let who = if i == 0 { format!("rank {}:", r.rank()) } else { String::new() };
                let _ = writeln!(s, "    {who:<9} {} [{}] {}{growth}", sp.text(), sp.severity, fmt_bytes(sp.bytes));
            }
        }
    }
    if !unknown_peaks.is_empty() {
        let _ = writeln!(
            s,
            "  note: no trace, so no peak, for rank {}: left out of the imbalance",
            unknown_peaks.join(", ")
        );
    }
    let _ = writeln!(s, "  {}", imbalance_line(g.imbalance.as_ref()));
    match &g.odd[..] {
        [] => {
            let _ = writeln!(s, "  odd one out: none");
        }
        [one] => {
            let _ = writeln!(s, "  odd one out: rank {}. {}", one.rank, one.why);
        }
        many => {
            let _ = writeln!(s, "  odd ones out:");
            for o in many {
                let _ = writeln!(s, "    rank {}. {}", o.rank, o.why);
            }
        }
    }
}

/// Each rank's peak at each numbered iteration.
struct RunGrowth<'a> {
    iterations: Vec<&'a Iteration>,
    /// (rank, its peak at each iteration: `None` for no file, unreadable, or no known peak).
    ranks: Vec<(u32, Vec<Option<u64>>)>,
}

/// [`RunGrowth`] of the numbered iterations; empty unless there are two or more.
fn growth_over_run<'a>(groups: &'a [Group]) -> RunGrowth<'a> {
    let numbered: Vec<&Group> = groups.iter().filter(|g| g.iteration.is_some()).collect();
    if numbered.len() < 2 {
        return RunGrowth { iterations: Vec::new(), ranks: Vec::new() };
    }
    let mut ranks: Vec<u32> = numbered.iter().flat_map(|g| g.rows.iter().map(|r| r.rank())).collect();
    ranks.sort_unstable();
    ranks.dedup();
    let table = ranks
        .into_iter()
        .map(|rank| {
            let peaks = numbered
                .iter()
                .map(|g| g.rows.iter().find(|r| r.rank() == rank).and_then(|r| r.known_peak()))
                .collect();
            (rank, peaks)
        })
        .collect();
    RunGrowth { iterations: numbered.iter().filter_map(|g| g.iteration).collect(), ranks: table }
}

/// The change from the first known peak to the last.
fn change(peaks: &[Option<u64>]) -> Option<i64> {
    let known: Vec<u64> = peaks.iter().flatten().copied().collect();
    match known[..] {
        [first, .., last] => Some(last as i64 - first as i64),
        _ => None,
    }
}

pub fn text(rows: &[Row], groups: &[Group]) -> String {
    let mut s = String::new();
    let mut ranks: Vec<u32> = rows.iter().map(Row::rank).collect();
    ranks.sort_unstable();
    ranks.dedup();
    let numbered = groups.iter().filter(|g| g.iteration.is_some()).count();
    let _ = write!(s, "memsnap ranks: {}", plural(ranks.len() as u64, "rank", "ranks"));
    if numbered > 0 {
        let _ = write!(s, ", {}", plural(numbered as u64, "iteration", "iterations"));
    }
    let unreadable = rows.iter().filter(|r| r.result.is_err()).count();
    let _ = write!(s, " ({}", plural(rows.len() as u64, "file", "files"));
    if unreadable > 0 {
        let _ = write!(s, ", {unreadable} unreadable");
    }
    let _ = writeln!(s, ")");
    for g in groups {
        group_text(&mut s, g, groups.len() > 1);
    }
    let RunGrowth { iterations, ranks: table } = growth_over_run(groups);
    if !iterations.is_empty() {
        let labels: Vec<String> = iterations.iter().map(|i| printable(&i.label).into_owned()).collect();
        let widths: Vec<usize> = labels.iter().map(|l| l.chars().count().max(12)).collect();
        let _ = writeln!(s, "\nGROWTH OVER THE RUN (peak allocated at each iteration)");
        let _ = write!(s, "  {:>4}", "rank");
        for (l, w) in labels.iter().zip(&widths) {
            let _ = write!(s, "  {l:>w$}");
        }
        let _ = writeln!(s, "  {:>14}", "change");
        for (rank, peaks) in &table {
            let _ = write!(s, "  {rank:>4}");
            for (p, w) in peaks.iter().zip(&widths) {
                let _ = write!(s, "  {:>w$}", p.map_or("-".to_string(), fmt_bytes));
            }
            let _ = writeln!(s, "  {:>14}", change(peaks).map_or("-".to_string(), |c| format_change(i128::from(c))));
        }
    }
    s
}

fn iteration_json(it: Option<&Iteration>) -> (Value, Value) {
    (json!(it.map(|i| i.number)), json!(it.map(|i| &i.label)))
}

fn row_json(r: &Row) -> Value {
    let (iteration, label) = iteration_json(r.member.place.iteration.as_ref());
    let mut v = json!({
        "rank": r.rank(),
        "iteration": iteration,
        "iteration_label": label,
        "file": r.member.shown,
        "error": null,
        "device": null,
        "devices": null,
        "peak_allocated": null,
        "peak_reserved": null,
        "growth": null,
        "allocated_at_dump": null,
        "reserved_at_dump": null,
        "suspects": null,
    });
    match &r.result {
        Err(e) => v["error"] = json!(e),
        Ok(f) => {
            v["device"] = json!(f.device);
            v["devices"] = json!(f.devices);
            v["peak_allocated"] = json!(f.peak_known.then_some(f.peak_allocated));
            v["peak_reserved"] = json!(f.peak_known.then_some(f.peak_reserved));
            v["growth"] = json!(f.growth);
            v["allocated_at_dump"] = json!(f.allocated_at_dump);
            v["reserved_at_dump"] = json!(f.reserved_at_dump);
            v["suspects"] = json!(f
                .suspects
                .iter()
                .map(|s| json!({
                    "kind": s.kind,
                    "severity": s.severity,
                    "device": s.device,
                    "bytes": s.bytes,
                    "growth_bytes_per_iteration": s.growth_bytes_per_iteration,
                    "growth_unit": s.growth_unit,
                    "label": s.label,
                    "site": s.site.as_ref().map(site_json),
                }))
                .collect::<Vec<_>>());
        }
    }
    v
}

fn imbalance_json(im: Option<&Imbalance>) -> Value {
    match im {
        None => Value::Null,
        Some(im) => json!({
            "ratio": ratio_json(im.ratio),
            "max_peak_allocated": im.max,
            "max_rank": im.max_rank,
            "median_peak_allocated": im.median,
            "ranks": im.ranks,
        }),
    }
}

fn odd_json(o: &Odd, it: Option<&Iteration>) -> Value {
    let (iteration, label) = iteration_json(it);
    json!({
        "rank": o.rank,
        "iteration": iteration,
        "iteration_label": label,
        "why": o.why,
        "alone": o.alone.iter().map(|a| json!({"kind": a.kind, "label": a.label, "kind_alone": a.kind_alone})).collect::<Vec<_>>(),
        "peak_ratio": ratio_json(o.peak_ratio),
    })
}

pub fn json(rows: &[Row], groups: &[Group]) -> Value {
    let last = groups.last();
    let mut v = json!({
        "schema_version": 1,
        "command": "ranks",
        "files": rows.len(),
        "ranks": rows.iter().map(row_json).collect::<Vec<_>>(),
        "imbalance": imbalance_json(last.and_then(|g| g.imbalance.as_ref())),
        "odd_ones": last.map_or(Vec::new(), |g| g.odd.iter().map(|o| odd_json(o, g.iteration)).collect::<Vec<_>>()),
    });
    if groups.iter().any(|g| g.iteration.is_some()) {
        v["iterations"] = json!(groups
            .iter()
            .map(|g| {
                let (iteration, label) = iteration_json(g.iteration);
                json!({
                    "iteration": iteration,
                    "iteration_label": label,
                    "ranks": g.rows.iter().map(|r| r.rank()).collect::<Vec<_>>(),
                    "imbalance": imbalance_json(g.imbalance.as_ref()),
                    "odd_ones": g.odd.iter().map(|o| odd_json(o, g.iteration)).collect::<Vec<_>>(),
                })
            })
            .collect::<Vec<_>>());
    }
    let RunGrowth { iterations, ranks: table } = growth_over_run(groups);
    if !iterations.is_empty() {
        v["growth_over_run"] = json!({
            "iterations": iterations.iter().map(|i| i.number).collect::<Vec<_>>(),
            "iteration_labels": iterations.iter().map(|i| &i.label).collect::<Vec<_>>(),
            "ranks": table.iter().map(|(rank, peaks)| json!({
                "rank": rank,
                "peak_allocated": peaks,
                "change": change(peaks),
            })).collect::<Vec<_>>(),
        });
    }
    v
}
