//! The pickle virtual machine: a loop over opcodes that builds values in a [`Heap`].
//!
//! Only data opcodes are implemented. Every opcode that would import, call or build an object
//! (`GLOBAL`, `STACK_GLOBAL`, `REDUCE`, `BUILD`, `INST`, `OBJ`, `NEWOBJ`, `NEWOBJ_EX`, `PERSID`,
//! `BINPERSID`, `EXT*`, out-of-band buffers) is refused: nothing in a file ever runs.

use std::borrow::Cow;
use std::collections::HashMap;

use crate::error::{opcode_name, ErrorKind, PickleError};
use crate::memo::Memo;
use crate::source::{Fault, SliceSource, Source};
use crate::value::{Heap, ListStore, Value, DICT_SHARED, DICT_UNMEMOIZED};

/// Converts dicts into compact records while the pickle is read, so that a list of millions of
/// small dicts (a snapshot's trace) never exists as generic values.
///
/// `compact` is offered every dict at the moment it is appended to a list, if nothing else can
/// reach it (it was memoized at most once and never fetched back). Returning `Some(id)` replaces
/// the dict everywhere (list and memo) with `Value::Record(id)` and recycles its storage.
///
/// A compactor may also freeze lists the record has absorbed (a trace entry's `frames` list) by
/// pushing `(list, token)` to `freeze`: the list's elements are dropped and the list reads as
/// [`ListStore::Frozen`] from then on; appending to it later is an error. Real snapshots build
/// a fresh `frames` list per event, so this is what keeps millions of them from costing memory.
pub trait Compactor {
    /// `list` is the heap list the dict is appended to.
    fn compact(&mut self, heap: &Heap<'_>, dict: u32, list: u32, freeze: &mut Vec<(u32, u32)>) -> Option<u32>;

    /// Approximate bytes the compactor holds for the records it made; counted in the object
    /// budget with the heap.
    fn retained_bytes(&self) -> u64 {
        0
    }

    /// Offered after `APPENDS`/`APPEND` put records into a list of a framed pickle whose memo
    /// is dense (every index `MEMOIZE`d in order): the compactor may read what follows
    /// ([`Ahead::bytes`]) itself, faster than the VM would, and say how far it got. It must
    /// leave the VM exactly where the VM would have been had it read those bytes: the records
    /// appended to [`Ahead::list`], one memo entry pushed per `MEMOIZE` read, and nothing else
    /// on the stack. `None` (the default) means the VM reads on.
    fn fast_forward(&mut self, _ahead: Ahead<'_, '_>) -> Result<Option<Advanced>, PickleError> {
        Ok(None)
    }

    /// How many bytes [`Compactor::fast_forward`] wants to be shown from pickle offset
    /// `offset` (at most [`MAX_FAST_FORWARD_WINDOW`]): asked before the VM fills a window ahead
    /// for it, which costs a copy of up to that many bytes (once per offer, and a pickle of many
    /// small lists makes an offer per list). 0 (the default) means the VM reads on without
    /// asking.
    fn ahead_bytes(&self, _offset: u64) -> usize {
        0
    }
}

/// What [`Compactor::fast_forward`] may read and change.
pub struct Ahead<'w, 'a> {
    /// The bytes from the VM's position on (a window of the input; an opcode boundary).
    pub bytes: &'w [u8],
    /// Offset of `bytes[0]` in the pickle.
    pub offset: u64,
    /// Where the `FRAME` the VM is in ends (offset in the pickle); the next frame's header is
    /// there.
    pub frame_end: u64,
    /// The list the records went to.
    pub list: u32,
    pub store: Store<'w, 'a>,
}

/// The heap and the memo, for a compactor that reads ahead: it looks objects up while reading
/// (from several threads, through [`Store::view`]) and adds what it read.
pub struct Store<'w, 'a> {
    heap: &'w mut Heap<'a>,
    memo: &'w mut Memo,
    scalars: &'w mut Vec<Value>,
    built: &'w mut u64,
}

/// A shared view of the heap and memo (readable from several threads at once).
#[derive(Clone, Copy)]
pub struct StoreView<'w, 'a> {
    pub heap: &'w Heap<'a>,
    memo: &'w Memo,
    scalars: &'w [Value],
}

/// A memo entry as a compactor sees it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum MemoRef {
    Value(Value),
    /// A list made by a fast-forward that no one has fetched since: empty (token 0) or frozen
    /// with this token. The VM makes the list when the memo entry is first fetched.
    LazyList(u32),
}

impl<'a> StoreView<'_, 'a> {
    pub fn memo_len(&self) -> usize {
        self.memo.len()
    }

    pub fn memo_get(&self, idx: usize) -> Option<MemoRef> {
        let h = self.memo.get(idx)?;
        if h >> 29 == H_LAZY_LIST && h != H_EMPTY {
            return Some(MemoRef::LazyList(h & H_INDEX_MASK));
        }
        decode(self.scalars, h).map(MemoRef::Value)
    }
}

impl<'a> Store<'_, 'a> {
    pub fn view(&self) -> StoreView<'_, 'a> {
        StoreView { heap: self.heap, memo: self.memo, scalars: self.scalars }
    }

    pub fn heap(&self) -> &Heap<'a> {
        self.heap
    }

    /// A string for the heap (not on the stack, not in the memo).
    pub fn add_str(&mut self, s: String) -> Value {
        *self.built += s.len() as u64 + OBJECT_OVERHEAD;
        self.heap.strs.push(Cow::Owned(s));
        Value::Str((self.heap.strs.len() - 1) as u32)
    }

    /// A dict for the heap, as the VM would have built it and memoized it at `slot`.
    pub fn add_dict(&mut self, items: Vec<(Value, Value)>, slot: usize) -> Value {
        *self.built += OBJECT_OVERHEAD + items.len() as u64 * 2 * SLOT;
        let id = self.heap.new_dict();
        self.heap.dicts[id as usize] = items;
        self.heap.dict_memo[id as usize] = if slot < DICT_SHARED as usize { slot as u32 } else { DICT_SHARED };
        Value::Dict(id)
    }

    /// A tuple for the heap.
    pub fn add_tuple(&mut self, items: Vec<Value>) -> Value {
        *self.built += OBJECT_OVERHEAD + items.len() as u64 * SLOT;
        self.heap.tuples.push(items);
        Value::Tuple((self.heap.tuples.len() - 1) as u32)
    }

    /// Push the next memo entry (what a `MEMOIZE` of `v` does).
    #[inline]
    pub fn memoize(&mut self, v: Value) -> Result<(), ErrorKind> {
        let h = encode(self.scalars, v)?;
        self.push_handle(h)
    }

    /// Push the next memo entry as a list made only when fetched (see [`MemoRef::LazyList`]).
    #[inline]
    pub fn memoize_lazy_list(&mut self, token: u32) -> Result<(), ErrorKind> {
        if token >= H_INDEX_MASK {
            return Err(ErrorKind::LimitExceeded("objects (more than 2^29 of one kind)"));
        }
        self.push_handle((H_LAZY_LIST << 29) | token)
    }

    /// Push the next memo entry to be set later with [`Store::rememoize`] (an object whose
    /// contents come after its `MEMOIZE`); until then it reads as empty.
    pub fn memoize_pending(&mut self) -> Result<usize, ErrorKind> {
        self.push_handle(H_EMPTY)?;
        Ok(self.memo.len() - 1)
    }

    /// Set memo entry `idx` (one pushed by [`Store::memoize_pending`]).
    pub fn rememoize(&mut self, idx: usize, v: Value) -> Result<(), ErrorKind> {
        let h = encode(self.scalars, v)?;
        if self.memo.set(idx, h) {
            Ok(())
        } else {
            Err(ErrorKind::BadMemoKey(idx as u64))
        }
    }

    /// Freeze list `id` with `token`, as the VM freezes a list a compactor absorbed.
    pub fn freeze_list(&mut self, id: u32, token: u32) {
        if let Some(l) = self.heap.lists.get_mut(id as usize) {
            *self.built -= (l.len() as u64 * SLOT).min(*self.built);
            *l = ListStore::Frozen(token);
        }
    }

    /// Room for `n` more memo entries (a compactor about to push a chunk's).
    pub fn reserve_memo(&mut self, n: usize) {
        self.memo.reserve(n);
    }

    #[inline]
    fn push_handle(&mut self, h: u32) -> Result<(), ErrorKind> {
        if self.memo.len() >= H_EMPTY as usize - 1 {
            return Err(ErrorKind::BadMemoKey(self.memo.len() as u64));
        }
        self.memo.push(h);
        Ok(())
    }
}

/// How far [`Compactor::fast_forward`] read.
#[derive(Clone, Copy, Debug, Default)]
pub struct Advanced {
    /// Bytes of [`Ahead::bytes`] read (the VM goes on from there, an opcode boundary).
    pub consumed: usize,
    /// The records appended to the list, in order: `Value::Record(first..first + count)`.
    pub first_record: u32,
    pub records: u32,
    /// What the bytes held, for [`Stats`].
    pub opcodes: u64,
    pub memoize: u64,
    pub frames: u64,
    /// End of the last `FRAME` read (offset in the pickle), if any.
    pub frame_end: Option<u64>,
    /// Whether reading stopped only at the end of `bytes` (so it may go on with more).
    pub window_end: bool,
}

/// A compactor that never compacts.
pub struct NoCompaction;

impl Compactor for NoCompaction {
    fn compact(&mut self, _heap: &Heap<'_>, _dict: u32, _list: u32, _freeze: &mut Vec<(u32, u32)>) -> Option<u32> {
        None
    }
}

/// Limits that keep hostile input bounded.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Maximum number of open `MARK`s (nesting depth of containers under construction).
    pub max_marks: usize,
    /// Maximum memo index accepted for sparse `PUT`s beyond the dense memo.
    pub max_sparse_memo: usize,
    /// How much memory the objects a pickle builds may take, for its size.
    pub object_budget: ObjectBudget,
    /// Longest string or bytes object accepted (16 MiB). A snapshot's longest strings are
    /// source paths, C++ symbol names and compile contexts (a few KB); the cap keeps a length
    /// field from making a reader gather gigabytes of a pipe or a device before anything is
    /// judged.
    pub max_object_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_marks: 10_000,
            max_sparse_memo: 1 << 24,
            object_budget: ObjectBudget::DEFAULT,
            max_object_bytes: 16 << 20,
        }
    }
}

/// The memory the objects built while reading may take (heap, stack, memo and the compactor's
/// records, approximately counted), as a function of the input read so far:
/// `allowance + min(per_pickle_byte × pickle bytes, per_stored_byte × stored bytes)`.
///
/// Why it holds for every real snapshot: each object costs at least one opcode byte, and a
/// snapshot's bytes are mostly keys, addresses and sizes that become fixed-size fields. Measured
/// (`crates/memsnap-model/tests/suite/object_budget.rs`, which keeps every bundled real fixture under a
/// quarter of both proportional parts): at most 6.0 bytes of objects per pickle byte (a small
/// state-only file, whose blocks stay generic dicts; the 1.07 GB bench file builds 1.3) and 61
/// per byte of xz (31 for the bench file). A bomb builds far more: one `EMPTY_DICT` byte is a
/// 24-byte dict plus its slot, and a few KB of xz expand to millions of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ObjectBudget {
    /// Bytes any input may build, however small (a small real snapshot needs a few MB).
    pub allowance: u64,
    /// Bytes of objects per byte of pickle read.
    pub per_pickle_byte: u64,
    /// Bytes of objects per byte of the input as stored (compressed) read.
    pub per_stored_byte: u64,
}

impl ObjectBudget {
    pub const DEFAULT: ObjectBudget = ObjectBudget { allowance: 64 << 20, per_pickle_byte: 32, per_stored_byte: 512 };
    /// No limit (for callers that bound their input otherwise).
    pub const UNLIMITED: ObjectBudget = ObjectBudget { allowance: u64::MAX, per_pickle_byte: 0, per_stored_byte: 0 };

    /// Bytes allowed after `pickle` bytes of pickle from `stored` bytes of input.
    pub fn allowed(&self, pickle: u64, stored: u64) -> u64 {
        let by_pickle = self.per_pickle_byte.saturating_mul(pickle);
        let by_stored = self.per_stored_byte.saturating_mul(stored);
        self.allowance.saturating_add(by_pickle.min(by_stored))
    }
}

/// Facts about the byte stream, used to tell producers apart.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Protocol from `PROTO` (0 when absent).
    pub protocol: u8,
    pub frames: u64,
    pub memoize: u64,
    pub binput: u64,
    pub opcodes: u64,
    /// `SETITEMS`/`APPENDS` with nothing to add (the C++ pickler writes empty containers as
    /// `EMPTY_DICT MARK SETITEMS`; Python's pickler never does).
    pub empty_batches: u64,
    /// Bytes after `STOP` that were ignored (for a reader: those already in its window; the rest
    /// is not read).
    pub trailing_bytes: u64,
    /// Largest approximate size of the objects built, as counted for [`ObjectBudget`].
    pub peak_built_bytes: u64,
    /// Bytes a compactor read ahead of the VM ([`Compactor::fast_forward`]).
    pub fast_forwarded: u64,
}

/// The result of reading a pickle.
#[derive(Debug)]
pub struct Parsed<'a> {
    pub heap: Heap<'a>,
    pub root: Value,
    pub stats: Stats,
}

/// Called with the current byte offset about every `progress_every` bytes (to report progress,
/// or anything else that follows the reading position).
pub struct Progress<'p> {
    pub every: usize,
    pub callback: &'p mut dyn FnMut(usize),
}

/// Read one pickle from `data`.
pub fn parse<'a>(
    data: &'a [u8],
    compactor: &mut dyn Compactor,
    limits: &Limits,
    progress: Option<Progress<'_>>,
) -> Result<Parsed<'a>, PickleError> {
    parse_source(SliceSource::new(data), compactor, limits, progress)
}

/// Read one pickle from `source`. Nothing is reserved ahead from sizes: the containers grow
/// with what the pickle builds (large vectors grow by remapping pages, not by copying).
pub fn parse_source<'a, S: Source<'a>>(
    source: S,
    compactor: &mut dyn Compactor,
    limits: &Limits,
    progress: Option<Progress<'_>>,
) -> Result<Parsed<'a>, PickleError> {
    let vm = Vm {
        src: source,
        op_start: 0,
        op: 0,
        heap: Heap::default(),
        stack: Vec::with_capacity(1024),
        marks: Vec::new(),
        memo: Memo::default(),
        sparse_memo: HashMap::new(),
        memo_scalars: Vec::new(),
        short_strs: vec![(u32::MAX, 0); SHORT_STR_SLOTS],
        freeze: Vec::new(),
        memo_count: 0,
        frame_end: 0,
        built: 0,
        stats: Stats::default(),
        limits,
    };
    vm.run(compactor, progress)
}

struct Vm<'a, 'l, S> {
    src: S,
    op_start: u64,
    op: u8,
    heap: Heap<'a>,
    stack: Vec<Value>,
    marks: Vec<usize>,
    /// The memo as 4-byte handles (kind and index, see `encode`), most pages packed to 2 bytes
    /// an entry ([`Memo`]): a 1 GB snapshot memoizes tens of millions of objects, so an entry
    /// must be small.
    memo: Memo,
    sparse_memo: HashMap<u32, u32>,
    /// Memoized values that are not heap objects (ints, floats, None, bools, bytes).
    memo_scalars: Vec<Value>,
    /// Direct-mapped cache of short strings already in the heap: strings are immutable, so equal
    /// short strings (the `'N/A'` that every trace entry writes anew) can share one heap entry.
    short_strs: Vec<(u32, u32)>,
    freeze: Vec<(u32, u32)>,
    /// Number of distinct memo entries (what `MEMOIZE` uses as the next index).
    memo_count: u64,
    /// Where the last `FRAME` read ends (0 before any).
    frame_end: u64,
    /// Approximate bytes of the objects built so far (see [`Limits::object_budget`]): string
    /// and bytes contents, container slots and the per-object overhead.
    built: u64,
    stats: Stats,
    limits: &'l Limits,
}

impl<'a, S: Source<'a>> Vm<'a, '_, S> {
    fn err(&self, kind: ErrorKind) -> PickleError {
        PickleError { offset: self.op_start as usize, opcode: Some(self.op), kind }
    }

    #[inline(always)]
    fn array<const N: usize>(&mut self) -> Result<[u8; N], PickleError> {
        let (at, op) = (self.op_start, self.op);
        self.src.array::<N>().map_err(|f| fault(at, op, f, N as u64))
    }

    /// Bytes of a length read from the pickle: nothing is allocated from the length itself,
    /// only from the bytes that really follow.
    fn bytes(&mut self, n: u64) -> Result<Cow<'a, [u8]>, PickleError> {
        let (at, op) = (self.op_start, self.op);
        match self.src.known_left() {
            Some(left) if n > left => return Err(self.err(ErrorKind::Truncated { needed: n, available: left })),
            _ if n > self.limits.max_object_bytes => {
                return Err(self.err(ErrorKind::TooLong { bytes: n, limit: self.limits.max_object_bytes }))
            }
            _ => {}
        }
        self.src.bytes(n).map_err(|f| fault(at, op, f, n))
    }

    #[inline(always)]
    fn u8(&mut self) -> Result<u8, PickleError> {
        Ok(self.array::<1>()?[0])
    }
    #[inline(always)]
    fn u16(&mut self) -> Result<u16, PickleError> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    #[inline(always)]
    fn u32(&mut self) -> Result<u32, PickleError> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    fn u64(&mut self) -> Result<u64, PickleError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    fn line(&mut self) -> Result<Cow<'a, [u8]>, PickleError> {
        let (at, op) = (self.op_start, self.op);
        self.src.line().map_err(|f| match f {
            Fault::Short { available } => fault(at, op, f, available + 1),
            f => fault(at, op, f, 0),
        })
    }

    #[inline]
    fn pop(&mut self) -> Result<Value, PickleError> {
        match self.stack.pop() {
            Some(v) if self.marks.last().is_none_or(|&m| self.stack.len() >= m) => Ok(v),
            Some(_) => Err(self.err(ErrorKind::StackUnderflow)),
            None => Err(self.err(ErrorKind::StackUnderflow)),
        }
    }

    #[inline]
    fn top(&self) -> Result<Value, PickleError> {
        match self.stack.last() {
            Some(v) if self.marks.last().is_none_or(|&m| self.stack.len() > m) => Ok(*v),
            _ => Err(self.err(ErrorKind::StackUnderflow)),
        }
    }

    fn pop_mark(&mut self) -> Result<usize, PickleError> {
        self.marks.pop().ok_or_else(|| self.err(ErrorKind::NoMark))
    }

    /// A string of `n` bytes from the input. Short strings are looked up in the cache first
    /// (without copying them out of the input); the rest are borrowed from a slice source or
    /// copied from a reader's window.
    fn push_str(&mut self, n: u64) -> Result<(), PickleError> {
        let (at, op) = (self.op_start, self.op);
        if n <= SHORT_STR_MAX as u64 {
            let b = self.src.short(n as usize).map_err(|f| fault(at, op, f, n))?;
            let slot = short_hash(b) & (SHORT_STR_SLOTS - 1);
            let (id, _) = self.short_strs[slot];
            if id != u32::MAX && self.heap.strs[id as usize].as_bytes() == b {
                self.stack.push(Value::Str(id));
                return Ok(());
            }
            self.short_strs[slot] = (self.heap.strs.len() as u32, 0);
            self.src.unread(n as usize);
        }
        let s = match self.bytes(n)? {
            Cow::Borrowed(b) => match std::str::from_utf8(b) {
                Ok(s) => Cow::Borrowed(s),
                Err(_) => Cow::Owned(String::from_utf8_lossy(b).into_owned()),
            },
            Cow::Owned(v) => {
                Cow::Owned(String::from_utf8(v).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()))
            }
        };
        self.built += n + OBJECT_OVERHEAD;
        self.heap.strs.push(s);
        self.stack.push(Value::Str((self.heap.strs.len() - 1) as u32));
        Ok(())
    }

    fn push_owned_str(&mut self, s: String) {
        self.built += s.len() as u64 + OBJECT_OVERHEAD;
        self.heap.strs.push(Cow::Owned(s));
        self.stack.push(Value::Str((self.heap.strs.len() - 1) as u32));
    }

    fn push_bytes(&mut self, n: u64) -> Result<(), PickleError> {
        let b = self.bytes(n)?;
        self.built += n + OBJECT_OVERHEAD;
        self.heap.bytes.push(b);
        self.stack.push(Value::Bytes((self.heap.bytes.len() - 1) as u32));
        Ok(())
    }

    fn push_int(&mut self, v: i128) {
        if let Ok(i) = i64::try_from(v) {
            self.stack.push(Value::Int(i));
        } else {
            self.built += SLOT;
            self.heap.bigints.push(v);
            self.stack.push(Value::BigInt((self.heap.bigints.len() - 1) as u32));
        }
    }

    /// LONG1/LONG4 of `n` bytes.
    fn push_long(&mut self, n: u64) -> Result<(), PickleError> {
        let (at, op) = (self.op_start, self.op);
        let v = if n <= 255 {
            long_value(self.src.short(n as usize).map_err(|f| fault(at, op, f, n))?)
        } else {
            long_value(&self.bytes(n)?)
        };
        match v {
            Some(v) => {
                self.push_int(v);
                Ok(())
            }
            None => Err(self.err(ErrorKind::IntTooLarge { bytes: n })),
        }
    }

    /// Refuse to go on when the objects built so far take more memory than any snapshot of
    /// this input's size could need (see [`Limits::object_budget`]).
    fn check_budget(&mut self, compactor: &dyn Compactor) -> Result<(), PickleError> {
        let built = self.built_bytes(compactor);
        self.stats.peak_built_bytes = self.stats.peak_built_bytes.max(built);
        let budget = &self.limits.object_budget;
        let (pickle, stored) = (self.src.offset(), self.src.stored_bytes());
        let allowed = budget.allowed(pickle, stored);
        if built > allowed {
            return Err(self.err(ErrorKind::ObjectBudget { built, allowed, pickle, stored }));
        }
        Ok(())
    }

    fn built_bytes(&self, compactor: &dyn Compactor) -> u64 {
        self.built
            + (self.stack.len() as u64 + self.memo_scalars.len() as u64) * SLOT
            + self.memo.len() as u64 * 4
            + self.sparse_memo.len() as u64 * SLOT
            + self.marks.len() as u64 * 8
            + compactor.retained_bytes()
    }

    fn encode(&mut self, v: Value) -> Result<u32, PickleError> {
        encode(&mut self.memo_scalars, v).map_err(|k| self.err(k))
    }

    fn decode(&self, h: u32) -> Option<Value> {
        decode(&self.memo_scalars, h)
    }

    fn memo_put(&mut self, idx: u64) -> Result<(), PickleError> {
        let v = self.top()?;
        if let Value::Dict(d) = v {
            let m = &mut self.heap.dict_memo[d as usize];
            *m = if *m == DICT_UNMEMOIZED && idx < DICT_SHARED as u64 { idx as u32 } else { DICT_SHARED };
        }
        let h = self.encode(v)?;
        let dense = self.memo.len() as u64;
        if idx < dense {
            if self.memo.get(idx as usize) == Some(H_EMPTY) {
                self.memo_count += 1;
            }
            self.memo.set(idx as usize, h);
        } else if idx == dense {
            if idx >= H_EMPTY as u64 {
                return Err(self.err(ErrorKind::BadMemoKey(idx)));
            }
            self.memo.push(h);
            self.memo_count += 1;
        } else {
            // A sparse index: kept in a map so a huge index cannot size an allocation.
            if idx >= H_EMPTY as u64 {
                return Err(self.err(ErrorKind::BadMemoKey(idx)));
            }
            if self.sparse_memo.len() >= self.limits.max_sparse_memo {
                return Err(self.err(ErrorKind::LimitExceeded("sparse memo entries")));
            }
            if self.sparse_memo.insert(idx as u32, h).is_none() {
                self.memo_count += 1;
            }
        }
        Ok(())
    }

    fn memo_get(&mut self, idx: u64) -> Result<(), PickleError> {
        let mut h = if let Some(h) = self.memo.get(idx as usize) {
            h
        } else if idx < H_EMPTY as u64 {
            self.sparse_memo.get(&(idx as u32)).copied().unwrap_or(H_EMPTY)
        } else {
            H_EMPTY
        };
        if h >> 29 == H_LAZY_LIST && h != H_EMPTY {
            // Made now, once: later fetches share it, as they would have shared the original.
            let token = h & H_INDEX_MASK;
            self.built += OBJECT_OVERHEAD;
            self.heap.lists.push(if token == 0 { ListStore::default() } else { ListStore::Frozen(token) });
            h = (H_LIST << 29) | (self.heap.lists.len() - 1) as u32;
            if (self.heap.lists.len() - 1) as u32 >= H_INDEX_MASK {
                return Err(self.err(ErrorKind::LimitExceeded("objects (more than 2^29 of one kind)")));
            }
            self.memo.set(idx as usize, h);
        }
        let v = self.decode(h).ok_or_else(|| self.err(ErrorKind::BadMemoKey(idx)))?;
        if let Value::Dict(d) = v {
            self.heap.dict_memo[d as usize] = DICT_SHARED;
        }
        self.stack.push(v);
        Ok(())
    }

    fn replace_in_memo(&mut self, slot: u32, v: Value) -> Result<(), PickleError> {
        let h = self.encode(v)?;
        if !self.memo.set(slot as usize, h) {
            if let Some(m) = self.sparse_memo.get_mut(&slot) {
                *m = h;
            }
        }
        Ok(())
    }

    /// Append the stack's values from `from` on to `list`; returns whether the last one became
    /// a record.
    fn append_items(&mut self, list: Value, from: usize, compactor: &mut dyn Compactor) -> Result<bool, PickleError> {
        let id = match list {
            Value::List(id) | Value::Set(id) => id,
            other => {
                return Err(self.err(ErrorKind::WrongType { expected: "list", found: other.type_name() }));
            }
        };
        let compactable = matches!(list, Value::List(_));
        let mut last_record = false;
        for i in from..self.stack.len() {
            let mut v = self.stack[i];
            if let (true, Value::Dict(d)) = (compactable, v) {
                let memo = self.heap.dict_memo[d as usize];
                if memo != DICT_SHARED {
                    self.freeze.clear();
                    if let Some(rec) = compactor.compact(&self.heap, d, id, &mut self.freeze) {
                        for &(list, token) in &self.freeze {
                            if let Some(l) = self.heap.lists.get_mut(list as usize) {
                                self.built -= (l.len() as u64 * SLOT).min(self.built);
                                *l = ListStore::Frozen(token);
                            }
                        }
                        v = Value::Record(rec);
                        if memo != DICT_UNMEMOIZED {
                            self.replace_in_memo(memo, v)?;
                        }
                        let items = &mut self.heap.dicts[d as usize];
                        self.built -= (items.len() as u64 * 2 * SLOT).min(self.built);
                        items.clear();
                        if items.capacity() > 64 {
                            items.shrink_to(16);
                        }
                        self.heap.free_dicts.push(d);
                    }
                }
            }
            if matches!(self.heap.lists[id as usize], ListStore::Frozen(_)) {
                return Err(self.err(ErrorKind::FrozenList));
            }
            last_record = matches!(v, Value::Record(_));
            self.heap.lists[id as usize].push(v);
        }
        self.built += (self.stack.len() - from) as u64 * SLOT;
        self.stack.truncate(from);
        Ok(last_record)
    }

    /// Offer the compactor to read on after records went into `list` (see
    /// [`Compactor::fast_forward`]), as long as it reads whole windows.
    fn fast_forward(&mut self, list: Value, compactor: &mut dyn Compactor) -> Result<(), PickleError> {
        let Value::List(list) = list else { return Ok(()) };
        // Only where a memo index is its position (every entry `MEMOIZE`d, none sparse) and
        // inside a frame (so that frames chain from here).
        while self.memo.len() as u64 == self.memo_count
            && self.sparse_memo.is_empty()
            && self.frame_end > self.src.offset()
        {
            let window = compactor.ahead_bytes(self.src.offset()).min(MAX_FAST_FORWARD_WINDOW);
            if window == 0 {
                return Ok(());
            }
            let (at, op) = (self.op_start, self.op);
            let offset = self.src.offset();
            let bytes = self.src.ahead(window).map_err(|f| fault(at, op, f, 1))?;
            let memo_before = self.memo.len();
            let ahead = Ahead {
                bytes,
                offset,
                frame_end: self.frame_end,
                list,
                store: Store {
                    heap: &mut self.heap,
                    memo: &mut self.memo,
                    scalars: &mut self.memo_scalars,
                    built: &mut self.built,
                },
            };
            let Some(adv) = compactor.fast_forward(ahead)? else { return Ok(()) };
            let pushed = (self.memo.len() - memo_before) as u64;
            if pushed != adv.memoize || adv.consumed == 0 {
                // A compactor that does not keep the memo in step would make every later memo
                // reference wrong: a bug, reported rather than read past.
                return Err(self.err(ErrorKind::LimitExceeded("fast-forward out of step with the memo")));
            }
            self.src.skip(adv.consumed);
            self.stats.fast_forwarded += adv.consumed as u64;
            self.memo_count += pushed;
            self.stats.opcodes += adv.opcodes;
            self.stats.memoize += adv.memoize;
            self.stats.frames += adv.frames;
            if let Some(end) = adv.frame_end {
                self.frame_end = end;
            }
            let store = &mut self.heap.lists[list as usize];
            if matches!(store, ListStore::Frozen(_)) {
                return Err(self.err(ErrorKind::FrozenList));
            }
            store.push_records(adv.first_record, adv.records);
            self.built += adv.records as u64 * SLOT;
            self.check_budget(compactor)?;
            if !adv.window_end {
                return Ok(());
            }
        }
        Ok(())
    }

    fn set_items(&mut self, dict: Value, from: usize) -> Result<(), PickleError> {
        let id = match dict {
            Value::Dict(id) => id,
            other => return Err(self.err(ErrorKind::WrongType { expected: "dict", found: other.type_name() })),
        };
        if !(self.stack.len() - from).is_multiple_of(2) {
            return Err(self.err(ErrorKind::OddSetItems));
        }
        let items = &mut self.heap.dicts[id as usize];
        items.reserve((self.stack.len() - from) / 2);
        for pair in self.stack[from..].chunks_exact(2) {
            items.push((pair[0], pair[1]));
        }
        self.built += (self.stack.len() - from) as u64 * SLOT;
        self.stack.truncate(from);
        Ok(())
    }

    fn new_list(&mut self, items: Vec<Value>) -> Value {
        self.built += OBJECT_OVERHEAD + items.len() as u64 * SLOT;
        self.heap.lists.push(ListStore::Values(items.into()));
        Value::List((self.heap.lists.len() - 1) as u32)
    }

    fn new_tuple(&mut self, items: Vec<Value>) -> Value {
        self.built += OBJECT_OVERHEAD + items.len() as u64 * SLOT;
        self.heap.tuples.push(items);
        Value::Tuple((self.heap.tuples.len() - 1) as u32)
    }

    fn run(
        mut self,
        compactor: &mut dyn Compactor,
        mut progress: Option<Progress<'_>>,
    ) -> Result<Parsed<'a>, PickleError> {
        let mut next_progress = progress.as_ref().map_or(u64::MAX, |p| p.every.max(1) as u64);
        loop {
            let pos = self.src.offset();
            if pos >= next_progress {
                if let Some(p) = progress.as_mut() {
                    (p.callback)(pos as usize);
                    next_progress = pos + p.every.max(1) as u64;
                }
            }
            self.op_start = pos;
            let op = match self.src.next_byte() {
                Ok(Some(op)) => op,
                Ok(None) => {
                    self.op = 0;
                    return Err(PickleError { offset: pos as usize, opcode: None, kind: ErrorKind::MissingStop });
                }
                Err(f) => return Err(PickleError { opcode: None, ..fault(pos, 0, f, 1) }),
            };
            self.op = op;
            self.stats.opcodes += 1;
            if self.stats.opcodes.is_multiple_of(BUDGET_CHECK_EVERY) {
                self.check_budget(compactor)?;
            }
            match op {
                // --- framing and control
                0x80 => {
                    // PROTO
                    let p = self.u8()?;
                    if p > 5 {
                        return Err(self.err(ErrorKind::UnsupportedProtocol(p)));
                    }
                    self.stats.protocol = p;
                }
                0x95 => {
                    // FRAME: a length hint; the bytes follow inline, nothing to do but check it.
                    let n = self.u64()?;
                    let (at, op) = (self.op_start, self.op);
                    self.src.expect(n).map_err(|f| fault(at, op, f, n))?;
                    self.stats.frames += 1;
                    self.frame_end = self.src.offset().saturating_add(n);
                }
                b'.' => {
                    // STOP
                    let root = self.pop()?;
                    self.stats.trailing_bytes = self.src.buffered();
                    self.check_budget(compactor)?;
                    if let Some(p) = progress.as_mut() {
                        (p.callback)(self.src.offset() as usize);
                    }
                    return Ok(Parsed { heap: self.heap, root, stats: self.stats });
                }
                b'(' => {
                    // MARK
                    if self.marks.len() >= self.limits.max_marks {
                        return Err(self.err(ErrorKind::TooDeep(self.limits.max_marks)));
                    }
                    self.marks.push(self.stack.len());
                }
                b'0' => {
                    // POP (of a value, or of a mark at the top)
                    if self.marks.last() == Some(&self.stack.len()) {
                        self.marks.pop();
                    } else {
                        self.pop()?;
                    }
                }
                b'1' => {
                    // POP_MARK
                    let m = self.pop_mark()?;
                    self.stack.truncate(m);
                }
                b'2' => {
                    // DUP
                    let v = self.top()?;
                    if let Value::Dict(d) = v {
                        self.heap.dict_memo[d as usize] = DICT_SHARED;
                    }
                    self.stack.push(v);
                }
                // --- constants
                b'N' => self.stack.push(Value::None),
                0x88 => self.stack.push(Value::Bool(true)),
                0x89 => self.stack.push(Value::Bool(false)),
                // --- integers
                b'J' => {
                    let v = self.u32()? as i32;
                    self.stack.push(Value::Int(v as i64));
                }
                b'K' => {
                    let v = self.u8()?;
                    self.stack.push(Value::Int(v as i64));
                }
                b'M' => {
                    let v = self.u16()?;
                    self.stack.push(Value::Int(v as i64));
                }
                0x8a => {
                    // LONG1
                    let n = self.u8()?;
                    self.push_long(n as u64)?;
                }
                0x8b => {
                    // LONG4
                    let n = self.u32()? as i32;
                    if n < 0 {
                        return Err(self.err(ErrorKind::NegativeLength(n as i64)));
                    }
                    self.push_long(n as u64)?;
                }
                b'I' => {
                    // INT (text); "01"/"00" are True/False in protocol 0.
                    let l = self.line()?;
                    match &l[..] {
                        b"01" => self.stack.push(Value::Bool(true)),
                        b"00" => self.stack.push(Value::Bool(false)),
                        _ => {
                            let v = parse_text_int(&l).ok_or_else(|| self.err(ErrorKind::BadText("INT")))?;
                            self.push_int(v);
                        }
                    }
                }
                b'L' => {
                    // LONG (text, optional trailing 'L')
                    let line = self.line()?;
                    let l = line.strip_suffix(b"L").unwrap_or(&line);
                    let v = parse_text_int(l).ok_or_else(|| self.err(ErrorKind::BadText("LONG")))?;
                    self.push_int(v);
                }
                // --- floats
                b'G' => {
                    let a = self.array::<8>()?;
                    self.stack.push(Value::Float(f64::from_be_bytes(a)));
                }
                b'F' => {
                    let l = self.line()?;
                    let v = std::str::from_utf8(&l)
                        .ok()
                        .and_then(|s| s.trim().parse::<f64>().ok())
                        .ok_or_else(|| self.err(ErrorKind::BadText("FLOAT")))?;
                    self.stack.push(Value::Float(v));
                }
                // --- strings
                0x8c => {
                    let n = self.u8()?;
                    self.push_str(n as u64)?;
                }
                b'X' => {
                    let n = self.u32()?;
                    self.push_str(n as u64)?;
                }
                0x8d => {
                    let n = self.u64()?;
                    self.push_str(n)?;
                }
                b'V' => {
                    // UNICODE (raw-unicode-escape text line)
                    let l = self.line()?;
                    let s = decode_raw_unicode_escape(&l);
                    self.push_owned_str(s);
                }
                b'S' => {
                    // STRING (Python 2 str repr, quoted)
                    let l = self.line()?;
                    let s = decode_py_string_repr(&l).ok_or_else(|| self.err(ErrorKind::BadText("STRING")))?;
                    self.push_owned_str(s);
                }
                b'T' => {
                    // BINSTRING: Python 2 str; treated as text (lossy), like encoding='latin1' would.
                    let n = self.u32()? as i32;
                    if n < 0 {
                        return Err(self.err(ErrorKind::NegativeLength(n as i64)));
                    }
                    self.push_str(n as u64)?;
                }
                b'U' => {
                    let n = self.u8()?;
                    self.push_str(n as u64)?;
                }
                // --- bytes
                b'C' => {
                    let n = self.u8()?;
                    self.push_bytes(n as u64)?;
                }
                b'B' => {
                    let n = self.u32()?;
                    self.push_bytes(n as u64)?;
                }
                0x8e | 0x96 => {
                    // BINBYTES8, BYTEARRAY8
                    let n = self.u64()?;
                    self.push_bytes(n)?;
                }
                0x98 => {
                    // READONLY_BUFFER: a no-op on in-band bytes.
                    self.top()?;
                }
                // --- containers
                b']' => {
                    let v = self.new_list(Vec::new());
                    self.stack.push(v);
                }
                b'l' => {
                    let m = self.pop_mark()?;
                    let items = self.stack.split_off(m);
                    let v = self.new_list(items);
                    self.stack.push(v);
                }
                b'}' => {
                    self.built += OBJECT_OVERHEAD;
                    let id = self.heap.new_dict();
                    self.stack.push(Value::Dict(id));
                }
                b'd' => {
                    let m = self.pop_mark()?;
                    self.built += OBJECT_OVERHEAD;
                    let id = self.heap.new_dict();
                    self.set_items(Value::Dict(id), m)?;
                    self.stack.push(Value::Dict(id));
                }
                b')' => {
                    let v = self.new_tuple(Vec::new());
                    self.stack.push(v);
                }
                b't' => {
                    let m = self.pop_mark()?;
                    let items = self.stack.split_off(m);
                    let v = self.new_tuple(items);
                    self.stack.push(v);
                }
                0x85..=0x87 => {
                    let n = (op - 0x84) as usize;
                    let floor = self.marks.last().copied().unwrap_or(0);
                    if self.stack.len() < floor + n {
                        return Err(self.err(ErrorKind::StackUnderflow));
                    }
                    let items = self.stack.split_off(self.stack.len() - n);
                    let v = self.new_tuple(items);
                    self.stack.push(v);
                }
                0x8f => {
                    // EMPTY_SET
                    self.built += OBJECT_OVERHEAD;
                    self.heap.lists.push(ListStore::default());
                    self.stack.push(Value::Set((self.heap.lists.len() - 1) as u32));
                }
                0x91 => {
                    // FROZENSET
                    let m = self.pop_mark()?;
                    let items = self.stack.split_off(m);
                    self.built += OBJECT_OVERHEAD + items.len() as u64 * SLOT;
                    self.heap.lists.push(ListStore::Values(items.into()));
                    self.stack.push(Value::Set((self.heap.lists.len() - 1) as u32));
                }
                b'a' => {
                    // APPEND
                    let floor = self.marks.last().copied().unwrap_or(0);
                    if self.stack.len() < floor + 2 {
                        return Err(self.err(ErrorKind::StackUnderflow));
                    }
                    let list = self.stack[self.stack.len() - 2];
                    let from = self.stack.len() - 1;
                    if self.append_items(list, from, compactor)? {
                        self.fast_forward(list, compactor)?;
                    }
                }
                b'e' | 0x90 => {
                    // APPENDS, ADDITEMS
                    let m = self.pop_mark()?;
                    if m == 0 || self.marks.last().is_some_and(|&o| o >= m) {
                        return Err(self.err(ErrorKind::StackUnderflow));
                    }
                    let list = self.stack[m - 1];
                    if m == self.stack.len() {
                        self.stats.empty_batches += 1;
                    }
                    if op == 0x90 && !matches!(list, Value::Set(_)) {
                        return Err(self.err(ErrorKind::WrongType { expected: "set", found: list.type_name() }));
                    }
                    if self.append_items(list, m, compactor)? && op == b'e' {
                        self.fast_forward(list, compactor)?;
                    }
                }
                b's' => {
                    // SETITEM
                    let floor = self.marks.last().copied().unwrap_or(0);
                    if self.stack.len() < floor + 3 {
                        return Err(self.err(ErrorKind::StackUnderflow));
                    }
                    let dict = self.stack[self.stack.len() - 3];
                    let from = self.stack.len() - 2;
                    self.set_items(dict, from)?;
                }
                b'u' => {
                    // SETITEMS
                    let m = self.pop_mark()?;
                    if m == 0 || self.marks.last().is_some_and(|&o| o >= m) {
                        return Err(self.err(ErrorKind::StackUnderflow));
                    }
                    let dict = self.stack[m - 1];
                    if m == self.stack.len() {
                        self.stats.empty_batches += 1;
                    }
                    self.set_items(dict, m)?;
                }
                // --- memo
                0x94 => {
                    self.stats.memoize += 1;
                    let idx = self.memo_count;
                    self.memo_put(idx)?;
                }
                b'q' => {
                    self.stats.binput += 1;
                    let i = self.u8()? as u64;
                    self.memo_put(i)?;
                }
                b'r' => {
                    self.stats.binput += 1;
                    let i = self.u32()? as u64;
                    self.memo_put(i)?;
                }
                b'p' => {
                    let l = self.line()?;
                    let i =
                        parse_text_int(&l).filter(|i| *i >= 0).ok_or_else(|| self.err(ErrorKind::BadText("PUT")))?;
                    self.memo_put(i as u64)?;
                }
                b'h' => {
                    let i = self.u8()? as u64;
                    self.memo_get(i)?;
                }
                b'j' => {
                    let i = self.u32()? as u64;
                    self.memo_get(i)?;
                }
                b'g' => {
                    let l = self.line()?;
                    let i =
                        parse_text_int(&l).filter(|i| *i >= 0).ok_or_else(|| self.err(ErrorKind::BadText("GET")))?;
                    self.memo_get(i as u64)?;
                }
                // --- everything that would import or call code, or needs out-of-band data
                b'c' | 0x93 | b'R' | b'b' | b'i' | b'o' | 0x81 | 0x92 | b'P' | b'Q' | 0x82 | 0x83 | 0x84 | 0x97 => {
                    return Err(self.err(ErrorKind::Forbidden(opcode_name(op))));
                }
                _ => return Err(self.err(ErrorKind::UnknownOpcode)),
            }
        }
    }
}

/// A memo handle for `v` (scalars are stored aside in `scalars`).
#[inline]
fn encode(scalars: &mut Vec<Value>, v: Value) -> Result<u32, ErrorKind> {
    let (kind, idx) = match v {
        Value::Str(i) => (H_STR, i),
        Value::List(i) => (H_LIST, i),
        Value::Tuple(i) => (H_TUPLE, i),
        Value::Dict(i) => (H_DICT, i),
        Value::Set(i) => (H_SET, i),
        Value::Record(i) => (H_RECORD, i),
        other => {
            scalars.push(other);
            (H_SCALAR, (scalars.len() - 1) as u32)
        }
    };
    if idx >= H_INDEX_MASK {
        return Err(ErrorKind::LimitExceeded("objects (more than 2^29 of one kind)"));
    }
    Ok((kind << 29) | idx)
}

/// The value of a memo handle (`None` for an empty slot or a lazy list, which the VM makes).
fn decode(scalars: &[Value], h: u32) -> Option<Value> {
    let idx = h & H_INDEX_MASK;
    Some(match h >> 29 {
        H_STR => Value::Str(idx),
        H_LIST => Value::List(idx),
        H_TUPLE => Value::Tuple(idx),
        H_DICT => Value::Dict(idx),
        H_SET => Value::Set(idx),
        H_RECORD => Value::Record(idx),
        H_SCALAR => *scalars.get(idx as usize)?,
        _ => return None,
    })
}

/// Handle kinds in the top 3 bits of a memo slot; the low 29 bits index the heap table.
const H_STR: u32 = 0;
const H_LIST: u32 = 1;
const H_TUPLE: u32 = 2;
const H_DICT: u32 = 3;
const H_SET: u32 = 4;
const H_RECORD: u32 = 5;
const H_SCALAR: u32 = 6;
/// A list a fast-forward read and nobody fetched yet (see [`MemoRef::LazyList`]): the low bits
/// are its token. Its all-ones index is [`H_EMPTY`].
const H_LAZY_LIST: u32 = 7;
const H_INDEX_MASK: u32 = (1 << 29) - 1;
/// An unused memo slot.
const H_EMPTY: u32 = u32::MAX;

const SHORT_STR_MAX: usize = 48;

/// Bytes counted per value slot in a container, on the stack or in the memo (a [`Value`]).
const SLOT: u64 = std::mem::size_of::<Value>() as u64;
/// Bytes counted per string, list, tuple, dict or set besides its contents.
const OBJECT_OVERHEAD: u64 = 24;
/// Opcodes between two checks of the object budget. A single opcode adds at most its own input
/// bytes (a string) or a handful of slots, so the budget is overrun by little between checks.
const BUDGET_CHECK_EVERY: u64 = 1 << 14;
const SHORT_STR_SLOTS: usize = 4096;
/// The most bytes a fast-forward is shown at a time (see [`Compactor::ahead_bytes`]): little
/// against the input, and the bound on what the window costs in memory.
pub const MAX_FAST_FORWARD_WINDOW: usize = 32 << 20;

/// The error for a source that could not give `needed` bytes to the opcode at `at`.
fn fault(at: u64, op: u8, f: Fault, needed: u64) -> PickleError {
    let kind = match f {
        Fault::Short { available } => ErrorKind::Truncated { needed, available },
        Fault::Io(e) => ErrorKind::Input(e.to_string()),
    };
    PickleError { offset: at as usize, opcode: Some(op), kind }
}

/// Little-endian two's-complement integer of `b.len()` bytes (LONG1/LONG4); `None` when it is
/// wider than 128 bits. Shared with the parallel trace reader (`memsnap-model`), so that both
/// readers agree on every integer.
pub fn long_value(b: &[u8]) -> Option<i128> {
    let n = b.len();
    if n == 0 {
        return Some(0);
    }
    // Fast path: addresses and timestamps are 6–8 byte LONG1s. The bytes are read where they
    // lie, in two overlapping words, never copied into a buffer and read back whole: a copy of
    // variable length followed by a wide load of the same buffer stalls store forwarding, which
    // once took a quarter of `summary` on a trace of 1 M entries.
    if n <= 8 {
        let word = if n >= 4 {
            let low = u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as u64;
            let high = u32::from_le_bytes([b[n - 4], b[n - 3], b[n - 2], b[n - 1]]) as u64;
            low | high << (8 * (n - 4))
        } else {
            b[0] as u64 | (b[n / 2] as u64) << (8 * (n / 2)) | (b[n - 1] as u64) << (8 * (n - 1))
        };
        let shift = 64 - 8 * n as u32;
        return Some((((word << shift) as i64) >> shift) as i128);
    }
    // Strip redundant sign-extension bytes, then require at most 16 significant bytes.
    let neg = b[n - 1] & 0x80 != 0;
    let mut n = n;
    let fill = if neg { 0xff } else { 0x00 };
    while n > 1 && b[n - 1] == fill && ((b[n - 2] & 0x80 != 0) == neg) {
        n -= 1;
    }
    if n > 16 {
        return None;
    }
    let mut buf = [fill; 16];
    buf[..n].copy_from_slice(&b[..n]);
    Some(i128::from_le_bytes(buf))
}

/// FNV-1a over a short string, for the dedupe cache.
fn short_hash(b: &[u8]) -> usize {
    let mut h: u32 = 0x811c_9dc5;
    for &x in b {
        h = (h ^ x as u32).wrapping_mul(0x0100_0193);
    }
    h as usize
}

fn parse_text_int(l: &[u8]) -> Option<i128> {
    std::str::from_utf8(l).ok()?.trim().parse::<i128>().ok()
}

/// `raw-unicode-escape`: bytes are Latin-1, except `\uXXXX` and `\UXXXXXXXX` escapes.
fn decode_raw_unicode_escape(b: &[u8]) -> String {
    let mut out = String::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 1 < b.len() && (b[i + 1] == b'u' || b[i + 1] == b'U') {
            let n = if b[i + 1] == b'u' { 4 } else { 8 };
            if let Some(hex) = b.get(i + 2..i + 2 + n) {
                if let Some(c) =
                    std::str::from_utf8(hex).ok().and_then(|h| u32::from_str_radix(h, 16).ok()).and_then(char::from_u32)
                {
                    out.push(c);
                    i += 2 + n;
                    continue;
                }
            }
        }
        out.push(b[i] as char);
        i += 1;
    }
    out
}

/// A Python 2 `repr` of a byte string: `'...'` or `"..."` with backslash escapes.
fn decode_py_string_repr(l: &[u8]) -> Option<String> {
    let q = *l.first()?;
    if (q != b'\'' && q != b'"') || l.len() < 2 || *l.last()? != q {
        return None;
    }
    let inner = &l[1..l.len() - 1];
    let mut out: Vec<u8> = Vec::with_capacity(inner.len());
    let mut i = 0;
    while i < inner.len() {
        let c = inner[i];
        if c != b'\\' || i + 1 >= inner.len() {
            out.push(c);
            i += 1;
            continue;
        }
        let e = inner[i + 1];
        i += 2;
        match e {
            b'n' => out.push(b'\n'),
            b't' => out.push(b'\t'),
            b'r' => out.push(b'\r'),
            b'\\' => out.push(b'\\'),
            b'\'' => out.push(b'\''),
            b'"' => out.push(b'"'),
            b'x' => {
                let h = inner.get(i..i + 2)?;
                out.push(u8::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok()?);
                i += 2;
            }
            b'0'..=b'7' => {
                let mut v = (e - b'0') as u32;
                let mut k = 0;
                while k < 2 && i < inner.len() && (b'0'..=b'7').contains(&inner[i]) {
                    v = v * 8 + (inner[i] - b'0') as u32;
                    i += 1;
                    k += 1;
                }
                out.push(v as u8);
            }
            other => {
                out.push(b'\\');
                out.push(other);
            }
        }
    }
    Some(String::from_utf8_lossy(&out).into_owned())
}
