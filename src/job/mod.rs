//! The per-rank dumps of one job: rank and iteration from file names ([`names`]), the member list
//! (the files the arguments name, each placed in the job), analysing members in parallel. Shared
//! by `memsnap ranks` (`cmd::ranks`) and the diff of two runs (`cmd::diff::runs`).

pub mod names;

use std::path::{Path, PathBuf};

use rayon::prelude::*;

use crate::discovery::{Discovery, Input};
use crate::load::LoadError;
use crate::pipeline::{analyze_file, Analyzed};
use names::{place, Place};

/// One input file of the job and where it sits in it.
#[derive(Clone, Debug)]
pub struct Member {
    /// The path as given, or as found under a directory given.
    pub shown: String,
    pub path: PathBuf,
    pub place: Place,
}

/// The per-rank files named by `args` (files, directories walked recursively, glob patterns),
/// sorted by iteration then rank, and how many files in the directories were skipped (not named
/// like snapshots). Errors: an argument that cannot be read, no files at all, a file whose rank
/// cannot be told, two files for one rank and iteration; each names the files.
pub fn members(args: &[PathBuf]) -> anyhow::Result<(Vec<Member>, usize)> {
    let mut disc = Discovery::default();
    for arg in args {
        disc.add_arg(arg);
    }
    let mut out = Vec::new();
    let mut unplaced = Vec::new();
    for input in disc.inputs {
        match input {
            Input::Error { shown, message } => anyhow::bail!("{shown}: {message}"),
            Input::File { shown, path } => match place(&path) {
                Ok(place) => out.push(Member { shown, path, place }),
                Err(why) => unplaced.push(format!("{shown} ({why})")),
            },
        }
    }
    anyhow::ensure!(
        unplaced.is_empty(),
        "cannot tell the rank of {}: {}",
        memsnap_model::plural(unplaced.len() as u64, "file", "files"),
        unplaced.join(", ")
    );
    anyhow::ensure!(!out.is_empty(), "no snapshot files (*.pickle, *.pkl, optionally .gz/.zst/.xz) in {}", {
        args.iter().map(|a| a.display().to_string()).collect::<Vec<_>>().join(", ")
    });
    out.sort_by(|a, b| (&a.place.iteration, a.place.rank, &a.shown).cmp(&(&b.place.iteration, b.place.rank, &b.shown)));
    let mut twice = Vec::new();
    for w in out.windows(2) {
        if w[0].place == w[1].place {
            twice.push(format!("{} and {}", w[0].shown, w[1].shown));
        }
    }
    anyhow::ensure!(
        twice.is_empty(),
        "two files for one rank{}: {}",
        if out.iter().any(|m| m.place.iteration.is_some()) { " and iteration" } else { "" },
        twice.join("; ")
    );
    Ok((out, disc.skipped))
}

/// `f` over `items` on rayon's threads, a chunk of as many items as there are threads at a time,
/// so that no more items (files, or pairs of files) are being analysed at once than there are
/// threads; results in input order whatever the thread count.
pub fn map_in_chunks<I: Sync, T: Send>(items: &[I], f: impl Fn(&I) -> T + Sync) -> Vec<T> {
    let n = rayon::current_num_threads().max(1);
    let invocation = crate::invocation::current();
    let mut out = Vec::with_capacity(items.len());
    for chunk in items.chunks(n) {
        out.extend(
            chunk.par_iter().map(|i| crate::invocation::within(invocation.clone(), || f(i))).collect::<Vec<T>>(),
        );
    }
    out
}

/// `analyze_file`, with a panic (a bug in memsnap) turned into an error for this file alone.
pub fn analyze_guarded(path: &Path) -> Result<Analyzed, String> {
    match std::panic::catch_unwind(|| analyze_file(path)) {
        Ok(Ok(a)) => Ok(a),
        Ok(Err(e)) => Err(load_error_text(&e)),
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            Err(format!("internal error (a bug in memsnap): {what}"))
        }
    }
}

/// The reason a file could not be loaded, without the path (its row names the file).
fn load_error_text(e: &LoadError) -> String {
    match e {
        LoadError::Io { source, .. } => source.to_string(),
        LoadError::Read { source, .. } => source.to_string(),
        LoadError::OverCap { cap, .. } => format!("more than {cap} pickle bytes"),
    }
}
