//! `memsnap check FILE [--max-peak SIZE] [--max-reserved SIZE] [--fail-on KIND,...]`: a CI gate.
//! Prints one line per failed gate on stdout and exits 1; exits 0 when every gate passes and 2
//! when the file cannot be read or a gate is malformed. See docs/check.md.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use memsnap_analysis::SuspectKind;

use crate::cmd::analyze::analyze_file;
use crate::cmd::batch::device_figures;
use crate::cmd::emit;
use crate::size;

/// Every suspect kind, in the order the docs list them.
const KINDS: [SuspectKind; 6] = SuspectKind::ALL;

#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("gates").required(true).multiple(true).args(["max_peak", "max_reserved", "fail_on"])))]
pub struct Args {
    /// Snapshot file (`-` for stdin); gzip, zstd and xz are detected by content.
    pub file: PathBuf,
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

/// The kinds named by `--fail-on`, in [`KINDS`] order; an unknown name is an error that lists
/// the valid ones.
fn parse_kinds(names: &[String]) -> anyhow::Result<Vec<SuspectKind>> {
    let mut kinds = Vec::new();
    for name in names.iter().map(|n| n.trim()).filter(|n| !n.is_empty()) {
        match name {
            "all" => kinds.extend(KINDS),
            "leaks" => kinds.extend(KINDS.into_iter().filter(|k| k.is_leak())),
            _ => match SuspectKind::parse(name) {
                Some(k) => kinds.push(k),
                None => {
                    let valid: Vec<&str> = KINDS.iter().map(|k| k.name()).collect();
                    anyhow::bail!(
                        "--fail-on: unknown suspect kind {name:?}; valid kinds: {}, or leaks, all",
                        valid.join(", ")
                    );
                }
            },
        }
    }
    anyhow::ensure!(names.is_empty() || !kinds.is_empty(), "--fail-on: no suspect kind given");
    kinds.sort();
    kinds.dedup();
    Ok(kinds)
}

pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    // Gates are checked before the file is read: a typo should not wait for a multi-GB load.
    let kinds = parse_kinds(&args.fail_on)?;
    let a = analyze_file(&args.file)?;
    let shown = args.file.display();
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
        let Some(limit) = limit else { continue };
        gates += 1;
        for (device, value) in values.into_iter().filter(|&(_, v)| v > limit) {
            let _ = writeln!(
                failures,
                "{shown}: {gate} failed: device {device} {what} {} ({value} bytes) > limit {} ({limit} bytes)",
                size::format(value),
                size::format(limit),
            );
        }
    }
    if !kinds.is_empty() {
        gates += 1;
        for s in a.analysis.suspects().into_iter().filter(|s| kinds.contains(&s.kind)) {
            let site = s
                .site
                .as_ref()
                .map_or("(no user frame)".to_string(), |x| format!("{}:{} in {}", x.filename, x.line, x.function));
            let _ = writeln!(
                failures,
                "{shown}: fail-on {} found: device {}, {} at {site} (confidence {:.2})",
                s.kind.name(),
                s.device,
                size::format(s.bytes),
                s.confidence,
            );
        }
    }
    if failures.is_empty() {
        eprintln!("memsnap check: {shown}: passed ({gates} {})", plural(gates, "gate"));
        return Ok(ExitCode::SUCCESS);
    }
    emit(&failures)?;
    let n = failures.lines().count();
    eprintln!("memsnap check: {shown}: FAILED ({n} {})", plural(n, "failure"));
    Ok(ExitCode::from(1))
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

    #[test]
    fn kinds() {
        let names = |v: &[&str]| parse_kinds(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(
            names(&["oom", " fragmentation", "oom"]).unwrap(),
            vec![SuspectKind::Oom, SuspectKind::Fragmentation]
        );
        assert_eq!(names(&["leaks"]).unwrap().len(), 4);
        assert_eq!(names(&["all"]).unwrap().len(), KINDS.len());
        let err = names(&["oom", "leak"]).unwrap_err().to_string();
        assert!(err.contains("\"leak\"") && err.contains("retained_graph") && err.contains("fragmentation"), "{err}");
        // Every kind the analysis knows is listed here.
        for k in KINDS {
            assert_eq!(SuspectKind::parse(k.name()), Some(k));
        }
    }
}
