//! The pickle virtual machine: a loop over opcodes that builds values in a [`Heap`].
//!
//! Only data opcodes are implemented. Every opcode that would import, call or build an object
//! (`GLOBAL`, `STACK_GLOBAL`, `REDUCE`, `BUILD`, `INST`, `OBJ`, `NEWOBJ`, `NEWOBJ_EX`, `PERSID`,
//! `BINPERSID`, `EXT*`, out-of-band buffers) is refused: nothing in a file ever runs.

use std::borrow::Cow;
use std::collections::HashMap;

use crate::error::{opcode_name, ErrorKind, PickleError};
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
    fn compact(&mut self, heap: &Heap<'_>, dict: u32, freeze: &mut Vec<(u32, u32)>) -> Option<u32>;
}

/// A compactor that never compacts.
pub struct NoCompaction;

impl Compactor for NoCompaction {
    fn compact(&mut self, _heap: &Heap<'_>, _dict: u32, _freeze: &mut Vec<(u32, u32)>) -> Option<u32> {
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
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_marks: 10_000, max_sparse_memo: 1 << 24 }
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
    /// Bytes after `STOP` that were ignored.
    pub trailing_bytes: usize,
}

/// The result of reading a pickle.
#[derive(Debug)]
pub struct Parsed<'a> {
    pub heap: Heap<'a>,
    pub root: Value,
    pub stats: Stats,
}

/// Called with the current byte offset about every `progress_every` bytes (to report progress,
/// or to let a memory-mapped input drop pages already read).
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
    let vm = Vm {
        data,
        pos: 0,
        op_start: 0,
        op: 0,
        heap: Heap::default(),
        stack: Vec::with_capacity(1024),
        marks: Vec::new(),
        // Capacity reserved from the input size is address space, not memory: pages are only
        // touched as the memo fills, and the vector never has to be copied while it grows.
        memo: Vec::with_capacity(data.len() / 16),
        sparse_memo: HashMap::new(),
        memo_scalars: Vec::new(),
        short_strs: vec![(u32::MAX, 0); SHORT_STR_SLOTS],
        freeze: Vec::new(),
        memo_count: 0,
        stats: Stats::default(),
        limits,
    };
    vm.run(compactor, progress)
}

struct Vm<'a, 'l> {
    data: &'a [u8],
    pos: usize,
    op_start: usize,
    op: u8,
    heap: Heap<'a>,
    stack: Vec<Value>,
    marks: Vec<usize>,
    /// The memo as 4-byte handles (see [`Handle`]): a 1 GB snapshot memoizes tens of millions
    /// of objects, so a slot must be small.
    memo: Vec<u32>,
    sparse_memo: HashMap<u32, u32>,
    /// Memoized values that are not heap objects (ints, floats, None, bools, bytes).
    memo_scalars: Vec<Value>,
    /// Direct-mapped cache of short strings already in the heap: strings are immutable, so equal
    /// short strings (the `'N/A'` that every trace entry writes anew) can share one heap entry.
    short_strs: Vec<(u32, u32)>,
    freeze: Vec<(u32, u32)>,
    /// Number of distinct memo entries (what `MEMOIZE` uses as the next index).
    memo_count: u64,
    stats: Stats,
    limits: &'l Limits,
}

impl<'a> Vm<'a, '_> {
    fn err(&self, kind: ErrorKind) -> PickleError {
        PickleError { offset: self.op_start, opcode: Some(self.op), kind }
    }

    #[inline]
    fn take(&mut self, n: usize) -> Result<&'a [u8], PickleError> {
        let data: &'a [u8] = self.data;
        if n > data.len() - self.pos {
            return Err(self.err(ErrorKind::Truncated { needed: n as u64, available: (data.len() - self.pos) as u64 }));
        }
        let s = &data[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    /// Length prefixes are checked against the bytes that remain before anything is allocated.
    fn take_len(&mut self, n: u64) -> Result<&'a [u8], PickleError> {
        let avail = (self.data.len() - self.pos) as u64;
        if n > avail {
            return Err(self.err(ErrorKind::Truncated { needed: n, available: avail }));
        }
        self.take(n as usize)
    }

    #[inline]
    fn u8(&mut self) -> Result<u8, PickleError> {
        Ok(self.take(1)?[0])
    }
    #[inline]
    fn u16(&mut self) -> Result<u16, PickleError> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }
    #[inline]
    fn u32(&mut self) -> Result<u32, PickleError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Result<u64, PickleError> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    fn line(&mut self) -> Result<&'a [u8], PickleError> {
        let rest = &self.data[self.pos..];
        match rest.iter().position(|&b| b == b'\n') {
            Some(n) => {
                let l = &rest[..n];
                self.pos += n + 1;
                Ok(l)
            }
            None => Err(self.err(ErrorKind::Truncated { needed: rest.len() as u64 + 1, available: rest.len() as u64 })),
        }
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

    fn push_str_bytes(&mut self, b: &'a [u8]) {
        if b.len() <= SHORT_STR_MAX {
            let slot = short_hash(b) & (SHORT_STR_SLOTS - 1);
            let (id, _) = self.short_strs[slot];
            if id != u32::MAX && self.heap.strs[id as usize].as_bytes() == b {
                self.stack.push(Value::Str(id));
                return;
            }
            let id = self.heap.strs.len() as u32;
            self.short_strs[slot] = (id, 0);
        }
        let s = match std::str::from_utf8(b) {
            Ok(s) => Cow::Borrowed(s),
            Err(_) => Cow::Owned(String::from_utf8_lossy(b).into_owned()),
        };
        self.heap.strs.push(s);
        self.stack.push(Value::Str((self.heap.strs.len() - 1) as u32));
    }

    fn push_owned_str(&mut self, s: String) {
        self.heap.strs.push(Cow::Owned(s));
        self.stack.push(Value::Str((self.heap.strs.len() - 1) as u32));
    }

    fn push_bytes(&mut self, b: &'a [u8]) {
        self.heap.bytes.push(Cow::Borrowed(b));
        self.stack.push(Value::Bytes((self.heap.bytes.len() - 1) as u32));
    }

    fn push_int(&mut self, v: i128) {
        if let Ok(i) = i64::try_from(v) {
            self.stack.push(Value::Int(i));
        } else {
            self.heap.bigints.push(v);
            self.stack.push(Value::BigInt((self.heap.bigints.len() - 1) as u32));
        }
    }

    /// Little-endian two's-complement integer of `b.len()` bytes (LONG1/LONG4).
    fn push_long_bytes(&mut self, b: &[u8]) -> Result<(), PickleError> {
        if b.is_empty() {
            self.stack.push(Value::Int(0));
            return Ok(());
        }
        // Fast path: addresses and timestamps are 6–8 byte LONG1s.
        if b.len() <= 8 {
            let mut buf = [0u8; 8];
            buf[..b.len()].copy_from_slice(b);
            let shift = 64 - 8 * b.len() as u32;
            let v = (i64::from_le_bytes(buf) << shift) >> shift;
            self.stack.push(Value::Int(v));
            return Ok(());
        }
        // Strip redundant sign-extension bytes, then require at most 16 significant bytes.
        let neg = b[b.len() - 1] & 0x80 != 0;
        let mut n = b.len();
        let fill = if neg { 0xff } else { 0x00 };
        while n > 1 && b[n - 1] == fill && ((b[n - 2] & 0x80 != 0) == neg) {
            n -= 1;
        }
        if n > 16 {
            return Err(self.err(ErrorKind::IntTooLarge { bytes: b.len() as u64 }));
        }
        let mut buf = [fill; 16];
        buf[..n].copy_from_slice(&b[..n]);
        self.push_int(i128::from_le_bytes(buf));
        Ok(())
    }

    fn encode(&mut self, v: Value) -> Result<u32, PickleError> {
        let (kind, idx) = match v {
            Value::Str(i) => (H_STR, i),
            Value::List(i) => (H_LIST, i),
            Value::Tuple(i) => (H_TUPLE, i),
            Value::Dict(i) => (H_DICT, i),
            Value::Set(i) => (H_SET, i),
            Value::Record(i) => (H_RECORD, i),
            other => {
                self.memo_scalars.push(other);
                (H_SCALAR, (self.memo_scalars.len() - 1) as u32)
            }
        };
        if idx > H_INDEX_MASK {
            return Err(self.err(ErrorKind::LimitExceeded("objects (more than 2^29 of one kind)")));
        }
        Ok((kind << 29) | idx)
    }

    fn decode(&self, h: u32) -> Option<Value> {
        let idx = h & H_INDEX_MASK;
        Some(match h >> 29 {
            H_STR => Value::Str(idx),
            H_LIST => Value::List(idx),
            H_TUPLE => Value::Tuple(idx),
            H_DICT => Value::Dict(idx),
            H_SET => Value::Set(idx),
            H_RECORD => Value::Record(idx),
            H_SCALAR => *self.memo_scalars.get(idx as usize)?,
            _ => return None,
        })
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
            if self.memo[idx as usize] == H_EMPTY {
                self.memo_count += 1;
            }
            self.memo[idx as usize] = h;
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
        let h = if (idx as usize) < self.memo.len() {
            self.memo[idx as usize]
        } else if idx < H_EMPTY as u64 {
            self.sparse_memo.get(&(idx as u32)).copied().unwrap_or(H_EMPTY)
        } else {
            H_EMPTY
        };
        let v = self.decode(h).ok_or_else(|| self.err(ErrorKind::BadMemoKey(idx)))?;
        if let Value::Dict(d) = v {
            self.heap.dict_memo[d as usize] = DICT_SHARED;
        }
        self.stack.push(v);
        Ok(())
    }

    fn replace_in_memo(&mut self, slot: u32, v: Value) -> Result<(), PickleError> {
        let h = self.encode(v)?;
        if let Some(m) = self.memo.get_mut(slot as usize) {
            *m = h;
        } else if let Some(m) = self.sparse_memo.get_mut(&slot) {
            *m = h;
        }
        Ok(())
    }

    fn append_items(&mut self, list: Value, from: usize, compactor: &mut dyn Compactor) -> Result<(), PickleError> {
        let id = match list {
            Value::List(id) | Value::Set(id) => id,
            other => {
                return Err(self.err(ErrorKind::WrongType { expected: "list", found: other.type_name() }));
            }
        };
        let compactable = matches!(list, Value::List(_));
        for i in from..self.stack.len() {
            let mut v = self.stack[i];
            if let (true, Value::Dict(d)) = (compactable, v) {
                let memo = self.heap.dict_memo[d as usize];
                if memo != DICT_SHARED {
                    self.freeze.clear();
                    if let Some(rec) = compactor.compact(&self.heap, d, &mut self.freeze) {
                        for &(list, token) in &self.freeze {
                            if let Some(l) = self.heap.lists.get_mut(list as usize) {
                                *l = ListStore::Frozen(token);
                            }
                        }
                        v = Value::Record(rec);
                        if memo != DICT_UNMEMOIZED {
                            self.replace_in_memo(memo, v)?;
                        }
                        let items = &mut self.heap.dicts[d as usize];
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
            self.heap.lists[id as usize].push(v);
        }
        self.stack.truncate(from);
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
        self.stack.truncate(from);
        Ok(())
    }

    fn new_list(&mut self, items: Vec<Value>) -> Value {
        self.heap.lists.push(ListStore::Values(items.into()));
        Value::List((self.heap.lists.len() - 1) as u32)
    }

    fn new_tuple(&mut self, items: Vec<Value>) -> Value {
        self.heap.tuples.push(items);
        Value::Tuple((self.heap.tuples.len() - 1) as u32)
    }

    fn run(
        mut self,
        compactor: &mut dyn Compactor,
        mut progress: Option<Progress<'_>>,
    ) -> Result<Parsed<'a>, PickleError> {
        let mut next_progress = progress.as_ref().map_or(usize::MAX, |p| p.every.max(1));
        loop {
            if self.pos >= next_progress {
                if let Some(p) = progress.as_mut() {
                    (p.callback)(self.pos);
                    next_progress = self.pos + p.every.max(1);
                }
            }
            self.op_start = self.pos;
            if self.pos >= self.data.len() {
                self.op = 0;
                return Err(PickleError { offset: self.pos, opcode: None, kind: ErrorKind::MissingStop });
            }
            let op = self.data[self.pos];
            self.op = op;
            self.pos += 1;
            self.stats.opcodes += 1;
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
                    let avail = (self.data.len() - self.pos) as u64;
                    if n > avail {
                        return Err(self.err(ErrorKind::Truncated { needed: n, available: avail }));
                    }
                    self.stats.frames += 1;
                }
                b'.' => {
                    // STOP
                    let root = self.pop()?;
                    self.stats.trailing_bytes = self.data.len() - self.pos;
                    if let Some(p) = progress.as_mut() {
                        (p.callback)(self.pos);
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
                    let n = self.u8()? as usize;
                    let b = self.take(n)?;
                    self.push_long_bytes(b)?;
                }
                0x8b => {
                    // LONG4
                    let n = self.u32()? as i32;
                    if n < 0 {
                        return Err(self.err(ErrorKind::NegativeLength(n as i64)));
                    }
                    let b = self.take_len(n as u64)?;
                    self.push_long_bytes(b)?;
                }
                b'I' => {
                    // INT (text); "01"/"00" are True/False in protocol 0.
                    let l = self.line()?;
                    match l {
                        b"01" => self.stack.push(Value::Bool(true)),
                        b"00" => self.stack.push(Value::Bool(false)),
                        _ => {
                            let v = parse_text_int(l).ok_or_else(|| self.err(ErrorKind::BadText("INT")))?;
                            self.push_int(v);
                        }
                    }
                }
                b'L' => {
                    // LONG (text, optional trailing 'L')
                    let l = self.line()?;
                    let l = l.strip_suffix(b"L").unwrap_or(l);
                    let v = parse_text_int(l).ok_or_else(|| self.err(ErrorKind::BadText("LONG")))?;
                    self.push_int(v);
                }
                // --- floats
                b'G' => {
                    let b = self.take(8)?;
                    let mut a = [0u8; 8];
                    a.copy_from_slice(b);
                    self.stack.push(Value::Float(f64::from_be_bytes(a)));
                }
                b'F' => {
                    let l = self.line()?;
                    let v = std::str::from_utf8(l)
                        .ok()
                        .and_then(|s| s.trim().parse::<f64>().ok())
                        .ok_or_else(|| self.err(ErrorKind::BadText("FLOAT")))?;
                    self.stack.push(Value::Float(v));
                }
                // --- strings
                0x8c => {
                    let n = self.u8()? as usize;
                    let b = self.take(n)?;
                    self.push_str_bytes(b);
                }
                b'X' => {
                    let n = self.u32()? as u64;
                    let b = self.take_len(n)?;
                    self.push_str_bytes(b);
                }
                0x8d => {
                    let n = self.u64()?;
                    let b = self.take_len(n)?;
                    self.push_str_bytes(b);
                }
                b'V' => {
                    // UNICODE (raw-unicode-escape text line)
                    let l = self.line()?;
                    let s = decode_raw_unicode_escape(l);
                    self.push_owned_str(s);
                }
                b'S' => {
                    // STRING (Python 2 str repr, quoted)
                    let l = self.line()?;
                    let s = decode_py_string_repr(l).ok_or_else(|| self.err(ErrorKind::BadText("STRING")))?;
                    self.push_owned_str(s);
                }
                b'T' => {
                    // BINSTRING: Python 2 str; treated as text (lossy), like encoding='latin1' would.
                    let n = self.u32()? as i32;
                    if n < 0 {
                        return Err(self.err(ErrorKind::NegativeLength(n as i64)));
                    }
                    let b = self.take_len(n as u64)?;
                    self.push_str_bytes(b);
                }
                b'U' => {
                    let n = self.u8()? as usize;
                    let b = self.take(n)?;
                    self.push_str_bytes(b);
                }
                // --- bytes
                b'C' => {
                    let n = self.u8()? as usize;
                    let b = self.take(n)?;
                    self.push_bytes(b);
                }
                b'B' => {
                    let n = self.u32()? as u64;
                    let b = self.take_len(n)?;
                    self.push_bytes(b);
                }
                0x8e | 0x96 => {
                    // BINBYTES8, BYTEARRAY8
                    let n = self.u64()?;
                    let b = self.take_len(n)?;
                    self.push_bytes(b);
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
                    let id = self.heap.new_dict();
                    self.stack.push(Value::Dict(id));
                }
                b'd' => {
                    let m = self.pop_mark()?;
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
                    self.heap.lists.push(ListStore::default());
                    self.stack.push(Value::Set((self.heap.lists.len() - 1) as u32));
                }
                0x91 => {
                    // FROZENSET
                    let m = self.pop_mark()?;
                    let items = self.stack.split_off(m);
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
                    self.append_items(list, from, compactor)?;
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
                    self.append_items(list, m, compactor)?;
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
                    let i = parse_text_int(l).filter(|i| *i >= 0).ok_or_else(|| self.err(ErrorKind::BadText("PUT")))?;
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
                    let i = parse_text_int(l).filter(|i| *i >= 0).ok_or_else(|| self.err(ErrorKind::BadText("GET")))?;
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

/// Handle kinds in the top 3 bits of a memo slot; the low 29 bits index the heap table.
const H_STR: u32 = 0;
const H_LIST: u32 = 1;
const H_TUPLE: u32 = 2;
const H_DICT: u32 = 3;
const H_SET: u32 = 4;
const H_RECORD: u32 = 5;
const H_SCALAR: u32 = 6;
const H_INDEX_MASK: u32 = (1 << 29) - 1;
/// An unused memo slot.
const H_EMPTY: u32 = u32::MAX;

const SHORT_STR_MAX: usize = 48;
const SHORT_STR_SLOTS: usize = 4096;

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
