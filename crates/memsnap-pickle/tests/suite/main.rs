//! The integration tests of `memsnap-pickle` in one test binary: the pickle VM: opcodes, and differential tests against reference pickles.
mod differential;
mod opcodes;
