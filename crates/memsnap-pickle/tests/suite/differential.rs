//! Differential property test: random value trees written by `serde_pickle` (protocols 2 and
//! 3, the ones it writes) and by two small reference writers in this file (protocol 0 text
//! opcodes; protocol 4 with FRAME, MEMOIZE and BINGET for repeated strings, as CPython writes)
//! are read back by our reader and compared structurally with the original tree.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use memsnap_pickle::{parse_simple, ErrorKind, Heap, Value};
use proptest::prelude::*;
use serde_pickle::{DeOptions, HashableValue as HV, SerOptions, Value as PV};

// ------------------------------------------------------------------------------------------
// Values

/// Minimal two's-complement little-endian bytes of `i` (pickle's LONG encoding).
fn long_bytes(i: i128) -> Vec<u8> {
    let mut b = i.to_le_bytes().to_vec();
    while b.len() > 1 {
        let (last, prev) = (b[b.len() - 1], b[b.len() - 2]);
        if (last == 0 && prev & 0x80 == 0) || (last == 0xff && prev & 0x80 != 0) {
            b.pop();
        } else {
            break;
        }
    }
    b
}

/// An integer as serde_pickle represents it (`I64`, or `Int` holding a big integer), made by
/// letting serde_pickle read a LONG1 so this test needs no big-integer crate of its own.
fn int_value(i: i128) -> PV {
    let b = long_bytes(i);
    let mut p = vec![0x80, 2, 0x8a, b.len() as u8];
    p.extend_from_slice(&b);
    p.push(b'.');
    serde_pickle::value_from_slice(&p, DeOptions::new()).unwrap()
}

fn int_of(v: &PV) -> Option<i128> {
    match v {
        PV::I64(i) => Some(*i as i128),
        PV::Int(b) => b.to_string().parse().ok(),
        _ => None,
    }
}

fn leaf(bytes_ok: bool) -> BoxedStrategy<PV> {
    let mut options = vec![
        Just(PV::None).boxed(),
        any::<bool>().prop_map(PV::Bool).boxed(),
        any::<i64>().prop_map(PV::I64).boxed(),
        prop_oneof![-300i64..300, Just(i64::MIN), Just(i64::MAX)].prop_map(PV::I64).boxed(),
        any::<i128>().prop_map(int_value).boxed(),
        prop_oneof![Just(1i128 << 63), Just(u64::MAX as i128), Just(i128::MIN), Just(i128::MAX)]
            .prop_map(int_value)
            .boxed(),
        any::<f64>().prop_map(PV::F64).boxed(),
        any::<String>().prop_map(PV::String).boxed(),
        "[a-z_\\\\\n\r'\"é😀]{0,12}".prop_map(PV::String).boxed(),
    ];
    if bytes_ok {
        options.push(proptest::collection::vec(any::<u8>(), 0..300).prop_map(PV::Bytes).boxed());
    }
    proptest::strategy::Union::new(options).boxed()
}

/// Trees of None, bools, ints (up to 128 bits), floats, strings, optionally bytes, lists,
/// tuples and dicts with string keys.
fn tree(bytes_ok: bool) -> impl Strategy<Value = PV> {
    leaf(bytes_ok).prop_recursive(4, 64, 8, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..8).prop_map(PV::List),
            proptest::collection::vec(inner.clone(), 0..6).prop_map(PV::Tuple),
            proptest::collection::btree_map("[a-z]{0,6}|\\PC{0,4}", inner, 0..6)
                .prop_map(|m| { PV::Dict(m.into_iter().map(|(k, v)| (HV::String(k), v)).collect::<BTreeMap<_, _>>()) }),
        ]
    })
}

/// Is `v` (read by our reader) the same as `want`? Floats by bits; dict items in order.
fn same(h: &Heap<'_>, v: Value, want: &PV) -> Result<(), String> {
    let fail = || Err(format!("read {v:?}, expected {want:?}"));
    match want {
        PV::None => {
            if v == Value::None {
                Ok(())
            } else {
                fail()
            }
        }
        PV::Bool(b) => {
            if v == Value::Bool(*b) {
                Ok(())
            } else {
                fail()
            }
        }
        PV::I64(_) | PV::Int(_) => {
            let ok = matches!(v, Value::Int(_) | Value::BigInt(_)) && h.as_i128(v) == int_of(want);
            if ok {
                Ok(())
            } else {
                fail()
            }
        }
        PV::F64(f) => match v {
            Value::Float(g) if g.to_bits() == f.to_bits() || (g.is_nan() && f.is_nan()) => Ok(()),
            _ => fail(),
        },
        PV::String(s) => {
            if h.as_str(v) == Some(s.as_str()) {
                Ok(())
            } else {
                fail()
            }
        }
        PV::Bytes(b) => match v {
            Value::Bytes(id) if h.bytes[id as usize].as_ref() == b.as_slice() => Ok(()),
            _ => fail(),
        },
        PV::List(items) | PV::Tuple(items) => {
            let kind_ok = matches!((want, v), (PV::List(_), Value::List(_)) | (PV::Tuple(_), Value::Tuple(_)));
            if !kind_ok || h.seq_len(v) != Some(items.len()) {
                return fail();
            }
            for (i, w) in items.iter().enumerate() {
                same(h, h.seq_get(v, i).unwrap(), w).map_err(|e| format!("[{i}] {e}"))?;
            }
            Ok(())
        }
        PV::Dict(m) => {
            let Value::Dict(d) = v else { return fail() };
            let items = h.dict(d);
            if items.len() != m.len() {
                return fail();
            }
            for (&(k, x), (wk, wx)) in items.iter().zip(m) {
                let HV::String(ks) = wk else { unreachable!("string keys only") };
                if h.as_str(k) != Some(ks.as_str()) {
                    return Err(format!("key {k:?}, expected {ks:?}"));
                }
                same(h, x, wx).map_err(|e| format!(".{ks} {e}"))?;
            }
            Ok(())
        }
        PV::Set(_) | PV::FrozenSet(_) => unreachable!("not generated"),
    }
}

fn read_back(bytes: &[u8], want: &PV) -> Result<(), TestCaseError> {
    let p = parse_simple(bytes).map_err(|e| TestCaseError::fail(format!("{e}")))?;
    same(&p.heap, p.root, want).map_err(TestCaseError::fail)
}

// ------------------------------------------------------------------------------------------
// Reference writers

/// Protocol 0, as CPython writes it: text opcodes, MARK+LIST/DICT then APPEND/SETITEM per
/// item, PUT after every container and string.
struct P0 {
    out: Vec<u8>,
    memo: usize,
}

impl P0 {
    fn put(&mut self) {
        let m = self.memo;
        let _ = writeln!(self, "p{m}");
        self.memo += 1;
    }
    fn value(&mut self, v: &PV) {
        match v {
            PV::None => self.out.push(b'N'),
            PV::Bool(b) => self.out.extend_from_slice(if *b { b"I01\n" } else { b"I00\n" }),
            PV::I64(_) | PV::Int(_) => {
                let i = int_of(v).unwrap();
                let _ = if i32::try_from(i).is_ok() { writeln!(self, "I{i}") } else { writeln!(self, "L{i}L") };
            }
            PV::F64(f) => {
                let _ = writeln!(self, "F{f:?}");
            }
            PV::String(s) => {
                self.out.push(b'V');
                for c in s.chars() {
                    match c {
                        '\\' | '\n' | '\r' | '\0' | '\u{1a}' => {
                            let _ = write!(self, "\\u{:04x}", c as u32);
                        }
                        c if (c as u32) < 0x100 => self.out.push(c as u32 as u8),
                        c if (c as u32) < 0x10000 => {
                            let _ = write!(self, "\\u{:04x}", c as u32);
                        }
                        c => {
                            let _ = write!(self, "\\U{:08x}", c as u32);
                        }
                    }
                }
                self.out.push(b'\n');
                self.put();
            }
            PV::List(items) => {
                self.out.extend_from_slice(b"(l");
                self.put();
                for x in items {
                    self.value(x);
                    self.out.push(b'a');
                }
            }
            PV::Tuple(items) => {
                self.out.push(b'(');
                for x in items {
                    self.value(x);
                }
                self.out.push(b't');
                self.put();
            }
            PV::Dict(m) => {
                self.out.extend_from_slice(b"(d");
                self.put();
                for (k, x) in m {
                    let HV::String(k) = k else { unreachable!() };
                    self.value(&PV::String(k.clone()));
                    self.value(x);
                    self.out.push(b's');
                }
            }
            PV::Bytes(_) | PV::Set(_) | PV::FrozenSet(_) => unreachable!("not written at protocol 0"),
        }
    }
}

impl std::fmt::Write for P0 {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.out.extend_from_slice(s.as_bytes());
        Ok(())
    }
}

fn write_p0(v: &PV) -> Vec<u8> {
    let mut w = P0 { out: Vec::new(), memo: 0 };
    w.value(v);
    w.out.push(b'.');
    w.out
}

/// Protocol 4, as CPython writes it: one FRAME, MEMOIZE after every container and string,
/// short opcodes where they fit, and equal strings written once then fetched with BINGET /
/// LONG_BINGET (CPython does that for the same object; snapshots share their key strings).
struct P4 {
    out: Vec<u8>,
    memo: u32,
    strings: std::collections::HashMap<String, u32>,
}

impl P4 {
    fn memoize(&mut self) -> u32 {
        self.out.push(0x94);
        self.memo += 1;
        self.memo - 1
    }
    fn value(&mut self, v: &PV) {
        match v {
            PV::None => self.out.push(b'N'),
            PV::Bool(b) => self.out.push(if *b { 0x88 } else { 0x89 }),
            PV::I64(_) | PV::Int(_) => {
                let i = int_of(v).unwrap();
                if (0..256).contains(&i) {
                    self.out.extend_from_slice(&[b'K', i as u8]);
                } else if (0..65536).contains(&i) {
                    self.out.push(b'M');
                    self.out.extend_from_slice(&(i as u16).to_le_bytes());
                } else if let Ok(x) = i32::try_from(i) {
                    self.out.push(b'J');
                    self.out.extend_from_slice(&x.to_le_bytes());
                } else {
                    let b = long_bytes(i);
                    self.out.extend_from_slice(&[0x8a, b.len() as u8]);
                    self.out.extend_from_slice(&b);
                }
            }
            PV::F64(f) => {
                self.out.push(b'G');
                self.out.extend_from_slice(&f.to_be_bytes());
            }
            PV::String(s) => {
                if let Some(&m) = self.strings.get(s) {
                    if m < 256 {
                        self.out.extend_from_slice(&[b'h', m as u8]);
                    } else {
                        self.out.push(b'j');
                        self.out.extend_from_slice(&m.to_le_bytes());
                    }
                    return;
                }
                if s.len() < 256 {
                    self.out.extend_from_slice(&[0x8c, s.len() as u8]);
                } else {
                    self.out.push(b'X');
                    self.out.extend_from_slice(&(s.len() as u32).to_le_bytes());
                }
                self.out.extend_from_slice(s.as_bytes());
                let m = self.memoize();
                self.strings.insert(s.clone(), m);
            }
            PV::Bytes(b) => {
                if b.len() < 256 {
                    self.out.extend_from_slice(&[b'C', b.len() as u8]);
                } else {
                    self.out.push(0x8e);
                    self.out.extend_from_slice(&(b.len() as u64).to_le_bytes());
                }
                self.out.extend_from_slice(b);
                self.memoize();
            }
            PV::List(items) => {
                self.out.push(b']');
                self.memoize();
                match items.len() {
                    0 => {}
                    1 => {
                        self.value(&items[0]);
                        self.out.push(b'a');
                    }
                    _ => {
                        self.out.push(b'(');
                        items.iter().for_each(|x| self.value(x));
                        self.out.push(b'e');
                    }
                }
            }
            PV::Tuple(items) => {
                match items.len() {
                    0 => self.out.push(b')'),
                    n @ 1..=3 => {
                        items.iter().for_each(|x| self.value(x));
                        self.out.push(0x84 + n as u8);
                    }
                    _ => {
                        self.out.push(b'(');
                        items.iter().for_each(|x| self.value(x));
                        self.out.push(b't');
                    }
                }
                if !items.is_empty() {
                    self.memoize();
                }
            }
            PV::Dict(m) => {
                self.out.push(b'}');
                self.memoize();
                if !m.is_empty() {
                    self.out.push(b'(');
                    for (k, x) in m {
                        let HV::String(k) = k else { unreachable!() };
                        self.value(&PV::String(k.clone()));
                        self.value(x);
                    }
                    self.out.push(b'u');
                }
            }
            PV::Set(_) | PV::FrozenSet(_) => unreachable!("not generated"),
        }
    }
}

fn write_p4(v: &PV) -> Vec<u8> {
    let mut w = P4 { out: Vec::new(), memo: 0, strings: Default::default() };
    w.value(v);
    w.out.push(b'.');
    let mut b = vec![0x80, 4, 0x95];
    b.extend_from_slice(&(w.out.len() as u64).to_le_bytes());
    b.extend_from_slice(&w.out);
    b
}

// ------------------------------------------------------------------------------------------
// Properties

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn serde_pickle_protocol_3_reads_back(v in tree(true)) {
        let bytes = serde_pickle::value_to_vec(&v, SerOptions::new()).unwrap();
        prop_assert_eq!(&bytes[..2], b"\x80\x03");
        read_back(&bytes, &v)?;
    }

    #[test]
    fn serde_pickle_protocol_2_reads_back(v in tree(false)) {
        let bytes = serde_pickle::value_to_vec(&v, SerOptions::new().proto_v2()).unwrap();
        prop_assert_eq!(&bytes[..2], b"\x80\x02");
        read_back(&bytes, &v)?;
    }

    #[test]
    fn protocol_0_text_reads_back(v in tree(false)) {
        read_back(&write_p0(&v), &v)?;
    }

    #[test]
    fn protocol_4_with_memo_reads_back(v in tree(true)) {
        read_back(&write_p4(&v), &v)?;
    }

    #[test]
    fn any_prefix_is_an_error_never_a_panic(v in tree(true), cut in any::<prop::sample::Index>()) {
        let bytes = write_p4(&v);
        let cut = cut.index(bytes.len());
        prop_assert!(parse_simple(&bytes[..cut]).is_err());
    }
}

// ------------------------------------------------------------------------------------------
// The writers themselves agree with serde_pickle on what they wrote.

#[test]
fn reference_writers_are_read_by_serde_pickle_too() {
    let v = PV::Dict(
        [
            (HV::String("segments".into()), PV::List(vec![PV::I64(-5), int_value(1 << 70), PV::F64(0.5)])),
            (HV::String("t".into()), PV::Tuple(vec![PV::String("é\\\n😀".into()), PV::None, PV::Bool(true)])),
            (HV::String("k".into()), PV::String("segments".into())),
        ]
        .into_iter()
        .collect(),
    );
    for bytes in [write_p0(&v), write_p4(&v)] {
        let back = serde_pickle::value_from_slice(&bytes, DeOptions::new()).unwrap();
        assert_eq!(back, v);
        read_back(&bytes, &v).unwrap();
    }
}

#[test]
fn serde_pickle_protocol_2_bytes_are_refused() {
    // serde_pickle writes bytes at protocol 2 as `_codecs.encode(...)`: GLOBAL + REDUCE, which
    // the reader refuses (a snapshot never holds bytes, and nothing is ever called).
    let bytes = serde_pickle::value_to_vec(&PV::Bytes(b"ab".to_vec()), SerOptions::new().proto_v2()).unwrap();
    let e = parse_simple(&bytes).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Forbidden("GLOBAL"));
}
