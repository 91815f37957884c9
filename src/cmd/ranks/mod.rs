//! `memsnap ranks PATH... [--json]`: the per-rank dumps of one job read as one job — a table per
//! iteration (peak allocated and reserved, growth, at-dump bytes, suspects per rank), the
//! imbalance (max over median peak), the odd ranks out with why, and with iteration folders each
//! rank's peak over the run. See docs/ranks.md.
//!
//! The parts: `crate::job` finds the files and places each one by rank and iteration (shared with
//! `memsnap diff RUN_A RUN_B`, `cmd::diff::runs`), [`compare`] analyses them and compares the
//! ranks, [`output`] writes text and JSON.

mod compare;
mod output;

use std::path::PathBuf;

use memsnap_model::printable;

use crate::emit::{emit, emit_json};
use crate::exit::Exit;

#[derive(clap::Args)]
pub struct Args {
    /// Per-rank snapshot files, directories (walked recursively; there only *.pickle and *.pkl
    /// files, optionally .gz, .zst or .xz, are read) and glob patterns. The rank comes from the
    /// file name (rank3, rank_3, rank-3, _r3) or its folder, the iteration from a folder
    /// (iteration_20, step_100) or Composer's rank3.12 (`memsnap docs ranks`).
    #[arg(required = true, value_name = "PATH")]
    pub paths: Vec<PathBuf>,
    /// Machine-readable output (`memsnap docs ranks`).
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &Args) -> anyhow::Result<Exit> {
    crate::progress::per_file_off();
    let (members, skipped) = crate::job::members(&args.paths)?;
    let rows = compare::analyze_members(&members);
    let groups = compare::groups(&rows);
    if args.json {
        let mut s = serde_json::to_string_pretty(&output::json(&rows, &groups))?;
        s.push('\n');
        emit_json(&s)?;
    } else {
        emit(&output::text(&rows, &groups))?;
    }
    if skipped > 0 {
        crate::emit::stderr_line(&format!(
            "memsnap ranks: {} in the directories skipped (not named like a snapshot, or not a regular file)",
            memsnap_model::plural(skipped as u64, "other file", "other files")
        ));
    }
    Ok(report_unreadable(rows.iter().filter_map(|r| r.result.as_ref().err().map(|e| (&r.member.shown, e)))))
}

/// One error line per unreadable file on stderr (its row already says so on stdout), and exit
/// code 2 when there was any: every other file was analysed, but the job was not read whole.
fn report_unreadable<'a>(errors: impl Iterator<Item = (&'a String, &'a String)>) -> Exit {
    let mut any = false;
    for (file, e) in errors {
        crate::emit::stderr_line(&format!("memsnap: error: {}", printable(&format!("{file}: {e}"))));
        any = true;
    }
    if any {
        Exit::UNREADABLE
    } else {
        Exit::SUCCESS
    }
}
