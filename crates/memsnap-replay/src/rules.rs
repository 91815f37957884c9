//! The caching allocator's sizing rules (`c10/cuda/CUDACachingAllocator.cpp`): how a requested
//! size is rounded and whether a cached block is split or handed out whole.

use std::collections::BTreeMap;

use memsnap_model::{Action, Snapshot};

/// `kMinBlockSize`: every block size is a multiple of this.
pub const MIN_BLOCK_SIZE: u64 = 512;
/// `kSmallSize`: rounded sizes up to this come from the small pool.
pub const SMALL_SIZE: u64 = 1 << 20;
/// `kLargeBuffer`: an allocation at or above `max_split_size` may take a cached block up to
/// this much larger than itself.
pub const LARGE_BUFFER: u64 = 20 << 20;

/// Number of `roundup_power2_divisions` intervals: `[1 MiB, 2 MiB)` … `[32 GiB, 64 GiB)`.
const DIVISION_INTERVALS: usize = 16;

/// The allocator settings that decide block sizes, taken from the snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rules {
    /// Divisions per power-of-two interval; index `k` is the interval that starts at `2^k` MiB
    /// (sizes below 1 MiB use index 0, sizes of 32 GiB and more the last).
    divisions: [u64; DIVISION_INTERVALS],
    /// `max_split_size` in bytes; `u64::MAX` when unlimited.
    max_split_size: u64,
    /// `expandable_segments`: then every split keeps a remainder of at least 512 bytes, in
    /// both pools.
    expandable_segments: bool,
}

impl Default for Rules {
    fn default() -> Self {
        Rules { divisions: [0; DIVISION_INTERVALS], max_split_size: u64::MAX, expandable_segments: false }
    }
}

impl Rules {
    /// Rules from `allocator_settings`. When the file does not say whether expandable segments
    /// were on, they were on if any segment is expandable or the trace maps memory.
    pub fn from_snapshot(snapshot: &Snapshot) -> Rules {
        let settings = &snapshot.settings;
        let expandable_segments = settings.expandable_segments.unwrap_or_else(|| {
            snapshot.segments.iter().any(|s| s.is_expandable)
                || snapshot
                    .traces
                    .iter()
                    .flat_map(|t| &t.events)
                    .any(|e| matches!(e.action(), Action::SegmentMap | Action::SegmentUnmap))
        });
        Rules::new(settings.max_split_size, expandable_segments, &settings.roundup_power2_divisions)
    }

    /// Rules from explicit settings; `divisions` is keyed like
    /// [`memsnap_model::AllocatorSettings::roundup_power2_divisions`] (interval start in MiB).
    pub fn new(max_split_size: Option<u64>, expandable_segments: bool, divisions: &BTreeMap<u64, u64>) -> Rules {
        let mut by_interval = [0; DIVISION_INTERVALS];
        for (&start_mib, &n) in divisions {
            if start_mib.is_power_of_two() {
                let k = start_mib.trailing_zeros() as usize;
                if k < DIVISION_INTERVALS {
                    by_interval[k] = n;
                }
            }
        }
        Rules { divisions: by_interval, max_split_size: max_split_size.unwrap_or(u64::MAX), expandable_segments }
    }

    pub fn expandable_segments(&self) -> bool {
        self.expandable_segments
    }

    /// `max_split_size` in bytes, `None` when unlimited.
    pub fn max_split_size(&self) -> Option<u64> {
        (self.max_split_size != u64::MAX).then_some(self.max_split_size)
    }

    /// `round_size`: the block size the allocator looks for when `requested` bytes are asked for.
    pub fn round_size(&self, requested: u64) -> u64 {
        if requested < MIN_BLOCK_SIZE {
            return MIN_BLOCK_SIZE;
        }
        let divisions = self.divisions_for(requested);
        if divisions > 1 && requested > MIN_BLOCK_SIZE * divisions {
            next_division(requested, divisions)
        } else {
            requested.div_ceil(MIN_BLOCK_SIZE) * MIN_BLOCK_SIZE
        }
    }

    /// Whether an allocation of `rounded` bytes comes from the small pool.
    pub fn is_small(rounded: u64) -> bool {
        rounded <= SMALL_SIZE
    }

    /// `should_split`: whether a free block of `block_size` bytes is split for an allocation of
    /// `rounded` bytes. When it is not, the allocation holds the whole block.
    pub fn should_split(&self, rounded: u64, block_size: u64) -> bool {
        let remaining = block_size.saturating_sub(rounded);
        if Self::is_small(rounded) || self.expandable_segments {
            remaining >= MIN_BLOCK_SIZE
        } else {
            rounded < self.max_split_size && remaining > SMALL_SIZE
        }
    }

    /// The largest block an allocation of `rounded` bytes can have been given whole: anything
    /// larger would have been split (`should_split`), or for an oversize request refused by
    /// `get_free_block` (a cached block `kLargeBuffer` or more above it). A fresh segment is
    /// never larger than that either.
    pub fn max_whole_block(&self, rounded: u64) -> u64 {
        if Self::is_small(rounded) || self.expandable_segments {
            rounded
        } else if rounded < self.max_split_size {
            rounded + SMALL_SIZE
        } else {
            rounded + LARGE_BUFFER - MIN_BLOCK_SIZE
        }
    }

    fn divisions_for(&self, size: u64) -> u64 {
        let log = u64::from(63 - size.leading_zeros());
        let index = log.saturating_sub(20).min(DIVISION_INTERVALS as u64 - 1);
        self.divisions[index as usize]
    }
}

/// `roundup_power2_next_division`: round up to the next of `divisions` equal steps of the
/// power-of-two interval that holds `size`.
fn next_division(size: u64, divisions: u64) -> u64 {
    if size.is_power_of_two() {
        return size;
    }
    let floor = 1u64 << (63 - size.leading_zeros());
    let step = floor >> (63 - divisions.leading_zeros());
    if step == 0 {
        return floor << 1;
    }
    let rounded_down = size & !(step - 1);
    if rounded_down == size {
        size
    } else {
        rounded_down + step
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn rounds_to_512_without_divisions() {
        let r = Rules::default();
        assert_eq!(r.round_size(0), 512);
        assert_eq!(r.round_size(1), 512);
        assert_eq!(r.round_size(512), 512);
        assert_eq!(r.round_size(513), 1024);
        assert_eq!(r.round_size(3 * MIB + 1), 3 * MIB + 512);
    }

    #[test]
    fn rounds_to_power_of_two_divisions() {
        let all4: BTreeMap<u64, u64> = (0..16).map(|k| (1u64 << k, 4)).collect();
        let r = Rules::new(None, false, &all4);
        // [4 MiB, 8 MiB) in four steps of 1 MiB.
        assert_eq!(r.round_size(4 * MIB + 1), 5 * MIB);
        assert_eq!(r.round_size(5 * MIB), 5 * MIB);
        assert_eq!(r.round_size(8 * MIB), 8 * MIB);
        // Below 1 MiB the first interval's divisions apply: 600 KiB lies in [512 KiB, 1 MiB),
        // steps of 128 KiB.
        assert_eq!(r.round_size(600 << 10), 640 << 10);
        // Small sizes (not above 512 * divisions) keep 512-byte rounding.
        assert_eq!(r.round_size(1500), 1536);
    }

    #[test]
    fn split_rules() {
        let r = Rules::default();
        assert!(r.should_split(512, 1024));
        assert!(!r.should_split(512, 512));
        // Large pool: split only when more than 1 MiB remains.
        assert!(!r.should_split(2 * MIB, 3 * MIB));
        assert!(r.should_split(2 * MIB, 3 * MIB + 512));
        let capped = Rules::new(Some(64 * MIB), false, &BTreeMap::new());
        assert!(!capped.should_split(64 * MIB, 80 * MIB));
        assert_eq!(capped.max_whole_block(64 * MIB), 84 * MIB - 512);
        let expandable = Rules::new(None, true, &BTreeMap::new());
        assert!(expandable.should_split(2 * MIB, 2 * MIB + 512));
    }
}
