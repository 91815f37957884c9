"""Tests of ``memsnap.record``.

Most run anywhere: they give ``record`` a stand-in for the few PyTorch calls it makes
(:func:`make_fake_torch`, put in ``sys.modules["torch"]``), which writes a real snapshot from
the bundled fixtures, so what is checked is record's own logic: the arguments it passes, the
dump and stop on exit (also when the block raises), the out-of-memory dump, errors without
PyTorch or CUDA, and ``.analyze()`` on what was written. The tests marked ``needs_cuda`` run
the real thing and skip, with the reason, where PyTorch or a CUDA device is missing.
"""

from __future__ import annotations

import lzma
import pickle
import subprocess
import sys
import types
from pathlib import Path
from typing import Any, Callable, Optional

import pytest

import memsnap
from memsnap._record import oom_path_for, record

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
LEAK_FIXTURE = FIXTURES / "extra2" / "y05_metrics_leak.pickle.xz"
CLEAN_FIXTURE = FIXTURES / "dev" / "s01_clean_train.pickle.xz"


# -- a stand-in for torch --------------------------------------------------------------------


def make_fake_torch(snapshot: Path, cuda_available: bool = True, with_observer: bool = True) -> types.ModuleType:
    """A module with the parts of ``torch`` that ``memsnap.record`` calls.

    ``torch.fake.calls`` lists the calls in order; ``_dump_snapshot`` / ``_snapshot`` give the
    fixture at ``torch.fake.snapshot`` (xz-compressed, unpickled and pickled again, as PyTorch
    pickles its dict); ``torch.fake.oom()`` calls the attached observers as the allocator does
    on a failed allocation. Its ``_record_memory_history`` has the 2.11 signature.
    """
    torch = types.ModuleType("torch")
    torch.__version__ = "2.11.0+fake"
    torch.version = types.SimpleNamespace(cuda="13.0" if cuda_available else None)
    state = types.SimpleNamespace(calls=[], observers=[], snapshot=snapshot, recording=None)

    def _record_memory_history(
        enabled: Optional[str] = "all",
        context: Optional[str] = "all",
        stacks: str = "all",
        max_entries: int = sys.maxsize,
        device: Any = None,
        clear_history: bool = False,
        compile_context: bool = False,
        global_record_annotations: bool = False,
        skip_actions: Optional[list] = None,
        record_pinned_host_memory: bool = False,
        record_cuda: bool = True,
    ) -> None:
        state.calls.append(("record", enabled, context, stacks, max_entries))
        state.recording = None if enabled is None else (enabled, context, stacks, max_entries)

    def _snapshot(device: Any = None) -> dict:
        state.calls.append(("snapshot",))
        return pickle.loads(lzma.decompress(Path(state.snapshot).read_bytes()))

    def _dump_snapshot(filename: str = "dump_snapshot.pickle") -> None:
        state.calls.append(("dump", filename))
        data = pickle.loads(lzma.decompress(Path(state.snapshot).read_bytes()))
        with open(filename, "wb") as f:
            pickle.dump(data, f)

    def oom(device: int = 0, alloc: int = 1 << 30, total: int = 80 << 30, free: int = 1 << 20) -> None:
        for cb in list(state.observers):
            cb(device, alloc, total, free)

    state.oom = oom
    torch.cuda = types.SimpleNamespace(
        is_available=lambda: cuda_available,
        memory=types.SimpleNamespace(
            _record_memory_history=_record_memory_history,
            _snapshot=_snapshot,
            _dump_snapshot=_dump_snapshot,
        ),
    )
    torch._C = types.SimpleNamespace()
    if with_observer:
        torch._C._cuda_attach_out_of_memory_observer = state.observers.append
    torch.fake = state
    return torch


@pytest.fixture
def fake_torch(monkeypatch: pytest.MonkeyPatch) -> Callable[..., types.ModuleType]:
    """Install a fake torch (see :func:`make_fake_torch`) as ``import torch``'s answer."""

    def install(snapshot: Path = LEAK_FIXTURE, **kw: Any) -> types.ModuleType:
        torch = make_fake_torch(snapshot, **kw)
        monkeypatch.setitem(sys.modules, "torch", torch)
        return torch

    return install


# -- without a GPU ---------------------------------------------------------------------------


def test_importing_memsnap_does_not_import_torch() -> None:
    code = (
        "import sys, memsnap, memsnap.pytest_plugin, memsnap._record\n"
        "bad = sorted(m for m in ('torch', 'ray', 'pyarrow') if m in sys.modules)\n"
        "assert not bad, bad\n"
        "assert callable(memsnap.record)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_record_is_the_package_function() -> None:
    assert memsnap.record is record


def test_passes_arguments_dumps_and_stops(tmp_path: Path, fake_torch: Callable[..., Any]) -> None:
    torch = fake_torch()
    path = tmp_path / "run" / "snap.pickle"
    with memsnap.record(path, max_entries=1234, stacks="all", context="alloc") as rec:
        assert torch.fake.recording == ("all", "alloc", "all", 1234)
        assert not path.exists()
    assert torch.fake.calls == [
        ("record", "all", "alloc", "all", 1234),
        ("dump", str(path)),
        ("record", None, "all", "all", sys.maxsize),
    ]
    assert torch.fake.recording is None
    assert rec.path == path and path.exists()
    assert rec.oom_path is None and rec.oom_events == 0
    assert len(torch.fake.observers) == 1  # on_oom=True attached the process' observer


def test_defaults(tmp_path: Path, fake_torch: Callable[..., Any]) -> None:
    torch = fake_torch()
    with memsnap.record(tmp_path / "s.pickle"):
        pass
    assert torch.fake.calls[0] == ("record", "all", "all", "python", 100_000)


def test_dumps_and_stops_when_the_block_raises(tmp_path: Path, fake_torch: Callable[..., Any]) -> None:
    torch = fake_torch()
    path = tmp_path / "s.pickle"
    with pytest.raises(ZeroDivisionError):
        with memsnap.record(path):
            1 / 0
    assert path.exists()
    assert torch.fake.recording is None
    # The next recording can start: the first one is over.
    with memsnap.record(tmp_path / "t.pickle"):
        pass


def test_analyze_reads_the_dump(tmp_path: Path, fake_torch: Callable[..., Any]) -> None:
    fake_torch(LEAK_FIXTURE)
    with memsnap.record(tmp_path / "s.pickle") as rec:
        with pytest.raises(RuntimeError, match="when the with block ends"):
            rec.analyze()
    a = rec.analyze()
    kinds = {s.kind for s in a.suspects}
    assert "reference_leak" in kinds, kinds
    sites = {(Path(s.site.filename).name, s.site.line) for s in a.suspects if s.site is not None}
    assert ("y05_metrics_leak.py", 22) in sites, sites
    # The same analysis as of the fixture itself.
    assert a.to_dict()["devices"] == memsnap.analyze(LEAK_FIXTURE).to_dict()["devices"]
    with pytest.raises(RuntimeError, match="no out-of-memory dump"):
        rec.analyze(oom=True)


def test_oom_dump(tmp_path: Path, fake_torch: Callable[..., Any]) -> None:
    torch = fake_torch(LEAK_FIXTURE)
    path = tmp_path / "s.pickle"
    with memsnap.record(path) as rec:
        torch.fake.oom(device=0, alloc=3 << 30)
        torch.fake.oom(device=0, alloc=5 << 30)  # a second failure is counted, not dumped
    assert rec.oom_path == tmp_path / "s.oom.pickle" and rec.oom_path.exists()
    assert rec.oom_events == 2
    assert rec.oom_info == (0, 3 << 30, 80 << 30, 1 << 20)
    assert torch.fake.calls.count(("snapshot",)) == 1
    assert rec.analyze(oom=True).to_dict()["devices"] == memsnap.analyze(LEAK_FIXTURE).to_dict()["devices"]
    # After the block the observer stays attached (PyTorch cannot detach one) but does nothing.
    torch.fake.oom()
    assert rec.oom_events == 2


def test_observer_attached_once_per_process(tmp_path: Path, fake_torch: Callable[..., Any]) -> None:
    torch = fake_torch()
    for i in range(3):
        with memsnap.record(tmp_path / f"s{i}.pickle"):
            pass
    assert len(torch.fake.observers) == 1
    with memsnap.record(tmp_path / "last.pickle") as rec:
        torch.fake.oom()
    assert rec.oom_path == tmp_path / "last.oom.pickle"


def test_oom_dump_failure_is_kept_not_raised(tmp_path: Path, fake_torch: Callable[..., Any]) -> None:
    torch = fake_torch()
    with memsnap.record(tmp_path / "s.pickle") as rec:
        torch.fake.snapshot = tmp_path / "missing.xz"  # _snapshot() now raises
        torch.fake.oom()
        torch.fake.snapshot = LEAK_FIXTURE
    assert rec.oom_path is None
    assert rec.oom_error is not None and "missing.xz" in rec.oom_error
    with pytest.raises(RuntimeError, match="missing.xz"):
        rec.analyze(oom=True)


def test_on_oom_false_attaches_nothing(tmp_path: Path, fake_torch: Callable[..., Any]) -> None:
    torch = fake_torch()
    with memsnap.record(tmp_path / "s.pickle", on_oom=False) as rec:
        torch.fake.oom()
    assert torch.fake.observers == [] and rec.oom_path is None


def test_without_observer_api_warns_and_records(tmp_path: Path, fake_torch: Callable[..., Any]) -> None:
    fake_torch(with_observer=False)
    with pytest.warns(RuntimeWarning, match="no out-of-memory observer"):
        with memsnap.record(tmp_path / "s.pickle") as rec:
            pass
    assert rec.path.exists()


def test_recordings_do_not_nest(tmp_path: Path, fake_torch: Callable[..., Any]) -> None:
    fake_torch()
    with memsnap.record(tmp_path / "a.pickle"):
        with pytest.raises(RuntimeError, match="already in progress"):
            with memsnap.record(tmp_path / "b.pickle"):
                pass
    assert (tmp_path / "a.pickle").exists() and not (tmp_path / "b.pickle").exists()


def test_a_recording_is_used_once(tmp_path: Path, fake_torch: Callable[..., Any]) -> None:
    fake_torch()
    rec = memsnap.record(tmp_path / "a.pickle")
    with rec:
        pass
    with pytest.raises(RuntimeError, match="one with block"):
        with rec:
            pass


def test_dump_error_is_raised(tmp_path: Path, fake_torch: Callable[..., Any]) -> None:
    torch = fake_torch()
    with pytest.raises(FileNotFoundError):
        with memsnap.record(tmp_path / "s.pickle"):
            torch.fake.snapshot = tmp_path / "missing.xz"
    assert torch.fake.recording is None  # stopped even so


def test_dump_error_beside_the_blocks_own(tmp_path: Path, fake_torch: Callable[..., Any]) -> None:
    torch = fake_torch()
    with pytest.warns(RuntimeWarning, match="could not dump"):
        with pytest.raises(KeyError):
            with memsnap.record(tmp_path / "s.pickle"):
                torch.fake.snapshot = tmp_path / "missing.xz"
                raise KeyError("the block's own")


def test_without_torch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    with pytest.raises(RuntimeError, match="needs PyTorch with CUDA"):
        with memsnap.record(tmp_path / "s.pickle"):
            pass
    assert not (tmp_path / "s.pickle").exists()


def test_without_cuda(tmp_path: Path, fake_torch: Callable[..., Any]) -> None:
    fake_torch(cuda_available=False)
    with pytest.raises(RuntimeError, match=r"needs a CUDA device: torch 2.11.0\+fake .*this build has no CUDA"):
        with memsnap.record(tmp_path / "s.pickle"):
            pass


def test_old_torch_without_string_api(tmp_path: Path, fake_torch: Callable[..., Any]) -> None:
    torch = fake_torch()

    def legacy(enabled: bool, record_context: bool = True, trace_alloc_max_entries: int = 1) -> None:
        raise AssertionError("not to be called")

    torch.cuda.memory._record_memory_history = legacy
    with pytest.raises(RuntimeError, match="enabled/context/stacks/max_entries"):
        with memsnap.record(tmp_path / "s.pickle"):
            pass


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"stacks": "cpp"}, "stacks must be"),
        ({"context": "some"}, "context must be"),
        ({"max_entries": 0}, "max_entries must be"),
        ({"max_entries": True}, "max_entries must be"),
    ],
)
def test_bad_arguments(tmp_path: Path, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        memsnap.record(tmp_path / "s.pickle", **kwargs)


@pytest.mark.parametrize(
    "path, oom",
    [
        ("run/snap.pickle", "run/snap.oom.pickle"),
        ("run/snap.PKL", "run/snap.oom.pickle"),
        ("run/snap", "run/snap.oom.pickle"),
        ("run/snap.data", "run/snap.data.oom.pickle"),
        (".pickle", ".pickle.oom.pickle"),
    ],
)
def test_oom_path_for(path: str, oom: str) -> None:
    assert oom_path_for(path) == Path(oom)


# -- with PyTorch and a CUDA device ----------------------------------------------------------


def _cuda_missing() -> Optional[str]:
    try:
        import torch
    except ImportError:
        return "needs PyTorch (not installed)"
    if not torch.cuda.is_available():
        return f"needs a CUDA device (torch {torch.__version__} sees none)"
    return None


needs_cuda = pytest.mark.skipif(_cuda_missing() is not None, reason=str(_cuda_missing()))


@needs_cuda
def test_real_leak_is_found_at_its_line(tmp_path: Path) -> None:
    import torch

    kept = []
    model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 512)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with memsnap.record(tmp_path / "leak.pickle") as rec:
        for _ in range(8):
            x = torch.randn(256, 512, device="cuda")
            out = model(x)
            loss = out.square().mean()
            kept.append(out.softmax(-1))  # LEAK
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    leak_line = next(i for i, line in enumerate(Path(__file__).read_text().splitlines(), 1) if line.endswith("# LEAK"))
    a = rec.analyze()
    sites = {(s.kind, Path(s.site.filename).name, s.site.line) for s in a.suspects if s.site is not None}
    assert any(name == Path(__file__).name and line == leak_line for _, name, line in sites), sites
    del kept


@needs_cuda
def test_real_oom_is_dumped(tmp_path: Path) -> None:
    import torch

    total = torch.cuda.get_device_properties(0).total_memory
    held = [torch.empty(64 << 20, dtype=torch.uint8, device="cuda")]
    with memsnap.record(tmp_path / "oom.pickle") as rec:
        with pytest.raises(torch.cuda.OutOfMemoryError):
            held.append(torch.empty(2 * total, dtype=torch.uint8, device="cuda"))
    assert rec.oom_path == tmp_path / "oom.oom.pickle" and rec.oom_path.exists()
    assert rec.oom_events == 1 and rec.oom_info is not None and rec.oom_info[1] >= 2 * total
    kinds = {s.kind for s in rec.analyze(oom=True).suspects}
    assert "oom" in kinds, kinds
    del held
