//! `memsnap check FILE [--max-peak SIZE] [--max-reserved SIZE] [--fail-on KIND,...]`: a CI gate.
//! Prints one line per failed gate on stdout and exits 1; exits 0 when every gate passes and 2
//! when the file cannot be read or a gate is malformed. See docs/check.md.

use std::fmt::Write as _;

use memsnap_analysis::{Severity, SuspectKind};

use crate::emit::{emit, shown_path};
use crate::exit::Exit;
use crate::pipeline::analyze_file;
use crate::pipeline::device_figures;
use crate::size;

/// Every suspect kind, in the order the docs list them.
const KINDS: [SuspectKind; 6] = SuspectKind::ALL;

#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("gates").required(true).multiple(true).args(["max_peak", "max_reserved", "fail_on"])))]
pub struct Args {
    #[command(flatten)]
    pub snapshot: crate::args::SnapshotFile,
    /// Fail when any device's peak of allocated bytes exceeds SIZE (e.g. 20GiB, 500MB, 1.5G;
    /// K/M/G/T alone are binary).
    #[arg(long, value_name = "SIZE", value_parser = size::parse)]
    pub max_peak: Option<u64>,
    /// Fail when any device's peak of reserved bytes (what the caching allocator took from the
    /// driver) exceeds SIZE.
    #[arg(long, value_name = "SIZE", value_parser = size::parse)]
    pub max_reserved: Option<u64>,
    /// Fail when a suspect of one of these kinds is found: oom, retained_graph, no_grad_missing,
    /// unreleased_gradient, reference_leak, fragmentation, or `leaks` (the four leak kinds) or
    /// `all`. Comma-separated or repeated.
    #[arg(long, value_name = "KIND,...", value_delimiter = ',')]
    pub fail_on: Vec<String>,
}

/// What `--fail-on` names: suspect kinds and severities. A suspect fails the gate when its kind
/// or its severity is named.
#[derive(Debug, Default, PartialEq, Eq)]
struct FailOn {
    kinds: Vec<SuspectKind>,
    severities: Vec<Severity>,
}

impl FailOn {
    fn is_empty(&self) -> bool {
        self.kinds.is_empty() && self.severities.is_empty()
    }
    fn matches(&self, s: &memsnap_analysis::Suspect) -> bool {
        self.kinds.contains(&s.kind) || self.severities.contains(&s.severity)
    }
}

/// The kinds and severities named by `--fail-on` (`leaks` is the severity `leak`: suspects
/// that grow without bound); an unknown name is an error that lists the valid ones.
fn parse_fail_on(names: &[String]) -> anyhow::Result<FailOn> {
    let mut f = FailOn::default();
    for name in names.iter().map(|n| n.trim()).filter(|n| !n.is_empty()) {
        match name {
            "all" => f.kinds.extend(KINDS),
            "leaks" => f.severities.push(Severity::Leak),
            _ => match (SuspectKind::parse(name), Severity::parse(name)) {
                (Some(k), _) => f.kinds.push(k),
                (None, Some(s)) => f.severities.push(s),
                (None, None) => {
                    let valid: Vec<&str> = KINDS.iter().map(|k| k.name()).collect();
                    anyhow::bail!(
                        "--fail-on: unknown suspect kind or severity {name:?}; valid kinds: {}; severities: leak, held, peak, waste; or leaks (= leak), all",
                        valid.join(", ")
                    );
                }
            },
        }
    }
    anyhow::ensure!(names.is_empty() || !f.is_empty(), "--fail-on: no suspect kind given");
    f.kinds.sort();
    f.kinds.dedup();
    f.severities.sort();
    f.severities.dedup();
    Ok(f)
}

pub fn run(args: &Args) -> anyhow::Result<Exit> {
    // Gates are checked before the file is read: a typo should not wait for a multi-GB load.
    let fail_on = parse_fail_on(&args.fail_on)?;
    let a = analyze_file(&args.snapshot.file)?;
    let shown = shown_path(&args.snapshot.file);
    let mut failures = String::new();
    let mut gates = 0;
    let figures = device_figures(&a);
    let limits = [
        (
            "max-peak",
            "peak allocated",
            args.max_peak,
            figures.iter().map(|d| (d.device, d.peak_allocated_bytes)).collect::<Vec<_>>(),
        ),
        (
            "max-reserved",
            "peak reserved",
            args.max_reserved,
            figures.iter().map(|d| (d.device, d.peak_reserved_bytes)).collect(),
        ),
    ];
    for (gate, what, limit, values) in limits {
        let values: Vec<(u32, u64)> = values
            .into_iter()
            .filter(|(d, _)| memsnap_model::find_device(&figures, *d, |f| f.device).is_some_and(|f| f.peak_known))
            .collect();
        let Some(limit) = limit else { continue };
        gates += 1;
        for d in figures.iter().filter(|d| !d.peak_known) {
            let _ = writeln!(
                failures,
                "{shown}: {gate} failed: device {} {what} is unknown: the file has no trace for it (a state-only recording), so the peak cannot be established",
                d.device,
            );
        }
        for (device, value) in values.into_iter().filter(|&(_, v)| v > limit) {
            let _ = writeln!(
                failures,
                "{shown}: {gate} failed: device {device} {what} {} ({value} bytes) > limit {} ({limit} bytes)",
                size::format(value),
                size::format(limit),
            );
        }
    }
    if !fail_on.is_empty() {
        gates += 1;
        for s in a.analysis.suspects().into_iter().filter(|s| fail_on.matches(s)) {
            let site = s.site.as_ref().map_or("(no user frame)".to_string(), |x| {
                format!("{}:{} in {}", memsnap_model::shown(&x.filename), x.line, memsnap_model::shown(&x.function))
            });
            let _ = writeln!(
                failures,
                "{shown}: fail-on {} ({}) found: device {}, {} at {site} (confidence {:.2})",
                s.kind.name(),
                s.severity.name(),
                s.device,
                size::format(s.bytes),
                s.confidence,
            );
        }
    }
    if failures.is_empty() {
        crate::emit::stderr_line(&format!("memsnap check: {shown}: passed ({gates} {})", plural(gates, "gate")));
        return Ok(Exit::SUCCESS);
    }
    emit(&failures)?;
    let n = failures.lines().count();
    crate::emit::stderr_line(&format!("memsnap check: {shown}: FAILED ({n} {})", plural(n, "failure")));
    Ok(Exit::GATE_FAILED)
}

fn plural(n: usize, word: &str) -> String {
    if n == 1 {
        word.to_string()
    } else {
        format!("{word}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: &[&str]) -> anyhow::Result<FailOn> {
        parse_fail_on(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn kinds_and_severities() {
        let f = parse(&["oom", " fragmentation", "oom"]).unwrap();
        assert_eq!(f.kinds, vec![SuspectKind::Oom, SuspectKind::Fragmentation]);
        assert!(f.severities.is_empty());
        // `leaks` is the severity `leak`, not the four leak kinds: a bounded waste passes it.
        let f = parse(&["leaks"]).unwrap();
        assert!(f.kinds.is_empty());
        assert_eq!(f.severities, vec![Severity::Leak]);
        assert_eq!(parse(&["peak", "waste"]).unwrap().severities, vec![Severity::Peak, Severity::Waste]);
        assert_eq!(parse(&["all"]).unwrap().kinds.len(), KINDS.len());
        let err = parse(&["oom", "leakz"]).unwrap_err().to_string();
        assert!(err.contains("\"leakz\"") && err.contains("retained_graph") && err.contains("waste"), "{err}");
        // Every kind and severity the analysis knows is accepted.
        for k in KINDS {
            assert_eq!(SuspectKind::parse(k.name()), Some(k));
        }
        for s in Severity::ALL {
            assert_eq!(Severity::parse(s.name()), Some(s));
        }
    }
}
