//! How a KRaft-configured node's shards reach its cluster part ([`ClusterNode`], on shard 0).
//!
//! Shard 0 starts the node ([`start`]); every shard registers a [`ClusterLink`] service. The
//! node's newest committed [`ClusterState`] reaches each shard as an owned clone carried by a
//! service call from shard 0 (`Publish`), which the shard takes with
//! `Shard::set_cluster_state`. A handler on any shard asks the active controller through its
//! shard's link ([`control`]): the request crosses to shard 0, whose node sends it on.
//!
//! Topics of the state become the node's local metadata ([`deltas`]): shard 0 turns each newer
//! state into `MetadataDelta`s against its metadata replica (topics created, deleted, grown,
//! reconfigured) and applies them on every shard through `broadcast_metadata`, after every
//! shard has taken the state itself, so each shard opens the logs of the replicas this node
//! hosts (`Shard::hosts`), leader or follower, and produce, fetch and groups work on them as on
//! any topic. Topics the node did not take from the state (a former standalone node's topics) are
//! never deleted, and a cluster topic whose name such a topic holds is not opened here
//! (logged). `__consumer_offsets` is the cluster's: the first FindCoordinator for a group has
//! it created ([`create_offsets_topic`]), and a node-local one left by an earlier version is
//! removed at start-up. Group config overrides follow the state's as well. The local metadata of cluster topics is not persisted: after a
//! restart the node learns them again from the quorum.
//!
//! A standalone node starts no cluster node and registers no link.

use std::cell::RefCell;
use std::collections::HashSet;
use std::rc::{Rc, Weak};

use futures::future::LocalBoxFuture;
use futures::FutureExt;
use kafka_protocol::ResponseError;
use strand_protocol::types::{LeaderEpoch, NodeId, PartitionId, ShardId, TopicId};
use strand_storage::notify::Notify;

use crate::cluster::control::{AlterPartition, AlterPartitionReply, CreateTopic, IsrMember, LeaderElected};
use crate::cluster::node::{BrokerInfo, ClusterNode};
use crate::cluster::record::ConfigResource;
use crate::cluster::record::Endpoint;
use crate::cluster::record::{BrokerEpoch, PartitionEpoch};
use crate::cluster::rpc::{ControlReply, ControlRequest};
use crate::cluster::ClusterState;
use crate::config::{GroupConfig, TopicConfig};
use crate::internal_topics::is_internal;
use crate::metadata::{AdminError, ClusterMetadata, MetadataDelta, TopicMeta};
use crate::replication::{LeaderReports, Report};
use crate::shard::service::Service;
use crate::shard::Shard;

/// What one shard's link is asked.
pub(crate) enum LinkRequest {
    /// A newer committed state, from shard 0.
    Publish(Box<ClusterState>),
    /// A request for the active controller (served on shard 0).
    Control(ControlRequest),
    /// A partition leader's AlterPartition, completed with this broker's id and epoch on
    /// shard 0.
    ReportPartition(PartitionReport),
    /// A partition group's election won on this node, completed with this broker's id and
    /// epoch on shard 0.
    ReportLeader {
        topic: TopicId,
        partition: PartitionId,
        leader_epoch: LeaderEpoch,
    },
    /// The next producer id of this node, from its block (a new block from the active
    /// controller when it is used up), on shard 0.
    ProducerId,
}

/// What a partition's leader reports to the controller (AlterPartition, KIP-497/KIP-903).
pub(crate) struct PartitionReport {
    pub(crate) topic: TopicId,
    pub(crate) partition: PartitionId,
    /// The leader epoch the leader leads in.
    pub(crate) leader_epoch: LeaderEpoch,
    /// The partition epoch of the registration the leader last saw.
    pub(crate) partition_epoch: PartitionEpoch,
    /// The new ISR, each member with the broker epoch the leader saw (or `None`).
    pub(crate) isr: Vec<IsrMember>,
}

/// What it answers.
pub(crate) enum LinkResponse {
    Published,
    Control(Result<ControlReply, String>),
    ProducerId(Result<i64, AdminError>),
}

/// One shard's end of the link.
pub(crate) struct ClusterLink {
    shard: Weak<Shard>,
    /// Shard 0's node.
    node: RefCell<Option<Rc<ClusterNode>>>,
    /// On shard 0: the producer ids of this node's block not handed out yet (next, end), and
    /// one block request at a time.
    producer_ids: std::cell::Cell<(i64, i64)>,
    producer_ids_lock: glommio::sync::Semaphore,
}

impl ClusterLink {
    pub(crate) fn new(shard: &Rc<Shard>) -> Rc<ClusterLink> {
        let link = Rc::new(ClusterLink {
            shard: Rc::downgrade(shard),
            node: RefCell::new(None),
            producer_ids: std::cell::Cell::new((0, 0)),
            producer_ids_lock: glommio::sync::Semaphore::new(1),
        });
        shard.serve(&link);
        link
    }
}

impl ClusterLink {
    /// Sends the request `build` makes with this broker's id and epoch to the active
    /// controller (on shard 0, whose node knows them).
    fn call_as_broker(
        &self,
        build: impl FnOnce(NodeId, BrokerEpoch) -> ControlRequest + 'static,
    ) -> LocalBoxFuture<'static, LinkResponse> {
        let node = self.node.borrow().clone();
        async move {
            let Some(node) = node else {
                return LinkResponse::Control(Err("this shard runs no cluster node".into()));
            };
            let Some(epoch) = node.broker_epoch() else {
                return LinkResponse::Control(Err("this broker is not registered yet".into()));
            };
            let req = build(node.id(), epoch);
            LinkResponse::Control(node.client().call(&req).await)
        }
        .boxed_local()
    }

    /// The next producer id from this node's block; a used-up block is replaced by the active
    /// controller's next one (AllocateProducerIds), so that no two nodes, and no node before
    /// and after a restart, hand out the same id.
    async fn next_producer_id(&self) -> Result<i64, AdminError> {
        let unavailable = |m: String| AdminError::new(ResponseError::CoordinatorNotAvailable, m);
        let Ok(_permit) = self.producer_ids_lock.acquire_permit(1).await else {
            return Err(unavailable("the node is stopping".into()));
        };
        let (next, end) = self.producer_ids.get();
        if next < end {
            self.producer_ids.set((next + 1, end));
            return Ok(next);
        }
        let node = self.node.borrow().clone();
        let Some(node) = node else {
            return Err(unavailable("this shard runs no cluster node".into()));
        };
        let Some(broker_epoch) = node.broker_epoch() else {
            return Err(unavailable("this broker is not registered yet".into()));
        };
        let req = ControlRequest::AllocateProducerIds {
            broker: node.id(),
            broker_epoch,
        };
        match node.client().call(&req).await {
            Ok(ControlReply::ProducerIds(b)) => {
                self.producer_ids.set((b.first + 1, b.first + b.len));
                Ok(b.first)
            }
            Ok(ControlReply::Refused { code, message }) => Err(ControlReply::admin_error(code, &message)),
            Ok(other) => Err(unavailable(format!("AllocateProducerIds answered {other:?}"))),
            Err(message) => Err(unavailable(message)),
        }
    }
}

impl Service for ClusterLink {
    type Request = LinkRequest;
    type Response = LinkResponse;

    fn start(self: Rc<Self>, req: LinkRequest) -> LocalBoxFuture<'static, LinkResponse> {
        match req {
            LinkRequest::Publish(state) => {
                if let Some(shard) = self.shard.upgrade() {
                    shard.set_cluster_state(Rc::new(*state));
                }
                async { LinkResponse::Published }.boxed_local()
            }
            LinkRequest::ReportPartition(r) => self.call_as_broker(move |broker, broker_epoch| {
                ControlRequest::AlterPartition(AlterPartition {
                    broker,
                    broker_epoch,
                    topic: r.topic,
                    partition: r.partition,
                    leader_epoch: r.leader_epoch,
                    partition_epoch: r.partition_epoch,
                    new_isr: r.isr,
                })
            }),
            LinkRequest::ReportLeader {
                topic,
                partition,
                leader_epoch,
            } => self.call_as_broker(move |broker, broker_epoch| {
                ControlRequest::LeaderElected(LeaderElected {
                    broker,
                    broker_epoch,
                    topic,
                    partition,
                    leader_epoch,
                })
            }),
            LinkRequest::ProducerId => {
                let me = Rc::clone(&self);
                async move { LinkResponse::ProducerId(me.next_producer_id().await) }.boxed_local()
            }
            LinkRequest::Control(req) => {
                let node = self.node.borrow().clone();
                async move {
                    LinkResponse::Control(match node {
                        Some(node) => node.client().call(&req).await,
                        None => Err("this shard runs no cluster node".into()),
                    })
                }
                .boxed_local()
            }
        }
    }
}

/// Starts the cluster node on shard 0 (`shard`), publishing every newer state to all shards.
pub(crate) fn start(shard: &Rc<Shard>, link: &Rc<ClusterLink>) -> Rc<ClusterNode> {
    assert_eq!(shard.id, ShardId(0), "the cluster node runs on shard 0");
    let config = Rc::clone(&shard.config);
    let endpoints: Vec<Endpoint> = config
        .listeners
        .iter()
        .zip(shard.listeners.iter())
        .map(|(l, a)| Endpoint {
            listener: l.name.clone(),
            host: a.host.clone(),
            port: a.port,
        })
        .collect();
    let info = BrokerInfo {
        endpoints,
        rack: config.cluster.rack.clone(),
        shards: shard.shards,
    };
    // The newest state waiting to be applied; one task applies states in order.
    let latest = Rc::new(Latest::default());
    let slot = Rc::clone(&latest);
    let publish: Rc<dyn Fn(&ClusterState)> = Rc::new(move |state: &ClusterState| {
        *slot.state.borrow_mut() = Some(state.clone());
        slot.published.notify_all();
    });
    glommio::spawn_local(apply_states(Rc::downgrade(shard), latest)).detach();
    let clock = Rc::clone(&shard.clock);
    let node = ClusterNode::start(
        config,
        Rc::clone(&shard.store),
        info,
        Rc::new(move || clock.now_ms()),
        publish,
    );
    *link.node.borrow_mut() = Some(Rc::clone(&node));
    node
}

/// The newest published state not yet applied.
#[derive(Default)]
struct Latest {
    state: RefCell<Option<ClusterState>>,
    published: Notify,
}

/// Applies each newer state on every shard: the state itself, then the metadata deltas it
/// implies.
async fn apply_states(shard: Weak<Shard>, latest: Rc<Latest>) {
    // The topics this process took from the cluster state (only those are ever deleted).
    let mut learned: HashSet<TopicId> = HashSet::new();
    loop {
        let published = latest.published.wait();
        let Some(state) = latest.state.borrow_mut().take() else {
            published.await;
            continue;
        };
        let Some(shard) = shard.upgrade() else { return };
        let mut calls = Vec::new();
        for s in 1..shard.shards {
            calls.push(shard.ask::<ClusterLink>(ShardId(s), LinkRequest::Publish(Box::new(state.clone()))));
        }
        shard.set_cluster_state(Rc::new(state.clone()));
        futures::future::join_all(calls).await;
        let changes = deltas(&shard.metadata(), &state, &learned);
        if changes.is_empty() {
            continue;
        }
        for d in &changes {
            if let MetadataDelta::CreateTopic(t) = d {
                learned.insert(t.id);
            }
        }
        let problems = crate::shard::broadcast_metadata(&shard, changes).await;
        for p in problems {
            tracing::error!(problem = %p, "applying the cluster's topics");
        }
    }
}

/// The metadata deltas that make the local metadata `local` hold the topics of `state` (see
/// the module documentation). Only topics taken from the cluster state (`learned`) are ever
/// deleted: a topic the node had before it joined a cluster (a standalone node's, kept in its
/// `strand-metadata.json`) keeps its data, and a cluster topic of the same name is not opened
/// here (logged).
pub(crate) fn deltas(
    local: &ClusterMetadata,
    state: &ClusterState,
    learned: &HashSet<TopicId>,
) -> Vec<MetadataDelta> {
    let mut out = Vec::new();
    let mut deleted = HashSet::new();
    for t in local.topics() {
        let keep = match state.topic_by_name(&t.name) {
            Some(c) => c.id == t.id,
            None => false,
        };
        if !keep && learned.contains(&t.id) {
            deleted.insert(t.name.as_str());
            out.push(MetadataDelta::DeleteTopic {
                name: t.name.clone(),
                id: t.id,
            });
        }
    }
    for c in state.topics() {
        let mut config = TopicConfig::default();
        for (k, v) in state
            .configs(&ConfigResource::Topic(c.name.clone()))
            .into_iter()
            .flatten()
        {
            if let Err(e) = config.set(k, v) {
                tracing::warn!(topic = %c.name, key = %k, error = %e, "a topic config the broker does not take");
            }
        }
        let partitions = i32::try_from(c.partitions.len()).unwrap_or(i32::MAX);
        if let Some(t) = local.topic(&c.name) {
            if t.id != c.id && !deleted.contains(c.name.as_str()) {
                tracing::error!(topic = %c.name, "the node has a topic of this name from before it joined the cluster: the cluster's topic is not served here");
                continue;
            }
        }
        match local.topic(&c.name).filter(|t| t.id == c.id) {
            None => out.push(MetadataDelta::CreateTopic(TopicMeta {
                name: c.name.clone(),
                id: c.id,
                partitions,
                config,
                internal: is_internal(&c.name),
            })),
            Some(t) => {
                if partitions > t.partitions {
                    out.push(MetadataDelta::SetPartitionCount {
                        name: c.name.clone(),
                        partitions,
                    });
                }
                if t.config != config {
                    out.push(MetadataDelta::SetTopicConfig {
                        name: c.name.clone(),
                        config,
                    });
                }
            }
        }
    }
    // Group configs: as the state has them; a group it has none for has none here either.
    for (resource, entries) in state.config_resources() {
        let ConfigResource::Group(group) = resource else {
            continue;
        };
        let mut config = GroupConfig::default();
        for (k, v) in entries {
            if let Err(e) = config.set(k, v) {
                tracing::warn!(%group, key = %k, error = %e, "a group config the broker does not take");
            }
        }
        if local.group_config(group) != Some(&config) {
            out.push(MetadataDelta::SetGroupConfig {
                group: group.clone(),
                config,
            });
        }
    }
    for (group, _) in local.group_configs() {
        if state.configs(&ConfigResource::Group(group.to_owned())).is_none() {
            out.push(MetadataDelta::SetGroupConfig {
                group: group.to_owned(),
                config: GroupConfig::default(),
            });
        }
    }
    out
}

/// Sends `req` to the active controller from any shard (through shard 0's node).
pub(crate) async fn control(shard: &Rc<Shard>, req: ControlRequest) -> Result<ControlReply, String> {
    match shard
        .ask::<ClusterLink>(ShardId(0), LinkRequest::Control(req))
        .await
    {
        Some(LinkResponse::Control(r)) => r,
        Some(LinkResponse::Published | LinkResponse::ProducerId(_)) | None => {
            Err("the cluster node did not answer".into())
        }
    }
}

/// Sends a decision to the active controller: `Ok` with its answer, or the refusal as the
/// broker's error (a controller that could not be reached is NOT_CONTROLLER, retriable).
pub(crate) async fn decide(shard: &Rc<Shard>, req: ControlRequest) -> Result<ControlReply, AdminError> {
    match control(shard, req).await {
        Ok(ControlReply::Refused { code, message }) => Err(ControlReply::admin_error(code, &message)),
        Ok(ControlReply::Failed { message }) | Err(message) => {
            Err(AdminError::new(ResponseError::NotController, message))
        }
        Ok(ControlReply::NotController { .. }) => Err(AdminError::new(
            ResponseError::NotController,
            "No active controller answered.",
        )),
        Ok(reply) => Ok(reply),
    }
}

/// Reports a partition's leader and ISR to the active controller (AlterPartition), from any
/// shard: the replication layer calls it when a leader shrinks or expands its ISR. Answers the
/// partition as the controller now has it; a refusal (FENCED_LEADER_EPOCH,
/// INVALID_UPDATE_VERSION, INELIGIBLE_REPLICA, ...) as the broker's error, and NOT_CONTROLLER
/// when no controller could be reached or this broker is not registered yet (retriable).
pub(crate) async fn report_partition(
    shard: &Rc<Shard>,
    report: PartitionReport,
) -> Result<AlterPartitionReply, AdminError> {
    let answer = shard
        .ask::<ClusterLink>(ShardId(0), LinkRequest::ReportPartition(report))
        .await;
    let reply = match answer {
        Some(LinkResponse::Control(r)) => r,
        Some(LinkResponse::Published | LinkResponse::ProducerId(_)) | None => {
            Err("the cluster node did not answer".into())
        }
    };
    match reply {
        Ok(ControlReply::AlterPartition(a)) => Ok(a),
        Ok(ControlReply::Refused { code, message }) => Err(ControlReply::admin_error(code, &message)),
        Ok(other) => Err(AdminError::new(
            ResponseError::NotController,
            format!("AlterPartition answered {other:?}"),
        )),
        Err(message) => Err(AdminError::new(ResponseError::NotController, message)),
    }
}

/// Carries a shard's partition elections to the active controller (through shard 0's node).
pub(crate) struct ElectionReports(pub(crate) Weak<Shard>);

impl LeaderReports for ElectionReports {
    fn leader_elected(
        &self,
        topic: TopicId,
        partition: PartitionId,
        term: i32,
    ) -> LocalBoxFuture<'static, Report> {
        let shard = self.0.upgrade();
        async move {
            let Some(shard) = shard else {
                return Report::Unreachable("the shard is gone".into());
            };
            let req = LinkRequest::ReportLeader {
                topic,
                partition,
                leader_epoch: LeaderEpoch(term),
            };
            let reply = match shard.ask::<ClusterLink>(ShardId(0), req).await {
                Some(LinkResponse::Control(r)) => r,
                Some(LinkResponse::Published | LinkResponse::ProducerId(_)) | None => {
                    Err("the cluster node did not answer".into())
                }
            };
            match reply {
                Ok(ControlReply::AlterPartition(a)) => Report::Recorded {
                    partition_epoch: a.partition_epoch.0,
                },
                Ok(ControlReply::Refused { message, .. }) => Report::Refused(message),
                Ok(other) => Report::Unreachable(format!("answered {other:?}")),
                Err(message) => Report::Unreachable(message),
            }
        }
        .boxed_local()
    }

    fn alter_isr(
        &self,
        topic: TopicId,
        partition: PartitionId,
        term: i32,
        partition_epoch: i32,
        isr: Vec<(NodeId, BrokerEpoch)>,
    ) -> LocalBoxFuture<'static, Report> {
        let shard = self.0.upgrade();
        async move {
            let Some(shard) = shard else {
                return Report::Unreachable("the shard is gone".into());
            };
            let report = PartitionReport {
                topic,
                partition,
                leader_epoch: LeaderEpoch(term),
                partition_epoch: PartitionEpoch(partition_epoch),
                isr: isr
                    .into_iter()
                    .map(|(broker, epoch)| IsrMember {
                        broker,
                        epoch: Some(epoch),
                    })
                    .collect(),
            };
            match report_partition(&shard, report).await {
                Ok(a) => Report::Recorded {
                    partition_epoch: a.partition_epoch.0,
                },
                Err(e) if e.code == ResponseError::NotController => Report::Unreachable(e.message),
                Err(e) => Report::Refused(e.message),
            }
        }
        .boxed_local()
    }
}

/// A producer id for InitProducerId on a cluster node, from any shard (through shard 0's
/// block); COORDINATOR_NOT_AVAILABLE (retriable) while no controller hands out a block.
pub(crate) async fn producer_id(shard: &Rc<Shard>) -> Result<i64, AdminError> {
    match shard
        .ask::<ClusterLink>(ShardId(0), LinkRequest::ProducerId)
        .await
    {
        Some(LinkResponse::ProducerId(r)) => r,
        _ => Err(AdminError::new(
            ResponseError::CoordinatorNotAvailable,
            "the cluster node did not answer",
        )),
    }
}

/// Creates a topic with the broker's defaults (`num.partitions`, `default.replication.factor`),
/// as Metadata's auto-creation does.
pub(crate) async fn auto_create(shard: &Rc<Shard>, name: &str) -> Result<(), AdminError> {
    let config = &shard.config;
    let req = ControlRequest::CreateTopic(CreateTopic {
        name: name.to_owned(),
        id: TopicId(uuid::Uuid::new_v4()),
        partitions: i32::try_from(config.num_partitions).unwrap_or(1),
        replication_factor: i16::try_from(config.cluster.default_replication_factor).unwrap_or(i16::MAX),
        assignments: Vec::new(),
        configs: Vec::new(),
    });
    decide(shard, req).await.map(|_| ())
}

/// The replication factor the cluster creates `__consumer_offsets` with: the setting, else
/// min(3, the registered brokers).
pub(crate) fn offsets_topic_replication_factor(setting: Option<u16>, state: &ClusterState) -> i16 {
    let rf = setting.unwrap_or_else(|| {
        let registered = state.brokers().count().max(1);
        u16::try_from(registered.min(3)).unwrap_or(3)
    });
    i16::try_from(rf).unwrap_or(i16::MAX)
}

/// Asks the cluster to create `__consumer_offsets` (compacted, `offsets.topic.num.partitions`
/// partitions), as Kafka creates it at the first FindCoordinator for a group. Until it exists
/// and its partitions have leaders, FindCoordinator answers COORDINATOR_NOT_AVAILABLE. A
/// topic created meanwhile by another node's request is success.
pub(crate) async fn create_offsets_topic(shard: &Rc<Shard>) -> Result<(), AdminError> {
    use crate::internal_topics::CONSUMER_OFFSETS as OFFSETS_TOPIC;
    let Some(state) = shard.cluster_state() else {
        return Err(AdminError::new(
            ResponseError::CoordinatorNotAvailable,
            "no cluster state yet",
        ));
    };
    if state.topic_by_name(OFFSETS_TOPIC).is_some() {
        return Ok(());
    }
    let config = &shard.config;
    let req = ControlRequest::CreateTopic(CreateTopic {
        name: OFFSETS_TOPIC.to_owned(),
        id: TopicId(uuid::Uuid::new_v4()),
        partitions: i32::try_from(config.offsets_topic_num_partitions).unwrap_or(50),
        replication_factor: offsets_topic_replication_factor(
            config.cluster.offsets_topic_replication_factor,
            &state,
        ),
        assignments: Vec::new(),
        configs: vec![
            ("cleanup.policy".into(), "compact".into()),
            ("segment.bytes".into(), "104857600".into()),
        ],
    });
    match decide(shard, req).await {
        Ok(_) => {
            tracing::info!("the cluster created {OFFSETS_TOPIC}");
            Ok(())
        }
        Err(e) if e.code == ResponseError::TopicAlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use strand_protocol::types::{LeaderEpoch, NodeId, PartitionId};

    use super::*;
    use crate::cluster::record::{ConfigRecord, PartitionEpoch, PartitionRecord};
    use crate::cluster::{Record, Replica};

    fn register(s: &mut ClusterState, broker: i32) {
        s.apply(&Record::RegisterBroker(crate::cluster::RegisterBroker {
            broker: NodeId(broker),
            incarnation: crate::cluster::IncarnationId(uuid::Uuid::from_u128(broker as u128)),
            epoch: crate::cluster::BrokerEpoch(i64::try_from(s.next_offset().0).unwrap()),
            endpoints: Vec::new(),
            rack: None,
            shards: 1,
        }));
    }

    #[test]
    fn the_offsets_topic_takes_the_setting_else_up_to_three_registered_brokers() {
        let mut s = ClusterState::default();
        assert_eq!(offsets_topic_replication_factor(None, &s), 1);
        register(&mut s, 1);
        register(&mut s, 2);
        assert_eq!(offsets_topic_replication_factor(None, &s), 2);
        register(&mut s, 3);
        register(&mut s, 4);
        assert_eq!(offsets_topic_replication_factor(None, &s), 3);
        // Set, it is what the topic gets, whatever the brokers (placement refuses it while too
        // few are live).
        assert_eq!(offsets_topic_replication_factor(Some(1), &s), 1);
        assert_eq!(offsets_topic_replication_factor(Some(5), &s), 5);
    }

    fn with_topic(s: &mut ClusterState, name: &str, id: u128, partitions: i32) {
        if s.broker(NodeId(1)).is_none() {
            s.apply(&Record::RegisterBroker(crate::cluster::RegisterBroker {
                broker: NodeId(1),
                incarnation: crate::cluster::IncarnationId(uuid::Uuid::from_u128(1)),
                epoch: crate::cluster::BrokerEpoch(i64::try_from(s.next_offset().0).unwrap()),
                endpoints: Vec::new(),
                rack: None,
                shards: 1,
            }));
            let epoch = s.broker(NodeId(1)).map(|b| b.epoch).unwrap();
            s.apply(&Record::BrokerUnfenced {
                broker: NodeId(1),
                epoch,
            });
        }
        let id = TopicId(uuid::Uuid::from_u128(id));
        s.apply(&Record::Topic {
            name: name.into(),
            id,
        });
        for p in 0..partitions {
            s.apply(&Record::Partition(PartitionRecord {
                topic: id,
                partition: PartitionId(p),
                replicas: vec![Replica {
                    broker: NodeId(1),
                    shard: ShardId(0),
                }],
                isr: vec![NodeId(1)],
                leader: Some(NodeId(1)),
                leader_epoch: LeaderEpoch(0),
                partition_epoch: PartitionEpoch(0),
            }));
        }
    }

    fn local_of(state: &ClusterState, local: &ClusterMetadata) -> ClusterMetadata {
        let learned: HashSet<TopicId> = local
            .topics()
            .filter(|t| t.name != "__consumer_offsets" && t.name != "before")
            .map(|t| t.id)
            .collect();
        let mut md = local.clone();
        for d in deltas(local, state, &learned) {
            md.apply(&d);
        }
        md
    }

    #[test]
    fn the_local_metadata_follows_the_cluster_topics_and_keeps_its_own_internal_ones() {
        let mut local = ClusterMetadata::default();
        local.apply(&MetadataDelta::CreateTopic(TopicMeta {
            name: "__consumer_offsets".into(),
            id: TopicId(uuid::Uuid::from_u128(99)),
            partitions: 2,
            config: TopicConfig::default(),
            internal: true,
        }));
        let mut state = ClusterState::default();
        with_topic(&mut state, "orders", 1, 3);
        state.apply(&Record::Config(ConfigRecord {
            resource: ConfigResource::Topic("orders".into()),
            entries: vec![("retention.ms".into(), Some("1000".into()))],
        }));
        let md = local_of(&state, &local);
        let orders = md.topic("orders").expect("created");
        assert_eq!(
            (orders.partitions, orders.id),
            (3, TopicId(uuid::Uuid::from_u128(1)))
        );
        assert_eq!(orders.config.get("retention.ms").as_deref(), Some("1000"));
        assert!(
            md.topic("__consumer_offsets").is_some(),
            "the node's own internal topic stays"
        );
        assert!(
            deltas(&md, &state, &HashSet::new()).is_empty(),
            "nothing more to do once applied"
        );

        // Grown, then deleted and re-created under a new id.
        let mut grown = state.clone();
        let id = TopicId(uuid::Uuid::from_u128(1));
        grown.apply(&Record::Partition(PartitionRecord {
            topic: id,
            partition: PartitionId(3),
            replicas: vec![Replica {
                broker: NodeId(1),
                shard: ShardId(0),
            }],
            isr: vec![NodeId(1)],
            leader: Some(NodeId(1)),
            leader_epoch: LeaderEpoch(0),
            partition_epoch: PartitionEpoch(0),
        }));
        let md = local_of(&grown, &md);
        assert_eq!(md.topic("orders").map(|t| t.partitions), Some(4));
        let mut recreated = ClusterState::default();
        with_topic(&mut recreated, "orders", 2, 1);
        let learned: HashSet<TopicId> = [id].into();
        let d = deltas(&md, &recreated, &learned);
        assert!(
            matches!(&d[0], MetadataDelta::DeleteTopic { name, id: old } if name == "orders" && *old == id)
        );
        let md = local_of(&recreated, &md);
        assert_eq!(
            md.topic("orders").map(|t| t.id),
            Some(TopicId(uuid::Uuid::from_u128(2)))
        );
    }

    #[test]
    fn a_topic_from_before_the_cluster_is_never_deleted_nor_replaced() {
        let mut local = ClusterMetadata::default();
        let old = TopicId(uuid::Uuid::from_u128(50));
        local.apply(&MetadataDelta::CreateTopic(TopicMeta {
            name: "before".into(),
            id: old,
            partitions: 1,
            config: TopicConfig::default(),
            internal: false,
        }));
        let empty = ClusterState::default();
        assert!(deltas(&local, &empty, &HashSet::new()).is_empty());
        let mut state = ClusterState::default();
        with_topic(&mut state, "before", 51, 1);
        with_topic(&mut state, "other", 52, 1);
        let d = deltas(&local, &state, &HashSet::new());
        assert_eq!(d.len(), 1, "{d:?}");
        assert!(matches!(&d[0], MetadataDelta::CreateTopic(t) if t.name == "other"));
        // Once learned from the cluster, a topic is deleted with it.
        let mut md = local.clone();
        md.apply(&d[0]);
        let learned: HashSet<TopicId> = [TopicId(uuid::Uuid::from_u128(52))].into();
        let d = deltas(&md, &empty, &learned);
        assert!(
            matches!(&d[..], [MetadataDelta::DeleteTopic { name, .. }] if name == "other"),
            "{d:?}"
        );
    }

    #[test]
    fn group_configs_follow_the_cluster_state() {
        let mut state = ClusterState::default();
        let group = ConfigResource::Group("g".into());
        state.apply(&Record::Config(ConfigRecord {
            resource: group.clone(),
            entries: vec![("share.delivery.count.limit".into(), Some("4".into()))],
        }));
        let md = local_of(&state, &ClusterMetadata::default());
        assert_eq!(
            md.group_config("g")
                .and_then(|c| c.get("share.delivery.count.limit")),
            Some("4")
        );
        assert!(deltas(&md, &state, &HashSet::new()).is_empty());
        state.apply(&Record::Config(ConfigRecord {
            resource: group,
            entries: vec![("share.delivery.count.limit".into(), None)],
        }));
        let md = local_of(&state, &md);
        assert!(
            md.group_config("g").is_none(),
            "removed with the state's last override"
        );
    }
}
