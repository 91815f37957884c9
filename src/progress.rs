//! Progress on stderr for long work: bytes read while a snapshot loads, then the phase
//! (replaying, analysing, rendering). Drawn only when stderr is a terminal and `--quiet` was not
//! given; otherwise nothing is written, so pipes, logs and tests see no progress output.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

static ENABLED: OnceLock<bool> = OnceLock::new();
/// Set by `batch`, which draws its own bar over files: per-file bars would interleave with it.
static PER_FILE_OFF: AtomicBool = AtomicBool::new(false);

/// Stored bytes read so far by every load of this process (`batch` shows them over its files).
static BYTES_READ: AtomicU64 = AtomicU64::new(0);

/// Count `n` more stored bytes read.
pub fn add_bytes_read(n: u64) {
    BYTES_READ.fetch_add(n, Ordering::Relaxed);
}

/// Stored bytes read so far, over all loads.
pub fn bytes_read() -> u64 {
    BYTES_READ.load(Ordering::Relaxed)
}

/// Decide once, at start: progress is shown when stderr is a terminal and not `quiet`.
pub fn init(quiet: bool) {
    let _ = ENABLED.set(!quiet && std::io::stderr().is_terminal());
}

fn enabled() -> bool {
    *ENABLED.get().unwrap_or(&false) && !PER_FILE_OFF.load(Ordering::Relaxed)
}

/// Whether progress may be drawn at all (stderr is a terminal and no `--quiet`).
pub fn shown() -> bool {
    *ENABLED.get().unwrap_or(&false)
}

/// No per-file bars from here on (for `batch`).
pub fn per_file_off() {
    PER_FILE_OFF.store(true, Ordering::Relaxed);
}

/// A bar over `total` bytes (a spinner with the count when the total is unknown), or a hidden
/// one when progress is off.
pub fn bytes(what: &str, total: Option<u64>) -> ProgressBar {
    if !enabled() {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::with_draw_target(total, ProgressDrawTarget::stderr());
    let template = if total.is_some() {
        "{msg} [{bar:30}] {bytes}/{total_bytes} ({bytes_per_sec})"
    } else {
        "{msg} {spinner} {bytes} ({bytes_per_sec})"
    };
    if let Ok(style) = ProgressStyle::with_template(template) {
        pb.set_style(style.progress_chars("=> "));
    }
    pb.set_message(what.to_string());
    pb
}

/// A spinner naming the phase that runs until it is dropped (or `finish_and_clear`ed).
pub fn phase(what: &str) -> ProgressBar {
    if !enabled() {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template("{spinner} {msg} {elapsed}") {
        pb.set_style(style);
    }
    pb.set_message(what.to_string());
    pb.enable_steady_tick(std::time::Duration::from_millis(120));
    pb
}
