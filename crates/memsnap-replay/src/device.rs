//! Replay of one device: route events to units, replay units in parallel, merge their effects
//! into the per-device series in event order.

use memsnap_model::{Action, Segment, Snapshot, TraceEvent};
use rayon::prelude::*;

use crate::check::self_check;
use crate::effects::{Delta, Effects};
use crate::output::{
    BlockLifetime, DeviceReplay, DiagnosticKind, Log, SegmentLifetime, StartState, Totals, MAX_DIAGNOSTICS,
};
use crate::rules::Rules;
use crate::series::build_series;
use crate::start::{reserved_at_start, Meta, Reserved};
use crate::unit::{replay_group, EndSegment, GroupOutcome, Outcome, Unit, NO_UNIT};

/// Each group reads the whole trace once, so more groups than cores only costs.
const MAX_GROUPS: usize = 64;

/// A peak is never below what the dump itself shows (the docs promise it): where the replay
/// ends below the dump (a trace that does not explain the dump), the dump-time value is the
/// peak, reached at the last event.
fn floor_at_dump(peaks: &mut crate::Peaks, device: u32, finals: &[&Segment], events: &[TraceEvent]) {
    let dump = memsnap_model::DeviceTotals::of_segments(device, finals.iter().copied());
    let last = events.len().checked_sub(1);
    let time_us = last.and_then(|i| events[i].has_time().then_some(events[i].time_us));
    for (peak, at_dump) in [
        (&mut peaks.allocated, dump.allocated_bytes),
        (&mut peaks.reserved, dump.reserved_bytes),
        (&mut peaks.active, dump.active_bytes),
        (&mut peaks.requested, dump.requested_bytes),
    ] {
        if peak.value < at_dump {
            *peak = crate::Peak { value: at_dump, event_index: last, time_us };
        }
    }
}

/// Replay one device; `final_indices` are its segments' indices in the snapshot.
pub(crate) fn replay_device(snapshot: &Snapshot, device: u32, final_indices: &[usize], rules: &Rules) -> DeviceReplay {
    let events: &[TraceEvent] = snapshot.trace(device).map_or(&[], |t| &t.events);
    let finals: Vec<&Segment> = final_indices.iter().map(|&k| &snapshot.segments[k]).collect();
    let mut log = Log::default();

    let segment_events: Vec<u32> = (0..events.len() as u32)
        .into_par_iter()
        .filter(|&i| {
            matches!(
                events[i as usize].action(),
                Action::SegmentAlloc | Action::SegmentFree | Action::SegmentMap | Action::SegmentUnmap
            )
        })
        .collect();
    let reserved = reserved_at_start(snapshot, &finals, events, &segment_events, &mut log);
    let (units, owner) = route(snapshot, final_indices, events, &segment_events, &reserved, &mut log);

    let groups = balance(&units);
    let effects = Effects::new(events.len());
    let mut outcomes: Vec<GroupOutcome> = groups
        .par_iter()
        .map(|members| replay_group(members, &units, &owner, &snapshot.segments, events, rules, &effects))
        .collect();
    // Where each unit's outcome is: (group, position in the group).
    let mut place = vec![(0u32, 0u32); units.len()];
    for (g, members) in groups.iter().enumerate() {
        for (k, &u) in members.iter().enumerate() {
            place[u as usize] = (g as u32, k as u32);
        }
    }

    let mut start = StartState::default();
    let mut start_totals = Totals::default();
    for o in outcomes.iter_mut().flat_map(|g| &mut g.outcomes) {
        start_totals.allocated = start_totals.allocated.saturating_add(o.start.allocated);
        start_totals.reserved = start_totals.reserved.saturating_add(o.start.reserved);
        start_totals.active = start_totals.active.saturating_add(o.start.active);
        start_totals.requested = start_totals.requested.saturating_add(o.start.requested);
        start.segments += o.start_segments;
        start.blocks += o.start_blocks;
        start.uncertain_blocks.append(&mut o.uncertain);
    }
    start.uncertain_blocks.sort_unstable_by_key(|b| b.address);
    start.uncertain_bytes = start.uncertain_blocks.iter().map(|b| b.size_max - b.size_assumed).sum();
    start.trace_complete = !events.is_empty() && start.segments == 0;

    let by_unit: Vec<&Outcome> = place.iter().map(|&(g, k)| &outcomes[g as usize].outcomes[k as usize]).collect();
    let chunk_sums: Vec<&[Delta]> = outcomes.iter().map(|g| &g.chunk_sums[..]).collect();
    let ((series, mut peaks), blocks) =
        rayon::join(|| build_series(events, effects, &chunk_sums, start_totals), || lifetimes(&owner, &by_unit));
    drop(owner);
    floor_at_dump(&mut peaks, device, &finals, events);

    let all = || outcomes.iter().flat_map(|g| &g.outcomes);
    let mut end: Vec<&EndSegment> = all().flat_map(|o| &o.end).collect();
    end.sort_by_key(|s| s.address);
    let check = self_check(&end, &finals);
    let mut segments: Vec<SegmentLifetime> = all().flat_map(|o| o.segments.iter().copied()).collect();
    segments.sort_by_key(|s| (s.address, s.created_event.map_or(0, |c| u64::from(c) + 1)));
    for o in outcomes.iter_mut().flat_map(|g| &mut g.outcomes) {
        log.append(std::mem::take(&mut o.diagnostics));
    }
    // Each unit kept its first few in event order, so the first few overall are among them.
    let mut diagnostics = log.kept;
    diagnostics.sort_by_key(|d| (d.event_index.map_or(0, |i| i + 1), d.address));
    diagnostics.truncate(MAX_DIAGNOSTICS);

    DeviceReplay {
        device,
        event_count: events.len(),
        series,
        peaks,
        start,
        check,
        blocks,
        segments,
        diagnostics,
        diagnostic_count: log.count,
    }
}

/// Split the device's memory into units and give each its events. Expandable segments become
/// one unit per address range their mappings ever covered; every other segment is a unit from
/// its `segment_alloc` (or the start) to its `segment_free` (or the dump), found by address at
/// the moment of each event.
fn route(
    snapshot: &Snapshot,
    final_indices: &[usize],
    events: &[TraceEvent],
    segment_events: &[u32],
    reserved: &[Reserved],
    log: &mut Log,
) -> (Vec<Unit>, Vec<u32>) {
    let mut units: Vec<Unit> = Vec::new();
    let mut spans: Vec<(u64, u64, Meta)> =
        reserved.iter().filter(|r| r.expandable).map(|r| (r.start, r.end, r.meta)).collect();
    spans.extend(
        segment_events
            .iter()
            .map(|&i| &events[i as usize])
            .filter(|e| matches!(e.action(), Action::SegmentMap | Action::SegmentUnmap))
            .map(|e| (e.addr, e.addr.saturating_add(e.size), Meta::of_event(snapshot, e))),
    );
    spans.sort_unstable_by_key(|s| (s.0, s.1));
    for (start, end, meta) in spans {
        match units.last_mut() {
            Some(u) if start <= u.end => u.end = u.end.max(end),
            _ => units.push(new_unit(start, end, true, meta)),
        }
    }
    for u in &mut units {
        u.reserved_at_start = reserved
            .iter()
            .filter(|r| r.expandable && u.start <= r.start && r.end <= u.end)
            .map(|r| (r.start, r.end))
            .collect();
    }
    for r in reserved.iter().filter(|r| !r.expandable) {
        let mut u = new_unit(r.start, r.end, false, r.meta);
        u.reserved_at_start.push((r.start, r.end));
        units.push(u);
    }

    // Units whose memory is reserved now, by start address: (start, end, unit). Only segment
    // allocations and frees change it: a walk over those alone decides them (and creates their
    // units), then every other event is routed in parallel, each chunk of events from the set of
    // units reserved at its start.
    let mut live: LiveUnits = units.iter().enumerate().map(|(k, u)| (u.start, u.end, k as u32)).collect();
    live.sort_unstable();
    let chunk_len = route_chunk_len(events.len(), 0);
    // Chunks: (first event, the units reserved then). A chunk boundary is skipped (its chunk
    // runs on) when its copy would take the copies past one unit per `EVENTS_PER_UNIT_COPY`
    // events: a file with as many live segments as events is routed in one chunk, not in one
    // copy of them per thread.
    let copy_budget = events.len() / EVENTS_PER_UNIT_COPY;
    let mut copied = 0usize;
    let mut boundary = 0usize;
    let mut starts: Vec<(usize, LiveUnits)> = Vec::new();
    let mut cut = |at: usize, live: &LiveUnits, starts: &mut Vec<(usize, LiveUnits)>| {
        if starts.is_empty() || copied + live.len() <= copy_budget {
            copied += live.len();
            starts.push((at, live.clone()));
        }
    };
    // What each segment allocation or free did, in event order: (event, change of `live`).
    let mut changes: Vec<(u32, LiveChange)> = Vec::new();
    let mut seg_log = Log::default();
    for &i in segment_events {
        let e = &events[i as usize];
        while boundary <= i as usize {
            cut(boundary, &live, &mut starts);
            boundary += chunk_len;
        }
        match e.action() {
            Action::SegmentAlloc => {
                let end = e.addr.saturating_add(e.size);
                let at = live.partition_point(|l| l.0 < e.addr);
                let clashes = (at > 0 && live[at - 1].1 > e.addr) || (at < live.len() && live[at].0 < end);
                if clashes {
                    seg_log.push(Some(i as usize), e.addr, DiagnosticKind::SegmentOverlaps);
                    continue;
                }
                let entry = (e.addr, end, units.len() as u32);
                live.insert(at, entry);
                changes.push((i, LiveChange::Insert(at, entry)));
                units.push(new_unit(e.addr, end, false, Meta::of_event(snapshot, e)));
            }
            Action::SegmentFree => match find(&live, e.addr) {
                Some(k) if live[k].0 == e.addr && !units[live[k].2 as usize].expandable => {
                    changes.push((i, LiveChange::Remove(k)));
                    live.remove(k);
                }
                _ => seg_log.push(Some(i as usize), e.addr, DiagnosticKind::OutsideSegments),
            },
            // Mappings change no unit: routed below.
            _ => {}
        }
    }
    while boundary < events.len() {
        cut(boundary, &live, &mut starts);
        boundary += chunk_len;
    }
    let mut owner = vec![NO_UNIT; events.len()];
    let mut slices: Vec<&mut [u32]> = Vec::with_capacity(starts.len());
    let mut rest = &mut owner[..];
    for k in 0..starts.len() {
        let len = starts.get(k + 1).map_or(rest.len(), |s| s.0 - starts[k].0);
        let (chunk, tail) = rest.split_at_mut(len);
        slices.push(chunk);
        rest = tail;
    }
    let mut routed: Vec<Log> = slices
        .into_par_iter()
        .zip(starts)
        .map(|(owner, (first, mut live))| {
            let mut log = Log::default();
            let mut next = changes.partition_point(|(i, _)| (*i as usize) < first);
            for (k, e) in events[first..first + owner.len()].iter().enumerate() {
                let i = first + k;
                match e.action() {
                    Action::Alloc
                    | Action::FreeRequested
                    | Action::FreeCompleted
                    | Action::SegmentMap
                    | Action::SegmentUnmap => match find(&live, e.addr) {
                        Some(at) => owner[k] = live[at].2,
                        None => log.push(Some(i), e.addr, DiagnosticKind::OutsideSegments),
                    },
                    Action::SegmentAlloc | Action::SegmentFree => {
                        if let Some((_, change)) = changes.get(next).filter(|(j, _)| *j as usize == i) {
                            match *change {
                                LiveChange::Insert(at, entry) => {
                                    owner[k] = entry.2;
                                    live.insert(at, entry);
                                }
                                LiveChange::Remove(at) => {
                                    owner[k] = live[at].2;
                                    live.remove(at);
                                }
                            }
                            next += 1;
                        }
                    }
                    Action::Snapshot | Action::Oom | Action::Annotate | Action::Other => {}
                }
            }
            log
        })
        .collect();
    routed.push(seg_log);
    log.append_interleaved(routed);

    // Dump-time segments belong to the units reserved at the end; their records are the best
    // description of the unit (pool id, segment type).
    for &k in final_indices {
        let s = &snapshot.segments[k];
        if let Some(at) = find(&live, s.address) {
            let u = &mut units[live[at].2 as usize];
            if u.expandable == s.is_expandable && (u.expandable || u.start == s.address) {
                if u.finals.is_empty() {
                    u.meta = Meta::of_segment(s);
                }
                u.finals.push(k);
            }
        }
    }
    for &u in owner.iter().filter(|&&u| u != NO_UNIT) {
        units[u as usize].event_count += 1;
    }
    (units, owner)
}

fn new_unit(start: u64, end: u64, expandable: bool, meta: Meta) -> Unit {
    Unit { start, end, expandable, meta, reserved_at_start: Vec::new(), finals: Vec::new(), event_count: 0 }
}

/// Units whose memory is reserved, by start address: (start, end, unit).
type LiveUnits = Vec<(u64, u64, u32)>;

/// How a segment allocation or free changed the units reserved (positions in the sorted list).
#[derive(Clone, Copy)]
enum LiveChange {
    Insert(usize, (u64, u64, u32)),
    Remove(usize),
}

/// Events are routed in about this many chunks per thread (a chunk starts from its own copy of
/// the reserved units, so chunks are few), and in chunks of at least [`MIN_ROUTE_CHUNK`] events
/// (a short trace is one chunk).
const ROUTE_CHUNKS_PER_THREAD: usize = 2;
const MIN_ROUTE_CHUNK: usize = 1 << 16;
/// The chunks' copies of the reserved units (24 bytes a unit) hold at most a unit per this many
/// events (4 bytes of routing each), whatever the thread count.
const EVENTS_PER_UNIT_COPY: usize = 4;

/// Events per chunk for `events` events: [`ROUTE_CHUNKS_PER_THREAD`] chunks per thread, at least
/// [`MIN_ROUTE_CHUNK`]; with `per_chunk_units` units to copy per chunk, chunks long enough that
/// the copies hold at most a unit per [`EVENTS_PER_UNIT_COPY`] events.
fn route_chunk_len(events: usize, per_chunk_units: usize) -> usize {
    let by_threads = events.div_ceil(rayon::current_num_threads() * ROUTE_CHUNKS_PER_THREAD).max(MIN_ROUTE_CHUNK);
    let copies = (events / EVENTS_PER_UNIT_COPY / per_chunk_units.max(1)).max(1);
    by_threads.max(events.div_ceil(copies)).max(1)
}

/// The live unit whose range holds `addr`.
fn find(live: &[(u64, u64, u32)], addr: u64) -> Option<usize> {
    let k = live.partition_point(|l| l.0 <= addr).checked_sub(1)?;
    (addr < live[k].1).then_some(k)
}

/// Split the units into groups of about equal work (events), largest units first, so that
/// groups can replay in parallel. The split only affects speed: units are independent.
fn balance(units: &[Unit]) -> Vec<Vec<u32>> {
    let groups = rayon::current_num_threads().clamp(1, MAX_GROUPS).min(units.len().max(1));
    let mut order: Vec<u32> = (0..units.len() as u32).collect();
    order.sort_by_key(|&u| std::cmp::Reverse(units[u as usize].event_count));
    let mut load = vec![0usize; groups];
    let mut out = vec![Vec::new(); groups];
    for u in order {
        let g = (0..groups).min_by_key(|&g| load[g]).unwrap_or(0);
        load[g] += units[u as usize].event_count + 1;
        out[g].push(u);
    }
    for members in &mut out {
        members.sort_unstable();
    }
    out
}

/// Every block lifetime: blocks from before the trace by address, then the others in
/// allocation order. Each unit lists its own in trace order; `owner` interleaves them.
///
/// Merged in ranges of events side by side, each written straight into its place: a range's
/// place starts after the blocks allocated before it, which each unit's list tells by a binary
/// search (its blocks are in allocation order). The ranges are bounded as the router's chunks
/// are ([`route_chunk_len`]), so their per-unit cursors take no more memory than its copies.
fn lifetimes(owner: &[u32], by_unit: &[&Outcome]) -> Vec<BlockLifetime> {
    fn traced(o: &Outcome) -> &[BlockLifetime] {
        &o.blocks[o.start_blocks..]
    }
    let mut blocks: Vec<BlockLifetime> =
        by_unit.iter().flat_map(|o| o.blocks[..o.start_blocks].iter().copied()).collect();
    blocks.sort_unstable_by_key(|b| b.address);
    let before = blocks.len();
    let n = owner.len();
    let range_len = route_chunk_len(n, by_unit.len());
    let bounds: Vec<usize> = (0..n).step_by(range_len).chain([n]).collect();
    // Per range boundary, each unit's first block allocated at or after it.
    let cursors: Vec<Vec<usize>> = bounds
        .par_iter()
        .map(|&at| {
            by_unit
                .iter()
                .map(|o| traced(o).partition_point(|b| b.alloc_event().is_some_and(|a| (a as usize) < at)))
                .collect()
        })
        .collect();
    let counts: Vec<usize> =
        cursors.windows(2).map(|w| w[1].iter().zip(&w[0]).map(|(end, start)| end - start).sum()).collect();
    let placeholder = BlockLifetime::before_trace(0, 0, 0, memsnap_model::StackId::EMPTY, false);
    blocks.par_extend(rayon::iter::repeat_n(placeholder, counts.iter().sum()));
    let mut places: Vec<&mut [BlockLifetime]> = Vec::with_capacity(counts.len());
    let mut rest = &mut blocks[before..];
    for &count in &counts {
        let (place, after) = std::mem::take(&mut rest).split_at_mut(count);
        places.push(place);
        rest = after;
    }
    places.into_par_iter().enumerate().for_each(|(r, place)| {
        let mut next = cursors[r].clone();
        let mut slots = place.iter_mut();
        for (i, &u) in owner.iter().enumerate().take(bounds[r + 1]).skip(bounds[r]) {
            if u == NO_UNIT {
                continue;
            }
            let k = &mut next[u as usize];
            // Every block a unit made was allocated by an event routed to it, so each of the
            // range's slots is filled.
            if let Some(b) = traced(by_unit[u as usize]).get(*k).filter(|b| b.alloc_event() == Some(i as u32)) {
                if let Some(slot) = slots.next() {
                    *slot = *b;
                }
                *k += 1;
            }
        }
        debug_assert!(slots.next().is_none(), "a range of the merge left a slot empty");
    });
    blocks
}
