//! One test per opcode family, on hand-written byte strings (protocol 0 text opcodes included),
//! plus memo sharing, integer widths, refusals and error locations.

use memsnap_pickle::{parse, parse_simple, ErrorKind, Heap, Limits, ListStore, NoCompaction, PickleError, Value};

/// A value read back as a plain tree, for comparisons.
#[derive(Clone, Debug, PartialEq)]
enum T {
    None,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(String),
    Bytes(Vec<u8>),
    List(Vec<T>),
    Tuple(Vec<T>),
    Dict(Vec<(T, T)>),
    Set(Vec<T>),
}

fn tree(h: &Heap<'_>, v: Value) -> T {
    match v {
        Value::None => T::None,
        Value::Bool(b) => T::Bool(b),
        Value::Int(_) | Value::BigInt(_) => T::Int(h.as_i128(v).unwrap()),
        Value::Float(f) => T::Float(f),
        Value::Str(s) => T::Str(h.str(s).to_string()),
        Value::Bytes(b) => T::Bytes(h.bytes[b as usize].to_vec()),
        Value::List(_) => T::List((0..h.seq_len(v).unwrap()).map(|i| tree(h, h.seq_get(v, i).unwrap())).collect()),
        Value::Set(_) => T::Set((0..h.seq_len(v).unwrap()).map(|i| tree(h, h.seq_get(v, i).unwrap())).collect()),
        Value::Tuple(t) => T::Tuple(h.tuple(t).iter().map(|&x| tree(h, x)).collect()),
        Value::Dict(d) => T::Dict(h.dict(d).iter().map(|&(k, x)| (tree(h, k), tree(h, x))).collect()),
        Value::Record(_) => panic!("no records without a compactor"),
    }
}

/// Read `bytes` and compare with `want`.
fn check(bytes: &[u8], want: T) {
    let p = parse_simple(bytes).unwrap_or_else(|e| panic!("{bytes:?}: {e}"));
    assert_eq!(tree(&p.heap, p.root), want, "{bytes:?}");
}

/// Read `bytes`, expecting an error.
fn err(bytes: &[u8]) -> PickleError {
    match parse_simple(bytes) {
        Ok(p) => panic!("{bytes:?} was accepted: {:?}", tree(&p.heap, p.root)),
        Err(e) => e,
    }
}

fn s(x: &str) -> T {
    T::Str(x.into())
}

// ------------------------------------------------------------------------------------------
// Framing and control

#[test]
fn proto_frame_stop_and_trailing_bytes() {
    let p = parse_simple(b"\x80\x04\x95\x02\x00\x00\x00\x00\x00\x00\x00N.\x00\x00\x00").unwrap();
    assert_eq!(p.root, Value::None);
    assert_eq!(p.stats.protocol, 4);
    assert_eq!(p.stats.frames, 1);
    assert_eq!(p.stats.trailing_bytes, 3);
    // No PROTO at all (protocol 0/1).
    let p = parse_simple(b"N.").unwrap();
    assert_eq!(p.stats.protocol, 0);
    for proto in 0..=5u8 {
        check(&[0x80, proto, b'N', b'.'], T::None);
    }
}

#[test]
fn mark_pop_pop_mark_dup() {
    // POP drops a value; POP_MARK drops back to the mark; DUP copies the top.
    check(b"\x80\x02K\x01K\x020.", T::Int(1));
    check(b"\x80\x02K\x01(K\x02K\x031.", T::Int(1));
    check(b"\x80\x02K\x07\x32\x86.", T::Tuple(vec![T::Int(7), T::Int(7)]));
    // POP of a MARK at the top of the stack.
    check(b"\x80\x02K\x09(0.", T::Int(9));
}

// ------------------------------------------------------------------------------------------
// Constants and integers

#[test]
fn none_and_booleans() {
    check(b"\x80\x02N.", T::None);
    check(b"\x80\x02\x88.", T::Bool(true));
    check(b"\x80\x02\x89.", T::Bool(false));
    // Protocol 0 spells booleans as INT 01 / 00.
    check(b"I01\n.", T::Bool(true));
    check(b"I00\n.", T::Bool(false));
}

#[test]
fn binary_ints() {
    check(b"\x80\x02K\xff.", T::Int(255));
    check(b"\x80\x02M\xff\xff.", T::Int(65535));
    check(b"\x80\x02J\xff\xff\xff\xff.", T::Int(-1));
    check(b"\x80\x02J\x00\x00\x00\x80.", T::Int(i32::MIN as i128));
}

#[test]
fn text_ints() {
    check(b"I-42\n.", T::Int(-42));
    check(b"I2147483648\n.", T::Int(2_147_483_648));
    check(b"L12345678901234567890L\n.", T::Int(12_345_678_901_234_567_890));
    check(b"L-5\n.", T::Int(-5));
    assert_eq!(err(b"Ix1\n.").kind, ErrorKind::BadText("INT"));
    assert_eq!(err(b"I12").kind, ErrorKind::Truncated { needed: 3, available: 2 });
}

#[test]
fn long1_and_long4() {
    check(b"\x80\x02\x8a\x00.", T::Int(0));
    check(b"\x80\x02\x8a\x01\xff.", T::Int(-1));
    check(b"\x80\x02\x8a\x02\x00\x80.", T::Int(-32768));
    // A 9-byte LONG1 holding 2^64 - 1 (old snapshots carry such addresses).
    check(b"\x80\x02\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\x00.", T::Int(u64::MAX as i128));
    check(b"\x80\x02\x8b\x02\x00\x00\x00\x01\x01.", T::Int(257));
}

/// `long_value` against the definition (sign-extend the bytes to 16 and read them) at every
/// width from 0 to 16 bytes, for values that set and clear each byte's sign bit: the fast path
/// up to 8 bytes reads two overlapping words, so every width has its own byte arrangement.
#[test]
fn long_values_of_every_width_match_the_definition() {
    fn reference(b: &[u8]) -> i128 {
        let fill = if b.last().is_some_and(|x| x & 0x80 != 0) { 0xff } else { 0 };
        let mut buf = [fill; 16];
        buf[..b.len()].copy_from_slice(b);
        i128::from_le_bytes(buf)
    }
    let patterns: [[u8; 16]; 5] = [
        std::array::from_fn(|i| (i as u8 + 1).wrapping_mul(0x11)),
        std::array::from_fn(|i| 0x80 | i as u8),
        std::array::from_fn(|i| 0x7f - i as u8),
        [0xff; 16],
        [0x00; 16],
    ];
    for p in patterns {
        for n in 0..=16 {
            let b = &p[..n];
            assert_eq!(memsnap_pickle::long_value(b), Some(reference(b)), "{n} bytes {b:02x?}");
        }
    }
    assert_eq!(
        memsnap_pickle::long_value(&[0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x80]),
        Some(i64::MIN as i128 + 1)
    );
    assert_eq!(memsnap_pickle::long_value(&[0xff, 0xff, 0xff, 0xff, 0xff, 0x7f]), Some((1i128 << 47) - 1));
}

#[test]
fn ints_up_to_128_bits() {
    let mut max = b"\x80\x02\x8a\x10".to_vec();
    max.extend_from_slice(&i128::MAX.to_le_bytes());
    max.push(b'.');
    check(&max, T::Int(i128::MAX));
    let mut min = b"\x80\x02\x8a\x10".to_vec();
    min.extend_from_slice(&i128::MIN.to_le_bytes());
    min.push(b'.');
    check(&min, T::Int(i128::MIN));
    // Redundant sign-extension bytes are fine: 20 bytes, 16 significant.
    let mut padded = b"\x80\x02\x8a\x14".to_vec();
    padded.extend_from_slice(&(-3i128).to_le_bytes());
    padded.extend_from_slice(&[0xff; 4]);
    padded.push(b'.');
    check(&padded, T::Int(-3));
    // Values beyond i64 are kept as big ints, values within it as Int.
    let p = parse_simple(&max).unwrap();
    assert!(matches!(p.root, Value::BigInt(_)));
    let p = parse_simple(b"\x80\x02\x8a\x08\xff\xff\xff\xff\xff\xff\xff\x7f.").unwrap();
    assert_eq!(p.root, Value::Int(i64::MAX));
}

#[test]
fn ints_wider_than_128_bits_are_errors() {
    // 2^127: 17 significant bytes.
    let mut b = b"\x80\x02\x8a\x11".to_vec();
    b.extend_from_slice(&[0; 15]);
    b.extend_from_slice(&[0x80, 0x00]);
    b.push(b'.');
    let e = err(&b);
    assert_eq!(e.kind, ErrorKind::IntTooLarge { bytes: 17 });
    assert_eq!((e.offset, e.opcode), (2, Some(0x8a)));
    assert!(e.to_string().contains("wider than 128 bits"), "{e}");
    // The same through LONG4 and the text form.
    let mut b = b"\x80\x02\x8b\x20\x00\x00\x00".to_vec();
    b.extend_from_slice(&[0x11; 32]);
    b.push(b'.');
    assert_eq!(err(&b).kind, ErrorKind::IntTooLarge { bytes: 32 });
    assert!(err(b"L340282366920938463463374607431768211456L\n.").to_string().contains("LONG"));
}

// ------------------------------------------------------------------------------------------
// Floats

#[test]
fn floats() {
    let mut b = b"\x80\x02G".to_vec();
    b.extend_from_slice(&1.5f64.to_be_bytes());
    b.push(b'.');
    check(&b, T::Float(1.5));
    check(b"F-0.25\n.", T::Float(-0.25));
    check(b"F1e+100\n.", T::Float(1e100));
    check(b"Finf\n.", T::Float(f64::INFINITY));
    let p = parse_simple(b"Fnan\n.").unwrap();
    assert!(matches!(p.root, Value::Float(f) if f.is_nan()));
    assert_eq!(err(b"F1.2.3\n.").kind, ErrorKind::BadText("FLOAT"));
}

// ------------------------------------------------------------------------------------------
// Strings and bytes

#[test]
fn binary_unicode() {
    check(b"\x80\x04\x8c\x03abc.", s("abc"));
    check(b"\x80\x02X\x02\x00\x00\x00\xc3\xa9.", s("é"));
    check(b"\x80\x04\x8d\x01\x00\x00\x00\x00\x00\x00\x00z.", s("z"));
    check(b"\x80\x04\x8c\x00.", s(""));
}

#[test]
fn text_unicode_and_py2_strings() {
    // UNICODE is raw-unicode-escape: Latin-1 bytes, \uXXXX and \UXXXXXXXX escapes.
    check(b"Vcaf\\u00e9 \\U0001f600 \xe9\n.", s("café 😀 é"));
    check(b"S'it\\'s\\n\\x41\\101'\n.", s("it's\nAA"));
    check(b"S\"dq\"\n.", s("dq"));
    check(b"\x80\x02T\x03\x00\x00\x00abc.", s("abc"));
    check(b"\x80\x02U\x02hi.", s("hi"));
    assert_eq!(err(b"Sunquoted\n.").kind, ErrorKind::BadText("STRING"));
}

#[test]
fn invalid_utf8_is_decoded_lossily() {
    // A lone surrogate written with surrogatepass (U+DCFF as ED B3 BF).
    let p = parse_simple(b"\x80\x04\x8c\x05a\xed\xb3\xbfb.").unwrap();
    let text = p.heap.as_str(p.root).unwrap();
    assert!(text.starts_with('a') && text.ends_with('b') && text.contains('\u{fffd}'), "{text:?}");
}

#[test]
fn bytes_opcodes() {
    check(b"\x80\x03C\x02\x00\xff.", T::Bytes(vec![0, 255]));
    check(b"\x80\x03B\x03\x00\x00\x00xyz.", T::Bytes(b"xyz".to_vec()));
    check(b"\x80\x04\x8e\x01\x00\x00\x00\x00\x00\x00\x00q.", T::Bytes(b"q".to_vec()));
    check(b"\x80\x05\x96\x02\x00\x00\x00\x00\x00\x00\x00ab.", T::Bytes(b"ab".to_vec()));
    // READONLY_BUFFER is a no-op on in-band data.
    check(b"\x80\x05C\x01z\x98.", T::Bytes(b"z".to_vec()));
}

// ------------------------------------------------------------------------------------------
// Containers

#[test]
fn lists() {
    check(b"\x80\x02].", T::List(vec![]));
    check(b"\x80\x02]K\x01a.", T::List(vec![T::Int(1)]));
    check(b"\x80\x02](K\x01K\x02e.", T::List(vec![T::Int(1), T::Int(2)]));
    check(b"(K\x01K\x02l.", T::List(vec![T::Int(1), T::Int(2)]));
    // Protocol 0: MARK LIST then one APPEND per item.
    check(b"(lp0\nI1\naI2\na.", T::List(vec![T::Int(1), T::Int(2)]));
}

#[test]
fn tuples() {
    check(b"\x80\x02).", T::Tuple(vec![]));
    check(b"\x80\x02K\x01\x85.", T::Tuple(vec![T::Int(1)]));
    check(b"\x80\x02K\x01K\x02\x86.", T::Tuple(vec![T::Int(1), T::Int(2)]));
    check(b"\x80\x02K\x01K\x02K\x03\x87.", T::Tuple(vec![T::Int(1), T::Int(2), T::Int(3)]));
    check(b"(K\x01K\x02K\x03K\x04t.", T::Tuple((1..=4).map(T::Int).collect()));
    assert_eq!(err(b"\x80\x02K\x01\x86.").kind, ErrorKind::StackUnderflow);
}

#[test]
fn dicts() {
    check(b"\x80\x02}.", T::Dict(vec![]));
    check(b"\x80\x04}\x8c\x01aK\x01s.", T::Dict(vec![(s("a"), T::Int(1))]));
    check(b"\x80\x04}(\x8c\x01aK\x01\x8c\x01bK\x02u.", T::Dict(vec![(s("a"), T::Int(1)), (s("b"), T::Int(2))]));
    check(b"(Vk\nI5\nd.", T::Dict(vec![(s("k"), T::Int(5))]));
    // The C++ pickler writes empty dicts as EMPTY_DICT MARK SETITEMS.
    check(b"\x80\x02}(u.", T::Dict(vec![]));
    assert_eq!(err(b"\x80\x02}(K\x01u.").kind, ErrorKind::OddSetItems);
    // Last key wins on lookup, as in Python.
    let p = parse_simple(b"\x80\x04}(\x8c\x01aK\x01\x8c\x01aK\x02u.").unwrap();
    let Value::Dict(d) = p.root else { panic!() };
    assert_eq!(p.heap.dict_get(d, "a"), Some(Value::Int(2)));
}

#[test]
fn sets() {
    check(b"\x80\x04\x8f(K\x01K\x02\x90.", T::Set(vec![T::Int(1), T::Int(2)]));
    check(b"\x80\x04(K\x03\x91.", T::Set(vec![T::Int(3)]));
    assert!(matches!(err(b"\x80\x04](K\x01\x90.").kind, ErrorKind::WrongType { expected: "set", .. }));
}

#[test]
fn appending_to_a_non_list_is_an_error() {
    let e = err(b"\x80\x02K\x01K\x02a.");
    assert_eq!(e.kind, ErrorKind::WrongType { expected: "list", found: "int" });
    assert_eq!(e.offset, 6);
    let e = err(b"\x80\x02]K\x01K\x02s.");
    assert_eq!(e.kind, ErrorKind::WrongType { expected: "dict", found: "list" });
}

// ------------------------------------------------------------------------------------------
// Memo

#[test]
fn memo_put_and_get_all_widths() {
    let two = |x: T| T::List(vec![x.clone(), x]);
    check(b"\x80\x02]\x8c\x01xq\x05ah\x05a.", two(s("x")));
    check(b"\x80\x02]\x8c\x01xr\x00\x01\x00\x00aj\x00\x01\x00\x00a.", two(s("x")));
    check(b"(lp0\nVx\np1\nag1\na.", two(s("x")));
    check(b"\x80\x04]\x94\x8c\x01x\x94ah\x01a.", two(s("x")));
    // Scalars can be memoized too.
    check(b"\x80\x02]K\x07q\x00ah\x00a.", two(T::Int(7)));
}

#[test]
fn memoized_objects_are_shared_not_copied() {
    // outer = [inner, inner]; inner = ["frame"]: one heap list for `inner`, referenced twice.
    let b = b"\x80\x04]\x94(]\x94\x8c\x05frame\x94ah\x01e.";
    let p = parse_simple(b).unwrap();
    assert_eq!(p.heap.lists.len(), 2, "outer and inner, nothing copied");
    let (a, c) = (p.heap.seq_get(p.root, 0).unwrap(), p.heap.seq_get(p.root, 1).unwrap());
    assert_eq!(a, c, "both elements are the same object");
    assert!(matches!(a, Value::List(_)));
    assert_eq!(p.stats.memoize, 3);
}

#[test]
fn memo_bomb_stays_a_dag() {
    // L0 = [], L(k+1) = [Lk, Lk] for 40 levels: 2^40 leaves if expanded.
    let mut b = b"\x80\x04]\x94".to_vec();
    for k in 0..40u8 {
        b.extend_from_slice(&[b'0', b']', 0x94, b'(', b'h', k, b'h', k, b'e']);
    }
    b.push(b'.');
    let p = parse_simple(&b).unwrap();
    assert_eq!(p.heap.lists.len(), 41);
    let mut v = p.root;
    for _ in 0..40 {
        assert_eq!(p.heap.seq_len(v), Some(2));
        v = p.heap.seq_get(v, 0).unwrap();
    }
    assert_eq!(p.heap.seq_len(v), Some(0));
}

#[test]
fn memo_errors() {
    assert_eq!(err(b"\x80\x02h\x03.").kind, ErrorKind::BadMemoKey(3));
    assert_eq!(err(b"\x80\x02j\x00\x00\x00\x40.").kind, ErrorKind::BadMemoKey(1 << 30));
    assert_eq!(err(b"\x80\x02Nr\xff\xff\xff\xff.").kind, ErrorKind::BadMemoKey(u32::MAX as u64));
    assert_eq!(err(b"g7\n.").kind, ErrorKind::BadMemoKey(7));
    assert_eq!(err(b"Np-1\n.").kind, ErrorKind::BadText("PUT"));
    // A sparse index is accepted (kept in a map, not an allocation of that size).
    check(b"\x80\x02Nr\x00\x00\x00\x10j\x00\x00\x00\x10.", T::None);
}

#[test]
fn sparse_memo_is_bounded() {
    // ... but there is a cap on sparse entries.
    let limits = Limits { max_sparse_memo: 2, ..Limits::default() };
    let ok = b"\x80\x02Nr\x00\x00\x00\x10r\x00\x00\x00\x20j\x00\x00\x00\x20.";
    assert_eq!(parse(ok, &mut NoCompaction, &limits, None).unwrap().root, Value::None);
    let bad = b"\x80\x02Nr\x00\x00\x00\x10r\x00\x00\x00\x20r\x00\x00\x00\x30.";
    let e = parse(bad, &mut NoCompaction, &limits, None).unwrap_err();
    assert_eq!(e.kind, ErrorKind::LimitExceeded("sparse memo entries"));
    assert_eq!(e.offset, 13);
}

// ------------------------------------------------------------------------------------------
// Refusals

#[test]
fn forbidden_opcodes_are_refused_by_name() {
    let cases: &[(&[u8], &str)] = &[
        (b"cos\nsystem\n(S'echo hi'\ntR.", "GLOBAL"),
        (b"\x80\x04\x8c\x02os\x8c\x06system\x93.", "STACK_GLOBAL"),
        (b"\x80\x02N)R.", "REDUCE"),
        (b"\x80\x02}Nb.", "BUILD"),
        (b"(S'x'\nios\nsystem\n.", "INST"),
        (b"\x80\x02(No.", "OBJ"),
        (b"\x80\x02N)\x81.", "NEWOBJ"),
        (b"\x80\x04N)}\x92.", "NEWOBJ_EX"),
        (b"Pid\n.", "PERSID"),
        (b"\x80\x02NQ.", "BINPERSID"),
        (b"\x80\x02\x82\x01.", "EXT1"),
        (b"\x80\x02\x83\x01\x00.", "EXT2"),
        (b"\x80\x02\x84\x01\x00\x00\x00.", "EXT4"),
        (b"\x80\x05\x97.", "NEXT_BUFFER"),
    ];
    for &(bytes, name) in cases {
        let e = err(bytes);
        assert_eq!(e.kind, ErrorKind::Forbidden(name), "{bytes:?}");
        let op = e.opcode.unwrap();
        assert_eq!(bytes[e.offset], op, "the offset points at the opcode");
        assert_eq!(memsnap_pickle::opcode_name(op), name);
        let msg = e.to_string();
        assert!(msg.contains(name) && msg.contains(&format!("at byte {}", e.offset)), "{msg}");
    }
}

#[test]
fn unknown_opcodes_and_protocols() {
    let e = err(b"\x80\x02\xff.");
    assert_eq!((e.kind, e.offset, e.opcode), (ErrorKind::UnknownOpcode, 2, Some(0xff)));
    assert_eq!(err(b"\x80\x06N.").kind, ErrorKind::UnsupportedProtocol(6));
    assert_eq!(err(b"{\"a\": 1}").kind, ErrorKind::UnknownOpcode);
}

// ------------------------------------------------------------------------------------------
// Malformed input and limits

#[test]
fn truncation_is_located() {
    let e = err(b"\x80\x02X\x10\x00\x00\x00abc");
    assert_eq!(e.kind, ErrorKind::Truncated { needed: 16, available: 3 });
    assert_eq!((e.offset, e.opcode), (2, Some(b'X')));
    assert!(e.to_string().starts_with("pickle error at byte 2 (opcode BINUNICODE 0x58): truncated"), "{e}");
    let e = err(b"\x80\x02N");
    assert_eq!((e.kind, e.offset, e.opcode), (ErrorKind::MissingStop, 3, None));
    assert_eq!(err(b"").kind, ErrorKind::MissingStop);
    // Lengths far beyond the input fail before anything is allocated.
    let e = err(b"\x80\x04\x8d\x00\x00\x00\x00\x00\x00\x00\x40xx.");
    assert_eq!(e.kind, ErrorKind::Truncated { needed: 1 << 62, available: 3 });
    let e = err(b"\x80\x04\x95\xff\xff\xff\xff\xff\xff\xff\xffN.");
    assert_eq!(e.kind, ErrorKind::Truncated { needed: u64::MAX, available: 2 });
    assert_eq!(err(b"\x80\x02T\xff\xff\xff\xff.").kind, ErrorKind::NegativeLength(-1));
    assert_eq!(err(b"\x80\x02\x8b\xfe\xff\xff\xff.").kind, ErrorKind::NegativeLength(-2));
}

#[test]
fn stack_and_mark_errors() {
    assert_eq!(err(b"\x80\x02.").kind, ErrorKind::StackUnderflow);
    assert_eq!(err(b"\x80\x02e.").kind, ErrorKind::NoMark);
    assert_eq!(err(b"\x80\x02t.").kind, ErrorKind::NoMark);
    // Items below a MARK cannot be taken by an opcode above it.
    assert_eq!(err(b"\x80\x02]K\x01(a.").kind, ErrorKind::StackUnderflow);
    assert_eq!(err(b"\x80\x02K\x01(.").kind, ErrorKind::StackUnderflow);
}

#[test]
fn nesting_depth_is_capped() {
    let mut b = b"\x80\x02".to_vec();
    b.extend(std::iter::repeat_n(b'(', 200_000));
    b.push(b'.');
    let e = err(&b);
    assert_eq!(e.kind, ErrorKind::TooDeep(10_000));
    assert_eq!(e.offset, 2 + 10_000);
    let limits = Limits { max_marks: 3, ..Limits::default() };
    let e = parse(b"\x80\x02((((N.", &mut NoCompaction, &limits, None).unwrap_err();
    assert_eq!((e.kind, e.offset), (ErrorKind::TooDeep(3), 5));
}

#[test]
fn deep_nesting_without_marks_is_fine() {
    // 200k nested lists built with EMPTY_LIST/APPEND: no recursion anywhere, even when dropped.
    let n = 200_000;
    let mut b = b"\x80\x02".to_vec();
    b.extend(std::iter::repeat_n(b']', n + 1));
    b.extend(std::iter::repeat_n(b'a', n));
    b.push(b'.');
    let p = parse_simple(&b).unwrap();
    let mut v = p.root;
    let mut depth = 0;
    while let Some(1) = p.heap.seq_len(v) {
        v = p.heap.seq_get(v, 0).unwrap();
        depth += 1;
    }
    assert_eq!(depth, n);
}

#[test]
fn progress_is_reported() {
    let mut b = b"\x80\x02]".to_vec();
    for _ in 0..1000 {
        b.extend_from_slice(b"K\x01a");
    }
    b.push(b'.');
    let mut seen = Vec::new();
    let mut cb = |off: usize| seen.push(off);
    let progress = memsnap_pickle::Progress { every: 1000, callback: &mut cb };
    let p = parse(&b, &mut NoCompaction, &Limits::default(), Some(progress)).unwrap();
    assert_eq!(p.heap.seq_len(p.root), Some(1000));
    assert!(seen.len() >= 3, "{seen:?}");
    assert_eq!(*seen.last().unwrap(), b.len(), "the last call is at STOP");
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "{seen:?}");
}

#[test]
fn list_store_reads() {
    let p = parse_simple(b"\x80\x02](K\x01K\x02e.").unwrap();
    let Value::List(id) = p.root else { panic!() };
    match p.heap.list(id) {
        ListStore::Values(v) => assert_eq!(v.len(), 2),
        other => panic!("{other:?}"),
    }
    assert!(p.heap.list(id).get(2).is_none());
}
