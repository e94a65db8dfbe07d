//! A shard: one thread, one glommio executor, the partitions it owns and their storage.
//!
//! Architecture invariant: a partition's log is touched only by its owning shard
//! ([`crate::metadata::owner_shard`]). Other shards reach it through [`ShardRequest`]s over the
//! router. Per-shard state is deliberately not `Send` (`Rc`, `RefCell`).

pub(crate) mod ops;
pub(crate) mod replica;
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
use self::replica::{Acks, Decision, InFlight, Leadership, ProposeError, ReplicaHandle};
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
    /// In a cluster, the partition's replica, once the replication subsystem attached it.
    pub(crate) replica: Option<Rc<dyn ReplicaHandle>>,
    /// Idempotent producers' batches proposed to the replica and not answered yet.
    pub(crate) in_flight: Rc<RefCell<InFlight>>,
}

/// Why [`Shard::append_own`] did not append.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum OwnAppendError {
    /// This shard's replica does not lead the partition (the leader, if known), or the
    /// partition is not here.
    NotLeader(Option<strand_protocol::types::NodeId>),
    /// The write failed or its outcome is unknown (a leader change while it waited).
    Failed(String),
}

impl std::fmt::Display for OwnAppendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OwnAppendError::NotLeader(_) => f.write_str("this shard does not lead the partition"),
            OwnAppendError::Failed(why) => f.write_str(why),
        }
    }
}

/// How the core serves a partition ([`Shard::gate`]).
enum Gate {
    /// A standalone node's partition: served as it is.
    Local(LogId),
    /// A replicated partition with its group attached.
    Replicated(LogId, Rc<dyn ReplicaHandle>, Rc<RefCell<InFlight>>),
    /// In a cluster, a partition this shard does not serve (no replica here, or its group is
    /// not attached yet): who leads it, as far as is known.
    NotHere(Leadership),
    /// No such partition.
    Unknown,
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
    /// Shared with the replication layer, whose replica logs append through it.
    pub(crate) store: Rc<ShardStore<GlommioFs>>,
    metadata: RefCell<Rc<ClusterMetadata>>,
    topic_runtime: RefCell<HashMap<String, TopicRuntime>>,
    partitions: RefCell<FastMap<String, FastMap<i32, LocalPartition>>>,
    pub(crate) router: Rc<Router>,
    pub(crate) metrics: ShardMetrics,
    pub(crate) listeners: Rc<Vec<AdvertisedListener>>,
    pub(crate) shutting_down: Cell<bool>,
    /// A cluster node that is shutting down has handed its partition leaderships over: it
    /// serves no more client requests (see `crate::connection`), so clients ask the nodes that
    /// lead now rather than this one, whose metadata names it until the controller's record of
    /// the new leaders arrives.
    pub(crate) leaderships_handed_over: Cell<bool>,
    /// The subsystems' services and hooks on this shard (see [`service`]).
    registry: Registry,
    /// In a cluster, the newest applied cluster metadata ([`Shard::set_cluster_state`]).
    cluster: RefCell<Option<Rc<crate::cluster::ClusterState>>>,
}

impl Shard {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        id: ShardId,
        shards: u16,
        config: Rc<Config>,
        clock: Rc<dyn Clock>,
        store: Rc<ShardStore<GlommioFs>>,
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
            leaderships_handed_over: Cell::new(false),
            registry: Registry::default(),
            cluster: RefCell::new(None),
        }
    }

    /// This shard's metadata replica (a snapshot; cheap to clone).
    pub(crate) fn metadata(&self) -> Rc<ClusterMetadata> {
        self.metadata.borrow().clone()
    }

    pub(crate) fn topic_settings(&self, topic: &str) -> Option<LogSettings> {
        self.topic_runtime.borrow().get(topic).map(|t| t.settings.clone())
    }

    /// The shard that owns a partition here: in a cluster, the shard the cluster metadata
    /// gives this node's replica (`PartitionRegistration::shard_of`: peers address its Raft
    /// messages there), else [`owner_shard`].
    pub(crate) fn owner(&self, topic: &str, partition: i32) -> ShardId {
        let cluster = self.cluster.borrow();
        cluster
            .as_ref()
            .and_then(|state| placed_shard(state, topic, partition, self.config.node_id, self.shards))
            .unwrap_or_else(|| owner_shard(topic, partition, self.shards))
    }

    pub(crate) fn now_ms(&self) -> i64 {
        self.clock.now_ms()
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

    /// How this shard serves `topic`-`partition` (see [`replica`]).
    /// NOT_ENOUGH_REPLICAS when the partition's ISR (as the cluster metadata records it) is
    /// smaller than the topic's `min.insync.replicas`, as Kafka refuses an acks=all produce
    /// before it appends. (Kafka's NOT_ENOUGH_REPLICAS_AFTER_APPEND, for an ISR that shrank
    /// while the write was in flight, is not answered: a Raft majority acknowledged the write.)
    fn too_few_in_sync(&self, topic: &str, partition: i32) -> Option<ProduceOutcome> {
        let min = self
            .topic_runtime
            .borrow()
            .get(topic)?
            .settings
            .min_insync_replicas;
        let cluster = self.cluster.borrow();
        let isr = cluster
            .as_ref()?
            .topic_by_name(topic)?
            .partition(strand_protocol::types::PartitionId(partition))?
            .isr
            .len();
        if u32::try_from(isr).unwrap_or(u32::MAX) >= min {
            return None;
        }
        Some(ProduceOutcome::error(
            ResponseError::NotEnoughReplicas,
            Some(format!(
                "The size of the current ISR ({isr}) is insufficient to satisfy the min.isr requirement of {min} for partition {topic}-{partition}"
            )),
        ))
    }

    fn gate(&self, topic: &str, partition: i32) -> Gate {
        let parts = self.partitions.borrow();
        let found = parts.get(topic).and_then(|m| m.get(&partition));
        let cluster = self.cluster.borrow();
        let Some(state) = cluster.as_ref() else {
            // A standalone node: nothing more to look at.
            return found.map_or(Gate::Unknown, |p| Gate::Local(p.log));
        };
        if let Some(p) = found {
            if let Some(replica) = &p.replica {
                return Gate::Replicated(p.log, Rc::clone(replica), Rc::clone(&p.in_flight));
            }
        }
        let known = state.topic_by_name(topic).and_then(|t| {
            t.partition(strand_protocol::types::PartitionId(partition))
                .map(|p| Leadership {
                    leader: p.leader,
                    epoch: p.leader_epoch.0,
                    is_local: false,
                })
        });
        match (known, found) {
            (Some(l), _) => Gate::NotHere(l),
            // Open here but unknown to the cluster metadata (being deleted): not served.
            (None, Some(_)) => Gate::NotHere(Leadership {
                leader: None,
                epoch: -1,
                is_local: false,
            }),
            (None, None) => Gate::Unknown,
        }
    }

    /// Attaches (or with `None` detaches) the replica of a partition this shard has open, if
    /// the partition is still the topic `topic_id`'s; returns its log. The replication
    /// subsystem calls it when it starts or stops the partition's group.
    pub(crate) fn attach_replica(
        &self,
        topic: &str,
        partition: i32,
        topic_id: TopicId,
        replica: Option<Rc<dyn ReplicaHandle>>,
    ) -> Option<LogId> {
        let mut parts = self.partitions.borrow_mut();
        let p = parts.get_mut(topic)?.get_mut(&partition)?;
        if p.topic_id != topic_id {
            return None;
        }
        p.replica = replica;
        Some(p.log)
    }

    /// The log and its directory of an open partition of topic `topic_id` (the replication
    /// subsystem opens its Raft state beside it).
    pub(crate) fn open_log_of(
        &self,
        topic: &str,
        partition: i32,
        topic_id: TopicId,
    ) -> Option<(LogId, std::path::PathBuf)> {
        let log = {
            let parts = self.partitions.borrow();
            let p = parts.get(topic)?.get(&partition)?;
            (p.topic_id == topic_id).then_some(p.log)?
        };
        let dir = self.store.with_log(log, |l| l.dir().to_path_buf()).ok()?;
        Some((log, dir))
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
            ShardRequest::Produce {
                parts,
                wait,
                acks,
                arrived,
            } => self.start_produce(parts, wait, Acks::from_kafka(acks), arrived),
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
            ShardRequest::LogSizes(parts) => {
                let answers = self.log_sizes(&parts);
                async move { ShardResponse::LogSizes(answers) }.boxed_local()
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
        acks: Acks,
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
            let (log, replica) = match self.gate(&p.part.topic, p.part.partition) {
                Gate::Local(log) => (log, None),
                Gate::Replicated(log, r, f) => (log, Some((r, f))),
                Gate::NotHere(l) => {
                    started.push(Err(not_leader_produce(l)));
                    continue;
                }
                Gate::Unknown => {
                    started.push(Err(ProduceOutcome::error(
                        ResponseError::UnknownTopicOrPartition,
                        None,
                    )));
                    continue;
                }
            };
            if let Some((r, _)) = &replica {
                let l = r.leadership();
                if !l.is_local {
                    started.push(Err(not_leader_produce(l)));
                    continue;
                }
                if !r.hears_a_majority() {
                    started.push(Err(cut_off_produce()));
                    continue;
                }
                if acks == Acks::All {
                    if let Some(refused) = self.too_few_in_sync(&p.part.topic, p.part.partition) {
                        started.push(Err(refused));
                        continue;
                    }
                }
            }
            let append_time = self
                .topic_runtime
                .borrow()
                .get(p.part.topic.as_str())
                .is_some_and(|t| t.settings.timestamp_type == TimestampType::LogAppendTime);
            // LogAppendTime topics get the broker's clock in the batch (header and CRC only);
            // other batches go on as the request's own bytes.
            let records = if append_time {
                let mut copy = p.records.to_vec();
                strand_protocol::batch::set_log_append_time(&mut copy, now);
                bytes::Bytes::from(copy)
            } else {
                p.records.clone()
            };
            if let Some((r, in_flight)) = replica {
                started.push(
                    self.start_proposal(log, records, acks, &r, &in_flight)
                        .map(|s| (s, append_time)),
                );
                if started.last().is_some_and(Result::is_ok) {
                    self.metrics.bytes_in(p.records.len());
                }
                continue;
            }
            match self.store.append(log, &records, LEADER_EPOCH, now) {
                Ok(ticket) => {
                    self.metrics.bytes_in(p.records.len());
                    started.push(Ok((Started::Staged(ticket), append_time)));
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
                    Ok((Started::Proposed(proposal, log, replica), append_time)) => {
                        match answer_unless_cut_off(proposal, &replica).await {
                            Ok(base_offset) => ProduceOutcome {
                                base_offset,
                                log_append_time_ms: if append_time { now } else { -1 },
                                log_start_offset: me.store.offsets(log).map_or(-1, |o| o.log_start_offset),
                                ..ProduceOutcome::default()
                            },
                            Err(Unanswered::Refused(ProposeError::NotLeader(l))) => not_leader_produce(l),
                            Err(Unanswered::Refused(ProposeError::Unknown(why))) => {
                                ProduceOutcome::error(ResponseError::RequestTimedOut, Some(why))
                            }
                            Err(Unanswered::CutOff) => cut_off_produce(),
                        }
                    }
                    Ok((Started::Duplicate(first, log, batch), append_time)) => {
                        match me.wait_committed(log, first, &batch).await {
                            Ok(()) => ProduceOutcome {
                                base_offset: first.0,
                                log_append_time_ms: if append_time { now } else { -1 },
                                log_start_offset: me.store.offsets(log).map_or(-1, |o| o.log_start_offset),
                                ..ProduceOutcome::default()
                            },
                            Err(o) => o,
                        }
                    }
                    Ok((Started::Staged(ticket), append_time)) => {
                        if wait {
                            if let Err(e) = me.store.wait_durable(&ticket).await {
                                out.push(ProduceOutcome::error(storage_error_code(&e), Some(e.to_string())));
                                continue;
                            }
                        }
                        ProduceOutcome {
                            base_offset: ticket.info.base_offset,
                            log_append_time_ms: if append_time { now } else { -1 },
                            log_start_offset: ticket.info.log_start_offset,
                            ..ProduceOutcome::default()
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

    /// Starts a replicated partition's write on its leader: the producer checks against the
    /// log and the proposals in flight ([`InFlight`]), then the proposal.
    fn start_proposal(
        &self,
        log: LogId,
        records: bytes::Bytes,
        acks: Acks,
        replica: &Rc<dyn ReplicaHandle>,
        in_flight: &Rc<RefCell<InFlight>>,
    ) -> Result<Started, ProduceOutcome> {
        let fail = |e: &StorageError| ProduceOutcome::error(storage_error_code(e), Some(e.to_string()));
        let logged = self.store.check_producer(log, &records).map_err(|e| fail(&e))?;
        let header = strand_protocol::batch::BatchHeader::parse(&records)
            .map_err(|e| fail(&StorageError::InvalidBatch(e)))?;
        let decision = in_flight.borrow().decide(&header, logged);
        match decision {
            Decision::Propose => {
                let token = in_flight.borrow_mut().proposed(&header);
                let proposal = replica.propose(records, acks);
                let in_flight = Rc::clone(in_flight);
                Ok(Started::Proposed(
                    async move {
                        let answer = proposal.await;
                        if let Some(t) = token {
                            in_flight.borrow_mut().answered(t);
                        }
                        answer
                    }
                    .boxed_local(),
                    log,
                    Rc::clone(replica),
                ))
            }
            Decision::Duplicate {
                first_offset,
                last_offset,
            } => Ok(Started::Duplicate((first_offset, last_offset), log, records)),
            Decision::InFlightRetry => Err(ProduceOutcome::error(
                ResponseError::RequestTimedOut,
                Some("a retry of a batch still being replicated".into()),
            )),
            Decision::Reject(e) => Err(fail(&StorageError::Producer(e))),
        }
    }

    /// Appends a batch the broker built itself (a coordinator's state records, a queue's
    /// published messages) to a partition this shard owns, and resolves with its base offset
    /// once it is durable on this node (standalone) or committed on a majority of its replicas
    /// (cluster; this replica must lead). Clients cannot append to internal topics
    /// ([`crate::internal_topics::refuse_client_append`]); a caller appending to a client topic
    /// checks that rule itself.
    pub(crate) fn append_own(
        &self,
        topic: &str,
        partition: i32,
        batch: bytes::Bytes,
    ) -> LocalBoxFuture<'static, Result<i64, OwnAppendError>> {
        match self.gate(topic, partition) {
            Gate::Local(log) => match self.store.append(log, &batch, LEADER_EPOCH, self.now_ms()) {
                Ok(ticket) => {
                    let store = Rc::clone(&self.store);
                    async move {
                        store
                            .wait_durable(&ticket)
                            .await
                            .map(|()| ticket.info.base_offset)
                            .map_err(|e| OwnAppendError::Failed(e.to_string()))
                    }
                    .boxed_local()
                }
                Err(e) => {
                    let e = OwnAppendError::Failed(e.to_string());
                    async move { Err(e) }.boxed_local()
                }
            },
            Gate::Replicated(_, replica, _) if replica.leadership().is_local => {
                let proposal = replica.propose(batch, Acks::All);
                async move {
                    match proposal.await {
                        Ok(base) => Ok(base),
                        Err(ProposeError::NotLeader(l)) => Err(OwnAppendError::NotLeader(l.leader)),
                        Err(ProposeError::Unknown(why)) => Err(OwnAppendError::Failed(why)),
                    }
                }
                .boxed_local()
            }
            Gate::Replicated(_, replica, _) => {
                let leader = replica.leadership().leader;
                async move { Err(OwnAppendError::NotLeader(leader)) }.boxed_local()
            }
            Gate::NotHere(_) | Gate::Unknown => {
                async move { Err(OwnAppendError::NotLeader(None)) }.boxed_local()
            }
        }
    }

    /// Proposes a side record to `topic`-`partition`'s Raft group, which this shard's replica
    /// must lead (see [`ReplicaHandle::propose_side`]): resolves with its Raft index once
    /// committed.
    pub(crate) fn propose_side(
        &self,
        topic: &str,
        partition: i32,
        keep_from: u64,
        data: bytes::Bytes,
    ) -> LocalBoxFuture<'static, Result<u64, OwnAppendError>> {
        match self.gate(topic, partition) {
            Gate::Replicated(_, replica, _) if replica.leadership().is_local => {
                let proposal = replica.propose_side(keep_from, data);
                async move {
                    proposal.await.map_err(|e| match e {
                        ProposeError::NotLeader(l) => OwnAppendError::NotLeader(l.leader),
                        ProposeError::Unknown(why) => OwnAppendError::Failed(why),
                    })
                }
                .boxed_local()
            }
            Gate::Replicated(_, replica, _) => {
                let leader = replica.leadership().leader;
                async move { Err(OwnAppendError::NotLeader(leader)) }.boxed_local()
            }
            Gate::Local(_) | Gate::NotHere(_) | Gate::Unknown => {
                async move { Err(OwnAppendError::NotLeader(None)) }.boxed_local()
            }
        }
    }

    /// The side records this shard's replica of `topic`-`partition` holds, `(Raft index,
    /// data)` in index order; `None` without a replica here.
    pub(crate) fn side_records(&self, topic: &str, partition: i32) -> Option<replica::SideRecordsRead> {
        match self.gate(topic, partition) {
            Gate::Replicated(_, replica, _) => Some(replica.side_records()),
            Gate::Local(_) | Gate::NotHere(_) | Gate::Unknown => None,
        }
    }

    /// Who leads `topic`-`partition` as this shard's replica of it knows (`None`: no replica
    /// attached here, or a standalone node's partition).
    pub(crate) fn leadership(&self, topic: &str, partition: i32) -> Option<Leadership> {
        match self.gate(topic, partition) {
            Gate::Replicated(_, replica, _) => Some(replica.leadership()),
            Gate::Local(_) | Gate::NotHere(_) | Gate::Unknown => None,
        }
    }

    /// Whether this shard's replica of `topic`-`partition` leads and its node heard lately from
    /// a majority of the partition's replicas (see [`ReplicaHandle::hears_a_majority`]); on a
    /// standalone node, whether the partition is open here.
    pub(crate) fn leads_with_a_majority(&self, topic: &str, partition: i32) -> bool {
        match self.gate(topic, partition) {
            Gate::Local(_) => true,
            Gate::Replicated(_, replica, _) => replica.leadership().is_local && replica.hears_a_majority(),
            Gate::NotHere(_) | Gate::Unknown => false,
        }
    }

    /// Confirms with a majority of its replicas that this shard's replica of `topic`-`partition`
    /// leads ([`ReplicaHandle::confirm_leadership`]); on a standalone node, whether the
    /// partition is open here.
    pub(crate) fn confirm_leadership(&self, topic: &str, partition: i32) -> LocalBoxFuture<'static, bool> {
        let leads = match self.gate(topic, partition) {
            Gate::Local(_) => true,
            Gate::Replicated(_, replica, _) => return replica.confirm_leadership(),
            Gate::NotHere(_) | Gate::Unknown => false,
        };
        async move { leads }.boxed_local()
    }

    /// Whether this shard serves `topic`-`partition` as its writer with every batch of its log
    /// readable: on a standalone node, whenever the log is open here; on a cluster node, when
    /// its replica leads and everything in its log is committed (a new leader's log holds
    /// entries of earlier terms until its first commit). What a coordinator waits for before it
    /// loads its state from the partition.
    pub(crate) fn leads_whole_log(&self, topic: &str, partition: i32) -> bool {
        match self.gate(topic, partition) {
            Gate::Local(_) => true,
            Gate::Replicated(log, replica, _) => {
                replica.leadership().is_local
                    && self
                        .store
                        .offsets(log)
                        .is_ok_and(|o| o.high_watermark == o.log_end_offset)
            }
            Gate::NotHere(_) | Gate::Unknown => false,
        }
    }

    /// Waits (bounded) until the batch at `offsets` (first, last) of a replicated log is
    /// committed, and checks it is still there: a batch the leader held uncommitted can be cut
    /// by a leader change and its offsets taken by other batches, which then commit. Such a
    /// retry is told NOT_LEADER_OR_FOLLOWER, and the producer's next attempt is checked afresh.
    async fn wait_committed(
        &self,
        log: LogId,
        offsets: (i64, i64),
        batch: &[u8],
    ) -> Result<(), ProduceOutcome> {
        let deadline = Instant::now() + DUPLICATE_COMMIT_WAIT;
        loop {
            let wait = self.store.durable_notify().wait();
            match self.store.offsets(log) {
                Ok(o) if o.high_watermark > offsets.1 => {
                    let still = matches!(
                        self.store.check_producer(log, batch),
                        Ok(strand_storage::producer::ProducerCheck::Duplicate { first_offset, last_offset })
                            if (first_offset, last_offset) == offsets
                    );
                    return if still {
                        Ok(())
                    } else {
                        Err(ProduceOutcome::error(
                            ResponseError::NotLeaderOrFollower,
                            Some("the batch was cut from the log by a leader change".into()),
                        ))
                    };
                }
                Ok(_) => {}
                Err(e) => return Err(ProduceOutcome::error(storage_error_code(&e), Some(e.to_string()))),
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || self.shutting_down.get() {
                return Err(ProduceOutcome::error(
                    ResponseError::RequestTimedOut,
                    Some("a retry of a batch not yet committed".into()),
                ));
            }
            let timer = glommio::timer::sleep(left);
            futures::pin_mut!(wait);
            futures::pin_mut!(timer);
            futures::future::select(wait, timer).await;
        }
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
        let cluster = self.cluster.borrow().is_some();
        for (p, log) in parts.iter().zip(logs) {
            let mut epoch = LEADER_EPOCH;
            let log = match log {
                Some(log) if !cluster => log,
                _ => match self.gate(topic_name(topics, p.topic), p.partition) {
                    Gate::Local(log) => log,
                    Gate::Replicated(log, r, _) => {
                        let l = r.leadership();
                        if !l.is_local {
                            out.push(not_leader_fetch(l));
                            continue;
                        }
                        // A leader cut off from its followers serves no reads: its high
                        // watermark stands still while the others may elect a leader and go
                        // on, and its consumers would wait on it without looking elsewhere.
                        if !r.hears_a_majority() {
                            out.push(cut_off_fetch());
                            continue;
                        }
                        epoch = l.epoch;
                        log
                    }
                    Gate::NotHere(l) => {
                        out.push(not_leader_fetch(l));
                        continue;
                    }
                    Gate::Unknown => {
                        out.push(FetchOutcome::error(ResponseError::UnknownTopicOrPartition));
                        continue;
                    }
                },
            };
            if let Some(e) = check_leader_epoch_of(p.current_leader_epoch, epoch) {
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
                current_leader: None,
                cut_off: false,
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
            let (log, epoch) = match self.gate(&p.part.topic, p.part.partition) {
                Gate::Local(log) => (log, LEADER_EPOCH),
                Gate::Replicated(log, r, _) => {
                    let l = r.leadership();
                    if !l.is_local {
                        out.push(error(not_leader_error(l, false)));
                        continue;
                    }
                    (log, l.epoch)
                }
                Gate::NotHere(l) => {
                    out.push(error(not_leader_error(l, false)));
                    continue;
                }
                Gate::Unknown => {
                    out.push(error(ResponseError::UnknownTopicOrPartition));
                    continue;
                }
            };
            if let Some(e) = check_leader_epoch_of(p.current_leader_epoch, epoch) {
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
                leader_epoch: epoch,
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
            // On a replicated partition only its leader moves its log start (locally: the
            // followers' logs keep theirs until retention).
            let log = match self.gate(&p.topic, p.partition) {
                Gate::Local(log) => log,
                Gate::Replicated(log, r, _) if r.leadership().is_local => log,
                Gate::Replicated(_, r, _) => {
                    out.push((not_leader_error(r.leadership(), false).code(), -1));
                    continue;
                }
                Gate::NotHere(l) => {
                    out.push((not_leader_error(l, false).code(), -1));
                    continue;
                }
                Gate::Unknown => {
                    out.push((ResponseError::UnknownTopicOrPartition.code(), -1));
                    continue;
                }
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

    /// The size of each partition's log, where this shard has it open (a leader's or a
    /// follower's replica alike).
    fn log_sizes(&self, parts: &[PartRef]) -> Vec<Option<u64>> {
        let open = self.partitions.borrow();
        parts
            .iter()
            .map(|p| {
                let log = open.get(&p.topic).and_then(|m| m.get(&p.partition))?.log;
                self.store.with_log(log, |l| l.size_bytes()).ok()
            })
            .collect()
    }

    fn epoch_end_offsets(&self, qs: Vec<EpochQuery>) -> Vec<EpochAnswer> {
        qs.into_iter()
            .map(|q| {
                let fail = |e: ResponseError| EpochAnswer {
                    error: e.code(),
                    leader_epoch: -1,
                    end_offset: -1,
                };
                let (log, epoch) = match self.gate(&q.part.topic, q.part.partition) {
                    Gate::Local(log) => (log, LEADER_EPOCH),
                    Gate::Replicated(log, r, _) => {
                        let l = r.leadership();
                        if !l.is_local {
                            return fail(not_leader_error(l, false));
                        }
                        (log, l.epoch)
                    }
                    Gate::NotHere(l) => return fail(not_leader_error(l, false)),
                    Gate::Unknown => return fail(ResponseError::UnknownTopicOrPartition),
                };
                if let Some(e) = check_leader_epoch_of(q.current_leader_epoch, epoch) {
                    return fail(e);
                }
                match self
                    .store
                    .with_log(log, |l| (l.end_offset_for_epoch(q.leader_epoch), l.visible_end()))
                {
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
            for p in range
                .clone()
                .filter(|p| self.owner(&topic.name, *p) == self.id && self.hosts(topic, *p))
            {
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
                                replica: None,
                                in_flight: Rc::default(),
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

    /// Whether this node holds a replica of partition `p` of `topic`: always on a standalone
    /// node and for a topic the cluster state does not know (a node's own internal topics); in a
    /// cluster, when the state places a replica on this node. The controller records the shard
    /// it chose for the replica; partitions are routed by [`owner_shard`] here, so a replica is
    /// opened on its owner shard and a different recorded shard is logged.
    fn hosts(&self, topic: &TopicMeta, p: i32) -> bool {
        let Some(state) = self.cluster_state() else {
            return true;
        };
        let Some(t) = state.topic(topic.id) else {
            return true;
        };
        let me = self.config.cluster.node_id;
        let recorded = t
            .partition(strand_protocol::types::PartitionId(p))
            .and_then(|r| r.shard_of(me));
        match recorded {
            None => false,
            Some(shard) => {
                if shard != self.id {
                    tracing::debug!(topic = %topic.name, partition = p, recorded = shard.0, owner = self.id.0, "the controller placed a replica on another shard than its owner");
                }
                true
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
/// A client's `current_leader_epoch` against the partition's: older is fenced, newer unknown
/// (this replica has not learned of it yet), -1 is not checked.
pub(crate) fn check_leader_epoch_of(current: i32, epoch: i32) -> Option<ResponseError> {
    match current {
        -1 => None,
        e if e < epoch => Some(ResponseError::FencedLeaderEpoch),
        e if e > epoch => Some(ResponseError::UnknownLeaderEpoch),
        _ => None,
    }
}

/// The shard of `node` the cluster metadata places its replica of `topic`-`partition` on, if
/// it hosts one on a shard it has.
fn placed_shard(
    state: &crate::cluster::ClusterState,
    topic: &str,
    partition: i32,
    node: strand_protocol::types::NodeId,
    shards: u16,
) -> Option<ShardId> {
    state
        .topic_by_name(topic)?
        .partition(strand_protocol::types::PartitionId(partition))?
        .shard_of(node)
        .filter(|s| s.0 < shards)
}

/// A produce started on this shard: a standalone append, a replicated proposal, or a retry of
/// a batch already in the replicated log (its first and last offsets).
enum Started {
    Staged(strand_storage::AppendTicket),
    /// A proposal (clearing its in-flight record when it resolves), its log and its replica.
    Proposed(
        LocalBoxFuture<'static, Result<i64, ProposeError>>,
        LogId,
        Rc<dyn ReplicaHandle>,
    ),
    /// A retry of a batch in the log at these offsets; the batch, to check it is still there
    /// once committed.
    Duplicate((i64, i64), LogId, bytes::Bytes),
}

/// How long a retry of a batch in the log waits for its commit before it is told to retry.
const DUPLICATE_COMMIT_WAIT: Duration = Duration::from_secs(5);

/// The error for a request that needs the leader and reached another replica (or a node
/// without one): NOT_LEADER_OR_FOLLOWER with the leader when one is known; with none elected,
/// LEADER_NOT_AVAILABLE for writes (Kafka's answer for an offline partition) and
/// NOT_LEADER_OR_FOLLOWER for reads.
fn not_leader_error(l: Leadership, write: bool) -> ResponseError {
    match l.leader {
        None if write => ResponseError::LeaderNotAvailable,
        _ => ResponseError::NotLeaderOrFollower,
    }
}

/// KIP-951's current leader: the leader's id and epoch, if known.
fn current_leader(l: Leadership) -> Option<(i32, i32)> {
    l.leader.map(|n| (n.0, l.epoch))
}

fn not_leader_produce(l: Leadership) -> ProduceOutcome {
    ProduceOutcome {
        current_leader: current_leader(l),
        ..ProduceOutcome::error(not_leader_error(l, true), None)
    }
}

/// Why a proposal's client gets no base offset.
enum Unanswered {
    /// The replica answered with an error.
    Refused(ProposeError),
    /// Its leader found itself cut off from a majority of its replicas while it waited.
    CutOff,
}

/// How often a proposal's wait checks that its leader still hears a majority.
const CUT_OFF_CHECK: Duration = Duration::from_millis(200);

/// Waits for a proposal's answer while its leader hears a majority of its replicas. A Raft
/// leader cut off from its followers stays leader in its own eyes until a newer term reaches
/// it, and its writes wait for a commit that cannot come while the others elect a leader of
/// their own; once it no longer hears a majority ([`ReplicaHandle::hears_a_majority`], within
/// the peer timeout) its clients are told to look for the leader instead. The proposal goes
/// on by itself (it may still commit if the leader is heard again first; its in-flight record
/// is cleared when it resolves), so an idempotent producer's retry finds it in flight or in a
/// log, and a plain producer's retry may store it twice, as after a timeout.
async fn answer_unless_cut_off(
    mut proposal: LocalBoxFuture<'static, Result<i64, ProposeError>>,
    replica: &Rc<dyn ReplicaHandle>,
) -> Result<i64, Unanswered> {
    loop {
        let check = glommio::timer::Timer::new(CUT_OFF_CHECK);
        match futures::future::select(proposal, check).await {
            futures::future::Either::Left((answer, _)) => return answer.map_err(Unanswered::Refused),
            futures::future::Either::Right((_, waiting)) => {
                if replica.leadership().is_local && !replica.hears_a_majority() {
                    glommio::spawn_local(waiting).detach();
                    return Err(Unanswered::CutOff);
                }
                proposal = waiting;
            }
        }
    }
}

/// What a partition's leader that does not hear a majority of its replicas answers a write
/// (see [`answer_unless_cut_off`]): NOT_LEADER_OR_FOLLOWER without a current leader, and the
/// connection closed once answered, so the client asks the other nodes for metadata and
/// finds the leader they elect.
fn cut_off_produce() -> ProduceOutcome {
    metrics::counter!("strand_replication_cut_off_refusals_total", "request" => "produce").increment(1);
    ProduceOutcome {
        cut_off: true,
        ..ProduceOutcome::error(
            ResponseError::NotLeaderOrFollower,
            Some("this node leads the partition but hears too few of its replicas to commit".into()),
        )
    }
}

/// What such a leader answers a read ([`cut_off_produce`]).
fn cut_off_fetch() -> FetchOutcome {
    metrics::counter!("strand_replication_cut_off_refusals_total", "request" => "fetch").increment(1);
    FetchOutcome {
        cut_off: true,
        ..FetchOutcome::error(ResponseError::NotLeaderOrFollower)
    }
}

fn not_leader_fetch(l: Leadership) -> FetchOutcome {
    FetchOutcome {
        current_leader: current_leader(l),
        ..FetchOutcome::error(not_leader_error(l, false))
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

/// Tests' stand-in for the shard's flusher (`tasks.rs`): flushes the store's pending appends
/// and syncs new directories, every 5 ms or when there is work, unless `paused` (a stalled
/// disk).
#[cfg(test)]
pub(crate) fn spawn_test_flusher(store: Rc<ShardStore<GlommioFs>>, paused: Rc<Cell<bool>>) {
    glommio::spawn_local(async move {
        loop {
            let tick = glommio::timer::sleep(std::time::Duration::from_millis(5));
            if paused.get() {
                // Work pending would end the wait at once, and the loop would hold the
                // executor.
                tick.await;
                continue;
            }
            {
                let work = store.wait_for_work();
                futures::pin_mut!(work);
                futures::pin_mut!(tick);
                futures::future::select(work, tick).await;
            }
            if store.has_pending() && !paused.get() {
                store.flush_pending(4, |_| {}).await;
                store.sync_changed_dirs().await;
            }
        }
    })
    .detach();
}

#[cfg(test)]
mod tests {
    use strand_protocol::types::NodeId;

    use super::*;

    const FOLLOWING: Leadership = Leadership {
        leader: Some(NodeId(2)),
        epoch: 7,
        is_local: false,
    };
    const LEADERLESS: Leadership = Leadership {
        leader: None,
        epoch: 7,
        is_local: false,
    };

    #[test]
    fn a_replica_that_does_not_lead_names_the_leader_and_its_epoch() {
        let p = not_leader_produce(FOLLOWING);
        assert_eq!(p.error, ResponseError::NotLeaderOrFollower.code());
        assert_eq!(p.current_leader, Some((2, 7)));
        let f = not_leader_fetch(FOLLOWING);
        assert_eq!(f.error, ResponseError::NotLeaderOrFollower.code());
        assert_eq!(f.current_leader, Some((2, 7)));
    }

    #[test]
    fn with_no_leader_writes_hear_leader_not_available_and_reads_not_leader() {
        let p = not_leader_produce(LEADERLESS);
        assert_eq!(p.error, ResponseError::LeaderNotAvailable.code());
        assert_eq!(p.current_leader, None);
        let f = not_leader_fetch(LEADERLESS);
        assert_eq!(f.error, ResponseError::NotLeaderOrFollower.code());
        assert_eq!(f.current_leader, None);
    }

    #[test]
    fn leader_epochs_are_checked_against_the_partitions_epoch() {
        assert_eq!(check_leader_epoch_of(-1, 7), None);
        assert_eq!(check_leader_epoch_of(7, 7), None);
        assert_eq!(
            check_leader_epoch_of(6, 7),
            Some(ResponseError::FencedLeaderEpoch)
        );
        assert_eq!(
            check_leader_epoch_of(8, 7),
            Some(ResponseError::UnknownLeaderEpoch)
        );
    }
}

/// The core's produce, fetch and offset paths for replicated partitions, on a real shard (one
/// shard, a store in a temporary directory) with stand-in replica handles.
#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]
mod replicated_tests {
    use std::cell::{Cell, RefCell};

    use bytes::Bytes;
    use glommio::LocalExecutorBuilder;
    use strand_protocol::batch::build::{batch, batch_with_producer, TestRecord};
    use strand_protocol::types::{LeaderEpoch, NodeId, PartitionId, ShardId, TopicId};
    use strand_storage::fs_glommio::{GlommioFs, GlommioFsConfig, SharedFs};
    use strand_storage::{FileRegions, StoreConfig};

    use super::ops::{FetchPart, ListOffsetsPart, PartRef, ProducePart, ShardRequest, ShardResponse};
    use super::replica::{Acks, Leadership, ProposeError, ReplicaHandle};
    use super::*;
    use crate::cluster::record::{
        BrokerEpoch, Endpoint, IncarnationId, PartitionEpoch, PartitionRecord, Record, RegisterBroker,
        Replica,
    };
    use crate::cluster::ClusterState;
    use crate::config::TopicConfig;
    use crate::metadata::TopicMeta;

    const TOPIC: TopicId = TopicId(uuid::Uuid::from_u128(0xc0de));

    /// A replica whose leadership the test sets; a leader "commits" each batch at the next
    /// offset, after the test lets it (`release`).
    struct Fake {
        leadership: Cell<Leadership>,
        proposed: RefCell<Vec<(Bytes, Acks)>>,
        next: Cell<i64>,
        /// Proposals are answered only while set.
        released: Rc<Cell<bool>>,
        /// What [`ReplicaHandle::hears_a_majority`] answers.
        hears: Cell<bool>,
    }

    impl Fake {
        /// A replica that hears its peers, with `leadership`, whose next proposal gets
        /// offset `next`, answered while `released`.
        fn new(leadership: Leadership, next: i64, released: bool) -> Rc<Fake> {
            Rc::new(Fake {
                leadership: Cell::new(leadership),
                proposed: RefCell::new(Vec::new()),
                next: Cell::new(next),
                released: Rc::new(Cell::new(released)),
                hears: Cell::new(true),
            })
        }
    }

    impl ReplicaHandle for Fake {
        fn leadership(&self) -> Leadership {
            self.leadership.get()
        }

        fn hears_a_majority(&self) -> bool {
            self.hears.get()
        }

        fn confirm_leadership(&self) -> LocalBoxFuture<'static, bool> {
            let leads = self.leadership.get().is_local;
            async move { leads }.boxed_local()
        }

        fn propose_side(&self, _: u64, _: Bytes) -> LocalBoxFuture<'static, Result<u64, ProposeError>> {
            let l = self.leadership.get();
            async move { Err(ProposeError::NotLeader(l)) }.boxed_local()
        }

        fn side_records(&self) -> crate::shard::replica::SideRecordsRead {
            async move { Ok(Vec::new()) }.boxed_local()
        }

        fn propose(&self, batch: Bytes, acks: Acks) -> LocalBoxFuture<'static, Result<i64, ProposeError>> {
            let l = self.leadership.get();
            let base = self.next.get();
            let count = strand_protocol::batch::BatchHeader::parse(&batch)
                .unwrap()
                .offset_count();
            self.next.set(base + count);
            self.proposed.borrow_mut().push((batch, acks));
            let released = Rc::clone(&self.released);
            async move {
                while !released.get() {
                    glommio::timer::sleep(Duration::from_millis(1)).await;
                }
                if l.is_local {
                    Ok(base)
                } else {
                    Err(ProposeError::NotLeader(l))
                }
            }
            .boxed_local()
        }
    }

    fn state() -> Rc<ClusterState> {
        let mut s = ClusterState::default();
        for id in 1..=3 {
            let epoch = BrokerEpoch(i64::from(id - 1) * 2);
            s.apply(&Record::RegisterBroker(RegisterBroker {
                broker: NodeId(id),
                incarnation: IncarnationId(uuid::Uuid::from_u128(id as u128)),
                epoch,
                endpoints: vec![Endpoint {
                    listener: "PLAINTEXT".into(),
                    host: format!("node{id}"),
                    port: 9092,
                }],
                rack: None,
                shards: 4,
            }));
            s.apply(&Record::BrokerUnfenced {
                broker: NodeId(id),
                epoch,
            });
        }
        s.apply(&Record::Topic {
            name: "t".into(),
            id: TOPIC,
        });
        // Partition 0 is hosted here (node 1) and led by node 2; partition 1 is not hosted here.
        for (p, replicas) in [(0, [1, 2]), (1, [2, 3])] {
            s.apply(&Record::Partition(PartitionRecord {
                topic: TOPIC,
                partition: PartitionId(p),
                replicas: replicas
                    .iter()
                    .map(|b| Replica {
                        broker: NodeId(*b),
                        shard: ShardId(0),
                    })
                    .collect(),
                isr: replicas.iter().map(|b| NodeId(*b)).collect(),
                leader: Some(NodeId(2)),
                leader_epoch: LeaderEpoch(0),
                partition_epoch: PartitionEpoch(0),
            }));
        }
        Rc::new(s)
    }

    async fn core(dir: &std::path::Path) -> Rc<Shard> {
        let shared = SharedFs::for_process(FileRegions::for_process(16));
        let fs = GlommioFs::new(GlommioFsConfig::default(), shared);
        let store = Rc::new(
            ShardStore::open(fs, dir.to_path_buf(), 0, StoreConfig::default())
                .await
                .unwrap(),
        );
        // The shard's flusher (the server runs `tasks.rs`'s).
        super::spawn_test_flusher(Rc::clone(&store), Rc::new(Cell::new(false)));
        let mut chans = router::mesh(1, 16);
        let (router, _) = Router::connect(chans.remove(0)).await;
        let mut config = Config::default();
        config.node_id = NodeId(1);
        let shard = Rc::new(Shard::new(
            ShardId(0),
            1,
            Rc::new(config),
            Rc::new(crate::clock::SystemClock),
            store,
            ClusterMetadata::default(),
            Rc::new(router),
            Rc::new(Vec::new()),
        ));
        let meta = TopicMeta {
            name: "t".into(),
            id: TOPIC,
            partitions: 2,
            config: TopicConfig::default(),
            internal: false,
        };
        let delta = [MetadataDelta::CreateTopic(meta)];
        assert!(shard.prepare_metadata(&delta).await.is_empty());
        shard.commit_metadata(&delta);
        shard
    }

    async fn produce(shard: &Rc<Shard>, partition: i32, records: Bytes) -> ProduceOutcome {
        let req = ShardRequest::Produce {
            parts: vec![ProducePart {
                part: PartRef {
                    topic: "t".into(),
                    partition,
                },
                records,
            }],
            wait: true,
            acks: -1,
            arrived: None,
        };
        match shard.start(req).await {
            ShardResponse::Produce(mut v) => v.remove(0),
            _ => panic!("not a produce answer"),
        }
    }

    async fn fetch(shard: &Rc<Shard>, partition: i32, epoch: i32) -> ops::FetchOutcome {
        let topics: Vec<Arc<str>> = vec![Arc::from("t")];
        let parts = [FetchPart {
            topic: 0,
            partition,
            fetch_offset: 0,
            max_bytes: 1 << 20,
            current_leader_epoch: epoch,
        }];
        shard
            .read_partitions(&topics, &parts, 1 << 20, false)
            .await
            .remove(0)
    }

    async fn list_latest(shard: &Rc<Shard>, partition: i32) -> ops::ListOffsetsOutcome {
        shard
            .list_offsets(vec![ListOffsetsPart {
                part: PartRef {
                    topic: "t".into(),
                    partition,
                },
                timestamp: -1,
                current_leader_epoch: -1,
            }])
            .await
            .remove(0)
    }

    fn one_record() -> Bytes {
        Bytes::from(batch(&[TestRecord::default()], 0))
    }

    #[test]
    fn replicated_partitions_are_served_by_their_leader_only() {
        LocalExecutorBuilder::default()
            .spawn(|| async move {
                let dir = tempfile::tempdir().unwrap();
                let shard = core(dir.path()).await;
                // Standalone: appended locally, as always.
                assert_eq!(produce(&shard, 0, one_record()).await.base_offset, 0);

                // In a cluster, before its group is attached, the partition is served to nobody;
                // the answer names the metadata's leader.
                shard.set_cluster_state(state());
                let o = produce(&shard, 0, one_record()).await;
                assert_eq!(o.error, ResponseError::NotLeaderOrFollower.code());
                assert_eq!(o.current_leader, Some((2, 0)));
                // A partition this node holds no replica of: the same.
                let o = produce(&shard, 1, one_record()).await;
                assert_eq!(o.error, ResponseError::NotLeaderOrFollower.code());
                assert_eq!(fetch(&shard, 1, -1).await.current_leader, Some((2, 0)));

                // A follower replica: refuses with the leader its group knows, and its epoch.
                let fake = Fake::new(
                    Leadership {
                        leader: Some(NodeId(2)),
                        epoch: 5,
                        is_local: false,
                    },
                    1,
                    true,
                );
                let handle: Rc<dyn ReplicaHandle> = fake.clone();
                assert!(shard.attach_replica("t", 0, TOPIC, Some(handle)).is_some());
                let o = produce(&shard, 0, one_record()).await;
                assert_eq!(o.error, ResponseError::NotLeaderOrFollower.code());
                assert_eq!(o.current_leader, Some((2, 5)));
                assert!(fake.proposed.borrow().is_empty(), "a follower proposes nothing");
                let f = fetch(&shard, 0, -1).await;
                assert_eq!(f.error, ResponseError::NotLeaderOrFollower.code());
                assert_eq!(f.current_leader, Some((2, 5)));
                assert_eq!(
                    list_latest(&shard, 0).await.error,
                    ResponseError::NotLeaderOrFollower.code()
                );
                // No leader elected: writes hear LEADER_NOT_AVAILABLE.
                fake.leadership.set(Leadership {
                    leader: None,
                    epoch: 5,
                    is_local: false,
                });
                assert_eq!(
                    produce(&shard, 0, one_record()).await.error,
                    ResponseError::LeaderNotAvailable.code()
                );

                // The leader: writes are proposals (answered with the group's offset); reads,
                // ListOffsets and epochs are the group's, capped at the commit offset.
                fake.leadership.set(Leadership {
                    leader: Some(NodeId(1)),
                    epoch: 6,
                    is_local: true,
                });
                let log = shard.log_for("t", 0).unwrap();
                shard.store.set_commit_cap(log, Some(1)).unwrap();
                let o = produce(&shard, 0, one_record()).await;
                assert_eq!((o.error, o.base_offset), (0, 1));
                assert_eq!(fake.proposed.borrow().len(), 1);
                assert_eq!(fake.proposed.borrow()[0].1, Acks::All);
                let f = fetch(&shard, 0, 6).await;
                assert_eq!((f.error, f.high_watermark), (0, 1));
                assert_eq!(
                    fetch(&shard, 0, 5).await.error,
                    ResponseError::FencedLeaderEpoch.code()
                );
                assert_eq!(
                    fetch(&shard, 0, 7).await.error,
                    ResponseError::UnknownLeaderEpoch.code()
                );
                let l = list_latest(&shard, 0).await;
                assert_eq!((l.error, l.offset, l.leader_epoch), (0, 1, 6));

                // An idempotent producer's pipelined batches are proposed in sequence; a retry of
                // one in flight is not proposed again, one already in the log is a duplicate.
                let idem =
                    |seq: i32| Bytes::from(batch_with_producer(&[TestRecord::default()], 0, 9, 0, seq));
                let request = |records: Bytes| ShardRequest::Produce {
                    parts: vec![ProducePart {
                        part: PartRef {
                            topic: "t".into(),
                            partition: 0,
                        },
                        records,
                    }],
                    wait: true,
                    acks: 1,
                    arrived: None,
                };
                fake.released.set(false);
                let first = shard.start(request(idem(0)));
                let second = shard.start(request(idem(1)));
                assert_eq!(fake.proposed.borrow().len(), 3, "both proposed while in flight");
                assert_eq!(fake.proposed.borrow()[2].1, Acks::Leader);
                assert_eq!(
                    produce(&shard, 0, idem(0)).await.error,
                    ResponseError::RequestTimedOut.code(),
                    "a retry of a batch in flight is not proposed again"
                );
                assert_eq!(
                    produce(&shard, 0, idem(5)).await.error,
                    ResponseError::OutOfOrderSequenceNumber.code(),
                    "a gap after the batches in flight is refused"
                );
                assert_eq!(fake.proposed.borrow().len(), 3);
                fake.released.set(true);
                for (f, offset) in [(first, 2), (second, 3)] {
                    match f.await {
                        ShardResponse::Produce(v) => assert_eq!((v[0].error, v[0].base_offset), (0, offset)),
                        _ => panic!("not a produce answer"),
                    }
                }
            })
            .unwrap()
            .join()
            .unwrap();
    }

    /// A leader that no longer hears a majority of its replicas refuses reads and new writes,
    /// and answers the writes waiting for their commit, without a current leader; the waiting
    /// proposals go on, so a retry is still recognised while one is in flight.
    #[test]
    fn a_leader_cut_off_from_its_replicas_sends_its_clients_elsewhere() {
        LocalExecutorBuilder::default()
            .spawn(|| async move {
                let dir = tempfile::tempdir().unwrap();
                let shard = core(dir.path()).await;
                shard.set_cluster_state(state());
                let fake = Fake::new(
                    Leadership {
                        leader: Some(NodeId(1)),
                        epoch: 3,
                        is_local: true,
                    },
                    0,
                    false,
                );
                let handle: Rc<dyn ReplicaHandle> = fake.clone();
                assert!(shard.attach_replica("t", 0, TOPIC, Some(handle)).is_some());
                let idem =
                    |seq: i32| Bytes::from(batch_with_producer(&[TestRecord::default()], 0, 9, 0, seq));

                // A write in flight while the leader hears its followers waits for its commit.
                let waiting = shard.start(ShardRequest::Produce {
                    parts: vec![ProducePart {
                        part: PartRef {
                            topic: "t".into(),
                            partition: 0,
                        },
                        records: idem(0),
                    }],
                    wait: true,
                    acks: -1,
                    arrived: None,
                });
                futures::pin_mut!(waiting);
                let early = glommio::timer::sleep(CUT_OFF_CHECK * 2);
                futures::pin_mut!(early);
                assert!(
                    matches!(
                        futures::future::select(&mut waiting, early).await,
                        futures::future::Either::Right(_)
                    ),
                    "answered before its commit"
                );

                // Cut off: the waiting write is answered within a check, without a leader.
                fake.hears.set(false);
                let started = Instant::now();
                let o = match waiting.await {
                    ShardResponse::Produce(mut v) => v.remove(0),
                    _ => panic!("not a produce answer"),
                };
                assert!(started.elapsed() < CUT_OFF_CHECK * 3, "{:?}", started.elapsed());
                let refused = (ResponseError::NotLeaderOrFollower.code(), None, true);
                assert_eq!((o.error, o.current_leader, o.cut_off), refused);
                // New writes and reads are refused at once and propose nothing.
                let o = produce(&shard, 0, one_record()).await;
                assert_eq!((o.error, o.current_leader, o.cut_off), refused);
                let f = fetch(&shard, 0, 3).await;
                assert_eq!((f.error, f.current_leader, f.cut_off), refused);
                assert_eq!(fake.proposed.borrow().len(), 1);

                // Heard again before any other leader was elected: the first proposal is still
                // in flight, so its retry is not proposed twice; once it resolves its in-flight
                // record is cleared (this stand-in stores nothing, so the retry is then
                // proposed anew rather than found in the log).
                fake.hears.set(true);
                assert_eq!(
                    produce(&shard, 0, idem(0)).await.error,
                    ResponseError::RequestTimedOut.code(),
                    "a retry while the cut-off proposal is in flight"
                );
                assert_eq!(fake.proposed.borrow().len(), 1);
                fake.released.set(true);
                let log = shard.log_for("t", 0).unwrap();
                shard.store.set_commit_cap(log, None).unwrap();
                let mut answer = produce(&shard, 0, idem(0)).await;
                for _ in 0..100 {
                    if answer.error != ResponseError::RequestTimedOut.code() {
                        break;
                    }
                    glommio::timer::sleep(Duration::from_millis(5)).await;
                    answer = produce(&shard, 0, idem(0)).await;
                }
                assert_eq!((answer.error, answer.base_offset), (0, 1));
                assert_eq!(fake.proposed.borrow().len(), 2);
            })
            .unwrap()
            .join()
            .unwrap();
    }

    #[test]
    fn in_a_cluster_a_partition_is_owned_by_the_shard_the_metadata_places_it_on() {
        let mut s = (*state()).clone();
        s.apply(&Record::Partition(PartitionRecord {
            topic: TOPIC,
            partition: PartitionId(2),
            replicas: vec![
                Replica {
                    broker: NodeId(1),
                    shard: ShardId(3),
                },
                Replica {
                    broker: NodeId(2),
                    shard: ShardId(0),
                },
            ],
            isr: vec![NodeId(1), NodeId(2)],
            leader: Some(NodeId(1)),
            leader_epoch: LeaderEpoch(0),
            partition_epoch: PartitionEpoch(0),
        }));
        assert_eq!(placed_shard(&s, "t", 2, NodeId(1), 4), Some(ShardId(3)));
        assert_eq!(placed_shard(&s, "t", 2, NodeId(2), 4), Some(ShardId(0)));
        // A shard this process does not have, a replica elsewhere, an unknown topic: the hash.
        assert_eq!(placed_shard(&s, "t", 2, NodeId(1), 2), None);
        assert_eq!(placed_shard(&s, "t", 2, NodeId(3), 4), None);
        assert_eq!(placed_shard(&s, "u", 0, NodeId(1), 4), None);
    }
}
