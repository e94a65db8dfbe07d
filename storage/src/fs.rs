//! The file system seen by the storage engine.
//!
//! Storage logic is written once against these traits and runs on three implementations:
//! [`crate::fs_glommio::GlommioFs`] on the broker's shards (io_uring), [`StdFs`] for start-up
//! journal replay and tools (blocking `std::fs`; its futures complete immediately), and
//! [`crate::fs_mem::MemFs`] in tests, where it can lose unsynced data, tear writes and fail
//! with a full disk on demand.
//!
//! Futures are not `Send`: a file is used only by the shard that opened it.
#![allow(async_fn_in_trait)]

use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use bytes::Bytes;

use crate::region::FileRegions;

/// Largest buffer of staged bytes (a log's staged chunk, the journal's pending entries), unless a
/// single batch is larger; a round writes the buffers in turn. Bounded buffers are recycled by
/// the allocator instead of being fresh mappings the kernel must fault in and zero.
pub(crate) const STAGE_CHUNK_MAX_BYTES: usize = 1 << 20;

/// A file opened for reading and writing at explicit positions.
pub trait FileHandle: 'static {
    /// Writes all of `buf` at `pos`.
    async fn write_all_at(&self, buf: Vec<u8>, pos: u64) -> io::Result<()>;
    /// Writes `pieces` back to back from `pos`; returns the bytes written (all of them).
    async fn write_pieces_at(&self, pieces: Vec<Vec<u8>>, pos: u64) -> io::Result<u64> {
        write_each(self, pieces, pos).await
    }
    /// Writes the staged bytes at `pos` (a segment write).
    async fn write_staged(&self, buf: StageBuf, pos: u64) -> io::Result<()> {
        self.write_all_at(buf.into_vec(), pos).await
    }
    /// Reads up to `len` bytes at `pos`; fewer only at the end of the file.
    async fn read_at(&self, pos: u64, len: usize) -> io::Result<Bytes>;
    /// Makes every completed write durable.
    async fn fdatasync(&self) -> io::Result<()>;
    async fn truncate(&self, len: u64) -> io::Result<()>;
    /// The file's size: its data, plus any space a segment file reserves for writes to come,
    /// which reads as zeros (see [`FileHandle::seal`]).
    async fn size(&self) -> io::Result<u64>;
    /// A segment file is sealed (the log rolled past it): once the writes in flight finish it
    /// is written no more, and any space reserved past its data is given back, so that the
    /// file ends where its data ends (recovery trusts the size of a sealed segment). Returns
    /// whether the file's size changed or will, which its next `fdatasync` makes durable. The
    /// broker's segment files reserve space ahead of their direct writes; others never do.
    fn seal(&self) -> bool {
        false
    }
    /// Undoes [`FileHandle::seal`]: the file is the active segment again (a failed flush round
    /// discarded the segments after it), and reserves space again where it did.
    fn unseal(&self) {}
    /// A descriptor of this file (its own, to be closed by the caller) from which the `len`
    /// bytes at `pos` may be sent as they are (`sendfile`), from any thread, for as long as
    /// the caller holds it; `None` where they must be read with [`FileHandle::read_at`]
    /// instead, as in every implementation but the broker's. Ask only for bytes below the high
    /// watermark: they are never rewritten.
    async fn sendable(&self, _pos: u64, _len: usize) -> io::Result<Option<OwnedFd>> {
        Ok(None)
    }
    /// The bound that regions sent from this file ([`FileHandle::sendable`]) count against,
    /// taken before one is asked for; `None` where nothing is ever sent (the default).
    fn file_regions(&self) -> Option<&'static FileRegions> {
        None
    }
}

/// [`FileHandle::write_pieces_at`] as one write per piece, in order.
pub(crate) async fn write_each<F: FileHandle + ?Sized>(
    file: &F,
    pieces: Vec<Vec<u8>>,
    pos: u64,
) -> io::Result<u64> {
    let mut at = pos;
    for piece in pieces {
        let len = piece.len() as u64;
        file.write_all_at(piece, at).await?;
        at += len;
    }
    Ok(at - pos)
}

/// A segment write's bytes as a log stages them, laid out (for a file whose whole pages are
/// written with `O_DIRECT`) so that the write needs no copy: in front of the data sits room for
/// the bytes the file already holds in the page the write starts in, and that page's first
/// byte falls on an address aligned to [`DIRECT_WRITE_ALIGN`]. The writer fills the room and
/// writes the whole pages from this memory. A plain layout is just the data.
#[derive(Debug)]
pub struct StageBuf {
    vec: Vec<u8>,
    /// Index in `vec` of the data's first byte.
    start: usize,
    /// Set for the direct layout: the bytes before `start` kept for the file's page.
    lead: Option<usize>,
}

impl StageBuf {
    /// The data alone, with room for `capacity` bytes.
    pub fn plain(capacity: usize) -> StageBuf {
        StageBuf {
            vec: Vec::with_capacity(capacity),
            start: 0,
            lead: None,
        }
    }

    /// The direct layout for data to be written at file position `pos`, with room for
    /// `capacity` bytes.
    pub fn direct(capacity: usize, pos: u64) -> StageBuf {
        let align = DIRECT_WRITE_ALIGN as usize;
        let lead = (pos % DIRECT_WRITE_ALIGN) as usize;
        // Room for the aligned start, and for the zeros that pad the last page.
        let mut vec: Vec<u8> = Vec::with_capacity(capacity + lead + 2 * align);
        let skip = vec.as_ptr().align_offset(align);
        if skip >= align {
            return StageBuf::plain(capacity);
        }
        vec.resize(skip + lead, 0);
        StageBuf {
            start: vec.len(),
            vec,
            lead: Some(lead),
        }
    }

    pub fn len(&self) -> usize {
        self.vec.len() - self.start
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes held, data and layout together.
    pub fn capacity(&self) -> usize {
        self.vec.capacity()
    }

    pub fn data(&self) -> &[u8] {
        self.vec.get(self.start..).unwrap_or_default()
    }

    pub fn data_mut(&mut self) -> &mut [u8] {
        self.vec.get_mut(self.start..).unwrap_or_default()
    }

    /// Appends `bytes`; growing keeps the layout (the data is then moved once, as a `Vec`'s
    /// growth would).
    pub fn extend_from_slice(&mut self, bytes: &[u8]) {
        if self.vec.capacity() - self.vec.len() < bytes.len() {
            let capacity = (2 * self.len()).max(self.len() + bytes.len());
            let mut grown = match self.lead {
                Some(lead) => StageBuf::direct(capacity, lead as u64),
                None => StageBuf::plain(capacity),
            };
            grown.vec.extend_from_slice(self.data());
            *self = grown;
        }
        self.vec.extend_from_slice(bytes);
    }

    /// The data as `Bytes`, without a copy.
    pub(crate) fn into_bytes(self) -> Bytes {
        let start = self.start;
        Bytes::from(self.vec).slice(start..)
    }

    /// The data as a `Vec`, moved only if a layout lies in front of it.
    pub fn into_vec(mut self) -> Vec<u8> {
        if self.start > 0 {
            self.vec.drain(..self.start);
        }
        self.vec
    }

    /// The direct layout's parts: the bytes from the first page's aligned start (the room
    /// first, then the data), and the room's length; `None` for a plain layout.
    pub(crate) fn into_direct(self) -> Result<(Vec<u8>, usize, usize), StageBuf> {
        match self.lead {
            Some(lead) => Ok((self.vec, self.start - lead, lead)),
            None => Err(self),
        }
    }
}

impl From<Vec<u8>> for StageBuf {
    /// A plain layout of `data`.
    fn from(data: Vec<u8>) -> StageBuf {
        StageBuf {
            vec: data,
            start: 0,
            lead: None,
        }
    }
}

/// Alignment of every write position and length on a file opened with [`Fs::open_direct`]: the
/// largest logical block size of the disks Linux supports for `O_DIRECT`.
pub const DIRECT_WRITE_ALIGN: u64 = 4096;

/// Whether a write of `len` bytes at `pos` suits a file from [`Fs::open_direct`].
pub(crate) fn direct_aligned(len: usize, pos: u64) -> bool {
    pos.is_multiple_of(DIRECT_WRITE_ALIGN) && (len as u64).is_multiple_of(DIRECT_WRITE_ALIGN)
}

/// Directory-level operations and file opening.
pub trait Fs: Clone + 'static {
    type File: FileHandle;

    /// Opens `path` for reading and writing, creating it when `create` is set.
    async fn open(&self, path: &Path, create: bool) -> io::Result<Self::File>;

    /// Like [`Fs::open`], for a file written only at positions and in lengths that are
    /// multiples of [`DIRECT_WRITE_ALIGN`] (the journal). On the shards its writes bypass the
    /// page cache (`O_DIRECT`); by default it is an ordinary file.
    async fn open_direct(&self, path: &Path, create: bool) -> io::Result<Self::File> {
        self.open(path, create).await
    }
    /// Like [`Fs::open`], for a partition's segment file: written only by appends, each at the
    /// end of what the handle wrote before (or after a truncation). On the shards its whole
    /// pages may bypass the page cache; by default it is an ordinary file.
    async fn open_segment(&self, path: &Path, create: bool) -> io::Result<Self::File> {
        self.open(path, create).await
    }
    /// A buffer to stage a segment write of about `capacity` bytes at `pos` in: laid out for a
    /// write without a copy where [`Fs::open_segment`]'s files write whole pages directly and a
    /// write that large would (see [`StageBuf`]); by default plain.
    fn stage_buf(&self, capacity: usize, _pos: u64) -> StageBuf {
        StageBuf::plain(capacity)
    }
    async fn create_dir_all(&self, path: &Path) -> io::Result<()>;
    async fn remove_file(&self, path: &Path) -> io::Result<()>;
    async fn remove_dir_all(&self, path: &Path) -> io::Result<()>;
    /// Atomically replaces `to` with `from`.
    async fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Names of the entries of a directory (not full paths), in no particular order.
    async fn list_dir(&self, path: &Path) -> io::Result<Vec<String>>;
    /// Makes creations, renames and removals in the directory durable.
    async fn sync_dir(&self, path: &Path) -> io::Result<()>;
    /// Makes everything written to the file system holding `path` durable (`syncfs`): one call
    /// instead of a sync per file, for start-up recovery, direct flush rounds and checkpoints
    /// of many logs, and logs created together. On a FUSE file system, which `syncfs` does
    /// not reach, every file and directory under `path` is synced instead.
    async fn sync_filesystem(&self, path: &Path) -> io::Result<()>;
    async fn exists(&self, path: &Path) -> bool;
    /// Space left on the file system holding `path` (`statvfs`), for an unprivileged writer.
    async fn space(&self, path: &Path) -> io::Result<FsSpace>;

    /// Reads a whole small file (metadata, checkpoints).
    async fn read_file(&self, path: &Path) -> io::Result<Bytes> {
        let f = self.open(path, false).await?;
        let size = f.size().await?;
        let len = usize::try_from(size).map_err(|_| io::Error::other("file too large"))?;
        f.read_at(0, len).await
    }

    /// Writes `data` to the temporary file of `path` (`<name>.tmp` beside it), replacing
    /// whatever a crash left there, without syncing; returns the file and its path. The first
    /// step of [`Fs::write_file_atomic`], and of a checkpoint that syncs the whole file system
    /// before it renames.
    async fn write_tmp_file(&self, path: &Path, data: Vec<u8>) -> io::Result<(Self::File, PathBuf)> {
        let tmp = tmp_path(path);
        let _ = self.remove_file(&tmp).await;
        let f = self.open(&tmp, true).await?;
        f.truncate(0).await?;
        f.write_all_at(data, 0).await?;
        Ok((f, tmp))
    }

    /// Durably replaces a small file: write a temporary file, fsync it, rename it over the
    /// target and fsync the directory. Readers see the old or the new content, never a mix.
    async fn write_file_atomic(&self, path: &Path, data: Vec<u8>) -> io::Result<()> {
        let (f, tmp) = self.write_tmp_file(path, data).await?;
        f.fdatasync().await?;
        drop(f);
        self.rename(&tmp, path).await?;
        if let Some(dir) = path.parent() {
            self.sync_dir(dir).await?;
        }
        Ok(())
    }
}

/// What [`Fs::space`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsSpace {
    /// The file system's size (`f_blocks` blocks).
    pub total_bytes: u64,
    /// Bytes an unprivileged writer may still allocate (`f_bavail` blocks).
    pub available_bytes: u64,
    /// Inodes left (`f_favail`); `None` where the file system has no fixed number of them
    /// (it reports none at all, as btrfs does).
    pub available_inodes: Option<u64>,
}

/// [`Fs::space`] of a real file system.
fn statvfs_space(path: &Path) -> io::Result<FsSpace> {
    let s = rustix::fs::statvfs(path)?;
    Ok(FsSpace {
        total_bytes: s.f_blocks.saturating_mul(s.f_frsize),
        available_bytes: s.f_bavail.saturating_mul(s.f_frsize),
        available_inodes: (s.f_files > 0).then_some(s.f_favail),
    })
}

/// The temporary file [`Fs::write_file_atomic`] writes before renaming it over `path`.
fn tmp_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(".tmp");
    path.with_file_name(name)
}

/// Blocking `std::fs`. Used where no shard runs yet (start-up recovery) and by tools.
#[derive(Clone, Copy, Debug, Default)]
pub struct StdFs;

/// A file of [`StdFs`].
#[derive(Debug)]
pub struct StdFile(std::fs::File);

impl FileHandle for StdFile {
    async fn write_all_at(&self, buf: Vec<u8>, pos: u64) -> io::Result<()> {
        std::os::unix::fs::FileExt::write_all_at(&self.0, &buf, pos)
    }

    async fn read_at(&self, pos: u64, len: usize) -> io::Result<Bytes> {
        let mut buf = vec![0u8; len];
        let mut done = 0;
        while done < len {
            let rest = buf.get_mut(done..).unwrap_or_default();
            let n = std::os::unix::fs::FileExt::read_at(&self.0, rest, pos + done as u64)?;
            if n == 0 {
                break;
            }
            done += n;
        }
        buf.truncate(done);
        Ok(Bytes::from(buf))
    }

    async fn fdatasync(&self) -> io::Result<()> {
        self.0.sync_data()
    }

    async fn truncate(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }

    async fn size(&self) -> io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }
}

impl Fs for StdFs {
    type File = StdFile;

    async fn open(&self, path: &Path, create: bool) -> io::Result<StdFile> {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(create)
            .truncate(false)
            .open(path)
            .map(StdFile)
    }

    async fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        std::fs::create_dir_all(path)
    }

    async fn remove_file(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }

    async fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_dir_all(path)
    }

    async fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }

    async fn list_dir(&self, path: &Path) -> io::Result<Vec<String>> {
        std_list_dir(path)
    }

    async fn sync_dir(&self, path: &Path) -> io::Result<()> {
        std::fs::File::open(path)?.sync_all()
    }

    async fn sync_filesystem(&self, path: &Path) -> io::Result<()> {
        let dir = std::fs::File::open(path)?;
        sync_filesystem_of(&dir, path)
    }

    async fn exists(&self, path: &Path) -> bool {
        path.exists()
    }

    async fn space(&self, path: &Path) -> io::Result<FsSpace> {
        statvfs_space(path)
    }
}

/// `statfs`'s type of a FUSE file system (linux/magic.h).
const FUSE_SUPER_MAGIC: u64 = 0x6573_5546;

/// `syncfs` of the file system holding the directory `dir`, opened at `path`. Linux passes
/// `syncfs` on to FUSE file systems only for virtiofs: on any other FUSE file system it returns
/// success having made nothing durable (tools/lazyfs measures it). There every file and
/// directory under `path` is fsynced instead, which makes durable what `syncfs` would have,
/// for the tree the caller asked about (the store's root, where every log lives).
pub(crate) fn sync_filesystem_of(dir: &std::fs::File, path: &Path) -> io::Result<()> {
    // `f_type`'s integer type differs between targets.
    if rustix::fs::fstatfs(dir)?.f_type as u64 == FUSE_SUPER_MAGIC {
        sync_tree(path)
    } else {
        rustix::fs::syncfs(dir).map_err(io::Error::from)
    }
}

/// fsyncs every file and directory under `path`, children before their directory. Entries
/// removed meanwhile (a deleted topic's log) are skipped: their removal is what the directory's
/// fsync makes durable.
fn sync_tree(path: &Path) -> io::Result<()> {
    let skip_gone = |r: io::Result<()>| match r {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        r => r,
    };
    for entry in std::fs::read_dir(path)? {
        let entry = entry?;
        let child = entry.path();
        let kind = match entry.file_type() {
            Ok(kind) => kind,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        if kind.is_dir() {
            skip_gone(sync_tree(&child))?;
        } else if kind.is_file() {
            skip_gone(std::fs::File::open(&child).and_then(|f| f.sync_all()))?;
        }
    }
    std::fs::File::open(path)?.sync_all()
}

fn std_list_dir(path: &Path) -> io::Result<Vec<String>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(path)? {
        let entry = entry?;
        if let Some(name) = entry.file_name().to_str() {
            out.push(name.to_owned());
        }
    }
    Ok(out)
}

/// Runs a future of [`StdFs`] work to completion on the current thread. Every `StdFs` future
/// is ready on first poll, so this never waits.
pub fn block_on<F: std::future::Future>(fut: F) -> F::Output {
    futures_lite::future::block_on(fut)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(i: usize) -> Vec<u8> {
        (0..(i * 37 % 500 + 1)).map(|j| (i * 7 + j) as u8).collect()
    }

    /// Whatever the position and however often the buffer grows, the page the data starts in
    /// begins at an aligned address, and the data is what was appended.
    #[test]
    fn the_direct_layout_stays_aligned_as_it_grows() {
        let align = DIRECT_WRITE_ALIGN as usize;
        for pos in [0u64, 1, 511, 4095, 4096, 10_000, (1 << 30) + 17] {
            let lead = (pos % DIRECT_WRITE_ALIGN) as usize;
            let mut buf = StageBuf::direct(100, pos);
            let mut want = Vec::new();
            for i in 0..60 {
                buf.extend_from_slice(&piece(i));
                want.extend_from_slice(&piece(i));
                assert_eq!(buf.data(), &want[..], "position {pos}, after piece {i}");
                assert_eq!(buf.len(), want.len());
                let page = buf.data().as_ptr() as usize - lead;
                assert_eq!(page % align, 0, "position {pos}, after piece {i}");
            }
            assert!(buf.capacity() >= want.len() + lead);
            let (vec, at, got_lead) = buf.into_direct().expect("the direct layout");
            assert_eq!(got_lead, lead);
            assert_eq!((vec.as_ptr() as usize + at) % align, 0);
            assert_eq!(&vec[at + lead..], &want[..]);
        }
    }

    #[test]
    fn a_plain_layout_is_the_data_and_gives_it_back_without_a_move() {
        let mut buf = StageBuf::plain(1000);
        buf.extend_from_slice(b"abc");
        buf.data_mut()[0] = b'x';
        let at = buf.data().as_ptr();
        let buf = buf.into_direct().expect_err("a plain layout");
        let vec = buf.into_vec();
        assert_eq!((vec.as_ptr(), &vec[..]), (at, &b"xbc"[..]));

        let mut direct = StageBuf::direct(10, 4000);
        direct.extend_from_slice(b"data");
        assert_eq!(direct.into_vec(), b"data");
        let mut direct = StageBuf::direct(10, 4000);
        direct.extend_from_slice(b"data");
        assert_eq!(&direct.into_bytes()[..], b"data");
        assert_eq!(StageBuf::from(b"vec".to_vec()).into_vec(), b"vec");
    }
}
