//! One run of the queue workload (`strand-chaos --workload queue`): start the nodes, create the
//! queue over HTTP, start the publishers and workers ([`super::queue_load`]), play the seeded
//! fault schedule while the messages are published, let the workers drain what is left, read
//! the dead-letter topic, stop the nodes and hand everything to [`super::queue_check`].
//!
//! The schedule stops once every message is published (a fault after that could not be seen
//! to recover); between faults the harness waits until every partition the victim led has an
//! acknowledged ack again, which is also the measure of how long leasing paused.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset as KafkaOffset, TopicPartitionList};
use serde::Serialize;
use serde_json::json;

use super::checker::{self, Micros, PartitionNo, Unavailability};
use super::harness::{
    all_leaders, await_acks, client_config, kills, play, start_nodes, validate, FaultKind, FaultReport,
    Options,
};
use super::nodes::{NodeEvent, Nodes};
use super::plan::Scenario;
use super::queue_check::{
    self, DeadLetter, MessagePlan, Mix, QueueHistory, QueueVerdict, SettleAction, SettleResult,
};
use super::queue_load::{QueueLoad, QueueLoadParams};
use crate::queue_client::QueueClient;

/// The queue of a run.
pub const QUEUE: &str = "chaos-queue";

/// What the queue workload does (the nodes, the schedule and the publish rate are the
/// [`Options`]': `rate_per_sec` messages a second over `producers` publishers of
/// `record_bytes`-byte messages, on `partitions` partitions).
#[derive(Debug, Clone, Serialize)]
pub struct QueueOptions {
    pub messages: u64,
    pub workers: u32,
    pub publish_batch: usize,
    pub lease_batch: u32,
    pub visibility_timeout_ms: u64,
    /// The queue's `max_attempts`: how often a poison message is nacked before it is
    /// dead-lettered.
    pub max_attempts: u32,
    pub mix: Mix,
    /// How long the workers may go without leasing anything, once everything is published,
    /// before the run stops waiting for the rest.
    pub quiet_secs: f64,
}

impl Default for QueueOptions {
    fn default() -> Self {
        QueueOptions {
            messages: 100_000,
            workers: 8,
            publish_batch: 50,
            lease_batch: 50,
            visibility_timeout_ms: 10_000,
            max_attempts: 5,
            mix: Mix::default(),
            quiet_secs: 30.0,
        }
    }
}

/// The report of a queue run.
#[derive(Debug, Clone, Serialize)]
pub struct QueueReport {
    pub workload: &'static str,
    pub scenario: Scenario,
    pub seed: u64,
    pub nodes: u32,
    pub netns: bool,
    pub partitions: i32,
    pub publishers: u32,
    pub rate_per_sec: u32,
    pub message_bytes: usize,
    pub queue: QueueOptions,
    pub cycles_planned: u32,
    pub cycles_run: u32,
    pub faults: Vec<FaultReport>,
    pub node_events: Vec<NodeEvent>,
    /// The longest gap between acknowledged acks on the victims' partitions, per fault kind.
    pub kill_unavailability: Unavailability,
    pub sigterm_unavailability: Unavailability,
    pub isolation_unavailability: Unavailability,
    /// Failed calls by what failed (retried elsewhere).
    pub call_errors: BTreeMap<String, u64>,
    pub problems: Vec<String>,
    pub verdict: QueueVerdict,
    pub publish_secs: f64,
    pub drain_secs: f64,
    pub run_secs: f64,
}

impl QueueReport {
    pub fn failures(&self) -> u64 {
        self.verdict.violations() + self.problems.len() as u64
    }

    pub fn render(&self) -> String {
        let mut s = String::new();
        let v = &self.verdict;
        let t = &v.totals;
        let _ = writeln!(
            s,
            "strand-chaos queue {:?} seed {} on {} node(s), {} partitions: {} of {} cycles in {:.1} s",
            self.scenario,
            self.seed,
            self.nodes,
            self.partitions,
            self.cycles_run,
            self.cycles_planned,
            self.run_secs
        );
        let _ = writeln!(
            s,
            "messages: {} planned, {} published ({:.1} s), {} acknowledged, {} poison; drained {:.1} s after the last publish",
            t.planned, t.published, self.publish_secs, t.acknowledged, t.poison, self.drain_secs
        );
        let _ = writeln!(
            s,
            "calls: {} leases ({} redeliveries), {} settles ({} nacks, {} rejects settled, {} unanswered)",
            t.leases, t.redeliveries, t.settles, t.nacks_settled, t.rejects_settled, t.settles_unanswered
        );
        let _ = writeln!(
            s,
            "late acks of abandoned leases: {} sent, refused {:?}",
            t.late_acks, t.late_refusals
        );
        if !t.refusals.is_empty() {
            let _ = writeln!(
                s,
                "other refusals: {:?} ({} retried acks refused as already done: acknowledged by the attempt whose answer was lost)",
                t.refusals, t.acks_confirmed_by_retry
            );
        }
        let _ = writeln!(
            s,
            "dead-letter topic: {} records, {} poison messages there twice",
            t.dead_letter_records, t.dead_lettered_twice
        );
        let ms = |v: Option<i64>| v.map_or("-".to_string(), |v| format!("{v} ms"));
        let _ = writeln!(
            s,
            "delays: {} delayed messages leased, lateness p99 {}, max {}",
            t.delayed_leased,
            ms(t.delay_lateness_p99_ms),
            ms(t.delay_lateness_max_ms)
        );
        let _ = writeln!(
            s,
            "checker: lost {}, delivered after ack {}, generation regressions {}, stale settles accepted {}, \
             valid leases refused {}, early deliveries {}, dedup failures {}, unexpected dead letters {}, foreign {}",
            v.lost,
            v.delivered_after_ack,
            v.generation_regressions,
            v.stale_settles_accepted,
            v.valid_leases_refused,
            v.early_deliveries,
            v.dedup_failures,
            v.unexpected_dead_letters,
            v.foreign
        );
        for (what, examples) in &v.examples {
            for e in examples {
                let _ = writeln!(s, "  {what}: {e}");
            }
        }
        for (name, u) in [
            ("kill -9", &self.kill_unavailability),
            ("SIGTERM restart", &self.sigterm_unavailability),
            ("isolation", &self.isolation_unavailability),
        ] {
            if u.kills.is_empty() {
                continue;
            }
            let ms = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.0} ms"));
            let _ = writeln!(
                s,
                "acks paused after {name} ({} faults): median {}, max {}, not recovered {}",
                u.kills.len(),
                ms(u.median_ms),
                ms(u.max_ms),
                u.never_recovered
            );
        }
        for (e, n) in &self.call_errors {
            let _ = writeln!(s, "  failed calls: {n} × {e}");
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

/// Creates the queue (and its dead-letter topic) over HTTP, retrying until the cluster takes it.
fn create_queue(nodes: &Nodes, opts: &Options, q: &QueueOptions) -> Result<()> {
    let settings = json!({
        "partitions": opts.partitions,
        "max_attempts": q.max_attempts,
        "visibility_timeout_ms": q.visibility_timeout_ms,
        "backoff_base_ms": 100,
        "backoff_multiplier": 2.0,
        "backoff_max_ms": 1000,
        // Longer than any run: every retried publish is deduplicated.
        "dedup_window_ms": 6 * 3600 * 1000,
    });
    let deadline = Instant::now() + opts.ready_timeout;
    let mut last = String::new();
    loop {
        for spec in &nodes.specs {
            match QueueClient::new(&spec.http()).put_queue(QUEUE, &settings) {
                Ok(_) => return Ok(()),
                Err(e) => last = format!("node {}: {e}", spec.id.0),
            }
        }
        if Instant::now() > deadline {
            bail!("creating queue {QUEUE}: {last}");
        }
        thread::sleep(Duration::from_millis(200));
    }
}

/// Writes every call the clients made and every dead letter to `path`, one JSON object a line
/// (`{"publish": …}`, `{"lease": …}`, `{"settle": …}`, `{"dead_letter": …}`).
fn write_history(path: &std::path::Path, h: &QueueHistory, dead_letters: &[DeadLetter]) -> Result<()> {
    use std::io::Write as _;
    let file = std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut out = std::io::BufWriter::new(file);
    let mut line = |v: serde_json::Value| -> Result<()> {
        serde_json::to_writer(&mut out, &v)?;
        out.write_all(b"\n")?;
        Ok(())
    };
    for p in &h.publishes {
        line(json!({ "publish": p }))?;
    }
    for l in &h.leases {
        line(json!({ "lease": l }))?;
    }
    for s in &h.settles {
        line(json!({ "settle": s }))?;
    }
    for d in dead_letters {
        line(json!({ "dead_letter": d }))?;
    }
    out.flush().with_context(|| format!("writing {}", path.display()))
}

/// Whether the queue's group has nothing available, leased or delayed (as any node answers).
fn queue_is_empty(nodes: &Nodes) -> bool {
    for spec in &nodes.specs {
        let mut client = QueueClient::new(&spec.http());
        client.conn.set_read_timeout(Duration::from_secs(5));
        if let Ok(info) = client.get_queue(QUEUE) {
            let g = &info["groups"]["default"];
            let count = |k: &str| g[k].as_u64();
            return matches!(
                (count("available"), count("leased"), count("delayed")),
                (Some(0), Some(0), Some(0))
            );
        }
    }
    false
}

/// Every record of the dead-letter topic `topic`, with the headers the checker reads.
fn read_dead_letters(bootstrap: &str, topic: &str, timeout: Duration) -> Result<Vec<DeadLetter>> {
    let consumer: BaseConsumer = client_config(bootstrap)
        .set("group.id", "strand-chaos-dlq-reader")
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "error")
        .create()?;
    let metadata = consumer
        .fetch_metadata(Some(topic), timeout)
        .with_context(|| format!("metadata of {topic}"))?;
    let partitions: Vec<i32> = metadata
        .topics()
        .iter()
        .filter(|t| t.name() == topic)
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect();
    let mut out = Vec::new();
    for p in partitions {
        let (low, high) = consumer
            .fetch_watermarks(topic, p, timeout)
            .with_context(|| format!("watermarks of {topic}/{p}"))?;
        if high <= low {
            continue;
        }
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, p, KafkaOffset::Offset(low))?;
        consumer.assign(&tpl)?;
        let deadline = Instant::now() + timeout;
        let mut next = low;
        while next < high {
            if Instant::now() > deadline {
                bail!("{topic}/{p}: read up to {next} of {high} in {timeout:?}");
            }
            match consumer.poll(Duration::from_millis(500)) {
                Some(Ok(m)) => {
                    if m.offset() >= high {
                        break;
                    }
                    let header = |name: &str| -> Option<String> {
                        m.headers().and_then(|h| {
                            h.iter()
                                .find(|x| x.key == name)
                                .and_then(|x| x.value)
                                .map(|v| String::from_utf8_lossy(v).into_owned())
                        })
                    };
                    out.push(DeadLetter {
                        message_id: header("strand-message-id"),
                        cause: header("strand-dlq-cause"),
                        attempts: header("strand-dlq-attempts").and_then(|a| a.parse().ok()),
                    });
                    next = m.offset() + 1;
                }
                Some(Err(KafkaError::PartitionEOF(_))) | None => {}
                Some(Err(e)) => bail!("reading {topic}/{p}: {e}"),
            }
        }
    }
    Ok(out)
}

/// Runs the queue workload under `opts`' fault schedule.
pub fn run(opts: &Options, q: &QueueOptions, mut progress: impl FnMut(&str)) -> Result<QueueReport> {
    validate(opts)?;
    if opts.scenario == Scenario::WipedDisk && opts.nodes < 3 {
        bail!("a queue on fewer than 3 nodes does not survive a wiped disk: nothing to check");
    }
    if q.messages == 0 || q.workers == 0 || q.lease_batch == 0 || q.publish_batch == 0 {
        bail!("need messages, workers, and batches of at least one");
    }
    let started = Instant::now();
    let (steps, mut nodes) = start_nodes(opts, started, &mut progress)?;
    create_queue(&nodes, opts, q)?;
    all_leaders(&nodes, QUEUE, opts.partitions, opts.ready_timeout).context("the queue's leaders")?;
    let plan_of_messages = Arc::new(MessagePlan::new(opts.seed, q.messages, q.mix));
    let params = QueueLoadParams {
        addrs: nodes.specs.iter().map(|s| s.http()).collect(),
        queue: QUEUE.into(),
        partitions: opts.partitions,
        run: opts.seed,
        publishers: opts.producers,
        rate_per_sec: opts.rate_per_sec,
        publish_batch: q.publish_batch,
        message_bytes: opts.record_bytes,
        workers: q.workers,
        lease_batch: q.lease_batch,
        visibility_timeout_ms: q.visibility_timeout_ms,
        max_attempts: q.max_attempts,
        flaky_retry_ms: 300,
    };
    progress(&format!(
        "publishing {} messages at {}/s to {QUEUE} ({} partitions), {} workers",
        q.messages, opts.rate_per_sec, opts.partitions, q.workers
    ));
    let load = QueueLoad::start(&params, plan_of_messages.clone(), started)?;
    let all: Vec<PartitionNo> = (0..opts.partitions).map(PartitionNo).collect();
    let mut problems = Vec::new();
    if await_acks(&*load.shared, &all, Micros(0), opts.recover_timeout).is_none() {
        problems.push(format!(
            "the workers got no acknowledged ack on every partition within {:?} of the start",
            opts.recover_timeout
        ));
    }
    let mut faults = Vec::new();
    let mut cycles_run = 0;
    let outcome = play(
        opts,
        &steps,
        &mut nodes,
        QUEUE,
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
    progress("waiting for the publishers");
    let mut last_report = Instant::now();
    while !load.shared.publishing_done() {
        if last_report.elapsed() > Duration::from_secs(2) {
            last_report = Instant::now();
            progress(&format!(
                "{} messages published, {} settled for good",
                load.shared.published(),
                load.shared.resolved()
            ));
        }
        thread::sleep(Duration::from_millis(100));
    }
    let published_at = started.elapsed();
    progress(&format!(
        "{} messages published in {:.1} s; draining",
        load.shared.published(),
        published_at.as_secs_f64()
    ));
    let quiet = Duration::from_secs_f64(q.quiet_secs);
    let mut last_asked = Instant::now();
    loop {
        let idle = load.shared.now().0.saturating_sub(load.shared.last_lease().0);
        // The workers' own count misses what the queue settled without telling them (a poison
        // message dead-lettered by a lease expiry, a settle whose answer was lost): the queue's
        // own count says when nothing is left.
        let mut done = load.shared.resolved() >= load.shared.published();
        if !done && last_asked.elapsed() > Duration::from_secs(1) {
            last_asked = Instant::now();
            done = queue_is_empty(&nodes);
        }
        if done || Duration::from_micros(idle) > quiet {
            break;
        }
        if last_report.elapsed() > Duration::from_secs(5) {
            last_report = Instant::now();
            progress(&format!(
                "{} of {} messages settled for good",
                load.shared.resolved(),
                load.shared.published()
            ));
        }
        thread::sleep(Duration::from_millis(100));
    }
    let drain_secs = (started.elapsed() - published_at).as_secs_f64();
    let load_end = load.shared.now();
    let shared = load.shared.clone();
    progress("stopping the workers once what they hold is settled");
    let history = load.finish(opts.recover_timeout);
    let call_errors = shared
        .call_errors
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    problems.extend(
        shared
            .problems
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .cloned(),
    );
    for (n, tail) in nodes.exited() {
        problems.push(format!("node {} exited by itself:\n{tail}", n.0));
    }
    progress("reading the dead-letter topic");
    let dead_letters = match read_dead_letters(
        &nodes.bootstrap(),
        &format!("{QUEUE}.dlq"),
        Duration::from_secs(60),
    ) {
        Ok(d) => d,
        Err(e) => {
            problems.push(format!("reading the dead-letter topic: {e:#}"));
            Vec::new()
        }
    };
    problems.extend(nodes.stop_all(Duration::from_secs(30)));
    if let Some(path) = &opts.history_path {
        write_history(path, &history, &dead_letters)?;
    }
    let verdict = queue_check::check(&plan_of_messages, &history, &dead_letters);
    let acks: Vec<(PartitionNo, Micros)> = history
        .settles
        .iter()
        .filter(|s| {
            s.action == SettleAction::Ack
                && matches!(&s.result, SettleResult::Settled { state } if state == "acknowledged")
        })
        .map(|s| (s.partition, s.answered))
        .collect();
    let unavailability =
        |kind| checker::unavailability_of(acks.iter().copied(), &kills(&faults, kind, load_end));
    Ok(QueueReport {
        workload: "queue",
        scenario: opts.scenario,
        seed: opts.seed,
        nodes: opts.nodes,
        netns: opts.netns,
        partitions: opts.partitions,
        publishers: opts.producers,
        rate_per_sec: opts.rate_per_sec,
        message_bytes: opts.record_bytes,
        queue: q.clone(),
        cycles_planned: opts.cycles,
        cycles_run,
        kill_unavailability: unavailability(FaultKind::Kill9),
        sigterm_unavailability: unavailability(FaultKind::Sigterm),
        isolation_unavailability: unavailability(FaultKind::Isolation),
        faults,
        node_events: nodes.events.clone(),
        call_errors,
        problems,
        verdict,
        publish_secs: published_at.as_secs_f64(),
        drain_secs,
        run_secs: started.elapsed().as_secs_f64(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_queue_run_refuses_what_it_cannot_check() {
        let mut opts = Options::new("strand".into(), "/nonexistent".into(), Scenario::WipedDisk, 1, 1);
        let e = run(&opts, &QueueOptions::default(), |_| {}).unwrap_err();
        assert!(e.to_string().contains("wiped disk"), "{e:#}");
        opts.scenario = Scenario::IsolateLeader;
        opts.nodes = 3;
        let e = run(&opts, &QueueOptions::default(), |_| {}).unwrap_err();
        assert!(e.to_string().contains("--netns"), "{e:#}");
    }
}
