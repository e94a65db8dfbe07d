//! [`Fs`] on glommio: file reads, writes and `fdatasync` go through the shard's io_uring, so a
//! shard keeps serving while its flush round waits for the disk; so do directory fsyncs.
//! `syncfs` and creating a directory run on the shard's blocking thread: a `syncfs` takes as
//! long as the write-back, and a CreateTopics of thousands of partitions creates thousands of
//! directories. Other directory operations (renames, removals, listings) are rare or fast and
//! are plain blocking calls on the executor: the flush path uses some of them, and must not
//! queue behind a `syncfs`.
//!
//! Reads of buffered files take what the page cache holds with `preadv2(RWF_NOWAIT)`, straight
//! into the buffer they return and never waiting for the disk, and only the rest through
//! io_uring (`buffered_read`; BENCHMARKS.md#nowait-reads). Files opened with
//! [`Fs::open_direct`] are glommio `DmaFile`s, or buffered files where the file system refuses
//! `O_DIRECT`. glommio's probe for its poll ring is patched (`third_party/glommio`): it took an
//! empty file's zero-byte read as proof of `IOPOLL` support, and direct reads then failed with
//! `EOPNOTSUPP` on a disk without poll queues.
//!
//! This is the only storage module that knows the runtime, and one of the two places in the
//! workspace allowed `unsafe` code (the other sets the allocator's options in the broker's
//! `main`): one borrow of a file descriptor glommio owns (see `borrow_fd`), for the system
//! calls glommio has no operation for (the cached read, `fadvise`, `ftruncate`, duplicating
//! the descriptor for `sendfile`), and, in its tests only, an `mmap` + `mincore` probe of the
//! pages the page cache holds.
//!
//! # State
//!
//! A [`GlommioFs`] is one shard's file system, built from one [`GlommioFsConfig`] and the
//! process's [`SharedFs`]. Its state is one `FsState` behind an `Rc` that the `GlommioFs`, its
//! clones and every file it opens share; nothing lives in globals or thread-locals:
//!
//! - the config: direct segment writes, the budget of recent writes kept in memory, the
//!   page-cache guard, drop-behind;
//! - the recent writes of all the shard's direct-written segments, in the order they are
//!   evicted (`RecentWrites`), and the bytes its files have read ahead;
//! - a descriptor per file system it has synced with `syncfs`;
//! - its counters ([`FsStats`], read by the broker's metrics through [`GlommioFs::stats`]).
//!
//! What is process-wide is explicit, in the one [`SharedFs`] created at start-up: the bound on
//! file regions alive at once (descriptors are the process's), and what the data directory's
//! file system turned out not to support (`O_DIRECT`, `RWF_NOWAIT` reads, `fallocate`), each
//! found once and then avoided by every shard.
//!
//! # Direct segment writes
//!
//! With [`GlommioFsConfig::direct_segment_writes`], segment files write their writes of
//! `DIRECT_MIN_BYTES` or more with `O_DIRECT`, the last partial page padded with zeros, into
//! space reserved ahead (see `split_write`): a growing log then takes no page-cache pages for
//! what it writes, which is where a buffered write spends its time on a VM whose fresh pages
//! are expensive. The page cache then lacks what was written: reads of each file's most recent
//! writes (a consumer following the log) come from memory, up to
//! [`GlommioFsConfig::recent_writes_bytes`] per shard, oldest write evicted first whichever
//! file it belongs to. The budget counts the memory a kept write holds, not only its data: a
//! write staged in a buffer more than twice its size is kept as an exact copy (`kept`;
//! BENCHMARKS.md#recent-writes-budget). Reads that miss them go through the page cache, as
//! every read of a Kafka log does: a consumer catching up takes pages, and the next reader of
//! the same data finds them there. Mixing those reads with direct writes is safe only
//! if no read holds a page a direct write covers: the kernel drops the cached pages a direct
//! write covers, and if one of them is being read at that moment it stays, stale, and the
//! kernel fails the file's next `fsync` with `EIO`. Direct writes only ever cover the page
//! holding the written end and those after it. So reads
//!
//! - **ending [`GlommioFsConfig::page_cache_guard_bytes`] or more before the page the next
//!   write starts in** run whenever they come: a read through the page cache takes at most the
//!   kernel's read-ahead window beyond what it asked for, and the distance is several windows
//!   ([`page_cache_guard_bytes`]);
//! - **nearer the end** run through the page cache only while no write of the file is in
//!   flight (otherwise directly, with `O_DIRECT`), and a write that starts while one runs goes
//!   through the page cache instead of directly. The kernel's read-ahead beyond such a read is
//!   no hazard: its pages are locked until read, and a direct write waits for them. Where the
//!   file holds reserved space, a read whose read-ahead window could pass the data switches the
//!   kernel's read-ahead off (`FADV_RANDOM`) while it runs, or the kernel would cache the
//!   reserved zeros (BENCHMARKS.md#near-read-readahead); reads near the end read ahead
//!   themselves, 4 MiB at a time, never past the end of completed writes (`DirectSide::read`).
//!
//! A region handed out for `sendfile` ([`FileHandle::sendable`]) is such a read: only bytes far
//! behind the end (and not among the recent writes) are handed out, decided when the region is
//! handed out; the written end only moves on after that, so they stay far.
//!
//! Truncations, which move the end back, and the first direct write wait for running reads (a
//! shard-local async `RwLock` per handle). All of this is per file handle, so a segment file
//! has one: rounds taken while the round that creates the file is in flight take the handle it
//! created (`Segment::created`) instead of opening their own, and reads use the same one.
//!
//! A log stages a chunk it expects to write directly in the direct layout ([`Fs::stage_buf`],
//! [`StageBuf`]), so that its whole pages go out from where the batches were staged
//! (`DmaFile::write_foreign_at`, a glommio patch) instead of being copied into a DMA buffer
//! first: each produced byte is copied once, into the staging buffer
//! (BENCHMARKS.md#one-copy-staging). [`FsStats`] counts the bytes written both ways.
//!
//! # Drop-behind
//!
//! With [`GlommioFsConfig::drop_behind_bytes`] N > 0, after an `fdatasync` a buffered file's
//! pages lying more than N bytes behind the end of what was written through the handle are
//! dropped from the page cache (`POSIX_FADV_DONTNEED`). A growing log then reuses the pages it
//! frees instead of taking new ones (the kernel drops whole folios, so up to one large folio
//! more stays), which matters where taking a page the kernel has not used recently is
//! expensive (a VM whose free memory goes back to the host); reads of dropped data come from
//! the disk.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::io;
use std::io::IoSliceMut;
use std::num::NonZeroU64;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::rc::{Rc, Weak};
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use glommio::io::{BufferedFile, DmaFile, OpenOptions};
use glommio::sync::RwLock;
use rustix::io::{Errno, ReadWriteFlags};

use crate::fs::{direct_aligned, FileHandle, Fs, FsSpace, StageBuf, StdFs};
use crate::region::FileRegions;

/// A shard's file system on glommio; usable only inside a glommio executor. Clones share one
/// state (see the module docs), as do the files they open.
#[derive(Clone, Debug)]
pub struct GlommioFs(Rc<FsState>);

/// The settings of a shard's [`GlommioFs`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GlommioFsConfig {
    /// Segment files write their whole pages with `O_DIRECT` (see the module docs), where the
    /// file system supports it. Off, segments are written through the page cache.
    pub direct_segment_writes: bool,
    /// With direct segment writes, memory for the shard's segments' most recent writes (the
    /// buffers kept, not only their data), which serve reads of the logs' ends.
    pub recent_writes_bytes: usize,
    /// With direct segment writes, how far behind a segment's written end reads go through
    /// the page cache whenever they come ([`page_cache_guard_bytes`]).
    pub page_cache_guard_bytes: u64,
    /// After an `fdatasync`, a buffered file's pages more than this many bytes behind its
    /// written end are dropped from the page cache (see the module docs); 0 keeps them.
    pub drop_behind_bytes: u64,
}

impl Default for GlommioFsConfig {
    /// Segments written through the page cache, and nothing dropped from it.
    fn default() -> Self {
        GlommioFsConfig {
            direct_segment_writes: false,
            recent_writes_bytes: 256 << 20,
            page_cache_guard_bytes: PAGE_CACHE_GUARD_UNKNOWN_BYTES,
            drop_behind_bytes: 0,
        }
    }
}

/// What every shard's file system shares: created once at start-up ([`SharedFs::for_process`])
/// and handed to each shard's [`GlommioFs`].
#[derive(Debug)]
pub struct SharedFs {
    /// File regions alive at once (see [`FileHandle::sendable`]).
    regions: &'static FileRegions,
    /// Cleared for good when the file system refuses `O_DIRECT`, or its disk needs a larger
    /// alignment: every shard then writes through the page cache.
    direct_io: AtomicBool,
    /// Cleared for good when the kernel or file system does not support `RWF_NOWAIT` reads.
    nowait_reads: AtomicBool,
    /// Cleared for good when the file system cannot reserve space (`fallocate`).
    reserve_space: AtomicBool,
}

impl SharedFs {
    /// The process's shared state, with `regions` as the bound on file regions alive at once.
    /// It lives until the process exits: a region may be dropped on any thread.
    pub fn for_process(regions: &'static FileRegions) -> &'static SharedFs {
        Box::leak(Box::new(SharedFs {
            regions,
            direct_io: AtomicBool::new(true),
            nowait_reads: AtomicBool::new(true),
            reserve_space: AtomicBool::new(true),
        }))
    }

    /// Clears `flag` and says whether this call cleared it (the first to find it unsupported
    /// tells the log).
    fn clear(flag: &AtomicBool) -> bool {
        flag.swap(false, Ordering::Relaxed)
    }
}

/// What a shard's file system has counted since it started (see [`GlommioFs::stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FsStats {
    /// Bytes asked of the kernel to drop from the page cache (each open handle of a file drops
    /// on its own, so a range may be counted more than once).
    pub dropped_behind_bytes: u64,
    /// Memory the recent writes of direct-written segments hold now.
    pub recent_writes_bytes: usize,
    /// Bytes read of direct-written segments from their recent writes in memory.
    pub recent_hit_bytes: u64,
    /// Bytes read of direct-written segments from their files.
    pub recent_miss_bytes: u64,
    /// Bytes read near direct-written ends through the page cache, with what was read ahead.
    pub near_cached_read_bytes: u64,
    /// Writes that would have been direct and went through the page cache, since a read near
    /// the end ran.
    pub writes_beside_near_reads: u64,
    /// Bytes of direct segment writes written from where they were staged.
    pub direct_uncopied_bytes: u64,
    /// Bytes of direct segment writes copied into an aligned buffer first (data not staged in
    /// the direct layout).
    pub direct_copied_bytes: u64,
    /// Bytes of segment space reserved ahead of direct writes (see `DirectSide::reserve`).
    pub reserved_bytes: u64,
}

/// The counters behind [`FsStats`] (the recent writes' memory is [`RecentWrites::bytes`]).
#[derive(Debug, Default)]
struct FsCounters {
    dropped_behind_bytes: Cell<u64>,
    recent_hit_bytes: Cell<u64>,
    recent_miss_bytes: Cell<u64>,
    near_cached_read_bytes: Cell<u64>,
    writes_beside_near_reads: Cell<u64>,
    direct_uncopied_bytes: Cell<u64>,
    direct_copied_bytes: Cell<u64>,
    reserved_bytes: Cell<u64>,
}

/// Adds `n` to a counter.
fn add(counter: &Cell<u64>, n: u64) {
    counter.set(counter.get() + n);
}

/// A shard's file-system state (see the module docs).
#[derive(Debug)]
struct FsState {
    config: GlommioFsConfig,
    shared: &'static SharedFs,
    counters: FsCounters,
    recent: RecentWrites,
    /// Bytes read ahead by the shard's files (see [`DirectSide::read`]).
    ahead_bytes: Cell<usize>,
    /// A directory per file system (by device number) the shard has synced with `syncfs`.
    filesystems: RefCell<Vec<(u64, std::sync::Arc<std::fs::File>)>>,
}

impl FsState {
    /// Whether segment writes may go direct: configured so, and not found unsupported.
    fn direct_segments(&self) -> bool {
        self.config.direct_segment_writes && self.shared.direct_io.load(Ordering::Relaxed)
    }
}

impl GlommioFs {
    /// A shard's file system.
    pub fn new(config: GlommioFsConfig, shared: &'static SharedFs) -> GlommioFs {
        GlommioFs(Rc::new(FsState {
            config,
            shared,
            counters: FsCounters::default(),
            recent: RecentWrites::default(),
            ahead_bytes: Cell::new(0),
            filesystems: RefCell::new(Vec::new()),
        }))
    }

    pub fn config(&self) -> &GlommioFsConfig {
        &self.0.config
    }

    fn file(&self, file: Inner) -> GlommioFile {
        GlommioFile {
            file,
            written: Cell::default(),
            side: None,
            fs: Rc::clone(&self.0),
        }
    }

    /// What the shard's file system has counted so far.
    pub fn stats(&self) -> FsStats {
        let c = &self.0.counters;
        FsStats {
            dropped_behind_bytes: c.dropped_behind_bytes.get(),
            recent_writes_bytes: self.0.recent.bytes.get(),
            recent_hit_bytes: c.recent_hit_bytes.get(),
            recent_miss_bytes: c.recent_miss_bytes.get(),
            near_cached_read_bytes: c.near_cached_read_bytes.get(),
            writes_beside_near_reads: c.writes_beside_near_reads.get(),
            direct_uncopied_bytes: c.direct_uncopied_bytes.get(),
            direct_copied_bytes: c.direct_copied_bytes.get(),
            reserved_bytes: c.reserved_bytes.get(),
        }
    }
}

/// A glommio file: buffered (page cache, io_uring), or direct (`O_DIRECT`, io_uring) for a file
/// opened with [`Fs::open_direct`].
#[derive(Debug)]
pub struct GlommioFile {
    file: Inner,
    written: Cell<Written>,
    /// A segment file's direct descriptor and what goes with it (direct segment writes).
    side: Option<DirectSide>,
    fs: Rc<FsState>,
}

/// A segment file's second, `O_DIRECT` descriptor (see the module docs) and the bytes of the
/// file's last partial page as this handle last wrote them.
#[derive(Debug)]
struct DirectSide {
    /// The shard's file system (its recent writes, read-ahead budget and counters).
    fs: Rc<FsState>,
    /// The file's buffered descriptor (also the handle's), for reads that run on by themselves.
    file: Rc<BufferedFile>,
    /// Opened at the first direct write: most segments of a broker with many partitions are
    /// never written again (a restart's recovery only reads them), and a descriptor each would
    /// be twice the files.
    dma: RefCell<Option<Rc<DmaFile>>>,
    /// A write through this handle is in flight.
    writing: Cell<bool>,
    /// (page start, bytes from it to the written end), `None` if not known (then read back).
    tail: RefCell<Option<(u64, Vec<u8>)>>,
    /// The most recent writes, kept to serve reads of them from memory (see [`Recent`]).
    recent: Rc<RefCell<Recent>>,
    /// Bytes before this position hold what they will keep (the file's size when opened, then
    /// every completed write's end); reading ahead stops there, since what lies beyond may be
    /// in flight.
    stable_end: Cell<Option<u64>>,
    /// The last read from the file, at least [`READ_AHEAD_BYTES`] where the file had them: the
    /// reads of a consumer catching up continue in it.
    ahead: RefCell<Option<(u64, Bytes)>>,
    /// The next piece's read, running in the background (see [`DirectSide::read`]).
    next: RefCell<Option<(u64, glommio::Task<io::Result<Bytes>>)>>,
    /// How many times what was read ahead has been forgotten (a truncation): a read that
    /// finishes after that keeps nothing beyond what it was asked for, which the truncation
    /// may have cut.
    forgotten: Cell<u64>,
    /// Held (shared) by every read of the file through the page cache while it runs; taken
    /// (exclusive) before the direct descriptor is opened and before a truncation, which move
    /// the pages direct writes will cover (see the module docs).
    page_cache_reads: Rc<RwLock<()>>,
    /// Reads through the page cache near the written end that have not finished: while there
    /// are any, writes go through the page cache too (see the module docs).
    near_reads: Rc<Cell<usize>>,
    /// The file's size as this handle last set it beyond the written end (space reserved for
    /// the writes to come, and the zeros padding the last direct write), `None` while the file
    /// ends where its data ends (see `DirectSide::reserve`).
    reserved: Cell<Option<u64>>,
    /// No write extends the file any more (see [`FileHandle::seal`]).
    sealed: Cell<bool>,
}

/// Counts one read near the end for as long as it lives.
struct NearRead(Rc<Cell<usize>>);

impl NearRead {
    fn new(count: &Rc<Cell<usize>>) -> Self {
        count.set(count.get() + 1);
        NearRead(Rc::clone(count))
    }
}

impl Drop for NearRead {
    fn drop(&mut self) {
        self.0.set(self.0.get().saturating_sub(1));
    }
}

/// Smaller segment writes go through the page cache.
const DIRECT_MIN_BYTES: usize = 64 << 10;

/// A direct-written segment reserves space ahead of its writes in steps of at least this
/// much, and four times the write that needed it, up to [`RESERVE_MAX_BYTES`] (see
/// `DirectSide::reserve`).
const RESERVE_MIN_BYTES: u64 = 1 << 20;
const RESERVE_MAX_BYTES: u64 = 16 << 20;

/// A read of a direct-written segment that misses its recent writes reads at least this much.
const READ_AHEAD_BYTES: usize = 4 << 20;
/// Bytes of read-ahead the shard keeps at most, of all its files together.
const READ_AHEAD_MAX_BYTES: usize = 64 << 20;

impl DirectSide {
    /// Reads `len` bytes at `pos` near the written end (anywhere in a file not yet written
    /// directly, which is read through the page cache), from what was read ahead or from the
    /// file: up to [`READ_AHEAD_BYTES`] at once, through the page cache while no write of the
    /// file is in flight (see [`DirectSide::near_read`]) and directly otherwise. A consumer
    /// catching up reads on: whenever it has read into the second half of what was read ahead,
    /// the next piece is read directly in the background.
    async fn read(&self, pos: u64, len: usize) -> io::Result<Bytes> {
        let f = &*self.file;
        if let Some(hit) = self.read_ahead(pos, len) {
            return Ok(hit);
        }
        let pending = self.next.borrow_mut().take();
        if let Some((at, task)) = pending {
            let end = pos + len as u64;
            // The bytes before the next piece, when the read begins in what was read ahead
            // and goes on into that piece.
            let head = if pos < at && at < end {
                self.read_ahead(pos, (at - pos) as usize)
            } else {
                None
            };
            let forgotten = self.forgotten.get();
            if (pos >= at && pos < at + READ_AHEAD_BYTES as u64) || head.is_some() {
                let bytes = task.await?;
                // A piece read before a truncation is not kept: the truncation may have cut it.
                if self.forgotten.get() == forgotten {
                    self.set_ahead(at, bytes);
                }
                match head {
                    None => {
                        if let Some(hit) = self.read_ahead(pos, len) {
                            return Ok(hit);
                        }
                    }
                    Some(head) => {
                        if let Some(rest) = self.read_ahead(at, (end - at) as usize) {
                            let mut joined = Vec::with_capacity(len);
                            joined.extend_from_slice(&head);
                            joined.extend_from_slice(&rest);
                            return Ok(Bytes::from(joined));
                        }
                    }
                }
            }
        }
        self.drop_ahead();
        // Only a file this handle writes directly is read directly: the page cache may hold
        // the rest, and a descriptor more for every segment read (a restart's recovery scans
        // them all) would double the files a broker with many partitions keeps open.
        let Some(dma) = self.dma.borrow().clone() else {
            let _reading = self.page_cache_reads.read().await.map_err(lock_error)?;
            return buffered_read(f, pos, len, self.fs.shared).await;
        };
        let forgotten = self.forgotten.get();
        let stable = self.stable_end().await?.saturating_sub(pos) as usize;
        let room = READ_AHEAD_MAX_BYTES.saturating_sub(self.fs.ahead_bytes.get());
        let want = len.max(READ_AHEAD_BYTES.min(stable).min(room));
        // Through the page cache unless a write of the file is in flight, so that the next
        // reader finds these bytes in memory (see `near_read`).
        let bytes = match self.near_read(pos, want).await? {
            Some(bytes) => {
                add(&self.fs.counters.near_cached_read_bytes, bytes.len() as u64);
                bytes
            }
            None => Bytes::copy_from_slice(&dma.read_at(pos, want).await?),
        };
        if bytes.len() > len {
            if self.forgotten.get() == forgotten {
                self.set_ahead(pos, bytes.clone());
                self.prefetch(pos + bytes.len() as u64);
            }
            return Ok(bytes.slice(..len));
        }
        Ok(bytes)
    }

    /// `len` bytes at `pos` from what was read ahead, if it holds them; starts the next
    /// piece's read once the second half is reached.
    fn read_ahead(&self, pos: u64, len: usize) -> Option<Bytes> {
        let (hit, end, past_half) = {
            let ahead = self.ahead.borrow();
            let (at, bytes) = ahead.as_ref()?;
            let end = at + bytes.len() as u64;
            if pos < *at || pos + len as u64 > end {
                return None;
            }
            let off = (pos - at) as usize;
            let past_half = pos + len as u64 > at + bytes.len() as u64 / 2;
            (bytes.slice(off..off + len), end, past_half)
        };
        if past_half {
            self.prefetch(end);
        }
        Some(hit)
    }

    /// Starts reading the piece at `from` in the background, if none is being read, the file
    /// holds stable bytes there and the shard's read-ahead budget has room.
    fn prefetch(&self, from: u64) {
        if self.next.borrow().is_some() {
            return;
        }
        let Some(stable) = self.stable_end.get() else {
            return;
        };
        let Some(dma) = self.dma.borrow().clone() else {
            return;
        };
        let n = (stable.saturating_sub(from) as usize).min(READ_AHEAD_BYTES);
        let used = self.fs.ahead_bytes.get();
        if n < DIRECT_MIN_BYTES || used + n > READ_AHEAD_MAX_BYTES {
            return;
        }
        let task = glommio::spawn_local(async move {
            let read = dma.read_at(from, n).await?;
            Ok(Bytes::copy_from_slice(&read))
        });
        self.next.replace(Some((from, task)));
    }

    /// The direct descriptor, opened now if it is not yet (by the first direct write); `None`
    /// where `O_DIRECT` is refused or the open failed (the write then goes through the page
    /// cache).
    async fn dma(&self) -> Option<Rc<DmaFile>> {
        if let Some(dma) = self.dma.borrow().clone() {
            return Some(dma);
        }
        let shared = self.fs.shared;
        if !shared.direct_io.load(Ordering::Relaxed) {
            return None;
        }
        // Reads through the page cache may so far have taken the pages the first direct write
        // covers; it must not start while one of them is being read (and once the descriptor
        // is open, reads near the end go through it). The lock is only closed on drop.
        let _no_reads = self.page_cache_reads.write().await.ok()?;
        let path = self.file.path().map(|p| p.to_path_buf())?;
        match OpenOptions::new().read(true).write(true).dma_open(&path).await {
            Ok(dma) if dma.alignment() <= crate::fs::DIRECT_WRITE_ALIGN => {
                let dma = Rc::new(dma);
                self.dma.replace(Some(Rc::clone(&dma)));
                Some(dma)
            }
            Ok(dma) => {
                if SharedFs::clear(&shared.direct_io) {
                    tracing::info!(path = %path.display(), alignment = dma.alignment(), "the disk's direct I/O alignment is too large; segments are written through the page cache");
                }
                // Only a probe: a failed close changes nothing here.
                let _ = dma.close().await;
                None
            }
            Err(e) if e.raw_os_error() == Some(Errno::INVAL.raw_os_error()) => {
                if SharedFs::clear(&shared.direct_io) {
                    tracing::info!(path = %path.display(), "O_DIRECT unsupported here; segments are written through the page cache");
                }
                None
            }
            // Out of descriptors, say: this write goes through the page cache, and a later
            // one tries again. Failing it would take the shard's storage offline.
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "could not open a segment for direct writes; writing through the page cache");
                None
            }
        }
    }

    /// See [`DirectSide::stable_end`]: the file's size, the first time no write is in flight,
    /// until a write of this handle moves it; 0 (read nothing ahead) while it is not known.
    async fn stable_end(&self) -> io::Result<u64> {
        if let Some(end) = self.stable_end.get() {
            return Ok(end);
        }
        if self.writing.get() {
            return Ok(0);
        }
        let size = self.file.file_size().await?;
        if self.writing.get() {
            return Ok(0);
        }
        self.stable_end.set(Some(size));
        Ok(size)
    }

    /// `len` bytes at `pos` near the written end, through the page cache, so that the next
    /// reader finds them there as it would far behind; `None` while a write of the file is in
    /// flight (read them directly then). A direct write that starts while such a read runs
    /// goes through the page cache instead (see `split_write`), so none of these reads ever
    /// holds a page a direct write covers. The read runs to its end even if its caller stops
    /// waiting: until it ends, the kernel may hold the pages it reads.
    async fn near_read(&self, pos: u64, len: usize) -> io::Result<Option<Bytes>> {
        if self.writing.get() {
            return Ok(None);
        }
        let counted = NearRead::new(&self.near_reads);
        let (file, lock, shared) = (
            Rc::clone(&self.file),
            Rc::clone(&self.page_cache_reads),
            self.fs.shared,
        );
        // The kernel's read-ahead stops at the file's size, which lies past the data while
        // space is reserved: a read within its window of the data's end would fill the page
        // cache with the reserved blocks' zeros (up to the disk's read-ahead window, 8 MiB
        // here, per partition), and evict what readers need (BENCHMARKS.md#reserved-space). Such
        // reads switch the kernel's read-ahead off while they run; reads near the end read
        // ahead themselves (`DirectSide::read`). The window is a quarter of the guard (see
        // [`page_cache_guard_bytes`]), or less.
        let window = self.fs.config.page_cache_guard_bytes / 4;
        let reaches_zeros = match self.stable_end.get() {
            Some(end) => pos + len as u64 + window > end,
            None => true,
        };
        let reserved = self.reserved.get().is_some() && reaches_zeros;
        let read = glommio::spawn_local(async move {
            let counted = counted;
            let _reading = lock.read().await.map_err(lock_error)?;
            if reserved {
                // Only a hint: a failure costs the read-ahead, as before.
                let _ = rustix::fs::fadvise(borrow_fd(&file), 0, None, rustix::fs::Advice::Random);
            }
            let out = buffered_read(&file, pos, len, shared).await;
            if reserved && counted.0.get() == 1 {
                let _ = rustix::fs::fadvise(borrow_fd(&file), 0, None, rustix::fs::Advice::Normal);
            }
            out
        })
        .detach();
        match read.await {
            Some(read) => read.map(Some),
            None => Err(io::Error::other("a segment read was cancelled")),
        }
    }

    /// Whether `len` bytes at `pos` lie far enough behind the file's written end to be read
    /// through the page cache: they end at least [`GlommioFsConfig::page_cache_guard_bytes`]
    /// before the page the next write starts in (see the module docs). Call with
    /// `page_cache_reads` held, so that no truncation moves that page meanwhile.
    async fn behind_writes(&self, pos: u64, len: usize) -> io::Result<bool> {
        let end = self.stable_end().await?;
        let next_write_page = end - end % crate::fs::DIRECT_WRITE_ALIGN;
        let guard = self.fs.config.page_cache_guard_bytes;
        Ok(pos.saturating_add(len as u64) <= next_write_page.saturating_sub(guard))
    }

    fn set_ahead(&self, at: u64, bytes: Bytes) {
        self.drop_ahead();
        let ahead = &self.fs.ahead_bytes;
        ahead.set(ahead.get() + bytes.len());
        self.ahead.replace(Some((at, bytes)));
    }

    fn drop_ahead(&self) {
        if let Some((_, old)) = self.ahead.borrow_mut().take() {
            let ahead = &self.fs.ahead_bytes;
            ahead.set(ahead.get().saturating_sub(old.len()));
        }
    }

    /// Forgets everything read ahead, and cancels the read in the background.
    fn forget_reads(&self) {
        self.forgotten.set(self.forgotten.get() + 1);
        self.drop_ahead();
        self.next.replace(None);
    }

    /// Makes the file at least `padded_end` long before a direct write ending there, with room
    /// ahead for the writes to come: blocks allocated (`fallocate`, unwritten: they read as
    /// zeros) and the size set. A direct write that neither extends the file nor allocates
    /// blocks is one ext4 takes without blocking, so io_uring issues it from the shard's own
    /// thread instead of handing it to a worker thread, and its `fdatasync` has no file size
    /// to write (BENCHMARKS.md#reserved-space). A sealed file reserves nothing more; where the file
    /// system cannot, writes extend the file as before.
    async fn reserve(&self, padded_end: u64, len: usize) {
        let reserve_space = &self.fs.shared.reserve_space;
        if self.sealed.get() || !reserve_space.load(Ordering::Relaxed) {
            return;
        }
        if self.reserved.get().is_some_and(|r| r >= padded_end) {
            return;
        }
        let ahead = (4 * len as u64).clamp(RESERVE_MIN_BYTES, RESERVE_MAX_BYTES);
        let target = (padded_end + ahead).next_multiple_of(RESERVE_MIN_BYTES);
        let before = self.reserved.get().or(self.stable_end.get()).unwrap_or(0);
        match self.file.pre_allocate(target, false).await {
            Ok(()) => {
                self.reserved.set(Some(target));
                add(&self.fs.counters.reserved_bytes, target.saturating_sub(before));
            }
            Err(e) => {
                // The size may have moved part of the way: trimmed like a reservation.
                self.reserved.set(Some(self.reserved.get().unwrap_or(0)));
                if matches!(e.raw_os_error(), Some(code) if code == Errno::OPNOTSUPP.raw_os_error())
                    && SharedFs::clear(reserve_space)
                {
                    tracing::info!(path = ?self.file.path(), "fallocate unsupported here; direct segment writes extend their files");
                } else {
                    tracing::debug!(path = ?self.file.path(), error = %e, "could not reserve segment space");
                }
            }
        }
    }

    /// Keeps a write at `pos` among the shard's recent writes (see [`RecentWrites::push`]).
    fn push_recent(&self, pos: u64, data: Bytes, held: usize) {
        let budget = self.fs.config.recent_writes_bytes;
        self.fs.recent.push(&self.recent, pos, data, held, budget);
    }

    /// Cuts the file back to its data once it is sealed and no write is in flight: a sealed
    /// segment must end where its data ends, since recovery trusts the size of every segment
    /// behind the recovery point. Synchronous (`ftruncate` on the shard's thread, once per
    /// sealed segment), so that no write can start in between. Returns whether the size
    /// changed (the file then needs a sync for the cut to last).
    fn trim(&self) -> io::Result<bool> {
        if !self.sealed.get() || self.writing.get() || self.reserved.get().is_none() {
            return Ok(false);
        }
        let Some(end) = self.stable_end.get() else {
            return Ok(false);
        };
        rustix::fs::ftruncate(borrow_fd(&self.file), end)?;
        self.reserved.set(None);
        Ok(true)
    }
}

/// At most this many writes are kept (of every file together), whatever their size.
const RECENT_MAX_WRITES: usize = 1 << 16;

/// A direct-written segment's most recent writes: (sequence number, position, bytes, memory
/// held), contiguous and in order. The page cache does not hold what the direct writes wrote, so
/// without these a consumer following the log's end would read every record back from the
/// disk. The shard keeps them within one budget, oldest write evicted first whichever file it
/// belongs to (see [`RecentWrites`]).
#[derive(Debug, Default)]
struct Recent {
    chunks: VecDeque<(u64, u64, Bytes, usize)>,
    /// Memory the chunks hold: their buffers' sizes, which the budget bounds (see [`kept`]).
    bytes: usize,
}

/// What a write's bytes keep in memory once kept as a recent write: `data` was staged in a
/// buffer of `held` bytes, and a slice keeps all of it alive. A buffer more than twice the size
/// of its data (a few KiB staged with room for a busy log's chunk) is dropped for an exact
/// copy, so that the budget counts memory and holds as many writes as it can.
fn kept(data: Bytes, held: usize) -> (Bytes, usize) {
    if held > 2 * data.len() {
        let len = data.len();
        (Bytes::copy_from_slice(&data), len)
    } else {
        let held = held.max(data.len());
        (data, held)
    }
}

/// The recent writes of all of a shard's direct-written segments ([`Recent`] each), within
/// one budget.
#[derive(Debug, Default)]
struct RecentWrites {
    /// Every kept write, oldest first: its file and sequence number (an entry whose write is
    /// gone already is skipped).
    order: RefCell<VecDeque<(Weak<RefCell<Recent>>, u64)>>,
    /// Numbers the writes, for `order`.
    seq: Cell<u64>,
    /// Memory the writes of all the files hold.
    bytes: Cell<usize>,
}

impl RecentWrites {
    /// Adds a write at `pos` to `file`; a write that does not continue the last one starts
    /// afresh. Then evicts the shard's oldest writes while they hold more than `budget` bytes.
    fn push(&self, file: &Rc<RefCell<Recent>>, pos: u64, data: Bytes, held: usize, budget: usize) {
        let (data, held) = kept(data, held);
        let seq = self.seq.get() + 1;
        self.seq.set(seq);
        {
            let mut me = file.borrow_mut();
            if me.end() != Some(pos) {
                me.clear(self);
            }
            me.bytes += held;
            self.bytes.set(self.bytes.get() + held);
            me.chunks.push_back((seq, pos, data, held));
        }
        let mut order = self.order.borrow_mut();
        order.push_back((Rc::downgrade(file), seq));
        while self.bytes.get() > budget || order.len() > RECENT_MAX_WRITES {
            let Some((file, seq)) = order.pop_front() else {
                break;
            };
            if let Some(file) = file.upgrade() {
                let mut file = file.borrow_mut();
                if file.chunks.front().is_some_and(|(s, _, _, _)| *s == seq) {
                    if let Some((_, _, _, held)) = file.chunks.pop_front() {
                        file.bytes -= held;
                        self.bytes.set(self.bytes.get().saturating_sub(held));
                    }
                }
            }
        }
    }
}

impl Recent {
    fn end(&self) -> Option<u64> {
        self.chunks.back().map(|(_, pos, b, _)| pos + b.len() as u64)
    }

    /// Forgets every write; `shard` holds the shard's count.
    fn clear(&mut self, shard: &RecentWrites) {
        shard.bytes.set(shard.bytes.get().saturating_sub(self.bytes));
        self.chunks.clear();
        self.bytes = 0;
    }

    /// Forgets everything at or after `len` (a truncation).
    fn truncate(&mut self, len: u64, shard: &RecentWrites) {
        if self.end().is_some_and(|end| end > len) {
            self.clear(shard);
        }
    }

    /// Whether all `len` bytes at `pos` are here.
    fn holds(&self, pos: u64, len: usize) -> bool {
        let (Some((_, first, _, _)), Some(end)) = (self.chunks.front(), self.end()) else {
            return false;
        };
        pos >= *first && pos.saturating_add(len as u64) <= end
    }

    /// `len` bytes at `pos` if they are all here: a slice of one write, or a copy of several.
    fn read(&self, pos: u64, len: usize) -> Option<Bytes> {
        if !self.holds(pos, len) {
            return None;
        }
        let i = self
            .chunks
            .partition_point(|(_, p, b, _)| p + b.len() as u64 <= pos);
        let (_, p, b, _) = self.chunks.get(i)?;
        let off = (pos - p) as usize;
        if off + len <= b.len() {
            return Some(b.slice(off..off + len));
        }
        let mut out = Vec::with_capacity(len);
        for (_, p, b, _) in self.chunks.range(i..) {
            let from = pos.saturating_sub(*p) as usize;
            let want = len - out.len();
            let take = b.len().saturating_sub(from).min(want);
            out.extend_from_slice(b.get(from..from + take)?);
            if out.len() == len {
                break;
            }
        }
        (out.len() == len).then(|| Bytes::from(out))
    }
}

impl Drop for DirectSide {
    fn drop(&mut self) {
        self.recent.borrow_mut().clear(&self.fs.recent);
        self.forget_reads();
    }
}

/// How far a buffered file has been written, and up to where its pages were dropped from the
/// page cache (see the module docs on drop-behind).
#[derive(Debug, Default, Clone, Copy)]
struct Written {
    end: u64,
    dropped_to: u64,
}

/// Pages are dropped in steps of at least this many bytes, so that a log flushing small rounds
/// makes one `fadvise` call per few MiB rather than one per round.
const DROP_STEP_BYTES: u64 = 4 << 20;

/// The guard when the read-ahead of the disk is not known.
const PAGE_CACHE_GUARD_UNKNOWN_BYTES: u64 = 256 << 20;
/// The smallest guard.
const PAGE_CACHE_GUARD_MIN_BYTES: u64 = 32 << 20;

/// The distance behind a direct-written segment's end from which its reads go through the
/// page cache (see the module docs), for logs in `dir`: four times the largest window the
/// kernel reads ahead on that disk (its `read_ahead_kb`, or its `max_sectors_kb`, which a
/// large read may use instead), and at least 32 MiB. If `dir`'s disk is not found in
/// `/sys` (a device-mapper or overlay file system, say), the largest window of any block
/// device counts; failing that, 256 MiB. Read once at start-up: raising a disk's read-ahead
/// later beyond a quarter of the guard needs a restart.
pub fn page_cache_guard_bytes(dir: &Path) -> u64 {
    let window_kib = |queue: PathBuf| {
        let read = |name: &str| {
            std::fs::read_to_string(queue.join(name))
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
        };
        read("read_ahead_kb").map(|ra| ra.max(read("max_sectors_kb").unwrap_or(0)))
    };
    let own = std::fs::metadata(dir).ok().and_then(|m| {
        use std::os::unix::fs::MetadataExt;
        let dev = m.dev();
        let base = PathBuf::from(format!(
            "/sys/dev/block/{}:{}",
            rustix::fs::major(dev),
            rustix::fs::minor(dev)
        ));
        // A partition's queue is its disk's, one level up.
        window_kib(base.join("queue")).or_else(|| window_kib(base.join("../queue")))
    });
    let any = || {
        std::fs::read_dir("/sys/block")
            .ok()?
            .filter_map(|e| window_kib(e.ok()?.path().join("queue")))
            .max()
    };
    match own.or_else(any) {
        Some(kib) => PAGE_CACHE_GUARD_MIN_BYTES.max(kib.saturating_mul(4 << 10)),
        None => PAGE_CACHE_GUARD_UNKNOWN_BYTES,
    }
}

fn lock_error<E: std::fmt::Display>(e: E) -> io::Error {
    io::Error::other(format!("segment read lock: {e}"))
}

/// The file's descriptor, for a system call glommio has no operation for.
fn borrow_fd(file: &BufferedFile) -> BorrowedFd<'_> {
    // SAFETY: the descriptor is owned by `file`, which stays borrowed for as long as the
    // returned `BorrowedFd` lives, so it cannot be closed meanwhile.
    #[allow(unsafe_code)]
    unsafe {
        BorrowedFd::borrow_raw(file.as_raw_fd())
    }
}

impl GlommioFile {
    /// A segment write, its whole pages direct (see `split_write`).
    async fn side_write(&self, side: &DirectSide, buf: StageBuf, pos: u64) -> io::Result<()> {
        let len = buf.len();
        side.writing.set(true);
        let out = split_write(side, buf, pos).await;
        side.writing.set(false);
        if out.is_err() {
            side.tail.replace(None);
        } else {
            self.wrote(pos, len);
            // The handle is the file's only writer, and writes append.
            side.stable_end.set(Some(pos + len as u64));
            // The last write of a sealed segment: its own round syncs the cut with the data
            // (a failure here is met again, and reported, by that sync).
            if let Err(e) = side.trim() {
                tracing::warn!(path = ?side.file.path(), error = %e, "could not trim a sealed segment");
            }
        }
        out
    }

    fn wrote(&self, pos: u64, len: usize) {
        let mut w = self.written.get();
        w.end = w.end.max(pos + len as u64);
        self.written.set(w);
    }

    /// Drops the pages more than [`GlommioFsConfig::drop_behind_bytes`] behind `synced_end`,
    /// once a step's worth has gathered. Called after a successful `fdatasync` with the written
    /// end as it was when the `fdatasync` began: everything before it is clean and goes, while a
    /// write that completed during the `fdatasync` (the next round, overlapping) may still be
    /// dirty, and the kernel would skip its pages for good.
    fn drop_behind(&self, file: &BufferedFile, synced_end: u64) {
        let keep = self.fs.config.drop_behind_bytes;
        let mut w = self.written.get();
        let to = synced_end.min(w.end).saturating_sub(keep);
        if keep == 0 || to < w.dropped_to + DROP_STEP_BYTES {
            return;
        }
        let Some(len) = NonZeroU64::new(to - w.dropped_to) else {
            return;
        };
        // Only a hint: a failure leaves the pages cached, as without the setting.
        match rustix::fs::fadvise(
            borrow_fd(file),
            w.dropped_to,
            Some(len),
            rustix::fs::Advice::DontNeed,
        ) {
            Ok(()) => add(&self.fs.counters.dropped_behind_bytes, len.get()),
            Err(e) => tracing::debug!(error = %e, "fadvise(DONTNEED) failed"),
        }
        w.dropped_to = to;
        self.written.set(w);
    }
}

#[derive(Debug)]
enum Inner {
    Buffered(Rc<BufferedFile>),
    Direct(DmaFile),
}

fn short_write(n: usize, len: usize, pos: u64) -> io::Error {
    // Regular-file writes come back short only when the disk or a file-size limit runs out
    // mid-write; glommio has taken the buffer, so report it as the error it is.
    io::Error::new(
        io::ErrorKind::StorageFull,
        format!("short write: {n} of {len} bytes at position {pos}"),
    )
}

fn unaligned(len: usize, pos: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("unaligned direct write: {len} bytes at position {pos}"),
    )
}

impl FileHandle for GlommioFile {
    async fn write_all_at(&self, buf: Vec<u8>, pos: u64) -> io::Result<()> {
        let len = buf.len();
        let n = match &self.file {
            Inner::Buffered(f) => {
                if let Some(side) = &self.side {
                    return self.side_write(side, StageBuf::from(buf), pos).await;
                }
                let n = f.write_at(buf, pos).await?;
                self.wrote(pos, n);
                n
            }
            Inner::Direct(f) => return direct_write(f, vec![buf], pos).await.map(drop),
        };
        if n < len {
            return Err(short_write(n, len, pos));
        }
        Ok(())
    }

    async fn write_staged(&self, buf: StageBuf, pos: u64) -> io::Result<()> {
        match (&self.file, &self.side) {
            (Inner::Buffered(_), Some(side)) => self.side_write(side, buf, pos).await,
            _ => self.write_all_at(buf.into_vec(), pos).await,
        }
    }

    /// On a direct file, one write (see `direct_write`).
    async fn write_pieces_at(&self, pieces: Vec<Vec<u8>>, pos: u64) -> io::Result<u64> {
        match &self.file {
            Inner::Buffered(_) => crate::fs::write_each(self, pieces, pos).await,
            Inner::Direct(f) => direct_write(f, pieces, pos).await,
        }
    }

    async fn read_at(&self, pos: u64, len: usize) -> io::Result<Bytes> {
        match &self.file {
            Inner::Buffered(f) => {
                if let Some(side) = &self.side {
                    if let Some(hit) = side.recent.borrow().read(pos, len) {
                        add(&self.fs.counters.recent_hit_bytes, hit.len() as u64);
                        return Ok(hit);
                    }
                    // Far behind the end, through the page cache, which keeps what was read
                    // for the next reader (see the module docs).
                    {
                        let _reading = side.page_cache_reads.read().await.map_err(lock_error)?;
                        if side.behind_writes(pos, len).await? {
                            let read = buffered_read(f, pos, len, self.fs.shared).await?;
                            add(&self.fs.counters.recent_miss_bytes, read.len() as u64);
                            return Ok(read);
                        }
                    }
                    // Near the end (see `DirectSide::read`): through the page cache too while no
                    // write of the file is in flight, directly otherwise: the page cache must
                    // not hold a page a direct write is about to cover while someone reads it.
                    // The kernel writes a dirty last page back before a direct read.
                    let read = side.read(pos, len).await?;
                    add(&self.fs.counters.recent_miss_bytes, read.len() as u64);
                    return Ok(read);
                }
                buffered_read(f, pos, len, self.fs.shared).await
            }
            Inner::Direct(f) => {
                // Direct files are written, not read, on the shards (the journal is read at
                // start-up, before them); a buffered handle serves the odd read.
                let path = f
                    .path()
                    .map(|p| p.to_path_buf())
                    .ok_or_else(|| io::Error::other("direct file without a path"))?;
                let b = OpenOptions::new().read(true).buffered_open(&path).await?;
                let out = buffered_read(&b, pos, len, self.fs.shared).await;
                b.close().await?;
                out
            }
        }
    }

    async fn fdatasync(&self) -> io::Result<()> {
        match &self.file {
            Inner::Buffered(f) => {
                if let Some(side) = &self.side {
                    // A sealed segment is synced only as long as its data: recovery trusts its
                    // size once the recovery point is past it.
                    side.trim()?;
                }
                let synced_end = self.written.get().end;
                f.fdatasync().await?;
                self.drop_behind(f, synced_end);
                Ok(())
            }
            Inner::Direct(f) => Ok(f.fdatasync().await?),
        }
    }

    async fn truncate(&self, len: u64) -> io::Result<()> {
        match &self.file {
            Inner::Buffered(f) => {
                // Reads through the page cache finish first: after the cut, direct writes cover
                // pages they could be reading (the lock is only closed on drop).
                let _no_reads = match &self.side {
                    Some(side) => Some(side.page_cache_reads.write().await.map_err(lock_error)?),
                    None => None,
                };
                if let Some(side) = &self.side {
                    side.tail.replace(None);
                    side.recent.borrow_mut().truncate(len, &self.fs.recent);
                    side.forget_reads();
                    side.stable_end.set(Some(len));
                    side.reserved.set(None);
                }
                f.truncate(len).await?;
                let mut w = self.written.get();
                w.end = w.end.min(len);
                w.dropped_to = w.dropped_to.min(len);
                self.written.set(w);
                Ok(())
            }
            Inner::Direct(f) => Ok(f.truncate(len).await?),
        }
    }

    /// Far behind a direct-written segment's end (see `DirectSide::behind_writes`), where
    /// reads go through the page cache and no direct write ever comes, or anywhere in a segment
    /// written through the page cache; not what the shard's memory of recent writes holds
    /// (copying that beats reading the file), nor near the end of a direct-written segment.
    async fn sendable(&self, pos: u64, len: usize) -> io::Result<Option<OwnedFd>> {
        let Inner::Buffered(f) = &self.file else {
            return Ok(None);
        };
        if let Some(side) = &self.side {
            if side.recent.borrow().holds(pos, len) {
                return Ok(None);
            }
            let _reading = side.page_cache_reads.read().await.map_err(lock_error)?;
            if !side.behind_writes(pos, len).await? {
                return Ok(None);
            }
        }
        // Out of descriptors, say: the bytes are read instead.
        Ok(rustix::io::fcntl_dupfd_cloexec(borrow_fd(f), 0).ok())
    }

    fn file_regions(&self) -> Option<&'static FileRegions> {
        Some(self.fs.shared.regions)
    }

    /// Stops reserving space, and gives back what is reserved once no write is in flight (at
    /// once, or when the last write completes; the file's next `fdatasync` makes sure).
    fn seal(&self) -> bool {
        let Some(side) = &self.side else {
            return false;
        };
        side.sealed.set(true);
        // A write in flight may pad the file; it is cut when the write completes.
        let cut = side.reserved.get().is_some() || side.writing.get();
        match side.trim() {
            Ok(_) => cut,
            Err(e) => {
                tracing::warn!(path = ?side.file.path(), error = %e, "could not trim a sealed segment");
                true
            }
        }
    }

    fn unseal(&self) {
        if let Some(side) = &self.side {
            side.sealed.set(false);
        }
    }

    async fn size(&self) -> io::Result<u64> {
        match &self.file {
            Inner::Buffered(f) => Ok(f.file_size().await?),
            Inner::Direct(f) => Ok(f.file_size().await?),
        }
    }
}

/// Writes `pieces` back to back from `pos` as one direct write: they are copied into one
/// aligned buffer (glommio's registered buffers, or an aligned heap block) instead of into the
/// page cache, and one write lets the disk take them at once rather than one after another.
async fn direct_write<P: AsRef<[u8]>>(f: &DmaFile, pieces: Vec<P>, pos: u64) -> io::Result<u64> {
    let len: usize = pieces.iter().map(|p| p.as_ref().len()).sum();
    if !direct_aligned(len, pos) {
        return Err(unaligned(len, pos));
    }
    let mut dma = f.alloc_dma_buffer(len);
    let mut at = 0;
    for piece in pieces {
        let piece = piece.as_ref();
        if let Some(dst) = dma.as_bytes_mut().get_mut(at..at + piece.len()) {
            dst.copy_from_slice(piece);
        }
        at += piece.len();
    }
    let n = f.write_at(dma, pos).await?;
    if n < len {
        return Err(short_write(n, len, pos));
    }
    Ok(len as u64)
}

/// Zeros padding a direct write's last partial page.
static ZERO_PAGE: [u8; crate::fs::DIRECT_WRITE_ALIGN as usize] = [0; crate::fs::DIRECT_WRITE_ALIGN as usize];

/// Writes `pages` (aligned memory the caller staged) at `first`. When the first page is one the
/// file already holds (`rewrites_first`), it goes as a write of its own: the rest lies in
/// reserved, not yet written blocks, and ext4 takes a direct write without blocking only within
/// one kind of block, so one write across both would be handed to an io_uring worker.
async fn write_pages(dma: &DmaFile, pages: Bytes, first: u64, rewrites_first: bool) -> io::Result<()> {
    const PAGE: usize = crate::fs::DIRECT_WRITE_ALIGN as usize;
    let len = pages.len();
    let n = if rewrites_first && len > PAGE {
        let (a, b) = futures::join!(
            dma.write_foreign_at(pages.slice(..PAGE), first),
            dma.write_foreign_at(pages.slice(PAGE..), first + PAGE as u64)
        );
        let (a, b) = (a?, b?);
        if a < PAGE {
            return Err(short_write(a, PAGE, first));
        }
        a + b
    } else {
        dma.write_foreign_at(pages, first).await?
    };
    if n < len {
        return Err(short_write(n, len, first));
    }
    Ok(())
}

/// A segment write with `O_DIRECT`: the pages from the one holding `pos` to the one holding the
/// end, the first completed with the bytes before `pos` that the file already holds (rewritten
/// unchanged, as the page cache's writeback would) and the last padded with zeros (the next
/// write rewrites them), go out directly, into space the file reserved ahead
/// (`DirectSide::reserve`), the first page as a write of its own when the file holds it
/// ([`write_pages`]). Small writes, and writes beside a read near the end, go through the page
/// cache instead. The kernel writes back and drops any cached pages a direct write covers. Data staged
/// in the direct layout ([`StageBuf::direct`]) is written from where it was staged, the known
/// bytes copied into the room in front of it; otherwise it is copied into an aligned buffer.
async fn split_write(side: &DirectSide, buf: StageBuf, pos: u64) -> io::Result<()> {
    let f = &*side.file;
    const PAGE: u64 = crate::fs::DIRECT_WRITE_ALIGN;
    let len = buf.len();
    let end = pos + len as u64;
    let first = pos - pos % PAGE;
    let last = end - end % PAGE;
    let dma = if last <= first || len < DIRECT_MIN_BYTES {
        None
    } else if side.near_reads.get() > 0 {
        // A read near the end is taking pages through the page cache; this write cannot drop
        // them from under it, so it goes there too (see `DirectSide::near_read`).
        add(&side.fs.counters.writes_beside_near_reads, 1);
        None
    } else {
        side.dma().await
    };
    let Some(dma) = dma else {
        // Within one page, or small: through the page cache, the page's known bytes extended.
        // (A small write direct would cost a device write, and rewrite its partial page, for
        // little; the many partitions of a journaled round write such pieces.)
        let held = buf.capacity();
        let data = buf.into_bytes();
        let known = side.tail.borrow_mut().take();
        let tail = match known {
            // The write ends in a later page than it starts, or starts a page: the new last
            // page's bytes are all the write's.
            _ if last > first || pos == first => {
                data.get((last - pos) as usize..).map(|b| (last, b.to_vec()))
            }
            Some((start, mut bytes)) if start == first && start + bytes.len() as u64 == pos => {
                bytes.extend_from_slice(&data);
                Some((start, bytes))
            }
            _ => None,
        };
        let n = f.write_at(data.to_vec(), pos).await?;
        if n < len {
            return Err(short_write(n, len, pos));
        }
        side.tail.replace(tail);
        side.push_recent(pos, data, held);
        return Ok(());
    };
    // The last partial page goes out too, padded with zeros (the next write rewrites it with
    // its own bytes), into space reserved ahead: the write then neither extends the file nor
    // allocates blocks (see `DirectSide::reserve`).
    let padded_end = end.next_multiple_of(PAGE);
    side.reserve(padded_end, len).await;
    let prefix_len = (pos - first) as usize;
    let known = side
        .tail
        .borrow()
        .as_ref()
        .filter(|(start, bytes)| *start == first && bytes.len() >= prefix_len)
        .map(|(_, bytes)| bytes[..prefix_len].to_vec());
    let prefix = match known {
        Some(p) => p,
        None if prefix_len == 0 => Vec::new(),
        None => {
            let p = buffered_read(f, first, prefix_len, side.fs.shared).await?;
            if p.len() != prefix_len {
                return Err(io::Error::other(format!(
                    "segment shorter than its written end: {} of {prefix_len} bytes at {first}",
                    p.len()
                )));
            }
            p.to_vec()
        }
    };
    // The whole pages: from `first` to `last`; `head` of them are the write's own bytes.
    let pages = (last - first) as usize;
    let padded = (padded_end - first) as usize;
    let head = pages - prefix_len;
    let held = buf.capacity();
    let mut tail_written = false;
    let data = match buf.into_direct() {
        Ok((mut vec, at, lead)) if lead == prefix_len => {
            let room = vec
                .get_mut(at..at + lead)
                .ok_or_else(|| io::Error::other("staged write without its room"))?;
            room.copy_from_slice(&prefix);
            let data_end = vec.len() - at;
            // A buffer staged within its capacity has room for the zeros (`StageBuf::direct`).
            let out = if padded > pages && vec.capacity() >= at + padded {
                vec.resize(at + padded, 0);
                tail_written = true;
                padded
            } else {
                pages
            };
            let whole = Bytes::from(vec).slice(at..);
            write_pages(&dma, whole.slice(..out), first, lead > 0).await?;
            let own = if tail_written { len } else { head };
            add(&side.fs.counters.direct_uncopied_bytes, own as u64);
            whole.slice(lead..data_end)
        }
        staged => {
            let data = match staged {
                Ok((vec, at, lead)) => Bytes::from(vec).slice(at + lead..),
                Err(plain) => Bytes::from(plain.into_vec()),
            };
            let zeros = padded - prefix_len - data.len();
            direct_write(
                &dma,
                vec![prefix.as_slice(), &data[..], &ZERO_PAGE[..zeros]],
                first,
            )
            .await?;
            tail_written = true;
            add(&side.fs.counters.direct_copied_bytes, len as u64);
            data
        }
    };
    let rest = data.slice(head..);
    if tail_written {
        if padded_end > end {
            let size = side.reserved.get().map_or(padded_end, |r| r.max(padded_end));
            side.reserved.set(Some(size));
        }
    } else if !rest.is_empty() {
        let n = f.write_at(rest.to_vec(), last).await?;
        if n < rest.len() {
            return Err(short_write(n, rest.len(), last));
        }
    }
    side.tail.replace(Some((last, rest.to_vec())));
    side.push_recent(pos, data, held);
    Ok(())
}

/// What the page cache holds is read straight into the returned buffer; the rest (cold data)
/// through io_uring, whose own buffer is then copied.
async fn buffered_read(file: &BufferedFile, pos: u64, len: usize, shared: &SharedFs) -> io::Result<Bytes> {
    let mut out = vec![0u8; len];
    let mut filled = cached_read(file, &mut out, pos, shared);
    while filled < len {
        let r = file.read_at(pos + filled as u64, len - filled).await?;
        if r.is_empty() {
            break;
        }
        let Some(dst) = out.get_mut(filled..filled + r.len()) else {
            return Err(io::Error::other("read returned more than asked"));
        };
        dst.copy_from_slice(&r);
        filled += r.len();
    }
    out.truncate(filled);
    Ok(Bytes::from(out))
}

/// Reads into `buf` from `pos` what the page cache holds, without ever waiting for the disk
/// (`preadv2` with `RWF_NOWAIT`), and returns how many bytes it read: all of `buf` for the tail
/// a consumer follows, less (or none) for data that must come from the disk. Such a read of an
/// uncached page does start readahead, so a later read (or this one, on a fast disk) may find
/// it cached: how much of cold data it returns is not fixed. glommio's own reads land in a
/// buffer it allocates, which would then be copied once more.
fn cached_read(file: &BufferedFile, buf: &mut [u8], pos: u64, shared: &SharedFs) -> usize {
    if !shared.nowait_reads.load(Ordering::Relaxed) {
        return 0;
    }
    let fd = borrow_fd(file);
    let mut filled = 0;
    while let Some(rest) = buf.get_mut(filled..).filter(|r| !r.is_empty()) {
        match rustix::io::preadv2(
            fd,
            &mut [IoSliceMut::new(rest)],
            pos + filled as u64,
            ReadWriteFlags::NOWAIT,
        ) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e @ (Errno::OPNOTSUPP | Errno::NOSYS | Errno::INVAL)) => {
                if SharedFs::clear(&shared.nowait_reads) {
                    tracing::info!(error = %e, "RWF_NOWAIT reads unsupported here; every read goes through io_uring");
                }
                break;
            }
            // EAGAIN: not cached (the rest goes through io_uring); anything else is reported
            // by that read too.
            Err(_) => break,
        }
    }
    filled
}

impl Fs for GlommioFs {
    type File = GlommioFile;

    async fn open(&self, path: &Path, create: bool) -> io::Result<GlommioFile> {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(create)
            .buffered_open(path)
            .await?;
        Ok(self.file(Inner::Buffered(Rc::new(f))))
    }

    /// `O_DIRECT` where the file system supports it (glommio writes tmpfs files without it); a
    /// buffered file where the file system refuses it or its disk needs a larger alignment.
    async fn open_direct(&self, path: &Path, create: bool) -> io::Result<GlommioFile> {
        let direct_io = &self.0.shared.direct_io;
        if direct_io.load(Ordering::Relaxed) {
            let opened = OpenOptions::new()
                .read(true)
                .write(true)
                .create(create)
                .dma_open(path)
                .await;
            match opened {
                Ok(f) if f.alignment() <= crate::fs::DIRECT_WRITE_ALIGN => {
                    return Ok(self.file(Inner::Direct(f)));
                }
                Ok(f) => {
                    if SharedFs::clear(direct_io) {
                        tracing::info!(path = %path.display(), alignment = f.alignment(), "the disk's direct I/O alignment is too large; the journal is written through the page cache");
                    }
                    f.close().await?;
                }
                Err(e) if e.raw_os_error() == Some(Errno::INVAL.raw_os_error()) => {
                    if SharedFs::clear(direct_io) {
                        tracing::info!(path = %path.display(), "O_DIRECT unsupported here; the journal is written through the page cache");
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
        self.open(path, create).await
    }

    /// With [`GlommioFsConfig::direct_segment_writes`], a second `O_DIRECT` descriptor writes
    /// the segment's whole pages (where the file system supports it).
    async fn open_segment(&self, path: &Path, create: bool) -> io::Result<GlommioFile> {
        let mut file = self.open(path, create).await?;
        if let (true, Inner::Buffered(buffered)) = (self.0.direct_segments(), &file.file) {
            file.side = Some(DirectSide {
                fs: Rc::clone(&self.0),
                file: Rc::clone(buffered),
                dma: RefCell::new(None),
                writing: Cell::new(false),
                tail: RefCell::new(None),
                recent: Rc::new(RefCell::new(Recent::default())),
                stable_end: Cell::new(None),
                ahead: RefCell::new(None),
                next: RefCell::new(None),
                forgotten: Cell::new(0),
                page_cache_reads: Rc::new(RwLock::new(())),
                near_reads: Rc::new(Cell::new(0)),
                reserved: Cell::new(None),
                sealed: Cell::new(false),
            });
        }
        Ok(file)
    }

    /// The direct layout for a write large enough to go out directly (see `split_write`).
    fn stage_buf(&self, capacity: usize, pos: u64) -> StageBuf {
        if capacity >= DIRECT_MIN_BYTES && self.0.direct_segments() {
            StageBuf::direct(capacity, pos)
        } else {
            StageBuf::plain(capacity)
        }
    }

    // Other directory operations are rare or fast (segment roll, retention, a journal file
    // recycled): blocking std calls on the executor.
    /// Creating a directory goes to the shard's blocking thread: a CreateTopics of thousands of
    /// partitions made thousands of `mkdir`s, 0.5 ms each and up to 18 ms in the disk's slow
    /// phases (cold metadata blocks), and chained on the executor they stalled it for 50–150 ms
    /// at a time (BENCHMARKS.md#new-directories). A directory that exists is found without leaving the
    /// executor (every log's open checks its directory).
    async fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        if path.is_dir() {
            return Ok(());
        }
        let path = path.to_path_buf();
        glommio::executor()
            .spawn_blocking(move || std::fs::create_dir_all(path))
            .await
    }

    async fn remove_file(&self, path: &Path) -> io::Result<()> {
        StdFs.remove_file(path).await
    }

    async fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        StdFs.remove_dir_all(path).await
    }

    async fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        StdFs.rename(from, to).await
    }

    async fn list_dir(&self, path: &Path) -> io::Result<Vec<String>> {
        StdFs.list_dir(path).await
    }

    async fn sync_dir(&self, path: &Path) -> io::Result<()> {
        let dir = glommio::io::Directory::open(path).await?;
        dir.sync().await?;
        Ok(dir.close().await?)
    }

    /// `syncfs` on the shard's blocking thread (it takes as long as the writeback), through a
    /// descriptor kept open per file system: `syncfs` reports the write-back errors of the
    /// whole file system since its descriptor was opened, so one opened afresh would miss
    /// errors of background write-back that happened before it.
    async fn sync_filesystem(&self, path: &Path) -> io::Result<()> {
        use std::os::unix::fs::MetadataExt;
        let dev = std::fs::metadata(path)?.dev();
        let held = self
            .0
            .filesystems
            .borrow()
            .iter()
            .find(|(d, _)| *d == dev)
            .map(|(_, f)| f.clone());
        let dir = match held {
            Some(dir) => dir,
            None => {
                let dir = std::sync::Arc::new(std::fs::File::open(path)?);
                self.0.filesystems.borrow_mut().push((dev, dir.clone()));
                dir
            }
        };
        let path = path.to_path_buf();
        glommio::executor()
            .spawn_blocking(move || crate::fs::sync_filesystem_of(&dir, &path))
            .await
    }

    async fn exists(&self, path: &Path) -> bool {
        StdFs.exists(path).await
    }

    /// A plain `statvfs` on the executor: it reads the superblock's counters, and runs about
    /// once a second, only while the store is offline for want of space.
    async fn space(&self, path: &Path) -> io::Result<FsSpace> {
        StdFs.space(path).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEN: usize = 3 << 20;

    fn pattern() -> Vec<u8> {
        (0..LEN).map(|i| (i % 253) as u8).collect()
    }

    /// Drops the file's clean pages from the page cache.
    fn evict(path: &Path) {
        let f = std::fs::File::open(path).unwrap();
        rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed).unwrap();
    }

    /// A shard's file system with `config`, sharing nothing with other tests'.
    fn fs_with(config: GlommioFsConfig) -> GlommioFs {
        GlommioFs::new(config, SharedFs::for_process(FileRegions::for_process(64)))
    }

    /// Segments written directly, keeping `recent_writes_bytes` of recent writes, with
    /// `guard_bytes` as the page-cache guard.
    fn direct_fs(recent_writes_bytes: usize, guard_bytes: u64) -> GlommioFs {
        fs_with(GlommioFsConfig {
            direct_segment_writes: true,
            recent_writes_bytes,
            page_cache_guard_bytes: guard_bytes,
            ..GlommioFsConfig::default()
        })
    }

    fn buffered(f: &GlommioFile) -> &BufferedFile {
        match &f.file {
            Inner::Buffered(b) => b,
            Inner::Direct(_) => panic!("a buffered file was expected"),
        }
    }

    fn run(
        test: impl FnOnce(std::path::PathBuf) -> futures::future::LocalBoxFuture<'static, ()> + Send + 'static,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("segment");
        glommio::LocalExecutorBuilder::default()
            .spawn(move || test(path))
            .unwrap()
            .join()
            .unwrap();
    }

    /// `syncfs` runs on the shard's blocking thread through one descriptor per file system,
    /// kept for later syncs; a missing path is an error, not a panic.
    #[test]
    fn the_file_system_is_synced_through_one_kept_descriptor() {
        run(|path| {
            Box::pin(async move {
                let fs = fs_with(GlommioFsConfig::default());
                let f = fs.open(&path, true).await.unwrap();
                f.write_all_at(pattern(), 0).await.unwrap();
                let dir = path.parent().unwrap().to_path_buf();
                fs.sync_filesystem(&dir).await.unwrap();
                fs.sync_filesystem(&path).await.unwrap();
                assert_eq!(
                    fs.0.filesystems.borrow().len(),
                    1,
                    "one descriptor per file system"
                );
                assert!(fs.sync_filesystem(&dir.join("missing")).await.is_err());
                assert_eq!(std::fs::read(&path).unwrap(), pattern());
            })
        });
    }

    /// Directories are created on the blocking thread, parents included; an existing one is
    /// found without it, and a file in the way is an error.
    #[test]
    fn directories_are_created_with_their_parents_and_a_file_in_the_way_is_an_error() {
        run(|path| {
            Box::pin(async move {
                let root = path.parent().unwrap().to_path_buf();
                let nested = root.join("a/b/c");
                let fs = fs_with(GlommioFsConfig::default());
                fs.create_dir_all(&nested).await.unwrap();
                assert!(nested.is_dir());
                fs.create_dir_all(&nested).await.unwrap();
                std::fs::write(&path, b"x").unwrap();
                assert!(fs.create_dir_all(&path).await.is_err());
                assert!(fs.create_dir_all(&path.join("d")).await.is_err());
            })
        });
    }

    #[test]
    fn cached_data_is_read_without_io_uring_and_cold_data_through_it() {
        run(|path| {
            Box::pin(async move {
                let f = fs_with(GlommioFsConfig::default())
                    .open(&path, true)
                    .await
                    .unwrap();
                f.write_all_at(pattern(), 0).await.unwrap();
                f.fdatasync().await.unwrap();
                let want = pattern();

                // Hot: all of it from the page cache, without waiting.
                assert_eq!(resident_pages(&path, 0, LEN), LEN / 4096);
                let mut buf = vec![0u8; 2 << 20];
                assert_eq!(
                    cached_read(buffered(&f), &mut buf, 100, f.fs.shared),
                    buf.len(),
                    "RWF_NOWAIT reads must work on this kernel and file system"
                );
                assert_eq!(buf, want[100..100 + (2 << 20)]);
                assert_eq!(
                    &f.read_at(100, 2 << 20).await.unwrap()[..],
                    &want[100..100 + (2 << 20)]
                );
                // Short at the end of the file.
                assert_eq!(
                    &f.read_at(LEN as u64 - 10, 100).await.unwrap()[..],
                    &want[LEN - 10..]
                );
                assert!(f.read_at(LEN as u64 + 5, 100).await.unwrap().is_empty());

                // Cold: the page cache has none of it, so io_uring reads what the cached read
                // leaves. How much that is cannot be asserted: an `RWF_NOWAIT` read of an
                // uncached page starts readahead and returns what has arrived by the time it
                // looks, which on a fast disk can be some or all of it.
                for at in [0, 4096 + 7] {
                    evict(&path);
                    assert_eq!(resident_pages(&path, 0, LEN), 0, "the kernel kept evicted pages");
                    assert_eq!(&f.read_at(at, LEN).await.unwrap()[..], &want[at as usize..]);
                }

                // Partly cached: at least the cached start comes from the page cache.
                const HEAD: usize = 64 << 10;
                let cache_only_the_head = || {
                    evict(&path);
                    let mut head = vec![0u8; HEAD];
                    let file = std::fs::File::open(&path).unwrap();
                    std::os::unix::fs::FileExt::read_exact_at(&file, &mut head, 0).unwrap();
                };
                cache_only_the_head();
                assert_eq!(resident_pages(&path, 0, HEAD), HEAD / 4096);
                let mut probe = vec![0u8; LEN];
                let cached = cached_read(buffered(&f), &mut probe, 0, f.fs.shared);
                assert!(cached >= HEAD, "{cached} bytes cached");
                assert_eq!(probe[..cached], want[..cached]);
                // Again (the probe's readahead may have cached more), then the whole read.
                cache_only_the_head();
                assert_eq!(&f.read_at(0, LEN).await.unwrap()[..], &want[..]);
            })
        });
    }

    /// How many of the 4 KiB pages of `path` in `len` bytes from `pos` (both page-aligned) the
    /// page cache holds. `mincore` looks without touching: probing with an `RWF_NOWAIT` read
    /// would not do, because such a read of an uncached page starts readahead, and on a fast
    /// disk the pages can arrive before the next probe (or even before that read returns).
    fn resident_pages(path: &Path, pos: u64, len: usize) -> usize {
        assert!(pos.is_multiple_of(4096) && len.is_multiple_of(4096) && len > 0);
        let f = std::fs::File::open(path).unwrap();
        let off = libc::off_t::try_from(pos).unwrap();
        // SAFETY: a fresh read-only shared mapping of `len` bytes of a file this test owns; it
        // is never dereferenced (mincore only reads the page tables' view of the page cache)
        // and is unmapped before returning. No page is faulted in by mapping it.
        #[allow(unsafe_code)]
        let resident = unsafe {
            let addr = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                off,
            );
            assert_ne!(addr, libc::MAP_FAILED, "mmap: {}", io::Error::last_os_error());
            let mut vec = vec![0u8; len / 4096];
            let rc = libc::mincore(addr, len, vec.as_mut_ptr());
            let err = io::Error::last_os_error();
            assert_eq!(libc::munmap(addr, len), 0);
            assert_eq!(rc, 0, "mincore: {err}");
            vec
        };
        resident.iter().filter(|&&b| b & 1 == 1).count()
    }

    #[test]
    fn pages_far_behind_the_written_end_are_dropped_after_fdatasync() {
        run(|path| {
            Box::pin(async move {
                const MIB: usize = 1 << 20;
                let fs = fs_with(GlommioFsConfig {
                    drop_behind_bytes: MIB as u64,
                    ..GlommioFsConfig::default()
                });
                let dropped = || fs.stats().dropped_behind_bytes;
                let want: Vec<u8> = (0..8 * MIB).map(|i| (i % 251) as u8).collect();
                let f = fs.open(&path, true).await.unwrap();
                // Less than a step behind: nothing dropped yet, even after the fsync.
                f.write_all_at(want[..4 * MIB].to_vec(), 0).await.unwrap();
                f.fdatasync().await.unwrap();
                assert_eq!(
                    resident_pages(&path, 0, 4 * MIB),
                    1024,
                    "dropped before a step gathered"
                );
                assert_eq!(dropped(), 0);
                // Written but not yet synced: still kept (dirty pages would not go anyway).
                f.write_pieces_at(
                    vec![want[4 * MIB..6 * MIB].to_vec(), want[6 * MIB..].to_vec()],
                    4 * MIB as u64,
                )
                .await
                .unwrap();
                assert_eq!(resident_pages(&path, 0, 8 * MIB), 2048);
                // Synced: all but the last MiB go (the kernel drops whole folios, so a large
                // folio that the dropped range only partly covers stays: up to 2 MiB).
                f.fdatasync().await.unwrap();
                assert_eq!(
                    resident_pages(&path, 0, 5 * MIB),
                    0,
                    "pages behind the window stayed cached"
                );
                assert_eq!(
                    resident_pages(&path, 7 * MIB as u64, MIB),
                    256,
                    "the window was dropped"
                );
                assert_eq!(dropped(), 7 * MIB as u64);
                // Dropped data is still read, from the disk.
                assert_eq!(&f.read_at(0, 8 * MIB).await.unwrap()[..], &want[..]);
                // A truncation below the dropped point and a rewrite: the window follows it.
                f.truncate(2 * MIB as u64).await.unwrap();
                f.write_all_at(want[2 * MIB..].to_vec(), 2 * MIB as u64)
                    .await
                    .unwrap();
                f.fdatasync().await.unwrap();
                assert_eq!(resident_pages(&path, 2 * MIB as u64, 3 * MIB), 0);
                assert_eq!(dropped(), 12 * MIB as u64);
                // 0 keeps everything.
                let other = path.with_extension("other");
                let g = fs_with(GlommioFsConfig::default())
                    .open(&other, true)
                    .await
                    .unwrap();
                g.write_all_at(want.clone(), 0).await.unwrap();
                g.fdatasync().await.unwrap();
                assert_eq!(resident_pages(&other, 0, 8 * MIB), 2048);
            })
        });
    }

    #[test]
    fn direct_files_take_aligned_writes_past_the_page_cache() {
        run(|path| {
            Box::pin(async move {
                let f = fs_with(GlommioFsConfig::default())
                    .open_direct(&path, true)
                    .await
                    .unwrap();
                assert!(
                    matches!(f.file, Inner::Direct(_)),
                    "the test directory's file system must support O_DIRECT"
                );
                let block = crate::fs::DIRECT_WRITE_ALIGN as usize;
                let want: Vec<u8> = (0..3 * block).map(|i| (i % 251) as u8).collect();
                f.write_all_at(want[..block].to_vec(), 0).await.unwrap();
                f.write_all_at(want[block..].to_vec(), block as u64)
                    .await
                    .unwrap();
                f.fdatasync().await.unwrap();
                assert_eq!(f.size().await.unwrap(), want.len() as u64);
                // Nothing of it went through the page cache.
                assert_eq!(
                    resident_pages(&path, 0, want.len()),
                    0,
                    "direct writes left pages cached"
                );
                assert_eq!(&f.read_at(0, want.len()).await.unwrap()[..], &want[..]);
                assert_eq!(&f.read_at(100, 5000).await.unwrap()[..], &want[100..5100]);
                assert_eq!(
                    &f.read_at(want.len() as u64 - 7, 100).await.unwrap()[..],
                    &want[want.len() - 7..]
                );

                // Unaligned positions or lengths are refused before anything is written.
                for (len, pos) in [(block, 100), (block + 1, 0), (100, 3 * block as u64)] {
                    let e = f.write_all_at(vec![9; len], pos).await.unwrap_err();
                    assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{len} bytes at {pos}");
                }
                assert_eq!(&f.read_at(0, want.len() + 10).await.unwrap()[..], &want[..]);
            })
        });
    }

    /// The shard's count of held bytes always equals what its files hold, stays within the
    /// budget, and falls back to 0 as files are truncated, restarted and dropped, whatever
    /// order writes to several files come in.
    #[test]
    fn recent_writes_are_counted_exactly_across_files() {
        // A small write staged in a large buffer keeps an exact copy, not the buffer.
        let (small, small_held) = kept(Bytes::from(vec![7u8; 64 << 10]).slice(..1000), 64 << 10);
        assert_eq!((small.len(), small_held), (1000, 1000));
        let (big, big_held) = kept(Bytes::from(vec![7u8; 96 << 10]).slice(..64 << 10), 96 << 10);
        assert_eq!((big.len(), big_held), (64 << 10, 96 << 10));
        fn held(files: &[Rc<RefCell<Recent>>]) -> usize {
            files
                .iter()
                .map(|f| {
                    let f = f.borrow();
                    assert_eq!(
                        f.bytes,
                        f.chunks.iter().map(|(_, _, _, held)| held).sum::<usize>()
                    );
                    f.bytes
                })
                .sum()
        }
        let shard = RecentWrites::default();
        let mut files: Vec<Rc<RefCell<Recent>>> = (0..5).map(|_| Rc::default()).collect();
        let mut ends = [0u64; 5];
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        for i in 0..4_000 {
            let f = next(&mut rng) as usize % files.len();
            let len = [1usize, 4096, 100_000, 300_000, 983_040][next(&mut rng) as usize % 5];
            match next(&mut rng) % 50 {
                // A truncation to somewhere in what the file holds.
                0 => {
                    ends[f] = next(&mut rng) % (ends[f] + 1);
                    files[f].borrow_mut().truncate(ends[f], &shard);
                }
                // A write that does not continue the last one (after a reopen, say).
                1 => ends[f] += 7,
                // The file is closed and another one opened in its place.
                2 => {
                    files[f].borrow_mut().clear(&shard);
                    files[f] = Rc::default();
                    ends[f] = 0;
                }
                _ => {}
            }
            // Staged in a buffer of its size, of half again, or of three times it: the last
            // is kept as an exact copy, the others whole.
            let buffer = len * [2, 3, 6][next(&mut rng) as usize % 3] / 2;
            let kept_held = if buffer > 2 * len { len } else { buffer };
            shard.push(
                &files[f],
                ends[f],
                Bytes::from(vec![i as u8; len]),
                buffer,
                1 << 20,
            );
            ends[f] += len as u64;
            let total = held(&files);
            assert_eq!(shard.bytes.get(), total, "after write {i}");
            assert!(
                total <= 1 << 20,
                "{total} bytes held over a 1 MiB budget after write {i}"
            );
            // The newest write is kept whenever the memory it keeps fits the budget by itself.
            assert_eq!(
                files[f].borrow().end(),
                (kept_held <= 1 << 20).then_some(ends[f]),
                "write {i}"
            );
            assert_eq!(
                files[f].borrow().chunks.back().map(|c| c.3),
                (kept_held <= 1 << 20).then_some(kept_held)
            );
        }
        for f in &files {
            f.borrow_mut().clear(&shard);
        }
        assert_eq!(shard.bytes.get(), 0);
    }

    /// A small deterministic generator (xorshift64).
    fn next(state: &mut u64) -> u64 {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *state
    }

    /// Appends `n` writes of sizes from `sizes` (picked by `rng`) at the end of `want` through
    /// `f`, reading back random ranges through the handle as it goes.
    async fn append_and_check(f: &GlommioFile, want: &mut Vec<u8>, rng: &mut u64, sizes: &[usize], n: usize) {
        for i in 0..n {
            let size = sizes[next(rng) as usize % sizes.len()];
            let data: Vec<u8> = (0..size)
                .map(|j| (j as u64 ^ next(rng) >> 3 ^ i as u64) as u8)
                .collect();
            let pos = want.len() as u64;
            if i % 2 == 0 {
                f.write_all_at(data.clone(), pos).await.unwrap();
            } else {
                // Staged as a log stages, batch by batch, at times into a buffer that grows.
                let capacity = if i % 4 == 1 { size } else { size / 2 };
                let mut staged = GlommioFs(Rc::clone(&f.fs)).stage_buf(capacity, pos);
                for batch in data.chunks(7919) {
                    staged.extend_from_slice(batch);
                }
                f.write_staged(staged, pos).await.unwrap();
            }
            want.extend_from_slice(&data);
            if i % 3 == 0 {
                let pos = next(rng) as usize % want.len();
                let len = (next(rng) as usize % (want.len() - pos)).min(3 << 20);
                let got = f.read_at(pos as u64, len).await.unwrap();
                assert!(got[..] == want[pos..pos + len], "read of {len} bytes at {pos}");
            }
        }
    }

    /// Syncs `f` and checks that the file at `path` holds `want`, then nothing but zeros (space
    /// reserved for the writes to come).
    async fn synced_file_is(f: &GlommioFile, path: &Path, want: &[u8], what: &str) {
        f.fdatasync().await.unwrap();
        file_holds(path, want, what);
    }

    fn file_holds(path: &Path, want: &[u8], what: &str) {
        let got = std::fs::read(path).unwrap();
        assert!(
            got.len() >= want.len() && got[..want.len()] == *want,
            "the file differs: {what}"
        );
        assert!(
            got[want.len()..].iter().all(|b| *b == 0),
            "the file holds more than zeros past its data: {what}"
        );
    }

    /// Reads the whole file through the handle in windows of `window` bytes, as a consumer
    /// catching up does.
    async fn read_through(f: &GlommioFile, want: &[u8], window: usize) {
        let mut pos = 0;
        while pos < want.len() {
            let len = window.min(want.len() - pos);
            let got = f.read_at(pos as u64, len).await.unwrap();
            assert!(got[..] == want[pos..pos + len], "window at {pos}");
            pos += len;
        }
    }

    /// Reads near the end go directly (the guard is larger than the file).
    #[test]
    fn direct_segment_writes_keep_every_byte() {
        run(|path| Box::pin(keep_every_byte(path, PAGE_CACHE_GUARD_UNKNOWN_BYTES)));
    }

    /// Most reads go through the page cache, with direct writes after them: one task does both
    /// one after another, so no read can be running when a write drops the pages it covers
    /// (the guard is about concurrent reads), and the bytes must be the same.
    #[test]
    fn direct_segment_writes_keep_every_byte_read_through_the_page_cache() {
        run(|path| Box::pin(keep_every_byte(path, 64 << 10)));
    }

    async fn keep_every_byte(path: PathBuf, guard_bytes: u64) {
        // A small budget for recent writes, so that they are evicted as the test goes.
        let fs = direct_fs(1 << 20, guard_bytes);
        let f = fs.open_segment(&path, true).await.unwrap();
        assert!(f.side.is_some(), "O_DIRECT must work on the test's file system");

        // A large write goes past the page cache: only its last partial page is cached.
        let big: Vec<u8> = (0..(2 << 20) + 100).map(|i| (i % 251) as u8).collect();
        f.write_all_at(big.clone(), 0).await.unwrap();
        f.fdatasync().await.unwrap();
        assert_eq!(
            resident_pages(&path, 0, 2 << 20),
            0,
            "the direct write was cached"
        );
        let mut want = big;

        // Writes of every kind of size and alignment, continuing unaligned ends.
        let sizes = [
            1,
            17,
            100,
            4095,
            4096,
            5000,
            65535,
            65536,
            70_001,
            200_000,
            (1 << 20) + 13,
        ];
        let mut rng = 0x9e37_79b9_7f4a_7c15;
        let direct_write_stats = || {
            let s = fs.stats();
            (s.direct_uncopied_bytes, s.direct_copied_bytes)
        };
        let before = direct_write_stats();
        append_and_check(&f, &mut want, &mut rng, &sizes, 150).await;
        synced_file_is(&f, &path, &want, "what was written").await;
        let after = direct_write_stats();
        assert!(
            after.0 > before.0 && after.1 > before.1,
            "direct writes from where they were staged and copied: {before:?} then {after:?}"
        );
        let FsStats {
            recent_writes_bytes: held,
            recent_hit_bytes: hits,
            recent_miss_bytes: misses,
            ..
        } = fs.stats();
        assert!(
            held <= 1 << 20,
            "{held} bytes of recent writes held over a 1 MiB budget"
        );
        assert!(
            hits > 0 && misses > 0,
            "{hits} bytes read from memory, {misses} from the file"
        );
        read_through(&f, &want, 300_000).await;
        read_through(&f, &want, 1 << 20).await;

        // Another handle (as after a restart) does not know the last page: it reads it back.
        drop(f);
        let f = fs.open_segment(&path, false).await.unwrap();
        append_and_check(&f, &mut want, &mut rng, &sizes, 40).await;

        // Cut back to an unaligned length and written again with other bytes: nothing
        // kept in memory from before the cut may be served.
        let cut = want.len() - 300_007;
        f.truncate(cut as u64).await.unwrap();
        want.truncate(cut);
        let mut other = 0x1234_5678_9abc_def1;
        append_and_check(&f, &mut want, &mut other, &sizes, 40).await;
        synced_file_is(&f, &path, &want, "after the cut").await;
        read_through(&f, &want, 700_000).await;

        // Space was reserved ahead of the direct writes; sealed, the file gives it back, and a
        // write still in flight at the seal (a round taken before the roll) is cut too.
        let reserved = std::fs::metadata(&path).unwrap().len();
        assert!(
            reserved > want.len() as u64 && fs.stats().reserved_bytes > 0,
            "no space reserved: the file is {reserved} bytes for {} of data",
            want.len()
        );
        let last: Vec<u8> = (0..300_001u32).map(|i| (i % 7) as u8).collect();
        let at = want.len() as u64;
        let mut write = std::pin::pin!(f.write_all_at(last.clone(), at));
        assert!(
            futures::poll!(write.as_mut()).is_pending(),
            "the write did not wait"
        );
        assert!(
            f.seal(),
            "a file holding reserved space was sealed without a cut to come"
        );
        write.await.unwrap();
        want.extend_from_slice(&last);
        f.fdatasync().await.unwrap();
        assert!(
            std::fs::read(&path).unwrap() == want,
            "the sealed file is not exactly its data"
        );
        read_through(&f, &want, 1 << 20).await;
    }

    /// A new segment at `path` with `len` bytes (byte `i` is `i % modulo`), written 1 MiB at a
    /// time and synced; the handle and the bytes.
    async fn write_segment_by_mib(
        fs: &GlommioFs,
        path: &Path,
        len: u64,
        modulo: usize,
    ) -> (GlommioFile, Vec<u8>) {
        let f = fs.open_segment(path, true).await.unwrap();
        let mut want = Vec::new();
        while (want.len() as u64) < len {
            let n = (1usize << 20).min((len - want.len() as u64) as usize);
            let data: Vec<u8> = (0..n).map(|i| ((i + want.len()) % modulo) as u8).collect();
            f.write_all_at(data.clone(), want.len() as u64).await.unwrap();
            want.extend_from_slice(&data);
        }
        f.fdatasync().await.unwrap();
        (f, want)
    }

    /// With the guard this machine gets: a read far behind the end takes its pages into the
    /// page cache, where the next reader finds them, and the kernel's read-ahead of far reads
    /// takes none of the pages within the guard; a read near the end, with no write in flight,
    /// takes its pages into the page cache too.
    #[test]
    fn reads_far_behind_a_direct_written_end_and_near_it_are_cached() {
        run(|path| {
            Box::pin(async move {
                const MIB: u64 = 1 << 20;
                let guard = page_cache_guard_bytes(path.parent().unwrap());
                assert!(guard >= PAGE_CACHE_GUARD_MIN_BYTES, "guard {guard}");
                let fs = direct_fs(MIB as usize, guard);
                let len = guard + 16 * MIB + 100;
                let (f, want) = write_segment_by_mib(&fs, &path, len, 247).await;
                let next_write_page = len - len % 4096;
                let near = next_write_page - guard;
                assert_eq!(
                    resident_pages(&path, 0, next_write_page as usize),
                    0,
                    "direct writes were cached"
                );

                // Far behind: through the page cache.
                let got = f.read_at(0, 4 * MIB as usize).await.unwrap();
                assert!(got[..] == want[..4 * MIB as usize]);
                assert_eq!(
                    resident_pages(&path, 0, 4 * MIB as usize),
                    1024,
                    "a far read was not cached"
                );
                // The last far read, right before the guard.
                let got = f.read_at(near - MIB, MIB as usize).await.unwrap();
                assert!(got[..] == want[(near - MIB) as usize..near as usize]);
                assert_eq!(
                    resident_pages(&path, near, (next_write_page - near) as usize),
                    0,
                    "a page within {guard} bytes of the next write was cached"
                );
                // Near the end, past the recent writes, no write in flight: through the page
                // cache as well.
                let at = next_write_page - 8 * MIB;
                let got = f.read_at(at, 2 * MIB as usize).await.unwrap();
                assert!(got[..] == want[at as usize..(at + 2 * MIB) as usize]);
                assert_eq!(
                    resident_pages(&path, at, 2 * MIB as usize),
                    512,
                    "a near read was not cached"
                );
                assert_eq!(
                    fs.stats().recent_miss_bytes,
                    7 * MIB,
                    "reads that missed the recent writes"
                );
                assert_eq!(
                    fs.stats().near_cached_read_bytes,
                    4 * MIB,
                    "bytes read near the end, with what was read ahead"
                );
            })
        });
    }

    /// Reads near a direct-written end go through the page cache only while no write of the
    /// file is in flight, and a write that would be direct goes through the page cache while
    /// such a read runs, even one whose caller stopped waiting: no page a direct write covers
    /// is ever being read through the page cache. Every byte stays right.
    #[test]
    fn reads_near_the_end_and_direct_writes_never_run_together() {
        run(|path| {
            Box::pin(async move {
                const MIB: usize = 1 << 20;
                // No recent writes kept, and a file shorter than the guard: every read is near.
                let fs = direct_fs(0, PAGE_CACHE_GUARD_MIN_BYTES);
                let f = fs.open_segment(&path, true).await.unwrap();
                let chunk =
                    |n: usize, seed: usize| -> Vec<u8> { (0..n).map(|i| ((i + seed) % 239) as u8).collect() };
                let mut want = chunk(8 * MIB + 7, 0);
                f.write_all_at(want.clone(), 0).await.unwrap();
                f.fdatasync().await.unwrap();
                assert!(
                    f.side.as_ref().unwrap().dma.borrow().is_some(),
                    "the first write was not direct"
                );
                let beside = || fs.stats().writes_beside_near_reads;
                // Cached pages of the file's whole pages from the one holding `pos` to `end`.
                let resident_from = |pos: usize, end: usize| {
                    let page = pos - pos % 4096;
                    resident_pages(&path, page as u64, end - end % 4096 - page)
                };

                // A read first: the write that starts while it runs goes through the page cache.
                let before = beside();
                let more = chunk(MIB, 1);
                let at = want.len();
                let (got, ()) =
                    futures::join!(async { f.read_at(MIB as u64, 4 * MIB).await.unwrap() }, async {
                        f.write_all_at(more.clone(), at as u64).await.unwrap()
                    },);
                want.extend_from_slice(&more);
                assert!(got[..] == want[MIB..5 * MIB]);
                assert_eq!(beside(), before + 1, "the write beside a near read was direct");
                assert!(
                    resident_from(at, want.len()) > 0,
                    "the write beside a near read left no cached page"
                );
                f.fdatasync().await.unwrap();

                // A write first (directly): the read that starts meanwhile reads directly.
                evict(&path);
                let more = chunk(MIB, 2);
                let at = want.len();
                let ((), got) = futures::join!(
                    async { f.write_all_at(more.clone(), at as u64).await.unwrap() },
                    async { f.read_at(0, MIB).await.unwrap() },
                );
                want.extend_from_slice(&more);
                assert!(got[..] == want[..MIB]);
                assert_eq!(
                    beside(),
                    before + 1,
                    "a write with no near read beside it was not direct"
                );
                assert_eq!(
                    resident_pages(&path, 0, MIB),
                    0,
                    "a read beside a direct write was cached"
                );
                f.fdatasync().await.unwrap();

                // A near read whose caller stops waiting still keeps writes out of the direct path
                // until it ends. Its pages are evicted first, so that it goes to the disk and is
                // still running when abandoned (pages left cached by the reads and writes above
                // would let it finish in its first poll).
                evict(&path);
                let mut read = Box::pin(f.read_at(9 * MIB as u64, MIB / 2));
                assert!(futures::poll!(read.as_mut()).is_pending());
                drop(read);
                let more = chunk(MIB, 3);
                let at = want.len();
                f.write_all_at(more.clone(), at as u64).await.unwrap();
                want.extend_from_slice(&more);
                assert_eq!(
                    beside(),
                    before + 2,
                    "a write beside an abandoned near read was direct"
                );
                f.fdatasync().await.unwrap();

                file_holds(&path, &want, "the file's bytes");
                let got = f.read_at(0, want.len()).await.unwrap();
                assert!(got[..] == want[..]);
            })
        });
    }

    /// A read whose bytes arrive after a truncation keeps nothing beyond what it was asked
    /// for: the truncation may have cut it, and what is written after the cut must be read
    /// back, not the bytes read before it.
    #[test]
    fn a_read_finishing_after_a_truncation_keeps_nothing_ahead() {
        run(|path| {
            Box::pin(async move {
                const MIB: usize = 1 << 20;
                let fs = direct_fs(0, PAGE_CACHE_GUARD_MIN_BYTES);
                let f = Rc::new(fs.open_segment(&path, true).await.unwrap());
                let old: Vec<u8> = (0..4 * MIB).map(|i| (i % 233) as u8).collect();
                f.write_all_at(old.clone(), 0).await.unwrap();
                f.fdatasync().await.unwrap();
                let running = Rc::clone(&f.side.as_ref().unwrap().near_reads);
                let order = Rc::new(RefCell::new(Vec::new()));
                // The first MiB; the rest of the file is read with it (near the end: through
                // the page cache, in a task of its own).
                let reader = glommio::spawn_local({
                    let (f, order) = (Rc::clone(&f), Rc::clone(&order));
                    async move {
                        let got = f.read_at(0, MIB).await.unwrap();
                        order.borrow_mut().push("read");
                        got
                    }
                });
                // Cuts the file once that read is done, before the reader resumes.
                let cutter = glommio::spawn_local({
                    let (f, order) = (Rc::clone(&f), Rc::clone(&order));
                    async move {
                        while running.get() == 0 {
                            futures_lite::future::yield_now().await;
                        }
                        while running.get() > 0 {
                            futures_lite::future::yield_now().await;
                        }
                        order.borrow_mut().push("truncate");
                        f.truncate(MIB as u64).await.unwrap();
                    }
                });
                let got = reader.await;
                cutter.await;
                assert!(got[..] == old[..MIB]);
                assert_eq!(*order.borrow(), ["truncate", "read"], "the race was not set up");
                let new: Vec<u8> = (0..MIB).map(|i| (i % 227) as u8 ^ 0x5A).collect();
                f.write_all_at(new.clone(), MIB as u64).await.unwrap();
                let got = f.read_at(MIB as u64, MIB / 2).await.unwrap();
                assert!(
                    got[..] == new[..MIB / 2],
                    "bytes read before the truncation came back"
                );
            })
        });
    }

    /// A truncation moves the page the next direct write starts in back, possibly into pages
    /// a read through the page cache is taking: it waits for such reads to finish.
    #[test]
    fn a_truncation_waits_for_reads_through_the_page_cache() {
        run(|path| {
            Box::pin(async move {
                let f = direct_fs(1 << 20, 64 << 10)
                    .open_segment(&path, true)
                    .await
                    .unwrap();
                let data: Vec<u8> = (0..(8 << 20) + 7).map(|i| (i % 241) as u8).collect();
                f.write_all_at(data.clone(), 0).await.unwrap();
                f.fdatasync().await.unwrap();
                evict(&path);
                let order = RefCell::new(Vec::new());
                let read = async {
                    let got = f.read_at(0, 4 << 20).await.unwrap();
                    order.borrow_mut().push("read");
                    got
                };
                let cut = async {
                    f.truncate(1 << 20).await.unwrap();
                    order.borrow_mut().push("truncate");
                };
                let (got, ()) = futures::join!(read, cut);
                assert_eq!(*order.borrow(), ["read", "truncate"]);
                assert!(got[..] == data[..4 << 20], "the read saw the truncation");
            })
        });
    }

    /// Only bytes far behind a direct-written end may be sent from the file (and its own
    /// descriptor then reads them): not those within the guard of the end, nor those the
    /// shard's memory of recent writes holds, which are cheaper to copy than to read.
    #[test]
    fn only_bytes_far_behind_a_direct_written_end_and_not_in_memory_are_sendable() {
        run(|path| {
            Box::pin(async move {
                use std::os::unix::fs::FileExt;
                const MIB: u64 = 1 << 20;
                let guard = 4 * MIB;
                let len = 12 * MIB + 100;
                let far_end = (len - len % 4096 - guard) as usize;

                // 1 MiB of recent writes kept: the far bytes come from the file.
                let (f, want) = write_segment_by_mib(&direct_fs(MIB as usize, guard), &path, len, 241).await;
                let fd = f
                    .sendable(0, far_end)
                    .await
                    .unwrap()
                    .expect("far bytes not sendable");
                let mut got = vec![0u8; far_end];
                std::fs::File::from(fd).read_exact_at(&mut got, 0).unwrap();
                assert!(got[..] == want[..far_end], "the descriptor reads other bytes");
                let from = 3 * MIB as usize + 17;
                assert!(f.sendable(from as u64, far_end - from).await.unwrap().is_some());
                assert!(
                    f.sendable(0, far_end + 1).await.unwrap().is_none(),
                    "a byte within the guard of the end is sendable"
                );
                assert!(f.sendable(len - 100, 50).await.unwrap().is_none());

                // All of it kept in memory: nothing is sent from the file.
                let kept_fs = direct_fs(64 * MIB as usize, guard);
                let (g, _) = write_segment_by_mib(&kept_fs, &path.with_extension("kept"), len, 241).await;
                assert!(
                    g.sendable(0, MIB as usize).await.unwrap().is_none(),
                    "bytes held in memory are sendable"
                );
            })
        });
    }

    /// A segment whose direct descriptor cannot be opened (here: its name is gone; in a broker,
    /// say, no descriptors left) is written through the page cache instead of failing the write,
    /// which would take the shard's storage offline.
    #[test]
    fn a_segment_that_cannot_be_opened_directly_is_written_through_the_page_cache() {
        run(|path| {
            Box::pin(async move {
                let f = direct_fs(1 << 20, PAGE_CACHE_GUARD_UNKNOWN_BYTES)
                    .open_segment(&path, true)
                    .await
                    .unwrap();
                std::fs::remove_file(&path).unwrap();
                let data: Vec<u8> = (0..(1 << 20) + 5).map(|i| (i % 249) as u8).collect();
                f.write_all_at(data.clone(), 0).await.unwrap();
                f.fdatasync().await.unwrap();
                assert!(f.side.as_ref().is_some_and(|side| side.dma.borrow().is_none()));
                // From the file itself, not from the recent writes.
                let read = buffered_read(buffered(&f), 0, data.len(), f.fs.shared)
                    .await
                    .unwrap();
                assert!(read[..] == data[..]);
            })
        });
    }
}
