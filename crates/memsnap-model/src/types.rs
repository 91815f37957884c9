//! The typed snapshot: plain data with public fields.

use std::collections::BTreeMap;

/// Index of an interned string in [`Snapshot::strings`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct StrId(pub u32);

impl StrId {
    /// The empty string: always string 0.
    pub const EMPTY: StrId = StrId(0);
}

/// Index of an interned frame in [`Snapshot::frames`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FrameId(pub u32);

/// Index of an interned stack in [`Snapshot::stacks`]. `StackId(0)` is always the empty stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct StackId(pub u32);

impl StackId {
    /// The empty stack (no frames recorded).
    pub const EMPTY: StackId = StackId(0);
}

/// One source location. Python frames have a real `filename`; C++ frames have `??` or a
/// `.cpp`/`.h` path.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Frame {
    pub filename: StrId,
    pub line: u32,
    pub name: StrId,
}

/// A call stack, innermost frame first (the order PyTorch records).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Stack {
    pub frames: Vec<FrameId>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SegmentType {
    Small,
    Large,
    Unknown,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BlockState {
    /// `active_allocated`: handed to the program.
    Allocated,
    /// `active_pending_free` (or `active_awaiting_free`): freed by the program, still used by
    /// another stream.
    PendingFree,
    /// `inactive`: free, cached by the allocator.
    Inactive,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Block {
    pub address: u64,
    /// Allocator-rounded size in bytes.
    pub size: u64,
    /// Bytes the program asked for (equals `size` when the file does not say).
    pub requested_size: u64,
    pub state: BlockState,
    /// Allocation stack (empty when not recorded).
    pub stack: StackId,
    /// True when `address` was not in the file and was derived from the segment address.
    pub address_derived: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Segment {
    pub device: u32,
    pub address: u64,
    pub total_size: u64,
    pub allocated_size: u64,
    pub active_size: u64,
    pub requested_size: u64,
    pub stream: u64,
    pub segment_type: SegmentType,
    /// `segment_pool_id`: `(0, 0)` for the default pools; a private pool otherwise (see
    /// [`Segment::pool_kind`]).
    pub pool_id: (u64, u64),
    pub is_expandable: bool,
    /// Where the segment was created.
    pub stack: StackId,
    pub blocks: Vec<Block>,
}

/// Which pool a segment belongs to, from its `segment_pool_id` (c10's `MempoolId_t`). A CUDA
/// graph captured without a pool gets a private pool of its own, numbered `(N, 0)`; pools the
/// program creates are numbered `(0, N)`: `torch.cuda.MemPool()` and
/// `torch.cuda.graph_pool_handle()`, which graphs share through `pool=` (cudagraph trees share
/// one that way). The real fixtures `formats/f02_cuda_graph_pool` (`(1, 0)`) and
/// `formats/f01_mempool` (`(0, 1)`, `(0, 2)`) show both.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolKind {
    /// The allocator's ordinary small and large pools: `(0, 0)`.
    Default,
    /// The private pool of one CUDA graph (and the graphs captured with `pool=` its pool):
    /// `(N, 0)`.
    GraphPrivate,
    /// A pool the program created (`MemPool`, `graph_pool_handle()`): `(0, N)`.
    UserCreated,
    /// Both halves set: no PyTorch writes this; a private pool of unknown kind.
    Private,
}

impl PoolKind {
    /// The kind of a `segment_pool_id`.
    pub fn of(pool_id: (u64, u64)) -> PoolKind {
        match pool_id {
            (0, 0) => PoolKind::Default,
            (_, 0) => PoolKind::GraphPrivate,
            (0, _) => PoolKind::UserCreated,
            _ => PoolKind::Private,
        }
    }

    /// How the segment map names a private pool (`None` for the default pools).
    pub fn title(self) -> Option<&'static str> {
        match self {
            PoolKind::Default => None,
            PoolKind::GraphPrivate => Some("CUDA graph's private pool"),
            PoolKind::UserCreated => Some("user-created pool (MemPool, graph_pool_handle)"),
            PoolKind::Private => Some("private pool"),
        }
    }
}

impl Segment {
    pub fn is_private_pool(&self) -> bool {
        self.pool_id != (0, 0)
    }

    pub fn pool_kind(&self) -> PoolKind {
        PoolKind::of(self.pool_id)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Action {
    Alloc,
    FreeRequested,
    FreeCompleted,
    SegmentAlloc,
    SegmentFree,
    SegmentMap,
    SegmentUnmap,
    Snapshot,
    Oom,
    /// `annotate` (torch >= 2.14, `torch.cuda.memory._annotate_tensor`): a label for the live
    /// allocation at `addr`, its text in `user_metadata`. It allocates and frees nothing.
    Annotate,
    /// `user_defined`, `workspace_snapshot` (torch_npu) and any action this version does not
    /// know (counted in [`SourceInfo::unknown_actions`]).
    Other,
}

/// Every action, in declaration order: an action's index here is its discriminant, which is how
/// [`TraceEvent`] stores it.
pub const ALL_ACTIONS: [Action; 11] = [
    Action::Alloc,
    Action::FreeRequested,
    Action::FreeCompleted,
    Action::SegmentAlloc,
    Action::SegmentFree,
    Action::SegmentMap,
    Action::SegmentUnmap,
    Action::Snapshot,
    Action::Oom,
    Action::Annotate,
    Action::Other,
];

impl Action {
    pub fn name(self) -> &'static str {
        match self {
            Action::Alloc => "alloc",
            Action::FreeRequested => "free_requested",
            Action::FreeCompleted => "free_completed",
            Action::SegmentAlloc => "segment_alloc",
            Action::SegmentFree => "segment_free",
            Action::SegmentMap => "segment_map",
            Action::SegmentUnmap => "segment_unmap",
            Action::Snapshot => "snapshot",
            Action::Oom => "oom",
            Action::Annotate => "annotate",
            Action::Other => "other",
        }
    }

    pub fn parse(s: &str) -> Action {
        match s {
            "alloc" => Action::Alloc,
            "free_requested" => Action::FreeRequested,
            "free_completed" => Action::FreeCompleted,
            "segment_alloc" => Action::SegmentAlloc,
            "segment_free" => Action::SegmentFree,
            "segment_map" => Action::SegmentMap,
            "segment_unmap" => Action::SegmentUnmap,
            "snapshot" => Action::Snapshot,
            "oom" => Action::Oom,
            "annotate" => Action::Annotate,
            _ => Action::Other,
        }
    }
}

/// `time_us` value used when the file has no timestamp for an event.
pub const NO_TIME: i64 = i64::MIN;

/// Largest size of a block, segment or event accepted: 2^48 bytes (256 TiB), a thousand times
/// the memory of any GPU and the span of the 48-bit virtual addresses CUDA hands out. A larger
/// size is refused where it is read, so that an address plus a size never wraps.
pub const MAX_SIZE: u64 = 1 << 48;
/// Largest address accepted: whatever leaves room for a [`MAX_SIZE`] block above it.
pub const MAX_ADDRESS: u64 = u64::MAX - MAX_SIZE;

/// The stream and labels of a trace entry. Few distinct ones occur in a file (a stream or two
/// times a phase label or two), so entries refer to them by [`ContextId`] in
/// [`Snapshot::contexts`] instead of each carrying 16 bytes of them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct EventContext {
    /// A raw `cudaStream_t` value; 0 for the default stream.
    pub stream: u64,
    /// `compile_context` (empty string id when "N/A" or absent).
    pub compile_context: StrId,
    /// `user_metadata` (empty string id when absent).
    pub user_metadata: StrId,
}

/// Index of an [`EventContext`] in [`Snapshot::contexts`]; 0 is the default one (stream 0, no
/// labels), which a snapshot need not list.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ContextId(pub u32);

impl ContextId {
    /// Most contexts a snapshot may hold: the id shares a `u32` with the action.
    pub const LIMIT: u32 = 1 << (32 - ACTION_BITS);
}

/// Bits of [`TraceEvent`]'s tag that hold the action.
const ACTION_BITS: u32 = 4;

/// One trace entry. Compact (32 bytes) because real files hold millions: the action and the
/// entry's [`ContextId`] share one `u32`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TraceEvent {
    /// Address of the block or segment. For `Oom` this holds `device_free` (bytes free on
    /// the device when the allocation failed).
    pub addr: u64,
    /// For `alloc`/`free_*`: the **requested** size, not the block size. For segment events:
    /// the exact segment (or mapping) size. For `oom`: the requested size.
    pub size: u64,
    /// Microseconds since the Unix epoch, or [`NO_TIME`].
    pub time_us: i64,
    pub stack: StackId,
    /// The action's index in [`ALL_ACTIONS`] (low [`ACTION_BITS`] bits) and the [`ContextId`].
    tag: u32,
}

impl TraceEvent {
    /// An entry of `action` at `addr` with no size, time, stack or context.
    pub fn new(action: Action, addr: u64) -> TraceEvent {
        TraceEvent { addr, size: 0, time_us: NO_TIME, stack: StackId::EMPTY, tag: action as u32 }
    }
    /// The entry's action.
    pub fn action(&self) -> Action {
        ALL_ACTIONS[(self.tag & ((1 << ACTION_BITS) - 1)) as usize]
    }
    pub fn set_action(&mut self, action: Action) {
        self.tag = (self.tag & !((1 << ACTION_BITS) - 1)) | action as u32;
    }
    /// The entry's stream and labels, in [`Snapshot::contexts`].
    pub fn context(&self) -> ContextId {
        ContextId(self.tag >> ACTION_BITS)
    }
    /// Give the entry a context; `id` must be below [`ContextId::LIMIT`] (the reader refuses a
    /// file with more).
    pub fn set_context(&mut self, id: ContextId) {
        assert!(id.0 < ContextId::LIMIT, "context id {} past {}", id.0, ContextId::LIMIT);
        self.tag = (self.tag & ((1 << ACTION_BITS) - 1)) | id.0 << ACTION_BITS;
    }
    /// The entry's `size` (see the field).
    pub fn size(&self) -> u64 {
        self.size
    }
    pub fn device_free(&self) -> u64 {
        self.addr
    }
    pub fn has_time(&self) -> bool {
        self.time_us != NO_TIME
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct DeviceTrace {
    pub device: u32,
    /// Every entry, in order; empty after a summary read (`ReadOptions::events` false), which
    /// keeps only [`DeviceTrace::summary`].
    pub events: Vec<TraceEvent>,
    /// What the reader counted of the entries as it read them: all a summary read keeps; beside
    /// the events otherwise (so that their facts are not counted again), except for a trace the
    /// reader did not take as one run of entries, whose facts are counted from the events.
    pub summary: Option<TraceSummary>,
}

/// A trace as a summary read keeps it: its facts and the distinct addresses of its `alloc`
/// events (what tells blocks allocated before the trace began).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TraceSummary {
    pub facts: crate::TraceFacts,
    /// Ascending.
    pub alloc_addresses: Vec<u64>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct AllocatorSettings {
    /// `PYTORCH_CUDA_ALLOC_CONF` as the process saw it.
    pub alloc_conf: Option<String>,
    /// `max_split_size` in bytes; `None` when unlimited (-1) or absent.
    pub max_split_size: Option<u64>,
    pub garbage_collection_threshold: Option<f64>,
    pub expandable_segments: Option<bool>,
    /// `roundup_power2_divisions`: interval start in MiB (a power of two: 1, 2, 4, … 32768, the
    /// file's string keys parsed) → divisions. An allocation of `s` bytes uses the interval
    /// `[k MiB, 2k MiB)` containing it (sizes below 1 MiB use key 1, sizes above the last key
    /// use the last key). Zero divisions are omitted.
    pub roundup_power2_divisions: BTreeMap<u64, u64>,
    /// `trace_alloc_overflowed`: whether the trace ring buffer dropped its oldest entries.
    /// `None` when the file does not say (no release through 2.15 writes it; PyTorch PR #179276
    /// proposed it), and then a wrap can only be inferred.
    pub trace_overflowed: Option<bool>,
    /// `trace_alloc_max_entries`: the ring buffer's size (`max_entries`), when the file says.
    pub trace_max_entries: Option<u64>,
    /// Every setting as text, for display (sorted by key).
    pub raw: BTreeMap<String, String>,
}

/// What the file says of pinned host memory: `host_segments` (one block each, `device: -1`)
/// and the length of `host_traces`. `present` is false when the file has neither key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostMemory {
    pub present: bool,
    pub segments: u64,
    /// Sum of the host segments' `total_size`.
    pub reserved_bytes: u64,
    /// Sum of the sizes of their `active_allocated` blocks.
    pub allocated_bytes: u64,
    pub trace_entries: u64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Annotation {
    pub name: String,
    /// True for `START`, false for `END`.
    pub start: bool,
    pub device: u32,
    pub time_us: i64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Producer {
    /// `torch.cuda.memory._dump_snapshot` (Python pickler, protocol ≥ 4 with MEMOIZE).
    #[default]
    PythonPickler,
    /// `torch::cuda::_memory_snapshot_pickled` (C++ pickler, protocol 2, BINPUT after containers).
    CppPickler,
    /// Something else (re-pickled, third-party, or unrecognised).
    Other,
    /// `torch.save` of the snapshot dict (`torch.cuda.memory._snapshot()`): a zip archive whose
    /// `data.pkl` is the pickle (protocol 2).
    TorchSave,
}

impl Producer {
    pub fn name(self) -> &'static str {
        match self {
            Producer::PythonPickler => "python-pickler",
            Producer::CppPickler => "cpp-pickler",
            Producer::Other => "other",
            Producer::TorchSave => "torch-save",
        }
    }
}

/// Facts about the file itself rather than the allocator.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SourceInfo {
    /// Pickle protocol (from PROTO; 0 or 1 when absent).
    pub protocol: u8,
    pub producer: Producer,
    /// Top level was a bare list of segments (old `memory_snapshot()` users).
    pub bare_segment_list: bool,
    /// Blocks carried `history` instead of `frames` (torch ≤ 2.0).
    pub legacy_history: bool,
    /// Number of blocks whose address was derived (missing `address`).
    pub derived_addresses: u64,
    /// Unknown keys by key path pattern (e.g. `segments[].foo`) → count.
    pub unknown_keys: BTreeMap<String, u64>,
    /// Unknown trace actions → count.
    pub unknown_actions: BTreeMap<String, u64>,
    /// Any frame is a C++ frame (`stacks="all"`).
    pub has_cpp_frames: bool,
    /// Number of trace events that carry at least one frame.
    pub events_with_frames: u64,
    /// The file had a `device_traces` key.
    pub has_trace_key: bool,
    /// Largest approximate memory the reader's objects took while parsing (what the object
    /// budget, `memsnap_pickle::ObjectBudget`, is measured on).
    pub peak_built_bytes: u64,
    /// Bytes of the pickle the parallel trace reader read (the rest the VM read alone); 0 for
    /// a sequential read.
    pub parallel_bytes: u64,
    /// Windows of the input the parallel trace reader scanned (the work it spent, whether or not
    /// it could read them).
    pub parallel_windows: u64,
}

/// A whole memory snapshot.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    /// Device segments. Pinned host memory is never among them (see [`Snapshot::host`]).
    pub segments: Vec<Segment>,
    /// One per device index that the file lists (index in the file = `device`).
    pub traces: Vec<DeviceTrace>,
    pub settings: AllocatorSettings,
    pub annotations: Vec<Annotation>,
    /// Pinned host memory (`host_segments`, `host_traces`; torch >= 2.14 with
    /// `record_pinned_host_memory=True`), kept apart from every device total.
    pub host: HostMemory,
    pub strings: Vec<String>,
    pub frames: Vec<Frame>,
    pub stacks: Vec<Stack>,
    /// The trace entries' streams and labels, by [`ContextId`]; index 0, when listed, is the
    /// default context.
    pub contexts: Vec<EventContext>,
    pub source: SourceInfo,
}

impl Snapshot {
    pub fn str(&self, id: StrId) -> &str {
        self.strings.get(id.0 as usize).map(String::as_str).unwrap_or("")
    }
    pub fn frame(&self, id: FrameId) -> &Frame {
        &self.frames[id.0 as usize]
    }
    pub fn stack(&self, id: StackId) -> &Stack {
        &self.stacks[id.0 as usize]
    }
    /// A trace entry's stream and labels.
    pub fn context(&self, e: &TraceEvent) -> EventContext {
        self.contexts.get(e.context().0 as usize).copied().unwrap_or_default()
    }
    /// The id of `context`, added to [`Snapshot::contexts`] when new (a linear search: for
    /// building small snapshots by hand; the reader keeps its own index).
    pub fn intern_context(&mut self, context: EventContext) -> ContextId {
        if self.contexts.is_empty() {
            self.contexts.push(EventContext::default());
        }
        let at = self.contexts.iter().position(|c| *c == context).unwrap_or_else(|| {
            self.contexts.push(context);
            self.contexts.len() - 1
        });
        ContextId(at as u32)
    }
    /// Frames of a stack, innermost first.
    pub fn stack_frames(&self, id: StackId) -> impl Iterator<Item = &Frame> + '_ {
        self.stack(id).frames.iter().map(move |f| self.frame(*f))
    }
    /// Sorted list of device indices that have segments or trace events.
    pub fn device_ids(&self) -> Vec<u32> {
        let mut ids: Vec<u32> = self.segments.iter().map(|s| s.device).collect();
        ids.extend(self.traces.iter().filter(|t| t.entries() > 0).map(|t| t.device));
        ids.sort_unstable();
        ids.dedup();
        ids
    }
    /// Indices into `segments` of each device's segments, in one pass: per-device work must not
    /// scan every segment once per device (a file may list 100 000 devices).
    pub fn segments_by_device(&self) -> BTreeMap<u32, Vec<usize>> {
        let mut by: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
        for (k, s) in self.segments.iter().enumerate() {
            by.entry(s.device).or_default().push(k);
        }
        by
    }
    /// Each device's annotations in file order, in one pass (see [`Snapshot::segments_by_device`]).
    pub fn annotations_by_device(&self) -> BTreeMap<u32, Vec<Annotation>> {
        let mut by: BTreeMap<u32, Vec<Annotation>> = BTreeMap::new();
        for a in &self.annotations {
            by.entry(a.device).or_default().push(a.clone());
        }
        by
    }
    pub fn trace(&self, device: u32) -> Option<&DeviceTrace> {
        // Traces are stored at their device index; the scan is only a fallback.
        match self.traces.get(device as usize) {
            Some(t) if t.device == device => Some(t),
            _ => find_device(&self.traces, device, |t| t.device),
        }
    }
}

/// Where a frame comes from: the user's code, an installed library / the standard library,
/// or native code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FrameKind {
    User,
    Library,
    Native,
}

/// Classify a frame by its filename (see `docs/detectors.md`): C++ frames (`??`, `.cpp`, `.h`,
/// `.cu`, no filename) are native; anything under `site-packages`, `dist-packages`, the
/// standard library (`/lib/pythonX.Y/`) or `<frozen …>`/`<…>` is library; the rest is user code.
pub fn classify_filename(filename: &str) -> FrameKind {
    let f = filename;
    if f.is_empty()
        || f == "??"
        || f.ends_with(".cpp")
        || f.ends_with(".h")
        || f.ends_with(".cu")
        || f.ends_with(".cc")
        || f.ends_with(".hpp")
        || f.ends_with(".cuh")
        || f.contains(".so")
    {
        return FrameKind::Native;
    }
    // Code that torch.compile generated (`/tmp/torchinductor_<user>/…`) is not a line the user
    // wrote: the line that called the compiled function is.
    if f.contains("site-packages") || f.contains("dist-packages") || f.starts_with('<') || f.contains("/torchinductor_")
    {
        return FrameKind::Library;
    }
    if is_stdlib_path(f) {
        return FrameKind::Library;
    }
    FrameKind::User
}

fn is_stdlib_path(f: &str) -> bool {
    // `/usr/lib/python3.11/…`, `/root/.pyenv/versions/3.11.7/lib/python3.11/…`,
    // `C:\Python311\Lib\…`
    if let Some(pos) = f.find("/lib/python") {
        let rest = &f[pos + "/lib/python".len()..];
        if rest.chars().next().is_some_and(|c| c.is_ascii_digit()) {
            return true;
        }
    }
    if f.contains("\\Lib\\") {
        return true;
    }
    // A source checkout of PyTorch (editable install) is still not the user's code.
    const TORCH_DIRS: [&str; 10] = [
        "/torch/nn/",
        "/torch/autograd/",
        "/torch/optim/",
        "/torch/utils/",
        "/torch/cuda/",
        "/torch/_",
        "/torch/distributed/",
        "/torch/amp/",
        "/torch/functional.py",
        "/torch/fx/",
    ];
    TORCH_DIRS.iter().any(|d| f.contains(d))
}

/// Bytes with a binary unit (`1.92 GiB`, `512 B`) and `decimals` digits after the point, as
/// `torch.cuda.memory_summary()` prints them. One helper for every crate and command.
pub fn format_bytes(b: u64, decimals: usize) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.decimals$} {}", UNITS[u])
    }
}

/// `1 block`, `3 blocks`: a count with its noun, singular for one. `noun` is the singular and
/// the plural adds `s`; [`plural`] takes both forms (`pass`, `passes`).
pub fn count_of(n: u64, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// `1 forward pass`, `2 forward passes`: a count with the form of its noun that agrees.
pub fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", agree(n, one, many))
}

/// The word that agrees with a count: `one` for 1, `many` otherwise (`block`/`blocks`,
/// `is`/`are`, `its`/`their`).
pub fn agree<'a>(n: u64, one: &'a str, many: &'a str) -> &'a str {
    if n == 1 {
        one
    } else {
        many
    }
}

/// Bytes humanised, then exact: `134.02 MiB (140526592 bytes)`; just `0 bytes`, `1 byte`,
/// `512 bytes` below 1 KiB, where the humanised form would say the same thing.
pub fn bytes_exact(b: u64) -> String {
    if b < 1024 {
        return plural(b, "byte", "bytes");
    }
    format!("{} ({b} bytes)", format_bytes(b, 2))
}

/// The entry for `device` in a table sorted by device (every per-device table in memsnap is), in
/// O(log n): a lookup per device must not make per-device work quadratic.
pub fn find_device<T>(sorted: &[T], device: u32, key: impl Fn(&T) -> u32) -> Option<&T> {
    sorted.binary_search_by_key(&device, key).ok().map(|i| &sorted[i])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_agree_with_their_nouns() {
        assert_eq!(plural(1, "block", "blocks"), "1 block");
        assert_eq!(plural(0, "block", "blocks"), "0 blocks");
        assert_eq!(count_of(1, "segment"), "1 segment");
        assert_eq!(count_of(2, "segment"), "2 segments");
        assert_eq!(agree(1, "is", "are"), "is");
    }

    #[test]
    fn bytes_humanised_then_exact() {
        assert_eq!(bytes_exact(0), "0 bytes");
        assert_eq!(bytes_exact(1), "1 byte");
        assert_eq!(bytes_exact(512), "512 bytes");
        assert_eq!(bytes_exact(140526592), "134.02 MiB (140526592 bytes)");
    }
}

#[cfg(test)]
mod event_layout_tests {
    use super::*;

    #[test]
    fn an_event_is_32_bytes() {
        assert_eq!(std::mem::size_of::<TraceEvent>(), 32);
    }

    /// The tag stores an action as its discriminant, read back through `ALL_ACTIONS`.
    #[test]
    fn action_and_context_share_the_tag_without_mixing() {
        for (i, &a) in ALL_ACTIONS.iter().enumerate() {
            assert_eq!(a as usize, i, "{a:?}");
            for id in [0, 1, 12345, ContextId::LIMIT - 1] {
                let mut e = TraceEvent::new(Action::Other, 7);
                e.set_context(ContextId(id));
                e.set_action(a);
                assert_eq!((e.action(), e.context()), (a, ContextId(id)));
                e.set_context(ContextId(3));
                assert_eq!((e.action(), e.context()), (a, ContextId(3)));
            }
        }
    }

    #[test]
    fn a_snapshot_without_contexts_gives_the_default_one() {
        let mut s = Snapshot::default();
        let e = TraceEvent::new(Action::Alloc, 0);
        assert_eq!(s.context(&e), EventContext::default());
        let c = EventContext { stream: 9, compile_context: StrId(2), user_metadata: StrId(3) };
        let id = s.intern_context(c);
        assert_eq!(s.intern_context(c), id);
        let mut e = e;
        e.set_context(id);
        assert_eq!(s.context(&e), c);
    }
}
