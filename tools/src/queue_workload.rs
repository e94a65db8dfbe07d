//! The HTTP queue workload of `strand-queue-bench` (docs/http-api.md), over blocking keep-alive
//! connections ([`crate::queue_client`]), one per client thread:
//!
//! 1. **publish**: `publishers` threads post batches of `publish_batch` messages until `messages`
//!    were published (each answer is durable);
//! 2. **drain**: `workers` threads loop "lease up to `lease_batch` → ack all of them in one
//!    `POST /v1/messages/ack`" until every published message is acknowledged, with no processing
//!    in between: the time from a lease answer to its ack answer is the broker's ack cost;
//! 3. **steady**: publishers paced at a fraction of the drain rate while the workers lease and
//!    ack, for end-to-end latency (publish → lease, both on the broker's clock).
//!
//! Every answer is checked (counts, ids, states); an unexpected HTTP answer aborts the run.

use std::borrow::Cow;
use std::collections::HashSet;
use std::hash::Hash;
use std::io::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::host::CpuMark;
use crate::latency::{self, LatencySummary};
use crate::queue_client::{encode_segment, CallError, QueueClient, Response};
use crate::raw::pseudo_random_bytes;

/// Most messages in one publish, lease or batch ack (docs/http-api.md).
pub const MAX_BATCH: usize = 1000;
/// Bytes of the payload pool messages are cut from.
pub(crate) const PAYLOAD_POOL_BYTES: usize = 8 << 20;
/// Base62 alphabet of the payloads: valid UTF-8 that JSON carries unescaped.
pub(crate) const ALPHABET: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// The workload, as recorded in the report.
#[derive(Debug, Clone, Serialize)]
pub struct QueueParams {
    /// What the publish phase publishes, all drained in the drain phase.
    #[serde(flatten)]
    pub backlog: Backlog,
    pub workers: usize,
    /// `max_messages` of each lease request.
    pub lease_batch: u32,
    /// `wait_ms` of each lease request (long poll while nothing is available).
    pub lease_wait_ms: u64,
    /// `visibility_timeout_ms` of each lease request (also how the lease time is derived from
    /// `lease_expires_at_ms`).
    pub visibility_timeout_ms: u64,
    /// Length of the steady phase; 0 skips it.
    pub steady_secs: f64,
    /// Publish rate of the steady phase, as a fraction of the drain phase's rate.
    pub steady_fraction: f64,
    /// Messages per publish request in the steady phase.
    pub steady_publish_batch: usize,
}

impl QueueParams {
    pub fn validate(&self) -> Result<()> {
        self.backlog.validate()?;
        if self.workers == 0 {
            bail!("--workers must be at least 1");
        }
        for (name, v) in [
            ("--lease-batch", self.lease_batch as usize),
            ("--steady-publish-batch", self.steady_publish_batch),
        ] {
            if !(1..=MAX_BATCH).contains(&v) {
                bail!("{name} must be 1..={MAX_BATCH}");
            }
        }
        if self.lease_wait_ms > 20_000 {
            bail!("--lease-wait-ms must be 0..=20000");
        }
        if !(1_000..=43_200_000).contains(&self.visibility_timeout_ms) {
            bail!("--visibility-timeout-ms must be 1000..=43200000");
        }
        if !(self.steady_secs >= 0.0 && self.steady_secs.is_finite()) {
            bail!("--steady-secs must be a non-negative number");
        }
        if self.steady_secs > 0.0 && !(self.steady_fraction > 0.0 && self.steady_fraction.is_finite()) {
            bail!("--steady-fraction must be positive");
        }
        Ok(())
    }
}

/// What a publish phase puts on a queue over HTTP: the HTTP door drains it with leases, the share
/// door with share consumers.
#[derive(Debug, Clone, Serialize)]
pub struct Backlog {
    pub queue: String,
    pub partitions: u32,
    pub messages: u64,
    /// Payload bytes per message (random base62 text, different for every message).
    pub message_bytes: usize,
    pub publishers: usize,
    /// Messages per publish request.
    pub publish_batch: usize,
    /// Longest time without progress before the run fails.
    pub timeout_secs: f64,
}

impl Backlog {
    /// The checks every door's parameters share.
    pub(crate) fn validate(&self) -> Result<()> {
        if self.partitions == 0 {
            bail!("--partitions must be at least 1");
        }
        if self.messages == 0 {
            bail!("--messages must be at least 1");
        }
        if self.message_bytes == 0 || self.message_bytes > PAYLOAD_POOL_BYTES / 2 {
            bail!("--message-bytes must be 1..={}", PAYLOAD_POOL_BYTES / 2);
        }
        if self.publishers == 0 {
            bail!("--publishers must be at least 1");
        }
        if !(1..=MAX_BATCH).contains(&self.publish_batch) {
            bail!("--publish-batch must be 1..={MAX_BATCH}");
        }
        if !(self.timeout_secs > 0.0 && self.timeout_secs.is_finite()) {
            bail!("--timeout-secs must be positive");
        }
        Ok(())
    }

    pub(crate) fn timeout(&self) -> Duration {
        Duration::from_secs_f64(self.timeout_secs)
    }

    /// Creates the queue with its partitions (it must not exist yet); returns the answer.
    pub(crate) fn create_queue(&self, http: &str) -> Result<Value> {
        let (status, created) = QueueClient::new(http)
            .put_queue(&self.queue, &json!({ "partitions": self.partitions }))
            .map_err(|e| anyhow!("PUT /v1/queues/{}: {e}", self.queue))?;
        if status != 201 {
            bail!(
                "PUT /v1/queues/{} answered {status}, not 201: the queue existed already ({created})",
                self.queue
            );
        }
        Ok(created)
    }
}

/// CPU used during a phase: cores (CPU seconds per wall second) and CPU time per message.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct PhaseCpu {
    /// Wall time the figures cover (phase start to its last answer).
    pub wall_secs: f64,
    /// This process (all client threads).
    pub client_cores: Option<f64>,
    /// The broker process, when its pid is known.
    pub broker_cores: Option<f64>,
    /// broker ÷ (broker + client): the broker's share of the CPU the run used.
    pub broker_share: Option<f64>,
    /// Client CPU microseconds per message of the phase.
    pub client_us_per_message: Option<f64>,
    /// Broker CPU microseconds per message of the phase (HTTP, JSON, queue engine, log, fsync
    /// submission: everything the broker process did).
    pub broker_us_per_message: Option<f64>,
}

impl PhaseCpu {
    /// CPU from `start` to `end` (to now if `None`), for `messages` messages.
    pub(crate) fn between(
        start: &CpuMark,
        end: Option<CpuMark>,
        broker_pid: Option<u32>,
        messages: u64,
    ) -> Self {
        let end = end.unwrap_or_else(|| CpuMark::now(broker_pid));
        let (wall, client, broker) = start.until(&end);
        let cores = |x: Option<f64>| x.filter(|_| wall > 0.0).map(|x| x / wall);
        let per_msg = |x: Option<f64>| x.filter(|_| messages > 0).map(|x| x * 1e6 / messages as f64);
        let broker_share = match (client, broker) {
            (Some(c), Some(b)) if c + b > 0.0 => Some(b / (b + c)),
            _ => None,
        };
        PhaseCpu {
            wall_secs: wall,
            client_cores: cores(client),
            broker_cores: cores(broker),
            broker_share,
            client_us_per_message: per_msg(client),
            broker_us_per_message: per_msg(broker),
        }
    }
}

/// The publish phase.
#[derive(Debug, Clone, Serialize)]
pub struct PublishResult {
    pub messages: u64,
    pub requests: u64,
    /// From the phase start to the last answer.
    pub secs: f64,
    pub msgs_per_s: f64,
    /// Payload MB (10^6 bytes) per second.
    pub mb_per_s: f64,
    /// Request bytes sent per message (JSON framing included).
    pub request_bytes_per_message: f64,
    /// One publish request, send to durable answer.
    pub request_latency: LatencySummary,
    /// Messages per partition, as the broker placed them.
    pub per_partition: Vec<u64>,
    pub cpu: PhaseCpu,
}

/// What the workers measured (drain or steady phase).
#[derive(Debug, Clone, Serialize)]
pub struct WorkerFigures {
    pub lease_requests: u64,
    /// Leases that answered no message (long polls that timed out); not in `lease_latency`.
    pub empty_leases: u64,
    pub ack_requests: u64,
    pub messages_acked: u64,
    /// Messages per non-empty lease.
    pub mean_lease_batch: f64,
    /// Non-empty lease requests, send to answer.
    pub lease_latency: LatencySummary,
    /// Batch-ack requests, send to answer (durable).
    pub ack_latency: LatencySummary,
    /// From a lease answer to its ack answer, per lease batch (nothing done in between but
    /// decoding the lease answer and encoding the ack).
    pub lease_to_ack: LatencySummary,
    /// Mean lease-to-ack time divided by the mean batch: broker time per acknowledged message.
    pub lease_to_ack_us_per_message: f64,
    /// Share of the workers' wall time spent waiting for lease answers (non-empty and empty).
    pub worker_time_in_lease: f64,
    /// Share of the workers' wall time spent waiting for ack answers.
    pub worker_time_in_ack: f64,
    /// Lease answer body bytes per leased message (JSON: payload as text and as base64).
    pub lease_answer_bytes_per_message: f64,
    /// Deliveries with `attempt` > 1 (a lease expired: should be 0).
    pub redeliveries: u64,
}

/// The drain phase.
#[derive(Debug, Clone, Serialize)]
pub struct DrainResult {
    /// From the phase start to the last ack answer.
    pub secs: f64,
    /// Messages leased and acknowledged per second.
    pub msgs_per_s: f64,
    /// Payload MB leased and acknowledged per second.
    pub mb_per_s: f64,
    pub workers: WorkerFigures,
    /// Every published message acknowledged exactly once, nothing else.
    pub verified: bool,
    /// The queue's group stats after the drain (`GET /v1/queues/{queue}`).
    pub group_after: Option<Value>,
    pub cpu: PhaseCpu,
}

/// The steady phase.
#[derive(Debug, Clone, Serialize)]
pub struct SteadyResult {
    /// The pace asked: `steady_fraction` × the drain rate.
    pub target_msgs_per_s: f64,
    /// Publishing time.
    pub secs: f64,
    pub published: u64,
    pub publish_msgs_per_s: f64,
    /// Acknowledged within the publishing window.
    pub acked_in_window: u64,
    pub acked_msgs_per_s: f64,
    /// Time after the window until every message of the phase was acknowledged.
    pub tail_secs: f64,
    /// Publish batches sent more than one interval behind their schedule (a publisher has one
    /// request in flight: a slow answer delays the following batches).
    pub late_batches: u64,
    /// The most a publish batch was sent behind its schedule.
    pub max_schedule_lag_ms: f64,
    pub publish_latency: LatencySummary,
    /// Publish → lease: `lease_expires_at_ms − visibility_timeout_ms − published_at_ms`, broker
    /// clock, millisecond resolution.
    pub end_to_end: LatencySummary,
    pub workers: WorkerFigures,
    pub verified: bool,
    pub cpu: PhaseCpu,
}

/// Everything the workload measured.
#[derive(Debug, Clone, Serialize)]
pub struct QueueResult {
    pub create_secs: f64,
    pub publish: PublishResult,
    pub drain: DrainResult,
    pub steady: Option<SteadyResult>,
    /// Failed checks: the figures of a run with problems are not valid.
    pub problems: Vec<String>,
}

/// Called between phases (memory checkpoints).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checkpoint {
    Created,
    Published,
    Drained,
    Steady,
}

/// Progress bars on stderr.
pub struct Bars {
    pub show: bool,
}

impl Bars {
    fn bar(&self, phase: &str, len: u64) -> ProgressBar {
        progress_bar(self.show, phase, len)
    }
}

/// A progress bar of `len` steps on stderr, named `phase` (hidden unless `show`).
pub(crate) fn progress_bar(show: bool, phase: &str, len: u64) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len);
    let style = ProgressStyle::with_template("{prefix:>13} [{bar:30}] {pos}/{len} {msg} ({elapsed})")
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
    bar.set_style(style);
    bar.set_prefix(phase.to_string());
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}

/// Logs a phase start on stderr (also when progress bars are off: a profiler attaches on it).
pub(crate) fn announce(text: &str) {
    let mut e = std::io::stderr().lock();
    let _ = writeln!(e, "strand-queue-bench: {text}");
}

/// Runs the three phases against the queue API at `http` (the queue must not exist yet).
pub fn run(
    http: &str,
    broker_pid: Option<u32>,
    params: &QueueParams,
    bars: &Bars,
    checkpoint: &mut dyn FnMut(Checkpoint),
) -> Result<QueueResult> {
    params.validate()?;
    let pool = Arc::new(payload_pool());
    let mut problems = Vec::new();

    let started = Instant::now();
    let backlog = &params.backlog;
    backlog.create_queue(http)?;
    let create_secs = started.elapsed().as_secs_f64();
    checkpoint(Checkpoint::Created);

    announce(&format!(
        "publish phase: {} messages of {} B (broker pid {})",
        params.backlog.messages,
        params.backlog.message_bytes,
        broker_pid.map_or("unknown".into(), |p| p.to_string())
    ));
    let bar = bars.bar("publish", params.backlog.messages);
    let (publish, published_ids) =
        publish_phase(http, broker_pid, backlog, &pool, &bar, "publisher", |m| m.id)?;
    checkpoint(Checkpoint::Published);

    announce("drain phase: lease + batch ack until every message is acknowledged");
    let shared = Shared::new(params.backlog.messages, true, broker_pid);
    let mark = CpuMark::now(broker_pid);
    let bar = bars.bar("drain", params.backlog.messages);
    let phase_start = Instant::now();
    let out = run_workers(http, params, &shared, &bar, phase_start)?.into_result();
    let cpu = PhaseCpu::between(
        &mark,
        shared.clock.end.get().copied(),
        broker_pid,
        out.figures.messages_acked,
    );
    bar.finish_and_clear();
    let secs = out
        .last_ack
        .map_or(0.0, |t| t.duration_since(phase_start).as_secs_f64());
    let acked = out.figures.messages_acked;
    let verified = match verify(&published_ids, &out.ids, "drain") {
        Ok(()) => true,
        Err(e) => {
            problems.push(e);
            false
        }
    };
    let group_after = match QueueClient::new(http).get_queue(&params.backlog.queue) {
        Ok(v) => {
            let g = v.pointer("/groups/default").cloned();
            if let Some(g) = &g {
                for field in ["available", "leased", "delayed", "dead_lettered"] {
                    let n = g.get(field).and_then(Value::as_u64).unwrap_or(0);
                    if n != 0 {
                        problems.push(format!("after the drain the queue reports {field} = {n}, not 0"));
                    }
                }
            }
            g
        }
        Err(e) => {
            problems.push(format!(
                "GET /v1/queues/{} after the drain: {e}",
                params.backlog.queue
            ));
            None
        }
    };
    let drain = DrainResult {
        secs,
        msgs_per_s: per_s(acked, secs),
        mb_per_s: per_s(acked * params.backlog.message_bytes as u64, secs) / 1e6,
        workers: out.figures,
        verified,
        group_after,
        cpu,
    };
    checkpoint(Checkpoint::Drained);

    let steady = if params.steady_secs > 0.0 && drain.msgs_per_s > 0.0 {
        let target = params.steady_fraction * drain.msgs_per_s;
        announce(&format!(
            "steady phase: {target:.0} msgs/s for {} s",
            params.steady_secs
        ));
        let s = steady_phase(http, broker_pid, params, &pool, bars, target)?;
        if !s.verified {
            problems.push("steady phase: acknowledged messages do not match the published ones".into());
        }
        checkpoint(Checkpoint::Steady);
        Some(s)
    } else {
        None
    };

    for (phase, f) in
        std::iter::once(("drain", &drain.workers)).chain(steady.iter().map(|s| ("steady", &s.workers)))
    {
        if f.redeliveries > 0 {
            problems.push(format!(
                "{phase}: {} deliveries with attempt > 1 (a lease expired or a message came back)",
                f.redeliveries
            ));
        }
    }
    Ok(QueueResult {
        create_secs,
        publish,
        drain,
        steady,
        problems,
    })
}

pub(crate) fn per_s(n: u64, secs: f64) -> f64 {
    div_or_zero(n as f64, secs)
}

/// `a / b`, or 0 when `b` is not positive (nothing measured).
pub(crate) fn div_or_zero(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

/// Checks that `acked` holds every id of `published` exactly once and nothing else.
fn verify(published: &[String], acked: &[String], phase: &str) -> Result<(), String> {
    exactly_once(published, acked, "ids", "acknowledged").map_err(|e| format!("{phase}: {e}"))
}

/// Checks that `settled` holds every item of `published` exactly once and nothing else; the
/// message names the items (`ids`) and what was done to them (`acknowledged`).
pub(crate) fn exactly_once<T: Eq + Hash>(
    published: &[T],
    settled: &[T],
    items: &str,
    done: &str,
) -> Result<(), String> {
    let published_set: HashSet<&T> = published.iter().collect();
    if published_set.len() != published.len() {
        return Err(format!(
            "the broker answered {} distinct {items} for {} published messages",
            published_set.len(),
            published.len()
        ));
    }
    let mut seen: HashSet<&T> = HashSet::with_capacity(settled.len());
    let (mut unknown, mut twice) = (0u64, 0u64);
    for x in settled {
        if !published_set.contains(x) {
            unknown += 1;
        } else if !seen.insert(x) {
            twice += 1;
        }
    }
    let missing = published.len() - seen.len();
    if unknown + twice + missing as u64 > 0 {
        return Err(format!(
            "{} published, {} {done}: {missing} never {done}, {twice} {done} twice, {unknown} {done} but \
             not published here",
            published.len(),
            settled.len()
        ));
    }
    Ok(())
}

// ------------------------------------------------------------------------------------------
// Payloads and request bodies

/// Random base62 text; messages are cut from it at pseudo-random offsets, so no two messages of
/// a run are alike and a compressing filesystem gains little.
pub(crate) fn payload_pool() -> Vec<u8> {
    pseudo_random_bytes(PAYLOAD_POOL_BYTES, 0x9_0e0e)
        .into_iter()
        .map(|b| ALPHABET[usize::from(b) % ALPHABET.len()])
        .collect()
}

/// The payload of message `index`.
pub(crate) fn payload(pool: &[u8], index: u64, len: usize) -> &[u8] {
    let room = (pool.len() - len + 1) as u64;
    let mut x = index.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    x ^= x >> 29;
    let start = (x % room) as usize;
    &pool[start..start + len]
}

/// `{"messages":[{"payload":"…"},…]}` for messages `first..first + n` (the payloads are base62:
/// nothing to escape).
pub(crate) fn publish_body(buf: &mut Vec<u8>, pool: &[u8], first: u64, n: usize, len: usize) {
    buf.clear();
    buf.extend_from_slice(b"{\"messages\":[");
    for i in 0..n as u64 {
        if i > 0 {
            buf.push(b',');
        }
        buf.extend_from_slice(b"{\"payload\":\"");
        buf.extend_from_slice(payload(pool, first + i, len));
        buf.extend_from_slice(b"\"}");
    }
    buf.extend_from_slice(b"]}");
}

#[derive(Deserialize)]
struct PublishAnswer {
    messages: Vec<PublishedEntry>,
}

/// One message of a publish answer.
#[derive(Deserialize)]
pub(crate) struct PublishedEntry {
    pub(crate) id: String,
    pub(crate) partition: i32,
    pub(crate) offset: i64,
    #[serde(default)]
    duplicate: bool,
}

#[derive(Deserialize)]
struct LeaseAnswer<'a> {
    #[serde(borrow)]
    messages: Vec<LeaseEntry<'a>>,
}

#[derive(Deserialize)]
struct LeaseEntry<'a> {
    id: String,
    generation: u64,
    attempt: u32,
    lease_expires_at_ms: i64,
    published_at_ms: i64,
    /// Empty when absent (a payload that is not UTF-8: never here). Borrowed from the answer
    /// unless it has escapes.
    #[serde(borrow, default)]
    payload: Cow<'a, str>,
}

/// Posts `body` to `path`; any answer but 2xx is an error naming the call.
fn post(client: &mut QueueClient, path: &str, body: &[u8], what: &str) -> Result<Response> {
    let r = client
        .conn
        .request("POST", path, Some(body))
        .map_err(|e| anyhow!("{what}: {}", CallError::Io(e)))?;
    if !(200..300).contains(&r.status) {
        bail!("{what}: unexpected answer {}: {}", r.status, r.text());
    }
    Ok(r)
}

// ------------------------------------------------------------------------------------------
// Publish phase

/// What a publisher thread measured; `T` is what it keeps of each published message (what the
/// drain is verified against).
struct PublisherOut<T> {
    hist: Histogram<u64>,
    requests: u64,
    request_bytes: u64,
    kept: Vec<T>,
    keep: fn(PublishedEntry) -> T,
    /// One count per partition of the queue.
    per_partition: Vec<u64>,
    last_answer: Option<Instant>,
    late_batches: u64,
    max_lag: Duration,
}

impl<T> PublisherOut<T> {
    fn new(keep: fn(PublishedEntry) -> T, partitions: u32) -> Self {
        Self {
            hist: latency::histogram(),
            requests: 0,
            request_bytes: 0,
            kept: Vec::new(),
            keep,
            per_partition: vec![0; partitions as usize],
            last_answer: None,
            late_batches: 0,
            max_lag: Duration::ZERO,
        }
    }

    fn merge(&mut self, o: PublisherOut<T>) -> Result<()> {
        self.hist.add(&o.hist).context("merging publish histograms")?;
        self.requests += o.requests;
        self.request_bytes += o.request_bytes;
        self.kept.extend(o.kept);
        for (a, b) in self.per_partition.iter_mut().zip(o.per_partition) {
            *a += b;
        }
        self.last_answer = self.last_answer.max(o.last_answer);
        self.late_batches += o.late_batches;
        self.max_lag = self.max_lag.max(o.max_lag);
        Ok(())
    }
}

/// Publishes `n` messages from index `first` (of `len` bytes) in one request, records its
/// latency in `hist`, and checks the answer: `n` entries, none a duplicate (no dedup tokens are
/// sent). Returns the entries and when the answer came.
pub(crate) fn publish_request(
    client: &mut QueueClient,
    path: &str,
    buf: &mut Vec<u8>,
    pool: &[u8],
    (first, n, len): (u64, usize, usize),
    hist: &mut Histogram<u64>,
) -> Result<(Vec<PublishedEntry>, Instant)> {
    publish_body(buf, pool, first, n, len);
    let t = Instant::now();
    let r = post(client, path, buf, "publish")?;
    let done = Instant::now();
    latency::record_ns(hist, done.duration_since(t).as_nanos() as u64);
    let answer: PublishAnswer = serde_json::from_slice(&r.body)
        .map_err(|e| anyhow!("publish answer is not what the contract says ({e}): {}", r.text()))?;
    if answer.messages.len() != n {
        bail!(
            "a publish of {n} messages answered {} entries",
            answer.messages.len()
        );
    }
    if let Some(m) = answer.messages.iter().find(|m| m.duplicate) {
        bail!(
            "publish answered `duplicate: true` for {} without a dedup token",
            m.id
        );
    }
    Ok((answer.messages, done))
}

/// Publishes `n` messages from index `first` in one request and records it.
fn publish_one<T>(
    client: &mut QueueClient,
    path: &str,
    buf: &mut Vec<u8>,
    pool: &[u8],
    (first, n, len): (u64, usize, usize),
    out: &mut PublisherOut<T>,
) -> Result<()> {
    let (entries, done) = publish_request(client, path, buf, pool, (first, n, len), &mut out.hist)?;
    let partitions = out.per_partition.len();
    for m in entries {
        match usize::try_from(m.partition)
            .ok()
            .and_then(|p| out.per_partition.get_mut(p))
        {
            Some(n) => *n += 1,
            None => bail!(
                "publish answered partition {} of a {partitions}-partition queue",
                m.partition
            ),
        }
        out.kept.push((out.keep)(m));
    }
    out.requests += 1;
    out.request_bytes += buf.len() as u64;
    out.last_answer = Some(done);
    Ok(())
}

/// Publishes `backlog`: its publishers (threads `{name}-{i}`) post batches until every message
/// was published, each answer checked; `keep` turns each answered entry into what the caller
/// verifies the drain against.
pub(crate) fn publish_phase<T: Send + 'static>(
    http: &str,
    broker_pid: Option<u32>,
    backlog: &Backlog,
    pool: &Arc<Vec<u8>>,
    bar: &ProgressBar,
    name: &str,
    keep: fn(PublishedEntry) -> T,
) -> Result<(PublishResult, Vec<T>)> {
    let next = Arc::new(AtomicU64::new(0));
    let abort = Arc::new(AtomicBool::new(false));
    let path = format!("/v1/queues/{}/messages", encode_segment(&backlog.queue));
    let mark = CpuMark::now(broker_pid);
    let start = Instant::now();
    let handles: Vec<_> = (0..backlog.publishers)
        .map(|i| {
            let (next, abort, bar, pool, path) = (
                Arc::clone(&next),
                Arc::clone(&abort),
                bar.clone(),
                Arc::clone(pool),
                path.clone(),
            );
            let (http, total, batch, len, partitions) = (
                http.to_string(),
                backlog.messages,
                backlog.publish_batch as u64,
                backlog.message_bytes,
                backlog.partitions,
            );
            thread::Builder::new()
                .name(format!("{name}-{i}"))
                .spawn(move || -> Result<PublisherOut<T>> {
                    let mut client = QueueClient::new(&http);
                    let mut out = PublisherOut::new(keep, partitions);
                    let mut buf = Vec::new();
                    while !abort.load(Ordering::Relaxed) {
                        let first = next.fetch_add(batch, Ordering::Relaxed);
                        if first >= total {
                            break;
                        }
                        let n = batch.min(total - first) as usize;
                        if let Err(e) =
                            publish_one(&mut client, &path, &mut buf, &pool, (first, n, len), &mut out)
                        {
                            abort.store(true, Ordering::Relaxed);
                            return Err(e);
                        }
                        bar.inc(n as u64);
                    }
                    Ok(out)
                })
                .context("spawning a publisher thread")
        })
        .collect::<Result<_>>()?;
    let out = join_all(
        handles,
        PublisherOut::new(keep, backlog.partitions),
        PublisherOut::merge,
    )?;
    let messages = out.kept.len() as u64;
    let cpu = PhaseCpu::between(&mark, None, broker_pid, messages);
    bar.finish_and_clear();
    let secs = out
        .last_answer
        .map_or(0.0, |t| t.duration_since(start).as_secs_f64());
    if messages != backlog.messages {
        bail!("published {messages} messages, expected {}", backlog.messages);
    }
    let result = PublishResult {
        messages,
        requests: out.requests,
        secs,
        msgs_per_s: per_s(messages, secs),
        mb_per_s: per_s(messages * backlog.message_bytes as u64, secs) / 1e6,
        request_bytes_per_message: out.request_bytes as f64 / messages.max(1) as f64,
        request_latency: LatencySummary::of(&out.hist),
        per_partition: out.per_partition,
        cpu,
    };
    Ok((result, out.kept))
}

/// Joins threads, merging their outputs; the first error (a panicked thread is one) wins.
fn join_all<T>(
    handles: Vec<thread::JoinHandle<Result<T>>>,
    init: T,
    merge: impl Fn(&mut T, T) -> Result<()>,
) -> Result<T> {
    let mut acc = init;
    let mut first_error = None;
    for h in handles {
        match h.join() {
            Ok(Ok(o)) => merge(&mut acc, o)?,
            Ok(Err(e)) => {
                first_error.get_or_insert(e);
            }
            Err(_) => {
                first_error.get_or_insert(anyhow!("a client thread panicked"));
            }
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(acc),
    }
}

// ------------------------------------------------------------------------------------------
// Workers (drain and steady phases)

/// State the workers share with the publishers and each other.
struct Shared {
    /// Messages published (so far, in the steady phase).
    published: AtomicU64,
    /// No more messages will be published.
    publishing_done: AtomicBool,
    acked: AtomicU64,
    abort: AtomicBool,
    /// The last ack answer of any worker; the CPU counters when the last message was
    /// acknowledged.
    clock: PhaseClock,
}

impl Shared {
    fn new(published: u64, done: bool, broker_pid: Option<u32>) -> Arc<Self> {
        Arc::new(Self {
            published: AtomicU64::new(published),
            publishing_done: AtomicBool::new(done),
            acked: AtomicU64::new(0),
            abort: AtomicBool::new(false),
            clock: PhaseClock::new(broker_pid),
        })
    }

    fn finished(&self) -> bool {
        self.publishing_done.load(Ordering::Acquire)
            && self.acked.load(Ordering::Acquire) >= self.published.load(Ordering::Acquire)
    }
}

/// What the client threads of a phase share about its time: when any of them last made progress
/// (for the no-progress timeout), and the CPU counters when the phase's last message was settled.
pub(crate) struct PhaseClock {
    epoch: Instant,
    /// Nanoseconds since `epoch` of the last progress.
    last_progress_ns: AtomicU64,
    pub(crate) broker_pid: Option<u32>,
    /// Set by the thread that settled the last message.
    pub(crate) end: OnceLock<CpuMark>,
}

impl PhaseClock {
    pub(crate) fn new(broker_pid: Option<u32>) -> Self {
        Self {
            epoch: Instant::now(),
            last_progress_ns: AtomicU64::new(0),
            broker_pid,
            end: OnceLock::new(),
        }
    }

    /// Progress was made at `now`.
    pub(crate) fn progress(&self, now: Instant) {
        let ns = now.duration_since(self.epoch).as_nanos() as u64;
        self.last_progress_ns.fetch_max(ns, Ordering::Relaxed);
    }

    pub(crate) fn since_progress(&self) -> Duration {
        let last = Duration::from_nanos(self.last_progress_ns.load(Ordering::Relaxed));
        self.epoch.elapsed().saturating_sub(last)
    }

    /// Takes the end mark if the phase is `finished` and nobody took it yet.
    pub(crate) fn end_if(&self, finished: bool) {
        if finished && self.end.get().is_none() {
            let _ = self.end.set(CpuMark::now(self.broker_pid));
        }
    }
}

/// What the workers measured, merged.
struct WorkersOut {
    lease_hist: Histogram<u64>,
    ack_hist: Histogram<u64>,
    lease_to_ack_hist: Histogram<u64>,
    e2e_hist: Histogram<u64>,
    lease_requests: u64,
    empty_leases: u64,
    ack_requests: u64,
    leased_messages: u64,
    lease_answer_bytes: u64,
    redeliveries: u64,
    lease_wait: Duration,
    ack_wait: Duration,
    wall: Duration,
    ids: Vec<String>,
    last_ack: Option<Instant>,
}

impl WorkersOut {
    fn new() -> Self {
        Self {
            lease_hist: latency::histogram(),
            ack_hist: latency::histogram(),
            lease_to_ack_hist: latency::histogram(),
            e2e_hist: latency::histogram(),
            lease_requests: 0,
            empty_leases: 0,
            ack_requests: 0,
            leased_messages: 0,
            lease_answer_bytes: 0,
            redeliveries: 0,
            lease_wait: Duration::ZERO,
            ack_wait: Duration::ZERO,
            wall: Duration::ZERO,
            ids: Vec::new(),
            last_ack: None,
        }
    }

    fn merge(&mut self, o: WorkersOut) -> Result<()> {
        for (a, b) in [
            (&mut self.lease_hist, &o.lease_hist),
            (&mut self.ack_hist, &o.ack_hist),
            (&mut self.lease_to_ack_hist, &o.lease_to_ack_hist),
            (&mut self.e2e_hist, &o.e2e_hist),
        ] {
            a.add(b).context("merging worker histograms")?;
        }
        self.lease_requests += o.lease_requests;
        self.empty_leases += o.empty_leases;
        self.ack_requests += o.ack_requests;
        self.leased_messages += o.leased_messages;
        self.lease_answer_bytes += o.lease_answer_bytes;
        self.redeliveries += o.redeliveries;
        self.lease_wait += o.lease_wait;
        self.ack_wait += o.ack_wait;
        self.wall += o.wall;
        self.ids.extend(o.ids);
        self.last_ack = self.last_ack.max(o.last_ack);
        Ok(())
    }
}

struct WorkersResult {
    figures: WorkerFigures,
    ids: Vec<String>,
    last_ack: Option<Instant>,
    e2e: LatencySummary,
}

/// Runs `params.workers` lease+ack loops until `shared.finished()`; `bar` counts acked messages.
fn run_workers(
    http: &str,
    params: &QueueParams,
    shared: &Arc<Shared>,
    bar: &ProgressBar,
    phase_start: Instant,
) -> Result<WorkersOut> {
    shared.clock.progress(phase_start);
    let path = format!("/v1/queues/{}/leases", encode_segment(&params.backlog.queue));
    let lease_body = serde_json::to_vec(&json!({
        "max_messages": params.lease_batch,
        "visibility_timeout_ms": params.visibility_timeout_ms,
        "wait_ms": params.lease_wait_ms,
    }))
    .context("encoding the lease request")?;
    let handles: Vec<_> = (0..params.workers)
        .map(|i| {
            let (shared, bar, path, body) =
                (Arc::clone(shared), bar.clone(), path.clone(), lease_body.clone());
            let (http, vis, len, timeout) = (
                http.to_string(),
                params.visibility_timeout_ms as i64,
                params.backlog.message_bytes,
                params.backlog.timeout(),
            );
            thread::Builder::new()
                .name(format!("worker-{i}"))
                .spawn(move || -> Result<WorkersOut> {
                    let r = worker_loop(&http, &path, &body, vis, len, timeout, &shared, &bar);
                    if r.is_err() {
                        shared.abort.store(true, Ordering::Relaxed);
                    }
                    r
                })
                .context("spawning a worker thread")
        })
        .collect::<Result<_>>()?;
    join_all(handles, WorkersOut::new(), WorkersOut::merge)
}

#[allow(clippy::too_many_arguments)]
fn worker_loop(
    http: &str,
    path: &str,
    lease_body: &[u8],
    visibility_ms: i64,
    message_bytes: usize,
    timeout: Duration,
    shared: &Shared,
    bar: &ProgressBar,
) -> Result<WorkersOut> {
    let mut client = QueueClient::new(http);
    let mut out = WorkersOut::new();
    let started = Instant::now();
    let mut items: Vec<(String, u64)> = Vec::new();
    while !shared.finished() {
        if shared.abort.load(Ordering::Relaxed) {
            bail!("stopped: another client thread failed");
        }
        let t0 = Instant::now();
        let r = post(&mut client, path, lease_body, "lease")?;
        let t1 = Instant::now();
        out.lease_wait += t1 - t0;
        out.lease_requests += 1;
        let answer: LeaseAnswer<'_> = serde_json::from_slice(&r.body)
            .map_err(|e| anyhow!("lease answer is not what the contract says ({e}): {}", r.text()))?;
        if answer.messages.is_empty() {
            out.empty_leases += 1;
            if !shared.finished() && shared.clock.since_progress() > timeout {
                bail!(
                    "no message acknowledged for {timeout:?}: {} published, {} acknowledged, leases \
                     answer nothing",
                    shared.published.load(Ordering::Relaxed),
                    shared.acked.load(Ordering::Relaxed)
                );
            }
            continue;
        }
        latency::record_ns(&mut out.lease_hist, (t1 - t0).as_nanos() as u64);
        out.lease_answer_bytes += r.body.len() as u64;
        items.clear();
        for m in &answer.messages {
            if m.attempt > 1 {
                out.redeliveries += 1;
            }
            if m.payload.len() != message_bytes {
                bail!(
                    "message {} was leased with a {}-byte text payload, {message_bytes} were published",
                    m.id,
                    m.payload.len()
                );
            }
            let leased_at_ms = m.lease_expires_at_ms - visibility_ms;
            let e2e_ms = (leased_at_ms - m.published_at_ms).max(0) as u64;
            latency::record_ns(&mut out.e2e_hist, e2e_ms.saturating_mul(1_000_000));
            items.push((m.id.clone(), m.generation));
        }
        let n = items.len() as u64;
        out.leased_messages += n;
        drop(answer);
        let refs: Vec<(&str, u64)> = items.iter().map(|(id, g)| (id.as_str(), *g)).collect();
        let t2 = Instant::now();
        let settled = client
            .ack_batch(None, &refs)
            .map_err(|e| anyhow!("batch ack of {n} messages: {e}"))?;
        let t3 = Instant::now();
        out.ack_wait += t3 - t2;
        out.ack_requests += 1;
        latency::record_ns(&mut out.ack_hist, (t3 - t2).as_nanos() as u64);
        latency::record_ns(&mut out.lease_to_ack_hist, (t3 - t1).as_nanos() as u64);
        for (s, (id, _)) in settled.iter().zip(&items) {
            if &s.id != id {
                bail!("batch ack answered {} where {id} was asked", s.id);
            }
            if !s.is_settled() || s.state.as_deref() != Some("acknowledged") {
                bail!(
                    "batch ack refused {id}: status {:?}, error {:?}, state {:?}: {}",
                    s.status,
                    s.error,
                    s.state,
                    s.message.as_deref().unwrap_or("")
                );
            }
        }
        out.ids.extend(items.drain(..).map(|(id, _)| id));
        out.last_ack = Some(t3);
        shared.acked.fetch_add(n, Ordering::AcqRel);
        shared.clock.progress(t3);
        shared.clock.end_if(shared.finished());
        bar.inc(n);
    }
    out.wall = started.elapsed();
    Ok(out)
}

impl WorkersOut {
    fn into_result(self) -> WorkersResult {
        let acked = self.ids.len() as u64;
        let lease_to_ack = LatencySummary::of(&self.lease_to_ack_hist);
        let batches = self.lease_requests - self.empty_leases;
        let mean_batch = div_or_zero(self.leased_messages as f64, batches as f64);
        let share = |d: Duration| div_or_zero(d.as_secs_f64(), self.wall.as_secs_f64());
        WorkersResult {
            figures: WorkerFigures {
                lease_requests: self.lease_requests,
                empty_leases: self.empty_leases,
                ack_requests: self.ack_requests,
                messages_acked: acked,
                mean_lease_batch: mean_batch,
                lease_latency: LatencySummary::of(&self.lease_hist),
                ack_latency: LatencySummary::of(&self.ack_hist),
                lease_to_ack,
                lease_to_ack_us_per_message: div_or_zero(lease_to_ack.mean_us, mean_batch),
                worker_time_in_lease: share(self.lease_wait),
                worker_time_in_ack: share(self.ack_wait),
                lease_answer_bytes_per_message: div_or_zero(
                    self.lease_answer_bytes as f64,
                    self.leased_messages as f64,
                ),
                redeliveries: self.redeliveries,
            },
            e2e: LatencySummary::of(&self.e2e_hist),
            ids: self.ids,
            last_ack: self.last_ack,
        }
    }
}

// ------------------------------------------------------------------------------------------
// Steady phase

fn steady_phase(
    http: &str,
    broker_pid: Option<u32>,
    params: &QueueParams,
    pool: &Arc<Vec<u8>>,
    bars: &Bars,
    target_msgs_per_s: f64,
) -> Result<SteadyResult> {
    let window = Duration::from_secs_f64(params.steady_secs);
    let shared = Shared::new(0, false, broker_pid);
    let bar = bars.bar("steady", (params.steady_secs * 10.0).ceil() as u64);
    let path = format!("/v1/queues/{}/messages", encode_segment(&params.backlog.queue));
    let batch = params.steady_publish_batch;
    let per_publisher = target_msgs_per_s / params.backlog.publishers as f64;
    let interval = Duration::from_secs_f64(batch as f64 / per_publisher);
    // Message indexes continue after the publish phase's (different payloads).
    let next = Arc::new(AtomicU64::new(params.backlog.messages));
    let mark = CpuMark::now(broker_pid);
    let start = Instant::now();
    let window_end = start + window;
    let publishers: Vec<_> = (0..params.backlog.publishers)
        .map(|i| {
            let (shared, pool, path, next) = (
                Arc::clone(&shared),
                Arc::clone(pool),
                path.clone(),
                Arc::clone(&next),
            );
            let (http, len, publishers, partitions) = (
                http.to_string(),
                params.backlog.message_bytes,
                params.backlog.publishers,
                params.backlog.partitions,
            );
            thread::Builder::new()
                .name(format!("steady-publisher-{i}"))
                .spawn(move || -> Result<PublisherOut<String>> {
                    let mut client = QueueClient::new(&http);
                    let mut out = PublisherOut::new(|m| m.id, partitions);
                    let mut buf = Vec::new();
                    // Publishers are staggered over one interval.
                    let offset = interval.mul_f64(i as f64 / publishers as f64);
                    for k in 0u32.. {
                        let due = start + offset + interval * k;
                        if due >= window_end || shared.abort.load(Ordering::Relaxed) {
                            break;
                        }
                        let now = Instant::now();
                        if due > now {
                            thread::sleep(due - now);
                        } else {
                            out.max_lag = out.max_lag.max(now - due);
                            if now - due > interval {
                                out.late_batches += 1;
                            }
                        }
                        let first = next.fetch_add(batch as u64, Ordering::Relaxed);
                        let r =
                            publish_one(&mut client, &path, &mut buf, &pool, (first, batch, len), &mut out);
                        if let Err(e) = r {
                            shared.abort.store(true, Ordering::Relaxed);
                            return Err(e);
                        }
                        shared.published.fetch_add(batch as u64, Ordering::AcqRel);
                    }
                    Ok(out)
                })
                .context("spawning a steady publisher thread")
        })
        .collect::<Result<_>>()?;

    // The workers run on their own threads; this one watches the window and the publishers.
    let watcher = {
        let (shared, bar, partitions) = (Arc::clone(&shared), bar.clone(), params.backlog.partitions);
        thread::Builder::new()
            .name("steady-watch".into())
            .spawn(move || -> Result<(PublisherOut<String>, u64)> {
                while Instant::now() < window_end && !shared.abort.load(Ordering::Relaxed) {
                    thread::sleep(Duration::from_millis(100));
                    bar.set_position((start.elapsed().as_secs_f64() * 10.0) as u64);
                    bar.set_message(format!(
                        "published {}, acked {}",
                        shared.published.load(Ordering::Relaxed),
                        shared.acked.load(Ordering::Relaxed)
                    ));
                }
                let acked_in_window = shared.acked.load(Ordering::Acquire);
                let r = join_all(
                    publishers,
                    PublisherOut::new(|m| m.id, partitions),
                    PublisherOut::merge,
                );
                shared.publishing_done.store(true, Ordering::Release);
                if r.is_err() {
                    shared.abort.store(true, Ordering::Relaxed);
                }
                Ok((r?, acked_in_window))
            })
            .context("spawning the steady-phase watcher")?
    };
    // The watcher drives the visible bar (time); the workers count on a hidden one.
    let workers = run_workers(http, params, &shared, &ProgressBar::hidden(), start);
    let watched = watcher
        .join()
        .map_err(|_| anyhow!("the steady-phase watcher panicked"))?;
    let (pub_out, acked_in_window) = watched?;
    let workers = workers?;
    let cpu = PhaseCpu::between(
        &mark,
        shared.clock.end.get().copied(),
        broker_pid,
        pub_out.kept.len() as u64,
    );
    bar.finish_and_clear();
    let published = pub_out.kept.len() as u64;
    let publish_secs = pub_out
        .last_answer
        .map_or(0.0, |t| t.duration_since(start).as_secs_f64())
        .max(window.as_secs_f64());
    let w = workers.into_result();
    let verified = verify(&pub_out.kept, &w.ids, "steady").is_ok();
    let tail_secs = w
        .last_ack
        .map_or(0.0, |t| t.saturating_duration_since(window_end).as_secs_f64());
    Ok(SteadyResult {
        target_msgs_per_s,
        secs: publish_secs,
        published,
        publish_msgs_per_s: per_s(published, publish_secs),
        acked_in_window,
        acked_msgs_per_s: per_s(acked_in_window, window.as_secs_f64()),
        tail_secs,
        late_batches: pub_out.late_batches,
        max_schedule_lag_ms: pub_out.max_lag.as_secs_f64() * 1e3,
        publish_latency: LatencySummary::of(&pub_out.hist),
        end_to_end: w.e2e,
        workers: w.figures,
        verified,
        cpu,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A backlog that passes the checks.
    pub(crate) fn backlog() -> Backlog {
        Backlog {
            queue: "q".into(),
            partitions: 4,
            messages: 10,
            message_bytes: 1024,
            publishers: 1,
            publish_batch: 500,
            timeout_secs: 60.0,
        }
    }

    #[test]
    fn payloads_are_text_sized_and_differ() {
        let pool = payload_pool();
        let a = payload(&pool, 0, 1024);
        let b = payload(&pool, 1, 1024);
        assert_eq!(a.len(), 1024);
        assert_ne!(a, b);
        assert!(a.iter().all(u8::is_ascii_alphanumeric));
        let mut buf = Vec::new();
        publish_body(&mut buf, &pool, 5, 3, 16);
        let v: Value = serde_json::from_slice(&buf).unwrap();
        let msgs = v["messages"].as_array().unwrap();
        assert_eq!(msgs.len(), 3);
        assert_eq!(
            msgs[1]["payload"].as_str().unwrap().as_bytes(),
            payload(&pool, 6, 16)
        );
    }

    #[test]
    fn verification_finds_missing_duplicate_and_unknown() {
        let p: Vec<String> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
        assert!(verify(&p, &["c".into(), "a".into(), "b".into()], "x").is_ok());
        let e = verify(&p, &["a".into(), "a".into(), "z".into()], "x").unwrap_err();
        assert!(
            e.contains("2 never")
                && e.contains("1 acknowledged twice")
                && e.contains("1 acknowledged but not")
        );
    }

    #[test]
    fn lease_answer_decodes_without_copying_payloads() {
        let body = br#"{"messages":[{"id":"ab","generation":7,"attempt":1,"lease_expires_at_ms":1000,
            "partition":2,"offset":41,"published_at_ms":900,"payload":"xyz","payload_base64":"eHl6",
            "headers":{}}]}"#;
        let a: LeaseAnswer<'_> = serde_json::from_slice(body).unwrap();
        assert_eq!(a.messages.len(), 1);
        let m = &a.messages[0];
        assert_eq!((m.generation, m.attempt, m.published_at_ms), (7, 1, 900));
        assert!(matches!(m.payload, Cow::Borrowed("xyz")));
    }

    #[test]
    fn the_publish_phase_counts_partitions_and_keeps_what_the_caller_verifies() {
        let pool = Arc::new(payload_pool());
        let backlog = Backlog {
            partitions: 3,
            messages: 2,
            message_bytes: 8,
            publish_batch: 2,
            timeout_secs: 10.0,
            ..backlog()
        };
        let (addr, server) = crate::queue_client::tests::one_shot(
            r#"{"messages":[{"id":"a","partition":0,"offset":7},{"id":"b","partition":2,"offset":9}]}"#,
        );
        let bar = ProgressBar::hidden();
        let (result, kept) = publish_phase(&addr, None, &backlog, &pool, &bar, "p", |m| {
            (m.partition, m.offset)
        })
        .unwrap();
        assert_eq!(kept, vec![(0, 7), (2, 9)]);
        assert_eq!((result.messages, result.requests), (2, 1));
        assert_eq!(
            result.per_partition,
            vec![1, 0, 1],
            "every partition of the queue"
        );
        let body = server.join().unwrap();
        assert!(body.starts_with(r#"{"messages":[{"payload":""#), "{body}");

        // A partition the queue does not have: an error, not a count.
        let (addr, server) = crate::queue_client::tests::one_shot(
            r#"{"messages":[{"id":"a","partition":0,"offset":7},{"id":"b","partition":3,"offset":9}]}"#,
        );
        let e = publish_phase(&addr, None, &backlog, &pool, &bar, "p", |m| m.id).unwrap_err();
        assert!(
            e.to_string().contains("partition 3 of a 3-partition queue"),
            "{e:#}"
        );
        server.join().unwrap();
    }

    #[test]
    fn parameters_are_checked() {
        let ok = QueueParams {
            backlog: backlog(),
            workers: 1,
            lease_batch: 100,
            lease_wait_ms: 100,
            visibility_timeout_ms: 60_000,
            steady_secs: 1.0,
            steady_fraction: 0.5,
            steady_publish_batch: 100,
        };
        let cases = [
            (ok.clone(), true),
            (
                QueueParams {
                    lease_batch: 1001,
                    ..ok.clone()
                },
                false,
            ),
            (
                QueueParams {
                    backlog: Backlog {
                        publish_batch: 0,
                        ..ok.backlog.clone()
                    },
                    ..ok.clone()
                },
                false,
            ),
            (
                QueueParams {
                    steady_fraction: 0.0,
                    ..ok.clone()
                },
                false,
            ),
            (
                QueueParams {
                    steady_secs: 0.0,
                    steady_fraction: 0.0,
                    ..ok
                },
                true,
            ),
        ];
        for (params, valid) in cases {
            assert_eq!(params.validate().is_ok(), valid, "{params:?}");
        }
    }
}
