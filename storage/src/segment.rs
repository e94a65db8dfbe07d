//! One segment of a partition log: a `.log` file of record batches with its offset and time
//! indexes, and the scan that validates a segment's bytes after a crash. What a segment file
//! holds and how recovery trusts it: see [`crate::log`].

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use strand_protocol::batch::{BatchError, BatchHeader, BatchScanner, ScanStop, BATCH_HEADER_BYTES};

use crate::fs::{FileHandle, Fs};
use crate::index::{OffsetIndex, TimeIndex};

/// `00000000000000001234.log` for base offset 1234, as Kafka names segment files.
pub(crate) fn file_name(base_offset: i64, suffix: &str) -> String {
    format!("{base_offset:020}.{suffix}")
}

/// Parses a segment file name back into its base offset.
pub(crate) fn parse_file_name(name: &str, suffix: &str) -> Option<i64> {
    let stem = name.strip_suffix(suffix)?.strip_suffix('.')?;
    if stem.len() != 20 || !stem.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    stem.parse().ok()
}

/// Decides when index entries are added; shared by appends and recovery scans so that a
/// rebuilt index is the index the appends would have written. It also keeps the segment's
/// running maximum timestamp, which is what time-index entries record (as Kafka's do): an
/// entry `(t, r)` says that no batch up to relative offset `r` has a timestamp above `t`, so a
/// lookup may start at `r` for any timestamp above `t`, however unordered the timestamps are.
#[derive(Debug, Clone)]
pub(crate) struct IndexBuilder {
    pub(crate) bytes_since_entry: u64,
    /// Largest batch max-timestamp seen in the segment; -1 when empty or unknown.
    max_timestamp: i64,
    /// Relative offset of the first batch that carried `max_timestamp`.
    max_timestamp_relative: u32,
}

impl Default for IndexBuilder {
    fn default() -> Self {
        IndexBuilder {
            bytes_since_entry: 0,
            max_timestamp: -1,
            max_timestamp_relative: 0,
        }
    }
}

impl IndexBuilder {
    /// Called before a batch is added at `position`.
    pub(crate) fn on_batch(
        &mut self,
        segment_base: i64,
        position: u64,
        header: &BatchHeader,
        interval_bytes: u64,
        index: &mut OffsetIndex,
        time_index: &mut TimeIndex,
    ) {
        let rel = relative(segment_base, header.base_offset);
        if header.max_timestamp > self.max_timestamp {
            self.max_timestamp = header.max_timestamp;
            self.max_timestamp_relative = rel;
        }
        if self.bytes_since_entry >= interval_bytes && position > 0 {
            if let Ok(pos) = u32::try_from(position) {
                index.push(rel, pos);
                time_index.maybe_push(self.max_timestamp, self.max_timestamp_relative);
            }
            self.bytes_since_entry = 0;
        } else if time_index.is_empty() {
            time_index.maybe_push(self.max_timestamp, self.max_timestamp_relative);
        }
        self.bytes_since_entry += header.total_bytes() as u64;
    }

    /// The segment's largest timestamp; -1 when empty or unknown.
    pub(crate) fn max_timestamp(&self) -> i64 {
        self.max_timestamp
    }

    /// Adds the segment's running maximum to `time_index` if it rose since the last entry
    /// (batches since the last index interval raised it). A checkpoint does so before it writes
    /// the index files, so that recovery reads the exact maximum back as the last entry. Entries
    /// are only ever added, never replaced: a torn rewrite of a file in place leaves its old
    /// entries whole.
    pub(crate) fn note_max(&self, time_index: &mut TimeIndex) {
        if self.max_timestamp >= 0 {
            time_index.maybe_push(self.max_timestamp, self.max_timestamp_relative);
        }
    }

    /// Resets the position and the maximum to what `index` and `time_index` (cut at
    /// `position`) vouch for: recovery trusting index files, and truncation.
    pub(crate) fn reset(&mut self, position: u64, index: &OffsetIndex, time_index: &TimeIndex) {
        self.bytes_since_entry = position - index.last().map_or(0, |e| u64::from(e.position));
        (self.max_timestamp, self.max_timestamp_relative) = time_index
            .last()
            .map_or((-1, 0), |e| (e.timestamp, e.relative_offset));
    }
}

pub(crate) fn relative(segment_base: i64, offset: i64) -> u32 {
    u32::try_from(offset - segment_base).unwrap_or(u32::MAX)
}

/// What a segment's index files on disk are known to hold.
///
/// Recovery trusts loaded index files for everything below the recovery point, so their durable
/// content must always cover what the point vouches for. Rewritten in place, a file keeps its
/// old prefix through a torn write (entries only grow between checkpoints), and the old prefix
/// covers the old point. A file created after the point was written has no such prefix: it is
/// written whole beside its name and renamed into place once durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IndexFilesOnDisk {
    /// There are none: a segment within one index interval gets none until it grows (see
    /// [`Segment::needs_index_files`]), and recovery reads the segment instead.
    Absent,
    /// They may exist with content the next write must not merely append to: a write of them
    /// failed; recovery found them past the recovery point, damaged, holding entries it cut, or
    /// holding bytes past their entries; a truncation changed their entries. The next write
    /// replaces them whole. Once index files may exist they are always written, so that none
    /// goes stale (an index emptied by a truncation, say).
    Unknown,
    /// A running checkpoint replaces them whole; [`IndexFilesOnDisk::Durable`] once it is done.
    Replacing,
    /// They exist and cover the recovery point: rewritten in place.
    Durable,
}

/// A segment of a partition log. Owned by one [`crate::PartitionLog`].
pub(crate) struct Segment<F: Fs> {
    pub(crate) base_offset: i64,
    /// `None` until the first flush round that writes to this segment creates the file, so that
    /// rolling a segment never waits for the disk.
    pub(crate) file: Option<Rc<F::File>>,
    /// The file as the first round that writes this segment created it, shared with the chunks
    /// staged before that round completes (for them `file` was still `None`), so that every
    /// round writes through one handle: a handle's rule that direct writes and reads near the
    /// end never run together sees only its own writes and reads.
    pub(crate) created: Rc<RefCell<Option<Rc<F::File>>>>,
    pub(crate) log_path: Rc<Path>,
    /// Logical size: every batch appended, written or not.
    pub(crate) size: u64,
    /// Bytes that are durable and visible to readers (below the high watermark).
    pub(crate) durable_size: u64,
    /// Offset after the last batch.
    pub(crate) next_offset: i64,
    pub(crate) index: OffsetIndex,
    pub(crate) time_index: TimeIndex,
    pub(crate) index_builder: IndexBuilder,
    /// When the segment was created or opened (roll by time).
    pub(crate) created_ms: i64,
    /// The index files on disk are stale.
    pub(crate) index_dirty: bool,
    /// What is known of this segment's index files on disk.
    pub(crate) index_files_on_disk: IndexFilesOnDisk,
    /// Data written since the last fsync of this segment.
    pub(crate) needs_sync: bool,
    /// A running checkpoint took this segment's `needs_sync` mark and has not finished its
    /// fsync: a direct round must still sync the file itself.
    pub(crate) checkpoint_syncing: bool,
    /// The log's count of cuts (`PartitionLog::cuts`) when sealing last cut this segment's file
    /// back to its data: a sync that began before that does not cover the cut.
    pub(crate) cut_seq: u64,
}

impl<F: Fs> Segment<F> {
    /// A new, empty segment whose file is created by the first flush round that writes to it.
    pub(crate) fn new_lazy(dir: &Path, base_offset: i64, now_ms: i64) -> Self {
        Segment {
            base_offset,
            file: None,
            created: Rc::default(),
            log_path: Rc::from(dir.join(file_name(base_offset, "log"))),
            size: 0,
            durable_size: 0,
            next_offset: base_offset,
            index: OffsetIndex::default(),
            time_index: TimeIndex::default(),
            index_builder: IndexBuilder::default(),
            created_ms: now_ms,
            index_dirty: true,
            index_files_on_disk: IndexFilesOnDisk::Absent,
            needs_sync: true,
            checkpoint_syncing: false,
            cut_seq: 0,
        }
    }

    pub(crate) fn index_path(&self) -> PathBuf {
        self.log_path.with_extension("index")
    }

    pub(crate) fn time_index_path(&self) -> PathBuf {
        self.log_path.with_extension("timeindex")
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.size == 0
    }

    /// Forgets everything at or after byte `position`, where the batch at `offset` starts (or
    /// the end): size, next offset, index entries and the running maximum.
    pub(crate) fn truncate_to(&mut self, position: u64, offset: i64) {
        self.size = position;
        self.next_offset = offset.max(self.base_offset);
        self.index
            .truncate_to_position(u32::try_from(position).unwrap_or(u32::MAX));
        self.time_index
            .truncate_to_offset(relative(self.base_offset, offset));
        self.index_builder.reset(position, &self.index, &self.time_index);
        // The files get different entries where they had others: only an append keeps a torn
        // rewrite in place harmless, so the next write replaces them whole.
        if self.index_files_on_disk != IndexFilesOnDisk::Absent {
            self.index_files_on_disk = IndexFilesOnDisk::Unknown;
        }
        self.index_dirty = true;
    }

    /// Whether a checkpoint must write this segment's index files. A segment that holds no more
    /// than one index interval of bytes, and so no offset-index entry, gets none until it grows:
    /// recovery scans it instead (reading it costs no more than reading its two index files
    /// would), and a first checkpoint of many new small logs creates two files fewer for each.
    pub(crate) fn needs_index_files(&self, index_interval_bytes: u64) -> bool {
        self.index_files_on_disk != IndexFilesOnDisk::Absent
            || !self.index.is_empty()
            || self.size > index_interval_bytes
    }

    /// Largest batch max-timestamp in the segment; -1 when empty or unknown.
    pub(crate) fn max_timestamp(&self) -> i64 {
        self.index_builder.max_timestamp()
    }

    /// Index file contents to persist (offset index, time index), the time index ending with the
    /// segment's largest timestamp (see [`IndexBuilder::note_max`]).
    pub(crate) fn index_files(&mut self) -> [(PathBuf, Vec<u8>); 2] {
        self.index_builder.note_max(&mut self.time_index);
        [
            (self.index_path(), self.index.encode()),
            (self.time_index_path(), self.time_index.encode()),
        ]
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        self.index.heap_bytes()
            + self.time_index.heap_bytes()
            + std::mem::size_of::<Self>()
            + self.log_path.as_os_str().len()
    }
}

/// What a validating scan of a segment found.
#[derive(Debug)]
pub(crate) struct ScanOutcome {
    /// Byte position after the last valid batch.
    pub(crate) valid_size: u64,
    /// Offset after the last valid batch.
    pub(crate) next_offset: i64,
    /// Leader epochs seen, with the first offset of each change.
    pub(crate) epoch_starts: Vec<(i32, i64)>,
    /// Why the scan stopped, when it stopped before the end of the file at something other
    /// than zeros.
    pub(crate) problem: Option<String>,
    /// The scan stopped at zeros: space the segment reserved past its data (see
    /// [`crate::fs::FileHandle::seal`]), not a torn write. The file should be cut there.
    pub(crate) zero_tail: bool,
}

const SCAN_CHUNK_BYTES: usize = 1 << 20;

/// Scans `file` from `start_position` (a batch boundary whose batch starts at `expected_offset`)
/// to its end, checking every batch's CRC and that offsets continue without gaps or overlaps.
/// Index entries for the scanned batches are added to `index`/`time_index` through `builder`.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn scan<Fl: FileHandle>(
    file: &Fl,
    segment_base: i64,
    start_position: u64,
    mut expected_offset: i64,
    file_size: u64,
    interval_bytes: u64,
    builder: &mut IndexBuilder,
    index: &mut OffsetIndex,
    time_index: &mut TimeIndex,
    producers: &mut crate::producer::ProducerState,
) -> Result<ScanOutcome, std::io::Error> {
    let mut pos = start_position;
    let mut epoch_starts: Vec<(i32, i64)> = Vec::new();
    let mut problem = None;
    'outer: while pos < file_size {
        let want = (file_size - pos).min(SCAN_CHUNK_BYTES as u64) as usize;
        let mut chunk = file.read_at(pos, want).await?;
        if chunk.len() < BATCH_HEADER_BYTES {
            problem = Some(format!(
                "{} trailing bytes at position {pos} (torn batch header)",
                chunk.len()
            ));
            break;
        }
        // A batch bigger than the chunk: read it whole.
        if let Ok(h) = BatchHeader::parse(&chunk) {
            if h.total_bytes() > chunk.len() && (h.total_bytes() as u64) <= file_size - pos {
                chunk = file.read_at(pos, h.total_bytes()).await?;
            }
        }
        let mut scanner = BatchScanner::new(&chunk, true);
        for b in scanner.by_ref() {
            let h = b.header;
            if h.base_offset != expected_offset {
                problem = Some(format!(
                    "batch at position {} has base offset {} where {} was expected",
                    pos + b.position as u64,
                    h.base_offset,
                    expected_offset
                ));
                pos += b.position as u64;
                break 'outer;
            }
            builder.on_batch(
                segment_base,
                pos + b.position as u64,
                &h,
                interval_bytes,
                index,
                time_index,
            );
            producers.apply_durable(&h);
            if epoch_starts.last().map(|(e, _)| *e) != Some(h.partition_leader_epoch) {
                epoch_starts.push((h.partition_leader_epoch, h.base_offset));
            }
            expected_offset = h.next_offset();
        }
        let consumed = scanner.position();
        match scanner.stop() {
            Some(ScanStop::Clean) | None => pos += consumed as u64,
            Some(ScanStop::Incomplete { position }) => {
                pos += *position as u64;
                if consumed == 0 || pos + BATCH_HEADER_BYTES as u64 > file_size {
                    // Nothing whole in this window: the file ends inside a batch.
                    let left = file_size - pos;
                    if left > 0 {
                        problem = Some(format!(
                            "torn batch: {left} bytes at position {pos} do not form a batch"
                        ));
                    }
                    break;
                }
            }
            Some(ScanStop::Corrupt { position, error }) => {
                let at = pos + *position as u64;
                problem = Some(match error {
                    BatchError::CrcMismatch { .. } => {
                        format!("CRC mismatch in batch at position {at}: {error}")
                    }
                    _ => format!("corrupt batch at position {at}: {error}"),
                });
                pos = at;
                break;
            }
        }
    }
    // Where the data ends before space a segment reserved (and a crash left unused), what
    // follows reads as zeros: no batch starts with a zero length.
    let mut zero_tail = false;
    if problem.is_some() && pos < file_size {
        let probe = (file_size - pos).min(ZERO_PROBE_BYTES as u64) as usize;
        let head = file.read_at(pos, probe).await?;
        if !head.is_empty() && head.iter().all(|b| *b == 0) {
            problem = None;
            zero_tail = true;
        }
    }
    Ok(ScanOutcome {
        valid_size: pos.min(file_size),
        next_offset: expected_offset,
        epoch_starts,
        problem,
        zero_tail,
    })
}

/// A batch's base offset and length: zeros there mean no batch was written.
const ZERO_PROBE_BYTES: usize = 12;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names() {
        assert_eq!(file_name(1234, "log"), "00000000000000001234.log");
        assert_eq!(parse_file_name("00000000000000001234.log", "log"), Some(1234));
        assert_eq!(parse_file_name("00000000000000001234.index", "log"), None);
        assert_eq!(parse_file_name("1234.log", "log"), None);
        assert_eq!(parse_file_name("0000000000000000123x.log", "log"), None);
    }
}
