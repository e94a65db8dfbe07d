//! The requests one shard makes of another (or of itself): the partition-level domain operations
//! behind the Kafka handlers. Everything here is `Send`: it crosses shards.

use std::sync::Arc;

use std::any::{Any, TypeId};

use bytes::Bytes;
use kafka_protocol::ResponseError;
use strand_storage::FileRegion;

use crate::metadata::MetadataDelta;

/// A partition named by topic and index.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct PartRef {
    pub(crate) topic: String,
    pub(crate) partition: i32,
}

/// One partition's batch in a Produce request, already validated (CRC, size) by the
/// connection's shard.
#[derive(Debug)]
pub(crate) struct ProducePart {
    pub(crate) part: PartRef,
    pub(crate) records: Bytes,
}

#[derive(Debug, Clone)]
pub(crate) struct ProduceOutcome {
    pub(crate) error: i16,
    pub(crate) message: Option<String>,
    pub(crate) base_offset: i64,
    pub(crate) log_append_time_ms: i64,
    pub(crate) log_start_offset: i64,
    /// With NOT_LEADER_OR_FOLLOWER in a cluster: the leader's id and epoch (KIP-951).
    pub(crate) current_leader: Option<(i32, i32)>,
    /// Refused by a leader cut off from its replicas (see `Shard::read_partitions` and the
    /// produce path): the connection is to be closed once answered.
    pub(crate) cut_off: bool,
}

impl Default for ProduceOutcome {
    fn default() -> Self {
        ProduceOutcome {
            error: 0,
            message: None,
            base_offset: -1,
            log_append_time_ms: -1,
            log_start_offset: -1,
            current_leader: None,
            cut_off: false,
        }
    }
}

impl ProduceOutcome {
    pub(crate) fn error(e: ResponseError, message: Option<String>) -> Self {
        ProduceOutcome {
            error: e.code(),
            message,
            ..ProduceOutcome::default()
        }
    }
}

/// The topics of a shard request that lists partitions, each named once: a Fetch names up to
/// every partition of a topic, on every request. Its partitions refer to it by index.
pub(crate) type TopicTable = Vec<Arc<str>>;

/// One partition of a shard's Fetch; `topic` indexes the request's [`TopicTable`].
#[derive(Debug, Clone)]
pub(crate) struct FetchPart {
    pub(crate) topic: u32,
    pub(crate) partition: i32,
    pub(crate) fetch_offset: i64,
    pub(crate) max_bytes: usize,
    pub(crate) current_leader_epoch: i32,
}

/// A partition a Fetch waits on: data at or past `offset` ends the wait. `topic` indexes the
/// request's [`TopicTable`].
#[derive(Debug, Clone)]
pub(crate) struct WaitPart {
    pub(crate) topic: u32,
    pub(crate) partition: i32,
    pub(crate) offset: i64,
}

#[derive(Debug, Clone)]
pub(crate) struct FetchOutcome {
    pub(crate) error: i16,
    pub(crate) high_watermark: i64,
    pub(crate) last_stable_offset: i64,
    pub(crate) log_start_offset: i64,
    pub(crate) records: Option<Records>,
    /// The partition had data past its fetch offset, but the request's shared byte budget
    /// left it less than its own `max_bytes` (or nothing).
    pub(crate) cut: bool,
    /// With NOT_LEADER_OR_FOLLOWER in a cluster: the leader's id and epoch (KIP-951).
    pub(crate) current_leader: Option<(i32, i32)>,
    /// Refused by a leader cut off from its replicas: the connection is to be closed once
    /// answered.
    pub(crate) cut_off: bool,
}

impl FetchOutcome {
    pub(crate) fn error(e: ResponseError) -> Self {
        FetchOutcome {
            error: e.code(),
            high_watermark: -1,
            last_stable_offset: -1,
            log_start_offset: -1,
            records: None,
            cut: false,
            current_leader: None,
            cut_off: false,
        }
    }

    pub(crate) fn bytes(&self) -> usize {
        self.records.as_ref().map_or(0, Records::len)
    }
}

/// A partition's fetched records: read into memory, or a region of a segment file the
/// connection sends as it is (`sendfile`).
#[derive(Debug, Clone)]
pub(crate) enum Records {
    Bytes(Bytes),
    Region(Arc<FileRegion>),
}

impl Records {
    pub(crate) fn len(&self) -> usize {
        match self {
            Records::Bytes(b) => b.len(),
            Records::Region(r) => r.len,
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct ListOffsetsPart {
    pub(crate) part: PartRef,
    pub(crate) timestamp: i64,
    pub(crate) current_leader_epoch: i32,
}

#[derive(Debug, Clone)]
pub(crate) struct ListOffsetsOutcome {
    pub(crate) error: i16,
    pub(crate) timestamp: i64,
    pub(crate) offset: i64,
    pub(crate) leader_epoch: i32,
}

#[derive(Debug, Clone)]
pub(crate) struct EpochQuery {
    pub(crate) part: PartRef,
    pub(crate) current_leader_epoch: i32,
    pub(crate) leader_epoch: i32,
}

#[derive(Debug, Clone)]
pub(crate) struct EpochAnswer {
    pub(crate) error: i16,
    pub(crate) leader_epoch: i32,
    pub(crate) end_offset: i64,
}

/// A request for a subsystem's service (see [`super::service`]), as the router carries it: the
/// service's type and its request, boxed.
pub(crate) struct ServiceCall {
    service: TypeId,
    body: Box<dyn Any + Send>,
}

impl ServiceCall {
    pub(crate) fn new(service: TypeId, body: Box<dyn Any + Send>) -> Self {
        ServiceCall { service, body }
    }

    pub(crate) fn into_parts(self) -> (TypeId, Box<dyn Any + Send>) {
        (self.service, self.body)
    }
}

/// A service's answer, as the router carries it (no body: the shard has no such service, or it
/// is gone).
pub(crate) struct ServiceAnswer(Option<Box<dyn Any + Send>>);

impl ServiceAnswer {
    pub(crate) const NONE: ServiceAnswer = ServiceAnswer(None);

    pub(crate) fn new(body: Box<dyn Any + Send>) -> Self {
        ServiceAnswer(Some(body))
    }

    pub(crate) fn into_body(self) -> Option<Box<dyn Any + Send>> {
        self.0
    }
}

/// A request to a shard.
pub(crate) enum ShardRequest {
    /// Append batches; answer when durable if `wait`. `arrived`: when a Kafka Produce request's
    /// frame was read, for the produce stage histograms (`None` for the broker's own appends).
    Produce {
        parts: Vec<ProducePart>,
        wait: bool,
        /// The request's acks (-1, 0, 1): when a replicated partition's write is answered.
        acks: i16,
        arrived: Option<std::time::Instant>,
    },
    /// Read from partitions; `max_bytes` bounds the total.
    Fetch {
        topics: TopicTable,
        parts: Vec<FetchPart>,
        max_bytes: usize,
        /// Records may come back as file regions (a Kafka Fetch answer sends them as they are,
        /// with `strand.fetch.sendfile`); otherwise always as bytes.
        regions: bool,
    },
    /// Answer once any of the partitions has data at or past its offset, or after the timeout.
    WaitForData {
        topics: TopicTable,
        parts: Vec<WaitPart>,
        timeout_ms: u64,
    },
    ListOffsets(Vec<ListOffsetsPart>),
    /// Move log start offsets (DeleteRecords); -1 means the high watermark.
    DeleteRecords(Vec<(PartRef, i64)>),
    EpochEndOffsets(Vec<EpochQuery>),
    /// The bytes each partition's log holds on this node (DescribeLogDirs).
    LogSizes(Vec<PartRef>),
    /// Phase 1 of a metadata change: open or remove this shard's logs.
    PrepareMetadata(Vec<MetadataDelta>),
    /// Phase 2: update this shard's metadata replica.
    CommitMetadata(Vec<MetadataDelta>),
    /// A request for a subsystem's service on this shard (see [`super::service`]).
    Service(ServiceCall),
}

/// A shard's answer.
pub(crate) enum ShardResponse {
    Produce(Vec<ProduceOutcome>),
    Fetch(Vec<FetchOutcome>),
    DataReady,
    ListOffsets(Vec<ListOffsetsOutcome>),
    DeleteRecords(Vec<(i16, i64)>),
    EpochEndOffsets(Vec<EpochAnswer>),
    /// Per partition asked, its log's size in bytes; `None` where this node has no replica.
    LogSizes(Vec<Option<u64>>),
    /// Metadata applied; per-partition problems (logged by the shard too).
    Applied(Vec<String>),
    /// A subsystem's answer.
    Service(ServiceAnswer),
}
