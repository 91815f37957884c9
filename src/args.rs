//! Arguments several commands share, flattened into their `Args` (`#[command(flatten)]`), so
//! that one argument has one name, one help text and one parser everywhere.

use std::path::PathBuf;

/// The snapshot a one-file command reads.
#[derive(clap::Args)]
pub struct SnapshotFile {
    /// Snapshot file (`-` for stdin); gzip, zstd and xz are detected by content.
    pub file: PathBuf,
}
