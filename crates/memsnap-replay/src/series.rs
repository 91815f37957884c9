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

    // Per chunk and counter: the highest value and the first event that reached it; and the
    // chunk's values too far from its base to be stored as differences.
    type ChunkOut = ([(u64, Option<usize>); 4], Vec<(u32, Totals)>);
    let bases: Vec<[u64; 4]> = chunk_starts.iter().map(|t| t.map(|v| v.max(0) as u64)).collect();
    let per_chunk: Vec<ChunkOut> = (effects.bits.par_chunks(CHUNK), effects.requested.par_chunks(CHUNK))
        .into_par_iter()
        .enumerate()
        .map(|(c, (bits, req_bits))| {
            let mut t = chunk_starts[c];
            let base = bases[c];
            let mut peaks = [(0u64, None); 4];
            let mut wide = Vec::new();
            let first = c * CHUNK;
            for j in 0..bits.len() {
                let d = Effect::load_from(&bits[j], &req_bits[j]).delta();
                if d != [0; 4] {
                    add(&mut t, d);
                    for (peak, v) in peaks.iter_mut().zip(t) {
                        let v = v.max(0) as u64;
                        if peak.1.is_none() || v > peak.0 {
                            *peak = (v, Some(first + j));
                        }
                    }
                }
                let v = t.map(|v| v.max(0) as u64);
                // The effect is read; its two slots now take the four differences.
                let diff = |k: usize| {
                    let d = v[k] as i128 - base[k] as i128;
                    (d > i32::MIN as i128 && d <= i32::MAX as i128).then_some(d as i32 as u32 as u64)
                };
                match (diff(0), diff(1), diff(2), diff(3)) {
                    (Some(al), Some(re), Some(ac), Some(rq)) => {
                        bits[j].store(al | ac << 32, Relaxed);
                        req_bits[j].store(re | rq << 32, Relaxed);
                    }
                    _ => {
                        bits[j].store(Series::WIDE, Relaxed);
                        req_bits[j].store(0, Relaxed);
                        let totals = Totals { allocated: v[0], reserved: v[1], active: v[2], requested: v[3] };
                        wide.push(((first + j) as u32, totals));
                    }
                }
            }
            (peaks, wide)
        })
        .collect();
    let column = |c: Vec<AtomicU64>| c.into_iter().map(AtomicU64::into_inner).collect();
    let (allocated_active, reserved_requested) = (column(effects.bits), column(effects.requested));
    let mut wide = Vec::new();
    let mut chunk_peaks = Vec::with_capacity(per_chunk.len());
    for (peaks, w) in per_chunk {
        chunk_peaks.push(peaks);
        wide.extend(w);
    }

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
        Series { start, bases, allocated_active, reserved_requested, wide },
        Peaks { allocated: allocated_peak, reserved: reserved_peak, active: active_peak, requested: requested_peak },
    )
}
