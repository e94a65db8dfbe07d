//! The shard journal: one write-ahead log per shard, shared by all partitions the shard owns.
//!
//! This is how "acknowledged means fsynced" stays cheap with many partitions: a flush round
//! appends every batch staged on the shard to the journal and issues one `fdatasync`, whatever
//! the number of partitions written; the same batches go to their partition segments, unsynced.
//! Segments are fsynced later, at a checkpoint, after which the journal files that covered them
//! are deleted (or recycled). After a crash, start-up replays the journal into the segments
//! ([`crate::replay`], which reads the files through the page cache).
//!
//! File: `<log dir>/strand-journal/<shard>-<sequence>.wal`, a 24-byte header (magic, shard,
//! sequence) then entries `[u32 payload length][u32 CRC-32C of payload, XOR the file's
//! sequence mask][payload]`. An append's payload is `[u8 kind = 1][16-byte log
//! incarnation][u16 name length][log directory name][i64 offset][data]`; a padding entry's is
//! `[u8 kind = 2]` and zeros; a truncation's is an append's with `kind = 3` and no data.
//!
//! Truncations: a [`EntryKind::Truncate`] entry at offset `o` voids every *earlier* entry of
//! its log at an offset at or above `o` (a Raft follower's suffix that conflicted with a new
//! leader's). It is written, and synced, before the log's files are cut (see
//! [`crate::ShardStore::truncate_log`]); replay skips the entries it voids
//! ([`crate::replay`]), so a batch cut from a log never comes back from the journal, neither in
//! place of the batches appended at its offsets since nor in an empty place. An older binary
//! reads the entry as damage and stops replaying its file there.
//!
//! Files are recycled: a file a checkpoint has covered is renamed `<shard>-<sequence>.free`
//! (up to `StoreConfig::journal_recycle_files` per shard) and later renamed into the next
//! sequence and overwritten from the start. Overwriting blocks a file already has changes no
//! metadata, so the round's `fdatasync` writes the data and flushes the device, nothing else.
//! An append also has to persist the inode (size, new blocks): on ext4 without a journal, as
//! on this project's VM, a synchronous write of the inode's block before the flush; with a
//! journal, a journal commit. Overwriting ran at 1.6 × the bandwidth and half the latency of
//! appending there (BENCHMARKS.md#journal-recycling). What follows the last
//! entry of a recycled file is an older sequence's entries; the sequence mask in every CRC
//! (RocksDB's recyclable log records carry the log number for the same reason) makes them fail
//! the check, so replay ends there as it would at a torn write, and a header whose sequence is
//! not the file name's (a rename whose header rewrite was lost) makes the file hold nothing.
//!
//! The journal is written with `O_DIRECT` ([`Fs::open_direct`]): its bytes are written once, to
//! the disk, and take no page cache (a buffered write costs a page-cache copy, which on a VM
//! is ten times a plain copy when the pages are new, and the journal only ever takes new ones).
//! So every write starts at a multiple of [`DIRECT_WRITE_ALIGN`] and is a multiple of it long:
//! the header is followed by a padding entry up to the first block boundary, and each buffer of
//! a round ends with one (files with the older magic `STRNDJ01` have no padding, and are read
//! as well).

use std::path::{Path, PathBuf};
use std::rc::Rc;

use bytes::Bytes;

use crate::fs::STAGE_CHUNK_MAX_BYTES as PENDING_CHUNK_MAX_BYTES;
use crate::fs::{FileHandle, Fs, DIRECT_WRITE_ALIGN};
use crate::StorageError;

/// Directory under the log dir holding journal files.
pub const JOURNAL_DIR: &str = "strand-journal";
const MAGIC: &[u8; 8] = b"STRNDJ03";
/// The magic of journals written before recycling came in: CRCs without a sequence mask.
const MAGIC_UNMASKED: &[u8; 8] = b"STRNDJ02";
/// The magic of journals written before padding (and `O_DIRECT`) came in.
const MAGIC_UNPADDED: &[u8; 8] = b"STRNDJ01";
/// The extension of a file a checkpoint covered, kept to be recycled.
const FREE_EXTENSION: &str = "free";
const HEADER_BYTES: usize = 24;
const ENTRY_OVERHEAD_BYTES: usize = 8;
const ALIGN: usize = DIRECT_WRITE_ALIGN as usize;
/// Where the first entry of a file goes: the header's block is padded to its end.
const FIRST_ENTRY_AT: u64 = DIRECT_WRITE_ALIGN;
/// The most a buffer can grow by its padding entry.
const PAD_MAX_BYTES: usize = ALIGN + ENTRY_OVERHEAD_BYTES;
/// Upper bound on one entry, far above any batch `message.max.bytes` allows.
const MAX_ENTRY_BYTES: usize = 256 << 20;

/// Identifies a partition log across restarts: its directory name and an incarnation (the
/// topic id) so that entries of a deleted topic never land in a re-created one.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LogKey {
    pub dir_name: String,
    pub incarnation: [u8; 16],
}

/// Entry kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// A batch appended at `offset` (its base offset); `data` is the stored batch.
    Append = 1,
    /// The log was cut at `offset`: earlier entries of the log at or above it are void. `data`
    /// is empty.
    Truncate = 3,
}

/// The kind byte of a padding entry, which fills a write up to a block boundary and is skipped
/// on replay (never a [`JournalEntry`]).
const PADDING_KIND: u8 = 2;

/// One decoded journal entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalEntry {
    pub kind: EntryKind,
    pub key: LogKey,
    pub offset: i64,
    pub data: Bytes,
}

/// The value XORed into every entry CRC of the file with sequence `seq`. A bijection on the
/// sequence's low 32 bits, so two files less than 2^32 rotations apart never share it.
fn crc_mask(seq: u64) -> u32 {
    (seq as u32).wrapping_mul(0x9E37_79B1) ^ 0x5354_524E
}

/// XORs `mask` into the CRC of every entry of `buf`, whole entries back to back (as staged:
/// CRCs are computed when an entry is staged, and the file it goes to is known only when a
/// round takes it).
fn mask_entries(buf: &mut [u8], mask: u32) {
    let mut pos = 0usize;
    while let Some(head) = buf.get_mut(pos..pos + ENTRY_OVERHEAD_BYTES) {
        let len = u32::from_be_bytes([head[0], head[1], head[2], head[3]]) as usize;
        let crc = u32::from_be_bytes([head[4], head[5], head[6], head[7]]) ^ mask;
        head[4..].copy_from_slice(&crc.to_be_bytes());
        pos += ENTRY_OVERHEAD_BYTES + len;
    }
    debug_assert_eq!(pos, buf.len(), "whole entries only");
}

/// Appends an `Append` entry to `buf`.
pub fn encode_append(buf: &mut Vec<u8>, key: &LogKey, base_offset: i64, batch: &[u8]) {
    encode_entry(buf, EntryKind::Append, key, base_offset, batch);
}

/// Appends a `Truncate` entry to `buf`.
pub fn encode_truncate(buf: &mut Vec<u8>, key: &LogKey, offset: i64) {
    encode_entry(buf, EntryKind::Truncate, key, offset, &[]);
}

fn encode_entry(buf: &mut Vec<u8>, kind: EntryKind, key: &LogKey, base_offset: i64, batch: &[u8]) {
    let name = key.dir_name.as_bytes();
    let payload_len = append_payload_bytes(key, batch.len());
    buf.reserve(ENTRY_OVERHEAD_BYTES + payload_len);
    buf.extend_from_slice(&(payload_len as u32).to_be_bytes());
    let crc_at = buf.len();
    buf.extend_from_slice(&[0; 4]);
    let start = buf.len();
    buf.push(kind as u8);
    buf.extend_from_slice(&key.incarnation);
    buf.extend_from_slice(&(name.len() as u16).to_be_bytes());
    buf.extend_from_slice(name);
    buf.extend_from_slice(&base_offset.to_be_bytes());
    buf.extend_from_slice(batch);
    let crc = crc32c::crc32c(buf.get(start..).unwrap_or_default());
    if let Some(dst) = buf.get_mut(crc_at..crc_at + 4) {
        dst.copy_from_slice(&crc.to_be_bytes());
    }
}

/// Pads `buf`, which starts at a block boundary, with one padding entry so that it ends at one.
fn pad_to_block(buf: &mut Vec<u8>) {
    let mut gap = (ALIGN - buf.len() % ALIGN) % ALIGN;
    if gap == 0 {
        return;
    }
    if gap <= ENTRY_OVERHEAD_BYTES {
        // Too small for an entry header and a kind byte: pad to the next boundary but one.
        gap += ALIGN;
    }
    let payload_len = gap - ENTRY_OVERHEAD_BYTES;
    let start = buf.len();
    buf.resize(start + gap, 0);
    if let Some(payload) = buf.get_mut(start + ENTRY_OVERHEAD_BYTES..) {
        if let Some(kind) = payload.first_mut() {
            *kind = PADDING_KIND;
        }
        let crc = crc32c::crc32c(payload);
        if let Some(head) = buf.get_mut(start..start + ENTRY_OVERHEAD_BYTES) {
            head[..4].copy_from_slice(&(payload_len as u32).to_be_bytes());
            head[4..].copy_from_slice(&crc.to_be_bytes());
        }
    }
}

/// Payload bytes of an append entry: kind, incarnation, name length, name, base offset, batch.
fn append_payload_bytes(key: &LogKey, batch_bytes: usize) -> usize {
    1 + 16 + 2 + key.dir_name.len() + 8 + batch_bytes
}

/// Smallest capacity of a buffer of staged entries; the largest is the same as for a log's
/// staged chunks.
const PENDING_CHUNK_MIN_BYTES: usize = 64 << 10;

/// Decodes the entries of a journal file body (after the header), whose CRCs carry `mask` (see
/// `crc_mask`; 0 for files older than recycling). Stops at the first torn or corrupt entry,
/// which is the normal end of a journal cut by a crash or of a recycled file's new entries;
/// the reason is returned.
pub fn decode_entries(body: &Bytes, mask: u32) -> (Vec<JournalEntry>, Option<String>) {
    let mut out = Vec::new();
    let mut pos = 0usize;
    let problem = loop {
        let Some(rest) = body.get(pos..) else { break None };
        if rest.is_empty() {
            break None;
        }
        let Some(head) = rest.first_chunk::<8>() else {
            break Some(format!("torn entry header at byte {pos}"));
        };
        let len = u32::from_be_bytes([head[0], head[1], head[2], head[3]]) as usize;
        let crc = u32::from_be_bytes([head[4], head[5], head[6], head[7]]);
        if !(1..=MAX_ENTRY_BYTES).contains(&len) {
            break Some(format!("bad entry length {len} at byte {pos}"));
        }
        let Some(payload) = rest.get(ENTRY_OVERHEAD_BYTES..ENTRY_OVERHEAD_BYTES + len) else {
            break Some(format!("torn entry at byte {pos}"));
        };
        if crc32c::crc32c(payload) ^ mask != crc {
            break Some(format!("entry CRC mismatch at byte {pos}"));
        }
        let payload_start = pos + ENTRY_OVERHEAD_BYTES;
        if payload.first() != Some(&(PADDING_KIND)) {
            match decode_payload(body, payload_start, payload) {
                Some(e) => out.push(e),
                None => break Some(format!("malformed entry at byte {pos}")),
            }
        }
        pos += ENTRY_OVERHEAD_BYTES + len;
    };
    (out, problem)
}

fn decode_payload(body: &Bytes, payload_start: usize, payload: &[u8]) -> Option<JournalEntry> {
    let (&kind, rest) = payload.split_first()?;
    let kind = match kind {
        1 => EntryKind::Append,
        3 => EntryKind::Truncate,
        _ => return None,
    };
    let incarnation: [u8; 16] = *rest.first_chunk::<16>()?;
    let rest = rest.get(16..)?;
    let name_len = u16::from_be_bytes(*rest.first_chunk::<2>()?) as usize;
    let name = std::str::from_utf8(rest.get(2..2 + name_len)?).ok()?.to_owned();
    let rest = rest.get(2 + name_len..)?;
    let offset = i64::from_be_bytes(*rest.first_chunk::<8>()?);
    let data_start = payload_start + 1 + 16 + 2 + name_len + 8;
    let data = body.slice(data_start..payload_start + payload.len());
    Some(JournalEntry {
        kind,
        key: LogKey {
            dir_name: name,
            incarnation,
        },
        offset,
        data,
    })
}

/// The header and the padding after it: the file's first block.
fn header(shard: u16, seq: u64) -> Vec<u8> {
    let mut h = Vec::with_capacity(FIRST_ENTRY_AT as usize);
    h.extend_from_slice(MAGIC);
    h.extend_from_slice(&shard.to_be_bytes());
    h.extend_from_slice(&[0; 6]);
    h.extend_from_slice(&seq.to_be_bytes());
    pad_to_block(&mut h);
    debug_assert_eq!(h.len() as u64, FIRST_ENTRY_AT);
    if let Some(padding) = h.get_mut(HEADER_BYTES..) {
        mask_entries(padding, crc_mask(seq));
    }
    h
}

/// `<shard>-<sequence>.wal`
pub fn file_name(shard: u16, seq: u64) -> String {
    format!("{shard:05}-{seq:020}.wal")
}

fn parse_file_name(name: &str) -> Option<(u16, u64)> {
    parse_stem(name.strip_suffix(".wal")?)
}

fn parse_stem(stem: &str) -> Option<(u16, u64)> {
    let (shard, seq) = stem.split_once('-')?;
    Some((shard.parse().ok()?, seq.parse().ok()?))
}

/// Deletes the files kept for recycling (`<shard>-<sequence>.free`) under `log_dir`: they hold
/// only entries a checkpoint covered. Start-up does this before the shards start, so that a
/// change in the number of shards leaves none behind.
pub async fn remove_free_files<F: Fs>(fs: &F, log_dir: &Path) -> Result<usize, StorageError> {
    let dir = log_dir.join(JOURNAL_DIR);
    if !fs.exists(&dir).await {
        return Ok(0);
    }
    let names = fs
        .list_dir(&dir)
        .await
        .map_err(|e| StorageError::io("list journal", &dir, e))?;
    let mut removed = 0;
    for name in names {
        let is_free = name
            .strip_suffix(FREE_EXTENSION)
            .and_then(|s| s.strip_suffix('.'))
            .is_some_and(|stem| parse_stem(stem).is_some());
        if is_free {
            let path = dir.join(&name);
            fs.remove_file(&path)
                .await
                .map_err(|e| StorageError::io("remove free journal file", &path, e))?;
            removed += 1;
        }
    }
    Ok(removed)
}

/// All journal files under `log_dir`, ordered by shard then sequence.
pub async fn list_files<F: Fs>(fs: &F, log_dir: &Path) -> Result<Vec<(u16, u64, PathBuf)>, StorageError> {
    let dir = log_dir.join(JOURNAL_DIR);
    if !fs.exists(&dir).await {
        return Ok(Vec::new());
    }
    let names = fs
        .list_dir(&dir)
        .await
        .map_err(|e| StorageError::io("list journal", &dir, e))?;
    let mut files: Vec<(u16, u64, PathBuf)> = names
        .iter()
        .filter_map(|n| parse_file_name(n).map(|(s, q)| (s, q, dir.join(n))))
        .collect();
    files.sort();
    Ok(files)
}

/// Reads a journal file's entries (see [`decode_entries`]).
pub async fn read_file<F: Fs>(
    fs: &F,
    path: &Path,
) -> Result<(Vec<JournalEntry>, Option<String>), StorageError> {
    let bytes = fs
        .read_file(path)
        .await
        .map_err(|e| StorageError::io("read journal", path, e))?;
    let Some(head) = bytes.first_chunk::<HEADER_BYTES>() else {
        return Ok((Vec::new(), Some("missing or torn journal header".into())));
    };
    let header_seq = u64::from_be_bytes(*head[16..].first_chunk::<8>().unwrap_or(&[0; 8]));
    let mask = match &head[..8] {
        m if m == MAGIC => crc_mask(header_seq),
        m if m == MAGIC_UNMASKED || m == MAGIC_UNPADDED => 0,
        _ => return Ok((Vec::new(), Some("missing or torn journal header".into()))),
    };
    let named_seq = path
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(parse_file_name)
        .map(|(_, seq)| seq);
    if named_seq.is_some_and(|seq| seq != header_seq) {
        return Ok((
            Vec::new(),
            Some(format!(
                "journal header has sequence {header_seq}, not the file name's (a recycled file whose \
                 new header was never written)"
            )),
        ));
    }
    Ok(decode_entries(&bytes.slice(HEADER_BYTES..), mask))
}

/// A flush round's journal write: the file, where to write, and the bytes.
pub(crate) struct PendingWrite<Fl> {
    pub(crate) file: Rc<Fl>,
    pub(crate) position: u64,
    /// Consecutive pieces of the write, in order.
    pub(crate) data: Vec<Vec<u8>>,
    pub(crate) path: PathBuf,
}

/// The writing side of a shard's journal.
pub(crate) struct Journal<F: Fs> {
    dir: PathBuf,
    shard: u16,
    seq: u64,
    file: Rc<F::File>,
    path: PathBuf,
    /// Bytes of the current file that are written and synced.
    position: u64,
    /// Entries staged for the next flush round, in buffers of at most
    /// [`PENDING_CHUNK_MAX_BYTES`] (unless one entry is larger) before their padding. Every
    /// buffer but the last is padded to a block boundary; the last is, when taken.
    pending: Vec<Vec<u8>>,
    /// Capacity of the next pending buffer: what the last round staged, within bounds.
    pending_hint_bytes: usize,
    /// Files rotated away, recycled or deleted once a checkpoint covers them.
    retired: Vec<PathBuf>,
    /// Files a checkpoint covered, renamed `.free`, to be overwritten by the next rotations.
    free: Vec<PathBuf>,
    /// How many covered files to keep in `free`; the others are deleted.
    recycle_max: usize,
    segment_bytes: u64,
}

impl<F: Fs> Journal<F> {
    /// Starts a fresh journal for `shard`. Older journal files of the shard must have been
    /// replayed and removed at start-up; finding one is an error rather than data to overwrite.
    pub(crate) async fn create(
        fs: &F,
        log_dir: &Path,
        shard: u16,
        segment_bytes: u64,
        recycle_max: usize,
    ) -> Result<Self, StorageError> {
        let dir = log_dir.join(JOURNAL_DIR);
        fs.create_dir_all(&dir)
            .await
            .map_err(|e| StorageError::io("create journal dir", &dir, e))?;
        if let Some((_, _, path)) = list_files(fs, log_dir)
            .await?
            .into_iter()
            .find(|(s, _, _)| *s == shard)
        {
            return Err(StorageError::JournalNotReplayed(path));
        }
        let (file, path) = Self::new_file(fs, &dir, shard, 0).await?;
        Ok(Journal {
            dir,
            shard,
            seq: 0,
            file: Rc::new(file),
            path,
            position: FIRST_ENTRY_AT,
            pending: Vec::new(),
            pending_hint_bytes: PENDING_CHUNK_MIN_BYTES,
            retired: Vec::new(),
            free: Vec::new(),
            recycle_max,
            segment_bytes,
        })
    }

    pub(crate) async fn new_file(
        fs: &F,
        dir: &Path,
        shard: u16,
        seq: u64,
    ) -> Result<(F::File, PathBuf), StorageError> {
        let path = dir.join(file_name(shard, seq));
        let f = fs
            .open_direct(&path, true)
            .await
            .map_err(|e| StorageError::io("create journal", &path, e))?;
        f.truncate(0)
            .await
            .map_err(|e| StorageError::io("create journal", &path, e))?;
        Self::start_file(fs, dir, f, path, shard, seq).await
    }

    /// Writes a file's header (its first block), then makes it and its name durable.
    async fn start_file(
        fs: &F,
        dir: &Path,
        f: F::File,
        path: PathBuf,
        shard: u16,
        seq: u64,
    ) -> Result<(F::File, PathBuf), StorageError> {
        f.write_all_at(header(shard, seq), 0)
            .await
            .map_err(|e| StorageError::io("write journal header", &path, e))?;
        f.fdatasync()
            .await
            .map_err(|e| StorageError::io("sync journal", &path, e))?;
        fs.sync_dir(dir)
            .await
            .map_err(|e| StorageError::io("sync journal dir", dir, e))?;
        Ok((f, path))
    }

    /// Renames a free file (see [`Journal::take_free`]) into sequence `seq` and writes its new
    /// header, after which the file holds no entries: the older ones behind the header fail
    /// their CRC check against the new sequence. Falls back to a new file if the rename fails.
    pub(crate) async fn recycle_file(
        fs: &F,
        dir: &Path,
        shard: u16,
        seq: u64,
        free: &Path,
    ) -> Result<(F::File, PathBuf), StorageError> {
        let path = dir.join(file_name(shard, seq));
        if let Err(e) = fs.rename(free, &path).await {
            tracing::warn!(path = %free.display(), error = %e, "could not recycle a journal file");
            let _ = fs.remove_file(free).await;
            return Self::new_file(fs, dir, shard, seq).await;
        }
        let f = fs
            .open_direct(&path, false)
            .await
            .map_err(|e| StorageError::io("open recycled journal", &path, e))?;
        Self::start_file(fs, dir, f, path, shard, seq).await
    }

    /// A free file to recycle into the next sequence, if any.
    pub(crate) fn take_free(&mut self) -> Option<PathBuf> {
        self.free.pop()
    }

    /// Where a covered file goes to be recycled, or `None` if enough are kept (delete it).
    pub(crate) fn free_path_for(&self, retired: &Path) -> Option<PathBuf> {
        (self.free.len() < self.recycle_max).then(|| retired.with_extension(FREE_EXTENSION))
    }

    /// Records a covered file renamed to `free` (see [`Journal::free_path_for`]).
    pub(crate) fn add_free(&mut self, free: PathBuf) {
        self.free.push(free);
    }

    /// Files kept for recycling (deleted at shutdown).
    pub(crate) fn take_all_free(&mut self) -> Vec<PathBuf> {
        std::mem::take(&mut self.free)
    }

    /// Stages one entry per batch of `data`, whole stored batches back to back (a log's staged
    /// chunk), each at the base offset its header carries.
    pub(crate) fn stage_batches(&mut self, key: &LogKey, data: &[u8]) {
        let mut rest = data;
        while let Ok(header) = strand_protocol::batch::BatchHeader::parse(rest) {
            let total = header.total_bytes();
            let (Some(batch), Some(after)) = (rest.get(..total), rest.get(total..)) else {
                break;
            };
            let entry = ENTRY_OVERHEAD_BYTES + append_payload_bytes(key, batch.len());
            let fits = self
                .pending
                .last()
                .is_some_and(|b| b.is_empty() || b.len() + entry <= PENDING_CHUNK_MAX_BYTES);
            if !fits {
                if let Some(full) = self.pending.last_mut() {
                    pad_to_block(full);
                }
                self.pending.push(Vec::with_capacity(
                    entry.max(self.pending_hint_bytes) + PAD_MAX_BYTES,
                ));
            }
            if let Some(buf) = self.pending.last_mut() {
                encode_append(buf, key, header.base_offset, batch);
            }
            rest = after;
        }
        debug_assert!(rest.is_empty(), "a staged chunk holds whole batches only");
    }

    /// Stages a `Truncate` entry of `key` at `offset` (see the module documentation).
    pub(crate) fn stage_truncate(&mut self, key: &LogKey, offset: i64) {
        let entry = ENTRY_OVERHEAD_BYTES + append_payload_bytes(key, 0);
        let fits = self
            .pending
            .last()
            .is_some_and(|b| b.is_empty() || b.len() + entry <= PENDING_CHUNK_MAX_BYTES);
        if !fits {
            if let Some(full) = self.pending.last_mut() {
                pad_to_block(full);
            }
            self.pending.push(Vec::with_capacity(entry + PAD_MAX_BYTES));
        }
        if let Some(buf) = self.pending.last_mut() {
            encode_truncate(buf, key, offset);
        }
    }

    /// Takes the staged entries for a flush round.
    pub(crate) fn take_pending(&mut self) -> Option<PendingWrite<F::File>> {
        let total: usize = self.pending.iter().map(Vec::len).sum();
        if total == 0 {
            return None;
        }
        self.pending_hint_bytes = total.clamp(PENDING_CHUNK_MIN_BYTES, PENDING_CHUNK_MAX_BYTES);
        if let Some(last) = self.pending.last_mut() {
            pad_to_block(last);
        }
        let mut data = std::mem::take(&mut self.pending);
        let mask = crc_mask(self.seq);
        for buf in &mut data {
            mask_entries(buf, mask);
        }
        debug_assert!(data.iter().all(|d| d.len() % ALIGN == 0));
        debug_assert_eq!(self.position % ALIGN as u64, 0);
        Some(PendingWrite {
            file: self.file.clone(),
            position: self.position,
            data,
            path: self.path.clone(),
        })
    }

    /// The current file and where its synced entries end. A failed round may have written
    /// entries past that, valid ones even (its segment writes failed, not its journal write):
    /// [`crate::ShardStore::try_resume`] cuts them off before the offsets they carry are given
    /// out again, or replay after a crash could take them for the batches appended there since.
    pub(crate) fn synced_end(&self) -> (Rc<F::File>, u64, PathBuf) {
        (self.file.clone(), self.position, self.path.clone())
    }

    /// Records that a round's write of `len` bytes at the current position is durable.
    pub(crate) fn advance(&mut self, len: u64) {
        self.position += len;
    }

    pub(crate) fn needs_rotation(&self) -> bool {
        self.position >= self.segment_bytes
    }

    /// Whether entries written since the last rotation exist.
    pub(crate) fn has_entries(&self) -> bool {
        self.position > FIRST_ENTRY_AT
    }

    /// Where the next journal file goes: (directory, shard, sequence). Create it with
    /// [`Journal::new_file`] (no borrow of the journal needed while that waits for the disk),
    /// then [`Journal::install`] it.
    pub(crate) fn next_file(&self) -> (PathBuf, u16, u64) {
        (self.dir.clone(), self.shard, self.seq + 1)
    }

    /// Switches to a new journal file; the old one is retired until a checkpoint covers it.
    /// Call between flush rounds only.
    pub(crate) fn install(&mut self, file: F::File, path: PathBuf, seq: u64) {
        let old = std::mem::replace(&mut self.path, path);
        self.retired.push(old);
        self.file = Rc::new(file);
        self.seq = seq;
        self.position = FIRST_ENTRY_AT;
    }

    /// Files a checkpoint that started now would make obsolete.
    pub(crate) fn take_retired(&mut self) -> Vec<PathBuf> {
        std::mem::take(&mut self.retired)
    }

    /// Gives back files a failed checkpoint could not retire.
    pub(crate) fn unretire(&mut self, mut files: Vec<PathBuf>) {
        files.append(&mut self.retired);
        self.retired = files;
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn size(&self) -> u64 {
        self.position
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key_t0() -> LogKey {
        LogKey {
            dir_name: "t-0".into(),
            incarnation: [1; 16],
        }
    }

    #[test]
    fn entries_round_trip_and_stop_at_damage() {
        let key = LogKey {
            dir_name: "orders-3".into(),
            incarnation: [7; 16],
        };
        let mut buf = Vec::new();
        encode_append(&mut buf, &key, 42, b"batch-one");
        encode_append(&mut buf, &key, 43, b"batch-two!");
        let full = Bytes::from(buf.clone());
        let (entries, problem) = decode_entries(&full, 0);
        assert_eq!(problem, None);
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[1].offset, 43);
        assert_eq!(&entries[1].data[..], b"batch-two!");
        assert_eq!(entries[0].key, key);

        let torn = Bytes::from(buf[..buf.len() - 3].to_vec());
        let (entries, problem) = decode_entries(&torn, 0);
        assert_eq!(entries.len(), 1);
        assert!(problem.unwrap().contains("torn"));

        let mut corrupt = buf.clone();
        let n = corrupt.len();
        corrupt[n - 1] ^= 0xff;
        let (entries, problem) = decode_entries(&Bytes::from(corrupt), 0);
        assert_eq!(entries.len(), 1);
        assert!(problem.unwrap().contains("CRC"));
    }

    #[test]
    fn truncate_entries_round_trip_between_appends() {
        let key = LogKey {
            dir_name: "orders-3".into(),
            incarnation: [7; 16],
        };
        let mut buf = Vec::new();
        encode_append(&mut buf, &key, 42, b"batch-one");
        encode_truncate(&mut buf, &key, 40);
        encode_append(&mut buf, &key, 40, b"batch-two");
        let (entries, problem) = decode_entries(&Bytes::from(buf), 0);
        assert_eq!(problem, None);
        let got: Vec<_> = entries.iter().map(|e| (e.kind, e.offset, e.data.len())).collect();
        assert_eq!(
            got,
            [
                (EntryKind::Append, 42, 9),
                (EntryKind::Truncate, 40, 0),
                (EntryKind::Append, 40, 9)
            ]
        );
        assert_eq!(entries[1].key, key);
    }

    #[test]
    fn padding_ends_every_buffer_at_a_block_boundary_and_is_skipped() {
        let key = key_t0();
        let header = header(3, 9);
        assert_eq!(header.len() as u64, FIRST_ENTRY_AT);
        let (entries, problem) = decode_entries(&Bytes::from(header[HEADER_BYTES..].to_vec()), crc_mask(9));
        assert_eq!((entries.len(), problem), (0, None));
        // Every gap to the boundary, including those too small for an entry of their own.
        let one_entry = ENTRY_OVERHEAD_BYTES + append_payload_bytes(&key, 0);
        for batch_len in 0..ALIGN + 16 {
            let batch = vec![7u8; batch_len];
            let mut buf = Vec::new();
            encode_append(&mut buf, &key, 5, &batch);
            let unpadded = buf.len();
            pad_to_block(&mut buf);
            assert_eq!(buf.len() % ALIGN, 0, "batch of {batch_len}");
            assert!(buf.len() - unpadded <= PAD_MAX_BYTES, "batch of {batch_len}");
            // Another buffer's entry after it decodes too.
            encode_append(&mut buf, &key, 6, b"next");
            let (entries, problem) = decode_entries(&Bytes::from(buf), 0);
            assert_eq!(problem, None, "batch of {batch_len}");
            assert_eq!(entries.len(), 2, "batch of {batch_len}");
            assert_eq!(entries[0].data.len(), batch_len);
            assert_eq!((entries[1].offset, &entries[1].data[..]), (6, &b"next"[..]));
            assert!(one_entry + batch_len == unpadded);
        }
        // A zeroed block (a torn direct write) still ends the journal.
        let (entries, problem) = decode_entries(&Bytes::from(vec![0u8; ALIGN]), 0);
        assert!(entries.is_empty() && problem.unwrap().contains("bad entry length"));
    }

    #[test]
    fn files_without_padding_are_still_read() {
        let key = key_t0();
        let fs = crate::fs_mem::MemFs::new();
        let path = Path::new("/j/00000-00000000000000000000.wal");
        futures_lite::future::block_on(async {
            fs.create_dir_all(Path::new("/j")).await.unwrap();
            let mut old = header(0, 0);
            old.truncate(HEADER_BYTES);
            old[..8].copy_from_slice(MAGIC_UNPADDED);
            encode_append(&mut old, &key, 11, b"old-batch");
            fs.set_contents(path, old);
            let (entries, problem) = read_file(&fs, path).await.unwrap();
            assert_eq!(problem, None);
            assert_eq!((entries.len(), entries[0].offset), (1, 11));

            let mut unknown = header(0, 0);
            unknown[..8].copy_from_slice(b"STRNDJ99");
            fs.set_contents(path, unknown);
            let (entries, problem) = read_file(&fs, path).await.unwrap();
            assert!(entries.is_empty() && problem.is_some());
        });
    }

    /// A file written as sequence `seq`: its header, then one padded buffer per entry (so
    /// every entry starts a block), masked as a round's write is.
    fn file_of(seq: u64, key: &LogKey, offsets: std::ops::Range<i64>) -> Vec<u8> {
        let mut file = header(0, seq);
        for offset in offsets {
            let mut buf = Vec::new();
            encode_append(&mut buf, key, offset, format!("batch-{offset}").as_bytes());
            pad_to_block(&mut buf);
            mask_entries(&mut buf, crc_mask(seq));
            file.extend_from_slice(&buf);
        }
        file
    }

    #[test]
    fn a_recycled_file_ends_where_its_new_entries_end() {
        let key = key_t0();
        let fs = crate::fs_mem::MemFs::new();
        let dir = Path::new("/j");
        let old_path = dir.join(file_name(0, 3));
        let new_path = dir.join(file_name(0, 8));
        futures_lite::future::block_on(fs.create_dir_all(dir)).unwrap();
        let read = |path: &Path| futures_lite::future::block_on(read_file(&fs, path)).unwrap();
        let old = file_of(3, &key, 0..4);
        fs.set_contents(&old_path, old.clone());
        let (entries, problem) = read(&old_path);
        assert_eq!((entries.len(), problem), (4, None));

        // Recycled as sequence 8 with one entry: entries 1..4 of sequence 3 follow it, each
        // at a block boundary, whole and with a good CRC for sequence 3.
        let new = file_of(8, &key, 100..101);
        let mut recycled = old.clone();
        recycled[..new.len()].copy_from_slice(&new);
        fs.set_contents(&new_path, recycled);
        let (entries, problem) = read(&new_path);
        let offsets: Vec<i64> = entries.iter().map(|e| e.offset).collect();
        assert_eq!(offsets, vec![100], "only the new sequence's entries");
        assert!(problem.unwrap().contains("CRC"));

        // A rename that happened without the new header: sequence 3's file under 8's name.
        fs.set_contents(&new_path, old.clone());
        let (entries, problem) = read(&new_path);
        assert!(
            entries.is_empty(),
            "a file whose header is not its name's holds nothing"
        );
        assert!(problem.unwrap().contains("not the file name's"));

        // The new header written, nothing else yet: no entries.
        let mut fresh = old;
        fresh[..FIRST_ENTRY_AT as usize].copy_from_slice(&header(0, 8));
        fs.set_contents(&new_path, fresh);
        let (entries, _) = read(&new_path);
        assert!(entries.is_empty());
    }

    #[test]
    fn masks_differ_between_sequences() {
        let masks: std::collections::HashSet<u32> = (0..100_000).map(crc_mask).collect();
        assert_eq!(masks.len(), 100_000);
        let mut buf = Vec::new();
        encode_append(
            &mut buf,
            &LogKey {
                dir_name: "x".into(),
                incarnation: [0; 16],
            },
            1,
            b"abc",
        );
        let plain = buf.clone();
        mask_entries(&mut buf, crc_mask(5));
        assert_ne!(buf, plain);
        mask_entries(&mut buf, crc_mask(5));
        assert_eq!(buf, plain, "masking twice restores the CRC");
    }

    #[test]
    fn names() {
        assert_eq!(parse_file_name(&file_name(3, 17)), Some((3, 17)));
        assert_eq!(parse_file_name("x.wal"), None);
    }
}
