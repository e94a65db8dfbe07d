//! The engines' delivery state on a cluster node: side records of the partition's Raft group
//! (`strand_raft::partition::SideRecord`), not a state log of the node's own.
//!
//! - **Writes.** Each [`crate::queue::engine::Action::Persist`] of an engine on the partition's
//!   leader is one side record, proposed through the partition's group: it is committed on a
//!   majority, in order with the partition's batches, before the engine hears it persisted (an
//!   ack is answered at commit). Every replica stores it beside its copy of the log.
//! - **Fail-over.** A new leader opens an engine from the side records it holds (all committed:
//!   it leads its whole log first), the group's records in index order, as a standalone node
//!   recovers from its state log.
//! - **Format** of a record's data: a flags byte (`SNAPSHOT`: the write is a snapshot of the
//!   group's state; `FORGET`: the group's state is gone, as DeleteShareGroupOffsets asks), the
//!   part and the part count of its write (u32 each), the group name (u16 length, bytes), then
//!   the state records (u32 length, bytes each).
//! - **Parts.** A side record is an entry of the partition's Raft log, which travels whole in a
//!   frame of the node transport: a write larger than [`MAX_PART_BYTES`] (a snapshot of a full
//!   dedup table, say) is cut into parts, proposed in order, and heard persisted once the last
//!   is committed. Reading, a write counts only when all its parts are there in order: the parts
//!   of a write that never completed (its leader lost them) are dropped.
//! - **Trimming.** The partition's groups share its side records; a record's keep-from index is
//!   the lowest, over the groups the leader knows of, of the index of each group's latest
//!   snapshot (0 while a group has none: an engine whose group has none takes one when it opens
//!   on a leader). Records of a group before its latest snapshot are superseded by it.

use std::collections::HashMap;

use bytes::{Buf, BufMut, Bytes, BytesMut};

use super::ops::QueueFailure;
use crate::queue::engine::StateRecord;

/// The write is a snapshot of the group's state.
const SNAPSHOT: u8 = 1;
/// The group's state is gone: its records before this one are void.
const FORGET: u8 = 2;

/// Bytes of state records one side record carries at most (a write cut into parts beyond).
pub(super) const MAX_PART_BYTES: usize = 1 << 20;

/// One write's side records, encoded: one, or parts of at most [`MAX_PART_BYTES`] of records
/// each (a record larger than that alone in its part; records are far smaller).
pub(super) fn encode(group: &str, snapshot: bool, forget: bool, records: &[StateRecord]) -> Vec<Bytes> {
    let values: Vec<Vec<u8>> = records.iter().map(StateRecord::to_bytes).collect();
    let mut parts: Vec<&[Vec<u8>]> = Vec::new();
    let mut start = 0;
    let mut size = 0;
    for (i, v) in values.iter().enumerate() {
        if size > 0 && size + 4 + v.len() > MAX_PART_BYTES {
            parts.push(values.get(start..i).unwrap_or_default());
            start = i;
            size = 0;
        }
        size += 4 + v.len();
    }
    parts.push(values.get(start..).unwrap_or_default());
    let count = u32::try_from(parts.len()).unwrap_or(u32::MAX);
    // Group names are at most a few hundred bytes (checked by the doors).
    let name = group
        .as_bytes()
        .get(..usize::from(u16::MAX))
        .unwrap_or(group.as_bytes());
    parts
        .iter()
        .zip(0u32..)
        .map(|(values, part)| {
            let len = HEADER_BYTES + name.len() + values.iter().map(|v| 4 + v.len()).sum::<usize>();
            let mut out = BytesMut::with_capacity(len);
            out.put_u8((u8::from(snapshot) * SNAPSHOT) | (u8::from(forget) * FORGET));
            out.put_u32(part);
            out.put_u32(count);
            out.put_u16(u16::try_from(name.len()).unwrap_or(u16::MAX));
            out.put_slice(name);
            for v in *values {
                out.put_u32(u32::try_from(v.len()).unwrap_or(u32::MAX));
                out.put_slice(v);
            }
            out.freeze()
        })
        .collect()
}

/// Flags, part, part count and the group name's length.
const HEADER_BYTES: usize = 1 + 4 + 4 + 2;

/// A decoded side record.
#[derive(Debug, PartialEq)]
pub(super) struct Decoded {
    pub(super) group: String,
    pub(super) snapshot: bool,
    pub(super) forget: bool,
    /// This record's part of its write, and the write's part count.
    pub(super) part: u32,
    pub(super) parts: u32,
    pub(super) records: Vec<StateRecord>,
}

pub(super) fn decode(data: &Bytes) -> Result<Decoded, String> {
    let mut b = data.clone();
    if b.remaining() < HEADER_BYTES {
        return Err("a side record shorter than its header".into());
    }
    let flags = b.get_u8();
    let part = b.get_u32();
    let parts = b.get_u32();
    if part >= parts {
        return Err(format!("part {part} of {parts}"));
    }
    let group_len = usize::from(b.get_u16());
    if b.remaining() < group_len {
        return Err("a side record's group name is cut".into());
    }
    let group =
        String::from_utf8(b.split_to(group_len).to_vec()).map_err(|_| "a group name that is not UTF-8")?;
    let mut records = Vec::new();
    while b.has_remaining() {
        if b.remaining() < 4 {
            return Err("a state record's length is cut".into());
        }
        let len = usize::try_from(b.get_u32()).unwrap_or(usize::MAX);
        if b.remaining() < len {
            return Err("a state record is cut".into());
        }
        let value = b.split_to(len);
        records.push(StateRecord::decode(&value).map_err(|e| format!("a state record: {e}"))?);
    }
    Ok(Decoded {
        group,
        snapshot: flags & SNAPSHOT != 0,
        forget: flags & FORGET != 0,
        part,
        parts,
        records,
    })
}

/// What a partition's leader knows of its side records: each group's latest snapshot.
#[derive(Debug, Default)]
pub(super) struct PartitionSide {
    /// Group -> index of its latest snapshot record (0: none yet).
    snapshots: HashMap<String, u64>,
}

impl PartitionSide {
    /// A record of `group` at `index` was committed.
    pub(super) fn committed(&mut self, group: &str, index: u64, snapshot: bool, forget: bool) {
        if forget {
            // Its records, this one included, go once every other group's snapshot passes it.
            self.snapshots.insert(group.to_owned(), index);
            return;
        }
        let latest = self.snapshots.entry(group.to_owned()).or_insert(0);
        if snapshot {
            *latest = (*latest).max(index);
        }
    }

    /// Whether `group` has a snapshot among the records (a group without one keeps every
    /// record of the partition: its engine takes one when it opens).
    pub(super) fn has_snapshot(&self, group: &str) -> bool {
        self.snapshots.get(group).is_some_and(|i| *i > 0)
    }

    /// The keep-from index a new record carries.
    pub(super) fn keep_from(&self) -> u64 {
        self.snapshots.values().copied().min().unwrap_or(0)
    }
}

/// Every side record the partition's replica here holds, decoded: `group`'s state records in
/// order (after its last `FORGET`), and what the leader learns of every group's snapshots.
pub(super) fn read_group(
    side: &[(u64, Bytes)],
    group: &str,
) -> Result<(Vec<StateRecord>, PartitionSide, usize), QueueFailure> {
    let mut records = Vec::new();
    let mut part = PartitionSide::default();
    let mut undecodable = 0usize;
    // Each group's write whose parts are being gathered: its first part's index, the next part
    // expected, and (for `group`) the records so far.
    let mut gathering: HashMap<String, (u64, u32, Vec<StateRecord>)> = HashMap::new();
    for (index, data) in side {
        let d = match decode(data) {
            Ok(d) => d,
            Err(_) => {
                undecodable += 1;
                continue;
            }
        };
        let ours = d.group == group;
        let (first, next, mut gathered) = match gathering.remove(&d.group) {
            // The next part of the write being gathered.
            Some((first, next, gathered)) if d.part == next && d.part > 0 => (first, next, gathered),
            // A write's first part (a write left incomplete before it is dropped).
            _ if d.part == 0 => (*index, 0, Vec::new()),
            // A part without the ones before it.
            _ => continue,
        };
        if ours {
            gathered.extend(d.records);
        }
        if next + 1 < d.parts {
            gathering.insert(d.group, (first, next + 1, gathered));
            continue;
        }
        part.committed(&d.group, first, d.snapshot, d.forget);
        if ours {
            if d.forget {
                records.clear();
            } else {
                records.extend(gathered);
            }
        }
    }
    Ok((records, part, undecodable))
}

#[cfg(test)]
mod tests {
    use super::*;
    use strand_protocol::types::Offset;

    fn ack(offset: i64) -> StateRecord {
        StateRecord::Start {
            start: Offset(offset),
        }
    }

    fn one(group: &str, snapshot: bool, forget: bool, records: &[StateRecord]) -> Bytes {
        let mut parts = encode(group, snapshot, forget, records);
        assert_eq!(parts.len(), 1);
        parts.remove(0)
    }

    #[test]
    fn side_records_round_trip_and_bad_ones_are_refused() {
        let data = one("workers", true, false, &[ack(3), ack(4)]);
        let d = decode(&data).unwrap();
        assert_eq!(
            d,
            Decoded {
                group: "workers".into(),
                snapshot: true,
                forget: false,
                part: 0,
                parts: 1,
                records: vec![ack(3), ack(4)],
            }
        );
        // A cut between state records reads as fewer of them; anywhere else it is refused.
        let header = HEADER_BYTES + "workers".len();
        let first = header + 4 + ack(3).to_bytes().len();
        for cut in 0..data.len() {
            match decode(&data.slice(..cut)) {
                Ok(d) if cut == header => assert!(d.records.is_empty()),
                Ok(d) if cut == first => assert_eq!(d.records, vec![ack(3)]),
                Ok(d) => panic!("cut at {cut} decodes: {d:?}"),
                Err(_) => {}
            }
        }
    }

    /// A group's records are read in order, from its last `FORGET` on; the keep-from index is
    /// the lowest latest snapshot over the groups, 0 while one has none.
    #[test]
    fn a_group_reads_its_records_and_the_keep_from_index_waits_for_every_group() {
        let side = vec![
            (3, one("a", false, false, &[ack(1)])),
            (5, one("b", true, false, &[ack(2)])),
            (7, one("a", true, false, &[ack(3)])),
            (9, one("b", false, true, &[])),
            (11, one("b", false, false, &[ack(4)])),
            (12, Bytes::from_static(b"\x00")),
        ];
        let (a, part, bad) = read_group(&side, "a").unwrap();
        assert_eq!(a, vec![ack(1), ack(3)]);
        assert_eq!(bad, 1);
        assert_eq!(part.keep_from(), 7, "a's snapshot at 7; b forgotten at 9");
        let (b, _, _) = read_group(&side, "b").unwrap();
        assert_eq!(b, vec![ack(4)], "b's records after its FORGET");
        let mut part = PartitionSide::default();
        part.committed("a", 4, true, false);
        part.committed("b", 6, false, false);
        assert_eq!(part.keep_from(), 0, "b has no snapshot yet");
        part.committed("b", 8, true, false);
        assert_eq!(part.keep_from(), 4);
    }

    /// A write larger than a part is cut into parts that read back as the one write, its first
    /// part's index standing for it; the parts of a write left incomplete (its leader lost the
    /// rest) are dropped, and so is a part without the ones before it.
    #[test]
    fn large_writes_are_cut_into_parts_and_read_whole_or_not_at_all() {
        let few: Vec<StateRecord> = (0..3_000)
            .map(|i| StateRecord::Start { start: Offset(i) })
            .collect();
        assert_eq!(
            encode("g", true, false, &few).len(),
            1,
            "3,000 small records fit one part"
        );
        let many: Vec<StateRecord> = (0..200_000)
            .map(|i| StateRecord::Start { start: Offset(i) })
            .collect();
        let parts = encode("g", true, false, &many);
        assert!(parts.len() > 1, "{} parts", parts.len());
        assert!(parts.iter().all(|p| p.len() <= MAX_PART_BYTES + HEADER_BYTES + 1));
        let whole: Vec<(u64, Bytes)> = parts.iter().cloned().zip(10u64..).map(|(p, i)| (i, p)).collect();
        let (got, part, bad) = read_group(&whole, "g").unwrap();
        assert_eq!((got.len(), bad), (many.len(), 0));
        assert!(part.has_snapshot("g"));
        assert_eq!(part.keep_from(), 10, "the first part stands for the write");
        // The last part lost: nothing of the write counts; the write after it does.
        let mut cut = whole.clone();
        cut.pop();
        cut.push((100, one("g", false, false, &[ack(7)])));
        let (got, part, _) = read_group(&cut, "g").unwrap();
        assert_eq!(got, vec![ack(7)]);
        assert!(!part.has_snapshot("g"));
        // A part whose first part is gone counts for nothing either.
        let (got, _, _) = read_group(&whole[1..], "g").unwrap();
        assert!(got.is_empty());
    }
}
