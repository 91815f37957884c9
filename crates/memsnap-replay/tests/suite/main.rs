//! The integration tests of `memsnap-replay` in one test binary: the replay: cases, the dev files, and a reference model under proptest.
mod common;

mod cases;
mod dev_files;
mod reference_model;
