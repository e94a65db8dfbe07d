//! The null broker against the client it measures (librdkafka, through rdkafka): everything a
//! producer sends is read back at the right offsets and sizes, through templates only or
//! through the recent window; malformed input closes only its own connection; the binary
//! starts, writes its ready file and stops cleanly on SIGTERM.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kafka_protocol::messages::{ApiVersionsRequest, ApiVersionsResponse};
use kafka_protocol::protocol::StrBytes;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{ClientContext, Offset, TopicPartitionList};

use strand_tools::kafka_wire::{ConnOptions, RawConn};
use strand_tools::null_broker::{NullBroker, NullBrokerConfig, DEFAULT_RECENT_BYTES};

const MESSAGES: u64 = 20_000;
const PARTITIONS: i32 = 4;
const MESSAGE_BYTES: usize = 1024;
/// A bound for things that take well under a second, so that a bug fails instead of hanging.
const LIMIT: Duration = Duration::from_secs(30);

/// Message `id`'s payload: the id, then bytes derived from it.
fn payload(id: u64) -> Vec<u8> {
    let mut p = id.to_le_bytes().to_vec();
    p.extend((8..MESSAGE_BYTES).map(|i| (id as usize * 31 + i) as u8));
    p
}

/// Delivery reports: (partition, offset) → message id.
#[derive(Default)]
struct Deliveries {
    acked: Mutex<HashMap<(i32, i64), u64>>,
    failed: Mutex<Vec<String>>,
}

impl ClientContext for Deliveries {}

impl ProducerContext for Deliveries {
    type DeliveryOpaque = Box<u64>;

    fn delivery(&self, result: &DeliveryResult<'_>, id: Box<u64>) {
        match result {
            Ok(m) => {
                self.acked
                    .lock()
                    .unwrap()
                    .insert((m.partition(), m.offset()), *id);
            }
            Err((e, _)) => self.failed.lock().unwrap().push(e.to_string()),
        }
    }
}

fn create_topic(bootstrap: &str, topic: &str) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    let options = AdminOptions::new().request_timeout(Some(LIMIT));
    let new = NewTopic::new(topic, PARTITIONS, TopicReplication::Fixed(1));
    let results = futures::executor::block_on(admin.create_topics([&new], &options)).unwrap();
    assert!(results[0].is_ok(), "{:?}", results[0]);
    let again = futures::executor::block_on(admin.create_topics([&new], &options)).unwrap();
    assert_eq!(
        again[0],
        Err((topic.to_string(), RDKafkaErrorCode::TopicAlreadyExists))
    );
}

/// Produces `MESSAGES` messages round-robin over the partitions (acks=all) and returns the
/// delivery reports.
fn produce(bootstrap: &str, topic: &str) -> Acked {
    let producer: ThreadedProducer<Deliveries> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("acks", "all")
        .set("linger.ms", "5")
        .create_with_context(Deliveries::default())
        .unwrap();
    for id in 0..MESSAGES {
        let p = payload(id);
        let mut record = BaseRecord::<(), [u8], Box<u64>>::with_opaque_to(topic, Box::new(id))
            .payload(&p[..])
            .partition((id % PARTITIONS as u64) as i32);
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((e, r)) if e.rdkafka_error_code() == Some(RDKafkaErrorCode::QueueFull) => {
                    record = r;
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err((e, _)) => panic!("send: {e}"),
            }
        }
    }
    producer.flush(LIMIT).unwrap();
    let failed = producer.context().failed.lock().unwrap().clone();
    assert!(failed.is_empty(), "{failed:?}");
    let acked = producer.context().acked.lock().unwrap().clone();
    assert_eq!(acked.len() as u64, MESSAGES);
    acked
}

/// A message read back: (partition, offset, payload).
type ReadBack = (i32, i64, Vec<u8>);
/// Delivery reports: (partition, offset) → message id.
type Acked = HashMap<(i32, i64), u64>;

/// Reads every partition from offset 0 to its end.
fn read_back(bootstrap: &str, topic: &str) -> Vec<ReadBack> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "null-broker-test")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        // The batches served carry patched base offsets: their CRCs must still hold.
        .set("check.crcs", "true")
        .create()
        .unwrap();
    for p in 0..PARTITIONS {
        let (low, high) = consumer.fetch_watermarks(topic, p, LIMIT).unwrap();
        assert_eq!(
            (low, high),
            (0, MESSAGES as i64 / i64::from(PARTITIONS)),
            "partition {p}"
        );
    }
    let mut tpl = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        // Half at the logical beginning (resolved by ListOffsets), half at offset 0.
        let offset = if p % 2 == 0 {
            Offset::Beginning
        } else {
            Offset::Offset(0)
        };
        tpl.add_partition_offset(topic, p, offset).unwrap();
    }
    consumer.assign(&tpl).unwrap();
    let mut got = Vec::new();
    let started = Instant::now();
    while (got.len() as u64) < MESSAGES {
        assert!(started.elapsed() < LIMIT, "read {} of {MESSAGES}", got.len());
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => got.push((
                m.partition(),
                m.offset(),
                m.payload().unwrap_or_default().to_vec(),
            )),
            Some(Err(e)) => panic!("consumer: {e}"),
            None => {}
        }
    }
    got
}

/// Produces and reads back through a null broker keeping `recent_bytes` of recent batches.
fn round_trip(recent_bytes: u64) -> (Vec<ReadBack>, Acked) {
    let broker = NullBroker::start(NullBrokerConfig {
        recent_bytes,
        ..NullBrokerConfig::default()
    })
    .unwrap();
    let bootstrap = broker.local_addr().to_string();
    let topic = "null-round-trip";
    create_topic(&bootstrap, topic);
    let acked = produce(&bootstrap, topic);
    let got = read_back(&bootstrap, topic);

    // Every offset of every partition exactly once, in order, each of the size sent.
    let per_partition = MESSAGES as i64 / i64::from(PARTITIONS);
    for p in 0..PARTITIONS {
        let offsets: Vec<i64> = got.iter().filter(|m| m.0 == p).map(|m| m.1).collect();
        assert_eq!(offsets, (0..per_partition).collect::<Vec<_>>(), "partition {p}");
    }
    assert!(got.iter().all(|m| m.2.len() == MESSAGE_BYTES));
    let stats = broker.stats();
    assert_eq!((stats.records, stats.connections_closed_on_error), (MESSAGES, 0));
    assert!(stats.fetched_bytes >= stats.produced_bytes, "{stats}");
    eprintln!("recent window {recent_bytes} B: {stats}");
    (got, acked)
}

#[test]
fn librdkafka_reads_back_everything_from_templates_alone() {
    let (got, _) = round_trip(0);
    // Template payloads are real payloads of the run, not necessarily those of these offsets.
    assert!(got
        .iter()
        .all(|m| m.2 == payload(u64::from_le_bytes(m.2[..8].try_into().unwrap()))));
}

#[test]
fn librdkafka_reads_back_the_very_bytes_from_the_recent_window() {
    let (got, acked) = round_trip(DEFAULT_RECENT_BYTES);
    for (p, offset, bytes) in &got {
        let id = acked[&(*p, *offset)];
        assert!(
            bytes == &payload(id),
            "partition {p} offset {offset}: not message {id}"
        );
    }
}

fn connect(addr: SocketAddr) -> RawConn {
    let options = ConnOptions {
        read_timeout: LIMIT,
        ..ConnOptions::default()
    };
    RawConn::connect_with(&addr.to_string(), &options).unwrap()
}

/// Sends ApiVersions v3 and decodes the answer.
fn api_versions(addr: SocketAddr) -> ApiVersionsResponse {
    let request = ApiVersionsRequest::default()
        .with_client_software_name(StrBytes::from_static_str("raw"))
        .with_client_software_version(StrBytes::from_static_str("1"));
    connect(addr).request(3, &request).unwrap()
}

/// True if the server closed the connection (EOF or reset), answering nothing, after `bytes`
/// were sent.
fn closed_after(addr: SocketAddr, bytes: &[u8]) -> bool {
    let mut c = connect(addr);
    c.send_bytes(bytes).unwrap();
    c.expect_closed(LIMIT).is_ok()
}

#[test]
fn malformed_frames_close_their_connection_only() {
    let broker = NullBroker::start(NullBrokerConfig::default()).unwrap();
    let addr = broker.local_addr();
    let idle = connect(addr);
    let mut garbage = 12i32.to_be_bytes().to_vec();
    garbage.extend([0x7f, 0x7f, 0, 0, 0, 0, 0, 1, 9, 9, 9, 9]);
    assert!(closed_after(addr, &garbage), "unknown api key");
    assert!(closed_after(addr, &i32::MAX.to_be_bytes()), "oversized length");
    assert!(closed_after(addr, &(-1i32).to_be_bytes()), "negative length");
    assert!(
        closed_after(addr, &[0, 0, 0, 3, 0, 3, 0]),
        "shorter than a header"
    );
    let mut bad_body = 14i32.to_be_bytes().to_vec();
    // Metadata v4, correlation id 1, client id null, then a topic count of 2^31-1.
    bad_body.extend([0, 3, 0, 4, 0, 0, 0, 1, 0xff, 0xff, 0x7f, 0xff, 0xff, 0xff]);
    assert!(closed_after(addr, &bad_body), "a body that does not decode");
    // The server, and the connection that did nothing wrong, are fine.
    assert_eq!(api_versions(addr).error_code, 0);
    drop(idle);
    let stats = broker.stats();
    assert_eq!(stats.connections_closed_on_error, 5, "{stats}");
}

#[test]
fn the_binary_writes_its_ready_file_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let ready = dir.path().join("ready.json");
    let child = Command::new(env!("CARGO_BIN_EXE_strand-null-broker"))
        .args(["--port", "0", "--node-id", "5", "--ready-file"])
        .arg(&ready)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let addr: SocketAddr = loop {
        if let Ok(text) = std::fs::read_to_string(&ready) {
            let json: serde_json::Value = serde_json::from_str(&text).unwrap();
            assert_eq!(json["pid"], child.id());
            break json["kafka"][0]["addr"].as_str().unwrap().parse().unwrap();
        }
        assert!(started.elapsed() < LIMIT, "no ready file");
        std::thread::sleep(Duration::from_millis(10));
    };
    let versions = api_versions(addr);
    assert!(versions
        .api_keys
        .iter()
        .any(|k| k.api_key == 1 && k.max_version == 12));
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}: {stderr}", out.status);
    assert!(
        stderr.contains("summary: ") && stderr.contains("ApiVersions:1(v3)"),
        "{stderr}"
    );
}
