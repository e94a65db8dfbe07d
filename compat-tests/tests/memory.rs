//! Request memory stays within its documented bound under a flood of large requests: many
//! connections each send a large request at the same moment, again and again, and the broker's
//! peak resident memory (its own high-water mark, `VmHWM`) must stay below what
//! `strand.request.memory.bytes` documents: `strand.shards` x (`strand.request.memory.bytes` +
//! `strand.log.direct.cache.bytes`) + 128 MiB + 64 KiB per connection. Other clients must still
//! be served during and after the flood. A small budget keeps the flood short; the rule is the
//! same at the default sizes (`strand-flood` measures those).

use std::time::Duration;

use strand_compat_tests::admin;
use strand_compat_tests::{unique_topic, Broker};
use strand_tools::flood::{run_flood, FloodOptions, FloodReport, FloodRequest};

const MIB: u64 = 1 << 20;
const SHARDS: u64 = 2;
/// `strand.request.memory.bytes` of the test's broker, per shard.
const BUDGET: u64 = 32 * MIB;
/// `socket.request.max.bytes`: the flood's requests are just below it. Twice it (a Produce
/// counts twice) is half the budget, so two such produces fit in a shard at once.
const MAX_REQUEST: u64 = 8 * MIB;
/// `strand.log.direct.cache.bytes`.
const CACHE: u64 = 8 * MIB;
/// The fixed overhead the documentation states, and what each open connection adds.
const OVERHEAD: u64 = 128 * MIB;
const PER_CONNECTION: u64 = 64 << 10;
const CONNECTIONS: usize = 40;

fn flood_broker() -> Broker {
    Broker::builder()
        .needs_spawned("reads the broker process's resident memory")
        .config("strand.shards", SHARDS)
        .config("strand.request.memory.bytes", BUDGET)
        .config("socket.request.max.bytes", MAX_REQUEST)
        .config("strand.log.direct.cache.bytes", CACHE)
        .start()
}

fn flood(broker: &Broker, request: &FloodRequest, rounds: usize) -> FloodReport {
    let options = FloodOptions {
        kafka_addr: broker.bootstrap(),
        http_addr: None,
        pid: broker.pid().expect("a spawned broker has a pid"),
        connections: CONNECTIONS,
        rounds,
        answer_timeout: Duration::from_secs(120),
        sample_every: Duration::from_millis(5),
        settle: Duration::from_millis(200),
    };
    let report = run_flood(request, &options).expect("the flood runs");
    eprintln!("{}", report.summary());
    report
}

/// The bound `strand.request.memory.bytes` documents, for this broker, in KiB.
fn documented_bound_kib() -> u64 {
    (SHARDS * (BUDGET + CACHE) + OVERHEAD + CONNECTIONS as u64 * PER_CONNECTION) >> 10
}

fn assert_within_bound(broker: &Broker, report: &FloodReport, requests: u64) {
    assert_eq!(
        report.answered,
        requests,
        "every request of the flood is answered (a flood that did nothing proves nothing): {}",
        report.summary()
    );
    let bound = documented_bound_kib();
    assert!(
        report.hwm_kib <= bound,
        "the broker's peak resident memory {} MiB is above its documented bound {} MiB: {}",
        report.hwm_kib >> 10,
        bound >> 10,
        report.summary()
    );
    assert_eq!(
        report.bystander_failed,
        0,
        "a bystander's metadata requests failed during the flood: {}",
        report.summary()
    );
    assert!(
        report.bystander_answered > 0,
        "no bystander request was answered: {}",
        report.summary()
    );
    admin::assert_broker_serves(&broker.bootstrap());
}

/// 40 connections each send a Produce of just under socket.request.max.bytes (one batch to
/// each of 8 partitions), three times: their frames, the copies staged for writing and the
/// recent writes kept in memory all stay within the bound.
#[test]
fn a_flood_of_large_produce_requests_stays_within_the_request_memory_bound() {
    let broker = flood_broker();
    let topic = unique_topic("flood");
    admin::create_topic(&broker.bootstrap(), &topic, 8, &[]);
    let request =
        FloodRequest::produce(&topic, 8, (MAX_REQUEST - 64 * 1024) as usize).expect("a produce request");
    let rounds = 3;
    let report = flood(&broker, &request, rounds);
    assert_within_bound(&broker, &report, (CONNECTIONS * rounds) as u64);
}

/// The same with requests whose body is not records: a Produce header followed by noise, which
/// the broker reads whole and answers (with no partitions).
#[test]
fn a_flood_of_large_frames_of_noise_stays_within_the_request_memory_bound() {
    let broker = flood_broker();
    let request = FloodRequest::garbage_produce((MAX_REQUEST - 64 * 1024) as usize).expect("a noise frame");
    let rounds = 3;
    let report = flood(&broker, &request, rounds);
    assert_within_bound(&broker, &report, (CONNECTIONS * rounds) as u64);
}
