//! One module per subcommand. Each has `Args` (clap) and `run(&Args) -> anyhow::Result<Exit>`.
//! Errors that reach `main` are input errors: one line on stderr, exit code 2.

pub mod analyze;
pub mod batch;
pub mod check;
pub mod diff;
pub mod docs;
pub mod flamegraph;
pub mod ranks;
pub mod report;
pub mod segments;
pub mod summary;
pub mod timeline;
pub mod trace;
