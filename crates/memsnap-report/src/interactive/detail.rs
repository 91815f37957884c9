//! Events one by one, for windows of the trace: what the timeline draws once it is zoomed in
//! past the pyramid's finest level, and what the pointer reads there (the action, size, stream
//! and stack of each event, and the counters after it).
//!
//! The trace is cut into windows of [`WINDOW_EVENTS`](super::WINDOW_EVENTS). A trace that fits
//! the budget is embedded whole. Otherwise, in this order until the budget is spent: the
//! iterations holding the moments asked for (`memsnap report --detail`, the window alone when
//! the iteration is longer than half the budget), the windows of the allocated and reserved peaks, of the whole iteration that holds the allocated peak,
//! of the first out-of-memory errors, of the first and the last iteration, then the busiest
//! windows (the widest swing of allocated bytes inside the window; ties to the earlier).

use memsnap_model::{Action, Snapshot, TraceEvent};
use memsnap_replay::{DeviceReplay, Series};
use rayon::prelude::*;

/// The events of one window.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Window {
    /// Index of the window's first event.
    pub first: usize,
    /// Allocated, reserved and active bytes before the first event.
    pub start: [u64; 3],
    /// One letter per event ([`action_letter`]).
    pub actions: String,
    /// Per event, the change it made to allocated, reserved and active bytes.
    pub allocated: Vec<i64>,
    pub reserved: Vec<i64>,
    pub active: Vec<i64>,
    /// Per event: its `size` (the request for allocations and frees, the segment for segment
    /// events, the failed request for an OOM).
    pub size: Vec<u64>,
    pub stream: Vec<u64>,
    pub stack: Vec<memsnap_model::StackId>,
    /// Per event, microseconds since the previous timed event of the window (the window's first
    /// timed event: since the trace's first timed event); `None` for an event without a time.
    pub time: Vec<Option<i64>>,
}

/// Out-of-memory errors whose windows are embedded (the first ones): the last few events before an
/// OOM are what explains it, and a run that retries could fail thousands of times.
const OOM_WINDOWS: usize = 8;

/// An iteration is embedded whole only when it takes at most this share of the windows: the
/// peak's (and a `--detail` moment's) half, the first and the last an eighth each, so that one
/// long iteration cannot take the whole budget.
const PEAK_ITERATION_SHARE: usize = 2;
const END_ITERATION_SHARE: usize = 8;

/// The letter of an action in the blob (the script maps it back).
pub fn action_letter(a: Action) -> char {
    match a {
        Action::Alloc => 'a',
        Action::FreeRequested => 'f',
        Action::FreeCompleted => 'c',
        Action::SegmentAlloc => 'S',
        Action::SegmentFree => 's',
        Action::SegmentMap => 'M',
        Action::SegmentUnmap => 'm',
        Action::Snapshot => 'n',
        Action::Oom => 'O',
        Action::Annotate => 't',
        Action::Other => 'x',
    }
}

/// Which windows to embed (sorted), for a budget of `budget` events; `focus` are events whose
/// iteration is asked for first.
pub fn choose(
    d: &DeviceReplay,
    events: &[TraceEvent],
    iteration_starts: &[u32],
    n: usize,
    window: usize,
    budget: usize,
    focus: &[usize],
) -> Vec<usize> {
    let windows = n.div_ceil(window);
    let most = (budget / window).max(1);
    if windows <= most {
        return (0..windows).collect();
    }
    let mut chosen: Vec<usize> = Vec::new();
    let add = |w: usize, chosen: &mut Vec<usize>| {
        if w < windows && chosen.len() < most && !chosen.contains(&w) {
            chosen.push(w);
        }
    };
    let of = |i: usize| i.min(n - 1) / window;
    let iteration_of = |e: usize| iteration_starts.partition_point(|&s| s as usize <= e).checked_sub(1);
    for &e in focus {
        match iteration_of(e) {
            Some(k) => {
                let (a, b) = iteration_window(iteration_starts, k, n);
                if of(b) - of(a) < most / PEAK_ITERATION_SHARE {
                    (of(a)..=of(b)).for_each(|w| add(w, &mut chosen));
                } else {
                    add(of(e), &mut chosen);
                }
            }
            None => add(of(e), &mut chosen),
        }
    }
    for peak in [d.peaks.allocated.event_index, d.peaks.reserved.event_index].into_iter().flatten() {
        add(of(peak), &mut chosen);
    }
    let iteration = |k: usize| iteration_window(iteration_starts, k, n);
    let whole = |(a, b): (usize, usize), share: usize, chosen: &mut Vec<usize>| {
        if of(b) - of(a) < share {
            for w in of(a)..=of(b) {
                add(w, chosen);
            }
        }
    };
    if let Some(k) = d.peaks.allocated.event_index.and_then(iteration_of) {
        whole(iteration(k), most / PEAK_ITERATION_SHARE, &mut chosen);
    }
    for (i, _) in events[..n].iter().enumerate().filter(|(_, e)| e.action() == Action::Oom).take(OOM_WINDOWS) {
        add(of(i), &mut chosen);
    }
    if !iteration_starts.is_empty() {
        whole(iteration(0), most / END_ITERATION_SHARE, &mut chosen);
        whole(iteration(iteration_starts.len() - 1), most / END_ITERATION_SHARE, &mut chosen);
    }
    let s = &d.series;
    let mut swing: Vec<(u64, usize)> = (0..windows)
        .into_par_iter()
        .map(|w| {
            let (mut lo, mut hi) = (u64::MAX, 0);
            for i in w * window..((w + 1) * window).min(n) {
                let a = s.allocated(i);
                lo = lo.min(a);
                hi = hi.max(a);
            }
            (hi.saturating_sub(lo), w)
        })
        .collect();
    swing.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    for (_, w) in swing {
        if chosen.len() >= most {
            break;
        }
        add(w, &mut chosen);
    }
    chosen.sort_unstable();
    chosen
}

/// Iteration `k` as [first event, last event].
fn iteration_window(iteration_starts: &[u32], k: usize, n: usize) -> (usize, usize) {
    let a = (iteration_starts[k] as usize).min(n - 1);
    let b = iteration_starts.get(k + 1).map_or(n, |&e| e as usize);
    (a, b.saturating_sub(1).clamp(a, n - 1))
}

/// The events of window `w`.
pub fn window(
    snap: &Snapshot,
    series: &Series,
    events: &[TraceEvent],
    n: usize,
    w: usize,
    window: usize,
    t0: Option<i64>,
) -> Window {
    let (lo, hi) = (w * window, ((w + 1) * window).min(n));
    let before = series.after(lo.checked_sub(1));
    let mut out = Window {
        first: lo,
        start: [before.allocated, before.reserved, before.active],
        actions: String::with_capacity(hi - lo),
        allocated: Vec::with_capacity(hi - lo),
        reserved: Vec::with_capacity(hi - lo),
        active: Vec::with_capacity(hi - lo),
        size: Vec::with_capacity(hi - lo),
        stream: Vec::with_capacity(hi - lo),
        stack: Vec::with_capacity(hi - lo),
        time: Vec::with_capacity(hi - lo),
    };
    // The first timed event's difference is from the trace's first time, so that each window
    // reads on its own.
    let mut last = t0;
    let mut prev = before;
    let diff = |a: u64, b: u64| (a as i128 - b as i128).clamp(i64::MIN as i128, i64::MAX as i128) as i64;
    for (i, e) in events.iter().enumerate().take(hi).skip(lo) {
        let t = series.after(Some(i));
        out.actions.push(action_letter(e.action()));
        out.allocated.push(diff(t.allocated, prev.allocated));
        out.reserved.push(diff(t.reserved, prev.reserved));
        out.active.push(diff(t.active, prev.active));
        out.size.push(e.size());
        out.stream.push(snap.context(e).stream);
        out.stack.push(e.stack);
        out.time.push(match last {
            Some(l) if e.has_time() => {
                last = Some(e.time_us);
                Some(e.time_us.saturating_sub(l))
            }
            _ => None,
        });
        prev = t;
    }
    out
}
