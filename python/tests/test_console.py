"""The `memsnap` console script is the binary: same output, same exit status."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import DEV, LEAK, ROOT, Cli

CASES = [
    [],
    ["--help"],
    ["--version"],
    ["analyze", "--help"],
    ["bogus"],
    ["analyze"],
    ["analyze", LEAK],
    ["analyze", LEAK, "--json"],
    ["summary", DEV[0]],
    ["timeline", DEV[0], "--csv", "--every", "50"],
    ["check", LEAK, "--fail-on", "leaks"],
    ["check", DEV[0], "--max-peak", "20GiB"],
    ["analyze", "fixtures/hostile/truncated_at_100.pickle"],
    ["analyze", "no/such.pickle"],
    ["batch", DEV[0], "fixtures/hostile/empty.pickle"],
    ["diff", DEV[0], LEAK],
    ["docs"],
    ["completions", "bash"],
]


@pytest.mark.parametrize("args", CASES, ids=lambda a: " ".join(a) or "(none)")
def test_console_script_equals_the_binary(cli: Cli, console_script: Path, args: list) -> None:
    want = cli.run(args)
    got = subprocess.run([str(console_script), *args], capture_output=True, cwd=ROOT, timeout=300, check=False)
    assert (got.returncode, got.stdout, got.stderr) == (want.returncode, want.stdout, want.stderr)


def test_stdin(cli: Cli, console_script: Path) -> None:
    data = Path(DEV[1]).read_bytes()
    want = cli.run(["summary", "-", "--json"], stdin=data)
    got = subprocess.run([str(console_script), "summary", "-", "--json"], input=data, capture_output=True, check=False)
    assert want.returncode == 0 and (got.returncode, got.stdout, got.stderr) == (0, want.stdout, want.stderr)


def test_codes_are_the_documented_ones(console_script: Path) -> None:
    def code(*args: str) -> int:
        return subprocess.run([str(console_script), *args], capture_output=True, cwd=ROOT, check=False).returncode

    assert code("analyze", DEV[0]) == 0
    assert code("check", LEAK, "--fail-on", "leaks") == 1
    assert code("analyze", "fixtures/hostile/empty.pickle") == 2


def test_ctrl_c_ends_it_as_it_ends_the_binary(cli: Cli, console_script: Path) -> None:
    for program in (str(cli.path), str(console_script)):
        # SIGINT as a terminal's job has it (a background job of a script inherits it ignored).
        p = subprocess.Popen(
            [program, "batch", "fixtures", "--jobs", "1"],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        time.sleep(1.0)
        if p.poll() is not None:
            pytest.skip("the batch ended before it could be interrupted")
        p.send_signal(signal.SIGINT)
        assert p.wait(timeout=30) == -signal.SIGINT, program


def test_an_ignored_ctrl_c_is_ignored_as_by_the_binary(cli: Cli, console_script: Path) -> None:
    want = cli.run(["batch", "fixtures/dev", "--jobs", "1"])
    for program in (str(cli.path), str(console_script)):
        p = subprocess.Popen(
            [program, "batch", "fixtures/dev", "--jobs", "1"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
        )
        time.sleep(0.3)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=120)
        assert (p.returncode, out, err) == (want.returncode, want.stdout, want.stderr), program


def test_importing_memsnap_imports_neither_torch_nor_numpy() -> None:
    code = "import sys, memsnap; print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env={**os.environ})
    assert out.stdout.strip() == "[]"
