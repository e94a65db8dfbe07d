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
//!   group name (u16 length, bytes), then the state records (u32 length, bytes each).
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

/// One side record's data, encoded.
pub(super) fn encode(group: &str, snapshot: bool, forget: bool, records: &[StateRecord]) -> Bytes {
    let values: Vec<Vec<u8>> = records.iter().map(StateRecord::to_bytes).collect();
    let len = 1 + 2 + group.len() + values.iter().map(|v| 4 + v.len()).sum::<usize>();
    let mut out = BytesMut::with_capacity(len);
    out.put_u8((u8::from(snapshot) * SNAPSHOT) | (u8::from(forget) * FORGET));
    // Group names are at most a few hundred bytes (checked by the doors).
    out.put_u16(u16::try_from(group.len()).unwrap_or(u16::MAX));
    out.put_slice(
        group
            .as_bytes()
            .get(..usize::from(u16::MAX))
            .unwrap_or(group.as_bytes()),
    );
    for v in &values {
        out.put_u32(u32::try_from(v.len()).unwrap_or(u32::MAX));
        out.put_slice(v);
    }
    out.freeze()
}

/// A decoded side record.
#[derive(Debug, PartialEq)]
pub(super) struct Decoded {
    pub(super) group: String,
    pub(super) snapshot: bool,
    pub(super) forget: bool,
    pub(super) records: Vec<StateRecord>,
}

pub(super) fn decode(data: &Bytes) -> Result<Decoded, String> {
    let mut b = data.clone();
    if b.remaining() < 3 {
        return Err("a side record shorter than its header".into());
    }
    let flags = b.get_u8();
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
    for (index, data) in side {
        let d = match decode(data) {
            Ok(d) => d,
            Err(_) => {
                undecodable += 1;
                continue;
            }
        };
        part.committed(&d.group, *index, d.snapshot, d.forget);
        if d.group == group {
            if d.forget {
                records.clear();
            } else {
                records.extend(d.records);
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

    #[test]
    fn side_records_round_trip_and_bad_ones_are_refused() {
        let data = encode("workers", true, false, &[ack(3), ack(4)]);
        let d = decode(&data).unwrap();
        assert_eq!(
            d,
            Decoded {
                group: "workers".into(),
                snapshot: true,
                forget: false,
                records: vec![ack(3), ack(4)],
            }
        );
        // A cut between state records reads as fewer of them; anywhere else it is refused.
        let header = 1 + 2 + "workers".len();
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
            (3, encode("a", false, false, &[ack(1)])),
            (5, encode("b", true, false, &[ack(2)])),
            (7, encode("a", true, false, &[ack(3)])),
            (9, encode("b", false, true, &[])),
            (11, encode("b", false, false, &[ack(4)])),
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
}
