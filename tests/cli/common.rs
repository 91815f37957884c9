//! Shared helpers for the CLI tests: run the built `memsnap` binary and look at what it says.

#![allow(dead_code)] // each test binary uses a different subset

use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A command that runs longer than this is killed and the test fails: hostile input must
/// never make memsnap hang. (A guard against hanging, not a timing assertion.)
pub const KILL_AFTER: Duration = Duration::from_secs(20);

/// What one run of the binary produced.
#[derive(Debug)]
pub struct Run {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    /// The bytes as written (`stdout` and `stderr` are their lossy UTF-8 reading).
    pub stdout_bytes: Vec<u8>,
    pub stderr_bytes: Vec<u8>,
    pub elapsed: Duration,
}

impl Run {
    /// Parse stdout as JSON, failing the test with stderr when it is not.
    pub fn json(&self) -> serde_json::Value {
        assert_eq!(self.code, Some(0), "memsnap failed: {}", self.stderr);
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {}", self.stdout))
    }
}

/// The repository root (where `fixtures/` lives).
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn fixture(rel: &str) -> PathBuf {
    root().join("fixtures").join(rel)
}

/// Run `memsnap ARGS` in `dir` (the repository root when `None`), feeding `stdin` if given.
pub fn memsnap_in(dir: Option<&Path>, args: &[&str], stdin: Option<&[u8]>) -> Run {
    memsnap_env(dir, args, stdin, &[])
}

/// [`memsnap_in`] with environment variables set. `COLUMNS` (which wraps text output) is
/// removed unless given, so a test's output does not depend on the shell that runs it.
pub fn memsnap_env(dir: Option<&Path>, args: &[&str], stdin: Option<&[u8]>, env: &[(&str, &str)]) -> Run {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_memsnap"));
    cmd.args(args).current_dir(dir.map(Path::to_path_buf).unwrap_or_else(root));
    cmd.env_remove("COLUMNS").envs(env.iter().copied());
    cmd.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() });
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let start = Instant::now();
    let mut child = cmd.spawn().expect("spawn memsnap");
    // Drain the pipes on threads so a chatty child can never block on a full pipe.
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let out_t = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = out.read_to_end(&mut s);
        s
    });
    let err_t = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = err.read_to_end(&mut s);
        s
    });
    if let Some(input) = stdin {
        let mut pipe = child.stdin.take().unwrap();
        let input = input.to_vec();
        std::thread::spawn(move || {
            let _ = pipe.write_all(&input);
        });
    }
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait for memsnap") {
            break st;
        }
        if start.elapsed() > KILL_AFTER {
            let _ = child.kill();
            let _ = child.wait();
            panic!("memsnap {args:?} still running after {KILL_AFTER:?}: killed");
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    let elapsed = start.elapsed();
    let (stdout_bytes, stderr_bytes) = (out_t.join().unwrap(), err_t.join().unwrap());
    Run {
        code: status.code(),
        stdout: String::from_utf8_lossy(&stdout_bytes).into_owned(),
        stderr: String::from_utf8_lossy(&stderr_bytes).into_owned(),
        stdout_bytes,
        stderr_bytes,
        elapsed,
    }
}

pub fn memsnap(args: &[&str]) -> Run {
    memsnap_in(None, args, None)
}

/// The bytes of an `.xz` file, decompressed.
pub fn unxz(path: &Path) -> Vec<u8> {
    let mut out = Vec::new();
    std::io::Read::read_to_end(&mut xz2::read::XzDecoder::new(std::fs::File::open(path).unwrap()), &mut out).unwrap();
    out
}

/// Whether `python3` cannot be run here (the rewrites of `fixtures/gen/recording_settings.py`
/// need it); then the test says so, `SKIPPED {skipped}`, and should return.
pub fn without_python3(skipped: &str) -> bool {
    let missing = Command::new("python3").arg("--version").output().is_err();
    if missing {
        println!("SKIPPED {skipped}");
    }
    missing
}

/// `snapshot` as another recording setting would have written it (`setting`, see
/// `fixtures/gen/recording_settings.py`), written into `dir` by Python's own pickle module: the
/// path of the rewritten pickle. Fails the test when the script fails.
pub fn rewritten(dir: &Path, setting: &str, snapshot: &Path) -> PathBuf {
    let status = std::process::Command::new("python3")
        .arg(fixture("gen/recording_settings.py"))
        .arg(dir)
        .arg(setting)
        .arg(snapshot)
        .status()
        .unwrap();
    assert!(status.success(), "recording_settings.py {setting} {} failed", snapshot.display());
    let name = snapshot.file_name().unwrap().to_str().unwrap();
    let stem = name.trim_end_matches(".xz").trim_end_matches(".pickle");
    dir.join(format!("{stem}.{setting}.pickle"))
}

/// `memsnap summary PATH --json`, parsed.
pub fn summary_json(path: &Path) -> serde_json::Value {
    let p = path.to_str().expect("utf-8 path");
    memsnap(&["summary", p, "--json"]).json()
}

/// Files in `dir` whose names satisfy `keep`, sorted by name.
pub fn files_in(dir: &Path, keep: impl Fn(&str) -> bool) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file() && p.file_name().and_then(|n| n.to_str()).is_some_and(&keep))
        .collect();
    v.sort();
    v
}

/// Exit status and peak RSS (KiB) of one run, measured with `wait4` (the kernel's own count).
pub struct Measured {
    pub code: Option<i32>,
    pub signal: Option<i32>,
    /// Peak RSS of the process. It includes the test process's own RSS at the fork, so a test
    /// that asserts on it runs alone in its own test binary (`tests/memory`).
    pub max_rss_kib: i64,
    pub stderr: String,
}

/// Run memsnap with output to files (nothing to drain) and measure it; `limit_as` sets
/// RLIMIT_AS for the child (like `ulimit -v`). A watchdog kills it after a minute.
pub fn measured(args: &[&str], limit_as: Option<u64>) -> Measured {
    let dir = tempfile::tempdir().unwrap();
    let err_path = dir.path().join("stderr");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_memsnap"));
    cmd.args(args).current_dir(root()).stdin(Stdio::null()).stdout(Stdio::null());
    cmd.stderr(std::fs::File::create(&err_path).unwrap());
    if let Some(bytes) = limit_as {
        // SAFETY: setrlimit is async-signal-safe and touches only the child.
        #[allow(unsafe_code)]
        unsafe {
            cmd.pre_exec(move || {
                let lim = libc::rlimit { rlim_cur: bytes, rlim_max: bytes };
                if libc::setrlimit(libc::RLIMIT_AS, &lim) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    // Reaped below with wait4 (which also gives the peak RSS), not with `Child::wait`.
    #[allow(clippy::zombie_processes)]
    let child = cmd.spawn().unwrap();
    let pid = child.id() as libc::pid_t;
    let watchdog = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(60));
        // SAFETY: kill(2) of our own child's pid; harmless once it has been reaped.
        #[allow(unsafe_code)]
        unsafe {
            libc::kill(pid, libc::SIGKILL);
        }
    });
    let mut status = 0;
    // SAFETY: a zeroed rusage is a valid value for wait4 to fill.
    #[allow(unsafe_code)]
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    #[allow(unsafe_code)]
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(r, pid, "wait4");
    drop(watchdog);
    let (code, signal) = if libc::WIFEXITED(status) {
        (Some(libc::WEXITSTATUS(status)), None)
    } else {
        (None, libc::WIFSIGNALED(status).then(|| libc::WTERMSIG(status)))
    };
    Measured { code, signal, max_rss_kib: usage.ru_maxrss, stderr: std::fs::read_to_string(&err_path).unwrap() }
}
