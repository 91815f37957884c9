//! What one run of the command line works with: where its output goes, the inputs it was handed
//! in memory, and its settings (progress, the sequential reader, whether big values are left to
//! the process's exit). Kept per thread, never process-wide: the binary runs one command per
//! process, but the Python extension runs many in one process, at once from several threads,
//! each with its own output.
//!
//! A run's invocation is set on the thread that runs the command ([`within`]). The threads that
//! work for a command get it handed over the same way around their work: `batch`'s pool, and
//! the files `diff` and `ranks` read at once on rayon's threads. A thread with no invocation
//! writes to the process's stdio, reads only files, and draws no progress.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::OsString;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use crate::sink::Sink;

/// One run of the command line.
pub struct Invocation {
    pub(crate) sink: Arc<Sink>,
    /// Inputs by the name the command line gives them, read instead of a file of that name.
    inputs: HashMap<OsString, InMemory>,
    /// Progress may be drawn (stderr is a terminal and no `--quiet`).
    progress: bool,
    /// `--sequential-reader`.
    sequential_reader: bool,
    /// The process ends when the command does: big values may be left to its exit instead of
    /// freed ([`crate::emit::leave`]). Only the binary's.
    exits_after: bool,
    /// Set by `batch` and `ranks`, which draw their own bar over files: per-file bars would
    /// interleave with it.
    per_file_progress_off: AtomicBool,
    /// Stored bytes read so far by every load of this run (`batch` shows them over its files).
    bytes_read: AtomicU64,
}

/// How a run is set up, besides its command line.
pub struct Setup {
    pub sink: Arc<Sink>,
    pub inputs: Vec<(OsString, Vec<u8>)>,
    pub exits_after: bool,
}

impl Invocation {
    pub(crate) fn new(setup: Setup, quiet: bool, sequential_reader: bool) -> Invocation {
        let progress = !quiet && setup.sink.stderr_is_terminal();
        Invocation {
            sink: setup.sink,
            inputs: setup.inputs.into_iter().map(|(name, bytes)| (name, InMemory(Arc::new(bytes)))).collect(),
            progress,
            sequential_reader,
            exits_after: setup.exits_after,
            per_file_progress_off: AtomicBool::new(false),
            bytes_read: AtomicU64::new(0),
        }
    }
}

thread_local! {
    static CURRENT: RefCell<Option<Arc<Invocation>>> = const { RefCell::new(None) };
}

/// The invocation this thread works for, to hand to a thread that works for it too.
pub fn current() -> Option<Arc<Invocation>> {
    CURRENT.with(|c| c.borrow().clone())
}

/// Run `f` on this thread as part of `invocation`; the thread's own invocation is back
/// afterwards, also when `f` panics (a rayon thread runs other runs' work too).
pub fn within<T>(invocation: Option<Arc<Invocation>>, f: impl FnOnce() -> T) -> T {
    struct Restore(Option<Arc<Invocation>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let previous = self.0.take();
            CURRENT.with(|c| *c.borrow_mut() = previous);
        }
    }
    let previous = CURRENT.with(|c| std::mem::replace(&mut *c.borrow_mut(), invocation));
    let _restore = Restore(previous);
    f()
}

/// `rayon::join` of two closures that both work for this thread's invocation (rayon may run
/// either on another thread).
pub fn join<A: Send, B: Send>(a: impl FnOnce() -> A + Send, b: impl FnOnce() -> B + Send) -> (A, B) {
    let (for_a, for_b) = (current(), current());
    rayon::join(|| within(for_a, a), || within(for_b, b))
}

/// `f` applied to this thread's invocation, or `default` on a thread with none.
pub(crate) fn with<T>(default: T, f: impl FnOnce(&Invocation) -> T) -> T {
    CURRENT.with(|c| c.borrow().as_deref().map_or(default, f))
}

/// `f` applied to the sink of this thread's invocation, or to `default` on a thread with none.
pub(crate) fn with_sink<T>(default: &Sink, f: impl FnOnce(&Sink) -> T) -> T {
    CURRENT.with(|c| f(c.borrow().as_deref().map_or(default, |i| &i.sink)))
}

/// An input handed to a run as bytes, shared by the loads that read it (a summary may read an
/// input twice).
#[derive(Clone)]
pub struct InMemory(Arc<Vec<u8>>);

impl AsRef<[u8]> for InMemory {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

/// The bytes handed to this run under the name `path`, if any.
pub fn in_memory(path: &Path) -> Option<InMemory> {
    with(None, |i| i.inputs.get(path.as_os_str()).cloned())
}

/// Whether progress may be drawn at all.
pub fn progress_shown() -> bool {
    with(false, |i| i.progress)
}

/// Whether per-file progress may be drawn (progress is shown, and no bar over files is).
pub fn per_file_progress_shown() -> bool {
    with(false, |i| i.progress && !i.per_file_progress_off.load(Ordering::Relaxed))
}

/// No per-file bars from here on in this run (for `batch` and `ranks`).
pub fn per_file_progress_off() {
    with((), |i| i.per_file_progress_off.store(true, Ordering::Relaxed));
}

/// Count `n` more stored bytes read by this run.
pub fn add_bytes_read(n: u64) {
    with((), |i| {
        i.bytes_read.fetch_add(n, Ordering::Relaxed);
    });
}

/// Stored bytes read so far by this run, over all its loads.
pub fn bytes_read() -> u64 {
    with(0, |i| i.bytes_read.load(Ordering::Relaxed))
}

/// `--sequential-reader`.
pub fn sequential_reader() -> bool {
    with(false, |i| i.sequential_reader)
}

/// Whether the process ends right after this run (see [`crate::emit::leave`]).
pub fn exits_after() -> bool {
    with(false, |i| i.exits_after)
}
