//! Storage engine tests on the in-memory file system (deterministic; crash and disk-full
//! injection) and one on the real file system.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use futures_lite::future::block_on;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use strand_protocol::batch::{self, build, BatchScanner};
use strand_storage::fs::{Fs, StdFs};
use strand_storage::fs_mem::MemFs;
use strand_storage::{
    replay_journals, CheckpointStats, FileRegions, LogConfig, LogId, LogKey, PartitionLog, RecoveryReport,
    ReplayReport, ResumeOutcome, ShardStore, StorageError, StoreConfig,
};

fn key(name: &str) -> LogKey {
    LogKey {
        dir_name: name.to_owned(),
        incarnation: [9; 16],
    }
}

fn small_config() -> LogConfig {
    LogConfig {
        segment_bytes: 2048,
        segment_ms: i64::MAX / 4,
        retention_ms: None,
        retention_bytes: None,
        index_interval_bytes: 256,
        max_index_entries: 1000,
    }
}

/// Segments of `segment_bytes`, an index entry every `index_interval_bytes`.
fn segment_config(segment_bytes: u64, index_interval_bytes: u64) -> LogConfig {
    LogConfig {
        segment_bytes,
        index_interval_bytes,
        ..small_config()
    }
}

/// One large segment (1 MiB), an index entry every `index_interval_bytes`.
fn one_segment_config(index_interval_bytes: u64) -> LogConfig {
    segment_config(1 << 20, index_interval_bytes)
}

/// [`small_config`] with retention by size (`bytes`) and by time (`ms`).
fn retention_config(bytes: Option<u64>, ms: Option<i64>) -> LogConfig {
    LogConfig {
        retention_bytes: bytes,
        retention_ms: ms,
        ..small_config()
    }
}

/// Appends batches `tags` of two records each, the first at timestamp `ts_base + tag`.
fn append_timestamped(store: &ShardStore<MemFs>, id: LogId, tags: std::ops::Range<u64>, ts_base: i64) {
    append_each(store, id, tags, timestamped(ts_base));
}

/// Batch `tag` of two records, the first at timestamp `ts_base + tag`.
fn timestamped(ts_base: i64) -> impl Fn(u64) -> Vec<u8> {
    move |tag| value_batch(tag, 2, ts_base + tag as i64)
}

/// Batch `tag` of two records at timestamp 0.
fn two_records(tag: u64) -> Vec<u8> {
    value_batch(tag, 2, 0)
}

fn root() -> PathBuf {
    PathBuf::from("/data")
}

/// A store whose every round goes through the journal.
async fn open_store<F: Fs>(fs: &F, journal_bytes: u64) -> ShardStore<F> {
    open_store_direct(fs, journal_bytes, 0).await
}

/// A store whose rounds of at most `direct_max_logs` logs skip the journal.
async fn open_store_direct<F: Fs>(fs: &F, journal_bytes: u64, direct_max_logs: usize) -> ShardStore<F> {
    open_store_overlap(
        fs,
        journal_bytes,
        direct_max_logs,
        0,
        StoreConfig::default().overlap_min_bytes,
        StoreConfig::default().checkpoint_syncfs_min_logs,
    )
    .await
}

/// Same, with direct rounds of at least `overlap_min_bytes` overlapping the round before, and
/// rounds of more logs direct too when they carry `direct_min_log_bytes` each (0: never).
async fn open_store_overlap<F: Fs>(
    fs: &F,
    journal_bytes: u64,
    direct_max_logs: usize,
    direct_min_log_bytes: usize,
    overlap_min_bytes: usize,
    checkpoint_syncfs_min_logs: usize,
) -> ShardStore<F> {
    ShardStore::open(
        fs.clone(),
        root(),
        0,
        StoreConfig {
            journal_segment_bytes: journal_bytes,
            journal_recycle_files: 2,
            checkpoint_concurrency: 8,
            direct_sync_max_logs: direct_max_logs,
            direct_min_log_bytes,
            overlap_min_bytes,
            checkpoint_syncfs_min_logs,
            resume_free_bytes: RESUME_FREE_BYTES,
        },
    )
    .await
    .unwrap()
}

/// What the tests' stores need free to take writes again after a full disk.
const RESUME_FREE_BYTES: u64 = 64 << 10;

/// A power loss that keeps none of the unsynced bytes, then start-up: the journal replay (which
/// must report no problem) and a fresh store, every round journaled.
async fn crash_and_reopen(fs: &MemFs, config: &LogConfig, journal_bytes: u64) -> ShardStore<MemFs> {
    fs.crash(|_| 0);
    let report = replay(fs, config).await;
    assert!(report.problems.is_empty(), "{report:?}");
    open_store(fs, journal_bytes).await
}

/// [`crash_and_reopen`], then log `name` opened again: the store, the log and what the log's
/// recovery reported.
async fn crash_and_reopen_log(
    fs: &MemFs,
    name: &str,
    config: &LogConfig,
    journal_bytes: u64,
) -> (ShardStore<MemFs>, LogId, RecoveryReport) {
    let store = crash_and_reopen(fs, config, journal_bytes).await;
    let (id, rec) = store.open_log(key(name), config.clone(), 0).await.unwrap();
    (store, id, rec)
}

/// The journal replay of start-up on `fs`, every log with `config`.
async fn replay(fs: &MemFs, config: &LogConfig) -> ReplayReport {
    replay_journals(fs, &root(), |_| Some(config.clone()), 0)
        .await
        .unwrap()
}

/// A fresh store on `fs` whose every round goes through the journal (1 MiB files), and log
/// `name` opened in it: the store, the log and what the log's recovery reported.
async fn store_with_log(
    fs: &MemFs,
    name: &str,
    config: &LogConfig,
) -> (ShardStore<MemFs>, LogId, RecoveryReport) {
    let store = open_store(fs, 1 << 20).await;
    let (id, rec) = store.open_log(key(name), config.clone(), 0).await.unwrap();
    (store, id, rec)
}

/// Opens logs `names` in `store`, each with `config`.
async fn open_each<F: Fs, const N: usize>(
    store: &ShardStore<F>,
    names: [&str; N],
    config: &LogConfig,
) -> [LogId; N] {
    let mut ids = Vec::with_capacity(N);
    for name in names {
        ids.push(store.open_log(key(name), config.clone(), 0).await.unwrap().0);
    }
    ids.try_into().unwrap_or_else(|_| unreachable!("one id per name"))
}

/// Appends `batch(tag)` for each of `tags` (leader epoch 0).
fn append_each<F: Fs>(
    store: &ShardStore<F>,
    id: LogId,
    tags: std::ops::Range<u64>,
    batch: impl Fn(u64) -> Vec<u8>,
) {
    for tag in tags {
        store.append(id, &batch(tag), 0, 0).unwrap();
    }
}

/// Log `name` in a fresh store on `fs` (see [`store_with_log`]) with `batch(tag)` appended for
/// each of `tags` and flushed in one round. The store stays open: shut it down for a clean stop,
/// drop it for a crash.
async fn filled_log(
    fs: &MemFs,
    name: &str,
    config: &LogConfig,
    tags: std::ops::Range<u64>,
    batch: impl Fn(u64) -> Vec<u8>,
) -> (ShardStore<MemFs>, LogId) {
    let (store, id, _) = store_with_log(fs, name, config).await;
    append_each(&store, id, tags, batch);
    store.flush_round().await;
    (store, id)
}

/// What log `id` of `store` holds (a read from offset 0), then a clean shutdown of the store.
async fn read_and_shut_down((store, id): (ShardStore<MemFs>, LogId)) -> Vec<Batch> {
    let all = read_all(&store, id, 0).await;
    store.shutdown().await.unwrap();
    all
}

/// The partition log in `dir` opened by itself, as recovery leaves it.
async fn partition_log(
    fs: &MemFs,
    dir: impl Into<PathBuf>,
    config: LogConfig,
) -> (PartitionLog<MemFs>, RecoveryReport) {
    PartitionLog::open(fs.clone(), dir.into(), config, 0)
        .await
        .unwrap()
}

/// Checks `log`'s timestamp lookups: for each `(timestamp, answer)` of `first_at`, the first
/// record at or after the timestamp (offset, timestamp); and the record with the largest
/// timestamp (`max`).
async fn assert_lookups(
    log: &PartitionLog<MemFs>,
    first_at: &[(i64, Option<(i64, i64)>)],
    max: Option<(i64, i64)>,
) {
    for (ts, want) in first_at {
        assert_eq!(
            log.offset_for_timestamp(*ts).await.unwrap(),
            *want,
            "first record at or after {ts}"
        );
    }
    assert_eq!(
        log.max_timestamp_offset().await.unwrap(),
        max,
        "the largest timestamp"
    );
}

/// Appends `batch` to log `id` (leader epoch 0) and notes it in `acked` at its offset, as stored.
fn append_noted<F: Fs>(
    store: &ShardStore<F>,
    id: LogId,
    batch: Vec<u8>,
    acked: &mut BTreeMap<i64, Vec<u8>>,
) -> strand_storage::AppendTicket {
    let t = store.append(id, &batch, 0, 0).unwrap();
    let offset = t.info.base_offset;
    acked.insert(offset, stored(batch, offset, 0));
    t
}

/// Checks that every batch of `acked` (offset → stored bytes) is in `all` at its offset, byte for
/// byte; `what` names the log in the message.
fn assert_acked(all: &[Batch], acked: &BTreeMap<i64, Vec<u8>>, what: &str) {
    for (off, bytes) in acked {
        assert_eq!(
            all.iter().find(|b| b.0 == *off).map(|b| &b.2),
            Some(bytes),
            "acknowledged batch at {off} of {what}"
        );
    }
}

/// One batch as a read returns it: (base offset, record count, bytes).
type Batch = (i64, i64, Vec<u8>);

/// Reads the whole visible log from `from`, returning (base offset, record count, bytes) per batch.
async fn read_all<F: Fs>(store: &ShardStore<F>, id: LogId, from: i64) -> Vec<Batch> {
    read_all_by(store, id, from, 700).await
}

/// [`read_all`] with reads of up to `max_bytes` each.
async fn read_all_by<F: Fs>(store: &ShardStore<F>, id: LogId, from: i64, max_bytes: usize) -> Vec<Batch> {
    let mut out = Vec::new();
    let mut next = from;
    loop {
        let Some(plan) = store.plan_read(id, next, max_bytes).unwrap() else {
            break;
        };
        let bound = plan.max_len();
        let bytes = plan
            .execute()
            .await
            .unwrap_or_else(|e| panic!("read at {next}: {e:?}"));
        assert!(
            !bytes.is_empty(),
            "a planned read below the high watermark returned nothing at {next}"
        );
        let mut scanner = BatchScanner::new(&bytes, true);
        let one_batch = BatchScanner::new(&bytes, true).count() == 1;
        assert!(
            bytes.len() <= bound || one_batch,
            "a read at {next} returned {} bytes, over the {bound} its plan promised at most",
            bytes.len()
        );
        for b in scanner.by_ref() {
            let h = b.header;
            let body = bytes[b.position..b.position + h.total_bytes()].to_vec();
            out.push((h.base_offset, h.offset_count(), body));
            next = h.next_offset();
        }
        assert!(
            matches!(scanner.stop(), Some(batch::ScanStop::Clean)),
            "reads return whole valid batches only: {:?}",
            scanner.stop()
        );
    }
    out
}

/// The segment files of the log in `dir`, in offset order.
fn segment_files(fs: &MemFs, dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = fs
        .paths()
        .into_iter()
        .filter(|p| p.parent() == Some(dir) && p.extension().is_some_and(|e| e == "log"))
        .collect();
    v.sort();
    v
}

/// A segment file's base offset, from its name.
fn segment_base(path: &Path) -> i64 {
    path.file_stem()
        .and_then(|s| s.to_str())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{} is not a segment file", path.display()))
}

fn value_batch(tag: u64, n: usize, ts: i64) -> Vec<u8> {
    let values: Vec<Vec<u8>> = (0..n).map(|i| format!("v{tag}-{i}").into_bytes()).collect();
    build::batch(&records(&values, Some(b"k"), &[("h", Some(b"x"))], 1), ts)
}

/// One record per value (key `key`, `headers` on each), the i-th at timestamp delta
/// `i * delta`.
fn records<'a>(
    values: &'a [Vec<u8>],
    key: Option<&'a [u8]>,
    headers: &[(&'a str, Option<&'a [u8]>)],
    delta: i64,
) -> Vec<build::TestRecord<'a>> {
    values
        .iter()
        .enumerate()
        .map(|(i, v)| build::TestRecord {
            key,
            value: Some(v),
            headers: headers.to_vec(),
            timestamp_delta: i as i64 * delta,
        })
        .collect()
}

/// The stored form of a batch appended at `offset`: only base offset and epoch differ.
fn stored(mut b: Vec<u8>, offset: i64, epoch: i32) -> Vec<u8> {
    batch::patch_batch(&mut b, offset, epoch);
    b
}

#[test]
fn append_flush_read_round_trip() {
    block_on(async {
        let fs = MemFs::new();
        let (store, id, _) = store_with_log(&fs, "t-0", &small_config()).await;
        let b1 = value_batch(1, 3, 100);
        let b2 = value_batch(2, 2, 200);
        let t1 = store.append(id, &b1, 5, 0).unwrap();
        let t2 = store.append(id, &b2, 5, 0).unwrap();
        assert_eq!((t1.info.base_offset, t1.info.last_offset), (0, 2));
        assert_eq!((t2.info.base_offset, t2.info.last_offset), (3, 4));
        // Not visible before the round.
        assert_eq!(store.offsets(id).unwrap().high_watermark, 0);
        assert!(store.plan_read(id, 0, 1000).unwrap().is_none());
        let stats = store.flush_round().await;
        assert_eq!(stats.logs, 1);
        store.wait_durable(&t2).await.unwrap();
        let o = store.offsets(id).unwrap();
        assert_eq!(
            (o.log_start_offset, o.high_watermark, o.log_end_offset),
            (0, 5, 5)
        );
        let all = read_all(&store, id, 0).await;
        assert_eq!(all.len(), 2);
        assert_eq!(all[0].2, stored(b1.clone(), 0, 5));
        assert_eq!(all[1].2, stored(b2.clone(), 3, 5));
        // A read from inside a batch starts with that batch.
        let mid = read_all(&store, id, 4).await;
        assert_eq!(mid[0].0, 3);
        // At the high watermark: nothing; beyond it: out of range.
        assert!(store.plan_read(id, 5, 1000).unwrap().is_none());
        assert!(store.plan_read(id, 6, 1000).is_err());
    });
}

#[test]
fn a_commit_cap_bounds_what_clients_see_but_not_what_the_replica_reads() {
    block_on(async {
        let fs = MemFs::new();
        let (store, id, _) = store_with_log(&fs, "t-0", &small_config()).await;
        let b1 = value_batch(1, 3, 100);
        let b2 = value_batch(2, 2, 200);
        store.append(id, &b1, 5, 0).unwrap();
        let t2 = store.append(id, &b2, 5, 0).unwrap();
        store.flush_round().await;
        store.wait_durable(&t2).await.unwrap();
        // Replicated, with only the first batch committed.
        store.set_commit_cap(id, Some(3)).unwrap();
        assert_eq!(store.offsets(id).unwrap().high_watermark, 3);
        let all = read_all(&store, id, 0).await;
        assert_eq!(all.len(), 1, "clients read up to the commit offset: {all:?}");
        assert_eq!(all[0].0, 0);
        assert!(store.plan_read(id, 3, 1000).unwrap().is_none());
        assert!(
            store.plan_read(id, 4, 1000).is_err(),
            "beyond the commit offset is out of range"
        );
        assert!(
            store.delete_records(id, 4).await.is_err(),
            "DeleteRecords stops there too"
        );
        // A client read that starts below the cap and could take both batches stops at it.
        let plan = store.plan_read(id, 0, 1 << 20).unwrap().unwrap();
        let bytes = plan.execute().await.unwrap();
        assert_eq!(BatchScanner::new(&bytes, true).count(), 1);
        // The replica itself reads everything durable.
        let plan = store.plan_replica_read(id, 0, 1 << 20).unwrap().unwrap();
        let bytes = plan.execute().await.unwrap();
        assert_eq!(BatchScanner::new(&bytes, true).count(), 2);
        // The commit offset moves: waiting readers are woken and see the rest.
        let woken = store.durable_notify().wait();
        store.set_commit_cap(id, Some(5)).unwrap();
        woken.await;
        assert_eq!(store.offsets(id).unwrap().high_watermark, 5);
        assert_eq!(read_all(&store, id, 0).await.len(), 2);
        // A cap above the durable end shows the durable end.
        store.set_commit_cap(id, Some(50)).unwrap();
        assert_eq!(store.offsets(id).unwrap().high_watermark, 5);
    });
}

/// A checkpoint in flight: the journal rotated, I/O slow from now on, and the checkpoint polled
/// once, so that its fsyncs have started and do not finish unless it is polled again.
async fn start_checkpoint<'a>(
    store: &'a ShardStore<MemFs>,
    fs: &MemFs,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<CheckpointStats, StorageError>> + 'a>> {
    store.rotate_journal().await.unwrap();
    fs.set_slow_io(true);
    let mut checkpoint: std::pin::Pin<Box<dyn std::future::Future<Output = _> + 'a>> =
        Box::pin(store.checkpoint());
    let waker = futures::task::noop_waker();
    let mut cx = std::task::Context::from_waker(&waker);
    assert!(
        checkpoint.as_mut().poll(&mut cx).is_pending(),
        "the checkpoint finished at once"
    );
    checkpoint
}

/// A checkpoint of many logs writes their index files and recovery points without an fsync
/// each and syncs the file system twice: after the files, then after the points. A power loss
/// right after it drops every unsynced byte, and with the journal it covered gone, every
/// acknowledged batch must still be there. With the setting at 0 it fsyncs each file.
#[test]
fn a_checkpoint_of_many_logs_syncs_the_file_system_instead_of_each_file() {
    block_on(async {
        for min_logs in [16, 0] {
            let fs = MemFs::new();
            let store = open_store_overlap(&fs, 1 << 20, 2, 16 << 10, 0, min_logs).await;
            let config = small_config();
            let names: Vec<String> = (0..20).map(|i| format!("many-{i}")).collect();
            // Per log: offset → stored batch.
            let mut acked: HashMap<&String, BTreeMap<i64, Vec<u8>>> = HashMap::new();
            for (i, name) in names.iter().enumerate() {
                let (id, _) = store.open_log(key(name), config.clone(), 0).await.unwrap();
                for tag in 0..3 {
                    let batch = value_batch(i as u64 * 10 + tag, 2, 5);
                    append_noted(&store, id, batch, acked.entry(name).or_default());
                }
            }
            // Twenty logs of a few bytes each: a journaled round.
            let round = store.flush_round().await;
            assert!(!round.direct && round.error.is_none(), "{round:?}");
            store.rotate_journal().await.unwrap();
            let before = fs.fsync_count();
            let stats = store.checkpoint().await.unwrap();
            let fsyncs = fs.fsync_count() - before;
            assert_eq!(stats.logs, 20);
            if min_logs > 0 {
                assert!(stats.syncfs, "{stats:?}");
                assert_eq!(fsyncs, 0, "file fsyncs in a checkpoint by file-system sync");
            } else {
                assert!(!stats.syncfs, "{stats:?}");
                assert!(
                    fsyncs >= 20 * 3,
                    "{fsyncs} file fsyncs for 20 logs' segments, indexes and points"
                );
            }
            assert!(
                stats.journal_files_deleted + stats.journal_files_recycled > 0,
                "the checkpoint retired the journal it covered: {stats:?}"
            );
            fs.crash(|_| 0);
            let paths = fs.paths();
            let named = |suffix: &str| {
                paths
                    .iter()
                    .filter(|p| p.to_string_lossy().ends_with(suffix))
                    .count()
            };
            assert_eq!(
                named("leader-epoch-checkpoint"),
                20,
                "every log's epoch file is in place"
            );
            assert_eq!(named(".tmp"), 0, "no epoch file left beside its place");
            let report = replay(&fs, &config).await;
            assert!(report.problems.is_empty(), "{report:?}");
            let store = open_store(&fs, 1 << 20).await;
            for name in &names {
                let (id, _) = store.open_log(key(name), config.clone(), 0).await.unwrap();
                let what = format!("{name} after the checkpoint and a power loss (min logs {min_logs})");
                assert_acked(&read_all(&store, id, 0).await, &acked[name], &what);
            }
        }
    });
}

/// Rounds stay direct while a checkpoint runs. The checkpoint takes over the fsync of segments
/// with unsynced (journaled) writes; a direct round that runs before that fsync has finished, and
/// writes a later segment, syncs them too, as it would with no checkpoint running (the retired
/// journal file, kept until the checkpoint completes, also still covers them). After a power
/// loss mid-checkpoint, everything both rounds acknowledged is back.
#[test]
fn a_direct_round_beside_a_checkpoint_syncs_what_the_checkpoint_has_not_yet() {
    block_on(async {
        let fs = MemFs::new();
        let store = open_store_direct(&fs, 1 << 20, 1).await;
        let config = small_config();
        let [a, b] = open_each(&store, ["beside-a", "beside-b"], &config).await;
        let mut acked: HashMap<LogId, BTreeMap<i64, Vec<u8>>> = HashMap::new();
        let mut append = |id: LogId, tag: u64, n: usize| {
            append_noted(&store, id, value_batch(tag, n, 5), acked.entry(id).or_default())
        };
        // Segment files and directories made durable first.
        append(a, 1, 2);
        append(b, 2, 2);
        assert!(store.flush_round().await.error.is_none());
        store.rotate_journal().await.unwrap();
        store.checkpoint().await.unwrap();
        // A journaled round (two logs) leaves unsynced writes in a's first segment.
        append(a, 3, 3);
        let t = append(b, 4, 1);
        let stats = store.flush_round().await;
        assert!(!stats.direct && stats.error.is_none(), "{stats:?}");
        store.wait_durable(&t).await.unwrap();
        // A checkpoint takes those marks and starts its fsyncs, which do not finish.
        {
            let _checkpoint = start_checkpoint(&store, &fs).await;
            // Meanwhile a's next batches roll it into a new segment, in a direct round.
            let before = store.offsets(a).unwrap().log_end_offset;
            let mut last = None;
            while store.with_log(a, |l| l.segment_count()).unwrap() < 2 {
                last = Some(append(a, 5, 4));
            }
            assert!(store.offsets(a).unwrap().log_end_offset > before);
            let stats = store.flush_round().await;
            assert!(stats.direct && stats.error.is_none(), "{stats:?}");
            store.wait_durable(&last.unwrap()).await.unwrap();
        }
        // Power loss before the checkpoint's fsyncs completed.
        let store = crash_and_reopen(&fs, &config, 1 << 20).await;
        for (id, name) in [(a, "beside-a"), (b, "beside-b")] {
            let (id2, _) = store.open_log(key(name), config.clone(), 0).await.unwrap();
            assert_acked(&read_all(&store, id2, 0).await, &acked[&id], name);
        }
    });
}

/// A log whose directory has changes no sync covered yet (files created by a journaled round)
/// takes journaled rounds. While a checkpoint runs, that must not ask for a directory sync of
/// its own: none may run beside the checkpoint, so the flusher would pause, round after round,
/// until the checkpoint ended (with the broker's flusher spinning, it never did).
#[test]
fn a_checkpoint_in_flight_does_not_pause_flush_rounds() {
    block_on(async {
        let fs = MemFs::new();
        let store = open_store_direct(&fs, 1 << 20, 1).await;
        let [a, b] = open_each(&store, ["pause-a", "pause-b"], &small_config()).await;
        store.append(a, &value_batch(1, 1, 5), 0, 0).unwrap();
        store.append(b, &value_batch(2, 1, 5), 0, 0).unwrap();
        let stats = store.flush_round().await;
        assert!(!stats.direct && stats.error.is_none(), "{stats:?}");
        let _checkpoint = start_checkpoint(&store, &fs).await;
        for tag in 3..6 {
            let t = store.append(a, &value_batch(tag, 1, 5), 0, 0).unwrap();
            let mut rounds = 0;
            store
                .flush_pending(4, |s| {
                    assert!(s.error.is_none(), "{s:?}");
                    rounds += 1;
                })
                .await;
            assert_eq!(
                rounds, 1,
                "append {tag}: the flusher paused beside the checkpoint"
            );
            store.wait_durable(&t).await.unwrap();
        }
    });
}

/// A round reports how long its oldest write waited to be taken: from the first append after
/// the previous round, not from the last one.
#[test]
fn a_round_reports_how_long_its_oldest_write_waited() {
    block_on(async {
        let fs = MemFs::new();
        let store = open_store(&fs, 1 << 20).await;
        let [a, b] = open_each(&store, ["wait-a", "wait-b"], &small_config()).await;
        let first = std::time::Instant::now();
        store.append(a, &value_batch(1, 1, 5), 0, 0).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(30));
        store.append(a, &value_batch(2, 1, 5), 0, 0).unwrap();
        store.append(b, &value_batch(3, 1, 5), 0, 0).unwrap();
        let stats = store.flush_round().await;
        assert_eq!(stats.logs, 2);
        let bound = first.elapsed().as_micros() as u64;
        assert!(
            (30_000..=bound).contains(&stats.wait_us),
            "waited {} µs",
            stats.wait_us
        );
        // The next round's wait starts at its own first append, not at an earlier one.
        std::thread::sleep(std::time::Duration::from_millis(30));
        let second = std::time::Instant::now();
        store.append(a, &value_batch(4, 1, 5), 0, 0).unwrap();
        let stats = store.flush_round().await;
        assert_eq!(stats.logs, 1);
        let bound = second.elapsed().as_micros() as u64;
        assert!(
            stats.wait_us <= bound,
            "waited {} µs, appended {bound} µs ago",
            stats.wait_us
        );
    });
}

#[test]
fn one_journal_fsync_per_round_whatever_the_partition_count() {
    block_on(async {
        let fs = MemFs::new();
        let store = open_store(&fs, 1 << 30).await;
        let mut ids = Vec::new();
        for p in 0..200 {
            ids.push(
                store
                    .open_log(key(&format!("many-{p}")), small_config(), 0)
                    .await
                    .unwrap()
                    .0,
            );
        }
        let before = fs.fsync_count();
        let tickets: Vec<_> = ids
            .iter()
            .map(|id| store.append(*id, &value_batch(1, 2, 5), 0, 0).unwrap())
            .collect();
        let stats = store.flush_round().await;
        assert_eq!(stats.logs, 200);
        assert_eq!(
            fs.fsync_count() - before,
            1,
            "one fdatasync (the journal) for 200 partitions"
        );
        for t in &tickets {
            store.wait_durable(t).await.unwrap();
        }
    });
}

#[test]
fn reads_are_bounded_but_return_at_least_one_batch() {
    block_on(async {
        let fs = MemFs::new();
        let store = open_store(&fs, 1 << 20).await;
        let mut cfg = small_config();
        cfg.segment_bytes = 1 << 20;
        let (id, _) = store.open_log(key("big-0"), cfg, 0).await.unwrap();
        let big = value_batch(1, 200, 0);
        let small = value_batch(2, 1, 0);
        store.append(id, &big, 0, 0).unwrap();
        store.append(id, &small, 0, 0).unwrap();
        store.append(id, &small, 0, 0).unwrap();
        store.flush_round().await;
        let first = store
            .plan_read(id, 0, 10)
            .unwrap()
            .unwrap()
            .execute()
            .await
            .unwrap();
        assert_eq!(
            first.len(),
            big.len(),
            "one whole batch even though larger than max_bytes"
        );
        let plan = store.plan_read(id, 200, 2 * small.len()).unwrap().unwrap();
        assert_eq!(plan.max_len(), 2 * small.len(), "at most max_bytes");
        let two = plan.execute().await.unwrap();
        assert_eq!(two.len(), 2 * small.len());
        let tail = store.plan_read(id, 201, 1 << 20).unwrap().unwrap();
        assert!(
            tail.max_len() >= small.len() && tail.max_len() <= big.len() + 2 * small.len(),
            "at most what the segment holds from the index entry on: {}",
            tail.max_len()
        );
        let one = store
            .plan_read(id, 200, 2 * small.len() - 1)
            .unwrap()
            .unwrap()
            .execute()
            .await
            .unwrap();
        assert_eq!(one.len(), small.len());
    });
}

#[test]
fn segments_roll_and_reads_cross_them() {
    block_on(async {
        let fs = MemFs::new();
        let (store, id, _) = store_with_log(&fs, "roll-0", &small_config()).await;
        let mut expected = Vec::new();
        let mut next = 0i64;
        for i in 0..60 {
            let b = value_batch(i, 1 + (i as usize % 4), 1000 + i as i64);
            let t = store.append(id, &b, 1, 0).unwrap();
            assert_eq!(t.info.base_offset, next);
            expected.push(stored(b, next, 1));
            next = t.info.last_offset + 1;
            if i % 7 == 0 {
                store.flush_round().await;
            }
        }
        store.flush_round().await;
        let segments = fs
            .paths()
            .iter()
            .filter(|p| p.extension().is_some_and(|e| e == "log"))
            .count();
        assert!(segments > 3, "2 KiB segments must roll: {segments}");
        let got: Vec<Vec<u8>> = read_all(&store, id, 0).await.into_iter().map(|b| b.2).collect();
        assert_eq!(got, expected);
        // Timestamp lookups.
        let log_ts = store.with_log(id, |l| l.high_watermark()).unwrap();
        assert_eq!(log_ts, next);
    });
}

#[test]
fn timestamp_lookups() {
    block_on(async {
        let fs = MemFs::new();
        let (store, id, _) = store_with_log(&fs, "ts-0", &small_config()).await;
        // Batches of 3 records at base timestamps 100, 200, ..., records at +0, +1, +2.
        append_each(&store, id, 0..30, |i| value_batch(i, 3, 100 * (i as i64 + 1)));
        // One batch with an older timestamp in the middle of the log.
        store.append(id, &value_batch(99, 1, 50), 0, 0).unwrap();
        store.flush_round().await;
        assert_eq!(store.offsets(id).unwrap().high_watermark, 91);
        // Lookups need async I/O; run them on a plan-free path by reopening the log.
        let dir = store.with_log(id, |l| l.dir().to_path_buf()).unwrap();
        let (log, _) = partition_log(&fs, dir, small_config()).await;
        let first_at = [
            (0, Some((0, 100))),
            (101, Some((1, 101))),
            (102, Some((2, 102))),
            (103, Some((3, 200))),
            (1501, Some((43, 1501))),
            (3003, None),
        ];
        assert_lookups(&log, &first_at, Some((89, 3002))).await;
    });
}

#[test]
fn retention_by_size_and_time_and_delete_records() {
    block_on(async {
        let fs = MemFs::new();
        let mut cfg = retention_config(Some(4096), None);
        let (store, id) = filled_log(&fs, "ret-0", &cfg, 0..100, timestamped(1000)).await;
        let before = store.offsets(id).unwrap();
        let deleted = store.retention_pass(10_000).await;
        assert_eq!(deleted.len(), 1);
        let after = store.offsets(id).unwrap();
        assert!(after.size_bytes < before.size_bytes);
        assert!(
            after.size_bytes >= 4096 - 2048,
            "size retention keeps at least retention.bytes minus a segment"
        );
        assert!(after.log_start_offset > 0);
        assert_eq!(after.high_watermark, 200);
        assert!(
            store.plan_read(id, 0, 100).is_err(),
            "below the log start offset is out of range"
        );
        let first = read_all(&store, id, after.log_start_offset).await;
        assert_eq!(first[0].0, after.log_start_offset);

        // DeleteRecords moves the start without needing a segment boundary.
        let lso = store.delete_records(id, 150).await.unwrap();
        assert_eq!(lso, 150);
        assert!(store.delete_records(id, 201).await.is_err());
        assert_eq!(read_all(&store, id, 150).await[0].0, 150);

        // Time retention: everything is older than 1 ms at t = 10^6 with retention 1 ms.
        cfg.retention_bytes = None;
        cfg.retention_ms = Some(1);
        store.set_config(id, cfg).unwrap();
        store.retention_pass(1_000_000).await;
        let o = store.offsets(id).unwrap();
        assert_eq!(
            (o.log_start_offset, o.high_watermark, o.size_bytes),
            (200, 200, 0)
        );
        // The log goes on from where it was; no offset is reused.
        let t = store.append(id, &value_batch(7, 1, 5), 0, 0).unwrap();
        assert_eq!(t.info.base_offset, 200);
    });
}

#[test]
fn retention_stops_at_the_floor_and_nested_dirs_open() {
    block_on(async {
        let fs = MemFs::new();
        let cfg = retention_config(None, Some(1));
        // A nested directory name (the queue engine's state logs) is created on the way.
        let (store, id, _) = store_with_log(&fs, "__queue_state/ret-0/default", &cfg).await;
        assert!(
            fs.exists(&root().join("__queue_state/ret-0/default/partition.metadata"))
                .await
        );
        append_timestamped(&store, id, 0..100, 1000);
        store.flush_round().await;
        // Everything has expired, but a reader still needs offset 90 and on.
        store.set_retention_floor(id, Some(90)).unwrap();
        store.retention_pass(1_000_000).await;
        let o = store.offsets(id).unwrap();
        assert!(o.log_start_offset > 0, "segments wholly below the floor go");
        assert!(
            o.log_start_offset <= 90,
            "nothing at or above the floor is deleted: {o:?}"
        );
        assert_eq!(
            read_all(&store, id, o.log_start_offset).await[0].0,
            o.log_start_offset
        );
        // Without the floor, time retention takes the rest.
        store.set_retention_floor(id, None).unwrap();
        store.retention_pass(1_000_000).await;
        assert_eq!(store.offsets(id).unwrap().log_start_offset, 200);
    });
}

#[test]
fn clean_shutdown_restarts_without_scanning() {
    block_on(async {
        let fs = MemFs::new();
        read_and_shut_down(filled_log(&fs, "clean-0", &small_config(), 0..40, timestamped(0)).await).await;
        let report = replay(&fs, &small_config()).await;
        assert_eq!(report.files, 0, "a clean shutdown leaves no journal");
        let (store, id, rec) = store_with_log(&fs, "clean-0", &small_config()).await;
        assert_eq!(rec.bytes_scanned, 0, "{rec:?}");
        assert_eq!(store.offsets(id).unwrap().high_watermark, 80);
        assert_eq!(read_all(&store, id, 0).await.len(), 40);
    });
}

/// A segment that holds no more than one index interval has no offset-index entry: checkpoints
/// write no index files for it (a first checkpoint of many new small logs creates two files
/// fewer per log), and recovery reads the segment instead. Once it grows past the interval its
/// index files are written and recovery reads those again.
#[test]
fn a_segment_within_one_index_interval_gets_index_files_only_once_it_grows() {
    block_on(async {
        let fs = MemFs::new();
        let cfg = one_segment_config(4096);
        let index = Path::new("/data/small-0/00000000000000000000.index");
        let time_index = Path::new("/data/small-0/00000000000000000000.timeindex");
        let expected;
        read_and_shut_down(filled_log(&fs, "small-0", &cfg, 0..5, timestamped(1000)).await).await;
        assert!(fs
            .contents(Path::new("/data/small-0/00000000000000000000.log"))
            .is_some());
        assert_eq!(
            fs.contents(index),
            None,
            "no index file for a segment within one interval"
        );
        assert_eq!(fs.contents(time_index), None);
        {
            let (store, id, rec) = store_with_log(&fs, "small-0", &cfg).await;
            assert_eq!(rec.segments_without_index, 1, "{rec:?}");
            assert_eq!(rec.indexes_rebuilt, 0, "{rec:?}");
            assert!(rec.bytes_scanned > 0 && rec.bytes_scanned <= 4096, "{rec:?}");
            assert!(rec.problems.is_empty(), "{rec:?}");
            assert_eq!(store.offsets(id).unwrap().high_watermark, 10);
            assert_eq!(read_all(&store, id, 0).await.len(), 5);
            // Grown past one interval: it has offset-index entries and gets its files.
            append_timestamped(&store, id, 5..80, 1000);
            store.flush_round().await;
            expected = read_all(&store, id, 0).await;
            store.shutdown().await.unwrap();
        }
        assert!(fs.contents(index).is_some_and(|b| !b.is_empty()));
        assert!(fs.contents(time_index).is_some_and(|b| !b.is_empty()));
        let (store, id, rec) = store_with_log(&fs, "small-0", &cfg).await;
        assert_eq!(
            (rec.segments_without_index, rec.indexes_rebuilt, rec.bytes_scanned),
            (0, 0, 0),
            "{rec:?}"
        );
        assert_eq!(read_all(&store, id, 0).await, expected);
        let dir = store.with_log(id, |l| l.dir().to_path_buf()).unwrap();
        let (log, _) = partition_log(&fs, dir, cfg).await;
        assert_lookups(&log, &[(1003, Some((5, 1003)))], Some((159, 1080))).await;
    });
}

/// Index files whose segment is gone (a crash between removing a segment's files, say) are
/// removed when the log opens, so that a later segment with the same base, which may get no
/// index files of its own, never reads them as its own.
/// A log opened as a leader for the first time gets its recovery point and epoch file with its
/// directory, so that its first checkpoint changes no directory entry when its segment is within
/// one index interval (no index files; BENCHMARKS.md#lazy-index-files), whether the checkpoint syncs each
/// file or the file system. That checkpoint makes both files durable: after a power loss,
/// recovery starts at its point and the log still knows where its epoch began.
#[test]
fn a_new_log_gets_its_point_and_epoch_file_when_created() {
    block_on(async {
        // One log small enough to have no index files, one with them (recovery then reads
        // nothing below the point, so its epochs come from the file alone).
        let logs = [("init-0", one_segment_config(4096)), ("init-1", small_config())];
        for syncfs_min_logs in [0, 1] {
            let fs = MemFs::new();
            let mut expected = Vec::new();
            {
                // Rounds journaled, so that the checkpoint syncs the segments.
                let store = open_store_overlap(&fs, 1 << 20, 0, 1 << 30, 0, syncfs_min_logs).await;
                let mut ids = Vec::new();
                for (name, config) in &logs {
                    let (id, _) = store
                        .open_log_as_leader(key(name), config.clone(), 7, 0)
                        .await
                        .unwrap();
                    let mut names = fs.list_dir(&root().join(name)).await.unwrap();
                    names.sort();
                    assert_eq!(
                        names,
                        ["leader-epoch-checkpoint", "partition.metadata", "recovery-point"]
                    );
                    assert_eq!(
                        store.with_log(id, |l| l.end_offset_for_epoch(7)).unwrap(),
                        Some((7, 0))
                    );
                    for i in 0..5 {
                        store.append(id, &value_batch(i, 3, 0), 7, 0).unwrap();
                    }
                    ids.push(id);
                }
                assert!(!store.flush_round().await.direct);
                let small_dir = root().join(logs[0].0);
                let changes = fs.dir_change_count(&small_dir);
                let stats = store.checkpoint().await.unwrap();
                assert_eq!(stats.syncfs, syncfs_min_logs == 1, "{stats:?}");
                assert_eq!(
                    fs.dir_change_count(&small_dir),
                    changes,
                    "the first checkpoint (syncfs {}) created, renamed or removed files",
                    stats.syncfs
                );
                for id in ids {
                    expected.push(read_all(&store, id, 0).await);
                }
            }
            let store = crash_and_reopen(&fs, &small_config(), 1 << 20).await;
            for ((name, config), expected) in logs.iter().zip(&expected) {
                let (id, rec) = store
                    .open_log_as_leader(key(name), config.clone(), 7, 0)
                    .await
                    .unwrap();
                if *name == "init-1" {
                    assert_eq!(rec.bytes_scanned, 0, "recovery starts at the checkpoint: {rec:?}");
                }
                assert_eq!(&read_all(&store, id, 0).await, expected);
                assert_eq!(
                    store.with_log(id, |l| l.end_offset_for_epoch(7)).unwrap(),
                    Some((7, 15)),
                    "{name}, syncfs {}",
                    syncfs_min_logs == 1
                );
            }
        }
    });
}

/// Logs opened together (a CreateTopics request's partitions) are created with one sync of the
/// file system and no fsync per log; a power loss right after keeps each one's metadata,
/// recovery point and epoch file, and a log nothing was appended to needs no checkpoint. Fewer
/// logs are synced one by one. A failed sync fails the logs it was to make durable.
#[test]
fn logs_created_together_are_made_durable_with_one_file_system_sync() {
    block_on(async {
        let fs = MemFs::new();
        let logs: Vec<_> = (0..20)
            .map(|i| (key(&format!("together-{i}")), small_config()))
            .collect();
        let open = || open_store_overlap(&fs, 1 << 20, 2, 1 << 30, 0, 16);
        {
            let store = open().await;
            let fsyncs = fs.fsync_count();
            for r in store.open_logs(logs.clone(), 2, 0).await {
                r.unwrap();
            }
            assert_eq!(fs.fsync_count(), fsyncs, "no fsync per log");
            assert!(
                !store.has_uncheckpointed_changes(),
                "new logs nothing was appended to need no checkpoint"
            );
        }
        fs.crash(|_| 0);
        for (k, _) in &logs {
            let mut names = fs.list_dir(&root().join(&k.dir_name)).await.unwrap();
            names.sort();
            assert_eq!(
                names,
                ["leader-epoch-checkpoint", "partition.metadata", "recovery-point"],
                "{}",
                k.dir_name
            );
        }
        replay(&fs, &small_config()).await;
        let store = open().await;
        for r in store.open_logs(logs.clone(), 2, 0).await {
            let (id, rec) = r.unwrap();
            assert!(rec.problems.is_empty(), "{rec:?}");
            store
                .with_log(id, |l| {
                    assert_eq!(l.end_offset_for_epoch(2), Some((2, 0)));
                    assert!(l.last_checkpoint().is_some(), "the point written with the log");
                })
                .unwrap();
        }
        let fsyncs = fs.fsync_count();
        for r in store
            .open_logs(vec![(key("alone-0"), small_config())], 2, 0)
            .await
        {
            r.unwrap();
        }
        assert!(fs.fsync_count() > fsyncs, "one new log is synced by itself");
        fs.set_fail_fsync(true);
        let failing: Vec<_> = (0..16)
            .map(|i| (key(&format!("failing-{i}")), small_config()))
            .collect();
        let opened = store.open_logs(failing, 2, 0).await;
        assert!(opened.iter().all(|r| r.is_err()), "{opened:?}");
    });
}

/// A power loss before a new log's first checkpoint may take the files written with it; the
/// log then recovers from the journal as any other, and notes its epochs from its batches.
#[test]
fn a_new_log_recovers_without_the_files_written_with_it() {
    block_on(async {
        let fs = MemFs::new();
        let expected;
        {
            let store = open_store(&fs, 1 << 20).await;
            let (id, _) = store
                .open_log_as_leader(key("init-1"), small_config(), 4, 0)
                .await
                .unwrap();
            for i in 0..3 {
                store.append(id, &value_batch(i, 2, 0), 5, 0).unwrap();
            }
            store.flush_round().await;
            expected = read_all(&store, id, 0).await;
        }
        fs.crash(|_| 0);
        let names = fs.list_dir(&root().join("init-1")).await.unwrap();
        assert_eq!(names, ["partition.metadata"], "the crash took the unsynced files");
        let store = crash_and_reopen(&fs, &small_config(), 1 << 20).await;
        let (id, _) = store
            .open_log_as_leader(key("init-1"), small_config(), 5, 0)
            .await
            .unwrap();
        assert_eq!(read_all(&store, id, 0).await, expected);
        // Epoch 4 had no batch; epoch 5 began at offset 0.
        assert_eq!(store.with_log(id, |l| l.latest_epoch()).unwrap(), Some((5, 0)));
    });
}

#[test]
fn index_files_without_their_segment_are_removed_at_open() {
    block_on(async {
        let fs = MemFs::new();
        read_and_shut_down(filled_log(&fs, "orphan-0", &small_config(), 0..1, two_records).await).await;
        let orphans = [
            Path::new("/data/orphan-0/00000000000000000042.index"),
            Path::new("/data/orphan-0/00000000000000000042.timeindex"),
        ];
        for p in orphans {
            fs.set_contents(p, vec![0, 0, 0, 1, 0, 0, 0, 64]);
        }
        let (store, id, rec) = store_with_log(&fs, "orphan-0", &small_config()).await;
        assert!(rec.problems.is_empty(), "{rec:?}");
        for p in orphans {
            assert_eq!(fs.contents(p), None, "{} was left", p.display());
        }
        assert_eq!(read_all(&store, id, 0).await.len(), 1);
    });
}

/// After a clean restart a segment's largest timestamp is exact, not the last time-index
/// entry's (entries come one per index interval): time retention keeps a segment until its
/// newest record expires, and ListOffsets by timestamp and by max timestamp find records in the
/// segment's last interval.
#[test]
fn a_restart_keeps_each_segments_largest_timestamp() {
    block_on(async {
        let fs = MemFs::new();
        let mut cfg = one_segment_config(1024);
        read_and_shut_down(filled_log(&fs, "maxts-0", &cfg, 0..80, timestamped(1000)).await).await;
        let (mut log, rec) = partition_log(&fs, "/data/maxts-0", cfg.clone()).await;
        assert_eq!(rec.bytes_scanned, 0, "{rec:?}");
        assert_lookups(&log, &[(1079, Some((157, 1079)))], Some((159, 1080))).await;
        // Roll the segment (time retention never deletes the active one), then expire up to
        // just below its newest record: it stays.
        cfg.segment_bytes = 1;
        log.set_config(LogConfig {
            retention_ms: Some(1_000),
            ..cfg.clone()
        });
        log.append(&value_batch(80, 1, 5_000), 0, 0).unwrap();
        log.flush_exclusive().await.unwrap();
        assert_eq!(log.segment_count(), 2);
        assert!(
            log.apply_retention(2_080).await.deleted.is_empty(),
            "deleted before its newest record expired"
        );
        assert_eq!(log.apply_retention(2_081).await.deleted, vec![0]);
    });
}

/// Truncating a suffix (a Raft follower whose log diverged from its leader's) keeps the largest
/// timestamp of what stays, even when it was raised between the last two index entries.
#[test]
fn truncating_a_suffix_keeps_the_largest_timestamp_of_what_stays() {
    block_on(async {
        let fs = MemFs::new();
        let cfg = one_segment_config(1024);
        read_and_shut_down(filled_log(&fs, "truncts-0", &cfg, 0..80, timestamped(1000)).await).await;
        let (mut log, _) = partition_log(&fs, "/data/truncts-0", cfg).await;
        log.truncate_suffix(100).await.unwrap();
        assert_eq!(log.high_watermark(), 100);
        assert_lookups(&log, &[(1049, Some((97, 1049))), (1051, None)], Some((99, 1050))).await;
        // A later batch with an older timestamp leaves the maximum where it was.
        log.append(&value_batch(50, 1, 1), 0, 0).unwrap();
        log.flush_exclusive().await.unwrap();
        assert_lookups(&log, &[(1049, Some((97, 1049)))], Some((99, 1050))).await;
    });
}

/// A checkpoint writes index files that cover batches appended but not yet durable, and a
/// recovery point that does not. When a crash loses those batches, recovery cuts their entries,
/// perhaps the one for the largest timestamp below the point, and reads the last index interval
/// again to find it.
#[test]
fn a_crash_keeps_the_largest_timestamp_below_the_recovery_point() {
    block_on(async {
        let fs = MemFs::new();
        let cfg = one_segment_config(1024);
        {
            let (store, id, _) = store_with_log(&fs, "crashts-0", &cfg).await;
            append_timestamped(&store, id, 0..40, 1000);
            store.flush_round().await;
            append_timestamped(&store, id, 40..80, 2000);
            // Staged, not written: the checkpoint's index files cover them, its point does not.
            store.checkpoint().await.unwrap();
            fs.crash(|_| 0);
        }
        let time_index = fs
            .contents(Path::new("/data/crashts-0/00000000000000000000.timeindex"))
            .unwrap();
        assert!(
            time_index
                .chunks_exact(12)
                .any(|e| e[..8] >= 2000i64.to_be_bytes()[..]),
            "the index file covers the staged batches"
        );
        let (log, rec) = partition_log(&fs, "/data/crashts-0", cfg).await;
        assert_eq!(log.high_watermark(), 80);
        assert_lookups(&log, &[(1039, Some((77, 1039)))], Some((79, 1040))).await;
        // Only the last interval below the point was read again: the index files and the
        // recovery point (a new file, its directory synced) survived.
        assert_eq!(
            (rec.indexes_rebuilt, rec.segments_without_index),
            (0, 0),
            "{rec:?}"
        );
        assert!(rec.bytes_scanned > 0 && rec.bytes_scanned <= 2048, "{rec:?}");
    });
}

/// Timestamps need not grow with offsets (CreateTime from several producers). A lookup for a
/// timestamp must find the first record at or after it even when a later index interval holds
/// only older timestamps: the time index records the running maximum, as Kafka's does.
#[test]
fn timestamp_lookups_find_an_early_record_with_a_late_timestamp() {
    block_on(async {
        let fs = MemFs::new();
        let cfg = one_segment_config(256);
        let timestamp = |i: u64| match i {
            0 => 1000,
            1 => 9000,
            i => 1000 + 10 * i as i64,
        };
        read_and_shut_down(filled_log(&fs, "ooo-0", &cfg, 0..60, |i| value_batch(i, 2, timestamp(i))).await)
            .await;
        let (log, _) = partition_log(&fs, "/data/ooo-0", cfg).await;
        let first_at = [(1400, Some((2, 9000))), (9000, Some((2, 9000))), (9002, None)];
        assert_lookups(&log, &first_at, Some((3, 9001))).await;
    });
}

/// A power loss during an append to an index file leaves a partial last entry. Recovery drops
/// it instead of rejecting the file (which would scan the whole segment), and the next
/// checkpoint replaces the file whole.
#[test]
fn a_torn_index_append_is_dropped_not_rebuilt() {
    block_on(async {
        let fs = MemFs::new();
        let cfg = one_segment_config(256);
        let expected =
            read_and_shut_down(filled_log(&fs, "torn-idx-0", &cfg, 0..50, timestamped(1000)).await).await;
        let index = Path::new("/data/torn-idx-0/00000000000000000000.index");
        let time_index = Path::new("/data/torn-idx-0/00000000000000000000.timeindex");
        let (good_index, good_time_index) = (fs.contents(index).unwrap(), fs.contents(time_index).unwrap());
        for (path, good, torn) in [(index, &good_index, 5), (time_index, &good_time_index, 7)] {
            let mut bytes = good.clone();
            bytes.extend_from_slice(&[0x7f; 12][..torn]);
            fs.set_contents(path, bytes);
        }
        {
            let (store, id, rec) = store_with_log(&fs, "torn-idx-0", &cfg).await;
            assert_eq!((rec.indexes_rebuilt, rec.bytes_scanned), (0, 0), "{rec:?}");
            assert_eq!(read_all(&store, id, 0).await, expected);
            store.shutdown().await.unwrap();
        }
        assert_eq!(fs.contents(index).unwrap(), good_index, "replaced whole");
        assert_eq!(fs.contents(time_index).unwrap(), good_time_index);
    });
}

#[test]
fn damaged_index_is_rebuilt() {
    block_on(async {
        let fs = MemFs::new();
        let cfg = one_segment_config(256);
        let expected = read_and_shut_down(filled_log(&fs, "idx-0", &cfg, 0..50, timestamped(0)).await).await;
        let index = Path::new("/data/idx-0/00000000000000000000.index");
        let good = fs.contents(index).unwrap();
        assert!(good.len() >= 16, "the index has entries");
        let mut bad = good.clone();
        bad.swap(3, 11); // entries no longer increase
        fs.set_contents(index, bad);
        let (store, id, rec) = store_with_log(&fs, "idx-0", &cfg).await;
        assert_eq!(rec.indexes_rebuilt, 1);
        for from in [0, 17, 50, 99] {
            let got = read_all(&store, id, from).await;
            let want: Vec<_> = expected.iter().filter(|b| b.0 + b.1 > from).cloned().collect();
            assert_eq!(got, want, "read from {from}");
        }
    });
}

/// A segment cut in the middle of its last batch after a clean shutdown (no journal left):
/// recovery cuts the log back to the last whole batch and goes on from there.
#[test]
fn torn_segment_without_journal_is_cut_to_last_whole_batch() {
    block_on(async {
        let fs = MemFs::new();
        read_and_shut_down(filled_log(&fs, "torn-0", &small_config(), 0..5, two_records).await).await;
        let seg = Path::new("/data/torn-0/00000000000000000000.log");
        let mut data = fs.contents(seg).unwrap();
        let cut = data.len() - 10;
        data.truncate(cut);
        fs.set_contents(seg, data);
        let (store, id, rec) = store_with_log(&fs, "torn-0", &small_config()).await;
        assert!(rec.bytes_truncated > 0 && !rec.problems.is_empty(), "{rec:?}");
        let o = store.offsets(id).unwrap();
        assert_eq!(o.high_watermark, 8, "four whole batches of two records remain");
        let t = store.append(id, &value_batch(9, 1, 0), 0, 0).unwrap();
        assert_eq!(t.info.base_offset, 8);
        store.flush_round().await;
        assert_eq!(read_all(&store, id, 0).await.len(), 5);
    });
}

/// Space a segment reserved past its data reads as zeros (the broker's segment files reserve it
/// ahead of their direct writes, and give it back when sealed or at a clean stop; a crash leaves
/// it). Recovery cuts it without calling it damage: nothing reported, nothing else dropped, and
/// the cut is durable (a sealed segment's size is trusted once the recovery point is past it).
#[test]
fn zeros_past_a_segments_data_are_cut_at_recovery_without_loss() {
    block_on(async {
        let fs = MemFs::new();
        let dir = Path::new("/data/zero-0");
        let segments = || segment_files(&fs, dir);
        read_and_shut_down(filled_log(&fs, "zero-0", &small_config(), 0..1, two_records).await).await;
        let expected;
        {
            // The recovery point stays in the first segment: the later ones are scanned.
            let (store, id, _) = store_with_log(&fs, "zero-0", &small_config()).await;
            for i in 1..120 {
                store.append(id, &two_records(i), 0, 0).unwrap();
                store.flush_round().await;
            }
            expected = read_all(&store, id, 0).await;
            // A process crash: the files keep what was written.
        }
        let segs = segments();
        assert!(segs.len() >= 4, "{segs:?}");
        let originals: Vec<Vec<u8>> = segs.iter().map(|p| fs.contents(p).unwrap()).collect();
        for (at, zeros) in [(1, 5000), (segs.len() - 2, 7), (segs.len() - 1, 4096)] {
            let mut data = originals[at].clone();
            data.resize(data.len() + zeros, 0);
            fs.set_contents(&segs[at], data);
        }
        let report = replay(&fs, &small_config()).await;
        assert!(report.problems.is_empty(), "{report:?}");
        fs.crash(|_| 0);
        assert_eq!(segments(), segs, "a segment was dropped");
        for (path, original) in segs.iter().zip(&originals) {
            assert!(
                fs.contents(path).as_ref() == Some(original),
                "{} is not cut back to its data, durably",
                path.display()
            );
        }
        let (store, id, rec) = store_with_log(&fs, "zero-0", &small_config()).await;
        assert!(rec.problems.is_empty() && rec.bytes_truncated == 0, "{rec:?}");
        assert_eq!(read_all(&store, id, 0).await, expected);
    });
}

/// The same damage after a crash, while the journal still holds the batch: replay restores it.
#[test]
fn torn_segment_is_restored_from_the_journal() {
    block_on(async {
        let fs = MemFs::new();
        // Crash: no shutdown. Segment data was only in the page cache.
        let expected = {
            let (store, id) = filled_log(&fs, "heal-0", &small_config(), 0..5, two_records).await;
            read_all(&store, id, 0).await
        };
        fs.crash(|_| 0);
        let seg = Path::new("/data/heal-0/00000000000000000000.log");
        assert!(
            fs.contents(seg).unwrap_or_default().is_empty(),
            "unsynced segment data is lost in the crash"
        );
        let report = replay(&fs, &small_config()).await;
        assert_eq!(report.entries_applied, 5, "{report:?}");
        let (store, id, _) = store_with_log(&fs, "heal-0", &small_config()).await;
        assert_eq!(read_all(&store, id, 0).await, expected);
    });
}

/// Journal files a checkpoint covered are kept (`.free`, at most two) and overwritten by the
/// next rotations; after a crash, replay finds exactly the entries of the current sequence in a
/// recycled file, not the older ones behind them, and removes the kept files.
#[test]
fn covered_journal_files_are_recycled_and_replay_ignores_their_old_entries() {
    block_on(async {
        let fs = MemFs::new();
        let journal_names = || -> Vec<String> {
            fs.paths()
                .into_iter()
                .filter(|p| p.starts_with("/data/strand-journal"))
                .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
                .collect()
        };
        let store = open_store(&fs, 8 << 10).await;
        let [a, b] = open_each(&store, ["a-0", "b-0"], &small_config()).await;
        let mut recycled = 0;
        for i in 0..10u64 {
            // Each file gets more entries than the last, so a recycled file always has older
            // entries left behind its new ones.
            for j in 0..(2 + i) {
                store.append(a, &value_batch(i * 100 + j, 2, 0), 0, 0).unwrap();
                store.append(b, &value_batch(i * 100 + j, 2, 0), 0, 0).unwrap();
                store.flush_round().await;
            }
            store.rotate_journal().await.unwrap();
            recycled += store.checkpoint().await.unwrap().journal_files_recycled;
            let names = journal_names();
            let free = names.iter().filter(|n| n.ends_with(".free")).count();
            assert!(free <= 2, "at most two files kept: {names:?}");
            assert_eq!(names.len() - free, 1, "one current file: {names:?}");
        }
        assert_eq!(
            recycled, 10,
            "every covered file was kept (two at a time) and reused"
        );
        // Three rounds into the current, recycled file, then a power loss that keeps only
        // what was synced: the segments lose those rounds, the journal has them.
        for j in 0..3 {
            store.append(a, &value_batch(900 + j, 2, 0), 0, 0).unwrap();
            store.flush_round().await;
        }
        let expected_a = read_all(&store, a, 0).await;
        let expected_b = read_all(&store, b, 0).await;
        drop(store);
        fs.crash(|_| 0);
        let report = replay(&fs, &small_config()).await;
        assert_eq!(
            (report.entries_applied, report.entries_present),
            (3, 0),
            "only the current sequence's entries: {report:?}"
        );
        assert!(
            journal_names().iter().all(|n| !n.ends_with(".free")),
            "replay removes the kept files"
        );
        let store = open_store(&fs, 8 << 10).await;
        let [a, b] = open_each(&store, ["a-0", "b-0"], &small_config()).await;
        assert_eq!(read_all(&store, a, 0).await, expected_a);
        assert_eq!(read_all(&store, b, 0).await, expected_b);
        store.append(a, &value_batch(1000, 2, 0), 0, 0).unwrap();
        store.flush_round().await;
        store.rotate_journal().await.unwrap();
        store.checkpoint().await.unwrap();
        store.shutdown().await.unwrap();
        assert_eq!(
            journal_names(),
            Vec::<String>::new(),
            "a clean shutdown leaves no journal file"
        );
    });
}

/// A batch of `n` records of `value_bytes` each.
fn big_batch(tag: u8, n: usize, value_bytes: usize) -> Vec<u8> {
    build::batch(&records(&vec![vec![tag; value_bytes]; n], None, &[], 1), 0)
}

#[test]
fn rounds_larger_than_a_staging_chunk_write_and_replay_every_piece() {
    block_on(async {
        let fs = MemFs::new();
        let config = segment_config(64 << 20, 256);
        let mut expected = Vec::new();
        {
            // Journaled: 3 MB in one round is several staged chunks and journal pieces, the first
            // of which creates the segment file.
            let store = open_store(&fs, 64 << 20).await;
            let (id, _) = store.open_log(key("big-0"), config.clone(), 0).await.unwrap();
            let mut last = None;
            for i in 0..75u8 {
                let b = big_batch(i, 10, 4000);
                let t = store.append(id, &b, 0, 0).unwrap();
                expected.push(stored(b, t.info.base_offset, 0));
                last = Some(t);
            }
            let stats = store.flush_round().await;
            assert!(
                stats.segment_bytes > 2 << 20 && stats.journal_bytes > stats.segment_bytes,
                "{stats:?}"
            );
            store.wait_durable(&last.unwrap()).await.unwrap();
            let all: Vec<Vec<u8>> = read_all(&store, id, 0).await.into_iter().map(|b| b.2).collect();
            assert_eq!(all, expected);
            // The journal is written with aligned writes past the page cache (O_DIRECT on the
            // shards), the segments through it.
            let (journals, others): (Vec<_>, Vec<_>) = fs
                .paths()
                .into_iter()
                .partition(|p| p.to_string_lossy().contains(strand_storage::journal::JOURNAL_DIR));
            assert!(
                !journals.is_empty() && journals.iter().all(|p| fs.written_direct(p)),
                "{journals:?}"
            );
            assert!(others.iter().all(|p| !fs.written_direct(p)), "{others:?}");
        }
        // Nothing of the segment was synced: everything comes back from the journal.
        let (store, id, _) = crash_and_reopen_log(&fs, "big-0", &config, 64 << 20).await;
        let all: Vec<Vec<u8>> = read_all(&store, id, 0).await.into_iter().map(|b| b.2).collect();
        assert_eq!(all, expected);
    });
}

/// A direct round (few logs) writes no journal entry and fsyncs the segment instead, including
/// an earlier segment a journaled round left unsynced. After a journaled round created a segment
/// file, rounds are journaled until a checkpoint has synced the directory; a direct round that
/// creates one (a roll) syncs the directory itself. A crash that drops every unsynced byte (and
/// every file whose directory entry was not synced) loses nothing acknowledged.
#[test]
fn direct_rounds_sync_segments_instead_of_the_journal() {
    block_on(async {
        let fs = MemFs::new();
        let (expected_a, expected_b);
        {
            let store = open_store_direct(&fs, 1 << 20, 1).await;
            let [a, b] = open_each(&store, ["da-0", "db-0"], &small_config()).await;
            // Two logs: journaled. Segment data only in the page cache.
            store.append(a, &value_batch(1, 20, 0), 0, 0).unwrap();
            store.append(b, &value_batch(2, 2, 0), 0, 0).unwrap();
            let stats = store.flush_round().await;
            assert!(!stats.direct && stats.journal_bytes > 0, "{stats:?}");
            // One log, but a journaled round created its segment file: journaled until a
            // checkpoint.
            store.append(a, &value_batch(3, 20, 0), 0, 0).unwrap();
            let stats = store.flush_round().await;
            assert!(
                !stats.direct,
                "a file a journaled round created needs a directory sync first: {stats:?}"
            );
            store.checkpoint().await.unwrap();
            // One log, enough to roll its 2 KiB segment a few times: every round direct.
            for i in 0..40 {
                store.append(a, &value_batch(10 + i, 20, 0), 0, 0).unwrap();
                let stats = store.flush_round().await;
                assert!(stats.segment_bytes > 0, "{stats:?}");
                assert!(stats.direct && stats.journal_bytes == 0, "round {i}: {stats:?}");
            }
            let segments = fs.list_dir(&root().join("da-0")).await.unwrap();
            let segments = segments.iter().filter(|n| n.ends_with(".log")).count();
            assert!(segments >= 3, "the test must roll segments: {segments} files");
            expected_a = read_all(&store, a, 0).await;
            // Two logs again: journaled, and lost from the segments in the crash below.
            store.append(a, &value_batch(100, 2, 0), 0, 0).unwrap();
            store.append(b, &value_batch(101, 2, 0), 0, 0).unwrap();
            let stats = store.flush_round().await;
            assert!(!stats.direct, "{stats:?}");
            expected_b = read_all(&store, b, 0).await;
        }
        let expected_a_len = expected_a.len();
        let store = crash_and_reopen(&fs, &small_config(), 1 << 20).await;
        let [a, b] = open_each(&store, ["da-0", "db-0"], &small_config()).await;
        let after_a = read_all(&store, a, 0).await;
        assert_eq!(after_a[..expected_a_len], expected_a[..]);
        assert_eq!(
            after_a.len(),
            expected_a_len + 1,
            "the last journaled batch is back"
        );
        assert_eq!(read_all(&store, b, 0).await, expected_b);
    });
}

/// Where a segment file's batches end: the first position that holds no whole batch.
fn batches_end(data: &[u8]) -> usize {
    let mut scanner = BatchScanner::new(data, true);
    scanner.by_ref().for_each(drop);
    scanner.position()
}

/// Checks what recovery trusts in log directory `dir`: each segment file below the segment its
/// recovery point lies in ends where its batches end.
fn segments_behind_the_recovery_point_end_at_their_data(fs: &MemFs, dir: &Path) {
    let Some(rp) = fs.contents(&dir.join("recovery-point")) else {
        return;
    };
    let Some((body, crc)) = rp.split_at_checked(rp.len().saturating_sub(4)) else {
        return;
    };
    let Some(fields) = body.strip_prefix(b"STRNDRP2") else {
        return;
    };
    if crc.len() != 4 || crc32c::crc32c(body) != u32::from_be_bytes([crc[0], crc[1], crc[2], crc[3]]) {
        return;
    }
    let point_segment = i64::from_be_bytes(fields[8..16].try_into().unwrap());
    for path in segment_files(fs, dir) {
        if segment_base(&path) < point_segment {
            let data = fs.contents(&path).unwrap();
            assert_eq!(
                batches_end(&data),
                data.len(),
                "{} lies behind the recovery point (segment {point_segment}) and holds more than its data",
                path.display()
            );
        }
    }
}

/// With segment files that reserve space past their data (as the broker's do), every segment
/// a log has rolled past ends at its data: those sealed at the roll, and those rolled past before
/// the round that first writes them created their files, once the next direct round or a
/// checkpoint has seen them (before a recovery point passes them). A crash then loses nothing
/// acknowledged, and recovery cuts the active segment's zeros without calling them damage.
#[test]
fn segments_rolled_past_end_at_their_data_with_space_reserved() {
    block_on(async {
        let fs = MemFs::new();
        fs.set_reserve_bytes(3000);
        let dir = root().join("seal-0");
        let rolled_past_end_at_their_data = |what: &str| {
            let mut segs: Vec<PathBuf> = fs
                .paths()
                .into_iter()
                .filter(|p| p.parent() == Some(dir.as_path()) && p.extension().is_some_and(|e| e == "log"))
                .collect();
            segs.sort();
            assert!(segs.len() >= 3, "the test must roll segments: {segs:?}");
            let active = segs.pop().unwrap();
            let data = fs.contents(&active).unwrap();
            assert!(
                data.len() > batches_end(&data),
                "the active segment reserves no space: {what}"
            );
            for p in segs {
                let data = fs.contents(&p).unwrap();
                assert_eq!(
                    batches_end(&data),
                    data.len(),
                    "{} holds more than its data: {what}",
                    p.display()
                );
            }
        };
        let expected;
        {
            let store = open_store_direct(&fs, 1 << 20, 1).await;
            let (id, _) = store.open_log(key("seal-0"), small_config(), 0).await.unwrap();
            // Each append written by a round of its own: sealed as the log rolls past them.
            for i in 0..40 {
                store.append(id, &value_batch(i, 20, 0), 0, 0).unwrap();
                let stats = store.flush_round().await;
                assert!(stats.direct, "round {i}: {stats:?}");
            }
            rolled_past_end_at_their_data("after rounds of one append");
            // Several segments rolled past before the round that creates their files.
            let segments_before = fs.paths().len();
            for i in 40..80 {
                store.append(id, &value_batch(i, 20, 0), 0, 0).unwrap();
            }
            let stats = store.flush_round().await;
            assert!(stats.direct, "{stats:?}");
            assert!(
                fs.paths().len() >= segments_before + 3,
                "the round must create several segment files"
            );
            // The round took its writes before their files existed: the next one seals them.
            store.append(id, &value_batch(80, 20, 0), 0, 0).unwrap();
            store.flush_round().await;
            rolled_past_end_at_their_data("after the round that created several segments");
            // And a checkpoint, before its recovery point passes them.
            for i in 81..120 {
                store.append(id, &value_batch(i, 20, 0), 0, 0).unwrap();
            }
            store.flush_round().await;
            store.checkpoint().await.unwrap();
            rolled_past_end_at_their_data("after a checkpoint");
            for i in 120..130 {
                store.append(id, &value_batch(i, 20, 0), 0, 0).unwrap();
                store.flush_round().await;
            }
            expected = read_all(&store, id, 0).await;
        }
        let (store, id, rec) = crash_and_reopen_log(&fs, "seal-0", &small_config(), 1 << 20).await;
        assert!(rec.problems.is_empty(), "{rec:?}");
        assert_eq!(read_all(&store, id, 0).await, expected);
    });
}

/// Rounds of more logs than `direct_sync_max_logs` skip the journal too when their logs carry
/// `direct_min_log_bytes` each on average, and are journaled when they carry less; a crash that
/// drops every unsynced byte loses nothing either kind acknowledged.
#[test]
fn rounds_of_many_logs_with_enough_bytes_each_skip_the_journal() {
    block_on(async {
        let fs = MemFs::new();
        let config = one_segment_config(256);
        let (big, small) = (value_batch(0, 60, 0).len(), value_batch(0, 1, 0).len());
        let min_log_bytes = 1000;
        assert!(big >= min_log_bytes && small * 3 < min_log_bytes, "{big} {small}");
        let mut expected = Vec::new();
        {
            let store = open_store_overlap(&fs, 1 << 20, 2, min_log_bytes, 0, 0).await;
            let mut ids = Vec::new();
            for i in 0..6 {
                ids.push(
                    store
                        .open_log(key(&format!("many-{i}")), config.clone(), 0)
                        .await
                        .unwrap()
                        .0,
                );
            }
            // The first round creates the segment files and syncs their directories itself.
            for r in 0..3u64 {
                for (i, id) in ids.iter().enumerate() {
                    store
                        .append(*id, &value_batch(100 * r + i as u64, 60, 0), 0, 0)
                        .unwrap();
                }
                let stats = store.flush_round().await;
                assert!(
                    stats.direct && stats.logs == 6 && stats.journal_bytes == 0 && stats.error.is_none(),
                    "six logs of {big} bytes each: {stats:?}"
                );
            }
            // A few bytes each: journaled.
            for (i, id) in ids.iter().enumerate() {
                store
                    .append(*id, &value_batch(1000 + i as u64, 1, 0), 0, 0)
                    .unwrap();
            }
            let stats = store.flush_round().await;
            assert!(
                !stats.direct && stats.journal_bytes > 0,
                "six logs of {small} bytes each: {stats:?}"
            );
            // The average decides: one large log carries five small ones.
            for (i, id) in ids.iter().enumerate() {
                let n = if i == 0 { 300 } else { 1 };
                store
                    .append(*id, &value_batch(2000 + i as u64, n, 0), 0, 0)
                    .unwrap();
            }
            let stats = store.flush_round().await;
            assert!(stats.direct && stats.journal_bytes == 0, "{stats:?}");
            for id in &ids {
                expected.push(read_all(&store, *id, 0).await);
            }
        }
        let store = crash_and_reopen(&fs, &config, 1 << 20).await;
        for (i, want) in expected.iter().enumerate() {
            let (id, _) = store
                .open_log(key(&format!("many-{i}")), config.clone(), 0)
                .await
                .unwrap();
            assert_eq!(&read_all(&store, id, 0).await, want, "log {i} after the crash");
        }
    });
}

#[test]
fn rounds_that_create_segment_files_stay_direct_and_sync_the_directory() {
    block_on(async {
        let fs = MemFs::new();
        let (expected, start);
        {
            let store = open_store_direct(&fs, 1 << 20, 1).await;
            let (a, _) = store.open_log(key("ds-0"), small_config(), 0).await.unwrap();
            assert_eq!(store.sync_changed_dirs().await, 0, "nothing wanted yet");
            // The first round creates the segment file, later ones roll: all direct, each
            // creating round syncing the directory itself (a crash below would otherwise lose
            // the new files: the in-memory file system drops unsynced directory entries).
            for i in 0..40 {
                store.append(a, &value_batch(10 + i, 20, 0), 0, 0).unwrap();
                let stats = store.flush_round().await;
                assert!(stats.direct, "round {i}: {stats:?}");
                assert_eq!(
                    store.sync_changed_dirs().await,
                    0,
                    "round {i} left a directory to sync"
                );
            }
            let segments = fs
                .list_dir(&root().join("ds-0"))
                .await
                .unwrap()
                .iter()
                .filter(|n| n.ends_with(".log"))
                .count();
            assert!(segments >= 3, "the test must roll segments: {segments} files");
            // A directory change no round synced (segments deleted below a new log start)
            // sends the next round through the journal until the flusher syncs the directory.
            start = read_all(&store, a, 0).await[10].0;
            store.delete_records(a, start).await.unwrap();
            store.append(a, &value_batch(99, 20, 0), 0, 0).unwrap();
            assert!(!store.flush_round().await.direct);
            assert_eq!(store.sync_changed_dirs().await, 1);
            store.append(a, &value_batch(100, 20, 0), 0, 0).unwrap();
            assert!(store.flush_round().await.direct);
            expected = read_all(&store, a, start).await;
        }
        // No checkpoint ran: what the direct rounds fsynced and the journal hold is all there is.
        let (store, a, _) = crash_and_reopen_log(&fs, "ds-0", &small_config(), 1 << 20).await;
        assert_eq!(read_all(&store, a, start).await, expected);
    });
}

/// Polls `fut` once with a waker that does nothing (the in-memory file system's slow I/O wakes
/// nothing; polling again makes progress).
fn poll_step<F: std::future::Future>(fut: std::pin::Pin<&mut F>) -> std::task::Poll<F::Output> {
    let waker = futures::task::noop_waker();
    std::future::Future::poll(fut, &mut std::task::Context::from_waker(&waker))
}

/// Runs the flusher's loop on `store` until `until` holds after a step, and returns the rounds
/// it finished so far and whether it ended; appends may be made by `between` after every step.
fn flush_until(
    store: &ShardStore<MemFs>,
    max_rounds: usize,
    mut between: impl FnMut(usize),
    mut until: impl FnMut() -> bool,
) -> (Vec<strand_storage::RoundStats>, bool) {
    let rounds = std::cell::RefCell::new(Vec::new());
    let mut ended = false;
    {
        let flush = store.flush_pending(max_rounds, |s| rounds.borrow_mut().push(s.clone()));
        futures::pin_mut!(flush);
        for step in 0..1000 {
            if poll_step(flush.as_mut()).is_ready() {
                ended = true;
                break;
            }
            between(step);
            if until() {
                break;
            }
        }
    }
    (rounds.into_inner(), ended)
}

/// A store on slow in-memory I/O whose direct rounds overlap from `overlap_min_bytes`, and one
/// log `name` whose first segment file exists with its directory synced (so its rounds can be
/// direct), holding one batch.
async fn overlapping_store(
    fs: &MemFs,
    overlap_min_bytes: usize,
    name: &str,
) -> (ShardStore<MemFs>, LogId, LogConfig) {
    fs.set_slow_io(true);
    let store = open_store_overlap(fs, 1 << 20, 2, 0, overlap_min_bytes, 0).await;
    let config = one_segment_config(256);
    let (id, _) = store.open_log(key(name), config.clone(), 0).await.unwrap();
    store.append(id, &big_batch(0, 1, 100), 0, 0).unwrap();
    store.flush_round().await;
    store.sync_changed_dirs().await;
    (store, id, config)
}

#[test]
fn appends_staged_during_a_round_s_fsyncs_are_written_under_them() {
    block_on(async {
        let fs = MemFs::new();
        let (store, id, config) = overlapping_store(&fs, 1000, "o-0").await;
        let mut tickets = Vec::new();
        tickets.push(store.append(id, &big_batch(1, 4, 500), 0, 0).unwrap());
        // While the first round syncs: a small append (below the 1000-byte piece size, so not
        // written yet), a large one (written, with the small one), and another large one (a
        // second piece). All three make the second round.
        let (rounds, ended) = flush_until(
            &store,
            3,
            |step| {
                let size = [10, 500, 500];
                if let Some(&size) = size.get(step) {
                    tickets.push(
                        store
                            .append(id, &big_batch(2 + step as u8, 2, size), 0, 0)
                            .unwrap(),
                    );
                }
            },
            || false,
        );
        assert!(ended, "the flusher returns once nothing is staged");
        assert_eq!(rounds.len(), 2, "{rounds:?}");
        assert!(rounds.iter().all(|r| r.direct && r.error.is_none()), "{rounds:?}");
        assert!(!rounds[0].overlapped);
        assert!(
            rounds[1].overlapped,
            "the second round's writes ran under the first's fsyncs"
        );
        assert!(rounds[1].writes >= 2, "written in pieces: {rounds:?}");
        for t in &tickets {
            store.wait_durable(t).await.unwrap();
        }
        let hw = store.offsets(id).unwrap().high_watermark;
        assert_eq!(hw, tickets.last().unwrap().info.last_offset + 1);
        // Everything acknowledged survives a power loss that keeps no unsynced byte.
        let all = read_all(&store, id, 0).await;
        assert_eq!(all.len(), 5);
        drop(store);
        let (store, id, _) = crash_and_reopen_log(&fs, "o-0", &config, 1 << 20).await;
        assert_eq!(read_all(&store, id, 0).await, all);
    });
}

/// A truncation's journal fence goes in a round taken alone (see `ShardStore::truncate_log`):
/// under a steady load of direct rounds of another log, each written under the previous one's
/// syncs, the flusher's loop still takes one, and the truncation ends.
#[test]
fn a_truncation_ends_under_a_load_of_overlapping_rounds() {
    block_on(async {
        let fs = MemFs::new();
        let (store, busy, _) = overlapping_store(&fs, 1, "busy-0").await;
        let (follower, _) = store.open_log(key("f-0"), small_config(), 0).await.unwrap();
        for tag in 0..3 {
            let end = store.offsets(follower).unwrap().log_end_offset;
            store
                .append_replica(follower, &value_batch(tag, 2, 0), end, 1, 0)
                .unwrap();
        }
        store.flush_round().await;
        store.sync_changed_dirs().await;
        store.append(busy, &big_batch(1, 2, 200), 0, 0).unwrap();
        let truncate = store.truncate_log(follower, 2);
        futures::pin_mut!(truncate);
        let truncated = std::cell::Cell::new(false);
        let mut tag = 1u8;
        let (rounds, _) = flush_until(
            &store,
            10_000,
            |step| {
                if step > 3 && !truncated.get() {
                    if let std::task::Poll::Ready(r) = poll_step(truncate.as_mut()) {
                        r.unwrap();
                        truncated.set(true);
                    }
                }
                tag = tag.wrapping_add(1);
                store.append(busy, &big_batch(tag, 2, 200), 0, 0).unwrap();
            },
            || truncated.get(),
        );
        assert!(
            rounds.iter().any(|r| r.overlapped),
            "rounds overlapped: {rounds:?}"
        );
        assert!(truncated.get(), "the truncation ended under the load");
        assert_eq!(store.offsets(follower).unwrap().log_end_offset, 2);
    });
}

/// A segment sealed (cut back to its data) while a round's `fdatasync` of it is in flight: that
/// sync may not cover the cut, so the segment keeps its mark and a later sync covers it before a
/// recovery point passes it. A power loss then finds it ending at its data. The roll is made at
/// every step of the round in turn.
#[test]
fn a_segment_cut_during_a_round_s_sync_is_synced_again_before_a_checkpoint_passes_it() {
    for roll_at in 0.. {
        let rolled = block_on(async {
            let fs = MemFs::new();
            fs.set_slow_io(true);
            fs.set_reserve_bytes(3000);
            let store = open_store_overlap(&fs, 1 << 20, 2, 0, usize::MAX, 0).await;
            let config = small_config();
            let (id, _) = store.open_log(key("cut-0"), config.clone(), 0).await.unwrap();
            store.append(id, &value_batch(0, 2, 0), 0, 0).unwrap();
            store.flush_round().await;
            store.sync_changed_dirs().await;
            store.append(id, &value_batch(1, 20, 0), 0, 0).unwrap();
            let mut rolled = false;
            flush_until(
                &store,
                4,
                |step| {
                    if step == roll_at {
                        // Big enough to roll the 2 KiB segment: the roll seals it.
                        store.append(id, &value_batch(2, 120, 0), 0, 0).unwrap();
                        rolled = true;
                    }
                },
                || false,
            );
            if !rolled {
                return false;
            }
            store.flush_round().await;
            store.checkpoint().await.unwrap();
            let all = read_all(&store, id, 0).await;
            drop(store);
            fs.crash(|_| 0);
            segments_behind_the_recovery_point_end_at_their_data(&fs, &root().join("cut-0"));
            let (store, id, rec) = crash_and_reopen_log(&fs, "cut-0", &config, 1 << 20).await;
            assert!(rec.problems.is_empty(), "roll at step {roll_at}: {rec:?}");
            assert_eq!(read_all(&store, id, 0).await, all, "roll at step {roll_at}");
            true
        });
        if !rolled {
            assert!(roll_at >= 3, "the round took only {roll_at} steps");
            break;
        }
    }
}

#[test]
fn a_round_overlapping_a_failed_one_fails_too() {
    block_on(async {
        let fs = MemFs::new();
        let (store, id, _config) = overlapping_store(&fs, 1, "f-0").await;
        let durable = store.offsets(id).unwrap().high_watermark;

        let first = store.append(id, &big_batch(1, 2, 300), 0, 0).unwrap();
        let second = std::cell::Cell::new(None);
        let mut injected = false;
        let (rounds, ended) = flush_until(
            &store,
            4,
            |step| {
                if step == 0 {
                    second.set(Some(store.append(id, &big_batch(2, 2, 300), 0, 0).unwrap()));
                } else if !injected && !store.has_pending() {
                    // A round overlapping the first one's fsync took the second append. That
                    // fsync fails; the overlapping round's own would succeed.
                    fs.fail_next_fsyncs(1);
                    injected = true;
                }
            },
            || false,
        );
        assert!(injected && ended);
        assert_eq!(rounds.len(), 2, "{rounds:?}");
        assert!(rounds[1].overlapped);
        assert!(
            rounds.iter().all(|r| r.error.is_some()),
            "a round after a failed one must fail: {rounds:?}"
        );
        let second = second.get().unwrap();
        assert!(store.wait_durable(&first).await.is_err());
        assert!(store.wait_durable(&second).await.is_err());
        let o = store.offsets(id).unwrap();
        assert_eq!((o.high_watermark, o.log_end_offset), (durable, durable));
        assert!(store.offline_reason().is_some());
    });
}

#[test]
fn disk_full_fails_the_round_and_keeps_acknowledged_data() {
    block_on(async {
        let fs = MemFs::new();
        let acked;
        {
            let (store, id, _) = store_with_log(&fs, "full-0", &small_config()).await;
            let t = store.append(id, &value_batch(1, 3, 0), 0, 0).unwrap();
            store.flush_round().await;
            store.wait_durable(&t).await.unwrap();
            acked = read_all(&store, id, 0).await;
            fs.set_capacity(Some(fs.used_bytes() + 10));
            let t2 = store.append(id, &value_batch(2, 3, 0), 0, 0).unwrap();
            let stats = store.flush_round().await;
            assert!(
                stats.error.as_deref().is_some_and(|e| e.contains("os error 28")),
                "{stats:?}"
            );
            let err = store.wait_durable(&t2).await.unwrap_err();
            assert!(err.is_disk_full(), "{err}");
            let refused = store.append(id, &value_batch(3, 1, 0), 0, 0).unwrap_err();
            assert!(refused.is_disk_full(), "later appends are refused: {refused}");
            // Reads of acknowledged data go on.
            assert_eq!(read_all(&store, id, 0).await, acked);
        }
        fs.crash(|n| n);
        fs.set_capacity(None);
        replay(&fs, &small_config()).await;
        let (store, id, _) = store_with_log(&fs, "full-0", &small_config()).await;
        let after = read_all(&store, id, 0).await;
        assert_eq!(after[..1], acked[..], "acknowledged data survives");
        let t = store.append(id, &value_batch(4, 1, 0), 0, 0).unwrap();
        assert!(t.info.base_offset >= 3);
    });
}

/// Bytes the journal files of `fs` hold.
fn journal_bytes_on(fs: &MemFs) -> u64 {
    fs.paths()
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "wal"))
        .map(|p| fs.contents(p).map_or(0, |c| c.len() as u64))
        .sum()
}

/// A full disk takes the store offline; once space is free again (and only then)
/// `try_resume` brings it back in place, and appends continue at the high watermark. The failed
/// round wrote its batch to the journal (it fitted) but not to the segment (it did not): that
/// journal entry, at the offset the next append gets again, must not come back after a crash in
/// place of the batch acknowledged there since (replay reads the old file first).
#[test]
fn disk_full_then_space_freed_resumes_writes_in_place() {
    block_on(async {
        let fs = MemFs::new();
        let (store, id, _) = store_with_log(&fs, "resume-0", &small_config()).await;
        append_each(&store, id, 0..1, two_records);
        let journal_before = journal_bytes_on(&fs);
        store.flush_round().await;
        // What a journaled round of one such batch adds to the journal.
        let journal_growth = journal_bytes_on(&fs) - journal_before;
        let acked = read_all(&store, id, 0).await;
        assert_eq!(acked.len(), 1);

        // Room for the journal entry of the next round, not for its segment write.
        fs.set_capacity(Some(fs.used_bytes() + journal_growth));
        let lost = store.append(id, &two_records(1), 0, 0).unwrap();
        let stats = store.flush_round().await;
        assert!(stats.error.is_some(), "the round hit the full disk: {stats:?}");
        assert!(store.wait_durable(&lost).await.unwrap_err().is_disk_full());
        let offline = store.offline().expect("offline after a full disk");
        assert!(offline.disk_full, "{offline:?}");
        assert!(store
            .append(id, &two_records(2), 0, 0)
            .unwrap_err()
            .is_disk_full());

        // Still full: nothing changes.
        assert!(
            matches!(store.try_resume().await, ResumeOutcome::WaitingForSpace(_)),
            "no space yet"
        );
        assert!(store.offline().is_some());
        // Some space, not enough.
        fs.set_capacity(Some(fs.used_bytes() + RESUME_FREE_BYTES / 2));
        assert!(matches!(
            store.try_resume().await,
            ResumeOutcome::WaitingForSpace(_)
        ));
        assert!(store.append(id, &two_records(2), 0, 0).is_err());

        // Space again: writes resume, at the offset the failed batch had.
        fs.set_capacity(None);
        match store.try_resume().await {
            ResumeOutcome::Resumed { logs_cut, .. } => assert_eq!(logs_cut, 1),
            other => panic!("not resumed: {other:?}"),
        }
        assert!(store.offline().is_none());
        assert!(matches!(store.try_resume().await, ResumeOutcome::Online));
        assert_eq!(
            read_all(&store, id, 0).await,
            acked,
            "acknowledged data untouched"
        );
        // The next round goes to a new journal file, the failed round's file waiting for a
        // checkpoint to retire it (which the crash below prevents).
        store.rotate_journal().await.unwrap();
        let t = store.append(id, &two_records(3), 0, 0).unwrap();
        assert_eq!(t.info.base_offset, 2, "the next offset is the high watermark");
        store.flush_round().await;
        store.wait_durable(&t).await.unwrap();
        let after = read_all(&store, id, 0).await;
        assert_eq!(after.len(), 2);
        assert_eq!(after[0], acked[0]);
        assert_eq!(
            after[1].2,
            stored(two_records(3), 2, 0),
            "the new batch at offset 2"
        );

        // A power loss keeping nothing unsynced: every acknowledged batch comes back, the new
        // one in place of the failed one.
        drop(store);
        fs.crash(|_| 0);
        let report = replay(&fs, &small_config()).await;
        assert!(report.problems.is_empty(), "{report:?}");
        let (store, id, _) = store_with_log(&fs, "resume-0", &small_config()).await;
        assert_eq!(read_all(&store, id, 0).await, after, "after a crash");
    });
}

/// A failed fsync is not a full disk: the store stays offline until a restart, however much
/// space is free.
/// A checkpoint taken while the active segment has no file yet (a roll began at the high
/// watermark, no round has written it) points at the end of the segment before, not at the
/// start of that one: a round failing for space discards it, and the segment before takes
/// appends again once the store resumes, with space reserved past them, which a point beyond
/// would vouch it does not have (seed 2032 of the crash simulation found it; seed 17179 the
/// same with a crash instead of a failed round).
#[test]
fn a_recovery_point_never_lies_in_a_segment_without_a_file() {
    block_on(async {
        let fs = MemFs::new();
        fs.set_reserve_bytes(3000);
        let store = open_store(&fs, 1 << 20).await;
        let (id, _) = store.open_log(key("a-0"), small_config(), 0).await.unwrap();
        let mut tag = 0;
        while store.offsets(id).unwrap().size_bytes <= 2048 - 160 {
            let t = store.append(id, &value_batch(tag, 1, 0), 0, 0).unwrap();
            tag += 1;
            store.flush_round().await;
            store.wait_durable(&t).await.unwrap();
        }
        assert_eq!(store.with_log(id, |l| l.segment_count()).unwrap(), 1);
        let (hw, first_size) = {
            let o = store.offsets(id).unwrap();
            (o.high_watermark, o.size_bytes)
        };
        // A roll: the new segment has no file until a round writes it.
        store.append(id, &value_batch(tag, 12, 0), 0, 0).unwrap();
        store.rotate_journal().await.unwrap();
        store.checkpoint().await.unwrap();
        let point = store.with_log(id, |l| l.last_checkpoint()).unwrap().unwrap();
        assert_eq!(
            (point.segment_base, point.position, point.offset),
            (0, first_size, hw)
        );
        fs.set_capacity(Some(fs.used_bytes()));
        assert!(store.flush_round().await.error.is_some());
        fs.set_capacity(None);
        assert!(matches!(store.try_resume().await, ResumeOutcome::Resumed { .. }));
        assert_eq!(store.with_log(id, |l| l.segment_count()).unwrap(), 1);
        // A small batch fits in the first segment again, with space reserved after it.
        let t = store.append(id, &value_batch(99, 1, 0), 0, 0).unwrap();
        store.flush_round().await;
        store.wait_durable(&t).await.unwrap();
        let expected = read_all(&store, id, 0).await;
        drop(store);
        fs.crash(|n| n);
        segments_behind_the_recovery_point_end_at_their_data(&fs, &root().join("a-0"));
        let store = crash_and_reopen(&fs, &small_config(), 1 << 20).await;
        let (id, _) = store.open_log(key("a-0"), small_config(), 0).await.unwrap();
        assert_eq!(read_all(&store, id, 0).await, expected);
    });
}

#[test]
fn a_failed_fsync_does_not_resume() {
    block_on(async {
        let fs = MemFs::new();
        let (store, id, _) = store_with_log(&fs, "noresume-0", &small_config()).await;
        append_each(&store, id, 0..1, two_records);
        fs.fail_next_fsyncs(1);
        let stats = store.flush_round().await;
        assert!(stats.error.is_some(), "{stats:?}");
        assert!(!store.offline().expect("offline").disk_full);
        assert!(matches!(store.try_resume().await, ResumeOutcome::NotResumable));
        assert!(store.append(id, &two_records(1), 0, 0).is_err());
    });
}

/// Seeded simulation: random appends over several logs, flush rounds, journal rotations,
/// checkpoints, retention of nothing, and crashes that tear unsynced writes (including mid-round
/// ones, made by failing the journal fsync), with segment files that reserve space past their
/// data or not. Before each recovery: every segment below a log's recovery point ends at its
/// data. After each crash: every acknowledged batch is back, byte for byte, at its offset;
/// offsets are contiguous; appends continue above every acknowledged offset.
#[test]
fn simulated_crashes_lose_nothing_acknowledged() {
    let seeds: u64 = std::env::var("STRAND_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        // Seed 1476 found a sealing race (a few seconds for 2,000 seeds even in a debug build).
        .unwrap_or(2000);
    let mut total = SimCounts::default();
    for seed in 0..seeds {
        match std::panic::catch_unwind(|| simulate(seed)) {
            Ok(counts) => total.add(counts),
            Err(msg) => {
                let text = msg
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| msg.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                panic!("simulation failed with seed {seed} (replay: STRAND_SIM_SEED={seed}): {text}");
            }
        }
    }
    eprintln!("{seeds} seeds: {total}");
    for (count, untested) in [
        (
            total.syncfs,
            "no simulated checkpoint synced the file system: that goes untested",
        ),
        (
            total.by_bytes,
            "no simulated round of many logs was direct by its bytes per log: that goes untested",
        ),
        (
            total.overlapped,
            "no simulated round overlapped the one before: the overlap goes untested",
        ),
        (
            total.recycled,
            "no simulated checkpoint kept a journal file: recycling goes untested",
        ),
        (
            total.beside,
            "no simulated direct round ran beside a checkpoint: that goes untested",
        ),
        (
            total.resumed,
            "no simulated store resumed after a full disk: that goes untested",
        ),
        (
            total.truncated_below_durable,
            "no simulated truncation cut a batch: truncation goes untested",
        ),
        (
            total.truncations_cut_short,
            "no power loss cut a simulated truncation short: that goes untested",
        ),
    ] {
        assert!(seeds < 50 || count > 0, "{untested}");
    }
}

#[test]
fn simulate_one_seed_from_env() {
    if let Some(seed) = std::env::var("STRAND_SIM_SEED").ok().and_then(|s| s.parse().ok()) {
        eprintln!("seed {seed}: {}", simulate(seed));
    }
}

/// What simulated runs did of what they exist to test.
#[derive(Debug, Default, Clone, Copy)]
struct SimCounts {
    /// Rounds that overlapped the round before.
    overlapped: usize,
    /// Journal files checkpoints kept to recycle.
    recycled: usize,
    /// Direct rounds that ran beside a checkpoint.
    beside: usize,
    /// Rounds direct by their bytes per log (more logs than `direct_sync_max_logs`).
    by_bytes: usize,
    /// Checkpoints that synced the file system instead of each file.
    syncfs: usize,
    /// Stores that took writes again after a round failed on a full disk.
    resumed: usize,
    /// Truncations of the follower's log that returned, and those of them that cut batches.
    truncated: usize,
    truncated_below_durable: usize,
    /// Truncations a power loss cut short.
    truncations_cut_short: usize,
}

impl SimCounts {
    fn add(&mut self, o: SimCounts) {
        self.overlapped += o.overlapped;
        self.recycled += o.recycled;
        self.beside += o.beside;
        self.by_bytes += o.by_bytes;
        self.syncfs += o.syncfs;
        self.resumed += o.resumed;
        self.truncated += o.truncated;
        self.truncated_below_durable += o.truncated_below_durable;
        self.truncations_cut_short += o.truncations_cut_short;
    }

    /// A checkpoint that finished.
    fn checkpoint(&mut self, stats: &CheckpointStats) {
        self.recycled += stats.journal_files_recycled;
        self.syncfs += usize::from(stats.syncfs);
    }
}

impl std::fmt::Display for SimCounts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} rounds overlapped the round before, {} journal files recycled, {} direct rounds beside a \
             checkpoint, {} direct by their bytes per log, {} checkpoints by file-system sync, {} \
             stores resumed after a full disk, {} truncations ({} cutting batches), {} truncations \
             cut short by a power loss",
            self.overlapped,
            self.recycled,
            self.beside,
            self.by_bytes,
            self.syncfs,
            self.resumed,
            self.truncated,
            self.truncated_below_durable,
            self.truncations_cut_short
        )
    }
}

/// The polls of a loop the simulation drives by hand.
struct Polls {
    n: i32,
    /// The poll at which the power fails.
    crash_at: Option<i32>,
}

impl Polls {
    /// One more poll (`stalled`: the message if there are too many); true when the power fails
    /// now.
    fn next_crashes(&mut self, stalled: &str) -> bool {
        self.n += 1;
        assert!(self.n < 10_000, "{stalled}");
        self.crash_at == Some(self.n)
    }
}

/// An append not yet durable: the log's index, its ticket and the batch as stored.
type Pending = (usize, strand_storage::AppendTicket, Vec<u8>);

/// The simulated log that is a Raft follower's: batches are appended to it at the log end as
/// its leader sends them ([`ShardStore::append_replica`]), and its suffix is truncated.
const FOLLOWER: usize = 3;

/// What the simulated logs hold, acknowledged or not: after a crash, each holds exactly a
/// prefix of it (so never a truncated batch, and no gap).
struct Model {
    /// Per log: offset -> the batch as stored there, for every batch the store took and has not
    /// cut since (a truncation that returned, or a failed round whose tail the store gave up
    /// for good).
    held: Vec<BTreeMap<i64, Vec<u8>>>,
    /// The follower's leader epoch (the Raft term of its leader): one more after each
    /// truncation, as a new leader's log is what a follower truncates for.
    follower_epoch: i32,
}

impl Model {
    /// The log `li` as recovered: each batch must be what the model holds at its offset.
    fn check_recovered(&mut self, li: usize, all: &[Batch], name: &str) {
        for (base, _, bytes) in all {
            assert!(
                self.held[li].get(base) == Some(bytes),
                "{name} holds at {base} a batch it does not hold (truncated, or another): it \
                 holds there {:?}",
                self.held[li].get(base).map(|b| b.len())
            );
        }
        // The unacknowledged rest was lost: offsets above the recovered end go again.
        self.held[li] = all.iter().map(|(b, _, bytes)| (*b, bytes.clone())).collect();
    }
}

/// Appends batch `op` (`n` records at timestamp `ts`) to log `li` (`ids[li]`) in leader epoch 3
/// (the follower's batches at its log end, in its leader's epoch), and counts the operation;
/// an append the store takes is pending until durable. Returns where it went.
fn append_pending(
    store: &ShardStore<MemFs>,
    (ids, li): (&[LogId], usize),
    op: &mut usize,
    (n, ts): (usize, i64),
    pending: &mut Vec<Pending>,
    model: &mut Model,
) -> Option<strand_storage::AppendInfo> {
    let b = value_batch(*op as u64, n, ts);
    *op += 1;
    let (t, epoch) = if li == FOLLOWER {
        let end = store.offsets(ids[li]).unwrap().log_end_offset;
        let epoch = model.follower_epoch;
        (store.append_replica(ids[li], &b, end, epoch, 0).ok()?, epoch)
    } else {
        (store.append(ids[li], &b, 3, 0).ok()?, 3)
    };
    let info = t.info;
    let s = stored(b, info.base_offset, epoch);
    model.held[li].insert(info.base_offset, s.clone());
    pending.push((li, t, s));
    Some(info)
}

/// The leader epochs a log holding `all` knows, as appends note them (an epoch begins where
/// the first batch of a larger one is), and the epoch a leader's open begins at the end.
fn expected_epochs(all: &[Batch], leader_epoch: i32, end: i64) -> Vec<(i32, i64)> {
    let mut epochs: Vec<(i32, i64)> = Vec::new();
    for (base, _, bytes) in all {
        let e = batch::BatchHeader::parse(bytes).unwrap().partition_leader_epoch;
        if epochs.last().is_none_or(|(last, _)| *last < e) {
            epochs.push((e, *base));
        }
    }
    if epochs.last().is_none_or(|(last, _)| *last < leader_epoch) {
        epochs.push((leader_epoch, end));
    }
    epochs
}

/// The idempotent producer's batch `i` was acknowledged at `offset`: it is stored there in log 0.
fn ack_producer(
    prod: &mut [(i32, Vec<u8>, Option<i64>)],
    acked: &mut BTreeMap<i64, Vec<u8>>,
    i: usize,
    offset: i64,
) {
    prod[i].2 = Some(offset);
    acked.insert(offset, stored(prod[i].1.clone(), offset, 3));
}

/// Moves the pending appends that are durable now into `acked`; the rest stay pending.
async fn ack_durable_now<F: Fs>(
    store: &ShardStore<F>,
    pending: &mut Vec<Pending>,
    acked: &mut [BTreeMap<i64, Vec<u8>>],
) {
    let mut still = Vec::new();
    for (li, t, s) in pending.drain(..) {
        match futures_lite::future::poll_once(store.wait_durable(&t)).await {
            Some(Ok(())) => {
                acked[li].insert(t.info.base_offset, s);
            }
            Some(Err(_)) => {}
            None => still.push((li, t, s)),
        }
    }
    *pending = still;
}

/// Moves the idempotent producer's pending appends that are durable now into `acked` (log 0's);
/// the rest stay pending.
async fn ack_producer_durable_now<F: Fs>(
    store: &ShardStore<F>,
    prod_pending: &mut Vec<(usize, strand_storage::AppendTicket)>,
    prod: &mut [(i32, Vec<u8>, Option<i64>)],
    acked: &mut BTreeMap<i64, Vec<u8>>,
) {
    let mut still = Vec::new();
    for (i, t) in prod_pending.drain(..) {
        match futures_lite::future::poll_once(store.wait_durable(&t)).await {
            Some(Ok(())) => ack_producer(prod, acked, i, t.info.base_offset),
            Some(Err(_)) => {}
            None => still.push((i, t)),
        }
    }
    *prod_pending = still;
}

/// The idempotent producer retries everything it has no acknowledgement for, in order, and
/// once more its last batch: an acknowledged one must come back with its offsets.
fn retry_producer(
    store: &ShardStore<MemFs>,
    id: LogId,
    prod: &[(i32, Vec<u8>, Option<i64>)],
    prod_pending: &mut Vec<(usize, strand_storage::AppendTicket)>,
    held: &mut BTreeMap<i64, Vec<u8>>,
) {
    prod_pending.clear();
    for (i, (_seq, batch, acked_at)) in prod.iter().enumerate() {
        if acked_at.is_some() && i + 1 != prod.len() {
            continue;
        }
        let t = store
            .append(id, batch, 3, 0)
            .unwrap_or_else(|e| panic!("an in-order retry was refused: {e}"));
        held.insert(t.info.base_offset, stored(batch.clone(), t.info.base_offset, 3));
        match acked_at {
            Some(off) => assert_eq!(
                t.info.base_offset, *off,
                "a retry of an acknowledged batch gets its offsets"
            ),
            None => prod_pending.push((i, t)),
        }
    }
}

/// One seeded run of four lives; returns what it did of what simulations exist to test.
fn simulate(seed: u64) -> SimCounts {
    let trace = std::env::var("STRAND_SIM_TRACE").is_ok();
    macro_rules! t { ($($a:tt)*) => { if trace { eprintln!($($a)*); } } }
    let counts = std::cell::RefCell::new(SimCounts::default());
    block_on(async {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let fs = MemFs::new();
        let logs = ["a-0", "b-0", "c-0", "d-1"];
        // acknowledged[log] = (offset -> stored batch bytes)
        let mut acked: Vec<BTreeMap<i64, Vec<u8>>> = vec![Default::default(); logs.len()];
        let mut appended_ops = 0usize;
        // An idempotent producer writing to log 0: (sequence, batch, acknowledged offset).
        let mut prod: Vec<(i32, Vec<u8>, Option<i64>)> = Vec::new();
        let mut prod_pending: Vec<(usize, strand_storage::AppendTicket)> = Vec::new();
        let mut model = Model {
            held: vec![Default::default(); logs.len()],
            follower_epoch: 3,
        };
        for _life in 0..4 {
            // What the last life left on disk: every segment behind a log's recovery point
            // ends at its data (recovery trusts their sizes), reserved space or not.
            for name in logs {
                segments_behind_the_recovery_point_end_at_their_data(&fs, &root().join(name));
            }
            if trace {
                for f in segment_files(&fs, &root().join(logs[FOLLOWER])) {
                    let data = fs.contents(&f).unwrap();
                    let batches: Vec<_> = BatchScanner::new(&data, true)
                        .map(|b| (b.position, b.header.base_offset, b.header.offset_count()))
                        .collect();
                    t!("{f:?} before replay ({} bytes): {batches:?}", data.len());
                }
            }
            let rep = replay(&fs, &small_config()).await;
            t!("replay {:?}", rep);
            // Each life picks how many logs a round may carry and still skip the journal.
            let direct_max_logs = rng.gen_range(0..=logs.len());
            // And when a direct round's writes may overlap the fsyncs of the one before, with
            // file I/O that yields (so that it does overlap) or completes at once.
            let overlap_min_bytes = [0, 1, 300, 3000][rng.gen_range(0..4)];
            // And how many staged bytes per log make a round of more logs direct as well.
            let direct_min_log_bytes = [0, 30, 100, 400][rng.gen_range(0..4)];
            // And from how many logs a checkpoint syncs the file system instead of each file.
            let checkpoint_syncfs_min_logs = [0, 2, 4][rng.gen_range(0..3)];
            let slow_io = rng.gen_bool(0.7);
            // Most appends made while rounds are in flight go to one log, so rounds stay direct.
            let hot = rng.gen_range(0..logs.len());
            fs.set_slow_io(slow_io);
            // And whether segment files hold zeros past their data until sealed, as the
            // broker's reserve space: crashes then leave zeros for recovery to cut.
            let reserve_bytes = [0, 0, 40, 3000][rng.gen_range(0..4)];
            fs.set_reserve_bytes(reserve_bytes);
            t!("direct rounds up to {direct_max_logs} logs or from {direct_min_log_bytes} B per log, overlap from {overlap_min_bytes} B, slow I/O {slow_io}, {reserve_bytes} B reserved");
            let store = open_store_overlap(
                &fs,
                1024 + rng.gen_range(0..4096),
                direct_max_logs,
                direct_min_log_bytes,
                overlap_min_bytes,
                checkpoint_syncfs_min_logs,
            )
            .await;
            let mut ids = Vec::new();
            // Every batch is appended in leader epoch 3; a new log starts it at offset 0. The
            // logs are opened together (created with one file-system sync when there are
            // `checkpoint_syncfs_min_logs` of them).
            let opened = store
                .open_logs(logs.iter().map(|n| (key(n), small_config())).collect(), 3, 0)
                .await;
            for (i, (name, opened)) in logs.iter().zip(opened).enumerate() {
                let (id, _) = opened.unwrap();
                // Check everything acknowledged so far.
                t!("{name}: {:?}", store.offsets(id).unwrap());
                let all = read_all(&store, id, 0).await;
                let mut expect_next = 0;
                for (base, count, _) in &all {
                    assert_eq!(*base, expect_next, "offsets are contiguous in {name}");
                    expect_next = base + count;
                }
                assert_acked(&all, &acked[i], name);
                model.check_recovered(i, &all, name);
                let mut seqs: Vec<i32> = all
                    .iter()
                    .map(|b| batch::BatchHeader::parse(&b.2).unwrap())
                    .filter(|h| h.producer_id == 99)
                    .map(|h| h.base_sequence)
                    .collect();
                let n = seqs.len();
                seqs.dedup();
                assert_eq!(
                    seqs.len(),
                    n,
                    "a producer batch is stored once in {name}: {seqs:?}"
                );
                assert!(
                    seqs.windows(2).all(|w| w[0] < w[1]),
                    "producer batches in sequence order in {name}"
                );
                // Timestamp lookups (ListOffsets) agree with the records themselves, whatever
                // the crash left of the index files: the largest timestamp, and the first record
                // at or after a timestamp (batches carry unordered timestamps).
                let metas: Vec<_> = all
                    .iter()
                    .flat_map(|b| strand_protocol::records::record_metas(&b.2, 1 << 20).unwrap())
                    .collect();
                let store_ref = &store;
                let lookup = |ts: i64| async move {
                    match store_ref.timestamp_plan(id, ts).unwrap() {
                        Some(plan) => plan.execute().await.unwrap(),
                        None => None,
                    }
                };
                let max = metas.iter().map(|m| m.timestamp).max();
                let first_at = |ts: i64| {
                    metas
                        .iter()
                        .find(|m| m.timestamp >= ts)
                        .map(|m| (m.offset, m.timestamp))
                };
                assert_eq!(
                    lookup(-3).await,
                    max.and_then(first_at),
                    "largest timestamp of {name}: {:?}",
                    metas.iter().map(|m| (m.offset, m.timestamp)).collect::<Vec<_>>()
                );
                for ts in [0, rng.gen_range(0..1010), rng.gen_range(0..1010), 1010] {
                    assert_eq!(
                        lookup(ts).await,
                        first_at(ts),
                        "first record at or after {ts} in {name}"
                    );
                }
                let hw = store.offsets(id).unwrap().high_watermark;
                // The log knows where its epoch began, whatever the crash left of its files.
                let epoch_end = store.with_log(id, |l| l.end_offset_for_epoch(3)).unwrap();
                let log_end = store.offsets(id).unwrap().log_end_offset;
                if i == FOLLOWER {
                    // Epochs of its leaders, cut with its log by every truncation.
                    let expect = expected_epochs(&all, 3, log_end);
                    let ends: Vec<_> = expect
                        .iter()
                        .enumerate()
                        .map(|(k, (e, _))| Some((*e, expect.get(k + 1).map_or(log_end, |n| n.1))))
                        .collect();
                    let got = store
                        .with_log(id, |l| {
                            let ends: Vec<_> =
                                expect.iter().map(|(e, _)| l.end_offset_for_epoch(*e)).collect();
                            (l.latest_epoch(), ends)
                        })
                        .unwrap();
                    if !(all.is_empty() && got.0.is_none()) {
                        assert_eq!(got, (expect.last().copied(), ends), "epochs of {name}");
                    }
                } else if all.is_empty() {
                    assert!(
                        matches!(epoch_end, None | Some((3, 0))),
                        "epoch 3 of empty {name}: {epoch_end:?}"
                    );
                } else {
                    assert_eq!(epoch_end, Some((3, log_end)), "epoch 3 of {name}");
                }
                if let Some((last, bytes)) = acked[i].iter().next_back() {
                    let count = batch::BatchHeader::parse(bytes).unwrap().offset_count();
                    assert!(
                        hw >= last + count,
                        "log end {hw} below acknowledged {last} in {name}"
                    );
                }
                ids.push(id);
            }
            // The producer retries everything it has no acknowledgement for, in order, and once
            // more an acknowledged batch: acknowledged ones must come back with their offsets.
            retry_producer(&store, ids[0], &prod, &mut prod_pending, &mut model.held[0]);
            let steps = rng.gen_range(10..80);
            let mut pending: Vec<Pending> = Vec::new();
            for _ in 0..steps {
                match rng.gen_range(0..10) {
                    // An idempotent producer keeps at most five batches unacknowledged, as Kafka's
                    // must: the log remembers five per producer to answer retries with.
                    0 if rng.gen_bool(0.5) && prod.iter().filter(|p| p.2.is_none()).count() < 5 => {
                        let seq = prod.last().map_or(0, |(s, b, _)| {
                            s + batch::BatchHeader::parse(b).unwrap().records_count
                        });
                        let b = producer_batch(99, 0, seq, rng.gen_range(1..4));
                        if let Ok(t) = store.append(ids[0], &b, 3, 0) {
                            t!("producer seq {seq} at {}", t.info.base_offset);
                            model.held[0]
                                .insert(t.info.base_offset, stored(b.clone(), t.info.base_offset, 3));
                            prod.push((seq, b, None));
                            prod_pending.push((prod.len() - 1, t));
                        }
                    }
                    0..=5 => {
                        let li = rng.gen_range(0..logs.len());
                        let n: usize = rng.gen_range(1..6);
                        let ts: i64 = rng.gen_range(0..1000);
                        let to = (&ids[..], li);
                        if let Some(at) =
                            append_pending(&store, to, &mut appended_ops, (n, ts), &mut pending, &mut model)
                        {
                            t!("append {} at {}..={}", logs[li], at.base_offset, at.last_offset);
                        }
                    }
                    6 | 7 if rng.gen_bool(0.5) => {
                        // The shard flusher's loop, polled step by step, with appends arriving
                        // while its rounds are in flight, and sometimes a power loss midway.
                        let crash_at = rng.gen_bool(0.2).then(|| rng.gen_range(0..16));
                        // Or a disk that starts failing fsyncs midway.
                        let fail_at = rng.gen_bool(0.1).then(|| rng.gen_range(0..16));
                        let max_rounds = rng.gen_range(1..6);
                        let mut life_ends = false;
                        {
                            let flush = store.flush_pending(max_rounds, |s| {
                                t!("round {:?}", s);
                                let mut c = counts.borrow_mut();
                                c.overlapped += usize::from(s.overlapped);
                                c.by_bytes += usize::from(s.direct && s.logs > direct_max_logs);
                            });
                            futures::pin_mut!(flush);
                            let waker = futures::task::noop_waker();
                            let mut cx = std::task::Context::from_waker(&waker);
                            let mut polls = Polls { n: 0, crash_at };
                            while std::future::Future::poll(flush.as_mut(), &mut cx).is_pending() {
                                if polls.next_crashes("flush_pending makes no progress") {
                                    t!("power loss with rounds in flight");
                                    life_ends = true;
                                    break;
                                }
                                if fail_at == Some(polls.n) {
                                    t!("fsyncs fail from now on");
                                    fs.set_fail_fsync(true);
                                    life_ends = true;
                                }
                                if rng.gen_bool(0.6) {
                                    let li = if rng.gen_bool(0.8) {
                                        hot
                                    } else {
                                        rng.gen_range(0..logs.len())
                                    };
                                    let n: usize = rng.gen_range(1..6);
                                    let ts: i64 = rng.gen_range(0..1000);
                                    let to = (&ids[..], li);
                                    let op = &mut appended_ops;
                                    if let Some(at) =
                                        append_pending(&store, to, op, (n, ts), &mut pending, &mut model)
                                    {
                                        t!("append {} at {}.. while flushing", logs[li], at.base_offset);
                                    }
                                }
                            }
                        }
                        // Acknowledge what is durable now; the rest stays pending.
                        ack_durable_now(&store, &mut pending, &mut acked).await;
                        ack_producer_durable_now(&store, &mut prod_pending, &mut prod, &mut acked[0]).await;
                        if life_ends {
                            break;
                        }
                        if rng.gen_bool(0.7) {
                            let synced = store.sync_changed_dirs().await;
                            t!("dir syncs {synced}");
                        }
                    }
                    6 | 7 => {
                        let stats = store.flush_round().await;
                        t!("round {:?}", stats);
                        // As the broker's flusher does after every round (most of the time here).
                        if rng.gen_bool(0.7) {
                            let synced = store.sync_changed_dirs().await;
                            t!("dir syncs {synced}");
                        }
                        if stats.error.is_none() {
                            for (li, t, s) in pending.drain(..) {
                                store.wait_durable(&t).await.unwrap();
                                acked[li].insert(t.info.base_offset, s);
                            }
                            for (i, t) in prod_pending.drain(..) {
                                store.wait_durable(&t).await.unwrap();
                                ack_producer(&mut prod, &mut acked[0], i, t.info.base_offset);
                            }
                        } else {
                            pending.clear();
                            prod_pending.clear();
                        }
                    }
                    8 if slow_io && rng.gen_bool(0.5) => {
                        // A checkpoint with flush rounds beside it, as the broker's flusher runs
                        // them while the checkpoint it spawned syncs, appends arriving, and
                        // sometimes a power loss midway: a direct round must not count on the
                        // checkpoint's unfinished fsyncs.
                        if store.rotate_journal().await.is_err() {
                            continue;
                        }
                        let crash_at = rng.gen_bool(0.3).then(|| rng.gen_range(0..40));
                        let mut life_ends = false;
                        {
                            let checkpoint = store.checkpoint();
                            futures::pin_mut!(checkpoint);
                            let mut checkpoint_done = false;
                            let mut flush: Option<
                                std::pin::Pin<Box<dyn std::future::Future<Output = ()> + '_>>,
                            > = None;
                            let waker = futures::task::noop_waker();
                            let mut cx = std::task::Context::from_waker(&waker);
                            let mut polls = Polls { n: 0, crash_at };
                            loop {
                                if polls.next_crashes("checkpoint and flush rounds make no progress") {
                                    t!("power loss with a checkpoint and rounds in flight");
                                    life_ends = true;
                                    break;
                                }
                                if !checkpoint_done {
                                    if let std::task::Poll::Ready(r) =
                                        std::future::Future::poll(checkpoint.as_mut(), &mut cx)
                                    {
                                        t!("checkpoint beside rounds {:?}", r);
                                        if let Ok(stats) = &r {
                                            counts.borrow_mut().checkpoint(stats);
                                        }
                                        checkpoint_done = true;
                                    }
                                }
                                if flush.is_none() && store.has_pending() {
                                    flush = Some(Box::pin(store.flush_pending(2, |s| {
                                        t!("round beside a checkpoint {:?}", s);
                                        counts.borrow_mut().beside += usize::from(s.direct);
                                    })));
                                }
                                if let Some(f) = flush.as_mut() {
                                    if std::future::Future::poll(f.as_mut(), &mut cx).is_ready() {
                                        flush = None;
                                    }
                                }
                                if checkpoint_done && flush.is_none() {
                                    break;
                                }
                                if !checkpoint_done && rng.gen_bool(0.5) {
                                    let n: usize = rng.gen_range(1..6);
                                    let to = (&ids[..], hot);
                                    let op = &mut appended_ops;
                                    if let Some(at) =
                                        append_pending(&store, to, op, (n, 7), &mut pending, &mut model)
                                    {
                                        t!(
                                            "append {} at {}.. beside a checkpoint",
                                            logs[hot],
                                            at.base_offset
                                        );
                                    }
                                }
                            }
                        }
                        ack_durable_now(&store, &mut pending, &mut acked).await;
                        if life_ends {
                            break;
                        }
                    }
                    8 => {
                        if (store.wants_checkpoint() || rng.gen_bool(0.3))
                            && store.rotate_journal().await.is_ok()
                        {
                            let r = store.checkpoint().await;
                            t!("checkpoint {:?}", r);
                            if let Ok(stats) = &r {
                                counts.borrow_mut().checkpoint(stats);
                            }
                        }
                    }
                    9 if rng.gen_bool(0.3) => {
                        // The disk fills up: a round fails for want of space (or just fits), the
                        // store stays offline while space is short, and takes writes again in
                        // place once it is freed; appends continue at the high watermarks.
                        fs.set_capacity(Some(fs.used_bytes() + rng.gen_range(0..6000)));
                        let stats = store.flush_round().await;
                        t!("round on a nearly full disk {:?}", stats);
                        if stats.error.is_some() {
                            let offline = store.offline().expect("offline after a failed round");
                            assert!(offline.disk_full, "{offline:?}");
                            assert!(
                                matches!(store.try_resume().await, ResumeOutcome::WaitingForSpace(_)),
                                "resumed without space"
                            );
                        }
                        fs.set_capacity(None);
                        let resumed = store.try_resume().await;
                        t!("space freed: {resumed:?}");
                        assert!(
                            matches!(resumed, ResumeOutcome::Online | ResumeOutcome::Resumed { .. }),
                            "{resumed:?}"
                        );
                        ack_durable_now(&store, &mut pending, &mut acked).await;
                        ack_producer_durable_now(&store, &mut prod_pending, &mut prod, &mut acked[0]).await;
                        if stats.error.is_some() {
                            // The failed round's tails are cut for good: the offsets go again.
                            for (li, id) in ids.iter().enumerate() {
                                let hw = store.offsets(*id).unwrap().high_watermark;
                                model.held[li].split_off(&hw);
                            }
                            counts.borrow_mut().resumed += 1;
                            // As a producer does after a retriable error.
                            retry_producer(&store, ids[0], &prod, &mut prod_pending, &mut model.held[0]);
                        }
                    }
                    9 if rng.gen_bool(0.6) => {
                        // The follower's log diverged from a new leader's: its suffix from a batch
                        // boundary goes (below the durable end as often as not), while appends to
                        // the other logs and flush rounds go on, and sometimes the power fails
                        // midway (before, during or after the fence's round, during the cut).
                        let id = ids[FOLLOWER];
                        let end = store.offsets(id).unwrap().log_end_offset;
                        let bounds: Vec<i64> = model.held[FOLLOWER].keys().copied().chain([end]).collect();
                        let cut = bounds[rng.gen_range(0..bounds.len())];
                        // Its caller forgets the appends at or above the cut: their batches go.
                        pending.retain(|(li, t, _)| *li != FOLLOWER || t.info.base_offset < cut);
                        // Until the truncation returns, a crash may leave any prefix of the log
                        // from the cut on.
                        acked[FOLLOWER].retain(|off, _| *off < cut);
                        let crash_at = rng.gen_bool(0.4).then(|| rng.gen_range(0..40));
                        t!(
                            "truncate {} at {cut} (end {end}), power loss at poll {crash_at:?}",
                            logs[FOLLOWER]
                        );
                        let mut life_ends = false;
                        let mut done = false;
                        {
                            let truncate = store.truncate_log(id, cut);
                            futures::pin_mut!(truncate);
                            let mut flush: Option<
                                std::pin::Pin<Box<dyn std::future::Future<Output = ()> + '_>>,
                            > = None;
                            let waker = futures::task::noop_waker();
                            let mut cx = std::task::Context::from_waker(&waker);
                            let mut polls = Polls { n: 0, crash_at };
                            loop {
                                if polls.next_crashes("a truncation and flush rounds make no progress") {
                                    t!("power loss during a truncation (done: {done})");
                                    life_ends = true;
                                    break;
                                }
                                if !done {
                                    if let std::task::Poll::Ready(r) =
                                        std::future::Future::poll(truncate.as_mut(), &mut cx)
                                    {
                                        r.unwrap_or_else(|e| panic!("truncation at {cut}: {e}"));
                                        done = true;
                                    }
                                }
                                // The flusher's loop (whose rounds may overlap; it hands back
                                // control when a directory sync or a rotation is due) or single
                                // rounds.
                                if flush.is_none() && store.has_pending() {
                                    let on_round = |s: &strand_storage::RoundStats| {
                                        t!("round beside a truncation {s:?}");
                                        assert!(s.error.is_none(), "{s:?}");
                                        counts.borrow_mut().overlapped += usize::from(s.overlapped);
                                    };
                                    flush = Some(if rng.gen_bool(0.5) {
                                        Box::pin(store.flush_pending(3, on_round))
                                    } else {
                                        let store = &store;
                                        Box::pin(async move {
                                            let s = store.flush_round().await;
                                            on_round(&s);
                                        })
                                    });
                                }
                                if let Some(f) = flush.as_mut() {
                                    if std::future::Future::poll(f.as_mut(), &mut cx).is_ready() {
                                        flush = None;
                                    }
                                }
                                if done && flush.is_none() {
                                    break;
                                }
                                if !done && rng.gen_bool(0.4) {
                                    let li = rng.gen_range(0..logs.len());
                                    let n: usize = rng.gen_range(1..6);
                                    let to = (&ids[..], li);
                                    let op = &mut appended_ops;
                                    let got =
                                        append_pending(&store, to, op, (n, 7), &mut pending, &mut model);
                                    assert!(
                                        li != FOLLOWER || got.is_none(),
                                        "a log being truncated took an append"
                                    );
                                }
                            }
                        }
                        if done {
                            model.held[FOLLOWER].split_off(&cut);
                            model.follower_epoch += 1;
                            let o = store.offsets(id).unwrap();
                            assert_eq!((o.log_end_offset, o.high_watermark), (cut, cut));
                            counts.borrow_mut().truncated += 1;
                            counts.borrow_mut().truncated_below_durable += usize::from(cut < end);
                        } else {
                            counts.borrow_mut().truncations_cut_short += 1;
                        }
                        ack_durable_now(&store, &mut pending, &mut acked).await;
                        ack_producer_durable_now(&store, &mut prod_pending, &mut prod, &mut acked[0]).await;
                        if life_ends {
                            break;
                        }
                    }
                    _ => {
                        // A crash in the middle of a round: the journal fsync fails.
                        if rng.gen_bool(0.2) {
                            fs.set_fail_fsync(true);
                            t!("failing round");
                            store.flush_round().await;
                            pending.clear();
                            break;
                        }
                    }
                }
            }
            drop(store);
            fs.set_fail_fsync(false);
            let mut crash_rng = ChaCha8Rng::seed_from_u64(rng.gen());
            fs.crash(|n| if n == 0 { 0 } else { crash_rng.gen_range(0..=n) });
            t!("crash; files: {:?}", fs.paths());
        }
        assert!(appended_ops > 0, "the simulation did something");
    });
    counts.into_inner()
}

#[test]
fn real_files_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    block_on(async {
        let fs = StdFs;
        let expected;
        {
            let journal_only = StoreConfig {
                direct_sync_max_logs: 0,
                ..StoreConfig::default()
            };
            let store = ShardStore::open(fs, root.clone(), 0, journal_only).await.unwrap();
            let (id, _) = store.open_log(key("real-0"), small_config(), 0).await.unwrap();
            for i in 0..30 {
                store.append(id, &value_batch(i, 3, i as i64), 0, 0).unwrap();
            }
            store.flush_round().await;
            expected = read_all(&store, id, 0).await;
            // No shutdown: the journal stays and must be replayed.
        }
        let report = replay_journals(&fs, &root, |_| Some(small_config()), 0)
            .await
            .unwrap();
        assert_eq!(report.files, 1);
        assert_eq!(
            report.entries_present, 30,
            "segments were written, so nothing to re-apply"
        );
        let store = ShardStore::open(fs, root.clone(), 0, StoreConfig::default())
            .await
            .unwrap();
        let (id, _) = store.open_log(key("real-0"), small_config(), 0).await.unwrap();
        assert_eq!(read_all(&store, id, 0).await, expected);
        assert!(root.join("real-0/partition.metadata").exists());
    });
}

fn producer_batch(pid: i64, epoch: i16, seq: i32, n: usize) -> Vec<u8> {
    let values: Vec<Vec<u8>> = (0..n)
        .map(|i| format!("p{pid}-s{}", seq + i as i32).into_bytes())
        .collect();
    build::batch_with_producer(&records(&values, None, &[], 0), 1_000, pid, epoch, seq)
}

#[test]
fn producer_retries_are_answered_with_the_original_offsets() {
    block_on(async {
        let fs = MemFs::new();
        let (store, id, _) = store_with_log(&fs, "idem-0", &small_config()).await;
        store.append(id, &value_batch(0, 2, 0), 0, 0).unwrap();
        let a = producer_batch(42, 0, 0, 3);
        let t1 = store.append(id, &a, 0, 0).unwrap();
        assert_eq!(t1.info.base_offset, 2);
        // A retry before the flush is a duplicate too, and is acknowledged with the original.
        let t2 = store.append(id, &a, 0, 0).unwrap();
        assert_eq!((t2.info.base_offset, t2.info.last_offset), (2, 4));
        store.flush_round().await;
        store.wait_durable(&t2).await.unwrap();
        let t3 = store.append(id, &a, 0, 0).unwrap();
        assert_eq!(t3.info.base_offset, 2);
        assert_eq!(
            store.offsets(id).unwrap().log_end_offset,
            5,
            "nothing appended twice"
        );
        let gap = store.append(id, &producer_batch(42, 0, 7, 1), 0, 0).unwrap_err();
        assert!(matches!(gap, strand_storage::StorageError::Producer(_)), "{gap}");
        let next = store.append(id, &producer_batch(42, 0, 3, 1), 0, 0).unwrap();
        assert_eq!(next.info.base_offset, 5);
    });
}

/// Duplicates are recognised after a restart, whether the producer state comes from the
/// checkpointed snapshot (clean shutdown) or is rebuilt from the log and journal (crash); and a
/// batch lost in a crash is not mistaken for a duplicate when its producer retries it.
#[test]
fn producer_state_survives_restarts_and_forgets_lost_batches() {
    for clean in [true, false] {
        block_on(async {
            let fs = MemFs::new();
            {
                let (store, id, _) = store_with_log(&fs, "idem-1", &small_config()).await;
                store.append(id, &producer_batch(7, 0, 0, 2), 0, 0).unwrap();
                store.append(id, &producer_batch(7, 0, 2, 2), 0, 0).unwrap();
                store.flush_round().await;
                if clean {
                    store.shutdown().await.unwrap();
                } else {
                    // Staged but never flushed: lost in the crash, never acknowledged.
                    store.append(id, &producer_batch(7, 0, 4, 1), 0, 0).unwrap();
                }
            }
            if !clean {
                fs.crash(|_| 0);
            }
            replay(&fs, &small_config()).await;
            let (store, id, _) = store_with_log(&fs, "idem-1", &small_config()).await;
            let dup = store.append(id, &producer_batch(7, 0, 2, 2), 0, 0).unwrap();
            assert_eq!(
                dup.info.base_offset, 2,
                "clean={clean}: the retry gets the original offsets"
            );
            assert_eq!(store.offsets(id).unwrap().log_end_offset, 4);
            let retry = store.append(id, &producer_batch(7, 0, 4, 1), 0, 0).unwrap();
            assert_eq!(
                retry.info.base_offset, 4,
                "clean={clean}: the lost batch is appended, not a duplicate"
            );
        });
    }
}

/// Two logs on slow in-memory I/O, each holding one durable batch in its own directory: `gone`
/// (to be removed) and `stays`.
async fn store_with_two_logs(
    fs: &MemFs,
    checkpoint_syncfs_min_logs: usize,
) -> (ShardStore<MemFs>, LogId, LogId) {
    fs.set_slow_io(true);
    let store = open_store_overlap(fs, 1 << 20, 2, 1, 0, checkpoint_syncfs_min_logs).await;
    let [gone, stays] = open_each(&store, ["gone-0", "stays-0"], &small_config()).await;
    for id in [gone, stays] {
        store.append(id, &big_batch(0, 1, 100), 0, 0).unwrap();
    }
    store.flush_round().await;
    store.sync_changed_dirs().await;
    (store, gone, stays)
}

/// Stages a batch larger than the rest of `gone`'s segment: the next round creates the log's next
/// segment file, and syncs its directory after it.
fn stage_a_roll(store: &ShardStore<MemFs>, gone: LogId) {
    store.append(gone, &big_batch(1, 2, 1500), 0, 0).unwrap();
}

/// Removing `gone` while `io` runs: the removal must wait for that I/O, then take the directory
/// away; the store stays online and `stays` takes and serves appends.
async fn remove_during<T>(
    fs: &MemFs,
    store: &ShardStore<MemFs>,
    gone: LogId,
    stays: LogId,
    io: impl std::future::Future<Output = T>,
) -> T {
    let (out, removed) = futures::join!(io, async {
        futures_lite::future::yield_now().await;
        store.remove_log(gone).await
    });
    removed.unwrap();
    assert_eq!(store.offline_reason(), None);
    assert!(
        fs.paths().iter().all(|p| !p.to_string_lossy().contains("gone-0")),
        "{:?}",
        fs.paths()
    );
    let ticket = store.append(stays, &big_batch(7, 1, 100), 0, 0).unwrap();
    let round = store.flush_round().await;
    assert_eq!(round.error, None);
    store.wait_durable(&ticket).await.unwrap();
    assert_eq!(read_all(store, stays, 0).await.len(), 2);
    out
}

#[test]
fn a_log_removed_while_a_round_writes_it_leaves_the_store_online() {
    block_on(async {
        let fs = MemFs::new();
        let (store, gone, stays) = store_with_two_logs(&fs, 0).await;
        stage_a_roll(&store, gone);
        let round = remove_during(&fs, &store, gone, stays, store.flush_round()).await;
        assert!(round.direct, "{round:?}");
        assert_eq!(round.error, None, "the removed log's I/O must not fail the round");
    });
}

#[test]
fn a_log_removed_while_a_checkpoint_writes_it_leaves_the_store_online() {
    for syncfs_min_logs in [0, 1] {
        block_on(async {
            let fs = MemFs::new();
            let (store, gone, stays) = store_with_two_logs(&fs, syncfs_min_logs).await;
            let stats = remove_during(&fs, &store, gone, stays, store.checkpoint()).await;
            let stats = stats.unwrap_or_else(|e| panic!("syncfs_min_logs={syncfs_min_logs}: {e}"));
            assert_eq!(stats.logs, 2);
            assert_eq!(stats.syncfs, syncfs_min_logs > 0);
        });
    }
}

/// Retention deleting segments whose index files a running checkpoint is writing: no index file
/// may outlive its segment.
#[test]
fn retention_during_a_checkpoint_leaves_no_index_without_its_segment() {
    block_on(async {
        let fs = MemFs::new();
        fs.set_slow_io(true);
        let cfg = retention_config(Some(4096), None);
        let (store, _) = filled_log(&fs, "ret-0", &cfg, 0..100, timestamped(1000)).await;
        let (checkpoint, deleted) = futures::join!(store.checkpoint(), async {
            futures_lite::future::yield_now().await;
            store.retention_pass(10_000).await
        });
        checkpoint.unwrap();
        assert_eq!(deleted.len(), 1, "retention deleted segments");
        let paths: Vec<String> = fs
            .paths()
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        for p in &paths {
            if let Some(stem) = p.strip_suffix(".index").or_else(|| p.strip_suffix(".timeindex")) {
                assert!(
                    paths.contains(&format!("{stem}.log")),
                    "{p} outlived its segment: {paths:?}"
                );
            }
        }
    });
}

/// A log opened again under the same name (a share group's state log, a topic created again)
/// while the removal of the old one waits for a round's I/O: the new log waits for the old
/// directory to go, then gets a directory of its own that the removal does not take away.
#[test]
fn a_log_opened_again_while_its_removal_waits_keeps_its_directory() {
    block_on(async {
        let fs = MemFs::new();
        let (store, gone, stays) = store_with_two_logs(&fs, 0).await;
        stage_a_roll(&store, gone);
        let again = LogKey {
            dir_name: "gone-0".to_owned(),
            incarnation: [9; 16],
        };
        let (round, removed, reopened) = futures::join!(
            store.flush_round(),
            async {
                futures_lite::future::yield_now().await;
                store.remove_log(gone).await
            },
            async {
                futures_lite::future::yield_now().await;
                futures_lite::future::yield_now().await;
                store.open_log(again, small_config(), 0).await
            }
        );
        assert_eq!(round.error, None);
        removed.unwrap();
        let (reopened, _) = reopened.unwrap();
        assert_eq!(
            store.offsets(reopened).unwrap().log_end_offset,
            0,
            "a new, empty log"
        );
        let ticket = store.append(reopened, &big_batch(2, 1, 100), 0, 0).unwrap();
        let ticket2 = store.append(stays, &big_batch(2, 1, 100), 0, 0).unwrap();
        assert_eq!(store.flush_round().await.error, None);
        store.wait_durable(&ticket).await.unwrap();
        store.wait_durable(&ticket2).await.unwrap();
        assert_eq!(store.offline_reason(), None);
        assert_eq!(read_all(&store, reopened, 0).await.len(), 1);
        assert!(
            fs.paths().iter().any(|p| p.starts_with("/data/gone-0/")),
            "{:?}",
            fs.paths()
        );
    });
}

/// One record of `value_bytes` bytes (a pattern set by `tag`).
fn large_batch(tag: u64, value_bytes: usize) -> Vec<u8> {
    let value: Vec<u8> = (0..value_bytes).map(|i| (i as u64 * 31 + tag) as u8).collect();
    build::batch(&records(&[value], Some(b"k"), &[], 0), 0)
}

/// `execute_sendable` finds, from the batches' headers alone, the very batches `execute` reads:
/// a region of the file when they are large enough, the bytes themselves otherwise (small
/// batches, short answers, a file that does not let its bytes be sent).
#[test]
fn sendable_reads_find_the_same_batches_as_reads() {
    use std::os::unix::fs::FileExt;
    use strand_storage::ReadData;
    const MIN_LEN: usize = 64 << 10;
    block_on(async {
        let fs = MemFs::new();
        let store = open_store(&fs, 64 << 20).await;
        let cfg = segment_config(4 << 20, 4096);
        let (id, _) = store.open_log(key("send-0"), cfg, 0).await.unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let mut next = 0i64;
        let append = |b: Vec<u8>, records: i64, next: &mut i64| {
            store.append(id, &b, 0, 0).unwrap();
            *next += records;
        };
        // Large batches, then a run of small ones, then large ones again; the segment rolls
        // somewhere in between.
        for t in 0..60 {
            append(large_batch(t, rng.gen_range(17_000..90_000)), 1, &mut next);
        }
        let small_from = next;
        for t in 0..150 {
            append(value_batch(t, 2, 0), 2, &mut next);
        }
        let small_to = next;
        for t in 60..120 {
            append(large_batch(t, rng.gen_range(17_000..90_000)), 1, &mut next);
        }
        store.flush_round().await;

        let mut regions = 0;
        let mut copied = 0;
        let bound = FileRegions::for_process(4096);
        for sendable in [false, true] {
            fs.set_sendable(sendable.then_some(bound));
            for offset in (0..next).step_by(3) {
                for max_bytes in [1, 50_000, 200_000, 700_000, 3 << 20] {
                    let plan = |o| store.plan_read(id, o, max_bytes).unwrap().unwrap();
                    let want = plan(offset).execute().await.unwrap();
                    let got = plan(offset).execute_sendable(MIN_LEN).await.unwrap();
                    let what = format!("offset {offset}, max_bytes {max_bytes}, sendable {sendable}");
                    match got {
                        ReadData::Bytes(b) => {
                            assert!(b == want, "{what}: bytes differ from a read");
                            copied += 1;
                        }
                        ReadData::Region(r) => {
                            assert!(sendable, "{what}: a region from a file that sends nothing");
                            assert!(r.len >= MIN_LEN, "{what}: region of {} bytes", r.len);
                            let mut buf = vec![0u8; r.len];
                            std::fs::File::from(r.fd).read_exact_at(&mut buf, r.pos).unwrap();
                            assert!(
                                buf == want[..],
                                "{what}: the region holds other batches than a read"
                            );
                            regions += 1;
                        }
                    }
                }
            }
        }
        // From the start of the small batches, the headers run out before the answer is
        // full: read and copied.
        let plan = store.plan_read(id, small_from, 200_000).unwrap().unwrap();
        let got = plan.execute_sendable(MIN_LEN).await.unwrap();
        assert!(
            matches!(got, ReadData::Bytes(_)),
            "small batches sent as a region"
        );
        assert!(small_to > small_from);
        eprintln!("{regions} regions, {copied} reads copied");
        assert!(regions > 100, "large batches were not sent as regions: {regions}");
    });
}

/// Rounds taken while the round that creates a segment's file is still in flight write through
/// the file that round created: one handle per segment file, so that a handle's rule that direct
/// writes and reads near the end never run together sees every write of the file.
#[test]
fn rounds_overlapping_a_segment_file_s_creation_write_through_its_one_handle() {
    block_on(async {
        let fs = MemFs::new();
        fs.set_slow_io(true);
        let store = open_store_overlap(&fs, 1 << 20, 2, 0, 1, 0).await;
        let config = one_segment_config(256);
        let (id, _) = store.open_log(key("c-0"), config.clone(), 0).await.unwrap();
        store.sync_changed_dirs().await;
        let mut tickets = vec![store.append(id, &big_batch(1, 2, 300), 0, 0).unwrap()];
        let (rounds, ended) = flush_until(
            &store,
            6,
            |step| {
                if step < 4 {
                    tickets.push(
                        store
                            .append(id, &big_batch(2 + step as u8, 2, 300), 0, 0)
                            .unwrap(),
                    );
                }
            },
            || false,
        );
        assert!(ended, "the flusher returns once nothing is staged");
        assert!(
            rounds.iter().any(|r| r.overlapped),
            "no round overlapped the one creating the segment file: {rounds:?}"
        );
        for t in &tickets {
            store.wait_durable(t).await.unwrap();
        }
        let opens: Vec<_> = fs
            .segment_opens()
            .into_iter()
            .filter(|(p, _)| p.to_string_lossy().contains("c-0"))
            .collect();
        assert_eq!(opens.len(), 1, "{opens:?}");
        assert_eq!(
            opens[0].1, 1,
            "the segment file was opened more than once: {opens:?}"
        );
        let all = read_all(&store, id, 0).await;
        assert_eq!(all.len(), tickets.len());
        drop(store);
        let (store, id, _) = crash_and_reopen_log(&fs, "c-0", &config, 1 << 20).await;
        assert_eq!(read_all(&store, id, 0).await, all);
    });
}

/// A damaged batch header on the way: the sendable read answers exactly as a plain read does
/// (here: the batches before it), never a region over the damage.
#[test]
fn a_damaged_header_makes_a_sendable_read_answer_as_a_plain_read() {
    use strand_storage::ReadData;
    block_on(async {
        let fs = MemFs::new();
        fs.set_sendable(Some(FileRegions::for_process(4096)));
        let store = open_store(&fs, 64 << 20).await;
        let cfg = segment_config(4 << 20, 4096);
        let (id, _) = store.open_log(key("damaged-0"), cfg, 0).await.unwrap();
        let sizes = [40_000, 50_000, 60_000, 45_000];
        let mut starts = Vec::new();
        let mut at = 0usize;
        for (t, n) in sizes.iter().enumerate() {
            let b = large_batch(t as u64, *n);
            starts.push(at);
            at += b.len();
            store.append(id, &b, 0, 0).unwrap();
        }
        store.flush_round().await;
        let segment = fs
            .paths()
            .into_iter()
            .find(|p| p.to_string_lossy().contains("damaged-0") && p.extension().is_some_and(|e| e == "log"))
            .unwrap();
        let mut data = fs.contents(&segment).unwrap();
        // The third batch's magic byte (offset 16 in the header).
        data[starts[2] + 16] = 9;
        fs.set_contents(&segment, data);
        let plan = || store.plan_read(id, 0, 1 << 20).unwrap().unwrap();
        let want = plan().execute().await;
        let got = plan().execute_sendable(64 << 10).await;
        match (want, got) {
            (Ok(w), Ok(ReadData::Bytes(g))) => assert!(w == g, "bytes differ from a plain read"),
            (Err(_), Err(_)) => {}
            (w, g) => panic!("a plain read gave {w:?}, the sendable read {g:?}"),
        }
    });
}

/// A direct round syncs the segments the log rolled past only once: later rounds sync the
/// active segment alone, not every segment written since the last checkpoint.
#[test]
fn direct_rounds_stop_syncing_segments_behind_a_roll_once_synced() {
    block_on(async {
        let fs = MemFs::new();
        let store = open_store_direct(&fs, 1 << 30, 2).await;
        let (id, _) = store.open_log(key("rolls"), small_config(), 0).await.unwrap();
        // Rolls: 2 KiB segments, a round per batch, no checkpoint.
        let mut tickets = Vec::new();
        for tag in 0..40 {
            tickets.push(store.append(id, &value_batch(tag, 40, 5), 0, 0).unwrap());
            let round = store.flush_round().await;
            assert!(round.direct && round.error.is_none(), "{round:?}");
        }
        for t in &tickets {
            store.wait_durable(t).await.unwrap();
        }
        let segments = store.with_log(id, |l| l.segment_count()).unwrap();
        assert!(segments >= 5, "{segments} segments: the test needs rolls");
        // One more batch that fits the active segment: one file to sync.
        let before = fs.fsync_count();
        let t = store.append(id, &value_batch(99, 1, 5), 0, 0).unwrap();
        let round = store.flush_round().await;
        assert!(round.direct && round.error.is_none(), "{round:?}");
        store.wait_durable(&t).await.unwrap();
        assert_eq!(
            fs.fsync_count() - before,
            1,
            "the active segment only, not the {segments} segments behind it"
        );
        // Everything acknowledged survives a power loss right after.
        drop(store);
        let (store, id, _) = crash_and_reopen_log(&fs, "rolls", &small_config(), 1 << 30).await;
        assert_eq!(store.offsets(id).unwrap().high_watermark, t.info.last_offset + 1);
        assert_eq!(store.with_log(id, |l| l.segment_count()).unwrap(), segments);
    });
}

/// Zeros behind the recovery point (the sealing rule broken, as before `dbf048b`'s fix, or by
/// a file system that kept the reserved tail): recovery trusts the segment's size and does not
/// read it, so the zeros stay, counted in the log's size. Reads must still return exactly the
/// records, whatever their size bound and wherever they start in the damaged segment.
#[test]
fn zeros_behind_the_recovery_point_do_not_change_what_reads_return() {
    block_on(async {
        let fs = MemFs::new();
        let dir = Path::new("/data/zrp-0");
        let segments = || segment_files(&fs, dir);
        let expected;
        {
            let (store, id, _) = store_with_log(&fs, "zrp-0", &small_config()).await;
            for i in 0..120 {
                store.append(id, &value_batch(i, 2, 0), 0, 0).unwrap();
                store.flush_round().await;
            }
            expected = read_all(&store, id, 0).await;
            // A clean stop: the recovery point moves to the last segment.
            store.shutdown().await.unwrap();
        }
        let segs = segments();
        assert!(segs.len() >= 4, "{segs:?}");
        let mut data = fs.contents(&segs[1]).unwrap();
        data.resize(data.len() + 5000, 0);
        fs.set_contents(&segs[1], data);
        let (store, id, rec) = store_with_log(&fs, "zrp-0", &small_config()).await;
        assert!(
            rec.problems.is_empty() && rec.bytes_scanned < 4096,
            "the damaged segment lies behind the recovery point and is not read: {rec:?}"
        );
        assert_eq!(read_all(&store, id, 0).await, expected);
        assert_eq!(read_all_by(&store, id, 0, 1 << 20).await, expected);
        for from in segment_base(&segs[1])..segment_base(&segs[2]) {
            let want: Vec<_> = expected
                .iter()
                .filter(|(b, n, _)| b + n > from)
                .cloned()
                .collect();
            assert_eq!(read_all_by(&store, id, from, 1 << 20).await, want, "from {from}");
        }
    });
}
