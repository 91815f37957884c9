//! The command line: its arguments (clap), and running one command line to the end with the
//! output and inputs of an [`Invocation`].

use std::ffi::OsString;
use std::sync::Arc;

use clap::{Parser, Subcommand};

use crate::cmd;
use crate::emit;
use crate::exit::Exit;
use crate::invocation::{self, Invocation, Setup};
use crate::sink::Sink;

/// Offline analyzer for PyTorch CUDA memory snapshots (`torch.cuda.memory._dump_snapshot`).
#[derive(Parser)]
#[command(
    name = "memsnap",
    version,
    about,
    long_about = None,
    after_help = "Start with `memsnap analyze FILE`. The manual is in the binary: `memsnap docs` lists its topics."
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    command: Command,
    /// No progress on stderr (it is shown only when stderr is a terminal anyway).
    #[arg(short, long, global = true)]
    quiet: bool,
    /// Read traces with the sequential pickle reader only, on one thread (the parallel reader's
    /// reference; same output, slower). For troubleshooting.
    #[arg(long, global = true)]
    sequential_reader: bool,
}

#[derive(Subcommand)]
pub(crate) enum Command {
    /// Totals per device, segments by pool, blocks by state, trace coverage, allocator settings.
    #[command(after_help = "Example:\n  memsnap summary run.pickle          (or run.pickle.xz, or - for stdin)")]
    Summary(cmd::summary::Args),
    /// Replay the trace and name the suspects (leaks, fragmentation, OOMs) at the user's line.
    #[command(after_help = "Example:\n  memsnap analyze rank0.pickle --json > analysis.json")]
    Analyze(cmd::analyze::Args),
    /// Allocated/reserved/active/requested bytes over time.
    #[command(after_help = "Example:\n  memsnap timeline run.pickle --csv --every 100 > timeline.csv")]
    Timeline(cmd::timeline::Args),
    /// Segment map with per-segment allocated, free and fragmentation.
    #[command(
        after_help = "Example:\n  memsnap segments run.pickle --at peak        (start, end, oom, event:N, +1.5s, iteration:K)"
    )]
    Segments(cmd::segments::Args),
    /// The trace as readable events, stacks summarised to the user's frame.
    #[command(after_help = "Example:\n  memsnap trace run.pickle --device 0 | less")]
    Trace(cmd::trace::Args),
    /// Self-contained HTML or SVG report: verdict, timeline, segment map, flamegraph.
    #[command(after_help = "Example:\n  memsnap report run.pickle -o report.html")]
    Report(cmd::report::Args),
    /// Live memory by stack as folded stacks or an SVG flamegraph.
    #[command(after_help = "Example:\n  memsnap flamegraph run.pickle --at peak -o peak.svg")]
    Flamegraph(cmd::flamegraph::Args),
    /// One row per snapshot over files, directories and globs (JSONL, CSV or Parquet).
    #[command(after_help = "Example:\n  memsnap batch dumps/ -o rows.parquet --jobs 4      (or rows.csv, rows.jsonl)")]
    Batch(cmd::batch::Args),
    /// CI gate: exit 1 when a limit is exceeded or a suspect kind is found.
    #[command(after_help = "Example:\n  memsnap check run.pickle --max-peak 20GiB --fail-on leaks")]
    Check(cmd::check::Args),
    /// One job's per-rank dumps: peaks per rank, imbalance, the odd rank out, growth per iteration.
    #[command(
        after_help = "Example:\n  memsnap ranks snapshots/      (torchtitan: iteration_N/rankR_memory_snapshot.pickle)"
    )]
    Ranks(cmd::ranks::Args),
    /// Compare two snapshots: peaks, sites, categories, suspects.
    #[command(after_help = "Example:\n  memsnap diff before.pickle after.pickle")]
    Diff(cmd::diff::Args),
    /// Print a shell completion script: `memsnap completions bash > /etc/bash_completion.d/memsnap`.
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff): `memsnap man > /usr/local/share/man/man1/memsnap.1`.
    Man,
    /// Print a manual page of the bundled documentation: `memsnap docs json` (no topic: the list).
    #[command(after_help = "Example:\n  memsnap docs detectors | less")]
    Docs(cmd::docs::Args),
}

/// Run the command line `args` (the program name first) with `setup`'s output and inputs.
/// A malformed command line, `--help` and `--version` are answered as clap words them, to the
/// same sink.
pub(crate) fn run(args: Vec<OsString>, setup: Setup) -> Exit {
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => return answer_clap(&setup.sink, &e),
    };
    let invocation = Invocation::new(setup, cli.quiet, cli.sequential_reader);
    invocation::within(Some(Arc::new(invocation)), || dispatch(&cli))
}

/// What clap says about a command line it did not run: usage errors to stderr, help and the
/// version to stdout (styled as clap styles them on a terminal, plain to a captured sink).
fn answer_clap(sink: &Sink, e: &clap::Error) -> Exit {
    match sink {
        Sink::Stdio => {
            let _ = e.print();
        }
        Sink::Captured { .. } => {
            let text = e.render().to_string();
            if e.use_stderr() {
                sink.write_stderr(text.as_bytes());
            } else {
                let _ = sink.write_stdout(text.as_bytes());
            }
        }
    }
    Exit::from_clap(e.exit_code())
}

fn dispatch(cli: &Cli) -> Exit {
    let result = match &cli.command {
        Command::Summary(a) => cmd::summary::run(a),
        Command::Analyze(a) => cmd::analyze::run(a),
        Command::Timeline(a) => cmd::timeline::run(a),
        Command::Segments(a) => cmd::segments::run(a),
        Command::Trace(a) => cmd::trace::run(a),
        Command::Report(a) => cmd::report::run(a),
        Command::Flamegraph(a) => cmd::flamegraph::run(a),
        Command::Batch(a) => cmd::batch::run(a),
        Command::Check(a) => cmd::check::run(a),
        Command::Diff(a) => cmd::diff::run(a),
        Command::Ranks(a) => cmd::ranks::run(a),
        Command::Docs(a) => cmd::docs::run(a),
        Command::Completions { shell } => {
            let mut out = Vec::new();
            clap_complete::generate(*shell, &mut <Cli as clap::CommandFactory>::command(), "memsnap", &mut out);
            emit::emit_raw(&String::from_utf8_lossy(&out)).map(|()| Exit::SUCCESS)
        }
        Command::Man => {
            let mut out = Vec::new();
            clap_mangen::Man::new(<Cli as clap::CommandFactory>::command())
                .render(&mut out)
                .map_err(anyhow::Error::from)
                .and_then(|()| emit::emit_raw(&String::from_utf8_lossy(&out)))
                .map(|()| Exit::SUCCESS)
        }
    };
    match result {
        Ok(code) => code,
        Err(e) => emit::report_error(&e),
    }
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::Cli;

    /// Every command's help ends with an example, and the example is a command line that
    /// parses (up to a pipe, a redirection or a parenthesised note).
    #[test]
    fn every_command_has_an_example_that_parses() {
        let cli = Cli::command();
        let mut checked = 0;
        for sub in cli.get_subcommands().filter(|s| !matches!(s.get_name(), "completions" | "man" | "help")) {
            let help = sub.get_after_help().map(|h| h.to_string()).unwrap_or_default();
            let line = help
                .strip_prefix("Example:\n  ")
                .unwrap_or_else(|| panic!("`memsnap {}` has no example: {help:?}", sub.get_name()));
            let words: Vec<&str> =
                line.split_whitespace().take_while(|w| !matches!(*w, "|" | ">" | "<") && !w.starts_with('(')).collect();
            assert_eq!(words.get(1), Some(&sub.get_name()), "{line}");
            if let Err(e) = Cli::try_parse_from(&words) {
                panic!("the example of `memsnap {}` does not parse: {line}\n{e}", sub.get_name());
            }
            checked += 1;
        }
        assert!(checked >= 11, "{checked}");
    }

    /// Every page `memsnap docs` lists is a page of the repository's docs/, and every page
    /// there but the developers' own is listed.
    #[test]
    fn docs_pages_are_the_repository_docs() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs");
        let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str()?.strip_suffix(".md").map(str::to_string))
            .collect();
        on_disk.sort();
        let mut listed: Vec<String> = crate::cmd::docs::PAGES.iter().map(|p| p.0.to_string()).collect();
        listed.sort();
        assert_eq!(listed, on_disk);
        for (name, _, page) in crate::cmd::docs::PAGES {
            assert_eq!(*page, std::fs::read_to_string(dir.join(format!("{name}.md"))).unwrap());
        }
    }
}
