//! The per-event effect encoding shared by the replay and the series: what each event did to the
//! four counters ([`Effect`], [`Delta`]), the columns every event's effect is written to while
//! units replay ([`Effects`]), and the chunks of the trace over which those effects are summed
//! ([`CHUNK`]).
//!
//! Units (`unit`) write effects and sum their deltas per chunk; the series (`series`) folds the
//! chunk sums into starting totals and reads the effects back, chunk by chunk in parallel.

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;

use rayon::prelude::*;

/// Events per chunk: large enough to amortise the per-chunk work, small enough to balance.
pub(crate) const CHUNK: usize = 1 << 16;

/// What an event did to the counters: the block (or segment) size with flags saying which
/// counters it moves and in which direction, and the requested bytes it adds or removes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Effect {
    bits: u64,
    requested: u64,
}

impl Effect {
    pub const NONE: Effect = Effect { bits: 0, requested: 0 };
    /// Moves allocated bytes.
    pub const ALLOCATED: u64 = 1 << 63;
    /// Moves active bytes (and requested bytes, by `requested`).
    pub const ACTIVE: u64 = 1 << 62;
    /// Moves reserved bytes.
    pub const RESERVED: u64 = 1 << 61;
    /// The counters grow (else they shrink).
    pub const GROWS: u64 = 1 << 60;
    const SIZE: u64 = Self::GROWS - 1;

    /// `size` bytes on the counters `flags` names, and with [`Effect::ACTIVE`] `requested` bytes
    /// on the requested counter.
    pub fn new(size: u64, flags: u64, requested: u64) -> Effect {
        Effect { bits: (size & Self::SIZE) | flags, requested }
    }

    /// An effect as [`Effects`] stores it.
    pub fn load_from(bits: &AtomicU64, requested: &AtomicU64) -> Effect {
        Effect { bits: bits.load(Relaxed), requested: requested.load(Relaxed) }
    }

    /// The signed change of allocated, reserved, active and requested bytes.
    pub fn delta(self) -> Delta {
        let sign: i64 = if self.bits & Self::GROWS != 0 { 1 } else { -1 };
        let size = sign.wrapping_mul((self.bits & Self::SIZE) as i64);
        let on = |flag: u64| self.bits & flag != 0;
        [
            if on(Self::ALLOCATED) { size } else { 0 },
            if on(Self::RESERVED) { size } else { 0 },
            if on(Self::ACTIVE) { size } else { 0 },
            if on(Self::ACTIVE) { sign.wrapping_mul(self.requested as i64) } else { 0 },
        ]
    }
}

/// Every event's effect, written by the group that owns the event. The two columns later become
/// the allocated and active series (see `series`), so effects take no memory of their own; they
/// are atomics only so that groups can fill them in parallel without `unsafe` (each event is
/// written by exactly one group, so the content does not depend on scheduling).
pub(crate) struct Effects {
    pub bits: Vec<AtomicU64>,
    pub requested: Vec<AtomicU64>,
}

impl Effects {
    pub fn new(events: usize) -> Effects {
        let column = || (0..events).into_par_iter().map(|_| AtomicU64::new(0)).collect();
        Effects { bits: column(), requested: column() }
    }

    /// Write event `i`'s effect (once per event, by the group that owns it).
    pub fn store(&self, i: usize, f: Effect) {
        self.bits[i].store(f.bits, Relaxed);
        self.requested[i].store(f.requested, Relaxed);
    }
}

/// Signed change of the counters: allocated, reserved, active, requested.
pub(crate) type Delta = [i64; 4];

/// Add `d` to `to`, counter by counter (wrapping, so a sum of deltas is exact in any order).
pub(crate) fn add(to: &mut Delta, d: Delta) {
    for (t, d) in to.iter_mut().zip(d) {
        *t = t.wrapping_add(d);
    }
}
