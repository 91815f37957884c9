//! `memsnap diff BEFORE AFTER [--json]`: what changed between two snapshots — peak and end bytes
//! per device, per site and per category, and the suspects that appeared or vanished.
//!
//! Devices are matched by index when one file's device indices are all found in the other's
//! (the same job run twice); otherwise by position, and the output says so (two DDP ranks:
//! rank 0 on `cuda:0`, rank 1 on `cuda:1`). Sites are matched by their label (file path
//! shortened to its last components, line and function), suspects by kind and site, so that
//! files written from different checkouts or machines still line up. See docs/diff.md.
//!
//! Two directories instead of two files are two runs of per-rank dumps: each rank's pair of files
//! is diffed as here and summarised rank by rank ([`runs`], docs/ranks.md).

mod runs;

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use memsnap_analysis::{Category, DeviceAnalysis, Moment, Site, Suspect};
use memsnap_model::printable;
use serde_json::{json, Value};

use crate::emit::{emit, emit_json, shown_path};
use crate::exit::Exit;
use crate::json::site_json;
use crate::json::suspect_json;
use crate::pipeline::file_name;
use crate::pipeline::{analyze_file, Analyzed};
use crate::pipeline::{device_figures, DeviceFigures};
use crate::size;
use crate::text::{category_title, site_label};

#[derive(clap::Args)]
pub struct Args {
    /// The reference snapshot (`-` for stdin); gzip, zstd and xz are detected by content.
    pub before: PathBuf,
    /// The snapshot to compare with it (`-` for stdin, if BEFORE is not).
    pub after: PathBuf,
    /// Machine-readable output (`memsnap docs diff`).
    #[arg(long)]
    pub json: bool,
    /// Sites listed per moment in the text output (JSON lists every changed site).
    #[arg(long, default_value_t = 10)]
    pub top: usize,
}

pub fn run(args: &Args) -> anyhow::Result<Exit> {
    let (before_dir, after_dir) = (args.before.is_dir(), args.after.is_dir());
    if before_dir || after_dir {
        anyhow::ensure!(
            before_dir && after_dir,
            "{} is a directory and {} is not: give two snapshot files, or two run directories of per-rank files",
            shown_path(if before_dir { &args.before } else { &args.after }),
            shown_path(if before_dir { &args.after } else { &args.before })
        );
        return runs::run(&args.before, &args.after, args.json);
    }
    anyhow::ensure!(
        !(args.before.as_os_str() == "-" && args.after.as_os_str() == "-"),
        "only one of BEFORE and AFTER can be `-` (stdin)"
    );
    // Both files are read at once; an error in BEFORE is reported first whatever finishes first.
    let (before, after) = crate::invocation::join(|| analyze_file(&args.before), || analyze_file(&args.after));
    let (before, after) = (before?, after?);
    let d = compare(&before, &after);
    if args.json {
        let mut s = serde_json::to_string_pretty(&diff_json(&d, &args.before, &args.after))?;
        s.push('\n');
        emit_json(&s)?;
    } else {
        emit(&diff_text(&d, &args.before, &args.after, args.top))?;
    }
    Ok(Exit::SUCCESS)
}

/// What a diff of two runs shows of one rank's pair of files: the whole two-file diff as JSON,
/// and per device pair its totals; the suspects that appeared, vanished or persisted.
struct Summary {
    pub json: Value,
    pub devices: Vec<PairTotals>,
    pub appeared: Vec<String>,
    pub vanished: Vec<String>,
    pub persisting: Vec<String>,
}

/// The totals of one matched device pair: (name as the JSON has it, before, after).
struct PairTotals {
    pub before_device: u32,
    pub after_device: u32,
    pub totals: Vec<(&'static str, u64, u64)>,
}

/// [`Summary`] of the diff of two analysed files, by the same matching as the two-file diff.
fn summary(before: &Analyzed, after: &Analyzed, before_path: &Path, after_path: &Path) -> Summary {
    let d = compare(before, after);
    let devices = d
        .pairs
        .iter()
        .map(|p| PairTotals {
            before_device: p.before.figures.device,
            after_device: p.after.figures.device,
            totals: totals(p).iter().map(|(name, _, c)| (*name, c.before, c.after)).collect(),
        })
        .collect();
    let line = |s: &Suspect| {
        format!("{} at {} ({})", s.kind.name(), printable(&site_label(s.site.as_ref())), size::format(s.bytes))
    };
    let appeared =
        d.suspects.iter().filter(|m| m.before.is_empty()).flat_map(|m| m.after.iter().map(|s| line(s))).collect();
    let vanished =
        d.suspects.iter().filter(|m| m.after.is_empty()).flat_map(|m| m.before.iter().map(|s| line(s))).collect();
    let persisting = d
        .suspects
        .iter()
        .filter(|m| !m.before.is_empty() && !m.after.is_empty())
        .map(|m| {
            let c = m.bytes();
            format!("{} at {} ({} -> {})", m.kind, printable(&m.site), size::format(c.before), size::format(c.after))
        })
        .collect();
    Summary { json: diff_json(&d, before_path, after_path), devices, appeared, vanished, persisting }
}

/// One side of a matched device pair.
struct DeviceSide<'a> {
    figures: DeviceFigures,
    analysis: &'a DeviceAnalysis,
}

struct DevicePair<'a> {
    before: DeviceSide<'a>,
    after: DeviceSide<'a>,
}

/// How devices were matched.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Matching {
    Index,
    Position,
}

/// A change of one quantity.
#[derive(Clone, Copy, Default)]
struct Change {
    before: u64,
    after: u64,
}

impl Change {
    fn delta(self) -> i128 {
        i128::from(self.after) - i128::from(self.before)
    }
    fn json(self) -> Value {
        json!({"before": self.before, "after": self.after, "change": self.delta() as i64})
    }
}

/// Bytes of one site label on both sides.
struct SiteChange {
    label: String,
    site: Option<Site>,
    bytes: Change,
    blocks: Change,
}

/// Suspects of one kind at one site, on both sides.
struct SuspectMatch<'a> {
    kind: &'static str,
    site: String,
    before: Vec<&'a Suspect>,
    after: Vec<&'a Suspect>,
}

impl SuspectMatch<'_> {
    fn bytes(&self) -> Change {
        Change { before: self.before.iter().map(|s| s.bytes).sum(), after: self.after.iter().map(|s| s.bytes).sum() }
    }
}

struct Diff<'a> {
    before: &'a Analyzed,
    after: &'a Analyzed,
    matching: Matching,
    pairs: Vec<DevicePair<'a>>,
    only_before: Vec<DeviceSide<'a>>,
    only_after: Vec<DeviceSide<'a>>,
    suspects: Vec<SuspectMatch<'a>>,
}

fn sides(a: &Analyzed) -> Vec<DeviceSide<'_>> {
    device_figures(a)
        .into_iter()
        .zip(&a.analysis.devices)
        .map(|(figures, analysis)| DeviceSide { figures, analysis })
        .collect()
}

fn compare<'a>(before: &'a Analyzed, after: &'a Analyzed) -> Diff<'a> {
    let mut b = sides(before);
    let mut a = sides(after);
    let ids = |v: &[DeviceSide]| v.iter().map(|s| s.figures.device).collect::<Vec<_>>();
    let (bi, ai) = (ids(&b), ids(&a));
    let (small, large) = if bi.len() <= ai.len() { (&bi, &ai) } else { (&ai, &bi) };
    let matching = if small.iter().all(|d| large.contains(d)) { Matching::Index } else { Matching::Position };
    let (pairs, only_before, only_after) = match matching {
        Matching::Position => {
            let rest_b = b.split_off(b.len().min(a.len()));
            let rest_a = a.split_off(a.len().min(b.len()));
            (b.into_iter().zip(a).map(|(before, after)| DevicePair { before, after }).collect(), rest_b, rest_a)
        }
        Matching::Index => {
            let mut a: BTreeMap<u32, DeviceSide> = a.into_iter().map(|s| (s.figures.device, s)).collect();
            let (mut pairs, mut only_before) = (Vec::new(), Vec::new());
            for before in b {
                match a.remove(&before.figures.device) {
                    Some(after) => pairs.push(DevicePair { before, after }),
                    None => only_before.push(before),
                }
            }
            (pairs, only_before, a.into_values().collect())
        }
    };
    Diff { before, after, matching, pairs, only_before, only_after, suspects: match_suspects(before, after) }
}

/// Suspects grouped by (kind, site label) over all devices. Groups are in rank order (OOMs first,
/// then bytes at stake): AFTER's suspects first, then those found only in BEFORE, so appeared,
/// persisting and vanished suspects each come out ranked.
fn match_suspects<'a>(before: &'a Analyzed, after: &'a Analyzed) -> Vec<SuspectMatch<'a>> {
    let mut groups: Vec<SuspectMatch<'a>> = Vec::new();
    let mut index: HashMap<(&'static str, String), usize> = HashMap::new();
    for (side, a) in [(1, after), (0, before)] {
        for s in a.analysis.suspects() {
            let key = (s.kind.name(), site_label(s.site.as_ref()));
            let i = *index.entry(key.clone()).or_insert_with(|| {
                groups.push(SuspectMatch { kind: key.0, site: key.1, before: Vec::new(), after: Vec::new() });
                groups.len() - 1
            });
            let g = &mut groups[i];
            if side == 0 { &mut g.before } else { &mut g.after }.push(s);
        }
    }
    groups
}

/// Bytes per category (and cached free) at a moment on both sides, in [`Category::ALL`] order.
fn category_changes(b: &Moment, a: &Moment) -> Vec<(&'static str, &'static str, Change)> {
    let get = |m: &Moment, c: Category| m.by_category.iter().find(|(k, _)| *k == c).map_or(0, |(_, v)| *v);
    let mut v: Vec<_> = Category::ALL
        .iter()
        .map(|&c| (c.name(), category_title(c), Change { before: get(b, c), after: get(a, c) }))
        .collect();
    v.push(("cached_free", "cached free", Change { before: b.cached_free, after: a.cached_free }));
    v
}

/// Sites whose bytes changed, largest change first (then by label).
fn site_changes(b: &Moment, a: &Moment) -> Vec<SiteChange> {
    let mut map: BTreeMap<&str, SiteChange> = BTreeMap::new();
    for (side, m) in [(0, b), (1, a)] {
        for s in &m.by_site {
            let e = map.entry(&s.label).or_insert_with(|| SiteChange {
                label: s.label.clone(),
                site: None,
                bytes: Change::default(),
                blocks: Change::default(),
            });
            if side == 0 {
                e.bytes.before += s.bytes;
                e.blocks.before += s.blocks;
            } else {
                e.bytes.after += s.bytes;
                e.blocks.after += s.blocks;
            }
            if s.site.is_some() && (e.site.is_none() || side == 1) {
                e.site.clone_from(&s.site);
            }
        }
    }
    let mut v: Vec<SiteChange> = map.into_values().filter(|c| c.bytes.delta() != 0 || c.blocks.delta() != 0).collect();
    v.sort_by(|x, y| y.bytes.delta().abs().cmp(&x.bytes.delta().abs()).then_with(|| x.label.cmp(&y.label)));
    v
}

fn totals(p: &DevicePair) -> [(&'static str, &'static str, Change); 4] {
    let (b, a) = (&p.before, &p.after);
    [
        (
            "peak_allocated_bytes",
            "peak allocated",
            Change { before: b.figures.peak_allocated_bytes, after: a.figures.peak_allocated_bytes },
        ),
        (
            "peak_reserved_bytes",
            "peak reserved",
            Change { before: b.figures.peak_reserved_bytes, after: a.figures.peak_reserved_bytes },
        ),
        (
            "end_allocated_bytes",
            "end allocated",
            Change { before: b.analysis.end.allocated, after: a.analysis.end.allocated },
        ),
        (
            "end_reserved_bytes",
            "end reserved",
            Change { before: b.analysis.end.reserved, after: a.analysis.end.reserved },
        ),
    ]
}

fn notes(d: &Diff) -> Vec<String> {
    let ids = |v: &mut dyn Iterator<Item = u32>| v.map(|i| i.to_string()).collect::<Vec<_>>().join(", ");
    let mut out = Vec::new();
    if d.matching == Matching::Position {
        let b = ids(&mut d
            .pairs
            .iter()
            .map(|p| p.before.figures.device)
            .chain(d.only_before.iter().map(|s| s.figures.device)));
        let a = ids(&mut d
            .pairs
            .iter()
            .map(|p| p.after.figures.device)
            .chain(d.only_after.iter().map(|s| s.figures.device)));
        out.push(format!(
            "device indices differ (before: {b}; after: {a}); devices are matched by position (e.g. two ranks of one job)"
        ));
    }
    for (side, v) in [("before", &d.only_before), ("after", &d.only_after)] {
        if !v.is_empty() {
            out.push(format!("device {} only in {side}: not compared", ids(&mut v.iter().map(|s| s.figures.device))));
        }
    }
    out
}

fn moment_json(b: &Moment, a: &Moment) -> Value {
    let cats: serde_json::Map<String, Value> =
        category_changes(b, a).into_iter().map(|(name, _, c)| (name.to_string(), c.json())).collect();
    let sites: Vec<Value> = site_changes(b, a)
        .into_iter()
        .map(|s| {
            json!({
                "label": s.label,
                "site": s.site.as_ref().map(site_json),
                "before_bytes": s.bytes.before,
                "after_bytes": s.bytes.after,
                "change": s.bytes.delta() as i64,
                "before_blocks": s.blocks.before,
                "after_blocks": s.blocks.after,
            })
        })
        .collect();
    json!({
        "allocated_bytes": Change { before: b.allocated, after: a.allocated }.json(),
        "by_category": cats,
        "by_site": sites,
    })
}

fn side_json(s: &DeviceSide) -> Value {
    json!({
        "device": s.figures.device,
        "peak_allocated_bytes": s.figures.peak_allocated_bytes,
        "peak_reserved_bytes": s.figures.peak_reserved_bytes,
        "end_allocated_bytes": s.analysis.end.allocated,
        "end_reserved_bytes": s.analysis.end.reserved,
    })
}

fn file_json(path: &Path, a: &Analyzed) -> Value {
    json!({
        "file": file_name(path),
        "pickle_bytes": a.loaded.pickle_bytes,
        "devices": a.analysis.devices.iter().map(|d| d.device).collect::<Vec<_>>(),
        "caveats": a.file_caveats,
    })
}

fn diff_json(d: &Diff, before: &Path, after: &Path) -> Value {
    let devices: Vec<Value> = d
        .pairs
        .iter()
        .map(|p| {
            let mut v = json!({
                "before_device": p.before.figures.device,
                "after_device": p.after.figures.device,
                "peak": moment_json(&p.before.analysis.peak, &p.after.analysis.peak),
                "end": moment_json(&p.before.analysis.end, &p.after.analysis.end),
            });
            for (key, _, c) in totals(p) {
                v[key] = c.json();
            }
            v
        })
        .collect();
    let pick = |f: &dyn Fn(&SuspectMatch) -> bool, side: &dyn Fn(&SuspectMatch) -> Vec<Value>| {
        d.suspects.iter().filter(|m| f(m)).flat_map(side).collect::<Vec<Value>>()
    };
    let appeared = pick(&|m| m.before.is_empty(), &|m| m.after.iter().map(|s| suspect_json(s)).collect());
    let vanished = pick(&|m| m.after.is_empty(), &|m| m.before.iter().map(|s| suspect_json(s)).collect());
    let persisting: Vec<Value> = d
        .suspects
        .iter()
        .filter(|m| !m.before.is_empty() && !m.after.is_empty())
        .map(|m| {
            let c = m.bytes();
            json!({
                "kind": m.kind,
                "label": m.site,
                "site": m.after[0].site.as_ref().map(site_json),
                "before_devices": m.before.iter().map(|s| s.device).collect::<Vec<_>>(),
                "after_devices": m.after.iter().map(|s| s.device).collect::<Vec<_>>(),
                "before_bytes": c.before,
                "after_bytes": c.after,
                "change": c.delta() as i64,
            })
        })
        .collect();
    json!({
        "schema_version": 1,
        "command": "diff",
        "before": file_json(before, d.before),
        "after": file_json(after, d.after),
        "device_matching": match d.matching { Matching::Index => "index", Matching::Position => "position" },
        "notes": notes(d),
        "devices": devices,
        "unmatched_devices": {
            "before": d.only_before.iter().map(side_json).collect::<Vec<_>>(),
            "after": d.only_after.iter().map(side_json).collect::<Vec<_>>(),
        },
        "suspects": {"appeared": appeared, "vanished": vanished, "persisting": persisting},
    })
}

fn percent(c: Change) -> String {
    if c.before == 0 || c.delta() == 0 {
        return String::new();
    }
    format!(" ({:+.1}%)", c.delta() as f64 * 100.0 / c.before as f64)
}

fn suspect_line(s: &Suspect) -> String {
    format!(
        "{} on device {}: {} at {} (confidence {:.2})",
        s.kind.name(),
        s.device,
        size::format(s.bytes),
        printable(&site_label(s.site.as_ref())),
        s.confidence
    )
}

fn diff_text(d: &Diff, before: &Path, after: &Path, top: usize) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "memsnap diff: {} -> {}", shown_path(before), shown_path(after));
    for n in notes(d) {
        let _ = writeln!(s, "note: {n}");
    }

    let _ = writeln!(s, "\nSUSPECTS");
    let appeared: Vec<&Suspect> =
        d.suspects.iter().filter(|m| m.before.is_empty()).flat_map(|m| m.after.iter().copied()).collect();
    let vanished: Vec<&Suspect> =
        d.suspects.iter().filter(|m| m.after.is_empty()).flat_map(|m| m.before.iter().copied()).collect();
    let persisting: Vec<&SuspectMatch> =
        d.suspects.iter().filter(|m| !m.before.is_empty() && !m.after.is_empty()).collect();
    if appeared.is_empty() && vanished.is_empty() && persisting.is_empty() {
        let _ = writeln!(s, "  none in either file");
    }
    for sp in &appeared {
        let _ = writeln!(s, "  appeared:   {}", suspect_line(sp));
    }
    for sp in &vanished {
        let _ = writeln!(s, "  vanished:   {}", suspect_line(sp));
    }
    for m in &persisting {
        let c = m.bytes();
        let _ = writeln!(
            s,
            "  persisting: {} at {}: {} -> {} ({})",
            m.kind,
            printable(&m.site),
            size::format(c.before),
            size::format(c.after),
            size::format_change(c.delta())
        );
    }
    if !appeared.is_empty() || !vanished.is_empty() {
        let _ = writeln!(s, "  ({} appeared, {} vanished; matched by kind and site)", appeared.len(), vanished.len());
    }

    for p in &d.pairs {
        let (bd, ad) = (p.before.figures.device, p.after.figures.device);
        if bd == ad {
            let _ = writeln!(s, "\nDEVICE {bd}");
        } else {
            let _ = writeln!(s, "\nDEVICE {bd} (before) vs DEVICE {ad} (after)");
        }
        let _ = writeln!(s, "  {:<16} {:>14} {:>14} {:>14}", "", "before", "after", "change");
        for (_, title, c) in totals(p) {
            let _ = writeln!(
                s,
                "  {:<16} {:>14} {:>14} {:>14}{}",
                title,
                size::format(c.before),
                size::format(c.after),
                size::format_change(c.delta()),
                percent(c)
            );
        }
        for (title, b, a) in [
            ("at peak", &p.before.analysis.peak, &p.after.analysis.peak),
            ("at end", &p.before.analysis.end, &p.after.analysis.end),
        ] {
            let _ = writeln!(s, "\n  By category {title}:");
            for (_, name, c) in category_changes(b, a) {
                if c.before == 0 && c.after == 0 {
                    continue;
                }
                let _ = writeln!(
                    s,
                    "    {:<32} {:>12} -> {:>12}  {}",
                    name,
                    size::format(c.before),
                    size::format(c.after),
                    size::format_change(c.delta())
                );
            }
            let sites = site_changes(b, a);
            if sites.is_empty() {
                let _ = writeln!(s, "  Sites {title}: no change");
                continue;
            }
            let _ = writeln!(s, "  Sites {title}, largest changes first ({} changed):", sites.len());
            for c in sites.iter().take(top) {
                let _ = writeln!(
                    s,
                    "    {:>13}  {:>12} -> {:>12}  {}",
                    size::format_change(c.bytes.delta()),
                    size::format(c.bytes.before),
                    size::format(c.bytes.after),
                    printable(&c.label)
                );
            }
            if sites.len() > top {
                let rest: i128 = sites[top..].iter().map(|c| c.bytes.delta()).sum();
                let _ = writeln!(s, "    {:>13}  ({} more sites)", size::format_change(rest), sites.len() - top);
            }
        }
    }
    for (side, v) in [("before", &d.only_before), ("after", &d.only_after)] {
        for x in v.iter() {
            let _ = writeln!(
                s,
                "\nDEVICE {} (only {side}): peak allocated {}, peak reserved {}",
                x.figures.device,
                size::format(x.figures.peak_allocated_bytes),
                size::format(x.figures.peak_reserved_bytes)
            );
        }
    }
    s
}
