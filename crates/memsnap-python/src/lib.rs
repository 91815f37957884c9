//! `memsnap._native`: memsnap's command line run inside the Python process. The Python package
//! (`python/memsnap`) builds its API on these two functions.
//!
//! Both run the command on a thread of their own (with the 8 MiB stack the binary's main thread
//! has) while the calling thread waits without the GIL, so other Python threads run meanwhile,
//! and several commands may run at once. Ctrl-C: the waiting thread wakes every
//! [`SIGNAL_CHECK`] to let Python's signal handlers run, so a `KeyboardInterrupt` (or whatever a
//! handler raises) is raised in the caller at once; the command itself cannot be stopped from
//! outside and runs on to its end on its own thread, its result dropped (an `-o` file it was
//! writing is then still written, whole, as the binary writes it).

use std::collections::HashMap;
use std::sync::mpsc;
use std::time::Duration;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// How often a waiting call lets Python's signal handlers run.
const SIGNAL_CHECK: Duration = Duration::from_millis(100);

/// The stack of the thread a command runs on: the binary's main thread's (the reader and the
/// replay were measured on it).
const STACK_SIZE: usize = 8 << 20;

/// Run `work` on a new thread and wait for it without the GIL, raising what a signal handler
/// raises meanwhile (see the module documentation), or a `RuntimeError` when it panicked.
fn run_waiting<T: Send + 'static>(py: Python<'_>, work: impl FnOnce() -> T + Send + 'static) -> PyResult<T> {
    let (tx, mut rx) = mpsc::channel();
    let worker = std::thread::Builder::new()
        .name("memsnap".into())
        .stack_size(STACK_SIZE)
        .spawn(move || {
            let _ = tx.send(work());
        })
        .map_err(|e| PyRuntimeError::new_err(format!("memsnap: cannot start a thread: {e}")))?;
    loop {
        // The receiver goes into the closure and back (it may be moved to another thread, not
        // shared with one).
        let (back, received) = py.detach(move || {
            let received = rx.recv_timeout(SIGNAL_CHECK);
            (rx, received)
        });
        rx = back;
        match received {
            Ok(result) => {
                let _ = py.detach(|| worker.join());
                return Ok(result);
            }
            Err(mpsc::RecvTimeoutError::Timeout) => py.check_signals()?,
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                // The thread ended without a result: it panicked (a bug in memsnap).
                let panic = py.detach(|| worker.join()).err();
                let what = panic
                    .as_ref()
                    .and_then(|p| {
                        p.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| p.downcast_ref::<String>().cloned())
                    })
                    .unwrap_or_default();
                return Err(PyRuntimeError::new_err(format!("memsnap: internal error (a bug in memsnap): {what}")));
            }
        }
    }
}

/// Run a command line (`argv[0]` is the program name, e.g. `["memsnap", "analyze", "f.pickle"]`)
/// on the process's stdout and stderr, as the `memsnap` binary would; returns its exit status.
#[pyfunction]
fn run(py: Python<'_>, argv: Vec<String>) -> PyResult<u8> {
    run_waiting(py, move || memsnap::embed::run_stdio(argv))
}

/// Run a command line (`argv[0]` is the program name) with its output captured; `inputs` maps
/// input names the command line uses to their bytes (`bytes` or `bytearray`, copied once), read
/// instead of files of those names.
/// Returns `(exit status, stdout, stderr)`.
#[pyfunction]
#[pyo3(signature = (argv, inputs = HashMap::new()))]
fn run_captured<'py>(
    py: Python<'py>,
    argv: Vec<String>,
    inputs: HashMap<String, Vec<u8>>,
) -> PyResult<(u8, Bound<'py, PyBytes>, Bound<'py, PyBytes>)> {
    let inputs = inputs.into_iter().collect();
    let captured = run_waiting(py, move || memsnap::embed::run_captured(argv, inputs))?;
    Ok((captured.code, PyBytes::new(py, &captured.stdout), PyBytes::new(py, &captured.stderr)))
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(run, m)?)?;
    m.add_function(wrap_pyfunction!(run_captured, m)?)?;
    Ok(())
}
