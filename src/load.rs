//! Loading a snapshot from a path: read (map or decompress), parse, and keep facts about the file.

use std::path::{Path, PathBuf};

use memsnap_model::{ReadError, ReadOptions, Snapshot};

use crate::input::{read_input, Compression};

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
}

pub fn load(path: &Path) -> Result<Loaded, LoadError> {
    let shown = path.display().to_string();
    let (bytes, compression) = read_input(path).map_err(|source| LoadError::Io { path: shown.clone(), source })?;
    let data = bytes.as_slice();
    let file_bytes = if path.as_os_str() == "-" {
        data.len() as u64
    } else {
        std::fs::metadata(path).map(|m| m.len()).unwrap_or(data.len() as u64)
    };
    let mut release = |offset: usize| bytes.release_before(offset);
    let opts = ReadOptions { progress: Some(&mut release), progress_every: 32 << 20, ..ReadOptions::default() };
    let snapshot = memsnap_model::read_snapshot_with(data, opts)
        .map_err(|source| LoadError::Read { path: shown.clone(), source })?;
    Ok(Loaded { path: path.to_path_buf(), file_bytes, pickle_bytes: data.len() as u64, compression, snapshot })
}
