//! Synthetic traces for the detector tests: a [`TraceBuilder`] that writes a [`Snapshot`] the way
//! PyTorch would have (interned frames and stacks, a trace of `segment_alloc` / `alloc` /
//! `free_requested` + `free_completed` / `oom` events, and the final segment table), and a
//! [`program`] kit that emits what a small training script does (forward passes through
//! `nn.Module` calls, backward launched from `.backward()` with frameless engine allocations,
//! Adam steps, `zero_grad`).
//!
//! The allocator model is deliberately simple so the replay reproduces it exactly: large pool
//! only (every size a multiple of 2 MiB, so a split leaves 0 or ≥ 2 MiB and the large-pool rule
//! "split when the remainder is > 1 MiB" always splits), first fit at the start of the first
//! free block that is large enough (segments in creation order), merging with free neighbours
//! on free. When nothing fits, a new segment is reserved the way the caching allocator sizes
//! large segments (20 MiB below 10 MiB, else the request rounded up to 2 MiB), or the caller
//! reserves one explicitly with [`TraceBuilder::segment`].

#![allow(dead_code)] // not every test uses every helper

pub mod prelude;
pub mod program;
pub mod recording;
pub mod scenario;

use std::collections::{BTreeMap, HashMap};

use memsnap_model::{
    Action, AllocatorSettings, Block, BlockState, DeviceTrace, Frame, FrameId, Producer, Segment, SegmentType,
    Snapshot, SourceInfo, Stack, StackId, StrId, TraceEvent,
};

pub const MIB: u64 = 1 << 20;
/// Every size the builder hands out is a multiple of this.
pub const GRANULE: u64 = 2 * MIB;
/// Where the first segment starts (a typical CUDA VA), and the gap between segments.
const BASE: u64 = 0x7f3a_0000_0000;
const SEGMENT_STRIDE: u64 = 1 << 32;
const T0: i64 = 1_795_964_000_000_000;

/// One frame as written in a script: `(filename, line, function)`.
pub type Fr = (&'static str, u32, &'static str);

/// A live allocation (its address).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Blk(pub u64);

struct Seg {
    address: u64,
    size: u64,
    /// Free blocks: start → size, merged.
    free: BTreeMap<u64, u64>,
    released: bool,
    stack: StackId,
}

impl Seg {
    fn contains(&self, addr: u64) -> bool {
        self.address <= addr && addr < self.address + self.size
    }
}

#[derive(Clone, Copy)]
struct Live {
    size: u64,
    stack: StackId,
}

/// Builds a one-device snapshot event by event.
pub struct TraceBuilder {
    strings: Vec<String>,
    string_ids: HashMap<String, StrId>,
    frames: Vec<Frame>,
    frame_ids: HashMap<Frame, FrameId>,
    stacks: Vec<Stack>,
    stack_ids: HashMap<Vec<FrameId>, StackId>,
    segs: Vec<Seg>,
    live: BTreeMap<u64, Live>,
    events: Vec<TraceEvent>,
    time: i64,
    /// `memory_allocated()` / `memory_reserved()` as the builder's allocator counts them.
    pub allocated: u64,
    pub reserved: u64,
    pub peak_allocated: u64,
    pub peak_reserved: u64,
}

impl Default for TraceBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl TraceBuilder {
    pub fn new() -> TraceBuilder {
        let mut b = TraceBuilder {
            strings: Vec::new(),
            string_ids: HashMap::new(),
            frames: Vec::new(),
            frame_ids: HashMap::new(),
            stacks: vec![Stack::default()],
            stack_ids: HashMap::new(),
            segs: Vec::new(),
            live: BTreeMap::new(),
            events: Vec::new(),
            time: T0,
            allocated: 0,
            reserved: 0,
            peak_allocated: 0,
            peak_reserved: 0,
        };
        b.string(""); // StrId::EMPTY
        b.stack_ids.insert(Vec::new(), StackId::EMPTY);
        b
    }

    /// A builder whose trace starts with one big large-pool segment of `bytes`.
    pub fn with_segment(bytes: u64) -> TraceBuilder {
        let mut b = TraceBuilder::new();
        b.segment(bytes, &[]);
        b
    }

    fn string(&mut self, s: &str) -> StrId {
        if let Some(&id) = self.string_ids.get(s) {
            return id;
        }
        let id = StrId(self.strings.len() as u32);
        self.strings.push(s.to_string());
        self.string_ids.insert(s.to_string(), id);
        id
    }

    pub fn frame(&mut self, (file, line, name): Fr) -> FrameId {
        let f = Frame { filename: self.string(file), line, name: self.string(name) };
        if let Some(&id) = self.frame_ids.get(&f) {
            return id;
        }
        let id = FrameId(self.frames.len() as u32);
        self.frames.push(f.clone());
        self.frame_ids.insert(f, id);
        id
    }

    /// Intern a stack given innermost frame first (the order PyTorch records).
    pub fn stack(&mut self, frames: &[Fr]) -> StackId {
        let ids: Vec<FrameId> = frames.iter().map(|&f| self.frame(f)).collect();
        if let Some(&id) = self.stack_ids.get(&ids) {
            return id;
        }
        let id = StackId(self.stacks.len() as u32);
        self.stacks.push(Stack { frames: ids.clone() });
        self.stack_ids.insert(ids, id);
        id
    }

    fn push(&mut self, action: Action, addr: u64, size: u64, stack: StackId) {
        self.time += 7;
        let mut e = TraceEvent::new(action, addr);
        e.size = size;
        e.time_us = self.time;
        e.stack = stack;
        self.events.push(e);
    }

    pub fn event_count(&self) -> usize {
        self.events.len()
    }

    /// Reserve a large-pool segment (`segment_alloc`); returns its address.
    pub fn segment(&mut self, bytes: u64, frames: &[Fr]) -> u64 {
        assert!(bytes > 0 && bytes / GRANULE * GRANULE == bytes, "segment sizes are multiples of 2 MiB, not {bytes}");
        assert_ne!(bytes, GRANULE, "a 2 MiB segment would be taken for a small-pool segment");
        let stack = self.stack(frames);
        let address = BASE + self.segs.len() as u64 * SEGMENT_STRIDE;
        self.segs.push(Seg { address, size: bytes, free: BTreeMap::from([(address, bytes)]), released: false, stack });
        self.reserved += bytes;
        self.peak_reserved = self.peak_reserved.max(self.reserved);
        self.push(Action::SegmentAlloc, address, bytes, stack);
        address
    }

    /// `alloc` of `bytes` (a multiple of 2 MiB) from the stack `frames` (innermost first; empty
    /// for a frameless backward allocation).
    pub fn alloc(&mut self, bytes: u64, frames: &[Fr]) -> Blk {
        assert!(
            bytes > 0 && bytes / GRANULE * GRANULE == bytes,
            "allocation sizes are multiples of 2 MiB, not {bytes}"
        );
        let stack = self.stack(frames);
        let found = self
            .segs
            .iter()
            .enumerate()
            .filter(|(_, s)| !s.released)
            .find_map(|(k, s)| s.free.iter().find(|(_, &size)| size >= bytes).map(|(&a, &size)| (k, a, size)));
        let (k, addr, size) = match found {
            Some(x) => x,
            None => {
                // What the caching allocator reserves for a large request it cannot serve.
                let seg = if bytes < 10 * MIB { 20 * MIB } else { bytes };
                self.segment(seg, frames);
                let k = self.segs.len() - 1;
                (k, self.segs[k].address, seg)
            }
        };
        let seg = &mut self.segs[k];
        seg.free.remove(&addr);
        if size > bytes {
            seg.free.insert(addr + bytes, size - bytes);
        }
        self.live.insert(addr, Live { size: bytes, stack });
        self.allocated += bytes;
        self.peak_allocated = self.peak_allocated.max(self.allocated);
        self.push(Action::Alloc, addr, bytes, stack);
        Blk(addr)
    }

    /// `free_requested` then `free_completed` (same stream), from the stack `frames`.
    pub fn free(&mut self, blk: Blk, frames: &[Fr]) {
        let stack = self.stack(frames);
        let live = self.live.remove(&blk.0).unwrap_or_else(|| panic!("free of {:#x}, which is not allocated", blk.0));
        let seg = self.segs.iter_mut().find(|s| !s.released && s.contains(blk.0)).expect("block in a segment");
        let (mut start, mut size) = (blk.0, live.size);
        if let Some((&a, &s)) = seg.free.range(..start).next_back() {
            if a + s == start {
                seg.free.remove(&a);
                start = a;
                size += s;
            }
        }
        if let Some(s) = seg.free.remove(&(blk.0 + live.size)) {
            size += s;
        }
        seg.free.insert(start, size);
        self.allocated -= live.size;
        self.push(Action::FreeRequested, blk.0, live.size, stack);
        self.push(Action::FreeCompleted, blk.0, live.size, stack);
    }

    pub fn is_live(&self, blk: Blk) -> bool {
        self.live.contains_key(&blk.0)
    }

    /// `torch.cuda.empty_cache()`: `segment_free` of every wholly free segment.
    pub fn empty_cache(&mut self, frames: &[Fr]) {
        let stack = self.stack(frames);
        for k in 0..self.segs.len() {
            let s = &self.segs[k];
            if !s.released && s.free.get(&s.address) == Some(&s.size) {
                let (address, size) = (s.address, s.size);
                self.segs[k].released = true;
                self.reserved -= size;
                self.push(Action::SegmentFree, address, size, stack);
            }
        }
    }

    /// An `oom` event: `requested` bytes could not be had while the device had `device_free`.
    pub fn oom(&mut self, requested: u64, device_free: u64, frames: &[Fr]) {
        let stack = self.stack(frames);
        self.push(Action::Oom, device_free, requested, stack);
    }

    /// Largest free block of the live segments.
    pub fn largest_free(&self) -> u64 {
        self.segs.iter().filter(|s| !s.released).flat_map(|s| s.free.values().copied()).max().unwrap_or(0)
    }

    /// The snapshot: the trace, and the segment table at the end (blocks covering each segment).
    pub fn finish(self) -> Snapshot {
        let mut segments = Vec::new();
        for s in self.segs.iter().filter(|s| !s.released) {
            let mut blocks: Vec<Block> = s
                .free
                .iter()
                .map(|(&address, &size)| Block {
                    address,
                    size,
                    requested_size: 0,
                    state: BlockState::Inactive,
                    stack: StackId::EMPTY,
                    address_derived: false,
                })
                .collect();
            blocks.extend(self.live.range(s.address..s.address + s.size).map(|(&address, l)| Block {
                address,
                size: l.size,
                requested_size: l.size,
                state: BlockState::Allocated,
                stack: l.stack,
                address_derived: false,
            }));
            blocks.sort_by_key(|b| b.address);
            assert_eq!(blocks.iter().map(|b| b.size).sum::<u64>(), s.size, "blocks cover the segment");
            let allocated: u64 = blocks.iter().filter(|b| b.state == BlockState::Allocated).map(|b| b.size).sum();
            segments.push(Segment {
                device: 0,
                address: s.address,
                total_size: s.size,
                allocated_size: allocated,
                active_size: allocated,
                requested_size: allocated,
                stream: 0,
                segment_type: SegmentType::Large,
                pool_id: (0, 0),
                is_expandable: false,
                stack: s.stack,
                blocks,
            });
        }
        let events_with_frames = self.events.iter().filter(|e| e.stack != StackId::EMPTY).count() as u64;
        Snapshot {
            segments,
            traces: vec![DeviceTrace { device: 0, events: self.events, summary: None }],
            settings: AllocatorSettings {
                alloc_conf: Some(String::new()),
                max_split_size: None,
                garbage_collection_threshold: Some(0.0),
                expandable_segments: Some(false),
                roundup_power2_divisions: BTreeMap::new(),
                raw: BTreeMap::new(),
                ..Default::default()
            },
            annotations: Vec::new(),
            host: Default::default(),
            strings: self.strings,
            frames: self.frames,
            stacks: self.stacks,
            contexts: Vec::new(),
            source: SourceInfo {
                protocol: 4,
                producer: Producer::PythonPickler,
                events_with_frames,
                has_trace_key: true,
                ..SourceInfo::default()
            },
        }
    }
}

// ------------------------------------------------------------------------------------------
// The builder's own test: what it writes is what the replay reproduces.

#[test]
fn builder_traces_replay_exactly() {
    const USER: Fr = ("/home/u/train.py", 12, "<module>");
    let mut t = TraceBuilder::with_segment(64 * MIB);
    let a = t.alloc(8 * MIB, &[USER]);
    let b = t.alloc(4 * MIB, &[USER]);
    let c = t.alloc(16 * MIB, &[]);
    t.free(b, &[USER]);
    // Fits the 4 MiB hole exactly, then splits the tail.
    let d = t.alloc(4 * MIB, &[USER]);
    let e = t.alloc(2 * MIB, &[USER]);
    t.free(a, &[]);
    t.free(d, &[]); // merges with a's hole: [0, 12 MiB) is free, and [30, 64 MiB)
                    // Larger than any hole, at least 10 MiB: a segment of exactly the request.
    let f = t.alloc(40 * MIB, &[USER]);
    let g = t.alloc(34 * MIB, &[USER]); // the tail of the first segment
    let h = t.alloc(12 * MIB, &[USER]); // the merged hole
                                        // Below 10 MiB and no room anywhere: a 20 MiB segment.
    let i = t.alloc(6 * MIB, &[USER]);
    assert_eq!(t.reserved, 124 * MIB);
    t.free(f, &[USER]);
    t.empty_cache(&[USER]); // releases f's segment
    assert_eq!(t.reserved, 84 * MIB);
    let j = t.alloc(8 * MIB, &[USER]); // into the 20 MiB segment
    t.free(g, &[]);
    t.oom(1 << 40, 123 * MIB, &[USER]);
    let _ = (c, e, h, i, j);
    let (peak_a, peak_r, end_a, end_r) = (t.peak_allocated, t.peak_reserved, t.allocated, t.reserved);
    let snap = t.finish();
    let r = memsnap_replay::replay(&snap);
    assert_eq!(r.devices.len(), 1);
    let d0 = &r.devices[0];
    assert!(d0.check.matches_snapshot, "self-check: {:?}", d0.check.mismatches);
    assert_eq!(d0.diagnostic_count, 0, "{:?}", d0.diagnostics);
    assert!(d0.start.trace_complete);
    assert_eq!(d0.peaks.allocated.value, peak_a);
    assert_eq!(d0.peaks.reserved.value, peak_r);
    let end = d0.series.after(Some(d0.event_count - 1));
    assert_eq!((end.allocated, end.reserved), (end_a, end_r));
    let totals = &snap.device_totals()[0];
    assert_eq!((totals.allocated_bytes, totals.reserved_bytes), (end_a, end_r));
}
