//! Bad input, each checked against Kafka's exact behaviour (error code, or closing the
//! connection), and after each the broker must still serve a fresh client
//! ([`admin::assert_broker_serves`]).

use std::time::Duration;

use bytes::{BufMut, BytesMut};
use kafka_protocol::messages::{
    ApiVersionsRequest, ApiVersionsResponse, MetadataRequest, ProduceRequest, RequestHeader,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use kafka_protocol::records::Compression;
use serde_json::json;
use strand_compat_tests::admin::{self, errors, versions};
use strand_compat_tests::data::Gen;
use strand_compat_tests::queue_client::{LeaseOptions, OutMessage, QueueClient};
use strand_compat_tests::raw::{self, RawConn};
use strand_compat_tests::{unique_topic, wait_for, Broker, BrokerBuilder};

const CLOSE_WITHIN: Duration = Duration::from_secs(10);

/// Kafka's defaults, used when the suite runs against an external broker.
const KAFKA_SOCKET_REQUEST_MAX_BYTES: i64 = 104_857_600;
const KAFKA_MESSAGE_MAX_BYTES: i64 = 1_048_588;

fn limit(broker: &Broker, key: &str, kafka_default: i64) -> i64 {
    broker
        .config_value(key)
        .map(|v| v.parse().expect("numeric config"))
        .unwrap_or(kafka_default)
}

fn partition_error(resp: &kafka_protocol::messages::ProduceResponse, partition: i32) -> (i16, i64) {
    let p = admin::produce_answer(resp, partition);
    (p.error_code, p.base_offset)
}

fn one_record_batch(value: &[u8]) -> bytes::Bytes {
    raw::encode_batch(
        &[raw::record(Some(b"k"), Some(value), admin::now_ms())],
        Compression::None,
    )
}

/// Runs `bad` against a broker started from `builder`, with a connection to it; then the
/// broker must still serve a new client ([`admin::assert_broker_serves`]).
fn survives(builder: BrokerBuilder, bad: impl FnOnce(&Broker, &str, &mut RawConn)) {
    let broker = builder.start();
    let bootstrap = broker.bootstrap();
    let mut c = admin::connect(&bootstrap);
    bad(&broker, &bootstrap, &mut c);
    admin::assert_broker_serves(&bootstrap);
}

#[test]
fn frame_over_socket_request_max_bytes_closes_the_connection() {
    let broker = Broker::builder()
        .config("socket.request.max.bytes", 1_048_576)
        .start();
    let bootstrap = broker.bootstrap();
    let max = limit(
        &broker,
        "socket.request.max.bytes",
        KAFKA_SOCKET_REQUEST_MAX_BYTES,
    );

    // Only the length prefix and a little of the body are sent: the broker must refuse the
    // frame on its size alone, without waiting for (or allocating) the rest.
    let mut c = admin::connect(&bootstrap);
    let len = i32::try_from(max + 1).expect("limit fits i32");
    c.send_bytes(&len.to_be_bytes()).expect("send length");
    c.send_bytes(&[0u8; 64]).expect("send some body");
    c.expect_closed(CLOSE_WITHIN)
        .unwrap_or_else(|e| panic!("frame of {len} bytes (limit {max}): {e}"));
    admin::assert_broker_serves(&bootstrap);

    // A negative length is no better.
    let mut c = admin::connect(&bootstrap);
    c.send_bytes(&(-1i32).to_be_bytes()).expect("send length");
    c.expect_closed(CLOSE_WITHIN)
        .unwrap_or_else(|e| panic!("negative frame length: {e}"));
    admin::assert_broker_serves(&bootstrap);

    // A valid request of exactly the limit is read and answered normally (padded with an
    // unknown tagged field in the request header, which brokers must ignore).
    if broker.is_spawned() {
        let mut c = admin::connect(&bootstrap);
        let frame = |pad: usize| {
            let mut header = RequestHeader::default()
                .with_request_api_key(3)
                .with_request_api_version(versions::METADATA)
                .with_correlation_id(7)
                .with_client_id(Some(StrBytes::from_static_str("big")));
            header
                .unknown_tagged_fields
                .insert(1000, bytes::Bytes::from(vec![0u8; pad]));
            let mut body = BytesMut::new();
            header.encode(&mut body, 2).expect("header");
            MetadataRequest::default()
                .with_topics(Some(vec![]))
                .encode(&mut body, versions::METADATA)
                .expect("body");
            body
        };
        let mut pad = max as usize - 100;
        let mut body = frame(pad);
        for _ in 0..5 {
            if body.len() == max as usize {
                break;
            }
            pad = (pad as i64 + (max - body.len() as i64)) as usize;
            body = frame(pad);
        }
        assert_eq!(
            body.len(),
            max as usize,
            "could not build a request of exactly {max} bytes"
        );
        c.send_frame(&body).expect("send");
        let resp = c
            .read_response()
            .expect("an answer to a valid request of exactly socket.request.max.bytes");
        assert_eq!(resp.correlation_id, 7);
    }
}

#[test]
fn unknown_api_key_closes_the_connection() {
    let broker = Broker::start();
    let bootstrap = broker.bootstrap();
    for api_key in [999i16, -1, i16::MAX] {
        let mut c = admin::connect(&bootstrap);
        let mut body = BytesMut::new();
        body.put_i16(api_key);
        body.put_i16(0);
        body.put_i32(42);
        body.put_i16(4);
        body.put_slice(b"test");
        body.put_slice(&[0u8; 16]);
        c.send_frame(&body).expect("send");
        c.expect_closed(CLOSE_WITHIN)
            .unwrap_or_else(|e| panic!("unknown API key {api_key}: {e}"));
        admin::assert_broker_serves(&bootstrap);
    }
}

#[test]
fn bad_crc_fails_only_its_partition() {
    survives(Broker::builder(), |_, bootstrap, c| {
        let topic = admin::new_topic(bootstrap, "bad-crc", 2);

        let good = one_record_batch(b"good");
        let mut bad = BytesMut::from(&one_record_batch(b"bad-crc")[..]);
        let last = bad.len() - 1;
        bad[last] ^= 0x5a; // inside the CRC-covered records; the stored CRC no longer matches
        let req = admin::produce_request(&topic, -1, vec![(0, good), (1, bad.freeze())]);
        let resp = c.request(versions::PRODUCE, &req).expect("produce");
        assert_eq!(
            partition_error(&resp, 0),
            (0, 0),
            "the valid partition of the request must succeed"
        );
        assert_eq!(
            partition_error(&resp, 1).0,
            errors::CORRUPT_MESSAGE,
            "the corrupt partition"
        );
        assert_eq!(admin::latest(c, &topic, 0), 1);
        assert_eq!(
            admin::latest(c, &topic, 1),
            0,
            "nothing of the corrupt batch may be stored"
        );
        let f = admin::fetch(c, &topic, 0, 0, 1 << 20);
        assert_eq!(f.records.len(), 1);
        assert_eq!(f.records[0].2.as_deref(), Some(&b"good"[..]));

        // A corrupted CRC field itself (bytes 17..21 of the batch) is caught the same way.
        let mut bad = BytesMut::from(&one_record_batch(b"bad-crc-field")[..]);
        bad[17] ^= 0xff;
        let (err, _) = admin::produce(c, &topic, 1, bad.freeze());
        assert_eq!(err, errors::CORRUPT_MESSAGE, "batch with a wrong CRC field");
    });
}

#[test]
fn batch_over_message_max_bytes_is_message_too_large() {
    survives(
        Broker::builder().config("message.max.bytes", 65_536),
        |broker, bootstrap, c| {
            let max = limit(broker, "message.max.bytes", KAFKA_MESSAGE_MAX_BYTES) as usize;
            let topic = admin::new_topic(bootstrap, "too-large", 1);

            let under = one_record_batch(&vec![b'u'; max - 200]);
            assert!(under.len() <= max);
            assert_eq!(
                admin::produce(c, &topic, 0, under),
                (0, 0),
                "a batch just under the limit"
            );
            let over = one_record_batch(&vec![b'o'; max + 100]);
            let (err, _) = admin::produce(c, &topic, 0, over);
            assert_eq!(
                err,
                errors::MESSAGE_TOO_LARGE,
                "a batch over message.max.bytes ({max})"
            );
            assert_eq!(
                admin::latest(c, &topic, 0),
                1,
                "the oversized batch must not be stored"
            );
        },
    );
}

#[test]
fn produce_to_unknown_topic_or_partition() {
    survives(Broker::builder(), |_, bootstrap, c| {
        let missing = unique_topic("never-created");
        let (err, _) = admin::produce(c, &missing, 0, one_record_batch(b"x"));
        assert_eq!(
            err,
            errors::UNKNOWN_TOPIC_OR_PARTITION,
            "produce to a topic that does not exist"
        );
        let md = admin::metadata(c, &[&missing], false);
        assert_eq!(
            md.topics[0].error_code,
            errors::UNKNOWN_TOPIC_OR_PARTITION,
            "produce must not create topics"
        );

        let topic = admin::new_topic(bootstrap, "one-partition", 1);
        let (err, _) = admin::produce(c, &topic, 5, one_record_batch(b"x"));
        assert_eq!(
            err,
            errors::UNKNOWN_TOPIC_OR_PARTITION,
            "produce to partition 5 of a 1-partition topic"
        );
        let f = admin::fetch(c, &topic, 3, 0, 1024);
        assert_eq!(
            f.error_code,
            errors::UNKNOWN_TOPIC_OR_PARTITION,
            "fetch from a partition that does not exist"
        );
    });
}

#[test]
fn invalid_topic_names_are_rejected() {
    survives(Broker::builder(), |_, _bootstrap, c| {
        let long = "x".repeat(250);
        for name in ["bad name", "a/b", "semi;colon", ".", "..", "", long.as_str()] {
            let resp = c
                .request(
                    versions::CREATE_TOPICS,
                    &admin::create_topics_request(name, 1, &[], false),
                )
                .expect("CreateTopics");
            assert_eq!(
                resp.topics[0].error_code,
                errors::INVALID_TOPIC_EXCEPTION,
                "CreateTopics {name:?}: {:?}",
                resp.topics[0].error_message
            );
            if !name.is_empty() {
                let md = admin::metadata(c, &[name], true);
                assert_eq!(
                    md.topics[0].error_code,
                    errors::INVALID_TOPIC_EXCEPTION,
                    "Metadata with auto-create for {name:?}"
                );
            }
        }
    });
}

#[test]
fn fetch_out_of_range_is_offset_out_of_range() {
    survives(Broker::builder(), |_, bootstrap, c| {
        let topic = admin::new_topic(bootstrap, "out-of-range", 1);
        admin::produce_values(c, &topic, 0, &[b"a", b"b", b"c"]);

        let f = admin::fetch(c, &topic, 0, 3, 1 << 20);
        assert_eq!(
            (f.error_code, f.high_watermark, f.records.len()),
            (0, 3, 0),
            "fetch at the log end is empty, not an error"
        );
        for offset in [4i64, 100, i64::MAX] {
            let f = admin::fetch(c, &topic, 0, offset, 1 << 20);
            assert_eq!(
                f.error_code,
                errors::OFFSET_OUT_OF_RANGE,
                "fetch at {offset} with log end 3"
            );
            assert!(f.records.is_empty());
        }
    });
}

#[test]
fn invalid_acks_is_invalid_required_acks() {
    survives(Broker::builder(), |_, bootstrap, c| {
        let topic = admin::new_topic(bootstrap, "bad-acks", 1);
        for acks in [5i16, 2, -2] {
            let req: ProduceRequest = admin::produce_request(&topic, acks, vec![(0, one_record_batch(b"x"))]);
            let resp = c.request(versions::PRODUCE, &req).expect("produce");
            assert_eq!(
                partition_error(&resp, 0).0,
                errors::INVALID_REQUIRED_ACKS,
                "acks={acks}"
            );
        }
        assert_eq!(
            admin::latest(c, &topic, 0),
            0,
            "nothing may be stored with invalid acks"
        );
    });
}

#[test]
fn api_versions_with_unsupported_version_answers_v0_with_the_api_list() {
    survives(Broker::builder(), |_, _bootstrap, c| {
        // A client from the future: ApiVersions v127 with a v2 (flexible) header and a v3 body.
        let mut body = BytesMut::new();
        RequestHeader::default()
            .with_request_api_key(18)
            .with_request_api_version(127)
            .with_correlation_id(77)
            .with_client_id(Some(StrBytes::from_static_str("future-client")))
            .encode(&mut body, 2)
            .expect("header");
        ApiVersionsRequest::default()
            .with_client_software_name(StrBytes::from_static_str("future"))
            .with_client_software_version(StrBytes::from_static_str("9.9"))
            .encode(&mut body, 3)
            .expect("body");
        c.send_frame(&body).expect("send");
        let resp = c.read_response().expect("an answer, not a closed connection");
        assert_eq!(resp.correlation_id, 77);
        let mut buf = resp.frame.slice(4..); // v0 response header: correlation id only
        let v0 = ApiVersionsResponse::decode(&mut buf, 0).expect("a v0-format ApiVersions answer");
        assert!(
            bytes::Buf::remaining(&buf) == 0,
            "trailing bytes after the v0 answer"
        );
        assert_eq!(v0.error_code, errors::UNSUPPORTED_VERSION);
        let own = v0
            .api_keys
            .iter()
            .find(|k| k.api_key == 18)
            .expect("ApiVersions itself in the list");
        assert_eq!(own.min_version, 0);
        assert!(
            own.max_version >= 3,
            "ApiVersions max version {}",
            own.max_version
        );
        assert!(v0.api_keys.iter().any(|k| k.api_key == 0), "Produce in the list");
        // The connection stays usable: a normal request on it is answered.
        let md = admin::metadata(c, &[], false);
        assert!(!md.brokers.is_empty());
    });
}

/// A request header for `api_key`/`version`, without the body.
fn header_only(api_key: i16, version: i16, header_version: i16) -> BytesMut {
    let mut b = BytesMut::new();
    RequestHeader::default()
        .with_request_api_key(api_key)
        .with_request_api_version(version)
        .with_correlation_id(5)
        .with_client_id(Some(StrBytes::from_static_str("garbage")))
        .encode(&mut b, header_version)
        .expect("header");
    b
}

#[test]
fn truncated_or_garbage_requests_close_the_connection() {
    let broker = Broker::start();
    let bootstrap = broker.bootstrap();

    // A Metadata request cut in the middle of its body (the frame length matches what is sent).
    let mut full = header_only(3, versions::METADATA, 2);
    let topics: Vec<_> = (0..4)
        .map(|i| {
            kafka_protocol::messages::metadata_request::MetadataRequestTopic::default()
                .with_name(Some(admin::topic_name(&format!("topic-{i}"))))
        })
        .collect();
    MetadataRequest::default()
        .with_topics(Some(topics))
        .encode(&mut full, versions::METADATA)
        .expect("body");
    let cut = full.len() - 20;
    let mut cases: Vec<(&str, Vec<u8>)> = vec![("truncated Metadata body", full[..cut].to_vec())];

    // A Produce header followed by bytes that cannot be a Produce body (an over-long varint).
    let mut produce = header_only(0, versions::PRODUCE, 2);
    produce.put_slice(&[0xff; 40]);
    cases.push(("garbage Produce body", produce.to_vec()));

    // A frame too short to hold a request header.
    cases.push(("3-byte frame", vec![0, 3, 0]));

    // A Fetch header claiming a huge topic array with nothing behind it.
    let mut fetch = header_only(1, versions::FETCH, 2);
    fetch.put_slice(&[0xff, 0xff, 0xff, 0xff, 0x07]);
    cases.push(("Fetch with a huge array count", fetch.to_vec()));

    for (what, frame) in cases {
        let mut c = admin::connect(&bootstrap);
        c.send_frame(&frame).expect("send");
        c.expect_closed(CLOSE_WITHIN)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        admin::assert_broker_serves(&bootstrap);
    }

    // A client that disconnects in the middle of a frame.
    let mut c = RawConn::connect(&bootstrap).expect("connect");
    c.send_bytes(&100i32.to_be_bytes()).expect("send");
    c.send_bytes(&[0u8; 10]).expect("send");
    drop(c);
    admin::assert_broker_serves(&bootstrap);
}

/// Bytes of a batch [`fill_disk`] produces, before its number.
const FILLER_BYTES: usize = 128 * 1024;

/// Batch `i` of [`fill_disk`]: [`FILLER_BYTES`] of 0x5a, then `i` in decimal.
fn filler_batch(i: usize) -> bytes::Bytes {
    one_record_batch(&[&[0x5au8; FILLER_BYTES][..], format!("{i}").as_bytes()].concat())
}

/// Produces [`filler_batch`]es to partition 0 of `topic` until the broker refuses one, which
/// must be KAFKA_STORAGE_ERROR; returns the numbers of the batches it acknowledged (batch `n`
/// of the list at offset `n`) and the number of the one it refused.
fn fill_disk(c: &mut RawConn, topic: &str) -> (Vec<usize>, usize) {
    let mut acked = Vec::new();
    for i in 0..400 {
        let (err, base) = admin::produce(c, topic, 0, filler_batch(i));
        if err != 0 {
            assert_eq!(
                err,
                errors::KAFKA_STORAGE_ERROR,
                "a produce that hits a full disk is KAFKA_STORAGE_ERROR (refused batch {i})"
            );
            assert!(!acked.is_empty(), "some batches fit before the disk filled up");
            return (acked, i);
        }
        assert_eq!(base, acked.len() as i64, "offsets are assigned in order");
        acked.push(i);
    }
    panic!("400 batches of 128 KiB fitted on a 16 MiB file system: the disk never filled up");
}

/// A real full disk: the broker's data directory is a 16 MiB tmpfs (see
/// `BrokerBuilder::small_disk`). Produce until the broker refuses: the refusal is
/// KAFKA_STORAGE_ERROR (56); every acknowledged batch reads back intact at its offset and nothing
/// unacknowledged becomes visible; the shard stays offline for writes while the disk is full
/// (`strand.storage.resume.free.bytes`, 64 MiB by default, is more than this file system holds)
/// while reads and metadata keep working.
#[test]
fn disk_full_is_kafka_storage_error() {
    let broker = Broker::builder().small_disk().start();
    let bootstrap = broker.bootstrap();
    let mut c = admin::connect(&bootstrap);
    let topic = admin::new_topic(&bootstrap, "full", 1);
    let other = unique_topic("full-other");
    admin::create_topic(&bootstrap, &other, 1, &[]);
    admin::produce_values(&mut c, &other, 0, &[b"written before the disk filled up"]);

    let value = vec![0x5au8; FILLER_BYTES];
    let (filled, _) = fill_disk(&mut c, &topic);
    let acked: Vec<i64> = (0..filled.len() as i64).collect();

    // Every acknowledged batch reads back intact, at the offset it was acknowledged with.
    for (i, offset) in acked.iter().enumerate() {
        let f = admin::fetch(&mut c, &topic, 0, *offset, 1 << 20);
        assert_eq!(f.error_code, 0);
        let (o, _, v, _) = f.records.first().cloned().expect("an acknowledged record");
        assert_eq!(o, *offset);
        let v = v.expect("value");
        assert_eq!(&v[..value.len()], &value[..], "record {offset} intact");
        assert_eq!(&v[value.len()..], format!("{i}").as_bytes());
    }
    assert_eq!(
        admin::latest(&mut c, &topic, 0),
        acked.len() as i64,
        "nothing unacknowledged became visible"
    );

    // Writes stay refused while the disk is full, while everything else keeps working: reads,
    // metadata, other clients.
    let (err, _) = admin::produce(&mut c, &other, 0, one_record_batch(b"after"));
    assert_eq!(err, errors::KAFKA_STORAGE_ERROR);
    let f = admin::fetch(&mut c, &other, 0, 0, 1 << 20);
    assert_eq!(f.records.len(), 1);
    // A fresh client still gets metadata and reads (the whole shard refuses writes, so the usual
    // produce-based liveness check does not apply here).
    let mut fresh = admin::connect(&bootstrap);
    let md = admin::metadata(&mut fresh, &[&topic, &other], false);
    assert!(
        md.topics.iter().all(|t| t.error_code == 0),
        "metadata after the disk filled up: {md:?}"
    );
    let f = admin::fetch(&mut fresh, &topic, 0, 0, 1 << 20);
    assert_eq!((f.error_code, f.high_watermark), (0, acked.len() as i64));
    let metrics = broker.metrics();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("strand_storage_offline") && l.ends_with(" 1")),
        "the offline state shows in /metrics"
    );
    assert!(
        metrics.contains("error=\"KafkaStorageError\""),
        "the refused produces are counted by error code"
    );
}

/// A full disk that gets space again: writes resume by themselves, without a restart. The
/// data directory is a 16 MiB tmpfs of which the test first takes 5 MiB (a file in the broker's
/// view of it); the broker takes writes again once 3 MiB are free
/// (`strand.storage.resume.free.bytes`). Fill the disk by producing until the broker refuses
/// (KAFKA_STORAGE_ERROR, answered, not timed out; the HTTP door answers 503 `storage_error`),
/// then delete the file: produces succeed again at the next offsets, the HTTP door publishes,
/// every acknowledged batch reads back in order at its offset, the resume is logged and counted,
/// and the offline gauge is back to 0.
#[test]
fn writes_resume_once_a_full_disk_has_space_again() {
    let broker = Broker::builder()
        .small_disk()
        .config("strand.storage.resume.free.bytes", 3 << 20)
        .start();
    let ballast = broker.data_dir_seen_by_broker().join("ballast");
    std::fs::write(&ballast, vec![1u8; 5 << 20]).unwrap_or_else(|e| {
        panic!(
            "cannot take space in the broker's data directory ({}): {e}",
            ballast.display()
        )
    });
    let bootstrap = broker.bootstrap();
    let mut c = admin::connect(&bootstrap);
    let topic = admin::new_topic(&bootstrap, "refill", 1);
    let mut q = QueueClient::new(&broker.http_addr());
    let queue = unique_topic("refill-queue");
    let (status, answer) = q.put_queue(&queue, &json!({})).expect("PUT queue");
    assert_eq!(status, 201, "{answer}");
    q.publish(&queue, &[OutMessage::new("published before the disk filled up")])
        .expect("publish before the disk filled up");

    let value = vec![0x5au8; FILLER_BYTES];
    let (mut acked, at) = fill_disk(&mut c, &topic);
    let full = q
        .publish(&queue, &[OutMessage::new("published on a full disk")])
        .expect_err("publishing on a full disk");
    assert_eq!(full.status(), Some((503, "storage_error")), "{full:?}");

    // Space again: the broker notices it by itself and takes writes again, at the next offsets.
    std::fs::remove_file(&ballast).expect("give the space back");
    let mut next = at + 1;
    let mut refusals = 0;
    wait_for(Duration::from_secs(60), "produces to succeed again", || {
        let (err, base) = admin::produce(&mut c, &topic, 0, filler_batch(next));
        if err == 0 {
            assert_eq!(
                base,
                acked.len() as i64,
                "the first batch after the disk had space again"
            );
            acked.push(next);
            next += 1;
            Some(())
        } else {
            assert_eq!(
                err,
                errors::KAFKA_STORAGE_ERROR,
                "refused while the broker catches up"
            );
            refusals += 1;
            None
        }
    });
    for _ in 0..8 {
        let (err, base) = admin::produce(&mut c, &topic, 0, filler_batch(next));
        assert_eq!(
            (err, base),
            (0, acked.len() as i64),
            "produce after the disk had space again"
        );
        acked.push(next);
        next += 1;
    }
    q.publish(
        &queue,
        &[OutMessage::new("published after the disk had space again")],
    )
    .expect("the HTTP door publishes again");

    // Every acknowledged batch, in order, at its offset; nothing else.
    let mut offset = 0i64;
    while offset < acked.len() as i64 {
        let f = admin::fetch(&mut c, &topic, 0, offset, 1 << 20);
        assert_eq!(f.error_code, 0);
        assert!(!f.records.is_empty(), "nothing at offset {offset}");
        for (o, _, v, _) in f.records {
            assert_eq!(o, offset);
            let i = acked[o as usize];
            let v = v.expect("value");
            assert_eq!(&v[..value.len()], &value[..], "record {o} intact");
            assert_eq!(
                &v[value.len()..],
                format!("{i}").as_bytes(),
                "record {o} is batch {i}"
            );
            offset += 1;
        }
    }
    assert_eq!(admin::latest(&mut c, &topic, 0), acked.len() as i64);
    // Both published messages are there for a consumer of the queue; the refused one is not.
    let leased = q
        .lease(
            &queue,
            &LeaseOptions {
                max_messages: Some(10),
                wait_ms: Some(1000),
                ..LeaseOptions::default()
            },
        )
        .expect("lease");
    let payloads: Vec<&str> = leased.iter().filter_map(|m| m.payload.as_deref()).collect();
    assert_eq!(
        payloads,
        [
            "published before the disk filled up",
            "published after the disk had space again"
        ],
        "{leased:?}"
    );

    let metrics = broker.metrics();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("strand_storage_resumes_total") && l.ends_with(" 1")),
        "the resume is counted: {refusals} refusals before it"
    );
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("strand_storage_offline") && l.ends_with(" 0")),
        "the offline gauge is back to 0"
    );
    assert!(
        broker.log_text().contains("takes writes again"),
        "the resume is logged"
    );
    broker.assert_never_panicked("after a full disk had space again");
}

/// Bytes that decode into one-element arrays, short strings and small or extreme numbers more
/// often than uniform noise would, in both encodings: tokens of 1 (compact arrays and strings:
/// 0x02 is one element or one byte), 2 (i16 lengths) or 4 bytes (i32 counts), -1 (null), zeros
/// (empty tag buffers), and random bytes.
fn token_body(g: &mut Gen) -> Vec<u8> {
    let tokens = g.below(48);
    let mut out = Vec::new();
    for _ in 0..tokens {
        match g.below(16) {
            0..=3 => out.push(0),
            4..=5 => out.push(2),
            6 => out.push(1),
            7 => out.extend_from_slice(&[0, 0, 0, 1]),
            8 => out.extend_from_slice(&[0, 1]),
            9 => out.extend_from_slice(&[0xff; 4]),
            10 => out.extend_from_slice(&(g.next_u64() as u32).to_be_bytes()),
            11 => out.extend_from_slice(&g.next_u64().to_be_bytes()),
            _ => out.push(g.next_u64() as u8),
        }
    }
    out
}

/// Valid requests with one element in each list, for the mutations to start from: random bytes
/// alone rarely decode into nested items (a partition inside a topic inside a request).
fn seeds(
    topic: &str,
    topic_id: uuid::Uuid,
) -> Vec<(
    kafka_protocol::messages::ApiKey,
    kafka_protocol::messages::RequestKind,
)> {
    use kafka_protocol::messages::*;
    let s = |v: &str| StrBytes::from_string(v.to_string());
    let group = || GroupId(s("fuzz-group"));
    let name = || TopicName(s(topic));
    let mut list_offsets = ListOffsetsRequest::default();
    let mut lo_topic = list_offsets_request::ListOffsetsTopic::default();
    lo_topic.name = name();
    lo_topic.partitions = vec![list_offsets_request::ListOffsetsPartition::default()];
    list_offsets.topics = vec![lo_topic];
    let mut commit = OffsetCommitRequest::default();
    commit.group_id = group();
    commit.generation_id_or_member_epoch = -1;
    let mut c_topic = offset_commit_request::OffsetCommitRequestTopic::default();
    c_topic.name = name();
    let mut c_part = offset_commit_request::OffsetCommitRequestPartition::default();
    c_part.committed_offset = 2;
    c_topic.partitions = vec![c_part];
    commit.topics = vec![c_topic];
    let mut offset_fetch_old = OffsetFetchRequest::default();
    offset_fetch_old.group_id = group();
    let mut f_topic = offset_fetch_request::OffsetFetchRequestTopic::default();
    f_topic.name = name();
    f_topic.partition_indexes = vec![0, 1];
    offset_fetch_old.topics = Some(vec![f_topic]);
    let mut offset_fetch = OffsetFetchRequest::default();
    let mut f_group = offset_fetch_request::OffsetFetchRequestGroup::default();
    f_group.group_id = group();
    f_group.member_epoch = -1;
    let mut f_topics = offset_fetch_request::OffsetFetchRequestTopics::default();
    f_topics.name = name();
    f_topics.topic_id = topic_id;
    f_topics.partition_indexes = vec![0];
    f_group.topics = Some(vec![f_topics]);
    offset_fetch.groups = vec![f_group];
    let mut join = JoinGroupRequest::default();
    join.group_id = group();
    join.session_timeout_ms = 10_000;
    join.rebalance_timeout_ms = 10_000;
    join.protocol_type = s("consumer");
    let mut proto = join_group_request::JoinGroupRequestProtocol::default();
    proto.name = s("range");
    proto.metadata = bytes::Bytes::from_static(&[0, 1, 0, 0, 0, 1, 0, 1, b'x', 0, 0, 0, 0]);
    join.protocols = vec![proto];
    let mut sync = SyncGroupRequest::default();
    sync.group_id = group();
    sync.member_id = s("m");
    let mut assignment = sync_group_request::SyncGroupRequestAssignment::default();
    assignment.member_id = s("m");
    assignment.assignment = bytes::Bytes::from_static(&[0, 1, 0, 0, 0, 0, 0, 0, 0, 0]);
    sync.assignments = vec![assignment];
    let mut heartbeat = HeartbeatRequest::default();
    heartbeat.group_id = group();
    heartbeat.member_id = s("m");
    let mut cg = ConsumerGroupHeartbeatRequest::default();
    cg.group_id = group();
    cg.member_id = s("0123456789abcdef0123456789");
    cg.rebalance_timeout_ms = 10_000;
    cg.subscribed_topic_names = Some(vec![name()]);
    let mut tp = consumer_group_heartbeat_request::TopicPartitions::default();
    tp.topic_id = topic_id;
    tp.partitions = vec![0, 2];
    cg.topic_partitions = Some(vec![tp]);
    let mut sg = ShareGroupHeartbeatRequest::default();
    sg.group_id = GroupId(s("fuzz-share"));
    sg.member_id = s("0123456789abcdef0123456789");
    sg.subscribed_topic_names = Some(vec![name()]);
    let acks = vec![(0i64, 1i64, vec![1i8])];
    let share_fetch = strand_compat_tests::share::fetch_request(
        "fuzz-share",
        "0123456789abcdef0123456789",
        0,
        &[(topic_id, 0, acks.clone())],
        10,
        10,
    );
    let share_ack = strand_compat_tests::share::acknowledge_request(
        "fuzz-share",
        "0123456789abcdef0123456789",
        1,
        &[(topic_id, 0, acks)],
    );
    let mut delete = DeleteRecordsRequest::default();
    let mut d_topic = delete_records_request::DeleteRecordsTopic::default();
    d_topic.name = name();
    let mut d_part = delete_records_request::DeleteRecordsPartition::default();
    d_part.offset = 1;
    d_topic.partitions = vec![d_part];
    delete.topics = vec![d_topic];
    let mut epochs = OffsetForLeaderEpochRequest::default();
    let mut e_topic = offset_for_leader_epoch_request::OffsetForLeaderTopic::default();
    e_topic.topic = name();
    e_topic.partitions = vec![offset_for_leader_epoch_request::OffsetForLeaderPartition::default()];
    epochs.topics = vec![e_topic];
    let mut describe = DescribeConfigsRequest::default();
    let mut resource = describe_configs_request::DescribeConfigsResource::default();
    resource.resource_type = 2;
    resource.resource_name = s(topic);
    resource.configuration_keys = Some(vec![s("retention.ms")]);
    describe.resources = vec![resource];
    let mut alter = IncrementalAlterConfigsRequest::default();
    let mut a_resource = incremental_alter_configs_request::AlterConfigsResource::default();
    a_resource.resource_type = 2;
    a_resource.resource_name = s(topic);
    let mut a_config = incremental_alter_configs_request::AlterableConfig::default();
    a_config.name = s("retention.ms");
    a_config.value = Some(s("86400000"));
    a_resource.configs = vec![a_config];
    alter.resources = vec![a_resource];
    let mut init = InitProducerIdRequest::default();
    init.producer_id = ProducerId(-1);
    init.producer_epoch = -1;
    vec![
        (
            ApiKey::Produce,
            RequestKind::Produce(admin::produce_request(
                topic,
                -1,
                vec![(0, one_record_batch(b"fuzz"))],
            )),
        ),
        (
            ApiKey::Fetch,
            RequestKind::Fetch(admin::fetch_request(topic, 0, 0, 1 << 20)),
        ),
        (ApiKey::ListOffsets, RequestKind::ListOffsets(list_offsets)),
        (ApiKey::OffsetCommit, RequestKind::OffsetCommit(commit)),
        (ApiKey::OffsetFetch, RequestKind::OffsetFetch(offset_fetch_old)),
        (ApiKey::OffsetFetch, RequestKind::OffsetFetch(offset_fetch)),
        (ApiKey::JoinGroup, RequestKind::JoinGroup(join)),
        (ApiKey::SyncGroup, RequestKind::SyncGroup(sync)),
        (ApiKey::Heartbeat, RequestKind::Heartbeat(heartbeat)),
        (
            ApiKey::ConsumerGroupHeartbeat,
            RequestKind::ConsumerGroupHeartbeat(cg),
        ),
        (ApiKey::ShareGroupHeartbeat, RequestKind::ShareGroupHeartbeat(sg)),
        (ApiKey::ShareFetch, RequestKind::ShareFetch(share_fetch)),
        (ApiKey::ShareAcknowledge, RequestKind::ShareAcknowledge(share_ack)),
        (ApiKey::DeleteRecords, RequestKind::DeleteRecords(delete)),
        (
            ApiKey::OffsetForLeaderEpoch,
            RequestKind::OffsetForLeaderEpoch(epochs),
        ),
        (ApiKey::InitProducerId, RequestKind::InitProducerId(init)),
        (ApiKey::DescribeConfigs, RequestKind::DescribeConfigs(describe)),
        (
            ApiKey::IncrementalAlterConfigs,
            RequestKind::IncrementalAlterConfigs(alter),
        ),
    ]
}

/// Points the topics a decoded request names at a real topic, so that the mutated numbers
/// (partitions, offsets, epochs, sizes) reach the handlers' logic, not only the unknown-topic
/// check.
fn aim_at(req: &mut kafka_protocol::messages::RequestKind, topic: &str, topic_id: uuid::Uuid) {
    use kafka_protocol::messages::{RequestKind as K, TopicName};
    let name = || TopicName(StrBytes::from_string(topic.to_string()));
    match req {
        K::Produce(r) => r.topic_data.iter_mut().for_each(|t| {
            t.name = name();
            t.topic_id = topic_id;
        }),
        K::Fetch(r) => r.topics.iter_mut().for_each(|t| {
            t.topic = name();
            t.topic_id = topic_id;
        }),
        K::ListOffsets(r) => r.topics.iter_mut().for_each(|t| t.name = name()),
        K::OffsetCommit(r) => r.topics.iter_mut().for_each(|t| {
            t.name = name();
            t.topic_id = topic_id;
        }),
        K::DeleteRecords(r) => r.topics.iter_mut().for_each(|t| t.name = name()),
        K::ShareFetch(r) => r.topics.iter_mut().for_each(|t| t.topic_id = topic_id),
        K::ShareAcknowledge(r) => r.topics.iter_mut().for_each(|t| t.topic_id = topic_id),
        K::OffsetForLeaderEpoch(r) => r.topics.iter_mut().for_each(|t| t.topic = name()),
        _ => {}
    }
}

/// Every API the broker advertises, at every version, gets requests that decode but carry
/// random contents: random bytes kept only if `kafka-protocol` decodes them, and valid requests
/// of 18 APIs (one element in each list) with one to four of their bytes overwritten,
/// again kept only if they decode; all aimed at a real topic. Each goes on its own connection,
/// dropped after at most 100 ms, answered or not. The broker must answer or close, never
/// panic, and keep serving.
#[test]
fn random_requests_of_every_api_never_take_the_broker_down() {
    use kafka_protocol::messages::{ApiKey, RequestKind};
    // A longer hunt: STRAND_FUZZ_SEED=<n> STRAND_FUZZ_PER_VERSION=<n>.
    let env = |k: &str, d: u64| std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(d);
    let (seed, per_version) = (
        env("STRAND_FUZZ_SEED", 0x5eed_f022),
        env("STRAND_FUZZ_PER_VERSION", 6) as usize,
    );
    let broker = Broker::start();
    let bootstrap = broker.bootstrap();
    let topic = unique_topic("fuzz");
    let mut c = admin::connect(&bootstrap);
    admin::create_topic(&bootstrap, &topic, 3, &[]);
    for p in 0..3 {
        admin::produce_values(&mut c, &topic, p, &[b"a", b"b", b"c"]);
    }
    let (topic_id, _) = admin::topic_info(&mut c, &topic);
    let advertised = admin::api_versions(&mut c).api_keys;
    drop(c);

    let (mut sent, mut answered) = (0usize, 0usize);
    let trace = std::env::var("STRAND_FUZZ_TRACE").is_ok();
    let mut send = |api: ApiKey, version: i16, mut req: RequestKind| {
        aim_at(&mut req, &topic, topic_id);
        if trace {
            eprintln!("#{sent} {api:?} v{version} {req:?}");
        }
        let mut frame = BytesMut::new();
        RequestHeader::default()
            .with_request_api_key(api as i16)
            .with_request_api_version(version)
            .with_correlation_id(sent as i32)
            .with_client_id(Some(StrBytes::from_static_str("fuzz")))
            .encode(&mut frame, api.request_header_version(version))
            .expect("header");
        if req.encode(&mut frame, version).is_err() {
            return;
        }
        let mut conn = RawConn::connect(&bootstrap).unwrap_or_else(|e| {
            panic!(
                "seed {seed}: connect after {sent} requests: {e}; the broker's last words:\n{}",
                broker.stderr_tail(30)
            )
        });
        conn.set_read_timeout(Duration::from_millis(100))
            .expect("timeout");
        conn.send_frame(&frame).expect("send");
        sent += 1;
        if matches!(conn.read_frame(), Ok(Some(_))) {
            answered += 1;
        }
        if sent % 200 == 0 || sent as u64 >= env("STRAND_FUZZ_CHECK_FROM", u64::MAX) {
            admin::assert_broker_serves(&bootstrap);
        }
    };
    let mut rng = Gen::new(seed);
    let versions = |api: ApiKey| {
        advertised
            .iter()
            .find(|k| k.api_key == api as i16)
            .map(|k| (k.min_version..=k.max_version).collect::<Vec<i16>>())
            .unwrap_or_default()
    };
    for k in &advertised {
        let Ok(api) = ApiKey::try_from(k.api_key) else {
            continue;
        };
        for version in versions(api) {
            let mut found = 0;
            for _ in 0..100 * per_version {
                if found == per_version {
                    break;
                }
                let mut buf = bytes::Bytes::from(token_body(&mut rng));
                if let Ok(req) = RequestKind::decode(api, &mut buf, version) {
                    found += 1;
                    send(api, version, req);
                }
            }
        }
    }
    for (api, seed_req) in seeds(&topic, topic_id) {
        for version in versions(api) {
            let mut valid = BytesMut::new();
            if seed_req.encode(&mut valid, version).is_err() {
                continue;
            }
            let mut found = 0;
            for _ in 0..100 * per_version {
                if found == 4 * per_version {
                    break;
                }
                let mut body = valid.to_vec();
                for _ in 0..=rng.below(3) {
                    let at = rng.below(body.len() as u64) as usize;
                    let with: Vec<u8> = match rng.below(6) {
                        0 => vec![0],
                        1 => vec![rng.below(4) as u8],
                        2 => vec![0xff; 4],
                        3 => vec![0x7f, 0xff, 0xff, 0xff],
                        4 => vec![0x80, 0, 0, 0],
                        _ => vec![rng.next_u64() as u8],
                    };
                    for (i, b) in with.into_iter().enumerate() {
                        if let Some(x) = body.get_mut(at + i) {
                            *x = b;
                        }
                    }
                }
                let mut buf = bytes::Bytes::from(body);
                if let Ok(req) = RequestKind::decode(api, &mut buf, version) {
                    found += 1;
                    send(api, version, req);
                }
            }
        }
    }
    admin::assert_broker_serves(&bootstrap);
    broker.assert_never_panicked(&format!("seed {seed}"));
    assert!(
        sent > 1000 && answered > sent / 4,
        "seed {seed}: {sent} random requests sent, {answered} answered: too few reach the handlers"
    );
    eprintln!("{sent} random requests, {answered} answered");
}
