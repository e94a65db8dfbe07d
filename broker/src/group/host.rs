//! Runs a shard's [`GroupCoordinator`]: feeds it requests and timer ticks, carries out its
//! actions (answers, appends to `__consumer_offsets`, wake-ups), and loads its partitions of
//! `__consumer_offsets`.
//!
//! The coordinator is a sans-I/O state machine; everything that waits (the disk, Raft, the
//! clock) happens here. A group lives on the shard owning its `__consumer_offsets` partition
//! (Java's `String.hashCode` of the group id, as Kafka computes it), so its state is touched by
//! one thread. Requests reach it as [`GroupCall`]s, the group host's service on every shard
//! ([`super::route::forward`] sends one). An answer leaves only once every write issued before
//! it on its partition is durable (see [`crate::group`]). The partition count of
//! `__consumer_offsets` is the existing topic's, whatever the setting says later
//! ([`offsets_partitions_in_use`]).
//!
//! - **Standalone**: the topic is the node's own; every partition is loaded at start-up, and a
//!   partition again after a write to it failed (the coordinator dropped its state, which may
//!   hold changes the log does not). Records are appended to the local log.
//! - **Cluster**: the topic is the cluster's, replicated like any partition
//!   (`offsets.topic.replication.factor`), and a group's coordinator is the leader of its
//!   partition, as in Kafka. Every [`LEADERSHIP_CHECK`] the host loads each partition whose
//!   replica on this shard leads with its whole log committed, again in each new leader epoch
//!   (another leader may have written in between), and unloads each it no longer leads, or
//!   leads without hearing a majority of its replicas' nodes (cut off from them, it may have
//!   been replaced): its groups answer NOT_COORDINATOR, and clients find the new leader. A load
//!   waits for a majority to confirm the leadership (a Raft read-index round), and a shard that
//!   stood still (its time marked more than [`STALL`] ago, found before the next request or
//!   mark) unloads every partition first, since a leader that was stopped or cut off may not
//!   know yet that another was elected. Records are proposed to the
//!   partition's Raft group and a write is answered once committed on a majority, so a
//!   commit acknowledged to a client survives the loss of its coordinator. A write that fails
//!   (the leadership lost) drops the partition's state until it is loaded again.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::rc::{Rc, Weak};

use futures::channel::oneshot;
use futures::future::LocalBoxFuture;
use futures::FutureExt;
use strand_protocol::types::{ShardId, TopicId};

use super::records::{batch_records, build_batch};
use super::{
    Action, GroupConfig, GroupCoordinator, GroupRequest, GroupResponse, RequestMeta, RequestToken,
    TopicMetadata,
};
use crate::config::Config;
use crate::metadata::{ClusterMetadata, MetadataDelta};
use crate::shard::service::{Service, ShardHooks};
use crate::shard::tasks::{tick_loop, Ticked};
use crate::shard::Shard;

/// The internal topic of committed offsets and group state.
pub(crate) const OFFSETS_TOPIC: &str = crate::internal_topics::CONSUMER_OFFSETS;
/// Upper bound for decompressing one `__consumer_offsets` batch while loading.
const MAX_BATCH_DECOMPRESSED_BYTES: usize = 64 << 20;

/// The coordinator's view of topics: the shard's metadata replica.
struct Topics(Rc<ClusterMetadata>);

impl TopicMetadata for Topics {
    fn topic_by_name(&self, name: &str) -> Option<(TopicId, i32)> {
        self.0.topic(name).map(|t| (t.id, t.partitions))
    }

    fn topic_by_id(&self, id: TopicId) -> Option<(String, i32)> {
        self.0.topic_by_id(id).map(|t| (t.name.clone(), t.partitions))
    }

    fn topic_names(&self) -> Vec<String> {
        self.0
            .topics()
            .filter(|t| !t.internal)
            .map(|t| t.name.clone())
            .collect()
    }

    fn group_config_int(&self, group: &str, key: &str) -> Option<i32> {
        self.0.group_config(group).and_then(|g| g.int(key))
    }
}

/// The topics of the cluster state: what a cluster node checks committed offsets against after
/// a load (its local metadata can lag the state it was elected under).
struct ClusterTopics(Rc<crate::cluster::ClusterState>);

impl TopicMetadata for ClusterTopics {
    fn topic_by_name(&self, name: &str) -> Option<(TopicId, i32)> {
        self.0
            .topic_by_name(name)
            .map(|t| (t.id, i32::try_from(t.partitions.len()).unwrap_or(i32::MAX)))
    }

    fn topic_by_id(&self, id: TopicId) -> Option<(String, i32)> {
        self.0.topic(id).map(|t| {
            (
                t.name.clone(),
                i32::try_from(t.partitions.len()).unwrap_or(i32::MAX),
            )
        })
    }

    fn topic_names(&self) -> Vec<String> {
        self.0.topics().map(|t| t.name.clone()).collect()
    }
}

/// How often a cluster node's group host checks which `__consumer_offsets` partitions its
/// shard leads: a bound on how long a new leader's groups wait to be loaded, and on how long
/// an old leader keeps answering for them from memory after it lost the leadership (its writes
/// fail at once: they need a Raft majority).
const LEADERSHIP_CHECK: std::time::Duration = std::time::Duration::from_millis(50);
/// How late a leadership check may come before the host takes its shard to have stood still:
/// under the replication's leader lease (600 ms), within which no other replica is elected.
const STALL: std::time::Duration = std::time::Duration::from_millis(500);

/// The partition count of `__consumer_offsets` to run with: the existing topic's. The setting
/// `offsets.topic.num.partitions` only sizes the topic when it is created (Kafka reads the count
/// of the existing topic at start-up too); a changed setting would otherwise map groups to other
/// partitions and hide them. Called once at start-up, after the topic is ensured, to fix
/// `Config::offsets_topic_num_partitions` for every shard.
pub(crate) fn offsets_partitions_in_use(metadata: &ClusterMetadata, configured: u32) -> u32 {
    let Some(existing) = metadata
        .topic(OFFSETS_TOPIC)
        .and_then(|t| u32::try_from(t.partitions).ok())
    else {
        return configured;
    };
    if existing != configured {
        tracing::warn!(
            configured,
            existing,
            "offsets.topic.num.partitions differs from the partition count of the existing \
             {OFFSETS_TOPIC}; the setting only applies when the topic is created, so groups keep \
             using {existing} partitions"
        );
    }
    existing
}

/// The partition count of `__consumer_offsets` (see [`offsets_partitions_in_use`]).
fn offsets_partitions(config: &Config) -> i32 {
    i32::try_from(config.offsets_topic_num_partitions).unwrap_or(50)
}

pub(crate) fn group_config(config: &Config) -> GroupConfig {
    GroupConfig {
        offsets_partitions: offsets_partitions(config),
        min_session_timeout_ms: config.group_min_session_timeout_ms,
        max_session_timeout_ms: config.group_max_session_timeout_ms,
        initial_rebalance_delay_ms: config.group_initial_rebalance_delay_ms,
        classic_max_size: config.group_max_size as usize,
        consumer_max_size: config.group_consumer_max_size as usize,
        consumer_session_timeout_ms: config.group_consumer_session_timeout_ms,
        consumer_heartbeat_interval_ms: config.group_consumer_heartbeat_interval_ms,
        offsets_retention_ms: i64::from(config.offsets_retention_minutes) * 60_000,
        offsets_retention_check_interval_ms: config.offsets_retention_check_interval_ms,
        offset_metadata_max_bytes: config.offset_metadata_max_bytes as usize,
        ..GroupConfig::default()
    }
}

/// The shard of this node that coordinates `group_id`: the owner of its `__consumer_offsets`
/// partition (on a cluster node, the shard the cluster placed this node's replica on).
pub(crate) fn coordinator_shard(group_id: &str, shard: &Shard) -> ShardId {
    shard.owner(
        OFFSETS_TOPIC,
        crate::group::partition_for(group_id, offsets_partitions(&shard.config)),
    )
}

/// Group ids that name another kind of group on this shard (share groups, whose coordinator
/// lives on the same shard): a classic or consumer group request naming one is refused.
pub(crate) trait OtherGroups {
    fn is_other_group(&self, group_id: &str) -> bool;
}

/// A group request for the coordinator shard of its group.
pub(crate) struct GroupCall {
    pub(crate) meta: RequestMeta,
    pub(crate) req: Box<GroupRequest>,
}

pub(crate) struct GroupHost {
    /// Itself, for the tasks it spawns.
    me: Weak<GroupHost>,
    core: Rc<Shard>,
    coordinator: RefCell<GroupCoordinator>,
    waiters: RefCell<HashMap<RequestToken, oneshot::Sender<GroupResponse>>>,
    next_token: Cell<u64>,
    /// Wakes the timer task when the coordinator asks for an earlier tick.
    wake: strand_storage::notify::Notify,
    other_groups: RefCell<Option<Weak<dyn OtherGroups>>>,
    /// On a cluster node: the partitions of `__consumer_offsets` loaded as their leader, with
    /// the leader epoch they were loaded in.
    led: RefCell<BTreeMap<i32, i32>>,
    /// When [`mark_time`] last ran, and how many stalls [`GroupHost::check_stall`] found.
    marked_at: Cell<std::time::Instant>,
    stalls: Cell<u64>,
}

impl GroupHost {
    pub(crate) fn new(core: Rc<Shard>) -> Rc<Self> {
        let seed = u64::from(core.id.0) ^ 0x5eed_0000;
        Rc::new_cyclic(|me| GroupHost {
            me: me.clone(),
            coordinator: RefCell::new(GroupCoordinator::new(group_config(&core.config), seed)),
            core,
            waiters: RefCell::new(HashMap::new()),
            next_token: Cell::new(1),
            wake: strand_storage::notify::Notify::new(),
            other_groups: RefCell::new(None),
            led: RefCell::new(BTreeMap::new()),
            marked_at: Cell::new(std::time::Instant::now()),
            stalls: Cell::new(0),
        })
    }

    /// Tells the coordinator which group ids name other kinds of groups.
    pub(crate) fn set_other_groups(&self, other: Weak<dyn OtherGroups>) {
        *self.other_groups.borrow_mut() = Some(other);
    }

    /// Handles a group request; the answer may come later (a JoinGroup waits for its rebalance).
    pub(crate) fn submit(&self, meta: RequestMeta, req: GroupRequest) -> oneshot::Receiver<GroupResponse> {
        let (tx, rx) = oneshot::channel();
        self.check_stall();
        if let Some(refused) = self.refuse_other_group_id(&req) {
            let _ = tx.send(refused);
            return rx;
        }
        let shard = &self.core;
        let token = RequestToken(self.next_token.get());
        self.next_token.set(token.0 + 1);
        self.waiters.borrow_mut().insert(token, tx);
        let topics = Topics(shard.metadata());
        let actions = self
            .coordinator
            .borrow_mut()
            .handle(shard.now_ms(), token, &meta, req, &topics);
        self.run(actions);
        rx
    }

    /// The answer to a classic or consumer group request naming a group of another kind, as
    /// Kafka gives it (INCONSISTENT_GROUP_PROTOCOL to JoinGroup, GROUP_ID_NOT_FOUND to the
    /// KIP-848 heartbeat); `None` for anything else.
    fn refuse_other_group_id(&self, req: &GroupRequest) -> Option<GroupResponse> {
        use kafka_protocol::messages::{ConsumerGroupHeartbeatResponse, JoinGroupResponse};
        use kafka_protocol::ResponseError;
        let other = self.other_groups.borrow().as_ref().and_then(Weak::upgrade)?;
        match req {
            GroupRequest::JoinGroup(r) if other.is_other_group(r.group_id.as_str()) => {
                Some(GroupResponse::JoinGroup(
                    JoinGroupResponse::default()
                        .with_error_code(ResponseError::InconsistentGroupProtocol.code())
                        .with_generation_id(-1),
                ))
            }
            GroupRequest::ConsumerGroupHeartbeat(r) if other.is_other_group(r.group_id.as_str()) => {
                Some(GroupResponse::ConsumerGroupHeartbeat(
                    ConsumerGroupHeartbeatResponse::default()
                        .with_error_code(ResponseError::GroupIdNotFound.code())
                        .with_error_message(Some(kafka_protocol::protocol::StrBytes::from_string(format!(
                            "Group {} is not a consumer group.",
                            r.group_id.as_str()
                        )))),
                ))
            }
            _ => None,
        }
    }

    /// Carries out the coordinator's actions.
    fn run(&self, actions: Vec<Action>) {
        for action in actions {
            match action {
                Action::Respond { token, response } => {
                    if let Some(tx) = self.waiters.borrow_mut().remove(&token) {
                        let _ = tx.send(response);
                    }
                }
                Action::Persist {
                    write_id,
                    partition,
                    records,
                } => self.persist(write_id, partition, &records),
                Action::WakeAt(_) => self.wake.notify_all(),
            }
        }
    }

    /// Appends one batch to a `__consumer_offsets` partition this shard writes and reports to
    /// the coordinator once it is durable (standalone) or committed (cluster), or failed.
    fn persist(&self, write_id: u64, partition: i32, records: &[super::Record]) {
        let shard = &self.core;
        let batch = build_batch(records, shard.now_ms());
        let appended = shard.append_own(OFFSETS_TOPIC, partition, bytes::Bytes::from(batch));
        let Some(host) = self.me.upgrade() else { return };
        glommio::spawn_local(async move {
            let result = appended.await.map(|_| ()).map_err(|e| e.to_string());
            let failed = result.is_err();
            if let Err(e) = &result {
                tracing::error!(partition, error = %e, "cannot persist group state; reloading the partition");
            }
            let actions = host
                .coordinator
                .borrow_mut()
                .persisted(host.core.now_ms(), write_id, result);
            host.run(actions);
            if failed {
                // The coordinator dropped the partition's state (it may hold changes the log
                // does not): rebuild it from what is durable, or, on a cluster node, from what
                // is committed once this shard leads the partition's whole log again.
                let actions = host.coordinator.borrow_mut().unload(partition);
                host.run(actions);
                if host.core.config.cluster.is_standalone() {
                    host.load_partition(partition).await;
                } else {
                    host.led.borrow_mut().remove(&partition);
                }
            }
        })
        .detach();
    }

    /// Loads this shard's partitions of `__consumer_offsets` (on a cluster node: starts
    /// following which ones it leads) and starts the timer task.
    pub(crate) async fn start(&self) {
        if self.core.config.cluster.is_standalone() {
            for p in 0..offsets_partitions(&self.core.config) {
                self.load_partition(p).await;
            }
        } else {
            self.marked_at.set(std::time::Instant::now());
            glommio::spawn_local(mark_time(self.me.clone())).detach();
            glommio::spawn_local(follow_leaders(self.me.clone())).detach();
        }
        glommio::spawn_local(tick_loop(self.me.clone())).detach();
    }

    /// On a cluster node: loads the groups of each `__consumer_offsets` partition once this
    /// shard leads it with its whole log committed (again after a new term: another leader may
    /// have written in between), and unloads those it no longer leads, or leads without
    /// hearing a majority of their replicas, whose groups then answer NOT_COORDINATOR and are
    /// found on the new leader.
    async fn follow_leadership(&self) {
        let shard = &self.core;
        for p in 0..offsets_partitions(&shard.config) {
            // A leader that stopped hearing a majority of the partition's replicas (cut off
            // from them) may have been replaced: it stops answering from memory.
            let leading = (shard.owner(OFFSETS_TOPIC, p) == shard.id)
                .then(|| shard.leadership(OFFSETS_TOPIC, p))
                .flatten()
                .filter(|l| l.is_local && shard.leads_with_a_majority(OFFSETS_TOPIC, p))
                .map(|l| l.epoch);
            let loaded = self.led.borrow().get(&p).copied();
            if loaded.is_some() && loaded != leading {
                self.led.borrow_mut().remove(&p);
                let actions = self.coordinator.borrow_mut().unload(p);
                self.run(actions);
                tracing::info!(
                    partition = p,
                    "no longer the group coordinator of the partition's groups"
                );
            }
            let Some(epoch) = leading else { continue };
            if self.led.borrow().contains_key(&p) || !shard.leads_whole_log(OFFSETS_TOPIC, p) {
                continue;
            }
            // A leader that was cut off or stalled may still think it leads: a majority
            // confirms it before its log is taken for the partition's state.
            if !shard.confirm_leadership(OFFSETS_TOPIC, p).await {
                continue;
            }
            if self.led.borrow().contains_key(&p) {
                continue;
            }
            let stalls = self.stalls.get();
            self.led.borrow_mut().insert(p, epoch);
            self.load_partition(p).await;
            if self.stalls.get() != stalls {
                // The shard stood still during the load: confirmed again first.
                self.led.borrow_mut().remove(&p);
                let actions = self.coordinator.borrow_mut().unload(p);
                self.run(actions);
            }
        }
    }

    /// On a cluster node, when the time was last marked more than [`STALL`] ago, the shard
    /// stood still (a stopped process, a stuck thread) for long enough that the other replicas
    /// may have elected another leader this one has not heard of: every partition loaded as
    /// leader is unloaded, and loaded again only once a majority confirms the leadership.
    /// Checked before each request is handled and by [`mark_time`], whichever runs first after
    /// the stall.
    fn check_stall(&self) {
        if self.core.config.cluster.is_standalone() || self.marked_at.get().elapsed() <= STALL {
            return;
        }
        self.marked_at.set(std::time::Instant::now());
        self.stalls.set(self.stalls.get() + 1);
        let led: Vec<i32> = std::mem::take(&mut *self.led.borrow_mut()).into_keys().collect();
        if !led.is_empty() {
            tracing::warn!(
                partitions = led.len(),
                "the shard stood still: its group coordinators wait for a majority to confirm them"
            );
        }
        for p in led {
            let actions = self.coordinator.borrow_mut().unload(p);
            self.run(actions);
        }
    }

    /// Loads the groups of one `__consumer_offsets` partition from its log (if this shard owns it).
    async fn load_partition(&self, p: i32) {
        let shard = &self.core;
        let Some(log) = shard.log_for(OFFSETS_TOPIC, p) else {
            return;
        };
        self.coordinator.borrow_mut().begin_load(p);
        let mut undecodable = 0usize;
        let read = shard
            .for_each_batch(log, |batch| {
                match batch_records(batch, MAX_BATCH_DECOMPRESSED_BYTES) {
                    Ok(records) => self.coordinator.borrow_mut().replay(p, records),
                    Err(_) => undecodable += 1,
                }
            })
            .await;
        if let Err(e) = read {
            tracing::error!(partition = p, error = %e, "cannot read group state");
        }
        let (stats, actions) = self.coordinator.borrow_mut().end_load(shard.now_ms(), p);
        if stats.groups > 0 || undecodable > 0 {
            tracing::info!(
                partition = p,
                groups = stats.groups,
                offsets = stats.offsets,
                undecodable,
                "loaded groups"
            );
        }
        self.run(actions);
        // Offsets of topics that no longer exist: a deletion whose tombstones were lost (a crash
        // before they were durable, a failed write, a leader that died before it wrote them).
        let (gone, actions) = match shard.cluster_state() {
            Some(state) => self.coordinator.borrow_mut().remove_offsets_of_missing_topics(
                shard.now_ms(),
                p,
                &ClusterTopics(state),
            ),
            None => self.coordinator.borrow_mut().remove_offsets_of_missing_topics(
                shard.now_ms(),
                p,
                &Topics(shard.metadata()),
            ),
        };
        if !gone.is_empty() {
            tracing::info!(partition = p, topics = ?gone, "removed committed offsets of deleted topics");
        }
        self.run(actions);
    }
}

/// A cluster node's group host following the leaderships of its `__consumer_offsets`
/// partitions, until the host is gone.
async fn follow_leaders(host: Weak<GroupHost>) {
    loop {
        {
            let Some(host) = host.upgrade() else { return };
            if host.core.shutting_down.get() {
                return;
            }
            host.follow_leadership().await;
        }
        glommio::timer::sleep(LEADERSHIP_CHECK).await;
    }
}

/// Marks the time every [`LEADERSHIP_CHECK`], on a cluster node, so that the host can tell that
/// its shard stood still ([`GroupHost::check_stall`]); a mark that comes more than [`STALL`]
/// late is such a stall itself.
async fn mark_time(host: Weak<GroupHost>) {
    loop {
        {
            let Some(host) = host.upgrade() else { return };
            if host.core.shutting_down.get() {
                return;
            }
            host.check_stall();
            host.marked_at.set(std::time::Instant::now());
        }
        glommio::timer::sleep(LEADERSHIP_CHECK).await;
    }
}

impl Service for GroupHost {
    type Request = GroupCall;
    type Response = Option<GroupResponse>;

    fn start(self: Rc<Self>, call: GroupCall) -> LocalBoxFuture<'static, Option<GroupResponse>> {
        let answer = self.submit(call.meta, *call.req);
        async move { answer.await.ok() }.boxed_local()
    }
}

impl ShardHooks for GroupHost {
    /// The committed offsets of deleted topics go (on every shard, since every shard coordinates
    /// some `__consumer_offsets` partitions).
    fn metadata_committed(&self, deltas: &[MetadataDelta]) {
        let host = self;
        let shard = &host.core;
        let deleted: BTreeSet<String> = deltas
            .iter()
            .filter_map(|d| match d {
                MetadataDelta::DeleteTopic { name, .. } => Some(name.clone()),
                _ => None,
            })
            .collect();
        if deleted.is_empty() {
            return;
        }
        let actions = host
            .coordinator
            .borrow_mut()
            .topics_deleted(shard.now_ms(), &deleted);
        host.run(actions);
    }
}

impl Ticked for GroupHost {
    fn core(&self) -> &Shard {
        &self.core
    }

    fn next_wake_ms(&self) -> Option<i64> {
        self.coordinator.borrow().next_wake()
    }

    fn wake(&self) -> &strand_storage::notify::Notify {
        &self.wake
    }

    fn tick(&self, now_ms: i64) {
        let actions = self.coordinator.borrow_mut().tick(now_ms);
        self.run(actions);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metadata::NewTopic;

    fn with_offsets_topic(partitions: i32) -> ClusterMetadata {
        let mut md = ClusterMetadata::default();
        let topic = NewTopic {
            name: OFFSETS_TOPIC.to_owned(),
            num_partitions: partitions,
            replication_factor: -1,
            assignments: vec![],
            configs: vec![],
        };
        let delta = md
            .plan_create(&topic, 1, 1, TopicId(uuid::Uuid::from_u128(1)))
            .unwrap();
        md.apply(&delta);
        md
    }

    #[test]
    fn groups_use_the_partition_count_of_the_existing_offsets_topic() {
        // The setting changed after the topic was created: the topic's count wins, so groups keep
        // their partitions.
        assert_eq!(offsets_partitions_in_use(&with_offsets_topic(50), 10), 50);
        assert_eq!(offsets_partitions_in_use(&with_offsets_topic(3), 50), 3);
        assert_eq!(offsets_partitions_in_use(&with_offsets_topic(7), 7), 7);
        // No topic yet: the setting sizes it.
        assert_eq!(offsets_partitions_in_use(&ClusterMetadata::default(), 10), 10);

        let mut config = Config::default();
        config.offsets_topic_num_partitions = offsets_partitions_in_use(&with_offsets_topic(50), 10);
        assert_eq!(group_config(&config).offsets_partitions, 50);
    }
}
