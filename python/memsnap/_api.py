"""memsnap's Python API: the command line's commands run in this process, their JSON returned as
Python values. Each function runs the very command the CLI runs (``memsnap analyze SRC --json``
and so on), so a result equals the CLI's output for the same input."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

from memsnap._analysis import Device, Suspect
from memsnap._run import BYTES_NAME, Input, SnapshotError, Source, error_line, raise_for_error, resolve, run, run_checked
from memsnap._timeline import Timeline, timeline_of

PathArg = Union[str, "os.PathLike[str]"]


def _global_flags(sequential_reader: bool) -> List[str]:
    return ["--sequential-reader"] if sequential_reader else []


@dataclass(frozen=True, eq=False)
class Analysis:
    """What ``memsnap analyze --json`` says about a snapshot, typed (docs/json.md).

    ``suspects`` are every device's, ranked (OOMs first, then bytes); ``caveats`` are about the
    file, each device has its own. :meth:`to_dict` is the JSON itself. :meth:`timeline`,
    :meth:`report` and :meth:`flamegraph` run those commands on the same source (bytes given
    to :func:`analyze` are kept for them).
    """

    #: The input's file name (``<bytes>`` for bytes).
    file: str
    pickle_bytes: int
    pickle_protocol: int
    producer: str
    devices: Tuple[Device, ...]
    suspects: Tuple[Suspect, ...]
    caveats: Tuple[str, ...]
    _input: Input = field(repr=False)
    _json: str = field(repr=False)
    _sequential_reader: bool = field(default=False, repr=False)

    def to_dict(self) -> Dict[str, Any]:
        """The parsed ``memsnap analyze --json`` output, whole (a new copy each call)."""
        parsed: Dict[str, Any] = json.loads(self._json)
        return parsed

    def device(self, number: int) -> Device:
        """The device numbered ``number`` (``KeyError`` when the snapshot has no such device)."""
        for d in self.devices:
            if d.device == number:
                return d
        raise KeyError(f"{self.file} has no device {number}; its devices: {[d.device for d in self.devices]}")

    def timeline(self, device: Optional[int] = None, *, every: int = 1) -> Timeline:
        """The device's memory over time as numpy arrays (``memsnap timeline --json``);
        ``device`` defaults to the first the analysis lists. Every ``every``-th event is kept
        (and the last)."""
        if device is None:
            if not self.devices:
                raise ValueError(f"{self.file} has no devices")
            device = self.devices[0].device
        return _timeline(self._input, device, every, self._sequential_reader)

    def report(self, output: PathArg, **options: Any) -> Path:
        """Write the report of this snapshot to ``output`` (``.html`` or ``.svg``): see
        :func:`report` for the options."""
        return _report(self._input, output, sequential_reader=self._sequential_reader, **options)

    def flamegraph(self, output: PathArg, **options: Any) -> Path:
        """Write the flamegraph of this snapshot's live memory to ``output``: see
        :func:`flamegraph` for the options."""
        return _flamegraph(self._input, output, sequential_reader=self._sequential_reader, **options)


def _input_of(source: Source, bytes_name: str = BYTES_NAME) -> Input:
    return resolve(source, bytes_name)


def _json_of(args: List[str], src: Input) -> str:
    return run_checked(args, src.inputs()).stdout


def analyze(source: Source, *, sequential_reader: bool = False) -> Analysis:
    """Replay a snapshot and name the suspects: ``memsnap analyze SOURCE --json``.

    ``source`` is a path, the snapshot's bytes (``bytes``, ``bytearray``, ``memoryview``;
    compressed or not), or a file opened in binary mode. Raises :class:`SnapshotError` with the
    CLI's error line when the input cannot be read.
    """
    src = _input_of(source)
    text = _json_of([*_global_flags(sequential_reader), "analyze", "--json", "--", src.arg], src)
    v = json.loads(text)
    return Analysis(
        file=v["file"],
        pickle_bytes=v["pickle_bytes"],
        pickle_protocol=v["pickle_protocol"],
        producer=v["producer"],
        devices=tuple(Device.of(d) for d in v["devices"]),
        suspects=tuple(Suspect.of(s) for s in v["suspects"]),
        caveats=tuple(v["caveats"]),
        _input=src,
        _json=text,
        _sequential_reader=sequential_reader,
    )


def summary(source: Source, *, sequential_reader: bool = False) -> Dict[str, Any]:
    """Dump-time totals, pools, block states, trace coverage: ``memsnap summary SOURCE --json``."""
    src = _input_of(source)
    parsed: Dict[str, Any] = json.loads(
        _json_of([*_global_flags(sequential_reader), "summary", "--json", "--", src.arg], src)
    )
    return parsed


def diff(before: Source, after: Source, *, sequential_reader: bool = False) -> Dict[str, Any]:
    """What changed from ``before`` to ``after``: ``memsnap diff BEFORE AFTER --json``. Bytes are
    named ``<before>`` and ``<after>``; two paths may be run directories (docs/ranks.md)."""
    a, b = _input_of(before, "<before>"), _input_of(after, "<after>")
    args = [*_global_flags(sequential_reader), "diff", "--json", "--", a.arg, b.arg]
    parsed: Dict[str, Any] = json.loads(run_checked(args, {**a.inputs(), **b.inputs()}).stdout)
    return parsed


def timeline(
    source: Source, device: int = 0, *, every: int = 1, sequential_reader: bool = False
) -> Timeline:
    """One device's bytes over time as numpy arrays: ``memsnap timeline SOURCE --json --device
    DEVICE --every EVERY``."""
    return _timeline(_input_of(source), device, every, sequential_reader)


def _timeline(src: Input, device: int, every: int, sequential_reader: bool) -> Timeline:
    args = [*_global_flags(sequential_reader), "timeline", "--json", "--device", str(device)]
    args += ["--every", str(every), "--", src.arg]
    devices = json.loads(_json_of(args, src))["devices"]
    return timeline_of(devices[0])


def _write(command: List[str], src: Input, output: PathArg, sequential_reader: bool) -> Path:
    out = os.fsdecode(os.fspath(output))
    run_checked([*_global_flags(sequential_reader), *command, "-o", out, "--", src.arg], src.inputs())
    return Path(out)


def report(
    source: Source,
    output: PathArg,
    *,
    static: bool = False,
    detail: Sequence[str] = (),
    x_axis: Optional[str] = None,
    sequential_reader: bool = False,
) -> Path:
    """Write the self-contained report (``memsnap report SOURCE -o OUTPUT``): the interactive
    HTML page, the script-free page with ``static=True``, or an SVG for a ``.svg`` name.
    ``detail``: moments to keep every event around (``peak``, ``event:N``, ...); ``x_axis``:
    ``events`` or ``time``. Returns the output's path."""
    return _report(
        _input_of(source), output, static=static, detail=detail, x_axis=x_axis, sequential_reader=sequential_reader
    )


def _report(
    src: Input,
    output: PathArg,
    *,
    static: bool = False,
    detail: Sequence[str] = (),
    x_axis: Optional[str] = None,
    sequential_reader: bool = False,
) -> Path:
    command = ["report"]
    if static:
        command.append("--static")
    for moment in detail:
        command += ["--detail", moment]
    if x_axis is not None:
        command += ["--x-axis", x_axis]
    return _write(command, src, output, sequential_reader)


def flamegraph(
    source: Source,
    output: PathArg,
    *,
    at: str = "peak",
    folded: bool = False,
    device: Optional[int] = None,
    sequential_reader: bool = False,
) -> Path:
    """Write live memory by stack at the moment ``at`` (``memsnap flamegraph SOURCE --at AT -o
    OUTPUT``): an SVG flamegraph, or folded stacks with ``folded=True``. Returns the path."""
    return _flamegraph(
        _input_of(source), output, at=at, folded=folded, device=device, sequential_reader=sequential_reader
    )


def _flamegraph(
    src: Input,
    output: PathArg,
    *,
    at: str = "peak",
    folded: bool = False,
    device: Optional[int] = None,
    sequential_reader: bool = False,
) -> Path:
    command = ["flamegraph", "--at", at]
    if folded:
        command.append("--folded")
    if device is not None:
        command += ["--device", str(device)]
    return _write(command, src, output, sequential_reader)


@dataclass(frozen=True)
class CheckResult:
    """The outcome of ``memsnap check``: ``passed`` (exit status 0) or failed (1)."""

    passed: bool
    code: int
    #: One line per failed gate (the command's stdout).
    failures: Tuple[str, ...]
    #: The command's closing line (``memsnap check: FILE: passed (2 gates)``).
    summary: str


def check(
    source: Source,
    *,
    max_peak: Union[int, str, None] = None,
    max_reserved: Union[int, str, None] = None,
    fail_on: Union[str, Iterable[str], None] = None,
    sequential_reader: bool = False,
) -> CheckResult:
    """The CI gate, ``memsnap check`` (docs/check.md): sizes are bytes or the CLI's sizes
    (``"20GiB"``), ``fail_on`` suspect kinds or severities (``"leaks"``, ``["oom",
    "fragmentation"]``). A failed gate is a result, not an error. What the command line stops
    at raises :class:`SnapshotError` with its error line: an unreadable input, and a ``fail_on``
    name it does not know; a size it cannot parse raises ``ValueError`` (clap's words)."""
    src = _input_of(source)
    args = [*_global_flags(sequential_reader), "check"]
    if max_peak is not None:
        args += ["--max-peak", str(max_peak)]
    if max_reserved is not None:
        args += ["--max-reserved", str(max_reserved)]
    if fail_on is not None:
        kinds = [fail_on] if isinstance(fail_on, str) else list(fail_on)
        args += ["--fail-on", ",".join(kinds)]
    result = run_checked([*args, "--", src.arg], src.inputs())
    last = result.stderr.strip().splitlines()
    return CheckResult(
        passed=result.code == 0,
        code=result.code,
        failures=tuple(result.stdout.splitlines()),
        summary=last[-1] if last else "",
    )


def _paths(paths: Union[PathArg, Iterable[PathArg]]) -> List[str]:
    if isinstance(paths, (str, os.PathLike)):
        return [os.fsdecode(os.fspath(paths))]
    return [os.fsdecode(os.fspath(p)) for p in paths]


def _batch(
    paths: List[str], inputs: Dict[str, bytes], jobs: Optional[int], max_inflight_bytes: Union[int, str, None], top: int
) -> List[Dict[str, Any]]:
    args = ["batch", "--format", "jsonl", "--top", str(top)]
    if jobs is not None:
        args += ["--jobs", str(jobs)]
    if max_inflight_bytes is not None:
        args += ["--max-inflight-bytes", str(max_inflight_bytes)]
    result = run([*args, "--", *paths], inputs)
    # Exit status 2 with rows and no error line is a batch that read past unreadable files:
    # they have rows of their own (with `error`). Anything else is raised as for any command.
    if not (result.code == 2 and result.stdout and error_line(result.stderr) is None):
        raise_for_error(result)
    return [json.loads(line) for line in result.stdout.splitlines() if line]


def rows(
    paths: Union[PathArg, Iterable[PathArg]],
    *,
    jobs: Optional[int] = None,
    max_inflight_bytes: Union[int, str, None] = None,
    top: int = 3,
) -> Iterator[Dict[str, Any]]:
    """The rows of ``memsnap batch PATHS...`` (docs/batch.md), one dict per snapshot, in input
    order: files, directories (walked) and glob patterns, as the CLI takes them. A file that
    cannot be read has a row with ``error`` set. The rows come when the whole batch is done
    (it runs on ``jobs`` threads)."""
    yield from _batch(_paths(paths), {}, jobs, max_inflight_bytes, top)


def row(item: Union[PathArg, Mapping[str, Any]], *, top: int = 3) -> Dict[str, Any]:
    """The ``memsnap batch`` row of one snapshot, for mapping over a data set.

    ``item`` is a path, or a dict with ``"path"`` and optionally ``"bytes"`` (the snapshot's
    contents, as ``ray.data.read_binary_files(..., include_paths=True)`` gives its rows): then
    the bytes are analysed and the row names ``path``. So ``ds.map(memsnap.row)`` maps a Ray
    Data set of paths (``{"path": ...}``) or of files to rows. An unreadable snapshot gives its
    row with ``error`` set, as in a batch.
    """
    inputs: Dict[str, bytes] = {}
    if isinstance(item, Mapping):
        if "path" not in item:
            raise KeyError('memsnap.row: a dict item needs a "path" (and may have "bytes")')
        path = os.fsdecode(os.fspath(item["path"]))
        data = item.get("bytes")
        if data is not None:
            inputs[path] = bytes(data)
    else:
        path = os.fsdecode(os.fspath(item))
    found = _batch([path], inputs, 1, None, top)
    if len(found) != 1:
        raise ValueError(f"memsnap.row: {path} names {len(found)} snapshots (a directory or a pattern?): use rows()")
    return found[0]


__all__ = [
    "Analysis",
    "CheckResult",
    "SnapshotError",
    "analyze",
    "check",
    "diff",
    "flamegraph",
    "report",
    "row",
    "rows",
    "summary",
    "timeline",
]
