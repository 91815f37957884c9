//! `memsnap trace` (being written).

use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    /// Snapshot file (`-` for stdin).
    pub file: std::path::PathBuf,
}

pub fn run(_args: &Args) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`trace` is not available in this build yet")
}
