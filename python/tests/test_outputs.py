"""Reports, flamegraphs and the check gate from Python equal the command line's."""

from __future__ import annotations

from pathlib import Path

from conftest import DEV, LEAK, Cli

import memsnap


def test_report_and_flamegraph_are_the_cli_files(cli: Cli, tmp_path: Path) -> None:
    a = memsnap.analyze(LEAK)
    for name, extra in (("r.html", []), ("r_static.html", ["--static"]), ("r.svg", [])):
        want, got = tmp_path / f"cli_{name}", tmp_path / name
        assert cli.run(["report", LEAK, "-o", str(want), *extra]).returncode == 0
        assert a.report(got, static="--static" in extra) == got
        assert got.read_bytes() == want.read_bytes(), name
    for name, extra in (("f.svg", []), ("f.folded", ["--folded"]), ("f_end.svg", ["--at", "end"])):
        want, got = tmp_path / f"cli_{name}", tmp_path / name
        assert cli.run(["flamegraph", LEAK, "-o", str(want), *extra]).returncode == 0
        at = "end" if "end" in extra else "peak"
        assert a.flamegraph(got, folded="--folded" in extra, at=at) == got
        assert got.read_bytes() == want.read_bytes(), name


def test_report_of_bytes(tmp_path: Path) -> None:
    out = memsnap.analyze(Path(LEAK).read_bytes()).report(tmp_path / "bytes.html")
    page = out.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and "&lt;bytes&gt;" in page


def test_check_returns_failures_and_passes(cli: Cli) -> None:
    failed = memsnap.check(LEAK, fail_on="leaks", max_peak="1GiB")
    done = cli.run(["check", LEAK, "--fail-on", "leaks", "--max-peak", "1GiB"])
    assert (failed.passed, failed.code) == (False, 1) == (False, done.returncode)
    assert "\n".join(failed.failures) + "\n" == done.stdout.decode()
    assert failed.summary == done.stderr.decode().strip()
    passed = memsnap.check(DEV[0], max_peak=20 << 30, fail_on=["oom", "fragmentation"])
    assert (passed.passed, passed.code, passed.failures) == (True, 0, ())
    assert passed.summary.endswith("passed (2 gates)")
