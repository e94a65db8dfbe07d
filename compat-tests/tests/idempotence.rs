//! Idempotent producer (issue 4): no logical duplicates when acknowledgements are uncertain.
//!
//! A fault-injecting proxy of our own (`strand_tools::faultproxy`) sits between the clients and
//! the broker. The broker advertises the proxy's address (`advertised.listeners`), so every
//! client connection, after bootstrap too, goes through it. The proxy drops a seeded fraction of
//! Produce responses *after the broker appended*, closing the connection at once: the client
//! reconnects and retries batches whose fate it cannot know. An idempotent producer must then
//! still leave each record in the log exactly once, in order; without idempotence the same proxy
//! does produce duplicates (which proves that it bites).
//!
//! * `rdkafka_idempotent_producer_exactly_once_through_dropped_responses`: 100,000 numbered
//!   records, 5 % of Produce responses dropped: every delivery succeeds, each number is in the
//!   topic once, in order per partition, at the offset its delivery report named.
//! * `rdkafka_idempotent_producer_survives_kill9_and_restart`: the same, with a kill -9 and a
//!   restart of the broker mid-run: nothing acknowledged is lost, nothing is duplicated.
//! * `rdkafka_without_idempotence_duplicates_through_the_same_proxy`: the control experiment.
//! * `confluent_kafka_idempotent_producer_through_dropped_responses` and
//!   `kafka_python_default_producer_through_dropped_responses`: the Python clients.
//!   kafka-python 3.0 (the pinned version) enables idempotence by default and runs with no setting;
//!   librdkafka (hence confluent-kafka) defaults to `enable.idempotence=false`, so that one sets
//!   only `enable.idempotence=true`.
//! * `protocol_init_producer_id_sequences_epochs_and_duplicates`: the broker's answers, on the
//!   wire, compared with Apache Kafka 4's (see the test's comments for where each comes from).
//!
//! Until the broker serves InitProducerId, every idempotence test fails at once saying so
//! ([`require_init_producer_id`]) instead of waiting for client timeouts.
//!
//! The proxy's drop decisions come from a seed: `STRAND_TEST_FAULT_SEED=<n>` replaces each test's
//! default seed (printed by every test) to replay or vary a run.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use kafka_protocol::records::Compression;
use rdkafka::producer::{BaseProducer, Producer};
use rdkafka::Offset;
use strand_compat_tests::admin::{self, errors, versions};
use strand_compat_tests::clients::{self, Delivery, DeliveryLog, PythonClient};
use strand_compat_tests::data::{Consumed, TestRecord};
use strand_compat_tests::{raw, unique_topic, wait_for, Broker};
use strand_tools::faultproxy::{DropMode, FaultProxy, ProxyConfig, ProxyStats};

const PARTITIONS: i32 = 3;
/// Kafka's InitProducerId api key.
const INIT_PRODUCER_ID: i16 = 22;

/// The proxy seed: `$STRAND_TEST_FAULT_SEED` or the test's default.
fn fault_seed(default: u64) -> u64 {
    let seed = std::env::var("STRAND_TEST_FAULT_SEED")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(default);
    eprintln!("fault seed {seed} (replay with STRAND_TEST_FAULT_SEED={seed})");
    seed
}

/// Fails the test, saying why, unless the broker advertises an InitProducerId version the
/// clients use. Without it an idempotent client cannot get a producer id and would only time out.
fn require_init_producer_id(bootstrap: &str) {
    let mut c = admin::connect(bootstrap);
    match admin::advertised_versions(&mut c, INIT_PRODUCER_ID) {
        None => panic!(
            "the broker at {bootstrap} does not advertise InitProducerId (api key {INIT_PRODUCER_ID}) in \
             ApiVersions, so an idempotent producer cannot get a producer id: the idempotent producer \
             (issue 4: InitProducerId, per-partition producer state, duplicate detection) is not \
             implemented yet"
        ),
        Some((min, max)) => assert!(
            min <= versions::INIT_PRODUCER_ID && versions::INIT_PRODUCER_ID <= max,
            "the broker advertises InitProducerId v{min}..v{max}, without v{} (KIP-360 epoch bumps need \
             v3+; librdkafka 2.12 sends up to v4, kafka-python the highest both sides know; Kafka 4.1's \
             schema has v0..v5)",
            versions::INIT_PRODUCER_ID
        ),
    }
}

/// A broker whose advertised address is a fault proxy in front of it.
struct Proxied {
    broker: Broker,
    proxy: FaultProxy,
}

impl Proxied {
    /// Starts the proxy on an ephemeral port (dropping `drop_rate` of Produce responses, close
    /// mode), then the broker advertising the proxy's address, then points the proxy at the
    /// broker's bound address. A restarted broker binds the same port, so the proxy's upstream
    /// stays valid.
    fn start(drop_rate: f64, seed: u64) -> Proxied {
        let proxy = FaultProxy::start(ProxyConfig {
            listen: "127.0.0.1:0".into(),
            drop_rate,
            mode: DropMode::Close,
            seed,
            ..ProxyConfig::default()
        })
        .expect("start the fault proxy");
        let broker = Broker::builder()
            .needs_spawned("the broker must advertise the fault proxy's address")
            .config(
                "advertised.listeners",
                format!("PLAINTEXT://{}", proxy.local_addr()),
            )
            .start();
        proxy.set_upstream(broker.bootstrap());
        Proxied { broker, proxy }
    }

    /// Where clients connect: the proxy.
    fn client_bootstrap(&self) -> String {
        self.proxy.local_addr().to_string()
    }

    /// The broker's own address, for raw admin calls that bypass the proxy.
    fn direct(&self) -> String {
        self.broker.bootstrap()
    }

    fn stats(&self) -> ProxyStats {
        let s = self.proxy.stats();
        eprintln!("proxy: {s}");
        s
    }
}

/// Record `n`: partition `n % 3`, key `n` in decimal, value `value-<n>` plus `pad` bytes.
fn numbered(n: usize, pad: usize) -> TestRecord {
    let mut value = format!("value-{n}-").into_bytes();
    value.extend(std::iter::repeat_n(b'x', pad));
    TestRecord {
        partition: (n as i32) % PARTITIONS,
        key: Some(n.to_string().into_bytes()),
        value: Some(value),
        headers: Vec::new(),
        timestamp: None,
    }
}

/// Which number a consumed record is; panics on a record that is not one of ours (or is
/// damaged, or sits in the wrong partition).
fn number_of(c: &Consumed, pad: usize) -> usize {
    let n: usize = c
        .key
        .as_deref()
        .and_then(|k| std::str::from_utf8(k).ok())
        .and_then(|k| k.parse().ok())
        .unwrap_or_else(|| panic!("foreign record at {}/{}: key {:?}", c.partition, c.offset, c.key));
    let want = numbered(n, pad);
    assert!(
        c.partition == want.partition && c.value == want.value,
        "record at {}/{} has the key of number {n} but not its partition or value",
        c.partition,
        c.offset
    );
    n
}

/// Everything in every partition, from offset 0 to the log end: `(offset, number)` per
/// partition in offset order. Reads through `bootstrap` with an assigned rdkafka consumer;
/// the log ends come from ListOffsets on `direct`.
fn read_numbers(bootstrap: &str, direct: &str, topic: &str, pad: usize) -> BTreeMap<i32, Vec<(i64, usize)>> {
    let mut conn = admin::connect(direct);
    (0..PARTITIONS)
        .map(|p| {
            assert_eq!(
                admin::earliest(&mut conn, topic, p),
                0,
                "log start of {topic}/{p}"
            );
            let end = admin::latest(&mut conn, topic, p);
            let got = clients::rdkafka_consume(
                bootstrap,
                topic,
                p,
                Offset::Beginning,
                end as usize,
                Duration::from_secs(60),
            );
            let log: Vec<(i64, usize)> = got
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    assert_eq!(c.offset, i as i64, "{topic}/{p}: gap or reordering at offset {i}");
                    (c.offset, number_of(c, pad))
                })
                .collect();
            (p, log)
        })
        .collect()
}

/// What the topic holds compared with what was sent.
struct Audit {
    /// Number -> every (partition, offset) holding it.
    positions: HashMap<usize, Vec<(i32, i64)>>,
    /// Extra copies (a number held k times counts k - 1).
    duplicates: usize,
    /// Places where a partition's numbers do not increase.
    order_violations: Vec<String>,
    total: usize,
}

impl Audit {
    fn of(logs: &BTreeMap<i32, Vec<(i64, usize)>>) -> Audit {
        let mut positions: HashMap<usize, Vec<(i32, i64)>> = HashMap::new();
        let mut order_violations = Vec::new();
        let mut total = 0;
        for (&p, log) in logs {
            for w in log.windows(2) {
                if w[1].1 <= w[0].1 {
                    order_violations.push(format!(
                        "partition {p}: number {} at offset {} after number {} at offset {}",
                        w[1].1, w[1].0, w[0].1, w[0].0
                    ));
                }
            }
            for &(o, n) in log {
                positions.entry(n).or_default().push((p, o));
                total += 1;
            }
        }
        let duplicates = positions.values().map(|v| v.len() - 1).sum();
        Audit {
            positions,
            duplicates,
            order_violations,
            total,
        }
    }

    fn duplicated(&self) -> Vec<(usize, Vec<(i32, i64)>)> {
        let mut d: Vec<_> = self
            .positions
            .iter()
            .filter(|(_, v)| v.len() > 1)
            .map(|(n, v)| (*n, v.clone()))
            .collect();
        d.sort();
        d
    }

    fn missing<'a>(&self, numbers: impl Iterator<Item = &'a usize>) -> Vec<usize> {
        numbers
            .filter(|n| !self.positions.contains_key(n))
            .copied()
            .collect()
    }

    /// Each of `numbers` present once and nothing else, in order per partition, and every
    /// acknowledged number at the offset of its delivery report.
    fn assert_exactly_once_in_order(&self, sent: usize, reports: &BTreeMap<usize, Delivery>) {
        let mut problems = Vec::new();
        let missing = self.missing((0..sent).collect::<Vec<_>>().iter());
        if !missing.is_empty() {
            problems.push(format!(
                "{} numbers missing, e.g. {:?}",
                missing.len(),
                &missing[..missing.len().min(10)]
            ));
        }
        let dups = self.duplicated();
        if !dups.is_empty() {
            problems.push(format!(
                "{} duplicate copies of {} numbers, e.g. {:?}",
                self.duplicates,
                dups.len(),
                &dups[..dups.len().min(5)]
            ));
        }
        if !self.order_violations.is_empty() {
            problems.push(format!(
                "{} order violations, e.g. {:?}",
                self.order_violations.len(),
                &self.order_violations[..self.order_violations.len().min(5)]
            ));
        }
        let mut misplaced = Vec::new();
        for (n, r) in reports {
            if let (Ok((p, o)), Some(at)) = (r, self.positions.get(n)) {
                if at.first() != Some(&(*p, *o)) {
                    misplaced.push(format!("{n}: acknowledged at {p}/{o}, found at {at:?}"));
                }
            }
        }
        if !misplaced.is_empty() {
            problems.push(format!(
                "{} acknowledged offsets do not hold their record (a duplicate must be answered with the \
                 ORIGINAL offset), e.g. {:?}",
                misplaced.len(),
                &misplaced[..misplaced.len().min(5)]
            ));
        }
        assert!(
            problems.is_empty(),
            "the topic holds {} records for {sent} numbers sent:\n  {}",
            self.total,
            problems.join("\n  ")
        );
    }
}

/// rdkafka producer settings of the idempotent runs: idempotence on, the rest at librdkafka's
/// defaults (acks=all, retries unbounded, 5 requests in flight) except a generous message
/// timeout, small batches, so that 100,000 records travel in many Produce requests (each one a
/// chance for the proxy to drop its response), and the harness's quick reconnects
/// (`reconnect.backoff.max.ms=500`, see `clients::base_config`).
const IDEMPOTENT: &[(&str, &str)] = &[
    ("enable.idempotence", "true"),
    ("message.timeout.ms", "120000"),
    ("batch.num.messages", "200"),
];

/// An rdkafka producer (acks=all, delivery reports logged by record number) with `settings`.
fn producer(bootstrap: &str, settings: &[(&str, &str)]) -> BaseProducer<DeliveryLog> {
    clients::logged_producer(bootstrap, settings)
}

/// Sends records `0..count` (see [`numbered`]) and waits for every delivery report (at most
/// `flush_timeout`). Returns the reports by number.
fn send_numbers(
    producer: BaseProducer<DeliveryLog>,
    topic: &str,
    count: usize,
    flush_timeout: Duration,
) -> BTreeMap<usize, Delivery> {
    let started = Instant::now();
    for n in 0..count {
        clients::send_record(&producer, topic, n, &numbered(n, 0));
        producer.poll(Duration::ZERO);
    }
    if let Err(e) = producer.flush(flush_timeout) {
        let got = producer.context().reports.lock().expect("delivery log").len();
        panic!("rdkafka flush: {e} ({got} of {count} delivery reports after {flush_timeout:?})");
    }
    let reports = producer.context().reports.lock().expect("delivery log").clone();
    eprintln!(
        "rdkafka: {count} records, {} delivery reports, {} failed, in {:.1}s",
        reports.len(),
        reports.values().filter(|r| r.is_err()).count(),
        started.elapsed().as_secs_f64()
    );
    assert_eq!(reports.len(), count, "every record must get a delivery report");
    reports
}

/// Fails, naming `when` and the first failures, unless every delivery of `reports` succeeded.
fn assert_all_delivered(reports: &BTreeMap<usize, Delivery>, when: &str) {
    let failures: Vec<(usize, String)> = reports
        .iter()
        .filter_map(|(n, r)| r.as_ref().err().map(|e| (*n, e.clone())))
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} deliveries failed {when}, e.g. {:?}",
        failures.len(),
        reports.len(),
        &failures[..failures.len().min(5)]
    );
}

/// Sends `count` numbers through the proxy of `env` with producer `settings`, and checks that
/// the proxy dropped at least one Produce response (or the test proves nothing) and that
/// every delivery succeeded all the same. Returns the delivery reports.
fn send_through_drops(
    env: &Proxied,
    settings: &[(&str, &str)],
    topic: &str,
    count: usize,
) -> BTreeMap<usize, Delivery> {
    let producer = producer(&env.client_bootstrap(), settings);
    let reports = send_numbers(producer, topic, count, Duration::from_secs(150));
    let stats = env.stats();
    assert!(
        stats.produce_responses_dropped > 0,
        "the proxy dropped no Produce response ({stats}): the test proved nothing"
    );
    assert_all_delivered(&reports, "through the dropped responses");
    reports
}

#[test]
fn rdkafka_idempotent_producer_exactly_once_through_dropped_responses() {
    const COUNT: usize = 100_000;
    let env = Proxied::start(0.05, fault_seed(11));
    require_init_producer_id(&env.direct());
    let topic = unique_topic("idem-rdkafka");
    admin::create_topic(&env.direct(), &topic, PARTITIONS, &[]);

    let reports = send_through_drops(&env, IDEMPOTENT, &topic, COUNT);

    env.proxy.set_drop_rate(0.0);
    let logs = read_numbers(&env.client_bootstrap(), &env.direct(), &topic, 0);
    Audit::of(&logs).assert_exactly_once_in_order(COUNT, &reports);
}

#[test]
fn rdkafka_idempotent_producer_survives_kill9_and_restart() {
    const COUNT: usize = 100_000;
    let mut env = Proxied::start(0.05, fault_seed(22));
    require_init_producer_id(&env.direct());
    let topic = unique_topic("idem-kill9");
    admin::create_topic(&env.direct(), &topic, PARTITIONS, &[]);

    let p = producer(&env.client_bootstrap(), IDEMPOTENT);
    let live = p.context().reports.clone();
    let sender = {
        let topic = topic.clone();
        std::thread::spawn(move || send_numbers(p, &topic, COUNT, Duration::from_secs(150)))
    };
    let acked_now = || {
        live.lock()
            .expect("delivery log")
            .values()
            .filter(|r| r.is_ok())
            .count()
    };
    wait_for(
        Duration::from_secs(90),
        &format!("{} acknowledged records before the kill", COUNT / 3),
        || (acked_now() >= COUNT / 3 || sender.is_finished()).then_some(()),
    );
    env.broker.kill9();
    let acked_at_kill = acked_now();
    eprintln!("killed the broker with {acked_at_kill} of {COUNT} records acknowledged");
    assert!(
        acked_at_kill < COUNT,
        "the kill did not happen mid-run: every record was already acknowledged"
    );
    // Let the producer run into refused connections for a moment, then bring the broker back
    // on the same port (the proxy's upstream).
    std::thread::sleep(Duration::from_millis(500));
    env.broker.restart();
    let reports = sender.join().expect("producer thread");
    let stats = env.stats();
    assert!(
        stats.upstream_failures + stats.produce_responses_dropped > 0,
        "neither the kill nor the proxy disturbed the producer ({stats})"
    );

    env.proxy.set_drop_rate(0.0);
    let logs = read_numbers(&env.client_bootstrap(), &env.direct(), &topic, 0);
    let audit = Audit::of(&logs);
    let acked: Vec<usize> = reports
        .iter()
        .filter(|(_, r)| r.is_ok())
        .map(|(n, _)| *n)
        .collect();
    let lost = audit.missing(acked.iter());
    assert!(
        lost.is_empty(),
        "{} acknowledged records are not in the topic after kill -9 and restart, e.g. {:?}",
        lost.len(),
        &lost[..lost.len().min(10)]
    );
    // A correct broker lets every record through: the restart takes seconds, the message
    // timeout is 120 s, and retries are unbounded.
    assert_all_delivered(&reports, "across the restart");
    audit.assert_exactly_once_in_order(COUNT, &reports);
}

#[test]
fn rdkafka_without_idempotence_duplicates_through_the_same_proxy() {
    const COUNT: usize = 20_000;
    let env = Proxied::start(0.05, fault_seed(33));
    let topic = unique_topic("idem-off");
    admin::create_topic(&env.direct(), &topic, PARTITIONS, &[]);

    // Retries at librdkafka's default (unbounded), in flight at its default (1,000,000).
    let settings = [
        ("enable.idempotence", "false"),
        ("message.timeout.ms", "120000"),
        ("batch.num.messages", "100"),
    ];
    send_through_drops(&env, &settings, &topic, COUNT);
    let stats = env.stats();

    env.proxy.set_drop_rate(0.0);
    let logs = read_numbers(&env.client_bootstrap(), &env.direct(), &topic, 0);
    let audit = Audit::of(&logs);
    let lost = audit.missing((0..COUNT).collect::<Vec<_>>().iter());
    assert!(
        lost.is_empty(),
        "acknowledged records lost: {:?}",
        &lost[..lost.len().min(10)]
    );
    eprintln!(
        "without idempotence: {} records in the topic for {COUNT} sent ({} duplicates, {} order violations)",
        audit.total,
        audit.duplicates,
        audit.order_violations.len()
    );
    assert!(
        audit.duplicates > 0,
        "no duplicates without idempotence although {} Produce responses were dropped: the proxy does \
         not make acknowledgements uncertain ({stats})",
        stats.produce_responses_dropped
    );
}

/// Produces numbered records with a Python client through the proxy (a fifth of the Produce
/// responses dropped), then checks exactly-once, in order, at the reported offsets.
fn python_through_drops(client: PythonClient, idempotence: &str, seed: u64) {
    const COUNT: usize = 3_000;
    const PAD: usize = 100;
    let env = Proxied::start(0.2, fault_seed(seed));
    require_init_producer_id(&env.direct());
    let topic = unique_topic("idem-python");
    admin::create_topic(&env.direct(), &topic, PARTITIONS, &[]);
    let records: Vec<TestRecord> = (0..COUNT).map(|n| numbered(n, PAD)).collect();
    // Pauses between chunks of records (client settings untouched) make many small requests.
    let (offsets, answer) = clients::python_produce_with(
        client,
        &env.client_bootstrap(),
        &topic,
        &records,
        &[
            "--idempotence",
            idempotence,
            "--chunk",
            "50",
            "--pause-ms",
            "20",
            "--timeout",
            "100",
        ],
        Duration::from_secs(120),
    );
    assert_eq!(
        answer.get("enable_idempotence").and_then(|v| v.as_bool()),
        Some(true),
        "{client:?} did not run as an idempotent producer: {}",
        answer.get("enable_idempotence").cloned().unwrap_or_default()
    );
    let stats = env.stats();
    assert!(
        stats.produce_responses_dropped > 0,
        "the proxy dropped nothing ({stats})"
    );
    let reports: BTreeMap<usize, Delivery> = offsets
        .iter()
        .enumerate()
        .map(|(n, &o)| (n, Ok((records[n].partition, o))))
        .collect();
    env.proxy.set_drop_rate(0.0);
    let logs = read_numbers(&env.client_bootstrap(), &env.direct(), &topic, PAD);
    Audit::of(&logs).assert_exactly_once_in_order(COUNT, &reports);
}

#[test]
fn confluent_kafka_idempotent_producer_through_dropped_responses() {
    // librdkafka's default is enable.idempotence=false: turn it on, leave the rest alone.
    python_through_drops(PythonClient::ConfluentKafka, "on", 44);
}

#[test]
fn kafka_python_default_producer_through_dropped_responses() {
    // kafka-python's defaults: idempotence on, acks=all, unbounded retries, 5 in flight.
    python_through_drops(PythonClient::KafkaPython, "default", 55);
}

/// `n` records valued `<tag>-0`, `<tag>-1`, ... (no key).
fn tagged(tag: &str, n: usize) -> Vec<kafka_protocol::records::Record> {
    (0..n)
        .map(|i| raw::record(None, Some(format!("{tag}-{i}").as_bytes()), admin::now_ms()))
        .collect()
}

/// One idempotent batch of `n` records tagged `tag`: producer `pid`, `epoch`, sequences
/// `seq..seq + n`.
fn batch(pid: i64, epoch: i16, seq: i32, n: usize, tag: &str) -> bytes::Bytes {
    raw::encode_idempotent_batch(&tagged(tag, n), Compression::None, pid, epoch, seq)
}

/// The wire-level behaviour, case by case, against what Apache Kafka 4 answers. Sources (Kafka
/// trunk, storage module): `ProducerStateEntry.findDuplicateBatch` (a duplicate is a batch with
/// the same epoch and exactly the sequence range of one of the last 5 batches; it is answered
/// with the original offsets and not appended), `ProducerAppendInfo.checkProducerEpoch` (an
/// older epoch than the partition's -> `InvalidProducerEpochException`, INVALID_PRODUCER_EPOCH
/// (47); PRODUCER_FENCED is not used on this path since 2.7), `ProducerAppendInfo.checkSequence`
/// (a gap -> OUT_OF_ORDER_SEQUENCE_NUMBER (45); a new epoch must start at sequence 0; a producer
/// id with no state on the partition is accepted at ANY sequence: since KIP-360 the broker no
/// longer answers UNKNOWN_PRODUCER_ID (59) there), and `TransactionCoordinator.handleInitProducerId`
/// (without a transactional id every InitProducerId gets a NEW producer id with epoch 0, even
/// when it carries the current id and epoch; the Java client then bumps an idempotent producer's
/// epoch locally).
#[test]
fn protocol_init_producer_id_sequences_epochs_and_duplicates() {
    let mut broker = Broker::builder()
        .needs_spawned("kills and restarts the broker")
        .start();
    let bootstrap = broker.bootstrap();
    require_init_producer_id(&bootstrap);
    let topic = admin::new_topic(&bootstrap, "idem-raw", 1);
    let mut c = admin::connect(&bootstrap);
    let produce = |c: &mut raw::RawConn, b: &bytes::Bytes| admin::produce(c, &topic, 0, b.clone());
    let end = |c: &mut raw::RawConn| admin::latest(c, &topic, 0);

    // A new idempotent producer: an id >= 0, epoch 0; every producer gets its own id.
    let init = admin::init_producer_id(&mut c, -1, -1);
    assert_eq!(init.error_code, errors::NONE, "InitProducerId: {init:?}");
    let pid = init.producer_id.0;
    assert!(pid >= 0, "producer id {pid}");
    assert_eq!(init.producer_epoch, 0, "a new producer's epoch");
    let other = admin::init_producer_id(&mut c, -1, -1);
    assert_eq!(other.error_code, errors::NONE);
    assert_ne!(other.producer_id.0, pid, "two producers got the same producer id");

    // Sequences 0..4 append at offset 0.
    let a = batch(pid, 0, 0, 5, "a");
    assert_eq!(produce(&mut c, &a), (errors::NONE, 0), "first batch");
    assert_eq!(end(&mut c), 5);
    // The same batch again (a retry after a lost response): success with the ORIGINAL base
    // offset, nothing appended.
    assert_eq!(
        produce(&mut c, &a),
        (errors::NONE, 0),
        "a duplicate batch must be answered with its original base offset"
    );
    assert_eq!(end(&mut c), 5, "a duplicate batch was appended again");
    // A gap (5 expected, 10 sent): OUT_OF_ORDER_SEQUENCE_NUMBER, nothing appended.
    let (err, _) = produce(&mut c, &batch(pid, 0, 10, 5, "gap"));
    assert_eq!(err, errors::OUT_OF_ORDER_SEQUENCE_NUMBER, "a sequence gap");
    assert_eq!(end(&mut c), 5);
    // The next batch in sequence appends.
    let b = batch(pid, 0, 5, 5, "b");
    assert_eq!(produce(&mut c, &b), (errors::NONE, 5));
    assert_eq!(end(&mut c), 10);

    // A producer id the partition has no state for, at a non-zero sequence: Kafka 4 accepts it
    // (ProducerAppendInfo.checkSequence skips the check when there is no current epoch), and
    // from then on knows the producer: a resend is a duplicate.
    let unknown_pid = pid.max(other.producer_id.0) + 1_000_000;
    let u = batch(unknown_pid, 0, 7, 2, "u");
    assert_eq!(
        produce(&mut c, &u),
        (errors::NONE, 10),
        "Kafka 4 appends a batch of a producer id without state at any sequence (no UNKNOWN_PRODUCER_ID)"
    );
    assert_eq!(produce(&mut c, &u), (errors::NONE, 10), "resend of that batch");
    assert_eq!(end(&mut c), 12);

    // Re-initialising with the current id and epoch (KIP-360, v3+). Kafka 4, without a
    // transactional id, answers with a NEW producer id and epoch 0; bumping the epoch of the
    // same id is the other answer a client copes with. Either way the old producer id may then
    // continue with a higher epoch (the Java client bumps it locally), starting at sequence 0.
    let re = admin::init_producer_id(&mut c, pid, 0);
    assert_eq!(
        re.error_code,
        errors::NONE,
        "InitProducerId with the current id and epoch: {re:?}"
    );
    let bumped: i16 = if re.producer_id.0 == pid {
        assert!(
            re.producer_epoch > 0,
            "same producer id, epoch not bumped: {re:?}"
        );
        re.producer_epoch
    } else {
        assert_eq!(
            re.producer_epoch, 0,
            "a new producer id must start at epoch 0: {re:?}"
        );
        1
    };
    eprintln!(
        "re-init of producer {pid} epoch 0 -> producer {} epoch {}",
        re.producer_id.0, re.producer_epoch
    );
    let c1 = batch(pid, bumped, 0, 3, "c1");
    assert_eq!(
        produce(&mut c, &c1),
        (errors::NONE, 12),
        "a new epoch starting at sequence 0"
    );
    // The older epoch is fenced, even for what would have been a duplicate in that epoch.
    let (err, _) = produce(&mut c, &batch(pid, 0, 10, 2, "old"));
    assert_eq!(
        err,
        errors::INVALID_PRODUCER_EPOCH,
        "an older epoch than the partition's (Kafka 4: INVALID_PRODUCER_EPOCH, not PRODUCER_FENCED)"
    );
    let (err, _) = produce(&mut c, &b);
    assert_eq!(
        err,
        errors::INVALID_PRODUCER_EPOCH,
        "resend of a batch of the older epoch"
    );
    assert_eq!(end(&mut c), 15);
    let c2 = batch(pid, bumped, 3, 3, "c2");
    assert_eq!(produce(&mut c, &c2), (errors::NONE, 15));
    assert_eq!(end(&mut c), 18);

    // kill -9 and restart: the producer state comes back from the log (or a snapshot), so
    // resends of acknowledged batches are still duplicates and the sequence continues.
    broker.kill9();
    broker.restart();
    let mut c = admin::connect(&broker.bootstrap());
    assert_eq!(
        produce(&mut c, &c2),
        (errors::NONE, 15),
        "after a restart, a resend of the last batch must get its original offset"
    );
    assert_eq!(
        produce(&mut c, &c1),
        (errors::NONE, 12),
        "after a restart, an earlier batch"
    );
    assert_eq!(
        produce(&mut c, &u),
        (errors::NONE, 10),
        "after a restart, the other producer's batch"
    );
    assert_eq!(
        end(&mut c),
        18,
        "a batch resent after the restart was appended again"
    );
    let (err, _) = produce(&mut c, &batch(pid, bumped, 20, 1, "gap2"));
    assert_eq!(
        err,
        errors::OUT_OF_ORDER_SEQUENCE_NUMBER,
        "a gap after the restart"
    );
    let (err, _) = produce(&mut c, &batch(pid, 0, 10, 1, "old2"));
    assert_eq!(
        err,
        errors::INVALID_PRODUCER_EPOCH,
        "the older epoch after the restart"
    );
    assert_eq!(
        produce(&mut c, &batch(pid, bumped, 6, 2, "c3")),
        (errors::NONE, 18)
    );
    assert_eq!(end(&mut c), 20);
    // Producer ids are never handed out twice, restart or not.
    let after = admin::init_producer_id(&mut c, -1, -1);
    assert_eq!(after.error_code, errors::NONE);
    assert!(
        ![pid, other.producer_id.0, re.producer_id.0].contains(&after.producer_id.0),
        "producer id {} handed out again after the restart",
        after.producer_id.0
    );

    // The log holds each batch once, in order.
    let values: Vec<String> = admin::fetch_range(&mut c, &topic, 0, 0, 20)
        .into_iter()
        .map(|r| String::from_utf8_lossy(&r.2.unwrap_or_default()).into_owned())
        .collect();
    let expected: Vec<String> = [("a", 5), ("b", 5), ("u", 2), ("c1", 3), ("c2", 3), ("c3", 2)]
        .iter()
        .flat_map(|(t, n)| (0..*n).map(move |i| format!("{t}-{i}")))
        .collect();
    assert_eq!(values, expected, "the log after all the resends");
}
