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
//! - **Publish** (HTTP): admission by the group [`PRIMARY_GROUP`]'s engine (dedup), one batch
//!   appended to the message log, `appended` fed to that engine before the next yield, answer
//!   once the append is durable. Other groups learn new messages by loading from the log, as
//!   they do for messages Kafka producers wrote.
//! - **Lease**: the engine answers (after the lease records are durable), then the payloads
//!   are read back from the log (the engine holds none).
//! - **Timers**: one task per engine sleeps until the engine's next deadline.
//! - **Retention**: the message log's retention never passes the lowest offset an engine still
//!   needs ([`QueuePartition::retention_floor`]).
//!
//! Architecture invariant: an engine is touched only by the shard that owns its partition, like
//! the partition's log; other shards reach it through [`QueueOp`]s.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::rc::{Rc, Weak};
use std::time::Duration;

use bytes::Bytes;
use futures::channel::oneshot;
use futures::future::LocalBoxFuture;
use futures::FutureExt;
use strand_protocol::records::{decode_records, Record};
use strand_protocol::types::{Offset, PartitionId, TopicId};
use strand_storage::notify::Notify;
use strand_storage::{LogConfig, LogId, LogKey, StorageError};

use crate::config::{LogSettings, QueueSettings};
use crate::metadata::MetadataDelta;
use crate::metadata::TopicMeta;
use crate::queue::engine::dead_letter::{HEADER_DEDUP_TOKEN, HEADER_DELIVER_AT, HEADER_MESSAGE_ID};
use crate::queue::engine::{
    Action, Admission, AppendedMessage, Backoff, ConsumerId, DeadLetterRequest, ExternalMessageId,
    LoadRequest, MessageId, Ordering, PartitionMetrics, PublishRequest, QueueConfig, QueueError,
    QueuePartition, Reply, RequestId, SettleItem, Settled, StateRecord, WriteId,
};
use crate::shard::ops::{PartRef, ProducePart, ShardRequest, ShardResponse};
use crate::shard::service::{Service, ShardHooks};
use crate::shard::{Shard, LEADER_EPOCH};

/// The group that HTTP requests use when they name none, and whose engine admits publishes
/// (dedup tokens live in its state).
pub(crate) const PRIMARY_GROUP: &str = "default";
/// Directory (under the log directory) of the engines' state logs.
pub(crate) const STATE_DIR: &str = "__queue_state";
/// Longest encoded group name in a directory name.
const MAX_GROUP_DIR_BYTES: usize = 200;
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
const MAX_LEASE_ANSWER_BYTES: u64 = 16 << 20;
/// Bytes the batch framing adds to a message (batch header + record framing, generously).
const BATCH_OVERHEAD_BYTES: u32 = 128;

/// Where a new engine starts in its partition's log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StartAt {
    Earliest,
    Latest,
    /// The first message not older than this (KIP-932 `share.auto.offset.reset=by_duration:`).
    Since {
        duration_ms: i64,
    },
}

/// A share group's settings as the engines need them (KIP-932 / KIP-1191 group configs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ShareSettings {
    pub(crate) record_lock_duration_ms: u64,
    pub(crate) delivery_count_limit: u32,
    pub(crate) max_record_locks: u32,
    pub(crate) auto_offset_reset: StartAt,
    /// `errors.deadletterqueue.topic.name`; `None`: exhausted records are archived.
    pub(crate) dead_letter_topic: Option<String>,
}

impl ShareSettings {
    fn engine_config(&self, log: &LogSettings) -> QueueConfig {
        QueueConfig {
            max_message_bytes: log.max_message_bytes.saturating_sub(BATCH_OVERHEAD_BYTES).max(1),
            ..QueueConfig::share_group(crate::queue::engine::ShareGroupSettings {
                delivery_count_limit: self.delivery_count_limit,
                record_lock_duration_ms: self.record_lock_duration_ms,
                max_record_locks: self.max_record_locks,
                dead_letter_topic: self.dead_letter_topic.is_some(),
            })
        }
    }
}

/// An acknowledgement batch of ShareFetch / ShareAcknowledge: offsets `first..=last` with one
/// type for all, or one per offset (0 gap, 1 accept, 2 release, 3 reject).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ShareAcks {
    pub(crate) first: i64,
    pub(crate) last: i64,
    pub(crate) types: Vec<i8>,
}

/// One partition of a share request.
#[derive(Debug, Clone)]
pub(crate) struct SharePart {
    pub(crate) part: PartRef,
    pub(crate) acks: Vec<ShareAcks>,
    /// Acquire records (ShareFetch) or only acknowledge (ShareAcknowledge, final fetch).
    pub(crate) fetch: bool,
    pub(crate) max_bytes: usize,
}

/// The answer for one partition of a share request.
#[derive(Debug, Clone, Default)]
pub(crate) struct SharePartResult {
    pub(crate) error: i16,
    pub(crate) ack_error: i16,
    /// (first offset, last offset, delivery count).
    pub(crate) acquired: Vec<(i64, i64, i16)>,
    /// Whole stored batches covering the acquired offsets.
    pub(crate) records: Option<Bytes>,
}

/// Acknowledgement items of one share request partition at most (bounds the work of one
/// request; the engine's lock limit bounds real ones far below).
const MAX_SHARE_ACK_ITEMS: usize = 20_000;

/// One message to publish, as the HTTP layer decoded it.
#[derive(Debug, Clone)]
pub(crate) struct OutMessage {
    pub(crate) payload: Bytes,
    pub(crate) key: Option<Bytes>,
    pub(crate) headers: Vec<(String, Bytes)>,
    pub(crate) delay_ms: u64,
    pub(crate) dedup_token: Option<String>,
    /// Redrive: the id the copy keeps (also written as the `strand-message-id` header).
    pub(crate) redrive_of: Option<MessageId>,
}

impl OutMessage {
    fn size_bytes(&self) -> u64 {
        let headers: usize = self.headers.iter().map(|(k, v)| k.len() + v.len()).sum();
        (self.payload.len() + self.key.as_ref().map_or(0, Bytes::len) + headers) as u64
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PublishedMessage {
    pub(crate) id: ExternalMessageId,
    pub(crate) partition: i32,
    pub(crate) offset: i64,
    pub(crate) duplicate: bool,
}

/// A leased message with what the log holds for it.
#[derive(Debug, Clone)]
pub(crate) struct LeasedMessage {
    pub(crate) id: ExternalMessageId,
    pub(crate) generation: u64,
    pub(crate) attempt: u32,
    pub(crate) lease_expires_at_ms: i64,
    pub(crate) partition: i32,
    pub(crate) offset: i64,
    pub(crate) published_at_ms: i64,
    pub(crate) key: Option<Bytes>,
    pub(crate) payload: Option<Bytes>,
    /// The message's headers without Strand's internal ones (`strand-deliver-at-ms`, ...).
    pub(crate) headers: Vec<(String, Bytes)>,
}

/// One engine's gauges and counters, for GET /v1/queues/{queue} and `/metrics`.
#[derive(Debug, Clone)]
pub(crate) struct EngineStats {
    pub(crate) group: String,
    pub(crate) partition: i32,
    pub(crate) metrics: PartitionMetrics,
}

/// Why a queue operation failed as a whole (or one message of it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum QueueFailure {
    #[error(transparent)]
    Engine(#[from] QueueError),
    #[error("queue {0} does not exist")]
    UnknownQueue(String),
    #[error("invalid group name: {0}")]
    BadGroup(String),
    #[error("{0}")]
    Storage(String),
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    Invalid(String),
}

impl QueueFailure {
    pub(crate) fn http_status(&self) -> u16 {
        match self {
            QueueFailure::Engine(e) => e.http_status(),
            QueueFailure::UnknownQueue(_) => 404,
            QueueFailure::BadGroup(_) | QueueFailure::Invalid(_) => 400,
            QueueFailure::Storage(_) | QueueFailure::Unavailable(_) => 503,
        }
    }

    /// The machine-readable error code of the HTTP API.
    pub(crate) fn code(&self) -> &'static str {
        use QueueError as E;
        match self {
            QueueFailure::Engine(e) => match e {
                E::NotFound => "message_not_found",
                E::StaleGeneration { .. } => "stale_generation",
                E::NotOwner => "not_owner",
                E::NotLeased { .. } => "not_leased",
                E::AlreadyDone => "already_done",
                E::AlreadyLive(_) => "already_live",
                E::WrongPartition(_) => "wrong_partition",
                E::EmptyBatch | E::BatchTooLarge { .. } => "bad_batch",
                E::VisibilityOutOfRange { .. } | E::LeaseLifetimeExceeded { .. } => "bad_visibility_timeout",
                E::DelayOutOfRange { .. } => "bad_delay",
                E::BadConsumerId { .. } => "bad_consumer",
                E::ReasonTooLong { .. } => "reason_too_long",
                E::BadDedupToken { .. } => "bad_dedup_token",
                E::MessageTooLarge { .. } => "message_too_large",
                E::ConsumerLeaseLimit { .. } | E::PartitionLeaseLimit { .. } => "lease_limit",
                E::TooManyDelayed { .. } => "too_many_delayed",
                E::DedupTableFull { .. } => "dedup_table_full",
                E::Busy => "busy",
                E::Unavailable => "unavailable",
            },
            QueueFailure::UnknownQueue(_) => "queue_not_found",
            QueueFailure::BadGroup(_) => "bad_group",
            QueueFailure::Storage(_) => "storage_error",
            QueueFailure::Unavailable(_) => "unavailable",
            QueueFailure::Invalid(_) => "bad_request",
        }
    }
}

/// A queue operation on the shard that owns the partitions named.
#[derive(Debug)]
pub(crate) enum QueueOp {
    /// Append messages to one partition (in order); one result per message.
    Publish {
        topic: String,
        partition: i32,
        messages: Vec<OutMessage>,
    },
    /// Lease up to `max_messages` from these partitions (this shard's), trying them in order.
    Lease {
        group: String,
        consumer: String,
        parts: Vec<PartRef>,
        max_messages: u32,
        visibility_ms: Option<u64>,
    },
    /// Answer once one of the partitions may have a leasable message, or at the timeout.
    WaitLeasable {
        group: String,
        parts: Vec<PartRef>,
        timeout_ms: u64,
    },
    Settle {
        topic: String,
        partition: i32,
        group: String,
        items: Vec<SettleItem>,
    },
    /// The engines of a topic on this shard.
    Stats { topic: String },
    /// Kafka share groups: acknowledge, then acquire, for one member (ShareFetch /
    /// ShareAcknowledge). `max_records` bounds the records acquired over all the partitions.
    Share {
        group: String,
        member: String,
        settings: ShareSettings,
        parts: Vec<SharePart>,
        max_records: u32,
    },
    /// Releases a share member's acquired records in these partitions (its session closed).
    ShareRelease {
        group: String,
        member: String,
        parts: Vec<PartRef>,
    },
    /// DescribeShareGroupOffsets: the share-partition start offset of every engine of `group` on
    /// this shard (of these topics only, if named). Read-only; opens no engine.
    ShareOffsets {
        group: String,
        topics: Option<Vec<String>>,
    },
    /// DeleteShareGroupOffsets: removes the engines of `group` on this shard for these topics,
    /// with their state logs; the next ShareFetch starts again per `share.auto.offset.reset`.
    ShareDeleteState { group: String, topics: Vec<String> },
    /// AlterShareGroupOffsets: starts `group`'s share state of (topic, partition) over at
    /// `start_offset` (not below the log start), durably before the answer.
    ShareAlter {
        group: String,
        topic: String,
        partition: i32,
        start_offset: i64,
    },
}

#[derive(Debug)]
pub(crate) enum QueueAnswer {
    Published(Vec<Result<PublishedMessage, QueueFailure>>),
    Leased(Result<Vec<LeasedMessage>, QueueFailure>),
    Ready,
    Settled(Result<Vec<Result<Settled, QueueError>>, QueueFailure>),
    Stats(Vec<EngineStats>),
    Share(Vec<SharePartResult>),
    /// (topic, partition, share-partition start offset) per engine.
    ShareOffsets(Vec<(String, i32, i64)>),
    /// AlterShareGroupOffsets of one partition: `Err` with the partition's error code.
    ShareAltered(Result<(), (kafka_protocol::ResponseError, String)>),
}

/// Checks an HTTP/Kafka group name and gives its directory form: bytes outside
/// `[A-Za-z0-9_-]` are percent-encoded.
pub(crate) fn group_dir_name(group: &str) -> Result<String, QueueFailure> {
    if group.is_empty() {
        return Err(QueueFailure::BadGroup("a group name is not empty".into()));
    }
    let mut out = String::with_capacity(group.len());
    for b in group.bytes() {
        if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    if out.len() > MAX_GROUP_DIR_BYTES {
        return Err(QueueFailure::BadGroup(format!(
            "group name too long (at most {MAX_GROUP_DIR_BYTES} bytes once encoded)"
        )));
    }
    Ok(out)
}

fn parse_group_dir_name(name: &str) -> Option<String> {
    let b = name.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            c if c.is_ascii_alphanumeric() || c == b'_' || c == b'-' => {
                out.push(c);
                i += 1;
            }
            _ => return None,
        }
    }
    let s = String::from_utf8(out).ok()?;
    (!s.is_empty()).then_some(s)
}

/// The storage directory name of a state log: `__queue_state/{topic}-{partition}/{group}`.
pub(crate) fn state_log_dir_name(topic: &str, partition: i32, group: &str) -> Result<String, QueueFailure> {
    Ok(format!(
        "{STATE_DIR}/{topic}-{partition}/{}",
        group_dir_name(group)?
    ))
}

/// Parses [`state_log_dir_name`] output: (topic, partition, group).
pub(crate) fn parse_state_log_dir_name(name: &str) -> Option<(&str, i32, String)> {
    let rest = name.strip_prefix(STATE_DIR)?.strip_prefix('/')?;
    let (part_dir, group) = rest.split_once('/')?;
    let (topic, p) = part_dir.rsplit_once('-')?;
    if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    strand_protocol::types::validate_topic_name(topic).ok()?;
    Some((topic, p.parse().ok()?, parse_group_dir_name(group)?))
}

/// Storage settings of every state log: small segments (snapshots let old ones go), no
/// time or size retention.
pub(crate) fn state_log_config() -> LogConfig {
    LogConfig {
        segment_bytes: 8 << 20,
        segment_ms: 7 * 24 * 3600 * 1000,
        retention_ms: None,
        retention_bytes: None,
        index_interval_bytes: 4096,
        max_index_entries: (1 << 20) / 8,
    }
}

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
    state_log: LogId,
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
    metrics: RefCell<crate::metrics::QueueMetrics>,
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
            me: me.clone(),
            core,
        })
    }

    /// Itself (alive as long as a caller holds it).
    fn rc(&self) -> Option<Rc<QueueHost>> {
        self.me.upgrade()
    }

    /// Recovers the engines whose state logs this shard owns (start-up, after the partition logs
    /// are open).
    pub(crate) async fn start(&self) {
        let shard = &self.core;
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
                } => QueueAnswer::Leased(
                    host.lease(&group, &consumer, &parts, max_messages, visibility_ms)
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
        loop {
            if let Some(e) = self.engines.borrow().get(&key) {
                return Ok(e.clone());
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
        let done = Rc::new(Notify::new());
        self.opening.borrow_mut().insert(key.clone(), done.clone());
        let opened = self.open_engine(&key, start).await;
        self.opening.borrow_mut().remove(&key);
        done.notify_all();
        let engine = Rc::new(opened?);
        self.engines.borrow_mut().insert(key, engine.clone());
        glommio::spawn_local(timer_loop(self.me.clone(), engine.clone())).detach();
        // Recovery may have queued actions (dead letters to re-send, the corrected state).
        self.drain(&engine);
        self.kick_load(&engine);
        Ok(engine)
    }

    async fn open_engine(&self, key: &EngineKey, start: StartAt) -> Result<Engine, QueueFailure> {
        let shard = &self.core;
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
        let engine = Engine {
            key: key.clone(),
            topic_id: topic.id,
            log,
            state_log,
            q: RefCell::new(q),
            waiters: RefCell::new(HashMap::new()),
            next_request: Cell::new(1),
            loading: Rc::new(Cell::new(false)),
            timer: Notify::new(),
            snapshot: Cell::new(None),
            closed: Cell::new(false),
            share: RefCell::new(None),
            metrics: RefCell::new(crate::metrics::QueueMetrics::new(
                &key.topic,
                &key.group,
                key.partition,
            )),
        };
        if recovering && key.group == PRIMARY_GROUP {
            self.restore_dedup_tail(&engine).await;
        }
        tracing::debug!(topic = %key.topic, partition = key.partition, group = %key.group, recovering, "queue engine open");
        Ok(engine)
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

    /// Appends one state write to the engine's state log; reports it durable (or failed).
    fn persist(&self, engine: &Rc<Engine>, write_id: WriteId, records: &[StateRecord], snapshot: bool) {
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
        let appended = shard.store.append(engine.state_log, &batch, LEADER_EPOCH, now);
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
                            if let Err(e) = host.core.store.delete_records(engine.state_log, base).await {
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

    /// Drops an engine (failed, or its topic was deleted); waiting requests get `Unavailable`.
    fn close(&self, engine: &Rc<Engine>) {
        engine.closed.set(true);
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

    async fn publish(
        &self,
        topic: &str,
        partition: i32,
        messages: Vec<OutMessage>,
    ) -> Vec<Result<PublishedMessage, QueueFailure>> {
        let shard = &self.core;
        let n = messages.len();
        let engine = match self.engine(topic, partition, PRIMARY_GROUP).await {
            Ok(e) => e,
            Err(e) => return vec![Err(e); n],
        };
        let now = shard.now_ms();
        let max_batch = shard
            .topic_settings(topic)
            .map_or(1 << 20, |s| s.max_message_bytes as usize);
        // Admission, then one append per chunk of admitted messages, without yielding in
        // between (a concurrent duplicate must see the token).
        enum Slot {
            Failed(QueueFailure),
            /// Index into `to_append`.
            Append(usize),
            /// A duplicate of `to_append[i]` (same token earlier in this request).
            SameAs(usize),
            /// An earlier message of the log.
            Duplicate(MessageId, Offset),
        }
        let mut slots = Vec::with_capacity(n);
        let mut to_append: Vec<(OutMessage, i64)> = Vec::new();
        let mut tokens_here: HashMap<String, usize> = HashMap::new();
        {
            let mut q = engine.q.borrow_mut();
            for m in messages {
                if let Some(&i) = m.dedup_token.as_ref().and_then(|t| tokens_here.get(t)) {
                    if q.config().dedup_window_ms > 0 {
                        slots.push(Slot::SameAs(i));
                        continue;
                    }
                }
                let req = PublishRequest {
                    size_bytes: m.size_bytes(),
                    delay_ms: m.delay_ms,
                    dedup_token: m.dedup_token.as_deref().map(str::as_bytes),
                    redrive_of: m.redrive_of,
                };
                match q.admit_publish(&req, now) {
                    Err(e) => slots.push(Slot::Failed(e.into())),
                    Ok(Admission::Duplicate { id, offset }) => slots.push(Slot::Duplicate(id, offset)),
                    Ok(Admission::Append { deliver_at_ms }) => {
                        if let Some(t) = &m.dedup_token {
                            tokens_here.insert(t.clone(), to_append.len());
                        }
                        slots.push(Slot::Append(to_append.len()));
                        to_append.push((m, deliver_at_ms));
                    }
                }
            }
        }
        let mut offsets: Vec<Result<i64, QueueFailure>> = Vec::with_capacity(to_append.len());
        let mut tickets = Vec::new();
        let mut start = 0usize;
        while start < to_append.len() {
            // As many messages as fit one batch (at least one).
            let mut end = start + 1;
            let mut size = to_append[start].0.size_bytes() as usize + 256;
            while end < to_append.len() {
                let more = to_append[end].0.size_bytes() as usize + 256;
                if size + more > max_batch {
                    break;
                }
                size += more;
                end += 1;
            }
            let chunk = &to_append[start..end];
            let batch = build_publish_batch(chunk, engine.topic_id, now);
            match shard.store.append(engine.log, &batch, LEADER_EPOCH, now) {
                Ok(ticket) => {
                    shard.metrics.bytes_in(batch.len());
                    let base = ticket.info.base_offset;
                    let mut q = engine.q.borrow_mut();
                    for (i, (m, deliver_at_ms)) in chunk.iter().enumerate() {
                        let offset = base + i as i64;
                        q.appended(
                            &AppendedMessage {
                                offset: Offset(offset),
                                key: m.key.as_deref(),
                                timestamp_ms: now,
                                deliver_at_ms: *deliver_at_ms,
                                dedup_token: m.dedup_token.as_deref().map(str::as_bytes),
                                message_id: m.redrive_of,
                            },
                            now,
                        );
                        offsets.push(Ok(offset));
                    }
                    tickets.push(ticket);
                }
                Err(e) => {
                    let msg = e.to_string();
                    for _ in chunk {
                        offsets.push(Err(QueueFailure::Storage(msg.clone())));
                    }
                }
            }
            start = end;
        }
        self.drain(&engine);
        let mut durable: Result<(), QueueFailure> = Ok(());
        for t in &tickets {
            if let Err(e) = shard.store.wait_durable(t).await {
                durable = Err(storage_failure(e));
            }
        }
        let hw = shard
            .store
            .offsets(engine.log)
            .map(|o| o.high_watermark)
            .unwrap_or(0);
        self.log_grew(topic, partition, hw);
        // Duplicates of messages not yet durable (published concurrently) wait for them.
        let dup_max = slots
            .iter()
            .filter_map(|s| match s {
                Slot::Duplicate(_, off) => Some(off.0),
                _ => None,
            })
            .max();
        if let Some(max) = dup_max {
            wait_high_watermark(shard, engine.log, max + 1).await;
        }
        slots
            .into_iter()
            .map(|s| match s {
                Slot::Failed(e) => Err(e),
                Slot::Duplicate(id, offset) => Ok(PublishedMessage {
                    id: engine.external(id),
                    partition,
                    offset: offset.0,
                    duplicate: true,
                }),
                Slot::Append(i) | Slot::SameAs(i) => {
                    let offset = offsets
                        .get(i)
                        .cloned()
                        .unwrap_or_else(|| Err(QueueFailure::Unavailable("lost append".into())))?;
                    durable.clone()?;
                    let id = to_append
                        .get(i)
                        .and_then(|(m, _)| m.redrive_of)
                        .unwrap_or(MessageId::new(PartitionId(partition), Offset(offset)));
                    Ok(PublishedMessage {
                        id: engine.external(id),
                        partition,
                        offset,
                        duplicate: matches!(s, Slot::SameAs(_)),
                    })
                }
            })
            .collect()
    }

    async fn lease(
        &self,
        group: &str,
        consumer: &str,
        parts: &[PartRef],
        max_messages: u32,
        visibility_ms: Option<u64>,
    ) -> Result<Vec<LeasedMessage>, QueueFailure> {
        let shard = &self.core;
        let consumer = ConsumerId::new(consumer);
        let mut out = Vec::new();
        let mut first_error = None;
        let mut budget = MAX_LEASE_ANSWER_BYTES;
        for part in parts {
            let want = max_messages.saturating_sub(out.len() as u32);
            if want == 0 || budget == 0 {
                break;
            }
            let engine = match self.engine(&part.topic, part.partition, group).await {
                Ok(e) => e,
                Err(e) => {
                    first_error.get_or_insert(e);
                    continue;
                }
            };
            self.refresh(&engine).await;
            let (visibility, want) = {
                let q = engine.q.borrow();
                let c = q.config();
                (
                    visibility_ms.unwrap_or(c.default_visibility_ms),
                    want.min(c.max_lease_batch),
                )
            };
            // Bound the answer by the partition's average stored message size.
            let avg = shard.store.offsets(engine.log).map_or(1, |o| {
                let n = (o.high_watermark - o.log_start_offset).max(1) as u64;
                (o.size_bytes / n).max(1)
            });
            let want = want.min(u32::try_from(budget / avg).unwrap_or(u32::MAX).max(1));
            let request = engine.request_id();
            let (tx, rx) = oneshot::channel();
            engine.waiters.borrow_mut().insert(request, tx);
            let started = engine
                .q
                .borrow_mut()
                .lease(request, &consumer, want, visibility, shard.now_ms());
            if let Err(e) = started {
                engine.waiters.borrow_mut().remove(&request);
                self.drain(&engine);
                // Refusals of the request itself are the caller's error.
                if matches!(
                    e,
                    QueueError::BadConsumerId { .. }
                        | QueueError::BatchTooLarge { .. }
                        | QueueError::VisibilityOutOfRange { .. }
                        | QueueError::EmptyBatch
                ) {
                    return Err(e.into());
                }
                first_error.get_or_insert(e.into());
                continue;
            }
            self.drain(&engine);
            let leases = match rx.await {
                Ok(Ok(Reply::Leases(l))) => l,
                Ok(Ok(_)) => Vec::new(),
                Ok(Err(e)) => {
                    first_error.get_or_insert(e.into());
                    continue;
                }
                Err(_) => {
                    first_error.get_or_insert(QueueFailure::Unavailable("queue engine closed".into()));
                    continue;
                }
            };
            if leases.is_empty() {
                continue;
            }
            let max_offset = leases.iter().map(|l| l.offset.0).max().unwrap_or(0);
            wait_high_watermark(shard, engine.log, max_offset + 1).await;
            let offsets: Vec<i64> = leases.iter().map(|l| l.offset.0).collect();
            let records = read_offsets(shard, engine.log, &offsets).await;
            for l in leases {
                let Some(r) = records.get(&l.offset.0) else {
                    // The message is gone from the log (DeleteRecords): nothing to deliver.
                    tracing::warn!(topic = %part.topic, partition = part.partition, offset = l.offset.0, "leased message no longer in the log; acknowledging it");
                    self.settle_quietly(&engine, l.offset, l.generation);
                    continue;
                };
                let size = r.value.as_ref().map_or(0, Bytes::len)
                    + r.key.as_ref().map_or(0, Bytes::len)
                    + r.headers
                        .iter()
                        .map(|(k, v)| k.len() + v.as_ref().map_or(0, Bytes::len))
                        .sum::<usize>();
                budget = budget.saturating_sub(size as u64);
                out.push(LeasedMessage {
                    id: engine.external(l.id),
                    generation: l.generation.0,
                    attempt: l.attempt,
                    lease_expires_at_ms: l.expiry_ms,
                    partition: part.partition,
                    offset: l.offset.0,
                    published_at_ms: r.timestamp,
                    key: r.key.clone(),
                    payload: r.value.clone(),
                    headers: user_headers(r),
                });
            }
        }
        match (out.is_empty(), first_error) {
            (true, Some(e)) => Err(e),
            _ => Ok(out),
        }
    }

    /// Acknowledges a leased message the host cannot deliver (its record was deleted).
    fn settle_quietly(
        &self,
        engine: &Rc<Engine>,
        offset: Offset,
        generation: crate::queue::engine::Generation,
    ) {
        let shard = &self.core;
        let request = engine.request_id();
        let item = SettleItem {
            target: crate::queue::engine::MessageRef::Offset(offset),
            fence: crate::queue::engine::Fence::Generation(generation),
            op: crate::queue::engine::SettleOp::Ack,
            reason: Some("message deleted from the log".into()),
        };
        let _ = engine.q.borrow_mut().settle(request, &[item], shard.now_ms());
        self.drain(engine);
    }

    async fn wait_leasable(&self, group: &str, parts: &[PartRef], timeout_ms: u64) {
        let shard = &self.core;
        let deadline = std::time::Instant::now() + Duration::from_millis(timeout_ms);
        loop {
            let changed = self.changed.wait();
            let durable = shard.store.durable_notify().wait();
            for p in parts {
                let key = EngineKey {
                    topic: p.topic.clone(),
                    partition: p.partition,
                    group: group.to_owned(),
                };
                let Some(engine) = self.engines.borrow().get(&key).cloned() else {
                    continue;
                };
                self.refresh(&engine).await;
                if engine.q.borrow().has_leasable() {
                    return;
                }
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() || shard.shutting_down.get() {
                return;
            }
            let timer = glommio::timer::sleep(left);
            futures::pin_mut!(changed);
            futures::pin_mut!(durable);
            futures::pin_mut!(timer);
            let woken = futures::future::select(changed, durable);
            if let futures::future::Either::Right(_) = futures::future::select(woken, timer).await {
                return;
            }
        }
    }

    async fn settle(
        &self,
        topic: &str,
        partition: i32,
        group: &str,
        items: Vec<SettleItem>,
    ) -> Result<Vec<Result<Settled, QueueError>>, QueueFailure> {
        let shard = &self.core;
        let engine = self.engine(topic, partition, group).await?;
        let request = engine.request_id();
        let (tx, rx) = oneshot::channel();
        engine.waiters.borrow_mut().insert(request, tx);
        let started = engine.q.borrow_mut().settle(request, &items, shard.now_ms());
        if let Err(e) = started {
            engine.waiters.borrow_mut().remove(&request);
            self.drain(&engine);
            return Err(e.into());
        }
        self.drain(&engine);
        match rx.await {
            Ok(Ok(Reply::Settled(results))) => Ok(results),
            Ok(Ok(_)) => Err(QueueFailure::Unavailable("unexpected engine reply".into())),
            Ok(Err(e)) => Err(e.into()),
            Err(_) => Err(QueueFailure::Unavailable("queue engine closed".into())),
        }
    }

    fn stats(&self, topic: &str) -> Vec<EngineStats> {
        let mut out: Vec<EngineStats> = self
            .engines
            .borrow()
            .values()
            .filter(|e| e.key.topic == topic)
            .map(|e| EngineStats {
                group: e.key.group.clone(),
                partition: e.key.partition,
                metrics: e.q.borrow().metrics(),
            })
            .collect();
        out.sort_by(|a, b| (&a.group, a.partition).cmp(&(&b.group, b.partition)));
        out
    }

    // ----- Kafka share groups ------------------------------------------------------------------

    /// The engine of a share group's partition, configured with the group's settings.
    async fn share_engine(
        &self,
        part: &PartRef,
        group: &str,
        settings: &ShareSettings,
    ) -> Result<Rc<Engine>, QueueFailure> {
        let shard = &self.core;
        let engine = self
            .engine_from(&part.topic, part.partition, group, settings.auto_offset_reset)
            .await?;
        if engine.share.borrow().as_ref() != Some(settings) {
            let log = shard
                .topic_settings(&part.topic)
                .ok_or_else(|| QueueFailure::UnknownQueue(part.topic.clone()))?;
            engine
                .q
                .borrow_mut()
                .reconfigure(settings.engine_config(&log))
                .map_err(|e| QueueFailure::Invalid(e.to_string()))?;
            *engine.share.borrow_mut() = Some(settings.clone());
        }
        Ok(engine)
    }

    /// ShareFetch / ShareAcknowledge on this shard's partitions: acknowledgements first, then
    /// acquisition (for parts with `fetch`), at most `max_records` records over all parts.
    async fn share(
        &self,
        group: &str,
        member: &str,
        settings: &ShareSettings,
        parts: Vec<SharePart>,
        max_records: u32,
    ) -> Vec<SharePartResult> {
        let shard = &self.core;
        use kafka_protocol::ResponseError as E;
        let owner = ConsumerId::new(member);
        let mut out = vec![SharePartResult::default(); parts.len()];
        let mut engines = Vec::with_capacity(parts.len());
        for (i, p) in parts.iter().enumerate() {
            match self.share_engine(&p.part, group, settings).await {
                Ok(e) => engines.push(Some(e)),
                Err(e) => {
                    if let Some(r) = out.get_mut(i) {
                        r.error = match e {
                            QueueFailure::UnknownQueue(_) => E::UnknownTopicOrPartition.code(),
                            QueueFailure::Invalid(_) | QueueFailure::BadGroup(_) => E::InvalidRequest.code(),
                            _ => E::KafkaStorageError.code(),
                        };
                    }
                    engines.push(None);
                }
            }
        }
        // Acknowledgements.
        for (i, (p, engine)) in parts.iter().zip(&engines).enumerate() {
            let Some(engine) = engine else { continue };
            if p.acks.is_empty() {
                continue;
            }
            let code = match share_ack_items(&p.acks, &owner) {
                Err(e) => e.code(),
                Ok(items) if items.is_empty() => 0,
                Ok(items) => self.share_settle(engine, items).await,
            };
            if let Some(r) = out.get_mut(i) {
                r.ack_error = code;
            }
        }
        // Acquisition.
        let mut left = max_records.max(1);
        for (i, (p, engine)) in parts.iter().zip(&engines).enumerate() {
            let Some(engine) = engine else { continue };
            if !p.fetch || left == 0 {
                continue;
            }
            self.refresh(engine).await;
            let want = left.min(engine.q.borrow().config().max_lease_batch);
            let request = engine.request_id();
            let (tx, rx) = oneshot::channel();
            engine.waiters.borrow_mut().insert(request, tx);
            let started = engine.q.borrow_mut().lease(
                request,
                &owner,
                want,
                settings.record_lock_duration_ms,
                shard.now_ms(),
            );
            if let Err(e) = started {
                engine.waiters.borrow_mut().remove(&request);
                self.drain(engine);
                // Lock limits mean "nothing more for you now", not an error.
                if !matches!(
                    e,
                    QueueError::ConsumerLeaseLimit { .. } | QueueError::PartitionLeaseLimit { .. }
                ) {
                    if let Some(r) = out.get_mut(i) {
                        r.error = e.kafka_error().code();
                    }
                }
                continue;
            }
            self.drain(engine);
            let leases = match rx.await {
                Ok(Ok(Reply::Leases(l))) => l,
                Ok(Ok(_)) => Vec::new(),
                Ok(Err(e)) => {
                    if let Some(r) = out.get_mut(i) {
                        r.error = e.kafka_error().code();
                    }
                    continue;
                }
                Err(_) => continue,
            };
            if leases.is_empty() {
                continue;
            }
            left = left.saturating_sub(leases.len() as u32);
            let mut leases = leases;
            leases.sort_by_key(|l| l.offset);
            let first = leases.first().map_or(0, |l| l.offset.0);
            let last = leases.last().map_or(0, |l| l.offset.0);
            wait_high_watermark(shard, engine.log, last + 1).await;
            let records = read_range(shard, engine.log, first, last, p.max_bytes).await;
            if let Some(r) = out.get_mut(i) {
                r.acquired = crate::queue::engine::Lease::acquired_ranges(&leases)
                    .into_iter()
                    .map(|(a, b, n)| (a.0, b.0, i16::try_from(n).unwrap_or(i16::MAX)))
                    .collect();
                r.records = records;
            }
        }
        out
    }

    /// Settles share acknowledgements; the partition's acknowledge error code (0 when all
    /// went through).
    async fn share_settle(&self, engine: &Rc<Engine>, items: Vec<SettleItem>) -> i16 {
        let shard = &self.core;
        let max = engine.q.borrow().config().max_lease_batch.max(1) as usize;
        let mut code = 0i16;
        for chunk in items.chunks(max) {
            let request = engine.request_id();
            let (tx, rx) = oneshot::channel();
            engine.waiters.borrow_mut().insert(request, tx);
            let started = engine.q.borrow_mut().settle(request, chunk, shard.now_ms());
            if let Err(e) = started {
                engine.waiters.borrow_mut().remove(&request);
                self.drain(engine);
                return e.kafka_error().code();
            }
            self.drain(engine);
            match rx.await {
                Ok(Ok(Reply::Settled(results))) => {
                    if let Some(Err(e)) = results.iter().find(|r| r.is_err()) {
                        if code == 0 {
                            code = e.kafka_error().code();
                        }
                    }
                }
                Ok(Err(e)) => return e.kafka_error().code(),
                _ => return kafka_protocol::ResponseError::UnknownServerError.code(),
            }
        }
        code
    }

    /// Releases what `member` holds in these partitions: the records are available again at
    /// once (a closed session, forgotten partitions).
    fn share_release(&self, group: &str, member: &str, parts: &[PartRef]) {
        let shard = &self.core;
        let engines: Vec<Rc<Engine>> = self
            .engines
            .borrow()
            .values()
            .filter(|e| {
                e.key.group == group
                    && parts
                        .iter()
                        .any(|p| p.topic == e.key.topic && p.partition == e.key.partition)
            })
            .cloned()
            .collect();
        let owner = ConsumerId::new(member);
        for e in engines {
            let n = e.q.borrow_mut().release_owner(&owner, shard.now_ms());
            if n > 0 {
                tracing::debug!(group, member, released = n, topic = %e.key.topic, partition = e.key.partition, "released share records");
            }
            self.drain(&e);
        }
        self.changed.notify_all();
    }

    /// The share-partition start offsets of `group`'s engines on this shard (of `topics` only,
    /// if named), sorted by topic and partition.
    fn share_offsets(&self, group: &str, topics: Option<&[String]>) -> Vec<(String, i32, i64)> {
        let mut out: Vec<(String, i32, i64)> = self
            .engines
            .borrow()
            .values()
            .filter(|e| e.key.group == group && topics.is_none_or(|ts| ts.contains(&e.key.topic)))
            .map(|e| (e.key.topic.clone(), e.key.partition, e.q.borrow().start().0))
            .collect();
        out.sort();
        out
    }

    /// Removes `group`'s engines of `topics` on this shard and their state logs (the caller
    /// checked that the share group has no members). A directory left by an engine that did
    /// not open goes too.
    async fn share_delete_state(&self, group: &str, topics: &[String]) {
        let shard = &self.core;
        let engines: Vec<Rc<Engine>> = self
            .engines
            .borrow()
            .values()
            .filter(|e| e.key.group == group && topics.contains(&e.key.topic))
            .cloned()
            .collect();
        for e in engines {
            self.close(&e);
            if let Err(err) = shard.store.remove_log(e.state_log).await {
                tracing::warn!(topic = %e.key.topic, partition = e.key.partition, group, error = %err, "cannot remove a share group's state log");
            }
        }
        let md = shard.metadata();
        for topic in topics {
            let Some(t) = md.topic(topic) else { continue };
            for p in 0..t.partitions {
                if shard.owner(topic, p) != shard.id {
                    continue;
                }
                let Ok(name) = state_log_dir_name(topic, p, group) else {
                    continue;
                };
                let dir = shard.config.log_dir.join(name);
                if dir.exists() {
                    if let Err(err) = std::fs::remove_dir_all(&dir) {
                        tracing::warn!(dir = %dir.display(), error = %err, "cannot remove queue state");
                    }
                }
            }
        }
        tracing::info!(group, ?topics, "share group offsets deleted");
    }

    /// Starts `group`'s share state of (topic, partition) over at `start_offset` (raised to the
    /// log start offset) and waits until that is durable. The caller checked that the share
    /// group has no members; leases still held go with the old state (as in Kafka).
    async fn share_alter(
        &self,
        group: &str,
        topic: &str,
        partition: i32,
        start_offset: i64,
    ) -> Result<(), (kafka_protocol::ResponseError, String)> {
        let shard = &self.core;
        use kafka_protocol::ResponseError;
        let engine = self
            .engine_from(topic, partition, group, StartAt::Earliest)
            .await
            .map_err(|e| (ResponseError::UnknownTopicOrPartition, e.to_string()))?;
        let log_start = shard
            .store
            .offsets(engine.log)
            .map(|o| o.log_start_offset)
            .map_err(|e| (ResponseError::KafkaStorageError, e.to_string()))?;
        let start = start_offset.max(log_start);
        let reset = engine
            .q
            .borrow_mut()
            .reset_discarding_leases(Offset(start), shard.now_ms());
        if let Err(e) = reset {
            let code = match e {
                QueueError::Busy => ResponseError::NonEmptyGroup,
                _ => ResponseError::UnknownServerError,
            };
            return Err((code, e.to_string()));
        }
        self.drain(&engine);
        let written = shard
            .store
            .offsets(engine.state_log)
            .map(|o| o.log_end_offset)
            .map_err(|e| (ResponseError::KafkaStorageError, e.to_string()))?;
        wait_high_watermark(shard, engine.state_log, written).await;
        let durable = shard
            .store
            .offsets(engine.state_log)
            .is_ok_and(|o| o.high_watermark >= written);
        if !durable {
            return Err((
                ResponseError::KafkaStorageError,
                "the new start offset could not be made durable".into(),
            ));
        }
        self.kick_load(&engine);
        self.changed.notify_all();
        tracing::info!(group, topic, partition, start, "share group start offset altered");
        Ok(())
    }

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
            if let Err(err) = shard.store.remove_log(e.state_log).await {
                tracing::warn!(topic, error = %err, "cannot remove a queue state log");
            }
        }
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

/// Dead-letters one message: reads it, appends it with its failure context to the queue's
/// dead-letter topic, then tells the engine (or that it failed, to retry later).
async fn dead_letter(host: Rc<QueueHost>, engine: Rc<Engine>, req: DeadLetterRequest) {
    let shard = &host.core;
    let result = dead_letter_append(shard, &engine, &req).await;
    let now = shard.now_ms();
    match result {
        Ok(()) => engine.q.borrow_mut().dead_letter_appended(req.offset, now),
        Err(e) => {
            tracing::warn!(topic = %engine.key.topic, partition = engine.key.partition, offset = req.offset.0, error = %e, "dead-letter append failed; will retry");
            engine.q.borrow_mut().dead_letter_failed(req.offset, now);
        }
    }
    if !engine.closed.get() {
        host.drain(&engine);
    }
}

async fn dead_letter_append(
    shard: &Rc<Shard>,
    engine: &Engine,
    req: &DeadLetterRequest,
) -> Result<(), String> {
    let md = shard.metadata();
    let source = md
        .topic(&engine.key.topic)
        .ok_or_else(|| "the queue was deleted".to_string())?;
    let share_dlq = engine
        .share
        .borrow()
        .as_ref()
        .and_then(|s| s.dead_letter_topic.clone());
    let dlq_name =
        share_dlq.unwrap_or_else(|| source.config.queue_settings().dead_letter_topic_of(&source.name));
    let dlq = match md.topic(&dlq_name) {
        Some(t) => t.clone(),
        None => create_dead_letter_topic(shard, &dlq_name, source.partitions).await?,
    };
    let records = read_offsets(shard, engine.log, &[req.offset.0]).await;
    let record = records.get(&req.offset.0);
    let context = req.context_headers(&source.name, source.id);
    let mut headers: Vec<(String, Bytes)> = record
        .map(|r| {
            r.headers
                .iter()
                .filter_map(|(k, v)| {
                    let k = std::str::from_utf8(k).ok()?;
                    // Publish bookkeeping stays behind; context headers are replaced.
                    if k == HEADER_DELIVER_AT
                        || k == HEADER_DEDUP_TOKEN
                        || context.iter().any(|(c, _)| *c == k)
                    {
                        return None;
                    }
                    Some((k.to_owned(), v.clone().unwrap_or_default()))
                })
                .collect()
        })
        .unwrap_or_default();
    headers.extend(context.into_iter().map(|(k, v)| (k.to_owned(), Bytes::from(v))));
    let key = record.and_then(|r| r.key.clone());
    let value = record.and_then(|r| r.value.clone());
    let header_refs: Vec<(&str, Option<&[u8]>)> =
        headers.iter().map(|(k, v)| (k.as_str(), Some(&v[..]))).collect();
    let rec = strand_protocol::batch::build::TestRecord {
        key: key.as_deref(),
        value: value.as_deref(),
        headers: header_refs,
        timestamp_delta: 0,
    };
    let batch = strand_protocol::batch::build::batch(&[rec], shard.now_ms());
    let partition = req.partition.0.rem_euclid(dlq.partitions.max(1));
    let part = PartRef {
        topic: dlq.name.clone(),
        partition,
    };
    let owner = shard.owner(&part.topic, part.partition);
    let call = shard
        .dispatch(
            owner,
            ShardRequest::Produce {
                parts: vec![ProducePart {
                    part,
                    records: Bytes::from(batch),
                }],
                wait: true,
                arrived: None,
            },
        )
        .await
        .map_err(|e| e.to_string())?;
    match call.await.map_err(|e| e.to_string())? {
        ShardResponse::Produce(outcomes) => match outcomes.first() {
            Some(o) if o.error == 0 => Ok(()),
            Some(o) => Err(format!(
                "dead-letter topic {dlq_name} refused the append (error {}: {})",
                o.error,
                o.message.clone().unwrap_or_default()
            )),
            None => Err("no produce answer".into()),
        },
        _ => Err("unexpected answer".into()),
    }
}

/// Creates a dead-letter topic with the source queue's partition count.
pub(crate) async fn create_dead_letter_topic(
    shard: &Rc<Shard>,
    name: &str,
    partitions: i32,
) -> Result<TopicMeta, String> {
    let reply = crate::controller::call(
        shard,
        crate::controller::ControllerOp::CreateTopics {
            topics: vec![crate::metadata::NewTopic {
                name: name.to_owned(),
                num_partitions: partitions.max(1),
                replication_factor: -1,
                assignments: vec![],
                configs: vec![],
            }],
            validate_only: false,
        },
    )
    .await;
    let md = shard.metadata();
    if let Some(t) = md.topic(name) {
        return Ok(t.clone());
    }
    match reply.results.first() {
        Some(r) => match (&r.topic, &r.error) {
            (Some(t), _) => Ok(t.clone()),
            (None, Some(e)) if e.code == kafka_protocol::ResponseError::TopicAlreadyExists => shard
                .metadata()
                .topic(name)
                .cloned()
                .ok_or_else(|| e.message.clone()),
            (None, Some(e)) => Err(format!("cannot create dead-letter topic {name}: {}", e.message)),
            (None, None) => Err(format!("cannot create dead-letter topic {name}")),
        },
        None => Err(format!("cannot create dead-letter topic {name}: no controller")),
    }
}

/// Feeds one log record to an engine (loading, recovery).
fn feed(q: &mut QueuePartition, topic_id: TopicId, r: &Record, now: i64) {
    let mut deliver_at_ms = 0i64;
    let mut token: Option<&[u8]> = None;
    let mut message_id = None;
    for (k, v) in &r.headers {
        let Some(v) = v.as_deref() else { continue };
        match &k[..] {
            k if k == HEADER_DELIVER_AT.as_bytes() => {
                deliver_at_ms = std::str::from_utf8(v)
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0);
            }
            k if k == HEADER_DEDUP_TOKEN.as_bytes() => token = Some(v),
            k if k == HEADER_MESSAGE_ID.as_bytes() => {
                message_id = std::str::from_utf8(v)
                    .ok()
                    .and_then(|s| s.parse::<ExternalMessageId>().ok())
                    .filter(|id| {
                        id.topic == topic_id && id.id.partition == q.partition() && id.id.offset.0 < r.offset
                    })
                    .map(|id| id.id);
            }
            _ => {}
        }
    }
    q.appended(
        &AppendedMessage {
            offset: Offset(r.offset),
            key: r.key.as_deref(),
            timestamp_ms: r.timestamp,
            deliver_at_ms,
            dedup_token: token,
            message_id,
        },
        now,
    );
}

/// The headers a consumer sees: Strand's publish bookkeeping (`strand-deliver-at-ms`,
/// `strand-dedup-token`) is left out; `strand-message-id` of a redriven copy too (the lease
/// carries the id).
fn user_headers(r: &Record) -> Vec<(String, Bytes)> {
    r.headers
        .iter()
        .filter_map(|(k, v)| {
            let k = std::str::from_utf8(k).ok()?;
            if k == HEADER_DELIVER_AT || k == HEADER_DEDUP_TOKEN || k == HEADER_MESSAGE_ID {
                return None;
            }
            Some((k.to_owned(), v.clone().unwrap_or_default()))
        })
        .collect()
}

/// One uncompressed batch of published messages, with Strand's headers added.
fn build_publish_batch(chunk: &[(OutMessage, i64)], topic_id: TopicId, now: i64) -> Vec<u8> {
    use strand_protocol::batch::build::{batch, TestRecord};
    let extra: Vec<Vec<(&'static str, Vec<u8>)>> = chunk
        .iter()
        .map(|(m, deliver_at)| {
            let mut h = Vec::new();
            if *deliver_at > 0 {
                h.push((HEADER_DELIVER_AT, deliver_at.to_string().into_bytes()));
            }
            if let Some(t) = &m.dedup_token {
                h.push((HEADER_DEDUP_TOKEN, t.clone().into_bytes()));
            }
            if let Some(id) = m.redrive_of {
                h.push((
                    HEADER_MESSAGE_ID,
                    ExternalMessageId { topic: topic_id, id }.to_string().into_bytes(),
                ));
            }
            h
        })
        .collect();
    let recs: Vec<TestRecord<'_>> = chunk
        .iter()
        .zip(&extra)
        .map(|((m, _), extra)| {
            let mut headers: Vec<(&str, Option<&[u8]>)> = m
                .headers
                .iter()
                .filter(|(k, _)| k != HEADER_DELIVER_AT && k != HEADER_DEDUP_TOKEN && k != HEADER_MESSAGE_ID)
                .map(|(k, v)| (k.as_str(), Some(&v[..])))
                .collect();
            headers.extend(extra.iter().map(|(k, v)| (*k, Some(&v[..]))));
            TestRecord {
                key: m.key.as_deref(),
                value: Some(&m.payload),
                headers,
                timestamp_delta: 0,
            }
        })
        .collect();
    batch(&recs, now)
}

/// Reads whole batches from `from` (at most about `max_bytes`, at least one batch) and decodes
/// their records. Empty at the high watermark.
async fn read_records(
    shard: &Shard,
    log: LogId,
    from: i64,
    max_bytes: usize,
) -> Result<Vec<Record>, StorageError> {
    let Some(plan) = shard.store.plan_read(log, from, max_bytes)? else {
        return Ok(Vec::new());
    };
    let bytes = plan.execute().await?;
    let mut out = Vec::new();
    let mut scanner = strand_protocol::batch::BatchScanner::new(&bytes, false);
    for b in scanner.by_ref() {
        let end = b.position + b.header.total_bytes();
        if b.header.is_control() {
            continue;
        }
        match decode_records(&bytes.slice(b.position..end), MAX_DECOMPRESSED_BYTES) {
            Ok(recs) => out.extend(recs),
            Err(e) => {
                tracing::error!(offset = b.header.base_offset, error = %e, "undecodable batch in a queue's log; its messages are skipped");
            }
        }
    }
    Ok(out)
}

/// Reads the records at `offsets` (any order); missing ones (deleted, beyond the high
/// watermark) are absent from the answer.
async fn read_offsets(shard: &Shard, log: LogId, offsets: &[i64]) -> HashMap<i64, Record> {
    let mut want: BTreeSet<i64> = offsets.iter().copied().collect();
    let mut out = HashMap::with_capacity(want.len());
    while let Some(&first) = want.first() {
        let records = match read_records(shard, log, first, 256 << 10).await {
            Ok(r) => r,
            Err(StorageError::OffsetOutOfRange { log_start_offset, .. }) if first < log_start_offset => {
                // Below the log start: gone.
                want = want.split_off(&log_start_offset);
                continue;
            }
            Err(_) => break,
        };
        let Some(last) = records.last().map(|r| r.offset) else {
            break;
        };
        for r in records {
            if want.remove(&r.offset) {
                out.insert(r.offset, r);
            }
        }
        // Offsets up to the last one read that were not found are not in the log.
        want = want.split_off(&(last + 1));
    }
    out
}

/// The settle items of share acknowledgement batches: validated (ranges ascending, not
/// overlapping, types 0..=3, one type or one per offset), GAP offsets skipped (they have no
/// record to settle), RELEASE a failed attempt available again at once.
fn share_ack_items(
    batches: &[ShareAcks],
    owner: &ConsumerId,
) -> Result<Vec<SettleItem>, kafka_protocol::ResponseError> {
    use crate::queue::engine::{Fence, MessageRef, SettleOp};
    use kafka_protocol::ResponseError as E;
    let mut items = Vec::new();
    let mut prev_last: Option<i64> = None;
    for b in batches {
        let span = b
            .last
            .checked_sub(b.first)
            .and_then(|d| d.checked_add(1))
            .unwrap_or(0);
        if b.first < 0 || span <= 0 || prev_last.is_some_and(|p| b.first <= p) {
            return Err(E::InvalidRequest);
        }
        prev_last = Some(b.last);
        let per_offset = b.types.len() as i64 == span && span > 1;
        if !(b.types.len() == 1 || per_offset) {
            return Err(E::InvalidRequest);
        }
        if items.len() as i64 + span > MAX_SHARE_ACK_ITEMS as i64 {
            return Err(E::InvalidRequest);
        }
        for (k, off) in (b.first..=b.last).enumerate() {
            let t = if per_offset {
                b.types.get(k)
            } else {
                b.types.first()
            };
            let op = match t {
                Some(0) => continue,
                Some(1) => SettleOp::Ack,
                Some(2) => SettleOp::Nack { delay_ms: Some(0) },
                Some(3) => SettleOp::Reject,
                _ => return Err(E::InvalidRequest),
            };
            items.push(SettleItem {
                target: MessageRef::Offset(Offset(off)),
                fence: Fence::Owner(owner.clone()),
                op,
                reason: match op {
                    SettleOp::Reject => Some("rejected by the consumer".into()),
                    SettleOp::Nack { .. } => Some("released by the consumer".into()),
                    _ => None,
                },
            });
        }
    }
    Ok(items)
}

/// The stored batches covering offsets `first..=last` (whole batches, as stored), reading at
/// least `max_bytes` at a time.
async fn read_range(shard: &Shard, log: LogId, first: i64, last: i64, max_bytes: usize) -> Option<Bytes> {
    let mut parts: Vec<Bytes> = Vec::new();
    let mut next = first;
    // Read in modest chunks: the acquired range is usually far smaller than the client's
    // max_bytes (50 MB by default), and every byte read is copied out of the page cache.
    let chunk_bytes = max_bytes.clamp(64 << 10, 256 << 10);
    while next <= last {
        let plan = shard.store.plan_read(log, next, chunk_bytes).ok()??;
        let chunk = plan.execute().await.ok()?;
        // Whole batches up to the one holding `last`: a read chunk may hold far more than the
        // acquired range, and the answer carries only what was acquired.
        let mut end = None;
        for b in strand_protocol::batch::BatchScanner::new(&chunk, false) {
            if b.header.base_offset > last {
                break;
            }
            end = Some((b.position + b.header.total_bytes(), b.header.next_offset()));
        }
        let (len, next_offset) = end?;
        parts.push(chunk.slice(..len.min(chunk.len())));
        if next_offset <= next {
            break;
        }
        next = next_offset;
    }
    match parts.len() {
        0 => None,
        1 => parts.pop(),
        _ => {
            let mut out = bytes::BytesMut::with_capacity(parts.iter().map(Bytes::len).sum());
            for p in &parts {
                out.extend_from_slice(p);
            }
            Some(out.freeze())
        }
    }
}

/// Waits (bounded) until the log's high watermark reaches `offset`.
async fn wait_high_watermark(shard: &Shard, log: LogId, offset: i64) {
    let deadline = std::time::Instant::now() + DURABLE_WAIT;
    loop {
        let w = shard.store.durable_notify().wait();
        match shard.store.offsets(log) {
            Ok(o) if o.high_watermark >= offset => return,
            Ok(_) => {}
            Err(_) => return,
        }
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return;
        }
        let timer = glommio::timer::sleep(left);
        futures::pin_mut!(w);
        futures::pin_mut!(timer);
        futures::future::select(w, timer).await;
    }
}

fn storage_failure(e: StorageError) -> QueueFailure {
    QueueFailure::Storage(e.to_string())
}

/// Removes `__queue_state/{topic}-{partition}` directories for which `doomed` says so (a
/// deleted topic; at start-up, topics that no longer exist).
pub(crate) fn remove_state_dirs(log_dir: &Path, doomed: impl Fn(&str, i32) -> bool) {
    let root = log_dir.join(STATE_DIR);
    let Ok(entries) = std::fs::read_dir(&root) else {
        return;
    };
    for e in entries.flatten() {
        let Some(name) = e.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        let Some((topic, p)) = name.rsplit_once('-') else {
            continue;
        };
        let Ok(p) = p.parse::<i32>() else { continue };
        if doomed(topic, p) {
            if let Err(err) = std::fs::remove_dir_all(e.path()) {
                tracing::warn!(dir = %e.path().display(), error = %err, "cannot remove queue state");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_log_names_round_trip() {
        for group in ["default", "workers.eu-1", "a/b c", "ü", "%41"] {
            let name = state_log_dir_name("orders", 3, group).unwrap();
            assert!(name.starts_with("__queue_state/orders-3/"));
            let (t, p, g) = parse_state_log_dir_name(&name).unwrap();
            assert_eq!((t, p, g.as_str()), ("orders", 3, group));
            // Never mistaken for a partition directory.
            assert!(!name.contains('.') || group.contains('.'));
        }
        assert_eq!(group_dir_name("workers.eu-1").unwrap(), "workers%2Eeu-1");
        assert!(group_dir_name("").is_err());
        assert!(group_dir_name(&"x".repeat(201)).is_err());
        assert!(parse_state_log_dir_name("orders-3").is_none());
        assert!(parse_state_log_dir_name("__queue_state/orders-x/default").is_none());
        assert!(parse_state_log_dir_name("__queue_state/orders-1/bad.name").is_none());
    }

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
    fn share_acknowledgements_are_checked_and_expanded() {
        use crate::queue::engine::{Fence, MessageRef, SettleOp};
        use kafka_protocol::ResponseError as E;
        let owner = ConsumerId::new("m");
        let acks = |v: &[(i64, i64, &[i8])]| -> Vec<ShareAcks> {
            v.iter()
                .map(|(a, b, t)| ShareAcks {
                    first: *a,
                    last: *b,
                    types: t.to_vec(),
                })
                .collect()
        };
        // One type for a range, one per offset, GAPs skipped.
        let items = share_ack_items(&acks(&[(0, 2, &[1]), (5, 7, &[2, 0, 3])]), &owner).unwrap();
        let got: Vec<(i64, SettleOp)> = items
            .iter()
            .map(|i| match (&i.target, &i.fence) {
                (MessageRef::Offset(o), Fence::Owner(m)) if *m == owner => (o.0, i.op),
                _ => panic!("{i:?}"),
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (0, SettleOp::Ack),
                (1, SettleOp::Ack),
                (2, SettleOp::Ack),
                (5, SettleOp::Nack { delay_ms: Some(0) }),
                (7, SettleOp::Reject)
            ]
        );
        // Overlapping, descending, empty or inverted ranges, bad types, wrong type counts.
        for bad in [
            acks(&[(0, 5, &[1]), (5, 6, &[1])]),
            acks(&[(5, 6, &[1]), (0, 1, &[1])]),
            acks(&[(3, 2, &[1])]),
            acks(&[(-1, 2, &[1])]),
            acks(&[(0, 0, &[4])]),
            acks(&[(0, 2, &[1, 1])]),
            acks(&[(0, 2, &[])]),
            acks(&[(0, i64::MAX, &[1])]),
        ] {
            assert_eq!(
                share_ack_items(&bad, &owner).unwrap_err(),
                E::InvalidRequest,
                "{bad:?}"
            );
        }
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
