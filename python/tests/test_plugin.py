"""Tests of the pytest plugin (``memsnap.pytest_plugin``, the ``gpu_memory`` marker).

Without a GPU: the marker and options are registered, a bad marker is a usage error, a marked
test is skipped with the reason where PyTorch is missing, sizes parse as ``src/size.rs`` does
(and as the CLI does, checked through it), the verdict and the failure message on fixtures with
known leaks, and the whole flow in a pytester run, with a stand-in for torch that dumps a
fixture (``test_record.make_fake_torch``): a leaking marked test fails with check's verdict,
a clean one passes, files are kept or deleted. ``test_real_*`` run on a CUDA device.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import re
import sys
import types
from pathlib import Path
from typing import Any, Callable, Optional

import pytest

from memsnap import _native
from memsnap._sizes import U64_MAX, parse_size
from memsnap.pytest_plugin import (
    FAIL_ON_KINDS,
    FAIL_ON_NAMES,
    FAIL_ON_SEVERITIES,
    CheckError,
    Limits,
    artifact_stem,
    check_snapshot,
    failure_message,
    limits_from_marker,
)

pytest_plugins = ["pytester"]

HERE = Path(__file__).resolve().parent
FIXTURES = HERE.parents[1] / "fixtures"
LEAK = FIXTURES / "extra2" / "y05_metrics_leak.pickle.xz"
LEAK_TRUTH = json.loads((FIXTURES / "extra2" / "y05_metrics_leak.truth.json").read_text())
CLEAN = FIXTURES / "dev" / "s01_clean_train.pickle.xz"
CLEAN_TRUTH = json.loads((FIXTURES / "dev" / "s01_clean_train.truth.json").read_text())
TRUNCATED = FIXTURES / "hostile" / "truncated_p2_at_2001.pickle"


def _load_test_record() -> types.ModuleType:
    """test_record.py, loaded by path (for its torch stand-in) whatever pytest's import mode."""
    spec = importlib.util.spec_from_file_location("_memsnap_test_record", HERE / "test_record.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


make_fake_torch: Callable[..., types.ModuleType] = _load_test_record().make_fake_torch


def _plugin_args() -> list[str]:
    """``-p memsnap.pytest_plugin`` unless the installed distribution's entry point loads it."""
    eps: Any = importlib.metadata.entry_points()
    eps = eps.select(group="pytest11") if hasattr(eps, "select") else eps.get("pytest11", [])
    if any(ep.name == "memsnap" and ep.value == "memsnap.pytest_plugin" for ep in eps):
        return []
    return ["-p", "memsnap.pytest_plugin"]


def _cli(*argv: str) -> tuple[int, str, str]:
    """``memsnap ARGV...`` run in this process: (exit status, stdout, stderr)."""
    code, out, err = _native.run_captured(["memsnap", *argv], {})
    return code, bytes(out).decode(), bytes(err).decode()


# -- sizes -----------------------------------------------------------------------------------

# The cases of src/size.rs's tests, and a few more.
SIZE_CASES = [
    ("0", 0),
    ("1048576", 1 << 20),
    ("12B", 12),
    ("1KiB", 1024),
    ("1kb", 1000),
    ("500MB", 500_000_000),
    ("500 MiB", 500 << 20),
    ("1GiB", 1 << 30),
    ("1GB", 1_000_000_000),
    ("1.5G", 1_610_612_736),
    ("1.5g", 1_610_612_736),
    ("2T", 2 << 40),
    (".5K", 512),
    ("1.", 1),
    ("0.0001KB", 0),
    ("0.0005KB", 1),
    (" 20GiB ", 20 << 30),
    ("18446744073709551615", U64_MAX),
    ("2GiB", 2 << 30),
    ("512MB", 512_000_000),
    ("1.25 gib", 1_342_177_280),
]
SIZE_REJECTS = [
    "",
    "GiB",
    ".",
    "1..5G",
    "1.5.2G",
    "-1",
    "1e9",
    "1 GiBs",
    "1 Mbit",
    "18446744073709551616",
    "99999999999999999999.999999999999999999P",
    "1\u212aiB",  # the Kelvin sign, which str.lower() would fold to "k"
    "\u0661",  # an Arabic-Indic digit one, which str.isdigit() accepts
]


@pytest.mark.parametrize("text, value", SIZE_CASES)
def test_parse_size(text: str, value: int) -> None:
    assert parse_size(text) == value


@pytest.mark.parametrize("text", SIZE_REJECTS)
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="invalid size"):
        parse_size(text)


def test_sizes_agree_with_the_cli() -> None:
    """check prints a failed limit's bytes: every size below the clean fixture's peak, parsed
    by the CLI, is the byte count parse_size gives, and every rejected one is rejected there."""
    peak = CLEAN_TRUTH["at_dump"]["max_allocated"]
    for text, value in SIZE_CASES:
        if value >= peak:
            continue
        code, out, _ = _cli("check", str(CLEAN), f"--max-peak={text}")
        assert code == 1, (text, out)
        assert "> limit " in out and out.rstrip().endswith(f"({value} bytes)"), (text, out)
    for text in SIZE_REJECTS:
        code, _, err = _cli("check", str(CLEAN), f"--max-peak={text}")
        assert code == 2 and "invalid size" in err, (text, err)


def test_fail_on_names_agree_with_the_cli() -> None:
    code, _, err = _cli("check", str(CLEAN), "--fail-on", "bogus")
    assert code == 2
    m = re.search(r"valid kinds: ([a-z_, ]+); severities: ([a-z, ]+); or leaks \(= leak\), all", err)
    assert m, err
    assert tuple(m.group(1).split(", ")) == FAIL_ON_KINDS
    assert tuple(m.group(2).split(", ")) == FAIL_ON_SEVERITIES
    for name in FAIL_ON_NAMES:
        code, _, err = _cli("check", str(CLEAN), "--fail-on", name)
        assert code in (0, 1), (name, err)


# -- the marker's arguments ----------------------------------------------------------------


def test_limits_from_marker() -> None:
    lim = limits_from_marker((), {"max_peak": "2GiB", "fail_on": "leaks, oom"})
    assert lim == Limits(max_peak="2GiB", fail_on=("leaks", "oom"))
    assert lim.max_peak_bytes == 2 << 30
    assert lim.check_argv("s.pickle") == ["check", "s.pickle", "--max-peak", "2GiB", "--fail-on", "leaks,oom"]
    lim = limits_from_marker((), {"max_reserved": 1 << 30, "fail_on": ["leaks", "fragmentation,leaks"], "stacks": "all"})
    assert lim.check_argv("s") == ["check", "s", "--max-reserved", "1073741824", "--fail-on", "leaks,fragmentation"]
    assert (lim.stacks, lim.max_entries, lim.context) == ("all", 100_000, "all")
    assert lim.describe() == "max_reserved='1073741824', fail_on='leaks,fragmentation'"


@pytest.mark.parametrize(
    "args, kwargs, message",
    [
        ((), {}, "needs at least one gate"),
        (("2GiB",), {}, "keyword arguments only"),
        ((), {"max_peek": "2GiB"}, "unknown argument"),
        ((), {"max_peak": "2 GiBs"}, 'max_peak: invalid size "2 GiBs"'),
        ((), {"max_peak": -1}, "cannot be negative"),
        ((), {"max_peak": True}, "must be a size"),
        ((), {"max_peak": 2.5}, "must be a size"),
        ((), {"max_reserved": "1e9"}, 'max_reserved: invalid size "1e9"'),
        ((), {"fail_on": "leakz"}, "unknown suspect kind or severity 'leakz'"),
        ((), {"fail_on": " , "}, "no suspect kind given"),
        ((), {"fail_on": 3}, "must be a str or a list"),
        ((), {"fail_on": "leaks", "max_entries": 0}, "max_entries must be"),
        ((), {"fail_on": "leaks", "stacks": "cpp"}, "stacks must be"),
        ((), {"fail_on": "leaks", "context": "x"}, "context must be"),
    ],
)
def test_bad_marker_arguments(args: tuple, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        limits_from_marker(args, kwargs)


def test_artifact_stem() -> None:
    assert artifact_stem("tests/test_x.py::test_y") == "tests_test_x.py__test_y"
    a, b = artifact_stem("t.py::test[a/b]"), artifact_stem("t.py::test[a_b]")
    assert a != b and a.startswith("t.py__test_a_b-") and re.fullmatch(r"[A-Za-z0-9._-]+", a)
    assert len(artifact_stem("t.py::" + "x" * 500)) == 129


# -- the verdict on fixtures ---------------------------------------------------------------


def test_verdict_on_a_leak() -> None:
    """y05 keeps a softmax output per step in a list (line 22, reference_leak); its peak is
    the live process' max_memory_allocated()."""
    peak = LEAK_TRUTH["at_dump"]["max_allocated"]
    planted = LEAK_TRUTH["planted"][0]
    lim = limits_from_marker((), {"max_peak": "100MiB", "fail_on": "leaks"})
    v = check_snapshot(LEAK, lim)
    assert not v.passed
    assert len(v.failures) == 2, v.failures
    assert v.failures[0].startswith("max-peak failed: device 0 peak allocated ")
    assert v.failures[0].endswith(f"({peak} bytes) > limit 100.00 MiB (104857600 bytes)")
    m = re.fullmatch(
        r"fail-on (\w+) \(leak\) found: device 0, [0-9.]+ [KMG]iB at (.+):(\d+) in (\w+) \(confidence [0-9.]+\)",
        v.failures[1],
    )
    assert m, v.failures[1]
    assert m.group(1) == planted["kind"]
    assert Path(m.group(2)).name == "y05_metrics_leak.py" and int(m.group(3)) == planted["line"]
    assert m.group(4) == "update"
    assert v.summary.endswith("FAILED (2 failures)")
    # The lines are check's own, less the path in front of each.
    code, out, _ = _cli(*lim.check_argv(str(LEAK)))
    assert code == 1
    assert out.splitlines() == [f"{LEAK}: {line}" for line in v.failures]


def test_failure_message() -> None:
    lim = limits_from_marker((), {"max_peak": "100MiB", "fail_on": "leaks"})
    v = check_snapshot(LEAK, lim)
    msg = failure_message(
        "tests/test_train.py::test_steps",
        lim,
        v,
        {"snapshot": ".memsnap/t.pickle", "report": ".memsnap/t.html"},
    )
    assert msg.splitlines() == [
        "GPU memory check failed for tests/test_train.py::test_steps (2 failures; max_peak='100MiB', fail_on='leaks'):",
        "  " + v.failures[0],
        "  " + v.failures[1],
        "snapshot: .memsnap/t.pickle",
        "report: .memsnap/t.html",
        "check: memsnap check .memsnap/t.pickle --max-peak 100MiB --fail-on leaks",
        "explain: memsnap analyze .memsnap/t.pickle",
    ]


def test_verdict_clean_passes() -> None:
    v = check_snapshot(CLEAN, limits_from_marker((), {"max_peak": "1GiB", "fail_on": "leaks"}))
    assert v.passed and v.failures == () and v.summary.endswith("passed (2 gates)")


def test_verdict_peak_limit_only() -> None:
    peak = CLEAN_TRUTH["at_dump"]["max_allocated"]
    assert check_snapshot(CLEAN, limits_from_marker((), {"max_peak": peak})).passed  # equal passes
    v = check_snapshot(CLEAN, limits_from_marker((), {"max_peak": peak - 1}))
    assert v.failures == (
        f"max-peak failed: device 0 peak allocated 397.87 MiB ({peak} bytes) > limit 397.87 MiB ({peak - 1} bytes)",
    )


def test_verdict_unreadable_snapshot() -> None:
    with pytest.raises(CheckError, match="pickle error at byte 2001"):
        check_snapshot(TRUNCATED, limits_from_marker((), {"fail_on": "leaks"}))


# -- pytest runs -----------------------------------------------------------------------------


def test_marker_and_options_are_registered(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest(*_plugin_args(), "--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.gpu_memory(max_peak=*fail_on=*"])
    result = pytester.runpytest(*_plugin_args(), "--help")
    result.stdout.fnmatch_lines(["*--memsnap-dir=DIR*", "*--memsnap-keep*", "*--memsnap-require-gpu*"])
    # --strict-markers accepts it: it is registered.
    pytester.makepyfile(
        "import pytest\n@pytest.mark.gpu_memory(fail_on='leaks')\ndef test_a():\n    pass\n"
    )
    result = pytester.runpytest(*_plugin_args(), "--strict-markers", "--collect-only", "-q")
    assert result.ret == 0, result.stdout.str()


def test_entry_point_is_installed() -> None:
    try:
        dist = importlib.metadata.distribution("memsnap")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("memsnap is not installed as a distribution (running from a source tree)")
    eps = [ep for ep in dist.entry_points if ep.group == "pytest11"]
    assert [(ep.name, ep.value) for ep in eps] == [("memsnap", "memsnap.pytest_plugin")]


def test_skipped_without_torch(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.gpu_memory(max_peak="2GiB", fail_on="leaks")
        def test_marked():
            raise AssertionError("must not run without torch")

        def test_plain():
            pass
        """
    )
    result = pytester.runpytest(*_plugin_args(), "-rs")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED*memsnap gpu_memory: PyTorch is not installed*"])
    assert not (pytester.path / ".memsnap").exists()
    result = pytester.runpytest(*_plugin_args(), "--memsnap-require-gpu")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*PyTorch is not installed*(--memsnap-require-gpu)*"])


def test_skipped_without_cuda(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", make_fake_torch(CLEAN, cuda_available=False))
    pytester.makepyfile(
        "import pytest\n@pytest.mark.gpu_memory(fail_on='leaks')\ndef test_marked():\n    pass\n"
    )
    result = pytester.runpytest(*_plugin_args(), "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED*no CUDA device (torch.cuda.is_available() is False*"])


@pytest.mark.parametrize(
    "marker, message",
    [
        ('max_peak="2 GiBs"', 'max_peak: invalid size "2 GiBs": expected a number of bytes'),
        ('fail_on="leakz"', "fail_on: unknown suspect kind or severity 'leakz'"),
        ("", "needs at least one gate"),
    ],
)
def test_bad_marker_is_a_usage_error(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, marker: str, message: str
) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # found before anything would need torch
    pytester.makepyfile(
        test_bad=f"import pytest\n@pytest.mark.gpu_memory({marker})\ndef test_marked():\n    pass\n"
        "def test_plain():\n    pass\n"
    )
    result = pytester.runpytest(*_plugin_args())
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*test_bad.py::test_marked: @pytest.mark.gpu_memory: {message}*"])
    result.stdout.no_fnmatch_line("*passed*")


FLOW_TESTS = """
import pytest
import torch

LEAK = {leak!r}
CLEAN = {clean!r}

@pytest.mark.gpu_memory(max_peak="100MiB", fail_on="leaks")
def test_leaky():
    torch.fake.snapshot = LEAK

@pytest.mark.gpu_memory(max_peak="1GiB", fail_on="leaks")
def test_clean():
    torch.fake.snapshot = CLEAN

@pytest.mark.gpu_memory(fail_on="leaks")
def test_own_failure():
    torch.fake.snapshot = CLEAN
    assert 1 == 2, "the test's own assertion"

@pytest.mark.gpu_memory(fail_on="leaks")
def test_skips_itself():
    torch.fake.snapshot = LEAK
    pytest.skip("not today")

@pytest.mark.gpu_memory(fail_on="leaks")
def test_catches_an_oom():
    torch.fake.snapshot = CLEAN
    torch.fake.oom()

def test_unmarked():
    torch.fake.snapshot = LEAK
"""


def _flow(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, *args: str) -> tuple[Any, types.ModuleType]:
    torch = make_fake_torch(CLEAN)
    monkeypatch.setitem(sys.modules, "torch", torch)
    pytester.makepyfile(test_flow=FLOW_TESTS.format(leak=str(LEAK), clean=str(CLEAN)))
    return pytester.runpytest(*_plugin_args(), "-rA", *args), torch


def test_flow_fails_the_leak_with_the_verdict(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    result, torch = _flow(pytester, monkeypatch)
    result.assert_outcomes(passed=3, failed=2, skipped=1)
    d = pytester.path / ".memsnap"
    leak_snap, leak_html = d / "test_flow.py__test_leaky.pickle", d / "test_flow.py__test_leaky.html"
    verdict = check_snapshot(LEAK, limits_from_marker((), {"max_peak": "100MiB", "fail_on": "leaks"}))
    result.stdout.fnmatch_lines(
        [
            "*GPU memory check failed for test_flow.py::test_leaky (2 failures; max_peak='100MiB', fail_on='leaks'):",
            "  " + verdict.failures[0],
            "  " + verdict.failures[1],
            "snapshot: .memsnap/test_flow.py__test_leaky.pickle",
            "report: .memsnap/test_flow.py__test_leaky.html",
            "check: memsnap check .memsnap/test_flow.py__test_leaky.pickle --max-peak 100MiB --fail-on leaks",
            "explain: memsnap analyze .memsnap/test_flow.py__test_leaky.pickle",
        ]
    )
    assert leak_snap.exists() and leak_html.read_text().lstrip().lower().startswith("<!doctype html")
    # The test's own failure is what it fails with; the verdict and the kept files are beside it.
    result.stdout.fnmatch_lines(["*AssertionError: the test's own assertion*"])
    result.stdout.fnmatch_lines(["*memsnap*", "GPU memory check passed for test_flow.py::test_own_failure*"])
    assert (d / "test_flow.py__test_own_failure.pickle").exists()
    # Passed and skipped tests leave nothing, the OOM dump of a passing test included.
    assert sorted(p.name for p in d.iterdir()) == sorted(
        [leak_snap.name, leak_html.name, "test_flow.py__test_own_failure.pickle", "test_flow.py__test_own_failure.html"]
    )
    # Every marked test that ran recorded and stopped; the unmarked one did not record.
    records = [c for c in torch.fake.calls if c[0] == "record"]
    assert [c[1] for c in records] == ["all", None] * 5
    assert torch.fake.recording is None


def test_flow_keep_and_dir(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    result, _ = _flow(pytester, monkeypatch, "--memsnap-keep", "--memsnap-dir", "out/snaps")
    result.assert_outcomes(passed=3, failed=2, skipped=1)
    d = pytester.path / "out" / "snaps"
    names = {p.name for p in d.iterdir()}
    assert {
        "test_flow.py__test_leaky.pickle",
        "test_flow.py__test_leaky.html",
        "test_flow.py__test_clean.pickle",
        "test_flow.py__test_catches_an_oom.pickle",
        "test_flow.py__test_catches_an_oom.oom.pickle",
    } <= names, names
    assert "test_flow.py__test_skips_itself.pickle" not in names
    assert not (pytester.path / ".memsnap").exists()
    result.stdout.fnmatch_lines(["*snapshot: out/snaps/test_flow.py__test_leaky.pickle*"])


def test_flow_ini_dir_and_cleanup(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makeini("[pytest]\nmemsnap_dir = mem\n")
    result, _ = _flow(pytester, monkeypatch, "-k", "clean or unmarked")
    result.assert_outcomes(passed=2)
    # The folder this run made held nothing at the end, so it is gone.
    assert not (pytester.path / "mem").exists() and not (pytester.path / ".memsnap").exists()


# -- with PyTorch and a CUDA device ------------------------------------------------------------


def _cuda_missing() -> Optional[str]:
    try:
        import torch
    except ImportError:
        return "needs PyTorch (not installed)"
    if not torch.cuda.is_available():
        return f"needs a CUDA device (torch {torch.__version__} sees none)"
    return None


@pytest.mark.skipif(_cuda_missing() is not None, reason=str(_cuda_missing()))
def test_real_leak_fails_and_clean_passes(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_gpu="""
        import pytest
        import torch

        KEPT = []

        def steps(keep):
            model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 512)).cuda()
            opt = torch.optim.SGD(model.parameters(), lr=0.01)
            for _ in range(8):
                out = model(torch.randn(256, 512, device="cuda"))
                loss = out.square().mean()
                if keep:
                    KEPT.append(out.softmax(-1))  # LEAK
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)

        @pytest.mark.gpu_memory(max_peak="4GiB", fail_on="leaks")
        def test_leaky():
            steps(keep=True)

        @pytest.mark.gpu_memory(max_peak="4GiB", fail_on="leaks")
        def test_clean():
            steps(keep=False)
        """
    )
    result = pytester.runpytest(*_plugin_args(), "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        ["*GPU memory check failed for test_gpu.py::test_leaky*", "*fail-on * (leak) found: device *test_gpu.py:*"]
    )
    assert (pytester.path / ".memsnap" / "test_gpu.py__test_leaky.html").exists()
    assert not (pytester.path / ".memsnap" / "test_gpu.py__test_clean.pickle").exists()
