//! The Python package's tests (python/tests, pytest) as part of the one test command: they run
//! in the virtual environment `$MEMSNAP_PYTHON_VENV` (default `target/python-venv`, which
//! `.ci/run` makes and installs the wheel into), against the binary cargo built
//! (`MEMSNAP_BIN`), and this test fails when pytest does.
//!
//! Without that environment, or without the package installed in it, the test prints a note
//! and passes. The wheel is built from the source as it was when it was installed: after a
//! change to the Rust code, rebuild it (the note says how) or the comparisons with the binary
//! fail.
//!
//! The notes and pytest's summary are written to stderr past libtest's capture, so they show
//! in a passing run too.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// How to make the environment the tests need, for the notes.
const SETUP: &str = "python3 -m venv target/python-venv && target/python-venv/bin/pip install maturin pytest numpy \
     && target/python-venv/bin/maturin build --profile ci -o target/wheels \
     && target/python-venv/bin/pip install --force-reinstall target/wheels/memsnap-*.whl";

/// A line on the real stderr (not libtest's capture).
fn note(text: &str) {
    let _ = writeln!(std::io::stderr(), "{text}");
}

fn venv() -> PathBuf {
    std::env::var_os("MEMSNAP_PYTHON_VENV").map_or_else(|| root().join("target/python-venv"), PathBuf::from)
}

/// Whether `python` finds the `memsnap` package at all (a broken install is not "absent").
fn has_package(python: &Path) -> bool {
    let probe = "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('memsnap') else 3)";
    Command::new(python).args(["-c", probe]).current_dir(std::env::temp_dir()).status().is_ok_and(|s| s.success())
}

#[test]
fn python_package_tests_pass() {
    let venv = venv();
    let python = venv.join("bin/python");
    if !python.is_file() {
        note(&format!("note: no Python environment at {}: skipping the Python tests ({SETUP})", venv.display()));
        return;
    }
    // Probed from outside the checkout, where python/ is not on the path: the installed wheel.
    if !has_package(&python) {
        note(&format!("note: memsnap is not installed in {}: skipping the Python tests ({SETUP})", venv.display()));
        return;
    }
    let out = Command::new(&python)
        .args(["-m", "pytest", "python/tests", "-q", "-rs", "-p", "no:cacheprovider"])
        .current_dir(root())
        .env("MEMSNAP_BIN", env!("CARGO_BIN_EXE_memsnap"))
        .output()
        .expect("run pytest");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success(),
        "pytest failed ({}); the tests run the wheel installed in {}, rebuilt with: {SETUP}\n{text}",
        out.status,
        venv.display()
    );
    // The skip reasons and the count, e.g. "271 passed, 3 skipped in 72.17s".
    let summary: Vec<&str> =
        text.lines().filter(|l| l.starts_with("SKIPPED") || (l.contains(" passed") && l.contains(" in "))).collect();
    note(&format!("python/tests (pytest in {}):\n  {}", venv.display(), summary.join("\n  ")));
}
