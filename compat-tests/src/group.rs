//! Consumer groups driven by real clients: group members, what they report, and a log of it.
//!
//! A *member* is one group consumer ([`Member`]):
//!
//! * an `rdkafka` consumer (`BaseConsumer`, `subscribe`) polled on its own thread of the test
//!   process ([`Member::rdkafka_thread`]);
//! * a child process ([`Member::child`]) running the same `rdkafka` loop (the crate's
//!   `strand-group-consumer` binary, see [`rdkafka_child_command`]) or the `group` mode of
//!   a Python script ([`python_group_command`]). A child can be killed with SIGKILL
//!   ([`Member::kill9`]): a real crash, which sends no LeaveGroup and no last commit.
//!
//! Every member reports what happens to it as [`Event`]s, collected with the member's
//! name and arrival time in one [`EventLog`] per test. A child writes them on stdout as
//! JSON lines (one object per line, flushed at once):
//!
//! ```text
//! {"ev": "assigned", "partitions": [0, 3]}                    whole current assignment, after each change
//! {"ev": "records", "records": [[partition, offset, "value"], ...]}  consumed, in order (value as UTF-8)
//! {"ev": "committed", "offsets": [[partition, next_offset], ...]}    a synchronous commit succeeded
//! {"ev": "commit_failed", "offsets": [[partition, next_offset], ...], "error": "..."}
//! {"ev": "error", "error": "..."}                             a client error (non-fatal)
//! {"ev": "note", "note": "..."}
//! {"ev": "closed"}                                            the consumer was closed (LeaveGroup sent)
//! ```
//!
//! and stops when its stdin reaches EOF ([`Member::stop`] closes it). Its stderr goes to the
//! test's stderr, prefixed with the member's name.
//!
//! Commit discipline, the same for every client: auto-commit off; a member commits what it has
//! consumed synchronously every [`MemberSpec::commit_interval_ms`], and in the revocation
//! callback for the partitions it gives up (so a graceful rebalance hands partitions over without
//! re-delivery); on stop it commits what it consumed and closes its consumer (LeaveGroup).
//! [`MemberSpec::freeze_commits_after`] stops every commit once the member has consumed
//! that many records, which leaves an uncommitted tail behind a crash.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::message::Message;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use serde::Serialize;
use serde_json::{json, Value};

use crate::members::{self, ChildMember, MemberEvent, MemberLog};
use crate::{clients, tools};

/// One thing that happened to a member.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// The member's whole current assignment (sorted partitions), after each change.
    Assigned(Vec<i32>),
    /// Records consumed, in order: (partition, offset, value as lossy UTF-8).
    Records(Vec<(i32, i64, String)>),
    /// A synchronous commit of these next-offsets succeeded.
    Committed(BTreeMap<i32, i64>),
    /// A commit failed.
    CommitFailed {
        /// What it tried to commit.
        offsets: BTreeMap<i32, i64>,
        /// The client's error.
        error: String,
    },
    /// A client error (the member goes on).
    Error(String),
    /// Diagnostics.
    Note(String),
    /// The consumer was closed (a LeaveGroup was sent).
    Closed,
}

fn pairs(m: &BTreeMap<i32, i64>) -> Value {
    Value::Array(m.iter().map(|(p, o)| json!([p, o])).collect())
}

fn parse_pairs(v: Option<&Value>) -> Result<BTreeMap<i32, i64>, String> {
    let arr = v
        .and_then(Value::as_array)
        .ok_or_else(|| "missing offsets".to_string())?;
    arr.iter()
        .map(|pair| {
            let p = pair.get(0).and_then(Value::as_i64);
            let o = pair.get(1).and_then(Value::as_i64);
            match (p, o) {
                (Some(p), Some(o)) => Ok((p as i32, o)),
                _ => Err(format!("bad offset pair {pair}")),
            }
        })
        .collect()
}

impl Event {
    /// The JSON-lines form (see the module documentation).
    pub fn to_json(&self) -> Value {
        match self {
            Event::Assigned(ps) => json!({"ev": "assigned", "partitions": ps}),
            Event::Records(rs) => json!({
                "ev": "records",
                "records": rs.iter().map(|(p, o, v)| json!([p, o, v])).collect::<Vec<_>>()
            }),
            Event::Committed(m) => json!({"ev": "committed", "offsets": pairs(m)}),
            Event::CommitFailed { offsets, error } => {
                json!({"ev": "commit_failed", "offsets": pairs(offsets), "error": error})
            }
            Event::Error(e) => json!({"ev": "error", "error": e}),
            Event::Note(n) => json!({"ev": "note", "note": n}),
            Event::Closed => json!({"ev": "closed"}),
        }
    }
}

impl MemberEvent for Event {
    type Counts = Counts;

    /// Parses the JSON-lines form.
    fn from_json(v: &Value) -> Result<Event, String> {
        let text = |key: &str| members::text(v, key);
        match v.get("ev").and_then(Value::as_str) {
            Some("assigned") => {
                let mut ps: Vec<i32> = v
                    .get("partitions")
                    .and_then(Value::as_array)
                    .ok_or_else(|| format!("missing partitions in {v}"))?
                    .iter()
                    .map(|p| {
                        p.as_i64()
                            .map(|p| p as i32)
                            .ok_or_else(|| format!("bad partition {p}"))
                    })
                    .collect::<Result<_, _>>()?;
                ps.sort_unstable();
                Ok(Event::Assigned(ps))
            }
            Some("records") => v
                .get("records")
                .and_then(Value::as_array)
                .ok_or_else(|| format!("missing records in {v}"))?
                .iter()
                .map(|r| {
                    let p = r.get(0).and_then(Value::as_i64);
                    let o = r.get(1).and_then(Value::as_i64);
                    let val = r.get(2).map(|x| x.as_str().unwrap_or("").to_string());
                    match (p, o, val) {
                        (Some(p), Some(o), Some(val)) => Ok((p as i32, o, val)),
                        _ => Err(format!("bad record {r}")),
                    }
                })
                .collect::<Result<_, _>>()
                .map(Event::Records),
            Some("committed") => Ok(Event::Committed(parse_pairs(v.get("offsets"))?)),
            Some("commit_failed") => Ok(Event::CommitFailed {
                offsets: parse_pairs(v.get("offsets"))?,
                error: text("error")?,
            }),
            Some("error") => Ok(Event::Error(text("error")?)),
            Some("note") => Ok(Event::Note(text("note")?)),
            Some("closed") => Ok(Event::Closed),
            _ => Err(format!("unknown event {v}")),
        }
    }

    fn unreadable(message: String) -> Event {
        Event::Error(message)
    }

    fn count(&self, m: &mut Counts) -> Option<String> {
        match self {
            Event::Assigned(ps) => m.assignment = ps.clone(),
            Event::Records(rs) => m.records += rs.len(),
            Event::Committed(c) => m.committed.extend(c),
            Event::CommitFailed { error, .. } => return Some(format!("commit failed: {error}")),
            Event::Error(e) => return Some(e.clone()),
            Event::Note(n) => return Some(n.clone()),
            Event::Closed => return Some("closed".into()),
        }
        None
    }

    fn counts_line(m: &Counts) -> String {
        format!(
            "assignment {:?}, {} records, committed {:?}",
            m.assignment, m.records, m.committed
        )
    }
}

/// A member's line in a log summary.
#[derive(Default)]
pub struct Counts {
    assignment: Vec<i32>,
    records: usize,
    committed: BTreeMap<i32, i64>,
}

/// An event with the member that reported it and when the test process received it.
pub type Logged = members::Logged<Event>;

/// Every member's events, in arrival order; shared by the members' threads.
pub type EventLog = MemberLog<Event>;

/// The latest assignment each member reported.
pub fn assignments(log: &[Logged]) -> BTreeMap<String, Vec<i32>> {
    let mut out = BTreeMap::new();
    for l in log {
        if let Event::Assigned(ps) = &l.event {
            out.insert(l.member.clone(), ps.clone());
        }
    }
    out
}

/// Every record consumed: (member, arrival, partition, offset, value), in arrival order.
pub fn records(log: &[Logged]) -> Vec<(&str, Instant, i32, i64, &str)> {
    let mut out = Vec::new();
    for l in log {
        if let Event::Records(rs) = &l.event {
            for (p, o, v) in rs {
                out.push((l.member.as_str(), l.at, *p, *o, v.as_str()));
            }
        }
    }
    out
}

/// What a member does; also the command-line argument of the child programs (as JSON).
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct MemberSpec {
    /// `bootstrap.servers`.
    pub bootstrap: String,
    /// `group.id`.
    pub group: String,
    /// The one topic it subscribes to.
    pub topic: String,
    /// Client settings, applied last. librdkafka names for rdkafka and confluent-kafka; for
    /// kafka-python, `KafkaConsumer` keyword arguments (numbers are converted;
    /// `partition_assignment_strategy` is a comma-separated list of assignor names).
    pub config: BTreeMap<String, String>,
    /// Commit what was consumed this often (0: only on revocation and stop).
    pub commit_interval_ms: u64,
    /// Stop committing (periodic, on revocation and on stop) once this many records were
    /// consumed.
    pub freeze_commits_after: Option<u64>,
}

impl MemberSpec {
    /// A spec with no extra settings, committing every 200 ms.
    pub fn new(bootstrap: &str, group: &str, topic: &str) -> MemberSpec {
        MemberSpec {
            bootstrap: bootstrap.to_string(),
            group: group.to_string(),
            topic: topic.to_string(),
            config: BTreeMap::new(),
            commit_interval_ms: 200,
            freeze_commits_after: None,
        }
    }

    /// Adds a client setting.
    pub fn set(mut self, key: &str, value: impl ToString) -> MemberSpec {
        self.config.insert(key.to_string(), value.to_string());
        self
    }
}

/// Where a member's events go.
pub type Emit = Arc<dyn Fn(Event) + Send + Sync>;

#[derive(Default)]
struct MemberState {
    /// Next offset per partition consumed since the last commit of that partition.
    pending: BTreeMap<i32, i64>,
    buffered: Vec<(i32, i64, String)>,
    consumed: u64,
    frozen: bool,
    last_assignment: Option<Vec<i32>>,
}

struct MemberCtx {
    topic: String,
    emit: Emit,
    state: Mutex<MemberState>,
}

impl MemberCtx {
    fn lock(&self) -> std::sync::MutexGuard<'_, MemberState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn flush_records(&self, st: &mut MemberState) {
        if !st.buffered.is_empty() {
            (self.emit)(Event::Records(std::mem::take(&mut st.buffered)));
        }
    }

    /// Commits (synchronously) the pending offsets of `only` (all if `None`); removes the
    /// partitions of `only` from the pending set whatever the outcome.
    fn commit(&self, consumer: &BaseConsumer<MemberCtx>, only: Option<&BTreeSet<i32>>) {
        let offsets: BTreeMap<i32, i64> = {
            let mut st = self.lock();
            self.flush_records(&mut st);
            let chosen: BTreeMap<i32, i64> = st
                .pending
                .iter()
                .filter(|(p, _)| only.is_none_or(|o| o.contains(p)))
                .map(|(p, o)| (*p, *o))
                .collect();
            if let Some(only) = only {
                st.pending.retain(|p, _| !only.contains(p));
            }
            if st.frozen {
                return;
            }
            chosen
        };
        if offsets.is_empty() {
            return;
        }
        let mut tpl = TopicPartitionList::new();
        for (p, o) in &offsets {
            if let Err(e) = tpl.add_partition_offset(&self.topic, *p, Offset::Offset(*o)) {
                (self.emit)(Event::Error(format!("building the commit: {e}")));
                return;
            }
        }
        match consumer.commit(&tpl, CommitMode::Sync) {
            Ok(()) => {
                let mut st = self.lock();
                for (p, o) in &offsets {
                    if st.pending.get(p) == Some(o) {
                        st.pending.remove(p);
                    }
                }
                drop(st);
                (self.emit)(Event::Committed(offsets));
            }
            Err(e) => (self.emit)(Event::CommitFailed {
                offsets,
                error: e.to_string(),
            }),
        }
    }

    fn report_assignment(&self, consumer: &BaseConsumer<MemberCtx>) {
        match consumer.assignment() {
            Ok(tpl) => {
                let mut ps: Vec<i32> = tpl.elements().iter().map(|e| e.partition()).collect();
                ps.sort_unstable();
                let mut st = self.lock();
                if st.last_assignment.as_ref() != Some(&ps) {
                    self.flush_records(&mut st);
                    st.last_assignment = Some(ps.clone());
                    drop(st);
                    (self.emit)(Event::Assigned(ps));
                }
            }
            Err(e) => (self.emit)(Event::Error(format!("assignment(): {e}"))),
        }
    }
}

impl ClientContext for MemberCtx {
    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        (self.emit)(Event::Error(format!("{error}: {reason}")));
    }
}

impl ConsumerContext for MemberCtx {
    fn pre_rebalance(&self, consumer: &BaseConsumer<MemberCtx>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Revoke(tpl) => {
                let revoked: BTreeSet<i32> = tpl.elements().iter().map(|e| e.partition()).collect();
                self.commit(consumer, Some(&revoked));
            }
            Rebalance::Error(e) => (self.emit)(Event::Error(format!("rebalance error: {e}"))),
            Rebalance::Assign(_) => {}
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<MemberCtx>, _rebalance: &Rebalance<'_>) {
        self.report_assignment(consumer);
    }
}

/// The rdkafka member loop: subscribes, polls until `stop`, commits as the module documentation
/// says, then commits what it consumed and closes the consumer (bounded: 15 s).
pub fn run_rdkafka_member(spec: &MemberSpec, stop: &AtomicBool, emit: Emit) {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", &spec.bootstrap)
        .set("broker.address.family", "v4")
        .set("group.id", &spec.group)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("enable.partition.eof", "false");
    for (k, v) in &spec.config {
        config.set(k, v);
    }
    let ctx = MemberCtx {
        topic: spec.topic.clone(),
        emit: emit.clone(),
        state: Mutex::new(MemberState::default()),
    };
    let consumer: BaseConsumer<MemberCtx> = match config.create_with_context(ctx) {
        Ok(c) => c,
        Err(e) => {
            emit(Event::Error(format!("cannot create the consumer: {e}")));
            return;
        }
    };
    if let Err(e) = consumer.subscribe(&[&spec.topic]) {
        emit(Event::Error(format!("subscribe: {e}")));
        return;
    }
    let ctx = consumer.context();
    let commit_interval = Duration::from_millis(spec.commit_interval_ms);
    let mut last_commit = Instant::now();
    let mut last_flush = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        match consumer.poll(Duration::from_millis(50)) {
            None => {}
            Some(Ok(m)) => {
                let value = String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned();
                let mut st = ctx.lock();
                st.buffered.push((m.partition(), m.offset(), value));
                st.pending.insert(m.partition(), m.offset() + 1);
                st.consumed += 1;
                if spec.freeze_commits_after.is_some_and(|n| st.consumed >= n) && !st.frozen {
                    st.frozen = true;
                    ctx.flush_records(&mut st);
                    drop(st);
                    emit(Event::Note("commits frozen".into()));
                }
            }
            Some(Err(e)) => emit(Event::Error(format!("poll: {e}"))),
        }
        if last_flush.elapsed() >= Duration::from_millis(20) || ctx.lock().buffered.len() >= 500 {
            let mut st = ctx.lock();
            ctx.flush_records(&mut st);
            last_flush = Instant::now();
        }
        if !commit_interval.is_zero() && last_commit.elapsed() >= commit_interval {
            ctx.commit(&consumer, None);
            last_commit = Instant::now();
        }
    }
    ctx.commit(&consumer, None);
    // A bounded close (BaseConsumer's Drop would wait for it without a limit).
    match consumer.close_queue() {
        Ok(()) => {
            let deadline = Instant::now() + Duration::from_secs(15);
            while !consumer.closed() && Instant::now() < deadline {
                let _ = consumer.poll(Duration::from_millis(100));
            }
            if consumer.closed() {
                emit(Event::Closed);
            } else {
                emit(Event::Error("the consumer did not close within 15 s".into()));
            }
        }
        Err(e) => emit(Event::Error(format!("close: {e}"))),
    }
}

/// The `strand-group-consumer` child program: `<program> '<MemberSpec as JSON>'`; events on
/// stdout as JSON lines; stops at EOF on stdin.
pub fn child_main() -> i32 {
    let Some(arg) = std::env::args().nth(1) else {
        eprintln!("usage: strand-group-consumer '<member spec as JSON>'");
        return 2;
    };
    let spec: MemberSpec = match serde_json::from_str(&arg) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("bad member spec: {e}");
            return 2;
        }
    };
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    std::thread::spawn(move || {
        let mut sink = Vec::new();
        let _ = std::io::stdin().read_to_end(&mut sink);
        stop2.store(true, Ordering::Relaxed);
    });
    let emit: Emit = Arc::new(|ev: Event| {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{}", ev.to_json());
        let _ = out.flush();
    });
    run_rdkafka_member(&spec, &stop, emit);
    0
}

enum Kind {
    Thread {
        stop: Arc<AtomicBool>,
        handle: Option<JoinHandle<()>>,
    },
    Child(ChildMember),
}

/// A running member (see the module documentation). Dropping it stops a thread member (without
/// waiting) and kills a child.
pub struct Member {
    /// Its name in the [`EventLog`].
    pub name: String,
    kind: Kind,
}

impl Member {
    /// An rdkafka member on a thread of this process.
    pub fn rdkafka_thread(name: &str, spec: MemberSpec, log: &EventLog) -> Member {
        let stop = Arc::new(AtomicBool::new(false));
        let (stop2, log2, name2) = (stop.clone(), log.clone(), name.to_string());
        let emit: Emit = Arc::new(move |ev| log2.push(&name2, ev));
        let handle = std::thread::Builder::new()
            .name(format!("member-{name}"))
            .spawn(move || run_rdkafka_member(&spec, &stop2, emit))
            .expect("spawn a member thread");
        Member {
            name: name.to_string(),
            kind: Kind::Thread {
                stop,
                handle: Some(handle),
            },
        }
    }

    /// A member in a child process that speaks the JSON-lines protocol.
    pub fn child(name: &str, cmd: Command, log: &EventLog) -> Member {
        Member {
            name: name.to_string(),
            kind: Kind::Child(ChildMember::spawn(name, cmd, log)),
        }
    }

    /// The child's process id (`None` for a thread member).
    pub fn pid(&self) -> Option<u32> {
        match &self.kind {
            Kind::Child(child) => Some(child.pid()),
            Kind::Thread { .. } => None,
        }
    }

    /// SIGKILLs a child member and waits for it and for the end of its output. Panics for a
    /// thread member or a child that already exited.
    pub fn kill9(&mut self) {
        match &mut self.kind {
            Kind::Child(child) => child.kill9(),
            Kind::Thread { .. } => panic!("member {} is a thread; only a child can be killed", self.name),
        }
    }

    /// Asks the member to stop (commit, close) and waits up to `timeout` for it. Panics if it
    /// does not end in time or a child fails.
    pub fn stop(mut self, timeout: Duration) {
        let name = self.name.clone();
        match &mut self.kind {
            Kind::Thread { stop, handle } => {
                let deadline = Instant::now() + timeout;
                stop.store(true, Ordering::Relaxed);
                if let Some(h) = handle.take() {
                    while !h.is_finished() {
                        assert!(
                            Instant::now() < deadline,
                            "member {name} did not stop within {timeout:?}"
                        );
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    if h.join().is_err() {
                        panic!("member {name}'s thread panicked");
                    }
                }
            }
            Kind::Child(child) => child.stop(timeout),
        }
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        // A child member is killed by its own Drop.
        if let Kind::Thread { stop, .. } = &self.kind {
            stop.store(true, Ordering::Relaxed);
        }
    }
}

/// The command of an rdkafka child member: `bin` is the `strand-group-consumer` binary
/// (`env!("CARGO_BIN_EXE_strand-group-consumer")` in this crate's integration tests).
pub fn rdkafka_child_command(bin: &Path, spec: &MemberSpec) -> Command {
    let mut cmd = Command::new(bin);
    cmd.arg(serde_json::to_string(spec).expect("spec as JSON"));
    cmd
}

/// The command of a Python member: `<script> group --spec '<MemberSpec as JSON>'`.
pub fn python_group_command(client: clients::PythonClient, spec: &MemberSpec) -> Command {
    let mut cmd = Command::new(tools::python());
    cmd.arg(tools::python_scripts_dir().join(client.script()))
        .arg("group")
        .arg("--spec")
        .arg(serde_json::to_string(spec).expect("spec as JSON"))
        .env_remove("LD_LIBRARY_PATH");
    cmd
}
