//! Arbitrary bytes into the snapshot reader: it may reject them, it must never panic, hang or
//! allocate without bound. Both layers are exercised: the generic pickle VM (`parse_simple`,
//! no compaction) and the typed reader (`read_snapshot`, with trace compaction).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = memsnap_pickle::parse_simple(data);
    if let Ok(snap) = memsnap_model::read_snapshot(data) {
        // Touch the derived views too: they must not panic on odd but accepted content.
        let _ = snap.device_totals();
        let _ = snap.trace_facts();
    }
});
