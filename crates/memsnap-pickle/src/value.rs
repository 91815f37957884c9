//! Values and the arena (heap) that holds every container the pickle built.

use std::borrow::Cow;

use thin_vec::ThinVec;

/// A pickle value. Containers and strings live in the [`Heap`] and are referred to by index, so
/// an object the pickle shares through its memo is stored once, however often it is referenced:
/// the result is a DAG, never an expanded tree.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Value {
    None,
    Bool(bool),
    Int(i64),
    /// Index into [`Heap::bigints`] for integers that do not fit `i64`.
    BigInt(u32),
    Float(f64),
    Str(u32),
    Bytes(u32),
    List(u32),
    Tuple(u32),
    Dict(u32),
    /// Set / frozenset, stored like a list.
    Set(u32),
    /// A dict that a [`crate::Compactor`] converted into a record of its own while parsing.
    Record(u32),
}

impl Value {
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::None => "None",
            Value::Bool(_) => "bool",
            Value::Int(_) | Value::BigInt(_) => "int",
            Value::Float(_) => "float",
            Value::Str(_) => "str",
            Value::Bytes(_) => "bytes",
            Value::List(_) => "list",
            Value::Tuple(_) => "tuple",
            Value::Dict(_) => "dict",
            Value::Set(_) => "set",
            Value::Record(_) => "record",
        }
    }
}

/// Storage of one list: plain values, or a run of consecutive records (a trace list of
/// millions of compacted entries costs nothing per element).
#[derive(Clone, Debug)]
pub enum ListStore {
    Values(ThinVec<Value>),
    Records {
        start: u32,
        len: u32,
    },
    /// A list a compactor absorbed (its elements are gone); the token is the compactor's own.
    Frozen(u32),
}

impl Default for ListStore {
    fn default() -> Self {
        ListStore::Values(ThinVec::new())
    }
}

impl ListStore {
    pub fn len(&self) -> usize {
        match self {
            ListStore::Values(v) => v.len(),
            ListStore::Records { len, .. } => *len as usize,
            ListStore::Frozen(_) => 0,
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn get(&self, i: usize) -> Option<Value> {
        match self {
            ListStore::Values(v) => v.get(i).copied(),
            ListStore::Records { start, len } => (i < *len as usize).then(|| Value::Record(start + i as u32)),
            ListStore::Frozen(_) => None,
        }
    }
    /// Append `Record(first..first + n)` (kept as one run when it continues the list's run).
    pub(crate) fn push_records(&mut self, first: u32, n: u32) {
        match self {
            ListStore::Values(vals) if vals.is_empty() && n > 0 => *self = ListStore::Records { start: first, len: n },
            ListStore::Records { start, len } if *start + *len == first => *len += n,
            _ => (first..first + n).for_each(|r| self.push(Value::Record(r))),
        }
    }

    pub(crate) fn push(&mut self, v: Value) {
        match (&mut *self, v) {
            (ListStore::Values(vals), Value::Record(r)) if vals.is_empty() => {
                *self = ListStore::Records { start: r, len: 1 };
            }
            (ListStore::Records { start, len }, Value::Record(r)) if *start + *len == r => *len += 1,
            (ListStore::Records { start, len }, _) => {
                let mut vals: ThinVec<Value> = (*start..*start + *len).map(Value::Record).collect();
                vals.push(v);
                *self = ListStore::Values(vals);
            }
            (ListStore::Values(vals), _) => vals.push(v),
            (ListStore::Frozen(_), _) => unreachable!("the VM refuses appends to frozen lists"),
        }
    }
}

/// Marks in [`Heap::dict_memo`].
pub(crate) const DICT_UNMEMOIZED: u32 = u32::MAX;
pub(crate) const DICT_SHARED: u32 = u32::MAX - 1;

/// Every string and container of one pickle. Strings are borrowed from the input when they are
/// valid UTF-8 (the common case) and decoded lossily otherwise.
#[derive(Debug, Default)]
pub struct Heap<'a> {
    pub strs: Vec<Cow<'a, str>>,
    pub bytes: Vec<Cow<'a, [u8]>>,
    pub bigints: Vec<i128>,
    pub lists: Vec<ListStore>,
    pub tuples: Vec<Vec<Value>>,
    pub dicts: Vec<Vec<(Value, Value)>>,
    /// Per dict: the memo slot it was stored in, or a mark ([`DICT_UNMEMOIZED`], [`DICT_SHARED`]).
    pub(crate) dict_memo: Vec<u32>,
    pub(crate) free_dicts: Vec<u32>,
}

impl<'a> Heap<'a> {
    pub fn str(&self, id: u32) -> &str {
        &self.strs[id as usize]
    }
    pub fn list(&self, id: u32) -> &ListStore {
        &self.lists[id as usize]
    }
    pub fn tuple(&self, id: u32) -> &[Value] {
        &self.tuples[id as usize]
    }
    pub fn dict(&self, id: u32) -> &[(Value, Value)] {
        &self.dicts[id as usize]
    }

    /// Items of a list, tuple or set (None for other values).
    pub fn seq_len(&self, v: Value) -> Option<usize> {
        match v {
            Value::List(id) | Value::Set(id) => Some(self.list(id).len()),
            Value::Tuple(id) => Some(self.tuple(id).len()),
            _ => None,
        }
    }

    /// Element `i` of a list, tuple or set.
    pub fn seq_get(&self, v: Value, i: usize) -> Option<Value> {
        match v {
            Value::List(id) | Value::Set(id) => self.list(id).get(i),
            Value::Tuple(id) => self.tuple(id).get(i).copied(),
            _ => None,
        }
    }

    /// Look a string key up in a dict (the last occurrence wins, as in Python).
    pub fn dict_get(&self, dict: u32, key: &str) -> Option<Value> {
        self.dict(dict).iter().rev().find(|(k, _)| matches!(k, Value::Str(s) if self.str(*s) == key)).map(|(_, v)| *v)
    }

    /// The value as a string, if it is one.
    pub fn as_str(&self, v: Value) -> Option<&str> {
        match v {
            Value::Str(s) => Some(self.str(s)),
            _ => None,
        }
    }

    /// The value as an integer (bool counts as 0/1, like Python).
    pub fn as_i128(&self, v: Value) -> Option<i128> {
        match v {
            Value::Int(i) => Some(i as i128),
            Value::BigInt(b) => Some(self.bigints[b as usize]),
            Value::Bool(b) => Some(b as i128),
            _ => None,
        }
    }

    pub(crate) fn new_dict(&mut self) -> u32 {
        if let Some(id) = self.free_dicts.pop() {
            self.dict_memo[id as usize] = DICT_UNMEMOIZED;
            id
        } else {
            self.dicts.push(Vec::new());
            self.dict_memo.push(DICT_UNMEMOIZED);
            (self.dicts.len() - 1) as u32
        }
    }
}
