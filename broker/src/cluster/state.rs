//! [`ClusterState`]: what the metadata log says, rebuilt by applying its records in order.
//!
//! `apply` is pure and deterministic: every controller and every broker that applies the same
//! records holds the same state. A record that breaks an invariant is a bug in the controller
//! that proposed it, so `apply` asserts rather than returns an error. The records of one
//! controller decision are ordered so that each keeps what `apply` checks (partitions are moved
//! away from a broker before the record that fences it); one invariant holds only between
//! decisions, a partition being offline only while no member of its ISR is alive, and
//! [`ClusterState::check_invariants`] checks it with the rest after a whole decision.
//!
//! Offsets count records, not Raft entries: a broker's epoch is the offset of its registration
//! record, and a broker that reports having applied past it has seen its own registration.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use strand_protocol::types::{validate_topic_name, LeaderEpoch, NodeId, PartitionId, ShardId, TopicId};

use super::record::{
    BrokerEpoch, ConfigRecord, ConfigResource, Endpoint, IncarnationId, MetadataOffset, PartitionChange,
    PartitionEpoch, PartitionRecord, Record, RegisterBroker, Replica,
};

/// A registered broker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BrokerRegistration {
    pub id: NodeId,
    pub incarnation: IncarnationId,
    pub epoch: BrokerEpoch,
    pub endpoints: Vec<Endpoint>,
    pub rack: Option<String>,
    pub shards: u16,
    /// Fenced: not alive (registered but not yet caught up, or its session expired). Leads
    /// nothing, is in no ISR of a partition that has a leader, and is not listed to clients.
    pub fenced: bool,
    /// In controlled shutdown: alive, but leads nothing and joins no ISR.
    pub in_controlled_shutdown: bool,
}

impl BrokerRegistration {
    /// May lead and be in an ISR: unfenced and not shutting down (Kafka's "active").
    pub fn is_active(&self) -> bool {
        !self.fenced && !self.in_controlled_shutdown
    }

    /// The endpoint of a listener.
    pub fn endpoint(&self, listener: &str) -> Option<&Endpoint> {
        self.endpoints.iter().find(|e| e.listener == listener)
    }
}

/// A partition's registration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartitionRegistration {
    /// In preference order: the first is the preferred leader.
    pub replicas: Vec<Replica>,
    pub isr: Vec<NodeId>,
    /// `None`: offline (Kafka's leader -1).
    pub leader: Option<NodeId>,
    pub leader_epoch: LeaderEpoch,
    pub partition_epoch: PartitionEpoch,
}

impl PartitionRegistration {
    pub fn replica_brokers(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.replicas.iter().map(|r| r.broker)
    }

    pub fn has_replica(&self, broker: NodeId) -> bool {
        self.replicas.iter().any(|r| r.broker == broker)
    }

    pub fn preferred_leader(&self) -> Option<NodeId> {
        self.replicas.first().map(|r| r.broker)
    }

    /// The shard of `broker` that owns its replica.
    pub fn shard_of(&self, broker: NodeId) -> Option<ShardId> {
        self.replicas.iter().find(|r| r.broker == broker).map(|r| r.shard)
    }
}

/// A topic and its partitions (index = partition id).
///
/// Each registration is shared (`Arc`) between the copies of a state: every shard of every
/// node holds the cluster state, and a change (one election) replaces one registration, so a
/// copy of a state of 10,000 partitions costs 10,000 reference counts, not 20,000 vectors.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopicState {
    pub name: String,
    pub id: TopicId,
    pub partitions: Vec<Arc<PartitionRegistration>>,
}

impl TopicState {
    pub fn partition(&self, p: PartitionId) -> Option<&PartitionRegistration> {
        usize::try_from(p.0)
            .ok()
            .and_then(|i| self.partitions.get(i))
            .map(|p| &**p)
    }
}

/// A partition as Metadata and DescribeCluster show it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartitionView {
    pub leader: Option<NodeId>,
    pub leader_epoch: LeaderEpoch,
    pub replicas: Vec<NodeId>,
    pub isr: Vec<NodeId>,
    /// Replicas on brokers that are fenced (not alive).
    pub offline_replicas: Vec<NodeId>,
}

/// A replica a broker hosts ([`ClusterState::hosted_by`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostedReplica {
    pub topic: TopicId,
    pub partition: PartitionId,
    pub shard: ShardId,
    pub leader: bool,
    pub leader_epoch: LeaderEpoch,
}

/// The replicated cluster metadata.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterState {
    /// The offset the next applied record takes.
    pub(super) next_offset: MetadataOffset,
    pub(super) brokers: BTreeMap<NodeId, BrokerRegistration>,
    pub(super) topics: BTreeMap<TopicId, TopicState>,
    pub(super) topics_by_name: BTreeMap<String, TopicId>,
    pub(super) configs: BTreeMap<ConfigResource, BTreeMap<String, String>>,
    /// Producer ids below this have been handed out.
    pub(super) next_producer_id: i64,
}

impl ClusterState {
    /// The offset the next applied record takes: the count of records applied so far.
    pub fn next_offset(&self) -> MetadataOffset {
        self.next_offset
    }

    pub fn broker(&self, id: NodeId) -> Option<&BrokerRegistration> {
        self.brokers.get(&id)
    }

    /// Every registered broker, fenced ones included, by id.
    pub fn brokers(&self) -> impl Iterator<Item = &BrokerRegistration> {
        self.brokers.values()
    }

    /// The brokers clients are told about (Metadata, DescribeCluster): the unfenced ones, by id.
    /// A broker in controlled shutdown is still listed, as Kafka lists it: it serves until it
    /// stops.
    pub fn live_brokers(&self) -> impl Iterator<Item = &BrokerRegistration> {
        self.brokers.values().filter(|b| !b.fenced)
    }

    /// The live brokers' endpoints on one listener, by broker id (a broker without that
    /// listener is left out, as Kafka leaves it out of Metadata on that listener).
    pub fn live_endpoints<'a>(
        &'a self,
        listener: &'a str,
    ) -> impl Iterator<Item = (NodeId, &'a Endpoint)> + 'a {
        self.live_brokers()
            .filter_map(move |b| b.endpoint(listener).map(|e| (b.id, e)))
    }

    pub fn is_active(&self, id: NodeId) -> bool {
        self.brokers.get(&id).is_some_and(BrokerRegistration::is_active)
    }

    pub fn topic(&self, id: TopicId) -> Option<&TopicState> {
        self.topics.get(&id)
    }

    pub fn topic_by_name(&self, name: &str) -> Option<&TopicState> {
        self.topics_by_name.get(name).and_then(|id| self.topics.get(id))
    }

    /// Topics by id.
    pub fn topics(&self) -> impl Iterator<Item = &TopicState> {
        self.topics.values()
    }

    pub fn partition(&self, topic: TopicId, p: PartitionId) -> Option<&PartitionRegistration> {
        self.topics.get(&topic).and_then(|t| t.partition(p))
    }

    /// Every partition, by topic id then partition.
    pub fn partitions(&self) -> impl Iterator<Item = (TopicId, PartitionId, &PartitionRegistration)> {
        self.topics.values().flat_map(|t| {
            t.partitions
                .iter()
                .enumerate()
                .map(move |(i, p)| (t.id, PartitionId(i as i32), &**p))
        })
    }

    /// A partition as Metadata shows it.
    pub fn partition_view(&self, topic: TopicId, p: PartitionId) -> Option<PartitionView> {
        let part = self.partition(topic, p)?;
        Some(PartitionView {
            leader: part.leader,
            leader_epoch: part.leader_epoch,
            replicas: part.replica_brokers().collect(),
            isr: part.isr.clone(),
            offline_replicas: part
                .replica_brokers()
                .filter(|b| self.brokers.get(b).is_none_or(|r| r.fenced))
                .collect(),
        })
    }

    /// Producer ids below this have been handed out (InitProducerId on any broker).
    pub fn next_producer_id(&self) -> i64 {
        self.next_producer_id
    }

    /// The partitions with a replica on `broker`, by topic id then partition: the shard of the
    /// broker that owns each, and whether the broker leads it. What a broker opens, and which
    /// of them it serves writes for, after applying records.
    pub fn hosted_by(&self, broker: NodeId) -> impl Iterator<Item = HostedReplica> + '_ {
        self.partitions().filter_map(move |(topic, partition, p)| {
            p.shard_of(broker).map(|shard| HostedReplica {
                topic,
                partition,
                shard,
                leader: p.leader == Some(broker),
                leader_epoch: p.leader_epoch,
            })
        })
    }

    /// The resources with config overrides, in order.
    pub fn config_resources(&self) -> impl Iterator<Item = (&ConfigResource, &BTreeMap<String, String>)> {
        self.configs.iter()
    }

    /// How many resources have config overrides.
    pub fn config_resource_count(&self) -> usize {
        self.configs.len()
    }

    /// The config overrides of a resource (empty: none).
    pub fn configs(&self, resource: &ConfigResource) -> Option<&BTreeMap<String, String>> {
        self.configs.get(resource)
    }

    /// How many partitions `broker` leads.
    pub fn leader_count(&self, broker: NodeId) -> usize {
        self.partitions()
            .filter(|(_, _, p)| p.leader == Some(broker))
            .count()
    }

    /// Applies the records of one decision (one committed Raft entry, [`super::decode_batch`]).
    /// Debug builds then check every invariant, which holds between decisions. Panics on a
    /// record that breaks an invariant: the controller that proposed it has a bug, and a state
    /// that went wrong must not be served.
    pub fn apply_batch(&mut self, records: &[Record]) {
        if let Err(e) = self.try_apply_batch(records) {
            panic!("{e}");
        }
    }

    /// [`ClusterState::apply_batch`] for records that came over the network (a broker-only
    /// node's fetch): a record that breaks an invariant is an error, not a panic. The records
    /// before it stay applied; the caller drops the state and starts again from a snapshot.
    pub fn try_apply_batch(&mut self, records: &[Record]) -> Result<(), String> {
        if let Some(why) = self.stale_changes(records) {
            // A decision built on an older state of the partitions is in the log. The
            // controller decides one at a time on an up-to-date state
            // (`quorum::Controller::decide`), so this is a bug; but the batch is committed, and
            // refusing it would stop every node that applies it, at every restart. Every node
            // skips the whole decision alike (its other records were built on the same state),
            // so the states stay equal; the controller decides again on the state it has.
            tracing::error!(
                offset = self.next_offset.0,
                records = records.len(),
                %why,
                ?records,
                "a metadata decision built on an older state was skipped"
            );
            // Tests and the simulations still stop on it.
            if cfg!(debug_assertions) {
                return Err(why);
            }
            self.next_offset = MetadataOffset(self.next_offset.0 + records.len() as u64);
            return Ok(());
        }
        for r in records {
            self.try_apply(r)?;
        }
        if cfg!(debug_assertions) {
            if let Some(v) = self.invariant_violation() {
                return Err(v);
            }
        }
        Ok(())
    }

    /// Why `records` (one decision) were built on an older state than this one: a partition
    /// change whose epoch is not the one after the partition's (counting the decision's own
    /// earlier changes to it).
    fn stale_changes(&self, records: &[Record]) -> Option<String> {
        let mut epochs: HashMap<(TopicId, PartitionId), i32> = HashMap::new();
        for r in records {
            if let Record::PartitionChange(c) = r {
                let key = (c.topic, c.partition);
                let current = match epochs.get(&key) {
                    Some(e) => *e,
                    None => self.partition(c.topic, c.partition)?.partition_epoch.0,
                };
                if c.partition_epoch.0 != current + 1 {
                    return Some(format!(
                        "{}-{}: change to partition epoch {} at epoch {current}",
                        c.topic, c.partition, c.partition_epoch.0
                    ));
                }
                epochs.insert(key, c.partition_epoch.0);
            }
        }
        None
    }

    /// Applies one record; panics on one that breaks an invariant (see
    /// [`ClusterState::apply_batch`]).
    pub fn apply(&mut self, record: &Record) {
        if let Err(e) = self.try_apply(record) {
            panic!("{e}");
        }
    }

    /// Applies one record, or refuses it, unapplied, when it breaks an invariant.
    pub fn try_apply(&mut self, record: &Record) -> Result<(), String> {
        let offset = self.next_offset;
        match record {
            Record::RegisterBroker(r) => self.apply_register(r, offset)?,
            Record::BrokerFenced { broker, epoch } => {
                let b = self.registration(*broker, *epoch, "BrokerFenced")?;
                ensure(!b.fenced, || format!("broker {broker} fenced twice"))?;
                self.leads_nothing(*broker, "fenced")?;
                let b = self.registration_mut(*broker, *epoch, "BrokerFenced")?;
                b.fenced = true;
                b.in_controlled_shutdown = false;
            }
            Record::BrokerUnfenced { broker, epoch } => {
                let b = self.registration_mut(*broker, *epoch, "BrokerUnfenced")?;
                ensure(b.fenced, || format!("broker {broker} unfenced but not fenced"))?;
                b.fenced = false;
            }
            Record::BrokerShutdown { broker, epoch } => {
                let b = self.registration(*broker, *epoch, "BrokerShutdown")?;
                ensure(!b.fenced && !b.in_controlled_shutdown, || {
                    format!("broker {broker} entered controlled shutdown while fenced or shutting down")
                })?;
                self.leads_nothing(*broker, "in controlled shutdown")?;
                self.registration_mut(*broker, *epoch, "BrokerShutdown")?
                    .in_controlled_shutdown = true;
            }
            Record::Topic { name, id } => {
                ensure(validate_topic_name(name).is_ok(), || {
                    format!("bad topic name {name:?}")
                })?;
                ensure(!id.is_zero(), || format!("topic {name} with the zero id"))?;
                ensure(!self.topics_by_name.contains_key(name), || {
                    format!("topic {name} created twice")
                })?;
                ensure(!self.topics.contains_key(id), || format!("topic id {id} reused"))?;
                self.topics_by_name.insert(name.clone(), *id);
                self.topics.insert(
                    *id,
                    TopicState {
                        name: name.clone(),
                        id: *id,
                        partitions: Vec::new(),
                    },
                );
            }
            Record::Partition(p) => self.apply_partition(p)?,
            Record::PartitionChange(c) => self.apply_change(c)?,
            Record::Config(c) => self.apply_config(c)?,
            Record::ProducerIds {
                broker,
                broker_epoch,
                next_producer_id,
            } => {
                self.registration(*broker, *broker_epoch, "ProducerIds")?;
                ensure(*next_producer_id > self.next_producer_id, || {
                    format!(
                        "producer ids handed out twice: {next_producer_id} after {}",
                        self.next_producer_id
                    )
                })?;
                self.next_producer_id = *next_producer_id;
            }
            Record::RemoveTopic { id } => {
                let Some(t) = self.topics.remove(id) else {
                    return Err(format!("removing unknown topic {id}"));
                };
                self.topics_by_name.remove(&t.name);
                self.configs.remove(&ConfigResource::Topic(t.name));
            }
        }
        self.next_offset = MetadataOffset(offset.0 + 1);
        Ok(())
    }

    fn apply_register(&mut self, r: &RegisterBroker, offset: MetadataOffset) -> Result<(), String> {
        ensure(r.shards >= 1, || {
            format!("broker {} registered with no shards", r.broker)
        })?;
        let amend = match self.brokers.get(&r.broker) {
            Some(old) if old.incarnation == r.incarnation => {
                ensure(old.epoch == r.epoch, || {
                    format!("broker {}: an amended registration keeps its epoch", r.broker)
                })?;
                ensure(old.shards == r.shards, || {
                    format!("broker {}: one process does not change its shard count", r.broker)
                })?;
                true
            }
            Some(old) => {
                ensure(old.fenced, || {
                    format!(
                        "broker {} re-registered before its old incarnation was fenced",
                        r.broker
                    )
                })?;
                ensure(r.epoch > old.epoch, || {
                    format!("broker {}: broker epochs only grow", r.broker)
                })?;
                false
            }
            None => false,
        };
        if !amend {
            ensure(i64::try_from(offset.0).ok() == Some(r.epoch.0), || {
                format!(
                    "broker {}: a new broker epoch ({}) is its registration's offset ({})",
                    r.broker, r.epoch.0, offset.0
                )
            })?;
        }
        let (fenced, in_controlled_shutdown) = match self.brokers.get(&r.broker) {
            Some(old) if amend => (old.fenced, old.in_controlled_shutdown),
            _ => (true, false),
        };
        self.brokers.insert(
            r.broker,
            BrokerRegistration {
                id: r.broker,
                incarnation: r.incarnation,
                epoch: r.epoch,
                endpoints: r.endpoints.clone(),
                rack: r.rack.clone(),
                shards: r.shards,
                fenced,
                in_controlled_shutdown,
            },
        );
        Ok(())
    }

    fn apply_partition(&mut self, p: &PartitionRecord) -> Result<(), String> {
        ensure(p.leader_epoch == LeaderEpoch(0), || {
            format!(
                "{}-{}: a new partition starts at leader epoch 0",
                p.topic, p.partition
            )
        })?;
        ensure(p.partition_epoch == PartitionEpoch(0), || {
            format!(
                "{}-{}: a new partition starts at partition epoch 0",
                p.topic, p.partition
            )
        })?;
        let reg = PartitionRegistration {
            replicas: p.replicas.clone(),
            isr: p.isr.clone(),
            leader: p.leader,
            leader_epoch: p.leader_epoch,
            partition_epoch: p.partition_epoch,
        };
        self.partition_valid(&reg, p.topic, p.partition)?;
        let Some(t) = self.topics.get_mut(&p.topic) else {
            return Err(format!("partition of unknown topic {}", p.topic));
        };
        ensure(
            usize::try_from(p.partition.0).ok() == Some(t.partitions.len()),
            || format!("partitions of {} are created in order", t.name),
        )?;
        t.partitions.push(Arc::new(reg));
        Ok(())
    }

    fn apply_change(&mut self, c: &PartitionChange) -> Result<(), String> {
        let Some(old) = self.partition(c.topic, c.partition) else {
            return Err(format!("change to unknown partition {}-{}", c.topic, c.partition));
        };
        // (A whole decision built on an older registration is skipped before it gets here:
        // `try_apply_batch`.)
        ensure(c.partition_epoch.0 == old.partition_epoch.0 + 1, || {
            format!(
                "{}-{}: partition epochs go up by one per change: {} after {}",
                c.topic, c.partition, c.partition_epoch.0, old.partition_epoch.0
            )
        })?;
        // A leader is recorded with the epoch (Raft term) it was elected in: another leader
        // needs a newer epoch; the same leader may be re-elected, and a leader taken away may
        // return, in the same or a newer one. Taking a leader away keeps the epoch.
        let what = format!("{}-{}", c.topic, c.partition);
        if c.leader.is_none() {
            ensure(c.leader_epoch == old.leader_epoch, || {
                format!("{what}: a leader taken away keeps the epoch")
            })?;
        } else if c.leader == old.leader || old.leader.is_none() {
            ensure(c.leader_epoch >= old.leader_epoch, || {
                format!("{what}: leader epochs never go back")
            })?;
        } else {
            ensure(c.leader_epoch > old.leader_epoch, || {
                format!("{what}: a new leader has a newer epoch")
            })?;
        }
        let mut new = old.clone();
        new.leader = c.leader;
        new.isr = c.isr.clone();
        new.leader_epoch = c.leader_epoch;
        new.partition_epoch = c.partition_epoch;
        if let Some(shards) = &c.shards {
            ensure(shards.len() == new.replicas.len(), || {
                format!("{what}: one shard per replica")
            })?;
            for (r, s) in new.replicas.iter_mut().zip(shards) {
                r.shard = *s;
            }
        }
        self.partition_valid(&new, c.topic, c.partition)?;
        if let Some(slot) = self.topics.get_mut(&c.topic).and_then(|t| {
            t.partitions
                .get_mut(usize::try_from(c.partition.0).unwrap_or(usize::MAX))
        }) {
            *slot = Arc::new(new);
        }
        Ok(())
    }

    fn apply_config(&mut self, c: &ConfigRecord) -> Result<(), String> {
        if let ConfigResource::Topic(name) = &c.resource {
            ensure(self.topics_by_name.contains_key(name), || {
                format!("config of unknown topic {name}")
            })?;
        }
        let entry = self.configs.entry(c.resource.clone()).or_default();
        for (k, v) in &c.entries {
            match v {
                Some(v) => {
                    entry.insert(k.clone(), v.clone());
                }
                None => {
                    entry.remove(k);
                }
            }
        }
        if entry.is_empty() {
            self.configs.remove(&c.resource);
        }
        Ok(())
    }

    fn registration(
        &self,
        broker: NodeId,
        epoch: BrokerEpoch,
        what: &str,
    ) -> Result<&BrokerRegistration, String> {
        self.brokers
            .get(&broker)
            .filter(|b| b.epoch == epoch)
            .ok_or_else(|| format!("{what} for broker {broker} at a stale epoch {epoch:?}"))
    }

    fn registration_mut(
        &mut self,
        broker: NodeId,
        epoch: BrokerEpoch,
        what: &str,
    ) -> Result<&mut BrokerRegistration, String> {
        self.brokers
            .get_mut(&broker)
            .filter(|b| b.epoch == epoch)
            .ok_or_else(|| format!("{what} for broker {broker} at a stale epoch {epoch:?}"))
    }

    /// A fenced or shutting-down broker leads nothing and is in no ISR of a partition that has
    /// a leader.
    fn leads_nothing(&self, broker: NodeId, why: &str) -> Result<(), String> {
        for (t, p, part) in self.partitions() {
            if part.leader == Some(broker) {
                return Err(format!("broker {broker} {why} but leads {t}-{p}"));
            }
            if part.leader.is_some() && part.isr.contains(&broker) {
                return Err(format!("broker {broker} {why} but is in the ISR of {t}-{p}"));
            }
        }
        Ok(())
    }

    /// The invariants of one partition against the brokers as they are now.
    fn partition_valid(&self, p: &PartitionRegistration, t: TopicId, i: PartitionId) -> Result<(), String> {
        if p.replicas.is_empty() {
            return Err(format!("{t}-{i} has no replicas"));
        }
        for (k, r) in p.replicas.iter().enumerate() {
            let Some(b) = self.brokers.get(&r.broker) else {
                return Err(format!("{t}-{i}: replica on unregistered broker {}", r.broker));
            };
            if r.shard.0 >= b.shards {
                return Err(format!(
                    "{t}-{i}: replica on broker {} shard {} beyond its shard count",
                    r.broker, r.shard
                ));
            }
            if p.replicas.iter().take(k).any(|o| o.broker == r.broker) {
                return Err(format!("{t}-{i}: broker {} holds two replicas", r.broker));
            }
        }
        if p.isr.is_empty() {
            return Err(format!("{t}-{i}: empty ISR"));
        }
        for (k, b) in p.isr.iter().enumerate() {
            if !p.has_replica(*b) {
                return Err(format!("{t}-{i}: ISR member {b} is not a replica"));
            }
            if p.isr.iter().take(k).any(|o| o == b) {
                return Err(format!("{t}-{i}: {b} twice in the ISR"));
            }
        }
        // A partition may be leaderless until its group's election is reported (a leader taken
        // away, or no ISR member back yet); a led one has its leader and only active brokers in
        // its ISR.
        if let Some(l) = p.leader {
            if !p.isr.contains(&l) {
                return Err(format!("{t}-{i}: leader {l} not in the ISR {:?}", p.isr));
            }
            if let Some(b) = p.isr.iter().find(|b| !self.is_active(**b)) {
                return Err(format!("{t}-{i}: ISR member {b} is fenced or shutting down"));
            }
        }
        if p.leader_epoch.0 < 0 || p.partition_epoch.0 < 0 {
            return Err(format!(
                "{t}-{i}: epochs {} / {}",
                p.leader_epoch, p.partition_epoch.0
            ));
        }
        Ok(())
    }

    /// The first broken invariant of the whole state, if any.
    pub fn invariant_violation(&self) -> Option<String> {
        for (t, p, part) in self.partitions() {
            if let Err(e) = self.partition_valid(part, t, p) {
                return Some(e);
            }
        }
        for b in self.brokers.values() {
            if b.shards == 0 {
                return Some(format!("broker {} has no shards", b.id));
            }
            if b.fenced && b.in_controlled_shutdown {
                return Some(format!("broker {} fenced and in controlled shutdown", b.id));
            }
            if !b.is_active() {
                if let Err(e) = self.leads_nothing(b.id, "is not active") {
                    return Some(e);
                }
            }
            if u64::try_from(b.epoch.0).map_or(true, |e| e >= self.next_offset.0) {
                return Some(format!(
                    "broker {} epoch {} is not an applied offset",
                    b.id, b.epoch.0
                ));
            }
        }
        if self.next_producer_id < 0 {
            return Some(format!("next producer id {}", self.next_producer_id));
        }
        if self.topics.len() != self.topics_by_name.len() {
            return Some("topic names and ids disagree".into());
        }
        for (name, id) in &self.topics_by_name {
            if self.topics.get(id).map(|t| t.name.as_str()) != Some(name.as_str()) {
                return Some(format!("topic {name} is not topic {id}"));
            }
        }
        for (resource, entries) in &self.configs {
            if entries.is_empty() {
                return Some(format!("empty config entry for {resource:?}"));
            }
            if let ConfigResource::Topic(name) = resource {
                if !self.topics_by_name.contains_key(name) {
                    return Some(format!("configs of unknown topic {name}"));
                }
            }
        }
        None
    }

    /// Checks every invariant over the whole state (tests and simulations call it after every
    /// step; `apply` checks what each record touches).
    pub fn check_invariants(&self) {
        if let Some(v) = self.invariant_violation() {
            panic!("{v}");
        }
    }
}

/// `Ok` when `holds`, else the error `why` describes.
fn ensure(holds: bool, why: impl FnOnce() -> String) -> Result<(), String> {
    if holds {
        Ok(())
    } else {
        Err(why())
    }
}
