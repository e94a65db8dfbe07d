//! Strand's storage engine: per-partition segmented logs of Kafka v2 record batches with offset
//! and time indexes, a per-shard journal that makes group commit cost one `fdatasync` per round
//! whatever the number of partitions, crash recovery, and retention.
//!
//! Architecture invariants:
//! - `storage` knows record batches and offsets, nothing of Kafka requests, topics' metadata,
//!   consumer groups or queues.
//! - Batches are stored exactly as received; only `baseOffset` and `partitionLeaderEpoch` are
//!   patched. Every batch is CRC-checked when appended (debug builds) and when recovery reads
//!   it back.
//! - An offset is never reused once it was acknowledged or made visible, but by a Raft
//!   follower's truncation ([`ShardStore::truncate_log`]), above what clients could read.
//! - All state of a shard's logs is touched by that shard's thread only (nothing here is `Send`).
//! - I/O goes through the [`fs::Fs`] trait; glommio appears only in [`fs_glommio`].

pub mod fs;
#[cfg(feature = "glommio")]
pub mod fs_glommio;
pub mod fs_mem;
pub mod index;
pub mod journal;
pub mod log;
pub mod notify;
pub mod producer;
pub mod region;
pub mod replace;
pub mod replay;
mod segment;
pub mod store;

use std::path::{Path, PathBuf};

pub use journal::LogKey;
pub use log::{
    AppendInfo, Appended, LogConfig, PartitionLog, ReadData, ReadPlan, RecoveryPoint, RecoveryReport,
    RetentionOutcome, TimestampPlan, SENDABLE_MIN_BATCH_BYTES,
};
pub use region::{FileRegion, FileRegions};
pub use replay::{replay_journals, ReplayReport};
pub use store::{
    AppendTicket, CheckpointStats, LogId, LogOffsets, Offline, ResumeOutcome, RoundStats, ShardStore,
    StoreConfig,
};

/// Errors of the storage engine. I/O errors carry the operation and the path.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("{op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("offset {offset} is out of range [{log_start_offset}, {log_end_offset}]")]
    OffsetOutOfRange {
        offset: i64,
        log_start_offset: i64,
        log_end_offset: i64,
    },
    #[error("invalid batch: {0}")]
    InvalidBatch(strand_protocol::batch::BatchError),
    #[error("offset {0} is not the start of a batch")]
    NotBatchBoundary(i64),
    /// A follower's append must go at the log end offset ([`ShardStore::append_replica`]).
    #[error("a replica's batch at offset {offset} does not continue the log (end offset {log_end_offset})")]
    NotAtLogEnd { offset: i64, log_end_offset: i64 },
    #[error("log is busy: {0}")]
    Busy(&'static str),
    #[error("no such log (removed?)")]
    UnknownLog,
    /// A failed flush round took the store offline for writes (see [`ShardStore::offline`]);
    /// `disk_full`: it failed for want of space, and writes resume once there is space again.
    #[error("storage is offline for writes: {reason}")]
    Offline { reason: String, disk_full: bool },
    #[error("checkpoint failed: {0}")]
    Checkpoint(String),
    #[error("journal file {} was not replayed before the shard started", .0.display())]
    JournalNotReplayed(PathBuf),
    #[error(transparent)]
    Producer(#[from] producer::ProducerError),
}

impl StorageError {
    pub(crate) fn io(op: &'static str, path: &Path, source: std::io::Error) -> Self {
        StorageError::Io {
            op,
            path: path.to_path_buf(),
            source,
        }
    }

    /// Whether the error means the disk is full.
    pub fn is_disk_full(&self) -> bool {
        match self {
            StorageError::Io { source, .. } => io_disk_full(source),
            StorageError::Offline { disk_full, .. } => *disk_full,
            _ => false,
        }
    }

    /// Whether a flush round that failed with this error left the store as a restart would find
    /// it once its unflushed tail is cut back: a write (or the creation of a segment file) was
    /// refused for want of space, so nothing it touched was written past what it reports. A sync
    /// that fails, even with `ENOSPC`, may have dropped written pages the journal vouches for,
    /// and an I/O error may have damaged anything: only a restart's recovery is trusted after
    /// those (as Kafka keeps a failed log directory offline until a restart, and as
    /// PostgreSQL treats a failed `fsync`).
    pub(crate) fn refused_for_space(&self) -> bool {
        matches!(self, StorageError::Io { op: "write journal" | "write segment" | "create segment", source, .. } if io_disk_full(source))
    }
}

/// `ENOSPC`, or a write the file system cut short (see `fs_glommio::short_write`).
fn io_disk_full(e: &std::io::Error) -> bool {
    e.raw_os_error() == Some(28) || e.kind() == std::io::ErrorKind::StorageFull
}
