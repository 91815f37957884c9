"""On the shared data folder (../shared beside the checkout, which CI has): uncompressed real
snapshots read from bytes give the peaks PyTorch itself measured."""

from __future__ import annotations

import json

import pytest
from conftest import SHARED, Cli

import memsnap

DEV = SHARED / "snapshots" / "dev"

pytestmark = pytest.mark.skipif(not DEV.is_dir(), reason=f"needs the shared data folder ({DEV} is absent)")


def _cases() -> list:
    if not DEV.is_dir():
        return []
    return sorted(p for p in DEV.glob("s*.pickle") if p.with_name(p.name.replace(".pickle", ".truth.json")).is_file())


@pytest.mark.parametrize("snapshot", _cases(), ids=lambda p: p.name)
def test_bytes_give_the_cli_json_and_torchs_peaks(cli: Cli, snapshot) -> None:
    truth = json.loads(snapshot.with_name(snapshot.name.replace(".pickle", ".truth.json")).read_text())
    a = memsnap.analyze(snapshot.read_bytes())
    want = cli.json(["analyze", str(snapshot), "--json"])
    assert {**a.to_dict(), "file": snapshot.name} == want
    peaks = a.devices[0].peaks
    assert peaks.allocated_bytes == truth["at_dump"]["max_allocated"]
    assert peaks.reserved_bytes == truth["at_dump"]["max_reserved"]
