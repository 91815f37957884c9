//! Arbitrary bytes into the snapshot reader: it may reject them, it must never panic, hang or
//! allocate without bound. Both layers are exercised: the generic pickle VM (`parse_simple`,
//! no compaction) and the typed reader (`read_snapshot`, with trace compaction).
//!
//! Differential: the same bytes read as a stream (`read_snapshot_from`, a reader that hands
//! out a few bytes per call, the window path every CLI input takes) must give the same model
//! or the same error as the in-memory reader, which is the reference.
#![no_main]

use std::io::Read;

use libfuzzer_sys::fuzz_target;
use memsnap_model::{read_snapshot_from, ReadOptions};

/// A reader that returns at most 7 bytes per call, to cross window refills everywhere.
struct Trickle<'a>(&'a [u8]);

impl Read for Trickle<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = buf.len().min(self.0.len()).min(7);
        buf[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        Ok(n)
    }
}

fuzz_target!(|data: &[u8]| {
    let _ = memsnap_pickle::parse_simple(data);
    let in_memory = memsnap_model::read_snapshot(data);
    let opts = ReadOptions { size_hint: data.len() as u64, ..ReadOptions::default() };
    let streamed = read_snapshot_from(Trickle(data), opts);
    match (&in_memory, &streamed) {
        (Ok(a), Ok(b)) => {
            let mut b = b.clone();
            b.source.peak_built_bytes = a.source.peak_built_bytes;
            // Compared as text: a NaN from the file (a float setting) is unequal to itself.
            assert_eq!(format!("{a:?}"), format!("{b:?}"), "the streamed model differs from the in-memory one");
        }
        (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string()),
        (a, b) => panic!("in memory {:?}, streamed {:?}", a.as_ref().err(), b.as_ref().err()),
    }
    if let Ok(snap) = in_memory {
        // Touch the derived views too: they must not panic on odd but accepted content.
        let _ = snap.device_totals();
        let _ = snap.trace_facts();
    }
});
