//! `kcat` (Debian's package: kcat 1.7.1 on the system's librdkafka, 2.0.2 on Debian 12) against
//! the broker: metadata listing and 100,000-message keyed round trips with headers for every
//! compression codec.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use strand_compat_tests::admin::{self, versions};
use strand_compat_tests::data::{hex, Gen};
use strand_compat_tests::{tools, unique_topic, Broker};

const MESSAGES: usize = 100_000;
const PARTITIONS: i32 = 3;
const KEY_DELIM: &str = "|K|";
const MSG_DELIM: &str = "|M|";
const HEADERS: [(&str, &str); 2] = [("suite", "strand-compat"), ("trace", "kcat-0001")];
/// Output format: partition, offset, key length, value length, headers, then the raw key and
/// value bytes (lengths make the parse binary-safe).
const FORMAT: &str = "%p\\t%o\\t%K\\t%S\\t%h\\t%k%s\\n";

fn kcat(bootstrap: &str) -> Command {
    let mut c = tools::kcat_command();
    c.arg("-b").arg(bootstrap);
    c
}

fn run(cmd: Command, stdin: &[u8], timeout: Duration) -> Vec<u8> {
    let desc = format!("{cmd:?}");
    let (status, out, err) = tools::run_with_input(cmd, stdin, timeout);
    assert!(
        status.success(),
        "{desc} failed with {status}; stderr:\n{}",
        String::from_utf8_lossy(&err)
    );
    out
}

#[test]
fn kcat_lists_broker_and_topics() {
    let broker = Broker::start();
    let bootstrap = broker.bootstrap();
    let t3 = admin::new_topic(&bootstrap, "kcat-list-a", 3);
    let t1 = unique_topic("kcat-list-b");
    admin::create_topic(&bootstrap, &t1, 1, &[]);

    let mut cmd = kcat(&bootstrap);
    cmd.args(["-L", "-m", "15"]);
    let text = String::from_utf8(run(cmd, b"", Duration::from_secs(30))).expect("utf-8 kcat -L output");

    // " 1 brokers:\n  broker 1 at 127.0.0.1:PORT (controller)"
    let brokers: Vec<(i32, String)> = text
        .lines()
        .filter_map(|l| {
            let rest = l.trim().strip_prefix("broker ")?;
            let (id, rest) = rest.split_once(" at ")?;
            let addr = rest.split_whitespace().next()?;
            Some((id.parse().ok()?, addr.to_string()))
        })
        .collect();
    assert_eq!(
        brokers.len(),
        1,
        "expected exactly one broker in kcat -L:\n{text}"
    );
    let (id, addr) = &brokers[0];
    assert_eq!(
        addr, &bootstrap,
        "kcat -L shows the advertised address, which must be the bound one:\n{text}"
    );
    if let Some(node) = broker.node_id() {
        assert_eq!(*id, node, "broker id in kcat -L:\n{text}");
    }
    assert!(text.contains(" 1 brokers:"), "kcat -L header line:\n{text}");

    for (topic, n) in [(&t3, 3), (&t1, 1)] {
        let header = format!("topic \"{topic}\" with {n} partitions:");
        let pos = text
            .find(&header)
            .unwrap_or_else(|| panic!("kcat -L lacks `{header}`:\n{text}"));
        let block: Vec<&str> = text[pos..].lines().skip(1).take(n).collect();
        for (p, line) in block.iter().enumerate() {
            let expected = format!("partition {p}, leader {id}, replicas: {id}, isrs: {id}");
            assert_eq!(
                line.trim(),
                expected,
                "partition line of {topic} in kcat -L:\n{text}"
            );
        }
    }

    // Listing one topic shows only that one.
    let mut cmd = kcat(&bootstrap);
    cmd.args(["-L", "-m", "15", "-t", &t1]);
    let one = String::from_utf8(run(cmd, b"", Duration::from_secs(30))).expect("utf-8");
    assert!(
        one.contains(&format!("topic \"{t1}\" with 1 partitions:")),
        "kcat -L -t:\n{one}"
    );
    assert!(!one.contains(&t3), "kcat -L -t {t1} also listed {t3}:\n{one}");
}

struct Sent {
    key: Vec<u8>,
    value: Vec<u8>,
}

/// Keys are `k<index>-` + binary bytes; values are text + binary bytes (NUL included); neither
/// contains `|`, so the multi-byte delimiters are unambiguous. Every 1000th value is empty.
fn generate(codec: &str, seed: u64) -> (Vec<Sent>, Vec<u8>) {
    let mut g = Gen::new(seed);
    let mut sent = Vec::with_capacity(MESSAGES);
    let mut input = Vec::with_capacity(MESSAGES * 110);
    for i in 0..MESSAGES {
        let mut key = format!("k{i:06}-").into_bytes();
        let klen = g.below(9) as usize;
        key.extend(g.bytes(klen, b"|"));
        let value = if i % 1000 == 7 {
            Vec::new()
        } else {
            let mut v = format!("v{i}-{codec}-").into_bytes();
            let vlen = g.below(120) as usize;
            v.extend(g.bytes(vlen, b"|"));
            v
        };
        input.extend_from_slice(&key);
        input.extend_from_slice(KEY_DELIM.as_bytes());
        input.extend_from_slice(&value);
        input.extend_from_slice(MSG_DELIM.as_bytes());
        sent.push(Sent { key, value });
    }
    (sent, input)
}

#[derive(Debug)]
struct Out {
    partition: i32,
    offset: i64,
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    headers: String,
}

fn parse_output(out: &[u8]) -> Vec<Out> {
    let mut res = Vec::new();
    let mut pos = 0;
    let field = |pos: &mut usize| -> String {
        let start = *pos;
        let end = out[start..]
            .iter()
            .position(|&b| b == b'\t')
            .map(|i| start + i)
            .unwrap_or_else(|| {
                panic!(
                    "kcat output: missing tab after byte {start}: {:?}",
                    String::from_utf8_lossy(&out[start..])
                )
            });
        *pos = end + 1;
        String::from_utf8(out[start..end].to_vec()).expect("ascii field")
    };
    while pos < out.len() {
        let partition: i32 = field(&mut pos).parse().expect("partition");
        let offset: i64 = field(&mut pos).parse().expect("offset");
        let klen: i64 = field(&mut pos).parse().expect("key length");
        let vlen: i64 = field(&mut pos).parse().expect("value length");
        let headers = field(&mut pos);
        let mut take = |len: i64| -> Option<Vec<u8>> {
            if len < 0 {
                return None;
            }
            let end = pos + len as usize;
            assert!(
                end <= out.len(),
                "kcat output truncated at partition {partition} offset {offset}"
            );
            let v = out[pos..end].to_vec();
            pos = end;
            Some(v)
        };
        let key = take(klen);
        let value = take(vlen);
        assert_eq!(
            out.get(pos),
            Some(&b'\n'),
            "kcat output: no newline after partition {partition} offset {offset}"
        );
        pos += 1;
        res.push(Out {
            partition,
            offset,
            key,
            value,
            headers,
        });
    }
    res
}

fn kcat_round_trip(codec: &str, seed: u64) {
    let broker = Broker::start();
    let bootstrap = broker.bootstrap();
    let topic = unique_topic(&format!("kcat-{codec}"));
    admin::create_topic(&bootstrap, &topic, PARTITIONS, &[]);
    let (sent, input) = generate(codec, seed);

    let started = Instant::now();
    let mut produce = kcat(&bootstrap);
    produce.args(["-P", "-t", &topic, "-K", KEY_DELIM, "-D", MSG_DELIM, "-z", codec]);
    produce.args([
        "-X",
        "acks=all",
        "-X",
        "linger.ms=20",
        "-X",
        "batch.num.messages=10000",
    ]);
    for (k, v) in HEADERS {
        produce.arg("-H").arg(format!("{k}={v}"));
    }
    run(produce, &input, Duration::from_secs(60));
    let produced_in = started.elapsed();

    let started = Instant::now();
    let mut consume = kcat(&bootstrap);
    // No -q: librdkafka's protocol errors then show in the failure message.
    consume.args(["-C", "-t", &topic, "-e", "-o", "beginning", "-f", FORMAT]);
    let out = run(consume, b"", Duration::from_secs(60));
    let consumed_in = started.elapsed();
    eprintln!("kcat {codec}: produced {MESSAGES} in {produced_in:?}, consumed in {consumed_in:?}");

    let got = parse_output(&out);
    assert_eq!(
        got.len(),
        MESSAGES,
        "kcat -C read {} messages, {MESSAGES} were produced",
        got.len()
    );
    let expected_headers = HEADERS
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");

    let mut seen = vec![false; MESSAGES];
    let mut per_partition: BTreeMap<i32, Vec<(i64, usize)>> = BTreeMap::new();
    for m in &got {
        let key = m
            .key
            .as_ref()
            .unwrap_or_else(|| panic!("null key at {}/{}", m.partition, m.offset));
        let index: usize = std::str::from_utf8(&key[1..7])
            .ok()
            .and_then(|s| s.parse().ok())
            .filter(|&i: &usize| i < MESSAGES && key[0] == b'k')
            .unwrap_or_else(|| panic!("unrecognised key {} at {}/{}", hex(key), m.partition, m.offset));
        assert!(
            !seen[index],
            "message {index} read twice (second at {}/{})",
            m.partition, m.offset
        );
        seen[index] = true;
        let s = &sent[index];
        assert_eq!(key, &s.key, "key of message {index} differs");
        assert_eq!(
            m.value.as_deref(),
            Some(s.value.as_slice()),
            "value of message {index} differs at {}/{}",
            m.partition,
            m.offset
        );
        assert_eq!(m.headers, expected_headers, "headers of message {index}");
        per_partition
            .entry(m.partition)
            .or_default()
            .push((m.offset, index));
    }
    assert_eq!(
        per_partition.len(),
        PARTITIONS as usize,
        "keys did not spread over all partitions"
    );

    let mut conn = admin::connect(&bootstrap);
    for (p, list) in &per_partition {
        assert!(
            list.len() > MESSAGES / 10,
            "partition {p} got only {} messages",
            list.len()
        );
        for (n, (offset, _)) in list.iter().enumerate() {
            assert_eq!(
                *offset, n as i64,
                "partition {p}: offsets must be 0..n-1 in order"
            );
        }
        for w in list.windows(2) {
            assert!(
                w[0].1 < w[1].1,
                "partition {p}: message {} stored after message {}",
                w[1].1,
                w[0].1
            );
        }
        assert_eq!(
            admin::latest(&mut conn, &topic, *p),
            list.len() as i64,
            "ListOffsets(latest) of {p}"
        );
    }

    // The broker stores batches as received: each batch keeps the codec its producer chose.
    // librdkafka sends a batch uncompressed when compressing would make it larger (small batches
    // of poorly compressible data, common with lz4's frame overhead), so batches of the
    // producer's codec and uncompressed ones may both appear, and nothing else.
    let want = match codec {
        "none" => 0,
        "gzip" => 1,
        "snappy" => 2,
        "lz4" => 3,
        "zstd" => 4,
        other => panic!("unknown codec {other}"),
    };
    let codecs = batch_codecs(&mut conn, &topic, 0);
    assert!(!codecs.is_empty(), "no batch fetched");
    assert!(
        codecs.iter().all(|c| *c == want || *c == 0),
        "stored batches carry codecs {codecs:?}, expected only {want} (or 0 where the producer chose not to compress)"
    );
    assert!(
        codecs.contains(&want),
        "no stored batch carries the producer's codec {want}: {codecs:?}"
    );
}

/// The codec (attribute bits 0-2) of each batch in the first megabyte of a partition.
fn batch_codecs(conn: &mut strand_compat_tests::raw::RawConn, topic: &str, partition: i32) -> Vec<i16> {
    use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
    use kafka_protocol::messages::{BrokerId, FetchRequest};
    let req = FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(0)
        .with_max_bytes(1 << 20)
        .with_session_epoch(-1)
        .with_topics(vec![FetchTopic::default()
            .with_topic(admin::topic_name(topic))
            .with_partitions(vec![FetchPartition::default()
                .with_partition(partition)
                .with_fetch_offset(0)
                .with_current_leader_epoch(-1)
                .with_last_fetched_epoch(-1)
                .with_log_start_offset(-1)
                .with_partition_max_bytes(1 << 20)])]);
    let resp = conn.request(versions::FETCH, &req).expect("Fetch");
    let records = resp.responses[0].partitions[0]
        .records
        .clone()
        .expect("records in the fetch answer");
    let mut codecs = Vec::new();
    let mut pos = 0usize;
    while pos + 61 <= records.len() {
        let len = i32::from_be_bytes(records[pos + 8..pos + 12].try_into().expect("4 bytes")) as usize;
        codecs.push(i16::from_be_bytes([records[pos + 21], records[pos + 22]]) & 7);
        pos += 12 + len;
    }
    codecs
}

#[test]
fn kcat_round_trip_none() {
    kcat_round_trip("none", 11);
}

#[test]
fn kcat_round_trip_gzip() {
    kcat_round_trip("gzip", 12);
}

#[test]
fn kcat_round_trip_snappy() {
    kcat_round_trip("snappy", 13);
}

#[test]
fn kcat_round_trip_lz4() {
    kcat_round_trip("lz4", 14);
}

#[test]
fn kcat_round_trip_zstd() {
    kcat_round_trip("zstd", 15);
}
