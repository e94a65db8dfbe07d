//! Offset translation: where each Raft entry of a partition lies in its Kafka log.
//!
//! A partition's Raft log *is* its Kafka log: every data entry is one record batch, stored
//! once, in the segment files consumers read. Raft-internal entries (the blank entry a new
//! leader commits, membership changes) take a Raft index but no Kafka offset, so Kafka offsets
//! stay dense and are never reused. A batch of `n` records takes one index and `n` offsets, so
//! the two numberings cannot be computed from each other; this map keeps the correspondence for
//! the entries Raft can still ask for, those above the *purge point* (everything at or below it
//! is committed, applied, and known to every replica openraft still replicates to from the log;
//! a replica further behind is sent the log itself, not entries).
//!
//! Every replica derives the same offsets: an entry's base offset is the Kafka offset after the
//! entry before it, and Raft's log-matching property makes the entries below any index identical
//! on every replica that has them. Followers therefore stamp the same `baseOffset` into the batch
//! the leader stamped, without it being sent.
//!
//! Side records (state a subsystem replicates through the partition's group, see
//! [`super::types::SideRecord`]) take an index and no offset, like internal entries.
//!
//! The map is sans-I/O. Its owner rebuilds it after a restart from the purge point, the log's
//! batch headers and the entries recorded beside the log, internal and side, each with its
//! index ([`EntryMap::rebuild`]).

use std::collections::VecDeque;

use strand_protocol::types::Offset;

use crate::Term;

/// One Raft entry above the purge point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    /// A record batch: Kafka offsets `base_offset .. base_offset + offset_count`.
    Data {
        term: Term,
        base_offset: Offset,
        offset_count: u32,
    },
    /// A Raft-internal entry; the Kafka offset it sits before is `offset_before`.
    Internal { term: Term, offset_before: Offset },
    /// A side record (kept beside the log); the Kafka offset it sits before is `offset_before`.
    Side { term: Term, offset_before: Offset },
}

/// What an entry that takes no Kafka offset is, as recorded beside the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Beside {
    Internal,
    Side,
}

impl Slot {
    pub fn term(&self) -> Term {
        match *self {
            Slot::Data { term, .. } | Slot::Internal { term, .. } | Slot::Side { term, .. } => term,
        }
    }

    /// The Kafka offset after this entry.
    pub fn next_offset(&self) -> Offset {
        match *self {
            Slot::Data {
                base_offset,
                offset_count,
                ..
            } => base_offset.plus(i64::from(offset_count)),
            Slot::Internal { offset_before, .. } | Slot::Side { offset_before, .. } => offset_before,
        }
    }
}

/// The last purged entry: `(term, index)` and the Kafka offset after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PurgePoint {
    pub term: Term,
    pub index: u64,
    pub next_offset: Offset,
}

/// The Raft index ↔ Kafka offset map of one partition replica.
#[derive(Debug, Clone)]
pub struct EntryMap {
    purged: Option<PurgePoint>,
    /// Index of `slots[0]`.
    first_index: u64,
    slots: VecDeque<Slot>,
    /// The Kafka offset after the last entry: the log end offset the entries imply.
    next_offset: Offset,
    /// Where the first entry above the purge point starts.
    start_offset: Offset,
}

impl EntryMap {
    /// An empty map whose first entry (index 0, openraft's first) will start at `start_offset`.
    pub fn new(start_offset: Offset) -> EntryMap {
        EntryMap {
            purged: None,
            first_index: 0,
            slots: VecDeque::new(),
            next_offset: start_offset,
            start_offset,
        }
    }

    /// A map whose entries up to `purged` are gone; the next entry is `purged.index + 1`.
    pub fn after_purge(purged: PurgePoint) -> EntryMap {
        EntryMap {
            purged: Some(purged),
            first_index: purged.index + 1,
            slots: VecDeque::new(),
            next_offset: purged.next_offset,
            start_offset: purged.next_offset,
        }
    }

    /// Rebuilds the map after a restart: from the purge point (or the log's start), each index
    /// is an entry recorded beside the log if `beside` (ascending `(index, term, kind)`) names
    /// it, else the next batch of `batches` (ascending `(term, base offset, offset count)` as the
    /// log's headers give them).
    ///
    /// Entries beside the log are made durable before anything appended after them, but the
    /// batches before one may have been lost with the rest of an unflushed tail: recorded
    /// entries beyond the recovered log's reach are dropped and their indexes returned, so the
    /// caller can forget them too (no append containing them was ever reported flushed). A gap
    /// in the batches' offsets means the log and its side records do not belong together, and
    /// fails.
    pub fn rebuild(
        purged: Option<PurgePoint>,
        start_offset: Offset,
        beside: impl IntoIterator<Item = (u64, Term, Beside)>,
        batches: impl IntoIterator<Item = (Term, Offset, u32)>,
    ) -> Result<(EntryMap, Vec<u64>), String> {
        let mut map = match purged {
            Some(p) => EntryMap::after_purge(p),
            None => EntryMap::new(start_offset),
        };
        let first_index = map.first_index;
        let mut internal = beside
            .into_iter()
            .filter(|(i, _, _)| *i >= first_index)
            .peekable();
        for (term, base_offset, count) in batches {
            if base_offset < map.next_offset {
                // Below the purge point: already covered.
                continue;
            }
            while let Some(&(index, iterm, kind)) = internal.peek() {
                if index != map.next_index() {
                    break;
                }
                map.push_beside(index, iterm, kind);
                internal.next();
            }
            if base_offset != map.next_offset {
                return Err(format!(
                    "batch at offset {} where entry {} should start at {}",
                    base_offset.0,
                    map.next_index(),
                    map.next_offset.0
                ));
            }
            let index = map.next_index();
            map.push_data(index, term, count);
        }
        let mut dropped = Vec::new();
        for (index, term, kind) in internal {
            if dropped.is_empty() && index == map.next_index() {
                map.push_beside(index, term, kind);
            } else {
                dropped.push(index);
            }
        }
        Ok((map, dropped))
    }

    pub fn purged(&self) -> Option<PurgePoint> {
        self.purged
    }

    /// The index of the first entry held above the purge point.
    pub fn first_index(&self) -> u64 {
        self.first_index
    }

    /// The index the next appended entry takes.
    pub fn next_index(&self) -> u64 {
        self.first_index + self.slots.len() as u64
    }

    /// The Kafka offset after the last entry.
    pub fn next_offset(&self) -> Offset {
        self.next_offset
    }

    /// `(term, index)` of the last entry, or of the purge point if nothing is above it.
    pub fn last(&self) -> Option<(Term, u64)> {
        match self.slots.back() {
            Some(slot) => Some((slot.term(), self.next_index() - 1)),
            None => self.purged.map(|p| (p.term, p.index)),
        }
    }

    /// Number of entries held above the purge point.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// The entry at `index`, if it is above the purge point and present.
    pub fn get(&self, index: u64) -> Option<Slot> {
        let at = index.checked_sub(self.first_index)?;
        self.slots.get(usize::try_from(at).ok()?).copied()
    }

    /// The Kafka offset after entry `index` (`None` if not held and not the purge point).
    pub fn offset_after(&self, index: u64) -> Option<Offset> {
        if let Some(p) = self.purged {
            if p.index == index {
                return Some(p.next_offset);
            }
        }
        self.get(index).map(|s| s.next_offset())
    }

    /// Records a data entry of `offset_count` offsets at `index`, which must be the next index;
    /// returns the Kafka offset its first record takes.
    pub fn push_data(&mut self, index: u64, term: Term, offset_count: u32) -> Offset {
        self.start_at(index);
        assert_eq!(index, self.next_index(), "entries are appended in index order");
        assert!(offset_count > 0, "a batch takes at least one offset");
        self.assert_term_grows(term);
        let base_offset = self.next_offset;
        self.slots.push_back(Slot::Data {
            term,
            base_offset,
            offset_count,
        });
        self.next_offset = base_offset.plus(i64::from(offset_count));
        base_offset
    }

    /// Records an internal entry at `index`, which must be the next index.
    pub fn push_internal(&mut self, index: u64, term: Term) {
        self.push_beside(index, term, Beside::Internal);
    }

    /// Records a side record at `index`, which must be the next index.
    pub fn push_side(&mut self, index: u64, term: Term) {
        self.push_beside(index, term, Beside::Side);
    }

    fn push_beside(&mut self, index: u64, term: Term, kind: Beside) {
        self.start_at(index);
        assert_eq!(index, self.next_index(), "entries are appended in index order");
        self.assert_term_grows(term);
        let offset_before = self.next_offset;
        self.slots.push_back(match kind {
            Beside::Internal => Slot::Internal { term, offset_before },
            Beside::Side => Slot::Side { term, offset_before },
        });
    }

    /// A map that has never held an entry starts at the index of its first one (openraft starts
    /// a group's log at 0; a log whose entries were all truncated starts over wherever the
    /// leader's next entry is).
    fn start_at(&mut self, index: u64) {
        if self.slots.is_empty() && self.purged.is_none() {
            self.first_index = index;
        }
    }

    fn assert_term_grows(&self, term: Term) {
        if let Some((last, _)) = self.last() {
            assert!(
                term >= last,
                "terms never go down along a log: {term:?} after {last:?}"
            );
        }
    }

    /// Drops the entries after `index` (all of them for `None`); returns the Kafka offset the
    /// log must be truncated to. Entries at or below the purge point are committed and can
    /// never be truncated.
    pub fn truncate_after(&mut self, index: Option<u64>) -> Offset {
        let keep = match index {
            Some(i) => i + 1,
            None => 0,
        };
        if let Some(p) = self.purged {
            assert!(
                keep > p.index,
                "truncating committed entries at or below {}",
                p.index
            );
        }
        let keep_slots = usize::try_from(keep.saturating_sub(self.first_index)).unwrap_or(usize::MAX);
        self.slots.truncate(keep_slots);
        self.next_offset = self.slots.back().map_or(self.start_offset, Slot::next_offset);
        self.next_offset
    }

    /// Forgets the entries up to and including `index`, whose term is `term`. Purging past the
    /// last entry held leaves the map empty, continuing after `index` at the same Kafka offset.
    pub fn purge(&mut self, index: u64, term: Term) {
        if self.purged.is_some_and(|p| p.index >= index) {
            return;
        }
        let point = match self.get(index) {
            Some(slot) => {
                assert_eq!(slot.term(), term, "purging entry {index} of another term");
                PurgePoint {
                    term,
                    index,
                    next_offset: slot.next_offset(),
                }
            }
            None if index < self.first_index => {
                // Before the first entry held (a log that started after it): nothing to drop.
                let point = PurgePoint {
                    term,
                    index,
                    next_offset: self.start_offset,
                };
                self.purged = Some(point);
                return;
            }
            None => PurgePoint {
                term,
                index,
                next_offset: self.next_offset,
            },
        };
        let drop = usize::try_from(index + 1 - self.first_index)
            .unwrap_or(usize::MAX)
            .min(self.slots.len());
        self.slots.drain(..drop);
        self.first_index = index + 1;
        self.start_offset = point.next_offset;
        self.next_offset = self.next_offset.max(point.next_offset);
        self.purged = Some(point);
    }

    /// Replaces everything with a purge point received from the leader (a follower installing
    /// the leader's log).
    pub fn reset_to(&mut self, purged: PurgePoint) {
        *self = EntryMap::after_purge(purged);
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[derive(Debug, Clone)]
    enum Op {
        Data { term_step: u8, count: u32 },
        Internal { term_step: u8 },
        Side { term_step: u8 },
        Truncate { back: u8 },
        Purge { back: u8 },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0u8..2, 1u32..50).prop_map(|(term_step, count)| Op::Data { term_step, count }),
            1 => (0u8..2).prop_map(|term_step| Op::Internal { term_step }),
            2 => (0u8..2).prop_map(|term_step| Op::Side { term_step }),
            1 => (0u8..6).prop_map(|back| Op::Truncate { back }),
            1 => (0u8..6).prop_map(|back| Op::Purge { back }),
        ]
    }

    /// The model: every entry from index 0, `Err` for those beside the log, and how many are
    /// purged.
    #[derive(Default)]
    struct Model {
        entries: Vec<(Term, Result<u32, Beside>)>,
        purged: usize,
    }

    impl Model {
        fn offset_before(&self, index: usize, start: i64) -> i64 {
            start
                + self.entries[..index]
                    .iter()
                    .filter_map(|(_, c)| c.ok().map(i64::from))
                    .sum::<i64>()
        }
    }

    proptest! {
        /// Whatever the sequence of appends, truncations and purges, the map gives every held
        /// entry the offsets a full recount gives it, and rebuilding it from what a log would
        /// hold yields the same map.
        #[test]
        fn offsets_match_a_recount_and_survive_a_rebuild(ops in proptest::collection::vec(op(), 1..80), start in 0i64..1000) {
            let start_offset = Offset(start);
            let mut map = EntryMap::new(start_offset);
            let mut model = Model::default();
            let mut term = Term(1);
            for op in ops {
                match op {
                    Op::Data { term_step, count } => {
                        term = Term(term.0 + u64::from(term_step));
                        let index = model.entries.len() as u64;
                        let base = map.push_data(index, term, count);
                        prop_assert_eq!(base.0, model.offset_before(model.entries.len(), start));
                        model.entries.push((term, Ok(count)));
                    }
                    Op::Internal { term_step } => {
                        term = Term(term.0 + u64::from(term_step));
                        map.push_internal(model.entries.len() as u64, term);
                        model.entries.push((term, Err(Beside::Internal)));
                    }
                    Op::Side { term_step } => {
                        term = Term(term.0 + u64::from(term_step));
                        map.push_side(model.entries.len() as u64, term);
                        model.entries.push((term, Err(Beside::Side)));
                    }
                    Op::Truncate { back } => {
                        let keep = model.entries.len().saturating_sub(usize::from(back)).max(model.purged);
                        let index = keep.checked_sub(1).map(|k| k as u64);
                        if model.purged > 0 && index.is_none() { continue; }
                        let offset = map.truncate_after(index);
                        model.entries.truncate(keep);
                        prop_assert_eq!(offset.0, model.offset_before(keep, start));
                    }
                    Op::Purge { back } => {
                        let upto = model.entries.len().saturating_sub(usize::from(back) + 1);
                        if model.entries.is_empty() || upto < model.purged { continue; }
                        map.purge(upto as u64, model.entries[upto].0);
                        model.purged = upto + 1;
                    }
                }
                prop_assert_eq!(map.next_index(), model.entries.len() as u64);
                prop_assert_eq!(map.next_offset().0, model.offset_before(model.entries.len(), start));
                for (i, (t, count)) in model.entries.iter().enumerate() {
                    let slot = map.get(i as u64);
                    if i < model.purged {
                        prop_assert!(slot.is_none());
                        continue;
                    }
                    let before = Offset(model.offset_before(i, start));
                    let expected = match count {
                        Ok(c) => Slot::Data { term: *t, base_offset: before, offset_count: *c },
                        Err(Beside::Internal) => Slot::Internal { term: *t, offset_before: before },
                        Err(Beside::Side) => Slot::Side { term: *t, offset_before: before },
                    };
                    prop_assert_eq!(slot, Some(expected));
                }
            }
            // Rebuild from what a log holds: all batches (some below the purge point) and the
            // internal entries and side records recorded beside it.
            let mut internal = Vec::new();
            let mut batches = Vec::new();
            for (i, (t, count)) in model.entries.iter().enumerate() {
                match count {
                    Ok(c) => batches.push((*t, Offset(model.offset_before(i, start)), *c)),
                    Err(kind) if i >= model.purged => internal.push((i as u64, *t, *kind)),
                    Err(_) => {}
                }
            }
            let (rebuilt, dropped) = EntryMap::rebuild(map.purged(), start_offset, internal, batches).map_err(TestCaseError::fail)?;
            prop_assert!(dropped.is_empty());
            prop_assert_eq!(rebuilt.next_index(), map.next_index());
            prop_assert_eq!(rebuilt.next_offset(), map.next_offset());
            prop_assert_eq!(rebuilt.last(), map.last());
            for i in 0..map.next_index() {
                prop_assert_eq!(rebuilt.get(i), map.get(i));
            }
        }
    }

    #[test]
    fn a_rebuild_drops_internal_entries_past_a_lost_tail_and_refuses_gaps() {
        // Entries: 0 batch, 1 internal, 2 batch, 3 batch (lost), 4 internal (durable: internal
        // entries are synced at once), 5 internal. After a crash that lost batch 3, entries 4
        // and 5 cannot be placed and are dropped.
        let (map, dropped) = EntryMap::rebuild(
            None,
            Offset(0),
            [
                (1, Term(1), Beside::Internal),
                (4, Term(2), Beside::Side),
                (5, Term(2), Beside::Internal),
            ],
            [(Term(1), Offset(0), 2), (Term(1), Offset(2), 3)],
        )
        .expect("rebuilds");
        assert_eq!(dropped, vec![4, 5]);
        assert_eq!(map.next_index(), 3);
        assert_eq!(map.next_offset(), Offset(5));
        // An internal entry right at the end is kept.
        let (map, dropped) = EntryMap::rebuild(
            None,
            Offset(0),
            [(1, Term(2), Beside::Side)],
            [(Term(1), Offset(0), 2)],
        )
        .expect("rebuilds");
        assert!(dropped.is_empty());
        assert_eq!(map.last(), Some((Term(2), 1)));
        let err = EntryMap::rebuild(
            None,
            Offset(0),
            [],
            [(Term(1), Offset(0), 2), (Term(1), Offset(3), 1)],
        );
        assert!(err.is_err(), "a gap in the offsets is refused: {err:?}");
    }

    #[test]
    #[should_panic(expected = "truncating committed entries")]
    fn committed_entries_are_never_truncated() {
        let mut map = EntryMap::new(Offset(0));
        map.push_data(0, Term(1), 3);
        map.push_data(1, Term(1), 3);
        map.purge(1, Term(1));
        map.truncate_after(Some(0));
    }
}
