//! The Kafka workload, on `rdkafka` (bundled librdkafka): the same client code and settings for
//! every broker under test.
//!
//! Phases, in order, on one fresh topic:
//!
//! 1. **Topic**: created with the admin API (CreateTopics), then metadata is polled until every
//!    partition has a leader.
//! 2. **Warm-up** (excluded from every figure): the producers send for `warmup_secs` so that
//!    connections, metadata and the broker's first segments exist; the tail consumers (if any)
//!    must have read all of it before measuring starts.
//! 3. **Produce** (the "peak" phase): the producers send as fast as librdkafka accepts (or at
//!    `--rate`), round-robin over all partitions. Throughput counts acknowledged messages only,
//!    from the phase start to the last delivery report. Produce latency is send → delivery
//!    report. The tail consumers measure end-to-end latency (payload timestamp → consumed).
//! 4. **Paced** (optional): the same, at a fixed fraction of the peak phase's throughput, which
//!    is where latency percentiles mean something (not queueing in the client).
//! 5. **Consume**: fresh consumers assign every partition at offset 0 and read back everything
//!    produced (warm-up included), timed from the first record received to the last; twice.
//!    The first read catches up on the log as written: what the broker kept in memory of it is
//!    its own choice (Kafka, through the page cache, keeps it all where memory allows; a broker
//!    writing past the page cache keeps its most recent writes). The second read, of the log
//!    the first one warmed, is the consume figure. Both read-back counts are checked against
//!    the acknowledged end offsets.
//!
//! Message layout: bytes 0..8 are the send time (ns since the run's base instant, little
//! endian), byte 8 is the phase, the rest is incompressible filler that differs from message to
//! message (cut from a 16 MiB pseudo-random pool). No keys.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::statistics::Statistics;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use serde::Serialize;

use crate::host::{CpuMark, ThreadCpu, ThreadMark};
use crate::latency::{self, LatencySummary};
use crate::raw::pseudo_random_bytes;

/// Smallest message the layout allows (timestamp + phase byte, rounded up).
pub const MIN_MESSAGE_BYTES: usize = 16;

/// Phase tags written into byte 8 of every payload.
const PHASE_WARMUP: u8 = 0;
const PHASE_PEAK: u8 = 1;
const PHASE_PACED: u8 = 2;
const PHASES: usize = 3;

/// Client errors and warnings kept verbatim per run; the rest are only counted.
const MAX_KEPT_CLIENT_EVENTS: usize = 20;

/// How much the measured produce phase sends.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
#[serde(rename_all = "snake_case")]
pub enum Amount {
    /// This many messages in total, split evenly over the producers.
    Messages(u64),
    /// As many as fit in this many seconds.
    DurationSecs(f64),
}

/// Everything that defines the workload; identical for every broker in one run.
#[derive(Debug, Clone, Serialize)]
pub struct WorkloadParams {
    pub topic: String,
    pub message_bytes: usize,
    pub amount: Amount,
    pub warmup_secs: f64,
    pub partitions: i32,
    /// Replication factor of the topic; -1 takes the broker's `default.replication.factor`.
    pub replication_factor: i32,
    pub producers: usize,
    pub consumers: usize,
    pub acks: String,
    pub compression: String,
    /// `linger.ms`; `None` keeps librdkafka's default (5 ms).
    pub linger_ms: Option<u64>,
    /// `batch.size`; `None` keeps librdkafka's default (1,000,000 bytes).
    pub batch_size: Option<u64>,
    /// Messages/s for the produce phase (all producers together); `None` = as fast as possible.
    pub rate: Option<f64>,
    /// Fraction of the produce phase's throughput at which the paced phase runs; 0 = no phase.
    pub paced_fraction: f64,
    /// Messages/s of the paced phase, instead of `paced_fraction` of the peak.
    pub paced_rate: Option<f64>,
    pub paced_secs: f64,
    /// Run tail consumers during the produce phases to measure end-to-end latency.
    pub end_to_end: bool,
    /// librdkafka statistics every second (to report the average produce batch size).
    pub client_stats: bool,
    /// Extra librdkafka producer properties, applied after the ones above.
    pub producer_props: Vec<(String, String)>,
    /// Extra librdkafka consumer properties.
    pub consumer_props: Vec<(String, String)>,
    /// Limit for topic readiness, flushes, catching up and stalled consumers.
    pub timeout_secs: f64,
}

impl WorkloadParams {
    /// Rejects parameter combinations the workload cannot run.
    pub fn validate(&self) -> Result<()> {
        if self.message_bytes < MIN_MESSAGE_BYTES {
            bail!("--message-bytes must be at least {MIN_MESSAGE_BYTES} (timestamp and phase tag)");
        }
        if self.partitions < 1 {
            bail!("--partitions must be at least 1");
        }
        if self.replication_factor < 1 && self.replication_factor != -1 {
            bail!("--replication-factor must be at least 1, or -1 for the broker's default");
        }
        if self.producers < 1 {
            bail!("--producers must be at least 1");
        }
        match self.amount {
            Amount::Messages(0) => bail!("--messages must be at least 1"),
            Amount::DurationSecs(s) if s <= 0.0 || !s.is_finite() => {
                bail!("--duration-secs must be positive")
            }
            _ => {}
        }
        if let Some(r) = self.rate {
            if r <= 0.0 || !r.is_finite() {
                bail!("--rate must be positive");
            }
        }
        if !(0.0..=1.0).contains(&self.paced_fraction) {
            bail!("--paced-fraction must be within 0..=1");
        }
        if let Some(r) = self.paced_rate {
            if r <= 0.0 || !r.is_finite() {
                bail!("--paced-rate must be positive");
            }
            if self.paced_fraction == 0.0 {
                bail!("--paced-rate needs a paced phase (--paced-fraction above 0)");
            }
        }
        if self.paced_fraction > 0.0 && self.paced_secs <= 0.0 {
            bail!("--paced-secs must be positive when a paced phase runs");
        }
        if self.end_to_end && self.consumers == 0 {
            bail!("end-to-end latency needs --consumers >= 1 (or pass --no-e2e)");
        }
        Ok(())
    }

    fn timeout(&self) -> Duration {
        Duration::from_secs_f64(self.timeout_secs)
    }

    /// The producer configuration every broker gets.
    pub fn producer_config(&self, bootstrap: &str) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", bootstrap)
            .set("client.id", "strand-bench")
            .set("acks", &self.acks)
            .set("compression.type", &self.compression);
        if let Some(l) = self.linger_ms {
            c.set("linger.ms", l.to_string());
        }
        if let Some(b) = self.batch_size {
            c.set("batch.size", b.to_string());
        }
        if self.client_stats {
            c.set("statistics.interval.ms", "1000");
        }
        for (k, v) in &self.producer_props {
            c.set(k, v);
        }
        c
    }

    /// The consumer configuration every broker gets. librdkafka only allows `assign` with a
    /// `group.id`; the consumers never subscribe, join or commit.
    pub fn consumer_config(&self, bootstrap: &str, role: &str) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", bootstrap)
            .set("client.id", format!("strand-bench-{role}"))
            .set("group.id", format!("strand-bench-{}-{role}", std::process::id()))
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("enable.partition.eof", "false")
            .set("auto.offset.reset", "earliest");
        for (k, v) in &self.consumer_props {
            c.set(k, v);
        }
        c
    }
}

/// Where the workload is; the caller records broker memory at each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checkpoint {
    TopicReady,
    /// The paced phase is about to start (only if it runs).
    PacedStart,
    Produced,
    Consumed,
}

/// Figures of one broker's run.
#[derive(Debug, Clone, Serialize)]
pub struct WorkloadResult {
    pub topic: String,
    /// CreateTopics until every partition has a leader in metadata.
    pub topic_ready_secs: f64,
    pub warmup: WarmupResult,
    /// The produce ("peak") phase.
    pub produce: ProduceResult,
    /// The paced phase, at `paced_fraction` of the produce phase's throughput.
    pub paced: Option<ProduceResult>,
    /// Reading back everything from offset 0, the second time: the warm log.
    pub consume: Option<ConsumeResult>,
    /// The first read of everything from offset 0, which catches up on the log as written.
    pub first_read: Option<ConsumeResult>,
    /// Errors and warnings librdkafka reported (global errors, log lines at warning or worse).
    pub client_events: ClientEventSummary,
}

impl WorkloadResult {
    /// Messages that failed to produce or were not read back; a run with any is not valid.
    pub fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        for (name, phase) in [("produce", Some(&self.produce)), ("paced", self.paced.as_ref())] {
            if let Some(phase) = phase {
                if phase.failed > 0 {
                    p.push(format!(
                        "{name}: {} messages failed ({})",
                        phase.failed,
                        phase.first_error.as_deref().unwrap_or("?")
                    ));
                }
            }
        }
        for (name, read) in [("first read", &self.first_read), ("consume", &self.consume)] {
            if let Some(c) = read {
                if c.messages < c.expected_messages {
                    p.push(format!(
                        "{name}: read back {} of {} acknowledged messages",
                        c.messages, c.expected_messages
                    ));
                }
            }
        }
        p
    }
}

impl WorkloadResult {
    /// Broker behaviour worth knowing that does not invalidate the figures.
    pub fn anomalies(&self) -> Vec<String> {
        let mut a = Vec::new();
        if let Some(c) = self.consume.as_ref().filter(|c| c.high_watermark_below_acked > 0) {
            a.push(format!(
                "ListOffsets(latest) is below an acknowledged offset on {} partitions, although every \
                 acknowledged record was read back ({})",
                c.high_watermark_below_acked,
                c.high_watermark_examples.join("; ")
            ));
        }
        a
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct WarmupResult {
    pub acked: u64,
    pub secs: f64,
}

/// One produce phase.
#[derive(Debug, Clone, Serialize)]
pub struct ProduceResult {
    /// Messages/s aimed for (all producers), if paced.
    pub target_rate: Option<f64>,
    pub sent: u64,
    pub acked: u64,
    pub failed: u64,
    pub first_error: Option<String>,
    /// Payload bytes acknowledged.
    pub bytes: u64,
    /// From the phase start to the last delivery report.
    pub secs: f64,
    pub msgs_per_s: f64,
    /// MB = 10^6 bytes of payload.
    pub mb_per_s: f64,
    /// send() accepted → delivery report.
    pub latency: LatencySummary,
    /// Payload timestamp → consumed by a tail consumer.
    pub end_to_end: Option<LatencySummary>,
    /// Times send() found librdkafka's queue full and waited (the wait is not in `latency`).
    pub queue_full_waits: u64,
    /// CPU used during the phase (until the last delivery report).
    pub cpu: CpuUsage,
    /// Average produce batch (one partition's MessageSet) in bytes and messages, from
    /// librdkafka statistics, when `client_stats` is on.
    pub avg_batch_bytes: Option<f64>,
    pub avg_batch_messages: Option<f64>,
}

/// Reading the warm log back.
#[derive(Debug, Clone, Serialize)]
pub struct ConsumeResult {
    /// Everything produced, warm-up included: the acknowledged end offsets (or the high
    /// watermarks, see `offsets_from_watermarks`) minus the log start offsets.
    pub expected_messages: u64,
    pub messages: u64,
    /// Payload bytes read.
    pub bytes: u64,
    /// First record received → last record received.
    pub secs: f64,
    /// assign() → last record received (includes connecting and the first fetch).
    pub wall_secs: f64,
    pub msgs_per_s: f64,
    pub mb_per_s: f64,
    /// CPU used while reading back.
    pub cpu: CpuUsage,
    /// True when acknowledgements carried no offsets (acks=0) and the high watermarks were used.
    pub offsets_from_watermarks: bool,
    /// Partitions whose high watermark (ListOffsets) is below an acknowledged offset.
    pub high_watermark_below_acked: u64,
    /// The first few of those.
    pub high_watermark_examples: Vec<String>,
}

/// CPU used during a phase, in cores (CPU seconds per wall second; 2.0 = two cores busy).
/// On a small machine this shows whether the client or the broker was the bottleneck.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct CpuUsage {
    /// This process: the benchmark's clients (librdkafka threads included).
    pub client_cores: Option<f64>,
    /// The broker process, when its pid is known (spawned, or `--broker-pid`).
    pub broker_cores: Option<f64>,
    /// This process's busiest thread: a client that is not busy as a whole may still be held
    /// back by one thread (librdkafka parses a broker's answers on one thread per broker).
    pub client_busiest_thread: Option<ThreadCpu>,
    /// The broker's busiest thread (a shard, say), when its pid is known.
    pub broker_busiest_thread: Option<ThreadCpu>,
    /// Minor page faults per second of this process: memory it touched for the first time (a
    /// client that maps a fresh buffer for every Fetch answer takes one per 4 KiB it reads).
    pub client_minor_faults_per_s: Option<f64>,
    /// The same for the broker, when its pid is known.
    pub broker_minor_faults_per_s: Option<f64>,
}

impl CpuUsage {
    /// Cores used from `start` until now; per thread from `threads` until now, with `seen`
    /// (sampled during the phase, see [`ThreadMark::observe`]) for the threads that ended.
    fn since(start: &CpuMark, threads: &ThreadMark, mut seen: ThreadMark, broker_pid: Option<u32>) -> Self {
        let end = CpuMark::now(broker_pid);
        let (wall, client, broker) = start.until(&end);
        let (client_faults, broker_faults) = start.faults_until(&end);
        seen.observe(broker_pid);
        let (client_busiest_thread, broker_busiest_thread) = threads.busiest_until(&seen);
        let cores = |x: Option<f64>| x.filter(|_| wall > 0.0).map(|x| x / wall);
        let per_s = |n: Option<u64>| n.filter(|_| wall > 0.0).map(|n| n as f64 / wall);
        CpuUsage {
            client_cores: cores(client),
            broker_cores: cores(broker),
            client_busiest_thread,
            broker_busiest_thread,
            client_minor_faults_per_s: per_s(client_faults),
            broker_minor_faults_per_s: per_s(broker_faults),
        }
    }
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct ClientEventSummary {
    pub count: u64,
    pub first: Vec<String>,
}

/// librdkafka errors and warnings from every client of one run.
#[derive(Default)]
struct ClientEvents {
    count: AtomicU64,
    kept: Mutex<Vec<String>>,
}

impl ClientEvents {
    fn push(&self, event: String) {
        if self.count.fetch_add(1, Ordering::Relaxed) < MAX_KEPT_CLIENT_EVENTS as u64 {
            if let Ok(mut kept) = self.kept.lock() {
                kept.push(event);
            }
        }
    }

    fn summary(&self) -> ClientEventSummary {
        ClientEventSummary {
            count: self.count.load(Ordering::Relaxed),
            first: self.kept.lock().map(|k| k.clone()).unwrap_or_default(),
        }
    }

    fn log(&self, role: &str, level: RDKafkaLogLevel, fac: &str, message: &str) {
        use RDKafkaLogLevel::*;
        if matches!(level, Emerg | Alert | Critical | Error | Warning) {
            self.push(format!("{role} {level:?} {fac}: {message}"));
        }
    }
}

/// State shared by every producer and consumer of one run.
struct Shared {
    /// Payload timestamps are nanoseconds since this instant.
    base: Instant,
    /// Per partition: highest acknowledged offset + 1.
    end_offsets: Vec<AtomicI64>,
    /// Acknowledgements without an offset (acks=0): the read-back then goes by high watermarks.
    unknown_offsets: AtomicU64,
    events: ClientEvents,
    /// The broker's pid, for its CPU use, when known.
    broker_pid: Option<u32>,
}

impl Shared {
    fn now_ns(&self) -> u64 {
        self.base.elapsed().as_nanos() as u64
    }
}

/// Per-producer counters for the current phase, reset between phases (after a flush).
struct ProducerCtx {
    shared: Arc<Shared>,
    hist: Mutex<Histogram<u64>>,
    acked: AtomicU64,
    acked_bytes: AtomicU64,
    failed: AtomicU64,
    first_error: Mutex<Option<String>>,
    last_ack_ns: AtomicU64,
    batch_bytes_sum: AtomicI64,
    batch_msgs_sum: AtomicI64,
    batch_count: AtomicI64,
}

impl ProducerCtx {
    fn new(shared: Arc<Shared>) -> Self {
        Self {
            shared,
            hist: Mutex::new(latency::histogram()),
            acked: AtomicU64::new(0),
            acked_bytes: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            first_error: Mutex::new(None),
            last_ack_ns: AtomicU64::new(0),
            batch_bytes_sum: AtomicI64::new(0),
            batch_msgs_sum: AtomicI64::new(0),
            batch_count: AtomicI64::new(0),
        }
    }

    /// Takes this phase's counters and starts the next phase from zero.
    fn take(&self) -> PhaseCounters {
        let hist = self
            .hist
            .lock()
            .map(|mut h| std::mem::replace(&mut *h, latency::histogram()));
        PhaseCounters {
            hist: hist.unwrap_or_else(|_| latency::histogram()),
            acked: self.acked.swap(0, Ordering::AcqRel),
            acked_bytes: self.acked_bytes.swap(0, Ordering::AcqRel),
            failed: self.failed.swap(0, Ordering::AcqRel),
            first_error: self.first_error.lock().ok().and_then(|mut e| e.take()),
            last_ack_ns: self.last_ack_ns.swap(0, Ordering::AcqRel),
            batch_bytes_sum: self.batch_bytes_sum.swap(0, Ordering::AcqRel),
            batch_msgs_sum: self.batch_msgs_sum.swap(0, Ordering::AcqRel),
            batch_count: self.batch_count.swap(0, Ordering::AcqRel),
        }
    }
}

impl ClientContext for ProducerCtx {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        self.shared.events.log("producer", level, fac, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        self.shared
            .events
            .push(format!("producer error {error}: {reason}"));
    }

    fn stats(&self, statistics: Statistics) {
        for topic in statistics.topics.values() {
            self.batch_bytes_sum
                .fetch_add(topic.batchsize.sum, Ordering::Relaxed);
            self.batch_msgs_sum
                .fetch_add(topic.batchcnt.sum, Ordering::Relaxed);
            self.batch_count.fetch_add(topic.batchsize.cnt, Ordering::Relaxed);
        }
    }
}

impl ProducerContext for ProducerCtx {
    /// The send time, in ns since `Shared::base`.
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, sent_ns: usize) {
        let now = self.shared.now_ns();
        match result {
            Ok(msg) => {
                if let Ok(mut h) = self.hist.lock() {
                    latency::record_ns(&mut h, now.saturating_sub(sent_ns as u64));
                }
                self.acked.fetch_add(1, Ordering::Relaxed);
                self.acked_bytes
                    .fetch_add(msg.payload_len() as u64, Ordering::Relaxed);
                self.last_ack_ns.fetch_max(now, Ordering::Relaxed);
                if msg.offset() < 0 {
                    self.shared.unknown_offsets.fetch_add(1, Ordering::Relaxed);
                }
                if let Some(end) = usize::try_from(msg.partition())
                    .ok()
                    .and_then(|p| self.shared.end_offsets.get(p))
                {
                    end.fetch_max(msg.offset() + 1, Ordering::Relaxed);
                }
            }
            Err((error, _)) => {
                self.failed.fetch_add(1, Ordering::Relaxed);
                if let Ok(mut first) = self.first_error.lock() {
                    first.get_or_insert_with(|| error.to_string());
                }
            }
        }
    }
}

struct PhaseCounters {
    hist: Histogram<u64>,
    acked: u64,
    acked_bytes: u64,
    failed: u64,
    first_error: Option<String>,
    last_ack_ns: u64,
    batch_bytes_sum: i64,
    batch_msgs_sum: i64,
    batch_count: i64,
}

struct ConsumerCtx {
    shared: Arc<Shared>,
}

impl ClientContext for ConsumerCtx {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        self.shared.events.log("consumer", level, fac, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        self.shared
            .events
            .push(format!("consumer error {error}: {reason}"));
    }
}

impl ConsumerContext for ConsumerCtx {}

type Prod = ThreadedProducer<ProducerCtx>;

/// What one producer thread sends in a phase.
#[derive(Clone, Copy)]
struct SendPlan {
    phase: u8,
    /// All producers together (split evenly); `None` = until `until`.
    messages: Option<u64>,
    until: Option<Instant>,
    /// Messages/s for this producer.
    rate: Option<f64>,
}

/// Tail consumers measuring end-to-end latency while the producers run.
struct Tail {
    stop: Arc<AtomicBool>,
    received: Arc<[AtomicU64; PHASES]>,
    handles: Vec<thread::JoinHandle<Result<[Histogram<u64>; PHASES]>>>,
}

/// Stops the tail consumers' threads if a phase fails before `finish_tail` (they would otherwise
/// poll forever).
impl Drop for Tail {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Runs the whole workload against one broker (`broker_pid`, when known, for its CPU use).
pub fn run(
    bootstrap: &str,
    broker_pid: Option<u32>,
    params: &WorkloadParams,
    label: &str,
    show_progress: bool,
    checkpoint: &mut dyn FnMut(Checkpoint),
) -> Result<WorkloadResult> {
    params.validate()?;
    let shared = Arc::new(Shared {
        base: Instant::now(),
        end_offsets: (0..params.partitions).map(|_| AtomicI64::new(0)).collect(),
        unknown_offsets: AtomicU64::new(0),
        events: ClientEvents::default(),
        broker_pid,
    });
    let bar = Bars {
        label: label.to_string(),
        show: show_progress,
    };

    let topic_ready_secs = create_topic(bootstrap, params, &bar)?;
    checkpoint(Checkpoint::TopicReady);

    let producers = (0..params.producers)
        .map(|_| {
            params
                .producer_config(bootstrap)
                .create_with_context::<_, Prod>(ProducerCtx::new(Arc::clone(&shared)))
                .context("creating a producer")
        })
        .collect::<Result<Vec<_>>>()?;
    let pool = payload_pool(params.message_bytes);

    let tail = if params.end_to_end {
        Some(start_tail(bootstrap, params, &shared)?)
    } else {
        None
    };

    // Warm-up: excluded from every figure.
    let warm_started = Instant::now();
    let warm_secs = params.warmup_secs.max(0.0);
    let warmup = if warm_secs > 0.0 {
        let until = Instant::now() + Duration::from_secs_f64(warm_secs);
        let rate = params.rate.map(|r| r / params.producers as f64);
        let plan = SendPlan {
            phase: PHASE_WARMUP,
            messages: None,
            until: Some(until),
            rate,
        };
        let run = produce_phase(&producers, params, &shared, &pool, plan, &bar, "warm-up")?;
        let acked = run.counters.iter().map(|c| c.acked).sum();
        if let Some(c) = run.counters.iter().find(|c| c.failed > 0) {
            bail!(
                "warm-up: {} messages failed: {}",
                c.failed,
                c.first_error.as_deref().unwrap_or("unknown error")
            );
        }
        WarmupResult {
            acked,
            secs: warm_started.elapsed().as_secs_f64(),
        }
    } else {
        WarmupResult { acked: 0, secs: 0.0 }
    };
    if let Some(tail) = &tail {
        wait_for_tail(
            tail,
            PHASE_WARMUP,
            warmup.acked,
            params.timeout(),
            &bar,
            "tail catching up",
        )?;
    }

    // The produce ("peak") phase.
    let per_producer_rate = params.rate.map(|r| r / params.producers as f64);
    let plan = match params.amount {
        Amount::Messages(n) => SendPlan {
            phase: PHASE_PEAK,
            messages: Some(n),
            until: None,
            rate: per_producer_rate,
        },
        Amount::DurationSecs(s) => SendPlan {
            phase: PHASE_PEAK,
            messages: None,
            until: Some(Instant::now() + Duration::from_secs_f64(s)),
            rate: per_producer_rate,
        },
    };
    let mut produce = summarize_phase(produce_phase(
        &producers, params, &shared, &pool, plan, &bar, "produce",
    )?);
    produce.target_rate = params.rate;

    // The paced phase, at a fraction of what the peak phase achieved (or at a given rate).
    let mut paced = None;
    if params.paced_fraction > 0.0 && produce.msgs_per_s > 0.0 {
        let target = params
            .paced_rate
            .unwrap_or(produce.msgs_per_s * params.paced_fraction);
        // Before the phase's clock starts: whatever the caller does here is not timed.
        checkpoint(Checkpoint::PacedStart);
        let plan = SendPlan {
            phase: PHASE_PACED,
            messages: None,
            until: Some(Instant::now() + Duration::from_secs_f64(params.paced_secs)),
            rate: Some(target / params.producers as f64),
        };
        let name = match params.paced_rate {
            Some(r) => format!("paced {r:.0}/s"),
            None => format!("paced {:.0}%", params.paced_fraction * 100.0),
        };
        let mut result = summarize_phase(produce_phase(
            &producers, params, &shared, &pool, plan, &bar, &name,
        )?);
        result.target_rate = Some(target);
        paced = Some(result);
    }
    checkpoint(Checkpoint::Produced);

    if let Some(tail) = tail {
        let measured = produce.acked + paced.as_ref().map_or(0, |p| p.acked);
        let hists = finish_tail(tail, measured, params.timeout(), &bar)?;
        produce.end_to_end = Some(LatencySummary::of(&hists[PHASE_PEAK as usize]));
        if let Some(p) = paced.as_mut() {
            p.end_to_end = Some(LatencySummary::of(&hists[PHASE_PACED as usize]));
        }
    }
    drop(producers);

    let (first_read, consume) = if params.consumers > 0 {
        let first = read_log(bootstrap, params, &shared, &bar, "first read")?;
        (
            Some(first),
            Some(read_log(bootstrap, params, &shared, &bar, "consume")?),
        )
    } else {
        (None, None)
    };
    checkpoint(Checkpoint::Consumed);

    Ok(WorkloadResult {
        topic: params.topic.clone(),
        topic_ready_secs,
        warmup,
        produce,
        paced,
        consume,
        first_read,
        client_events: shared.events.summary(),
    })
}

/// Progress bars on stderr (hidden when not wanted or not a terminal).
struct Bars {
    label: String,
    show: bool,
}

impl Bars {
    fn bar(&self, phase: &str, len: u64) -> ProgressBar {
        if !self.show {
            return ProgressBar::hidden();
        }
        let bar = ProgressBar::new(len);
        let style = ProgressStyle::with_template("{prefix:>24} [{bar:30}] {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
        bar.set_style(style);
        bar.set_prefix(format!("{} {phase}", self.label));
        bar
    }

    fn spinner(&self, phase: &str) -> ProgressBar {
        if !self.show {
            return ProgressBar::hidden();
        }
        let bar = ProgressBar::new_spinner();
        let style = ProgressStyle::with_template("{prefix:>24} {spinner} {msg} ({elapsed})")
            .unwrap_or_else(|_| ProgressStyle::default_spinner());
        bar.set_style(style);
        bar.set_prefix(format!("{} {phase}", self.label));
        bar.enable_steady_tick(Duration::from_millis(200));
        bar
    }
}

/// An admin client of `bootstrap` called `client_id`, and options that bound its requests by
/// `timeout`.
pub fn admin_client(
    bootstrap: &str,
    client_id: &str,
    timeout: Duration,
) -> Result<(AdminClient<DefaultClientContext>, AdminOptions)> {
    let admin = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("client.id", client_id)
        .create()
        .context("creating the admin client")?;
    let options = AdminOptions::new()
        .operation_timeout(Some(timeout))
        .request_timeout(Some(timeout));
    Ok((admin, options))
}

fn create_topic(bootstrap: &str, params: &WorkloadParams, bars: &Bars) -> Result<f64> {
    let spinner = bars.spinner("topic");
    spinner.set_message(format!(
        "creating {} with {} partitions",
        params.topic, params.partitions
    ));
    let started = Instant::now();
    let (admin, options) = admin_client(bootstrap, "strand-bench-admin", params.timeout())?;
    let topic = NewTopic::new(
        &params.topic,
        params.partitions,
        TopicReplication::Fixed(params.replication_factor),
    );
    let results = futures::executor::block_on(admin.create_topics([&topic], &options))
        .with_context(|| format!("CreateTopics {} on {bootstrap}", params.topic))?;
    for result in results {
        if let Err((name, code)) = result {
            if code == RDKafkaErrorCode::TopicAlreadyExists {
                bail!("topic {name} already exists: pass a new --topic (or none, for a fresh unique name)");
            }
            bail!("CreateTopics {name} on {bootstrap}: {code}");
        }
    }
    // Wait until metadata shows every partition with a leader.
    let deadline = started + params.timeout();
    loop {
        let state = match admin
            .inner()
            .fetch_metadata(Some(&params.topic), Duration::from_secs(5))
        {
            Ok(md) => match md.topics().iter().find(|t| t.name() == params.topic) {
                Some(t) if t.error().is_none() => {
                    let ready = t
                        .partitions()
                        .iter()
                        .filter(|p| p.leader() >= 0 && p.error().is_none())
                        .count();
                    if ready == params.partitions as usize && t.partitions().len() == ready {
                        break;
                    }
                    format!("{ready} of {} partitions have a leader", params.partitions)
                }
                Some(t) => format!("topic error {:?}", t.error()),
                None => "topic not in metadata".to_string(),
            },
            Err(e) => format!("metadata request failed: {e}"),
        };
        if Instant::now() > deadline {
            bail!(
                "topic {} not ready within {:.0} s: {state}",
                params.topic,
                params.timeout_secs
            );
        }
        thread::sleep(Duration::from_millis(50));
    }
    spinner.finish_and_clear();
    Ok(started.elapsed().as_secs_f64())
}

/// What one produce phase returned, before summarizing.
struct PhaseRun {
    /// Phase start and end (after the flush), in ns since `Shared::base`.
    started_ns: u64,
    ended_ns: u64,
    counters: Vec<PhaseCounters>,
    sent: u64,
    queue_full_waits: u64,
    cpu: CpuUsage,
}

/// Runs one phase on every producer and flushes.
fn produce_phase(
    producers: &[Prod],
    params: &WorkloadParams,
    shared: &Shared,
    pool: &[u8],
    plan: SendPlan,
    bars: &Bars,
    phase_name: &str,
) -> Result<PhaseRun> {
    let sent = AtomicU64::new(0);
    let abort = AtomicBool::new(false);
    let started = Instant::now();
    let started_ns = shared.now_ns();
    let cpu = CpuMark::now(shared.broker_pid);
    let threads = ThreadMark::now(shared.broker_pid);
    let mut seen = threads.clone();
    let (len, by_time) = match (plan.messages, plan.until) {
        (Some(n), _) => (n, false),
        (None, Some(until)) => (until.saturating_duration_since(started).as_millis() as u64, true),
        (None, None) => (0, false),
    };
    let bar = bars.bar(phase_name, len.max(1));
    let outcomes = thread::scope(|s| {
        let handles: Vec<_> = producers
            .iter()
            .enumerate()
            .map(|(i, producer)| {
                let (sent, abort) = (&sent, &abort);
                s.spawn(move || {
                    let result = send_loop(producer, params, shared, pool, plan, i, sent, abort);
                    if result.is_err() {
                        abort.store(true, Ordering::Relaxed);
                    }
                    result
                })
            })
            .collect();
        while !handles.iter().all(|h| h.is_finished()) {
            thread::sleep(Duration::from_millis(100));
            seen.observe(shared.broker_pid);
            let n = sent.load(Ordering::Relaxed);
            let secs = started.elapsed().as_secs_f64();
            bar.set_position(if by_time {
                started.elapsed().as_millis() as u64
            } else {
                n
            });
            bar.set_message(format!("{n} sent, {:.0} msg/s", n as f64 / secs.max(1e-9)));
        }
        handles
            .into_iter()
            .map(|h| h.join().map_err(|_| anyhow!("a producer thread panicked"))?)
            .collect::<Result<Vec<(u64, u64)>>>()
    })?;
    bar.set_message("waiting for delivery reports");
    for producer in producers {
        producer
            .flush(params.timeout())
            .with_context(|| format!("{phase_name}: not every message was acknowledged in time"))?;
    }
    bar.finish_and_clear();
    let cpu = CpuUsage::since(&cpu, &threads, seen, shared.broker_pid);
    let ended_ns = shared.now_ns();
    let (sent, queue_full_waits) = outcomes.iter().fold((0, 0), |(a, b), (s, q)| (a + s, b + q));
    let counters = producers.iter().map(|p| p.context().take()).collect();
    Ok(PhaseRun {
        started_ns,
        ended_ns,
        counters,
        sent,
        queue_full_waits,
        cpu,
    })
}

#[allow(clippy::too_many_arguments)]
fn send_loop(
    producer: &Prod,
    params: &WorkloadParams,
    shared: &Shared,
    pool: &[u8],
    plan: SendPlan,
    index: usize,
    sent: &AtomicU64,
    abort: &AtomicBool,
) -> Result<(u64, u64)> {
    let size = params.message_bytes;
    let mut buf = vec![0u8; size];
    // Each message takes the next `size` bytes of the pool, so that no two messages in a batch
    // share content: compression codecs see incompressible data, not one payload repeated.
    let pool_slots = pool.len() / size;
    let mut slot = index * pool_slots / params.producers;
    let partitions = params.partitions;
    // Producers start at different partitions so that together they cover all of them evenly.
    let mut partition = ((index as u64 * partitions as u64) / params.producers as u64) as i32;
    let producers = params.producers as u64;
    let quota = plan
        .messages
        .map(|n| n / producers + u64::from((index as u64) < n % producers));
    let started = Instant::now();
    let mut count = 0u64;
    let mut queue_full_waits = 0u64;
    loop {
        if abort.load(Ordering::Relaxed)
            || quota.is_some_and(|n| count >= n)
            || plan.until.is_some_and(|u| Instant::now() >= u)
        {
            break;
        }
        if let Some(rate) = plan.rate {
            let due = started + Duration::from_secs_f64(count as f64 / rate);
            let now = Instant::now();
            if due > now {
                thread::sleep(due - now);
            }
        }
        buf.copy_from_slice(&pool[slot * size..(slot + 1) * size]);
        buf[8] = plan.phase;
        slot = (slot + 1) % pool_slots;
        let mut queue_full_since = None;
        loop {
            // Stamped at each attempt: time spent waiting for queue space is not latency.
            let sent_ns = shared.now_ns();
            buf[..8].copy_from_slice(&sent_ns.to_le_bytes());
            let record = BaseRecord::<(), [u8], usize>::with_opaque_to(&params.topic, sent_ns as usize)
                .partition(partition)
                .payload(&buf[..]);
            match producer.send(record) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                    queue_full_waits += 1;
                    let now = Instant::now();
                    if abort.load(Ordering::Relaxed) || plan.until.is_some_and(|u| now >= u) {
                        return Ok((count, queue_full_waits));
                    }
                    let full_since = *queue_full_since.get_or_insert(now);
                    if now.duration_since(full_since) > params.timeout() {
                        bail!(
                            "librdkafka's queue stayed full for {:.0} s: the broker is not acknowledging",
                            params.timeout_secs
                        );
                    }
                    thread::sleep(Duration::from_micros(200));
                }
                Err((e, _)) => return Err(anyhow!(e).context(format!("sending to partition {partition}"))),
            }
        }
        count += 1;
        sent.fetch_add(1, Ordering::Relaxed);
        partition += 1;
        if partition == partitions {
            partition = 0;
        }
    }
    Ok((count, queue_full_waits))
}

/// Incompressible filler that message payloads are cut from: at least 16 MiB and 16 messages,
/// more than any producer batch (`message.max.bytes` caps one at ~1 MB by default).
fn payload_pool(message_bytes: usize) -> Vec<u8> {
    let len = (16 << 20).max(16 * message_bytes);
    pseudo_random_bytes(len - len % message_bytes, 0xb0b0_cafe)
}

/// Throughput counts acknowledged messages from the phase start to the last delivery report.
fn summarize_phase(run: PhaseRun) -> ProduceResult {
    let mut hist = latency::histogram();
    let mut acked = 0;
    let mut bytes = 0;
    let mut failed = 0;
    let mut first_error = None;
    let mut last_ack_ns = 0;
    let (mut bb, mut bm, mut bc) = (0i64, 0i64, 0i64);
    for c in run.counters {
        // Same bounds on both sides: adding cannot fail.
        let _ = hist.add(&c.hist);
        acked += c.acked;
        bytes += c.acked_bytes;
        failed += c.failed;
        first_error = first_error.or(c.first_error);
        last_ack_ns = last_ack_ns.max(c.last_ack_ns);
        bb += c.batch_bytes_sum;
        bm += c.batch_msgs_sum;
        bc += c.batch_count;
    }
    let end_ns = if last_ack_ns > run.started_ns {
        last_ack_ns
    } else {
        run.ended_ns
    };
    let secs = (end_ns.saturating_sub(run.started_ns) as f64 / 1e9).max(1e-9);
    ProduceResult {
        target_rate: None,
        sent: run.sent,
        acked,
        failed,
        first_error,
        bytes,
        secs,
        msgs_per_s: acked as f64 / secs,
        mb_per_s: bytes as f64 / secs / 1e6,
        latency: LatencySummary::of(&hist),
        end_to_end: None,
        queue_full_waits: run.queue_full_waits,
        cpu: run.cpu,
        avg_batch_bytes: (bc > 0).then(|| bb as f64 / bc as f64),
        avg_batch_messages: (bc > 0).then(|| bm as f64 / bc as f64),
    }
}

fn start_tail(bootstrap: &str, params: &WorkloadParams, shared: &Arc<Shared>) -> Result<Tail> {
    let stop = Arc::new(AtomicBool::new(false));
    let received: Arc<[AtomicU64; PHASES]> = Arc::new(Default::default());
    let mut handles = Vec::new();
    for (i, parts) in split_partitions(params.partitions, params.consumers)
        .into_iter()
        .enumerate()
    {
        if parts.is_empty() {
            continue;
        }
        let consumer: BaseConsumer<ConsumerCtx> = params
            .consumer_config(bootstrap, &format!("tail-{i}"))
            .create_with_context(ConsumerCtx {
                shared: Arc::clone(shared),
            })
            .context("creating a tail consumer")?;
        let mut tpl = TopicPartitionList::new();
        for p in &parts {
            tpl.add_partition_offset(&params.topic, *p, Offset::Beginning)
                .context("building the assignment")?;
        }
        consumer
            .assign(&tpl)
            .context("assigning partitions to a tail consumer")?;
        let (stop, received, shared) = (Arc::clone(&stop), Arc::clone(&received), Arc::clone(shared));
        let handle = thread::Builder::new()
            .name(format!("tail-{i}"))
            .spawn(move || -> Result<[Histogram<u64>; PHASES]> {
                let mut hists = [latency::histogram(), latency::histogram(), latency::histogram()];
                while !stop.load(Ordering::Relaxed) {
                    match consumer.poll(Duration::from_millis(50)) {
                        None => {}
                        Some(Ok(msg)) => {
                            let now = shared.now_ns();
                            let Some(payload) = msg.payload() else { continue };
                            let (Some(ts), Some(&phase)) = (payload.get(..8), payload.get(8)) else {
                                continue;
                            };
                            let mut stamp = [0u8; 8];
                            stamp.copy_from_slice(ts);
                            let sent_ns = u64::from_le_bytes(stamp);
                            if let (Some(h), Some(r)) =
                                (hists.get_mut(phase as usize), received.get(phase as usize))
                            {
                                latency::record_ns(h, now.saturating_sub(sent_ns));
                                r.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        Some(Err(e)) => shared.events.push(format!("tail consumer: {e}")),
                    }
                }
                Ok(hists)
            })
            .context("spawning a tail consumer")?;
        handles.push(handle);
    }
    Ok(Tail {
        stop,
        received,
        handles,
    })
}

fn wait_for_tail(
    tail: &Tail,
    phase: u8,
    expected: u64,
    timeout: Duration,
    bars: &Bars,
    what: &str,
) -> Result<()> {
    let spinner = bars.spinner(what);
    let started = Instant::now();
    loop {
        let got = tail.received[phase as usize].load(Ordering::Relaxed);
        if got >= expected {
            spinner.finish_and_clear();
            return Ok(());
        }
        if started.elapsed() > timeout {
            bail!("{what}: tail consumers read {got} of {expected} messages within {timeout:?}");
        }
        spinner.set_message(format!("{got} of {expected}"));
        thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until the tail consumers have read every measured message (or `timeout`), stops them
/// and returns their histograms.
fn finish_tail(
    mut tail: Tail,
    measured: u64,
    timeout: Duration,
    bars: &Bars,
) -> Result<[Histogram<u64>; PHASES]> {
    let spinner = bars.spinner("tail draining");
    let started = Instant::now();
    loop {
        let got = tail.received[PHASE_PEAK as usize].load(Ordering::Relaxed)
            + tail.received[PHASE_PACED as usize].load(Ordering::Relaxed);
        if got >= measured || started.elapsed() > timeout {
            break;
        }
        spinner.set_message(format!("{got} of {measured}"));
        thread::sleep(Duration::from_millis(20));
    }
    spinner.finish_and_clear();
    tail.stop.store(true, Ordering::Relaxed);
    let mut merged = [latency::histogram(), latency::histogram(), latency::histogram()];
    for handle in std::mem::take(&mut tail.handles) {
        let hists = handle
            .join()
            .map_err(|_| anyhow!("a tail consumer thread panicked"))??;
        for (m, h) in merged.iter_mut().zip(hists.iter()) {
            let _ = m.add(h);
        }
    }
    Ok(merged)
}

/// Fresh consumers read every partition from offset 0 up to the acknowledged end offsets.
fn read_log(
    bootstrap: &str,
    params: &WorkloadParams,
    shared: &Arc<Shared>,
    bars: &Bars,
    phase: &str,
) -> Result<ConsumeResult> {
    // What the broker says each partition holds, checked against what it acknowledged.
    let marks = watermarks(bootstrap, params, shared)?;
    let offsets_from_watermarks = shared.unknown_offsets.load(Ordering::Relaxed) > 0;
    let mut high_watermark_below_acked = 0;
    let mut high_watermark_examples = Vec::new();
    let mut starts = Vec::with_capacity(marks.len());
    let mut ends = Vec::with_capacity(marks.len());
    for (partition, (acked, &(low, high))) in shared.end_offsets.iter().zip(&marks).enumerate() {
        let acked = acked.load(Ordering::Relaxed);
        if high < acked {
            high_watermark_below_acked += 1;
            if high_watermark_examples.len() < 3 {
                high_watermark_examples.push(format!(
                    "partition {partition}: high watermark {high}, acknowledged up to {acked}"
                ));
            }
        }
        starts.push(low);
        ends.push(if offsets_from_watermarks { high } else { acked });
    }
    let expected: u64 = starts.iter().zip(&ends).map(|(s, e)| (e - s).max(0) as u64).sum();
    let bar = bars.bar(phase, expected.max(1));
    let read = AtomicU64::new(0);
    let started = Instant::now();
    let cpu = CpuMark::now(shared.broker_pid);
    let threads = ThreadMark::now(shared.broker_pid);
    let mut seen = threads.clone();
    let assignments = split_partitions(params.partitions, params.consumers);
    let outcomes = thread::scope(|s| {
        let handles: Vec<_> = assignments
            .iter()
            .enumerate()
            .filter(|(_, parts)| parts.iter().any(|&p| ends[p as usize] > starts[p as usize]))
            .map(|(i, parts)| {
                let (starts, ends, read) = (&starts, &ends, &read);
                s.spawn(move || read_partitions(bootstrap, params, shared, i, parts, (starts, ends), read))
            })
            .collect();
        while !handles.iter().all(|h| h.is_finished()) {
            thread::sleep(Duration::from_millis(100));
            seen.observe(shared.broker_pid);
            let n = read.load(Ordering::Relaxed);
            bar.set_position(n);
            bar.set_message(format!(
                "{n} read, {:.0} msg/s",
                n as f64 / started.elapsed().as_secs_f64()
            ));
        }
        handles
            .into_iter()
            .map(|h| h.join().map_err(|_| anyhow!("a consumer thread panicked"))?)
            .collect::<Result<Vec<ReadOutcome>>>()
    })?;
    bar.finish_and_clear();
    let cpu = CpuUsage::since(&cpu, &threads, seen, shared.broker_pid);
    let messages: u64 = outcomes.iter().map(|o| o.messages).sum();
    let bytes: u64 = outcomes.iter().map(|o| o.bytes).sum();
    let first = outcomes.iter().filter_map(|o| o.first).min();
    let last = outcomes.iter().filter_map(|o| o.last).max();
    let (secs, wall_secs) = match (first, last) {
        (Some(f), Some(l)) => (
            l.duration_since(f).as_secs_f64(),
            l.duration_since(started).as_secs_f64(),
        ),
        _ => (0.0, started.elapsed().as_secs_f64()),
    };
    let per_s = |x: u64| if secs > 0.0 { x as f64 / secs } else { 0.0 };
    Ok(ConsumeResult {
        expected_messages: expected,
        messages,
        bytes,
        secs,
        wall_secs,
        msgs_per_s: per_s(messages),
        mb_per_s: per_s(bytes) / 1e6,
        cpu,
        offsets_from_watermarks,
        high_watermark_below_acked,
        high_watermark_examples,
    })
}

/// Log start and high watermark of every partition (ListOffsets through librdkafka).
fn watermarks(bootstrap: &str, params: &WorkloadParams, shared: &Arc<Shared>) -> Result<Vec<(i64, i64)>> {
    let consumer: BaseConsumer<ConsumerCtx> = params
        .consumer_config(bootstrap, "watermarks")
        .create_with_context(ConsumerCtx {
            shared: Arc::clone(shared),
        })
        .context("creating a consumer")?;
    (0..params.partitions)
        .map(|p| {
            consumer
                .fetch_watermarks(&params.topic, p, params.timeout())
                .with_context(|| format!("ListOffsets for {}/{p}", params.topic))
        })
        .collect()
}

struct ReadOutcome {
    messages: u64,
    bytes: u64,
    first: Option<Instant>,
    last: Option<Instant>,
}

fn read_partitions(
    bootstrap: &str,
    params: &WorkloadParams,
    shared: &Arc<Shared>,
    index: usize,
    parts: &[i32],
    (starts, ends): (&[i64], &[i64]),
    read: &AtomicU64,
) -> Result<ReadOutcome> {
    let consumer: BaseConsumer<ConsumerCtx> = params
        .consumer_config(bootstrap, &format!("reader-{index}"))
        .create_with_context(ConsumerCtx {
            shared: Arc::clone(shared),
        })
        .context("creating a consumer")?;
    let mut tpl = TopicPartitionList::new();
    let mut remaining = 0usize;
    let mut done = vec![true; ends.len()];
    for &p in parts {
        if ends[p as usize] > starts[p as usize] {
            tpl.add_partition_offset(&params.topic, p, Offset::Beginning)
                .context("building the assignment")?;
            done[p as usize] = false;
            remaining += 1;
        }
    }
    consumer
        .assign(&tpl)
        .context("assigning partitions to a consumer")?;
    let mut out = ReadOutcome {
        messages: 0,
        bytes: 0,
        first: None,
        last: None,
    };
    // The clock is read for the first record, when a partition is read to its end (the last
    // one's is the last record's time) and when a poll returns no record: reading it per
    // record was a sizeable share of this thread's time at a million records a second
    // (BENCHMARKS.md#two-reads). A stall is a run of polls without a record for `timeout_secs`
    // after the last one.
    let mut last_progress = Instant::now();
    let mut progressed = false;
    while remaining > 0 {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(msg)) => {
                progressed = true;
                out.messages += 1;
                out.bytes += msg.payload_len() as u64;
                read.fetch_add(1, Ordering::Relaxed);
                let mut finished = false;
                if let Some(p) = usize::try_from(msg.partition()).ok().filter(|&p| p < ends.len()) {
                    if !done[p] && msg.offset() + 1 >= ends[p] {
                        done[p] = true;
                        remaining -= 1;
                        finished = true;
                    }
                }
                if finished || out.first.is_none() {
                    let now = Instant::now();
                    out.first.get_or_insert(now);
                    if finished {
                        out.last = Some(now);
                    }
                }
                continue;
            }
            Some(Err(e)) => shared.events.push(format!("consumer: {e}")),
            None => {}
        }
        let now = Instant::now();
        if std::mem::take(&mut progressed) {
            last_progress = now;
        }
        if now.duration_since(last_progress).as_secs_f64() > params.timeout_secs {
            bail!(
                "consumer {index} stalled: no record for {:.0} s, {remaining} partitions not read to the end",
                params.timeout_secs
            );
        }
    }
    Ok(out)
}

/// Splits partitions 0..n round-robin over `consumers` (some lists are empty if consumers > n).
pub fn split_partitions(partitions: i32, consumers: usize) -> Vec<Vec<i32>> {
    let mut out = vec![Vec::new(); consumers.max(1)];
    let len = out.len();
    for p in 0..partitions {
        out[p as usize % len].push(p);
    }
    out
}

/// The small workload the unit tests of this crate describe their runs with.
#[cfg(test)]
pub(crate) fn test_params() -> WorkloadParams {
    WorkloadParams {
        topic: "t".into(),
        message_bytes: 1024,
        amount: Amount::DurationSecs(1.0),
        warmup_secs: 1.0,
        partitions: 1,
        replication_factor: 1,
        producers: 1,
        consumers: 1,
        acks: "all".into(),
        compression: "none".into(),
        linger_ms: None,
        batch_size: None,
        rate: None,
        paced_fraction: 0.5,
        paced_rate: None,
        paced_secs: 1.0,
        end_to_end: true,
        client_stats: false,
        producer_props: vec![("enable.idempotence".into(), "false".into())],
        consumer_props: vec![],
        timeout_secs: 30.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_do_not_repeat_within_a_batch() {
        let pool = payload_pool(1024);
        assert_eq!(pool.len() % 1024, 0);
        assert!(pool.len() >= 16 << 20);
        // Distinct consecutive slots: a 1 MB batch of 1 KiB messages has no repeated payload.
        let slots: std::collections::HashSet<&[u8]> = pool.chunks(1024).take(1024).collect();
        assert_eq!(slots.len(), 1024);
        assert_eq!(payload_pool(4 << 20).len(), 64 << 20);
    }

    #[test]
    fn partitions_split_round_robin() {
        assert_eq!(split_partitions(5, 2), vec![vec![0, 2, 4], vec![1, 3]]);
        assert_eq!(split_partitions(1, 3), vec![vec![0], vec![], vec![]]);
        assert_eq!(split_partitions(1000, 1)[0].len(), 1000);
    }

    fn params() -> WorkloadParams {
        test_params()
    }

    #[test]
    fn validation() {
        assert!(params().validate().is_ok());
        assert!(WorkloadParams {
            message_bytes: 8,
            ..params()
        }
        .validate()
        .is_err());
        assert!(WorkloadParams {
            amount: Amount::Messages(0),
            ..params()
        }
        .validate()
        .is_err());
        assert!(WorkloadParams {
            paced_fraction: 1.5,
            ..params()
        }
        .validate()
        .is_err());
        // A replication factor is at least 1, or -1 for the broker's default.
        for (rf, ok) in [(0, false), (-2, false), (-1, true), (3, true)] {
            let p = WorkloadParams {
                replication_factor: rf,
                ..params()
            };
            assert_eq!(p.validate().is_ok(), ok, "replication factor {rf}");
        }
        assert!(WorkloadParams {
            consumers: 0,
            ..params()
        }
        .validate()
        .is_err());
        assert!(WorkloadParams {
            consumers: 0,
            end_to_end: false,
            ..params()
        }
        .validate()
        .is_ok());
    }

    #[test]
    fn the_same_client_settings_for_every_broker() {
        let p = WorkloadParams {
            linger_ms: Some(2),
            batch_size: Some(65536),
            ..params()
        };
        let c = p.producer_config("a:1");
        assert_eq!(c.get("acks"), Some("all"));
        assert_eq!(c.get("linger.ms"), Some("2"));
        assert_eq!(c.get("batch.size"), Some("65536"));
        assert_eq!(c.get("enable.idempotence"), Some("false"));
        let pc = p.producer_config("b:2");
        assert_eq!(pc.get("bootstrap.servers"), Some("b:2"));
        let cc = p.consumer_config("a:1", "reader-0");
        assert_eq!(cc.get("enable.auto.commit"), Some("false"));
    }
}
