//! Folding the events' effects into the four counters after every event.
//!
//! The trace is cut into fixed chunks handled in parallel: a first pass sums each chunk's
//! change, a prefix over the chunks gives each chunk's starting totals, and a second pass
//! writes the columns. Sums are exact (wrapping `i64`, clamped at zero only when written), so
//! the result does not depend on how chunks are spread over threads.

use memsnap_model::{Action, TraceEvent};
use rayon::prelude::*;

use crate::output::{Peak, Peaks, Series, Totals};
use crate::unit::{Effect, NO_UNIT};

/// Events per chunk: large enough to amortise the per-chunk work, small enough to balance.
const CHUNK: usize = 1 << 16;

/// Signed change of the counters: allocated, reserved, active, requested.
type Delta = [i64; 4];

/// `effects[g]` lists group `g`'s effects in trace order; `group_of[u]` is unit `u`'s group.
pub(crate) fn build_series(
    events: &[TraceEvent],
    owner: &[u32],
    group_of: &[u32],
    effects: &[&[Effect]],
    start: Totals,
) -> (Series, Peaks) {
    let groups = effects.len();
    // Where each group's effects begin in each chunk.
    let counts: Vec<Vec<usize>> = owner
        .par_chunks(CHUNK)
        .map(|chunk| {
            let mut n = vec![0usize; groups];
            for &u in chunk.iter().filter(|&&u| u != NO_UNIT) {
                n[group_of[u as usize] as usize] += 1;
            }
            n
        })
        .collect();
    let mut cursors = Vec::with_capacity(counts.len());
    let mut at = vec![0usize; groups];
    for n in &counts {
        cursors.push(at.clone());
        at.iter_mut().zip(n).for_each(|(a, n)| *a += n);
    }

    let walker = Walker { events, owner, group_of, effects, cursors };
    let chunk_sums: Vec<Delta> = (0..counts.len())
        .into_par_iter()
        .map(|c| {
            let mut sum = [0i64; 4];
            walker.walk(c, |_, _, d| add(&mut sum, d));
            sum
        })
        .collect();
    let mut running = [start.allocated, start.reserved, start.active, start.requested].map(|v| v as i64);
    let chunk_starts: Vec<Delta> = chunk_sums
        .iter()
        .map(|s| {
            let at = running;
            add(&mut running, *s);
            at
        })
        .collect();

    let n = events.len();
    let (mut allocated, mut reserved, mut active, mut requested) =
        (vec![0u64; n], vec![0u64; n], vec![0u64; n], vec![0u64; n]);
    let chunk_peaks: Vec<[Peak; 4]> = (
        allocated.par_chunks_mut(CHUNK),
        reserved.par_chunks_mut(CHUNK),
        active.par_chunks_mut(CHUNK),
        requested.par_chunks_mut(CHUNK),
    )
        .into_par_iter()
        .enumerate()
        .map(|(c, (a, r, act, req))| {
            let mut t = chunk_starts[c];
            let mut peaks = [Peak::default(); 4];
            let base = c * CHUNK;
            walker.walk(c, |i, e, d| {
                    add(&mut t, d);
                    let values = t.map(|v| v.max(0) as u64);
                    let j = i - base;
                    (a[j], r[j], act[j], req[j]) = (values[0], values[1], values[2], values[3]);
                    if d != [0; 4] {
                        for (peak, value) in peaks.iter_mut().zip(values) {
                            if value > peak.value || peak.event_index.is_none() {
                                *peak = Peak { value, event_index: Some(i), time_us: e.has_time().then_some(e.time_us) };
                            }
                        }
                }
            });
            peaks
        })
        .collect();

    // The first chunk that reaches the highest value holds the first event that reached it.
    let at_start = |value| Peak { value, event_index: None, time_us: None };
    let mut peaks = [start.allocated, start.reserved, start.active, start.requested].map(at_start);
    for chunk in &chunk_peaks {
        for (best, p) in peaks.iter_mut().zip(chunk) {
            if p.event_index.is_some() && p.value > best.value {
                *best = *p;
            }
        }
    }
    let [pa, pr, pact, preq] = peaks;
    (
        Series { start, allocated, reserved, active, requested },
        Peaks { allocated: pa, reserved: pr, active: pact, requested: preq },
    )
}

/// Visits the events of one chunk with the change each makes.
struct Walker<'a> {
    events: &'a [TraceEvent],
    owner: &'a [u32],
    group_of: &'a [u32],
    effects: &'a [&'a [Effect]],
    /// Per chunk, where each group's effects begin.
    cursors: Vec<Vec<usize>>,
}

impl Walker<'_> {
    fn walk(&self, chunk: usize, mut visit: impl FnMut(usize, &TraceEvent, Delta)) {
        let mut next = self.cursors[chunk].clone();
        let start = chunk * CHUNK;
        let end = (start + CHUNK).min(self.events.len());
        for (i, (e, &u)) in self.events[start..end].iter().zip(&self.owner[start..end]).enumerate() {
            let mut d = [0; 4];
            if u != NO_UNIT {
                let g = self.group_of[u as usize] as usize;
                d = delta(self.effects[g][next[g]], e);
                next[g] += 1;
            }
            visit(start + i, e, d);
        }
    }
}

/// The change one event makes, given what its unit found.
fn delta(f: Effect, e: &TraceEvent) -> Delta {
    if f == Effect::NONE {
        return [0; 4];
    }
    let sign: i64 = if matches!(e.action, Action::Alloc | Action::SegmentAlloc | Action::SegmentMap) { 1 } else { -1 };
    let size = sign.wrapping_mul(f.size() as i64);
    let mut d = [0i64; 4];
    if f.has(Effect::ALLOCATED) {
        d[0] = size;
    }
    if f.has(Effect::RESERVED) {
        d[1] = size;
    }
    if f.has(Effect::ACTIVE) {
        d[2] = size;
        d[3] = sign.wrapping_mul(e.size as i64);
    }
    d
}

fn add(to: &mut Delta, d: Delta) {
    for (t, d) in to.iter_mut().zip(d) {
        *t = t.wrapping_add(d);
    }
}
