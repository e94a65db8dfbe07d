//! Runs a shard's [`GroupCoordinator`]: feeds it requests and timer ticks, carries out its
//! actions (answers, appends to `__consumer_offsets`, wake-ups), and loads its partitions of
//! `__consumer_offsets` at start-up.
//!
//! The coordinator is a sans-I/O state machine; everything that waits (the disk, the clock)
//! happens here. A group lives on the shard owning its `__consumer_offsets` partition, so its
//! records are appended to a local log and its state is touched by one thread.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::{Rc, Weak};
use std::time::Duration;

use futures::channel::oneshot;
use strand_protocol::types::{ShardId, TopicId};

use crate::config::Config;
use crate::group::records::{batch_records, build_batch};
use crate::group::{
    Action, GroupConfig, GroupCoordinator, GroupRequest, GroupResponse, RequestMeta, RequestToken,
    TopicMetadata,
};
use crate::metadata::{owner_shard, ClusterMetadata};
use crate::shard::Shard;

/// The internal topic of committed offsets and group state.
pub(crate) const OFFSETS_TOPIC: &str = "__consumer_offsets";
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
}

pub(crate) fn group_config(config: &Config) -> GroupConfig {
    GroupConfig {
        offsets_partitions: i32::try_from(config.offsets_topic_num_partitions).unwrap_or(50),
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

/// The shard that coordinates `group_id`.
pub(crate) fn coordinator_shard(group_id: &str, config: &Config, shards: u16) -> ShardId {
    let partitions = i32::try_from(config.offsets_topic_num_partitions).unwrap_or(50);
    owner_shard(
        OFFSETS_TOPIC,
        crate::group::partition_for(group_id, partitions),
        shards,
    )
}

pub(crate) struct GroupHost {
    coordinator: RefCell<GroupCoordinator>,
    waiters: RefCell<HashMap<RequestToken, oneshot::Sender<GroupResponse>>>,
    next_token: Cell<u64>,
    /// Wakes the timer task when the coordinator asks for an earlier tick.
    wake: strand_storage::notify::Notify,
    shard: RefCell<Weak<Shard>>,
}

impl GroupHost {
    pub(crate) fn new(config: &Config, seed: u64) -> Self {
        GroupHost {
            coordinator: RefCell::new(GroupCoordinator::new(group_config(config), seed)),
            waiters: RefCell::new(HashMap::new()),
            next_token: Cell::new(1),
            wake: strand_storage::notify::Notify::new(),
            shard: RefCell::new(Weak::new()),
        }
    }

    fn shard(&self) -> Option<Rc<Shard>> {
        self.shard.borrow().upgrade()
    }

    /// Handles a group request; the answer may come later (a JoinGroup waits for its rebalance).
    pub(crate) fn submit(&self, meta: RequestMeta, req: GroupRequest) -> oneshot::Receiver<GroupResponse> {
        let (tx, rx) = oneshot::channel();
        let Some(shard) = self.shard() else {
            return rx;
        };
        let token = RequestToken(self.next_token.get());
        self.next_token.set(token.0 + 1);
        self.waiters.borrow_mut().insert(token, tx);
        let topics = Topics(shard.metadata());
        let actions = self
            .coordinator
            .borrow_mut()
            .handle(shard.now_ms(), token, &meta, req, &topics);
        self.run(&shard, actions);
        rx
    }

    /// Carries out the coordinator's actions.
    fn run(&self, shard: &Rc<Shard>, actions: Vec<Action>) {
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
                } => self.persist(shard, write_id, partition, &records),
                Action::WakeAt(_) => self.wake.notify_all(),
            }
        }
    }

    /// Appends one batch to a local `__consumer_offsets` partition and reports to the
    /// coordinator once it is durable (or failed).
    fn persist(&self, shard: &Rc<Shard>, write_id: u64, partition: i32, records: &[crate::group::Record]) {
        let now = shard.now_ms();
        let batch = build_batch(records, now);
        let appended = match shard.log_for(OFFSETS_TOPIC, partition) {
            Some(log) => shard
                .store
                .append(log, &batch, crate::shard::LEADER_EPOCH, now)
                .map_err(|e| e.to_string()),
            None => Err(format!("{OFFSETS_TOPIC}-{partition} is not on this shard")),
        };
        let shard = shard.clone();
        glommio::spawn_local(async move {
            let result = match appended {
                Ok(ticket) => shard.store.wait_durable(&ticket).await.map_err(|e| e.to_string()),
                Err(e) => Err(e),
            };
            let failed = result.is_err();
            if let Err(e) = &result {
                tracing::error!(partition, error = %e, "cannot persist group state; reloading the partition");
            }
            let Some(host) = shard.groups.as_ref() else { return };
            let actions = host
                .coordinator
                .borrow_mut()
                .persisted(shard.now_ms(), write_id, result);
            host.run(&shard, actions);
            if failed {
                // The coordinator dropped the partition's state (it may hold changes the log
                // does not): rebuild it from what is durable.
                let actions = host.coordinator.borrow_mut().unload(partition);
                host.run(&shard, actions);
                host.load_partition(&shard, partition).await;
            }
        })
        .detach();
    }

    /// Loads this shard's partitions of `__consumer_offsets` and starts the timer task.
    pub(crate) async fn start(shard: &Rc<Shard>) {
        let Some(host) = shard.groups.as_ref() else { return };
        *host.shard.borrow_mut() = Rc::downgrade(shard);
        let partitions = i32::try_from(shard.config.offsets_topic_num_partitions).unwrap_or(50);
        for p in 0..partitions {
            host.load_partition(shard, p).await;
        }
        glommio::spawn_local(timer_loop(Rc::downgrade(shard))).detach();
    }

    /// Loads the groups of one `__consumer_offsets` partition from its log (if this shard owns it).
    async fn load_partition(&self, shard: &Rc<Shard>, p: i32) {
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
        self.run(shard, actions);
    }
}

/// Calls `tick` when the coordinator asked to be woken (and at least every second).
async fn timer_loop(shard: Weak<Shard>) {
    loop {
        let Some(s) = shard.upgrade() else { return };
        let Some(host) = s.groups.as_ref() else { return };
        let now = s.now_ms();
        let next = host.coordinator.borrow().next_wake().unwrap_or(now + 1000);
        let wait = Duration::from_millis(u64::try_from(next.saturating_sub(now)).unwrap_or(0).min(1000));
        {
            let woken = host.wake.wait();
            let timer = glommio::timer::sleep(wait);
            futures::pin_mut!(woken);
            futures::pin_mut!(timer);
            futures::future::select(woken, timer).await;
        }
        if s.shutting_down.get() {
            return;
        }
        let now = s.now_ms();
        if host.coordinator.borrow().next_wake().is_some_and(|t| t <= now) {
            let actions = host.coordinator.borrow_mut().tick(now);
            host.run(&s, actions);
        }
    }
}
