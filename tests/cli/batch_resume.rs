//! `batch -o OUT`: OUT is replaced only at the end; meanwhile finished rows are kept, whole,
//! in `OUT.partial`, and `--resume` continues from it to the same bytes an uninterrupted run
//! writes. See docs/batch.md.

use crate::common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{fixture, memsnap, KILL_AFTER};

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A directory of snapshots `a`…`h`, copies of dev fixtures; `f_slow.pickle` is made by `f`.
fn inputs(dir: &Path, f: impl FnOnce(&Path)) {
    let sources = ["s01_clean_train", "s03_loss_history_leak", "s04_grad_kept", "s07_fragmentation", "s08_oom"];
    for (k, name) in sources.iter().enumerate() {
        let to = dir.join(format!("{}_{name}.pickle.xz", (b'a' + k as u8) as char));
        std::fs::copy(fixture(&format!("dev/{name}.pickle.xz")), to).unwrap();
    }
    f(&dir.join("f_slow.pickle"));
    std::fs::copy(fixture("dev/s12_cuda_graph.pickle.xz"), dir.join("g_s12.pickle.xz")).unwrap();
    std::fs::write(dir.join("h_bad.pickle"), b"not a pickle").unwrap();
}

/// Complete lines in `path` (0 when it does not exist).
fn complete_lines(path: &Path) -> usize {
    std::fs::read(path).map_or(0, |b| b.iter().filter(|&&c| c == b'\n').count())
}

#[test]
fn a_killed_batch_resumes_to_the_same_bytes() {
    killed_and_resumed("jsonl");
}

/// A Parquet batch keeps its rows as JSON Lines in `OUT.partial` and resumes from them the same
/// way: the resumed file is the same bytes as a fresh one.
#[test]
fn a_killed_parquet_batch_resumes_to_the_same_bytes() {
    killed_and_resumed("parquet");
}

/// A batch to `rows.EXT` killed after two rows, then resumed, against a fresh run.
fn killed_and_resumed(ext: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("in");
    std::fs::create_dir(&dir).unwrap();
    // The sixth input is a FIFO nobody writes: the batch blocks there for good, after the
    // rows before it are written, and is killed mid-run.
    inputs(&dir, |p| {
        let ok = Command::new("mkfifo").arg(p).status().map(|s| s.success()).unwrap_or(false);
        assert!(ok, "mkfifo {}", p.display());
    });
    let out = tmp.path().join(format!("rows.{ext}"));
    let partial = tmp.path().join(format!("rows.{ext}.partial"));
    std::fs::write(&out, "OLD\n").unwrap();

    let mut child = Command::new(env!("CARGO_BIN_EXE_memsnap"))
        .args(["batch", s(&dir), "-o", s(&out), "--jobs", "1"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while complete_lines(&partial) < 2 {
        assert!(child.try_wait().unwrap().is_none(), "the batch ended before it could be interrupted");
        if start.elapsed() > KILL_AFTER {
            let _ = child.kill();
            panic!("no rows in {} after {KILL_AFTER:?}", partial.display());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().unwrap(); // SIGKILL: nothing gets to clean up
    child.wait().unwrap();
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "OLD\n", "OUT is untouched until the batch is done");
    let before = complete_lines(&partial);
    assert!(before >= 2, "{before} rows");
    // A write cut short: half a row at the end.
    let mut torn = std::fs::read(&partial).unwrap();
    torn.extend_from_slice(b"{\"allocated_bytes\":1234,\"caveats\":[\"tr");
    std::fs::write(&partial, torn).unwrap();

    // The slow input becomes a snapshot; the resumed run and a fresh one must agree.
    std::fs::remove_file(dir.join("f_slow.pickle")).unwrap();
    std::fs::copy(fixture("dev/s16_alloc_conf.pickle.xz"), dir.join("f_slow.pickle")).unwrap();
    let r = memsnap(&["batch", s(&dir), "-o", s(&out), "--jobs", "1", "--resume"]);
    assert_eq!(r.code, Some(2), "h_bad.pickle is unreadable: {}", r.stderr);
    assert!(
        r.stderr.contains(&format!("8 rows (1 unreadable) written to {}; {before} of them kept from", s(&out))),
        "{}",
        r.stderr
    );
    assert!(!partial.exists(), "OUT.partial became OUT");
    let fresh = tmp.path().join(format!("fresh.{ext}"));
    let f = memsnap(&["batch", s(&dir), "-o", s(&fresh), "--jobs", "1"]);
    assert_eq!(f.code, Some(2), "{}", f.stderr);
    let (resumed, fresh) = (std::fs::read(&out).unwrap(), std::fs::read(&fresh).unwrap());
    if ext == "parquet" {
        assert!(resumed.starts_with(b"PAR1"), "a Parquet file");
        assert!(resumed == fresh, "the resumed Parquet file differs from a fresh one");
    } else {
        assert_eq!(String::from_utf8_lossy(&resumed), String::from_utf8_lossy(&fresh));
        assert_eq!(resumed.iter().filter(|&&c| c == b'\n').count(), 8);
    }
}

#[test]
fn resume_keeps_complete_csv_rows_wherever_they_are_and_drops_a_torn_line() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("in");
    std::fs::create_dir(&dir).unwrap();
    inputs(&dir, |p| {
        std::fs::copy(fixture("dev/s16_alloc_conf.pickle.xz"), p).unwrap();
    });
    let fresh = tmp.path().join("fresh.csv");
    let r = memsnap(&["batch", s(&dir), "-o", s(&fresh), "--jobs", "2"]);
    assert_eq!(r.code, Some(2), "{}", r.stderr);
    let expected = std::fs::read_to_string(&fresh).unwrap();
    let lines: Vec<&str> = expected.split_inclusive('\n').collect();
    assert_eq!(lines.len(), 9, "a header and 8 rows");

    let out = tmp.path().join("rows.csv");
    let partial = tmp.path().join("rows.csv.partial");
    // The header, rows 1-3, row 5 and half of row 6. (batch writes rows in input order, so
    // what a crash leaves is a prefix; rows out of place, as after an input was added, are
    // reused where they belong, and the file is cut after the prefix.)
    let mut text: String = lines[..4].concat();
    text.push_str(lines[5]);
    text.push_str(&lines[6][..lines[6].len() / 2]);
    std::fs::write(&partial, &text).unwrap();
    let r = memsnap(&["batch", s(&dir), "-o", s(&out), "--resume"]);
    assert_eq!(r.code, Some(2), "{}", r.stderr);
    assert!(r.stderr.contains("; 4 of them kept from"), "{}", r.stderr);
    assert!(r.stderr.contains("(4 complete rows found)"), "{}", r.stderr);
    assert_eq!(std::fs::read_to_string(&out).unwrap(), expected);
    assert!(!partial.exists());

    // Everything already there: nothing is read again.
    std::fs::write(&partial, &expected).unwrap();
    let r = memsnap(&["batch", s(&dir), "-o", s(&out), "--resume"]);
    assert_eq!(r.code, Some(2), "{}", r.stderr);
    assert!(
        r.stderr.contains("8 rows (1 unreadable) written to") && r.stderr.contains("; 8 of them kept"),
        "{}",
        r.stderr
    );
    assert_eq!(std::fs::read_to_string(&out).unwrap(), expected);

    // No partial file: a fresh run, said so.
    let r = memsnap(&["batch", s(&dir), "-o", s(&out), "--resume"]);
    assert!(r.stderr.contains("rows.csv.partial to resume: reading every input"), "{}", r.stderr);
    assert_eq!(std::fs::read_to_string(&out).unwrap(), expected);
}

#[test]
fn resume_refuses_what_it_cannot_continue() {
    let tmp = tempfile::tempdir().unwrap();
    let snap = fixture("dev/s12_cuda_graph.pickle.xz");
    // Rows on stdout cannot be resumed.
    let r = memsnap(&["batch", s(&snap), "--resume"]);
    assert_eq!(r.code, Some(2));
    assert!(r.stderr.contains("--resume needs -o FILE"), "{}", r.stderr);
    // A partial file of the other format, or not of rows at all, is left alone.
    let out = tmp.path().join("rows.csv");
    let partial = tmp.path().join("rows.csv.partial");
    std::fs::write(&partial, "{\"path\":\"x\"}\n").unwrap();
    let r = memsnap(&["batch", s(&snap), "-o", s(&out), "--resume"]);
    assert_eq!(r.code, Some(2));
    assert!(r.stderr.contains("does not start with the CSV header"), "{}", r.stderr);
    assert_eq!(std::fs::read_to_string(&partial).unwrap(), "{\"path\":\"x\"}\n");
    let out = tmp.path().join("rows.jsonl");
    let partial = tmp.path().join("rows.jsonl.partial");
    std::fs::write(&partial, "path,file_bytes\n").unwrap();
    let r = memsnap(&["batch", s(&snap), "-o", s(&out), "--resume"]);
    assert_eq!(r.code, Some(2));
    assert!(r.stderr.contains("does not hold JSON Lines rows"), "{}", r.stderr);
    assert!(!out.exists());
}
