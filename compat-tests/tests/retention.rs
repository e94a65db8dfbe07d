//! Size-based retention: with small `segment.bytes` / `retention.bytes`, whole old segments are
//! deleted, the log start offset (ListOffsets earliest) moves to a segment's base offset, and
//! reads below it are out of range. Time retention after a restart keeps a segment until its
//! newest record expires.

use std::fs;
use std::time::Duration;

use kafka_protocol::records::Compression;
use rdkafka::consumer::BaseConsumer;
use rdkafka::consumer::Consumer;
use rdkafka::{Offset, TopicPartitionList};
use strand_compat_tests::admin::{self, errors};
use strand_compat_tests::clients;
use strand_compat_tests::raw;
use strand_compat_tests::{unique_topic, wait_for, Broker};

const SEGMENT_BYTES: u64 = 4096;
const RETENTION_BYTES: u64 = 8192;
const RECORDS: usize = 120;
const VALUE_LEN: usize = 400;

fn value(i: usize) -> Vec<u8> {
    let mut v = format!("retained-{i:04}-").into_bytes();
    v.resize(VALUE_LEN, b'a' + (i % 26) as u8);
    v
}

/// (base offset, size) of every `.log` segment, oldest first; also checks the index files
/// that belong to deleted segments are gone.
fn segments(dir: &std::path::Path) -> Vec<(i64, u64)> {
    let mut logs = Vec::new();
    let mut others = Vec::new();
    for e in fs::read_dir(dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display())) {
        let path = e.expect("entry").path();
        let stem = path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or_default()
            .to_string();
        let ext = path
            .extension()
            .and_then(|s| s.to_str())
            .unwrap_or_default()
            .to_string();
        let Ok(base) = stem.parse::<i64>() else { continue };
        if ext == "log" {
            logs.push((base, fs::metadata(&path).map(|m| m.len()).unwrap_or(0)));
        } else if ext == "index" || ext == "timeindex" {
            others.push((base, path));
        }
    }
    logs.sort();
    for (base, path) in others {
        assert!(
            logs.iter().any(|(b, _)| *b == base),
            "{} outlived its segment",
            path.display()
        );
    }
    logs
}

#[test]
fn size_retention_deletes_old_segments_and_moves_log_start() {
    let broker = Broker::builder()
        .needs_spawned("sets log.retention.check.interval.ms and reads the segment files")
        .config("log.retention.check.interval.ms", 200)
        .start();
    let bootstrap = broker.bootstrap();
    let topic = unique_topic("retention");
    admin::create_topic(
        &bootstrap,
        &topic,
        1,
        &[
            ("segment.bytes", &SEGMENT_BYTES.to_string()),
            ("retention.bytes", &RETENTION_BYTES.to_string()),
        ],
    );
    let mut conn = admin::connect(&bootstrap);
    // One record per batch, so segments roll at batch boundaries every ~9 records.
    for i in 0..RECORDS {
        let base = admin::produce_values(&mut conn, &topic, 0, &[&value(i)]);
        assert_eq!(base, i as i64);
    }
    let dir = broker.partition_dir(&topic, 0);
    assert!(dir.is_dir(), "no partition directory {}", dir.display());

    // Wait until retention ran: the first segment is gone and what is left fits the limit.
    let earliest = wait_for(
        Duration::from_secs(20),
        "size retention to delete old segments",
        || {
            let segs = segments(&dir);
            let total: u64 = segs.iter().map(|s| s.1).sum();
            let first = segs.first().map(|s| s.0).unwrap_or(0);
            let earliest = admin::earliest(&mut conn, &topic, 0);
            (first > 0 && earliest > 0 && total <= RETENTION_BYTES + SEGMENT_BYTES + 1024).then_some(earliest)
        },
    );
    let segs = segments(&dir);
    eprintln!("after retention: earliest {earliest}, segments {segs:?}");
    assert_eq!(
        earliest, segs[0].0,
        "ListOffsets(earliest) must be the base offset of the oldest segment"
    );
    assert!(segs.len() >= 2, "retention must keep the newest data: {segs:?}");
    assert!(
        segs.iter()
            .all(|s| s.1 <= SEGMENT_BYTES + (VALUE_LEN as u64 + 200)),
        "segments must roll at segment.bytes: {segs:?}"
    );
    assert_eq!(
        admin::latest(&mut conn, &topic, 0),
        RECORDS as i64,
        "log end unchanged by retention"
    );

    // Below the log start: OFFSET_OUT_OF_RANGE; at it: the retained records, intact.
    let f = admin::fetch(&mut conn, &topic, 0, 0, 1 << 20);
    assert_eq!(
        f.error_code,
        errors::OFFSET_OUT_OF_RANGE,
        "fetch at 0 after retention"
    );
    let f = admin::fetch(&mut conn, &topic, 0, earliest, 1 << 20);
    assert_eq!(f.error_code, 0);
    assert_eq!(
        f.log_start_offset, earliest,
        "log_start_offset in the fetch answer"
    );
    let got: Vec<(i64, Vec<u8>)> = admin::fetch_range(&mut conn, &topic, 0, earliest, RECORDS as i64)
        .iter()
        .map(|r| (r.0, r.2.as_ref().map(|b| b.to_vec()).unwrap_or_default()))
        .collect();
    let want: Vec<(i64, Vec<u8>)> = (earliest as usize..RECORDS)
        .map(|i| (i as i64, value(i)))
        .collect();
    assert_eq!(got.len(), want.len(), "records from the log start to the end");
    assert!(got == want, "retained records differ from what was produced");

    // A client positioned at 0 follows auto.offset.reset=earliest to the new log start.
    let consumer: BaseConsumer = clients::base_config(&bootstrap)
        .set("group.id", "strand-compat-assign-only")
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&topic, 0, Offset::Offset(0))
        .expect("tpl");
    consumer.assign(&tpl).expect("assign");
    let read = clients::poll_records(&consumer, 3, Duration::from_secs(30));
    assert_eq!(
        read.iter().map(|c| c.offset).collect::<Vec<_>>(),
        vec![earliest, earliest + 1, earliest + 2],
        "auto.offset.reset=earliest after OFFSET_OUT_OF_RANGE"
    );
    assert_eq!(
        read[0].value.as_deref(),
        Some(value(earliest as usize).as_slice())
    );
}

/// Time retention and timestamp lookups after a clean restart. A segment's newest records come
/// after its last time-index entry (one per `index.interval.bytes`); before `cecb161` a
/// restarted broker read the segment's largest timestamp back from that entry, so retention
/// deleted the segment while its newest records were still inside `retention.ms`, and
/// ListOffsets by timestamp skipped them.
#[test]
fn a_restart_keeps_a_segment_until_its_newest_record_expires() {
    let mut broker = Broker::builder()
        .needs_spawned("restarts the broker, sets log.retention.check.interval.ms, reads segment files")
        // No retention check while the first segment is written: its first 40 records are
        // expired, and a check while they are all it holds rolls it and deletes them, as
        // Kafka does with an expired active segment.
        .config("log.retention.check.interval.ms", 3_600_000)
        .start();
    let bootstrap = broker.bootstrap();
    let topic = unique_topic("time-retention");
    // One index entry ~32 batches into a segment of ~60.
    admin::create_topic(
        &bootstrap,
        &topic,
        1,
        &[
            ("segment.bytes", "65536"),
            ("index.interval.bytes", "32768"),
            ("retention.ms", "3600000"),
        ],
    );
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as i64;
    let expired_ms = now_ms - 7_200_000;
    let recent_ms = now_ms - 600_000;
    let dir = broker.partition_dir(&topic, 0);
    let mut conn = admin::connect(&bootstrap);
    let produce = |conn: &mut raw::RawConn, i: usize, ts: i64| {
        let value = vec![b'a' + (i % 26) as u8; 1024];
        let batch = raw::encode_batch(&[raw::record(None, Some(&value), ts)], Compression::None);
        let (err, base) = admin::produce(conn, &topic, 0, batch);
        assert_eq!((err, base), (0, i as i64), "produce record {i}");
    };
    // The first segment: expired records up to and past its index entry, then recent ones
    // until it rolls; then a few records in the next segment, older than those.
    let mut i = 0;
    while segments(&dir).len() < 2 {
        assert!(i < 200, "the first segment never rolled: {:?}", segments(&dir));
        produce(
            &mut conn,
            i,
            if i < 40 {
                expired_ms + i as i64
            } else {
                recent_ms + i as i64
            },
        );
        i += 1;
    }
    let first_segment_end = segments(&dir)[1].0;
    assert!(
        first_segment_end > 45,
        "the first segment holds recent records: {first_segment_end}"
    );
    for _ in 0..3 {
        produce(&mut conn, i, recent_ms - 1_000);
        i += 1;
    }
    // The record that rolled it opens the next segment, with the largest timestamp of all.
    let newest = (first_segment_end, recent_ms + first_segment_end);

    broker.terminate(Duration::from_secs(30));
    broker.set_config_for_restart("log.retention.check.interval.ms", 200);
    broker.restart();
    let mut conn = admin::connect(&bootstrap);
    // Ten retention checks.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        admin::earliest(&mut conn, &topic, 0),
        0,
        "retention deleted a segment whose newest record is inside retention.ms: {:?}",
        segments(&dir)
    );
    let (err, offset, ts) = admin::list_offset(&mut conn, &topic, 0, admin::MAX_TIMESTAMP);
    assert_eq!((err, (offset, ts)), (0, newest), "ListOffsets(max timestamp)");
    let (err, offset, ts) = admin::list_offset(&mut conn, &topic, 0, recent_ms);
    assert_eq!(
        (err, offset, ts),
        (0, 40, recent_ms + 40),
        "ListOffsets({recent_ms})"
    );
}
