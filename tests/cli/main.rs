//! Every integration test of the `memsnap` binary, in one test binary (one link instead of
//! one per file; see Cargo.toml `autotests = false`). Each module is one area; `common` runs the
//! binary and reads what it says. The peak-memory test is the one other binary (tests/memory): a
//! child's peak RSS counts the test process at the fork, which must not hold other tests' buffers.
mod common;

mod analyze;
mod batch;
mod batch_parquet;
mod batch_resume;
mod check;
mod diff;
mod docs_examples;
mod embed;
mod golden;
mod hostile_cli;
mod hostile_streams;
mod interactive;
mod output;
mod ranks;
mod report;
mod scorecard;
mod summary;
mod untrusted;
