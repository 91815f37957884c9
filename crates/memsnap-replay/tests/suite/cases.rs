//! Small hand-written traces, one allocator rule each: the counters after every event and the
//! start reconstruction are checked against values worked out by hand.

use memsnap_model::{
    Action, AllocatorSettings, Block, BlockState, DeviceTrace, Segment, SegmentType, Snapshot, Stack, StackId,
    TraceEvent,
};
use memsnap_replay::{replay, DeviceReplay, DiagnosticKind};

const MIB: u64 = 1 << 20;
const BASE: u64 = 0x7f00_0000_0000;

fn ev(action: Action, addr: u64, size: u64) -> TraceEvent {
    let mut e = TraceEvent::new(action, addr);
    e.size = size;
    e.time_us = 0;
    e
}

fn block(address: u64, size: u64, state: BlockState) -> Block {
    Block { address, size, requested_size: size, state, stack: StackId::EMPTY, address_derived: false }
}

fn segment(address: u64, total_size: u64, is_expandable: bool, blocks: Vec<Block>) -> Segment {
    Segment {
        device: 0,
        address,
        total_size,
        allocated_size: 0,
        active_size: 0,
        requested_size: 0,
        stream: 0,
        segment_type: if total_size == 2 * MIB { SegmentType::Small } else { SegmentType::Large },
        pool_id: (0, 0),
        is_expandable,
        stack: StackId::EMPTY,
        blocks,
    }
}

fn run(segments: Vec<Segment>, events: Vec<TraceEvent>, settings: AllocatorSettings) -> DeviceReplay {
    let snapshot = Snapshot {
        segments,
        traces: vec![DeviceTrace { device: 0, events, summary: None }],
        settings,
        strings: vec![String::new()],
        stacks: vec![Stack::default()],
        ..Snapshot::default()
    };
    let mut r = replay(&snapshot);
    let d = r.devices.remove(0);
    assert!(d.check.matches_snapshot, "{:?}", d.check.mismatches);
    assert_eq!(d.diagnostic_count, 0, "{:?}", d.diagnostics);
    d
}

/// Allocated bytes after each event.
fn allocated(d: &DeviceReplay) -> Vec<u64> {
    d.series.column(|t| t.allocated)
}

#[test]
fn unsplit_large_block_is_allocated_whole() {
    // A 20 MiB segment; 18.5 MiB requested leaves 1.5 MiB (> 1 MiB): split. Freed, then 19.5 MiB
    // requested leaves 0.5 MiB (<= 1 MiB): the whole 20 MiB block is handed out.
    let s = BASE;
    let events = vec![
        ev(Action::SegmentAlloc, s, 20 * MIB),
        ev(Action::Alloc, s, 18 * MIB + MIB / 2),
        ev(Action::FreeRequested, s, 18 * MIB + MIB / 2),
        ev(Action::FreeCompleted, s, 18 * MIB + MIB / 2),
        ev(Action::Alloc, s, 19 * MIB + MIB / 2),
    ];
    let finals = vec![segment(s, 20 * MIB, false, vec![block(s, 20 * MIB, BlockState::Allocated)])];
    let d = run(finals, events, AllocatorSettings::default());
    assert_eq!(allocated(&d), vec![0, 18 * MIB + MIB / 2, 0, 0, 20 * MIB]);
    assert!(d.start.trace_complete);
    assert_eq!(d.blocks[1].size, 20 * MIB);
    assert_eq!(d.blocks[1].requested_size, 19 * MIB + MIB / 2);
}

#[test]
fn oversize_blocks_are_never_split() {
    // max_split_size 8 MiB: a 10 MiB request on a 30 MiB segment holds all of it.
    let s = BASE;
    let settings = AllocatorSettings { max_split_size: Some(8 * MIB), ..AllocatorSettings::default() };
    let events = vec![ev(Action::SegmentAlloc, s, 30 * MIB), ev(Action::Alloc, s, 10 * MIB)];
    let finals = vec![segment(s, 30 * MIB, false, vec![block(s, 30 * MIB, BlockState::Allocated)])];
    let d = run(finals, events, settings);
    assert_eq!(allocated(&d), vec![0, 30 * MIB]);
}

#[test]
fn pending_free_leaves_allocated_first_and_active_later() {
    // record_stream: free_requested drops allocated, free_completed (later) drops active.
    let s = BASE;
    let events = vec![
        ev(Action::SegmentAlloc, s, 2 * MIB),
        ev(Action::Alloc, s, 4096),
        ev(Action::FreeRequested, s, 4096),
        ev(Action::Alloc, s + 4096, 4096),
        ev(Action::FreeCompleted, s, 4096),
    ];
    let finals = vec![segment(
        s,
        2 * MIB,
        false,
        vec![
            block(s, 4096, BlockState::Inactive),
            block(s + 4096, 4096, BlockState::Allocated),
            block(s + 8192, 2 * MIB - 8192, BlockState::Inactive),
        ],
    )];
    let d = run(finals, events, AllocatorSettings::default());
    assert_eq!(allocated(&d), vec![0, 4096, 0, 4096, 4096]);
    assert_eq!(d.series.column(|t| t.active), vec![0, 4096, 4096, 8192, 4096]);
    assert_eq!(d.series.column(|t| t.requested), vec![0, 4096, 4096, 8192, 4096]);
}

#[test]
fn segments_at_a_reused_address_do_not_mix() {
    // Two adjacent segments never merge free blocks; an address released with its segment comes
    // back as another segment.
    let (a, b) = (BASE, BASE + 2 * MIB);
    let events = vec![
        ev(Action::SegmentAlloc, a, 2 * MIB),
        ev(Action::SegmentAlloc, b, 2 * MIB),
        ev(Action::Alloc, b, 512),
        ev(Action::FreeRequested, b, 512),
        ev(Action::FreeCompleted, b, 512),
        ev(Action::SegmentFree, a, 2 * MIB),
        ev(Action::SegmentAlloc, a, 2 * MIB),
        ev(Action::Alloc, a, 512),
    ];
    let finals = vec![
        segment(
            a,
            2 * MIB,
            false,
            vec![block(a, 512, BlockState::Allocated), block(a + 512, 2 * MIB - 512, BlockState::Inactive)],
        ),
        segment(b, 2 * MIB, false, vec![block(b, 2 * MIB, BlockState::Inactive)]),
    ];
    let d = run(finals, events, AllocatorSettings::default());
    assert_eq!(
        d.series.column(|t| t.reserved),
        vec![2 * MIB, 4 * MIB, 4 * MIB, 4 * MIB, 4 * MIB, 2 * MIB, 4 * MIB, 4 * MIB]
    );
    let lifetimes: Vec<_> = d.segments.iter().map(|s| (s.address, s.created_event, s.released_event)).collect();
    assert_eq!(lifetimes, vec![(a, Some(0), Some(5)), (a, Some(6), None), (b, Some(1), None)]);
}

#[test]
fn impossible_events_are_reported_not_fatal() {
    // An allocation in the middle of a free block, and a free of a block never allocated.
    let s = BASE;
    let events = vec![
        ev(Action::SegmentAlloc, s, 2 * MIB),
        ev(Action::Alloc, s + MIB, 512),
        ev(Action::FreeRequested, s + 4096, 512),
    ];
    let snapshot = Snapshot {
        segments: vec![segment(
            s,
            2 * MIB,
            false,
            vec![
                block(s, MIB, BlockState::Inactive),
                block(s + MIB, 512, BlockState::Allocated),
                block(s + MIB + 512, MIB - 512, BlockState::Inactive),
            ],
        )],
        traces: vec![DeviceTrace { device: 0, events, summary: None }],
        strings: vec![String::new()],
        stacks: vec![Stack::default()],
        ..Snapshot::default()
    };
    let d = replay(&snapshot).devices.remove(0);
    let kinds: Vec<_> = d.diagnostics.iter().map(|x| (x.event_index, x.kind)).collect();
    assert_eq!(kinds, vec![(Some(1), DiagnosticKind::AllocOverlaps), (Some(2), DiagnosticKind::UnknownFree)]);
    // The allocation is still placed where the trace says, so the end state matches.
    assert!(d.check.matches_snapshot, "{:?}", d.check.mismatches);
    assert_eq!(d.series.column(|t| t.allocated), vec![0, 512, 512]);
}

#[test]
fn expandable_segments_map_and_unmap() {
    // Mapped memory grows and shrinks at the end; blocks split with the 512-byte rule even in the
    // large pool.
    let s = BASE;
    let settings = AllocatorSettings { expandable_segments: Some(true), ..AllocatorSettings::default() };
    let events = vec![
        ev(Action::SegmentMap, s, 20 * MIB),
        ev(Action::Alloc, s, 19 * MIB + MIB / 2),
        ev(Action::SegmentMap, s + 20 * MIB, 20 * MIB),
        ev(Action::Alloc, s + 19 * MIB + MIB / 2, 2 * MIB),
        ev(Action::FreeRequested, s + 19 * MIB + MIB / 2, 2 * MIB),
        ev(Action::FreeCompleted, s + 19 * MIB + MIB / 2, 2 * MIB),
        ev(Action::SegmentUnmap, s + 20 * MIB, 20 * MIB),
    ];
    let finals = vec![segment(
        s,
        20 * MIB,
        true,
        vec![
            block(s, 19 * MIB + MIB / 2, BlockState::Allocated),
            block(s + 19 * MIB + MIB / 2, MIB / 2, BlockState::Inactive),
        ],
    )];
    let d = run(finals, events, settings);
    assert_eq!(allocated(&d)[1], 19 * MIB + MIB / 2);
    assert_eq!(
        d.series.column(|t| t.reserved),
        vec![20 * MIB, 20 * MIB, 40 * MIB, 40 * MIB, 40 * MIB, 40 * MIB, 20 * MIB]
    );
    // After the second map, the two mapped ranges are one segment.
    let map = d.state_after(Some(3));
    assert_eq!(map.segments.len(), 1);
    assert_eq!(map.segments[0].total_size, 40 * MIB);
}

#[test]
fn start_of_a_wrapped_trace_is_reconstructed() {
    // The trace begins mid-run: one block alive at dump was allocated before it, one block
    // freed during it was too. The freed one asked for 3 MiB in the large pool: it may have been
    // given a block of up to 4 MiB whole, unless something tells otherwise — here the next block
    // at +3.5 MiB caps it.
    let s = BASE;
    let events = vec![
        ev(Action::FreeRequested, s, 3 * MIB),
        ev(Action::FreeCompleted, s, 3 * MIB),
        ev(Action::Alloc, s, MIB + 512),
    ];
    let finals = vec![segment(
        s,
        20 * MIB,
        false,
        vec![
            block(s, MIB + 512, BlockState::Allocated),
            block(s + MIB + 512, 3 * MIB + MIB / 2 - MIB - 512, BlockState::Inactive),
            block(s + 3 * MIB + MIB / 2, MIB, BlockState::Allocated),
            block(s + 4 * MIB + MIB / 2, 15 * MIB + MIB / 2, BlockState::Inactive),
        ],
    )];
    let d = run(finals, events, AllocatorSettings::default());
    assert!(!d.start.trace_complete);
    assert_eq!((d.start.segments, d.start.blocks), (1, 2));
    assert_eq!(d.start.uncertain_blocks.len(), 1);
    let u = d.start.uncertain_blocks[0];
    assert_eq!((u.address, u.size_assumed, u.size_max), (s, 3 * MIB, 3 * MIB + MIB / 2));
    assert_eq!(d.start.uncertain_bytes, MIB / 2);
    assert_eq!(d.series.start.allocated, 4 * MIB);
    assert_eq!(allocated(&d), vec![MIB, MIB, 2 * MIB + 512]);
}

/// The series stores each value as a difference from its chunk's start; a counter that moves by
/// more than 2 GiB within a chunk (here an 8 GiB segment and block) is kept whole and read back
/// exactly, and the values around it are unchanged.
#[test]
fn series_values_far_from_their_chunk_start_are_exact() {
    const GIB: u64 = 1 << 30;
    let events = vec![
        ev(Action::SegmentAlloc, BASE, 8 * GIB),
        ev(Action::Alloc, BASE, 8 * GIB),
        ev(Action::FreeRequested, BASE, 8 * GIB),
        ev(Action::FreeCompleted, BASE, 8 * GIB),
        ev(Action::SegmentFree, BASE, 8 * GIB),
    ];
    let d = run(Vec::new(), events, AllocatorSettings::default());
    assert_eq!(allocated(&d), vec![0, 8 * GIB, 0, 0, 0]);
    assert_eq!(d.series.column(|t| t.reserved), vec![8 * GIB, 8 * GIB, 8 * GIB, 8 * GIB, 0]);
    assert_eq!(d.series.column(|t| t.active), vec![0, 8 * GIB, 8 * GIB, 0, 0]);
    assert_eq!(d.peaks.allocated.value, 8 * GIB);
}

/// A snapshot of one device's trace whose segments were all released by the dump.
fn no_segments_at_dump(events: Vec<TraceEvent>) -> Snapshot {
    Snapshot {
        traces: vec![DeviceTrace { device: 0, events, summary: None }],
        strings: vec![String::new()],
        stacks: vec![Stack::default()],
        ..Snapshot::default()
    }
}

/// The replay of device 0 on a pool of `threads` threads.
fn replay_on(snapshot: &Snapshot, threads: usize) -> DeviceReplay {
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
    pool.install(|| replay(snapshot).devices.remove(0))
}

#[test]
fn long_traces_route_alike_on_any_thread_count() {
    // Events are routed to segments in parallel chunks (of at least 65,536 events), each from
    // the segments reserved at its start: a trace long enough for several chunks, whose
    // segments come and go across their boundaries, with an allocation outside every segment
    // in each cycle. Every cycle: segment_alloc, alloc (the whole segment), a stray alloc,
    // free_requested, free_completed, segment_free; three segment addresses take turns.
    const CYCLES: usize = 40_000;
    const STRAY: u64 = 0x10_0000;
    let size = 20 * MIB;
    let mut events = Vec::with_capacity(CYCLES * 6);
    for k in 0..CYCLES {
        let a = BASE + (k % 3) as u64 * 32 * MIB;
        events.push(ev(Action::SegmentAlloc, a, size));
        events.push(ev(Action::Alloc, a, size));
        events.push(ev(Action::Alloc, STRAY + k as u64 * 512, 512));
        events.push(ev(Action::FreeRequested, a, size));
        events.push(ev(Action::FreeCompleted, a, size));
        events.push(ev(Action::SegmentFree, a, size));
    }
    let snapshot = no_segments_at_dump(events);
    let on = |threads: usize| replay_on(&snapshot, threads);
    let d = on(4);
    assert_eq!(d.diagnostic_count, CYCLES);
    let stray: Vec<_> = d.diagnostics.iter().map(|x| (x.event_index, x.address, x.kind)).collect();
    let expected: Vec<_> = (0..d.diagnostics.len())
        .map(|k| (Some(k * 6 + 2), STRAY + k as u64 * 512, DiagnosticKind::OutsideSegments))
        .collect();
    assert!(!stray.is_empty());
    assert_eq!(stray, expected);
    let lives: Vec<_> = d.blocks.iter().map(|b| (b.address, b.alloc_event(), b.freed_at())).collect();
    let expected: Vec<_> = (0..CYCLES)
        .map(|k| (BASE + (k % 3) as u64 * 32 * MIB, Some(k as u32 * 6 + 1), Some(k as u32 * 6 + 3)))
        .collect();
    assert_eq!(lives, expected);
    assert_eq!(d.peaks.allocated.value, size);
    assert!(d.check.matches_snapshot, "{:?}", d.check.mismatches);
    for threads in [1, 2, 3] {
        assert!(on(threads) == d, "{threads} threads replay differently from 4");
    }
}

#[test]
fn blocks_of_two_segments_merge_in_allocation_order_across_ranges() {
    // Block lifetimes are merged from the units' lists in ranges of events side by side (at
    // least 65,536 events each): two segments whose blocks interleave over 360,000 events, so
    // that every range holds blocks of both and starts partway through each list. The blocks
    // must come out in allocation order, and alike on any thread count.
    const CYCLES: usize = 60_000;
    let size = 2 * MIB;
    let (a, b) = (BASE, BASE + 32 * MIB);
    let mut events = vec![ev(Action::SegmentAlloc, a, size), ev(Action::SegmentAlloc, b, size)];
    for _ in 0..CYCLES {
        events.push(ev(Action::Alloc, a, size));
        events.push(ev(Action::Alloc, b, size));
        events.push(ev(Action::FreeRequested, a, size));
        events.push(ev(Action::FreeCompleted, a, size));
        events.push(ev(Action::FreeRequested, b, size));
        events.push(ev(Action::FreeCompleted, b, size));
    }
    let snapshot = no_segments_at_dump(events);
    let on = |threads: usize| replay_on(&snapshot, threads);
    let d = on(4);
    let lives: Vec<_> = d.blocks.iter().map(|x| (x.address, x.alloc_event(), x.freed_at())).collect();
    let expected: Vec<_> = (0..CYCLES as u32)
        .flat_map(|k| {
            let first = 2 + k * 6;
            [(a, Some(first), Some(first + 2)), (b, Some(first + 1), Some(first + 4))]
        })
        .collect();
    assert_eq!(lives.len(), expected.len());
    assert!(lives == expected, "blocks out of allocation order");
    for threads in [1, 2, 3] {
        assert!(on(threads) == d, "{threads} threads replay differently from 4");
    }
}

#[test]
fn many_live_segments_route_alike_with_fewer_chunks() {
    // 40,000 segments reserved at once, then each used and released: a chunk boundary where tens
    // of thousands of segments are reserved is skipped when its copy of them would pass the
    // budget (a unit per 4 events), so chunks differ in length; the routing must not change.
    const SEGMENTS: u64 = 40_000;
    let size = 20 * MIB;
    let at = |k: u64| BASE + k * 32 * MIB;
    let mut events: Vec<TraceEvent> = (0..SEGMENTS).map(|k| ev(Action::SegmentAlloc, at(k), size)).collect();
    for k in 0..SEGMENTS {
        events.push(ev(Action::Alloc, at(k), size));
        events.push(ev(Action::FreeRequested, at(k), size));
        events.push(ev(Action::FreeCompleted, at(k), size));
        events.push(ev(Action::SegmentFree, at(k), size));
    }
    let snapshot = no_segments_at_dump(events);
    let on = |threads: usize| replay_on(&snapshot, threads);
    let d = on(4);
    assert_eq!(d.diagnostic_count, 0, "{:?}", d.diagnostics);
    let lives: Vec<_> = d.blocks.iter().map(|b| (b.address, b.alloc_event(), b.freed_at())).collect();
    let first = SEGMENTS as u32;
    let expected: Vec<_> =
        (0..SEGMENTS).map(|k| (at(k), Some(first + k as u32 * 4), Some(first + k as u32 * 4 + 1))).collect();
    assert_eq!(lives, expected);
    assert_eq!(d.peaks.reserved.value, SEGMENTS * size);
    assert!(d.check.matches_snapshot, "{:?}", d.check.mismatches);
    for threads in [1, 2, 8] {
        assert!(on(threads) == d, "{threads} threads replay differently from 4");
    }
}
