//! Fetch (1): reads from the owning shards, long-polls until `min_bytes` or `max_wait_ms`,
//! bounds the answer by `max_bytes` (whole batches, at least one), and keeps incremental fetch
//! sessions (KIP-227) for clients that open them.
//!
//! With partitions on several shards, `max_bytes` is shared between the owners in proportion to
//! their partitions, and what an owner could not use is read from the partitions another
//! skipped, in a second round ([`read_once`]; BENCHMARKS.md#fetch-budget-split). An owner plans
//! its partitions' reads in the request's order, each reserving from its share the most it can
//! return, and runs several at once (`Shard::read_partitions`); the handler bounds the whole
//! answer after the reads. A partition's records of [`SHARED_RECORDS_MIN_BYTES`] or more go out
//! as a segment of their own, the very buffer the read returned, and records far behind a log's
//! end may be a region of the segment file that the connection sends with `sendfile`
//! (BENCHMARKS.md#fetch-answer-segments, BENCHMARKS.md#sendfile).
//!
//! A Fetch can name every partition of a topic on every request (librdkafka opens no fetch
//! session), so the per-partition path makes no allocation of its own: a topic's name is one
//! `Arc<str>` for all its partitions, a request to an owner names each topic once in a table its
//! partitions index (`TopicTable`), each partition's owner comes from hashing its topic's name
//! once per run of that topic ([`owners_of`]), and the owner finds a run of a topic's partitions
//! with one lookup of the topic (BENCHMARKS.md#fetch-per-partition).

use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::future::{join_all, select_all};
use futures::FutureExt;
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, NodeEndpoint, PartitionData};
use kafka_protocol::messages::{ApiKey, BrokerId, FetchRequest, FetchResponse, TopicName};
use kafka_protocol::protocol::buf::ByteBufMut;
use kafka_protocol::protocol::{Encodable, Message, VersionRange};
use kafka_protocol::ResponseError;
use strand_protocol::fetch_frame::{encode_fetch_response_with, ExternalRecords};
use strand_protocol::header::EncodeError;
use strand_protocol::types::{ShardId, TopicId};
use strand_storage::FileRegion;

use super::{str_bytes, Frame, Handler, Reply, RequestCtx};
use crate::fetch_session::{Observed, SessionMode, SessionPartition};
use crate::metadata::TopicOwners;
use crate::shard::ops::{
    FetchOutcome, FetchPart, Records, ShardRequest, ShardResponse, TopicTable, WaitPart,
};
use crate::shard::Shard;

pub(crate) struct Fetch;

/// A Fetch answer: the response, and the partitions whose records are regions of segment files
/// the connection sends as they are (their records in `resp` are empty until then; see
/// [`encode_fetch_response_with`]).
pub(crate) struct FetchAnswer {
    resp: FetchResponse,
    regions: Vec<ExternalRecords<Arc<FileRegion>>>,
}

impl From<FetchResponse> for FetchAnswer {
    fn from(resp: FetchResponse) -> Self {
        FetchAnswer {
            resp,
            regions: Vec::new(),
        }
    }
}

impl Message for FetchAnswer {
    const VERSIONS: VersionRange = FetchResponse::VERSIONS;
    const DEPRECATED_VERSIONS: Option<VersionRange> = FetchResponse::DEPRECATED_VERSIONS;
}

/// Only [`Fetch::encode`] can encode file regions; this encodes answers without any.
impl Encodable for FetchAnswer {
    fn encode<B: ByteBufMut>(&self, buf: &mut B, version: i16) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.regions.is_empty(),
            "a Fetch answer with file regions encoded whole"
        );
        self.resp.encode(buf, version)
    }

    fn compute_size(&self, version: i16) -> anyhow::Result<usize> {
        anyhow::ensure!(
            self.regions.is_empty(),
            "a Fetch answer with file regions sized whole"
        );
        self.resp.compute_size(version)
    }
}

/// Longest long-poll honoured, whatever the client asks.
const MAX_WAIT_CAP: Duration = Duration::from_secs(30);

/// A partition's records at least this large are written to the socket from the buffer the log
/// read returned, as their own segment of the response; smaller ones are copied into the
/// encoded fields around them (a write per segment costs more than copying a few KiB).
const SHARED_RECORDS_MIN_BYTES: usize = 16 * 1024;

/// A partition the request names that cannot be served at all.
struct Unknown {
    name: String,
    id: TopicId,
    partition: i32,
    code: ResponseError,
}

/// The partitions of a request for one owner shard: their topics named once each (consecutive
/// partitions of a topic share its entry), and each partition's index in the Fetch.
struct ForOwner<P> {
    topics: TopicTable,
    idx: Vec<usize>,
    parts: Vec<P>,
}

impl<P> Default for ForOwner<P> {
    fn default() -> Self {
        ForOwner {
            topics: Vec::new(),
            idx: Vec::new(),
            parts: Vec::new(),
        }
    }
}

impl<P> ForOwner<P> {
    /// The index of `topic` in the table, added if it is not the last one.
    fn topic(&mut self, topic: &Arc<str>) -> u32 {
        // `Arc<str>`'s `==` compares pointers before contents.
        if self.topics.last() != Some(topic) {
            self.topics.push(topic.clone());
        }
        u32::try_from(self.topics.len().saturating_sub(1)).unwrap_or(u32::MAX)
    }
}

/// Groups `parts[i]` (owned by `owners[i]`) for each `i` in `which` by owner, each made by
/// `make(i, part, its topic's index in the owner's table)`.
fn group_by_owner<P>(
    parts: &[SessionPartition],
    owners: &[ShardId],
    which: impl Iterator<Item = usize>,
    make: impl Fn(usize, &SessionPartition, u32) -> P,
) -> BTreeMap<ShardId, ForOwner<P>> {
    let mut out: BTreeMap<ShardId, ForOwner<P>> = BTreeMap::new();
    for i in which {
        let (Some(p), Some(owner)) = (parts.get(i), owners.get(i)) else {
            continue;
        };
        let list = out.entry(*owner).or_default();
        let topic = list.topic(&p.topic);
        list.idx.push(i);
        list.parts.push(make(i, p, topic));
    }
    out
}

/// Reads every partition once, from their owners, in parallel, within `max_bytes` in total.
///
/// With partitions on several shards, each owner gets a share of `max_bytes` in proportion to
/// its partitions (each owner reading up to the whole of it would read bytes the answer then
/// drops). If the shares left room that an owner could not use, partitions another owner
/// skipped for lack of budget are read in a second round with what is left.
async fn read_once(
    shard: &Rc<Shard>,
    parts: &[SessionPartition],
    owners: &[ShardId],
    max_bytes: usize,
) -> Vec<FetchOutcome> {
    let mut out = vec![FetchOutcome::error(ResponseError::UnknownServerError); parts.len()];
    let all: Vec<usize> = (0..parts.len()).collect();
    read_into(shard, parts, owners, &all, max_bytes, &mut out).await;
    let used: usize = out.iter().map(FetchOutcome::bytes).sum();
    let left = max_bytes.saturating_sub(used);
    let skipped: Vec<usize> = all
        .into_iter()
        .filter(|&i| {
            out.get(i)
                .is_some_and(|o| o.cut && o.records.is_none() && o.error == 0)
        })
        .collect();
    let room_for_one = skipped
        .iter()
        .filter_map(|&i| parts.get(i))
        .map(|p| usize::try_from(p.max_bytes).unwrap_or(0))
        .min()
        .is_some_and(|smallest| left >= smallest.max(1));
    if room_for_one {
        read_into(shard, parts, owners, &skipped, left, &mut out).await;
    }
    out
}

/// Reads `parts[i]` (owned by `owners[i]`) for each `i` in `which` into `out[i]`, sharing
/// `max_bytes` between owners.
async fn read_into(
    shard: &Rc<Shard>,
    parts: &[SessionPartition],
    owners: &[ShardId],
    which: &[usize],
    max_bytes: usize,
    out: &mut [FetchOutcome],
) {
    let by_owner = group_by_owner(parts, owners, which.iter().copied(), |_, p, topic| FetchPart {
        topic,
        partition: p.partition,
        fetch_offset: p.fetch_offset,
        max_bytes: usize::try_from(p.max_bytes).unwrap_or(0),
        current_leader_epoch: p.current_leader_epoch,
    });
    let total = which.len().max(1);
    let mut calls = Vec::new();
    for (owner, list) in by_owner {
        let share = if list.parts.len() == total {
            max_bytes
        } else {
            (max_bytes / total).saturating_mul(list.parts.len()).max(1)
        };
        let ForOwner { topics, idx, parts } = list;
        let fut = shard
            .dispatch(
                owner,
                ShardRequest::Fetch {
                    topics,
                    parts,
                    max_bytes: share,
                    regions: true,
                },
            )
            .await;
        calls.push(async move {
            let answers = match fut {
                Ok(f) => match f.await {
                    Ok(ShardResponse::Fetch(v)) => v,
                    _ => Vec::new(),
                },
                Err(_) => Vec::new(),
            };
            (idx, answers)
        });
    }
    for (idx, answers) in join_all(calls).await {
        for (i, a) in idx.into_iter().zip(answers) {
            if let Some(slot) = out.get_mut(i) {
                *slot = a;
            }
        }
    }
}

/// Waits until an owner reports data past what the last read saw, or the timeout.
///
/// `results` are that read's outcomes, one per partition: a partition is waited on past its
/// fetch offset or past the high watermark the read saw, whichever is higher. Data already
/// there when the read ran is not news: waking for it would read the same bytes again at
/// once, in a loop, for as long as `min_bytes` stays out of reach (e.g. a `max_bytes` below
/// `min_bytes`), and keep the shard busy until `max_wait_ms`.
async fn wait_any(
    shard: &Rc<Shard>,
    parts: &[SessionPartition],
    owners: &[ShardId],
    results: &[FetchOutcome],
    timeout: Duration,
) {
    let by_owner = group_by_owner(parts, owners, 0..parts.len(), |i, p, topic| WaitPart {
        topic,
        partition: p.partition,
        offset: p
            .fetch_offset
            .max(results.get(i).map_or(-1, |r| r.high_watermark)),
    });
    let timeout_ms = timeout.as_millis() as u64;
    let mut waits = Vec::new();
    for (owner, list) in by_owner {
        if let Ok(f) = shard
            .dispatch(
                owner,
                ShardRequest::WaitForData {
                    topics: list.topics,
                    parts: list.parts,
                    timeout_ms,
                },
            )
            .await
        {
            waits.push(f);
        }
    }
    if waits.is_empty() {
        glommio::timer::sleep(timeout).await;
    } else {
        let _ = select_all(waits).await;
    }
}

/// The owner shard of each partition, hashing each run of one topic's name once.
fn owners_of(shard: &Shard, parts: &[SessionPartition]) -> Vec<ShardId> {
    if shard.cluster_state().is_some() {
        // In a cluster the metadata places each replica on a shard.
        return parts.iter().map(|p| shard.owner(&p.topic, p.partition)).collect();
    }
    let mut last: Option<(&Arc<str>, TopicOwners)> = None;
    parts
        .iter()
        .map(|p| {
            let owners = match last {
                Some((t, owners)) if *t == p.topic => owners,
                _ => {
                    let owners = TopicOwners::new(&p.topic, shard.shards);
                    last = Some((&p.topic, owners));
                    owners
                }
            };
            owners.of(p.partition)
        })
        .collect()
}

impl Handler for Fetch {
    const KEY: ApiKey = ApiKey::Fetch;
    const MIN: i16 = 4;
    const MAX: i16 = 18;
    type Request = FetchRequest;
    type Response = FetchAnswer;

    async fn handle(ctx: Rc<RequestCtx>, req: FetchRequest) -> Reply<FetchAnswer> {
        let shard = ctx.shard.clone();
        let version = ctx.version;
        let md = shard.metadata();
        let by_id = version >= 13;
        let mut unknown = Vec::new();
        let mut requested = Vec::new();
        for t in &req.topics {
            let meta = if by_id {
                md.topic_by_id(TopicId(t.topic_id))
            } else {
                md.topic(t.topic.0.as_str())
            };
            // One name for all of this topic's partitions in the request.
            let name: Option<Arc<str>> = meta.map(|m| Arc::from(m.name.as_str()));
            for p in &t.partitions {
                match (meta, &name) {
                    (Some(m), Some(name)) if p.partition >= 0 && p.partition < m.partitions => requested
                        .push(SessionPartition::new(
                            name.clone(),
                            m.id,
                            p.partition,
                            p.fetch_offset,
                            p.partition_max_bytes,
                            p.current_leader_epoch,
                        )),
                    (Some(m), _) => unknown.push(Unknown {
                        name: m.name.clone(),
                        id: m.id,
                        partition: p.partition,
                        code: ResponseError::UnknownTopicOrPartition,
                    }),
                    (None, _) => unknown.push(Unknown {
                        name: t.topic.0.as_str().to_owned(),
                        id: TopicId(t.topic_id),
                        partition: p.partition,
                        code: if by_id {
                            ResponseError::UnknownTopicId
                        } else {
                            ResponseError::UnknownTopicOrPartition
                        },
                    }),
                }
            }
        }
        let forgotten: Vec<(String, i32)> = req
            .forgotten_topics_data
            .iter()
            .flat_map(|f| {
                let name = if by_id {
                    md.topic_by_id(TopicId(f.topic_id)).map(|m| m.name.clone())
                } else {
                    Some(f.topic.0.as_str().to_owned())
                };
                f.partitions
                    .iter()
                    .filter_map(move |p| name.clone().map(|n| (n, *p)))
            })
            .collect();
        let begun = if version >= 7 {
            ctx.subsystems.fetch_sessions.cache.borrow_mut().begin(
                req.session_id,
                req.session_epoch,
                requested,
                &forgotten,
            )
        } else {
            Ok((SessionMode::Sessionless, requested))
        };
        let (mode, parts) = match begun {
            Ok(x) => x,
            Err(code) => {
                return Reply::Now(FetchAnswer::from(
                    FetchResponse::default()
                        .with_error_code(code.code())
                        .with_session_id(0),
                ));
            }
        };
        shard
            .metrics
            .fetch_sessions(ctx.subsystems.fetch_sessions.cache.borrow().len());
        let owners = owners_of(&shard, &parts);
        // The shards read: the first owner, and another if there is one.
        let first = owners.first().copied();
        let other = owners.iter().copied().find(|o| Some(*o) != first);
        ctx.conn.affinity.fetched(first.into_iter().chain(other));
        if let SessionMode::Full { session_id } | SessionMode::Incremental { session_id } = mode {
            ctx.conn.used_session(session_id);
        }

        let broker_max = shard.config.fetch_max_bytes as usize;
        let max_bytes = usize::try_from(req.max_bytes).unwrap_or(0).min(broker_max).max(1);
        let min_bytes = usize::try_from(req.min_bytes).unwrap_or(0);
        let max_wait = Duration::from_millis(u64::try_from(req.max_wait_ms).unwrap_or(0)).min(MAX_WAIT_CAP);
        let read_committed = req.isolation_level == 1;
        let ctx = ctx.clone();
        Reply::Later(
            async move {
                let deadline = Instant::now() + max_wait;
                let mut results = read_once(&shard, &parts, &owners, max_bytes).await;
                loop {
                    let total: usize = results.iter().map(FetchOutcome::bytes).sum();
                    let errors = results.iter().any(|r| r.error != 0);
                    let left = deadline.saturating_duration_since(Instant::now());
                    if total >= min_bytes
                        || errors
                        || left.is_zero()
                        || parts.is_empty()
                        || shard.shutting_down.get()
                    {
                        break;
                    }
                    wait_any(&shard, &parts, &owners, &results, left).await;
                    results = read_once(&shard, &parts, &owners, max_bytes).await;
                }
                // Bound the whole answer: whole partitions' data only, the first one always.
                let mut total = 0usize;
                for r in &mut results {
                    let n = r.bytes();
                    if n > 0 {
                        if total > 0 && total + n > max_bytes {
                            r.records = None;
                        } else {
                            total += n;
                        }
                    }
                }
                shard.metrics.bytes_out(total);
                let observed: Vec<Observed> = results
                    .iter()
                    .map(|r| Observed {
                        error: r.error,
                        high_watermark: r.high_watermark,
                        last_stable_offset: r.last_stable_offset,
                        log_start_offset: r.log_start_offset,
                        has_records: r.records.is_some(),
                    })
                    .collect();
                let include = ctx
                    .subsystems
                    .fetch_sessions
                    .cache
                    .borrow_mut()
                    .finish(&mode, &observed);
                let session_id = match mode {
                    SessionMode::Sessionless => 0,
                    SessionMode::Full { session_id } | SessionMode::Incremental { session_id } => session_id,
                };

                let mut topics: Vec<FetchableTopicResponse> = Vec::new();
                let mut regions = Vec::new();
                // Adds a partition's answer; returns its (topic, partition) indices.
                let mut push = |name: &str, id: TopicId, data: PartitionData| -> (usize, usize) {
                    let same = topics.last().is_some_and(|t| {
                        if by_id {
                            t.topic_id == id.0
                        } else {
                            t.topic.0.as_str() == name
                        }
                    });
                    if !same {
                        let mut t = FetchableTopicResponse::default();
                        if by_id {
                            t.topic_id = id.0;
                        } else {
                            t.topic = TopicName(str_bytes(name));
                        }
                        topics.push(t);
                    }
                    let topic = topics.len().saturating_sub(1);
                    match topics.last_mut() {
                        Some(t) => {
                            t.partitions.push(data);
                            (topic, t.partitions.len() - 1)
                        }
                        None => (0, 0),
                    }
                };
                let mut leaders = Vec::new();
                for ((p, r), inc) in parts.iter().zip(results).zip(include) {
                    if r.cut_off {
                        ctx.conn.hang_up();
                    }
                    if !inc {
                        continue;
                    }
                    // Filled in place: the builder methods move the whole struct once per
                    // field, for every partition of every answer.
                    let mut data = PartitionData::default();
                    data.partition_index = p.partition;
                    data.error_code = r.error;
                    data.high_watermark = r.high_watermark;
                    data.last_stable_offset = r.last_stable_offset;
                    data.log_start_offset = if version >= 5 { r.log_start_offset } else { -1 };
                    if let Some((leader, epoch)) = r.current_leader {
                        leaders.push(leader);
                        if version >= 12 {
                            data.current_leader.leader_id = BrokerId(leader);
                            data.current_leader.leader_epoch = epoch;
                        }
                    }
                    data.aborted_transactions = read_committed.then(Vec::new);
                    let region = match r.records {
                        Some(Records::Region(region)) => {
                            data.records = Some(Bytes::new());
                            Some(region)
                        }
                        Some(Records::Bytes(bytes)) => {
                            data.records = Some(bytes);
                            None
                        }
                        None => {
                            data.records = Some(Bytes::new());
                            None
                        }
                    };
                    let (topic, partition) = push(&p.topic, p.topic_id, data);
                    if let Some(region) = region {
                        regions.push(ExternalRecords {
                            topic,
                            partition,
                            len: region.len,
                            item: region,
                        });
                    }
                }
                for u in unknown {
                    let data = PartitionData::default()
                        .with_partition_index(u.partition)
                        .with_error_code(u.code.code())
                        .with_high_watermark(-1)
                        .with_records(Some(Bytes::new()));
                    push(&u.name, u.id, data);
                }
                let mut resp = FetchResponse::default()
                    .with_session_id(session_id)
                    .with_responses(topics);
                if version >= 16 {
                    resp.node_endpoints = super::cluster_view::leader_endpoints(&ctx, leaders)
                        .into_iter()
                        .map(|e| {
                            NodeEndpoint::default()
                                .with_node_id(BrokerId(e.node))
                                .with_host(str_bytes(&e.host))
                                .with_port(i32::from(e.port))
                                .with_rack(e.rack.as_deref().map(str_bytes))
                        })
                        .collect();
                }
                FetchAnswer { resp, regions }
            }
            .boxed_local(),
        )
    }

    fn encode(correlation_id: i32, version: i16, answer: FetchAnswer) -> Result<Frame, EncodeError> {
        encode_fetch_response_with(
            correlation_id,
            version,
            answer.resp,
            SHARED_RECORDS_MIN_BYTES,
            answer.regions,
        )
    }

    fn error_codes(answer: &FetchAnswer, out: &mut Vec<i16>) {
        let resp = &answer.resp;
        out.push(resp.error_code);
        for t in &resp.responses {
            for p in &t.partitions {
                out.push(p.error_code);
            }
        }
    }
}
