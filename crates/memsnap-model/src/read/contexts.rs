//! Interning the trace entries' streams and labels ([`EventContext`]) into the ids that
//! [`TraceEvent`] stores. A file holds few distinct ones, and consecutive entries mostly share
//! one, so the last one is checked before the index.
//!
//! The sequential reader interns into the builder's table directly. The parallel reader's
//! chunks each intern into a table of their own while they convert in parallel; the merge then
//! maps each chunk's ids onto the builder's ([`Contexts::absorb`]), in chunk order, so the ids
//! are the same as the sequential reader gives.

use rustc_hash::FxHashMap;

use crate::types::{ContextId, EventContext, TraceEvent};

pub(crate) struct Contexts {
    /// By id; index 0 is the default context.
    table: Vec<EventContext>,
    index: FxHashMap<EventContext, u32>,
    last: (EventContext, u32),
}

impl Default for Contexts {
    fn default() -> Contexts {
        let mut index = FxHashMap::default();
        index.insert(EventContext::default(), 0);
        Contexts { table: vec![EventContext::default()], index, last: (EventContext::default(), 0) }
    }
}

impl Contexts {
    /// What a file with too many contexts is told it should have had.
    pub const LIMIT_TEXT: &'static str = "at most 2^28 distinct (stream, compile_context, user_metadata) values";

    /// The id of `c`, new ones numbered in order; `None` once [`ContextId::LIMIT`] are taken.
    #[inline]
    pub fn intern(&mut self, c: EventContext) -> Option<ContextId> {
        if c == self.last.0 {
            return Some(ContextId(self.last.1));
        }
        let id = match self.index.get(&c) {
            Some(&id) => id,
            None => {
                let id = self.table.len() as u32;
                if id >= ContextId::LIMIT {
                    return None;
                }
                self.table.push(c);
                self.index.insert(c, id);
                id
            }
        };
        self.last = (c, id);
        Some(ContextId(id))
    }

    /// Intern every context of `chunk` (another table) here and rewrite `events`, which refer to
    /// `chunk`'s ids, to this table's. `None` once [`ContextId::LIMIT`] are taken.
    pub fn absorb(&mut self, chunk: &Contexts, events: &mut [TraceEvent]) -> Option<()> {
        let ids: Vec<ContextId> = chunk.table.iter().map(|&c| self.intern(c)).collect::<Option<_>>()?;
        if ids.iter().enumerate().all(|(local, id)| id.0 as usize == local) {
            return Some(());
        }
        for e in events {
            e.set_context(ids[e.context().0 as usize]);
        }
        Some(())
    }

    /// Empty again (for a chunk table reused from window to window).
    pub fn clear(&mut self) {
        *self = Contexts::default();
    }

    /// Bytes held, for the reader's memory budget: the entry and its index slot.
    pub fn retained_bytes(&self) -> u64 {
        self.table.len() as u64 * 2 * std::mem::size_of::<EventContext>() as u64
    }

    pub fn into_table(self) -> Vec<EventContext> {
        self.table
    }
}
