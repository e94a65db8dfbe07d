//! A shard's storage: the partition logs the shard owns, its journal, and the group commit that
//! ties them together.
//!
//! Group commit: appends are synchronous and only stage bytes. A single flusher task per shard
//! runs flush rounds ([`ShardStore::flush_pending`]) whenever something is staged: a round
//! writes every staged batch of every log to the journal with one `fdatasync`, writes the same
//! batches to their segment files (unsynced) concurrently, and then moves each log's high
//! watermark. Appends made while a round is in flight wait for the next round. One round costs
//! one journal fsync whether it carries one partition or ten thousand.
//!
//! Direct rounds: a round carrying at most [`StoreConfig::direct_sync_max_logs`] logs skips the
//! journal and fsyncs those logs' files instead (every segment with unsynced writes, and the
//! directory after a segment was created), so one or two busy partitions write each byte once,
//! not twice (BENCHMARKS.md#direct-rounds). Journal replay needs nothing from them: their bytes
//! are durable in the segments, and a later journaled batch continues from there. A round of
//! more logs is direct too when they carry at least [`StoreConfig::direct_min_log_bytes`] each
//! on average: it writes only their segments and makes them durable with one `syncfs` of the
//! file system and one fsync of the store's root (`sync_whole_filesystem`; every log lives
//! there) instead of a device flush per file (BENCHMARKS.md#syncfs-rounds). Rounds grow while
//! the disk is busy, so a heavy load over many partitions turns direct and writes each byte
//! once, while a light one keeps its single journal fsync. A round that creates a segment file
//! (a new log's first, a roll) stays direct and syncs the log's directory after it, before
//! acknowledging anything (such a round is not taken to overlap another: it waits for the one
//! in flight). A log whose directory changed otherwise since it was last synced (a segment
//! removed, a file a journaled round created) is journaled until a checkpoint or
//! [`ShardStore::sync_changed_dirs`] syncs the directory.
//!
//! Overlap: while a direct round's fsyncs run, what is staged meanwhile is already written as
//! the next round ([`ShardStore::flush_pending`]); at most two rounds are in flight, and they
//! finish in order.
//!
//! Checkpoints ([`ShardStore::checkpoint`], run by the shard's flusher after it rotates the
//! journal at [`StoreConfig::journal_segment_bytes`] or on a timer, and at a clean stop,
//! [`ShardStore::shutdown`]): every changed log's segment files and index files are fsynced and
//! its `recovery-point` written, and only then are the retired journal files deleted, or kept
//! for recycling ([`StoreConfig::journal_recycle_files`], see [`crate::journal`]). A checkpoint
//! of at least [`StoreConfig::checkpoint_syncfs_min_logs`] logs syncs the file system instead of
//! each file (`checkpoint_by_filesystem`). Flush rounds go on while a checkpoint runs, direct
//! ones too: a segment whose fsync the checkpoint took over and has not finished
//! (`Segment::checkpoint_syncing`) is synced by the round as well, as if no checkpoint ran
//! (BENCHMARKS.md#rounds-beside-checkpoint). No directory sync runs beside a checkpoint, and
//! segment files are removed (retention, DeleteRecords) only while none runs (`segments_lock`):
//! a checkpoint writes the index files of any segment rolled since the last one, and would
//! create them again for a segment removed under it.
//!
//! New logs: nothing is appended to a new log before its directory's entry in its parent is
//! durable, since a direct round's fsyncs of a segment and its directory cannot bring back a
//! directory a crash took away. [`ShardStore::open_log`] syncs a new directory into its parent;
//! [`ShardStore::open_logs`] registers the logs it created (so nothing is appended to them and
//! the broker serves none) only once its file-system sync has returned.
//!
//! Removed logs: no I/O runs in a log's directory once its removal has started. A flush round,
//! a checkpoint, a directory sync, retention and DeleteRecords each hold a `LogIoGuard` of every
//! log they touch while their I/O runs; [`ShardStore::remove_log`] unregisters the log at once
//! but deletes its directory only when the last guard is dropped, and a log opened in the same
//! directory meanwhile (the topic created again) waits for that.
//!
//! Replicas: a Raft follower appends what its leader accepted, at the offsets the leader gave
//! it ([`ShardStore::append_replica`]: at the log end only, made durable by the same rounds),
//! and cuts the suffix that conflicts with a new leader's log ([`ShardStore::truncate_log`]).
//! A truncation waits for the flusher to write what the log has staged, refusing appends to the
//! log meanwhile; writes a `Truncate` journal entry and waits for a round to sync it (a fence:
//! replay skips every earlier entry of the log at or above the cut, see [`crate::replay`]);
//! then cuts the files (the recovery point removed and the epoch file rewritten first, so that
//! neither speaks for batches appended at the cut offsets later; segments past the cut removed
//! newest first, each removal synced; the cut segment truncated and synced) and checkpoints the
//! log, so that its recovery point and indexes are back; and only then takes appends again. The fence comes first: a crash before it leaves the log as it was, a crash
//! after it (the cut unfinished) a prefix of it, as the truncation never returned; the fence
//! alone, without the cut, would let recovery keep cut batches that the files still hold, and
//! the cut alone would let replay append a cut batch's journal entry at the new log end.
//! Checkpointing the log instead of fencing would not do: its journal entries stay in the
//! journal files until a checkpoint of every log has covered them.
//!
//! Failure: if a round fails (disk full, I/O error) its appends are answered with an error and
//! the store goes *offline for writes*: later appends fail with [`StorageError::Offline`], while
//! reads of durable data keep working. Nothing acknowledged is touched; everything above the
//! high watermarks is thrown away in memory, as a restart's recovery would. After an I/O error,
//! or a failed sync, writes stay refused until a restart (Kafka's offline log directory, minus
//! the reads). After a write refused for want of space (`ENOSPC`), [`ShardStore::try_resume`],
//! which the shard calls periodically, takes writes again once the file system has
//! [`StoreConfig::resume_free_bytes`] free: it first makes the files end where the logs do,
//! durably (the journal cut back to its synced end, each log's discarded tail cut from its
//! segment files, its indexes rebuilt), so that no discarded batch can come back after a crash
//! in place of one appended since at its offset.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::rc::Rc;
use std::task::Poll;
use std::time::{Duration, Instant};

use futures::future::join_all;

use crate::fs::{FileHandle, Fs};
use crate::journal::{Journal, LogKey};
use crate::log::{
    persist_log_start_offset, remove_segment_files, write_chunks, AppendInfo, CheckpointWork, DiscardPlan,
    LogConfig, LogIoGuard, PartitionLog, ReadPlan, RecoveryPoint, RecoveryReport, ResumeCut,
    RetentionOutcome, StagedWrites, WrittenChunk,
};
use crate::notify::Notify;
use crate::replace::FileReplacer;
use crate::StorageError;

/// A handle to a log in a [`ShardStore`]. Stale handles (of removed logs) are detected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LogId {
    slot: u32,
    generation: u32,
}

/// Settings of a shard store. The broker sets the journal's size and recycling and
/// `direct_min_log_bytes` from its configuration and runs the defaults of the rest, which its
/// users have no reason to change (BENCHMARKS.md#direct-rounds, BENCHMARKS.md#flush-overlap,
/// BENCHMARKS.md#checkpoint-syncfs); tests vary them.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// Rotate the journal (and checkpoint) once the current file reaches this size.
    pub journal_segment_bytes: u64,
    /// Journal files a checkpoint covered that are kept (renamed `.free`) to be overwritten
    /// by the next rotations instead of deleted: a journal round that overwrites a file's
    /// existing blocks leaves its `fdatasync` no metadata (size, block map) to write. 0
    /// deletes them.
    pub journal_recycle_files: usize,
    /// Upper bound on fsyncs a checkpoint keeps in flight at once.
    pub checkpoint_concurrency: usize,
    /// A round carrying at most this many logs skips the journal and fsyncs the logs' segment
    /// files instead (a *direct* round): each byte is written once, not twice. Above it, one
    /// journal fsync is cheaper than one fsync per log. 0 journals every round.
    pub direct_sync_max_logs: usize,
    /// A round with more logs is direct too when they carry at least this many staged bytes
    /// each on average, made durable by one file-system sync (see `sync_round`): that then
    /// costs less than writing every byte twice (journal, then segment), whose second write
    /// competes with the next rounds for the disk. Rounds grow while the disk is busy, so under a heavy load of many partitions
    /// rounds turn direct, and a light load keeps its single journal fsync. 0 (or
    /// `direct_sync_max_logs` 0) turns this off.
    pub direct_min_log_bytes: usize,
    /// While a direct round's fsyncs run, appends staged meanwhile are written for the next
    /// round in pieces of at least this many bytes (see [`ShardStore::flush_pending`]). 0:
    /// rounds never overlap.
    pub overlap_min_bytes: usize,
    /// A checkpoint of at least this many logs makes their files durable with two syncs of
    /// the file system instead of fsyncs per file (see [`ShardStore::checkpoint`]). 0, or
    /// `direct_min_log_bytes` 0 (the switch for file-system syncs), turns this off.
    pub checkpoint_syncfs_min_logs: usize,
    /// After a full disk took the store offline, writes resume ([`ShardStore::try_resume`]) once
    /// the file system has at least this many bytes available (and
    /// [`RESUME_MIN_FREE_INODES`] inodes, where it counts them).
    pub resume_free_bytes: u64,
}

/// Inodes a file system must have available for [`ShardStore::try_resume`]: new segment files
/// (three per roll), journal files, checkpoint temporaries.
pub const RESUME_MIN_FREE_INODES: u64 = 256;

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            journal_segment_bytes: 128 << 20,
            journal_recycle_files: 2,
            checkpoint_concurrency: 64,
            direct_sync_max_logs: 2,
            direct_min_log_bytes: 16 << 10,
            overlap_min_bytes: 64 << 10,
            checkpoint_syncfs_min_logs: 16,
            resume_free_bytes: 64 << 20,
        }
    }
}

/// Why a store refuses writes (see the module documentation, *Failure*).
#[derive(Debug, Clone)]
pub struct Offline {
    /// The failed round's error.
    pub reason: String,
    /// The round failed because a write was refused for want of space: writes resume once
    /// space is free again ([`ShardStore::try_resume`]). Otherwise they stay refused until a
    /// restart.
    pub disk_full: bool,
    /// When the store went offline.
    pub since: Instant,
}

/// What [`ShardStore::try_resume`] did.
#[derive(Debug)]
pub enum ResumeOutcome {
    /// The store takes writes; nothing to do.
    Online,
    /// Offline for a reason free space does not cure (an I/O error): until a restart.
    NotResumable,
    /// Not enough space yet (see [`StoreConfig::resume_free_bytes`]).
    WaitingForSpace(crate::fs::FsSpace),
    /// A flush round, the clean-up of a failed one, or the store's shutdown is under way: try
    /// again later.
    Busy,
    /// Bringing the files back failed; still offline (and for good if the error was not one of
    /// space).
    Failed(StorageError),
    /// Writes are taken again.
    Resumed {
        /// How long writes were refused.
        offline_for: Duration,
        /// Logs whose discarded tails were cut from their files.
        logs_cut: usize,
        space: crate::fs::FsSpace,
    },
}

impl Offline {
    fn error(&self) -> StorageError {
        StorageError::Offline {
            reason: self.reason.clone(),
            disk_full: self.disk_full,
        }
    }
}

/// Keeps the failure a round reports: the first, unless a later one is worse (not a write
/// refused for space, which [`ShardStore::try_resume`] can recover from, while the other cannot).
fn note_failure(slot: &mut Option<StorageError>, e: StorageError) {
    match slot {
        Some(first) if !first.refused_for_space() || e.refused_for_space() => {}
        _ => *slot = Some(e),
    }
}

/// The error of an append to a log being truncated.
const TRUNCATING: StorageError = StorageError::Busy("the log is being truncated");

/// Ends a truncation ([`ShardStore::truncate_log`]): the log takes appends again, unless the
/// truncation was abandoned (its future dropped) between its journal fence and the end of its
/// cut: the fence voids the entries of batches the log still holds, so appending after them
/// could lose acknowledged batches in a crash. The log then refuses appends until a restart,
/// whose recovery and replay leave a prefix of it.
struct TruncationGuard<'a, F: Fs> {
    store: &'a ShardStore<F>,
    id: LogId,
    fenced: bool,
}

impl<F: Fs> Drop for TruncationGuard<'_, F> {
    fn drop(&mut self) {
        if self.fenced {
            tracing::error!(
                "a truncation was abandoned after its journal fence; the log refuses appends until a restart"
            );
            return;
        }
        if let Ok(mut inner) = self.store.inner.try_borrow_mut() {
            if let Some(entry) = entry_mut(&mut inner.slots, self.id) {
                entry.truncating = false;
            }
        }
    }
}

/// How many logs [`ShardStore::open_logs`] opens at a time: each open is a handful of small
/// file operations, and done one after the other, 10,000 partitions take a minute, mostly
/// waiting.
const OPEN_CONCURRENCY: usize = 64;

/// A pending append: await [`ShardStore::wait_durable`] with it for the acknowledgement.
#[derive(Debug, Clone, Copy)]
pub struct AppendTicket {
    pub id: LogId,
    pub info: AppendInfo,
    discard_generation: u64,
}

/// Offsets and size of one log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogOffsets {
    pub log_start_offset: i64,
    pub high_watermark: i64,
    pub log_end_offset: i64,
    pub size_bytes: u64,
}

/// What one flush round did.
#[derive(Debug, Clone, Default)]
pub struct RoundStats {
    pub logs: usize,
    /// Whether the round skipped the journal and synced its logs' own files.
    pub direct: bool,
    /// Whether the round's writes ran under the previous round's fsyncs.
    pub overlapped: bool,
    /// A direct round of more than [`StoreConfig::direct_sync_max_logs`] logs: made durable by
    /// one file-system sync instead of one fsync per file.
    pub syncfs: bool,
    /// Separate writes the round was made of: more than one when what was staged during the
    /// previous round's fsyncs was written in pieces.
    pub writes: u32,
    /// Bytes written to the journal (0 in a direct round).
    pub journal_bytes: usize,
    /// Bytes written to segment files.
    pub segment_bytes: usize,
    pub duration_us: u64,
    pub fsync_us: u64,
    /// How long the oldest of the round's writes had been staged when the round took it: the
    /// wait of a produce between being staged and its round starting.
    pub wait_us: u64,
    pub error: Option<String>,
}

/// What a checkpoint did.
#[derive(Debug, Clone, Default)]
pub struct CheckpointStats {
    pub logs: usize,
    /// The checkpoint covered enough logs to make their files durable with two file-system
    /// syncs instead of fsyncs per file (see [`StoreConfig::checkpoint_syncfs_min_logs`]).
    pub syncfs: bool,
    pub journal_files_deleted: usize,
    /// Covered journal files kept (renamed `.free`) to be recycled.
    pub journal_files_recycled: usize,
    pub duration_us: u64,
}

/// A direct round's syncs for one log.
struct LogSyncs<F: Fs> {
    id: LogId,
    files: Vec<Rc<F::File>>,
    dir: PathBuf,
    /// The round creates a segment file: sync the directory after the files. The log's
    /// directory-change count when the round took its writes.
    dir_at: Option<u64>,
    /// The log's count of sealing cuts when the round took its writes (see
    /// `PartitionLog::rolled_segments_synced`).
    cuts_at: u64,
}

/// A round taken by [`ShardStore::take_round`], not yet written.
struct TakenRound<F: Fs> {
    started: Instant,
    /// See [`RoundStats::wait_us`].
    wait_us: u64,
    direct: bool,
    overlapped: bool,
    journal_write: Option<crate::journal::PendingWrite<F::File>>,
    /// The truncation fences the journal write carries: those staged up to this count.
    fences_upto: Option<u64>,
    logs: Vec<LogRound<F>>,
}

/// One log's part of a taken round.
struct LogRound<F: Fs> {
    id: LogId,
    io: LogIoGuard,
    writes: StagedWrites<F::File>,
    /// In a direct round: the files to fsync besides those the writes touch.
    syncs: Option<LogSyncs<F>>,
}

/// One log's take in a written round: the end offset it covers and the chunks written.
type WrittenPart<F> = (LogId, i64, Vec<WrittenChunk<<F as Fs>::File>>);

/// A round whose writes are done (and whose journal entries are synced).
struct WrittenRound<F: Fs> {
    started: Instant,
    stats: RoundStats,
    /// Per log taken, in take order.
    parts: Vec<WrittenPart<F>>,
    /// A direct round's syncs still to do, per log.
    syncs: Vec<LogSyncs<F>>,
    /// Logs whose directory the round synced after creating segment files, with their
    /// directory-change count when the round took its writes.
    dir_synced: Vec<(LogId, u64)>,
    /// A direct round's syncs once done: per log, the files made durable (by `fdatasync`, or by
    /// the file-system sync that covered them), with the log's cut count when it was taken.
    synced: Vec<LogSyncs<F>>,
    journal_bytes: u64,
    failure: Option<StorageError>,
    /// Takes merged into this round, each counted in `ShardStore::takes_in_flight`.
    takes: u32,
    /// See [`TakenRound::fences_upto`].
    fences_upto: Option<u64>,
    /// Held until the round is finished: its logs' directories must outlive its I/O.
    io: Vec<LogIoGuard>,
}

impl<F: Fs> WrittenRound<F> {
    /// Starts `round` with `written`, or merges it in.
    fn add_to(round: &mut Option<WrittenRound<F>>, written: WrittenRound<F>) {
        match round {
            Some(r) => r.absorb(written),
            None => *round = Some(written),
        }
    }

    /// The logs this round carries.
    fn log_ids(&self) -> Vec<LogId> {
        let mut ids: Vec<LogId> = Vec::new();
        for (id, _, _) in &self.parts {
            if !ids.contains(id) {
                ids.push(*id);
            }
        }
        ids
    }

    /// Merges `later`, taken and written after this round's earlier takes, into this round.
    /// Neither is synced yet, and `later`, an overlapping take, creates no segment file.
    fn absorb(&mut self, later: WrittenRound<F>) {
        debug_assert!(self.dir_synced.is_empty() && later.dir_synced.is_empty());
        debug_assert!(self.synced.is_empty() && later.synced.is_empty());
        debug_assert!(later.syncs.iter().all(|s| s.dir_at.is_none()));
        self.stats.segment_bytes += later.stats.segment_bytes;
        self.parts.extend(later.parts);
        self.io.extend(later.io);
        for sync in later.syncs {
            match self.syncs.iter_mut().find(|s| s.id == sync.id) {
                Some(mine) => {
                    for f in sync.files {
                        if !mine.files.iter().any(|g| Rc::ptr_eq(g, &f)) {
                            mine.files.push(f);
                        }
                    }
                }
                None => self.syncs.push(sync),
            }
        }
        self.journal_bytes += later.journal_bytes;
        if let Some(e) = later.failure {
            note_failure(&mut self.failure, e);
        }
        self.takes += later.takes;
        self.fences_upto = self.fences_upto.max(later.fences_upto);
        self.stats.writes += later.stats.writes;
        self.stats.wait_us = self.stats.wait_us.max(later.stats.wait_us);
        self.stats.logs = self.log_ids().len();
    }
}

/// How [`ShardStore::take_round`] may take.
#[derive(Clone, Copy)]
enum Take<'a> {
    /// No round is in flight: take everything staged.
    Alone,
    /// A direct round syncs (and `open` holds what was already taken for the round after it):
    /// take only what a direct round with those logs can carry, and at least `min_bytes`.
    Behind { open: &'a [LogId], min_bytes: usize },
}

/// What [`ShardStore::flush_pending`] waits for while a round syncs.
enum Event<F: Fs> {
    Finished((RoundStats, Vec<DiscardPlan<F::File>>)),
    Written(WrittenRound<F>),
    Work,
}

struct Entry<F: Fs> {
    key: LogKey,
    log: PartitionLog<F>,
    dirty: bool,
    /// Guards out for I/O in the log's directory (see `LogIoGuard`).
    io_users: Rc<Cell<u32>>,
    /// A truncation ([`ShardStore::truncate_log`]) runs: appends are refused. Stays set if the
    /// truncation was abandoned after its journal fence (see `TruncationGuard`).
    truncating: bool,
}

struct Slot<F: Fs> {
    generation: u32,
    entry: Option<Entry<F>>,
}

/// The live entry of `id`, if the log was not removed (stale ids are refused, not misapplied).
fn entry_mut<F: Fs>(slots: &mut [Slot<F>], id: LogId) -> Option<&mut Entry<F>> {
    let slot = slots.get_mut(id.slot as usize)?;
    if slot.generation != id.generation {
        return None;
    }
    slot.entry.as_mut()
}

/// Every live entry with its id.
fn entries_mut<F: Fs>(slots: &mut [Slot<F>]) -> impl Iterator<Item = (LogId, &mut Entry<F>)> {
    slots.iter_mut().enumerate().filter_map(|(i, s)| {
        let id = LogId {
            slot: i as u32,
            generation: s.generation,
        };
        Some((id, s.entry.as_mut()?))
    })
}

struct Inner<F: Fs> {
    slots: Vec<Slot<F>>,
    free: Vec<u32>,
    dirty: Vec<LogId>,
    /// Logs a round would have written directly but for directory changes no sync covers yet
    /// (a segment removed, a file a journaled round created): [`ShardStore::sync_changed_dirs`]
    /// syncs them.
    dir_sync_wanted: Vec<LogId>,
    journal: Journal<F>,
    offline: Option<Offline>,
    /// Directories of removed logs not deleted yet (see [`ShardStore::remove_log`]).
    removing: Vec<PathBuf>,
    /// Truncation fences (`Truncate` journal entries, see [`ShardStore::truncate_log`]) staged
    /// so far, taken by a round so far, and made durable by a round so far: each a count, in
    /// staging order (rounds finish in the order they were taken).
    fences_staged: u64,
    fences_taken: u64,
    fences_durable: u64,
}

/// The storage of one shard. Not `Send`: it lives on its shard's thread.
pub struct ShardStore<F: Fs> {
    fs: F,
    root: PathBuf,
    config: StoreConfig,
    inner: RefCell<Inner<F>>,
    /// Notified after every flush round (high watermarks may have moved).
    durable: Notify,
    /// Notified when something is staged.
    work: Notify,
    /// Takes of rounds not finished yet: those of at most two rounds (see
    /// [`ShardStore::flush_pending`]).
    takes_in_flight: Cell<u32>,
    /// Set by [`ShardStore::shutdown`]: the flusher starts no more rounds.
    closing: Cell<bool>,
    /// Discard plans of failed rounds running ([`ShardStore::run_discards`]).
    discarding: Cell<u32>,
    checkpoint_running: Cell<bool>,
    /// Notified when the last `LogIoGuard` of a log is dropped.
    io_released: Rc<Notify>,
    /// Held while segment files are removed (retention, DeleteRecords) and while a checkpoint
    /// runs, which may write the index files of any segment rolled since the last one: a
    /// segment removed under it would leave its index files behind. Also serializes
    /// [`ShardStore::delete_records`] calls, which would race on the start-offset file.
    segments_lock: futures::lock::Mutex<()>,
    /// Small files replaced together ([`ShardStore::replace_file`]).
    replacer: FileReplacer,
}

impl<F: Fs> ShardStore<F> {
    /// Opens the store of shard `shard` under `root` with a fresh journal. The journal files of
    /// earlier runs must already have been replayed (see [`crate::replay_journals`]).
    pub async fn open(fs: F, root: PathBuf, shard: u16, config: StoreConfig) -> Result<Self, StorageError> {
        let journal = Journal::create(
            &fs,
            &root,
            shard,
            config.journal_segment_bytes,
            config.journal_recycle_files,
        )
        .await?;
        Ok(ShardStore {
            fs,
            root,
            config,
            inner: RefCell::new(Inner {
                slots: Vec::new(),
                free: Vec::new(),
                dirty: Vec::new(),
                dir_sync_wanted: Vec::new(),
                removing: Vec::new(),
                journal,
                offline: None,
                fences_staged: 0,
                fences_taken: 0,
                fences_durable: 0,
            }),
            durable: Notify::new(),
            work: Notify::new(),
            takes_in_flight: Cell::new(0),
            closing: Cell::new(false),
            discarding: Cell::new(0),
            checkpoint_running: Cell::new(false),
            io_released: Rc::new(Notify::new()),
            segments_lock: futures::lock::Mutex::new(()),
            replacer: FileReplacer::new(),
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The file system the store's files live on.
    pub fn fs(&self) -> &F {
        &self.fs
    }

    /// Durably replaces the content of the small file `path` (under the store's root), readers
    /// seeing the old or the new content, never a mix. Replacements asked while one runs are
    /// made together, with one file-system sync for all of them once they are at least
    /// [`StoreConfig::checkpoint_syncfs_min_logs`] (see [`crate::replace`]).
    pub async fn replace_file(&self, path: &Path, data: Vec<u8>) -> std::io::Result<()> {
        let min_files = self.config.checkpoint_syncfs_min_logs;
        self.replacer
            .replace(&self.fs, &self.root, min_files, path, data)
            .await
    }

    /// Durably writes `data` at byte `at` of the existing small file `path` (an append, when
    /// `at` is its length), group-committed with the other small-file writes as
    /// [`ShardStore::replace_file`] is.
    pub async fn append_file(&self, path: &Path, at: u64, data: Vec<u8>) -> std::io::Result<()> {
        let min_files = self.config.checkpoint_syncfs_min_logs;
        self.replacer
            .append(&self.fs, &self.root, min_files, path, at, data)
            .await
    }

    /// Opens or creates the log `key` (recovering it), and registers it with this store.
    pub async fn open_log(
        &self,
        key: LogKey,
        config: LogConfig,
        now_ms: i64,
    ) -> Result<(LogId, RecoveryReport), StorageError> {
        self.open_log_inner(key, config, None, now_ms).await
    }

    /// [`ShardStore::open_log`] for the partition's leader in `leader_epoch` (see
    /// [`PartitionLog::open_as_leader`]).
    pub async fn open_log_as_leader(
        &self,
        key: LogKey,
        config: LogConfig,
        leader_epoch: i32,
        now_ms: i64,
    ) -> Result<(LogId, RecoveryReport), StorageError> {
        self.open_log_inner(key, config, Some(leader_epoch), now_ms).await
    }

    async fn open_log_inner(
        &self,
        key: LogKey,
        config: LogConfig,
        leader_epoch: Option<i32>,
        now_ms: i64,
    ) -> Result<(LogId, RecoveryReport), StorageError> {
        let (log, report) = self
            .open_unregistered(&key, config, leader_epoch, true, now_ms)
            .await?;
        Ok((self.register(key, log), report))
    }

    /// Opens or creates many logs at once, as the partitions' leader in `leader_epoch` (see
    /// [`ShardStore::open_log_as_leader`]): a CreateTopics request's partitions, or a shard's
    /// logs at start-up. The results come in the order of `logs`. With at least
    /// [`StoreConfig::checkpoint_syncfs_min_logs`] logs, the directories and files of those
    /// created are made durable with one sync of the file system, instead of three fsyncs per
    /// log (a directory, its parent and `partition.metadata`; creating 10,000 partitions took
    /// 5–26 s of them, BENCHMARKS.md#new-log-files), and their recovery points then stand as their first
    /// checkpoints.
    pub async fn open_logs(
        &self,
        logs: Vec<(LogKey, LogConfig)>,
        leader_epoch: i32,
        now_ms: i64,
    ) -> Vec<Result<(LogId, RecoveryReport), StorageError>> {
        let by_filesystem = self.syncs_filesystem_for(logs.len());
        let mut results: Vec<Option<Result<(LogId, RecoveryReport), StorageError>>> =
            Vec::with_capacity(logs.len());
        // Logs created unsynced wait for the sync before they are registered (nothing may be
        // appended to them before); the others are registered at once.
        let mut created = Vec::new();
        let mut it = logs.into_iter();
        loop {
            let batch: Vec<_> = it.by_ref().take(OPEN_CONCURRENCY).collect();
            if batch.is_empty() {
                break;
            }
            let opened = join_all(batch.into_iter().map(|(key, config)| async move {
                let opened = self
                    .open_unregistered(&key, config, Some(leader_epoch), !by_filesystem, now_ms)
                    .await;
                (key, opened)
            }))
            .await;
            for (key, r) in opened {
                match r {
                    Ok((log, report)) if by_filesystem && log.has_unsynced_initial_files() => {
                        created.push((results.len(), key, log, report));
                        results.push(None);
                    }
                    Ok((log, report)) => results.push(Some(Ok((self.register(key, log), report)))),
                    Err(e) => results.push(Some(Err(e))),
                }
            }
        }
        if !created.is_empty() {
            let started = Instant::now();
            let synced = self.fs.sync_filesystem(&self.root).await;
            tracing::debug!(root = %self.root.display(), created = created.len(), duration_ms = started.elapsed().as_millis() as u64, ok = synced.is_ok(), "new logs made durable by a file-system sync");
            for (i, key, mut log, report) in created {
                results[i] = Some(match &synced {
                    Ok(()) => {
                        log.initial_files_synced();
                        Ok((self.register(key, log), report))
                    }
                    Err(e) => Err(StorageError::io(
                        "sync new log directories",
                        &self.root.join(&key.dir_name),
                        std::io::Error::new(e.kind(), e.to_string()),
                    )),
                });
            }
        }
        // (Every slot was filled above.)
        results
            .into_iter()
            .map(|r| r.unwrap_or(Err(StorageError::UnknownLog)))
            .collect()
    }

    /// Whether the files of this many logs are made durable with syncs of the file system
    /// rather than fsyncs per file (a checkpoint, or logs created together; see
    /// [`StoreConfig::checkpoint_syncfs_min_logs`]).
    fn syncs_filesystem_for(&self, logs: usize) -> bool {
        let min_logs = self.config.checkpoint_syncfs_min_logs;
        min_logs > 0 && self.config.direct_min_log_bytes > 0 && logs >= min_logs
    }

    /// Prepares a log's directory (see [`prepare_log_dir`]; `sync`: durably) and opens the log
    /// in it.
    async fn open_unregistered(
        &self,
        key: &LogKey,
        config: LogConfig,
        leader_epoch: Option<i32>,
        sync: bool,
        now_ms: i64,
    ) -> Result<(PartitionLog<F>, RecoveryReport), StorageError> {
        let dir = self.root.join(&key.dir_name);
        // A removed log of the same name may still have I/O in flight there: its directory goes
        // first, or it would take the new log's files with it.
        loop {
            let released = self.io_released.wait();
            if !self.inner.borrow().removing.contains(&dir) {
                break;
            }
            released.await;
        }
        prepare_log_dir(&self.fs, &self.root, &dir, key, sync).await?;
        match leader_epoch {
            Some(epoch) => PartitionLog::open_as_leader(self.fs.clone(), dir, config, epoch, now_ms).await,
            None => PartitionLog::open(self.fs.clone(), dir, config, now_ms).await,
        }
    }

    /// Registers an opened log with this store.
    fn register(&self, key: LogKey, log: PartitionLog<F>) -> LogId {
        let mut inner = self.inner.borrow_mut();
        let entry = Entry {
            key,
            log,
            dirty: false,
            io_users: Rc::new(Cell::new(0)),
            truncating: false,
        };
        match inner.free.pop() {
            Some(slot) => {
                let s = &mut inner.slots[slot as usize];
                s.generation = s.generation.wrapping_add(1);
                s.entry = Some(entry);
                LogId {
                    slot,
                    generation: s.generation,
                }
            }
            None => {
                let slot = inner.slots.len() as u32;
                inner.slots.push(Slot {
                    generation: 0,
                    entry: Some(entry),
                });
                LogId { slot, generation: 0 }
            }
        }
    }

    /// Unregisters a log and deletes its directory, once the flush round or checkpoint that may
    /// be doing I/O in it is done (see `LogIoGuard`); a log opened in the same directory
    /// meanwhile waits for that. Appends waiting on it fail.
    pub async fn remove_log(&self, id: LogId) -> Result<(), StorageError> {
        let entry = {
            let mut inner = self.inner.borrow_mut();
            let Some(slot) = inner.slots.get_mut(id.slot as usize) else {
                return Err(StorageError::UnknownLog);
            };
            if slot.generation != id.generation {
                return Err(StorageError::UnknownLog);
            }
            let entry = slot.entry.take().ok_or(StorageError::UnknownLog)?;
            inner.free.push(id.slot);
            inner.dirty.retain(|d| *d != id);
            inner.removing.push(entry.log.dir().to_path_buf());
            entry
        };
        self.durable.notify_all();
        let dir = entry.log.dir().to_path_buf();
        let users = entry.io_users.clone();
        drop(entry);
        while users.get() > 0 {
            let released = self.io_released.wait();
            if users.get() == 0 {
                break;
            }
            released.await;
        }
        let deleted = delete_log_dir(&self.fs, &self.root, &dir).await;
        let mut inner = self.inner.borrow_mut();
        if let Some(i) = inner.removing.iter().position(|d| *d == dir) {
            inner.removing.swap_remove(i);
        }
        drop(inner);
        self.io_released.notify_all();
        deleted
    }

    fn with_entry<R>(&self, id: LogId, f: impl FnOnce(&mut Entry<F>) -> R) -> Result<R, StorageError> {
        let mut inner = self.inner.borrow_mut();
        // Not `ok_or`: it builds (and drops) the error on every lookup, a Fetch's per-partition path.
        let Some(entry) = entry_mut(&mut inner.slots, id) else {
            return Err(StorageError::UnknownLog);
        };
        Ok(f(entry))
    }

    /// Read-only access to a log (offsets, configuration, lookups).
    pub fn with_log<R>(&self, id: LogId, f: impl FnOnce(&PartitionLog<F>) -> R) -> Result<R, StorageError> {
        self.with_entry(id, |e| f(&e.log))
    }

    /// The log's offsets as clients see them: the high watermark is
    /// [`PartitionLog::visible_end`] (capped at a replicated log's commit offset).
    pub fn offsets(&self, id: LogId) -> Result<LogOffsets, StorageError> {
        self.with_log(id, |l| LogOffsets {
            log_start_offset: l.log_start_offset(),
            high_watermark: l.visible_end(),
            log_end_offset: l.log_end_offset(),
            size_bytes: l.size_bytes(),
        })
    }

    pub fn set_config(&self, id: LogId, config: LogConfig) -> Result<(), StorageError> {
        self.with_entry(id, |e| e.log.set_config(config))
    }

    /// Why writes are refused, if they are.
    pub fn offline_reason(&self) -> Option<String> {
        self.inner.borrow().offline.as_ref().map(|o| o.reason.clone())
    }

    /// Whether writes are refused, why, and whether free space will cure it.
    pub fn offline(&self) -> Option<Offline> {
        self.inner.borrow().offline.clone()
    }

    /// Appends a validated batch: assigns offsets now, in call order, and stages the batch for
    /// the next flush round. Await [`ShardStore::wait_durable`] before acknowledging.
    pub fn append(
        &self,
        id: LogId,
        batch: &[u8],
        leader_epoch: i32,
        now_ms: i64,
    ) -> Result<AppendTicket, StorageError> {
        self.stage(id, |log| {
            // The journal entry is encoded by the flush round, which knows whether it needs one.
            Ok(match log.append(batch, leader_epoch, now_ms)? {
                crate::log::Appended::New(info, _stored) => info,
                // A retry of a batch already appended: answer with its offsets once durable.
                crate::log::Appended::Duplicate(info) => info,
            })
        })
    }

    /// A Raft follower's append (see [`PartitionLog::append_replica`]): `batch`, accepted by its
    /// leader at `base_offset`, which must be the log end offset, goes there stamped with
    /// `leader_epoch` (the term), without the producer-sequence check and with producer state
    /// updated; staged like [`ShardStore::append`] and made durable by the same flush rounds.
    /// Await [`ShardStore::wait_durable`] with the ticket. Refused while the log is being
    /// truncated.
    pub fn append_replica(
        &self,
        id: LogId,
        batch: &[u8],
        base_offset: i64,
        leader_epoch: i32,
        now_ms: i64,
    ) -> Result<AppendTicket, StorageError> {
        self.stage(id, |log| {
            let (info, _) = log.append_replica(batch, base_offset, leader_epoch, now_ms)?;
            Ok(info)
        })
    }

    /// The shared part of [`ShardStore::append`] and [`ShardStore::append_replica`]: refused
    /// while the store is offline or the log is being truncated; `append` stages the batch in
    /// the log; the log joins the next flush round.
    fn stage(
        &self,
        id: LogId,
        append: impl FnOnce(&mut PartitionLog<F>) -> Result<AppendInfo, StorageError>,
    ) -> Result<AppendTicket, StorageError> {
        let mut inner = self.inner.borrow_mut();
        if let Some(offline) = &inner.offline {
            return Err(offline.error());
        }
        let inner = &mut *inner;
        // Not `ok_or`: it builds (and drops) the error on every append.
        let Some(entry) = entry_mut(&mut inner.slots, id) else {
            return Err(StorageError::UnknownLog);
        };
        if entry.truncating {
            return Err(TRUNCATING);
        }
        let info = append(&mut entry.log)?;
        let ticket = AppendTicket {
            id,
            info,
            discard_generation: entry.log.discard_generation(),
        };
        if !entry.dirty && entry.log.has_staged() {
            entry.dirty = true;
            inner.dirty.push(id);
        }
        self.work.notify_all();
        Ok(ticket)
    }

    /// Removes every batch of the log at or after `offset`, durably (see the module
    /// documentation, *Replicas*): a Raft follower's suffix that conflicts with its new
    /// leader's log. `offset` must be a batch boundary in `[log start, log end]` (at the end,
    /// nothing happens). Waits for the shard's flusher to write what the log has staged
    /// (appends to the log are refused with [`StorageError::Busy`] until this returns) and for
    /// a round to sync the truncation's journal fence, holding the lock that keeps checkpoints,
    /// retention and DeleteRecords away meanwhile: a flusher must not wait for a checkpoint
    /// before it runs rounds (the shard's spawns its checkpoints). When it returns, the log
    /// ends at `offset`, after a crash too, and appends continue there. The log's high
    /// watermark (its durable end) moves down to `offset` if it was above.
    ///
    /// Precondition: nothing at or above `offset` was let out to clients. [`FileRegion`]s are
    /// pages of the segment files that `sendfile` may still be sending, and a cut file gives
    /// other bytes there: the caller truncates only above what clients could read (the Raft
    /// commit index, which bounds what the broker serves). Appends' tickets at or above
    /// `offset` must not be awaited after the truncation (they were durable before it; their
    /// batches are gone).
    ///
    /// Errors: the range and the batch boundary are checked before anything is written.
    /// A failed flush round fails it with the store offline. Once the fence is durable, a
    /// failure to cut the files takes the store offline for writes until a restart, whose
    /// recovery finishes what the cut began; dropping the future then leaves the log refusing
    /// appends until a restart.
    ///
    /// [`FileRegion`]: crate::FileRegion
    pub async fn truncate_log(&self, id: LogId, offset: i64) -> Result<(), StorageError> {
        self.with_entry(id, |e| {
            if e.truncating {
                return Err(TRUNCATING);
            }
            e.truncating = true;
            Ok(())
        })??;
        let mut guard = TruncationGuard {
            store: self,
            id,
            fenced: false,
        };
        let result = self.truncate_log_inner(id, offset, &mut guard).await;
        // Cut, or nothing written: appends are taken again. (A failure after the fence took the
        // store offline.)
        guard.fenced = false;
        result
    }

    async fn truncate_log_inner(
        &self,
        id: LogId,
        offset: i64,
        guard: &mut TruncationGuard<'_, F>,
    ) -> Result<(), StorageError> {
        // 1. Nothing of the log staged or in flight (appends are refused from now on).
        loop {
            let wait = self.durable.wait();
            if let Some(offline) = self.offline() {
                return Err(offline.error());
            }
            if self.with_log(id, |l| l.is_quiescent())? {
                break;
            }
            wait.await;
        }
        // 2. No checkpoint, retention or DeleteRecords beside the rest (which would change the
        // segments under the lookup, or write the log's files under the cut). The flusher runs
        // rounds while waiting for a checkpoint (it spawns them), so the fence's round below is
        // not held up by this.
        let _segments = self.segments_lock.lock().await;
        // Where the cut goes: a batch boundary, checked before anything is written.
        let Some(lookup) = self.with_log(id, |l| l.truncation_lookup(offset))?? else {
            return Ok(());
        };
        let (segment_base, position) = lookup.run().await?;
        // 3. The fence, durable.
        let fence = {
            let mut inner = self.inner.borrow_mut();
            let inner = &mut *inner;
            if let Some(offline) = &inner.offline {
                return Err(offline.error());
            }
            let Some(entry) = entry_mut(&mut inner.slots, id) else {
                return Err(StorageError::UnknownLog);
            };
            assert!(entry.log.is_quiescent(), "appends are refused while truncating");
            assert!(
                entry.log.log_end_offset() > offset,
                "the log cannot shrink under a truncation"
            );
            inner.journal.stage_truncate(&entry.key, offset);
            inner.fences_staged += 1;
            inner.fences_staged
        };
        guard.fenced = true;
        self.work.notify_all();
        loop {
            let wait = self.durable.wait();
            {
                let inner = self.inner.borrow();
                if inner.fences_durable >= fence {
                    break;
                }
                if let Some(offline) = &inner.offline {
                    return Err(offline.error());
                }
            }
            wait.await;
        }
        // 4. The cut and the log's checkpoint.
        let (plan, io) = self.with_entry(id, |e| {
            let io = LogIoGuard::new(&e.io_users, &self.io_released);
            (e.log.cut_at(offset, segment_base, position), io)
        })?;
        let cut = async {
            let indexes = plan.run(&self.fs).await?;
            let mut work = self.with_entry(id, |e| {
                e.log.cut_done(indexes);
                e.log.checkpoint_work()
            })?;
            work.io = Some(io);
            match work.run(&self.fs).await {
                Ok(point) => self.with_entry(id, |e| e.log.checkpoint_done(point)),
                Err(e) => {
                    let _ = self.with_entry(id, |e| e.log.checkpoint_failed());
                    Err(e)
                }
            }
        };
        if let Err(e) = cut.await {
            self.go_offline_for_good(&e, "truncating a log failed");
            return Err(e);
        }
        self.durable.notify_all();
        Ok(())
    }

    /// Takes the store offline for writes until a restart (see the module documentation,
    /// *Failure*), after `e`.
    fn go_offline_for_good(&self, e: &StorageError, what: &str) {
        let mut inner = self.inner.borrow_mut();
        tracing::error!(error = %e, "{what}; storage of this shard is offline for writes until a restart");
        match &mut inner.offline {
            Some(offline) => {
                offline.reason = e.to_string();
                offline.disk_full = false;
            }
            None => {
                inner.offline = Some(Offline {
                    reason: e.to_string(),
                    disk_full: false,
                    since: Instant::now(),
                })
            }
        }
    }

    /// Waits until the append is durable and visible. Fails if its flush round failed or the
    /// log was removed.
    pub async fn wait_durable(&self, ticket: &AppendTicket) -> Result<(), StorageError> {
        let end = ticket.info.last_offset + 1;
        loop {
            let wait = self.durable.wait();
            let state = self.with_log(ticket.id, |l| (l.high_watermark(), l.discard_generation()))?;
            if state.1 != ticket.discard_generation {
                return Err(self.offline_error());
            }
            if state.0 >= end {
                return Ok(());
            }
            wait.await;
        }
    }

    fn offline_error(&self) -> StorageError {
        match &self.inner.borrow().offline {
            Some(offline) => offline.error(),
            // Its round failed, and the store has been brought back since.
            None => StorageError::Offline {
                reason: "flush failed".to_owned(),
                disk_full: false,
            },
        }
    }

    /// Notified after every flush round: fetch long-polls wait on it and re-check.
    pub fn durable_notify(&self) -> &Notify {
        &self.durable
    }

    /// Whether [`ShardStore::shutdown`] has begun: [`ShardStore::flush_pending`] takes no more
    /// rounds.
    pub fn is_closing(&self) -> bool {
        self.closing.get()
    }

    /// Whether a flush round has work.
    pub fn has_pending(&self) -> bool {
        let inner = self.inner.borrow();
        !inner.dirty.is_empty() || inner.fences_staged > inner.fences_taken
    }

    /// Waits until something is staged.
    pub async fn wait_for_work(&self) {
        loop {
            let wait = self.work.wait();
            if self.has_pending() {
                return;
            }
            wait.await;
        }
    }

    /// One group-commit round (see the module documentation), start to finish and overlapping
    /// nothing: for shutdown, tools and tests. The shard's flusher runs
    /// [`ShardStore::flush_pending`] instead.
    pub async fn flush_round(&self) -> RoundStats {
        let Some(taken) = self.take_round(Take::Alone) else {
            return RoundStats::default();
        };
        let written = self.write_round(taken).await;
        let (stats, discards) = self.sync_and_finish(written).await;
        self.run_discards(discards).await;
        stats
    }

    /// Runs flush rounds while something is staged and returns with no round in flight: after
    /// `max_rounds` rounds, when nothing is staged, or when the flusher has other work (a
    /// directory to sync, a journal to rotate; see [`ShardStore::sync_changed_dirs`] and
    /// [`ShardStore::wants_checkpoint`]). `on_round` sees every finished round.
    ///
    /// Overlap: while a direct round's fsyncs run, what is staged meanwhile is already written
    /// (in pieces of at least [`StoreConfig::overlap_min_bytes`], one write at a time) as the
    /// next round, as long as that round stays direct; when the fsyncs end, the rest staged by
    /// then is written too, and the next round's fsyncs start. A round's copy into the page
    /// cache then runs under the previous round's fsyncs instead of after them, and nothing
    /// staged during a round waits longer than for the round after it. Rounds finish in the
    /// order they were taken, and a round moves its logs' high watermarks only once its own
    /// fsyncs and the round before it are done; if that round fails, the store goes offline and
    /// the next round fails with it (its bytes are cut off once its writes ended).
    pub async fn flush_pending(&self, max_rounds: usize, mut on_round: impl FnMut(&RoundStats)) {
        let mut rounds = 0;
        let mut next: Option<WrittenRound<F>> = None;
        loop {
            let current = match next.take() {
                Some(written) => written,
                None => {
                    if rounds >= max_rounds || self.flusher_should_pause() {
                        return;
                    }
                    let Some(taken) = self.take_round(Take::Alone) else {
                        return;
                    };
                    rounds += 1;
                    self.write_round(taken).await
                }
            };
            let may_overlap = self.config.overlap_min_bytes > 0
                && current.stats.direct
                && current.failure.is_none()
                && !current.syncs.is_empty();
            let finish = self.sync_and_finish(current);
            futures::pin_mut!(finish);
            // The next round, written while `current` syncs, and its write in flight.
            let mut open: Option<WrittenRound<F>> = None;
            let mut writing: Option<Pin<Box<dyn Future<Output = WrittenRound<F>> + '_>>> = None;
            let (stats, discards) = loop {
                if !may_overlap {
                    // A journaled round: nothing to write meanwhile, so appends need not wake us.
                    break finish.as_mut().await;
                }
                let mut work = self.work.wait();
                let open_ok = open.as_ref().is_none_or(|o| o.failure.is_none());
                if writing.is_none()
                    && open_ok
                    && (open.is_some() || rounds < max_rounds)
                    && !self.flusher_should_pause()
                {
                    let logs = open.as_ref().map(WrittenRound::log_ids).unwrap_or_default();
                    let take = Take::Behind {
                        open: &logs,
                        min_bytes: self.config.overlap_min_bytes,
                    };
                    if let Some(taken) = self.take_round(take) {
                        if open.is_none() {
                            rounds += 1;
                        }
                        writing = Some(Box::pin(self.write_round(taken)));
                    }
                }
                let event = std::future::poll_fn(|cx| {
                    if let Poll::Ready(done) = finish.as_mut().poll(cx) {
                        return Poll::Ready(Event::Finished(done));
                    }
                    if let Some(w) = writing.as_mut() {
                        if let Poll::Ready(written) = w.as_mut().poll(cx) {
                            writing = None;
                            return Poll::Ready(Event::Written(written));
                        }
                    }
                    if Pin::new(&mut work).poll(cx).is_ready() {
                        return Poll::Ready(Event::Work);
                    }
                    Poll::Pending
                })
                .await;
                match event {
                    Event::Finished(done) => break done,
                    Event::Written(written) => WrittenRound::add_to(&mut open, written),
                    Event::Work => {}
                }
            };
            if let Some(w) = writing.take() {
                WrittenRound::add_to(&mut open, w.await);
            }
            // What was staged since the last write joins the next round now, as it would join
            // a round taken at this point without overlap.
            if let Some(o) = open.as_mut() {
                if stats.error.is_none() && o.failure.is_none() {
                    let logs = o.log_ids();
                    let take = Take::Behind {
                        open: &logs,
                        min_bytes: 0,
                    };
                    if let Some(taken) = self.take_round(take) {
                        let written = self.write_round(taken).await;
                        o.absorb(written);
                    }
                }
            }
            next = open;
            self.run_discards(discards).await;
            on_round(&stats);
        }
    }

    /// Whether [`ShardStore::flush_pending`] should hand control back to the flusher between
    /// rounds.
    fn flusher_should_pause(&self) -> bool {
        let inner = self.inner.borrow();
        self.closing.get() || !inner.dir_sync_wanted.is_empty() || inner.journal.needs_rotation()
    }

    /// Whether `logs` logs holding `staged` bytes make a direct round by their bytes (see
    /// [`StoreConfig::direct_min_log_bytes`]).
    fn direct_by_bytes(&self, logs: usize, staged: usize) -> bool {
        let c = &self.config;
        c.direct_sync_max_logs > 0
            && c.direct_min_log_bytes > 0
            && staged >= logs.saturating_mul(c.direct_min_log_bytes)
    }

    /// Takes what is staged for a round (see [`Take`]); `None` if there is nothing to take, or
    /// nothing that may be taken now.
    fn take_round(&self, take: Take<'_>) -> Option<TakenRound<F>> {
        let in_flight = self.takes_in_flight.get();
        let overlapping = match take {
            Take::Alone => {
                assert_eq!(
                    in_flight, 0,
                    "flush rounds overlap only as flush_pending runs them"
                );
                false
            }
            Take::Behind { .. } => {
                assert!(in_flight > 0, "an overlapping take needs a round in flight");
                true
            }
        };
        let mut inner = self.inner.borrow_mut();
        let inner = &mut *inner;
        // Truncation fences go in the journal write of a round taken alone: an overlapping
        // take's journal write would go where the open round's does. While one waits, no
        // overlapping round is taken: under a steady load of direct rounds, each written under
        // the previous one's syncs, the fence would wait for the chain to end (at the latest
        // when `flush_pending` has run its `max_rounds`).
        let fences_waiting = inner.fences_staged > inner.fences_taken;
        if overlapping && fences_waiting {
            return None;
        }
        let fences = fences_waiting;
        if inner.dirty.is_empty() && !fences {
            return None;
        }
        let mut staged = 0;
        for id in &inner.dirty {
            staged += entry_mut(&mut inner.slots, *id).map_or(0, |e| e.log.staged_bytes());
        }
        if let Take::Behind { open, min_bytes } = take {
            let added = inner.dirty.iter().filter(|id| !open.contains(id)).count();
            // The logs it adds to the open round must qualify for a direct round by themselves.
            if open.len() + added > self.config.direct_sync_max_logs && !self.direct_by_bytes(added, staged) {
                return None;
            }
            if staged == 0 || staged < min_bytes {
                return None;
            }
        }
        // Direct: few logs, so syncing their own files costs no more than the journal, and
        // writes every byte once instead of twice; or many logs with enough bytes each
        // (`direct_min_log_bytes`). Also while a checkpoint runs: the segments
        // whose fsync it has taken over but not finished are synced by the round as well
        // (`checkpoint_syncing`). Not when a log's directory has changes no sync has covered yet
        // (a removed segment, a file created by a journaled round): the journal covers them
        // until a directory sync does. A round that creates a segment file itself (a roll) syncs
        // the directory after it; not an overlapping one.
        let mut direct = inner.dirty.len() <= self.config.direct_sync_max_logs
            || self.direct_by_bytes(inner.dirty.len(), staged);
        let mut direct_files = Vec::new();
        if direct {
            for id in &inner.dirty {
                match entry_mut(&mut inner.slots, *id).map(|e| e.log.direct_sync()) {
                    Some(Some(sync)) if overlapping && sync.creates_at.is_some() => direct = false,
                    Some(Some(sync)) => direct_files.push(Some(sync)),
                    Some(None) => {
                        direct = false;
                        // A running checkpoint syncs the directory itself, and no directory
                        // sync may run beside it: asking for one would pause the flusher
                        // (`flusher_should_pause`) until the checkpoint ends.
                        if !self.checkpoint_running.get() && !inner.dir_sync_wanted.contains(id) {
                            inner.dir_sync_wanted.push(*id);
                        }
                    }
                    None => direct_files.push(None),
                }
            }
        }
        if overlapping && !direct {
            return None;
        }
        let dirty = std::mem::take(&mut inner.dirty);
        let mut direct_files = direct_files.into_iter();
        let mut writes = Vec::with_capacity(dirty.len());
        for id in dirty {
            let sync = direct_files.next().flatten();
            if let Some(entry) = entry_mut(&mut inner.slots, id) {
                entry.dirty = false;
                if let Some(w) = entry.log.take_staged() {
                    let sync = if direct {
                        let (files, dir_at) = sync.map_or((Vec::new(), None), |s| (s.files, s.creates_at));
                        Some(LogSyncs {
                            id,
                            files,
                            dir: entry.log.dir().to_path_buf(),
                            dir_at,
                            cuts_at: entry.log.cuts(),
                        })
                    } else {
                        for chunk in &w.chunks {
                            inner.journal.stage_batches(&entry.key, chunk.data.data());
                        }
                        None
                    };
                    writes.push(LogRound {
                        id,
                        io: LogIoGuard::new(&entry.io_users, &self.io_released),
                        writes: w,
                        syncs: sync,
                    });
                }
            }
        }
        // (An overlapping take is direct and stages no journal entries.)
        let journal_write = if overlapping {
            None
        } else {
            inner.journal.take_pending()
        };
        let fences_upto = fences.then(|| {
            inner.fences_taken = inner.fences_staged;
            inner.fences_staged
        });
        if writes.is_empty() && fences_upto.is_none() {
            return None;
        }
        self.takes_in_flight.set(in_flight + 1);
        let started = Instant::now();
        let wait_us = writes
            .iter()
            .filter_map(|w| w.writes.staged_at)
            .map(|t| started.saturating_duration_since(t).as_micros() as u64)
            .max()
            .unwrap_or(0);
        Some(TakenRound {
            started,
            wait_us,
            direct,
            overlapped: overlapping,
            journal_write,
            fences_upto,
            logs: writes,
        })
    }

    /// A round's writes: the journal entries (written and synced) and the segment chunks, all at
    /// once. A direct round's segment fsyncs are left to [`ShardStore::sync_round`].
    async fn write_round(&self, taken: TakenRound<F>) -> WrittenRound<F> {
        let TakenRound {
            started,
            wait_us,
            direct,
            overlapped,
            journal_write,
            fences_upto,
            logs: writes,
        } = taken;
        let mut stats = RoundStats {
            logs: writes.len(),
            direct,
            overlapped,
            writes: 1,
            wait_us,
            ..RoundStats::default()
        };
        let journal = async {
            let Some(crate::journal::PendingWrite {
                file: jfile,
                position: jpos,
                data: jdata,
                path: jpath,
            }) = journal_write
            else {
                return Ok::<(u64, u64), StorageError>((0, 0));
            };
            let jlen = jfile
                .write_pieces_at(jdata, jpos)
                .await
                .map_err(|e| StorageError::io("write journal", &jpath, e))?;
            let t = Instant::now();
            jfile
                .fdatasync()
                .await
                .map_err(|e| StorageError::io("sync journal", &jpath, e))?;
            Ok((jlen, t.elapsed().as_micros() as u64))
        };
        let mut segment_futs = Vec::with_capacity(writes.len());
        let mut io = Vec::with_capacity(writes.len());
        for LogRound {
            id,
            io: guard,
            writes: w,
            syncs: sync,
        } in writes
        {
            io.push(guard);
            stats.segment_bytes += w.chunks.iter().map(|c| c.data.len()).sum::<usize>();
            let fs = self.fs.clone();
            let end = w.end_offset;
            segment_futs.push(async move {
                let done = write_chunks(&fs, w.chunks).await?;
                Ok::<_, StorageError>((id, end, done, sync))
            });
        }
        let (journal_result, segment_results) = futures::join!(journal, join_all(segment_futs));
        let mut failure = None;
        let mut journal_bytes = 0;
        match journal_result {
            Ok((len, fsync_us)) => {
                journal_bytes = len;
                stats.fsync_us = fsync_us;
            }
            Err(e) => failure = Some(e),
        }
        let mut parts = Vec::with_capacity(segment_results.len());
        let mut syncs = Vec::new();
        for r in segment_results {
            match r {
                Ok((id, end, done, sync)) => {
                    if let Some(mut sync) = sync {
                        for d in &done {
                            if !sync.files.iter().any(|f| Rc::ptr_eq(f, &d.file)) {
                                sync.files.push(d.file.clone());
                            }
                        }
                        syncs.push(sync);
                    }
                    parts.push((id, end, done));
                }
                Err(e) => note_failure(&mut failure, e),
            }
        }
        WrittenRound {
            started,
            stats,
            parts,
            syncs,
            dir_synced: Vec::new(),
            synced: Vec::new(),
            journal_bytes,
            failure,
            takes: 1,
            fences_upto,
            io,
        }
    }

    /// A direct round's fsyncs: for each log, every file it must sync, logs concurrently.
    async fn sync_round(&self, round: &mut WrittenRound<F>) {
        if round.failure.is_some() || round.syncs.is_empty() {
            return;
        }
        if self.offline().is_some() {
            // The round before failed and threw this one's appends away.
            round.failure = Some(self.offline_error());
            return;
        }
        let syncs = std::mem::take(&mut round.syncs);
        let fs = &self.fs;
        // Many logs: one file-system sync writes back every file and flushes the device once,
        // where an fsync per file flushes it once per file (BENCHMARKS.md#syncfs-rounds). It also
        // covers whatever else the file system holds unsynced, which is only more than needed.
        let by_filesystem = syncs.len() > self.config.direct_sync_max_logs;
        if by_filesystem {
            round.stats.syncfs = true;
            let t = Instant::now();
            if syncs.iter().any(|s| !s.files.is_empty()) {
                if let Err(e) = self.sync_whole_filesystem().await {
                    round.failure = Some(e);
                    return;
                }
            }
            round.stats.fsync_us = t.elapsed().as_micros() as u64;
        }
        let results = join_all(syncs.into_iter().map(|sync| async move {
            let t = Instant::now();
            let files = if by_filesystem { &[][..] } else { &sync.files[..] };
            for f in files {
                f.fdatasync()
                    .await
                    .map_err(|e| StorageError::io("sync segment", &sync.dir, e))?;
            }
            // A segment file this round created is named durably only once its directory is
            // synced, after the creation.
            let mut dir_synced = None;
            if let Some(at) = sync.dir_at {
                fs.sync_dir(&sync.dir)
                    .await
                    .map_err(|e| StorageError::io("sync log directory", &sync.dir, e))?;
                dir_synced = Some((sync.id, at));
            }
            Ok::<_, StorageError>((t.elapsed().as_micros() as u64, dir_synced, sync))
        }))
        .await;
        for r in results {
            match r {
                Ok((us, dir_synced, synced)) => {
                    round.stats.fsync_us = round.stats.fsync_us.max(us);
                    round.dir_synced.extend(dir_synced);
                    round.synced.push(synced);
                }
                Err(e) => note_failure(&mut round.failure, e),
            }
        }
    }

    async fn sync_and_finish(&self, mut round: WrittenRound<F>) -> (RoundStats, Vec<DiscardPlan<F::File>>) {
        self.sync_round(&mut round).await;
        self.finish_round(round)
    }

    /// Ends a round whose I/O is done. Success: its logs' high watermarks move and waiters are
    /// woken. Failure (its own, or an earlier round's that took the store offline): the store
    /// goes offline for writes and everything not yet durable is thrown away in memory; the
    /// returned plans cut the files back and must run once no round's writes are in flight.
    fn finish_round(&self, round: WrittenRound<F>) -> (RoundStats, Vec<DiscardPlan<F::File>>) {
        let WrittenRound {
            started,
            mut stats,
            parts,
            journal_bytes,
            mut failure,
            takes,
            dir_synced,
            synced,
            fences_upto,
            ..
        } = round;
        let mut discards = Vec::new();
        {
            let mut inner = self.inner.borrow_mut();
            let inner = &mut *inner;
            if failure.is_none() {
                if let Some(offline) = &inner.offline {
                    failure = Some(offline.error());
                }
            }
            if let Some(err) = &failure {
                let reason = err.to_string();
                let disk_full = err.refused_for_space();
                match &mut inner.offline {
                    None => {
                        if disk_full {
                            tracing::error!(error = %reason, resume_free_bytes = self.config.resume_free_bytes, "flush round failed: the disk is full; storage of this shard is offline for writes until the file system has space again");
                        } else {
                            tracing::error!(error = %reason, "flush round failed; storage of this shard is offline for writes until a restart");
                        }
                        inner.offline = Some(Offline {
                            reason: reason.clone(),
                            disk_full,
                            since: Instant::now(),
                        });
                    }
                    // A round that overlapped a round failing for space failed otherwise: free
                    // space cures the store no more.
                    Some(offline)
                        if offline.disk_full
                            && !disk_full
                            && !matches!(err, StorageError::Offline { .. }) =>
                    {
                        tracing::error!(error = %reason, "flush round failed; storage of this shard stays offline for writes until a restart");
                        offline.reason = reason.clone();
                        offline.disk_full = false;
                    }
                    Some(_) => {}
                }
                stats.error = Some(reason);
                // Nothing of this round or staged after it was acknowledged: throw it away.
                for slot in inner.slots.iter_mut() {
                    if let Some(entry) = slot.entry.as_mut() {
                        if entry.log.has_staged() || entry.log.high_watermark() < entry.log.log_end_offset() {
                            discards.push(entry.log.discard_unflushed());
                        }
                        entry.dirty = false;
                    }
                }
                inner.dirty.clear();
                let _ = inner.journal.take_pending();
            } else {
                stats.journal_bytes = journal_bytes as usize;
                inner.journal.advance(journal_bytes);
                if let Some(upto) = fences_upto {
                    inner.fences_durable = inner.fences_durable.max(upto);
                }
                // A directory sync after this round's creations covers them only if the log's
                // directory did not change otherwise since the round took its writes (its own
                // creations are counted below, as they complete).
                let covered: Vec<LogId> = dir_synced
                    .iter()
                    .filter(|(id, at)| {
                        entry_mut(&mut inner.slots, *id).is_some_and(|e| e.log.dir_changes() == *at)
                    })
                    .map(|(id, _)| *id)
                    .collect();
                for (id, end, chunks) in parts {
                    if let Some(entry) = entry_mut(&mut inner.slots, id) {
                        entry.log.complete_round(end, chunks);
                    }
                }
                // After `complete_round`, which marks every file it wrote as needing a sync.
                for sync in synced {
                    if let Some(entry) = entry_mut(&mut inner.slots, sync.id) {
                        entry.log.rolled_segments_synced(&sync.files, sync.cuts_at);
                    }
                }
                for id in covered {
                    if let Some(entry) = entry_mut(&mut inner.slots, id) {
                        let changes = entry.log.dir_changes();
                        entry.log.dir_synced(changes);
                    }
                }
            }
        }
        self.takes_in_flight
            .set(self.takes_in_flight.get().saturating_sub(takes));
        stats.duration_us = started.elapsed().as_micros() as u64;
        // A failure wakes its waiters once its discards have run (`run_discards`), or now if
        // there are none (a truncation waiting for its fence).
        if stats.error.is_none() || discards.is_empty() {
            self.durable.notify_all();
        }
        (stats, discards)
    }

    /// Cuts files back after a failed round, then wakes the appends it failed.
    async fn run_discards(&self, discards: Vec<DiscardPlan<F::File>>) {
        if discards.is_empty() {
            return;
        }
        self.discarding.set(self.discarding.get() + 1);
        for d in discards {
            d.run(&self.fs).await;
        }
        self.discarding.set(self.discarding.get() - 1);
        self.durable.notify_all();
    }

    /// Takes writes again after a full disk took the store offline, once the file system has
    /// [`StoreConfig::resume_free_bytes`] available: the shard's housekeeping calls this about
    /// once a second while the store is offline.
    ///
    /// The failed round left the store in memory as a restart's recovery would: every log ends
    /// at its high watermark, with nothing staged, its producer state and leader epochs cut to
    /// it ([`PartitionLog::discard_unflushed`]), and the journal's pending entries dropped. This
    /// makes the files say the same, durably, before any offset above a high watermark is given
    /// out again (those were never acknowledged nor visible, as after a restart): the journal
    /// file is cut back to the end of its synced entries (a failed round may have written whole
    /// entries past it), and each log that discarded a tail loses its segment files past the
    /// active segment, which is cut to its data (giving back the space it reserved ahead) and
    /// synced, with its directory ([`ResumeCut`]). Idle while a round, a discard, a checkpoint
    /// or segment removals run. A failure leaves the store offline: a write refused for space
    /// is tried again at the next call, any other error keeps it offline until a restart.
    pub async fn try_resume(&self) -> ResumeOutcome {
        match self.offline() {
            None => return ResumeOutcome::Online,
            Some(o) if !o.disk_full => return ResumeOutcome::NotResumable,
            Some(_) => {}
        }
        let space = match self.fs.space(&self.root).await {
            Ok(space) => space,
            Err(e) => return ResumeOutcome::Failed(StorageError::io("check free space", &self.root, e)),
        };
        let enough = space.available_bytes >= self.config.resume_free_bytes
            && space.available_inodes.is_none_or(|i| i >= RESUME_MIN_FREE_INODES);
        if !enough {
            return ResumeOutcome::WaitingForSpace(space);
        }
        let busy = || self.closing.get() || self.takes_in_flight.get() > 0 || self.discarding.get() > 0;
        if busy() {
            return ResumeOutcome::Busy;
        }
        // No checkpoint, retention or DeleteRecords beside the cuts.
        let _segments = self.segments_lock.lock().await;
        // Appends are refused while offline: no round can have started meanwhile.
        if busy() {
            return ResumeOutcome::Busy;
        }
        let Some(since) = self.offline().filter(|o| o.disk_full).map(|o| o.since) else {
            return ResumeOutcome::NotResumable;
        };
        let (journal, cuts) = {
            let mut inner = self.inner.borrow_mut();
            let inner = &mut *inner;
            let cuts: Vec<(LogId, ResumeCut<F::File>, LogIoGuard)> = entries_mut(&mut inner.slots)
                .filter_map(|(id, entry)| {
                    let cut = entry.log.resume_cut()?;
                    Some((id, cut, LogIoGuard::new(&entry.io_users, &self.io_released)))
                })
                .collect();
            (inner.journal.synced_end(), cuts)
        };
        let logs_cut = cuts.len();
        let cut = async {
            let (file, end, path) = journal;
            file.truncate(end)
                .await
                .map_err(|e| StorageError::io("cut journal", &path, e))?;
            file.fdatasync()
                .await
                .map_err(|e| StorageError::io("sync journal", &path, e))?;
            for (id, cut, _io) in cuts {
                let done = cut.run(&self.fs).await?;
                if let Some(entry) = entry_mut(&mut self.inner.borrow_mut().slots, id) {
                    entry.log.resume_cut_done(done);
                }
            }
            Ok::<(), StorageError>(())
        };
        if let Err(e) = cut.await {
            let mut inner = self.inner.borrow_mut();
            if let Some(offline) = inner.offline.as_mut().filter(|_| !e.refused_for_space()) {
                tracing::error!(error = %e, "could not bring storage back after a full disk; it stays offline for writes until a restart");
                offline.reason = e.to_string();
                offline.disk_full = false;
            }
            return ResumeOutcome::Failed(e);
        }
        self.inner.borrow_mut().offline = None;
        ResumeOutcome::Resumed {
            offline_for: since.elapsed(),
            logs_cut,
            space,
        }
    }

    /// Syncs the directories of logs that a round journaled only because of directory changes
    /// no sync covered yet (a removed segment, a file a journaled round created), so that their next
    /// rounds can be direct again instead of writing every byte twice until the next
    /// checkpoint. A directory sync covers the changes made before it starts, as the checkpoint's
    /// does. Run by the flusher between rounds, not while a checkpoint runs (it would not know
    /// which changes the checkpoint's own sync covers); a failure only leaves the log journaled
    /// until the checkpoint. Returns how many directories were synced.
    pub async fn sync_changed_dirs(&self) -> usize {
        if self.checkpoint_running.get() || self.takes_in_flight.get() > 0 {
            return 0;
        }
        let wanted: Vec<(LogId, PathBuf, u64, LogIoGuard)> = {
            let mut inner = self.inner.borrow_mut();
            let inner = &mut *inner;
            std::mem::take(&mut inner.dir_sync_wanted)
                .into_iter()
                .filter_map(|id| {
                    let entry = entry_mut(&mut inner.slots, id)?;
                    let changes = entry.log.unsynced_dir_changes()?;
                    let io = LogIoGuard::new(&entry.io_users, &self.io_released);
                    Some((id, entry.log.dir().to_path_buf(), changes, io))
                })
                .collect()
        };
        let mut synced = 0;
        for (id, dir, changes, _io) in wanted {
            match self.fs.sync_dir(&dir).await {
                Ok(()) => {
                    if let Some(entry) = entry_mut(&mut self.inner.borrow_mut().slots, id) {
                        entry.log.dir_synced(changes);
                    }
                    synced += 1;
                }
                Err(e) => {
                    tracing::warn!(dir = %dir.display(), error = %e, "directory sync failed; the log stays journaled until the next checkpoint");
                }
            }
        }
        synced
    }

    /// Whether the journal has grown enough to rotate and checkpoint.
    pub fn wants_checkpoint(&self) -> bool {
        self.inner.borrow().journal.needs_rotation()
    }

    /// Whether any log changed since its last checkpoint.
    pub fn has_uncheckpointed_changes(&self) -> bool {
        let inner = self.inner.borrow();
        inner.journal.has_entries()
            || inner
                .slots
                .iter()
                .filter_map(|s| s.entry.as_ref())
                .any(|e| e.log.needs_checkpoint())
    }

    /// Starts a new journal file (a recycled one when a checkpoint left one); the current one is
    /// retired, and recycled or deleted by the next successful [`ShardStore::checkpoint`].
    /// Only the flusher calls this, between rounds.
    pub async fn rotate_journal(&self) -> Result<(), StorageError> {
        // Offline, the current file may hold a failed round's entries past its synced end, which
        // `try_resume` cuts off: it must still be the current file then.
        if !self.inner.borrow().journal.has_entries() || self.offline().is_some() {
            return Ok(());
        }
        assert!(
            self.takes_in_flight.get() == 0,
            "rotate the journal between rounds only"
        );
        let (dir, shard, seq) = self.inner.borrow().journal.next_file();
        let free = self.inner.borrow_mut().journal.take_free();
        let (file, path) = match free {
            Some(free) => Journal::recycle_file(&self.fs, &dir, shard, seq, &free).await?,
            None => Journal::new_file(&self.fs, &dir, shard, seq).await?,
        };
        assert!(
            self.takes_in_flight.get() == 0,
            "rotate the journal between rounds only"
        );
        self.inner.borrow_mut().journal.install(file, path, seq);
        Ok(())
    }

    /// Makes every log durable up to its high watermark in its own files (segments, indexes,
    /// recovery point), then deletes the retired journal files, whose entries are all below
    /// those high watermarks. May run while flush rounds continue.
    pub async fn checkpoint(&self) -> Result<CheckpointStats, StorageError> {
        if self.checkpoint_running.replace(true) {
            return Ok(CheckpointStats::default());
        }
        let segments = self.segments_lock.lock().await;
        let result = self.checkpoint_inner().await;
        drop(segments);
        self.checkpoint_running.set(false);
        result
    }

    async fn checkpoint_inner(&self) -> Result<CheckpointStats, StorageError> {
        let started = Instant::now();
        let mut stats = CheckpointStats::default();
        // 2. Collect the work (synchronously).
        let (retired, works) = {
            let mut inner = self.inner.borrow_mut();
            let retired = inner.journal.take_retired();
            let mut works: Vec<(LogId, CheckpointWork<F::File>)> = Vec::new();
            for (slot_idx, slot) in inner.slots.iter_mut().enumerate() {
                if let Some(entry) = slot.entry.as_mut() {
                    if entry.log.needs_checkpoint() {
                        let mut work = entry.log.checkpoint_work();
                        work.io = Some(LogIoGuard::new(&entry.io_users, &self.io_released));
                        works.push((
                            LogId {
                                slot: slot_idx as u32,
                                generation: slot.generation,
                            },
                            work,
                        ));
                    }
                }
            }
            (retired, works)
        };
        stats.logs = works.len();
        // 3. Do the I/O, a bounded number of logs at a time.
        let mut failed = None;
        let mut done = Vec::with_capacity(works.len());
        if self.syncs_filesystem_for(works.len()) {
            stats.syncfs = true;
            self.checkpoint_by_filesystem(works, &mut done, &mut failed).await;
        } else {
            let fs = &self.fs;
            let concurrency = self.config.checkpoint_concurrency;
            let points = for_each_work(works, concurrency, |w| w.run(fs), &mut done, &mut failed).await;
            done.extend(points.into_iter().map(|(id, point)| (id, Ok(point))));
        }
        // 4. Record the results.
        {
            let mut inner = self.inner.borrow_mut();
            for (id, r) in done {
                if let Some(entry) = entry_mut(&mut inner.slots, id) {
                    match r {
                        Ok(point) => entry.log.checkpoint_done(point),
                        Err(()) => entry.log.checkpoint_failed(),
                    }
                }
            }
            if failed.is_some() {
                inner.journal.unretire(retired.clone());
            }
        }
        if let Some(reason) = failed {
            return Err(StorageError::Checkpoint(reason));
        }
        // 5. The retired journal files are covered: keep some to recycle, delete the rest. A
        // rename or deletion lost in a crash leaves a covered file to replay, which is harmless.
        for path in &retired {
            let free = self.inner.borrow().journal.free_path_for(path);
            if let Some(free) = free {
                match self.fs.rename(path, &free).await {
                    Ok(()) => {
                        self.inner.borrow_mut().journal.add_free(free);
                        stats.journal_files_recycled += 1;
                        continue;
                    }
                    Err(e) => {
                        tracing::warn!(path = %path.display(), error = %e, "could not keep a checkpointed journal file to recycle")
                    }
                }
            }
            if let Err(e) = self.fs.remove_file(path).await {
                tracing::warn!(path = %path.display(), error = %e, "could not delete a checkpointed journal file");
            } else {
                stats.journal_files_deleted += 1;
            }
        }
        stats.duration_us = started.elapsed().as_micros() as u64;
        Ok(stats)
    }

    /// A checkpoint of many logs: every log's files written without an fsync, one sync of the
    /// file system; new epoch files and new index files renamed into place and another sync
    /// (if there were any);
    /// then every recovery point, and a last sync. Four to seven fsyncs per log (segments, two
    /// indexes, the recovery point; a new epoch file and its directory; the directory of new
    /// files) become two or three file-system syncs, which is what a clean stop of 10,000
    /// partitions spent its time on (BENCHMARKS.md#checkpoint-syncfs). A file-system sync writes back
    /// directory entries too, so no directory is synced on its own.
    async fn checkpoint_by_filesystem(
        &self,
        works: Vec<(LogId, CheckpointWork<F::File>)>,
        done: &mut Vec<(LogId, Result<RecoveryPoint, ()>)>,
        failed: &mut Option<String>,
    ) {
        if works.is_empty() {
            return;
        }
        let concurrency = self.config.checkpoint_concurrency.max(1);
        let fs = &self.fs;
        let started = Instant::now();
        let mut marks: Vec<(&str, u64)> = Vec::with_capacity(6);
        let mut mark = |stage: &'static str| marks.push((stage, started.elapsed().as_millis() as u64));
        let step = |mut w: CheckpointWork<F::File>| async move { w.write_files(fs, false).await.map(|()| w) };
        let written = for_each_work(works, concurrency, step, done, failed).await;
        mark("files written");
        if let Err(e) = self.sync_whole_filesystem().await {
            return fail_all(&e, written, done, failed);
        }
        mark("synced");
        // New epoch and index files are durable beside their names: rename them into place,
        // and sync again.
        let step = |mut w: CheckpointWork<F::File>| async move {
            let renamed = w.rename_files(fs).await?;
            Ok::<_, StorageError>((w, renamed))
        };
        let written = for_each_work(written, concurrency, step, done, failed).await;
        let renamed = written.iter().any(|(_, (_, renamed))| *renamed);
        let written: Vec<_> = written.into_iter().map(|(id, (w, _))| (id, w)).collect();
        if renamed {
            mark("files renamed");
            if let Err(e) = self.sync_whole_filesystem().await {
                return fail_all(&e, written, done, failed);
            }
            mark("synced");
        }
        // The files the points vouch for are durable: the points may be written now.
        let step = |w: CheckpointWork<F::File>| w.write_point(fs, false);
        let pointed = for_each_work(written, concurrency, step, done, failed).await;
        mark("points written");
        let last = self.sync_whole_filesystem().await;
        mark("synced");
        tracing::debug!(logs = done.len() + pointed.len(), stages_ms = ?marks, "checkpoint by file-system sync");
        match last {
            Ok(()) => done.extend(pointed.into_iter().map(|(id, point)| (id, Ok(point)))),
            Err(e) => fail_all(&e, pointed, done, failed),
        }
    }

    /// `syncfs` of the file system holding the store's root (every log lives there), then an
    /// fsync of the root: on ext4 without a journal, `syncfs` writes inode blocks after its
    /// device flush, and any fsync flushes again. Used by flush rounds of many logs and by
    /// checkpoints of many logs. Through the root, not a log's directory, which a topic
    /// deletion may remove while a round or checkpoint of that log is in flight.
    async fn sync_whole_filesystem(&self) -> Result<(), StorageError> {
        let dir = &self.root;
        self.fs
            .sync_filesystem(dir)
            .await
            .map_err(|e| StorageError::io("sync file system", dir, e))?;
        self.fs
            .sync_dir(dir)
            .await
            .map_err(|e| StorageError::io("sync log directory", dir, e))
    }

    /// Applies retention to every log; returns what each pass deleted (logs with deletions only).
    pub async fn retention_pass(&self, now_ms: i64) -> Vec<(LogId, RetentionOutcome)> {
        let _segments = self.segments_lock.lock().await;
        let plans: Vec<(LogId, PathBuf, RetentionOutcome, LogIoGuard)> = {
            let mut inner = self.inner.borrow_mut();
            entries_mut(&mut inner.slots)
                .filter_map(|(id, entry)| {
                    let outcome = entry.log.plan_retention(now_ms);
                    (!outcome.deleted.is_empty()).then(|| {
                        (
                            id,
                            entry.log.dir().to_path_buf(),
                            outcome,
                            LogIoGuard::new(&entry.io_users, &self.io_released),
                        )
                    })
                })
                .collect()
        };
        let mut out = Vec::with_capacity(plans.len());
        for (id, dir, outcome, _io) in plans {
            for base in &outcome.deleted {
                remove_segment_files(&self.fs, &dir, *base).await;
            }
            out.push((id, outcome));
        }
        out
    }

    /// Sets the offset below which retention may delete segments of `id` (`None`: no floor).
    pub fn set_retention_floor(&self, id: LogId, floor: Option<i64>) -> Result<(), StorageError> {
        self.with_entry(id, |e| e.log.set_retention_floor(floor))
    }

    /// DeleteRecords: moves the log start offset to `offset` (durably) and deletes whole
    /// segments below it. Returns the new log start offset.
    pub async fn delete_records(&self, id: LogId, offset: i64) -> Result<i64, StorageError> {
        // One at a time: concurrent calls for one log would race on the start-offset file's
        // temporary (and could install an older offset over a newer one).
        let _segments = self.segments_lock.lock().await;
        let (moves, dir, _io) = self.with_entry(id, |e| {
            let io = LogIoGuard::new(&e.io_users, &self.io_released);
            (
                e.log.check_log_start_offset(offset),
                e.log.dir().to_path_buf(),
                io,
            )
        })?;
        if moves? {
            persist_log_start_offset(&self.fs, &dir, offset).await?;
            let deleted = self.with_entry(id, |e| e.log.advance_log_start_offset(offset))?;
            for base in deleted {
                remove_segment_files(&self.fs, &dir, base).await;
            }
        }
        self.with_log(id, |l| l.log_start_offset())
    }

    /// Drops producers idle longer than `expiration_ms` from every log's producer state, and the
    /// least recently active beyond `max_per_log`. Returns how many were dropped.
    pub fn expire_producers(&self, now_ms: i64, expiration_ms: i64, max_per_log: usize) -> usize {
        let mut inner = self.inner.borrow_mut();
        inner
            .slots
            .iter_mut()
            .filter_map(|s| s.entry.as_mut())
            .map(|e| e.log.expire_producers(now_ms, expiration_ms, max_per_log))
            .sum()
    }

    /// The producer-sequence check of a batch, without appending it
    /// ([`PartitionLog::check_producer`]).
    pub fn check_producer(
        &self,
        id: LogId,
        batch: &[u8],
    ) -> Result<crate::producer::ProducerCheck, StorageError> {
        self.with_log(id, |l| l.check_producer(batch))?
    }

    /// Sets the commit cap of a replicated log ([`PartitionLog::set_commit_cap`]) and wakes
    /// whoever waits for data ([`ShardStore::durable_notify`]) if it moved.
    pub fn set_commit_cap(&self, id: LogId, cap: Option<i64>) -> Result<(), StorageError> {
        let moved = self.with_entry(id, |e| {
            let moved = e.log.commit_cap() != cap;
            e.log.set_commit_cap(cap);
            moved
        })?;
        if moved {
            self.durable.notify_all();
        }
        Ok(())
    }

    /// Plans a replica's read of its own log, up to the durable end whatever the commit cap
    /// ([`PartitionLog::plan_replica_read`]).
    pub fn plan_replica_read(
        &self,
        id: LogId,
        offset: i64,
        max_bytes: usize,
    ) -> Result<Option<ReadPlan<F::File>>, StorageError> {
        self.with_log(id, |l| l.plan_replica_read(offset, max_bytes))?
    }

    /// Plans a client's read (see [`PartitionLog::plan_read`]), below the visible end; execute
    /// it with [`ReadPlan::execute`].
    pub fn plan_read(
        &self,
        id: LogId,
        offset: i64,
        max_bytes: usize,
    ) -> Result<Option<ReadPlan<F::File>>, StorageError> {
        self.with_log(id, |l| l.plan_read(offset, max_bytes))?
    }

    /// Plans a ListOffsets timestamp lookup; `timestamp` -3 means the largest timestamp.
    pub fn timestamp_plan(
        &self,
        id: LogId,
        timestamp: i64,
    ) -> Result<Option<crate::TimestampPlan<F::File>>, StorageError> {
        self.with_log(id, |l| {
            if timestamp == -3 {
                l.max_timestamp_plan()
            } else {
                Some(l.timestamp_plan(timestamp))
            }
        })
    }

    /// Flushes what is staged and checkpoints everything, so that the next start needs no
    /// journal replay and no validation. Call once appends have stopped. Returns the final
    /// checkpoint's figures.
    pub async fn shutdown(&self) -> Result<CheckpointStats, StorageError> {
        // The flusher may be in a round: let it finish, and start no more.
        self.closing.set(true);
        while self.takes_in_flight.get() > 0 {
            let wait = self.durable.wait();
            if self.takes_in_flight.get() == 0 {
                break;
            }
            wait.await;
        }
        while self.has_pending() && self.offline_reason().is_none() {
            self.flush_round().await;
        }
        if self.offline_reason().is_none() {
            self.rotate_journal().await?;
        }
        // Active segments give back the space they reserved, which the next start would
        // otherwise read through to find where their data ends; the checkpoint syncs the cut.
        for slot in self.inner.borrow_mut().slots.iter_mut() {
            if let Some(entry) = slot.entry.as_mut() {
                entry.log.seal_active();
            }
        }
        let stats = self.checkpoint().await?;
        let path = self.inner.borrow().journal.path().to_path_buf();
        if self.offline_reason().is_none() {
            self.fs
                .remove_file(&path)
                .await
                .map_err(|e| StorageError::io("remove journal", &path, e))?;
            let free = self.inner.borrow_mut().journal.take_all_free();
            for free in free {
                self.fs
                    .remove_file(&free)
                    .await
                    .map_err(|e| StorageError::io("remove free journal file", &free, e))?;
            }
            let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
            self.fs
                .sync_dir(&dir)
                .await
                .map_err(|e| StorageError::io("sync journal dir", &dir, e))?;
        }
        Ok(stats)
    }

    /// Current journal file size (for metrics).
    pub fn journal_bytes(&self) -> u64 {
        self.inner.borrow().journal.size()
    }

    /// Number of registered logs.
    pub fn log_count(&self) -> usize {
        self.inner
            .borrow()
            .slots
            .iter()
            .filter(|s| s.entry.is_some())
            .count()
    }

    /// Approximate heap memory used by all logs' in-memory state.
    pub fn heap_bytes(&self) -> usize {
        self.inner
            .borrow()
            .slots
            .iter()
            .filter_map(|s| s.entry.as_ref())
            .map(|e| e.log.heap_bytes() + e.key.dir_name.len() + 64)
            .sum()
    }
}

/// Runs `step` on every log's checkpoint work, `concurrency` logs at a time. Returns what the
/// steps that succeeded gave back; a log whose step failed is recorded in `done` as failed and
/// its error in `failed` (the first one).
async fn for_each_work<W, T, Fut>(
    works: Vec<(LogId, W)>,
    concurrency: usize,
    step: impl Fn(W) -> Fut,
    done: &mut Vec<(LogId, Result<RecoveryPoint, ()>)>,
    failed: &mut Option<String>,
) -> Vec<(LogId, T)>
where
    Fut: Future<Output = Result<T, StorageError>>,
{
    let mut out = Vec::with_capacity(works.len());
    let mut it = works.into_iter();
    loop {
        let batch: Vec<_> = it.by_ref().take(concurrency.max(1)).collect();
        if batch.is_empty() {
            break;
        }
        let results = join_all(batch.into_iter().map(|(id, w)| {
            let fut = step(w);
            async move { (id, fut.await) }
        }))
        .await;
        for (id, r) in results {
            match r {
                Ok(t) => out.push((id, t)),
                Err(e) => {
                    failed.get_or_insert(e.to_string());
                    done.push((id, Err(())));
                }
            }
        }
    }
    out
}

/// Records every log of `works` as failed, and `e` as the checkpoint's error unless one came
/// first.
fn fail_all<W>(
    e: &StorageError,
    works: Vec<(LogId, W)>,
    done: &mut Vec<(LogId, Result<RecoveryPoint, ()>)>,
    failed: &mut Option<String>,
) {
    failed.get_or_insert(e.to_string());
    done.extend(works.into_iter().map(|(id, _)| (id, Err(()))));
}

const PARTITION_METADATA: &str = "partition.metadata";

/// Creates (or checks) a log directory and its `partition.metadata` (Kafka's format: version and
/// base64 topic id). A directory left by a deleted topic of the same name (another topic id) is
/// moved aside for deletion first. A directory name may have several components
/// (`__queue_state/orders-0/default`). With `sync`, every directory created on the way is made
/// durable in its parent, and the metadata file too; without, the caller syncs the file system
/// before anything is written to the log.
async fn prepare_log_dir<F: Fs>(
    fs: &F,
    root: &Path,
    dir: &Path,
    key: &LogKey,
    sync: bool,
) -> Result<(), StorageError> {
    let meta_path = dir.join(PARTITION_METADATA);
    let expected = partition_metadata(&key.incarnation);
    if fs.exists(dir).await {
        match fs.read_file(&meta_path).await {
            Ok(existing) if existing[..] == expected[..] => return Ok(()),
            Ok(_) => {
                tracing::warn!(dir = %dir.display(), "log directory belongs to an older topic with the same name; removing it");
                let root = dir.parent().map(Path::to_path_buf).unwrap_or_default();
                delete_log_dir(fs, &root, dir).await?;
            }
            Err(_) => {}
        }
    }
    let mut created = Vec::new();
    let mut d = dir;
    while d != root && d.starts_with(root) && !fs.exists(d).await {
        created.push(d.to_path_buf());
        match d.parent() {
            Some(p) => d = p,
            None => break,
        }
    }
    fs.create_dir_all(dir)
        .await
        .map_err(|e| StorageError::io("create log directory", dir, e))?;
    if !sync {
        let (_, tmp) = fs
            .write_tmp_file(&meta_path, expected)
            .await
            .map_err(|e| StorageError::io("write partition metadata", &meta_path, e))?;
        return fs
            .rename(&tmp, &meta_path)
            .await
            .map_err(|e| StorageError::io("write partition metadata", &meta_path, e));
    }
    fs.write_file_atomic(&meta_path, expected)
        .await
        .map_err(|e| StorageError::io("write partition metadata", &meta_path, e))?;
    // Innermost first: each new directory's entry in its parent.
    let mut parents: Vec<PathBuf> = created
        .iter()
        .filter_map(|c| c.parent().map(Path::to_path_buf))
        .collect();
    if let (true, Some(parent)) = (created.is_empty(), dir.parent()) {
        parents.push(parent.to_path_buf());
    }
    for parent in parents {
        fs.sync_dir(&parent)
            .await
            .map_err(|e| StorageError::io("sync log dir", &parent, e))?;
    }
    Ok(())
}

fn partition_metadata(incarnation: &[u8; 16]) -> Vec<u8> {
    format!("version: 0\ntopic_id: {}\n", base64_url(incarnation)).into_bytes()
}

/// Kafka prints topic ids as URL-safe base64 without padding (as in `partition.metadata`).
pub fn base64_url(bytes: &[u8; 16]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::with_capacity(22);
    let mut acc: u32 = 0;
    let mut bits = 0;
    for &b in bytes {
        acc = (acc << 8) | u32::from(b);
        bits += 8;
        while bits >= 6 {
            bits -= 6;
            out.push(ALPHABET[((acc >> bits) & 63) as usize] as char);
        }
    }
    if bits > 0 {
        out.push(ALPHABET[((acc << (6 - bits)) & 63) as usize] as char);
    }
    out
}

/// Deletes a log directory: renamed aside first (atomic: it is gone for a restarting broker even
/// if the removal below is cut short), then removed.
async fn delete_log_dir<F: Fs>(fs: &F, root: &Path, dir: &Path) -> Result<(), StorageError> {
    let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or("log");
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let aside = root.join(format!("{name}.{nanos:x}-delete"));
    fs.rename(dir, &aside)
        .await
        .map_err(|e| StorageError::io("move log directory aside", dir, e))?;
    fs.sync_dir(root)
        .await
        .map_err(|e| StorageError::io("sync log dir", root, e))?;
    fs.remove_dir_all(&aside)
        .await
        .map_err(|e| StorageError::io("remove log directory", &aside, e))
}

/// Removes directories left by interrupted deletions (`*-delete`) under `root`.
pub async fn remove_deleted_dirs<F: Fs>(fs: &F, root: &Path) {
    if let Ok(names) = fs.list_dir(root).await {
        for n in names.iter().filter(|n| n.ends_with("-delete")) {
            let _ = fs.remove_dir_all(&root.join(n)).await;
        }
    }
}

/// A reference-counted handle type alias for shards that keep the store in an `Rc`.
pub type SharedStore<F> = Rc<ShardStore<F>>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs_mem::MemFs;
    use futures_lite::future::{block_on, poll_once};
    use strand_protocol::batch::{build, BatchScanner};

    fn root() -> PathBuf {
        PathBuf::from("/data")
    }

    fn key() -> LogKey {
        LogKey {
            dir_name: "t-0".into(),
            incarnation: [4; 16],
        }
    }

    /// Segments of about four batches, an index entry every other batch.
    fn config() -> LogConfig {
        LogConfig {
            segment_bytes: 400,
            index_interval_bytes: 150,
            ..LogConfig::default()
        }
    }

    /// A batch of two records whose values carry `tag`.
    fn batch(tag: u64) -> Vec<u8> {
        let values: Vec<Vec<u8>> = (0..2).map(|i| format!("v{tag}-{i}").into_bytes()).collect();
        let records: Vec<build::TestRecord<'_>> = values
            .iter()
            .map(|v| build::TestRecord {
                key: None,
                value: Some(v),
                headers: vec![],
                timestamp_delta: 0,
            })
            .collect();
        build::batch(&records, 0)
    }

    /// A store whose every round is journaled, and one log in it.
    async fn store_and_log(fs: &MemFs) -> (ShardStore<MemFs>, LogId) {
        let store_config = StoreConfig {
            direct_sync_max_logs: 0,
            ..StoreConfig::default()
        };
        let store = ShardStore::open(fs.clone(), root(), 0, store_config)
            .await
            .unwrap();
        let (id, _) = store.open_log(key(), config(), 0).await.unwrap();
        (store, id)
    }

    /// A power loss keeping nothing unsynced, the start-up replay, and the store again.
    async fn crash_and_reopen(fs: &MemFs) -> (ShardStore<MemFs>, LogId, crate::ReplayReport) {
        fs.crash(|_| 0);
        let report = crate::replay_journals(fs, &root(), |_| Some(config()), 0)
            .await
            .unwrap();
        let (store, id) = store_and_log(fs).await;
        (store, id, report)
    }

    /// Every stored batch: (base offset, epoch, records' values).
    async fn read_all(store: &ShardStore<MemFs>, id: LogId) -> Vec<(i64, i32, Vec<u8>)> {
        let mut out = Vec::new();
        let mut next = store.offsets(id).unwrap().log_start_offset;
        while let Some(plan) = store.plan_read(id, next, 1 << 20).unwrap() {
            let bytes = plan.execute().await.unwrap();
            for b in BatchScanner::new(&bytes, true) {
                let h = b.header;
                if h.base_offset >= next {
                    let body = bytes[b.position..b.position + h.total_bytes()].to_vec();
                    out.push((h.base_offset, h.partition_leader_epoch, body));
                    next = h.next_offset();
                }
            }
        }
        out
    }

    /// Whether the stored batch `b` carries the records of [`batch`] `tag`.
    fn holds(b: &(i64, i32, Vec<u8>), tag: u64) -> bool {
        let needle = format!("v{tag}-0");
        b.2.windows(needle.len()).any(|w| w == needle.as_bytes())
    }

    /// Appends batches `tags` as a follower, in `epoch`, at the log end; one round.
    async fn replicate(store: &ShardStore<MemFs>, id: LogId, tags: std::ops::Range<u64>, epoch: i32) {
        let mut last = None;
        for tag in tags {
            let end = store.offsets(id).unwrap().log_end_offset;
            last = Some(store.append_replica(id, &batch(tag), end, epoch, 0).unwrap());
        }
        store.flush_round().await;
        if let Some(t) = last {
            store.wait_durable(&t).await.unwrap();
        }
    }

    /// Drives `fut` to its end with a flusher running rounds whenever something is staged.
    async fn with_flusher<T>(store: &ShardStore<MemFs>, fut: impl Future<Output = T>) -> T {
        futures::pin_mut!(fut);
        for _ in 0..100 {
            if let Some(out) = poll_once(fut.as_mut()).await {
                return out;
            }
            if store.has_pending() {
                store.flush_round().await;
            }
        }
        panic!("no progress");
    }

    #[test]
    fn a_replica_append_goes_only_at_the_log_end() {
        block_on(async {
            let fs = MemFs::new();
            let (store, id) = store_and_log(&fs).await;
            let t = store.append_replica(id, &batch(0), 0, 5, 0).unwrap();
            assert_eq!((t.info.base_offset, t.info.last_offset), (0, 1));
            for wrong in [0, 1, 3] {
                match store.append_replica(id, &batch(1), wrong, 5, 0) {
                    Err(StorageError::NotAtLogEnd {
                        offset,
                        log_end_offset,
                    }) => {
                        assert_eq!((offset, log_end_offset), (wrong, 2))
                    }
                    other => panic!("a replica append at {wrong} of a log ending at 2: {other:?}"),
                }
            }
            let mut corrupt = batch(1);
            let last = corrupt.len() - 1;
            corrupt[last] ^= 0xff;
            assert!(matches!(
                store.append_replica(id, &corrupt, 2, 5, 0),
                Err(StorageError::InvalidBatch(_))
            ));
            let t = store.append_replica(id, &batch(1), 2, 6, 0).unwrap();
            store.flush_round().await;
            store.wait_durable(&t).await.unwrap();
            let all = read_all(&store, id).await;
            let got: Vec<(i64, i32)> = all.iter().map(|b| (b.0, b.1)).collect();
            assert_eq!(got, [(0, 5), (2, 6)], "base offsets and terms stamped");
            assert_eq!(store.with_log(id, |l| l.latest_epoch()).unwrap(), Some((6, 2)));
        });
    }

    #[test]
    fn a_replica_append_skips_the_sequence_check_but_updates_producer_state() {
        block_on(async {
            let fs = MemFs::new();
            let (store, id) = store_and_log(&fs).await;
            let values = [b"a".to_vec(), b"b".to_vec()];
            let records: Vec<build::TestRecord<'_>> = values
                .iter()
                .map(|v| build::TestRecord {
                    key: None,
                    value: Some(v),
                    headers: vec![],
                    timestamp_delta: 0,
                })
                .collect();
            let first = build::batch_with_producer(&records, 0, 42, 0, 0);
            store.append_replica(id, &first, 0, 1, 0).unwrap();
            // Sequence 7 after 0..=1: a leader refuses the gap, a follower takes what its leader
            // accepted.
            let b = build::batch_with_producer(&records, 0, 42, 0, 7);
            assert!(matches!(
                store.append(id, &b, 1, 0),
                Err(StorageError::Producer(_))
            ));
            let t = store.append_replica(id, &b, 2, 1, 0).unwrap();
            store.flush_round().await;
            store.wait_durable(&t).await.unwrap();
            // The producer state knows it: the same batch sent to this replica as a new leader is
            // a duplicate, answered with the replica's offsets, and the next sequence follows it.
            let retry = store.append(id, &b, 2, 0).unwrap();
            assert_eq!((retry.info.base_offset, retry.info.last_offset), (2, 3));
            assert_eq!(store.offsets(id).unwrap().log_end_offset, 4);
            let next = build::batch_with_producer(&records, 0, 42, 0, 9);
            assert_eq!(store.append(id, &next, 2, 0).unwrap().info.base_offset, 4);
        });
    }

    #[test]
    fn a_truncation_waits_for_the_round_that_covers_the_log() {
        block_on(async {
            let fs = MemFs::new();
            let (store, id) = store_and_log(&fs).await;
            replicate(&store, id, 0..4, 1).await;
            let staged = store.append_replica(id, &batch(4), 8, 1, 0).unwrap();
            let truncate = store.truncate_log(id, 4);
            futures::pin_mut!(truncate);
            assert!(
                poll_once(truncate.as_mut()).await.is_none(),
                "waits for the round"
            );
            assert!(
                matches!(
                    store.append_replica(id, &batch(5), 10, 1, 0),
                    Err(StorageError::Busy(_))
                ),
                "appends wait for the truncation"
            );
            assert!(matches!(
                store.append(id, &batch(5), 1, 0),
                Err(StorageError::Busy(_))
            ));
            // The round writes the staged batch; the next one syncs the fence.
            let round = store.flush_round().await;
            assert_eq!((round.logs, round.journal_bytes > 0), (1, true));
            store.wait_durable(&staged).await.unwrap();
            assert!(
                poll_once(truncate.as_mut()).await.is_none(),
                "waits for its fence"
            );
            let round = store.flush_round().await;
            assert_eq!(
                (round.logs, round.journal_bytes > 0),
                (0, true),
                "a round of the fence alone"
            );
            poll_once(truncate.as_mut()).await.expect("done").unwrap();
            let o = store.offsets(id).unwrap();
            assert_eq!(
                (o.high_watermark, o.log_end_offset),
                (4, 4),
                "the durable end moved down"
            );
            let all = read_all(&store, id).await;
            assert_eq!(all.iter().map(|b| b.0).collect::<Vec<_>>(), [0, 2]);
        });
    }

    #[test]
    fn a_truncated_log_continues_densely_at_the_cut() {
        block_on(async {
            let fs = MemFs::new();
            let (store, id) = store_and_log(&fs).await;
            // Several segments: the cut removes whole ones and cuts one.
            replicate(&store, id, 0..12, 1).await;
            assert!(store.with_log(id, |l| l.segment_count()).unwrap() >= 3);
            with_flusher(&store, store.truncate_log(id, 6)).await.unwrap();
            assert!(matches!(
                store.append_replica(id, &batch(100), 8, 2, 0),
                Err(StorageError::NotAtLogEnd {
                    log_end_offset: 6,
                    ..
                })
            ));
            replicate(&store, id, 100..103, 2).await;
            let t = store.append(id, &batch(200), 3, 0).unwrap();
            assert_eq!(t.info.base_offset, 12, "the leader's append continues at the end");
            store.flush_round().await;
            store.wait_durable(&t).await.unwrap();
            let all = read_all(&store, id).await;
            let offsets: Vec<i64> = all.iter().map(|b| b.0).collect();
            assert_eq!(offsets, [0, 2, 4, 6, 8, 10, 12]);
            for (b, tag) in all.iter().zip([0, 1, 2, 100, 101, 102, 200]) {
                assert!(holds(b, tag), "batch {tag} at {}", b.0);
            }
            // A restart finds the same.
            drop(store);
            let (store, id, _) = crash_and_reopen(&fs).await;
            let again = read_all(&store, id).await;
            assert_eq!(again, all);
        });
    }

    #[test]
    fn a_truncation_is_refused_outside_the_log_or_between_batch_boundaries() {
        block_on(async {
            let fs = MemFs::new();
            let (store, id) = store_and_log(&fs).await;
            replicate(&store, id, 0..3, 1).await;
            assert!(matches!(
                with_flusher(&store, store.truncate_log(id, 7)).await,
                Err(StorageError::OffsetOutOfRange { .. })
            ));
            assert!(matches!(
                with_flusher(&store, store.truncate_log(id, 3)).await,
                Err(StorageError::NotBatchBoundary(3))
            ));
            with_flusher(&store, store.truncate_log(id, 6)).await.unwrap();
            assert!(!store.has_pending(), "a truncation at the end writes nothing");
            // Nothing was written: the log takes appends again, where it ended.
            store.append_replica(id, &batch(3), 6, 1, 0).unwrap();
        });
    }

    #[test]
    fn a_truncated_batch_does_not_come_back_from_the_journal() {
        block_on(async {
            let fs = MemFs::new();
            let (store, id) = store_and_log(&fs).await;
            // Journaled, and in the segments only unsynced.
            replicate(&store, id, 0..6, 1).await;
            with_flusher(&store, store.truncate_log(id, 4)).await.unwrap();
            drop(store);
            let (store, id, report) = crash_and_reopen(&fs).await;
            assert!(report.problems.is_empty(), "{report:?}");
            assert_eq!(store.offsets(id).unwrap().log_end_offset, 4, "{report:?}");
            assert_eq!(report.entries_voided, 4, "the entries at 4..12 are void");
            // Again with batches appended at the cut since: they, not the cut ones, are there.
            replicate(&store, id, 10..12, 2).await;
            drop(store);
            let (store, id, _) = crash_and_reopen(&fs).await;
            let all = read_all(&store, id).await;
            assert_eq!(
                all.iter().map(|b| (b.0, b.1)).collect::<Vec<_>>(),
                [(0, 1), (2, 1), (4, 2), (6, 2)]
            );
            assert!(holds(&all[2], 10) && holds(&all[3], 11));
        });
    }

    #[test]
    fn a_cut_that_fails_after_its_fence_takes_the_store_offline_and_recovery_keeps_a_prefix() {
        block_on(async {
            let fs = MemFs::new();
            let (store, id) = store_and_log(&fs).await;
            replicate(&store, id, 0..6, 1).await;
            let before = read_all(&store, id).await;
            {
                let truncate = store.truncate_log(id, 4);
                futures::pin_mut!(truncate);
                assert!(poll_once(truncate.as_mut()).await.is_none());
                store.flush_round().await; // the fence, durable
                fs.set_fail_fsync(true);
                let e = poll_once(truncate.as_mut()).await.expect("done").unwrap_err();
                assert!(matches!(e, StorageError::Io { .. }), "{e}");
            }
            let offline = store.offline().expect("offline");
            assert!(!offline.disk_full, "until a restart: {offline:?}");
            assert!(matches!(store.try_resume().await, ResumeOutcome::NotResumable));
            assert!(matches!(
                store.append_replica(id, &batch(9), 12, 2, 0),
                Err(StorageError::Offline { .. })
            ));
            drop(store);
            fs.set_fail_fsync(false);
            // The truncation never returned: the log comes back as a prefix of what it held,
            // at least up to the cut. (Recovery drops the empty file of a segment whose data
            // the crash took, which the cut's directory sync had made durable.)
            let (store, id, _) = crash_and_reopen(&fs).await;
            let after = read_all(&store, id).await;
            assert!(after.len() >= 2 && before.starts_with(&after), "{after:?}");
        });
    }

    #[test]
    fn leader_epochs_are_cut_with_the_log() {
        block_on(async {
            let fs = MemFs::new();
            let (store, id) = store_and_log(&fs).await;
            replicate(&store, id, 0..2, 1).await; // 0..4 in epoch 1
            replicate(&store, id, 2..4, 2).await; // 4..8 in epoch 2
            replicate(&store, id, 4..6, 3).await; // 8..12 in epoch 3
            let epochs = |store: &ShardStore<MemFs>, id| {
                store
                    .with_log(id, |l| {
                        (
                            l.latest_epoch(),
                            l.end_offset_for_epoch(2),
                            l.end_offset_for_epoch(3),
                        )
                    })
                    .unwrap()
            };
            assert_eq!(epochs(&store, id), (Some((3, 8)), Some((2, 8)), Some((3, 12))));
            with_flusher(&store, store.truncate_log(id, 6)).await.unwrap();
            // Epoch 3 is gone; epoch 2 ends at the log end (Kafka answers OffsetForLeaderEpoch
            // for a larger epoch with the largest it has).
            assert_eq!(epochs(&store, id), (Some((2, 4)), Some((2, 6)), Some((2, 6))));
            with_flusher(&store, store.truncate_log(id, 4)).await.unwrap();
            assert_eq!(epochs(&store, id), (Some((1, 0)), Some((1, 4)), Some((1, 4))));
            // Durably: the epoch file says the same after a crash.
            drop(store);
            let (store, id, _) = crash_and_reopen(&fs).await;
            assert_eq!(epochs(&store, id), (Some((1, 0)), Some((1, 4)), Some((1, 4))));
            // A new epoch starts where the log continues.
            replicate(&store, id, 10..11, 4).await;
            assert_eq!(store.with_log(id, |l| l.latest_epoch()).unwrap(), Some((4, 4)));
        });
    }

    #[test]
    fn topic_id_base64() {
        // The id Kafka prints as "AAAAAAAAAAAAAAAAAAAAAA" is all zeroes.
        assert_eq!(base64_url(&[0; 16]), "AAAAAAAAAAAAAAAAAAAAAA");
        assert_eq!(base64_url(&[0xff; 16]), "_____________________w");
    }
}
