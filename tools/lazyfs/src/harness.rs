//! The power-cut harness (`strand-lazyfs powercut`): Strand on the lazy file system under
//! acknowledged load, the power cut at seeded random moments, the machine back, and a check
//! that nothing acknowledged was lost.
//!
//! One cycle: the broker starts on the mounted file system (its data directory there, its
//! ready file and log outside); the checks below run against what the previous cycles
//! acknowledged; then three clients load it for a seeded while:
//!
//! - a Kafka producer (rdkafka, `enable.idempotence`, `acks=all`) sends records of seeded
//!   sizes (every eighth one 20 KiB, so that flush rounds of several partitions carry enough
//!   bytes to skip the journal; every 64th 96 KiB, so that segments are written with
//!   `O_DIRECT`) to a topic of several partitions; each delivery report is an
//!   acknowledged (partition, offset, record);
//! - a consumer-group client commits rising offsets for the partitions (OffsetCommit,
//!   synchronous), each answered commit acknowledged;
//! - an HTTP queue client publishes batches, leases them and acks them (batch ack), each
//!   answered publish and settled ack acknowledged (an ack unanswered, or refused with a
//!   storage failure, may or may not have been applied: its message may come back or not).
//!
//! Then the power goes off ([`LazyFs::power_cut`], from then on every file-system call fails,
//! and what was never synced is gone, the last unsynced write torn at a page boundary chosen by
//! the seed), the broker is killed, the file system is mounted again as the disk held it.
//!
//! The checks, after every restart: every acknowledged record is at its offset (so no offset
//! was given to two records), no record is there twice (each partition is read from where the
//! previous check ended, after checking that it still starts at 0 and ends past every
//! acknowledged record; the last check reads everything); every group's committed offset is at
//! least the last acknowledged commit, and no more than the last one sent; every acknowledged
//! publish is still there (leasable) unless acknowledged as acked; no acked message is
//! delivered again; and the broker logged no warning or error other than its recovery reports
//! (logs cut back, journal problems), which are counted for the summary.
//!
//! A seed fixes the schedule (how long each cycle runs, the record sizes, which tear), not the
//! interleaving of the broker's threads with the clients: a failing seed is a scenario to rerun
//! several times, not an exact replay.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequest, OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::{GroupId, TopicName};
use kafka_protocol::protocol::StrBytes;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DeliveryResult, ProducerContext, ThreadedProducer};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use serde_json::json;
use strand_tools::broker::BrokerProcess;
use strand_tools::kafka_wire::RawConn;
use strand_tools::queue_client::{LeaseOptions, OutMessage, QueueClient};

use crate::LazyFs;

const TOPIC: &str = "powercut";
const GROUP: &str = "powercut-group";
const QUEUE: &str = "powercut-queue";
/// Every this many records one is [`LARGE_RECORD`] bytes.
const LARGE_EVERY: u64 = 8;
const LARGE_RECORD: usize = 20 << 10;
/// Every this many records one is [`HUGE_RECORD`] bytes: a segment write of 64 KiB or more,
/// which the broker writes with `O_DIRECT` into space it reserved with `fallocate`.
const HUGE_EVERY: u64 = 64;
const HUGE_RECORD: usize = 96 << 10;
/// Records unacknowledged at once (the producer waits beyond it).
const MAX_IN_FLIGHT: usize = 500;

/// What to run.
#[derive(Clone, Debug)]
pub struct Options {
    /// Seeds the schedule.
    pub seed: u64,
    /// Power cuts.
    pub cuts: u32,
    /// The `strand` binary.
    pub strand: PathBuf,
    /// Where the backing directory, the mount point and the broker's log go (a temporary
    /// directory when `None`).
    pub work_dir: Option<PathBuf>,
    /// How long the load runs before a cut: a seeded time in this range.
    pub run_ms: (u64, u64),
    /// Whether cuts tear the last unsynced write.
    pub tear: bool,
    /// Partitions of the topic.
    pub partitions: i32,
    /// More broker arguments (e.g. `--override key=value`), after the harness's own.
    pub broker_args: Vec<String>,
}

impl Options {
    /// The defaults for `seed` and `cuts`, with the `strand` binary at `strand`.
    pub fn new(strand: PathBuf, seed: u64, cuts: u32) -> Options {
        Options {
            seed,
            cuts,
            strand,
            work_dir: None,
            run_ms: (300, 2500),
            tear: true,
            partitions: 6,
            broker_args: Vec::new(),
        }
    }
}

/// What a run did.
#[derive(Clone, Debug, Default)]
pub struct Summary {
    pub seed: u64,
    pub cuts: u32,
    pub records_acked: u64,
    pub record_bytes_acked: u64,
    pub commits_acked: u64,
    pub queue_publishes_acked: u64,
    pub queue_acks_acked: u64,
    /// Cuts that tore a write.
    pub torn_writes: u32,
    /// Files and directories whose unsynced changes the cuts dropped, summed.
    pub files_reverted: u64,
    pub dirs_reverted: u64,
    /// The broker's recovery reports after the cuts, by kind (a partition log cut back, a
    /// journal ending with an incomplete entry, another journal problem).
    pub recovery: BTreeMap<&'static str, u64>,
    /// A few of those lines, as examples.
    pub recovery_examples: Vec<String>,
    /// Durability calls the file system saw.
    pub file_syncs: u64,
    pub dir_syncs: u64,
    pub direct_opens: u64,
    /// Segment bytes the broker wrote with `O_DIRECT` (its own metric, read before each cut).
    /// glommio sets `O_DIRECT` with `fcntl` after the open, which FUSE never sees, so
    /// `direct_opens` does not count its files.
    pub direct_write_bytes: u64,
    pub fallocates: u64,
    pub elapsed: Duration,
}

impl Summary {
    /// One line per figure.
    pub fn render(&self) -> String {
        let per_cut = if self.cuts > 0 {
            self.elapsed / self.cuts
        } else {
            Duration::ZERO
        };
        format!(
            "seed {}: {} power cuts, 0 acknowledged writes lost\n\
             records acknowledged: {} ({} bytes)\n\
             group commits acknowledged: {}\n\
             queue publishes acknowledged: {}, queue acks acknowledged: {}\n\
             cuts that tore a write: {}; files reverted: {}, directories reverted: {}\n\
             broker recovery reports: {:?}\n\
             file-system calls: {} file syncs, {} directory syncs, {} O_DIRECT opens, {} fallocates; \
             {} segment bytes written with O_DIRECT (broker metric)\n\
             time: {:.1} s, {:.2} s per cut",
            self.seed,
            self.cuts,
            self.records_acked,
            self.record_bytes_acked,
            self.commits_acked,
            self.queue_publishes_acked,
            self.queue_acks_acked,
            self.torn_writes,
            self.files_reverted,
            self.dirs_reverted,
            self.recovery,
            self.file_syncs,
            self.dir_syncs,
            self.direct_opens,
            self.fallocates,
            self.direct_write_bytes,
            self.elapsed.as_secs_f64(),
            per_cut.as_secs_f64(),
        ) + &self
            .recovery_examples
            .iter()
            .map(|l| format!("\n  e.g. {l}"))
            .collect::<String>()
    }
}

/// Everything acknowledged so far, across cycles.
#[derive(Default, Debug)]
struct Ledger {
    next_record: u64,
    /// (partition, offset) → record number.
    records: BTreeMap<(i32, i64), u64>,
    record_bytes: u64,
    /// Partition → (last acknowledged commit, last commit sent).
    commits: BTreeMap<i32, (i64, i64)>,
    commits_acked: u64,
    /// Published and acknowledged: message id → payload.
    published: BTreeMap<String, String>,
    /// (partition, offset) → message id, of acknowledged publishes.
    queue_offsets: BTreeMap<(i32, i64), String>,
    /// Message id → (partition, offset, the cycle its publish was acknowledged in).
    published_at: BTreeMap<String, (i32, i64, u32)>,
    /// The cycle running (its number of cuts before it).
    cycle: u32,
    /// Acks answered as settled.
    acked: BTreeSet<String>,
    /// Acks sent, answer unknown (the cut came first): such a message may be acked or come
    /// back, now or after a later cut (its ack may have been durable and its message still
    /// leased when the broker came back).
    ack_unknown: BTreeSet<String>,
    next_message: u64,
    /// Partition → the end of the part of it the last check read.
    checked_upto: BTreeMap<i32, i64>,
}

fn record_size(n: u64) -> usize {
    if n % HUGE_EVERY == HUGE_EVERY - 1 {
        HUGE_RECORD
    } else if n % LARGE_EVERY == LARGE_EVERY - 1 {
        LARGE_RECORD
    } else {
        50 + (n.wrapping_mul(2_654_435_761) % 900) as usize
    }
}

/// The bytes of record `n`: its number, then a pattern from it.
fn record_value(n: u64) -> Vec<u8> {
    let len = record_size(n);
    let mut v = n.to_be_bytes().to_vec();
    v.extend((0..len.saturating_sub(8)).map(|i| (n as usize).wrapping_add(i * 31) as u8));
    v
}

fn record_key(n: u64) -> String {
    format!("r{n}")
}

fn client_config(bootstrap: &str) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap)
        .set("broker.address.family", "v4")
        .set("log_level", "3");
    c
}

struct DeliveryLog {
    acked: Mutex<Vec<(i32, i64, u64)>>,
    in_flight: std::sync::atomic::AtomicUsize,
}

struct Deliveries(Arc<DeliveryLog>);

impl ClientContext for Deliveries {}

impl ProducerContext for Deliveries {
    type DeliveryOpaque = Box<u64>;

    fn delivery(&self, result: &DeliveryResult<'_>, n: Box<u64>) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
        if let Ok(m) = result {
            lock(&self.0.acked).push((m.partition(), m.offset(), *n));
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// What one cycle's clients acknowledged.
#[derive(Default)]
struct CycleAcks {
    records: Vec<(i32, i64, u64)>,
    commits: Vec<(i32, i64)>,
    commits_sent: Vec<(i32, i64)>,
    published: Vec<(String, i32, i64, String)>,
    acked: Vec<String>,
    ack_unknown: Vec<String>,
}

fn produce(
    bootstrap: String,
    partitions: i32,
    first: u64,
    stop: Arc<AtomicBool>,
) -> Result<(AckedRecords, u64)> {
    let log = Arc::new(DeliveryLog {
        acked: Mutex::new(Vec::new()),
        in_flight: std::sync::atomic::AtomicUsize::new(0),
    });
    let producer: ThreadedProducer<Deliveries> = client_config(&bootstrap)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "2")
        .set("message.timeout.ms", "60000")
        .create_with_context(Deliveries(log.clone()))
        .context("creating the producer")?;
    let mut n = first;
    while !stop.load(Ordering::SeqCst) {
        if log.in_flight.load(Ordering::SeqCst) >= MAX_IN_FLIGHT {
            thread::sleep(Duration::from_millis(2));
            continue;
        }
        let key = record_key(n);
        let value = record_value(n);
        let partition = (n % partitions as u64) as i32;
        log.in_flight.fetch_add(1, Ordering::SeqCst);
        let rec = BaseRecord::with_opaque_to(TOPIC, Box::new(n))
            .partition(partition)
            .key(&key)
            .payload(&value);
        match producer.send(rec) {
            Ok(()) => n += 1,
            Err((_, _)) => {
                log.in_flight.fetch_sub(1, Ordering::SeqCst);
                thread::sleep(Duration::from_millis(5));
            }
        }
    }
    // The broker is gone: whatever is unanswered now never will be.
    drop(producer);
    let acked = std::mem::take(&mut *lock(&log.acked));
    Ok((acked, n))
}

/// OffsetCommit v9 of `offset` for `partition`, as a "simple" consumer (generation -1, no
/// member) does: whether the broker answered with no error.
fn commit_offset(conn: &mut RawConn, partition: i32, offset: i64) -> Result<bool> {
    let req = OffsetCommitRequest::default()
        .with_group_id(GroupId(StrBytes::from_static_str(GROUP)))
        .with_generation_id_or_member_epoch(-1)
        .with_retention_time_ms(-1)
        .with_topics(vec![OffsetCommitRequestTopic::default()
            .with_name(TopicName(StrBytes::from_static_str(TOPIC)))
            .with_partitions(vec![OffsetCommitRequestPartition::default()
                .with_partition_index(partition)
                .with_committed_offset(offset)
                .with_committed_leader_epoch(-1)])]);
    let resp = conn.request(9, &req)?;
    Ok(resp
        .topics
        .iter()
        .flat_map(|t| &t.partitions)
        .all(|p| p.error_code == 0))
}

/// Commits rising offsets, partition after partition, until `stop`: (acknowledged, sent).
fn commit_loop(
    bootstrap: String,
    partitions: i32,
    mut last: BTreeMap<i32, i64>,
    stop: Arc<AtomicBool>,
) -> (Commits, Commits) {
    let mut acked = Vec::new();
    let mut sent = Vec::new();
    let mut conn: Option<RawConn> = None;
    let mut p = 0;
    while !stop.load(Ordering::SeqCst) {
        let c = match conn.as_mut() {
            Some(c) => c,
            None => match RawConn::connect(&bootstrap) {
                Ok(c) => conn.insert(c),
                Err(_) => {
                    thread::sleep(Duration::from_millis(50));
                    continue;
                }
            },
        };
        let next = last.get(&p).copied().unwrap_or(0) + 1;
        sent.push((p, next));
        last.insert(p, next);
        match commit_offset(c, p, next) {
            Ok(true) => acked.push((p, next)),
            Ok(false) => thread::sleep(Duration::from_millis(20)),
            Err(_) => conn = None,
        }
        p = (p + 1) % partitions;
        thread::sleep(Duration::from_millis(5));
    }
    (acked, sent)
}

/// (partition, offset, record number) of acknowledged records.
type AckedRecords = Vec<(i32, i64, u64)>;

/// (partition, offset) of commits.
type Commits = Vec<(i32, i64)>;

type Published = Vec<(String, i32, i64, String)>;

fn queue_loop(http: String, first: u64, stop: Arc<AtomicBool>) -> (Published, Vec<String>, Vec<String>, u64) {
    let mut c = QueueClient::new(&http);
    let mut published = Vec::new();
    let mut acked = Vec::new();
    let mut unknown = Vec::new();
    let mut n = first;
    while !stop.load(Ordering::SeqCst) {
        let payloads: Vec<String> = (n..n + 5).map(|i| format!("m{i}")).collect();
        n += 5;
        let out: Vec<OutMessage> = payloads.iter().map(|p| OutMessage::new(p.clone())).collect();
        if let Ok(list) = c.publish(QUEUE, &out) {
            for (m, p) in list.into_iter().zip(payloads) {
                published.push((m.id, m.partition, m.offset, p));
            }
        }
        let opts = LeaseOptions {
            max_messages: Some(4),
            visibility_timeout_ms: Some(1500),
            ..LeaseOptions::default()
        };
        let Ok(leased) = c.lease(QUEUE, &opts) else {
            thread::sleep(Duration::from_millis(20));
            continue;
        };
        if leased.is_empty() {
            continue;
        }
        let items: Vec<(&str, u64)> = leased.iter().map(|m| (m.id.as_str(), m.generation)).collect();
        match c.ack_batch(None, &items) {
            Ok(results) => {
                for (r, m) in results.iter().zip(&leased) {
                    if r.is_settled() {
                        acked.push(m.id.clone());
                    } else if r.status.is_none_or(|s| s >= 500) {
                        // A storage failure (the cut): the ack may have been made durable
                        // before the failure it reports.
                        unknown.push(m.id.clone());
                    }
                }
            }
            Err(_) => unknown.extend(leased.iter().map(|m| m.id.clone())),
        }
    }
    (published, acked, unknown, n)
}

fn setup(broker: &BrokerProcess, partitions: i32) -> Result<()> {
    let admin: AdminClient<DefaultClientContext> = client_config(&broker.bootstrap).create()?;
    let topic = NewTopic::new(TOPIC, partitions, TopicReplication::Fixed(1));
    let results = futures::executor::block_on(admin.create_topics(&[topic], &AdminOptions::new()))?;
    for r in results {
        if let Err((name, e)) = r {
            bail!("creating topic {name}: {e}");
        }
    }
    let http = broker.http.clone().context("the broker named no HTTP listener")?;
    let mut q = QueueClient::new(&http);
    q.put_queue(QUEUE, &json!({ "partitions": 2 }))
        .map_err(|e| anyhow::anyhow!("creating queue {QUEUE}: {e}"))?;
    Ok(())
}

/// Reads a partition from offset `from` to its end: offset → record number, and the
/// watermarks.
fn read_partition(bootstrap: &str, partition: i32, from: i64) -> Result<(BTreeMap<i64, u64>, (i64, i64))> {
    let consumer: BaseConsumer = client_config(bootstrap)
        .set("group.id", "powercut-reader")
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "error")
        .create()?;
    let (low, high) = consumer
        .fetch_watermarks(TOPIC, partition, Duration::from_secs(30))
        .with_context(|| format!("watermarks of partition {partition}"))?;
    let mut out = BTreeMap::new();
    let start = from.max(low);
    if high <= start {
        return Ok((out, (low, high)));
    }
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(TOPIC, partition, Offset::Offset(start))?;
    consumer.assign(&tpl)?;
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut next = start;
    while next < high {
        if Instant::now() > deadline {
            bail!("partition {partition}: read up to {next} of {high} in 120 s");
        }
        match consumer.poll(Duration::from_millis(500)) {
            Some(Ok(m)) => {
                let key = m.key().and_then(|k| std::str::from_utf8(k).ok()).unwrap_or("");
                let n: u64 = key
                    .strip_prefix('r')
                    .and_then(|s| s.parse().ok())
                    .with_context(|| format!("partition {partition} offset {}: key {key:?}", m.offset()))?;
                let value = m.payload().unwrap_or(&[]);
                if value != record_value(n).as_slice() {
                    bail!(
                        "partition {partition} offset {}: record {n} has the wrong value ({} bytes)",
                        m.offset(),
                        value.len()
                    );
                }
                if out.insert(m.offset(), n).is_some() {
                    bail!("partition {partition}: offset {} read twice", m.offset());
                }
                next = m.offset() + 1;
            }
            Some(Err(KafkaError::PartitionEOF(_))) | None => {}
            Some(Err(e)) => bail!("reading partition {partition}: {e}"),
        }
    }
    Ok((out, (low, high)))
}

/// Checks what the restarted broker holds against what was acknowledged.
/// `full`: read the whole topic, not only what was written since the last check.
fn verify(broker: &BrokerProcess, partitions: i32, ledger: &mut Ledger, full: bool) -> Result<()> {
    // Records: from where the last check ended (everything, when `full`); before it, that the
    // log still starts at 0 (no retention here) and ends past every acknowledged record.
    let mut seen: BTreeMap<u64, (i32, i64)> = BTreeMap::new();
    for p in 0..partitions {
        let from = if full {
            0
        } else {
            ledger.checked_upto.get(&p).copied().unwrap_or(0)
        };
        let (log, (low, high)) = read_partition(&broker.bootstrap, p, from)?;
        if low != 0 {
            bail!("partition {p} starts at {low}, not 0");
        }
        if let Some((&(_, last), n)) = ledger.records.range((p, i64::MIN)..=(p, i64::MAX)).next_back() {
            if high <= last {
                bail!("partition {p} ends at {high}: acknowledged record {n} at {last} is lost");
            }
        }
        for (&o, &n) in &log {
            if let Some(first) = seen.insert(n, (p, o)) {
                bail!("record {n} is there twice: at {first:?} and at ({p}, {o})");
            }
        }
        for (&(_, o), &n) in ledger.records.range((p, from)..=(p, i64::MAX)) {
            match log.get(&o) {
                Some(&got) if got == n => {}
                Some(&got) => bail!("partition {p} offset {o}: acknowledged record {n}, now record {got}"),
                None => bail!("partition {p} offset {o}: acknowledged record {n} is lost"),
            }
        }
        ledger.checked_upto.insert(p, high);
    }
    // Group commits.
    let consumer: BaseConsumer = client_config(&broker.bootstrap)
        .set("group.id", GROUP)
        .set("enable.auto.commit", "false")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition(TOPIC, p);
    }
    let committed = consumer
        .committed_offsets(tpl, Duration::from_secs(30))
        .context("reading the group's committed offsets")?;
    for (p, (acked, sent)) in ledger.commits.clone() {
        let got = committed
            .find_partition(TOPIC, p)
            .map(|e| e.offset())
            .unwrap_or(Offset::Invalid);
        let got = match got {
            Offset::Offset(o) => o,
            _ => -1,
        };
        if got < acked || got > sent {
            bail!("partition {p}: committed offset {got}, acknowledged {acked}, last sent {sent}");
        }
        // The next commits go on from what is there.
        ledger.commits.insert(p, (got, got));
    }
    // Queue: lease everything there is (leases from before the cut run out), ack it.
    let http = broker.http.clone().context("no HTTP listener")?;
    let mut q = QueueClient::new(&http);
    let missing = |l: &Ledger| -> Vec<String> {
        l.published
            .keys()
            .filter(|id| !l.acked.contains(*id) && !l.ack_unknown.contains(*id))
            .cloned()
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let opts = LeaseOptions {
        max_messages: Some(100),
        visibility_timeout_ms: Some(60_000),
        wait_ms: Some(200),
        ..LeaseOptions::default()
    };
    loop {
        let leased = q
            .lease(QUEUE, &opts)
            .map_err(|e| anyhow::anyhow!("leasing from {QUEUE}: {e}"))?;
        for m in &leased {
            if ledger.acked.contains(&m.id) {
                bail!(
                    "queue message {} ({:?}) was acked (acknowledged) and is delivered again",
                    m.id,
                    m.payload
                );
            }
            if let Some(want) = ledger.published.get(&m.id) {
                if m.payload.as_deref() != Some(want.as_str()) {
                    bail!(
                        "queue message {}: payload {:?}, published {want:?}",
                        m.id,
                        m.payload
                    );
                }
            }
            if let Some(id) = ledger.queue_offsets.get(&(m.partition, m.offset)) {
                if *id != m.id {
                    bail!(
                        "queue partition {} offset {}: published {id}, now {}",
                        m.partition,
                        m.offset,
                        m.id
                    );
                }
            }
        }
        if !leased.is_empty() {
            let items: Vec<(&str, u64)> = leased.iter().map(|m| (m.id.as_str(), m.generation)).collect();
            let results = q
                .ack_batch(None, &items)
                .map_err(|e| anyhow::anyhow!("acking in {QUEUE}: {e}"))?;
            for (r, m) in results.iter().zip(&leased) {
                if !r.is_settled() {
                    bail!("acking {} after the restart: {r:?}", m.id);
                }
                ledger.acked.insert(m.id.clone());
                ledger.ack_unknown.remove(&m.id);
            }
            continue;
        }
        let left = missing(ledger);
        if left.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            let examples: Vec<String> = left
                .iter()
                .take(5)
                .map(|id| match ledger.published_at.get(id) {
                    Some((p, o, c)) => format!("{id} (partition {p} offset {o}, acknowledged in cycle {c})"),
                    None => id.clone(),
                })
                .collect();
            bail!(
                "{} acknowledged queue publishes never came back (neither acked nor leasable), e.g. {examples:?}",
                left.len(),
            );
        }
    }
    Ok(())
}

/// `strand_direct_write_bytes_total` of the broker whose admin listener is `admin`, summed
/// over shards and kinds (0 when it cannot be read).
fn direct_write_bytes(admin: &str) -> u64 {
    let mut conn = strand_tools::queue_client::HttpConn::new(admin);
    let Ok(r) = conn.request("GET", "/metrics", None) else {
        return 0;
    };
    r.text()
        .lines()
        .filter(|l| l.starts_with("strand_direct_write_bytes_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// What the broker's recovery said, in a log: (kind, line) of each line that reports a
/// partition log cut back or a journal problem.
fn recovery_lines(log: &Path) -> Vec<(&'static str, String)> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            RECOVERY_KINDS
                .iter()
                .find(|k| l.contains(*k))
                .map(|k| (*k, l.to_string()))
        })
        .collect()
}

/// The messages of the broker's recovery reports: a partition log cut back to where its valid
/// batches end, a journal ending inside an entry, a journal entry that the log already has or
/// that no longer continues it.
const RECOVERY_KINDS: [&str; 3] = [
    "recovered partition log",
    "journal ends with an incomplete entry",
    "journal replay",
];

/// What the broker logged at WARN or ERROR in `log` that is not a recovery report of
/// [`recovery_lines`]: recovery may cut what a power cut left unsynced and says so, but any other
/// complaint between the start and the end of the check (a checkpoint, state log or metadata
/// file it could not read, a failed request) means the cut damaged something else.
fn other_complaints(log: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .filter(|l| matches!(l.split_whitespace().nth(1), Some("WARN" | "ERROR")))
        .filter(|l| !RECOVERY_KINDS.iter().any(|k| l.contains(*k)))
        .map(str::to_string)
        .collect()
}

/// Runs the harness. `progress` gets a line per cycle.
pub fn run(opts: &Options, mut progress: impl FnMut(&str)) -> Result<Summary> {
    let started = Instant::now();
    let tmp;
    let work = match &opts.work_dir {
        Some(d) => d.clone(),
        None => {
            tmp = tempfile::tempdir()?;
            tmp.path().to_path_buf()
        }
    };
    let backing = work.join("backing");
    let mnt = work.join("mnt");
    let broker_dir = work.join("broker");
    for d in [&backing, &mnt, &broker_dir] {
        std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    let mut fs = LazyFs::mount(&backing, &mnt)
        .context("mounting the lazy file system (needs /dev/fuse, and root or fusermount3)")?;
    // The data directory, made durable as an operator's would be long before any power cut.
    let data = mnt.join("data");
    std::fs::create_dir_all(&data).with_context(|| format!("creating {}", data.display()))?;
    fs.sync_all();
    let mut args: Vec<String> = [
        "strand.shards=2",
        "strand.journal.segment.bytes=1048576",
        "log.segment.bytes=1048576",
        "strand.log.direct.cache.bytes=8388608",
    ]
    .iter()
    .flat_map(|kv| ["--override".to_string(), kv.to_string()])
    .collect();
    args.extend(opts.broker_args.iter().cloned());
    let mut rng = ChaCha8Rng::seed_from_u64(opts.seed);
    let mut ledger = Ledger::default();
    let mut summary = Summary {
        seed: opts.seed,
        ..Summary::default()
    };
    let log_path = broker_dir.join("broker.log");
    for cycle in 0..=opts.cuts {
        let broker =
            BrokerProcess::spawn_strand_at(&opts.strand, &data, &broker_dir, &args, Duration::from_secs(120))
                .with_context(|| format!("cycle {cycle}: starting the broker"))?;
        let checked = if cycle == 0 {
            setup(&broker, opts.partitions)
        } else {
            verify(&broker, opts.partitions, &mut ledger, cycle == opts.cuts)
        };
        if let Err(e) = checked {
            let tail = broker.log_tail();
            return Err(e.context(format!(
                "seed {} cycle {cycle}: after {} cuts{tail}",
                opts.seed, summary.cuts
            )));
        }
        // What recovery after the last cut said: its reports of what it cut, and nothing else.
        let complaints = other_complaints(&log_path);
        if !complaints.is_empty() {
            bail!(
                "seed {} cycle {cycle}: after {} cuts the broker logged more than its recovery reports:\n  {}",
                opts.seed,
                summary.cuts,
                complaints.join("\n  ")
            );
        }
        for (kind, line) in recovery_lines(&log_path) {
            *summary.recovery.entry(kind).or_default() += 1;
            if summary.recovery_examples.len() < 5 {
                summary.recovery_examples.push(line);
            }
        }
        if cycle == opts.cuts {
            broker
                .stop(Duration::from_secs(30))
                .context("stopping the broker at the end")?;
            break;
        }
        ledger.cycle = cycle;
        let run_ms = rng.gen_range(opts.run_ms.0..=opts.run_ms.1);
        let tear = opts.tear.then(|| rng.gen::<u64>());
        let stop = Arc::new(AtomicBool::new(false));
        let http = broker.http.clone().context("no HTTP listener")?;
        let producer = {
            let (b, s, first) = (broker.bootstrap.clone(), stop.clone(), ledger.next_record);
            let parts = opts.partitions;
            thread::spawn(move || produce(b, parts, first, s))
        };
        let committer = {
            let (b, s) = (broker.bootstrap.clone(), stop.clone());
            let last: BTreeMap<i32, i64> = ledger.commits.iter().map(|(&p, &(_, sent))| (p, sent)).collect();
            let parts = opts.partitions;
            thread::spawn(move || commit_loop(b, parts, last, s))
        };
        let queue = {
            let (s, first) = (stop.clone(), ledger.next_message);
            thread::spawn(move || queue_loop(http, first, s))
        };
        thread::sleep(Duration::from_millis(run_ms));
        summary.direct_write_bytes += broker.admin.as_deref().map_or(0, direct_write_bytes);
        let report = fs.power_cut(tear);
        let stopped = broker.kill().context("killing the broker")?;
        stop.store(true, Ordering::SeqCst);
        let mut acks = CycleAcks::default();
        let (records, next) = producer
            .join()
            .map_err(|_| anyhow::anyhow!("producer panicked"))??;
        acks.records = records;
        ledger.next_record = next;
        let (commits, sent) = committer
            .join()
            .map_err(|_| anyhow::anyhow!("committer panicked"))?;
        acks.commits = commits;
        acks.commits_sent = sent;
        let (published, acked, unknown, next) = queue
            .join()
            .map_err(|_| anyhow::anyhow!("queue client panicked"))?;
        (acks.published, acks.acked, acks.ack_unknown) = (published, acked, unknown);
        ledger.next_message = next;
        merge(&mut ledger, acks)?;
        summary.cuts += 1;
        summary.torn_writes += u32::from(report.torn.is_some());
        summary.files_reverted += report.files_reverted as u64;
        summary.dirs_reverted += report.dirs_reverted as u64;
        progress(&format!(
            "cut {}/{}: after {run_ms} ms; {} records, {} commits, {} publishes, {} acks acknowledged so far; {report:?}; broker {}",
            cycle + 1,
            opts.cuts,
            ledger.records.len(),
            ledger.commits_acked,
            ledger.published.len(),
            ledger.acked.len(),
            stopped.how,
        ));
        fs.restart()
            .context("mounting the file system again after the cut")?;
    }
    let stats = fs.stats();
    fs.unmount().context("unmounting")?;
    summary.records_acked = ledger.records.len() as u64;
    summary.record_bytes_acked = ledger.record_bytes;
    summary.commits_acked = ledger.commits_acked;
    summary.queue_publishes_acked = ledger.published.len() as u64;
    summary.queue_acks_acked = ledger.acked.len() as u64;
    summary.file_syncs = stats.file_syncs;
    summary.dir_syncs = stats.dir_syncs;
    summary.direct_opens = stats.direct_opens;
    summary.fallocates = stats.fallocates.values().sum();
    summary.elapsed = started.elapsed();
    Ok(summary)
}

fn merge(ledger: &mut Ledger, acks: CycleAcks) -> Result<()> {
    for (p, o, n) in acks.records {
        if let Some(old) = ledger.records.insert((p, o), n) {
            bail!("partition {p} offset {o} acknowledged twice: records {old} and {n}");
        }
        ledger.record_bytes += record_size(n) as u64;
    }
    for (p, o) in acks.commits {
        let e = ledger.commits.entry(p).or_insert((-1, -1));
        e.0 = e.0.max(o);
        ledger.commits_acked += 1;
    }
    for (p, o) in acks.commits_sent {
        let e = ledger.commits.entry(p).or_insert((-1, -1));
        e.1 = e.1.max(o);
    }
    for (id, p, o, payload) in acks.published {
        if let Some(old) = ledger.queue_offsets.insert((p, o), id.clone()) {
            bail!("queue partition {p} offset {o} acknowledged for two publishes: {old} and {id}");
        }
        ledger.published_at.insert(id.clone(), (p, o, ledger.cycle));
        ledger.published.insert(id, payload);
    }
    ledger.acked.extend(acks.acked);
    ledger.ack_unknown.extend(acks.ack_unknown);
    Ok(())
}
