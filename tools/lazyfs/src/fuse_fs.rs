//! The FUSE side: each kernel request becomes one call on the [`Model`].
//!
//! Files are opened without `FOPEN_DIRECT_IO` or `FOPEN_KEEP_CACHE`, and the connection does
//! not ask for the kernel's write-back cache: every `write(2)` reaches [`Model::write`] before
//! it returns (an `O_DIRECT` one straight from the caller's buffer, a buffered one through the
//! page cache, written through), so the model sees every write in the order the application
//! made it, and `fsync` finds nothing left in the kernel to write back.

use std::ffi::OsStr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, KernelConfig,
    LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};

use crate::model::{Attr, Model};

/// How long the kernel may cache names and attributes: only this file system changes them,
/// through the kernel, which keeps its caches right.
const TTL: Duration = Duration::from_secs(1);

/// The largest write the kernel is asked to send in one request.
const MAX_WRITE: u32 = 1 << 20;

pub(crate) struct LazyFuse {
    pub(crate) model: Arc<Mutex<Model>>,
}

fn lock(m: &Mutex<Model>) -> MutexGuard<'_, Model> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn errno(e: i32) -> Errno {
    Errno::from_i32(e)
}

fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.size.div_ceil(512),
        atime: a.atime,
        mtime: a.mtime,
        ctime: a.ctime,
        crtime: a.ctime,
        kind: if a.is_dir {
            FileType::Directory
        } else {
            FileType::RegularFile
        },
        perm: a.perm,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

fn reply_entry(r: Result<Attr, i32>, reply: ReplyEntry) {
    match r {
        Ok(a) => reply.entry(&TTL, &file_attr(&a), Generation(0)),
        Err(e) => reply.error(errno(e)),
    }
}

fn reply_attr(r: Result<Attr, i32>, reply: ReplyAttr) {
    match r {
        Ok(a) => reply.attr(&TTL, &file_attr(&a)),
        Err(e) => reply.error(errno(e)),
    }
}

fn reply_opened(r: Result<(), i32>, reply: ReplyOpen) {
    match r {
        Ok(()) => reply.opened(FileHandle(0), FopenFlags::empty()),
        Err(e) => reply.error(errno(e)),
    }
}

fn reply_empty(r: Result<(), i32>, reply: ReplyEmpty) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(errno(e)),
    }
}

impl Filesystem for LazyFuse {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Larger writes than the 128 KiB default, as far as the kernel allows.
        let _ = config.set_max_write(MAX_WRITE);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        reply_entry(lock(&self.model).lookup(parent.0, name), reply);
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        lock(&self.model).forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        reply_attr(lock(&self.model).attr(ino.0), reply);
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut m = lock(&self.model);
        let r = (|| {
            if let Some(size) = size {
                m.set_size(ino.0, size)?;
            }
            if mode.is_some() || uid.is_some() || gid.is_some() {
                m.set_attr(ino.0, mode.map(|m| (m & 0o7777) as u16), uid, gid)?;
            }
            m.attr(ino.0)
        })();
        reply_attr(r, reply);
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        if mode & libc::S_IFMT != libc::S_IFREG {
            reply.error(Errno::EPERM);
            return;
        }
        let perm = (mode & !umask & 0o7777) as u16;
        reply_entry(
            lock(&self.model).create(parent.0, name, false, perm, req.uid(), req.gid()),
            reply,
        );
    }

    fn mkdir(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        let perm = (mode & !umask & 0o7777) as u16;
        reply_entry(
            lock(&self.model).create(parent.0, name, true, perm, req.uid(), req.gid()),
            reply,
        );
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply_empty(lock(&self.model).remove(parent.0, name, false), reply);
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply_empty(lock(&self.model).remove(parent.0, name, true), reply);
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        reply_empty(
            lock(&self.model).rename(parent.0, name, newparent.0, newname, flags.bits()),
            reply,
        );
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        reply_opened(lock(&self.model).open(ino.0, flags.0), reply);
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match lock(&self.model).read(ino.0, offset, size as usize) {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match lock(&self.model).write(ino.0, offset, data) {
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // close(2) makes nothing durable.
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        lock(&self.model).release(ino.0);
        reply.ok();
    }

    fn fsync(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        reply_empty(lock(&self.model).sync(ino.0), reply);
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        reply_opened(lock(&self.model).open(ino.0, flags.0), reply);
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let entries = match lock(&self.model).list(ino.0) {
            Ok(e) => e,
            Err(e) => {
                reply.error(errno(e));
                return;
            }
        };
        let dots = [
            (OsStr::new(".").to_os_string(), ino.0, true),
            (OsStr::new("..").to_os_string(), ino.0, true),
        ];
        for (i, (name, child, is_dir)) in dots.into_iter().chain(entries).enumerate().skip(offset as usize) {
            let kind = if is_dir {
                FileType::Directory
            } else {
                FileType::RegularFile
            };
            if reply.add(INodeNo(child), i as u64 + 1, kind, &name) {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(&self, req: &Request, ino: INodeNo, fh: FileHandle, flags: OpenFlags, reply: ReplyEmpty) {
        self.release(req, ino, fh, flags, None, false, reply);
    }

    /// A directory's entries become durable (the model tells files and directories apart).
    fn fsyncdir(&self, req: &Request, ino: INodeNo, fh: FileHandle, datasync: bool, reply: ReplyEmpty) {
        self.fsync(req, ino, fh, datasync, reply);
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        // A roomy disk: 1 TiB, all free.
        let blocks = 1u64 << 28;
        reply.statfs(blocks, blocks, blocks, 1 << 20, 1 << 20, 4096, 255, 4096);
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        reply.ok();
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let perm = (mode & !umask & 0o7777) as u16;
        let mut m = lock(&self.model);
        let r = m
            .create(parent.0, name, false, perm, req.uid(), req.gid())
            .and_then(|a| m.open(a.ino, flags).map(|()| a));
        match r {
            Ok(a) => reply.created(
                &TTL,
                &file_attr(&a),
                Generation(0),
                FileHandle(0),
                FopenFlags::empty(),
            ),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        reply_empty(lock(&self.model).fallocate(ino.0, offset, length, mode), reply);
    }
}
