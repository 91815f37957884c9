//! A safe reader for Python pickles (protocols 0–5), written for memory snapshots: zero-copy
//! from a slice, or streamed from any reader through a fixed window ([`Source`]).
//!
//! Why not `serde_pickle`: it clones memoized objects (real snapshots share one `frames` list
//! among thousands of events and fail with "recursive structure found"), builds an owned tree,
//! rejects integers ≥ 2^63 and trailing bytes. This reader keeps every memoized object once in
//! a [`Heap`] addressed by index (a DAG, never an expanded tree), borrows strings from an
//! in-memory input, reads integers up to 128 bits, and lets a [`Compactor`] turn millions of small dicts
//! into compact records while reading.
//!
//! Safety: only data opcodes are implemented; `GLOBAL`, `REDUCE` and every other opcode that
//! would import or call code is refused with an error. Hostile input stays bounded: nothing is
//! allocated from a length field (a length is checked against the bytes known to remain, and
//! otherwise the bytes are gathered as they really arrive, up to a cap), what the objects built
//! take is held to a budget proportional to the input ([`ObjectBudget`]), nesting is capped
//! ([`Limits`]), and memo references share, they never copy.

mod error;
mod memo;
pub mod scan;
mod source;
mod value;
mod vm;

pub use error::{opcode_name, ErrorKind, PickleError};
pub use source::{CountingReader, Fault, ReadSource, SliceSource, Source, WINDOW};
pub use value::{Heap, ListStore, Value};
pub use vm::{
    long_value, parse, parse_source, Advanced, Ahead, Compactor, Limits, MemoRef, NoCompaction, ObjectBudget, Parsed,
    Progress, Stats, Store, StoreView, MAX_FAST_FORWARD_WINDOW,
};

/// Read a pickle without compaction and default limits.
pub fn parse_simple(data: &[u8]) -> Result<Parsed<'_>, PickleError> {
    parse(data, &mut NoCompaction, &Limits::default(), None)
}
