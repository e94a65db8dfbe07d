//! Runs the queue engines ([`crate::queue::engine::QueuePartition`]) of one shard: one engine per
//! (topic, partition, consumer group) for the partitions the shard owns. Everything that waits
//! happens here: the message log (payload reads, loading the window), the state log (one per
//! engine, appended through the shard's journal), the dead-letter topic, and the clock.
//!
//! - **State log**: `__queue_state/{topic}-{partition}/{group}` under the log directory (the
//!   group percent-encoded), a storage log like any partition's, with the topic id as its
//!   incarnation; each [`Action::Persist`] is one record batch (one state record per record
//!   value). It shares the shard journal with the message log, so a state record that refers
//!   to an append is never durable before the append. A snapshot lets the prefix before it go.
//!   On a cluster node there is no state log: each write is a side record of the partition's
//!   Raft group, committed on a majority before the engine hears it persisted, and a new
//!   leader's engine starts from the side records it holds (`replicated`).
//! - **Publish** (HTTP): admission by the group [`PRIMARY_GROUP`]'s engine (dedup), one batch
//!   appended to the message log, `appended` fed to that engine before the next yield, answer
//!   once the append is durable. Other groups learn new messages by loading from the log, as
//!   they do for messages Kafka producers wrote.
//! - **Lease**: the engine answers (after the lease records are durable), then the payloads
//!   are read back from the log (the engine holds none).
//! - **Recovery**: at start-up, once the partition logs are open, every engine whose state log
//!   this shard owns is rebuilt from that log ([`QueueHost::start`]), then fed the message log
//!   from its window, as the engine's module documentation prescribes.
//! - **Dead letters**: appended to the queue's dead-letter topic by a Produce to its owner
//!   shard (`dead_letter`), then reported to the engine.
//! - **Timers**: one task per engine sleeps until the engine's next deadline.
//! - **Retention**: the message log's retention never passes the lowest offset an engine still
//!   needs ([`QueuePartition::retention_floor`]).
//! - **Metrics**: per-queue gauges and counters (`metrics`).
//!
//! Architecture invariant: an engine is touched only by the shard that owns its partition, like
//! the partition's log; other shards reach it through [`QueueOp`]s.

mod dead_letter;
mod metrics;
mod operations;
mod ops;
mod read;
mod replicated;
pub(crate) mod route;
mod share;
mod state_log;
pub(crate) mod wire;

use self::dead_letter::dead_letter;
use self::read::{feed, read_records};
use self::state_log::STATE_DIR;
pub(crate) use dead_letter::create_dead_letter_topic;
pub(crate) use ops::{
    OutMessage, QueueAnswer, QueueFailure, QueueOp, SharePart, SharePartResult, ShareSettings, StartAt,
};
pub(crate) use state_log::{
    group_dir_name, parse_state_log_dir_name, remove_state_dirs, state_log_config, state_log_dir_name,
};

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::{Rc, Weak};
use std::time::Duration;

use futures::channel::oneshot;
use futures::future::LocalBoxFuture;
use futures::FutureExt;
use strand_protocol::records::decode_records;
use strand_protocol::types::{Offset, PartitionId, TopicId};
use strand_storage::notify::Notify;
use strand_storage::{LogId, LogKey, StorageError};

use crate::config::{LogSettings, QueueSettings};
use crate::metadata::MetadataDelta;
use crate::metadata::TopicMeta;
use crate::queue::engine::{
    Action, Backoff, ExternalMessageId, LoadRequest, MessageId, Ordering, QueueConfig, QueueError,
    QueuePartition, Reply, RequestId, StateRecord, WriteId,
};
use crate::shard::service::{NodeService, Service, ShardHooks};
use crate::shard::{Shard, LEADER_EPOCH};

/// The group that HTTP requests use when they name none, and whose engine admits publishes
/// (dedup tokens live in its state).
pub(crate) const PRIMARY_GROUP: &str = "default";
/// Decompression bound for one batch read back by the engine host.
const MAX_DECOMPRESSED_BYTES: usize = 64 << 20;
/// Bytes read from the message log per step of loading or payload reading.
const READ_CHUNK_BYTES: usize = 1 << 20;
/// How long a lease waits for the log to make its messages durable before giving up on them.
const DURABLE_WAIT: Duration = Duration::from_secs(10);
/// Engines (groups x partitions) one shard runs at most.
const MAX_ENGINES_PER_SHARD: usize = 10_000;
/// Payload bytes one lease answer carries at most (roughly: the message count asked of a
/// partition is cut by its average stored message size; at least one message always goes).
pub(crate) const MAX_LEASE_ANSWER_BYTES: u64 = 16 << 20;
/// Bytes the batch framing adds to a message (batch header + record framing, generously).
const BATCH_OVERHEAD_BYTES: u32 = 128;

/// The engine settings of a topic's queue for `group`.
pub(crate) fn engine_config(settings: &QueueSettings, log: &LogSettings, primary: bool) -> QueueConfig {
    let d = QueueConfig::default();
    let backoff_max_ms = settings.backoff_max_ms;
    let cfg = QueueConfig {
        max_attempts: settings.max_attempts,
        default_visibility_ms: settings.visibility_timeout_ms,
        min_visibility_ms: d.min_visibility_ms.min(settings.visibility_timeout_ms),
        backoff: Backoff {
            // base <= max is not checked per key; an inconsistent pair takes the max.
            base_ms: settings.backoff_base_ms.min(backoff_max_ms),
            multiplier: settings.backoff_multiplier,
            max_ms: backoff_max_ms,
        },
        ordering: if settings.ordering_by_key {
            Ordering::Key
        } else {
            Ordering::None
        },
        dedup_window_ms: if primary { settings.dedup_window_ms } else { 0 },
        // The HTTP API's lease and settle batches (1..=1000) fit one partition.
        max_lease_batch: 1_000,
        max_message_bytes: log.max_message_bytes.saturating_sub(BATCH_OVERHEAD_BYTES).max(1),
        ..d
    };
    match cfg.validate() {
        Ok(()) => cfg,
        Err(e) => {
            tracing::warn!(error = %e, "queue settings rejected by the engine; using defaults");
            QueueConfig::default()
        }
    }
}

/// Where an engine's state records go.
#[derive(Debug, Clone, Copy)]
enum StateStore {
    /// A standalone node: the engine's own state log (`state_log`).
    Log(LogId),
    /// A cluster: side records of the partition's Raft group (`replicated`).
    Replicated,
}

#[derive(Clone, PartialEq, Eq, Hash, Debug)]
struct EngineKey {
    topic: String,
    partition: i32,
    group: String,
}

/// A running load of an engine's window: it clears `Engine::loading` when dropped, however the
/// load ends. Loads run inside request futures that may be dropped half-way (a share fetch's long
/// poll drops its waits on the other shards as soon as one answers, and a wait on the local shard
/// runs inline); a flag left set would stop the engine from ever loading again.
struct LoadGuard(Rc<Cell<bool>>);

impl LoadGuard {
    /// `None`: a load runs already.
    fn begin(loading: &Rc<Cell<bool>>) -> Option<LoadGuard> {
        if loading.replace(true) {
            return None;
        }
        Some(LoadGuard(loading.clone()))
    }
}

impl Drop for LoadGuard {
    fn drop(&mut self) {
        self.0.set(false);
    }
}

/// One engine and what its host keeps beside it.
struct Engine {
    key: EngineKey,
    topic_id: TopicId,
    /// The message log of the partition.
    log: LogId,
    state: StateStore,
    /// State writes in flight, and signalled when one ends.
    writing: Cell<u64>,
    written: Notify,
    /// In a cluster, the leader epoch of the partition when the engine opened on its leader:
    /// the engine closes when this replica stops leading or the epoch changes.
    epoch: Option<i32>,
    /// Held by a cluster node's publishes with dedup tokens (see `publish`).
    publish_lock: glommio::sync::Semaphore,
    q: RefCell<QueuePartition>,
    waiters: RefCell<HashMap<RequestId, oneshot::Sender<Result<Reply, QueueError>>>>,
    next_request: Cell<u64>,
    /// Whether a load of the window runs; set and cleared only through [`LoadGuard`].
    loading: Rc<Cell<bool>>,
    /// Signalled when the engine asks for an earlier wake-up.
    timer: Notify,
    /// The state log write of the snapshot in flight, and its base offset there.
    snapshot: Cell<Option<(WriteId, i64)>>,
    closed: Cell<bool>,
    /// Set once a Kafka share consumer used this engine: it then runs with the share group's
    /// settings (lock timeout makes records available at once, delivery count limit, archive or
    /// the group's dead-letter topic).
    share: RefCell<Option<ShareSettings>>,
    metrics: RefCell<metrics::QueueMetrics>,
}

impl Engine {
    fn request_id(&self) -> RequestId {
        let id = self.next_request.get();
        self.next_request.set(id + 1);
        RequestId(id)
    }

    fn external(&self, id: MessageId) -> ExternalMessageId {
        ExternalMessageId {
            topic: self.topic_id,
            id,
        }
    }
}

pub(crate) struct QueueHost {
    engines: RefCell<HashMap<EngineKey, Rc<Engine>>>,
    /// Engines being opened (concurrent callers wait for the first).
    opening: RefCell<HashMap<EngineKey, Rc<Notify>>>,
    /// Signalled when any engine may have become leasable (long-polls re-check).
    changed: Notify,
    /// On a cluster node, what the leader knows of each led partition's side records.
    sides: RefCell<HashMap<(String, i32), replicated::PartitionSide>>,
    /// Itself, for the tasks it spawns.
    me: Weak<QueueHost>,
    core: Rc<Shard>,
}

impl QueueHost {
    pub(crate) fn new(core: Rc<Shard>) -> Rc<Self> {
        Rc::new_cyclic(|me| QueueHost {
            engines: RefCell::new(HashMap::new()),
            opening: RefCell::new(HashMap::new()),
            changed: Notify::new(),
            sides: RefCell::new(HashMap::new()),
            me: me.clone(),
            core,
        })
    }

    /// Itself (alive as long as a caller holds it).
    fn rc(&self) -> Option<Rc<QueueHost>> {
        self.me.upgrade()
    }

    /// Recovers the engines whose state logs this shard owns (start-up, after the partition logs
    /// are open). On a cluster node, engines open on the leaders of their partitions when asked
    /// for, and close when the leadership goes ([`QueueHost::follow_leaders`]).
    pub(crate) async fn start(&self) {
        let shard = &self.core;
        if !shard.config.cluster.is_standalone() {
            glommio::spawn_local(follow_leaders(self.me.clone())).detach();
            return;
        }
        let host = self;
        let root = shard.config.log_dir.join(STATE_DIR);
        let mut found = Vec::new();
        if let Ok(parts) = std::fs::read_dir(&root) {
            for p in parts.flatten() {
                let Some(part_name) = p.file_name().to_str().map(str::to_owned) else {
                    continue;
                };
                let Ok(groups) = std::fs::read_dir(p.path()) else {
                    continue;
                };
                for g in groups.flatten() {
                    let Some(group_name) = g.file_name().to_str().map(str::to_owned) else {
                        continue;
                    };
                    let dir = format!("{STATE_DIR}/{part_name}/{group_name}");
                    let Some((topic, partition, group)) = parse_state_log_dir_name(&dir) else {
                        continue;
                    };
                    if shard.owner(topic, partition) != shard.id {
                        continue;
                    }
                    // State of an older topic with the same name goes with it.
                    let current = shard.metadata().topic(topic).is_some_and(|t| {
                        std::fs::read_to_string(g.path().join("partition.metadata"))
                            .is_ok_and(|m| m.contains(&strand_storage::store::base64_url(t.id.0.as_bytes())))
                    });
                    if !current {
                        tracing::warn!(dir = %g.path().display(), "removing the queue state of a deleted topic");
                        let _ = std::fs::remove_dir_all(g.path());
                        continue;
                    }
                    found.push((topic.to_owned(), partition, group));
                }
            }
        }
        let mut recovered = 0usize;
        for (topic, partition, group) in found {
            match host.engine(&topic, partition, &group).await {
                Ok(_) => recovered += 1,
                Err(e) => {
                    tracing::error!(topic, partition, group, error = %e, "cannot recover a queue engine")
                }
            }
        }
        if recovered > 0 {
            tracing::info!(engines = recovered, "recovered queue engines");
        }
    }

    /// Starts a queue operation on this shard.
    fn run_op(self: Rc<Self>, op: QueueOp) -> LocalBoxFuture<'static, QueueAnswer> {
        async move {
            let host = &self;
            match op {
                QueueOp::AppendDeadLetter {
                    topic,
                    partition,
                    batch,
                } => QueueAnswer::Appended(
                    dead_letter::append_here(&host.core, &topic, partition, batch)
                        .await
                        .map_err(QueueFailure::Unavailable),
                ),
                QueueOp::Publish {
                    topic,
                    partition,
                    messages,
                } => QueueAnswer::Published(host.publish(&topic, partition, messages).await),
                QueueOp::Lease {
                    group,
                    consumer,
                    parts,
                    max_messages,
                    visibility_ms,
                    max_bytes,
                } => QueueAnswer::Leased(
                    host.lease(&group, &consumer, &parts, max_messages, visibility_ms, max_bytes)
                        .await,
                ),
                QueueOp::WaitLeasable {
                    group,
                    parts,
                    timeout_ms,
                } => {
                    host.wait_leasable(&group, &parts, timeout_ms).await;
                    QueueAnswer::Ready
                }
                QueueOp::Settle {
                    topic,
                    partition,
                    group,
                    items,
                } => QueueAnswer::Settled(host.settle(&topic, partition, &group, items).await),
                QueueOp::Stats { topic } => QueueAnswer::Stats(host.stats(&topic)),
                QueueOp::Share {
                    group,
                    member,
                    settings,
                    parts,
                    max_records,
                } => QueueAnswer::Share(host.share(&group, &member, &settings, parts, max_records).await),
                QueueOp::ShareRelease { group, member, parts } => {
                    host.share_release(&group, &member, &parts);
                    QueueAnswer::Ready
                }
                QueueOp::ShareOffsets { group, topics } => {
                    QueueAnswer::ShareOffsets(host.share_offsets(&group, topics.as_deref()))
                }
                QueueOp::ShareDeleteState { group, topics } => {
                    host.share_delete_state(&group, &topics).await;
                    QueueAnswer::Ready
                }
                QueueOp::ShareAlter {
                    group,
                    topic,
                    partition,
                    start_offset,
                } => {
                    QueueAnswer::ShareAltered(host.share_alter(&group, &topic, partition, start_offset).await)
                }
            }
        }
        .boxed_local()
    }

    // ----- engines --------------------------------------------------------------------------

    /// The engine of (topic, partition, group), opened (recovered or created) if needed.
    async fn engine(&self, topic: &str, partition: i32, group: &str) -> Result<Rc<Engine>, QueueFailure> {
        self.engine_from(topic, partition, group, StartAt::Earliest).await
    }

    /// The engine of (topic, partition, group); a new one starts at `start` of the log.
    async fn engine_from(
        &self,
        topic: &str,
        partition: i32,
        group: &str,
        start: StartAt,
    ) -> Result<Rc<Engine>, QueueFailure> {
        let key = EngineKey {
            topic: topic.to_owned(),
            partition,
            group: group.to_owned(),
        };
        let epoch = self.serves(topic, partition)?;
        loop {
            let open = self.engines.borrow().get(&key).cloned();
            if let Some(e) = open {
                if e.epoch == epoch {
                    return Ok(e);
                }
                // Opened under an earlier leadership of this replica: its state may predate
                // what another leader did meanwhile.
                self.close(&e);
                continue;
            }
            let pending = self.opening.borrow().get(&key).cloned();
            match pending {
                Some(n) => {
                    let w = n.wait();
                    if !self.opening.borrow().contains_key(&key) {
                        continue;
                    }
                    w.await;
                }
                None => break,
            }
        }
        if self.engines.borrow().len() >= MAX_ENGINES_PER_SHARD {
            return Err(QueueFailure::Unavailable(format!(
                "this shard already runs {MAX_ENGINES_PER_SHARD} queue engines (groups x partitions)"
            )));
        }
        if epoch.is_some() && !self.core.leads_whole_log(topic, partition) {
            return Err(QueueFailure::Unavailable(format!(
                "{topic}-{partition} has a new leader that has not committed its log yet"
            )));
        }
        let done = Rc::new(Notify::new());
        self.opening.borrow_mut().insert(key.clone(), done.clone());
        let opened = self.open_engine(&key, start, epoch).await;
        self.opening.borrow_mut().remove(&key);
        done.notify_all();
        let engine = Rc::new(opened?);
        self.engines.borrow_mut().insert(key, engine.clone());
        glommio::spawn_local(timer_loop(self.me.clone(), engine.clone())).detach();
        let unsnapshotted = matches!(engine.state, StateStore::Replicated)
            && self
                .sides
                .borrow()
                .get(&(engine.key.topic.clone(), engine.key.partition))
                .is_none_or(|p| !p.has_snapshot(&engine.key.group));
        if unsnapshotted {
            // Until the group has a snapshot, no side record of the partition can go.
            engine.q.borrow_mut().snapshot();
        }
        // Recovery may have queued actions (dead letters to re-send, the corrected state).
        self.drain(&engine);
        self.kick_load(&engine);
        Ok(engine)
    }

    /// Whether this shard serves the engines of `topic`-`partition`: on a standalone node
    /// always (`None`); on a cluster node when its replica leads and heard lately from a
    /// majority of the partition's replicas (`Some(leader epoch)`), else `NotLeader` with the
    /// leader it knows of (or `Unavailable`, cut off).
    fn serves(&self, topic: &str, partition: i32) -> Result<Option<i32>, QueueFailure> {
        if self.core.config.cluster.is_standalone() {
            return Ok(None);
        }
        match self.core.leadership(topic, partition) {
            // A leader cut off from the partition's other replicas stays leader in its own eyes
            // until a higher term reaches it, while the others may have elected another whose
            // engines lease the same messages: it stops serving until it hears them again.
            Some(l) if l.is_local && !self.core.leads_with_a_majority(topic, partition) => {
                Err(QueueFailure::Unavailable(format!(
                    "{topic}-{partition}: this leader has not heard from a majority of its replicas lately"
                )))
            }
            Some(l) if l.is_local => Ok(Some(l.epoch)),
            Some(l) => Err(QueueFailure::NotLeader(l.leader)),
            None => Err(QueueFailure::NotLeader(None)),
        }
    }

    /// Closes the engines of partitions whose leadership this shard lost (or regained in a
    /// newer epoch: they reopen from their state log when next asked for).
    fn follow_leadership(&self) {
        let engines: Vec<Rc<Engine>> = self.engines.borrow().values().cloned().collect();
        for e in engines {
            if self.serves(&e.key.topic, e.key.partition).ok() != Some(e.epoch) {
                tracing::info!(topic = %e.key.topic, partition = e.key.partition, group = %e.key.group, "queue engine closed: its partition is led elsewhere now");
                self.close(&e);
            }
        }
    }

    async fn open_engine(
        &self,
        key: &EngineKey,
        start: StartAt,
        epoch: Option<i32>,
    ) -> Result<Engine, QueueFailure> {
        let shard = &self.core;
        // A leader that was cut off or stopped may still think it leads: a majority confirms
        // it (a Raft read-index round) before its engine starts from what it holds.
        if epoch.is_some() && !shard.confirm_leadership(&key.topic, key.partition).await {
            return Err(QueueFailure::Unavailable(format!(
                "{}-{}: a majority of its replicas did not confirm this leader",
                key.topic, key.partition
            )));
        }
        let md = shard.metadata();
        let topic = md
            .topic(&key.topic)
            .filter(|t| key.partition >= 0 && key.partition < t.partitions)
            .ok_or_else(|| QueueFailure::UnknownQueue(key.topic.clone()))?
            .clone();
        let log = shard.log_for(&key.topic, key.partition).ok_or_else(|| {
            QueueFailure::Unavailable(format!("{}-{} is not open", key.topic, key.partition))
        })?;
        let config = self.config_for(&topic, &key.group);
        let now = shard.now_ms();
        // The same group names on every node: those a state log directory can name.
        group_dir_name(&key.group)?;
        let (state, records) = match epoch {
            Some(_) => (StateStore::Replicated, self.read_side(key).await?),
            None => {
                let (state_log, records) = self.read_state_log(key, &topic).await?;
                (StateStore::Log(state_log), records)
            }
        };
        let offsets = shard.store.offsets(log).map_err(storage_failure)?;
        let since_offset = match start {
            StartAt::Since { duration_ms } => {
                let ts = now.saturating_sub(duration_ms);
                match shard.store.timestamp_plan(log, ts) {
                    Ok(Some(plan)) => plan.execute().await.ok().flatten().map(|(o, _)| o),
                    _ => None,
                }
            }
            _ => None,
        };
        let pid = PartitionId(key.partition);
        let recovering = !records.is_empty();
        let built = if recovering {
            QueuePartition::recover(config, pid, records, now)
        } else {
            // A new group starts at the log start (`earliest`) or its end (`latest`).
            let at = match start {
                StartAt::Earliest => offsets.log_start_offset,
                StartAt::Latest => offsets.high_watermark,
                // No message that recent: start at the end.
                StartAt::Since { .. } => since_offset.unwrap_or(offsets.high_watermark),
            };
            QueuePartition::new(config, pid, Offset(at), now)
        };
        let mut q = built.map_err(|e| QueueFailure::Invalid(e.to_string()))?;
        if recovering {
            q.recovered_log_end(Offset(offsets.high_watermark));
        }
        if let Some(epoch) = epoch {
            // Never a generation an earlier leader of the partition handed out.
            q.raise_generations(u64::try_from(epoch).unwrap_or(0) << 32);
        }
        let engine = Engine {
            key: key.clone(),
            topic_id: topic.id,
            log,
            state,
            writing: Cell::new(0),
            written: Notify::new(),
            epoch,
            publish_lock: glommio::sync::Semaphore::new(1),
            q: RefCell::new(q),
            waiters: RefCell::new(HashMap::new()),
            next_request: Cell::new(1),
            loading: Rc::new(Cell::new(false)),
            timer: Notify::new(),
            snapshot: Cell::new(None),
            closed: Cell::new(false),
            share: RefCell::new(None),
            metrics: RefCell::new(metrics::QueueMetrics::new(&key.topic, &key.group, key.partition)),
        };
        if recovering && key.group == PRIMARY_GROUP {
            self.restore_dedup_tail(&engine).await;
        }
        tracing::debug!(topic = %key.topic, partition = key.partition, group = %key.group, recovering, "queue engine open");
        Ok(engine)
    }

    /// A cluster leader's engine state: the group's side records (see `replicated`), and what
    /// they say of every group's snapshots, kept for the partition's keep-from index.
    async fn read_side(&self, key: &EngineKey) -> Result<Vec<StateRecord>, QueueFailure> {
        let read = self
            .core
            .side_records(&key.topic, key.partition)
            .ok_or(QueueFailure::NotLeader(None))?;
        let side = read.await.map_err(QueueFailure::Storage)?;
        let (records, part, undecodable) = replicated::read_group(&side, &key.group)?;
        if undecodable > 0 {
            tracing::error!(topic = %key.topic, partition = key.partition, undecodable, "undecodable queue side records skipped");
        }
        self.sides
            .borrow_mut()
            .insert((key.topic.clone(), key.partition), part);
        Ok(records)
    }

    /// A standalone node's engine state: its state log, opened (created if new).
    async fn read_state_log(
        &self,
        key: &EngineKey,
        topic: &TopicMeta,
    ) -> Result<(LogId, Vec<StateRecord>), QueueFailure> {
        let shard = &self.core;
        let dir_name = state_log_dir_name(&key.topic, key.partition, &key.group)?;
        let now = shard.now_ms();
        let (state_log, report) = shard
            .store
            .open_log_as_leader(
                LogKey {
                    dir_name,
                    incarnation: *topic.id.0.as_bytes(),
                },
                state_log_config(),
                LEADER_EPOCH,
                now,
            )
            .await
            .map_err(storage_failure)?;
        if !report.problems.is_empty() {
            tracing::warn!(topic = %key.topic, partition = key.partition, group = %key.group, problems = ?report.problems, "recovered a queue state log");
        }
        // Every durable state record, in write order.
        let mut records = Vec::new();
        let mut undecodable = 0usize;
        let read = shard
            .for_each_batch(state_log, |batch| {
                match decode_records(batch, MAX_DECOMPRESSED_BYTES) {
                    Ok(recs) => {
                        for r in recs {
                            match r.value.as_deref().map(StateRecord::decode) {
                                Some(Ok(rec)) => records.push(rec),
                                _ => undecodable += 1,
                            }
                        }
                    }
                    Err(_) => undecodable += 1,
                }
            })
            .await;
        if let Err(e) = read {
            let _ = shard.store.remove_log(state_log).await.map(|_| ()).ok();
            return Err(storage_failure(e));
        }
        if undecodable > 0 {
            tracing::error!(topic = %key.topic, partition = key.partition, group = %key.group, undecodable, "undecodable queue state records skipped");
        }
        Ok((state_log, records))
    }

    fn config_for(&self, topic: &TopicMeta, group: &str) -> QueueConfig {
        let shard = &self.core;
        engine_config(
            &topic.config.queue_settings(),
            &topic.config.log_settings(&shard.config),
            group == PRIMARY_GROUP,
        )
    }

    /// Recovery step 3: feeds the messages of the last dedup window to the engine, restoring
    /// the tokens whose `Dedup` records were not yet durable at the crash.
    async fn restore_dedup_tail(&self, engine: &Engine) {
        let shard = &self.core;
        let window = engine.q.borrow().config().dedup_window_ms;
        if window == 0 {
            return;
        }
        let now = shard.now_ms();
        let since = now.saturating_sub(i64::try_from(window).unwrap_or(i64::MAX));
        let from = match shard.store.timestamp_plan(engine.log, since) {
            Ok(Some(plan)) => match plan.execute().await {
                Ok(Some((offset, _))) => offset,
                _ => return,
            },
            _ => return,
        };
        let mut next = from;
        loop {
            let Ok(records) = read_records(shard, engine.log, next, READ_CHUNK_BYTES).await else {
                return;
            };
            let Some(last) = records.last().map(|r| r.offset) else {
                return;
            };
            {
                let mut q = engine.q.borrow_mut();
                for r in &records {
                    if r.offset >= next {
                        feed(&mut q, engine.topic_id, r, now);
                    }
                }
            }
            next = last + 1;
        }
    }

    /// Carries out the engine's actions.
    fn drain(&self, engine: &Rc<Engine>) {
        let actions = engine.q.borrow_mut().poll_actions();
        let mut became_leasable = false;
        for action in actions {
            match action {
                Action::Persist {
                    write_id,
                    records,
                    snapshot,
                } => self.persist(engine, write_id, &records, snapshot),
                Action::Reply { request, reply } => {
                    if let Some(tx) = engine.waiters.borrow_mut().remove(&request) {
                        let _ = tx.send(reply);
                    }
                }
                Action::DeadLetter(req) => {
                    if let Some(host) = self.rc() {
                        glommio::spawn_local(dead_letter(host, engine.clone(), req)).detach();
                    }
                }
                Action::WakeAt(_) => engine.timer.notify_all(),
            }
            became_leasable = true;
        }
        if became_leasable && engine.q.borrow().has_leasable() {
            self.changed.notify_all();
        }
    }

    /// Writes one state write: appended to the engine's state log, or (cluster) proposed as a
    /// side record; reports it durable or committed (or failed).
    fn persist(&self, engine: &Rc<Engine>, write_id: WriteId, records: &[StateRecord], snapshot: bool) {
        let state_log = match engine.state {
            StateStore::Log(id) => id,
            StateStore::Replicated => return self.persist_replicated(engine, write_id, records, snapshot),
        };
        let shard = &self.core;
        let now = shard.now_ms();
        let values: Vec<Vec<u8>> = records.iter().map(StateRecord::to_bytes).collect();
        let recs: Vec<strand_protocol::batch::build::TestRecord<'_>> = values
            .iter()
            .map(|v| strand_protocol::batch::build::TestRecord {
                key: None,
                value: Some(v),
                headers: vec![],
                timestamp_delta: 0,
            })
            .collect();
        let batch = strand_protocol::batch::build::batch(&recs, now);
        let appended = shard.store.append(state_log, &batch, LEADER_EPOCH, now);
        if let (Ok(t), true) = (&appended, snapshot) {
            engine.snapshot.set(Some((write_id, t.info.base_offset)));
        }
        let Some(host) = self.rc() else { return };
        let engine = engine.clone();
        glommio::spawn_local(async move {
            let result = match appended {
                Ok(ticket) => host.core.store.wait_durable(&ticket).await,
                Err(e) => Err(e),
            };
            match result {
                Ok(()) => {
                    engine.q.borrow_mut().persisted(write_id);
                    if let Some((w, base)) = engine.snapshot.get() {
                        if w <= write_id {
                            engine.snapshot.set(None);
                            // Everything before the snapshot is superseded by it.
                            if let Err(e) = host.core.store.delete_records(state_log, base).await {
                                tracing::warn!(error = %e, "cannot trim a queue state log");
                            }
                        }
                    }
                    if engine.snapshot.get().is_none() && engine.q.borrow().wants_snapshot() {
                        engine.q.borrow_mut().snapshot();
                    }
                    host.drain(&engine);
                }
                Err(e) => {
                    tracing::error!(topic = %engine.key.topic, partition = engine.key.partition, group = %engine.key.group, error = %e, "cannot persist queue state; the engine is rebuilt from its log");
                    engine.q.borrow_mut().persist_failed(write_id);
                    host.drain(&engine);
                    host.close(&engine);
                }
            }
        })
        .detach();
    }

    /// [`QueueHost::persist`] on a cluster node: one side record through the partition's group.
    fn persist_replicated(
        &self,
        engine: &Rc<Engine>,
        write_id: WriteId,
        records: &[StateRecord],
        snapshot: bool,
    ) {
        let key = &engine.key;
        let keep_from = self
            .sides
            .borrow()
            .get(&(key.topic.clone(), key.partition))
            .map_or(0, replicated::PartitionSide::keep_from);
        // The parts go to Raft in order when first polled (together, so that no later write's
        // records come between them); the write is persisted once all are committed.
        let proposals: Vec<_> = replicated::encode(&key.group, snapshot, false, records)
            .into_iter()
            .map(|part| self.core.propose_side(&key.topic, key.partition, keep_from, part))
            .collect();
        let proposal = async move {
            let indexes = futures::future::try_join_all(proposals).await?;
            indexes
                .first()
                .copied()
                .ok_or_else(|| crate::shard::OwnAppendError::Failed("a write of no parts".into()))
        };
        if snapshot {
            engine.snapshot.set(Some((write_id, 0)));
        }
        let Some(host) = self.rc() else { return };
        let engine = engine.clone();
        engine.writing.set(engine.writing.get() + 1);
        glommio::spawn_local(async move {
            let result = proposal.await;
            engine.writing.set(engine.writing.get().saturating_sub(1));
            engine.written.notify_all();
            match result {
                Ok(index) => {
                    if let Some(part) = host
                        .sides
                        .borrow_mut()
                        .get_mut(&(engine.key.topic.clone(), engine.key.partition))
                    {
                        part.committed(&engine.key.group, index, snapshot, false);
                    }
                    engine.q.borrow_mut().persisted(write_id);
                    if engine.snapshot.get().is_some_and(|(w, _)| w <= write_id) {
                        engine.snapshot.set(None);
                    }
                    if engine.snapshot.get().is_none() && engine.q.borrow().wants_snapshot() {
                        engine.q.borrow_mut().snapshot();
                    }
                    host.drain(&engine);
                }
                Err(e) => {
                    tracing::warn!(topic = %engine.key.topic, partition = engine.key.partition, group = %engine.key.group, error = ?e, "queue state not committed; the engine closes and reopens on the partition's leader");
                    engine.q.borrow_mut().persist_failed(write_id);
                    host.drain(&engine);
                    host.close(&engine);
                }
            }
        })
        .detach();
    }

    /// Drops an engine (failed, or its topic was deleted); waiting requests get `Unavailable`.
    fn close(&self, engine: &Rc<Engine>) {
        engine.closed.set(true);
        engine.publish_lock.close();
        engine.timer.notify_all();
        let removed = {
            let mut engines = self.engines.borrow_mut();
            match engines.get(&engine.key) {
                Some(e) if Rc::ptr_eq(e, engine) => engines.remove(&engine.key),
                _ => None,
            }
        };
        drop(removed);
        engine.metrics.borrow().zero();
        for (_, tx) in engine.waiters.borrow_mut().drain() {
            let _ = tx.send(Err(QueueError::Unavailable));
        }
        self.changed.notify_all();
    }

    /// Starts loading the window from the log if the engine wants it and no load runs.
    fn kick_load(&self, engine: &Rc<Engine>) {
        if engine.q.borrow().wants_load().is_none() {
            return;
        }
        let Some(guard) = LoadGuard::begin(&engine.loading) else {
            return;
        };
        let Some(host) = self.rc() else { return };
        let engine = engine.clone();
        glommio::spawn_local(async move {
            host.load(&engine).await;
            drop(guard);
        })
        .detach();
    }

    /// Feeds the log to the engine while it wants more and the log has durable messages.
    async fn load(&self, engine: &Rc<Engine>) {
        let shard = &self.core;
        loop {
            if engine.closed.get() {
                return;
            }
            let Some(LoadRequest { from, max_records }) = engine.q.borrow().wants_load() else {
                return;
            };
            let offsets = match shard.store.offsets(engine.log) {
                Ok(o) => o,
                Err(_) => return,
            };
            if from.0 < offsets.log_start_offset {
                // Deleted (DeleteRecords) before the engine saw it: nothing to deliver.
                engine
                    .q
                    .borrow_mut()
                    .log_gap(from, Offset(offsets.log_start_offset));
                self.drain(engine);
                continue;
            }
            if from.0 >= offsets.high_watermark {
                return; // not durable yet; the publish path kicks again
            }
            let budget = usize::try_from(max_records)
                .unwrap_or(usize::MAX)
                .saturating_mul(1024)
                .clamp(64 << 10, READ_CHUNK_BYTES);
            let records = match read_records(shard, engine.log, from.0, budget).await {
                Ok(r) => r,
                Err(e) => {
                    tracing::error!(topic = %engine.key.topic, partition = engine.key.partition, error = %e, "cannot load queue messages");
                    return;
                }
            };
            let now = shard.now_ms();
            let mut fed = 0u64;
            {
                let mut q = engine.q.borrow_mut();
                let mut expect = from.0;
                for r in &records {
                    if r.offset < expect {
                        continue;
                    }
                    if fed >= max_records {
                        break;
                    }
                    if r.offset > expect {
                        q.log_gap(Offset(expect), Offset(r.offset));
                    }
                    feed(&mut q, engine.topic_id, r, now);
                    expect = r.offset + 1;
                    fed += 1;
                }
                if fed == 0 {
                    // No record at or after `from` in what was read (control batches only).
                    let end = records
                        .last()
                        .map_or(from.0 + 1, |r| r.offset + 1)
                        .max(from.0 + 1);
                    q.log_gap(from, Offset(end.min(offsets.high_watermark)));
                }
            }
            self.drain(engine);
            // Feeding the window need not produce actions, so `drain` may not have woken the
            // long polls that found nothing while this load was running.
            if fed > 0 && engine.q.borrow().has_leasable() {
                self.changed.notify_all();
            }
        }
    }

    /// Tells the engines of a partition that the log grew to `log_end`, and loads.
    fn log_grew(&self, topic: &str, partition: i32, log_end: i64) {
        let engines: Vec<Rc<Engine>> = self
            .engines
            .borrow()
            .values()
            .filter(|e| e.key.topic == topic && e.key.partition == partition)
            .cloned()
            .collect();
        for e in engines {
            e.q.borrow_mut().set_log_end(Offset(log_end));
            self.kick_load(&e);
        }
        self.changed.notify_all();
    }

    /// Brings an engine up to the log's durable end before a lease.
    async fn refresh(&self, engine: &Rc<Engine>) {
        let shard = &self.core;
        if let Ok(o) = shard.store.offsets(engine.log) {
            engine.q.borrow_mut().set_log_end(Offset(o.high_watermark));
        }
        if engine.q.borrow().wants_load().is_some() {
            if let Some(_guard) = LoadGuard::begin(&engine.loading) {
                self.load(engine).await;
            }
        }
    }

    // ----- operations ----------------------------------------------------------------------

    // ----- Kafka share groups ------------------------------------------------------------------

    // ----- shard events ----------------------------------------------------------------------

    /// A timer fired or time passed: runs what is due.
    fn tick(&self, engine: &Rc<Engine>) {
        let shard = &self.core;
        engine.q.borrow_mut().tick(shard.now_ms());
        self.drain(engine);
        self.changed.notify_all();
    }

    /// A topic was deleted: its engines and state logs go.
    async fn forget_topic(&self, topic: &str) {
        let shard = &self.core;
        let engines: Vec<Rc<Engine>> = self
            .engines
            .borrow()
            .values()
            .filter(|e| e.key.topic == topic)
            .cloned()
            .collect();
        for e in engines {
            self.close(&e);
            if let StateStore::Log(state_log) = e.state {
                if let Err(err) = shard.store.remove_log(state_log).await {
                    tracing::warn!(topic, error = %err, "cannot remove a queue state log");
                }
            }
        }
        self.sides.borrow_mut().retain(|(t, _), _| t != topic);
        remove_state_dirs(&shard.config.log_dir, |t, p| {
            t == topic && shard.owner(t, p) == shard.id
        });
    }

    /// Topic configs changed: engines take the new queue settings.
    fn reconfigure_topic(&self, topic: &TopicMeta) {
        let engines: Vec<Rc<Engine>> = self
            .engines
            .borrow()
            .values()
            .filter(|e| e.key.topic == topic.name)
            .cloned()
            .collect();
        for e in engines {
            let config = self.config_for(topic, &e.key.group);
            if let Err(err) = e.q.borrow_mut().reconfigure(config) {
                tracing::warn!(topic = %topic.name, error = %err, "queue settings not applied");
            }
        }
    }

    /// Holds retention of each partition with engines at the lowest offset they still need.
    fn update_retention_floors(&self) {
        let shard = &self.core;
        let mut floors: HashMap<LogId, i64> = HashMap::new();
        for e in self.engines.borrow().values() {
            let f = e.q.borrow().retention_floor().0;
            floors.entry(e.log).and_modify(|x| *x = (*x).min(f)).or_insert(f);
        }
        for (log, floor) in floors {
            let _ = shard.store.set_retention_floor(log, Some(floor));
        }
    }

    /// Publishes per-queue gauges and counters.
    fn publish_metrics(&self) {
        for e in self.engines.borrow().values() {
            let (m, samples) = {
                let mut q = e.q.borrow_mut();
                (q.metrics(), q.take_latency_samples())
            };
            e.metrics.borrow_mut().update(&m, &samples);
        }
    }
}

/// Operations other nodes' HTTP doors forward to the partitions this shard leads
/// ([`wire`]).
impl NodeService for QueueHost {
    fn serve(&self, body: bytes::Bytes) -> LocalBoxFuture<'static, Option<bytes::Bytes>> {
        let Some(host) = self.rc() else {
            return async { None }.boxed_local();
        };
        match wire::decode_op(&body) {
            Ok(op) => async move {
                let answer = host.run_op(op).await;
                wire::encode_answer(&answer).map(bytes::Bytes::from)
            }
            .boxed_local(),
            Err(e) => {
                tracing::warn!(error = %e, "refusing a queue operation from another node");
                host.core.metrics.bad_request("queue_forward");
                async { None }.boxed_local()
            }
        }
    }
}

impl Service for QueueHost {
    type Request = QueueOp;
    type Response = QueueAnswer;

    fn start(self: Rc<Self>, op: QueueOp) -> LocalBoxFuture<'static, QueueAnswer> {
        self.run_op(op)
    }
}

impl ShardHooks for QueueHost {
    fn metadata_preparing<'a>(&'a self, delta: &'a MetadataDelta) -> LocalBoxFuture<'a, ()> {
        match delta {
            MetadataDelta::DeleteTopic { name, .. } => self.forget_topic(name).boxed_local(),
            MetadataDelta::SetTopicConfig { name, config } => {
                if let Some(t) = self.core.metadata().topic(name) {
                    let mut t = t.clone();
                    t.config = config.clone();
                    self.reconfigure_topic(&t);
                }
                async {}.boxed_local()
            }
            _ => async {}.boxed_local(),
        }
    }

    fn before_retention(&self) {
        self.update_retention_floors();
    }

    fn publish_gauges(&self) {
        self.publish_metrics();
    }
}

/// Sleeps until the engine's next deadline and ticks it. Ends when the engine is closed.
/// How often a cluster node's queue host checks that it still leads its engines' partitions.
const LEADERSHIP_CHECK: Duration = Duration::from_millis(100);

/// A cluster node's queue host closes the engines of partitions it no longer leads.
async fn follow_leaders(host: Weak<QueueHost>) {
    loop {
        glommio::timer::sleep(LEADERSHIP_CHECK).await;
        let Some(h) = host.upgrade() else { return };
        h.follow_leadership();
    }
}

async fn timer_loop(host: Weak<QueueHost>, engine: Rc<Engine>) {
    loop {
        let woken = engine.timer.wait();
        let wait_ms = {
            let Some(h) = host.upgrade() else { return };
            if engine.closed.get() || h.core.shutting_down.get() {
                return;
            }
            let now = h.core.now_ms();
            let next = engine.q.borrow().next_deadline();
            let wait_ms = next.map_or(60_000, |t| t.saturating_sub(now).clamp(0, 60_000));
            if wait_ms == 0 {
                h.tick(&engine);
            }
            wait_ms
        };
        if wait_ms == 0 {
            // A deadline that does not move must not spin the shard.
            glommio::timer::sleep(Duration::from_millis(1)).await;
            continue;
        }
        let timer = glommio::timer::sleep(Duration::from_millis(u64::try_from(wait_ms).unwrap_or(0)));
        futures::pin_mut!(timer);
        futures::pin_mut!(woken);
        futures::future::select(woken, timer).await;
    }
}

fn storage_failure(e: StorageError) -> QueueFailure {
    QueueFailure::Storage(e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A load dropped half-way (its request future was dropped) must not leave the engine
    /// believing a load still runs: it would never load again, and its records would never be
    /// delivered (a share consumer stalled this way until the broker restarted).
    #[test]
    fn a_dropped_load_frees_the_loading_flag() {
        use futures::FutureExt;
        let loading = Rc::new(Cell::new(false));
        let first = LoadGuard::begin(&loading).expect("no load runs");
        assert!(LoadGuard::begin(&loading).is_none(), "one load at a time");
        drop(first);
        let (tx, rx) = futures::channel::oneshot::channel::<()>();
        let mut load = Box::pin({
            let loading = loading.clone();
            async move {
                let Some(_guard) = LoadGuard::begin(&loading) else {
                    return false;
                };
                // Stands for the read of the message log the load waits on.
                let _ = rx.await;
                true
            }
        });
        assert!(
            load.as_mut().now_or_never().is_none(),
            "the load waits for its read"
        );
        assert!(loading.get(), "a load runs");
        drop(load);
        drop(tx);
        assert!(!loading.get(), "the dropped load left the flag set");
        assert!(LoadGuard::begin(&loading).is_some(), "a new load can start");
    }

    #[test]
    fn engine_config_follows_the_topic_settings() {
        let settings = QueueSettings {
            max_attempts: 3,
            visibility_timeout_ms: 5_000,
            backoff_base_ms: 200,
            backoff_multiplier: 3.0,
            backoff_max_ms: 10_000,
            dead_letter_topic: None,
            ordering_by_key: true,
            dedup_window_ms: 1_000,
        };
        let log = crate::config::TopicConfig::default().log_settings(&crate::config::Config::default());
        let primary = engine_config(&settings, &log, true);
        assert_eq!(primary.max_attempts, 3);
        assert_eq!(primary.default_visibility_ms, 5_000);
        assert_eq!(primary.backoff.delay_ms(2), 600);
        assert_eq!(primary.ordering, Ordering::Key);
        assert_eq!(primary.dedup_window_ms, 1_000);
        assert_eq!(
            engine_config(&settings, &log, false).dedup_window_ms,
            0,
            "only the primary dedups"
        );
        // An inconsistent backoff pair does not break the engine.
        let odd = QueueSettings {
            backoff_base_ms: 50_000,
            ..settings
        };
        assert_eq!(engine_config(&odd, &log, true).backoff.base_ms, 10_000);
    }
}
