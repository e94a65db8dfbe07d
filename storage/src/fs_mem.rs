//! An in-memory file system for deterministic tests of the storage engine.
//!
//! Each file keeps its current bytes and the bytes as of its last `fdatasync`. [`MemFs::crash`]
//! models a power loss: every file goes back to its durable bytes plus, when the unsynced part
//! is a pure append, a random prefix of that append (a torn write). A file created since its
//! directory was last synced (`sync_dir`, or `sync_filesystem`) disappears in a crash, as its
//! directory entry may on a real file system. Renames and removals are treated as immediately
//! durable, which is kinder than a real file system.
//! [`MemFs::set_capacity`] makes writes fail with `ENOSPC` once the total size would exceed it.
//! [`MemFs::set_reserve_bytes`] makes segment files hold zeros past their data until sealed, as
//! the broker's do. A file opened with [`Fs::open_direct`] refuses unaligned writes, as
//! `O_DIRECT` does, so the storage tests check the journal's alignment.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use bytes::Bytes;

use crate::fs::{direct_aligned, FileHandle, Fs, FsSpace};
use crate::region::FileRegions;

#[derive(Default, Debug)]
struct FileData {
    data: Vec<u8>,
    durable: Vec<u8>,
    /// Bumped by every change of `data`; `durable` is `data` as of `durable_version`.
    version: u64,
    durable_version: u64,
    /// Written through a handle from [`Fs::open_direct`].
    written_direct: bool,
    /// Zeros at the end of `data` that a segment handle reserved past the data (see
    /// [`MemFs::set_reserve_bytes`]); 0 when the file's size is its data.
    reserved: usize,
}

#[derive(Default, Debug)]
struct State {
    files: BTreeMap<PathBuf, Rc<RefCell<FileData>>>,
    dirs: BTreeSet<PathBuf>,
    capacity_bytes: Option<u64>,
    fail_fsync: bool,
    /// This many `fdatasync` calls still to complete fail (see [`MemFs::fail_next_fsyncs`]).
    fail_next_fsyncs: u32,
    slow_io: bool,
    /// See [`MemFs::set_sendable`].
    sendable: Option<&'static FileRegions>,
    /// See [`MemFs::set_reserve_bytes`].
    reserve_bytes: usize,
    /// Handles opened with [`Fs::open_segment`], per path.
    segment_opens: BTreeMap<PathBuf, u64>,
    fsyncs: u64,
    /// Files created since their directory was last synced: a crash removes them.
    unsynced_creations: BTreeSet<PathBuf>,
    /// Entries created, renamed or removed, per directory (see [`MemFs::dir_change_count`]).
    dir_changes: BTreeMap<PathBuf, u64>,
}

impl State {
    fn note_dir_change(&mut self, path: &Path) {
        if let Some(parent) = path.parent() {
            *self.dir_changes.entry(parent.to_path_buf()).or_default() += 1;
        }
    }
}

impl State {
    fn used_bytes(&self) -> u64 {
        self.files.values().map(|f| f.borrow().data.len() as u64).sum()
    }
}

/// In-memory file system; clones share the same files.
#[derive(Clone, Default, Debug)]
pub struct MemFs {
    state: Rc<RefCell<State>>,
}

/// A file of [`MemFs`].
#[derive(Debug)]
pub struct MemFile {
    data: Rc<RefCell<FileData>>,
    state: Rc<RefCell<State>>,
    /// Opened with [`Fs::open_direct`]: unaligned writes fail, as `O_DIRECT` ones do.
    direct: bool,
    /// Opened with [`Fs::open_segment`]: reserves space when the file system does.
    segment: bool,
    /// [`FileHandle::seal`] was called: reserves nothing more.
    sealed: std::cell::Cell<bool>,
}

fn not_found(path: &Path) -> io::Error {
    io::Error::new(io::ErrorKind::NotFound, format!("{} not found", path.display()))
}

impl MemFs {
    pub fn new() -> Self {
        Self::default()
    }

    /// Limits the total size of all files; writes beyond fail with `ENOSPC`. `None` lifts it.
    pub fn set_capacity(&self, capacity_bytes: Option<u64>) {
        self.state.borrow_mut().capacity_bytes = capacity_bytes;
    }

    /// Makes every later `fdatasync` fail with `EIO`.
    pub fn set_fail_fsync(&self, fail: bool) {
        self.state.borrow_mut().fail_fsync = fail;
    }

    /// Makes the next `count` `fdatasync` calls to *complete* fail with `EIO` (one in flight
    /// now included), leaving their bytes unsynced; later ones succeed.
    pub fn fail_next_fsyncs(&self, count: u32) {
        self.state.borrow_mut().fail_next_fsyncs = count;
    }

    /// Slow I/O: every file write (once) and `fdatasync` (three times) yields to the executor
    /// before it takes effect, so that concurrent I/O interleaves, and an `fdatasync` makes
    /// durable only the bytes the file held when it was called, not those written while it was
    /// in flight.
    pub fn set_slow_io(&self, slow: bool) {
        self.state.borrow_mut().slow_io = slow;
    }

    /// Lets every file's bytes be sent as they are ([`FileHandle::sendable`]), as regions
    /// counted against `regions` (`None`: nothing is sent, the default): each call returns a
    /// memory file holding a copy of the file as it is then, so that what a caller sends from
    /// it can be checked against what [`FileHandle::read_at`] returns.
    pub fn set_sendable(&self, regions: Option<&'static FileRegions>) {
        self.state.borrow_mut().sendable = regions;
    }

    /// Segment handles keep `bytes` zeros past their data after each write (0: none, the
    /// default), as the broker's segment files reserve space ahead of their writes, until
    /// sealed ([`FileHandle::seal`]), which cuts the file back to its data. A truncation
    /// drops the reservation. The zeros are part of the file: its size, reads, syncs and
    /// crashes see them, so recovery must tell them from data.
    pub fn set_reserve_bytes(&self, bytes: usize) {
        self.state.borrow_mut().reserve_bytes = bytes;
    }

    /// Number of entries of `dir` created, renamed (either way) or removed so far: on a real
    /// file system each is a change of the directory that a sync must write.
    pub fn dir_change_count(&self, dir: &Path) -> u64 {
        self.state.borrow().dir_changes.get(dir).copied().unwrap_or(0)
    }

    /// Handles opened with [`Fs::open_segment`] so far, per path.
    pub fn segment_opens(&self) -> BTreeMap<PathBuf, u64> {
        self.state.borrow().segment_opens.clone()
    }

    /// Number of file `fdatasync` calls so far.
    pub fn fsync_count(&self) -> u64 {
        self.state.borrow().fsyncs
    }

    /// Simulates a power loss. `torn` picks, for each file with unsynced writes, how many of
    /// the unsynced bytes survive (given the count of unsynced bytes, returns 0..=count): the
    /// unsynced bytes run from the first byte that differs from the durable content to the
    /// end, and a prefix of them survives (writes reach the disk in order), over whatever was
    /// durable there before (an overwritten, recycled file keeps its old bytes after it).
    pub fn crash(&self, mut torn: impl FnMut(usize) -> usize) {
        let mut state = self.state.borrow_mut();
        let state = &mut *state;
        for path in std::mem::take(&mut state.unsynced_creations) {
            state.files.remove(&path);
        }
        for file in state.files.values() {
            let mut f = file.borrow_mut();
            let f = &mut *f;
            let same = f.data.iter().zip(&f.durable).take_while(|(a, b)| a == b).count();
            if f.data.len() > same {
                let extra = f.data.len() - same;
                let keep = torn(extra).min(extra);
                f.data.truncate(same + keep);
                if let Some(old) = f.durable.get(same + keep..) {
                    f.data.extend_from_slice(old);
                }
            } else {
                f.data.clone_from(&f.durable);
            }
            f.durable.clone_from(&f.data);
            f.version += 1;
            f.durable_version = f.version;
            // Whatever zeros survived are the file's bytes now, for recovery to find.
            f.reserved = 0;
        }
    }

    /// Current content of a file (for tests that corrupt or inspect files).
    pub fn contents(&self, path: &Path) -> Option<Vec<u8>> {
        self.state
            .borrow()
            .files
            .get(path)
            .map(|f| f.borrow().data.clone())
    }

    /// Replaces a file's content, durably (for tests that damage files).
    pub fn set_contents(&self, path: &Path, data: Vec<u8>) {
        let mut state = self.state.borrow_mut();
        let file = state.files.entry(path.to_path_buf()).or_default();
        let mut f = file.borrow_mut();
        f.durable.clone_from(&data);
        f.data = data;
        f.version += 1;
        f.durable_version = f.version;
        f.reserved = 0;
    }

    /// Whether `path` was ever written through a handle from [`Fs::open_direct`].
    pub fn written_direct(&self, path: &Path) -> bool {
        self.state
            .borrow()
            .files
            .get(path)
            .is_some_and(|f| f.borrow().written_direct)
    }

    /// All file paths, sorted.
    pub fn paths(&self) -> Vec<PathBuf> {
        self.state.borrow().files.keys().cloned().collect()
    }
}

impl FileHandle for MemFile {
    async fn write_all_at(&self, buf: Vec<u8>, pos: u64) -> io::Result<()> {
        if self.state.borrow().slow_io {
            futures_lite::future::yield_now().await;
        }
        if self.direct && !direct_aligned(buf.len(), pos) {
            // EINVAL, as from an O_DIRECT write.
            return Err(io::Error::from_raw_os_error(22));
        }
        let state = self.state.borrow();
        let mut f = self.data.borrow_mut();
        let pos = usize::try_from(pos).map_err(|_| io::Error::other("position too large"))?;
        let end = pos + buf.len();
        if let Some(cap) = state.capacity_bytes {
            let growth = end.saturating_sub(f.data.len()) as u64;
            let others: u64 = state
                .files
                .values()
                .filter(|o| !Rc::ptr_eq(o, &self.data))
                .map(|o| o.borrow().data.len() as u64)
                .sum();
            if others + f.data.len() as u64 + growth > cap {
                return Err(io::Error::from_raw_os_error(28));
            }
        }
        let data_end = (f.data.len() - f.reserved).max(end);
        if f.data.len() < end {
            f.data.resize(end, 0);
        }
        if let Some(dst) = f.data.get_mut(pos..end) {
            dst.copy_from_slice(&buf);
        }
        if self.segment && state.reserve_bytes > 0 && !self.sealed.get() {
            let reserved_end = f.data.len().max(data_end + state.reserve_bytes);
            f.data.resize(reserved_end, 0);
        }
        f.reserved = f.data.len() - data_end;
        f.version += 1;
        f.written_direct |= self.direct;
        Ok(())
    }

    async fn read_at(&self, pos: u64, len: usize) -> io::Result<Bytes> {
        let f = self.data.borrow();
        let start = usize::try_from(pos).unwrap_or(usize::MAX).min(f.data.len());
        let end = start.saturating_add(len).min(f.data.len());
        Ok(Bytes::copy_from_slice(f.data.get(start..end).unwrap_or_default()))
    }

    async fn fdatasync(&self) -> io::Result<()> {
        let slow = {
            let mut state = self.state.borrow_mut();
            if state.fail_fsync {
                return Err(io::Error::from_raw_os_error(5));
            }
            state.fsyncs += 1;
            state.slow_io
        };
        let (version, snapshot) = {
            let f = self.data.borrow();
            (f.version, slow.then(|| f.data.clone()))
        };
        if slow {
            // Slower than a write, as on a disk.
            for _ in 0..3 {
                futures_lite::future::yield_now().await;
            }
        }
        {
            let mut state = self.state.borrow_mut();
            if state.fail_next_fsyncs > 0 {
                state.fail_next_fsyncs -= 1;
                return Err(io::Error::from_raw_os_error(5));
            }
        }
        let mut f = self.data.borrow_mut();
        let f = &mut *f;
        if version >= f.durable_version {
            match snapshot {
                Some(data) => f.durable = data,
                None => f.durable.clone_from(&f.data),
            }
            f.durable_version = version;
        }
        Ok(())
    }

    async fn truncate(&self, len: u64) -> io::Result<()> {
        let len = usize::try_from(len).map_err(|_| io::Error::other("length too large"))?;
        let mut f = self.data.borrow_mut();
        f.data.resize(len, 0);
        f.reserved = 0;
        f.version += 1;
        Ok(())
    }

    fn unseal(&self) {
        self.sealed.set(false);
    }

    fn seal(&self) -> bool {
        if !self.segment {
            return false;
        }
        self.sealed.set(true);
        let mut f = self.data.borrow_mut();
        if f.reserved == 0 {
            return false;
        }
        let data_end = f.data.len() - f.reserved;
        f.data.truncate(data_end);
        f.reserved = 0;
        f.version += 1;
        true
    }

    async fn size(&self) -> io::Result<u64> {
        Ok(self.data.borrow().data.len() as u64)
    }

    async fn sendable(&self, pos: u64, len: usize) -> io::Result<Option<OwnedFd>> {
        let f = self.data.borrow();
        let end = pos
            .checked_add(len as u64)
            .ok_or_else(|| io::Error::other("position too large"))?;
        if self.state.borrow().sendable.is_none() || end > f.data.len() as u64 {
            return Ok(None);
        }
        let fd = rustix::fs::memfd_create("strand-sendable", rustix::fs::MemfdFlags::CLOEXEC)?;
        let mut copy = std::fs::File::from(fd);
        copy.write_all(&f.data)?;
        Ok(Some(OwnedFd::from(copy)))
    }

    fn file_regions(&self) -> Option<&'static FileRegions> {
        self.state.borrow().sendable
    }
}

impl Fs for MemFs {
    type File = MemFile;

    async fn open(&self, path: &Path, create: bool) -> io::Result<MemFile> {
        let mut state = self.state.borrow_mut();
        if let Some(parent) = path.parent() {
            if !parent.as_os_str().is_empty() && !state.dirs.contains(parent) {
                return Err(not_found(parent));
            }
        }
        let data = match state.files.get(path) {
            Some(d) => d.clone(),
            None if create => {
                let d = Rc::new(RefCell::new(FileData::default()));
                state.files.insert(path.to_path_buf(), d.clone());
                state.unsynced_creations.insert(path.to_path_buf());
                state.note_dir_change(path);
                d
            }
            None => return Err(not_found(path)),
        };
        Ok(MemFile {
            data,
            state: self.state.clone(),
            direct: false,
            segment: false,
            sealed: std::cell::Cell::new(false),
        })
    }

    async fn open_segment(&self, path: &Path, create: bool) -> io::Result<MemFile> {
        *self
            .state
            .borrow_mut()
            .segment_opens
            .entry(path.to_path_buf())
            .or_default() += 1;
        let mut f = self.open(path, create).await?;
        f.segment = true;
        Ok(f)
    }

    async fn open_direct(&self, path: &Path, create: bool) -> io::Result<MemFile> {
        let mut f = self.open(path, create).await?;
        f.direct = true;
        Ok(f)
    }

    async fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        let mut state = self.state.borrow_mut();
        let mut p = path.to_path_buf();
        loop {
            state.dirs.insert(p.clone());
            if !p.pop() || p.as_os_str().is_empty() {
                break;
            }
        }
        Ok(())
    }

    async fn remove_file(&self, path: &Path) -> io::Result<()> {
        let mut state = self.state.borrow_mut();
        state.unsynced_creations.remove(path);
        state.files.remove(path).ok_or_else(|| not_found(path))?;
        state.note_dir_change(path);
        Ok(())
    }

    async fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        let mut state = self.state.borrow_mut();
        if !state.dirs.contains(path) {
            return Err(not_found(path));
        }
        state.files.retain(|p, _| !p.starts_with(path));
        state.dirs.retain(|p| !p.starts_with(path));
        state.unsynced_creations.retain(|p| !p.starts_with(path));
        Ok(())
    }

    async fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut state = self.state.borrow_mut();
        if let Some(f) = state.files.remove(from) {
            state.files.insert(to.to_path_buf(), f);
            state.note_dir_change(from);
            state.note_dir_change(to);
            // A file not durably named yet is not durably renamed either.
            if state.unsynced_creations.remove(from) {
                state.unsynced_creations.insert(to.to_path_buf());
            } else {
                state.unsynced_creations.remove(to);
            }
            return Ok(());
        }
        if state.dirs.contains(from) {
            let moved_dirs: Vec<PathBuf> = state
                .dirs
                .iter()
                .filter(|p| p.starts_with(from))
                .cloned()
                .collect();
            for d in moved_dirs {
                state.dirs.remove(&d);
                if let Ok(rest) = d.strip_prefix(from) {
                    state.dirs.insert(to.join(rest));
                }
            }
            let moved_files: Vec<PathBuf> = state
                .files
                .keys()
                .filter(|p| p.starts_with(from))
                .cloned()
                .collect();
            for p in moved_files {
                if let (Some(f), Ok(rest)) = (state.files.remove(&p), p.strip_prefix(from)) {
                    state.files.insert(to.join(rest), f);
                    if state.unsynced_creations.remove(&p) {
                        state.unsynced_creations.insert(to.join(rest));
                    }
                }
            }
            return Ok(());
        }
        Err(not_found(from))
    }

    async fn list_dir(&self, path: &Path) -> io::Result<Vec<String>> {
        let state = self.state.borrow();
        if !state.dirs.contains(path) {
            return Err(not_found(path));
        }
        let mut names = BTreeSet::new();
        for p in state.files.keys().chain(state.dirs.iter()) {
            if p.parent() == Some(path) {
                if let Some(n) = p.file_name().and_then(|n| n.to_str()) {
                    names.insert(n.to_owned());
                }
            }
        }
        Ok(names.into_iter().collect())
    }

    async fn sync_dir(&self, path: &Path) -> io::Result<()> {
        let mut state = self.state.borrow_mut();
        if state.dirs.contains(path) {
            state.unsynced_creations.retain(|p| p.parent() != Some(path));
            Ok(())
        } else {
            Err(not_found(path))
        }
    }

    async fn sync_filesystem(&self, _path: &Path) -> io::Result<()> {
        let mut state = self.state.borrow_mut();
        if state.fail_fsync {
            return Err(io::Error::other("injected fsync failure"));
        }
        state.unsynced_creations.clear();
        for file in state.files.values() {
            let mut f = file.borrow_mut();
            let f = &mut *f;
            f.durable.clone_from(&f.data);
            f.durable_version = f.version;
        }
        Ok(())
    }

    async fn exists(&self, path: &Path) -> bool {
        let state = self.state.borrow();
        state.files.contains_key(path) || state.dirs.contains(path)
    }

    /// What [`MemFs::set_capacity`] leaves; unlimited without one.
    async fn space(&self, _path: &Path) -> io::Result<FsSpace> {
        let state = self.state.borrow();
        let available_bytes = state
            .capacity_bytes
            .map_or(u64::MAX, |cap| cap.saturating_sub(state.used_bytes()));
        Ok(FsSpace {
            total_bytes: state.capacity_bytes.unwrap_or(u64::MAX),
            available_bytes,
            available_inodes: None,
        })
    }
}

impl MemFs {
    /// Total bytes stored in all files.
    pub fn used_bytes(&self) -> u64 {
        self.state.borrow().used_bytes()
    }
}
