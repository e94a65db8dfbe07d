//! `strand-lazyfs`: a FUSE file system that forgets, at a simulated power cut, everything that
//! was never made durable, and the power-cut harness that runs Strand on it.
//!
//! The idea is Jepsen's LazyFS: killing a process never loses what it wrote, because the kernel's
//! page cache survives it; only a power cut shows whether an acknowledged write was really on
//! disk. [`LazyFs`] mounts a file system whose every write, create, rename, unlink, truncate and
//! `fallocate` stays volatile until the call that makes it durable under POSIX rules (see
//! [`model`]), and [`LazyFs::power_cut`] drops the rest, optionally tearing the last unsynced
//! write at a page boundary. The tree starts as a copy of a backing directory and is written
//! back there when the file system is unmounted (after a cut: what the disk held).
//!
//! # What the kernel passes to a FUSE file system (Linux 6.18, measured by `tests/bites.rs`)
//!
//! - `write(2)`, `pwrite`, and io_uring writes: `FUSE_WRITE`, before the call returns (the
//!   connection asks for no write-back cache). `O_DIRECT` opens work (no `direct_io` needed):
//!   the kernel passes the flag in `FUSE_OPEN` and sends the writes on. `O_DIRECT` set later
//!   with `fcntl(F_SETFL)`, as glommio sets it, is not passed on (the harness counts the
//!   broker's direct writes from its own metric); the writes arrive all the same. io_uring
//!   operations arrive as the VFS calls they become (a write, an `fsync`, an `fallocate`).
//! - `fsync`/`fdatasync` of a file: `FUSE_FSYNC`; of a directory: `FUSE_FSYNCDIR`.
//! - `fallocate`: `FUSE_FALLOCATE` (modes 0 and `KEEP_SIZE` measured; the model also takes
//!   `PUNCH_HOLE | KEEP_SIZE` and `ZERO_RANGE`, and refuses others with `EOPNOTSUPP`).
//! - `ftruncate`: `FUSE_SETATTR` with the size.
//! - **`syncfs(2)` and `sync(2)` do not reach it**: they return success having made nothing
//!   durable (the kernel's source sends `FUSE_SYNCFS` to virtiofs only; had it sent it here,
//!   the fuser crate, which drops requests it does not know unanswered, would have hung it). A
//!   program that relies on `syncfs` loses data on a FUSE file system at a power cut; Strand's
//!   storage detects one and syncs every file and directory under its data directory instead
//!   (`sync_filesystem_of` in storage/src/fs.rs). Its `syncfs` rounds and checkpoints are
//!   covered by the storage crash simulation (storage/tests/log_store.rs, on `MemFs`).
//! - `RWF_NOWAIT` reads are refused (`EOPNOTSUPP`); Strand detects it and reads through
//!   io_uring instead.
//!
//! The [`harness`] module is the power-cut harness (`strand-lazyfs powercut`).

pub mod harness;
pub mod model;

mod fuse_fs;

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use fuser::{BackgroundSession, Config, MountOption};

pub use model::{CutReport, Stats};

use fuse_fs::LazyFuse;
use model::Model;

/// A mounted lazy file system. Dropping it unmounts it and writes its tree to the backing
/// directory (see [`LazyFs::unmount`]).
pub struct LazyFs {
    model: Arc<Mutex<Model>>,
    backing: PathBuf,
    mountpoint: PathBuf,
    session: Option<BackgroundSession>,
}

fn lock(m: &Mutex<Model>) -> MutexGuard<'_, Model> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl LazyFs {
    /// Mounts the tree of `backing` (all of it durable) at `mountpoint`. Needs `/dev/fuse` and
    /// either root (a direct mount) or `fusermount3`.
    pub fn mount(backing: &Path, mountpoint: &Path) -> io::Result<LazyFs> {
        let mut model = Model::new();
        model.load(backing)?;
        let mut fs = LazyFs {
            model: Arc::new(Mutex::new(model)),
            backing: backing.to_path_buf(),
            mountpoint: mountpoint.to_path_buf(),
            session: None,
        };
        fs.attach()?;
        Ok(fs)
    }

    fn attach(&mut self) -> io::Result<()> {
        let mut config = Config::default();
        config.mount_options = vec![
            MountOption::FSName("strand-lazyfs".into()),
            MountOption::Subtype("lazyfs".into()),
            MountOption::RW,
        ];
        let fs = LazyFuse {
            model: self.model.clone(),
        };
        self.session = Some(fuser::spawn_mount(fs, &self.mountpoint, &config)?);
        Ok(())
    }

    fn detach(&mut self) -> io::Result<()> {
        let Some(session) = self.session.take() else {
            return Ok(());
        };
        // The kernel may still hold files closed a moment ago (their release travels to the
        // file system after close returns): retry a busy unmount for a while. Without root
        // the unmount is refused here and fuser goes through fusermount3 instead.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            match rustix::mount::unmount(&self.mountpoint, rustix::mount::UnmountFlags::empty()) {
                // Unmounted: the session's thread ends (its device reads fail) and is joined.
                // Its last read fails with ENODEV, which fuser takes for the end, or, when the
                // kernel tore the connection down with a request still in flight, with
                // ECONNABORTED: the mount is gone either way (a busy CI machine saw the latter
                // once, under a full CI run).
                Ok(()) => {
                    return match session.join() {
                        Err(e) if e.raw_os_error() == Some(rustix::io::Errno::CONNABORTED.raw_os_error()) => {
                            Ok(())
                        }
                        other => other,
                    }
                }
                Err(rustix::io::Errno::BUSY) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                Err(_) => return session.umount_and_join(),
            }
        }
    }

    /// Where it is mounted.
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// The power goes off now: every later call on the file system fails with `EIO`, and what
    /// was not durable is gone (with `tear_seed`, the last unsynced write is torn at a page
    /// boundary that seed chooses). Stop the programs using it, then [`LazyFs::restart`].
    pub fn power_cut(&self, tear_seed: Option<u64>) -> CutReport {
        lock(&self.model).power_cut(tear_seed)
    }

    /// After a power cut (and once nothing uses the file system): unmounts it, and mounts what
    /// the disk held at the cut in the same place: the machine came back.
    pub fn restart(&mut self) -> io::Result<()> {
        self.detach()?;
        lock(&self.model).thaw();
        self.attach()
    }

    /// Makes everything durable, as `sync(1)` would on a local file system.
    pub fn sync_all(&self) {
        lock(&self.model).sync_all();
    }

    /// Counters of the durability calls seen so far.
    pub fn stats(&self) -> Stats {
        lock(&self.model).stats()
    }

    /// Unmounts, and writes the tree into the backing directory: everything after a clean
    /// unmount (a local file system writes it all back), what the disk held after a power cut
    /// not followed by a restart.
    pub fn unmount(mut self) -> io::Result<()> {
        self.finish()
    }

    fn finish(&mut self) -> io::Result<()> {
        let detached = self.detach();
        let mut model = lock(&self.model);
        if !model.is_frozen() {
            model.sync_all();
        }
        let stored = model.store(&self.backing);
        detached.and(stored)
    }
}

impl Drop for LazyFs {
    fn drop(&mut self) {
        if self.session.is_some() {
            let _ = self.finish();
        }
    }
}
