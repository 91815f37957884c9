//! Opcode lengths without interpreting anything: what lets a reader find its way through a
//! chunk of a pickle it does not parse (to count `MEMOIZE`s, to find where a trace batch
//! starts) at a couple of nanoseconds per opcode.

/// `FRAME`: a protocol-4 length prefix; its bytes follow inline.
pub const FRAME: u8 = 0x95;
pub const MEMOIZE: u8 = 0x94;
pub const MARK: u8 = b'(';
pub const EMPTY_DICT: u8 = b'}';
pub const EMPTY_LIST: u8 = b']';
pub const APPEND: u8 = b'a';
pub const APPENDS: u8 = b'e';
pub const SETITEMS: u8 = b'u';
pub const BINGET: u8 = b'h';
pub const LONG_BINGET: u8 = b'j';

/// The length of the opcode at `data[pos]` with its argument, or `None` when it does not end
/// inside `data`, takes a text line (protocol 0 and 1 opcodes, which a framed pickle written by
/// Python never holds), or is not an opcode. `FRAME` counts as its 9-byte header.
#[inline]
pub fn op_len(data: &[u8], pos: usize) -> Option<usize> {
    let op = *data.get(pos)?;
    let fixed = |n: usize| (pos + n <= data.len()).then_some(n);
    let counted = |head: usize, width: usize| -> Option<usize> {
        let arg = data.get(pos + 1..pos + 1 + width)?;
        let mut b = [0u8; 8];
        b[..width].copy_from_slice(arg);
        let n = usize::try_from(u64::from_le_bytes(b)).ok()?;
        let total = head.checked_add(n)?;
        (pos.checked_add(total)? <= data.len()).then_some(total)
    };
    match op {
        // No argument.
        b'('
        | b')'
        | b']'
        | b'}'
        | b'.'
        | b'0'
        | b'1'
        | b'2'
        | b'N'
        | 0x88
        | 0x89
        | b'a'
        | b'e'
        | b'l'
        | b'd'
        | b't'
        | b's'
        | b'u'
        | 0x85..=0x87
        | 0x8f
        | 0x90
        | 0x91
        | 0x94
        | 0x98 => fixed(1),
        b'K' | b'h' | b'q' | 0x80 => fixed(2),
        b'M' => fixed(3),
        b'J' | b'j' | b'r' => fixed(5),
        b'G' | 0x95 => fixed(9),
        0x8a | 0x8c | b'C' | b'U' => counted(2, 1),
        0x8b => {
            // LONG4 has a signed length.
            let n = i32::from_le_bytes(data.get(pos + 1..pos + 5)?.try_into().ok()?);
            let total = 5usize.checked_add(usize::try_from(n).ok()?)?;
            (pos + total <= data.len()).then_some(total)
        }
        b'X' | b'B' | b'T' => counted(5, 4),
        0x8d | 0x8e | 0x96 => counted(9, 8),
        _ => None,
    }
}

/// Lengths of the opcodes whose length the opcode alone tells (0 for the others), the same as
/// [`op_len`]'s.
static FIXED_LEN: [u8; 256] = {
    let mut t = [0u8; 256];
    let one = b"()]}.012Naeldtsu";
    let mut i = 0;
    while i < one.len() {
        t[one[i] as usize] = 1;
        i += 1;
    }
    let more: [(u8, u8); 23] = [
        (0x88, 1),
        (0x89, 1),
        (0x85, 1),
        (0x86, 1),
        (0x87, 1),
        (0x8f, 1),
        (0x90, 1),
        (0x91, 1),
        (0x94, 1),
        (0x98, 1),
        (b'K', 2),
        (b'h', 2),
        (b'q', 2),
        (0x80, 2),
        (b'M', 3),
        (b'J', 5),
        (b'j', 5),
        (b'r', 5),
        (b'G', 9),
        (0x95, 9),
        (b'(', 1),
        (b')', 1),
        (b'e', 1),
    ];
    let mut i = 0;
    while i < more.len() {
        t[more[i].0 as usize] = more[i].1;
        i += 1;
    }
    t
};

/// [`op_len`], with the common fixed-length opcodes looked up in a table: the walk over a
/// window then waits on two loads per opcode instead of an indirect jump that mispredicts
/// whenever the opcodes vary.
#[inline(always)]
pub fn op_len_fast(data: &[u8], pos: usize) -> Option<usize> {
    let op = *data.get(pos)?;
    let n = FIXED_LEN[op as usize] as usize;
    if n != 0 {
        return (pos + n <= data.len()).then_some(n);
    }
    op_len(data, pos)
}

/// Opcodes, `MEMOIZE`s and `FRAME`s from `from` to `to`, walked opcode by opcode; `None` when
/// an opcode there has no known length or crosses `to`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub opcodes: u64,
    pub memoize: u64,
    pub frames: u64,
}

impl Counts {
    pub fn add(&mut self, o: Counts) {
        self.opcodes += o.opcodes;
        self.memoize += o.memoize;
        self.frames += o.frames;
    }

    /// Count one opcode.
    #[inline]
    pub fn count(&mut self, op: u8) {
        self.opcodes += 1;
        self.memoize += (op == MEMOIZE) as u64;
        self.frames += (op == FRAME) as u64;
    }
}

/// Walk `data[from..to]` opcode by opcode.
pub fn count(data: &[u8], from: usize, to: usize) -> Option<Counts> {
    let mut c = Counts::default();
    let mut pos = from;
    let data = data.get(..to)?;
    while pos < to {
        let n = op_len(data, pos)?;
        c.count(data[pos]);
        pos += n;
    }
    Some(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_cover_arguments() {
        let p = [0x80, 4, 0x95, 3, 0, 0, 0, 0, 0, 0, 0, 0x8c, 2, b'h', b'i', 0x94, b'.'];
        assert_eq!(op_len(&p, 0), Some(2));
        assert_eq!(op_len(&p, 2), Some(9));
        assert_eq!(op_len(&p, 11), Some(4));
        assert_eq!(count(&p, 0, p.len()), Some(Counts { opcodes: 5, memoize: 1, frames: 1 }));
        // A string that claims more than is there, a text opcode, an unknown byte.
        assert_eq!(op_len(&[0x8c, 9, b'a'], 0), None);
        assert_eq!(op_len(b"I12\n", 0), None);
        assert_eq!(op_len(&[0xff], 0), None);
        assert_eq!(op_len(&[0x8b, 0xff, 0xff, 0xff, 0xff], 0), None);
    }

    /// The table agrees with the match for every opcode byte, with room for any argument and
    /// without.
    #[test]
    fn fast_lengths_agree() {
        for op in 0..=255u8 {
            let mut long = vec![op, 3, 0, 0, 0, 0, 0, 0, 0];
            long.resize(64, 0);
            assert_eq!(op_len_fast(&long, 0), op_len(&long, 0), "opcode {op:#x}");
            assert_eq!(op_len_fast(&[op], 0), op_len(&[op], 0), "opcode {op:#x} alone");
        }
    }

    /// The walk agrees with the VM: on a pickle of many kinds of opcode, the opcodes, MEMOIZEs
    /// and FRAMEs counted by lengths alone equal the VM's own counts.
    #[test]
    fn counts_agree_with_the_vm() {
        let mut p = vec![0x80, 4, 0x95, 0, 0, 0, 0, 0, 0, 0, 0];
        p.extend_from_slice(&[b'(', b'K', 1, b'M', 2, 0, b'J', 3, 0, 0, 0, 0x8a, 2, 1, 2, b'G']);
        p.extend_from_slice(&[0; 8]);
        p.extend_from_slice(&[b'X', 1, 0, 0, 0, b'x', 0x94, b'C', 1, b'y', b'N', 0x88, b't', 0x94, b'h', 0, b'0']);
        p.push(b'.');
        let frame_len = (p.len() - 11) as u64;
        p[3..11].copy_from_slice(&frame_len.to_le_bytes());
        let parsed = crate::parse_simple(&p).unwrap();
        let c = count(&p, 0, p.len()).unwrap();
        assert_eq!(c.opcodes, parsed.stats.opcodes);
        assert_eq!(c.memoize, parsed.stats.memoize);
        assert_eq!(c.frames, parsed.stats.frames);
    }
}
