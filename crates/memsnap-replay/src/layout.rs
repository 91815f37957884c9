//! The blocks of one segment (or one expandable segment's mapped ranges), as the allocator
//! keeps them: a list of physically adjacent blocks, found by start address.
//!
//! Links join only blocks that touch, so a list is one contiguous run of memory; an expandable
//! segment with unmapped holes holds several runs. Lookups go through a hash map keyed by the
//! block's start address, which is what every trace event names, so an event costs O(1).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Block addresses are 512-byte aligned; a multiply-fold hash spreads them well and is several
/// times faster than SipHash on the replay's hot path.
#[derive(Default, Clone, Copy)]
pub(crate) struct AddrHasher(u64);

impl Hasher for AddrHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0 ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
    fn finish(&self) -> u64 {
        // Fold the well-mixed high half into the low bits that pick the bucket.
        self.0 ^ (self.0 >> 32)
    }
}

pub(crate) type AddrMap<V> = HashMap<u64, V, BuildHasherDefault<AddrHasher>>;

const NIL: u32 = u32::MAX;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum State {
    Free,
    Allocated,
    Pending,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct Node {
    pub addr: u64,
    pub size: u64,
    pub state: State,
    /// Index of the block's lifetime record in the unit's list (meaningless when free).
    pub lifetime: u32,
    prev: u32,
    next: u32,
}

impl Node {
    fn end(&self) -> u64 {
        self.addr + self.size
    }
}

#[derive(Default)]
pub(crate) struct Layout {
    nodes: Vec<Node>,
    /// Slots of `nodes` that hold no block.
    vacant: Vec<u32>,
    by_addr: AddrMap<u32>,
    /// Start address of the block [`Layout::push`] added last.
    last_pushed_addr: u64,
}

impl Layout {
    pub fn get(&self, addr: u64) -> Option<&Node> {
        self.by_addr.get(&addr).map(|&i| &self.nodes[i as usize])
    }

    /// Live blocks sorted by address.
    pub fn blocks(&self) -> Vec<Node> {
        let mut out: Vec<Node> = self.by_addr.values().map(|&i| self.nodes[i as usize]).collect();
        out.sort_unstable_by_key(|n| n.addr);
        out
    }

    /// Append a block to the run of the previously pushed block when it ends at `addr`, or
    /// start a new run. Lays out the start state, in address order; does not merge.
    pub fn push(&mut self, addr: u64, size: u64, state: State, lifetime: u32) {
        let prev = match self.by_addr.get(&self.last_pushed_addr) {
            Some(&p) if self.nodes[p as usize].end() == addr => p,
            _ => NIL,
        };
        let i = self.insert(Node { addr, size, state, lifetime, prev, next: NIL });
        if prev != NIL {
            self.nodes[prev as usize].next = i;
        }
        self.last_pushed_addr = addr;
    }

    /// Allocate at `addr`, where a free block must start. The block is split when the rules
    /// say so, otherwise handed out whole. Returns the block's size, or `None` when no free
    /// block starts at `addr`.
    pub fn allocate(&mut self, addr: u64, rounded: u64, lifetime: u32, split: impl FnOnce(u64) -> bool) -> Option<u64> {
        let i = *self.by_addr.get(&addr)?;
        let node = self.nodes[i as usize];
        if node.state != State::Free || node.size < rounded {
            return None;
        }
        if split(node.size) {
            let rest = Node {
                addr: addr + rounded,
                size: node.size - rounded,
                state: State::Free,
                lifetime: 0,
                prev: i,
                next: node.next,
            };
            let r = self.insert(rest);
            if node.next != NIL {
                self.nodes[node.next as usize].prev = r;
            }
            let n = &mut self.nodes[i as usize];
            n.next = r;
            n.size = rounded;
        }
        let n = &mut self.nodes[i as usize];
        n.state = State::Allocated;
        n.lifetime = lifetime;
        Some(n.size)
    }

    /// Make the free block that contains `addr` start there, by splitting off the part before
    /// it. Only for recovering from a trace the rules cannot explain.
    pub fn split_free_at(&mut self, addr: u64) -> bool {
        let Some(i) = self.find_containing(addr) else { return false };
        let node = self.nodes[i as usize];
        if node.state != State::Free || node.addr == addr {
            return node.state == State::Free;
        }
        let tail = Node { addr, size: node.end() - addr, state: State::Free, lifetime: 0, prev: i, next: node.next };
        let t = self.insert(tail);
        if node.next != NIL {
            self.nodes[node.next as usize].prev = t;
        }
        let n = &mut self.nodes[i as usize];
        n.next = t;
        n.size = addr - node.addr;
        true
    }

    /// Set the state of the block that starts at `addr`.
    pub fn set_state(&mut self, addr: u64, state: State) {
        if let Some(&i) = self.by_addr.get(&addr) {
            self.nodes[i as usize].state = state;
        }
    }

    /// Free the block at `addr` and merge it with free neighbours, as `free_block` does.
    pub fn release(&mut self, addr: u64) {
        let Some(&i) = self.by_addr.get(&addr) else { return };
        self.nodes[i as usize].state = State::Free;
        self.merge_around(i);
    }

    /// Add reserved memory as one free block, merged with touching free blocks (a new segment,
    /// or a `segment_map` next to mapped memory). Returns false if it overlaps a block.
    pub fn add_free(&mut self, addr: u64, size: u64) -> bool {
        if self.overlaps(addr, addr + size) {
            return false;
        }
        let prev = self.find_ending_at(addr);
        let next = self.by_addr.get(&(addr + size)).copied().unwrap_or(NIL);
        let i = self.insert(Node { addr, size, state: State::Free, lifetime: 0, prev, next });
        if prev != NIL {
            self.nodes[prev as usize].next = i;
        }
        if next != NIL {
            self.nodes[next as usize].prev = i;
        }
        self.merge_around(i);
        true
    }

    /// Remove `[addr, addr + size)` from the free block that holds it (`segment_free`,
    /// `segment_unmap`); what is left on either side stays free, and nothing links across the
    /// hole. Returns false, changing nothing, when the range is not inside one free block.
    pub fn remove_free(&mut self, addr: u64, size: u64) -> bool {
        let Some(i) = self.find_containing(addr) else { return false };
        let node = self.nodes[i as usize];
        let end = addr + size;
        if node.state != State::Free || node.end() < end {
            return false;
        }
        self.remove(i);
        let before = if node.addr < addr {
            self.insert(Node {
                addr: node.addr,
                size: addr - node.addr,
                state: State::Free,
                lifetime: 0,
                prev: node.prev,
                next: NIL,
            })
        } else {
            NIL
        };
        if node.prev != NIL {
            self.nodes[node.prev as usize].next = before;
        }
        let after = if end < node.end() {
            self.insert(Node {
                addr: end,
                size: node.end() - end,
                state: State::Free,
                lifetime: 0,
                prev: NIL,
                next: node.next,
            })
        } else {
            NIL
        };
        if node.next != NIL {
            self.nodes[node.next as usize].prev = after;
        }
        true
    }

    /// Drop every block in `[start, end)` (a segment freed although blocks remained in it).
    pub fn clear_range(&mut self, start: u64, end: u64) {
        let doomed: Vec<u32> =
            self.by_addr.values().copied().filter(|&i| (start..end).contains(&self.nodes[i as usize].addr)).collect();
        for i in doomed {
            let n = self.nodes[i as usize];
            if n.prev != NIL {
                self.nodes[n.prev as usize].next = NIL;
            }
            if n.next != NIL {
                self.nodes[n.next as usize].prev = NIL;
            }
            self.remove(i);
        }
    }

    fn merge_around(&mut self, mut i: u32) {
        let prev = self.nodes[i as usize].prev;
        if prev != NIL && self.nodes[prev as usize].state == State::Free {
            self.absorb_next(prev);
            i = prev;
        }
        let next = self.nodes[i as usize].next;
        if next != NIL && self.nodes[next as usize].state == State::Free {
            self.absorb_next(i);
        }
    }

    /// Merge the block after `i` into `i`.
    fn absorb_next(&mut self, i: u32) {
        let j = self.nodes[i as usize].next;
        let nj = self.nodes[j as usize];
        let ni = &mut self.nodes[i as usize];
        ni.size += nj.size;
        ni.next = nj.next;
        if nj.next != NIL {
            self.nodes[nj.next as usize].prev = i;
        }
        self.remove(j);
    }

    fn insert(&mut self, node: Node) -> u32 {
        let i = match self.vacant.pop() {
            Some(i) => {
                self.nodes[i as usize] = node;
                i
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        };
        self.by_addr.insert(node.addr, i);
        i
    }

    fn remove(&mut self, i: u32) {
        self.by_addr.remove(&self.nodes[i as usize].addr);
        self.vacant.push(i);
    }

    /// The block that ends exactly at `addr`. Linear, but only segment-level events (rare)
    /// and the start layout need it.
    fn find_ending_at(&self, addr: u64) -> u32 {
        self.by_addr.values().copied().find(|&i| self.nodes[i as usize].end() == addr).unwrap_or(NIL)
    }

    /// The block that contains `addr`. Linear; only for rare events and recovery.
    fn find_containing(&self, addr: u64) -> Option<u32> {
        if let Some(&i) = self.by_addr.get(&addr) {
            return Some(i);
        }
        self.by_addr.values().copied().find(|&i| {
            let n = &self.nodes[i as usize];
            n.addr <= addr && addr < n.end()
        })
    }

    fn overlaps(&self, start: u64, end: u64) -> bool {
        self.by_addr.values().any(|&i| {
            let n = &self.nodes[i as usize];
            n.addr < end && start < n.end()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(l: &Layout) -> Vec<(u64, u64, State)> {
        l.blocks().iter().map(|n| (n.addr, n.size, n.state)).collect()
    }

    #[test]
    fn split_merge_and_unmap() {
        let mut l = Layout::default();
        assert!(l.add_free(0, 4096));
        assert_eq!(l.allocate(0, 1024, 0, |_| true), Some(1024));
        assert_eq!(l.allocate(1024, 1024, 1, |_| false), Some(3072));
        l.release(0);
        assert_eq!(shape(&l), vec![(0, 1024, State::Free), (1024, 3072, State::Allocated)]);
        l.release(1024);
        assert_eq!(shape(&l), vec![(0, 4096, State::Free)]);
        // Map more memory next to it: merges.
        assert!(l.add_free(4096, 4096));
        assert_eq!(shape(&l), vec![(0, 8192, State::Free)]);
        // Unmap the middle: two free runs remain, and they no longer link.
        assert!(l.remove_free(2048, 2048));
        assert_eq!(shape(&l), vec![(0, 2048, State::Free), (4096, 4096, State::Free)]);
        assert!(l.add_free(2048, 2048));
        assert_eq!(shape(&l), vec![(0, 8192, State::Free)]);
        assert!(!l.add_free(100, 10));
    }
}
