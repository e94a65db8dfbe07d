//! The queue operations one node asks of another: in a cluster, the HTTP door of any node
//! reaches the engines of a partition led elsewhere by sending the operation to the shard
//! that holds the leading replica, over the node link (`Shard::call_node`), where that
//! shard's queue host runs it as its own. The operations the door forwards (publish, lease,
//! wait for leasable messages, settle, statistics), the dead letters an engine host appends to
//! a topic led elsewhere, and their answers are encoded here.
//!
//! Encoding: a version byte, then big-endian fields; lists and byte strings carry a `u32`
//! count. Decoding never panics and bounds every count by the bytes left before allocating:
//! the bytes come from other nodes.

#![cfg_attr(not(test), deny(clippy::indexing_slicing))]

use bytes::Bytes;
use strand_protocol::types::{NodeId, Offset, PartitionId, TopicId};

use super::ops::{
    EngineStats, LeasedMessage, OutMessage, PublishedMessage, QueueAnswer, QueueFailure, QueueOp,
};
use crate::queue::engine::dead_letter::DeadLetterCause;
use crate::queue::engine::{
    ConsumerId, Counters, ExternalMessageId, Fence, Generation, MessageId, MessageRef, Outcome,
    PartitionMetrics, QueueError, SettleItem, SettleOp, Settled,
};
use crate::shard::ops::PartRef;

/// The node link's message kind of a queue operation.
pub(crate) const QUEUE_OP_KIND: u16 = 0x5101;

const VERSION: u8 = 1;

/// Bytes that do not decode as an operation or an answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("undecodable queue operation: {0}")]
pub(crate) struct WireError(String);

fn bad(m: impl Into<String>) -> WireError {
    WireError(m.into())
}

// ----- primitives ---------------------------------------------------------------------------

#[derive(Default)]
struct W(Vec<u8>);

impl W {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn bool(&mut self, v: bool) {
        self.u8(u8::from(v));
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    fn i32(&mut self, v: i32) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    fn i64(&mut self, v: i64) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    fn count(&mut self, n: usize) {
        self.u32(u32::try_from(n).unwrap_or(u32::MAX));
    }
    fn bytes(&mut self, b: &[u8]) {
        self.count(b.len());
        self.0.extend_from_slice(b);
    }
    fn str(&mut self, s: &str) {
        self.bytes(s.as_bytes());
    }
    fn opt<T>(&mut self, v: Option<T>, f: impl FnOnce(&mut Self, T)) {
        match v {
            None => self.u8(0),
            Some(v) => {
                self.u8(1);
                f(self, v);
            }
        }
    }
    fn list<T>(&mut self, items: &[T], mut f: impl FnMut(&mut Self, &T)) {
        self.count(items.len());
        for i in items {
            f(self, i);
        }
    }
}

/// A reader over `buf`, the unread part of `whole`: byte strings are taken as slices of it,
/// not copied (a forwarded publish's or lease's payloads).
struct R<'a> {
    whole: &'a Bytes,
    buf: &'a [u8],
}

impl<'a> R<'a> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        let Some((head, rest)) = self.buf.split_first_chunk::<N>() else {
            return Err(bad("truncated"));
        };
        self.buf = rest;
        Ok(*head)
    }
    fn u8(&mut self) -> Result<u8, WireError> {
        Ok(u8::from_be_bytes(self.take()?))
    }
    fn bool(&mut self) -> Result<bool, WireError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(bad(format!("flag {b}"))),
        }
    }
    fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_be_bytes(self.take()?))
    }
    fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_be_bytes(self.take()?))
    }
    fn i32(&mut self) -> Result<i32, WireError> {
        Ok(i32::from_be_bytes(self.take()?))
    }
    fn i64(&mut self) -> Result<i64, WireError> {
        Ok(i64::from_be_bytes(self.take()?))
    }
    /// A count of items each at least `min_item_bytes` long: bounded by the bytes left.
    fn count(&mut self, min_item_bytes: usize) -> Result<usize, WireError> {
        let n = usize::try_from(self.u32()?).map_err(|_| bad("count"))?;
        if n.saturating_mul(min_item_bytes.max(1)) > self.buf.len() {
            return Err(bad(format!("{n} items in {} bytes", self.buf.len())));
        }
        Ok(n)
    }
    fn slice(&mut self) -> Result<&'a [u8], WireError> {
        let n = self.count(1)?;
        let Some((s, rest)) = self.buf.split_at_checked(n) else {
            return Err(bad("truncated bytes"));
        };
        self.buf = rest;
        Ok(s)
    }
    fn bytes(&mut self) -> Result<Bytes, WireError> {
        let s = self.slice()?;
        Ok(self.whole.slice_ref(s))
    }
    fn str(&mut self) -> Result<String, WireError> {
        String::from_utf8(self.slice()?.to_vec()).map_err(|_| bad("string is not UTF-8"))
    }
    fn opt<T>(&mut self, f: impl FnOnce(&mut Self) -> Result<T, WireError>) -> Result<Option<T>, WireError> {
        if self.bool()? {
            Ok(Some(f(self)?))
        } else {
            Ok(None)
        }
    }
    fn list<T>(
        &mut self,
        min_item_bytes: usize,
        mut f: impl FnMut(&mut Self) -> Result<T, WireError>,
    ) -> Result<Vec<T>, WireError> {
        let n = self.count(min_item_bytes)?;
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            out.push(f(self)?);
        }
        Ok(out)
    }
    fn end(&self) -> Result<(), WireError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(bad(format!("{} bytes after the end", self.buf.len())))
        }
    }
}

// ----- domain values ------------------------------------------------------------------------

fn w_message_id(w: &mut W, id: MessageId) {
    w.i32(id.partition.0);
    w.i64(id.offset.0);
}

fn r_message_id(r: &mut R<'_>) -> Result<MessageId, WireError> {
    Ok(MessageId::new(PartitionId(r.i32()?), Offset(r.i64()?)))
}

fn w_external(w: &mut W, id: ExternalMessageId) {
    w.0.extend_from_slice(id.topic.0.as_bytes());
    w_message_id(w, id.id);
}

fn r_external(r: &mut R<'_>) -> Result<ExternalMessageId, WireError> {
    Ok(ExternalMessageId {
        topic: TopicId(uuid::Uuid::from_bytes(r.take()?)),
        id: r_message_id(r)?,
    })
}

fn w_headers(w: &mut W, headers: &[(String, Bytes)]) {
    w.list(headers, |w, (k, v)| {
        w.str(k);
        w.bytes(v);
    });
}

fn r_headers(r: &mut R<'_>) -> Result<Vec<(String, Bytes)>, WireError> {
    r.list(8, |r| Ok((r.str()?, r.bytes()?)))
}

fn w_part(w: &mut W, p: &PartRef) {
    w.str(&p.topic);
    w.i32(p.partition);
}

fn r_part(r: &mut R<'_>) -> Result<PartRef, WireError> {
    Ok(PartRef {
        topic: r.str()?,
        partition: r.i32()?,
    })
}

fn w_out_message(w: &mut W, m: &OutMessage) {
    w.bytes(&m.payload);
    w.opt(m.key.as_ref(), |w, k| w.bytes(k));
    w_headers(w, &m.headers);
    w.u64(m.delay_ms);
    w.opt(m.dedup_token.as_deref(), W::str);
    w.opt(m.redrive_of, w_message_id);
}

fn r_out_message(r: &mut R<'_>) -> Result<OutMessage, WireError> {
    Ok(OutMessage {
        payload: r.bytes()?,
        key: r.opt(R::bytes)?,
        headers: r_headers(r)?,
        delay_ms: r.u64()?,
        dedup_token: r.opt(R::str)?,
        redrive_of: r.opt(r_message_id)?,
    })
}

fn w_settle_item(w: &mut W, item: &SettleItem) {
    match &item.target {
        MessageRef::Id(id) => {
            w.u8(0);
            w_message_id(w, *id);
        }
        MessageRef::Offset(o) => {
            w.u8(1);
            w.i64(o.0);
        }
    }
    match &item.fence {
        Fence::Generation(g) => {
            w.u8(0);
            w.u64(g.0);
        }
        Fence::Owner(c) => {
            w.u8(1);
            w.str(&c.0);
        }
    }
    match item.op {
        SettleOp::Ack => w.u8(0),
        SettleOp::Nack { delay_ms } => {
            w.u8(1);
            w.opt(delay_ms, W::u64);
        }
        SettleOp::Reject => w.u8(2),
        SettleOp::Extend { visibility_ms } => {
            w.u8(3);
            w.u64(visibility_ms);
        }
    }
    w.opt(item.reason.as_deref(), W::str);
}

fn r_settle_item(r: &mut R<'_>) -> Result<SettleItem, WireError> {
    let target = match r.u8()? {
        0 => MessageRef::Id(r_message_id(r)?),
        1 => MessageRef::Offset(Offset(r.i64()?)),
        t => return Err(bad(format!("message ref {t}"))),
    };
    let fence = match r.u8()? {
        0 => Fence::Generation(Generation(r.u64()?)),
        1 => Fence::Owner(ConsumerId::new(r.str()?)),
        t => return Err(bad(format!("fence {t}"))),
    };
    let op = match r.u8()? {
        0 => SettleOp::Ack,
        1 => SettleOp::Nack {
            delay_ms: r.opt(R::u64)?,
        },
        2 => SettleOp::Reject,
        3 => SettleOp::Extend {
            visibility_ms: r.u64()?,
        },
        t => return Err(bad(format!("settle op {t}"))),
    };
    Ok(SettleItem {
        target,
        fence,
        op,
        reason: r.opt(R::str)?,
    })
}

/// The states an engine names in `NotLeased` (its text is `&'static`).
const DELIVERY_STATES: [&str; 6] = [
    "available",
    "delayed",
    "leased",
    "being dead-lettered",
    "acknowledged",
    "dead-lettered",
];

fn w_queue_error(w: &mut W, e: &QueueError) {
    use QueueError::*;
    match e {
        NotFound => w.u8(0),
        StaleGeneration { given, current } => {
            w.u8(1);
            w.u64(*given);
            w.u64(*current);
        }
        NotOwner => w.u8(2),
        NotLeased { state } => {
            w.u8(3);
            w.str(state);
        }
        AlreadyDone => w.u8(4),
        AlreadyLive(id) => {
            w.u8(5);
            w_message_id(w, *id);
        }
        WrongPartition(id) => {
            w.u8(6);
            w_message_id(w, *id);
        }
        EmptyBatch => w.u8(7),
        BatchTooLarge { requested, max } => {
            w.u8(8);
            w.u64(*requested as u64);
            w.u32(*max);
        }
        VisibilityOutOfRange {
            given_ms,
            min_ms,
            max_ms,
        } => {
            w.u8(9);
            w.u64(*given_ms);
            w.u64(*min_ms);
            w.u64(*max_ms);
        }
        DelayOutOfRange { given_ms, max_ms } => {
            w.u8(10);
            w.u64(*given_ms);
            w.u64(*max_ms);
        }
        LeaseLifetimeExceeded { lifetime_ms, max_ms } => {
            w.u8(11);
            w.u64(*lifetime_ms);
            w.u64(*max_ms);
        }
        BadConsumerId { max } => {
            w.u8(12);
            w.u64(*max as u64);
        }
        ReasonTooLong { max } => {
            w.u8(13);
            w.u64(*max as u64);
        }
        BadDedupToken { max } => {
            w.u8(14);
            w.u64(*max as u64);
        }
        MessageTooLarge { size, max } => {
            w.u8(15);
            w.u64(*size);
            w.u32(*max);
        }
        ConsumerLeaseLimit { max } => {
            w.u8(16);
            w.u32(*max);
        }
        PartitionLeaseLimit { max } => {
            w.u8(17);
            w.u32(*max);
        }
        TooManyDelayed { max } => {
            w.u8(18);
            w.u32(*max);
        }
        DedupTableFull { max } => {
            w.u8(19);
            w.u32(*max);
        }
        Busy => w.u8(20),
        Unavailable => w.u8(21),
    }
}

fn r_usize(r: &mut R<'_>) -> Result<usize, WireError> {
    usize::try_from(r.u64()?).map_err(|_| bad("size"))
}

fn r_queue_error(r: &mut R<'_>) -> Result<QueueError, WireError> {
    use QueueError::*;
    Ok(match r.u8()? {
        0 => NotFound,
        1 => StaleGeneration {
            given: r.u64()?,
            current: r.u64()?,
        },
        2 => NotOwner,
        3 => {
            let s = r.str()?;
            NotLeased {
                state: DELIVERY_STATES
                    .iter()
                    .find(|k| **k == s)
                    .copied()
                    .unwrap_or("unknown"),
            }
        }
        4 => AlreadyDone,
        5 => AlreadyLive(r_message_id(r)?),
        6 => WrongPartition(r_message_id(r)?),
        7 => EmptyBatch,
        8 => BatchTooLarge {
            requested: r_usize(r)?,
            max: r.u32()?,
        },
        9 => VisibilityOutOfRange {
            given_ms: r.u64()?,
            min_ms: r.u64()?,
            max_ms: r.u64()?,
        },
        10 => DelayOutOfRange {
            given_ms: r.u64()?,
            max_ms: r.u64()?,
        },
        11 => LeaseLifetimeExceeded {
            lifetime_ms: r.u64()?,
            max_ms: r.u64()?,
        },
        12 => BadConsumerId { max: r_usize(r)? },
        13 => ReasonTooLong { max: r_usize(r)? },
        14 => BadDedupToken { max: r_usize(r)? },
        15 => MessageTooLarge {
            size: r.u64()?,
            max: r.u32()?,
        },
        16 => ConsumerLeaseLimit { max: r.u32()? },
        17 => PartitionLeaseLimit { max: r.u32()? },
        18 => TooManyDelayed { max: r.u32()? },
        19 => DedupTableFull { max: r.u32()? },
        20 => Busy,
        21 => Unavailable,
        t => return Err(bad(format!("queue error {t}"))),
    })
}

fn w_failure(w: &mut W, f: &QueueFailure) {
    let (tag, text) = match f {
        QueueFailure::Engine(e) => {
            w.u8(0);
            w_queue_error(w, e);
            return;
        }
        QueueFailure::NotLeader(n) => {
            w.u8(6);
            w.i32(n.map_or(-1, |n| n.0));
            return;
        }
        QueueFailure::UnknownQueue(s) => (1, s),
        QueueFailure::BadGroup(s) => (2, s),
        QueueFailure::Storage(s) => (3, s),
        QueueFailure::Unavailable(s) => (4, s),
        QueueFailure::Invalid(s) => (5, s),
    };
    w.u8(tag);
    w.str(text);
}

fn r_failure(r: &mut R<'_>) -> Result<QueueFailure, WireError> {
    Ok(match r.u8()? {
        0 => QueueFailure::Engine(r_queue_error(r)?),
        1 => QueueFailure::UnknownQueue(r.str()?),
        2 => QueueFailure::BadGroup(r.str()?),
        3 => QueueFailure::Storage(r.str()?),
        4 => QueueFailure::Unavailable(r.str()?),
        5 => QueueFailure::Invalid(r.str()?),
        6 => QueueFailure::NotLeader(Some(r.i32()?).filter(|n| *n >= 0).map(NodeId)),
        t => return Err(bad(format!("failure {t}"))),
    })
}

fn w_result<T>(w: &mut W, r: &Result<T, QueueFailure>, f: impl FnOnce(&mut W, &T)) {
    match r {
        Ok(v) => {
            w.u8(0);
            f(w, v);
        }
        Err(e) => {
            w.u8(1);
            w_failure(w, e);
        }
    }
}

fn r_result<T>(
    r: &mut R<'_>,
    f: impl FnOnce(&mut R<'_>) -> Result<T, WireError>,
) -> Result<Result<T, QueueFailure>, WireError> {
    Ok(match r.u8()? {
        0 => Ok(f(r)?),
        1 => Err(r_failure(r)?),
        t => return Err(bad(format!("result {t}"))),
    })
}

fn w_published(w: &mut W, p: &PublishedMessage) {
    w_external(w, p.id);
    w.i32(p.partition);
    w.i64(p.offset);
    w.bool(p.duplicate);
}

fn r_published(r: &mut R<'_>) -> Result<PublishedMessage, WireError> {
    Ok(PublishedMessage {
        id: r_external(r)?,
        partition: r.i32()?,
        offset: r.i64()?,
        duplicate: r.bool()?,
    })
}

fn w_leased(w: &mut W, m: &LeasedMessage) {
    w_external(w, m.id);
    w.u64(m.generation);
    w.u32(m.attempt);
    w.i64(m.lease_expires_at_ms);
    w.i32(m.partition);
    w.i64(m.offset);
    w.i64(m.published_at_ms);
    w.opt(m.key.as_ref(), |w, k| w.bytes(k));
    w.opt(m.payload.as_ref(), |w, p| w.bytes(p));
    w_headers(w, &m.headers);
}

fn r_leased(r: &mut R<'_>) -> Result<LeasedMessage, WireError> {
    Ok(LeasedMessage {
        id: r_external(r)?,
        generation: r.u64()?,
        attempt: r.u32()?,
        lease_expires_at_ms: r.i64()?,
        partition: r.i32()?,
        offset: r.i64()?,
        published_at_ms: r.i64()?,
        key: r.opt(R::bytes)?,
        payload: r.opt(R::bytes)?,
        headers: r_headers(r)?,
    })
}

fn w_settled(w: &mut W, s: &Settled) {
    w.i64(s.offset.0);
    w_message_id(w, s.id);
    match s.outcome {
        Outcome::Acked => w.u8(0),
        Outcome::Retry {
            not_before_ms,
            attempts,
        } => {
            w.u8(1);
            w.i64(not_before_ms);
            w.u32(attempts);
        }
        Outcome::DeadLettered { cause, attempts } => {
            w.u8(2);
            w.u8(cause.code());
            w.u32(attempts);
        }
        Outcome::Extended { expiry_ms } => {
            w.u8(3);
            w.i64(expiry_ms);
        }
    }
}

fn r_settled(r: &mut R<'_>) -> Result<Settled, WireError> {
    let offset = Offset(r.i64()?);
    let id = r_message_id(r)?;
    let outcome = match r.u8()? {
        0 => Outcome::Acked,
        1 => Outcome::Retry {
            not_before_ms: r.i64()?,
            attempts: r.u32()?,
        },
        2 => {
            let cause = match r.u8()? {
                1 => DeadLetterCause::MaxAttempts,
                2 => DeadLetterCause::Rejected,
                c => return Err(bad(format!("dead-letter cause {c}"))),
            };
            Outcome::DeadLettered {
                cause,
                attempts: r.u32()?,
            }
        }
        3 => Outcome::Extended { expiry_ms: r.i64()? },
        t => return Err(bad(format!("outcome {t}"))),
    };
    Ok(Settled { offset, id, outcome })
}

fn w_stats(w: &mut W, s: &EngineStats) {
    w.str(&s.group);
    w.i32(s.partition);
    let m = &s.metrics;
    for v in [m.available, m.leased, m.delayed, m.dead_letter_pending] {
        w.u64(v);
    }
    w.opt(m.oldest_unacked_age_ms, W::u64);
    for o in [m.start, m.loaded_end, m.log_end] {
        w.i64(o.0);
    }
    for v in [m.detached, m.dedup_entries, m.consumers] {
        w.u64(v);
    }
    let c = &m.counters;
    for v in [
        c.published,
        c.duplicates,
        c.acked,
        c.nacked,
        c.rejected,
        c.retries,
        c.lease_expiries,
        c.dead_lettered,
        c.duplicate_redrives,
        c.latency_samples_dropped,
    ] {
        w.u64(v);
    }
}

fn r_stats(r: &mut R<'_>) -> Result<EngineStats, WireError> {
    let group = r.str()?;
    let partition = r.i32()?;
    let (available, leased, delayed, dead_letter_pending) = (r.u64()?, r.u64()?, r.u64()?, r.u64()?);
    let oldest_unacked_age_ms = r.opt(R::u64)?;
    let (start, loaded_end, log_end) = (Offset(r.i64()?), Offset(r.i64()?), Offset(r.i64()?));
    let (detached, dedup_entries, consumers) = (r.u64()?, r.u64()?, r.u64()?);
    let counters = Counters {
        published: r.u64()?,
        duplicates: r.u64()?,
        acked: r.u64()?,
        nacked: r.u64()?,
        rejected: r.u64()?,
        retries: r.u64()?,
        lease_expiries: r.u64()?,
        dead_lettered: r.u64()?,
        duplicate_redrives: r.u64()?,
        latency_samples_dropped: r.u64()?,
    };
    Ok(EngineStats {
        group,
        partition,
        metrics: PartitionMetrics {
            available,
            leased,
            delayed,
            dead_letter_pending,
            oldest_unacked_age_ms,
            start,
            loaded_end,
            log_end,
            detached,
            dedup_entries,
            consumers,
            counters,
        },
    })
}

// ----- operations and answers ---------------------------------------------------------------

/// Encodes an operation the HTTP door forwards; `None` for the others (share-group operations
/// are the Kafka door's, which clients send to partition leaders themselves).
pub(crate) fn encode_op(op: &QueueOp) -> Option<Vec<u8>> {
    let mut w = W::default();
    w.u8(VERSION);
    match op {
        QueueOp::Publish {
            topic,
            partition,
            messages,
        } => {
            w.u8(0);
            w.str(topic);
            w.i32(*partition);
            w.list(messages, w_out_message);
        }
        QueueOp::Lease {
            group,
            consumer,
            parts,
            max_messages,
            visibility_ms,
            max_bytes,
        } => {
            w.u8(1);
            w.str(group);
            w.str(consumer);
            w.list(parts, w_part);
            w.u32(*max_messages);
            w.opt(*visibility_ms, W::u64);
            w.u64(*max_bytes);
        }
        QueueOp::WaitLeasable {
            group,
            parts,
            timeout_ms,
        } => {
            w.u8(2);
            w.str(group);
            w.list(parts, w_part);
            w.u64(*timeout_ms);
        }
        QueueOp::Settle {
            topic,
            partition,
            group,
            items,
        } => {
            w.u8(3);
            w.str(topic);
            w.i32(*partition);
            w.str(group);
            w.list(items, w_settle_item);
        }
        QueueOp::Stats { topic } => {
            w.u8(4);
            w.str(topic);
        }
        QueueOp::AppendDeadLetter {
            topic,
            partition,
            batch,
        } => {
            w.u8(5);
            w.str(topic);
            w.i32(*partition);
            w.bytes(batch);
        }
        QueueOp::Share { .. }
        | QueueOp::ShareRelease { .. }
        | QueueOp::ShareOffsets { .. }
        | QueueOp::ShareDeleteState { .. }
        | QueueOp::ShareAlter { .. } => return None,
    }
    Some(w.0)
}

pub(crate) fn decode_op(bytes: &Bytes) -> Result<QueueOp, WireError> {
    let mut r = R {
        whole: bytes,
        buf: bytes,
    };
    let v = r.u8()?;
    if v != VERSION {
        return Err(bad(format!("version {v}")));
    }
    let op = match r.u8()? {
        0 => QueueOp::Publish {
            topic: r.str()?,
            partition: r.i32()?,
            messages: r.list(19, r_out_message)?,
        },
        1 => QueueOp::Lease {
            group: r.str()?,
            consumer: r.str()?,
            parts: r.list(8, r_part)?,
            max_messages: r.u32()?,
            visibility_ms: r.opt(R::u64)?,
            max_bytes: r.u64()?,
        },
        2 => QueueOp::WaitLeasable {
            group: r.str()?,
            parts: r.list(8, r_part)?,
            timeout_ms: r.u64()?,
        },
        3 => QueueOp::Settle {
            topic: r.str()?,
            partition: r.i32()?,
            group: r.str()?,
            items: r.list(12, r_settle_item)?,
        },
        4 => QueueOp::Stats { topic: r.str()? },
        5 => QueueOp::AppendDeadLetter {
            topic: r.str()?,
            partition: r.i32()?,
            batch: r.bytes()?,
        },
        t => return Err(bad(format!("operation {t}"))),
    };
    r.end()?;
    Ok(op)
}

/// Encodes the answer to a forwarded operation; `None` for answers of operations not forwarded.
pub(crate) fn encode_answer(answer: &QueueAnswer) -> Option<Vec<u8>> {
    let mut w = W::default();
    w.u8(VERSION);
    match answer {
        QueueAnswer::Published(results) => {
            w.u8(0);
            w.list(results, |w, r| w_result(w, r, w_published));
        }
        QueueAnswer::Leased(result) => {
            w.u8(1);
            w_result(&mut w, result, |w, leases| w.list(leases, w_leased));
        }
        QueueAnswer::Ready => w.u8(2),
        QueueAnswer::Settled(result) => {
            w.u8(3);
            w_result(&mut w, result, |w, items| {
                w.list(items, |w, item| match item {
                    Ok(s) => {
                        w.u8(0);
                        w_settled(w, s);
                    }
                    Err(e) => {
                        w.u8(1);
                        w_queue_error(w, e);
                    }
                })
            });
        }
        QueueAnswer::Stats(stats) => {
            w.u8(4);
            w.list(stats, w_stats);
        }
        QueueAnswer::Appended(result) => {
            w.u8(5);
            w_result(&mut w, result, |_, ()| {});
        }
        QueueAnswer::Share(_) | QueueAnswer::ShareOffsets(_) | QueueAnswer::ShareAltered(_) => return None,
    }
    Some(w.0)
}

pub(crate) fn decode_answer(bytes: &Bytes) -> Result<QueueAnswer, WireError> {
    let mut r = R {
        whole: bytes,
        buf: bytes,
    };
    let v = r.u8()?;
    if v != VERSION {
        return Err(bad(format!("version {v}")));
    }
    let answer = match r.u8()? {
        0 => QueueAnswer::Published(r.list(2, |r| r_result(r, r_published))?),
        1 => QueueAnswer::Leased(r_result(&mut r, |r| r.list(60, r_leased))?),
        2 => QueueAnswer::Ready,
        3 => QueueAnswer::Settled(r_result(&mut r, |r| {
            r.list(2, |r| {
                Ok(match r.u8()? {
                    0 => Ok(r_settled(r)?),
                    1 => Err(r_queue_error(r)?),
                    t => return Err(bad(format!("settled item {t}"))),
                })
            })
        })?),
        4 => QueueAnswer::Stats(r.list(100, r_stats)?),
        5 => QueueAnswer::Appended(r_result(&mut r, |_| Ok(()))?),
        t => return Err(bad(format!("answer {t}"))),
    };
    r.end()?;
    Ok(answer)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ext(p: i32, o: i64) -> ExternalMessageId {
        ExternalMessageId {
            topic: TopicId(uuid::Uuid::from_u128(7)),
            id: MessageId::new(PartitionId(p), Offset(o)),
        }
    }

    fn ops() -> Vec<QueueOp> {
        vec![
            QueueOp::Publish {
                topic: "orders".into(),
                partition: 3,
                messages: vec![
                    OutMessage {
                        payload: Bytes::from_static(b"hello"),
                        key: Some(Bytes::from_static(b"k")),
                        headers: vec![("h".into(), Bytes::from_static(b"v"))],
                        delay_ms: 5,
                        dedup_token: Some("tok".into()),
                        redrive_of: Some(MessageId::new(PartitionId(3), Offset(9))),
                    },
                    OutMessage {
                        payload: Bytes::new(),
                        key: None,
                        headers: vec![],
                        delay_ms: 0,
                        dedup_token: None,
                        redrive_of: None,
                    },
                ],
            },
            QueueOp::Lease {
                group: "default".into(),
                consumer: "w1".into(),
                parts: vec![PartRef {
                    topic: "orders".into(),
                    partition: 1,
                }],
                max_messages: 10,
                visibility_ms: Some(30_000),
                max_bytes: 1 << 20,
            },
            QueueOp::WaitLeasable {
                group: "g".into(),
                parts: vec![],
                timeout_ms: 100,
            },
            QueueOp::Settle {
                topic: "orders".into(),
                partition: 2,
                group: "default".into(),
                items: vec![
                    SettleItem {
                        target: MessageRef::Id(MessageId::new(PartitionId(2), Offset(4))),
                        fence: Fence::Generation(Generation(7)),
                        op: SettleOp::Nack { delay_ms: Some(10) },
                        reason: Some("boom".into()),
                    },
                    SettleItem {
                        target: MessageRef::Offset(Offset(5)),
                        fence: Fence::Owner(ConsumerId::new("m")),
                        op: SettleOp::Extend { visibility_ms: 9 },
                        reason: None,
                    },
                ],
            },
            QueueOp::Stats {
                topic: "orders".into(),
            },
            // The smallest items of every list (their least size bounds the counts).
            QueueOp::Publish {
                topic: String::new(),
                partition: 0,
                messages: vec![OutMessage {
                    payload: Bytes::new(),
                    key: None,
                    headers: vec![],
                    delay_ms: 0,
                    dedup_token: None,
                    redrive_of: None,
                }],
            },
            QueueOp::Settle {
                topic: String::new(),
                partition: 0,
                group: String::new(),
                items: vec![SettleItem {
                    target: MessageRef::Offset(Offset(0)),
                    fence: Fence::Owner(ConsumerId::new("")),
                    op: SettleOp::Ack,
                    reason: None,
                }],
            },
            QueueOp::Lease {
                group: String::new(),
                consumer: String::new(),
                parts: vec![PartRef {
                    topic: String::new(),
                    partition: 0,
                }],
                max_messages: 0,
                visibility_ms: None,
                max_bytes: 0,
            },
            QueueOp::AppendDeadLetter {
                topic: "orders.dlq".into(),
                partition: 1,
                batch: Bytes::from_static(b"batch"),
            },
        ]
    }

    fn answers() -> Vec<QueueAnswer> {
        vec![
            QueueAnswer::Published(vec![
                Ok(PublishedMessage {
                    id: ext(1, 2),
                    partition: 1,
                    offset: 2,
                    duplicate: true,
                }),
                Err(QueueFailure::NotLeader(Some(NodeId(3)))),
                Err(QueueFailure::Engine(QueueError::NotLeased { state: "leased" })),
            ]),
            QueueAnswer::Leased(Ok(vec![LeasedMessage {
                id: ext(0, 1),
                generation: 4,
                attempt: 2,
                lease_expires_at_ms: 99,
                partition: 0,
                offset: 1,
                published_at_ms: 50,
                key: None,
                payload: Some(Bytes::from_static(b"p")),
                headers: vec![("a".into(), Bytes::from_static(b"b"))],
            }])),
            QueueAnswer::Leased(Err(QueueFailure::Engine(QueueError::VisibilityOutOfRange {
                given_ms: 1,
                min_ms: 2,
                max_ms: 3,
            }))),
            QueueAnswer::Ready,
            QueueAnswer::Settled(Ok(vec![
                Ok(Settled {
                    offset: Offset(4),
                    id: MessageId::new(PartitionId(2), Offset(4)),
                    outcome: Outcome::DeadLettered {
                        cause: DeadLetterCause::Rejected,
                        attempts: 3,
                    },
                }),
                Err(QueueError::StaleGeneration { given: 1, current: 2 }),
            ])),
            QueueAnswer::Settled(Err(QueueFailure::Unavailable("x".into()))),
            QueueAnswer::Appended(Ok(())),
            QueueAnswer::Published(vec![Err(QueueFailure::Engine(QueueError::NotFound))]),
            QueueAnswer::Settled(Ok(vec![Err(QueueError::NotFound)])),
            QueueAnswer::Leased(Ok(vec![LeasedMessage {
                id: ext(0, 0),
                generation: 0,
                attempt: 0,
                lease_expires_at_ms: 0,
                partition: 0,
                offset: 0,
                published_at_ms: 0,
                key: None,
                payload: None,
                headers: vec![],
            }])),
            QueueAnswer::Stats(vec![EngineStats {
                group: String::new(),
                partition: 0,
                metrics: PartitionMetrics {
                    available: 0,
                    leased: 0,
                    delayed: 0,
                    dead_letter_pending: 0,
                    oldest_unacked_age_ms: None,
                    start: Offset(0),
                    loaded_end: Offset(0),
                    log_end: Offset(0),
                    detached: 0,
                    dedup_entries: 0,
                    consumers: 0,
                    counters: Counters::default(),
                },
            }]),
            QueueAnswer::Appended(Err(QueueFailure::Storage("disk".into()))),
            QueueAnswer::Stats(vec![EngineStats {
                group: "default".into(),
                partition: 1,
                metrics: PartitionMetrics {
                    available: 1,
                    leased: 2,
                    delayed: 3,
                    dead_letter_pending: 4,
                    oldest_unacked_age_ms: Some(5),
                    start: Offset(6),
                    loaded_end: Offset(7),
                    log_end: Offset(8),
                    detached: 9,
                    dedup_entries: 10,
                    consumers: 11,
                    counters: Counters {
                        published: 12,
                        acked: 13,
                        ..Counters::default()
                    },
                },
            }]),
        ]
    }

    #[test]
    fn forwarded_operations_and_answers_round_trip() {
        for op in ops() {
            let bytes = Bytes::from(encode_op(&op).expect("forwarded"));
            let back = decode_op(&bytes).expect("decodes");
            assert_eq!(format!("{back:?}"), format!("{op:?}"));
        }
        for a in answers() {
            let bytes = Bytes::from(encode_answer(&a).expect("forwarded"));
            let back = decode_answer(&bytes).expect("decodes");
            assert_eq!(format!("{back:?}"), format!("{a:?}"));
        }
    }

    #[test]
    fn forwarded_payloads_are_slices_of_the_frame_not_copies() {
        let bytes = Bytes::from(encode_op(&ops()[0]).expect("forwarded"));
        let Ok(QueueOp::Publish { messages, .. }) = decode_op(&bytes) else {
            panic!("a publish");
        };
        let frame = bytes.as_ptr_range();
        let payload = messages[0].payload.as_ptr_range();
        assert!(frame.start <= payload.start && payload.end <= frame.end);
    }

    #[test]
    fn truncated_padded_or_random_bytes_are_refused_without_panic() {
        for op in ops() {
            let bytes = Bytes::from(encode_op(&op).expect("forwarded"));
            for cut in 0..bytes.len() {
                assert!(decode_op(&bytes.slice(..cut)).is_err(), "cut at {cut} of {op:?}");
            }
            let mut padded = bytes.to_vec();
            padded.push(0);
            assert!(decode_op(&Bytes::from(padded)).is_err());
        }
        for a in answers() {
            let bytes = Bytes::from(encode_answer(&a).expect("forwarded"));
            for cut in 0..bytes.len() {
                assert!(decode_answer(&bytes.slice(..cut)).is_err(), "cut at {cut}");
            }
        }
        // A huge count in few bytes allocates nothing.
        assert!(decode_op(&Bytes::from_static(&[
            VERSION, 0, 0, 0, 0, 1, b'x', 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff
        ]))
        .is_err());
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..20_000 {
            let len = (seed % 64) as usize;
            let mut b = Vec::with_capacity(len + 2);
            b.push(VERSION);
            for _ in 0..=len {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                b.push((seed % 7) as u8);
            }
            let b = Bytes::from(b);
            let _ = decode_op(&b);
            let _ = decode_answer(&b);
        }
    }
}
