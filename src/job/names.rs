//! Which rank, and which iteration, a per-rank dump is: read from its path, the way the training
//! frameworks name their dumps.
//!
//! - torchtitan: `iteration_20/rank3_memory_snapshot.pickle` (the folder is the step);
//! - Megatron-LM: `snapshot_oom_rank-3.pickle`;
//! - Composer: `rank3.12.memory_snapshot.pickle` (`rank{rank}.{batch}`: the batch is the
//!   iteration);
//! - hand-written: `rank_3.pickle`, `rank-3.pickle`, `m02_ddp_rank1.pickle`, `snap_r3.pickle`, or a
//!   folder per rank (`rank3/snapshot.pickle`).
//!
//! The rank is the number after `rank` (at the start of a word: after the start of the name or a
//! character other than a letter or digit, then an optional `_` or `-`), in the file name first,
//! then in the nearest folder named so; a file name without one may end its rank as `_r3` (or
//! `-r3`, `.r3`). The iteration is Composer's batch (`rankR.B`) when the name has one, else the
//! nearest folder named `iteration_N`, `iter_N`, `step_N` or `global_step_N` (`_`, `-` or nothing
//! before the number, anything after it such as torchtitan's `iteration_9_exit`).

use std::path::Path;

/// An iteration of the run a dump was taken at: its number (what iterations sort by) and how the
/// path names it (the folder, or `batch N`), which tells `iteration_9` from `iteration_9_exit`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Iteration {
    pub number: u64,
    pub label: String,
}

/// Where a file sits in its job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Place {
    pub rank: u32,
    pub iteration: Option<Iteration>,
}

/// The name without its compression suffix and its `.pickle` / `.pkl` extension.
fn stem(name: &str) -> &str {
    let lower = name.to_ascii_lowercase();
    let mut end = name.len();
    for ext in [".gz", ".gzip", ".zst", ".zstd", ".xz"] {
        if lower[..end].ends_with(ext) {
            end -= ext.len();
            break;
        }
    }
    for ext in [".pickle", ".pkl"] {
        if lower[..end].ends_with(ext) {
            end -= ext.len();
            break;
        }
    }
    &name[..end]
}

/// The digits at the start of `s` as a number, and what follows them (`None`: no digits, or too
/// many for the type).
fn number<T: std::str::FromStr>(s: &str) -> Option<(T, &str)> {
    let n = s.bytes().take_while(u8::is_ascii_digit).count();
    if n == 0 {
        return None;
    }
    s[..n].parse().ok().map(|v| (v, &s[n..]))
}

/// A word starts at `i`: at the start of the text or after a character that is not a letter or
/// digit.
fn word_starts_at(text: &str, i: usize) -> bool {
    i == 0 || !text.as_bytes()[i - 1].is_ascii_alphanumeric()
}

/// A word ends where `rest` begins.
fn word_ends(rest: &str) -> bool {
    !rest.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
}

/// Every `rank N` of `text` (`rank3`, `rank_3`, `rank-3`), each with what follows its number.
fn rank_words(text: &str) -> Vec<(u32, &str)> {
    let lower = text.to_ascii_lowercase();
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(at) = lower[from..].find("rank").map(|i| i + from) {
        from = at + 4;
        if !word_starts_at(&lower, at) {
            continue;
        }
        let after = &text[at + 4..];
        let after = after.strip_prefix(['_', '-']).unwrap_or(after);
        match number::<u32>(after) {
            Some((rank, rest)) if word_ends(rest) => out.push((rank, rest)),
            _ => {}
        }
    }
    out
}

/// `_r3`, `-r3` or `.r3` as a whole word.
fn r_words(text: &str) -> Vec<u32> {
    let lower = text.to_ascii_lowercase();
    let mut out = Vec::new();
    for (at, _) in lower.match_indices('r') {
        if at == 0 || !matches!(lower.as_bytes()[at - 1], b'_' | b'-' | b'.') {
            continue;
        }
        match number::<u32>(&text[at + 1..]) {
            Some((rank, rest)) if word_ends(rest) => out.push(rank),
            _ => {}
        }
    }
    out
}

/// One rank from the matches of a name, or why not.
fn one_rank(ranks: &[u32], what: &str) -> Result<Option<u32>, String> {
    let mut distinct: Vec<u32> = ranks.to_vec();
    distinct.sort_unstable();
    distinct.dedup();
    match distinct[..] {
        [] => Ok(None),
        [r] => Ok(Some(r)),
        _ => Err(format!(
            "its {what} names more than one rank ({})",
            distinct.iter().map(|r| r.to_string()).collect::<Vec<_>>().join(", ")
        )),
    }
}

/// The iteration a folder name stands for: `iteration_20`, `iter-3`, `step100`, `global_step_5`,
/// `iteration_9_exit` (case-insensitive).
fn folder_iteration(name: &str) -> Option<Iteration> {
    let lower = name.to_ascii_lowercase();
    // Longer words first: `iteration` before `iter`, `global_step` before `step`.
    let rest = ["iteration", "iter", "global_step", "step"].iter().find_map(|w| lower.strip_prefix(w))?;
    let rest = rest.strip_prefix(['_', '-']).unwrap_or(rest);
    let (number, tail) = number::<u64>(rest)?;
    (tail.is_empty() || tail.starts_with(['_', '-', '.'])).then(|| Iteration { number, label: name.to_string() })
}

/// The rank and iteration of the file at `path`, or why its rank cannot be told.
pub fn place(path: &Path) -> Result<Place, String> {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let stem = stem(&name);
    let words = rank_words(stem);
    let mut rank = one_rank(&words.iter().map(|w| w.0).collect::<Vec<_>>(), "name")?;
    // Composer's `rank{rank}.{batch}`: a number right after the rank, after a dot.
    let mut iteration = None;
    if let [(_, rest)] = words[..] {
        if let Some((batch, tail)) = rest.strip_prefix('.').and_then(number::<u64>) {
            if word_ends(tail) {
                iteration = Some(Iteration { number: batch, label: format!("batch {batch}") });
            }
        }
    }
    if rank.is_none() {
        rank = one_rank(&r_words(stem), "name")?;
    }
    let folders: Vec<String> = path
        .parent()
        .into_iter()
        .flat_map(Path::ancestors)
        .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .collect();
    if rank.is_none() {
        for folder in &folders {
            if let Some(r) = one_rank(&rank_words(folder).iter().map(|w| w.0).collect::<Vec<_>>(), "folder")? {
                rank = Some(r);
                break;
            }
        }
    }
    if iteration.is_none() {
        iteration = folders.iter().find_map(|f| folder_iteration(f));
    }
    match rank {
        Some(rank) => Ok(Place { rank, iteration }),
        None => Err("no rank in its name or folders, such as rank3, rank_3, rank-3 or _r3".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(path: &str) -> (u32, Option<(u64, String)>) {
        let p = place(Path::new(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
        (p.rank, p.iteration.map(|i| (i.number, i.label)))
    }

    #[test]
    fn torchtitan_iteration_folders() {
        assert_eq!(at("snapshots/iteration_20/rank3_memory_snapshot.pickle"), (3, Some((20, "iteration_20".into()))));
        assert_eq!(
            at("out/memory_snapshot/iteration_10_exit/rank0_memory_snapshot.pickle.xz"),
            (0, Some((10, "iteration_10_exit".into())))
        );
        assert_eq!(at("run/step_100/rank12_memory_snapshot.pickle"), (12, Some((100, "step_100".into()))));
        assert_eq!(at("run/global_step5/rank1.pickle"), (1, Some((5, "global_step5".into()))));
        assert_eq!(at("Iter-7/rank2.pkl"), (2, Some((7, "Iter-7".into()))));
    }

    #[test]
    fn megatron_oom_snapshots() {
        assert_eq!(at("snapshot_oom_rank-3.pickle"), (3, None));
        assert_eq!(at("/tmp/snapshot_oom_rank-0.pickle.gz"), (0, None));
    }

    #[test]
    fn composer_rank_then_batch() {
        assert_eq!(at("rank3.12.pickle"), (3, Some((12, "batch 12".into()))));
        assert_eq!(at("traces/rank0.100.memory_snapshot.pickle"), (0, Some((100, "batch 100".into()))));
        // The batch in the name wins over a folder.
        assert_eq!(at("iteration_5/rank1.7.pickle"), (1, Some((7, "batch 7".into()))));
    }

    #[test]
    fn other_spellings() {
        assert_eq!(at("rank_3.pickle"), (3, None));
        assert_eq!(at("rank-3.pickle.zst"), (3, None));
        assert_eq!(at("RANK3.pickle"), (3, None));
        assert_eq!(at("fixtures/multi/m02_ddp_rank1.pickle"), (1, None));
        assert_eq!(at("local_rank2_snapshot.pickle"), (2, None));
        assert_eq!(at("snap_r3.pickle"), (3, None));
        assert_eq!(at("snap-r15.pkl.xz"), (15, None));
        // A folder per rank.
        assert_eq!(at("job/rank_4/snapshot.pickle"), (4, None));
        assert_eq!(at("job/rank4/iteration_2/snapshot.pickle"), (4, Some((2, "iteration_2".into()))));
    }

    #[test]
    fn what_is_not_a_rank() {
        for path in [
            "snapshot.pickle",
            "ranks.pickle",
            "frank3.pickle",
            "rank3x.pickle",
            "rank.pickle",
            "snapr3.pickle",
            "run_r3b.pickle",
            "ranking/iteration_3/s.pickle",
            "rank99999999999.pickle",
        ] {
            let err = place(Path::new(path)).expect_err(path);
            assert!(err.contains("no rank"), "{path}: {err}");
        }
        // Two different ranks in one name: which one is meant is not guessed.
        let err = place(Path::new("rank0_vs_rank1.pickle")).unwrap_err();
        assert!(err.contains("more than one rank (0, 1)"), "{err}");
        // The same rank twice is one rank.
        assert_eq!(at("rank2/rank2_snapshot.pickle"), (2, None));
        assert_eq!(at("rank2_rank2.pickle"), (2, None));
    }

    #[test]
    fn folders_that_are_not_iterations() {
        assert_eq!(at("steps/rank1.pickle"), (1, None));
        assert_eq!(at("iteration/rank1.pickle"), (1, None));
        assert_eq!(at("stepper_3/rank1.pickle"), (1, None));
        assert_eq!(at("step_3x/rank1.pickle"), (1, None));
    }
}
