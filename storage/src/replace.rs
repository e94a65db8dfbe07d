//! Small files replaced atomically, many at once.
//!
//! A replica's Raft state beside its log is one small file, rewritten whole on every change
//! (`strand_raft`'s side file). Each rewrite on its own costs two syncs: the new content
//! (written to `<name>.tmp`) before it is renamed over the file, and the directory after. When
//! thousands of partition groups vote at once (a node of a large cluster stops, and every group
//! it led elects), those syncs are the node's whole disk budget.
//!
//! [`FileReplacer`] group-commits them: the writes asked while a round runs wait for the next
//! round, which writes every temporary file, makes them durable, renames them all, and makes the
//! renames durable. With at least `syncfs_min_files` files a round syncs the file system twice
//! (`syncfs`), whatever their number; a smaller round syncs each file and directory as a lone
//! replacement does. A crash at any point leaves each file with its old or its new content:
//! nothing is renamed before the new content is durable.
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

use crate::fs::Fs;
use crate::notify::Notify;

/// A path's last content asked in a round, and every writer of it waiting for the outcome.
type RoundFiles = BTreeMap<PathBuf, (Vec<u8>, Vec<oneshot::Sender<io::Result<()>>>)>;

/// A write waiting for its round.
struct Queued {
    path: PathBuf,
    data: Vec<u8>,
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

    /// Durably replaces `path`'s content with `data` (see the module documentation). Writes to
    /// one path land in the order they were asked.
    pub async fn replace<F: Fs>(
        &self,
        fs: &F,
        root: &Path,
        syncfs_min_files: usize,
        path: &Path,
        data: Vec<u8>,
    ) -> io::Result<()> {
        loop {
            let (done, answer) = oneshot::channel();
            self.queue.borrow_mut().push(Queued {
                path: path.to_owned(),
                data: data.clone(),
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
            let round = std::mem::take(&mut *self.queue.borrow_mut());
            if round.is_empty() {
                return;
            }
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

/// One round: the last write asked for each path is written; every write of the path gets its
/// outcome.
async fn round_of<F: Fs>(fs: &F, root: &Path, syncfs_min_files: usize, round: Vec<Queued>) {
    let mut files = RoundFiles::new();
    for q in round {
        let entry = files.entry(q.path).or_insert_with(|| (Vec::new(), Vec::new()));
        entry.0 = q.data;
        entry.1.push(q.done);
    }
    let outcomes: Vec<io::Result<()>> = if files.len() >= syncfs_min_files.max(1) {
        replace_with_syncfs(fs, root, &files).await
    } else {
        let mut out = Vec::with_capacity(files.len());
        for (path, (data, _)) in &files {
            out.push(fs.write_file_atomic(path, data.clone()).await);
        }
        out
    };
    for ((_, (_, waiters)), outcome) in files.into_iter().zip(outcomes) {
        for w in waiters {
            let _ = w.send(outcome.as_ref().map(|_| ()).map_err(copy));
        }
    }
}

/// One error for each of several waiters (`io::Error` is not `Clone`).
fn copy(e: &io::Error) -> io::Error {
    io::Error::new(e.kind(), e.to_string())
}

/// Writes every temporary file, syncs the file system, renames, syncs again.
async fn replace_with_syncfs<F: Fs>(fs: &F, root: &Path, files: &RoundFiles) -> Vec<io::Result<()>> {
    let written = futures::future::join_all(files.iter().map(|(path, (data, _))| async move {
        let (f, tmp) = fs.write_tmp_file(path, data.clone()).await?;
        drop::<F::File>(f);
        Ok::<PathBuf, io::Error>(tmp)
    }))
    .await;
    if let Err(e) = fs.sync_filesystem(root).await {
        return written.iter().map(|_| Err(copy(&e))).collect();
    }
    let mut renamed = Vec::with_capacity(written.len());
    for ((path, _), tmp) in files.iter().zip(written) {
        renamed.push(match tmp {
            Ok(tmp) => fs.rename(&tmp, path).await,
            Err(e) => Err(e),
        });
    }
    if let Err(e) = fs.sync_filesystem(root).await {
        return renamed.into_iter().map(|r| r.and(Err(copy(&e)))).collect();
    }
    renamed
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
        let paths: Vec<PathBuf> = (0..4).map(|i| root.join(format!("f{i}"))).collect();
        for p in &paths {
            future::block_on(replacer.replace(&fs, &root, 1, p, b"old".to_vec())).expect("written");
        }
        fs.set_fail_fsync(true);
        let writes = paths
            .iter()
            .map(|p| replacer.replace(&fs, &root, 1, p, b"new".to_vec()));
        let outcomes = future::block_on(futures::future::join_all(writes));
        assert!(outcomes.iter().all(Result::is_err), "{outcomes:?}");
        fs.set_fail_fsync(false);
        fs.crash(|_| 0);
        for p in &paths {
            assert_eq!(read(&fs, p), b"old".to_vec(), "nothing renamed before its sync");
        }
    }
}
