//! Every integration test of the `memsnap` binary, in one test binary (one link instead of
//! one per file; see Cargo.toml `autotests = false`). Each module is one area; `common` runs the
//! binary and reads what it says.
mod common;

mod analyze_cli;
mod batch_cli;
mod batch_resume;
mod check_cli;
mod diff_cli;
mod docs_examples;
mod hostile_cli;
mod hostile_streams;
mod memory_bounds;
mod output_cli;
mod report_cli;
mod scorecard;
mod summary_cli;
mod untrusted_cli;
