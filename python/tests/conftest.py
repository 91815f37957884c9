"""What the tests of the Python package share: the repository's fixtures, and the command-line
binary the package's results are compared with.

The binary is ``$MEMSNAP_BIN`` (tests/python/main.rs sets it to the one cargo built), else the
``ci`` build under ``$CARGO_TARGET_DIR`` or ``target/``. Tests run in the repository's root, so
that relative paths, which both sides print, are the same."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import List, Optional

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "fixtures"
#: The shared data folder beside the checkout (CI has it).
SHARED = ROOT.parent / "shared"

#: The bundled real snapshots: relative paths, as the tests pass them to both sides.
DEV = sorted(str(p.relative_to(ROOT)) for p in (FIXTURES / "dev").glob("*.pickle.xz"))
#: The README's example: a training loop that keeps its losses with their graphs.
LEAK = "fixtures/dev/s03_loss_history_leak.pickle.xz"
#: A clean run: no suspects.
CLEAN = "fixtures/dev/s01_clean_train.pickle.xz"


def _binary() -> Optional[Path]:
    named = os.environ.get("MEMSNAP_BIN")
    if named:
        return Path(named)
    targets = [Path(os.environ["CARGO_TARGET_DIR"])] if os.environ.get("CARGO_TARGET_DIR") else []
    for target in [*targets, ROOT / "target"]:
        if (target / "ci" / "memsnap").is_file():
            return target / "ci" / "memsnap"
    return None


@pytest.fixture(autouse=True)
def _in_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)


class Cli:
    """The ``memsnap`` binary, run as a subprocess."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def run(self, args: List[str], stdin: Optional[bytes] = None) -> "subprocess.CompletedProcess[bytes]":
        return subprocess.run(
            [str(self.path), *args], input=stdin, capture_output=True, cwd=ROOT, timeout=300, check=False
        )

    def json(self, args: List[str]) -> object:
        import json

        done = self.run(args)
        assert done.returncode == 0, done.stderr.decode()
        return json.loads(done.stdout)


@pytest.fixture(scope="session")
def cli() -> Cli:
    path = _binary()
    if path is None or not path.is_file():
        pytest.skip("no memsnap binary to compare with: set MEMSNAP_BIN or run cargo build --profile ci")
    return Cli(path)


@pytest.fixture(scope="session")
def console_script() -> Path:
    """The ``memsnap`` console script this interpreter's environment installed."""
    path = Path(sys.executable).parent / "memsnap"
    if not path.is_file():
        pytest.skip(f"no memsnap console script beside {sys.executable}: the wheel is not installed")
    return path


def error_message(stderr: bytes) -> str:
    """The CLI's error line without its ``memsnap: error: `` prefix."""
    lines = [line for line in stderr.decode().splitlines() if line.startswith("memsnap: error: ")]
    assert len(lines) == 1, stderr
    return lines[0][len("memsnap: error: ") :]
