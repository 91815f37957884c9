//! One module per subcommand. Each has `Args` (clap) and `run(&Args) -> anyhow::Result<ExitCode>`.
//! Errors that reach `main` are input errors: one line on stderr, exit code 2.

pub mod analyze;
pub mod batch;
pub mod check;
pub mod diff;
pub mod flamegraph;
pub mod report;
pub mod segments;
pub mod summary;
pub mod timeline;
pub mod trace;

use std::io::Write;
use std::process::ExitCode;

/// Print an error as one line (the cause chain joined by ": ") and return exit code 2.
/// A closed pipe (e.g. `memsnap trace f | head`) is not an error.
pub fn report_error(e: &anyhow::Error) -> ExitCode {
    if e.chain()
        .any(|c| c.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe))
    {
        return ExitCode::SUCCESS;
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
    line.push_str(&shown.join(": ").replace('\n', " "));
    let _ = writeln!(std::io::stderr(), "{line}");
    ExitCode::from(2)
}

/// Write `text` to stdout, treating a closed pipe as success.
pub fn emit(text: &str) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()?;
    Ok(())
}
