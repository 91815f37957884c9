"""Analysis.timeline and memsnap.timeline: the CLI's timeline as numpy arrays."""

from __future__ import annotations

import csv
import io
import math

import pytest
from conftest import DEV, LEAK, Cli

import memsnap

np = pytest.importorskip("numpy")


def _cli_csv(cli: Cli, args: list) -> list:
    done = cli.run(["timeline", *args, "--csv"])
    assert done.returncode == 0, done.stderr
    return list(csv.DictReader(io.StringIO(done.stdout.decode())))


@pytest.mark.parametrize("path", DEV[:3])
@pytest.mark.parametrize("every", [1, 7])
def test_arrays_are_the_cli_csv(cli: Cli, path: str, every: int) -> None:
    rows = _cli_csv(cli, [path, "--device", "0", "--every", str(every)])
    t = memsnap.analyze(path).timeline(every=every)
    assert t.device == 0 and len(t) == len(rows) > 0
    for name in ("event", "allocated", "reserved", "active", "requested"):
        column = getattr(t, name)
        assert column.dtype == np.int64 and len(column) == len(rows)
        assert column.tolist() == [int(r[name]) for r in rows], name
    assert t.action.tolist() == [r["action"] for r in rows]
    times = [float(r["time_us"]) if r["time_us"] else math.nan for r in rows]
    assert t.time_us.dtype == np.float64
    assert np.array_equal(t.time_us, np.asarray(times), equal_nan=True)
    assert [int(x) for x in t.time_us if not math.isnan(x)] == [int(r["time_us"]) for r in rows if r["time_us"]]


def test_the_peak_is_the_largest_value(cli: Cli) -> None:
    a = memsnap.analyze(LEAK)
    t = a.timeline(0)
    peaks = a.devices[0].peaks
    assert int(t.allocated.max()) == peaks.allocated_bytes
    assert int(t.reserved.max()) == peaks.reserved_bytes
    assert int(t.event[int(t.allocated.argmax())]) == peaks.event_index


def test_bytes_give_the_same_timeline() -> None:
    with open(DEV[0], "rb") as f:
        data = f.read()
    a, b = memsnap.timeline(DEV[0]), memsnap.timeline(data)
    assert all(np.array_equal(getattr(a, n), getattr(b, n), equal_nan=True) for n in ("event", "time_us", "allocated"))
