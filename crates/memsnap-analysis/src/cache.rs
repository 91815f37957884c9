//! What the caching allocator holds beyond the live tensors, and why reserved memory grew.
//!
//! Mechanism. PyTorch's caching allocator never gives freed memory back to the driver on its
//! own: a freed block stays in its segment, cached for the next request that fits it. So
//! `memory_reserved()` (what `nvidia-smi` shows, less the CUDA context) stays at its high-water
//! mark while `memory_allocated()` falls, and the difference is not a leak. What
//! `torch.cuda.empty_cache()` returns is only the segments of the default pools that hold no
//! allocated block (`release_blocks` frees a block only when it has no split neighbour; it first
//! waits for the stream events of blocks freed but still in use, `synchronize_and_free_events`,
//! so those count as free), plus the whole free pages of expandable segments; holes in segments
//! that still hold a live block stay, and a private pool (CUDA graphs, `MemPool`) keeps its
//! memory while the pool lives.
//!
//! A segment is made (`cudaMalloc`, or `segment_map` for an expandable segment) only when no
//! cached block of the request's pool (small or large) and stream can take it. A segment made
//! while at least its own size sat cached free in that pool on that stream therefore says the
//! cache had the bytes but in the wrong blocks: too small or split up (tensor shapes that change
//! from step to step, long-lived tensors carved out between short-lived ones). That is how
//! reserved memory ends up above the peak of allocated memory.
//!
//! Read from the dump's segment table (exact) and, for the growth, from the replay's segments
//! and series (exact when the replay matches the dump).

use memsnap_model::{BlockState, Segment, SegmentType, Snapshot, TraceEvent};
use memsnap_replay::{DeviceReplay, SegmentLifetime, SMALL_SIZE};
use rayon::prelude::*;

use crate::Thresholds;

/// The cache of one device at the dump, and how reserved memory grew during the trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllocatorCache {
    /// `memory_reserved()` at the dump: every segment.
    pub reserved: u64,
    /// `memory_allocated()` at the dump.
    pub allocated: u64,
    /// `reserved − allocated`: the parts below (with `unlisted_bytes`) add up to it.
    pub cached_free: u64,
    /// Default-pool segments that hold no allocated block, and their free bytes (their blocks
    /// still in use by a stream are in `pending_free_bytes`): `empty_cache()` gives these
    /// segments back to the driver whole.
    pub free_segments: u64,
    pub free_segment_bytes: u64,
    /// Free blocks in default-pool segments that also hold a live block: reusable by requests
    /// that fit, returned by nothing.
    pub hole_bytes: u64,
    /// Free blocks in expandable segments: `empty_cache()` unmaps the whole pages inside them
    /// (`expandable_unmappable_bytes`).
    pub expandable_free_bytes: u64,
    /// Free blocks in private pools: kept while their pool lives.
    pub private_free_bytes: u64,
    /// The whole pages `empty_cache()` unmaps from expandable segments (see
    /// `empty_cache_returns`).
    pub expandable_unmappable_bytes: u64,
    /// Blocks freed by the program but still in use by a stream (`free_requested`): they become
    /// cached when the stream's work completes.
    pub pending_free_bytes: u64,
    /// Bytes of segments that none of their listed blocks covers. The allocator's blocks tile
    /// their segment, so this is 0 in every file PyTorch writes; a file edited or written by
    /// another producer may list fewer, and the parts above would not add up without it.
    pub unlisted_bytes: u64,
    /// What `torch.cuda.empty_cache()` called right after the dump would return: the segments
    /// of `free_segments` whole, and the whole pages of expandable segments among their blocks
    /// that are free or become free once their streams' work is done.
    pub empty_cache_returns: u64,
    /// Whether the device has expandable segments (`expandable_segments:True` is in use).
    pub expandable: bool,
    /// How reserved memory grew; `None` when the trace records no allocations.
    pub growth: Option<ReservedGrowth>,
}

/// Segments made and released during the trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReservedGrowth {
    /// Highest reserved and highest allocated bytes within the trace.
    pub peak_reserved: u64,
    pub peak_allocated: u64,
    /// Allocated bytes at the moment reserved peaked.
    pub allocated_at_peak_reserved: u64,
    /// Default-pool segments (or mapped ranges) made during the trace, and their bytes.
    pub made: u64,
    pub made_bytes: u64,
    /// Those made while at least their own size was cached free in their pool on their stream.
    pub made_while_cached: u64,
    pub made_while_cached_bytes: u64,
    /// The largest of those: its event, size and the cached free bytes just before it.
    pub largest_while_cached: Option<SegmentMade>,
    /// Whether the reserved peak exceeds the allocated peak by at least
    /// [`Thresholds::reserved_excess_share`] of it and [`Thresholds::reserved_excess_min_bytes`]:
    /// then the report advises on reserved memory.
    ///
    /// [`Thresholds::reserved_excess_share`]: crate::Thresholds
    /// [`Thresholds::reserved_excess_min_bytes`]: crate::Thresholds
    pub excess: bool,
    /// Segments (or mapped ranges) released during the trace (`empty_cache()`, or the allocator
    /// freeing its cache to retry a failed `cudaMalloc`), and their bytes.
    pub released: u64,
    pub released_bytes: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentMade {
    pub event_index: u32,
    pub size: u64,
    pub cached_free_before: u64,
}

/// The cache of `segments` (one device's dump-time segment table), with the growth read from
/// its replay when the trace records allocations (`traced`).
pub fn allocator_cache<'a>(
    snap: &Snapshot,
    segments: impl IntoIterator<Item = &'a Segment>,
    replay: &DeviceReplay,
    traced: bool,
    thresholds: &Thresholds,
) -> AllocatorCache {
    let events = snap.trace(replay.device).map_or(&[][..], |t| &t.events[..]);
    AllocatorCache { growth: traced.then(|| growth(snap, events, replay, thresholds)), ..cache_at_dump(segments) }
}

/// The cache of `segments` (one device's dump-time segment table) alone, without the growth
/// (which needs the replay): what `summary` shows.
pub fn cache_at_dump<'a>(segments: impl IntoIterator<Item = &'a Segment>) -> AllocatorCache {
    let mut c = AllocatorCache {
        reserved: 0,
        allocated: 0,
        cached_free: 0,
        free_segments: 0,
        free_segment_bytes: 0,
        hole_bytes: 0,
        expandable_free_bytes: 0,
        private_free_bytes: 0,
        pending_free_bytes: 0,
        unlisted_bytes: 0,
        expandable_unmappable_bytes: 0,
        empty_cache_returns: 0,
        expandable: false,
        growth: None,
    };
    for seg in segments {
        c.reserved = c.reserved.saturating_add(seg.total_size);
        c.expandable |= seg.is_expandable;
        // One pass over the segment's blocks: its free bytes, all its listed bytes, whether it
        // holds an allocated block; the device's allocated and pending-free bytes.
        let (mut free, mut listed, mut holds_block) = (0u64, 0u64, false);
        for b in &seg.blocks {
            listed = listed.saturating_add(b.size);
            match b.state {
                BlockState::Allocated => {
                    c.allocated = c.allocated.saturating_add(b.size);
                    holds_block = true;
                }
                BlockState::PendingFree => c.pending_free_bytes = c.pending_free_bytes.saturating_add(b.size),
                BlockState::Inactive => free = free.saturating_add(b.size),
            }
        }
        c.unlisted_bytes = c.unlisted_bytes.saturating_add(seg.total_size.saturating_sub(listed));
        if seg.is_expandable && !seg.is_private_pool() {
            c.expandable_unmappable_bytes = c.expandable_unmappable_bytes.saturating_add(unmappable(seg));
        }
        let bucket = if seg.is_private_pool() {
            &mut c.private_free_bytes
        } else if seg.is_expandable {
            &mut c.expandable_free_bytes
        } else if holds_block {
            &mut c.hole_bytes
        } else {
            c.free_segments += 1;
            c.empty_cache_returns = c.empty_cache_returns.saturating_add(seg.total_size);
            &mut c.free_segment_bytes
        };
        *bucket = bucket.saturating_add(free);
    }
    c.cached_free = c.reserved.saturating_sub(c.allocated);
    c.empty_cache_returns = c.empty_cache_returns.saturating_add(c.expandable_unmappable_bytes);
    c
}

/// Page size of an expandable segment: it maps and unmaps memory in pages of 2 MiB in the
/// small pool and 20 MiB in the large pool (`ExpandableSegment::segment_size_`: `kSmallBuffer`,
/// `kLargeBuffer`), counted from the start of the segment.
fn expandable_page(seg: &Segment) -> u64 {
    if seg.segment_type == SegmentType::Small {
        2 << 20
    } else {
        20 << 20
    }
}

/// The bytes `empty_cache()` unmaps from a mapped range of an expandable segment: of each free
/// run of blocks (free, or freed and waited for: neighbours merge when freed), the whole pages
/// inside it (`ExpandableSegment::unmap` rounds the run's start up and its end down to pages).
/// A mapped range starts on a page boundary, so pages count from it.
fn unmappable(seg: &Segment) -> u64 {
    let page = expandable_page(seg);
    let mut blocks: Vec<(u64, u64, bool)> = seg
        .blocks
        .iter()
        .map(|b| (b.address.saturating_sub(seg.address), b.size, b.state != BlockState::Allocated))
        .collect();
    blocks.sort_unstable();
    let pages = |start: u64, end: u64| (end / page * page).saturating_sub(start.div_ceil(page).saturating_mul(page));
    let (mut total, mut run) = (0u64, None::<(u64, u64)>);
    for (start, size, free) in blocks {
        let end = start.saturating_add(size);
        run = match (run, free) {
            (Some((s, e)), true) if e == start => Some((s, end)),
            (Some((s, e)), _) => {
                total = total.saturating_add(pages(s, e));
                free.then_some((start, end))
            }
            (None, _) => free.then_some((start, end)),
        };
    }
    if let Some((s, e)) = run {
        total = total.saturating_add(pages(s, e));
    }
    total
}

fn growth(snap: &Snapshot, events: &[TraceEvent], d: &DeviceReplay, thresholds: &Thresholds) -> ReservedGrowth {
    let (reserved, allocated) = (d.peaks.reserved.value, d.peaks.allocated.value);
    let over = reserved.saturating_sub(allocated);
    let excess = reserved > 0
        && over as f64 >= thresholds.reserved_excess_share * reserved as f64
        && over >= thresholds.reserved_excess_min_bytes;
    let mut g = ReservedGrowth {
        excess,
        peak_reserved: d.peaks.reserved.value,
        peak_allocated: d.peaks.allocated.value,
        allocated_at_peak_reserved: d.series.after(d.peaks.reserved.event_index).allocated,
        made: 0,
        made_bytes: 0,
        made_while_cached: 0,
        made_while_cached_bytes: 0,
        largest_while_cached: None,
        released: 0,
        released_bytes: 0,
    };
    let default_pool: Vec<&SegmentLifetime> = d.segments.iter().filter(|s| s.pool_id == (0, 0)).collect();
    let cached = cached_before_each_made(snap, events, d, &default_pool);
    let mut made_i = 0;
    for s in &default_pool {
        if s.released_event.is_some() {
            g.released += 1;
            g.released_bytes = g.released_bytes.saturating_add(s.size);
        }
        let Some(made) = s.created_event else { continue };
        g.made += 1;
        g.made_bytes = g.made_bytes.saturating_add(s.size);
        let cached = cached[made_i];
        made_i += 1;
        if cached >= s.size {
            g.made_while_cached += 1;
            g.made_while_cached_bytes = g.made_while_cached_bytes.saturating_add(s.size);
            let this = SegmentMade { event_index: made, size: s.size, cached_free_before: cached };
            // The largest; of equal ones the first made.
            match g.largest_while_cached {
                Some(l) if (l.size, std::cmp::Reverse(l.event_index)) >= (s.size, std::cmp::Reverse(made)) => {}
                _ => g.largest_while_cached = Some(this),
            }
        }
    }
    g
}

/// Which of the allocator's two default pools memory belongs to: requests up to
/// [`SMALL_SIZE`] are served from small segments, larger ones from large segments, and a request
/// is only ever served from its own pool.
fn small_pool(size: u64) -> bool {
    size <= SMALL_SIZE
}

/// Counters one accumulator of [`cached_before_each_made`] may hold before it stops splitting
/// the blocks over threads (4 Mi entries, 32 MiB): the counters are per query and per
/// (stream, pool), and a crafted trace can make both counts large.
const MAX_COUNTERS: usize = 1 << 22;

/// For each segment of `segments` made during the trace (in their order), the bytes cached free
/// in its own pool (small or large) on its own stream just before it was made: the reserved
/// bytes of that pool and stream less the bytes of its blocks not yet returned (allocated, or
/// freed but still in use by a stream).
///
/// A block's pool is told by its size and its stream by its first event in the trace. Counting
/// errs towards less cache, never more, so a segment is never said to be made beside cache it
/// could not have used: a block of a private pool (a CUDA graph's) counts against the default
/// pool of its size and stream; a block the trace never mentions (allocated before it and
/// still alive) counts against its pool on every stream; and when streams and queries are too
/// many to count apart ([`MAX_COUNTERS`]), streams are merged (as they are, trivially, when the
/// device's segments are all on one stream).
/// Segments and blocks are live over event ranges, so each adds its bytes to the queries (the
/// events just before each segment made) its range covers: a difference array over the sorted
/// queries, one binary search per endpoint.
fn cached_before_each_made(
    snap: &Snapshot,
    events: &[TraceEvent],
    d: &DeviceReplay,
    segments: &[&SegmentLifetime],
) -> Vec<u64> {
    // The moment just before event `e` is "after event e - 1"; -1 is before the first event.
    let at = |e: u32| e as i64 - 1;
    let mut queries: Vec<i64> = segments.iter().filter_map(|s| s.created_event).map(at).collect();
    if queries.is_empty() {
        return Vec::new();
    }
    queries.sort_unstable();
    queries.dedup();
    let n = queries.len();
    // Counters per query: per key (stream, pool), its reserved bytes then its used bytes.
    let mut streams: Vec<u64> = segments.iter().map(|s| s.stream).collect();
    streams.sort_unstable();
    streams.dedup();
    // One stream (the common case) needs no block's stream looked up: a lookup is a read of
    // the block's event, scattered over the whole trace.
    let per_stream = streams.len() > 1 && (n + 1).saturating_mul(4 * streams.len()) <= MAX_COUNTERS;
    if !per_stream {
        streams = vec![0];
    }
    let keys = 2 * streams.len();
    let key = |stream: u64, small: bool| {
        let k = if per_stream { streams.binary_search(&stream).ok() } else { Some(0) };
        k.map(|k| 2 * k + usize::from(small))
    };
    let width = 2 * keys;
    // Live after query x when born <= x < gone; `None` born means before the trace.
    let span = |born: Option<u32>, gone: Option<u32>| {
        let lo = born.map_or(0, |b| queries.partition_point(|&q| q < b as i64));
        let hi = gone.map_or(n, |g| queries.partition_point(|&q| q < g as i64));
        (lo, hi)
    };
    let add = |diff: &mut [u64], counter: usize, (lo, hi): (usize, usize), bytes: u64| {
        if lo < hi {
            diff[lo * width + counter] = diff[lo * width + counter].wrapping_add(bytes);
            diff[hi * width + counter] = diff[hi * width + counter].wrapping_sub(bytes);
        }
    };
    let stream_of = |b: &memsnap_replay::BlockLifetime| {
        let first = b.alloc_event().or(b.free_requested_event()).or(b.free_completed_event());
        first.and_then(|i| events.get(i as usize)).map(|e| snap.context(e).stream)
    };
    let size = (n + 1) * width;
    // Split the blocks over threads while each accumulator stays small; otherwise one.
    let parts = if size.saturating_mul(rayon::current_num_threads()) <= MAX_COUNTERS {
        rayon::current_num_threads().max(1)
    } else {
        1
    };
    let per_part = d.blocks.len().div_ceil(parts).max(1);
    let mut diff = d
        .blocks
        .par_chunks(per_part)
        .map(|blocks| {
            let mut diff = vec![0u64; size];
            for b in blocks {
                let small = small_pool(b.size);
                let range = span(b.alloc_event(), b.free_completed_event());
                match if per_stream { stream_of(b) } else { Some(0) } {
                    Some(stream) => {
                        if let Some(k) = key(stream, small) {
                            add(&mut diff, keys + k, range, b.size);
                        }
                    }
                    None => {
                        for k in (usize::from(small)..keys).step_by(2) {
                            add(&mut diff, keys + k, range, b.size);
                        }
                    }
                }
            }
            diff
        })
        .reduce(
            || vec![0u64; size],
            |mut a, b| {
                for (x, y) in a.iter_mut().zip(&b) {
                    *x = x.wrapping_add(*y);
                }
                a
            },
        );
    for s in segments {
        if let Some(k) = key(s.stream, s.segment_type == SegmentType::Small) {
            add(&mut diff, k, span(s.created_event, s.released_event), s.size);
        }
    }
    // Prefix sums: the counters at each query.
    for q in 1..n {
        for c in 0..width {
            diff[q * width + c] = diff[q * width + c].wrapping_add(diff[(q - 1) * width + c]);
        }
    }
    segments
        .iter()
        .filter_map(|s| {
            let made = s.created_event?;
            let q = queries.partition_point(|&q| q < at(made));
            // Every segment's stream has a key (or all share one): one value per segment made.
            let Some(k) = key(s.stream, s.segment_type == SegmentType::Small) else { return Some(0) };
            let row = &diff[q * width..(q + 1) * width];
            Some(row[k].saturating_sub(row[keys + k]))
        })
        .collect()
}
