//! The HTTP queue API (docs/http-api.md) end to end against the real `strand` binary, through
//! the blocking client of `strand_compat_tests::queue_client`:
//!
//! * the big run: 100,000 messages (10% poison) through 8 workers that die now and then, across
//!   a `kill -9` and restart of the broker; every good message acknowledged, every poison message
//!   in the dead-letter topic with its failure context, nothing lost or appended twice;
//! * delayed messages are never leased before `published_at_ms + delay_ms`;
//! * dedup tokens (also across a restart), with a `dedup_window_ms: 0` control;
//! * `ordering: "key"` under concurrent leasers and a nack, with an `ordering: "none"` control;
//! * `kcat` reads the dead-letter topic's failure-context headers;
//! * bad input answers (400, 404, 405, 409, 413) and the broker serving on, losing nothing;
//! * redrive of dead letters (same ids, fresh attempts), and a second redrive moving nothing;
//! * the queue series on `/metrics`;
//! * a retried ack answers 200 again within its documented bound (also across a restart), and
//!   409 `already_done` beyond it.
//!
//! Each test starts its own broker (the HTTP address comes from its ready file).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use rdkafka::Offset;
use serde_json::{json, Value};
use strand_compat_tests::admin;
use strand_compat_tests::clients;
use strand_compat_tests::data::{Consumed, Gen};
use strand_compat_tests::queue_client::{
    CallError, LeaseOptions, Leased, OutMessage, Published, QueueClient,
};
use strand_compat_tests::{tools, unique_topic, wait_for, Broker};

// ------------------------------------------------------------------------------------------
// Helpers

fn start_broker() -> Broker {
    Broker::builder()
        .needs_spawned("the HTTP queue API's address is read from the broker's ready file")
        .start()
}

/// Creates a queue, asserting `201 Created`; returns the answer.
fn create_queue(c: &mut QueueClient, name: &str, settings: Value) -> Value {
    let (status, v) = c
        .put_queue(name, &settings)
        .unwrap_or_else(|e| panic!("PUT /v1/queues/{name} {settings}: {e}"));
    assert_eq!(status, 201, "creating queue {name}: {v}");
    v
}

/// Creates a queue named [`unique_topic`]`(prefix)`, asserting `201 Created`; returns its name.
fn new_queue(c: &mut QueueClient, prefix: &str, settings: Value) -> String {
    let name = unique_topic(prefix);
    create_queue(c, &name, settings);
    name
}

/// Whether a failed call is worth retrying as is: the connection failed (the broker is down or
/// restarting) or the broker said it cannot serve now.
fn retryable(e: &CallError) -> bool {
    e.is_io() || matches!(e.status(), Some((503, _)))
}

/// Calls `f` until it does not fail with a retryable error, for at most 60 s.
fn with_retries<T>(mut f: impl FnMut() -> Result<T, CallError>) -> Result<T, CallError> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut pause = Duration::from_millis(20);
    loop {
        match f() {
            Err(e) if retryable(&e) && Instant::now() < deadline => {
                thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(500));
            }
            r => return r,
        }
    }
}

/// `(log start, log end)` of every partition of a topic, by Kafka ListOffsets.
fn log_extent(bootstrap: &str, topic: &str) -> Vec<(i64, i64)> {
    let mut c = admin::connect(bootstrap);
    let (_, partitions) = admin::topic_info(&mut c, topic);
    (0..partitions as i32)
        .map(|p| (admin::earliest(&mut c, topic, p), admin::latest(&mut c, topic, p)))
        .collect()
}

/// Records in a topic's log (sum over partitions of end - start).
fn log_count(bootstrap: &str, topic: &str) -> i64 {
    log_extent(bootstrap, topic).iter().map(|(s, e)| e - s).sum()
}

/// Every record of a topic, log start to end of each partition, read with rdkafka.
fn read_topic(bootstrap: &str, topic: &str) -> Vec<Consumed> {
    let mut out = Vec::new();
    for (p, (start, end)) in log_extent(bootstrap, topic).into_iter().enumerate() {
        if end > start {
            out.extend(clients::rdkafka_consume(
                bootstrap,
                topic,
                p as i32,
                Offset::Offset(start),
                (end - start) as usize,
                Duration::from_secs(60),
            ));
        }
    }
    out
}

/// A header of a consumed record as text.
fn header<'a>(c: &'a Consumed, name: &str) -> Option<&'a str> {
    c.headers
        .iter()
        .find(|(k, _)| k == name)
        .and_then(|(_, v)| v.as_deref())
        .and_then(|v| std::str::from_utf8(v).ok())
}

/// A header parsed as a number, panicking with the record when it is missing or not a number.
fn header_i64(c: &Consumed, name: &str) -> i64 {
    header(c, name)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("dead letter without a numeric {name} header: {c:?}"))
}

/// The group statistics of `GET /v1/queues/{queue}` (zeros when the group has none yet).
fn group_stats(c: &mut QueueClient, queue: &str) -> Result<(u64, u64, u64), CallError> {
    let v = c.get_queue(queue)?;
    let g = &v["groups"]["default"];
    let n = |k: &str| g.get(k).and_then(Value::as_u64).unwrap_or(0);
    Ok((n("available"), n("leased"), n("delayed")))
}

/// The `(status, error code)` of a raw answer.
fn status_code(r: &strand_compat_tests::queue_client::Response) -> (u16, String) {
    (r.status, r.error_code().unwrap_or_default())
}

fn percentile(sorted: &[i64], p: f64) -> i64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

// ------------------------------------------------------------------------------------------
// 1. The big run

const BIG_MESSAGES: usize = 100_000;
const BIG_BATCH: usize = 500;
const BIG_PARTITIONS: u32 = 4;
const BIG_WORKERS: usize = 8;
const BIG_MAX_ATTEMPTS: u32 = 4;
const BIG_VISIBILITY_MS: u64 = 3_000;
const BIG_LEASE_MAX: u32 = 32;
/// A worker dies holding half of a lease batch once in this many batches (when allowed).
const BIG_DEATH_ONE_IN: u64 = 40;
/// The broker is killed once this many good messages are acknowledged.
const BIG_KILL_AT_ACKED: usize = 30_000;
/// The publisher stays at most this many good messages ahead of the acknowledgements, so that
/// the kill happens while it still publishes.
const BIG_PUBLISH_AHEAD: usize = 20_000;

fn big_is_poison(i: usize) -> bool {
    i % 10 == 7
}

fn big_payload(i: usize) -> String {
    format!("big {i} {}", if big_is_poison(i) { "poison" } else { "good" })
}

/// The message index of a big-run payload.
fn big_index(payload: &str) -> Option<usize> {
    let mut parts = payload.split(' ');
    if parts.next() != Some("big") {
        return None;
    }
    let i: usize = parts.next()?.parse().ok()?;
    (i < BIG_MESSAGES && big_payload(i) == payload).then_some(i)
}

fn big_good_count() -> usize {
    (0..BIG_MESSAGES).filter(|i| !big_is_poison(*i)).count()
}

struct LeaseEvent {
    index: usize,
    m: Leased,
    /// When the lease request was sent and its answer read (test clock).
    sent: Instant,
    after_restart: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AckKind {
    /// `200`.
    Ok,
    /// `409 already_done`.
    AlreadyDone,
}

struct AckEvent {
    index: usize,
    generation: u64,
    kind: AckKind,
    /// The ack was sent again after a connection error.
    retried: bool,
    answered: Instant,
    after_restart: bool,
}

#[derive(Default)]
struct BigCounters {
    publish_conn_errors: AtomicU64,
    publish_retried_batches: AtomicU64,
    publish_duplicates_on_retry: AtomicU64,
    worker_conn_errors: AtomicU64,
    unavailable_answers: AtomicU64,
    deaths: AtomicU64,
    abandoned: AtomicU64,
    acks_ok: AtomicU64,
    acks_retried_ok_again: AtomicU64,
    acks_retried_already_done: AtomicU64,
    acks_already_done_first_try: AtomicU64,
    acks_lost_lease: AtomicU64,
    nacks_ok: AtomicU64,
    nacks_dead_lettered: AtomicU64,
    nacks_conflict: AtomicU64,
    settles_retried: AtomicU64,
}

struct Big {
    queue: String,
    addr: String,
    stop: AtomicBool,
    restarted: AtomicBool,
    published: Mutex<Vec<Option<Published>>>,
    published_count: AtomicUsize,
    /// Good messages known done (an ack answered 200 or 409 already_done).
    acked_flags: Mutex<Vec<bool>>,
    acked_good: AtomicUsize,
    events: Mutex<Vec<LeaseEvent>>,
    acks: Mutex<Vec<AckEvent>>,
    /// (index, generation, attempt) of leases abandoned by dying workers.
    abandoned: Mutex<Vec<(usize, u64, u32)>>,
    problems: Mutex<Vec<String>>,
    c: BigCounters,
}

impl Big {
    fn problem(&self, p: String) {
        let mut v = self.problems.lock().unwrap();
        if v.len() < 200 {
            v.push(p);
        }
        if v.len() >= 50 {
            self.stop.store(true, Ordering::SeqCst);
        }
    }

    fn inc(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn mark_acked(&self, index: usize) {
        let mut f = self.acked_flags.lock().unwrap();
        if !f[index] {
            f[index] = true;
            self.acked_good.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }
}

fn pause_after_error(pause: &mut Duration) {
    thread::sleep(*pause);
    *pause = (*pause * 2).min(Duration::from_millis(400));
}

fn big_publisher(big: Arc<Big>) {
    let mut c = QueueClient::new(&big.addr);
    let good_before = |n: usize| (0..n).filter(|i| !big_is_poison(*i)).count();
    for start in (0..BIG_MESSAGES).step_by(BIG_BATCH) {
        // Stay at most BIG_PUBLISH_AHEAD good messages ahead of the workers.
        while good_before(start) > big.acked_good.load(Ordering::SeqCst) + BIG_PUBLISH_AHEAD {
            if big.stopped() {
                return;
            }
            thread::sleep(Duration::from_millis(10));
        }
        let end = (start + BIG_BATCH).min(BIG_MESSAGES);
        let msgs: Vec<OutMessage> = (start..end)
            .map(|i| OutMessage::new(big_payload(i)).dedup_token(format!("{}-{i}", big.queue)))
            .collect();
        let mut tries = 0u32;
        let mut pause = Duration::from_millis(20);
        let answer = loop {
            if big.stopped() {
                return;
            }
            match c.publish(&big.queue, &msgs) {
                Ok(list) => break list,
                Err(e) if retryable(&e) => {
                    if e.is_io() {
                        Big::inc(&big.c.publish_conn_errors);
                    } else {
                        Big::inc(&big.c.unavailable_answers);
                    }
                    tries += 1;
                    pause_after_error(&mut pause);
                }
                Err(e) => {
                    big.problem(format!("publish of {start}..{end}: {e}"));
                    return;
                }
            }
        };
        let dups = answer.iter().filter(|p| p.duplicate).count();
        if tries == 0 && dups > 0 {
            big.problem(format!(
                "the first publish of {start}..{end} answered {dups} duplicates although every token is new"
            ));
        }
        if tries > 0 {
            Big::inc(&big.c.publish_retried_batches);
            big.c
                .publish_duplicates_on_retry
                .fetch_add(dups as u64, Ordering::Relaxed);
        }
        {
            let mut p = big.published.lock().unwrap();
            for (i, a) in (start..end).zip(answer) {
                p[i] = Some(a);
            }
        }
        big.published_count.store(end, Ordering::SeqCst);
    }
}

fn big_worker(big: Arc<Big>, w: usize) {
    let mut rng = Gen::new(0x0B16_0000 + w as u64);
    let mut life = 0u32;
    let mut c = QueueClient::new(&big.addr);
    let mut pause = Duration::from_millis(20);
    while !big.stopped() {
        let opts = LeaseOptions {
            max_messages: Some(BIG_LEASE_MAX),
            visibility_timeout_ms: Some(BIG_VISIBILITY_MS),
            wait_ms: Some(500),
            group: None,
            consumer: Some(format!("worker-{w}-life-{life}")),
        };
        let sent = Instant::now();
        let after_restart = big.restarted.load(Ordering::SeqCst);
        let leased = match c.lease(&big.queue, &opts) {
            Ok(l) => l,
            Err(e) if retryable(&e) => {
                if e.is_io() {
                    Big::inc(&big.c.worker_conn_errors);
                } else {
                    Big::inc(&big.c.unavailable_answers);
                }
                pause_after_error(&mut pause);
                continue;
            }
            Err(e) => {
                big.problem(format!("worker {w}: lease: {e}"));
                pause_after_error(&mut pause);
                continue;
            }
        };
        pause = Duration::from_millis(20);
        let mut batch = Vec::with_capacity(leased.len());
        for m in leased {
            match m.payload.as_deref().and_then(big_index) {
                Some(i) => batch.push((i, m)),
                None => big.problem(format!(
                    "worker {w}: leased a message that was never published: {m:?}"
                )),
            }
        }
        if batch.is_empty() {
            continue;
        }
        {
            let mut ev = big.events.lock().unwrap();
            for (i, m) in &batch {
                ev.push(LeaseEvent {
                    index: *i,
                    m: m.clone(),
                    sent,
                    after_restart,
                });
            }
        }
        // Die now and then holding half of the batch: only when every good message in it is
        // on its first attempt, so that deaths alone never cost a good message more than one
        // of its attempts.
        let die = batch.len() >= 2
            && rng.below(BIG_DEATH_ONE_IN) == 0
            && batch.iter().all(|(i, m)| big_is_poison(*i) || m.attempt == 1);
        let keep = if die { batch.len() / 2 } else { batch.len() };
        for (i, m) in &batch[..keep] {
            big_settle(&big, &mut c, w, *i, m);
        }
        if die {
            Big::inc(&big.c.deaths);
            big.c
                .abandoned
                .fetch_add((batch.len() - keep) as u64, Ordering::Relaxed);
            big.abandoned
                .lock()
                .unwrap()
                .extend(batch[keep..].iter().map(|(i, m)| (*i, m.generation, m.attempt)));
            c.conn.disconnect();
            c = QueueClient::new(&big.addr);
            life += 1;
        }
    }
}

/// Acks a good message or nacks a poison one, retrying through connection failures with the
/// same generation.
fn big_settle(big: &Big, c: &mut QueueClient, w: usize, index: usize, m: &Leased) {
    let poison = big_is_poison(index);
    let body = if poison {
        json!({ "generation": m.generation, "action": "nack", "reason": format!("poison {index}") })
    } else {
        json!({ "generation": m.generation, "action": "ack" })
    };
    let mut retried = false;
    let mut pause = Duration::from_millis(20);
    let give_up = Instant::now() + Duration::from_secs(90);
    loop {
        let result = c.settle(&m.id, &body);
        let after_restart = big.restarted.load(Ordering::SeqCst);
        match result {
            Ok(s) => {
                if poison {
                    // Before the last attempt: retried after the backoff, which may already have
                    // passed when the answer is made (`available`).
                    let expected: &[&str] = if m.attempt >= BIG_MAX_ATTEMPTS {
                        &["dead_lettered"]
                    } else {
                        &["delayed", "available"]
                    };
                    if !expected.contains(&s.state.as_str()) || s.attempts != Some(m.attempt) {
                        big.problem(format!(
                            "worker {w}: nack of attempt {} of {index} answered {s:?}, expected a state in \
                             {expected:?} and attempts {}",
                            m.attempt, m.attempt
                        ));
                    }
                    Big::inc(&big.c.nacks_ok);
                    if s.state == "dead_lettered" {
                        Big::inc(&big.c.nacks_dead_lettered);
                    }
                } else {
                    if s.state != "acknowledged" || s.action != "ack" {
                        big.problem(format!("worker {w}: ack of {index} answered {s:?}"));
                    }
                    Big::inc(&big.c.acks_ok);
                    if retried {
                        Big::inc(&big.c.acks_retried_ok_again);
                    }
                    big.acks.lock().unwrap().push(AckEvent {
                        index,
                        generation: m.generation,
                        kind: AckKind::Ok,
                        retried,
                        answered: Instant::now(),
                        after_restart,
                    });
                    big.mark_acked(index);
                }
                return;
            }
            Err(e) if retryable(&e) => {
                if Instant::now() > give_up {
                    big.problem(format!("worker {w}: settling {index} kept failing: {e}"));
                    return;
                }
                if e.is_io() {
                    Big::inc(&big.c.worker_conn_errors);
                } else {
                    Big::inc(&big.c.unavailable_answers);
                }
                Big::inc(&big.c.settles_retried);
                retried = true;
                pause_after_error(&mut pause);
            }
            Err(CallError::Status {
                status: 409,
                code,
                body,
            }) => {
                match (poison, code.as_str()) {
                    (false, "already_done") => {
                        if retried {
                            Big::inc(&big.c.acks_retried_already_done);
                        } else {
                            Big::inc(&big.c.acks_already_done_first_try);
                        }
                        big.acks.lock().unwrap().push(AckEvent {
                            index,
                            generation: m.generation,
                            kind: AckKind::AlreadyDone,
                            retried,
                            answered: Instant::now(),
                            after_restart,
                        });
                        big.mark_acked(index);
                    }
                    // The lease ended before the ack arrived (expired while the broker was
                    // down, or slow processing): the message comes again.
                    (false, "stale_generation" | "not_leased") => Big::inc(&big.c.acks_lost_lease),
                    (true, "already_done" | "stale_generation" | "not_leased") => {
                        Big::inc(&big.c.nacks_conflict)
                    }
                    _ => big.problem(format!(
                        "worker {w}: settling {index} (attempt {}) answered 409 {body}",
                        m.attempt
                    )),
                }
                return;
            }
            Err(e) => {
                big.problem(format!(
                    "worker {w}: settling {index} (attempt {}, retried {retried}): {e}",
                    m.attempt
                ));
                return;
            }
        }
    }
}

#[test]
fn big_run_with_poison_worker_deaths_and_a_broker_crash() {
    let mut broker = start_broker();
    let bootstrap = broker.bootstrap();
    let queue = unique_topic("big");
    let mut admin_client = QueueClient::new(&broker.http_addr());
    let created = create_queue(
        &mut admin_client,
        &queue,
        json!({
            "partitions": BIG_PARTITIONS,
            "max_attempts": BIG_MAX_ATTEMPTS,
            "visibility_timeout_ms": BIG_VISIBILITY_MS,
            "backoff_base_ms": 50,
            "backoff_max_ms": 1000
        }),
    );
    let dlq = created["config"]["dead_letter_topic"]
        .as_str()
        .unwrap_or_else(|| panic!("no dead_letter_topic in {created}"))
        .to_owned();
    assert_eq!(
        dlq,
        format!("{queue}.dlq"),
        "default dead-letter topic: {created}"
    );

    let big = Arc::new(Big {
        queue: queue.clone(),
        addr: broker.http_addr(),
        stop: AtomicBool::new(false),
        restarted: AtomicBool::new(false),
        published: Mutex::new(vec![None; BIG_MESSAGES]),
        published_count: AtomicUsize::new(0),
        acked_flags: Mutex::new(vec![false; BIG_MESSAGES]),
        acked_good: AtomicUsize::new(0),
        events: Mutex::new(Vec::with_capacity(BIG_MESSAGES * 3 / 2)),
        acks: Mutex::new(Vec::with_capacity(BIG_MESSAGES)),
        abandoned: Mutex::new(Vec::new()),
        problems: Mutex::new(Vec::new()),
        c: BigCounters::default(),
    });
    let good_total = big_good_count();
    let poison_total = BIG_MESSAGES - good_total;
    let t0 = Instant::now();
    let mut threads = Vec::new();
    {
        let b = big.clone();
        threads.push(thread::spawn(move || big_publisher(b)));
    }
    for w in 0..BIG_WORKERS {
        let b = big.clone();
        threads.push(thread::spawn(move || big_worker(b, w)));
    }
    let threads_alive =
        |threads: &Vec<thread::JoinHandle<()>>| threads.iter().skip(1).all(|t| !t.is_finished());

    // Phase 1: run until BIG_KILL_AT_ACKED good messages are acknowledged.
    let deadline = Instant::now() + Duration::from_secs(120);
    while big.acked_good.load(Ordering::SeqCst) < BIG_KILL_AT_ACKED {
        broker.assert_running();
        assert!(
            Instant::now() < deadline && !big.stopped() && threads_alive(&threads),
            "before the kill: {} good messages acknowledged, {} published; problems: {:?}",
            big.acked_good.load(Ordering::SeqCst),
            big.published_count.load(Ordering::SeqCst),
            big.problems.lock().unwrap()
        );
        thread::sleep(Duration::from_millis(20));
    }
    let published_at_kill = big.published_count.load(Ordering::SeqCst);
    let acked_at_kill = big.acked_good.load(Ordering::SeqCst);
    let kill_at = t0.elapsed();
    broker.kill9();
    thread::sleep(Duration::from_millis(700));
    let restart_began = Instant::now();
    broker.restart();
    let restart_took = restart_began.elapsed();
    big.restarted.store(true, Ordering::SeqCst);
    assert_eq!(
        broker.http_addr(),
        big.addr,
        "the restarted broker must serve HTTP on the same address"
    );

    // Phase 2: until every good message is acknowledged and nothing is pending.
    let deadline = Instant::now() + Duration::from_secs(150);
    let mut last_progress = (0usize, Instant::now());
    let finished = loop {
        broker.assert_running();
        let acked = big.acked_good.load(Ordering::SeqCst);
        let published = big.published_count.load(Ordering::SeqCst);
        if acked != last_progress.0 {
            last_progress = (acked, Instant::now());
        }
        if acked == good_total && published == BIG_MESSAGES {
            if let Ok((0, 0, 0)) = group_stats(&mut admin_client, &queue) {
                break true;
            }
        }
        if Instant::now() > deadline
            || big.stopped()
            || !threads_alive(&threads)
            || last_progress.1.elapsed() > Duration::from_secs(30)
        {
            break false;
        }
        thread::sleep(Duration::from_millis(100));
    };
    let work_time = t0.elapsed();
    big.stop.store(true, Ordering::SeqCst);
    for t in threads {
        t.join().expect("a big-run thread panicked");
    }
    let problems = big.problems.lock().unwrap().clone();
    assert!(
        problems.is_empty(),
        "problems during the run:\n{}",
        problems.join("\n")
    );
    assert!(
        finished,
        "the run did not finish: {} of {good_total} good messages acknowledged, {} of {BIG_MESSAGES} published, \
         queue stats {:?}",
        big.acked_good.load(Ordering::SeqCst),
        big.published_count.load(Ordering::SeqCst),
        group_stats(&mut admin_client, &queue).ok()
    );

    // Every message published once, each with its own id, and the log holds each once.
    let published: Vec<Published> = big
        .published
        .lock()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, p)| {
            p.clone()
                .unwrap_or_else(|| panic!("message {i} has no publish answer"))
        })
        .collect();
    let mut index_of: HashMap<&str, usize> = HashMap::with_capacity(BIG_MESSAGES);
    for (i, p) in published.iter().enumerate() {
        if let Some(j) = index_of.insert(p.id.as_str(), i) {
            panic!("messages {j} and {i} were answered the same id {}", p.id);
        }
        assert!(
            (0..BIG_PARTITIONS as i32).contains(&p.partition),
            "message {i} published to {p:?}"
        );
    }
    let extent = log_extent(&bootstrap, &queue);
    let in_log: i64 = extent.iter().map(|(s, e)| e - s).sum();
    assert_eq!(
        in_log, BIG_MESSAGES as i64,
        "the queue's log must hold each message once (publish retries carry dedup tokens); partitions (start, end): \
         {extent:?}"
    );

    // The dead-letter topic: every poison message, with its failure context, and nothing else.
    wait_for(
        Duration::from_secs(30),
        "every poison message in the dead-letter topic",
        || (log_count(&bootstrap, &dlq) >= poison_total as i64).then_some(()),
    );
    let dead = read_topic(&bootstrap, &dlq);
    let mut dead_by_index: BTreeMap<usize, Vec<&Consumed>> = BTreeMap::new();
    let mut reasons_expired = 0usize;
    for d in &dead {
        let payload = d
            .value
            .as_deref()
            .and_then(|v| std::str::from_utf8(v).ok())
            .unwrap_or_else(|| panic!("dead letter without a text payload: {d:?}"));
        let i = big_index(payload).unwrap_or_else(|| panic!("dead letter of no published message: {d:?}"));
        assert!(
            big_is_poison(i),
            "good message {i} was dead-lettered (deaths and the crash must not exhaust its attempts): {d:?}"
        );
        let p = &published[i];
        assert_eq!(
            header(d, "strand-message-id"),
            Some(p.id.as_str()),
            "dead letter of {i}: every copy carries the message's id {}: {d:?}",
            p.id
        );
        assert_eq!(
            header(d, "strand-dlq-source-topic"),
            Some(queue.as_str()),
            "{d:?}"
        );
        assert_eq!(
            header_i64(d, "strand-dlq-source-partition"),
            p.partition as i64,
            "{d:?}"
        );
        assert_eq!(header_i64(d, "strand-dlq-source-offset"), p.offset, "{d:?}");
        assert_eq!(
            header_i64(d, "strand-dlq-attempts"),
            BIG_MAX_ATTEMPTS as i64,
            "dead letter of {i}: {d:?}"
        );
        assert_eq!(header(d, "strand-dlq-cause"), Some("max-attempts"), "{d:?}");
        let reason = header(d, "strand-dlq-reason");
        if reason == Some("lease expired") {
            reasons_expired += 1;
        } else {
            assert_eq!(reason, Some(format!("poison {i}").as_str()), "{d:?}");
        }
        let first = header_i64(d, "strand-dlq-first-delivery-ms");
        let last = header_i64(d, "strand-dlq-last-delivery-ms");
        let at = header_i64(d, "strand-dlq-time-ms");
        assert!(first <= last && last <= at, "delivery times out of order: {d:?}");
        assert_eq!(d.key, None, "dead letter of {i} gained a key: {d:?}");
        dead_by_index.entry(i).or_default().push(d);
    }
    let dlq_duplicates = dead.len() - dead_by_index.len();
    let poison: BTreeSet<usize> = (0..BIG_MESSAGES).filter(|i| big_is_poison(*i)).collect();
    let dead_set: BTreeSet<usize> = dead_by_index.keys().copied().collect();
    let missing: Vec<&usize> = poison.difference(&dead_set).take(10).collect();
    assert!(
        missing.is_empty(),
        "{} poison messages are not in the dead-letter topic, e.g. {missing:?}",
        poison.difference(&dead_set).count()
    );

    // Acknowledgements: every good message, each acked with one generation only.
    let acks = big.acks.lock().unwrap();
    let events = big.events.lock().unwrap();
    let mut ok_gens: HashMap<usize, BTreeSet<u64>> = HashMap::new();
    let mut first_ok: HashMap<usize, (u64, Instant)> = HashMap::new();
    let mut done_evidence: BTreeSet<usize> = BTreeSet::new();
    for a in acks.iter() {
        assert!(!big_is_poison(a.index), "poison message {} was acked", a.index);
        if a.kind == AckKind::Ok {
            ok_gens.entry(a.index).or_default().insert(a.generation);
            let e = first_ok.entry(a.index).or_insert((a.generation, a.answered));
            if a.answered < e.1 {
                *e = (a.generation, a.answered);
            }
        }
        if a.kind == AckKind::Ok || a.retried {
            done_evidence.insert(a.index);
        }
    }
    for (i, gens) in &ok_gens {
        assert_eq!(
            gens.len(),
            1,
            "message {i} was acknowledged (200) under several leases {gens:?}: it was delivered again after an ack"
        );
    }
    let not_acked: Vec<usize> = (0..BIG_MESSAGES)
        .filter(|i| !big_is_poison(*i) && !done_evidence.contains(i))
        .take(10)
        .collect();
    assert!(
        not_acked.is_empty(),
        "good messages without an acknowledgement (200, or 409 already_done to a retried ack), e.g. {not_acked:?}"
    );
    // published = acked ∪ dead-lettered, disjoint.
    assert!(dead_set.iter().all(|i| !done_evidence.contains(i)));
    assert_eq!(done_evidence.len() + dead_set.len(), BIG_MESSAGES);

    // Leases: per message in generation order, attempts only grow; never leased again after a
    // 200 ack; ids, partitions and offsets those of the publish; never a lease before publish.
    let mut by_index: HashMap<usize, Vec<&LeaseEvent>> = HashMap::with_capacity(BIG_MESSAGES);
    for e in events.iter() {
        by_index.entry(e.index).or_default().push(e);
    }
    let mut max_good_attempt = 0u32;
    let mut attempts_hist: BTreeMap<u32, usize> = BTreeMap::new();
    let mut leases_after_restart = 0usize;
    for (i, evs) in by_index.iter_mut() {
        let i = *i;
        let p = &published[i];
        evs.sort_by_key(|e| e.m.generation);
        for w in evs.windows(2) {
            let (a, b) = (&w[0].m, &w[1].m);
            assert!(
                a.generation < b.generation && a.attempt < b.attempt,
                "message {i}: lease (generation {}, attempt {}) then (generation {}, attempt {}): attempt numbers \
                 must grow with every lease",
                a.generation,
                a.attempt,
                b.generation,
                b.attempt
            );
            assert!(
                a.lease_expires_at_ms <= b.lease_expires_at_ms,
                "message {i}: a later lease expires earlier: {a:?} then {b:?}"
            );
        }
        for e in evs.iter() {
            let m = &e.m;
            assert_eq!(
                (m.id.as_str(), m.partition, m.offset),
                (p.id.as_str(), p.partition, p.offset),
                "message {i} leased with another id or position than published"
            );
            assert!(
                (1..=BIG_MAX_ATTEMPTS).contains(&m.attempt),
                "message {i} leased with attempt {}",
                m.attempt
            );
            assert!(
                m.published_at_ms <= m.lease_expires_at_ms - BIG_VISIBILITY_MS as i64,
                "message {i} leased before it was published: {m:?}"
            );
            if e.after_restart {
                leases_after_restart += 1;
            }
            if !big_is_poison(i) {
                max_good_attempt = max_good_attempt.max(m.attempt);
            }
            *attempts_hist.entry(m.attempt).or_default() += 1;
            if let Some((g, answered)) = first_ok.get(&i) {
                assert!(
                    m.generation <= *g,
                    "message {i} was leased again (generation {}, attempt {}) after its ack of generation {g} was \
                     answered 200",
                    m.generation,
                    m.attempt
                );
                // Independently of generations, by the test's clock: every lease of the message
                // was asked for before its ack was answered 200.
                assert!(
                    e.sent < *answered,
                    "message {i} was leased (generation {}, attempt {}) by a request sent {:?} after its ack \
                     was answered 200",
                    m.generation,
                    m.attempt,
                    e.sent.duration_since(*answered)
                );
            }
        }
        if big_is_poison(i) {
            // Every attempt of a poison message is accounted for: it was dead-lettered after
            // exactly max_attempts deliveries (checked above from the dead letter itself).
            assert!(evs.iter().all(|e| e.m.attempt <= BIG_MAX_ATTEMPTS));
        }
    }
    assert!(
        max_good_attempt < BIG_MAX_ATTEMPTS,
        "a good message was leased for the {max_good_attempt}th time: deaths and the crash came close to \
         dead-lettering it"
    );
    let never_leased = (0..BIG_MESSAGES).filter(|i| !by_index.contains_key(i)).count();
    assert_eq!(never_leased, 0, "{never_leased} messages were never leased");
    // The first lease seen of a dead letter is its first delivery unless that lease's answer was lost.
    for (i, ds) in &dead_by_index {
        if let Some(first) = by_index
            .get(i)
            .and_then(|v| v.first())
            .filter(|e| e.m.attempt == 1)
        {
            for d in ds {
                assert_eq!(
                    header_i64(d, "strand-dlq-first-delivery-ms"),
                    first.m.lease_expires_at_ms - BIG_VISIBILITY_MS as i64,
                    "message {i}: strand-dlq-first-delivery-ms is not the time of the first lease {:?}",
                    first.m
                );
            }
        }
    }

    // Abandoned leases (dead workers) were delivered again with a higher attempt.
    let abandoned = big.abandoned.lock().unwrap();
    for (i, g, attempt) in abandoned.iter() {
        if *attempt < BIG_MAX_ATTEMPTS {
            let again = by_index
                .get(i)
                .is_some_and(|v| v.iter().any(|e| e.m.generation > *g && e.m.attempt > *attempt));
            assert!(
                again,
                "message {i} abandoned by a dead worker (generation {g}) was never leased again"
            );
        }
    }

    // The run exercised what it claims to.
    let c = &big.c;
    let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
    assert!(get(&c.deaths) > 0 && !abandoned.is_empty(), "no worker died");
    assert!(
        get(&c.worker_conn_errors) > 0,
        "no worker saw the broker go away: the kill did not happen mid-run"
    );
    assert!(
        published_at_kill < BIG_MESSAGES,
        "the publisher had finished before the kill"
    );
    assert!(leases_after_restart > 0, "nothing was leased after the restart");
    assert!(
        acks.iter().any(|a| a.after_restart && a.kind == AckKind::Ok),
        "nothing was acked after the restart"
    );
    assert!(get(&c.nacks_dead_lettered) > 0, "no nack dead-lettered a message");

    let secs = work_time.as_secs_f64();
    eprintln!(
        "[big run] {BIG_MESSAGES} messages ({good_total} good, {poison_total} poison) through {BIG_WORKERS} workers \
         in {secs:.1} s: {:.0} messages/s end to end, {} leases ({:.0}/s), {} acks 200, {} nacks\n\
         [big run] kill -9 after {:.1} s ({acked_at_kill} acked, {published_at_kill} published); restart took \
         {:.2} s; {} leases after the restart\n\
         [big run] worker deaths {} (abandoned {} leases); connection errors: workers {}, publisher {}; 503 answers \
         {}; publish batches retried {} ({} messages answered duplicate); settles retried {}\n\
         [big run] retried acks answered 200 again {}, 409 already_done {}; acks already_done on first try {}; acks \
         whose lease had ended {}; nacks 409 {}\n\
         [big run] dead letters: {} records for {} messages ({dlq_duplicates} duplicate copies), {reasons_expired} \
         with reason `lease expired`; attempts per lease {attempts_hist:?}; highest attempt of a good message \
         {max_good_attempt}",
        BIG_MESSAGES as f64 / secs,
        events.len(),
        events.len() as f64 / secs,
        get(&c.acks_ok),
        get(&c.nacks_ok),
        kill_at.as_secs_f64(),
        restart_took.as_secs_f64(),
        leases_after_restart,
        get(&c.deaths),
        get(&c.abandoned),
        get(&c.worker_conn_errors),
        get(&c.publish_conn_errors),
        get(&c.unavailable_answers),
        get(&c.publish_retried_batches),
        get(&c.publish_duplicates_on_retry),
        get(&c.settles_retried),
        get(&c.acks_retried_ok_again),
        get(&c.acks_retried_already_done),
        get(&c.acks_already_done_first_try),
        get(&c.acks_lost_lease),
        get(&c.nacks_conflict),
        dead.len(),
        dead_by_index.len(),
    );
}

// ------------------------------------------------------------------------------------------
// 2. Delays

#[test]
fn delayed_messages_are_never_leased_early() {
    const N: usize = 10_000;
    const MAX_DELAY_MS: u64 = 10_000;
    const VISIBILITY_MS: u64 = 30_000;
    let broker = start_broker();
    let addr = broker.http_addr();
    let queue = unique_topic("delays");
    let mut c = QueueClient::new(&addr);
    create_queue(&mut c, &queue, json!({ "partitions": 2 }));
    let mut g = Gen::new(0xDE1A);
    let delays: Vec<u64> = (0..N).map(|_| g.below(MAX_DELAY_MS + 1)).collect();

    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicUsize::new(0));
    // (index, leased message) of every lease.
    let leases: Arc<Mutex<Vec<(usize, Leased)>>> = Arc::new(Mutex::new(Vec::new()));
    let problems: Arc<Mutex<Vec<String>>> = Arc::new(Mutex::new(Vec::new()));
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let (addr, queue) = (addr.clone(), queue.clone());
            let (stop, acked, leases, problems) =
                (stop.clone(), acked.clone(), leases.clone(), problems.clone());
            thread::spawn(move || {
                let mut c = QueueClient::new(&addr);
                let opts = LeaseOptions {
                    max_messages: Some(100),
                    visibility_timeout_ms: Some(VISIBILITY_MS),
                    wait_ms: Some(2_000),
                    ..LeaseOptions::default()
                };
                while !stop.load(Ordering::SeqCst) {
                    let batch = match c.lease(&queue, &opts) {
                        Ok(b) => b,
                        Err(e) => {
                            problems.lock().unwrap().push(format!("worker {w}: lease: {e}"));
                            return;
                        }
                    };
                    for m in batch {
                        let index = m
                            .payload
                            .as_deref()
                            .and_then(|p| p.strip_prefix("delayed "))
                            .and_then(|p| p.parse::<usize>().ok());
                        let Some(index) = index.filter(|i| *i < N) else {
                            problems
                                .lock()
                                .unwrap()
                                .push(format!("unknown message leased: {m:?}"));
                            continue;
                        };
                        match c.ack(&m.id, m.generation) {
                            Ok(_) => {
                                acked.fetch_add(1, Ordering::SeqCst);
                            }
                            Err(e) => problems.lock().unwrap().push(format!("ack of {index}: {e}")),
                        }
                        leases.lock().unwrap().push((index, m));
                    }
                }
            })
        })
        .collect();

    let t0 = Instant::now();
    let mut ids = vec![String::new(); N];
    for start in (0..N).step_by(500) {
        let msgs: Vec<OutMessage> = (start..start + 500)
            .map(|i| OutMessage::new(format!("delayed {i}")).delay_ms(delays[i]))
            .collect();
        let answer = c
            .publish(&queue, &msgs)
            .unwrap_or_else(|e| panic!("publish of {start}..: {e}"));
        for (i, p) in (start..).zip(answer) {
            ids[i] = p.id;
        }
    }
    let published_in = t0.elapsed();
    let deadline = Instant::now() + Duration::from_secs(60);
    while acked.load(Ordering::SeqCst) < N && Instant::now() < deadline && problems.lock().unwrap().is_empty()
    {
        thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, Ordering::SeqCst);
    for w in workers {
        w.join().expect("a delay worker panicked");
    }
    let problems = problems.lock().unwrap();
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    let leases = leases.lock().unwrap();
    let seen: BTreeSet<usize> = leases.iter().map(|(i, _)| *i).collect();
    assert_eq!(
        seen.len(),
        N,
        "{} of {N} delayed messages were leased within the time limit",
        seen.len()
    );

    let mut lateness: Vec<i64> = Vec::with_capacity(leases.len());
    for (i, m) in leases.iter() {
        assert_eq!(m.id, ids[*i], "delayed message {i} leased with another id");
        let leased_at = m.lease_expires_at_ms - VISIBILITY_MS as i64;
        let due = m.published_at_ms + delays[*i] as i64;
        assert!(
            leased_at >= due,
            "delayed message {i} (delay_ms {}) was leased at {leased_at}, {} ms before it was due at {due} \
             (published_at_ms {})",
            delays[*i],
            due - leased_at,
            m.published_at_ms
        );
        lateness.push(leased_at - due);
    }
    lateness.sort_unstable();
    eprintln!(
        "[delays] {N} messages with delay_ms 0..={MAX_DELAY_MS} published in {:.2} s, all leased after {:.1} s; \
         lateness (lease time - published_at_ms - delay_ms, broker clock): p50 {} ms, p99 {} ms, max {} ms",
        published_in.as_secs_f64(),
        t0.elapsed().as_secs_f64(),
        percentile(&lateness, 0.5),
        percentile(&lateness, 0.99),
        lateness.last().copied().unwrap_or(0)
    );
}

// ------------------------------------------------------------------------------------------
// 3. Dedup

#[test]
fn dedup_tokens_append_once_even_across_a_restart() {
    const N: usize = 300;
    let mut broker = start_broker();
    let bootstrap = broker.bootstrap();
    let mut c = QueueClient::new(&broker.http_addr());
    let deduped = unique_topic("dedup-on");
    let control = unique_topic("dedup-off");
    create_queue(&mut c, &deduped, json!({ "partitions": 2 }));
    create_queue(&mut c, &control, json!({ "partitions": 2, "dedup_window_ms": 0 }));
    let msgs: Vec<OutMessage> = (0..N)
        .map(|i| OutMessage::new(format!("dedup payload {i}")).dedup_token(format!("token-{i}")))
        .collect();
    let publish_all = |c: &mut QueueClient, queue: &str| -> Vec<Published> {
        msgs.chunks(100)
            .flat_map(|chunk| {
                with_retries(|| c.publish(queue, chunk)).unwrap_or_else(|e| panic!("publish: {e}"))
            })
            .collect()
    };

    let first = publish_all(&mut c, &deduped);
    assert!(
        first.iter().all(|p| !p.duplicate),
        "first publish answered duplicates"
    );
    let ids: BTreeSet<&str> = first.iter().map(|p| p.id.as_str()).collect();
    assert_eq!(ids.len(), N, "first publish: ids must be distinct");
    let check_again = |again: &[Published], when: &str| {
        for (i, (a, f)) in again.iter().zip(&first).enumerate() {
            assert!(
                a.duplicate && a.id == f.id && a.partition == f.partition && a.offset == f.offset,
                "{when}: token-{i} answered {a:?}, expected the first message {f:?} with duplicate: true"
            );
        }
    };
    check_again(&publish_all(&mut c, &deduped), "second publish");

    let control_first = publish_all(&mut c, &control);
    let control_second = publish_all(&mut c, &control);
    assert!(
        control_first.iter().chain(&control_second).all(|p| !p.duplicate),
        "a queue with dedup_window_ms 0 answered a duplicate"
    );
    let control_ids: BTreeSet<&str> = control_first
        .iter()
        .chain(&control_second)
        .map(|p| p.id.as_str())
        .collect();
    assert_eq!(
        control_ids.len(),
        2 * N,
        "without dedup every publish is a new message"
    );

    // The same batch holding one token twice appends it once.
    let twice = [
        OutMessage::new("twice a").dedup_token("token-twice"),
        OutMessage::new("twice b").dedup_token("token-twice"),
    ];
    let t = c
        .publish(&deduped, &twice)
        .unwrap_or_else(|e| panic!("publish: {e}"));
    assert!(
        !t[0].duplicate && t[1].duplicate && t[0].id == t[1].id,
        "one token twice in a batch: {t:?}"
    );

    assert_eq!(log_count(&bootstrap, &deduped), N as i64 + 1);
    assert_eq!(log_count(&bootstrap, &control), 2 * N as i64);

    broker.kill9();
    broker.restart();
    let mut c = QueueClient::new(&broker.http_addr());
    check_again(
        &publish_all(&mut c, &deduped),
        "publish after kill -9 and restart",
    );
    let t2 = with_retries(|| c.publish(&deduped, &twice[1..])).unwrap_or_else(|e| panic!("publish: {e}"));
    assert!(
        t2[0].duplicate && t2[0].id == t[0].id,
        "after the restart: {t2:?}, expected {:?}",
        t[0]
    );
    let control_third = publish_all(&mut c, &control);
    assert!(control_third.iter().all(|p| !p.duplicate));

    assert_eq!(
        log_count(&bootstrap, &deduped),
        N as i64 + 1,
        "the deduplicated queue must hold each token's message once"
    );
    assert_eq!(
        log_count(&bootstrap, &control),
        3 * N as i64,
        "the control queue (dedup_window_ms 0) holds every publish"
    );
}

// ------------------------------------------------------------------------------------------
// 4. ordering = key

const ORDER_KEYS: usize = 4;
const ORDER_PER_KEY: usize = 25;
/// The message nacked on its first delivery: key 1, sequence 3.
const ORDER_NACKED: (usize, usize) = (1, 3);

#[derive(Default)]
struct OrderState {
    /// Key -> the message of that key currently held (leased, its settle not yet sent).
    held: HashMap<usize, (usize, u64)>,
    /// Key -> (sequence, attempt) of each delivery, in the order they happened.
    deliveries: BTreeMap<usize, Vec<(usize, u32)>>,
    acked: usize,
    violations: Vec<String>,
}

fn order_parse(m: &Leased) -> Option<(usize, usize)> {
    let p = m.payload.as_deref()?;
    let (k, s) = p.strip_prefix("order ")?.split_once(' ')?;
    let (k, s): (usize, usize) = (k.parse().ok()?, s.parse().ok()?);
    (m.key.as_deref() == Some(format!("key-{k}").as_str())).then_some((k, s))
}

#[test]
fn ordering_by_key_holds_one_message_per_key_in_publish_order() {
    let broker = start_broker();
    let addr = broker.http_addr();
    let mut c = QueueClient::new(&addr);

    // Deterministic control: two messages of one key and one lease of two messages.
    let keyed = unique_topic("order-key");
    let unordered = unique_topic("order-none");
    create_queue(&mut c, &keyed, json!({ "partitions": 1, "ordering": "key" }));
    create_queue(&mut c, &unordered, json!({ "partitions": 1, "ordering": "none" }));
    let pair = [
        OutMessage::new("first").key("same"),
        OutMessage::new("second").key("same"),
    ];
    let two = LeaseOptions {
        max_messages: Some(2),
        visibility_timeout_ms: Some(30_000),
        ..LeaseOptions::default()
    };
    for (queue, expected) in [(&unordered, 2usize), (&keyed, 1usize)] {
        c.publish(queue, &pair).unwrap_or_else(|e| panic!("publish: {e}"));
        let got = c.lease(queue, &two).unwrap_or_else(|e| panic!("lease: {e}"));
        let payloads: Vec<&str> = got.iter().filter_map(|m| m.payload.as_deref()).collect();
        assert_eq!(
            got.len(),
            expected,
            "{queue}: one lease of 2 over two messages of key `same` got {payloads:?}"
        );
        assert_eq!(payloads[0], "first", "{queue}: {payloads:?}");
        if expected == 1 {
            // The second is held back until the first is done.
            let none = c.lease(queue, &two).unwrap_or_else(|e| panic!("lease: {e}"));
            assert!(
                none.is_empty(),
                "ordering=key leased {none:?} while `first` is leased"
            );
            c.ack(&got[0].id, got[0].generation)
                .unwrap_or_else(|e| panic!("ack: {e}"));
            let next = c.lease(queue, &two).unwrap_or_else(|e| panic!("lease: {e}"));
            assert_eq!(
                next.iter()
                    .filter_map(|m| m.payload.as_deref())
                    .collect::<Vec<_>>(),
                vec!["second"],
                "after the ack of `first`"
            );
            c.ack(&next[0].id, next[0].generation)
                .unwrap_or_else(|e| panic!("ack: {e}"));
        } else {
            for m in &got {
                c.ack(&m.id, m.generation).unwrap_or_else(|e| panic!("ack: {e}"));
            }
        }
    }

    // Concurrent leasers on interleaved keys, one message nacked once.
    let queue = new_queue(
        &mut c,
        "order-conc",
        json!({ "partitions": 1, "ordering": "key", "backoff_base_ms": 100 }),
    );
    let msgs: Vec<OutMessage> = (0..ORDER_KEYS * ORDER_PER_KEY)
        .map(|i| {
            let (k, s) = (i % ORDER_KEYS, i / ORDER_KEYS);
            OutMessage::new(format!("order {k} {s}")).key(format!("key-{k}"))
        })
        .collect();
    c.publish(&queue, &msgs)
        .unwrap_or_else(|e| panic!("publish: {e}"));
    let total = msgs.len();
    let state = Arc::new(Mutex::new(OrderState::default()));
    let leasers: Vec<_> = (0..4)
        .map(|w| {
            let (addr, queue, state) = (addr.clone(), queue.clone(), state.clone());
            thread::spawn(move || {
                let mut c = QueueClient::new(&addr);
                let mut g = Gen::new(0x0DE5 + w);
                let opts = LeaseOptions {
                    max_messages: Some(5),
                    visibility_timeout_ms: Some(30_000),
                    wait_ms: Some(300),
                    ..LeaseOptions::default()
                };
                let deadline = Instant::now() + Duration::from_secs(60);
                while state.lock().unwrap().acked < total && Instant::now() < deadline {
                    let got = c.lease(&queue, &opts).unwrap_or_else(|e| panic!("lease: {e}"));
                    let mut mine = Vec::new();
                    {
                        let mut s = state.lock().unwrap();
                        for m in got {
                            let Some((k, seq)) = order_parse(&m) else {
                                s.violations.push(format!("unexpected message {m:?}"));
                                continue;
                            };
                            if let Some((other, _)) = s.held.get(&k) {
                                let v = format!(
                                    "key-{k}: sequence {seq} leased while sequence {other} of the same key is held"
                                );
                                s.violations.push(v);
                            }
                            s.held.insert(k, (seq, m.generation));
                            s.deliveries.entry(k).or_default().push((seq, m.attempt));
                            mine.push((k, seq, m));
                        }
                    }
                    thread::sleep(Duration::from_millis(g.below(15)));
                    for (k, seq, m) in mine {
                        // Released before the settle is sent: the broker may lease the key's next
                        // message only once it has the settle.
                        state.lock().unwrap().held.remove(&k);
                        if (k, seq) == ORDER_NACKED && m.attempt == 1 {
                            c.nack(&m.id, m.generation, "try again")
                                .unwrap_or_else(|e| panic!("nack: {e}"));
                        } else {
                            c.ack(&m.id, m.generation).unwrap_or_else(|e| panic!("ack: {e}"));
                            state.lock().unwrap().acked += 1;
                        }
                    }
                }
            })
        })
        .collect();
    for l in leasers {
        l.join().expect("a leaser panicked");
    }
    let s = state.lock().unwrap();
    assert!(s.violations.is_empty(), "{}", s.violations.join("\n"));
    assert_eq!(s.acked, total, "not every message was acked in time");
    for k in 0..ORDER_KEYS {
        let d = &s.deliveries[&k];
        let mut expected: Vec<(usize, u32)> = (0..ORDER_PER_KEY).map(|seq| (seq, 1)).collect();
        if k == ORDER_NACKED.0 {
            expected.insert(ORDER_NACKED.1 + 1, (ORDER_NACKED.1, 2));
        }
        assert_eq!(
            d, &expected,
            "key-{k}: deliveries (sequence, attempt) must follow publish order, the nacked message blocking its \
             key until it is done"
        );
    }
}

// ------------------------------------------------------------------------------------------
// 5. kcat reads the dead-letter topic

#[test]
fn kcat_reads_dead_letter_context_headers() {
    let broker = start_broker();
    let bootstrap = broker.bootstrap();
    let mut c = QueueClient::new(&broker.http_addr());
    let queue = new_queue(
        &mut c,
        "kcat-dlq",
        json!({ "partitions": 1, "max_attempts": 2, "backoff_base_ms": 10 }),
    );
    let published = c
        .publish(
            &queue,
            &[
                OutMessage::new("rejected payload")
                    .key("k-rej")
                    .header("trace", "t-1"),
                OutMessage::new("exhausted payload")
                    .key("k-exh")
                    .header("trace", "t-2"),
                OutMessage::new("fine payload"),
            ],
        )
        .unwrap_or_else(|e| panic!("publish: {e}"));
    let opts = LeaseOptions {
        max_messages: Some(10),
        wait_ms: Some(2_000),
        ..LeaseOptions::default()
    };
    let mut exhausted_leases = 0;
    let mut deadline_left = 20;
    while exhausted_leases < 2 {
        deadline_left -= 1;
        assert!(deadline_left > 0, "the nacked message did not come back");
        for m in c.lease(&queue, &opts).unwrap_or_else(|e| panic!("lease: {e}")) {
            let body = match m.payload.as_deref() {
                Some("rejected payload") => {
                    json!({ "generation": m.generation, "action": "reject", "reason": "unparseable input" })
                }
                Some("exhausted payload") => {
                    exhausted_leases += 1;
                    json!({ "generation": m.generation, "action": "nack", "reason": format!("timeout {}", m.attempt) })
                }
                _ => json!({ "generation": m.generation, "action": "ack" }),
            };
            c.settle(&m.id, &body)
                .unwrap_or_else(|e| panic!("settle {body}: {e}"));
        }
    }
    let dlq = format!("{queue}.dlq");
    wait_for(Duration::from_secs(15), "two dead letters", || {
        (log_count(&bootstrap, &dlq) >= 2).then_some(())
    });

    let mut cmd = tools::kcat_command();
    cmd.args(["-b", &bootstrap, "-C", "-t", &dlq, "-o", "beginning", "-e", "-q"])
        .args(["-f", "%k\t%s\t%h\n"]);
    let desc = format!("{cmd:?}");
    let (status, out, err) = tools::run_with_input(cmd, b"", Duration::from_secs(60));
    assert!(
        status.success(),
        "{desc} failed: {status}: {}",
        String::from_utf8_lossy(&err)
    );
    let text = String::from_utf8(out).expect("kcat output is UTF-8");
    let mut records: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for line in text.lines().filter(|l| !l.is_empty()) {
        let mut parts = line.splitn(3, '\t');
        let (key, payload, headers) = (
            parts.next().unwrap_or_default(),
            parts.next().unwrap_or_default(),
            parts.next().unwrap_or_default(),
        );
        let h: BTreeMap<String, String> = headers
            .split(',')
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        assert_eq!(
            h.get("trace").map(String::as_str),
            Some(if key == "k-rej" { "t-1" } else { "t-2" }),
            "the message's own header is kept: {line}"
        );
        records.insert(payload.to_owned(), h);
    }
    assert_eq!(
        records.keys().map(String::as_str).collect::<Vec<_>>(),
        vec!["exhausted payload", "rejected payload"],
        "kcat output:\n{text}"
    );
    for (payload, i, attempts, cause, reason) in [
        ("rejected payload", 0usize, "1", "rejected", "unparseable input"),
        ("exhausted payload", 1, "2", "max-attempts", "timeout 2"),
    ] {
        let h = &records[payload];
        let get = |k: &str| h.get(k).map(String::as_str);
        assert_eq!(get("strand-message-id"), Some(published[i].id.as_str()), "{h:?}");
        assert_eq!(get("strand-dlq-source-topic"), Some(queue.as_str()), "{h:?}");
        assert_eq!(get("strand-dlq-source-partition"), Some("0"), "{h:?}");
        assert_eq!(
            get("strand-dlq-source-offset"),
            Some(published[i].offset.to_string().as_str()),
            "{h:?}"
        );
        assert_eq!(get("strand-dlq-attempts"), Some(attempts), "{h:?}");
        assert_eq!(get("strand-dlq-cause"), Some(cause), "{h:?}");
        assert_eq!(get("strand-dlq-reason"), Some(reason), "{h:?}");
        for k in [
            "strand-dlq-first-delivery-ms",
            "strand-dlq-last-delivery-ms",
            "strand-dlq-time-ms",
        ] {
            assert!(
                get(k).and_then(|v| v.parse::<i64>().ok()).is_some_and(|t| t > 0),
                "{k} missing or not a time: {h:?}"
            );
        }
    }
}

// ------------------------------------------------------------------------------------------
// 6. Bad input

#[test]
fn bad_input_is_refused_and_the_broker_serves_on() {
    const MAX_BODY: usize = 64 * 1024;
    let broker = Broker::builder()
        .needs_spawned("the HTTP queue API's address is read from the broker's ready file")
        .config("strand.http.max.body.bytes", MAX_BODY)
        .start();
    let bootstrap = broker.bootstrap();
    let addr = broker.http_addr();
    let mut c = QueueClient::new(&addr);
    let queue = new_queue(&mut c, "bad", json!({ "partitions": 1, "backoff_base_ms": 10 }));
    let messages_path = format!("/v1/queues/{queue}/messages");
    let mut stored: Vec<Published> = Vec::new();
    // After each refusal: a good publish on the same client succeeds.
    let serves_on = |c: &mut QueueClient, stored: &mut Vec<Published>, after: &str| {
        let p = c
            .publish(&queue, &[OutMessage::new(format!("good {}", stored.len()))])
            .unwrap_or_else(|e| panic!("a publish after {after} failed: {e}"));
        stored.extend(p);
    };
    serves_on(&mut c, &mut stored, "nothing");

    let expect = |c: &mut QueueClient, method: &str, path: &str, body: Option<&[u8]>, want: (u16, &str)| {
        let r = c
            .conn
            .request(method, path, body)
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        assert_eq!(
            status_code(&r),
            (want.0, want.1.to_owned()),
            "{method} {path} {:?}: {}",
            body.map(String::from_utf8_lossy),
            r.text()
        );
        r
    };

    // Malformed JSON and invalid bodies: 400.
    for body in [
        &b"{\"payload\": "[..],
        b"{\"payload\": \"x\"",
        b"not json",
        b"[1, 2]",
        b"{\"messages\": []}",
        b"{\"messages\": \"x\"}",
        b"{\"payload\": \"x\", \"payload_base64\": \"eA==\"}",
        b"{\"payload_base64\": \"***\"}",
        b"{\"payload\": \"x\", \"unknown_field\": 1}",
        b"{\"payload\": \"x\", \"delay_ms\": -1}",
    ] {
        expect(
            &mut c,
            "POST",
            &messages_path,
            Some(body),
            (400, "invalid_request"),
        );
        serves_on(
            &mut c,
            &mut stored,
            &format!("the body {:?}", String::from_utf8_lossy(body)),
        );
    }
    let too_many =
        json!({ "messages": (0..1001).map(|i| json!({ "payload": format!("m{i}") })).collect::<Vec<_>>() });
    expect(
        &mut c,
        "POST",
        &messages_path,
        Some(too_many.to_string().as_bytes()),
        (400, "invalid_request"),
    );
    serves_on(&mut c, &mut stored, "1001 messages");
    expect(
        &mut c,
        "POST",
        &format!("/v1/queues/{queue}/leases"),
        Some(b"{\"max_messages\": 0}"),
        (400, "invalid_request"),
    );
    expect(
        &mut c,
        "PUT",
        "/v1/queues/bad%20name",
        Some(b"{}"),
        (400, "invalid_queue_name"),
    );
    serves_on(&mut c, &mut stored, "bad lease and queue name");

    // Unknown queue: 404 queue_not_found.
    let nowhere = unique_topic("no-such-queue");
    for (method, path, body) in [
        ("GET", format!("/v1/queues/{nowhere}"), None),
        (
            "POST",
            format!("/v1/queues/{nowhere}/messages"),
            Some(&b"{\"payload\": \"x\"}"[..]),
        ),
        ("POST", format!("/v1/queues/{nowhere}/leases"), Some(b"{}")),
    ] {
        expect(&mut c, method, &path, body, (404, "queue_not_found"));
        serves_on(&mut c, &mut stored, &format!("{method} {path}"));
    }
    let r = c.conn.request("GET", "/v1/nothing/here", None).unwrap();
    assert_eq!(status_code(&r), (404, "not_found".to_owned()), "{}", r.text());

    // Unknown or malformed message ids: 404 message_not_found.
    let real = stored[0].id.clone();
    assert_eq!(real.len(), 56, "message ids are 56 hex digits: {real}");
    let beyond_log = format!("{}{:016x}", &real[..40], 1_000_000u64);
    let other_partition = format!("{}{:08x}{}", &real[..32], 7u32, &real[40..]);
    let unknown_topic = format!("{:032x}{}", 0xABCDu128, &real[32..]);
    for id in [
        "not-an-id".to_owned(),
        "0".repeat(56),
        beyond_log,
        other_partition,
        unknown_topic,
        "f".repeat(200),
    ] {
        expect(
            &mut c,
            "POST",
            &format!("/v1/messages/{id}/ack"),
            Some(b"{\"generation\": 1, \"action\": \"ack\"}"),
            (404, "message_not_found"),
        );
        serves_on(&mut c, &mut stored, &format!("an ack of {id}"));
    }
    expect(
        &mut c,
        "POST",
        &format!("/v1/messages/{real}/ack"),
        Some(b"{\"generation\": 1, \"action\": \"explode\"}"),
        (400, "invalid_request"),
    );

    // Stale generation: the lease expired and the message was leased again.
    let stale_q = new_queue(
        &mut c,
        "bad-stale",
        json!({ "partitions": 1, "backoff_base_ms": 10 }),
    );
    let sp = c
        .publish(&stale_q, &[OutMessage::new("stale")])
        .unwrap_or_else(|e| panic!("publish: {e}"));
    let short = LeaseOptions {
        max_messages: Some(1),
        visibility_timeout_ms: Some(1_000),
        wait_ms: Some(5_000),
        ..LeaseOptions::default()
    };
    let first = c.lease(&stale_q, &short).unwrap_or_else(|e| panic!("lease: {e}"));
    assert_eq!(first.len(), 1, "{first:?}");
    let second = c.lease(&stale_q, &short).unwrap_or_else(|e| panic!("lease: {e}"));
    assert_eq!(
        second.len(),
        1,
        "the expired message was not leased again: {second:?}"
    );
    assert_eq!(second[0].id, sp[0].id);
    assert!(
        second[0].generation > first[0].generation && second[0].attempt == 2,
        "{second:?}"
    );
    let r = expect(
        &mut c,
        "POST",
        &format!("/v1/messages/{}/ack", first[0].id),
        Some(
            json!({ "generation": first[0].generation, "action": "ack" })
                .to_string()
                .as_bytes(),
        ),
        (409, "stale_generation"),
    );
    assert!(r.text().contains("generation"), "{}", r.text());
    c.ack(&second[0].id, second[0].generation)
        .unwrap_or_else(|e| panic!("the current generation's ack: {e}"));
    // The late ack still fails once the message is done.
    let r = c
        .ack(&first[0].id, first[0].generation)
        .expect_err("a late ack must never succeed");
    assert_eq!(r.status().map(|(s, _)| s), Some(409), "{r}");

    // A message above the topic's max.message.bytes: 413.
    let small = unique_topic("bad-small");
    admin::create_topic(&bootstrap, &small, 1, &[("max.message.bytes", "1024")]);
    let (status, v) = c
        .put_queue(&small, &json!({}))
        .unwrap_or_else(|e| panic!("PUT of an existing topic: {e}"));
    assert_eq!(status, 200, "a PUT of an existing topic updates it: {v}");
    let big_payload = "x".repeat(4096);
    let r = c
        .publish(&small, &[OutMessage::new(big_payload.clone())])
        .expect_err("a message above max.message.bytes must be refused");
    assert_eq!(r.status().map(|(s, _)| s), Some(413), "{r}");
    let fits = c
        .publish(&small, &[OutMessage::new("fits")])
        .unwrap_or_else(|e| panic!("a small message after a 413: {e}"));
    assert_eq!(
        log_count(&bootstrap, &small),
        1,
        "only the message that fits is stored"
    );
    assert_eq!(fits[0].offset, 0);

    // A body above strand.http.max.body.bytes: 413, by Content-Length.
    let huge = json!({ "payload": "y".repeat(MAX_BODY + 10) }).to_string();
    let r = c
        .conn
        .request("POST", &messages_path, Some(huge.as_bytes()))
        .unwrap_or_else(|e| panic!("oversized body: {e}"));
    assert_eq!(
        status_code(&r),
        (413, "body_too_large".to_owned()),
        "{}",
        r.text()
    );
    serves_on(&mut c, &mut stored, "a body over the limit");
    let raw = format!(
        "POST {messages_path} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{{\"payload\": \"",
        100 * 1024 * 1024
    );
    let r = c
        .conn
        .send_raw(raw.as_bytes())
        .unwrap_or_else(|e| panic!("announced 100 MiB body: {e}"));
    assert_eq!(r.status, 413, "{}", r.text());
    serves_on(&mut c, &mut stored, "an announced 100 MiB body");

    // Wrong method: 405 with Allow.
    for (method, path, allow) in [
        ("DELETE", format!("/v1/queues/{queue}"), "PUT"),
        ("GET", messages_path.clone(), "POST"),
        ("PUT", format!("/v1/messages/{real}/ack"), "POST"),
        ("GET", format!("/v1/queues/{queue}/leases"), "POST"),
    ] {
        // PUT and POST carry a body (without one they are 411 before the method is looked at).
        let body = (method == "PUT").then_some(&b"{}"[..]);
        let r = expect(&mut c, method, &path, body, (405, "method_not_allowed"));
        assert!(
            r.header("allow").is_some_and(|a| a.contains(allow)),
            "405 without Allow: {allow}: {:?}",
            r.headers
        );
        serves_on(&mut c, &mut stored, &format!("{method} {path}"));
    }

    // A request that is not HTTP: 400, and a new connection serves.
    let r = c
        .conn
        .send_raw(b"NONSENSE\r\n\r\n")
        .unwrap_or_else(|e| panic!("garbage request: {e}"));
    assert_eq!(r.status, 400, "{}", r.text());
    serves_on(&mut c, &mut stored, "a garbage request line");

    // Nothing stored was lost, and nothing refused was stored.
    assert_eq!(log_count(&bootstrap, &queue), stored.len() as i64);
    let mut leased = BTreeMap::new();
    while leased.len() < stored.len() {
        let got = c
            .lease(
                &queue,
                &LeaseOptions {
                    max_messages: Some(1000),
                    wait_ms: Some(2_000),
                    ..LeaseOptions::default()
                },
            )
            .unwrap_or_else(|e| panic!("lease: {e}"));
        assert!(
            !got.is_empty(),
            "{} of {} stored messages leased",
            leased.len(),
            stored.len()
        );
        for m in got {
            leased.insert(m.id.clone(), m.payload.clone().unwrap_or_default());
        }
    }
    let stored_ids: BTreeSet<&str> = stored.iter().map(|p| p.id.as_str()).collect();
    assert_eq!(
        leased.keys().map(String::as_str).collect::<BTreeSet<_>>(),
        stored_ids,
        "the messages leased are exactly those stored"
    );
    assert!(leased.values().all(|p| p.starts_with("good ")), "{leased:?}");
}

// ------------------------------------------------------------------------------------------
// 7. Redrive

#[test]
fn redrive_moves_dead_letters_back_with_their_ids() {
    let broker = start_broker();
    let bootstrap = broker.bootstrap();
    let mut c = QueueClient::new(&broker.http_addr());
    let queue = new_queue(
        &mut c,
        "redrive",
        json!({ "partitions": 2, "max_attempts": 2, "backoff_base_ms": 10 }),
    );
    let msgs: Vec<OutMessage> = (0..6)
        .map(|i| {
            OutMessage::new(format!("redrive {i}"))
                .key(format!("k{i}"))
                .header("h", format!("v{i}"))
        })
        .collect();
    let published = c
        .publish(&queue, &msgs)
        .unwrap_or_else(|e| panic!("publish: {e}"));
    let index = |m: &Leased| -> usize {
        m.payload
            .as_deref()
            .and_then(|p| p.strip_prefix("redrive "))
            .and_then(|i| i.parse().ok())
            .unwrap_or_else(|| panic!("unexpected message {m:?}"))
    };
    let opts = LeaseOptions {
        max_messages: Some(10),
        wait_ms: Some(2_000),
        ..LeaseOptions::default()
    };
    // 0 and 1 rejected, 2 nacked until its attempts are exhausted, 3..6 acked.
    let mut done = BTreeSet::new();
    let mut rounds = 0;
    while done.len() < 6 {
        rounds += 1;
        assert!(rounds < 20, "settled only {done:?}");
        for m in c.lease(&queue, &opts).unwrap_or_else(|e| panic!("lease: {e}")) {
            let i = index(&m);
            let body = match i {
                0 | 1 => json!({ "generation": m.generation, "action": "reject", "reason": "bad" }),
                2 => json!({ "generation": m.generation, "action": "nack", "reason": "flaky" }),
                _ => json!({ "generation": m.generation, "action": "ack" }),
            };
            let s = c.settle(&m.id, &body).unwrap_or_else(|e| panic!("settle: {e}"));
            if i != 2 || s.state == "dead_lettered" {
                done.insert(i);
            }
        }
    }
    let dlq = format!("{queue}.dlq");
    wait_for(Duration::from_secs(15), "three dead letters", || {
        (log_count(&bootstrap, &dlq) == 3).then_some(())
    });

    let moved = c
        .redrive(&queue, &json!({}))
        .unwrap_or_else(|e| panic!("redrive: {e}"));
    assert_eq!(moved, 3, "the first redrive moves the three dead letters");
    let mut again: BTreeMap<usize, Leased> = BTreeMap::new();
    let mut rounds = 0;
    while again.len() < 3 {
        rounds += 1;
        assert!(rounds < 10, "redriven messages leased: {:?}", again.keys());
        for m in c.lease(&queue, &opts).unwrap_or_else(|e| panic!("lease: {e}")) {
            let i = index(&m);
            assert!(again.insert(i, m).is_none(), "redriven message {i} leased twice");
        }
    }
    assert_eq!(again.keys().copied().collect::<Vec<_>>(), vec![0, 1, 2]);
    for (i, m) in &again {
        let p = &published[*i];
        assert_eq!(m.id, p.id, "redriven message {i} keeps its id");
        assert_eq!(
            m.attempt, 1,
            "redriven message {i} starts its attempts afresh: {m:?}"
        );
        assert_eq!(m.partition, p.partition, "redriven into its own partition: {m:?}");
        assert!(
            m.offset > p.offset,
            "the redriven copy is a new record: {m:?} vs {p:?}"
        );
        assert_eq!(m.key.as_deref(), Some(format!("k{i}").as_str()), "{m:?}");
        let expected: BTreeMap<String, String> = [("h".to_owned(), format!("v{i}"))].into();
        assert_eq!(
            m.headers, expected,
            "redriven message {i}: only its own headers: {m:?}"
        );
    }
    let moved = c
        .redrive(&queue, &json!({}))
        .unwrap_or_else(|e| panic!("redrive: {e}"));
    assert_eq!(moved, 0, "a second redrive moves nothing");
    for m in again.values() {
        let s = c
            .ack(&m.id, m.generation)
            .unwrap_or_else(|e| panic!("ack of a redriven message: {e}"));
        assert_eq!(s.state, "acknowledged");
    }
    assert_eq!(
        log_count(&bootstrap, &dlq),
        0,
        "redriven dead letters leave the dead-letter topic"
    );
    assert_eq!(
        log_count(&bootstrap, &queue),
        9,
        "six messages and three redriven copies"
    );
    let rest = c.lease(&queue, &opts).unwrap_or_else(|e| panic!("lease: {e}"));
    assert!(rest.is_empty(), "nothing is left to lease: {rest:?}");
}

// ------------------------------------------------------------------------------------------
// 8. Metrics

/// Values of the samples of `name` (exactly that name) whose labels include `queue="<queue>"`.
/// A client that goes away while its long poll waits must not be leased what arrives later:
/// the broker notices the end of the connection, the poll ends leasing nothing, and a message
/// published afterwards goes to the next client at its first attempt instead of being held by
/// the gone client's lease for the visibility timeout.
#[test]
fn a_long_poll_whose_client_went_away_leases_nothing() {
    use std::io::Write;
    let broker = start_broker();
    let addr = broker.http_addr();
    let mut c = QueueClient::new(&addr);
    let q = new_queue(&mut c, "gone-poll", json!({ "partitions": 1 }));

    let body = json!({ "max_messages": 10, "wait_ms": 20_000, "visibility_timeout_ms": 60_000 }).to_string();
    let head = format!(
        "POST /v1/queues/{q}/leases HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    let mut poll = std::net::TcpStream::connect(&addr).unwrap_or_else(|e| panic!("connect: {e}"));
    poll.write_all(head.as_bytes())
        .and_then(|()| poll.write_all(body.as_bytes()))
        .unwrap_or_else(|e| panic!("sending the long poll: {e}"));
    drop(poll);
    wait_for(
        Duration::from_secs(10),
        "the broker to end the gone client's long poll",
        || {
            let gone =
                strand_compat_tests::metric_sum(&broker.metrics(), "strand_http_requests_client_gone_total");
            (gone >= 1.0).then_some(())
        },
    );

    let published = c
        .publish(&q, &[OutMessage::new("after the client went")])
        .unwrap_or_else(|e| panic!("publish: {e}"));
    let opts = LeaseOptions {
        max_messages: Some(10),
        wait_ms: Some(5_000),
        ..LeaseOptions::default()
    };
    let leased = c.lease(&q, &opts).unwrap_or_else(|e| panic!("lease: {e}"));
    assert_eq!(
        leased.len(),
        1,
        "the message published after the client went must be leased at once, not held by that client: {leased:?}"
    );
    assert_eq!(leased[0].id, published[0].id);
    assert_eq!(leased[0].attempt, 1, "{leased:?}");
    c.ack(&leased[0].id, leased[0].generation)
        .unwrap_or_else(|e| panic!("ack: {e}"));
    let closed = strand_compat_tests::metric_sum(&broker.metrics(), "strand_http_connections_closed_total");
    assert!(closed >= 1.0, "connection closes are counted by reason: {closed}");
}

fn samples(metrics: &str, name: &str, queue: &str) -> Vec<f64> {
    let label = format!("queue=\"{queue}\"");
    metrics
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (n, labels) = series.split_once('{')?;
            (n == name && labels.contains(&label)).then(|| value.parse().ok())?
        })
        .collect()
}

#[test]
fn queue_metrics_are_exported() {
    let broker = start_broker();
    let mut c = QueueClient::new(&broker.http_addr());
    let queue = new_queue(&mut c, "metrics", json!({ "partitions": 2 }));
    let msgs: Vec<OutMessage> = (0..20).map(|i| OutMessage::new(format!("m{i}"))).collect();
    c.publish(&queue, &msgs)
        .unwrap_or_else(|e| panic!("publish: {e}"));
    let mut leased = Vec::new();
    while leased.len() < 10 {
        let want = 10 - leased.len() as u32;
        leased.extend(
            c.lease(
                &queue,
                &LeaseOptions {
                    max_messages: Some(want),
                    wait_ms: Some(2_000),
                    ..LeaseOptions::default()
                },
            )
            .unwrap_or_else(|e| panic!("lease: {e}")),
        );
    }
    thread::sleep(Duration::from_millis(100));
    for m in &leased[..5] {
        c.ack(&m.id, m.generation).unwrap_or_else(|e| panic!("ack: {e}"));
    }
    c.settle(
        &leased[5].id,
        &json!({ "generation": leased[5].generation, "action": "reject", "reason": "metrics" }),
    )
    .unwrap_or_else(|e| panic!("reject: {e}"));

    // 4 leased, 1 dead-lettered, 5 acked; 10 never leased and growing older.
    let text = wait_for(Duration::from_secs(20), "the queue's series on /metrics", || {
        let text = broker.metrics();
        let sum = |name: &str| samples(&text, name, &queue).iter().sum::<f64>();
        let ok = sum("strand_queue_leased_messages") == 4.0
            && sum("strand_queue_dead_lettered_total") == 1.0
            && sum("strand_queue_lease_to_ack_seconds_count") == 5.0
            && samples(&text, "strand_queue_oldest_unacked_age_seconds", &queue)
                .iter()
                .any(|v| *v > 0.0);
        ok.then_some(text)
    });
    assert_eq!(
        samples(&text, "strand_queue_leased_messages", &queue).len(),
        2,
        "one leased gauge per partition"
    );
    assert_eq!(
        samples(&text, "strand_queue_oldest_unacked_age_seconds", &queue).len(),
        2,
        "one age gauge per partition"
    );
    let latency_sum: f64 = samples(&text, "strand_queue_lease_to_ack_seconds_sum", &queue)
        .iter()
        .sum();
    assert!(
        (0.5..60.0).contains(&latency_sum),
        "5 acks, each at least 100 ms after its lease: lease-to-ack sum {latency_sum} s"
    );
    // The HTTP API's own series: requests by endpoint and status, and their durations.
    let http = |series: &str| strand_compat_tests::metric_sum(&text, series);
    assert!(
        http("strand_http_requests_total{endpoint=\"publish\",status=\"200\"}") >= 1.0,
        "publishes counted: {}",
        text.lines()
            .filter(|l| l.starts_with("strand_http"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(http("strand_http_requests_total{endpoint=\"lease\",status=\"200\"}") >= 1.0);
    assert!(http("strand_http_request_duration_seconds_count{endpoint=\"lease\"}") >= 1.0);
}

/// Valid HTTP requests of every endpoint with one to three bytes of their bodies overwritten
/// by JSON-ish bytes or extreme numbers (and now and then the path), each on its own
/// connection dropped after at most 300 ms: the broker answers 2xx, 4xx or 429/503, never
/// another 5xx, never panics, and keeps serving. Seeded; `STRAND_FUZZ_SEED` and
/// `STRAND_FUZZ_ROUNDS` for longer hunts.
#[test]
fn random_http_requests_get_4xx_and_never_take_the_broker_down() {
    use std::io::{Read, Write};
    let env = |k: &str, d: u64| std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(d);
    let (seed, rounds) = (
        env("STRAND_FUZZ_SEED", 0x5eed_4077),
        env("STRAND_FUZZ_ROUNDS", 150),
    );
    let broker = start_broker();
    let addr = broker.http_addr();
    let mut c = QueueClient::new(&addr);
    let queue = new_queue(
        &mut c,
        "httpfuzz",
        json!({ "partitions": 2, "backoff_base_ms": 10 }),
    );
    let msgs: Vec<OutMessage> = (0..20).map(|i| OutMessage::new(format!("m{i}"))).collect();
    c.publish(&queue, &msgs).expect("publish");
    let leased = c
        .lease(
            &queue,
            &LeaseOptions {
                max_messages: Some(10),
                ..Default::default()
            },
        )
        .expect("lease");
    let (id, generation) = leased
        .first()
        .map(|m| (m.id.clone(), m.generation))
        .expect("a leased message");
    let seeds: Vec<(&str, String, String)> = vec![
        (
            "PUT",
            format!("/v1/queues/{queue}"),
            json!({"max_attempts": 5, "visibility_timeout_ms": 30000, "backoff_base_ms": 10,
                   "backoff_multiplier": 2.0, "backoff_max_ms": 900000, "ordering": "none",
                   "dedup_window_ms": 300000})
            .to_string(),
        ),
        ("GET", format!("/v1/queues/{queue}"), String::new()),
        (
            "POST",
            format!("/v1/queues/{queue}/messages"),
            json!({"messages": [{"payload": "text", "key": "k7", "headers": {"t": "a"},
                   "delay_ms": 0, "dedup_token": "d1"}, {"payload_base64": "AAEC", "delay_ms": 50}]})
            .to_string(),
        ),
        (
            "POST",
            format!("/v1/queues/{queue}/leases"),
            json!({"max_messages": 5, "visibility_timeout_ms": 30000, "wait_ms": 0,
                   "group": "default", "consumer": "w1"})
            .to_string(),
        ),
        (
            "POST",
            format!("/v1/messages/{id}/ack"),
            json!({"generation": generation, "action": "nack", "delay_ms": 10, "reason": "r"}).to_string(),
        ),
        (
            "POST",
            format!("/v1/messages/{id}/ack"),
            json!({"generation": generation, "action": "extend", "visibility_timeout_ms": 60000}).to_string(),
        ),
        (
            "POST",
            "/v1/messages/ack".to_string(),
            json!({"group": "default", "messages": [{"id": id, "generation": generation, "action": "ack"},
                   {"id": id, "generation": 1, "action": "reject", "reason": "x"}]})
            .to_string(),
        ),
        (
            "POST",
            format!("/v1/queues/{queue}/redrive"),
            json!({"max_messages": 10}).to_string(),
        ),
    ];
    const JSONISH: &[u8] = b"0123456789-+.eE\"{}[],: \\nutfa\x00\xff";
    const NUMBERS: &[&str] = &[
        "-1",
        "0",
        "1e308",
        "-9223372036854775808",
        "18446744073709551616",
        "4294967296",
        "null",
        "\"\"",
        "[]",
        "{}",
    ];
    let mut rng = Gen::new(seed);
    let mut next = move || rng.next_u64();
    let (mut sent, mut server_errors) = (0usize, Vec::new());
    let mut statuses: BTreeMap<u16, usize> = BTreeMap::new();
    for _ in 0..rounds {
        for (method, path, body) in &seeds {
            let mut body = body.clone().into_bytes();
            let mut path = path.clone();
            for _ in 0..=next() % 3 {
                match next() % 4 {
                    0 if !body.is_empty() => {
                        let at = (next() % body.len() as u64) as usize;
                        body[at] = JSONISH[(next() % JSONISH.len() as u64) as usize];
                    }
                    1 if !body.is_empty() => {
                        // Replace a run of digits with an extreme value.
                        let at = (next() % body.len() as u64) as usize;
                        if let Some(start) = body[at..].iter().position(u8::is_ascii_digit).map(|p| at + p) {
                            let end = body[start..]
                                .iter()
                                .position(|b| !b.is_ascii_digit())
                                .map_or(body.len(), |p| start + p);
                            let n = NUMBERS[(next() % NUMBERS.len() as u64) as usize];
                            body.splice(start..end, n.bytes());
                        }
                    }
                    2 if !body.is_empty() => body.truncate((next() % body.len() as u64) as usize),
                    3 if next() % 4 == 0 => {
                        let at = (next() % path.len() as u64) as usize;
                        path.replace_range(
                            at..at + 1,
                            ["%", "/", "x", "%00", "..", "?"][(next() % 6) as usize],
                        );
                    }
                    _ => {}
                }
            }
            let mut s = std::net::TcpStream::connect(&addr).unwrap_or_else(|e| {
                panic!(
                    "seed {seed}: connect after {sent} requests: {e}; the broker's last words:\n{}",
                    broker.stderr_tail(30)
                )
            });
            s.set_read_timeout(Some(Duration::from_millis(300)))
                .expect("timeout");
            let head = format!(
                "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                body.len()
            );
            let _ = s.write_all(head.as_bytes()).and_then(|()| s.write_all(&body));
            sent += 1;
            let mut answer = [0u8; 16];
            if let Ok(n) = s.read(&mut answer) {
                let status: Option<u16> = std::str::from_utf8(&answer[..n])
                    .ok()
                    .and_then(|l| l.get(9..12))
                    .and_then(|c| c.parse().ok());
                if let Some(code) = status {
                    *statuses.entry(code).or_default() += 1;
                }
                if let Some(code) = status.filter(|c| *c >= 500 && *c != 503) {
                    server_errors.push(format!(
                        "{code} for {method} {path} {}",
                        String::from_utf8_lossy(&body)
                    ));
                }
            }
        }
        let r = c
            .call("GET", &format!("/v1/queues/{queue}"), None)
            .unwrap_or_else(|e| {
                panic!(
                    "seed {seed}: GET the queue after {sent} requests: {e}\n{}",
                    broker.stderr_tail(30)
                )
            });
        assert_eq!(
            status_code(&r).0,
            200,
            "seed {seed}: GET the queue after {sent} requests"
        );
    }
    broker.assert_never_panicked(&format!("seed {seed}"));
    assert!(
        server_errors.is_empty(),
        "seed {seed}: {} of {sent} random requests got a server error, e.g.:\n{}",
        server_errors.len(),
        server_errors
            .iter()
            .take(5)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
    let ok: usize = statuses.range(200..300).map(|(_, n)| n).sum();
    let refused: usize = statuses.range(400..500).map(|(_, n)| n).sum();
    assert!(
        ok > sent / 10 && refused > sent / 10,
        "seed {seed}: answers by status {statuses:?} of {sent}: the seeds or the mutations do not reach the handlers"
    );
    eprintln!("{sent} random HTTP requests, answers by status {statuses:?}");
}

// ------------------------------------------------------------------------------------------
// 9. Retried acks

/// How many acknowledgements of a partition (per group) the broker remembers for retried acks
/// (docs/http-api.md, `POST /v1/messages/{id}/ack`).
const REMEMBERED_ACKS: usize = 1_000;

/// A client whose ack answer was lost sends the same ack again: the documented answer is `200`
/// again, also once the message's record has left the window (its ack moved the window's start
/// past it) and across a `kill -9` and restart; only after `REMEMBERED_ACKS` later acks of the
/// partition is it `409 already_done`.
#[test]
fn a_retried_ack_answers_200_again_within_its_bound() {
    let mut broker = start_broker();
    let mut c = QueueClient::new(&broker.http_addr());
    let queue = new_queue(&mut c, "reack", json!({ "partitions": 1 }));
    c.publish(&queue, &[OutMessage::new("first"), OutMessage::new("second")])
        .unwrap_or_else(|e| panic!("publish: {e}"));
    let opts = LeaseOptions {
        max_messages: Some(500),
        wait_ms: Some(2_000),
        ..LeaseOptions::default()
    };
    let leased = c.lease(&queue, &opts).unwrap_or_else(|e| panic!("lease: {e}"));
    assert_eq!(leased.len(), 2, "{leased:?}");
    for m in &leased {
        let s = c.ack(&m.id, m.generation).unwrap_or_else(|e| panic!("ack: {e}"));
        assert_eq!(s.state, "acknowledged");
    }
    // Both acked in offset order: the window's start is past both, their records are gone.
    let (first, second) = (&leased[0], &leased[1]);
    for m in [first, second] {
        let s = c
            .ack(&m.id, m.generation)
            .unwrap_or_else(|e| panic!("a retried ack of {} (its record out of the window): {e}", m.id));
        assert_eq!((s.id.as_str(), s.state.as_str()), (m.id.as_str(), "acknowledged"));
    }
    // Another generation is still refused: only the very request that settled it answers 200.
    let stale = c.ack(&first.id, first.generation + 1000);
    assert!(
        matches!(&stale, Err(CallError::Status { status: 409, code, .. }) if code == "already_done"),
        "an ack naming another generation: {stale:?}"
    );

    broker.kill9();
    broker.restart();
    let mut c = QueueClient::new(&broker.http_addr());
    let s = with_retries(|| c.ack(&first.id, first.generation))
        .unwrap_or_else(|e| panic!("a retried ack after a restart: {e}"));
    assert_eq!(s.state, "acknowledged");

    // REMEMBERED_ACKS later acks of the partition push the first two out of the memory.
    let mut acked = 0;
    let mut last: Option<Leased> = None;
    while acked < REMEMBERED_ACKS {
        let n = (REMEMBERED_ACKS - acked).min(1_000);
        let msgs: Vec<OutMessage> = (0..n)
            .map(|i| OutMessage::new(format!("later {}", acked + i)))
            .collect();
        c.publish(&queue, &msgs)
            .unwrap_or_else(|e| panic!("publish: {e}"));
        let mut got = 0;
        while got < n {
            let leased = c.lease(&queue, &opts).unwrap_or_else(|e| panic!("lease: {e}"));
            assert!(!leased.is_empty(), "nothing to lease after {got} of {n}");
            let items: Vec<(&str, u64)> = leased.iter().map(|m| (m.id.as_str(), m.generation)).collect();
            let answers = c
                .ack_batch(None, &items)
                .unwrap_or_else(|e| panic!("ack batch: {e}"));
            assert!(answers.iter().all(|a| a.is_settled()), "{answers:?}");
            got += leased.len();
            last = leased.last().cloned();
        }
        acked += n;
    }
    let last = last.expect("a later message");
    let s = c
        .ack(&last.id, last.generation)
        .unwrap_or_else(|e| panic!("a retried ack of the last one: {e}"));
    assert_eq!(s.state, "acknowledged");
    for m in [first, second] {
        let r = c.ack(&m.id, m.generation);
        assert!(
            matches!(&r, Err(CallError::Status { status: 409, code, .. }) if code == "already_done"),
            "a retried ack after {REMEMBERED_ACKS} later acks: {r:?}"
        );
    }
    broker.assert_never_panicked("retried acks");
}
