//! The typed reader on real snapshots and on shapes other producers write: re-pickled copies
//! build the same model, legacy and odd shapes are understood, type errors name their key
//! path, and shared objects are never expanded without bound.
//!
//! Inputs: `fixtures/variants/` (made by `fixtures/gen/make_variants.py` from the real
//! `s12_cuda_graph` snapshot) and small pickles built here.

use std::collections::BTreeMap;
use std::path::PathBuf;

use memsnap_model::{read_snapshot, Action, BlockState, Producer, ReadError, Snapshot, StackId};
use serde_pickle::{HashableValue as HV, SerOptions, Value as PV};

fn variant_bytes(name: &str) -> Vec<u8> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/variants").join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn variant(name: &str) -> Snapshot {
    read_snapshot(&variant_bytes(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn base() -> Snapshot {
    variant("s12_p4.pickle")
}

/// Frames of a stack as `file:line name` strings (comparable across snapshots).
fn frames_text(s: &Snapshot, id: StackId) -> Vec<String> {
    s.stack_frames(id).map(|f| format!("{}:{} {}", s.str(f.filename), f.line, s.str(f.name))).collect()
}

fn error_of(bytes: &[u8]) -> String {
    match read_snapshot(bytes) {
        Ok(_) => panic!("accepted"),
        Err(e) => e.to_string(),
    }
}

// ------------------------------------------------------------------------------------------
// A real snapshot

#[test]
fn real_snapshot_is_read_completely() {
    let s = base();
    assert_eq!(s.source.protocol, 4);
    assert_eq!(s.source.producer, Producer::PythonPickler);
    assert_eq!(s.segments.len(), 9);
    assert_eq!(s.segments.iter().map(|g| g.blocks.len()).sum::<usize>(), 18);
    assert!(s.segments.iter().any(|g| g.is_private_pool()), "CUDA-graph private pool");
    // Blocks tile their segment.
    for g in &s.segments {
        assert_eq!(g.blocks.iter().map(|b| b.size).sum::<u64>(), g.total_size);
        assert_eq!(g.blocks[0].address, g.address);
        assert!(g.blocks.iter().all(|b| !b.address_derived));
    }
    assert_eq!(s.traces.len(), 1);
    let ev = &s.traces[0].events;
    assert_eq!(ev.len(), 61);
    assert!(ev.iter().all(|e| e.has_time()));
    assert_eq!(ev[0].action(), Action::SegmentAlloc);
    assert_eq!(ev[0].size, 2_097_152);
    let frames = frames_text(&s, ev[0].stack);
    assert_eq!(frames.len(), 7);
    assert!(frames[0].ends_with("torch/nn/modules/linear.py:134 forward"), "{frames:?}");
    assert_eq!(frames[6], "/workspace/lmtrain/s12_cuda_graph.py:16 <module>");
    // Stacks are interned: fewer distinct stacks than events that have one.
    let with_stack = ev.iter().filter(|e| e.stack != StackId::EMPTY).count();
    assert!(s.stacks.len() < with_stack, "{} stacks for {with_stack} events", s.stacks.len());
    assert_eq!(s.source.events_with_frames, with_stack as u64);
    assert!(s.source.unknown_keys.is_empty(), "{:?}", s.source.unknown_keys);
    assert_eq!(s.settings.max_split_size, None, "-1 means unlimited");
    assert_eq!(s.settings.roundup_power2_divisions.len(), 0, "all divisions are 0 in this file");
}

#[test]
fn every_protocol_builds_the_same_model() {
    let want = base();
    for (name, protocol) in [
        ("s12_p0.pickle", 0),
        ("s12_p1.pickle", 0),
        ("s12_p2.pickle", 2),
        ("s12_p3.pickle", 3),
        ("s12_p5.pickle", 5),
        ("s12_trailing_nul.pickle", 4),
    ] {
        let mut got = variant(name);
        assert_eq!(got.source.protocol, protocol, "{name}");
        got.source.protocol = want.source.protocol;
        got.source.producer = want.source.producer;
        // How much memory the reader's objects took depends on the encoding, not the content.
        got.source.peak_built_bytes = want.source.peak_built_bytes;
        assert!(got == want, "{name}: the model differs from the protocol-4 original");
    }
}

#[test]
fn invalid_utf8_filename_is_decoded_lossily() {
    let s = variant("s12_surrogate_filename.pickle");
    let frames = frames_text(&s, s.traces[0].events[0].stack);
    assert!(frames[0].contains("linear.py/bad\u{fffd}"), "{frames:?}");
    assert!(frames[0].ends_with("name.py:134 forward"), "{frames:?}");
    // Nothing else changed.
    let b = base();
    assert_eq!(s.segments, b.segments);
    assert_eq!(s.traces[0].events.len(), b.traces[0].events.len());
}

#[test]
fn block_addresses_are_derived_when_absent() {
    let b = base();
    let s = variant("s12_no_block_address.pickle");
    assert_eq!(s.source.derived_addresses, 18);
    for (gs, gb) in s.segments.iter().zip(&b.segments) {
        for (x, y) in gs.blocks.iter().zip(&gb.blocks) {
            assert!(x.address_derived);
            assert_eq!(x.address, y.address, "segment address + running sum of sizes");
            assert_eq!((x.size, x.state, x.requested_size), (y.size, y.state, y.requested_size));
        }
    }
}

#[test]
fn legacy_history_gives_requested_size_and_stack() {
    let b = base();
    let s = variant("s12_legacy_history.pickle");
    assert!(s.source.legacy_history);
    assert!(!s.source.has_trace_key);
    assert!(s.traces.is_empty());
    let mut checked = 0;
    for (gs, gb) in s.segments.iter().zip(&b.segments) {
        for (x, y) in gs.blocks.iter().zip(&gb.blocks) {
            assert_eq!((x.address, x.size, x.state), (y.address, y.size, y.state));
            if y.state != BlockState::Inactive {
                assert_eq!(x.requested_size, y.requested_size, "history[-1].real_size");
                assert_eq!(frames_text(&s, x.stack), frames_text(&b, y.stack), "history[-1].frames");
                checked += 1;
            } else {
                assert_eq!(x.requested_size, 0);
            }
        }
    }
    assert_eq!(checked, 13);
}

#[test]
fn bare_segment_list() {
    let s = variant("s12_bare_segments.pickle");
    assert!(s.source.bare_segment_list);
    assert_eq!(s.segments, base().segments);
}

#[test]
fn active_awaiting_free_is_pending_free() {
    let b = base();
    let s = variant("s12_awaiting_free.pickle");
    let pending: Vec<_> =
        s.segments.iter().flat_map(|g| &g.blocks).filter(|x| x.state == BlockState::PendingFree).collect();
    assert_eq!(pending.len(), 3);
    let (tb, ts) = (&b.device_totals()[0], &s.device_totals()[0]);
    assert_eq!(ts.allocated_bytes, tb.allocated_bytes - pending.iter().map(|x| x.size).sum::<u64>());
    assert_eq!(ts.active_bytes, tb.active_bytes);
    assert_eq!(ts.blocks_pending_free, 3);
}

#[test]
fn unknown_key_and_action_are_counted() {
    let s = variant("s12_unknown_key_action.pickle");
    assert_eq!(s.source.unknown_keys.get("memsnap_test_extension"), Some(&1));
    assert_eq!(s.source.unknown_actions.get("teleport"), Some(&1));
    let last = s.traces[0].events.last().unwrap();
    assert_eq!((last.action(), last.size), (Action::Other, 512));
    assert_eq!(s.traces[0].events.len(), 62);
}

// ------------------------------------------------------------------------------------------
// Small snapshots built here

fn st(x: &str) -> PV {
    PV::String(x.into())
}
fn int(x: i64) -> PV {
    PV::I64(x)
}
fn dict(items: Vec<(&str, PV)>) -> PV {
    PV::Dict(items.into_iter().map(|(k, v)| (HV::String(k.into()), v)).collect::<BTreeMap<_, _>>())
}
fn frame(line: i64) -> PV {
    dict(vec![("filename", st("train.py")), ("line", int(line)), ("name", st("step"))])
}
fn block(addr: i64, size: i64, state: &str) -> PV {
    dict(vec![
        ("address", int(addr)),
        ("size", int(size)),
        ("requested_size", int(size)),
        ("state", st(state)),
        ("frames", PV::List(vec![frame(1), frame(2)])),
    ])
}
fn segment(addr: i64, blocks: usize) -> PV {
    let blocks: Vec<PV> = (0..blocks).map(|i| block(addr + 512 * i as i64, 512, "active_allocated")).collect();
    dict(vec![
        ("device", int(0)),
        ("address", int(addr)),
        ("total_size", int(512 * blocks.len() as i64)),
        ("segment_type", st("small")),
        ("segment_pool_id", PV::Tuple(vec![int(0), int(0)])),
        ("is_expandable", PV::Bool(false)),
        ("frames", PV::List(vec![frame(3)])),
        ("blocks", PV::List(blocks)),
    ])
}
fn event(action: &str, addr: i64) -> PV {
    dict(vec![
        ("action", st(action)),
        ("addr", int(addr)),
        ("size", int(500)),
        ("stream", int(0)),
        ("time_us", int(1_700_000_000_000_000 + addr)),
        ("frames", PV::List(vec![frame(4)])),
        ("compile_context", st("N/A")),
        ("user_metadata", st("")),
    ])
}

/// segments[0..3] of 1 block, segments[3] of 18 blocks; a trace of 6 events; settings; 2
/// annotations. `edit` changes it before it is pickled (protocol 3, by serde_pickle).
fn small(edit: impl FnOnce(&mut BTreeMap<HV, PV>)) -> Vec<u8> {
    let PV::Dict(mut top) = dict(vec![
        ("segments", PV::List((0..4).map(|i| segment((1 << 30) | (i << 22), if i == 3 { 18 } else { 1 })).collect())),
        ("device_traces", PV::List(vec![PV::List((0..6).map(|i| event("alloc", (1 << 30) | (i * 512))).collect())])),
        ("allocator_settings", dict(vec![("max_split_size", int(-1)), ("PYTORCH_CUDA_ALLOC_CONF", st(""))])),
        (
            "external_annotations",
            PV::List(vec![
                dict(vec![("name", st("fwd")), ("stage", st("START")), ("device", int(0)), ("time_us", int(1))]),
                dict(vec![("name", st("fwd")), ("stage", st("END")), ("device", int(0)), ("time_us", int(2))]),
            ]),
        ),
    ]) else {
        unreachable!()
    };
    edit(&mut top);
    serde_pickle::value_to_vec(&PV::Dict(top), SerOptions::new()).unwrap()
}

fn get<'a>(top: &'a mut BTreeMap<HV, PV>, key: &str) -> &'a mut PV {
    top.get_mut(&HV::String(key.into())).unwrap()
}
fn at(v: &mut PV, i: usize) -> &mut PV {
    match v {
        PV::List(l) | PV::Tuple(l) => &mut l[i],
        other => panic!("not a sequence: {other:?}"),
    }
}
fn set(v: &mut PV, key: &str, val: PV) {
    let PV::Dict(d) = v else { panic!("not a dict") };
    d.insert(HV::String(key.into()), val);
}
fn field<'a>(v: &'a mut PV, key: &str) -> &'a mut PV {
    let PV::Dict(d) = v else { panic!("not a dict") };
    d.get_mut(&HV::String(key.into())).unwrap()
}

#[test]
fn small_snapshot_reads() {
    let s = read_snapshot(&small(|_| {})).unwrap();
    assert_eq!(s.segments.len(), 4);
    assert_eq!(s.segments[3].blocks.len(), 18);
    assert_eq!(s.traces[0].events.len(), 6);
    assert_eq!(s.annotations.len(), 2);
    assert!(!s.annotations[1].start);
    // All blocks share one stack, all segments another: interned once each.
    let b0 = s.segments[0].blocks[0].stack;
    assert!(s.segments.iter().flat_map(|g| &g.blocks).all(|b| b.stack == b0));
    assert_eq!(frames_text(&s, b0), ["train.py:1 step", "train.py:2 step"]);
    assert_eq!(frames_text(&s, s.segments[2].stack), ["train.py:3 step"]);
}

#[test]
fn type_errors_name_the_key_path() {
    type Edit = Box<dyn FnOnce(&mut BTreeMap<HV, PV>)>;
    let cases: Vec<(Edit, &str)> = vec![
        (
            Box::new(|t| set(at(field(at(get(t, "segments"), 3), "blocks"), 17), "size", st("1024"))),
            "segments[3].blocks[17].size: expected int, found str \"1024\"",
        ),
        (
            Box::new(|t| set(at(get(t, "segments"), 2), "address", PV::F64(1.5))),
            "segments[2].address: expected int, found float 1.5",
        ),
        (
            Box::new(|t| set(at(at(get(t, "device_traces"), 0), 5), "addr", PV::None)),
            "device_traces[0][5].addr: expected int, found None",
        ),
        (
            Box::new(|t| set(at(at(get(t, "device_traces"), 0), 4), "frames", int(3))),
            "device_traces[0][4].frames: expected list of frames, found int 3",
        ),
        (
            Box::new(|t| set(at(field(at(get(t, "segments"), 1), "frames"), 0), "line", st("7"))),
            "segments[1].frames[0].line: expected int, found str \"7\"",
        ),
        (
            Box::new(|t| *at(field(at(field(at(get(t, "segments"), 0), "blocks"), 0), "frames"), 1) = int(9)),
            "segments[0].blocks[0].frames[1]: expected frame dict, found int 9",
        ),
        (
            Box::new(|t| set(get(t, "allocator_settings"), "max_split_size", st("big"))),
            "allocator_settings.max_split_size: expected int, found str \"big\"",
        ),
        (
            Box::new(|t| set(at(get(t, "external_annotations"), 1), "time_us", st("soon"))),
            "external_annotations[1].time_us: expected int, found str \"soon\"",
        ),
        (Box::new(|t| *get(t, "segments") = int(4)), "segments: expected a list, found int 4"),
        (Box::new(|t| *at(get(t, "segments"), 1) = PV::None), "segments[1]: expected a dict, found None"),
        (
            Box::new(|t| set(at(get(t, "segments"), 0), "total_size", int(-1))),
            "segments[0].total_size: expected a non-negative int below 2^64, found int -1",
        ),
    ];
    for (edit, want) in cases {
        let msg = error_of(&small(edit));
        assert_eq!(msg, want);
    }
}

#[test]
fn legacy_history_errors_name_the_history_entry() {
    let bytes = small(|t| {
        let b = at(field(at(get(t, "segments"), 0), "blocks"), 0);
        let PV::Dict(d) = b else { panic!() };
        d.remove(&HV::String("frames".into()));
        d.remove(&HV::String("requested_size".into()));
        set(
            b,
            "history",
            PV::List(vec![dict(vec![("addr", int(0)), ("real_size", st("x")), ("frames", PV::List(vec![]))])]),
        );
    });
    assert_eq!(error_of(&bytes), "segments[0].blocks[0].history[0].real_size: expected int, found str \"x\"");
    let bytes = small(|t| {
        let b = at(field(at(get(t, "segments"), 0), "blocks"), 0);
        set(b, "history", PV::List(vec![dict(vec![("real_size", int(1)), ("frames", PV::List(vec![int(1)]))])]));
        let PV::Dict(d) = b else { panic!() };
        d.remove(&HV::String("frames".into()));
    });
    assert_eq!(error_of(&bytes), "segments[0].blocks[0].history[0].frames[0]: expected frame dict, found int 1");
}

#[test]
fn not_a_snapshot() {
    assert!(error_of(b"").contains("empty file"));
    assert!(error_of(b"{\"segments\": []}").contains("looks like JSON"));
    assert!(
        error_of(b"\x80\x04K\x05.").starts_with("$: expected a dict (or a list of segments) at the top, found int 5")
    );
    match read_snapshot(b"\x80\x04\x8c\x02os\x8c\x06system\x93.") {
        Err(ReadError::Pickle(e)) => {
            assert_eq!((e.offset, e.opcode), (14, Some(0x93)));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn addresses_up_to_2_pow_64() {
    // 9-byte LONG1 values (2^63 and above) appear in old files; 2^64 is out of range.
    let bytes = small(|t| {
        let big = serde_pickle::value_from_slice(
            b"\x80\x02\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x80\x00.",
            Default::default(),
        )
        .unwrap();
        set(at(get(t, "segments"), 0), "address", big);
    });
    let s = read_snapshot(&bytes).unwrap();
    assert_eq!(s.segments[0].address, 1u64 << 63);
    let bytes = small(|t| {
        let big = serde_pickle::value_from_slice(
            b"\x80\x02\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00\x01.",
            Default::default(),
        )
        .unwrap();
        set(at(get(t, "segments"), 0), "address", big);
    });
    assert_eq!(
        error_of(&bytes),
        "segments[0].address: expected a non-negative int below 2^64, found int 18446744073709551616"
    );
}

// ------------------------------------------------------------------------------------------
// Hand-written pickles with memo sharing (serde_pickle never shares)

/// `{"segments": [seg] * k}` where `seg = {"device": 0, "blocks": [blk] * k}`: k² blocks if
/// expanded, from O(k) bytes.
fn shared_blocks(k: usize) -> Vec<u8> {
    let mut b = b"\x80\x02}(\x8c\x08segments](".to_vec();
    b.extend_from_slice(b"}q\x01(\x8c\x06deviceK\x00\x8c\x06blocks](");
    b.extend_from_slice(b"}q\x02(\x8c\x04sizeM\x00\x02\x8c\x05state\x8c\x10active_allocatedu");
    for _ in 1..k {
        b.extend_from_slice(b"h\x02");
    }
    b.extend_from_slice(b"eu");
    for _ in 1..k {
        b.extend_from_slice(b"h\x01");
    }
    b.extend_from_slice(b"eu.");
    b
}

#[test]
fn shared_objects_are_read_within_a_budget() {
    // Modest sharing is a valid (if unusual) snapshot: 100 × 100 blocks.
    let s = read_snapshot(&shared_blocks(100)).unwrap();
    assert_eq!(s.segments.len(), 100);
    assert_eq!(s.device_totals()[0].blocks_allocated, 10_000);
    // 3000 × 3000 would be 9 M blocks from 12 KB: refused with the place it happened.
    let msg = error_of(&shared_blocks(3000));
    assert!(msg.starts_with("segments["), "{msg}");
    assert!(msg.contains("objects shared too many times"), "{msg}");
}

#[test]
fn shared_trace_list_is_copied_within_the_budget() {
    // device_traces = [L, L]: the same compacted list for two devices.
    let ev = |addr: u8| {
        let mut e = b"}(\x8c\x06action\x8c\x05alloc\x8c\x04addrK".to_vec();
        e.push(addr);
        e.extend_from_slice(b"\x8c\x04sizeK\x10u");
        e
    };
    let mut b = b"\x80\x02}(\x8c\x0ddevice_traces](](".to_vec();
    b.extend(ev(1));
    b.extend(ev(2));
    b.extend_from_slice(b"eq\x01h\x01eu.");
    let s = read_snapshot(&b).unwrap();
    assert_eq!(s.traces.len(), 2);
    assert_eq!(s.traces[0].events, s.traces[1].events);
    assert_eq!(s.traces[1].events.iter().map(|e| e.addr).collect::<Vec<_>>(), [1, 2]);
}

#[test]
fn shared_event_dicts_are_read_as_events() {
    // The same event dict twice in a trace (memo-shared, so not compacted while reading).
    let b = b"\x80\x02}(\x8c\x0ddevice_traces]](}q\x01(\x8c\x06action\x8c\x04free\x8c\x04addrK\x07uh\x01eau.";
    let s = read_snapshot(b).unwrap();
    let ev = &s.traces[0].events;
    assert_eq!(ev.len(), 2);
    assert_eq!(ev[0], ev[1]);
    assert_eq!((ev[0].action(), ev[0].addr), (Action::Other, 7));
    assert_eq!(s.source.unknown_actions.get("free"), Some(&2));
}

#[test]
fn frames_tuple_shared_by_blocks_is_one_stack() {
    // frames given as a tuple (some writers), shared by every block.
    let mut b = b"\x80\x02}(\x8c\x08segments](}(\x8c\x06blocks](".to_vec();
    b.extend_from_slice(b"}(\x8c\x04sizeM\x00\x02\x8c\x05state\x8c\x10active_allocated\x8c\x06frames");
    b.extend_from_slice(b"}(\x8c\x08filename\x8c\x01a\x8c\x04lineK\x05\x8c\x04name\x8c\x01fu\x85q\x09u");
    for _ in 0..50 {
        b.extend_from_slice(b"}(\x8c\x04sizeM\x00\x02\x8c\x05state\x8c\x10active_allocated\x8c\x06framesh\x09u");
    }
    b.extend_from_slice(b"eueu.");
    let s = read_snapshot(&b).unwrap();
    let blocks = &s.segments[0].blocks;
    assert_eq!(blocks.len(), 51);
    assert!(blocks.iter().all(|x| x.stack == blocks[0].stack && x.stack != StackId::EMPTY));
    assert_eq!(frames_text(&s, blocks[0].stack), ["a:5 f"]);
}

#[test]
fn duplicate_device_traces_key_last_wins() {
    // Regression (found while hardening): a dict with `device_traces` twice, the second list
    // holding an already-compacted entry, indexed an emptied buffer and panicked. Now the last
    // key wins, as when Python loads the dict.
    let e1 = b"}\x94(\x8c\x06action\x94\x8c\x05alloc\x94\x8c\x04addr\x94K\x10u";
    let mut b = b"\x80\x04}(\x8c\x0ddevice_traces\x94]]".to_vec();
    b.extend_from_slice(e1);
    b.extend_from_slice(b"aa");
    b.extend_from_slice(b"h\x00]]}\x94(h\x02h\x03h\x04K\x20u0h\x05ah\x01aau.");
    let s = read_snapshot(&b).unwrap();
    let addrs: Vec<u64> = s.traces[0].events.iter().map(|e| e.addr).collect();
    assert_eq!(addrs, [0x20, 0x10]);
}

/// Hands out the bytes in small, varying pieces (a fixed sequence, so runs are repeatable), as
/// pipes and decompressors do: every refill path of the reader's window is crossed.
struct Pieces<'a> {
    data: &'a [u8],
    step: usize,
}

impl std::io::Read for Pieces<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.step = (self.step * 7 + 3) % 4099;
        let n = buf.len().min(self.data.len()).min(self.step + 1);
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

/// The in-memory reader (the reference) and the streamed one (what every CLI input takes) must
/// give the same model or the same error. Compared as text: a NaN read from a file is unequal
/// to itself.
fn assert_stream_agrees(what: &str, data: &[u8]) {
    let in_memory = read_snapshot(data);
    let opts = memsnap_model::ReadOptions { size_hint: data.len() as u64, ..Default::default() };
    let streamed = memsnap_model::read_snapshot_from(Pieces { data, step: 0 }, opts);
    match (in_memory, streamed) {
        (Ok(a), Ok(mut b)) => {
            b.source.peak_built_bytes = a.source.peak_built_bytes;
            assert_eq!(format!("{a:?}"), format!("{b:?}"), "{what}: the streamed model differs");
        }
        (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string(), "{what}"),
        (a, b) => panic!("{what}: in memory {:?}, streamed {:?}", a.err(), b.err()),
    }
}

#[test]
fn a_stream_reads_every_fixture_as_memory_does() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures");
    let mut n = 0;
    for dir in ["dev", "extra", "extra2", "extra3", "extra4", "variants", "multi", "hostile"] {
        let Ok(entries) = std::fs::read_dir(root.join(dir)) else { continue };
        for e in entries.flatten() {
            let path = e.path();
            let name = path.to_string_lossy().into_owned();
            let data = if name.ends_with(".xz") {
                let mut v = Vec::new();
                let file = std::fs::File::open(&path).unwrap();
                if std::io::Read::read_to_end(&mut xz2::read::XzDecoder::new(file), &mut v).is_err() {
                    continue; // a truncated stream: the CLI tests cover it
                }
                v
            } else if name.ends_with(".pickle") || name.ends_with(".pkl") {
                std::fs::read(&path).unwrap()
            } else {
                continue;
            };
            assert_stream_agrees(&name, &data);
            n += 1;
        }
    }
    assert!(n >= 140, "expected the bundled fixtures, read {n}");
}

#[test]
fn fuzz_findings_read_the_same_streamed() {
    // Zero bytes, then others: both readers judge the same first 8 bytes.
    let mut zeros = vec![0u8; 40];
    zeros.extend_from_slice(b"\x80\x04N.");
    assert_stream_agrees("zeros first", &zeros);
    let e = read_snapshot(&zeros).unwrap_err().to_string();
    assert!(e.contains("(starts with zero bytes)"), "{e}");
    // A NaN in the settings: the models agree though NaN != NaN.
    let nan = small(|top| {
        top.insert(
            HV::String("allocator_settings".into()),
            dict(vec![("garbage_collection_threshold", PV::F64(f64::NAN))]),
        );
    });
    assert_stream_agrees("NaN setting", &nan);
}

#[test]
fn counts_read_as_words() {
    assert_eq!(memsnap_model::count_of(1, "block"), "1 block");
    assert_eq!(memsnap_model::count_of(0, "block"), "0 blocks");
    assert_eq!(memsnap_model::count_of(12, "event"), "12 events");
}

/// Keys and actions of the newest releases (docs/format.md, "Keys by PyTorch release") are
/// read as known: `annotate` is its own action, and `pool_id`, `internal_metadata`,
/// `category` and `forward_frames` are read past without being counted as unknown.
#[test]
fn newest_keys_and_actions_are_known() {
    let data = small(|top| {
        let trace = at(get(top, "device_traces"), 0);
        let PV::List(events) = trace else { unreachable!() };
        set(&mut events[1], "pool_id", PV::Tuple(vec![int(0), int(1)]));
        set(&mut events[2], "internal_metadata", st("x"));
        set(&mut events[3], "category", st("ACTIVATION"));
        set(&mut events[4], "forward_frames", PV::List(vec![frame(9)]));
        let mut note = event("annotate", 1 << 30);
        set(&mut note, "user_metadata", st("kv-cache"));
        events.push(note);
    });
    let s = read_snapshot(&data).unwrap();
    assert!(s.source.unknown_keys.is_empty(), "{:?}", s.source.unknown_keys);
    assert!(s.source.unknown_actions.is_empty(), "{:?}", s.source.unknown_actions);
    let last = s.traces[0].events.last().unwrap();
    assert_eq!(last.action(), Action::Annotate);
    assert_eq!(s.str(s.context(last).user_metadata), "kv-cache");
}

/// `trace_alloc_overflowed` / `trace_alloc_max_entries` (proposed in PyTorch PR #179276) say
/// why a trace starts mid-run when the file has them; without them both causes are named.
#[test]
fn ring_overflow_flag_is_read() {
    let plain = read_snapshot(&small(|_| {})).unwrap();
    assert_eq!((plain.settings.trace_overflowed, plain.settings.trace_max_entries), (None, None));
    assert_eq!(plain.mid_run_cause(), "ring buffer wrapped or recording started late");
    let flagged = |overflowed: bool| {
        read_snapshot(&small(|top| {
            let s = get(top, "allocator_settings");
            set(s, "trace_alloc_overflowed", PV::Bool(overflowed));
            set(s, "trace_alloc_max_entries", int(200));
        }))
        .unwrap()
    };
    let wrapped = flagged(true);
    assert_eq!((wrapped.settings.trace_overflowed, wrapped.settings.trace_max_entries), (Some(true), Some(200)));
    assert_eq!(
        wrapped.mid_run_cause(),
        "the ring buffer of 200 entries wrapped: allocator_settings.trace_alloc_overflowed"
    );
    assert!(flagged(false).mid_run_cause().starts_with("recording started late"));
}

/// The device type, from what each producer's C++ writes (crates/memsnap-model/src/device_type.rs).
#[test]
fn device_type_where_the_file_says_it() {
    use memsnap_model::DeviceType;
    let kind = |data: Vec<u8>| read_snapshot(&data).unwrap().device_type().map(|d| d.device_type);
    assert_eq!(kind(small(|_| {})), Some(DeviceType::Cuda));
    // torch.xpu's settings: PYTORCH_ALLOC_CONF and expandable_segments only.
    let xpu = small(|top| {
        top.insert(
            HV::String("allocator_settings".into()),
            dict(vec![("PYTORCH_ALLOC_CONF", st("")), ("expandable_segments", PV::Bool(false))]),
        );
    });
    assert_eq!(kind(xpu), Some(DeviceType::Xpu));
    let npu = small(|top| {
        let PV::List(events) = at(get(top, "device_traces"), 0) else { unreachable!() };
        events.push(event("workspace_snapshot", 0));
    });
    assert_eq!(kind(npu), Some(DeviceType::Npu));
    let silent = small(|top| {
        top.remove(&HV::String("allocator_settings".into()));
    });
    assert_eq!(kind(silent), None);
}
