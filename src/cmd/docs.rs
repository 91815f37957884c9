//! `memsnap docs [TOPIC]`: the manual pages under `docs/`, built into the binary, so that what
//! `--help` points to is there for an installed binary as much as in a clone of the repository.

use crate::emit::emit;
use crate::exit::Exit;

#[derive(clap::Args)]
pub struct Args {
    /// The page to print; without one, the list of pages.
    pub topic: Option<String>,
}

/// (topic, what it covers, the page), in the order they are listed.
pub const PAGES: &[(&str, &str, &str)] = &[
    ("detectors", "what each suspect means, its evidence and its fix", include_str!("../../docs/detectors.md")),
    ("json", "the --json output of every command, field by field", include_str!("../../docs/json.md")),
    ("report", "the HTML/SVG report", include_str!("../../docs/report.md")),
    ("check", "the CI gate: limits, --fail-on, exit codes", include_str!("../../docs/check.md")),
    ("diff", "comparing two snapshots", include_str!("../../docs/diff.md")),
    (
        "ranks",
        "one job's per-rank dumps: imbalance, the odd rank out, two runs diffed rank by rank",
        include_str!("../../docs/ranks.md"),
    ),
    ("batch", "one row per snapshot over an archive; resuming", include_str!("../../docs/batch.md")),
    ("archives", "archives as tables: Parquet, DuckDB, Polars, Ray Data", include_str!("../../docs/archives.md")),
    ("replay", "how the allocator is replayed to the byte", include_str!("../../docs/replay.md")),
    ("format", "the snapshot pickle, key by key, and which PyTorch wrote what", include_str!("../../docs/format.md")),
    ("performance", "speed and memory, measured", include_str!("../../docs/performance.md")),
];

pub fn run(args: &Args) -> anyhow::Result<Exit> {
    let Some(topic) = &args.topic else {
        let mut list = String::from("memsnap docs TOPIC prints one of these pages:\n\n");
        for (name, what, _) in PAGES {
            list.push_str(&format!("  {name:<12} {what}\n"));
        }
        emit(&list)?;
        return Ok(Exit::SUCCESS);
    };
    match PAGES.iter().find(|(name, _, _)| name == topic) {
        Some((_, _, page)) => emit(page)?,
        None => {
            let names: Vec<&str> = PAGES.iter().map(|p| p.0).collect();
            anyhow::bail!("no page {:?}; the pages are: {}", topic, names.join(", "));
        }
    }
    Ok(Exit::SUCCESS)
}
