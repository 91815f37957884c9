//! What a replay produces: plain data with public fields.

use std::fmt;

use memsnap_model::{BlockState, SegmentType, StackId};

/// The four counters PyTorch keeps, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    /// `memory_allocated()`: blocks handed to the program (drops at `free_requested`).
    pub allocated: u64,
    /// `memory_reserved()`: segment bytes (mapped bytes for expandable segments).
    pub reserved: u64,
    /// `active_bytes`: allocated blocks plus blocks pending free (drops at `free_completed`).
    pub active: u64,
    /// `requested_bytes`: what the program asked for, over active blocks.
    pub requested: u64,
}

/// The counters after each trace event (index = event index), stored compactly: per chunk of
/// [`Series::CHUNK`] events the counters at its start, and per event each counter's difference
/// from them as an `i32` (16 bytes per event for the four counters, against 32 as plain `u64`
/// columns: on a 12 M-event trace that is 197 MB less). A value that moved more than 2 GiB
/// from its chunk's start within the chunk is kept whole in a side table. Every value is exact.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Series {
    /// The counters before the first event (the reconstructed start state).
    pub start: Totals,
    /// Per chunk: allocated, reserved, active, requested at the chunk's start.
    pub(crate) bases: Vec<[u64; 4]>,
    /// Per event: allocated and active differences (low and high 32 bits).
    pub(crate) allocated_active: Vec<u64>,
    /// Per event: reserved and requested differences.
    pub(crate) reserved_requested: Vec<u64>,
    /// Events whose differences do not fit, with their values, by index.
    pub(crate) wide: Vec<(u32, Totals)>,
}

impl Series {
    /// Events per chunk of stored bases.
    pub const CHUNK: usize = crate::effects::CHUNK;
    /// The stored difference pair that says "look in the side table".
    pub(crate) const WIDE: u64 = 0x8000_0000_8000_0000;

    pub fn len(&self) -> usize {
        self.allocated_active.len()
    }

    pub fn is_empty(&self) -> bool {
        self.allocated_active.is_empty()
    }

    /// The counters after event `index`, or before the first event when `None`.
    pub fn after(&self, index: Option<usize>) -> Totals {
        let Some(i) = index else { return self.start };
        let (aa, rr) = (self.allocated_active[i], self.reserved_requested[i]);
        if aa == Self::WIDE {
            let k = self.wide.binary_search_by_key(&(i as u32), |w| w.0).expect("a wide value is in the side table");
            return self.wide[k].1;
        }
        let base = &self.bases[i / Self::CHUNK];
        let at = |b: u64, d: u64| b.wrapping_add(d as u32 as i32 as i64 as u64);
        Totals {
            allocated: at(base[0], aa),
            reserved: at(base[1], rr),
            active: at(base[2], aa >> 32),
            requested: at(base[3], rr >> 32),
        }
    }

    /// Allocated bytes after event `i`.
    pub fn allocated(&self, i: usize) -> u64 {
        self.after(Some(i)).allocated
    }

    /// One counter after every event, as a column (for tests and small traces).
    pub fn column(&self, pick: impl Fn(&Totals) -> u64) -> Vec<u64> {
        (0..self.len()).map(|i| pick(&self.after(Some(i)))).collect()
    }
}

/// The highest value of one counter: its first occurrence.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Peak {
    pub value: u64,
    /// Event after which the value was first reached; `None` when it held at the start.
    pub event_index: Option<usize>,
    /// `time_us` of that event, when the event has one.
    pub time_us: Option<i64>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Peaks {
    pub allocated: Peak,
    pub reserved: Peak,
    pub active: Peak,
    pub requested: Peak,
}

/// One block, from its allocation to its free. Blocks that existed before the trace began have
/// no `alloc_event`; blocks alive at dump have no `free_completed_event`.
///
/// 40 bytes: a 1 GB trace has four million of them, and the replay holds them twice while it
/// merges the units' lists. The three event indices are stored as `u32` with reserved values
/// for "none" and for "freed before the trace began", which the reader's `u32` record ids never
/// reach (a trace of four billion entries would be a pickle of over 100 GB).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockLifetime {
    pub address: u64,
    /// Block size: the rounded request, or the whole cached block when it was not split.
    pub size: u64,
    pub requested_size: u64,
    /// Allocation stack: for a block allocated in the trace, its `alloc` event's (so a pass over
    /// blocks need not look into the events for it); empty for blocks allocated before the trace
    /// unless still alive at dump.
    pub stack: StackId,
    alloc_event: u32,
    free_requested_event: u32,
    free_completed_event: u32,
}

/// A stored event index that names no event.
const NO_EVENT: u32 = u32::MAX;
/// The stored free request of a block the program freed before the trace began.
const FREED_BEFORE_TRACE: u32 = u32::MAX - 1;

fn event_of(stored: u32) -> Option<u32> {
    (stored < FREED_BEFORE_TRACE).then_some(stored)
}

impl BlockLifetime {
    /// A block that existed when the trace began; `pending`: the program had freed it already,
    /// and it was still in use by another stream.
    pub fn before_trace(address: u64, size: u64, requested_size: u64, stack: StackId, pending: bool) -> BlockLifetime {
        BlockLifetime {
            address,
            size,
            requested_size,
            stack,
            alloc_event: NO_EVENT,
            free_requested_event: if pending { FREED_BEFORE_TRACE } else { NO_EVENT },
            free_completed_event: NO_EVENT,
        }
    }

    /// A block allocated by event `event`.
    pub fn allocated_at(event: u32, address: u64, size: u64, requested_size: u64, stack: StackId) -> BlockLifetime {
        assert!(event < FREED_BEFORE_TRACE, "event index {event} is past what a block lifetime stores");
        BlockLifetime {
            address,
            size,
            requested_size,
            stack,
            alloc_event: event,
            free_requested_event: NO_EVENT,
            free_completed_event: NO_EVENT,
        }
    }

    pub fn set_free_requested(&mut self, event: u32) {
        assert!(event < FREED_BEFORE_TRACE, "event index {event} is past what a block lifetime stores");
        self.free_requested_event = event;
    }

    pub fn set_free_completed(&mut self, event: u32) {
        assert!(event < FREED_BEFORE_TRACE, "event index {event} is past what a block lifetime stores");
        self.free_completed_event = event;
    }

    /// The `alloc` event (`None`: the block existed before the trace began).
    pub fn alloc_event(&self) -> Option<u32> {
        event_of(self.alloc_event)
    }

    /// The `free_requested` event (`None`: not requested in the trace).
    pub fn free_requested_event(&self) -> Option<u32> {
        event_of(self.free_requested_event)
    }

    /// The `free_completed` event (`None`: not completed in the trace).
    pub fn free_completed_event(&self) -> Option<u32> {
        event_of(self.free_completed_event)
    }

    /// The program freed the block before the trace began; it was still pending (used by
    /// another stream) at the start.
    pub fn pending_at_start(&self) -> bool {
        self.free_requested_event == FREED_BEFORE_TRACE
    }

    /// The event that ended the block's allocated life: its free request, or its completed free
    /// when the trace recorded only that (`None`: still allocated at the end of the trace).
    pub fn freed_at(&self) -> Option<u32> {
        self.free_requested_event().or(self.free_completed_event())
    }

    /// The block's state after event `index` (`None`: before the first event), or `None` when
    /// it did not exist then.
    pub fn state_after(&self, index: Option<u32>) -> Option<BlockState> {
        let reached = |event: Option<u32>| match (event, index) {
            (None, _) => false,
            (Some(_), None) => false,
            (Some(e), Some(i)) => e <= i,
        };
        let born = match (self.alloc_event(), index) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some(a), Some(i)) => a <= i,
        };
        if !born || reached(self.free_completed_event()) {
            None
        } else if self.pending_at_start() || reached(self.free_requested_event()) {
            Some(BlockState::PendingFree)
        } else {
            Some(BlockState::Allocated)
        }
    }
}

/// Reserved memory over time: a segment (`cudaMalloc`), or for expandable segments one mapped
/// range (`segment_map`). Contiguous mapped ranges of one expandable segment form one segment
/// at any moment, as in the snapshot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentLifetime {
    pub address: u64,
    pub size: u64,
    pub stream: u64,
    /// CUDA-graph private pool; `(0, 0)` for the default pools or when the file does not say.
    pub pool_id: (u64, u64),
    pub segment_type: SegmentType,
    pub is_expandable: bool,
    /// `segment_alloc`/`segment_map` event; `None` when reserved before the trace began.
    pub created_event: Option<u32>,
    /// `segment_free`/`segment_unmap` event; `None` when still reserved at dump.
    pub released_event: Option<u32>,
}

impl SegmentLifetime {
    /// Whether the memory was reserved after event `index` (`None`: before the first event).
    pub fn live_after(&self, index: Option<u32>) -> bool {
        let born = match (self.created_event, index) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some(c), Some(i)) => c <= i,
        };
        let gone = match (self.released_event, index) {
            (Some(r), Some(i)) => r <= i,
            _ => false,
        };
        born && !gone
    }
}

/// A block that existed before the trace began and was freed during it: the trace gives only its
/// requested size, and whether the allocator rounded it or handed out a whole cached block
/// cannot always be told. The replay assumes `size_assumed` (the rounded size).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UncertainBlock {
    pub address: u64,
    pub requested_size: u64,
    pub size_assumed: u64,
    /// The largest size consistent with the allocator's rules and the rest of the trace.
    pub size_max: u64,
}

/// How the layout before the first event was reconstructed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StartState {
    /// Nothing was reserved before the first event: the trace covers the process's allocator
    /// history, and every byte of the replay is derived from events.
    pub trace_complete: bool,
    /// Segments (or expandable mapped ranges) that existed before the first event.
    pub segments: usize,
    /// Active blocks (allocated or pending free) that existed before the first event.
    pub blocks: usize,
    /// Blocks whose size at the start is not determined by the trace; see [`UncertainBlock`].
    pub uncertain_blocks: Vec<UncertainBlock>,
    /// Sum over uncertain blocks of `size_max - size_assumed`: how far allocated bytes before
    /// their free may be under-counted.
    pub uncertain_bytes: u64,
}

/// The result of comparing the replayed layout after the last event with the snapshot's own
/// `segments`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SelfCheck {
    pub matches_snapshot: bool,
    /// Total number of differences found.
    pub mismatch_count: usize,
    /// The first few differences, by address.
    pub mismatches: Vec<Mismatch>,
}

/// One difference between the replayed final layout and the snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mismatch {
    /// A segment in the snapshot that the replay does not have, or has with another size.
    Segment { address: u64, snapshot_size: Option<u64>, replayed_size: Option<u64> },
    /// A block that differs in size or state, or exists on one side only.
    Block { address: u64, snapshot: Option<(u64, BlockState)>, replayed: Option<(u64, BlockState)> },
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fn side<T: fmt::Debug>(v: &Option<T>) -> String {
            v.as_ref().map_or_else(|| "absent".to_string(), |v| format!("{v:?}"))
        }
        match self {
            Mismatch::Segment { address, snapshot_size, replayed_size } => {
                write!(f, "segment {address:#x}: snapshot {}, replay {}", side(snapshot_size), side(replayed_size))
            }
            Mismatch::Block { address, snapshot, replayed } => {
                write!(f, "block {address:#x}: snapshot {}, replay {}", side(snapshot), side(replayed))
            }
        }
    }
}

/// Something in the trace the allocator could not have done; the replay carries on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diagnostic {
    /// Event index, or `None` for the start-state reconstruction.
    pub event_index: Option<usize>,
    pub address: u64,
    pub kind: DiagnosticKind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DiagnosticKind {
    /// An address that lies in no segment at that moment.
    OutsideSegments,
    /// `alloc` where no free block starts.
    AllocOverlaps,
    /// `free_requested`/`free_completed` of a block that is not allocated / pending there.
    UnknownFree,
    /// `segment_free` of a segment that is not wholly free, or not known.
    SegmentNotFree,
    /// `segment_alloc`/`segment_map` over memory already reserved.
    SegmentOverlaps,
    /// `segment_unmap` of memory that is not one free block.
    UnmapNotFree,
    /// The final segment table and the trace disagree about the start (e.g. a block alive at
    /// dump that overlaps another, or lies outside every segment).
    StartConflict,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.kind {
            DiagnosticKind::OutsideSegments => "address outside every segment",
            DiagnosticKind::AllocOverlaps => "alloc where no free block starts",
            DiagnosticKind::UnknownFree => "free of a block that is not allocated",
            DiagnosticKind::SegmentNotFree => "segment_free of a segment that is not wholly free",
            DiagnosticKind::SegmentOverlaps => "segment over memory already reserved",
            DiagnosticKind::UnmapNotFree => "segment_unmap of memory that is not free",
            DiagnosticKind::StartConflict => "final segment table conflicts with the trace",
        };
        match self.event_index {
            Some(i) => write!(f, "event {i}: {what} ({:#x})", self.address),
            None => write!(f, "start: {what} ({:#x})", self.address),
        }
    }
}

/// Diagnostics kept per device (all are counted).
pub(crate) const MAX_DIAGNOSTICS: usize = 50;

/// Diagnostics as they are found: the first few kept, all counted. A file that is not what it
/// claims to be can produce one per event.
#[derive(Debug, Default)]
pub(crate) struct Log {
    pub kept: Vec<Diagnostic>,
    pub count: usize,
}

impl Log {
    pub fn push(&mut self, event_index: Option<usize>, address: u64, kind: DiagnosticKind) {
        self.count += 1;
        if self.kept.len() < MAX_DIAGNOSTICS {
            self.kept.push(Diagnostic { event_index, address, kind });
        }
    }

    pub fn append(&mut self, other: Log) {
        self.count += other.count;
        self.kept.extend(other.kept);
    }

    /// Logs of parts of one walk over the events (each in event order, kept by the same cap),
    /// logged after these as the walk itself would have: the first ones in event order are
    /// among the first ones of each part.
    pub fn append_interleaved(&mut self, parts: Vec<Log>) {
        let mut kept: Vec<Diagnostic> = Vec::new();
        for p in parts {
            self.count += p.count;
            kept.extend(p.kept);
        }
        kept.sort_by_key(|d| d.event_index);
        let room = MAX_DIAGNOSTICS.saturating_sub(self.kept.len());
        self.kept.extend(kept.into_iter().take(room));
    }
}

/// Everything replayed for one device.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DeviceReplay {
    pub device: u32,
    /// Number of trace events (the length of every series column).
    pub event_count: usize,
    pub series: Series,
    pub peaks: Peaks,
    pub start: StartState,
    pub check: SelfCheck,
    /// Every block that existed during the trace: blocks from before the trace first (by
    /// address), then in allocation order.
    pub blocks: Vec<BlockLifetime>,
    /// Every segment / mapped range, ordered by address then creation.
    pub segments: Vec<SegmentLifetime>,
    /// The first few diagnostics, in event order.
    pub diagnostics: Vec<Diagnostic>,
    pub diagnostic_count: usize,
}

/// The replay of a whole snapshot, one entry per device (ascending).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Replay {
    pub devices: Vec<DeviceReplay>,
}

impl Replay {
    pub fn device(&self, device: u32) -> Option<&DeviceReplay> {
        memsnap_model::find_device(&self.devices, device, |d| d.device)
    }
}

#[cfg(test)]
mod block_lifetime_tests {
    use super::*;

    #[test]
    fn a_block_lifetime_is_40_bytes() {
        assert_eq!(std::mem::size_of::<BlockLifetime>(), 40);
    }

    #[test]
    fn events_and_the_pending_flag_read_back() {
        let b = BlockLifetime::before_trace(0x100, 512, 500, StackId::EMPTY, true);
        assert_eq!((b.alloc_event(), b.free_requested_event(), b.free_completed_event()), (None, None, None));
        assert!(b.pending_at_start());
        assert_eq!(b.state_after(None), Some(BlockState::PendingFree));
        let mut b = BlockLifetime::allocated_at(4, 0x100, 512, 500, StackId::EMPTY);
        assert!(!b.pending_at_start());
        b.set_free_requested(6);
        b.set_free_completed(9);
        assert_eq!((b.alloc_event(), b.freed_at(), b.free_completed_event()), (Some(4), Some(6), Some(9)));
        assert_eq!(b.state_after(Some(3)), None);
        assert_eq!(b.state_after(Some(5)), Some(BlockState::Allocated));
        assert_eq!(b.state_after(Some(7)), Some(BlockState::PendingFree));
        assert_eq!(b.state_after(Some(9)), None);
    }
}
