//! Kafka share groups (KIP-932) with a real client against the real binary: confluent-kafka's
//! `ShareConsumer` (librdkafka), the HTTP queue door on the same share group, and raw requests
//! for the exact error codes.
//!
//! * Two share consumers in one group, on a 1-partition topic (implicit acknowledgement) and on
//!   a 4-partition topic (explicit, the second member joining mid-run): 20,000 records, each
//!   held by one consumer at a time, all acknowledged, the work split.
//! * Explicit acknowledgement: RELEASE brings a record back with a higher delivery count, REJECT
//!   dead-letters it with its failure-context headers; a consumer that closes without
//!   acknowledging hands its records over at once, one that is SIGKILLed only after the lock
//!   timeout.
//! * `share.delivery.count.limit`: a record released at every delivery is dead-lettered (seen
//!   with kcat, `strand-dlq-attempts` = the limit) or archived without a dead-letter topic.
//! * A share consumer and an HTTP worker (`"group"`: the share group) never hold the same
//!   message at once and together acknowledge the whole input.
//! * Delivery state (acknowledgements, delivery counts, acquisition locks) survives kill -9.
//! * Error answers with exact codes (raw protocol), and ApiVersions.
//!
//! How "one holder at a time" is checked: every member logs when a poll returned a record
//! (after the broker acquired it) and when it is about to send the acknowledgement (before the
//! broker settles it), on the wall clock the test process shares. For two successive holds of
//! one record, the first holder's acknowledgement must have been sent before the second holder
//! got the record (unless the first lock ended without acknowledgement: lock timeout or a member
//! gone, checked separately), and the delivery count must grow. Members, events and requests:
//! `strand_compat_tests::share`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kafka_protocol::ResponseError;
use strand_compat_tests::admin;
use strand_compat_tests::clients;
use strand_compat_tests::queue_client::{LeaseOptions, QueueClient};
use strand_compat_tests::raw::RawConn;
use strand_compat_tests::share::{
    self, now_ms, AckType, Logged, ShareEvent, ShareLog, ShareMember, ShareSpec,
};
use strand_compat_tests::{tools, unique_topic, wait_for, Broker};

const SHARE_FETCH: i16 = 78;
const SHARE_ACKNOWLEDGE: i16 = 79;
const SHARE_GROUP_HEARTBEAT: i16 = 76;
const SHARE_GROUP_DESCRIBE: i16 = 77;
const DESCRIBE_SHARE_GROUP_OFFSETS: i16 = 90;
const ALTER_SHARE_GROUP_OFFSETS: i16 = 91;
const DELETE_SHARE_GROUP_OFFSETS: i16 = 92;

/// Records of the split runs.
const SPLIT_RECORDS: i64 = 20_000;
/// A lock timeout short enough for the tests (the broker allows it with
/// `group.share.min.record.lock.duration.ms=1000`; Kafka's default minimum is 15 s).
const SHORT_LOCK_MS: i64 = 6_000;
/// How much earlier than its lock timeout a record may come back: the broker acquires a record
/// shortly before the member's poll returns it, which is the time the member logs.
const LOCK_SLACK_MS: f64 = 1_000.0;
/// How late after its lock timeout a record may come back at most.
const LOCK_LATE_MS: f64 = 5_000.0;

fn code(e: ResponseError) -> i16 {
    e.code()
}

/// A broker that accepts short record locks.
fn broker_with_short_locks(reason: &str) -> Broker {
    Broker::builder()
        .config("group.share.min.record.lock.duration.ms", 1000)
        .needs_spawned(reason)
        .start()
}

/// A new topic of `partitions` partitions named after `prefix`, and a share group (`<prefix>-g`)
/// with the group configs `share.auto.offset.reset=earliest` plus `extra`: (topic, group, topic
/// id).
fn setup(
    bootstrap: &str,
    prefix: &str,
    partitions: i32,
    extra: &[(&str, &str)],
) -> (String, String, uuid::Uuid) {
    let (topic, group) = (unique_topic(prefix), unique_topic(&format!("{prefix}-g")));
    let id = admin::create_topic(bootstrap, &topic, partitions, &[]);
    set_configs(bootstrap, &group, extra);
    (topic, group, id)
}

/// Sets the group configs of `group`: `share.auto.offset.reset=earliest` plus `extra`.
fn set_configs(bootstrap: &str, group: &str, extra: &[(&str, &str)]) {
    let mut configs = vec![("share.auto.offset.reset", "earliest")];
    configs.extend_from_slice(extra);
    share::set_group_configs(bootstrap, group, &configs);
}

/// Every (partition, offset) of `partitions` partitions from `first` to `end` (excluded).
fn all_records(partitions: i32, first: i64, end: i64) -> BTreeSet<(i32, i64)> {
    (0..partitions)
        .flat_map(|p| (first..end).map(move |o| (p, o)))
        .collect()
}

/// Waits until ShareGroupDescribe shows `members` members whose assignments together cover
/// `partitions` partitions of `topic_id`, each member with at least one partition.
fn wait_members(bootstrap: &str, group: &str, topic_id: uuid::Uuid, members: usize, partitions: i32) {
    let mut c = admin::connect(bootstrap);
    wait_for(
        Duration::from_secs(30),
        &format!("{members} members of share group {group} with all {partitions} partitions assigned"),
        || {
            let resp = share::describe(&mut c, &[group]);
            let g = resp.groups.first()?;
            if g.error_code != 0 || g.members.len() != members {
                return None;
            }
            let mut covered = BTreeSet::new();
            for m in &g.members {
                let mine: Vec<i32> = m
                    .assignment
                    .topic_partitions
                    .iter()
                    .filter(|t| t.topic_id == topic_id)
                    .flat_map(|t| t.partitions.iter().copied())
                    .collect();
                if mine.is_empty() {
                    return None;
                }
                covered.extend(mine);
            }
            (covered.len() == partitions as usize).then_some(())
        },
    );
}

// ---------------------------------------------------------------------------------------------
// Holds: who held which record when.

/// One acquisition of a record by one holder (a share consumer, or the HTTP worker).
#[derive(Clone, Debug)]
struct Hold {
    holder: String,
    partition: i32,
    offset: i64,
    delivery_count: i32,
    /// When the holder got it (after the broker acquired it).
    start_ms: f64,
    /// When the holder sent its acknowledgement (before the broker settled it), and its type.
    end: Option<(f64, AckType)>,
    /// Whether the broker confirmed that acknowledgement.
    confirmed: Option<bool>,
}

/// The holds of every share consumer in `log`.
fn kafka_holds(log: &[Logged]) -> Vec<Hold> {
    let mut holds: Vec<Hold> = Vec::new();
    // (member, partition, offset) -> index of its hold waiting for an acknowledgement.
    let mut open: BTreeMap<(String, i32, i64), usize> = BTreeMap::new();
    // (member, partition, offset) -> holds acknowledged, waiting for the broker's answer.
    let mut sent: BTreeMap<(String, i32, i64), Vec<usize>> = BTreeMap::new();
    for l in log {
        match &l.event {
            ShareEvent::Acquired { t_ms, records } => {
                for r in records {
                    let key = (l.member.clone(), r.partition, r.offset);
                    open.remove(&key);
                    open.insert(key, holds.len());
                    holds.push(Hold {
                        holder: l.member.clone(),
                        partition: r.partition,
                        offset: r.offset,
                        delivery_count: r.delivery_count,
                        start_ms: *t_ms,
                        end: None,
                        confirmed: None,
                    });
                }
            }
            ShareEvent::AcksSent { t_ms, acks } => {
                for (p, o, t) in acks {
                    let key = (l.member.clone(), *p, *o);
                    if let Some(i) = open.remove(&key) {
                        holds[i].end = Some((*t_ms, *t));
                        sent.entry(key).or_default().push(i);
                    }
                }
            }
            ShareEvent::AckResult {
                partition,
                offsets,
                error,
                ..
            } => {
                for o in offsets {
                    let key = (l.member.clone(), *partition, *o);
                    if let Some(list) = sent.get_mut(&key) {
                        if !list.is_empty() {
                            let i = list.remove(0);
                            holds[i].confirmed = Some(error.is_none());
                        }
                    }
                }
            }
            _ => {}
        }
    }
    holds
}

/// What [`check_exclusive`] found.
#[derive(Debug, Default)]
struct Exclusive {
    /// Records held more than once.
    redelivered: usize,
    /// Successive holds where the first ended without a confirmed acknowledgement (lock
    /// timeout, member gone): (first, second).
    handovers_without_ack: Vec<(Hold, Hold)>,
}

/// Checks that no two holders held a record at once: for successive holds of a record, the
/// delivery count grows, an accepted record is never held again, and an acknowledged hold's
/// acknowledgement was sent before the next holder got the record. Holds ended otherwise are
/// returned for the caller to judge.
fn check_exclusive(holds: &[Hold]) -> Exclusive {
    let mut by_record: BTreeMap<(i32, i64), Vec<&Hold>> = BTreeMap::new();
    for h in holds {
        by_record.entry((h.partition, h.offset)).or_default().push(h);
    }
    let mut out = Exclusive::default();
    let mut problems = Vec::new();
    for ((p, o), mut hs) in by_record {
        hs.sort_by(|a, b| a.start_ms.total_cmp(&b.start_ms));
        if hs.len() > 1 {
            out.redelivered += 1;
        }
        for w in hs.windows(2) {
            let (a, b) = (w[0], w[1]);
            if b.delivery_count <= a.delivery_count {
                problems.push(format!(
                    "{p}:{o}: delivery count {} ({}) then {} ({})",
                    a.delivery_count, a.holder, b.delivery_count, b.holder
                ));
            }
            match (a.end, a.confirmed) {
                (Some((t, ty)), Some(true)) => {
                    if ty == AckType::Accept {
                        problems.push(format!(
                            "{p}:{o}: accepted by {} and delivered again to {}",
                            a.holder, b.holder
                        ));
                    }
                    if t > b.start_ms {
                        problems.push(format!(
                            "{p}:{o}: held by {} (from {:.1}, {} sent at {t:.1}) and by {} from {:.1}: \
                             two holders at once",
                            a.holder,
                            a.start_ms,
                            ty.name(),
                            b.holder,
                            b.start_ms
                        ));
                    }
                }
                _ => out.handovers_without_ack.push((a.clone(), b.clone())),
            }
        }
    }
    assert!(
        problems.is_empty(),
        "{} violations of one-holder-at-a-time, e.g.:\n{}",
        problems.len(),
        problems.iter().take(20).cloned().collect::<Vec<_>>().join("\n")
    );
    out
}

/// The records whose last hold ended with a confirmed ACCEPT, per holder.
fn accepted_by(holds: &[Hold]) -> BTreeMap<String, BTreeSet<(i32, i64)>> {
    let mut out: BTreeMap<String, BTreeSet<(i32, i64)>> = BTreeMap::new();
    for h in holds {
        if matches!(h.end, Some((_, AckType::Accept))) && h.confirmed == Some(true) {
            out.entry(h.holder.clone())
                .or_default()
                .insert((h.partition, h.offset));
        }
    }
    out
}

/// Every record accepted (confirmed) by any share consumer in `log`.
fn accepted_in(log: &[Logged]) -> BTreeSet<(i32, i64)> {
    accepted_by(&kafka_holds(log)).into_values().flatten().collect()
}

/// The delivery counts a member saw for record (partition, offset), in order.
fn deliveries(log: &[Logged], member: &str, partition: i32, offset: i64) -> Vec<i32> {
    share::acquired(log)
        .into_iter()
        .filter(|(m, _, r)| *m == member && r.partition == partition && r.offset == offset)
        .map(|(_, _, r)| r.delivery_count)
        .collect()
}

/// The records a member held, from its `holding` event.
fn held(log: &[Logged], member: &str) -> Option<(f64, BTreeSet<(i32, i64)>)> {
    log.iter().find_map(|l| match &l.event {
        ShareEvent::Holding { t_ms, records } if l.member == member => {
            Some((*t_ms, records.iter().copied().collect()))
        }
        _ => None,
    })
}

/// Runs `f`; if it panics, prints the broker's per-partition queue gauges (available, leased,
/// delayed messages of every group) first, which tell a stalled partition from a slow client.
fn with_queue_gauges_on_failure<T>(broker: &Broker, f: impl FnOnce() -> T) -> T {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(t) => t,
        Err(panic) => {
            let gauges: Vec<String> = broker
                .metrics()
                .lines()
                .filter(|l| {
                    [
                        "strand_queue_available_messages",
                        "strand_queue_leased_messages",
                        "strand_queue_delayed_messages",
                    ]
                    .iter()
                    .any(|m| l.starts_with(m))
                })
                .map(str::to_owned)
                .collect();
            eprintln!("[share] the broker's queue gauges:\n{}", gauges.join("\n"));
            std::panic::resume_unwind(panic)
        }
    }
}

/// When `member` first got each of `records`.
fn first_acquired(log: &[Logged], member: &str, records: &BTreeSet<(i32, i64)>) -> BTreeMap<(i32, i64), f64> {
    let mut out = BTreeMap::new();
    for (m, t, r) in share::acquired(log) {
        if m == member && records.contains(&(r.partition, r.offset)) {
            out.entry((r.partition, r.offset)).or_insert(t);
        }
    }
    out
}

/// Fails on client errors a member reported.
fn assert_no_client_errors(log: &ShareLog, members: &[&str]) {
    let snapshot = log.snapshot();
    for m in members {
        let errs = share::errors(&snapshot, m);
        assert!(errs.is_empty(), "member {m} reported errors: {errs:?}");
    }
}

fn client_version(log: &[Logged]) -> String {
    log.iter()
        .find_map(|l| match &l.event {
            ShareEvent::Subscribed { client, .. } => Some(client.clone()),
            _ => None,
        })
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------------------------
// 1. Two consumers, 20,000 records.

fn split_run(partitions: i32, implicit: bool, late_joiner: bool) {
    let broker = Broker::start();
    let b = broker.bootstrap();
    let (topic, group, topic_id) = setup(&b, "share-split", partitions, &[]);
    let log = ShareLog::new();
    let mut spec = ShareSpec::new(&b, &group, &topic).work_ms_per_record(0.05);
    if implicit {
        spec = spec.implicit();
    }
    let per_partition = SPLIT_RECORDS / i64::from(partitions);
    let first_part = if late_joiner { per_partition / 5 } else { 0 };
    let a = ShareMember::start("a", &spec, &log);
    if late_joiner {
        // The first member alone, with records; the second joins while it works, so
        // partitions move between members with records in flight.
        wait_members(&b, &group, topic_id, 1, partitions);
        clients::produce_numbered(&b, &topic, partitions, 0, first_part);
        log.wait_for(Duration::from_secs(30), "member a to get records", |l| {
            (!share::acquired(l).is_empty()).then_some(())
        });
    }
    let c = ShareMember::start("b", &spec, &log);
    wait_members(&b, &group, topic_id, 2, partitions);
    let started = Instant::now();
    clients::produce_numbered(&b, &topic, partitions, first_part, per_partition - first_part);
    let produced = started.elapsed();
    let want = all_records(partitions, 0, per_partition);
    with_queue_gauges_on_failure(&broker, || {
        log.wait_for(
            Duration::from_secs(90),
            &format!("all {SPLIT_RECORDS} records to be accepted"),
            |l| want.is_subset(&accepted_in(l)).then_some(()),
        )
    });
    let elapsed = started.elapsed();
    a.stop(Duration::from_secs(30));
    c.stop(Duration::from_secs(30));
    assert_no_client_errors(&log, &["a", "b"]);

    let snapshot = log.snapshot();
    let holds = kafka_holds(&snapshot);
    let ex = check_exclusive(&holds);
    assert!(
        ex.handovers_without_ack.is_empty(),
        "records changed hands without an acknowledgement (no lock should have expired): {:?}",
        ex.handovers_without_ack.iter().take(5).collect::<Vec<_>>()
    );
    let by = accepted_by(&holds);
    let accepted_total: usize = by.values().map(BTreeSet::len).sum();
    assert_eq!(
        accepted_total,
        want.len(),
        "every record must be accepted exactly once (accepted {accepted_total} times for {} records)",
        want.len()
    );
    let union: BTreeSet<(i32, i64)> = by.values().flatten().copied().collect();
    assert_eq!(union, want, "the accepted records are not exactly the input");
    for h in &holds {
        assert!(
            (0..partitions).contains(&h.partition) && want.contains(&(h.partition, h.offset)),
            "{} got a record that was never produced: {h:?}",
            h.holder
        );
    }
    let counts: BTreeMap<&str, usize> = ["a", "b"]
        .iter()
        .map(|m| (*m, by.get(*m).map_or(0, BTreeSet::len)))
        .collect();
    for (m, n) in &counts {
        assert!(
            *n as f64 >= 0.2 * SPLIT_RECORDS as f64,
            "member {m} accepted only {n} of {SPLIT_RECORDS} records: the work was not split ({counts:?})"
        );
    }
    let dcs: BTreeSet<i32> = holds.iter().map(|h| h.delivery_count).collect();
    assert!(
        !dcs.contains(&0),
        "the client reported no delivery count for some records (delivery counts seen: {dcs:?})"
    );
    eprintln!(
        "[share split] {} ({} partition(s), {} acknowledgement, late joiner: {late_joiner}): {SPLIT_RECORDS} \
         records produced in {produced:?}, all accepted {elapsed:?} after the produce started ({:.0} records/s); \
         accepted per member {counts:?}; {} records redelivered; delivery counts seen {dcs:?}",
        client_version(&snapshot),
        partitions,
        if implicit { "implicit" } else { "explicit" },
        SPLIT_RECORDS as f64 / elapsed.as_secs_f64(),
        ex.redelivered,
    );
}

#[test]
fn two_share_consumers_split_one_partition_implicit_acks() {
    split_run(1, true, false);
}

#[test]
fn two_share_consumers_split_four_partitions_explicit_acks_second_joins_mid_run() {
    split_run(4, false, true);
}

// ---------------------------------------------------------------------------------------------
// 2. Explicit acknowledgement: RELEASE, REJECT, close, kill -9.

/// The dead-letter topic's records (kcat), once there are `n`.
fn dead_letters(bootstrap: &str, dlq: &str, n: usize) -> Vec<(i32, i64, String, BTreeMap<String, String>)> {
    tools::kcat();
    let mut c = admin::connect(bootstrap);
    wait_for(
        Duration::from_secs(30),
        &format!("{n} record(s) in {dlq}"),
        || {
            let md = admin::metadata(&mut c, &[dlq], false);
            let t = md.topics.first()?;
            if t.error_code != 0 {
                return None;
            }
            let total: i64 = (0..t.partitions.len() as i32)
                .map(|p| admin::latest(&mut c, dlq, p) - admin::earliest(&mut c, dlq, p))
                .sum();
            (total >= n as i64).then_some(())
        },
    );
    let recs = share::kcat_records(bootstrap, dlq);
    assert_eq!(
        recs.len(),
        n,
        "kcat read {} records from {dlq}: {recs:?}",
        recs.len()
    );
    recs
}

/// Checks the failure-context headers of a dead letter (docs/http-api.md, "Dead letters").
fn assert_dead_letter(
    dl: &(i32, i64, String, BTreeMap<String, String>),
    topic: &str,
    partition: i32,
    offset: i64,
    attempts: u32,
    cause: &str,
) {
    let (_, _, value, h) = dl;
    assert_eq!(
        value,
        &format!("{partition}:{offset}"),
        "dead letter value; headers {h:?}"
    );
    let get = |k: &str| {
        h.get(k)
            .unwrap_or_else(|| panic!("dead letter of {partition}:{offset} lacks header {k}: {h:?}"))
            .as_str()
    };
    assert_eq!(get("strand-dlq-source-topic"), topic, "{h:?}");
    assert_eq!(get("strand-dlq-source-partition"), partition.to_string(), "{h:?}");
    assert_eq!(get("strand-dlq-source-offset"), offset.to_string(), "{h:?}");
    assert_eq!(get("strand-dlq-attempts"), attempts.to_string(), "{h:?}");
    assert_eq!(get("strand-dlq-cause"), cause, "{h:?}");
    assert!(!get("strand-message-id").is_empty(), "{h:?}");
    assert!(!get("strand-dlq-reason").is_empty(), "{h:?}");
    let first: i64 = get("strand-dlq-first-delivery-ms")
        .parse()
        .expect("first delivery ms");
    let last: i64 = get("strand-dlq-last-delivery-ms")
        .parse()
        .expect("last delivery ms");
    let at: i64 = get("strand-dlq-time-ms").parse().expect("dead-letter time ms");
    assert!(
        first <= last && last <= at && (at as f64) <= now_ms() + 1000.0,
        "dead-letter times out of order: first {first}, last {last}, at {at}"
    );
}

#[test]
fn release_comes_back_with_a_higher_delivery_count_and_reject_dead_letters() {
    let broker = Broker::start();
    let b = broker.bootstrap();
    let dlq = format!("dlq.{}", unique_topic("share-ack"));
    let (topic, group, _) = setup(&b, "share-ack", 1, &[("errors.deadletterqueue.topic.name", &dlq)]);
    clients::produce_numbered(&b, &topic, 1, 0, 20);
    let log = ShareLog::new();
    let spec = ShareSpec::new(&b, &group, &topic)
        .on(0, 3, &[AckType::Release, AckType::Accept])
        .on(0, 7, &[AckType::Reject])
        .on(0, 11, &[AckType::Release, AckType::Release, AckType::Accept]);
    let a = ShareMember::start("a", &spec, &log);
    let want: BTreeSet<(i32, i64)> = all_records(1, 0, 20).into_iter().filter(|r| r.1 != 7).collect();
    log.wait_for(Duration::from_secs(30), "19 records accepted", |l| {
        want.is_subset(&accepted_in(l)).then_some(())
    });
    // A later record shows that nothing else is coming back.
    clients::produce_numbered(&b, &topic, 1, 20, 1);
    log.wait_for(Duration::from_secs(30), "the record after them", |l| {
        accepted_in(l).contains(&(0, 20)).then_some(())
    });
    a.stop(Duration::from_secs(30));
    assert_no_client_errors(&log, &["a"]);
    let snapshot = log.snapshot();
    for o in 0..=20 {
        let want_dcs: &[i32] = match o {
            3 => &[1, 2],
            11 => &[1, 2, 3],
            _ => &[1],
        };
        assert_eq!(
            deliveries(&snapshot, "a", 0, o),
            want_dcs,
            "delivery counts of offset {o} as Message.delivery_count() showed them"
        );
    }
    let results = share::ack_results(&snapshot, "a");
    assert!(
        results.failed.is_empty(),
        "acknowledgements failed: {:?}",
        results.failed
    );
    assert!(
        results.ok.contains(&(0, 7)),
        "the REJECT of 0:7 was not confirmed"
    );
    check_exclusive(&kafka_holds(&snapshot));
    let dls = dead_letters(&b, &dlq, 1);
    assert_dead_letter(&dls[0], &topic, 0, 7, 1, "rejected");
    eprintln!(
        "[share ack] {}: RELEASE -> delivery counts 1,2 (and 1,2,3); REJECT -> {dlq}: {:?}",
        client_version(&snapshot),
        dls[0].3
    );
}

/// A member that holds (never acknowledges) its first poll's records, and one that accepts
/// everything, on a 1-partition topic of 200 records; returns the held records and when the
/// holder got them, once the other member has accepted everything else.
fn holder_and_worker(
    b: &str,
    topic: &str,
    group: &str,
    log: &ShareLog,
) -> (ShareMember, ShareMember, f64, BTreeSet<(i32, i64)>) {
    clients::produce_numbered(b, topic, 1, 0, 200);
    let holder = ShareMember::start(
        "holder",
        &ShareSpec::new(b, group, topic)
            .hold_all()
            .set("max.poll.records", 50),
        log,
    );
    let (t_acq, held_records) = log.wait_for(Duration::from_secs(30), "the holder to hold records", |l| {
        let (_, h) = held(l, "holder")?;
        let t = share::acquired(l).first().map(|(_, t, _)| *t)?;
        Some((t, h))
    });
    assert!(
        !held_records.is_empty() && held_records.len() < 200,
        "the holder should hold some of the 200 records (max.poll.records=50): {}",
        held_records.len()
    );
    let worker = ShareMember::start("worker", &ShareSpec::new(b, group, topic), log);
    let rest: BTreeSet<(i32, i64)> = all_records(1, 0, 200)
        .difference(&held_records)
        .copied()
        .collect();
    log.wait_for(
        Duration::from_secs(30),
        "the worker to accept the other records",
        |l| rest.is_subset(&accepted_in(l)).then_some(()),
    );
    let early = first_acquired(&log.snapshot(), "worker", &held_records);
    assert!(
        early.is_empty(),
        "the worker got records the holder still held: {:?}",
        early.keys().take(5).collect::<Vec<_>>()
    );
    (holder, worker, t_acq, held_records)
}

#[test]
fn a_closed_consumer_hands_its_records_over_at_once() {
    // The group's lock timeout is the broker default (30 s): a prompt handover is the close.
    let broker = Broker::start();
    let b = broker.bootstrap();
    let (topic, group, _) = setup(&b, "share-close", 1, &[]);
    let log = ShareLog::new();
    let (holder, worker, _t_acq, held_records) = holder_and_worker(&b, &topic, &group, &log);
    let t_close = now_ms();
    holder.stop(Duration::from_secs(30));
    let t_closed = now_ms();
    log.wait_for(
        Duration::from_secs(20),
        "the worker to accept the records of the closed member",
        |l| held_records.is_subset(&accepted_in(l)).then_some(()),
    );
    worker.stop(Duration::from_secs(30));
    let snapshot = log.snapshot();
    let got = first_acquired(&snapshot, "worker", &held_records);
    let first = got.values().copied().fold(f64::INFINITY, f64::min);
    let last = got.values().copied().fold(0.0, f64::max);
    assert!(
        first >= t_close,
        "the worker got held records before the holder closed"
    );
    assert!(
        last - t_close < 10_000.0,
        "records of a closed member came back {:.0} ms after close() was called (the lock timeout is \
         30 s; a close releases them)",
        last - t_close
    );
    for (p, o) in &held_records {
        assert_eq!(
            deliveries(&snapshot, "worker", *p, *o),
            vec![2],
            "delivery counts of {p}:{o}"
        );
    }
    check_exclusive(&kafka_holds(&snapshot));
    eprintln!(
        "[share close] {} held records back {:.0} ms after close() was called (close() took {:.0} ms)",
        held_records.len(),
        first - t_close,
        t_closed - t_close
    );
}

#[test]
fn a_killed_consumers_records_come_back_after_the_lock_timeout() {
    let broker = broker_with_short_locks("sets group.share.min.record.lock.duration.ms");
    let b = broker.bootstrap();
    let lock = SHORT_LOCK_MS.to_string();
    let (topic, group, _) = setup(&b, "share-kill", 1, &[("share.record.lock.duration.ms", &lock)]);
    let log = ShareLog::new();
    let (mut holder, worker, t_acq, held_records) = holder_and_worker(&b, &topic, &group, &log);
    let t_kill = now_ms();
    holder.kill9();
    log.wait_for(
        Duration::from_millis(SHORT_LOCK_MS as u64 + 20_000),
        "the worker to accept the records of the killed member",
        |l| held_records.is_subset(&accepted_in(l)).then_some(()),
    );
    // The killed member is still in the group (session timeout 45 s): its locks ran out.
    let mut c = admin::connect(&b);
    let d = share::describe(&mut c, &[&group]);
    let members = d.groups.first().map_or(0, |g| g.members.len());
    worker.stop(Duration::from_secs(30));
    let snapshot = log.snapshot();
    let got = first_acquired(&snapshot, "worker", &held_records);
    let first = got.values().copied().fold(f64::INFINITY, f64::min);
    let last = got.values().copied().fold(0.0, f64::max);
    let lock_ms = SHORT_LOCK_MS as f64;
    assert!(
        first >= t_acq + lock_ms - LOCK_SLACK_MS,
        "records of the killed member came back {:.0} ms after it got them: before the lock timeout \
         ({SHORT_LOCK_MS} ms)",
        first - t_acq
    );
    assert!(
        last <= t_acq + lock_ms + LOCK_LATE_MS,
        "records of the killed member came back {:.0} ms after it got them (lock timeout {SHORT_LOCK_MS} ms)",
        last - t_acq
    );
    assert_eq!(
        members, 2,
        "the killed member should still be a member (its session has not expired)"
    );
    for (p, o) in &held_records {
        assert_eq!(
            deliveries(&snapshot, "worker", *p, *o),
            vec![2],
            "delivery counts of {p}:{o}"
        );
    }
    let ex = check_exclusive(&kafka_holds(&snapshot));
    assert_eq!(
        ex.handovers_without_ack.len(),
        held_records.len(),
        "only the killed member's records change hands without an acknowledgement"
    );
    eprintln!(
        "[share kill] {} records of the SIGKILLed member back {:.0} ms after it got them ({:.0} ms after the \
         kill; lock timeout {SHORT_LOCK_MS} ms)",
        held_records.len(),
        first - t_acq,
        first - t_kill
    );
}

// ---------------------------------------------------------------------------------------------
// 3. Delivery count limit.

#[test]
fn delivery_count_limit_dead_letters_or_archives_a_poison_record() {
    let broker = Broker::start();
    let b = broker.bootstrap();
    let dlq = format!("dlq.{}", unique_topic("share-poison"));
    let dlq_configs = [
        ("share.delivery.count.limit", "3"),
        ("errors.deadletterqueue.topic.name", &dlq),
    ];
    let (topic, with_dlq, _) = setup(&b, "share-poison", 1, &dlq_configs);
    let archive = unique_topic("share-poison-arch-g");
    set_configs(&b, &archive, &[("share.delivery.count.limit", "2")]);
    clients::produce_numbered(&b, &topic, 1, 0, 10);
    let log = ShareLog::new();
    let poison = |g: &str| ShareSpec::new(&b, g, &topic).on(0, 5, &[AckType::Release]);
    let m1 = ShareMember::start("dlq", &poison(&with_dlq), &log);
    let m2 = ShareMember::start("archive", &poison(&archive), &log);
    let others: BTreeSet<(i32, i64)> = all_records(1, 0, 10).into_iter().filter(|r| r.1 != 5).collect();
    log.wait_for(
        Duration::from_secs(30),
        "both groups to accept the other 9 records",
        |l| {
            let h = accepted_by(&kafka_holds(l));
            ["dlq", "archive"]
                .iter()
                .all(|m| h.get(*m).is_some_and(|s| others.is_subset(s)))
                .then_some(())
        },
    );
    log.wait_for(
        Duration::from_secs(30),
        "the poison record's last deliveries",
        |l| {
            (deliveries(l, "dlq", 0, 5).len() >= 3 && deliveries(l, "archive", 0, 5).len() >= 2).then_some(())
        },
    );
    // A released record is available at once: had it not been archived, it would come back
    // before (or with) this one.
    clients::produce_numbered(&b, &topic, 1, 10, 1);
    log.wait_for(
        Duration::from_secs(30),
        "both groups to accept the record after it",
        |l| {
            let h = accepted_by(&kafka_holds(l));
            ["dlq", "archive"]
                .iter()
                .all(|m| h.get(*m).is_some_and(|s| s.contains(&(0, 10))))
                .then_some(())
        },
    );
    std::thread::sleep(Duration::from_millis(500));
    m1.stop(Duration::from_secs(30));
    m2.stop(Duration::from_secs(30));
    assert_no_client_errors(&log, &["dlq", "archive"]);
    let snapshot = log.snapshot();
    assert_eq!(
        deliveries(&snapshot, "dlq", 0, 5),
        vec![1, 2, 3],
        "share.delivery.count.limit=3: the poison record is delivered 3 times"
    );
    assert_eq!(
        deliveries(&snapshot, "archive", 0, 5),
        vec![1, 2],
        "share.delivery.count.limit=2: the poison record is delivered twice"
    );
    // The two members are in different groups: each group holds every record on its own.
    for member in ["dlq", "archive"] {
        let holds: Vec<Hold> = kafka_holds(&snapshot)
            .into_iter()
            .filter(|h| h.holder == member)
            .collect();
        check_exclusive(&holds);
    }
    let dls = dead_letters(&b, &dlq, 1);
    assert_dead_letter(&dls[0], &topic, 0, 5, 3, "max-attempts");
    eprintln!(
        "[share poison] delivery counts 1,2,3 then dead-lettered (kcat -f '%h'): {:?}; limit 2 without a \
         dead-letter topic: 1,2 then archived",
        dls[0].3
    );
}

// ---------------------------------------------------------------------------------------------
// 4. A share consumer and an HTTP worker on the same share group.

#[test]
fn share_consumer_and_http_worker_never_hold_the_same_message() {
    const N: i64 = 2_000;
    let broker = Broker::builder().needs_spawned("uses the HTTP queue API").start();
    let b = broker.bootstrap();
    let http = broker.http_addr();
    let (topic, group, topic_id) = setup(&b, "share-http", 2, &[]);
    let log = ShareLog::new();
    let member = ShareMember::start(
        "kafka",
        &ShareSpec::new(&b, &group, &topic).work_ms_per_record(0.2),
        &log,
    );
    wait_members(&b, &group, topic_id, 1, 2);
    // The HTTP worker: leases of 50, the same simulated work, one batch ack per lease.
    let stop = Arc::new(AtomicBool::new(false));
    let http_holds: Arc<Mutex<Vec<share_http::HttpHold>>> = Arc::default();
    let worker = {
        let (stop, holds, group, topic) = (stop.clone(), http_holds.clone(), group.clone(), topic.clone());
        std::thread::spawn(move || share_http::worker(&http, &topic, &group, &stop, &holds))
    };
    let started = Instant::now();
    clients::produce_numbered(&b, &topic, 2, 0, N / 2);
    let want = all_records(2, 0, N / 2);
    let done = |l: &[Logged]| -> BTreeSet<(i32, i64)> {
        let mut s = accepted_in(l);
        let hh = http_holds.lock().unwrap_or_else(|e| e.into_inner());
        s.extend(hh.iter().filter(|h| h.acked).map(|h| (h.partition, h.offset)));
        s
    };
    wait_for(
        Duration::from_secs(60),
        "the whole input to be acknowledged",
        || want.is_subset(&done(&log.snapshot())).then_some(()),
    );
    let elapsed = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    let worker_result = worker.join().expect("the HTTP worker thread");
    member.stop(Duration::from_secs(30));
    if let Err(e) = worker_result {
        panic!("HTTP worker: {e}");
    }
    assert_no_client_errors(&log, &["kafka"]);
    let snapshot = log.snapshot();
    let mut holds = kafka_holds(&snapshot);
    let hh = http_holds.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let refused: Vec<&share_http::HttpHold> = hh.iter().filter(|h| h.ended && !h.acked).collect();
    assert!(
        refused.is_empty(),
        "HTTP acks refused: {:?}",
        refused.iter().take(5).collect::<Vec<_>>()
    );
    holds.extend(hh.iter().map(|h| Hold {
        holder: "http".into(),
        partition: h.partition,
        offset: h.offset,
        delivery_count: h.attempt as i32,
        start_ms: h.start_ms,
        end: h.ended.then_some((h.end_ms, AckType::Accept)),
        confirmed: h.ended.then_some(h.acked),
    }));
    let ex = check_exclusive(&holds);
    assert!(
        ex.handovers_without_ack.is_empty(),
        "messages changed hands without an acknowledgement: {:?}",
        ex.handovers_without_ack.iter().take(5).collect::<Vec<_>>()
    );
    let by = accepted_by(&holds);
    let total: usize = by.values().map(BTreeSet::len).sum();
    let union: BTreeSet<(i32, i64)> = by.values().flatten().copied().collect();
    assert_eq!(
        union, want,
        "the union of what both acknowledged is not the input"
    );
    assert_eq!(total, want.len(), "some message was acknowledged twice");
    let counts: BTreeMap<&str, usize> = by.iter().map(|(k, v)| (k.as_str(), v.len())).collect();
    for m in ["kafka", "http"] {
        let n = counts.get(m).copied().unwrap_or(0);
        assert!(
            n as f64 >= 0.05 * N as f64,
            "{m} acknowledged only {n} of {N} messages: the two doors did not share the work ({counts:?})"
        );
    }
    eprintln!(
        "[share+http] {N} messages acknowledged in {elapsed:?}: {counts:?}, {} redelivered",
        ex.redelivered
    );
}

mod share_http {
    use super::*;

    /// One HTTP lease of one message.
    #[derive(Clone, Debug)]
    pub(super) struct HttpHold {
        pub(super) partition: i32,
        pub(super) offset: i64,
        pub(super) attempt: u32,
        pub(super) start_ms: f64,
        pub(super) end_ms: f64,
        /// The ack was sent.
        pub(super) ended: bool,
        /// The ack was answered as settled.
        pub(super) acked: bool,
    }

    /// Leases (50 at a time, long polling) and acks until `stop`.
    pub(super) fn worker(
        http: &str,
        topic: &str,
        group: &str,
        stop: &AtomicBool,
        holds: &Mutex<Vec<HttpHold>>,
    ) -> Result<(), String> {
        let mut q = QueueClient::new(http);
        let opts = LeaseOptions {
            max_messages: Some(50),
            visibility_timeout_ms: Some(30_000),
            wait_ms: Some(200),
            group: Some(group.to_string()),
            consumer: Some("http-worker".into()),
        };
        while !stop.load(Ordering::Relaxed) {
            let leased = q.lease(topic, &opts).map_err(|e| format!("lease: {e}"))?;
            let t = now_ms();
            if leased.is_empty() {
                continue;
            }
            let base = {
                let mut h = holds.lock().unwrap_or_else(|e| e.into_inner());
                let base = h.len();
                h.extend(leased.iter().map(|m| HttpHold {
                    partition: m.partition,
                    offset: m.offset,
                    attempt: m.attempt,
                    start_ms: t,
                    end_ms: 0.0,
                    ended: false,
                    acked: false,
                }));
                base
            };
            std::thread::sleep(Duration::from_micros(200 * leased.len() as u64));
            let items: Vec<(&str, u64)> = leased.iter().map(|m| (m.id.as_str(), m.generation)).collect();
            let sent = now_ms();
            {
                let mut h = holds.lock().unwrap_or_else(|e| e.into_inner());
                for x in &mut h[base..] {
                    x.end_ms = sent;
                    x.ended = true;
                }
            }
            let results = q
                .ack_batch(Some(group), &items)
                .map_err(|e| format!("ack: {e}"))?;
            let mut h = holds.lock().unwrap_or_else(|e| e.into_inner());
            for (x, r) in h[base..].iter_mut().zip(&results) {
                x.acked = r.is_settled();
            }
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// 5. Share state across kill -9.

#[test]
fn share_state_survives_kill9_and_restart() {
    let mut broker = broker_with_short_locks("kills and restarts the broker");
    let b = broker.bootstrap();
    let lock_ms: i64 = 5_000;
    let lock = lock_ms.to_string();
    let (topic, group, _) = setup(&b, "share-crash", 1, &[("share.record.lock.duration.ms", &lock)]);
    clients::produce_numbered(&b, &topic, 1, 0, 60);
    let log = ShareLog::new();
    // Step 1: 0..59; 50 is released, the rest accepted. Step 2 (after 60..99 are produced):
    // 50 again (released a second time) and 60..99, held.
    let mut x = ShareMember::start(
        "before",
        &ShareSpec::new(&b, &group, &topic)
            .stepped()
            .on(0, 50, &[AckType::Release])
            .hold_from(0, 60),
        &log,
    );
    let steps_done = |l: &[Logged]| {
        l.iter()
            .filter(|e| e.member == "before" && matches!(e.event, ShareEvent::StepDone { .. }))
            .count()
    };
    x.step();
    log.wait_for(Duration::from_secs(30), "the first step", |l| {
        (steps_done(l) == 1).then_some(())
    });
    clients::produce_numbered(&b, &topic, 1, 60, 40);
    x.step();
    log.wait_for(Duration::from_secs(30), "the second step", |l| {
        (steps_done(l) == 2).then_some(())
    });
    let (t_hold, held_records) =
        log.wait_for(Duration::from_secs(10), "the held records", |l| held(l, "before"));
    let before = log.snapshot();
    assert_eq!(
        deliveries(&before, "before", 0, 50),
        vec![1, 2],
        "0:50 before the crash"
    );
    assert_eq!(held_records, all_records(1, 60, 100), "records held at the crash");
    let share::AckResults { ok, failed } = share::ack_results(&before, "before");
    assert!(
        failed.is_empty(),
        "acknowledgements failed before the crash: {failed:?}"
    );
    let accepted_before: BTreeSet<(i32, i64)> =
        all_records(1, 0, 60).into_iter().filter(|r| r.1 != 50).collect();
    assert!(
        accepted_before.is_subset(&ok) && ok.contains(&(0, 50)),
        "not every acknowledgement was confirmed before the crash: {ok:?}"
    );
    let t_acq2 = share::acquired(&before)
        .iter()
        .filter(|(m, _, r)| *m == "before" && r.offset >= 60)
        .map(|(_, t, _)| *t)
        .fold(f64::INFINITY, f64::min);
    // Crash the consumer, then the broker.
    x.kill9();
    broker.kill9();
    let t_crash = now_ms();
    broker.restart();
    let t_up = now_ms();
    clients::produce_numbered(&b, &topic, 1, 100, 1);
    let y = ShareMember::start("after", &ShareSpec::new(&b, &group, &topic), &log);
    let expect: BTreeSet<(i32, i64)> = all_records(1, 60, 101).into_iter().chain([(0, 50)]).collect();
    log.wait_for(
        Duration::from_millis(lock_ms as u64 + 30_000),
        "the consumer after the restart to accept 0:50, 60..99 and 100",
        |l| {
            let h = accepted_by(&kafka_holds(l));
            h.get("after").is_some_and(|s| expect.is_subset(s)).then_some(())
        },
    );
    std::thread::sleep(Duration::from_millis(500));
    y.stop(Duration::from_secs(30));
    assert_no_client_errors(&log, &["after"]);
    let snapshot = log.snapshot();
    let after: BTreeSet<(i32, i64)> = share::acquired(&snapshot)
        .iter()
        .filter(|(m, _, _)| *m == "after")
        .map(|(_, _, r)| (r.partition, r.offset))
        .collect();
    let redelivered: Vec<&(i32, i64)> = after.intersection(&accepted_before).collect();
    assert!(
        redelivered.is_empty(),
        "records acknowledged before the crash were delivered again: {redelivered:?}"
    );
    assert_eq!(
        deliveries(&snapshot, "after", 0, 50),
        vec![3],
        "a record released twice before the crash comes back with delivery count 3"
    );
    assert_eq!(
        deliveries(&snapshot, "after", 0, 100),
        vec![1],
        "the record produced after the restart"
    );
    let back = first_acquired(&snapshot, "after", &held_records);
    for r in &held_records {
        assert_eq!(
            deliveries(&snapshot, "after", r.0, r.1),
            vec![2],
            "{}:{}: acquired (delivery 1) at the crash, its lock expired: delivery 2",
            r.0,
            r.1
        );
    }
    let first_back = back.values().copied().fold(f64::INFINITY, f64::min);
    let ex = check_exclusive(&kafka_holds(&snapshot));
    assert_eq!(
        ex.handovers_without_ack.len(),
        held_records.len(),
        "only the records held at the crash change hands without an acknowledgement"
    );
    assert!(
        first_back >= t_acq2 + lock_ms as f64 - LOCK_SLACK_MS,
        "records acquired before the crash came back {:.0} ms after their acquisition: the lock (its \
         record is durable) lasts {lock_ms} ms",
        first_back - t_acq2
    );
    assert!(
        first_back <= t_up.max(t_acq2 + lock_ms as f64) + LOCK_LATE_MS,
        "records acquired before the crash came back {:.0} ms after their acquisition (lock {lock_ms} ms; \
         restart done {:.0} ms after it)",
        first_back - t_acq2,
        t_up - t_acq2
    );
    eprintln!(
        "[share crash] restart took {:.0} ms; after it: 0:50 delivery count 3, {} records held at the crash back \
         with delivery count 2 {:.0} ms after their acquisition (lock {lock_ms} ms; held since {:.0} ms before \
         the crash), none of the 59 accepted ones",
        t_up - t_crash,
        held_records.len(),
        first_back - t_acq2,
        t_crash - t_hold
    );
}

// ---------------------------------------------------------------------------------------------
// 6. Close after acknowledging.

#[test]
fn acknowledgements_given_before_close_are_not_lost() {
    // librdkafka's close() sends the pending acknowledgements (ShareAcknowledge, session epoch -1)
    // and the leave heartbeat (epoch -1) at the same time, on two connections. Kafka checks the
    // share session, not the membership, so the acknowledgements count either way.
    let broker = Broker::start();
    let b = broker.bootstrap();
    let (topic, group, _) = setup(&b, "share-closeack", 1, &[]);
    clients::produce_numbered(&b, &topic, 1, 0, 20);
    let log = ShareLog::new();
    let a = ShareMember::start(
        "a",
        &ShareSpec::new(&b, &group, &topic).no_commit().max_polls(1),
        &log,
    );
    let got = log.wait_for(
        Duration::from_secs(30),
        "member a to acknowledge its records",
        |l| {
            l.iter().find_map(|e| match &e.event {
                ShareEvent::AcksSent { acks, .. } if e.member == "a" => Some(acks.len()),
                _ => None,
            })
        },
    );
    a.stop(Duration::from_secs(30));
    let after_close = log.snapshot();
    let failed = share::ack_results(&after_close, "a").failed;
    // Whatever comes back now was acknowledged (ACCEPT) by a before its close.
    clients::produce_numbered(&b, &topic, 1, 20, 1);
    let c = ShareMember::start("c", &ShareSpec::new(&b, &group, &topic), &log);
    log.wait_for(
        Duration::from_secs(30),
        "member c to get the record after them",
        |l| accepted_in(l).contains(&(0, 20)).then_some(()),
    );
    c.stop(Duration::from_secs(30));
    let snapshot = log.snapshot();
    let again: Vec<i64> = share::acquired(&snapshot)
        .iter()
        .filter(|(m, _, r)| *m == "c" && r.offset < 20)
        .map(|(_, _, r)| r.offset)
        .collect();
    assert!(
        failed.is_empty() && again.is_empty(),
        "{got} records accepted by a before close() were not settled: the broker answered {:?}, and {} of \
         them were delivered again ({again:?})",
        failed.values().collect::<BTreeSet<_>>(),
        again.len()
    );
}

// ---------------------------------------------------------------------------------------------
// 7. Errors, as Kafka returns them (raw protocol).

#[test]
fn api_versions_list_the_share_apis_at_v1() {
    let broker = Broker::start();
    let mut c = admin::connect(&broker.bootstrap());
    // The KIP-932 offsets admin APIs at v0, the others at v1.
    for (key, name, version) in [
        (SHARE_GROUP_HEARTBEAT, "ShareGroupHeartbeat", 1),
        (SHARE_GROUP_DESCRIBE, "ShareGroupDescribe", 1),
        (SHARE_FETCH, "ShareFetch", 1),
        (SHARE_ACKNOWLEDGE, "ShareAcknowledge", 1),
        (DESCRIBE_SHARE_GROUP_OFFSETS, "DescribeShareGroupOffsets", 0),
        (DELETE_SHARE_GROUP_OFFSETS, "DeleteShareGroupOffsets", 0),
        (ALTER_SHARE_GROUP_OFFSETS, "AlterShareGroupOffsets", 0),
    ] {
        assert_eq!(
            admin::advertised_versions(&mut c, key),
            Some((version, version)),
            "ApiVersions must list {name} ({key}) at v{version}"
        );
    }
}

/// The start offset DescribeShareGroupOffsets gives for (group, topic, partition 0), with the
/// group's and the partition's error codes.
fn described_start(c: &mut RawConn, group: &str, topic: &str) -> (i16, Option<(i16, i64)>) {
    let r = share::describe_offsets(c, group, Some(&[(topic, &[0])]));
    let g = r.groups.first().expect("a described group");
    let p = g
        .topics
        .iter()
        .find(|t| t.topic_name.as_str() == topic)
        .and_then(|t| t.partitions.iter().find(|p| p.partition_index == 0));
    (g.error_code, p.map(|p| (p.error_code, p.start_offset)))
}

#[test]
fn share_group_offsets_are_described_and_deleted() {
    let broker = Broker::start();
    let b = broker.bootstrap();
    let (topic, group, tid) = setup(&b, "share-offsets", 1, &[]);
    clients::produce_numbered(&b, &topic, 1, 0, 10);
    let mut c = admin::connect(&b);

    // Unknown group (also a group id never used as a share group).
    let (e, _) = described_start(&mut c, "no-such-share-group", &topic);
    assert_eq!(
        e,
        code(ResponseError::GroupIdNotFound),
        "unknown group: {}",
        admin::err_name(e)
    );

    // A member acquires the 10 records and accepts 0..=5.
    let m1 = member_accepting_six_of_ten(&mut c, &group, &topic, tid);

    // While the member is in the group: described, and the delete is refused.
    assert_eq!(
        described_start(&mut c, &group, &topic),
        (0, Some((0, 6))),
        "start offset with a member"
    );
    let d = share::delete_offsets(&mut c, &group, &[&topic]);
    admin::assert_code(
        d.error_code,
        ResponseError::NonEmptyGroup,
        "DeleteShareGroupOffsets with a member",
    );

    // The member leaves: the start offset stays 6 (records 6..9 are released, not done).
    let r = share::heartbeat(&mut c, &group, &m1, -1, None);
    admin::assert_ok(r.error_code, "leave");
    assert_eq!(
        described_start(&mut c, &group, &topic),
        (0, Some((0, 6))),
        "start offset after leaving"
    );
    // Every topic with share state when the request names none.
    let all = share::describe_offsets(&mut c, &group, None);
    let g = all.groups.first().expect("a described group");
    admin::assert_ok(g.error_code, "describe all");
    type Listed = (String, uuid::Uuid, Vec<(i32, i64, i16)>);
    let listed: Vec<Listed> = g
        .topics
        .iter()
        .map(|t| {
            (
                t.topic_name.to_string(),
                t.topic_id,
                t.partitions
                    .iter()
                    .map(|p| (p.partition_index, p.start_offset, p.error_code))
                    .collect(),
            )
        })
        .collect();
    assert_eq!(
        listed,
        vec![(topic.clone(), tid, vec![(0, 6, 0)])],
        "describe with topics = null"
    );
    // An unknown topic and partition.
    let r = share::describe_offsets(
        &mut c,
        &group,
        Some(&[("no-such-topic", &[0]), (topic.as_str(), &[1])]),
    );
    let codes: Vec<i16> = r.groups[0]
        .topics
        .iter()
        .flat_map(|t| t.partitions.iter().map(|p| p.error_code))
        .collect();
    let unknown = code(ResponseError::UnknownTopicOrPartition);
    assert_eq!(codes, vec![unknown, unknown], "unknown topic / partition");

    // Now empty: the delete is accepted (an unknown topic gets its own error).
    let d = share::delete_offsets(&mut c, &group, &[&topic, "no-such-topic"]);
    admin::assert_ok(d.error_code, "DeleteShareGroupOffsets");
    let rows: Vec<(String, i16)> = d
        .responses
        .iter()
        .map(|t| (t.topic_name.to_string(), t.error_code))
        .collect();
    assert_eq!(
        rows,
        vec![(topic.clone(), 0), ("no-such-topic".to_string(), unknown)],
        "DeleteShareGroupOffsets rows"
    );
    assert_eq!(
        described_start(&mut c, &group, &topic),
        (0, Some((0, -1))),
        "start offset after delete"
    );
    let all = share::describe_offsets(&mut c, &group, None);
    assert!(
        all.groups[0].topics.is_empty(),
        "no share state left: {:?}",
        all.groups[0].topics
    );

    // A new member starts again per share.auto.offset.reset=earliest, with fresh delivery counts.
    let (m2, acquired) = new_member_fetches(&mut c, &group, &topic, tid, "after delete");
    assert_eq!(
        acquired,
        vec![(tid, 0, 0, 9, 1)],
        "after the delete the group reads the topic from the start again"
    );

    // AlterShareGroupOffsets: refused while m2 is a member; after it leaves, start at 8.
    let altered = |r: &kafka_protocol::messages::AlterShareGroupOffsetsResponse| -> Vec<(String, i32, i16)> {
        r.responses
            .iter()
            .flat_map(|t| {
                t.partitions
                    .iter()
                    .map(move |p| (t.topic_name.to_string(), p.partition_index, p.error_code))
            })
            .collect()
    };
    let a = share::alter_offsets(&mut c, &group, &[(topic.as_str(), &[(0, 8)])]);
    admin::assert_code(
        a.error_code,
        ResponseError::NonEmptyGroup,
        "AlterShareGroupOffsets with a member",
    );
    let r = share::heartbeat(&mut c, &group, &m2, -1, None);
    admin::assert_ok(r.error_code, "m2 leaves");
    let a = share::alter_offsets(
        &mut c,
        &group,
        &[(topic.as_str(), &[(0, 8), (1, 0)]), ("no-such-topic", &[(0, 0)])],
    );
    admin::assert_ok(a.error_code, "AlterShareGroupOffsets");
    assert_eq!(
        altered(&a),
        vec![
            (topic.clone(), 0, 0),
            (topic.clone(), 1, unknown),
            ("no-such-topic".to_string(), 0, unknown)
        ],
        "AlterShareGroupOffsets rows"
    );
    let a = share::alter_offsets(&mut c, &group, &[(topic.as_str(), &[(0, -1)])]);
    assert_eq!(
        altered(&a),
        vec![(topic.clone(), 0, code(ResponseError::InvalidRequest))],
        "a negative start offset"
    );
    assert_eq!(
        described_start(&mut c, &group, &topic),
        (0, Some((0, 8))),
        "start offset after alter"
    );
    // A new member gets 8 and 9 only, with fresh delivery counts.
    let (_, acquired) = new_member_fetches(&mut c, &group, &topic, tid, "after alter");
    assert_eq!(
        acquired,
        vec![(tid, 0, 8, 9, 1)],
        "after the alter the group starts at 8"
    );
}

/// DeleteGroups (what `kafka-share-groups.sh --delete` sends) deletes an empty share group and
/// its share state: refused while a member is in it, then the group is gone from ListGroups and
/// DescribeShareGroupOffsets, and a new member reads from the start with fresh delivery counts.
#[test]
fn delete_groups_deletes_an_empty_share_group_and_its_state() {
    use kafka_protocol::messages::{DeleteGroupsRequest, GroupId, ListGroupsRequest};
    use kafka_protocol::protocol::StrBytes;
    let broker = Broker::start();
    let b = broker.bootstrap();
    let (topic, group, tid) = setup(&b, "share-delete", 1, &[]);
    clients::produce_numbered(&b, &topic, 1, 0, 10);
    let mut c = admin::connect(&b);
    let delete = |c: &mut RawConn, groups: &[&str]| -> Vec<(String, i16)> {
        let req = DeleteGroupsRequest::default().with_groups_names(
            groups
                .iter()
                .map(|g| GroupId(StrBytes::from_string(g.to_string())))
                .collect(),
        );
        let r = c.request(2, &req).unwrap_or_else(|e| panic!("DeleteGroups: {e}"));
        r.results
            .iter()
            .map(|g| (g.group_id.to_string(), g.error_code))
            .collect()
    };

    // A member acquires the 10 records and accepts 0..=5: share state exists.
    let m1 = member_accepting_six_of_ten(&mut c, &group, &topic, tid);
    assert_eq!(described_start(&mut c, &group, &topic), (0, Some((0, 6))));

    // With a member: refused.
    assert_eq!(
        delete(&mut c, &[&group]),
        vec![(group.clone(), code(ResponseError::NonEmptyGroup))],
        "DeleteGroups of a share group with a member"
    );
    let r = share::heartbeat(&mut c, &group, &m1, -1, None);
    admin::assert_ok(r.error_code, "leave");

    // Empty: deleted; an unknown group beside it gets its own error.
    assert_eq!(
        delete(&mut c, &[&group, "no-such-share-group"]),
        vec![
            (group.clone(), 0),
            (
                "no-such-share-group".to_string(),
                code(ResponseError::GroupIdNotFound)
            )
        ],
        "DeleteGroups of an empty share group"
    );
    let listed = c
        .request(
            5,
            &ListGroupsRequest::default().with_types_filter(vec![StrBytes::from_static_str("share")]),
        )
        .unwrap_or_else(|e| panic!("ListGroups: {e}"));
    assert!(
        listed.groups.iter().all(|g| g.group_id.as_str() != group),
        "a deleted share group is not listed: {:?}",
        listed.groups
    );
    let (e, _) = described_start(&mut c, &group, &topic);
    assert_eq!(
        e,
        code(ResponseError::GroupIdNotFound),
        "DescribeShareGroupOffsets of the deleted group: {}",
        admin::err_name(e)
    );
    assert_eq!(
        delete(&mut c, &[&group]),
        vec![(group.clone(), code(ResponseError::GroupIdNotFound))],
        "a second delete"
    );

    // The group's share state went with it: a new member gets all 10 again, at delivery 1
    // (with the old state, 0..=5 would stay done and 6..=9 locked by m1 until its lock timeout).
    let (_, acquired) = new_member_fetches(&mut c, &group, &topic, tid, "after DeleteGroups");
    assert_eq!(
        acquired,
        vec![(tid, 0, 0, 9, 1)],
        "after DeleteGroups the group reads the topic from the start again"
    );
}

/// Acquired ranges as `share::acquired_ranges` gives them: (topic id, partition, first, last,
/// delivery count).
type Acquired = Vec<(uuid::Uuid, i32, i64, i64, i16)>;

/// A new member joins `group` and makes one ShareFetch of `topic` partition 0, which must
/// succeed (`when` names it in the failure): the member id and the ranges it acquired.
fn new_member_fetches(
    c: &mut RawConn,
    group: &str,
    topic: &str,
    topic_id: uuid::Uuid,
    when: &str,
) -> (String, Acquired) {
    let member = uuid::Uuid::new_v4().to_string();
    join(c, group, &member, topic, topic_id);
    let none: Vec<(uuid::Uuid, i32, share::AckBatches)> = vec![(topic_id, 0, vec![])];
    let r = share::fetch(c, &share::fetch_request(group, &member, 0, &none, 10, 5000));
    admin::assert_ok(r.error_code, &format!("ShareFetch {when}"));
    (member, share::acquired_ranges(&r))
}

/// A new member of `group` acquires the 10 records of `topic` partition 0 and accepts 0..=5;
/// returns its member id (it stays in the group).
fn member_accepting_six_of_ten(c: &mut RawConn, group: &str, topic: &str, topic_id: uuid::Uuid) -> String {
    let (member, acquired) = new_member_fetches(c, group, topic, topic_id, "of the first member");
    assert_eq!(
        acquired,
        vec![(topic_id, 0, 0, 9, 1)],
        "the first member acquires all 10"
    );
    let r = share::acknowledge(
        c,
        &share::acknowledge_request(group, &member, 1, &[(topic_id, 0, vec![(0, 5, vec![1])])]),
    );
    admin::assert_ok(r.error_code, "ShareAcknowledge");
    let pe = r
        .responses
        .first()
        .and_then(|t| t.partitions.first())
        .map(|p| p.error_code);
    assert_eq!(pe, Some(0), "accepting 0..=5: {:?}", pe.map(admin::err_name));
    member
}

/// A joined member: heartbeats until its assignment names `topic_id`; returns its epoch.
fn join(c: &mut RawConn, group: &str, member: &str, topic: &str, topic_id: uuid::Uuid) -> i32 {
    let r = share::heartbeat(c, group, member, 0, Some(&[topic]));
    admin::assert_ok(r.error_code, &format!("join {member}"));
    let mut epoch = r.member_epoch;
    let mut assigned = r
        .assignment
        .as_ref()
        .is_some_and(|a| a.topic_partitions.iter().any(|t| t.topic_id == topic_id));
    let deadline = Instant::now() + Duration::from_secs(10);
    while !assigned {
        assert!(Instant::now() < deadline, "{member} got no assignment of {topic}");
        std::thread::sleep(Duration::from_millis(100));
        let r = share::heartbeat(c, group, member, epoch, Some(&[topic]));
        admin::assert_ok(r.error_code, &format!("heartbeat {member}"));
        epoch = r.member_epoch;
        assigned = r
            .assignment
            .as_ref()
            .is_some_and(|a| a.topic_partitions.iter().any(|t| t.topic_id == topic_id));
    }
    epoch
}

#[test]
fn share_protocol_errors_as_kafka_returns_them() {
    use ResponseError::{
        FencedMemberEpoch, GroupIdNotFound, InvalidRecordState, InvalidRequest, InvalidShareSessionEpoch,
        ShareSessionNotFound, UnknownMemberId,
    };
    let broker = Broker::start();
    let b = broker.bootstrap();
    let (topic, group, tid) = setup(&b, "share-errors", 1, &[]);
    clients::produce_numbered(&b, &topic, 1, 0, 10);
    let mut c = admin::connect(&b);
    let m1 = uuid::Uuid::new_v4().to_string();
    let m2 = uuid::Uuid::new_v4().to_string();
    let m3 = uuid::Uuid::new_v4().to_string();
    let e1 = join(&mut c, &group, &m1, &topic, tid);
    join(&mut c, &group, &m2, &topic, tid);
    join(&mut c, &group, &m3, &topic, tid);
    let none: Vec<(uuid::Uuid, i32, share::AckBatches)> = vec![(tid, 0, vec![])];
    let acks = |batches: share::AckBatches| vec![(tid, 0, batches)];
    // ShareFetch of up to 5 records (`parts`: partition 0, with acknowledgements or none), and
    // ShareAcknowledge of partition 0, by `member` at share session epoch `epoch`.
    let fetch = |c: &mut RawConn, member: &str, epoch: i32, parts: &[_], wait_ms: i32| {
        share::fetch(c, &share::fetch_request(&group, member, epoch, parts, 5, wait_ms))
    };
    let ack = |c: &mut RawConn, member: &str, epoch: i32, batches: share::AckBatches| {
        share::acknowledge(
            c,
            &share::acknowledge_request(&group, member, epoch, &acks(batches)),
        )
    };
    let part_err = |r: &kafka_protocol::messages::ShareAcknowledgeResponse| {
        r.responses
            .first()
            .and_then(|t| t.partitions.first())
            .map(|p| p.error_code)
    };

    // ShareGroupDescribe of an unknown group.
    let d = share::describe(&mut c, &["no-such-share-group"]);
    let g = d.groups.first().expect("a described group");
    admin::assert_code(
        g.error_code,
        GroupIdNotFound,
        "ShareGroupDescribe of an unknown group",
    );

    // ShareFetch and ShareAcknowledge of a member the group does not know.
    let r = fetch(&mut c, "nobody", 0, &none, 0);
    admin::assert_code(r.error_code, UnknownMemberId, "ShareFetch of an unknown member");
    // ShareAcknowledge never opens a session: Kafka looks the session up first, and an unknown
    // member has none.
    let r = ack(&mut c, "nobody", 1, vec![(0, 0, vec![1])]);
    admin::assert_code(
        r.error_code,
        ShareSessionNotFound,
        "ShareAcknowledge of an unknown member",
    );

    // An incremental epoch without a session.
    let r = fetch(&mut c, &m3, 1, &none, 0);
    let what = "incremental ShareFetch without a session";
    admin::assert_code(r.error_code, ShareSessionNotFound, what);
    let r = ack(&mut c, &m3, 1, vec![(0, 0, vec![1])]);
    admin::assert_code(
        r.error_code,
        ShareSessionNotFound,
        "ShareAcknowledge without a session",
    );

    // m1 opens a session and acquires 0..4; m2 acquires 5..9.
    let r = fetch(&mut c, &m1, 0, &none, 5000);
    admin::assert_ok(r.error_code, "full ShareFetch");
    assert_eq!(
        share::acquired_ranges(&r),
        vec![(tid, 0, 0, 4, 1)],
        "m1's first fetch"
    );
    let r = fetch(&mut c, &m2, 0, &none, 5000);
    assert_eq!(
        share::acquired_ranges(&r),
        vec![(tid, 0, 5, 9, 1)],
        "m2's first fetch"
    );

    // A wrong session epoch.
    let r = fetch(&mut c, &m1, 7, &none, 0);
    admin::assert_code(
        r.error_code,
        InvalidShareSessionEpoch,
        "ShareFetch with a wrong epoch",
    );
    let r = ack(&mut c, &m1, 7, vec![(0, 0, vec![1])]);
    let what = "ShareAcknowledge with a wrong epoch";
    admin::assert_code(r.error_code, InvalidShareSessionEpoch, what);

    // Acknowledging records m1 does not hold (held by m2): INVALID_RECORD_STATE on the partition.
    let mut epoch = 1;
    let r = ack(&mut c, &m1, epoch, vec![(6, 6, vec![1])]);
    admin::assert_ok(r.error_code, "ShareAcknowledge");
    let what = "acknowledging a record another member holds";
    admin::assert_code(part_err(&r).unwrap_or(-1), InvalidRecordState, what);
    epoch += 1;
    // The same in a ShareFetch (acknowledge_error_code of the partition).
    let r = fetch(&mut c, &m1, epoch, &acks(vec![(7, 7, vec![1])]), 0);
    admin::assert_ok(r.error_code, "ShareFetch with acknowledgements");
    let p = &r.responses[0].partitions[0];
    let what = "ShareFetch acknowledging a record another member holds";
    admin::assert_code(p.acknowledge_error_code, InvalidRecordState, what);
    epoch += 1;

    // Overlapping acknowledgement ranges: INVALID_REQUEST on the partition; nothing settled.
    let r = ack(&mut c, &m1, epoch, vec![(0, 2, vec![1]), (2, 4, vec![1])]);
    admin::assert_ok(r.error_code, "ShareAcknowledge");
    let what = "overlapping acknowledgement ranges";
    admin::assert_code(part_err(&r).unwrap_or(-1), InvalidRequest, what);
    epoch += 1;
    // m1 still holds 0..4: accepting them works.
    let r = ack(&mut c, &m1, epoch, vec![(0, 4, vec![1])]);
    assert_eq!(
        (r.error_code, part_err(&r)),
        (0, Some(0)),
        "accepting m1's records after the refused request"
    );

    // ShareGroupHeartbeat with a wrong member epoch.
    let r = share::heartbeat(&mut c, &group, &m1, e1 + 10, None);
    let what = "ShareGroupHeartbeat with an epoch ahead of the member's";
    admin::assert_code(r.error_code, FencedMemberEpoch, what);
}

/// A member whose partition is at its lock limit (`group.share.partition.max.record.locks`)
/// while more records are ready long-polls like any ShareFetch with nothing to acquire: it
/// must wait for a lock to come free, not retry at once in a loop that keeps its shard busy
/// until `max_wait_ms` and leaves other clients unserved.
#[test]
fn a_share_fetch_at_the_lock_limit_waits_without_starving_the_broker() {
    let broker = Broker::builder()
        .config("group.share.partition.max.record.locks", 100)
        .needs_spawned("sets the share lock limit")
        .start();
    let bootstrap = broker.bootstrap();
    let (topic, group, topic_id) = setup(&bootstrap, "locklimit", 1, &[]);
    clients::produce_numbered(&bootstrap, &topic, 1, 0, 150);
    let mut c = admin::connect(&bootstrap);
    let member = uuid::Uuid::new_v4().to_string();
    join(&mut c, &group, &member, &topic, topic_id);
    let none: Vec<(uuid::Uuid, i32, share::AckBatches)> = vec![(topic_id, 0, vec![])];
    let r = share::fetch(
        &mut c,
        &share::fetch_request(&group, &member, 0, &none, 100, 5000),
    );
    admin::assert_ok(r.error_code, "first ShareFetch");
    assert_eq!(
        share::acquired_ranges(&r),
        vec![(topic_id, 0, 0, 99, 1)],
        "the first 100, up to the limit"
    );

    let sent = Instant::now();
    c.send_request(
        share::versions::FETCH,
        &share::fetch_request(&group, &member, 1, &[(topic_id, 0, vec![])], 100, 6000),
    )
    .expect("send");
    std::thread::sleep(Duration::from_millis(200));
    let t = Instant::now();
    admin::assert_broker_serves(&bootstrap);
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "another client waited {:?} while the ShareFetch waited at the lock limit",
        t.elapsed()
    );
    let r: kafka_protocol::messages::ShareFetchResponse = c
        .read_response()
        .and_then(|r| r.decode(share::versions::FETCH))
        .expect("the second ShareFetch's answer");
    admin::assert_ok(r.error_code, "second ShareFetch");
    assert!(
        share::acquired_ranges(&r).is_empty(),
        "nothing past the limit: {:?}",
        share::acquired_ranges(&r)
    );
    assert!(
        sent.elapsed() >= Duration::from_millis(5_900),
        "answered after {:?}",
        sent.elapsed()
    );
}
