//! Connections moving between shards: a connection whose last eight produce (or sessionless
//! fetch) requests all went to another shard's partitions is handed to that shard. The client
//! must not notice: every pipelined request is answered once, in order, with the right offsets,
//! and nothing is lost or reordered.
//! A fetch session moves with its connection. Connections that hold other per-shard state
//! (share sessions, groups) or produce with acks=0 must stay.
//!
//! Also how a connection reads: frames that arrive in pieces of any size are read whole and in
//! order.

use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::messages::fetch_request::ForgottenTopic;
use kafka_protocol::messages::{FetchResponse, ProduceRequest, ProduceResponse};
use kafka_protocol::protocol::{HeaderVersion, Request};
use kafka_protocol::records::{Compression, RecordBatchDecoder};
use strand_compat_tests::admin::{self, versions};
use strand_compat_tests::data::Gen;
use strand_compat_tests::raw::{self, RawConn};
use strand_compat_tests::{metric_sum, unique_topic, Broker};

/// Requests in a row before a move (the broker's fixed rule).
const MOVE_AFTER: usize = 8;
/// Requests per phase, written at once before any answer is read, so that a move happens with
/// requests already sent (in the socket, or read and not yet served).
const PIPELINED: usize = 12;
const RECORDS_PER_REQUEST: usize = 3;

/// A broker with two shards and a fresh two-partition topic (its partitions on both shards:
/// partitions go round-robin over shards): (broker, bootstrap, topic, moves so far).
fn setup(name: &str) -> (Broker, String, String, u64) {
    let broker = Broker::builder()
        .needs_spawned("reads the connection-migration counter from /metrics")
        .config("strand.shards", 2)
        .start();
    let b = broker.bootstrap();
    let topic = unique_topic(name);
    admin::create_topic(&b, &topic, 2, &[]);
    let before = migrations(&broker);
    (broker, b, topic, before)
}

/// The sum over shards of `strand_connection_migrations_total`.
fn migrations(broker: &Broker) -> u64 {
    metric_sum(&broker.metrics(), "strand_connection_migrations_total") as u64
}

/// Moves counted since `before`, once there are at least `want` (or after 5 s). The shard a
/// connection left counts the move when the other shard's acceptance reaches it, which can be
/// after the client already had its answers from the new shard.
fn moves_since(broker: &Broker, before: u64, want: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let moved = migrations(broker) - before;
        if moved >= want || Instant::now() >= deadline {
            return moved;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn value(partition: i32, request: usize, record: usize) -> String {
    format!("p{partition}-r{request}-{record}")
}

fn batch(partition: i32, request: usize) -> Bytes {
    let values: Vec<String> = (0..RECORDS_PER_REQUEST)
        .map(|r| value(partition, request, r))
        .collect();
    let records: Vec<_> = values
        .iter()
        .map(|v| raw::record(None, Some(v.as_bytes()), admin::now_ms()))
        .collect();
    raw::encode_batch(&records, Compression::None)
}

/// Writes `PIPELINED` produce requests (acks=-1) to `partition` before reading any answer, then
/// checks the answers: in order, no error, offsets following `next_offset`.
fn pipelined_phase(
    c: &mut RawConn,
    topic: &str,
    partition: i32,
    first_request: usize,
    next_offset: &mut i64,
) {
    let mut sent = Vec::new();
    for i in 0..PIPELINED {
        let req: ProduceRequest =
            admin::produce_request(topic, -1, vec![(partition, batch(partition, first_request + i))]);
        let corr = c
            .send_request(versions::PRODUCE, &req)
            .unwrap_or_else(|e| panic!("send produce {i} to partition {partition}: {e}"));
        sent.push(corr);
    }
    for (i, corr) in sent.into_iter().enumerate() {
        let resp = c
            .read_response()
            .unwrap_or_else(|e| panic!("answer {i} of the phase on partition {partition}: {e}"));
        assert_eq!(
            resp.correlation_id, corr,
            "answer {i} on partition {partition} out of order"
        );
        let resp: ProduceResponse = resp
            .decode(versions::PRODUCE)
            .unwrap_or_else(|e| panic!("decode answer {i}: {e}"));
        let p = admin::produce_answer(&resp, partition);
        assert_eq!(
            p.error_code, 0,
            "request {i} on partition {partition} failed: {p:?}"
        );
        assert_eq!(
            p.base_offset, *next_offset,
            "request {i} on partition {partition}: offsets must follow one another"
        );
        *next_offset += RECORDS_PER_REQUEST as i64;
    }
}

/// Writes `n` records to each of the two partitions, one per batch: record `i` of partition
/// `p` is `value(p, i, 0)`, at offset `i`.
fn write_records(bootstrap: &str, topic: &str, n: usize) {
    let mut p = admin::connect(bootstrap);
    for partition in 0..2 {
        for i in 0..n {
            let base = admin::produce_values(&mut p, topic, partition, &[value(partition, i, 0).as_bytes()]);
            assert_eq!(base, i as i64);
        }
    }
}

/// Everything in `partition`, in order, as the values written.
fn read_values(bootstrap: &str, topic: &str, partition: i32, want: usize) -> Vec<String> {
    let mut c = admin::connect(bootstrap);
    let mut out = Vec::new();
    let mut offset = 0;
    for _ in 0..100 {
        if out.len() >= want {
            break;
        }
        let got = admin::fetch(&mut c, topic, partition, offset, 1 << 20);
        assert_eq!(got.error_code, 0, "fetch {topic}/{partition} at {offset}");
        for (o, _, v, _) in got.records {
            assert_eq!(o, offset, "offsets of {topic}/{partition} must be dense");
            out.push(String::from_utf8_lossy(&v.unwrap_or_default()).into_owned());
            offset = o + 1;
        }
    }
    out
}

#[test]
fn a_producing_connection_follows_its_partitions_shard_and_loses_nothing() {
    let (broker, b, topic, before) = setup("conn-move");

    let mut c = admin::connect(&b);
    admin::api_versions(&mut c);
    admin::metadata(&mut c, &[&topic], false);
    let mut next = [0i64; 2];
    let phases = [0, 1, 0, 1];
    for (n, partition) in phases.iter().enumerate() {
        let slot = &mut next[*partition as usize];
        pipelined_phase(&mut c, &topic, *partition, n * PIPELINED, slot);
    }
    // The connection starts on either shard; each phase after the first needs the other shard.
    let moved = moves_since(&broker, before, phases.len() as u64 - 1);
    assert!(
        moved >= phases.len() as u64 - 1,
        "the connection moved {moved} times for {} phases alternating between two shards",
        phases.len()
    );
    // Still served after its moves.
    admin::metadata(&mut c, &[&topic], false);

    for partition in 0..2 {
        let want: Vec<String> = phases
            .iter()
            .enumerate()
            .filter(|(_, p)| **p == partition)
            .flat_map(|(n, _)| {
                (0..PIPELINED).flat_map(move |i| {
                    (0..RECORDS_PER_REQUEST).map(move |r| value(partition, n * PIPELINED + i, r))
                })
            })
            .collect();
        let got = read_values(&b, &topic, partition, want.len());
        assert_eq!(
            got, want,
            "partition {partition} must hold every record once, in order"
        );
    }
}

#[test]
fn a_consuming_connection_follows_its_partitions_shard() {
    let (broker, b, topic, _) = setup("conn-fetch");
    // Two phases of `MOVE_AFTER + 1` fetches per partition.
    write_records(&b, &topic, 2 * (MOVE_AFTER + 1));
    let before = migrations(&broker);
    // Sessionless fetches (what librdkafka sends), one record at a time, alternating partitions
    // phase by phase: every answer must hold the next record.
    let mut c = admin::connect(&b);
    let phases = [0, 1, 0, 1];
    let mut next = [0i64; 2];
    for partition in phases {
        for _ in 0..MOVE_AFTER + 1 {
            let offset = next[partition as usize];
            let got = admin::fetch(&mut c, &topic, partition, offset, 1 << 20);
            assert_eq!(got.error_code, 0);
            let (o, _, v, _) = got
                .records
                .first()
                .cloned()
                .unwrap_or_else(|| panic!("no record at {topic}/{partition}@{offset}"));
            assert_eq!(o, offset);
            assert_eq!(
                v.as_deref(),
                Some(value(partition, offset as usize, 0).as_bytes()),
                "record {partition}@{offset}"
            );
            next[partition as usize] += 1;
        }
    }
    let moved = moves_since(&broker, before, phases.len() as u64 - 1);
    assert!(
        moved >= phases.len() as u64 - 1,
        "the consuming connection moved {moved} times for {} phases alternating between two shards",
        phases.len()
    );
}

#[test]
fn acks_0_connections_stay() {
    let (broker, b, topic, before) = setup("conn-stay");

    // An acks=0 producer: no answers, so nothing would tell when its appends had reached the
    // partition's shard before a move.
    let mut z = admin::connect(&b);
    for partition in [0, 1] {
        for i in 0..PIPELINED {
            let req = admin::produce_request(&topic, 0, vec![(partition, batch(partition, 100 + i))]);
            z.send_request(versions::PRODUCE, &req)
                .unwrap_or_else(|e| panic!("send acks=0 produce: {e}"));
        }
    }
    // It still serves (and answers other requests).
    admin::metadata(&mut z, &[&topic], false);
    let total: usize = (0..2)
        .map(|p| read_values(&b, &topic, p, PIPELINED * RECORDS_PER_REQUEST).len())
        .sum();
    assert_eq!(
        total,
        2 * PIPELINED * RECORDS_PER_REQUEST,
        "every record was appended"
    );
    assert_eq!(
        migrations(&broker) - before,
        0,
        "a connection that produced with acks=0 must stay on its shard"
    );
}

/// One fetch of a session (KIP-227): `partition` from `offset`, forgetting `forget`; the
/// answer must come from session `session` (or open one, at epoch 0) with the record written
/// at that offset. Returns the session id.
fn session_fetch(
    c: &mut RawConn,
    topic: &str,
    session: i32,
    epoch: i32,
    partition: i32,
    offset: i64,
    forget: Option<i32>,
) -> i32 {
    // One batch (one record) per answer: the first partition's first batch always comes whole.
    let req = admin::fetch_request(topic, partition, offset, 1)
        .with_session_id(session)
        .with_session_epoch(epoch)
        .with_forgotten_topics_data(
            forget
                .map(|p| {
                    vec![ForgottenTopic::default()
                        .with_topic(admin::topic_name(topic))
                        .with_partitions(vec![p])]
                })
                .unwrap_or_default(),
        );
    let resp: FetchResponse = c
        .request(versions::FETCH, &req)
        .unwrap_or_else(|e| panic!("session fetch, epoch {epoch}: {e}"));
    assert_eq!(
        resp.error_code, 0,
        "session {session} epoch {epoch}: error {} (70 = FETCH_SESSION_ID_NOT_FOUND)",
        resp.error_code
    );
    if epoch > 0 {
        assert_eq!(resp.session_id, session, "the session must continue");
    } else {
        assert_ne!(resp.session_id, 0, "epoch 0 must open a session");
    }
    let p = resp
        .responses
        .iter()
        .flat_map(|t| t.partitions.iter())
        .find(|p| p.partition_index == partition)
        .unwrap_or_else(|| panic!("epoch {epoch}: no answer for partition {partition}"));
    assert_eq!(p.error_code, 0);
    let mut bytes = p.records.clone().unwrap_or_default();
    let sets = RecordBatchDecoder::decode_all(&mut bytes).expect("fetched batches decode");
    let first = sets
        .iter()
        .flat_map(|s| s.records.iter())
        .find(|r| r.offset >= offset)
        .unwrap_or_else(|| panic!("epoch {epoch}: no record at {partition}@{offset}"));
    assert_eq!(first.offset, offset, "epoch {epoch}: partition {partition}");
    assert_eq!(
        first.value.as_deref(),
        Some(value(partition, offset as usize, 0).as_bytes()),
        "epoch {epoch}: record {partition}@{offset}"
    );
    resp.session_id
}

/// Java clients and kafka-python fetch through sessions. A session lives in its shard's cache,
/// so it moves with its connection: incremental fetches go on, with the same id and epochs,
/// and no FETCH_SESSION_ID_NOT_FOUND.
#[test]
fn a_fetch_session_moves_with_its_connection() {
    let (broker, b, topic, _) = setup("conn-session");
    write_records(&b, &topic, 3 * PIPELINED);
    let before = migrations(&broker);
    let mut c = admin::connect(&b);
    let phases = [0, 1, 0, 1];
    let mut next = [0i64; 2];
    let mut session = 0;
    let mut epoch = 0;
    let mut previous: Option<i32> = None;
    for partition in phases {
        for n in 0..MOVE_AFTER + 1 {
            let offset = next[partition as usize];
            // The first fetch of a phase swaps the session's partition.
            let forget = if n == 0 { previous } else { None };
            session = session_fetch(&mut c, &topic, session, epoch, partition, offset, forget);
            epoch += 1;
            next[partition as usize] += 1;
        }
        previous = Some(partition);
    }
    let moved = moves_since(&broker, before, phases.len() as u64 - 1);
    assert!(
        moved >= phases.len() as u64 - 1,
        "the connection moved {moved} times for {} phases alternating between two shards",
        phases.len()
    );
}

/// Requests whose frames reach the broker in pieces of every size: a piece may end inside a
/// length prefix, inside a header, inside a batch, or hold the end of one frame and the start
/// of the next; frames range from a few dozen bytes to nearly `message.max.bytes` (larger than
/// the broker's 64 KiB read chunk, so its large-frame path runs). Every request is answered
/// once, in order, and every record reads back as sent. Seeded: the seed is in the failure.
#[test]
fn frames_in_pieces_of_any_size_are_read_whole_and_in_order() {
    const REQUESTS: usize = 36;
    let seed = 0x5eed_f4a3;
    let mut g = Gen::new(seed);
    let broker = Broker::start();
    let bootstrap = broker.bootstrap();
    let topic = admin::new_topic(&bootstrap, "frames-in-pieces", 1);

    // Requests of three sizes, interleaved: tiny (one small record), medium (a few KiB
    // records), large (one record of 200–900 KB).
    let mut values: Vec<Vec<Vec<u8>>> = Vec::new();
    let mut stream = Vec::new();
    for i in 0..REQUESTS {
        let value = |g: &mut Gen, min: u64, spread: u64| {
            let len = (min + g.below(spread)) as usize;
            g.bytes(len, &[])
        };
        let request_values: Vec<Vec<u8>> = match i % 3 {
            0 => vec![value(&mut g, 1, 200)],
            1 => (0..1 + g.below(12)).map(|_| value(&mut g, 1, 8 << 10)).collect(),
            _ => vec![value(&mut g, 200_000, 700_000)],
        };
        let records: Vec<_> = request_values
            .iter()
            .map(|v| raw::record(None, Some(v.as_slice()), admin::now_ms()))
            .collect();
        let req: ProduceRequest = admin::produce_request(
            &topic,
            -1,
            vec![(0, raw::encode_batch(&records, Compression::None))],
        );
        let frame = raw::request_frame(
            raw::CLIENT_ID,
            <ProduceRequest as Request>::KEY,
            versions::PRODUCE,
            <ProduceRequest as HeaderVersion>::header_version(versions::PRODUCE),
            i as i32 + 1,
            &req,
        )
        .expect("encode a produce request");
        stream.extend_from_slice(&frame);
        values.push(request_values);
    }

    // Written in pieces: a quarter of them 1–5 bytes, each followed by a pause so that the
    // broker reads it alone; the others up to 100 KB, now and then followed by a pause.
    let mut c = admin::connect(&bootstrap);
    let mut at = 0;
    let mut pieces = 0;
    while at < stream.len() {
        let tiny = g.below(4) == 0;
        let len = if tiny {
            1 + g.below(5)
        } else {
            1 + g.below(100_000)
        } as usize;
        let end = (at + len).min(stream.len());
        c.send_bytes(&stream[at..end])
            .unwrap_or_else(|e| panic!("seed {seed:#x}: write of bytes {at}..{end}: {e}"));
        at = end;
        pieces += 1;
        if tiny || g.below(4) == 0 {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    assert!(
        pieces > 2 * REQUESTS,
        "seed {seed:#x}: only {pieces} pieces for {REQUESTS} frames"
    );

    let mut next_offset = 0;
    for (i, request_values) in values.iter().enumerate() {
        let resp = c
            .read_response()
            .unwrap_or_else(|e| panic!("seed {seed:#x}: answer {i}: {e}"));
        assert_eq!(
            resp.correlation_id,
            i as i32 + 1,
            "seed {seed:#x}: answers out of order"
        );
        let resp: ProduceResponse = resp
            .decode(versions::PRODUCE)
            .unwrap_or_else(|e| panic!("seed {seed:#x}: decode answer {i}: {e}"));
        let p = admin::produce_answer(&resp, 0);
        assert_eq!(p.error_code, 0, "seed {seed:#x}: request {i} failed: {p:?}");
        assert_eq!(p.base_offset, next_offset, "seed {seed:#x}: request {i}'s offset");
        next_offset += request_values.len() as i64;
    }

    let want: Vec<&Vec<u8>> = values.iter().flatten().collect();
    let mut offset = 0;
    while (offset as usize) < want.len() {
        let got = admin::fetch(&mut c, &topic, 0, offset, 2 << 20);
        assert_eq!(got.error_code, 0, "fetch at {offset}");
        assert!(
            !got.records.is_empty(),
            "seed {seed:#x}: no records at offset {offset}"
        );
        for (o, _, v, _) in got.records {
            assert_eq!(o, offset, "offsets must be dense");
            assert!(
                v.as_deref() == Some(want[o as usize].as_slice()),
                "seed {seed:#x}: record {o} differs from what was sent"
            );
            offset = o + 1;
        }
    }
    admin::assert_broker_serves(&bootstrap);
}
