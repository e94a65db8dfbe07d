//! What a partition's Raft group needs from the log underneath it, and an in-memory log that
//! loses what was not flushed when it "crashes" (for the simulation and the storage tests).
//!
//! The broker's implementation will sit on `strand_storage::PartitionLog` and the shard
//! journal (batches in the segment files, internal entries and votes as journal records, so
//! that one flush round orders them with the batches).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::rc::Rc;

use bytes::{Bytes, BytesMut};
use openraft::vote::leader_id_std::CommittedLeaderId;
use openraft::{Membership, StoredMembership};
use strand_protocol::batch::{patch_batch, BatchHeader};
use strand_protocol::types::Offset;

use super::entry_map::PurgePoint;
use super::types::{BrokerId, SideRecord};
use crate::Term;

/// A Raft-internal entry, recorded beside the log: it takes an index but no Kafka offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InternalEntry {
    pub index: u64,
    pub term: Term,
    /// `None` for a leader's blank entry.
    pub membership: Option<Membership<BrokerId, ()>>,
}

/// A vote as stored: `(term, voted-for, committed)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoredVote {
    pub term: Term,
    pub node: BrokerId,
    pub committed: bool,
}

/// The state a snapshot captures: the last entry it covers, the group's membership as of it,
/// and the Kafka offset after it. Everything at or below `last` is in the log and committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotRecord {
    pub last: PurgePoint,
    pub membership: StoredMembership<CommittedLeaderId<u64>, BrokerId, ()>,
}

/// A side record as stored beside the log, with the Raft index and term of its entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredSide {
    pub index: u64,
    pub term: Term,
    pub record: SideRecord,
}

/// A batch as stored: its base offset and term are stamped into its header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredBatch {
    pub base_offset: Offset,
    pub term: Term,
    pub bytes: Bytes,
}

/// What a replica finds in its log after a restart, to rebuild its entry map from.
#[derive(Debug, Clone)]
pub struct Recovered {
    pub purged: Option<PurgePoint>,
    /// The log's start offset (where entry 0 began, if nothing was purged).
    pub start_offset: Offset,
    pub internal: Vec<(u64, Term)>,
    /// `(index, term)` of the side records above the purge point.
    pub side: Vec<(u64, Term)>,
    /// `(term, base offset, offset count)` of every batch from the purge point on.
    pub batches: Vec<(Term, Offset, u32)>,
    pub vote: Option<StoredVote>,
    pub snapshot: Option<SnapshotRecord>,
    /// Set while the leader's log was being installed from this offset on: a restart truncates
    /// the log back to it.
    pub installing_from: Option<Offset>,
}

pub type LogFuture<T> = Pin<Box<dyn Future<Output = io::Result<T>>>>;

/// The partition log as a Raft group uses it.
///
/// Batches and side records are staged and become durable, each kind in append order, at the
/// next `flush`; a crash keeps a prefix of each, everything flushed included. `append_internal`,
/// `truncate` and `save_vote` are durable when their future completes.
pub trait ReplicaLog: 'static {
    /// Stages `batch` at `base_offset`, stamped with `term` as its `partitionLeaderEpoch`.
    fn append_batch(&self, base_offset: Offset, term: Term, batch: &Bytes) -> io::Result<()>;

    /// Records an internal entry durably: everything appended after it is durable no earlier.
    /// (Internal entries are rare, one per leader change or membership change, so each may
    /// cost a sync.)
    fn append_internal(&self, entry: InternalEntry) -> LogFuture<()>;

    /// Stages a side record (see [`super::types::SideRecord`]): durable at the next flush. The
    /// caller flushes before it appends a batch after one, so that a batch is never durable
    /// while a side record before it is lost (a restart places batches by counting the indexes
    /// that the entries recorded beside the log leave free).
    fn append_side(&self, side: StoredSide) -> LogFuture<()>;

    /// The stored side records with indexes in `from..to`, in order, whether or not Raft has
    /// purged them (the subsystem that wrote them reads them all; see [`ReplicaLog::trim_side`]).
    fn side_records(&self, from: u64, to: u64) -> LogFuture<Vec<StoredSide>>;

    /// Lets the side records before index `keep_from` go: the subsystem that wrote them no
    /// longer needs them. Only records at or below the purge point are trimmed (a restart
    /// places the entries above it by what is recorded beside the log); losing a trim in a
    /// crash only keeps more.
    fn trim_side(&self, keep_from: u64) -> LogFuture<()>;

    /// Forgets internal entries and side records that a restart found beyond the recovered
    /// log's end.
    fn forget_beside(&self, indexes: &[u64]) -> LogFuture<()>;

    /// Makes everything staged so far durable.
    fn flush(&self) -> LogFuture<()>;

    /// The stored batches with base offsets in `from..to`, in order.
    fn read_batches(&self, from: Offset, to: Offset) -> LogFuture<Vec<StoredBatch>>;

    /// The internal entry recorded at `index`.
    fn internal_entry(&self, index: u64) -> Option<InternalEntry>;

    /// Drops the batches at or after `offset` and the internal entries and side records after
    /// `keep_beside` (all of them for `None`).
    fn truncate(&self, offset: Offset, keep_beside: Option<u64>) -> LogFuture<()>;

    /// Forgets internal entries at or below the purge point and remembers the point (losing it
    /// in a crash only makes the next restart rebuild from further back). Side records stay
    /// until trimmed.
    fn save_purge_point(&self, purged: PurgePoint) -> LogFuture<()>;

    fn save_vote(&self, vote: StoredVote) -> LogFuture<()>;

    /// Records the latest snapshot durably: a restart starts the state machine from it.
    fn save_snapshot(&self, snapshot: SnapshotRecord) -> LogFuture<()>;

    /// Records durably that the leader's log is about to be written from `from` on (after a
    /// truncation to `from`). Until [`ReplicaLog::finish_install`], a restart truncates the log
    /// back to `from`: a half-installed log must not be taken for entries of this replica's own.
    fn begin_install(&self, from: Offset) -> LogFuture<()>;

    /// Atomically and durably: the snapshot record, the purge point at its last entry, internal
    /// entries at or below it forgotten, and the install marker cleared.
    fn finish_install(&self, snapshot: SnapshotRecord) -> LogFuture<()>;

    fn vote(&self) -> Option<StoredVote>;

    /// What is there, for rebuilding the entry map.
    fn recover(&self) -> LogFuture<Recovered>;
}

/// Simulated flush latency: the future a flush waits on before it makes its writes durable.
pub type FlushDelay = Rc<dyn Fn() -> Pin<Box<dyn Future<Output = ()>>>>;

#[derive(Debug, Clone, Default)]
struct MemState {
    batches: BTreeMap<i64, StoredBatch>,
    internal: BTreeMap<u64, InternalEntry>,
    side: BTreeMap<u64, StoredSide>,
    purged: Option<PurgePoint>,
}

struct MemInner {
    /// What a reader sees: durable state plus staged appends.
    live: MemState,
    /// What survives a crash.
    durable: MemState,
    staged: Vec<StoredBatch>,
    staged_side: Vec<StoredSide>,
    vote: Option<StoredVote>,
    snapshot: Option<SnapshotRecord>,
    installing_from: Option<Offset>,
    start_offset: Offset,
    flush_delay: Option<FlushDelay>,
}

/// An in-memory [`ReplicaLog`] that keeps only what was flushed across [`MemReplicaLog::crash`].
#[derive(Clone)]
pub struct MemReplicaLog {
    inner: Rc<RefCell<MemInner>>,
}

impl MemReplicaLog {
    pub fn new(start_offset: Offset) -> MemReplicaLog {
        MemReplicaLog {
            inner: Rc::new(RefCell::new(MemInner {
                live: MemState::default(),
                durable: MemState::default(),
                staged: Vec::new(),
                staged_side: Vec::new(),
                vote: None,
                snapshot: None,
                installing_from: None,
                start_offset,
                flush_delay: None,
            })),
        }
    }

    /// Makes every flush wait on `delay` first (a simulated fsync), opening a window in which
    /// a crash loses staged appends.
    pub fn set_flush_delay(&self, delay: FlushDelay) {
        self.inner.borrow_mut().flush_delay = Some(delay);
    }

    /// A power cut: staged appends are lost; the log is what was durable.
    pub fn crash(&self) {
        let mut inner = self.inner.borrow_mut();
        inner.staged.clear();
        inner.staged_side.clear();
        inner.live = inner.durable.clone();
    }

    /// Every stored batch, in offset order (for comparing replicas).
    pub fn batches(&self) -> Vec<StoredBatch> {
        self.inner.borrow().live.batches.values().cloned().collect()
    }

    /// Every stored side record, in index order.
    pub fn side(&self) -> Vec<StoredSide> {
        self.inner.borrow().live.side.values().cloned().collect()
    }

    /// Every durable side record, in index order.
    pub fn durable_side(&self) -> Vec<StoredSide> {
        self.inner.borrow().durable.side.values().cloned().collect()
    }

    /// Every durable batch, in offset order.
    pub fn durable_batches(&self) -> Vec<StoredBatch> {
        self.inner.borrow().durable.batches.values().cloned().collect()
    }
}

fn stamp(base_offset: Offset, term: Term, batch: &Bytes) -> io::Result<Bytes> {
    let epoch = term
        .as_leader_epoch()
        .ok_or_else(|| io::Error::other(format!("term {} is beyond Kafka's leader epochs", term.0)))?;
    let mut bytes = BytesMut::from(&batch[..]);
    patch_batch(&mut bytes, base_offset.0, epoch.0);
    Ok(bytes.freeze())
}

fn offset_count(bytes: &[u8]) -> io::Result<u32> {
    let header = BatchHeader::parse(bytes)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{e:?}")))?;
    u32::try_from(header.offset_count())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "bad offset count"))
}

impl ReplicaLog for MemReplicaLog {
    fn append_batch(&self, base_offset: Offset, term: Term, batch: &Bytes) -> io::Result<()> {
        let stored = StoredBatch {
            base_offset,
            term,
            bytes: stamp(base_offset, term, batch)?,
        };
        let mut inner = self.inner.borrow_mut();
        if let Some((_, last)) = inner.live.batches.last_key_value() {
            let next = last.base_offset.0 + i64::from(offset_count(&last.bytes)?);
            assert_eq!(next, base_offset.0, "batches are appended at the log end");
        }
        inner.live.batches.insert(base_offset.0, stored.clone());
        inner.staged.push(stored);
        Ok(())
    }

    fn append_internal(&self, entry: InternalEntry) -> LogFuture<()> {
        let mut inner = self.inner.borrow_mut();
        inner.live.internal.insert(entry.index, entry.clone());
        inner.durable.internal.insert(entry.index, entry);
        Box::pin(async { Ok(()) })
    }

    fn append_side(&self, side: StoredSide) -> LogFuture<()> {
        let mut inner = self.inner.borrow_mut();
        if let Some((last, _)) = inner.live.side.last_key_value() {
            assert!(*last < side.index, "side records are appended in index order");
        }
        inner.live.side.insert(side.index, side.clone());
        inner.staged_side.push(side);
        Box::pin(async { Ok(()) })
    }

    fn side_records(&self, from: u64, to: u64) -> LogFuture<Vec<StoredSide>> {
        let found: Vec<StoredSide> = if from < to {
            self.inner
                .borrow()
                .live
                .side
                .range(from..to)
                .map(|(_, s)| s.clone())
                .collect()
        } else {
            Vec::new()
        };
        Box::pin(async move { Ok(found) })
    }

    fn trim_side(&self, keep_from: u64) -> LogFuture<()> {
        let mut inner = self.inner.borrow_mut();
        let inner = &mut *inner;
        for state in [&mut inner.live, &mut inner.durable] {
            state.side.retain(|i, _| *i >= keep_from);
        }
        Box::pin(async { Ok(()) })
    }

    fn forget_beside(&self, indexes: &[u64]) -> LogFuture<()> {
        let mut inner = self.inner.borrow_mut();
        for i in indexes {
            inner.live.internal.remove(i);
            inner.durable.internal.remove(i);
            inner.live.side.remove(i);
            inner.durable.side.remove(i);
        }
        Box::pin(async { Ok(()) })
    }

    fn flush(&self) -> LogFuture<()> {
        let inner = Rc::clone(&self.inner);
        let delay = self.inner.borrow().flush_delay.clone();
        // What this flush covers: the appends staged before it was asked for.
        let upto = self.inner.borrow().staged.len();
        let upto_side = self.inner.borrow().staged_side.len();
        Box::pin(async move {
            if let Some(delay) = delay {
                delay().await;
            }
            let mut inner = inner.borrow_mut();
            // A crash in between cleared the staged appends; they are not made durable.
            let n = upto.min(inner.staged.len());
            let done: Vec<StoredBatch> = inner.staged.drain(..n).collect();
            for b in done {
                inner.durable.batches.insert(b.base_offset.0, b);
            }
            let n = upto_side.min(inner.staged_side.len());
            let done: Vec<StoredSide> = inner.staged_side.drain(..n).collect();
            for s in done {
                inner.durable.side.insert(s.index, s);
            }
            Ok(())
        })
    }

    fn read_batches(&self, from: Offset, to: Offset) -> LogFuture<Vec<StoredBatch>> {
        let found: Vec<StoredBatch> = if from < to {
            self.inner
                .borrow()
                .live
                .batches
                .range(from.0..to.0)
                .map(|(_, b)| b.clone())
                .collect()
        } else {
            Vec::new()
        };
        Box::pin(async move { Ok(found) })
    }

    fn internal_entry(&self, index: u64) -> Option<InternalEntry> {
        self.inner.borrow().live.internal.get(&index).cloned()
    }

    fn truncate(&self, offset: Offset, keep_beside: Option<u64>) -> LogFuture<()> {
        let mut inner = self.inner.borrow_mut();
        let keep_index = keep_beside.map_or(0, |i| i.saturating_add(1));
        let inner = &mut *inner;
        for state in [&mut inner.live, &mut inner.durable] {
            state.batches.retain(|o, _| *o < offset.0);
            state.internal.retain(|i, _| *i < keep_index);
            state.side.retain(|i, _| *i < keep_index);
        }
        inner.staged.retain(|b| b.base_offset < offset);
        inner.staged_side.retain(|s| s.index < keep_index);
        Box::pin(async { Ok(()) })
    }

    fn save_purge_point(&self, purged: PurgePoint) -> LogFuture<()> {
        let mut inner = self.inner.borrow_mut();
        let inner = &mut *inner;
        for state in [&mut inner.live, &mut inner.durable] {
            state.internal.retain(|i, _| *i > purged.index);
            state.purged = Some(purged);
        }
        Box::pin(async { Ok(()) })
    }

    fn save_vote(&self, vote: StoredVote) -> LogFuture<()> {
        self.inner.borrow_mut().vote = Some(vote);
        Box::pin(async { Ok(()) })
    }

    fn vote(&self) -> Option<StoredVote> {
        self.inner.borrow().vote
    }

    fn save_snapshot(&self, snapshot: SnapshotRecord) -> LogFuture<()> {
        self.inner.borrow_mut().snapshot = Some(snapshot);
        Box::pin(async { Ok(()) })
    }

    fn begin_install(&self, from: Offset) -> LogFuture<()> {
        self.inner.borrow_mut().installing_from = Some(from);
        Box::pin(async { Ok(()) })
    }

    fn finish_install(&self, snapshot: SnapshotRecord) -> LogFuture<()> {
        let mut inner = self.inner.borrow_mut();
        let point = snapshot.last;
        let inner = &mut *inner;
        for state in [&mut inner.live, &mut inner.durable] {
            state.internal.retain(|i, _| *i > point.index);
            state.purged = Some(point);
        }
        inner.snapshot = Some(snapshot);
        inner.installing_from = None;
        Box::pin(async { Ok(()) })
    }

    fn recover(&self) -> LogFuture<Recovered> {
        let recovered = (|| -> io::Result<Recovered> {
            let inner = self.inner.borrow();
            let mut batches = Vec::with_capacity(inner.live.batches.len());
            for b in inner.live.batches.values() {
                batches.push((b.term, b.base_offset, offset_count(&b.bytes)?));
            }
            Ok(Recovered {
                purged: inner.live.purged,
                start_offset: inner.start_offset,
                internal: inner.live.internal.values().map(|e| (e.index, e.term)).collect(),
                side: inner
                    .live
                    .side
                    .values()
                    .filter(|s| inner.live.purged.is_none_or(|p| s.index > p.index))
                    .map(|s| (s.index, s.term))
                    .collect(),
                batches,
                vote: inner.vote,
                snapshot: inner.snapshot.clone(),
                installing_from: inner.installing_from,
            })
        })();
        Box::pin(async move { recovered })
    }
}
