"""memsnap.analyze, summary and diff give the command line's JSON, for paths, bytes and files."""

from __future__ import annotations

import dataclasses
import io
import json
import lzma
from pathlib import Path
from typing import Any, Dict

import pytest
from conftest import DEV, ROOT, Cli

import memsnap


@pytest.mark.parametrize("path", DEV)
def test_analyze_equals_the_cli_json(cli: Cli, path: str) -> None:
    assert memsnap.analyze(path).to_dict() == cli.json(["analyze", path, "--json"])


def _site(v: Any) -> Any:
    return None if v is None else {"filename": v["filename"], "line": v["line"], "function": v["function"]}


@pytest.mark.parametrize("path", DEV)
def test_typed_fields_are_the_json_values(path: str) -> None:
    a = memsnap.analyze(path)
    d = a.to_dict()
    assert (a.file, a.pickle_bytes, a.pickle_protocol, a.producer) == (
        d["file"],
        d["pickle_bytes"],
        d["pickle_protocol"],
        d["producer"],
    )
    assert list(a.caveats) == d["caveats"]
    assert len(a.suspects) == len(d["suspects"])
    for s, j in zip(a.suspects, d["suspects"]):
        typed = dataclasses.asdict(s)
        assert typed.pop("site") == _site(j["site"])
        assert list(typed.pop("stack")) == [_site(f) for f in j["stack"]]
        assert typed == {k: v for k, v in j.items() if k not in ("site", "stack")}
    assert [dev.device for dev in a.devices] == [j["device"] for j in d["devices"]]
    for dev, j in zip(a.devices, d["devices"]):
        assert dataclasses.asdict(dev.peaks) == {
            "allocated_bytes": j["peak_allocated_bytes"],
            "reserved_bytes": j["peak_reserved_bytes"],
            "active_bytes": j["peak_active_bytes"],
            "requested_bytes": j["peak_requested_bytes"],
            "time_us": j["peak_time_us"],
            "event_index": j["peak_event_index"],
            "reserved_time_us": j["peak_reserved_time_us"],
        }
        assert (dev.allocated_bytes, dev.reserved_bytes, dev.trace_entries) == (
            j["allocated_bytes"],
            j["reserved_bytes"],
            j["trace_entries"],
        )
        assert dev.replay_matches_snapshot is j["replay_matches_snapshot"]
        assert [dataclasses.asdict(s)["kind"] for s in dev.suspects] == [s["kind"] for s in j["suspects"]]
        assert list(dev.caveats) == j["caveats"]
        for moment, mj in ((dev.peak, j["peak"]), (dev.end, j["end"])):
            assert moment.allocated_bytes == mj["allocated_bytes"]
            assert moment.by_category == mj["by_category"]
            assert [(r.label, r.bytes, r.blocks) for r in moment.by_site] == [
                (r["label"], r["bytes"], r["blocks"]) for r in mj["by_site"]
            ]
        if j["cache"] is None:
            assert dev.cache is None
        else:
            assert dev.cache is not None
            typed = dataclasses.asdict(dev.cache)
            assert tuple(typed.pop("text")) == tuple(j["cache"]["text"])
            assert typed == {k: v for k, v in j["cache"].items() if k != "text"}
        assert dev.phases.iterations == j["phases"]["iterations"]
        assert dev.phases.iteration_site == memsnap.Site.of(j["phases"]["iteration_site"])
        assert a.device(dev.device) is dev


def test_the_leak_of_s03_as_the_readme_tells_it() -> None:
    a = memsnap.analyze(ROOT / "fixtures/dev/s03_loss_history_leak.pickle.xz")
    (s,) = a.suspects
    assert (s.kind, s.severity, s.growth_bytes_per_iteration) == ("retained_graph", "leak", 178_553_856)
    assert s.site == memsnap.Site("/workspace/lmtrain/s03_loss_history_leak.py", 19, "<module>")
    assert str(s.site) == "/workspace/lmtrain/s03_loss_history_leak.py:19 in <module>"
    assert s.stack and s.advice.startswith("Drop `retain_graph=True`")
    assert a.devices[0].peaks.allocated_bytes == 2_057_739_264
    with pytest.raises(KeyError):
        a.device(7)


@pytest.mark.parametrize("variant", ["plain", "expandable", "steady"])
def test_cache_says_what_empty_cache_returned_in_the_live_process(variant: str) -> None:
    stem = ROOT / f"fixtures/cache/c01_cache_shapes_{variant}_clean"
    truth = json.loads(Path(f"{stem}.truth.json").read_text())["cache"]
    cache = memsnap.analyze(Path(f"{stem}.pickle.xz")).device(0).cache
    assert cache is not None and cache.growth is not None
    assert cache.empty_cache_returns_bytes == truth["empty_cache_returned"]
    assert (cache.reserved_bytes, cache.allocated_bytes) == (truth["reserved_at_dump"], truth["allocated_at_dump"])
    # Shapes that grow step by step leave reserved far above the allocated peak; one shape does not.
    assert cache.growth.reserved_excess is (variant == "plain")


def _without_file(d: Dict[str, Any]) -> Dict[str, Any]:
    return {k: v for k, v in d.items() if k != "file"}


@pytest.mark.parametrize("path", DEV[:4])
def test_bytes_files_and_paths_agree(path: str) -> None:
    by_path = memsnap.analyze(path).to_dict()
    data = Path(path).read_bytes()
    for source in (data, bytearray(data), memoryview(data), io.BytesIO(data)):
        d = memsnap.analyze(source).to_dict()
        assert d["file"] == "<bytes>"
        assert _without_file(d) == _without_file(by_path)
    # A file opened from disk is read by its path: even the file name agrees.
    with open(path, "rb") as f:
        assert memsnap.analyze(f).to_dict() == by_path
    # One read part-way is read from where it is, as bytes (here: no longer an xz stream).
    with open(path, "rb") as f:
        f.read(1)
        with pytest.raises(memsnap.SnapshotError, match="^<bytes>: "):
            memsnap.analyze(f)
    # Decompressed bytes are the same snapshot (but for the file's sizes).
    plain = memsnap.analyze(lzma.decompress(data)).to_dict()
    assert plain["devices"] == by_path["devices"] and plain["suspects"] == by_path["suspects"]


def test_a_text_file_or_another_object_is_refused() -> None:
    with pytest.raises(TypeError, match="text mode"):
        memsnap.analyze(io.StringIO("not bytes"))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not int"):
        memsnap.analyze(42)  # type: ignore[arg-type]


@pytest.mark.parametrize("path", DEV[:3])
def test_summary_equals_the_cli_json(cli: Cli, path: str) -> None:
    assert memsnap.summary(path) == cli.json(["summary", path, "--json"])
    d = memsnap.summary(Path(path).read_bytes())
    assert d["file"] == "<bytes>"
    assert _without_file(d) == _without_file(cli.json(["summary", path, "--json"]))  # type: ignore[arg-type]


def test_diff_equals_the_cli_json_for_paths_and_for_bytes(cli: Cli) -> None:
    a, b = "fixtures/dev/s01_clean_train.pickle.xz", "fixtures/dev/s03_loss_history_leak.pickle.xz"
    want = cli.json(["diff", a, b, "--json"])
    assert memsnap.diff(a, b) == want
    got = memsnap.diff(Path(a).read_bytes(), Path(b).read_bytes())
    # The two inputs are named apart, and the names are all that differs.
    text = json.dumps(got).replace('"<before>"', '"s01_clean_train.pickle.xz"')
    assert json.loads(text.replace('"<after>"', '"s03_loss_history_leak.pickle.xz"')) == want
