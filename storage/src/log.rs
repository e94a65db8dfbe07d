//! A partition log: an ordered list of segments, the offsets that matter (log start, log end,
//! high watermark) and the operations the broker and, later, Raft need.
//!
//! Concurrency model: a `PartitionLog` lives inside its shard's [`crate::ShardStore`] and is only
//! mutated by short synchronous calls. Anything that waits for the disk is split in two: a
//! synchronous step that takes what it needs (file handles, buffers, positions) and an async step
//! that does the I/O without holding a borrow of the log. A file handle is an `Rc`, so a reader
//! can finish reading a segment that retention has just removed.
//!
//! Offsets: `log_start_offset <= high_watermark <= log_end_offset`. Offsets below the high
//! watermark are durable (journal fsynced) and written to their segment file; only they are
//! served to readers. Offsets are assigned by [`PartitionLog::append`] in call order and never
//! reused: a suffix is only ever removed below the high watermark by an explicit truncation
//! (a Raft follower's, [`crate::ShardStore::truncate_log`], above what clients could read), or
//! above it when a flush round fails before anything was acknowledged.
//!
//! Files: a log is a directory (`<topic>-<partition>`, or a queue state log's
//! `__queue_state/<topic>-<partition>/<group>`) in Kafka's layout: per segment a
//! `<base offset, 20 digits>.log` with its `.index` and `.timeindex` ([`crate::index`]), then
//! `leader-epoch-checkpoint` and `partition.metadata` (the topic id). Strand adds
//! `recovery-point` (see Recovery) and `log-start-offset` (written by DeleteRecords before any
//! segment below it goes).
//!
//! # Segment files
//!
//! A segment file holds exactly the batches appended to it, however they reached the disk
//! (direct or buffered writes), followed in the active segment only by zeros: space reserved
//! ahead of direct writes, and the padding of the last one ([`crate::fs::FileHandle::seal`]).
//! A segment behind the active one ends where its data ends, durably, before the recovery point
//! moves past it: a roll seals the file (`PartitionLog::seal_active`), a direct round or a
//! checkpoint seals any segment it missed (`seal_behind`, among the syncs it collects), and the
//! file system cuts a sealed file back to its data as soon as no write of it is in flight (a
//! synchronous `ftruncate`, so no write starts in between) and again, if needed, before each
//! `fdatasync`. A cut needs a sync that starts after it: a round whose `fdatasync` of the file
//! began before the cut leaves the segment's sync mark set (`Segment::cut_seq` against the
//! round's `cuts_at`, see `PartitionLog::rolled_segments_synced`). A clean stop seals the
//! active segments too, so the next start reads no zeros. Readers never go past a segment's
//! visible end.
//!
//! # Recovery
//!
//! [`PartitionLog::open`] trusts a log up to its recovery point (the last checkpoint: a
//! `recovery-point` file that passes its CRC, in a segment at least that long) and CRC-checks
//! everything after it. Segments behind the point are trusted at their size (sealed: their data
//! ends there), the point's segment up to the point. Index files are trusted below the point:
//! entries past it are cut, and if that cut the entry for the largest timestamp, the last index
//! interval is read again; a segment without index files is read instead. The scan ends at the
//! first torn or corrupt batch, and the tail from there is cut, durably, with every later
//! segment. Zeros where a batch should start are space the segment reserved, not damage
//! (`ScanOutcome::zero_tail`): they are cut too, and later segments stay. Producer state is the
//! point's snapshot plus the batches scanned after it. A log without a usable point is read
//! whole and its indexes rebuilt.

use std::cell::{Cell, RefCell};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Instant;

use bytes::Bytes;
use strand_protocol::batch::{self, BatchHeader, BatchScanner, BATCH_HEADER_BYTES};
use strand_protocol::records::record_metas;

use crate::fs::{FileHandle, Fs, StageBuf, STAGE_CHUNK_MAX_BYTES};
use crate::index::{OffsetIndex, TimeIndex};
use crate::notify::Notify;
use crate::producer::{ProducerCheck, ProducerState};
use crate::region::{FileRegion, FileRegions};
use crate::segment::{self, relative, IndexBuilder, IndexFilesOnDisk, Segment};
use crate::StorageError;

/// Settings of one partition log (the topic's effective configuration).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogConfig {
    /// Roll to a new segment before this size is exceeded (`segment.bytes`).
    pub segment_bytes: u64,
    /// Roll a non-empty segment this old (`segment.ms`).
    pub segment_ms: i64,
    /// Delete segments whose newest record is older than this (`retention.ms`); `None` = forever.
    pub retention_ms: Option<i64>,
    /// Delete the oldest segments while the log is larger than this (`retention.bytes`).
    pub retention_bytes: Option<u64>,
    /// Bytes of log between offset index entries (`index.interval.bytes`).
    pub index_interval_bytes: u64,
    /// Roll when a segment's offset index reaches this many entries (`segment.index.bytes` / 8).
    pub max_index_entries: usize,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            segment_bytes: 1 << 30,
            segment_ms: 7 * 24 * 3600 * 1000,
            retention_ms: Some(7 * 24 * 3600 * 1000),
            retention_bytes: None,
            index_interval_bytes: 4096,
            max_index_entries: 10 * 1024 * 1024 / 8,
        }
    }
}

/// Where a log's contents were last known durable in its segment files (a checkpoint).
/// Recovery trusts everything before it and validates everything after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecoveryPoint {
    /// Offset after the last checkpointed batch.
    pub offset: i64,
    /// Segment holding that position.
    pub segment_base: i64,
    /// Byte position in that segment.
    pub position: u64,
}

/// What [`PartitionLog::append`] did.
#[derive(Debug)]
pub enum Appended<'a> {
    /// Appended; the stored bytes go to the shard journal.
    New(AppendInfo, &'a [u8]),
    /// A producer's retry of a batch already appended at these offsets; nothing was appended.
    Duplicate(AppendInfo),
}

/// Result of an append.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppendInfo {
    pub base_offset: i64,
    pub last_offset: i64,
    pub log_start_offset: i64,
}

/// What [`PartitionLog::open`] did to bring a log back.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Bytes checked by CRC.
    pub bytes_scanned: u64,
    /// Bytes removed from the tail (torn or corrupt batches and everything after them).
    pub bytes_truncated: u64,
    /// Index files rebuilt because they were damaged, or one of the two was missing.
    pub indexes_rebuilt: usize,
    /// Segments below the recovery point read because they have no index files: a segment no
    /// larger than one index interval gets none (see `Segment::needs_index_files`).
    pub segments_without_index: usize,
    pub problems: Vec<String>,
}

/// Smallest capacity of a staged chunk.
const STAGE_CHUNK_MIN_BYTES: usize = 16 * 1024;

/// Batches of one segment waiting to be written to its file.
pub(crate) struct StagedChunk<Fl> {
    /// The segment's file, or `None` if the round must create it (or take it from `created`,
    /// if an earlier round created it and has not completed).
    pub(crate) file: Option<Rc<Fl>>,
    /// The segment's [`crate::segment::Segment::created`].
    pub(crate) created: Rc<RefCell<Option<Rc<Fl>>>>,
    pub(crate) path: Rc<Path>,
    pub(crate) segment_base: i64,
    pub(crate) position: u64,
    pub(crate) data: StageBuf,
}

/// What a direct flush round must sync for one log (see [`PartitionLog::direct_sync`]).
pub(crate) struct DirectSync<Fl> {
    /// Files with unsynced writes of earlier rounds.
    pub(crate) files: Vec<Rc<Fl>>,
    /// The round creates a segment file: the directory must be synced after it, and this is
    /// the directory-change count when the round took its writes.
    pub(crate) creates_at: Option<u64>,
}

/// Writes a flush round must do for one log, taken by [`PartitionLog::take_staged`].
pub(crate) struct StagedWrites<Fl> {
    pub(crate) chunks: Vec<StagedChunk<Fl>>,
    /// Log end offset covered by these writes.
    pub(crate) end_offset: i64,
    /// When the first of them was staged.
    pub(crate) staged_at: Option<Instant>,
}

/// A chunk written by a flush round: the segment, its file (created by the round if it was
/// new) and the segment size the write reached.
pub(crate) struct WrittenChunk<Fl> {
    pub(crate) segment_base: i64,
    pub(crate) file: Rc<Fl>,
    pub(crate) end_position: u64,
}

/// A planned read: which file, where, and how far the reader may go.
pub struct ReadPlan<Fl> {
    file: Rc<Fl>,
    path: Rc<Path>,
    /// Position of the index entry at or before the target offset.
    start_position: u64,
    /// End of visible (durable) bytes in this segment.
    end_position: u64,
    target_offset: i64,
    /// Batches at or above this offset are not read (a replicated log's commit cap).
    end_offset: i64,
    max_bytes: usize,
    index_interval_bytes: u64,
}

/// What a read returns: the bytes, or a region of the file to send (see
/// [`ReadPlan::execute_sendable`]).
#[derive(Debug)]
pub enum ReadData {
    Bytes(Bytes),
    Region(FileRegion),
}

impl ReadData {
    pub fn len(&self) -> usize {
        match self {
            ReadData::Bytes(b) => b.len(),
            ReadData::Region(r) => r.len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Smallest average batch size [`ReadPlan::execute_sendable`] finds batch ends for by reading
/// their headers alone; runs of smaller batches are read and copied, which costs less than a
/// header read each.
pub const SENDABLE_MIN_BATCH_BYTES: usize = 16 << 10;

/// One segment a timestamp lookup scans.
struct SegmentScan<Fl> {
    file: Rc<Fl>,
    path: Rc<Path>,
    start_position: u64,
    end_position: u64,
}

/// A planned timestamp lookup (see [`PartitionLog::timestamp_plan`]).
pub struct TimestampPlan<Fl> {
    timestamp: i64,
    log_start_offset: i64,
    segments: Vec<SegmentScan<Fl>>,
}

impl<Fl: FileHandle> TimestampPlan<Fl> {
    /// Scans the planned segments: `(offset, timestamp)` of the first record at or after the
    /// timestamp, or `None`.
    pub async fn execute(self) -> Result<Option<(i64, i64)>, StorageError> {
        let ts = self.timestamp;
        for seg in &self.segments {
            let mut pos = seg.start_position;
            while pos < seg.end_position {
                let Some((header, bytes)) =
                    read_batch_at(&*seg.file, pos, seg.end_position, &seg.path).await?
                else {
                    break;
                };
                pos += header.total_bytes() as u64;
                if header.max_timestamp < ts || header.next_offset() <= self.log_start_offset {
                    continue;
                }
                let found = match record_metas(&bytes, RECORD_SCAN_LIMIT) {
                    Ok(metas) => metas
                        .iter()
                        .find(|m| m.timestamp >= ts && m.offset >= self.log_start_offset)
                        .map(|m| (m.offset, m.timestamp)),
                    // Cannot look inside (too large to decompress): answer with the batch; the
                    // client skips records it does not want.
                    Err(_) => Some((
                        header.base_offset.max(self.log_start_offset),
                        header.max_timestamp,
                    )),
                };
                if found.is_some() {
                    return Ok(found);
                }
            }
        }
        Ok(None)
    }
}

/// Work a checkpoint must do for one log.
pub(crate) struct CheckpointWork<Fl> {
    pub(crate) files_to_sync: Vec<Rc<Fl>>,
    /// Files written unsynced when the log was created (see
    /// [`PartitionLog::write_initial_files`]); `sync_dir` is set with them.
    pub(crate) initial_files_to_sync: Vec<PathBuf>,
    /// Index files to write: path, content, and whether to replace the file whole (a temporary
    /// file renamed over it) rather than rewrite it in place (see [`IndexFilesOnDisk`]).
    pub(crate) index_files: Vec<(PathBuf, Vec<u8>, bool)>,
    pub(crate) sync_dir: bool,
    pub(crate) write_epochs: Option<Vec<u8>>,
    /// Files written beside their names by an unsynced [`CheckpointWork::write_files`] (a new
    /// epoch file, index files replaced whole), to be renamed into place by
    /// [`CheckpointWork::rename_files`]: (temporary, final).
    pub(crate) renames: Vec<(PathBuf, PathBuf)>,
    pub(crate) point: RecoveryPoint,
    /// Producer-state snapshot exact as of `point`.
    pub(crate) producers: Vec<u8>,
    /// The log has no recovery point file that it knows of: writing one creates a directory
    /// entry, which a synced checkpoint must sync too.
    pub(crate) new_point_file: bool,
    pub(crate) dir: PathBuf,
    /// Keeps the directory while the work is alive (set by the store).
    pub(crate) io: Option<LogIoGuard>,
}

impl<Fl: FileHandle> CheckpointWork<Fl> {
    /// Does the checkpoint's I/O: fsync segment data, write and fsync index files and the epoch
    /// file, fsync the directory, and only then write the recovery point that lets recovery
    /// trust all of it.
    pub(crate) async fn run<F: Fs<File = Fl>>(mut self, fs: &F) -> Result<RecoveryPoint, StorageError> {
        self.write_files(fs, true).await?;
        self.write_point(fs, true).await
    }

    /// Everything but the recovery point. With `sync`: segment data fsynced, index files
    /// written and fsynced (or replaced atomically, see [`IndexFilesOnDisk`]), the epoch file
    /// replaced atomically, the directory synced. Without it nothing is synced, and a new epoch
    /// file and index files replaced whole are only written beside their names: the caller
    /// syncs the whole file system, then calls [`CheckpointWork::rename_files`], syncs it
    /// again, and only then writes the recovery point.
    pub(crate) async fn write_files<F: Fs<File = Fl>>(
        &mut self,
        fs: &F,
        sync: bool,
    ) -> Result<(), StorageError> {
        if sync {
            for f in &self.files_to_sync {
                f.fdatasync()
                    .await
                    .map_err(|e| StorageError::io("sync segment", &self.dir, e))?;
            }
            for path in &self.initial_files_to_sync {
                let f = fs
                    .open(path, false)
                    .await
                    .map_err(|e| StorageError::io("open to sync", path, e))?;
                f.fdatasync()
                    .await
                    .map_err(|e| StorageError::io("sync", path, e))?;
            }
        }
        for (path, data, whole) in std::mem::take(&mut self.index_files) {
            if whole {
                self.replace_whole(fs, path, data, sync, "write index").await?;
                continue;
            }
            // In place, without truncating first: index files only grow between checkpoints, so a
            // torn write leaves the old prefix intact; recovery cuts entries past the point.
            let f = fs
                .open(&path, true)
                .await
                .map_err(|e| StorageError::io("open index", &path, e))?;
            let len = data.len() as u64;
            f.write_all_at(data, 0)
                .await
                .map_err(|e| StorageError::io("write index", &path, e))?;
            if f.size().await.unwrap_or(len) > len {
                f.truncate(len)
                    .await
                    .map_err(|e| StorageError::io("trim index", &path, e))?;
            }
            if sync {
                f.fdatasync()
                    .await
                    .map_err(|e| StorageError::io("sync index", &path, e))?;
            }
        }
        if let Some(epochs) = self.write_epochs.take() {
            let path = self.dir.join(EPOCH_FILE);
            self.replace_whole(fs, path, epochs, sync, "write leader epochs")
                .await?;
        }
        // A file-system sync covers the directory's entries too.
        if self.sync_dir && sync {
            fs.sync_dir(&self.dir)
                .await
                .map_err(|e| StorageError::io("sync log directory", &self.dir, e))?;
        }
        Ok(())
    }

    /// Replaces the file at `path` with `data` so that readers see the old or the new content:
    /// with `sync` at once and durably; without, written beside its name, for
    /// [`CheckpointWork::rename_files`] to rename into place once the caller has synced it.
    async fn replace_whole<F: Fs<File = Fl>>(
        &mut self,
        fs: &F,
        path: PathBuf,
        data: Vec<u8>,
        sync: bool,
        what: &'static str,
    ) -> Result<(), StorageError> {
        if sync {
            fs.write_file_atomic(&path, data)
                .await
                .map_err(|e| StorageError::io(what, &path, e))
        } else {
            let (_, tmp) = fs
                .write_tmp_file(&path, data)
                .await
                .map_err(|e| StorageError::io(what, &path, e))?;
            self.renames.push((tmp, path));
            Ok(())
        }
    }

    /// Renames the files an unsynced [`CheckpointWork::write_files`] wrote beside their names
    /// into place (once their content is durable); `false` if there were none.
    pub(crate) async fn rename_files<F: Fs<File = Fl>>(&mut self, fs: &F) -> Result<bool, StorageError> {
        let renames = std::mem::take(&mut self.renames);
        for (tmp, path) in &renames {
            fs.rename(tmp, path)
                .await
                .map_err(|e| StorageError::io("rename into place", path, e))?;
        }
        Ok(!renames.is_empty())
    }

    /// Writes the recovery point, which vouches for what [`CheckpointWork::write_files`] made
    /// durable (so it must run after that is durable); with `sync`, fsynced.
    pub(crate) async fn write_point<F: Fs<File = Fl>>(
        self,
        fs: &F,
        sync: bool,
    ) -> Result<RecoveryPoint, StorageError> {
        write_recovery_point(
            fs,
            &self.dir.join(RECOVERY_POINT_FILE),
            self.point,
            self.producers,
            sync,
        )
        .await?;
        // Without it a crash could take the new file away, and recovery would scan the whole
        // log. (Unsynced, the caller's file-system sync covers the entry.)
        if sync && self.new_point_file {
            fs.sync_dir(&self.dir)
                .await
                .map_err(|e| StorageError::io("sync log directory", &self.dir, e))?;
        }
        Ok(self.point)
    }
}

/// Outcome of a retention pass.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RetentionOutcome {
    /// Base offsets of the segments detached for deletion.
    pub deleted: Vec<i64>,
    pub bytes_deleted: u64,
    pub log_start_offset: i64,
}

/// File work after a failed flush round (see [`PartitionLog::discard_unflushed`]).
pub(crate) struct DiscardPlan<Fl> {
    pub(crate) truncate: Vec<(Rc<Fl>, u64)>,
    pub(crate) delete: Vec<i64>,
    pub(crate) dir: PathBuf,
}

impl<Fl: FileHandle> DiscardPlan<Fl> {
    pub(crate) async fn run<F: Fs<File = Fl>>(self, fs: &F) {
        for (file, len) in self.truncate {
            if let Err(e) = file.truncate(len).await {
                tracing::warn!(dir = %self.dir.display(), error = %e, "could not cut back a segment after a failed flush");
            }
        }
        for base in self.delete {
            remove_segment_files(fs, &self.dir, base).await;
        }
    }
}

/// Makes a log's files end where the log does, durably, after a failed flush round discarded
/// its unflushed tail ([`PartitionLog::discard_unflushed`]): what a restart's recovery would
/// leave, so that the offsets above the high watermark, which were never acknowledged nor
/// visible, may be given out again. The discard's own plan cuts the files back but syncs
/// nothing, may fail, and leaves a segment file a failed round created: a crash after the
/// offsets were given out again could then bring the discarded batches back in their place
/// (recovery takes whatever valid batches a segment holds past its recovery point, and journal
/// replay skips entries the log already has).
pub(crate) struct ResumeCut<Fl> {
    dir: PathBuf,
    /// The active segment's base offset: segment files above it are the discarded segments'.
    base: i64,
    /// The active segment's file, if it has one (or a failed round created it).
    file: Option<Rc<Fl>>,
    /// The active segment's length: where its data ends.
    len: u64,
    /// The log's directory changes when the cut was planned, which its directory sync covers.
    dir_changes: u64,
    /// The discard cut the active segment's indexes to the high watermark without the batches
    /// since its last offset-index entry, whose largest timestamp may be the segment's:
    /// [`ResumeCut::run`] reads those batches again, as recovery does.
    rescan: TailRescan,
    index_interval_bytes: u64,
}

/// What [`ResumeCut::run`] hands back to [`PartitionLog::resume_cut_done`]: the directory changes
/// its sync covered, and the active segment's rebuilt indexes.
pub(crate) struct ResumeCutDone {
    dir_changes: u64,
    indexes: (IndexBuilder, OffsetIndex, TimeIndex),
}

impl<Fl: FileHandle> ResumeCut<Fl> {
    /// Removes the segment files past the active segment (and the active one's, if it has no
    /// data nor handle), cuts the active segment's file to its data, gives it back its
    /// reservation of space if sealing took it (a roll the failed round made), syncs it and
    /// the directory, and rebuilds its indexes' tail from its data. Returns what
    /// [`PartitionLog::resume_cut_done`] takes.
    pub(crate) async fn run<F: Fs<File = Fl>>(self, fs: &F) -> Result<ResumeCutDone, StorageError> {
        let dir = &self.dir;
        let names = fs
            .list_dir(dir)
            .await
            .map_err(|e| StorageError::io("list log directory", dir, e))?;
        for name in names {
            let Some((base, log_file)) = ["log", "index", "timeindex"]
                .into_iter()
                .find_map(|suffix| segment::parse_file_name(&name, suffix).map(|b| (b, suffix == "log")))
            else {
                continue;
            };
            let stale = base > self.base || (base == self.base && log_file && self.file.is_none());
            if stale {
                let path = dir.join(&name);
                match fs.remove_file(&path).await {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                        return Err(StorageError::io("remove discarded segment", &path, e));
                    }
                    _ => {}
                }
            }
        }
        if let Some(file) = &self.file {
            file.unseal();
            file.truncate(self.len)
                .await
                .map_err(|e| StorageError::io("cut discarded tail", dir, e))?;
            file.fdatasync()
                .await
                .map_err(|e| StorageError::io("sync cut segment", dir, e))?;
        }
        fs.sync_dir(dir)
            .await
            .map_err(|e| StorageError::io("sync log directory", dir, e))?;
        let indexes = match &self.file {
            Some(file) => {
                self.rescan
                    .run(&**file, self.base, self.len, self.index_interval_bytes, dir)
                    .await?
            }
            None => self.rescan.unchanged(),
        };
        Ok(ResumeCutDone {
            dir_changes: self.dir_changes,
            indexes,
        })
    }
}

/// Where a store-level truncation cuts a segment (see [`PartitionLog::truncation_lookup`]).
pub(crate) enum BoundaryLookup<Fl> {
    /// At this position of the segment based at this offset (its end).
    At(i64, u64),
    /// At the batch starting at `offset`, to be found by reading the segment's file from
    /// `from` (its index entry) up to `size`.
    Scan {
        file: Rc<Fl>,
        path: Rc<Path>,
        segment_base: i64,
        from: u64,
        size: u64,
        offset: i64,
    },
}

impl<Fl: FileHandle> BoundaryLookup<Fl> {
    /// The segment's base offset and the position of the cut; [`StorageError::NotBatchBoundary`]
    /// if no batch starts at the offset.
    pub(crate) async fn run(self) -> Result<(i64, u64), StorageError> {
        let (file, path, segment_base, mut pos, size, offset) = match self {
            BoundaryLookup::At(base, pos) => return Ok((base, pos)),
            BoundaryLookup::Scan {
                file,
                path,
                segment_base,
                from,
                size,
                offset,
            } => (file, path, segment_base, from, size, offset),
        };
        while pos < size {
            let Some((header, _)) = read_batch_at(&*file, pos, size, &path).await? else {
                break;
            };
            if header.base_offset == offset {
                return Ok((segment_base, pos));
            }
            if header.next_offset() > offset {
                break;
            }
            pos += header.total_bytes() as u64;
        }
        Err(StorageError::NotBatchBoundary(offset))
    }
}

/// Cuts a log's files where [`PartitionLog::cut_at`] cut the log, durably. First the recovery
/// point goes (removed, and the directory synced): it may lie past the cut, and once appends
/// have grown the cut segment past it again, recovery would trust it, with its producer
/// snapshot, over other batches (a crash before the truncation's checkpoint writes a new one
/// costs a scan of the log instead). And the epoch file is replaced by the cut epochs: recovery
/// drops epochs that begin past the log's end, but not those that begin where batches of
/// another epoch were appended since (a scan without a point finds the epochs of whatever
/// batches past the cut a crash leaves). Then the segment files past the new active segment are
/// removed, newest first, each removal made durable by a directory sync before the next (a
/// crash leaves a prefix of the segments, never one with a gap), then the active segment's
/// file is cut and synced, and its indexes' tail read again.
pub(crate) struct CutPlan<Fl> {
    dir: PathBuf,
    /// The epoch file's new content.
    epochs: Vec<u8>,
    /// Base offsets of the segments removed, newest first.
    removed: Vec<i64>,
    file: Option<Rc<Fl>>,
    base: i64,
    len: u64,
    rescan: TailRescan,
    index_interval_bytes: u64,
}

impl<Fl: FileHandle> CutPlan<Fl> {
    pub(crate) async fn run<F: Fs<File = Fl>>(
        self,
        fs: &F,
    ) -> Result<(IndexBuilder, OffsetIndex, TimeIndex), StorageError> {
        let dir = &self.dir;
        let point = dir.join(RECOVERY_POINT_FILE);
        match fs.remove_file(&point).await {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(StorageError::io("remove recovery point", &point, e));
            }
            _ => {}
        }
        fs.sync_dir(dir)
            .await
            .map_err(|e| StorageError::io("sync log directory", dir, e))?;
        let epochs = dir.join(EPOCH_FILE);
        fs.write_file_atomic(&epochs, self.epochs)
            .await
            .map_err(|e| StorageError::io("write leader epochs", &epochs, e))?;
        for base in &self.removed {
            remove_segment_files(fs, dir, *base).await;
            fs.sync_dir(dir)
                .await
                .map_err(|e| StorageError::io("sync log directory", dir, e))?;
        }
        let Some(file) = &self.file else {
            return Ok(self.rescan.unchanged());
        };
        // The segment is the active one again (it may have been rolled past and sealed).
        file.unseal();
        file.truncate(self.len)
            .await
            .map_err(|e| StorageError::io("truncate segment", dir, e))?;
        file.fdatasync()
            .await
            .map_err(|e| StorageError::io("sync truncated segment", dir, e))?;
        self.rescan
            .run(&**file, self.base, self.len, self.index_interval_bytes, dir)
            .await
    }
}

/// A segment's indexes and running maximum cut back to its last offset-index entry, and where
/// that entry is: what truncation leaves, to be completed by reading again the batches between
/// that entry and the segment's end, as recovery and the appends built them. Truncation itself
/// cuts the time index at the new end, which loses a maximum raised since the last entry.
pub(crate) struct TailRescan {
    from_position: u64,
    from_offset: i64,
    builder: IndexBuilder,
    index: OffsetIndex,
    time_index: TimeIndex,
}

impl TailRescan {
    pub(crate) fn of<F: Fs>(seg: &Segment<F>) -> Self {
        let (at, rel) = seg
            .index
            .last()
            .map_or((0, 0), |e| (e.position, e.relative_offset));
        let mut index = seg.index.clone();
        let mut time_index = seg.time_index.clone();
        index.truncate_to_position(at);
        time_index.truncate_to_offset(rel);
        let mut builder = IndexBuilder::default();
        builder.reset(u64::from(at), &index, &time_index);
        TailRescan {
            from_position: u64::from(at),
            from_offset: seg.base_offset + i64::from(rel),
            builder,
            index,
            time_index,
        }
    }

    /// The indexes as cut, for a segment with nothing after its last entry to read.
    fn unchanged(self) -> (IndexBuilder, OffsetIndex, TimeIndex) {
        (self.builder, self.index, self.time_index)
    }

    /// Reads the batches of `file` (a segment based at `base` whose data ends at `len`) after
    /// the last entry and returns the completed indexes. Every byte up to `len` must be a whole
    /// batch: what is read again was acknowledged.
    async fn run<Fl: FileHandle>(
        mut self,
        file: &Fl,
        base: i64,
        len: u64,
        index_interval_bytes: u64,
        dir: &Path,
    ) -> Result<(IndexBuilder, OffsetIndex, TimeIndex), StorageError> {
        if self.from_position >= len {
            return Ok(self.unchanged());
        }
        // Producer state is cut to the new end by the caller.
        let mut producers = ProducerState::default();
        let out = segment::scan(
            file,
            base,
            self.from_position,
            self.from_offset,
            len,
            index_interval_bytes,
            &mut self.builder,
            &mut self.index,
            &mut self.time_index,
            &mut producers,
        )
        .await
        .map_err(|e| StorageError::io("scan segment", dir, e))?;
        if out.valid_size != len {
            return Err(StorageError::Io {
                op: "scan segment",
                path: dir.to_path_buf(),
                source: std::io::Error::other(format!(
                    "acknowledged data ends at {} of {len} bytes ({:?})",
                    out.valid_size, out.problem
                )),
            });
        }
        Ok(self.unchanged())
    }
}

const LOG_START_FILE: &str = "log-start-offset";
const RECOVERY_POINT_FILE: &str = "recovery-point";
const EPOCH_FILE: &str = "leader-epoch-checkpoint";

/// One partition's log. See the module documentation.
pub struct PartitionLog<F: Fs> {
    fs: F,
    dir: PathBuf,
    config: LogConfig,
    /// Sorted by base offset; the last one is the active segment. Never empty.
    segments: Vec<Segment<F>>,
    log_start_offset: i64,
    next_offset: i64,
    high_watermark: i64,
    staged: Vec<StagedChunk<F::File>>,
    /// When the first of the staged batches was staged (`None` while nothing is): how long
    /// writes wait for a flush round to take them is a stage of a produce's latency.
    staged_since: Option<Instant>,
    /// Capacity for a new staged chunk: what the last round took, within
    /// [`STAGE_CHUNK_MIN_BYTES`, `STAGE_CHUNK_MAX_BYTES`], so a busy log's chunk is allocated
    /// once instead of grown by doubling (a copy of everything staged so far each time).
    stage_hint_bytes: usize,
    /// Takes of flush rounds whose writes of this log have not completed (more than one when a
    /// round is written while the one before it syncs; see [`crate::store`]).
    takes_in_flight: u32,
    discard_generation: u64,
    /// (epoch, first offset) for each leader epoch, ascending.
    epochs: Vec<(i32, i64)>,
    epochs_dirty: bool,
    /// Segment files were created or removed since the last checkpoint.
    dir_dirty: bool,
    /// Directory changes made (segment files created or removed) and how many of them a
    /// checkpoint or a directory sync has made durable; a direct flush round needs them all durable (see
    /// [`PartitionLog::direct_sync`]). `dir_changes_checkpointing` is the count a running
    /// checkpoint's directory sync covers.
    dir_changes: u64,
    dir_changes_synced: u64,
    dir_changes_checkpointing: Option<u64>,
    last_checkpoint: Option<RecoveryPoint>,
    /// Files written when the log was created and not yet synced, nor their directory entries
    /// (see [`PartitionLog::write_initial_files`]): the recovery point written, and the other
    /// files (the epoch file when the log was opened as a leader). The first checkpoint syncs
    /// them, unless the store synced the file system first
    /// ([`PartitionLog::initial_files_synced`]).
    unsynced_initial_files: Option<(RecoveryPoint, Vec<PathBuf>)>,
    /// Idempotent producers' sequences (see [`crate::producer`]).
    producers: ProducerState,
    /// Retention never deletes a segment holding an offset at or above this (the queue engine's
    /// undelivered messages). `None`: no floor.
    retention_floor: Option<i64>,
    /// A replicated log's commit offset (`None`: not replicated): clients see no further
    /// (see [`PartitionLog::visible_end`]).
    commit_cap: Option<i64>,
    /// Segments behind the active one and based below this are sealed (see
    /// [`PartitionLog::seal_behind`]).
    sealed_below: i64,
    /// Segment files cut back to their data by sealing so far (see `Segment::cut_seq`).
    cuts: u64,
    /// A failed flush round discarded the unflushed tail ([`PartitionLog::discard_unflushed`]),
    /// and no [`ResumeCut`] has made the files end where the log does since: until one has,
    /// the store must not take writes again (see [`crate::ShardStore::try_resume`]).
    tail_discarded: bool,
}

impl<F: Fs> PartitionLog<F> {
    /// Opens (or creates) the log in `dir`, validating everything after its recovery point (the
    /// last checkpoint; the whole log if there is no usable one): a torn or corrupt tail is cut
    /// off at the last valid batch, and missing or damaged index files are rebuilt.
    pub async fn open(
        fs: F,
        dir: PathBuf,
        config: LogConfig,
        now_ms: i64,
    ) -> Result<(Self, RecoveryReport), StorageError> {
        Self::open_inner(fs, dir, config, None, now_ms).await
    }

    /// [`PartitionLog::open`] for the partition's leader in `leader_epoch`: the epoch begins at
    /// the log's end unless it already has, as Kafka assigns it when its leader is elected. A log
    /// created now so gets its epoch file with it, rather than at its first checkpoint.
    pub async fn open_as_leader(
        fs: F,
        dir: PathBuf,
        config: LogConfig,
        leader_epoch: i32,
        now_ms: i64,
    ) -> Result<(Self, RecoveryReport), StorageError> {
        Self::open_inner(fs, dir, config, Some(leader_epoch), now_ms).await
    }

    async fn open_inner(
        fs: F,
        dir: PathBuf,
        config: LogConfig,
        leader_epoch: Option<i32>,
        now_ms: i64,
    ) -> Result<(Self, RecoveryReport), StorageError> {
        fs.create_dir_all(&dir)
            .await
            .map_err(|e| StorageError::io("create log directory", &dir, e))?;
        let names = fs
            .list_dir(&dir)
            .await
            .map_err(|e| StorageError::io("list log directory", &dir, e))?;
        let mut bases: Vec<i64> = names
            .iter()
            .filter_map(|n| segment::parse_file_name(n, "log"))
            .collect();
        bases.sort_unstable();
        let created_now = bases.is_empty()
            && ![RECOVERY_POINT_FILE, EPOCH_FILE, LOG_START_FILE]
                .iter()
                .any(|f| names.iter().any(|n| n == f));
        // Segments with index files on disk; index files whose segment is gone are removed, so
        // that a later segment with the same base never finds them (it may have none of its own:
        // see `Segment::needs_index_files`).
        let mut indexed = std::collections::HashSet::new();
        for n in &names {
            let index_base = ["index", "timeindex"]
                .into_iter()
                .find_map(|suffix| segment::parse_file_name(n, suffix));
            let orphan_index = index_base.is_some_and(|b| bases.binary_search(&b).is_err());
            if n.ends_with(".deleted") || n.ends_with(".tmp") || orphan_index {
                let _ = fs.remove_file(&dir.join(n)).await;
            } else if let Some(b) = index_base {
                indexed.insert(b);
            }
        }
        let mut report = RecoveryReport::default();
        let log_start_file = read_i64_file(&fs, &dir.join(LOG_START_FILE)).await;
        let (recovery, snapshot) = match read_recovery_point(&fs, &dir.join(RECOVERY_POINT_FILE)).await {
            Some((rp, producers)) => (Some(rp), producers),
            None => (None, ProducerState::default()),
        };
        let mut log = PartitionLog {
            fs: fs.clone(),
            dir: dir.clone(),
            config,
            segments: Vec::new(),
            log_start_offset: 0,
            next_offset: 0,
            high_watermark: 0,
            staged: Vec::new(),
            staged_since: None,
            stage_hint_bytes: STAGE_CHUNK_MIN_BYTES,
            takes_in_flight: 0,
            discard_generation: 0,
            epochs: read_epochs(&fs, &dir.join(EPOCH_FILE)).await,
            epochs_dirty: false,
            dir_dirty: false,
            dir_changes: 0,
            dir_changes_synced: 0,
            dir_changes_checkpointing: None,
            last_checkpoint: None,
            unsynced_initial_files: None,
            producers: ProducerState::default(),
            retention_floor: None,
            commit_cap: None,
            sealed_below: 0,
            cuts: 0,
            tail_discarded: false,
        };

        // A recovery point is usable only if its segment still exists and is at least that long
        // (a shorter file means it was damaged or truncated behind our back).
        let mut trusted = None;
        if let Some(rp) = recovery {
            if bases.contains(&rp.segment_base) {
                let path = dir.join(segment::file_name(rp.segment_base, "log"));
                if let Ok(f) = fs.open(&path, false).await {
                    if f.size().await.map(|s| s >= rp.position).unwrap_or(false) {
                        trusted = Some(rp);
                    }
                }
            } else if bases.is_empty() && rp.position == 0 {
                trusted = Some(rp);
            }
        }

        // The producer snapshot is exact as of the recovery point; batches after it are re-applied
        // by the scans below. Without a usable point everything is scanned and rebuilt.
        if trusted.is_some() {
            log.producers = snapshot;
        }
        let mut expected: Option<i64> = None;
        let mut drop_rest = false;
        for (i, &base) in bases.iter().enumerate() {
            let path = dir.join(segment::file_name(base, "log"));
            if drop_rest {
                report.bytes_truncated += remove_segment_files(&fs, &dir, base).await;
                log.mark_dir_changed();
                continue;
            }
            if let Some(exp) = expected {
                if base != exp {
                    report.problems.push(format!(
                        "segment {base} does not start at offset {exp}; dropping it and later ones"
                    ));
                    drop_rest = true;
                    report.bytes_truncated += remove_segment_files(&fs, &dir, base).await;
                    log.mark_dir_changed();
                    continue;
                }
            }
            let file = fs
                .open_segment(&path, false)
                .await
                .map_err(|e| StorageError::io("open segment", &path, e))?;
            let file_size = file
                .size()
                .await
                .map_err(|e| StorageError::io("stat segment", &path, e))?;
            let mut seg = Segment::new_lazy(&dir, base, now_ms);
            seg.file = Some(Rc::new(file));
            seg.size = file_size;
            seg.durable_size = file_size;
            seg.index_dirty = false;
            // Known only once they are loaded below (and found to cover the recovery point).
            seg.index_files_on_disk = if indexed.contains(&base) {
                IndexFilesOnDisk::Unknown
            } else {
                IndexFilesOnDisk::Absent
            };
            seg.needs_sync = false;
            // How far this segment can be trusted without a scan.
            let trusted_part: Option<(u64, i64)> = match trusted {
                Some(rp) if base < rp.segment_base => bases.get(i + 1).map(|next| (file_size, *next)),
                Some(rp) if base == rp.segment_base => Some((rp.position, rp.offset)),
                _ => None,
            };
            let (scan_from, scan_offset) = match trusted_part {
                // Small enough to have been checkpointed without index files: read it instead.
                Some(_) if seg.index_files_on_disk == IndexFilesOnDisk::Absent => {
                    if file_size > log.config.index_interval_bytes {
                        report.indexes_rebuilt += 1;
                    } else {
                        report.segments_without_index += 1;
                    }
                    seg.index_dirty = true;
                    (0, base)
                }
                Some((pos, off)) => match load_indexes(&fs, &seg).await {
                    Some((mut idx, mut tidx, exact)) => {
                        let entries = (idx.len(), tidx.len());
                        idx.truncate_to(u32::try_from(pos).unwrap_or(u32::MAX), relative(base, off));
                        tidx.truncate_to_offset(relative(base, off));
                        // Entries cut here are still in the files, and the next checkpoint
                        // writes others in their place: a torn rewrite in place could mix the
                        // two into an entry below the point, so that write replaces the files
                        // whole (so too if the files hold more than their entries).
                        seg.index_files_on_disk = if exact && (idx.len(), tidx.len()) == entries {
                            IndexFilesOnDisk::Durable
                        } else {
                            seg.index_dirty = true;
                            IndexFilesOnDisk::Unknown
                        };
                        let from = if tidx.len() < entries.1 {
                            // Entries past the point were cut (written for batches the crash
                            // lost, or before a point that was never written), perhaps the
                            // one for the largest timestamp below the point: read again from
                            // the last offset-index entry, at most an interval before the point,
                            // and rebuild the indexes from there as the appends built them.
                            let (at, rel) = idx.last().map_or((0, 0), |e| (e.position, e.relative_offset));
                            idx.truncate_to_position(at);
                            tidx.truncate_to_offset(rel);
                            (u64::from(at), base + i64::from(rel))
                        } else {
                            (pos, off)
                        };
                        seg.index_builder.reset(from.0, &idx, &tidx);
                        seg.index = idx;
                        seg.time_index = tidx;
                        from
                    }
                    None => {
                        report.indexes_rebuilt += 1;
                        seg.index_dirty = true;
                        (0, base)
                    }
                },
                None => {
                    seg.index_dirty = true;
                    (0, base)
                }
            };
            seg.next_offset = scan_offset;
            if scan_from < file_size {
                let file = seg.file.clone().unwrap_or_else(|| unreachable!("opened above"));
                let out = segment::scan(
                    &*file,
                    base,
                    scan_from,
                    scan_offset,
                    file_size,
                    log.config.index_interval_bytes,
                    &mut seg.index_builder,
                    &mut seg.index,
                    &mut seg.time_index,
                    &mut log.producers,
                )
                .await
                .map_err(|e| StorageError::io("scan segment", &path, e))?;
                report.bytes_scanned += out.valid_size - scan_from;
                for (epoch, start) in out.epoch_starts {
                    note_epoch(&mut log.epochs, epoch, start, &mut log.epochs_dirty);
                }
                seg.next_offset = out.next_offset;
                seg.index_dirty = true;
                // A torn or corrupt tail, or zeros past the data (space the segment reserved):
                // cut, and durably so, since once the recovery point is past this segment its
                // size is trusted. Only damage drops the later segments; after zeros they stay
                // (their base offsets are checked against this one's end).
                if out.problem.is_some() || out.zero_tail {
                    if let Some(problem) = out.problem {
                        report.problems.push(format!("{}: {problem}", path.display()));
                        report.bytes_truncated += file_size - out.valid_size;
                        drop_rest = true;
                    }
                    file.truncate(out.valid_size)
                        .await
                        .map_err(|e| StorageError::io("cut segment", &path, e))?;
                    file.fdatasync()
                        .await
                        .map_err(|e| StorageError::io("sync cut segment", &path, e))?;
                    seg.size = out.valid_size;
                    seg.durable_size = out.valid_size;
                }
            }
            expected = Some(seg.next_offset);
            let is_last = i + 1 == bases.len();
            if seg.is_empty() && !(is_last || drop_rest) {
                // An empty sealed segment (a crash right after a roll): drop it.
                report.bytes_truncated += remove_segment_files(&fs, &dir, base).await;
                log.mark_dir_changed();
                continue;
            }
            log.segments.push(seg);
        }
        let start_hint = log_start_file.unwrap_or(0).max(0);
        if log.segments.is_empty() {
            let start = expected.unwrap_or(start_hint);
            log.segments.push(Segment::new_lazy(&dir, start, now_ms));
        }
        let end = log.active().next_offset;
        log.next_offset = end;
        log.high_watermark = end;
        log.producers.truncate(end);
        let first_base = log.segments.first().map_or(0, |s| s.base_offset);
        log.log_start_offset = log_start_file.unwrap_or(first_base).clamp(first_base, end);
        // Epochs that begin past the end are gone (as Kafka's recovery truncates its epoch cache
        // to the log end); a leader's epoch begins at the end unless it already has (as Kafka
        // assigns it when the leader is elected).
        // The retain drops a suffix and the note adds at most one entry, so the length and the
        // last entry tell whether anything changed. (An empty log's epoch is dropped and noted
        // again: no change to write.)
        let before = (log.epochs.len(), log.epochs.last().copied());
        log.epochs.retain(|(_, start)| *start < end);
        if let Some(epoch) = leader_epoch {
            note_epoch(&mut log.epochs, epoch, end, &mut false);
        }
        log.epochs_dirty |= (log.epochs.len(), log.epochs.last().copied()) != before;
        log.last_checkpoint = if report.bytes_truncated == 0 && report.problems.is_empty() {
            trusted
        } else {
            None
        };
        if created_now {
            log.write_initial_files().await?;
        }
        Ok((log, report))
    }

    /// Writes a new log's recovery point (its start: nothing to trust yet) and, with a leader
    /// epoch, its epoch file, unsynced. The log's first checkpoint then rewrites the point in
    /// place and leaves the epoch file alone (until a new epoch), instead of creating both:
    /// creating files in thousands of log directories made the first clean stop of that many
    /// new logs take seconds (BENCHMARKS.md#new-log-files). A crash before that checkpoint (or before
    /// the store's file-system sync, see [`PartitionLog::initial_files_synced`]) may lose or
    /// tear either file. That is safe: a torn point fails its CRC, and one that survived is at
    /// the log's start, so recovery reads the whole log either way and notes the epochs of the
    /// batches it reads.
    async fn write_initial_files(&mut self) -> Result<(), StorageError> {
        let start = self.next_offset;
        let mut unsynced = Vec::new();
        if !self.epochs.is_empty() {
            let path = self.dir.join(EPOCH_FILE);
            let f = self
                .fs
                .open(&path, true)
                .await
                .map_err(|e| StorageError::io("create leader epochs", &path, e))?;
            f.write_all_at(encode_epochs(&self.epochs), 0)
                .await
                .map_err(|e| StorageError::io("write leader epochs", &path, e))?;
            self.epochs_dirty = false;
            unsynced.push(path);
        }
        let point = RecoveryPoint {
            offset: start,
            segment_base: self.active().base_offset,
            position: 0,
        };
        write_recovery_point(
            &self.fs,
            &self.dir.join(RECOVERY_POINT_FILE),
            point,
            self.producers.encode_snapshot(start),
            false,
        )
        .await?;
        self.unsynced_initial_files = Some((point, unsynced));
        Ok(())
    }

    /// Whether [`PartitionLog::open`] created the log and wrote files nothing has synced yet.
    pub(crate) fn has_unsynced_initial_files(&self) -> bool {
        self.unsynced_initial_files.is_some()
    }

    /// Records that the files written with the log are durable (the store synced the file
    /// system): its recovery point is then a checkpoint, and a log nothing was appended to needs
    /// no other.
    pub(crate) fn initial_files_synced(&mut self) {
        if let Some((point, _)) = self.unsynced_initial_files.take() {
            self.last_checkpoint.get_or_insert(point);
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn config(&self) -> &LogConfig {
        &self.config
    }

    /// Applies a new configuration (topic config change); takes effect at the next roll or
    /// retention pass.
    pub fn set_config(&mut self, config: LogConfig) {
        self.config = config;
    }

    pub fn log_start_offset(&self) -> i64 {
        self.log_start_offset
    }

    /// The offset the next appended record gets.
    pub fn log_end_offset(&self) -> i64 {
        self.next_offset
    }

    /// Offsets below this are durable and readable (by the log's own replica; clients read
    /// up to [`PartitionLog::visible_end`]).
    pub fn high_watermark(&self) -> i64 {
        self.high_watermark
    }

    /// What clients may see of the log: its durable end, capped at the commit offset for a
    /// replicated log. Client reads, ListOffsets, DeleteRecords and retention stop here.
    pub fn visible_end(&self) -> i64 {
        match self.commit_cap {
            Some(cap) => self.high_watermark.min(cap),
            None => self.high_watermark,
        }
    }

    /// Sets (or, with `None`, lifts) the commit cap of a replicated log. The commit offset of a
    /// Raft group never moves backward, so neither does the cap while it is set.
    pub fn set_commit_cap(&mut self, cap: Option<i64>) {
        debug_assert!(
            !matches!((self.commit_cap, cap), (Some(old), Some(new)) if new < old),
            "the commit cap moved backward"
        );
        self.commit_cap = cap;
    }

    /// The commit cap, if the log is replicated.
    pub fn commit_cap(&self) -> Option<i64> {
        self.commit_cap
    }

    /// Total bytes of all segments, including bytes not yet flushed.
    pub fn size_bytes(&self) -> u64 {
        self.segments.iter().map(|s| s.size).sum()
    }

    pub fn segment_count(&self) -> usize {
        self.segments.len()
    }

    /// Approximate heap memory of this log's in-memory state.
    pub fn heap_bytes(&self) -> usize {
        std::mem::size_of::<Self>()
            + self.segments.iter().map(|s| s.heap_bytes()).sum::<usize>()
            + self.staged.iter().map(|c| c.data.capacity()).sum::<usize>()
            + self.epochs.capacity() * 12
    }

    /// The newest leader epoch in the log and the offset where it starts.
    pub fn latest_epoch(&self) -> Option<(i32, i64)> {
        self.epochs.last().copied()
    }

    /// For OffsetForLeaderEpoch: the end offset of `epoch` (the start of the next larger epoch,
    /// or the log end for the latest), with the largest epoch at or below the one asked for.
    pub fn end_offset_for_epoch(&self, epoch: i32) -> Option<(i32, i64)> {
        let i = self.epochs.partition_point(|(e, _)| *e <= epoch);
        let (found, _) = *self.epochs.get(i.checked_sub(1)?)?;
        let end = self.epochs.get(i).map_or(self.next_offset, |(_, start)| *start);
        Some((found, end))
    }

    fn active(&self) -> &Segment<F> {
        // `segments` is never empty (open and every removal keep one).
        self.segments
            .last()
            .unwrap_or_else(|| unreachable!("log has no segment"))
    }

    fn active_mut(&mut self) -> &mut Segment<F> {
        self.segments
            .last_mut()
            .unwrap_or_else(|| unreachable!("log has no segment"))
    }

    fn should_roll(&self, batch_bytes: u64, now_ms: i64) -> bool {
        let seg = self.active();
        if seg.is_empty() {
            return false;
        }
        seg.size + batch_bytes > self.config.segment_bytes
            || seg.index.len() >= self.config.max_index_entries
            || now_ms - seg.created_ms > self.config.segment_ms
            || self.next_offset - seg.base_offset > i64::from(u32::MAX) / 2
    }

    /// The active segment's file is written no more: it gives back the space it reserved, and
    /// the next sync of it makes that last (see `FileHandle::seal`). Before a roll, and at a
    /// clean stop.
    pub(crate) fn seal_active(&mut self) {
        if let Some(seg) = self.segments.last_mut() {
            if seg.file.as_ref().is_some_and(|f| f.seal()) {
                self.cuts += 1;
                seg.cut_seq = self.cuts;
                seg.needs_sync = true;
            }
        }
    }

    /// Seals the files of the segments behind the active one not sealed yet: a segment rolled
    /// past before its file existed (the round that first writes a segment creates it) gets it
    /// here. Called as a direct round or a checkpoint collects its syncs, so that the cut is
    /// among them; a checkpoint moves the recovery point past a segment only after that.
    fn seal_behind(&mut self) {
        let Some((active, behind)) = self.segments.split_last_mut() else {
            return;
        };
        let mut below = active.base_offset;
        for seg in behind.iter_mut().rev() {
            if seg.base_offset < self.sealed_below {
                break;
            }
            match &seg.file {
                Some(f) => {
                    if f.seal() {
                        self.cuts += 1;
                        seg.cut_seq = self.cuts;
                        seg.needs_sync = true;
                    }
                }
                None => below = seg.base_offset,
            }
        }
        self.sealed_below = below;
    }

    /// Seals the active segment and starts a new, empty one at the log end offset. Never waits
    /// for the disk: the new file is created by the flush round that first writes to it, which
    /// also counts the directory change (see `complete_round`), and the sealed segment's
    /// indexes are left to the next checkpoint.
    fn roll(&mut self, now_ms: i64) {
        self.seal_active();
        let base = self.next_offset;
        let new = Segment::new_lazy(&self.dir, base, now_ms);
        self.segments.push(new);
    }

    /// Assigns offsets to a batch that has already been validated (CRC, size) and stages it for
    /// the next flush round, rolling the segment first if it is full or old. Synchronous, so
    /// offsets follow call order. The stored copy gets its `baseOffset` and
    /// `partitionLeaderEpoch` patched; nothing else changes.
    ///
    /// Batches from idempotent producers are checked against the producer's sequence first: a
    /// retry of a batch already appended is answered with the original offsets and not appended
    /// again ([`Appended::Duplicate`]); an out-of-sequence or fenced batch is refused.
    ///
    /// Returns the append's offsets and the stored bytes (for the shard journal).
    pub fn append(
        &mut self,
        validated: &[u8],
        leader_epoch: i32,
        now_ms: i64,
    ) -> Result<Appended<'_>, StorageError> {
        let header = BatchHeader::parse(validated).map_err(StorageError::InvalidBatch)?;
        match self.producers.check(&header) {
            ProducerCheck::Append => {}
            ProducerCheck::Duplicate {
                first_offset,
                last_offset,
            } => {
                return Ok(Appended::Duplicate(AppendInfo {
                    base_offset: first_offset,
                    last_offset,
                    log_start_offset: self.log_start_offset,
                }))
            }
            ProducerCheck::Reject(e) => return Err(StorageError::Producer(e)),
        }
        let (info, stored) = self.append_unchecked(validated, leader_epoch, now_ms)?;
        Ok(Appended::New(info, stored))
    }

    /// What [`PartitionLog::append`] would do with `validated` as far as its producer's
    /// sequence goes, without appending it: a replicated log's leader checks a batch this way
    /// before proposing it (its replicas append it with [`PartitionLog::append_replica`]).
    pub fn check_producer(&self, validated: &[u8]) -> Result<ProducerCheck, StorageError> {
        let header = BatchHeader::parse(validated).map_err(StorageError::InvalidBatch)?;
        Ok(self.producers.check(&header))
    }

    /// A follower's append: `batch`, which its leader already accepted at `base_offset`, goes
    /// there, stamped with `leader_epoch` (the Raft term) as its `partitionLeaderEpoch`. Refused
    /// unless `base_offset` is the log end offset ([`StorageError::NotAtLogEnd`]): a follower's
    /// log is the leader's, batch for batch, with no gap. The batch's CRC is checked (it came
    /// over the network), the producer-sequence check is not (the leader did it), and producer
    /// state is updated as journal replay updates it. An epoch begins where the first batch of
    /// a larger one goes; a smaller one (Raft terms do not go down along a log) is stamped but
    /// begins nothing.
    pub fn append_replica(
        &mut self,
        batch: &[u8],
        base_offset: i64,
        leader_epoch: i32,
        now_ms: i64,
    ) -> Result<(AppendInfo, &[u8]), StorageError> {
        if base_offset != self.next_offset {
            return Err(StorageError::NotAtLogEnd {
                offset: base_offset,
                log_end_offset: self.next_offset,
            });
        }
        batch::check_batch(batch).map_err(StorageError::InvalidBatch)?;
        let appended = self.append_unchecked(batch, leader_epoch, now_ms)?;
        debug_assert_eq!(appended.0.base_offset, base_offset);
        Ok(appended)
    }

    /// [`PartitionLog::append`] without the producer-sequence check: for batches that were
    /// already accepted once (journal replay). Producer state is still updated.
    pub fn append_unchecked(
        &mut self,
        validated: &[u8],
        leader_epoch: i32,
        now_ms: i64,
    ) -> Result<(AppendInfo, &[u8]), StorageError> {
        let header = BatchHeader::parse(validated).map_err(StorageError::InvalidBatch)?;
        let total = header.total_bytes();
        let data = validated.get(..total).ok_or(StorageError::InvalidBatch(
            strand_protocol::batch::BatchError::Truncated {
                needed: total,
                available: validated.len(),
            },
        ))?;
        debug_assert!(
            batch::check_batch(data).is_ok(),
            "append of a batch that fails its CRC"
        );
        if self.should_roll(total as u64, now_ms) {
            self.roll(now_ms);
        }
        let base_offset = self.next_offset;
        let last_offset = base_offset + i64::from(header.last_offset_delta);
        note_epoch(
            &mut self.epochs,
            leader_epoch,
            base_offset,
            &mut self.epochs_dirty,
        );

        let interval = self.config.index_interval_bytes;
        let seg = self.active_mut();
        let position = seg.size;
        let stored_header = BatchHeader {
            base_offset,
            partition_leader_epoch: leader_epoch,
            ..header
        };
        seg.index_builder.on_batch(
            seg.base_offset,
            position,
            &stored_header,
            interval,
            &mut seg.index,
            &mut seg.time_index,
        );
        seg.size += total as u64;
        seg.next_offset = last_offset + 1;
        seg.index_dirty = true;
        seg.needs_sync = true;
        let file = seg.file.clone();
        let created = seg.created.clone();
        let path = seg.log_path.clone();
        let segment_base = seg.base_offset;

        if self.staged.is_empty() {
            self.staged_since = Some(Instant::now());
        }
        // A chunk stays within STAGE_CHUNK_MAX_BYTES (unless one batch is larger).
        let fits = matches!(self.staged.last(),
            Some(c) if c.segment_base == segment_base
                && c.position + c.data.len() as u64 == position
                && (c.data.is_empty() || c.data.len() + total <= STAGE_CHUNK_MAX_BYTES));
        if !fits {
            self.staged.push(StagedChunk {
                file,
                created,
                path,
                segment_base,
                position,
                data: self.fs.stage_buf(total.max(self.stage_hint_bytes), position),
            });
        }
        let chunk = self
            .staged
            .last_mut()
            .unwrap_or_else(|| unreachable!("pushed above"));
        let start = chunk.data.len();
        chunk.data.extend_from_slice(data);
        if let Some(stored) = chunk.data.data_mut().get_mut(start..) {
            batch::patch_batch(stored, base_offset, leader_epoch);
        }
        self.next_offset = last_offset + 1;
        self.producers.append_pending(&header, base_offset);
        let info = AppendInfo {
            base_offset,
            last_offset,
            log_start_offset: self.log_start_offset,
        };
        let stored: &[u8] = self
            .staged
            .last()
            .and_then(|c| c.data.data().get(start..))
            .unwrap_or_default();
        Ok((info, stored))
    }

    fn mark_dir_changed(&mut self) {
        self.dir_dirty = true;
        self.dir_changes += 1;
    }

    /// What a *direct* flush round (one that skips the shard journal) must sync besides the
    /// files it writes, so that everything below its end offset is durable in this log's own
    /// files: every segment file with writes not yet synced (a write of an earlier, journaled
    /// round may sit in a segment before the one this round writes, and recovery drops
    /// everything after a torn segment), and the directory if the staged writes create a
    /// segment file (a roll). `None` when the log cannot take a direct round: a segment file was
    /// created or removed and no checkpoint or directory sync
    /// ([`crate::ShardStore::sync_changed_dirs`]) has synced the directory since. Call before
    /// taking the staged writes.
    pub(crate) fn direct_sync(&mut self) -> Option<DirectSync<F::File>> {
        if self.dir_changes > self.dir_changes_synced {
            return None;
        }
        self.seal_behind();
        Some(DirectSync {
            files: self
                .segments
                .iter()
                .filter(|s| s.needs_sync || s.checkpoint_syncing)
                .filter_map(|s| s.file.clone())
                .collect(),
            creates_at: self
                .staged
                .iter()
                .any(|c| c.file.is_none())
                .then_some(self.dir_changes),
        })
    }

    /// After a direct round made `files` durable: segments behind the active one among them
    /// need no sync any more. Without this only a checkpoint cleared the mark, so every direct
    /// round until the next one (up to a minute) synced every segment the log had rolled past
    /// since the last (BENCHMARKS.md#rolled-segment-sync), each `fdatasync` a device flush on a file system
    /// without a journal. No write reaches a segment after the roll, except from a round taken
    /// before it; such a round syncs the files it wrote itself and marks them again when it
    /// completes (`complete_round`), so clearing the mark here loses nothing. The active segment
    /// keeps its mark: an overlapping round may have written to it after this round's sync
    /// began, and every direct round syncs the files it writes anyway.
    ///
    /// `cuts_at` is [`PartitionLog::cuts`] when the round took its writes: a segment sealing cut
    /// back after that keeps its mark, since the round's sync may have begun before the cut
    /// and not cover it (the next round or checkpoint syncs it; a recovery point must not pass
    /// a segment whose file may still end in reserved space after a crash).
    pub(crate) fn rolled_segments_synced(&mut self, files: &[Rc<F::File>], cuts_at: u64) {
        let last = self.segments.len().saturating_sub(1);
        for seg in self.segments.iter_mut().take(last) {
            if seg.needs_sync
                && seg.cut_seq <= cuts_at
                && seg
                    .file
                    .as_ref()
                    .is_some_and(|f| files.iter().any(|g| Rc::ptr_eq(f, g)))
            {
                seg.needs_sync = false;
            }
        }
    }

    /// Segment files sealing has cut back so far (see [`PartitionLog::rolled_segments_synced`]).
    pub(crate) fn cuts(&self) -> u64 {
        self.cuts
    }

    /// Directory changes counted so far (see [`PartitionLog::direct_sync`]).
    pub(crate) fn dir_changes(&self) -> u64 {
        self.dir_changes
    }

    /// The directory-change count a directory sync starting now covers, if some change is not
    /// covered yet.
    pub(crate) fn unsynced_dir_changes(&self) -> Option<u64> {
        (self.dir_changes > self.dir_changes_synced).then_some(self.dir_changes)
    }

    /// Records a directory sync that covered the first `changes` directory changes.
    pub(crate) fn dir_synced(&mut self, changes: u64) {
        self.dir_changes_synced = self.dir_changes_synced.max(changes);
    }

    /// Whether appended batches wait to be written.
    pub fn has_staged(&self) -> bool {
        !self.staged.is_empty()
    }

    /// Bytes of appended batches waiting to be written.
    pub(crate) fn staged_bytes(&self) -> usize {
        self.staged.iter().map(|c| c.data.len()).sum()
    }

    /// Takes the staged batches for a flush round.
    pub(crate) fn take_staged(&mut self) -> Option<StagedWrites<F::File>> {
        if self.staged.is_empty() {
            return None;
        }
        self.takes_in_flight += 1;
        self.stage_hint_bytes = self
            .staged_bytes()
            .clamp(STAGE_CHUNK_MIN_BYTES, STAGE_CHUNK_MAX_BYTES);
        Some(StagedWrites {
            chunks: std::mem::take(&mut self.staged),
            end_offset: self.next_offset,
            staged_at: self.staged_since.take(),
        })
    }

    /// For exclusive owners without a journal (start-up replay, tools, tests): writes the staged
    /// batches to their segments, fsyncs them and makes them visible.
    pub async fn flush_exclusive(&mut self) -> Result<(), StorageError> {
        let Some(writes) = self.take_staged() else {
            return Ok(());
        };
        let written = match write_chunks(&self.fs, writes.chunks).await {
            Ok(w) => w,
            Err(e) => {
                let plan = self.discard_unflushed();
                plan.run(&self.fs).await;
                return Err(e);
            }
        };
        for (i, w) in written.iter().enumerate() {
            if written
                .get(..i)
                .is_some_and(|before| before.iter().any(|b| Rc::ptr_eq(&b.file, &w.file)))
            {
                continue;
            }
            if let Err(e) = w.file.fdatasync().await {
                let plan = self.discard_unflushed();
                plan.run(&self.fs).await;
                return Err(StorageError::io("sync segment", &self.dir, e));
            }
        }
        self.complete_round(writes.end_offset, written);
        Ok(())
    }

    /// Records that a flush round made everything below `end_offset` durable and written to the
    /// segment files: it becomes visible to readers. A round's takes complete in the order they
    /// were made.
    pub(crate) fn complete_round(&mut self, end_offset: i64, written: Vec<WrittenChunk<F::File>>) {
        self.takes_in_flight = self.takes_in_flight.saturating_sub(1);
        for w in written {
            if let Some(seg) = self.segments.iter_mut().find(|s| s.base_offset == w.segment_base) {
                if seg.file.is_none() {
                    seg.file = Some(w.file);
                    // A new file: the directory needs a sync before the journal may go.
                    self.dir_dirty = true;
                    self.dir_changes += 1;
                }
                seg.durable_size = seg.durable_size.max(w.end_position.min(seg.size));
                // Set here, when the bytes are in the file, not at append: a checkpoint that
                // collects its work between the append and the write must not clear it.
                seg.needs_sync = true;
            }
        }
        debug_assert!(
            end_offset >= self.high_watermark,
            "high watermark must not go back"
        );
        self.high_watermark = self.high_watermark.max(end_offset);
        self.producers.flushed(self.high_watermark);
    }

    /// After a failed flush round: throws away everything above the high watermark (nothing
    /// there was acknowledged). Synchronous; the returned plan cuts the files back.
    pub(crate) fn discard_unflushed(&mut self) -> DiscardPlan<F::File> {
        self.tail_discarded = true;
        self.takes_in_flight = 0;
        self.staged.clear();
        self.staged_since = None;
        self.producers.discard_pending();
        self.discard_generation += 1;
        let hw = self.high_watermark;
        let mut plan = DiscardPlan {
            truncate: Vec::new(),
            delete: Vec::new(),
            dir: self.dir.clone(),
        };
        while self.segments.len() > 1 && self.active().base_offset >= hw {
            if let Some(seg) = self.segments.pop() {
                plan.delete.push(seg.base_offset);
                self.mark_dir_changed();
            }
        }
        // Segments rolled past later may be based below where sealing had got to.
        self.sealed_below = self.sealed_below.min(self.active().base_offset);
        let seg = self.active_mut();
        let position = seg.durable_size;
        if let Some(file) = &seg.file {
            plan.truncate.push((file.clone(), position));
        }
        seg.truncate_to(position, hw);
        self.next_offset = hw;
        let before = self.epochs.len();
        self.epochs.retain(|(_, start)| *start < hw);
        if self.epochs.len() != before {
            self.epochs_dirty = true;
        }
        plan
    }

    /// Counts failed flush rounds that discarded appends; an append whose generation changed
    /// before it became durable was discarded, whatever offsets later appends reuse.
    pub fn discard_generation(&self) -> u64 {
        self.discard_generation
    }

    /// What must happen to this log's files before the store takes writes again after a failed
    /// flush round discarded its tail, or `None` if it discarded nothing here (see
    /// [`ResumeCut`]). Call with no round in flight and no discard plan running.
    pub(crate) fn resume_cut(&mut self) -> Option<ResumeCut<F::File>> {
        if !self.tail_discarded {
            return None;
        }
        debug_assert!(self.staged.is_empty() && self.takes_in_flight == 0);
        debug_assert_eq!(self.next_offset, self.high_watermark);
        let seg = self.active();
        Some(ResumeCut {
            dir: self.dir.clone(),
            base: seg.base_offset,
            // The file the round that failed created, if it had none before.
            file: seg.file.clone().or_else(|| seg.created.borrow().clone()),
            len: seg.size,
            dir_changes: self.dir_changes,
            // As recovery does when it cuts index entries: back to the last offset-index entry.
            rescan: TailRescan::of(seg),
            index_interval_bytes: self.config.index_interval_bytes,
        })
    }

    /// Records that a [`ResumeCut`] from [`PartitionLog::resume_cut`] ran: the files end where
    /// the log does, durably, its directory sync covered the changes counted when it was
    /// planned, and the active segment has its indexes rebuilt.
    pub(crate) fn resume_cut_done(&mut self, done: ResumeCutDone) {
        self.tail_discarded = false;
        self.dir_synced(done.dir_changes);
        let seg = self.active_mut();
        (seg.index_builder, seg.index, seg.time_index) = done.indexes;
        seg.index_dirty = true;
    }

    /// Whether nothing is staged and no flush round is writing this log.
    pub(crate) fn is_quiescent(&self) -> bool {
        self.staged.is_empty() && self.takes_in_flight == 0
    }

    /// The first step of a store-level truncation at `offset` ([`crate::ShardStore::truncate_log`]),
    /// with nothing staged or in flight: checks the range and says where to look for the batch
    /// starting at `offset`, or `None` if `offset` is the log end (nothing to cut).
    pub(crate) fn truncation_lookup(
        &self,
        offset: i64,
    ) -> Result<Option<BoundaryLookup<F::File>>, StorageError> {
        if offset < self.log_start_offset || offset > self.next_offset {
            return Err(StorageError::OffsetOutOfRange {
                offset,
                log_start_offset: self.log_start_offset,
                log_end_offset: self.next_offset,
            });
        }
        debug_assert!(
            self.is_quiescent(),
            "truncation lookup while a round writes the log"
        );
        if offset == self.next_offset {
            return Ok(None);
        }
        // The segment that will be the active one: the last based below `offset`.
        let seg = self
            .segments
            .iter()
            .rev()
            .find(|s| s.base_offset < offset)
            .unwrap_or_else(|| self.active_first());
        if offset >= seg.next_offset {
            return Ok(Some(BoundaryLookup::At(seg.base_offset, seg.size)));
        }
        let Some(file) = seg.file.clone() else {
            return Err(StorageError::NotBatchBoundary(offset));
        };
        let entry = seg.index.lookup(relative(seg.base_offset, offset));
        Ok(Some(BoundaryLookup::Scan {
            file,
            path: seg.log_path.clone(),
            segment_base: seg.base_offset,
            from: u64::from(entry.position),
            size: seg.size,
            offset,
        }))
    }

    /// A truncation's bookkeeping once the active segment ends at `offset`: the log end, the
    /// high watermark if it was above, the producer state and the leader epochs from `offset`
    /// on (as Kafka's leader epoch cache is truncated with its log).
    fn forget_from(&mut self, offset: i64) {
        self.next_offset = offset;
        self.high_watermark = self.high_watermark.min(offset);
        self.producers.truncate(offset);
        let before = self.epochs.len();
        self.epochs.retain(|(_, start)| *start < offset);
        if self.epochs.len() != before {
            self.epochs_dirty = true;
        }
    }

    fn active_first(&self) -> &Segment<F> {
        self.segments
            .first()
            .unwrap_or_else(|| unreachable!("log has no segment"))
    }

    /// The memory part of a store-level truncation: every batch at or after `offset` goes
    /// (`position` is where it starts in the segment based at `segment_base`, found by a
    /// [`BoundaryLookup`]), with the segments past it, its producer state, its leader epochs
    /// from `offset` on (as Kafka's leader epoch cache is truncated with its log), and the high
    /// watermark if it was above. The returned plan cuts the files, durably.
    pub(crate) fn cut_at(&mut self, offset: i64, segment_base: i64, position: u64) -> CutPlan<F::File> {
        debug_assert!(self.is_quiescent(), "truncation while a round writes the log");
        let mut removed = Vec::new();
        while self.segments.len() > 1 && self.active().base_offset > segment_base {
            if let Some(seg) = self.segments.pop() {
                removed.push(seg.base_offset);
                self.mark_dir_changed();
            }
        }
        assert_eq!(
            self.active().base_offset,
            segment_base,
            "the lookup's segment is still there"
        );
        // Segments rolled past later may be based below where sealing had got to.
        self.sealed_below = self.sealed_below.min(self.active().base_offset);
        let seg = self.active_mut();
        assert!(position <= seg.size, "cut past the segment's end");
        seg.truncate_to(position, offset);
        seg.durable_size = seg.durable_size.min(position);
        seg.needs_sync = true;
        self.forget_from(offset);
        let seg = self.active();
        let plan = CutPlan {
            dir: self.dir.clone(),
            epochs: encode_epochs(&self.epochs),
            removed,
            file: seg.file.clone(),
            base: seg.base_offset,
            len: position,
            rescan: TailRescan::of(seg),
            index_interval_bytes: self.config.index_interval_bytes,
        };
        // The plan removes the recovery point; the truncation's checkpoint writes a new one
        // (a new file, whose directory entry it syncs).
        self.last_checkpoint = None;
        plan
    }

    /// Records that a [`CutPlan`] ran: the active segment gets its rebuilt indexes.
    pub(crate) fn cut_done(&mut self, indexes: (IndexBuilder, OffsetIndex, TimeIndex)) {
        let seg = self.active_mut();
        (seg.index_builder, seg.index, seg.time_index) = indexes;
        seg.index_dirty = true;
    }

    /// Removes every record at or after `offset`, which must be a batch boundary between the
    /// log start and end, for an exclusive owner (tools, tests): the files are cut, but nothing
    /// is synced and no journal is fenced. A shard's logs are truncated through
    /// [`crate::ShardStore::truncate_log`], which is durable, journal replay included.
    ///
    /// Like that one, only above what clients could read, which keeps [`FileRegion`]s valid:
    /// the pages `sendfile` queues on a socket are the page cache's own until the client reads
    /// them.
    pub async fn truncate_suffix(&mut self, offset: i64) -> Result<(), StorageError> {
        if offset < self.log_start_offset || offset > self.next_offset {
            return Err(StorageError::OffsetOutOfRange {
                offset,
                log_start_offset: self.log_start_offset,
                log_end_offset: self.next_offset,
            });
        }
        if !self.staged.is_empty() || self.takes_in_flight > 0 {
            return Err(StorageError::Busy("truncation while a flush round is pending"));
        }
        self.truncate_suffix_inner(offset).await
    }

    async fn truncate_suffix_inner(&mut self, offset: i64) -> Result<(), StorageError> {
        while self.segments.len() > 1 && self.active().base_offset >= offset {
            if let Some(seg) = self.segments.pop() {
                self.delete_segment_files(&seg).await;
            }
        }
        // Segments rolled past later may be based below where sealing had got to.
        self.sealed_below = self.sealed_below.min(self.active().base_offset);
        let seg = self.active();
        let position = if offset >= seg.next_offset {
            seg.size
        } else {
            match &seg.file {
                Some(file) => find_batch_position(&**file, seg, offset).await?,
                None => 0,
            }
        };
        let seg = self.active_mut();
        if let Some(file) = &seg.file {
            file.truncate(position)
                .await
                .map_err(|e| StorageError::io("truncate segment", &seg.log_path, e))?;
        }
        seg.truncate_to(position, offset);
        let seg = self.active();
        if let Some(file) = seg.file.clone() {
            let (rescan, base) = (TailRescan::of(seg), seg.base_offset);
            let interval = self.config.index_interval_bytes;
            let indexes = rescan.run(&*file, base, position, interval, &self.dir).await?;
            let seg = self.active_mut();
            (seg.index_builder, seg.index, seg.time_index) = indexes;
        }
        let seg = self.active_mut();
        seg.durable_size = seg.durable_size.min(position);
        seg.needs_sync = true;
        self.forget_from(offset);
        if self.last_checkpoint.is_some_and(|cp| cp.offset > offset) {
            self.last_checkpoint = None;
        }
        Ok(())
    }

    /// Plans a read of up to `max_bytes` of whole batches starting with the batch that holds
    /// `offset`. At least one whole batch is returned even if it is larger (KIP-74). `Ok(None)`
    /// when there is nothing to read yet (`offset` is the high watermark).
    pub fn plan_read(
        &self,
        offset: i64,
        max_bytes: usize,
    ) -> Result<Option<ReadPlan<F::File>>, StorageError> {
        self.plan_read_to(offset, max_bytes, self.visible_end())
    }

    /// As [`PartitionLog::plan_read`], but up to the durable end whatever the commit cap: a
    /// replica's own reads of its log (what a leader sends its followers).
    pub fn plan_replica_read(
        &self,
        offset: i64,
        max_bytes: usize,
    ) -> Result<Option<ReadPlan<F::File>>, StorageError> {
        self.plan_read_to(offset, max_bytes, self.high_watermark)
    }

    /// Plans a read of the batches below `end` (a batch boundary at or below the durable end).
    fn plan_read_to(
        &self,
        offset: i64,
        max_bytes: usize,
        end: i64,
    ) -> Result<Option<ReadPlan<F::File>>, StorageError> {
        debug_assert!(end <= self.high_watermark);
        if offset < self.log_start_offset || offset > end {
            return Err(StorageError::OffsetOutOfRange {
                offset,
                log_start_offset: self.log_start_offset,
                log_end_offset: end,
            });
        }
        if offset == end {
            return Ok(None);
        }
        let i = self.segments.partition_point(|s| s.base_offset <= offset);
        let Some(mut seg) = i.checked_sub(1).and_then(|i| self.segments.get(i)) else {
            return Ok(None);
        };
        if offset >= seg.next_offset {
            // Past the end of its segment (only possible at a segment boundary): the next one.
            match self.segments.get(i) {
                Some(next) => seg = next,
                None => return Ok(None),
            }
        }
        let Some(file) = seg.file.clone() else {
            return Ok(None);
        };
        let entry = seg
            .index
            .lookup(relative(seg.base_offset, offset.max(seg.base_offset)));
        Ok(Some(ReadPlan {
            file,
            path: seg.log_path.clone(),
            start_position: u64::from(entry.position),
            end_position: seg.durable_size,
            target_offset: offset,
            end_offset: end,
            max_bytes,
            index_interval_bytes: self.config.index_interval_bytes,
        }))
    }

    /// Plans a timestamp lookup (ListOffsets): the first offset whose record timestamp is at or
    /// after `timestamp`. Run it with [`TimestampPlan::execute`]; it answers `None` when every
    /// readable record is older.
    pub fn timestamp_plan(&self, timestamp: i64) -> TimestampPlan<F::File> {
        let segments = self
            .segments
            .iter()
            .filter(|seg| {
                seg.max_timestamp() >= timestamp
                    && seg.durable_size > 0
                    && seg.next_offset > self.log_start_offset
                    && seg.file.is_some()
            })
            .filter_map(|seg| {
                let entry = seg.index.lookup(seg.time_index.lookup_before(timestamp));
                Some(SegmentScan {
                    file: seg.file.clone()?,
                    path: seg.log_path.clone(),
                    start_position: u64::from(entry.position),
                    end_position: seg.durable_size,
                })
            })
            .collect();
        TimestampPlan {
            timestamp,
            log_start_offset: self.log_start_offset,
            segments,
        }
    }

    /// Plans the lookup of the record with the largest timestamp (ListOffsets -3, KIP-734); the
    /// earliest such record when several share it. `None` when the log is empty.
    pub fn max_timestamp_plan(&self) -> Option<TimestampPlan<F::File>> {
        let max = self
            .segments
            .iter()
            .filter(|s| s.durable_size > 0 && s.next_offset > self.log_start_offset)
            .map(|s| s.max_timestamp())
            .max()?;
        Some(self.timestamp_plan(max))
    }

    /// [`PartitionLog::timestamp_plan`] and its execution, for exclusive owners.
    pub async fn offset_for_timestamp(&self, timestamp: i64) -> Result<Option<(i64, i64)>, StorageError> {
        self.timestamp_plan(timestamp).execute().await
    }

    /// [`PartitionLog::max_timestamp_plan`] and its execution, for exclusive owners.
    pub async fn max_timestamp_offset(&self) -> Result<Option<(i64, i64)>, StorageError> {
        match self.max_timestamp_plan() {
            Some(plan) => plan.execute().await,
            None => Ok(None),
        }
    }

    /// Checks a DeleteRecords target: `Ok(true)` if it moves the log start offset forward.
    pub fn check_log_start_offset(&self, offset: i64) -> Result<bool, StorageError> {
        let end = self.visible_end();
        if offset > end || offset < 0 {
            return Err(StorageError::OffsetOutOfRange {
                offset,
                log_start_offset: self.log_start_offset,
                log_end_offset: end,
            });
        }
        Ok(offset > self.log_start_offset)
    }

    /// Moves the log start offset forward to `offset` (which must already be persisted with
    /// [`persist_log_start_offset`]) and detaches the segments wholly below it. Returns their
    /// base offsets; the caller deletes the files with [`remove_segment_files`].
    pub fn advance_log_start_offset(&mut self, offset: i64) -> Vec<i64> {
        let mut deleted = Vec::new();
        if offset <= self.log_start_offset || offset > self.high_watermark {
            return deleted;
        }
        self.log_start_offset = offset;
        while self.segments.len() > 1 {
            let first = &self.segments[0];
            if first.next_offset <= offset && first.durable_size == first.size {
                deleted.push(self.segments.remove(0).base_offset);
                self.mark_dir_changed();
            } else {
                break;
            }
        }
        deleted
    }

    /// DeleteRecords for exclusive owners (tests, tools): persist, advance, delete files.
    pub async fn delete_records_before(&mut self, offset: i64) -> Result<i64, StorageError> {
        if self.check_log_start_offset(offset)? {
            persist_log_start_offset(&self.fs, &self.dir, offset).await?;
            for base in self.advance_log_start_offset(offset) {
                remove_segment_files(&self.fs, &self.dir, base).await;
            }
        }
        Ok(self.log_start_offset)
    }

    /// Decides time and size retention and detaches the segments to delete, oldest first; the
    /// caller deletes their files with [`remove_segment_files`]. A segment goes when its newest
    /// record is older than `retention.ms`, or while the log without it is still at least
    /// `retention.bytes`. An active segment that has expired whole is rolled first so it can go.
    pub fn plan_retention(&mut self, now_ms: i64) -> RetentionOutcome {
        let mut outcome = RetentionOutcome::default();
        if let Some(retention_ms) = self.config.retention_ms {
            let cutoff = now_ms.saturating_sub(retention_ms);
            let active = self.active();
            if !active.is_empty()
                && active.max_timestamp() < cutoff
                && active.durable_size == active.size
                && self.staged.is_empty()
                && self.takes_in_flight == 0
            {
                self.roll(now_ms);
            }
            while self.segments.len() > 1 {
                let first = &self.segments[0];
                if first.max_timestamp() >= cutoff || first.durable_size != first.size || self.floor_blocks()
                {
                    break;
                }
                let seg = self.segments.remove(0);
                outcome.bytes_deleted += seg.size;
                outcome.deleted.push(seg.base_offset);
            }
        }
        if let Some(retention_bytes) = self.config.retention_bytes {
            let mut total = self.size_bytes();
            while self.segments.len() > 1 {
                let first = &self.segments[0];
                if total < retention_bytes.saturating_add(first.size)
                    || first.durable_size != first.size
                    || self.floor_blocks()
                {
                    break;
                }
                let seg = self.segments.remove(0);
                total -= seg.size;
                outcome.bytes_deleted += seg.size;
                outcome.deleted.push(seg.base_offset);
            }
        }
        if !outcome.deleted.is_empty() {
            self.mark_dir_changed();
        }
        let first_base = self.segments.first().map_or(0, |s| s.base_offset);
        self.log_start_offset = self.log_start_offset.max(first_base);
        outcome.log_start_offset = self.log_start_offset;
        outcome
    }

    /// Whether the retention floor forbids deleting the first segment (it may hold an offset at
    /// or above the floor: the next segment starts above it).
    fn floor_blocks(&self) -> bool {
        // A replicated log's uncommitted suffix may still be cut by its Raft group: retention
        // stops below the commit offset too.
        let floor = match (self.retention_floor, self.commit_cap) {
            (Some(f), Some(c)) => Some(f.min(c)),
            (f, c) => f.or(c),
        };
        match (floor, self.segments.get(1)) {
            (Some(floor), Some(next)) => next.base_offset > floor,
            _ => false,
        }
    }

    /// Sets the offset below which retention may delete (`None`: no floor). Readers that still
    /// need messages (the queue engine's undelivered ones) hold it; DeleteRecords ignores it.
    pub fn set_retention_floor(&mut self, floor: Option<i64>) {
        self.retention_floor = floor;
    }

    /// Retention for exclusive owners (tests, tools): plan, then delete the files.
    pub async fn apply_retention(&mut self, now_ms: i64) -> RetentionOutcome {
        let outcome = self.plan_retention(now_ms);
        for base in &outcome.deleted {
            remove_segment_files(&self.fs, &self.dir, *base).await;
        }
        outcome
    }

    async fn delete_segment_files(&mut self, seg: &Segment<F>) {
        remove_segment_files(&self.fs, &self.dir, seg.base_offset).await;
        self.mark_dir_changed();
    }

    /// Whether anything changed since the last checkpoint.
    pub fn needs_checkpoint(&self) -> bool {
        self.last_checkpoint
            .is_none_or(|cp| cp.offset != self.high_watermark)
            || self.dir_dirty
            || self.epochs_dirty
            || self.segments.iter().any(|s| {
                (s.needs_sync && s.file.is_some())
                    || (s.index_dirty && s.index_files_on_disk == IndexFilesOnDisk::Unknown)
            })
    }

    /// Collects what a checkpoint must make durable so that recovery can trust everything below
    /// the current high watermark. Call only between flush rounds (nothing in flight).
    pub(crate) fn checkpoint_work(&mut self) -> CheckpointWork<F::File> {
        // The recovery point may move past a segment sealed since the last checkpoint: its
        // file must end where its data ends, durably, first.
        self.seal_behind();
        let hw = self.high_watermark;
        let mut files_to_sync = Vec::new();
        let mut index_files = Vec::new();
        let last = self.segments.len().saturating_sub(1);
        for (i, seg) in self.segments.iter_mut().enumerate() {
            let Some(file) = &seg.file else { continue };
            if seg.needs_sync {
                files_to_sync.push(file.clone());
                seg.needs_sync = false;
                seg.checkpoint_syncing = true;
            }
            if seg.index_dirty {
                if seg.needs_index_files(self.config.index_interval_bytes) {
                    let whole = seg.index_files_on_disk != IndexFilesOnDisk::Durable;
                    if whole {
                        seg.index_files_on_disk = IndexFilesOnDisk::Replacing;
                    }
                    // Entries past the durable size are harmless: recovery cuts them at the point.
                    index_files.extend(seg.index_files().map(|(path, data)| (path, data, whole)));
                }
                seg.index_dirty = i == last;
            }
        }
        let active = self.active();
        // Never at the start of a segment without a file (one a roll began, at the high
        // watermark, and no round has written yet): a crash or a failed round can take that
        // segment away, and the one before it takes appends again, with space reserved past
        // them, while the point would vouch that it ends at its data.
        let (segment_base, position, offset) = if active.file.is_some() {
            (
                active.base_offset,
                active.durable_size,
                hw.min(active.next_offset),
            )
        } else {
            // The active segment has no file yet: point at the end of the previous one.
            let prev = self
                .segments
                .len()
                .checked_sub(2)
                .and_then(|i| self.segments.get(i));
            match prev {
                Some(p) => (p.base_offset, p.durable_size, p.next_offset.min(hw)),
                None => (active.base_offset, 0, active.base_offset),
            }
        };
        let write_epochs = self.epochs_dirty.then(|| encode_epochs(&self.epochs));
        self.epochs_dirty = false;
        // The directory entries of the files written with the log are not durable yet either.
        let sync_dir = std::mem::take(&mut self.dir_dirty) || self.unsynced_initial_files.is_some();
        self.dir_changes_checkpointing = sync_dir.then_some(self.dir_changes);
        CheckpointWork {
            files_to_sync,
            initial_files_to_sync: self
                .unsynced_initial_files
                .as_ref()
                .map(|(_, files)| files.clone())
                .unwrap_or_default(),
            index_files,
            sync_dir,
            write_epochs,
            renames: Vec::new(),
            dir: self.dir.clone(),
            io: None,
            // `durable` producer state is exact as of the high watermark, which is `offset`.
            producers: self.producers.encode_snapshot(offset),
            new_point_file: self.last_checkpoint.is_none() && self.unsynced_initial_files.is_none(),
            point: RecoveryPoint {
                offset,
                segment_base,
                position,
            },
        }
    }

    /// Drops idle producers (see [`ProducerState::expire`]).
    pub fn expire_producers(&mut self, now_ms: i64, expiration_ms: i64, max_producers: usize) -> usize {
        self.producers.expire(now_ms, expiration_ms, max_producers)
    }

    /// Records a completed checkpoint.
    pub(crate) fn checkpoint_done(&mut self, point: RecoveryPoint) {
        self.last_checkpoint = Some(point);
        self.unsynced_initial_files = None;
        if let Some(changes) = self.dir_changes_checkpointing.take() {
            self.dir_changes_synced = self.dir_changes_synced.max(changes);
        }
        for seg in &mut self.segments {
            seg.checkpoint_syncing = false;
            if seg.index_files_on_disk == IndexFilesOnDisk::Replacing {
                seg.index_files_on_disk = IndexFilesOnDisk::Durable;
            }
        }
    }

    pub(crate) fn checkpoint_failed(&mut self) {
        self.dir_changes_checkpointing = None;
        // Make the next checkpoint redo everything.
        self.mark_dir_changed();
        self.epochs_dirty = true;
        for seg in &mut self.segments {
            seg.needs_sync = seg.file.is_some();
            seg.checkpoint_syncing = false;
            seg.index_dirty = true;
            if seg.index_files_on_disk == IndexFilesOnDisk::Replacing {
                seg.index_files_on_disk = IndexFilesOnDisk::Unknown;
            }
        }
    }

    /// The last checkpoint of this log, if it has one.
    pub fn last_checkpoint(&self) -> Option<RecoveryPoint> {
        self.last_checkpoint
    }
}

fn encode_epochs(epochs: &[(i32, i64)]) -> Vec<u8> {
    let mut text = format!("0\n{}\n", epochs.len());
    for (epoch, start) in epochs {
        text.push_str(&format!("{epoch} {start}\n"));
    }
    text.into_bytes()
}

/// Writes a log's staged chunks in order, creating a new segment's file with its first chunk.
pub(crate) async fn write_chunks<F: Fs>(
    fs: &F,
    chunks: Vec<StagedChunk<F::File>>,
) -> Result<Vec<WrittenChunk<F::File>>, StorageError> {
    let mut done: Vec<WrittenChunk<F::File>> = Vec::with_capacity(chunks.len());
    for chunk in chunks {
        done.push(write_chunk(fs, chunk).await?);
    }
    Ok(done)
}

/// Writes one staged chunk, creating its segment file first if the segment is new: once, for
/// every chunk of this round and of rounds taken before it completes (`created`).
async fn write_chunk<F: Fs>(
    fs: &F,
    chunk: StagedChunk<F::File>,
) -> Result<WrittenChunk<F::File>, StorageError> {
    let path = chunk.path;
    let known = chunk.file.or_else(|| chunk.created.borrow().clone());
    let file = match known {
        Some(f) => f,
        None => {
            let f = Rc::new(
                fs.open_segment(&path, true)
                    .await
                    .map_err(|e| StorageError::io("create segment", &path, e))?,
            );
            chunk.created.replace(Some(Rc::clone(&f)));
            f
        }
    };
    if chunk.position == 0 {
        // A leftover file of a discarded round must not keep stale bytes past our data.
        file.truncate(0)
            .await
            .map_err(|e| StorageError::io("create segment", &path, e))?;
    }
    let end_position = chunk.position + chunk.data.len() as u64;
    file.write_staged(chunk.data, chunk.position)
        .await
        .map_err(|e| StorageError::io("write segment", &path, e))?;
    Ok(WrittenChunk {
        segment_base: chunk.segment_base,
        file,
        end_position,
    })
}

/// Upper bound for looking inside one compressed batch (slow paths only).
const RECORD_SCAN_LIMIT: usize = 64 << 20;

impl<Fl: FileHandle> ReadPlan<Fl> {
    /// The most bytes [`ReadPlan::execute`] can return, unless the first batch alone is larger
    /// than the plan's `max_bytes` (it is then returned whole).
    pub fn max_len(&self) -> usize {
        let visible = self.end_position.saturating_sub(self.start_position);
        usize::try_from(visible).map_or(self.max_bytes, |v| v.min(self.max_bytes))
    }

    /// The bytes from `pos` a read takes to find the answer's batches: `max_bytes`, plus what
    /// lies between the index entry and the target (two intervals, a page), within the
    /// visible bytes.
    fn window_from(&self, pos: u64) -> u64 {
        self.end_position
            .saturating_sub(pos)
            .min((self.max_bytes as u64).saturating_add(2 * self.index_interval_bytes + 4096))
    }

    /// Reads the planned batches: whole batches only, starting with the one holding the target
    /// offset, at most `max_bytes` unless the first batch alone is larger.
    pub async fn execute(self) -> Result<Bytes, StorageError> {
        let path = &*self.path;
        let mut pos = self.start_position;
        loop {
            if pos >= self.end_position {
                return Ok(Bytes::new());
            }
            let window = self.window_from(pos) as usize;
            let buf = read_io(&*self.file, pos, window, path).await?;
            let mut first: Option<usize> = None;
            let mut end = 0usize;
            let mut skipped_to = 0usize;
            let mut scanner = BatchScanner::new(&buf, false);
            for b in scanner.by_ref() {
                if b.header.base_offset >= self.end_offset {
                    if first.is_none() {
                        return Ok(Bytes::new());
                    }
                    break;
                }
                match first {
                    None if b.header.next_offset() <= self.target_offset => {
                        skipped_to = b.position + b.header.total_bytes();
                    }
                    None => {
                        first = Some(b.position);
                        end = b.position + b.header.total_bytes();
                    }
                    Some(start) => {
                        let next_end = b.position + b.header.total_bytes();
                        if next_end - start > self.max_bytes {
                            break;
                        }
                        end = next_end;
                    }
                }
            }
            match first {
                Some(start) => return Ok(buf.slice(start..end)),
                None if skipped_to > 0 => {
                    pos += skipped_to as u64;
                }
                None => {
                    // The batch at `pos` does not fit in the window: read it alone.
                    let h = BatchHeader::parse(&buf).map_err(StorageError::InvalidBatch)?;
                    let total = h.total_bytes();
                    if h.next_offset() <= self.target_offset {
                        pos += total as u64;
                        continue;
                    }
                    if pos + total as u64 > self.end_position || h.base_offset >= self.end_offset {
                        return Ok(Bytes::new());
                    }
                    return read_io(&*self.file, pos, total, path).await;
                }
            }
        }
    }
}

impl<Fl: FileHandle> ReadPlan<Fl> {
    /// As [`ReadPlan::execute`], but batches of at least `min_len` bytes together, of at least
    /// [`SENDABLE_MIN_BATCH_BYTES`] on average, that the file lets be sent as they are
    /// ([`FileHandle::sendable`]) come back as a [`FileRegion`] instead of being read. Only
    /// the batches' headers are read to find where they end; the same batches either way.
    pub async fn execute_sendable(self, min_len: usize) -> Result<ReadData, StorageError> {
        if self.max_len() >= min_len.max(1) {
            if let Some(region) = self.sendable_region(min_len).await? {
                return Ok(ReadData::Region(region));
            }
        }
        self.execute().await.map(ReadData::Bytes)
    }

    async fn sendable_region(&self, min_len: usize) -> Result<Option<FileRegion>, StorageError> {
        let path = &*self.path;
        // Batches before the target (the index points at most one interval before it), then
        // the answer's: more headers than that means small batches.
        let most_headers = 4 + self.max_bytes / SENDABLE_MIN_BATCH_BYTES;
        let mut pos = self.start_position;
        // Asked first for the bytes the answer can span, so that reads the file does not let
        // be sent (near a direct-written end, say) never read headers on their own.
        let window = self.window_from(pos);
        // Taken first: at the bound, nothing is duplicated and the batches are read.
        let Some(slot) = self.file.file_regions().and_then(FileRegions::slot) else {
            return Ok(None);
        };
        let Some(mut fd) = self.sendable_fd(pos, window).await? else {
            return Ok(None);
        };
        let mut first: Option<u64> = None;
        let mut end = pos;
        // Whether the batches found are all the answer holds; not if small batches used up
        // the header reads first (copy those).
        let mut complete = false;
        for _ in 0..most_headers {
            if pos + BATCH_HEADER_BYTES as u64 > self.end_position {
                complete = true;
                break;
            }
            let head = read_io(&*self.file, pos, BATCH_HEADER_BYTES, path).await?;
            // Whatever is wrong with it, a plain read finds it and answers as it does.
            let Ok(h) = BatchHeader::parse(&head) else {
                return Ok(None);
            };
            let next = pos + h.total_bytes() as u64;
            if next > self.end_position || h.base_offset >= self.end_offset {
                complete = true;
                break;
            }
            match first {
                None if h.next_offset() <= self.target_offset => {}
                None => {
                    first = Some(pos);
                    end = next;
                }
                Some(start) => {
                    if next - start > self.max_bytes as u64 {
                        complete = true;
                        break;
                    }
                    end = next;
                }
            }
            pos = next;
        }
        let (Some(start), true) = (first, complete) else {
            return Ok(None);
        };
        let len = usize::try_from(end - start).unwrap_or(0);
        if len < min_len.max(1) {
            return Ok(None);
        }
        if end > self.start_position + window {
            // A first batch larger than the answer may be: ask again for all of it.
            match self.sendable_fd(start, end - start).await? {
                Some(whole) => fd = whole,
                None => return Ok(None),
            }
        }
        Ok(Some(FileRegion::in_slot(fd, start, len, slot)))
    }

    async fn sendable_fd(&self, pos: u64, len: u64) -> Result<Option<OwnedFd>, StorageError> {
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        self.file
            .sendable(pos, len)
            .await
            .map_err(|e| StorageError::io("send segment", &self.path, e))
    }
}

async fn read_io<Fl: FileHandle>(
    file: &Fl,
    pos: u64,
    len: usize,
    path: &Path,
) -> Result<Bytes, StorageError> {
    file.read_at(pos, len)
        .await
        .map_err(|e| StorageError::io("read segment", path, e))
}

/// Byte position of the batch starting at `offset` in a segment (which must be a batch start).
async fn find_batch_position<F: Fs>(
    file: &F::File,
    seg: &Segment<F>,
    offset: i64,
) -> Result<u64, StorageError> {
    let entry = seg.index.lookup(relative(seg.base_offset, offset));
    let mut pos = u64::from(entry.position);
    while pos < seg.size {
        let Some((header, _)) = read_batch_at(file, pos, seg.size, &seg.log_path).await? else {
            break;
        };
        if header.base_offset == offset {
            return Ok(pos);
        }
        if header.next_offset() > offset {
            return Err(StorageError::NotBatchBoundary(offset));
        }
        pos += header.total_bytes() as u64;
    }
    Ok(seg.size)
}

/// Reads the whole batch starting at `pos` (not past `limit`); `None` if none starts there.
async fn read_batch_at<Fl: FileHandle>(
    file: &Fl,
    pos: u64,
    limit: u64,
    path: &Path,
) -> Result<Option<(BatchHeader, Bytes)>, StorageError> {
    let head = read_io(file, pos, BATCH_HEADER_BYTES.min((limit - pos) as usize), path).await?;
    let Ok(header) = BatchHeader::parse(&head) else {
        return Ok(None);
    };
    if pos + header.total_bytes() as u64 > limit {
        return Ok(None);
    }
    let bytes = read_io(file, pos, header.total_bytes(), path).await?;
    Ok(Some((header, bytes)))
}

fn note_epoch(epochs: &mut Vec<(i32, i64)>, epoch: i32, offset: i64, dirty: &mut bool) {
    match epochs.last() {
        Some((last, _)) if *last >= epoch => {}
        _ => {
            epochs.push((epoch, offset));
            *dirty = true;
        }
    }
}

/// Reads a segment's index files. Entries past the end of the file are accepted: a checkpoint
/// writes entries for batches appended but not yet written, which a crash may lose, and the
/// caller cuts every entry at the recovery point, which lies inside the file.
///
/// Also says whether the files hold their entries and nothing else (no trailing zeros, say):
/// only then may a write append to them in place.
async fn load_indexes<F: Fs>(fs: &F, seg: &Segment<F>) -> Option<(OffsetIndex, TimeIndex, bool)> {
    let idx = fs.read_file(&seg.index_path()).await.ok()?;
    let tidx = fs.read_file(&seg.time_index_path()).await.ok()?;
    let offset_index = OffsetIndex::decode(&idx, u64::MAX)?;
    let time_index = TimeIndex::decode(&tidx, u32::MAX)?;
    let exact = idx.len() == offset_index.len() * 8 && tidx.len() == time_index.len() * 12;
    Some((offset_index, time_index, exact))
}

/// Removes a segment's files; returns the bytes of log removed.
pub async fn remove_segment_files<F: Fs>(fs: &F, dir: &Path, base: i64) -> u64 {
    let log = dir.join(segment::file_name(base, "log"));
    let bytes = match fs.open(&log, false).await {
        Ok(f) => f.size().await.unwrap_or(0),
        Err(_) => 0,
    };
    for suffix in ["log", "index", "timeindex"] {
        let p = dir.join(segment::file_name(base, suffix));
        if let Err(e) = fs.remove_file(&p).await {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(path = %p.display(), error = %e, "could not remove segment file");
            }
        }
    }
    bytes
}

async fn read_i64_file<F: Fs>(fs: &F, path: &Path) -> Option<i64> {
    let bytes = fs.read_file(path).await.ok()?;
    let text = std::str::from_utf8(&bytes).ok()?;
    text.trim().parse().ok()
}

/// Durably records a new log start offset (DeleteRecords), before any segment below it goes.
pub async fn persist_log_start_offset<F: Fs>(fs: &F, dir: &Path, offset: i64) -> Result<(), StorageError> {
    let path = dir.join(LOG_START_FILE);
    fs.write_file_atomic(&path, format!("{offset}\n").into_bytes())
        .await
        .map_err(|e| StorageError::io("write log start offset", &path, e))
}

/// The recovery point file: magic `STRNDRP2`, offset, segment base, position (i64 each), then
/// the producer-state snapshot exact as of that offset, then a CRC-32C of everything before it.
/// Written in place and fsynced; a torn or damaged file fails its CRC and is ignored, which only
/// costs a longer validation (and a full rebuild of the producer state) at the next start.
async fn write_recovery_point<F: Fs>(
    fs: &F,
    path: &Path,
    rp: RecoveryPoint,
    producers: Vec<u8>,
    sync: bool,
) -> Result<(), StorageError> {
    let mut body = Vec::with_capacity(36 + producers.len());
    body.extend_from_slice(b"STRNDRP2");
    body.extend_from_slice(&rp.offset.to_be_bytes());
    body.extend_from_slice(&rp.segment_base.to_be_bytes());
    body.extend_from_slice(&rp.position.to_be_bytes());
    body.extend_from_slice(&producers);
    let crc = crc32c::crc32c(&body);
    body.extend_from_slice(&crc.to_be_bytes());
    let f = fs
        .open(path, true)
        .await
        .map_err(|e| StorageError::io("open recovery point", path, e))?;
    let len = body.len() as u64;
    f.write_all_at(body, 0)
        .await
        .map_err(|e| StorageError::io("write recovery point", path, e))?;
    f.truncate(len)
        .await
        .map_err(|e| StorageError::io("write recovery point", path, e))?;
    if !sync {
        return Ok(());
    }
    f.fdatasync()
        .await
        .map_err(|e| StorageError::io("sync recovery point", path, e))
}

async fn read_recovery_point<F: Fs>(fs: &F, path: &Path) -> Option<(RecoveryPoint, ProducerState)> {
    let bytes = fs.read_file(path).await.ok()?;
    let (body, crc) = bytes.split_at_checked(bytes.len().checked_sub(4)?)?;
    if crc32c::crc32c(body) != u32::from_be_bytes(crc.try_into().ok()?) {
        return None;
    }
    let rest = body.strip_prefix(b"STRNDRP2")?;
    let field =
        |i: usize| -> Option<i64> { Some(i64::from_be_bytes(rest.get(i * 8..i * 8 + 8)?.try_into().ok()?)) };
    let rp = RecoveryPoint {
        offset: field(0)?,
        segment_base: field(1)?,
        position: u64::try_from(field(2)?).ok()?,
    };
    let (producers, snapshot_offset) = ProducerState::decode_snapshot(rest.get(24..)?)?;
    if snapshot_offset != rp.offset {
        return None;
    }
    Some((rp, producers))
}

/// Reads Kafka's `leader-epoch-checkpoint` format: version line, count line, `epoch offset` lines.
async fn read_epochs<F: Fs>(fs: &F, path: &Path) -> Vec<(i32, i64)> {
    let Ok(bytes) = fs.read_file(path).await else {
        return Vec::new();
    };
    let Ok(text) = std::str::from_utf8(&bytes) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for line in text.lines().skip(2) {
        let mut parts = line.split_whitespace();
        if let (Some(Ok(e)), Some(Ok(o))) = (parts.next().map(str::parse), parts.next().map(str::parse)) {
            out.push((e, o));
        }
    }
    out
}
/// Held by I/O in a log's directory that runs outside the store's borrow: a flush round's
/// writes and syncs, a checkpoint's files, a directory sync, the segment files retention and
/// DeleteRecords remove. [`crate::ShardStore::remove_log`] deletes the directory only once every
/// guard of the log is dropped. Otherwise such I/O could fail for want of the directory, and a
/// failed round takes the whole store offline; or it could create a file in a new directory of
/// the same name (the topic created again).
pub(crate) struct LogIoGuard {
    users: Rc<Cell<u32>>,
    released: Rc<Notify>,
}

impl LogIoGuard {
    pub(crate) fn new(users: &Rc<Cell<u32>>, released: &Rc<Notify>) -> Self {
        users.set(users.get() + 1);
        LogIoGuard {
            users: users.clone(),
            released: released.clone(),
        }
    }
}

impl Drop for LogIoGuard {
    fn drop(&mut self) {
        let left = self.users.get().saturating_sub(1);
        self.users.set(left);
        if left == 0 {
            self.released.notify_all();
        }
    }
}
