//! Sparse per-segment indexes in Kafka's on-disk formats.
//!
//! - Offset index (`.index`): entries of `[relative offset: u32][file position: u32]`, one per
//!   `index.interval.bytes` of log, pointing at the start of a batch.
//! - Time index (`.timeindex`): entries of `[timestamp: i64][relative offset: u32]`: the
//!   segment's running maximum timestamp and the first batch that carried it, added at the same
//!   granularity when the maximum has risen, and by every checkpoint that writes the file, so
//!   that its last entry is the segment's maximum.
//!
//! Both are kept in memory for open segments and written to disk by checkpoints (a rolled
//! segment's at the next one). A segment within one `index.interval.bytes` has no offset-index
//! entry and gets no index files until it grows (BENCHMARKS.md#lazy-index-files). They are
//! derived data: a missing or damaged index file is rebuilt by scanning its segment.
//!
//! Index files on disk cover everything the recovery point vouches for. They are rewritten in
//! place only by appending entries: a torn write leaves the old ones whole and at most a
//! partial last entry, which recovery drops, and recovery cuts entries past the point. Files
//! created after the point that trusts their segment, files holding entries that recovery or a
//! truncation cut (the next write would put others in their place, and a torn write could mix
//! the two into an entry below the point), and files with bytes past their entries are written
//! beside their name and renamed in once durable (`segment::IndexFilesOnDisk`).

/// One offset-index entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OffsetEntry {
    pub relative_offset: u32,
    pub position: u32,
}

/// One time-index entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeEntry {
    pub timestamp: i64,
    pub relative_offset: u32,
}

/// Offset index of one segment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OffsetIndex {
    entries: Vec<OffsetEntry>,
}

impl OffsetIndex {
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Adds an entry. Entries must increase in both offset and position.
    pub fn push(&mut self, relative_offset: u32, position: u32) {
        if let Some(last) = self.entries.last() {
            assert!(
                relative_offset > last.relative_offset && position > last.position,
                "offset index must grow: {last:?} then ({relative_offset}, {position})"
            );
        }
        self.entries.push(OffsetEntry {
            relative_offset,
            position,
        });
    }

    /// The last entry at or before `relative_offset`; the start of the segment if none.
    pub fn lookup(&self, relative_offset: u32) -> OffsetEntry {
        let i = self
            .entries
            .partition_point(|e| e.relative_offset <= relative_offset);
        match i.checked_sub(1).and_then(|i| self.entries.get(i)) {
            Some(e) => *e,
            None => OffsetEntry {
                relative_offset: 0,
                position: 0,
            },
        }
    }

    /// Drops entries at or past `position`, or at or past `relative_offset`: what a recovery
    /// point does not vouch for.
    pub fn truncate_to(&mut self, position: u32, relative_offset: u32) {
        let keep = self
            .entries
            .partition_point(|e| e.position < position && e.relative_offset < relative_offset);
        self.entries.truncate(keep);
    }

    /// Drops entries for batches at or after `position`.
    pub fn truncate_to_position(&mut self, position: u32) {
        let keep = self.entries.partition_point(|e| e.position < position);
        self.entries.truncate(keep);
    }

    pub fn last(&self) -> Option<OffsetEntry> {
        self.entries.last().copied()
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.entries.len() * 8);
        for e in &self.entries {
            out.extend_from_slice(&e.relative_offset.to_be_bytes());
            out.extend_from_slice(&e.position.to_be_bytes());
        }
        out
    }

    /// Decodes an index file, rejecting it unless every entry is plausible for a segment of
    /// `segment_bytes` bytes: strictly increasing, positions inside the segment. A partial last
    /// entry (a torn append) is dropped. Kafka preallocates index files, so trailing all-zero
    /// entries are ignored.
    pub fn decode(bytes: &[u8], segment_bytes: u64) -> Option<OffsetIndex> {
        let mut index = OffsetIndex::default();
        for chunk in bytes.chunks_exact(8) {
            let (a, b) = chunk.split_at(4);
            let relative_offset = u32::from_be_bytes(a.try_into().ok()?);
            let position = u32::from_be_bytes(b.try_into().ok()?);
            if let Some(last) = index.entries.last() {
                if relative_offset == 0 && position == 0 {
                    break;
                }
                if relative_offset <= last.relative_offset || position <= last.position {
                    return None;
                }
            } else if relative_offset == 0 && position == 0 {
                break;
            }
            if u64::from(position) >= segment_bytes {
                return None;
            }
            index.entries.push(OffsetEntry {
                relative_offset,
                position,
            });
        }
        Some(index)
    }

    /// Memory held by the entries.
    pub fn heap_bytes(&self) -> usize {
        self.entries.capacity() * std::mem::size_of::<OffsetEntry>()
    }
}

/// Time index of one segment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TimeIndex {
    entries: Vec<TimeEntry>,
}

impl TimeIndex {
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Adds an entry if it raises the maximum timestamp.
    pub fn maybe_push(&mut self, timestamp: i64, relative_offset: u32) {
        match self.entries.last() {
            Some(last) if timestamp <= last.timestamp || relative_offset < last.relative_offset => {}
            _ => self.entries.push(TimeEntry {
                timestamp,
                relative_offset,
            }),
        }
    }

    /// The last entry whose timestamp is below `timestamp`: scanning from its offset finds the
    /// first batch with a timestamp at or above `timestamp`. Start of segment if none.
    pub fn lookup_before(&self, timestamp: i64) -> u32 {
        let i = self.entries.partition_point(|e| e.timestamp < timestamp);
        i.checked_sub(1)
            .and_then(|i| self.entries.get(i))
            .map_or(0, |e| e.relative_offset)
    }

    /// Drops entries pointing at or after `relative_offset`.
    pub fn truncate_to_offset(&mut self, relative_offset: u32) {
        let keep = self
            .entries
            .partition_point(|e| e.relative_offset < relative_offset);
        self.entries.truncate(keep);
    }

    pub fn last(&self) -> Option<TimeEntry> {
        self.entries.last().copied()
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.entries.len() * 12);
        for e in &self.entries {
            out.extend_from_slice(&e.timestamp.to_be_bytes());
            out.extend_from_slice(&e.relative_offset.to_be_bytes());
        }
        out
    }

    /// Decodes a time index file; `None` if it is not plausible (see [`OffsetIndex::decode`]).
    pub fn decode(bytes: &[u8], max_relative_offset: u32) -> Option<TimeIndex> {
        let mut index = TimeIndex::default();
        for chunk in bytes.chunks_exact(12) {
            let (a, b) = chunk.split_at(8);
            let timestamp = i64::from_be_bytes(a.try_into().ok()?);
            let relative_offset = u32::from_be_bytes(b.try_into().ok()?);
            if timestamp == 0 && relative_offset == 0 && !index.entries.is_empty() {
                break;
            }
            if let Some(last) = index.entries.last() {
                if timestamp <= last.timestamp || relative_offset < last.relative_offset {
                    return None;
                }
            }
            if relative_offset > max_relative_offset {
                return None;
            }
            index.entries.push(TimeEntry {
                timestamp,
                relative_offset,
            });
        }
        Some(index)
    }

    pub fn heap_bytes(&self) -> usize {
        self.entries.capacity() * std::mem::size_of::<TimeEntry>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offset_lookup_and_round_trip() {
        let mut idx = OffsetIndex::default();
        assert_eq!(
            idx.lookup(5),
            OffsetEntry {
                relative_offset: 0,
                position: 0
            }
        );
        idx.push(10, 4100);
        idx.push(20, 8200);
        assert_eq!(idx.lookup(9).position, 0);
        assert_eq!(idx.lookup(10).position, 4100);
        assert_eq!(idx.lookup(19).position, 4100);
        assert_eq!(idx.lookup(1000).position, 8200);
        let enc = idx.encode();
        assert_eq!(OffsetIndex::decode(&enc, 10_000), Some(idx.clone()));
        assert_eq!(
            OffsetIndex::decode(&enc, 8000),
            None,
            "position past the segment end"
        );
        // A torn append: the partial last entry is dropped.
        assert_eq!(
            OffsetIndex::decode(&enc[..7], 10_000),
            Some(OffsetIndex::default())
        );
        assert_eq!(
            OffsetIndex::decode(&enc[..enc.len() - 1], 10_000).map(|i| i.len()),
            Some(idx.len() - 1)
        );
        let mut swapped = enc.clone();
        swapped.rotate_left(8);
        assert_eq!(OffsetIndex::decode(&swapped, 10_000), None);
        idx.truncate_to_position(8200);
        assert_eq!(idx.len(), 1);
    }

    #[test]
    fn time_lookup_and_round_trip() {
        let mut t = TimeIndex::default();
        t.maybe_push(100, 0);
        t.maybe_push(90, 3);
        t.maybe_push(200, 7);
        assert_eq!(t.len(), 2);
        assert_eq!(t.lookup_before(100), 0);
        assert_eq!(t.lookup_before(150), 0);
        assert_eq!(t.lookup_before(201), 7);
        assert_eq!(TimeIndex::decode(&t.encode(), 7), Some(t.clone()));
        assert_eq!(TimeIndex::decode(&t.encode(), 6), None);
        let torn = &t.encode()[..20];
        assert_eq!(TimeIndex::decode(torn, 7).map(|t| t.len()), Some(1));
        t.truncate_to_offset(7);
        assert_eq!(t.len(), 1);
    }
}
