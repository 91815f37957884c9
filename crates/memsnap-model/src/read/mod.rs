//! Building a [`Snapshot`] from pickle bytes.
//!
//! Trace entries are converted while the pickle is read (see [`TraceCompactor`]): a 1 GB file
//! holds 12 M of them, and as generic dicts they would take several times the file size.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap as HashMap;
use std::fmt;

use std::io::{self, Read};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use memsnap_pickle::{
    Compactor, Heap, Limits, ListStore, Parsed, PickleError, Progress, ReadSource, SliceSource, Source, Value,
};

use crate::types::*;

mod contexts;
mod parallel;
mod torch_save;

use contexts::Contexts;

/// Why a file could not be read as a snapshot.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{0}")]
    Pickle(#[from] PickleError),
    /// The pickle is fine but its content is not a snapshot; `path` is a key path such as
    /// `segments[3].blocks[17].size`.
    #[error("{path}: {message}")]
    Shape { path: String, message: String },
    /// A summary read (`ReadOptions::events` false) met a trace list it cannot count without
    /// the events (entries shared between lists, or mixed with other values).
    #[error("{path}: trace entries shared between lists; read the file with its events")]
    NeedsEvents { path: String },
}

fn shape(path: impl fmt::Display, message: impl Into<String>) -> ReadError {
    ReadError::Shape { path: path.to_string(), message: message.into() }
}

/// Options for [`read_snapshot_with`] and [`read_snapshot_from`].
pub struct ReadOptions<'p> {
    pub limits: Limits,
    /// Called with the byte offset reached, about every `progress_every` bytes.
    pub progress: Option<&'p mut dyn FnMut(usize)>,
    pub progress_every: usize,
    /// The pickle's size when something other than the pickle says it (a regular file's
    /// length), else 0. It lets a `FRAME` longer than the file be reported as truncation where
    /// it is, and bounds the parallel reader's window to a share of the pickle (without it, to
    /// a share of the bytes read so far); the output does not depend on it.
    pub size_hint: u64,
    /// Bytes of the input as stored (compressed), counted while it is read (see
    /// [`memsnap_pickle::CountingReader`]); the object budget is measured against it. `None`
    /// when the input is the pickle itself.
    pub stored_bytes: Option<Arc<AtomicU64>>,
    /// Read the trace with the VM alone instead of in parallel chunks (see
    /// `read::parallel`): the reference the parallel reader is tested against. The output
    /// is the same.
    pub sequential: bool,
    /// Keep every trace event (the default). `false` is a summary read: each trace keeps
    /// only its counts ([`DeviceTrace::summary`]), which is all `summary` prints, in a
    /// fraction of the memory. A file whose trace lists share entries cannot be counted that
    /// way: it fails with [`ReadError::NeedsEvents`], to be read again with events.
    pub events: bool,
    /// Bytes per chunk of the parallel reader (0: its default, 1 MiB). Tests make it small
    /// so that chunk boundaries fall everywhere in small files; the output never depends on it.
    #[doc(hidden)]
    pub chunk_bytes: usize,
}

impl Default for ReadOptions<'_> {
    fn default() -> Self {
        ReadOptions {
            limits: Limits::default(),
            progress: None,
            progress_every: 64 << 20,
            size_hint: 0,
            stored_bytes: None,
            sequential: false,
            events: true,
            chunk_bytes: 0,
        }
    }
}

/// Read a snapshot from (decompressed) pickle bytes.
pub fn read_snapshot(data: &[u8]) -> Result<Snapshot, ReadError> {
    read_snapshot_with(data, ReadOptions::default())
}

/// Read a snapshot from pickle bytes in memory (strings are borrowed while reading).
pub fn read_snapshot_with(data: &[u8], opts: ReadOptions<'_>) -> Result<Snapshot, ReadError> {
    // The same first bytes a reader sees, so that both paths say the same (the fuzz target
    // checks it).
    if data.starts_with(torch_save::ZIP_MAGIC) {
        let start = torch_save::pickle_offset(data)?;
        let data = &data[start..];
        judge_head(&data[..data.len().min(HEAD)], data.len() < HEAD)?;
        return read_source(SliceSource::new(data), opts).map(saved_with_torch_save);
    }
    judge_head(&data[..data.len().min(HEAD)], data.len() < HEAD)?;
    read_source(SliceSource::new(data), opts)
}

/// A snapshot read from the `data.pkl` of a `torch.save` archive ([`torch_save`]).
fn saved_with_torch_save(mut snap: Snapshot) -> Snapshot {
    snap.source.producer = Producer::TorchSave;
    snap
}

/// Read a snapshot from a reader (a file, a pipe, a decompressor), through a fixed window:
/// memory follows what the snapshot holds, not the size of the input.
pub fn read_snapshot_from<R: Read>(reader: R, opts: ReadOptions<'_>) -> Result<Snapshot, ReadError> {
    let (head, got, mut stream) = peek_head(reader)?;
    if head[..got].starts_with(torch_save::ZIP_MAGIC) {
        torch_save::skip_header(&mut stream)?;
        let (head, got, stream) = peek_head(stream)?;
        judge_head(&head[..got], got < HEAD)?;
        // The file's size is not the pickle's: no length hint.
        return parse_stream(stream, ReadOptions { size_hint: 0, ..opts }).map(saved_with_torch_save);
    }
    judge_head(&head[..got], got < HEAD)?;
    parse_stream(stream, opts)
}

/// The first [`HEAD`] bytes of `reader` (fewer when it ends first: how many), and a stream that
/// gives them again, then the rest.
#[allow(clippy::type_complexity)]
fn peek_head<R: Read>(
    mut reader: R,
) -> Result<([u8; HEAD], usize, io::Chain<io::Take<io::Cursor<[u8; HEAD]>>, R>), ReadError> {
    let mut head = [0u8; HEAD];
    let got = read_up_to(&mut reader, &mut head)?;
    Ok((head, got, io::Cursor::new(head).take(got as u64).chain(reader)))
}

/// Parse the pickle `stream` holds from its first byte.
fn parse_stream<R: Read>(stream: R, opts: ReadOptions<'_>) -> Result<Snapshot, ReadError> {
    let mut source = match opts.stored_bytes.clone() {
        Some(stored) => ReadSource::with_stored_count(stream, stored),
        None => ReadSource::new(stream),
    };
    if opts.size_hint > 0 {
        source = source.with_len_hint(opts.size_hint);
    }
    read_source(source, opts)
}

/// Bytes looked at before parsing, to tell other formats from a pickle.
const HEAD: usize = 8;

/// Read until `buf` is full or the input ends; how many bytes were read.
pub(super) fn read_up_to(reader: &mut impl Read, buf: &mut [u8]) -> Result<usize, ReadError> {
    let mut got = 0;
    while got < buf.len() {
        match reader.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                return Err(ReadError::Pickle(PickleError {
                    offset: got,
                    opcode: None,
                    kind: memsnap_pickle::ErrorKind::Input(e.to_string()),
                }))
            }
        }
    }
    Ok(got)
}

/// Refuse what is plainly not a pickle from its first bytes, saying what it looks like.
/// Anything that starts with an opcode goes to the VM, which names the opcode where it fails.
fn judge_head(head: &[u8], whole: bool) -> Result<(), ReadError> {
    let Some(&first) = head.first() else {
        return Err(shape("input", "empty file (0 bytes): not a snapshot"));
    };
    if head.starts_with(torch_save::ZIP_MAGIC) {
        // A zip inside the data.pkl of a zip.
        return Err(shape("byte 0", "not a pickle: a zip archive"));
    }
    let hint = if first == b'{' || first == b'[' {
        " (looks like JSON)"
    } else if is_opcode(first) {
        return Ok(());
    } else if first == 0 && whole && head.iter().all(|&b| b == 0) {
        " (only zero bytes)"
    } else if first == 0 && head.iter().all(|&b| b == 0) {
        " (starts with zero bytes)"
    } else {
        ""
    };
    Err(shape("byte 0", format!("not a pickle: first byte 0x{first:02x} is no pickle opcode{hint}")))
}

/// Whether `b` is an opcode of some pickle protocol (protocol 0 and 1 pickles start with any).
fn is_opcode(b: u8) -> bool {
    memsnap_pickle::opcode_name(b) != "unknown"
}

fn read_source<'a, S: Source<'a>>(source: S, opts: ReadOptions<'_>) -> Result<Snapshot, ReadError> {
    let mut b = Builder {
        parallel: !opts.sequential,
        keep_events: opts.events,
        chunk_bytes: opts.chunk_bytes,
        input_len: opts.size_hint,
        ..Builder::default()
    };
    // String 0 is always "" (see `StrId::EMPTY`).
    b.intern("");
    b.na_id = Some(StrId(b.intern("N/A")));
    let ReadOptions { limits, progress, progress_every, .. } = opts;
    let parsed = {
        let progress = progress.map(|callback| Progress { every: progress_every, callback });
        memsnap_pickle::parse_source(source, &mut b, &limits, progress)?
    };
    b.finish(parsed)
}

// ---------------------------------------------------------------------------------------------

/// Known keys, decoded once per distinct heap string (keys are shared through the memo, so a
/// file with millions of events has only a handful of key strings).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Key {
    Action,
    Addr,
    Size,
    Stream,
    TimeUs,
    Frames,
    CompileContext,
    UserMetadata,
    DeviceFree,
    /// Keys of a trace entry that memsnap knows and reads past: `pool_id` (torch >= 2.12; the
    /// segment holding the address gives the pool), `internal_metadata` (2.15), `category`
    /// (`_profile_to_snapshot`), `forward_frames` (2.11, anomaly mode: the forward stack of the
    /// autograd node a backward allocation ran for).
    Unneeded,
    Filename,
    Line,
    Name,
    Other,
}

fn key_of(s: &str) -> Key {
    match s {
        "action" => Key::Action,
        "addr" => Key::Addr,
        "size" => Key::Size,
        "stream" => Key::Stream,
        "time_us" => Key::TimeUs,
        "frames" => Key::Frames,
        "compile_context" => Key::CompileContext,
        "user_metadata" => Key::UserMetadata,
        "device_free" => Key::DeviceFree,
        "pool_id" | "internal_metadata" | "category" | "forward_frames" => Key::Unneeded,
        "filename" => Key::Filename,
        "line" => Key::Line,
        "name" => Key::Name,
        _ => Key::Other,
    }
}

const UNSEEN: u32 = u32::MAX;

/// Interning tables plus the compacted trace events.
#[derive(Default)]
struct Builder {
    strings: Vec<String>,
    string_ids: HashMap<String, u32>,
    frames: Vec<Frame>,
    frame_ids: HashMap<Frame, u32>,
    stacks: Vec<Stack>,
    stack_ids: HashMap<Vec<FrameId>, u32>,
    /// heap string index → key code (u8::MAX = not yet decoded).
    key_cache: Vec<u8>,
    /// The `frames` list of the event converted last (for freezing).
    last_frames_list: Option<u32>,
    /// heap string index → action.
    action_cache: Vec<Option<Action>>,
    /// Interned id of "N/A" (the `compile_context` of events outside torch.compile).
    na_id: Option<StrId>,
    /// heap string index → interned string id.
    str_cache: Vec<u32>,
    /// heap list index → stack id (frames lists are shared through the memo).
    stack_cache: HashMap<u32, StackId>,
    /// heap tuple index → stack id, for producers that write `frames` as tuples.
    tuple_stack_cache: HashMap<u32, StackId>,
    /// heap dict index → frame id. Frame dicts are never compacted, so indexes are stable.
    frame_cache: HashMap<u32, FrameId>,
    /// The events' streams and labels ([`Snapshot::contexts`]) and their index.
    contexts: Contexts,
    events: Vec<TraceEvent>,
    unknown_keys: BTreeMap<String, u64>,
    unknown_actions: BTreeMap<String, u64>,
    has_cpp_frames: bool,
    events_with_frames: u64,
    /// Bytes held by interned strings and stacks (twice: the vector and the lookup map), for
    /// the object budget.
    interned_bytes: u64,
    /// Whether trace batches may be read in parallel ([`parallel`]).
    parallel: bool,
    /// The parallel reader's chunk buffers, reused from window to window.
    chunk_pool: Vec<parallel::Chunk>,
    converted_pool: Vec<parallel::Converted>,
    /// The parallel reader waits until the VM reaches this offset (see `parallel::back_off`).
    resume_at: u64,
    /// Its current wait, in bytes (0: none).
    backoff: u64,
    /// Windows the parallel reader scanned (`SourceInfo::parallel_windows`).
    windows_scanned: u64,
    /// Where the last window the parallel reader read to its end ended (0: none yet): a window
    /// that starts there needs no probe (see `parallel::fast_forward`).
    whole_window_end: u64,
    /// [`ReadOptions::chunk_bytes`].
    chunk_bytes: usize,
    /// [`ReadOptions::size_hint`]: the pickle's size when known (0: not), which bounds the
    /// parallel reader's window (`parallel::cut`).
    input_len: u64,
    /// Whether events are kept (they are tallied per list either way; a summary read keeps
    /// only the tallies).
    keep_events: bool,
    /// Records handed out so far (`Value::Record` ids): events kept or tallied.
    records: u32,
    /// Per heap list, the tally of the events appended to it (all a summary read keeps of them).
    tallies: HashMap<u32, crate::TraceTally>,
}

/// Why a value did not fit: (key, expected, found).
struct FieldError {
    key: String,
    expected: &'static str,
    found: String,
}

impl FieldError {
    fn new(key: &str, expected: &'static str, found: &str) -> FieldError {
        FieldError { key: key.to_string(), expected, found: found.to_string() }
    }
}

fn describe(heap: &Heap<'_>, v: Value) -> String {
    match v {
        Value::Str(s) => {
            let t: String = heap.str(s).chars().take(24).collect();
            format!("str {t:?}")
        }
        Value::Int(i) => format!("int {i}"),
        Value::BigInt(b) => format!("int {}", heap.bigints[b as usize]),
        Value::Float(f) => format!("float {f}"),
        other => other.type_name().to_string(),
    }
}

fn as_u64(heap: &Heap<'_>, v: Value, key: &str) -> Result<u64, FieldError> {
    match heap.as_i128(v) {
        Some(i) if (0..=u64::MAX as i128).contains(&i) => Ok(i as u64),
        Some(_) => Err(FieldError::new(key, "a non-negative int below 2^64", &describe(heap, v))),
        None => Err(FieldError::new(key, "int", &describe(heap, v))),
    }
}

/// A device index: it must fit the model's 32 bits (torch's own are 8-bit), never clamped.
fn as_device(heap: &Heap<'_>, v: Value, key: &str) -> Result<u32, FieldError> {
    match heap.as_i128(v) {
        Some(i) if (0..=u32::MAX as i128).contains(&i) => Ok(i as u32),
        _ => Err(FieldError::new(key, "a device index from 0 to 2^32 - 1", &describe(heap, v))),
    }
}

/// A block, segment or event size: at most [`MAX_SIZE`].
fn as_size(heap: &Heap<'_>, v: Value, key: &str) -> Result<u64, FieldError> {
    match as_u64(heap, v, key)? {
        s if s <= MAX_SIZE => Ok(s),
        _ => Err(FieldError::new(key, "a size of at most 2^48 bytes (256 TiB)", &describe(heap, v))),
    }
}

/// An address: at most [`MAX_ADDRESS`].
fn as_address(heap: &Heap<'_>, v: Value, key: &str) -> Result<u64, FieldError> {
    match as_u64(heap, v, key)? {
        a if a <= MAX_ADDRESS => Ok(a),
        _ => Err(FieldError::new(key, "an address below 2^64 - 2^48", &describe(heap, v))),
    }
}

/// `stream` values are handles; some producers write them as signed.
fn as_stream(heap: &Heap<'_>, v: Value, key: &str) -> Result<u64, FieldError> {
    match heap.as_i128(v) {
        Some(i) if i >= i64::MIN as i128 && i <= u64::MAX as i128 => Ok(i as u64),
        _ => Err(FieldError::new(key, "int", &describe(heap, v))),
    }
}

/// A `time_us`: any 64-bit value but −2^63, which the model keeps for "no time" ([`NO_TIME`]).
fn as_time(heap: &Heap<'_>, v: Value, key: &str) -> Result<i64, FieldError> {
    match as_i64(heap, v, key)? {
        NO_TIME => Err(FieldError::new(key, "a time above -2^63 microseconds", &describe(heap, v))),
        t => Ok(t),
    }
}

fn as_i64(heap: &Heap<'_>, v: Value, key: &str) -> Result<i64, FieldError> {
    match heap.as_i128(v) {
        Some(i) if i >= i64::MIN as i128 && i <= i64::MAX as i128 => Ok(i as i64),
        Some(_) => Err(FieldError::new(key, "an int that fits 64 bits", &describe(heap, v))),
        None => match v {
            Value::Float(f) if f.is_finite() => Ok(f as i64),
            _ => Err(FieldError::new(key, "int", &describe(heap, v))),
        },
    }
}

impl Builder {
    fn intern(&mut self, s: &str) -> u32 {
        if let Some(&id) = self.string_ids.get(s) {
            return id;
        }
        let id = self.strings.len() as u32;
        self.interned_bytes += 2 * (s.len() as u64 + 24);
        self.strings.push(s.to_string());
        self.string_ids.insert(s.to_string(), id);
        id
    }

    /// The interned id of heap string `s`, if [`Builder::heap_str_id`] gave it one.
    fn cached_str_id(&self, s: u32) -> Option<StrId> {
        self.str_cache.get(s as usize).filter(|&&id| id != UNSEEN).map(|&id| StrId(id))
    }

    fn heap_str_id(&mut self, heap: &Heap<'_>, s: u32) -> StrId {
        let i = s as usize;
        if i >= self.str_cache.len() {
            self.str_cache.resize(heap.strs.len().max(i + 1), UNSEEN);
        }
        if self.str_cache[i] == UNSEEN {
            let id = self.intern(heap.str(s));
            self.str_cache[i] = id;
        }
        StrId(self.str_cache[i])
    }

    /// The action named by a heap string, decoded once per distinct string.
    fn action(&mut self, heap: &Heap<'_>, s: u32) -> Action {
        let i = s as usize;
        if i >= self.action_cache.len() {
            self.action_cache.resize(heap.strs.len().max(i + 1), None);
        }
        *self.action_cache[i].get_or_insert_with(|| Action::parse(heap.str(s)))
    }

    fn key(&mut self, heap: &Heap<'_>, k: Value) -> Key {
        let Value::Str(s) = k else { return Key::Other };
        let i = s as usize;
        if i >= self.key_cache.len() {
            self.key_cache.resize(heap.strs.len().max(i + 1), u8::MAX);
        }
        if self.key_cache[i] == u8::MAX {
            self.key_cache[i] = key_of(heap.str(s)) as u8;
        }
        KEYS[self.key_cache[i] as usize]
    }
}

/// Key codes in discriminant order, to decode the cache.
const KEYS: [Key; 14] = [
    Key::Action,
    Key::Addr,
    Key::Size,
    Key::Stream,
    Key::TimeUs,
    Key::Frames,
    Key::CompileContext,
    Key::UserMetadata,
    Key::DeviceFree,
    Key::Unneeded,
    Key::Filename,
    Key::Line,
    Key::Name,
    Key::Other,
];

impl Builder {
    fn text(&mut self, heap: &Heap<'_>, v: Value, key: &str) -> Result<StrId, FieldError> {
        match v {
            Value::Str(s) => Ok(self.heap_str_id(heap, s)),
            Value::None => Ok(StrId::EMPTY),
            other => Err(FieldError::new(key, "str", &describe(heap, other))),
        }
    }

    fn frame(&mut self, heap: &Heap<'_>, v: Value) -> Result<FrameId, FieldError> {
        let Value::Dict(d) = v else {
            return Err(FieldError::new("", "frame dict", &describe(heap, v)));
        };
        if let Some(&f) = self.frame_cache.get(&d) {
            return Ok(f);
        }
        let mut filename = None;
        let mut line = 0u32;
        let mut name = None;
        for &(k, val) in heap.dict(d) {
            match self.key(heap, k) {
                Key::Filename => filename = Some(self.text(heap, val, "filename")?),
                Key::Name => name = Some(self.text(heap, val, "name")?),
                Key::Line => {
                    line = match heap.as_i128(val) {
                        Some(l) => l.clamp(0, u32::MAX as i128) as u32,
                        None if val == Value::None => 0,
                        None => return Err(FieldError::new("line", "int", &describe(heap, val))),
                    }
                }
                // fx_node_* and fx_original_trace (augment_with_fx_traces) are not needed.
                _ => {}
            }
        }
        let empty = StrId::EMPTY;
        let frame = Frame { filename: filename.unwrap_or(empty), line, name: name.unwrap_or(empty) };
        let id = self.add_frame(frame);
        self.frame_cache.insert(d, id);
        Ok(id)
    }

    /// Intern a converted frame.
    fn add_frame(&mut self, frame: Frame) -> FrameId {
        if !self.has_cpp_frames {
            let f = &self.strings[frame.filename.0 as usize];
            if classify_filename(f) == FrameKind::Native {
                self.has_cpp_frames = true;
            }
        }
        match self.frame_ids.get(&frame) {
            Some(&id) => FrameId(id),
            None => {
                let id = self.frames.len() as u32;
                self.frames.push(frame.clone());
                self.frame_ids.insert(frame, id);
                FrameId(id)
            }
        }
    }

    fn stack(&mut self, heap: &Heap<'_>, v: Value) -> Result<StackId, FieldError> {
        let list_id = match v {
            Value::List(id) => Some(id),
            Value::Tuple(_) => None,
            Value::None => return Ok(StackId::EMPTY),
            other => return Err(FieldError::new("frames", "list of frames", &describe(heap, other))),
        };
        if let Some(id) = list_id {
            if let ListStore::Frozen(token) = heap.list(id) {
                return Ok(StackId(*token));
            }
        }
        let n = heap.seq_len(v).unwrap_or(0);
        if n == 0 {
            // Frameless events each bring a fresh empty list: nothing to cache.
            return Ok(StackId::EMPTY);
        }
        if let Some(id) = list_id {
            if let Some(&s) = self.stack_cache.get(&id) {
                return Ok(s);
            }
        }
        if let Value::Tuple(id) = v {
            if let Some(&s) = self.tuple_stack_cache.get(&id) {
                return Ok(s);
            }
        }
        let mut frames = Vec::with_capacity(n.min(4096));
        for i in 0..n {
            let f = heap.seq_get(v, i).unwrap_or(Value::None);
            let fid = self.frame(heap, f).map_err(|mut e| {
                e.key = if e.key.is_empty() { format!("frames[{i}]") } else { format!("frames[{i}].{}", e.key) };
                e
            })?;
            frames.push(fid);
        }
        let sid = self.intern_stack(frames);
        if let Some(id) = list_id {
            self.stack_cache.insert(id, sid);
        }
        if let Value::Tuple(id) = v {
            self.tuple_stack_cache.insert(id, sid);
        }
        Ok(sid)
    }

    fn intern_stack(&mut self, frames: Vec<FrameId>) -> StackId {
        if self.stacks.is_empty() {
            self.stacks.push(Stack::default());
            self.stack_ids.insert(Vec::new(), 0);
        }
        if let Some(&id) = self.stack_ids.get(&frames) {
            return StackId(id);
        }
        let id = self.stacks.len() as u32;
        self.interned_bytes += 2 * (frames.len() as u64 * 4 + 24);
        self.stacks.push(Stack { frames: frames.clone() });
        self.stack_ids.insert(frames, id);
        StackId(id)
    }

    /// Convert one trace-entry dict. Unknown keys are returned for counting on success.
    fn event(&mut self, heap: &Heap<'_>, d: u32, unknown: &mut Vec<u32>) -> Result<TraceEvent, FieldError> {
        let empty = StrId::EMPTY;
        let mut ev = TraceEvent::new(Action::Other, 0);
        let mut context = EventContext::default();
        let mut action_seen = false;
        let mut device_free = None;
        for &(k, v) in heap.dict(d) {
            match self.key(heap, k) {
                Key::Action => {
                    let Value::Str(s) = v else {
                        return Err(FieldError::new("action", "str", &describe(heap, v)));
                    };
                    ev.set_action(self.action(heap, s));
                    if ev.action() == Action::Other {
                        *self.unknown_actions.entry(heap.str(s).to_string()).or_default() += 1;
                    }
                    action_seen = true;
                }
                Key::Addr => ev.addr = as_address(heap, v, "addr")?,
                Key::Size => ev.size = as_size(heap, v, "size")?,
                Key::Stream => context.stream = as_stream(heap, v, "stream")?,
                Key::TimeUs => ev.time_us = if v == Value::None { NO_TIME } else { as_time(heap, v, "time_us")? },
                Key::Frames => {
                    ev.stack = self.stack(heap, v)?;
                    if let Value::List(l) = v {
                        self.last_frames_list = Some(l);
                    }
                }
                Key::CompileContext => {
                    let s = self.text(heap, v, "compile_context")?;
                    context.compile_context = if Some(s) == self.na_id { empty } else { s };
                }
                Key::UserMetadata => context.user_metadata = self.text(heap, v, "user_metadata")?,
                Key::DeviceFree => device_free = Some(as_u64(heap, v, "device_free")?),
                Key::Unneeded => {}
                _ => {
                    if let Value::Str(s) = k {
                        unknown.push(s);
                    }
                }
            }
        }
        if !action_seen {
            return Err(FieldError::new("action", "str", "nothing (key missing)"));
        }
        if ev.action() == Action::Oom {
            if let Some(f) = device_free {
                ev.addr = f;
            }
        }
        ev.set_context(self.contexts.intern(context).ok_or_else(|| {
            FieldError::new(
                "stream",
                Contexts::LIMIT_TEXT,
                "one more distinct stream, compile_context and user_metadata",
            )
        })?);
        Ok(ev)
    }

    fn commit_event(&mut self, heap: &Heap<'_>, ev: TraceEvent, unknown: &[u32], list: u32) -> u32 {
        for &s in unknown {
            *self.unknown_keys.entry(format!("device_traces[][].{}", heap.str(s))).or_default() += 1;
        }
        self.commit(ev, list)
    }

    /// Keep (or tally, for `list`) a converted event; returns its record id.
    #[inline]
    fn commit(&mut self, ev: TraceEvent, list: u32) -> u32 {
        if ev.stack != StackId::EMPTY {
            self.events_with_frames += 1;
        }
        self.tallies.entry(list).or_default().add(&ev);
        if self.keep_events {
            self.events.push(ev);
        }
        self.records += 1;
        self.records - 1
    }

    fn finish(mut self, parsed: Parsed<'_>) -> Result<Snapshot, ReadError> {
        let Parsed { heap, root, stats } = parsed;
        self.intern_stack(Vec::new());
        self.intern("");
        let mut snap = Snapshot::default();
        snap.source.protocol = stats.protocol;
        snap.source.peak_built_bytes = stats.peak_built_bytes;
        snap.source.parallel_bytes = stats.fast_forwarded;
        snap.source.producer = if stats.memoize > 0 && stats.protocol >= 4 {
            Producer::PythonPickler
        } else if stats.protocol == 2 && stats.memoize == 0 && stats.binput > 0 && stats.empty_batches > 0 {
            Producer::CppPickler
        } else {
            Producer::Other
        };
        let budget = stats.opcodes.saturating_mul(2).saturating_add(1 << 16);
        let mut conv = Converter { b: &mut self, heap: &heap, source: &mut snap.source, budget };
        match root {
            Value::Dict(d) => {
                let parts = TopLevel {
                    segments: &mut snap.segments,
                    traces: &mut snap.traces,
                    settings: &mut snap.settings,
                    annotations: &mut snap.annotations,
                    host: &mut snap.host,
                };
                conv.top_dict(d, parts)?
            }
            Value::List(_) => {
                conv.source.bare_segment_list = true;
                snap.segments = conv.segments(root, "$")?;
            }
            other => {
                return Err(shape(
                    "$",
                    format!("expected a dict (or a list of segments) at the top, found {}", describe(&heap, other)),
                ));
            }
        }
        // Events that were compacted but never reached a device trace (e.g. a list of
        // action dicts under an unknown key) are simply dropped with the builder.
        snap.source.parallel_windows = self.windows_scanned;
        let Builder {
            strings,
            frames,
            stacks,
            contexts,
            unknown_keys,
            unknown_actions,
            has_cpp_frames,
            events_with_frames,
            ..
        } = self;
        snap.contexts = contexts.into_table();
        snap.strings = strings;
        snap.frames = frames;
        snap.stacks = stacks;
        for (k, v) in unknown_keys {
            *snap.source.unknown_keys.entry(k).or_default() += v;
        }
        snap.source.unknown_actions = unknown_actions;
        snap.source.has_cpp_frames = has_cpp_frames;
        snap.source.events_with_frames = events_with_frames;
        Ok(snap)
    }
}

impl Compactor for Builder {
    fn compact(&mut self, heap: &Heap<'_>, dict: u32, list: u32, freeze: &mut Vec<(u32, u32)>) -> Option<u32> {
        // Only trace entries: dicts with a string `action`. Everything else (frames, blocks,
        // segments) stays generic. Any type problem leaves the dict generic too, so the
        // converter reports it with its full key path.
        self.last_frames_list = None;
        let mut unknown = Vec::new();
        let ev = self.event(heap, dict, &mut unknown).ok()?;
        // The event's `frames` list is now a stack id; freeze it (its token is the stack id)
        // so its elements can be dropped.
        if let Some(l) = self.last_frames_list {
            if matches!(heap.list(l), ListStore::Values(v) if !v.is_empty()) {
                freeze.push((l, ev.stack.0));
                self.stack_cache.remove(&l);
            }
        }
        Some(self.commit_event(heap, ev, &unknown, list))
    }

    fn fast_forward(
        &mut self,
        ahead: memsnap_pickle::Ahead<'_, '_>,
    ) -> Result<Option<memsnap_pickle::Advanced>, PickleError> {
        if !self.parallel {
            return Ok(None);
        }
        parallel::fast_forward(self, ahead)
    }

    fn ahead_bytes(&self, offset: u64) -> usize {
        if self.parallel && offset >= self.resume_at {
            parallel::cut(self.chunk_bytes, self.input_len, offset).window
        } else {
            0
        }
    }

    fn retained_bytes(&self) -> u64 {
        let per_frame = (std::mem::size_of::<Frame>() * 2 + 8) as u64;
        self.events.len() as u64 * std::mem::size_of::<TraceEvent>() as u64
            + self.tallies.values().map(|t| t.retained_bytes()).sum::<u64>()
            + self.frames.len() as u64 * per_frame
            + self.interned_bytes
            + self.contexts.retained_bytes()
            + (self.stack_cache.len() + self.tuple_stack_cache.len() + self.frame_cache.len()) as u64 * 8
    }
}

/// The parts of a [`Snapshot`] the top-level dict fills (its `source` is lent to the converter).
struct TopLevel<'a> {
    segments: &'a mut Vec<Segment>,
    traces: &'a mut Vec<DeviceTrace>,
    settings: &'a mut AllocatorSettings,
    annotations: &'a mut Vec<Annotation>,
    host: &'a mut HostMemory,
}

struct Converter<'b, 'h, 'a> {
    b: &'b mut Builder,
    heap: &'h Heap<'a>,
    source: &'b mut SourceInfo,
    /// Items (dict entries, list elements, events) the conversion may still visit. The heap is
    /// a DAG: a crafted file can reference one list of K blocks from K segments in O(K) bytes,
    /// and expanding it would take O(K²) time and memory. A file written by torch never shares
    /// these objects, so visiting more items than twice its opcodes means a crafted file.
    budget: u64,
}

impl Converter<'_, '_, '_> {
    fn unknown(&mut self, pattern: String) {
        *self.source.unknown_keys.entry(pattern).or_default() += 1;
    }

    /// Count `n` visited items against [`Converter::budget`].
    fn charge(&mut self, n: usize, path: &str) -> Result<(), ReadError> {
        match self.budget.checked_sub(n as u64) {
            Some(left) => {
                self.budget = left;
                Ok(())
            }
            None => Err(shape(
                path,
                "objects shared too many times: reading would expand them beyond twice the pickle's \
                 opcode count (a crafted file, not a snapshot written by torch)",
            )),
        }
    }

    fn dict_items(&mut self, v: Value, path: &str) -> Result<Vec<(String, Value)>, ReadError> {
        if let Value::Dict(d) = v {
            self.charge(self.heap.dict(d).len(), path)?;
        }
        match v {
            Value::Dict(d) => Ok(self
                .heap
                .dict(d)
                .iter()
                .map(|&(k, v)| {
                    let key = match k {
                        Value::Str(s) => self.heap.str(s).to_string(),
                        Value::Int(i) => i.to_string(),
                        other => format!("<{}>", other.type_name()),
                    };
                    (key, v)
                })
                .collect()),
            other => Err(shape(path, format!("expected a dict, found {}", describe(self.heap, other)))),
        }
    }

    fn seq(&self, v: Value, path: &str) -> Result<usize, ReadError> {
        self.heap.seq_len(v).ok_or_else(|| shape(path, format!("expected a list, found {}", describe(self.heap, v))))
    }

    /// The top-level dict's keys, each into its part of the snapshot.
    fn top_dict(&mut self, d: u32, snap: TopLevel<'_>) -> Result<(), ReadError> {
        let mut items = self.dict_items(Value::Dict(d), "$")?;
        // A key given twice: the last value wins, as when Python loads the dict (and a trace
        // list is converted only once).
        let mut seen = std::collections::HashSet::new();
        items.reverse();
        items.retain(|(k, _)| seen.insert(k.clone()));
        items.reverse();
        for (key, v) in items {
            match key.as_str() {
                "segments" => *snap.segments = self.segments(v, "segments")?,
                "device_traces" => {
                    self.source.has_trace_key = true;
                    *snap.traces = self.traces(v)?;
                }
                "allocator_settings" => *snap.settings = self.settings(v)?,
                "external_annotations" => *snap.annotations = self.annotations(v)?,
                // Pinned host memory (torch >= 2.14): counted apart, never in device totals.
                "host_segments" => self.host_segments(v, snap.host)?,
                "host_traces" => {
                    snap.host.present = true;
                    snap.host.trace_entries = self.seq(v, "host_traces")? as u64;
                }
                other => self.unknown(other.to_string()),
            }
        }
        Ok(())
    }

    fn traces(&mut self, v: Value) -> Result<Vec<DeviceTrace>, ReadError> {
        let n = self.seq(v, "device_traces")?;
        let mut built: Vec<Option<Vec<TraceEvent>>> = Vec::with_capacity(n.min(1024));
        let mut runs: Vec<(usize, usize, usize)> = Vec::new(); // (start, len, device)
        let mut counted: Vec<(usize, u32)> = Vec::new(); // (device, list) of the runs
        let mut summaries: Vec<(usize, u32)> = Vec::new(); // (device, list)
        let mut summarized: rustc_hash::FxHashSet<u32> = Default::default();
        for dev in 0..n {
            let path = format!("device_traces[{dev}]");
            let list = self.heap.seq_get(v, dev).unwrap_or(Value::None);
            let events = match list {
                Value::List(id) => match self.heap.list(id) {
                    // A summary read: the list's tally stands for its records. The same list
                    // listed again is charged as a copy would be (see below).
                    ListStore::Records { len, .. } if !self.b.keep_events => {
                        if !summarized.insert(id) {
                            self.charge(*len as usize, &path)?;
                        }
                        summaries.push((dev, id));
                        Some(Vec::new())
                    }
                    // Fast path: the whole list was compacted into consecutive records; they are
                    // moved (not copied) out of the builder below.
                    ListStore::Records { start, len } => {
                        runs.push((*start as usize, *len as usize, dev));
                        counted.push((dev, id));
                        None
                    }
                    ListStore::Frozen(_) => {
                        return Err(shape(&path, "expected a list of trace entries, found a frames list"));
                    }
                    ListStore::Values(vals) => {
                        let mut evs = Vec::with_capacity(vals.len());
                        for (j, &item) in vals.iter().enumerate() {
                            self.charge(1, &path)?;
                            evs.push(self.event_value(item, &format!("{path}[{j}]"))?);
                        }
                        Some(evs)
                    }
                },
                Value::None => Some(Vec::new()),
                other => {
                    let m = self.seq(other, &path)?;
                    let mut evs = Vec::with_capacity(m.min(1 << 20));
                    for j in 0..m {
                        self.charge(1, &path)?;
                        let item = self.heap.seq_get(other, j).unwrap_or(Value::None);
                        evs.push(self.event_value(item, &format!("{path}[{j}]"))?);
                    }
                    Some(evs)
                }
            };
            built.push(events);
        }
        // Move each run out of the record buffer, last run first so `split_off` copies only
        // tails; the run that starts at 0 (the usual single-device case) is moved whole.
        let mut all = std::mem::take(&mut self.b.events);
        runs.sort_by(|a, b| b.0.cmp(&a.0).then(a.2.cmp(&b.2)));
        let mut taken: HashMap<(usize, usize), usize> = HashMap::default();
        for &(start, len, dev) in &runs {
            if let Some(&first) = taken.get(&(start, len)) {
                // The same list object listed twice (memo-shared): copy the first one.
                self.charge(len, &format!("device_traces[{dev}]"))?;
                built[dev] = built[first].clone();
                continue;
            }
            let evs = if start == 0 {
                let mut v = std::mem::take(&mut all);
                v.truncate(len);
                v.shrink_to_fit();
                v
            } else if start <= all.len() {
                let mut tail = all.split_off(start);
                tail.truncate(len);
                tail
            } else {
                Vec::new()
            };
            taken.insert((start, len), dev);
            built[dev] = Some(evs);
        }
        let mut traces: Vec<DeviceTrace> = built
            .into_iter()
            .enumerate()
            .map(|(dev, evs)| DeviceTrace { device: dev as u32, events: evs.unwrap_or_default(), summary: None })
            .collect();
        for (dev, list) in summaries {
            let tally = self.b.tallies.get(&list).cloned().unwrap_or_default();
            traces[dev].summary = Some(tally.summary(dev as u32));
        }
        // Events kept: their list's tally goes beside them, so that nothing counts them again;
        // only where it covers exactly the events taken (always, short of a record run cut
        // short), else the facts are counted from the events.
        for (dev, list) in counted {
            let trace = &mut traces[dev];
            if let Some(tally) = self.b.tallies.get(&list).filter(|t| t.entries() == trace.events.len() as u64) {
                trace.summary = Some(tally.summary(dev as u32));
            }
        }
        Ok(traces)
    }

    fn event_value(&mut self, item: Value, path: &str) -> Result<TraceEvent, ReadError> {
        match item {
            Value::Record(_) if !self.b.keep_events => Err(ReadError::NeedsEvents { path: path.to_string() }),
            Value::Record(r) => self
                .b
                .events
                .get(r as usize)
                .copied()
                .ok_or_else(|| shape(path, "trace entry already used by another list (not a snapshot)")),
            Value::Dict(d) => {
                self.charge(self.heap.dict(d).len(), path)?;
                let mut unknown = Vec::new();
                let ev = self.b.event(self.heap, d, &mut unknown);
                let ev = field(ev, path)?;
                for s in unknown {
                    self.unknown(format!("device_traces[][].{}", self.heap.str(s)));
                }
                if ev.stack != StackId::EMPTY {
                    self.b.events_with_frames += 1;
                }
                Ok(ev)
            }
            other => Err(shape(path, format!("expected a trace entry dict, found {}", describe(self.heap, other)))),
        }
    }

    /// `host_segments`: per segment its `total_size` and the sizes of its allocated blocks, each
    /// read as a device block is (their addresses, streams and stacks are not kept).
    fn host_segments(&mut self, v: Value, host: &mut HostMemory) -> Result<(), ReadError> {
        host.present = true;
        let heap = self.heap;
        let n = self.seq(v, "host_segments")?;
        for i in 0..n {
            self.charge(1, "host_segments")?;
            let path = format!("host_segments[{i}]");
            let seg = heap.seq_get(v, i).unwrap_or(Value::None);
            host.segments += 1;
            for (key, val) in self.dict_items(seg, &path)? {
                let kp = format!("{path}.{key}");
                match key.as_str() {
                    "total_size" => {
                        host.reserved_bytes = host.reserved_bytes.saturating_add(field(as_size(heap, val, ""), &kp)?)
                    }
                    "blocks" => {
                        for k in 0..self.seq(val, &kp)? {
                            self.charge(1, &kp)?;
                            let item = heap.seq_get(val, k).unwrap_or(Value::None);
                            // Read as device blocks are (the address is not needed).
                            let block = self.block(item, &format!("{kp}[{k}]"), 0)?;
                            if block.state == BlockState::Allocated {
                                host.allocated_bytes = host.allocated_bytes.saturating_add(block.size);
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
        Ok(())
    }

    fn segments(&mut self, v: Value, path: &str) -> Result<Vec<Segment>, ReadError> {
        let n = self.seq(v, path)?;
        let mut out = Vec::with_capacity(n.min(1 << 16));
        for i in 0..n {
            self.charge(1, path)?;
            let s = self.heap.seq_get(v, i).unwrap_or(Value::None);
            out.push(self.segment(s, &format!("{path}[{i}]"))?);
        }
        Ok(out)
    }

    fn segment(&mut self, v: Value, path: &str) -> Result<Segment, ReadError> {
        let mut seg = Segment {
            device: 0,
            address: 0,
            total_size: 0,
            allocated_size: 0,
            active_size: 0,
            requested_size: 0,
            stream: 0,
            segment_type: SegmentType::Unknown,
            pool_id: (0, 0),
            is_expandable: false,
            stack: StackId::EMPTY,
            blocks: Vec::new(),
        };
        let mut blocks_v = None;
        let (mut have_alloc, mut have_active, mut have_req) = (false, false, false);
        let heap = self.heap;
        for (key, val) in self.dict_items(v, path)? {
            let kp = format!("{path}.{key}");
            match key.as_str() {
                "device" => seg.device = field(as_device(heap, val, ""), &kp)?,
                "address" => seg.address = field(as_address(heap, val, ""), &kp)?,
                "total_size" => seg.total_size = field(as_size(heap, val, ""), &kp)?,
                "allocated_size" => {
                    seg.allocated_size = field(as_u64(heap, val, ""), &kp)?;
                    have_alloc = true;
                }
                "active_size" => {
                    seg.active_size = field(as_u64(heap, val, ""), &kp)?;
                    have_active = true;
                }
                "requested_size" => {
                    seg.requested_size = field(as_u64(heap, val, ""), &kp)?;
                    have_req = true;
                }
                "stream" => seg.stream = field(as_stream(heap, val, ""), &kp)?,
                "segment_type" => {
                    seg.segment_type = match heap.as_str(val) {
                        Some("small") => SegmentType::Small,
                        Some("large") => SegmentType::Large,
                        Some(_) => SegmentType::Unknown,
                        None => return Err(shape(kp, format!("expected str, found {}", describe(heap, val)))),
                    }
                }
                "segment_pool_id" => {
                    let a = heap.seq_get(val, 0).and_then(|x| heap.as_i128(x));
                    let b = heap.seq_get(val, 1).and_then(|x| heap.as_i128(x));
                    match (a, b) {
                        (Some(a), Some(b)) => seg.pool_id = (a as u64, b as u64),
                        _ => return Err(shape(kp, format!("expected a pair of ints, found {}", describe(heap, val)))),
                    }
                }
                "is_expandable" => {
                    seg.is_expandable = match val {
                        Value::Bool(b) => b,
                        Value::Int(i) => i != 0,
                        other => return Err(shape(kp, format!("expected bool, found {}", describe(heap, other)))),
                    }
                }
                "frames" => seg.stack = field(self.b.stack(heap, val), path)?,
                "blocks" => blocks_v = Some(val),
                // Anomaly mode (torch >= 2.11): the forward traceback of the autograd node that
                // allocated, as formatted text lines. Not used: attribution places backward
                // memory by its backward pass.
                "forward_frames" => {}
                other => self.unknown(format!("segments[].{other}")),
            }
        }
        if let Some(bv) = blocks_v {
            let n = self.seq(bv, &format!("{path}.blocks"))?;
            let mut cursor = seg.address;
            for j in 0..n {
                self.charge(1, path)?;
                let bp = format!("{path}.blocks[{j}]");
                let item = heap.seq_get(bv, j).unwrap_or(Value::None);
                let blk = self.block(item, &bp, cursor)?;
                cursor = blk.address.saturating_add(blk.size);
                seg.blocks.push(blk);
            }
        }
        // Producers that omit the per-segment totals: derive them from the blocks.
        if !have_alloc {
            seg.allocated_size = seg.blocks.iter().filter(|b| b.state == BlockState::Allocated).map(|b| b.size).sum();
        }
        if !have_active {
            seg.active_size = seg.blocks.iter().filter(|b| b.state != BlockState::Inactive).map(|b| b.size).sum();
        }
        if !have_req {
            seg.requested_size =
                seg.blocks.iter().filter(|b| b.state != BlockState::Inactive).map(|b| b.requested_size).sum();
        }
        if seg.total_size == 0 {
            seg.total_size = seg.blocks.iter().map(|b| b.size).sum();
        }
        Ok(seg)
    }

    fn block(&mut self, v: Value, path: &str, derived_addr: u64) -> Result<Block, ReadError> {
        let heap = self.heap;
        let mut blk = Block {
            address: derived_addr,
            size: 0,
            requested_size: 0,
            state: BlockState::Inactive,
            stack: StackId::EMPTY,
            address_derived: true,
        };
        let mut have_req = false;
        for (key, val) in self.dict_items(v, path)? {
            let kp = format!("{path}.{key}");
            match key.as_str() {
                "address" => {
                    blk.address = field(as_address(heap, val, ""), &kp)?;
                    blk.address_derived = false;
                }
                "size" => blk.size = field(as_size(heap, val, ""), &kp)?,
                "requested_size" => {
                    blk.requested_size = field(as_size(heap, val, ""), &kp)?;
                    have_req = true;
                }
                "state" => {
                    blk.state = match heap.as_str(val) {
                        Some("active_allocated") => BlockState::Allocated,
                        Some("active_pending_free") | Some("active_awaiting_free") => BlockState::PendingFree,
                        Some("inactive") => BlockState::Inactive,
                        Some(other) => {
                            return Err(shape(kp, format!("unknown block state {other:?}")));
                        }
                        None => return Err(shape(kp, format!("expected str, found {}", describe(heap, val)))),
                    }
                }
                "frames" => blk.stack = field(self.b.stack(heap, val), path)?,
                "history" => {
                    // torch ≤ 2.0: the latest history entry has the live allocation.
                    self.source.legacy_history = true;
                    let n = self.seq(val, &kp)?;
                    if n > 0 {
                        let last = heap.seq_get(val, n - 1).unwrap_or(Value::None);
                        let hp = format!("{kp}[{}]", n - 1);
                        for (hk, hv) in self.dict_items(last, &hp)? {
                            match hk.as_str() {
                                "real_size" if !have_req => {
                                    blk.requested_size = field(as_u64(heap, hv, ""), &format!("{hp}.real_size"))?;
                                    have_req = true;
                                }
                                "frames" if blk.stack == StackId::EMPTY => {
                                    blk.stack = field(self.b.stack(heap, hv), &hp)?
                                }
                                _ => {}
                            }
                        }
                    }
                }
                "forward_frames" => {}
                other => self.unknown(format!("segments[].blocks[].{other}")),
            }
        }
        if !have_req {
            blk.requested_size = if blk.state == BlockState::Inactive { 0 } else { blk.size };
        }
        if blk.address_derived {
            self.source.derived_addresses += 1;
        }
        Ok(blk)
    }

    fn settings(&mut self, v: Value) -> Result<AllocatorSettings, ReadError> {
        let heap = self.heap;
        let mut s = AllocatorSettings::default();
        for (key, val) in self.dict_items(v, "allocator_settings")? {
            let kp = format!("allocator_settings.{key}");
            s.raw.insert(key.clone(), display_value(heap, val));
            match key.as_str() {
                "PYTORCH_CUDA_ALLOC_CONF" | "PYTORCH_ALLOC_CONF" => s.alloc_conf = heap.as_str(val).map(str::to_string),
                "max_split_size" => {
                    s.max_split_size = match heap.as_i128(val) {
                        Some(i) if i > 0 && i < u64::MAX as i128 => Some(i as u64),
                        Some(_) => None,
                        None if val == Value::None => None,
                        None => return Err(shape(kp, format!("expected int, found {}", describe(heap, val)))),
                    }
                }
                "garbage_collection_threshold" => {
                    s.garbage_collection_threshold = match val {
                        Value::Float(f) => Some(f),
                        _ => heap.as_i128(val).map(|i| i as f64),
                    }
                }
                "expandable_segments" => s.expandable_segments = heap.as_i128(val).map(|i| i != 0),
                "trace_alloc_overflowed" => s.trace_overflowed = heap.as_i128(val).map(|i| i != 0),
                "trace_alloc_max_entries" => {
                    s.trace_max_entries =
                        heap.as_i128(val).filter(|&i| i > 0 && i <= u64::MAX as i128).map(|i| i as u64)
                }
                "roundup_power2_divisions" => {
                    if let Value::Dict(_) = val {
                        for (k, dv) in self.dict_items(val, &kp)? {
                            let (Ok(mb), Some(div)) = (k.trim().parse::<u64>(), heap.as_i128(dv)) else {
                                continue;
                            };
                            if div > 0 {
                                s.roundup_power2_divisions.insert(mb, div as u64);
                            }
                        }
                    } else if let Some(n) = heap.seq_len(val) {
                        // Older builds: a list indexed by log2 of the interval start in MiB.
                        for i in 0..n.min(64) {
                            if let Some(div) = heap.seq_get(val, i).and_then(|x| heap.as_i128(x)) {
                                if div > 0 {
                                    s.roundup_power2_divisions.insert(1u64 << i, div as u64);
                                }
                            }
                        }
                    }
                }
                _ => {}
            }
        }
        Ok(s)
    }

    fn annotations(&mut self, v: Value) -> Result<Vec<Annotation>, ReadError> {
        let heap = self.heap;
        let n = self.seq(v, "external_annotations")?;
        let mut out = Vec::with_capacity(n.min(1 << 16));
        for i in 0..n {
            self.charge(1, "external_annotations")?;
            let p = format!("external_annotations[{i}]");
            let item = heap.seq_get(v, i).unwrap_or(Value::None);
            let mut a = Annotation { name: String::new(), start: true, device: 0, time_us: NO_TIME };
            for (k, val) in self.dict_items(item, &p)? {
                match k.as_str() {
                    "name" => a.name = heap.as_str(val).unwrap_or("").to_string(),
                    "stage" => a.start = heap.as_str(val).is_none_or(|s| !s.eq_ignore_ascii_case("END")),
                    "device" => a.device = field(as_device(heap, val, ""), &format!("{p}.device"))?,
                    "time_us" => a.time_us = field(as_time(heap, val, ""), &format!("{p}.time_us"))?,
                    other => self.unknown(format!("external_annotations[].{other}")),
                }
            }
            out.push(a);
        }
        Ok(out)
    }
}

fn field<T>(r: Result<T, FieldError>, path: &str) -> Result<T, ReadError> {
    r.map_err(|e| {
        let p = if e.key.is_empty() { path.to_string() } else { format!("{path}.{}", e.key) };
        shape(p, format!("expected {}, found {}", e.expected, e.found))
    })
}

/// A short text form of a setting value for display.
fn display_value(heap: &Heap<'_>, v: Value) -> String {
    match v {
        Value::None => "None".into(),
        Value::Bool(b) => if b { "True" } else { "False" }.into(),
        Value::Int(i) => i.to_string(),
        Value::BigInt(b) => heap.bigints[b as usize].to_string(),
        Value::Float(f) => format!("{f}"),
        Value::Str(s) => heap.str(s).to_string(),
        Value::Dict(d) => {
            let parts: Vec<String> = heap
                .dict(d)
                .iter()
                .take(64)
                .map(|&(k, v)| format!("{}: {}", display_scalar(heap, k), display_scalar(heap, v)))
                .collect();
            format!("{{{}}}", parts.join(", "))
        }
        other => format!("<{}>", other.type_name()),
    }
}

fn display_scalar(heap: &Heap<'_>, v: Value) -> String {
    match v {
        Value::Dict(_) | Value::List(_) | Value::Tuple(_) | Value::Set(_) => format!("<{}>", v.type_name()),
        other => display_value(heap, other),
    }
}
