//! What this node's partition groups know of their leaders before the cluster metadata does.
//!
//! A partition's leader is elected by its Raft group, then reported to the active controller,
//! which records it; Metadata answers from the recorded state. Between the election and the
//! record (a report's round trip; seconds when the active controller was on the lost node and
//! the quorum elects first) the state still names the lost leader, and clients that ask for
//! metadata are sent back to it. The replicas here know better: a group's watcher that sees a
//! leader or a term newer than the state's tells every shard of the node ([`SeenLeader`],
//! batched per turn of the shard), and Metadata answers with it ([`LeaderView::newer`]). An
//! entry goes once the state records that epoch or a later one, or no longer has the partition.
//!
//! Only the partitions hosted here are known: a node without a replica of a partition answers
//! from the state. A term without a leader (an election under way) is not shown: the state's
//! leader stays until the winner is known, so that clients keep asking (librdkafka asks again
//! at once about a partition whose leader is down, but about one without a leader only at its
//! next refresh of unavailable topics).

use std::cell::RefCell;
use std::collections::HashMap;

use strand_protocol::types::{LeaderEpoch, NodeId, PartitionId, TopicId};

use crate::cluster::ClusterState;

/// A leadership a partition group here has seen: `leader` elected in term `epoch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SeenLeader {
    pub(crate) topic: TopicId,
    pub(crate) partition: PartitionId,
    pub(crate) leader: NodeId,
    pub(crate) epoch: LeaderEpoch,
}

/// One shard's copy of the leaderships seen here that are newer than the cluster state.
#[derive(Debug, Default)]
pub(crate) struct LeaderView {
    newer: RefCell<HashMap<(TopicId, PartitionId), (NodeId, LeaderEpoch)>>,
}

impl LeaderView {
    /// Keeps `seen` if it is newer than what `state` records and than what is kept; returns
    /// whether the state is behind it (whether other shards should hear of it).
    pub(crate) fn seen(&self, seen: SeenLeader, state: Option<&ClusterState>) -> bool {
        let recorded = state.and_then(|s| s.partition(seen.topic, seen.partition));
        let Some(recorded) = recorded else {
            return false;
        };
        if seen.epoch <= recorded.leader_epoch {
            return false;
        }
        let mut newer = self.newer.borrow_mut();
        let key = (seen.topic, seen.partition);
        if newer.get(&key).is_none_or(|&(_, epoch)| seen.epoch > epoch) {
            newer.insert(key, (seen.leader, seen.epoch));
        }
        true
    }

    /// Drops what `state` has caught up with: the entries of partitions whose recorded epoch
    /// reached theirs, or that it no longer has.
    pub(crate) fn state_changed(&self, state: &ClusterState) {
        self.newer.borrow_mut().retain(|(topic, partition), (_, epoch)| {
            state
                .partition(*topic, *partition)
                .is_some_and(|p| p.leader_epoch < *epoch)
        });
    }

    /// The leader and epoch to answer for a partition whose state records `recorded` epoch,
    /// when this node has seen a newer one.
    pub(crate) fn newer(
        &self,
        topic: TopicId,
        partition: PartitionId,
        recorded: LeaderEpoch,
    ) -> Option<(NodeId, LeaderEpoch)> {
        self.newer
            .borrow()
            .get(&(topic, partition))
            .copied()
            .filter(|(_, epoch)| *epoch > recorded)
    }

    /// How many are kept (a gauge).
    pub(crate) fn len(&self) -> usize {
        self.newer.borrow().len()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::cluster::record::{PartitionChange, PartitionEpoch};
    use crate::cluster::Record;
    use crate::replication::tests::{cluster_of, TOPIC};

    /// The replication tests' three-node state, its partition led by node 1 in `epoch`.
    fn at(epoch: i32) -> ClusterState {
        let addr = "127.0.0.1:9".parse().unwrap();
        let mut s = (*cluster_of(&[(1, addr), (2, addr), (3, addr)])).clone();
        s.apply(&Record::PartitionChange(PartitionChange {
            topic: TOPIC,
            partition: PartitionId(0),
            leader: Some(NodeId(1)),
            isr: (1..=3).map(NodeId).collect(),
            leader_epoch: LeaderEpoch(epoch),
            partition_epoch: PartitionEpoch(1),
            shards: None,
        }));
        s
    }

    fn seen(leader: i32, epoch: i32) -> SeenLeader {
        SeenLeader {
            topic: TOPIC,
            partition: PartitionId(0),
            leader: NodeId(leader),
            epoch: LeaderEpoch(epoch),
        }
    }

    #[test]
    fn a_leadership_newer_than_the_state_is_answered_until_the_state_records_it() {
        let (topic, p) = (TOPIC, PartitionId(0));
        let view = LeaderView::default();
        // Not newer than the state: nothing kept.
        assert!(!view.seen(seen(1, 3), Some(&at(3))));
        assert_eq!(view.newer(topic, p, LeaderEpoch(3)), None);
        assert!(view.seen(seen(2, 4), Some(&at(3))));
        assert_eq!(
            view.newer(topic, p, LeaderEpoch(3)),
            Some((NodeId(2), LeaderEpoch(4)))
        );
        // An older sighting arriving late changes nothing.
        assert!(view.seen(seen(3, 3), Some(&at(2))), "the state is behind it");
        assert_eq!(
            view.newer(topic, p, LeaderEpoch(3)),
            Some((NodeId(2), LeaderEpoch(4)))
        );
        // A state that records epoch 4 answers for itself; the entry goes.
        assert_eq!(view.newer(topic, p, LeaderEpoch(4)), None);
        view.state_changed(&at(4));
        assert_eq!(view.len(), 0);
        // A partition the state does not have is not kept.
        assert!(!view.seen(
            SeenLeader {
                partition: PartitionId(5),
                ..seen(2, 9)
            },
            Some(&at(4)),
        ));
        assert_eq!(view.len(), 0);
        // Nor anything without a state to compare with.
        assert!(!view.seen(seen(2, 9), None));
        assert_eq!(view.len(), 0);
    }
}
