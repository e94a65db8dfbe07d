//! Reading the message log for the engines: loading their window, payloads for leases, the
//! batches a share fetch returns.

use super::DURABLE_WAIT;
use super::MAX_DECOMPRESSED_BYTES;
use crate::queue::engine::dead_letter::HEADER_DEDUP_TOKEN;
use crate::queue::engine::dead_letter::HEADER_DELIVER_AT;
use crate::queue::engine::dead_letter::HEADER_MESSAGE_ID;
use crate::queue::engine::AppendedMessage;
use crate::queue::engine::ExternalMessageId;
use crate::queue::engine::QueuePartition;
use crate::shard::Shard;
use bytes::Bytes;
use std::collections::BTreeSet;
use std::collections::HashMap;
use strand_protocol::records::decode_records;
use strand_protocol::records::Record;
use strand_protocol::types::Offset;
use strand_protocol::types::TopicId;
use strand_storage::LogId;
use strand_storage::StorageError;

/// Feeds one log record to an engine (loading, recovery).
pub(super) fn feed(q: &mut QueuePartition, topic_id: TopicId, r: &Record, now: i64) {
    let mut deliver_at_ms = 0i64;
    let mut token: Option<&[u8]> = None;
    let mut message_id = None;
    for (k, v) in &r.headers {
        let Some(v) = v.as_deref() else { continue };
        match &k[..] {
            k if k == HEADER_DELIVER_AT.as_bytes() => {
                deliver_at_ms = std::str::from_utf8(v)
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0);
            }
            k if k == HEADER_DEDUP_TOKEN.as_bytes() => token = Some(v),
            k if k == HEADER_MESSAGE_ID.as_bytes() => {
                message_id = std::str::from_utf8(v)
                    .ok()
                    .and_then(|s| s.parse::<ExternalMessageId>().ok())
                    .filter(|id| {
                        id.topic == topic_id && id.id.partition == q.partition() && id.id.offset.0 < r.offset
                    })
                    .map(|id| id.id);
            }
            _ => {}
        }
    }
    q.appended(
        &AppendedMessage {
            offset: Offset(r.offset),
            key: r.key.as_deref(),
            timestamp_ms: r.timestamp,
            deliver_at_ms,
            dedup_token: token,
            message_id,
        },
        now,
    );
}

/// The headers a consumer sees: Strand's publish bookkeeping (`strand-deliver-at-ms`,
/// `strand-dedup-token`) is left out; `strand-message-id` of a redriven copy too (the lease
/// carries the id).
pub(super) fn user_headers(r: &Record) -> Vec<(String, Bytes)> {
    r.headers
        .iter()
        .filter_map(|(k, v)| {
            let k = std::str::from_utf8(k).ok()?;
            if k == HEADER_DELIVER_AT || k == HEADER_DEDUP_TOKEN || k == HEADER_MESSAGE_ID {
                return None;
            }
            Some((k.to_owned(), v.clone().unwrap_or_default()))
        })
        .collect()
}

/// Reads whole batches from `from` (at most about `max_bytes`, at least one batch) and decodes
/// their records. Empty at the high watermark.
pub(super) async fn read_records(
    shard: &Shard,
    log: LogId,
    from: i64,
    max_bytes: usize,
) -> Result<Vec<Record>, StorageError> {
    let Some(plan) = shard.store.plan_read(log, from, max_bytes)? else {
        return Ok(Vec::new());
    };
    let bytes = plan.execute().await?;
    let mut out = Vec::new();
    let mut scanner = strand_protocol::batch::BatchScanner::new(&bytes, false);
    for b in scanner.by_ref() {
        let end = b.position + b.header.total_bytes();
        if b.header.is_control() {
            continue;
        }
        match decode_records(&bytes.slice(b.position..end), MAX_DECOMPRESSED_BYTES) {
            Ok(recs) => out.extend(recs),
            Err(e) => {
                tracing::error!(offset = b.header.base_offset, error = %e, "undecodable batch in a queue's log; its messages are skipped");
            }
        }
    }
    Ok(out)
}

/// Reads the records at `offsets` (any order); missing ones (deleted, beyond the high
/// watermark) are absent from the answer.
pub(super) async fn read_offsets(shard: &Shard, log: LogId, offsets: &[i64]) -> HashMap<i64, Record> {
    let mut want: BTreeSet<i64> = offsets.iter().copied().collect();
    let mut out = HashMap::with_capacity(want.len());
    while let Some(&first) = want.first() {
        let records = match read_records(shard, log, first, 256 << 10).await {
            Ok(r) => r,
            Err(StorageError::OffsetOutOfRange { log_start_offset, .. }) if first < log_start_offset => {
                // Below the log start: gone.
                want = want.split_off(&log_start_offset);
                continue;
            }
            Err(_) => break,
        };
        let Some(last) = records.last().map(|r| r.offset) else {
            break;
        };
        for r in records {
            if want.remove(&r.offset) {
                out.insert(r.offset, r);
            }
        }
        // Offsets up to the last one read that were not found are not in the log.
        want = want.split_off(&(last + 1));
    }
    out
}

/// The stored batches covering offsets `first..=last` (whole batches, as stored), reading at
/// least `max_bytes` at a time.
pub(super) async fn read_range(
    shard: &Shard,
    log: LogId,
    first: i64,
    last: i64,
    max_bytes: usize,
) -> Option<Bytes> {
    let mut parts: Vec<Bytes> = Vec::new();
    let mut next = first;
    // Read in modest chunks: the acquired range is usually far smaller than the client's
    // max_bytes (50 MB by default), and every byte read is copied out of the page cache.
    let chunk_bytes = max_bytes.clamp(64 << 10, 256 << 10);
    while next <= last {
        let plan = shard.store.plan_read(log, next, chunk_bytes).ok()??;
        let chunk = plan.execute().await.ok()?;
        // Whole batches up to the one holding `last`: a read chunk may hold far more than the
        // acquired range, and the answer carries only what was acquired.
        let mut end = None;
        for b in strand_protocol::batch::BatchScanner::new(&chunk, false) {
            if b.header.base_offset > last {
                break;
            }
            end = Some((b.position + b.header.total_bytes(), b.header.next_offset()));
        }
        let (len, next_offset) = end?;
        parts.push(chunk.slice(..len.min(chunk.len())));
        if next_offset <= next {
            break;
        }
        next = next_offset;
    }
    match parts.len() {
        0 => None,
        1 => parts.pop(),
        _ => {
            let mut out = bytes::BytesMut::with_capacity(parts.iter().map(Bytes::len).sum());
            for p in &parts {
                out.extend_from_slice(p);
            }
            Some(out.freeze())
        }
    }
}

/// Waits (bounded) until the log's high watermark reaches `offset`.
pub(super) async fn wait_high_watermark(shard: &Shard, log: LogId, offset: i64) {
    let deadline = std::time::Instant::now() + DURABLE_WAIT;
    loop {
        let w = shard.store.durable_notify().wait();
        match shard.store.offsets(log) {
            Ok(o) if o.high_watermark >= offset => return,
            Ok(_) => {}
            Err(_) => return,
        }
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return;
        }
        let timer = glommio::timer::sleep(left);
        futures::pin_mut!(w);
        futures::pin_mut!(timer);
        futures::future::select(w, timer).await;
    }
}
