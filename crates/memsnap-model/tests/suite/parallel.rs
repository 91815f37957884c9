//! The parallel trace reader against the sequential one (the reference): the same model, or
//! the same error, for every bundled snapshot and hostile file, on 1, 2 and 4 threads, from
//! memory and streamed; and on enough files that it really read in parallel.

use std::path::{Path, PathBuf};

use memsnap_model::{read_snapshot_from, read_snapshot_with, ReadOptions, Snapshot};

/// Every fixture pickle, decompressed, with its name.
fn fixtures() -> Vec<(String, Vec<u8>)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures");
    let mut dirs: Vec<PathBuf> =
        ["dev", "extra", "extra2", "extra3", "extra4", "variants", "multi", "formats", "hostile"]
            .iter()
            .map(|d| root.join(d))
            .collect();
    let shared = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/snapshots");
    if let Ok(entries) = std::fs::read_dir(&shared) {
        dirs.extend(entries.flatten().map(|e| e.path()).filter(|p| p.is_dir()));
    }
    let mut out = Vec::new();
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        let mut paths: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
        paths.sort();
        for path in paths {
            let name = path.to_string_lossy().into_owned();
            let data = if name.ends_with(".xz") {
                let mut v = Vec::new();
                let file = std::fs::File::open(&path).unwrap();
                if std::io::Read::read_to_end(&mut xz2::read::XzDecoder::new(file), &mut v).is_err() {
                    continue;
                }
                v
            } else if name.ends_with(".pickle") || name.ends_with(".pkl") {
                std::fs::read(&path).unwrap()
            } else {
                continue;
            };
            out.push((name, data));
        }
    }
    out
}

fn read(data: &[u8], sequential: bool) -> Result<Snapshot, String> {
    read_snapshot_with(data, ReadOptions { sequential, ..Default::default() }).map_err(|e| e.to_string())
}

/// Reads in pieces of odd sizes (so windows end anywhere).
struct Pieces<'a> {
    data: &'a [u8],
    step: usize,
}

impl std::io::Read for Pieces<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.step = (self.step * 7919 + 13) % 300_007;
        let n = buf.len().min(self.data.len()).min(self.step + 1);
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

/// Compared as text (a NaN read from a file is unequal to itself), with the reader's own
/// bookkeeping set aside.
fn same(what: &str, want: &Result<Snapshot, String>, got: Result<Snapshot, String>) -> u64 {
    match (want, got) {
        (Ok(a), Ok(mut b)) => {
            let parallel = b.source.parallel_bytes;
            b.source.peak_built_bytes = a.source.peak_built_bytes;
            b.source.parallel_bytes = a.source.parallel_bytes;
            b.source.parallel_windows = a.source.parallel_windows;
            assert!(format!("{a:?}") == format!("{b:?}"), "{what}: the parallel model differs from the sequential one");
            parallel
        }
        (Err(a), Err(b)) => {
            assert_eq!(a, &b, "{what}");
            0
        }
        (a, b) => panic!("{what}: sequential {:?}, parallel {:?}", a.as_ref().err(), b.err()),
    }
}

#[test]
fn parallel_reads_every_fixture_as_the_sequential_reader_does() {
    let files = fixtures();
    assert!(files.len() >= 140, "expected the bundled fixtures, found {}", files.len());
    let mut parallel_files = 0;
    let mut parallel_bytes = 0;
    for threads in [1, 2, 4] {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        pool.install(|| {
            for (name, data) in &files {
                let want = read(data, true);
                if let Ok(s) = &want {
                    assert_eq!(s.source.parallel_bytes, 0, "{name}: the sequential reader read in parallel");
                }
                let got = same(&format!("{name} ({threads} threads)"), &want, read(data, false));
                // Chunks of one frame: a boundary between every two frames.
                let small = read_snapshot_with(data, ReadOptions { chunk_bytes: 1, ..Default::default() });
                same(
                    &format!("{name} ({threads} threads, one frame per chunk)"),
                    &want,
                    small.map_err(|e| e.to_string()),
                );
                let opts = ReadOptions { size_hint: data.len() as u64, ..Default::default() };
                let streamed = read_snapshot_from(Pieces { data, step: 0 }, opts).map_err(|e| e.to_string());
                same(&format!("{name} ({threads} threads, streamed)"), &want, streamed);
                if threads == 1 && got > 0 {
                    parallel_files += 1;
                    parallel_bytes += got;
                }
            }
        });
    }
    // The framed snapshots written by Python: most of the bundled ones. A reader that never
    // took the parallel path would pass the comparisons above and test nothing.
    assert!(parallel_files >= 60, "only {parallel_files} files were read in parallel ({parallel_bytes} bytes)");
}

/// A summary read (no events kept) counts what a full read's events say: the same trace facts,
/// allocation addresses and devices, for every fixture, sequential or parallel.
#[test]
fn a_summary_read_counts_what_the_events_say() {
    let mut counted = 0;
    for (name, data) in fixtures() {
        let Ok(full) = read(&data, true) else { continue };
        for sequential in [true, false] {
            let opts = ReadOptions { events: false, sequential, ..Default::default() };
            let summary = match read_snapshot_with(&data, opts) {
                Ok(s) => s,
                Err(memsnap_model::ReadError::NeedsEvents { .. }) => continue,
                Err(e) => panic!("{name}: a summary read failed where a full one did not: {e}"),
            };
            assert_eq!(summary.trace_facts(), full.trace_facts(), "{name}");
            assert_eq!(summary.device_ids(), full.device_ids(), "{name}");
            assert_eq!(summary.device_totals(), full.device_totals(), "{name}");
            for (a, b) in summary.traces.iter().zip(&full.traces) {
                assert_eq!(a.alloc_addresses(), b.alloc_addresses(), "{name}");
                assert_eq!(a.entries(), b.entries(), "{name}");
                // The stacked events the analysis reads from the facts are the events' own.
                let stacked = b.events.iter().filter(|e| e.stack != memsnap_model::StackId::EMPTY).count() as u64;
                assert_eq!(a.facts().events_with_frames, stacked, "{name}");
                assert_eq!(b.facts().events_with_frames, stacked, "{name}");
                // Looking for addresses finds exactly the allocated ones: every allocation
                // address, interleaved with addresses just past them, which no block has.
                let allocated = b.alloc_addresses();
                let mut asked: Vec<u64> = allocated.iter().flat_map(|&x| [x, x.wrapping_add(1)]).collect();
                asked.sort_unstable();
                asked.dedup();
                let expected: Vec<bool> = asked.iter().map(|x| allocated.binary_search(x).is_ok()).collect();
                assert_eq!(b.allocates_any_of(&asked), expected, "{name}");
                assert_eq!(a.allocates_any_of(&asked), expected, "{name}");
            }
            assert_eq!(summary.source.events_with_frames, full.source.events_with_frames, "{name}");
            assert_eq!(summary.source.unknown_actions, full.source.unknown_actions, "{name}");
            let events: usize = summary.traces.iter().map(|t| t.events.len()).sum();
            let entries: u64 = full.traces.iter().map(|t| t.entries()).sum();
            if entries > 0 && events == 0 {
                counted += 1;
            }
        }
    }
    assert!(counted >= 100, "only {counted} reads counted a trace without keeping its events");
}

/// Batches the parallel decoder does not take (`frames` as tuples) cost it a one-batch probe,
/// not a scan of its window per batch; and where every other batch is such, the reader backs
/// off instead of scanning a window for each batch it can take. Both read as the sequential
/// reader reads them (the first test covers `fixtures/hostile`).
#[test]
fn batches_left_to_the_vm_do_not_cost_a_window_each() {
    let load = |name: &str| {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/hostile").join(name);
        let mut v = Vec::new();
        std::io::Read::read_to_end(&mut xz2::read::XzDecoder::new(std::fs::File::open(path).unwrap()), &mut v).unwrap();
        v
    };
    let all = read_snapshot_with(&load("ok_trace_tuple_frames.pickle.xz"), ReadOptions::default()).unwrap();
    assert_eq!(all.traces[0].events.len(), 200_000);
    assert_eq!((all.source.parallel_bytes, all.source.parallel_windows), (0, 0));

    let data = load("ok_trace_tuple_frames_every_other_batch.pickle.xz");
    let half = read_snapshot_with(&data, ReadOptions::default()).unwrap();
    assert_eq!(half.traces[0].events.len(), 200_000);
    // 100 batches it can take, each followed by one it cannot: without the back-off, 100
    // windows; with it (4 then 8 MiB of an 8 MB pickle left to the VM), a handful.
    assert!(half.source.parallel_bytes > 0, "the batches it can take were not read in parallel");
    assert!(
        half.source.parallel_windows <= 4,
        "{} windows scanned for {} bytes",
        half.source.parallel_windows,
        data.len()
    );
}

/// Memo fetches pointed elsewhere: each a copy of a real framed snapshot with one `BINGET` or
/// `LONG_BINGET` of its trace fetching a nearby memo entry instead (often of the wrong kind, or
/// one not memoized yet). Read in chunks of one frame, most such fetches land in a chunk that
/// decodes before its memo base is known, and are resolved after (`decode::fix_up`); the
/// parallel reader must give the sequential reader's model or error for every one.
#[test]
fn memo_fetches_pointed_elsewhere_read_as_the_sequential_reader_does() {
    use memsnap_pickle::scan;
    let files = fixtures();
    let picked: Vec<&(String, Vec<u8>)> =
        files.iter().filter(|(name, _)| name.contains("/dev/") && !name.contains("hostile")).take(3).collect();
    assert_eq!(picked.len(), 3, "expected the dev fixtures");
    let mut mutants = 0;
    let mut parallel = 0;
    for (name, data) in picked {
        // Fetches in the trace (the later part of a snapshot's bytes) of objects memoized
        // there too: those a chunk may find before its base is known.
        let mut trace = Vec::new();
        let (mut pos, mut memoized, mut trace_base) = (0, 0u32, None);
        while let Some(n) = scan::op_len(data, pos) {
            let op = data[pos];
            if pos > data.len() / 3 && trace_base.is_none() {
                trace_base = Some(memoized);
            }
            memoized += (op == scan::MEMOIZE) as u32;
            let g = match op {
                scan::BINGET => Some(data[pos + 1] as u32),
                scan::LONG_BINGET => Some(u32::from_le_bytes(data[pos + 1..pos + 5].try_into().unwrap())),
                _ => None,
            };
            if let (Some(g), Some(base)) = (g, trace_base) {
                if g >= base {
                    trace.push(pos);
                }
            }
            pos += n;
        }
        let step = (trace.len() / 300).max(1);
        for (k, &at) in trace.iter().step_by(step).enumerate() {
            let mut m = data.clone();
            if m[at] == scan::BINGET {
                let g = m[at + 1];
                m[at + 1] = [g.wrapping_add(1), g.wrapping_sub(1), g.wrapping_add(7)][k % 3];
            } else {
                let g = u32::from_le_bytes(m[at + 1..at + 5].try_into().unwrap());
                let to = [g.wrapping_add(1), g.wrapping_sub(1), g.wrapping_sub(5), g.wrapping_add(1000)][k % 4];
                m[at + 1..at + 5].copy_from_slice(&to.to_le_bytes());
            }
            let want = read(&m, true);
            let got = read_snapshot_with(&m, ReadOptions { chunk_bytes: 1, ..Default::default() });
            if same(&format!("{name} with the fetch at {at} changed"), &want, got.map_err(|e| e.to_string())) > 0 {
                parallel += 1;
            }
            mutants += 1;
        }
    }
    assert!(mutants >= 600, "only {mutants} mutants");
    assert!(parallel * 10 >= mutants, "only {parallel} of {mutants} mutants were read in parallel");
}
