"""pytest plugin: GPU memory limits on tests, checked by ``memsnap check``.

Installed with memsnap (entry point ``pytest11``, name ``memsnap``), so any test can say::

    @pytest.mark.gpu_memory(max_peak="2GiB", fail_on="leaks")
    def test_train_steps():
        ...

The test's call is recorded with :func:`memsnap.record`; when it ends the snapshot is checked
with ``memsnap check`` (the same gates, sizes and ``--fail-on`` names, docs/check.md), and a
failed gate fails the test with the check's verdict lines as the message. The snapshot and its
HTML report are kept for a failed test (their paths are in the message) and deleted for a
passed one unless ``--memsnap-keep`` is given. Without PyTorch or a CUDA device a marked test
is skipped, with the reason (``--memsnap-require-gpu`` makes that an error instead).

Marker arguments (keywords only; at least one gate):

- ``max_peak``, ``max_reserved``: a size as the CLI reads it (``"2GiB"``, ``"512MB"``,
  ``"1.5G"``, or an int of bytes): ``check --max-peak`` / ``--max-reserved``.
- ``fail_on``: suspect kinds or severities, a comma-separated str or a list
  (``"leaks"``, ``"oom,retained_graph"``, ``["leaks", "fragmentation"]``): ``check --fail-on``.
- ``max_entries`` (100,000), ``stacks`` (``"python"``), ``context`` (``"all"``): passed to
  :func:`memsnap.record`.

A bad argument is a usage error when the tests are collected, before anything runs.

Recording covers the test function's call, not its fixtures' setup: memory a fixture
allocated is in the snapshot as blocks alive before the trace starts. Before the dump the
garbage collector runs, so that tensors held only by reference cycles the test left behind are
not counted as kept.

This module imports neither torch nor memsnap's native extension when pytest loads it (every
pytest run in an environment with memsnap installed loads it); both are imported when a
marked test runs.
"""

from __future__ import annotations

import gc
import hashlib
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generator, Iterable, Mapping, Optional, Sequence, Union

import pytest

from memsnap._sizes import parse_size

__all__ = [
    "Limits",
    "Verdict",
    "limits_from_marker",
    "check_snapshot",
    "failure_message",
    "FAIL_ON_NAMES",
]

MARKER = "gpu_memory"

#: The names ``memsnap check --fail-on`` accepts (src/cmd/check.rs): the suspect kinds, the
#: severities, ``leaks`` (the severity ``leak``) and ``all``. ``python/tests/test_plugin.py``
#: checks this list against the CLI's own error message.
FAIL_ON_KINDS: tuple[str, ...] = (
    "oom",
    "retained_graph",
    "no_grad_missing",
    "unreleased_gradient",
    "reference_leak",
    "fragmentation",
)
FAIL_ON_SEVERITIES: tuple[str, ...] = ("leak", "held", "peak", "waste")
FAIL_ON_NAMES: tuple[str, ...] = FAIL_ON_KINDS + FAIL_ON_SEVERITIES + ("leaks", "all")

_MARKER_KEYS = ("max_peak", "max_reserved", "fail_on", "max_entries", "stacks", "context")
_MARKER_HELP = (
    'gpu_memory(max_peak="2GiB", max_reserved=None, fail_on="leaks", max_entries=100_000, '
    'stacks="python", context="all"): record the test\'s CUDA memory and fail it when '
    "`memsnap check` finds a gate exceeded (sizes as the CLI reads them; fail_on: "
    + ", ".join(FAIL_ON_NAMES)
    + ")"
)

SizeArg = Union[str, int]


# -- the marker's limits -------------------------------------------------------------------


@dataclass(frozen=True)
class Limits:
    """A ``gpu_memory`` marker's arguments, validated.

    Sizes keep the text the test gave (``"2GiB"``), which is what ``memsnap check`` is handed,
    so the verdict shows the limit as it was written; ``max_peak_bytes`` /
    ``max_reserved_bytes`` are the byte counts it stands for.
    """

    max_peak: Optional[str] = None
    max_reserved: Optional[str] = None
    fail_on: tuple[str, ...] = ()
    max_entries: int = 100_000
    stacks: str = "python"
    context: Optional[str] = "all"
    max_peak_bytes: Optional[int] = field(default=None, compare=False)
    max_reserved_bytes: Optional[int] = field(default=None, compare=False)

    def check_kwargs(self) -> dict[str, Any]:
        """The gates as keyword arguments of :func:`memsnap.check`."""
        return {"max_peak": self.max_peak, "max_reserved": self.max_reserved, "fail_on": list(self.fail_on) or None}

    def check_argv(self, snapshot: Union[str, "os.PathLike[str]"]) -> list[str]:
        """The same check as a command line, without the program name (``check FILE ...``)."""
        argv = ["check", os.fspath(snapshot)]
        if self.max_peak is not None:
            argv += ["--max-peak", self.max_peak]
        if self.max_reserved is not None:
            argv += ["--max-reserved", self.max_reserved]
        if self.fail_on:
            argv += ["--fail-on", ",".join(self.fail_on)]
        return argv

    def describe(self) -> str:
        """The gates as the marker would be written: ``max_peak="2GiB", fail_on="leaks"``."""
        parts = []
        if self.max_peak is not None:
            parts.append(f"max_peak={self.max_peak!r}")
        if self.max_reserved is not None:
            parts.append(f"max_reserved={self.max_reserved!r}")
        if self.fail_on:
            parts.append(f"fail_on={','.join(self.fail_on)!r}")
        return ", ".join(parts)


def _size_arg(name: str, value: object) -> tuple[str, int]:
    """(text for the CLI, bytes) of a size argument; ValueError with the CLI's wording."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ValueError(f"{name} must be a size such as '2GiB' or an int of bytes, not {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{name}: a size cannot be negative ({value})")
        text = str(value)
    else:
        text = value
    try:
        return text, parse_size(text)
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from None


def _fail_on_arg(value: object) -> tuple[str, ...]:
    """The names of a ``fail_on`` argument, each one ``memsnap check --fail-on`` accepts."""
    if isinstance(value, str):
        items: Iterable[object] = value.split(",")
    elif isinstance(value, (list, tuple, set, frozenset)):
        items = value
    else:
        raise ValueError(f"fail_on must be a str or a list of str, not {value!r}")
    names: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise ValueError(f"fail_on: {item!r} is not a str")
        for name in (n.strip() for n in item.split(",")):
            if not name:
                continue
            if name not in FAIL_ON_NAMES:
                raise ValueError(
                    f"fail_on: unknown suspect kind or severity {name!r}; valid kinds: "
                    f"{', '.join(FAIL_ON_KINDS)}; severities: {', '.join(FAIL_ON_SEVERITIES)}; "
                    "or leaks (= leak), all"
                )
            if name not in names:
                names.append(name)
    if not names:
        raise ValueError(f"fail_on: no suspect kind given in {value!r}")
    return tuple(names)


def limits_from_marker(args: Sequence[object], kwargs: Mapping[str, object]) -> Limits:
    """Validate a ``gpu_memory`` marker's arguments; ValueError says what is wrong."""
    if args:
        raise ValueError(f"takes keyword arguments only ({', '.join(_MARKER_KEYS)}), got {tuple(args)!r}")
    unknown = sorted(set(kwargs) - set(_MARKER_KEYS))
    if unknown:
        raise ValueError(f"unknown argument(s) {', '.join(unknown)}; known: {', '.join(_MARKER_KEYS)}")
    max_peak = max_peak_bytes = max_reserved = max_reserved_bytes = None
    if kwargs.get("max_peak") is not None:
        max_peak, max_peak_bytes = _size_arg("max_peak", kwargs["max_peak"])
    if kwargs.get("max_reserved") is not None:
        max_reserved, max_reserved_bytes = _size_arg("max_reserved", kwargs["max_reserved"])
    fail_on = _fail_on_arg(kwargs["fail_on"]) if kwargs.get("fail_on") is not None else ()
    if max_peak is None and max_reserved is None and not fail_on:
        raise ValueError("needs at least one gate: max_peak, max_reserved or fail_on")
    max_entries = kwargs.get("max_entries", 100_000)
    if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
        raise ValueError(f"max_entries must be a positive int, not {max_entries!r}")
    stacks = kwargs.get("stacks", "python")
    if stacks not in ("python", "all"):
        raise ValueError(f"stacks must be 'python' or 'all', not {stacks!r}")
    context = kwargs.get("context", "all")
    if context not in (None, "state", "alloc", "all"):
        raise ValueError(f"context must be None, 'state', 'alloc' or 'all', not {context!r}")
    return Limits(
        max_peak=max_peak,
        max_reserved=max_reserved,
        fail_on=fail_on,
        max_entries=max_entries,
        stacks=str(stacks),
        context=context,  # type: ignore[arg-type]
        max_peak_bytes=max_peak_bytes,
        max_reserved_bytes=max_reserved_bytes,
    )


# -- the verdict ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """What ``memsnap check`` said about one snapshot.

    ``failures`` are check's stdout lines (one per failed gate) without the leading
    ``PATH: ``; ``summary`` is its stderr line (``memsnap check: PATH: FAILED (2 failures)``).
    """

    passed: bool
    failures: tuple[str, ...]
    summary: str


class CheckError(Exception):
    """``memsnap check`` could not judge the snapshot (exit 2): unreadable file, bad gate."""


def check_snapshot(snapshot: Union[str, "os.PathLike[str]"], limits: Limits) -> Verdict:
    """Run ``memsnap check`` (:func:`memsnap.check`, in this process) with a marker's limits.

    Raises :class:`CheckError` with check's message when it cannot judge (the file cannot be
    read, or a gate is malformed: exit status 2).
    """
    import memsnap

    shown = os.fspath(snapshot)
    try:
        result = memsnap.check(shown, **limits.check_kwargs())
    except (memsnap.SnapshotError, ValueError) as e:
        raise CheckError(str(e)) from e
    if result.passed:
        return Verdict(True, (), result.summary)
    prefix = shown + ": "
    lines = tuple(line[len(prefix):] if line.startswith(prefix) else line for line in result.failures if line.strip())
    return Verdict(False, lines, result.summary)


def failure_message(
    nodeid: str,
    limits: Limits,
    verdict: Verdict,
    kept: Mapping[str, Union[str, "os.PathLike[str]"]],
) -> str:
    """The message a test fails with: the gates, check's lines, the files kept, and the
    commands that give the verdict again and explain it.

    ``kept`` maps a label (``snapshot``, ``report``, ``oom snapshot``, or ``report error``
    with the reason as the value) to a path, in the order to show them.
    """
    n = len(verdict.failures)
    lines = [f"GPU memory check failed for {nodeid} ({n} {'failure' if n == 1 else 'failures'}; {limits.describe()}):"]
    lines += [f"  {line}" for line in verdict.failures]
    snapshot = None
    for label, value in kept.items():
        lines.append(f"{label}: {os.fspath(value)}")
        if label == "snapshot":
            snapshot = os.fspath(value)
    if snapshot is not None:
        lines.append(f"check: {shlex.join(['memsnap', *limits.check_argv(snapshot)])}")
        lines.append(f"explain: {shlex.join(['memsnap', 'analyze', snapshot])}")
    return "\n".join(lines)


# -- where snapshots go ------------------------------------------------------------------------

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def artifact_stem(nodeid: str) -> str:
    """A file name stem for a test id: ``tests/test_x.py::test_y[a]`` → ``tests_test_x.py__test_y_a``.

    A short hash of the id is added when characters other than ``/`` and ``::`` were replaced
    or the name was shortened, so two ids never share a stem.
    """
    simple = nodeid.replace("::", "__").replace("/", "_")
    stem = _UNSAFE.sub("_", simple).strip("_") or "test"
    if stem != simple or len(stem) > 120:
        stem = stem[:120] + "-" + hashlib.sha1(nodeid.encode("utf-8")).hexdigest()[:8]
    return stem


def _shown(path: Path) -> str:
    """A path relative to the working directory when it is under it, else absolute."""
    try:
        return os.path.relpath(path) if path.resolve().is_relative_to(Path.cwd().resolve()) else str(path)
    except (OSError, ValueError):
        return str(path)


# -- pytest hooks --------------------------------------------------------------------------

_LIMITS = pytest.StashKey[Limits]()
_GPU_REASON = pytest.StashKey[Optional[str]]()
_CREATED_DIR = pytest.StashKey[Optional[Path]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--memsnap-dir``, ``--memsnap-keep``, ``--memsnap-require-gpu`` and the ini key."""
    group = parser.getgroup("memsnap", "GPU memory limits (memsnap)")
    group.addoption(
        "--memsnap-dir",
        metavar="DIR",
        default=None,
        help="where the snapshots and reports of gpu_memory tests are written "
        "(default: the memsnap_dir ini value, else .memsnap under the rootdir)",
    )
    group.addoption(
        "--memsnap-keep",
        action="store_true",
        default=False,
        help="keep the snapshots of gpu_memory tests that pass too (default: deleted)",
    )
    group.addoption(
        "--memsnap-require-gpu",
        action="store_true",
        default=False,
        help="error, rather than skip, a gpu_memory test when PyTorch or a CUDA device is missing",
    )
    parser.addini("memsnap_dir", "default for --memsnap-dir (relative to the rootdir)", default=None)


def pytest_configure(config: pytest.Config) -> None:
    """Register the ``gpu_memory`` marker."""
    config.addinivalue_line("markers", _MARKER_HELP)
    config.stash[_CREATED_DIR] = None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Validate every ``gpu_memory`` marker before any test runs (a bad one is a usage error)."""
    for item in items:
        marker = item.get_closest_marker(MARKER)
        if marker is None:
            continue
        try:
            item.stash[_LIMITS] = limits_from_marker(marker.args, marker.kwargs)
        except ValueError as e:
            raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.{MARKER}: {e}") from None


def _gpu_unavailable(config: pytest.Config) -> Optional[str]:
    """Why marked tests cannot record here (no PyTorch, no CUDA device), or None; once per run."""
    if _GPU_REASON in config.stash:
        return config.stash[_GPU_REASON]
    reason: Optional[str] = None
    try:
        import torch
    except ImportError as e:
        reason = f"memsnap gpu_memory: PyTorch is not installed (import torch: {e})"
    else:
        try:
            available = bool(torch.cuda.is_available())
        except Exception as e:  # a broken CUDA setup reports through exceptions too
            available, why = False, repr(e)
        else:
            why = f"torch {torch.__version__}, CUDA build {torch.version.cuda}"
        if not available:
            reason = f"memsnap gpu_memory: no CUDA device (torch.cuda.is_available() is False; {why})"
    config.stash[_GPU_REASON] = reason
    return reason


def _artifact_dir(config: pytest.Config) -> Path:
    """The folder for snapshots and reports, made when first needed."""
    option = config.getoption("memsnap_dir")
    if option:
        folder = Path(option)
        if not folder.is_absolute():
            folder = Path(config.invocation_params.dir) / folder
    else:
        ini = config.getini("memsnap_dir")
        folder = config.rootpath / (ini if ini else ".memsnap")
    if not folder.exists():
        folder.mkdir(parents=True, exist_ok=True)
        if config.stash[_CREATED_DIR] is None:
            config.stash[_CREATED_DIR] = folder
    return folder


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip (or, with --memsnap-require-gpu, fail) a marked test where nothing can record."""
    if _LIMITS not in item.stash:
        return
    reason = _gpu_unavailable(item.config)
    if reason is None:
        return
    if item.config.getoption("memsnap_require_gpu"):
        pytest.fail(reason + " (--memsnap-require-gpu)", pytrace=False)
    pytest.skip(reason)


def _remove(paths: Iterable[Path]) -> None:
    for p in paths:
        try:
            p.unlink()
        except FileNotFoundError:
            pass


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, Any]:
    """Record a marked test's call, check the snapshot, fail the test on a failed gate."""
    limits = item.stash.get(_LIMITS, None)
    if limits is None:
        return (yield)
    from memsnap._record import record

    folder = _artifact_dir(item.config)
    stem = artifact_stem(item.nodeid)
    snapshot = folder / f"{stem}.pickle"
    report = folder / f"{stem}.html"
    rec = record(snapshot, max_entries=limits.max_entries, stacks=limits.stacks, on_oom=True, context=limits.context)
    error: Optional[BaseException] = None
    with rec:
        try:
            result = yield
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:  # the test's own failure (or skip/xfail): judged below
            error = e
        gc.collect()

    created = [snapshot] + ([rec.oom_path] if rec.oom_path is not None else [])
    if error is not None and isinstance(error, pytest.skip.Exception):
        _remove(created)
        raise error

    try:
        verdict: Optional[Verdict] = check_snapshot(snapshot, limits)
        check_error = None
    except CheckError as e:
        verdict, check_error = None, str(e)

    if error is None and verdict is not None and verdict.passed:
        if item.config.getoption("memsnap_keep"):
            kept = ", ".join(_shown(p) for p in created)
            item.add_report_section("call", "memsnap", f"passed ({limits.describe()}); kept {kept}")
        else:
            _remove(created)
        return result

    kept: dict[str, Union[str, Path]] = {"snapshot": _shown(snapshot)}
    if rec.oom_path is not None:
        kept["oom snapshot"] = _shown(rec.oom_path)
    import memsnap

    try:
        memsnap.report(snapshot, report)
        kept["report"] = _shown(report)
    except (memsnap.SnapshotError, ValueError, RuntimeError) as e:
        kept["report error"] = str(e)

    if check_error is not None:
        message = f"memsnap check could not judge the snapshot of {item.nodeid}: {check_error}\n" + "\n".join(
            f"{k}: {os.fspath(v)}" for k, v in kept.items()
        )
    else:
        assert verdict is not None
        if verdict.passed:
            message = f"GPU memory check passed for {item.nodeid} ({limits.describe()}); " + ", ".join(
                f"{k}: {os.fspath(v)}" for k, v in kept.items()
            )
        else:
            message = failure_message(item.nodeid, limits, verdict, kept)
    if error is not None:
        # The test failed on its own: its error is the one reported; the memory verdict and the
        # kept files go in a section of the report.
        item.add_report_section("call", "memsnap", message)
        raise error
    pytest.fail(message, pytrace=False)


def pytest_unconfigure(config: pytest.Config) -> None:
    """Remove the snapshot folder this run made if nothing was kept in it."""
    folder = config.stash.get(_CREATED_DIR, None)
    if folder is not None:
        try:
            folder.rmdir()
        except OSError:  # not empty (kept files) or already gone
            pass
