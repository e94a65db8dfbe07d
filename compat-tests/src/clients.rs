//! Helpers around rdkafka (bundled librdkafka) and the Python client scripts.

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::client::ClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};

use crate::data::{self, Consumed, TestRecord};
use crate::tools;

/// Base rdkafka configuration for `bootstrap`: no idempotence (the broker need not support
/// InitProducerId yet), quick reconnects.
pub fn base_config(bootstrap: &str) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap)
        .set("broker.address.family", "v4")
        .set("reconnect.backoff.ms", "50")
        .set("reconnect.backoff.max.ms", "500");
    c
}

/// rdkafka headers from a test record's.
pub fn owned_headers(h: &[(String, Option<Vec<u8>>)]) -> OwnedHeaders {
    let mut headers = OwnedHeaders::new_with_capacity(h.len());
    for (k, v) in h {
        headers = headers.insert(Header {
            key: k,
            value: v.as_deref(),
        });
    }
    headers
}

/// Where a message ended up, as its delivery report said.
pub type Delivery = Result<(i32, i64), String>;

/// A producer context recording every delivery report by message index (the opaque).
#[derive(Clone, Default)]
pub struct DeliveryLog {
    /// Index -> report. Shared so another thread can watch acknowledgements arrive.
    pub reports: Arc<Mutex<BTreeMap<usize, Delivery>>>,
}

impl ClientContext for DeliveryLog {}

impl ProducerContext for DeliveryLog {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, index: usize) {
        let report = match result {
            Ok(m) => Ok((m.partition(), m.offset())),
            Err((e, _)) => Err(e.to_string()),
        };
        if let Ok(mut reports) = self.reports.lock() {
            reports.insert(index, report);
        }
    }
}

/// An rdkafka producer with acks=all whose deliveries are recorded in a [`DeliveryLog`].
/// `extra` settings are applied last.
pub fn logged_producer(bootstrap: &str, extra: &[(&str, &str)]) -> BaseProducer<DeliveryLog> {
    let mut config = base_config(bootstrap);
    config
        .set("acks", "all")
        .set("enable.idempotence", "false")
        .set("linger.ms", "5")
        .set("message.timeout.ms", "30000");
    for (k, v) in extra {
        config.set(*k, *v);
    }
    config
        .create_with_context(DeliveryLog::default())
        .unwrap_or_else(|e| panic!("create rdkafka producer: {e}"))
}

/// Queues one record (index `index` in the delivery log), polling while the queue is full.
pub fn send_record(producer: &BaseProducer<DeliveryLog>, topic: &str, index: usize, r: &TestRecord) {
    let mut rec: BaseRecord<'_, [u8], [u8], usize> = BaseRecord::with_opaque_to(topic, index)
        .partition(r.partition)
        .headers(owned_headers(&r.headers));
    if let Some(k) = &r.key {
        rec = rec.key(k.as_slice());
    }
    if let Some(v) = &r.value {
        rec = rec.payload(v.as_slice());
    }
    if let Some(ts) = r.timestamp {
        rec = rec.timestamp(ts);
    }
    loop {
        match producer.send(rec) {
            Ok(()) => return,
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                rec = back;
                producer.poll(Duration::from_millis(10));
            }
            Err((e, _)) => panic!("rdkafka send failed: {e}"),
        }
    }
}

/// Produces `records` to `topic` with rdkafka (acks=all) and waits for every delivery.
/// Returns the offsets in input order; panics on any delivery failure or when a record
/// landed in another partition than asked.
pub fn rdkafka_produce(bootstrap: &str, topic: &str, records: &[TestRecord]) -> Vec<i64> {
    rdkafka_produce_with(bootstrap, topic, records, &[])
}

/// Produces offsets `first..first + per_partition` of each of `partitions` partitions with
/// rdkafka (acks=all): the record at offset `o` of partition `p` has the value `"p:o"`, so that
/// every record consumed can be checked where it stands. Panics unless each record lands at
/// that offset (a topic that held exactly `first` records per partition before).
pub fn produce_numbered(bootstrap: &str, topic: &str, partitions: i32, first: i64, per_partition: i64) {
    let records: Vec<TestRecord> = (0..per_partition)
        .flat_map(|k| {
            (0..partitions).map(move |p| TestRecord {
                partition: p,
                key: None,
                value: Some(format!("{p}:{}", first + k).into_bytes()),
                headers: Vec::new(),
                timestamp: None,
            })
        })
        .collect();
    let offsets = rdkafka_produce(bootstrap, topic, &records);
    for (r, o) in records.iter().zip(&offsets) {
        let want = String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into_owned();
        assert_eq!(
            format!("{}:{o}", r.partition),
            want,
            "acks=all offsets must follow the order of production on a fresh topic"
        );
    }
}

/// [`rdkafka_produce`] with extra producer settings.
pub fn rdkafka_produce_with(
    bootstrap: &str,
    topic: &str,
    records: &[TestRecord],
    config: &[(&str, &str)],
) -> Vec<i64> {
    let producer = logged_producer(bootstrap, config);
    for (i, r) in records.iter().enumerate() {
        send_record(&producer, topic, i, r);
        producer.poll(Duration::ZERO);
    }
    producer
        .flush(Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("rdkafka flush: {e}"));
    let reports = producer.context().reports.lock().expect("delivery log").clone();
    records
        .iter()
        .enumerate()
        .map(|(i, r)| match reports.get(&i) {
            None => panic!("no delivery report for record {i}"),
            Some(Err(e)) => panic!("rdkafka delivery of record {i} failed: {e}"),
            Some(Ok((p, o))) => {
                assert_eq!(*p, r.partition, "record {i} delivered to partition {p}");
                *o
            }
        })
        .collect()
}

/// Reads `topic`/`partition` with an rdkafka consumer assigned at `start` until `count`
/// records were read (or `timeout`). Uses assign (no consumer group).
pub fn rdkafka_consume(
    bootstrap: &str,
    topic: &str,
    partition: i32,
    start: Offset,
    count: usize,
    timeout: Duration,
) -> Vec<Consumed> {
    let consumer = assign_consumer(bootstrap);
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, start)
        .expect("add partition");
    consumer.assign(&tpl).expect("assign");
    poll_records(&consumer, count, timeout)
}

/// Reads each partition `p` of `ends` from the beginning up to `ends[p]` with rdkafka.
pub fn rdkafka_read_all(bootstrap: &str, topic: &str, ends: &BTreeMap<i32, i64>) -> Vec<Consumed> {
    let mut all = Vec::new();
    for (&p, &end) in ends {
        all.extend(rdkafka_consume(
            bootstrap,
            topic,
            p,
            Offset::Beginning,
            usize::try_from(end).unwrap_or(0),
            Duration::from_secs(60),
        ));
    }
    all
}

/// An rdkafka consumer for assign/seek use: no commits, `auto.offset.reset=error`.
///
/// librdkafka refuses `assign` without a `group.id` ("Unknown group"), so one is set; no
/// group protocol is used, but librdkafka still looks the coordinator up (FindCoordinator)
/// in the background and reports failures of that as non-fatal errors.
pub fn assign_consumer(bootstrap: &str) -> BaseConsumer {
    base_config(bootstrap)
        .set("group.id", "strand-compat-assign-only")
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "error")
        .set("enable.partition.eof", "false")
        .create()
        .unwrap_or_else(|e| panic!("create rdkafka consumer: {e}"))
}

/// Polls `consumer` until `count` records were read; panics on a partition error (offset out
/// of range, unknown partition...) or timeout. Other errors (e.g. about the unused group
/// coordinator) are logged and polling goes on.
pub fn poll_records(consumer: &BaseConsumer, count: usize, timeout: Duration) -> Vec<Consumed> {
    let deadline = Instant::now() + timeout;
    let mut out = Vec::with_capacity(count);
    while out.len() < count {
        assert!(
            Instant::now() < deadline,
            "rdkafka consumer read {} of {count} records within {timeout:?}",
            out.len()
        );
        match consumer.poll(Duration::from_millis(100)) {
            None => {}
            Some(Err(KafkaError::MessageConsumption(code)))
                if !matches!(
                    code,
                    RDKafkaErrorCode::OffsetOutOfRange
                        | RDKafkaErrorCode::AutoOffsetReset
                        | RDKafkaErrorCode::UnknownTopicOrPartition
                        | RDKafkaErrorCode::UnknownPartition
                        | RDKafkaErrorCode::UnknownTopic
                        | RDKafkaErrorCode::InvalidMessage
                        | RDKafkaErrorCode::BadMessage
                ) =>
            {
                eprintln!(
                    "[rdkafka consumer] non-fatal error after {} records: {code:?}",
                    out.len()
                );
            }
            Some(Err(e)) => panic!("rdkafka consumer error after {} records: {e}", out.len()),
            Some(Ok(m)) => out.push(consumed_from_rdkafka(&m)),
        }
    }
    out
}

/// Converts an rdkafka message.
pub fn consumed_from_rdkafka<M: Message>(m: &M) -> Consumed {
    let headers = m
        .headers()
        .map(|h| {
            h.iter()
                .map(|h| (h.key.to_string(), h.value.map(|v| v.to_vec())))
                .collect()
        })
        .unwrap_or_default();
    Consumed {
        partition: m.partition(),
        offset: m.offset(),
        key: m.key().map(|k| k.to_vec()),
        value: m.payload().map(|v| v.to_vec()),
        headers,
        timestamp: m.timestamp().to_millis(),
    }
}

/// Which Python client library a script uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PythonClient {
    /// `confluent-kafka` (librdkafka underneath).
    ConfluentKafka,
    /// `kafka-python` (pure Python).
    KafkaPython,
}

impl PythonClient {
    /// The script's file name in [`tools::python_scripts_dir`].
    pub fn script(self) -> &'static str {
        match self {
            PythonClient::ConfluentKafka => "confluent_client.py",
            PythonClient::KafkaPython => "kafka_python_client.py",
        }
    }
}

/// Runs a Python client script: `<script> <args...>` with `input` as JSON on stdin; returns
/// its JSON answer (stdout). Panics with its stderr on failure.
pub fn python_client(
    client: PythonClient,
    args: &[String],
    input: &serde_json::Value,
    timeout: Duration,
) -> serde_json::Value {
    let py = tools::python();
    let script = tools::python_scripts_dir().join(client.script());
    let mut cmd = Command::new(&py);
    cmd.arg(&script).args(args).env_remove("LD_LIBRARY_PATH");
    let (status, out, err) =
        tools::run_with_input(cmd, serde_json::to_vec(input).expect("json").as_slice(), timeout);
    let err = String::from_utf8_lossy(&err);
    assert!(
        status.success(),
        "{} {args:?} failed with {status}; stderr:\n{err}",
        script.display()
    );
    let answer: serde_json::Value = serde_json::from_slice(&out).unwrap_or_else(|e| {
        panic!(
            "{} printed no valid JSON ({e}); stdout:\n{}\nstderr:\n{err}",
            script.display(),
            String::from_utf8_lossy(&out)
        )
    });
    if let Some(name) = answer.get("client").and_then(|c| c.as_str()) {
        eprintln!(
            "[{name}] {}",
            args.first().map(String::as_str).unwrap_or_default()
        );
    }
    answer
}

/// Python: produce `records` to `topic` with acks=all; returns the offsets in input order.
pub fn python_produce(
    client: PythonClient,
    bootstrap: &str,
    topic: &str,
    records: &[TestRecord],
) -> Vec<i64> {
    python_produce_with(client, bootstrap, topic, records, &[], Duration::from_secs(120)).0
}

/// Like [`python_produce`], with extra `produce` options for the script (e.g.
/// `--idempotence default`, `--chunk 50 --pause-ms 20`; see `common.py`) and a time limit.
/// Returns the offsets in input order and the script's whole JSON answer.
pub fn python_produce_with(
    client: PythonClient,
    bootstrap: &str,
    topic: &str,
    records: &[TestRecord],
    options: &[&str],
    timeout: Duration,
) -> (Vec<i64>, serde_json::Value) {
    let input = serde_json::json!({
        "records": records.iter().map(data::record_to_json).collect::<Vec<_>>()
    });
    let mut args: Vec<String> = vec![
        "produce".into(),
        "--bootstrap".into(),
        bootstrap.into(),
        "--topic".into(),
        topic.into(),
    ];
    args.extend(options.iter().map(|o| o.to_string()));
    let out = python_client(client, &args, &input, timeout);
    let results = out
        .get("results")
        .and_then(|r| r.as_array())
        .expect("results array");
    assert_eq!(
        results.len(),
        records.len(),
        "{client:?} reported {} results",
        results.len()
    );
    let offsets = results
        .iter()
        .zip(records)
        .enumerate()
        .map(|(i, (r, rec))| {
            if let Some(e) = r.get("error").filter(|e| !e.is_null()) {
                panic!("{client:?} delivery of record {i} failed: {e}");
            }
            let p = r
                .get("partition")
                .and_then(|v| v.as_i64())
                .unwrap_or_else(|| panic!("{client:?} reported no partition for record {i}: {r}"));
            assert_eq!(
                p,
                i64::from(rec.partition),
                "{client:?} delivered record {i} to another partition"
            );
            // confluent-kafka reports a negative (invalid) offset as null.
            r.get("offset")
                .and_then(|v| v.as_i64())
                .unwrap_or_else(|| panic!("{client:?} reported no valid offset for record {i}: {r}"))
        })
        .collect();
    (offsets, out)
}

/// What each Python client wrote: its records and the offsets they were given.
pub struct PythonWrites {
    pub confluent: (Vec<TestRecord>, Vec<i64>),
    pub kafka_python: (Vec<TestRecord>, Vec<i64>),
}

/// confluent-kafka writes `n` varied records (seed `seed`) to `for_confluent`, kafka-python
/// `n` it can produce (seed `seed + 1`) to `for_kafka_python`, both over three fresh partitions
/// with acks=all; each is checked to get the offsets 0, 1, 2... per partition.
pub fn python_clients_write(
    bootstrap: &str,
    for_confluent: &str,
    for_kafka_python: &str,
    n: usize,
    seed: u64,
) -> PythonWrites {
    let a = data::varied_records(n, 3, seed);
    let a_offsets = python_produce(PythonClient::ConfluentKafka, bootstrap, for_confluent, &a);
    assert_eq!(
        a_offsets,
        data::sequential_offsets(&a),
        "confluent-kafka acks=all offsets"
    );
    let b = data::kafka_python_producible(data::varied_records(n, 3, seed + 1));
    let b_offsets = python_produce(PythonClient::KafkaPython, bootstrap, for_kafka_python, &b);
    assert_eq!(
        b_offsets,
        data::sequential_offsets(&b),
        "kafka-python acks=all offsets"
    );
    PythonWrites {
        confluent: (a, a_offsets),
        kafka_python: (b, b_offsets),
    }
}

/// Python: read each partition `p` in `ends` from `start` up to (excluding) `ends[p]` with
/// assign/seek; returns what it read.
pub fn python_consume(
    client: PythonClient,
    bootstrap: &str,
    topic: &str,
    start: i64,
    ends: &BTreeMap<i32, i64>,
) -> Vec<Consumed> {
    let ends_arg = ends
        .iter()
        .map(|(p, e)| format!("{p}={e}"))
        .collect::<Vec<_>>()
        .join(",");
    let out = python_client(
        client,
        &[
            "consume".into(),
            "--bootstrap".into(),
            bootstrap.into(),
            "--topic".into(),
            topic.into(),
            "--start".into(),
            start.to_string(),
            "--ends".into(),
            ends_arg,
        ],
        &serde_json::json!({}),
        Duration::from_secs(120),
    );
    out.get("messages")
        .and_then(|m| m.as_array())
        .expect("messages array")
        .iter()
        .map(|m| data::consumed_from_json(m).unwrap_or_else(|e| panic!("{client:?} output: {e}")))
        .collect()
}
