//! The layout at any moment of the trace, rebuilt from block and segment lifetimes.
//!
//! The allocator merges every freed block with its free neighbours, so free blocks are exactly
//! the gaps between active blocks of a segment: the lifetimes alone give the whole layout.

use memsnap_model::{BlockState, SegmentType, StackId, TraceEvent};

use crate::output::DeviceReplay;

/// The segments of a device, with their blocks, at one moment.
#[derive(Clone, Debug, PartialEq)]
pub struct MemoryMap {
    /// The layout holds after this event; `None` is before the first event.
    pub event_index: Option<usize>,
    /// By address.
    pub segments: Vec<SegmentView>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct SegmentView {
    pub address: u64,
    pub total_size: u64,
    pub stream: u64,
    pub pool_id: (u64, u64),
    pub segment_type: SegmentType,
    pub is_expandable: bool,
    /// By address, covering the segment without gaps.
    pub blocks: Vec<BlockView>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockView {
    pub address: u64,
    pub size: u64,
    /// Zero for free blocks.
    pub requested_size: u64,
    pub state: BlockState,
    pub stack: StackId,
    /// Index in [`DeviceReplay::blocks`]; `None` for free blocks.
    pub lifetime: Option<usize>,
}

/// Occupancy of one segment.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SegmentStats {
    /// Blocks held by the program (`active_allocated`).
    pub allocated_bytes: u64,
    /// Blocks freed by the program but still used by another stream.
    pub pending_free_bytes: u64,
    /// What the program asked for, over allocated blocks; `allocated_bytes - requested_bytes`
    /// is lost to rounding and unsplit blocks.
    pub requested_bytes: u64,
    /// Free (cached) bytes.
    pub free_bytes: u64,
    pub free_blocks: usize,
    pub largest_free_bytes: u64,
    /// `1 - largest_free / free`: 0 when the free memory is one block (or there is none),
    /// towards 1 when it is scattered in small pieces.
    pub fragmentation: f64,
}

impl SegmentView {
    pub fn stats(&self) -> SegmentStats {
        let mut s = SegmentStats::default();
        for b in &self.blocks {
            match b.state {
                BlockState::Allocated => {
                    s.allocated_bytes = s.allocated_bytes.saturating_add(b.size);
                    s.requested_bytes = s.requested_bytes.saturating_add(b.requested_size);
                }
                BlockState::PendingFree => s.pending_free_bytes = s.pending_free_bytes.saturating_add(b.size),
                BlockState::Inactive => {
                    s.free_bytes = s.free_bytes.saturating_add(b.size);
                    s.free_blocks += 1;
                    s.largest_free_bytes = s.largest_free_bytes.max(b.size);
                }
            }
        }
        if s.free_bytes > 0 {
            s.fragmentation = 1.0 - s.largest_free_bytes as f64 / s.free_bytes as f64;
        }
        s
    }
}

impl DeviceReplay {
    /// The layout after event `index` (`None`: before the first event).
    pub fn state_after(&self, index: Option<usize>) -> MemoryMap {
        let at = index.map(|i| i.min(u32::MAX as usize) as u32);
        let mut segments: Vec<SegmentView> = Vec::new();
        for s in self.segments.iter().filter(|s| s.live_after(at)) {
            // Contiguous mapped ranges of an expandable segment show as one segment.
            match segments.last_mut() {
                Some(prev)
                    if prev.is_expandable
                        && s.is_expandable
                        && prev.address + prev.total_size == s.address
                        && prev.stream == s.stream
                        && prev.pool_id == s.pool_id =>
                {
                    prev.total_size += s.size;
                }
                _ => segments.push(SegmentView {
                    address: s.address,
                    total_size: s.size,
                    stream: s.stream,
                    pool_id: s.pool_id,
                    segment_type: s.segment_type,
                    is_expandable: s.is_expandable,
                    blocks: Vec::new(),
                }),
            }
        }

        let mut live: Vec<BlockView> = self
            .blocks
            .iter()
            .enumerate()
            .filter_map(|(k, b)| {
                b.state_after(at).map(|state| BlockView {
                    address: b.address,
                    size: b.size,
                    requested_size: b.requested_size,
                    state,
                    stack: b.stack,
                    lifetime: Some(k),
                })
            })
            .collect();
        live.sort_unstable_by_key(|b| b.address);

        let mut blocks = live.into_iter().peekable();
        for seg in &mut segments {
            let end = seg.address + seg.total_size;
            while blocks.next_if(|b| b.address < seg.address).is_some() {}
            let mut at = seg.address;
            while let Some(b) = blocks.next_if(|b| b.address < end) {
                if b.address > at {
                    seg.blocks.push(free_block(at, b.address - at));
                }
                at = b.address + b.size;
                seg.blocks.push(b);
            }
            if at < end {
                seg.blocks.push(free_block(at, end - at));
            }
        }
        MemoryMap { event_index: index, segments }
    }

    /// The layout at the peak of allocated bytes.
    pub fn state_at_peak(&self) -> MemoryMap {
        self.state_after(self.peaks.allocated.event_index)
    }

    /// The layout after the last event (what the snapshot's `segments` show).
    pub fn state_at_end(&self) -> MemoryMap {
        self.state_after(self.event_count.checked_sub(1))
    }
}

fn free_block(address: u64, size: u64) -> BlockView {
    BlockView { address, size, requested_size: 0, state: BlockState::Inactive, stack: StackId::EMPTY, lifetime: None }
}

/// The last event at or before `time_us`, or `None` when every event is later. Assumes times
/// do not decrease along the trace (one clock, recorded in order); events without a time count
/// as earlier than any time.
pub fn event_at_time(events: &[TraceEvent], time_us: i64) -> Option<usize> {
    events.partition_point(|e| e.time_us <= time_us).checked_sub(1)
}
