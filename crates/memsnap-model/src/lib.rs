//! Typed model of a PyTorch CUDA memory snapshot, and its construction from pickle bytes.
//!
//! Frames, stacks and strings are interned once ([`FrameId`], [`StackId`], [`StrId`]); trace
//! events are compact fixed-size records that refer to them. The pickle's own memo sharing is
//! used to intern cheaply: a `frames` list shared by many events is converted once.
//!
//! Reading never executes anything from the file; type errors name the key path, e.g.
//! `segments[3].blocks[17].size`.

mod origin;
mod types;

pub use origin::{DeviceType, DeviceTypeEvidence, PROFILER_FRAME_FILENAME};

pub use types::*;
mod read;
mod stats;
mod untrusted;

pub use stats::{DeviceTotals, PoolCounts, TraceFacts, TraceTally};
pub use untrusted::{
    clip, escape_controls, is_display_unsafe, json_safe, printable, shown, CLIP_HEAD, MAX_SHOWN_CHARS,
};

pub use read::{read_snapshot, read_snapshot_from, read_snapshot_with, ReadError, ReadOptions};
