//! `strand-chaos`: the fault-injection harness. Starts `strand` nodes on 127.0.0.1 …
//! 127.0.0.N, writes to them with idempotent `acks=all` producers (or, `--workload queue`, runs
//! HTTP queue publishers and workers), kills, restarts or wipes them on a seeded schedule, then
//! checks every acknowledged record (every message, lease and ack) against what the nodes hold.
//! See `strand_tools::chaos` and BENCHMARKS.md.

use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Result;
use clap::Parser;
use serde::Serialize;

use strand_tools::broker::binary_version;
use strand_tools::chaos::harness::{self, Options, Report};
use strand_tools::chaos::plan::{Scenario, Timings};
use strand_tools::chaos::queue_run::{self, QueueOptions, QueueReport};
use strand_tools::cli::RunArgs;
use strand_tools::host::{utc_now_rfc3339, FsInfo, HostInfo};
use strand_tools::report::{host_line, ClientInfo, ToolInfo};
use strand_tools::run::{exit_code, main_of, RunDir};

#[derive(Parser, Debug)]
#[command(
    name = "strand-chaos",
    version,
    about = "Fault-injection harness for Strand: real nodes killed (SIGKILL), restarted (SIGTERM) \
             or wiped under idempotent acks=all load, on a seeded schedule; then a check of every \
             acknowledged record (lost, duplicated, reordered), of the replicas' bytes below the \
             high watermark, and of the client-visible unavailability after each kill.",
    after_help = "Examples:\n  \
      strand-chaos --strand-bin target/release/strand --scenario leader-kill --seed 1\n  \
      strand-chaos --strand-bin target/release/strand --scenario wiped-disk --cycles 1\n  \
      strand-chaos --strand-bin target/release/strand --nodes 3 --scenario rolling-restart\n  \
      strand-chaos --strand-bin target/release/strand --nodes 3 --workload queue --messages 100000\n\n\
      Exit status: 0 the checks passed, 1 violations or problems were found (the report lists \
      them; a wiped disk on one node must show losses), 2 the run could not be made."
)]
struct Cli {
    /// The strand binary to run as every node.
    #[arg(long, value_name = "PATH", env = "STRAND_BIN")]
    strand_bin: std::path::PathBuf,
    /// What to do to the nodes.
    #[arg(long, value_enum, default_value_t = Scenario::LeaderKill)]
    scenario: Scenario,
    /// What the clients do: `records` (idempotent producers; read back and compared with the
    /// replicas' segment files) or `queue` (HTTP publishers and workers on a queue: acks,
    /// nacks, delays, poison and abandoned leases, checked by a recorder).
    #[arg(long, value_enum, default_value_t = Workload::Records)]
    workload: Workload,
    /// Queue workload: messages to publish (the schedule stops once all are published).
    #[arg(long, default_value_t = 100_000)]
    messages: u64,
    /// Queue workload: worker threads leasing and settling.
    #[arg(long, default_value_t = 8)]
    workers: u32,
    /// Queue workload: the lease time workers ask for, ms.
    #[arg(long, default_value_t = 10_000)]
    visibility_timeout_ms: u64,
    /// The seed of the schedule (victims, timings) [default: from the clock, printed].
    #[arg(long)]
    seed: Option<u64>,
    /// Fault cycles [default: 20 for leader-kill, 2 rounds for rolling-restart, 3 for
    /// wiped-disk, 5 for isolate-leader].
    #[arg(long)]
    cycles: Option<u32>,
    /// Start no new cycle after this many seconds (the run then finishes and checks as usual).
    #[arg(long, value_name = "SECS")]
    duration: Option<f64>,
    /// Nodes (1: a standalone node; more: KRaft combined mode, the apache/kafka compose
    /// environment, topic replication factor min(nodes, 3)).
    #[arg(long, default_value_t = 1)]
    nodes: u32,
    /// Run each node in a network namespace of its own (10.213.x.<node>; needs root and
    /// iproute2), as isolate-leader requires; by default nodes listen on 127.0.0.<node>.
    #[arg(long)]
    netns: bool,
    /// Partitions of the topic.
    #[arg(long, default_value_t = 4)]
    partitions: i32,
    /// Idempotent producers (queue workload: publishers).
    #[arg(long, default_value_t = 2)]
    producers: u32,
    /// Records (queue workload: messages) per second over all producers [default: 400; 4000
    /// for the queue workload].
    #[arg(long)]
    rate: Option<u32>,
    /// Bytes per record payload (queue workload: per message).
    #[arg(long, default_value_t = 100)]
    record_bytes: usize,
    /// Load before each fault, ms: MIN,MAX (the seed draws from the range).
    #[arg(long, value_name = "MIN,MAX", value_delimiter = ',', default_values_t = [1000, 3000])]
    load_ms: Vec<u64>,
    /// How long a victim stays down before its restart, ms: MIN,MAX.
    #[arg(long, value_name = "MIN,MAX", value_delimiter = ',', default_values_t = [100, 1000])]
    down_ms: Vec<u64>,
    /// Extra argument of every node's every start (repeatable), e.g.
    /// --strand-arg=--override --strand-arg=strand.shards=1.
    #[arg(long, value_name = "ARG", allow_hyphen_values = true)]
    strand_arg: Vec<String>,
    /// How long a node may take to write its ready file (and the cluster to form), seconds.
    #[arg(long, value_name = "SECS", default_value_t = 60.0)]
    ready_timeout: f64,
    /// How long after a fault every partition the victim led may take to acknowledge a write
    /// again before the run reports a problem, seconds.
    #[arg(long, value_name = "SECS", default_value_t = 30.0)]
    recover_timeout: f64,
    /// Write every send and its outcome (acknowledged offset or error, with times in µs since
    /// the start) to this file, one JSON object a line (queue workload: every publish, lease
    /// and settle, and every dead letter).
    #[arg(long, value_name = "FILE")]
    history: Option<std::path::PathBuf>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Workload {
    Records,
    Queue,
}

#[derive(Serialize)]
#[serde(untagged)]
enum AnyReport {
    Records(Report),
    Queue(QueueReport),
}

impl AnyReport {
    fn failures(&self) -> u64 {
        match self {
            AnyReport::Records(r) => r.failures(),
            AnyReport::Queue(r) => r.failures(),
        }
    }

    fn render(&self) -> String {
        match self {
            AnyReport::Records(r) => r.render(),
            AnyReport::Queue(r) => r.render(),
        }
    }
}

#[derive(Serialize)]
struct JsonReport<'a> {
    tool: ToolInfo,
    started_at_utc: String,
    host: HostInfo,
    fs: FsInfo,
    client: ClientInfo,
    strand_bin: String,
    strand_version: Option<String>,
    warnings: Vec<String>,
    #[serde(flatten)]
    report: &'a AnyReport,
}

fn main() -> ExitCode {
    main_of("strand-chaos", run)
}

fn run() -> Result<ExitCode> {
    let cli = Cli::parse();
    let seed = cli.seed.unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
    });
    eprintln!("strand-chaos: seed {seed} (replay with --seed {seed})");
    let started_at_utc = utc_now_rfc3339();
    let strand_version = binary_version(&cli.strand_bin).ok();
    let (dir, warnings) = RunDir::create(
        &cli.run.run_dir,
        "strand-chaos-",
        "fdatasync persists nothing: a SIGKILL still loses nothing the kernel holds, but this is no disk",
    )?;
    let mut opts = Options::new(
        cli.strand_bin.clone(),
        dir.path().to_path_buf(),
        cli.scenario,
        seed,
        cli.nodes,
    );
    opts.cycles = cli.cycles.unwrap_or_else(|| cli.scenario.default_cycles());
    opts.duration = cli.duration.map(Duration::from_secs_f64);
    opts.netns = cli.netns;
    opts.history_path = cli.history.clone();
    opts.partitions = cli.partitions;
    opts.producers = cli.producers;
    opts.rate_per_sec = cli.rate.unwrap_or(match cli.workload {
        Workload::Records => 400,
        Workload::Queue => 4000,
    });
    opts.record_bytes = cli.record_bytes;
    let [load_min, load_max] = cli.load_ms[..] else {
        anyhow::bail!("--load-ms is MIN,MAX");
    };
    let [down_min, down_max] = cli.down_ms[..] else {
        anyhow::bail!("--down-ms is MIN,MAX");
    };
    opts.timings = Timings {
        load_ms: (load_min, load_max),
        down_ms: (down_min, down_max),
    };
    if opts.timings.load_ms.0 > opts.timings.load_ms.1 || opts.timings.down_ms.0 > opts.timings.down_ms.1 {
        anyhow::bail!("--load-ms and --down-ms are MIN,MAX with MIN <= MAX");
    }
    opts.strand_args = cli.strand_arg.clone();
    opts.ready_timeout = Duration::from_secs_f64(cli.ready_timeout);
    opts.recover_timeout = Duration::from_secs_f64(cli.recover_timeout);
    let show = cli.run.progress.show();
    let say = |line: &str| {
        if show {
            eprintln!("{line}");
        }
    };
    let result = match cli.workload {
        Workload::Records => harness::run(&opts, say).map(AnyReport::Records),
        Workload::Queue => {
            let q = QueueOptions {
                messages: cli.messages,
                workers: cli.workers,
                visibility_timeout_ms: cli.visibility_timeout_ms,
                ..QueueOptions::default()
            };
            queue_run::run(&opts, &q, say).map(AnyReport::Queue)
        }
    };
    let report = match result {
        Ok(r) => r,
        Err(e) => {
            // Keep the nodes' logs of a run that could not be made.
            dir.finish(true)?;
            return Err(e);
        }
    };
    let failed = report.failures() > 0;
    let host = HostInfo::probe();
    let mut text = report.render();
    text.push_str(&host_line(&host, &dir.fs));
    text.push('\n');
    for w in &warnings {
        text.push_str(&format!("WARNING: {w}\n"));
    }
    cli.run.output.emit(
        &text,
        &JsonReport {
            tool: ToolInfo::of("strand-chaos"),
            started_at_utc,
            host,
            fs: dir.fs.clone(),
            client: ClientInfo::librdkafka(),
            strand_bin: cli.strand_bin.display().to_string(),
            strand_version,
            warnings: warnings.clone(),
            report: &report,
        },
    )?;
    dir.finish(cli.run.run_dir.keep_data || failed)?;
    Ok(exit_code(false, failed))
}
