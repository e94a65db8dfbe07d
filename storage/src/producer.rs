//! Idempotent-producer state of one partition: for each producer id, its epoch and its last five
//! batches' sequence ranges and offsets. Sans-I/O.
//!
//! What it decides for a batch from a producer (Kafka's `ProducerStateManager` rules):
//! - a batch whose sequence range equals one of the producer's last five (same epoch) is a
//!   *duplicate*: the producer did not see our acknowledgement and retried; it gets the original
//!   offsets and nothing is appended;
//! - an epoch older than the producer's current one is fenced (INVALID_PRODUCER_EPOCH);
//! - a newer epoch must start at sequence 0;
//! - within an epoch, the first sequence must follow the last one (with wrap-around at
//!   `i32::MAX`), else OUT_OF_ORDER_SEQUENCE_NUMBER;
//! - a producer the partition has no state for (new, or expired) may start at any sequence.
//!
//! State is split in two: `durable` covers batches below the high watermark; `pending` holds
//! batches appended but not yet flushed, in offset order. Checks see both. A flush moves pending
//! batches into `durable`; a failed flush drops them. A checkpoint snapshots `durable` — which is
//! exactly the state as of the high watermark — into the log's `recovery-point` file, and
//! recovery loads the snapshot and re-applies the batches after it from the log, so that a
//! retry of a batch lost in a crash is never taken for a duplicate of data that no longer
//! exists.

use std::collections::{HashMap, VecDeque};

use strand_protocol::batch::BatchHeader;

/// Batches remembered per producer (Kafka's `NUM_BATCHES_TO_RETAIN`).
pub const BATCHES_PER_PRODUCER: usize = 5;

/// One batch of a producer, as remembered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchMeta {
    pub first_seq: i32,
    pub last_seq: i32,
    pub first_offset: i64,
    pub last_offset: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    epoch: i16,
    batches: VecDeque<BatchMeta>,
    /// Largest batch timestamp seen (expiry).
    last_timestamp_ms: i64,
}

/// What to do with a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProducerCheck {
    /// Not from an idempotent producer, or in sequence: append it.
    Append,
    /// Already appended at these offsets.
    Duplicate { first_offset: i64, last_offset: i64 },
    /// Refused.
    Reject(ProducerError),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ProducerError {
    #[error("producer {producer_id} epoch {epoch} is older than its current epoch {current}")]
    FencedEpoch {
        producer_id: i64,
        epoch: i16,
        current: i16,
    },
    #[error("producer {producer_id}: sequence {first_seq} does not follow {last_seq} (epoch {epoch})")]
    OutOfOrder {
        producer_id: i64,
        epoch: i16,
        first_seq: i32,
        last_seq: i32,
    },
    #[error("producer {producer_id}: a new epoch {epoch} must start at sequence 0, not {first_seq}")]
    NewEpochNotAtZero {
        producer_id: i64,
        epoch: i16,
        first_seq: i32,
    },
}

/// Producer state of one partition.
#[derive(Debug, Clone, Default)]
pub struct ProducerState {
    durable: HashMap<i64, Entry>,
    /// (producer id, epoch, batch, timestamp), in offset order.
    pending: VecDeque<(i64, i16, BatchMeta, i64)>,
}

fn in_sequence(last_seq: i32, next_seq: i32) -> bool {
    next_seq == last_seq.wrapping_add(1) || (last_seq == i32::MAX && next_seq == 0)
}

impl ProducerState {
    pub fn is_empty(&self) -> bool {
        self.durable.is_empty() && self.pending.is_empty()
    }

    /// Producers with durable state.
    pub fn len(&self) -> usize {
        self.durable.len()
    }

    /// The producer's current view: durable entry with pending batches on top.
    fn view(&self, producer_id: i64) -> Option<Entry> {
        let mut entry = self.durable.get(&producer_id).cloned();
        for (pid, epoch, meta, ts) in &self.pending {
            if *pid == producer_id {
                apply(&mut entry, *epoch, *meta, *ts);
            }
        }
        entry
    }

    /// Decides what to do with a batch (see the module documentation).
    pub fn check(&self, h: &BatchHeader) -> ProducerCheck {
        if !h.has_producer_id() {
            return ProducerCheck::Append;
        }
        let pid = h.producer_id;
        let first_seq = h.base_sequence;
        let last_seq = h.base_sequence.wrapping_add(h.last_offset_delta);
        let Some(entry) = self.view(pid) else {
            return ProducerCheck::Append;
        };
        if h.producer_epoch < entry.epoch {
            return ProducerCheck::Reject(ProducerError::FencedEpoch {
                producer_id: pid,
                epoch: h.producer_epoch,
                current: entry.epoch,
            });
        }
        if h.producer_epoch == entry.epoch {
            if let Some(b) = entry
                .batches
                .iter()
                .find(|b| b.first_seq == first_seq && b.last_seq == last_seq)
            {
                return ProducerCheck::Duplicate {
                    first_offset: b.first_offset,
                    last_offset: b.last_offset,
                };
            }
            let ok = match entry.batches.back() {
                Some(last) => in_sequence(last.last_seq, first_seq),
                // An epoch with no batch left (all expired): accept, as Kafka does when it has no
                // sequence to compare with.
                None => true,
            };
            if !ok {
                return ProducerCheck::Reject(ProducerError::OutOfOrder {
                    producer_id: pid,
                    epoch: h.producer_epoch,
                    first_seq,
                    last_seq: entry.batches.back().map_or(-1, |b| b.last_seq),
                });
            }
            return ProducerCheck::Append;
        }
        // A newer epoch: sequences restart.
        if first_seq != 0 {
            return ProducerCheck::Reject(ProducerError::NewEpochNotAtZero {
                producer_id: pid,
                epoch: h.producer_epoch,
                first_seq,
            });
        }
        ProducerCheck::Append
    }

    /// Records an appended batch (with its assigned base offset) as pending.
    pub fn append_pending(&mut self, h: &BatchHeader, base_offset: i64) {
        if !h.has_producer_id() {
            return;
        }
        self.pending.push_back((
            h.producer_id,
            h.producer_epoch,
            meta(h, base_offset),
            h.max_timestamp,
        ));
    }

    /// Batches below `end_offset` became durable.
    pub fn flushed(&mut self, end_offset: i64) {
        while let Some((pid, epoch, m, ts)) = self.pending.front().copied() {
            if m.first_offset >= end_offset {
                break;
            }
            self.pending.pop_front();
            let mut entry = self.durable.remove(&pid);
            apply(&mut entry, epoch, m, ts);
            if let Some(e) = entry {
                self.durable.insert(pid, e);
            }
        }
    }

    /// A flush failed: pending batches are gone.
    pub fn discard_pending(&mut self) {
        self.pending.clear();
    }

    /// Applies a batch read back from the log (recovery, replay). Batches at or below what an
    /// entry already covers are ignored, so re-applying a snapshot's tail is harmless.
    pub fn apply_durable(&mut self, h: &BatchHeader) {
        if !h.has_producer_id() {
            return;
        }
        let m = meta(h, h.base_offset);
        if let Some(e) = self.durable.get(&h.producer_id) {
            if e.batches.back().is_some_and(|b| b.last_offset >= m.first_offset) {
                return;
            }
        }
        let mut entry = self.durable.remove(&h.producer_id);
        apply(&mut entry, h.producer_epoch, m, h.max_timestamp);
        if let Some(e) = entry {
            self.durable.insert(h.producer_id, e);
        }
    }

    /// Forgets durable state of batches at or after `offset` (the log was cut there).
    pub fn truncate(&mut self, offset: i64) {
        self.pending.retain(|(_, _, m, _)| m.first_offset < offset);
        for e in self.durable.values_mut() {
            e.batches.retain(|b| b.first_offset < offset);
        }
        self.durable.retain(|_, e| !e.batches.is_empty());
    }

    /// Drops producers idle for `expiration_ms` (`producer.id.expiration.ms`), and the least
    /// recently active ones beyond `max_producers`. Returns how many were dropped.
    pub fn expire(&mut self, now_ms: i64, expiration_ms: i64, max_producers: usize) -> usize {
        let before = self.durable.len();
        let pending: std::collections::HashSet<i64> = self.pending.iter().map(|p| p.0).collect();
        self.durable.retain(|pid, e| {
            pending.contains(pid) || now_ms.saturating_sub(e.last_timestamp_ms) < expiration_ms
        });
        if self.durable.len() > max_producers {
            let mut by_age: Vec<(i64, i64)> = self
                .durable
                .iter()
                .map(|(p, e)| (e.last_timestamp_ms, *p))
                .collect();
            by_age.sort_unstable();
            let excess = self.durable.len() - max_producers;
            for (_, pid) in by_age
                .into_iter()
                .filter(|(_, p)| !pending.contains(p))
                .take(excess)
            {
                self.durable.remove(&pid);
            }
        }
        before - self.durable.len()
    }

    /// Encodes the durable state (a snapshot taken at `offset`, the high watermark).
    pub fn encode_snapshot(&self, offset: i64) -> Vec<u8> {
        let mut out = Vec::with_capacity(32 + self.durable.len() * 64);
        out.extend_from_slice(b"STRNDPS1");
        out.extend_from_slice(&offset.to_be_bytes());
        out.extend_from_slice(&(self.durable.len() as u32).to_be_bytes());
        let mut pids: Vec<&i64> = self.durable.keys().collect();
        pids.sort_unstable();
        for pid in pids {
            let Some(e) = self.durable.get(pid) else { continue };
            out.extend_from_slice(&pid.to_be_bytes());
            out.extend_from_slice(&e.epoch.to_be_bytes());
            out.extend_from_slice(&e.last_timestamp_ms.to_be_bytes());
            out.push(e.batches.len() as u8);
            for b in &e.batches {
                out.extend_from_slice(&b.first_seq.to_be_bytes());
                out.extend_from_slice(&b.last_seq.to_be_bytes());
                out.extend_from_slice(&b.first_offset.to_be_bytes());
                out.extend_from_slice(&b.last_offset.to_be_bytes());
            }
        }
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_be_bytes());
        out
    }

    /// Decodes a snapshot: the state and the offset it was taken at. `None` if damaged.
    pub fn decode_snapshot(bytes: &[u8]) -> Option<(ProducerState, i64)> {
        let (body, crc) = bytes.split_at_checked(bytes.len().checked_sub(4)?)?;
        if crc32c::crc32c(body) != u32::from_be_bytes(crc.try_into().ok()?) {
            return None;
        }
        let mut r = Reader(body);
        if r.take(8)? != b"STRNDPS1" {
            return None;
        }
        let offset = r.i64()?;
        let n = r.u32()? as usize;
        let mut state = ProducerState::default();
        for _ in 0..n.min(body.len()) {
            let pid = r.i64()?;
            let epoch = r.i16()?;
            let last_timestamp_ms = r.i64()?;
            let count = *r.take(1)?.first()? as usize;
            let mut batches = VecDeque::with_capacity(count.min(BATCHES_PER_PRODUCER));
            for _ in 0..count {
                batches.push_back(BatchMeta {
                    first_seq: r.i32()?,
                    last_seq: r.i32()?,
                    first_offset: r.i64()?,
                    last_offset: r.i64()?,
                });
            }
            state.durable.insert(
                pid,
                Entry {
                    epoch,
                    batches,
                    last_timestamp_ms,
                },
            );
        }
        Some((state, offset))
    }
}

fn meta(h: &BatchHeader, base_offset: i64) -> BatchMeta {
    BatchMeta {
        first_seq: h.base_sequence,
        last_seq: h.base_sequence.wrapping_add(h.last_offset_delta),
        first_offset: base_offset,
        last_offset: base_offset + i64::from(h.last_offset_delta),
    }
}

fn apply(entry: &mut Option<Entry>, epoch: i16, m: BatchMeta, ts: i64) {
    match entry {
        Some(e) if e.epoch == epoch => {
            e.batches.push_back(m);
            while e.batches.len() > BATCHES_PER_PRODUCER {
                e.batches.pop_front();
            }
            e.last_timestamp_ms = e.last_timestamp_ms.max(ts);
        }
        Some(e) if e.epoch > epoch => {}
        _ => {
            *entry = Some(Entry {
                epoch,
                batches: VecDeque::from([m]),
                last_timestamp_ms: ts,
            })
        }
    }
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        let (a, b) = self.0.split_at_checked(n)?;
        self.0 = b;
        Some(a)
    }
    fn i16(&mut self) -> Option<i16> {
        Some(i16::from_be_bytes(self.take(2)?.try_into().ok()?))
    }
    fn i32(&mut self) -> Option<i32> {
        Some(i32::from_be_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_be_bytes(self.take(4)?.try_into().ok()?))
    }
    fn i64(&mut self) -> Option<i64> {
        Some(i64::from_be_bytes(self.take(8)?.try_into().ok()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strand_protocol::batch::build;

    fn header(pid: i64, epoch: i16, seq: i32, n: usize, ts: i64) -> BatchHeader {
        let recs: Vec<build::TestRecord<'_>> = (0..n).map(|_| build::TestRecord::default()).collect();
        let b = build::batch_with_producer(&recs, ts, pid, epoch, seq);
        BatchHeader::parse(&b).unwrap()
    }

    #[test]
    fn sequences_duplicates_and_epochs() {
        let mut s = ProducerState::default();
        let b0 = header(7, 0, 0, 3, 1000);
        assert_eq!(
            s.check(&b0),
            ProducerCheck::Append,
            "a new producer starts anywhere"
        );
        s.append_pending(&b0, 100);
        // The retry of an unflushed batch is a duplicate already.
        assert_eq!(
            s.check(&b0),
            ProducerCheck::Duplicate {
                first_offset: 100,
                last_offset: 102
            }
        );
        s.flushed(103);
        let b1 = header(7, 0, 3, 2, 1001);
        assert_eq!(s.check(&b1), ProducerCheck::Append);
        s.append_pending(&b1, 103);
        s.flushed(105);
        assert!(matches!(
            s.check(&header(7, 0, 9, 1, 0)),
            ProducerCheck::Reject(ProducerError::OutOfOrder { .. })
        ));
        assert_eq!(
            s.check(&b0),
            ProducerCheck::Duplicate {
                first_offset: 100,
                last_offset: 102
            }
        );
        // Epoch bump: must restart at 0; the old epoch is fenced afterwards.
        assert!(matches!(
            s.check(&header(7, 1, 5, 1, 0)),
            ProducerCheck::Reject(ProducerError::NewEpochNotAtZero { .. })
        ));
        let e1 = header(7, 1, 0, 1, 1002);
        assert_eq!(s.check(&e1), ProducerCheck::Append);
        s.append_pending(&e1, 105);
        s.flushed(106);
        assert!(matches!(
            s.check(&b1),
            ProducerCheck::Reject(ProducerError::FencedEpoch { .. })
        ));
        // Non-idempotent batches always append.
        assert_eq!(s.check(&header(-1, -1, -1, 2, 0)), ProducerCheck::Append);
    }

    #[test]
    fn only_five_batches_are_remembered_and_wrap_around_is_in_sequence() {
        let mut s = ProducerState::default();
        let mut off = 0;
        for i in 0..7 {
            let h = header(1, 0, i, 1, 0);
            assert_eq!(s.check(&h), ProducerCheck::Append);
            s.append_pending(&h, off);
            off += 1;
        }
        s.flushed(off);
        // Batch 0 and 1 are forgotten: their retry is out of order, not a duplicate.
        assert!(matches!(
            s.check(&header(1, 0, 0, 1, 0)),
            ProducerCheck::Reject(_)
        ));
        assert!(matches!(
            s.check(&header(1, 0, 2, 1, 0)),
            ProducerCheck::Duplicate { .. }
        ));
        let mut w = ProducerState::default();
        let last = header(2, 0, i32::MAX, 1, 0);
        w.append_pending(&last, 0);
        assert_eq!(w.check(&header(2, 0, 0, 1, 0)), ProducerCheck::Append);
    }

    #[test]
    fn failed_flush_forgets_pending_and_snapshot_round_trips() {
        let mut s = ProducerState::default();
        let a = header(3, 0, 0, 1, 10);
        s.append_pending(&a, 0);
        s.flushed(1);
        let b = header(3, 0, 1, 1, 11);
        s.append_pending(&b, 1);
        s.discard_pending();
        assert_eq!(
            s.check(&b),
            ProducerCheck::Append,
            "the lost batch is not a duplicate"
        );
        let snap = s.encode_snapshot(1);
        let (back, off) = ProducerState::decode_snapshot(&snap).unwrap();
        assert_eq!(off, 1);
        assert_eq!(back.durable, s.durable);
        let mut bad = snap.clone();
        bad[10] ^= 1;
        assert!(ProducerState::decode_snapshot(&bad).is_none());
        assert!(ProducerState::decode_snapshot(&snap[..5]).is_none());
    }

    #[test]
    fn expiry_and_bound() {
        let mut s = ProducerState::default();
        for pid in 0..10 {
            let h = header(pid, 0, 0, 1, pid * 100);
            s.append_pending(&h, pid);
        }
        s.flushed(100);
        assert_eq!(
            s.expire(1000, 500, 100),
            6,
            "producers idle for 500 ms or more go"
        );
        assert_eq!(s.expire(1000, 10_000, 3), 1, "beyond the bound, the oldest go");
        assert_eq!(s.len(), 3);
    }
}
