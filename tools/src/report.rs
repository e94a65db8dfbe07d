//! The benchmark report: one JSON document per run, and the same figures as a table.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::broker::Memory;
use crate::broker_metrics::PhaseHistogram;
use crate::host::{FsInfo, HostInfo};
use crate::latency::{human_us, LatencySummary};
use crate::raw::{DiskResult, LoopbackResult, PacedDiskResult};
use crate::workload::{Amount, CpuUsage, WorkloadParams, WorkloadResult};

/// Relative change of a raw figure between before and after that makes the run "noisy".
pub const RAW_DRIFT_TOLERANCE: f64 = 0.25;

/// How the figures were taken; copied into every report so that a JSON file explains itself.
pub const METHODOLOGY: &[&str] = &[
    "All brokers in one report ran the identical workload (same librdkafka build, same client \
     settings, same parameters) one after the other on the same machine, in the order listed.",
    "Warm-up (warmup_secs of producing) is excluded from every figure; the tail consumers must have \
     read all of it before the measured phase starts.",
    "Produce throughput counts acknowledged messages (payload bytes, MB = 10^6 bytes) from the phase \
     start to the last delivery report. Messages go round-robin over all partitions, no keys.",
    "Produce latency: from the send() call that librdkafka accepted to the delivery report. Time spent \
     waiting for room in librdkafka's local queue is not included (queue_full_waits counts it).",
    "End-to-end latency: from the send timestamp in the payload to the tail consumer's poll returning \
     the record (same process, monotonic clock). Tail consumers run during both produce phases.",
    "Peak-phase latencies include queueing in the client at saturation; the paced phase (a fixed \
     fraction of the peak throughput) is the one to read latency from.",
    "Consume throughput: fresh consumers assign every partition at offset 0 and read everything \
     produced (warm-up included), timed from the first record to the last, twice. The first read \
     catches up on the log as the broker kept it (in memory or on the disk, the broker's choice); \
     the second reads the log the first one warmed, and is the consume figure.",
    "Raw limits are measured before and after the brokers. Ratios use the better raw figure of the \
     two (the higher bandwidth, the lower fdatasync p99): the more demanding denominator.",
    "The produce ratio's raw bandwidth is the sustained one: append+fdatasync at the reference size \
     for as long as the produce phase runs (warm-up included). A disk behind a write cache takes a \
     burst faster than it sustains, so the short per-size figures overstate it; the ratio to the \
     2 s burst figure is reported beside it. Latency ratios use the burst run's fdatasync p99.",
    "CPU is in cores (CPU seconds per wall second) for this process (all client threads) and for the \
     broker process when its pid is known, over each phase including its flush. The busiest thread \
     of each is the one with the most CPU time over the phase (/proc/<pid>/task, sampled every \
     0.1 s; a thread that ends during the phase counts up to its last sample). Minor page faults \
     per second of each process over the phase come from /proc/<pid>/stat (minflt): pages mapped \
     in without the disk, mostly memory touched for the first time.",
    "Raw disk: a new file in the data directory, sequential write() of N bytes then fdatasync, \
     3 warm-up rounds excluded. Loopback: 1 MiB write()s over 127.0.0.1 TCP to a reader thread.",
    "Client ceiling (--peer-null): the same workload against strand-null-broker, which stores no \
     records (produce only advances offsets) and serves fetches by copying, per batch, the first \
     batch produced with the same record count and size, its base offset patched (the most \
     recent batches, 256 MiB, are served as produced, so tail consumers read real timestamps). \
     Its answers are bounded at 30 MiB, as Strand's fetch.max.bytes. The first broker's produce, \
     first read and consume throughput are divided by the null broker's, and its paced produce \
     p99 by the null broker's, whose paced phase runs at the first broker's paced rate.",
    "Targets (the first broker, each with its verdict, where the run measured what it needs): \
     produce ≥ 70 % of the raw sustained append+fdatasync bandwidth (raw limits measured); produce \
     and consume MB/s ≥ Tansu's, in memory (--peer-tansu); produce and consume (the second read) \
     ≥ 0.95 × the null broker's, and paced produce p99 ≤ 1.5 × the null broker's paced p99 \
     (--peer-null). The produce and consume targets hold at 1 and at 1,000 partitions; a run checks \
     its own. Consume / loopback and paced p99 / fdatasync p99 are information, not targets: they \
     lie beyond what the client reaches against the null broker.",
    "Broker histograms (a spawned Strand only): its /metrics scraped as the paced phase starts and \
     as it ends, the buckets differenced: Produce requests from arrival to answer, the durable \
     stage, flush rounds, segment and journal fsyncs (all shards added). Each quantile is shown as \
     the upper bound of the bucket holding it.",
    "Disk at the paced rate: right after the first broker, append+fdatasync at the reference size again, \
     each round starting on a fixed schedule at the first broker's paced rate (payload bytes; a \
     broker writes ~7% more with 1 KiB records' framing), for as long as a paced phase. The first \
     broker's paced produce p99 is divided by that run's write+fdatasync p99: the disk's own \
     latency at the same load, which back-to-back rounds need not show.",
];

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub tool: ToolInfo,
    pub date_utc: String,
    pub client: ClientInfo,
    pub host: HostInfo,
    pub data_dir: FsInfo,
    pub parameters: WorkloadParams,
    pub raw_parameters: RawParameters,
    pub methodology: Vec<String>,
    pub raw_limits: RawLimitsPair,
    pub brokers: Vec<BrokerReport>,
    /// Where the first broker stands against the targets the run could check.
    pub targets: Option<Targets>,
    pub warnings: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ToolInfo {
    pub name: String,
    pub version: String,
}

impl ToolInfo {
    /// The tool `name` of this build.
    pub fn of(name: &str) -> Self {
        Self {
            name: name.into(),
            version: env!("CARGO_PKG_VERSION").into(),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct ClientInfo {
    pub library: String,
    pub version: String,
    pub version_hex: String,
    pub binding: String,
}

impl ClientInfo {
    /// The librdkafka this process runs.
    pub fn librdkafka() -> Self {
        let (version_number, version) = rdkafka::util::get_rdkafka_version();
        Self {
            library: "librdkafka".into(),
            version,
            version_hex: format!("{version_number:#010x}"),
            binding: "rdkafka 0.39 (Rust)".into(),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct RawParameters {
    pub disk_write_sizes: Vec<u64>,
    /// The size ratios are computed against: the producer's batch.size.
    pub reference_write_bytes: u64,
    pub disk_secs_per_size: f64,
    /// Seconds of the sustained append+fdatasync run at the reference size (0: not run).
    pub sustained_secs: f64,
    pub loopback_secs: f64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct RawLimitsPair {
    pub before: Option<RawLimits>,
    pub after: Option<RawLimits>,
    /// Append+fdatasync at the reference size, paced at the first broker's paced rate (payload
    /// bytes per second), run once right after that broker: the disk's own latency at that load.
    pub paced: Option<PacedDiskResult>,
}

#[derive(Debug, Clone, Serialize)]
pub struct RawLimits {
    pub measured_at_utc: String,
    pub disk: Vec<DiskResult>,
    /// Append+fdatasync at the reference size for as long as the produce phase runs.
    pub sustained: Option<DiskResult>,
    pub loopback: LoopbackResult,
}

impl RawLimitsPair {
    fn all(&self) -> impl Iterator<Item = &RawLimits> {
        self.before.iter().chain(self.after.iter())
    }

    /// Best (highest) append+fdatasync MB/s at `bytes` across before/after.
    pub fn best_disk_mb_per_s(&self, bytes: u64) -> Option<f64> {
        self.disk_at(bytes).map(|d| d.mb_per_s).reduce(f64::max)
    }

    /// The denominator of produce / raw disk: the best sustained append+fdatasync MB/s across
    /// before/after where measured, else the best burst figure at `bytes`.
    pub fn produce_reference_mb_per_s(&self, bytes: u64) -> Option<f64> {
        self.all()
            .filter_map(|r| r.sustained.as_ref())
            .map(|d| d.mb_per_s)
            .reduce(f64::max)
            .or_else(|| self.best_disk_mb_per_s(bytes))
    }

    /// Best (lowest) fdatasync p99 at `bytes` across before/after.
    pub fn best_fdatasync_p99_us(&self, bytes: u64) -> Option<u64> {
        self.disk_at(bytes).map(|d| d.fdatasync.p99_us).min()
    }

    /// Best (highest) loopback MB/s across before/after.
    pub fn best_loopback_mb_per_s(&self) -> Option<f64> {
        self.all().map(|r| r.loopback.mb_per_s).reduce(f64::max)
    }

    /// The report's warning when raw figures moved by more than [`RAW_DRIFT_TOLERANCE`] between
    /// before and after.
    pub fn drift_warning(&self) -> Option<String> {
        let drift = self.drift(RAW_DRIFT_TOLERANCE);
        (!drift.is_empty()).then(|| {
            format!(
                "raw limits moved by more than {:.0}% between before and after ({}): the machine was not \
                 quiet, treat every figure of this run as noisy",
                RAW_DRIFT_TOLERANCE * 100.0,
                drift.join(", ")
            )
        })
    }

    /// Raw figures that moved by more than `tolerance` (relative) between before and after: a
    /// sign that something else was using the disk or the CPUs, and that every figure is noisy.
    pub fn drift(&self, tolerance: f64) -> Vec<String> {
        let (Some(before), Some(after)) = (&self.before, &self.after) else {
            return Vec::new();
        };
        let moved = |a: f64, b: f64| a.max(b) > 0.0 && (a - b).abs() / a.max(b) > tolerance;
        let mut out = Vec::new();
        for b in &before.disk {
            if let Some(a) = after.disk.iter().find(|a| a.write_bytes == b.write_bytes) {
                if moved(b.mb_per_s, a.mb_per_s) {
                    out.push(format!(
                        "append+fdatasync {}: {:.1} → {:.1} MB/s",
                        human_bytes(b.write_bytes),
                        b.mb_per_s,
                        a.mb_per_s
                    ));
                }
            }
        }
        if let (Some(b), Some(a)) = (&before.sustained, &after.sustained) {
            if moved(b.mb_per_s, a.mb_per_s) {
                out.push(format!(
                    "append+fdatasync {} sustained: {:.1} → {:.1} MB/s",
                    human_bytes(b.write_bytes),
                    b.mb_per_s,
                    a.mb_per_s
                ));
            }
        }
        if moved(before.loopback.mb_per_s, after.loopback.mb_per_s) {
            out.push(format!(
                "loopback: {:.2} → {:.2} GB/s",
                before.loopback.gb_per_s, after.loopback.gb_per_s
            ));
        }
        out
    }

    /// The append+fdatasync results at `bytes`, before and after.
    pub fn disk_at(&self, bytes: u64) -> impl Iterator<Item = &DiskResult> {
        self.all()
            .flat_map(move |r| r.disk.iter().filter(move |d| d.write_bytes == bytes))
    }
}

/// One broker's part of the report.
#[derive(Debug, Clone, Default, Serialize)]
pub struct BrokerReport {
    pub label: String,
    /// `spawned` (Strand, via its ready file), `command` (a peer started by a shell command) or
    /// `bootstrap` (already running).
    pub kind: String,
    pub bootstrap: Option<String>,
    pub binary: Option<PathBuf>,
    pub command: Option<Vec<String>>,
    pub version: Option<String>,
    pub pid: Option<u32>,
    pub log: Option<PathBuf>,
    pub memory: MemoryReport,
    pub stopped: Option<String>,
    pub result: Option<WorkloadResult>,
    pub ratios: Option<Ratios>,
    /// Failed or missing messages: the figures of a run with problems are not valid.
    pub problems: Vec<String>,
    /// Broker behaviour worth knowing that does not invalidate the figures.
    pub anomalies: Vec<String>,
    /// Why the run did not finish, if it did not.
    pub error: Option<String>,
    /// The broker's own latency histograms over the paced phase (a spawned Strand only).
    pub paced_histograms: Vec<PhaseHistogram>,
}

impl BrokerReport {
    pub fn new(label: impl Into<String>, kind: impl Into<String>) -> Self {
        Self {
            label: label.into(),
            kind: kind.into(),
            ..Self::default()
        }
    }
}

/// Resident memory of the broker process at each checkpoint (spawned or `--broker-pid` only).
#[derive(Debug, Clone, Default, Serialize)]
pub struct MemoryReport {
    pub after_start: Option<Memory>,
    pub topic_ready: Option<Memory>,
    pub after_produce: Option<Memory>,
    pub after_consume: Option<Memory>,
    /// See [`MemoryReport::compute_idle_kib_per_partition`].
    pub idle_kib_per_partition: Option<f64>,
}

impl MemoryReport {
    /// (RSS with the topic created − RSS after start) ÷ partitions, in KiB: what an idle
    /// partition costs before any data is written.
    pub fn compute_idle_kib_per_partition(&self, partitions: i32) -> Option<f64> {
        let (start, ready) = (self.after_start?, self.topic_ready?);
        (partitions > 0).then(|| (ready.rss_kib as f64 - start.rss_kib as f64) / f64::from(partitions))
    }

    pub fn peak_hwm_kib(&self) -> Option<u64> {
        [
            self.after_start,
            self.topic_ready,
            self.after_produce,
            self.after_consume,
        ]
        .iter()
        .flatten()
        .map(|m| m.hwm_kib)
        .max()
    }
}

/// Results divided by the machine's raw limits.
#[derive(Debug, Clone, Serialize)]
pub struct Ratios {
    pub reference_write_bytes: u64,
    /// Raw append+fdatasync MB/s at the reference size: the sustained figure where measured,
    /// else the burst one.
    pub raw_disk_mb_per_s: Option<f64>,
    /// The same from the short (burst) run.
    pub raw_disk_burst_mb_per_s: Option<f64>,
    pub raw_fdatasync_p99_us: Option<u64>,
    pub raw_loopback_mb_per_s: Option<f64>,
    /// produce MB/s ÷ `raw_disk_mb_per_s`.
    pub produce_vs_raw_disk: Option<f64>,
    /// produce MB/s ÷ `raw_disk_burst_mb_per_s`.
    pub produce_vs_raw_disk_burst: Option<f64>,
    /// consume MB/s ÷ loopback TCP MB/s.
    pub consume_vs_loopback: Option<f64>,
    /// produce p99 (peak phase) ÷ raw fdatasync p99 at the reference size.
    pub produce_p99_vs_fdatasync_p99: Option<f64>,
    /// produce p99 (paced phase) ÷ raw fdatasync p99 at the reference size.
    pub paced_p99_vs_fdatasync_p99: Option<f64>,
    /// p99 of a raw write+fdatasync round paced at this broker's paced rate (the first broker
    /// only: the rate the paced raw run used).
    pub raw_paced_round_p99_us: Option<u64>,
    /// produce p99 (paced phase) ÷ `raw_paced_round_p99_us`: how far above the disk's own
    /// latency at the same load.
    pub paced_p99_vs_disk_at_paced_rate: Option<f64>,
    /// produce MB/s ÷ the null broker's (`--peer-null`): the client's ceiling on this machine.
    pub produce_vs_client_ceiling: Option<f64>,
    /// consume MB/s (the second, warm read) ÷ the null broker's.
    pub consume_vs_client_ceiling: Option<f64>,
    /// first-read MB/s ÷ the null broker's.
    pub first_read_vs_client_ceiling: Option<f64>,
    /// produce p99 (paced phase) ÷ the null broker's, whose paced phase `strand-bench` runs at
    /// this broker's paced rate: the client's latency floor at that load.
    pub paced_p99_vs_client_floor: Option<f64>,
}

impl Ratios {
    pub fn compute(result: &WorkloadResult, raw: &RawLimitsPair, reference_write_bytes: u64) -> Self {
        let burst = raw.best_disk_mb_per_s(reference_write_bytes);
        let disk = raw.produce_reference_mb_per_s(reference_write_bytes);
        let sync_p99 = raw.best_fdatasync_p99_us(reference_write_bytes);
        let loopback = raw.best_loopback_mb_per_s();
        let div = |a: f64, b: Option<f64>| b.filter(|b| *b > 0.0).map(|b| a / b);
        let p99_ratio = |l: &LatencySummary| {
            if l.samples == 0 {
                None
            } else {
                div(l.p99_us as f64, sync_p99.map(|s| s as f64))
            }
        };
        Self {
            reference_write_bytes,
            raw_disk_mb_per_s: disk,
            raw_disk_burst_mb_per_s: burst,
            raw_fdatasync_p99_us: sync_p99,
            raw_loopback_mb_per_s: loopback,
            produce_vs_raw_disk: div(result.produce.mb_per_s, disk),
            produce_vs_raw_disk_burst: div(result.produce.mb_per_s, burst),
            consume_vs_loopback: result.consume.as_ref().and_then(|c| div(c.mb_per_s, loopback)),
            produce_p99_vs_fdatasync_p99: p99_ratio(&result.produce.latency),
            paced_p99_vs_fdatasync_p99: result.paced.as_ref().and_then(|p| p99_ratio(&p.latency)),
            raw_paced_round_p99_us: None,
            paced_p99_vs_disk_at_paced_rate: None,
            produce_vs_client_ceiling: None,
            consume_vs_client_ceiling: None,
            first_read_vs_client_ceiling: None,
            paced_p99_vs_client_floor: None,
        }
    }

    /// Fills the ratio to the disk's latency at the paced rate, from `paced`, the raw run paced
    /// at this broker's paced rate. Nothing without a paced phase or a round measured.
    pub fn add_disk_at_paced_rate(&mut self, result: &WorkloadResult, paced: &PacedDiskResult) {
        let round = &paced.write_and_fdatasync;
        let Some(p) = result.paced.as_ref().filter(|p| p.latency.samples > 0) else {
            return;
        };
        if round.samples == 0 || round.p99_us == 0 {
            return;
        }
        self.raw_paced_round_p99_us = Some(round.p99_us);
        self.paced_p99_vs_disk_at_paced_rate = Some(p.latency.p99_us as f64 / round.p99_us as f64);
    }

    /// Fills the client-ceiling ratios: `result` divided by `ceiling`, the same workload's
    /// figures against the null broker. A figure missing on either side (or a zero denominator)
    /// leaves its ratio `None`.
    pub fn add_client_ceiling(&mut self, result: &WorkloadResult, ceiling: &WorkloadResult) {
        let div = |a: Option<f64>, b: Option<f64>| a.zip(b.filter(|b| *b > 0.0)).map(|(a, b)| a / b);
        let paced_p99 = |w: &WorkloadResult| {
            w.paced
                .as_ref()
                .filter(|p| p.latency.samples > 0)
                .map(|p| p.latency.p99_us as f64)
        };
        self.produce_vs_client_ceiling = div(Some(result.produce.mb_per_s), Some(ceiling.produce.mb_per_s));
        self.consume_vs_client_ceiling = div(
            result.consume.as_ref().map(|c| c.mb_per_s),
            ceiling.consume.as_ref().map(|c| c.mb_per_s),
        );
        self.first_read_vs_client_ceiling = div(
            result.first_read.as_ref().map(|c| c.mb_per_s),
            ceiling.first_read.as_ref().map(|c| c.mb_per_s),
        );
        self.paced_p99_vs_client_floor = div(paced_p99(result), paced_p99(ceiling));
    }
}

/// Produce ≥ this fraction of the raw sustained append+fdatasync bandwidth.
pub const PRODUCE_VS_RAW_DISK_MIN: f64 = 0.70;
/// Produce and consume ≥ this fraction of the null broker's (the client's ceiling).
pub const CLIENT_CEILING_MIN: f64 = 0.95;
/// Paced produce p99 ≤ this multiple of the null broker's (the client's latency floor).
pub const CLIENT_FLOOR_MAX: f64 = 1.5;

/// One target the broker under test is held to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Target {
    /// `ratios.produce_vs_raw_disk` ≥ [`PRODUCE_VS_RAW_DISK_MIN`].
    ProduceVsRawDisk,
    /// Produce MB/s ≥ Tansu's (in memory).
    ProduceVsTansu,
    /// Consume MB/s ≥ Tansu's.
    ConsumeVsTansu,
    /// `ratios.produce_vs_client_ceiling` ≥ [`CLIENT_CEILING_MIN`].
    ProduceVsClientCeiling,
    /// `ratios.consume_vs_client_ceiling` ≥ [`CLIENT_CEILING_MIN`].
    ConsumeVsClientCeiling,
    /// `ratios.paced_p99_vs_client_floor` ≤ [`CLIENT_FLOOR_MAX`].
    PacedP99VsClientFloor,
}

/// Which side of its bound a target's ratio must be on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Bound {
    AtLeast,
    AtMost,
}

impl Target {
    /// The bound, and the ratio it applies to.
    pub fn bound(self) -> (Bound, f64) {
        match self {
            Target::ProduceVsRawDisk => (Bound::AtLeast, PRODUCE_VS_RAW_DISK_MIN),
            Target::ProduceVsTansu | Target::ConsumeVsTansu => (Bound::AtLeast, 1.0),
            Target::ProduceVsClientCeiling | Target::ConsumeVsClientCeiling => {
                (Bound::AtLeast, CLIENT_CEILING_MIN)
            }
            Target::PacedP99VsClientFloor => (Bound::AtMost, CLIENT_FLOOR_MAX),
        }
    }

    pub fn description(self) -> String {
        match self {
            Target::ProduceVsRawDisk => format!(
                "produce ≥ {:.0} % of raw append+fdatasync (sustained)",
                PRODUCE_VS_RAW_DISK_MIN * 100.0
            ),
            Target::ProduceVsTansu => "produce ≥ Tansu (memory)".into(),
            Target::ConsumeVsTansu => "consume ≥ Tansu (memory)".into(),
            Target::ProduceVsClientCeiling => format!("produce ≥ {CLIENT_CEILING_MIN} × the null broker"),
            Target::ConsumeVsClientCeiling => format!("consume ≥ {CLIENT_CEILING_MIN} × the null broker"),
            Target::PacedP99VsClientFloor => {
                format!("paced p99 ≤ {CLIENT_FLOOR_MAX} × the null broker's paced p99")
            }
        }
    }

    /// A ratio as the table shows it: the raw-disk one in percent, the others as multiples.
    fn show(self, ratio: f64) -> String {
        match self {
            Target::ProduceVsRawDisk => pct(ratio),
            // Three decimals: a ratio just below 0.95 must not read as 0.95.
            _ => format!("{ratio:.3}x"),
        }
    }
}

/// Where the broker under test stands against one target.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TargetCheck {
    pub target: Target,
    pub description: String,
    pub bound: Bound,
    pub limit: f64,
    /// The ratio measured in this run; `None` when a side of it was not measured.
    pub measured: Option<f64>,
    /// `None` when not measured.
    pub met: Option<bool>,
}

impl TargetCheck {
    pub fn new(target: Target, measured: Option<f64>) -> Self {
        let (bound, limit) = target.bound();
        Self {
            target,
            description: target.description(),
            bound,
            limit,
            measured,
            met: measured.map(|m| match bound {
                Bound::AtLeast => m >= limit,
                Bound::AtMost => m <= limit,
            }),
        }
    }
}

/// The targets the first broker of a run is held to, as far as the run measured what they need:
/// the raw disk (unless `--skip-raw`), Tansu (`--peer-tansu`), the null broker (`--peer-null`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Targets {
    /// The broker held to them.
    pub broker: String,
    /// The run's partitions: the produce and consume targets hold at 1 and at 1,000.
    pub partitions: i32,
    pub checks: Vec<TargetCheck>,
}

impl Targets {
    /// Checks `first` (its ratios filled in) against every target the run measured what it
    /// needs for: `raw_measured` for the raw disk, `tansu` and `null` the peers' parts of the
    /// report where they ran. `None` when there is none.
    pub fn check(
        first: &BrokerReport,
        partitions: i32,
        raw_measured: bool,
        tansu: Option<&BrokerReport>,
        null: Option<&BrokerReport>,
    ) -> Option<Self> {
        let ratio = |f: fn(&Ratios) -> Option<f64>| first.ratios.as_ref().and_then(f);
        let mut checks = Vec::new();
        if raw_measured {
            checks.push(TargetCheck::new(
                Target::ProduceVsRawDisk,
                ratio(|r| r.produce_vs_raw_disk),
            ));
        }
        if let Some(tansu) = tansu {
            let of = |b: &BrokerReport, f: fn(&WorkloadResult) -> Option<f64>| b.result.as_ref().and_then(f);
            let vs = |f: fn(&WorkloadResult) -> Option<f64>| {
                of(first, f)
                    .zip(of(tansu, f).filter(|t| *t > 0.0))
                    .map(|(a, b)| a / b)
            };
            checks.push(TargetCheck::new(
                Target::ProduceVsTansu,
                vs(|w| Some(w.produce.mb_per_s)),
            ));
            checks.push(TargetCheck::new(
                Target::ConsumeVsTansu,
                vs(|w| w.consume.as_ref().map(|c| c.mb_per_s)),
            ));
        }
        if null.is_some() {
            checks.push(TargetCheck::new(
                Target::ProduceVsClientCeiling,
                ratio(|r| r.produce_vs_client_ceiling),
            ));
            checks.push(TargetCheck::new(
                Target::ConsumeVsClientCeiling,
                ratio(|r| r.consume_vs_client_ceiling),
            ));
            checks.push(TargetCheck::new(
                Target::PacedP99VsClientFloor,
                ratio(|r| r.paced_p99_vs_client_floor),
            ));
        }
        (!checks.is_empty()).then(|| Self {
            broker: first.label.clone(),
            partitions,
            checks,
        })
    }

    fn render(&self, o: &mut String) {
        let _ = writeln!(
            o,
            "\ntargets for {} at {} partition{} (the produce and consume targets hold at 1 and at 1,000)",
            self.broker,
            self.partitions,
            if self.partitions == 1 { "" } else { "s" }
        );
        for c in &self.checks {
            let (measured, verdict) = match (c.measured, c.met) {
                (Some(m), Some(true)) => (c.target.show(m), "met"),
                (Some(m), _) => (c.target.show(m), "MISSED"),
                (None, _) => ("-".to_string(), "not measured"),
            };
            let _ = writeln!(o, "  {:<58} {measured:>10}  {verdict}", c.description);
        }
    }
}

/// Writes a tool's report: the JSON/// Writes a tool's report: the JSON to `output` if given, and to stdout either the text table or
/// (with `json`) the JSON, the table then going to stderr.
pub fn emit_report(
    text: &str,
    report: &impl Serialize,
    output: Option<&Path>,
    json: bool,
) -> anyhow::Result<()> {
    use anyhow::Context as _;
    use std::io::Write as _;
    let encoded = serde_json::to_string_pretty(report).context("encoding the JSON report")?;
    if let Some(path) = output {
        std::fs::write(path, format!("{encoded}\n"))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    let mut stdout = std::io::stdout().lock();
    if json {
        eprint!("{text}");
        writeln!(stdout, "{encoded}").context("writing to stdout")?;
    } else {
        write!(stdout, "{text}").context("writing to stdout")?;
    }
    if let Some(path) = output {
        eprintln!("JSON report written to {}", path.display());
    }
    Ok(())
}

/// Formats a byte count as `4 KiB`, `1 MiB`, or plain bytes.
pub fn human_bytes(b: u64) -> String {
    if b >= 1 << 20 && b.trailing_zeros() >= 20 {
        format!("{} MiB", b >> 20)
    } else if b >= 1 << 10 && b.trailing_zeros() >= 10 {
        format!("{} KiB", b >> 10)
    } else {
        format!("{b} B")
    }
}

/// The report's line about the machine and the run directory's file system.
pub fn host_line(host: &HostInfo, fs: &FsInfo) -> String {
    format!(
        "host: {} CPUs ({}), kernel {}, data dir {} on {} ({}{}){}",
        host.cpus_available,
        host.cpu_model,
        host.kernel,
        fs.path.display(),
        fs.fs_type,
        fs.source,
        fs.space_summary(),
        if fs.volatile {
            " — VOLATILE: fdatasync persists nothing here"
        } else {
            ""
        }
    )
}

/// The raw limits as a table, before and after side by side. `reference` says what the
/// reference write size (marked `*`) is.
pub fn render_raw_limits(
    o: &mut String,
    p: &RawParameters,
    raw: &RawLimitsPair,
    fs: &FsInfo,
    reference: &str,
) {
    // Wide enough for "1234.5 MB/s, p50 12.34 ms p99 123.45 ms".
    const CELL: usize = 40;
    let disk_cell = |d: &DiskResult| {
        format!(
            "{:.1} MB/s, p50 {} p99 {}",
            d.mb_per_s,
            human_us(d.fdatasync.p50_us),
            human_us(d.fdatasync.p99_us)
        )
    };
    let _ = writeln!(o, "\nRaw limits (data dir {}):", fs.fs_type);
    let _ = writeln!(o, "  {:<28} {:>CELL$} {:>CELL$}", "", "before", "after");
    let mut line = |name: String, cell: &dyn Fn(&RawLimits) -> Option<String>| {
        let cell = |l: &Option<RawLimits>| l.as_ref().and_then(cell).unwrap_or_else(|| "-".into());
        let _ = writeln!(
            o,
            "  {name:<28} {:>CELL$} {:>CELL$}",
            cell(&raw.before),
            cell(&raw.after)
        );
    };
    for &size in &p.disk_write_sizes {
        let mark = if size == p.reference_write_bytes { " *" } else { "" };
        line(format!("append+fdatasync {}{mark}", human_bytes(size)), &|l| {
            l.disk.iter().find(|d| d.write_bytes == size).map(disk_cell)
        });
    }
    if p.sustained_secs > 0.0 {
        line(
            format!("  same for {:.0} s (sustained) **", p.sustained_secs),
            &|l| l.sustained.as_ref().map(disk_cell),
        );
    }
    line("loopback TCP copy".into(), &|l| {
        Some(format!("{:.2} GB/s", l.loopback.gb_per_s))
    });
    let _ = writeln!(
        o,
        "  (* = reference size for ratios: {reference}, {:.0} s per size{}",
        p.disk_secs_per_size,
        if p.sustained_secs > 0.0 {
            ";\n   ** = as long as the produce phase: the denominator of produce / raw disk)"
        } else {
            ")"
        }
    );
    if let Some(p) = &raw.paced {
        let _ = writeln!(
            o,
            "  append+fdatasync {} paced at {:.1} MB/s (got {:.1}), the first broker's paced rate, right after it:\n    \
             fdatasync p50 {} p99 {}; write+fdatasync p50 {} p99 {} p99.9 {}",
            human_bytes(p.disk.write_bytes),
            p.target_mb_per_s,
            p.disk.mb_per_s,
            human_us(p.disk.fdatasync.p50_us),
            human_us(p.disk.fdatasync.p99_us),
            human_us(p.write_and_fdatasync.p50_us),
            human_us(p.write_and_fdatasync.p99_us),
            human_us(p.write_and_fdatasync.p999_us),
        );
    }
}

/// The report as a table for people.
pub fn render_text(r: &Report) -> String {
    let mut o = String::new();
    let p = &r.parameters;
    let _ = writeln!(
        o,
        "strand-bench {} — {} — {} {}",
        r.tool.version, r.date_utc, r.client.library, r.client.version
    );
    let _ = writeln!(o, "{}", host_line(&r.host, &r.data_dir));
    let amount = match p.amount {
        Amount::Messages(n) => format!("{n} messages"),
        Amount::DurationSecs(s) => format!("{s} s"),
    };
    let opt = |v: Option<u64>| v.map_or("default".to_string(), |v| v.to_string());
    let _ = writeln!(
        o,
        "workload: {} B messages, {amount} (+{} s warm-up, excluded), {} partitions, {} producers, \
         {} consumers, \
         acks={}, compression={}, linger.ms={}, batch.size={}, rate={}, paced phase={}",
        p.message_bytes,
        p.warmup_secs,
        p.partitions,
        p.producers,
        p.consumers,
        p.acks,
        p.compression,
        opt(p.linger_ms),
        opt(p.batch_size),
        p.rate.map_or("max".to_string(), |r| format!("{r:.0}/s")),
        if let (true, Some(r)) = (p.paced_fraction > 0.0, p.paced_rate) {
            format!("{r:.0}/s for {} s", p.paced_secs)
        } else if p.paced_fraction > 0.0 {
            format!("{:.0}% of peak for {} s", p.paced_fraction * 100.0, p.paced_secs)
        } else {
            "off".to_string()
        },
    );
    if !p.producer_props.is_empty() || !p.consumer_props.is_empty() {
        let _ = writeln!(
            o,
            "extra client properties: producer {:?}, consumer {:?}",
            p.producer_props, p.consumer_props
        );
    }

    render_raw_limits(
        &mut o,
        &r.raw_parameters,
        &r.raw_limits,
        &r.data_dir,
        "the producer batch.size",
    );

    // Brokers side by side.
    let width = 26;
    let mut rows: Vec<(String, Vec<String>)> = Vec::new();
    let mut row = |name: &str, f: &dyn Fn(&BrokerReport) -> Option<String>| {
        rows.push((
            name.to_string(),
            r.brokers
                .iter()
                .map(|b| f(b).unwrap_or_else(|| "-".into()))
                .collect(),
        ));
    };
    row("version", &|b| b.version.clone().or_else(|| b.bootstrap.clone()));
    row("topic ready", &|b| {
        b.result.as_ref().map(|w| format!("{:.2} s", w.topic_ready_secs))
    });
    row("produce msgs/s", &|b| {
        b.result.as_ref().map(|w| format!("{:.0}", w.produce.msgs_per_s))
    });
    row("produce MB/s", &|b| {
        b.result.as_ref().map(|w| format!("{:.1}", w.produce.mb_per_s))
    });
    row("produce latency p50", &|b| {
        b.result.as_ref().map(|w| human_us(w.produce.latency.p50_us))
    });
    row("  p90", &|b| {
        b.result.as_ref().map(|w| human_us(w.produce.latency.p90_us))
    });
    row("  p99", &|b| {
        b.result.as_ref().map(|w| human_us(w.produce.latency.p99_us))
    });
    row("  p99.9", &|b| {
        b.result.as_ref().map(|w| human_us(w.produce.latency.p999_us))
    });
    row("  max", &|b| {
        b.result.as_ref().map(|w| human_us(w.produce.latency.max_us))
    });
    cpu_rows(&mut row, "CPU client / broker", |w| Some(&w.produce.cpu));
    row("end-to-end p50 / p99", &|b| {
        b.result
            .as_ref()
            .and_then(|w| w.produce.end_to_end)
            .map(|e| pair(&e))
    });
    row("avg batch (bytes/msgs)", &|b| {
        let w = b.result.as_ref()?;
        Some(format!(
            "{:.0} / {:.1}",
            w.produce.avg_batch_bytes?, w.produce.avg_batch_messages?
        ))
    });
    row("paced: target msgs/s", &|b| {
        let p = b.result.as_ref()?.paced.as_ref()?;
        Some(format!("{:.0} (got {:.0})", p.target_rate?, p.msgs_per_s))
    });
    row("  produce p50 / p99", &|b| {
        Some(pair(&b.result.as_ref()?.paced.as_ref()?.latency))
    });
    row("  produce p99.9 / max", &|b| {
        let l = b.result.as_ref()?.paced.as_ref()?.latency;
        Some(format!("{} / {}", human_us(l.p999_us), human_us(l.max_us)))
    });
    row("  end-to-end p50 / p99", &|b| {
        Some(pair(&b.result.as_ref()?.paced.as_ref()?.end_to_end?))
    });
    // The broker's own histograms over the paced phase, where it exported them (bucket bounds).
    let mut measured: Vec<String> = Vec::new();
    for h in r.brokers.iter().flat_map(|b| &b.paced_histograms) {
        if !measured.contains(&h.label) {
            measured.push(h.label.clone());
        }
    }
    if !measured.is_empty() {
        row("  broker: p50 p99 max", &|b| {
            (!b.paced_histograms.is_empty()).then(String::new)
        });
    }
    for label in measured {
        row(&format!("    {label}"), &|b| {
            let h = b.paced_histograms.iter().find(|h| h.label == label)?;
            let le = |us: Option<u64>| us.map_or(">last".to_string(), |us| format!("≤{}", bucket_bound(us)));
            Some(format!(
                "{} {} {}",
                le(h.p50_le_us),
                le(h.p99_le_us),
                le(h.max_le_us)
            ))
        });
    }
    cpu_rows(&mut row, "  CPU client / broker", |w| {
        Some(&w.paced.as_ref()?.cpu)
    });
    row("first read MB/s", &|b| {
        Some(format!("{:.1}", b.result.as_ref()?.first_read.as_ref()?.mb_per_s))
    });
    cpu_rows(&mut row, "  CPU client / broker", |w| {
        Some(&w.first_read.as_ref()?.cpu)
    });
    row("consume msgs/s", &|b| {
        Some(format!("{:.0}", b.result.as_ref()?.consume.as_ref()?.msgs_per_s))
    });
    row("consume MB/s", &|b| {
        Some(format!("{:.1}", b.result.as_ref()?.consume.as_ref()?.mb_per_s))
    });
    cpu_rows(&mut row, "  CPU client / broker", |w| {
        Some(&w.consume.as_ref()?.cpu)
    });
    row("read back", &|b| {
        let c = b.result.as_ref()?.consume.as_ref()?;
        Some(format!("{} of {}", c.messages, c.expected_messages))
    });
    row("RSS after start", &|b| {
        b.memory.after_start.map(|m| mib(m.rss_kib))
    });
    row("RSS idle (topic ready)", &|b| {
        b.memory.topic_ready.map(|m| mib(m.rss_kib))
    });
    row("  idle KiB per partition", &|b| {
        b.memory.idle_kib_per_partition.map(|k| format!("{k:.1}"))
    });
    row("RSS after produce", &|b| {
        b.memory.after_produce.map(|m| mib(m.rss_kib))
    });
    row("RSS peak (VmHWM)", &|b| b.memory.peak_hwm_kib().map(mib));
    row("produce / raw disk", &|b| {
        b.ratios.as_ref()?.produce_vs_raw_disk.map(pct)
    });
    let burst_label = format!("  / raw disk, {:.0} s burst", r.raw_parameters.disk_secs_per_size);
    row(&burst_label, &|b| {
        let r = b.ratios.as_ref()?;
        // Only worth a line when it differs from the one above.
        r.raw_disk_mb_per_s
            .zip(r.raw_disk_burst_mb_per_s)
            .filter(|(s, b)| s != b)?;
        r.produce_vs_raw_disk_burst.map(pct)
    });
    row("consume / loopback", &|b| {
        b.ratios.as_ref()?.consume_vs_loopback.map(pct)
    });
    row("paced p99 / fdatasync p99", &|b| {
        b.ratios
            .as_ref()?
            .paced_p99_vs_fdatasync_p99
            .map(|x| format!("{x:.2}x"))
    });
    // Only when the disk was measured at the paced rate.
    if r.raw_limits.paced.is_some() {
        row("paced p99 / disk at that rate", &|b| {
            b.ratios
                .as_ref()?
                .paced_p99_vs_disk_at_paced_rate
                .map(|x| format!("{x:.2}x"))
        });
    }
    row("peak p99 / fdatasync p99", &|b| {
        b.ratios
            .as_ref()?
            .produce_p99_vs_fdatasync_p99
            .map(|x| format!("{x:.2}x"))
    });
    // Only when a null broker (--peer-null) ran against a broker under test.
    let ceiling = |b: &BrokerReport| {
        b.ratios.as_ref().is_some_and(|r| {
            r.produce_vs_client_ceiling.is_some()
                || r.consume_vs_client_ceiling.is_some()
                || r.first_read_vs_client_ceiling.is_some()
                || r.paced_p99_vs_client_floor.is_some()
        })
    };
    if r.brokers.iter().any(ceiling) {
        row("produce / client ceiling", &|b| {
            b.ratios.as_ref()?.produce_vs_client_ceiling.map(pct)
        });
        row("first read / client ceiling", &|b| {
            b.ratios.as_ref()?.first_read_vs_client_ceiling.map(pct)
        });
        row("consume / client ceiling", &|b| {
            b.ratios.as_ref()?.consume_vs_client_ceiling.map(pct)
        });
        row("paced p99 / client floor", &|b| {
            b.ratios
                .as_ref()?
                .paced_p99_vs_client_floor
                .map(|x| format!("{x:.2}x"))
        });
    }
    row("client warnings", &|b| {
        b.result.as_ref().map(|w| w.client_events.count.to_string())
    });

    let _ = writeln!(o);
    let _ = write!(o, "{:<28}", "");
    for b in &r.brokers {
        let _ = write!(o, " {:>width$}", truncate(&b.label, width));
    }
    let _ = writeln!(o);
    for (name, cells) in rows {
        let _ = write!(o, "{name:<28}");
        for c in cells {
            let _ = write!(o, " {:>width$}", truncate(&c, width));
        }
        let _ = writeln!(o);
    }
    if let Some(t) = &r.targets {
        t.render(&mut o);
    }
    for b in &r.brokers {
        if let Some(e) = &b.error {
            let _ = writeln!(o, "\n{}: FAILED: {e}", b.label);
        }
        for problem in &b.problems {
            let _ = writeln!(o, "{}: PROBLEM: {problem}", b.label);
        }
        for anomaly in &b.anomalies {
            let _ = writeln!(o, "{}: anomaly: {anomaly}", b.label);
        }
        if let Some(w) = &b.result {
            for e in w.client_events.first.iter().take(3) {
                let _ = writeln!(o, "{}: client: {}", b.label, truncate(e, 160));
            }
        }
    }
    for w in &r.warnings {
        let _ = writeln!(o, "WARNING: {w}");
    }
    o
}

/// A table row: its name, and each broker's cell (`None`: "-").
type Row<'a> = dyn FnMut(&str, &dyn Fn(&BrokerReport) -> Option<String>) + 'a;

/// The CPU rows of a phase (`cpu` picks it out of a broker's result): both processes' cores
/// (the row `name`), their busiest threads', their minor page faults.
fn cpu_rows(row: &mut Row<'_>, name: &str, cpu: fn(&WorkloadResult) -> Option<&CpuUsage>) {
    row(name, &|b| Some(cores(cpu(b.result.as_ref()?)?)));
    row("  busiest thread of each", &|b| {
        Some(busiest(cpu(b.result.as_ref()?)?))
    });
    row("  minor page faults/s", &|b| {
        Some(faults(cpu(b.result.as_ref()?)?))
    });
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

fn cores(c: &CpuUsage) -> String {
    let f = |x: Option<f64>| x.map_or("?".to_string(), |x| format!("{x:.2}"));
    format!("{} / {} cores", f(c.client_cores), f(c.broker_cores))
}

/// The busiest client and broker threads' cores (their names are in the JSON).
fn busiest(c: &CpuUsage) -> String {
    let f = |t: &Option<crate::host::ThreadCpu>| {
        t.as_ref().map_or("?".to_string(), |t| format!("{:.2}", t.cores))
    };
    format!(
        "{} / {} cores",
        f(&c.client_busiest_thread),
        f(&c.broker_busiest_thread)
    )
}

/// The client's and the broker's minor page faults per second, in thousands.
fn faults(c: &CpuUsage) -> String {
    let f = |x: Option<f64>| x.map_or("?".to_string(), |x| format!("{:.1}k", x / 1000.0));
    format!(
        "{} / {}",
        f(c.client_minor_faults_per_s),
        f(c.broker_minor_faults_per_s)
    )
}

fn pair(l: &LatencySummary) -> String {
    format!("{} / {}", human_us(l.p50_us), human_us(l.p99_us))
}

fn pct(x: f64) -> String {
    format!("{:.1}%", x * 100.0)
}

/// A histogram bucket's bound, short enough for two in a table cell: `250µs`, `7.5ms`, `75ms`.
fn bucket_bound(us: u64) -> String {
    if us < 1_000 {
        format!("{us}µs")
    } else if us < 1_000_000 {
        let ms = format!("{:.1}", us as f64 / 1e3);
        format!("{}ms", ms.strip_suffix(".0").unwrap_or(&ms))
    } else {
        format!("{:.1}s", us as f64 / 1e6)
    }
}

fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(max.saturating_sub(1)).collect();
        t.push('…');
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn disk(bytes: u64, mb: f64, p99: u64) -> DiskResult {
        DiskResult {
            write_bytes: bytes,
            rounds: 10,
            secs: 1.0,
            mb_per_s: mb,
            fdatasync: LatencySummary {
                samples: 10,
                p99_us: p99,
                ..Default::default()
            },
        }
    }

    fn raw(mb: f64, p99: u64, lo: f64) -> RawLimits {
        RawLimits {
            measured_at_utc: String::new(),
            disk: vec![disk(4096, mb / 10.0, p99 / 2), disk(1_000_000, mb, p99)],
            sustained: None,
            loopback: LoopbackResult {
                buffer_bytes: 1 << 20,
                bytes: 1,
                secs: 1.0,
                mb_per_s: lo,
                gb_per_s: lo / 1e3,
            },
        }
    }

    #[test]
    fn ratios_use_the_more_demanding_raw_figure() {
        let pair = RawLimitsPair {
            before: Some(raw(400.0, 2_000, 3_000.0)),
            after: Some(raw(500.0, 3_000, 2_500.0)),
            paced: None,
        };
        assert_eq!(pair.best_disk_mb_per_s(1_000_000), Some(500.0));
        assert_eq!(pair.best_fdatasync_p99_us(1_000_000), Some(2_000));
        assert_eq!(pair.best_fdatasync_p99_us(4096), Some(1_000));
        assert_eq!(pair.best_loopback_mb_per_s(), Some(3_000.0));
        assert_eq!(pair.best_disk_mb_per_s(12345), None);
    }

    #[test]
    fn the_produce_ratio_uses_the_sustained_figure_where_measured() {
        let mut before = raw(400.0, 2_000, 3_000.0);
        let after = raw(500.0, 3_000, 2_500.0);
        let pair = RawLimitsPair {
            before: Some(before.clone()),
            after: Some(after.clone()),
            paced: None,
        };
        assert_eq!(
            pair.produce_reference_mb_per_s(1_000_000),
            Some(500.0),
            "no sustained run: the burst"
        );
        before.sustained = Some(disk(1_000_000, 312.5, 9_000));
        let pair = RawLimitsPair {
            before: Some(before),
            after: Some(after),
            paced: None,
        };
        assert_eq!(pair.produce_reference_mb_per_s(1_000_000), Some(312.5));
        assert_eq!(pair.best_disk_mb_per_s(1_000_000), Some(500.0));
        assert_eq!(
            pair.best_fdatasync_p99_us(1_000_000),
            Some(2_000),
            "latency keeps the burst p99"
        );
        let mut a = pair.clone();
        a.after.as_mut().unwrap().sustained = Some(disk(1_000_000, 200.0, 9_000));
        assert_eq!(
            a.produce_reference_mb_per_s(1_000_000),
            Some(312.5),
            "the better of the two"
        );
        assert_eq!(a.drift(0.25).len(), 1, "{:?}", a.drift(0.25));
    }

    #[test]
    fn drift_is_reported_beyond_tolerance() {
        let pair = RawLimitsPair {
            before: Some(raw(400.0, 2_000, 3_000.0)),
            after: Some(raw(410.0, 3_000, 1_000.0)),
            paced: None,
        };
        let d = pair.drift(0.25);
        assert_eq!(d.len(), 1, "{d:?}");
        assert!(d[0].starts_with("loopback"));
        assert!(RawLimitsPair {
            before: None,
            after: Some(raw(1.0, 1, 1.0)),
            paced: None,
        }
        .drift(0.25)
        .is_empty());
    }

    fn produce_result(mb_per_s: f64, p99_us: u64) -> crate::workload::ProduceResult {
        crate::workload::ProduceResult {
            target_rate: None,
            sent: 1,
            acked: 1,
            failed: 0,
            first_error: None,
            bytes: 1,
            secs: 1.0,
            msgs_per_s: 1.0,
            mb_per_s,
            latency: LatencySummary {
                samples: 10,
                p99_us,
                ..Default::default()
            },
            end_to_end: None,
            queue_full_waits: 0,
            cpu: CpuUsage::default(),
            avg_batch_bytes: None,
            avg_batch_messages: None,
        }
    }

    fn consume_result(mb_per_s: f64) -> crate::workload::ConsumeResult {
        crate::workload::ConsumeResult {
            expected_messages: 1,
            messages: 1,
            bytes: 1,
            secs: 1.0,
            wall_secs: 1.0,
            msgs_per_s: 1.0,
            mb_per_s,
            cpu: CpuUsage::default(),
            offsets_from_watermarks: false,
            high_watermark_below_acked: 0,
            high_watermark_examples: Vec::new(),
        }
    }

    /// A run's figures: produce MB/s, paced p99, first read MB/s, consume MB/s.
    fn workload(produce: f64, paced_p99: u64, first_read: f64, consume: f64) -> WorkloadResult {
        WorkloadResult {
            topic: "t".into(),
            topic_ready_secs: 0.1,
            warmup: crate::workload::WarmupResult { acked: 1, secs: 1.0 },
            produce: produce_result(produce, 5_000),
            paced: Some(produce_result(produce / 2.0, paced_p99)),
            consume: Some(consume_result(consume)),
            first_read: Some(consume_result(first_read)),
            client_events: Default::default(),
        }
    }

    #[test]
    fn client_ceiling_ratios_divide_by_the_null_broker() {
        let strand = workload(300.0, 3_000, 450.0, 600.0);
        let null = workload(600.0, 1_000, 900.0, 800.0);
        let mut r = Ratios::compute(&strand, &RawLimitsPair::default(), 1_000_000);
        assert_eq!(r.produce_vs_client_ceiling, None, "not measured until added");
        r.add_client_ceiling(&strand, &null);
        assert_eq!(r.produce_vs_client_ceiling, Some(0.5));
        assert_eq!(r.first_read_vs_client_ceiling, Some(0.5));
        assert_eq!(r.consume_vs_client_ceiling, Some(0.75));
        assert_eq!(r.paced_p99_vs_client_floor, Some(3.0));
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["consume_vs_client_ceiling"], 0.75);
        // A figure missing on either side, or a zero denominator: no ratio (null in JSON).
        let mut partial = null.clone();
        partial.consume = None;
        partial.paced = None;
        partial.first_read.as_mut().unwrap().mb_per_s = 0.0;
        r.add_client_ceiling(&strand, &partial);
        assert_eq!(r.produce_vs_client_ceiling, Some(0.5));
        assert_eq!(
            (
                r.consume_vs_client_ceiling,
                r.first_read_vs_client_ceiling,
                r.paced_p99_vs_client_floor
            ),
            (None, None, None)
        );
        let json = serde_json::to_value(&r).unwrap();
        assert!(json["paced_p99_vs_client_floor"].is_null());
        assert!(json
            .as_object()
            .unwrap()
            .contains_key("paced_p99_vs_client_floor"));
    }

    /// The last two cells of the table row `name` in `text` (the last broker's first).
    fn last_two<'t>(text: &'t str, name: &str) -> Vec<&'t str> {
        text.lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no {name:?} line in\n{text}"))
            .split_whitespace()
            .rev()
            .take(2)
            .collect()
    }

    #[test]
    fn the_table_shows_client_ceiling_and_paced_disk_rows_only_when_measured() {
        let params = crate::workload::test_params();
        let mut strand = BrokerReport::new("strand", "spawned");
        strand.result = Some(workload(300.0, 3_000, 450.0, 600.0));
        let mut null = BrokerReport::new("null (client ceiling)", "command");
        null.result = Some(workload(600.0, 1_000, 900.0, 800.0));
        let mut report = Report {
            tool: ToolInfo {
                name: "strand-bench".into(),
                version: "0".into(),
            },
            date_utc: "now".into(),
            client: ClientInfo {
                library: "librdkafka".into(),
                version: "2".into(),
                version_hex: "0x0".into(),
                binding: "rdkafka".into(),
            },
            host: HostInfo::probe(),
            data_dir: crate::host::filesystem_of(Path::new(".")).unwrap(),
            parameters: params,
            raw_parameters: RawParameters {
                disk_write_sizes: vec![1_000_000],
                reference_write_bytes: 1_000_000,
                disk_secs_per_size: 2.0,
                sustained_secs: 0.0,
                loopback_secs: 2.0,
            },
            methodology: Vec::new(),
            raw_limits: RawLimitsPair::default(),
            brokers: vec![strand, null],
            targets: None,
            warnings: Vec::new(),
        };
        assert!(!render_text(&report).contains("/ client ceiling"));
        let mut ratios = Ratios::compute(
            report.brokers[0].result.as_ref().unwrap(),
            &RawLimitsPair::default(),
            1_000_000,
        );
        ratios.add_client_ceiling(
            report.brokers[0].result.as_ref().unwrap(),
            report.brokers[1].result.as_ref().unwrap(),
        );
        report.brokers[0].ratios = Some(ratios);
        let text = render_text(&report);
        assert_eq!(last_two(&text, "produce / client ceiling"), vec!["-", "50.0%"]);
        assert_eq!(last_two(&text, "first read / client ceiling"), vec!["-", "50.0%"]);
        assert_eq!(last_two(&text, "consume / client ceiling"), vec!["-", "75.0%"]);
        assert_eq!(last_two(&text, "paced p99 / client floor"), vec!["-", "3.00x"]);
        assert!(!text.contains("disk at that rate") && !text.contains("paced at"));

        // The disk at the paced rate: its line under the raw limits, and the first broker's ratio.
        let paced = PacedDiskResult {
            target_mb_per_s: 150.0,
            disk: disk(1_000_000, 149.9, 900),
            write_and_fdatasync: LatencySummary {
                samples: 100,
                p50_us: 1_000,
                p99_us: 1_500,
                ..Default::default()
            },
        };
        report.raw_limits.paced = Some(paced.clone());
        let (strand_result, null_result) = (
            report.brokers[0].result.clone().unwrap(),
            report.brokers[1].result.clone().unwrap(),
        );
        let ratios = report.brokers[0].ratios.as_mut().unwrap();
        ratios.add_disk_at_paced_rate(&null_result, &paced);
        assert_eq!(ratios.paced_p99_vs_disk_at_paced_rate, Some(1_000.0 / 1_500.0));
        ratios.add_disk_at_paced_rate(&strand_result, &paced);
        assert_eq!(ratios.raw_paced_round_p99_us, Some(1_500));
        assert_eq!(ratios.paced_p99_vs_disk_at_paced_rate, Some(2.0));
        let text = render_text(&report);
        assert!(text.contains("paced at 150.0 MB/s"), "{text}");
        assert!(text.contains("write+fdatasync p50 1.00 ms p99 1.50 ms"), "{text}");
        assert_eq!(
            last_two(&text, "paced p99 / disk at that rate"),
            vec!["-", "2.00x"]
        );

        // The broker's own histograms over the paced phase: a row each, for the brokers that
        // exported them.
        assert!(!text.contains("  broker: "), "{text}");
        assert!(!text.contains("    Produce request"), "{text}");
        report.brokers[0].paced_histograms = vec![PhaseHistogram {
            name: "strand_kafka_request_duration_seconds".into(),
            label: "Produce request".into(),
            samples: 100,
            p50_le_us: Some(2_000),
            p99_le_us: Some(250_000),
            p999_le_us: None,
            max_le_us: None,
        }];
        let text = render_text(&report);
        // A heading row, blank for the broker that has the rows and "-" for the other.
        assert_eq!(last_two(&text, "  broker: p50 p99 max"), vec!["-", "max"]);
        let row = text
            .lines()
            .find(|l| l.starts_with("    Produce request"))
            .unwrap_or_else(|| panic!("no broker row in\n{text}"));
        assert!(row.contains(" ≤2ms ≤250ms >last "), "{row}");
        assert!(row.trim_end().ends_with('-'), "{row}");
    }

    /// The first broker of a run with `strand`'s figures, its ratios to `raw` and to `null`'s.
    fn first_broker(
        strand: WorkloadResult,
        raw: &RawLimitsPair,
        null: Option<&BrokerReport>,
    ) -> BrokerReport {
        let mut ratios = Ratios::compute(&strand, raw, 1_000_000);
        if let Some(c) = null.and_then(|n| n.result.as_ref()) {
            ratios.add_client_ceiling(&strand, c);
        }
        let mut b = BrokerReport::new("strand", "spawned");
        b.result = Some(strand);
        b.ratios = Some(ratios);
        b
    }

    fn peer(label: &str, result: WorkloadResult) -> BrokerReport {
        let mut b = BrokerReport::new(label, "command");
        b.result = Some(result);
        b
    }

    /// (target, measured ratio, met) of every check.
    fn verdicts(t: &Targets) -> Vec<(Target, Option<f64>, Option<bool>)> {
        t.checks.iter().map(|c| (c.target, c.measured, c.met)).collect()
    }

    #[test]
    fn targets_hold_the_first_broker_to_their_bounds() {
        let raw = RawLimitsPair {
            before: Some(RawLimits {
                sustained: Some(disk(1_000_000, 400.0, 9_000)),
                ..raw(500.0, 2_000, 3_000.0)
            }),
            after: None,
            paced: None,
        };
        // Produce MB/s, paced p99 µs, first read MB/s, consume MB/s.
        let null = peer("null (client ceiling)", workload(290.0, 2_000, 900.0, 800.0));
        let tansu = peer("tansu (memory)", workload(100.0, 9_000, 300.0, 700.0));
        let strand = first_broker(workload(280.0, 3_000, 450.0, 600.0), &raw, Some(&null));
        let t = Targets::check(&strand, 1000, true, Some(&tansu), Some(&null)).unwrap();
        assert_eq!((t.broker.as_str(), t.partitions), ("strand", 1000));
        assert_eq!(
            verdicts(&t),
            vec![
                // 280 ÷ 400 sustained (not the 500 burst): on the bound, met.
                (Target::ProduceVsRawDisk, Some(0.7), Some(true)),
                (Target::ProduceVsTansu, Some(2.8), Some(true)),
                (Target::ConsumeVsTansu, Some(600.0 / 700.0), Some(false)),
                (Target::ProduceVsClientCeiling, Some(280.0 / 290.0), Some(true)),
                (Target::ConsumeVsClientCeiling, Some(0.75), Some(false)),
                // 3 ms ÷ 2 ms: on the bound, met.
                (Target::PacedP99VsClientFloor, Some(1.5), Some(true)),
            ]
        );

        // Just across each bound.
        let null = peer("null (client ceiling)", workload(290.0, 1_999, 900.0, 631.0));
        let strand = first_broker(workload(275.0, 3_000, 450.0, 600.0), &raw, Some(&null));
        let t = Targets::check(&strand, 1, true, None, Some(&null)).unwrap();
        let met: Vec<_> = t.checks.iter().map(|c| (c.target, c.met)).collect();
        assert_eq!(
            met,
            vec![
                (Target::ProduceVsRawDisk, Some(false)),
                (Target::ProduceVsClientCeiling, Some(false)),
                (Target::ConsumeVsClientCeiling, Some(true)),
                (Target::PacedP99VsClientFloor, Some(false)),
            ]
        );
        let text = {
            let mut o = String::new();
            t.render(&mut o);
            o
        };
        assert!(text.contains("targets for strand at 1 partition "), "{text}");
        let row = |name: &str| {
            text.lines()
                .find(|l| l.trim_start().starts_with(name))
                .unwrap_or_else(|| panic!("no {name:?} row in\n{text}"))
                .split_whitespace()
                .rev()
                .take(2)
                .collect::<Vec<_>>()
        };
        assert_eq!(row("produce ≥ 70 % of raw"), vec!["MISSED", "68.8%"]);
        assert_eq!(row("produce ≥ 0.95 × the null broker"), vec!["MISSED", "0.948x"]);
        assert_eq!(row("consume ≥ 0.95 × the null broker"), vec!["met", "0.951x"]);
        assert_eq!(
            row("paced p99 ≤ 1.5 × the null broker's"),
            vec!["MISSED", "1.501x"]
        );
        let json = serde_json::to_value(&t).unwrap();
        assert_eq!(json["checks"][1]["target"], "produce_vs_client_ceiling");
        assert_eq!(json["checks"][1]["bound"], "at_least");
        assert_eq!(json["checks"][1]["limit"], 0.95);
        assert_eq!(json["checks"][3]["bound"], "at_most");
        assert_eq!(json["checks"][3]["met"], false);
    }

    #[test]
    fn the_methodology_states_the_bounds_the_verdicts_use() {
        let targets = METHODOLOGY
            .iter()
            .find(|m| m.starts_with("Targets"))
            .expect("a methodology line on the targets");
        for bound in [
            format!("{:.0} % of the raw", PRODUCE_VS_RAW_DISK_MIN * 100.0),
            format!("≥ {CLIENT_CEILING_MIN} × the null broker"),
            format!("≤ {CLIENT_FLOOR_MAX} × the null broker"),
        ] {
            assert!(targets.contains(&bound), "{bound:?} not in {targets:?}");
        }
    }

    #[test]
    fn targets_are_checked_only_where_the_run_measured_them() {
        let strand = first_broker(
            workload(280.0, 3_000, 450.0, 600.0),
            &RawLimitsPair::default(),
            None,
        );
        assert_eq!(Targets::check(&strand, 1, false, None, None), None);
        // A null broker that failed: its targets are there, not measured.
        let mut null = BrokerReport::new("null (client ceiling)", "command");
        null.error = Some("did not start".into());
        let t = Targets::check(&strand, 1, false, None, Some(&null)).unwrap();
        assert_eq!(
            verdicts(&t),
            vec![
                (Target::ProduceVsClientCeiling, None, None),
                (Target::ConsumeVsClientCeiling, None, None),
                (Target::PacedP99VsClientFloor, None, None),
            ]
        );
        let mut o = String::new();
        t.render(&mut o);
        assert_eq!(o.matches("not measured").count(), 3, "{o}");
        // The old targets against the raw limits are no verdicts: their ratios stay information.
        assert!(!o.contains("loopback") && !o.contains("fdatasync"), "{o}");
        // Tansu without a consume phase: the produce target only.
        let mut tansu = peer("tansu (memory)", workload(100.0, 9_000, 300.0, 700.0));
        if let Some(w) = tansu.result.as_mut() {
            w.consume = None;
        }
        let t = Targets::check(&strand, 1, false, Some(&tansu), None).unwrap();
        assert_eq!(
            verdicts(&t),
            vec![
                (Target::ProduceVsTansu, Some(2.8), Some(true)),
                (Target::ConsumeVsTansu, None, None),
            ]
        );
    }

    /// No paced phase, or no round measured: no ratio.
    #[test]
    fn the_paced_disk_ratio_needs_both_sides() {
        let mut strand = workload(300.0, 3_000, 450.0, 600.0);
        let mut paced = PacedDiskResult {
            target_mb_per_s: 150.0,
            disk: disk(1_000_000, 149.9, 900),
            write_and_fdatasync: LatencySummary::default(),
        };
        let mut r = Ratios::compute(&strand, &RawLimitsPair::default(), 1_000_000);
        r.add_disk_at_paced_rate(&strand, &paced);
        assert_eq!(
            (r.raw_paced_round_p99_us, r.paced_p99_vs_disk_at_paced_rate),
            (None, None)
        );
        paced.write_and_fdatasync = LatencySummary {
            samples: 10,
            p99_us: 1_000,
            ..Default::default()
        };
        strand.paced = None;
        r.add_disk_at_paced_rate(&strand, &paced);
        assert_eq!(
            (r.raw_paced_round_p99_us, r.paced_p99_vs_disk_at_paced_rate),
            (None, None)
        );
        let json = serde_json::to_value(&r).unwrap();
        assert!(json
            .as_object()
            .unwrap()
            .contains_key("paced_p99_vs_disk_at_paced_rate"));
    }

    #[test]
    fn the_raw_limits_table_marks_the_reference_and_the_sustained_run() {
        let fs = crate::host::filesystem_of(Path::new(".")).unwrap();
        let mut params = RawParameters {
            disk_write_sizes: vec![4096, 1_000_000],
            reference_write_bytes: 1_000_000,
            disk_secs_per_size: 2.0,
            sustained_secs: 0.0,
            loopback_secs: 2.0,
        };
        let mut before = raw(400.0, 2_000, 3_000.0);
        let pair = RawLimitsPair {
            before: Some(before.clone()),
            after: None,
            paced: None,
        };
        let mut o = String::new();
        render_raw_limits(&mut o, &params, &pair, &fs, "a publish request's payload");
        let row = |o: &str, name: &str| {
            o.lines()
                .find(|l| l.trim_start().starts_with(name))
                .unwrap_or_else(|| panic!("no {name:?} row in\n{o}"))
                .to_string()
        };
        let reference = row(&o, "append+fdatasync 1000000 B *");
        assert!(reference.contains("400.0 MB/s, p50 0 µs p99 2.00 ms"), "{o}");
        assert!(reference.trim_end().ends_with('-'), "no after run: {o}");
        assert!(row(&o, "append+fdatasync 4 KiB").contains("40.0 MB/s"), "{o}");
        assert!(row(&o, "loopback TCP copy").contains("3.00 GB/s"), "{o}");
        assert!(
            o.contains("reference size for ratios: a publish request's payload, 2 s per size)"),
            "{o}"
        );
        assert!(!o.contains("sustained") && !o.contains("**"), "{o}");

        params.sustained_secs = 13.0;
        before.sustained = Some(disk(1_000_000, 312.5, 9_000));
        let pair = RawLimitsPair {
            before: Some(before),
            ..pair
        };
        let mut o = String::new();
        render_raw_limits(&mut o, &params, &pair, &fs, "the producer batch.size");
        assert!(
            row(&o, "same for 13 s (sustained) **").contains("312.5 MB/s"),
            "{o}"
        );
        assert!(o.contains("** = as long as the produce phase"), "{o}");
    }

    #[test]
    fn bytes_and_truncation() {
        assert_eq!(human_bytes(4096), "4 KiB");
        assert_eq!(human_bytes(1 << 20), "1 MiB");
        assert_eq!(human_bytes(1_000_000), "1000000 B");
        assert_eq!(
            [250, 1_500, 7_500, 75_000, 2_500_000].map(bucket_bound),
            ["250µs", "1.5ms", "7.5ms", "75ms", "2.5s"]
        );
        assert_eq!(truncate("abcdef", 4), "abc…");
        assert_eq!(truncate("abc", 4), "abc");
    }
}
