//! Which blocks and segments the page embeds, and which blocks belong to a suspect.
//!
//! The segment map, the flamegraph and the tables at a moment are rebuilt in the browser from
//! block lifetimes (a block is live between its allocation and its free) and segment lifetimes
//! (reserved between `segment_alloc` and `segment_free`), as [`DeviceReplay::state_after`] does.
//! Blocks are kept up to a budget, in this order: the suspects' blocks, the blocks live at the
//! allocated peak, those live at the end, those the detailed windows allocate or free, then the
//! largest of the rest (ties to the earlier block).

use std::collections::BTreeSet;

use memsnap_analysis::{attribute, Attr, Evidence, Phases, Severity, Site, StackTable, Suspect, SuspectKind};
use memsnap_model::{FrameId, Snapshot, TraceEvent};
use memsnap_replay::{BlockLifetime, DeviceReplay, SegmentLifetime};
use rayon::prelude::*;

/// The lines a suspect names: its site, and for a retained graph the lines inside the model
/// whose saved tensors are held (and, read from the dump, the lines of the passes' inputs the
/// graphs hold), for unreleased gradients the `.backward()` line.
fn suspect_sites(s: &Suspect) -> Vec<&Site> {
    let mut v: Vec<&Site> = s.site.iter().collect();
    match &s.facts {
        Evidence::RetainedGraph { held_lines, input_lines, .. } => v.extend(held_lines.iter().chain(input_lines)),
        Evidence::UnreleasedGradient { backward_line: Some(l), .. } => v.push(l),
        _ => {}
    }
    v
}

/// The blocks (indices into `d.blocks`) a suspect is about: blocks attributed to one of the
/// lines it names ([`suspect_sites`]) that are allocated when its bytes are measured — at the
/// end of the trace for leaks and waste, at the allocated peak for peak problems. An OOM or a
/// fragmentation suspect is about an event or the allocator's layout, not blocks: none.
pub fn suspect_blocks(
    snap: &Snapshot,
    stacks: &StackTable,
    phases: &Phases,
    events: &[TraceEvent],
    d: &DeviceReplay,
    s: &Suspect,
) -> Vec<usize> {
    if matches!(s.kind, SuspectKind::Oom | SuspectKind::Fragmentation) || s.device != d.device {
        return Vec::new();
    }
    let sites = suspect_sites(s);
    if sites.is_empty() {
        return Vec::new();
    }
    // Frames at one of the sites (a line can be several frames: one per calling function name).
    let frames: BTreeSet<FrameId> = (0..snap.frames.len() as u32)
        .map(FrameId)
        .filter(|&f| {
            let fr = snap.frame(f);
            sites
                .iter()
                .any(|x| x.line == fr.line && x.filename == snap.str(fr.filename) && x.function == snap.str(fr.name))
        })
        .collect();
    if frames.is_empty() {
        return Vec::new();
    }
    let at = match s.severity {
        Severity::Peak => d.peaks.allocated.event_index.map(|i| i as u32),
        Severity::Leak | Severity::Held | Severity::Waste => d.event_count.checked_sub(1).map(|i| i as u32),
    };
    d.blocks
        .par_iter()
        .enumerate()
        .filter(|(_, b)| b.state_after(at) == Some(memsnap_model::BlockState::Allocated))
        .filter(|(_, b)| match attribute(events, phases, stacks, b).0 {
            Attr::Site(f) | Attr::Backward(Some(f)) => frames.contains(&f),
            _ => false,
        })
        .map(|(i, _)| i)
        .collect()
}

/// Whether a block is allocated or pending free after event `t` (`None`: before the first).
fn live(b: &BlockLifetime, t: Option<u32>) -> bool {
    b.state_after(t).is_some()
}

/// The blocks to embed (indices into `d.blocks`, in `d.blocks` order) for a budget of `budget`.
/// `first` are kept first (the suspects' blocks); `windows` are the detailed windows as event
/// ranges `[lo, hi)`.
pub fn select(d: &DeviceReplay, first: &[usize], windows: &[(usize, usize)], budget: usize) -> Vec<usize> {
    let n = d.blocks.len();
    if n <= budget {
        return (0..n).collect();
    }
    let mut keep = vec![false; n];
    let mut count = 0;
    let take = |i: usize, keep: &mut Vec<bool>, count: &mut usize| {
        if *count < budget && !keep[i] {
            keep[i] = true;
            *count += 1;
        }
    };
    for &i in first {
        take(i, &mut keep, &mut count);
    }
    let peak = d.peaks.allocated.event_index.map(|i| i as u32);
    let end = d.event_count.checked_sub(1).map(|i| i as u32);
    let in_window = |e: Option<u32>| {
        e.is_some_and(|e| {
            let k = windows.partition_point(|w| w.1 <= e as usize);
            k < windows.len() && windows[k].0 <= e as usize
        })
    };
    let groups: [Vec<usize>; 3] = [
        (0..n).into_par_iter().filter(|&i| live(&d.blocks[i], peak)).collect(),
        (0..n).into_par_iter().filter(|&i| live(&d.blocks[i], end)).collect(),
        (0..n)
            .into_par_iter()
            .filter(|&i| {
                let b = &d.blocks[i];
                in_window(b.alloc_event()) || in_window(b.free_requested_event()) || in_window(b.free_completed_event())
            })
            .collect(),
    ];
    for g in groups {
        for i in g {
            take(i, &mut keep, &mut count);
        }
    }
    // The largest of the rest: only the `budget - count` first in that order are needed.
    let mut rest: Vec<usize> = (0..n).filter(|&i| !keep[i]).collect();
    let need = budget.saturating_sub(count).min(rest.len());
    if need > 0 {
        let by_size = |a: &usize, b: &usize| d.blocks[*b].size.cmp(&d.blocks[*a].size).then(a.cmp(b));
        if need < rest.len() {
            rest.select_nth_unstable_by(need - 1, by_size);
        }
        for &i in &rest[..need] {
            take(i, &mut keep, &mut count);
        }
    }
    (0..n).filter(|&i| keep[i]).collect()
}

/// The segments to embed (indices into `d.segments`, in its order): all, or the `budget` largest.
pub fn select_segments(d: &DeviceReplay, budget: usize) -> Vec<usize> {
    let n = d.segments.len();
    if n <= budget {
        return (0..n).collect();
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| d.segments[b].size.cmp(&d.segments[a].size).then(a.cmp(&b)));
    order.truncate(budget);
    order.sort_unstable();
    order
}

/// The segment (index into `segments`, which are by address then creation) that holds block `b`:
/// one whose range covers the block's address and that is reserved when the block is allocated.
pub fn segment_of(segments: &[&SegmentLifetime], b: &BlockLifetime) -> Option<usize> {
    let k = segments.partition_point(|s| s.address <= b.address);
    // Segments starting at or below the address, nearest first; a few lifetimes may share an
    // address (released and reserved again), and a long segment may start well below.
    let born = |s: &SegmentLifetime| match (s.created_event, b.alloc_event()) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(c), Some(a)) => c <= a,
    };
    let alive = |s: &SegmentLifetime| match (s.released_event, b.alloc_event()) {
        (None, _) => true,
        (Some(_), None) => true,
        (Some(r), Some(a)) => r > a,
    };
    segments[..k]
        .iter()
        .enumerate()
        .rev()
        .take(SEGMENT_LOOKBACK)
        .find(|(_, s)| b.address - s.address < s.size && born(s) && alive(s))
        .map(|(j, _)| j)
}

/// Segments looked at below a block's address when placing it: segments of one device do not
/// overlap at one moment, so only lifetimes that reuse an address sit between the right one and
/// the block; a hostile file with more than this many is placed in no segment (the block is still
/// on the timeline and in the tables).
const SEGMENT_LOOKBACK: usize = 256;
