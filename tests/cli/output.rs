//! Output files (`report -o`, `flamegraph -o`, `batch -o`) are replaced whole or not at all:
//! a failed write leaves the old file and no temporary file behind and names the path; a
//! symbolic link at the target is replaced, never written through; permissions are those of
//! the file replaced, or the umask's for a new one. See src/output.rs and docs/report.md.

use crate::common;

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;
use std::process::Command;

use common::{fixture, memsnap};

const SNAP: &str = "dev/s03_loss_history_leak.pickle.xz";

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Names in `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    v.sort();
    v
}

/// The three commands that write `-o FILE`, writing to `out` (batch: a row per dev fixture).
fn writers(snap: &str, out: &str) -> Vec<Vec<String>> {
    let v = |a: &[&str]| a.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    vec![
        v(&["report", snap, "-o", out, "--format", "html"]),
        // --folded: the output names here (out.link, /dev/full) have no extension to go by.
        v(&["flamegraph", snap, "--folded", "-o", out]),
        v(&["batch", "fixtures/dev", "-o", out]),
    ]
}

#[test]
fn a_symlink_at_the_target_is_replaced_not_followed() {
    let snap = fixture(SNAP);
    for args in writers(s(&snap), "OUT") {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim.txt");
        std::fs::write(&victim, "keep me\n").unwrap();
        let out = dir.path().join("out.link");
        std::os::unix::fs::symlink(&victim, &out).unwrap();
        let args: Vec<&str> = args.iter().map(|a| if a == "OUT" { s(&out) } else { a }).collect();
        let r = memsnap(&args);
        assert_eq!(r.code, Some(0), "{args:?}: {}", r.stderr);
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep me\n", "{args:?} wrote through the link");
        let meta = std::fs::symlink_metadata(&out).unwrap();
        assert!(meta.file_type().is_file(), "{args:?}: the link is replaced by a file");
        assert!(std::fs::metadata(&out).unwrap().len() > 100, "{args:?}");
        assert_eq!(names(dir.path()), ["out.link", "victim.txt"], "{args:?}: no temporary file left");
    }
}

/// Run `memsnap ARGS` with a file size limit of `blocks` 512-byte blocks, SIGXFSZ ignored: a
/// write past the limit fails with EFBIG, as on a full disk.
fn memsnap_with_fsize_limit(blocks: u32, args: &[&str]) -> (Option<i32>, String) {
    let script = format!("ulimit -f {blocks} && trap '' XFSZ && exec \"$0\" \"$@\"");
    let out = Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg(env!("CARGO_BIN_EXE_memsnap"))
        .args(args)
        .current_dir(common::root())
        .output()
        .unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn a_failed_write_keeps_the_old_file_and_names_the_path() {
    let snap = fixture(SNAP);
    for args in writers(s(&snap), "OUT") {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out.file");
        std::fs::write(&out, "old contents\n").unwrap();
        let args: Vec<&str> = args.iter().map(|a| if a == "OUT" { s(&out) } else { a }).collect();
        // 8 blocks: 4 KiB under dash, 8 KiB under bash; every output here is larger.
        let (code, stderr) = memsnap_with_fsize_limit(8, &args);
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.contains(s(&out)), "{args:?}: the error names the path: {stderr}");
        assert!(stderr.contains("File too large"), "{args:?}: {stderr}");
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "old contents\n", "{args:?}");
        let left = names(dir.path());
        if args[0] == "batch" {
            // The finished rows stay in OUT.partial for --resume.
            assert_eq!(left, ["out.file", "out.file.partial"], "{args:?}");
        } else {
            assert_eq!(left, ["out.file"], "{args:?}: no temporary file left");
        }
    }
}

#[test]
fn devices_are_written_in_place_and_their_errors_name_them() {
    let snap = fixture(SNAP);
    if Path::new("/dev/full").exists() {
        for args in writers(s(&snap), "/dev/full") {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let r = memsnap(&args);
            assert_eq!(r.code, Some(2), "{args:?}: {}", r.stderr);
            assert!(r.stderr.contains("cannot write /dev/full: No space left on device"), "{args:?}: {}", r.stderr);
        }
    }
    for args in writers(s(&snap), "/dev/null") {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let r = memsnap(&args);
        assert_eq!(r.code, Some(0), "{args:?}: {}", r.stderr);
    }
    assert!(std::fs::metadata("/dev/null").unwrap().file_type().is_char_device(), "/dev/null is still a device");
    // A directory is no output file.
    let dir = tempfile::tempdir().unwrap();
    let r = memsnap(&["report", s(&snap), "-o", s(dir.path()), "--format", "html"]);
    assert_eq!(r.code, Some(2));
    assert!(r.stderr.contains("it is a directory"), "{}", r.stderr);
}

/// The process umask, from /proc (Linux 4.7 and later).
fn umask() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find_map(|l| l.strip_prefix("Umask:"))?;
    u32::from_str_radix(line.trim(), 8).ok()
}

#[test]
fn permissions_are_kept_or_follow_the_umask() {
    let snap = fixture(SNAP);
    for args in writers(s(&snap), "OUT") {
        let dir = tempfile::tempdir().unwrap();
        let kept = dir.path().join("kept.out");
        std::fs::write(&kept, "old").unwrap();
        std::fs::set_permissions(&kept, std::fs::Permissions::from_mode(0o640)).unwrap();
        let new = dir.path().join("new.out");
        for out in [&kept, &new] {
            let args: Vec<&str> = args.iter().map(|a| if a == "OUT" { s(out) } else { a }).collect();
            let r = memsnap(&args);
            assert_eq!(r.code, Some(0), "{args:?}: {}", r.stderr);
        }
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&kept), 0o640, "{args:?}: a replaced file keeps its mode");
        if let Some(mask) = umask() {
            assert_eq!(mode(&new), 0o666 & !mask, "{args:?}: a new file is made as File::create makes it");
        }
    }
}
