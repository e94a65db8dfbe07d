//! A shard: one thread, one glommio executor, the partitions it owns and their storage.
//!
//! Architecture invariant: a partition's log is touched only by its owning shard
//! ([`crate::metadata::owner_shard`]). Other shards reach it through [`ShardRequest`]s over the
//! router. Per-shard state is deliberately not `Send` (`Rc`, `RefCell`).

pub(crate) mod ops;
pub(crate) mod router;
pub(crate) mod service;
pub(crate) mod tasks;

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::{join_all, LocalBoxFuture};
use futures::{FutureExt, StreamExt};
use kafka_protocol::ResponseError;
use strand_protocol::types::{ShardId, TopicId};
use strand_storage::fs_glommio::GlommioFs;
use strand_storage::producer::ProducerError;
use strand_storage::{LogConfig, LogId, LogKey, ReadData, ShardStore, StorageError};

use self::ops::{
    EpochAnswer, EpochQuery, FetchOutcome, FetchPart, ListOffsetsOutcome, ListOffsetsPart, PartRef,
    ProduceOutcome, ProducePart, Records, ShardRequest, ShardResponse, WaitPart,
};
use self::router::{Router, RouterError};
use self::service::Registry;
use crate::clock::Clock;
use crate::config::{Config, LogSettings, TimestampType};
use crate::metadata::{owner_shard, ClusterMetadata, MetadataDelta, TopicMeta};
use crate::metrics::ShardMetrics;

/// Smallest run of a partition's records a Fetch answer sends straight from the segment file
/// (`strand.fetch.sendfile`); shorter ones are copied, which costs less than a system call
/// more.
pub(crate) const SENDFILE_MIN_BYTES: usize = 64 << 10;

/// Segment reads of one Fetch a shard runs at once (see [`Shard::read_partitions`]).
const FETCH_READS_IN_FLIGHT: usize = 8;

/// The leader epoch of every partition on a single node. Raft terms replace it later.
pub(crate) const LEADER_EPOCH: i32 = 0;

/// A partition this shard owns.
pub(crate) struct LocalPartition {
    pub(crate) log: LogId,
    pub(crate) topic_id: TopicId,
}

/// Effective settings of a topic, kept per shard so the produce path need not recompute them.
#[derive(Clone)]
pub(crate) struct TopicRuntime {
    pub(crate) settings: LogSettings,
}

/// An advertised Kafka listener.
#[derive(Clone, Debug)]
pub(crate) struct AdvertisedListener {
    pub(crate) host: String,
    pub(crate) port: u16,
}

/// The name at `index` of a request's [`crate::shard::ops::TopicTable`] ("" if out of range, which
/// no partition has).
fn topic_name(topics: &[Arc<str>], index: u32) -> &str {
    topics.get(index as usize).map_or("", |t| t)
}

/// A map for lookups on the data path (a Fetch looks up every partition it names, on every
/// request): foldhash, seeded per map, instead of SipHash.
type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

pub(crate) struct Shard {
    pub(crate) id: ShardId,
    pub(crate) shards: u16,
    pub(crate) config: Rc<Config>,
    pub(crate) clock: Rc<dyn Clock>,
    pub(crate) store: ShardStore<GlommioFs>,
    metadata: RefCell<Rc<ClusterMetadata>>,
    topic_runtime: RefCell<HashMap<String, TopicRuntime>>,
    partitions: RefCell<FastMap<String, FastMap<i32, LocalPartition>>>,
    pub(crate) router: Rc<Router>,
    pub(crate) metrics: ShardMetrics,
    pub(crate) listeners: Rc<Vec<AdvertisedListener>>,
    pub(crate) shutting_down: Cell<bool>,
    /// The subsystems' services and hooks on this shard (see [`service`]).
    registry: Registry,
}

impl Shard {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        id: ShardId,
        shards: u16,
        config: Rc<Config>,
        clock: Rc<dyn Clock>,
        store: ShardStore<GlommioFs>,
        metadata: ClusterMetadata,
        router: Rc<Router>,
        listeners: Rc<Vec<AdvertisedListener>>,
    ) -> Self {
        let runtime = metadata
            .topics()
            .map(|t| {
                (
                    t.name.clone(),
                    TopicRuntime {
                        settings: t.config.log_settings(&config),
                    },
                )
            })
            .collect();
        Shard {
            id,
            shards,
            metrics: ShardMetrics::new(id),
            config,
            clock,
            store,
            metadata: RefCell::new(Rc::new(metadata)),
            topic_runtime: RefCell::new(runtime),
            partitions: RefCell::new(FastMap::default()),
            router,
            listeners,
            shutting_down: Cell::new(false),
            registry: Registry::default(),
        }
    }

    /// This shard's metadata replica (a snapshot; cheap to clone).
    pub(crate) fn metadata(&self) -> Rc<ClusterMetadata> {
        self.metadata.borrow().clone()
    }

    pub(crate) fn topic_settings(&self, topic: &str) -> Option<LogSettings> {
        self.topic_runtime.borrow().get(topic).map(|t| t.settings.clone())
    }

    pub(crate) fn owner(&self, topic: &str, partition: i32) -> ShardId {
        owner_shard(topic, partition, self.shards)
    }

    pub(crate) fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    fn log_of(&self, part: &PartRef) -> Option<LogId> {
        self.partitions
            .borrow()
            .get(part.topic.as_str())
            .and_then(|m| m.get(&part.partition))
            .map(|p| p.log)
    }

    /// The logs of `parts` (an index into `topics`, a partition), in order: `None` for a
    /// partition this shard does not own. Consecutive partitions of one topic look the topic
    /// up once: a Fetch names a topic's partitions together, up to all of them, on every
    /// request.
    fn logs_of(&self, topics: &[Arc<str>], parts: impl Iterator<Item = (u32, i32)>) -> Vec<Option<LogId>> {
        let map = self.partitions.borrow();
        let mut last: Option<(u32, Option<&FastMap<i32, LocalPartition>>)> = None;
        parts
            .map(|(topic, partition)| {
                let of_topic = match last {
                    Some((t, of_topic)) if t == topic => of_topic,
                    _ => {
                        let of_topic = map.get(topic_name(topics, topic));
                        last = Some((topic, of_topic));
                        of_topic
                    }
                };
                of_topic.and_then(|m| m.get(&partition)).map(|p| p.log)
            })
            .collect()
    }

    /// The log of a partition this shard owns.
    pub(crate) fn log_for(&self, topic: &str, partition: i32) -> Option<LogId> {
        self.partitions
            .borrow()
            .get(topic)
            .and_then(|m| m.get(&partition))
            .map(|p| p.log)
    }

    /// Calls `f` with every durable batch of `log`, from its start, in order (internal readers:
    /// group state at start-up). Reads a megabyte at a time.
    pub(crate) async fn for_each_batch(
        &self,
        log: LogId,
        mut f: impl FnMut(&bytes::Bytes),
    ) -> Result<(), StorageError> {
        let mut next = self.store.offsets(log)?.log_start_offset;
        loop {
            let Some(plan) = self.store.plan_read(log, next, 1 << 20)? else {
                return Ok(());
            };
            let bytes = plan.execute().await?;
            if bytes.is_empty() {
                return Ok(());
            }
            let mut pos = 0usize;
            for b in strand_protocol::batch::BatchScanner::new(&bytes, false) {
                let end = b.position + b.header.total_bytes();
                f(&bytes.slice(b.position..end));
                next = b.header.next_offset();
                pos = end;
            }
            if pos == 0 {
                return Ok(());
            }
        }
    }

    /// Number of partitions this shard owns.
    pub(crate) fn partition_count(&self) -> usize {
        self.partitions.borrow().values().map(|m| m.len()).sum()
    }

    /// Sends `req` to the owner shard (or starts it here) and returns the answer's future. Calls
    /// made one after another reach each owner in that order.
    pub(crate) async fn dispatch(
        self: &Rc<Self>,
        owner: ShardId,
        req: ShardRequest,
    ) -> Result<LocalBoxFuture<'static, Result<ShardResponse, RouterError>>, RouterError> {
        if owner == self.id {
            let fut = self.start(req);
            Ok(async move { Ok(fut.await) }.boxed_local())
        } else {
            let fut = self.router.start_call(owner, req).await?;
            Ok(fut.boxed_local())
        }
    }

    /// Starts a request on this shard. Side effects that must follow arrival order (appends)
    /// happen before this returns; the returned future finishes the work.
    pub(crate) fn start(self: &Rc<Self>, req: ShardRequest) -> LocalBoxFuture<'static, ShardResponse> {
        match req {
            ShardRequest::Produce { parts, wait, arrived } => self.start_produce(parts, wait, arrived),
            ShardRequest::Fetch {
                topics,
                parts,
                max_bytes,
                regions,
            } => {
                let me = self.clone();
                async move {
                    ShardResponse::Fetch(me.read_partitions(&topics, &parts, max_bytes, regions).await)
                }
                .boxed_local()
            }
            ShardRequest::WaitForData {
                topics,
                parts,
                timeout_ms,
            } => {
                let me = self.clone();
                async move {
                    me.wait_for_data(&topics, &parts, Duration::from_millis(timeout_ms))
                        .await;
                    ShardResponse::DataReady
                }
                .boxed_local()
            }
            ShardRequest::ListOffsets(parts) => {
                let me = self.clone();
                async move { ShardResponse::ListOffsets(me.list_offsets(parts).await) }.boxed_local()
            }
            ShardRequest::DeleteRecords(parts) => {
                let me = self.clone();
                async move { ShardResponse::DeleteRecords(me.delete_records(parts).await) }.boxed_local()
            }
            ShardRequest::EpochEndOffsets(qs) => {
                let answers = self.epoch_end_offsets(qs);
                async move { ShardResponse::EpochEndOffsets(answers) }.boxed_local()
            }
            ShardRequest::PrepareMetadata(deltas) => {
                let me = self.clone();
                async move { ShardResponse::Applied(me.prepare_metadata(&deltas).await) }.boxed_local()
            }
            ShardRequest::CommitMetadata(deltas) => {
                self.commit_metadata(&deltas);
                for h in self.registry.hooks() {
                    h.metadata_committed(&deltas);
                }
                async move { ShardResponse::Applied(Vec::new()) }.boxed_local()
            }
            ShardRequest::Service(call) => self.start_service(call),
        }
    }

    fn start_produce(
        self: &Rc<Self>,
        parts: Vec<ProducePart>,
        wait: bool,
        arrived: Option<Instant>,
    ) -> LocalBoxFuture<'static, ShardResponse> {
        let now = self.now_ms();
        let mut started = Vec::with_capacity(parts.len());
        for p in &parts {
            // Every append made for a client (Produce, a queue's dead letters) passes here; the
            // broker's own writes to internal topics go to the store directly.
            if let Some(m) = crate::internal_topics::refuse_client_append(&p.part.topic) {
                started.push(Err(ProduceOutcome::error(
                    ResponseError::InvalidTopicException,
                    Some(m),
                )));
                continue;
            }
            let Some(log) = self.log_of(&p.part) else {
                started.push(Err(ProduceOutcome::error(
                    ResponseError::UnknownTopicOrPartition,
                    None,
                )));
                continue;
            };
            let append_time = self
                .topic_runtime
                .borrow()
                .get(p.part.topic.as_str())
                .is_some_and(|t| t.settings.timestamp_type == TimestampType::LogAppendTime);
            // LogAppendTime topics get the broker's clock in the batch (header and CRC only).
            let stamped;
            let records: &[u8] = if append_time {
                let mut copy = p.records.to_vec();
                strand_protocol::batch::set_log_append_time(&mut copy, now);
                stamped = copy;
                &stamped
            } else {
                &p.records
            };
            match self.store.append(log, records, LEADER_EPOCH, now) {
                Ok(ticket) => {
                    self.metrics.bytes_in(p.records.len());
                    started.push(Ok((ticket, append_time)));
                }
                Err(e) => started.push(Err(ProduceOutcome::error(
                    storage_error_code(&e),
                    Some(e.to_string()),
                ))),
            }
        }
        let staged = Instant::now();
        if let Some(a) = arrived {
            self.metrics.produce_staged(staged.saturating_duration_since(a));
        }
        let me = self.clone();
        async move {
            let mut out = Vec::with_capacity(started.len());
            let waited = wait && started.iter().any(Result::is_ok);
            for s in started {
                out.push(match s {
                    Err(o) => o,
                    Ok((ticket, append_time)) => {
                        if wait {
                            if let Err(e) = me.store.wait_durable(&ticket).await {
                                out.push(ProduceOutcome::error(storage_error_code(&e), Some(e.to_string())));
                                continue;
                            }
                        }
                        ProduceOutcome {
                            error: 0,
                            message: None,
                            base_offset: ticket.info.base_offset,
                            log_append_time_ms: if append_time { now } else { -1 },
                            log_start_offset: ticket.info.log_start_offset,
                        }
                    }
                });
            }
            if arrived.is_some() && waited {
                me.metrics.produce_durable(staged.elapsed());
            }
            ShardResponse::Produce(out)
        }
        .boxed_local()
    }

    /// Reads each partition from its fetch offset: whole batches, at most `max_bytes` in total
    /// (but the first non-empty partition always gets at least one batch, KIP-74).
    ///
    /// Every read is planned first, in order, and reserves from `max_bytes` the most it can
    /// return; then up to [`FETCH_READS_IN_FLIGHT`] reads run at once, so that a Fetch over
    /// many partitions whose data is on the disk keeps several reads in flight instead of
    /// waiting for each in turn. A partition whose reservation was cut short is marked `cut`,
    /// as before, so the caller can read it again with what the others left.
    pub(crate) async fn read_partitions(
        &self,
        topics: &[Arc<str>],
        parts: &[FetchPart],
        max_bytes: usize,
        regions: bool,
    ) -> Vec<FetchOutcome> {
        let mut remaining = max_bytes;
        let mut out = Vec::with_capacity(parts.len());
        let mut plans = Vec::new();
        let logs = self.logs_of(topics, parts.iter().map(|p| (p.topic, p.partition)));
        for (p, log) in parts.iter().zip(logs) {
            let Some(log) = log else {
                out.push(FetchOutcome::error(ResponseError::UnknownTopicOrPartition));
                continue;
            };
            if let Some(e) = check_leader_epoch(p.current_leader_epoch) {
                out.push(FetchOutcome::error(e));
                continue;
            }
            let Ok(offsets) = self.store.offsets(log) else {
                out.push(FetchOutcome::error(ResponseError::UnknownTopicOrPartition));
                continue;
            };
            let mut outcome = FetchOutcome {
                error: 0,
                high_watermark: offsets.high_watermark,
                last_stable_offset: offsets.high_watermark,
                log_start_offset: offsets.log_start_offset,
                records: None,
                cut: false,
            };
            let budget = p.max_bytes.min(remaining);
            let first_data = remaining == max_bytes;
            outcome.cut = budget < p.max_bytes && p.fetch_offset < offsets.high_watermark;
            if budget == 0 && !first_data {
                out.push(outcome);
                continue;
            }
            match self.store.plan_read(log, p.fetch_offset, budget.max(1)) {
                Ok(None) => {}
                Ok(Some(plan)) => {
                    remaining = remaining.saturating_sub(plan.max_len());
                    plans.push((out.len(), plan));
                }
                Err(StorageError::OffsetOutOfRange { .. }) => {
                    outcome.error = ResponseError::OffsetOutOfRange.code();
                }
                Err(e) => outcome = FetchOutcome::error(storage_error_code(&e)),
            }
            out.push(outcome);
        }
        let sendfile = regions && self.config.fetch_sendfile;
        let reads = futures::stream::iter(plans.into_iter().map(|(i, plan)| async move {
            let read = if sendfile {
                plan.execute_sendable(SENDFILE_MIN_BYTES).await
            } else {
                plan.execute().await.map(ReadData::Bytes)
            };
            (i, read)
        }))
        .buffer_unordered(FETCH_READS_IN_FLIGHT)
        .collect::<Vec<_>>()
        .await;
        for (i, read) in reads {
            let Some(outcome) = out.get_mut(i) else { continue };
            match read {
                Ok(read) if read.is_empty() => {}
                Ok(ReadData::Bytes(bytes)) => outcome.records = Some(Records::Bytes(bytes)),
                Ok(ReadData::Region(region)) => outcome.records = Some(Records::Region(Arc::new(region))),
                Err(e) => {
                    if let Some(p) = parts.get(i) {
                        tracing::error!(topic = topic_name(topics, p.topic), partition = p.partition, error = %e, "read failed");
                    }
                    *outcome = FetchOutcome::error(ResponseError::KafkaStorageError);
                }
            }
        }
        out
    }

    /// Waits until one of the partitions has data at or past its offset, or the timeout. A
    /// partition this shard does not own (or whose log has closed) ends the wait at once: the
    /// Fetch's next read reports it.
    pub(crate) async fn wait_for_data(&self, topics: &[Arc<str>], parts: &[WaitPart], timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let logs = self.logs_of(topics, parts.iter().map(|p| (p.topic, p.partition)));
        loop {
            let wait = self.store.durable_notify().wait();
            let ready = parts.iter().zip(&logs).any(|(p, log)| match log {
                Some(log) => self
                    .store
                    .offsets(*log)
                    .map_or(true, |o| o.high_watermark > p.offset),
                None => true,
            });
            if ready || self.shutting_down.get() {
                return;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            let timer = glommio::timer::sleep(left);
            futures::pin_mut!(wait);
            futures::pin_mut!(timer);
            if let futures::future::Either::Right(_) = futures::future::select(wait, timer).await {
                return;
            }
        }
    }

    async fn list_offsets(&self, parts: Vec<ListOffsetsPart>) -> Vec<ListOffsetsOutcome> {
        let mut out = Vec::with_capacity(parts.len());
        for p in parts {
            let error = |e: ResponseError| ListOffsetsOutcome {
                error: e.code(),
                timestamp: -1,
                offset: -1,
                leader_epoch: -1,
            };
            let Some(log) = self.log_of(&p.part) else {
                out.push(error(ResponseError::UnknownTopicOrPartition));
                continue;
            };
            if let Some(e) = check_leader_epoch(p.current_leader_epoch) {
                out.push(error(e));
                continue;
            }
            let Ok(o) = self.store.offsets(log) else {
                out.push(error(ResponseError::UnknownTopicOrPartition));
                continue;
            };
            let found = |timestamp: i64, offset: i64| ListOffsetsOutcome {
                error: 0,
                timestamp,
                offset,
                leader_epoch: LEADER_EPOCH,
            };
            out.push(match p.timestamp {
                // Latest, and latest-tiered (KIP-1005; nothing is tiered, so the same).
                -1 | -6 => found(-1, o.high_watermark),
                // Earliest, earliest-local (KIP-1005).
                -2 | -4 => found(-1, o.log_start_offset),
                // Earliest pending upload (KIP-1023): nothing is pending.
                -5 => found(-1, -1),
                ts if ts == -3 || ts >= 0 => match self.store.timestamp_plan(log, ts) {
                    Ok(None) => found(-1, -1),
                    Ok(Some(plan)) => match plan.execute().await {
                        Ok(Some((offset, timestamp))) => found(timestamp, offset),
                        Ok(None) => found(-1, -1),
                        Err(e) => error(storage_error_code(&e)),
                    },
                    Err(e) => error(storage_error_code(&e)),
                },
                _ => error(ResponseError::InvalidRequest),
            });
        }
        out
    }

    async fn delete_records(&self, parts: Vec<(PartRef, i64)>) -> Vec<(i16, i64)> {
        let mut out = Vec::with_capacity(parts.len());
        for (p, offset) in parts {
            // Kafka's `ReplicaManager.deleteRecordsOnLocalLog`: INVALID_TOPIC_EXCEPTION.
            if let Some(m) = crate::internal_topics::refuse_delete_records(&p.topic) {
                tracing::warn!(partition = p.partition, "DeleteRecords refused: {m}");
                out.push((ResponseError::InvalidTopicException.code(), -1));
                continue;
            }
            let Some(log) = self.log_of(&p) else {
                out.push((ResponseError::UnknownTopicOrPartition.code(), -1));
                continue;
            };
            let target = if offset == -1 {
                match self.store.offsets(log) {
                    Ok(o) => o.high_watermark,
                    Err(e) => {
                        out.push((storage_error_code(&e).code(), -1));
                        continue;
                    }
                }
            } else {
                offset
            };
            match self.store.delete_records(log, target).await {
                Ok(low) => out.push((0, low)),
                Err(e) => out.push((storage_error_code(&e).code(), -1)),
            }
        }
        out
    }

    fn epoch_end_offsets(&self, qs: Vec<EpochQuery>) -> Vec<EpochAnswer> {
        qs.into_iter()
            .map(|q| {
                let fail = |e: ResponseError| EpochAnswer {
                    error: e.code(),
                    leader_epoch: -1,
                    end_offset: -1,
                };
                let Some(log) = self.log_of(&q.part) else {
                    return fail(ResponseError::UnknownTopicOrPartition);
                };
                if let Some(e) = check_leader_epoch(q.current_leader_epoch) {
                    return fail(e);
                }
                match self.store.with_log(log, |l| {
                    (l.end_offset_for_epoch(q.leader_epoch), l.high_watermark())
                }) {
                    // No batch with an epoch at or below the one asked for: Kafka answers
                    // UNDEFINED_EPOCH (-1) and UNDEFINED_EPOCH_OFFSET (-1).
                    Ok((None, _)) => EpochAnswer {
                        error: 0,
                        leader_epoch: -1,
                        end_offset: -1,
                    },
                    Ok((Some((epoch, end)), hw)) => EpochAnswer {
                        error: 0,
                        leader_epoch: epoch,
                        end_offset: end.min(hw),
                    },
                    Err(e) => fail(storage_error_code(&e)),
                }
            })
            .collect()
    }

    /// The storage settings of a topic as a storage `LogConfig`.
    pub(crate) fn log_config(settings: &LogSettings) -> LogConfig {
        let deletes = settings.cleanup_policy.deletes();
        LogConfig {
            segment_bytes: settings.segment_bytes,
            segment_ms: settings.segment_ms,
            retention_ms: if deletes { settings.retention_ms } else { None },
            retention_bytes: if deletes { settings.retention_bytes } else { None },
            index_interval_bytes: settings.index_interval_bytes,
            max_index_entries: (settings.segment_index_bytes / 8).max(1) as usize,
        }
    }

    /// Opens the logs of the partitions this shard owns among `wanted` (each topic's partitions
    /// in a range), all together (see [`strand_storage::ShardStore::open_logs`]: a bounded
    /// number at a time, the new ones made durable with one file-system sync).
    async fn open_partitions(
        &self,
        wanted: &[(TopicMeta, std::ops::Range<i32>)],
        problems: &mut Vec<String>,
    ) {
        let mut logs = Vec::new();
        let mut which = Vec::new();
        for (topic, range) in wanted {
            let settings = topic.config.log_settings(&self.config);
            let log_config = Self::log_config(&settings);
            for p in range.clone().filter(|p| self.owner(&topic.name, *p) == self.id) {
                let key = LogKey {
                    dir_name: topic.dir_name(p),
                    incarnation: *topic.id.0.as_bytes(),
                };
                logs.push((key, log_config.clone()));
                which.push((topic, p));
            }
        }
        let opened = self.store.open_logs(logs, LEADER_EPOCH, self.now_ms()).await;
        for ((topic, p), opened) in which.into_iter().zip(opened) {
            match opened {
                Ok((log, report)) => {
                    if !report.problems.is_empty() {
                        tracing::warn!(topic = %topic.name, partition = p, problems = ?report.problems, truncated_bytes = report.bytes_truncated, "recovered partition log");
                    }
                    self.partitions
                        .borrow_mut()
                        .entry(topic.name.clone())
                        .or_default()
                        .insert(
                            p,
                            LocalPartition {
                                log,
                                topic_id: topic.id,
                            },
                        );
                }
                Err(e) => {
                    tracing::error!(topic = %topic.name, partition = p, error = %e, "cannot open partition log");
                    problems.push(format!("{}-{p}: {e}", topic.name));
                }
            }
        }
    }

    /// Opens this shard's partitions of every topic (start-up), a topic at a time: there is
    /// seldom a new log to sync together, and all of them at once held more memory at the end
    /// of start-up (7–12 MiB more with 10,000 partitions).
    pub(crate) async fn open_all(&self) -> Vec<String> {
        let md = self.metadata();
        let mut problems = Vec::new();
        for t in md.topics() {
            self.open_partitions(&[(t.clone(), 0..t.partitions)], &mut problems)
                .await;
        }
        problems
    }

    /// The partitions a metadata change creates: a topic and a range of its partitions.
    fn new_partitions(&self, d: &MetadataDelta) -> Option<(TopicMeta, std::ops::Range<i32>)> {
        match d {
            MetadataDelta::CreateTopic(t) => Some((t.clone(), 0..t.partitions)),
            MetadataDelta::SetPartitionCount { name, partitions } => {
                let mut t = self.metadata().topic(name)?.clone();
                let old = t.partitions;
                t.partitions = *partitions;
                Some((t, old..*partitions))
            }
            _ => None,
        }
    }

    /// Phase 1 of a metadata change: open new logs, remove deleted ones, apply configs. The
    /// subsystems' hooks see each delta once the core has taken it into its tables, before the
    /// logs of a deleted topic are removed.
    async fn prepare_metadata(&self, deltas: &[MetadataDelta]) -> Vec<String> {
        let mut problems = Vec::new();
        let hooks = self.registry.hooks();
        // New partitions of consecutive deltas are opened together (one CreateTopics request's
        // topics), before any other delta.
        let mut to_open = Vec::new();
        for d in deltas {
            if let Some(wanted) = self.new_partitions(d) {
                to_open.push(wanted);
                continue;
            }
            if !to_open.is_empty() {
                self.open_partitions(&std::mem::take(&mut to_open), &mut problems)
                    .await;
            }
            let mut removed_logs = Vec::new();
            match d {
                MetadataDelta::CreateTopic(_) | MetadataDelta::SetPartitionCount { .. } => {}
                MetadataDelta::DeleteTopic { name, id } => {
                    let removed = {
                        let mut parts = self.partitions.borrow_mut();
                        match parts.get(name.as_str()) {
                            Some(m) if m.values().all(|p| p.topic_id == *id) => parts.remove(name.as_str()),
                            _ => None,
                        }
                    };
                    removed_logs = removed.into_iter().flatten().collect();
                }
                MetadataDelta::SetTopicConfig { name, config } => {
                    let settings = config.log_settings(&self.config);
                    let log_config = Self::log_config(&settings);
                    let logs: Vec<LogId> = self
                        .partitions
                        .borrow()
                        .get(name.as_str())
                        .map(|m| m.values().map(|p| p.log).collect())
                        .unwrap_or_default();
                    for log in logs {
                        let _ = self.store.set_config(log, log_config.clone());
                    }
                }
                // Group configs are read from the metadata replica when used.
                MetadataDelta::SetGroupConfig { .. } => {}
            }
            for h in &hooks {
                h.metadata_preparing(d).await;
            }
            if let MetadataDelta::DeleteTopic { name, .. } = d {
                for (p, lp) in removed_logs {
                    if let Err(e) = self.store.remove_log(lp.log).await {
                        problems.push(format!("{name}-{p}: {e}"));
                    }
                    self.metrics.forget_partition(name, p);
                }
            }
        }
        if !to_open.is_empty() {
            self.open_partitions(&to_open, &mut problems).await;
        }
        problems
    }

    /// Phase 2 of a metadata change: this shard's replica takes the new state.
    fn commit_metadata(&self, deltas: &[MetadataDelta]) {
        let mut md = (*self.metadata()).clone();
        for d in deltas {
            md.apply(d);
        }
        let mut runtime = self.topic_runtime.borrow_mut();
        runtime.clear();
        for t in md.topics() {
            runtime.insert(
                t.name.clone(),
                TopicRuntime {
                    settings: t.config.log_settings(&self.config),
                },
            );
        }
        *self.metadata.borrow_mut() = Rc::new(md);
    }

    /// Runs retention on this shard's logs.
    pub(crate) async fn retention_pass(&self) {
        for h in self.registry.hooks() {
            h.before_retention();
        }
        let deleted = self.store.retention_pass(self.now_ms()).await;
        for (_, outcome) in &deleted {
            self.metrics
                .segments_deleted(outcome.deleted.len(), outcome.bytes_deleted);
        }
    }

    /// Forgets idle idempotent producers (`producer.id.expiration.ms`) and bounds how many each
    /// partition remembers.
    pub(crate) fn expire_producers(&self) {
        let n = self.store.expire_producers(
            self.now_ms(),
            self.config.producer_id_expiration_ms,
            self.config.max_producers_per_partition as usize,
        );
        if n > 0 {
            tracing::debug!(expired = n, "expired idempotent producer state");
        }
    }

    /// Publishes per-partition gauges (log end offset, size).
    pub(crate) fn update_partition_gauges(&self) {
        let parts = self.partitions.borrow();
        for (topic, m) in parts.iter() {
            for (p, lp) in m {
                if let Ok(o) = self.store.offsets(lp.log) {
                    self.metrics.partition_gauges(topic, *p, &o);
                }
            }
        }
        self.metrics.store_gauges(&self.store, self.partition_count());
        drop(parts);
        for h in self.registry.hooks() {
            h.publish_gauges();
        }
    }
}

/// Kafka's answer to a request's `current_leader_epoch` (-1: not checked).
pub(crate) fn check_leader_epoch(current: i32) -> Option<ResponseError> {
    match current {
        -1 => None,
        e if e < LEADER_EPOCH => Some(ResponseError::FencedLeaderEpoch),
        e if e > LEADER_EPOCH => Some(ResponseError::UnknownLeaderEpoch),
        _ => None,
    }
}

/// The Kafka error code for a storage error.
pub(crate) fn storage_error_code(e: &StorageError) -> ResponseError {
    match e {
        StorageError::OffsetOutOfRange { .. } => ResponseError::OffsetOutOfRange,
        StorageError::InvalidBatch(b) => b.kafka_error(),
        StorageError::UnknownLog => ResponseError::UnknownTopicOrPartition,
        StorageError::Busy(_) => ResponseError::RequestTimedOut,
        StorageError::Producer(ProducerError::FencedEpoch { .. }) => ResponseError::InvalidProducerEpoch,
        StorageError::Producer(
            ProducerError::OutOfOrder { .. } | ProducerError::NewEpochNotAtZero { .. },
        ) => ResponseError::OutOfOrderSequenceNumber,
        _ => ResponseError::KafkaStorageError,
    }
}

/// Runs one metadata change on every shard: phase 1 (prepare) everywhere, then phase 2
/// (commit) everywhere. Returns problems reported by shards.
pub(crate) async fn broadcast_metadata(shard: &Rc<Shard>, deltas: Vec<MetadataDelta>) -> Vec<String> {
    let mut problems = Vec::new();
    for phase in 0..2 {
        let mut futs = Vec::new();
        for s in 0..shard.shards {
            let req = if phase == 0 {
                ShardRequest::PrepareMetadata(deltas.clone())
            } else {
                ShardRequest::CommitMetadata(deltas.clone())
            };
            match shard.dispatch(ShardId(s), req).await {
                Ok(f) => futs.push(f),
                Err(e) => problems.push(e.to_string()),
            }
        }
        for r in join_all(futs).await {
            match r {
                Ok(ShardResponse::Applied(p)) => problems.extend(p),
                Ok(_) => problems.push("unexpected answer to a metadata change".into()),
                Err(e) => problems.push(e.to_string()),
            }
        }
    }
    problems
}

/// Runs a per-partition operation on the partitions' owners, in parallel, and returns the
/// answers in the order of `items`. `make` builds one shard's request from its share of the
/// items; `take` extracts that shard's answers (one per item, in order).
pub(crate) async fn scatter<T, R: Clone>(
    shard: &Rc<Shard>,
    items: Vec<(PartRef, T)>,
    make: impl Fn(Vec<(PartRef, T)>) -> ShardRequest,
    take: impl Fn(ShardResponse) -> Option<Vec<R>>,
    fallback: R,
) -> Vec<R> {
    let n = items.len();
    type Share<T> = (Vec<usize>, Vec<(PartRef, T)>);
    let mut by_owner: std::collections::BTreeMap<ShardId, Share<T>> = Default::default();
    for (i, (part, t)) in items.into_iter().enumerate() {
        let e = by_owner
            .entry(shard.owner(&part.topic, part.partition))
            .or_default();
        e.0.push(i);
        e.1.push((part, t));
    }
    let mut calls = Vec::new();
    for (owner, (idx, list)) in by_owner {
        let fut = shard.dispatch(owner, make(list)).await;
        calls.push(async move {
            match fut {
                Ok(f) => (idx, f.await.ok()),
                Err(_) => (idx, None),
            }
        });
    }
    let mut out = vec![fallback; n];
    for (idx, resp) in join_all(calls).await {
        let answers = resp.and_then(&take).unwrap_or_default();
        for (i, a) in idx.into_iter().zip(answers) {
            if let Some(slot) = out.get_mut(i) {
                *slot = a;
            }
        }
    }
    out
}
