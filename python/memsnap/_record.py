"""``memsnap.record``: record PyTorch's CUDA memory history around a block and dump it.

PyTorch is imported inside :func:`record`, never when ``memsnap`` is imported, so that the
analysis side of the package works on machines without it.

The PyTorch calls used, and the releases that have them (``torch/cuda/memory.py``):

- ``torch.cuda.memory._record_memory_history(enabled, context=, stacks=, max_entries=)``: the
  string form (``enabled`` ``"state"``/``"all"``/``None``, ``context``
  ``None``/``"state"``/``"alloc"``/``"all"``, ``stacks`` ``"python"``/``"all"``) is in 2.1 and
  every later release (Composer's maintainers report it in 2.0 too); later releases only add
  keywords (``stacks=None`` in 2.3, ``clear_history``, ``compile_context``,
  ``global_record_annotations``, ``skip_actions``, ``record_pinned_host_memory``,
  ``record_cuda``) that :func:`record` does not pass. A ``bool`` first argument selects the
  1.13 form (``record_context``, ``trace_alloc_max_entries``, ...), which is not used here.
  Rather than compare version numbers, :func:`record` checks the installed function's
  signature for these keywords.
  PyTorch's own default for ``stacks`` is ``"all"`` (C++ frames too); :func:`record` defaults to
  ``"python"``, which is what the analysis places suspects by and is cheaper to record.
- ``torch.cuda.memory._dump_snapshot(filename)``: pickles ``_snapshot()`` to the file.
- ``torch.cuda.memory._snapshot()``: the snapshot dict, for the out-of-memory dump.
- ``torch._C._cuda_attach_out_of_memory_observer(cb)``: ``cb(device, alloc, device_allocated,
  device_free)`` is called by the caching allocator when an allocation fails, after it has
  released its lock and before the ``OutOfMemoryError`` unwinds the stack (so the tensors live
  at the failure are still live). There is no call to detach an observer: :func:`record`
  attaches one observer per process, once, which forwards to the recording in progress, if any.
"""

from __future__ import annotations

import inspect
import os
import pickle
import threading
import warnings
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, Optional, Union

if TYPE_CHECKING:  # pragma: no cover - for type checkers only
    from memsnap import Analysis

__all__ = ["record", "Recording", "oom_path_for"]

PathLike = Union[str, "os.PathLike[str]"]

_CONTEXTS = (None, "state", "alloc", "all")
_STACKS = ("python", "all")
_SNAPSHOT_SUFFIXES = (".pickle", ".pkl")

# The torch._C the one observer was attached to (kept, and compared with `is`, so that another
# torch module object, such as a test's stand-in, gets its own), and the recording the observer
# forwards to. Guarded by _LOCK: the allocator calls the observer from whichever thread's
# allocation failed.
_LOCK = threading.Lock()
_OBSERVER_OWNER: Any = None
_ACTIVE: Optional["Recording"] = None


def oom_path_for(path: PathLike) -> Path:
    """Where the out-of-memory dump of a recording to ``path`` goes.

    ``run/snap.pickle`` (or ``.pkl``) gives ``run/snap.oom.pickle``; any other name gets
    ``.oom.pickle`` appended (``run/snap`` gives ``run/snap.oom.pickle``).
    """
    p = Path(path)
    name = p.name
    for suffix in _SNAPSHOT_SUFFIXES:
        if name.lower().endswith(suffix) and len(name) > len(suffix):
            name = name[: -len(suffix)]
            break
    return p.with_name(name + ".oom.pickle")


def _import_torch() -> Any:
    """Import PyTorch and check that it can record CUDA memory; RuntimeError if not."""
    try:
        import torch
    except ImportError as e:
        raise RuntimeError(
            "memsnap.record needs PyTorch with CUDA (import torch failed: "
            f"{e}); install torch, or dump the snapshot elsewhere and use memsnap.analyze"
        ) from e
    cuda = getattr(torch, "cuda", None)
    if cuda is None or not cuda.is_available():
        built = getattr(getattr(torch, "version", None), "cuda", None)
        why = "this build has no CUDA" if built is None else f"built for CUDA {built}, no usable device"
        raise RuntimeError(
            f"memsnap.record needs a CUDA device: torch {torch.__version__} reports "
            f"torch.cuda.is_available() == False ({why})"
        )
    memory = cuda.memory
    missing = [n for n in ("_record_memory_history", "_snapshot") if not hasattr(memory, n)]
    if missing:
        raise RuntimeError(
            f"memsnap.record: torch {torch.__version__} has no torch.cuda.memory."
            f"{', '.join(missing)}; PyTorch 2.1 or later has them"
        )
    params = inspect.signature(memory._record_memory_history).parameters
    takes_keywords = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    if not takes_keywords and not {"context", "stacks", "max_entries"} <= set(params):
        raise RuntimeError(
            f"memsnap.record: torch {torch.__version__}'s _record_memory_history takes "
            f"({', '.join(params)}), not enabled/context/stacks/max_entries; PyTorch 2.1 or "
            "later has them"
        )
    return torch


def _dispatch_oom(device: int, alloc: int, device_allocated: int, device_free: int) -> None:
    """The process' one out-of-memory observer: hands the event to the active recording."""
    with _LOCK:
        rec = _ACTIVE
    if rec is not None:
        rec._on_oom(device, alloc, device_allocated, device_free)


class Recording:
    """A recording of CUDA memory history, made by :func:`record`.

    Attributes:
        path: where the snapshot is dumped when the ``with`` block ends.
        oom_path: the out-of-memory dump, once one was written (else ``None``).
        oom_events: how many allocations failed while recording (only the first is dumped:
            the state at the first failure is the one that explains it).
        oom_info: ``(device, alloc, device_allocated, device_free)`` of the first failure, as
            the allocator passed them (``device_allocated`` is the device's total memory, or
            the per-process cap where one is set).
        oom_error: why the out-of-memory dump could not be written, if it failed.
    """

    def __init__(
        self,
        path: PathLike,
        *,
        max_entries: int,
        stacks: str,
        on_oom: bool,
        context: Optional[str],
    ) -> None:
        self.path: Path = Path(path)
        self.oom_path: Optional[Path] = None
        self.oom_events: int = 0
        self.oom_info: Optional[tuple[int, int, int, int]] = None
        self.oom_error: Optional[str] = None
        self._max_entries = max_entries
        self._stacks = stacks
        self._on_oom_enabled = on_oom
        self._context = context
        self._torch: Any = None
        self._dumped = False

    def __repr__(self) -> str:
        return f"Recording(path={str(self.path)!r}, oom_path={None if self.oom_path is None else str(self.oom_path)!r})"

    # -- the context manager ----------------------------------------------------------------

    def __enter__(self) -> "Recording":
        global _ACTIVE, _OBSERVER_OWNER
        if self._torch is not None:
            raise RuntimeError("memsnap.record: a Recording is used for one with block; call record() again")
        torch = _import_torch()
        with _LOCK:
            if _ACTIVE is not None:
                raise RuntimeError(
                    f"memsnap.record: a recording to {_ACTIVE.path} is already in progress; "
                    "PyTorch keeps one memory history per process, so recordings cannot nest"
                )
            _ACTIVE = self
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if self._on_oom_enabled:
                attach = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
                if attach is None:
                    warnings.warn(
                        f"memsnap.record: torch {torch.__version__} has no out-of-memory "
                        "observer (torch._C._cuda_attach_out_of_memory_observer); no OOM dump "
                        "will be written",
                        RuntimeWarning,
                        stacklevel=2,
                    )
                else:
                    with _LOCK:
                        if _OBSERVER_OWNER is not torch._C:
                            attach(_dispatch_oom)
                            _OBSERVER_OWNER = torch._C
            torch.cuda.memory._record_memory_history(
                enabled="all",
                context=self._context,
                stacks=self._stacks,
                max_entries=self._max_entries,
            )
        except BaseException:
            with _LOCK:
                _ACTIVE = None
            raise
        self._torch = torch
        return self

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> Literal[False]:
        global _ACTIVE
        torch = self._torch
        try:
            try:
                self._dump(torch)
            finally:
                torch.cuda.memory._record_memory_history(enabled=None)
        except Exception as dump_error:
            if exc is None:
                raise
            # The block's own exception (an OutOfMemoryError, say) is the one to see; the dump
            # failure is reported beside it.
            warnings.warn(
                f"memsnap.record: could not dump the snapshot to {self.path}: {dump_error!r}",
                RuntimeWarning,
                stacklevel=2,
            )
        finally:
            with _LOCK:
                _ACTIVE = None
        return False

    # -- dumps ------------------------------------------------------------------------------

    def _dump(self, torch: Any) -> None:
        """Write the snapshot at ``self.path`` (what ``_dump_snapshot`` writes)."""
        dump = getattr(torch.cuda.memory, "_dump_snapshot", None)
        if dump is not None:
            dump(str(self.path))
        else:  # releases without _dump_snapshot: the same pickle, written here
            with open(self.path, "wb") as f:
                pickle.dump(torch.cuda.memory._snapshot(), f)
        self._dumped = True

    def _on_oom(self, device: int, alloc: int, device_allocated: int, device_free: int) -> None:
        """Dump the state at the first failed allocation; never raise into the allocator."""
        self.oom_events += 1
        if self.oom_events > 1:
            return
        self.oom_info = (device, alloc, device_allocated, device_free)
        target = oom_path_for(self.path)
        try:
            snapshot = self._torch.cuda.memory._snapshot()
            with open(target, "wb") as f:
                pickle.dump(snapshot, f)
            self.oom_path = target
        except Exception as e:  # an exception here would be raised inside the allocator
            self.oom_error = f"{type(e).__name__}: {e}"

    # -- analysis ---------------------------------------------------------------------------

    def analyze(self, oom: bool = False) -> "Analysis":
        """Analyse the snapshot dumped at the end of the block (``oom=True``: the OOM dump).

        Raises ``RuntimeError`` before the block has ended, or with ``oom=True`` when no
        out-of-memory dump was written.
        """
        import memsnap

        if oom:
            if self.oom_path is None:
                why = f": {self.oom_error}" if self.oom_error else " (no allocation failed while recording)"
                raise RuntimeError(f"memsnap.record: no out-of-memory dump was written{why}")
            return memsnap.analyze(self.oom_path)
        if not self._dumped:
            raise RuntimeError(
                f"memsnap.record: {self.path} is written when the with block ends; analyse it after"
            )
        return memsnap.analyze(self.path)


def record(
    path: PathLike,
    max_entries: int = 100_000,
    stacks: Literal["python", "all"] = "python",
    on_oom: bool = True,
    context: Optional[Literal["state", "alloc", "all"]] = "all",
) -> Recording:
    """Record CUDA memory history for a ``with`` block, then dump it to ``path``.

    ::

        with memsnap.record("run/snap.pickle") as rec:
            train_steps(model, opt, data, steps=5)
        print(rec.analyze().suspects)

    On entry, ``torch.cuda.memory._record_memory_history(enabled="all", context=context,
    stacks=stacks, max_entries=max_entries)``. On exit, even when the block raised,
    ``torch.cuda.memory._dump_snapshot(path)`` and then
    ``_record_memory_history(enabled=None)``, which stops recording and frees the history
    (a recording started before the block is stopped too: PyTorch keeps one per process and
    cannot say what its settings were).

    With ``on_oom=True``, the first allocation that fails inside the block is dumped at that
    moment, with the tensors of the failing step still alive, to ``<path stem>.oom.pickle``
    (:func:`oom_path_for`); ``rec.oom_path`` is then set. The dump at exit is written too: its
    trace shows the ``oom`` event, but the stack has unwound by then.

    Args:
        path: the snapshot file to write (a pickle, as PyTorch writes it; parent folders are
            made).
        max_entries: the ring buffer's size in trace events (alloc, free, segment events).
            Older events are overwritten; each costs a few hundred bytes of host memory with
            its stack.
        stacks: ``"python"`` (Python, TorchScript and inductor frames) or ``"all"`` (also C++
            frames: larger and slower to record).
        on_oom: dump the state at the first out-of-memory error.
        context: which events keep their stack: ``"all"`` (allocs and frees), ``"alloc"``,
            ``"state"`` (only what is alive at the dump), or ``None``.

    Raises:
        RuntimeError: when entering the block, if PyTorch is not installed, has no usable
            CUDA device, lacks the string form of ``_record_memory_history`` (2.1 and later
            have it), or another recording is in progress.
        ValueError: for an unknown ``stacks`` or ``context``, or ``max_entries`` < 1.
    """
    if stacks not in _STACKS:
        raise ValueError(f"memsnap.record: stacks must be 'python' or 'all', not {stacks!r}")
    if context not in _CONTEXTS:
        raise ValueError(
            f"memsnap.record: context must be None, 'state', 'alloc' or 'all', not {context!r}"
        )
    if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
        raise ValueError(f"memsnap.record: max_entries must be a positive int, not {max_entries!r}")
    return Recording(path, max_entries=max_entries, stacks=stacks, on_oom=bool(on_oom), context=context)
