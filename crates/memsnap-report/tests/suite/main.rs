//! The integration tests of `memsnap-report` in one test binary: the report: goldens and structure.
mod report;
