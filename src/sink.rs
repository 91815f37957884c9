//! Where a run's output goes: the process's stdout and stderr, or two buffers the Python
//! extension hands back when the run is over. [`crate::emit`] writes to the sink of the run a
//! thread works for; [`crate::invocation`] holds it.

use std::io::{IsTerminal, Write};
use std::sync::Mutex;

/// Where a run's output goes.
pub enum Sink {
    /// The process's stdout and stderr.
    Stdio,
    /// Kept in memory, for the caller to take when the run is over.
    Captured { stdout: Mutex<Vec<u8>>, stderr: Mutex<Vec<u8>> },
}

impl Sink {
    pub fn captured() -> Sink {
        Sink::Captured { stdout: Mutex::new(Vec::new()), stderr: Mutex::new(Vec::new()) }
    }

    /// What a captured run wrote to (stdout, stderr); empty for the process's stdio.
    pub fn take(&self) -> (Vec<u8>, Vec<u8>) {
        match self {
            Sink::Stdio => (Vec::new(), Vec::new()),
            Sink::Captured { stdout, stderr } => (take_buffer(stdout), take_buffer(stderr)),
        }
    }

    pub(crate) fn write_stdout(&self, bytes: &[u8]) -> std::io::Result<()> {
        match self {
            Sink::Stdio => std::io::stdout().lock().write_all(bytes),
            Sink::Captured { stdout, .. } => {
                lock(stdout).extend_from_slice(bytes);
                Ok(())
            }
        }
    }

    pub(crate) fn flush_stdout(&self) -> std::io::Result<()> {
        match self {
            Sink::Stdio => std::io::stdout().lock().flush(),
            Sink::Captured { .. } => Ok(()),
        }
    }

    pub(crate) fn write_stderr(&self, bytes: &[u8]) {
        match self {
            Sink::Stdio => {
                let _ = std::io::stderr().lock().write_all(bytes);
            }
            Sink::Captured { stderr, .. } => lock(stderr).extend_from_slice(bytes),
        }
    }

    pub(crate) fn stdout_is_terminal(&self) -> bool {
        matches!(self, Sink::Stdio) && std::io::stdout().is_terminal()
    }

    pub(crate) fn stderr_is_terminal(&self) -> bool {
        matches!(self, Sink::Stdio) && std::io::stderr().is_terminal()
    }
}

/// A buffer's lock; a thread that panicked while appending to it (it cannot: appending does not
/// panic but for want of memory) leaves bytes that are still worth handing back.
fn lock(buffer: &Mutex<Vec<u8>>) -> std::sync::MutexGuard<'_, Vec<u8>> {
    buffer.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn take_buffer(buffer: &Mutex<Vec<u8>>) -> Vec<u8> {
    std::mem::take(&mut *lock(buffer))
}
