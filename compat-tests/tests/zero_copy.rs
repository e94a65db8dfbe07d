//! Zero-copy fetch (`strand.fetch.sendfile`, on by default): record data lying more than the
//! broker's page-cache guard behind a segment's written end (`page_cache_guard_bytes`: four
//! times the disk's read-ahead window, at least 32 MiB) goes from the segment file straight to
//! the client's socket with sendfile(2), in runs of at least 64 KiB of batches of at least
//! 16 KiB on average. Clients must read exactly what was produced, through that path (counted in
//! `strand_fetch_sendfile_bytes_total`), with it switched off (nothing counted), and when the
//! client's socket is full at the moment sendfile is tried: the broker then waits for room and
//! sends on (`strand_fetch_sendfile_waits_total`; a region the socket keeps refusing has its rest
//! read and copied, `strand_fetch_sendfile_copied_bytes_total`), and the answer still holds
//! whole batches.
//!
//! Every broker here keeps only 4 MiB of recent writes in memory
//! (`strand.log.direct.cache.bytes`), so the reads come from the segment files; the segment
//! size stays at its default (1 GiB), so the whole log is one segment.

use std::time::{Duration, Instant};

use kafka_protocol::messages::FetchResponse;
use kafka_protocol::records::RecordBatchDecoder;
use rdkafka::Offset;
use strand_compat_tests::admin::{self, versions};
use strand_compat_tests::data::{Gen, TestRecord};
use strand_compat_tests::{clients, metric_sum, raw, tools, unique_topic, Broker};

const KIB: usize = 1 << 10;
const MIB: u64 = 1 << 20;
/// The guard when the broker's log does not say (its smallest value).
const DEFAULT_GUARD_BYTES: u64 = 32 * MIB;
/// Record bytes sent with sendfile.
const SENDFILE_BYTES: &str = "strand_fetch_sendfile_bytes_total";
/// Bytes of sendfile regions read and copied instead because the client's socket was full.
const COPIED_BYTES: &str = "strand_fetch_sendfile_copied_bytes_total";
/// Times sendfile found the client's socket full and the broker waited for room.
const WAITS: &str = "strand_fetch_sendfile_waits_total";
/// The producer settings: batches of up to 1 MiB (librdkafka caps them at its
/// `message.max.bytes`, 1,000,000), uncompressed.
const BIG_BATCHES: [(&str, &str); 2] = [("batch.size", "1048576"), ("linger.ms", "20")];

/// A broker reading its logs from the files: 4 MiB of recent writes kept in memory.
fn start_broker(extra: &[(&str, &str)]) -> Broker {
    let mut b = Broker::builder()
        .needs_spawned("configures the broker's recent-writes memory and reads its log and /metrics")
        .config("strand.log.direct.cache.bytes", 4 * MIB);
    for (k, v) in extra {
        b = b.config(k, v);
    }
    b.start()
}

/// `page_cache_guard_bytes` as the broker logged it at start-up (with direct segment writes,
/// the default), or 32 MiB.
fn page_cache_guard(broker: &Broker) -> u64 {
    let log = broker.log_text();
    let logged = log.split("page_cache_guard_bytes=").nth(1).and_then(|rest| {
        rest.split(|c: char| !c.is_ascii_digit())
            .next()?
            .parse::<u64>()
            .ok()
    });
    match logged {
        Some(guard) => guard,
        None => {
            eprintln!("the broker logged no page_cache_guard_bytes; assuming {DEFAULT_GUARD_BYTES} bytes");
            DEFAULT_GUARD_BYTES
        }
    }
}

/// Record `i`: key `k<i>`, a value of an odd size between 20 and 60 KiB whose bytes derive
/// from `i`.
fn record(i: usize) -> TestRecord {
    let mut g = Gen::new(0x5E0D_F11E ^ i as u64);
    let len = (20 * KIB + g.below(40 * KIB as u64) as usize) | 1;
    let mut value = Vec::with_capacity(len + 8);
    while value.len() < len {
        value.extend_from_slice(&g.next_u64().to_le_bytes());
    }
    value.truncate(len);
    TestRecord {
        partition: 0,
        key: Some(format!("k{i}").into_bytes()),
        value: Some(value),
        headers: vec![],
        timestamp: None,
    }
}

/// Creates a one-partition topic and produces records of at least `bytes` value bytes in
/// total to it with rdkafka, in batches of about 1 MB; returns the records (record `i` at
/// offset `i`) and their value bytes.
fn produce(broker: &Broker, name: &str, bytes: u64) -> (String, Vec<TestRecord>, u64) {
    let bootstrap = broker.bootstrap();
    let topic = unique_topic(name);
    admin::create_topic(&bootstrap, &topic, 1, &[]);
    let mut records = Vec::new();
    let mut total = 0u64;
    while total < bytes {
        let r = record(records.len());
        total += r.value.as_ref().map_or(0, |v| v.len() as u64);
        records.push(r);
    }
    let started = Instant::now();
    let offsets = clients::rdkafka_produce_with(&bootstrap, &topic, &records, &BIG_BATCHES);
    assert_eq!(
        offsets,
        (0..records.len() as i64).collect::<Vec<i64>>(),
        "the records must land at offsets 0.. in the order sent"
    );
    eprintln!(
        "produced {} records, {total} value bytes, in {:?}",
        records.len(),
        started.elapsed()
    );
    (topic, records, total)
}

/// Where `got` and `want` first differ, for a failure message.
fn difference(got: Option<&[u8]>, want: Option<&[u8]>) -> String {
    match (got, want) {
        (Some(g), Some(w)) => {
            let at = g.iter().zip(w).position(|(a, b)| a != b);
            format!(
                "{} bytes read, {} produced, first differing byte at {}",
                g.len(),
                w.len(),
                at.map_or("none (one is a prefix of the other)".to_string(), |a| a
                    .to_string())
            )
        }
        (g, w) => format!(
            "read {:?} bytes, produced {:?} bytes",
            g.map(<[u8]>::len),
            w.map(<[u8]>::len)
        ),
    }
}

/// Checks that `got` (offset, key, value), in the order read, is `records` from offset 0 on,
/// byte for byte; returns how many were read.
fn check_records<'a>(
    who: &str,
    records: &[TestRecord],
    got: impl IntoIterator<Item = (i64, Option<&'a [u8]>, Option<&'a [u8]>)>,
) -> usize {
    let mut n = 0;
    for (offset, key, value) in got {
        assert_eq!(offset, n as i64, "{who}: record {n} read at offset {offset}");
        let r = records
            .get(n)
            .unwrap_or_else(|| panic!("{who}: read more than the {} records produced", records.len()));
        assert_eq!(
            key,
            r.key.as_deref(),
            "{who}: the key of offset {offset} differs from what was produced"
        );
        assert!(
            value == r.value.as_deref(),
            "{who}: the value of offset {offset} differs from what was produced: {}",
            difference(value, r.value.as_deref())
        );
        n += 1;
    }
    n
}

/// Reads the whole partition from offset 0 with rdkafka and checks every record.
fn rdkafka_read_back(bootstrap: &str, topic: &str, records: &[TestRecord]) {
    let started = Instant::now();
    let got = clients::rdkafka_consume(
        bootstrap,
        topic,
        0,
        Offset::Beginning,
        records.len(),
        Duration::from_secs(60),
    );
    assert!(
        got.iter().all(|c| c.partition == 0),
        "rdkafka read records of another partition"
    );
    let n = check_records(
        "rdkafka",
        records,
        got.iter()
            .map(|c| (c.offset, c.key.as_deref(), c.value.as_deref())),
    );
    assert_eq!(n, records.len(), "rdkafka read {n} of {} records", records.len());
    eprintln!("rdkafka read {n} records back in {:?}", started.elapsed());
}

/// kafka-python (pure Python) reading partition 0 from offset 0 until it has `count` records,
/// with 8 MiB per partition and fetch. Its CRC check is off (it is pure Python here, far too
/// slow for this much data): the test compares every byte itself. Writes each record to stdout
/// as big-endian offset (i64), key length and value length (i32, -1 for null), key, value.
const KAFKA_PYTHON_READ: &str = r#"
import struct, sys, time
from kafka import KafkaConsumer, TopicPartition

bootstrap, topic, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
consumer = KafkaConsumer(
    bootstrap_servers=bootstrap,
    group_id=None,
    enable_auto_commit=False,
    auto_offset_reset="none",
    check_crcs=False,
    max_partition_fetch_bytes=8 << 20,
    fetch_max_bytes=8 << 20,
)
tp = TopicPartition(topic, 0)
consumer.assign([tp])
consumer.seek(tp, 0)
out = sys.stdout.buffer
read = 0
deadline = time.time() + 80
while read < count:
    if time.time() > deadline:
        sys.exit("kafka-python timed out after %d of %d records" % (read, count))
    for recs in consumer.poll(timeout_ms=200).values():
        for m in recs:
            key, value = m.key, m.value
            out.write(struct.pack(">qii", m.offset, -1 if key is None else len(key),
                                  -1 if value is None else len(value)))
            if key is not None:
                out.write(key)
            if value is not None:
                out.write(value)
            read += 1
out.flush()
consumer.close()
"#;

/// One record as [`KAFKA_PYTHON_READ`] wrote it.
type Dumped = (i64, Option<Vec<u8>>, Option<Vec<u8>>);

fn parse_dump(mut out: &[u8]) -> Vec<Dumped> {
    fn take<'a>(out: &mut &'a [u8], n: usize) -> &'a [u8] {
        assert!(
            out.len() >= n,
            "kafka-python's output ends in the middle of a record"
        );
        let (head, rest) = out.split_at(n);
        *out = rest;
        head
    }
    fn bytes(out: &mut &[u8], len: i32) -> Option<Vec<u8>> {
        usize::try_from(len).ok().map(|n| take(out, n).to_vec())
    }
    let mut got = Vec::new();
    while !out.is_empty() {
        let head = take(&mut out, 16);
        let offset = i64::from_be_bytes(head[0..8].try_into().expect("8 bytes"));
        let key_len = i32::from_be_bytes(head[8..12].try_into().expect("4 bytes"));
        let value_len = i32::from_be_bytes(head[12..16].try_into().expect("4 bytes"));
        let key = bytes(&mut out, key_len);
        let value = bytes(&mut out, value_len);
        got.push((offset, key, value));
    }
    got
}

/// Reads the whole partition from offset 0 with kafka-python and checks every record.
fn kafka_python_read_back(bootstrap: &str, topic: &str, records: &[TestRecord]) {
    let started = Instant::now();
    let mut cmd = std::process::Command::new(tools::python());
    cmd.arg("-c")
        .arg(KAFKA_PYTHON_READ)
        .args([bootstrap, topic, &records.len().to_string()])
        .env_remove("LD_LIBRARY_PATH");
    let (status, out, err) = tools::run_with_input(cmd, b"", Duration::from_secs(100));
    assert!(
        status.success(),
        "kafka-python failed with {status}; stderr:\n{}",
        String::from_utf8_lossy(&err)
    );
    let got = parse_dump(&out);
    let n = check_records(
        "kafka-python",
        records,
        got.iter().map(|(o, k, v)| (*o, k.as_deref(), v.as_deref())),
    );
    assert_eq!(
        n,
        records.len(),
        "kafka-python read {n} of {} records",
        records.len()
    );
    eprintln!("kafka-python read {n} records back in {:?}", started.elapsed());
}

/// The sum over shards of counter `series` in `metrics` (0 when absent, not the -0 of an empty
/// sum).
fn counter(metrics: &str, series: &str) -> f64 {
    metric_sum(metrics, series) + 0.0
}

/// [`counter`] from the broker's `/metrics`, once `ok` holds for it or after `within`.
fn counter_when(broker: &Broker, series: &str, within: Duration, ok: impl Fn(f64) -> bool) -> f64 {
    let deadline = Instant::now() + within;
    loop {
        let v = counter(&broker.metrics(), series);
        if ok(v) || Instant::now() >= deadline {
            return v;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Two independent clients read a log whose first part lies far behind its end: every record
/// comes back at its offset, byte for byte, and a good part of the far data went by sendfile.
#[test]
fn far_records_are_sent_from_the_file_and_read_back_exactly() {
    let broker = start_broker(&[]);
    let bootstrap = broker.bootstrap();
    let guard = page_cache_guard(&broker);
    // 80 MiB with a 32 MiB guard: the first 48 MiB lie far behind the end.
    let far = 48 * MIB;
    let (topic, records, total) = produce(&broker, "zerocopy-far", guard + far);

    rdkafka_read_back(&bootstrap, &topic, &records);
    kafka_python_read_back(&bootstrap, &topic, &records);

    // Each client read the far part once: at least two thirds of one pass must have gone by
    // sendfile (the rest may have been copied because a socket was full).
    let want = (far * 2 / 3) as f64;
    let sent = counter_when(&broker, SENDFILE_BYTES, Duration::from_secs(10), |v| v >= want);
    let copied = counter(&broker.metrics(), COPIED_BYTES);
    eprintln!(
        "guard {guard} bytes, {total} value bytes produced; {SENDFILE_BYTES} = {sent}, {COPIED_BYTES} = \
         {copied}"
    );
    assert!(
        sent >= want,
        "{SENDFILE_BYTES} is {sent}: two clients each read the {far} bytes lying more than the {guard}-byte \
         page-cache guard behind the end, at least {want} of them must have gone by sendfile"
    );
    broker.assert_never_panicked("after the reads");
}

/// `strand.fetch.sendfile=false`: the same far data is served by copying, read back exactly,
/// and nothing is counted as sent with sendfile.
#[test]
fn sendfile_off_serves_the_same_bytes_and_counts_none() {
    let broker = start_broker(&[("strand.fetch.sendfile", "false")]);
    let bootstrap = broker.bootstrap();
    let guard = page_cache_guard(&broker);
    // 48 MiB with a 32 MiB guard: the first 16 MiB lie far behind the end.
    let (topic, records, total) = produce(&broker, "zerocopy-off", guard + 16 * MIB);

    rdkafka_read_back(&bootstrap, &topic, &records);

    // Once the broker has counted the answers out, it must have counted none as sendfile.
    let out = counter_when(
        &broker,
        "strand_kafka_bytes_out_total",
        Duration::from_secs(10),
        |v| v >= total as f64,
    );
    assert!(
        out >= total as f64,
        "strand_kafka_bytes_out_total is {out} after rdkafka read {total} value bytes"
    );
    let metrics = broker.metrics();
    let (sent, copied) = (counter(&metrics, SENDFILE_BYTES), counter(&metrics, COPIED_BYTES));
    eprintln!("{SENDFILE_BYTES} = {sent}, {COPIED_BYTES} = {copied}");
    // Each shard registers both counters when it starts, so they are listed (at 0): a 0 here
    // is the broker's count, not a missing series.
    for series in [SENDFILE_BYTES, COPIED_BYTES] {
        assert!(
            metrics
                .lines()
                .any(|l| l.strip_prefix(series).is_some_and(|r| r.starts_with(['{', ' ']))),
            "/metrics does not list {series}"
        );
    }
    assert_eq!(
        sent, 0.0,
        "{SENDFILE_BYTES} must stay 0 with strand.fetch.sendfile=false"
    );
    assert_eq!(
        copied, 0.0,
        "{COPIED_BYTES} must stay 0 with strand.fetch.sendfile=false"
    );
    broker.assert_never_panicked("after the reads");
}

/// A client that sends a large Fetch of far data and reads nothing for a while: the broker's
/// send fills the socket (24 MiB answer; loopback buffers hold a few MiB), sendfile cannot go
/// on, and the broker waits for room and sends on. The answer, read afterwards, must still be
/// one whole frame of whole, valid batches holding exactly what was produced, every byte of it
/// counted once as sent or copied.
///
/// Right after the produce: every write of the segment went through the one handle its reads
/// use, so the broker knows where they end and sends the far data from the file (a write through
/// a second handle, by a round that overlapped the one creating the file, left it reading them
/// about one time in six before that was fixed).
#[test]
fn a_client_that_does_not_read_gets_whole_answers_when_the_socket_is_full() {
    const ANSWER_BYTES: i32 = 24 << 20;
    let broker = start_broker(&[]);
    let bootstrap = broker.bootstrap();
    let guard = page_cache_guard(&broker);
    // 80 MiB with a 32 MiB guard: the 24 MiB asked for all lie far behind the end.
    let (topic, records, _) = produce(&broker, "zerocopy-full", guard + 48 * MIB);
    let before = sendfile_counters(&broker);
    let bytes = fetch_without_reading(&bootstrap, &topic, ANSWER_BYTES, &records);
    // A region is counted once it is all out.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut now = sendfile_counters(&broker);
    while now == before && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        now = sendfile_counters(&broker);
    }
    let (sent, copied, waits) = (now.0 - before.0, now.1 - before.1, now.2 - before.2);
    eprintln!("{bytes} record bytes; {SENDFILE_BYTES} +{sent}, {COPIED_BYTES} +{copied}, {WAITS} +{waits}");
    assert_eq!(
        sent + copied,
        bytes as f64,
        "{SENDFILE_BYTES} (+{sent}) and {COPIED_BYTES} (+{copied}) together must count the {bytes} \
         record bytes of the answer, one file region"
    );
    assert!(
        waits > 0.0,
        "{WAITS} did not grow: the client read nothing for a second while the broker sent a \
         {bytes}-byte answer of far data, so sendfile must have met a full socket and waited"
    );
    broker.assert_never_panicked("after the answer");
}

/// The sendfile counters summed over shards: bytes sent, bytes copied, waits for room.
fn sendfile_counters(broker: &Broker) -> (f64, f64, f64) {
    let m = broker.metrics();
    (
        counter(&m, SENDFILE_BYTES),
        counter(&m, COPIED_BYTES),
        counter(&m, WAITS),
    )
}

/// On a new connection, a Fetch of `answer_bytes` from offset 0 of partition 0; reads nothing
/// for a second (SO_RCVBUF is not set: the crate has no socket-option API at hand, and the
/// answer is far more than loopback buffers hold), then reads and checks the whole answer:
/// whole valid batches from offset 0 holding what was produced. Returns its record bytes.
fn fetch_without_reading(bootstrap: &str, topic: &str, answer_bytes: i32, records: &[TestRecord]) -> usize {
    let mut c = admin::connect(bootstrap);
    let mut req = admin::fetch_request(topic, 0, 0, answer_bytes);
    req.max_wait_ms = 0;
    let corr = c.send_request(versions::FETCH, &req).expect("send the Fetch");
    std::thread::sleep(Duration::from_secs(1));
    c.set_read_timeout(Duration::from_secs(30))
        .expect("set the read timeout");
    let answer = c.read_response().expect("the Fetch answer, whole");
    assert_eq!(answer.correlation_id, corr, "the answer's correlation id");
    let resp: FetchResponse = answer
        .decode(versions::FETCH)
        .expect("the Fetch answer decodes, with nothing left over");
    assert_eq!(resp.error_code, 0, "Fetch top-level error");
    let p = resp
        .responses
        .iter()
        .flat_map(|t| t.partitions.iter())
        .find(|p| p.partition_index == 0)
        .expect("the answer has partition 0");
    assert_eq!(p.error_code, 0, "partition 0's error code");
    let bytes = p.records.clone().unwrap_or_default();
    let (batches, covered) = raw::walk_batches(&bytes);
    assert_eq!(
        covered as usize,
        bytes.len(),
        "the answer's records are not whole valid batches: only the first {covered} of its {} bytes \
         ({} batches) check out",
        bytes.len(),
        batches.len()
    );
    assert!(
        bytes.len() as u64 >= 16 * MIB,
        "the answer holds {} record bytes of the {answer_bytes} asked for; the log has far more",
        bytes.len()
    );
    assert!(
        bytes.len() <= answer_bytes as usize,
        "the answer holds {} record bytes, over max_bytes {answer_bytes}",
        bytes.len()
    );
    let sets = RecordBatchDecoder::decode_all(&mut bytes.clone()).expect("the answer's batches decode");
    let n = check_records(
        "raw fetch",
        records,
        sets.iter()
            .flat_map(|s| s.records.iter())
            .map(|r| (r.offset, r.key.as_deref(), r.value.as_deref())),
    );
    let last = batches.last().map_or(-1, |b| b.last_offset);
    assert_eq!(
        n as i64,
        last + 1,
        "the answer's batches end at offset {last} but hold {n} records"
    );
    bytes.len()
}
