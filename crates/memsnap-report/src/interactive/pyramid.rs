//! The counters over the event index as a pyramid of levels: each level cuts the trace into
//! buckets of a power of two of consecutive events and keeps, per bucket, the lowest and
//! highest allocated bytes and the highest reserved and active bytes (after each event of the
//! bucket). Each level halves the buckets of the one below, so a view of any width reads the
//! level whose buckets are just under a pixel wide and never loses a peak between pixels.

use memsnap_replay::Series;
use rayon::prelude::*;

/// One level: buckets of `bucket` events (the last may hold fewer).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Level {
    pub bucket: usize,
    pub allocated_min: Vec<u64>,
    pub allocated_max: Vec<u64>,
    pub reserved_max: Vec<u64>,
    pub active_max: Vec<u64>,
}

impl Level {
    pub fn len(&self) -> usize {
        self.allocated_max.len()
    }

    /// Every value the level holds (for the quantum of the blob).
    pub fn values(&self) -> impl Iterator<Item = u64> + '_ {
        self.allocated_min.iter().chain(&self.allocated_max).chain(&self.reserved_max).chain(&self.active_max).copied()
    }

    /// The level above: buckets of twice the events.
    fn halve(&self) -> Level {
        let pair =
            |v: &[u64], f: fn(u64, u64) -> u64| v.chunks(2).map(|c| c.iter().copied().reduce(f).unwrap_or(0)).collect();
        Level {
            bucket: self.bucket * 2,
            allocated_min: pair(&self.allocated_min, u64::min),
            allocated_max: pair(&self.allocated_max, u64::max),
            reserved_max: pair(&self.reserved_max, u64::max),
            active_max: pair(&self.active_max, u64::max),
        }
    }
}

/// Buckets of all levels from buckets of `2^k` events up to the coarsest (`top` buckets at
/// most), for a trace of `n` events.
fn total_buckets(n: usize, k: u32, top: usize) -> usize {
    let mut total = 0;
    let mut b = 1usize << k;
    loop {
        let count = n.div_ceil(b);
        total += count;
        if count <= top {
            return total;
        }
        b *= 2;
    }
}

/// The pyramid of the first `n` events of `series`, coarsest level first: the finest level has
/// the smallest power-of-two bucket for which all levels together hold at most `budget`
/// buckets (the coarsest alone when even that is over), the coarsest at most `top` buckets.
pub fn build(series: &Series, n: usize, top: usize, budget: usize) -> Vec<Level> {
    if n == 0 {
        return Vec::new();
    }
    let top = top.max(1);
    let mut k = 0u32;
    while (1usize << k) < n && total_buckets(n, k, top) > budget && n.div_ceil(1 << k) > top {
        k += 1;
    }
    let bucket = 1usize << k;
    let buckets = n.div_ceil(bucket);
    let per: Vec<[u64; 4]> = (0..buckets)
        .into_par_iter()
        .map(|j| {
            let (lo, hi) = (j * bucket, ((j + 1) * bucket).min(n));
            let mut v = [u64::MAX, 0, 0, 0];
            for i in lo..hi {
                let t = series.after(Some(i));
                v[0] = v[0].min(t.allocated);
                v[1] = v[1].max(t.allocated);
                v[2] = v[2].max(t.reserved);
                v[3] = v[3].max(t.active);
            }
            v
        })
        .collect();
    let mut level = Level {
        bucket,
        allocated_min: per.iter().map(|v| v[0]).collect(),
        allocated_max: per.iter().map(|v| v[1]).collect(),
        reserved_max: per.iter().map(|v| v[2]).collect(),
        active_max: per.iter().map(|v| v[3]).collect(),
    };
    let mut levels = Vec::new();
    while level.len() > top {
        let up = level.halve();
        levels.push(level);
        level = up;
    }
    levels.push(level);
    levels.reverse();
    levels
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_halve_and_fit_the_budget() {
        assert_eq!(total_buckets(1000, 0, 100), 1000 + 500 + 250 + 125 + 63);
        assert_eq!(total_buckets(10, 0, 100), 10);
        // 12.3 M events (the bench file) with the page's budget: 256 events a bucket.
        let n = 12_320_370;
        let mut k = 0;
        while total_buckets(n, k, crate::interactive::TOP_BUCKETS) > crate::interactive::PYRAMID_BUCKETS {
            k += 1;
        }
        assert_eq!(1 << k, 256);
    }
}
