//! Writing to stdout and stderr: text with untrusted strings made visible, JSON with terminal
//! characters escaped, markup as it is, and input errors as one line with exit code 2.
//!
//! Every byte the commands write goes through here, to the [`Sink`] of the run the thread works
//! for ([`crate::invocation`]): the process's stdout and stderr, or two buffers that the Python
//! extension hands back. Progress bars are the exception: they draw on the terminal's stderr
//! themselves, and only a run writing to a terminal draws them.

use std::io::Write;
use std::path::Path;

use anyhow::Context as _;
use memsnap_model::{escape_controls, json_safe, printable};

use crate::exit::Exit;
use crate::sink::Sink;

/// Print an error as one line (the cause chain joined by ": ") and return exit code 2.
/// A closed pipe (e.g. `memsnap trace f | head`) is not an error.
pub fn report_error(e: &anyhow::Error) -> Exit {
    if e.chain()
        .any(|c| c.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe))
    {
        return Exit::SUCCESS;
    }
    let mut line = String::from("memsnap: error: ");
    let parts: Vec<String> = e.chain().map(|c| c.to_string()).collect();
    // Drop causes whose text the previous message already contains (thiserror often embeds them).
    let mut shown: Vec<&str> = Vec::new();
    for p in &parts {
        if !shown.iter().any(|s| s.contains(p.as_str())) {
            shown.push(p);
        }
    }
    // The message may quote the input's path and strings from the file (a key path, a value):
    // control and bidi characters, newlines included, are shown as escapes, so it is one line.
    line.push_str(&printable(&shown.join(": ")));
    stderr_line(&line);
    Exit::UNREADABLE
}

/// A path as text output shows it: control and bidi characters as visible escapes
/// ([`memsnap_model::printable`]).
pub fn shown_path(p: &Path) -> String {
    printable(&p.display().to_string()).into_owned()
}

/// Write text output to stdout, treating a closed pipe as success. Untrusted strings in it are
/// escaped where they are formatted ([`memsnap_model::shown`]); as a safety net, any C0 control
/// other than `\n`, DEL or C1 control left in `text` is written as a visible escape too.
pub fn emit(text: &str) -> anyhow::Result<()> {
    emit_raw(&escape_controls(text))
}

/// Write serialized JSON to stdout: the strings keep their values, and the characters that
/// could drive a terminal are written as `\u` escapes ([`memsnap_model::json_safe`]).
pub fn emit_json(json: &str) -> anyhow::Result<()> {
    emit_raw(&json_safe(json))
}

/// Write `text` to stdout as it is (HTML and SVG, which escape their own text).
pub fn emit_raw(text: &str) -> anyhow::Result<()> {
    let mut out = Stdout;
    out.write_all(text.as_bytes()).context("cannot write to stdout")?;
    out.flush().context("cannot write to stdout")?;
    Ok(())
}

/// Write one line to stderr (a warning, a note, a summary line); `line` has no newline. A
/// stderr that cannot be written is not an error: there is nowhere left to say so.
pub fn stderr_line(line: &str) {
    let with_newline = format!("{line}\n");
    with_sink(|sink| sink.write_stderr(with_newline.as_bytes()));
}

/// Whether stdout is a terminal (never for a captured run).
pub fn stdout_is_terminal() -> bool {
    with_sink(Sink::stdout_is_terminal)
}

/// `f` applied to the sink of the run this thread works for (the process's stdio on a thread
/// that works for none).
fn with_sink<T>(f: impl FnOnce(&Sink) -> T) -> T {
    static STDIO: Sink = Sink::Stdio;
    crate::invocation::with_sink(&STDIO, f)
}

/// Stdout of the run this thread works for, as a writer, for output written as it is built
/// (JSON documents). No escaping of its own: what is written must be safe already.
pub struct Stdout;

impl Write for Stdout {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.write_all(buf)?;
        Ok(buf.len())
    }
    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        with_sink(|sink| sink.write_stdout(buf))
    }
    fn flush(&mut self) -> std::io::Result<()> {
        with_sink(Sink::flush_stdout)
    }
}

/// Leave a command's big values to the operating system instead of freeing them: the process
/// ends right after, and unmapping its memory at exit is far quicker than freeing millions of
/// allocations one by one (0.1 s for a 1 GB snapshot). Only for the last value a one-file
/// command holds, never inside `batch`. A run that the process outlives (the Python extension)
/// frees them as usual.
pub fn leave<T>(value: T) {
    if crate::invocation::exits_after() {
        std::mem::forget(value);
    }
}
