//! [`Fs`] on glommio: file reads, writes and `fdatasync` go through the shard's io_uring, so a
//! shard keeps serving while its flush round waits for the disk. Directory operations are rare
//! (segment roll, topic creation) and use blocking `std::fs` calls.
//!
//! This is the only storage module that knows the runtime, and the only module of the workspace
//! allowed `unsafe` code: one borrow of a file descriptor glommio owns (see [`borrow_fd`]).

use std::cell::Cell;
use std::io;
use std::io::IoSliceMut;
use std::num::NonZeroU64;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use glommio::io::{BufferedFile, DmaFile, OpenOptions};
use rustix::io::{Errno, ReadWriteFlags};

use crate::fs::{direct_aligned, FileHandle, Fs, StdFs};

/// The glommio-backed file system; usable only inside a glommio executor.
#[derive(Clone, Copy, Debug, Default)]
pub struct GlommioFs;

/// A glommio file: buffered (page cache, io_uring), or direct (`O_DIRECT`, io_uring) for a file
/// opened with [`Fs::open_direct`].
#[derive(Debug)]
pub struct GlommioFile(Inner, Cell<Written>);

/// How far a buffered file has been written, and up to where its pages were dropped from the
/// page cache (see [`set_drop_behind_bytes`]).
#[derive(Debug, Default, Clone, Copy)]
struct Written {
    end: u64,
    dropped_to: u64,
}

/// Pages are dropped in steps of at least this many bytes, so that a log flushing small rounds
/// makes one `fadvise` call per few MiB rather than one per round.
const DROP_STEP_BYTES: u64 = 4 << 20;

thread_local! {
    /// See [`set_drop_behind_bytes`]; 0 drops nothing.
    static DROP_BEHIND_BYTES: Cell<u64> = const { Cell::new(0) };
    /// Bytes this thread (a shard) asked the kernel to drop from the page cache.
    static DROPPED_BYTES: Cell<u64> = const { Cell::new(0) };
}

/// After an `fdatasync`, a buffered file's pages lying more than `bytes` behind the end of what
/// was written through this handle are dropped from the page cache (`POSIX_FADV_DONTNEED`); 0
/// (the default) keeps everything, as Kafka does. A growing log then reuses the pages it frees
/// instead of taking new ones (the kernel drops whole folios, so up to one large folio more
/// stays), which matters where taking a page the kernel has not used
/// recently is expensive (a VM whose free memory goes back to the host, BENCHMARKS.md item 22);
/// reads of dropped data come from the disk. For the calling thread: each shard sets it when it
/// starts (`strand.log.drop.behind.bytes`).
pub fn set_drop_behind_bytes(bytes: u64) {
    DROP_BEHIND_BYTES.with(|d| d.set(bytes));
}

/// Bytes the calling shard has asked the kernel to drop from the page cache so far (each open
/// handle of a file drops on its own, so a range may be counted more than once).
pub fn dropped_behind_bytes() -> u64 {
    DROPPED_BYTES.with(Cell::get)
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
    fn wrote(&self, pos: u64, len: usize) {
        let mut w = self.1.get();
        w.end = w.end.max(pos + len as u64);
        self.1.set(w);
    }

    /// Drops the pages more than [`DROP_BEHIND_BYTES`] behind `synced_end`, once a step's worth
    /// has gathered. Called after a successful `fdatasync` with the written end as it was when
    /// the `fdatasync` began: everything before it is clean and goes, while a write that
    /// completed during the `fdatasync` (the next round, overlapping) may still be dirty, and
    /// the kernel would skip its pages for good.
    fn drop_behind(&self, file: &BufferedFile, synced_end: u64) {
        let keep = DROP_BEHIND_BYTES.with(Cell::get);
        let mut w = self.1.get();
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
            Ok(()) => DROPPED_BYTES.with(|d| d.set(d.get() + len.get())),
            Err(e) => tracing::debug!(error = %e, "fadvise(DONTNEED) failed"),
        }
        w.dropped_to = to;
        self.1.set(w);
    }
}

#[derive(Debug)]
enum Inner {
    Buffered(BufferedFile),
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
        let n = match &self.0 {
            Inner::Buffered(f) => {
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

    /// On a direct file, one write (see [`direct_write`]).
    async fn write_pieces_at(&self, pieces: Vec<Vec<u8>>, pos: u64) -> io::Result<u64> {
        match &self.0 {
            Inner::Buffered(_) => crate::fs::write_each(self, pieces, pos).await,
            Inner::Direct(f) => direct_write(f, pieces, pos).await,
        }
    }

    async fn read_at(&self, pos: u64, len: usize) -> io::Result<Bytes> {
        match &self.0 {
            Inner::Buffered(f) => buffered_read(f, pos, len).await,
            Inner::Direct(f) => {
                // Direct files are written, not read, on the shards (the journal is read at
                // start-up, before them); a buffered handle serves the odd read.
                let path = f
                    .path()
                    .map(|p| p.to_path_buf())
                    .ok_or_else(|| io::Error::other("direct file without a path"))?;
                let b = OpenOptions::new().read(true).buffered_open(&path).await?;
                let out = buffered_read(&b, pos, len).await;
                b.close().await?;
                out
            }
        }
    }

    async fn fdatasync(&self) -> io::Result<()> {
        match &self.0 {
            Inner::Buffered(f) => {
                let synced_end = self.1.get().end;
                f.fdatasync().await?;
                self.drop_behind(f, synced_end);
                Ok(())
            }
            Inner::Direct(f) => Ok(f.fdatasync().await?),
        }
    }

    async fn truncate(&self, len: u64) -> io::Result<()> {
        match &self.0 {
            Inner::Buffered(f) => {
                f.truncate(len).await?;
                let mut w = self.1.get();
                w.end = w.end.min(len);
                w.dropped_to = w.dropped_to.min(len);
                self.1.set(w);
                Ok(())
            }
            Inner::Direct(f) => Ok(f.truncate(len).await?),
        }
    }

    async fn size(&self) -> io::Result<u64> {
        match &self.0 {
            Inner::Buffered(f) => Ok(f.file_size().await?),
            Inner::Direct(f) => Ok(f.file_size().await?),
        }
    }
}

/// Writes `pieces` back to back from `pos` as one direct write: they are copied into one
/// aligned buffer (glommio's registered buffers, or an aligned heap block) instead of into the
/// page cache, and one write lets the disk take them at once rather than one after another.
async fn direct_write(f: &DmaFile, pieces: Vec<Vec<u8>>, pos: u64) -> io::Result<u64> {
    let len: usize = pieces.iter().map(Vec::len).sum();
    if !direct_aligned(len, pos) {
        return Err(unaligned(len, pos));
    }
    let mut dma = f.alloc_dma_buffer(len);
    let mut at = 0;
    for piece in pieces {
        if let Some(dst) = dma.as_bytes_mut().get_mut(at..at + piece.len()) {
            dst.copy_from_slice(&piece);
        }
        at += piece.len();
    }
    let n = f.write_at(dma, pos).await?;
    if n < len {
        return Err(short_write(n, len, pos));
    }
    Ok(len as u64)
}

/// What the page cache holds is read straight into the returned buffer; the rest (cold data)
/// through io_uring, whose own buffer is then copied.
async fn buffered_read(file: &BufferedFile, pos: u64, len: usize) -> io::Result<Bytes> {
    let mut out = vec![0u8; len];
    let mut filled = cached_read(file, &mut out, pos);
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

/// Cleared when the file system refuses `O_DIRECT`.
static DIRECT_WRITES: AtomicBool = AtomicBool::new(true);

/// Cleared when the kernel or file system does not support `RWF_NOWAIT` reads.
static NOWAIT_READS: AtomicBool = AtomicBool::new(true);

/// Reads into `buf` from `pos` what the page cache holds, without ever waiting for the disk
/// (`preadv2` with `RWF_NOWAIT`), and returns how many bytes it read: all of `buf` for the tail
/// a consumer follows, less (or none) for data that must come from the disk. Such a read of an
/// uncached page does start readahead, so a later read (or this one, on a fast disk) may find
/// it cached: how much of cold data it returns is not fixed. glommio's own reads land in a
/// buffer it allocates, which would then be copied once more.
fn cached_read(file: &BufferedFile, buf: &mut [u8], pos: u64) -> usize {
    if !NOWAIT_READS.load(Ordering::Relaxed) {
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
                if NOWAIT_READS.swap(false, Ordering::Relaxed) {
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
        Ok(GlommioFile(Inner::Buffered(f), Cell::default()))
    }

    /// `O_DIRECT` where the file system supports it (glommio writes tmpfs files without it); a
    /// buffered file where the file system refuses it or its disk needs a larger alignment.
    async fn open_direct(&self, path: &Path, create: bool) -> io::Result<GlommioFile> {
        if DIRECT_WRITES.load(Ordering::Relaxed) {
            let opened = OpenOptions::new()
                .read(true)
                .write(true)
                .create(create)
                .dma_open(path)
                .await;
            match opened {
                Ok(f) if f.alignment() <= crate::fs::DIRECT_WRITE_ALIGN => {
                    return Ok(GlommioFile(Inner::Direct(f), Cell::default()));
                }
                Ok(f) => {
                    if DIRECT_WRITES.swap(false, Ordering::Relaxed) {
                        tracing::info!(path = %path.display(), alignment = f.alignment(), "the disk's direct I/O alignment is too large; the journal is written through the page cache");
                    }
                    f.close().await?;
                }
                Err(e) if e.raw_os_error() == Some(Errno::INVAL.raw_os_error()) => {
                    if DIRECT_WRITES.swap(false, Ordering::Relaxed) {
                        tracing::info!(path = %path.display(), "O_DIRECT unsupported here; the journal is written through the page cache");
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
        self.open(path, create).await
    }

    // Directory operations are rare (segment roll, topic creation): blocking std calls.
    async fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        StdFs.create_dir_all(path).await
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

    async fn sync_filesystem(&self, path: &Path) -> io::Result<()> {
        StdFs.sync_filesystem(path).await
    }

    async fn exists(&self, path: &Path) -> bool {
        StdFs.exists(path).await
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

    fn buffered(f: &GlommioFile) -> &BufferedFile {
        match &f.0 {
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

    #[test]
    fn cached_data_is_read_without_io_uring_and_cold_data_through_it() {
        run(|path| {
            Box::pin(async move {
                let f = GlommioFs.open(&path, true).await.unwrap();
                f.write_all_at(pattern(), 0).await.unwrap();
                f.fdatasync().await.unwrap();
                let want = pattern();

                // Hot: all of it from the page cache, without waiting.
                assert_eq!(resident_pages(&path, 0, LEN), LEN / 4096);
                let mut buf = vec![0u8; 2 << 20];
                assert_eq!(
                    cached_read(buffered(&f), &mut buf, 100),
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
                let cached = cached_read(buffered(&f), &mut probe, 0);
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
                set_drop_behind_bytes(MIB as u64);
                let want: Vec<u8> = (0..8 * MIB).map(|i| (i % 251) as u8).collect();
                let f = GlommioFs.open(&path, true).await.unwrap();
                // Less than a step behind: nothing dropped yet, even after the fsync.
                f.write_all_at(want[..4 * MIB].to_vec(), 0).await.unwrap();
                f.fdatasync().await.unwrap();
                assert_eq!(
                    resident_pages(&path, 0, 4 * MIB),
                    1024,
                    "dropped before a step gathered"
                );
                assert_eq!(dropped_behind_bytes(), 0);
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
                assert_eq!(dropped_behind_bytes(), 7 * MIB as u64);
                // Dropped data is still read, from the disk.
                assert_eq!(&f.read_at(0, 8 * MIB).await.unwrap()[..], &want[..]);
                // A truncation below the dropped point and a rewrite: the window follows it.
                f.truncate(2 * MIB as u64).await.unwrap();
                f.write_all_at(want[2 * MIB..].to_vec(), 2 * MIB as u64)
                    .await
                    .unwrap();
                f.fdatasync().await.unwrap();
                assert_eq!(resident_pages(&path, 2 * MIB as u64, 3 * MIB), 0);
                assert_eq!(dropped_behind_bytes(), 12 * MIB as u64);
                // 0 keeps everything.
                set_drop_behind_bytes(0);
                let other = path.with_extension("other");
                let g = GlommioFs.open(&other, true).await.unwrap();
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
                let f = GlommioFs.open_direct(&path, true).await.unwrap();
                assert!(
                    matches!(f.0, Inner::Direct(_)),
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
}
