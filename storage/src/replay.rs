//! Start-up journal replay: after a crash, the shard journals may hold acknowledged batches that
//! never reached their segment files (or reached them torn). Replay appends them, checkpoints the
//! logs it appended to, makes the rest durable with one `syncfs` (entries already in their
//! segments after a process crash sit in the page cache), and deletes the journal files. It runs
//! once, before any shard starts, over every shard's journal, so a change in the number of
//! shards between runs is harmless. The broker runs it on [`crate::fs::StdFs`], so the journal
//! files are read through the page cache, although they were written past it. Files kept for
//! recycling (`.free`) hold only entries a checkpoint covered and are removed unread; in the
//! others, replay stops at the first entry whose CRC fails, with the file's sequence mask (see
//! [`crate::journal`]).
//!
//! Truncations: a log's entry is *void* when a later `Truncate` entry of the same log is at or
//! below its offset (a follower's suffix cut since; see [`crate::ShardStore::truncate_log`]).
//! A first pass over the files finds the truncations, the second skips the void entries and
//! applies the others as before. Why that is right: the truncation made its entry durable
//! before cutting the log's files, and took no append of the log until the cut was durable. So
//! after a crash the log's files hold either a prefix of the log as it was before the last
//! truncation (the cut did not finish: the truncation never returned, and no later append
//! exists), or a prefix of the log as it is now; and the entries that are not void are exactly
//! the journaled batches of the log as it is now, in offset order. Applying those at the end
//! of what the files hold, as for any log, gives back a prefix of the log as it was or as it
//! is, never a batch cut by a truncation that returned, and never one in place of a batch
//! appended since at its offset. Without the rule, an entry of a cut batch would be taken for
//! the next append at the log's new end.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use strand_protocol::batch::BatchHeader;

use crate::fs::Fs;
use crate::journal::{self, EntryKind, LogKey, JOURNAL_DIR};
use crate::log::{LogConfig, PartitionLog};
use crate::StorageError;

/// What replay did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplayReport {
    pub files: usize,
    /// Entries appended to a log because its segment lacked them.
    pub entries_applied: usize,
    /// Entries already present in their log.
    pub entries_present: usize,
    /// Entries for logs that no longer exist (deleted topics).
    pub entries_orphaned: usize,
    /// Entries a later truncation of their log voided (see the module documentation).
    pub entries_voided: usize,
    pub logs_touched: usize,
    pub problems: Vec<String>,
}

/// A log's truncations in journal order: where each entry is (file, entry) and the smallest
/// offset cut by it or any later one.
#[derive(Default)]
struct Truncations {
    at: Vec<((usize, usize), i64)>,
}

impl Truncations {
    /// Whether an entry at `position` with base offset `offset` is void: a later truncation
    /// cut at or below its offset.
    fn voids(&self, position: (usize, usize), offset: i64) -> bool {
        let later = self.at.partition_point(|(p, _)| *p <= position);
        self.at.get(later).is_some_and(|(_, min_cut)| *min_cut <= offset)
    }
}

/// The first pass: every log's truncations (see the module documentation).
async fn find_truncations<F: Fs>(
    fs: &F,
    files: &[(u16, u64, std::path::PathBuf)],
) -> Result<HashMap<LogKey, Truncations>, StorageError> {
    let mut out: HashMap<LogKey, Truncations> = HashMap::new();
    for (file_index, (_, _, path)) in files.iter().enumerate() {
        let (entries, _) = journal::read_file(fs, path).await?;
        for (entry_index, entry) in entries.into_iter().enumerate() {
            if entry.kind == EntryKind::Truncate {
                out.entry(entry.key)
                    .or_default()
                    .at
                    .push(((file_index, entry_index), entry.offset));
            }
        }
    }
    // Each truncation stands for the lowest cut from it on: an entry is void if any later one
    // is at or below its offset.
    for t in out.values_mut() {
        let mut min = i64::MAX;
        for (_, cut) in t.at.iter_mut().rev() {
            min = min.min(*cut);
            *cut = min;
        }
    }
    Ok(out)
}

/// Replays every journal file under `root`. `log_config` says whether a log (directory name and
/// incarnation) still exists, and with which configuration; entries of other logs are dropped.
pub async fn replay_journals<F: Fs>(
    fs: &F,
    root: &Path,
    log_config: impl Fn(&LogKey) -> Option<LogConfig>,
    now_ms: i64,
) -> Result<ReplayReport, StorageError> {
    // Files kept for recycling hold only entries a checkpoint covered.
    journal::remove_free_files(fs, root).await?;
    let files = journal::list_files(fs, root).await?;
    let mut report = ReplayReport::default();
    if files.is_empty() {
        return Ok(report);
    }
    let truncations = find_truncations(fs, &files).await?;
    let mut logs: BTreeMap<String, PartitionLog<F>> = BTreeMap::new();
    let mut appended: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
    for (file_index, (shard, seq, path)) in files.iter().enumerate() {
        report.files += 1;
        let (entries, problem) = journal::read_file(fs, path).await?;
        if let Some(p) = problem {
            tracing::info!(shard, seq, problem = %p, "journal ends with an incomplete entry (expected after a crash)");
        }
        for (entry_index, entry) in entries.into_iter().enumerate() {
            if entry.kind == EntryKind::Truncate {
                continue;
            }
            let Some(config) = log_config(&entry.key) else {
                report.entries_orphaned += 1;
                continue;
            };
            let voided = truncations
                .get(&entry.key)
                .is_some_and(|t| t.voids((file_index, entry_index), entry.offset));
            if voided {
                report.entries_voided += 1;
                continue;
            }
            if !logs.contains_key(&entry.key.dir_name) {
                let dir = root.join(&entry.key.dir_name);
                let (log, rec) = PartitionLog::open(fs.clone(), dir, config, now_ms).await?;
                report.problems.extend(rec.problems);
                logs.insert(entry.key.dir_name.clone(), log);
            }
            let Some(log) = logs.get_mut(&entry.key.dir_name) else {
                continue;
            };
            let header = match BatchHeader::parse(&entry.data) {
                Ok(h) => h,
                Err(e) => {
                    report
                        .problems
                        .push(format!("{}: bad journal batch: {e}", entry.key.dir_name));
                    continue;
                }
            };
            let leo = log.log_end_offset();
            let next = entry.offset + header.offset_count();
            if next <= leo {
                report.entries_present += 1;
            } else if entry.offset == leo {
                log.append_unchecked(&entry.data, header.partition_leader_epoch, now_ms)?;
                report.entries_applied += 1;
                if !appended.contains(&entry.key.dir_name) {
                    appended.insert(entry.key.dir_name.clone());
                }
            } else {
                report.problems.push(format!(
                    "{}: journal batch at offset {} does not continue the log (end offset {leo}); skipped",
                    entry.key.dir_name, entry.offset
                ));
            }
        }
        // Bound memory: write what this file added before reading the next.
        for log in logs.values_mut() {
            log.flush_exclusive().await?;
        }
    }
    report.logs_touched = logs.len();
    // Logs that got entries back: checkpoint them (their appends are fsynced already).
    for (name, mut log) in logs {
        if appended.contains(&name) {
            let work = log.checkpoint_work();
            let point = work.run(fs).await?;
            log.checkpoint_done(point);
        }
    }
    // Logs that had every entry already: those bytes may be in the page cache only. One
    // filesystem sync instead of one checkpoint (three fsyncs) per log: with thousands of
    // partitions that is seconds of start-up.
    fs.sync_filesystem(root)
        .await
        .map_err(|e| StorageError::io("sync file system", root, e))?;
    for (_, _, path) in &files {
        fs.remove_file(path)
            .await
            .map_err(|e| StorageError::io("remove replayed journal", path, e))?;
    }
    let dir = root.join(JOURNAL_DIR);
    fs.sync_dir(&dir)
        .await
        .map_err(|e| StorageError::io("sync journal dir", &dir, e))?;
    if !report.problems.is_empty() {
        for p in &report.problems {
            tracing::warn!(problem = %p, "journal replay");
        }
    }
    Ok(report)
}
