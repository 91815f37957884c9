"""memsnap: offline analyzer for PyTorch CUDA memory snapshots, in Python.

The same analysis as the ``memsnap`` command line, run in this process (no subprocess, no
temporary file for bytes), with typed results::

    import memsnap
    a = memsnap.analyze("snapshot.pickle")        # or bytes, or an open file
    for s in a.suspects:
        print(s.kind, s.severity, s.bytes, s.site, s.advice)
    t = a.timeline()                              # numpy arrays (needs numpy)

Importing memsnap imports neither torch nor numpy. Calls release the GIL and may run from
several threads at once.
"""

from memsnap._analysis import (
    Cache,
    Device,
    LabelBytes,
    LabelledPhase,
    Moment,
    Peaks,
    Phases,
    ReservedGrowth,
    SegmentMade,
    Site,
    SiteBytes,
    Suspect,
)
from memsnap._api import (
    Analysis,
    CheckResult,
    analyze,
    check,
    diff,
    flamegraph,
    report,
    row,
    rows,
    summary,
    timeline,
)
from memsnap._record import Recording, record
from memsnap._run import SnapshotError
from memsnap._timeline import Timeline

__version__ = "0.1.0"

__all__ = [
    "Analysis",
    "Cache",
    "CheckResult",
    "Device",
    "LabelBytes",
    "LabelledPhase",
    "Moment",
    "Peaks",
    "Phases",
    "Recording",
    "ReservedGrowth",
    "SegmentMade",
    "Site",
    "SiteBytes",
    "SnapshotError",
    "Suspect",
    "Timeline",
    "analyze",
    "check",
    "diff",
    "flamegraph",
    "record",
    "report",
    "row",
    "rows",
    "summary",
    "timeline",
]
