//! Admin APIs and offsets lookups with exact expected answers: CreateTopics, DeleteTopics,
//! CreatePartitions, DescribeConfigs, DeleteRecords, DescribeCluster, ListOffsets,
//! ApiVersions; plus configuration from the environment, start-up failures and `/metrics`.

use std::time::Duration;

use kafka_protocol::messages::delete_records_request::{DeleteRecordsPartition, DeleteRecordsTopic};
use kafka_protocol::messages::delete_topics_request::DeleteTopicState;
use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Message, StrBytes};
use kafka_protocol::records::Compression;
use strand_compat_tests::admin::{self, errors, versions, EARLIEST, LATEST, MAX_TIMESTAMP};
use strand_compat_tests::raw::{self, RawConn};
use strand_compat_tests::{metric_sum, metric_sum_where, unique_topic, wait_for, Broker};

const TOPIC_RESOURCE: i8 = 2;
const BROKER_RESOURCE: i8 = 4;
/// DescribeConfigs sources.
const DYNAMIC_TOPIC_CONFIG: i8 = 1;
const STATIC_BROKER_CONFIG: i8 = 4;
const DEFAULT_CONFIG: i8 = 5;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

fn create(c: &mut RawConn, req: &CreateTopicsRequest) -> CreateTopicsResponse {
    c.request(versions::CREATE_TOPICS, req).expect("CreateTopics")
}

fn topic_error(c: &mut RawConn, topic: &str) -> i16 {
    admin::metadata(c, &[topic], false).topics[0].error_code
}

#[test]
fn create_topics_validates_and_reports_exact_errors() {
    let broker = Broker::start();
    let bootstrap = broker.bootstrap();
    let mut c = admin::connect(&bootstrap);
    let topic = unique_topic("create");

    // validate_only: answered as a real creation would be, but nothing is created.
    let resp = create(
        &mut c,
        &admin::create_topics_request(&topic, 3, &[("retention.ms", "123456")], true),
    );
    assert_eq!(
        resp.topics[0].error_code, 0,
        "validate_only: {:?}",
        resp.topics[0].error_message
    );
    // Kafka answers a null error message on success; aiokafka asserts it.
    assert_eq!(resp.topics[0].error_message, None);
    assert_eq!(resp.topics[0].num_partitions, 3);
    assert_eq!(
        topic_error(&mut c, &topic),
        errors::UNKNOWN_TOPIC_OR_PARTITION,
        "validate_only created the topic"
    );

    let resp = create(
        &mut c,
        &admin::create_topics_request(&topic, 3, &[("retention.ms", "123456")], false),
    );
    let t = &resp.topics[0];
    assert_eq!((t.error_code, &t.error_message), (0, &None));
    assert_eq!(t.name.0.as_str(), topic);
    assert_eq!((t.num_partitions, t.replication_factor), (3, 1));
    assert!(!t.topic_id.is_nil(), "CreateTopics v7 returns the topic id");
    let configs = t
        .configs
        .as_ref()
        .expect("CreateTopics v5+ returns the topic's configs");
    let retention = configs
        .iter()
        .find(|c| c.name.as_str() == "retention.ms")
        .expect("retention.ms returned");
    assert_eq!(retention.value.as_ref().map(|v| v.as_str()), Some("123456"));
    assert_eq!(retention.config_source, DYNAMIC_TOPIC_CONFIG);
    let (id, partitions) = wait_for(Duration::from_secs(10), "the topic in Metadata", || {
        let md = admin::metadata(&mut c, &[&topic], false);
        let mt = &md.topics[0];
        (mt.error_code == 0 && mt.partitions.len() == 3).then_some((mt.topic_id, mt.partitions.len()))
    });
    assert_eq!(
        (id, partitions),
        (t.topic_id, 3),
        "Metadata agrees with CreateTopics"
    );

    // Exact errors, one topic at a time and mixed in one request.
    type Case<'a> = (&'a str, i32, Vec<(&'a str, &'a str)>, i16);
    let cases: Vec<Case<'_>> = vec![
        (topic.as_str(), 3, vec![], errors::TOPIC_ALREADY_EXISTS),
        ("fresh", 0, vec![], errors::INVALID_PARTITIONS),
        ("fresh", -2, vec![], errors::INVALID_PARTITIONS),
        (
            "fresh",
            1,
            vec![("retention.ms", "not-a-number")],
            errors::INVALID_CONFIG,
        ),
        (
            "fresh",
            1,
            vec![("cleanup.policy", "shred")],
            errors::INVALID_CONFIG,
        ),
        (
            "fresh",
            1,
            vec![("no.such.topic.config", "1")],
            errors::INVALID_CONFIG,
        ),
    ];
    for (name, partitions, configs, want) in cases {
        let name = if name == "fresh" {
            unique_topic("create-bad")
        } else {
            name.to_string()
        };
        let resp = create(
            &mut c,
            &admin::create_topics_request(&name, partitions, &configs, false),
        );
        assert_eq!(
            resp.topics[0].error_code, want,
            "CreateTopics {name} partitions={partitions} configs={configs:?}: {:?}",
            resp.topics[0].error_message
        );
        if want != errors::TOPIC_ALREADY_EXISTS {
            assert_eq!(
                topic_error(&mut c, &name),
                errors::UNKNOWN_TOPIC_OR_PARTITION,
                "failed create left {name}"
            );
        }
    }
    let ok = unique_topic("create-mixed");
    let mut req = admin::create_topics_request(&ok, 2, &[], false);
    req.topics
        .extend(admin::create_topics_request(&topic, 2, &[], false).topics);
    let resp = create(&mut c, &req);
    let codes: Vec<(String, i16)> = resp
        .topics
        .iter()
        .map(|t| (t.name.0.to_string(), t.error_code))
        .collect();
    assert_eq!(
        codes,
        vec![(ok.clone(), 0), (topic.clone(), errors::TOPIC_ALREADY_EXISTS)]
    );
}

#[test]
fn delete_topics_by_name_and_by_id() {
    let broker = Broker::start();
    let bootstrap = broker.bootstrap();
    let mut c = admin::connect(&bootstrap);
    let by_name = unique_topic("del-name");
    let by_id = unique_topic("del-id");
    let first_id = admin::create_topic(&bootstrap, &by_name, 2, &[]);
    admin::create_topic(&bootstrap, &by_id, 1, &[]);
    admin::produce_values(&mut c, &by_name, 0, &[b"before", b"delete"]);

    let delete = |c: &mut RawConn, state: DeleteTopicState| -> DeleteTopicsResponse {
        let req = DeleteTopicsRequest::default()
            .with_topics(vec![state])
            .with_timeout_ms(30_000);
        c.request(versions::DELETE_TOPICS, &req).expect("DeleteTopics")
    };
    let resp = delete(
        &mut c,
        DeleteTopicState::default().with_name(Some(admin::topic_name(&by_name))),
    );
    let r = &resp.responses[0];
    assert_eq!(r.error_code, 0, "{:?}", r.error_message);
    assert_eq!(r.name.as_ref().map(|n| n.0.as_str()), Some(by_name.as_str()));
    wait_for(
        Duration::from_secs(10),
        "the deleted topic to leave Metadata",
        || (topic_error(&mut c, &by_name) == errors::UNKNOWN_TOPIC_OR_PARTITION).then_some(()),
    );
    let resp = delete(
        &mut c,
        DeleteTopicState::default().with_name(Some(admin::topic_name(&by_name))),
    );
    assert_eq!(
        resp.responses[0].error_code,
        errors::UNKNOWN_TOPIC_OR_PARTITION,
        "deleting twice"
    );

    // Re-created under the same name: a new, empty topic with a new id.
    let second_id = admin::create_topic(&bootstrap, &by_name, 1, &[]);
    assert_ne!(first_id, second_id, "a re-created topic needs a new topic id");
    assert_eq!(
        admin::latest(&mut c, &by_name, 0),
        0,
        "a re-created topic starts empty"
    );

    let (id, _) = admin::topic_info(&mut c, &by_id);
    let resp = delete(
        &mut c,
        DeleteTopicState::default().with_name(None).with_topic_id(id),
    );
    let r = &resp.responses[0];
    assert_eq!(r.error_code, 0, "delete by id: {:?}", r.error_message);
    assert_eq!(r.topic_id, id);
    wait_for(
        Duration::from_secs(10),
        "the topic deleted by id to leave Metadata",
        || (topic_error(&mut c, &by_id) == errors::UNKNOWN_TOPIC_OR_PARTITION).then_some(()),
    );
    let resp = delete(
        &mut c,
        DeleteTopicState::default()
            .with_name(None)
            .with_topic_id(uuid::Uuid::new_v4()),
    );
    assert_eq!(
        resp.responses[0].error_code,
        errors::UNKNOWN_TOPIC_ID,
        "delete by an unknown id"
    );
}

/// A topic deleted while producers write to it as fast as they can, with segments so small that
/// nearly every flush round creates a segment file and syncs the log's directory. The store must
/// not do I/O in a directory being deleted: a round failing on the missing directory took the
/// shard's storage offline, so that every later write to any topic failed.
#[test]
fn deleting_a_topic_while_it_is_written_keeps_the_broker_writing() {
    let broker = Broker::builder()
        .needs_spawned("runs its own one-shard broker, so that both topics share a store")
        .shards(1)
        .start();
    let bootstrap = broker.bootstrap();
    let stable = admin::new_topic(&bootstrap, "del-stable", 1);
    let mut c = admin::connect(&bootstrap);
    let value = vec![b'w'; 1000];
    for attempt in 0..6 {
        let busy = unique_topic("del-busy");
        admin::create_topic(&bootstrap, &busy, 1, &[("segment.bytes", "4096")]);
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writers: Vec<_> = (0..2)
            .map(|_| {
                let (bootstrap, busy, stop, value) =
                    (bootstrap.clone(), busy.clone(), stop.clone(), value.clone());
                std::thread::spawn(move || {
                    let mut c = admin::connect(&bootstrap);
                    let values: Vec<&[u8]> = vec![&value[..]; 3];
                    let mut written = 0u32;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let records: Vec<_> = values
                            .iter()
                            .map(|v| raw::record(None, Some(v), admin::now_ms()))
                            .collect();
                        let batch = raw::encode_batch(&records, Compression::None);
                        match c.request(
                            versions::PRODUCE,
                            &admin::produce_request(&busy, -1, vec![(0, batch)]),
                        ) {
                            Ok(r) if admin::produce_answer(&r, 0).error_code == 0 => written += 1,
                            // The topic is gone (or going): stop.
                            _ => break,
                        }
                    }
                    written
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(300));
        let req = DeleteTopicsRequest::default()
            .with_topics(vec![
                DeleteTopicState::default().with_name(Some(admin::topic_name(&busy)))
            ])
            .with_timeout_ms(30_000);
        let resp = c.request(versions::DELETE_TOPICS, &req).expect("DeleteTopics");
        assert_eq!(
            resp.responses[0].error_code, 0,
            "{:?}",
            resp.responses[0].error_message
        );
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let written: u32 = writers.into_iter().map(|w| w.join().expect("writer")).sum();
        assert!(
            written > 10,
            "attempt {attempt}: the writers wrote only {written} batches before the deletion"
        );
        let (error, _) = admin::produce(
            &mut c,
            &stable,
            0,
            raw::encode_batch(
                &[raw::record(None, Some(b"after"), admin::now_ms())],
                Compression::None,
            ),
        );
        assert_eq!(
            error,
            errors::NONE,
            "attempt {attempt}: a write to another topic after deleting a busy one; broker log:\n{}",
            broker.stderr_tail(20)
        );
        assert!(
            !broker.partition_dir(&busy, 0).exists(),
            "the deleted topic's directory is gone"
        );
    }
    broker.assert_never_panicked("deleting busy topics");
}

#[test]
fn create_partitions_increases_and_refuses_decrease() {
    let broker = Broker::start();
    let bootstrap = broker.bootstrap();
    let mut c = admin::connect(&bootstrap);
    let topic = admin::new_topic(&bootstrap, "partitions", 3);
    let grow = |c: &mut RawConn, name: &str, count: i32, validate_only: bool| -> (i16, Option<String>) {
        let req = admin::create_partitions_request(name, count, validate_only);
        let resp = c
            .request(versions::CREATE_PARTITIONS, &req)
            .expect("CreatePartitions");
        (
            resp.results[0].error_code,
            resp.results[0].error_message.as_ref().map(|m| m.to_string()),
        )
    };
    assert_eq!(grow(&mut c, &topic, 7, true).0, 0, "validate_only increase");
    assert_eq!(
        admin::topic_info(&mut c, &topic).1,
        3,
        "validate_only changed the partition count"
    );
    assert_eq!(grow(&mut c, &topic, 5, false).0, 0, "increase 3 -> 5");
    wait_for(Duration::from_secs(10), "5 partitions in Metadata", || {
        (admin::topic_info(&mut c, &topic).1 == 5).then_some(())
    });
    assert_eq!(admin::produce_values(&mut c, &topic, 4, &[b"new partition"]), 0);
    assert_eq!(
        grow(&mut c, &topic, 2, false).0,
        errors::INVALID_PARTITIONS,
        "decrease 5 -> 2"
    );
    assert_eq!(
        grow(&mut c, &topic, 5, false).0,
        errors::INVALID_PARTITIONS,
        "same count 5 -> 5"
    );
    assert_eq!(admin::topic_info(&mut c, &topic).1, 5);
    let missing = unique_topic("partitions-missing");
    assert_eq!(
        grow(&mut c, &missing, 4, false).0,
        errors::UNKNOWN_TOPIC_OR_PARTITION,
        "unknown topic"
    );
}

fn describe(
    c: &mut RawConn,
    resource_type: i8,
    name: &str,
    keys: Option<&[&str]>,
) -> describe_configs_response::DescribeConfigsResult {
    let req = DescribeConfigsRequest::default().with_resources(vec![DescribeConfigsResource::default()
        .with_resource_type(resource_type)
        .with_resource_name(s(name))
        .with_configuration_keys(keys.map(|k| k.iter().map(|k| s(k)).collect()))]);
    let mut resp = c
        .request(versions::DESCRIBE_CONFIGS, &req)
        .expect("DescribeConfigs");
    assert_eq!(resp.results.len(), 1);
    resp.results.remove(0)
}

/// IncrementalAlterConfigs of one topic config (`op`: 0 SET, 1 DELETE, 2 APPEND, 3 SUBTRACT);
/// the resource's error code.
fn alter_topic_config(c: &mut RawConn, topic: &str, key: &str, op: i8, value: &str) -> i16 {
    use kafka_protocol::messages::incremental_alter_configs_request::{
        AlterConfigsResource, AlterableConfig,
    };
    let req = IncrementalAlterConfigsRequest::default().with_resources(vec![AlterConfigsResource::default()
        .with_resource_type(TOPIC_RESOURCE)
        .with_resource_name(s(topic))
        .with_configs(vec![AlterableConfig::default()
            .with_name(s(key))
            .with_config_operation(op)
            .with_value(Some(s(value)))])]);
    let resp: IncrementalAlterConfigsResponse = c.request(1, &req).expect("IncrementalAlterConfigs");
    resp.responses[0].error_code
}

/// APPEND and SUBTRACT on a list config start from the value in force, the default when the
/// topic sets none, and SUBTRACT may leave an explicit empty list, as Kafka does (the
/// confluent-kafka suite's `test_incremental_alter_configs`).
#[test]
fn list_configs_append_to_and_subtract_from_their_default() {
    let broker = Broker::start();
    let bootstrap = broker.bootstrap();
    let mut c = admin::connect(&bootstrap);
    let value = |c: &mut RawConn, topic: &str| {
        let r = describe(c, TOPIC_RESOURCE, topic, Some(&["cleanup.policy"]));
        admin::config_map(&r.configs).remove("cleanup.policy")
    };
    let appended = unique_topic("append");
    admin::create_topic(&bootstrap, &appended, 1, &[]);
    assert_eq!(
        value(&mut c, &appended),
        Some((Some("delete".to_string()), DEFAULT_CONFIG))
    );
    assert_eq!(
        alter_topic_config(&mut c, &appended, "cleanup.policy", 2, "compact"),
        0
    );
    assert_eq!(
        value(&mut c, &appended),
        Some((Some("delete,compact".to_string()), DYNAMIC_TOPIC_CONFIG))
    );

    let subtracted = unique_topic("subtract");
    admin::create_topic(&bootstrap, &subtracted, 1, &[]);
    assert_eq!(
        alter_topic_config(&mut c, &subtracted, "cleanup.policy", 3, "delete"),
        0
    );
    assert_eq!(
        value(&mut c, &subtracted),
        Some((Some(String::new()), DYNAMIC_TOPIC_CONFIG)),
        "an explicit empty list, not the default"
    );
    // Set to an empty list directly, too; an empty item is still refused.
    assert_eq!(alter_topic_config(&mut c, &appended, "cleanup.policy", 0, ""), 0);
    assert_eq!(value(&mut c, &appended).and_then(|v| v.0), Some(String::new()));
    assert_eq!(
        alter_topic_config(&mut c, &appended, "cleanup.policy", 0, "delete,"),
        errors::INVALID_CONFIG
    );
}

fn node_id(broker: &Broker, c: &mut RawConn) -> i32 {
    let md = admin::metadata(c, &[], false);
    assert_eq!(md.brokers.len(), 1, "one broker in Metadata");
    let id = md.brokers[0].node_id.0;
    if let Some(configured) = broker.node_id() {
        assert_eq!(id, configured, "Metadata node id");
    }
    id
}

#[test]
fn describe_configs_for_topic_and_broker() {
    let broker = Broker::builder()
        .config("num.partitions", 4)
        .config("log.retention.ms", 86_400_000)
        .start();
    let bootstrap = broker.bootstrap();
    let mut c = admin::connect(&bootstrap);
    let topic = unique_topic("configs");
    admin::create_topic(
        &bootstrap,
        &topic,
        1,
        &[("retention.ms", "123456"), ("cleanup.policy", "delete")],
    );

    let r = describe(&mut c, TOPIC_RESOURCE, &topic, None);
    assert_eq!(r.error_code, 0, "{:?}", r.error_message);
    assert_eq!(
        (r.resource_type, r.resource_name.as_str()),
        (TOPIC_RESOURCE, topic.as_str())
    );
    let m = admin::config_map(&r.configs);
    assert_eq!(
        m.get("retention.ms"),
        Some(&(Some("123456".to_string()), DYNAMIC_TOPIC_CONFIG))
    );
    assert_eq!(
        m.get("cleanup.policy"),
        Some(&(Some("delete".to_string()), DYNAMIC_TOPIC_CONFIG))
    );
    for key in ["segment.bytes", "retention.bytes", "max.message.bytes"] {
        let (value, source) = m
            .get(key)
            .unwrap_or_else(|| panic!("topic config {key} missing: {m:?}"));
        let value = value.as_deref().unwrap_or_else(|| panic!("{key} has no value"));
        assert!(value.parse::<i64>().is_ok(), "{key}={value} is not a number");
        assert!(
            [STATIC_BROKER_CONFIG, DEFAULT_CONFIG].contains(source),
            "{key}: source {source} for a value not set on the topic"
        );
    }
    assert_eq!(
        m.get("segment.bytes").and_then(|v| v.0.clone()).as_deref(),
        Some("1073741824"),
        "Kafka's default"
    );

    let only = describe(&mut c, TOPIC_RESOURCE, &topic, Some(&["retention.ms"]));
    let names: Vec<&str> = only.configs.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, vec!["retention.ms"], "configuration_keys filter");

    let missing = describe(&mut c, TOPIC_RESOURCE, &unique_topic("configs-missing"), None);
    assert_eq!(missing.error_code, errors::UNKNOWN_TOPIC_OR_PARTITION);

    let id = node_id(&broker, &mut c);
    let r = describe(&mut c, BROKER_RESOURCE, &id.to_string(), None);
    assert_eq!(r.error_code, 0, "{:?}", r.error_message);
    let m = admin::config_map(&r.configs);
    for key in [
        "num.partitions",
        "log.retention.ms",
        "log.segment.bytes",
        "message.max.bytes",
        "log.dirs",
    ] {
        assert!(
            m.contains_key(key),
            "broker config {key} missing: {:?}",
            m.keys().collect::<Vec<_>>()
        );
    }
    if broker.is_spawned() {
        assert_eq!(m["num.partitions"], (Some("4".to_string()), STATIC_BROKER_CONFIG));
        assert_eq!(
            m["log.retention.ms"],
            (Some("86400000".to_string()), STATIC_BROKER_CONFIG)
        );
        let dirs = broker.data_dir().display().to_string();
        assert_eq!(m["log.dirs"], (Some(dirs), STATIC_BROKER_CONFIG));
        assert_eq!(
            m["message.max.bytes"],
            (Some("1048588".to_string()), DEFAULT_CONFIG),
            "Kafka's default"
        );
        // A topic inherits the broker's settings for what it does not set itself.
        let plain = admin::new_topic(&bootstrap, "configs-plain", 1);
        let t = describe(
            &mut c,
            TOPIC_RESOURCE,
            &plain,
            Some(&["retention.ms", "retention.bytes"]),
        );
        let m = admin::config_map(&t.configs);
        assert_eq!(
            m["retention.ms"],
            (Some("86400000".to_string()), STATIC_BROKER_CONFIG),
            "from log.retention.ms"
        );
        assert_eq!(
            m["retention.bytes"],
            (Some("-1".to_string()), DEFAULT_CONFIG),
            "Kafka's default"
        );
    }
}

#[test]
fn delete_records_moves_the_low_watermark() {
    let broker = Broker::start();
    let bootstrap = broker.bootstrap();
    let mut c = admin::connect(&bootstrap);
    let topic = admin::new_topic(&bootstrap, "delete-records", 2);
    let values: Vec<Vec<u8>> = (0..10).map(|i| format!("r{i}").into_bytes()).collect();
    for v in &values {
        admin::produce_values(&mut c, &topic, 0, &[v]);
    }
    let delete = |c: &mut RawConn, partition: i32, offset: i64| -> (i16, i64) {
        let req = DeleteRecordsRequest::default()
            .with_topics(vec![DeleteRecordsTopic::default()
                .with_name(admin::topic_name(&topic))
                .with_partitions(vec![DeleteRecordsPartition::default()
                    .with_partition_index(partition)
                    .with_offset(offset)])])
            .with_timeout_ms(30_000);
        let resp = c.request(versions::DELETE_RECORDS, &req).expect("DeleteRecords");
        let p = &resp.topics[0].partitions[0];
        (p.error_code, p.low_watermark)
    };
    assert_eq!(delete(&mut c, 0, 4), (0, 4));
    assert_eq!(
        admin::earliest(&mut c, &topic, 0),
        4,
        "ListOffsets(earliest) after DeleteRecords"
    );
    assert_eq!(admin::latest(&mut c, &topic, 0), 10);
    assert_eq!(
        admin::fetch(&mut c, &topic, 0, 2, 1 << 20).error_code,
        errors::OFFSET_OUT_OF_RANGE
    );
    let f = admin::fetch(&mut c, &topic, 0, 4, 1 << 20);
    assert_eq!(f.error_code, 0);
    assert_eq!(f.log_start_offset, 4);
    let got: Vec<(i64, Vec<u8>)> = f
        .records
        .iter()
        .map(|r| (r.0, r.2.as_ref().expect("value").to_vec()))
        .collect();
    let want: Vec<(i64, Vec<u8>)> = (4..10).map(|i| (i as i64, values[i].clone())).collect();
    assert_eq!(got, want);
    assert_eq!(
        delete(&mut c, 0, 2),
        (0, 4),
        "deleting below the low watermark changes nothing"
    );
    assert_eq!(
        delete(&mut c, 0, 11).0,
        errors::OFFSET_OUT_OF_RANGE,
        "beyond the high watermark"
    );
    assert_eq!(
        delete(&mut c, 0, -1),
        (0, 10),
        "-1 means up to the high watermark"
    );
    assert_eq!(admin::earliest(&mut c, &topic, 0), 10);
    assert_eq!(
        admin::produce_values(&mut c, &topic, 0, &[b"after"]),
        10,
        "offsets continue after DeleteRecords"
    );
    assert_eq!(delete(&mut c, 1, 0), (0, 0), "empty partition");
    assert_eq!(
        delete(&mut c, 7, 0).0,
        errors::UNKNOWN_TOPIC_OR_PARTITION,
        "missing partition"
    );
}

#[test]
fn describe_cluster_lists_the_node() {
    let broker = Broker::start();
    let bootstrap = broker.bootstrap();
    let mut c = admin::connect(&bootstrap);
    let id = node_id(&broker, &mut c);
    let md = admin::metadata(&mut c, &[], false);
    let resp = c
        .request(
            versions::DESCRIBE_CLUSTER,
            &DescribeClusterRequest::default().with_endpoint_type(1),
        )
        .expect("DescribeCluster");
    assert_eq!(resp.error_code, 0, "{:?}", resp.error_message);
    assert_eq!(resp.brokers.len(), 1);
    let b = &resp.brokers[0];
    assert_eq!(b.broker_id.0, id);
    assert_eq!(
        format!("{}:{}", b.host, b.port),
        bootstrap,
        "DescribeCluster advertises the bound address"
    );
    assert!(!resp.cluster_id.is_empty(), "cluster id");
    assert_eq!(
        Some(resp.cluster_id.as_str()),
        md.cluster_id.as_ref().map(|c| c.as_str()),
        "same cluster id as Metadata"
    );
    assert_eq!(resp.endpoint_type, 1);
}

#[test]
fn list_offsets_earliest_latest_by_timestamp_and_max_timestamp() {
    let broker = Broker::start();
    let bootstrap = broker.bootstrap();
    let mut c = admin::connect(&bootstrap);
    let topic = admin::new_topic(&bootstrap, "list-offsets", 2);

    // Offsets and CreateTime timestamps: 0:1000 1:1001 | 2:5000 | 3:3000 (three batches).
    for (batch, compression) in [
        (vec![1000i64, 1001], Compression::None),
        (vec![5000], Compression::Gzip),
        (vec![3000], Compression::None),
    ] {
        let recs: Vec<_> = batch
            .iter()
            .map(|&ts| raw::record(None, Some(b"v"), ts))
            .collect();
        let (err, _) = admin::produce(&mut c, &topic, 0, raw::encode_batch(&recs, compression));
        assert_eq!(err, 0);
    }
    let cases = [
        (EARLIEST, 0, -1),
        (LATEST, 4, -1),
        (0, 0, 1000),
        (1000, 0, 1000),
        (1001, 1, 1001),
        (1002, 2, 5000),
        (3000, 2, 5000),
        (4999, 2, 5000),
        (5000, 2, 5000),
        (5001, -1, -1),
        (MAX_TIMESTAMP, 2, 5000),
    ];
    for (ts, offset, timestamp) in cases {
        let (err, o, t) = admin::list_offset(&mut c, &topic, 0, ts);
        assert_eq!(err, 0, "ListOffsets({ts})");
        assert_eq!(o, offset, "ListOffsets({ts}) offset");
        if ts >= 0 || ts == MAX_TIMESTAMP {
            assert_eq!(t, timestamp, "ListOffsets({ts}) timestamp");
        }
    }
    // Empty partition.
    assert_eq!(admin::list_offset(&mut c, &topic, 1, EARLIEST).1, 0);
    assert_eq!(admin::list_offset(&mut c, &topic, 1, LATEST).1, 0);
    assert_eq!(
        admin::list_offset(&mut c, &topic, 1, 1000).1,
        -1,
        "by timestamp on an empty partition"
    );
    let (err, _, _) = admin::list_offset(&mut c, &unique_topic("lo-missing"), 0, LATEST);
    assert_eq!(err, errors::UNKNOWN_TOPIC_OR_PARTITION);
}

#[test]
fn api_versions_advertises_the_apis_the_suite_uses() {
    let broker = Broker::start();
    let mut c = admin::connect(&broker.bootstrap());
    let resp = admin::api_versions(&mut c);
    let needed: [(i16, i16, kafka_protocol::protocol::VersionRange); 11] = [
        (0, versions::PRODUCE, ProduceRequest::VERSIONS),
        (1, versions::FETCH, FetchRequest::VERSIONS),
        (2, versions::LIST_OFFSETS, ListOffsetsRequest::VERSIONS),
        (3, versions::METADATA, MetadataRequest::VERSIONS),
        (18, versions::API_VERSIONS, ApiVersionsRequest::VERSIONS),
        (19, versions::CREATE_TOPICS, CreateTopicsRequest::VERSIONS),
        (20, versions::DELETE_TOPICS, DeleteTopicsRequest::VERSIONS),
        (21, versions::DELETE_RECORDS, DeleteRecordsRequest::VERSIONS),
        (32, versions::DESCRIBE_CONFIGS, DescribeConfigsRequest::VERSIONS),
        (37, versions::CREATE_PARTITIONS, CreatePartitionsRequest::VERSIONS),
        (60, versions::DESCRIBE_CLUSTER, DescribeClusterRequest::VERSIONS),
    ];
    for (key, used, kafka) in needed {
        let k = resp
            .api_keys
            .iter()
            .find(|k| k.api_key == key)
            .unwrap_or_else(|| panic!("API {key} not advertised"));
        assert!(
            k.min_version <= used && used <= k.max_version,
            "API {key}: {}..{} lacks v{used}",
            k.min_version,
            k.max_version
        );
        // Kafka 4.x advertises Produce from v0 although it serves v3+ only: librdkafka stops
        // compressing produce requests otherwise (KAFKA-18659). Every other API advertises
        // exactly the schema's range at most.
        let kafka_min = if key == 0 { 0 } else { kafka.min };
        assert!(
            k.min_version >= kafka_min && k.max_version <= kafka.max,
            "API {key}: advertised {}..{} outside Kafka 4.1's {kafka}",
            k.min_version,
            k.max_version
        );
    }
    let produce = resp
        .api_keys
        .iter()
        .find(|k| k.api_key == 0)
        .expect("Produce advertised");
    assert_eq!(
        produce.min_version, 0,
        "Produce must be advertised from v0, as Kafka 4 does (KAFKA-18659)"
    );
    let mut keys: Vec<i16> = resp.api_keys.iter().map(|k| k.api_key).collect();
    let n = keys.len();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), n, "an API is advertised twice");
}

#[test]
fn configuration_from_kafka_environment_variables() {
    let broker = Broker::builder()
        .needs_spawned("sets the broker's environment")
        .env("KAFKA_NUM_PARTITIONS", 5)
        .env("KAFKA_AUTO_CREATE_TOPICS_ENABLE", "true")
        .start();
    let mut c = admin::connect(&broker.bootstrap());
    let topic = unique_topic("env-auto");
    wait_for(Duration::from_secs(10), "auto-creation through Metadata", || {
        let md = admin::metadata(&mut c, &[&topic], true);
        let t = &md.topics[0];
        (t.error_code == 0 && !t.partitions.is_empty()).then_some(())
    });
    assert_eq!(
        admin::topic_info(&mut c, &topic).1,
        5,
        "KAFKA_NUM_PARTITIONS=5 must apply to auto-created topics"
    );

    let off = Broker::builder()
        .needs_spawned("sets the broker's environment")
        .env("KAFKA_AUTO_CREATE_TOPICS_ENABLE", "false")
        .start();
    let mut c = admin::connect(&off.bootstrap());
    let topic = unique_topic("env-no-auto");
    let md = admin::metadata(&mut c, &[&topic], true);
    assert_eq!(
        md.topics[0].error_code,
        errors::UNKNOWN_TOPIC_OR_PARTITION,
        "auto.create.topics.enable=false"
    );
    assert_eq!(topic_error(&mut c, &topic), errors::UNKNOWN_TOPIC_OR_PARTITION);
}

/// The value of `name` in the environment of the broker's process.
fn process_env(broker: &Broker, name: &str) -> Option<String> {
    let pid = broker.pid().expect("a running broker");
    let environ = std::fs::read(format!("/proc/{pid}/environ")).expect("read the broker's environment");
    let prefix = format!("{name}=");
    environ
        .split(|b| *b == 0)
        .find_map(|kv| kv.strip_prefix(prefix.as_bytes()))
        .map(|v| String::from_utf8_lossy(v).into_owned())
}

/// mimalloc's purge delay in the broker, as the broker logs it at start-up (at debug level).
fn purge_delay_logged(broker: &Broker) -> Option<String> {
    let log = broker.log_text();
    let rest = log.split("purge_delay_ms=").nth(1)?;
    let digits: String = rest
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '-')
        .collect();
    Some(digits)
}

/// The broker tells mimalloc to keep freed memory for 10 s (a purge delay of 10000 ms), unless
/// `MIMALLOC_PURGE_DELAY` is set, whose value then stays; either way in its own process, without
/// running itself again with a changed environment.
#[test]
fn the_broker_keeps_freed_memory_unless_told_otherwise() {
    // Debug for the binary only: the line that reports the delay.
    let log_level = "info,strand=debug";
    let broker = Broker::builder()
        .needs_spawned("reads the broker's log and environment")
        .log_level(log_level)
        .start();
    let inherited = std::env::var("MIMALLOC_PURGE_DELAY").ok();
    assert_eq!(
        purge_delay_logged(&broker),
        Some(inherited.clone().unwrap_or_else(|| "10000".to_owned())),
        "the broker must run with a purge delay of 10000 ms or the MIMALLOC_PURGE_DELAY it inherited"
    );
    assert_eq!(
        process_env(&broker, "MIMALLOC_PURGE_DELAY"),
        inherited,
        "the broker's environment is the one it was started with"
    );
    let set = Broker::builder()
        .needs_spawned("sets the broker's environment")
        .log_level(log_level)
        .env("MIMALLOC_PURGE_DELAY", 250)
        .start();
    assert_eq!(
        purge_delay_logged(&set).as_deref(),
        Some("250"),
        "a value set by the caller is kept"
    );
}

#[test]
fn invalid_configuration_fails_start_up_with_a_clear_message() {
    let (status, log) = Broker::builder()
        .config("num.partitions", "many")
        .start_expecting_exit(Duration::from_secs(30));
    assert!(
        !status.success(),
        "the broker must refuse num.partitions=many; it exited with {status}"
    );
    assert!(
        log.contains("num.partitions"),
        "the error must name the key; log:\n{log}"
    );
}

#[test]
fn metrics_endpoint_serves_prometheus_text() {
    let broker = Broker::builder()
        .needs_spawned("reads the admin listener from the ready file")
        .start();
    let topic = unique_topic("metrics");
    admin::create_topic(&broker.bootstrap(), &topic, 1, &[]);
    let mut c = admin::connect(&broker.bootstrap());
    admin::produce_values(&mut c, &topic, 0, &[b"m"]);
    admin::fetch(&mut c, &topic, 0, 0, 1 << 20);
    let text = broker.metrics();
    let mut samples = 0;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        if line.starts_with('#') {
            assert!(
                line.starts_with("# TYPE ") || line.starts_with("# HELP ") || line.starts_with("# UNIT "),
                "bad comment line {line:?}"
            );
            continue;
        }
        let (name_labels, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("bad sample line {line:?}"));
        let name = name_labels.split('{').next().unwrap_or_default();
        assert!(
            !name.is_empty()
                && name
                    .chars()
                    .all(|ch| ch.is_ascii_alphanumeric() || ch == '_' || ch == ':'),
            "bad metric name in {line:?}"
        );
        assert!(
            value.parse::<f64>().is_ok() || ["+Inf", "-Inf", "NaN"].contains(&value),
            "bad sample value in {line:?}"
        );
        samples += 1;
    }
    assert!(samples > 0, "no samples in /metrics:\n{text}");
    // The produce went through its stages (frame read → staged → durable) and a flush round.
    for stage in ["staged", "durable"] {
        let label = format!("stage=\"{stage}\"");
        let count = metric_sum_where(&text, "strand_produce_stage_seconds_count", &label);
        assert!(count >= 1.0, "no produce recorded at stage {stage}:\n{text}");
    }
    assert!(
        metric_sum(&text, "strand_flush_wait_seconds_count") >= 1.0,
        "no flush round's wait recorded:\n{text}"
    );
}
