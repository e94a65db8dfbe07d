//! [`ReplicaLog`] over a partition log of a shard's store: the batches are the segment log's
//! own (stored once, served to consumers as they are), made durable by the shard's group
//! commit; the Raft state beside them is one [`SideState`] file in the log's directory.
//!
//! - **Appends** go through `ShardStore::append_replica` at the base offset the entry map
//!   gives (the leader's own proposals too: their producer checks happen before they are
//!   proposed), so the shard's flush rounds make them durable with everything else.
//! - **The unflushed tail** is kept in memory until its round is durable: openraft may send a
//!   leader's entries to followers before they are durable locally, and the store serves only
//!   durable data.
//! - **Flushes** wait for the last append's round. A truncation first waits for every
//!   pending append, so no flush waits across one (a truncation moves the store's durable end
//!   down, which a flush waiting on it would never see pass again).
//! - **Truncations** cut the log first and the side file second: a crash between them leaves
//!   internal entries beyond the cut, which a restart either drops (beyond the log's end) or
//!   keeps as entries this replica never acknowledged the loss of — as if the truncation had
//!   not happened, which Raft tolerates because nothing depending on it was answered.
//! - **Side-file writes** are serialised, and each writes the state as it is when it runs, so
//!   the last one written holds every change made before it. Each is appended to the side
//!   file's journal (`ShardStore::append_file`), or replaces the file with one frame
//!   (`ShardStore::replace_file`) when the journal is full, its length is not known (the
//!   first write after opening a file with a torn frame, or after a write that failed or was
//!   dropped) or the file does not exist yet. Both are group-committed, so the side files of
//!   many replicas become durable with one file-system sync.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::path::PathBuf;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use bytes::{Bytes, BytesMut};
use futures::lock::Mutex;
use strand_protocol::batch::{patch_batch, BatchHeader, BatchScanner};
use strand_protocol::types::Offset;
use strand_storage::fs::Fs;
use strand_storage::store::{AppendTicket, LogId, ShardStore};
use strand_storage::StorageError;

use super::entry_map::PurgePoint;
use super::replica_log::{
    InternalEntry, LogFuture, Recovered, ReplicaLog, SnapshotRecord, StoredBatch, StoredSide, StoredVote,
};
use super::side_log::{SideLog, SideLogSpec};
use super::side_state::{SideState, SIDE_JOURNAL_BYTES};
use crate::Term;

/// The name of the side file in a partition's directory.
pub const SIDE_STATE_FILE: &str = "raft-state";
/// How much one read asks for; a larger batch still comes whole (KIP-74).
const READ_CHUNK_BYTES: usize = 1 << 20;

fn io_err(e: StorageError) -> io::Error {
    io::Error::other(e.to_string())
}

/// A wake-everyone event with a generation, runtime-independent.
#[derive(Default)]
struct Event {
    generation: Cell<u64>,
    wakers: RefCell<Vec<Waker>>,
}

impl Event {
    fn fire(&self) {
        self.generation.set(self.generation.get() + 1);
        for w in std::mem::take(&mut *self.wakers.borrow_mut()) {
            w.wake();
        }
    }
}

struct EventWait {
    event: Rc<Shared>,
    seen: u64,
}

impl Future for EventWait {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.event.durable_event.generation.get() != self.seen {
            return Poll::Ready(());
        }
        self.event
            .durable_event
            .wakers
            .borrow_mut()
            .push(cx.waker().clone());
        Poll::Pending
    }
}

struct Pending {
    seq: u64,
    ticket: AppendTicket,
    /// A batch (kept readable until durable), or a side record (its index).
    item: Result<StoredBatch, u64>,
}

struct Shared {
    /// Appends made so far, and the highest of them known durable.
    appended_seq: Cell<u64>,
    durable_seq: Cell<u64>,
    durable_event: Event,
    pending: RefCell<VecDeque<Pending>>,
    side: RefCell<SideState>,
    /// The side file's length when it is known to end with a whole frame (appendable).
    side_len: Cell<Option<u64>>,
    side_writes: Mutex<()>,
    /// The highest side record index known durable.
    side_durable: Cell<u64>,
}

/// A partition's Raft log on a shard store (see the module documentation).
pub struct ShardReplicaLog<F: Fs> {
    store: Rc<ShardStore<F>>,
    id: LogId,
    side_path: PathBuf,
    now_ms: Rc<dyn Fn() -> i64>,
    shared: Rc<Shared>,
    /// Where side records go, for a replica whose owner keeps any.
    side_log: Option<Rc<SideLog<F>>>,
}

impl<F: Fs> Clone for ShardReplicaLog<F> {
    fn clone(&self) -> Self {
        ShardReplicaLog {
            store: Rc::clone(&self.store),
            id: self.id,
            side_path: self.side_path.clone(),
            now_ms: Rc::clone(&self.now_ms),
            shared: Rc::clone(&self.shared),
            side_log: self.side_log.clone(),
        }
    }
}

impl<F: Fs> ShardReplicaLog<F> {
    /// The replica log of the open log `id`, whose directory is `dir`; reads its side file.
    pub async fn open(
        store: Rc<ShardStore<F>>,
        id: LogId,
        dir: PathBuf,
        now_ms: Rc<dyn Fn() -> i64>,
    ) -> io::Result<Self> {
        let side_path = dir.join(SIDE_STATE_FILE);
        let (side, side_len) = if store.fs().exists(&side_path).await {
            let bytes = store.fs().read_file(&side_path).await?;
            let journal = SideState::decode_journal(&bytes).map_err(|e| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{}: {e}", side_path.display()),
                )
            })?;
            let whole = journal.valid_bytes == bytes.len() as u64;
            (journal.state, whole.then_some(journal.valid_bytes))
        } else {
            (SideState::default(), None)
        };
        Ok(ShardReplicaLog {
            store,
            id,
            side_path,
            now_ms,
            shared: Rc::new(Shared {
                appended_seq: Cell::new(0),
                durable_seq: Cell::new(0),
                durable_event: Event::default(),
                pending: RefCell::new(VecDeque::new()),
                side: RefCell::new(side),
                side_len: Cell::new(side_len),
                side_writes: Mutex::new(()),
                side_durable: Cell::new(0),
            }),
            side_log: None,
        })
    }

    /// Keeps this replica's side records in the side log `spec` (see [`super::side_log`]);
    /// without one, a side record is refused.
    pub fn with_side_log(mut self, spec: SideLogSpec) -> Self {
        self.side_log = Some(Rc::new(SideLog::new(Rc::clone(&self.store), spec)));
        self
    }

    /// Removes the side log (the partition is deleted); the replica is stopped.
    pub async fn remove_side_log(&self) -> io::Result<()> {
        let Some(side) = &self.side_log else { return Ok(()) };
        match side.open(false, (self.now_ms)()).await? {
            Some(id) => self.store.remove_log(id).await.map_err(io_err),
            None => Ok(()),
        }
    }

    /// The highest side record index known durable (every record recovered at open is).
    pub fn side_durable_index(&self) -> u64 {
        let recovered = self.side_log.as_ref().map_or(0, |l| l.recovered());
        self.shared.side_durable.get().max(recovered)
    }

    fn side_log(&self) -> io::Result<&Rc<SideLog<F>>> {
        self.side_log
            .as_ref()
            .ok_or_else(|| io::Error::other("this replica keeps no side records"))
    }

    /// Writes the side state as it is when the write runs (see the module documentation).
    fn write_side(&self, change: impl FnOnce(&mut SideState)) -> LogFuture<()> {
        change(&mut self.shared.side.borrow_mut());
        let shared = Rc::clone(&self.shared);
        let store = Rc::clone(&self.store);
        let path = self.side_path.clone();
        Box::pin(async move {
            let _turn = shared.side_writes.lock().await;
            let frame = shared.side.borrow().encode();
            let len = frame.len() as u64;
            // Unknown until this write is done: one that fails or is dropped leaves the file's
            // end uncertain, and the next write replaces it.
            let known = shared.side_len.take();
            let (written, end) = match known {
                Some(at) if at + len <= SIDE_JOURNAL_BYTES => {
                    (store.append_file(&path, at, frame).await, at + len)
                }
                _ => (store.replace_file(&path, frame).await, len),
            };
            if written.is_ok() {
                shared.side_len.set(Some(end));
            }
            written
        })
    }

    /// Waits until every append made so far is durable.
    fn wait_pending(&self) -> LogFuture<()> {
        let target = self.shared.appended_seq.get();
        let last = self.shared.pending.borrow().back().map(|p| (p.seq, p.ticket));
        let shared = Rc::clone(&self.shared);
        let store = Rc::clone(&self.store);
        Box::pin(async move {
            let Some((seq, ticket)) = last else { return Ok(()) };
            loop {
                if shared.durable_seq.get() >= target {
                    return Ok(());
                }
                let woken = EventWait {
                    seen: shared.durable_event.generation.get(),
                    event: Rc::clone(&shared),
                };
                let durable = store.wait_durable(&ticket);
                futures::pin_mut!(durable);
                match futures::future::select(durable, woken).await {
                    futures::future::Either::Left((result, _)) => {
                        result.map_err(io_err)?;
                        mark_durable(&shared, seq);
                        return Ok(());
                    }
                    futures::future::Either::Right(_) => continue,
                }
            }
        })
    }

    async fn read_from_store(&self, from: Offset, to: Offset) -> io::Result<Vec<StoredBatch>> {
        let mut out = Vec::new();
        let start = self.store.offsets(self.id).map_err(io_err)?.log_start_offset;
        let mut at = from.max(Offset(start));
        while at < to {
            let plan = self
                .store
                .plan_replica_read(self.id, at.0, READ_CHUNK_BYTES)
                .map_err(io_err)?;
            let Some(plan) = plan else { break };
            let bytes = plan.execute().await.map_err(io_err)?;
            if bytes.is_empty() {
                break;
            }
            let mut progressed = false;
            for found in BatchScanner::new(&bytes, false) {
                let h = found.header;
                let base = Offset(h.base_offset);
                if h.next_offset() <= at.0 {
                    continue;
                }
                if base >= to {
                    return Ok(out);
                }
                let end = found.position + h.total_bytes();
                let slice = bytes.slice(found.position..end);
                out.push(StoredBatch {
                    base_offset: base,
                    term: Term::from_leader_epoch(strand_protocol::types::LeaderEpoch(
                        h.partition_leader_epoch,
                    ))
                    .unwrap_or(Term(0)),
                    bytes: slice,
                });
                at = Offset(h.next_offset());
                progressed = true;
            }
            if !progressed {
                break;
            }
        }
        Ok(out)
    }
}

fn mark_durable(shared: &Shared, seq: u64) {
    if seq > shared.durable_seq.get() {
        shared.durable_seq.set(seq);
        let mut pending = shared.pending.borrow_mut();
        while pending.front().is_some_and(|p| p.seq <= seq) {
            if let Some(Pending { item: Err(index), .. }) = pending.pop_front() {
                shared.side_durable.set(index);
            }
        }
    }
    shared.durable_event.fire();
}

impl<F: Fs> ReplicaLog for ShardReplicaLog<F> {
    fn append_batch(&self, base_offset: Offset, term: Term, batch: &Bytes) -> io::Result<()> {
        let epoch = term
            .as_leader_epoch()
            .ok_or_else(|| io::Error::other(format!("term {} is beyond Kafka's leader epochs", term.0)))?;
        let ticket = self
            .store
            .append_replica(self.id, batch, base_offset.0, epoch.0, (self.now_ms)())
            .map_err(io_err)?;
        let mut stamped = BytesMut::from(&batch[..]);
        patch_batch(&mut stamped, base_offset.0, epoch.0);
        let seq = self.shared.appended_seq.get() + 1;
        self.shared.appended_seq.set(seq);
        self.shared.pending.borrow_mut().push_back(Pending {
            seq,
            ticket,
            item: Ok(StoredBatch {
                base_offset,
                term,
                bytes: stamped.freeze(),
            }),
        });
        Ok(())
    }

    fn append_internal(&self, entry: InternalEntry) -> LogFuture<()> {
        self.write_side(|s| {
            s.internal.insert(entry.index, entry);
        })
    }

    fn append_side(&self, side: StoredSide) -> LogFuture<()> {
        let me = self.clone();
        Box::pin(async move {
            let log = me.side_log()?;
            log.durable_up_to(me.shared.side_durable.get());
            let index = side.index;
            let ticket = log.append(side, (me.now_ms)()).await?;
            let seq = me.shared.appended_seq.get() + 1;
            me.shared.appended_seq.set(seq);
            me.shared.pending.borrow_mut().push_back(Pending {
                seq,
                ticket,
                item: Err(index),
            });
            Ok(())
        })
    }

    fn side_records(&self, from: u64, to: u64) -> LogFuture<Vec<StoredSide>> {
        let me = self.clone();
        Box::pin(async move {
            match &me.side_log {
                Some(log) => log.records(from, to).await,
                None => Ok(Vec::new()),
            }
        })
    }

    fn trim_side(&self, keep_from: u64) -> LogFuture<()> {
        let me = self.clone();
        Box::pin(async move {
            match &me.side_log {
                Some(log) => log.trim(keep_from).await,
                None => Ok(()),
            }
        })
    }

    fn forget_beside(&self, indexes: &[u64]) -> LogFuture<()> {
        let indexes = indexes.to_vec();
        let me = self.clone();
        Box::pin(async move {
            // Side records past the recovered end are a tail of the side log.
            if let (Some(log), Some(first)) = (&me.side_log, indexes.iter().min()) {
                me.wait_pending().await?;
                log.truncate_from(*first).await?;
            }
            me.write_side(move |s| {
                for i in indexes {
                    s.internal.remove(&i);
                }
            })
            .await
        })
    }

    fn flush(&self) -> LogFuture<()> {
        self.wait_pending()
    }

    fn read_batches(&self, from: Offset, to: Offset) -> LogFuture<Vec<StoredBatch>> {
        let cached: Vec<StoredBatch> = self
            .shared
            .pending
            .borrow()
            .iter()
            .filter_map(|p| p.item.as_ref().ok())
            .filter(|b| b.base_offset >= from && b.base_offset < to)
            .cloned()
            .collect();
        let me = self.clone();
        Box::pin(async move {
            let mut out = me.read_from_store(from, to).await?;
            let durable_end = out.last().map(|b| b.base_offset);
            out.extend(
                cached
                    .into_iter()
                    .filter(|b| durable_end.is_none_or(|d| b.base_offset > d)),
            );
            Ok(out)
        })
    }

    fn internal_entry(&self, index: u64) -> Option<InternalEntry> {
        self.shared.side.borrow().internal.get(&index).cloned()
    }

    fn truncate(&self, offset: Offset, keep_beside: Option<u64>) -> LogFuture<()> {
        let me = self.clone();
        Box::pin(async move {
            me.wait_pending().await?;
            me.store.truncate_log(me.id, offset.0).await.map_err(io_err)?;
            let keep = keep_beside.map_or(0, |k| k.saturating_add(1));
            if let Some(log) = &me.side_log {
                log.truncate_from(keep).await?;
            }
            me.write_side(|s| s.internal.retain(|i, _| *i < keep)).await
        })
    }

    fn save_purge_point(&self, purged: PurgePoint) -> LogFuture<()> {
        self.write_side(|s| {
            s.internal.retain(|i, _| *i > purged.index);
            s.purged = Some(purged);
        })
    }

    fn save_vote(&self, vote: StoredVote) -> LogFuture<()> {
        self.write_side(|s| s.vote = Some(vote))
    }

    fn vote(&self) -> Option<StoredVote> {
        self.shared.side.borrow().vote
    }

    fn save_snapshot(&self, snapshot: SnapshotRecord) -> LogFuture<()> {
        self.write_side(|s| s.snapshot = Some(snapshot))
    }

    fn begin_install(&self, from: Offset) -> LogFuture<()> {
        self.write_side(|s| s.installing_from = Some(from))
    }

    fn finish_install(&self, snapshot: SnapshotRecord) -> LogFuture<()> {
        self.write_side(|s| {
            let point = snapshot.last;
            s.internal.retain(|i, _| *i > point.index);
            s.purged = Some(point);
            s.snapshot = Some(snapshot);
            s.installing_from = None;
        })
    }

    fn recover(&self) -> LogFuture<Recovered> {
        let me = self.clone();
        Box::pin(async move {
            let side = me.shared.side.borrow().clone();
            let offsets = me.store.offsets(me.id).map_err(io_err)?;
            let start_offset = Offset(offsets.log_start_offset);
            let from = side
                .purged
                .map_or(start_offset, |p| p.next_offset.max(start_offset));
            let batches = me
                .read_from_store(from, Offset(offsets.log_end_offset))
                .await?
                .into_iter()
                .map(|b| {
                    let count = BatchHeader::parse(&b.bytes)
                        .map(|h| h.offset_count())
                        .unwrap_or(1);
                    (b.term, b.base_offset, u32::try_from(count).unwrap_or(1))
                })
                .collect();
            let side_records = match &me.side_log {
                Some(log) => {
                    log.open(false, (me.now_ms)()).await?;
                    log.indexes()
                        .into_iter()
                        .filter(|(i, _)| side.purged.is_none_or(|p| *i > p.index))
                        .collect()
                }
                None => Vec::new(),
            };
            Ok(Recovered {
                purged: side.purged,
                start_offset,
                internal: side.internal.values().map(|e| (e.index, e.term)).collect(),
                side: side_records,
                batches,
                vote: side.vote,
                snapshot: side.snapshot,
                installing_from: side.installing_from,
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use futures::executor::block_on;
    use strand_storage::fs::FileHandle;
    use strand_storage::fs_mem::MemFs;
    use strand_storage::log::LogConfig;
    use strand_storage::store::StoreConfig;
    use strand_storage::LogKey;

    use super::*;
    use crate::partition::types::BrokerId;

    const DIR: &str = "p-0";

    async fn open(fs: &MemFs) -> (ShardReplicaLog<MemFs>, PathBuf) {
        let root = PathBuf::from("/data");
        strand_storage::replay_journals(fs, &root, |_| Some(LogConfig::default()), 0)
            .await
            .expect("journal replay");
        let store = Rc::new(
            ShardStore::open(fs.clone(), root.clone(), 0, StoreConfig::default())
                .await
                .expect("the store opens"),
        );
        let key = LogKey {
            dir_name: DIR.to_owned(),
            incarnation: [1; 16],
        };
        let (id, _) = store
            .open_log(key, LogConfig::default(), 0)
            .await
            .expect("the log opens");
        let dir = root.join(DIR);
        let log = ShardReplicaLog::open(store, id, dir.clone(), Rc::new(|| 0))
            .await
            .expect("the replica log opens");
        (log, dir.join(SIDE_STATE_FILE))
    }

    fn vote(term: u64) -> StoredVote {
        StoredVote {
            term: Term(term),
            node: BrokerId(2),
            committed: term.is_multiple_of(2),
        }
    }

    fn size(fs: &MemFs, path: &Path) -> usize {
        block_on(fs.read_file(path)).expect("readable").len()
    }

    /// Votes are appended to the side file's journal, which is replaced once full; after a
    /// power cut that tears the last append, the replica reopens with the last durable vote and
    /// its next write replaces the torn file.
    #[test]
    fn votes_append_to_the_side_journal_and_a_torn_append_reads_as_the_vote_before() {
        let fs = MemFs::new();
        block_on(fs.create_dir_all(Path::new("/data"))).expect("dir");
        let (log, side) = block_on(open(&fs));
        block_on(log.save_vote(vote(1))).expect("saved");
        let one = size(&fs, &side);
        block_on(log.save_vote(vote(2))).expect("saved");
        assert_eq!(size(&fs, &side), 2 * one, "appended, not replaced");
        let mut term = 2;
        while size(&fs, &side) + one <= SIDE_JOURNAL_BYTES as usize {
            term += 1;
            block_on(log.save_vote(vote(term))).expect("saved");
        }
        term += 1;
        block_on(log.save_vote(vote(term))).expect("saved");
        assert_eq!(size(&fs, &side), one, "a full journal is replaced by one frame");
        block_on(log.save_vote(vote(term + 1))).expect("saved");
        drop(log);

        // The next append is torn by a power cut: half of it reaches the disk, unsynced.
        let bytes = block_on(fs.read_file(&side)).expect("readable");
        let torn = SideState {
            vote: Some(vote(term + 2)),
            ..SideState::default()
        }
        .encode();
        let f = block_on(fs.open(&side, false)).expect("open");
        block_on(f.write_all_at(torn[..torn.len() / 2].to_vec(), bytes.len() as u64)).expect("written");
        fs.crash(|n| n);
        let (log, _) = block_on(open(&fs));
        assert_eq!(log.vote(), Some(vote(term + 1)), "the last durable vote");
        block_on(log.save_vote(vote(term + 3))).expect("saved");
        assert_eq!(size(&fs, &side), one, "a torn journal is replaced");
        drop(log);
        fs.crash(|_| 0);
        let (log, _) = block_on(open(&fs));
        assert_eq!(log.vote(), Some(vote(term + 3)));
    }
}

#[cfg(test)]
mod side_tests {
    use futures::executor::block_on;
    use std::path::{Path, PathBuf};
    use strand_storage::fs_mem::MemFs;
    use strand_storage::log::LogConfig;
    use strand_storage::store::StoreConfig;
    use strand_storage::LogKey;

    use super::*;
    use crate::partition::types::SideRecord;

    fn open(fs: &MemFs) -> (Rc<ShardStore<MemFs>>, ShardReplicaLog<MemFs>) {
        let root = PathBuf::from("/data");
        block_on(strand_storage::replay_journals(
            fs,
            &root,
            |_| Some(LogConfig::default()),
            0,
        ))
        .expect("replay");
        let store = Rc::new(
            block_on(ShardStore::open(
                fs.clone(),
                root.clone(),
                0,
                StoreConfig::default(),
            ))
            .expect("store"),
        );
        let key = LogKey {
            dir_name: "p-0".into(),
            incarnation: [1; 16],
        };
        let (id, _) = block_on(store.open_log(key, LogConfig::default(), 0)).expect("log");
        let log = block_on(ShardReplicaLog::open(
            Rc::clone(&store),
            id,
            root.join("p-0"),
            Rc::new(|| 0),
        ))
        .expect("replica log")
        .with_side_log(SideLogSpec {
            key: LogKey {
                dir_name: "p-0-side".into(),
                incarnation: [2; 16],
            },
            config: LogConfig::default(),
        });
        (store, log)
    }

    fn side(index: u64) -> StoredSide {
        StoredSide {
            index,
            term: Term(1),
            record: SideRecord {
                keep_from: 0,
                data: Bytes::from(index.to_string()),
            },
        }
    }

    /// Runs `f` while a flusher makes the store's staged writes durable.
    fn flushing<T>(store: &Rc<ShardStore<MemFs>>, f: impl std::future::Future<Output = T>) -> T {
        let flusher = async {
            loop {
                store.wait_for_work().await;
                store.flush_pending(4, |_| {}).await;
                store.sync_changed_dirs().await;
            }
        };
        futures::pin_mut!(f);
        futures::pin_mut!(flusher);
        match block_on(futures::future::select(f, flusher)) {
            futures::future::Either::Left((t, _)) => t,
            futures::future::Either::Right(((), _)) => unreachable!("the flusher never ends"),
        }
    }

    fn indexes(log: &ShardReplicaLog<MemFs>) -> Vec<u64> {
        block_on(log.side_records(0, u64::MAX))
            .expect("reads")
            .iter()
            .map(|s| s.index)
            .collect()
    }

    /// Side records are readable once staged and after their flush, by index range; a
    /// truncation drops those after the kept index, a trim those before its index, and a
    /// restart (journal replay included) finds what was durable, without creating a side log
    /// for a replica that never wrote one.
    #[test]
    fn side_records_are_stored_read_truncated_trimmed_and_recovered() {
        let fs = MemFs::new();
        block_on(fs.create_dir_all(Path::new("/data"))).expect("dir");
        let (store, log) = open(&fs);
        assert!(block_on(log.recover()).expect("recovers").side.is_empty());
        assert!(
            !block_on(fs.exists(Path::new("/data/p-0-side"))),
            "created only when written"
        );
        for i in [3, 5, 9, 12] {
            block_on(log.append_side(side(i))).expect("staged");
        }
        assert_eq!(indexes(&log), vec![3, 5, 9, 12], "readable while staged");
        flushing(&store, log.flush()).expect("flushed");
        assert_eq!(log.side_durable_index(), 12);
        let read = block_on(log.side_records(4, 10)).expect("reads");
        assert_eq!(read, vec![side(5), side(9)]);
        flushing(&store, log.truncate(Offset(0), Some(9))).expect("truncated");
        assert_eq!(indexes(&log), vec![3, 5, 9]);
        flushing(&store, log.trim_side(5)).expect("trimmed");
        assert_eq!(indexes(&log), vec![5, 9]);
        drop(log);
        drop(store);
        let (_store, log) = open(&fs);
        let rec = block_on(log.recover()).expect("recovers");
        assert_eq!(rec.side, vec![(5, Term(1)), (9, Term(1))]);
        assert_eq!(indexes(&log), vec![5, 9]);
        assert_eq!(log.side_durable_index(), 9);
    }
}
