"""Runs from several Python threads at once keep their outputs and inputs apart, and Ctrl-C
reaches a caller while a command runs."""

from __future__ import annotations

import _thread
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from conftest import DEV, ROOT

import memsnap

BAD = ROOT / "fixtures/hostile/bitflip_at_1435.pickle"


def _task(i: int) -> Any:
    """Analyses of different files as paths and as bytes, and a failing one, interleaved."""
    path = DEV[i % 4]
    if i % 5 == 4:
        try:
            memsnap.analyze(BAD.read_bytes())
        except memsnap.SnapshotError as e:
            return ("error", str(e))
        return ("no error", None)
    source = Path(path).read_bytes() if i % 2 else path
    d = memsnap.analyze(source).to_dict()
    d.pop("file")
    return (path, d)


def test_four_threads_get_the_results_of_one() -> None:
    alone = [_task(i) for i in range(20)]
    with ThreadPoolExecutor(max_workers=4) as pool:
        for _ in range(2):
            assert list(pool.map(_task, range(20))) == alone
    assert ("error", "<bytes>: pickle error at byte 1435 (opcode unknown 0x60): unknown opcode (not a pickle, or corrupted)") in alone


def test_the_gil_is_released_while_a_command_runs() -> None:
    ticks = 0
    done = threading.Event()

    def count() -> None:
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            time.sleep(0.001)

    counter = threading.Thread(target=count)
    counter.start()
    try:
        started = time.monotonic()
        calls = 0
        # Work for at least half a second whatever the machine's speed (one batch over
        # fixtures/dev took 0.19 s once the reader got faster, too short a window to count in).
        while calls == 0 or time.monotonic() - started < 0.5:
            list(memsnap.rows("fixtures/dev", jobs=1))
            calls += 1
        took = time.monotonic() - started
    finally:
        done.set()
        counter.join()
    # A call holding the GIL would leave the counter a few ticks per call (Python hands the GIL
    # over between calls); released, it ticks about once a millisecond all along.
    assert ticks > max(20, 10 * calls) and ticks > 100 * took, (took, calls, ticks)


def test_ctrl_c_raises_keyboard_interrupt_at_once() -> None:
    # Python's own handler, also where SIGINT came in ignored (a background job of a script).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _interrupt_a_batch()
    finally:
        signal.signal(signal.SIGINT, previous)


def _interrupt_a_batch() -> None:
    started = time.monotonic()
    list(memsnap.rows("fixtures", jobs=1))
    whole = time.monotonic() - started
    if whole < 2:
        pytest.skip(f"the batch took only {whole:.2f} s: too quick to interrupt in the middle")
    timer = threading.Timer(0.3, _thread.interrupt_main)
    timer.start()
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        list(memsnap.rows("fixtures", jobs=1))
    interrupted = time.monotonic() - started
    timer.join()
    assert interrupted < whole / 2, (interrupted, whole)
    # The process goes on working (the interrupted batch finishes on its own thread).
    assert memsnap.analyze(DEV[0]).devices
