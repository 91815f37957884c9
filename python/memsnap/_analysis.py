"""The parts of the typed view of ``memsnap analyze --json`` (docs/json.md): frozen dataclasses
whose fields carry the JSON's names and values, each built from its JSON object by ``of``. The
whole (``Analysis``, which keeps the JSON itself too) is in ``_api``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Tuple

Json = Mapping[str, Any]


@dataclass(frozen=True)
class Site:
    """A line of code: where a block was allocated, or a frame of its stack."""

    filename: str
    line: int
    function: str

    def __str__(self) -> str:
        return f"{self.filename}:{self.line} in {self.function}"

    @staticmethod
    def of(v: Optional[Json]) -> Optional["Site"]:
        return None if v is None else Site(v["filename"], v["line"], v["function"])


@dataclass(frozen=True)
class Suspect:
    """A named cause of memory use, with its evidence and the fix (docs/detectors.md)."""

    #: ``oom``, ``retained_graph``, ``no_grad_missing``, ``unreleased_gradient``,
    #: ``reference_leak`` or ``fragmentation``.
    kind: str
    #: ``leak`` (grows without bound), ``held`` (held at the dump, many times over from one
    #: line, in a file without a trace: whether it grows is not known), ``peak`` (inflates the
    #: peak) or ``waste`` (bounded).
    severity: str
    confidence: float
    device: int
    #: The memory at stake (see docs/json.md for what it counts per kind).
    bytes: int
    bytes_at_peak: Optional[int]
    #: Median growth per iteration (or per pass or per call, as ``growth_unit`` says); ``None``
    #: when it does not grow.
    growth_bytes_per_iteration: Optional[int]
    #: ``"iteration"``, ``"pass"`` or ``"call"`` (one call of the user's function that runs the
    #: model several times, such as a decoding loop: a leak that repeats per request).
    growth_unit: str
    #: The device's peak had this suspect's blocks never been allocated.
    peak_allocated_bytes_without: Optional[int]
    #: The user's line it is attributed to (``None`` without a user frame).
    site: Optional[Site]
    #: The allocation stack of a representative block, innermost first.
    stack: Tuple[Site, ...]
    evidence: str
    advice: str
    #: The typed evidence the words are rendered from, as the JSON has it (``kind``-tagged).
    facts: Dict[str, Any]

    @staticmethod
    def of(v: Json) -> "Suspect":
        return Suspect(
            kind=v["kind"],
            severity=v["severity"],
            confidence=v["confidence"],
            device=v["device"],
            bytes=v["bytes"],
            bytes_at_peak=v.get("bytes_at_peak"),
            growth_bytes_per_iteration=v.get("growth_bytes_per_iteration"),
            growth_unit=v["growth_unit"],
            peak_allocated_bytes_without=v.get("peak_allocated_bytes_without"),
            site=Site.of(v.get("site")),
            stack=tuple(Site(f["filename"], f["line"], f["function"]) for f in v["stack"]),
            evidence=v["evidence"],
            advice=v["advice"],
            facts=dict(v.get("facts") or {}),
        )


@dataclass(frozen=True)
class SiteBytes:
    """Live bytes at a moment attributed to one site (``label`` is its display text)."""

    label: str
    site: Optional[Site]
    bytes: int
    blocks: int


@dataclass(frozen=True)
class LabelBytes:
    """Live bytes at a moment under one label (``None``: blocks without one)."""

    label: Optional[str]
    bytes: int


@dataclass(frozen=True)
class Moment:
    """Live memory at one moment of the replay (the peak, or the end), broken down."""

    event_index: Optional[int]
    time_us: Optional[int]
    allocated_bytes: int
    #: ``None`` for a profiler-converted file, which does not know it.
    reserved_bytes: Optional[int]
    by_site: Tuple[SiteBytes, ...]
    by_category: Dict[str, Optional[int]]
    by_phase: Dict[str, int]
    by_metadata: Tuple[LabelBytes, ...]
    by_compile_region: Tuple[LabelBytes, ...]

    @staticmethod
    def of(v: Json) -> "Moment":
        def labels(rows: Any) -> Tuple[LabelBytes, ...]:
            return tuple(LabelBytes(r["label"], r["bytes"]) for r in rows)

        return Moment(
            event_index=v.get("event_index"),
            time_us=v.get("time_us"),
            allocated_bytes=v["allocated_bytes"],
            reserved_bytes=v.get("reserved_bytes"),
            by_site=tuple(
                SiteBytes(r["label"], Site.of(r.get("site")), r["bytes"], r["blocks"]) for r in v["by_site"]
            ),
            by_category=dict(v["by_category"]),
            by_phase=dict(v.get("by_phase") or {}),
            by_metadata=labels(v.get("by_metadata") or []),
            by_compile_region=labels(v.get("by_compile_region") or []),
        )


@dataclass(frozen=True)
class Peaks:
    """A device's replayed maxima, to the byte (``None`` when the trace has no allocation)."""

    allocated_bytes: Optional[int]
    #: ``None`` also for a profiler-converted file.
    reserved_bytes: Optional[int]
    active_bytes: Optional[int]
    requested_bytes: Optional[int]
    #: When allocated bytes peaked.
    time_us: Optional[int]
    event_index: Optional[int]
    #: When reserved bytes peaked.
    reserved_time_us: Optional[int]


@dataclass(frozen=True)
class LabelledPhase:
    """A stretch of the trace under one ``user_metadata`` or ``compile_context`` label."""

    kind: str
    name: str
    first_event: int
    last_event: int
    events: int


@dataclass(frozen=True)
class Phases:
    """What the analysis found the program doing on a device."""

    iterations: int
    #: ``backward``, ``forward``, ``annotation`` or ``none``.
    iteration_source: str
    iteration_site: Optional[Site]
    iteration_annotation: Optional[str]
    backward_passes: int
    forward_passes: int
    evaluation_windows: int
    optimizer_steps: int
    labels: Tuple[LabelledPhase, ...]

    @staticmethod
    def of(v: Json) -> "Phases":
        return Phases(
            iterations=v["iterations"],
            iteration_source=v["iteration_source"],
            iteration_site=Site.of(v.get("iteration_site")),
            iteration_annotation=v.get("iteration_annotation"),
            backward_passes=v["backward_passes"],
            forward_passes=v["forward_passes"],
            evaluation_windows=v["evaluation_windows"],
            optimizer_steps=v["optimizer_steps"],
            labels=tuple(
                LabelledPhase(lb["kind"], lb["name"], lb["first_event"], lb["last_event"], lb["events"])
                for lb in v.get("labels") or []
            ),
        )


@dataclass(frozen=True)
class SegmentMade:
    """A segment made while its pool held at least its size cached free."""

    event_index: int
    bytes: int
    cached_free_before_bytes: int


@dataclass(frozen=True)
class ReservedGrowth:
    """How reserved memory grew during the trace: segments made (and those made beside cached
    free memory that could not take the request), segments released, the two peaks."""

    peak_reserved_bytes: int
    peak_allocated_bytes: int
    allocated_at_peak_reserved_bytes: int
    segments_made: int
    segment_bytes_made: int
    segments_made_while_cached: int
    segment_bytes_made_while_cached: int
    largest_made_while_cached: Optional[SegmentMade]
    #: The reserved peak is at least 35% above the allocated peak.
    reserved_excess: bool
    segments_released: int
    segment_bytes_released: int

    @staticmethod
    def of(v: Json) -> "ReservedGrowth":
        fields = dict(v)
        largest = fields.pop("largest_made_while_cached")
        return ReservedGrowth(
            largest_made_while_cached=None if largest is None else SegmentMade(**largest), **fields
        )


@dataclass(frozen=True)
class Cache:
    """What the caching allocator holds beyond the live blocks at the dump (exact, from the
    segment table), what ``torch.cuda.empty_cache()`` would return, and how reserved grew."""

    reserved_bytes: int
    allocated_bytes: int
    cached_free_bytes: int
    #: Default-pool segments that hold no block, and their bytes.
    free_segments: int
    free_segment_bytes: int
    #: Free blocks beside live ones in default-pool segments: returned by nothing.
    hole_bytes: int
    expandable_free_bytes: int
    expandable_unmappable_bytes: int
    private_pool_free_bytes: int
    pending_free_bytes: int
    #: Segment bytes no listed block covers (0 in files PyTorch writes).
    unlisted_bytes: int
    empty_cache_returns_bytes: int
    #: ``None`` when the trace records no allocations.
    growth: Optional[ReservedGrowth]
    #: The sentences ``memsnap analyze`` prints under "Allocator cache".
    text: Tuple[str, ...]

    @staticmethod
    def of(v: Optional[Json]) -> Optional["Cache"]:
        if v is None:
            return None
        fields = dict(v)
        growth = fields.pop("growth")
        text = fields.pop("text")
        return Cache(growth=None if growth is None else ReservedGrowth.of(growth), text=tuple(text), **fields)


@dataclass(frozen=True)
class Device:
    """One device of the analysis: dump-time totals, the replay's peaks and checks, phases,
    the peak and end moments, its suspects and caveats."""

    device: int
    #: At the dump, as ``memory_allocated()`` / ``memory_reserved()`` said.
    allocated_bytes: int
    reserved_bytes: Optional[int]
    trace_entries: int
    peaks: Peaks
    replay_matches_snapshot: bool
    replay_mismatches: int
    replay_diagnostics: int
    trace_complete: bool
    uncertain_bytes_at_start: int
    phases: Phases
    peak: Moment
    end: Moment
    #: ``None`` for a profiler-converted file.
    cache: Optional[Cache]
    suspects: Tuple[Suspect, ...]
    caveats: Tuple[str, ...]

    @staticmethod
    def of(v: Json) -> "Device":
        return Device(
            device=v["device"],
            allocated_bytes=v["allocated_bytes"],
            reserved_bytes=v.get("reserved_bytes"),
            trace_entries=v["trace_entries"],
            peaks=Peaks(
                allocated_bytes=v.get("peak_allocated_bytes"),
                reserved_bytes=v.get("peak_reserved_bytes"),
                active_bytes=v.get("peak_active_bytes"),
                requested_bytes=v.get("peak_requested_bytes"),
                time_us=v.get("peak_time_us"),
                event_index=v.get("peak_event_index"),
                reserved_time_us=v.get("peak_reserved_time_us"),
            ),
            replay_matches_snapshot=v["replay_matches_snapshot"],
            replay_mismatches=v["replay_mismatches"],
            replay_diagnostics=v["replay_diagnostics"],
            trace_complete=v["trace_complete"],
            uncertain_bytes_at_start=v["uncertain_bytes_at_start"],
            phases=Phases.of(v["phases"]),
            peak=Moment.of(v["peak"]),
            end=Moment.of(v["end"]),
            cache=Cache.of(v.get("cache")),
            suspects=tuple(Suspect.of(s) for s in v["suspects"]),
            caveats=tuple(v["caveats"]),
        )
