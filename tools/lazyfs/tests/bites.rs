//! The lazy file system bites: a program that writes without `fsync` loses its data at a power
//! cut, one that syncs keeps it; and what the kernel passes to a FUSE file system, measured.
//!
//! These tests mount FUSE file systems, so they need `/dev/fuse` and root (or `fusermount3`,
//! Debian's `fuse3`, which the test command installs). Without them they fail, saying so: a
//! durability tool whose own test quietly skipped would prove nothing.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::process::Command;

use strand_lazyfs::LazyFs;

struct Mounted {
    fs: LazyFs,
    _dir: tempfile::TempDir,
}

fn mount() -> Mounted {
    assert!(
        Path::new("/dev/fuse").exists(),
        "/dev/fuse is missing: these tests need FUSE (a kernel with it, and /dev/fuse in this container)"
    );
    let dir = tempfile::tempdir().unwrap();
    let backing = dir.path().join("backing");
    let mnt = dir.path().join("mnt");
    fs::create_dir(&backing).unwrap();
    fs::create_dir(&mnt).unwrap();
    let fs = LazyFs::mount(&backing, &mnt).unwrap_or_else(|e| {
        panic!("mounting the lazy file system failed ({e}): these tests need /dev/fuse and root, or fusermount3 (Debian: apt-get install fuse3)")
    });
    Mounted { fs, _dir: dir }
}

fn sh(script: &str, dir: &Path) {
    let out = Command::new("sh")
        .arg("-c")
        .arg(script)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn cut(m: &mut Mounted) {
    let report = m.fs.power_cut(None);
    eprintln!("cut: {report:?}");
    m.fs.restart().unwrap();
}

#[test]
fn a_program_that_does_not_sync_loses_its_data_one_that_does_keeps_it() {
    let mut m = mount();
    let mnt = m.fs.mountpoint().to_path_buf();
    // coreutils `sync FILE...` fsyncs each file (a directory too).
    sh("printf unsynced > lost; printf synced > kept; sync kept .", &mnt);
    sh("printf 'more, never synced' >> kept", &mnt);
    assert_eq!(fs::read(mnt.join("lost")).unwrap(), b"unsynced");
    assert_eq!(fs::read(mnt.join("kept")).unwrap(), b"syncedmore, never synced");
    cut(&mut m);
    // `lost`'s name was made durable by the directory sync, its data never was.
    assert_eq!(fs::read(mnt.join("lost")).unwrap(), b"");
    assert_eq!(fs::read(mnt.join("kept")).unwrap(), b"synced");

    // A name needs its directory synced: a file synced, its directory not, is gone.
    sh("mkdir d; sync .; printf x > d/f; sync d/f", &mnt);
    cut(&mut m);
    assert!(mnt.join("d").is_dir());
    assert!(!mnt.join("d/f").exists());

    // The atomic-replace idiom: write a temporary file, sync it, rename, sync the directory.
    sh(
        "printf v1 > cfg; sync cfg .; printf v2 > cfg.tmp; sync cfg.tmp; mv cfg.tmp cfg",
        &mnt,
    );
    cut(&mut m);
    assert_eq!(
        fs::read(mnt.join("cfg")).unwrap(),
        b"v1",
        "the rename was never synced"
    );
    sh("printf v2 > cfg.tmp; sync cfg.tmp; mv cfg.tmp cfg; sync .", &mnt);
    cut(&mut m);
    assert_eq!(fs::read(mnt.join("cfg")).unwrap(), b"v2");
    assert!(!mnt.join("cfg.tmp").exists());
}

#[test]
fn syncfs_and_sync_do_not_reach_a_fuse_file_system() {
    let mut m = mount();
    let mnt = m.fs.mountpoint().to_path_buf();
    // The name is made durable; the data only by `syncfs` (`sync -f`) and `sync(2)`, which
    // return success. Had the kernel sent FUSE_SYNCFS, which the fuser crate does not answer,
    // `sync -f` would hang here instead.
    sh("printf data > f; sync .; sync -f f; sync", &mnt);
    let before = m.fs.stats();
    assert_eq!((before.file_syncs, before.dir_syncs), (0, 1), "{before:?}");
    cut(&mut m);
    assert_eq!(
        fs::read(mnt.join("f")).unwrap(),
        b"",
        "syncfs made the data durable: the kernel now passes it to FUSE; update the crate docs and storage's fallback"
    );
}

/// Strand's storage makes many logs durable at once with `syncfs`; on a FUSE file system,
/// where `syncfs` does nothing, it must sync the tree under its root instead.
#[test]
fn strand_storage_file_system_sync_is_durable_on_fuse() {
    use strand_storage::fs::{block_on, Fs, StdFs};
    let mut m = mount();
    let mnt = m.fs.mountpoint().to_path_buf();
    let root = mnt.join("data");
    fs::create_dir(&root).unwrap();
    File::open(&mnt).unwrap().sync_all().unwrap();
    fs::create_dir_all(root.join("topic-0")).unwrap();
    fs::write(root.join("topic-0/00000000000000000000.log"), b"acknowledged").unwrap();
    fs::write(root.join("top"), b"level").unwrap();
    block_on(StdFs.sync_filesystem(&root)).unwrap();
    cut(&mut m);
    assert_eq!(
        fs::read(root.join("topic-0/00000000000000000000.log"))
            .ok()
            .as_deref(),
        Some(&b"acknowledged"[..]),
        "what sync_filesystem returned for was lost at the power cut"
    );
    assert_eq!(fs::read(root.join("top")).unwrap(), b"level");
}

#[test]
fn fdatasync_after_o_direct_writes_and_fallocate_keeps_them() {
    let mut m = mount();
    let mnt = m.fs.mountpoint().to_path_buf();
    let path = mnt.join("seg");
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .custom_flags(libc::O_DIRECT)
        .open(&path)
        .expect("O_DIRECT opens work on the lazy file system");
    File::open(&mnt).unwrap().sync_all().unwrap();
    // Preallocate (keeping the size), write into it directly from an aligned buffer, sync.
    rustix::fs::fallocate(&f, rustix::fs::FallocateFlags::KEEP_SIZE, 0, 1 << 20).unwrap();
    let mut buf = AlignedPage::default();
    buf.0.fill(0xab);
    f.write_all_at(&buf.0, 0).unwrap();
    f.sync_data().unwrap();
    f.write_all_at(&buf.0, 4096).unwrap();
    rustix::fs::fallocate(&f, rustix::fs::FallocateFlags::empty(), 0, 3 * 4096).unwrap();
    let stats = m.fs.stats();
    assert_eq!(stats.direct_opens, 1, "{stats:?}");
    assert_eq!(
        stats.fallocates.get(&libc::FALLOC_FL_KEEP_SIZE),
        Some(&1),
        "{stats:?}"
    );
    assert_eq!(stats.fallocates.get(&0), Some(&1), "{stats:?}");
    assert_eq!(fs::metadata(&path).unwrap().len(), 3 * 4096);

    // RWF_NOWAIT reads: FUSE refuses them.
    let mut page = AlignedPage::default();
    let nowait = rustix::io::preadv2(
        &f,
        &mut [std::io::IoSliceMut::new(&mut page.0)],
        0,
        rustix::io::ReadWriteFlags::NOWAIT,
    );
    eprintln!("RWF_NOWAIT read on FUSE: {nowait:?}");
    assert_eq!(nowait, Err(rustix::io::Errno::OPNOTSUPP), "update the crate docs");
    drop(f);

    cut(&mut m);
    let data = fs::read(&path).unwrap();
    assert_eq!(data.len(), 4096, "the size as of the last fdatasync");
    assert!(data.iter().all(|&b| b == 0xab));
}

#[test]
fn a_torn_write_keeps_a_page_prefix_of_the_last_unsynced_write() {
    let mut m = mount();
    let mnt = m.fs.mountpoint().to_path_buf();
    let mut f = File::create(mnt.join("log")).unwrap();
    File::open(&mnt).unwrap().sync_all().unwrap();
    f.write_all(&[1u8; 4096]).unwrap();
    f.sync_data().unwrap();
    f.write_all(&[2u8; 8 * 4096]).unwrap();
    drop(f);
    let report = m.fs.power_cut(Some(3));
    m.fs.restart().unwrap();
    let (_, kept, pages) = report.torn.expect("the last write was torn");
    assert_eq!(pages, 8);
    let data = fs::read(mnt.join("log")).unwrap();
    let mut want = vec![1u8; 4096];
    want.extend(vec![2u8; kept as usize * 4096]);
    assert_eq!(data, want);
}

#[test]
fn an_unmount_writes_the_tree_back_and_a_mount_reads_it() {
    let dir = tempfile::tempdir().unwrap();
    let backing = dir.path().join("backing");
    let mnt = dir.path().join("mnt");
    fs::create_dir_all(backing.join("sub")).unwrap();
    fs::create_dir(&mnt).unwrap();
    fs::write(backing.join("sub/old"), b"old").unwrap();
    let fs = LazyFs::mount(&backing, &mnt).expect("mount (needs /dev/fuse and root, or fusermount3)");
    assert_eq!(fs::read(mnt.join("sub/old")).unwrap(), b"old");
    fs::write(mnt.join("new"), b"new").unwrap();
    fs.unmount().unwrap();
    assert_eq!(fs::read(backing.join("new")).unwrap(), b"new");
    assert_eq!(fs::read(backing.join("sub/old")).unwrap(), b"old");
}

#[repr(C, align(4096))]
struct AlignedPage([u8; 4096]);

impl Default for AlignedPage {
    fn default() -> Self {
        AlignedPage([0; 4096])
    }
}
