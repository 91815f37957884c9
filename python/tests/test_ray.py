"""examples/ray_archive.py on a local Ray: its Parquet rows are ``memsnap batch``'s rows.

Starts Ray with 2 CPUs (no dashboard), runs the example's command line on a few fixtures (two
devices, a leak, a clean run, an unreadable file, a state-only one with null peaks, one whose
totals are held at 2**64 - 1), reads the Parquet files back with pyarrow and compares them,
field by field, with ``memsnap.rows(...)`` and with ``memsnap batch``'s JSON Lines. Skipped, with a note, where
ray or pyarrow is not installed.
"""

from __future__ import annotations

import importlib.util
import json
import time
import types
from pathlib import Path
from typing import Any, Iterator

import pytest

import memsnap
from memsnap import _native

ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'ray[data]'): the Ray example is not run")
pq = pytest.importorskip("pyarrow.parquet", reason="pyarrow is not installed: the Ray example is not run")

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "fixtures"
PATHS = [
    FIXTURES / "multi" / "m01_two_gpu_pipeline.pickle",
    FIXTURES / "extra2" / "y05_metrics_leak.pickle.xz",
    FIXTURES / "dev" / "s01_clean_train.pickle.xz",
    FIXTURES / "extra3" / "z08_state_only_inference_cache.pickle.xz",
    FIXTURES / "hostile" / "ok_sizes_sum_past_2p64.pickle.xz",
    FIXTURES / "hostile" / "truncated_p2_at_2001.pickle",
]


def _load_example() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("ray_archive", ROOT / "examples" / "ray_archive.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def local_ray() -> Iterator[Any]:
    """A local Ray of 2 CPUs for this module's tests."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()


def _sorted(rows: list[dict]) -> list[dict]:
    return sorted(rows, key=lambda r: r["path"])


def test_rows_in_parquet_are_batch_rows(local_ray: Any, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    example = _load_example()
    out = tmp_path / "rows"
    t0 = time.monotonic()
    code = example.main([str(out), *map(str, PATHS)])
    elapsed = time.monotonic() - t0
    assert code == 2  # as memsnap batch: one file is unreadable
    assert f"{len(PATHS)} rows (1 unreadable)" in capsys.readouterr().err

    table = pq.read_table(out)
    assert table.schema.equals(example.ROW_SCHEMA, check_metadata=False), table.schema
    got = _sorted(table.to_pylist())
    want = _sorted(list(memsnap.rows([str(p) for p in PATHS])))

    # memsnap.rows gives memsnap batch's JSON Lines, row for row.
    code, stdout, _ = _native.run_captured(["memsnap", "batch", *map(str, PATHS)], {})
    assert code == 2
    assert _sorted([json.loads(line) for line in bytes(stdout).decode().splitlines()]) == want

    assert [r["path"] for r in got] == sorted(map(str, PATHS))
    assert set(want[0]) == set(example.ROW_SCHEMA.names), "ROW_SCHEMA and the rows' keys differ"
    for g, w in zip(got, want):
        for key in example.ROW_SCHEMA.names:
            assert g[key] == w[key], (w["path"], key, g[key], w[key])

    # What the comparison covered: nested lists of structs, nulls inside them and in an error
    # row, uint64 past int64, and two devices.
    by_name = {Path(r["path"]).name: r for r in got}
    assert by_name["m01_two_gpu_pipeline.pickle"]["devices"] == [0, 1]
    assert len(by_name["m01_two_gpu_pipeline.pickle"]["per_device"]) == 2
    leak = by_name["y05_metrics_leak.pickle.xz"]
    assert leak["top_suspects"][0]["kind"] == "reference_leak" and leak["top_suspects"][0]["site"]["line"] == 22
    state_only = by_name["z08_state_only_inference_cache.pickle.xz"]
    assert state_only["peak_allocated_bytes"] is None and state_only["per_device"][0]["peak_allocated_bytes"] is None
    saturated = by_name["ok_sizes_sum_past_2p64.pickle.xz"]
    assert saturated["allocated_bytes"] == 2**64 - 1 == saturated["per_device"][0]["reserved_bytes"]
    bad = by_name["truncated_p2_at_2001.pickle"]
    assert bad["error"] and bad["per_device"] is None and bad["top_suspects"] is None
    print(f"ray example: {len(PATHS)} snapshots in {elapsed:.1f} s")


def test_directory_walk_selects_like_batch(tmp_path: Path) -> None:
    example = _load_example()
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "rank0.pickle").write_bytes(b"")
    (tmp_path / "a" / "rank1.PKL.zst").write_bytes(b"")
    (tmp_path / "a" / "notes.txt").write_bytes(b"")
    (tmp_path / "a" / "truth.json").write_bytes(b"")
    (tmp_path / ".hidden").mkdir()
    (tmp_path / ".hidden" / "x.pickle").write_bytes(b"")
    (tmp_path / "b.pickle.gz").write_bytes(b"")
    named = tmp_path / "a" / "notes.txt"
    got = example.snapshot_paths([str(tmp_path), str(named), str(tmp_path / "b.pickle.gz")])
    assert got == [
        str(tmp_path / "a" / "rank0.pickle"),
        str(tmp_path / "a" / "rank1.PKL.zst"),
        str(tmp_path / "b.pickle.gz"),
        str(named),  # a file named on the command line is read whatever its name
    ]
    # The files and order memsnap batch itself reads (each empty file gives an error row).
    args = [str(tmp_path), str(named), str(tmp_path / "b.pickle.gz")]
    code, stdout, _ = _native.run_captured(["memsnap", "batch", *args], {})
    assert code == 2
    assert [json.loads(line)["path"] for line in bytes(stdout).decode().splitlines()] == got
