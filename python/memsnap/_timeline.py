"""One device's memory over time as numpy arrays, from ``memsnap timeline --json`` (its
columns of equal length, docs/json.md). numpy is imported here, when a timeline is asked for,
never when memsnap is."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:
    import numpy


@dataclass(frozen=True, eq=False)
class Timeline:
    """Bytes after each kept trace event of one device (every event, or every ``every``-th and
    the last), from the exact replay. Arrays of equal length:

    - ``event``: the event's index in the device's trace (int64);
    - ``time_us``: its time in microseconds since the Unix epoch (float64, exact: epochs in
      microseconds are below 2**53; NaN for an event the trace gives no time);
    - ``action``: ``alloc``, ``free_requested``, ``segment_alloc``, ... (str);
    - ``allocated``, ``reserved``, ``active``, ``requested``: bytes after the event (int64).
    """

    device: int
    event: "numpy.ndarray"
    time_us: "numpy.ndarray"
    action: "numpy.ndarray"
    allocated: "numpy.ndarray"
    reserved: "numpy.ndarray"
    active: "numpy.ndarray"
    requested: "numpy.ndarray"

    def __len__(self) -> int:
        return len(self.event)


def timeline_of(device_json: Mapping[str, Any]) -> Timeline:
    """The :class:`Timeline` of one device object of ``memsnap timeline --json``."""
    try:
        import numpy as np
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("memsnap timelines are numpy arrays: pip install numpy") from e
    series = device_json["series"]
    times = [float("nan") if t is None else float(t) for t in series["time_us"]]

    def column(name: str) -> "numpy.ndarray":
        return np.asarray(series[name], dtype=np.int64)

    return Timeline(
        device=device_json["device"],
        event=column("event"),
        time_us=np.asarray(times, dtype=np.float64),
        action=np.asarray(series["action"], dtype=str),
        allocated=column("allocated"),
        reserved=column("reserved"),
        active=column("active"),
        requested=column("requested"),
    )
