//! The queue workload of `strand-chaos --workload queue`: HTTP publishers and workers on a queue
//! (docs/http-api.md), recording everything they are told ([`QueueHistory`]) for
//! [`super::queue_check`].
//!
//! - **Publishers** publish the run's messages in order, paced at a rate, each with a dedup token
//!   naming its index: a batch whose answer is lost (connection cut, `503` while a partition
//!   has no leader) is sent again, to another node, until it is answered, and the tokens make
//!   the retry append nothing twice.
//! - **Workers** long-poll leases from any node and settle what they get as the message's
//!   [`Kind`] says (ack, nack, reject, or abandon the first lease), in one batch settle per
//!   lease answer; items without an answer (or answered `5xx`) are settled again, to another
//!   node, until answered. The worker that leases an abandoned message again first acks the
//!   abandoned generation (which must be refused `409 stale_generation`), then the new one.
//!
//! A worker or publisher that cannot reach a node moves on to the next one: every node answers
//! for every partition.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use serde_json::{json, Value};

use super::checker::{Micros, PartitionNo};
use super::harness::Progress;
use super::queue_check::{
    decode_payload, encode_payload, Kind, LeaseOp, MessagePlan, PublishOp, QueueHistory, SettleAction,
    SettleOp, SettleResult,
};
use crate::queue_client::{BatchSettled, CallError, LeaseOptions, Leased, OutMessage, QueueClient};

/// The workload's parameters.
#[derive(Debug, Clone)]
pub struct QueueLoadParams {
    /// Every node's HTTP address.
    pub addrs: Vec<String>,
    pub queue: String,
    pub partitions: i32,
    /// Names the run in payloads and dedup tokens.
    pub run: u64,
    pub publishers: u32,
    /// Messages per second over all publishers.
    pub rate_per_sec: u32,
    pub publish_batch: usize,
    pub message_bytes: usize,
    pub workers: u32,
    pub lease_batch: u32,
    pub visibility_timeout_ms: u64,
    /// The queue's `max_attempts` (a poison message's last nack dead-letters it).
    pub max_attempts: u32,
    /// Delay of a flaky message's nack.
    pub flaky_retry_ms: u64,
}

/// What the client threads share.
pub struct QueueShared {
    start: Instant,
    history: Mutex<QueueHistory>,
    /// Per partition, 1 + µs of the last acknowledged ack (0: none yet).
    last_ack_us: Vec<AtomicU64>,
    /// Per message, whether it was acknowledged or dead-lettered (as a worker was told).
    resolved: Mutex<Vec<bool>>,
    resolved_count: AtomicU64,
    /// Messages whose publish was answered.
    published: AtomicU64,
    /// Publish batches handed out (publishers take the next one).
    next_batch: AtomicU64,
    publishers_running: AtomicUsize,
    /// µs of the last lease answer that held a message.
    last_lease_us: AtomicU64,
    /// Messages whose first lease was abandoned: that lease, until the next lease of the
    /// message acks it late (then `None`).
    abandoned: Mutex<HashMap<u64, Option<LeaseOp>>>,
    /// No new leases: the workers finish settling what they hold, then return.
    stop_leasing: AtomicBool,
    /// Give up: no further attempt of anything.
    stop: AtomicBool,
    /// Client-side call failures, by what they were (`connection error`, `503 not_leader`, ...).
    pub call_errors: Mutex<BTreeMap<String, u64>>,
    /// Answers that break the contract (a 4xx to a well-formed request, an unreadable body).
    pub problems: Mutex<Vec<String>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The wall clock, ms since the epoch (the broker's clock on the same machine).
pub fn wall_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

impl QueueShared {
    pub fn now(&self) -> Micros {
        Micros(self.start.elapsed().as_micros() as u64)
    }

    pub fn resolved(&self) -> u64 {
        self.resolved_count.load(Ordering::Relaxed)
    }

    pub fn published(&self) -> u64 {
        self.published.load(Ordering::Relaxed)
    }

    /// Whether every publisher is done.
    pub fn publishing_done(&self) -> bool {
        self.publishers_running.load(Ordering::Relaxed) == 0
    }

    /// When a lease last held a message.
    pub fn last_lease(&self) -> Micros {
        Micros(self.last_lease_us.load(Ordering::Relaxed))
    }

    fn error(&self, what: String) {
        *lock(&self.call_errors).entry(what).or_default() += 1;
    }

    fn problem(&self, what: String) {
        let mut p = lock(&self.problems);
        if p.len() < 50 {
            p.push(what);
        }
    }

    fn resolve(&self, index: Option<u64>) {
        let Some(i) = index.and_then(|i| usize::try_from(i).ok()) else {
            return;
        };
        let mut r = lock(&self.resolved);
        if let Some(slot) = r.get_mut(i) {
            if !*slot {
                *slot = true;
                self.resolved_count.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

impl Progress for QueueShared {
    fn now(&self) -> Micros {
        QueueShared::now(self)
    }

    fn last_ack(&self, p: PartitionNo) -> Option<Micros> {
        let v = self
            .last_ack_us
            .get(usize::try_from(p.0).ok()?)?
            .load(Ordering::Relaxed);
        (v > 0).then(|| Micros(v - 1))
    }

    fn exhausted(&self) -> bool {
        self.publishing_done()
    }
}

/// The running workload.
pub struct QueueLoad {
    pub shared: Arc<QueueShared>,
    threads: Vec<JoinHandle<()>>,
}

impl QueueLoad {
    /// Starts the publishers and workers on `plan`'s messages; the clock starts at `start`.
    pub fn start(params: &QueueLoadParams, plan: Arc<MessagePlan>, start: Instant) -> Result<QueueLoad> {
        anyhow::ensure!(
            !params.addrs.is_empty()
                && params.publishers > 0
                && params.workers > 0
                && params.rate_per_sec > 0,
            "a queue load needs a node, a publisher, a worker and a rate"
        );
        let messages = plan.kinds.len();
        let shared = Arc::new(QueueShared {
            start,
            history: Mutex::new(QueueHistory::default()),
            last_ack_us: (0..params.partitions).map(|_| AtomicU64::new(0)).collect(),
            resolved: Mutex::new(vec![false; messages]),
            resolved_count: AtomicU64::new(0),
            published: AtomicU64::new(0),
            next_batch: AtomicU64::new(0),
            publishers_running: AtomicUsize::new(params.publishers as usize),
            last_lease_us: AtomicU64::new(0),
            abandoned: Mutex::new(HashMap::new()),
            stop_leasing: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            call_errors: Mutex::new(BTreeMap::new()),
            problems: Mutex::new(Vec::new()),
        });
        let mut threads = Vec::new();
        for n in 0..params.publishers {
            let (p, s, plan) = (params.clone(), shared.clone(), plan.clone());
            threads.push(
                thread::Builder::new()
                    .name(format!("publisher-{n}"))
                    .spawn(move || {
                        publish(&p, &s, &plan, n as usize);
                        s.publishers_running.fetch_sub(1, Ordering::Relaxed);
                    })
                    .context("spawning a publisher")?,
            );
        }
        for n in 0..params.workers {
            let (p, s, plan) = (params.clone(), shared.clone(), plan.clone());
            threads.push(
                thread::Builder::new()
                    .name(format!("worker-{n}"))
                    .spawn(move || work(&p, &s, &plan, n as usize))
                    .context("spawning a worker")?,
            );
        }
        Ok(QueueLoad { shared, threads })
    }

    /// Stops every thread and hands over the history. The workers lease nothing more but
    /// settle what they hold until each settle has an answer (its last attempt may have been
    /// applied without one: only a later answer says so), for up to `settle_timeout`.
    pub fn finish(self, settle_timeout: Duration) -> QueueHistory {
        self.shared.stop_leasing.store(true, Ordering::Relaxed);
        let deadline = Instant::now() + settle_timeout;
        while self.threads.iter().any(|t| !t.is_finished()) && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(20));
        }
        self.shared.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            let _ = t.join();
        }
        std::mem::take(&mut *lock(&self.shared.history))
    }
}

/// How a call failed, for the error counts; and whether it is worth another try elsewhere.
fn classify(e: &CallError) -> (String, bool) {
    match e {
        CallError::Io(io) => (format!("connection error ({:?})", io.kind()), true),
        CallError::Status { status, code, .. } => {
            (format!("{status} {code}"), *status >= 500 || *status == 429)
        }
        CallError::Decode(d) => (format!("unreadable answer: {d}"), false),
    }
}

/// A client of one node at a time, moving to the next node when asked.
struct Roving {
    addrs: Vec<String>,
    at: usize,
    client: QueueClient,
}

impl Roving {
    fn new(addrs: &[String], first: usize) -> Roving {
        let at = first % addrs.len();
        let mut client = QueueClient::new(&addrs[at]);
        // Bounded: a node cut off by an isolation must not hold a worker for a minute.
        client.conn.set_read_timeout(Duration::from_secs(10));
        Roving {
            addrs: addrs.to_vec(),
            at,
            client,
        }
    }

    fn next(&mut self) {
        self.at = (self.at + 1) % self.addrs.len();
        self.client = QueueClient::new(&self.addrs[self.at]);
        self.client.conn.set_read_timeout(Duration::from_secs(10));
    }
}

fn publish(p: &QueueLoadParams, s: &QueueShared, plan: &MessagePlan, n: usize) {
    let total = plan.kinds.len() as u64;
    let batch = p.publish_batch.max(1) as u64;
    let mut node = Roving::new(&p.addrs, n);
    loop {
        let b = s.next_batch.fetch_add(1, Ordering::Relaxed);
        let first = b * batch;
        if first >= total || s.stop.load(Ordering::Relaxed) || s.stop_leasing.load(Ordering::Relaxed) {
            return;
        }
        let last = (first + batch).min(total);
        // Paced: message i is due at i / rate seconds.
        let due = Duration::from_secs_f64(first as f64 / f64::from(p.rate_per_sec));
        if let Some(wait) = due.checked_sub(s.start.elapsed()) {
            thread::sleep(wait);
        }
        let messages: Vec<OutMessage> = (first..last)
            .map(|i| {
                let mut m = OutMessage::new(encode_payload(p.run, i, p.message_bytes))
                    .dedup_token(format!("{:x}-{i}", p.run));
                let delay = plan.kind(i).map_or(0, Kind::delay_ms);
                if delay > 0 {
                    m = m.delay_ms(delay);
                }
                m
            })
            .collect();
        loop {
            if s.stop.load(Ordering::Relaxed) {
                return;
            }
            let sent = s.now();
            match node.client.publish(&p.queue, &messages) {
                Ok(answers) => {
                    let answered = s.now();
                    if answers.len() != messages.len() {
                        s.problem(format!(
                            "a publish of {} messages answered {} entries",
                            messages.len(),
                            answers.len()
                        ));
                    }
                    let mut h = lock(&s.history);
                    for (i, a) in (first..last).zip(answers) {
                        h.publishes.push(PublishOp {
                            index: i,
                            id: a.id,
                            partition: PartitionNo(a.partition),
                            duplicate: a.duplicate,
                            sent,
                            answered,
                        });
                    }
                    drop(h);
                    s.published.fetch_add(last - first, Ordering::Relaxed);
                    break;
                }
                Err(e) => {
                    let (what, retry) = classify(&e);
                    s.error(format!("publish: {what}"));
                    if !retry {
                        s.problem(format!("publish of messages {first}..{last}: {e}"));
                        break;
                    }
                    node.next();
                    thread::sleep(Duration::from_millis(100));
                }
            }
        }
    }
}

/// What a worker does with a leased message.
enum Decision {
    Settle(SettleAction, Value),
    /// Leave this first lease to expire.
    Abandon,
    /// Ack this abandoned lease of the message (late: it must be refused), then ack.
    AckLateThenAck(LeaseOp),
}

fn decide(p: &QueueLoadParams, s: &QueueShared, plan: &MessagePlan, l: &Leased, op: &LeaseOp) -> Decision {
    let index = op.index;
    let kind = index.and_then(|i| plan.kind(i)).unwrap_or(Kind::Plain);
    let item = |action: SettleAction, extra: Value| {
        let mut v = json!({"id": l.id, "generation": l.generation, "action": action.as_str()});
        if let (Some(o), Value::Object(e)) = (v.as_object_mut(), extra) {
            o.extend(e);
        }
        Decision::Settle(action, v)
    };
    match kind {
        Kind::Plain | Kind::Delayed(_) => item(SettleAction::Ack, json!({})),
        Kind::Flaky if l.attempt <= 1 => item(
            SettleAction::Nack,
            json!({"delay_ms": p.flaky_retry_ms, "reason": "flaky"}),
        ),
        Kind::Flaky => item(SettleAction::Ack, json!({})),
        Kind::PoisonNack => item(SettleAction::Nack, json!({"reason": "poison"})),
        Kind::PoisonReject => item(SettleAction::Reject, json!({"reason": "poison"})),
        Kind::Abandon => {
            let Some(i) = index else {
                return item(SettleAction::Ack, json!({}));
            };
            match lock(&s.abandoned).entry(i) {
                std::collections::hash_map::Entry::Vacant(v) => {
                    v.insert(Some(op.clone()));
                    Decision::Abandon
                }
                std::collections::hash_map::Entry::Occupied(mut o) => match o.get_mut().take() {
                    Some(abandoned) => Decision::AckLateThenAck(abandoned),
                    None => item(SettleAction::Ack, json!({})),
                },
            }
        }
    }
}

fn work(p: &QueueLoadParams, s: &QueueShared, plan: &MessagePlan, n: usize) {
    let mut node = Roving::new(&p.addrs, n);
    let opts = LeaseOptions {
        max_messages: Some(p.lease_batch),
        visibility_timeout_ms: Some(p.visibility_timeout_ms),
        wait_ms: Some(500),
        group: None,
        consumer: Some(format!("worker-{n}")),
    };
    while !s.stop.load(Ordering::Relaxed) && !s.stop_leasing.load(Ordering::Relaxed) {
        let sent = s.now();
        let leased = match node.client.lease(&p.queue, &opts) {
            Ok(l) => l,
            Err(e) => {
                let (what, retry) = classify(&e);
                s.error(format!("lease: {what}"));
                if !retry {
                    s.problem(format!("lease: {e}"));
                }
                node.next();
                thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        let answered = s.now();
        if leased.is_empty() {
            continue;
        }
        s.last_lease_us.fetch_max(answered.0, Ordering::Relaxed);
        let mut items = Vec::new();
        let mut ops = Vec::new();
        let mut late = Vec::new();
        for l in &leased {
            let index = l.payload.as_deref().and_then(|t| decode_payload(p.run, t));
            let op = LeaseOp {
                id: l.id.clone(),
                index,
                generation: l.generation,
                attempt: l.attempt,
                partition: PartitionNo(l.partition),
                sent,
                answered,
                published_at_ms: l.published_at_ms,
                lease_expires_at_ms: l.lease_expires_at_ms,
                visibility_timeout_ms: p.visibility_timeout_ms,
            };
            match decide(p, s, plan, l, &op) {
                Decision::Settle(action, body) => items.push((op.clone(), action, body)),
                Decision::Abandon => {}
                Decision::AckLateThenAck(abandoned) => {
                    late.push(abandoned);
                    let body = json!({"id": l.id, "generation": l.generation, "action": "ack"});
                    items.push((op.clone(), SettleAction::Ack, body));
                }
            }
            ops.push(op);
        }
        lock(&s.history).leases.extend(ops);
        for abandoned in late {
            ack_late(s, &mut node, &abandoned);
        }
        settle(p, s, plan, &mut node, items);
    }
}

/// Settles `items` in batch requests until every item has an answer other than `5xx` (or the run
/// stops), recording every attempt of every item.
fn settle(
    p: &QueueLoadParams,
    s: &QueueShared,
    plan: &MessagePlan,
    node: &mut Roving,
    mut items: Vec<(LeaseOp, SettleAction, Value)>,
) {
    let mut retry = false;
    while !items.is_empty() {
        let body = json!({"messages": items.iter().map(|(_, _, v)| v.clone()).collect::<Vec<_>>()});
        let sent = s.now();
        let sent_wall_ms = wall_ms();
        let answer = node.client.settle_batch(&body);
        let answered = s.now();
        let record = |l: &LeaseOp, action: SettleAction, result: SettleResult| SettleOp {
            id: l.id.clone(),
            index: l.index,
            generation: l.generation,
            action,
            late: false,
            retry,
            partition: l.partition,
            sent,
            sent_wall_ms,
            answered,
            lease_expires_at_ms: l.lease_expires_at_ms,
            result,
        };
        let mut again = Vec::new();
        let mut ops = Vec::new();
        match answer {
            Ok(results) if results.len() == items.len() => {
                for ((l, action, v), r) in items.into_iter().zip(results) {
                    let result = item_result(&r);
                    let unanswered =
                        matches!(&result, SettleResult::Refused { status, .. } if *status >= 500);
                    if unanswered {
                        s.error(format!("settle item: {}", r.error.as_deref().unwrap_or("?")));
                        again.push((l.clone(), action, v));
                    }
                    // A retry refused 409 whose first attempt got no answer: an ack refused as
                    // already done, a reject, or the last nack of a poison message was applied
                    // by that attempt (the message is done).
                    if retry && matches!(&result, SettleResult::Refused { status: 409, .. }) {
                        let done = match action {
                            SettleAction::Ack => {
                                matches!(&result, SettleResult::Refused { code, .. } if code == "already_done")
                            }
                            SettleAction::Reject => true,
                            SettleAction::Nack => {
                                l.index.and_then(|i| plan.kind(i)) == Some(Kind::PoisonNack)
                                    && l.attempt >= p.max_attempts
                            }
                        };
                        if done {
                            s.resolve(l.index);
                        }
                    }
                    if let SettleResult::Settled { state } = &result {
                        if state == "acknowledged" || state == "dead_lettered" {
                            s.resolve(l.index);
                        }
                        if state == "acknowledged" {
                            if let Some(slot) = usize::try_from(l.partition.0)
                                .ok()
                                .and_then(|i| s.last_ack_us.get(i))
                            {
                                slot.fetch_max(answered.0 + 1, Ordering::Relaxed);
                            }
                        }
                    }
                    ops.push(record(&l, action, result));
                }
            }
            Ok(results) => {
                s.problem(format!(
                    "a settle of {} items answered {} results",
                    items.len(),
                    results.len()
                ));
                return;
            }
            Err(e) => {
                let (what, worth_retrying) = classify(&e);
                s.error(format!("settle: {what}"));
                let result = match &e {
                    CallError::Status { status, code, .. } => SettleResult::Refused {
                        status: *status,
                        code: code.clone(),
                    },
                    _ => SettleResult::Unknown,
                };
                for (l, action, _) in &items {
                    ops.push(record(l, *action, result.clone()));
                }
                if worth_retrying {
                    again = items;
                } else {
                    s.problem(format!("settle: {e}"));
                }
                node.next();
            }
        }
        lock(&s.history).settles.extend(ops);
        items = again;
        retry = true;
        if !items.is_empty() {
            if s.stop.load(Ordering::Relaxed) {
                return;
            }
            thread::sleep(Duration::from_millis(100));
        }
    }
}

fn item_result(r: &BatchSettled) -> SettleResult {
    if r.is_settled() {
        SettleResult::Settled {
            state: r.state.clone().unwrap_or_default(),
        }
    } else {
        SettleResult::Refused {
            status: r.status.unwrap_or(0),
            code: r.error.clone().unwrap_or_default(),
        }
    }
}

/// Acks `abandoned`, an expired lease of a message leased again since, until the answer is
/// not a `5xx`.
fn ack_late(s: &QueueShared, node: &mut Roving, abandoned: &LeaseOp) {
    let mut retry = false;
    loop {
        let sent = s.now();
        let sent_wall_ms = wall_ms();
        let answer = node.client.ack(&abandoned.id, abandoned.generation);
        let answered = s.now();
        let (result, again) = match answer {
            Ok(a) => (SettleResult::Settled { state: a.state }, false),
            Err(e) => {
                let (what, worth_retrying) = classify(&e);
                if worth_retrying {
                    s.error(format!("late ack: {what}"));
                    node.next();
                }
                match e {
                    CallError::Status { status, code, .. } => {
                        (SettleResult::Refused { status, code }, worth_retrying)
                    }
                    _ => (SettleResult::Unknown, worth_retrying),
                }
            }
        };
        lock(&s.history).settles.push(SettleOp {
            id: abandoned.id.clone(),
            index: abandoned.index,
            generation: abandoned.generation,
            action: SettleAction::Ack,
            late: true,
            retry,
            partition: abandoned.partition,
            sent,
            sent_wall_ms,
            answered,
            lease_expires_at_ms: abandoned.lease_expires_at_ms,
            result,
        });
        if !again || s.stop.load(Ordering::Relaxed) {
            return;
        }
        retry = true;
        thread::sleep(Duration::from_millis(100));
    }
}
