//! The integration tests of `memsnap-model` in one test binary: the model reader: real files, the parallel reader against the sequential one, object budgets.
mod object_budget;
mod parallel;
mod read;
