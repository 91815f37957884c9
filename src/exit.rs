//! How a command ends: its exit status, as a value the library can hand to a caller
//! (`std::process::ExitCode` cannot be read back, and the Python extension returns the number).

/// A command's exit status. The CLI's meanings: 0 success, 1 a `check` gate failed, 2 unreadable
/// input or a usage error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Exit(u8);

impl Exit {
    pub const SUCCESS: Exit = Exit(0);
    /// A `check` gate failed.
    pub const GATE_FAILED: Exit = Exit(1);
    /// An input could not be read (or the command line was malformed).
    pub const UNREADABLE: Exit = Exit(2);

    /// The status as a number, for a caller other than `main`.
    pub fn code(self) -> u8 {
        self.0
    }

    /// A status clap chose (0 for `--help` and `--version`, 2 for a usage error).
    pub(crate) fn from_clap(code: i32) -> Exit {
        Exit(u8::try_from(code).unwrap_or(2))
    }
}

impl From<Exit> for std::process::ExitCode {
    fn from(e: Exit) -> std::process::ExitCode {
        std::process::ExitCode::from(e.0)
    }
}
