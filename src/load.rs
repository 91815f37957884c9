//! Loading a snapshot from a path: open (decompressing as a stream), parse, and keep facts about
//! the file.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use memsnap_model::{ReadError, ReadOptions, Snapshot};

use crate::input::{open_input, Compression};

/// A snapshot with facts about the file it came from.
pub struct Loaded {
    pub path: PathBuf,
    /// Size of the file as stored (compressed size for compressed files).
    pub file_bytes: u64,
    /// Size of the pickle after decompression.
    pub pickle_bytes: u64,
    pub compression: Compression,
    pub snapshot: Snapshot,
}

/// Why an input could not be loaded. Always maps to exit code 2.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("{path}: {source}")]
    Read { path: String, source: ReadError },
    /// The pickle is larger than the cap it was read under (see [`load_capped`]).
    #[error("{path}: more than {cap} pickle bytes")]
    OverCap { path: String, cap: u64 },
}

pub fn load(path: &Path) -> Result<Loaded, LoadError> {
    load_capped(path, None)
}

/// [`load`], for what `summary` prints: a regular file is read without keeping its trace
/// events (each trace keeps its counts, `DeviceTrace::summary`), in a fraction of the memory.
/// A file whose trace lists share entries is read again with them; a pipe, which cannot be
/// read twice, is read with them from the start.
pub fn load_summary(path: &Path) -> Result<Loaded, LoadError> {
    match read(path, None, false) {
        Err(LoadError::Read { source: memsnap_model::ReadError::NeedsEvents { .. }, .. }) => load(path),
        other => other,
    }
}

/// [`load`], failing with [`LoadError::OverCap`] once the pickle exceeds `cap` bytes.
pub fn load_capped(path: &Path, cap: Option<u64>) -> Result<Loaded, LoadError> {
    read(path, cap, true)
}

/// Read `path`; `events`: keep every trace event (else only counts, for a regular file).
fn read(path: &Path, cap: Option<u64>, events: bool) -> Result<Loaded, LoadError> {
    let shown = path.display().to_string();
    let io_error = |source| LoadError::Io { path: shown.clone(), source };
    let mut opened = open_input(path, cap).map_err(io_error)?;
    let over_cap = opened.over_cap.clone();
    let over_cap_or = |e: LoadError| match cap {
        Some(cap) if over_cap.load(Ordering::Relaxed) => LoadError::OverCap { path: shown.clone(), cap },
        _ => e,
    };
    let bar = crate::progress::bytes("reading", opened.regular_len);
    let stored = opened.stored.clone();
    let mut counted = 0u64;
    let mut report = |_pickle_offset: usize| {
        let now = stored.load(Ordering::Relaxed);
        crate::progress::add_bytes_read(now.saturating_sub(counted));
        counted = counted.max(now);
        bar.set_position(now);
    };
    let opts = ReadOptions {
        size_hint: opened.size_hint(),
        stored_bytes: Some(opened.stored.clone()),
        progress: Some(&mut report),
        progress_every: 4 << 20,
        events: events || opened.regular_len.is_none(),
        sequential: crate::invocation::sequential_reader(),
        ..ReadOptions::default()
    };
    let snapshot = memsnap_model::read_snapshot_from(&mut opened.reader, opts)
        .map_err(|source| over_cap_or(LoadError::Read { path: shown.clone(), source }));
    bar.finish_and_clear();
    let snapshot = snapshot?;
    let compression = opened.compression;
    let (file_bytes, pickle_bytes) = opened.finish().map_err(|e| over_cap_or(io_error(e)))?;
    // The last stretch after the last report.
    crate::progress::add_bytes_read(file_bytes.saturating_sub(counted));
    Ok(Loaded { path: path.to_path_buf(), file_bytes, pickle_bytes, compression, snapshot })
}
