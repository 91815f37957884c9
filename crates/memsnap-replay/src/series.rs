//! Folding the events' effects into the four counters after every event.
//!
//! The trace is cut into fixed chunks. The groups summed each chunk's change while replaying;
//! a prefix over the chunks gives each chunk's starting totals, and the chunks then write their
//! part of the columns in parallel. Sums are exact (wrapping `i64`, clamped at zero only when
//! written), so the result does not depend on the thread count.

use memsnap_model::TraceEvent;
use rayon::prelude::*;

use crate::output::{Peak, Peaks, Series, Totals};
use crate::unit::{add, Delta, GroupOutcome, NO_UNIT};

/// Events per chunk: large enough to amortise the per-chunk work, small enough to balance.
pub(crate) const CHUNK: usize = 1 << 16;

/// `group_of[u]` is unit `u`'s group.
pub(crate) fn build_series(
    events: &[TraceEvent],
    owner: &[u32],
    group_of: &[u32],
    groups: &[GroupOutcome],
    start: Totals,
) -> (Series, Peaks) {
    let chunks = events.len().div_ceil(CHUNK);
    let mut running: Delta = [start.allocated, start.reserved, start.active, start.requested].map(|v| v as i64);
    let mut chunk_starts: Vec<Delta> = Vec::with_capacity(chunks);
    for c in 0..chunks {
        chunk_starts.push(running);
        for g in groups {
            add(&mut running, g.chunk_sums[c]);
        }
    }

    let n = events.len();
    let (mut allocated, mut reserved, mut active, mut requested) =
        (vec![0u64; n], vec![0u64; n], vec![0u64; n], vec![0u64; n]);
    // Per chunk and counter: the highest value and the first event that reached it.
    let chunk_peaks: Vec<[(u64, Option<usize>); 4]> = (
        allocated.par_chunks_mut(CHUNK),
        reserved.par_chunks_mut(CHUNK),
        active.par_chunks_mut(CHUNK),
        requested.par_chunks_mut(CHUNK),
    )
        .into_par_iter()
        .enumerate()
        .map(|(c, (a, r, act, req))| {
            let mut next: Vec<usize> = groups.iter().map(|g| g.chunk_starts[c]).collect();
            let mut t = chunk_starts[c];
            let mut peaks = [(0u64, None); 4];
            let base = c * CHUNK;
            for (j, &u) in owner[base..base + a.len()].iter().enumerate() {
                if u != NO_UNIT {
                    let g = group_of[u as usize] as usize;
                    let d = groups[g].effects[next[g]].delta();
                    next[g] += 1;
                    if d != [0; 4] {
                        add(&mut t, d);
                        for (peak, v) in peaks.iter_mut().zip(t) {
                            let v = v.max(0) as u64;
                            if peak.1.is_none() || v > peak.0 {
                                *peak = (v, Some(base + j));
                            }
                        }
                    }
                }
                let v = t.map(|v| v.max(0) as u64);
                (a[j], r[j], act[j], req[j]) = (v[0], v[1], v[2], v[3]);
            }
            peaks
        })
        .collect();

    // The first chunk that reaches the highest value holds the first event that reached it.
    let at_start = |value| Peak { value, event_index: None, time_us: None };
    let mut peaks = [start.allocated, start.reserved, start.active, start.requested].map(at_start);
    for chunk in &chunk_peaks {
        for (best, &(value, index)) in peaks.iter_mut().zip(chunk) {
            if let Some(i) = index.filter(|_| value > best.value) {
                let e = &events[i];
                *best = Peak { value, event_index: Some(i), time_us: e.has_time().then_some(e.time_us) };
            }
        }
    }
    let [allocated_peak, reserved_peak, active_peak, requested_peak] = peaks;
    (
        Series { start, allocated, reserved, active, requested },
        Peaks { allocated: allocated_peak, reserved: reserved_peak, active: active_peak, requested: requested_peak },
    )
}
