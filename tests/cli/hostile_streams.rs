//! Hostile and odd inputs, round two: linear work in the number of devices, memory that
//! follows what a snapshot holds (compressed bombs, pipes, devices), files truncated while
//! they are read, allocation failure, and what `batch` reads from directories.

use crate::common;

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{fixture, measured, memsnap, memsnap_in, Run};

fn one_error_line(what: &str, run: &Run) -> String {
    assert_eq!(run.code, Some(2), "{what}: exit {:?}: {}", run.code, run.stderr);
    let line = run.stderr.trim_end_matches('\n');
    assert!(!line.contains('\n') && line.starts_with("memsnap: error: "), "{what}: {:?}", run.stderr);
    line.to_string()
}

#[test]
fn a_hundred_thousand_devices_cost_linear_work_in_every_command() {
    // One segment, one block and a one-event trace on each of 100 000 devices. Any per-device
    // scan of all devices (10^10 steps) trips the kill guard in `common`.
    let f = fixture("hostile/ok_devices_100k.pickle.xz");
    let f = f.to_str().unwrap();
    let v = memsnap(&["summary", f, "--json"]).json();
    assert_eq!(v["devices"].as_array().unwrap().len(), 100_000);
    assert_eq!(v["devices"][99_999]["device"], 99_999);
    assert_eq!(v["devices"][99_999]["reserved_bytes"], 2 << 20);
    let v = memsnap(&["analyze", f, "--json"]).json();
    assert_eq!(v["devices"].as_array().unwrap().len(), 100_000);
    assert_eq!(v["devices"][4242]["peak_allocated_bytes"], 512);
    for args in [
        &["analyze", f][..],
        &["check", f, "--max-reserved", "1GiB"],
        &["segments", f],
        &["timeline", f],
        &["trace", f],
        &["flamegraph", f, "--folded", "-o", "-"],
    ] {
        let run = memsnap(args);
        assert_eq!(run.code, Some(0), "{args:?}: {}", run.stderr);
        eprintln!("{args:?}: {:?}", run.elapsed);
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("rows.jsonl");
    let run = memsnap(&["batch", f, "-o", out.to_str().unwrap()]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    // Reports draw at most 64 devices and name the rest: every form stays small.
    for (name, extra) in [("page.html", None), ("static.html", Some("--static")), ("image.svg", None)] {
        let out = dir.path().join(name);
        let mut args = vec!["report", f, "-o", out.to_str().unwrap()];
        args.extend(extra);
        let run = memsnap(&args);
        assert_eq!(run.code, Some(0), "{args:?}: {}", run.stderr);
        let text = std::fs::read_to_string(&out).unwrap();
        assert!(text.len() < 8 << 20, "{name}: {} bytes for 64 drawn devices", text.len());
        assert!(text.contains("the report draws 64 of the file"), "{name}: no caveat for the devices left out");
        assert!(text.contains("99,936 others (devices 64–99999)"), "{name}: the devices left out are not named");
        eprintln!("{args:?}: {:?}", run.elapsed);
    }
}

#[test]
fn allocation_failure_is_an_error_line_not_an_abort() {
    // 30 M empty dicts as a plain 30 MB file: the object budget allows 32 bytes per pickle
    // byte, so with the address space limited to 200 MB an allocation fails first.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dicts.pickle");
    let mut bytes = b"\x80\x04](".to_vec();
    bytes.resize(bytes.len() + 30_000_000, b'}');
    bytes.extend_from_slice(b"e.");
    std::fs::write(&path, &bytes).unwrap();
    let m = measured(&["summary", path.to_str().unwrap()], Some(200 << 20));
    assert_eq!(m.signal, None, "killed by a signal (abort?): {}", m.stderr);
    assert_eq!(m.code, Some(2), "{}", m.stderr);
    let line = m.stderr.trim_end();
    assert!(!line.contains('\n'), "{line}");
    assert!(line.starts_with("memsnap: error: out of memory: an allocation of "), "{line}");
    // A real snapshot reads under the same limit: nothing is reserved ahead from its size.
    let real = fixture("dev/s01_clean_train.pickle.xz");
    let m = measured(&["summary", real.to_str().unwrap()], Some(200 << 20));
    assert_eq!(m.code, Some(0), "{}", m.stderr);
}

#[test]
fn pipes_and_special_files_are_read_as_streams() {
    // A pipe reports st_size 0: it must be read, not judged empty. /dev/stdin is the pipe.
    let bytes = std::fs::read(fixture("dev/s01_clean_train.pickle.xz")).unwrap();
    let from_file = memsnap(&["summary", fixture("dev/s01_clean_train.pickle.xz").to_str().unwrap(), "--json"]).json();
    for arg in ["-", "/dev/stdin"] {
        let run = memsnap_in(None, &["summary", arg, "--json"], Some(&bytes));
        let v = run.json();
        assert_eq!(v["devices"], from_file["devices"], "{arg}");
        assert_eq!(v["pickle_bytes"], from_file["pickle_bytes"], "{arg}");
        assert!(v["pickle_bytes"].as_u64().is_some_and(|b| b > 0));
    }
    // Compressed stdin: the file size is the compressed bytes read, the pickle size what they
    // decompress to (before, both were the decompressed size).
    let run = memsnap_in(None, &["summary", "-"], Some(&bytes));
    let want = format!("file: {} bytes (xz compressed, {} pickle bytes)", bytes.len(), from_file["pickle_bytes"]);
    assert!(run.stdout.contains(&want), "{}", run.stdout);
    let run = memsnap_in(None, &["batch", "-"], Some(&bytes));
    let row: serde_json::Value = serde_json::from_str(run.stdout.lines().next().unwrap()).unwrap();
    assert_eq!(row["file_bytes"], bytes.len() as u64);
    assert_eq!(row["pickle_bytes"], from_file["pickle_bytes"]);
    // Devices and /proc files are judged by their bytes, not by their reported size.
    let line = one_error_line("/dev/zero", &memsnap(&["summary", "/dev/zero"]));
    assert!(
        line.contains("byte 0: not a pickle: first byte 0x00 is no pickle opcode (starts with zero bytes)"),
        "{line}"
    );
    let line = one_error_line("/dev/null", &memsnap(&["summary", "/dev/null"]));
    assert!(line.contains("empty file (0 bytes)"), "{line}");
    let line = one_error_line("/proc/self/status", &memsnap(&["summary", "/proc/self/status"]));
    assert!(!line.contains("empty file"), "{line}");
    // Random bytes end in an error at some offset, quickly (their memory: tests/memory).
    for _ in 0..20 {
        let m = measured(&["summary", "/dev/urandom"], None);
        assert_eq!(m.code, Some(2), "{}", m.stderr);
    }
}

#[test]
fn a_file_truncated_while_it_is_read_is_an_error_not_sigbus() {
    // 200 MB of NONE POP: long enough to be read when the file is cut to 1 MB under it. A
    // memory-mapped reader dies of SIGBUS here; a reading one sees the input end.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cut.pickle");
    {
        let mut f = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
        f.write_all(b"\x80\x04").unwrap();
        let chunk = b"N0".repeat(1 << 20);
        for _ in 0..100 {
            f.write_all(&chunk).unwrap();
        }
        f.write_all(b"N.").unwrap();
    }
    let child = Command::new(env!("CARGO_BIN_EXE_memsnap"))
        .args(["summary", path.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(30));
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(1 << 20).unwrap();
    let out = child.wait_with_output().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(out.status.signal(), None, "killed by a signal");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    // Cut while reading: the input ends before STOP; read before the cut: the root is None.
    assert!(err.contains("input ended before the STOP opcode") || err.contains("found None"), "{err}");
}

#[test]
fn batch_reads_only_regular_files_from_directories() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(fixture("dev/s01_clean_train.pickle.xz"), dir.path().join("a.pickle.xz")).unwrap();
    let fifo = dir.path().join("b.pickle");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo with a valid NUL-terminated path.
    #[allow(unsafe_code)]
    let r = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
    assert_eq!(r, 0, "mkfifo");
    let out = dir.path().join("rows.jsonl");
    // A FIFO nobody writes would block a reader forever: the kill guard fails the test if so.
    for arg in [dir.path().to_str().unwrap().to_string(), format!("{}/*.pickle*", dir.path().display())] {
        let run = memsnap(&["batch", &arg, "-o", out.to_str().unwrap()]);
        assert_eq!(run.code, Some(0), "{}", run.stderr);
        assert!(
            run.stderr.contains("b.pickle: not a regular file (a FIFO, socket or device): skipped"),
            "{}",
            run.stderr
        );
        let rows = std::fs::read_to_string(&out).unwrap();
        assert_eq!(rows.lines().count(), 1, "{rows}");
    }
    // The warnings show the directory's name escaped, like every other path on stderr.
    let odd = tempfile::tempdir().unwrap();
    let empty = odd.path().join("runs\x1b]0;T\x07");
    std::fs::create_dir(&empty).unwrap();
    let run = memsnap(&["batch", empty.to_str().unwrap()]);
    assert!(run.stderr.contains("runs\\x1b]0;T\\x07: no snapshot files"), "{}", run.stderr);
    assert!(!run.stderr.contains('\x1b'), "{:?}", run.stderr);
}

#[test]
fn batch_holds_a_compressed_file_to_its_estimated_size() {
    // zstd written as a stream has no content size: batch admits it at 32 times its size. This
    // one expands far more (a real snapshot followed by 64 MB of zeros after STOP), so the first
    // read stops at the estimate and the file is read again alone, to the same row.
    let plain = common::unxz(&fixture("dev/s03_loss_history_leak.pickle.xz"));
    let dir = tempfile::tempdir().unwrap();
    let padded: Vec<u8> = plain.iter().copied().chain(std::iter::repeat_n(0u8, 64 << 20)).collect();
    let mut enc = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
    enc.write_all(&padded).unwrap();
    let zst = enc.finish().unwrap();
    assert!(zst.len() as u64 * 32 < padded.len() as u64, "the estimate must be too small for this test");
    std::fs::write(dir.path().join("big.pickle.zst"), &zst).unwrap();
    std::fs::write(dir.path().join("small.pickle"), &plain).unwrap();
    let out = dir.path().join("rows.jsonl");
    let run = memsnap(&["batch", dir.path().to_str().unwrap(), "-o", out.to_str().unwrap(), "--jobs", "2"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let rows: Vec<serde_json::Value> =
        std::fs::read_to_string(&out).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0]["pickle_bytes"], padded.len() as u64, "{}", rows[0]);
    assert_eq!(rows[0]["devices"], rows[1]["devices"]);
}

#[test]
fn sizes_that_sum_past_2_to_the_64_saturate_with_a_caveat_and_fail_gates() {
    // 65 537 segments of 2^48 bytes on one device: the sum wraps to 2^48 in 64 bits. Held at
    // u64::MAX instead, with a caveat, so that a gate can never pass on a wrapped total (and
    // the overflow-checked release build does not panic).
    let f = fixture("hostile/ok_sizes_sum_past_2p64.pickle.xz");
    let f = f.to_str().unwrap();
    let v = memsnap(&["summary", f, "--json"]).json();
    assert_eq!(v["devices"][0]["reserved_bytes"], u64::MAX);
    assert_eq!(v["devices"][0]["allocated_bytes"], u64::MAX);
    let caveats = v["caveats"].to_string();
    assert!(caveats.contains("sizes add up past 2^64 - 1 bytes on device 0"), "{caveats}");
    let run = memsnap(&["check", f, "--max-reserved", "1GiB"]);
    assert_eq!(run.code, Some(1), "the gate must fail: {} {}", run.stdout, run.stderr);
    let v = memsnap(&["analyze", f, "--json"]).json();
    assert!(v["devices"][0]["peak_reserved_bytes"].is_null() || v["devices"][0]["peak_reserved_bytes"] == u64::MAX);
}

#[test]
fn a_peak_is_never_below_the_dump() {
    // The trace allocates 512 bytes where the dump shows a 1 MiB block: the replay ends below
    // the dump. The peak is the dump's value, at the last event (not 512).
    let f = fixture("hostile/ok_trace_below_dump.pickle");
    let v = memsnap(&["analyze", f.to_str().unwrap(), "--json"]).json();
    let d = &v["devices"][0];
    assert_eq!(d["allocated_bytes"], 1 << 20);
    assert_eq!(d["peak_allocated_bytes"], 1 << 20, "{d}");
    assert_eq!(d["peak_active_bytes"], 1 << 20, "{d}");
    assert_eq!(d["peak_event_index"], 1);
    assert_eq!(d["replay_matches_snapshot"], false);
}

#[test]
fn bombs_stop_where_their_budgets_say() {
    // The decompression budget: at most 1000 pickle bytes per compressed byte read, plus 64 MiB.
    // The refusal comes as soon as the stream passes it (within one read of the window).
    let f = fixture("hostile/bomb_tiny_opcodes_1g.pickle.xz");
    let line = one_error_line("tiny opcodes", &memsnap(&["summary", f.to_str().unwrap()]));
    let number_after = |word: &str| -> u64 {
        let rest = &line[line.find(word).unwrap_or_else(|| panic!("{line}")) + word.len()..];
        rest.split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap()
    };
    // "… xz stream expands to more than OUT bytes from IN compressed bytes (over 1000x …"
    let (out, stored) = (number_after("more than "), number_after(" bytes from "));
    let allowed = (64u64 << 20) + 1000 * stored;
    assert!(out > allowed && out <= allowed + (1 << 20) + (1 << 16), "{line}");
    assert!(line.contains("over 1000x"), "{line}");
    // The object budget: refused after building about 64 MiB + 512 bytes per byte of xz read.
    let f = fixture("hostile/bomb_empty_dicts_30m.pickle.xz");
    let line = one_error_line("empty dicts", &memsnap(&["summary", f.to_str().unwrap()]));
    assert!(
        line.contains("a real snapshot of this size could need: refusing an object or decompression bomb"),
        "{line}"
    );
    let stored = std::fs::metadata(&f).unwrap().len();
    assert!(line.contains(&format!("({stored} bytes as stored)")), "{line}");
}

/// Run memsnap with stderr on a pseudo-terminal; returns what the terminal received.
fn stderr_on_a_terminal(args: &[&str]) -> String {
    use std::os::fd::FromRawFd;
    let (mut master, mut slave) = (0, 0);
    // SAFETY: openpty fills two descriptors; a null name and termios are allowed.
    #[allow(unsafe_code)]
    // A terminal of 200 columns: a bar is never cut short by a terminal of unknown width.
    let size = libc::winsize { ws_row: 50, ws_col: 200, ws_xpixel: 0, ws_ypixel: 0 };
    let r = unsafe { libc::openpty(&mut master, &mut slave, std::ptr::null_mut(), std::ptr::null(), &size) };
    assert_eq!(r, 0, "openpty");
    // SAFETY: both descriptors were just opened and are owned here.
    #[allow(unsafe_code)]
    let (master, slave) = unsafe { (std::fs::File::from_raw_fd(master), std::fs::File::from_raw_fd(slave)) };
    let mut child = Command::new(env!("CARGO_BIN_EXE_memsnap"))
        .args(args)
        .current_dir(common::root())
        .stdout(Stdio::null())
        .stderr(slave)
        .spawn()
        .unwrap();
    let reader = std::thread::spawn(move || {
        let mut out = Vec::new();
        let mut master = master;
        let mut buf = [0u8; 4096];
        // Reading the master fails (EIO) once the child has exited and closed the slave.
        while let Ok(n) = master.read(&mut buf) {
            if n == 0 {
                break;
            }
            out.extend_from_slice(&buf[..n]);
        }
        out
    });
    assert!(child.wait().unwrap().success());
    String::from_utf8_lossy(&reader.join().unwrap()).into_owned()
}

#[test]
fn progress_is_drawn_on_a_terminal_only_and_quiet_silences_it() {
    let f = fixture("hostile/ok_devices_100k.pickle.xz");
    let f = f.to_str().unwrap();
    let shown = stderr_on_a_terminal(&["analyze", f]);
    assert!(shown.contains("reading") || shown.contains("replaying") || shown.contains("analysing"), "{shown:?}");
    let quiet = stderr_on_a_terminal(&["analyze", f, "--quiet"]);
    assert!(quiet.is_empty(), "{quiet:?}");
    // Not a terminal: nothing (the other tests read stderr through a pipe and see no progress).
    let run = memsnap(&["analyze", f]);
    assert_eq!(run.code, Some(0));
    assert!(run.stderr.is_empty(), "{:?}", run.stderr);
}

/// `batch` on a terminal shows bytes read over the files' stored size, and files done.
#[test]
fn batch_progress_counts_bytes_and_files() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("rows.jsonl");
    let a = fixture("dev/s03_loss_history_leak.pickle.xz");
    let b = fixture("dev/s01_clean_train.pickle.xz");
    let shown = stderr_on_a_terminal(&["batch", a.to_str().unwrap(), b.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    let total = std::fs::metadata(&a).unwrap().len() + std::fs::metadata(&b).unwrap().len();
    // indicatif writes sizes in binary units with two decimals (both files are under 1 MiB).
    assert!(total < 1 << 20);
    assert!(shown.contains("2/2"), "no file count in {shown:?}");
    let total_shown = format!("/{:.2} KiB", total as f64 / 1024.0);
    assert!(shown.contains(&total_shown), "no {total_shown} in {shown:?}");
}
