//! The memo's dense part: one 4-byte handle per index, most of them stored in 2 bytes.
//!
//! A snapshot memoizes every dict, list and string it writes: the 87 MB bench file holds 2.7
//! million memo entries, 11 MB as plain `u32`s, a third of what `summary` needs at its peak.
//! Few of them are ever fetched again, but which ones is known only at the end, so every entry
//! is kept. They are alike, though: a page of [`PAGE`] consecutive entries holds a trace
//! entry's record (ids counting up by one), its `'N/A'` string (one id per chunk) and its
//! `frames` list (a stack token among a few thousand). So a full page is stored as one base
//! index per handle kind and, per entry, its kind and the distance from that base in 16 bits
//! ([`PackedPage`]), when every distance fits; else as it was. Writes to a packed page that do
//! not fit turn it back into plain handles.

/// Entries per page.
const PAGE: usize = 256;
/// Bits of a packed entry's distance from its kind's base; the 3 above hold the kind.
const DELTA_BITS: u32 = 13;
/// Handle layout (see `vm.rs`): the kind in the top 3 bits, an index in the other 29.
const KIND_SHIFT: u32 = 29;
const INDEX_MASK: u32 = (1 << KIND_SHIFT) - 1;

/// The dense memo: a handle per index from 0 to [`Memo::len`]. Pages live in two vectors, not
/// in boxes of their own: a snapshot's memo is tens of thousands of pages, and boxes that small
/// come from the allocator's heap, which keeps them resident after the memo is dropped (64 MB
/// more at `analyze`'s peak on the 1.07 GB bench file), where a large vector goes back to the
/// system.
#[derive(Default)]
pub(crate) struct Memo {
    /// Per full page: its index in `packed`, or in `plain` with [`PLAIN`] set.
    pages: Vec<u32>,
    packed: Vec<PackedPage>,
    plain: Vec<[u32; PAGE]>,
    /// The last page, not yet full.
    tail: Vec<u32>,
}

/// In [`Memo::pages`]: the page is in `plain`.
const PLAIN: u32 = 1 << 31;

/// A page whose entries each lie within 2^13 of the smallest index of their kind in the page.
struct PackedPage {
    base: [u32; 8],
    /// `kind << DELTA_BITS | (index - base[kind])`.
    codes: [u16; PAGE],
}

impl PackedPage {
    fn pack(handles: &[u32; PAGE]) -> Option<PackedPage> {
        let mut base = [u32::MAX; 8];
        for &h in handles {
            let kind = (h >> KIND_SHIFT) as usize;
            base[kind] = base[kind].min(h & INDEX_MASK);
        }
        let mut codes = [0u16; PAGE];
        for (c, &h) in codes.iter_mut().zip(handles) {
            *c = code(&base, h)?;
        }
        Some(PackedPage { base, codes })
    }

    #[inline]
    fn get(&self, i: usize) -> u32 {
        let c = self.codes[i] as u32;
        let kind = c >> DELTA_BITS;
        (kind << KIND_SHIFT) | (self.base[kind as usize] + (c & ((1 << DELTA_BITS) - 1)))
    }

    fn unpack(&self) -> [u32; PAGE] {
        let mut plain = [0u32; PAGE];
        for (i, h) in plain.iter_mut().enumerate() {
            *h = self.get(i);
        }
        plain
    }
}

/// Handle `h` as a packed entry over `base`, if its distance fits.
#[inline]
fn code(base: &[u32; 8], h: u32) -> Option<u16> {
    let kind = h >> KIND_SHIFT;
    let delta = (h & INDEX_MASK).checked_sub(base[kind as usize])?;
    (delta < 1 << DELTA_BITS).then_some(((kind << DELTA_BITS) | delta) as u16)
}

impl Memo {
    pub(crate) fn len(&self) -> usize {
        self.pages.len() * PAGE + self.tail.len()
    }

    #[inline]
    pub(crate) fn get(&self, idx: usize) -> Option<u32> {
        let (p, i) = (idx / PAGE, idx % PAGE);
        match self.pages.get(p) {
            Some(&at) if at & PLAIN != 0 => Some(self.plain[(at & !PLAIN) as usize][i]),
            Some(&at) => Some(self.packed[at as usize].get(i)),
            None if p == self.pages.len() => self.tail.get(i).copied(),
            None => None,
        }
    }

    /// Set entry `idx`; `false` when there is none.
    pub(crate) fn set(&mut self, idx: usize, h: u32) -> bool {
        let (p, i) = (idx / PAGE, idx % PAGE);
        let Some(&at) = self.pages.get(p) else {
            return match self.tail.get_mut(i).filter(|_| p == self.pages.len()) {
                Some(slot) => {
                    *slot = h;
                    true
                }
                None => false,
            };
        };
        if at & PLAIN != 0 {
            self.plain[(at & !PLAIN) as usize][i] = h;
            return true;
        }
        let pp = &mut self.packed[at as usize];
        match code(&pp.base, h) {
            Some(c) => pp.codes[i] = c,
            None => {
                // The packed page stays behind unused: such writes are rare (a record put in
                // place of a dict the VM memoized).
                let mut handles = pp.unpack();
                handles[i] = h;
                self.pages[p] = self.plain.len() as u32 | PLAIN;
                self.plain.push(handles);
            }
        }
        true
    }

    #[inline]
    pub(crate) fn push(&mut self, h: u32) {
        if self.tail.capacity() == 0 {
            self.tail.reserve_exact(PAGE);
        }
        self.tail.push(h);
        if self.tail.len() == PAGE {
            let handles: &[u32; PAGE] = self.tail[..].try_into().expect("a full page");
            let at = match PackedPage::pack(handles) {
                Some(pp) => {
                    self.packed.push(pp);
                    self.packed.len() - 1
                }
                None => {
                    self.plain.push(*handles);
                    (self.plain.len() - 1) | PLAIN as usize
                }
            };
            self.pages.push(at as u32);
            self.tail.clear();
        }
    }

    /// Room for `n` more entries.
    pub(crate) fn reserve(&mut self, n: usize) {
        self.pages.reserve(n / PAGE + 1);
        self.packed.reserve(n / PAGE + 1);
    }

    /// Whether full page `p` is stored packed.
    #[cfg(test)]
    fn is_packed(&self, p: usize) -> bool {
        self.pages[p] & PLAIN == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn handle(kind: u32, index: u32) -> u32 {
        (kind << KIND_SHIFT) | index
    }

    /// A page of a trace's shape packs; every entry reads back.
    #[test]
    fn trace_pages_pack_and_read_back() {
        let mut memo = Memo::default();
        let mut want = Vec::new();
        for e in 0..1000u32 {
            for h in [handle(5, 70_000 + e), handle(0, 12), handle(7, (e * 37) % 5000)] {
                memo.push(h);
                want.push(h);
            }
        }
        assert!((0..memo.pages.len()).all(|p| memo.is_packed(p)));
        assert_eq!(memo.len(), want.len());
        for (i, &h) in want.iter().enumerate() {
            assert_eq!(memo.get(i), Some(h), "entry {i}");
        }
        assert_eq!(memo.get(want.len()), None);
    }

    /// A write that does not fit a packed page makes it plain, and the page keeps its other
    /// entries; the empty marker (`u32::MAX`) beside small lazy-list tokens does not pack.
    #[test]
    fn writes_that_do_not_fit_unpack_the_page() {
        let mut memo = Memo::default();
        for i in 0..PAGE as u32 * 2 {
            memo.push(handle(3, i));
        }
        assert!(memo.set(5, handle(3, 1 << 20)));
        assert!(!memo.is_packed(0));
        assert!(memo.is_packed(1));
        assert_eq!(memo.get(5), Some(handle(3, 1 << 20)));
        assert_eq!(memo.get(6), Some(handle(3, 6)));
        assert!(memo.set(PAGE + 1, handle(3, PAGE as u32 + 9)));
        assert!(memo.is_packed(1));
        assert_eq!(memo.get(PAGE + 1), Some(handle(3, PAGE as u32 + 9)));
        assert!(!memo.set(PAGE * 2, 0));

        let mut memo = Memo::default();
        for i in 0..PAGE as u32 {
            memo.push(if i == 7 { u32::MAX } else { handle(7, i) });
        }
        assert!(!memo.is_packed(0));
        assert_eq!(memo.get(7), Some(u32::MAX));
    }

    proptest! {
        /// Against a plain vector: any pushes and writes read back the same.
        #[test]
        fn behaves_as_a_vector(
            pushes in prop::collection::vec((0u32..8, 0u32..20_000), 0..1200),
            writes in prop::collection::vec((0usize..1300, 0u32..8, 0u32..INDEX_MASK), 0..40),
        ) {
            let mut memo = Memo::default();
            let mut plain = Vec::new();
            for &(k, i) in &pushes {
                memo.push(handle(k, i));
                plain.push(handle(k, i));
            }
            for &(at, k, i) in &writes {
                let exists = at < plain.len();
                prop_assert_eq!(memo.set(at, handle(k, i)), exists);
                if exists {
                    plain[at] = handle(k, i);
                }
            }
            prop_assert_eq!(memo.len(), plain.len());
            for i in 0..plain.len() + 2 {
                prop_assert_eq!(memo.get(i), plain.get(i).copied());
            }
        }
    }
}
