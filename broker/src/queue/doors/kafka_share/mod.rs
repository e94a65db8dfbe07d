//! The Kafka door of the queue engine (KIP-932 share groups).
//!
//! - [`group`]: the share group coordinator (membership, epochs, assignment), on the
//!   coordinator shard of each group id.
//! - [`session`]: share sessions, kept by the shard whose connection opened them.
//! - This module: what ShareFetch and ShareAcknowledge have in common — resolving topic ids,
//!   splitting the work over the shards that own the partitions ([`QueueOp::Share`], run by
//!   [`crate::queue::host`]), long polling, and releasing a member's records when its session
//!   closes. The handlers stay thin. On each owner the host settles the acknowledgements first,
//!   fenced by member (only the member holding a record settles it), then acquires records for
//!   the member under the group's lock duration (`share.record.lock.duration.ms`).

mod acks;
pub(crate) mod errors;
pub(crate) mod group;
pub(crate) mod session;

use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::future::{join_all, select_all};
use kafka_protocol::ResponseError;
use strand_protocol::types::{ShardId, TopicId};

use self::acks::settle_items;
use self::acks::ShareAcks;
use self::errors::share_error;
use self::group::{ShareAnswer, ShareOp};
use crate::queue::doors::kafka_share::session::SharePartition;
use crate::queue::engine::ConsumerId;
use crate::queue::host::{QueueAnswer, QueueOp, SharePart, SharePartResult, ShareSettings, StartAt};
use crate::queue::host::{QueueFailure, QueueHost};
use crate::shard::ops::PartRef;
use crate::shard::Shard;

/// Longest long poll honoured.
const MAX_WAIT_CAP: Duration = Duration::from_secs(30);
/// Records acquired per ShareFetch when the client names no limit.
const DEFAULT_MAX_RECORDS: u32 = 500;

/// One partition named by a request: its topic id and index, and its acknowledgements.
#[derive(Debug, Clone)]
pub(crate) struct Named {
    pub(crate) topic_id: TopicId,
    pub(crate) partition: i32,
    pub(crate) acks: Vec<ShareAcks>,
}

impl Named {
    /// A partition with its acknowledgement batches: (first offset, last offset, types).
    pub(crate) fn new<'a>(
        topic_id: TopicId,
        partition: i32,
        batches: impl IntoIterator<Item = (i64, i64, &'a [i8])>,
    ) -> Self {
        let acks = batches.into_iter().map(|(first, last, types)| ShareAcks {
            first,
            last,
            types: types.to_vec(),
        });
        Named {
            topic_id,
            partition,
            acks: acks.collect(),
        }
    }
}

/// The outcome of one partition, for the response.
#[derive(Debug, Clone)]
pub(crate) struct PartOutcome {
    pub(crate) topic_id: TopicId,
    pub(crate) partition: i32,
    pub(crate) result: PartResult,
}

/// What a response says of one partition: Kafka error codes, and what was acquired.
#[derive(Debug, Clone, Default)]
pub(crate) struct PartResult {
    pub(crate) error: i16,
    pub(crate) ack_error: i16,
    /// (first offset, last offset, delivery count).
    pub(crate) acquired: Vec<(i64, i64, i16)>,
    /// Whole stored batches covering the acquired offsets.
    pub(crate) records: Option<Bytes>,
}

impl PartResult {
    /// A shard's answer for the partition; `bad_acks`: its acknowledgements were malformed and
    /// not sent.
    fn from_host(r: SharePartResult, bad_acks: bool) -> Self {
        let code = |f: Option<QueueFailure>| f.map_or(0, |f| share_error(&f).code());
        let served = r.error.is_none();
        PartResult {
            error: code(r.error),
            ack_error: if bad_acks && served {
                ResponseError::InvalidRequest.code()
            } else {
                code(r.ack_error)
            },
            acquired: r.acquired,
            records: r.records,
        }
    }
}

/// The settings of a share group, from its group configs (KIP-932, KIP-1191) over the broker's
/// `group.share.*` defaults.
pub(crate) fn settings(shard: &Shard, group: &str) -> ShareSettings {
    use crate::config::AutoOffsetReset;
    let s = crate::queue::doors::kafka_share::group::share_group_settings(
        &shard.metadata(),
        &shard.config,
        group,
    );
    ShareSettings {
        record_lock_duration_ms: u64::from(s.record_lock_duration_ms),
        delivery_count_limit: s.delivery_count_limit,
        max_record_locks: s.max_record_locks,
        auto_offset_reset: match s.auto_offset_reset {
            AutoOffsetReset::Latest => StartAt::Latest,
            AutoOffsetReset::Earliest => StartAt::Earliest,
            AutoOffsetReset::ByDuration { ms } => StartAt::Since { duration_ms: ms },
        },
        dead_letter_topic: s.dead_letter_topic,
    }
}

/// Whether `member` belongs to the share group (asks the group's coordinator shard):
/// UNKNOWN_MEMBER_ID, GROUP_ID_NOT_FOUND otherwise.
pub(crate) async fn check_member(shard: &Rc<Shard>, group: &str, member: &str) -> Result<(), ResponseError> {
    crate::queue::doors::kafka_share::group::check_member(shard, group, member)
        .await
        .map(|_| ())
}

/// What a share request asks of one shard.
struct ShardWork {
    /// Index into the outcome list, per part.
    idx: Vec<usize>,
    parts: Vec<SharePart>,
    /// Per part: its acknowledgements were malformed (INVALID_REQUEST) and not sent.
    bad_acks: Vec<bool>,
}

/// Runs acknowledgements (`acks` per named partition) and, when `fetch`, acquisition from
/// `session` (the member's session partitions), long-polling up to `max_wait_ms` when nothing
/// was acquired. Partitions of unknown topics answer UNKNOWN_TOPIC_ID.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn run(
    shard: &Rc<Shard>,
    group: &str,
    member: &str,
    named: &[Named],
    session: &[SharePartition],
    fetch: bool,
    max_records: i32,
    max_bytes: i32,
    max_wait_ms: i32,
) -> Vec<PartOutcome> {
    let md = shard.metadata();
    let settings = settings(shard, group);
    let owner = ConsumerId::new(member);
    // Every partition to answer about, in order: those named, then the rest of the session.
    let mut order: Vec<SharePartition> = named.iter().map(|n| (n.topic_id, n.partition)).collect();
    if fetch {
        for p in session {
            if !order.contains(p) {
                order.push(*p);
            }
        }
    }
    let mut outcomes: Vec<PartOutcome> = order
        .iter()
        .map(|(t, p)| PartOutcome {
            topic_id: *t,
            partition: *p,
            result: PartResult::default(),
        })
        .collect();
    let per_part_bytes = usize::try_from(max_bytes).unwrap_or(0).clamp(64 << 10, 8 << 20);
    let mut by_owner: BTreeMap<ShardId, ShardWork> = BTreeMap::new();
    for (i, (topic_id, partition)) in order.iter().enumerate() {
        let Some(t) = md
            .topic_by_id(*topic_id)
            .filter(|t| *partition >= 0 && *partition < t.partitions)
        else {
            if let Some(o) = outcomes.get_mut(i) {
                o.result.error = ResponseError::UnknownTopicId.code();
            }
            continue;
        };
        let acks = named
            .iter()
            .find(|n| n.topic_id == *topic_id && n.partition == *partition)
            .map(|n| settle_items(&n.acks, &owner))
            .unwrap_or(Ok(Vec::new()));
        let part = PartRef {
            topic: t.name.clone(),
            partition: *partition,
        };
        let w = by_owner
            .entry(shard.owner(&part.topic, part.partition))
            .or_insert_with(|| ShardWork {
                idx: Vec::new(),
                parts: Vec::new(),
                bad_acks: Vec::new(),
            });
        w.idx.push(i);
        w.bad_acks.push(acks.is_err());
        w.parts.push(SharePart {
            part,
            settle: acks.unwrap_or_default(),
            fetch: fetch && session.contains(&(*topic_id, *partition)),
            max_bytes: per_part_bytes,
        });
    }
    let max_records = u32::try_from(max_records)
        .ok()
        .filter(|n| *n > 0)
        .unwrap_or(DEFAULT_MAX_RECORDS);
    let deadline =
        Instant::now() + Duration::from_millis(u64::try_from(max_wait_ms).unwrap_or(0)).min(MAX_WAIT_CAP);
    let mut first_round = true;
    loop {
        // One shard after the other, so that `max_records` holds over all of them.
        let mut left = max_records;
        for (owner, work) in &by_owner {
            let parts: Vec<SharePart> = work
                .parts
                .iter()
                .map(|p| SharePart {
                    settle: if first_round { p.settle.clone() } else { Vec::new() },
                    fetch: p.fetch && left > 0,
                    ..p.clone()
                })
                .collect();
            if !first_round && !parts.iter().any(|p| p.fetch) {
                continue;
            }
            let op = QueueOp::Share {
                group: group.to_owned(),
                member: member.to_owned(),
                settings: settings.clone(),
                parts,
                max_records: left.max(1),
            };
            let results: Vec<PartResult> = match call(shard, *owner, op).await {
                Some(QueueAnswer::Share(r)) => r
                    .into_iter()
                    .zip(&work.bad_acks)
                    .map(|(r, bad)| PartResult::from_host(r, first_round && *bad))
                    .collect(),
                _ => vec![
                    PartResult {
                        error: ResponseError::UnknownServerError.code(),
                        ..Default::default()
                    };
                    work.idx.len()
                ],
            };
            for (i, r) in work.idx.iter().zip(results) {
                let got: u32 = r
                    .acquired
                    .iter()
                    .map(|(a, b, _)| u32::try_from(b - a + 1).unwrap_or(0))
                    .sum();
                left = left.saturating_sub(got);
                if let Some(o) = outcomes.get_mut(*i) {
                    if first_round {
                        o.result = r;
                    } else {
                        o.result.acquired = r.acquired;
                        o.result.records = r.records;
                        if o.result.error == 0 {
                            o.result.error = r.error;
                        }
                    }
                }
            }
        }
        first_round = false;
        let acquired = outcomes.iter().any(|o| !o.result.acquired.is_empty());
        let left_time = deadline.saturating_duration_since(Instant::now());
        if !fetch || acquired || left_time.is_zero() || session.is_empty() || shard.shutting_down.get() {
            break;
        }
        // Long poll: until one of the owners may have something for the group.
        let waits: Vec<_> = by_owner
            .iter()
            .filter(|(_, w)| w.parts.iter().any(|p| p.fetch))
            .map(|(owner, w)| {
                Box::pin(call(
                    shard,
                    *owner,
                    QueueOp::WaitLeasable {
                        group: group.to_owned(),
                        parts: w
                            .parts
                            .iter()
                            .filter(|p| p.fetch)
                            .map(|p| p.part.clone())
                            .collect(),
                        timeout_ms: u64::try_from(left_time.as_millis()).unwrap_or(u64::MAX).max(1),
                    },
                ))
            })
            .collect();
        if waits.is_empty() {
            break;
        }
        let _ = select_all(waits).await;
    }
    outcomes
}

/// Releases `member`'s records in `parts` (a closed session, forgotten partitions).
pub(crate) async fn release(shard: &Rc<Shard>, group: &str, member: &str, parts: &[SharePartition]) {
    if parts.is_empty() {
        return;
    }
    let md = shard.metadata();
    let mut by_owner: BTreeMap<ShardId, Vec<PartRef>> = BTreeMap::new();
    for (topic_id, partition) in parts {
        if let Some(t) = md.topic_by_id(*topic_id) {
            by_owner
                .entry(shard.owner(&t.name, *partition))
                .or_default()
                .push(PartRef {
                    topic: t.name.clone(),
                    partition: *partition,
                });
        }
    }
    let calls = by_owner.into_iter().map(|(owner, parts)| {
        call(
            shard,
            owner,
            QueueOp::ShareRelease {
                group: group.to_owned(),
                member: member.to_owned(),
                parts,
            },
        )
    });
    join_all(calls).await;
}

/// Runs a queue operation on shard `owner`; `None`: no answer could be had.
pub(crate) async fn call(shard: &Rc<Shard>, owner: ShardId, op: QueueOp) -> Option<QueueAnswer> {
    shard.ask::<QueueHost>(owner, op).await
}

/// Runs `make()` on every shard; `None` if one did not answer.
pub(crate) async fn on_every_shard(
    shard: &Rc<Shard>,
    make: impl Fn() -> QueueOp,
) -> Option<Vec<QueueAnswer>> {
    let calls = (0..shard.shards).map(|s| call(shard, ShardId(s), make()));
    join_all(calls).await.into_iter().collect()
}

/// Deletes share group `group` and its share state; the error code of its result
/// (GROUP_ID_NOT_FOUND if there is no share group of that id either).
pub(crate) async fn delete_group(shard: &Rc<Shard>, group: &str) -> i16 {
    let owner = group::coordinator_of(shard, group);
    let op = ShareOp::Delete {
        group: group.to_owned(),
    };
    match group::call(shard, owner, op).await.await {
        Some(ShareAnswer::Deleted(Ok(()))) => {}
        Some(ShareAnswer::Deleted(Err(e))) => return e.code(),
        _ => return ResponseError::CoordinatorNotAvailable.code(),
    }
    let topics: Vec<String> = shard.metadata().topics().map(|t| t.name.clone()).collect();
    let done = on_every_shard(shard, || QueueOp::ShareDeleteState {
        group: group.to_owned(),
        topics: topics.clone(),
    })
    .await;
    tracing::info!(group, "share group deleted");
    match done {
        Some(_) => 0,
        // The group is gone; some state may be left (a retry answers GROUP_ID_NOT_FOUND, and
        // DeleteShareGroupOffsets needs a group): say so rather than claim success.
        None => ResponseError::CoordinatorNotAvailable.code(),
    }
}

/// The group and member a share request names: both are required (INVALID_REQUEST).
pub(crate) fn group_and_member(
    group: Option<&kafka_protocol::messages::GroupId>,
    member: Option<&kafka_protocol::protocol::StrBytes>,
) -> Result<(String, String), ResponseError> {
    match (group, member) {
        (Some(g), Some(m)) => Ok((g.as_str().to_owned(), m.as_str().to_owned())),
        _ => Err(ResponseError::InvalidRequest),
    }
}

/// Empty records for partitions without data (clients expect a non-null field).
pub(crate) fn records_or_empty(r: Option<Bytes>) -> Option<Bytes> {
    Some(r.unwrap_or_default())
}
