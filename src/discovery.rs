//! Input discovery: the command-line paths as the snapshot files they name, in order: files,
//! directories walked recursively (only files named like snapshots), glob patterns, and an error
//! input for an argument that cannot be read. `batch` writes a row per input; `ranks` and the
//! runs diff place each file in its job (`crate::job`).

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use crate::emit::shown_path;

/// One input (a row of `batch`, a member of a job), in output order.
pub(crate) enum Input {
    File {
        shown: String,
        path: PathBuf,
    },
    /// An argument (or a directory under one) that failed before any file could be read.
    Error {
        shown: String,
        message: String,
    },
}

#[derive(Default)]
pub(crate) struct Discovery {
    pub(crate) inputs: Vec<Input>,
    /// Files in walked directories whose names do not look like snapshots.
    pub(crate) skipped: usize,
    /// Canonical paths of the files already listed: a file reached twice gets one row.
    seen: HashSet<PathBuf>,
    /// Canonical paths of the directories walked, against symlink loops.
    walked: HashSet<PathBuf>,
}

/// `*.pickle` or `*.pkl`, optionally compressed (`.gz`, `.gzip`, `.zst`, `.zstd`, `.xz`);
/// case-insensitive.
pub(crate) fn is_snapshot_name(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    let base =
        [".gz", ".gzip", ".zst", ".zstd", ".xz"].iter().find_map(|ext| lower.strip_suffix(ext)).unwrap_or(&lower);
    base.ends_with(".pickle") || base.ends_with(".pkl")
}

fn is_pattern(p: &Path) -> bool {
    p.to_str().is_some_and(|s| s.contains(['*', '?', '[']))
}

impl Discovery {
    fn add_file(&mut self, path: PathBuf) {
        if path.as_os_str() != "-" {
            let key = std::fs::canonicalize(&path).unwrap_or_else(|_| path.clone());
            if !self.seen.insert(key) {
                return;
            }
        }
        self.inputs.push(Input::File { shown: path.display().to_string(), path });
    }

    fn add_error(&mut self, path: &Path, message: String) {
        self.inputs.push(Input::Error { shown: path.display().to_string(), message });
    }

    /// Add an existing path: a directory is walked, anything else is read as a snapshot.
    /// `explicit` is a path named on the command line, which is read whatever it is (a FIFO
    /// blocks until written, like `cat`); a path found in a directory or by a pattern is read
    /// only when it is a regular file, so a FIFO or a device there cannot hang the command.
    fn add_path(&mut self, path: PathBuf, explicit: bool) {
        let meta = std::fs::metadata(&path);
        if !explicit && meta.as_ref().is_ok_and(|m| !m.is_dir() && !m.is_file()) {
            return self.skip_special(&path);
        }
        if meta.is_ok_and(|m| m.is_dir()) {
            let before = self.inputs.len();
            self.walk(&path);
            if self.inputs.len() == before {
                crate::emit::stderr_line(&format!(
                    "memsnap: warning: {}: no snapshot files (*.pickle, *.pkl, optionally .gz/.zst/.xz) in this directory",
                    shown_path(&path)
                ));
            }
        } else {
            self.add_file(path);
        }
    }

    fn walk(&mut self, dir: &Path) {
        let key = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
        if !self.walked.insert(key) {
            return;
        }
        let mut entries: Vec<std::ffi::OsString> =
            match std::fs::read_dir(dir).and_then(|r| r.map(|e| e.map(|e| e.file_name())).collect()) {
                Ok(v) => v,
                Err(e) => return self.add_error(dir, format!("cannot read directory: {e}")),
            };
        entries.sort();
        for name in entries {
            let text = name.to_string_lossy();
            // Hidden files and directories (.git, editor swap files) are never snapshots.
            if text.starts_with('.') {
                continue;
            }
            let path = dir.join(&name);
            let meta = std::fs::metadata(&path);
            if meta.as_ref().is_ok_and(|m| m.is_dir()) {
                self.walk(&path);
            } else if !is_snapshot_name(&text) {
                self.skipped += 1;
            } else if meta.is_ok_and(|m| !m.is_file()) {
                self.skip_special(&path);
            } else {
                self.add_file(path);
            }
        }
    }

    /// A FIFO, socket or device found under a directory or by a pattern: not read.
    fn skip_special(&mut self, path: &Path) {
        crate::emit::stderr_line(&format!(
            "memsnap: warning: {}: not a regular file (a FIFO, socket or device): skipped",
            shown_path(path)
        ));
        self.skipped += 1;
    }

    pub(crate) fn add_arg(&mut self, arg: &Path) {
        // Bytes the run was handed under this name (the Python extension) are one input.
        if crate::invocation::in_memory(arg).is_some() {
            return self.add_file(arg.to_path_buf());
        }
        if arg.as_os_str() == "-" || arg.exists() {
            return self.add_path(arg.to_path_buf(), true);
        }
        if !is_pattern(arg) {
            let e = std::fs::metadata(arg).err().map_or_else(|| "not found".to_string(), |e| e.to_string());
            return self.add_error(arg, e);
        }
        let pattern = arg.to_string_lossy();
        let opts = glob::MatchOptions {
            case_sensitive: true,
            require_literal_separator: true,
            require_literal_leading_dot: true,
        };
        let paths = match glob::glob_with(&pattern, opts) {
            Ok(p) => p,
            Err(e) => return self.add_error(arg, format!("invalid glob pattern: {e}")),
        };
        let mut matched = false;
        for entry in paths {
            matched = true;
            match entry {
                Ok(p) => self.add_path(p, false),
                Err(e) => {
                    let path = e.path().to_path_buf();
                    self.add_error(&path, format!("cannot read directory: {}", e.error()));
                }
            }
        }
        if !matched {
            self.add_error(arg, "no file matches this pattern".into());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_names() {
        for yes in
            ["a.pickle", "a.PKL", "a.pickle.gz", "a.pkl.zst", "a.pickle.xz", "a.pickle.zstd", "snap.rank1.pickle"]
        {
            assert!(is_snapshot_name(yes), "{yes}");
        }
        for no in ["a.json", "a.truth.json", "a.txt", "README.md", "a.pt", "a.pickle.json", "pickle", "a.gz"] {
            assert!(!is_snapshot_name(no), "{no}");
        }
    }
}
