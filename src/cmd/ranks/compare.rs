//! Comparing the ranks of one job: each file analysed into its row (its main device's figures and
//! its suspects), the rows grouped by iteration, and per iteration the imbalance and the odd ones
//! out.

use std::collections::{BTreeMap, BTreeSet};

use memsnap_analysis::{Site, Suspect};
use memsnap_model::printable;

use crate::job::names::Iteration;
use crate::job::{analyze_guarded, map_in_chunks, Member};
use crate::pipeline::{device_figures, Analyzed};
use crate::text::{fmt_bytes, site_label};

/// A peak at least this many times the median peak of its iteration makes a rank an odd one out
/// even without a suspect of its own. The ranks of a data-parallel job run one program on batches
/// of one shape, so their peaks agree to the allocator's rounding (to the byte in fixtures/ranks);
/// 20% leaves room for what data can move (variable sequence lengths, a short last batch) while a
/// leak or an extra model copy on one rank stands out (rank 1 of fixtures/multi m02: 2.05 times).
pub const ODD_PEAK_RATIO: f64 = 1.2;

/// A suspect as the rank table needs it.
#[derive(Clone, Debug)]
pub struct SuspectBrief {
    pub kind: &'static str,
    pub severity: &'static str,
    pub device: u32,
    pub bytes: u64,
    pub growth_bytes_per_iteration: Option<u64>,
    pub growth_unit: &'static str,
    pub site: Option<Site>,
    /// The site label `diff` matches suspects by: `path/last/parts.py:LINE (function)`.
    pub label: String,
}

impl SuspectBrief {
    fn of(s: &Suspect) -> SuspectBrief {
        SuspectBrief {
            kind: s.kind.name(),
            severity: s.severity.name(),
            device: s.device,
            bytes: s.bytes,
            growth_bytes_per_iteration: s.growth_bytes_per_iteration,
            growth_unit: s.growth_unit.name(),
            site: s.site.clone(),
            label: site_label(s.site.as_ref()),
        }
    }

    /// `retained_graph at path/to/train.py:12 (f)`, escaped for text output.
    pub fn text(&self) -> String {
        format!("{} at {}", self.kind, printable(&self.label))
    }
}

/// What one rank's file says: the figures of its device (the one with the highest peak of
/// allocated bytes, the first on a tie; a rank's file normally has one), and every suspect.
#[derive(Clone, Debug)]
pub struct Figures {
    pub device: u32,
    pub devices: Vec<u32>,
    /// Largest allocated / reserved bytes over the replayed trace (never below the dump).
    pub peak_allocated: u64,
    pub peak_reserved: u64,
    /// The file has a trace that records allocations; without one the peaks above are the dump's.
    pub peak_known: bool,
    /// Allocated bytes after the last trace event minus before the first (the replay's start
    /// state, as `timeline` prints it); `None` without a trace.
    pub growth: Option<i64>,
    /// `memory_allocated()` / `memory_reserved()` at dump.
    pub allocated_at_dump: u64,
    pub reserved_at_dump: u64,
    /// Ranked as `analyze` ranks them.
    pub suspects: Vec<SuspectBrief>,
}

impl Figures {
    pub fn of(a: &Analyzed) -> Figures {
        let figures = device_figures(a);
        let main = figures.iter().rev().max_by_key(|d| d.peak_allocated_bytes);
        let device = main.map_or(0, |d| d.device);
        let growth = a.replay.device(device).filter(|r| r.event_count > 0).and_then(|r| {
            let end = a.analysis.devices.iter().find(|d| d.device == device)?.end.allocated;
            Some(end as i64 - r.series.start.allocated as i64)
        });
        Figures {
            device,
            devices: figures.iter().map(|d| d.device).collect(),
            peak_allocated: main.map_or(0, |d| d.peak_allocated_bytes),
            peak_reserved: main.map_or(0, |d| d.peak_reserved_bytes),
            peak_known: main.is_some_and(|d| d.peak_known),
            growth,
            allocated_at_dump: main.map_or(0, |d| d.allocated_bytes),
            reserved_at_dump: main.map_or(0, |d| d.reserved_bytes),
            suspects: a.analysis.suspects().into_iter().map(SuspectBrief::of).collect(),
        }
    }
}

/// One rank's row: its file and what it says, or why it could not be read.
#[derive(Clone, Debug)]
pub struct Row {
    pub member: Member,
    pub result: Result<Figures, String>,
}

impl Row {
    pub fn rank(&self) -> u32 {
        self.member.place.rank
    }
    /// The peak that imbalance and the odd-one-out rule compare, when the file has one.
    pub fn known_peak(&self) -> Option<u64> {
        self.result.as_ref().ok().filter(|f| f.peak_known).map(|f| f.peak_allocated)
    }
}

/// Every member analysed, in their order.
pub fn analyze_members(members: &[Member]) -> Vec<Row> {
    map_in_chunks(members, |m| Row { member: m.clone(), result: analyze_guarded(&m.path).map(|a| Figures::of(&a)) })
}

/// Max peak over median peak of the ranks of one iteration whose peaks are known.
#[derive(Clone, Debug)]
pub struct Imbalance {
    pub max: u64,
    pub max_rank: u32,
    /// The middle peak; for an even count the lower of the two middle ones, so that the median is
    /// one rank's own peak and, for two ranks, the imbalance is max over min.
    pub median: u64,
    /// `max / median`; `None` when the median is 0 bytes.
    pub ratio: Option<f64>,
    /// Ranks counted (readable, with a known peak).
    pub ranks: usize,
}

pub fn imbalance(rows: &[&Row]) -> Option<Imbalance> {
    let mut peaks: Vec<(u64, u32)> = rows.iter().filter_map(|r| r.known_peak().map(|p| (p, r.rank()))).collect();
    if peaks.is_empty() {
        return None;
    }
    // By peak, and by rank descending on a tie, so that the last is the highest peak of the
    // lowest rank that has it.
    peaks.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
    let (max, max_rank) = *peaks.last().expect("not empty");
    let median = peaks[(peaks.len() - 1) / 2].0;
    Some(Imbalance {
        max,
        max_rank,
        median,
        ratio: (median > 0).then(|| max as f64 / median as f64),
        ranks: peaks.len(),
    })
}

/// A suspect (kind and site) that one rank alone has.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Alone {
    pub kind: &'static str,
    pub label: String,
    /// No other rank has this kind at any site.
    pub kind_alone: bool,
}

/// A rank that stands out from the others of its iteration, and why.
#[derive(Clone, Debug)]
pub struct Odd {
    pub rank: u32,
    /// Suspects (kind and site) no other rank of the iteration has, in the rank's own order.
    pub alone: Vec<Alone>,
    /// Its peak over the median, when at least [`ODD_PEAK_RATIO`].
    pub peak_ratio: Option<f64>,
    pub why: String,
}

/// The odd ones out among `rows` (one iteration, one row per rank), by rank. A rank is odd when
/// it has a suspect (by kind, or by kind and site) that no other readable rank has, or when its
/// peak is at least [`ODD_PEAK_RATIO`] times the median peak. It takes two readable ranks to
/// have an odd one.
pub fn odd_ones(rows: &[&Row], imbalance: Option<&Imbalance>) -> Vec<Odd> {
    let readable: Vec<(&Row, &Figures)> = rows.iter().filter_map(|r| r.result.as_ref().ok().map(|f| (*r, f))).collect();
    if readable.len() < 2 {
        return Vec::new();
    }
    let keys = |f: &Figures| -> BTreeSet<(&'static str, String)> {
        f.suspects.iter().map(|s| (s.kind, s.label.clone())).collect()
    };
    let mut out = Vec::new();
    for (i, (row, f)) in readable.iter().enumerate() {
        let (mut other_kinds, mut other_keys) = (BTreeSet::new(), BTreeSet::new());
        for (j, (_, g)) in readable.iter().enumerate() {
            if j != i {
                other_kinds.extend(g.suspects.iter().map(|s| s.kind));
                other_keys.extend(keys(g));
            }
        }
        let mut alone: Vec<Alone> = Vec::new();
        for s in &f.suspects {
            let a = Alone { kind: s.kind, label: s.label.clone(), kind_alone: !other_kinds.contains(s.kind) };
            if !other_keys.contains(&(s.kind, s.label.clone())) && !alone.contains(&a) {
                alone.push(a);
            }
        }
        let peak_ratio = match (row.known_peak(), imbalance) {
            (Some(p), Some(im)) if im.median > 0 => Some(p as f64 / im.median as f64).filter(|r| *r >= ODD_PEAK_RATIO),
            _ => None,
        };
        if alone.is_empty() && peak_ratio.is_none() {
            continue;
        }
        let why = why(row.rank(), f, &alone, peak_ratio, imbalance);
        out.push(Odd { rank: row.rank(), alone, peak_ratio, why });
    }
    out
}

/// `a`, `a and b`, `a, b and c`.
fn and_list(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [rest @ .., last] => format!("{} and {last}", rest.join(", ")),
    }
}

/// The sentence that says why a rank is odd: the suspects it alone has, then its peak.
fn why(rank: u32, f: &Figures, alone: &[Alone], peak_ratio: Option<f64>, im: Option<&Imbalance>) -> String {
    let mut parts = Vec::new();
    if !alone.is_empty() {
        let named: Vec<String> = alone.iter().map(|a| format!("{} at {}", a.kind, printable(&a.label))).collect();
        let mut s = format!("rank {rank} alone has {}", and_list(&named));
        let elsewhere: BTreeSet<&str> = alone.iter().filter(|a| !a.kind_alone).map(|a| a.kind).collect();
        if !elsewhere.is_empty() {
            let kinds: Vec<String> = elsewhere.iter().map(|k| k.to_string()).collect();
            s.push_str(&format!(" (other ranks have {} at other sites only)", and_list(&kinds)));
        }
        parts.push(s);
    }
    if let (Some(ratio), Some(im)) = (peak_ratio, im) {
        let subject = if parts.is_empty() { format!("rank {rank}'s") } else { "its".to_string() };
        parts.push(format!(
            "{subject} peak allocated ({}) is {ratio:.2} times the median of {} ({})",
            fmt_bytes(f.peak_allocated),
            memsnap_model::plural(im.ranks as u64, "rank", "ranks"),
            fmt_bytes(im.median)
        ));
    }
    let mut s = parts.join("; ");
    if let Some(first) = s.get(..1) {
        s = first.to_ascii_uppercase() + &s[1..];
    }
    s.push('.');
    s
}

/// The rows of one iteration (or of the whole job when the paths name no iterations).
pub struct Group<'a> {
    pub iteration: Option<&'a Iteration>,
    pub rows: Vec<&'a Row>,
    pub imbalance: Option<Imbalance>,
    pub odd: Vec<Odd>,
}

/// The rows by iteration, in iteration order (files without an iteration first).
pub fn groups(rows: &[Row]) -> Vec<Group<'_>> {
    let mut by: BTreeMap<Option<&Iteration>, Vec<&Row>> = BTreeMap::new();
    for r in rows {
        by.entry(r.member.place.iteration.as_ref()).or_default().push(r);
    }
    by.into_iter()
        .map(|(iteration, rows)| {
            let imbalance = imbalance(&rows);
            let odd = odd_ones(&rows, imbalance.as_ref());
            Group { iteration, rows, imbalance, odd }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::job::names::Place;

    fn row(rank: u32, peak: u64, suspects: &[(&'static str, &str)]) -> Row {
        Row {
            member: Member {
                shown: format!("rank{rank}.pickle"),
                path: PathBuf::from(format!("rank{rank}.pickle")),
                place: Place { rank, iteration: None },
            },
            result: Ok(Figures {
                device: 0,
                devices: vec![0],
                peak_allocated: peak,
                peak_reserved: peak,
                peak_known: true,
                growth: Some(0),
                allocated_at_dump: 0,
                reserved_at_dump: 0,
                suspects: suspects
                    .iter()
                    .map(|(kind, label)| SuspectBrief {
                        kind,
                        severity: "leak",
                        device: 0,
                        bytes: 1 << 20,
                        growth_bytes_per_iteration: None,
                        growth_unit: "iteration",
                        site: None,
                        label: label.to_string(),
                    })
                    .collect(),
            }),
        }
    }

    #[test]
    fn the_median_of_an_even_count_is_the_lower_middle() {
        let rows = [row(0, 100, &[]), row(1, 300, &[]), row(2, 200, &[]), row(3, 1000, &[])];
        let im = imbalance(&rows.iter().collect::<Vec<_>>()).unwrap();
        assert_eq!((im.max, im.max_rank, im.median, im.ranks), (1000, 3, 200, 4));
        assert_eq!(im.ratio, Some(5.0));
        let two = [row(0, 100, &[]), row(1, 205, &[])];
        let im = imbalance(&two.iter().collect::<Vec<_>>()).unwrap();
        assert_eq!((im.median, im.ratio), (100, Some(2.05)));
        // On a tie the lowest rank holds the max.
        let tie = [row(0, 5, &[]), row(1, 5, &[])];
        assert_eq!(imbalance(&tie.iter().collect::<Vec<_>>()).unwrap().max_rank, 0);
    }

    #[test]
    fn a_suspect_only_one_rank_has_makes_it_odd() {
        let rows = [
            row(0, 100, &[("fragmentation", "a.py:1 (f)")]),
            row(1, 100, &[("fragmentation", "a.py:1 (f)"), ("retained_graph", "t.py:5 (g)")]),
            row(2, 100, &[("fragmentation", "a.py:1 (f)")]),
        ];
        let refs: Vec<&Row> = rows.iter().collect();
        let odd = odd_ones(&refs, imbalance(&refs).as_ref());
        assert_eq!(odd.len(), 1);
        assert_eq!(odd[0].rank, 1);
        assert_eq!(odd[0].why, "Rank 1 alone has retained_graph at t.py:5 (g).");
        // A kind the others have, at a site they do not.
        let rows = [row(0, 100, &[("reference_leak", "a.py:1 (f)")]), row(1, 100, &[("reference_leak", "b.py:2 (h)")])];
        let refs: Vec<&Row> = rows.iter().collect();
        let odd = odd_ones(&refs, imbalance(&refs).as_ref());
        assert_eq!(odd.len(), 2);
        assert_eq!(
            odd[1].why,
            "Rank 1 alone has reference_leak at b.py:2 (h) (other ranks have reference_leak at other sites only)."
        );
    }

    #[test]
    fn a_peak_far_above_the_median_makes_a_rank_odd() {
        let at = |p: u64| {
            let rows = [row(0, 1000, &[]), row(1, 1000, &[]), row(2, p, &[]), row(3, 1000, &[])];
            let refs: Vec<&Row> = rows.iter().collect();
            odd_ones(&refs, imbalance(&refs).as_ref())
        };
        assert!(at(1199).is_empty());
        let odd = at(1200);
        assert_eq!(odd.len(), 1);
        assert_eq!(odd[0].why, "Rank 2's peak allocated (1.17 KiB) is 1.20 times the median of 4 ranks (1000 B).");
        // Alone, a rank is nobody's odd one out.
        let one = [row(0, 1000, &[("oom", "x.py:1 (f)")])];
        assert!(odd_ones(&one.iter().collect::<Vec<_>>(), None).is_empty());
    }

    #[test]
    fn an_unreadable_rank_is_left_out_of_the_comparison() {
        let mut bad = row(1, 0, &[]);
        bad.result = Err("truncated".into());
        let rows = [row(0, 100, &[]), bad, row(2, 100, &[("oom", "x.py:1 (f)")])];
        let refs: Vec<&Row> = rows.iter().collect();
        let im = imbalance(&refs).unwrap();
        assert_eq!(im.ranks, 2);
        let odd = odd_ones(&refs, Some(&im));
        assert_eq!(odd.iter().map(|o| o.rank).collect::<Vec<_>>(), [2]);
    }
}
