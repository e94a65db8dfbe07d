//! Admin and data-plane calls over [`raw::RawConn`], with the versions the suite uses.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{Compression, RecordBatchDecoder};

use crate::raw::{self, RawConn};
use crate::{unique_topic, wait_for};

pub mod versions;

/// `ListOffsets` special timestamps.
pub const LATEST: i64 = -1;
/// Earliest offset (log start).
pub const EARLIEST: i64 = -2;
/// Offset of the record with the largest timestamp.
pub const MAX_TIMESTAMP: i64 = -3;

pub mod errors;

/// `NONE`, or the name and code of a Kafka error code (`UnknownMemberId (25)`), for messages.
pub fn err_name(code: i16) -> String {
    if code == 0 {
        "NONE".to_string()
    } else {
        match kafka_protocol::ResponseError::try_from_code(code) {
            Some(e) => format!("{e:?} ({code})"),
            None => format!("unknown error {code}"),
        }
    }
}

/// Fails with `what` and the error's name unless `code` is NONE.
pub fn assert_ok(code: i16, what: &str) {
    assert_eq!(code, 0, "{what}: {}", err_name(code));
}

/// Fails with `what` and both errors' names unless `code` is `want`.
pub fn assert_code(code: i16, want: kafka_protocol::ResponseError, what: &str) {
    assert_eq!(
        code,
        want.code(),
        "{what}: {}, not {}",
        err_name(code),
        err_name(want.code())
    );
}

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

/// A topic name for requests.
pub fn topic_name(name: &str) -> TopicName {
    TopicName(s(name))
}

/// Connects, failing the test on error.
pub fn connect(bootstrap: &str) -> RawConn {
    RawConn::connect(bootstrap).unwrap_or_else(|e| panic!("connect to {bootstrap}: {e}"))
}

/// A CreateTopics request for one topic.
pub fn create_topics_request(
    name: &str,
    partitions: i32,
    configs: &[(&str, &str)],
    validate_only: bool,
) -> CreateTopicsRequest {
    let topic = CreatableTopic::default()
        .with_name(topic_name(name))
        .with_num_partitions(partitions)
        .with_replication_factor(-1)
        .with_configs(
            configs
                .iter()
                .map(|(k, v)| {
                    CreatableTopicConfig::default()
                        .with_name(s(k))
                        .with_value(Some(s(v)))
                })
                .collect(),
        );
    CreateTopicsRequest::default()
        .with_topics(vec![topic])
        .with_timeout_ms(30_000)
        .with_validate_only(validate_only)
}

/// A CreatePartitions request growing one topic to `count` partitions.
pub fn create_partitions_request(name: &str, count: i32, validate_only: bool) -> CreatePartitionsRequest {
    CreatePartitionsRequest::default()
        .with_topics(vec![create_partitions_request::CreatePartitionsTopic::default()
            .with_name(topic_name(name))
            .with_count(count)
            .with_assignments(None)])
        .with_timeout_ms(30_000)
        .with_validate_only(validate_only)
}

/// An OffsetCommit record of Kafka's own schema (key v1, value v3: no leader epoch, no expiry)
/// setting `group`'s committed offset of `topic`/`partition`: what the group coordinator
/// replays from `__consumer_offsets` at start-up. Returns (key, value).
pub fn offset_commit_record(
    group: &str,
    topic: &str,
    partition: i32,
    offset: i64,
    metadata: &str,
) -> (Vec<u8>, Vec<u8>) {
    use bytes::BufMut;
    let mut key = bytes::BytesMut::new();
    key.put_i16(1);
    key.put_i16(group.len() as i16);
    key.put_slice(group.as_bytes());
    key.put_i16(topic.len() as i16);
    key.put_slice(topic.as_bytes());
    key.put_i32(partition);
    let mut value = bytes::BytesMut::new();
    value.put_i16(3);
    value.put_i64(offset);
    value.put_i32(-1);
    value.put_i16(metadata.len() as i16);
    value.put_slice(metadata.as_bytes());
    value.put_i64(now_ms());
    (key.to_vec(), value.to_vec())
}

/// Creates a topic (error code must be NONE) and waits until Metadata shows all its
/// partitions with a leader. Returns the topic id from the CreateTopics answer.
pub fn create_topic(bootstrap: &str, name: &str, partitions: i32, configs: &[(&str, &str)]) -> uuid::Uuid {
    let mut c = connect(bootstrap);
    let resp = c
        .request(
            versions::CREATE_TOPICS,
            &create_topics_request(name, partitions, configs, false),
        )
        .unwrap_or_else(|e| panic!("CreateTopics {name}: {e}"));
    let t = resp
        .topics
        .first()
        .unwrap_or_else(|| panic!("CreateTopics {name}: no topic in the answer"));
    assert_eq!(
        t.error_code, 0,
        "CreateTopics {name} failed with error {} ({:?})",
        t.error_code, t.error_message
    );
    wait_for(
        Duration::from_secs(15),
        &format!("topic {name} to appear in Metadata"),
        || {
            let md = metadata(&mut c, &[name], false);
            let mt = md.topics.first()?;
            (mt.error_code == 0
                && mt.partitions.len() == partitions as usize
                && mt
                    .partitions
                    .iter()
                    .all(|p| p.error_code == 0 && p.leader_id.0 >= 0))
            .then_some(())
        },
    );
    t.topic_id
}

/// A new topic of `partitions` partitions with the broker's default configuration, named
/// [`unique_topic`]`(prefix)`, created as [`create_topic`] does; returns its name.
pub fn new_topic(bootstrap: &str, prefix: &str, partitions: i32) -> String {
    let topic = unique_topic(prefix);
    create_topic(bootstrap, &topic, partitions, &[]);
    topic
}

/// ApiVersions (v3), asserting no error.
pub fn api_versions(c: &mut RawConn) -> ApiVersionsResponse {
    let resp = c
        .request(
            versions::API_VERSIONS,
            &ApiVersionsRequest::default()
                .with_client_software_name(s("strand-compat"))
                .with_client_software_version(s("0")),
        )
        .unwrap_or_else(|e| panic!("ApiVersions: {e}"));
    assert_eq!(resp.error_code, 0, "ApiVersions error {}", resp.error_code);
    resp
}

/// The `(min, max)` versions the broker advertises for `api_key`, or `None`.
pub fn advertised_versions(c: &mut RawConn, api_key: i16) -> Option<(i16, i16)> {
    api_versions(c)
        .api_keys
        .iter()
        .find(|k| k.api_key == api_key)
        .map(|k| (k.min_version, k.max_version))
}

/// InitProducerId for an idempotent producer (no transactional id) at
/// [`versions::INIT_PRODUCER_ID`], with the current `producer_id`/`producer_epoch` (-1/-1
/// for a new producer; KIP-360 epoch bump otherwise).
pub fn init_producer_id(c: &mut RawConn, producer_id: i64, producer_epoch: i16) -> InitProducerIdResponse {
    let req = InitProducerIdRequest::default()
        .with_transactional_id(None)
        .with_transaction_timeout_ms(60_000)
        .with_producer_id(ProducerId(producer_id))
        .with_producer_epoch(producer_epoch);
    c.request(versions::INIT_PRODUCER_ID, &req)
        .unwrap_or_else(|e| panic!("InitProducerId: {e}"))
}

/// Metadata for `topics` (all topics if empty).
pub fn metadata(c: &mut RawConn, topics: &[&str], allow_auto_create: bool) -> MetadataResponse {
    let req = MetadataRequest::default()
        .with_topics(if topics.is_empty() {
            None
        } else {
            Some(
                topics
                    .iter()
                    .map(|t| MetadataRequestTopic::default().with_name(Some(topic_name(t))))
                    .collect(),
            )
        })
        .with_allow_auto_topic_creation(allow_auto_create);
    c.request(versions::METADATA, &req)
        .unwrap_or_else(|e| panic!("Metadata: {e}"))
}

/// A Produce request carrying one batch per (partition, batch).
pub fn produce_request(topic: &str, acks: i16, batches: Vec<(i32, Bytes)>) -> ProduceRequest {
    ProduceRequest::default()
        .with_acks(acks)
        .with_timeout_ms(30_000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(topic_name(topic))
            .with_partition_data(
                batches
                    .into_iter()
                    .map(|(p, b)| {
                        PartitionProduceData::default()
                            .with_index(p)
                            .with_records(Some(b))
                    })
                    .collect(),
            )])
}

/// Produces one batch with acks=-1; returns (error code, base offset) of that partition.
pub fn produce(c: &mut RawConn, topic: &str, partition: i32, batch: Bytes) -> (i16, i64) {
    let resp = c
        .request(
            versions::PRODUCE,
            &produce_request(topic, -1, vec![(partition, batch)]),
        )
        .unwrap_or_else(|e| panic!("Produce to {topic}/{partition}: {e}"));
    let p = produce_answer(&resp, partition);
    (p.error_code, p.base_offset)
}

/// The answer for `partition` in a Produce response; panics if it has none.
pub fn produce_answer(resp: &ProduceResponse, partition: i32) -> &produce_response::PartitionProduceResponse {
    resp.responses
        .iter()
        .flat_map(|t| t.partition_responses.iter())
        .find(|p| p.index == partition)
        .unwrap_or_else(|| panic!("Produce answer lacks partition {partition}: {resp:?}"))
}

/// Produces plain records `values` (key = None) in one uncompressed batch; asserts success and
/// returns the base offset.
pub fn produce_values(c: &mut RawConn, topic: &str, partition: i32, values: &[&[u8]]) -> i64 {
    let records: Vec<_> = values
        .iter()
        .map(|v| raw::record(None, Some(v), now_ms()))
        .collect();
    let (err, base) = produce(
        c,
        topic,
        partition,
        raw::encode_batch(&records, Compression::None),
    );
    assert_eq!(err, 0, "Produce to {topic}/{partition} failed with error {err}");
    base
}

/// Current time in ms since the epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// The answer for one partition of a Fetch.
#[derive(Debug)]
pub struct FetchResult {
    /// Partition error code.
    pub error_code: i16,
    /// High watermark.
    pub high_watermark: i64,
    /// Log start offset.
    pub log_start_offset: i64,
    /// Decoded records (offset, key, value, timestamp) with offset >= the fetch offset.
    pub records: Vec<(i64, Option<Bytes>, Option<Bytes>, i64)>,
}

/// The request [`fetch`] sends: sessionless, one partition from `offset`, `max_bytes` for the
/// partition and the whole answer, `min_bytes=1`, `max_wait_ms=500`.
pub fn fetch_request(topic: &str, partition: i32, offset: i64, max_bytes: i32) -> FetchRequest {
    FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(500)
        .with_min_bytes(1)
        .with_max_bytes(max_bytes)
        .with_isolation_level(0)
        .with_session_id(0)
        .with_session_epoch(-1)
        .with_topics(vec![FetchTopic::default()
            .with_topic(topic_name(topic))
            .with_partitions(vec![FetchPartition::default()
                .with_partition(partition)
                .with_current_leader_epoch(-1)
                .with_fetch_offset(offset)
                .with_last_fetched_epoch(-1)
                .with_log_start_offset(-1)
                .with_partition_max_bytes(max_bytes)])])
}

/// Fetches one partition from `offset`, decoding the records. A sessionless fetch with
/// `min_bytes=1` and `max_wait_ms=500`: it answers at once when there is data or an error,
/// and after 500 ms with no records at the log end.
pub fn fetch(c: &mut RawConn, topic: &str, partition: i32, offset: i64, max_bytes: i32) -> FetchResult {
    let req = fetch_request(topic, partition, offset, max_bytes);
    let resp = c
        .request(versions::FETCH, &req)
        .unwrap_or_else(|e| panic!("Fetch {topic}/{partition}: {e}"));
    assert_eq!(resp.error_code, 0, "Fetch top-level error {}", resp.error_code);
    let p = resp
        .responses
        .iter()
        .flat_map(|t| t.partitions.iter())
        .find(|p| p.partition_index == partition)
        .unwrap_or_else(|| panic!("Fetch answer lacks partition {partition}"));
    let mut records = Vec::new();
    if let Some(mut bytes) = p.records.clone() {
        // A partial batch at the end (cut by max_bytes) is allowed by the protocol; a
        // complete batch that does not check out is the broker's fault.
        let (_, complete) = raw::walk_batches(&bytes);
        let rest = &bytes[complete as usize..];
        if rest.len() >= 12 {
            let len = i32::from_be_bytes([rest[8], rest[9], rest[10], rest[11]]);
            assert!(
                len < 0 || 12 + len as usize > rest.len(),
                "{topic}/{partition}: the fetch answer holds a complete but invalid batch (bad CRC, magic \
                 or length) at byte {complete}"
            );
        }
        bytes.truncate(complete as usize);
        if !bytes.is_empty() {
            let sets = RecordBatchDecoder::decode_all(&mut bytes)
                .unwrap_or_else(|e| panic!("decode fetched batches of {topic}/{partition}: {e}"));
            for set in sets {
                for r in set.records {
                    if r.offset >= offset {
                        records.push((r.offset, r.key, r.value, r.timestamp));
                    }
                }
            }
        }
    }
    FetchResult {
        error_code: p.error_code,
        high_watermark: p.high_watermark,
        log_start_offset: p.log_start_offset,
        records,
    }
}

/// Fetches `from..to` of one partition with as many Fetch requests as needed (a broker may
/// answer from one segment at a time, as Kafka does); panics on an error or when a fetch
/// makes no progress. Returns (offset, key, value, timestamp) in offset order.
pub fn fetch_range(
    c: &mut RawConn,
    topic: &str,
    partition: i32,
    from: i64,
    to: i64,
) -> Vec<(i64, Option<Bytes>, Option<Bytes>, i64)> {
    let mut out = Vec::new();
    let mut next = from;
    while next < to {
        let f = fetch(c, topic, partition, next, 1 << 20);
        assert_eq!(
            f.error_code, 0,
            "Fetch {topic}/{partition} at {next}: error {}",
            f.error_code
        );
        let before = out.len();
        out.extend(f.records.into_iter().filter(|r| r.0 < to));
        assert!(
            out.len() > before,
            "Fetch {topic}/{partition} at {next} returned nothing (end {to})"
        );
        next = out.last().map(|r| r.0 + 1).unwrap_or(next);
    }
    out
}

/// ListOffsets for one partition and timestamp; returns (error code, offset, timestamp).
pub fn list_offset(c: &mut RawConn, topic: &str, partition: i32, timestamp: i64) -> (i16, i64, i64) {
    let req = ListOffsetsRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_isolation_level(0)
        .with_topics(vec![ListOffsetsTopic::default()
            .with_name(topic_name(topic))
            .with_partitions(vec![ListOffsetsPartition::default()
                .with_partition_index(partition)
                .with_current_leader_epoch(-1)
                .with_timestamp(timestamp)])]);
    let resp = c
        .request(versions::LIST_OFFSETS, &req)
        .unwrap_or_else(|e| panic!("ListOffsets {topic}/{partition}@{timestamp}: {e}"));
    let p = resp
        .topics
        .iter()
        .flat_map(|t| t.partitions.iter())
        .find(|p| p.partition_index == partition)
        .unwrap_or_else(|| panic!("ListOffsets answer lacks partition {partition}"));
    (p.error_code, p.offset, p.timestamp)
}

/// Earliest offset (log start), asserting no error.
pub fn earliest(c: &mut RawConn, topic: &str, partition: i32) -> i64 {
    let (e, o, _) = list_offset(c, topic, partition, EARLIEST);
    assert_eq!(e, 0, "ListOffsets(earliest) {topic}/{partition}: error {e}");
    o
}

/// Latest offset (log end / high watermark), asserting no error.
pub fn latest(c: &mut RawConn, topic: &str, partition: i32) -> i64 {
    let (e, o, _) = list_offset(c, topic, partition, LATEST);
    assert_eq!(e, 0, "ListOffsets(latest) {topic}/{partition}: error {e}");
    o
}

/// Checks the broker still serves a fresh client: Metadata, CreateTopics (or auto-create),
/// Produce and Fetch of a unique value on a new connection. Panics otherwise.
pub fn assert_broker_serves(bootstrap: &str) {
    let mut c = RawConn::connect(bootstrap)
        .unwrap_or_else(|e| panic!("the broker no longer accepts connections at {bootstrap}: {e}"));
    let topic = unique_topic("alive");
    let mut create = c
        .request(
            versions::CREATE_TOPICS,
            &create_topics_request(&topic, 1, &[], false),
        )
        .unwrap_or_else(|e| panic!("the broker no longer serves CreateTopics: {e}"));
    let created = create.topics.pop().expect("a topic in the CreateTopics answer");
    assert_eq!(
        created.error_code, 0,
        "CreateTopics of a probe topic failed: {created:?}"
    );
    wait_for(Duration::from_secs(15), "the probe topic in Metadata", || {
        let md = metadata(&mut c, &[&topic], false);
        md.topics
            .first()
            .filter(|t| t.error_code == 0 && !t.partitions.is_empty())
            .map(|_| ())
    });
    let value = format!("still-alive-{}", rand::random::<u64>());
    let base = produce_values(&mut c, &topic, 0, &[value.as_bytes()]);
    assert_eq!(base, 0, "first record of a new topic got offset {base}");
    let f = fetch(&mut c, &topic, 0, 0, 1 << 20);
    assert_eq!(
        f.error_code, 0,
        "Fetch of the probe record: error {}",
        f.error_code
    );
    let got: Vec<_> = f.records.iter().map(|r| (r.0, r.2.clone())).collect();
    assert_eq!(
        got,
        vec![(0, Some(Bytes::from(value)))],
        "probe record read back wrong"
    );
}

/// Topic metadata for one topic (asserting it exists): (topic id, partition count).
pub fn topic_info(c: &mut RawConn, topic: &str) -> (uuid::Uuid, usize) {
    let md = metadata(c, &[topic], false);
    let t = md
        .topics
        .first()
        .unwrap_or_else(|| panic!("Metadata answer lacks {topic}"));
    assert_eq!(t.error_code, 0, "Metadata {topic}: error {}", t.error_code);
    (t.topic_id, t.partitions.len())
}

/// Maps a config list to name -> (value, source).
pub fn config_map(
    configs: &[describe_configs_response::DescribeConfigsResourceResult],
) -> BTreeMap<String, (Option<String>, i8)> {
    configs
        .iter()
        .map(|c| {
            (
                c.name.to_string(),
                (c.value.as_ref().map(|v| v.to_string()), c.config_source),
            )
        })
        .collect()
}
