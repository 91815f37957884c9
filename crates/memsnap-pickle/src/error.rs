//! Errors that say what is wrong and where (byte offset and opcode).

use std::fmt;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The input ended inside an opcode or argument.
    Truncated {
        needed: u64,
        available: u64,
    },
    /// The input ended before `STOP`.
    MissingStop,
    UnknownOpcode,
    /// An opcode that would import or run code, or needs out-of-band data.
    Forbidden(&'static str),
    UnsupportedProtocol(u8),
    StackUnderflow,
    NoMark,
    OddSetItems,
    BadMemoKey(u64),
    NegativeLength(i64),
    IntTooLarge {
        bytes: u64,
    },
    BadText(&'static str),
    WrongType {
        expected: &'static str,
        found: &'static str,
    },
    TooDeep(usize),
    /// An append to a list that a compactor had already absorbed into a record.
    FrozenList,
    LimitExceeded(&'static str),
    /// A string or bytes object longer than `Limits::max_object_bytes`.
    TooLong {
        bytes: u64,
        limit: u64,
    },
    /// The input could not be read (an I/O error, a corrupt compressed stream, a decompression
    /// budget); the text says which.
    Input(String),
    /// The objects built take more memory than the input's size allows (see `ObjectBudget`).
    ObjectBudget {
        built: u64,
        allowed: u64,
        pickle: u64,
        stored: u64,
    },
}

/// A pickle that cannot be read. `offset` is the byte offset of the opcode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PickleError {
    pub offset: usize,
    pub opcode: Option<u8>,
    pub kind: ErrorKind,
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ErrorKind::Truncated { needed, available } => {
                write!(f, "truncated: needs {needed} more bytes, {available} left")
            }
            ErrorKind::MissingStop => write!(f, "input ended before the STOP opcode (truncated or not a pickle)"),
            ErrorKind::UnknownOpcode => write!(f, "unknown opcode (not a pickle, or corrupted)"),
            ErrorKind::Forbidden(name) => write!(
                f,
                "refusing opcode {name}: it would import or call code, and a memory snapshot never contains it"
            ),
            ErrorKind::UnsupportedProtocol(p) => write!(f, "unsupported pickle protocol {p} (0-5 are known)"),
            ErrorKind::StackUnderflow => write!(f, "stack underflow (malformed pickle)"),
            ErrorKind::NoMark => write!(f, "no MARK on the stack (malformed pickle)"),
            ErrorKind::OddSetItems => write!(f, "odd number of items for a dict (malformed pickle)"),
            ErrorKind::BadMemoKey(k) => write!(f, "memo key {k} was never stored"),
            ErrorKind::NegativeLength(n) => write!(f, "negative length {n}"),
            ErrorKind::IntTooLarge { bytes } => write!(f, "integer of {bytes} bytes is wider than 128 bits"),
            ErrorKind::BadText(what) => write!(f, "malformed text argument of {what}"),
            ErrorKind::WrongType { expected, found } => write!(f, "expected a {expected} on the stack, found {found}"),
            ErrorKind::FrozenList => write!(f, "append to a frames list after a trace entry used it (not a snapshot)"),
            ErrorKind::TooDeep(n) => write!(f, "nesting deeper than {n} levels"),
            ErrorKind::LimitExceeded(what) => write!(f, "too many {what}"),
            ErrorKind::Input(what) => write!(f, "{what}"),
            ErrorKind::TooLong { bytes, limit } => {
                write!(f, "a string of {bytes} bytes, longer than any snapshot holds (limit {limit})")
            }
            ErrorKind::ObjectBudget { built, allowed, pickle, stored } => write!(
                f,
                "the objects built from {pickle} pickle bytes ({stored} bytes as stored) take about {built} bytes, \
                 more than the {allowed} a real snapshot of this size could need: refusing an object or \
                 decompression bomb"
            ),
        }
    }
}

impl fmt::Display for PickleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.opcode {
            Some(op) => write!(
                f,
                "pickle error at byte {} (opcode {} 0x{:02x}): {}",
                self.offset,
                opcode_name(op),
                op,
                self.kind
            ),
            None => write!(f, "pickle error at byte {}: {}", self.offset, self.kind),
        }
    }
}

impl std::error::Error for PickleError {}

/// The name pickletools gives an opcode.
pub fn opcode_name(op: u8) -> &'static str {
    match op {
        b'(' => "MARK",
        b'.' => "STOP",
        b'0' => "POP",
        b'1' => "POP_MARK",
        b'2' => "DUP",
        b'F' => "FLOAT",
        b'I' => "INT",
        b'J' => "BININT",
        b'K' => "BININT1",
        b'L' => "LONG",
        b'M' => "BININT2",
        b'N' => "NONE",
        b'P' => "PERSID",
        b'Q' => "BINPERSID",
        b'R' => "REDUCE",
        b'S' => "STRING",
        b'T' => "BINSTRING",
        b'U' => "SHORT_BINSTRING",
        b'V' => "UNICODE",
        b'X' => "BINUNICODE",
        b'a' => "APPEND",
        b'b' => "BUILD",
        b'c' => "GLOBAL",
        b'd' => "DICT",
        b'}' => "EMPTY_DICT",
        b'e' => "APPENDS",
        b'g' => "GET",
        b'h' => "BINGET",
        b'i' => "INST",
        b'j' => "LONG_BINGET",
        b'l' => "LIST",
        b']' => "EMPTY_LIST",
        b'o' => "OBJ",
        b'p' => "PUT",
        b'q' => "BINPUT",
        b'r' => "LONG_BINPUT",
        b's' => "SETITEM",
        b't' => "TUPLE",
        b')' => "EMPTY_TUPLE",
        b'u' => "SETITEMS",
        b'G' => "BINFLOAT",
        b'B' => "BINBYTES",
        b'C' => "SHORT_BINBYTES",
        0x80 => "PROTO",
        0x81 => "NEWOBJ",
        0x82 => "EXT1",
        0x83 => "EXT2",
        0x84 => "EXT4",
        0x85 => "TUPLE1",
        0x86 => "TUPLE2",
        0x87 => "TUPLE3",
        0x88 => "NEWTRUE",
        0x89 => "NEWFALSE",
        0x8a => "LONG1",
        0x8b => "LONG4",
        0x8c => "SHORT_BINUNICODE",
        0x8d => "BINUNICODE8",
        0x8e => "BINBYTES8",
        0x8f => "EMPTY_SET",
        0x90 => "ADDITEMS",
        0x91 => "FROZENSET",
        0x92 => "NEWOBJ_EX",
        0x93 => "STACK_GLOBAL",
        0x94 => "MEMOIZE",
        0x95 => "FRAME",
        0x96 => "BYTEARRAY8",
        0x97 => "NEXT_BUFFER",
        0x98 => "READONLY_BUFFER",
        _ => "unknown",
    }
}
