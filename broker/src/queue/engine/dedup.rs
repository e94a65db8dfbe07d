//! The publish dedup table: token -> first message, for `dedup_window_ms` after its publish.
//!
//! Tokens are kept whole (at most [`MAX_DEDUP_TOKEN_BYTES`](super::config::MAX_DEDUP_TOKEN_BYTES)),
//! not hashed: a hash collision would silently drop a message. An entry is valid while
//! `now < expires_at`.

use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;

use strand_protocol::types::Offset;

use super::types::MessageId;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DedupEntry {
    pub(crate) id: MessageId,
    pub(crate) offset: Offset,
    pub(crate) expires_at_ms: i64,
}

#[derive(Debug, Default)]
pub(crate) struct DedupTable {
    entries: BTreeMap<Rc<[u8]>, DedupEntry>,
    by_expiry: BTreeSet<(i64, Rc<[u8]>)>,
}

impl DedupTable {
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Drops every entry expired at `now_ms`.
    pub(crate) fn expire(&mut self, now_ms: i64) {
        while let Some(first) = self.by_expiry.first() {
            if first.0 > now_ms {
                break;
            }
            if let Some((_, token)) = self.by_expiry.pop_first() {
                self.entries.remove(&token);
            }
        }
    }

    /// The live entry for `token` at `now_ms`.
    pub(crate) fn get(&self, token: &[u8], now_ms: i64) -> Option<DedupEntry> {
        self.entries
            .get(token)
            .filter(|e| now_ms < e.expires_at_ms)
            .copied()
    }

    /// Records `token` unless a live entry exists; returns whether it was inserted.
    pub(crate) fn insert(&mut self, token: &[u8], entry: DedupEntry, now_ms: i64) -> bool {
        if now_ms >= entry.expires_at_ms || self.get(token, now_ms).is_some() {
            return false;
        }
        if let Some(old) = self.entries.get(token) {
            // An expired entry not yet popped.
            self.by_expiry.remove(&(old.expires_at_ms, Rc::from(token)));
        }
        let token: Rc<[u8]> = Rc::from(token);
        self.by_expiry.insert((entry.expires_at_ms, token.clone()));
        self.entries.insert(token, entry);
        true
    }

    /// Drops the entries of messages at or beyond `end` (appends that were lost); returns how many.
    pub(crate) fn retain_below(&mut self, end: Offset) -> usize {
        let gone: Vec<Rc<[u8]>> = self
            .entries
            .iter()
            .filter(|(_, e)| e.offset >= end)
            .map(|(t, _)| t.clone())
            .collect();
        for t in &gone {
            if let Some(e) = self.entries.remove(t) {
                self.by_expiry.remove(&(e.expires_at_ms, t.clone()));
            }
        }
        gone.len()
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (&[u8], &DedupEntry)> {
        self.entries.iter().map(|(t, e)| (&**t, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strand_protocol::types::PartitionId;

    #[test]
    fn entries_live_for_the_window() {
        let mut t = DedupTable::default();
        let e = |o: i64, exp: i64| DedupEntry {
            id: MessageId::new(PartitionId(0), Offset(o)),
            offset: Offset(o),
            expires_at_ms: exp,
        };
        assert!(t.insert(b"a", e(1, 100), 0));
        assert!(!t.insert(b"a", e(2, 200), 50), "a live entry is kept");
        assert!(!t.insert(b"b", e(3, 10), 10), "born expired");
        assert_eq!(t.get(b"a", 99).map(|x| x.offset), Some(Offset(1)));
        assert_eq!(t.get(b"a", 100), None);
        assert!(t.insert(b"a", e(4, 300), 100), "replaces an expired entry");
        t.expire(299);
        assert_eq!(t.len(), 1);
        t.expire(300);
        assert_eq!(t.len(), 0);
        assert_eq!(t.by_expiry.len(), 0);
    }
}
