//! `strand-restart-bench`: how soon a node holding many partitions serves again after a restart,
//! and what an idle partition costs in resident memory (issue 7: 10,000 partitions, ≤ 16 KiB per
//! idle partition, ready to serve in ≤ 3 s after a restart).
//!
//! One run: start `strand` on a fresh data directory, create the partitions (CreateTopics), write
//! a small batch to every partition (acks=all), then restart the broker twice on the same data:
//! after a clean stop (SIGTERM) and after a crash (SIGKILL, with a second batch per partition
//! still only in the shard journals). For each restart it measures, from the spawn of the new
//! process, when the broker wrote its ready file and when it was *ready to serve*: one Metadata
//! request lists every partition with a leader and ListOffsets (one request per topic, every
//! partition) returns exactly the offsets acknowledged before the restart. A sample of partitions
//! is then read back with Fetch and checked record by record. See BENCHMARKS.md.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::Parser;
use rdkafka::admin::{NewTopic, TopicReplication};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use serde::Serialize;

use strand_tools::broker::{
    binary_version, open_files_limit, BrokerProcess, Memory, OpenFilesLimit, Stopped,
};
use strand_tools::cli::{OutputArgs, RunDirArgs, SpawnArgs};
use strand_tools::host::{utc_now_rfc3339, FsInfo, HostInfo};
use strand_tools::report::{host_line, ClientInfo, ToolInfo};
use strand_tools::run::{exit_code, main_of, RunDir};
use strand_tools::workload::admin_client;

/// Open files the broker needs besides one per non-empty partition (journal files, listeners,
/// connections, the runtime's own descriptors), with room to spare.
const OPEN_FILES_HEADROOM: u64 = 1024;
/// Pause between two readiness checks that failed.
const PROBE_PAUSE: Duration = Duration::from_millis(5);
/// Longest one Metadata or ListOffsets call of a readiness check may wait.
const PROBE_CALL_TIMEOUT: Duration = Duration::from_secs(2);
/// Mismatches kept verbatim per check.
const MAX_KEPT_MISMATCHES: usize = 10;

const METHODOLOGY: &[&str] = &[
    "One broker process at a time, spawned by this tool on a fresh data directory; the restarts reuse \
     that directory and the first start's Kafka port (a fixed listeners= override), so the readiness \
     probe can connect before the new process has written its ready file.",
    "Idle memory per partition: (VmRSS once every partition has a leader in Metadata − VmRSS of the \
     empty node just after its first start) ÷ partitions, before any data is written (strand-bench's \
     definition). The same difference is also given after the first write round and after each \
     restart (against the same empty-node figure).",
    "Write round: every partition receives records_per_round records of record_bytes bytes (one \
     producer, acks=all, linger.ms=20, so one batch per partition); every record must be \
     acknowledged.",
    "Restart 1 (clean): SIGTERM, wait for the process to exit (it flushes and checkpoints), spawn \
     again. Before restart 2 a second write round is acknowledged and the broker is killed at once \
     with SIGKILL, so the second batch of every partition is recovered from the shard journals.",
    "Ready signal: from spawn (the moment the child process was started) until the ready file the \
     broker writes once every shard has opened its partitions (polled every 20 ms).",
    "Ready to serve: from spawn until a readiness check passes, checks running back to back from \
     spawn on (5 ms apart, a fresh librdkafka client per restart with reconnect backoff 5-20 ms). A \
     check is one Metadata request for all topics that must list every partition with a leader and \
     no error (metadata_complete marks this), then one ListOffsets (latest) request per topic \
     covering all its partitions, whose offsets must equal the acknowledged end offsets exactly. \
     list_offsets_secs is the ListOffsets part of the passing check (metadata_complete → ready to \
     serve); check_on_running_broker_secs is a whole check on the running broker before any restart, \
     with a fresh client: what the check itself costs when the broker is up.",
    "The verdict compares ready-to-serve of every restart with the target; the ready signal alone \
     does not count, since a broker may announce readiness before it answers correctly.",
    "After each restart, untimed: a sample of partitions (every sample_every-th) is read back from \
     offset 0 with Fetch and every record's offset and payload are compared with what was written.",
    "The data was just written: segment files are in the page cache, so this is a warm-cache \
     restart. A cold-cache restart (after a reboot or dropping caches) is not measured.",
    "The broker's own start-up time (startup_ms in its `strand is ready` log line) and its journal \
     replay line, if any, are copied from its log.",
];

#[derive(Parser, Debug)]
#[command(
    name = "strand-restart-bench",
    version,
    about = "Restart benchmark for Strand: creates many partitions, writes to all of them, restarts \
             the broker cleanly and after SIGKILL, and measures the time until it is ready to serve \
             (Metadata lists every partition, ListOffsets returns the acknowledged offsets), plus \
             resident memory per idle partition.",
    after_help = "Examples:\n  \
      strand-restart-bench --spawn target/release/strand --output restart.json\n  \
      strand-restart-bench --spawn target/release/strand --topics 10 --partitions-per-topic 100\n\n\
      The broker keeps one file open per non-empty partition: `ulimit -n` must exceed the partition \
      count (the tool checks before starting).",
    mut_arg("spawn", |a| a.required(true))
)]
struct Cli {
    #[command(flatten)]
    spawn: SpawnArgs,
    /// Topics to create.
    #[arg(long, default_value_t = 100, help_heading = "Workload")]
    topics: u32,
    /// Partitions of each topic (topics × partitions-per-topic partitions in all).
    #[arg(long, default_value_t = 100, help_heading = "Workload")]
    partitions_per_topic: i32,
    /// Records written to every partition per write round (one batch).
    #[arg(long, default_value_t = 10, help_heading = "Workload")]
    records_per_round: u32,
    /// Bytes per record payload (no key).
    #[arg(long, default_value_t = 100, help_heading = "Workload")]
    record_bytes: usize,
    /// After each restart, read back every N-th partition with Fetch and check its records.
    #[arg(long, value_name = "N", default_value_t = 100, help_heading = "Workload")]
    sample_every: usize,
    /// Target for ready to serve after a restart, in seconds.
    #[arg(long, value_name = "SECS", default_value_t = 3.0, help_heading = "Workload")]
    target_ready_secs: f64,
    /// Target for resident memory per idle partition, in KiB.
    #[arg(long, value_name = "KIB", default_value_t = 16.0, help_heading = "Workload")]
    target_kib_per_partition: f64,
    /// Run even if `ulimit -n` looks too low for the partition count (to see what the broker does).
    #[arg(long, help_heading = "Workload")]
    ignore_open_files_limit: bool,
    /// Seconds to wait for a start, a stop, topic creation, a write round or a read-back.
    #[arg(long, value_name = "SECS", default_value_t = 120.0, help_heading = "Workload")]
    timeout_secs: f64,

    #[command(flatten)]
    run_dir: RunDirArgs,
    #[command(flatten)]
    output: OutputArgs,
}

impl Cli {
    /// The `strand` binary (`--spawn` is required).
    fn binary(&self) -> Result<&Path> {
        self.spawn.spawn.as_deref().context("--spawn is required")
    }

    fn partitions(&self) -> u64 {
        u64::from(self.topics) * u64::try_from(self.partitions_per_topic).unwrap_or(0)
    }

    fn timeout(&self) -> Duration {
        Duration::from_secs_f64(self.timeout_secs)
    }
}

// ---------------------------------------------------------------------------------------------
// The report
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Serialize)]
struct Report {
    tool: ToolInfo,
    date_utc: String,
    client: ClientInfo,
    host: HostInfo,
    /// /proc/loadavg when the run started and when it ended: other work on the machine.
    load_average_before: Option<String>,
    load_average_after: Option<String>,
    data_dir: FsInfo,
    open_files_limit: Option<OpenFilesLimit>,
    broker: BrokerInfo,
    parameters: Parameters,
    methodology: Vec<String>,
    first_start: Option<FirstStart>,
    first_write: Option<FirstWrite>,
    restarts: Vec<Restart>,
    final_stop: Option<String>,
    verdict: Verdict,
    /// Wrong answers, lost data, an unclean stop: the run's figures cannot be trusted.
    problems: Vec<String>,
    warnings: Vec<String>,
    /// Why the run stopped early, if it did.
    error: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
struct BrokerInfo {
    binary: PathBuf,
    version: String,
    spawn_args: Vec<String>,
    /// The first start's command line (restarts add a fixed `listeners=` override).
    command: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
struct Parameters {
    topics: u32,
    partitions_per_topic: i32,
    partitions: u64,
    records_per_round: u32,
    record_bytes: usize,
    sample_every: usize,
    target_ready_secs: f64,
    target_kib_per_partition: f64,
    timeout_secs: f64,
}

#[derive(Debug, Clone, Serialize)]
struct FirstStart {
    /// Spawn → ready file, empty data directory.
    ready_signal_secs: f64,
    memory_empty: Memory,
    open_files_empty: Option<usize>,
    /// CreateTopics for all topics (requests of at most 10,000 partitions), until the answers.
    create_topics_secs: f64,
    /// CreateTopics sent → Metadata lists every partition with a leader.
    partitions_ready_secs: f64,
    memory_idle: Memory,
    open_files_idle: Option<usize>,
    /// (idle − empty) ÷ partitions.
    idle_kib_per_partition: f64,
}

/// Write round 1 on the first start, and the readiness check on the running broker.
#[derive(Debug, Clone, Serialize)]
struct FirstWrite {
    write: WriteRound,
    memory_after_write: Memory,
    open_files_after_write: Option<usize>,
    /// (after the write − empty) ÷ partitions.
    kib_per_partition_after_write: f64,
    /// The readiness check on the running broker with a fresh client: what the check itself costs.
    check_on_running_broker_secs: f64,
}

#[derive(Debug, Clone, Serialize)]
struct WriteRound {
    records: u64,
    bytes: u64,
    secs: f64,
    /// End offset every partition must have afterwards.
    end_offset: i64,
}

#[derive(Debug, Clone, Serialize)]
struct Restart {
    /// `clean` (SIGTERM) or `crash` (SIGKILL).
    kind: String,
    /// The write round acknowledged just before the stop, if any (the crash restart's).
    write_before_stop: Option<WriteRound>,
    stop: String,
    /// Signal → process reaped.
    stop_secs: f64,
    /// End offset every partition must have after the restart.
    expected_end_offset: i64,
    /// Spawn → ready file.
    ready_signal_secs: f64,
    /// Spawn → a Metadata answer listed every partition with a leader (in the passing check).
    metadata_complete_secs: f64,
    /// Spawn → the readiness check passed (Metadata complete and every ListOffsets exact).
    ready_to_serve_secs: f64,
    /// metadata_complete → ready to serve: the ListOffsets requests of the passing check.
    list_offsets_secs: f64,
    /// Checks that failed before one passed, and what the last one found.
    failed_checks: u64,
    last_failed_check: Option<String>,
    /// startup_ms from the broker's `strand is ready` log line.
    broker_startup_ms: Option<u64>,
    /// The broker's journal replay log line, if it replayed anything.
    journal_replay: Option<String>,
    /// Warnings and errors the broker logged during this start (the first few).
    broker_log_warnings: Vec<String>,
    broker_log_warning_count: usize,
    memory_at_ready: Memory,
    /// (at ready − empty node) ÷ partitions.
    kib_per_partition_at_ready: f64,
    open_files_at_ready: Option<usize>,
    read_back: Option<ReadBack>,
    target_met: bool,
    log: PathBuf,
}

#[derive(Debug, Clone, Serialize)]
struct ReadBack {
    partitions: usize,
    records: u64,
    secs: f64,
    mismatches: Vec<String>,
}

#[derive(Debug, Clone, Default, Serialize)]
struct Verdict {
    ready_target_secs: f64,
    /// The slowest restart's ready to serve; `None` if no restart was measured.
    worst_ready_to_serve_secs: Option<f64>,
    /// Every planned restart was measured and each was ready to serve within the target.
    ready_target_met: bool,
    kib_target: f64,
    idle_kib_per_partition: Option<f64>,
    kib_target_met: Option<bool>,
}

// ---------------------------------------------------------------------------------------------
// Main
// ---------------------------------------------------------------------------------------------

fn main() -> ExitCode {
    let cli = Cli::parse();
    main_of("strand-restart-bench", || run(cli))
}

fn run(cli: Cli) -> Result<ExitCode> {
    if cli.topics == 0 || cli.partitions_per_topic <= 0 || cli.records_per_round == 0 {
        bail!("--topics, --partitions-per-topic and --records-per-round must be positive");
    }
    if cli.sample_every == 0 {
        bail!("--sample-every must be positive");
    }
    if cli.timeout_secs.is_nan() || cli.timeout_secs <= 0.0 {
        bail!("--timeout-secs must be positive");
    }
    let partitions = cli.partitions();
    let limit = open_files_limit().ok();
    check_open_files(limit, partitions, cli.ignore_open_files_limit)?;

    let binary = cli.binary()?;
    let (run_dir, warnings) = RunDir::create(
        &cli.run_dir,
        "strand-restart-bench-",
        "recovery reads memory, not a disk; restart figures are optimistic",
    )?;
    let mut report = Report {
        tool: ToolInfo::of("strand-restart-bench"),
        date_utc: utc_now_rfc3339(),
        client: ClientInfo::librdkafka(),
        host: HostInfo::probe(),
        load_average_before: load_average(),
        load_average_after: None,
        data_dir: run_dir.fs.clone(),
        open_files_limit: limit,
        broker: BrokerInfo {
            binary: binary.to_path_buf(),
            version: binary_version(binary).unwrap_or_else(|e| format!("unknown ({e:#})")),
            spawn_args: cli.spawn.spawn_arg.clone(),
            command: Vec::new(),
        },
        parameters: Parameters {
            topics: cli.topics,
            partitions_per_topic: cli.partitions_per_topic,
            partitions,
            records_per_round: cli.records_per_round,
            record_bytes: cli.record_bytes,
            sample_every: cli.sample_every,
            target_ready_secs: cli.target_ready_secs,
            target_kib_per_partition: cli.target_kib_per_partition,
            timeout_secs: cli.timeout_secs,
        },
        methodology: METHODOLOGY.iter().map(|s| s.to_string()).collect(),
        first_start: None,
        first_write: None,
        restarts: Vec::new(),
        final_stop: None,
        verdict: Verdict::default(),
        problems: Vec::new(),
        warnings,
        error: None,
    };

    if let Err(e) = measure(&cli, run_dir.path(), &mut report) {
        report.error = Some(format!("{e:#}"));
    }
    report.load_average_after = load_average();
    report.verdict = verdict(&cli, &report);

    cli.output.emit(&render_text(&report), &report)?;
    let failed = report.error.is_some() || !report.problems.is_empty();
    run_dir.finish(cli.run_dir.keep_data || failed)?;
    Ok(exit_code(report.error.is_some(), failed))
}

/// Refuses to start when the broker would run out of file descriptors: it keeps the active
/// segment of every non-empty partition open, and it inherits this process's limit.
fn check_open_files(limit: Option<OpenFilesLimit>, partitions: u64, ignore: bool) -> Result<()> {
    let Some(OpenFilesLimit {
        soft: Some(soft),
        hard,
    }) = limit
    else {
        return Ok(()); // unlimited, or unknown
    };
    let needed = partitions + OPEN_FILES_HEADROOM;
    if soft >= needed || ignore {
        return Ok(());
    }
    let raise = match hard {
        Some(h) if h < needed => format!(
            "the hard limit ({h}) is below that too: raise it first (as root: `prlimit --nofile={needed}:{needed} \
             --pid $$`, or a `nofile` line in /etc/security/limits.conf and a new login), then `ulimit -n {needed}`"
        ),
        _ => format!("run `ulimit -n {needed}` (or higher) in this shell first"),
    };
    bail!(
        "the open-file limit is too low for {partitions} partitions: the broker keeps one file open per \
         non-empty partition (its active segment) and inherits this process's limit, so it needs about \
         {needed} (partitions + {OPEN_FILES_HEADROOM}), but `ulimit -n` is {soft}; {raise}. \
         Or pass fewer partitions, or --ignore-open-files-limit to see what the broker does"
    );
}

/// The whole measurement; the report keeps whatever was measured before an error.
fn measure(cli: &Cli, run_dir: &Path, report: &mut Report) -> Result<()> {
    let timeout = cli.timeout();
    let data = run_dir.join("data");
    let topics: Vec<String> = (0..cli.topics).map(|t| format!("restart-bench-{t:04}")).collect();
    let partitions = cli.partitions();

    // ---- First start, on an empty data directory ----
    let binary = cli.binary()?;
    progress(&format!("starting {} (empty data directory)", binary.display()));
    let first = BrokerProcess::spawn_strand_at(
        binary,
        &data,
        &run_dir.join("0-first-start"),
        &cli.spawn.spawn_arg,
        timeout,
    )?;
    report.broker.command = first.command.clone();
    let port = first
        .bootstrap
        .rsplit_once(':')
        .and_then(|(_, p)| p.parse::<u16>().ok())
        .with_context(|| format!("no port in the bootstrap address {}", first.bootstrap))?;
    let bootstrap = first.bootstrap.clone();
    let memory_empty = first.memory()?;
    let open_files_empty = first.open_files().ok();
    let ready_signal_secs = first.ready_after.as_secs_f64();

    progress(&format!(
        "creating {} topics × {} partitions",
        cli.topics, cli.partitions_per_topic
    ));
    let (create_topics_secs, partitions_ready_secs) =
        create_topics(&bootstrap, &topics, cli.partitions_per_topic, timeout)
            .map_err(|e| anyhow!("{e:#}{}", strip_ansi(&first.log_tail())))?;
    let memory_idle = first.memory()?;
    report.first_start = Some(FirstStart {
        ready_signal_secs,
        memory_empty,
        open_files_empty,
        create_topics_secs,
        partitions_ready_secs,
        memory_idle,
        open_files_idle: first.open_files().ok(),
        idle_kib_per_partition: kib_per_partition(memory_idle, memory_empty, partitions),
    });

    progress("write round 1: one batch per partition");
    let write = write_round(&bootstrap, &topics, cli, 0, timeout)
        .map_err(|e| anyhow!("{e:#}{}", strip_ansi(&first.log_tail())))?;
    let mut expected_end = write.end_offset;
    let memory_after_write = first.memory()?;
    let open_files_after_write = first.open_files().ok();
    let check_started = Instant::now();
    let pre = check_ready(
        &Probe::new(&bootstrap)?,
        &topics,
        cli.partitions_per_topic,
        expected_end,
    );
    let check_on_running_broker_secs = check_started.elapsed().as_secs_f64();
    if let Err(e) = pre {
        bail!(
            "the readiness check fails on the running broker before any restart: {e}{}",
            strip_ansi(&first.log_tail())
        );
    }
    report.first_write = Some(FirstWrite {
        write,
        memory_after_write,
        open_files_after_write,
        kib_per_partition_after_write: kib_per_partition(memory_after_write, memory_empty, partitions),
        check_on_running_broker_secs,
    });

    // Restarts bind the first start's port, so the probe knows where to go before the ready file.
    let mut restart_args = cli.spawn.spawn_arg.clone();
    restart_args.push("--override".into());
    restart_args.push(format!("listeners=PLAINTEXT://127.0.0.1:{port}"));
    let ctx = RestartCtx {
        cli,
        data: &data,
        topics: &topics,
        bootstrap: &bootstrap,
        args: &restart_args,
        memory_empty,
    };

    // ---- Restart 1: clean stop ----
    progress("restart 1: SIGTERM, wait for exit, start again");
    let stopped = first.terminate(timeout)?;
    if !stopped.by_sigterm || !stopped.status.success() {
        report.problems.push(format!(
            "the clean stop before restart 1 was not clean: {}",
            stopped.how
        ));
    }
    let (restart, broker) = ctx.restart(
        "clean",
        run_dir.join("1-restart-clean"),
        stopped,
        None,
        expected_end,
    )?;
    report.problems.extend(restart_problems(&restart));
    report.restarts.push(restart);

    // ---- Restart 2: crash, with a write round only in the journals ----
    progress("write round 2, then SIGKILL at once, start again");
    let write2 = write_round(&bootstrap, &topics, cli, 1, timeout)
        .map_err(|e| anyhow!("{e:#}{}", strip_ansi(&broker.log_tail())))?;
    expected_end = write2.end_offset;
    let stopped = broker.kill()?;
    let (restart, broker) = ctx.restart(
        "crash",
        run_dir.join("2-restart-crash"),
        stopped,
        Some(write2),
        expected_end,
    )?;
    report.problems.extend(restart_problems(&restart));
    report.restarts.push(restart);

    let mut broker = broker;
    if !broker.is_running() {
        report.problems.push(format!(
            "the broker exited before the final stop{}",
            strip_ansi(&broker.log_tail())
        ));
    }
    let stopped = broker.terminate(timeout)?;
    if !stopped.by_sigterm || !stopped.status.success() {
        report
            .problems
            .push(format!("the final stop was not clean: {}", stopped.how));
    }
    report.final_stop = Some(format!(
        "{} in {:.2} s",
        stopped.how,
        stopped.elapsed.as_secs_f64()
    ));
    Ok(())
}

fn restart_problems(r: &Restart) -> Vec<String> {
    let mut problems = Vec::new();
    if let Some(rb) = &r.read_back {
        for m in &rb.mismatches {
            problems.push(format!("{} restart, read-back: {m}", r.kind));
        }
    }
    problems
}

/// What every restart shares.
struct RestartCtx<'a> {
    cli: &'a Cli,
    data: &'a Path,
    topics: &'a [String],
    bootstrap: &'a str,
    args: &'a [String],
    memory_empty: Memory,
}

impl RestartCtx<'_> {
    /// Spawns the broker on the existing data and probes it until it is ready to serve.
    fn restart(
        &self,
        kind: &str,
        dir: PathBuf,
        stopped: Stopped,
        write_before_stop: Option<WriteRound>,
        expected_end: i64,
    ) -> Result<(Restart, BrokerProcess)> {
        let cli = self.cli;
        let timeout = cli.timeout();
        let probe = Probe::new(self.bootstrap)?;
        let spawn = {
            let (binary, data, dir, args) = (
                cli.binary()?.to_path_buf(),
                self.data.to_path_buf(),
                dir.clone(),
                self.args.to_vec(),
            );
            thread::spawn(move || BrokerProcess::spawn_strand_at(&binary, &data, &dir, &args, timeout))
        };
        let probing_since = Instant::now();
        let mut spawn = Some(spawn);
        let mut broker: Option<BrokerProcess> = None;
        let mut failed_checks = 0u64;
        let mut last_failed_check = None;
        let passed = loop {
            if spawn.as_ref().is_some_and(|h| h.is_finished()) {
                if let Some(h) = spawn.take() {
                    let started = h
                        .join()
                        .map_err(|_| anyhow!("the thread starting the broker panicked"))?;
                    broker = Some(started.with_context(|| format!("{kind} restart"))?);
                }
            }
            match check_ready(&probe, self.topics, cli.partitions_per_topic, expected_end) {
                Ok(metadata_done) => break (metadata_done, Instant::now()),
                Err(state) => {
                    failed_checks += 1;
                    last_failed_check = Some(state);
                }
            }
            if probing_since.elapsed() > timeout {
                bail!(
                    "{kind} restart: not ready to serve within {:.0} s; last check: {}{}",
                    cli.timeout_secs,
                    last_failed_check.unwrap_or_default(),
                    broker
                        .as_ref()
                        .map(|b| strip_ansi(&b.log_tail()))
                        .unwrap_or_default()
                );
            }
            thread::sleep(PROBE_PAUSE);
        };
        let (metadata_done, ready_at) = passed;
        let memory_at_ready = match &broker {
            Some(b) => b.memory().ok(),
            None => None,
        };
        let broker = match (broker, spawn) {
            (Some(b), _) => b,
            (None, Some(h)) => h
                .join()
                .map_err(|_| anyhow!("the thread starting the broker panicked"))?
                .with_context(|| format!("{kind} restart"))?,
            (None, None) => bail!("{kind} restart: lost track of the broker process"),
        };
        // Taken as soon as the pid is known if the check passed before the ready file was seen.
        let memory_at_ready = match memory_at_ready {
            Some(m) => m,
            None => broker.memory()?,
        };
        let open_files_at_ready = broker.open_files().ok();
        let since_spawn = |t: Instant| t.saturating_duration_since(broker.spawned_at).as_secs_f64();
        let ready_to_serve_secs = since_spawn(ready_at);
        let log = read_log_after_ready(&broker.log_path);
        progress(&format!(
            "{kind} restart: ready signal {:.2} s, ready to serve {ready_to_serve_secs:.2} s; reading back a sample",
            broker.ready_after.as_secs_f64()
        ));
        let read_back = read_back(self.bootstrap, self.topics, cli, expected_end);
        let read_back = match read_back {
            Ok(r) => Some(r),
            Err(e) => Some(ReadBack {
                partitions: 0,
                records: 0,
                secs: 0.0,
                mismatches: vec![format!("{e:#}")],
            }),
        };
        let restart = Restart {
            kind: kind.to_string(),
            write_before_stop,
            stop: stopped.how,
            stop_secs: stopped.elapsed.as_secs_f64(),
            expected_end_offset: expected_end,
            ready_signal_secs: broker.ready_after.as_secs_f64(),
            metadata_complete_secs: since_spawn(metadata_done),
            ready_to_serve_secs,
            list_offsets_secs: ready_at.duration_since(metadata_done).as_secs_f64(),
            failed_checks,
            last_failed_check,
            broker_startup_ms: log.startup_ms,
            journal_replay: log.journal_replay,
            broker_log_warnings: log.warnings,
            broker_log_warning_count: log.warning_count,
            memory_at_ready,
            kib_per_partition_at_ready: kib_per_partition(
                memory_at_ready,
                self.memory_empty,
                cli.partitions(),
            ),
            open_files_at_ready,
            read_back,
            target_met: ready_to_serve_secs <= cli.target_ready_secs,
            log: broker.log_path.clone(),
        };
        Ok((restart, broker))
    }
}

fn verdict(cli: &Cli, r: &Report) -> Verdict {
    let worst = r
        .restarts
        .iter()
        .map(|x| x.ready_to_serve_secs)
        .fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))));
    let idle = r.first_start.as_ref().map(|f| f.idle_kib_per_partition);
    Verdict {
        ready_target_secs: cli.target_ready_secs,
        worst_ready_to_serve_secs: worst,
        ready_target_met: r.restarts.len() == 2 && r.restarts.iter().all(|x| x.target_met),
        kib_target: cli.target_kib_per_partition,
        idle_kib_per_partition: idle,
        kib_target_met: idle.map(|k| k <= cli.target_kib_per_partition),
    }
}

fn kib_per_partition(now: Memory, empty: Memory, partitions: u64) -> f64 {
    (now.rss_kib as f64 - empty.rss_kib as f64) / partitions.max(1) as f64
}

fn progress(msg: &str) {
    eprintln!("strand-restart-bench: {msg}");
}

fn load_average() -> Option<String> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|s| s.trim().to_string())
}

// ---------------------------------------------------------------------------------------------
// Kafka clients
// ---------------------------------------------------------------------------------------------

/// Most partitions one CreateTopics may create (Kafka's bound, and Strand's default
/// `strand.max.partitions.per.request`).
const MAX_PARTITIONS_PER_REQUEST: i32 = 10_000;

fn create_topics(
    bootstrap: &str,
    topics: &[String],
    partitions: i32,
    timeout: Duration,
) -> Result<(f64, f64)> {
    let (admin, options) = admin_client(bootstrap, "strand-restart-bench-admin", timeout)?;
    // Kafka and Strand refuse a request creating more than 10,000 partitions: larger runs take
    // several requests, one after the other.
    let per_request = usize::try_from(MAX_PARTITIONS_PER_REQUEST / partitions.max(1))
        .unwrap_or(1)
        .max(1);
    let started = Instant::now();
    for chunk in topics.chunks(per_request) {
        let new: Vec<NewTopic<'_>> = chunk
            .iter()
            .map(|t| NewTopic::new(t, partitions, TopicReplication::Fixed(1)))
            .collect();
        let results = futures::executor::block_on(admin.create_topics(&new, &options))
            .with_context(|| format!("CreateTopics on {bootstrap}"))?;
        for result in results {
            if let Err((name, code)) = result {
                bail!("CreateTopics {name} on {bootstrap}: {code}");
            }
        }
    }
    let created = started.elapsed().as_secs_f64();
    let deadline = started + timeout;
    let probe = Probe::new(bootstrap)?;
    loop {
        let state = match metadata_complete(&probe, topics, partitions) {
            Ok(()) => return Ok((created, started.elapsed().as_secs_f64())),
            Err(state) => state,
        };
        if Instant::now() > deadline {
            bail!(
                "partitions not ready within {:.0} s: {state}",
                timeout.as_secs_f64()
            );
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// A consumer used for Metadata and ListOffsets only (never subscribes, never fetches).
struct Probe {
    consumer: BaseConsumer,
}

impl Probe {
    fn new(bootstrap: &str) -> Result<Self> {
        let consumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("client.id", "strand-restart-bench-probe")
            .set(
                "group.id",
                format!("strand-restart-bench-{}-probe", std::process::id()),
            )
            .set("enable.auto.commit", "false")
            // The broker is down or restarting at first: retry connections quickly.
            .set("reconnect.backoff.ms", "5")
            .set("reconnect.backoff.max.ms", "20")
            .set("retry.backoff.ms", "5")
            .set("retry.backoff.max.ms", "20")
            .create()
            .context("creating the probe client")?;
        Ok(Self { consumer })
    }
}

/// Whether one Metadata request lists every partition of `topics` with a leader and no error.
fn metadata_complete(probe: &Probe, topics: &[String], partitions: i32) -> Result<(), String> {
    let md = probe
        .consumer
        .fetch_metadata(None, PROBE_CALL_TIMEOUT)
        .map_err(|e| format!("Metadata: {e}"))?;
    let mut ready = 0u64;
    let mut first_issue = None;
    for name in topics {
        match md.topics().iter().find(|t| t.name() == name) {
            None => {
                first_issue.get_or_insert_with(|| format!("{name} missing"));
            }
            Some(t) if t.error().is_some() => {
                first_issue.get_or_insert_with(|| format!("{name}: {:?}", t.error()));
            }
            Some(t) => {
                if t.partitions().len() != partitions as usize {
                    first_issue
                        .get_or_insert_with(|| format!("{name} lists {} partitions", t.partitions().len()));
                }
                for p in t.partitions() {
                    if p.leader() >= 0 && p.error().is_none() && p.id() >= 0 && p.id() < partitions {
                        ready += 1;
                    } else {
                        first_issue.get_or_insert_with(|| {
                            format!("{name}/{}: leader {} error {:?}", p.id(), p.leader(), p.error())
                        });
                    }
                }
            }
        }
    }
    let total = topics.len() as u64 * partitions as u64;
    if ready == total && first_issue.is_none() {
        Ok(())
    } else {
        Err(format!(
            "Metadata: {ready} of {total} partitions with a leader ({})",
            first_issue.unwrap_or_default()
        ))
    }
}

/// The readiness check: Metadata complete, then ListOffsets (latest) for all partitions of each
/// topic, one request per topic, equal to `expected_end` everywhere. Returns when Metadata was
/// complete.
fn check_ready(
    probe: &Probe,
    topics: &[String],
    partitions: i32,
    expected_end: i64,
) -> Result<Instant, String> {
    metadata_complete(probe, topics, partitions)?;
    let metadata_done = Instant::now();
    for name in topics {
        let mut tpl = TopicPartitionList::with_capacity(partitions as usize);
        for p in 0..partitions {
            tpl.add_partition_offset(name, p, Offset::End)
                .map_err(|e| format!("building the ListOffsets request: {e}"))?;
        }
        let answer = probe
            .consumer
            .offsets_for_times(tpl, PROBE_CALL_TIMEOUT)
            .map_err(|e| format!("ListOffsets {name}: {e}"))?;
        let elements = answer.elements();
        if elements.len() != partitions as usize {
            return Err(format!(
                "ListOffsets {name}: {} partitions in the answer",
                elements.len()
            ));
        }
        for e in elements {
            if let Err(err) = e.error() {
                return Err(format!("ListOffsets {name}/{}: {err}", e.partition()));
            }
            if e.offset() != Offset::Offset(expected_end) {
                return Err(format!(
                    "ListOffsets {name}/{}: {:?}, expected {expected_end}",
                    e.partition(),
                    e.offset()
                ));
            }
        }
    }
    Ok(metadata_done)
}

/// Counts deliveries of a write round.
struct DeliveryCounter {
    acked: AtomicU64,
    failed: AtomicU64,
    first_error: Mutex<Option<String>>,
}

impl ClientContext for DeliveryCounter {}

impl ProducerContext for DeliveryCounter {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        match result {
            Ok(_) => {
                self.acked.fetch_add(1, Ordering::Relaxed);
            }
            Err((error, msg)) => {
                self.failed.fetch_add(1, Ordering::Relaxed);
                if let Ok(mut first) = self.first_error.lock() {
                    first.get_or_insert_with(|| format!("{}/{}: {error}", msg.topic(), msg.partition()));
                }
            }
        }
    }
}

/// The payload of record `index` of write round `round` to `topic`/`partition`: its identity,
/// padded to `bytes` (never shorter than the identity).
fn payload(topic: &str, partition: i32, round: u32, index: u32, bytes: usize) -> Vec<u8> {
    let mut p = format!("{topic}/{partition}/r{round}/i{index}/").into_bytes();
    if p.len() < bytes {
        p.resize(bytes, b'.');
    }
    p
}

/// Write round `round`: `records_per_round` records to every partition, acks=all; every record
/// must be acknowledged.
fn write_round(
    bootstrap: &str,
    topics: &[String],
    cli: &Cli,
    round: u32,
    timeout: Duration,
) -> Result<WriteRound> {
    let ctx = DeliveryCounter {
        acked: AtomicU64::new(0),
        failed: AtomicU64::new(0),
        first_error: Mutex::new(None),
    };
    let producer: ThreadedProducer<DeliveryCounter> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("client.id", "strand-restart-bench-writer")
        .set("acks", "all")
        .set("linger.ms", "20")
        .set("enable.idempotence", "false")
        .set("message.timeout.ms", timeout.as_millis().to_string())
        .create_with_context(ctx)
        .context("creating the producer")?;
    let started = Instant::now();
    let mut sent = 0u64;
    let mut bytes = 0u64;
    for topic in topics {
        for p in 0..cli.partitions_per_topic {
            for i in 0..cli.records_per_round {
                let value = payload(topic, p, round, i, cli.record_bytes);
                loop {
                    let record = BaseRecord::<(), [u8], ()>::to(topic).partition(p).payload(&value);
                    match producer.send(record) {
                        Ok(()) => break,
                        Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                            if started.elapsed() > timeout {
                                bail!("librdkafka's queue stayed full: the broker is not acknowledging");
                            }
                            thread::sleep(Duration::from_micros(500));
                        }
                        Err((e, _)) => return Err(anyhow!(e).context(format!("sending to {topic}/{p}"))),
                    }
                }
                sent += 1;
                bytes += value.len() as u64;
            }
        }
    }
    producer
        .flush(timeout.saturating_sub(started.elapsed()))
        .context("waiting for every record to be acknowledged")?;
    let secs = started.elapsed().as_secs_f64();
    let ctx = producer.context();
    let (acked, failed) = (
        ctx.acked.load(Ordering::Acquire),
        ctx.failed.load(Ordering::Acquire),
    );
    if acked != sent || failed > 0 {
        let first = ctx
            .first_error
            .lock()
            .ok()
            .and_then(|e| e.clone())
            .unwrap_or_default();
        bail!(
            "write round {}: {acked} of {sent} records acknowledged, {failed} failed (first: {first})",
            round + 1
        );
    }
    Ok(WriteRound {
        records: sent,
        bytes,
        secs,
        end_offset: i64::from(round + 1) * i64::from(cli.records_per_round),
    })
}

/// Reads every `sample_every`-th partition from offset 0 and compares each record with what
/// was written.
fn read_back(bootstrap: &str, topics: &[String], cli: &Cli, expected_end: i64) -> Result<ReadBack> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("client.id", "strand-restart-bench-reader")
        .set(
            "group.id",
            format!("strand-restart-bench-{}-reader", std::process::id()),
        )
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "false")
        .set("auto.offset.reset", "error")
        .create()
        .context("creating the read-back consumer")?;
    let mut tpl = TopicPartitionList::new();
    let mut sample = Vec::new();
    let ppt = cli.partitions_per_topic;
    for (t, topic) in topics.iter().enumerate() {
        for p in 0..ppt {
            let global = t * ppt as usize + p as usize;
            if global.is_multiple_of(cli.sample_every) {
                tpl.add_partition_offset(topic, p, Offset::Beginning)
                    .context("building the assignment")?;
                sample.push((topic.clone(), p));
            }
        }
    }
    consumer.assign(&tpl).context("assigning the sample partitions")?;
    let mut next: std::collections::HashMap<(String, i32), i64> =
        sample.iter().map(|k| (k.clone(), 0)).collect();
    let wanted = sample.len() as u64 * expected_end as u64;
    let mut records = 0u64;
    let mut mismatches = Vec::new();
    let started = Instant::now();
    let deadline = started + cli.timeout();
    let records_per_round = i64::from(cli.records_per_round);
    while records < wanted {
        if Instant::now() > deadline {
            let short: Vec<String> = next
                .iter()
                .filter(|(_, &n)| n < expected_end)
                .take(5)
                .map(|((t, p), n)| format!("{t}/{p} at {n}"))
                .collect();
            mismatches.push(format!(
                "read {records} of {wanted} records within {:.0} s (behind: {})",
                cli.timeout_secs,
                short.join(", ")
            ));
            break;
        }
        let Some(msg) = consumer.poll(Duration::from_millis(100)) else {
            continue;
        };
        let msg = msg.context("fetching the sample")?;
        let key = (msg.topic().to_string(), msg.partition());
        let Some(n) = next.get_mut(&key) else {
            mismatches.push(format!("a record of {}/{} that was not assigned", key.0, key.1));
            continue;
        };
        let offset = msg.offset();
        let problem = if offset != *n {
            Some(format!("offset {offset}, expected {n}"))
        } else if offset >= expected_end {
            Some(format!(
                "offset {offset} beyond the acknowledged end {expected_end}"
            ))
        } else {
            let round = u32::try_from(offset / records_per_round).unwrap_or(u32::MAX);
            let index = u32::try_from(offset % records_per_round).unwrap_or(u32::MAX);
            let want = payload(&key.0, key.1, round, index, cli.record_bytes);
            (msg.payload() != Some(want.as_slice())).then(|| format!("offset {offset}: payload differs"))
        };
        if let Some(p) = problem {
            if mismatches.len() < MAX_KEPT_MISMATCHES {
                mismatches.push(format!("{}/{}: {p}", key.0, key.1));
            }
        }
        *n = offset + 1;
        records += 1;
    }
    Ok(ReadBack {
        partitions: sample.len(),
        records,
        secs: started.elapsed().as_secs_f64(),
        mismatches,
    })
}

// ---------------------------------------------------------------------------------------------
// The broker's log
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Default)]
struct BrokerLog {
    startup_ms: Option<u64>,
    journal_replay: Option<String>,
    warnings: Vec<String>,
    warning_count: usize,
}

/// Reads the broker's log once its `strand is ready` line is there (it follows the ready file
/// closely; given up after a second).
fn read_log_after_ready(path: &Path) -> BrokerLog {
    let until = Instant::now() + Duration::from_secs(1);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let log = parse_broker_log(&text);
        if log.startup_ms.is_some() || Instant::now() > until {
            return log;
        }
        thread::sleep(Duration::from_millis(20));
    }
}

fn parse_broker_log(text: &str) -> BrokerLog {
    let mut log = BrokerLog::default();
    for line in text.lines().map(strip_ansi) {
        if line.contains("strand is ready") {
            log.startup_ms = field(&line, "startup_ms").and_then(|v| v.parse().ok());
        }
        if line.contains("replayed shard journals") {
            log.journal_replay = Some(line.trim().to_string());
        }
        if line.contains(" WARN ") || line.contains(" ERROR ") {
            log.warning_count += 1;
            if log.warnings.len() < MAX_KEPT_MISMATCHES {
                log.warnings.push(line.trim().to_string());
            }
        }
    }
    log
}

/// The value of `name=value` in a tracing log line.
fn field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let key = format!("{name}=");
    let start = line.find(&key)? + key.len();
    line[start..].split_whitespace().next()
}

/// Removes ANSI colour sequences (`ESC [ ... letter`).
fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// The table
// ---------------------------------------------------------------------------------------------

fn kib(k: u64) -> String {
    format!("{:.1} MiB", k as f64 / 1024.0)
}

fn opt_files(n: Option<usize>) -> String {
    n.map_or_else(|| "?".to_string(), |n| n.to_string())
}

fn met(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "MISSED"
    }
}

fn render_text(r: &Report) -> String {
    let mut o = String::new();
    let p = &r.parameters;
    let _ = writeln!(
        o,
        "strand-restart-bench {} — {} — {} — {} {}",
        r.tool.version, r.date_utc, r.broker.version, r.client.library, r.client.version
    );
    let _ = writeln!(o, "{}", host_line(&r.host, &r.data_dir));
    let _ = writeln!(
        o,
        "load (/proc/loadavg) at the start: {}; at the end: {}",
        r.load_average_before.as_deref().unwrap_or("?"),
        r.load_average_after.as_deref().unwrap_or("?"),
    );
    let limit = match r.open_files_limit {
        Some(OpenFilesLimit { soft, hard }) => {
            let show = |v: Option<u64>| v.map_or_else(|| "unlimited".to_string(), |v| v.to_string());
            format!("{} (hard {})", show(soft), show(hard))
        }
        None => "unknown".to_string(),
    };
    let _ = writeln!(
        o,
        "partitions: {} ({} topics × {}); per write round {} records × {} B per partition; ulimit -n {limit}",
        p.partitions, p.topics, p.partitions_per_topic, p.records_per_round, p.record_bytes
    );
    let _ = writeln!(o);
    if let Some(f) = &r.first_start {
        let _ = writeln!(
            o,
            "first start, empty        ready signal {:.2} s, RSS {}, {} open files",
            f.ready_signal_secs,
            kib(f.memory_empty.rss_kib),
            opt_files(f.open_files_empty)
        );
        let _ = writeln!(
            o,
            "create partitions         CreateTopics {:.2} s, all leaders in Metadata after {:.2} s",
            f.create_topics_secs, f.partitions_ready_secs
        );
        let _ = writeln!(
            o,
            "idle partitions           RSS {} → {:.1} KiB per partition (target ≤ {} KiB: {}), {} open files",
            kib(f.memory_idle.rss_kib),
            f.idle_kib_per_partition,
            p.target_kib_per_partition,
            met(f.idle_kib_per_partition <= p.target_kib_per_partition),
            opt_files(f.open_files_idle)
        );
    }
    if let Some(f) = &r.first_write {
        let _ = writeln!(
            o,
            "after write round 1       {} records in {:.2} s; RSS {} → {:.1} KiB per partition, {} open files",
            f.write.records,
            f.write.secs,
            kib(f.memory_after_write.rss_kib),
            f.kib_per_partition_after_write,
            opt_files(f.open_files_after_write)
        );
        let _ = writeln!(
            o,
            "readiness check alone     {:.2} s on the running broker (Metadata + {} ListOffsets, fresh client)",
            f.check_on_running_broker_secs, p.topics
        );
    }
    if r.first_start.is_some() {
        let _ = writeln!(o);
    }
    if !r.restarts.is_empty() {
        let _ = writeln!(
            o,
            "{:<16} {:>8} {:>9} {:>9} {:>9} {:>7} {:>9} {:>10} {:>9} {:>7}  ≤ {} s",
            "restart",
            "stop",
            "ready",
            "metadata",
            "ready to",
            "List-",
            "broker",
            "RSS",
            "KiB per",
            "open",
            p.target_ready_secs
        );
        let _ = writeln!(
            o,
            "{:<16} {:>8} {:>9} {:>9} {:>9} {:>7} {:>9} {:>10} {:>9} {:>7}",
            "", "", "signal", "complete", "serve", "Offsets", "startup", "at ready", "partition", "files"
        );
        for x in &r.restarts {
            let label = match x.kind.as_str() {
                "clean" => "clean (SIGTERM)",
                "crash" => "crash (SIGKILL)",
                other => other,
            };
            let _ = writeln!(
                o,
                "{:<16} {:>6.2} s {:>7.2} s {:>7.2} s {:>7.2} s {:>5.2} s {:>9} {:>10} {:>9.1} {:>7}  {}",
                label,
                x.stop_secs,
                x.ready_signal_secs,
                x.metadata_complete_secs,
                x.ready_to_serve_secs,
                x.list_offsets_secs,
                x.broker_startup_ms
                    .map_or_else(|| "?".to_string(), |ms| format!("{:.2} s", ms as f64 / 1000.0)),
                kib(x.memory_at_ready.rss_kib),
                x.kib_per_partition_at_ready,
                opt_files(x.open_files_at_ready),
                met(x.target_met)
            );
        }
        for x in &r.restarts {
            if let Some(rb) = &x.read_back {
                let _ = writeln!(
                    o,
                    "  {} restart: read back {} partitions, {} records in {:.2} s: {}",
                    x.kind,
                    rb.partitions,
                    rb.records,
                    rb.secs,
                    if rb.mismatches.is_empty() {
                        "all as written"
                    } else {
                        "MISMATCHES (see problems)"
                    }
                );
            }
            if let Some(j) = &x.journal_replay {
                let _ = writeln!(o, "  {} restart, broker log: {j}", x.kind);
            }
            if x.broker_log_warning_count > 0 {
                let _ = writeln!(
                    o,
                    "  {} restart: the broker logged {} warnings/errors, first: {}",
                    x.kind,
                    x.broker_log_warning_count,
                    x.broker_log_warnings.first().map_or("", String::as_str)
                );
            }
        }
        let _ = writeln!(o);
    }
    if let Some(s) = &r.final_stop {
        let _ = writeln!(o, "final stop: {s}");
    }
    let v = &r.verdict;
    let _ = writeln!(
        o,
        "verdict: ready to serve ≤ {} s with {} partitions: {}; idle memory ≤ {} KiB per partition: {}",
        v.ready_target_secs,
        p.partitions,
        match v.worst_ready_to_serve_secs {
            Some(w) if r.restarts.len() == 2 => format!("{} (worst {w:.2} s)", met(v.ready_target_met)),
            Some(w) => format!("not measured for every restart (worst so far {w:.2} s)"),
            None => "not measured".to_string(),
        },
        v.kib_target,
        match (v.kib_target_met, v.idle_kib_per_partition) {
            (Some(ok), Some(k)) => format!("{} ({k:.1} KiB)", met(ok)),
            _ => "not measured".to_string(),
        }
    );
    for w in &r.warnings {
        let _ = writeln!(o, "WARNING: {w}");
    }
    for pr in &r.problems {
        let _ = writeln!(o, "PROBLEM: {pr}");
    }
    if let Some(e) = &r.error {
        let _ = writeln!(o, "ERROR: {e}");
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_name_their_record_and_pad() {
        assert_eq!(payload("t", 3, 1, 7, 0), b"t/3/r1/i7/".to_vec());
        let p = payload("t", 3, 1, 7, 16);
        assert_eq!(p.len(), 16);
        assert!(p.starts_with(b"t/3/r1/i7/......"));
        assert_ne!(payload("t", 3, 1, 7, 16), payload("t", 3, 1, 8, 16));
    }

    #[test]
    fn broker_log_lines() {
        let text = "2025-01-01T00:00:00.1Z  INFO strand_broker::server: replayed shard journals files=2 applied=10000\n\
                    2025-01-01T00:00:00.2Z  WARN strand_broker::shard: something odd\n\
                    \u{1b}[2m2025\u{1b}[0m \u{1b}[32m INFO\u{1b}[0m strand_broker::server: strand is ready \
                    \u{1b}[3mshards\u{1b}[0m\u{1b}[2m=\u{1b}[0m2 \u{1b}[3mstartup_ms\u{1b}[0m\u{1b}[2m=\u{1b}[0m1234\n";
        let log = parse_broker_log(text);
        assert_eq!(log.startup_ms, Some(1234));
        assert!(log.journal_replay.unwrap().contains("applied=10000"));
        assert_eq!(log.warning_count, 1);
        assert!(log.warnings[0].contains("something odd"));
    }

    #[test]
    fn open_files_check() {
        let limit = |soft, hard| {
            Some(OpenFilesLimit {
                soft: Some(soft),
                hard: Some(hard),
            })
        };
        assert!(check_open_files(limit(20_000, 20_000), 10_000, false).is_ok());
        let low = check_open_files(limit(4096, 1 << 20), 10_000, false)
            .unwrap_err()
            .to_string();
        assert!(low.contains("ulimit -n 11024"), "{low}");
        let hard = check_open_files(limit(4096, 8192), 10_000, false)
            .unwrap_err()
            .to_string();
        assert!(hard.contains("hard limit (8192)"), "{hard}");
        assert!(check_open_files(limit(4096, 8192), 10_000, true).is_ok());
        assert!(check_open_files(None, 10_000, false).is_ok());
    }
}
