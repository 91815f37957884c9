//! Arbitrary bytes through the whole command line, as a user's file would go: read, replay,
//! analyse, and every output form (`analyze` text and JSON, the HTML and SVG reports, the
//! flamegraph, the timeline, the segment table at the peak, the trace listing, `check`).
//!
//! The reader's own target (`read_snapshot`) proves that bytes become a model or an error. This
//! one proves that every accepted model, however odd (sizes, addresses, times and actions that
//! no allocator would write, frames that point nowhere), goes through the replay, the detectors
//! and the renderers without a panic, and that each run ends as a user may rely on: exit 0
//! (1 for a failed `check` gate), or 2 with one error line; never raw control characters in a
//! text output.
//!
//! Seeds: small real snapshots (`fuzz/seeds.py` cuts real fixtures down to a few hundred
//! trace entries), so that most mutations stay readable and reach the analysis.
#![no_main]

use libfuzzer_sys::fuzz_target;
use memsnap::embed::run_captured;

const INPUT: &str = "fuzz.pickle";

/// The command lines run on every input (the program name and the input are added).
const COMMANDS: &[&[&str]] = &[
    &["analyze", "--json"],
    &["analyze"],
    &["report", "-o", "-", "--format", "html"],
    &["report", "-o", "-", "--format", "svg"],
    &["flamegraph", "--folded"],
    &["flamegraph", "--at", "end"],
    &["timeline", "--json", "--every", "7"],
    &["segments", "--at", "peak"],
    &["trace"],
    &["check", "--fail-on", "all", "--max-peak", "1GiB"],
];

/// Text outputs: what a terminal would show. JSON, HTML and SVG escape what they carry.
fn is_text(cmd: &[&str]) -> bool {
    cmd[0] != "flamegraph" && !cmd.iter().any(|a| matches!(*a, "--json" | "html" | "svg" | "--folded"))
}

fn run(cmd: &[&str], data: &[u8]) {
    let mut args = vec!["memsnap".to_string()];
    args.extend(cmd.iter().map(|s| s.to_string()));
    args.push(INPUT.to_string());
    let out = run_captured(args, vec![(INPUT.to_string(), data.to_vec())]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    match out.code {
        0 => {}
        1 => assert_eq!(cmd[0], "check", "{cmd:?}: exit 1 outside check: {stderr}"),
        2 => {
            let lines: Vec<&str> = stderr.lines().filter(|l| !l.is_empty()).collect();
            assert_eq!(lines.len(), 1, "{cmd:?}: an error must be one line: {stderr:?}");
            assert!(lines[0].starts_with("memsnap: error: "), "{cmd:?}: {stderr:?}");
        }
        c => panic!("{cmd:?}: exit code {c}: {stderr}"),
    }
    assert!(!stderr.contains('\u{1b}'), "{cmd:?}: an escape character on stderr: {stderr:?}");
    if is_text(cmd) {
        let bad = out.stdout.iter().position(|&b| b == 0x1b || b == 0x07 || b == b'\r' || b == 0x7f);
        assert!(bad.is_none(), "{cmd:?}: control character in text output at byte {bad:?}");
    }
}

fuzz_target!(|data: &[u8]| {
    for cmd in COMMANDS {
        run(cmd, data);
    }
});
