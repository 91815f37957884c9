//! Folding the events' effects into the four counters after every event.
//!
//! The trace is cut into fixed chunks. The groups summed each chunk's change while replaying;
//! a prefix over the chunks gives each chunk's starting totals, and the chunks then write their
//! part of the columns in parallel. Sums are exact (wrapping `i64`, clamped at zero only when
//! written), so the result does not depend on the thread count.

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;

use memsnap_model::TraceEvent;
use rayon::prelude::*;

use crate::effects::{add, Delta, Effect, Effects, CHUNK};
use crate::output::{Peak, Peaks, Series, Totals};

/// The series from the events' effects, which it consumes: their columns become the allocated
/// and active series. `chunk_sums` holds, per group of units, the sum of its deltas over each
/// chunk of [`CHUNK`] events.
pub(crate) fn build_series(
    events: &[TraceEvent],
    effects: Effects,
    chunk_sums: &[&[Delta]],
    start: Totals,
) -> (Series, Peaks) {
    let chunks = events.len().div_ceil(CHUNK);
    let mut running: Delta = [start.allocated, start.reserved, start.active, start.requested].map(|v| v as i64);
    let mut chunk_starts: Vec<Delta> = Vec::with_capacity(chunks);
    for c in 0..chunks {
        chunk_starts.push(running);
        for sums in chunk_sums {
            add(&mut running, sums[c]);
        }
    }

    let n = events.len();
    let (mut reserved, mut requested) = (vec![0u64; n], vec![0u64; n]);
    // Per chunk and counter: the highest value and the first event that reached it.
    let chunk_peaks: Vec<[(u64, Option<usize>); 4]> = (
        effects.bits.par_chunks(CHUNK),
        effects.requested.par_chunks(CHUNK),
        reserved.par_chunks_mut(CHUNK),
        requested.par_chunks_mut(CHUNK),
    )
        .into_par_iter()
        .enumerate()
        .map(|(c, (bits, req_bits, r, req))| {
            let mut t = chunk_starts[c];
            let mut peaks = [(0u64, None); 4];
            let base = c * CHUNK;
            for j in 0..bits.len() {
                let d = Effect::load_from(&bits[j], &req_bits[j]).delta();
                if d != [0; 4] {
                    add(&mut t, d);
                    for (peak, v) in peaks.iter_mut().zip(t) {
                        let v = v.max(0) as u64;
                        if peak.1.is_none() || v > peak.0 {
                            *peak = (v, Some(base + j));
                        }
                    }
                }
                let v = t.map(|v| v.max(0) as u64);
                // The effect is read; its slots now take the allocated and active values.
                bits[j].store(v[0], Relaxed);
                req_bits[j].store(v[2], Relaxed);
                (r[j], req[j]) = (v[1], v[3]);
            }
            peaks
        })
        .collect();
    let column = |c: Vec<AtomicU64>| c.into_iter().map(AtomicU64::into_inner).collect();
    let (allocated, active) = (column(effects.bits), column(effects.requested));

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
