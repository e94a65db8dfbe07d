//! One run of the harness: start the nodes, create the topic, start the load, play the seeded
//! schedule ([`super::plan`]) against the nodes, stop the load, read every partition back,
//! stop the nodes, read their segment files, and hand everything to the checker.
//!
//! Between two faults the harness waits, after the victim is back, until every partition the
//! victim led has an acknowledged write again (bounded by `recover_timeout`): the next fault
//! never lands before the cluster recovered from the last one, and a kill's measuring window
//! (until the next fault) always holds its recovery unless the cluster did not recover in that
//! bound, which the report says.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::{Offset as KafkaOffset, TopicPartitionList};
use serde::Serialize;

use super::checker::{
    self, Kill, Micros, NodeNo, Offset, PartitionNo, PartitionRead, ReadRecord, Unavailability, Verdict,
};
use super::load::{Load, LoadParams};
use super::nodes::{NodeEvent, Nodes};
use super::plan::{plan, Action, Scenario, Step, Timings};
use super::replicas::read_replica;

/// The harness's topic.
pub const TOPIC: &str = "chaos";
/// How long several nodes are left alone between the end of the load and their stop.
const SETTLE: Duration = Duration::from_secs(2);

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    pub strand: PathBuf,
    /// Where the nodes' directories go (created by the caller, kept or removed by it).
    pub root: PathBuf,
    pub scenario: Scenario,
    pub seed: u64,
    pub cycles: u32,
    /// Stop starting new cycles after this long (the run then finishes as usual).
    pub duration: Option<Duration>,
    pub nodes: u32,
    /// Run each node in a network namespace of its own (needs root; the isolation scenario
    /// needs it).
    pub netns: bool,
    pub partitions: i32,
    pub producers: u32,
    pub rate_per_sec: u32,
    pub record_bytes: usize,
    pub timings: Timings,
    /// Extra arguments of every node's every start.
    pub strand_args: Vec<String>,
    pub ready_timeout: Duration,
    pub recover_timeout: Duration,
    pub message_timeout_ms: u64,
    /// Write every send and its outcome here, one JSON object a line.
    pub history_path: Option<PathBuf>,
}

impl Options {
    /// Defaults for `scenario` on `nodes` nodes: 4 partitions, 2 producers, 400 records/s.
    pub fn new(strand: PathBuf, root: PathBuf, scenario: Scenario, seed: u64, nodes: u32) -> Self {
        Self {
            strand,
            root,
            scenario,
            seed,
            cycles: scenario.default_cycles(),
            duration: None,
            nodes,
            netns: false,
            partitions: 4,
            producers: 2,
            rate_per_sec: 400,
            record_bytes: 100,
            timings: Timings {
                load_ms: (1000, 3000),
                down_ms: (100, 1000),
            },
            strand_args: Vec::new(),
            ready_timeout: Duration::from_secs(60),
            recover_timeout: Duration::from_secs(30),
            message_timeout_ms: 60_000,
            history_path: None,
        }
    }
}

/// What the fault schedule watches of a workload: its clock and, per partition, when a client
/// last saw an acknowledged write (a record, or a queue message's ack).
pub trait Progress {
    fn now(&self) -> Micros;
    fn last_ack(&self, p: PartitionNo) -> Option<Micros>;
    /// Whether the workload has stopped writing new work (no new fault is started then: its
    /// recovery could not be seen).
    fn exhausted(&self) -> bool {
        false
    }
}

impl Progress for super::load::Shared {
    fn now(&self) -> Micros {
        super::load::Shared::now(self)
    }

    fn last_ack(&self, p: PartitionNo) -> Option<Micros> {
        super::load::Shared::last_ack(self, p)
    }
}

/// What kind of fault a step was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    Kill9,
    Sigterm,
    WipedDisk,
    Isolation,
}

/// One fault as it happened.
#[derive(Debug, Clone, Serialize)]
pub struct FaultReport {
    pub cycle: u32,
    pub kind: FaultKind,
    pub action: Action,
    pub node: NodeNo,
    /// The partitions the node led when the fault struck.
    pub partitions_led: Vec<PartitionNo>,
    pub at_ms: f64,
    pub down_ms: u64,
    /// How the process ended.
    pub how: String,
    /// From the fault until every partition it led had an acknowledged write again; `None`
    /// if that did not happen within the recover timeout.
    pub recovered_after_ms: Option<f64>,
    #[serde(skip)]
    pub(super) at: Micros,
}

/// The report of a run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub scenario: Scenario,
    pub seed: u64,
    pub nodes: u32,
    /// Run each node in a network namespace of its own (needs root; the isolation scenario
    /// needs it).
    pub netns: bool,
    pub partitions: i32,
    pub producers: u32,
    pub rate_per_sec: u32,
    pub record_bytes: usize,
    pub timings: Timings,
    pub cycles_planned: u32,
    pub cycles_run: u32,
    pub faults: Vec<FaultReport>,
    pub node_events: Vec<NodeEvent>,
    /// Producers replaced after a fatal error.
    pub fatal_producer_errors: Vec<String>,
    /// The distinct errors of failed sends, with their counts.
    pub send_errors: BTreeMap<String, u64>,
    /// What went wrong around the checks (nodes that exited, recoveries that did not come).
    pub problems: Vec<String>,
    pub verdict: Verdict,
    /// The unavailability over the SIGTERM restarts and the wiped-disk restarts (the kill -9
    /// figures are the verdict's).
    pub sigterm_unavailability: Unavailability,
    pub wiped_disk_unavailability: Unavailability,
    pub isolation_unavailability: Unavailability,
    /// What a run of this scenario on this many nodes is expected to show.
    pub expectation: String,
    pub run_secs: f64,
}

impl Report {
    /// Violations found by the checker plus problems of the run.
    pub fn failures(&self) -> u64 {
        self.verdict.violations() + self.problems.len() as u64
    }

    /// The human-readable summary.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let t = &self.verdict.totals;
        let _ = writeln!(
            s,
            "strand-chaos {:?} seed {} on {} node(s), {} partitions: {} of {} cycles in {:.1} s",
            self.scenario,
            self.seed,
            self.nodes,
            self.partitions,
            self.cycles_run,
            self.cycles_planned,
            self.run_secs
        );
        let _ = writeln!(s, "expectation: {}", self.expectation);
        let _ = writeln!(
            s,
            "records: {} sent, {} acknowledged, {} failed, {} unanswered; {} read back",
            t.sent, t.acked, t.failed, t.pending, t.records_read
        );
        let _ = writeln!(
            s,
            "checker: lost {}, duplicated {}, reordered {}, moved {}, foreign {}, never sent {}",
            t.lost, t.duplicated, t.reordered, t.moved, t.foreign, t.never_sent
        );
        let _ = writeln!(
            s,
            "replicas: {} batches compared, {} divergences, {} short of the high watermark, {} records disagreeing with the read-back",
            t.batches_compared, t.replica_divergences, t.replicas_short, t.replica_disagreements_with_read
        );
        for (name, u) in [
            ("kill -9", &self.verdict.unavailability),
            ("SIGTERM restart", &self.sigterm_unavailability),
            ("wiped disk", &self.wiped_disk_unavailability),
            ("isolation", &self.isolation_unavailability),
        ] {
            if u.kills.is_empty() {
                continue;
            }
            let ms = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.0} ms"));
            let _ = writeln!(
                s,
                "unavailability after {name} ({} faults): median {}, max {}, not recovered {}",
                u.kills.len(),
                ms(u.median_ms),
                ms(u.max_ms),
                u.never_recovered
            );
        }
        for p in &self.verdict.partitions {
            if p.violations() > 0 {
                let _ = writeln!(
                    s,
                    "  partition {}: hw {}, lost {}, dup {}, reordered {}, moved {}: {}",
                    p.partition.0,
                    p.high_watermark.0,
                    p.lost,
                    p.duplicated,
                    p.reordered,
                    p.moved,
                    p.examples.join("; ")
                );
            }
        }
        if !self.fatal_producer_errors.is_empty() {
            let _ = writeln!(
                s,
                "producers replaced after a fatal error: {}",
                self.fatal_producer_errors.len()
            );
        }
        for (e, n) in &self.send_errors {
            let _ = writeln!(s, "  failed sends: {n} × {e}");
        }
        for p in &self.problems {
            let _ = writeln!(s, "problem: {p}");
        }
        let _ = writeln!(
            s,
            "verdict: {}",
            if self.failures() == 0 {
                "PASS".to_string()
            } else {
                format!("{} violation(s)/problem(s)", self.failures())
            }
        );
        s
    }
}

fn expectation(scenario: Scenario, nodes: u32) -> String {
    match (scenario, nodes) {
        (Scenario::WipedDisk, 1) => "acknowledged records LOST: the wiped node held the only copy; the checker must report them".into(),
        (_, 1) => "no acknowledged record lost, none duplicated or reordered (one node: its partitions are unavailable from the fault until it is back)".into(),
        _ => "no acknowledged record lost, none duplicated or reordered, replicas byte-identical below the high watermark".into(),
    }
}

pub(super) fn client_config(bootstrap: &str) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap)
        .set("broker.address.family", "v4")
        .set("log_level", "3");
    c
}

/// Creates the topic (one that exists already is fine) and waits until every partition has a
/// leader.
fn ensure_topic(nodes: &Nodes, partitions: i32, replication: i32, timeout: Duration) -> Result<()> {
    let admin: AdminClient<DefaultClientContext> = client_config(&nodes.bootstrap()).create()?;
    let options = AdminOptions::new()
        .operation_timeout(Some(timeout))
        .request_timeout(Some(timeout));
    let topic = NewTopic::new(TOPIC, partitions, TopicReplication::Fixed(replication));
    let results =
        futures::executor::block_on(admin.create_topics([&topic], &options)).context("CreateTopics")?;
    for r in results {
        if let Err((name, code)) = r {
            if code != RDKafkaErrorCode::TopicAlreadyExists {
                bail!("creating topic {name} (replication factor {replication}): {code}");
            }
        }
    }
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(leaders) = nodes.leaders(TOPIC, Duration::from_secs(5)) {
            if leaders.len() == partitions as usize {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            bail!("topic {TOPIC}: not every partition has a leader after {timeout:?}");
        }
        thread::sleep(Duration::from_millis(100));
    }
}

/// The leader of every partition of `topic`, asked until every partition has one (up to
/// `timeout`).
pub(super) fn all_leaders(
    nodes: &Nodes,
    topic: &str,
    partitions: i32,
    timeout: Duration,
) -> Result<BTreeMap<PartitionNo, NodeNo>> {
    let deadline = Instant::now() + timeout;
    loop {
        let asked = nodes.leaders(topic, Duration::from_secs(5));
        if let Ok(leaders) = &asked {
            if leaders.len() == partitions as usize {
                return asked;
            }
        }
        if Instant::now() > deadline {
            return asked.and_then(|l| {
                bail!(
                    "only {} of {partitions} partitions have a leader after {timeout:?}",
                    l.len()
                )
            });
        }
        thread::sleep(Duration::from_millis(100));
    }
}

/// Writes `history` to `path`, one JSON object a line.
fn write_history(path: &std::path::Path, history: &[checker::Op]) -> Result<()> {
    use std::io::Write as _;
    let file = std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut out = std::io::BufWriter::new(file);
    for op in history {
        serde_json::to_writer(&mut out, op)?;
        out.write_all(b"\n")?;
    }
    out.flush().with_context(|| format!("writing {}", path.display()))
}

/// Reads `partition` from its log start to its high watermark.
fn read_partition(bootstrap: &str, partition: PartitionNo, timeout: Duration) -> Result<PartitionRead> {
    let consumer: BaseConsumer = client_config(bootstrap)
        .set("group.id", "strand-chaos-reader")
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "error")
        .create()?;
    let (low, high) = consumer
        .fetch_watermarks(TOPIC, partition.0, timeout)
        .with_context(|| format!("watermarks of partition {}", partition.0))?;
    let mut records = Vec::new();
    if high > low {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(TOPIC, partition.0, KafkaOffset::Offset(low))?;
        consumer.assign(&tpl)?;
        let deadline = Instant::now() + timeout;
        let mut next = low;
        while next < high {
            if Instant::now() > deadline {
                bail!(
                    "partition {}: read up to {next} of {high} in {timeout:?}",
                    partition.0
                );
            }
            match consumer.poll(Duration::from_millis(500)) {
                Some(Ok(m)) => {
                    if m.offset() >= high {
                        break;
                    }
                    records.push(ReadRecord {
                        offset: Offset(m.offset()),
                        value: m.payload().map(<[u8]>::to_vec),
                    });
                    next = m.offset() + 1;
                }
                Some(Err(KafkaError::PartitionEOF(_))) | None => {}
                Some(Err(e)) => bail!("reading partition {}: {e}", partition.0),
            }
        }
    }
    Ok(PartitionRead {
        partition,
        log_start: Offset(low),
        high_watermark: Offset(high),
        records,
    })
}

/// Waits until every partition of `partitions` has an acknowledged write after `since`;
/// returns when, or `None` after `timeout`.
pub(super) fn await_acks(
    load: &dyn Progress,
    partitions: &[PartitionNo],
    since: Micros,
    timeout: Duration,
) -> Option<Micros> {
    let deadline = Instant::now() + timeout;
    loop {
        let lasts: Option<Vec<Micros>> = partitions
            .iter()
            .map(|p| load.last_ack(*p).filter(|t| *t > since))
            .collect();
        if let Some(lasts) = lasts {
            return Some(lasts.into_iter().max().unwrap_or(since));
        }
        if Instant::now() > deadline {
            return None;
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// How often an acknowledgement is looked for.
const ACK_POLL: Duration = Duration::from_millis(10);

/// The first acknowledged write of each of some partitions after a moment (to within
/// [`ACK_POLL`]): when a fault's partitions took writes again, even while the fault lasts (a
/// leader isolated for seconds whose partitions the others lead within one).
struct FirstAcks {
    partitions: Vec<PartitionNo>,
    since: Micros,
    firsts: Vec<Option<Micros>>,
}

impl FirstAcks {
    fn new(partitions: &[PartitionNo], since: Micros) -> Self {
        FirstAcks {
            partitions: partitions.to_vec(),
            since,
            firsts: vec![None; partitions.len()],
        }
    }

    fn look(&mut self, load: &dyn Progress) {
        for (p, first) in self.partitions.iter().zip(self.firsts.iter_mut()) {
            if first.is_none() {
                *first = load.last_ack(*p).filter(|t| *t > self.since);
            }
        }
    }

    /// Waits (up to `timeout`) until every partition had one; the latest of their first ones.
    fn wait(&mut self, load: &dyn Progress, timeout: Duration) -> Option<Micros> {
        let deadline = Instant::now() + timeout;
        loop {
            self.look(load);
            if self.firsts.iter().all(Option::is_some) {
                return Some(self.firsts.iter().flatten().copied().max().unwrap_or(self.since));
            }
            if Instant::now() > deadline {
                return None;
            }
            thread::sleep(ACK_POLL);
        }
    }
}

/// The checks every workload's options share.
pub(super) fn validate(opts: &Options) -> Result<()> {
    if opts.scenario == Scenario::IsolateLeader && (!opts.netns || opts.nodes < 3) {
        bail!(
            "isolate-leader cuts the leader off from the other nodes: it needs at least 3 nodes \
             and --netns (each node in a network namespace, so that the nodes' traffic to one \
             another can be cut while the clients still reach every node)"
        );
    }
    if opts.nodes == 0 || opts.nodes > 254 || opts.partitions < 1 || opts.producers < 1 {
        bail!("need 1..=254 nodes, at least one partition and one producer");
    }
    Ok(())
}

/// The schedule of `opts` and its nodes, started (and, several of them, formed into a cluster).
pub(super) fn start_nodes(
    opts: &Options,
    started: Instant,
    progress: &mut impl FnMut(&str),
) -> Result<(Vec<Step>, Nodes)> {
    let steps = plan(
        opts.scenario,
        opts.seed,
        opts.cycles,
        opts.nodes,
        opts.partitions,
        opts.timings,
    );
    let mut nodes = Nodes::new(
        &opts.strand,
        &opts.root,
        opts.nodes,
        opts.netns,
        &opts.strand_args,
        opts.ready_timeout,
        started,
    )?;
    progress(&format!(
        "starting {} node(s) at {} under {}",
        opts.nodes,
        nodes.bootstrap(),
        opts.root.display()
    ));
    nodes.start_all()?;
    if opts.nodes > 1 {
        if let Err(e) = nodes.await_cluster(opts.ready_timeout) {
            bail!("{e:#}\nthe nodes' logs end:\n{}", nodes.log_tails());
        }
    }
    Ok((steps, nodes))
}

/// The faults of `kind` as the checker measures them: each until the next fault, the last
/// until `load_end`.
pub(super) fn kills(faults: &[FaultReport], kind: FaultKind, load_end: Micros) -> Vec<Kill> {
    faults
        .iter()
        .enumerate()
        .filter(|(_, f)| f.kind == kind)
        .map(|(i, f)| Kill {
            node: f.node,
            at: f.at,
            partitions: f.partitions_led.clone(),
            window_end: faults.get(i + 1).map_or(load_end, |next| next.at),
        })
        .collect()
}

/// Runs `opts`; `progress` hears what happens, a line at a time.
pub fn run(opts: &Options, mut progress: impl FnMut(&str)) -> Result<Report> {
    validate(opts)?;
    let started = Instant::now();
    let (steps, mut nodes) = start_nodes(opts, started, &mut progress)?;
    let replication = opts.nodes.min(3) as i32;
    ensure_topic(&nodes, opts.partitions, replication, opts.ready_timeout)?;
    let all: Vec<PartitionNo> = (0..opts.partitions).map(PartitionNo).collect();
    let load = Load::start(
        &LoadParams {
            bootstrap: nodes.bootstrap(),
            topic: TOPIC.into(),
            partitions: opts.partitions,
            producers: opts.producers,
            rate_per_sec: opts.rate_per_sec,
            record_bytes: opts.record_bytes,
            max_in_flight: 1000,
            message_timeout_ms: opts.message_timeout_ms,
        },
        started,
    )?;
    let mut problems = Vec::new();
    if await_acks(&*load.shared, &all, Micros(0), opts.recover_timeout).is_none() {
        problems.push(format!(
            "the load got no acknowledgement on every partition within {:?} of its start",
            opts.recover_timeout
        ));
    }
    let mut faults = Vec::new();
    let mut cycles_run = 0;
    let outcome = play(
        opts,
        &steps,
        &mut nodes,
        TOPIC,
        &*load.shared,
        started,
        &mut faults,
        &mut cycles_run,
        &mut problems,
        &mut progress,
    );
    if let Err(e) = &outcome {
        problems.push(format!("the schedule stopped: {e:#}"));
    }
    // A last stretch of load after the last fault, so that its window has acknowledgements.
    thread::sleep(Duration::from_millis(opts.timings.load_ms.0));
    let load_end = Micros(started.elapsed().as_micros() as u64);
    progress("stopping the load, waiting for the last delivery reports");
    let fatal_producer_errors = load
        .shared
        .fatal_errors
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let history = load.finish()?;
    if opts.nodes > 1 {
        // Followers a little behind the commit index when the load stopped catch up before
        // the nodes stop and their segment files are compared (a replica still short of the
        // high watermark is reported as such, not as a divergence).
        thread::sleep(SETTLE);
    }
    for (n, tail) in nodes.exited() {
        problems.push(format!("node {} exited by itself:\n{tail}", n.0));
    }
    progress("reading every partition back");
    let mut reads = Vec::new();
    for &p in &all {
        match read_partition(&nodes.bootstrap(), p, Duration::from_secs(60)) {
            Ok(r) => reads.push(r),
            Err(e) => problems.push(format!("reading partition {} back: {e:#}", p.0)),
        }
    }
    progress("stopping the nodes, reading their segment files");
    problems.extend(nodes.stop_all(Duration::from_secs(30)));
    let mut replicas = Vec::new();
    for spec in &nodes.specs {
        for &p in &all {
            replicas.push(read_replica(spec.id, &spec.data, TOPIC, p));
        }
    }
    let kills_of = |kind| kills(&faults, kind, load_end);
    if let Some(path) = &opts.history_path {
        write_history(path, &history)?;
    }
    let verdict = checker::check(&all, &history, &reads, &replicas, &kills_of(FaultKind::Kill9));
    let mut send_errors = BTreeMap::new();
    for op in &history {
        if let checker::Outcome::Failed { error, .. } = &op.outcome {
            *send_errors.entry(error.clone()).or_insert(0) += 1;
        }
    }
    Ok(Report {
        scenario: opts.scenario,
        seed: opts.seed,
        nodes: opts.nodes,
        netns: opts.netns,
        partitions: opts.partitions,
        producers: opts.producers,
        rate_per_sec: opts.rate_per_sec,
        record_bytes: opts.record_bytes,
        timings: opts.timings,
        cycles_planned: opts.cycles,
        cycles_run,
        sigterm_unavailability: checker::unavailability(&history, &kills_of(FaultKind::Sigterm)),
        wiped_disk_unavailability: checker::unavailability(&history, &kills_of(FaultKind::WipedDisk)),
        isolation_unavailability: checker::unavailability(&history, &kills_of(FaultKind::Isolation)),
        faults,
        node_events: nodes.events.clone(),
        fatal_producer_errors,
        send_errors,
        problems,
        verdict,
        expectation: expectation(opts.scenario, opts.nodes),
        run_secs: started.elapsed().as_secs_f64(),
    })
}

/// Plays `steps` against `nodes` under a workload on `topic`: each fault strikes the node
/// that leads the step's partition of `topic` at that moment, and the next waits until every
/// partition the victim led has an acknowledged write again (`load`).
#[allow(clippy::too_many_arguments)]
pub(super) fn play(
    opts: &Options,
    steps: &[Step],
    nodes: &mut Nodes,
    topic: &str,
    load: &dyn Progress,
    started: Instant,
    faults: &mut Vec<FaultReport>,
    cycles_run: &mut u32,
    problems: &mut Vec<String>,
    progress: &mut impl FnMut(&str),
) -> Result<()> {
    let replication = opts.nodes.min(3) as i32;
    for step in steps {
        if opts.duration.is_some_and(|d| started.elapsed() > d) {
            progress(&format!("--duration reached after {} cycles", *cycles_run));
            break;
        }
        if load.exhausted() {
            progress(&format!("the workload is done after {} cycles", *cycles_run));
            break;
        }
        thread::sleep(Duration::from_millis(step.load_ms));
        let (kind, node) = match step.action {
            Action::KillLeaderOf(p) => (FaultKind::Kill9, nodes.leader_of(topic, p, opts.recover_timeout)?),
            Action::Restart(n) => (FaultKind::Sigterm, n),
            Action::WipeAndRestart(n) => (FaultKind::WipedDisk, n),
            Action::IsolateLeaderOf(p) => (
                FaultKind::Isolation,
                nodes.leader_of(topic, p, opts.recover_timeout)?,
            ),
        };
        let leaders = all_leaders(nodes, topic, opts.partitions, opts.recover_timeout)?;
        let partitions_led: Vec<PartitionNo> = leaders
            .iter()
            .filter(|(_, n)| **n == node)
            .map(|(p, _)| *p)
            .collect();
        let at = load.now();
        let how = match kind {
            FaultKind::Sigterm => nodes.stop(node, Duration::from_secs(30))?.how,
            FaultKind::Kill9 | FaultKind::WipedDisk => nodes.kill(node)?.how,
            FaultKind::Isolation => {
                nodes.isolate(node)?;
                "isolated from the other nodes".into()
            }
        };
        // The process is gone (or cut off): an acknowledgement from here on comes from a live
        // leader (one received between `at` and here may still be the victim's last; an
        // isolated leader cannot commit an acks=all write without the others).
        let dead = load.now();
        if kind == FaultKind::WipedDisk {
            nodes.wipe(node)?;
        }
        // Down (or isolated) for a while; the clients keep writing to every node meanwhile, and
        // the partitions' first acknowledgements from a live leader are watched for.
        let mut firsts = FirstAcks::new(&partitions_led, dead);
        let up_at = Instant::now() + Duration::from_millis(step.down_ms);
        loop {
            firsts.look(load);
            let left = up_at.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            thread::sleep(left.min(ACK_POLL));
        }
        if kind == FaultKind::Isolation {
            nodes.heal(node)?;
        } else {
            nodes.start(node)?;
        }
        if kind == FaultKind::WipedDisk && opts.nodes == 1 {
            // On one node the topic went with the disk. In a cluster it is still in the
            // metadata, and what the run measures is when its partitions take writes again.
            ensure_topic(nodes, opts.partitions, replication, opts.ready_timeout)?;
        }
        let recovered = firsts.wait(load, opts.recover_timeout);
        if recovered.is_none() {
            problems.push(format!(
                "cycle {}: partitions {:?} had no acknowledged write within {:?} of the {kind:?} of node {}",
                step.cycle,
                partitions_led.iter().map(|p| p.0).collect::<Vec<_>>(),
                opts.recover_timeout,
                node.0
            ));
        }
        let recovered_after_ms = recovered.map(|r| (r.0.saturating_sub(at.0)) as f64 / 1000.0);
        progress(&format!(
            "cycle {}: {kind:?} of node {} (leading {} partitions), down {} ms, writes acknowledged again after {}",
            step.cycle,
            node.0,
            partitions_led.len(),
            step.down_ms,
            recovered_after_ms.map_or("-".into(), |v| format!("{v:.0} ms"))
        ));
        faults.push(FaultReport {
            cycle: step.cycle,
            kind,
            action: step.action,
            node,
            partitions_led,
            at_ms: at.as_ms(),
            down_ms: step.down_ms,
            how,
            recovered_after_ms,
            at,
        });
        *cycles_run = step.cycle + 1;
    }
    Ok(())
}
