//! Progress on stderr for long work: bytes read while a snapshot loads, then the phase
//! (replaying, analysing, rendering). Drawn only when stderr is a terminal and `--quiet` was not
//! given (a run captured in memory, `crate::embed`, has no terminal); otherwise nothing is written,
//! so pipes, logs and tests see no progress output.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::invocation;

/// Count `n` more stored bytes read (`batch` shows them over its files).
pub fn add_bytes_read(n: u64) {
    invocation::add_bytes_read(n);
}

/// Stored bytes read so far, over all loads of this run.
pub fn bytes_read() -> u64 {
    invocation::bytes_read()
}

fn enabled() -> bool {
    invocation::per_file_progress_shown()
}

/// Whether progress may be drawn at all (stderr is a terminal and no `--quiet`).
pub fn shown() -> bool {
    invocation::progress_shown()
}

/// No per-file bars from here on (for `batch` and `ranks`).
pub fn per_file_off() {
    invocation::per_file_progress_off();
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
