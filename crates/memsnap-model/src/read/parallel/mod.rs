//! Reading a snapshot's trace on several threads.
//!
//! Why it can be done: a snapshot written by Python's pickler (protocol 4 or 5) is cut into
//! `FRAME`s of at most 64 KiB that end on opcode boundaries, so any frame start is a place to
//! begin decoding opcodes. A trace list is written as batches of 1000 entries (`MARK entry…
//! APPENDS`), and a batch starts with a pattern no other object of a snapshot starts with:
//! `MARK EMPTY_DICT MEMOIZE MARK BINGET <the memo index of the key 'action'>`. So each chunk
//! walks opcode lengths to its first batch and decodes from there into events on its own
//! thread ([`decode`]). `MEMOIZE` gives each object the next memo index, so the `MEMOIZE`s each
//! decoder counts tell every chunk, once all are decoded, the exact memo index it started at;
//! references that needed it are resolved then ([`decode::fix_up`], in parallel). References
//! to objects of earlier chunks stay references until the chunks are merged in order
//! ([`merge`]), which gives strings, frames and stacks the ids the sequential reader would
//! have given them.
//!
//! How it fits the VM: after the VM appends a batch of compacted entries to a list, it offers
//! the builder to read on ([`memsnap_pickle::Compactor::fast_forward`]); this module reads as
//! many whole batches as it can from a window of the input and hands the VM the records, the
//! memo entries and the counts those bytes would have made. The first thing it does not
//! understand (the end of the list, an unusual entry, a protocol-2 file from the C++ pickler,
//! which has no frames) is left to the VM, so the output is the sequential reader's, byte for
//! byte, and the sequential reader stays the reference (`ReadOptions::sequential`, the
//! differential tests and the fuzz target).

mod decode;
mod merge;

use memsnap_pickle::scan;
use memsnap_pickle::{Advanced, Ahead, ErrorKind, MemoRef, PickleError, StoreView, Value};
use rayon::prelude::*;

use super::{Builder, Contexts};
use crate::{Action, TraceEvent};
pub(in crate::read) use decode::Chunk;
use decode::Window;
pub(in crate::read) use merge::Converted;

/// Bytes per chunk: a chunk is the unit of work of one thread. Small enough that a window
/// holds [`CHUNKS_PER_THREAD`] per thread, large enough that per-chunk tables amortize (a chunk holds
/// about 12 000 entries).
const CHUNK_BYTES: usize = 1 << 20;

/// Chunks a window holds per thread: enough that a thread slowed by a dense chunk does not
/// hold the others up for long. A window larger than that only costs: the VM fills it and
/// merges its chunks alone while the other threads wait, and its pages and the chunks' tables
/// are touched afresh and fall out of the caches before the merge reads them. On the 87 MB
/// bench file, 2 threads: 32 MiB windows 0.28-0.33 s and 91 MB peak RSS, 8 MiB windows
/// 0.24-0.30 s and 38 MB; 6 MiB windows as fast as 8 MiB (paired) and 3 MB less, which keeps
/// `summary` under 0.35x the file (docs/performance.md).
const CHUNKS_PER_THREAD: usize = 3;
/// The smallest window asked for, whatever the threads and chunk size.
const MIN_WINDOW: usize = 4 << 20;

/// The window is at most this share of the pickle (its size when known, else the bytes read so
/// far), so that the memory it and its chunks' tables take stays a small part of the input
/// however many threads there are. On the 87 MB bench file `summary`'s peak grew from 25 MiB on
/// 2 threads to 75 MiB on 16 (48 MiB windows), past the 0.35x the file `summary` is held to; a
/// sixteenth (5.2 MiB there) keeps it at 24-27 MiB on 2 to 16 threads, and leaves every window
/// of the 1 GB bench file as it was up to 16 threads. It costs that file's `summary` about 4%
/// on 2 threads (6 MiB windows before; a twelfth would keep them, and reach 0.36x the file on
/// 16 threads): docs/performance.md.
const WINDOW_SHARE_OF_INPUT: u64 = 16;
/// The smallest chunk a window is cut into when it is bounded by [`WINDOW_SHARE_OF_INPUT`]
/// (about 3 000 entries): below it, references to objects of earlier chunks (frames, keys),
/// which the merge resolves on one thread, become a larger share of each chunk's work.
const MIN_CHUNK_BYTES: usize = 256 << 10;

/// How the parallel reader cuts the input: the window shown at a time and the chunks in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Cut {
    pub window: usize,
    pub chunk: usize,
}

/// The cut at pickle offset `offset` of a pickle of `input_len` bytes (0: unknown):
/// [`CHUNKS_PER_THREAD`] chunks of [`CHUNK_BYTES`] for each of rayon's threads, from
/// [`MIN_WINDOW`] up to the VM's cap, and no more than the input's size (else the offset)
/// divided by [`WINDOW_SHARE_OF_INPUT`], though never below [`MIN_WINDOW`]; the chunks of a
/// window so bounded are made smaller (to [`MIN_CHUNK_BYTES`]) so that every thread still has
/// some.
/// A configured chunk size ([`ReadOptions::chunk_bytes`](crate::ReadOptions), for tests) is
/// kept as it is.
pub(super) fn cut(configured: usize, input_len: u64, offset: u64) -> Cut {
    let threads = rayon::current_num_threads().max(1);
    let window_for = |chunk: usize| {
        threads
            .saturating_mul(CHUNKS_PER_THREAD)
            .saturating_mul(chunk)
            .clamp(MIN_WINDOW, memsnap_pickle::MAX_FAST_FORWARD_WINDOW)
    };
    if configured != 0 {
        return Cut { window: window_for(configured), chunk: configured };
    }
    let full = window_for(CHUNK_BYTES);
    let known = if input_len > 0 { input_len } else { offset };
    let share = usize::try_from(known / WINDOW_SHARE_OF_INPUT).unwrap_or(usize::MAX).max(MIN_WINDOW);
    if share >= full {
        return Cut { window: full, chunk: CHUNK_BYTES };
    }
    let chunk = (share / threads.saturating_mul(CHUNKS_PER_THREAD)).clamp(MIN_CHUNK_BYTES, CHUNK_BYTES);
    Cut { window: share, chunk }
}

/// After a window that read little (less than a quarter of it) the VM reads this far alone
/// before the next try, twice as far after each further such window, at most
/// [`MAX_BACKOFF`]; a window read to its end resets it. So does an offer where no batch
/// starts. It bounds the work a file can waste: a try fills and scans a whole window, so a file
/// whose every batch stops the decoder early, or that holds many small lists (an offer each),
/// would otherwise cost a window per batch or per list.
const FIRST_BACKOFF: u64 = 4 << 20;
const MAX_BACKOFF: u64 = 256 << 20;

/// Read on from `ahead` (see the module comment); `None` when nothing could be read.
pub(super) fn fast_forward(b: &mut Builder, ahead: Ahead<'_, '_>) -> Result<Option<Advanced>, PickleError> {
    let Ahead { bytes, offset, frame_end, list, mut store } = ahead;
    let view = store.view();
    let vm_memo = view.memo_len();
    if vm_memo >= (u32::MAX / 2) as usize {
        return Ok(None);
    }
    if offset < b.resume_at {
        return Ok(None);
    }
    let Some(frame_rel) = frame_end.checked_sub(offset) else { return Ok(None) };
    let (bounds, chain_to_end) = chunk_bounds(bytes, frame_rel, cut(b.chunk_bytes, b.input_len, offset).chunk);
    if bounds.len() < 2 || !batch_starts(bytes, 0, view, true) {
        // Not a trace going on (the end of one, or a small list): the VM reads on alone for a
        // while, so that a pickle of many small lists does not fill a window per list.
        b.back_off(offset);
        return Ok(None);
    }
    // One batch first, on this thread: a file whose batches the decoder does not take costs
    // one batch per try, not a window. Not after a window read to its end, where this one
    // starts: its batches went on to here, so the next is taken but for a rare entry, and a
    // window that takes nothing backs off like any short one.
    if offset != b.whole_window_end || offset == 0 {
        let mut probe = b.chunk_pool.pop().unwrap_or_default();
        decode::decode(
            Window { data: bytes, store: view, vm_memo: vm_memo as u32 },
            0,
            1,
            Some(vm_memo as u32),
            &mut probe,
        );
        let took_one = !probe.marks.is_empty();
        b.chunk_pool.push(probe);
        if !took_one {
            b.back_off(offset);
            return Ok(None);
        }
    }

    b.windows_scanned += 1;
    // Phase 1, parallel: where each chunk's first batch starts (a walk to it, no further).
    let syncs: Vec<Option<Option<usize>>> =
        (1..bounds.len() - 1).into_par_iter().map(|k| first_batch(bytes, bounds[k], bounds[k + 1], view)).collect();
    let mut starts: Vec<usize> = vec![0];
    let mut walked_to_end = true;
    let mut last_stop = *bounds.last().unwrap_or(&0);
    for (k, sync) in syncs.iter().enumerate() {
        match sync {
            Some(Some(pos)) => starts.push(*pos),
            Some(None) => {}
            None => {
                walked_to_end = false;
                last_stop = bounds[k + 1];
                break;
            }
        }
    }

    // Phase 2, parallel: decode each chunk from its start to the next one's. Only the first
    // knows its memo base; the others learn theirs from the counts of those before them, and
    // then resolve what waited on it.
    let window = Window { data: bytes, store: view, vm_memo: vm_memo as u32 };
    let mut chunks = std::mem::take(&mut b.chunk_pool);
    chunks.resize_with(starts.len().max(chunks.len()), decode::Chunk::default);
    chunks[..starts.len()].par_iter_mut().enumerate().for_each(|(i, chunk)| {
        let stop = starts.get(i + 1).copied().unwrap_or(last_stop);
        let base = (i == 0).then_some(vm_memo as u32);
        decode::decode(window, starts[i], stop, base, chunk);
    });
    let mut bases: Vec<u32> = Vec::with_capacity(starts.len());
    let mut base = vm_memo as u64;
    for chunk in &chunks[..starts.len()] {
        bases.push(base as u32);
        base += chunk.marks.last().map_or(0, |m| m.counts.memoize);
        if !chunk.complete || base >= (u32::MAX / 2) as u64 {
            break;
        }
    }
    chunks[1..bases.len()].par_iter_mut().zip(&bases[1..]).for_each(|(chunk, &base)| decode::fix_up(chunk, base));

    // Phase 3, in order: merge.
    let first_record = b.records;
    let mut adv = Advanced { first_record, ..Advanced::default() };
    // Chunks past the memo's limit are left to the VM.
    let mut window_end = walked_to_end && chain_to_end && bases.len() == starts.len();
    let mut merged_maps: Vec<(merge::Maps, usize)> = Vec::with_capacity(starts.len());
    for (i, chunk) in chunks[..bases.len()].iter().enumerate() {
        let expected_base = expected_base(&chunks, i, vm_memo as u32);
        if chunk.base != expected_base {
            window_end = false;
            break;
        }
        let merged = merge::merge(b, &mut store, chunk).map_err(|kind| PickleError {
            offset: (offset as usize).saturating_add(chunk.start),
            opcode: None,
            kind,
        })?;
        let (Some(mark), Some(maps)) = (merged.last, merged.maps) else {
            window_end = false;
            break;
        };
        merged_maps.push((maps, mark.events));
        adv.consumed = mark.end;
        adv.opcodes += mark.counts.opcodes;
        adv.memoize += mark.counts.memoize;
        adv.frames += mark.counts.frames;
        if let Some(fe) = mark.frame_end {
            adv.frame_end = Some(offset + fe as u64);
        }
        let last_chunk = i + 1 == starts.len();
        if !merged.whole || !(chunk.complete || last_chunk) {
            window_end = false;
            break;
        }
        if last_chunk {
            window_end &= chunk.ran_out || chunk.complete;
        }
    }
    // Phase 4, parallel: the events (or their tallies), each chunk's written straight into its
    // place in the events (every slot is overwritten), so that they are not copied after: that
    // copy, and the first touch of its pages, ran on the VM's thread alone.
    let mut outs = std::mem::take(&mut b.converted_pool);
    outs.resize_with(merged_maps.len().max(outs.len()), Default::default);
    let mut events = std::mem::take(&mut b.events);
    let first_event = events.len();
    if b.keep_events {
        let total = merged_maps.iter().map(|(_, n)| n).sum();
        events.par_extend(rayon::iter::repeat_n(TraceEvent::new(Action::Other, 0), total));
    }
    {
        let mut places: Vec<&mut [TraceEvent]> = Vec::with_capacity(merged_maps.len());
        let mut rest = &mut events[first_event..];
        for (_, n) in &merged_maps {
            let (place, after) = std::mem::take(&mut rest).split_at_mut(if b.keep_events { *n } else { 0 });
            places.push(place);
            rest = after;
        }
        let (b, view) = (&*b, store.view());
        outs[..merged_maps.len()]
            .par_iter_mut()
            .zip(&merged_maps)
            .zip(places)
            .enumerate()
            .for_each(|(i, ((out, (maps, n)), place))| merge::convert(b, view, &chunks[i], maps, *n, out, place));
    }
    let mut at = first_event;
    for (out, (_, n)) in outs[..merged_maps.len()].iter_mut().zip(&merged_maps) {
        b.events_with_frames += out.tally.events_with_frames();
        for a in &out.unknown_actions {
            *b.unknown_actions.entry(a.clone()).or_default() += 1;
        }
        let place = if b.keep_events { &mut events[at..at + n] } else { &mut [][..] };
        let absorbed = out.contexts.as_ref().and_then(|c| b.contexts.absorb(c, place));
        if absorbed.is_none() {
            b.events = events;
            return Err(PickleError {
                offset: offset as usize,
                opcode: None,
                kind: ErrorKind::LimitExceeded(Contexts::LIMIT_TEXT),
            });
        }
        if b.keep_events {
            at += n;
        }
        b.tallies.entry(list).or_default().merge(&out.tally);
    }
    b.events = events;
    b.converted_pool = outs;
    adv.records = b.records - first_record;
    b.chunk_pool = chunks;
    adv.window_end = window_end;
    if window_end {
        b.whole_window_end = offset + adv.consumed as u64;
    }
    if window_end || adv.consumed >= bytes.len() / 4 {
        b.backoff = 0;
    } else {
        b.back_off(offset + adv.consumed as u64);
    }
    Ok((adv.consumed > 0).then_some(adv))
}

impl Builder {
    /// Leave the next [`FIRST_BACKOFF`] bytes (doubling each time) after `at` to the VM.
    fn back_off(&mut self, at: u64) {
        self.backoff = if self.backoff == 0 { FIRST_BACKOFF } else { (self.backoff * 2).min(MAX_BACKOFF) };
        self.resume_at = at.saturating_add(self.backoff);
    }
}

/// The memo index chunk `i` must start at: where chunk `i - 1` ended (the window's memo
/// length for the first).
fn expected_base(chunks: &[decode::Chunk], i: usize, vm_memo: u32) -> u32 {
    match i.checked_sub(1) {
        None => vm_memo,
        Some(p) => {
            let prev = &chunks[p];
            let memoized = prev.marks.last().map_or(0, |m| m.counts.memoize);
            prev.base + memoized as u32
        }
    }
}

/// Chunk boundaries in `bytes`: 0, then frame starts about `chunk_bytes` apart, then the end
/// of the last frame that lies wholly in the window. `frame_rel` is where the current frame
/// ends. Also says whether the chain of frames ran to the end of the window (rather than to
/// bytes outside any frame).
fn chunk_bounds(bytes: &[u8], frame_rel: u64, chunk_bytes: usize) -> (Vec<usize>, bool) {
    let len = bytes.len();
    let mut bounds = vec![0];
    let Ok(mut rel) = usize::try_from(frame_rel) else { return (bounds, false) };
    if rel > len {
        return (bounds, false);
    }
    let mut last = 0;
    let to_end = loop {
        let Some(head) = bytes.get(rel..rel + 9) else { break true };
        if head[0] != scan::FRAME {
            break false;
        }
        let n = u64::from_le_bytes(head[1..9].try_into().expect("8 bytes"));
        let Some(next) = usize::try_from(n).ok().and_then(|n| (rel + 9).checked_add(n)) else { break true };
        if next > len {
            break true;
        }
        if rel - last >= chunk_bytes {
            bounds.push(rel);
            last = rel;
        }
        rel = next;
    };
    if rel > last {
        bounds.push(rel);
    }
    (bounds, to_end)
}

/// The first batch start in `data[from..to]`, walking opcodes from `from` until one is found
/// (`Some(None)`: none there); `None` when an opcode on the way has no known length or
/// crosses `to`.
fn first_batch(data: &[u8], from: usize, to: usize, view: StoreView<'_, '_>) -> Option<Option<usize>> {
    let mut pos = from;
    // The chunk's start is a candidate (the previous chunk may end with APPENDS), but only for
    // a batch that opens with MARK: without knowing the opcode before, a lone entry there may
    // be the middle of a batch. After it, the position just after an APPENDS or APPEND (a
    // FRAME header may follow) is a candidate for either form.
    let mut candidate = true;
    let mut after_appends = false;
    while pos < to {
        if candidate && batch_starts(data, pos, view, after_appends) {
            return Some(Some(pos));
        }
        let op = data[pos];
        let n = scan::op_len_fast(data, pos)?;
        if pos + n > to {
            return None;
        }
        pos += n;
        if op != scan::FRAME {
            candidate = op == scan::APPENDS || op == scan::APPEND;
            after_appends = candidate;
        }
    }
    Some(None)
}

/// Whether a batch of trace entries starts at `pos`: `MARK EMPTY_DICT MEMOIZE MARK` and a
/// fetch of the key `'action'` (without the first MARK too when `bare`: a batch of one entry),
/// `FRAME` headers allowed in between.
fn batch_starts(data: &[u8], pos: usize, view: StoreView<'_, '_>, bare: bool) -> bool {
    fn next(data: &[u8], p: &mut usize) -> Option<u8> {
        while *data.get(*p)? == scan::FRAME {
            *p += 9;
        }
        let op = *data.get(*p)?;
        *p += 1;
        Some(op)
    }
    let mut p = pos;
    let mut op = next(data, &mut p);
    if op == Some(scan::MARK) {
        op = next(data, &mut p);
    } else if !bare {
        return false;
    }
    if op != Some(scan::EMPTY_DICT)
        || next(data, &mut p) != Some(scan::MEMOIZE)
        || next(data, &mut p) != Some(scan::MARK)
    {
        return false;
    }
    let get = next(data, &mut p);
    let idx = match get {
        Some(scan::BINGET) => data.get(p).map(|&b| b as usize),
        Some(scan::LONG_BINGET) => data.get(p..p + 4).map(|b| u32::from_le_bytes(b.try_into().expect("4")) as usize),
        _ => None,
    };
    matches!(idx.and_then(|i| view.memo_get(i)), Some(MemoRef::Value(Value::Str(s))) if view.heap.str(s) == "action")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cut_on(threads: usize, configured: usize, input_len: u64, offset: u64) -> Cut {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("a pool");
        pool.install(|| cut(configured, input_len, offset))
    }

    /// Many threads on a mid-sized file: the window is held to a share of the file, and its
    /// chunks shrink so that every thread still gets some (but not below the floor).
    #[test]
    fn many_threads_do_not_grow_the_window_past_a_share_of_the_input() {
        let file = 88_000_000u64;
        let wide = cut_on(16, 0, file, 0);
        assert_eq!(wide.window as u64, file / WINDOW_SHARE_OF_INPUT);
        assert!(wide.chunk >= MIN_CHUNK_BYTES && wide.chunk < CHUNK_BYTES, "{wide:?}");
        assert!(wide.window / wide.chunk >= 16, "every thread has a chunk: {wide:?}");
        // Two threads' window fits in the share: as it was, chunks of CHUNK_BYTES.
        let narrow = cut_on(2, 0, 200_000_000, 0);
        assert_eq!(narrow, Cut { window: 2 * CHUNKS_PER_THREAD * CHUNK_BYTES, chunk: CHUNK_BYTES });
    }

    /// A file of unknown size (compressed): bounded by what was read so far, never below
    /// MIN_WINDOW; a large file read far is not bounded at all.
    #[test]
    fn an_input_of_unknown_size_is_bounded_by_the_bytes_read_so_far() {
        assert_eq!(cut_on(16, 0, 0, 0).window, MIN_WINDOW);
        assert_eq!(cut_on(16, 0, 0, 0).chunk, MIN_CHUNK_BYTES);
        let far = cut_on(8, 0, 0, 4 << 30);
        assert_eq!(far, Cut { window: 8 * CHUNKS_PER_THREAD * CHUNK_BYTES, chunk: CHUNK_BYTES });
        // Past the VM's cap the window is the cap's, in chunks of CHUNK_BYTES, as before.
        let capped = cut_on(16, 0, 0, 4 << 30);
        assert_eq!(capped, Cut { window: memsnap_pickle::MAX_FAST_FORWARD_WINDOW, chunk: CHUNK_BYTES });
    }

    /// The tests' chunk size is kept whatever the input's size.
    #[test]
    fn a_configured_chunk_size_is_kept() {
        assert_eq!(cut_on(4, 4096, 1 << 20, 0), Cut { window: MIN_WINDOW, chunk: 4096 });
    }
}
