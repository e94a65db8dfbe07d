//! The queue service behind the HTTP API ([`crate::queue::doors::http::QueueApi`]), on the
//! connection's shard: it resolves queues (topics) and message ids, picks partitions, and sends
//! [`QueueOp`]s to the shards that own the partitions, where [`crate::queue::host`] runs the
//! engines; on a cluster node, to the shards of the partitions' leaders, on this node or
//! forwarded to another ([`route`]), so that every node answers for every queue. Queue
//! administration goes through the controller like Kafka's topic admin
//! ([`crate::topic_admin`]: in a cluster, the active controller decides): a queue's settings
//! are `strand.queue.*` topic configs.
//!
//! - **Publish**: a message goes to the partition Kafka's default partitioner (murmur2) picks
//!   for its key, else for its dedup token (a retry must meet its first publish's dedup state),
//!   else round-robin; each partition's messages go to its owner as one operation.
//! - **Lease**: the owners are asked in turn, from a rotating partition on, until the request's
//!   count is leased; with nothing to lease, the request long-polls every owner at once until
//!   one has something or the wait ends, and ends leasing nothing once the client is gone
//!   ([`PeerGone`]).
//! - **Settle**: routed by the message id (topic id, partition) to the partition's owner.

use std::collections::BTreeMap;
use std::pin::pin;
use std::rc::Rc;

use futures::future::{join_all, select, select_all};
use kafka_protocol::ResponseError;
use strand_protocol::partitioner::partition_for_key;
use strand_protocol::types::{Offset, PartitionId};

use crate::config::{DEAD_LETTER_SUFFIX, QUEUE_KEYS};
use crate::controller::{self, ConfigEdit, ControllerOp, PartitionIncrease};
use crate::metadata::{partitions_u64, AdminError, NewTopic, PartitionLimit, TopicMeta};
use crate::queue::doors::http::types::SettleActionKind;
use crate::queue::doors::http::{
    ApiError, GroupStats, LeaseRequest, LeasedMessage, PeerGone, PublishMessage, Published, PutQueue,
    QueueApi, QueueInfo, QueueOrdering, QueueSettings, RedriveRequest, Redriven, SettleAction, SettleBatch,
    SettleOutcome, SettleRequest, Settled, SettledState,
};
use crate::queue::engine::dead_letter::{HEADER_MESSAGE_ID, HEADER_SOURCE_TOPIC};
use crate::queue::engine::{ExternalMessageId, Fence, MessageRef, Outcome, QueueError, SettleItem, SettleOp};
use crate::queue::host::route::{self, Route};
use crate::queue::host::{
    create_dead_letter_topic, OutMessage, QueueAnswer, QueueFailure, QueueHost, QueueOp,
    MAX_LEASE_ANSWER_BYTES,
};
use crate::shard::ops::{FetchPart, ListOffsetsPart, PartRef, Records, ShardRequest, ShardResponse};
use crate::shard::Shard;

/// How soon a long-polling lease asks again partitions that could not answer.
const UNAVAILABLE_RETRY: std::time::Duration = std::time::Duration::from_millis(100);

/// Bytes of the dead-letter topic read per step of a redrive.
const REDRIVE_READ_BYTES: usize = 1 << 20;
/// Messages republished per partition and step of a redrive.
const REDRIVE_CHUNK: usize = 500;
/// Items of a batch settle sent to one engine at once (its default lease batch).
const SETTLE_CHUNK: usize = 500;
/// Prefix of the header names a dead-letter copy gains (dropped again on redrive).
const DEAD_LETTER_HEADER_PREFIX: &str = "strand-dlq-";

/// The queue service of one shard.
pub(crate) struct ShardQueues {
    shard: Rc<Shard>,
    round_robin: std::cell::Cell<u64>,
}

impl ShardQueues {
    pub(crate) fn new(shard: Rc<Shard>) -> Self {
        ShardQueues {
            shard,
            round_robin: std::cell::Cell::new(0),
        }
    }
}

fn failure(e: QueueFailure) -> ApiError {
    super::errors::api_error(e)
}

fn engine_error(e: QueueError) -> ApiError {
    failure(QueueFailure::Engine(e))
}

fn unexpected() -> ApiError {
    ApiError::internal("unexpected answer from a shard")
}

impl ShardQueues {
    /// Resolves a message id to its partition and builds the engine's settle item.
    fn settle_item(
        &self,
        message_id: &str,
        req: &SettleRequest,
    ) -> Result<(String, i32, SettleItem), ApiError> {
        let id: ExternalMessageId = message_id
            .parse()
            .map_err(|_| ApiError::message_not_found(message_id))?;
        let md = self.shard.metadata();
        let t = md
            .topic_by_id(id.topic)
            .filter(|t| id.id.partition.0 < t.partitions)
            .ok_or_else(|| ApiError::message_not_found(message_id))?;
        crate::queue::host::group_dir_name(&req.group).map_err(failure)?;
        let (op, reason) = match &req.action {
            SettleAction::Ack => (SettleOp::Ack, None),
            SettleAction::Nack { delay_ms, reason } => {
                (SettleOp::Nack { delay_ms: *delay_ms }, reason.clone())
            }
            SettleAction::Reject { reason } => (SettleOp::Reject, reason.clone()),
            SettleAction::Extend {
                visibility_timeout_ms,
            } => (
                SettleOp::Extend {
                    visibility_ms: visibility_timeout_ms
                        .unwrap_or_else(|| t.config.queue_settings().visibility_timeout_ms),
                },
                None,
            ),
        };
        let item = SettleItem {
            target: MessageRef::Id(id.id),
            fence: Fence::Generation(crate::queue::engine::Generation(req.generation)),
            op,
            reason,
        };
        Ok((t.name.clone(), id.id.partition.0, item))
    }

    /// The HTTP answer of one settled item.
    fn settled_answer(
        &self,
        message_id: &str,
        kind: SettleActionKind,
        result: Result<crate::queue::engine::Settled, QueueError>,
    ) -> Result<Settled, ApiError> {
        let settled = result.map_err(|e| match e {
            QueueError::NotFound => ApiError::message_not_found(message_id),
            e => engine_error(e),
        })?;
        let now = self.shard.now_ms();
        let (state, lease_expires_at_ms, available_at_ms, attempts) = match settled.outcome {
            Outcome::Acked => (SettledState::Acknowledged, None, None, None),
            Outcome::Retry {
                not_before_ms,
                attempts,
            } => {
                if not_before_ms > now {
                    (SettledState::Delayed, None, Some(not_before_ms), Some(attempts))
                } else {
                    (SettledState::Available, None, None, Some(attempts))
                }
            }
            Outcome::DeadLettered { attempts, .. } => {
                (SettledState::DeadLettered, None, None, Some(attempts))
            }
            Outcome::Extended { expiry_ms } => (SettledState::Leased, Some(expiry_ms), None, None),
        };
        Ok(Settled {
            id: message_id.to_owned(),
            action: kind,
            state,
            lease_expires_at_ms,
            available_at_ms,
            attempts,
        })
    }

    fn topic(&self, queue: &str) -> Result<TopicMeta, ApiError> {
        match self.shard.metadata().topic(queue) {
            Some(t) if t.internal => Err(ApiError::invalid_queue_name(format!(
                "{queue} is an internal topic"
            ))),
            Some(t) => Ok(t.clone()),
            None => Err(ApiError::queue_not_found(queue)),
        }
    }

    /// Where the engines of `topic`-`partition` run ([`route::route`]).
    fn route(&self, topic: &str, partition: i32) -> Route {
        route::route(&self.shard, topic, partition)
    }

    /// Sends one operation to the engines' shard, on this node or another, and waits for its
    /// answer.
    async fn call(&self, route: Route, op: QueueOp) -> Result<QueueAnswer, ApiError> {
        match route {
            Route::Shard(owner) => {
                let answer = self
                    .shard
                    .call::<QueueHost>(owner, op)
                    .await
                    .map_err(|e| ApiError::unavailable(e.to_string()))?;
                answer.await.map_err(|e| ApiError::unavailable(e.to_string()))
            }
            Route::Node(node, shard) => route::forward(&self.shard, node, shard, op)
                .await
                .map_err(failure),
            Route::Leaderless => Err(failure(QueueFailure::NotLeader(None))),
        }
    }

    /// A rotating number (spreads publishes and leases over partitions).
    fn next_round_robin(&self) -> u64 {
        let n = self.round_robin.get();
        self.round_robin.set(n.wrapping_add(1));
        n
    }

    /// The partitions of a topic grouped by where their engines run, starting at a rotating
    /// partition.
    fn parts_by_route(&self, topic: &TopicMeta) -> Vec<(Route, Vec<PartRef>)> {
        let n = topic.partitions.max(1);
        let first = (self.next_round_robin() % n as u64) as i32;
        let mut by_route: Vec<(Route, Vec<PartRef>)> = Vec::new();
        for i in 0..n {
            let p = (first + i) % n;
            let route = self.route(&topic.name, p);
            let part = PartRef {
                topic: topic.name.clone(),
                partition: p,
            };
            match by_route.iter_mut().find(|(r, _)| *r == route) {
                Some((_, v)) => v.push(part),
                None => by_route.push((route, vec![part])),
            }
        }
        by_route
    }

    async fn info(&self, topic: &TopicMeta) -> Result<QueueInfo, ApiError> {
        let settings = topic.config.queue_settings();
        let dead_letter_topic = settings.dead_letter_topic_of(&topic.name);
        // Engine statistics of every shard running a partition's engines.
        let mut owners: Vec<Route> = Vec::new();
        for p in 0..topic.partitions {
            let r = self.route(&topic.name, p);
            if r != Route::Leaderless && !owners.contains(&r) {
                owners.push(r);
            }
        }
        let calls = owners.into_iter().map(|o| {
            self.call(
                o,
                QueueOp::Stats {
                    topic: topic.name.clone(),
                },
            )
        });
        let mut groups: BTreeMap<String, GroupStats> = BTreeMap::new();
        for answer in join_all(calls).await {
            let QueueAnswer::Stats(stats) = answer? else {
                return Err(unexpected());
            };
            for s in stats {
                let g = groups.entry(s.group).or_default();
                g.available += s.metrics.available;
                g.leased += s.metrics.leased;
                g.delayed += s.metrics.delayed;
                g.oldest_unacked_age_ms = g
                    .oldest_unacked_age_ms
                    .max(s.metrics.oldest_unacked_age_ms.unwrap_or(0));
            }
        }
        let dead = self.dead_letter_count(&dead_letter_topic).await;
        for g in groups.values_mut() {
            g.dead_lettered = dead;
        }
        Ok(QueueInfo {
            name: topic.name.clone(),
            topic_id: topic.id,
            partitions: u32::try_from(topic.partitions).unwrap_or(0),
            config: QueueSettings {
                max_attempts: settings.max_attempts,
                visibility_timeout_ms: settings.visibility_timeout_ms,
                backoff_base_ms: settings.backoff_base_ms,
                backoff_multiplier: settings.backoff_multiplier,
                backoff_max_ms: settings.backoff_max_ms,
                dead_letter_topic,
                ordering: if settings.ordering_by_key {
                    QueueOrdering::Key
                } else {
                    QueueOrdering::None
                },
                dedup_window_ms: settings.dedup_window_ms,
            },
            groups,
        })
    }

    /// Messages in a dead-letter topic (high watermark minus log start, over its partitions).
    async fn dead_letter_count(&self, name: &str) -> u64 {
        let Some(t) = self.shard.metadata().topic(name).cloned() else {
            return 0;
        };
        let mut items = Vec::new();
        for p in 0..t.partitions {
            for ts in [-2i64, -1] {
                let part = PartRef {
                    topic: t.name.clone(),
                    partition: p,
                };
                items.push((
                    part.clone(),
                    ListOffsetsPart {
                        part,
                        timestamp: ts,
                        current_leader_epoch: -1,
                    },
                ));
            }
        }
        let answers = crate::shard::scatter(
            &self.shard,
            items,
            |list| ShardRequest::ListOffsets(list.into_iter().map(|(_, l)| l).collect()),
            |r| match r {
                ShardResponse::ListOffsets(v) => Some(v.into_iter().map(|o| o.offset).collect()),
                _ => None,
            },
            -1i64,
        )
        .await;
        answers
            .chunks(2)
            .map(|c| match c {
                [start, end] if *start >= 0 && *end >= *start => (*end - *start) as u64,
                _ => 0,
            })
            .sum()
    }

    /// Topic configs for the settings a PUT names.
    fn config_pairs(req: &PutQueue) -> Vec<(&'static str, String)> {
        let mut pairs = Vec::new();
        let mut put = |key: &'static str, v: Option<String>| {
            if let Some(v) = v {
                pairs.push((key, v));
            }
        };
        put(QUEUE_KEYS[0], req.max_attempts.map(|v| v.to_string()));
        put(QUEUE_KEYS[1], req.visibility_timeout_ms.map(|v| v.to_string()));
        put(QUEUE_KEYS[2], req.backoff_base_ms.map(|v| v.to_string()));
        put(QUEUE_KEYS[3], req.backoff_multiplier.map(|v| v.to_string()));
        put(QUEUE_KEYS[4], req.backoff_max_ms.map(|v| v.to_string()));
        put(QUEUE_KEYS[5], req.dead_letter_topic.clone());
        put(
            QUEUE_KEYS[6],
            req.ordering.map(|o| match o {
                QueueOrdering::None => "none".to_owned(),
                QueueOrdering::Key => "key".to_owned(),
            }),
        );
        put(QUEUE_KEYS[7], req.dedup_window_ms.map(|v| v.to_string()));
        pairs
    }

    /// Refuses, before anything changes, a PUT whose new partitions the partition limits do not
    /// allow: the queue's (created or grown) and its dead-letter topic's when it will be created
    /// too, as one request.
    fn check_partition_limits(
        &self,
        queue: &str,
        req: &PutQueue,
        existing: Option<&TopicMeta>,
    ) -> Result<(), ApiError> {
        let current = existing.map_or(0, |t| t.partitions);
        let target = match req.partitions {
            Some(p) => i32::try_from(p).unwrap_or(i32::MAX),
            None if existing.is_some() => current,
            None => i32::try_from(self.shard.config.num_partitions).unwrap_or(1),
        }
        .max(current);
        let dead_letter = match (&req.dead_letter_topic, existing) {
            (Some(name), _) => name.clone(),
            (None, Some(t)) => t.config.queue_settings().dead_letter_topic_of(queue),
            (None, None) => format!("{queue}{DEAD_LETTER_SUFFIX}"),
        };
        let dead_letter_partitions = if self.shard.metadata().topic(&dead_letter).is_none() {
            target
        } else {
            0
        };
        let added = partitions_u64(target - current) + partitions_u64(dead_letter_partitions);
        if added == 0 {
            return Ok(());
        }
        controller::check_partitions_added(&self.shard, target, added).map_err(|(limit, e)| match limit {
            PartitionLimit::Node => ApiError::partition_limit_reached(e.message),
            PartitionLimit::Topic | PartitionLimit::Request => ApiError::too_many_partitions(e.message),
        })
    }

    /// Creates the queue's dead-letter topic if it does not exist.
    async fn ensure_dead_letter_topic(&self, topic: &TopicMeta) -> Result<(), ApiError> {
        let name = topic.config.queue_settings().dead_letter_topic_of(&topic.name);
        if self.shard.metadata().topic(&name).is_some() {
            return Ok(());
        }
        create_dead_letter_topic(&self.shard, &name, topic.partitions)
            .await
            .map(|_| ())
            .map_err(ApiError::invalid_setting)
    }

    /// Republishes up to `max` dead letters of one dead-letter partition; returns how many.
    async fn redrive_partition(
        &self,
        queue: &TopicMeta,
        dlq: &TopicMeta,
        partition: i32,
        max: u64,
    ) -> Result<u64, ApiError> {
        let part = PartRef {
            topic: dlq.name.clone(),
            partition,
        };
        let owner = self.shard.owner(&dlq.name, partition);
        let mut done = 0u64;
        loop {
            if done >= max {
                return Ok(done);
            }
            // The log start is the redrive cursor: redriven dead letters are deleted.
            let fetched = self
                .shard
                .dispatch(
                    owner,
                    ShardRequest::ListOffsets(vec![ListOffsetsPart {
                        part: part.clone(),
                        timestamp: -2,
                        current_leader_epoch: -1,
                    }]),
                )
                .await
                .map_err(|e| ApiError::unavailable(e.to_string()))?
                .await
                .map_err(|e| ApiError::unavailable(e.to_string()))?;
            let ShardResponse::ListOffsets(lo) = fetched else {
                return Err(unexpected());
            };
            let Some(start) = lo.first().map(|o| o.offset).filter(|o| *o >= 0) else {
                return Ok(done);
            };
            let answer = self
                .shard
                .dispatch(
                    owner,
                    ShardRequest::Fetch {
                        topics: vec![part.topic.as_str().into()],
                        parts: vec![FetchPart {
                            topic: 0,
                            partition: part.partition,
                            fetch_offset: start,
                            max_bytes: REDRIVE_READ_BYTES,
                            current_leader_epoch: -1,
                        }],
                        max_bytes: REDRIVE_READ_BYTES,
                        regions: false,
                    },
                )
                .await
                .map_err(|e| ApiError::unavailable(e.to_string()))?
                .await
                .map_err(|e| ApiError::unavailable(e.to_string()))?;
            let ShardResponse::Fetch(outcomes) = answer else {
                return Err(unexpected());
            };
            let bytes = match outcomes.into_iter().next().and_then(|o| o.records) {
                None => return Ok(done),
                Some(Records::Bytes(bytes)) => bytes,
                Some(Records::Region(_)) => return Err(unexpected()),
            };
            // Dead letters of this queue from `start` on, up to the first foreign record.
            let mut picked: Vec<(i64, ExternalMessageId, OutMessage)> = Vec::new();
            let mut stop = false;
            for b in strand_protocol::batch::BatchScanner::new(&bytes, false) {
                let end = b.position + b.header.total_bytes();
                if b.header.is_control() {
                    continue;
                }
                let records =
                    strand_protocol::records::decode_records(&bytes.slice(b.position..end), 64 << 20)
                        .map_err(|e| ApiError::internal(format!("undecodable dead letter: {e}")))?;
                for r in records {
                    if r.offset < start {
                        continue;
                    }
                    if picked.len() as u64 + done >= max || picked.len() >= REDRIVE_CHUNK {
                        stop = true;
                        break;
                    }
                    match redrive_copy(queue, &r) {
                        Some((id, m)) => picked.push((r.offset, id, m)),
                        None => {
                            stop = true;
                            break;
                        }
                    }
                }
                if stop {
                    break;
                }
            }
            if picked.is_empty() {
                return Ok(done);
            }
            // Republish, grouped by origin partition, in dead-letter order.
            let mut by_partition: BTreeMap<i32, Vec<(usize, OutMessage)>> = BTreeMap::new();
            for (i, (_, id, m)) in picked.iter().enumerate() {
                by_partition
                    .entry(id.id.partition.0)
                    .or_default()
                    .push((i, m.clone()));
            }
            let mut ok = vec![false; picked.len()];
            for (p, list) in by_partition {
                if p >= queue.partitions {
                    continue;
                }
                let idx: Vec<usize> = list.iter().map(|(i, _)| *i).collect();
                let answer = self
                    .call(
                        self.route(&queue.name, p),
                        QueueOp::Publish {
                            topic: queue.name.clone(),
                            partition: p,
                            messages: list.into_iter().map(|(_, m)| m).collect(),
                        },
                    )
                    .await?;
                let QueueAnswer::Published(results) = answer else {
                    return Err(unexpected());
                };
                for (i, r) in idx.into_iter().zip(results) {
                    // Still pending in the queue (an earlier redrive's copy): nothing to move.
                    let handled = matches!(r, Ok(_) | Err(QueueFailure::Engine(QueueError::AlreadyLive(_))));
                    if let Some(slot) = ok.get_mut(i) {
                        *slot = handled;
                    }
                }
            }
            // Delete the prefix that was moved.
            let moved = ok.iter().take_while(|b| **b).count();
            if moved == 0 {
                return Err(ApiError::unavailable("redrive could not republish a dead letter"));
            }
            let Some(&(last_offset, _, _)) = picked.get(moved - 1) else {
                return Ok(done);
            };
            let deleted = self
                .shard
                .dispatch(
                    owner,
                    ShardRequest::DeleteRecords(vec![(part.clone(), last_offset + 1)]),
                )
                .await
                .map_err(|e| ApiError::unavailable(e.to_string()))?
                .await
                .map_err(|e| ApiError::unavailable(e.to_string()))?;
            if !matches!(deleted, ShardResponse::DeleteRecords(ref v) if v.first().is_some_and(|(e, _)| *e == 0))
            {
                return Err(ApiError::unavailable("cannot delete redriven dead letters"));
            }
            done += moved as u64;
            if moved < picked.len() {
                return Ok(done);
            }
        }
    }
}

/// The message a dead letter becomes again: its payload, key and original headers, the id it
/// keeps, and a dedup token naming the dead-letter position (a re-run redrive appends nothing).
/// `None` when the record is not a dead letter of `queue`.
fn redrive_copy(
    queue: &TopicMeta,
    r: &strand_protocol::records::Record,
) -> Option<(ExternalMessageId, OutMessage)> {
    let header = |name: &str| {
        r.headers
            .iter()
            .find(|(k, _)| &k[..] == name.as_bytes())
            .and_then(|(_, v)| v.as_deref())
            .and_then(|v| std::str::from_utf8(v).ok())
    };
    if header(HEADER_SOURCE_TOPIC)? != queue.name {
        return None;
    }
    let id: ExternalMessageId = header(HEADER_MESSAGE_ID)?.parse().ok()?;
    if id.topic != queue.id {
        return None;
    }
    let headers = r
        .headers
        .iter()
        .filter_map(|(k, v)| {
            let k = std::str::from_utf8(k).ok()?;
            if k.starts_with(DEAD_LETTER_HEADER_PREFIX) || k == HEADER_MESSAGE_ID {
                return None;
            }
            Some((k.to_owned(), v.clone().unwrap_or_default()))
        })
        .collect();
    Some((
        id,
        OutMessage {
            payload: r.value.clone().unwrap_or_default(),
            key: r.key.clone(),
            headers,
            delay_ms: 0,
            dedup_token: Some(format!("redrive-{id}-{}", r.offset)),
            redrive_of: Some(id.id),
        },
    ))
}

/// The answer to a refused topic creation or growth: the node's partition limit (reached by a
/// request that passed the check before it, another having taken the room meanwhile), else an
/// invalid setting.
fn create_error(e: AdminError) -> ApiError {
    if e.code == ResponseError::PolicyViolation {
        ApiError::partition_limit_reached(e.message)
    } else {
        ApiError::invalid_setting(e.message)
    }
}

impl QueueApi for ShardQueues {
    /// A cluster node answers once it has the cluster metadata (as it accepts Kafka clients
    /// only then): a node that just restarted knows no queue yet, and a `404` would tell a
    /// client that its queue or message is gone for good.
    fn ready(&self) -> Result<(), ApiError> {
        if !self.shard.config.cluster.is_standalone() && self.shard.cluster_state().is_none() {
            metrics::counter!("strand_http_requests_refused_total", "reason" => "no cluster metadata yet")
                .increment(1);
            return Err(ApiError::unavailable(
                "this node has not loaded the cluster metadata yet; retry, or ask another node",
            ));
        }
        Ok(())
    }

    async fn put_queue(&self, queue: &str, req: PutQueue) -> Result<(bool, QueueInfo), ApiError> {
        req.validate(queue)?;
        let pairs = Self::config_pairs(&req);
        let existing = self.shard.metadata().topic(queue).cloned();
        if !existing.as_ref().is_some_and(|t| t.internal) {
            self.check_partition_limits(queue, &req, existing.as_ref())?;
        }
        let created = match existing {
            None => {
                let reply = crate::topic_admin::call(
                    &self.shard,
                    ControllerOp::CreateTopics {
                        topics: vec![NewTopic {
                            name: queue.to_owned(),
                            num_partitions: req
                                .partitions
                                .map_or(-1, |p| i32::try_from(p).unwrap_or(i32::MAX)),
                            replication_factor: -1,
                            assignments: vec![],
                            configs: pairs
                                .iter()
                                .map(|(k, v)| ((*k).to_owned(), Some(v.clone())))
                                .collect(),
                        }],
                        validate_only: false,
                    },
                )
                .await;
                match reply.results.first().and_then(|r| r.error.clone()) {
                    None => true,
                    // Created concurrently: update it like an existing queue.
                    Some(e) if e.code == ResponseError::TopicAlreadyExists => false,
                    Some(e) => return Err(create_error(e)),
                }
            }
            Some(t) if t.internal => {
                return Err(ApiError::invalid_queue_name(format!(
                    "{queue} is an internal topic"
                )))
            }
            Some(_) => false,
        };
        if !created {
            let t = self.topic(queue)?;
            if let Some(p) = req.partitions {
                let p = i32::try_from(p).unwrap_or(i32::MAX);
                if p < t.partitions {
                    return Err(ApiError::conflict(
                        "partitions_cannot_shrink",
                        format!(
                            "the queue has {} partitions; it cannot shrink to {p}",
                            t.partitions
                        ),
                    ));
                }
                if p > t.partitions {
                    let reply = crate::topic_admin::call(
                        &self.shard,
                        ControllerOp::CreatePartitions {
                            topics: vec![PartitionIncrease {
                                topic: queue.to_owned(),
                                count: p,
                                assignments: None,
                            }],
                            validate_only: false,
                        },
                    )
                    .await;
                    if let Some(e) = reply.results.first().and_then(|r| r.error.clone()) {
                        return Err(create_error(e));
                    }
                }
            }
            // base <= max against the current values.
            let current = t.config.queue_settings();
            let base = req.backoff_base_ms.unwrap_or(current.backoff_base_ms);
            let max = req.backoff_max_ms.unwrap_or(current.backoff_max_ms);
            if base > max {
                return Err(ApiError::invalid_setting(format!(
                    "`backoff_base_ms` ({base}) must not exceed `backoff_max_ms` ({max})"
                )));
            }
            if !pairs.is_empty() {
                let reply = crate::topic_admin::call(
                    &self.shard,
                    ControllerOp::AlterTopicConfig {
                        name: queue.to_owned(),
                        edits: pairs
                            .iter()
                            .map(|(k, v)| ConfigEdit::Set((*k).to_owned(), v.clone()))
                            .collect(),
                        replace: false,
                        validate_only: false,
                    },
                )
                .await;
                if let Some(e) = reply.results.first().and_then(|r| r.error.clone()) {
                    return Err(ApiError::invalid_setting(e.message));
                }
            }
        }
        let t = self.topic(queue)?;
        self.ensure_dead_letter_topic(&t).await?;
        Ok((created, self.info(&t).await?))
    }

    async fn get_queue(&self, queue: &str) -> Result<QueueInfo, ApiError> {
        let t = self.topic(queue)?;
        self.info(&t).await
    }

    async fn publish(&self, queue: &str, msgs: Vec<PublishMessage>) -> Result<Vec<Published>, ApiError> {
        let t = self.topic(queue)?;
        let n = t.partitions.max(1);
        // Partition: Kafka's default partitioner on the key; else on the dedup token (a retry
        // must meet its first publish's dedup state); else round-robin.
        let mut by_partition: BTreeMap<i32, Vec<(usize, OutMessage)>> = BTreeMap::new();
        let count = msgs.len();
        for (i, m) in msgs.into_iter().enumerate() {
            let p = match (&m.key, &m.dedup_token) {
                (Some(k), _) => partition_for_key(k, n),
                (None, Some(tok)) => partition_for_key(tok.as_bytes(), n),
                (None, None) => (self.next_round_robin() % n as u64) as i32,
            };
            by_partition.entry(p).or_default().push((
                i,
                OutMessage {
                    payload: m.payload,
                    key: m.key,
                    headers: m.headers,
                    delay_ms: m.delay_ms,
                    dedup_token: m.dedup_token,
                    redrive_of: None,
                },
            ));
        }
        let calls = by_partition.into_iter().map(|(p, list)| {
            let idx: Vec<usize> = list.iter().map(|(i, _)| *i).collect();
            let op = QueueOp::Publish {
                topic: t.name.clone(),
                partition: p,
                messages: list.into_iter().map(|(_, m)| m).collect(),
            };
            let route = self.route(&t.name, p);
            async move { (idx, self.call(route, op).await) }
        });
        let mut out: Vec<Option<Published>> = vec![None; count];
        let mut first_error = None;
        for (idx, answer) in join_all(calls).await {
            let results = match answer {
                Ok(QueueAnswer::Published(r)) => r,
                Ok(_) => {
                    first_error.get_or_insert(unexpected());
                    continue;
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                    continue;
                }
            };
            for (i, r) in idx.into_iter().zip(results) {
                match r {
                    Ok(p) => {
                        if let Some(slot) = out.get_mut(i) {
                            *slot = Some(Published {
                                id: p.id.to_string(),
                                partition: PartitionId(p.partition),
                                offset: Offset(p.offset),
                                duplicate: p.duplicate,
                            });
                        }
                    }
                    Err(e) => {
                        first_error.get_or_insert(failure(e));
                    }
                }
            }
        }
        // A batch is not atomic: on an error, other messages may be published (retry with
        // dedup tokens to make that harmless).
        if let Some(e) = first_error {
            return Err(e);
        }
        out.into_iter()
            .map(|p| p.ok_or_else(|| ApiError::internal("a message got no answer")))
            .collect()
    }

    fn observe(&self, endpoint: &'static str, status: u16, seconds: f64) {
        self.shard.metrics.http_request(endpoint, status, seconds);
    }

    async fn lease(
        &self,
        queue: &str,
        req: LeaseRequest,
        connection_consumer: &str,
        gone: &PeerGone,
    ) -> Result<Vec<LeasedMessage>, ApiError> {
        let t = self.topic(queue)?;
        crate::queue::host::group_dir_name(&req.group).map_err(failure)?;
        let consumer = req.consumer_or(connection_consumer).to_owned();
        let deadline = std::time::Instant::now() + std::time::Duration::from_millis(req.wait_ms);
        loop {
            let by_owner = self.parts_by_route(&t);
            let mut out: Vec<LeasedMessage> = Vec::new();
            if gone.is_set() {
                // Nobody would read the answer: lease nothing.
                return Ok(out);
            }
            let mut first_error = None;
            // A shard or node that could not be asked (a cluster between leaders, a node gone):
            // the others' messages are answered all the same.
            let mut unreachable: Option<ApiError> = None;
            let mut unavailable = false;
            for (owner, parts) in &by_owner {
                let want = req.max_messages.saturating_sub(out.len() as u32);
                if want == 0 {
                    break;
                }
                let answer = self
                    .call(
                        *owner,
                        QueueOp::Lease {
                            group: req.group.clone(),
                            consumer: consumer.clone(),
                            parts: parts.clone(),
                            max_messages: want,
                            visibility_ms: req.visibility_timeout_ms,
                            max_bytes: MAX_LEASE_ANSWER_BYTES,
                        },
                    )
                    .await;
                let answer = match answer {
                    Ok(a) => a,
                    Err(e) => {
                        unavailable = true;
                        unreachable.get_or_insert(e);
                        continue;
                    }
                };
                match answer {
                    QueueAnswer::Leased(Ok(leases)) => {
                        out.extend(leases.into_iter().map(|l| LeasedMessage {
                            id: l.id.to_string(),
                            generation: l.generation,
                            attempt: l.attempt,
                            lease_expires_at_ms: l.lease_expires_at_ms,
                            partition: PartitionId(l.partition),
                            offset: Offset(l.offset),
                            published_at_ms: l.published_at_ms,
                            key: l.key,
                            payload: l.payload.unwrap_or_default(),
                            headers: l.headers,
                        }))
                    }
                    QueueAnswer::Leased(Err(e)) => {
                        // A request-level refusal (bad visibility, ...) is the same everywhere.
                        if super::errors::status(&e) == 400 {
                            return Err(failure(e));
                        }
                        unavailable |= super::errors::status(&e) == 503;
                        first_error.get_or_insert(e);
                    }
                    _ => return Err(unexpected()),
                }
            }
            if !out.is_empty() {
                return Ok(out);
            }
            // A lease limit does not go away by waiting for messages.
            if let Some(e) = first_error.as_ref().filter(|e| super::errors::status(e) == 429) {
                return Err(failure(e.clone()));
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                // Limits (429) and unavailability are worth telling; "nothing there" is not.
                return match (first_error, unreachable) {
                    (Some(e), _) if super::errors::status(&e) != 404 => Err(failure(e)),
                    (_, Some(e)) => Err(e),
                    _ => Ok(out),
                };
            }
            if unavailable {
                // Partitions that cannot answer now (no leader yet, a node gone) would end a wait
                // at once: ask again shortly instead of spinning.
                let pause = left.min(UNAVAILABLE_RETRY);
                let _ = select(pin!(glommio::timer::sleep(pause)), pin!(gone.wait())).await;
                continue;
            }
            // Long poll: wait on every owner until one has something (or the time is up).
            let timeout_ms = u64::try_from(left.as_millis()).unwrap_or(u64::MAX).max(1);
            let waits: Vec<_> = by_owner
                .into_iter()
                .map(|(owner, parts)| {
                    Box::pin(self.call(
                        owner,
                        QueueOp::WaitLeasable {
                            group: req.group.clone(),
                            parts,
                            timeout_ms,
                        },
                    ))
                })
                .collect();
            if waits.is_empty() {
                return Ok(out);
            }
            // The owners' waits lease nothing, so dropping them when the client goes is safe.
            let _ = select(select_all(waits), pin!(gone.wait())).await;
            if self.shard.shutting_down.get() {
                return Ok(out);
            }
        }
    }

    async fn settle(&self, message_id: &str, req: SettleRequest) -> Result<Settled, ApiError> {
        let (topic, partition, item) = self.settle_item(message_id, &req)?;
        let kind = req.action.kind();
        let answer = self
            .call(
                self.route(&topic, partition),
                QueueOp::Settle {
                    topic,
                    partition,
                    group: req.group,
                    items: vec![item],
                },
            )
            .await?;
        let QueueAnswer::Settled(results) = answer else {
            return Err(unexpected());
        };
        let settled = results
            .map_err(failure)?
            .into_iter()
            .next()
            .ok_or_else(unexpected)?;
        self.settled_answer(message_id, kind, settled)
    }

    async fn settle_batch(&self, batch: SettleBatch) -> Result<Vec<SettleOutcome>, ApiError> {
        let n = batch.items.len();
        let mut out: Vec<Option<SettleOutcome>> = vec![None; n];
        // Items grouped per (topic, partition, group): one engine call each.
        type Key = (String, i32, String);
        type Item = (usize, String, SettleActionKind, SettleItem);
        let mut groups: BTreeMap<Key, Vec<Item>> = BTreeMap::new();
        for (i, (id, req)) in batch.items.into_iter().enumerate() {
            match self.settle_item(&id, &req) {
                Ok((topic, partition, item)) => groups
                    .entry((topic, partition, req.group.clone()))
                    .or_default()
                    .push((i, id, req.action.kind(), item)),
                Err(error) => {
                    if let Some(slot) = out.get_mut(i) {
                        *slot = Some(SettleOutcome::Failed { id, error });
                    }
                }
            }
        }
        let mut calls = Vec::new();
        for ((topic, partition, group), list) in groups {
            let owner = self.route(&topic, partition);
            // The engine takes at most its lease batch per call.
            for chunk in list.chunks(SETTLE_CHUNK) {
                let chunk: Vec<Item> = chunk.to_vec();
                let op = QueueOp::Settle {
                    topic: topic.clone(),
                    partition,
                    group: group.clone(),
                    items: chunk.iter().map(|(_, _, _, item)| item.clone()).collect(),
                };
                calls.push(async move { (chunk, self.call(owner, op).await) });
            }
        }
        for (chunk, answer) in join_all(calls).await {
            let results: Vec<Option<Result<crate::queue::engine::Settled, QueueError>>> = match answer {
                Ok(QueueAnswer::Settled(Ok(r))) => r.into_iter().map(Some).collect(),
                Ok(QueueAnswer::Settled(Err(e))) => {
                    let e = failure(e);
                    for (i, id, _, _) in &chunk {
                        if let Some(slot) = out.get_mut(*i) {
                            *slot = Some(SettleOutcome::Failed {
                                id: id.clone(),
                                error: e.clone(),
                            });
                        }
                    }
                    continue;
                }
                Ok(_) => vec![None; chunk.len()],
                Err(e) => return Err(e),
            };
            for ((i, id, kind, _), r) in chunk.into_iter().zip(results) {
                let outcome = match r.map(|r| self.settled_answer(&id, kind, r)) {
                    Some(Ok(s)) => SettleOutcome::Done(s),
                    Some(Err(error)) => SettleOutcome::Failed { id, error },
                    None => SettleOutcome::Failed {
                        id,
                        error: unexpected(),
                    },
                };
                if let Some(slot) = out.get_mut(i) {
                    *slot = Some(outcome);
                }
            }
        }
        out.into_iter()
            .map(|o| o.ok_or_else(|| ApiError::internal("a settle got no answer")))
            .collect()
    }

    async fn redrive(&self, queue: &str, req: RedriveRequest) -> Result<Redriven, ApiError> {
        let t = self.topic(queue)?;
        let dlq_name = t.config.queue_settings().dead_letter_topic_of(&t.name);
        // A setting stored before dead-letter targets were checked: no reading (and deleting)
        // from an internal topic.
        if let Some(m) = crate::internal_topics::refuse_dead_letter_target(&dlq_name) {
            return Err(ApiError::invalid_setting(m));
        }
        let Some(dlq) = self.shard.metadata().topic(&dlq_name).cloned() else {
            return Ok(Redriven { redriven: 0 });
        };
        let mut total = 0u64;
        for p in 0..dlq.partitions {
            let left = u64::from(req.max_messages).saturating_sub(total);
            if left == 0 {
                break;
            }
            total += self.redrive_partition(&t, &dlq, p, left).await?;
        }
        Ok(Redriven { redriven: total })
    }
}
