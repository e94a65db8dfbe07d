//! The time-bucketed delay index: which delayed messages become due when.
//!
//! Entries are grouped in buckets of `bucket_ms` ordered by time. Promoting due messages pops
//! whole buckets that lie in the past and filters only the current one, so the cost is
//! proportional to the messages promoted, never to the log or to the number of delayed
//! messages. Entries are hints: the engine checks each popped entry against the message's
//! current state, so a stale entry (the message changed since) is simply dropped.

use std::collections::BTreeMap;

use strand_protocol::types::Offset;

#[derive(Debug)]
pub(crate) struct DelayIndex {
    bucket_ms: i64,
    buckets: BTreeMap<i64, Vec<(i64, Offset)>>,
    len: usize,
}

impl DelayIndex {
    pub(crate) fn new(bucket_ms: u64) -> Self {
        DelayIndex {
            bucket_ms: i64::try_from(bucket_ms.max(1)).unwrap_or(1),
            buckets: BTreeMap::new(),
            len: 0,
        }
    }

    fn bucket(&self, t: i64) -> i64 {
        t.div_euclid(self.bucket_ms)
    }

    pub(crate) fn insert(&mut self, not_before_ms: i64, offset: Offset) {
        let b = self.bucket(not_before_ms);
        self.buckets.entry(b).or_default().push((not_before_ms, offset));
        self.len += 1;
    }

    /// Moves every entry due at `now_ms` (`not_before <= now`) into `out`, in time order within
    /// a bucket-by-bucket order (callers must not rely on the order across messages).
    pub(crate) fn pop_due(&mut self, now_ms: i64, out: &mut Vec<(i64, Offset)>) {
        let now_bucket = self.bucket(now_ms);
        while let Some(mut entry) = self.buckets.first_entry() {
            let b = *entry.key();
            if b > now_bucket {
                break;
            }
            if b < now_bucket {
                let v = entry.remove();
                self.len -= v.len();
                out.extend(v);
                continue;
            }
            let v = entry.get_mut();
            let before = v.len();
            v.retain(|&(nb, off)| {
                if nb <= now_ms {
                    out.push((nb, off));
                    false
                } else {
                    true
                }
            });
            self.len -= before - v.len();
            if v.is_empty() {
                entry.remove();
            }
            break;
        }
    }

    /// The earliest `not_before` in the index (possibly of a stale entry).
    pub(crate) fn next_due(&self) -> Option<i64> {
        self.buckets
            .first_key_value()
            .and_then(|(_, v)| v.iter().map(|&(nb, _)| nb).min())
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pops_exactly_the_due_entries() {
        let mut d = DelayIndex::new(100);
        for (nb, o) in [(250, 1), (99, 2), (100, 3), (1_000, 4), (251, 5), (-5, 6)] {
            d.insert(nb, Offset(o));
        }
        assert_eq!(d.len(), 6);
        assert_eq!(d.next_due(), Some(-5));
        let mut out = Vec::new();
        d.pop_due(250, &mut out);
        let mut got: Vec<i64> = out.iter().map(|(_, o)| o.0).collect();
        got.sort();
        assert_eq!(got, vec![1, 2, 3, 6]);
        assert_eq!(d.len(), 2);
        assert_eq!(d.next_due(), Some(251));
        out.clear();
        d.pop_due(250, &mut out);
        assert!(out.is_empty());
        d.pop_due(10_000, &mut out);
        assert_eq!(out.len(), 2);
        assert_eq!(d.len(), 0);
        assert_eq!(d.next_due(), None);
    }
}
