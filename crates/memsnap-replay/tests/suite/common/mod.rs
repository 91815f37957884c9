//! Helpers shared by the integration tests.

use memsnap_model::{BlockState, Snapshot};
use memsnap_replay::MemoryMap;

/// A layout as plain data: segments (address, size) with blocks (address, size, state).
pub type Layout = Vec<(u64, u64, Vec<(u64, u64, BlockState)>)>;

/// The snapshot's own segment table, by address.
pub fn snapshot_layout(snapshot: &Snapshot) -> Layout {
    let mut out: Layout = snapshot
        .segments
        .iter()
        .map(|s| (s.address, s.total_size, s.blocks.iter().map(|b| (b.address, b.size, b.state)).collect()))
        .collect();
    out.sort_by_key(|s| s.0);
    out
}

/// A replayed layout.
pub fn map_layout(map: &MemoryMap) -> Layout {
    map.segments
        .iter()
        .map(|s| (s.address, s.total_size, s.blocks.iter().map(|b| (b.address, b.size, b.state)).collect()))
        .collect()
}
