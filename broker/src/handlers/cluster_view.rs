//! What Metadata and DescribeCluster answer on a node of a KRaft-configured cluster: the
//! committed [`ClusterState`] as this shard last took it, seen through the listener the request
//! arrived on.
//!
//! - Brokers: every live (unfenced) broker with its endpoint for that listener; a broker
//!   without the listener is left out, as Kafka leaves it out. A node that is not live in the
//!   state it has (not registered yet, its controller behind, or fenced) lists itself too, so a
//!   client that reached it keeps a broker to ask (librdkafka gives up on an answer without
//!   brokers); it leads nothing there, so clients only ask it for metadata.
//! - The controller id: Kafka's KRaft brokers answer a random live broker
//!   (`KRaftMetadataCache.getRandomAliveBrokerId`; clients cannot reach controllers, KIP-590, and
//!   any broker forwards admin requests). Here it is this node when it is live, else the live
//!   broker with the lowest id, so that the answer is stable; -1 when none is live.
//! - Partitions: leader (-1 and LEADER_NOT_AVAILABLE when there is none), leader epoch,
//!   replicas, ISR and offline replicas (replicas on fenced or unknown brokers). Where a
//!   replica on this node has seen a leader elected in a newer epoch than the state records (an
//!   election the controller has not recorded yet, `replication::leaders`), the leader and
//!   epoch are that.
//! - Leader endpoints (KIP-951): Produce and Fetch name the leaders of the partitions they
//!   answer NOT_LEADER_OR_FOLLOWER for, on the client's listener.

use kafka_protocol::messages::describe_cluster_response::DescribeClusterBroker;
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::{BrokerId, TopicName};
use kafka_protocol::ResponseError;
use strand_protocol::types::{LeaderEpoch, NodeId, PartitionId, TopicId};

use super::{str_bytes, RequestCtx};
use crate::cluster::{ClusterState, Endpoint, TopicState};
use crate::shard::AdvertisedListener;

/// The listener name the request arrived on.
pub(crate) fn listener_name(ctx: &RequestCtx) -> &str {
    ctx.shard
        .config
        .listeners
        .get(ctx.conn.listener)
        .map_or("PLAINTEXT", |l| l.name.as_str())
}

/// The controller id Metadata and DescribeCluster report (see the module documentation).
pub(crate) fn controller_id(state: &ClusterState, me: NodeId) -> i32 {
    if state.live_brokers().any(|b| b.id == me) {
        return me.0;
    }
    state.live_brokers().map(|b| b.id.0).min().unwrap_or(-1)
}

/// This node, as it advertises itself on the request's listener, when the state does not list
/// it live.
pub(crate) fn missing_self(
    state: &ClusterState,
    me: NodeId,
    advertised: &AdvertisedListener,
) -> Option<Endpoint> {
    if state.live_brokers().any(|b| b.id == me) {
        return None;
    }
    Some(Endpoint {
        listener: String::new(),
        host: advertised.host.clone(),
        port: advertised.port,
    })
}

/// The live brokers on `listener`, as Metadata lists them, and this node if it is missing.
pub(crate) fn metadata_brokers(
    state: &ClusterState,
    listener: &str,
    version: i16,
    me: (NodeId, Option<Endpoint>),
) -> Vec<MetadataResponseBroker> {
    let own = me.1.map(|e| {
        MetadataResponseBroker::default()
            .with_node_id(BrokerId(me.0 .0))
            .with_host(str_bytes(&e.host))
            .with_port(i32::from(e.port))
    });
    state
        .live_endpoints(listener)
        .map(|(id, e)| {
            let rack = state.broker(id).and_then(|b| b.rack.as_deref());
            MetadataResponseBroker::default()
                .with_node_id(BrokerId(id.0))
                .with_host(str_bytes(&e.host))
                .with_port(i32::from(e.port))
                .with_rack(if version >= 1 { rack.map(str_bytes) } else { None })
        })
        .chain(own)
        .collect()
}

/// Where a consumer group's coordinator is on a cluster node, as Kafka places it: the leader of
/// the group's partition of `__consumer_offsets` (`offsets_partitions` of them), on
/// `listener`; a leader a replica on this node saw elected in a newer epoch than the state
/// records goes first (`newer`), so that a group is found on its new coordinator without
/// waiting for the controller to record the election.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum GroupCoordinator {
    At(NodeId, Endpoint),
    /// The cluster has no `__consumer_offsets` yet: it is to be created.
    NoTopic,
    /// The partition has no live leader with the listener (an election, a dead broker).
    NoLeader,
}

pub(crate) fn group_coordinator(
    state: &ClusterState,
    listener: &str,
    offsets_partitions: i32,
    group: &str,
    newer: NewerLeader<'_>,
) -> GroupCoordinator {
    let Some(topic) = state.topic_by_name(crate::internal_topics::CONSUMER_OFFSETS) else {
        return GroupCoordinator::NoTopic;
    };
    let p = PartitionId(crate::group::partition_for(group, offsets_partitions));
    let leader = topic.partition(p).and_then(|r| {
        newer(topic.id, p, r.leader_epoch)
            .map(|(leader, _)| leader)
            .or(r.leader)
    });
    let endpoint = leader.and_then(|l| {
        state
            .live_endpoints(listener)
            .find(|(id, _)| *id == l)
            .map(|(id, e)| (id, e.clone()))
    });
    match endpoint {
        Some((id, e)) => GroupCoordinator::At(id, e),
        None => GroupCoordinator::NoLeader,
    }
}

/// The coordinator of a transactional id or share-partition key on a cluster node: the same
/// live broker for a key whichever node is asked (FNV-1a of the key over the live brokers with
/// the listener, by id); this node when none is live.
pub(crate) fn coordinator(state: &ClusterState, listener: &str, key: &str) -> Option<(NodeId, Endpoint)> {
    let live: Vec<(NodeId, &Endpoint)> = state.live_endpoints(listener).collect();
    if live.is_empty() {
        return None;
    }
    let hash = key.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let index = usize::try_from(hash % live.len() as u64).unwrap_or(0);
    live.get(index).map(|(id, e)| (*id, (*e).clone()))
}

/// The live brokers on `listener`, as DescribeCluster lists them, and this node if it is
/// missing.
pub(crate) fn cluster_brokers(
    state: &ClusterState,
    listener: &str,
    me: (NodeId, Option<Endpoint>),
) -> Vec<DescribeClusterBroker> {
    let own = me.1.map(|e| {
        DescribeClusterBroker::default()
            .with_broker_id(BrokerId(me.0 .0))
            .with_host(str_bytes(&e.host))
            .with_port(i32::from(e.port))
    });
    state
        .live_endpoints(listener)
        .map(|(id, e)| {
            let rack = state.broker(id).and_then(|b| b.rack.as_deref());
            DescribeClusterBroker::default()
                .with_broker_id(BrokerId(id.0))
                .with_host(str_bytes(&e.host))
                .with_port(i32::from(e.port))
                .with_rack(rack.map(str_bytes))
        })
        .chain(own)
        .collect()
}

fn ids(nodes: &[NodeId]) -> Vec<BrokerId> {
    nodes.iter().map(|n| BrokerId(n.0)).collect()
}

/// A leader of a partition this node has seen elected in a newer epoch than the state's: the
/// leader and the epoch.
pub(crate) type NewerLeader<'a> =
    &'a dyn Fn(TopicId, PartitionId, LeaderEpoch) -> Option<(NodeId, LeaderEpoch)>;

/// The leaders this node's replicas saw elected in a newer term than the cluster state records
/// (for a [`NewerLeader`]).
pub(crate) fn newer_leaders(
    ctx: &RequestCtx,
) -> impl Fn(TopicId, PartitionId, LeaderEpoch) -> Option<(NodeId, LeaderEpoch)> + 'static {
    let replication = ctx.subsystems.replication.clone();
    move |topic, partition, recorded| {
        replication
            .as_ref()
            .and_then(|r| r.manager.newer_leader(topic, partition, recorded))
    }
}

/// The coordinator of `group` as FindCoordinator (key type GROUP) answers it on this node: the
/// leader of the group's `__consumer_offsets` partition ([`group_coordinator`]).
pub(crate) fn group_coordinator_of(ctx: &RequestCtx, state: &ClusterState, group: &str) -> GroupCoordinator {
    let offsets_partitions = i32::try_from(ctx.shard.config.offsets_topic_num_partitions).unwrap_or(50);
    let newer = newer_leaders(ctx);
    group_coordinator(state, listener_name(ctx), offsets_partitions, group, &newer)
}

/// A topic of the cluster state as Metadata describes it, with the newer leaderships this node
/// has seen.
pub(crate) fn describe_topic(
    state: &ClusterState,
    t: &TopicState,
    version: i16,
    newer: NewerLeader<'_>,
) -> MetadataResponseTopic {
    let partitions = (0..t.partitions.len())
        .filter_map(|i| {
            let index = i32::try_from(i).ok()?;
            let mut view = state.partition_view(t.id, PartitionId(index))?;
            if let Some((leader, epoch)) = newer(t.id, PartitionId(index), view.leader_epoch) {
                view.leader = Some(leader);
                view.leader_epoch = epoch;
            }
            let error = if view.leader.is_none() {
                ResponseError::LeaderNotAvailable.code()
            } else {
                0
            };
            Some(
                MetadataResponsePartition::default()
                    .with_error_code(error)
                    .with_partition_index(index)
                    .with_leader_id(BrokerId(view.leader.map_or(-1, |n| n.0)))
                    .with_leader_epoch(if version >= 7 { view.leader_epoch.0 } else { -1 })
                    .with_replica_nodes(ids(&view.replicas))
                    .with_isr_nodes(ids(&view.isr))
                    .with_offline_replicas(if version >= 5 {
                        ids(&view.offline_replicas)
                    } else {
                        Vec::new()
                    }),
            )
        })
        .collect();
    MetadataResponseTopic::default()
        .with_name(Some(TopicName(str_bytes(&t.name))))
        .with_topic_id(if version >= 10 { t.id.0 } else { uuid::Uuid::nil() })
        .with_is_internal(version >= 1 && crate::internal_topics::is_internal(&t.name))
        .with_topic_authorized_operations(strand_protocol::acl::NOT_REQUESTED)
        .with_partitions(partitions)
}

/// A leader's endpoint for KIP-951's `node_endpoints`.
pub(crate) struct LeaderEndpoint {
    pub(crate) node: i32,
    pub(crate) host: String,
    pub(crate) port: u16,
    pub(crate) rack: Option<String>,
}

/// The endpoints, on the listener the client is connected to, of the leaders named in
/// NOT_LEADER_OR_FOLLOWER answers (KIP-951), from the cluster metadata; each once.
pub(crate) fn leader_endpoints(ctx: &RequestCtx, mut leaders: Vec<i32>) -> Vec<LeaderEndpoint> {
    leaders.sort_unstable();
    leaders.dedup();
    let Some(state) = ctx.shard.cluster_state() else {
        return Vec::new();
    };
    let Some(listener) = ctx.shard.config.listeners.get(ctx.conn.listener) else {
        return Vec::new();
    };
    leaders
        .into_iter()
        .filter_map(|id| {
            let b = state.broker(strand_protocol::types::NodeId(id))?;
            let e = b.endpoint(&listener.name)?;
            Some(LeaderEndpoint {
                node: id,
                host: e.host.clone(),
                port: e.port,
                rack: b.rack.clone(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use strand_protocol::types::{ShardId, TopicId};

    use super::*;
    use crate::cluster::record::{Endpoint, IncarnationId, PartitionEpoch, PartitionRecord, RegisterBroker};
    use crate::cluster::{BrokerEpoch, Record, Replica};

    fn state() -> ClusterState {
        let mut s = ClusterState::default();
        for id in 1..=3 {
            s.apply(&Record::RegisterBroker(RegisterBroker {
                broker: NodeId(id),
                incarnation: IncarnationId(uuid::Uuid::from_u128(id as u128)),
                epoch: BrokerEpoch(i64::try_from(s.next_offset().0).unwrap()),
                endpoints: vec![Endpoint {
                    listener: "PLAINTEXT".into(),
                    host: format!("h{id}"),
                    port: 9000 + id as u16,
                }],
                rack: None,
                shards: 1,
            }));
        }
        for id in [1, 2] {
            let epoch = s.broker(NodeId(id)).unwrap().epoch;
            s.apply(&Record::BrokerUnfenced {
                broker: NodeId(id),
                epoch,
            });
        }
        let topic = TopicId(uuid::Uuid::from_u128(7));
        s.apply(&Record::Topic {
            name: "t".into(),
            id: topic,
        });
        for (p, leader) in [(0, Some(NodeId(2))), (1, None)] {
            let replica = if leader.is_some() { NodeId(2) } else { NodeId(3) };
            s.apply(&Record::Partition(PartitionRecord {
                topic,
                partition: PartitionId(p),
                replicas: vec![Replica {
                    broker: replica,
                    shard: ShardId(0),
                }],
                isr: vec![replica],
                leader,
                leader_epoch: strand_protocol::types::LeaderEpoch(0),
                partition_epoch: PartitionEpoch(0),
            }));
        }
        s
    }

    #[test]
    fn a_group_is_coordinated_by_the_live_leader_of_its_offsets_partition() {
        let mut s = state();
        let none = |_: TopicId, _: PartitionId, _: LeaderEpoch| None;
        assert_eq!(
            group_coordinator(&s, "PLAINTEXT", 2, "g", &none),
            GroupCoordinator::NoTopic
        );
        // Partition 0 led by the live broker 2, partition 1 without a leader.
        let offsets = TopicId(uuid::Uuid::from_u128(8));
        s.apply(&Record::Topic {
            name: crate::internal_topics::CONSUMER_OFFSETS.into(),
            id: offsets,
        });
        for (p, leader) in [(0, Some(NodeId(2))), (1, None)] {
            s.apply(&Record::Partition(PartitionRecord {
                topic: offsets,
                partition: PartitionId(p),
                replicas: [1, 2, 3]
                    .map(|b| Replica {
                        broker: NodeId(b),
                        shard: ShardId(0),
                    })
                    .to_vec(),
                isr: vec![NodeId(1), NodeId(2)],
                leader,
                leader_epoch: strand_protocol::types::LeaderEpoch(0),
                partition_epoch: PartitionEpoch(0),
            }));
        }
        let in_partition = |p: i32| {
            (0..)
                .map(|i| format!("group-{i}"))
                .find(|g| crate::group::partition_for(g, 2) == p)
                .unwrap()
        };
        let (g0, g1) = (in_partition(0), in_partition(1));
        let at = |id: i32| {
            GroupCoordinator::At(
                NodeId(id),
                Endpoint {
                    listener: "PLAINTEXT".into(),
                    host: format!("h{id}"),
                    port: 9000 + id as u16,
                },
            )
        };
        assert_eq!(group_coordinator(&s, "PLAINTEXT", 2, &g0, &none), at(2));
        assert_eq!(
            group_coordinator(&s, "PLAINTEXT", 2, &g1, &none),
            GroupCoordinator::NoLeader
        );
        assert_eq!(
            group_coordinator(&s, "OTHER", 2, &g0, &none),
            GroupCoordinator::NoLeader
        );
        // A leader this node saw elected after the state's record goes first.
        let seen = |t: TopicId, p: PartitionId, recorded: LeaderEpoch| {
            (t == offsets && p == PartitionId(1) && recorded.0 == 0).then_some((NodeId(1), LeaderEpoch(1)))
        };
        assert_eq!(group_coordinator(&s, "PLAINTEXT", 2, &g1, &seen), at(1));
    }

    #[test]
    fn live_brokers_on_the_listener_and_a_stable_controller_id() {
        let s = state();
        let brokers = metadata_brokers(&s, "PLAINTEXT", 12, (NodeId(1), None));
        let listed: Vec<i32> = brokers.iter().map(|b| b.node_id.0).collect();
        assert_eq!(listed, vec![1, 2], "the fenced broker 3 is not listed");
        assert_eq!(brokers[1].port, 9002);
        assert!(metadata_brokers(&s, "OTHER", 12, (NodeId(1), None)).is_empty());
        // A node the state does not list live lists itself.
        let own = AdvertisedListener {
            host: "me".into(),
            port: 1,
        };
        assert!(missing_self(&s, NodeId(1), &own).is_none());
        let me = missing_self(&s, NodeId(3), &own);
        let brokers = metadata_brokers(&s, "PLAINTEXT", 12, (NodeId(3), me));
        let listed: Vec<i32> = brokers.iter().map(|b| b.node_id.0).collect();
        assert_eq!(listed, vec![1, 2, 3]);
        assert_eq!(brokers[2].host.as_str(), "me");
        assert_eq!(controller_id(&s, NodeId(2)), 2);
        assert_eq!(
            controller_id(&s, NodeId(3)),
            1,
            "a fenced node names the lowest live one"
        );
        assert_eq!(controller_id(&ClusterState::default(), NodeId(1)), -1);
    }

    #[test]
    fn a_key_has_one_coordinator_among_the_live_brokers() {
        let s = state();
        let picks: BTreeSet<i32> = (0..64)
            .map(|i| coordinator(&s, "PLAINTEXT", &format!("group-{i}")).unwrap().0 .0)
            .collect();
        assert_eq!(
            picks,
            [1, 2].into(),
            "spread over the live brokers, never the fenced one"
        );
        assert_eq!(
            coordinator(&s, "PLAINTEXT", "g").map(|c| c.0),
            coordinator(&s.clone(), "PLAINTEXT", "g").map(|c| c.0)
        );
        assert!(coordinator(&s, "OTHER", "g").is_none());
    }

    fn none(_: TopicId, _: PartitionId, _: LeaderEpoch) -> Option<(NodeId, LeaderEpoch)> {
        None
    }

    #[test]
    fn partitions_show_leader_epoch_isr_and_offline_replicas() {
        let s = state();
        let t = s.topic_by_name("t").unwrap();
        let d = describe_topic(&s, t, 12, &none);
        assert_eq!(d.partitions.len(), 2);
        let p0 = &d.partitions[0];
        assert_eq!((p0.error_code, p0.leader_id.0, p0.leader_epoch), (0, 2, 0));
        assert_eq!(p0.isr_nodes, vec![BrokerId(2)]);
        let p1 = &d.partitions[1];
        assert_eq!(p1.isr_nodes, vec![BrokerId(3)], "the last ISR member stays");
        assert_eq!(p1.error_code, ResponseError::LeaderNotAvailable.code());
        assert_eq!(p1.leader_id.0, -1);
        assert_eq!(p1.offline_replicas, vec![BrokerId(3)]);
        // Versions without the fields keep their defaults.
        let old = describe_topic(&s, t, 4, &none);
        assert!(old.partitions[1].offline_replicas.is_empty());
        assert_eq!(old.partitions[0].leader_epoch, -1);
        assert_eq!(describe_topic(&s, t, 7, &none).partitions[0].leader_epoch, 0);
    }

    /// A leader a replica here has seen elected in a newer epoch than the state's is what
    /// Metadata answers (the controller has not recorded the election yet).
    #[test]
    fn partitions_show_a_newer_leader_seen_here() {
        let s = state();
        let t = s.topic_by_name("t").unwrap();
        let seen = |_: TopicId, p: PartitionId, recorded: LeaderEpoch| {
            (p.0 == 1).then_some((NodeId(2), LeaderEpoch(recorded.0 + 1)))
        };
        let d = describe_topic(&s, t, 12, &seen);
        let p0 = &d.partitions[0];
        assert_eq!((p0.error_code, p0.leader_id.0, p0.leader_epoch), (0, 2, 0));
        let p1 = &d.partitions[1];
        assert_eq!((p1.error_code, p1.leader_id.0, p1.leader_epoch), (0, 2, 1));
    }
}
