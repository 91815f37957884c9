//! `memsnap`: the command-line front end. Thin glue over the library crates; the only place that
//! touches files, the environment and the terminal.

mod alloc;
mod cmd;
mod emit;
mod input;
mod json;
mod json_stream;
mod load;
mod moment;
mod output;
mod pipeline;
mod progress;
mod size;
mod text;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[global_allocator]
static ALLOCATOR: alloc::ExitOnFailure = alloc::ExitOnFailure;

/// Offline analyzer for PyTorch CUDA memory snapshots (`torch.cuda.memory._dump_snapshot`).
#[derive(Parser)]
#[command(name = "memsnap", version, about, long_about = None)]
struct Cli {
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
enum Command {
    /// Totals per device, segments by pool, blocks by state, trace coverage, allocator settings.
    Summary(cmd::summary::Args),
    /// Replay the trace and name the suspects (leaks, fragmentation, OOMs) at the user's line.
    Analyze(cmd::analyze::Args),
    /// Allocated/reserved/active/requested bytes over time.
    Timeline(cmd::timeline::Args),
    /// Segment map with per-segment allocated, free and fragmentation.
    Segments(cmd::segments::Args),
    /// The trace as readable events, stacks summarised to the user's frame.
    Trace(cmd::trace::Args),
    /// Self-contained HTML or SVG report: verdict, timeline, segment map, flamegraph.
    Report(cmd::report::Args),
    /// Live memory by stack as folded stacks or an SVG flamegraph.
    Flamegraph(cmd::flamegraph::Args),
    /// One row per snapshot over files, directories and globs (JSONL or CSV).
    Batch(cmd::batch::Args),
    /// CI gate: exit 1 when a limit is exceeded or a suspect kind is found.
    Check(cmd::check::Args),
    /// Compare two snapshots: peaks, sites, categories, suspects.
    Diff(cmd::diff::Args),
    /// Print a shell completion script: `memsnap completions bash > /etc/bash_completion.d/memsnap`.
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff): `memsnap man > /usr/local/share/man/man1/memsnap.1`.
    Man,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    progress::init(cli.quiet);
    load::set_sequential_reader(cli.sequential_reader);
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
        Command::Completions { shell } => {
            let mut out = Vec::new();
            clap_complete::generate(*shell, &mut <Cli as clap::CommandFactory>::command(), "memsnap", &mut out);
            emit::emit_raw(&String::from_utf8_lossy(&out)).map(|()| ExitCode::SUCCESS)
        }
        Command::Man => {
            let mut out = Vec::new();
            clap_mangen::Man::new(<Cli as clap::CommandFactory>::command())
                .render(&mut out)
                .map_err(anyhow::Error::from)
                .and_then(|()| emit::emit_raw(&String::from_utf8_lossy(&out)))
                .map(|()| ExitCode::SUCCESS)
        }
    };
    match result {
        Ok(code) => code,
        Err(e) => emit::report_error(&e),
    }
}
