//! Three independent client stacks against the broker: rdkafka (Rust, bundled librdkafka),
//! confluent-kafka (Python, its own librdkafka build) and kafka-python (pure Python). Each
//! writes, each reads, and all must agree byte for byte, offset for offset.

use std::time::Duration;

use kafka_protocol::messages::ProduceRequest;
use kafka_protocol::records::Compression;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use strand_compat_tests::admin::{self, versions};
use strand_compat_tests::clients::rdkafka_read_all;
use strand_compat_tests::clients::{self, PythonClient};
use strand_compat_tests::data::{
    assert_read_back as check, ends_of, sequential_offsets, varied_records, TestRecord,
};
use strand_compat_tests::{raw, unique_topic, wait_for, Broker};

const TIMEOUT: Duration = Duration::from_secs(60);

#[test]
fn rdkafka_round_trip_with_assign_and_seek() {
    let broker = Broker::start();
    let bootstrap = broker.bootstrap();
    let topic = admin::new_topic(&bootstrap, "rdkafka-rt", 3);
    let records = varied_records(3000, 3, 21);

    let offsets = clients::rdkafka_produce(&bootstrap, &topic, &records);
    assert_eq!(
        offsets,
        sequential_offsets(&records),
        "acks=all offsets must be 0..n-1 per partition, in order"
    );
    let ends = ends_of(&records, 3);
    let got = rdkafka_read_all(&bootstrap, &topic, &ends);
    check("rdkafka", &records, &offsets, &got);

    // Watermarks, then seeking inside partition 1.
    let consumer: BaseConsumer = clients::assign_consumer(&bootstrap);
    let p1: Vec<(usize, &TestRecord)> = records
        .iter()
        .enumerate()
        .filter(|(_, r)| r.partition == 1)
        .collect();
    let n1 = p1.len() as i64;
    assert_eq!(
        consumer.fetch_watermarks(&topic, 1, TIMEOUT).expect("watermarks"),
        (0, n1)
    );
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&topic, 1, Offset::Beginning)
        .expect("tpl");
    consumer.assign(&tpl).expect("assign");
    let first = clients::poll_records(&consumer, 10, TIMEOUT);
    assert_eq!(
        first.iter().map(|c| c.offset).collect::<Vec<_>>(),
        (0..10).collect::<Vec<i64>>()
    );
    for target in [500i64, n1 - 5, 3] {
        consumer
            .seek(&topic, 1, Offset::Offset(target), TIMEOUT)
            .expect("seek");
        let got = clients::poll_records(&consumer, 5, TIMEOUT);
        for (k, c) in got.iter().enumerate() {
            let want = target + k as i64;
            assert_eq!(c.offset, want, "after seek to {target}");
            assert!(
                c.same_content(p1[want as usize].1),
                "content at offset {want} after seek to {target}"
            );
        }
    }

    // Offset::End: only records produced after the assignment are read.
    let consumer: BaseConsumer = clients::assign_consumer(&bootstrap);
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&topic, 2, Offset::End).expect("tpl");
    consumer.assign(&tpl).expect("assign");
    // Let the consumer resolve END before producing more.
    let nothing = consumer.poll(Duration::from_millis(1500));
    assert!(
        nothing.is_none(),
        "read something at END before producing: {:?}",
        nothing.map(|m| m.is_ok())
    );
    let more: Vec<TestRecord> = varied_records(3, 1, 22)
        .into_iter()
        .map(|mut r| {
            r.partition = 2;
            r
        })
        .collect();
    let more_offsets = clients::rdkafka_produce(&bootstrap, &topic, &more);
    let n2 = ends[&2];
    assert_eq!(more_offsets, vec![n2, n2 + 1, n2 + 2]);
    let got = clients::poll_records(&consumer, 3, TIMEOUT);
    check("rdkafka at END", &more, &more_offsets, &got);
}

#[test]
fn three_stacks_read_what_rdkafka_wrote() {
    let broker = Broker::start();
    let bootstrap = broker.bootstrap();
    let topic = admin::new_topic(&bootstrap, "stacks-rd", 3);
    let records = varied_records(900, 3, 31);
    let offsets = clients::rdkafka_produce(&bootstrap, &topic, &records);
    assert_eq!(offsets, sequential_offsets(&records));
    let ends = ends_of(&records, 3);

    check(
        "rdkafka",
        &records,
        &offsets,
        &rdkafka_read_all(&bootstrap, &topic, &ends),
    );
    for client in [PythonClient::ConfluentKafka, PythonClient::KafkaPython] {
        let got = clients::python_consume(client, &bootstrap, &topic, 0, &ends);
        check(&format!("{client:?}"), &records, &offsets, &got);
    }

    // Reading from the middle: every stack starts exactly at the requested offset.
    let start = 100;
    let tail: Vec<(TestRecord, i64)> = records
        .iter()
        .cloned()
        .zip(offsets.iter().copied())
        .filter(|(_, o)| *o >= start)
        .collect();
    let (tail_records, tail_offsets): (Vec<_>, Vec<_>) = tail.into_iter().unzip();
    for client in [PythonClient::ConfluentKafka, PythonClient::KafkaPython] {
        let got = clients::python_consume(client, &bootstrap, &topic, start, &ends);
        check(
            &format!("{client:?} from {start}"),
            &tail_records,
            &tail_offsets,
            &got,
        );
    }
}

#[test]
fn three_stacks_read_what_python_clients_wrote() {
    let broker = Broker::start();
    let bootstrap = broker.bootstrap();
    let from_confluent = admin::new_topic(&bootstrap, "stacks-ck", 3);
    let from_kafka_python = unique_topic("stacks-kp");
    admin::create_topic(&bootstrap, &from_kafka_python, 3, &[]);

    let writes = clients::python_clients_write(&bootstrap, &from_confluent, &from_kafka_python, 600, 41);
    let (a, a_offsets) = writes.confluent;
    let (b, b_offsets) = writes.kafka_python;

    let a_ends = ends_of(&a, 3);
    let b_ends = ends_of(&b, 3);
    check(
        "rdkafka reading confluent-kafka",
        &a,
        &a_offsets,
        &rdkafka_read_all(&bootstrap, &from_confluent, &a_ends),
    );
    check(
        "rdkafka reading kafka-python",
        &b,
        &b_offsets,
        &rdkafka_read_all(&bootstrap, &from_kafka_python, &b_ends),
    );
    let got = clients::python_consume(PythonClient::KafkaPython, &bootstrap, &from_confluent, 0, &a_ends);
    check("kafka-python reading confluent-kafka", &a, &a_offsets, &got);
    let got = clients::python_consume(
        PythonClient::ConfluentKafka,
        &bootstrap,
        &from_kafka_python,
        0,
        &b_ends,
    );
    check("confluent-kafka reading kafka-python", &b, &b_offsets, &got);
}

#[test]
fn raw_produce_acks_0_and_1_and_every_codec() {
    let broker = Broker::start();
    let bootstrap = broker.bootstrap();
    let topic = admin::new_topic(&bootstrap, "raw-acks", 1);
    let mut conn = admin::connect(&bootstrap);

    // acks=0: no answer at all; the next answer on the connection is the Metadata one.
    let batch = raw::encode_batch(
        &[raw::record(Some(b"k0"), Some(b"acks-zero"), 1_000)],
        Compression::None,
    );
    let req: ProduceRequest = admin::produce_request(&topic, 0, vec![(0, batch)]);
    conn.send_request(versions::PRODUCE, &req)
        .expect("send acks=0 produce");
    let md = kafka_protocol::messages::MetadataRequest::default().with_topics(None);
    let md_corr = conn.send_request(versions::METADATA, &md).expect("send metadata");
    let resp = conn.read_response().expect("an answer");
    assert_eq!(
        resp.correlation_id, md_corr,
        "the broker answered an acks=0 produce"
    );
    resp.decode::<kafka_protocol::messages::MetadataResponse>(versions::METADATA)
        .expect("metadata decodes");
    wait_for(
        Duration::from_secs(10),
        "the acks=0 record to become readable",
        || (admin::latest(&mut conn, &topic, 0) == 1).then_some(()),
    );

    // acks=1, then one batch per codec with acks=-1; each must come back identical.
    let mut next = 1i64;
    for (acks, compression) in [
        (1i16, Compression::None),
        (-1, Compression::Gzip),
        (-1, Compression::Snappy),
        (-1, Compression::Lz4),
        (-1, Compression::Zstd),
    ] {
        let values: Vec<Vec<u8>> = (0..50)
            .map(|i| format!("{compression:?}-{i}-{}", "x".repeat(i * 7)).into_bytes())
            .collect();
        let recs: Vec<_> = values.iter().map(|v| raw::record(None, Some(v), 2_000)).collect();
        let req = admin::produce_request(&topic, acks, vec![(0, raw::encode_batch(&recs, compression))]);
        let resp = conn.request(versions::PRODUCE, &req).expect("produce");
        let p = &resp.responses[0].partition_responses[0];
        assert_eq!(
            (p.error_code, p.base_offset),
            (0, next),
            "{compression:?} acks={acks}"
        );
        let f = admin::fetch(&mut conn, &topic, 0, next, 1 << 20);
        assert_eq!(f.error_code, 0);
        let got: Vec<(i64, Vec<u8>)> = f
            .records
            .iter()
            .take(values.len())
            .map(|r| (r.0, r.2.as_ref().map(|b| b.to_vec()).unwrap_or_default()))
            .collect();
        let want: Vec<(i64, Vec<u8>)> = values
            .iter()
            .enumerate()
            .map(|(i, v)| (next + i as i64, v.clone()))
            .collect();
        assert_eq!(got, want, "{compression:?} batch read back");
        next += values.len() as i64;
    }
    assert_eq!(admin::latest(&mut conn, &topic, 0), next);
}

/// Clients pipeline requests and match answers by order: a connection's responses must leave
/// in request order even when a later request finishes first. A fetch long-polling an empty
/// partition is followed at once by ApiVersions and Metadata; the answers must come back fetch
/// first, and only after the long poll.
#[test]
fn pipelined_responses_leave_in_request_order() {
    use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
    use kafka_protocol::messages::{ApiVersionsRequest, BrokerId, FetchRequest, MetadataRequest};

    let broker = Broker::start();
    let bootstrap = broker.bootstrap();
    let topic = admin::new_topic(&bootstrap, "pipeline", 1);
    let mut c = admin::connect(&bootstrap);
    let fetch = FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(400)
        .with_min_bytes(1)
        .with_max_bytes(1 << 20)
        .with_session_epoch(-1)
        .with_topics(vec![FetchTopic::default()
            .with_topic(admin::topic_name(&topic))
            .with_partitions(vec![FetchPartition::default()
                .with_partition(0)
                .with_fetch_offset(0)
                .with_current_leader_epoch(-1)
                .with_last_fetched_epoch(-1)
                .with_log_start_offset(-1)
                .with_partition_max_bytes(1 << 20)])]);
    let started = std::time::Instant::now();
    let ids = [
        c.send_request(versions::FETCH, &fetch).expect("send fetch"),
        c.send_request(versions::API_VERSIONS, &ApiVersionsRequest::default())
            .expect("send api versions"),
        c.send_request(versions::METADATA, &MetadataRequest::default().with_topics(None))
            .expect("send metadata"),
    ];
    let first = c.read_response().expect("first answer");
    assert!(
        started.elapsed() >= std::time::Duration::from_millis(350),
        "the fetch long-polls an empty partition"
    );
    let got = [
        first.correlation_id,
        c.read_response().expect("second answer").correlation_id,
        c.read_response().expect("third answer").correlation_id,
    ];
    assert_eq!(got, ids, "answers leave in request order");
}
