//! The queue host's messages: the operations other shards send it ([`QueueOp`]) and its
//! answers ([`QueueAnswer`]), in domain terms (the doors choose HTTP statuses and Kafka error
//! codes).

use super::BATCH_OVERHEAD_BYTES;
use crate::config::LogSettings;
use crate::queue::engine::ExternalMessageId;
use crate::queue::engine::MessageId;
use crate::queue::engine::PartitionMetrics;
use crate::queue::engine::QueueConfig;
use crate::queue::engine::QueueError;
use crate::queue::engine::SettleItem;
use crate::queue::engine::Settled;
use crate::shard::ops::PartRef;
use bytes::Bytes;

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
    pub(super) fn engine_config(&self, log: &LogSettings) -> QueueConfig {
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

/// One partition of a share request.
#[derive(Debug, Clone)]
pub(crate) struct SharePart {
    pub(crate) part: PartRef,
    /// The member's acknowledgements of records it acquired, settled before any acquisition.
    pub(crate) settle: Vec<SettleItem>,
    /// Acquire records (ShareFetch) or only acknowledge (ShareAcknowledge, final fetch).
    pub(crate) fetch: bool,
    pub(crate) max_bytes: usize,
}

/// The answer for one partition of a share request.
#[derive(Debug, Clone, Default)]
pub(crate) struct SharePartResult {
    /// Why the partition could not be served (its engine, or its acquisition refused).
    pub(crate) error: Option<QueueFailure>,
    /// Why an acknowledgement was refused (the first refusal).
    pub(crate) ack_error: Option<QueueFailure>,
    /// (first offset, last offset, delivery count).
    pub(crate) acquired: Vec<(i64, i64, i16)>,
    /// Whole stored batches covering the acquired offsets.
    pub(crate) records: Option<Bytes>,
}

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
    pub(super) fn size_bytes(&self) -> u64 {
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
    /// In a cluster: this node's replica of the partition does not lead it (the leader, if
    /// known). Queue engines run on their partition's leader only.
    #[error("this node does not lead the partition{}", .0.map(|n| format!(" (node {} does)", n.0)).unwrap_or_default())]
    NotLeader(Option<strand_protocol::types::NodeId>),
}

/// A queue operation on the shard that owns the partitions named.
#[derive(Debug)]
pub(crate) enum QueueOp {
    /// A dead letter (built by the engine host of another node) for this node's partition of
    /// a dead-letter topic: appended through the produce path.
    AppendDeadLetter {
        topic: String,
        partition: i32,
        batch: Bytes,
    },
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
        /// Payload bytes the answer carries at most (roughly; at least one message goes).
        max_bytes: u64,
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
    ShareAltered(Result<(), QueueFailure>),
    /// A dead letter appended (or why not).
    Appended(Result<(), QueueFailure>),
}
