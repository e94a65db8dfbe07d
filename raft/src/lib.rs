//! Raft replication of partition logs (openraft 0.10): the groups, their storage on the shard
//! store, their transport and runtimes. The broker's replication subsystem runs them.
//!
//! - [`partition`]: a Kafka partition as a Raft group whose log is the partition's own log
//!   (offset translation, replica storage on the shard store, the state machine beside the log,
//!   quiescing of idle groups).
//! - [`transport`]: how the groups of many partitions talk between nodes.
//! - [`rt`]: openraft's runtime on glommio, and the deterministic simulation runtime.
//!
//! | Raft needs                          | the storage engine offers (`ShardStore`)                      |
//! |-------------------------------------|----------------------------------------------------------------|
//! | append entries with their term      | `append_replica(batch, base offset, term)`                     |
//! | read entries by index               | `plan_read(offset)`, with the entry map translating indexes    |
//! | truncate a conflicting suffix       | `truncate_log(offset)`, durable across replay                  |
//! | know what is durable (flushed)      | `wait_durable(ticket)` after a flush round                     |
//! | vote, snapshot record, internal entries | the side file `raft-state` in the partition's directory    |

pub mod partition;
pub mod rt;
pub mod transport;

use strand_protocol::types::{LeaderEpoch, Offset};

/// A Raft term. A partition's Kafka leader epoch *is* the Raft term of its group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Term(pub u64);

impl Term {
    /// The term stamped into batches as `partitionLeaderEpoch`; Kafka epochs are `i32`.
    pub fn as_leader_epoch(self) -> Option<LeaderEpoch> {
        i32::try_from(self.0).ok().map(LeaderEpoch)
    }

    pub fn from_leader_epoch(epoch: LeaderEpoch) -> Option<Term> {
        u64::try_from(epoch.0).ok().map(Term)
    }
}

/// A Raft log index. Raft counts entries from 1; a partition's first batch (offset 0) is entry 1.
/// One Raft entry is one record batch, so indexes and offsets differ once batches hold more than
/// one record: the mapping is kept per entry (`base offset` in the entry), never computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LogIndex(pub u64);

/// What a replicated entry must carry so that a follower can rebuild its Kafka log exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryPosition {
    pub index: LogIndex,
    pub term: Term,
    /// Kafka offset of the batch's first record.
    pub base_offset: Offset,
    /// Offsets the batch occupies.
    pub offset_count: u32,
}

impl EntryPosition {
    /// Offset after the batch: the next entry's base offset.
    pub fn next_offset(&self) -> Offset {
        self.base_offset.plus(i64::from(self.offset_count))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epochs_and_terms_round_trip() {
        assert_eq!(Term(7).as_leader_epoch(), Some(LeaderEpoch(7)));
        assert_eq!(Term::from_leader_epoch(LeaderEpoch(7)), Some(Term(7)));
        assert_eq!(Term::from_leader_epoch(LeaderEpoch(-1)), None);
        assert_eq!(Term(u64::MAX).as_leader_epoch(), None);
    }

    #[test]
    fn next_offset_follows_the_batch() {
        let e = EntryPosition {
            index: LogIndex(1),
            term: Term(1),
            base_offset: Offset(10),
            offset_count: 5,
        };
        assert_eq!(e.next_offset(), Offset(15));
    }
}
