//! Byte-exact replay of PyTorch's CUDA caching allocator over a memory-snapshot trace.
//!
//! Trace `alloc`/`free_*` events carry the size the program asked for, while
//! `torch.cuda.memory_allocated()` counts allocator blocks: rounded sizes, and whole cached
//! blocks when the allocator chose not to split them. Summing trace sizes is off by megabytes.
//! This crate rebuilds every segment's block layout event by event with the allocator's own
//! rules (`../shared/design/allocator-replay.md`), so the counters it reports are the ones
//! PyTorch reported, to the byte.
//!
//! - [`replay`] replays every device of a [`Snapshot`] and returns a [`Replay`]: per device the
//!   allocated / reserved / active / requested bytes after each event ([`Series`]), their
//!   [`Peaks`], each block's [`BlockLifetime`], each segment's [`SegmentLifetime`], how the
//!   start was reconstructed ([`StartState`]) and a [`SelfCheck`] against the snapshot's own
//!   segment table.
//! - [`DeviceReplay::state_after`] gives the layout ([`MemoryMap`]) at any event;
//!   [`SegmentView::stats`] its per-segment occupancy and fragmentation.
//!
//! Traces that begin mid-run (the ring buffer wrapped, or recording started late) are replayed
//! from a start layout reconstructed by walking the final segment table back over the trace;
//! what cannot be known exactly is reported ([`StartState::uncertain_bytes`]), not guessed
//! silently. Odd traces never make the replay fail: it carries on and lists [`Diagnostic`]s.
//!
//! Segments are independent, so they replay in parallel (rayon); the result is identical for
//! any number of threads.

mod check;
mod device;
mod effects;
mod layout;
mod output;
mod rules;
mod series;
mod start;
mod state;
mod unit;

use memsnap_model::Snapshot;
use rayon::prelude::*;

pub use output::{
    BlockLifetime, DeviceReplay, Diagnostic, DiagnosticKind, Mismatch, Peak, Peaks, Replay, SegmentLifetime, SelfCheck,
    Series, StartState, Totals, UncertainBlock,
};
pub use rules::{Rules, LARGE_BUFFER, MIN_BLOCK_SIZE, SMALL_SIZE};
pub use state::{event_at_time, BlockView, MemoryMap, SegmentStats, SegmentView};

/// Replay every device of the snapshot with the allocator settings it records.
pub fn replay(snapshot: &Snapshot) -> Replay {
    replay_with(snapshot, &Rules::from_snapshot(snapshot))
}

/// Replay with explicit allocator rules (e.g. when the file lacks its settings).
pub fn replay_with(snapshot: &Snapshot, rules: &Rules) -> Replay {
    let devices = snapshot.device_ids();
    let segments = snapshot.segments_by_device();
    let devices = devices
        .par_iter()
        .map(|&d| {
            let finals = segments.get(&d).map_or(&[][..], |v| &v[..]);
            device::replay_device(snapshot, d, finals, rules)
        })
        .collect();
    Replay { devices }
}
