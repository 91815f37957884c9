//! `fragmentation`: reserved memory the allocator holds but cannot hand out.
//!
//! Mechanism. The caching allocator splits a segment to serve a smaller request and can only
//! return whole segments to the driver (`empty_cache()`). Free blocks inside segments that also
//! hold live blocks ("inactive split") serve only requests that fit in the hole. When they are a
//! large share of reserved memory while little is allocated, the process holds memory it cannot
//! use. Read from the dump-time segment table (exact), thresholds in [`Thresholds`].
//! Near misses: free bytes in wholly free segments (`empty_cache()` returns them); few holes.
//!
//! [`Thresholds`]: crate::Thresholds

use memsnap_model::StackId;

use super::{Context, Detector, Finding};
use crate::evidence::{Evidence, Occurrence, Severity, SuspectKind};

pub struct Fragmentation;

impl Detector for Fragmentation {
    fn kind(&self) -> SuspectKind {
        SuspectKind::Fragmentation
    }

    fn detect(&self, cx: &Context) -> Vec<Finding> {
        let th = cx.thresholds;
        let Some(t) = cx.totals else { return Vec::new() };
        let reserved = t.reserved_bytes;
        if reserved == 0 {
            return Vec::new();
        }
        let split = t.inactive_split_bytes;
        let share = split as f64 / reserved as f64;
        let allocated_share = t.allocated_bytes as f64 / reserved as f64;
        if split < th.fragmentation_min_split_bytes
            || share < th.fragmentation_min_split_share
            || allocated_share > th.fragmentation_max_allocated_share
        {
            return Vec::new();
        }
        let pr = cx.replay.peaks.reserved;
        vec![Finding {
            occurrences: 0,
            kind: SuspectKind::Fragmentation,
            severity: Severity::Waste,
            confidence: (0.4 + share).min(0.9),
            blocks: Vec::new(),
            occurrence: Occurrence::Iteration,
            boundaries: Vec::new(),
            bytes: Some(split),
            site: None,
            stack: StackId::EMPTY,
            facts: Evidence::Fragmentation {
                reserved,
                allocated: t.allocated_bytes,
                inactive_split: split,
                largest_free_block: t.largest_free_block,
                peak_reserved: pr.value,
                allocated_at_peak_reserved: pr.event_index.map(|i| cx.replay.series.after(Some(i)).allocated),
                cached_free_at_end: cx.end.cached_free,
            },
        }]
    }
}
