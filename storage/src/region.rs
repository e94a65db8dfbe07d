//! File regions: bytes of a segment file a connection sends as they are (`sendfile`), each
//! holding a duplicate descriptor, and the process-wide bound on how many are alive at once.

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Bytes of a segment file to send to a client as they are (`sendfile`), from the file's own
/// descriptor: whole batches, below the high watermark, so never rewritten while a client may
/// still be sent them: appends only add after the end, retention and topic deletion unlink
/// whole files (the descriptor keeps the bytes readable), and a truncation cuts only above what
/// clients could read (see [`crate::ShardStore::truncate_log`]). Regions alive at once are bounded
/// process-wide ([`FileRegions`]), so that they never take the descriptors segments and
/// connections need.
#[derive(Debug)]
pub struct FileRegion {
    pub fd: OwnedFd,
    pub pos: u64,
    pub len: usize,
    _slot: RegionSlot,
}

/// The bound on [`FileRegion`]s alive at once. One for the whole process, created at start-up
/// and shared by every shard's file system: the bound is on the process's descriptors. A region
/// may be dropped on any thread (the one that sends it), so the bound lives as long as the
/// process ([`FileRegions::for_process`]).
#[derive(Debug)]
pub struct FileRegions {
    alive: AtomicUsize,
    max: usize,
}

/// One region's place within its [`FileRegions`], given back on drop.
#[derive(Debug)]
pub(crate) struct RegionSlot(&'static FileRegions);

impl Drop for RegionSlot {
    fn drop(&mut self) {
        self.0.alive.fetch_sub(1, Ordering::AcqRel);
    }
}

impl FileRegion {
    /// The region of `len` bytes at `pos` of `fd`, in the place `slot` holds.
    pub(crate) fn in_slot(fd: OwnedFd, pos: u64, len: usize, slot: RegionSlot) -> FileRegion {
        FileRegion {
            fd,
            pos,
            len,
            _slot: slot,
        }
    }
}

impl FileRegions {
    /// A bound of `max` regions alive at once, living until the process exits. Create one per
    /// process (or per test).
    pub fn for_process(max: usize) -> &'static FileRegions {
        Box::leak(Box::new(FileRegions {
            alive: AtomicUsize::new(0),
            max,
        }))
    }

    /// The broker's bound: a sixteenth of the open-files limit, between 16 and 4,096. Past it,
    /// reads copy their bytes.
    pub fn open_files_share() -> usize {
        let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile).current;
        limit.map_or(4096, |n| usize::try_from(n / 16).unwrap_or(4096).clamp(16, 4096))
    }

    /// A region of `len` bytes at `pos` of `fd`, if fewer than [`FileRegions::max`] are alive.
    pub fn region(&'static self, fd: OwnedFd, pos: u64, len: usize) -> Option<FileRegion> {
        self.slot().map(|slot| FileRegion::in_slot(fd, pos, len, slot))
    }

    /// A place for one more region, if fewer than [`FileRegions::max`] are alive; taken before
    /// the region's descriptor is duplicated.
    pub(crate) fn slot(&'static self) -> Option<RegionSlot> {
        self.alive
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max).then_some(n + 1)
            })
            .ok()
            .map(|_| RegionSlot(self))
    }

    /// Most regions alive at once.
    pub fn max(&self) -> usize {
        self.max
    }

    /// Regions alive now.
    pub fn alive(&self) -> usize {
        self.alive.load(Ordering::Acquire)
    }
}
