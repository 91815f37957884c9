//! memsnap's command line as a library, so that the binary (`src/main.rs`) and the Python
//! extension (`crates/memsnap-python`) run the same commands: [`main_with`] as the binary does,
//! [`embed`] inside another program. Thin glue over the library crates; the only part of
//! memsnap that touches files, the environment and the terminal.

mod args;
mod cli;
mod cmd;
mod discovery;
pub mod embed;
mod emit;
mod exit;
mod input;
mod invocation;
mod job;
mod json;
mod json_stream;
mod load;
mod moment;
mod output;
mod parallel_file;
mod pipeline;
mod progress;
mod read_ahead;
mod sink;
mod size;
mod text;

use std::ffi::OsString;

/// Run the command line `args` (the program name first) as the `memsnap` binary: output to the
/// process's stdout and stderr, and the process ends right after, so big values are left to its
/// exit instead of freed (`emit::leave`).
pub fn main_with<I, T>(args: I) -> std::process::ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<OsString>,
{
    let setup =
        invocation::Setup { sink: std::sync::Arc::new(sink::Sink::Stdio), inputs: Vec::new(), exits_after: true };
    cli::run(args.into_iter().map(Into::into).collect(), setup).into()
}
