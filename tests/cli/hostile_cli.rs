//! The hostile corpus (`fixtures/hostile/`, made by `fixtures/gen/make_hostile.py`): every file
//! is refused with exit code 2 and one line on stderr that says what is wrong and where (a byte
//! offset and opcode, or a key path), never a panic, never a hang, and nothing in a file runs.

use crate::common;

use common::{files_in, fixture, memsnap, memsnap_in, Run};

/// Expected message fragment of every hostile file whose name does not carry it.
const EXPECTED: &[(&str, &str)] = &[
    ("empty.pickle", "input: empty file (0 bytes)"),
    ("empty.pickle.gz", "input: empty file (0 bytes)"),
    ("json_text.pickle", "byte 0: not a pickle: first byte 0x7b is no pickle opcode (looks like JSON)"),
    // A zip whose first entry is not a torch.save `data.pkl` (fixtures/formats has a real one).
    (
        "torch_save_zip.pt",
        "byte 30: a zip archive whose first entry is not data.pkl: not a snapshot saved with torch.save",
    ),
    ("truncated_stream.pickle.xz", "xz decompression failed"),
    // Numbers no snapshot holds: refused where read, never wrapped or clamped.
    (
        "range_size_2p63.pickle",
        "segments[0].total_size: expected a size of at most 2^48 bytes (256 TiB), found int 9223372036854775808",
    ),
    (
        "range_device_2p64.pickle",
        "segments[0].device: expected a device index from 0 to 2^32 - 1, found int 18446744073709551615",
    ),
    (
        "range_time_min.pickle",
        "device_traces[0][2].time_us: expected a time above -2^63 microseconds, found int -9223372036854775808",
    ),
    // A memo fetch of an earlier entry's object where a trace entry needs a list or a string
    // (the parallel reader's merge checks these; crates/memsnap-model/tests/suite/parallel.rs).
    (
        "trace_frames_fetch_string.pickle.xz",
        "device_traces[0][2500].frames: expected list of frames, found str \"ctx1000\"",
    ),
    ("trace_action_fetch_list.pickle.xz", "device_traces[0][2500].action: expected str, found list"),
    // Bombs: refused by the decompression budget, the object budget and the string cap.
    (
        "bomb_tiny_opcodes_1g.pickle.xz",
        // (the byte counts depend on how the decoder buffers, so only the words are matched)
        "xz stream expands to more than",
    ),
    ("bomb_empty_dicts_30m.pickle.xz", "(opcode EMPTY_DICT 0x7d): the objects built from"),
    (
        "bomb_long_string_claim.pickle.xz",
        "pickle error at byte 2 (opcode BINUNICODE 0x58): a string of 3000000000 bytes, longer than any snapshot holds",
    ),
    // Code execution attempts: refused at the opcode, before anything could be imported.
    // Protocol 0 starts with any opcode: the refusal names it.
    (
        "os_system_global_reduce.pickle",
        "pickle error at byte 0 (opcode GLOBAL 0x63): refusing opcode GLOBAL: it would import or call code",
    ),
    ("os_system_in_p0_dict.pickle", "pickle error at byte 18 (opcode GLOBAL 0x63): refusing opcode GLOBAL"),
    ("os_system_proto2.pickle", "pickle error at byte 2 (opcode GLOBAL 0x63): refusing opcode GLOBAL"),
    (
        "os_system_stack_global.pickle",
        "pickle error at byte 28 (opcode STACK_GLOBAL 0x93): refusing opcode STACK_GLOBAL",
    ),
    ("os_system_inside_snapshot.pickle", "pickle error at byte 2285 (opcode STACK_GLOBAL 0x93)"),
    ("inst_os_system.pickle", "pickle error at byte 29 (opcode INST 0x69): refusing opcode INST"),
    ("persid.pickle", "pickle error at byte 2 (opcode PERSID 0x50): refusing opcode PERSID"),
    ("build_state.pickle", "pickle error at byte 5 (opcode BUILD 0x62): refusing opcode BUILD"),
    // A DAG, not a tree: 2^40 leaves if expanded; the reader only finds it is not a snapshot.
    ("memo_bomb_40.pickle", "$[0]: expected a dict, found list"),
    ("deep_marks_200k.pickle.xz", "pickle error at byte 10002 (opcode MARK 0x28): nesting deeper than 10000 levels"),
    ("deep_lists_200k.pickle.xz", "$[0]: expected a dict, found list"),
    ("deep_tuples_200k.pickle.xz", "$: expected a dict (or a list of segments) at the top, found tuple"),
    ("deep_dicts_200k.pickle.xz", "segments: expected a list, found dict"),
    // Length fields far beyond the input.
    (
        "binunicode8_len_2p62.pickle",
        "pickle error at byte 2 (opcode BINUNICODE8 0x8d): truncated: needs 4611686018427387904 more bytes, 17 left",
    ),
    (
        "binbytes8_len_2p62.pickle",
        "pickle error at byte 2 (opcode BINBYTES8 0x8e): truncated: needs 4611686018427387904 more bytes, 17 left",
    ),
    (
        "frame_len_2p62.pickle",
        "pickle error at byte 2 (opcode FRAME 0x95): truncated: needs 4611686018427387904 more bytes",
    ),
    (
        "binunicode_len_4g.pickle",
        "pickle error at byte 2 (opcode BINUNICODE 0x58): truncated: needs 4294967295 more bytes",
    ),
    ("long4_len_2g.pickle", "pickle error at byte 2 (opcode LONG4 0x8b): truncated: needs 2147483647 more bytes"),
    ("long4_len_negative.pickle", "pickle error at byte 2 (opcode LONG4 0x8b): negative length -1"),
    (
        "long4_1000_bytes.pickle",
        "pickle error at byte 2 (opcode LONG4 0x8b): integer of 1000 bytes is wider than 128 bits",
    ),
    (
        "long1_255_bytes.pickle",
        "pickle error at byte 2 (opcode LONG1 0x8a): integer of 255 bytes is wider than 128 bits",
    ),
    ("memo_get_missing.pickle", "pickle error at byte 3 (opcode BINGET 0x68): memo key 7 was never stored"),
    ("memo_put_2p32.pickle", "pickle error at byte 3 (opcode LONG_BINPUT 0x72)"),
    ("protocol_6.pickle", "pickle error at byte 0 (opcode PROTO 0x80): unsupported pickle protocol 6"),
    // A right pickle with the wrong content: the key path.
    ("wrongtype_block_size_str.pickle", "segments[3].blocks[17].size: expected int, found str \"1048576\""),
    ("wrongtype_trace_addr_str.pickle", "device_traces[0][5].addr: expected int, found str \"0x7f00\""),
    ("wrongtype_trace_no_action.pickle", "device_traces[0][3].action: expected str, found nothing (key missing)"),
    ("wrongtype_segments_dict.pickle", "segments: expected a list, found dict"),
    ("wrongtype_block_state.pickle", "segments[2].blocks[0].state: unknown block state \"zombie\""),
    (
        "wrongtype_total_size_negative.pickle",
        "segments[4].total_size: expected a non-negative int below 2^64, found int -2097152",
    ),
    ("wrongtype_total_size_float.pickle", "segments[0].total_size: expected int, found float"),
    ("wrongtype_frame_line_str.pickle", "segments[1].blocks[2].frames[4].line: expected int, found str \"134\""),
    ("wrongtype_max_split_size_str.pickle", "allocator_settings.max_split_size: expected int, found str \"inf\""),
    ("wrongtype_annotation_time.pickle", "external_annotations[1].time_us: expected int, found str \"later\""),
    ("wrongtype_root_int.pickle", "$: expected a dict (or a list of segments) at the top, found int 42"),
    ("wrongtype_root_none_p0.pickle", "$: expected a dict (or a list of segments) at the top, found None"),
    // One object referenced K times, each holding K items: refused before K² work.
    ("shared_blocks_quadratic.pickle.xz", "objects shared too many times"),
    ("shared_trace_quadratic.pickle.xz", "objects shared too many times"),
];

fn hostile_files() -> Vec<std::path::PathBuf> {
    files_in(&fixture("hostile"), |n| n != "README.md" && !n.starts_with("ok_"))
}

/// The number in `name` after `prefix` (e.g. `bitflip_at_1435.pickle` → 1435).
fn number_after(name: &str, prefix: &str) -> Option<usize> {
    let rest = name.strip_prefix(prefix)?;
    rest.split('.').next()?.parse().ok()
}

/// The byte offset an error message names (`pickle error at byte N`).
fn error_offset(msg: &str) -> Option<usize> {
    let rest = &msg[msg.find("pickle error at byte ")? + "pickle error at byte ".len()..];
    rest.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

/// Checks common to every refusal; returns the message after `memsnap: error: PATH: `.
fn assert_refused(name: &str, run: &Run) -> String {
    assert!(!run.stderr.contains("panicked"), "{name}: panic: {}", run.stderr);
    assert_eq!(run.code, Some(2), "{name}: exit code {:?}, stderr {:?}", run.code, run.stderr);
    assert!(run.stdout.is_empty(), "{name}: printed to stdout: {:?}", run.stdout);
    let line = run.stderr.strip_suffix('\n').unwrap_or(&run.stderr);
    assert!(!line.contains('\n'), "{name}: more than one line on stderr: {:?}", run.stderr);
    assert!(line.starts_with("memsnap: error: "), "{name}: {line:?}");
    line.to_string()
}

#[test]
fn every_hostile_file_is_refused_with_a_located_message() {
    let files = hostile_files();
    assert!(files.len() >= 50, "hostile corpus missing? {} files", files.len());
    let mut failures = Vec::new();
    for path in &files {
        let name = path.file_name().unwrap().to_str().unwrap();
        let run = memsnap(&["summary", path.to_str().unwrap(), "--json"]);
        let line = assert_refused(name, &run);
        eprintln!("{name}: {:?}: {}", run.elapsed, line);
        let ok = if let Some(at) = number_after(name, "bitflip_global_at_") {
            line.contains(&format!("pickle error at byte {at} (opcode GLOBAL 0x63): refusing opcode GLOBAL"))
        } else if let Some(at) = number_after(name, "bitflip_at_") {
            line.contains(&format!("pickle error at byte {at} (opcode unknown 0x")) && line.contains("unknown opcode")
        } else if let Some(cut) = number_after(name, "truncated_at_").or_else(|| number_after(name, "truncated_p2_at_"))
        {
            // The error is at the opcode the cut splits, or at the cut itself (no STOP).
            error_offset(&line).is_some_and(|at| at <= cut)
                && (line.contains("truncated: needs")
                    || line.contains(&format!("at byte {cut}: input ended before the STOP")))
        } else {
            match EXPECTED.iter().find(|(n, _)| *n == name) {
                Some((_, want)) => line.contains(want),
                None => {
                    failures.push(format!("{name}: no expectation in EXPECTED (add one): {line}"));
                    continue;
                }
            }
        };
        if !ok {
            failures.push(format!("{name}: unexpected message: {line}"));
        }
    }
    for (name, _) in EXPECTED {
        if !files.iter().any(|p| p.file_name().unwrap() == *name) {
            failures.push(format!("{name}: listed in EXPECTED but not in fixtures/hostile"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn code_in_a_pickle_never_runs() {
    // Each payload would `touch memsnap_pwned_*` in the working directory if it were executed.
    let dir = tempfile::tempdir().unwrap();
    let payloads = files_in(&fixture("hostile"), |n| n.starts_with("os_system_") || n.starts_with("inst_"));
    assert!(payloads.len() >= 6);
    for p in &payloads {
        let run = memsnap_in(Some(dir.path()), &["summary", p.to_str().unwrap()], None);
        assert_refused(p.file_name().unwrap().to_str().unwrap(), &run);
        // Through stdin too (the same bytes, no file name to go by).
        let bytes = std::fs::read(p).unwrap();
        let run = memsnap_in(Some(dir.path()), &["summary", "-", "--json"], Some(&bytes));
        assert_refused("stdin", &run);
    }
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(left.is_empty(), "a payload ran: {left:?}");
}

#[test]
fn shared_frames_tuple_is_read_in_linear_time() {
    // Valid: 100k blocks share one frames tuple. Re-walking the tuple per block is 10^10
    // steps, which the kill guard in `common` turns into a failure.
    let run = memsnap(&["summary", fixture("hostile/ok_shared_frames_tuple.pickle.xz").to_str().unwrap(), "--json"]);
    let v = run.json();
    let dev = &v["devices"][0];
    assert_eq!(dev["block_count"], 100_000);
    assert_eq!(dev["allocated_bytes"], 512 * 100_000);
    assert_eq!(dev["requested_bytes"], 500 * 100_000);
}

#[test]
fn missing_file_and_directory_are_errors_not_panics() {
    for arg in ["fixtures/hostile/no_such_file.pickle", "fixtures"] {
        let run = memsnap(&["summary", arg]);
        let line = assert_refused(arg, &run);
        assert!(line.contains(arg), "{line}");
    }
}

/// Every form of output, over the replay and the detectors: the command lines the
/// `analyze_cli` fuzz target runs (fuzz/fuzz_targets/analyze_cli.rs) but `check`, and the
/// segment table at the end besides the one at the peak.
const EVERY_OUTPUT: &[&[&str]] = &[
    &["analyze", "--json"],
    &["analyze"],
    &["report", "-o", "-", "--format", "html"],
    &["report", "-o", "-", "--format", "svg"],
    &["flamegraph", "--folded"],
    &["flamegraph", "--at", "end"],
    &["timeline", "--json", "--every", "7"],
    &["segments", "--at", "peak"],
    &["segments"],
    &["trace"],
];

/// Files that are read but say what no allocator would (`ok_*`; `ok_fuzz_*` were found by the
/// fuzz target, e.g. a block whose requested size exceeds its size) go through every command:
/// exit 0, never a panic. The 100 000-device file has its own test (linear work).
#[test]
fn accepted_odd_files_go_through_every_command() {
    let files = files_in(&fixture("hostile"), |n| n.starts_with("ok_") && !n.starts_with("ok_devices_100k"));
    assert!(files.iter().any(|p| p.to_str().unwrap().contains("ok_fuzz_")), "fuzz regressions missing");
    for path in &files {
        let f = path.to_str().unwrap();
        for cmd in EVERY_OUTPUT {
            let mut args = cmd.to_vec();
            args.push(f);
            let run = memsnap(&args);
            assert!(!run.stderr.contains("panicked"), "{f} {cmd:?}: panic: {}", run.stderr);
            assert_eq!(run.code, Some(0), "{f} {cmd:?}: {}", run.stderr);
        }
    }
}
