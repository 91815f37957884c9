"""Unreadable inputs raise memsnap.SnapshotError with the very message the command line prints
(without its `memsnap: error: ` prefix), whether the input is a path or bytes."""

from __future__ import annotations

import lzma
from pathlib import Path

import pytest
from conftest import FIXTURES, ROOT, Cli, error_message

import memsnap

#: The hostile fixtures memsnap refuses (the `ok_*` ones are accepted).
REFUSED = sorted(
    str(p.relative_to(ROOT))
    for p in (FIXTURES / "hostile").iterdir()
    if p.name != "README.md" and not p.name.startswith("ok_")
)


def test_there_are_hostile_fixtures() -> None:
    assert len(REFUSED) > 50


@pytest.mark.parametrize("path", REFUSED)
def test_hostile_files_raise_the_cli_message(cli: Cli, path: str) -> None:
    done = cli.run(["analyze", path, "--json"])
    assert done.returncode == 2 and done.stdout == b""
    message = error_message(done.stderr)
    with pytest.raises(memsnap.SnapshotError) as raised:
        memsnap.analyze(path)
    assert str(raised.value) == message
    assert raised.value.code == 2 and raised.value.message == message
    assert raised.value.stderr == done.stderr.decode()
    # The same bytes handed over in memory: the same message, naming `<bytes>`.
    assert message.startswith(path + ": ")
    with pytest.raises(memsnap.SnapshotError) as raised:
        memsnap.analyze(Path(path).read_bytes())
    assert str(raised.value) == "<bytes>: " + message[len(path) + 2 :]


@pytest.mark.parametrize("cut", [1, 2, 3, 100, 5000, 700_000])
def test_truncated_bytes_raise_what_the_cli_says_of_the_truncated_file(
    cli: Cli, tmp_path: Path, cut: int
) -> None:
    data = lzma.decompress((FIXTURES / "dev/s03_loss_history_leak.pickle.xz").read_bytes())[:cut]
    cut_file = tmp_path / "cut.pickle"
    cut_file.write_bytes(data)
    done = cli.run(["analyze", str(cut_file), "--json"])
    assert done.returncode == 2
    message = error_message(done.stderr)
    with pytest.raises(memsnap.SnapshotError) as raised:
        memsnap.analyze(data)
    assert str(raised.value) == "<bytes>: " + message[len(str(cut_file)) + 2 :]
    with pytest.raises(memsnap.SnapshotError) as raised:
        memsnap.summary(data)
    assert str(raised.value).startswith("<bytes>: pickle error at byte ")


def test_a_missing_file(cli: Cli) -> None:
    done = cli.run(["analyze", "no/such.pickle", "--json"])
    with pytest.raises(memsnap.SnapshotError) as raised:
        memsnap.analyze("no/such.pickle")
    assert str(raised.value) == error_message(done.stderr) == "no/such.pickle: No such file or directory (os error 2)"


def test_a_bad_option_value_is_a_value_error_in_the_cli_words() -> None:
    with pytest.raises(ValueError, match="invalid value 'twenty' for '--max-peak <SIZE>'"):
        memsnap.check("fixtures/dev/s01_clean_train.pickle.xz", max_peak="twenty")
    with pytest.raises(memsnap.SnapshotError, match="unknown suspect kind or severity \"leakz\""):
        memsnap.check("fixtures/dev/s01_clean_train.pickle.xz", fail_on="leakz")


def test_a_device_the_file_lacks(cli: Cli) -> None:
    path = "fixtures/dev/s01_clean_train.pickle.xz"
    done = cli.run(["timeline", path, "--json", "--device", "3"])
    with pytest.raises(memsnap.SnapshotError) as raised:
        memsnap.timeline(path, device=3)
    assert str(raised.value) == error_message(done.stderr)
