//! The file system itself, without FUSE: every inode's current state beside its durable state,
//! and what a power cut leaves.
//!
//! Durability follows POSIX, as strictly as ext4 allows an application to rely on it:
//!
//! - a file's data and size become durable when the file is `fsync`ed or `fdatasync`ed (the
//!   two are one here: ext4's `fdatasync` writes whatever metadata the data needs, the size and
//!   the conversion of preallocated extents included);
//! - a name (a create, `mkdir`, `rename`, `unlink`, `rmdir`) becomes durable when its directory
//!   is `fsync`ed; a rename between directories is two names, each durable with its own
//!   directory. `fsync` of a file does not make its name durable, nor does `fsync` of a new
//!   directory make its entry in its parent durable;
//! - [`Model::sync_all`] (the `sync` control command) makes everything durable. The kernel
//!   does not pass `syncfs(2)` or `sync(2)` on to a FUSE file system (see the crate docs).
//!
//! [`Model::power_cut`] keeps only what is durable: each directory gets back its entries as of
//! its last sync, reached from the root; each file reached gets back its data and size as of its
//! last sync; every other inode is gone. With a tear, the last unsynced write is kept up to a
//! random page boundary (its first pages reached the disk, the rest did not).
//!
//! Data is held in 4 KiB pages shared between the current and the durable state until either
//! changes (copy on write), and pages of zeros (preallocated, punched, never written) take no
//! memory.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ffi::{OsStr, OsString};
use std::sync::Arc;
use std::time::SystemTime;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The page size of the model (writes tear at multiples of it).
pub const PAGE: usize = 4096;
const PAGE_U64: u64 = PAGE as u64;

/// The root directory's inode number (FUSE's).
pub const ROOT: u64 = 1;

type Page = Arc<[u8; PAGE]>;

/// The bytes of a file: pages (absent ones read as zeros) and a size.
#[derive(Clone, Default, Debug)]
struct Content {
    pages: BTreeMap<u64, Page>,
    size: u64,
}

impl Content {
    fn read(&self, offset: u64, len: usize) -> Vec<u8> {
        let end = (offset + len as u64).min(self.size);
        if offset >= end {
            return Vec::new();
        }
        let mut out = vec![0u8; (end - offset) as usize];
        let first = offset / PAGE_U64;
        let last = (end - 1) / PAGE_U64;
        for (&p, page) in self.pages.range(first..=last) {
            let page_start = p * PAGE_U64;
            let from = offset.max(page_start);
            let to = end.min(page_start + PAGE_U64);
            out[(from - offset) as usize..(to - offset) as usize]
                .copy_from_slice(&page[(from - page_start) as usize..(to - page_start) as usize]);
        }
        out
    }

    /// Writes `data` at `offset` (extending the size), noting every page touched in `dirty`.
    fn write(&mut self, offset: u64, data: &[u8], dirty: &mut BTreeSet<u64>) {
        let mut pos = offset;
        let mut rest = data;
        while !rest.is_empty() {
            let p = pos / PAGE_U64;
            let in_page = (pos % PAGE_U64) as usize;
            let n = rest.len().min(PAGE - in_page);
            let chunk = &rest[..n];
            dirty.insert(p);
            match self.pages.get_mut(&p) {
                Some(page) => Arc::make_mut(page)[in_page..in_page + n].copy_from_slice(chunk),
                None if chunk.iter().all(|&b| b == 0) => {}
                None => {
                    let mut page = [0u8; PAGE];
                    page[in_page..in_page + n].copy_from_slice(chunk);
                    self.pages.insert(p, Arc::new(page));
                }
            }
            pos += n as u64;
            rest = &rest[n..];
        }
        self.size = self.size.max(offset + data.len() as u64);
    }

    /// Zeros `[offset, offset + len)` within the current size (or beyond it: pages past the
    /// size are absent anyway).
    fn zero(&mut self, offset: u64, len: u64, dirty: &mut BTreeSet<u64>) {
        if len == 0 {
            return;
        }
        let end = offset + len;
        let first = offset / PAGE_U64;
        let last = (end - 1) / PAGE_U64;
        let touched: Vec<u64> = self.pages.range(first..=last).map(|(&p, _)| p).collect();
        for p in touched {
            dirty.insert(p);
            let page_start = p * PAGE_U64;
            let from = offset.max(page_start);
            let to = end.min(page_start + PAGE_U64);
            if from == page_start && to == page_start + PAGE_U64 {
                self.pages.remove(&p);
            } else if let Some(page) = self.pages.get_mut(&p) {
                Arc::make_mut(page)[(from - page_start) as usize..(to - page_start) as usize].fill(0);
            }
        }
    }

    /// Sets the size: a shrink drops the pages past it and zeros the rest of its last page, so
    /// that growing again reads zeros.
    fn set_size(&mut self, size: u64, dirty: &mut BTreeSet<u64>) {
        if size < self.size {
            self.zero(size, self.size - size, dirty);
        }
        self.size = size;
    }

    fn memory_pages(&self) -> usize {
        self.pages.len()
    }
}

/// A regular file: its bytes now, and as of its last sync.
#[derive(Clone, Default, Debug)]
struct FileNode {
    cur: Content,
    dur: Content,
    /// Pages whose current bytes may differ from the durable ones.
    dirty: BTreeSet<u64>,
    /// Whether anything (data or size) changed since the last sync.
    unsynced: bool,
}

impl FileNode {
    fn sync(&mut self) {
        for &p in &self.dirty {
            match self.cur.pages.get(&p) {
                Some(page) => {
                    self.dur.pages.insert(p, page.clone());
                }
                None => {
                    self.dur.pages.remove(&p);
                }
            }
        }
        self.dirty.clear();
        self.dur.size = self.cur.size;
        self.unsynced = false;
    }
}

#[derive(Clone, Default, Debug)]
struct DirNode {
    cur: BTreeMap<OsString, u64>,
    dur: BTreeMap<OsString, u64>,
}

#[derive(Clone, Debug)]
enum Kind {
    File(FileNode),
    Dir(DirNode),
}

/// An inode's attributes (kept as they are now; only data, size and names are modelled as
/// volatile).
#[derive(Clone, Copy, Debug)]
pub struct Attr {
    /// Inode number.
    pub ino: u64,
    /// Whether it is a directory.
    pub is_dir: bool,
    /// Size in bytes (a directory: its entries).
    pub size: u64,
    /// Permission bits.
    pub perm: u16,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Current names (a directory: 2 + its subdirectories, as usual).
    pub nlink: u32,
    /// Last modification.
    pub mtime: SystemTime,
    /// Last status change.
    pub ctime: SystemTime,
    /// Last access (never updated).
    pub atime: SystemTime,
}

#[derive(Clone, Debug)]
struct Inode {
    kind: Kind,
    perm: u16,
    uid: u32,
    gid: u32,
    mtime: SystemTime,
    ctime: SystemTime,
    /// Names in current directory entries.
    links_cur: u32,
    /// Kernel references (FUSE lookup count) plus open handles: the inode stays while any.
    refs: u64,
}

/// Errors, as errno values.
pub type Errno = i32;

/// What a power cut dropped.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CutReport {
    /// Files reached after the cut whose unsynced changes were dropped.
    pub files_reverted: usize,
    /// Directory entries whose unsynced changes were dropped (per directory).
    pub dirs_reverted: usize,
    /// Inodes that disappeared (never durably named).
    pub inodes_dropped: usize,
    /// With a tear: the inode of the torn write, the pages of it kept and its pages in all.
    pub torn: Option<(u64, u64, u64)>,
}

/// Counters of the calls that matter for durability.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Writes (FUSE_WRITE requests; a large write may come as several).
    pub writes: u64,
    /// Bytes written.
    pub bytes_written: u64,
    /// `fsync`/`fdatasync` of files.
    pub file_syncs: u64,
    /// `fsync` of directories.
    pub dir_syncs: u64,
    /// `fallocate` calls, by mode.
    pub fallocates: BTreeMap<i32, u64>,
    /// Opens with `O_DIRECT`.
    pub direct_opens: u64,
    /// Renames.
    pub renames: u64,
    /// Power cuts.
    pub cuts: u64,
}

/// The whole file system.
#[derive(Debug)]
pub struct Model {
    inodes: HashMap<u64, Inode>,
    next_ino: u64,
    /// The last write not yet synced: inode, offset, length.
    last_write: Option<(u64, u64, u64)>,
    /// Between a power cut and the next mount: every call fails with `EIO`.
    frozen: bool,
    stats: Stats,
}

fn now() -> SystemTime {
    SystemTime::now()
}

/// `fallocate` mode bits (linux/falloc.h).
pub const FALLOC_FL_KEEP_SIZE: i32 = 0x01;
/// See [`FALLOC_FL_KEEP_SIZE`].
pub const FALLOC_FL_PUNCH_HOLE: i32 = 0x02;
/// See [`FALLOC_FL_KEEP_SIZE`].
pub const FALLOC_FL_ZERO_RANGE: i32 = 0x10;

impl Default for Model {
    fn default() -> Self {
        Self::new()
    }
}

impl Model {
    /// An empty file system: a root directory, durable.
    pub fn new() -> Model {
        let mut inodes = HashMap::new();
        let t = now();
        inodes.insert(
            ROOT,
            Inode {
                kind: Kind::Dir(DirNode::default()),
                perm: 0o755,
                uid: 0,
                gid: 0,
                mtime: t,
                ctime: t,
                links_cur: 1,
                refs: 0,
            },
        );
        Model {
            inodes,
            next_ino: ROOT + 1,
            last_write: None,
            frozen: false,
            stats: Stats::default(),
        }
    }

    /// The counters so far.
    pub fn stats(&self) -> Stats {
        self.stats.clone()
    }

    /// Pages of data held (current and durable states share unchanged pages).
    pub fn memory_pages(&self) -> usize {
        self.inodes
            .values()
            .map(|i| match &i.kind {
                Kind::File(f) => f.cur.memory_pages() + f.dirty.len(),
                Kind::Dir(_) => 0,
            })
            .sum()
    }

    fn check(&self) -> Result<(), Errno> {
        if self.frozen {
            Err(libc::EIO)
        } else {
            Ok(())
        }
    }

    fn inode(&self, ino: u64) -> Result<&Inode, Errno> {
        self.inodes.get(&ino).ok_or(libc::ENOENT)
    }

    fn inode_mut(&mut self, ino: u64) -> Result<&mut Inode, Errno> {
        self.inodes.get_mut(&ino).ok_or(libc::ENOENT)
    }

    fn dir(&self, ino: u64) -> Result<&DirNode, Errno> {
        match &self.inode(ino)?.kind {
            Kind::Dir(d) => Ok(d),
            Kind::File(_) => Err(libc::ENOTDIR),
        }
    }

    fn dir_mut(&mut self, ino: u64) -> Result<&mut DirNode, Errno> {
        match &mut self.inode_mut(ino)?.kind {
            Kind::Dir(d) => Ok(d),
            Kind::File(_) => Err(libc::ENOTDIR),
        }
    }

    fn file_mut(&mut self, ino: u64) -> Result<&mut FileNode, Errno> {
        match &mut self.inode_mut(ino)?.kind {
            Kind::File(f) => Ok(f),
            Kind::Dir(_) => Err(libc::EISDIR),
        }
    }

    /// The attributes of `ino`.
    pub fn attr(&self, ino: u64) -> Result<Attr, Errno> {
        let i = self.inode(ino)?;
        let (is_dir, size, nlink) = match &i.kind {
            Kind::File(f) => (false, f.cur.size, i.links_cur),
            Kind::Dir(d) => {
                let subdirs = d
                    .cur
                    .values()
                    .filter(|c| matches!(self.inodes.get(c).map(|n| &n.kind), Some(Kind::Dir(_))))
                    .count();
                (true, d.cur.len() as u64, 2 + subdirs as u32)
            }
        };
        Ok(Attr {
            ino,
            is_dir,
            size,
            perm: i.perm,
            uid: i.uid,
            gid: i.gid,
            nlink,
            mtime: i.mtime,
            ctime: i.ctime,
            atime: i.mtime,
        })
    }

    /// Looks `name` up in `parent`; a found inode gains a kernel reference.
    pub fn lookup(&mut self, parent: u64, name: &OsStr) -> Result<Attr, Errno> {
        self.check()?;
        let ino = *self.dir(parent)?.cur.get(name).ok_or(libc::ENOENT)?;
        self.inode_mut(ino)?.refs += 1;
        self.attr(ino)
    }

    /// The kernel dropped `n` references.
    pub fn forget(&mut self, ino: u64, n: u64) {
        if let Some(i) = self.inodes.get_mut(&ino) {
            i.refs = i.refs.saturating_sub(n);
        }
        self.collect(ino);
    }

    /// An open handle (of a file or directory) on `ino`.
    pub fn open(&mut self, ino: u64, flags: i32) -> Result<(), Errno> {
        self.check()?;
        self.inode_mut(ino)?.refs += 1;
        if flags & libc::O_DIRECT != 0 {
            self.stats.direct_opens += 1;
        }
        Ok(())
    }

    /// A handle closed.
    pub fn release(&mut self, ino: u64) {
        self.forget(ino, 1);
    }

    /// Removes `ino` if nothing reaches it any more (no name now, none durable, no reference).
    fn collect(&mut self, ino: u64) {
        let Some(i) = self.inodes.get(&ino) else { return };
        if ino == ROOT || i.links_cur > 0 || i.refs > 0 {
            return;
        }
        if self.durably_named(ino) {
            return;
        }
        self.inodes.remove(&ino);
    }

    fn durably_named(&self, ino: u64) -> bool {
        self.inodes.values().any(|i| match &i.kind {
            Kind::Dir(d) => d.dur.values().any(|&c| c == ino),
            Kind::File(_) => false,
        })
    }

    fn new_inode(&mut self, kind: Kind, perm: u16, uid: u32, gid: u32) -> u64 {
        let ino = self.next_ino;
        self.next_ino += 1;
        let t = now();
        self.inodes.insert(
            ino,
            Inode {
                kind,
                perm,
                uid,
                gid,
                mtime: t,
                ctime: t,
                links_cur: 0,
                refs: 0,
            },
        );
        ino
    }

    fn touch(&mut self, ino: u64) {
        if let Some(i) = self.inodes.get_mut(&ino) {
            let t = now();
            i.mtime = t;
            i.ctime = t;
        }
    }

    /// Creates a file or directory `name` in `parent`; it gains a kernel reference.
    pub fn create(
        &mut self,
        parent: u64,
        name: &OsStr,
        dir: bool,
        perm: u16,
        uid: u32,
        gid: u32,
    ) -> Result<Attr, Errno> {
        self.check()?;
        if self.dir(parent)?.cur.contains_key(name) {
            return Err(libc::EEXIST);
        }
        let kind = if dir {
            Kind::Dir(DirNode::default())
        } else {
            Kind::File(FileNode::default())
        };
        let ino = self.new_inode(kind, perm, uid, gid);
        self.dir_mut(parent)?.cur.insert(name.to_os_string(), ino);
        let i = self.inode_mut(ino)?;
        i.links_cur = 1;
        i.refs = 1;
        self.touch(parent);
        self.attr(ino)
    }

    /// Removes the name `name` from `parent` (`rmdir` when `dir`).
    pub fn remove(&mut self, parent: u64, name: &OsStr, dir: bool) -> Result<(), Errno> {
        self.check()?;
        let ino = *self.dir(parent)?.cur.get(name).ok_or(libc::ENOENT)?;
        match (&self.inode(ino)?.kind, dir) {
            (Kind::Dir(d), true) if !d.cur.is_empty() => return Err(libc::ENOTEMPTY),
            (Kind::Dir(_), true) | (Kind::File(_), false) => {}
            (Kind::Dir(_), false) => return Err(libc::EISDIR),
            (Kind::File(_), true) => return Err(libc::ENOTDIR),
        }
        self.dir_mut(parent)?.cur.remove(name);
        self.unlinked(ino);
        self.touch(parent);
        Ok(())
    }

    fn unlinked(&mut self, ino: u64) {
        if let Some(i) = self.inodes.get_mut(&ino) {
            i.links_cur = i.links_cur.saturating_sub(1);
            i.ctime = now();
        }
        self.collect(ino);
    }

    /// Renames `parent/name` to `new_parent/new_name`, replacing what is there (a file, or an
    /// empty directory). `RENAME_NOREPLACE` refuses to replace; `RENAME_EXCHANGE` is refused.
    pub fn rename(
        &mut self,
        parent: u64,
        name: &OsStr,
        new_parent: u64,
        new_name: &OsStr,
        flags: u32,
    ) -> Result<(), Errno> {
        self.check()?;
        if flags & libc::RENAME_EXCHANGE != 0 {
            return Err(libc::EINVAL);
        }
        let ino = *self.dir(parent)?.cur.get(name).ok_or(libc::ENOENT)?;
        let moving_dir = matches!(self.inode(ino)?.kind, Kind::Dir(_));
        let replaced = self.dir(new_parent)?.cur.get(new_name).copied();
        if let Some(old) = replaced {
            if old == ino {
                return Ok(());
            }
            if flags & libc::RENAME_NOREPLACE != 0 {
                return Err(libc::EEXIST);
            }
            match (&self.inode(old)?.kind, moving_dir) {
                (Kind::Dir(d), true) if !d.cur.is_empty() => return Err(libc::ENOTEMPTY),
                (Kind::Dir(_), true) | (Kind::File(_), false) => {}
                (Kind::Dir(_), false) => return Err(libc::EISDIR),
                (Kind::File(_), true) => return Err(libc::ENOTDIR),
            }
        }
        if moving_dir && self.is_ancestor(ino, new_parent) {
            return Err(libc::EINVAL);
        }
        self.stats.renames += 1;
        self.dir_mut(parent)?.cur.remove(name);
        self.dir_mut(new_parent)?.cur.insert(new_name.to_os_string(), ino);
        if let Some(old) = replaced {
            self.unlinked(old);
        }
        self.touch(parent);
        self.touch(new_parent);
        Ok(())
    }

    /// Whether `ancestor` is `ino` or one of the directories above it (current names).
    fn is_ancestor(&self, ancestor: u64, ino: u64) -> bool {
        if ancestor == ino {
            return true;
        }
        let mut seen = BTreeSet::new();
        let mut frontier = vec![ancestor];
        while let Some(d) = frontier.pop() {
            if !seen.insert(d) {
                continue;
            }
            if let Ok(dir) = self.dir(d) {
                for &c in dir.cur.values() {
                    if c == ino {
                        return true;
                    }
                    frontier.push(c);
                }
            }
        }
        false
    }

    /// Entries of directory `ino`, now: name, inode, whether a directory.
    pub fn list(&self, ino: u64) -> Result<Vec<(OsString, u64, bool)>, Errno> {
        self.check()?;
        let d = self.dir(ino)?;
        Ok(d.cur
            .iter()
            .map(|(n, &c)| {
                let is_dir = matches!(self.inodes.get(&c).map(|i| &i.kind), Some(Kind::Dir(_)));
                (n.clone(), c, is_dir)
            })
            .collect())
    }

    /// Reads up to `len` bytes at `offset`.
    pub fn read(&mut self, ino: u64, offset: u64, len: usize) -> Result<Vec<u8>, Errno> {
        self.check()?;
        match &self.inode(ino)?.kind {
            Kind::File(f) => Ok(f.cur.read(offset, len)),
            Kind::Dir(_) => Err(libc::EISDIR),
        }
    }

    /// Writes `data` at `offset` (volatile until the file is synced).
    pub fn write(&mut self, ino: u64, offset: u64, data: &[u8]) -> Result<usize, Errno> {
        self.check()?;
        let f = self.file_mut(ino)?;
        let FileNode { cur, dirty, .. } = f;
        cur.write(offset, data, dirty);
        f.unsynced = true;
        self.stats.writes += 1;
        self.stats.bytes_written += data.len() as u64;
        self.last_write = Some((ino, offset, data.len() as u64));
        self.touch(ino);
        Ok(data.len())
    }

    /// Sets the size (`truncate`, `ftruncate`; volatile until the file is synced).
    pub fn set_size(&mut self, ino: u64, size: u64) -> Result<(), Errno> {
        self.check()?;
        let f = self.file_mut(ino)?;
        let FileNode { cur, dirty, .. } = f;
        cur.set_size(size, dirty);
        f.unsynced = true;
        self.touch(ino);
        Ok(())
    }

    /// Changes attributes other than the size.
    pub fn set_attr(
        &mut self,
        ino: u64,
        perm: Option<u16>,
        uid: Option<u32>,
        gid: Option<u32>,
    ) -> Result<(), Errno> {
        self.check()?;
        let i = self.inode_mut(ino)?;
        if let Some(p) = perm {
            i.perm = p;
        }
        if let Some(u) = uid {
            i.uid = u;
        }
        if let Some(g) = gid {
            i.gid = g;
        }
        i.ctime = now();
        Ok(())
    }

    /// `fallocate`: mode 0 and `KEEP_SIZE` reserve (reads stay zeros; mode 0 extends the size),
    /// `PUNCH_HOLE | KEEP_SIZE` and `ZERO_RANGE` zero the range. Volatile until the file is
    /// synced. Other modes: `EOPNOTSUPP`.
    pub fn fallocate(&mut self, ino: u64, offset: u64, len: u64, mode: i32) -> Result<(), Errno> {
        self.check()?;
        *self.stats.fallocates.entry(mode).or_default() += 1;
        let keep = mode & FALLOC_FL_KEEP_SIZE != 0;
        let f = self.file_mut(ino)?;
        let FileNode { cur, dirty, .. } = f;
        match mode & !FALLOC_FL_KEEP_SIZE {
            0 => {}
            FALLOC_FL_PUNCH_HOLE if keep => cur.zero(offset, len, dirty),
            FALLOC_FL_ZERO_RANGE => cur.zero(offset, len, dirty),
            _ => return Err(libc::EOPNOTSUPP),
        }
        if !keep && offset + len > cur.size {
            cur.size = offset + len;
        }
        f.unsynced = true;
        self.touch(ino);
        Ok(())
    }

    /// `fsync` or `fdatasync` of a file (its data and size), or `fsync` of a directory (its
    /// entries).
    pub fn sync(&mut self, ino: u64) -> Result<(), Errno> {
        self.check()?;
        let i = self.inode_mut(ino)?;
        match &mut i.kind {
            Kind::File(f) => {
                f.sync();
                self.stats.file_syncs += 1;
                if self.last_write.is_some_and(|(w, _, _)| w == ino) {
                    self.last_write = None;
                }
            }
            Kind::Dir(d) => {
                let old = std::mem::replace(&mut d.dur, d.cur.clone());
                self.stats.dir_syncs += 1;
                // Inodes that lost a durable name may be unreachable now.
                for c in old.into_values() {
                    self.collect(c);
                }
            }
        }
        Ok(())
    }

    /// Everything becomes durable (`sync`).
    pub fn sync_all(&mut self) {
        for i in self.inodes.values_mut() {
            match &mut i.kind {
                Kind::File(f) => f.sync(),
                Kind::Dir(d) => d.dur = d.cur.clone(),
            }
        }
        self.last_write = None;
        let all: Vec<u64> = self.inodes.keys().copied().collect();
        for c in all {
            self.collect(c);
        }
    }

    /// Whether a power cut has happened and the file system was not mounted again since.
    pub fn is_frozen(&self) -> bool {
        self.frozen
    }

    /// Power cut: from now on every call fails with `EIO` (the machine is off), and the state is
    /// what the disk holds: see the module docs. `tear_seed`: tear the last unsynced write at
    /// a page boundary chosen by this seed.
    pub fn power_cut(&mut self, tear_seed: Option<u64>) -> CutReport {
        let mut report = CutReport::default();
        self.frozen = true;
        self.stats.cuts += 1;
        let torn = match (tear_seed, self.last_write.take()) {
            (Some(seed), Some((ino, offset, len))) if len > 0 => {
                let first = offset / PAGE_U64;
                let last = (offset + len - 1) / PAGE_U64;
                let pages = last - first + 1;
                let kept = ChaCha8Rng::seed_from_u64(seed).gen_range(0..=pages);
                Some((ino, first, kept, pages))
            }
            _ => None,
        };
        // Durable names, reached from the root.
        let mut reached: BTreeSet<u64> = BTreeSet::new();
        let mut links: HashMap<u64, u32> = HashMap::new();
        let mut frontier = vec![ROOT];
        reached.insert(ROOT);
        links.insert(ROOT, 1);
        while let Some(d) = frontier.pop() {
            let Some(Kind::Dir(dir)) = self.inodes.get(&d).map(|i| &i.kind) else {
                continue;
            };
            let mut entries = dir.dur.clone();
            // A directory reached twice (a rename between directories synced on one side only)
            // keeps its first name: directories have one.
            entries.retain(|_, c| {
                let is_dir = matches!(self.inodes.get(c).map(|i| &i.kind), Some(Kind::Dir(_)));
                !(is_dir && reached.contains(c))
            });
            for &c in entries.values() {
                *links.entry(c).or_default() += 1;
                if reached.insert(c) {
                    frontier.push(c);
                }
            }
            if let Some(Kind::Dir(dir)) = self.inodes.get_mut(&d).map(|i| &mut i.kind) {
                if dir.cur != entries {
                    report.dirs_reverted += 1;
                }
                dir.cur = entries.clone();
                dir.dur = entries;
            }
        }
        let before = self.inodes.len();
        self.inodes.retain(|ino, _| reached.contains(ino));
        report.inodes_dropped = before - self.inodes.len();
        for (&ino, i) in self.inodes.iter_mut() {
            i.links_cur = links.get(&ino).copied().unwrap_or(0);
            i.refs = 0;
            if let Kind::File(f) = &mut i.kind {
                if let Some((t, first, kept, pages)) = torn {
                    if t == ino {
                        // The write's first `kept` pages reached the disk.
                        for p in first..first + kept {
                            match f.cur.pages.get(&p) {
                                Some(page) => {
                                    f.dur.pages.insert(p, page.clone());
                                }
                                None => {
                                    f.dur.pages.remove(&p);
                                }
                            }
                        }
                        let end = ((first + kept) * PAGE_U64).min(f.cur.size);
                        f.dur.size = f.dur.size.max(end);
                        report.torn = Some((ino, kept, pages));
                    }
                }
                if f.unsynced {
                    report.files_reverted += 1;
                }
                f.cur = f.dur.clone();
                f.dirty.clear();
                f.unsynced = false;
            }
        }
        report
    }

    /// After a power cut, the file system is mounted again.
    pub fn thaw(&mut self) {
        self.frozen = false;
        for i in self.inodes.values_mut() {
            i.refs = 0;
        }
    }

    /// Loads a directory tree (the backing directory) as durable content.
    pub fn load(&mut self, dir: &std::path::Path) -> std::io::Result<()> {
        self.load_into(ROOT, dir)?;
        self.sync_all();
        Ok(())
    }

    fn load_into(&mut self, parent: u64, dir: &std::path::Path) -> std::io::Result<()> {
        use std::os::unix::fs::MetadataExt;
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            let meta = entry.metadata()?;
            let perm = (meta.mode() & 0o7777) as u16;
            if !meta.is_dir() && !meta.is_file() {
                continue;
            }
            let attr = self
                .create(
                    parent,
                    &entry.file_name(),
                    meta.is_dir(),
                    perm,
                    meta.uid(),
                    meta.gid(),
                )
                .map_err(std::io::Error::from_raw_os_error)?;
            // Loading is no kernel lookup.
            self.inode_mut(attr.ino)
                .map_err(std::io::Error::from_raw_os_error)?
                .refs = 0;
            if meta.is_dir() {
                self.load_into(attr.ino, &entry.path())?;
            } else {
                let data = std::fs::read(entry.path())?;
                self.write(attr.ino, 0, &data)
                    .map_err(std::io::Error::from_raw_os_error)?;
                self.set_size(attr.ino, meta.len())
                    .map_err(std::io::Error::from_raw_os_error)?;
            }
        }
        Ok(())
    }

    /// Writes the current tree into `dir` (emptied first): what the backing directory holds
    /// after an unmount.
    pub fn store(&self, dir: &std::path::Path) -> std::io::Result<()> {
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            if entry.file_type()?.is_dir() {
                std::fs::remove_dir_all(entry.path())?;
            } else {
                std::fs::remove_file(entry.path())?;
            }
        }
        self.store_from(ROOT, dir)
    }

    fn store_from(&self, ino: u64, dir: &std::path::Path) -> std::io::Result<()> {
        use std::io::{Seek, SeekFrom, Write};
        use std::os::unix::fs::PermissionsExt;
        let Ok(d) = self.dir(ino) else { return Ok(()) };
        for (name, &c) in &d.cur {
            let path = dir.join(name);
            let Some(i) = self.inodes.get(&c) else { continue };
            match &i.kind {
                Kind::Dir(_) => {
                    std::fs::create_dir(&path)?;
                    self.store_from(c, &path)?;
                }
                Kind::File(f) => {
                    let mut out = std::fs::File::create(&path)?;
                    for (&p, page) in &f.cur.pages {
                        let start = p * PAGE_U64;
                        if start >= f.cur.size {
                            break;
                        }
                        let n = (f.cur.size - start).min(PAGE_U64) as usize;
                        out.seek(SeekFrom::Start(start))?;
                        out.write_all(&page[..n])?;
                    }
                    out.set_len(f.cur.size)?;
                }
            }
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(u32::from(i.perm)))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> &OsStr {
        OsStr::new(s)
    }

    fn file(m: &mut Model, parent: u64, n: &str) -> u64 {
        m.create(parent, name(n), false, 0o644, 0, 0).unwrap().ino
    }

    fn cut(m: &mut Model, tear: Option<u64>) -> CutReport {
        let r = m.power_cut(tear);
        m.thaw();
        r
    }

    fn exists(m: &mut Model, parent: u64, n: &str) -> Option<u64> {
        m.lookup(parent, name(n)).ok().map(|a| a.ino)
    }

    #[test]
    fn unsynced_data_and_names_are_lost_synced_ones_kept() {
        let mut m = Model::new();
        let a = file(&mut m, ROOT, "a");
        m.write(a, 0, b"hello").unwrap();
        let r = cut(&mut m, None);
        assert_eq!(exists(&mut m, ROOT, "a"), None, "{r:?}");

        let a = file(&mut m, ROOT, "a");
        m.sync(ROOT).unwrap();
        m.write(a, 0, b"hello").unwrap();
        cut(&mut m, None);
        let a = exists(&mut m, ROOT, "a").expect("named durably");
        assert_eq!(m.read(a, 0, 100).unwrap(), b"");

        m.write(a, 0, b"hello").unwrap();
        m.sync(a).unwrap();
        m.write(a, 5, b" world").unwrap();
        cut(&mut m, None);
        assert_eq!(m.read(a, 0, 100).unwrap(), b"hello");
    }

    #[test]
    fn a_rename_needs_its_directory_synced() {
        let mut m = Model::new();
        let t = file(&mut m, ROOT, "f.tmp");
        m.write(t, 0, b"new").unwrap();
        m.sync(t).unwrap();
        m.sync(ROOT).unwrap();
        m.rename(ROOT, name("f.tmp"), ROOT, name("f"), 0).unwrap();
        cut(&mut m, None);
        assert!(exists(&mut m, ROOT, "f").is_none());
        let t = exists(&mut m, ROOT, "f.tmp").unwrap();
        assert_eq!(m.read(t, 0, 10).unwrap(), b"new");
        m.rename(ROOT, name("f.tmp"), ROOT, name("f"), 0).unwrap();
        m.sync(ROOT).unwrap();
        cut(&mut m, None);
        assert!(exists(&mut m, ROOT, "f.tmp").is_none());
        let f = exists(&mut m, ROOT, "f").unwrap();
        assert_eq!(m.read(f, 0, 10).unwrap(), b"new");
    }

    #[test]
    fn a_new_directory_needs_its_parent_synced() {
        let mut m = Model::new();
        let d = m.create(ROOT, name("d"), true, 0o755, 0, 0).unwrap().ino;
        let f = file(&mut m, d, "f");
        m.write(f, 0, b"x").unwrap();
        m.sync(f).unwrap();
        m.sync(d).unwrap();
        cut(&mut m, None);
        assert!(exists(&mut m, ROOT, "d").is_none());
    }

    #[test]
    fn unlink_and_truncate_are_undone_unless_synced() {
        let mut m = Model::new();
        let a = file(&mut m, ROOT, "a");
        m.write(a, 0, &[7u8; 10000]).unwrap();
        m.sync(a).unwrap();
        m.sync(ROOT).unwrap();
        m.set_size(a, 100).unwrap();
        m.remove(ROOT, name("a"), false).unwrap();
        m.forget(a, 1);
        cut(&mut m, None);
        let a = exists(&mut m, ROOT, "a").unwrap();
        assert_eq!(m.read(a, 0, 20000).unwrap(), vec![7u8; 10000]);
        m.set_size(a, 100).unwrap();
        m.set_size(a, 5000).unwrap();
        m.sync(a).unwrap();
        cut(&mut m, None);
        let mut want = vec![7u8; 100];
        want.resize(5000, 0);
        assert_eq!(m.read(a, 0, 20000).unwrap(), want);
    }

    #[test]
    fn fallocate_size_is_volatile_and_reads_zeros() {
        let mut m = Model::new();
        let a = file(&mut m, ROOT, "a");
        m.sync(ROOT).unwrap();
        m.fallocate(a, 0, 1 << 20, 0).unwrap();
        assert_eq!(m.attr(a).unwrap().size, 1 << 20);
        m.write(a, 0, &[1u8; 4096]).unwrap();
        cut(&mut m, None);
        assert_eq!(m.attr(a).unwrap().size, 0);
        m.fallocate(a, 0, 1 << 20, 0).unwrap();
        m.write(a, 0, &[1u8; 4096]).unwrap();
        m.sync(a).unwrap();
        m.fallocate(a, 0, 8192, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE)
            .unwrap();
        cut(&mut m, None);
        assert_eq!(m.attr(a).unwrap().size, 1 << 20);
        assert_eq!(m.read(a, 0, 4096).unwrap(), vec![1u8; 4096]);
        assert_eq!(m.read(a, 4096, 4096).unwrap(), vec![0u8; 4096]);
        assert_eq!(m.memory_pages(), 1);
        assert_eq!(m.fallocate(a, 0, 1, 0x8), Err(libc::EOPNOTSUPP));
    }

    #[test]
    fn a_torn_write_keeps_a_page_prefix() {
        let mut kept_counts = BTreeSet::new();
        for seed in 0..40 {
            let mut m = Model::new();
            let a = file(&mut m, ROOT, "a");
            m.sync(ROOT).unwrap();
            m.write(a, 0, &[1u8; 4096]).unwrap();
            m.sync(a).unwrap();
            m.write(a, 4096, &[2u8; 3 * 4096]).unwrap();
            let r = cut(&mut m, Some(seed));
            let (ino, kept, pages) = r.torn.unwrap();
            assert_eq!((ino, pages), (a, 3));
            kept_counts.insert(kept);
            let got = m.read(a, 0, 1 << 20).unwrap();
            let mut want = vec![1u8; 4096];
            want.extend(vec![2u8; kept as usize * 4096]);
            assert_eq!(got, want, "seed {seed}");
        }
        assert_eq!(kept_counts, (0..=3).collect());
    }

    #[test]
    fn after_a_cut_every_call_fails_until_thawed() {
        let mut m = Model::new();
        let a = file(&mut m, ROOT, "a");
        m.sync(ROOT).unwrap();
        m.power_cut(None);
        assert_eq!(m.write(a, 0, b"x"), Err(libc::EIO));
        assert_eq!(m.sync(a), Err(libc::EIO));
        m.thaw();
        assert_eq!(m.write(a, 0, b"x"), Ok(1));
    }

    #[test]
    fn store_and_load_round_trip() {
        let mut m = Model::new();
        let d = m.create(ROOT, name("d"), true, 0o755, 0, 0).unwrap().ino;
        let f = file(&mut m, d, "f");
        m.write(f, 8192, b"tail").unwrap();
        m.set_size(f, 20000).unwrap();
        let dir = tempfile::tempdir().unwrap();
        m.store(dir.path()).unwrap();
        let mut n = Model::new();
        n.load(dir.path()).unwrap();
        let d2 = exists(&mut n, ROOT, "d").unwrap();
        let f2 = exists(&mut n, d2, "f").unwrap();
        assert_eq!(n.read(f2, 0, 1 << 20).unwrap(), m.read(f, 0, 1 << 20).unwrap());
        // Loaded content is durable.
        cut(&mut n, None);
        let d2 = exists(&mut n, ROOT, "d").unwrap();
        assert!(exists(&mut n, d2, "f").is_some());
    }
}
