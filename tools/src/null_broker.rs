//! A "null broker": the least work any Kafka broker could do, to measure the client's ceiling.
//!
//! `strand-bench` drives brokers with librdkafka on the same machine, so a broker's figures are
//! bounded by what the client itself can do there (librdkafka parses a broker's answers on one
//! thread per broker, and shares the CPUs with the broker). To report "the broker reaches X % of what this client can do on this
//! machine against a broker that costs nothing", this broker is run as one more peer of the
//! same workload. It is correct enough for librdkafka's producer, consumer (assign, no group
//! membership) and admin client, and does as little as it can:
//!
//! * **Produce** stores nothing: each record batch's header is read (never its CRC or records),
//!   the batch gets the partition's high watermark as base offset and the high watermark moves
//!   past its records. `acks=0` requests get no response, as in Kafka.
//! * **Fetch** serves records without having kept them. Every partition keeps an index of its
//!   batches (base offset, record count, template); a template is the first batch produced with
//!   a given shape (record count, byte length), shared by all partitions. A fetch copies the
//!   templates of the batches from the fetch offset on, each with its first 8 bytes (the base
//!   offset) patched to the real one. The CRC covers the batch from its attributes on, so the
//!   patched batch is still valid, and a consumer reading from offset 0 gets exactly
//!   high-watermark records per partition, each of the size the producer sent. A fetch from the
//!   middle of a batch gets the whole batch, and the first batch of the first partition with
//!   data is served whole even past `max_bytes` (KIP-74), as in Kafka.
//! * **The recent window.** The most recently produced batches ([`NullBrokerConfig::recent_bytes`],
//!   256 MiB by default) are also kept as they were sent and served instead of their template. A
//!   consumer that follows the head of the log therefore reads the very bytes the producer wrote,
//!   which `strand-bench`'s tail consumers need: they read a send timestamp and a phase tag out of
//!   every payload to measure end-to-end latency. Only a consumer that falls further behind than
//!   the window (or reads the log back from the start) gets template bytes: valid records of the
//!   right sizes and offsets, with another batch's payloads and timestamps.
//!
//! Memory is bounded: frames by [`NullBrokerConfig::max_frame_bytes`] (a larger one closes the
//! connection), the recent window by its size, connections by
//! [`NullBrokerConfig::max_connections`], and templates by
//! [`NullBrokerConfig::template_budget_bytes`] (2 GiB by default). Past that budget a new shape
//! reuses the template with the same record count whose byte length is closest (the consumer
//! still gets the right number of records at the right offsets; only the batch's byte length
//! differs slightly, by varint widths). A record count never seen before still gets its one
//! template, so past the budget memory grows by at most one template per distinct record count
//! (a batch holds at most librdkafka's `batch.num.messages`, 10,000 by default, and its bytes at
//! most `batch.size`). [`NullStats`] counts both cases. The batch index costs 24 bytes per
//! produced batch.
//!
//! Served APIs and versions (advertised in ApiVersions exactly, see [`ADVERTISED`]); an unknown
//! API key, an API or version not served, or a request that does not decode closes the
//! connection, as Kafka does. An ApiVersions request of a version not served is answered at v0
//! with UNSUPPORTED_VERSION and the ApiVersions range, as Kafka does, so the client retries lower.
//!
//! Everything runs on plain threads: one accept loop, one thread per connection with blocking
//! I/O, the state behind one mutex, and a condition variable on which empty fetches wait (at
//! most [`MAX_FETCH_WAIT`]) for the next produce.

use crate::blocking_server::{lock, write_fields, Running, ServerCore, ThreadPerConnection};
use crate::kafka_wire::read_size_prefix;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};
use bytes::Bytes;
use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::create_topics_response::CreatableTopicResult;
use kafka_protocol::messages::fetch_request::FetchTopic;
use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, BrokerId, CreateTopicsRequest, CreateTopicsResponse,
    FetchRequest, FindCoordinatorRequest, FindCoordinatorResponse, ListOffsetsRequest, ListOffsetsResponse,
    MetadataRequest, MetadataResponse, ProduceRequest, ProduceResponse, RequestHeader, ResponseHeader,
    TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use strand_protocol::batch::BatchHeader;
use strand_protocol::frame::peek_frame_size;
use strand_protocol::header::RawHeader;

/// Largest request frame, as Kafka's `socket.request.max.bytes` (100 MiB); a larger one closes
/// the connection.
pub const DEFAULT_MAX_FRAME_BYTES: usize = 100 << 20;
/// Default bound on template memory (see the module documentation for what happens past it).
pub const DEFAULT_TEMPLATE_BUDGET_BYTES: u64 = 2 << 30;
/// Default size of the window of recent batches kept as produced.
pub const DEFAULT_RECENT_BYTES: u64 = 256 << 20;
/// Default bound on concurrent connections; more are closed on accept.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;
/// The longest an empty fetch waits for a produce, whatever its `max_wait_ms` (librdkafka's
/// `fetch.wait.max.ms` defaults to 500).
pub const MAX_FETCH_WAIT: Duration = Duration::from_millis(500);
/// Largest response a fetch builds, whatever its `max_bytes` (the first batch excepted).
const MAX_FETCH_RESPONSE_BYTES: usize = DEFAULT_MAX_FRAME_BYTES;
/// Default broker-side bound on a fetch response: Strand's default `fetch.max.bytes`. librdkafka
/// asks for 50 MiB, and an answer over 32 MiB costs it a fresh mapping (BENCHMARKS.md#fetch-max-bytes):
/// a ceiling that answered larger than a broker needs to would be lowered by a cost no broker
/// has to pay.
pub const DEFAULT_FETCH_MAX_BYTES: i32 = 30 << 20;
/// Most partitions a topic may have: CreateTopics takes the count from the network.
pub const MAX_PARTITIONS_PER_TOPIC: i32 = 100_000;
/// Most partitions of all topics together (32 bytes each before any data).
pub const MAX_PARTITIONS: usize = 1_000_000;

/// The APIs served and their version ranges, advertised as they are in ApiVersions.
///
/// * Produce 3–9: v3 is the first that carries v2 record batches (librdkafka needs Produce ≥ 3
///   and Fetch ≥ 4 to write them); v9 is the first flexible version; v10 (librdkafka's maximum)
///   only adds leader hints to errors, and v13 topic ids.
/// * Fetch 4–12: v4 is the first with v2 batches and the last stable offset; v7 adds sessions
///   (answered with session id 0: no session, so the client keeps sending full requests); v12 is
///   the last that names topics (v13+, up to librdkafka's 16, uses topic ids, which would need
///   Metadata v10+).
/// * ListOffsets 1–7: v1 is the first with one offset per partition; 7 is librdkafka's maximum.
/// * Metadata 1–9: v1 is the first where a null topic list means all topics; v9 is the last
///   without topic ids (v10+; librdkafka goes up to 13).
/// * FindCoordinator 0–3: v4 batches keys (KIP-699); librdkafka uses up to v2.
/// * ApiVersions 0–3: librdkafka's range (it asks for v3 first).
/// * CreateTopics 2–5: 2 is the oldest kafka-protocol decodes; librdkafka uses up to v4.
pub const ADVERTISED: &[(ApiKey, i16, i16)] = &[
    (ApiKey::Produce, 3, 9),
    (ApiKey::Fetch, 4, 12),
    (ApiKey::ListOffsets, 1, 7),
    (ApiKey::Metadata, 1, 9),
    (ApiKey::FindCoordinator, 0, 3),
    (ApiKey::ApiVersions, 0, 3),
    (ApiKey::CreateTopics, 2, 5),
];

/// Kafka error codes this broker answers with (kafka-protocol's, by name).
pub mod error_code {
    use kafka_protocol::ResponseError as E;
    pub const NONE: i16 = 0;
    pub const OFFSET_OUT_OF_RANGE: i16 = E::OffsetOutOfRange.code();
    pub const CORRUPT_MESSAGE: i16 = E::CorruptMessage.code();
    pub const UNKNOWN_TOPIC_OR_PARTITION: i16 = E::UnknownTopicOrPartition.code();
    pub const INVALID_TOPIC_EXCEPTION: i16 = E::InvalidTopicException.code();
    pub const UNSUPPORTED_VERSION: i16 = E::UnsupportedVersion.code();
    pub const TOPIC_ALREADY_EXISTS: i16 = E::TopicAlreadyExists.code();
    pub const INVALID_PARTITIONS: i16 = E::InvalidPartitions.code();
    pub const INVALID_REPLICATION_FACTOR: i16 = E::InvalidReplicationFactor.code();
}
use error_code as ec;

/// The base offset: the only bytes patched when a batch is served.
const BASE_OFFSET_BYTES: usize = 8;

/// How to run a [`NullBroker`].
#[derive(Clone, Debug)]
pub struct NullBrokerConfig {
    /// Address to listen on, e.g. `127.0.0.1:0` (an ephemeral port; see [`NullBroker::local_addr`]).
    /// Metadata advertises the bound address (127.0.0.1 if it is unspecified).
    pub listen: String,
    /// The node id of this broker in Metadata and FindCoordinator.
    pub node_id: i32,
    /// Soft bound on template memory.
    pub template_budget_bytes: u64,
    /// Size of the window of recent batches kept as produced (0: serve templates only).
    pub recent_bytes: u64,
    /// Largest request frame; a larger one closes the connection.
    pub max_frame_bytes: usize,
    /// Largest number of concurrent connections; more are closed on accept.
    pub max_connections: usize,
    /// Broker-side bound on a fetch response's record bytes, below the request's `max_bytes`
    /// (`fetch.max.bytes`); the first batch still goes whole (KIP-74).
    pub fetch_max_bytes: i32,
}

impl Default for NullBrokerConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:0".into(),
            node_id: 0,
            template_budget_bytes: DEFAULT_TEMPLATE_BUDGET_BYTES,
            recent_bytes: DEFAULT_RECENT_BYTES,
            max_frame_bytes: DEFAULT_MAX_FRAME_BYTES,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            fetch_max_bytes: DEFAULT_FETCH_MAX_BYTES,
        }
    }
}

/// What the broker did so far.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NullStats {
    pub connections_accepted: u64,
    /// Closed on accept: too many open.
    pub connections_rejected: u64,
    /// Closed because of a malformed frame, an unknown API or a version not served.
    pub connections_closed_on_error: u64,
    pub requests: u64,
    /// Requests per API (known API keys only, served or not), with the highest version seen.
    pub requests_by_api: Vec<ApiCount>,
    pub topics: u64,
    pub partitions: u64,
    /// Record batches, records and bytes appended.
    pub batches: u64,
    pub records: u64,
    pub produced_bytes: u64,
    /// Record bytes served by fetches.
    pub fetched_bytes: u64,
    /// Record bytes served from the recent window (the rest came from templates).
    pub fetched_recent_bytes: u64,
    pub templates: u64,
    pub template_bytes: u64,
    /// Batches of a new shape mapped past the budget to the closest template of their record
    /// count.
    pub template_reuses_past_budget: u64,
    /// Templates stored past the budget (a record count with no template yet).
    pub templates_stored_past_budget: u64,
    /// Bytes in the recent window now.
    pub recent_bytes: u64,
}

/// Requests of one API.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiCount {
    pub api: ApiKey,
    pub requests: u64,
    pub max_version: i16,
}

impl fmt::Display for NullStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_fields!(
            f,
            self,
            connections_accepted,
            connections_rejected,
            connections_closed_on_error,
            requests,
            topics,
            partitions,
            batches,
            records,
            produced_bytes,
            fetched_bytes,
            fetched_recent_bytes,
            templates,
            template_bytes,
            template_reuses_past_budget,
            templates_stored_past_budget,
            recent_bytes
        )?;
        let apis: Vec<String> = self
            .requests_by_api
            .iter()
            .map(|a| format!("{:?}:{}(v{})", a.api, a.requests, a.max_version))
            .collect();
        write!(f, " requests_by_api={}", apis.join(","))
    }
}

// ---------------------------------------------------------------------------------------------
// The log: what is kept of the produced data, and how fetches are planned from it.
// ---------------------------------------------------------------------------------------------

/// One produced batch, as the partition's index keeps it.
#[derive(Clone, Copy, Debug)]
struct BatchRef {
    base_offset: i64,
    record_count: u32,
    /// Index into [`Templates::batches`].
    template: u32,
    /// Sequence number in the [`Recent`] window (served from there while it is still in it).
    seq: u64,
}

impl BatchRef {
    /// The offset after the batch's last record.
    fn end(&self) -> i64 {
        self.base_offset + i64::from(self.record_count)
    }
}

#[derive(Debug, Default)]
struct Partition {
    high_watermark: i64,
    /// In offset order, contiguous from 0.
    batches: Vec<BatchRef>,
}

/// The first batch of each shape, shared by all partitions.
#[derive(Debug)]
struct Templates {
    batches: Vec<Bytes>,
    /// (record count, byte length) → index into `batches`.
    by_shape: BTreeMap<(u32, u32), u32>,
    bytes: u64,
    budget: u64,
    reuses_past_budget: u64,
    stored_past_budget: u64,
}

impl Templates {
    fn new(budget: u64) -> Self {
        Self {
            batches: Vec::new(),
            by_shape: BTreeMap::new(),
            bytes: 0,
            budget,
            reuses_past_budget: 0,
            stored_past_budget: 0,
        }
    }

    /// The template for `batch` (whose header says it holds `record_count` records): the one of
    /// its shape, else a new copy of it, or past the budget the closest one of its record count.
    fn template_for(&mut self, batch: &[u8], record_count: u32) -> Result<u32, i16> {
        let len = u32::try_from(batch.len()).map_err(|_| ec::CORRUPT_MESSAGE)?;
        if let Some(&id) = self.by_shape.get(&(record_count, len)) {
            return Ok(id);
        }
        if self.bytes + u64::from(len) > self.budget {
            if let Some(id) = self.closest(record_count, len) {
                self.reuses_past_budget += 1;
                return Ok(id);
            }
            self.stored_past_budget += 1;
        }
        let id = u32::try_from(self.batches.len()).map_err(|_| ec::CORRUPT_MESSAGE)?;
        // A copy: a slice would keep the whole request frame it came in alive.
        self.batches.push(Bytes::copy_from_slice(batch));
        self.by_shape.insert((record_count, len), id);
        self.bytes += u64::from(len);
        Ok(id)
    }

    /// The template with `record_count` records whose byte length is closest to `len`.
    fn closest(&self, record_count: u32, len: u32) -> Option<u32> {
        let above = self
            .by_shape
            .range((record_count, len)..=(record_count, u32::MAX))
            .next();
        let below = self
            .by_shape
            .range((record_count, 0)..(record_count, len))
            .next_back();
        match (below, above) {
            (Some((&(_, lb), &b)), Some((&(_, la), &a))) => Some(if len - lb <= la - len { b } else { a }),
            (Some((_, &id)), None) | (None, Some((_, &id))) => Some(id),
            (None, None) => None,
        }
    }

    fn get(&self, id: u32) -> &Bytes {
        // Ids are only ever handed out for stored templates.
        &self.batches[id as usize]
    }
}

/// The most recent batches as they were produced (slices of the request frames they came in),
/// oldest first, within a byte budget.
#[derive(Debug)]
struct Recent {
    batches: VecDeque<Bytes>,
    /// Sequence number of `batches[0]`.
    first_seq: u64,
    bytes: u64,
    budget: u64,
}

impl Recent {
    fn new(budget: u64) -> Self {
        Self {
            batches: VecDeque::new(),
            first_seq: 0,
            bytes: 0,
            budget,
        }
    }

    /// Keeps `batch` and returns its sequence number; drops the oldest batches past the budget.
    fn push(&mut self, batch: Bytes) -> u64 {
        let seq = self.first_seq + self.batches.len() as u64;
        self.bytes += batch.len() as u64;
        self.batches.push_back(batch);
        while self.bytes > self.budget {
            let Some(old) = self.batches.pop_front() else {
                break;
            };
            self.bytes -= old.len() as u64;
            self.first_seq += 1;
        }
        seq
    }

    fn get(&self, seq: u64) -> Option<&Bytes> {
        let index = usize::try_from(seq.checked_sub(self.first_seq)?).ok()?;
        self.batches.get(index)
    }
}

/// Everything the broker keeps: topics and their batch indexes, templates, the recent window.
#[derive(Debug)]
struct Log {
    topics: BTreeMap<String, Vec<Partition>>,
    templates: Templates,
    recent: Recent,
    /// Of all topics.
    partitions: usize,
    batches: u64,
    records: u64,
    produced_bytes: u64,
    fetched_bytes: u64,
    fetched_recent_bytes: u64,
}

/// One batch found in a Produce request's records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct BatchSpan {
    start: usize,
    len: usize,
    record_count: u32,
}

/// Splits a Produce request's records into v2 batches, reading only their headers. `None` if
/// anything is off: a short or overlong batch, another magic, no records, or a record count
/// that disagrees with the last offset delta (a producer's batch has offset deltas 0..count).
fn parse_batches(records: &[u8]) -> Option<Vec<BatchSpan>> {
    let mut spans = Vec::new();
    let mut pos = 0;
    while pos < records.len() {
        let rest = records.get(pos..)?;
        // Magic 2 and a length of at least a header, checked by the parse.
        let header = BatchHeader::parse(rest).ok()?;
        let len = header.total_bytes();
        let count = header.records_count;
        if len > rest.len() || count < 1 || header.last_offset_delta.checked_add(1)? != count {
            return None;
        }
        spans.push(BatchSpan {
            start: pos,
            len,
            record_count: u32::try_from(count).ok()?,
        });
        pos += len;
    }
    (!spans.is_empty()).then_some(spans)
}

/// Kafka's rule for topic names: 1 to 249 of `[a-zA-Z0-9._-]`, not `.` or `..`.
fn valid_topic_name(name: &str) -> bool {
    (1..=249).contains(&name.len())
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
}

/// What a fetch returns for one partition.
#[derive(Debug)]
struct PartitionPlan {
    index: i32,
    error: i16,
    high_watermark: i64,
    /// (real base offset, batch bytes whose first 8 bytes get replaced by it).
    batches: Vec<(i64, Bytes)>,
}

impl PartitionPlan {
    fn record_bytes(&self) -> usize {
        self.batches.iter().map(|(_, b)| b.len()).sum()
    }
}

#[derive(Debug)]
struct TopicPlan {
    name: StrBytes,
    partitions: Vec<PartitionPlan>,
}

/// A fetch response before it is encoded: what to copy, decided under the lock, copied after.
#[derive(Debug, Default)]
struct FetchPlan {
    topics: Vec<TopicPlan>,
    record_bytes: usize,
    recent_bytes: usize,
    errors: bool,
}

impl Log {
    fn new(template_budget_bytes: u64, recent_bytes: u64) -> Self {
        Self {
            topics: BTreeMap::new(),
            templates: Templates::new(template_budget_bytes),
            recent: Recent::new(recent_bytes),
            partitions: 0,
            batches: 0,
            records: 0,
            produced_bytes: 0,
            fetched_bytes: 0,
            fetched_recent_bytes: 0,
        }
    }

    /// Creates `name` with `partitions` partitions (the name already validated).
    fn create_topic(&mut self, name: &str, partitions: i32) -> Result<(), (i16, &'static str)> {
        if self.topics.contains_key(name) {
            return Err((ec::TOPIC_ALREADY_EXISTS, "topic already exists"));
        }
        let n = usize::try_from(partitions)
            .ok()
            .filter(|n| (1..=MAX_PARTITIONS_PER_TOPIC as usize).contains(n))
            .ok_or((ec::INVALID_PARTITIONS, "partitions must be within 1..=100000"))?;
        if self.partitions + n > MAX_PARTITIONS {
            return Err((ec::INVALID_PARTITIONS, "more than 1000000 partitions in all"));
        }
        self.partitions += n;
        self.topics
            .insert(name.to_string(), (0..n).map(|_| Partition::default()).collect());
        Ok(())
    }

    fn partition(&self, topic: &str, partition: i32) -> Option<&Partition> {
        self.topics.get(topic)?.get(usize::try_from(partition).ok()?)
    }

    /// Appends the batches of one partition's records and returns the first one's base offset.
    /// Nothing is appended if any batch is malformed.
    fn append(&mut self, topic: &str, partition: i32, records: Option<&Bytes>) -> Result<i64, i16> {
        let part = self
            .topics
            .get_mut(topic)
            .and_then(|parts| parts.get_mut(usize::try_from(partition).ok()?))
            .ok_or(ec::UNKNOWN_TOPIC_OR_PARTITION)?;
        let records = records.ok_or(ec::CORRUPT_MESSAGE)?;
        let spans = parse_batches(records).ok_or(ec::CORRUPT_MESSAGE)?;
        let total: u64 = spans.iter().map(|s| u64::from(s.record_count)).sum();
        i64::try_from(total)
            .ok()
            .and_then(|t| part.high_watermark.checked_add(t))
            .ok_or(ec::CORRUPT_MESSAGE)?;
        let base = part.high_watermark;
        for span in spans {
            let batch = records.slice(span.start..span.start + span.len);
            let template = self.templates.template_for(&batch, span.record_count)?;
            self.produced_bytes += batch.len() as u64;
            let seq = self.recent.push(batch);
            part.batches.push(BatchRef {
                base_offset: part.high_watermark,
                record_count: span.record_count,
                template,
                seq,
            });
            part.high_watermark += i64::from(span.record_count);
            self.batches += 1;
            self.records += u64::from(span.record_count);
        }
        Ok(base)
    }

    /// The bytes to serve for `b`: as produced while in the recent window, else its template.
    fn bytes_of(&self, b: &BatchRef) -> (&Bytes, bool) {
        match self.recent.get(b.seq) {
            Some(bytes) => (bytes, true),
            None => (self.templates.get(b.template), false),
        }
    }

    /// Decides what a fetch returns: for each partition, its batches from the fetch offset on,
    /// within `partition_max_bytes` and `max_bytes`, except that the first batch of the first
    /// partition with data is returned whatever its size (KIP-74).
    fn plan_fetch(&self, topics: &[FetchTopic], max_bytes: i32) -> FetchPlan {
        let mut left = usize::try_from(max_bytes)
            .unwrap_or(0)
            .min(MAX_FETCH_RESPONSE_BYTES);
        let mut plan = FetchPlan::default();
        for t in topics {
            let parts = self.topics.get(t.topic.as_str());
            let mut topic = TopicPlan {
                name: t.topic.0.clone(),
                partitions: Vec::with_capacity(t.partitions.len()),
            };
            for p in &t.partitions {
                let mut out = PartitionPlan {
                    index: p.partition,
                    error: ec::NONE,
                    high_watermark: -1,
                    batches: Vec::new(),
                };
                let part = parts.and_then(|ps| ps.get(usize::try_from(p.partition).ok()?));
                match part {
                    None => out.error = ec::UNKNOWN_TOPIC_OR_PARTITION,
                    Some(part) if p.fetch_offset < 0 || p.fetch_offset > part.high_watermark => {
                        out.error = ec::OFFSET_OUT_OF_RANGE;
                    }
                    Some(part) => {
                        out.high_watermark = part.high_watermark;
                        let mut part_left = usize::try_from(p.partition_max_bytes).unwrap_or(0);
                        let start = part.batches.partition_point(|b| b.end() <= p.fetch_offset);
                        for b in part.batches.get(start..).unwrap_or_default() {
                            let (bytes, recent) = self.bytes_of(b);
                            let len = bytes.len();
                            if plan.record_bytes > 0 && (len > part_left || len > left) {
                                break;
                            }
                            part_left = part_left.saturating_sub(len);
                            left = left.saturating_sub(len);
                            plan.record_bytes += len;
                            if recent {
                                plan.recent_bytes += len;
                            }
                            out.batches.push((b.base_offset, bytes.clone()));
                        }
                    }
                }
                plan.errors |= out.error != ec::NONE;
                topic.partitions.push(out);
            }
            plan.topics.push(topic);
        }
        plan
    }
}

// ---------------------------------------------------------------------------------------------
// Encoding.
// ---------------------------------------------------------------------------------------------

fn put_uvarint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// An array length: compact (length + 1, unsigned varint) in flexible versions, else i32.
fn put_len(out: &mut Vec<u8>, flexible: bool, len: usize) -> Result<()> {
    if flexible {
        put_uvarint(out, len as u64 + 1);
    } else {
        let len = i32::try_from(len).map_err(|_| anyhow!("length {len} does not fit an i32"))?;
        out.extend_from_slice(&len.to_be_bytes());
    }
    Ok(())
}

/// A string: compact (length + 1, unsigned varint) in flexible versions, else an i16 length.
fn put_string(out: &mut Vec<u8>, flexible: bool, s: &str) -> Result<()> {
    if flexible {
        put_uvarint(out, s.len() as u64 + 1);
    } else {
        let len = i16::try_from(s.len()).map_err(|_| anyhow!("string of {} bytes", s.len()))?;
        out.extend_from_slice(&len.to_be_bytes());
    }
    out.extend_from_slice(s.as_bytes());
    Ok(())
}

/// Encodes a Fetch response (v4–v12) by hand, so that each batch is copied once, straight from
/// its template (or the recent window) into the output with its base offset patched.
fn encode_fetch_response(
    out: &mut Vec<u8>,
    correlation_id: i32,
    version: i16,
    plan: &FetchPlan,
) -> Result<()> {
    let flexible = version >= 12;
    let start = out.len();
    out.reserve(plan.record_bytes + 64 + 64 * plan.topics.len());
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&correlation_id.to_be_bytes());
    if flexible {
        put_uvarint(out, 0); // response header v1: no tagged fields
    }
    out.extend_from_slice(&0i32.to_be_bytes()); // throttle_time_ms
    if version >= 7 {
        out.extend_from_slice(&ec::NONE.to_be_bytes());
        out.extend_from_slice(&0i32.to_be_bytes()); // session_id: no session
    }
    put_len(out, flexible, plan.topics.len())?;
    for t in &plan.topics {
        put_string(out, flexible, t.name.as_str())?;
        put_len(out, flexible, t.partitions.len())?;
        for p in &t.partitions {
            let hw = p.high_watermark;
            out.extend_from_slice(&p.index.to_be_bytes());
            out.extend_from_slice(&p.error.to_be_bytes());
            out.extend_from_slice(&hw.to_be_bytes());
            out.extend_from_slice(&hw.to_be_bytes()); // last_stable_offset: no transactions
            if version >= 5 {
                let log_start: i64 = if p.error == ec::NONE { 0 } else { -1 };
                out.extend_from_slice(&log_start.to_be_bytes());
            }
            // aborted_transactions: null.
            if flexible {
                put_uvarint(out, 0);
            } else {
                out.extend_from_slice(&(-1i32).to_be_bytes());
            }
            if version >= 11 {
                out.extend_from_slice(&(-1i32).to_be_bytes()); // preferred_read_replica
            }
            put_len(out, flexible, p.record_bytes())?;
            for (base_offset, batch) in &p.batches {
                out.extend_from_slice(&base_offset.to_be_bytes());
                out.extend_from_slice(batch.get(BASE_OFFSET_BYTES..).unwrap_or_default());
            }
            if flexible {
                put_uvarint(out, 0);
            }
        }
        if flexible {
            put_uvarint(out, 0);
        }
    }
    if flexible {
        put_uvarint(out, 0);
    }
    let size = i32::try_from(out.len() - start - 4).map_err(|_| anyhow!("fetch response too large"))?;
    out[start..start + 4].copy_from_slice(&size.to_be_bytes());
    Ok(())
}

/// Appends a complete response frame (size, header, body) to `out`.
fn encode_response<T: Encodable>(
    out: &mut Vec<u8>,
    correlation_id: i32,
    header_version: i16,
    version: i16,
    body: &T,
) -> Result<()> {
    let start = out.len();
    out.extend_from_slice(&[0; 4]);
    ResponseHeader::default()
        .with_correlation_id(correlation_id)
        .encode(out, header_version)?;
    body.encode(out, version)?;
    let size = i32::try_from(out.len() - start - 4).map_err(|_| anyhow!("response too large"))?;
    out[start..start + 4].copy_from_slice(&size.to_be_bytes());
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Requests.
// ---------------------------------------------------------------------------------------------

struct Counters {
    connections_closed_on_error: AtomicU64,
    requests: AtomicU64,
    /// Per api key: requests, and the highest version seen + 1 (0: none).
    by_api: [(AtomicU64, AtomicU64); API_KEY_SLOTS],
}

/// Api keys counted per API (Kafka's go up to 92).
const API_KEY_SLOTS: usize = 128;

impl Default for Counters {
    fn default() -> Self {
        Self {
            connections_closed_on_error: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            by_api: std::array::from_fn(|_| Default::default()),
        }
    }
}

struct Shared {
    config: NullBrokerConfig,
    /// The advertised address.
    host: StrBytes,
    port: i32,
    log: Mutex<Log>,
    /// Notified after every append, for fetches waiting for data.
    appended: Condvar,
    core: ServerCore,
    counters: Counters,
    conns: Mutex<HashMap<u64, TcpStream>>,
}

fn advertised(api: ApiKey) -> Option<(i16, i16)> {
    ADVERTISED
        .iter()
        .find(|(k, _, _)| *k == api)
        .map(|&(_, min, max)| (min, max))
}

fn api_version_entries() -> Vec<ApiVersion> {
    ADVERTISED
        .iter()
        .map(|&(k, min, max)| {
            ApiVersion::default()
                .with_api_key(k as i16)
                .with_min_version(min)
                .with_max_version(max)
        })
        .collect()
}

impl Shared {
    fn new(config: NullBrokerConfig, addr: SocketAddr) -> Self {
        let ip = if addr.ip().is_unspecified() {
            "127.0.0.1".to_string()
        } else {
            addr.ip().to_string()
        };
        let log = Log::new(config.template_budget_bytes, config.recent_bytes);
        let core = ServerCore::new(config.max_connections);
        Self {
            config,
            host: StrBytes::from_string(ip),
            port: i32::from(addr.port()),
            log: Mutex::new(log),
            appended: Condvar::new(),
            core,
            counters: Counters::default(),
            conns: Mutex::new(HashMap::new()),
        }
    }

    fn node(&self) -> BrokerId {
        BrokerId(self.config.node_id)
    }

    fn stats(&self) -> NullStats {
        let log = lock(&self.log);
        let c = &self.counters;
        NullStats {
            connections_accepted: self.core.connections.accepted.load(Ordering::Relaxed),
            connections_rejected: self.core.connections.rejected.load(Ordering::Relaxed),
            connections_closed_on_error: c.connections_closed_on_error.load(Ordering::Relaxed),
            requests: c.requests.load(Ordering::Relaxed),
            requests_by_api: (0..API_KEY_SLOTS)
                .filter_map(|k| {
                    let (n, v) = &c.by_api[k];
                    let api = ApiKey::try_from(i16::try_from(k).ok()?).ok()?;
                    let requests = n.load(Ordering::Relaxed);
                    (requests > 0).then(|| ApiCount {
                        api,
                        requests,
                        max_version: i16::try_from(v.load(Ordering::Relaxed)).unwrap_or(0) - 1,
                    })
                })
                .collect(),
            topics: log.topics.len() as u64,
            partitions: log.partitions as u64,
            batches: log.batches,
            records: log.records,
            produced_bytes: log.produced_bytes,
            fetched_bytes: log.fetched_bytes,
            fetched_recent_bytes: log.fetched_recent_bytes,
            templates: log.templates.batches.len() as u64,
            template_bytes: log.templates.bytes,
            template_reuses_past_budget: log.templates.reuses_past_budget,
            templates_stored_past_budget: log.templates.stored_past_budget,
            recent_bytes: log.recent.bytes,
        }
    }

    /// Handles one request frame (without its size prefix), appending the response frame, if
    /// there is one, to `out`. An error means the connection is to be closed.
    fn handle(&self, frame: Bytes, out: &mut Vec<u8>) -> Result<()> {
        self.counters.requests.fetch_add(1, Ordering::Relaxed);
        let RawHeader {
            api_key,
            api_version: version,
            correlation_id,
        } = RawHeader::peek(&frame)
            .ok_or_else(|| anyhow!("a frame of {} bytes holds no request header", frame.len()))?;
        let api = ApiKey::try_from(api_key).map_err(|_| anyhow!("unknown api key {api_key}"))?;
        if let Some((n, v)) = usize::try_from(api_key)
            .ok()
            .and_then(|k| self.counters.by_api.get(k))
        {
            n.fetch_add(1, Ordering::Relaxed);
            v.fetch_max(u64::try_from(version).unwrap_or(0) + 1, Ordering::Relaxed);
        }
        let (min, max) = advertised(api).ok_or_else(|| anyhow!("{api:?} v{version} is not served"))?;
        if !(min..=max).contains(&version) {
            if api == ApiKey::ApiVersions {
                // As Kafka: v0, the error, and the ApiVersions range for the client to retry in.
                let body = ApiVersionsResponse::default()
                    .with_error_code(ec::UNSUPPORTED_VERSION)
                    .with_api_keys(vec![ApiVersion::default()
                        .with_api_key(api_key)
                        .with_min_version(min)
                        .with_max_version(max)]);
                return encode_response(out, correlation_id, 0, 0, &body);
            }
            bail!("{api:?} v{version} is not served (only v{min}-v{max})");
        }
        let mut body = frame;
        RequestHeader::decode(&mut body, api.request_header_version(version))
            .with_context(|| format!("decoding a {api:?} v{version} request header"))?;
        let header_version = api.response_header_version(version);
        let context = || format!("decoding a {api:?} v{version} request");
        match api {
            ApiKey::ApiVersions => {
                ApiVersionsRequest::decode(&mut body, version).with_context(context)?;
                let response = ApiVersionsResponse::default().with_api_keys(api_version_entries());
                encode_response(out, correlation_id, header_version, version, &response)
            }
            ApiKey::Metadata => {
                let request = MetadataRequest::decode(&mut body, version).with_context(context)?;
                let response = self.metadata(&request, version);
                encode_response(out, correlation_id, header_version, version, &response)
            }
            ApiKey::CreateTopics => {
                let request = CreateTopicsRequest::decode(&mut body, version).with_context(context)?;
                let response = self.create_topics(&request, version);
                encode_response(out, correlation_id, header_version, version, &response)
            }
            ApiKey::FindCoordinator => {
                FindCoordinatorRequest::decode(&mut body, version).with_context(context)?;
                let response = FindCoordinatorResponse::default()
                    .with_node_id(self.node())
                    .with_host(self.host.clone())
                    .with_port(self.port)
                    .with_error_message(None);
                encode_response(out, correlation_id, header_version, version, &response)
            }
            ApiKey::ListOffsets => {
                let request = ListOffsetsRequest::decode(&mut body, version).with_context(context)?;
                let response = self.list_offsets(&request);
                encode_response(out, correlation_id, header_version, version, &response)
            }
            ApiKey::Produce => {
                let request = ProduceRequest::decode(&mut body, version).with_context(context)?;
                let response = self.produce(&request, version);
                if request.acks == 0 {
                    return Ok(()); // Kafka semantics: no response at all.
                }
                encode_response(out, correlation_id, header_version, version, &response)
            }
            ApiKey::Fetch => {
                let request = FetchRequest::decode(&mut body, version).with_context(context)?;
                let plan = self.fetch(&request);
                encode_fetch_response(out, correlation_id, version, &plan)
            }
            other => bail!("{other:?} is not served"),
        }
    }

    /// One broker (this one), every known topic if asked for all, unknown ones with
    /// UNKNOWN_TOPIC_OR_PARTITION (nothing is created automatically).
    fn metadata(&self, request: &MetadataRequest, version: i16) -> MetadataResponse {
        let log = lock(&self.log);
        let node = self.node();
        let described = |name: &str, partitions: Option<&Vec<Partition>>| {
            let mut topic = MetadataResponseTopic::default()
                .with_name(Some(TopicName(StrBytes::from_string(name.to_string()))));
            match partitions {
                None => topic.error_code = ec::UNKNOWN_TOPIC_OR_PARTITION,
                Some(parts) => {
                    topic.partitions = (0..parts.len())
                        .map(|i| {
                            let mut p = MetadataResponsePartition::default()
                                .with_partition_index(i as i32)
                                .with_leader_id(node)
                                .with_replica_nodes(vec![node])
                                .with_isr_nodes(vec![node]);
                            if version >= 7 {
                                p.leader_epoch = 0;
                            }
                            p
                        })
                        .collect();
                }
            }
            topic
        };
        let topics = match &request.topics {
            None => log.topics.iter().map(|(n, p)| described(n, Some(p))).collect(),
            Some(wanted) => wanted
                .iter()
                .map(|t| {
                    let name = t.name.as_ref().map_or("", |n| n.as_str());
                    described(name, log.topics.get(name))
                })
                .collect(),
        };
        MetadataResponse::default()
            .with_brokers(vec![MetadataResponseBroker::default()
                .with_node_id(node)
                .with_host(self.host.clone())
                .with_port(self.port)])
            .with_cluster_id(Some(StrBytes::from_static_str("strand-null-broker")))
            .with_controller_id(node)
            .with_topics(topics)
    }

    fn create_topics(&self, request: &CreateTopicsRequest, version: i16) -> CreateTopicsResponse {
        let mut log = lock(&self.log);
        let topics = request
            .topics
            .iter()
            .map(|t| {
                let name = t.name.as_str();
                let partitions = if !t.assignments.is_empty() {
                    i32::try_from(t.assignments.len()).unwrap_or(i32::MAX)
                } else if t.num_partitions == -1 {
                    1
                } else {
                    t.num_partitions
                };
                let outcome = if !valid_topic_name(name) {
                    Err((ec::INVALID_TOPIC_EXCEPTION, "invalid topic name"))
                } else if !(1..=MAX_PARTITIONS_PER_TOPIC).contains(&partitions) {
                    Err((ec::INVALID_PARTITIONS, "partitions must be within 1..=100000"))
                } else if !matches!(t.replication_factor, -1 | 1) {
                    Err((ec::INVALID_REPLICATION_FACTOR, "one broker: replication factor 1"))
                } else if log.topics.contains_key(name) {
                    Err((ec::TOPIC_ALREADY_EXISTS, "topic already exists"))
                } else if request.validate_only {
                    Ok(())
                } else {
                    log.create_topic(name, partitions)
                };
                let mut result = CreatableTopicResult::default()
                    .with_name(t.name.clone())
                    .with_error_message(None);
                match outcome {
                    Ok(()) if version >= 5 => {
                        result.num_partitions = partitions;
                        result.replication_factor = 1;
                    }
                    Ok(()) => {}
                    Err((code, message)) => {
                        result.error_code = code;
                        result.error_message = Some(StrBytes::from_static_str(message));
                    }
                }
                result
            })
            .collect();
        CreateTopicsResponse::default().with_topics(topics)
    }

    /// -2 (earliest) is 0, -1 (latest) and any other timestamp is the high watermark: batches
    /// keep no timestamps here. No leader epoch (-1), so librdkafka validates no offsets (KIP-320).
    fn list_offsets(&self, request: &ListOffsetsRequest) -> ListOffsetsResponse {
        let log = lock(&self.log);
        let topics = request
            .topics
            .iter()
            .map(|t| {
                let partitions = t
                    .partitions
                    .iter()
                    .map(|p| {
                        let mut r =
                            ListOffsetsPartitionResponse::default().with_partition_index(p.partition_index);
                        match log.partition(t.name.as_str(), p.partition_index) {
                            None => r.error_code = ec::UNKNOWN_TOPIC_OR_PARTITION,
                            Some(part) => r.offset = if p.timestamp == -2 { 0 } else { part.high_watermark },
                        }
                        r
                    })
                    .collect();
                ListOffsetsTopicResponse::default()
                    .with_name(t.name.clone())
                    .with_partitions(partitions)
            })
            .collect();
        ListOffsetsResponse::default().with_topics(topics)
    }

    fn produce(&self, request: &ProduceRequest, version: i16) -> ProduceResponse {
        let mut log = lock(&self.log);
        let mut appended = false;
        let responses = request
            .topic_data
            .iter()
            .map(|t| {
                let partitions = t
                    .partition_data
                    .iter()
                    .map(|p| {
                        let mut r = PartitionProduceResponse::default().with_index(p.index);
                        match log.append(t.name.as_str(), p.index, p.records.as_ref()) {
                            Ok(base) => {
                                appended = true;
                                r.base_offset = base;
                                if version >= 5 {
                                    r.log_start_offset = 0;
                                }
                            }
                            Err(code) => {
                                r.error_code = code;
                                r.base_offset = -1;
                            }
                        }
                        r
                    })
                    .collect();
                TopicProduceResponse::default()
                    .with_name(t.name.clone())
                    .with_partition_responses(partitions)
            })
            .collect();
        drop(log);
        if appended {
            self.appended.notify_all();
        }
        ProduceResponse::default().with_responses(responses)
    }

    /// Plans the fetch; if it finds no records (and no error), waits for a produce until
    /// `max_wait_ms` (at most [`MAX_FETCH_WAIT`]) and plans again.
    fn fetch(&self, request: &FetchRequest) -> FetchPlan {
        let wait = Duration::from_millis(u64::try_from(request.max_wait_ms).unwrap_or(0)).min(MAX_FETCH_WAIT);
        let deadline = Instant::now() + wait;
        let mut log = lock(&self.log);
        let plan = loop {
            let plan = log.plan_fetch(
                &request.topics,
                request.max_bytes.min(self.config.fetch_max_bytes),
            );
            let now = Instant::now();
            if plan.record_bytes > 0 || plan.errors || now >= deadline || self.core.stopping() {
                break plan;
            }
            log = match self.appended.wait_timeout(log, deadline - now) {
                Ok((guard, _)) => guard,
                Err(poisoned) => poisoned.into_inner().0,
            };
        };
        log.fetched_bytes += plan.record_bytes as u64;
        log.fetched_recent_bytes += plan.recent_bytes as u64;
        plan
    }
}

// ---------------------------------------------------------------------------------------------
// The server.
// ---------------------------------------------------------------------------------------------

/// A running null broker; stops (closing every connection) when dropped.
pub struct NullBroker {
    server: Running<Shared>,
}

impl NullBroker {
    /// Binds `config.listen` and starts accepting connections in a background thread.
    pub fn start(config: NullBrokerConfig) -> io::Result<NullBroker> {
        let listener = TcpListener::bind(&config.listen)?;
        let local_addr = listener.local_addr()?;
        let shared = Arc::new(Shared::new(config, local_addr));
        Ok(NullBroker {
            server: Running::start(listener, shared, "null-accept")?,
        })
    }

    /// The bound address (with the actual port when `listen` asked for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.server.local_addr()
    }

    /// The counters so far.
    pub fn stats(&self) -> NullStats {
        self.server.shared.stats()
    }

    /// Stops accepting, closes every connection and waits (up to 5 s) for their threads.
    pub fn shutdown(&mut self) -> NullStats {
        self.server.shut_down();
        self.stats()
    }
}

impl ThreadPerConnection for Shared {
    const THREAD_PREFIX: &'static str = "null-conn";

    fn core(&self) -> &ServerCore {
        &self.core
    }

    /// Also wakes the fetches waiting for data.
    fn stop(&self) {
        self.core.stop();
        self.appended.notify_all();
    }

    fn note(&self, message: String) {
        eprintln!("null-broker: {message}");
    }

    fn opened(&self, id: u64, stream: &TcpStream) {
        if let Ok(clone) = stream.try_clone() {
            lock(&self.conns).insert(id, clone);
        }
    }

    fn serve(server: &Arc<Self>, _id: u64, stream: TcpStream) {
        serve_connection(server, stream);
    }

    fn closed(&self, id: u64) {
        lock(&self.conns).remove(&id);
    }

    fn close_connections(&self) {
        for conn in lock(&self.conns).values() {
            let _ = conn.shutdown(Shutdown::Both);
        }
    }
}

/// Serves requests one at a time, in order (as Kafka does per connection), until the client
/// closes the connection or sends something this broker does not serve.
fn serve_connection(shared: &Shared, mut stream: TcpStream) {
    let peer = stream
        .peer_addr()
        .map_or_else(|_| "?".to_string(), |a| a.to_string());
    let _ = stream.set_nodelay(true);
    // Reused: a large fetch response does not page-fault a fresh buffer in every time.
    let mut out = Vec::new();
    let close_on_error = |why: String| {
        shared
            .counters
            .connections_closed_on_error
            .fetch_add(1, Ordering::Relaxed);
        eprintln!("null-broker: closing the connection from {peer}: {why}");
    };
    loop {
        let frame = match read_frame(&mut stream, shared.config.max_frame_bytes) {
            Ok(Some(frame)) => frame,
            Ok(None) => return,
            Err(e) => {
                if e.kind() == io::ErrorKind::InvalidData {
                    close_on_error(e.to_string());
                }
                return;
            }
        };
        out.clear();
        if let Err(e) = shared.handle(frame, &mut out) {
            close_on_error(format!("{e:#}"));
            return;
        }
        if !out.is_empty() && stream.write_all(&out).is_err() {
            return;
        }
    }
}

/// Reads one frame (without its size prefix). `Ok(None)` when the peer closed (EOF, or a reset)
/// before the first byte; `InvalidData` for a size that is negative, shorter than a request
/// header or above `max`.
fn read_frame(stream: &mut TcpStream, max: usize) -> io::Result<Option<Bytes>> {
    let Some(size) = read_size_prefix(stream)? else {
        return Ok(None);
    };
    // The broker's own checks: negative, over `max`, or too short for a request header.
    let len = match peek_frame_size(&size, max) {
        Ok(Some(len)) => len,
        Ok(None) => return Err(io::Error::other("a 4-byte size prefix was not read whole")),
        Err(e) => return Err(io::Error::new(io::ErrorKind::InvalidData, e.to_string())),
    };
    let mut frame = Vec::with_capacity(len);
    // `take` + `read_to_end` fills the buffer without zeroing it first.
    (&mut *stream).take(len as u64).read_to_end(&mut frame)?;
    if frame.len() != len {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "EOF in a frame"));
    }
    Ok(Some(Bytes::from(frame)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_print_as_name_value_pairs() {
        let stats = NullStats {
            connections_accepted: 1,
            connections_rejected: 2,
            connections_closed_on_error: 3,
            requests: 4,
            requests_by_api: vec![
                ApiCount {
                    api: ApiKey::Produce,
                    requests: 3,
                    max_version: 9,
                },
                ApiCount {
                    api: ApiKey::Fetch,
                    requests: 1,
                    max_version: 12,
                },
            ],
            topics: 5,
            partitions: 6,
            batches: 7,
            records: 8,
            produced_bytes: 9,
            fetched_bytes: 10,
            fetched_recent_bytes: 11,
            templates: 12,
            template_bytes: 13,
            template_reuses_past_budget: 14,
            templates_stored_past_budget: 15,
            recent_bytes: 16,
        };
        assert_eq!(
            stats.to_string(),
            "connections_accepted=1 connections_rejected=2 connections_closed_on_error=3 requests=4 topics=5 \
             partitions=6 batches=7 records=8 produced_bytes=9 fetched_bytes=10 fetched_recent_bytes=11 \
             templates=12 template_bytes=13 template_reuses_past_budget=14 templates_stored_past_budget=15 \
             recent_bytes=16 requests_by_api=Produce:3(v9),Fetch:1(v12)"
        );
    }
    use kafka_protocol::messages::create_topics_request::CreatableTopic;
    use kafka_protocol::messages::fetch_request::FetchPartition;
    use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
    use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
    use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
    use kafka_protocol::messages::FetchResponse;
    use strand_protocol::batch::{BATCH_HEADER_BYTES, LOG_OVERHEAD_BYTES as BATCH_LENGTH_END};

    // Byte offsets in a v2 record batch header, to build and damage batches by hand.
    const BATCH_LENGTH_OFFSET: usize = 8;
    const MAGIC_OFFSET: usize = 16;
    const LAST_OFFSET_DELTA_OFFSET: usize = 23;
    const RECORD_COUNT_OFFSET: usize = 57;

    /// A v2 batch header with `count` records and `filler` bytes of (fake) records, each byte
    /// `fill`; the base offset is 0, as a producer sends it.
    fn batch(count: i32, filler: usize, fill: u8) -> Vec<u8> {
        let mut b = vec![0u8; BATCH_HEADER_BYTES];
        let len = (BATCH_HEADER_BYTES + filler - BATCH_LENGTH_END) as i32;
        b[BATCH_LENGTH_OFFSET..BATCH_LENGTH_OFFSET + 4].copy_from_slice(&len.to_be_bytes());
        b[12..16].copy_from_slice(&(-1i32).to_be_bytes());
        b[MAGIC_OFFSET] = 2;
        b[17..21].copy_from_slice(&0xdead_beef_u32.to_be_bytes());
        b[LAST_OFFSET_DELTA_OFFSET..LAST_OFFSET_DELTA_OFFSET + 4].copy_from_slice(&(count - 1).to_be_bytes());
        b[RECORD_COUNT_OFFSET..RECORD_COUNT_OFFSET + 4].copy_from_slice(&count.to_be_bytes());
        b.extend(std::iter::repeat_n(fill, filler));
        b
    }

    fn log_with(partitions: i32, recent: u64, budget: u64) -> Log {
        let mut log = Log::new(budget, recent);
        log.create_topic("t", partitions).unwrap();
        log
    }

    fn append(log: &mut Log, partition: i32, batches: &[Vec<u8>]) -> Result<i64, i16> {
        let records = Bytes::from(batches.concat());
        log.append("t", partition, Some(&records))
    }

    fn fetch_topics(parts: &[(i32, i64, i32)]) -> Vec<FetchTopic> {
        vec![FetchTopic::default()
            .with_topic(TopicName(StrBytes::from_static_str("t")))
            .with_partitions(
                parts
                    .iter()
                    .map(|&(p, offset, max)| {
                        FetchPartition::default()
                            .with_partition(p)
                            .with_fetch_offset(offset)
                            .with_partition_max_bytes(max)
                    })
                    .collect(),
            )]
    }

    /// The served bytes of one partition: (base offset, bytes after it) per batch.
    fn served(plan: &FetchPlan, partition: usize) -> Vec<(i64, Bytes)> {
        plan.topics[0].partitions[partition].batches.clone()
    }

    #[test]
    fn batches_are_parsed_from_their_headers_only() {
        let records = [batch(3, 10, 1), batch(1, 0, 2)].concat();
        let spans = parse_batches(&records).unwrap();
        assert_eq!(
            spans,
            vec![
                BatchSpan {
                    start: 0,
                    len: 71,
                    record_count: 3
                },
                BatchSpan {
                    start: 71,
                    len: 61,
                    record_count: 1
                }
            ]
        );
        assert_eq!(parse_batches(&[]), None, "no batch");
        assert_eq!(parse_batches(&records[..70]), None, "truncated");
        let mut magic1 = batch(1, 0, 0);
        magic1[MAGIC_OFFSET] = 1;
        assert_eq!(parse_batches(&magic1), None);
        let mut disagreeing = batch(2, 0, 0);
        disagreeing[LAST_OFFSET_DELTA_OFFSET + 3] = 5;
        assert_eq!(parse_batches(&disagreeing), None);
        assert_eq!(parse_batches(&batch(0, 0, 0)), None, "no records");
        let mut negative = batch(1, 0, 0);
        negative[BATCH_LENGTH_OFFSET] = 0xff;
        assert_eq!(parse_batches(&negative), None);
        assert_eq!(parse_batches(&[0u8; 10]), None);
    }

    #[test]
    fn produce_assigns_offsets_from_the_high_watermark() {
        let mut log = log_with(2, 0, u64::MAX);
        assert_eq!(append(&mut log, 0, &[batch(3, 5, 0), batch(2, 5, 0)]), Ok(0));
        assert_eq!(append(&mut log, 0, &[batch(4, 5, 0)]), Ok(5));
        assert_eq!(append(&mut log, 1, &[batch(1, 5, 0)]), Ok(0));
        assert_eq!(log.partition("t", 0).unwrap().high_watermark, 9);
        assert_eq!(log.partition("t", 1).unwrap().high_watermark, 1);
        let bases: Vec<i64> = log.topics["t"][0].batches.iter().map(|b| b.base_offset).collect();
        assert_eq!(bases, vec![0, 3, 5]);
        assert_eq!(
            append(&mut log, 2, &[batch(1, 5, 0)]),
            Err(ec::UNKNOWN_TOPIC_OR_PARTITION)
        );
        assert_eq!(
            append(&mut log, -1, &[batch(1, 5, 0)]),
            Err(ec::UNKNOWN_TOPIC_OR_PARTITION)
        );
        assert_eq!(
            log.append("nope", 0, Some(&Bytes::from(batch(1, 5, 0)))),
            Err(ec::UNKNOWN_TOPIC_OR_PARTITION)
        );
        assert_eq!(log.append("t", 0, None), Err(ec::CORRUPT_MESSAGE));
        // A corrupt batch after a good one appends neither.
        let mut bad = batch(1, 5, 0);
        bad[MAGIC_OFFSET] = 0;
        assert_eq!(
            append(&mut log, 0, &[batch(1, 5, 0), bad]),
            Err(ec::CORRUPT_MESSAGE)
        );
        assert_eq!(log.partition("t", 0).unwrap().high_watermark, 9);
        assert_eq!((log.batches, log.records), (4, 10));
        // Shapes: (3, 66), (2, 66), (4, 66), (1, 66).
        assert_eq!(log.templates.batches.len(), 4);
    }

    #[test]
    fn fetch_tiles_templates_with_patched_base_offsets() {
        let mut log = log_with(1, 0, u64::MAX);
        let (a, b) = (batch(2, 20, 0xaa), batch(3, 30, 0xbb));
        // The second `a` differs in content only: it is served as the first one (its template).
        let a2 = batch(2, 20, 0xcc);
        append(&mut log, 0, &[a.clone(), a2, b.clone()]).unwrap();
        append(&mut log, 0, std::slice::from_ref(&a)).unwrap();
        assert_eq!(log.templates.batches.len(), 2);
        let plan = log.plan_fetch(&fetch_topics(&[(0, 0, 1 << 20)]), 1 << 20);
        assert!(!plan.errors);
        let got = served(&plan, 0);
        let bases: Vec<i64> = got.iter().map(|(o, _)| *o).collect();
        assert_eq!(bases, vec![0, 2, 4, 7]);
        for ((_, bytes), want) in got.iter().zip([&a, &a, &b, &a]) {
            assert_eq!(&bytes[..], &want[..]);
        }
        assert_eq!(plan.topics[0].partitions[0].high_watermark, 9);
        assert_eq!(plan.record_bytes, 3 * a.len() + b.len());
        assert_eq!(plan.recent_bytes, 0);

        // The encoded records carry the real base offsets.
        let mut out = Vec::new();
        encode_fetch_response(&mut out, 7, 12, &plan).unwrap();
        let response = decode_fetch(&out, 12);
        let records = response.responses[0].partitions[0].records.clone().unwrap();
        let mut pos = 0;
        for (base, want) in [(0i64, &a), (2, &a), (4, &b), (7, &a)] {
            assert_eq!(&records[pos..pos + 8], &base.to_be_bytes());
            assert_eq!(&records[pos + 8..pos + want.len()], &want[8..]);
            pos += want.len();
        }
        assert_eq!(pos, records.len());
    }

    #[test]
    fn a_fetch_from_the_middle_of_a_batch_gets_the_whole_batch() {
        let mut log = log_with(1, 0, u64::MAX);
        append(&mut log, 0, &[batch(5, 10, 1), batch(5, 20, 2), batch(5, 30, 3)]).unwrap();
        for (offset, first) in [(0, 0), (4, 0), (5, 5), (7, 5), (14, 10)] {
            let plan = log.plan_fetch(&fetch_topics(&[(0, offset, 1 << 20)]), 1 << 20);
            assert_eq!(served(&plan, 0)[0].0, first, "offset {offset}");
        }
        let at_end = log.plan_fetch(&fetch_topics(&[(0, 15, 1 << 20)]), 1 << 20);
        assert!(!at_end.errors && at_end.record_bytes == 0);
        assert_eq!(at_end.topics[0].partitions[0].high_watermark, 15);
    }

    #[test]
    fn fetch_limits_are_whole_batches_and_the_first_one_always_goes() {
        let mut log = log_with(3, 0, u64::MAX);
        for p in 0..3 {
            append(
                &mut log,
                p,
                &[batch(1, 939, 0), batch(2, 939, 0), batch(3, 939, 0)],
            )
            .unwrap();
        }
        let size = 1000; // every batch
                         // partition_max_bytes below one batch: the first partition still gets one whole batch,
                         // the next ones nothing.
        let plan = log.plan_fetch(&fetch_topics(&[(0, 0, 10), (1, 0, 10), (2, 0, 10)]), 1 << 20);
        let counts: Vec<usize> = (0..3).map(|p| served(&plan, p).len()).collect();
        assert_eq!(counts, vec![1, 0, 0]);
        // partition_max_bytes of 2.5 batches: two per partition.
        let plan = log.plan_fetch(
            &fetch_topics(&[(0, 0, 2500), (1, 0, 2500), (2, 0, 2500)]),
            1 << 20,
        );
        let counts: Vec<usize> = (0..3).map(|p| served(&plan, p).len()).collect();
        assert_eq!(counts, vec![2, 2, 2]);
        // max_bytes of 3.5 batches across partitions.
        let plan = log.plan_fetch(&fetch_topics(&[(0, 0, 2500), (1, 0, 2500), (2, 0, 2500)]), 3500);
        let counts: Vec<usize> = (0..3).map(|p| served(&plan, p).len()).collect();
        assert_eq!(counts, vec![2, 1, 0]);
        assert_eq!(plan.record_bytes, 3 * size);
        // max_bytes 0: still the first batch (KIP-74), of the first partition with data.
        let plan = log.plan_fetch(&fetch_topics(&[(0, 6, 2500), (1, 3, 2500), (2, 0, 2500)]), 0);
        let counts: Vec<usize> = (0..3).map(|p| served(&plan, p).len()).collect();
        assert_eq!(counts, vec![0, 1, 0]);
        assert_eq!(served(&plan, 1)[0].0, 3);
        // Negative limits are 0.
        let plan = log.plan_fetch(&fetch_topics(&[(0, 0, -5), (1, 0, -5)]), -5);
        assert_eq!(plan.record_bytes, size);
    }

    #[test]
    fn offsets_out_of_range_and_unknown_partitions_are_errors() {
        let mut log = log_with(1, 0, u64::MAX);
        append(&mut log, 0, &[batch(4, 0, 0)]).unwrap();
        for offset in [5, -1, i64::MAX] {
            let plan = log.plan_fetch(&fetch_topics(&[(0, offset, 1 << 20)]), 1 << 20);
            let p = &plan.topics[0].partitions[0];
            assert!(plan.errors);
            assert_eq!(
                (p.error, p.high_watermark, p.batches.len()),
                (ec::OFFSET_OUT_OF_RANGE, -1, 0)
            );
        }
        let plan = log.plan_fetch(&fetch_topics(&[(3, 0, 1 << 20), (0, 0, 1 << 20)]), 1 << 20);
        assert_eq!(plan.topics[0].partitions[0].error, ec::UNKNOWN_TOPIC_OR_PARTITION);
        assert_eq!(plan.topics[0].partitions[1].batches.len(), 1);
    }

    #[test]
    fn the_recent_window_serves_batches_as_produced() {
        let (a1, a2, a3) = (batch(2, 100, 1), batch(2, 100, 2), batch(2, 100, 3));
        // Room for two batches.
        let mut log = log_with(1, 2 * a1.len() as u64, u64::MAX);
        append(&mut log, 0, &[a1.clone(), a2.clone(), a3.clone()]).unwrap();
        let plan = log.plan_fetch(&fetch_topics(&[(0, 0, 1 << 20)]), 1 << 20);
        let got: Vec<u8> = served(&plan, 0)
            .iter()
            .map(|(_, b)| b[BATCH_HEADER_BYTES])
            .collect();
        // The first fell out of the window and is its template (itself); then a2 and a3 as sent.
        assert_eq!(got, vec![1, 2, 3]);
        assert_eq!(plan.recent_bytes, 2 * a1.len());
        append(&mut log, 0, &[batch(2, 100, 4)]).unwrap();
        let plan = log.plan_fetch(&fetch_topics(&[(0, 0, 1 << 20)]), 1 << 20);
        let got: Vec<u8> = served(&plan, 0)
            .iter()
            .map(|(_, b)| b[BATCH_HEADER_BYTES])
            .collect();
        assert_eq!(
            got,
            vec![1, 1, 3, 4],
            "a2 left the window: served from the template"
        );
        assert_eq!(log.recent.bytes, 2 * a1.len() as u64);
    }

    #[test]
    fn past_the_budget_shapes_reuse_the_closest_template_of_their_record_count() {
        let budget = (batch(2, 100, 0).len() + batch(2, 110, 0).len()) as u64;
        let mut log = log_with(1, 0, budget);
        append(&mut log, 0, &[batch(2, 100, 1), batch(2, 110, 2)]).unwrap();
        assert_eq!(log.templates.bytes, budget);
        // Past the budget: (2, 104) is closest to (2, 100), (2, 108) to (2, 110).
        append(&mut log, 0, &[batch(2, 104, 3), batch(2, 108, 4)]).unwrap();
        assert_eq!(log.templates.reuses_past_budget, 2);
        // A record count with no template yet is stored anyway.
        append(&mut log, 0, &[batch(7, 5, 5)]).unwrap();
        assert_eq!(
            (log.templates.stored_past_budget, log.templates.batches.len()),
            (1, 3)
        );
        let plan = log.plan_fetch(&fetch_topics(&[(0, 0, 1 << 20)]), 1 << 20);
        let got: Vec<(i64, u8, usize)> = served(&plan, 0)
            .iter()
            .map(|(o, b)| (*o, b[BATCH_HEADER_BYTES], b.len()))
            .collect();
        assert_eq!(
            got,
            vec![(0, 1, 161), (2, 2, 171), (4, 1, 161), (6, 2, 171), (8, 5, 66)],
            "the right offsets, with the closest shape's bytes"
        );
    }

    fn decode_fetch(frame: &[u8], version: i16) -> FetchResponse {
        let size = i32::from_be_bytes(frame[..4].try_into().unwrap()) as usize;
        assert_eq!(size, frame.len() - 4);
        let mut body = Bytes::copy_from_slice(&frame[4..]);
        let header =
            ResponseHeader::decode(&mut body, ApiKey::Fetch.response_header_version(version)).unwrap();
        assert_eq!(header.correlation_id, 7);
        let response = FetchResponse::decode(&mut body, version).unwrap();
        assert!(body.is_empty(), "v{version}: {} bytes left over", body.len());
        response
    }

    #[test]
    fn the_hand_encoded_fetch_response_decodes_at_every_served_version() {
        let mut log = log_with(2, 1 << 20, u64::MAX);
        append(&mut log, 0, &[batch(2, 50, 9)]).unwrap();
        let mut topics = fetch_topics(&[(0, 0, 1 << 20), (1, 0, 1 << 20), (5, 0, 1 << 20)]);
        topics.push(
            FetchTopic::default()
                .with_topic(TopicName(StrBytes::from_static_str("missing")))
                .with_partitions(vec![FetchPartition::default()]),
        );
        let plan = log.plan_fetch(&topics, 1 << 20);
        for version in 4..=12 {
            let mut out = vec![1, 2, 3];
            encode_fetch_response(&mut out, 7, version, &plan).unwrap();
            let r = decode_fetch(&out[3..], version);
            assert_eq!((r.error_code, r.session_id, r.throttle_time_ms), (0, 0, 0));
            assert_eq!(r.responses.len(), 2);
            assert_eq!(r.responses[0].topic.as_str(), "t");
            let p = &r.responses[0].partitions;
            assert_eq!(p.len(), 3);
            assert_eq!(
                (p[0].partition_index, p[0].error_code, p[0].high_watermark),
                (0, 0, 2)
            );
            assert_eq!(p[0].last_stable_offset, 2);
            assert_eq!(p[0].records.as_ref().unwrap().len(), 111);
            assert_eq!((p[1].error_code, p[1].records.as_ref().unwrap().len()), (0, 0));
            assert_eq!(
                (p[2].partition_index, p[2].error_code),
                (5, ec::UNKNOWN_TOPIC_OR_PARTITION)
            );
            assert_eq!(
                r.responses[1].partitions[0].error_code,
                ec::UNKNOWN_TOPIC_OR_PARTITION
            );
            if version >= 5 {
                assert_eq!((p[0].log_start_offset, p[2].log_start_offset), (0, -1));
            }
            if version >= 11 {
                assert_eq!(p[0].preferred_read_replica, -1);
            }
        }
    }

    /// Produces `records` to partition 0 of topic `t` (Produce v9, acks=1).
    fn produce_to_t(s: &Shared, records: Vec<u8>) {
        let produce =
            ProduceRequest::default()
                .with_acks(1)
                .with_topic_data(vec![TopicProduceData::default()
                    .with_name(TopicName(StrBytes::from_static_str("t")))
                    .with_partition_data(vec![PartitionProduceData::default()
                        .with_index(0)
                        .with_records(Some(Bytes::from(records)))])]);
        s.produce(&produce, 9);
    }

    fn shared() -> Shared {
        shared_with(NullBrokerConfig {
            node_id: 3,
            ..NullBrokerConfig::default()
        })
    }

    fn shared_with(config: NullBrokerConfig) -> Shared {
        Shared::new(config, "127.0.0.1:9999".parse().unwrap())
    }

    /// Encodes a request frame body (no size prefix) the way a client would.
    fn frame_of<T: Encodable>(api: ApiKey, version: i16, body: &T) -> Bytes {
        let mut out = Vec::new();
        RequestHeader::default()
            .with_request_api_key(api as i16)
            .with_request_api_version(version)
            .with_correlation_id(7)
            .with_client_id(Some(StrBytes::from_static_str("test")))
            .encode(&mut out, api.request_header_version(version))
            .unwrap();
        body.encode(&mut out, version).unwrap();
        Bytes::from(out)
    }

    /// Sends a request through `handle` and decodes the response.
    fn call<Q: Encodable, R: Decodable>(s: &Shared, api: ApiKey, version: i16, body: &Q) -> R {
        let mut out = Vec::new();
        s.handle(frame_of(api, version, body), &mut out)
            .unwrap_or_else(|e| panic!("{api:?} v{version}: {e:#}"));
        let mut frame = Bytes::from(out).slice(4..);
        let header = ResponseHeader::decode(&mut frame, api.response_header_version(version)).unwrap();
        assert_eq!(header.correlation_id, 7);
        let response = R::decode(&mut frame, version).unwrap();
        assert!(
            frame.is_empty(),
            "{api:?} v{version}: {} bytes left over",
            frame.len()
        );
        response
    }

    fn create(s: &Shared, version: i16, name: &'static str, partitions: i32) -> CreateTopicsResponse {
        let request = CreateTopicsRequest::default().with_topics(vec![CreatableTopic::default()
            .with_name(TopicName(StrBytes::from_static_str(name)))
            .with_num_partitions(partitions)
            .with_replication_factor(1)]);
        call(s, ApiKey::CreateTopics, version, &request)
    }

    #[test]
    fn every_served_api_answers_at_every_advertised_version() {
        let s = shared();
        for v in 0..=3 {
            let r: ApiVersionsResponse = call(&s, ApiKey::ApiVersions, v, &ApiVersionsRequest::default());
            assert_eq!(r.error_code, 0);
            assert_eq!(r.api_keys.len(), ADVERTISED.len());
        }
        for v in 2..=5 {
            let name = ["t2", "t3", "t4", "t5"][v as usize - 2];
            let r = create(&s, v, name, if v == 2 { -1 } else { 4 });
            assert_eq!(r.topics[0].error_code, 0, "v{v}");
            let again = create(&s, v, name, 4);
            assert_eq!(again.topics[0].error_code, ec::TOPIC_ALREADY_EXISTS);
        }
        assert_eq!(
            create(&s, 4, "bad name!", 1).topics[0].error_code,
            ec::INVALID_TOPIC_EXCEPTION
        );
        assert_eq!(
            create(&s, 4, "big", 1 << 30).topics[0].error_code,
            ec::INVALID_PARTITIONS
        );
        assert_eq!(
            create(&s, 4, "zero", 0).topics[0].error_code,
            ec::INVALID_PARTITIONS
        );
        for v in 1..=9 {
            let all: MetadataResponse = call(
                &s,
                ApiKey::Metadata,
                v,
                &MetadataRequest::default().with_topics(None),
            );
            assert_eq!(all.topics.len(), 4, "v{v}");
            assert_eq!((all.controller_id, all.brokers[0].port), (BrokerId(3), 9999));
            assert_eq!(all.brokers[0].host.as_str(), "127.0.0.1");
            let t2 = all
                .topics
                .iter()
                .find(|t| t.name.as_ref().unwrap().as_str() == "t2")
                .unwrap();
            assert_eq!(t2.partitions.len(), 1, "-1 partitions is 1");
            let wanted = MetadataRequest::default().with_topics(Some(vec![
                MetadataRequestTopic::default().with_name(Some(TopicName(StrBytes::from_static_str("t4")))),
                MetadataRequestTopic::default().with_name(Some(TopicName(StrBytes::from_static_str("nope")))),
            ]));
            let some: MetadataResponse = call(&s, ApiKey::Metadata, v, &wanted);
            assert_eq!(some.topics[0].partitions.len(), 4);
            assert_eq!(some.topics[0].partitions[3].leader_id, BrokerId(3));
            assert_eq!(some.topics[0].partitions[3].isr_nodes, vec![BrokerId(3)]);
            assert_eq!(some.topics[1].error_code, ec::UNKNOWN_TOPIC_OR_PARTITION);
        }
        for v in 0..=3 {
            let r: FindCoordinatorResponse = call(
                &s,
                ApiKey::FindCoordinator,
                v,
                &FindCoordinatorRequest::default().with_key(StrBytes::from_static_str("g")),
            );
            assert_eq!((r.error_code, r.node_id, r.port), (0, BrokerId(3), 9999));
        }
        for v in 3..=9 {
            let request =
                ProduceRequest::default()
                    .with_acks(-1)
                    .with_topic_data(vec![TopicProduceData::default()
                        .with_name(TopicName(StrBytes::from_static_str("t4")))
                        .with_partition_data(vec![
                            PartitionProduceData::default()
                                .with_index(1)
                                .with_records(Some(Bytes::from(batch(10, 30, 0)))),
                            PartitionProduceData::default()
                                .with_index(9)
                                .with_records(Some(Bytes::from(batch(10, 30, 0)))),
                        ])]);
            let r: ProduceResponse = call(&s, ApiKey::Produce, v, &request);
            let p = &r.responses[0].partition_responses;
            assert_eq!(
                (p[0].error_code, p[0].base_offset),
                (0, i64::from(v - 3) * 20),
                "v{v}"
            );
            assert_eq!(p[1].error_code, ec::UNKNOWN_TOPIC_OR_PARTITION);
            // acks=0: appended, no response.
            let mut out = Vec::new();
            s.handle(
                frame_of(ApiKey::Produce, v, &request.clone().with_acks(0)),
                &mut out,
            )
            .unwrap();
            assert!(out.is_empty());
        }
        let hw = 2 * 7 * 10;
        for v in 1..=7 {
            let request = ListOffsetsRequest::default().with_topics(vec![ListOffsetsTopic::default()
                .with_name(TopicName(StrBytes::from_static_str("t4")))
                .with_partitions(vec![
                    ListOffsetsPartition::default()
                        .with_partition_index(1)
                        .with_timestamp(-2),
                    ListOffsetsPartition::default()
                        .with_partition_index(1)
                        .with_timestamp(-1),
                    ListOffsetsPartition::default()
                        .with_partition_index(1)
                        .with_timestamp(12345),
                    ListOffsetsPartition::default()
                        .with_partition_index(7)
                        .with_timestamp(-1),
                ])]);
            let r: ListOffsetsResponse = call(&s, ApiKey::ListOffsets, v, &request);
            let offsets: Vec<(i16, i64)> = r.topics[0]
                .partitions
                .iter()
                .map(|p| (p.error_code, p.offset))
                .collect();
            assert_eq!(
                offsets,
                vec![(0, 0), (0, hw), (0, hw), (ec::UNKNOWN_TOPIC_OR_PARTITION, -1)],
                "v{v}"
            );
        }
        for v in 4..=12 {
            let request = FetchRequest::default()
                .with_max_wait_ms(0)
                .with_max_bytes(1 << 20)
                .with_topics(vec![FetchTopic::default()
                    .with_topic(TopicName(StrBytes::from_static_str("t4")))
                    .with_partitions(vec![FetchPartition::default()
                        .with_partition(1)
                        .with_fetch_offset(15)
                        .with_partition_max_bytes(1 << 20)])]);
            let r: FetchResponse = call(&s, ApiKey::Fetch, v, &request);
            let p = &r.responses[0].partitions[0];
            assert_eq!((p.error_code, p.high_watermark), (0, hw), "v{v}");
            let records = p.records.as_ref().unwrap();
            assert_eq!(records.len(), 13 * 91, "batches from offset 10 on");
            assert_eq!(&records[..8], &10i64.to_be_bytes());
        }
    }

    #[test]
    fn versions_not_served_are_refused() {
        let s = shared();
        // ApiVersions v4: v0 response with UNSUPPORTED_VERSION and the ApiVersions range.
        let mut out = Vec::new();
        s.handle(
            frame_of(ApiKey::ApiVersions, 4, &ApiVersionsRequest::default()),
            &mut out,
        )
        .unwrap();
        let mut frame = Bytes::from(out).slice(4..);
        ResponseHeader::decode(&mut frame, 0).unwrap();
        let r = ApiVersionsResponse::decode(&mut frame, 0).unwrap();
        assert_eq!(r.error_code, ec::UNSUPPORTED_VERSION);
        assert_eq!(
            (
                r.api_keys[0].api_key,
                r.api_keys[0].min_version,
                r.api_keys[0].max_version
            ),
            (18, 0, 3)
        );
        // Other versions not served, APIs not served, unknown keys, short frames: errors.
        let mut out = Vec::new();
        assert!(s
            .handle(
                frame_of(ApiKey::Metadata, 10, &MetadataRequest::default()),
                &mut out
            )
            .is_err());
        assert!(s
            .handle(
                frame_of(
                    ApiKey::Heartbeat,
                    0,
                    &kafka_protocol::messages::HeartbeatRequest::default()
                ),
                &mut out
            )
            .is_err());
        assert!(s
            .handle(Bytes::from_static(&[0x7f, 0x7f, 0, 0, 0, 0, 0, 1]), &mut out)
            .is_err());
        assert!(s.handle(Bytes::from_static(&[0, 3, 0]), &mut out).is_err());
        // A body that does not decode.
        let mut truncated = frame_of(ApiKey::Metadata, 4, &MetadataRequest::default()).to_vec();
        truncated.truncate(truncated.len() - 2);
        assert!(s.handle(Bytes::from(truncated), &mut out).is_err());
        assert!(out.is_empty());
    }

    #[test]
    fn an_empty_fetch_waits_for_a_produce() {
        let s = Arc::new(shared());
        lock(&s.log).create_topic("t", 1).unwrap();
        let fetcher = {
            let s = Arc::clone(&s);
            std::thread::spawn(move || {
                let request = FetchRequest::default()
                    .with_max_wait_ms(60_000)
                    .with_max_bytes(1 << 20)
                    .with_topics(fetch_topics(&[(0, 0, 1 << 20)]));
                s.fetch(&request).record_bytes
            })
        };
        produce_to_t(&s, batch(1, 10, 0));
        assert_eq!(fetcher.join().unwrap(), 71);
        // With nothing to come, the wait is bounded.
        let request = FetchRequest::default()
            .with_max_wait_ms(i32::MAX)
            .with_max_bytes(1 << 20)
            .with_topics(fetch_topics(&[(0, 1, 1 << 20)]));
        let started = Instant::now();
        assert_eq!(s.fetch(&request).record_bytes, 0);
        assert!(started.elapsed() < MAX_FETCH_WAIT * 4);
    }

    #[test]
    fn a_fetch_answers_at_most_the_broker_s_fetch_max_bytes() {
        let s = shared_with(NullBrokerConfig {
            fetch_max_bytes: 150,
            ..NullBrokerConfig::default()
        });
        lock(&s.log).create_topic("t", 1).unwrap();
        for _ in 0..10 {
            produce_to_t(&s, batch(1, 10, 0));
        }
        // A 71-byte batch each: the request allows 1 MiB, the broker two batches.
        let request = FetchRequest::default()
            .with_max_bytes(1 << 20)
            .with_topics(fetch_topics(&[(0, 0, 1 << 20)]));
        assert_eq!(s.fetch(&request).record_bytes, 142);
        // Below one batch, the first still goes whole (KIP-74).
        let s = shared_with(NullBrokerConfig {
            fetch_max_bytes: 1,
            ..NullBrokerConfig::default()
        });
        lock(&s.log).create_topic("t", 1).unwrap();
        produce_to_t(&s, [batch(1, 10, 0), batch(1, 10, 0)].concat());
        assert_eq!(s.fetch(&request).record_bytes, 71);
    }

    #[test]
    fn partitions_are_bounded_per_topic_and_in_all() {
        let mut log = Log::new(0, 0);
        for i in 0..10 {
            log.create_topic(&format!("t{i}"), MAX_PARTITIONS_PER_TOPIC)
                .unwrap();
        }
        assert_eq!(
            log.create_topic("one-more", 1).unwrap_err().0,
            ec::INVALID_PARTITIONS
        );
        assert_eq!(log.create_topic("t0", 1).unwrap_err().0, ec::TOPIC_ALREADY_EXISTS);
        let mut log = Log::new(0, 0);
        for bad in [0, -1, MAX_PARTITIONS_PER_TOPIC + 1] {
            assert_eq!(log.create_topic("x", bad).unwrap_err().0, ec::INVALID_PARTITIONS);
        }
        assert_eq!(log.partitions, 0);
    }

    #[test]
    fn topic_names_follow_kafka_rules() {
        assert!(valid_topic_name("strand-bench-1_x.y"));
        for bad in ["", ".", "..", "a b", "é", &"x".repeat(250)] {
            assert!(!valid_topic_name(bad), "{bad:?}");
        }
    }
}
