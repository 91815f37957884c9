//! Running the command line inside another program (the Python extension): a run's output
//! captured in memory, inputs handed over as bytes, and what a command holds freed when it ends
//! (the program goes on). Several runs may go on at once on different threads: each has its own
//! output and inputs ([`crate::invocation`]).

use std::sync::Arc;

use crate::invocation::Setup;
use crate::sink::Sink;

/// What a captured run wrote, and its exit status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Captured {
    /// 0 success, 1 a `check` gate failed, 2 unreadable input or a usage error.
    pub code: u8,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

/// Run the command line `args` (the program name first) with its stdout and stderr captured.
/// Each `(name, bytes)` of `inputs` is read wherever the command line names an input `name`,
/// instead of a file of that name (and errors name it so, e.g. `<bytes>: …`); inputs found in
/// directories or by patterns (`batch`, `ranks`) are always files. No progress is drawn, and
/// `--help` or a malformed command line is answered in the captured output.
pub fn run_captured(args: Vec<String>, inputs: Vec<(String, Vec<u8>)>) -> Captured {
    let sink = Arc::new(Sink::captured());
    let setup = Setup {
        sink: sink.clone(),
        inputs: inputs.into_iter().map(|(name, bytes)| (name.into(), bytes)).collect(),
        exits_after: false,
    };
    let exit = crate::cli::run(args.into_iter().map(Into::into).collect(), setup);
    let (stdout, stderr) = sink.take();
    Captured { code: exit.code(), stdout, stderr }
}

/// Run the command line `args` (the program name first) on the process's stdout and stderr, as
/// the binary does, but freeing what the command held: for a console script in a process that
/// may go on. Returns the exit status.
pub fn run_stdio(args: Vec<String>) -> u8 {
    let setup = Setup { sink: Arc::new(Sink::Stdio), inputs: Vec::new(), exits_after: false };
    crate::cli::run(args.into_iter().map(Into::into).collect(), setup).code()
}
