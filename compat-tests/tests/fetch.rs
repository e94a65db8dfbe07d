//! Fetch answers over partitions on several shards: the whole answer stays within `max_bytes`
//! (KIP-74), is filled when the data is there, even when it all sits on one shard, and its
//! records are whole, valid batches from each fetch offset. Large records are written from the
//! log read's buffers as their own segments of the response, so these also check that the
//! segments reach the client whole and in order, in a flexible and a non-flexible version.
//! A connection has one fetch at a time: one pipelined behind a long poll starts after its answer.
//! A fetch that cannot gather `min_bytes` waits for new data without keeping its shard busy.
//! An incremental fetch session serves its partitions in turn (those that answered go last).
//! A Fetch naming several topics' partitions in turn answers each with its own records, and
//! its long poll wakes for any of them.

use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{BrokerId, FetchRequest, FetchResponse};
use kafka_protocol::records::{Compression, RecordBatchDecoder};
use strand_compat_tests::admin::{self, versions};
use strand_compat_tests::raw::{self, RawConn};
use strand_compat_tests::{metric_sum, unique_topic, Broker};

/// Partitions of the topic; with two shards, even ones are on one shard and odd ones on the other.
const PARTITIONS: i32 = 8;
const BATCHES_PER_PARTITION: usize = 20;
const RECORDS_PER_BATCH: usize = 10;
const VALUE_BYTES: usize = 1024;
const PARTITION_MAX_BYTES: i32 = 64 * 1024;
const MAX_BYTES: i32 = 256 * 1024;

/// A two-shard broker and a topic whose partitions all hold ~200 KB in ~10 KiB batches.
fn setup(name: &str) -> (Broker, String, String) {
    let broker = Broker::builder()
        .needs_spawned("reads strand_kafka_bytes_out_total from /metrics")
        .config("strand.shards", 2)
        .start();
    let bootstrap = broker.bootstrap();
    let topic = unique_topic(name);
    admin::create_topic(&bootstrap, &topic, PARTITIONS, &[]);
    let mut c = admin::connect(&bootstrap);
    for p in 0..PARTITIONS {
        for _ in 0..BATCHES_PER_PARTITION {
            produce_batch(&mut c, &topic, p, RECORDS_PER_BATCH, VALUE_BYTES);
        }
    }
    (broker, bootstrap, topic)
}

/// Produces one uncompressed batch of `records` records of `value_bytes` each to partition `p`.
fn produce_batch(c: &mut RawConn, topic: &str, p: i32, records: usize, value_bytes: usize) {
    let value = vec![b'v'; value_bytes];
    let batch: Vec<_> = (0..records)
        .map(|_| raw::record(None, Some(&value), admin::now_ms()))
        .collect();
    let req = admin::produce_request(topic, -1, vec![(p, raw::encode_batch(&batch, Compression::None))]);
    let resp = c.request(versions::PRODUCE, &req).expect("produce");
    assert_eq!(admin::produce_answer(&resp, p).error_code, 0, "produce to {p}");
}

fn fetch(c: &mut RawConn, version: i16, topic: &str, offsets: &[(i32, i64)]) -> FetchResponse {
    c.request(version, &fetch_request(topic, offsets, 0))
        .unwrap_or_else(|e| panic!("Fetch v{version}: {e}"))
}

/// A sessionless Fetch of `offsets`, waiting up to `max_wait_ms` for one byte.
fn fetch_request(topic: &str, offsets: &[(i32, i64)], max_wait_ms: i32) -> FetchRequest {
    FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(max_wait_ms)
        .with_min_bytes(1)
        .with_max_bytes(MAX_BYTES)
        .with_session_id(0)
        .with_session_epoch(-1)
        .with_topics(vec![FetchTopic::default()
            .with_topic(admin::topic_name(topic))
            .with_partitions(
                offsets
                    .iter()
                    .map(|&(p, offset)| {
                        FetchPartition::default()
                            .with_partition(p)
                            .with_current_leader_epoch(-1)
                            .with_fetch_offset(offset)
                            .with_last_fetched_epoch(-1)
                            .with_log_start_offset(-1)
                            .with_partition_max_bytes(PARTITION_MAX_BYTES)
                    })
                    .collect(),
            )])
}

/// Checks every partition's records (whole valid batches, from its fetch offset, within its
/// `max_bytes`) and returns the answer's record bytes.
fn answered_bytes(resp: &FetchResponse, offsets: &[(i32, i64)], what: &str) -> usize {
    assert_eq!(resp.error_code, 0, "{what}: top-level error");
    let mut total = 0;
    for p in resp.responses.iter().flat_map(|t| t.partitions.iter()) {
        assert_eq!(p.error_code, 0, "{what}: partition {} error", p.partition_index);
        let Some(records) = p.records.as_ref().filter(|r| !r.is_empty()) else {
            continue;
        };
        let (batches, covered) = raw::walk_batches(records);
        assert_eq!(
            covered as usize,
            records.len(),
            "{what}: partition {} holds a partial or invalid batch",
            p.partition_index
        );
        let from = offsets
            .iter()
            .find(|(q, _)| *q == p.partition_index)
            .map(|(_, o)| *o)
            .expect("an asked partition");
        assert_eq!(
            batches.first().map(|b| b.base_offset),
            Some(from),
            "{what}: partition {} must start at its fetch offset",
            p.partition_index
        );
        assert!(
            records.len() <= PARTITION_MAX_BYTES as usize,
            "{what}: partition {} over its max_bytes",
            p.partition_index
        );
        total += records.len();
    }
    total
}

fn bytes_out(broker: &Broker) -> f64 {
    metric_sum(&broker.metrics(), "strand_kafka_bytes_out_total")
}

#[test]
fn a_fetch_over_two_shards_fills_max_bytes_and_never_exceeds_it() {
    let (broker, bootstrap, topic) = setup("fetch-two-shards");
    let mut c = admin::connect(&bootstrap);
    let all: Vec<(i32, i64)> = (0..PARTITIONS).map(|p| (p, 0)).collect();
    let end = (BATCHES_PER_PARTITION * RECORDS_PER_BATCH) as i64;
    // Even partitions (one shard) at their end: only the other shard has data to give.
    let one_sided: Vec<(i32, i64)> = (0..PARTITIONS)
        .map(|p| (p, if p % 2 == 0 { end } else { 0 }))
        .collect();
    // Room for all but the part of one partition that did not fit in whole batches.
    let filled = (MAX_BYTES - PARTITION_MAX_BYTES) as usize;
    for (version, offsets, what) in [
        (versions::FETCH, &all, "both shards, flexible version"),
        (11, &all, "both shards, non-flexible version"),
        (versions::FETCH, &one_sided, "data on one shard only"),
    ] {
        let before = bytes_out(&broker);
        let resp = fetch(&mut c, version, &topic, offsets);
        let total = answered_bytes(&resp, offsets, what);
        assert!(
            total <= MAX_BYTES as usize,
            "{what}: {total} bytes answered, over max_bytes"
        );
        assert!(
            total >= filled,
            "{what}: only {total} bytes answered although every asked partition with data had more"
        );
        assert_eq!(
            bytes_out(&broker) - before,
            total as f64,
            "{what}: strand_kafka_bytes_out_total must count the bytes answered"
        );
    }
}

/// Fetch requests counted by the broker so far.
fn fetches_started(broker: &Broker) -> f64 {
    broker
        .metrics()
        .lines()
        .filter(|l| l.starts_with("strand_kafka_requests_total{api=\"Fetch\""))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// A connection has one fetch at a time, as with Kafka (which reads nothing more from a
/// connection until its answer is sent): a fetch pipelined behind a long poll starts only once
/// the long poll's answer is written. So the answers a shard holds, each up to
/// `fetch.max.bytes`, stay at one per connection however many fetches a client sends without
/// reading.
#[test]
fn a_fetch_pipelined_behind_a_long_poll_starts_after_its_answer() {
    let (broker, bootstrap, topic) = setup("fetch-pipelined");
    let mut c = admin::connect(&bootstrap);
    let end = (BATCHES_PER_PARTITION * RECORDS_PER_BATCH) as i64;
    let at_end: Vec<(i32, i64)> = (0..PARTITIONS).map(|p| (p, end)).collect();
    let from_start: Vec<(i32, i64)> = (0..PARTITIONS).map(|p| (p, 0)).collect();
    let before = fetches_started(&broker);
    let long_poll = c
        .send_request(versions::FETCH, &fetch_request(&topic, &at_end, 2_000))
        .expect("send the long poll");
    let sent = std::time::Instant::now();
    let second = c
        .send_request(versions::FETCH, &fetch_request(&topic, &from_start, 0))
        .expect("send the second fetch");
    std::thread::sleep(std::time::Duration::from_millis(800));
    let during = fetches_started(&broker) - before;
    assert_eq!(
        during, 1.0,
        "{during} fetches started while the long poll waited: the second must wait for its answer"
    );

    let first = c.read_response().expect("the long poll's answer");
    let waited = sent.elapsed();
    assert_eq!(first.correlation_id, long_poll);
    let first: FetchResponse = first.decode(versions::FETCH).expect("decode");
    assert_eq!(answered_bytes(&first, &at_end, "long poll"), 0);
    assert!(
        waited >= std::time::Duration::from_millis(1_500),
        "the long poll answered after {waited:?}, before its max_wait"
    );
    let next = c.read_response().expect("the second fetch's answer");
    assert_eq!(next.correlation_id, second);
    let next: FetchResponse = next.decode(versions::FETCH).expect("decode");
    assert!(answered_bytes(&next, &from_start, "second fetch") > 0);
    assert_eq!(fetches_started(&broker) - before, 2.0);
}

/// A fetch whose `max_bytes` (0 here) is below its `min_bytes` can never gather `min_bytes` from
/// the data that is there: like any long poll it must wait for new data or `max_wait_ms`. It used
/// to wake at once for the data it had just read, read it again, and loop until `max_wait_ms`,
/// keeping its shard so busy that other clients went unserved (found by
/// `bad_input::random_requests_of_every_api_never_take_the_broker_down`). At `max_wait_ms` it
/// answers with what there is: the first batch, as KIP-74 requires.
#[test]
fn a_fetch_that_cannot_reach_min_bytes_waits_without_starving_the_broker() {
    let broker = Broker::start();
    let bootstrap = broker.bootstrap();
    let topic = admin::new_topic(&bootstrap, "minbytes", 1);
    let mut c = admin::connect(&bootstrap);
    admin::produce_values(&mut c, &topic, 0, &[b"a", b"b", b"c"]);
    let mut req = admin::fetch_request(&topic, 0, 0, 1 << 20);
    req.max_wait_ms = 6_000;
    req.min_bytes = 1 << 20;
    req.max_bytes = 0;
    let mut f = RawConn::connect(&bootstrap).expect("connect");
    let sent = std::time::Instant::now();
    f.send_request(versions::FETCH, &req).expect("send");
    std::thread::sleep(std::time::Duration::from_millis(200));
    let t = std::time::Instant::now();
    admin::assert_broker_serves(&bootstrap);
    assert!(
        t.elapsed() < std::time::Duration::from_secs(3),
        "another client waited {:?} while the fetch waited for min_bytes",
        t.elapsed()
    );
    let resp: FetchResponse = f
        .read_response()
        .and_then(|r| r.decode(versions::FETCH))
        .expect("the fetch's answer");
    assert!(
        sent.elapsed() >= std::time::Duration::from_millis(5_900),
        "answered after {:?}, before max_wait_ms",
        sent.elapsed()
    );
    let part = &resp.responses[0].partitions[0];
    assert_eq!(part.error_code, 0);
    let records = part.records.as_ref().map_or(0, |r| r.len());
    assert!(
        records > 0,
        "the first batch must be answered even over max_bytes (KIP-74)"
    );
}

/// Only the first partition with data may answer a batch larger than what is left of
/// `max_bytes` (KIP-74). A later partition whose first batch does not fit in what is left
/// answers no records, as with Kafka, so the answer stays within `max_bytes`. (The reads of a
/// Fetch run together, each with its share of `max_bytes` reserved in the request's order, so a
/// read may return more than its share; the answer is bounded after the reads.)
#[test]
fn a_later_partition_whose_first_batch_does_not_fit_answers_nothing() {
    let broker = Broker::builder().config("strand.shards", 1).start();
    let bootstrap = broker.bootstrap();
    let topic = admin::new_topic(&bootstrap, "fetch-later-oversized", 2);
    let mut c = admin::connect(&bootstrap);
    // Partition 0: ten batches of ~10 KiB; partition 1: one ~48 KiB batch.
    for _ in 0..10 {
        produce_batch(&mut c, &topic, 0, RECORDS_PER_BATCH, VALUE_BYTES);
    }
    produce_batch(&mut c, &topic, 1, 1, 48 * 1024);
    let offsets = [(0, 0), (1, 0)];
    // 64 KiB per partition and 80 KiB in all: partition 0 takes ~62 KiB, which leaves less
    // than partition 1's batch.
    let mut req = fetch_request(&topic, &offsets, 0);
    req.max_bytes = 80 * 1024;
    let resp: FetchResponse = c.request(versions::FETCH, &req).expect("fetch");
    let total = answered_bytes(&resp, &offsets, "later oversized partition");
    let records = |p: i32| {
        resp.responses
            .iter()
            .flat_map(|t| t.partitions.iter())
            .find(|q| q.partition_index == p)
            .and_then(|q| q.records.as_ref())
            .map_or(0, |r| r.len())
    };
    assert!(
        records(0) > 50 * 1024,
        "partition 0 answered {} bytes",
        records(0)
    );
    assert_eq!(
        records(1),
        0,
        "partition 1's batch does not fit in what partition 0 left"
    );
    assert!(total <= 80 * 1024, "{total} bytes answered, over max_bytes");

    // Alone, partition 1's batch is the first with data: answered whole over max_bytes.
    let mut req = fetch_request(&topic, &[(1, 0)], 0);
    req.max_bytes = 16 * 1024;
    let resp: FetchResponse = c.request(versions::FETCH, &req).expect("fetch");
    let part = &resp.responses[0].partitions[0];
    assert_eq!(part.error_code, 0);
    assert!(
        part.records.as_ref().map_or(0, |r| r.len()) > 48 * 1024,
        "the first partition's batch must be answered whole (KIP-74)"
    );
}

/// In an incremental fetch session (KIP-227) the broker reads the session's partitions in its
/// own order until `max_bytes` is used up. As in Kafka, partitions that answered records move
/// to the back, so a session whose first partitions hold more than one answer's worth still
/// gets the others' data in the next fetch instead of waiting until the first are drained.
#[test]
fn an_incremental_fetch_session_serves_the_partitions_in_turn() {
    let (_broker, bootstrap, topic) = setup("fetch-session-turns");
    let mut c = admin::connect(&bootstrap);
    let mut offsets: Vec<(i32, i64)> = (0..PARTITIONS).map(|p| (p, 0)).collect();
    // Each partition holds ~200 KB; an answer carries at most four partitions' 64 KiB.
    let served = |resp: &FetchResponse| -> Vec<(i32, i64)> {
        assert_eq!(resp.error_code, 0, "top-level error");
        let mut out: Vec<(i32, i64)> = resp
            .responses
            .iter()
            .flat_map(|t| t.partitions.iter())
            .filter_map(|p| {
                let records = p.records.as_ref().filter(|r| !r.is_empty())?;
                let (batches, _) = raw::walk_batches(records);
                Some((p.partition_index, batches.last()?.last_offset + 1))
            })
            .collect();
        out.sort();
        out
    };
    let mut req = fetch_request(&topic, &offsets, 0);
    req.session_epoch = 0;
    let resp: FetchResponse = c.request(versions::FETCH, &req).expect("full fetch");
    let session_id = resp.session_id;
    assert!(session_id > 0, "the broker opened no session");
    let mut seen = std::collections::BTreeSet::new();
    let mut rounds = Vec::new();
    let mut got = served(&resp);
    for epoch in 1..=3 {
        assert!(!got.is_empty(), "fetch {epoch} answered no records");
        rounds.push(got.iter().map(|(p, _)| *p).collect::<Vec<_>>());
        seen.extend(got.iter().map(|(p, _)| *p));
        for (p, next) in &got {
            if let Some(o) = offsets.iter_mut().find(|(q, _)| q == p) {
                o.1 = *next;
            }
        }
        // Only the partitions whose fetch offset moved are sent again.
        let mut req = fetch_request(&topic, &got, 0);
        req.session_id = session_id;
        req.session_epoch = epoch;
        let resp: FetchResponse = c
            .request(versions::FETCH, &req)
            .unwrap_or_else(|e| panic!("incremental fetch {epoch}: {e}"));
        assert_eq!(resp.session_id, session_id);
        got = served(&resp);
    }
    assert_eq!(
        seen.len(),
        PARTITIONS as usize,
        "every partition answered within three fetches, answers: {rounds:?}"
    );
}

/// A Fetch whose topics come in turn (a, b, then a and b again), as a client may list them:
/// the broker names each topic once per run in what it sends its shards, so this checks that
/// every partition is answered under its own topic, in the request's order, with its own
/// records, and that a long poll over all of them ends when a partition in a topic's second
/// run gets data.
#[test]
fn a_fetch_naming_topics_in_turn_answers_each_partition_with_its_own_records() {
    let broker = Broker::start();
    let bootstrap = broker.bootstrap();
    let a = admin::new_topic(&bootstrap, "fetch-turn-a", 4);
    let b = unique_topic("fetch-turn-b");
    admin::create_topic(&bootstrap, &b, 4, &[]);
    let mut c = admin::connect(&bootstrap);
    // Partition p of topic a holds p + 1 records, of b p + 11; each value names its partition.
    let count = |t: &str, p: i32| (p + 1 + if t == b.as_str() { 10 } else { 0 }) as usize;
    let produce = |c: &mut RawConn, t: &str, p: i32, values: &[Vec<u8>]| {
        let batch: Vec<_> = values
            .iter()
            .map(|v| raw::record(None, Some(v), admin::now_ms()))
            .collect();
        let req = admin::produce_request(t, -1, vec![(p, raw::encode_batch(&batch, Compression::None))]);
        let resp = c.request(versions::PRODUCE, &req).expect("produce");
        assert_eq!(
            admin::produce_answer(&resp, p).error_code,
            0,
            "produce to {t}/{p}"
        );
    };
    for t in [&a, &b] {
        for p in 0..4 {
            let values = vec![format!("{t}/{p}").into_bytes(); count(t, p)];
            produce(&mut c, t, p, &values);
        }
    }
    let runs: [(&str, &[i32]); 4] = [(&a, &[0, 1]), (&b, &[0, 1, 2]), (&a, &[2, 3]), (&b, &[3])];
    let request = |offset: &dyn Fn(&str, i32) -> i64, max_wait_ms: i32| {
        FetchRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_max_wait_ms(max_wait_ms)
            .with_min_bytes(1)
            .with_max_bytes(1 << 20)
            .with_session_id(0)
            .with_session_epoch(-1)
            .with_topics(
                runs.iter()
                    .map(|(t, parts)| {
                        FetchTopic::default()
                            .with_topic(admin::topic_name(t))
                            .with_partitions(
                                parts
                                    .iter()
                                    .map(|&p| {
                                        FetchPartition::default()
                                            .with_partition(p)
                                            .with_current_leader_epoch(-1)
                                            .with_fetch_offset(offset(t, p))
                                            .with_last_fetched_epoch(-1)
                                            .with_log_start_offset(-1)
                                            .with_partition_max_bytes(PARTITION_MAX_BYTES)
                                    })
                                    .collect(),
                            )
                    })
                    .collect(),
            )
    };
    // Each answered partition's values, in the answer's order, under its topic.
    let answered = |resp: &FetchResponse| -> Vec<(String, i32, Vec<Vec<u8>>)> {
        assert_eq!(resp.error_code, 0, "top-level error");
        let mut out = Vec::new();
        for t in &resp.responses {
            for p in &t.partitions {
                let name = t.topic.0.to_string();
                assert_eq!(p.error_code, 0, "{name}/{}: error", p.partition_index);
                let mut bytes = p.records.clone().unwrap_or_default();
                let (_, complete) = raw::walk_batches(&bytes);
                assert_eq!(
                    complete as usize,
                    bytes.len(),
                    "{name}/{}: not whole batches",
                    p.partition_index
                );
                let mut values = Vec::new();
                if !bytes.is_empty() {
                    for set in RecordBatchDecoder::decode_all(&mut bytes).expect("decode") {
                        values.extend(
                            set.records
                                .into_iter()
                                .map(|r| r.value.unwrap_or_default().to_vec()),
                        );
                    }
                }
                out.push((name, p.partition_index, values));
            }
        }
        out
    };
    let resp = c
        .request(versions::FETCH, &request(&|_, _| 0, 0))
        .expect("Fetch from the start");
    let expected: Vec<(String, i32, Vec<Vec<u8>>)> = runs
        .iter()
        .flat_map(|(t, parts)| {
            parts.iter().map(move |&p| {
                (
                    t.to_string(),
                    p,
                    vec![format!("{t}/{p}").into_bytes(); count(t, p)],
                )
            })
        })
        .collect();
    assert_eq!(
        answered(&resp),
        expected,
        "every partition under its topic, in order, with its records"
    );

    // Everything at its end; a record arrives in a/3 (the third run) while the Fetch waits.
    let end = |t: &str, p: i32| count(t, p) as i64;
    let late = std::thread::spawn({
        let bootstrap = bootstrap.clone();
        let a = a.clone();
        move || {
            std::thread::sleep(std::time::Duration::from_millis(300));
            let mut c = admin::connect(&bootstrap);
            produce(&mut c, &a, 3, &[b"late".to_vec()]);
        }
    });
    let started = std::time::Instant::now();
    let resp = c
        .request(versions::FETCH, &request(&end, 10_000))
        .expect("long poll");
    let waited = started.elapsed();
    late.join().expect("late producer");
    assert!(
        waited < std::time::Duration::from_secs(5),
        "the long poll ended after {waited:?}, not when a/3 got its record"
    );
    let with_data: Vec<_> = answered(&resp)
        .into_iter()
        .filter(|(_, _, v)| !v.is_empty())
        .collect();
    assert_eq!(with_data, vec![(a.clone(), 3, vec![b"late".to_vec()])]);
}
