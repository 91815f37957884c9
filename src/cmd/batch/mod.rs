//! `memsnap batch PATH... [-o rows.jsonl|rows.csv|rows.parquet] [--jobs N]`: one row per
//! snapshot over files, directories (walked recursively) and glob patterns, and a row with
//! `error` for every file that cannot be read, then on to the next.
//!
//! Files are analysed on a pool of `--jobs` threads. They are admitted in input order against a
//! budget of pickle bytes in flight, so an archive of multi-GB dumps never has more of them in
//! memory at once than fit. Rows are written in input order whatever the thread count or timing:
//! the output is byte-identical for every `--jobs`. With `-o OUT` the rows go to `OUT.partial`,
//! which replaces OUT at the end (for Parquet, [`parquet`] converts it into OUT), and `--resume`
//! continues an interrupted run from it to the same bytes. See docs/batch.md.
//!
//! The parts: [`crate::discovery`] turns the arguments into inputs, [`budget`] estimates what each
//! costs and how much may be in flight, [`rows`] analyses a file into a row and writes it as
//! JSON or CSV, [`resume`] opens the output and finds what an interrupted run left, and
//! [`parquet`] turns the finished JSON Lines rows into a Parquet file. This module holds the
//! arguments and the loop that admits, schedules and writes.

mod budget;
mod parquet;
mod resume;
mod rows;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::mpsc;

use memsnap_model::printable;

use crate::discovery::{Discovery, Input};
use crate::emit::shown_path;
use crate::exit::Exit;
use crate::output;

use budget::{default_budget, estimate_pickle_bytes, Estimate};
use resume::{input_key, open_output};
use rows::{analyze_row, row_line, Outcome, Row};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// One JSON object per line.
    Jsonl,
    /// Comma-separated values with a header line (RFC 4180 quoting).
    Csv,
    /// Apache Parquet, one file written when the batch is done (needs `-o FILE`).
    Parquet,
}

#[derive(clap::Args)]
pub struct Args {
    /// Snapshot files, directories (walked recursively) and glob patterns such as
    /// 'runs/**/*.pickle.gz'. In directories only *.pickle and *.pkl files (optionally .gz, .zst
    /// or .xz) are read; a file named explicitly or matched by a pattern is always read.
    #[arg(required = true, value_name = "PATH")]
    pub paths: Vec<PathBuf>,
    /// Where to write the rows; `.csv` writes CSV, `.parquet` Parquet, anything else JSON Lines.
    /// Default: stdout (not for Parquet, which is written whole at the end). FILE is replaced
    /// only when the batch is done; meanwhile finished rows are kept in `FILE.partial` (JSON
    /// Lines for Parquet, converted at the end).
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Continue an interrupted run with `-o FILE` (same arguments): keep the complete rows in
    /// `FILE.partial` and read only the inputs it has no row for. The result is the same bytes
    /// as an uninterrupted run.
    #[arg(long)]
    pub resume: bool,
    /// Row format, overriding the output file's extension.
    #[arg(long, value_enum)]
    pub format: Option<Format>,
    /// Worker threads [default: the available cores].
    #[arg(short, long, value_name = "N")]
    pub jobs: Option<usize>,
    /// Most pickle bytes (after decompression) being read at once, e.g. 8GiB [default: a third
    /// of the available memory]. A file larger than this is read alone. A compressed file is
    /// admitted at the size its header or index states (or 32 times its size when it states
    /// none) and held to it: one that turns out larger is stopped and read again alone.
    #[arg(long, value_name = "SIZE", value_parser = crate::size::parse)]
    pub max_inflight_bytes: Option<u64>,
    /// Suspects listed per row (the highest ranked).
    #[arg(long, default_value_t = 3, value_name = "N")]
    pub top: usize,
}

/// How often the progress bar is brought up to date while files are being read.
const PROGRESS_TICK: std::time::Duration = std::time::Duration::from_millis(200);

pub fn run(args: &Args) -> anyhow::Result<Exit> {
    crate::progress::per_file_off();
    let jobs = args.jobs.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    anyhow::ensure!(jobs >= 1, "--jobs must be at least 1");
    let budget = args.max_inflight_bytes.unwrap_or_else(default_budget);

    let mut disc = Discovery::default();
    for arg in &args.paths {
        disc.add_arg(arg);
    }
    let (mut out, format, out_name, to_stdout, mut resumed) = open_output(args, |format| {
        disc.inputs
            .iter()
            .map(|i| match i {
                Input::File { shown, .. } | Input::Error { shown, .. } => input_key(shown, format),
            })
            .collect()
    })?;
    // Inputs whose rows an interrupted run already wrote are not read again: the first
    // `resumed.prefix` are in the file, later ones are written again from `reused`.
    let mut reused: BTreeMap<usize, (String, bool)> = BTreeMap::new();
    let mut inputs: Vec<Input> = Vec::new();
    for (i, input) in std::mem::take(&mut disc.inputs).into_iter().enumerate() {
        if i < resumed.prefix {
            continue;
        }
        let shown = match &input {
            Input::File { shown, .. } | Input::Error { shown, .. } => shown,
        };
        match resumed.later.remove(&input_key(shown, format)) {
            Some(line) => {
                reused.insert(i, line);
            }
            None => inputs.push(input),
        }
    }
    let kept = resumed.prefix + reused.len();

    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(jobs)
        // Reading happens on these threads rather than the main one: give them its usual stack.
        .stack_size(8 << 20)
        .thread_name(|i| format!("memsnap-batch-{i}"))
        .build()?;
    // On a terminal only, and not when the rows themselves go to the same terminal.
    let rows_on_terminal = to_stdout && crate::emit::stdout_is_terminal();
    // The bar runs over stored bytes (what takes the time); the message counts files.
    let total_bytes: u64 = inputs
        .iter()
        .filter_map(|i| match i {
            Input::File { path, .. } => std::fs::metadata(path).ok().filter(|m| m.is_file()).map(|m| m.len()),
            Input::Error { .. } => None,
        })
        .sum();
    let (mut files_done, files_total) = (0usize, inputs.len());
    // The count is the bar's prefix, which is never cut; the last file's name may be.
    let files_prefix = |done: usize| format!("{done}/{files_total} files");
    let progress = if crate::progress::shown() && !rows_on_terminal {
        let pb = indicatif::ProgressBar::with_draw_target(Some(total_bytes), indicatif::ProgressDrawTarget::stderr());
        if let Ok(style) = indicatif::ProgressStyle::with_template(
            "{elapsed_precise} {prefix} [{bar:30}] {bytes}/{total_bytes} ({bytes_per_sec}) {wide_msg}",
        ) {
            pb.set_style(style.progress_chars("=> "));
        }
        pb
    } else {
        indicatif::ProgressBar::hidden()
    };
    progress.set_prefix(files_prefix(0));

    // Admission runs on this thread, outside the pool, and workers never wait: a worker blocked
    // on the budget could otherwise be handed another file's task by rayon's work stealing while
    // it holds the budget itself, and deadlock.
    let (tx, rx) = mpsc::channel::<(usize, Outcome, u64)>();
    let (mut next, mut running, mut in_flight) = (0usize, 0usize, 0u64);
    let mut next_cost: Option<Option<Estimate>> = None;
    // Inputs that outgrew their estimate, to be read again alone and without a cap.
    let mut again: Vec<usize> = Vec::new();
    let spawn = |index: usize, path: PathBuf, shown: String, cap: Option<u64>, cost: u64| {
        let (tx, top, invocation) = (tx.clone(), args.top, crate::invocation::current());
        pool.spawn(move || {
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                crate::invocation::within(invocation, || analyze_row(&path, shown.clone(), top, cap))
            }))
            .unwrap_or_else(|panic| {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                Outcome::Row(Row {
                    path: shown,
                    file_bytes: None,
                    result: Err(format!("internal error (a bug in memsnap): {what}")),
                })
            });
            let _ = tx.send((index, outcome, cost));
        });
    };
    // Rows by their index in `inputs`; `written` counts rows over all inputs (resumed ones too).
    let mut done: BTreeMap<usize, Row> = BTreeMap::new();
    let (mut written, mut written_read, mut errors) = (resumed.prefix, 0usize, resumed.prefix_errors);
    loop {
        if running == 0 {
            if let Some(index) = again.pop() {
                if let Input::File { shown, path } = &inputs[index] {
                    running += 1;
                    in_flight = budget;
                    spawn(index, path.clone(), shown.clone(), None, budget);
                }
            }
        }
        while next < inputs.len() && again.is_empty() {
            match &inputs[next] {
                Input::Error { shown, message } => {
                    done.insert(next, Row { path: shown.clone(), file_bytes: None, result: Err(message.clone()) });
                    files_done += 1;
                    progress.set_prefix(files_prefix(files_done));
                }
                Input::File { shown, path } => {
                    let estimate = *next_cost.get_or_insert_with(|| estimate_pickle_bytes(path));
                    // Unknown sizes (stdin, pipes) take the whole budget: they are read alone.
                    let cost = estimate.map_or(budget, |e| e.pickle_bytes);
                    if running > 0 && (running >= jobs || in_flight.saturating_add(cost) > budget) {
                        break;
                    }
                    next_cost = None;
                    running += 1;
                    in_flight = in_flight.saturating_add(cost);
                    let cap = estimate.filter(|e| !e.exact).map(|e| e.pickle_bytes);
                    spawn(next, path.clone(), shown.clone(), cap, cost);
                }
            }
            next += 1;
        }
        // Write every row whose predecessors are all written: a row kept from the partial
        // file, or the next row read.
        loop {
            if let Some((line, is_error)) = reused.remove(&written) {
                errors += usize::from(is_error);
                out.write(&line)?;
                written += 1;
                continue;
            }
            let Some(row) = done.remove(&written_read) else { break };
            errors += usize::from(row.result.is_err());
            out.write(&row_line(&row, format)?)?;
            written += 1;
            written_read += 1;
        }
        if running == 0 {
            break;
        }
        // Wake now and then to move the bar while big files are read.
        let (index, outcome, cost) = match rx.recv_timeout(PROGRESS_TICK) {
            Ok(received) => received,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                progress.set_position(crate::progress::bytes_read());
                continue;
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => anyhow::bail!("a batch worker stopped"),
        };
        progress.set_position(crate::progress::bytes_read());
        running -= 1;
        in_flight -= cost;
        let row = match outcome {
            Outcome::Row(row) => row,
            Outcome::OverCap => {
                // Read again from the start: its bytes count twice.
                if let Input::File { path, .. } = &inputs[index] {
                    progress.inc_length(std::fs::metadata(path).map_or(0, |m| m.len()));
                }
                again.push(index);
                continue;
            }
        };
        files_done += 1;
        progress.set_prefix(files_prefix(files_done));
        progress.set_message(printable(&row.path).into_owned());
        done.insert(index, row);
    }
    progress.finish_and_clear();
    out.finish()?;

    let skipped = if disc.skipped > 0 {
        format!("; {} other files skipped (not named like a snapshot, or not a regular file)", disc.skipped)
    } else {
        String::new()
    };
    // `--resume` has an output file (open_output made sure).
    let kept = match args.output.as_deref().filter(|_| args.resume) {
        Some(p) => format!(
            "; {kept} of them kept from {} ({} complete rows found)",
            shown_path(&output::partial_path(p)),
            resumed.found
        ),
        None => String::new(),
    };
    crate::emit::stderr_line(&format!(
        "memsnap batch: {written} rows ({errors} unreadable) written to {out_name}{kept}{skipped}"
    ));
    Ok(if errors > 0 { Exit::UNREADABLE } else { Exit::SUCCESS })
}
