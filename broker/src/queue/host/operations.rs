//! Publish, lease, settle: the operations of the HTTP door on this shard's engines.

use super::ops::EngineStats;
use super::ops::LeasedMessage;
use super::ops::OutMessage;
use super::ops::PublishedMessage;
use super::ops::QueueFailure;
use super::read::read_offsets;
use super::read::user_headers;
use super::read::wait_high_watermark;
use super::storage_failure;
use super::Engine;
use super::EngineKey;
use super::QueueHost;
use super::MAX_LEASE_ANSWER_BYTES;
use super::PRIMARY_GROUP;
use crate::queue::engine::dead_letter::HEADER_DEDUP_TOKEN;
use crate::queue::engine::dead_letter::HEADER_DELIVER_AT;
use crate::queue::engine::dead_letter::HEADER_MESSAGE_ID;
use crate::queue::engine::Admission;
use crate::queue::engine::AppendedMessage;
use crate::queue::engine::ConsumerId;
use crate::queue::engine::ExternalMessageId;
use crate::queue::engine::MessageId;
use crate::queue::engine::PublishRequest;
use crate::queue::engine::QueueError;
use crate::queue::engine::Reply;
use crate::queue::engine::SettleItem;
use crate::queue::engine::Settled;
use crate::shard::ops::PartRef;
use crate::shard::OwnAppendError;
use crate::shard::LEADER_EPOCH;
use bytes::Bytes;
use futures::channel::oneshot;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;
use strand_protocol::types::Offset;
use strand_protocol::types::PartitionId;
use strand_protocol::types::TopicId;

impl QueueHost {
    pub(super) async fn publish(
        &self,
        topic: &str,
        partition: i32,
        messages: Vec<OutMessage>,
    ) -> Vec<Result<PublishedMessage, QueueFailure>> {
        let shard = &self.core;
        let n = messages.len();
        // The doors refuse internal topics as queues already; the append below bypasses the
        // core's produce path, so it is checked here too.
        if let Some(m) = crate::internal_topics::refuse_client_append(topic) {
            return vec![Err(QueueFailure::Invalid(m)); n];
        }
        let engine = match self.engine(topic, partition, PRIMARY_GROUP).await {
            Ok(e) => e,
            Err(e) => return vec![Err(e); n],
        };
        // In a cluster, a publish with dedup tokens holds the engine's publish lock from its
        // admission until its appends commit: a concurrent duplicate must see the token, and the
        // engine learns of the appends only once they commit.
        let clustered = engine.epoch.is_some();
        let _publishing = if clustered && messages.iter().any(|m| m.dedup_token.is_some()) {
            match engine.publish_lock.acquire_permit(1).await {
                Ok(p) => Some(p),
                Err(_) => return vec![Err(QueueFailure::Unavailable("the queue engine closed".into())); n],
            }
        } else {
            None
        };
        if engine.closed.get() {
            return vec![Err(QueueFailure::Unavailable("the queue engine closed".into())); n];
        }
        let now = shard.now_ms();
        let max_batch = shard
            .topic_settings(topic)
            .map_or(1 << 20, |s| s.max_message_bytes as usize);
        // Admission, then one append per chunk of admitted messages, without yielding in
        // between (a concurrent duplicate must see the token).
        enum Slot {
            Failed(QueueFailure),
            /// Index into `to_append`.
            Append(usize),
            /// A duplicate of `to_append[i]` (same token earlier in this request).
            SameAs(usize),
            /// An earlier message of the log.
            Duplicate(MessageId, Offset),
        }
        let mut slots = Vec::with_capacity(n);
        let mut to_append: Vec<(OutMessage, i64)> = Vec::new();
        let mut tokens_here: HashMap<String, usize> = HashMap::new();
        {
            let mut q = engine.q.borrow_mut();
            for m in messages {
                if let Some(&i) = m.dedup_token.as_ref().and_then(|t| tokens_here.get(t)) {
                    if q.config().dedup_window_ms > 0 {
                        slots.push(Slot::SameAs(i));
                        continue;
                    }
                }
                let req = PublishRequest {
                    size_bytes: m.size_bytes(),
                    delay_ms: m.delay_ms,
                    dedup_token: m.dedup_token.as_deref().map(str::as_bytes),
                    redrive_of: m.redrive_of,
                };
                match q.admit_publish(&req, now) {
                    Err(e) => slots.push(Slot::Failed(e.into())),
                    Ok(Admission::Duplicate { id, offset }) => slots.push(Slot::Duplicate(id, offset)),
                    Ok(Admission::Append { deliver_at_ms }) => {
                        if let Some(t) = &m.dedup_token {
                            tokens_here.insert(t.clone(), to_append.len());
                        }
                        slots.push(Slot::Append(to_append.len()));
                        to_append.push((m, deliver_at_ms));
                    }
                }
            }
        }
        let mut offsets: Vec<Result<i64, QueueFailure>> = Vec::with_capacity(to_append.len());
        let mut tickets = Vec::new();
        let mut proposals = Vec::new();
        let mut start = 0usize;
        while start < to_append.len() {
            // As many messages as fit one batch (at least one).
            let mut end = start + 1;
            let mut size = to_append[start].0.size_bytes() as usize + 256;
            while end < to_append.len() {
                let more = to_append[end].0.size_bytes() as usize + 256;
                if size + more > max_batch {
                    break;
                }
                size += more;
                end += 1;
            }
            let chunk = &to_append[start..end];
            let batch = build_publish_batch(chunk, engine.topic_id, now);
            if clustered {
                // Proposed in order now, awaited below.
                shard.metrics.bytes_in(batch.len());
                proposals.push((start..end, shard.append_own(topic, partition, Bytes::from(batch))));
                start = end;
                continue;
            }
            match shard.store.append(engine.log, &batch, LEADER_EPOCH, now) {
                Ok(ticket) => {
                    shard.metrics.bytes_in(batch.len());
                    let base = ticket.info.base_offset;
                    appended(&mut engine.q.borrow_mut(), chunk, base, now, &mut offsets);
                    tickets.push(ticket);
                }
                Err(e) => {
                    let msg = e.to_string();
                    for _ in chunk {
                        offsets.push(Err(QueueFailure::Storage(msg.clone())));
                    }
                }
            }
            start = end;
        }
        for (range, proposal) in proposals {
            match proposal.await {
                Ok(base) => {
                    appended(
                        &mut engine.q.borrow_mut(),
                        &to_append[range],
                        base,
                        now,
                        &mut offsets,
                    );
                }
                Err(e) => {
                    let failure = match e {
                        OwnAppendError::NotLeader(leader) => QueueFailure::NotLeader(leader),
                        OwnAppendError::Failed(why) => QueueFailure::Unavailable(why),
                    };
                    offsets.extend(range.map(|_| Err(failure.clone())));
                }
            }
        }
        self.drain(&engine);
        let mut durable: Result<(), QueueFailure> = Ok(());
        for t in &tickets {
            if let Err(e) = shard.store.wait_durable(t).await {
                durable = Err(storage_failure(e));
            }
        }
        let hw = shard
            .store
            .offsets(engine.log)
            .map(|o| o.high_watermark)
            .unwrap_or(0);
        self.log_grew(topic, partition, hw);
        // Duplicates of messages not yet durable (published concurrently) wait for them.
        let dup_max = slots
            .iter()
            .filter_map(|s| match s {
                Slot::Duplicate(_, off) => Some(off.0),
                _ => None,
            })
            .max();
        if let Some(max) = dup_max {
            wait_high_watermark(shard, engine.log, max + 1).await;
        }
        slots
            .into_iter()
            .map(|s| match s {
                Slot::Failed(e) => Err(e),
                Slot::Duplicate(id, offset) => Ok(PublishedMessage {
                    id: engine.external(id),
                    partition,
                    offset: offset.0,
                    duplicate: true,
                }),
                Slot::Append(i) | Slot::SameAs(i) => {
                    let offset = offsets
                        .get(i)
                        .cloned()
                        .unwrap_or_else(|| Err(QueueFailure::Unavailable("lost append".into())))?;
                    durable.clone()?;
                    let id = to_append
                        .get(i)
                        .and_then(|(m, _)| m.redrive_of)
                        .unwrap_or(MessageId::new(PartitionId(partition), Offset(offset)));
                    Ok(PublishedMessage {
                        id: engine.external(id),
                        partition,
                        offset,
                        duplicate: matches!(s, Slot::SameAs(_)),
                    })
                }
            })
            .collect()
    }

    pub(super) async fn lease(
        &self,
        group: &str,
        consumer: &str,
        parts: &[PartRef],
        max_messages: u32,
        visibility_ms: Option<u64>,
        max_bytes: u64,
    ) -> Result<Vec<LeasedMessage>, QueueFailure> {
        let shard = &self.core;
        let consumer = ConsumerId::new(consumer);
        let mut out = Vec::new();
        let mut first_error = None;
        let mut budget = max_bytes.min(MAX_LEASE_ANSWER_BYTES);
        for part in parts {
            let want = max_messages.saturating_sub(out.len() as u32);
            if want == 0 || budget == 0 {
                break;
            }
            let engine = match self.engine(&part.topic, part.partition, group).await {
                Ok(e) => e,
                Err(e) => {
                    first_error.get_or_insert(e);
                    continue;
                }
            };
            self.refresh(&engine).await;
            let (visibility, want) = {
                let q = engine.q.borrow();
                let c = q.config();
                (
                    visibility_ms.unwrap_or(c.default_visibility_ms),
                    want.min(c.max_lease_batch),
                )
            };
            // Bound the answer by the partition's average stored message size.
            let avg = shard.store.offsets(engine.log).map_or(1, |o| {
                let n = (o.high_watermark - o.log_start_offset).max(1) as u64;
                (o.size_bytes / n).max(1)
            });
            let want = want.min(u32::try_from(budget / avg).unwrap_or(u32::MAX).max(1));
            let request = engine.request_id();
            let (tx, rx) = oneshot::channel();
            engine.waiters.borrow_mut().insert(request, tx);
            let started = engine
                .q
                .borrow_mut()
                .lease(request, &consumer, want, visibility, shard.now_ms());
            if let Err(e) = started {
                engine.waiters.borrow_mut().remove(&request);
                self.drain(&engine);
                // Refusals of the request itself are the caller's error.
                if matches!(
                    e,
                    QueueError::BadConsumerId { .. }
                        | QueueError::BatchTooLarge { .. }
                        | QueueError::VisibilityOutOfRange { .. }
                        | QueueError::EmptyBatch
                ) {
                    return Err(e.into());
                }
                first_error.get_or_insert(e.into());
                continue;
            }
            self.drain(&engine);
            let leases = match rx.await {
                Ok(Ok(Reply::Leases(l))) => l,
                Ok(Ok(_)) => Vec::new(),
                Ok(Err(e)) => {
                    first_error.get_or_insert(e.into());
                    continue;
                }
                Err(_) => {
                    first_error.get_or_insert(QueueFailure::Unavailable("queue engine closed".into()));
                    continue;
                }
            };
            if leases.is_empty() {
                continue;
            }
            let max_offset = leases.iter().map(|l| l.offset.0).max().unwrap_or(0);
            wait_high_watermark(shard, engine.log, max_offset + 1).await;
            let offsets: Vec<i64> = leases.iter().map(|l| l.offset.0).collect();
            let records = read_offsets(shard, engine.log, &offsets).await;
            for l in leases {
                let Some(r) = records.get(&l.offset.0) else {
                    // The message is gone from the log (DeleteRecords): nothing to deliver.
                    tracing::warn!(topic = %part.topic, partition = part.partition, offset = l.offset.0, "leased message no longer in the log; acknowledging it");
                    self.settle_quietly(&engine, l.offset, l.generation);
                    continue;
                };
                let size = r.value.as_ref().map_or(0, Bytes::len)
                    + r.key.as_ref().map_or(0, Bytes::len)
                    + r.headers
                        .iter()
                        .map(|(k, v)| k.len() + v.as_ref().map_or(0, Bytes::len))
                        .sum::<usize>();
                budget = budget.saturating_sub(size as u64);
                out.push(LeasedMessage {
                    id: engine.external(l.id),
                    generation: l.generation.0,
                    attempt: l.attempt,
                    lease_expires_at_ms: l.expiry_ms,
                    partition: part.partition,
                    offset: l.offset.0,
                    published_at_ms: r.timestamp,
                    key: r.key.clone(),
                    payload: r.value.clone(),
                    headers: user_headers(r),
                });
            }
        }
        match (out.is_empty(), first_error) {
            (true, Some(e)) => Err(e),
            _ => Ok(out),
        }
    }

    /// Acknowledges a leased message the host cannot deliver (its record was deleted).
    pub(super) fn settle_quietly(
        &self,
        engine: &Rc<Engine>,
        offset: Offset,
        generation: crate::queue::engine::Generation,
    ) {
        let shard = &self.core;
        let request = engine.request_id();
        let item = SettleItem {
            target: crate::queue::engine::MessageRef::Offset(offset),
            fence: crate::queue::engine::Fence::Generation(generation),
            op: crate::queue::engine::SettleOp::Ack,
            reason: Some("message deleted from the log".into()),
        };
        let _ = engine.q.borrow_mut().settle(request, &[item], shard.now_ms());
        self.drain(engine);
    }

    pub(super) async fn wait_leasable(&self, group: &str, parts: &[PartRef], timeout_ms: u64) {
        let shard = &self.core;
        let deadline = std::time::Instant::now() + Duration::from_millis(timeout_ms);
        loop {
            let changed = self.changed.wait();
            let durable = shard.store.durable_notify().wait();
            for p in parts {
                let key = EngineKey {
                    topic: p.topic.clone(),
                    partition: p.partition,
                    group: group.to_owned(),
                };
                let Some(engine) = self.engines.borrow().get(&key).cloned() else {
                    continue;
                };
                self.refresh(&engine).await;
                if engine.q.borrow().has_leasable() {
                    return;
                }
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() || shard.shutting_down.get() {
                return;
            }
            let timer = glommio::timer::sleep(left);
            futures::pin_mut!(changed);
            futures::pin_mut!(durable);
            futures::pin_mut!(timer);
            let woken = futures::future::select(changed, durable);
            if let futures::future::Either::Right(_) = futures::future::select(woken, timer).await {
                return;
            }
        }
    }

    pub(super) async fn settle(
        &self,
        topic: &str,
        partition: i32,
        group: &str,
        items: Vec<SettleItem>,
    ) -> Result<Vec<Result<Settled, QueueError>>, QueueFailure> {
        let shard = &self.core;
        let engine = self.engine(topic, partition, group).await?;
        let request = engine.request_id();
        let (tx, rx) = oneshot::channel();
        engine.waiters.borrow_mut().insert(request, tx);
        let started = engine.q.borrow_mut().settle(request, &items, shard.now_ms());
        if let Err(e) = started {
            engine.waiters.borrow_mut().remove(&request);
            self.drain(&engine);
            return Err(e.into());
        }
        self.drain(&engine);
        match rx.await {
            Ok(Ok(Reply::Settled(results))) => Ok(results),
            Ok(Ok(_)) => Err(QueueFailure::Unavailable("unexpected engine reply".into())),
            Ok(Err(e)) => Err(e.into()),
            Err(_) => Err(QueueFailure::Unavailable("queue engine closed".into())),
        }
    }

    pub(super) fn stats(&self, topic: &str) -> Vec<EngineStats> {
        let mut out: Vec<EngineStats> = self
            .engines
            .borrow()
            .values()
            .filter(|e| e.key.topic == topic)
            .map(|e| EngineStats {
                group: e.key.group.clone(),
                partition: e.key.partition,
                metrics: e.q.borrow().metrics(),
            })
            .collect();
        out.sort_by(|a, b| (&a.group, a.partition).cmp(&(&b.group, b.partition)));
        out
    }
}

/// One uncompressed batch of published messages, with Strand's headers added.
pub(super) fn build_publish_batch(chunk: &[(OutMessage, i64)], topic_id: TopicId, now: i64) -> Vec<u8> {
    use strand_protocol::batch::build::{batch, TestRecord};
    let extra: Vec<Vec<(&'static str, Vec<u8>)>> = chunk
        .iter()
        .map(|(m, deliver_at)| {
            let mut h = Vec::new();
            if *deliver_at > 0 {
                h.push((HEADER_DELIVER_AT, deliver_at.to_string().into_bytes()));
            }
            if let Some(t) = &m.dedup_token {
                h.push((HEADER_DEDUP_TOKEN, t.clone().into_bytes()));
            }
            if let Some(id) = m.redrive_of {
                h.push((
                    HEADER_MESSAGE_ID,
                    ExternalMessageId { topic: topic_id, id }.to_string().into_bytes(),
                ));
            }
            h
        })
        .collect();
    let recs: Vec<TestRecord<'_>> = chunk
        .iter()
        .zip(&extra)
        .map(|((m, _), extra)| {
            let mut headers: Vec<(&str, Option<&[u8]>)> = m
                .headers
                .iter()
                .filter(|(k, _)| k != HEADER_DELIVER_AT && k != HEADER_DEDUP_TOKEN && k != HEADER_MESSAGE_ID)
                .map(|(k, v)| (k.as_str(), Some(&v[..])))
                .collect();
            headers.extend(extra.iter().map(|(k, v)| (*k, Some(&v[..]))));
            TestRecord {
                key: m.key.as_deref(),
                value: Some(&m.payload),
                headers,
                timestamp_delta: 0,
            }
        })
        .collect();
    batch(&recs, now)
}

/// Tells the engine of messages `chunk` (with their delivery times) appended from `base` on,
/// and records their offsets as the publish's results.
fn appended(
    q: &mut crate::queue::engine::QueuePartition,
    chunk: &[(OutMessage, i64)],
    base: i64,
    now: i64,
    offsets: &mut Vec<Result<i64, QueueFailure>>,
) {
    for (i, (m, deliver_at_ms)) in chunk.iter().enumerate() {
        let offset = base + i as i64;
        q.appended(
            &AppendedMessage {
                offset: Offset(offset),
                key: m.key.as_deref(),
                timestamp_ms: now,
                deliver_at_ms: *deliver_at_ms,
                dedup_token: m.dedup_token.as_deref().map(str::as_bytes),
                message_id: m.redrive_of,
            },
            now,
        );
        offsets.push(Ok(offset));
    }
}
