//! The controller's decisions: functions from the state (and the active controller's soft
//! state, [`Liveness`]) to the records the quorum leader proposes, modelled on Kafka's
//! `ClusterControlManager`, `ReplicationControlManager`, `BrokerHeartbeatManager` and
//! `PartitionChangeBuilder`.
//!
//! A decision must be made against a state that already holds every record proposed before it
//! (the leader applies its proposals to its own copy as it proposes them, as Kafka's active
//! controller does), so that two decisions never build on the same partition epoch. Decisions
//! whose records build on each other (registration, fencing, unfencing, controlled shutdown)
//! apply them to a scratch copy as they go, taken on the first record, so a broken record
//! fails on the leader that built it; the others write records that each depend only on the
//! state as it is.
//!
//! Leaders are elected by the partitions' Raft groups, not by the controller (as in Redpanda):
//! a replica that wins its group's election reports it ([`leader_elected`]), and the controller
//! records it as the partition's leader with the Raft term as its leader epoch, the epoch its
//! batches carry. So a partition's leader epoch is the term of the election that made its
//! leader, and OffsetForLeaderEpoch answers from the epochs stamped in the log. The controller
//! only takes leadership away: a leader that is fenced or enters controlled shutdown is recorded
//! as none (leader -1, the epoch kept) until its group elects and reports a new one. ISR changes
//! follow Kafka: a fenced or stopping broker leaves every ISR (except as its last member), a
//! leader reports shrinks and expansions with AlterPartition. Every change bumps the partition
//! epoch.

use std::collections::BTreeMap;

use kafka_protocol::ResponseError;
use strand_protocol::types::{validate_topic_name, LeaderEpoch, NodeId, PartitionId, TopicId};

use super::placement::{place, Load};
use super::record::{
    BrokerEpoch, ConfigRecord, ConfigResource, Endpoint, IncarnationId, MetadataOffset, PartitionChange,
    PartitionEpoch, PartitionRecord, Record, RegisterBroker, Replica, MAX_CONFIG_ENTRIES, MAX_ENDPOINTS,
    MAX_REPLICAS, MAX_STRING_BYTES,
};
use super::snapshot::{MAX_SNAPSHOT_BROKERS, MAX_SNAPSHOT_TOPICS};
use super::state::{BrokerRegistration, ClusterState, PartitionRegistration, TopicState};
use crate::metadata::{AdminError, MAX_PARTITIONS_PER_TOPIC};

/// Kafka's `broker.session.timeout.ms` default.
pub const DEFAULT_SESSION_TIMEOUT_MS: u64 = 9_000;

/// The controller's settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ControllerConfig {
    /// A broker whose last heartbeat is this old is fenced (`broker.session.timeout.ms`).
    pub session_timeout_ms: u64,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        ControllerConfig {
            session_timeout_ms: DEFAULT_SESSION_TIMEOUT_MS,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Contact {
    last_contact_ms: u64,
    /// The broker's metadata position: the offset of the next record it will apply.
    metadata_offset: MetadataOffset,
    /// While in controlled shutdown: the offset every active broker must reach (so that every
    /// broker has seen the leadership moves) before this one is told to stop.
    shutdown_offset: Option<MetadataOffset>,
}

/// The active controller's soft state: when each broker last sent a heartbeat and how far it
/// has applied the metadata log. Not replicated (heartbeats would flood the log): a controller
/// that becomes active starts every broker with a fresh session ([`Liveness::activate`]), so a
/// controller fail-over delays fencing by up to one session timeout, as in Kafka.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Liveness {
    contacts: BTreeMap<NodeId, Contact>,
}

impl Liveness {
    /// The soft state of a controller that has just become active.
    pub fn activate(state: &ClusterState, now_ms: u64) -> Liveness {
        let mut l = Liveness::default();
        for b in state.brokers() {
            l.reset(b.id, now_ms);
        }
        l
    }

    fn reset(&mut self, broker: NodeId, now_ms: u64) {
        self.contacts.insert(
            broker,
            Contact {
                last_contact_ms: now_ms,
                metadata_offset: MetadataOffset(0),
                shutdown_offset: None,
            },
        );
    }

    /// A heartbeat of `broker`'s registration at `epoch` arrived at `now_ms`: it is alive,
    /// whenever its heartbeat's decision runs. Recorded on arrival so that a long queue of
    /// decisions (thousands of elections after a node restarts) cannot make a live broker's
    /// session expire. Nothing for a broker or epoch the state does not know.
    pub fn touch(&mut self, state: &ClusterState, broker: NodeId, epoch: BrokerEpoch, now_ms: u64) {
        if state.broker(broker).is_none_or(|b| b.epoch != epoch) {
            return;
        }
        if let Some(c) = self.contacts.get_mut(&broker) {
            c.last_contact_ms = c.last_contact_ms.max(now_ms);
        }
    }

    /// When the broker was last heard from.
    pub fn last_contact_ms(&self, broker: NodeId) -> Option<u64> {
        self.contacts.get(&broker).map(|c| c.last_contact_ms)
    }
}

/// A BrokerRegistration request, decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BrokerRegistrationRequest {
    pub broker: NodeId,
    pub incarnation: IncarnationId,
    pub endpoints: Vec<Endpoint>,
    pub rack: Option<String>,
    pub shards: u16,
}

/// A BrokerHeartbeat request, decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Heartbeat {
    pub broker: NodeId,
    pub epoch: BrokerEpoch,
    /// The offset of the next metadata record the broker will apply.
    pub metadata_offset: MetadataOffset,
    /// The broker asks to be fenced (it is not ready to serve).
    pub want_fence: bool,
    /// The broker asks to shut down (controlled shutdown when it leads anything).
    pub want_shutdown: bool,
}

/// The BrokerHeartbeat response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeartbeatReply {
    /// The broker has applied its own registration.
    pub is_caught_up: bool,
    pub is_fenced: bool,
    /// The broker may stop now: it leads nothing and every live broker knows.
    pub should_shut_down: bool,
}

/// A topic to create, after the broker resolved defaults (`num.partitions`,
/// `default.replication.factor`) and validated the configs' values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreateTopic {
    pub name: String,
    pub id: TopicId,
    /// -1 with manual assignments.
    pub partitions: i32,
    /// -1 with manual assignments.
    pub replication_factor: i16,
    /// Manual assignments (partition, replicas in preference order); empty: placed by the
    /// controller.
    pub assignments: Vec<(i32, Vec<NodeId>)>,
    pub configs: Vec<(String, String)>,
}

/// An ISR member as AlterPartition names it: with the broker epoch the leader saw (KIP-903),
/// `None` to skip that check (older request versions).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IsrMember {
    pub broker: NodeId,
    pub epoch: Option<BrokerEpoch>,
}

/// One partition of an AlterPartition request (KIP-497), from its leader.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AlterPartition {
    pub broker: NodeId,
    pub broker_epoch: BrokerEpoch,
    pub topic: TopicId,
    pub partition: PartitionId,
    pub leader_epoch: LeaderEpoch,
    pub partition_epoch: PartitionEpoch,
    pub new_isr: Vec<IsrMember>,
}

/// A partition group's report that a replica won its election (see [`leader_elected`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaderElected {
    pub broker: NodeId,
    pub broker_epoch: BrokerEpoch,
    pub topic: TopicId,
    pub partition: PartitionId,
    /// The Raft term the broker was elected in.
    pub leader_epoch: LeaderEpoch,
}

/// What AlterPartition answers on success: the partition as it now is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AlterPartitionReply {
    pub leader: Option<NodeId>,
    pub isr: Vec<NodeId>,
    pub leader_epoch: LeaderEpoch,
    pub partition_epoch: PartitionEpoch,
}

/// Records built against a scratch copy of the state, each applied as it is added. The copy is
/// taken on the first record, so a decision that writes nothing (most heartbeats) costs nothing.
struct Batch<'a> {
    base: &'a ClusterState,
    scratch: Option<ClusterState>,
    records: Vec<Record>,
}

impl<'a> Batch<'a> {
    fn new(base: &'a ClusterState) -> Batch<'a> {
        Batch {
            base,
            scratch: None,
            records: Vec::new(),
        }
    }

    /// The state with the batch's records applied.
    fn state(&self) -> &ClusterState {
        self.scratch.as_ref().unwrap_or(self.base)
    }

    fn push(&mut self, r: Record) {
        self.scratch.get_or_insert_with(|| self.base.clone()).apply(&r);
        self.records.push(r);
    }

    fn finish(self) -> Vec<Record> {
        if let Some(s) = &self.scratch {
            if cfg!(debug_assertions) {
                s.check_invariants();
            }
        }
        self.records
    }
}

/// The change that gives a partition `target_isr` (the current ISR when empty: an ISR never
/// becomes empty, its last member stays as the one to wait for), keeping its leader while it is
/// in it and `acceptable`, and recording none otherwise (the group elects the next one, which
/// reports itself); `None` when nothing changes. The leader epoch stays: only an election
/// (a higher Raft term) raises it.
fn change(
    topic: TopicId,
    partition: PartitionId,
    part: &PartitionRegistration,
    target_isr: Vec<NodeId>,
    acceptable: &dyn Fn(NodeId) -> bool,
) -> Option<PartitionChange> {
    let isr = if target_isr.is_empty() {
        part.isr.clone()
    } else {
        target_isr
    };
    let leader = part.leader.filter(|l| isr.contains(l) && acceptable(*l));
    if leader == part.leader && isr == part.isr {
        return None;
    }
    Some(PartitionChange {
        topic,
        partition,
        leader,
        isr,
        leader_epoch: part.leader_epoch,
        partition_epoch: PartitionEpoch(part.partition_epoch.0 + 1),
        shards: None,
    })
}

/// Moves leadership and ISR membership away from `broker` (about to be fenced or to shut
/// down): it is removed from every ISR it is in, except as the last member.
fn move_away(batch: &mut Batch<'_>, broker: NodeId) {
    let state = batch.state();
    let acceptable = |b: NodeId| b != broker && state.is_active(b);
    let changes: Vec<_> = state
        .partitions()
        .filter(|(_, _, p)| p.isr.contains(&broker) || p.leader == Some(broker))
        .filter_map(|(t, i, p)| {
            let target = p.isr.iter().copied().filter(|b| *b != broker).collect();
            change(t, i, p, target, &acceptable)
        })
        .collect();
    for c in changes {
        batch.push(Record::PartitionChange(c));
    }
}

/// Fences an unfenced broker: its partitions first, then the broker.
fn fence(batch: &mut Batch<'_>, broker: NodeId) {
    let Some(epoch) = batch
        .state()
        .broker(broker)
        .filter(|b| !b.fenced)
        .map(|b| b.epoch)
    else {
        return;
    };
    move_away(batch, broker);
    batch.push(Record::BrokerFenced { broker, epoch });
}

/// Unfences a broker. It leads nothing yet: its groups' elections, reported, make it a leader.
fn unfence(batch: &mut Batch<'_>, broker: NodeId, epoch: BrokerEpoch) {
    batch.push(Record::BrokerUnfenced { broker, epoch });
}

fn invalid_request(message: impl Into<String>) -> AdminError {
    AdminError::new(ResponseError::InvalidRequest, message)
}

/// Registers a broker (BrokerRegistration). A retry by the same process (same incarnation)
/// keeps its epoch and fencing; a new process (new incarnation) gets a new epoch, its previous
/// incarnation's leaderships and ISR places are moved away first (it restarted, so what it
/// held in memory is gone), and it starts fenced until its heartbeats show it caught up.
///
/// Kafka instead refuses a new incarnation with DUPLICATE_BROKER_REGISTRATION while the old
/// one's session lives, which makes a restarted broker wait out the session timeout; here the
/// newest process wins, so two live processes configured with the same `node.id` take the id
/// from each other (each re-registration fences the other).
pub fn register_broker(
    state: &ClusterState,
    liveness: &mut Liveness,
    req: &BrokerRegistrationRequest,
    now_ms: u64,
) -> Result<(Vec<Record>, BrokerEpoch), AdminError> {
    if req.broker.0 < 0 {
        return Err(invalid_request(format!("Invalid broker id {}.", req.broker)));
    }
    if req.shards == 0 {
        return Err(invalid_request("A broker registers at least one shard."));
    }
    if req.endpoints.len() > MAX_ENDPOINTS {
        return Err(invalid_request(format!("More than {MAX_ENDPOINTS} listeners.")));
    }
    for (k, e) in req.endpoints.iter().enumerate() {
        if e.listener.is_empty() || e.listener.len() > MAX_STRING_BYTES || e.host.len() > MAX_STRING_BYTES {
            return Err(invalid_request(format!("Invalid listener {:?}.", e.listener)));
        }
        if req.endpoints[..k].iter().any(|o| o.listener == e.listener) {
            return Err(invalid_request(format!(
                "Listener {} registered twice.",
                e.listener
            )));
        }
    }
    if req.rack.as_ref().is_some_and(|r| r.len() > MAX_STRING_BYTES) {
        return Err(invalid_request("Rack name too long."));
    }
    let existing = state.broker(req.broker);
    if existing.is_none() && state.brokers().count() >= MAX_SNAPSHOT_BROKERS as usize {
        return Err(AdminError::new(
            ResponseError::PolicyViolation,
            format!("The cluster holds the most brokers it may ({MAX_SNAPSHOT_BROKERS})."),
        ));
    }
    let mut batch = Batch::new(state);
    let epoch = match existing {
        Some(old) if old.incarnation == req.incarnation => {
            if old.shards != req.shards {
                return Err(invalid_request(format!(
                    "Broker {} changed its shard count from {} to {} without restarting.",
                    req.broker, old.shards, req.shards
                )));
            }
            if old.endpoints != req.endpoints || old.rack != req.rack {
                batch.push(Record::RegisterBroker(RegisterBroker {
                    broker: req.broker,
                    incarnation: req.incarnation,
                    epoch: old.epoch,
                    endpoints: req.endpoints.clone(),
                    rack: req.rack.clone(),
                    shards: req.shards,
                }));
            }
            old.epoch
        }
        _ => {
            fence(&mut batch, req.broker);
            let offset = batch.state().next_offset().0;
            let epoch = BrokerEpoch(i64::try_from(offset).unwrap_or(i64::MAX));
            batch.push(Record::RegisterBroker(RegisterBroker {
                broker: req.broker,
                incarnation: req.incarnation,
                epoch,
                endpoints: req.endpoints.clone(),
                rack: req.rack.clone(),
                shards: req.shards,
            }));
            reshard(&mut batch, req.broker, req.shards);
            liveness.reset(req.broker, now_ms);
            epoch
        }
    };
    Ok((batch.finish(), epoch))
}

/// Moves the replicas of a broker that came back with fewer shards onto shards it has.
fn reshard(batch: &mut Batch<'_>, broker: NodeId, shards: u16) {
    let mut load = Load::of(batch.state());
    let changes: Vec<_> = batch
        .state()
        .partitions()
        .filter(|(_, _, p)| {
            p.replicas
                .iter()
                .any(|r| r.broker == broker && r.shard.0 >= shards)
        })
        .map(|(t, i, p)| {
            let new_shards = p
                .replicas
                .iter()
                .enumerate()
                .map(|(k, r)| {
                    if r.broker == broker && r.shard.0 >= shards {
                        load.move_shard(broker, r.shard, shards, k == 0)
                    } else {
                        r.shard
                    }
                })
                .collect();
            PartitionChange {
                topic: t,
                partition: i,
                leader: p.leader,
                isr: p.isr.clone(),
                leader_epoch: p.leader_epoch,
                partition_epoch: PartitionEpoch(p.partition_epoch.0 + 1),
                shards: Some(new_shards),
            }
        })
        .collect();
    for c in changes {
        batch.push(Record::PartitionChange(c));
    }
}

/// Handles a BrokerHeartbeat: records the contact and moves the broker between fenced,
/// unfenced, controlled shutdown and stopped as Kafka's `BrokerHeartbeatManager` does. A fenced
/// broker is unfenced once it has applied its own registration; a broker that wants to shut
/// down while leading partitions enters controlled shutdown (its leaderships move away at once)
/// and is told to stop, and fenced, once every active broker has applied the moves.
pub fn heartbeat(
    state: &ClusterState,
    liveness: &mut Liveness,
    hb: &Heartbeat,
    now_ms: u64,
) -> Result<(Vec<Record>, HeartbeatReply), AdminError> {
    let Some(reg) = state.broker(hb.broker).filter(|b| b.epoch == hb.epoch) else {
        return Err(AdminError::new(
            ResponseError::StaleBrokerEpoch,
            format!("No registration of broker {} at epoch {}.", hb.broker, hb.epoch.0),
        ));
    };
    let caught_up = i64::try_from(hb.metadata_offset.0).unwrap_or(i64::MAX) > reg.epoch.0;
    let contact = liveness.contacts.entry(hb.broker).or_insert(Contact {
        last_contact_ms: now_ms,
        metadata_offset: hb.metadata_offset,
        shutdown_offset: None,
    });
    contact.last_contact_ms = contact.last_contact_ms.max(now_ms);
    contact.metadata_offset = contact.metadata_offset.max(hb.metadata_offset);
    let mut batch = Batch::new(state);
    let mut stop = false;
    if reg.in_controlled_shutdown {
        // Leads nothing (applying the shutdown record asserted it); stops once every other
        // active broker has seen the moves. A controller that became active since does not know
        // the offset of the moves: every record it has is at least as new, so it waits for its
        // log end as it is now (not as it will be: under steady metadata changes a moving target
        // would never be reached).
        let target = *contact.shutdown_offset.get_or_insert(state.next_offset());
        let lowest = liveness
            .contacts
            .iter()
            .filter(|(b, _)| **b != hb.broker && state.is_active(**b))
            .map(|(_, c)| c.metadata_offset)
            .min();
        if lowest.is_none_or(|l| l >= target) {
            fence(&mut batch, hb.broker);
            stop = true;
        }
    } else if reg.fenced {
        stop = hb.want_shutdown;
        if !hb.want_shutdown && !hb.want_fence && caught_up {
            unfence(&mut batch, hb.broker, reg.epoch);
        }
    } else if hb.want_fence {
        fence(&mut batch, hb.broker);
        stop = hb.want_shutdown;
    } else if hb.want_shutdown {
        if state.leader_count(hb.broker) > 0 {
            move_away(&mut batch, hb.broker);
            batch.push(Record::BrokerShutdown {
                broker: hb.broker,
                epoch: reg.epoch,
            });
            if let Some(c) = liveness.contacts.get_mut(&hb.broker) {
                c.shutdown_offset = Some(batch.state().next_offset());
            }
        } else {
            fence(&mut batch, hb.broker);
            stop = true;
        }
    }
    let is_fenced = batch.state().broker(hb.broker).is_none_or(|b| b.fenced);
    Ok((
        batch.finish(),
        HeartbeatReply {
            is_caught_up: caught_up,
            is_fenced,
            should_shut_down: stop,
        },
    ))
}

/// Fences every unfenced broker whose last heartbeat is `session_timeout_ms` old or older,
/// taking away the leaderships it held. The active controller calls it on a timer.
pub fn fence_stale_brokers(
    state: &ClusterState,
    liveness: &Liveness,
    config: &ControllerConfig,
    now_ms: u64,
) -> Vec<Record> {
    let mut batch = Batch::new(state);
    for b in state.brokers().filter(|b| !b.fenced) {
        let last = liveness.last_contact_ms(b.id).unwrap_or(0);
        if now_ms.saturating_sub(last) >= config.session_timeout_ms {
            fence(&mut batch, b.id);
        }
    }
    batch.finish()
}

/// Creates a topic (CreateTopics): the topic, its config overrides, then its partitions, placed
/// over the active brokers ([`super::placement`]) or as manually assigned, each with its active
/// replicas as ISR and the first of them as leader.
pub fn create_topic(state: &ClusterState, req: &CreateTopic) -> Result<Vec<Record>, AdminError> {
    validate_topic_name(&req.name).map_err(|m| AdminError::new(ResponseError::InvalidTopicException, m))?;
    if state.topic_by_name(&req.name).is_some() {
        return Err(AdminError::new(
            ResponseError::TopicAlreadyExists,
            format!("Topic '{}' already exists.", req.name),
        ));
    }
    if req.name.contains(['.', '_']) {
        let norm = req.name.replace('.', "_");
        if let Some(other) = state.topics().find(|t| t.name.replace('.', "_") == norm) {
            return Err(AdminError::new(
                ResponseError::InvalidTopicException,
                format!(
                    "Topic '{}' collides with existing topic: {} ('.' and '_' are interchangeable in metric names)",
                    req.name, other.name
                ),
            ));
        }
    }
    if req.id.is_zero() || state.topic(req.id).is_some() {
        return Err(invalid_request(format!("Topic id {} is not new.", req.id)));
    }
    let full = |what: &str| {
        Err(AdminError::new(
            ResponseError::PolicyViolation,
            format!("The cluster holds the most {what} it may ({MAX_SNAPSHOT_TOPICS})."),
        ))
    };
    if state.topics().count() >= MAX_SNAPSHOT_TOPICS as usize {
        return full("topics");
    }
    if !req.configs.is_empty() && state.config_resource_count() >= MAX_SNAPSHOT_TOPICS as usize {
        return full("config resources");
    }
    if req.configs.len() > MAX_CONFIG_ENTRIES
        || req
            .configs
            .iter()
            .any(|(k, v)| k.len() > MAX_STRING_BYTES || v.len() > MAX_STRING_BYTES)
    {
        return Err(AdminError::new(
            ResponseError::InvalidConfig,
            "Too many or too long configs.",
        ));
    }
    let assignment = if req.assignments.is_empty() {
        if req.partitions <= 0 {
            return Err(AdminError::new(
                ResponseError::InvalidPartitions,
                "Number of partitions must be larger than 0.",
            ));
        }
        check_partition_limit(req.partitions)?;
        let rf = u16::try_from(req.replication_factor).unwrap_or(0);
        if usize::from(rf) > MAX_REPLICAS {
            return Err(AdminError::new(
                ResponseError::InvalidReplicationFactor,
                format!("Replication factor {rf} is above the limit of {MAX_REPLICAS}."),
            ));
        }
        place(state, req.partitions.unsigned_abs(), rf)?
    } else {
        if req.partitions != -1 || req.replication_factor != -1 {
            return Err(invalid_request(
                "Both numPartitions or replicationFactor and replicasAssignments were set. Both cannot be used at the same time.",
            ));
        }
        let mut by_index: BTreeMap<i32, &Vec<NodeId>> = BTreeMap::new();
        for (p, replicas) in &req.assignments {
            if by_index.insert(*p, replicas).is_some() {
                return Err(AdminError::new(
                    ResponseError::InvalidReplicaAssignment,
                    format!("Found multiple manual partition assignments for partition {p}"),
                ));
            }
        }
        if by_index.keys().copied().ne(0..by_index.len() as i32) {
            return Err(AdminError::new(
                ResponseError::InvalidReplicaAssignment,
                "partitions should be a consecutive 0-based integer sequence",
            ));
        }
        check_partition_limit(i32::try_from(by_index.len()).unwrap_or(i32::MAX))?;
        let lists: Vec<&Vec<NodeId>> = by_index.into_values().collect();
        manual(state, &lists, None, 0)?
    };
    // New records only: nothing here depends on another record of the batch.
    let mut records = Vec::with_capacity(assignment.len() + 2);
    records.push(Record::Topic {
        name: req.name.clone(),
        id: req.id,
    });
    if !req.configs.is_empty() {
        records.push(Record::Config(ConfigRecord {
            resource: ConfigResource::Topic(req.name.clone()),
            entries: req
                .configs
                .iter()
                .map(|(k, v)| (k.clone(), Some(v.clone())))
                .collect(),
        }));
    }
    partition_records(state, req.id, 0, assignment, &mut records);
    Ok(records)
}

fn check_partition_limit(partitions: i32) -> Result<(), AdminError> {
    if partitions > MAX_PARTITIONS_PER_TOPIC {
        return Err(AdminError::new(
            ResponseError::InvalidPartitions,
            format!("Number of partitions {partitions} is above the limit of {MAX_PARTITIONS_PER_TOPIC}."),
        ));
    }
    Ok(())
}

/// Manual assignments checked as Kafka checks them: every broker registered, none twice, the
/// same replica count everywhere (`rf` when adding to a topic), and at least one active replica
/// per partition. Shards are chosen by load as for placed replicas.
fn manual(
    state: &ClusterState,
    lists: &[&Vec<NodeId>],
    rf: Option<usize>,
    first_partition: i32,
) -> Result<Vec<Vec<Replica>>, AdminError> {
    let refuse = |m: String| AdminError::new(ResponseError::InvalidReplicaAssignment, m);
    let mut rf = rf;
    let mut load = Load::of(state);
    let mut out = Vec::with_capacity(lists.len());
    for (i, replicas) in lists.iter().enumerate() {
        let partition = first_partition.saturating_add(i32::try_from(i).unwrap_or(i32::MAX));
        if replicas.is_empty() {
            return Err(refuse(
                "The manual partition assignment includes an empty replica list.".into(),
            ));
        }
        if replicas.len() > MAX_REPLICAS {
            return Err(refuse(format!(
                "More than {MAX_REPLICAS} replicas for partition {partition}."
            )));
        }
        for (k, b) in replicas.iter().enumerate() {
            if state.broker(*b).is_none() {
                return Err(refuse(format!(
                    "The manual partition assignment includes broker {b}, but no such broker is registered."
                )));
            }
            if replicas[..k].contains(b) {
                return Err(refuse(format!(
                    "The manual partition assignment includes the broker {b} more than once."
                )));
            }
        }
        match rf {
            Some(n) if n != replicas.len() => {
                return Err(refuse(format!(
                "The manual partition assignment includes a partition with {} replica(s), but this is not \
                     consistent with previous partitions, which have {n} replica(s).",
                replicas.len()
            )))
            }
            _ => rf = Some(replicas.len()),
        }
        if !replicas.iter().any(|b| state.is_active(*b)) {
            return Err(refuse(format!(
                "All brokers specified in the manual partition assignment for partition {partition} are fenced or \
                 in controlled shutdown."
            )));
        }
        // The preferred leader's shard is chosen as a leader's (where leadership returns).
        let placed = replicas
            .iter()
            .enumerate()
            .map(|(k, b)| Replica {
                broker: *b,
                shard: load.take_shard(*b, state.broker(*b).map_or(1, |r| r.shards), k == 0),
            })
            .collect();
        out.push(placed);
    }
    Ok(out)
}

/// The partition records of new partitions from `first`: the active replicas are the ISR, the
/// first of them leads.
fn partition_records(
    state: &ClusterState,
    topic: TopicId,
    first: i32,
    assignment: Vec<Vec<Replica>>,
    records: &mut Vec<Record>,
) {
    for (i, replicas) in assignment.into_iter().enumerate() {
        let isr: Vec<NodeId> = replicas
            .iter()
            .map(|r| r.broker)
            .filter(|b| state.is_active(*b))
            .collect();
        records.push(Record::Partition(PartitionRecord {
            topic,
            partition: PartitionId(first.saturating_add(i32::try_from(i).unwrap_or(i32::MAX))),
            leader: isr.first().copied(),
            isr,
            replicas,
            leader_epoch: LeaderEpoch(0),
            partition_epoch: PartitionEpoch(0),
        }));
    }
}

/// Adds partitions to a topic (CreatePartitions) up to `count` in all, with the replica count of
/// its existing partitions, placed by the controller or as manually assigned.
pub fn create_partitions(
    state: &ClusterState,
    name: &str,
    count: i32,
    assignments: Option<&[Vec<NodeId>]>,
) -> Result<Vec<Record>, AdminError> {
    let Some(topic) = state.topic_by_name(name) else {
        return Err(AdminError::new(
            ResponseError::UnknownTopicOrPartition,
            format!("The topic '{name}' does not exist."),
        ));
    };
    let current = i32::try_from(topic.partitions.len()).unwrap_or(i32::MAX);
    if count == current {
        return Err(AdminError::new(
            ResponseError::InvalidPartitions,
            format!("Topic already has {current} partition(s)."),
        ));
    }
    if count < current {
        return Err(AdminError::new(
            ResponseError::InvalidPartitions,
            format!(
                "The topic {name} currently has {current} partition(s); {count} would not be an increase."
            ),
        ));
    }
    check_partition_limit(count)?;
    let additional = count - current;
    let rf = topic.partitions.first().map_or(1, |p| p.replicas.len());
    let assignment = match assignments {
        Some(a) => {
            if a.len() != additional.unsigned_abs() as usize {
                return Err(AdminError::new(
                    ResponseError::InvalidReplicaAssignment,
                    format!(
                        "Attempted to add {additional} additional partition(s), but only {} assignment(s) were specified.",
                        a.len()
                    ),
                ));
            }
            let lists: Vec<&Vec<NodeId>> = a.iter().collect();
            manual(state, &lists, Some(rf), current)?
        }
        None => place(
            state,
            additional.unsigned_abs(),
            u16::try_from(rf).unwrap_or(u16::MAX),
        )?,
    };
    let mut records = Vec::with_capacity(assignment.len());
    partition_records(state, topic.id, current, assignment, &mut records);
    Ok(records)
}

/// Producer ids one AllocateProducerIds hands a broker, as in Kafka.
pub const PRODUCER_ID_BLOCK_SIZE: i64 = 1000;

/// A block of producer ids for one broker: `first` to `first + len - 1`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProducerIdBlock {
    pub first: i64,
    pub len: i64,
}

/// Hands a broker the next block of producer ids (AllocateProducerIds, KIP-730), so that no two
/// brokers, and no broker before and after a restart, give out the same id.
pub fn allocate_producer_ids(
    state: &ClusterState,
    broker: NodeId,
    broker_epoch: BrokerEpoch,
) -> Result<(Vec<Record>, ProducerIdBlock), AdminError> {
    if state.broker(broker).is_none_or(|b| b.epoch != broker_epoch) {
        return Err(AdminError::new(
            ResponseError::StaleBrokerEpoch,
            format!("Broker {broker} is not registered at epoch {}.", broker_epoch.0),
        ));
    }
    let first = state.next_producer_id();
    let Some(next) = first.checked_add(PRODUCER_ID_BLOCK_SIZE) else {
        return Err(AdminError::new(
            ResponseError::UnknownServerError,
            "Exhausted all producerIds as the next block's end producerId has exceeded the int64 type limit",
        ));
    };
    Ok((
        vec![Record::ProducerIds {
            broker,
            broker_epoch,
            next_producer_id: next,
        }],
        ProducerIdBlock {
            first,
            len: PRODUCER_ID_BLOCK_SIZE,
        },
    ))
}

/// Deletes a topic (DeleteTopics).
pub fn delete_topic(state: &ClusterState, id: TopicId) -> Result<Vec<Record>, AdminError> {
    if state.topic(id).is_none() {
        return Err(AdminError::new(
            ResponseError::UnknownTopicId,
            format!("No topic with id {id}."),
        ));
    }
    Ok(vec![Record::RemoveTopic { id }])
}

/// Changes config overrides (the broker validated keys and values; `None` removes a key).
pub fn alter_configs(
    state: &ClusterState,
    resource: ConfigResource,
    entries: Vec<(String, Option<String>)>,
) -> Result<Vec<Record>, AdminError> {
    if let ConfigResource::Topic(name) = &resource {
        if state.topic_by_name(name).is_none() {
            return Err(AdminError::new(
                ResponseError::UnknownTopicOrPartition,
                format!("The topic '{name}' does not exist."),
            ));
        }
    }
    if entries.is_empty() {
        return Ok(Vec::new());
    }
    let name_len = match &resource {
        ConfigResource::Topic(n) | ConfigResource::Group(n) | ConfigResource::Queue(n) => n.len(),
    };
    if name_len > MAX_STRING_BYTES
        || entries.len() > MAX_CONFIG_ENTRIES
        || entries.iter().any(|(k, v)| {
            k.len() > MAX_STRING_BYTES || v.as_ref().is_some_and(|v| v.len() > MAX_STRING_BYTES)
        })
    {
        return Err(AdminError::new(
            ResponseError::InvalidConfig,
            "Too many or too long configs.",
        ));
    }
    // The resource's overrides after the change, and the resources then: both bounded, as a
    // snapshot reads them.
    let current = state.configs(&resource);
    let mut keys: std::collections::BTreeSet<&str> = current
        .map(|c| c.keys().map(String::as_str).collect())
        .unwrap_or_default();
    for (k, v) in &entries {
        match v {
            Some(_) => keys.insert(k),
            None => keys.remove(k.as_str()),
        };
    }
    if keys.len() > MAX_CONFIG_ENTRIES {
        return Err(AdminError::new(
            ResponseError::InvalidConfig,
            format!("A resource may have at most {MAX_CONFIG_ENTRIES} config overrides."),
        ));
    }
    if current.is_none() && state.config_resource_count() >= MAX_SNAPSHOT_TOPICS as usize {
        return Err(AdminError::new(
            ResponseError::PolicyViolation,
            format!("The cluster holds the most config resources it may ({MAX_SNAPSHOT_TOPICS})."),
        ));
    }
    Ok(vec![Record::Config(ConfigRecord { resource, entries })])
}

/// The broker reporting about a partition, registered at `broker_epoch`, and the partition:
/// STALE_BROKER_EPOCH, UNKNOWN_TOPIC_ID or UNKNOWN_TOPIC_OR_PARTITION otherwise.
fn reporter_and_partition(
    state: &ClusterState,
    broker: NodeId,
    broker_epoch: BrokerEpoch,
    topic: TopicId,
    partition: PartitionId,
) -> Result<(&BrokerRegistration, &TopicState, &PartitionRegistration), AdminError> {
    let Some(b) = state.broker(broker).filter(|b| b.epoch == broker_epoch) else {
        return Err(AdminError::new(
            ResponseError::StaleBrokerEpoch,
            format!("Broker {broker} is not registered at epoch {}.", broker_epoch.0),
        ));
    };
    let Some(t) = state.topic(topic) else {
        return Err(AdminError::new(
            ResponseError::UnknownTopicId,
            format!("No topic {topic}."),
        ));
    };
    let Some(p) = t.partition(partition) else {
        return Err(AdminError::new(
            ResponseError::UnknownTopicOrPartition,
            format!("No partition {}-{partition}.", t.name),
        ));
    };
    Ok((b, t, p))
}

/// Handles a partition group's report of its elected leader: `broker` won the election of
/// `leader_epoch` (the Raft term). Recorded as the leader, with that epoch, when it is newer than
/// the partition's (or the same epoch with no leader recorded: the same leader reporting again
/// after it was taken away); the broker joins the ISR if it had left it, and members that are
/// fenced or shutting down leave it. Refused: a broker
/// not registered at `broker_epoch` (STALE_BROKER_EPOCH), fenced or shutting down
/// (INELIGIBLE_REPLICA), not a replica (INVALID_REQUEST), or an older epoch, or the same epoch
/// with another leader (FENCED_LEADER_EPOCH: a report that an election already overtook).
pub fn leader_elected(
    state: &ClusterState,
    req: &LeaderElected,
) -> Result<(Vec<Record>, AlterPartitionReply), AdminError> {
    let (broker, topic, part) =
        reporter_and_partition(state, req.broker, req.broker_epoch, req.topic, req.partition)?;
    let name = || format!("{}-{}", topic.name, req.partition);
    if !broker.is_active() {
        return Err(AdminError::new(
            ResponseError::IneligibleReplica,
            format!("{}: broker {} is fenced or shutting down.", name(), req.broker),
        ));
    }
    if !part.has_replica(req.broker) {
        return Err(AdminError::new(
            ResponseError::InvalidRequest,
            format!("{}: broker {} is not a replica.", name(), req.broker),
        ));
    }
    let reply = |p: &PartitionRegistration| AlterPartitionReply {
        leader: p.leader,
        isr: p.isr.clone(),
        leader_epoch: p.leader_epoch,
        partition_epoch: p.partition_epoch,
    };
    let same = req.leader_epoch == part.leader_epoch;
    if same && part.leader == Some(req.broker) {
        return Ok((Vec::new(), reply(part)));
    }
    if req.leader_epoch < part.leader_epoch || (same && part.leader.is_some()) {
        return Err(AdminError::new(
            ResponseError::FencedLeaderEpoch,
            format!(
                "{}: leader epoch {} is older than {} (led by {:?}).",
                name(),
                req.leader_epoch,
                part.leader_epoch,
                part.leader
            ),
        ));
    }
    // Raft elects only a replica holding every committed entry, so the winner joins the ISR;
    // members that are fenced or shutting down leave it (a led partition's ISR is active).
    let mut isr: Vec<NodeId> = part.isr.iter().copied().filter(|b| state.is_active(*b)).collect();
    if !isr.contains(&req.broker) {
        isr.push(req.broker);
    }
    let c = PartitionChange {
        topic: req.topic,
        partition: req.partition,
        leader: Some(req.broker),
        isr,
        leader_epoch: req.leader_epoch,
        partition_epoch: PartitionEpoch(part.partition_epoch.0 + 1),
        shards: None,
    };
    let r = AlterPartitionReply {
        leader: c.leader,
        isr: c.isr.clone(),
        leader_epoch: c.leader_epoch,
        partition_epoch: c.partition_epoch,
    };
    Ok((vec![Record::PartitionChange(c)], r))
}

/// Handles one partition of an AlterPartition request from its leader: an ISR shrink or
/// expansion. Checked as Kafka checks it (KIP-497, KIP-903): a request from the future (an
/// epoch above ours) gets NOT_CONTROLLER, an older leader epoch FENCED_LEADER_EPOCH, a broker
/// that does not lead INVALID_REQUEST, an older partition epoch INVALID_UPDATE_VERSION, an ISR
/// that is not a subset of the replicas or leaves out the leader INVALID_REQUEST, and a new
/// member that is fenced, shutting down or of another broker epoch INELIGIBLE_REPLICA.
pub fn alter_partition(
    state: &ClusterState,
    req: &AlterPartition,
) -> Result<(Vec<Record>, AlterPartitionReply), AdminError> {
    let (_, topic, part) =
        reporter_and_partition(state, req.broker, req.broker_epoch, req.topic, req.partition)?;
    let name = || format!("{}-{}", topic.name, req.partition);
    if req.leader_epoch > part.leader_epoch || req.partition_epoch > part.partition_epoch {
        return Err(AdminError::new(
            ResponseError::NotController,
            format!("{}: the request's epochs are ahead of this controller's.", name()),
        ));
    }
    if req.leader_epoch < part.leader_epoch {
        return Err(AdminError::new(
            ResponseError::FencedLeaderEpoch,
            format!(
                "{}: leader epoch {} is not {}.",
                name(),
                req.leader_epoch,
                part.leader_epoch
            ),
        ));
    }
    if part.leader != Some(req.broker) {
        return Err(AdminError::new(
            ResponseError::InvalidRequest,
            format!("{}: broker {} is not the leader.", name(), req.broker),
        ));
    }
    if req.partition_epoch < part.partition_epoch {
        return Err(AdminError::new(
            ResponseError::InvalidUpdateVersion,
            format!(
                "{}: partition epoch {} is not {}.",
                name(),
                req.partition_epoch.0,
                part.partition_epoch.0
            ),
        ));
    }
    let isr: Vec<NodeId> = req.new_isr.iter().map(|m| m.broker).collect();
    let duplicate = isr.iter().enumerate().any(|(k, b)| isr[..k].contains(b));
    if isr.is_empty() || duplicate || isr.iter().any(|b| !part.has_replica(*b)) {
        return Err(AdminError::new(
            ResponseError::InvalidRequest,
            format!("{}: ISR {isr:?} is not a set of its replicas.", name()),
        ));
    }
    if !isr.contains(&req.broker) {
        return Err(AdminError::new(
            ResponseError::InvalidRequest,
            format!("{}: ISR {isr:?} leaves out the leader.", name()),
        ));
    }
    for m in &req.new_isr {
        let eligible = state
            .broker(m.broker)
            .is_some_and(|b| b.is_active() && m.epoch.is_none_or(|e| e == b.epoch));
        if !eligible {
            return Err(AdminError::new(
                ResponseError::IneligibleReplica,
                format!(
                    "{}: broker {} is not registered at that epoch, fenced or shutting down.",
                    name(),
                    m.broker
                ),
            ));
        }
    }
    let acceptable = |b: NodeId| state.is_active(b);
    // The leader is in the new ISR and active, so it stays: only the ISR changes.
    let reply_of = |leader, isr: &[NodeId], leader_epoch, partition_epoch| AlterPartitionReply {
        leader,
        isr: isr.to_vec(),
        leader_epoch,
        partition_epoch,
    };
    Ok(match change(req.topic, req.partition, part, isr, &acceptable) {
        Some(c) => {
            let reply = reply_of(c.leader, &c.isr, c.leader_epoch, c.partition_epoch);
            (vec![Record::PartitionChange(c)], reply)
        }
        None => (
            Vec::new(),
            reply_of(part.leader, &part.isr, part.leader_epoch, part.partition_epoch),
        ),
    })
}
