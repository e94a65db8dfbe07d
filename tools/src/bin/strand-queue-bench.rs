//! `strand-queue-bench`: the queue benchmark. One command, one run, one report.
//!
//! Measures the machine's raw limits, spawns Strand (or uses a running one), then through the HTTP
//! door publishes a backlog over `POST /v1/queues/{queue}/messages`, drains it with workers that
//! lease a batch and ack it in one `POST /v1/messages/ack` and runs a steady state at a fraction of
//! the drain rate for end-to-end latency; through the Kafka door (KIP-932 share groups) publishes
//! the same backlog to a second queue and drains it with native share consumers (ShareFetch with
//! acknowledgements on the next fetch). It measures the raw limits again and reports everything as
//! a table and as JSON. See BENCHMARKS.md.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, ValueEnum};
use serde::Serialize;

use strand_tools::broker::{binary_version, memory_of, BrokerProcess, Memory};
use strand_tools::cli::{RawArgs, RawDefaults, RunArgs, SpawnArgs};
use strand_tools::host::{cpu_seconds, utc_now_rfc3339, FsInfo, HostInfo};
use strand_tools::latency::{human_us, LatencySummary};
use strand_tools::queue_workload::{self, Backlog, Bars, Checkpoint, PhaseCpu, QueueParams, QueueResult};
use strand_tools::report::{
    host_line, human_bytes, render_raw_limits, RawLimitsPair, RawParameters, ToolInfo,
};
use strand_tools::run::{exit_code, main_of, spinner, unique_name};
use strand_tools::share_workload::{
    self, ConfluentResult, ShareBroker, ShareCheckpoint, ShareParams, ShareResult,
};

/// The target: messages leased and acked per second with 8 workers in batches (HTTP);
/// "ShareConsumer similar".
const TARGET_MSGS_PER_S: f64 = 50_000.0;

/// How the figures are taken; copied into every report.
const METHODOLOGY: &[&str] = &[
    "One broker, one client process on the same machine: on a small machine they share the CPUs, \
     and the CPU each used per phase is reported (cores = CPU seconds per wall second).",
    "Every client thread (publisher or worker) has its own keep-alive HTTP/1.1 connection and one \
     request in flight. Payloads are random base62 text (a different slice per message), sent as \
     `payload`; MB = 10^6 payload bytes.",
    "Publish: publishers post batches until the backlog is published; throughput from the phase \
     start to the last answer; latency per request (send to durable answer).",
    "Drain: each worker loops lease (max_messages = lease_batch, wait_ms, visibility_timeout_ms) then \
     one batch ack (POST /v1/messages/ack) of every message it got, with no processing in between. \
     Throughput: acknowledged messages from the phase start to the last ack answer. Lease latency \
     counts non-empty leases only. Lease-to-ack: from a lease answer to its ack answer (the broker's \
     ack cost plus decoding/encoding), per lease batch. Every published id must be acknowledged \
     exactly once, every ack item must answer `acknowledged`, and the queue must report nothing \
     available, leased, delayed or dead-lettered afterwards.",
    "Steady: publishers paced at steady_fraction x the drain rate (schedule-based, staggered) while \
     the workers lease and ack. End-to-end latency is publish -> lease on the broker's clock: \
     lease_expires_at_ms - visibility_timeout_ms - published_at_ms (1 ms resolution).",
    "Raw limits are measured before and after the broker, in the run directory (the broker's disk): \
     sequential write() + fdatasync() at each size (3 warm-up rounds excluded) and a loopback TCP copy \
     of 1 MiB writes. Ratios use the better of before/after (higher bandwidth, lower latency): the \
     more demanding denominator.",
    "Share door (KIP-932): a second queue gets the same backlog over HTTP (same publishers, batches and \
     payloads, so the log holds the same stored batches) after the group config \
     share.auto.offset.reset=earliest is set. `workers` native Kafka clients (raw requests, one \
     connection and thread each, no client library) join one share group (ShareGroupHeartbeat, member \
     epoch 0) and heartbeat once more when all have joined, to take the final assignment; the drain \
     starts then. Each loops ShareFetch (max_records = lease_batch, max_wait_ms = lease_wait_ms) carrying \
     the ACCEPT of the previous fetch's records; once every record has been acquired, or for a partition \
     no longer assigned, the last acceptances go in a ShareAcknowledge (no long poll). Heartbeats continue \
     at the broker's interval. Throughput: accepted records from the drain start to the last answer \
     confirming an acceptance. A record counts as accepted only when the answer to the request that \
     carried its ACCEPT shows error code 0 for its partition; every acquired offset must be a record of \
     message_bytes in the answered batches; every published (partition, offset) must be accepted exactly \
     once; afterwards every consumer closes its share session (ShareAcknowledge, epoch -1) and leaves \
     (member epoch -1), the queue must report nothing available, leased or delayed for the group and \
     ShareGroupDescribe no member. ShareFetch latency counts non-empty fetches only (they include the \
     acknowledgements they carry). Fetch-to-ack: from a fetch answer to the answer confirming the \
     acceptance of its records.",
    "Share door with confluent-kafka (--share-client confluent|both): a third queue gets the same backlog; \
     `workers` Python processes each run a confluent-kafka ShareConsumer (explicit acknowledgement, every \
     record ACCEPTed, the acceptances sent with the next poll; fetch.wait.max.ms = lease_wait_ms, other \
     settings librdkafka's defaults). Throughput: from the first record any process acquired to the last \
     acceptance the acknowledgement commit callback confirmed without error; client CPU is the processes' \
     CPU. The same exactly-once check of (partition, offset) applies; then the processes close.",
];

/// Which door of the queue the benchmark drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
enum Door {
    /// The HTTP queue API: publish, lease + batch-ack drain, steady state.
    Http,
    /// Kafka share groups (KIP-932): publish, drain by native share consumers.
    Share,
    /// Both, HTTP first.
    Both,
}

/// Which client drains the share door.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
enum ShareClient {
    /// Native Kafka clients in this process (raw requests, one thread each).
    Native,
    /// confluent-kafka `ShareConsumer` processes (Python, `--python`).
    Confluent,
    /// Both, each on its own queue, native first.
    Both,
}

/// A choice of one of two, or both.
trait OneOrBoth: Copy + PartialEq {
    const BOTH: Self;

    /// Whether the choice includes `one`.
    fn includes(self, one: Self) -> bool {
        self == one || self == Self::BOTH
    }
}

impl OneOrBoth for Door {
    const BOTH: Self = Door::Both;
}

impl OneOrBoth for ShareClient {
    const BOTH: Self = ShareClient::Both;
}

#[derive(Parser, Debug)]
#[command(
    name = "strand-queue-bench",
    version,
    about = "Queue benchmark for Strand: over HTTP, publish, lease + batch-ack drain and steady-state \
             end-to-end latency; over Kafka share groups (KIP-932), the same backlog drained by native \
             share consumers; with the machine's raw disk and loopback limits in the same run.",
    after_help = "Examples:\n  \
      strand-queue-bench --spawn target/release/strand --data-dir /work/benchrun --output queue.json\n  \
      strand-queue-bench --spawn target/release/strand --door share --messages 50000 --skip-raw\n  \
      strand-queue-bench --http 127.0.0.1:8080 --bootstrap 127.0.0.1:9092 --broker-pid \"$(pidof strand)\" \
      --steady-secs 0\n\n\
      Durable figures are only meaningful if the data directory is on a real disk: the report names \
      its filesystem and warns loudly about tmpfs."
)]
struct Cli {
    #[command(flatten)]
    broker: BrokerArgs,

    /// Which door to drive: `http` (lease + ack), `share` (KIP-932 share consumers) or both.
    #[arg(long, value_enum, default_value_t = Door::Both, help_heading = "Workload")]
    door: Door,
    /// Queue to create [default: a fresh unique name]; it must not exist. The share door creates
    /// `{queue}-share` and uses the share group `{queue}-share-group`.
    #[arg(long, help_heading = "Workload")]
    queue: Option<String>,
    /// Partitions of the queue.
    #[arg(long, default_value_t = 4, help_heading = "Workload")]
    partitions: u32,
    /// Messages published in phase 1 and drained in phase 2.
    #[arg(long, default_value_t = 200_000, help_heading = "Workload")]
    messages: u64,
    /// Payload bytes per message.
    #[arg(long, default_value_t = 1024, help_heading = "Workload")]
    message_bytes: usize,
    /// Publisher threads (one connection each).
    #[arg(long, default_value_t = 4, help_heading = "Workload")]
    publishers: usize,
    /// Messages per publish request (1..=1000).
    #[arg(long, default_value_t = 500, help_heading = "Workload")]
    publish_batch: usize,
    /// Worker threads (one connection each): lease, then ack everything leased in one request.
    /// Also the number of share consumers.
    #[arg(long, default_value_t = 8, help_heading = "Workload")]
    workers: usize,
    /// `max_messages` of each lease (1..=1000); also `max_records` of each ShareFetch.
    #[arg(long, default_value_t = 100, help_heading = "Workload")]
    lease_batch: u32,
    /// `wait_ms` of each lease (long poll while nothing is available); also `max_wait_ms` of each
    /// ShareFetch.
    #[arg(long, value_name = "MS", default_value_t = 100, help_heading = "Workload")]
    lease_wait_ms: u64,
    /// `visibility_timeout_ms` of each lease.
    #[arg(long, value_name = "MS", default_value_t = 60_000, help_heading = "Workload")]
    visibility_timeout_ms: u64,
    /// Who drains the share door: native clients, confluent-kafka ShareConsumer processes (a
    /// queue of their own, `{queue}-share-confluent`), or both.
    #[arg(long, value_enum, default_value_t = ShareClient::Native, help_heading = "Workload")]
    share_client: ShareClient,
    /// Python with confluent-kafka ≥ 2.16 (`--share-client confluent|both`).
    #[arg(
        long,
        value_name = "PATH",
        default_value = ".venv/bin/python",
        help_heading = "Workload"
    )]
    python: PathBuf,
    /// `max_bytes` of each ShareFetch of the native clients [default: 52428800, Kafka's `fetch.max.bytes` default, which
    /// the Java ShareConsumer sends].
    #[arg(long, value_name = "BYTES", help_heading = "Workload")]
    share_fetch_max_bytes: Option<i32>,
    /// Seconds of the steady phase (publishers and workers together); 0 skips it.
    #[arg(long, value_name = "SECS", default_value_t = 10.0, help_heading = "Workload")]
    steady_secs: f64,
    /// Publish rate of the steady phase, as a fraction of the drain rate.
    #[arg(
        long,
        value_name = "FRACTION",
        default_value_t = 0.5,
        help_heading = "Workload"
    )]
    steady_fraction: f64,
    /// Messages per publish request in the steady phase.
    #[arg(long, default_value_t = 100, help_heading = "Workload")]
    steady_publish_batch: usize,

    /// Seconds to wait for the broker to start, or without any message acknowledged.
    #[arg(long, value_name = "SECS", default_value_t = 60.0, help_heading = "Workload")]
    timeout_secs: f64,

    #[command(flatten)]
    raw: RawArgs<QueueRawSizes>,
    #[command(flatten)]
    run: RunArgs,
}

/// strand-queue-bench's raw-write sizes.
#[derive(Clone, Debug)]
struct QueueRawSizes;

impl RawDefaults for QueueRawSizes {
    const SIZES: &'static str = "4096,65536";
    const SIZES_HELP: &'static str = "Write sizes of the append+fdatasync test, comma separated; a publish \
                                      request's payload bytes (publish-batch x message-bytes) are added";
}

/// The broker under test: spawned, or already running.
#[derive(Args, Debug)]
#[command(next_help_heading = "Broker under test")]
struct BrokerArgs {
    #[command(flatten)]
    spawn: SpawnArgs,
    /// Use an already running broker's HTTP queue API at this address.
    #[arg(long, value_name = "HOST:PORT", conflicts_with = "spawn")]
    http: Option<String>,
    /// With --http: the broker's Kafka listener (needed by the share door).
    #[arg(long, value_name = "HOST:PORT", requires = "http")]
    bootstrap: Option<String>,
    /// With --http: the broker's pid, for its memory and CPU.
    #[arg(long, value_name = "PID", requires = "http")]
    broker_pid: Option<u32>,
}

#[derive(Debug, Clone, Default, Serialize)]
struct BrokerInfo {
    /// `spawned` or `running`.
    kind: String,
    http: String,
    /// The Kafka listener (the share door).
    kafka: Option<String>,
    binary: Option<PathBuf>,
    version: Option<String>,
    command: Option<Vec<String>>,
    pid: Option<u32>,
    log: Option<PathBuf>,
    stopped: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize)]
struct MemoryReport {
    after_start: Option<Memory>,
    queue_created: Option<Memory>,
    after_publish: Option<Memory>,
    after_drain: Option<Memory>,
    after_steady: Option<Memory>,
    after_share_publish: Option<Memory>,
    after_share_drain: Option<Memory>,
    after_confluent_publish: Option<Memory>,
    after_confluent_drain: Option<Memory>,
    /// VmHWM at the end: the peak resident size.
    peak_hwm_kib: Option<u64>,
}

#[derive(Debug, Clone, Serialize)]
struct BrokerCpu {
    /// CPU seconds (user + system) the broker used from the queue's creation to the end.
    workload_cpu_seconds: Option<f64>,
    /// CPU seconds the broker process used in total, at the end of the run.
    total_cpu_seconds: Option<f64>,
}

impl MemoryReport {
    /// Where a share door's checkpoint goes (`confluent`: the confluent-kafka drain's door).
    fn share(&mut self, confluent: bool, c: ShareCheckpoint) -> &mut Option<Memory> {
        match (confluent, c) {
            (false, ShareCheckpoint::Published) => &mut self.after_share_publish,
            (false, ShareCheckpoint::Drained) => &mut self.after_share_drain,
            (true, ShareCheckpoint::Published) => &mut self.after_confluent_publish,
            (true, ShareCheckpoint::Drained) => &mut self.after_confluent_drain,
        }
    }
}

/// Results divided by the machine's raw limits.
#[derive(Debug, Clone, Serialize)]
struct Ratios {
    publish_request_bytes: u64,
    raw_fdatasync_4k_p50_us: Option<u64>,
    raw_fdatasync_4k_p99_us: Option<u64>,
    /// Sequential 4 KiB append+fdatasync rounds per second (one thread).
    raw_fdatasyncs_per_s_4k: Option<f64>,
    raw_fdatasync_64k_p99_us: Option<u64>,
    raw_disk_64k_mb_per_s: Option<f64>,
    raw_disk_publish_batch_mb_per_s: Option<f64>,
    raw_fdatasync_publish_batch_p99_us: Option<u64>,
    raw_loopback_mb_per_s: Option<f64>,
    /// Publish MB/s ÷ raw append+fdatasync MB/s at the publish request's payload size.
    publish_mb_per_s_vs_raw_disk: Option<f64>,
    /// Publish request p99 ÷ raw fdatasync p99 at the publish request's payload size.
    publish_p99_vs_fdatasync_p99: Option<f64>,
    /// Drain: batch-ack request p99 ÷ raw 4 KiB fdatasync p99.
    ack_p99_vs_fdatasync_4k_p99: Option<f64>,
    /// Drain: lease request p99 ÷ raw 4 KiB fdatasync p99.
    lease_p99_vs_fdatasync_4k_p99: Option<f64>,
    /// Drain: lease-to-ack p50 ÷ raw 4 KiB fdatasync p50.
    lease_to_ack_p50_vs_fdatasync_4k_p50: Option<f64>,
    /// Drain: ack requests per second ÷ sequential 4 KiB fdatasyncs per second (> 1 means the
    /// broker shares fsyncs between concurrent acks).
    ack_requests_per_s_vs_fdatasyncs_per_s_4k: Option<f64>,
    /// Drain payload MB/s ÷ loopback MB/s.
    drain_mb_per_s_vs_loopback: Option<f64>,
    /// Steady end-to-end p99 ÷ raw 4 KiB fdatasync p99.
    steady_e2e_p99_vs_fdatasync_4k_p99: Option<f64>,
    /// Share drain: non-empty ShareFetch p99 ÷ raw 4 KiB fdatasync p99.
    share_fetch_p99_vs_fdatasync_4k_p99: Option<f64>,
    /// Share drain payload MB/s ÷ loopback MB/s.
    share_drain_mb_per_s_vs_loopback: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
struct Target {
    description: String,
    msgs_per_s: f64,
    measured_msgs_per_s: Option<f64>,
    met: Option<bool>,
}

impl Target {
    /// [`TARGET_MSGS_PER_S`] and what was measured against it.
    fn new(description: String, measured_msgs_per_s: Option<f64>) -> Self {
        Target {
            description,
            msgs_per_s: TARGET_MSGS_PER_S,
            measured_msgs_per_s,
            met: measured_msgs_per_s.map(|m| m >= TARGET_MSGS_PER_S),
        }
    }

    /// Met or not, with the figure measured (`unit`: what it counts per second).
    fn verdict(&self, unit: &str) -> String {
        match (self.met, self.measured_msgs_per_s) {
            (Some(true), Some(m)) => format!("MET ({m:.0} {unit}/s)"),
            (Some(false), Some(m)) => format!(
                "NOT MET ({m:.0} {unit}/s, {:.0}% of it)",
                m / self.msgs_per_s * 100.0
            ),
            _ => "not measured".to_string(),
        }
    }
}

/// "ShareConsumer similar": the share drain against the same figure, and against the HTTP drain of
/// the same run.
#[derive(Debug, Clone, Serialize)]
struct ShareTarget {
    #[serde(flatten)]
    target: Target,
    /// The HTTP drain's msgs/s in this run (door `both`).
    http_drain_msgs_per_s: Option<f64>,
    /// Share drain msgs/s ÷ HTTP drain msgs/s.
    ratio_to_http_drain: Option<f64>,
    /// The confluent-kafka ShareConsumer drain (`--share-client confluent|both`).
    confluent_msgs_per_s: Option<f64>,
    confluent_ratio_to_http_drain: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
struct Report {
    tool: ToolInfo,
    date_utc: String,
    command_line: Vec<String>,
    host: HostInfo,
    data_dir: FsInfo,
    broker: BrokerInfo,
    door: Door,
    share_client: ShareClient,
    parameters: QueueParams,
    share_parameters: Option<ShareParams>,
    raw_parameters: RawParameters,
    methodology: Vec<String>,
    raw_limits: RawLimitsPair,
    /// The HTTP door (`--door http|both`).
    result: Option<QueueResult>,
    /// The share door with native clients (`--door share|both`).
    share: Option<ShareResult>,
    /// The share door with confluent-kafka ShareConsumer processes (`--share-client`).
    share_confluent: Option<ConfluentResult>,
    memory: MemoryReport,
    broker_cpu: BrokerCpu,
    ratios: Option<Ratios>,
    target: Target,
    share_target: Option<ShareTarget>,
    problems: Vec<String>,
    warnings: Vec<String>,
    error: Option<String>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    main_of("strand-queue-bench", || run(cli))
}

fn run(cli: Cli) -> Result<ExitCode> {
    if cli.broker.spawn.spawn.is_none() && cli.broker.http.is_none() {
        bail!("nothing to benchmark: pass --spawn PATH or --http HOST:PORT");
    }
    let params = QueueParams {
        backlog: Backlog {
            queue: cli
                .queue
                .clone()
                .unwrap_or_else(|| unique_name("strand-queue-bench")),
            partitions: cli.partitions,
            messages: cli.messages,
            message_bytes: cli.message_bytes,
            publishers: cli.publishers,
            publish_batch: cli.publish_batch,
            timeout_secs: cli.timeout_secs,
        },
        workers: cli.workers,
        lease_batch: cli.lease_batch,
        lease_wait_ms: cli.lease_wait_ms,
        visibility_timeout_ms: cli.visibility_timeout_ms,
        steady_secs: cli.steady_secs,
        steady_fraction: cli.steady_fraction,
        steady_publish_batch: cli.steady_publish_batch,
    };
    params.validate()?;
    let share_params = cli.door.includes(Door::Share).then(|| ShareParams {
        backlog: Backlog {
            queue: format!("{}-share", params.backlog.queue),
            ..params.backlog.clone()
        },
        group: format!("{}-share-group", params.backlog.queue),
        consumers: params.workers,
        max_records: params.lease_batch,
        max_wait_ms: u32::try_from(params.lease_wait_ms).unwrap_or(u32::MAX),
        fetch_max_bytes: cli
            .share_fetch_max_bytes
            .unwrap_or(share_workload::DEFAULT_FETCH_MAX_BYTES),
    });
    if let Some(s) = &share_params {
        s.validate()?;
        if cli.broker.http.is_some() && cli.broker.bootstrap.is_none() {
            bail!("the share door needs the broker's Kafka listener: pass --bootstrap HOST:PORT with --http");
        }
    }
    let show_progress = cli.run.progress.show();

    let (run_dir, mut warnings) = cli.raw.run_dir(&cli.run.run_dir, "strand-queue-bench")?;
    if cli.broker.http.is_some() {
        warnings.push(
            "running broker (--http): its data directory may not be the disk the raw limits measured".into(),
        );
    }

    let publish_request_bytes = (cli.publish_batch * cli.message_bytes) as u64;
    let raw_parameters = cli.raw.parameters(publish_request_bytes, 0.0)?;

    let date_utc = utc_now_rfc3339();
    let mut raw = cli
        .raw
        .measure_before(run_dir.path(), &raw_parameters, show_progress)?;

    let timeout = Duration::from_secs_f64(cli.timeout_secs);
    let mut process = None;
    let mut broker = match (&cli.broker.spawn.spawn, &cli.broker.http) {
        (Some(binary), _) => {
            let s = spinner(show_progress, "starting strand", "");
            let p = BrokerProcess::spawn_strand(
                binary,
                &run_dir.path().join("broker"),
                &cli.broker.spawn.spawn_arg,
                timeout,
            );
            s.finish_and_clear();
            let p = p?;
            let http = p
                .http
                .clone()
                .context("the spawned strand's ready file names no HTTP listener")?;
            let info = BrokerInfo {
                kind: "spawned".into(),
                http,
                kafka: Some(p.bootstrap.clone()),
                binary: Some(binary.clone()),
                version: Some(binary_version(binary).unwrap_or_else(|e| format!("unknown ({e:#})"))),
                command: Some(p.command.clone()),
                pid: Some(p.pid),
                log: Some(p.log_path.clone()),
                stopped: None,
            };
            process = Some(p);
            info
        }
        (None, Some(http)) => BrokerInfo {
            kind: "running".into(),
            http: http.clone(),
            kafka: cli.broker.bootstrap.clone(),
            pid: cli.broker.broker_pid,
            ..BrokerInfo::default()
        },
        (None, None) => bail!("nothing to benchmark: pass --spawn PATH or --http HOST:PORT"),
    };
    eprintln!(
        "strand-queue-bench: broker pid {}, HTTP {}, Kafka {}",
        broker.pid.map_or("unknown".into(), |p| p.to_string()),
        broker.http,
        broker.kafka.as_deref().unwrap_or("-")
    );

    let pid = broker.pid;
    let mem = || -> Option<Memory> { pid.and_then(|p| memory_of(p).ok()) };
    let mut memory = MemoryReport {
        after_start: mem(),
        ..MemoryReport::default()
    };
    let cpu_at_start = pid.and_then(|p| cpu_seconds(Some(p)));
    let bars = Bars { show: show_progress };
    let mut checkpoint = |c: Checkpoint| {
        let m = mem();
        match c {
            Checkpoint::Created => memory.queue_created = m,
            Checkpoint::Published => memory.after_publish = m,
            Checkpoint::Drained => memory.after_drain = m,
            Checkpoint::Steady => memory.after_steady = m,
        }
    };
    let outcome = cli
        .door
        .includes(Door::Http)
        .then(|| queue_workload::run(&broker.http, pid, &params, &bars, &mut checkpoint));
    let http_failed = matches!(outcome, Some(Err(_)));
    let share_broker = broker.kafka.as_deref().map(|kafka| ShareBroker {
        http: &broker.http,
        bootstrap: kafka,
        pid,
        show_progress,
    });
    // The share door runs after the HTTP door, unless that one failed.
    let share_outcome = share_door(
        cli.share_client.includes(ShareClient::Native),
        http_failed,
        share_params.as_ref(),
        share_broker,
        |b, sp| share_workload::run(b, sp, &mut |c| *memory.share(false, c) = mem()),
    );
    let share_failed = matches!(share_outcome, Some(Err(_)));
    let confluent_outcome = share_door(
        cli.share_client.includes(ShareClient::Confluent),
        http_failed || share_failed,
        share_params.as_ref(),
        share_broker,
        |b, sp| {
            let cp = ShareParams {
                backlog: Backlog {
                    queue: format!("{}-share-confluent", params.backlog.queue),
                    ..sp.backlog.clone()
                },
                group: format!("{}-share-confluent-group", params.backlog.queue),
                ..sp.clone()
            };
            share_workload::run_confluent(b, &cp, &cli.python, &mut |c| *memory.share(true, c) = mem())
        },
    );
    let end_memory = mem();
    memory.peak_hwm_kib = end_memory.map(|m| m.hwm_kib);
    let total_cpu = pid.and_then(|p| cpu_seconds(Some(p)));
    let broker_cpu = BrokerCpu {
        workload_cpu_seconds: match (cpu_at_start, total_cpu) {
            (Some(a), Some(b)) => Some(b - a),
            _ => None,
        },
        total_cpu_seconds: total_cpu,
    };
    let mut outcomes = Outcomes::default();
    let result = outcomes.take("HTTP door", outcome, |r| &r.problems);
    let share = outcomes.take("share door", share_outcome, |r| &r.problems);
    let share_confluent = outcomes.take("share door (confluent-kafka)", confluent_outcome, |r| &r.problems);
    let Outcomes { mut problems, errors } = outcomes;
    let mut error = (!errors.is_empty()).then(|| errors.join("; "));
    if let Some(mut p) = process {
        if !p.is_running() {
            problems.push(format!("the broker exited during the run{}", p.log_tail()));
        } else if error.is_some() {
            if let Some(e) = &mut error {
                e.push_str(&p.log_tail());
            }
        }
        broker.stopped = Some(
            p.stop(Duration::from_secs(5))
                .unwrap_or_else(|e| format!("stop failed: {e:#}")),
        );
    }

    warnings.extend(
        cli.raw
            .measure_after(&mut raw, run_dir.path(), &raw_parameters, show_progress)?,
    );
    let ratios = (!cli.raw.skip_raw && (result.is_some() || share.is_some()))
        .then(|| ratios(result.as_ref(), share.as_ref(), &raw, publish_request_bytes));
    let measured = result.as_ref().map(|r| r.drain.msgs_per_s);
    let share_target = share_params.as_ref().map(|sp| {
        let m = share.as_ref().map(|s| s.drain.msgs_per_s);
        let c = share_confluent.as_ref().map(|s| s.drain.msgs_per_s);
        ShareTarget {
            target: Target::new(
                format!(
                    "ShareConsumer similar: ≥ {TARGET_MSGS_PER_S:.0} records/s fetched and accepted with {} \
                     share consumers, ShareFetch max_records {}",
                    sp.consumers, sp.max_records
                ),
                m,
            ),
            http_drain_msgs_per_s: measured,
            ratio_to_http_drain: m.zip(measured.filter(|h| *h > 0.0)).map(|(s, h)| s / h),
            confluent_msgs_per_s: c,
            confluent_ratio_to_http_drain: c.zip(measured.filter(|h| *h > 0.0)).map(|(s, h)| s / h),
        }
    });
    let target = Target::new(
        format!(
            "≥ {TARGET_MSGS_PER_S:.0} messages/s leased and acked (drain phase) with {} workers in batches of {}",
            params.workers, params.lease_batch
        ),
        measured,
    );

    let failed = error.is_some() || !problems.is_empty();
    let report = Report {
        tool: ToolInfo::of("strand-queue-bench"),
        date_utc,
        command_line: std::env::args().collect(),
        host: HostInfo::probe(),
        data_dir: run_dir.fs.clone(),
        broker,
        door: cli.door,
        share_client: cli.share_client,
        parameters: params,
        share_parameters: share_params,
        raw_parameters,
        methodology: METHODOLOGY.iter().map(|s| s.to_string()).collect(),
        raw_limits: raw,
        result,
        share,
        share_confluent,
        memory,
        broker_cpu,
        ratios,
        target,
        share_target,
        problems,
        warnings,
        error,
    };

    cli.run.output.emit(&render_text(&report), &report)?;
    run_dir.finish(cli.run.run_dir.keep_data || failed)?;
    Ok(exit_code(false, failed))
}

/// Runs a share door with `run` if it is `wanted` and the share door's parameters are there, unless
/// an earlier door `failed`.
fn share_door<R>(
    wanted: bool,
    failed: bool,
    params: Option<&ShareParams>,
    broker: Option<ShareBroker<'_>>,
    run: impl FnOnce(ShareBroker<'_>, &ShareParams) -> Result<R>,
) -> Option<Result<R>> {
    match (params, broker) {
        (Some(sp), Some(b)) if wanted && !failed => Some(run(b, sp)),
        (Some(_), None) if wanted => Some(Err(anyhow::anyhow!(
            "the share door needs the broker's Kafka listener (--bootstrap)"
        ))),
        _ => None,
    }
}

/// The doors' problems and errors, gathered from their outcomes.
#[derive(Default)]
struct Outcomes {
    problems: Vec<String>,
    errors: Vec<String>,
}

impl Outcomes {
    /// The result of `door`, if it ran and finished.
    fn take<R>(
        &mut self,
        door: &str,
        outcome: Option<Result<R>>,
        problems: impl Fn(&R) -> &Vec<String>,
    ) -> Option<R> {
        match outcome? {
            Ok(r) => {
                self.problems.extend(problems(&r).iter().cloned());
                Some(r)
            }
            Err(e) => {
                self.errors.push(format!("{door}: {e:#}"));
                None
            }
        }
    }
}

fn ratios(
    r: Option<&QueueResult>,
    share: Option<&ShareResult>,
    raw: &RawLimitsPair,
    publish_request_bytes: u64,
) -> Ratios {
    let div = |a: f64, b: Option<f64>| b.filter(|b| *b > 0.0).map(|b| a / b);
    let sync4_p50 = raw.disk_at(4096).map(|d| d.fdatasync.p50_us).min();
    let sync4_p99 = raw.best_fdatasync_p99_us(4096);
    let syncs_per_s_4k = raw
        .disk_at(4096)
        .filter(|d| d.secs > 0.0)
        .map(|d| d.rounds as f64 / d.secs)
        .reduce(f64::max);
    let pub_disk = raw.best_disk_mb_per_s(publish_request_bytes);
    let pub_p99 = raw.best_fdatasync_p99_us(publish_request_bytes);
    let loopback = raw.best_loopback_mb_per_s();
    let lat = |l: &LatencySummary, pick: fn(&LatencySummary) -> u64, base: Option<u64>| {
        (l.samples > 0)
            .then(|| div(pick(l) as f64, base.map(|b| b as f64)))
            .flatten()
    };
    let p99 = |l: &LatencySummary| l.p99_us;
    let p50 = |l: &LatencySummary| l.p50_us;
    let w = r.map(|r| &r.drain.workers);
    let ack_rps = r
        .filter(|r| r.drain.secs > 0.0)
        .map(|r| r.drain.workers.ack_requests as f64 / r.drain.secs);
    Ratios {
        publish_request_bytes,
        raw_fdatasync_4k_p50_us: sync4_p50,
        raw_fdatasync_4k_p99_us: sync4_p99,
        raw_fdatasyncs_per_s_4k: syncs_per_s_4k,
        raw_fdatasync_64k_p99_us: raw.best_fdatasync_p99_us(65536),
        raw_disk_64k_mb_per_s: raw.best_disk_mb_per_s(65536),
        raw_disk_publish_batch_mb_per_s: pub_disk,
        raw_fdatasync_publish_batch_p99_us: pub_p99,
        raw_loopback_mb_per_s: loopback,
        publish_mb_per_s_vs_raw_disk: r.and_then(|r| div(r.publish.mb_per_s, pub_disk)),
        publish_p99_vs_fdatasync_p99: r.and_then(|r| lat(&r.publish.request_latency, p99, pub_p99)),
        ack_p99_vs_fdatasync_4k_p99: w.and_then(|w| lat(&w.ack_latency, p99, sync4_p99)),
        lease_p99_vs_fdatasync_4k_p99: w.and_then(|w| lat(&w.lease_latency, p99, sync4_p99)),
        lease_to_ack_p50_vs_fdatasync_4k_p50: w.and_then(|w| lat(&w.lease_to_ack, p50, sync4_p50)),
        ack_requests_per_s_vs_fdatasyncs_per_s_4k: ack_rps.and_then(|a| div(a, syncs_per_s_4k)),
        drain_mb_per_s_vs_loopback: r.and_then(|r| div(r.drain.mb_per_s, loopback)),
        steady_e2e_p99_vs_fdatasync_4k_p99: r
            .and_then(|r| r.steady.as_ref())
            .and_then(|s| lat(&s.end_to_end, p99, sync4_p99)),
        share_fetch_p99_vs_fdatasync_4k_p99: share
            .and_then(|s| lat(&s.drain.clients.fetch_latency, p99, sync4_p99)),
        share_drain_mb_per_s_vs_loopback: share.and_then(|s| div(s.drain.mb_per_s, loopback)),
    }
}

// ------------------------------------------------------------------------------------------
// The table

fn lat_row(o: &mut String, name: &str, l: &LatencySummary) {
    let _ = writeln!(
        o,
        "  {name:<26} {:>10} {:>10} {:>10} {:>10}   ({} samples)",
        human_us(l.p50_us),
        human_us(l.p99_us),
        human_us(l.p999_us),
        human_us(l.max_us),
        l.samples
    );
}

fn cpu_text(c: &PhaseCpu) -> String {
    let f = |x: Option<f64>, unit: &str| x.map_or("?".to_string(), |x| format!("{x:.2}{unit}"));
    let us = |x: Option<f64>| x.map_or("?".to_string(), |x| format!("{x:.1}"));
    format!(
        "CPU client {} / broker {} (broker share {}; {} / {} µs per message)",
        f(c.client_cores, ""),
        f(c.broker_cores, " cores"),
        c.broker_share
            .map_or("?".to_string(), |s| format!("{:.0}%", s * 100.0)),
        us(c.client_us_per_message),
        us(c.broker_us_per_message)
    )
}

fn mib(m: Option<Memory>) -> String {
    m.map_or("?".to_string(), |m| {
        format!("{:.1} MiB", m.rss_kib as f64 / 1024.0)
    })
}

fn ratio(x: Option<f64>) -> String {
    x.map_or("-".to_string(), |x| format!("{x:.2}x"))
}

/// The column header of the latency rows.
fn latency_header(o: &mut String) {
    let _ = writeln!(
        o,
        "\n{:<28} {:>10} {:>10} {:>10} {:>10}",
        "latency", "p50", "p99", "p99.9", "max"
    );
}

/// The start of a share door's part of the table: the HTTP publish that filled its queue (`door`
/// names it) and the drain's throughput (`drain` names it; `consumers`: who drained, `done`: what
/// they did to the records). `with_header` when no earlier part printed the latency header.
fn render_share_door<C>(
    o: &mut String,
    r: &ShareResult<C>,
    with_header: bool,
    (door, drain): (&str, &str),
    (consumers, done): (&str, &str),
) {
    if with_header {
        latency_header(o);
    }
    let pb = &r.publish;
    let published = rate(pb.messages, "messages", pb.secs, pb.msgs_per_s, pb.mb_per_s);
    let _ = writeln!(
        o,
        "{door} publish (HTTP, queue {}): {published}; {} requests; {}",
        r.queue,
        pb.requests,
        cpu_text(&pb.cpu)
    );
    lat_row(o, "publish request", &pb.request_latency);
    let d = &r.drain;
    let what = format!("records {done}");
    let drained = rate(d.records_accepted, &what, d.secs, d.msgs_per_s, d.mb_per_s);
    let _ = writeln!(
        o,
        "{drain} (group {}, {} {consumers}): {drained}; {}",
        r.group,
        d.consumers,
        cpu_text(&d.cpu)
    );
}

/// `n what in secs = msgs/s, MB/s`.
fn rate(n: u64, what: &str, secs: f64, msgs_per_s: f64, mb_per_s: f64) -> String {
    format!("{n} {what} in {secs:.2} s = {msgs_per_s:.0} msgs/s, {mb_per_s:.1} MB/s")
}

/// The share door's part of the table.
fn render_share(o: &mut String, sh: &ShareResult, with_header: bool) {
    render_share_door(
        o,
        sh,
        with_header,
        ("share", "share drain"),
        ("native share consumers", "fetched+accepted"),
    );
    let d = &sh.drain;
    let f = &d.clients;
    let _ = writeln!(
        o,
        "  joined in {:.0} ms; {} ShareFetch ({} empty, {:.1} records each, {:.0} answer B/record), {} \
         ShareAcknowledge, {} heartbeats; consumers waited {:.0}% on fetches, {:.0}% on acknowledges; lock \
         {} ms; {} redeliveries; verified: {}",
        f.join_secs * 1e3,
        f.fetch_requests,
        f.empty_fetches,
        f.mean_fetch_batch,
        f.fetch_answer_bytes_per_message,
        f.acknowledge_requests,
        f.heartbeats,
        f.consumer_time_in_fetch * 100.0,
        f.consumer_time_in_ack * 100.0,
        f.acquisition_lock_timeout_ms
            .map_or("?".to_string(), |ms| ms.to_string()),
        d.redeliveries,
        if d.verified { "yes" } else { "NO" }
    );
    lat_row(o, "ShareFetch (non-empty)", &f.fetch_latency);
    lat_row(o, "ShareAcknowledge", &f.acknowledge_latency);
    lat_row(o, "fetch-to-ack", &f.fetch_to_ack);
    let _ = writeln!(
        o,
        "  fetch-to-ack per record: {:.1} µs (mean per batch ÷ mean batch)",
        f.fetch_to_ack_us_per_message
    );
    let per: Vec<String> = f
        .per_consumer
        .iter()
        .map(|c| format!("{:?}: {}", c.assigned_partitions, c.records_accepted))
        .collect();
    let _ = writeln!(
        o,
        "  per consumer (assigned partitions: records accepted): {}",
        per.join(", ")
    );
}

/// The confluent-kafka share drain's part of the table.
fn render_confluent(o: &mut String, c: &ConfluentResult, with_header: bool) {
    let d = &c.drain;
    let f = &d.clients;
    let consumers = format!("{} processes", f.client.as_deref().unwrap_or("confluent-kafka"));
    render_share_door(
        o,
        c,
        with_header,
        ("confluent", "confluent share drain"),
        (&consumers, "accepted"),
    );
    let _ = writeln!(
        o,
        "  start-up (spawn to first record) {:.2} s; {} polls with records ({:.1} records each); {} redeliveries; \
         {} client errors; verified: {}; per consumer accepted: {:?}",
        f.startup_secs,
        f.polls_with_records,
        f.mean_poll_batch,
        d.redeliveries,
        f.client_errors.len(),
        if d.verified { "yes" } else { "NO" },
        f.per_consumer_accepted
    );
}

fn render_text(r: &Report) -> String {
    let mut o = String::new();
    let p = &r.parameters;
    let _ = writeln!(o, "strand-queue-bench {} — {}", r.tool.version, r.date_utc);
    let _ = writeln!(o, "{}", host_line(&r.host, &r.data_dir));
    let _ = writeln!(
        o,
        "broker: {} {} ({}), pid {}, HTTP {}, Kafka {}",
        r.broker.kind,
        r.broker
            .binary
            .as_ref()
            .map_or("-".to_string(), |b| b.display().to_string()),
        r.broker.version.as_deref().unwrap_or("version unknown"),
        r.broker.pid.map_or("?".to_string(), |p| p.to_string()),
        r.broker.http,
        r.broker.kafka.as_deref().unwrap_or("-")
    );
    let _ = writeln!(
        o,
        "door: {}",
        match r.door {
            Door::Http => "http",
            Door::Share => "share (KIP-932)",
            Door::Both => "http, then share (KIP-932)",
        }
    );
    let _ = writeln!(
        o,
        "workload: queue {}, {} partitions; {} messages of {} B; {} publishers x {} per request; {} workers \
         x lease {} (wait {} ms, visibility {} ms) + one batch ack; steady {}",
        p.backlog.queue,
        p.backlog.partitions,
        p.backlog.messages,
        p.backlog.message_bytes,
        p.backlog.publishers,
        p.backlog.publish_batch,
        p.workers,
        p.lease_batch,
        p.lease_wait_ms,
        p.visibility_timeout_ms,
        if p.steady_secs > 0.0 {
            format!(
                "{:.0}% of the drain rate for {} s ({} per request)",
                p.steady_fraction * 100.0,
                p.steady_secs,
                p.steady_publish_batch
            )
        } else {
            "off".into()
        }
    );

    render_raw_limits(
        &mut o,
        &r.raw_parameters,
        &r.raw_limits,
        &r.data_dir,
        "a publish request's payload",
    );

    if let Some(res) = &r.result {
        latency_header(&mut o);
        let pb = &res.publish;
        let _ = writeln!(
            o,
            "publish: {}; {} requests ({:.0} request B/msg); {}",
            rate(pb.messages, "messages", pb.secs, pb.msgs_per_s, pb.mb_per_s),
            pb.requests,
            pb.request_bytes_per_message,
            cpu_text(&pb.cpu)
        );
        lat_row(&mut o, "publish request", &pb.request_latency);
        let _ = writeln!(o, "  per partition: {:?}", pb.per_partition);
        let d = &res.drain;
        let w = &d.workers;
        let _ = writeln!(
            o,
            "drain: {}; {}",
            rate(
                w.messages_acked,
                "messages leased+acked",
                d.secs,
                d.msgs_per_s,
                d.mb_per_s
            ),
            cpu_text(&d.cpu)
        );
        let _ = writeln!(
            o,
            "  {} leases ({} empty, {:.1} msgs each, {:.0} answer B/msg), {} batch acks; workers waited {:.0}% \
             on leases, {:.0}% on acks; verified: {}",
            w.lease_requests,
            w.empty_leases,
            w.mean_lease_batch,
            w.lease_answer_bytes_per_message,
            w.ack_requests,
            w.worker_time_in_lease * 100.0,
            w.worker_time_in_ack * 100.0,
            if d.verified { "yes" } else { "NO" }
        );
        lat_row(&mut o, "lease request", &w.lease_latency);
        lat_row(&mut o, "batch-ack request", &w.ack_latency);
        lat_row(&mut o, "lease-to-ack", &w.lease_to_ack);
        let _ = writeln!(
            o,
            "  lease-to-ack per message: {:.1} µs (mean per batch ÷ mean batch)",
            w.lease_to_ack_us_per_message
        );
        if let Some(s) = &res.steady {
            let sw = &s.workers;
            let _ = writeln!(
                o,
                "steady: target {:.0} msgs/s; published {} in {:.2} s = {:.0} msgs/s; acked {:.0} msgs/s in the \
                 window (+{:.2} s tail); {} batches late by > 1 interval (max lag {:.1} ms); verified: {}; {}",
                s.target_msgs_per_s,
                s.published,
                s.secs,
                s.publish_msgs_per_s,
                s.acked_msgs_per_s,
                s.tail_secs,
                s.late_batches,
                s.max_schedule_lag_ms,
                if s.verified { "yes" } else { "NO" },
                cpu_text(&s.cpu)
            );
            lat_row(&mut o, "end-to-end publish→lease", &s.end_to_end);
            lat_row(&mut o, "publish request", &s.publish_latency);
            lat_row(&mut o, "lease request", &sw.lease_latency);
            lat_row(&mut o, "batch-ack request", &sw.ack_latency);
            let _ = writeln!(
                o,
                "  {} leases ({} empty, {:.1} msgs each), {} batch acks",
                sw.lease_requests, sw.empty_leases, sw.mean_lease_batch, sw.ack_requests
            );
        }
    }

    if let Some(sh) = &r.share {
        render_share(&mut o, sh, r.result.is_none());
    }
    if let Some(c) = &r.share_confluent {
        render_confluent(&mut o, c, r.result.is_none() && r.share.is_none());
    }

    if let Some(x) = &r.ratios {
        let _ = writeln!(o, "\nratios (better raw figure of before/after)");
        let pb = human_bytes(x.publish_request_bytes);
        let pct = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{:.1}%", v * 100.0));
        let rows = [
            (
                format!("publish MB/s ÷ raw append+fdatasync MB/s at {pb}"),
                pct(x.publish_mb_per_s_vs_raw_disk),
            ),
            (
                format!("publish p99 ÷ fdatasync p99 at {pb}"),
                ratio(x.publish_p99_vs_fdatasync_p99),
            ),
            (
                "batch-ack p99 ÷ fdatasync 4 KiB p99".into(),
                ratio(x.ack_p99_vs_fdatasync_4k_p99),
            ),
            (
                "lease p99 ÷ fdatasync 4 KiB p99".into(),
                ratio(x.lease_p99_vs_fdatasync_4k_p99),
            ),
            (
                "lease-to-ack p50 ÷ fdatasync 4 KiB p50".into(),
                ratio(x.lease_to_ack_p50_vs_fdatasync_4k_p50),
            ),
            (
                format!(
                    "ack requests/s ÷ 4 KiB fdatasyncs/s ({})",
                    x.raw_fdatasyncs_per_s_4k
                        .map_or("-".into(), |v| format!("{v:.0}/s"))
                ),
                ratio(x.ack_requests_per_s_vs_fdatasyncs_per_s_4k),
            ),
            (
                "drain payload MB/s ÷ loopback MB/s".into(),
                pct(x.drain_mb_per_s_vs_loopback),
            ),
            (
                "steady e2e p99 ÷ fdatasync 4 KiB p99".into(),
                ratio(x.steady_e2e_p99_vs_fdatasync_4k_p99),
            ),
            (
                "share: ShareFetch p99 ÷ fdatasync 4 KiB p99".into(),
                ratio(x.share_fetch_p99_vs_fdatasync_4k_p99),
            ),
            (
                "share: drain payload MB/s ÷ loopback MB/s".into(),
                pct(x.share_drain_mb_per_s_vs_loopback),
            ),
        ];
        for (name, value) in rows {
            let _ = writeln!(o, "  {name:<52} {value:>10}");
        }
    }

    let m = &r.memory;
    let _ = writeln!(
        o,
        "\nbroker memory (RSS): start {}, queue created {}, after publish {}, after drain {}, after steady {}, \
         after share publish {}, after share drain {}, after confluent publish {}, after confluent drain {}, peak {}",
        mib(m.after_start),
        mib(m.queue_created),
        mib(m.after_publish),
        mib(m.after_drain),
        mib(m.after_steady),
        mib(m.after_share_publish),
        mib(m.after_share_drain),
        mib(m.after_confluent_publish),
        mib(m.after_confluent_drain),
        m.peak_hwm_kib
            .map_or("?".to_string(), |k| format!("{:.1} MiB", k as f64 / 1024.0))
    );
    let _ = writeln!(
        o,
        "broker CPU: {} s during the workload, {} s in total",
        r.broker_cpu
            .workload_cpu_seconds
            .map_or("?".to_string(), |s| format!("{s:.2}")),
        r.broker_cpu
            .total_cpu_seconds
            .map_or("?".to_string(), |s| format!("{s:.2}"))
    );
    let _ = writeln!(
        o,
        "\ntarget {}: {}",
        r.target.description,
        r.target.verdict("msgs")
    );
    if let Some(t) = &r.share_target {
        let vs_http = match (t.ratio_to_http_drain, t.http_drain_msgs_per_s) {
            (Some(x), Some(h)) => format!("; {x:.2}x the HTTP drain of this run ({h:.0} msgs/s)"),
            _ => "; no HTTP drain in this run to compare with".to_string(),
        };
        let _ = writeln!(
            o,
            "target {}: {}{}",
            t.target.description,
            t.target.verdict("records"),
            if t.target.measured_msgs_per_s.is_some() {
                vs_http
            } else {
                String::new()
            }
        );
        if let Some(c) = t.confluent_msgs_per_s {
            let _ = writeln!(
                o,
                "  confluent-kafka ShareConsumer: {c:.0} records/s ({:.0}% of the target){}",
                c / t.target.msgs_per_s * 100.0,
                t.confluent_ratio_to_http_drain
                    .map_or(String::new(), |x| format!(", {x:.2}x the HTTP drain"))
            );
        }
    }
    if let Some(e) = &r.error {
        let _ = writeln!(o, "\nFAILED: {e}");
    }
    for p in &r.problems {
        let _ = writeln!(o, "PROBLEM: {p}");
    }
    for w in &r.warnings {
        let _ = writeln!(o, "WARNING: {w}");
    }
    o
}
