//! Arbitrary bytes into the snapshot reader: it may reject them, it must never panic, hang or
//! allocate without bound. Both layers are exercised: the generic pickle VM (`parse_simple`,
//! no compaction) and the typed reader (`read_snapshot`, with trace compaction).
//!
//! Differential: the sequential in-memory reader (`ReadOptions::sequential`, the VM alone) is
//! the reference. The parallel trace reader in memory (with a chunk boundary at every frame),
//! the same bytes read as a stream (`read_snapshot_from`, a reader that hands out a few bytes
//! per call, the window path every CLI input takes), must give the same model or the same
//! error; a summary read (no events kept) must count what the reference's events say.
#![no_main]


use libfuzzer_sys::fuzz_target;
use memsnap_model::{read_snapshot_from, ReadOptions};

/// A reader that returns at most 7 bytes per call, to cross window refills everywhere.
struct Trickle<'a>(&'a [u8]);

impl std::io::Read for Trickle<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = buf.len().min(self.0.len()).min(7);
        buf[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        Ok(n)
    }
}

type Read = Result<memsnap_model::Snapshot, memsnap_model::ReadError>;

fn agree(what: &str, reference: &Read, other: &Read) {
    match (reference, other) {
        (Ok(a), Ok(b)) => {
            let mut b = b.clone();
            b.source.peak_built_bytes = a.source.peak_built_bytes;
            b.source.parallel_bytes = a.source.parallel_bytes;
            // Compared as text: a NaN from the file (a float setting) is unequal to itself.
            assert_eq!(format!("{a:?}"), format!("{b:?}"), "the {what} model differs from the reference");
        }
        (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string(), "{what}"),
        (a, b) => panic!("reference {:?}, {what} {:?}", a.as_ref().err(), b.as_ref().err()),
    }
}

fuzz_target!(|data: &[u8]| {
    let _ = memsnap_pickle::parse_simple(data);
    let reference = memsnap_model::read_snapshot_with(data, ReadOptions { sequential: true, ..Default::default() });
    let parallel = memsnap_model::read_snapshot_with(data, ReadOptions { chunk_bytes: 1, ..Default::default() });
    agree("parallel", &reference, &parallel);
    let opts = ReadOptions { size_hint: data.len() as u64, ..ReadOptions::default() };
    let streamed = read_snapshot_from(Trickle(data), opts);
    agree("streamed", &reference, &streamed);
    if let Ok(full) = &reference {
        match memsnap_model::read_snapshot_with(data, ReadOptions { events: false, ..Default::default() }) {
            Ok(counted) => assert_eq!(format!("{:?}", counted.trace_facts()), format!("{:?}", full.trace_facts())),
            Err(memsnap_model::ReadError::NeedsEvents { .. }) => {}
            Err(e) => panic!("a summary read failed where a full one did not: {e}"),
        }
    }
    let in_memory = reference;
    if let Ok(snap) = in_memory {
        // Touch the derived views too: they must not panic on odd but accepted content.
        let _ = snap.device_totals();
        let _ = snap.trace_facts();
    }
});
