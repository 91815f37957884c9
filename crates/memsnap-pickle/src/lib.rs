//! A safe, zero-copy reader for Python pickles (protocols 0–5), written for memory snapshots.
//!
//! Why not `serde_pickle`: it clones memoized objects (real snapshots share one `frames` list
//! among thousands of events and fail with "recursive structure found"), builds an owned tree,
//! rejects integers ≥ 2^63 and trailing bytes. This reader keeps every memoized object once in
//! a [`Heap`] addressed by index (a DAG, never an expanded tree), borrows strings from the
//! input, reads integers up to 128 bits, and lets a [`Compactor`] turn millions of small dicts
//! into compact records while reading.
//!
//! Safety: only data opcodes are implemented; `GLOBAL`, `REDUCE` and every other opcode that
//! would import or call code is refused with an error. Hostile input stays bounded: lengths are
//! checked against the bytes that remain before anything is allocated, nesting is capped
//! ([`Limits`]), and memo references share, they never copy.

mod error;
mod source;
mod value;
mod vm;

pub use error::{opcode_name, ErrorKind, PickleError};
pub use source::{CountingReader, Fault, ReadSource, SliceSource, Source, WINDOW};
pub use value::{Heap, ListStore, Value};
pub use vm::{parse, parse_source, Compactor, Limits, NoCompaction, ObjectBudget, Parsed, Progress, Stats};

/// Read a pickle without compaction and default limits.
pub fn parse_simple(data: &[u8]) -> Result<Parsed<'_>, PickleError> {
    parse(data, &mut NoCompaction, &Limits::default(), None)
}
