//! Acknowledged means durable: kill -9 the broker under an acks=all producer, restart it, and
//! read every acknowledged record back at the offset it was acknowledged with; the same after
//! tearing the last segment file the way a power loss can (mid-batch when only the journal made
//! the batch durable, after the acknowledged bytes when the segment itself was fsynced); and a
//! graceful SIGTERM loses nothing.

use std::collections::{BTreeMap, VecDeque};
use std::fs;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kafka_protocol::messages::ProduceResponse;
use kafka_protocol::records::Compression;
use rdkafka::producer::Producer;
use rdkafka::Offset;
use strand_compat_tests::admin::{self, versions};
use strand_compat_tests::clients::{self, Delivery};
use strand_compat_tests::data::{Consumed, Gen, TestRecord};
use strand_compat_tests::raw::{self, walk_batches, BatchPos, RawConn};
use strand_compat_tests::{metric_sum, metric_sum_where, unique_topic, wait_for, Broker};

const PARTITIONS: i32 = 3;

/// With [`Writer::AllPartitions`], a broker whose every flush round goes through the journal:
/// the three partitions on one shard, so that a round, which carries them all, has more logs
/// than a direct round takes by count (two), and no round direct by its bytes per log instead.
const JOURNALED_ROUNDS: &[(&str, &str)] = &[
    ("strand.shards", "1"),
    ("strand.journal.direct.min.log.bytes", "0"),
];

/// Records from this index on have values of [`LARGE_VALUE_BYTES`] ([`Writer::LargeRecords`]).
const LARGE_FROM: usize = 1 << 30;
const LARGE_VALUE_BYTES: usize = 16 << 10;

/// Record `i` of the durability producer: partition `i % 3`, key `k<i>`, a value with random
/// bytes derived from `i` (32 to 127 of them, or [`LARGE_VALUE_BYTES`] from [`LARGE_FROM`]),
/// one header.
fn record(i: usize) -> TestRecord {
    let mut g = Gen::new(i as u64 ^ 0xD0_0D);
    let mut value = format!("durable-{i}-").into_bytes();
    let len = if i >= LARGE_FROM {
        LARGE_VALUE_BYTES
    } else {
        32 + g.below(96) as usize
    };
    value.extend(g.bytes(len, &[]));
    TestRecord {
        partition: (i as i32) % PARTITIONS,
        key: Some(format!("k{i}").into_bytes()),
        value: Some(value),
        headers: vec![("i".to_string(), Some(i.to_string().into_bytes()))],
        timestamp: Some(1_700_000_000_000 + i as i64),
    }
}

/// Which record a consumed one is, checking it is byte-identical to what was sent.
fn identify(c: &Consumed) -> usize {
    let key = c
        .key
        .as_deref()
        .unwrap_or_else(|| panic!("null key at {}/{}", c.partition, c.offset));
    let i: usize = std::str::from_utf8(key)
        .ok()
        .and_then(|k| k.strip_prefix('k'))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("foreign record at {}/{}: key {key:?}", c.partition, c.offset));
    assert!(
        c.same_content(&record(i)),
        "record at {}/{} has the key of record {i} but not its content",
        c.partition,
        c.offset
    );
    i
}

struct Run {
    /// Every record sent, by index: the delivery report.
    reports: BTreeMap<usize, Delivery>,
    sent: usize,
    /// The broker's `/metrics` just before the stop.
    metrics_at_stop: String,
}

impl Run {
    /// The sum of a series in the broker's `/metrics` just before the stop.
    fn total(&self, series: &str) -> f64 {
        metric_sum(&self.metrics_at_stop, series)
    }

    fn acked(&self) -> impl Iterator<Item = (usize, i32, i64)> + '_ {
        self.reports
            .iter()
            .filter_map(|(&i, r)| r.as_ref().ok().map(|&(p, o)| (i, p, o)))
    }

    fn acked_in(&self, partition: i32) -> Vec<(usize, i64)> {
        let mut v: Vec<_> = self
            .acked()
            .filter(|a| a.1 == partition)
            .map(|(i, _, o)| (i, o))
            .collect();
        v.sort_by_key(|x| x.1);
        v
    }
}

/// How the records are produced.
#[derive(Clone, Copy)]
enum Writer {
    /// rdkafka, which sends a request per partition as its batches fill.
    Rdkafka,
    /// rdkafka, with records of [`LARGE_VALUE_BYTES`]: enough bytes arrive while a round syncs
    /// for the next to overlap it.
    LargeRecords,
    /// Raw Produce requests, each carrying a batch of [`RAW_BATCH_RECORDS`] records for every
    /// partition, so that every flush round of a shard owning them all carries them all.
    AllPartitions,
}

/// Records per partition in each request of [`Writer::AllPartitions`].
const RAW_BATCH_RECORDS: usize = 10;

/// Runs an acks=all producer with `in_flight` requests in flight per connection (acknowledgement
/// order stays log order: nothing is retried before the stop) and stops the broker with `stop`
/// (SIGKILL, SIGTERM) once `min_acked` records were acknowledged, while the producer is still
/// sending. Returns every delivery report.
fn produce_until_stopped(
    broker: &mut Broker,
    topic: &str,
    min_acked: usize,
    in_flight: &str,
    writer: Writer,
    stop_broker: impl FnOnce(&mut Broker),
) -> Run {
    let feed = Feed {
        bootstrap: broker.bootstrap(),
        topic: topic.to_string(),
        in_flight: in_flight.to_string(),
        stop: Arc::default(),
        sent: Arc::default(),
    };
    let (stop, sent) = (feed.stop.clone(), feed.sent.clone());
    let (log, thread) = match writer {
        Writer::Rdkafka => rdkafka_until_stopped(feed, 0),
        Writer::LargeRecords => rdkafka_until_stopped(feed, LARGE_FROM),
        Writer::AllPartitions => raw_until_stopped(feed),
    };
    wait_for(
        Duration::from_secs(90),
        &format!("{min_acked} acknowledged records"),
        || {
            let acked = log.lock().expect("log").values().filter(|r| r.is_ok()).count();
            (acked >= min_acked).then_some(())
        },
    );
    let metrics_at_stop = broker.metrics();
    stop_broker(broker);
    let sent_at_stop = sent.load(Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    thread.join().expect("producer thread");
    let reports = log.lock().expect("log").clone();
    let sent = sent.load(Ordering::Relaxed);
    assert_eq!(
        reports.len(),
        sent,
        "every sent record must have a delivery report"
    );
    let failed = reports.values().filter(|r| r.is_err()).count();
    eprintln!(
        "sent {sent} ({sent_at_stop} when stopped), acknowledged {}, failed {failed}",
        sent - failed
    );
    assert!(failed > 0, "the stop did not happen mid-run: no delivery failed");
    Run {
        reports,
        sent,
        metrics_at_stop,
    }
}

/// Delivery reports by record index, shared with the producer thread that writes them.
type Reports = Arc<Mutex<BTreeMap<usize, Delivery>>>;

/// What a producer thread is given: where to write, with how many requests in flight, and what
/// it shares with the test (the flag that stops it, and how many records it has sent).
struct Feed {
    bootstrap: String,
    topic: String,
    in_flight: String,
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicUsize>,
}

/// Sends records from index `first` on with rdkafka until `stop`, then resolves every one still
/// queued.
fn rdkafka_until_stopped(feed: Feed, first: usize) -> (Reports, std::thread::JoinHandle<()>) {
    let producer = clients::logged_producer(
        &feed.bootstrap,
        &[
            ("max.in.flight.requests.per.connection", &feed.in_flight),
            ("linger.ms", "2"),
            ("message.timeout.ms", "5000"),
            ("request.timeout.ms", "4000"),
            ("queue.buffering.max.messages", "5000"),
        ],
    );
    let log = producer.context().reports.clone();
    let Feed {
        topic, stop, sent, ..
    } = feed;
    let thread = std::thread::spawn(move || {
        let mut i = first;
        while !stop.load(Ordering::Relaxed) {
            clients::send_record(&producer, &topic, i, &record(i));
            i += 1;
            sent.store(i - first, Ordering::Relaxed);
            producer.poll(Duration::ZERO);
        }
        // Resolve everything still queued: after the kill these fail by message.timeout.ms.
        let _ = producer.flush(Duration::from_secs(30));
        producer.poll(Duration::from_millis(100));
    });
    (log, thread)
}

/// Sends Produce requests (acks=all) of one batch per partition, keeping `in_flight` of them
/// outstanding, until `stop` or the broker goes away; records of a request that fails, or gets
/// no answer, fail.
fn raw_until_stopped(feed: Feed) -> (Reports, std::thread::JoinHandle<()>) {
    let log: Reports = Arc::default();
    let Feed {
        bootstrap,
        topic,
        in_flight,
        stop,
        sent,
    } = feed;
    let in_flight: usize = in_flight.parse().expect("requests in flight");
    let mut conn = RawConn::connect(&bootstrap).unwrap_or_else(|e| panic!("connect to {bootstrap}: {e}"));
    let reports = log.clone();
    let thread = std::thread::spawn(move || {
        let report = |indexes: &[usize], outcome: &dyn Fn(usize) -> Delivery| {
            let mut reports = reports.lock().expect("log");
            for (k, &i) in indexes.iter().enumerate() {
                reports.insert(i, outcome(k));
            }
        };
        // Requests sent and not answered: each partition's record indexes, in batch order.
        let mut pending: VecDeque<Vec<(i32, Vec<usize>)>> = VecDeque::new();
        let mut next = 0;
        let mut broken = false;
        loop {
            while !broken && pending.len() < in_flight && !stop.load(Ordering::Relaxed) {
                let parts: Vec<(i32, Vec<usize>)> = (0..PARTITIONS)
                    .map(|p| {
                        let from = next + p as usize;
                        let step = PARTITIONS as usize;
                        (p, (0..RAW_BATCH_RECORDS).map(|k| from + k * step).collect())
                    })
                    .collect();
                next += RAW_BATCH_RECORDS * PARTITIONS as usize;
                sent.store(next, Ordering::Relaxed);
                let batches = parts
                    .iter()
                    .map(|(p, indexes)| (*p, raw_batch(indexes)))
                    .collect();
                let request = admin::produce_request(&topic, -1, batches);
                let sent_ok = conn.send_request(versions::PRODUCE, &request).is_ok();
                pending.push_back(parts);
                broken = !sent_ok;
            }
            let Some(parts) = pending.pop_front() else {
                return;
            };
            let answer = if broken {
                None
            } else {
                conn.read_response()
                    .and_then(|r| r.decode::<ProduceResponse>(versions::PRODUCE))
                    .ok()
            };
            let Some(answer) = answer else {
                broken = true;
                for (_, indexes) in &parts {
                    report(indexes, &|_| Err("no answer".to_string()));
                }
                continue;
            };
            for (p, indexes) in &parts {
                let a = admin::produce_answer(&answer, *p);
                let (code, base) = (a.error_code, a.base_offset);
                report(indexes, &|k| match code {
                    0 => Ok((*p, base + k as i64)),
                    _ => Err(format!("error code {code}")),
                });
            }
        }
    });
    (log, thread)
}

/// Records `indexes` (of one partition) as one uncompressed batch.
fn raw_batch(indexes: &[usize]) -> bytes::Bytes {
    let records: Vec<_> = indexes
        .iter()
        .map(|&i| {
            let r = record(i);
            let mut raw = raw::record(r.key.as_deref(), r.value.as_deref(), r.timestamp.unwrap_or(0));
            for (name, value) in r.headers {
                raw.headers.insert(name.into(), value.map(Into::into));
            }
            raw
        })
        .collect();
    raw::encode_batch(&records, Compression::None)
}

/// Reads a whole partition (from offset 0 to latest) with rdkafka, checking that offsets are
/// exactly 0..latest-1 and every record is one the producer sent.
fn read_partition(bootstrap: &str, topic: &str, partition: i32) -> Vec<(i64, usize)> {
    let mut conn = admin::connect(bootstrap);
    assert_eq!(
        admin::earliest(&mut conn, topic, partition),
        0,
        "log start of {partition}"
    );
    let end = admin::latest(&mut conn, topic, partition);
    let got = clients::rdkafka_consume(
        bootstrap,
        topic,
        partition,
        Offset::Beginning,
        end as usize,
        Duration::from_secs(60),
    );
    got.iter()
        .enumerate()
        .map(|(n, c)| {
            assert_eq!(
                c.offset, n as i64,
                "partition {partition}: gap or reordering at offset {n}"
            );
            (c.offset, identify(c))
        })
        .collect()
}

/// Every acknowledged record of `partition` is at its acknowledged offset; acknowledged ones
/// appear in send order.
fn check_acked_present(run: &Run, log: &[(i64, usize)], partition: i32, below: i64) {
    let acked = run.acked_in(partition);
    for w in acked.windows(2) {
        assert!(
            w[0].0 < w[1].0,
            "partition {partition}: record {} acknowledged at a lower offset than {}",
            w[1].0,
            w[0].0
        );
    }
    for &(i, o) in acked.iter().filter(|a| a.1 < below) {
        let at = log.get(o as usize).unwrap_or_else(|| {
            panic!(
                "partition {partition}: acknowledged record {i} at offset {o} is gone (log ends at {})",
                log.len()
            )
        });
        assert_eq!(
            at.1, i,
            "partition {partition} offset {o}: acknowledged record {i}, found record {}",
            at.1
        );
    }
}

/// Produces `per_partition` new records to each partition after the restart: their offsets
/// must continue the recovered log exactly (never reuse one) and lie above every offset
/// acknowledged before the crash; the old records must be unchanged afterwards.
fn check_new_writes(bootstrap: &str, topic: &str, run: &Run, logs: &BTreeMap<i32, Vec<(i64, usize)>>) {
    let base = run.sent + 1_000_000;
    let new: Vec<TestRecord> = (0..PARTITIONS as usize * 5).map(|k| record(base + k)).collect();
    let offsets = clients::rdkafka_produce(bootstrap, topic, &new);
    for p in 0..PARTITIONS {
        let end = logs[&p].len() as i64;
        let max_acked = run.acked_in(p).last().map(|a| a.1).unwrap_or(-1);
        let got: Vec<i64> = new
            .iter()
            .zip(&offsets)
            .filter(|(r, _)| r.partition == p)
            .map(|(_, &o)| o)
            .collect();
        assert_eq!(
            got,
            (end..end + 5).collect::<Vec<_>>(),
            "partition {p}: offsets after restart"
        );
        assert!(
            got[0] > max_acked,
            "partition {p}: offset {} reused (acknowledged up to {max_acked})",
            got[0]
        );
        let after = read_partition(bootstrap, topic, p);
        assert_eq!(
            &after[..logs[&p].len()],
            &logs[&p][..],
            "partition {p}: old records changed by new writes"
        );
        let tail: Vec<usize> = after[logs[&p].len()..].iter().map(|x| x.1).collect();
        let want: Vec<usize> = (0..new.len())
            .filter(|k| new[*k].partition == p)
            .map(|k| base + k)
            .collect();
        assert_eq!(tail, want, "partition {p}: new records read back");
    }
}

/// A broker (with `configs`), a fresh topic, and an acks=all producer (one request in flight)
/// until kill -9.
fn kill9_under_load(name: &str, reason: &str, configs: &[(&str, &str)]) -> (Broker, String, Run) {
    stopped_under_load(name, reason, configs, "1", 3000, Writer::Rdkafka, Broker::kill9)
}

/// A broker (with `configs`), a fresh topic, and an acks=all `writer` with 5 requests in flight
/// until kill -9, once it has `min_acked` acknowledgements.
fn kill9_under_pipelined_load(
    name: &str,
    configs: &[(&str, &str)],
    min_acked: usize,
    writer: Writer,
) -> (Broker, String, Run) {
    let reason = "kills and restarts the broker";
    stopped_under_load(name, reason, configs, "5", min_acked, writer, Broker::kill9)
}

/// A broker (with `configs`), a fresh topic, and an acks=all producer until `stop_broker`.
fn stopped_under_load(
    name: &str,
    reason: &str,
    configs: &[(&str, &str)],
    in_flight: &str,
    min_acked: usize,
    writer: Writer,
    stop_broker: impl FnOnce(&mut Broker),
) -> (Broker, String, Run) {
    let mut builder = Broker::builder().needs_spawned(reason);
    for (k, v) in configs {
        builder = builder.config(k, v);
    }
    let mut broker = builder.start();
    let topic = unique_topic(name);
    admin::create_topic(&broker.bootstrap(), &topic, PARTITIONS, &[]);
    let run = produce_until_stopped(&mut broker, &topic, min_acked, in_flight, writer, stop_broker);
    (broker, topic, run)
}

/// Restarts the broker, checks that every acknowledged record is back (see
/// [`check_acked_present`]) and that it takes new writes, and that it still runs. Returns the
/// bootstrap address and the logs read.
fn restart_and_check_acked(
    broker: &mut Broker,
    topic: &str,
    run: &Run,
) -> (String, BTreeMap<i32, Vec<(i64, usize)>>) {
    let (bootstrap, logs) =
        restart_and_read(broker, topic, |p, log| check_acked_present(run, log, p, i64::MAX));
    check_new_writes(&bootstrap, topic, run, &logs);
    broker.assert_running();
    (bootstrap, logs)
}

/// Restarts the broker and reads every partition back, running `check` on each; returns the
/// bootstrap address and the logs read.
fn restart_and_read(
    broker: &mut Broker,
    topic: &str,
    mut check: impl FnMut(i32, &[(i64, usize)]),
) -> (String, BTreeMap<i32, Vec<(i64, usize)>>) {
    broker.restart();
    let bootstrap = broker.bootstrap();
    let mut logs = BTreeMap::new();
    for p in 0..PARTITIONS {
        let log = read_partition(&bootstrap, topic, p);
        check(p, &log);
        logs.insert(p, log);
    }
    (bootstrap, logs)
}

/// kill -9 under pipelined load of `writer` with `configs` (`min_acked` acknowledged first),
/// after which the broker's counter `series` must show flush rounds that did `what` (or the
/// test tested nothing); nothing acknowledged is lost.
fn kill9_with_rounds_that(
    name: &str,
    configs: &[(&str, &str)],
    (min_acked, writer): (usize, Writer),
    series: &str,
    what: &str,
) {
    let (mut broker, topic, run) = kill9_under_pipelined_load(name, configs, min_acked, writer);
    let rounds = run.total(series);
    eprintln!(
        "before the kill: {} flush rounds, {} direct, {rounds} of them {what}",
        run.total("strand_flush_rounds_total"),
        run.total("strand_flush_direct_rounds_total")
    );
    assert!(
        rounds > 0.0,
        "no flush round {what} before the kill: the test tested nothing"
    );
    restart_and_check_acked(&mut broker, &topic, &run);
}

#[test]
fn acked_records_survive_kill9_under_load() {
    let (mut broker, topic, run) = kill9_under_load("kill9", "kills and restarts the broker", &[]);
    restart_and_check_acked(&mut broker, &topic, &run);
}

/// Pipelined produce requests of large records, so that direct flush rounds overlap the fsyncs
/// of the one before (what is staged meanwhile, from 64 KiB, is written as the next round):
/// still nothing acknowledged is lost.
#[test]
fn acked_records_survive_kill9_with_overlapping_flush_rounds() {
    kill9_with_rounds_that(
        "kill9-overlap",
        &[],
        (3_000, Writer::LargeRecords),
        "strand_flush_overlapped_rounds_total",
        "overlapped another",
    );
}

/// Rounds of several logs made durable by one file-system sync (`syncfs`) instead of the
/// journal (`strand.journal.direct.min.log.bytes`, here from 1 byte per log), under pipelined
/// produce: nothing acknowledged is lost to kill -9. The three partitions are on one shard and
/// every request carries them all, so that every round carries more logs than a direct round
/// takes by count.
#[test]
fn acked_records_survive_kill9_with_filesystem_sync_rounds() {
    let configs = [
        ("strand.journal.direct.min.log.bytes", "1"),
        ("strand.shards", "1"),
    ];
    kill9_with_rounds_that(
        "kill9-syncfs",
        &configs,
        (30_000, Writer::AllPartitions),
        "strand_flush_syncfs_rounds_total",
        "was made durable by a file-system sync",
    );
}

/// Every round journaled ([`JOURNALED_ROUNDS`]) into 1 MiB journal files, so that checkpoints
/// keep covered files and later rotations overwrite them: after kill -9, the replay of a
/// recycled file must restore what its current sequence acknowledged and ignore the older
/// entries behind it.
#[test]
fn acked_records_survive_kill9_with_recycled_journal_files() {
    let (mut broker, topic, run) = kill9_under_pipelined_load(
        "kill9-recycle",
        &[JOURNALED_ROUNDS, &[("strand.journal.segment.bytes", "1048576")]].concat(),
        60_000,
        Writer::AllPartitions,
    );
    let recycled = run.total("strand_journal_files_recycled_total");
    let journal_dir = broker.data_dir().join("strand-journal");
    let names: Vec<String> = fs::read_dir(&journal_dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", journal_dir.display()))
        .map(|e| e.expect("dir entry").file_name().to_string_lossy().into_owned())
        .collect();
    eprintln!(
        "before the kill: {} flush rounds, {} checkpoints, {recycled} journal files recycled; journal \
         directory: {names:?}",
        run.total("strand_flush_rounds_total"),
        run.total("strand_checkpoints_total"),
    );
    assert!(
        recycled >= 2.0,
        "fewer than two journal files were kept for recycling before the kill: the test tested nothing"
    );
    restart_and_check_acked(&mut broker, &topic, &run);
    let left: Vec<String> = fs::read_dir(&journal_dir)
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".free"))
                .collect()
        })
        .unwrap_or_default();
    assert!(
        left.len() <= 2 * 2,
        "kept journal files are bounded by strand.journal.recycle.files (2) per shard (2): {left:?}"
    );
}

/// Partition 0's last segment file as the crash left it.
struct LastSegment {
    path: PathBuf,
    bytes: Vec<u8>,
    /// Its complete batches, and the length of the prefix they make up.
    batches: Vec<BatchPos>,
    complete: u64,
    last: BatchPos,
}

fn partition0_last_segment(broker: &Broker, topic: &str) -> LastSegment {
    let path = last_segment(&broker.partition_dir(topic, 0));
    let bytes = fs::read(&path).expect("read segment");
    let (batches, complete) = walk_batches(&bytes);
    let last = *batches.last().unwrap_or_else(|| {
        panic!(
            "{} holds no complete batch ({} bytes)",
            path.display(),
            bytes.len()
        )
    });
    LastSegment {
        path,
        bytes,
        batches,
        complete,
        last,
    }
}

/// Bytes of `path` the page cache holds, as util-linux's `fincore` reports them (it asks with
/// `mincore`, which looks without touching). Probing with `RWF_NOWAIT` reads would not do: such
/// a read of an uncached page starts readahead, and on a fast disk the pages arrive before the
/// probe moves on, so a cold file can look cached.
fn cached_bytes(path: &PathBuf) -> u64 {
    let out = std::process::Command::new("fincore")
        .args(["--bytes", "--noheadings", "--raw", "--output", "RES"])
        .arg(path)
        .output()
        .unwrap_or_else(|e| {
            panic!("running fincore: {e} (it is in util-linux: apt-get install util-linux; tools/run-tests installs it)")
        });
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "fincore {} failed: {}{}",
        path.display(),
        text,
        String::from_utf8_lossy(&out.stderr)
    );
    text.trim()
        .parse()
        .unwrap_or_else(|e| panic!("fincore {} printed {text:?}: {e}", path.display()))
}

/// `strand.log.drop.behind.bytes`: once a segment is fsynced, its pages more than the window
/// behind its end leave the page cache, and every record is still read back, from the disk.
/// (The control, a segment written without the setting staying cached, is the check at the top
/// of the torn-segment test below.)
#[test]
fn segment_pages_behind_the_drop_window_leave_the_page_cache() {
    const MIB: u64 = 1 << 20;
    let broker = Broker::builder()
        .needs_spawned("reads the broker's segment files")
        .config("strand.log.drop.behind.bytes", MIB)
        // Segments written through the page cache: the setting is for them.
        .config("strand.log.direct.writes", "false")
        .start();
    let bootstrap = broker.bootstrap();
    let topic = admin::new_topic(&bootstrap, "dropbehind", 1);
    let records: Vec<TestRecord> = (0..400)
        .map(|i| TestRecord {
            partition: 0,
            key: Some(format!("k{i}").into_bytes()),
            value: Some(Gen::new(i as u64).bytes(64 << 10, &[])),
            headers: vec![],
            timestamp: None,
        })
        .collect();
    let offsets = clients::rdkafka_produce(&bootstrap, &topic, &records);
    assert_eq!(offsets, (0..400).collect::<Vec<i64>>());

    let segment = last_segment(&broker.partition_dir(&topic, 0));
    let len = fs::metadata(&segment).map_or(0, |m| m.len());
    let cached = cached_bytes(&segment);
    // Drops go in steps of 4 MiB, and a large folio (2 MiB) the range only partly covers stays,
    // so up to ~7 MiB stay cached; half the segment leaves room for a loaded machine, and
    // without the setting all of it stays. The counter is published once a second.
    let want_dropped = len.saturating_sub(8 * MIB) as f64;
    let dropped = wait_for(Duration::from_secs(10), "the dropped-bytes counter", || {
        let d = metric_sum(&broker.metrics(), "strand_page_cache_dropped_bytes_total");
        (d >= want_dropped).then_some(d)
    });
    assert!(
        len > 24 * MIB && cached <= len / 2,
        "segment {len} bytes, {cached} of them cached, {dropped} bytes dropped: pages more than 1 MiB \
         behind the end must leave the page cache"
    );

    eprintln!("segment {len} bytes, {cached} cached, {dropped} dropped");
    let got = clients::rdkafka_consume(
        &bootstrap,
        &topic,
        0,
        Offset::Beginning,
        records.len(),
        Duration::from_secs(60),
    );
    assert_eq!(got.len(), records.len());
    for (n, (c, r)) in got.iter().zip(&records).enumerate() {
        assert_eq!(c.offset, n as i64);
        assert!(
            c.key == r.key && c.value == r.value,
            "record {n} read back differs from what was sent"
        );
    }
}

/// `strand.log.direct.writes` (the default): a segment's whole pages go to the disk with
/// `O_DIRECT`, so a growing log leaves nothing in the page cache but partial pages; reads of the
/// log's end come from the recent writes the broker keeps, the rest from the file; every record
/// reads back, also after a restart and after appends that continue the restarted segment's
/// partial last page.
#[test]
fn direct_written_segments_bypass_the_page_cache_and_read_back() {
    const MIB: u64 = 1 << 20;
    let mut broker = Broker::builder()
        .needs_spawned("reads the broker's segment files and restarts it")
        .config("strand.log.direct.writes", "true")
        // Small, so that the start of the log must be read from the file.
        .config("strand.log.direct.cache.bytes", 4 * MIB)
        .start();
    let bootstrap = broker.bootstrap();
    let topic = admin::new_topic(&bootstrap, "directwrites", 1);
    // Odd sizes, so that batches end inside pages.
    let record = |i: usize| TestRecord {
        partition: 0,
        key: Some(format!("k{i}").into_bytes()),
        value: Some(Gen::new(i as u64).bytes((64 << 10) + 1 + i % 3001, &[])),
        headers: vec![],
        timestamp: None,
    };
    let mut records: Vec<TestRecord> = (0..400).map(record).collect();
    // One request of at most 256 KiB at a time, so that no flush round writes more than the
    // 4 MiB the broker keeps of recent writes: a single larger write would not be kept at all
    // (a round takes everything staged, and grows while the disk is slow).
    let small_rounds = [
        ("max.in.flight.requests.per.connection", "1"),
        ("batch.size", "262144"),
    ];
    let offsets = clients::rdkafka_produce_with(&bootstrap, &topic, &records, &small_rounds);
    assert_eq!(offsets, (0..400).collect::<Vec<i64>>());

    let segment = last_segment(&broker.partition_dir(&topic, 0));
    let len = fs::metadata(&segment).map_or(0, |m| m.len());
    let cached = cached_bytes(&segment);
    eprintln!("segment {len} bytes, {cached} cached");
    assert!(
        len > 24 * MIB && cached <= len / 4,
        "segment {len} bytes, {cached} of them cached: whole pages must bypass the page cache"
    );

    let check = |broker: &Broker, records: &[TestRecord]| {
        let got = clients::rdkafka_consume(
            &broker.bootstrap(),
            &topic,
            0,
            Offset::Beginning,
            records.len(),
            Duration::from_secs(60),
        );
        assert_eq!(got.len(), records.len());
        for (n, (c, r)) in got.iter().zip(records).enumerate() {
            assert_eq!(c.offset, n as i64);
            assert!(
                c.key == r.key && c.value == r.value,
                "record {n} read back differs from what was sent"
            );
        }
    };
    check(&broker, &records);
    let read = |broker: &Broker, source: &str| {
        let label = format!("source=\"{source}\"");
        metric_sum_where(&broker.metrics(), "strand_recent_writes_read_bytes_total", &label)
    };
    let (memory, file) = wait_for(Duration::from_secs(10), "reads counted by source", || {
        let (m, f) = (read(&broker, "memory"), read(&broker, "file"));
        (m > 0.0 && f > 0.0).then_some((m, f))
    });
    eprintln!("read {memory} bytes from recent writes, {file} from the file");
    // With no write in flight, what was read from the file went through the page cache, near
    // the end as well: the next reader finds it in memory.
    let near = wait_for(Duration::from_secs(10), "reads near the end counted", || {
        let n = metric_sum(&broker.metrics(), "strand_near_end_page_cache_read_bytes_total");
        (n > 0.0).then_some(n)
    });
    let cached = cached_bytes(&segment);
    eprintln!("read {near} bytes near the end through the page cache; {cached} of {len} cached");
    assert!(
        cached >= len / 2,
        "{cached} of the segment's {len} bytes cached after it was read"
    );
    let held = metric_sum(&broker.metrics(), "strand_recent_writes_bytes");
    assert!(
        held <= (4 * MIB) as f64,
        "{held} bytes of recent writes held over a 4 MiB budget"
    );

    // After a restart the segment's last page is not known in memory: appends read it back.
    broker.terminate(Duration::from_secs(30));
    broker.restart();
    check(&broker, &records);
    let more: Vec<TestRecord> = (400..600).map(record).collect();
    let offsets = clients::rdkafka_produce_with(&broker.bootstrap(), &topic, &more, &small_rounds);
    assert_eq!(offsets, (400..600).collect::<Vec<i64>>());
    records.extend(more);
    check(&broker, &records);
}

fn last_segment(dir: &PathBuf) -> PathBuf {
    let mut logs: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    logs.sort();
    let last = logs
        .pop()
        .unwrap_or_else(|| panic!("no .log segment in {}", dir.display()));
    let stem = last.file_stem().and_then(|s| s.to_str()).unwrap_or_default();
    assert!(
        stem.len() == 20 && stem.bytes().all(|b| b.is_ascii_digit()),
        "segment file name {} is not a 20-digit base offset",
        last.display()
    );
    last
}

/// A power loss tears a segment write that only the journal made durable: every round goes
/// through the journal here ([`JOURNALED_ROUNDS`]), so an acknowledged batch may sit
/// in a segment file nothing has fsynced, and recovery must restore it from the journal or stop
/// before it without reusing an acknowledged offset. (A direct round fsyncs the segment before
/// acknowledging, so there a tear can only hit unacknowledged bytes: next test.) Before that,
/// it checks that the journal bypassed the page cache (`O_DIRECT`) and the segment did not.
#[test]
fn torn_last_segment_recovers_to_a_consistent_prefix() {
    let (mut broker, topic, run) = stopped_under_load(
        "torn",
        "kills the broker and edits its segment files",
        &[JOURNALED_ROUNDS, &[("strand.log.direct.writes", "false")]].concat(),
        "1",
        3000,
        Writer::AllPartitions,
        Broker::kill9,
    );

    // The journal went to the disk past the page cache (O_DIRECT); the segments through it.
    let journal_dir = broker.data_dir().join("strand-journal");
    let journals: Vec<PathBuf> = fs::read_dir(&journal_dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", journal_dir.display()))
        .map(|e| e.expect("dir entry").path())
        .collect();
    let journal_bytes: u64 = journals
        .iter()
        .map(|p| fs::metadata(p).map_or(0, |m| m.len()))
        .sum();
    let journal_cached: u64 = journals.iter().map(cached_bytes).sum();
    let segment = last_segment(&broker.partition_dir(&topic, 0));
    let (segment_bytes, segment_cached) = (
        fs::metadata(&segment).map_or(0, |m| m.len()),
        cached_bytes(&segment),
    );
    eprintln!(
        "journal: {journal_bytes} bytes in {} files, {journal_cached} cached; partition 0's last segment: \
         {segment_bytes} bytes, {segment_cached} cached",
        journals.len()
    );
    assert!(
        journal_bytes > 100_000,
        "the journaled rounds wrote only {journal_bytes} journal bytes"
    );
    assert_eq!(
        journal_cached, 0,
        "journal pages are in the page cache: not written with O_DIRECT"
    );
    assert!(
        segment_cached > segment_bytes / 2,
        "the segment written through the page cache shows only {segment_cached} of {segment_bytes} bytes \
         cached: the probe does not work here"
    );

    // Cut partition 0's last segment in the middle of its last complete batch.
    let seg = partition0_last_segment(&broker, &topic);
    let last = seg.last;
    let cut = last.position + last.size / 2;
    eprintln!(
        "{}: {} bytes, {} complete batches ({} bytes); cutting batch {}..={} at byte {cut}",
        seg.path.display(),
        seg.bytes.len(),
        seg.batches.len(),
        seg.complete,
        last.base_offset,
        last.last_offset
    );
    fs::OpenOptions::new()
        .write(true)
        .open(&seg.path)
        .expect("open segment")
        .set_len(cut)
        .expect("truncate");

    let (bootstrap, logs) = restart_and_read(&mut broker, &topic, |p, log| {
        if p != 0 {
            return check_acked_present(&run, log, p, i64::MAX);
        }
        let end = log.len() as i64;
        let max_acked = run.acked_in(0).last().map(|a| a.1).unwrap_or(-1);
        if end > last.last_offset {
            eprintln!("partition 0 restored the torn batch (log end {end}, acknowledged up to {max_acked})");
            check_acked_present(&run, log, 0, i64::MAX);
        } else {
            assert_eq!(
                end, last.base_offset,
                "partition 0 must end either after every acknowledged record (restored) or exactly at \
                 the torn batch's base offset {} (truncated); it ends at {end}",
                last.base_offset
            );
            eprintln!("partition 0 truncated to the batch boundary {end}");
            check_acked_present(&run, log, 0, last.base_offset);
        }
    });
    check_new_writes(&bootstrap, &topic, &run, &logs);
    broker.assert_running();
}

/// With direct rounds (the default for a shard writing one or two partitions), acknowledged
/// bytes are fsynced in the segment itself; a power loss can only leave a torn, unacknowledged
/// write after them. Recovery must cut it and keep every acknowledged record.
#[test]
fn torn_unacknowledged_tail_after_direct_rounds_is_cut() {
    let (mut broker, topic, run) =
        kill9_under_load("torn-direct", "kills the broker and edits its segment files", &[]);

    // Half of a copy of the last complete batch after it: a next write that did not finish.
    let seg = partition0_last_segment(&broker, &topic);
    let last = seg.last;
    let torn = &seg.bytes[last.position as usize..(last.position + last.size / 2) as usize];
    let mut kept = seg.bytes[..seg.complete as usize].to_vec();
    kept.extend_from_slice(torn);
    eprintln!(
        "{}: {} bytes of complete batches, then {} torn bytes",
        seg.path.display(),
        seg.complete,
        torn.len()
    );
    fs::write(&seg.path, &kept).expect("write segment");

    let (_, logs) = restart_and_check_acked(&mut broker, &topic, &run);
    assert_eq!(
        logs[&0].len() as i64,
        last.last_offset + 1,
        "partition 0 ends after its last complete batch"
    );
}

/// SIGTERM while an acks=all producer pipelines requests: the broker flushes what it staged,
/// exits cleanly and in time (a flusher that spun on work it could no longer take once shutdown
/// began hung it), and keeps every acknowledged record.
#[test]
fn sigterm_under_pipelined_load_exits_cleanly_and_keeps_acknowledged_records() {
    let stop = |b: &mut Broker| {
        let status = b.terminate(Duration::from_secs(10));
        assert!(
            status.success(),
            "SIGTERM under load must end the broker cleanly, got {status}"
        );
    };
    let (mut broker, topic, run) = stopped_under_load(
        "sigterm-load",
        "stops and restarts the broker",
        &[],
        "5",
        20_000,
        Writer::Rdkafka,
        stop,
    );
    restart_and_check_acked(&mut broker, &topic, &run);
}

#[test]
fn graceful_shutdown_loses_nothing() {
    let mut broker = Broker::builder()
        .needs_spawned("stops and restarts the broker")
        .start();
    let topic = unique_topic("sigterm");
    admin::create_topic(&broker.bootstrap(), &topic, PARTITIONS, &[]);
    let records: Vec<TestRecord> = (0..600).map(record).collect();
    let offsets = clients::rdkafka_produce(&broker.bootstrap(), &topic, &records);

    let status = broker.terminate(Duration::from_secs(30));
    assert!(
        status.success(),
        "SIGTERM must end the broker cleanly, got {status}"
    );
    broker.restart();
    let bootstrap = broker.bootstrap();
    for p in 0..PARTITIONS {
        let log = read_partition(&bootstrap, &topic, p);
        let want: Vec<(i64, usize)> = (0..records.len())
            .filter(|&i| records[i].partition == p)
            .map(|i| (offsets[i], i))
            .collect();
        assert_eq!(log, want, "partition {p} after SIGTERM and restart");
    }
}
