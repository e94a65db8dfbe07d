//! The openraft type configuration of a partition's Raft group.

use std::cmp::Ordering;
use std::fmt;
use std::marker::PhantomData;

use bytes::Bytes;
use openraft::impls::leader_id_std;
use openraft::impls::{BoxedErrorSource, EntryPayload, InlineBatch, ProgressResponder, Vote};
use openraft::{AsyncRuntime, OptionalSend, RaftTypeConfig};
use strand_protocol::types::{NodeId, Offset};

/// A replica's broker: Kafka's `node.id`, widened to the `u64` openraft counts with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct BrokerId(pub u64);

impl BrokerId {
    /// The broker id as Kafka names it; `None` for ids Kafka cannot express (above `i32::MAX`).
    pub fn as_node_id(self) -> Option<NodeId> {
        i32::try_from(self.0).ok().map(NodeId)
    }

    /// A Kafka node id as a replica id; `None` for negative ids (Kafka's "no node").
    pub fn from_node_id(id: NodeId) -> Option<BrokerId> {
        u64::try_from(id.0).ok().map(BrokerId)
    }
}

impl fmt::Display for BrokerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl From<u64> for BrokerId {
    fn from(id: u64) -> Self {
        BrokerId(id)
    }
}

/// The application data of a partition's Raft entry: one Kafka v2 record batch, validated by
/// the produce path before it is proposed. Its `baseOffset` and `partitionLeaderEpoch` are
/// rewritten where it is stored; everything the CRC covers is stored as received.
#[derive(Clone, PartialEq, Eq)]
pub struct KafkaBatch(pub Bytes);

impl fmt::Debug for KafkaBatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KafkaBatch({} bytes)", self.0.len())
    }
}

impl fmt::Display for KafkaBatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// A side record: state that a subsystem keeps beside a partition's log (a queue's delivery
/// records) and replicates through the partition's own Raft group, so that it is ordered with
/// the partition's batches and never committed before the batches it was written after. It takes
/// a Raft index but no Kafka offset; the log underneath stores it beside the partition log (see
/// [`super::replica_log::ReplicaLog::append_side`]). Its data is opaque to Raft; `keep_from`
/// is the subsystem's word that it needs no side record before that index any more, which every
/// replica acts on once the record is committed ([`super::replica_log::ReplicaLog::trim_side`]).
#[derive(Clone, PartialEq, Eq)]
pub struct SideRecord {
    pub keep_from: u64,
    pub data: Bytes,
}

impl fmt::Debug for SideRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "SideRecord(keep from {}, {} bytes)",
            self.keep_from,
            self.data.len()
        )
    }
}

/// The application data of a partition's Raft entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryData {
    /// A record batch of the partition's Kafka log.
    Batch(KafkaBatch),
    /// A record kept beside the log.
    Side(SideRecord),
}

impl fmt::Display for EntryData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

impl From<KafkaBatch> for EntryData {
    fn from(b: KafkaBatch) -> Self {
        EntryData::Batch(b)
    }
}

impl From<SideRecord> for EntryData {
    fn from(r: SideRecord) -> Self {
        EntryData::Side(r)
    }
}

/// What applying an entry answers its proposer: where a batch landed in the Kafka log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// A record batch, now committed, whose first record has this offset.
    Batch { base_offset: Offset },
    /// A side record, now committed at this Raft index.
    Side { index: u64 },
    /// A Raft-internal entry (a leader's blank entry, a membership change): no Kafka offset.
    Internal,
}

/// The type configuration of a partition's Raft group, for a runtime `Rt` (glommio in the
/// broker, the simulation runtime in tests).
///
/// Terms are Kafka leader epochs, so standard Raft leader ids (one leader per term) are used:
/// a committed log id is `(term, index)`, which is what a stored batch can carry
/// (`partitionLeaderEpoch` holds the term; the index is kept beside the log, see
/// [`super::entry_map`]).
pub struct PartitionRaft<Rt>(PhantomData<fn() -> Rt>);

impl<Rt> fmt::Debug for PartitionRaft<Rt> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PartitionRaft")
    }
}

impl<Rt> Clone for PartitionRaft<Rt> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<Rt> Copy for PartitionRaft<Rt> {}

impl<Rt> Default for PartitionRaft<Rt> {
    fn default() -> Self {
        PartitionRaft(PhantomData)
    }
}

impl<Rt> PartialEq for PartitionRaft<Rt> {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl<Rt> Eq for PartitionRaft<Rt> {}

impl<Rt> PartialOrd for PartitionRaft<Rt> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<Rt> Ord for PartitionRaft<Rt> {
    fn cmp(&self, _: &Self) -> Ordering {
        Ordering::Equal
    }
}

impl<Rt: AsyncRuntime> RaftTypeConfig for PartitionRaft<Rt> {
    type D = EntryData;
    type R = Applied;
    type NodeId = BrokerId;
    /// Addresses come from the cluster metadata, not from Raft membership.
    type Node = ();
    type Term = u64;
    type LeaderId = leader_id_std::LeaderId<u64, BrokerId>;
    type Vote = Vote<Self::LeaderId>;
    type Payload = EntryPayload<EntryData, BrokerId, ()>;
    type Entry = openraft::Entry<<Self::LeaderId as openraft::vote::RaftLeaderId>::Committed, Self::Payload>;
    type AsyncRuntime = Rt;
    type Responder<T>
        = ProgressResponder<Self, T>
    where
        T: OptionalSend + 'static;
    type Batch<T>
        = InlineBatch<T>
    where
        T: OptionalSend + 'static;
    type ErrorSource = BoxedErrorSource;
}

/// A committed log id of a partition group: `(term, index)`.
pub type PartitionLogId = openraft::LogId<openraft::vote::leader_id_std::CommittedLeaderId<u64>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broker_ids_convert_only_where_kafka_can_name_them() {
        assert_eq!(BrokerId(3).as_node_id(), Some(NodeId(3)));
        assert_eq!(BrokerId(u64::from(u32::MAX)).as_node_id(), None);
        assert_eq!(BrokerId::from_node_id(NodeId(-1)), None);
        assert_eq!(BrokerId::from_node_id(NodeId(7)), Some(BrokerId(7)));
    }
}
