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
//! - An offset is never reused once it was acknowledged or made visible.
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
pub use store::{AppendTicket, CheckpointStats, LogId, LogOffsets, RoundStats, ShardStore, StoreConfig};

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
    #[error("log is busy: {0}")]
    Busy(&'static str),
    #[error("no such log (removed?)")]
    UnknownLog,
    #[error("storage is offline for writes: {0}")]
    Offline(String),
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
            StorageError::Io { source, .. } => source.raw_os_error() == Some(28),
            StorageError::Offline(reason) => {
                reason.contains("No space left") || reason.contains("os error 28")
            }
            _ => false,
        }
    }
}
