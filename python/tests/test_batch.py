"""memsnap.rows and memsnap.row give the rows of `memsnap batch`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import DEV, Cli

import memsnap

#: A readable file, an unreadable one and a missing one: every kind of row.
MIXED = [DEV[0], "fixtures/hostile/json_text.pickle", DEV[2], "no/such.pickle"]


def _cli_rows(cli: Cli, args: list) -> list:
    done = cli.run(["batch", *args])
    return [json.loads(line) for line in done.stdout.decode().splitlines()]


def test_rows_equal_the_batch_jsonl(cli: Cli) -> None:
    want = _cli_rows(cli, ["fixtures/dev"])
    assert len(want) == len(DEV)
    assert list(memsnap.rows("fixtures/dev")) == want
    assert list(memsnap.rows([Path("fixtures/dev")], jobs=1)) == want


def test_rows_keep_going_past_bad_files(cli: Cli) -> None:
    want = _cli_rows(cli, MIXED)
    got = list(memsnap.rows(MIXED, top=1))
    assert got == _cli_rows(cli, ["--top", "1", *MIXED])
    assert [r["path"] for r in got] == MIXED
    assert [r["error"] is None for r in got] == [True, False, True, False]
    assert [r["path"] for r in want] == MIXED


def test_a_bad_batch_option_raises(cli: Cli) -> None:
    done = cli.run(["batch", "--jobs", "0", DEV[0]])
    with pytest.raises(memsnap.SnapshotError) as raised:
        list(memsnap.rows(DEV[0], jobs=0))
    assert "memsnap: error: " + str(raised.value) in done.stderr.decode()


def test_row_is_the_batch_row_of_a_path_a_dict_or_bytes(cli: Cli) -> None:
    for path in MIXED:
        (want,) = _cli_rows(cli, [path])
        assert memsnap.row(path) == want
        assert memsnap.row(Path(path)) == want
        assert memsnap.row({"path": path}) == want
        if Path(path).is_file():
            # Ray Data's read_binary_files(include_paths=True) rows: the bytes, named by path.
            assert memsnap.row({"path": path, "bytes": Path(path).read_bytes()}) == want


def test_row_of_bytes_named_anything(cli: Cli) -> None:
    (want,) = _cli_rows(cli, [DEV[1]])
    got = memsnap.row({"path": "s3://bucket/run/x.pickle.xz", "bytes": Path(DEV[1]).read_bytes()})
    assert got["path"] == "s3://bucket/run/x.pickle.xz"
    assert {**got, "path": DEV[1]} == want


def test_row_of_a_directory_is_refused() -> None:
    with pytest.raises(ValueError, match="use rows"):
        memsnap.row("fixtures/dev")
    with pytest.raises(KeyError):
        memsnap.row({"bytes": b""})
