//! A partition replica as openraft sees it: log storage, log reader, state machine and
//! snapshot builder, all over one [`ReplicaLog`] and one [`EntryMap`].
//!
//! - **Log storage.** `append` stamps each data entry's batch with the Kafka offset the entry
//!   map gives it and its term, stages it in the partition log, and reports the entries flushed
//!   once the log's flush returns. Internal entries and side records are recorded beside the
//!   log (a batch after a side record waits for the record's flush). `truncate_after`
//!   translates the Raft index into a Kafka offset and truncates the log there; `purge` only
//!   forgets map entries (the batches stay: consumers read them; Kafka retention deletes them).
//! - **State machine.** The data is already in the log, so applying an entry moves the *high
//!   watermark* (the Kafka offset after the last applied batch) and answers the proposer with
//!   the batch's base offset (a side record's proposer, with its index). The high watermark is
//!   the commit index, translated. Applying a side record lets the records before its
//!   keep-from index go, once Raft has purged their entries.
//! - **Snapshots.** A snapshot is the log itself: its metadata (last log id, membership, the
//!   Kafka offset after it) is cheap to build; installing one on a follower that is behind
//!   writes the leader's batches and side records it lacks. Here they travel inside the
//!   snapshot value; the broker's transport is to ship segment files instead.
//!
//! The replica's state is one `Rc<RefCell<_>>`; no borrow is held across an `await`.

use std::cell::RefCell;
use std::fmt::Debug;
use std::io;
use std::marker::PhantomData;
use std::ops::{Bound, RangeBounds};
use std::rc::Rc;

use bytes::Bytes;
use futures::{Stream, TryStreamExt};
use openraft::storage::{EntryResponder, IOFlushed, RaftLogStorage, RaftStateMachine};
use openraft::{
    AsyncRuntime, EntryPayload, LogState, OptionalSend, RaftLogReader, RaftSnapshotBuilder, Snapshot,
    SnapshotMeta, StoredMembership,
};
use strand_protocol::batch::BatchHeader;
use strand_protocol::types::Offset;

use super::entry_map::{Beside, EntryMap, PurgePoint, Slot};
use super::replica_log::{InternalEntry, ReplicaLog, SnapshotRecord, StoredBatch, StoredSide, StoredVote};
use super::types::{Applied, BrokerId, EntryData, KafkaBatch, PartitionLogId, PartitionRaft};
use crate::Term;

type C<Rt> = PartitionRaft<Rt>;
type Entry<Rt> = <C<Rt> as openraft::RaftTypeConfig>::Entry;
type VoteT<Rt> = <C<Rt> as openraft::RaftTypeConfig>::Vote;
type Stored = StoredMembership<Clid, BrokerId, ()>;
type Meta = SnapshotMeta<Clid, BrokerId, ()>;
type Snap = Snapshot<Clid, BrokerId, (), PartitionSnapshot>;
type Clid = openraft::vote::leader_id_std::CommittedLeaderId<u64>;

fn log_id(term: Term, index: u64) -> PartitionLogId {
    PartitionLogId::new_term_index(term.0, index)
}

fn term_of(id: &PartitionLogId) -> Term {
    Term(id.leader_id.term)
}

/// The snapshot value: where the log ends at the snapshot, and the batches and side records a
/// follower lacks.
#[derive(Debug, Clone, Default)]
pub struct PartitionSnapshot {
    /// The Kafka offset after the snapshot's last entry.
    pub next_offset: Offset,
    /// Batches from the leader's log start up to `next_offset`; empty where the snapshot was
    /// only built (its metadata), filled when it is sent.
    pub batches: Vec<StoredBatch>,
    /// The side records the leader keeps, up to the snapshot's last entry; filled when sent.
    pub side: Vec<StoredSide>,
}

/// What a group does with its committed batches besides moving the high watermark: the
/// controller quorum's metadata log builds the cluster state from them. A data partition has
/// none (its side records, if any, are read back by their writer, not applied).
pub trait Applier: 'static {
    /// A committed batch, given once per life of the replica, in offset order, starting from
    /// the log's start when the replica opens. `batch` is as produced: read its records, not its
    /// `baseOffset`. An error means the committed log cannot be applied (a corrupt or foreign
    /// batch): the replica stops, as on a storage error.
    fn apply(&self, base_offset: Offset, batch: &Bytes) -> Result<(), String>;
}

struct Replica<L> {
    log: L,
    map: EntryMap,
    applier: Option<Rc<dyn Applier>>,
    applied: Option<PartitionLogId>,
    membership: Stored,
    high_watermark: Offset,
    snapshot: Option<(Meta, Offset)>,
    on_flushed: Option<FlushedBatches>,
    on_high_watermark: Option<HighWatermarkMoved>,
    /// The vote is the one recovered at open, not saved since: read as not committed (see
    /// [`ReplicaStore::read_vote`]).
    vote_recovered: bool,
    /// The highest keep-from index of the side records applied: side records before it go once
    /// Raft has purged their entries too (a restart places the entries above the purge point
    /// by what is recorded beside the log, so those records stay until then).
    side_keep_from: u64,
}

/// Told of the batches of each append once they are durable in the local log, with the base
/// offset each was stored at: a leader answers acks=1 writes with it (the batch is the very
/// `Bytes` it proposed).
pub type FlushedBatches = Rc<dyn Fn(&[(Bytes, Offset)])>;

/// Told of the high watermark when applying moves it (committed batches applied, a snapshot
/// installed), before the writers of the applied batches are answered: what consumers are
/// shown follows the commit without waiting for openraft's metrics.
pub type HighWatermarkMoved = Rc<dyn Fn(Offset)>;

/// One partition replica's storage: a cheap handle, cloned into openraft's storage roles.
pub struct ReplicaStore<Rt, L> {
    inner: Rc<RefCell<Replica<L>>>,
    _rt: PhantomData<fn() -> Rt>,
}

impl<Rt, L> Clone for ReplicaStore<Rt, L> {
    fn clone(&self) -> Self {
        ReplicaStore {
            inner: Rc::clone(&self.inner),
            _rt: PhantomData,
        }
    }
}

fn bad_data(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

impl<Rt: AsyncRuntime, L: ReplicaLog> ReplicaStore<Rt, L> {
    /// Opens a replica over `log`, rebuilding the entry map from what the log holds.
    ///
    /// The state machine starts at the purge point (everything at or below it was applied
    /// before); openraft re-applies committed entries above it, which only moves the high
    /// watermark again.
    pub async fn open(log: L) -> io::Result<Self> {
        Self::open_with(log, None).await
    }

    /// [`ReplicaStore::open`] for a group whose committed batches go to `applier` as well; it
    /// is given every batch below the high watermark first.
    pub async fn open_with(log: L, applier: Option<Rc<dyn Applier>>) -> io::Result<Self> {
        let mut rec = log.recover().await?;
        if let Some(from) = rec.installing_from {
            // A crash while the leader's log was being written: drop what was written of it.
            tracing::info!(
                offset = from.0,
                "an interrupted install of the leader's log is rolled back"
            );
            // Internal entries above the replica's own applied entries were dropped when the
            // install began; those left are its own. Side records the install wrote are the
            // leader's committed ones: those the rebuild can place after the replica's own
            // entries stay, the rest are forgotten below.
            let keep_beside = rec
                .internal
                .last()
                .map(|(i, _)| *i)
                .max(rec.side.last().map(|(i, _)| *i));
            log.truncate(from, keep_beside).await?;
            rec = log.recover().await?;
            rec.installing_from = None;
        }
        let mut beside: Vec<(u64, Term, Beside)> = rec
            .internal
            .iter()
            .map(|(i, t)| (*i, *t, Beside::Internal))
            .chain(rec.side.iter().map(|(i, t)| (*i, *t, Beside::Side)))
            .collect();
        beside.sort_unstable_by_key(|(i, _, _)| *i);
        let (map, dropped) =
            EntryMap::rebuild(rec.purged, rec.start_offset, beside, rec.batches).map_err(bad_data)?;
        if !dropped.is_empty() {
            tracing::info!(
                ?dropped,
                "entries recorded beside the log past the recovered log's end forgotten"
            );
            log.forget_beside(&dropped).await?;
        }
        // The state machine starts from the last snapshot; openraft re-applies what the log
        // holds above it (which only moves the high watermark again).
        let (applied, membership, high_watermark, snapshot) = match rec.snapshot {
            Some(s) => {
                if map.purged().is_some_and(|p| p.index > s.last.index) {
                    return Err(bad_data("the log was purged beyond its last snapshot"));
                }
                let meta = Meta {
                    last_log_id: Some(log_id(s.last.term, s.last.index)),
                    last_membership: s.membership.clone(),
                };
                (
                    Some(log_id(s.last.term, s.last.index)),
                    s.membership,
                    s.last.next_offset,
                    Some((meta, s.last.next_offset)),
                )
            }
            None => {
                if map.purged().is_some() {
                    return Err(bad_data("the log was purged without a snapshot"));
                }
                (None, Stored::default(), rec.start_offset, None)
            }
        };
        if let Some(applier) = &applier {
            for b in log.read_batches(Offset::ZERO, high_watermark).await? {
                applier.apply(b.base_offset, &b.bytes).map_err(bad_data)?;
            }
        }
        Ok(ReplicaStore {
            inner: Rc::new(RefCell::new(Replica {
                log,
                map,
                applier,
                applied,
                membership,
                high_watermark,
                snapshot,
                on_flushed: None,
                on_high_watermark: None,
                vote_recovered: true,
                side_keep_from: 0,
            })),
            _rt: PhantomData,
        })
    }

    /// Sets what is told of batches once appended durably ([`FlushedBatches`]).
    pub fn set_on_flushed(&self, f: FlushedBatches) {
        self.inner.borrow_mut().on_flushed = Some(f);
    }

    /// Sets what is told of the high watermark when it moves ([`HighWatermarkMoved`]).
    pub fn set_on_high_watermark(&self, f: HighWatermarkMoved) {
        self.inner.borrow_mut().on_high_watermark = Some(f);
    }

    /// Tells the high watermark to whoever follows it.
    fn tell_high_watermark(&self) {
        let (f, hw) = {
            let inner = self.inner.borrow();
            (inner.on_high_watermark.clone(), inner.high_watermark)
        };
        if let Some(f) = f {
            f(hw);
        }
    }

    /// The Kafka offset after the last applied batch: what consumers may read up to.
    pub fn high_watermark(&self) -> Offset {
        self.inner.borrow().high_watermark
    }

    /// The Kafka offset after the last entry in the log (applied or not).
    pub fn log_end_offset(&self) -> Offset {
        self.inner.borrow().map.next_offset()
    }

    /// The Kafka offset after Raft entry `index`, if this replica still maps it (not purged
    /// below its last purge point).
    pub fn offset_after(&self, index: u64) -> Option<Offset> {
        self.inner.borrow().map.offset_after(index)
    }

    /// The Raft index and Kafka offset map of this replica, for checks.
    pub fn entry_map(&self) -> EntryMap {
        self.inner.borrow().map.clone()
    }

    /// Runs `f` on the log underneath.
    pub fn with_log<R>(&self, f: impl FnOnce(&L) -> R) -> R {
        f(&self.inner.borrow().log)
    }

    /// Trims the side records that were let go and whose entries Raft purged.
    async fn trim_side(&self) -> io::Result<()> {
        let trim = {
            let inner = self.inner.borrow();
            let purged_below = inner.map.purged().map_or(0, |p| p.index + 1);
            let keep_from = inner.side_keep_from.min(purged_below);
            (keep_from > 0).then(|| inner.log.trim_side(keep_from))
        };
        match trim {
            Some(trim) => trim.await,
            None => Ok(()),
        }
    }

    async fn read_entries(&self, start: u64, end: u64) -> io::Result<Vec<Entry<Rt>>> {
        // The slots first, then the range's batches in one read: the log's reads fill chunks
        // with consecutive batches, where one read per batch would read (and hold) a chunk
        // for each.
        let (slots, internals, read, read_side) = {
            let inner = self.inner.borrow();
            let start = start.max(inner.map.first_index());
            let mut slots = Vec::new();
            let mut internals = Vec::new();
            let mut data: Option<(Offset, Offset)> = None;
            let mut side: Option<(u64, u64)> = None;
            for index in start..end {
                let Some(slot) = inner.map.get(index) else { break };
                match slot {
                    Slot::Data {
                        base_offset,
                        offset_count,
                        ..
                    } => {
                        let next = Offset(base_offset.0 + i64::from(offset_count));
                        data = Some(data.map_or((base_offset, next), |(first, _)| (first, next)));
                    }
                    Slot::Internal { .. } => internals.push(inner.log.internal_entry(index)),
                    Slot::Side { .. } => {
                        side = Some(side.map_or((index, index + 1), |(first, _)| (first, index + 1)))
                    }
                }
                slots.push((index, slot));
            }
            let read = data.map(|(first, next)| inner.log.read_batches(first, next));
            let read_side = side.map(|(first, end)| inner.log.side_records(first, end));
            (slots, internals, read, read_side)
        };
        let mut batches = match read {
            Some(read) => read.await?.into_iter(),
            None => Vec::new().into_iter(),
        };
        let mut sides = match read_side {
            Some(read) => read.await?.into_iter(),
            None => Vec::new().into_iter(),
        };
        let mut internals = internals.into_iter();
        let mut out = Vec::with_capacity(slots.len());
        for (index, slot) in slots {
            let id = log_id(slot.term(), index);
            let payload = match slot {
                Slot::Data { base_offset, .. } => match batches.find(|b| b.base_offset >= base_offset) {
                    Some(b) if b.base_offset == base_offset => {
                        EntryPayload::Normal(EntryData::Batch(KafkaBatch(b.bytes)))
                    }
                    _ => {
                        return Err(io::Error::new(
                            io::ErrorKind::NotFound,
                            format!("no batch at offset {} for entry {index}", base_offset.0),
                        ))
                    }
                },
                Slot::Internal { .. } => match internals.next().flatten() {
                    Some(InternalEntry {
                        membership: Some(m), ..
                    }) => EntryPayload::Membership(m),
                    Some(InternalEntry { membership: None, .. }) => EntryPayload::Blank,
                    None => return Err(bad_data(format!("internal entry {index} missing beside the log"))),
                },
                Slot::Side { .. } => match sides.find(|s| s.index >= index) {
                    Some(s) if s.index == index => EntryPayload::Normal(EntryData::Side(s.record)),
                    _ => return Err(bad_data(format!("side record {index} missing beside the log"))),
                },
            };
            out.push(openraft::Entry { log_id: id, payload });
        }
        Ok(out)
    }
}

fn range_bounds(range: &impl RangeBounds<u64>) -> (u64, u64) {
    let start = match range.start_bound() {
        Bound::Included(&s) => s,
        Bound::Excluded(&s) => s + 1,
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => e + 1,
        Bound::Excluded(&e) => e,
        Bound::Unbounded => u64::MAX,
    };
    (start, end)
}

impl<Rt: AsyncRuntime, L: ReplicaLog> RaftLogReader<C<Rt>> for ReplicaStore<Rt, L> {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<Rt>>, io::Error> {
        let (start, end) = range_bounds(&range);
        self.read_entries(start, end).await
    }

    /// The stored vote; the one recovered at open reads as not committed until a vote is
    /// saved. openraft reads the vote at start-up, and a replica that starts with a committed
    /// vote of its own resumes leading in that term at once. After a restart of one node that
    /// term is usually over (the others elected while it was down), and thousands of groups
    /// resuming their old leadership at once flood the others with heartbeats they must
    /// refuse, in the middle of their own elections. A restarted replica wins its leadership
    /// back by an election instead (Raft keeps only the term and the vote across restarts; the
    /// `committed` flag is openraft's knowledge that a quorum granted it). Resuming is not only
    /// slow at scale but unsafe here: a leader replicates entries it has staged but not yet
    /// flushed, so after a crash its log can end before entries its followers hold, and in the
    /// same term its new entries would take those entries' log ids (term, leader, index), which
    /// the followers would take for the ones they have.
    async fn read_vote(&mut self) -> Result<Option<VoteT<Rt>>, io::Error> {
        let inner = self.inner.borrow();
        Ok(inner.log.vote().map(|v| {
            if v.committed && !inner.vote_recovered {
                VoteT::<Rt>::new_committed(v.term.0, v.node)
            } else {
                VoteT::<Rt>::new(v.term.0, v.node)
            }
        }))
    }
}

impl<Rt: AsyncRuntime, L: ReplicaLog> RaftLogStorage<C<Rt>> for ReplicaStore<Rt, L> {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<C<Rt>>, io::Error> {
        let inner = self.inner.borrow();
        Ok(LogState {
            last_purged_log_id: inner.map.purged().map(|p| log_id(p.term, p.index)),
            last_log_id: inner.map.last().map(|(t, i)| log_id(t, i)),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &VoteT<Rt>) -> Result<(), io::Error> {
        let stored = StoredVote {
            term: Term(vote.leader_id.term),
            node: vote.leader_id.voted_for,
            committed: vote.committed,
        };
        let fut = {
            let mut inner = self.inner.borrow_mut();
            inner.vote_recovered = false;
            inner.log.save_vote(stored)
        };
        fut.await
    }

    async fn append<I>(&mut self, entries: I, callback: IOFlushed<C<Rt>>) -> Result<(), io::Error>
    where
        I: IntoIterator<Item = Entry<Rt>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut appended = Vec::new();
        // A side record staged and not yet flushed: a batch after it waits for the flush (see
        // `ReplicaLog::append_side`).
        let mut side_staged = false;
        for entry in entries {
            let index = entry.log_id.index;
            let term = term_of(&entry.log_id);
            let membership = match entry.payload {
                EntryPayload::Normal(EntryData::Side(record)) => {
                    let staged = {
                        let mut inner = self.inner.borrow_mut();
                        inner.map.push_side(index, term);
                        inner.log.append_side(StoredSide { index, term, record })
                    };
                    staged.await?;
                    side_staged = true;
                    continue;
                }
                EntryPayload::Normal(EntryData::Batch(KafkaBatch(bytes))) => {
                    if std::mem::take(&mut side_staged) {
                        let flush = self.inner.borrow().log.flush();
                        flush.await?;
                    }
                    let header = BatchHeader::parse(&bytes).map_err(|e| bad_data(format!("{e:?}")))?;
                    let count = u32::try_from(header.offset_count())
                        .ok()
                        .filter(|c| *c > 0)
                        .ok_or_else(|| bad_data("a batch must take at least one offset"))?;
                    let mut inner = self.inner.borrow_mut();
                    let base = inner.map.push_data(index, term, count);
                    inner.log.append_batch(base, term, &bytes)?;
                    if inner.on_flushed.is_some() {
                        appended.push((bytes, base));
                    }
                    continue;
                }
                EntryPayload::Blank => None,
                EntryPayload::Membership(m) => Some(m),
            };
            let durable = {
                let mut inner = self.inner.borrow_mut();
                inner.map.push_internal(index, term);
                inner.log.append_internal(InternalEntry {
                    index,
                    term,
                    membership,
                })
            };
            durable.await?;
        }
        let flush = self.inner.borrow().log.flush();
        let result = flush.await;
        let report = match &result {
            Ok(()) => Ok(()),
            Err(e) => Err(io::Error::new(e.kind(), e.to_string())),
        };
        if result.is_ok() && !appended.is_empty() {
            let on_flushed = self.inner.borrow().on_flushed.clone();
            if let Some(f) = on_flushed {
                f(&appended);
            }
        }
        callback.io_completed(report);
        result
    }

    async fn truncate_after(&mut self, last_log_id: Option<PartitionLogId>) -> Result<(), io::Error> {
        let fut = {
            let mut inner = self.inner.borrow_mut();
            let index = last_log_id.map(|l| l.index);
            let offset = inner.map.truncate_after(index);
            inner.log.truncate(offset, index)
        };
        fut.await
    }

    async fn purge(&mut self, upto: PartitionLogId) -> Result<(), io::Error> {
        let saved = {
            let mut inner = self.inner.borrow_mut();
            inner.map.purge(upto.index, term_of(&upto));
            inner.map.purged().map(|p| inner.log.save_purge_point(p))
        };
        if let Some(saved) = saved {
            saved.await?;
        }
        self.trim_side().await
    }
}

impl<Rt: AsyncRuntime, L: ReplicaLog> RaftSnapshotBuilder<C<Rt>> for ReplicaStore<Rt, L> {
    type SnapshotData = PartitionSnapshot;

    async fn build_snapshot(&mut self) -> Result<Snap, io::Error> {
        let (meta, next_offset, saved) = {
            let inner = self.inner.borrow();
            let meta = Meta {
                last_log_id: inner.applied,
                last_membership: inner.membership.clone(),
            };
            let next_offset = inner.high_watermark;
            let saved = inner.applied.map(|last| {
                inner.log.save_snapshot(SnapshotRecord {
                    last: PurgePoint {
                        term: term_of(&last),
                        index: last.index,
                        next_offset,
                    },
                    membership: inner.membership.clone(),
                })
            });
            (meta, next_offset, saved)
        };
        if let Some(saved) = saved {
            saved.await?;
        }
        self.inner.borrow_mut().snapshot = Some((meta.clone(), next_offset));
        Ok(Snapshot {
            meta,
            snapshot: PartitionSnapshot {
                next_offset,
                batches: Vec::new(),
                side: Vec::new(),
            },
        })
    }
}

impl<Rt: AsyncRuntime, L: ReplicaLog> RaftStateMachine<C<Rt>> for ReplicaStore<Rt, L> {
    type SnapshotData = PartitionSnapshot;
    type SnapshotBuilder = Self;

    async fn applied_state(&mut self) -> Result<(Option<PartitionLogId>, Stored), io::Error> {
        let inner = self.inner.borrow();
        Ok((inner.applied, inner.membership.clone()))
    }

    async fn apply<Strm>(&mut self, mut entries: Strm) -> Result<(), io::Error>
    where
        Strm: Stream<Item = Result<EntryResponder<C<Rt>>, io::Error>> + Unpin + OptionalSend,
    {
        // The high watermark moved by entries applied but not yet told.
        let mut untold = false;
        while let Some((entry, responder)) = entries.try_next().await? {
            let answer = {
                let mut inner = self.inner.borrow_mut();
                let index = entry.log_id.index;
                inner.applied = Some(entry.log_id);
                match entry.payload {
                    EntryPayload::Normal(EntryData::Side(record)) => {
                        if record.keep_from <= index {
                            inner.side_keep_from = inner.side_keep_from.max(record.keep_from);
                        }
                        Applied::Side { index }
                    }
                    EntryPayload::Normal(EntryData::Batch(KafkaBatch(bytes))) => match inner.map.get(index) {
                        Some(Slot::Data {
                            base_offset,
                            offset_count,
                            ..
                        }) => {
                            let next = base_offset.plus(i64::from(offset_count));
                            assert!(next >= inner.high_watermark, "the high watermark never goes back");
                            inner.high_watermark = next;
                            untold = true;
                            if let Some(applier) = &inner.applier {
                                applier.apply(base_offset, &bytes).map_err(bad_data)?;
                            }
                            Applied::Batch { base_offset }
                        }
                        other => {
                            return Err(bad_data(format!(
                                "applying entry {index}: the map holds {other:?}"
                            )))
                        }
                    },
                    EntryPayload::Blank => Applied::Internal,
                    EntryPayload::Membership(m) => {
                        inner.membership = Stored::new(Some(entry.log_id), m);
                        Applied::Internal
                    }
                }
            };
            if let Some(responder) = responder {
                if std::mem::take(&mut untold) {
                    self.tell_high_watermark();
                }
                responder.send(answer);
            }
        }
        if untold {
            self.tell_high_watermark();
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn install_snapshot(&mut self, meta: &Meta, snapshot: PartitionSnapshot) -> Result<(), io::Error> {
        let Some(last) = meta.last_log_id else {
            return Err(bad_data("a snapshot without a last log id"));
        };
        let point = PurgePoint {
            term: term_of(&last),
            index: last.index,
            next_offset: snapshot.next_offset,
        };
        let record = SnapshotRecord {
            last: point,
            membership: meta.last_membership.clone(),
        };
        let have_it = {
            let inner = self.inner.borrow();
            inner.map.get(last.index).is_some_and(|s| s.term() == point.term)
                || inner.map.purged().is_some_and(|p| p.index >= last.index)
        };
        if have_it {
            // Log matching: every entry up to the snapshot's is the leader's already.
            let saved = self.inner.borrow().log.save_snapshot(record);
            saved.await?;
        } else {
            // Behind the leader. Only the applied entries are known to be the leader's (they are
            // committed); what follows may be a deposed leader's and is replaced by the leader's
            // log from the high watermark on. openraft truncates only a conflict at the
            // snapshot's own index, so this replica does the rest.
            let (begin, from) = {
                let inner = self.inner.borrow();
                (
                    inner.log.begin_install(inner.high_watermark),
                    inner.high_watermark,
                )
            };
            begin.await?;
            let truncate = {
                let mut inner = self.inner.borrow_mut();
                let applied = inner.applied.map(|l| l.index);
                let offset = inner.map.truncate_after(applied);
                assert_eq!(
                    offset, from,
                    "the high watermark is where the applied entries end"
                );
                inner.log.truncate(offset, applied)
            };
            truncate.await?;
            for b in snapshot
                .batches
                .iter()
                .filter(|b| b.base_offset >= from && b.base_offset < point.next_offset)
            {
                let inner = self.inner.borrow();
                inner.log.append_batch(b.base_offset, b.term, &b.bytes)?;
            }
            let applied = self.inner.borrow().applied.map_or(0, |l| l.index + 1);
            // The leader keeps no side record before its first one (its writer let them go): nor
            // does this replica, once the install is done.
            if let Some(first) = snapshot.side.first().map(|s| s.index) {
                let mut inner = self.inner.borrow_mut();
                inner.side_keep_from = inner.side_keep_from.max(first);
            }
            for s in snapshot
                .side
                .into_iter()
                .filter(|s| s.index >= applied && s.index <= point.index)
            {
                let append = self.inner.borrow().log.append_side(s);
                append.await?;
            }
            let flush = self.inner.borrow().log.flush();
            flush.await?;
            let finish = {
                let mut inner = self.inner.borrow_mut();
                inner.map.reset_to(point);
                inner.log.finish_install(record)
            };
            finish.await?;
        }
        // The applier gets what the snapshot covers beyond what it was given.
        let (applier, old_high_watermark) = {
            let inner = self.inner.borrow();
            (inner.applier.clone(), inner.high_watermark)
        };
        if let Some(applier) = applier {
            let read = self
                .inner
                .borrow()
                .log
                .read_batches(old_high_watermark, point.next_offset);
            for b in read.await? {
                applier.apply(b.base_offset, &b.bytes).map_err(bad_data)?;
            }
        }
        {
            let mut inner = self.inner.borrow_mut();
            inner.applied = Some(last);
            inner.membership = meta.last_membership.clone();
            inner.high_watermark = inner.high_watermark.max(point.next_offset);
            inner.snapshot = Some((meta.clone(), point.next_offset));
        }
        self.tell_high_watermark();
        self.trim_side().await
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snap>, io::Error> {
        let (meta, next_offset, read, read_side) = {
            let inner = self.inner.borrow();
            let Some((meta, next_offset)) = inner.snapshot.clone() else {
                return Ok(None);
            };
            let read = inner.log.read_batches(Offset::ZERO, next_offset);
            let end = meta.last_log_id.map_or(0, |l| l.index + 1);
            let read_side = inner.log.side_records(0, end);
            (meta, next_offset, read, read_side)
        };
        let batches = read.await?;
        let side = read_side.await?;
        Ok(Some(Snapshot {
            meta,
            snapshot: PartitionSnapshot {
                next_offset,
                batches,
                side,
            },
        }))
    }
}

#[cfg(test)]
mod tests {
    use openraft::testing::log::{StoreBuilder, Suite};
    use openraft::StorageError;

    use super::*;
    use crate::partition::MemReplicaLog;
    use crate::rt::{Sim, SimRuntime};

    struct Builder;

    impl
        StoreBuilder<
            C<SimRuntime>,
            ReplicaStore<SimRuntime, MemReplicaLog>,
            ReplicaStore<SimRuntime, MemReplicaLog>,
        > for Builder
    {
        async fn build(
            &self,
        ) -> Result<
            (
                (),
                ReplicaStore<SimRuntime, MemReplicaLog>,
                ReplicaStore<SimRuntime, MemReplicaLog>,
            ),
            StorageError<C<SimRuntime>>,
        > {
            let store = ReplicaStore::open(MemReplicaLog::new(Offset(0)))
                .await
                .map_err(|e| {
                    StorageError::read(
                        <C<SimRuntime> as openraft::type_config::TypeConfigExt>::err_from_error(&e),
                    )
                })?;
            Ok(((), store.clone(), store))
        }
    }

    /// Two batches, of three records and of one.
    fn three_and_one() -> (Bytes, Bytes) {
        use strand_protocol::batch::build::{batch, TestRecord};
        let three = [
            TestRecord::default(),
            TestRecord::default(),
            TestRecord::default(),
        ];
        (
            Bytes::from(batch(&three, 0)),
            Bytes::from(batch(&[TestRecord::default()], 0)),
        )
    }

    /// An entry of term 1 carrying `b`.
    fn entry(index: u64, b: &Bytes) -> Entry<SimRuntime> {
        Entry::<SimRuntime> {
            log_id: log_id(Term(1), index),
            payload: EntryPayload::Normal(EntryData::Batch(KafkaBatch(b.clone()))),
        }
    }

    /// A blank entry of term 1.
    fn blank(index: u64) -> Entry<SimRuntime> {
        Entry::<SimRuntime> {
            log_id: log_id(Term(1), index),
            payload: EntryPayload::Blank,
        }
    }

    /// The flushed-append observer hears of each appended batch, with the offset it took,
    /// once the log's flush returned, as the very bytes that were appended.
    #[test]
    fn appended_batches_are_reported_once_flushed_with_their_offsets() {
        let sim = Sim::new(1);
        sim.block_on(async {
            let mut store = ReplicaStore::<SimRuntime, _>::open(MemReplicaLog::new(Offset(0)))
                .await
                .unwrap();
            let seen: Rc<RefCell<Vec<(usize, Offset)>>> = Rc::default();
            let s2 = Rc::clone(&seen);
            store.set_on_flushed(Rc::new(move |bs: &[(Bytes, Offset)]| {
                s2.borrow_mut()
                    .extend(bs.iter().map(|(b, o)| (b.as_ptr() as usize, *o)));
            }));
            let (three, one) = three_and_one();
            store
                .append(
                    vec![blank(1), entry(2, &three), entry(3, &one)],
                    IOFlushed::noop(),
                )
                .await
                .unwrap();
            assert_eq!(
                *seen.borrow(),
                vec![
                    (three.as_ptr() as usize, Offset(0)),
                    (one.as_ptr() as usize, Offset(3))
                ]
            );
        });
    }

    /// Applying committed batches tells the high watermark once per apply, after the batches
    /// it applied; an apply of internal entries only tells nothing.
    #[test]
    fn applying_tells_the_high_watermark() {
        let sim = Sim::new(1);
        sim.block_on(async {
            let mut store = ReplicaStore::<SimRuntime, _>::open(MemReplicaLog::new(Offset(0)))
                .await
                .unwrap();
            let told: Rc<RefCell<Vec<Offset>>> = Rc::default();
            let t2 = Rc::clone(&told);
            store.set_on_high_watermark(Rc::new(move |hw| t2.borrow_mut().push(hw)));
            let (three, one) = three_and_one();
            let entries = vec![blank(1), entry(2, &three), entry(3, &one), blank(4)];
            store.append(entries.clone(), IOFlushed::noop()).await.unwrap();
            let stream = |es: Vec<Entry<SimRuntime>>| {
                futures::stream::iter(es.into_iter().map(|e| Ok::<_, io::Error>((e, None))))
            };
            store.apply(stream(entries[..1].to_vec())).await.unwrap();
            assert!(told.borrow().is_empty());
            store.apply(stream(entries[1..].to_vec())).await.unwrap();
            assert_eq!(*told.borrow(), vec![Offset(4)]);
            assert_eq!(store.high_watermark(), Offset(4));
        });
    }

    /// A replica that reopens does not resume leading from its stored vote: the vote it
    /// recovered reads as not committed until it saves one.
    #[test]
    fn a_reopened_replica_reads_its_committed_vote_as_not_committed() {
        let sim = Sim::new(1);
        sim.block_on(async {
            let log = MemReplicaLog::new(Offset(0));
            let mut store = ReplicaStore::<SimRuntime, _>::open(log.clone()).await.unwrap();
            let committed = VoteT::<SimRuntime>::new_committed(3, BrokerId(1));
            store.save_vote(&committed).await.unwrap();
            assert_eq!(store.read_vote().await.unwrap(), Some(committed));
            drop(store);
            let mut reopened = ReplicaStore::<SimRuntime, _>::open(log).await.unwrap();
            assert_eq!(
                reopened.read_vote().await.unwrap(),
                Some(VoteT::<SimRuntime>::new(3, BrokerId(1)))
            );
            reopened.save_vote(&committed).await.unwrap();
            assert_eq!(reopened.read_vote().await.unwrap(), Some(committed));
        });
    }

    /// openraft's own storage conformance suite (votes, log states, membership from log and
    /// state machine, truncation, purging, reads), on internal entries: it cannot build
    /// application data, which the replication simulation covers.
    #[test]
    fn passes_openraft_storage_suite() {
        let sim = Sim::new(1);
        sim.block_on(async { Suite::test_all(Builder).await })
            .expect("the storage suite passes");
    }
}
