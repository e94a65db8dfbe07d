//! Small files written durably, many at once.
//!
//! A replica's Raft state beside its log is one small file (`strand_raft`'s side file), written
//! on every vote: appended to, or replaced whole. On its own a replacement costs two syncs (the
//! new content, written to `<name>.tmp`, before it is renamed over the file, and the directory
//! after) and an append one. When thousands of partition groups vote at once (a node of a large
//! cluster stops, and every group it led elects), those syncs are the node's whole disk budget.
//!
//! [`FileReplacer`] group-commits them: the writes asked while a round runs wait for the next
//! round, which writes every temporary file and every append, makes them durable, renames the
//! temporary files, and makes the renames durable. With at least `syncfs_min_files` files a
//! round syncs the file system once or twice (`syncfs`), whatever their number; a smaller round
//! syncs each file (and directory) on its own. A crash at any point leaves a replaced file with
//! its old or its new content (nothing is renamed before the new content is durable), and an
//! appended file with its old content followed by some prefix of the append.
//!
//! Writes to one path land in the order they were asked: two replacements of a path asked for
//! the same round are one (the last), and a path's append waits for the round after any other
//! write of that path queued before it.
//!
//! No task is spawned (the store is runtime-agnostic): the first writer that finds no round
//! running runs rounds until nothing is queued, yielding once before it takes each round so
//! that the writes of tasks already ready join it. A writer whose round is dropped before it
//! answered (its leader was cancelled) queues its write again.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use futures::channel::oneshot;

use crate::fs::{FileHandle, Fs};
use crate::notify::Notify;

/// What a write does to its file.
#[derive(Clone)]
enum Write {
    /// Replace the whole content.
    Replace(Vec<u8>),
    /// Write `data` at byte `at` of the existing file.
    Append { at: u64, data: Vec<u8> },
}

/// The write of each path in a round, and every writer of it waiting for the outcome.
type RoundFiles = BTreeMap<PathBuf, (Write, Vec<oneshot::Sender<io::Result<()>>>)>;

/// A write waiting for its round.
struct Queued {
    path: PathBuf,
    write: Write,
    done: oneshot::Sender<io::Result<()>>,
}

/// Group-committed atomic replacement of small files (see the module documentation).
#[derive(Default)]
pub struct FileReplacer {
    queue: RefCell<Vec<Queued>>,
    running: Cell<bool>,
    /// Notified when a round's leader stops (done or dropped).
    leader_gone: Notify,
    rounds: Cell<u64>,
}

impl FileReplacer {
    pub fn new() -> Self {
        Self::default()
    }

    /// Rounds run so far.
    pub fn rounds(&self) -> u64 {
        self.rounds.get()
    }

    /// Durably replaces `path`'s content with `data` (see the module documentation).
    pub async fn replace<F: Fs>(
        &self,
        fs: &F,
        root: &Path,
        syncfs_min_files: usize,
        path: &Path,
        data: Vec<u8>,
    ) -> io::Result<()> {
        self.write(fs, root, syncfs_min_files, path, Write::Replace(data))
            .await
    }

    /// Durably writes `data` at byte `at` of the existing file `path` (see the module
    /// documentation); `at` is the file's length for an append.
    pub async fn append<F: Fs>(
        &self,
        fs: &F,
        root: &Path,
        syncfs_min_files: usize,
        path: &Path,
        at: u64,
        data: Vec<u8>,
    ) -> io::Result<()> {
        self.write(fs, root, syncfs_min_files, path, Write::Append { at, data })
            .await
    }

    async fn write<F: Fs>(
        &self,
        fs: &F,
        root: &Path,
        syncfs_min_files: usize,
        path: &Path,
        write: Write,
    ) -> io::Result<()> {
        loop {
            let (done, answer) = oneshot::channel();
            self.queue.borrow_mut().push(Queued {
                path: path.to_owned(),
                write: write.clone(),
                done,
            });
            let mut answer = answer;
            loop {
                let gone = self.leader_gone.wait();
                if !self.running.get() {
                    self.lead(fs, root, syncfs_min_files).await;
                }
                match futures::future::select(&mut answer, std::pin::pin!(gone)).await {
                    futures::future::Either::Left((Ok(outcome), _)) => return outcome,
                    // Taken by a round whose leader was dropped: queue it again.
                    futures::future::Either::Left((Err(oneshot::Canceled), _)) => break,
                    // The leader stopped: lead, if ours is still queued.
                    futures::future::Either::Right(((), _)) => {}
                }
            }
        }
    }

    /// Runs rounds until nothing is queued.
    async fn lead<F: Fs>(&self, fs: &F, root: &Path, syncfs_min_files: usize) {
        self.running.set(true);
        let _gone = LeaderGuard(self);
        loop {
            // Let the tasks already ready run first: the writes they ask join this round.
            futures_lite::future::yield_now().await;
            let queued = std::mem::take(&mut *self.queue.borrow_mut());
            if queued.is_empty() {
                return;
            }
            let (round, later) = split_round(queued);
            // What waits for the next round goes before what is asked meanwhile.
            self.queue.borrow_mut().splice(0..0, later);
            self.rounds.set(self.rounds.get() + 1);
            round_of(fs, root, syncfs_min_files, round).await;
        }
    }
}

/// Marks the round's leader gone, however it stops.
struct LeaderGuard<'a>(&'a FileReplacer);

impl Drop for LeaderGuard<'_> {
    fn drop(&mut self) {
        self.0.running.set(false);
        self.0.leader_gone.notify_all();
    }
}

/// The writes of the next round, one per path (the last of consecutive replacements), and
/// those that wait for a later one: every write of a path after one that cannot join it.
fn split_round(queued: Vec<Queued>) -> (RoundFiles, Vec<Queued>) {
    let mut files = RoundFiles::new();
    let mut later: Vec<Queued> = Vec::new();
    for q in queued {
        if later.iter().any(|l| l.path == q.path) {
            later.push(q);
            continue;
        }
        match files.get_mut(&q.path) {
            None => {
                files.insert(q.path, (q.write, vec![q.done]));
            }
            Some(entry) => match (&entry.0, &q.write) {
                (Write::Replace(_), Write::Replace(_)) => {
                    entry.0 = q.write;
                    entry.1.push(q.done);
                }
                _ => later.push(q),
            },
        }
    }
    (files, later)
}

/// One round: each path's write is made; every writer of it gets the outcome.
async fn round_of<F: Fs>(fs: &F, root: &Path, syncfs_min_files: usize, files: RoundFiles) {
    let outcomes: Vec<io::Result<()>> = if files.len() >= syncfs_min_files.max(1) {
        write_with_syncfs(fs, root, &files).await
    } else {
        let mut out = Vec::with_capacity(files.len());
        for (path, (write, _)) in &files {
            out.push(match write {
                Write::Replace(data) => fs.write_file_atomic(path, data.clone()).await,
                Write::Append { at, data } => match write_at(fs, path, *at, data).await {
                    Ok(f) => f.fdatasync().await,
                    Err(e) => Err(e),
                },
            });
        }
        out
    };
    for ((_, (_, waiters)), outcome) in files.into_iter().zip(outcomes) {
        for w in waiters {
            let _ = w.send(outcome.as_ref().map(|_| ()).map_err(copy));
        }
    }
}

/// Writes `data` at `at` of the existing file `path`, without syncing.
async fn write_at<F: Fs>(fs: &F, path: &Path, at: u64, data: &[u8]) -> io::Result<F::File> {
    let f = fs.open(path, false).await?;
    f.write_all_at(data.to_vec(), at).await?;
    Ok(f)
}

/// One error for each of several waiters (`io::Error` is not `Clone`).
fn copy(e: &io::Error) -> io::Error {
    io::Error::new(e.kind(), e.to_string())
}

/// Writes every temporary file and append, syncs the file system, renames, and syncs again if
/// it renamed anything.
async fn write_with_syncfs<F: Fs>(fs: &F, root: &Path, files: &RoundFiles) -> Vec<io::Result<()>> {
    let written = futures::future::join_all(files.iter().map(|(path, (write, _))| async move {
        match write {
            Write::Replace(data) => {
                let (f, tmp) = fs.write_tmp_file(path, data.clone()).await?;
                drop::<F::File>(f);
                Ok::<Option<PathBuf>, io::Error>(Some(tmp))
            }
            Write::Append { at, data } => {
                drop::<F::File>(write_at(fs, path, *at, data).await?);
                Ok(None)
            }
        }
    }))
    .await;
    if let Err(e) = fs.sync_filesystem(root).await {
        return written.iter().map(|_| Err(copy(&e))).collect();
    }
    let mut renamed = Vec::with_capacity(written.len());
    let mut any_renamed = false;
    for ((path, _), tmp) in files.iter().zip(written) {
        renamed.push(match tmp {
            Ok(Some(tmp)) => {
                any_renamed = true;
                fs.rename(&tmp, path).await.map(|()| true)
            }
            Ok(None) => Ok(false),
            Err(e) => Err(e),
        });
    }
    if any_renamed {
        if let Err(e) = fs.sync_filesystem(root).await {
            // The appends were durable at the first sync.
            return renamed
                .into_iter()
                .map(|r| match r {
                    Ok(true) => Err(copy(&e)),
                    other => other.map(drop),
                })
                .collect();
        }
    }
    renamed.into_iter().map(|r| r.map(drop)).collect()
}

#[cfg(test)]
mod tests {
    use std::rc::Rc;

    use futures_lite::future;

    use super::*;
    use crate::fs_mem::MemFs;

    /// A file system with an empty `/data`.
    fn data_dir() -> (MemFs, PathBuf) {
        let fs = MemFs::new();
        let root = PathBuf::from("/data");
        future::block_on(fs.create_dir_all(&root)).expect("dir");
        (fs, root)
    }

    /// `n` files under `root`, each written (one at a time) to hold `old`.
    fn files_holding_old(fs: &MemFs, root: &Path, replacer: &FileReplacer, n: usize) -> Vec<PathBuf> {
        let paths: Vec<PathBuf> = (0..n).map(|i| root.join(format!("f{i}"))).collect();
        for p in &paths {
            future::block_on(replacer.replace(fs, root, 1, p, b"old".to_vec())).expect("written");
        }
        paths
    }

    fn read(fs: &MemFs, path: &Path) -> Vec<u8> {
        future::block_on(fs.read_file(path)).expect("readable").to_vec()
    }

    #[test]
    fn writes_asked_together_share_one_round_and_survive_a_crash() {
        let (fs, root) = data_dir();
        future::block_on(fs.create_dir_all(&root.join("p"))).expect("dir");
        let replacer = Rc::new(FileReplacer::new());
        let paths: Vec<PathBuf> = (0..20).map(|i| root.join("p").join(format!("f{i}"))).collect();
        let syncs_before = fs.fsync_count();
        let writes = paths.iter().enumerate().map(|(i, p)| {
            let (fs, root, r) = (&fs, &root, Rc::clone(&replacer));
            async move { r.replace(fs, root, 4, p, vec![i as u8; 8]).await }
        });
        let outcomes = future::block_on(futures::future::join_all(writes));
        assert!(outcomes.iter().all(Result::is_ok), "{outcomes:?}");
        assert_eq!(replacer.rounds(), 1, "one round for writes asked together");
        assert_eq!(
            fs.fsync_count(),
            syncs_before,
            "no per-file syncs past the threshold"
        );
        fs.crash(|_| 0);
        for (i, p) in paths.iter().enumerate() {
            assert_eq!(read(&fs, p), vec![i as u8; 8], "{}", p.display());
        }
    }

    #[test]
    fn the_last_write_of_a_path_wins_and_a_small_round_syncs_per_file() {
        let (fs, root) = data_dir();
        let replacer = FileReplacer::new();
        let path = root.join("side");
        let writes = (0..3u8).map(|v| replacer.replace(&fs, &root, 16, &path, vec![v]));
        let outcomes = future::block_on(futures::future::join_all(writes));
        assert!(outcomes.iter().all(Result::is_ok));
        assert_eq!(read(&fs, &path), vec![2]);
        assert!(
            fs.fsync_count() > 0,
            "below the threshold a file is synced on its own"
        );
        fs.crash(|_| 0);
        assert_eq!(read(&fs, &path), vec![2]);
    }

    #[test]
    fn appends_share_a_round_with_replacements_and_survive_a_crash() {
        let (fs, root) = data_dir();
        let replacer = FileReplacer::new();
        let paths = files_holding_old(&fs, &root, &replacer, 8);
        let rounds = replacer.rounds();
        let syncs_before = fs.fsync_count();
        let writes = paths.iter().enumerate().map(|(i, p)| {
            let replacer = &replacer;
            let (fs, root) = (&fs, &root);
            async move {
                if i % 2 == 0 {
                    replacer.append(fs, root, 4, p, 3, b"+new".to_vec()).await
                } else {
                    replacer.replace(fs, root, 4, p, b"new".to_vec()).await
                }
            }
        });
        let outcomes = future::block_on(futures::future::join_all(writes));
        assert!(outcomes.iter().all(Result::is_ok), "{outcomes:?}");
        assert_eq!(replacer.rounds(), rounds + 1, "one round");
        assert_eq!(fs.fsync_count(), syncs_before, "synced by syncfs");
        fs.crash(|_| 0);
        for (i, p) in paths.iter().enumerate() {
            let want: &[u8] = if i % 2 == 0 { b"old+new" } else { b"new" };
            assert_eq!(read(&fs, p), want.to_vec(), "{}", p.display());
        }
    }

    #[test]
    fn a_paths_writes_land_in_order_and_a_small_round_syncs_its_append() {
        let (fs, root) = data_dir();
        let replacer = FileReplacer::new();
        let path = root.join("side");
        let writes = vec![
            replacer.replace(&fs, &root, 16, &path, b"ab".to_vec()),
            replacer.replace(&fs, &root, 16, &path, b"a".to_vec()),
        ];
        let append = replacer.append(&fs, &root, 16, &path, 1, b"bc".to_vec());
        let (outcomes, appended) =
            future::block_on(futures::future::join(futures::future::join_all(writes), append));
        assert!(outcomes.iter().all(Result::is_ok) && appended.is_ok());
        assert_eq!(
            replacer.rounds(),
            2,
            "the append waits for the round after the replacements"
        );
        let syncs = fs.fsync_count();
        future::block_on(replacer.append(&fs, &root, 16, &path, 3, b"d".to_vec())).expect("appended");
        assert!(
            fs.fsync_count() > syncs,
            "below the threshold an append is synced on its own"
        );
        fs.crash(|_| 0);
        assert_eq!(read(&fs, &path), b"abcd".to_vec());
    }

    #[test]
    fn an_append_to_a_missing_file_fails() {
        let (fs, root) = data_dir();
        let replacer = FileReplacer::new();
        let missing = root.join("missing");
        assert!(future::block_on(replacer.append(&fs, &root, 1, &missing, 0, b"x".to_vec())).is_err());
        assert!(future::block_on(replacer.append(&fs, &root, 16, &missing, 0, b"x".to_vec())).is_err());
    }

    #[test]
    fn a_write_whose_leader_is_dropped_leads_its_own_round() {
        let (fs, root) = data_dir();
        let replacer = FileReplacer::new();
        let (a, b) = (root.join("a"), root.join("b"));
        let mut leader = Box::pin(replacer.replace(&fs, &root, 1, &a, b"a".to_vec()));
        assert!(
            future::block_on(future::poll_once(&mut leader)).is_none(),
            "leading, yielded"
        );
        let mut follower = Box::pin(replacer.replace(&fs, &root, 1, &b, b"b".to_vec()));
        assert!(
            future::block_on(future::poll_once(&mut follower)).is_none(),
            "waiting"
        );
        drop(leader);
        future::block_on(follower).expect("written by its own round");
        assert_eq!(read(&fs, &b), b"b".to_vec());
    }

    #[test]
    fn a_failed_sync_fails_the_round_and_keeps_the_old_content() {
        let (fs, root) = data_dir();
        let replacer = FileReplacer::new();
        let paths = files_holding_old(&fs, &root, &replacer, 4);
        fs.set_fail_fsync(true);
        let writes = paths
            .iter()
            .map(|p| replacer.replace(&fs, &root, 1, p, b"new".to_vec()));
        let outcomes = future::block_on(futures::future::join_all(writes));
        assert!(outcomes.iter().all(Result::is_err), "{outcomes:?}");
        let appends = paths
            .iter()
            .map(|p| replacer.append(&fs, &root, 1, p, 3, b"+new".to_vec()));
        let outcomes = future::block_on(futures::future::join_all(appends));
        assert!(outcomes.iter().all(Result::is_err), "{outcomes:?}");
        fs.set_fail_fsync(false);
        fs.crash(|_| 0);
        for p in &paths {
            assert_eq!(
                read(&fs, p),
                b"old".to_vec(),
                "nothing renamed before its sync, no append kept unsynced"
            );
        }
    }
}
