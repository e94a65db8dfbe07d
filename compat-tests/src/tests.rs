use super::data::*;
use super::raw::*;
use kafka_protocol::records::Compression;

fn batch_at(base: i64, n: usize, compression: Compression) -> Vec<u8> {
    let recs: Vec<_> = (0..n)
        .map(|i| record(None, Some(format!("v{i}").as_bytes()), 1000))
        .collect();
    encode_batch_at(base, &recs, compression).to_vec()
}

#[test]
fn walk_batches_finds_complete_batches_and_stops_at_a_torn_tail() {
    let a = batch_at(0, 3, Compression::None);
    let b = batch_at(3, 5, Compression::Gzip);
    let c = batch_at(8, 1, Compression::None);
    let mut file = [a.clone(), b.clone(), c.clone()].concat();
    let (batches, complete) = walk_batches(&file);
    assert_eq!(complete as usize, file.len());
    let got: Vec<(u64, u64, i64, i64)> = batches
        .iter()
        .map(|x| (x.position, x.size, x.base_offset, x.last_offset))
        .collect();
    let (la, lb, lc) = (a.len() as u64, b.len() as u64, c.len() as u64);
    assert_eq!(got, vec![(0, la, 0, 2), (la, lb, 3, 7), (la + lb, lc, 8, 8)]);

    // A torn last batch and zero pre-allocation are not batches.
    file.truncate(file.len() - 5);
    file.extend_from_slice(&[0u8; 4096]);
    let (batches, complete) = walk_batches(&file);
    assert_eq!(batches.len(), 2);
    assert_eq!(complete, la + lb);
    assert_eq!(walk_batches(&[0u8; 100]).0, vec![]);
}

#[test]
fn hex_round_trips_and_rejects_garbage() {
    let all: Vec<u8> = (0..=255).collect();
    assert_eq!(unhex(&hex(&all)), Some(all));
    assert_eq!(hex(b"\x00\xff"), "00ff");
    assert_eq!(unhex("0"), None);
    assert_eq!(unhex("zz"), None);
}

#[test]
fn consumed_json_distinguishes_null_and_empty() {
    let v = serde_json::json!({
        "partition": 2, "offset": 7, "key": null, "value": "",
        "headers": [["a", null], ["a", "01"], ["b", ""]], "timestamp": 5
    });
    let c = consumed_from_json(&v).expect("parse");
    assert_eq!(c.key, None);
    assert_eq!(c.value, Some(vec![]));
    assert_eq!(
        c.headers,
        vec![
            ("a".to_string(), None),
            ("a".to_string(), Some(vec![1])),
            ("b".to_string(), Some(vec![]))
        ]
    );
    assert_eq!((c.partition, c.offset, c.timestamp), (2, 7, Some(5)));
    assert!(consumed_from_json(&serde_json::json!({"partition": 1})).is_err());
}

#[test]
fn varied_records_are_deterministic_and_cover_the_corners() {
    let a = varied_records(200, 3, 9);
    assert_eq!(a, varied_records(200, 3, 9));
    assert_ne!(a, varied_records(200, 3, 10));
    assert!(a.iter().any(|r| r.key.is_none()));
    assert!(a.iter().any(|r| r.value.is_none()));
    assert!(a.iter().any(|r| r.value.as_deref() == Some(&[][..])));
    assert!(a.iter().any(|r| r.headers.iter().any(|h| h.1.is_none())));
    assert!(a
        .iter()
        .any(|r| r.headers.iter().filter(|h| h.0 == "dup").count() == 2));
    assert!(a.iter().all(|r| r.key.is_some() || r.value.is_some()));
    assert_eq!(a.iter().filter(|r| r.partition == 2).count(), 66);
}

#[test]
fn compare_read_back_catches_every_kind_of_difference() {
    let recs = varied_records(6, 2, 1);
    let offsets = vec![0, 0, 1, 1, 2, 2];
    let good: Vec<Consumed> = recs
        .iter()
        .zip(&offsets)
        .map(|(r, &o)| Consumed {
            partition: r.partition,
            offset: o,
            key: r.key.clone(),
            value: r.value.clone(),
            headers: r.headers.clone(),
            timestamp: r.timestamp,
        })
        .collect();
    assert!(compare_read_back("t", &recs, &offsets, &good, true).is_ok());
    let mut changed = good.clone();
    changed[3].value = Some(b"other".to_vec());
    assert!(compare_read_back("t", &recs, &offsets, &changed, true).is_err());
    let mut changed = good.clone();
    changed[1].headers.reverse();
    changed[1].headers.push(("x".into(), None));
    assert!(compare_read_back("t", &recs, &offsets, &changed, true).is_err());
    let mut changed = good.clone();
    changed[2].timestamp = Some(1);
    assert!(compare_read_back("t", &recs, &offsets, &changed, true).is_err());
    assert!(compare_read_back("t", &recs, &offsets, &changed, false).is_ok());
    assert!(compare_read_back("t", &recs, &offsets, &good[1..], true).is_err());
    let mut dup = good.clone();
    dup.push(good[0].clone());
    assert!(compare_read_back("t", &recs, &offsets, &dup, true).is_err());
}

#[test]
fn metric_sum_adds_label_sets_of_one_series_only() {
    let text = "# HELP strand_x_total x\nstrand_x_total{shard=\"0\"} 2\nstrand_x_total{shard=\"1\"} 3\n\
                strand_x_total_more{shard=\"0\"} 100\nstrand_y 7\n";
    assert_eq!(crate::metric_sum(text, "strand_x_total"), 5.0);
    assert_eq!(crate::metric_sum(text, "strand_y"), 7.0);
    assert_eq!(crate::metric_sum(text, "strand_z"), 0.0);
}

#[test]
fn group_events_round_trip_through_json_lines() {
    use super::group::Event;
    use super::members::MemberEvent;
    let events = vec![
        Event::Assigned(vec![0, 3]),
        Event::Assigned(vec![]),
        Event::Records(vec![(1, 7, "1:7".into()), (2, 0, String::new())]),
        Event::Committed([(0, 5), (3, 9)].into_iter().collect()),
        Event::CommitFailed {
            offsets: [(1, 2)].into_iter().collect(),
            error: "REBALANCE_IN_PROGRESS".into(),
        },
        Event::Error("boom".into()),
        Event::Note("commits frozen".into()),
        Event::Closed,
    ];
    for e in events {
        let line = e.to_json().to_string();
        let back = Event::from_json(&serde_json::from_str(&line).expect("json")).expect("event");
        assert_eq!(back, e, "{line}");
    }
    // The Python scripts write assignments unsorted at times; the parser sorts them.
    let v = serde_json::json!({"ev": "assigned", "partitions": [3, 0]});
    assert_eq!(Event::from_json(&v), Ok(Event::Assigned(vec![0, 3])));
    assert!(Event::from_json(&serde_json::json!({"ev": "what"})).is_err());
    assert!(Event::from_json(&serde_json::json!({"ev": "committed", "offsets": [[1]]})).is_err());
}

#[test]
fn ready_file_parses_the_documented_format() {
    let r: super::ReadyFile = serde_json::from_str(
        r#"{"pid": 1234, "kafka": [{"name": "PLAINTEXT", "addr": "127.0.0.1:41234"}], "admin": "127.0.0.1:45678"}"#,
    )
    .expect("parse");
    assert_eq!(
        (r.pid, r.kafka[0].name.as_str(), r.kafka[0].addr.as_str()),
        (1234, "PLAINTEXT", "127.0.0.1:41234")
    );
    assert_eq!(r.admin.as_deref(), Some("127.0.0.1:45678"));
}
