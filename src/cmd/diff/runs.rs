//! `memsnap diff RUN_A RUN_B` where both are directories of per-rank dumps: the files are found
//! and placed as `ranks` does (`crate::job`), paired by rank (and by iteration when both runs have
//! several), each pair diffed with the two-file diff's own matching ([`super::summary`]), and
//! summarised one line per rank; ranks found in one run only are named. See docs/ranks.md.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::Path;

use memsnap_model::{plural, printable};
use serde_json::{json, Value};

use super::{summary, Summary};
use crate::emit::{emit, emit_json, shown_path};
use crate::exit::Exit;
use crate::job::names::Iteration;
use crate::job::{analyze_guarded, map_in_chunks, members, Member};
use crate::size::{format, format_change};

/// What a pair is keyed by: the iteration when both runs have several (else `None`), and the
/// rank; pairs come out in this order.
type Key = (Option<Iteration>, u32);

struct Pair {
    key: Key,
    before: Option<Member>,
    after: Option<Member>,
}

/// A pair both runs have, diffed (or why not: the side that could not be read).
struct Compared {
    key: Key,
    before: Member,
    after: Member,
    result: Result<Summary, String>,
}

fn iterations(m: &[Member]) -> BTreeSet<Option<&Iteration>> {
    m.iter().map(|m| m.place.iteration.as_ref()).collect()
}

fn iteration_list(set: &BTreeSet<Option<&Iteration>>) -> String {
    set.iter()
        .map(|i| i.map_or("(none)".to_string(), |i| printable(&i.label).into_owned()))
        .collect::<Vec<_>>()
        .join(", ")
}

pub fn run(before: &Path, after: &Path, json: bool) -> anyhow::Result<Exit> {
    crate::progress::per_file_off();
    let (b, _) = members(&[before.to_path_buf()])?;
    let (a, _) = members(&[after.to_path_buf()])?;
    let (bi, ai) = (iterations(&b), iterations(&a));
    let by_iteration = match (bi.len() > 1, ai.len() > 1) {
        (true, true) => true,
        (false, false) => false,
        _ => {
            let (many, one, set) = if bi.len() > 1 { (before, after, &bi) } else { (after, before, &ai) };
            anyhow::bail!(
                "{} has dumps of several iterations ({}) and {} of one: pair two runs with the same iterations, or name one iteration folder of each",
                shown_path(many),
                iteration_list(set),
                shown_path(one)
            );
        }
    };
    let key = |m: &Member| -> Key { (if by_iteration { m.place.iteration.clone() } else { None }, m.place.rank) };
    let mut pairs: BTreeMap<Key, Pair> = BTreeMap::new();
    for (side, list) in [(0, b), (1, a)] {
        for m in list {
            // Within a run a (rank, iteration) has one file (`members` made sure), and pairing by
            // rank alone happens only when the run has one iteration: a key has one file a side.
            let p = pairs.entry(key(&m)).or_insert_with(|| Pair { key: key(&m), before: None, after: None });
            if side == 0 {
                p.before = Some(m);
            } else {
                p.after = Some(m);
            }
        }
    }
    let (mut both, mut only_before, mut only_after) = (Vec::new(), Vec::new(), Vec::new());
    for p in pairs.into_values() {
        match (p.before, p.after) {
            (Some(b), Some(a)) => both.push((p.key, b, a)),
            (Some(b), None) => only_before.push(b),
            (None, Some(a)) => only_after.push(a),
            (None, None) => {}
        }
    }
    let compared: Vec<Compared> = map_in_chunks(&both, |(key, b, a)| {
        let (rb, ra) = crate::invocation::join(|| analyze_guarded(&b.path), || analyze_guarded(&a.path));
        let result = match (rb, ra) {
            (Ok(rb), Ok(ra)) => Ok(summary(&rb, &ra, &b.path, &a.path)),
            (Err(e), _) => Err(format!("{}: {e}", b.shown)),
            (_, Err(e)) => Err(format!("{}: {e}", a.shown)),
        };
        Compared { key: key.clone(), before: b.clone(), after: a.clone(), result }
    });
    if json {
        let v = runs_json(before, after, by_iteration, &compared, &only_before, &only_after);
        let mut s = serde_json::to_string_pretty(&v)?;
        s.push('\n');
        emit_json(&s)?;
    } else {
        emit(&runs_text(before, after, by_iteration, &compared, &only_before, &only_after))?;
    }
    let mut any = false;
    for c in &compared {
        if let Err(e) = &c.result {
            crate::emit::stderr_line(&format!("memsnap: error: {}", printable(e)));
            any = true;
        }
    }
    Ok(if any { Exit::UNREADABLE } else { Exit::SUCCESS })
}

fn member_place(m: &Member) -> String {
    let it = m.place.iteration.as_ref().map_or(String::new(), |i| format!(", {}", printable(&i.label)));
    format!("rank {}{it} ({})", m.place.rank, printable(&m.shown))
}

fn runs_text(
    before: &Path,
    after: &Path,
    by_iteration: bool,
    compared: &[Compared],
    only_before: &[Member],
    only_after: &[Member],
) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "memsnap diff: {} -> {} ({} of files, paired by rank{})",
        shown_path(before),
        shown_path(after),
        plural(compared.len() as u64, "pair", "pairs"),
        if by_iteration { " and iteration" } else { "" }
    );
    let mut heading: Option<Option<&Iteration>> = None;
    for c in compared {
        let it = c.key.0.as_ref();
        if heading != Some(it) {
            heading = Some(it);
            match it {
                Some(i) => {
                    let _ = writeln!(s, "\nITERATION {} ({})", i.number, printable(&i.label));
                }
                None => {
                    let _ = writeln!(s, "\nRANKS");
                }
            }
            let _ = writeln!(
                s,
                "  {:>4}  {:>14}  {:>14}  {:>14}  {:>21}  {:>21}",
                "rank", "peak before", "peak after", "change", "peak reserved change", "end allocated change"
            );
        }
        let summary = match &c.result {
            Err(e) => {
                let _ = writeln!(s, "  {:>4}  unreadable: {}", c.key.1, printable(e));
                continue;
            }
            Ok(summary) => summary,
        };
        let several = summary.devices.len() > 1;
        for pair in &summary.devices {
            let (bd, ad) = (pair.before_device, pair.after_device);
            let get = |name: &str| pair.totals.iter().find(|t| t.0 == name).map_or((0, 0), |t| (t.1, t.2));
            let (pb, pa) = get("peak_allocated_bytes");
            let (rb, ra) = get("peak_reserved_bytes");
            let (eb, ea) = get("end_allocated_bytes");
            let devices = if several || bd != ad { format!("  (device {bd} vs {ad})") } else { String::new() };
            let change = |b: u64, a: u64| format_change(i128::from(a) - i128::from(b));
            let _ = writeln!(
                s,
                "  {:>4}  {:>14}  {:>14}  {:>14}  {:>21}  {:>21}{devices}",
                c.key.1,
                format(pb),
                format(pa),
                change(pb, pa),
                change(rb, ra),
                change(eb, ea),
            );
        }
        for (what, list) in
            [("appeared", &summary.appeared), ("vanished", &summary.vanished), ("persisting", &summary.persisting)]
        {
            for line in list {
                let _ = writeln!(s, "        {what}: {line}");
            }
        }
    }
    for (side, list) in [("before", only_before), ("after", only_after)] {
        if !list.is_empty() {
            let _ = writeln!(s, "\nonly in {side} (not compared):");
            for m in list {
                let _ = writeln!(s, "  {}", member_place(m));
            }
        }
    }
    // The pair whose peak changed most (the first of them on a tie), to read in full.
    let peak_change = |c: &Compared| -> Option<u128> {
        let s = c.result.as_ref().ok()?;
        s.devices
            .iter()
            .flat_map(|d| d.totals.iter().filter(|t| t.0 == "peak_allocated_bytes"))
            .map(|t| (i128::from(t.2) - i128::from(t.1)).unsigned_abs())
            .max()
    };
    let most = compared.iter().filter_map(|c| peak_change(c).map(|p| (p, c))).rev().max_by_key(|(p, _)| *p);
    if let Some((_, c)) = most {
        let _ = writeln!(
            s,
            "\nThe pair whose peak changed most, in full: memsnap diff {} {}",
            printable(&c.before.shown),
            printable(&c.after.shown)
        );
    }
    s
}

fn side_json(m: &Member) -> Value {
    json!({
        "rank": m.place.rank,
        "iteration": m.place.iteration.as_ref().map(|i| i.number),
        "iteration_label": m.place.iteration.as_ref().map(|i| &i.label),
        "file": m.shown,
    })
}

fn runs_json(
    before: &Path,
    after: &Path,
    by_iteration: bool,
    compared: &[Compared],
    only_before: &[Member],
    only_after: &[Member],
) -> Value {
    json!({
        "schema_version": 1,
        "command": "diff",
        "runs": {"before": before.display().to_string(), "after": after.display().to_string()},
        "pairing": if by_iteration { "rank_and_iteration" } else { "rank" },
        "ranks": compared.iter().map(|c| json!({
            "rank": c.key.1,
            "before": side_json(&c.before),
            "after": side_json(&c.after),
            "error": c.result.as_ref().err(),
            "diff": c.result.as_ref().ok().map(|s| &s.json),
        })).collect::<Vec<_>>(),
        "only_before": only_before.iter().map(side_json).collect::<Vec<_>>(),
        "only_after": only_after.iter().map(side_json).collect::<Vec<_>>(),
    })
}
