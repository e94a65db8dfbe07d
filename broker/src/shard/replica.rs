//! What the core needs from a replicated partition, implemented by the replication subsystem
//! (the core does not know it): the partition's Raft group as the produce and fetch paths see
//! it.
//!
//! In a cluster ([`super::Shard::cluster_state`] is set) every partition is replicated: its
//! writes become proposals to its group, and the store caps what clients see of its log at
//! the group's commit offset (`ShardStore::set_commit_cap`, which the subsystem moves as
//! entries commit). A partition whose group is not attached yet ([`super::Shard::attach_replica`])
//! is served to nobody. A standalone node attaches nothing, and its partitions are served as
//! they always were.

use std::collections::{HashMap, VecDeque};

use bytes::Bytes;
use futures::future::LocalBoxFuture;
use strand_protocol::batch::BatchHeader;
use strand_protocol::types::NodeId;
use strand_storage::producer::{ProducerCheck, ProducerError};

/// Who leads a partition's group, as this replica knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Leadership {
    /// The leader, if one is known.
    pub(crate) leader: Option<NodeId>,
    /// The Raft term, the partition's leader epoch.
    pub(crate) epoch: i32,
    /// This replica leads.
    pub(crate) is_local: bool,
}

/// Why a proposal was not committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ProposeError {
    /// Another replica leads (or none is known): `leadership` says who, for the client.
    NotLeader(Leadership),
    /// The outcome is unknown (the leader changed or the wait timed out): the client retries,
    /// an idempotent producer's retry being deduplicated by its sequence.
    Unknown(String),
}

/// When a write is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Acks {
    /// acks=1 (and 0, which nobody is told of): once durable in the leader's log.
    Leader,
    /// acks=all: once committed on a majority.
    All,
}

impl Acks {
    pub(crate) fn from_kafka(acks: i16) -> Acks {
        if acks == -1 {
            Acks::All
        } else {
            Acks::Leader
        }
    }
}

/// The side records a replica holds, `(Raft index, data)` in index order, once read.
pub(crate) type SideRecordsRead = LocalBoxFuture<'static, Result<Vec<(u64, Bytes)>, String>>;

/// A partition's replica, attached to the core's partition by the replication subsystem.
pub(crate) trait ReplicaHandle {
    /// Who leads, and the leader epoch.
    fn leadership(&self) -> Leadership;

    /// Proposes a validated batch, stamped as it is to be stored (LogAppendTime): resolves
    /// with its base offset once durable on the leader or committed on a majority (`acks`).
    /// Clients read it only once committed (the store's commit cap), whatever `acks`.
    fn propose(&self, batch: Bytes, acks: Acks) -> LocalBoxFuture<'static, Result<i64, ProposeError>>;

    /// Whether this replica's node heard lately from enough of the partition's other replicas
    /// to make a majority with itself. A leader cut off from its followers stays leader in its
    /// own eyes until a higher term reaches it (it cannot commit); what it answers from memory
    /// (a coordinator's state) may be stale meanwhile, and its clients would wait on it while
    /// the others elect a leader, so the core refuses their reads and writes.
    fn hears_a_majority(&self) -> bool;

    /// Resolves `true` once a majority of the partition's replicas acknowledged this replica as
    /// their leader, after the call (a Raft read-index round, bounded); `false` when it is not
    /// the leader, or no majority answered in time (a higher term learned this way ends the
    /// leadership).
    fn confirm_leadership(&self) -> LocalBoxFuture<'static, bool>;

    /// Proposes a side record (state a subsystem keeps beside the log, replicated through the
    /// partition's group; `keep_from`: the subsystem needs no record before that index any
    /// more): resolves with its Raft index once committed.
    fn propose_side(&self, keep_from: u64, data: Bytes)
        -> LocalBoxFuture<'static, Result<u64, ProposeError>>;

    /// Every side record this replica holds, `(Raft index, data)`, in index order.
    fn side_records(&self) -> SideRecordsRead;
}

/// What the leader does with a batch from an idempotent producer ([`InFlight::decide`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    /// In sequence: propose it.
    Propose,
    /// Already in the log at these offsets: answer with them once they are committed.
    Duplicate {
        first_offset: i64,
        last_offset: i64,
    },
    /// A retry of a batch proposed and not answered yet: the client retries later (then it is a
    /// duplicate, or was lost with a leader change and is in sequence again).
    InFlightRetry,
    Reject(ProducerError),
}

/// A proposed batch of an idempotent producer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Proposed {
    producer_id: i64,
    epoch: i16,
    first_seq: i32,
    last_seq: i32,
}

/// The batches of idempotent producers proposed on this leader and not answered yet.
///
/// The log's producer state sees a batch once the group has appended it, a moment after the
/// proposal; a producer with several requests in flight (up to five) sends the next batch
/// before then. So the leader checks a batch against the log's state *and* the producer's
/// proposals in flight: the next sequence follows the last one proposed, a retry of a batch
/// still in flight is told to retry, and a batch already in the log is a duplicate. Sequences
/// in flight are never accepted twice.
#[derive(Debug, Default)]
pub(crate) struct InFlight {
    by_producer: HashMap<i64, VecDeque<Proposed>>,
}

fn in_sequence(last_seq: i32, next_seq: i32) -> bool {
    next_seq == last_seq.wrapping_add(1) || (last_seq == i32::MAX && next_seq == 0)
}

impl InFlight {
    /// Decides what to do with `h`, given the log's own check of it (`logged`).
    pub(crate) fn decide(&self, h: &BatchHeader, logged: ProducerCheck) -> Decision {
        let from_log = |c: ProducerCheck| match c {
            ProducerCheck::Append => Decision::Propose,
            ProducerCheck::Duplicate {
                first_offset,
                last_offset,
            } => Decision::Duplicate {
                first_offset,
                last_offset,
            },
            ProducerCheck::Reject(e) => Decision::Reject(e),
        };
        if !h.has_producer_id() {
            return Decision::Propose;
        }
        let pid = h.producer_id;
        let first_seq = h.base_sequence;
        let last_seq = h.base_sequence.wrapping_add(h.last_offset_delta);
        let Some(tail) = self.by_producer.get(&pid).and_then(|q| q.back()) else {
            return from_log(logged);
        };
        let queued = &self.by_producer[&pid];
        if queued
            .iter()
            .any(|p| p.epoch == h.producer_epoch && p.first_seq == first_seq && p.last_seq == last_seq)
        {
            return Decision::InFlightRetry;
        }
        if let ProducerCheck::Duplicate { .. } = logged {
            return from_log(logged);
        }
        match h.producer_epoch.cmp(&tail.epoch) {
            std::cmp::Ordering::Less => Decision::Reject(ProducerError::FencedEpoch {
                producer_id: pid,
                epoch: h.producer_epoch,
                current: tail.epoch,
            }),
            std::cmp::Ordering::Equal if in_sequence(tail.last_seq, first_seq) => Decision::Propose,
            std::cmp::Ordering::Equal => Decision::Reject(ProducerError::OutOfOrder {
                producer_id: pid,
                epoch: h.producer_epoch,
                first_seq,
                last_seq: tail.last_seq,
            }),
            std::cmp::Ordering::Greater if first_seq == 0 => Decision::Propose,
            std::cmp::Ordering::Greater => Decision::Reject(ProducerError::NewEpochNotAtZero {
                producer_id: pid,
                epoch: h.producer_epoch,
                first_seq,
            }),
        }
    }

    /// Records a proposal of `h` (nothing for a batch without a producer id); pass the token
    /// to [`InFlight::answered`] when it is answered, whatever the answer.
    pub(crate) fn proposed(&mut self, h: &BatchHeader) -> Option<Proposed> {
        if !h.has_producer_id() {
            return None;
        }
        let p = Proposed {
            producer_id: h.producer_id,
            epoch: h.producer_epoch,
            first_seq: h.base_sequence,
            last_seq: h.base_sequence.wrapping_add(h.last_offset_delta),
        };
        self.by_producer.entry(p.producer_id).or_default().push_back(p);
        Some(p)
    }

    pub(crate) fn answered(&mut self, p: Proposed) {
        if let Some(q) = self.by_producer.get_mut(&p.producer_id) {
            if let Some(i) = q.iter().position(|x| *x == p) {
                q.remove(i);
            }
            if q.is_empty() {
                self.by_producer.remove(&p.producer_id);
            }
        }
    }

    /// Producers with batches in flight.
    #[cfg(test)]
    pub(crate) fn producers(&self) -> usize {
        self.by_producer.len()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use strand_protocol::batch::build::{batch_with_producer, TestRecord};

    use super::*;

    fn header(pid: i64, epoch: i16, seq: i32, records: usize) -> BatchHeader {
        let recs: Vec<TestRecord<'_>> = (0..records).map(|_| TestRecord::default()).collect();
        let bytes = batch_with_producer(&recs, 0, pid, epoch, seq);
        BatchHeader::parse(&bytes).unwrap()
    }

    #[test]
    fn pipelined_batches_follow_the_ones_in_flight_and_retries_are_never_accepted_twice() {
        let mut f = InFlight::default();
        // The first batch: the log knows nothing of the producer.
        let b0 = header(7, 0, 0, 2);
        assert_eq!(f.decide(&b0, ProducerCheck::Append), Decision::Propose);
        let t0 = f.proposed(&b0).unwrap();
        // The next one arrives before the group appended the first: the log would call it out
        // of order, the proposals in flight say it follows.
        let b1 = header(7, 0, 2, 1);
        let log_says = ProducerCheck::Reject(ProducerError::OutOfOrder {
            producer_id: 7,
            epoch: 0,
            first_seq: 2,
            last_seq: -1,
        });
        assert_eq!(f.decide(&b1, log_says), Decision::Propose);
        let t1 = f.proposed(&b1).unwrap();
        // A retry of either while in flight is not proposed again.
        assert_eq!(f.decide(&b0, ProducerCheck::Append), Decision::InFlightRetry);
        assert_eq!(f.decide(&b1, log_says), Decision::InFlightRetry);
        // A gap is refused, an older epoch fenced, a new epoch must start at 0.
        assert!(matches!(
            f.decide(&header(7, 0, 9, 1), ProducerCheck::Append),
            Decision::Reject(ProducerError::OutOfOrder { last_seq: 2, .. })
        ));
        assert!(matches!(
            f.decide(&header(7, 1, 3, 1), ProducerCheck::Append),
            Decision::Reject(ProducerError::NewEpochNotAtZero { .. })
        ));
        assert_eq!(
            f.decide(&header(7, 1, 0, 1), ProducerCheck::Append),
            Decision::Propose
        );
        // Once answered, the log's state decides again: a retry of a logged batch is a
        // duplicate with its offsets.
        f.answered(t0);
        f.answered(t1);
        assert_eq!(f.producers(), 0);
        let dup = ProducerCheck::Duplicate {
            first_offset: 0,
            last_offset: 1,
        };
        assert_eq!(
            f.decide(&b0, dup),
            Decision::Duplicate {
                first_offset: 0,
                last_offset: 1
            }
        );
        // Batches without a producer id are always proposed and never tracked.
        let plain = header(-1, -1, -1, 1);
        assert_eq!(f.decide(&plain, ProducerCheck::Append), Decision::Propose);
        assert!(f.proposed(&plain).is_none());
    }
}
