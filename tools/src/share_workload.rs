//! The Kafka share-group (KIP-932) workload of `strand-queue-bench`: the same backlog as the HTTP
//! drain, drained through Strand's Kafka door by share consumers.
//!
//! 1. **create**: a fresh queue (`PUT /v1/queues/{queue}`; a queue is a topic) and the group
//!    config `share.auto.offset.reset=earliest` (IncrementalAlterConfigs on resource type GROUP),
//!    so that the group, created after the backlog, sees all of it;
//! 2. **publish**: the backlog over HTTP, exactly as the HTTP publish phase does (same batches, so
//!    the log holds the same stored batches); every answer names the (partition, offset);
//! 3. **drain**: `consumers` threads, each a native Kafka client on its own connection (raw
//!    requests with the `kafka-protocol` crate): ShareGroupHeartbeat (join with member epoch 0,
//!    then at the interval the broker gives, taking the assignment), ShareFetch of up to
//!    `max_records` carrying the ACCEPT of the previous fetch's records, ShareAcknowledge for the
//!    last ones (once every record has been acquired, or for partitions no longer assigned), then
//!    ShareAcknowledge with session epoch -1 and a leave heartbeat (member epoch -1).
//!
//! A record counts as accepted only when the answer to the request that carried its ACCEPT shows
//! error code 0 for its partition; every published (partition, offset) must be accepted exactly
//! once. Any other answer from the broker stops the run with a message naming it.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context, Result};
use bytes::{Buf, Bytes};
use hdrhistogram::Histogram;
use indicatif::ProgressBar;
use kafka_protocol::messages::incremental_alter_configs_request::{AlterConfigsResource, AlterableConfig};
use kafka_protocol::messages::{
    share_acknowledge_request, share_fetch_request, GroupId, IncrementalAlterConfigsRequest,
    ShareAcknowledgeRequest, ShareAcknowledgeResponse, ShareFetchRequest, ShareFetchResponse,
    ShareGroupDescribeRequest, ShareGroupHeartbeatRequest, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::RecordBatchDecoder;
use kafka_protocol::ResponseError;
use serde::Serialize;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::host::{cpu_seconds, CpuMark};
use crate::kafka_wire::{ConnOptions, RawConn};
use crate::latency::{self, LatencySummary};
use crate::queue_client::QueueClient;
use crate::queue_workload::{
    announce, div_or_zero, exactly_once, payload_pool, per_s, progress_bar, publish_phase, Backlog,
    PhaseClock, PhaseCpu, PublishResult,
};

/// Request versions (KIP-932 v1, as Kafka 4.1 and librdkafka 2.16 send them).
const HEARTBEAT_VERSION: i16 = 1;
const FETCH_VERSION: i16 = 1;
const ACKNOWLEDGE_VERSION: i16 = 1;
const DESCRIBE_VERSION: i16 = 1;
const ALTER_CONFIGS_VERSION: i16 = 1;
/// Config resource type GROUP (KIP-848 group configs).
const RESOURCE_GROUP: i8 = 32;
/// KIP-932 AcknowledgeType ACCEPT.
const ACCEPT: i8 = 1;
/// Member epoch of a leave heartbeat; session epoch of a closing request.
const FINAL_EPOCH: i32 = -1;
/// Largest answer frame accepted.
const MAX_FRAME_BYTES: usize = 64 << 20;
/// Default `max_bytes` of a ShareFetch: Kafka's `fetch.max.bytes` default, which the Java
/// ShareConsumer sends.
pub const DEFAULT_FETCH_MAX_BYTES: i32 = 52_428_800;
/// Size of a record batch header up to and including `lastOffsetDelta`.
const BATCH_HEADER_PREFIX: usize = 27;
/// `partition_max_bytes` of a ShareFetch partition.
const PARTITION_MAX_BYTES: i32 = 1 << 20;
/// Most records one ShareFetch answer may acquire before the answer is treated as broken.
const MAX_ACQUIRED_PER_ANSWER: u64 = 100_000;
/// Bounds of the heartbeat interval the broker may ask for.
const MIN_HEARTBEAT_INTERVAL: Duration = Duration::from_millis(100);
const MAX_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(60);
/// How a consumer that stopped because another one failed says so.
const STOPPED: &str = "stopped";
/// Client id of every connection.
const CLIENT_ID: &str = "strand-queue-bench";

/// The share workload, as recorded in the report.
#[derive(Debug, Clone, Serialize)]
pub struct ShareParams {
    /// The queue (topic) created for this phase and what is published to it, over HTTP.
    #[serde(flatten)]
    pub backlog: Backlog,
    /// The share group.
    pub group: String,
    /// Share consumers (threads, one connection each).
    pub consumers: usize,
    /// `max_records` (and `batch_size`) of each ShareFetch.
    pub max_records: u32,
    /// `max_wait_ms` of each ShareFetch.
    pub max_wait_ms: u32,
    /// `max_bytes` of each ShareFetch.
    pub fetch_max_bytes: i32,
}

impl ShareParams {
    pub fn validate(&self) -> Result<()> {
        self.backlog.validate()?;
        if self.consumers == 0 {
            bail!("--workers must be at least 1");
        }
        if !(1..=10_000).contains(&self.max_records) {
            bail!("--lease-batch (ShareFetch max_records) must be 1..=10000");
        }
        if self.max_wait_ms > 20_000 {
            bail!("--lease-wait-ms (ShareFetch max_wait_ms) must be 0..=20000");
        }
        if self.fetch_max_bytes < 1 {
            bail!("--share-fetch-max-bytes must be positive");
        }
        Ok(())
    }
}

/// A drain of the share door, whoever the consumers were; `C` is what only those consumers
/// measure.
#[derive(Debug, Clone, Serialize)]
pub struct ShareDrain<C> {
    pub consumers: usize,
    /// From the drain start (native consumers: all joined with their final assignment;
    /// confluent-kafka: the first record acquired) to the last answer confirming an acceptance.
    pub secs: f64,
    /// Records acquired and accepted per second.
    pub msgs_per_s: f64,
    /// Payload MB acquired and accepted per second.
    pub mb_per_s: f64,
    pub records_accepted: u64,
    /// Records acquired (a record acquired twice counts twice).
    pub records_acquired: u64,
    /// Records delivered with a delivery count above 1 (a lock expired or a record came back:
    /// should be 0).
    pub redeliveries: u64,
    #[serde(flatten)]
    pub clients: C,
    /// Every published record accepted exactly once, nothing else.
    pub verified: bool,
    /// The group's stats on the queue after the drain (`GET /v1/queues/{queue}`).
    pub group_after: Option<Value>,
    /// With confluent-kafka, `client_*` is the consumer processes' CPU, not this process's.
    pub cpu: PhaseCpu,
}

impl<C> ShareDrain<C> {
    /// A drain that accepted `accepted` records in `secs`, not checked yet.
    fn new(
        params: &ShareParams,
        (accepted, acquired, redeliveries): (u64, u64, u64),
        secs: f64,
        clients: C,
        cpu: PhaseCpu,
    ) -> Self {
        ShareDrain {
            consumers: params.consumers,
            secs,
            msgs_per_s: per_s(accepted, secs),
            mb_per_s: per_s(accepted * params.backlog.message_bytes as u64, secs) / 1e6,
            records_accepted: accepted,
            records_acquired: acquired,
            redeliveries,
            clients,
            verified: false,
            group_after: None,
            cpu,
        }
    }
}

/// The drain through native share consumers.
pub type ShareDrainResult = ShareDrain<NativeFigures>;

/// What the native share consumers measured.
#[derive(Debug, Clone, Serialize)]
pub struct NativeFigures {
    /// From the first join heartbeat to the start of the drain: every member joined and
    /// heartbeated once more to take the group's final assignment.
    pub join_secs: f64,
    pub fetch_requests: u64,
    /// ShareFetch answers that acquired nothing (long polls that timed out); not in
    /// `fetch_latency`.
    pub empty_fetches: u64,
    pub acknowledge_requests: u64,
    /// Heartbeats during the drain (joins and leaves not counted).
    pub heartbeats: u64,
    /// Records per non-empty ShareFetch.
    pub mean_fetch_batch: f64,
    /// Non-empty ShareFetch, send to answer (acknowledgements of the previous fetch included).
    pub fetch_latency: LatencySummary,
    /// ShareAcknowledge (the last acknowledgements of a consumer), send to answer.
    pub acknowledge_latency: LatencySummary,
    /// From a ShareFetch answer to the answer confirming the acceptance of its records (the next
    /// ShareFetch, or a ShareAcknowledge), per fetch batch.
    pub fetch_to_ack: LatencySummary,
    /// Mean fetch-to-ack time divided by the mean fetch batch.
    pub fetch_to_ack_us_per_message: f64,
    /// Share of the consumers' wall time spent waiting for ShareFetch answers (empty ones too).
    pub consumer_time_in_fetch: f64,
    /// Share of the consumers' wall time spent waiting for ShareAcknowledge answers.
    pub consumer_time_in_ack: f64,
    /// ShareFetch answer bytes per acquired record (whole stored batches: a batch shared by two
    /// consumers is sent to both).
    pub fetch_answer_bytes_per_message: f64,
    /// `acquisition_lock_timeout_ms` of the ShareFetch answers.
    pub acquisition_lock_timeout_ms: Option<i32>,
    /// Per consumer: partitions assigned when the drain started, and records it accepted.
    pub per_consumer: Vec<ConsumerFigures>,
}

/// One consumer's share of the drain.
#[derive(Debug, Clone, Serialize)]
pub struct ConsumerFigures {
    pub member_id: String,
    pub assigned_partitions: Vec<i32>,
    pub records_accepted: u64,
}

/// Everything the share workload measured; `C` is what its consumers measured, native share
/// consumers unless named ([`ConfluentResult`]).
#[derive(Debug, Clone, Serialize)]
pub struct ShareResult<C = NativeFigures> {
    pub queue: String,
    pub topic_id: String,
    pub group: String,
    pub create_secs: f64,
    pub publish: PublishResult,
    pub drain: ShareDrain<C>,
    /// Failed checks: the figures of a run with problems are not valid.
    pub problems: Vec<String>,
}

/// The share workload with confluent-kafka consumers.
pub type ConfluentResult = ShareResult<ConfluentFigures>;

/// What the share workload's checks say about the consumers of a drain.
trait Consumers {
    /// How problems name the drain.
    const NAME: &'static str;
    /// What the problem about redeliveries says after their count.
    const REDELIVERED: &'static str;

    /// Errors the clients reported (each one a problem).
    fn client_errors(&self) -> &[String] {
        &[]
    }
}

impl Consumers for NativeFigures {
    const NAME: &'static str = "share drain";
    const REDELIVERED: &'static str =
        "records delivered more than once (a lock expired or a record came back)";
}

impl Consumers for ConfluentFigures {
    const NAME: &'static str = "share drain (confluent-kafka)";
    const REDELIVERED: &'static str = "records delivered more than once";

    fn client_errors(&self) -> &[String] {
        &self.client_errors
    }
}

/// Called between phases (memory checkpoints).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShareCheckpoint {
    Published,
    Drained,
}

/// The broker a share workload runs against, and whether it shows progress bars.
#[derive(Debug, Clone, Copy)]
pub struct ShareBroker<'a> {
    /// The queue API (`host:port`).
    pub http: &'a str,
    /// The Kafka listener (`host:port`).
    pub bootstrap: &'a str,
    /// The broker's pid, for its CPU.
    pub pid: Option<u32>,
    pub show_progress: bool,
}

/// Runs the share workload with native share consumers.
pub fn run(
    broker: ShareBroker<'_>,
    params: &ShareParams,
    checkpoint: &mut dyn FnMut(ShareCheckpoint),
) -> Result<ShareResult> {
    params.validate()?;
    run_door(broker, params, checkpoint, |topic_id| {
        announce(&format!(
            "share drain phase: {} native share consumers in group {} (ShareFetch max_records {}, \
             acknowledgements on the next fetch)",
            params.consumers, params.group, params.max_records
        ));
        drain_phase(broker, params, topic_id)
    })
}

/// Creates and fills the queue, drains it with `drain` (given the queue's topic id) and checks
/// what the drain accepted, and the queue and the group afterwards.
fn run_door<C: Consumers>(
    broker: ShareBroker<'_>,
    params: &ShareParams,
    checkpoint: &mut dyn FnMut(ShareCheckpoint),
    drain: impl FnOnce(Uuid) -> Result<(ShareDrain<C>, Vec<(i32, i64)>)>,
) -> Result<ShareResult<C>> {
    let mut problems = Vec::new();
    let prepared = prepare(broker, params)?;
    checkpoint(ShareCheckpoint::Published);
    let (mut drain, accepted) = drain(prepared.topic_id)?;
    drain.verified = match verify(&prepared.published, &accepted) {
        Ok(()) => true,
        Err(e) => {
            problems.push(format!("{}: {e}", C::NAME));
            false
        }
    };
    if drain.redeliveries > 0 {
        problems.push(format!("{}: {} {}", C::NAME, drain.redeliveries, C::REDELIVERED));
    }
    for e in drain.clients.client_errors() {
        problems.push(format!("{}: client error: {e}", C::NAME));
    }
    drain.group_after = check_after(broker, params, &mut problems);
    checkpoint(ShareCheckpoint::Drained);
    Ok(ShareResult {
        queue: params.backlog.queue.clone(),
        topic_id: prepared.topic_id.to_string(),
        group: params.group.clone(),
        create_secs: prepared.create_secs,
        publish: prepared.publish,
        drain,
        problems,
    })
}

/// A queue with its backlog, ready for a share group.
struct Prepared {
    topic_id: Uuid,
    create_secs: f64,
    publish: PublishResult,
    published: Vec<(i32, i64)>,
}

/// Creates the queue, sets `share.auto.offset.reset=earliest` on the group and publishes the
/// backlog.
fn prepare(broker: ShareBroker<'_>, params: &ShareParams) -> Result<Prepared> {
    let ShareBroker {
        http,
        bootstrap,
        pid: broker_pid,
        show_progress,
    } = broker;
    let started = Instant::now();
    let created = params.backlog.create_queue(http)?;
    let topic_id_text = created.get("topic_id").and_then(Value::as_str).ok_or_else(|| {
        anyhow!(
            "PUT /v1/queues/{} answered no topic_id: {created}",
            params.backlog.queue
        )
    })?;
    let topic_id = Uuid::parse_str(topic_id_text).map_err(|e| {
        anyhow!(
            "PUT /v1/queues/{} answered topic_id {topic_id_text:?}: {e}",
            params.backlog.queue
        )
    })?;
    set_group_config(bootstrap, &params.group, "share.auto.offset.reset", "earliest")?;
    let create_secs = started.elapsed().as_secs_f64();

    announce(&format!(
        "share publish phase: {} messages of {} B to queue {}",
        params.backlog.messages, params.backlog.message_bytes, params.backlog.queue
    ));
    let bar = progress_bar(show_progress, "share publish", params.backlog.messages);
    let (publish, published) = publish_phase(
        http,
        broker_pid,
        &params.backlog,
        &Arc::new(payload_pool()),
        &bar,
        "share-publisher",
        |m| (m.partition, m.offset),
    )?;
    Ok(Prepared {
        topic_id,
        create_secs,
        publish,
        published,
    })
}

/// After a drain: the queue shows nothing available, leased or delayed for the group, and the
/// group has no member. Returns the group's stats.
fn check_after(broker: ShareBroker<'_>, params: &ShareParams, problems: &mut Vec<String>) -> Option<Value> {
    let ShareBroker { http, bootstrap, .. } = broker;
    let group_after = match QueueClient::new(http).get_queue(&params.backlog.queue) {
        Ok(v) => {
            let g = v.pointer(&format!("/groups/{}", params.group)).cloned();
            match &g {
                Some(g) => {
                    for field in ["available", "leased", "delayed", "dead_lettered"] {
                        let n = g.get(field).and_then(Value::as_u64).unwrap_or(0);
                        if n != 0 {
                            problems.push(format!(
                                "after the share drain the queue reports {field} = {n} for group {}, not 0",
                                params.group
                            ));
                        }
                    }
                }
                None => problems.push(format!(
                    "after the share drain GET /v1/queues/{} shows no group {}: {v}",
                    params.backlog.queue, params.group
                )),
            }
            g
        }
        Err(e) => {
            problems.push(format!(
                "GET /v1/queues/{} after the share drain: {e}",
                params.backlog.queue
            ));
            None
        }
    };
    match describe_group(bootstrap, &params.group) {
        Ok((state, members)) if members > 0 => problems.push(format!(
            "after every consumer left, ShareGroupDescribe shows group {} {state} with {members} members",
            params.group
        )),
        Ok(_) => {}
        Err(e) => problems.push(format!("ShareGroupDescribe after the share drain: {e:#}")),
    }
    group_after
}

// ------------------------------------------------------------------------------------------
// Requests

/// A connection of this workload: its client id, reads and writes bounded by `timeout`.
fn connect(addr: &str, timeout: Duration) -> Result<RawConn> {
    let options = ConnOptions {
        client_id: CLIENT_ID,
        read_timeout: timeout,
        write_timeout: Some(timeout),
        max_response_bytes: MAX_FRAME_BYTES,
        ..ConnOptions::default()
    };
    RawConn::connect_with(addr, &options).with_context(|| format!("connecting to the Kafka listener {addr}"))
}

fn sb(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_string())
}

/// `NAME (code)` of a Kafka error code.
fn error_name(code: i16) -> String {
    match ResponseError::try_from_code(code) {
        Some(e) => format!("{e:?} ({code})"),
        None => format!("error {code}"),
    }
}

fn with_message(code: i16, message: Option<&StrBytes>) -> String {
    match message {
        Some(m) if !m.is_empty() => format!("{}: {}", error_name(code), m.as_str()),
        _ => error_name(code),
    }
}

/// IncrementalAlterConfigs SET of one config of group `group`.
fn set_group_config(bootstrap: &str, group: &str, key: &str, value: &str) -> Result<()> {
    let mut c = connect(bootstrap, Duration::from_secs(30))?;
    let req = IncrementalAlterConfigsRequest::default().with_resources(vec![AlterConfigsResource::default()
        .with_resource_type(RESOURCE_GROUP)
        .with_resource_name(sb(group))
        .with_configs(vec![AlterableConfig::default()
            .with_name(sb(key))
            .with_config_operation(0)
            .with_value(Some(sb(value)))])]);
    let resp = c
        .request(ALTER_CONFIGS_VERSION, &req)
        .with_context(|| format!("setting {key}={value} on group {group}"))?;
    let r = resp
        .responses
        .first()
        .ok_or_else(|| anyhow!("IncrementalAlterConfigs on group {group} answered no resource"))?;
    if r.error_code != 0 {
        bail!(
            "IncrementalAlterConfigs {key}={value} on group {group}: {}",
            with_message(r.error_code, r.error_message.as_ref())
        );
    }
    Ok(())
}

/// ShareGroupDescribe of one group: (state, members).
fn describe_group(bootstrap: &str, group: &str) -> Result<(String, usize)> {
    let mut c = connect(bootstrap, Duration::from_secs(30))?;
    let req = ShareGroupDescribeRequest::default().with_group_ids(vec![GroupId(sb(group))]);
    let resp = c.request(DESCRIBE_VERSION, &req)?;
    let g = resp
        .groups
        .first()
        .ok_or_else(|| anyhow!("ShareGroupDescribe of {group} answered no group"))?;
    if g.error_code != 0 {
        bail!(
            "ShareGroupDescribe of {group}: {}",
            with_message(g.error_code, g.error_message.as_ref())
        );
    }
    Ok((g.group_state.to_string(), g.members.len()))
}

// ------------------------------------------------------------------------------------------
// Pure pieces: acknowledgement ranges, answers, verification

/// Sorted offsets as contiguous `(first, last)` ranges (duplicates dropped).
fn ack_ranges(offsets: &[i64]) -> Vec<(i64, i64)> {
    let mut sorted = offsets.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut out: Vec<(i64, i64)> = Vec::new();
    for o in sorted {
        match out.last_mut() {
            Some((_, last)) if *last + 1 == o => *last = o,
            _ => out.push((o, o)),
        }
    }
    out
}

/// What a share consumer names in its next ShareFetch.
#[derive(Debug, PartialEq, Eq)]
struct FetchPlan {
    /// Partitions named: added to the session or carrying acknowledgements.
    named: Vec<i32>,
    /// Session partitions to forget (no longer assigned, nothing to acknowledge there).
    forget: Vec<i32>,
}

fn plan_fetch(
    in_session: &BTreeSet<i32>,
    assigned: &BTreeSet<i32>,
    pending: &BTreeMap<i32, Vec<i64>>,
) -> FetchPlan {
    let mut named: BTreeSet<i32> = assigned.difference(in_session).copied().collect();
    named.extend(pending.keys().copied());
    let forget = in_session
        .iter()
        .filter(|p| !assigned.contains(p) && !pending.contains_key(p))
        .copied()
        .collect();
    FetchPlan {
        named: named.into_iter().collect(),
        forget,
    }
}

/// What one ShareFetch answer said, checked.
#[derive(Debug, Default, PartialEq, Eq)]
struct FetchAnswer {
    /// Acquired offsets per partition (each checked against its record).
    acquired: BTreeMap<i32, Vec<i64>>,
    records: u64,
    /// Records acquired with delivery count 1.
    first_deliveries: u64,
    /// Records acquired with a delivery count above 1.
    redeliveries: u64,
}

/// Checks a ShareFetch answer: no error, every partition whose acknowledgements the request
/// carried (`acked`) answered with acknowledge error code 0, every acquired offset is a record of
/// `message_bytes` bytes in the answered batches.
fn read_fetch_answer(
    resp: &ShareFetchResponse,
    topic_id: Uuid,
    acked: &[i32],
    message_bytes: usize,
) -> Result<FetchAnswer> {
    if resp.error_code != 0 {
        bail!(
            "ShareFetch answered {}",
            with_message(resp.error_code, resp.error_message.as_ref())
        );
    }
    let mut out = FetchAnswer::default();
    let mut ack_seen: BTreeSet<i32> = BTreeSet::new();
    for t in &resp.responses {
        if t.topic_id != topic_id {
            bail!(
                "ShareFetch answered topic id {}, the benchmark's topic is {topic_id}",
                t.topic_id
            );
        }
        for p in &t.partitions {
            let part = p.partition_index;
            if acked.contains(&part) {
                if p.acknowledge_error_code != 0 {
                    bail!(
                        "ShareFetch refused the acknowledgements of partition {part}: {}",
                        with_message(p.acknowledge_error_code, p.acknowledge_error_message.as_ref())
                    );
                }
                ack_seen.insert(part);
            }
            if p.error_code != 0 {
                bail!(
                    "ShareFetch answered {} for partition {part}",
                    with_message(p.error_code, p.error_message.as_ref())
                );
            }
            if p.acquired_records.is_empty() {
                continue;
            }
            let mut offsets = Vec::new();
            for a in &p.acquired_records {
                let n = a
                    .last_offset
                    .checked_sub(a.first_offset)
                    .and_then(|d| u64::try_from(d).ok())
                    .map(|d| d + 1)
                    .filter(|_| a.first_offset >= 0)
                    .ok_or_else(|| {
                        anyhow!(
                            "ShareFetch acquired the range {}..={} of partition {part}",
                            a.first_offset,
                            a.last_offset
                        )
                    })?;
                out.records += n;
                if out.records > MAX_ACQUIRED_PER_ANSWER {
                    bail!("ShareFetch acquired more than {MAX_ACQUIRED_PER_ANSWER} records in one answer");
                }
                if a.delivery_count == 1 {
                    out.first_deliveries += n;
                } else {
                    out.redeliveries += n;
                }
                offsets.extend(a.first_offset..=a.last_offset);
            }
            check_records(p.records.as_ref(), &offsets, message_bytes)
                .with_context(|| format!("ShareFetch answer, partition {part}"))?;
            if out.acquired.insert(part, offsets).is_some() {
                bail!("ShareFetch answered partition {part} twice");
            }
        }
    }
    if let Some(missing) = acked.iter().find(|p| !ack_seen.contains(p)) {
        bail!("ShareFetch answered nothing about partition {missing}, whose acknowledgements it carried");
    }
    Ok(out)
}

/// Splits record batches into `(base offset, last offset, batch)` without decoding them (v2 batch
/// header: baseOffset i64, batchLength i32, partitionLeaderEpoch i32, magic i8, crc u32,
/// attributes i16, lastOffsetDelta i32). A truncated last batch is dropped, as Kafka clients do.
fn split_batches(records: &Bytes) -> Result<Vec<(i64, i64, Bytes)>> {
    let mut out = Vec::new();
    let mut pos = 0usize;
    while let Some(head) = records.get(pos..pos + BATCH_HEADER_PREFIX) {
        let mut h = head;
        let base = h.get_i64();
        let len = h.get_i32();
        let _leader_epoch = h.get_i32();
        let magic = h.get_i8();
        let _crc = h.get_u32();
        let _attributes = h.get_i16();
        let last_delta = h.get_i32();
        if magic != 2 {
            bail!("record batch at byte {pos} has magic {magic}, not 2");
        }
        let total = usize::try_from(len)
            .ok()
            .and_then(|l| l.checked_add(12))
            .filter(|t| *t >= BATCH_HEADER_PREFIX)
            .ok_or_else(|| anyhow!("record batch at byte {pos} has length {len}"))?;
        let end = pos + total;
        if end > records.len() {
            break;
        }
        let last = base
            .checked_add(i64::from(last_delta))
            .filter(|l| *l >= base)
            .ok_or_else(|| {
                anyhow!("record batch at byte {pos}: base {base}, last offset delta {last_delta}")
            })?;
        out.push((base, last, records.slice(pos..end)));
        pos = end;
    }
    Ok(out)
}

/// Checks that every offset of `offsets` is a data record of `message_bytes` in `records`.
/// Only the batches holding acquired offsets are decoded (the answer may carry more).
fn check_records(records: Option<&Bytes>, offsets: &[i64], message_bytes: usize) -> Result<()> {
    let (Some(lo), Some(hi)) = (offsets.iter().min(), offsets.iter().max()) else {
        return Ok(());
    };
    let all = records.cloned().unwrap_or_default();
    let mut found: Vec<(i64, usize)> = Vec::new();
    for (base, last, mut batch) in split_batches(&all)? {
        if last < *lo || base > *hi {
            continue;
        }
        let set = RecordBatchDecoder::decode(&mut batch)
            .with_context(|| format!("decoding the record batch at offset {base}"))?;
        found.extend(
            set.records
                .iter()
                .filter(|r| !r.control)
                .map(|r| (r.offset, r.value.as_ref().map_or(usize::MAX, Bytes::len))),
        );
    }
    found.sort_unstable();
    for o in offsets {
        match found.binary_search_by_key(o, |(off, _)| *off) {
            Ok(i) => {
                let len = found.get(i).map_or(usize::MAX, |(_, l)| *l);
                if len != message_bytes {
                    bail!("record {o} has a value of {len} bytes, {message_bytes} were published");
                }
            }
            Err(_) => bail!("offset {o} was acquired but is in no answered record batch"),
        }
    }
    Ok(())
}

/// Checks the error codes of a ShareAcknowledge answer for the partitions it carried.
fn read_acknowledge_answer(resp: &ShareAcknowledgeResponse, topic_id: Uuid, acked: &[i32]) -> Result<()> {
    if resp.error_code != 0 {
        bail!(
            "ShareAcknowledge answered {}",
            with_message(resp.error_code, resp.error_message.as_ref())
        );
    }
    let mut seen = BTreeSet::new();
    for t in &resp.responses {
        if t.topic_id != topic_id {
            bail!(
                "ShareAcknowledge answered topic id {}, the benchmark's topic is {topic_id}",
                t.topic_id
            );
        }
        for p in &t.partitions {
            if p.error_code != 0 {
                bail!(
                    "ShareAcknowledge refused the acknowledgements of partition {}: {}",
                    p.partition_index,
                    with_message(p.error_code, p.error_message.as_ref())
                );
            }
            seen.insert(p.partition_index);
        }
    }
    if let Some(missing) = acked.iter().find(|p| !seen.contains(p)) {
        bail!(
            "ShareAcknowledge answered nothing about partition {missing}, whose acknowledgements it carried"
        );
    }
    Ok(())
}

/// Checks that `accepted` holds every record of `published` exactly once and nothing else.
fn verify(published: &[(i32, i64)], accepted: &[(i32, i64)]) -> Result<(), String> {
    exactly_once(published, accepted, "(partition, offset) pairs", "accepted")
}

// ------------------------------------------------------------------------------------------
// Drain: share consumers

/// State the consumers share.
struct Shared {
    total: u64,
    accepted: AtomicU64,
    /// Records acquired for the first time (delivery count 1).
    first_acquired: AtomicU64,
    abort: AtomicBool,
    joined: AtomicUsize,
    settled: AtomicUsize,
    /// Drain start (set by the last consumer to take its final assignment).
    start: OnceLock<(Instant, CpuMark)>,
    /// The last confirmed acceptance; the CPU counters when the last record was accepted.
    clock: PhaseClock,
}

impl Shared {
    fn finished(&self) -> bool {
        self.accepted.load(Ordering::Acquire) >= self.total
    }

    fn check_abort(&self) -> Result<()> {
        if self.abort.load(Ordering::Relaxed) {
            bail!("{STOPPED}: another share consumer failed");
        }
        Ok(())
    }
}

/// Waits until `n` consumers arrived at `counter` (bounded by `timeout`); true for the last one.
fn rendezvous(
    counter: &AtomicUsize,
    n: usize,
    shared: &Shared,
    timeout: Duration,
    what: &str,
) -> Result<bool> {
    let last = counter.fetch_add(1, Ordering::AcqRel) + 1 == n;
    let deadline = Instant::now() + timeout;
    while counter.load(Ordering::Acquire) < n {
        shared.check_abort()?;
        if Instant::now() >= deadline {
            bail!(
                "only {} of {n} share consumers {what} within {timeout:?}",
                counter.load(Ordering::Acquire)
            );
        }
        thread::sleep(Duration::from_millis(1));
    }
    Ok(last)
}

/// What one consumer measured.
struct ConsumerOut {
    member_id: String,
    assigned: Vec<i32>,
    fetch_hist: Histogram<u64>,
    ack_hist: Histogram<u64>,
    fetch_to_ack_hist: Histogram<u64>,
    fetch_requests: u64,
    empty_fetches: u64,
    acknowledge_requests: u64,
    heartbeats: u64,
    acquired: u64,
    redeliveries: u64,
    fetch_answer_bytes: u64,
    fetch_wait: Duration,
    ack_wait: Duration,
    wall: Duration,
    accepted: Vec<(i32, i64)>,
    last_ack: Option<Instant>,
    lock_timeout_ms: Option<i32>,
    join_started: Option<Instant>,
}

impl ConsumerOut {
    fn new(member_id: String) -> Self {
        Self {
            member_id,
            assigned: Vec::new(),
            fetch_hist: latency::histogram(),
            ack_hist: latency::histogram(),
            fetch_to_ack_hist: latency::histogram(),
            fetch_requests: 0,
            empty_fetches: 0,
            acknowledge_requests: 0,
            heartbeats: 0,
            acquired: 0,
            redeliveries: 0,
            fetch_answer_bytes: 0,
            fetch_wait: Duration::ZERO,
            ack_wait: Duration::ZERO,
            wall: Duration::ZERO,
            accepted: Vec::new(),
            last_ack: None,
            lock_timeout_ms: None,
            join_started: None,
        }
    }
}

/// Settings every consumer uses.
struct ConsumerCfg {
    bootstrap: String,
    group: String,
    topic: String,
    topic_id: Uuid,
    consumers: usize,
    max_records: i32,
    max_wait_ms: i32,
    max_bytes: i32,
    message_bytes: usize,
    timeout: Duration,
}

/// One share consumer: its membership, its share session and what it has to acknowledge.
struct Consumer<'a> {
    cfg: &'a ConsumerCfg,
    conn: RawConn,
    member_id: String,
    member_epoch: i32,
    heartbeat_interval: Duration,
    next_heartbeat: Instant,
    assigned: BTreeSet<i32>,
    session_epoch: i32,
    in_session: BTreeSet<i32>,
    /// Offsets acquired by the last ShareFetch, to accept.
    pending: BTreeMap<i32, Vec<i64>>,
    /// When they were acquired (the answer's arrival).
    pending_since: Option<Instant>,
}

fn next_session_epoch(e: i32) -> i32 {
    if e == i32::MAX {
        1
    } else {
        e + 1
    }
}

impl<'a> Consumer<'a> {
    fn connect(cfg: &'a ConsumerCfg) -> Result<Self> {
        // A long poll takes up to max_wait_ms; the broker caps it at 30 s.
        let read_timeout = Duration::from_millis(cfg.max_wait_ms.max(0) as u64) + cfg.timeout;
        Ok(Self {
            cfg,
            conn: connect(&cfg.bootstrap, read_timeout)?,
            member_id: Uuid::new_v4().to_string(),
            member_epoch: 0,
            heartbeat_interval: Duration::from_secs(5),
            next_heartbeat: Instant::now(),
            assigned: BTreeSet::new(),
            session_epoch: 0,
            in_session: BTreeSet::new(),
            pending: BTreeMap::new(),
            pending_since: None,
        })
    }

    /// ShareGroupHeartbeat: join (epoch 0, subscription), heartbeat, or leave (epoch -1).
    fn heartbeat(&mut self, epoch: i32) -> Result<()> {
        let joining = epoch == 0;
        let req = ShareGroupHeartbeatRequest::default()
            .with_group_id(GroupId(sb(&self.cfg.group)))
            .with_member_id(sb(&self.member_id))
            .with_member_epoch(epoch)
            .with_subscribed_topic_names(joining.then(|| vec![TopicName(sb(&self.cfg.topic))]));
        let what = match epoch {
            0 => "join",
            FINAL_EPOCH => "leave",
            _ => "heartbeat",
        };
        let r = self
            .conn
            .request(HEARTBEAT_VERSION, &req)
            .with_context(|| format!("ShareGroupHeartbeat ({what}) of member {}", self.member_id))?;
        if r.error_code != 0 {
            bail!(
                "ShareGroupHeartbeat ({what}) of member {} at epoch {epoch}: {}",
                self.member_id,
                with_message(r.error_code, r.error_message.as_ref())
            );
        }
        if epoch == FINAL_EPOCH {
            ensure!(
                r.member_epoch == FINAL_EPOCH,
                "the leave heartbeat of member {} answered member epoch {}, not -1",
                self.member_id,
                r.member_epoch
            );
            return Ok(());
        }
        ensure!(
            r.member_epoch > 0,
            "ShareGroupHeartbeat ({what}) of member {} answered member epoch {}",
            self.member_id,
            r.member_epoch
        );
        if let Some(id) = &r.member_id {
            ensure!(
                id.as_str() == self.member_id,
                "ShareGroupHeartbeat answered member id {id}, {} was sent",
                self.member_id
            );
        }
        self.member_epoch = r.member_epoch;
        self.heartbeat_interval = u64::try_from(r.heartbeat_interval_ms)
            .ok()
            .filter(|ms| *ms > 0)
            .map(Duration::from_millis)
            .ok_or_else(|| {
                anyhow!(
                    "ShareGroupHeartbeat answered interval {} ms",
                    r.heartbeat_interval_ms
                )
            })?
            .clamp(MIN_HEARTBEAT_INTERVAL, MAX_HEARTBEAT_INTERVAL);
        self.next_heartbeat = Instant::now() + self.heartbeat_interval;
        if let Some(a) = &r.assignment {
            let mut assigned = BTreeSet::new();
            for tp in &a.topic_partitions {
                if tp.topic_id != self.cfg.topic_id {
                    bail!(
                        "member {} was assigned topic id {}, it subscribed only to {} ({})",
                        self.member_id,
                        tp.topic_id,
                        self.cfg.topic,
                        self.cfg.topic_id
                    );
                }
                assigned.extend(tp.partitions.iter().copied());
            }
            self.assigned = assigned;
        } else if joining {
            bail!(
                "the join heartbeat of member {} answered no assignment",
                self.member_id
            );
        }
        Ok(())
    }

    /// ShareFetch: acknowledges everything pending (ACCEPT) and acquires up to `max_records`.
    /// Returns the checked answer and its size.
    fn fetch(&mut self) -> Result<(FetchAnswer, usize, i32)> {
        let plan = plan_fetch(&self.in_session, &self.assigned, &self.pending);
        if self.session_epoch == 0 && !self.pending.is_empty() {
            bail!("internal: a full ShareFetch (session epoch 0) cannot carry acknowledgements");
        }
        let partitions: Vec<share_fetch_request::FetchPartition> = plan
            .named
            .iter()
            .map(|p| {
                share_fetch_request::FetchPartition::default()
                    .with_partition_index(*p)
                    .with_partition_max_bytes(PARTITION_MAX_BYTES)
                    .with_acknowledgement_batches(
                        self.pending
                            .get(p)
                            .map(|offsets| {
                                ack_ranges(offsets)
                                    .into_iter()
                                    .map(|(a, b)| {
                                        share_fetch_request::AcknowledgementBatch::default()
                                            .with_first_offset(a)
                                            .with_last_offset(b)
                                            .with_acknowledge_types(vec![ACCEPT])
                                    })
                                    .collect()
                            })
                            .unwrap_or_default(),
                    )
            })
            .collect();
        let mut req = ShareFetchRequest::default()
            .with_group_id(Some(GroupId(sb(&self.cfg.group))))
            .with_member_id(Some(sb(&self.member_id)))
            .with_share_session_epoch(self.session_epoch)
            .with_max_wait_ms(self.cfg.max_wait_ms)
            .with_min_bytes(1)
            .with_max_bytes(self.cfg.max_bytes)
            .with_max_records(self.cfg.max_records)
            .with_batch_size(self.cfg.max_records);
        if !partitions.is_empty() {
            req.topics = vec![share_fetch_request::FetchTopic::default()
                .with_topic_id(self.cfg.topic_id)
                .with_partitions(partitions)];
        }
        if !plan.forget.is_empty() {
            req.forgotten_topics_data = vec![share_fetch_request::ForgottenTopic::default()
                .with_topic_id(self.cfg.topic_id)
                .with_partitions(plan.forget.clone())];
        }
        let (resp, size) = self
            .conn
            .request_sized(FETCH_VERSION, &req)
            .with_context(|| format!("ShareFetch of member {}", self.member_id))?;
        let acked: Vec<i32> = self.pending.keys().copied().collect();
        let answer = read_fetch_answer(&resp, self.cfg.topic_id, &acked, self.cfg.message_bytes)
            .with_context(|| {
                format!(
                    "member {} at session epoch {}",
                    self.member_id, self.session_epoch
                )
            })?;
        self.session_epoch = next_session_epoch(self.session_epoch);
        for p in &plan.forget {
            self.in_session.remove(p);
        }
        self.in_session.extend(plan.named.iter().copied());
        Ok((answer, size, resp.acquisition_lock_timeout_ms))
    }

    /// ShareAcknowledge of everything pending; with `close`, session epoch -1 (the session
    /// closes).
    fn acknowledge(&mut self, close: bool) -> Result<()> {
        let partitions: Vec<share_acknowledge_request::AcknowledgePartition> = self
            .pending
            .iter()
            .map(|(p, offsets)| {
                share_acknowledge_request::AcknowledgePartition::default()
                    .with_partition_index(*p)
                    .with_acknowledgement_batches(
                        ack_ranges(offsets)
                            .into_iter()
                            .map(|(a, b)| {
                                share_acknowledge_request::AcknowledgementBatch::default()
                                    .with_first_offset(a)
                                    .with_last_offset(b)
                                    .with_acknowledge_types(vec![ACCEPT])
                            })
                            .collect(),
                    )
            })
            .collect();
        let epoch = if close { FINAL_EPOCH } else { self.session_epoch };
        let mut req = ShareAcknowledgeRequest::default()
            .with_group_id(Some(GroupId(sb(&self.cfg.group))))
            .with_member_id(Some(sb(&self.member_id)))
            .with_share_session_epoch(epoch);
        if !partitions.is_empty() {
            req.topics = vec![share_acknowledge_request::AcknowledgeTopic::default()
                .with_topic_id(self.cfg.topic_id)
                .with_partitions(partitions)];
        }
        let resp = self
            .conn
            .request(ACKNOWLEDGE_VERSION, &req)
            .with_context(|| format!("ShareAcknowledge of member {}", self.member_id))?;
        let acked: Vec<i32> = self.pending.keys().copied().collect();
        read_acknowledge_answer(&resp, self.cfg.topic_id, &acked)
            .with_context(|| format!("member {} at session epoch {epoch}", self.member_id))?;
        if close {
            self.session_epoch = 0;
            self.in_session.clear();
        } else {
            self.session_epoch = next_session_epoch(self.session_epoch);
        }
        Ok(())
    }

    /// The broker confirmed the acceptance of everything pending (answer at `at`).
    fn confirm(&mut self, at: Instant, shared: &Shared, out: &mut ConsumerOut, bar: &ProgressBar) {
        let mut n = 0u64;
        for (p, offsets) in std::mem::take(&mut self.pending) {
            n += offsets.len() as u64;
            out.accepted.extend(offsets.into_iter().map(|o| (p, o)));
        }
        if n == 0 {
            return;
        }
        if let Some(since) = self.pending_since.take() {
            latency::record_ns(
                &mut out.fetch_to_ack_hist,
                at.saturating_duration_since(since).as_nanos() as u64,
            );
        }
        out.last_ack = Some(at);
        shared.accepted.fetch_add(n, Ordering::AcqRel);
        shared.clock.progress(at);
        shared.clock.end_if(shared.finished());
        bar.inc(n);
    }
}

fn consumer_thread(cfg: &ConsumerCfg, shared: &Shared, bar: &ProgressBar) -> Result<ConsumerOut> {
    let mut c = Consumer::connect(cfg)?;
    let mut out = ConsumerOut::new(c.member_id.clone());
    out.join_started = Some(Instant::now());
    c.heartbeat(0)?;
    rendezvous(&shared.joined, cfg.consumers, shared, cfg.timeout, "joined")?;
    // Everyone is in: this heartbeat brings the group's final assignment.
    let epoch = c.member_epoch;
    c.heartbeat(epoch)?;
    out.assigned = c.assigned.iter().copied().collect();
    if rendezvous(
        &shared.settled,
        cfg.consumers,
        shared,
        cfg.timeout,
        "took their assignment",
    )? {
        let mark = CpuMark::now(shared.clock.broker_pid);
        let _ = shared.start.set((mark.at, mark));
        shared.clock.progress(mark.at);
    }
    let started = loop {
        if let Some((at, _)) = shared.start.get() {
            break *at;
        }
        shared.check_abort()?;
        thread::sleep(Duration::from_micros(200));
    };
    drain_loop(&mut c, shared, &mut out, bar)?;
    out.wall = started.elapsed();
    // Close the share session (nothing is held any more), then leave the group.
    c.acknowledge(true)?;
    c.heartbeat(FINAL_EPOCH)?;
    Ok(out)
}

fn drain_loop(c: &mut Consumer<'_>, shared: &Shared, out: &mut ConsumerOut, bar: &ProgressBar) -> Result<()> {
    let timeout = c.cfg.timeout;
    loop {
        shared.check_abort()?;
        if Instant::now() >= c.next_heartbeat {
            let epoch = c.member_epoch;
            c.heartbeat(epoch)?;
            out.heartbeats += 1;
        }
        let finished = shared.finished();
        if finished && c.pending.is_empty() {
            return Ok(());
        }
        if !finished && shared.clock.since_progress() > timeout {
            bail!(
                "no record accepted for {timeout:?}: {} published, {} accepted, {} acquired once",
                shared.total,
                shared.accepted.load(Ordering::Relaxed),
                shared.first_acquired.load(Ordering::Relaxed)
            );
        }
        let unassigned = c.pending.keys().any(|p| !c.assigned.contains(p));
        let all_acquired = shared.first_acquired.load(Ordering::Acquire) >= shared.total;
        if !c.pending.is_empty() && (finished || unassigned || all_acquired) {
            // The last acknowledgements: no fetch (it would long-poll before answering).
            let t0 = Instant::now();
            c.acknowledge(false)?;
            let t1 = Instant::now();
            out.ack_wait += t1 - t0;
            out.acknowledge_requests += 1;
            latency::record_ns(&mut out.ack_hist, (t1 - t0).as_nanos() as u64);
            c.confirm(t1, shared, out, bar);
            continue;
        }
        if c.assigned.is_empty() && c.in_session.is_empty() && c.pending.is_empty() {
            // Nothing to fetch from until the assignment changes.
            let wait = c.next_heartbeat.saturating_duration_since(Instant::now());
            thread::sleep(wait.min(Duration::from_millis(10)));
            continue;
        }
        let t0 = Instant::now();
        let (answer, size, lock_ms) = c.fetch()?;
        let t1 = Instant::now();
        out.fetch_wait += t1 - t0;
        out.fetch_requests += 1;
        out.lock_timeout_ms = Some(lock_ms);
        c.confirm(t1, shared, out, bar);
        if answer.records == 0 {
            out.empty_fetches += 1;
            continue;
        }
        latency::record_ns(&mut out.fetch_hist, (t1 - t0).as_nanos() as u64);
        out.fetch_answer_bytes += size as u64;
        out.acquired += answer.records;
        out.redeliveries += answer.redeliveries;
        shared
            .first_acquired
            .fetch_add(answer.first_deliveries, Ordering::AcqRel);
        c.pending = answer.acquired;
        c.pending_since = Some(t1);
    }
}

fn drain_phase(
    broker: ShareBroker<'_>,
    params: &ShareParams,
    topic_id: Uuid,
) -> Result<(ShareDrainResult, Vec<(i32, i64)>)> {
    let ShareBroker {
        bootstrap,
        pid: broker_pid,
        show_progress,
        ..
    } = broker;
    let cfg = Arc::new(ConsumerCfg {
        bootstrap: bootstrap.to_string(),
        group: params.group.clone(),
        topic: params.backlog.queue.clone(),
        topic_id,
        consumers: params.consumers,
        max_records: i32::try_from(params.max_records).context("max_records")?,
        max_wait_ms: i32::try_from(params.max_wait_ms).context("max_wait_ms")?,
        max_bytes: params.fetch_max_bytes,
        message_bytes: params.backlog.message_bytes,
        timeout: params.backlog.timeout(),
    });
    let shared = Arc::new(Shared {
        total: params.backlog.messages,
        accepted: AtomicU64::new(0),
        first_acquired: AtomicU64::new(0),
        abort: AtomicBool::new(false),
        joined: AtomicUsize::new(0),
        settled: AtomicUsize::new(0),
        start: OnceLock::new(),
        clock: PhaseClock::new(broker_pid),
    });
    let bar = progress_bar(show_progress, "share drain", params.backlog.messages);
    let handles: Vec<_> = (0..params.consumers)
        .map(|i| {
            let (cfg, shared, bar) = (Arc::clone(&cfg), Arc::clone(&shared), bar.clone());
            thread::Builder::new()
                .name(format!("share-consumer-{i}"))
                .spawn(move || -> Result<ConsumerOut> {
                    let r = consumer_thread(&cfg, &shared, &bar);
                    if r.is_err() {
                        shared.abort.store(true, Ordering::Relaxed);
                    }
                    r
                })
                .context("spawning a share consumer thread")
        })
        .collect::<Result<_>>()?;
    let mut outs = Vec::new();
    let mut errors = Vec::new();
    for h in handles {
        match h.join() {
            Ok(Ok(o)) => outs.push(o),
            Ok(Err(e)) => errors.push(e),
            Err(_) => errors.push(anyhow!("a share consumer thread panicked")),
        }
    }
    bar.finish_and_clear();
    // The cause, not the consumers that stopped because of it.
    if let Some(i) = errors
        .iter()
        .position(|e| !format!("{e:#}").starts_with(STOPPED))
        .or((!errors.is_empty()).then_some(0))
    {
        return Err(errors.swap_remove(i));
    }
    let (start_at, start_mark) = *shared
        .start
        .get()
        .ok_or_else(|| anyhow!("the share drain never started"))?;
    let end_mark = shared
        .clock
        .end
        .get()
        .copied()
        .unwrap_or_else(|| CpuMark::now(broker_pid));

    let mut fetch_hist = latency::histogram();
    let mut ack_hist = latency::histogram();
    let mut f2a_hist = latency::histogram();
    let mut accepted = Vec::with_capacity(params.backlog.messages as usize);
    let mut per_consumer = Vec::new();
    let (mut fetches, mut empty, mut acks, mut heartbeats, mut acquired, mut redeliveries, mut bytes) =
        (0u64, 0u64, 0u64, 0u64, 0u64, 0u64, 0u64);
    let (mut fetch_wait, mut ack_wait, mut wall) = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
    let mut last_ack: Option<Instant> = None;
    let mut lock_ms = None;
    let mut join_started: Option<Instant> = None;
    for o in outs {
        fetch_hist.add(&o.fetch_hist).context("merging histograms")?;
        ack_hist.add(&o.ack_hist).context("merging histograms")?;
        f2a_hist.add(&o.fetch_to_ack_hist).context("merging histograms")?;
        fetches += o.fetch_requests;
        empty += o.empty_fetches;
        acks += o.acknowledge_requests;
        heartbeats += o.heartbeats;
        acquired += o.acquired;
        redeliveries += o.redeliveries;
        bytes += o.fetch_answer_bytes;
        fetch_wait += o.fetch_wait;
        ack_wait += o.ack_wait;
        wall += o.wall;
        last_ack = last_ack.max(o.last_ack);
        lock_ms = lock_ms.or(o.lock_timeout_ms);
        join_started = match (join_started, o.join_started) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        per_consumer.push(ConsumerFigures {
            member_id: o.member_id,
            assigned_partitions: o.assigned,
            records_accepted: o.accepted.len() as u64,
        });
        accepted.extend(o.accepted);
    }
    let n = accepted.len() as u64;
    let secs = last_ack.map_or(0.0, |t| t.saturating_duration_since(start_at).as_secs_f64());
    let mean_batch = div_or_zero(acquired as f64, (fetches - empty) as f64);
    let fetch_to_ack = LatencySummary::of(&f2a_hist);
    let share = |d: Duration| div_or_zero(d.as_secs_f64(), wall.as_secs_f64());
    let figures = NativeFigures {
        join_secs: join_started.map_or(0.0, |j| start_at.saturating_duration_since(j).as_secs_f64()),
        fetch_requests: fetches,
        empty_fetches: empty,
        acknowledge_requests: acks,
        heartbeats,
        mean_fetch_batch: mean_batch,
        fetch_latency: LatencySummary::of(&fetch_hist),
        acknowledge_latency: LatencySummary::of(&ack_hist),
        fetch_to_ack,
        fetch_to_ack_us_per_message: div_or_zero(fetch_to_ack.mean_us, mean_batch),
        consumer_time_in_fetch: share(fetch_wait),
        consumer_time_in_ack: share(ack_wait),
        fetch_answer_bytes_per_message: div_or_zero(bytes as f64, acquired as f64),
        acquisition_lock_timeout_ms: lock_ms,
        per_consumer,
    };
    let cpu = PhaseCpu::between(&start_mark, Some(end_mark), None, n);
    let result = ShareDrain::new(params, (n, acquired, redeliveries), secs, figures, cpu);
    Ok((result, accepted))
}

// ------------------------------------------------------------------------------------------
// Drain: confluent-kafka ShareConsumer processes

/// A confluent-kafka `ShareConsumer` (explicit acknowledgement, every record ACCEPTed; the
/// acknowledgements go with the next poll) run by `python -c SCRIPT SPEC` until EOF on stdin.
/// Output, one JSON object per line: `{"ready": client}`, `{"acq": n, "redelivered": k}` per poll
/// that returned records, `{"p": partition, "o": [offsets]}` per acknowledgement the broker
/// answered (with `"err"` when it failed, from the acknowledgement commit callback),
/// `{"error": text}`, `{"closed": true}`.
const CONFLUENT_SCRIPT: &str = r#"
import json, sys, threading
import confluent_kafka
from confluent_kafka import AcknowledgeType, ShareConsumer

spec = json.loads(sys.argv[1])
lock = threading.Lock()


def emit(doc):
    with lock:
        sys.stdout.write(json.dumps(doc, separators=(",", ":")) + "\n")
        sys.stdout.flush()


stop = threading.Event()


def watch_stdin():
    for _ in sys.stdin:
        pass
    stop.set()


threading.Thread(target=watch_stdin, daemon=True).start()


def on_ack(offsets, exc):
    for tp, offs in offsets.items():
        doc = {"p": tp.partition, "o": sorted(offs)}
        if exc is not None:
            doc["err"] = str(exc)
        emit(doc)


def first(v):
    return v[0] if isinstance(v, tuple) else v


consumer = ShareConsumer({
    "bootstrap.servers": spec["bootstrap"],
    "group.id": spec["group"],
    "share.acknowledgement.mode": "explicit",
    "broker.address.family": "v4",
    "fetch.wait.max.ms": spec["fetch_wait_max_ms"],
    "error_cb": lambda e: emit({"error": str(e)}),
})
consumer.set_acknowledgement_commit_callback(on_ack)
consumer.subscribe([spec["topic"]])
emit({"ready": "confluent-kafka %s (librdkafka %s)"
      % (first(confluent_kafka.version()), first(confluent_kafka.libversion()))})
size = spec["message_bytes"]
while not stop.is_set():
    msgs = consumer.poll(spec["poll_timeout_s"])
    n = redelivered = 0
    for m in msgs:
        if m.error():
            emit({"error": "message: %s" % m.error()})
            continue
        value = m.value() or b""
        if len(value) != size:
            emit({"error": "record %d:%d has %d bytes, %d were published"
                  % (m.partition(), m.offset(), len(value), size)})
        if (m.delivery_count() or 1) > 1:
            redelivered += 1
        consumer.acknowledge(m, AcknowledgeType.ACCEPT)
        n += 1
    if n:
        emit({"acq": n, "redelivered": redelivered})
consumer.close()
emit({"closed": True})
"#;

/// Longest output line of a consumer process.
const MAX_CHILD_LINE: u64 = 4 << 20;
/// Events in flight from the consumer processes to the main thread.
const CHILD_EVENTS: usize = 4096;
/// How long consumer processes get to close after the drain.
const CHILD_CLOSE_TIMEOUT: Duration = Duration::from_secs(30);
/// Stderr lines kept per consumer process (for error messages).
const CHILD_STDERR_LINES: usize = 20;
/// Client errors kept in the report.
const MAX_CLIENT_ERRORS: usize = 20;

/// The drain through confluent-kafka `ShareConsumer` processes.
pub type ConfluentDrainResult = ShareDrain<ConfluentFigures>;

/// What the confluent-kafka `ShareConsumer` processes measured.
#[derive(Debug, Clone, Serialize)]
pub struct ConfluentFigures {
    /// `confluent-kafka x (librdkafka y)`.
    pub client: Option<String>,
    /// From spawning the processes to the first record any of them acquired (Python start-up,
    /// joining the group).
    pub startup_secs: f64,
    /// Polls that returned records, and records per such poll.
    pub polls_with_records: u64,
    pub mean_poll_batch: f64,
    /// Per consumer process: records whose acceptance the broker confirmed.
    pub per_consumer_accepted: Vec<u64>,
    /// Errors the clients reported (error callback, failed acknowledgements), first ones.
    pub client_errors: Vec<String>,
}

/// Checks that `python` runs and has confluent-kafka's ShareConsumer; returns its versions.
fn check_python(python: &std::path::Path) -> Result<String> {
    use std::process::{Command, Stdio};
    let how = "install it with `python3 -m venv .venv && .venv/bin/pip install -r \
               compat-tests/python/requirements.txt` (tools/run-tests does this), or pass --python";
    let mut child = Command::new(python)
        .args([
            "-c",
            "import confluent_kafka\nfrom confluent_kafka import ShareConsumer\n\
             print(confluent_kafka.version()[0], confluent_kafka.libversion()[0])",
        ])
        .env_remove("LD_LIBRARY_PATH")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot run {}: {how}", python.display()))?;
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().context("waiting for python")? {
            break s;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("{} did not answer within 30 s", python.display());
        }
        thread::sleep(Duration::from_millis(20));
    };
    let mut text = String::new();
    if let Some(mut o) = child.stdout.take() {
        let _ = o.by_ref().take(4096).read_to_string(&mut text);
    }
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.by_ref().take(4096).read_to_string(&mut err);
    }
    if !status.success() {
        bail!(
            "{} has no confluent-kafka with ShareConsumer ({status}: {}): {how}",
            python.display(),
            err.trim()
        );
    }
    Ok(text.trim().to_string())
}

/// What a consumer process said (or that its output ended).
enum ChildEvent {
    Ready(String),
    Acquired {
        n: u64,
        redelivered: u64,
    },
    Acked {
        partition: i32,
        offsets: Vec<i64>,
    },
    AckFailed {
        partition: i32,
        count: usize,
        error: String,
    },
    Error(String),
    Closed,
    Unreadable(String),
    Eof,
}

fn parse_child_line(line: &str) -> ChildEvent {
    let v: Value = match serde_json::from_str(line) {
        Ok(v) => v,
        Err(e) => return ChildEvent::Unreadable(format!("{e}: {line:.200}")),
    };
    let int = |k: &str| v.get(k).and_then(Value::as_i64);
    if let Some(c) = v.get("ready").and_then(Value::as_str) {
        return ChildEvent::Ready(c.to_string());
    }
    if let Some(n) = v.get("acq").and_then(Value::as_u64) {
        return ChildEvent::Acquired {
            n,
            redelivered: v.get("redelivered").and_then(Value::as_u64).unwrap_or(0),
        };
    }
    if let (Some(p), Some(list)) = (int("p"), v.get("o").and_then(Value::as_array)) {
        let Ok(partition) = i32::try_from(p) else {
            return ChildEvent::Unreadable(format!("partition {p}: {line:.200}"));
        };
        let offsets: Option<Vec<i64>> = list.iter().map(Value::as_i64).collect();
        let Some(offsets) = offsets else {
            return ChildEvent::Unreadable(format!("offsets: {line:.200}"));
        };
        return match v.get("err").and_then(Value::as_str) {
            Some(e) => ChildEvent::AckFailed {
                partition,
                count: offsets.len(),
                error: e.to_string(),
            },
            None => ChildEvent::Acked { partition, offsets },
        };
    }
    if let Some(e) = v.get("error").and_then(Value::as_str) {
        return ChildEvent::Error(e.to_string());
    }
    if v.get("closed").is_some() {
        return ChildEvent::Closed;
    }
    ChildEvent::Unreadable(format!("unknown event: {line:.200}"))
}

/// Keeps the first client errors.
fn note_error(errors: &mut Vec<String>, e: String) {
    if errors.len() < MAX_CLIENT_ERRORS {
        errors.push(e);
    }
}

/// Sums the CPU seconds of `pids` (None if one cannot be read).
fn cpu_of(pids: &[u32]) -> Option<f64> {
    pids.iter().map(|p| cpu_seconds(Some(*p))).sum()
}

/// Runs the share workload with `consumers` confluent-kafka ShareConsumer processes
/// (`python -c`), reported apart from the native one.
pub fn run_confluent(
    broker: ShareBroker<'_>,
    params: &ShareParams,
    python: &std::path::Path,
    checkpoint: &mut dyn FnMut(ShareCheckpoint),
) -> Result<ConfluentResult> {
    params.validate()?;
    let versions = check_python(python)?;
    run_door(broker, params, checkpoint, |_| {
        announce(&format!(
            "share drain phase: {} confluent-kafka ShareConsumer processes ({versions}) in group {}",
            params.consumers, params.group
        ));
        confluent_drain(broker, params, python)
    })
}

/// The consumer processes, killed (and reaped) when dropped.
struct Children {
    procs: Vec<std::process::Child>,
    stderr: Vec<Arc<std::sync::Mutex<std::collections::VecDeque<String>>>>,
}

impl Children {
    fn stderr_tail(&self, i: usize) -> String {
        self.stderr
            .get(i)
            .map(|s| {
                let s = s.lock().unwrap_or_else(|e| e.into_inner());
                s.iter().cloned().collect::<Vec<_>>().join("\n")
            })
            .unwrap_or_default()
    }

    fn close_stdin(&mut self) {
        for c in &mut self.procs {
            drop(c.stdin.take());
        }
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.procs {
            if matches!(c.try_wait(), Ok(None)) {
                let _ = c.kill();
            }
            let _ = c.wait();
        }
    }
}

fn confluent_drain(
    broker: ShareBroker<'_>,
    params: &ShareParams,
    python: &std::path::Path,
) -> Result<(ConfluentDrainResult, Vec<(i32, i64)>)> {
    use std::io::BufRead;
    use std::process::{Command, Stdio};
    use std::sync::mpsc;

    let ShareBroker {
        bootstrap,
        pid: broker_pid,
        show_progress,
        ..
    } = broker;

    let spec = json!({
        "bootstrap": bootstrap,
        "group": params.group,
        "topic": params.backlog.queue,
        "message_bytes": params.backlog.message_bytes,
        "fetch_wait_max_ms": params.max_wait_ms.max(1),
        "poll_timeout_s": f64::from(params.max_wait_ms.max(10)) / 1000.0,
    })
    .to_string();
    let (tx, rx) = mpsc::sync_channel::<(usize, ChildEvent)>(CHILD_EVENTS);
    let mut children = Children {
        procs: Vec::new(),
        stderr: Vec::new(),
    };
    let spawned_at = Instant::now();
    for i in 0..params.consumers {
        let mut child = Command::new(python)
            .arg("-c")
            .arg(CONFLUENT_SCRIPT)
            .arg(&spec)
            .env_remove("LD_LIBRARY_PATH")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting share consumer process {i} ({})", python.display()))?;
        let stdout = child.stdout.take().context("consumer stdout")?;
        let stderr = child.stderr.take().context("consumer stderr")?;
        let tail = Arc::new(std::sync::Mutex::new(std::collections::VecDeque::new()));
        children.procs.push(child);
        children.stderr.push(Arc::clone(&tail));
        let tx = tx.clone();
        thread::Builder::new()
            .name(format!("confluent-out-{i}"))
            .spawn(move || {
                let mut r = std::io::BufReader::new(stdout);
                let mut buf = Vec::new();
                loop {
                    buf.clear();
                    let ev = match r.by_ref().take(MAX_CHILD_LINE).read_until(b'\n', &mut buf) {
                        Ok(0) => ChildEvent::Eof,
                        Ok(_) if buf.last() != Some(&b'\n') && buf.len() as u64 >= MAX_CHILD_LINE => {
                            ChildEvent::Unreadable(format!(
                                "an output line longer than {MAX_CHILD_LINE} bytes"
                            ))
                        }
                        Ok(_) => {
                            let line = String::from_utf8_lossy(&buf);
                            let line = line.trim();
                            if line.is_empty() {
                                continue;
                            }
                            parse_child_line(line)
                        }
                        Err(e) => ChildEvent::Unreadable(format!("reading its output: {e}")),
                    };
                    let end = matches!(ev, ChildEvent::Eof | ChildEvent::Unreadable(_));
                    if tx.send((i, ev)).is_err() || end {
                        break;
                    }
                }
            })
            .context("spawning a consumer output reader")?;
        thread::Builder::new()
            .name(format!("confluent-err-{i}"))
            .spawn(move || {
                for line in std::io::BufReader::new(stderr).lines() {
                    let Ok(line) = line else { break };
                    // librdkafka's warning that its share consumer is a preview, on every start.
                    if line.contains("is in \"Preview\"") {
                        continue;
                    }
                    let mut t = tail.lock().unwrap_or_else(|e| e.into_inner());
                    if t.len() >= CHILD_STDERR_LINES {
                        t.pop_front();
                    }
                    t.push_back(line);
                }
            })
            .context("spawning a consumer stderr reader")?;
    }
    drop(tx);
    let pids: Vec<u32> = children.procs.iter().map(std::process::Child::id).collect();

    let bar = progress_bar(show_progress, "share drain", params.backlog.messages);
    let timeout = params.backlog.timeout();
    let mut accepted: Vec<(i32, i64)> = Vec::with_capacity(params.backlog.messages as usize);
    let mut per_consumer = vec![0u64; params.consumers];
    let mut client = None;
    let mut errors: Vec<String> = Vec::new();
    let (mut acquired, mut polls, mut redeliveries) = (0u64, 0u64, 0u64);
    // The confluent-kafka clients are other processes: their page faults are not counted.
    let cpu_now = || CpuMark {
        at: Instant::now(),
        client: cpu_of(&pids),
        broker: broker_pid.and_then(|p| cpu_seconds(Some(p))),
        client_faults: None,
        broker_faults: None,
    };
    let mut start: Option<CpuMark> = None;
    let mut end: Option<CpuMark> = None;
    let mut last_progress = Instant::now();
    let mut ended = vec![false; params.consumers];
    loop {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok((i, ev)) => match ev {
                ChildEvent::Ready(c) => {
                    client.get_or_insert(c);
                }
                ChildEvent::Acquired { n, redelivered } => {
                    if start.is_none() {
                        start = Some(cpu_now());
                        last_progress = Instant::now();
                    }
                    acquired += n;
                    polls += 1;
                    redeliveries += redelivered;
                }
                ChildEvent::Acked { partition, offsets } => {
                    let n = offsets.len() as u64;
                    if let Some(c) = per_consumer.get_mut(i) {
                        *c += n;
                    }
                    accepted.extend(offsets.into_iter().map(|o| (partition, o)));
                    bar.inc(n);
                    last_progress = Instant::now();
                }
                ChildEvent::AckFailed {
                    partition,
                    count,
                    error,
                } => note_error(
                    &mut errors,
                    format!("consumer {i}: acknowledgement of {count} records of partition {partition} failed: {error}"),
                ),
                ChildEvent::Error(e) => {
                    if end.is_none() {
                        note_error(&mut errors, format!("consumer {i}: {e}"));
                    }
                }
                ChildEvent::Closed => {}
                ChildEvent::Unreadable(e) => {
                    bail!("share consumer process {i}: {e}\n{}", children.stderr_tail(i));
                }
                ChildEvent::Eof => {
                    if let Some(x) = ended.get_mut(i) {
                        *x = true;
                    }
                    if end.is_none() {
                        // Give its stderr reader a moment to collect the last lines.
                        thread::sleep(Duration::from_millis(200));
                        bail!(
                            "share consumer process {i} exited before the drain ended ({} of {} records \
                             accepted); its stderr:\n{}",
                            accepted.len(),
                            params.backlog.messages,
                            children.stderr_tail(i)
                        );
                    }
                }
            },
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
        if end.is_none() && accepted.len() as u64 >= params.backlog.messages {
            end = Some(cpu_now());
            // The consumers close (and leave) at EOF on stdin.
            children.close_stdin();
        }
        match end {
            None if last_progress.elapsed() > timeout => bail!(
                "no acceptance confirmed for {timeout:?}: {} of {} records accepted, {acquired} acquired; \
                 client errors: {errors:?}; stderr of consumer 0:\n{}",
                accepted.len(),
                params.backlog.messages,
                children.stderr_tail(0)
            ),
            Some(e) if e.at.elapsed() > CHILD_CLOSE_TIMEOUT => {
                let open: Vec<usize> = (0..ended.len())
                    .filter(|i| !ended.get(*i).copied().unwrap_or(true))
                    .collect();
                bail!("share consumer processes {open:?} did not close within {CHILD_CLOSE_TIMEOUT:?}");
            }
            _ => {}
        }
    }
    bar.finish_and_clear();
    // Every output has ended: reap the processes (bounded).
    let deadline = Instant::now() + CHILD_CLOSE_TIMEOUT;
    for (i, c) in children.procs.iter_mut().enumerate() {
        loop {
            match c.try_wait().context("waiting for a consumer process")? {
                Some(s) if s.success() => break,
                Some(s) => {
                    note_error(&mut errors, format!("consumer {i} exited with {s}"));
                    break;
                }
                None if Instant::now() >= deadline => bail!("share consumer process {i} does not exit"),
                None => thread::sleep(Duration::from_millis(10)),
            }
        }
    }
    let (Some(start), Some(end)) = (start, end) else {
        bail!("the confluent-kafka drain never started or never ended");
    };
    let n = accepted.len() as u64;
    let secs = end.at.saturating_duration_since(start.at).as_secs_f64();
    let cpu = PhaseCpu::between(&start, Some(end), None, n);
    let figures = ConfluentFigures {
        client,
        startup_secs: start.at.saturating_duration_since(spawned_at).as_secs_f64(),
        polls_with_records: polls,
        mean_poll_batch: div_or_zero(acquired as f64, polls as f64),
        per_consumer_accepted: per_consumer,
        client_errors: errors,
    };
    let result = ShareDrain::new(params, (n, acquired, redeliveries), secs, figures, cpu);
    Ok((result, accepted))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kafka_wire::{encode_batch_at, record};
    use bytes::BytesMut;
    use kafka_protocol::messages::share_acknowledge_response::{
        PartitionData as AckPartition, ShareAcknowledgeTopicResponse,
    };
    use kafka_protocol::messages::share_fetch_response::{
        AcquiredRecords, PartitionData, ShareFetchableTopicResponse,
    };
    use kafka_protocol::records::Compression;

    fn batch(base: i64, values: &[&[u8]]) -> Bytes {
        let records: Vec<_> = values.iter().map(|v| record(None, Some(v), 0)).collect();
        encode_batch_at(base, &records, Compression::None)
    }

    fn part(p: i32, ranges: &[(i64, i64, i16)], records: Option<Bytes>) -> PartitionData {
        PartitionData::default()
            .with_partition_index(p)
            .with_records(records)
            .with_acquired_records(
                ranges
                    .iter()
                    .map(|(a, b, n)| {
                        AcquiredRecords::default()
                            .with_first_offset(*a)
                            .with_last_offset(*b)
                            .with_delivery_count(*n)
                    })
                    .collect(),
            )
    }

    fn answer(topic: Uuid, parts: Vec<PartitionData>) -> ShareFetchResponse {
        ShareFetchResponse::default().with_responses(vec![ShareFetchableTopicResponse::default()
            .with_topic_id(topic)
            .with_partitions(parts)])
    }

    #[test]
    fn batches_split_without_decoding_and_a_torn_tail_is_dropped() {
        let v: &[u8] = b"xy";
        let a = batch(0, &[v, v, v]);
        let b = batch(3, &[v]);
        let mut all = BytesMut::new();
        all.extend_from_slice(&a);
        all.extend_from_slice(&b);
        all.extend_from_slice(&a[..10]);
        let split = split_batches(&all.freeze()).unwrap();
        let got: Vec<(i64, i64, usize)> = split.iter().map(|(x, y, z)| (*x, *y, z.len())).collect();
        assert_eq!(got, vec![(0, 2, a.len()), (3, 3, b.len())]);
        let mut bad = BytesMut::from(&a[..]);
        bad[16] = 1;
        assert!(split_batches(&bad.freeze()).is_err());
        assert!(split_batches(&Bytes::new()).unwrap().is_empty());
        // Only the batch holding the acquired offset is decoded: a broken batch elsewhere is not
        // looked at.
        let mut mixed = BytesMut::new();
        mixed.extend_from_slice(&a);
        let mut broken = BytesMut::from(&b[..]);
        broken[22] = 0x07; // attributes: compression codec 7 does not exist
        mixed.extend_from_slice(&broken);
        let mixed = mixed.freeze();
        assert!(check_records(Some(&mixed), &[1, 2], 2).is_ok());
        assert!(check_records(Some(&mixed), &[3], 2).is_err());
    }

    #[test]
    fn ack_ranges_coalesce_contiguous_offsets() {
        assert_eq!(ack_ranges(&[]), vec![]);
        assert_eq!(ack_ranges(&[5]), vec![(5, 5)]);
        assert_eq!(ack_ranges(&[7, 3, 4, 5, 9, 10, 4]), vec![(3, 5), (7, 7), (9, 10)]);
    }

    #[test]
    fn fetch_plan_adds_acks_and_forgets() {
        let set = |v: &[i32]| v.iter().copied().collect::<BTreeSet<i32>>();
        // First fetch: everything assigned is named.
        let p = plan_fetch(&set(&[]), &set(&[0, 2]), &BTreeMap::new());
        assert_eq!((p.named, p.forget), (vec![0, 2], vec![]));
        // Steady: only partitions with acknowledgements.
        let pending: BTreeMap<i32, Vec<i64>> = [(2, vec![1, 2])].into_iter().collect();
        let p = plan_fetch(&set(&[0, 2]), &set(&[0, 2]), &pending);
        assert_eq!((p.named, p.forget), (vec![2], vec![]));
        // Partition 0 no longer assigned and nothing to acknowledge there: forgotten; 3 added.
        let p = plan_fetch(&set(&[0, 2]), &set(&[2, 3]), &pending);
        assert_eq!((p.named, p.forget), (vec![2, 3], vec![0]));
    }

    #[test]
    fn fetch_answer_is_checked_against_its_records() {
        let t = Uuid::from_u128(7);
        let v: &[u8] = b"abcd";
        let recs = batch(10, &[v, v, v, v]);
        let ok = answer(t, vec![part(1, &[(10, 11, 1), (13, 13, 2)], Some(recs.clone()))]);
        let a = read_fetch_answer(&ok, t, &[], 4).unwrap();
        assert_eq!(a.records, 3);
        assert_eq!((a.first_deliveries, a.redeliveries), (2, 1));
        assert_eq!(a.acquired.get(&1), Some(&vec![10, 11, 13]));

        // Wrong size, an offset outside the batches, another topic, a reversed range.
        assert!(read_fetch_answer(&ok, t, &[], 5).is_err());
        let outside = answer(t, vec![part(1, &[(13, 14, 1)], Some(recs.clone()))]);
        assert!(read_fetch_answer(&outside, t, &[], 4).is_err());
        assert!(read_fetch_answer(&ok, Uuid::from_u128(8), &[], 4).is_err());
        let reversed = answer(t, vec![part(1, &[(12, 11, 1)], Some(recs.clone()))]);
        assert!(read_fetch_answer(&reversed, t, &[], 4).is_err());
        let huge = answer(t, vec![part(1, &[(0, i64::MAX, 1)], Some(recs.clone()))]);
        assert!(read_fetch_answer(&huge, t, &[], 4).is_err());

        // Acknowledgements: confirmed only by the partition's code 0, and the partition must be
        // in the answer.
        let acked = answer(t, vec![part(2, &[], None)]);
        assert!(read_fetch_answer(&acked, t, &[2], 4).is_ok());
        assert!(read_fetch_answer(&acked, t, &[2, 3], 4).is_err());
        let refused = answer(
            t,
            vec![part(2, &[], None).with_acknowledge_error_code(ResponseError::InvalidRecordState.code())],
        );
        let e = read_fetch_answer(&refused, t, &[2], 4).unwrap_err();
        assert!(format!("{e:#}").contains("InvalidRecordState"), "{e:#}");
        // The ack error of a partition the request did not acknowledge in is not ours to judge,
        // but a fetch error is.
        let errored = answer(t, vec![part(2, &[], None).with_error_code(3)]);
        assert!(read_fetch_answer(&errored, t, &[], 4).is_err());
        let top = ShareFetchResponse::default().with_error_code(ResponseError::GroupIdNotFound.code());
        assert!(read_fetch_answer(&top, t, &[], 4).is_err());
    }

    #[test]
    fn acknowledge_answer_needs_code_zero_for_every_partition() {
        let t = Uuid::from_u128(7);
        let resp = |codes: &[(i32, i16)]| {
            ShareAcknowledgeResponse::default().with_responses(vec![ShareAcknowledgeTopicResponse::default()
                .with_topic_id(t)
                .with_partitions(
                    codes
                        .iter()
                        .map(|(p, c)| {
                            AckPartition::default()
                                .with_partition_index(*p)
                                .with_error_code(*c)
                        })
                        .collect(),
                )])
        };
        assert!(read_acknowledge_answer(&resp(&[(0, 0), (1, 0)]), t, &[0, 1]).is_ok());
        assert!(read_acknowledge_answer(&resp(&[(0, 0)]), t, &[0, 1]).is_err());
        assert!(read_acknowledge_answer(&resp(&[(0, 0), (1, 1)]), t, &[0, 1]).is_err());
        assert!(read_acknowledge_answer(&resp(&[]), t, &[]).is_ok());
    }

    #[test]
    fn verification_finds_missing_duplicate_and_unknown() {
        let p = vec![(0, 0), (0, 1), (1, 0)];
        assert!(verify(&p, &[(1, 0), (0, 1), (0, 0)]).is_ok());
        let e = verify(&p, &[(0, 0), (0, 0), (2, 0)]).unwrap_err();
        assert!(
            e.contains("2 never") && e.contains("1 accepted twice") && e.contains("1 accepted but not"),
            "{e}"
        );
        assert!(verify(&[(0, 0), (0, 0)], &[(0, 0)]).is_err());
    }

    #[test]
    fn consumer_process_lines_parse() {
        assert!(matches!(parse_child_line(r#"{"ready":"ck 2.16"}"#), ChildEvent::Ready(c) if c == "ck 2.16"));
        assert!(matches!(
            parse_child_line(r#"{"acq":5,"redelivered":1}"#),
            ChildEvent::Acquired { n: 5, redelivered: 1 }
        ));
        match parse_child_line(r#"{"p":2,"o":[7,8]}"#) {
            ChildEvent::Acked { partition, offsets } => assert_eq!((partition, offsets), (2, vec![7, 8])),
            _ => panic!("not an acknowledgement"),
        }
        assert!(matches!(
            parse_child_line(r#"{"p":2,"o":[7],"err":"boom"}"#),
            ChildEvent::AckFailed {
                partition: 2,
                count: 1,
                ..
            }
        ));
        assert!(matches!(
            parse_child_line(r#"{"error":"x"}"#),
            ChildEvent::Error(_)
        ));
        assert!(matches!(
            parse_child_line(r#"{"closed":true}"#),
            ChildEvent::Closed
        ));
        for bad in [
            "nope",
            r#"{"p":99999999999,"o":[]}"#,
            r#"{"p":1,"o":["a"]}"#,
            r#"{"what":1}"#,
        ] {
            assert!(
                matches!(parse_child_line(bad), ChildEvent::Unreadable(_)),
                "{bad}"
            );
        }
    }

    #[test]
    fn parameters_are_checked() {
        let ok = ShareParams {
            backlog: crate::queue_workload::tests::backlog(),
            group: "g".into(),
            consumers: 8,
            max_records: 100,
            max_wait_ms: 100,
            fetch_max_bytes: DEFAULT_FETCH_MAX_BYTES,
        };
        assert!(ok.validate().is_ok());
        assert!(ShareParams {
            max_records: 0,
            ..ok.clone()
        }
        .validate()
        .is_err());
        assert!(ShareParams { consumers: 0, ..ok }.validate().is_err());
    }
}
