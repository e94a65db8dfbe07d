//! The admin API's views of the cluster on one node (issue 44): DescribeTopicPartitions with
//! its cursor, DescribeLogDirs with real sizes, ListPartitionReassignments, DescribeQuorum,
//! and the authorized operations a describe reports without an authorizer; through raw
//! requests, kafka-python's admin client and confluent-kafka's.

use std::collections::BTreeSet;
use std::time::Duration;

use kafka_protocol::messages::describe_log_dirs_request::DescribableLogDirTopic;
use kafka_protocol::messages::describe_topic_partitions_request::{Cursor, TopicRequest};
use kafka_protocol::messages::*;
use kafka_protocol::ResponseError;
use strand_compat_tests::admin::{self, topic_name};
use strand_compat_tests::clients::{self, PythonClient};
use strand_compat_tests::{unique_topic, Broker};

/// Every (topic, partition) DescribeTopicPartitions lists for `topics`, following the cursor
/// with pages of `limit`; and the number of pages.
fn all_pages(
    c: &mut strand_compat_tests::raw::RawConn,
    topics: &[&str],
    limit: i32,
) -> (Vec<(String, i32)>, usize) {
    let mut seen = Vec::new();
    let mut cursor = None;
    for pages in 1..=100 {
        let req = DescribeTopicPartitionsRequest::default()
            .with_topics(
                topics
                    .iter()
                    .map(|t| TopicRequest::default().with_name(topic_name(t)))
                    .collect(),
            )
            .with_response_partition_limit(limit)
            .with_cursor(cursor.take());
        let resp = c.request(0, &req).expect("DescribeTopicPartitions");
        let listed: usize = resp.topics.iter().map(|t| t.partitions.len()).sum();
        assert!(
            listed <= limit as usize,
            "a page of {listed} partitions > {limit}"
        );
        for t in &resp.topics {
            admin::assert_ok(t.error_code, "topic");
            assert_eq!(t.topic_authorized_operations, 3576, "every topic operation");
            for p in &t.partitions {
                assert!(p.leader_id.0 >= 0 && p.replica_nodes == p.isr_nodes, "{p:?}");
                seen.push((t.name.as_ref().unwrap().to_string(), p.partition_index));
            }
        }
        match resp.next_cursor {
            None => return (seen, pages),
            Some(next) => {
                cursor = Some(
                    Cursor::default()
                        .with_topic_name(next.topic_name)
                        .with_partition_index(next.partition_index),
                )
            }
        }
    }
    panic!("the cursor never ends");
}

#[test]
fn describe_topic_partitions_pages_through_every_partition() {
    let broker = Broker::start();
    let bootstrap = broker.bootstrap();
    let (a, b) = (unique_topic("dtp-a"), unique_topic("dtp-b"));
    admin::create_topic(&bootstrap, &a, 5, &[]);
    admin::create_topic(&bootstrap, &b, 3, &[]);
    let mut c = admin::connect(&bootstrap);
    assert_eq!(admin::advertised_versions(&mut c, 75), Some((0, 0)));

    let mut want: Vec<(String, i32)> = (0..5)
        .map(|p| (a.clone(), p))
        .chain((0..3).map(|p| (b.clone(), p)))
        .collect();
    want.sort();
    for (limit, pages) in [(3, 3), (4, 2), (8, 1), (2000, 1), (1, 8)] {
        let (mut seen, n) = all_pages(&mut c, &[&b, &a], limit);
        seen.sort();
        assert_eq!(seen, want, "limit {limit}");
        assert_eq!(n, pages, "pages of {limit}");
    }

    // An unknown topic and an invalid name are reported; a cursor naming a topic the request
    // does not list is refused.
    let resp = c
        .request(
            0,
            &DescribeTopicPartitionsRequest::default()
                .with_topics(vec![
                    TopicRequest::default().with_name(topic_name("no-such-topic")),
                    TopicRequest::default().with_name(topic_name("bad/name")),
                ])
                .with_response_partition_limit(10),
        )
        .expect("DescribeTopicPartitions");
    let codes: Vec<(String, i16)> = resp
        .topics
        .iter()
        .map(|t| (t.name.as_ref().unwrap().to_string(), t.error_code))
        .collect();
    assert_eq!(
        codes,
        vec![
            (
                "bad/name".to_string(),
                ResponseError::InvalidTopicException.code()
            ),
            (
                "no-such-topic".to_string(),
                ResponseError::UnknownTopicOrPartition.code()
            ),
        ]
    );
    let resp = c
        .request(
            0,
            &DescribeTopicPartitionsRequest::default()
                .with_topics(vec![TopicRequest::default().with_name(topic_name(&a))])
                .with_response_partition_limit(10)
                .with_cursor(Some(Cursor::default().with_topic_name(topic_name(&b)))),
        )
        .expect("DescribeTopicPartitions");
    admin::assert_code(
        resp.topics[0].error_code,
        ResponseError::InvalidRequest,
        "cursor elsewhere",
    );

    // kafka-python's admin client pages the same way, and sees the rest of the node's views.
    let dir = c
        .request(4, &DescribeLogDirsRequest::default().with_topics(Some(vec![])))
        .expect("DescribeLogDirs")
        .results[0]
        .log_dir
        .to_string();
    let node = admin::metadata(&mut c, &[], false).brokers[0].node_id.0;
    let out = clients::python_client(
        PythonClient::KafkaPython,
        &["cluster-admin".to_string()],
        &serde_json::json!({
            "bootstrap": bootstrap, "topics": [a, b], "page": 3, "node": node,
            "moves": [[a, 0, dir], [a, 0, format!("{dir}/../elsewhere")], ["no-such-topic", 0, dir]],
        }),
        Duration::from_secs(60),
    );
    eprintln!("[kafka-python] {out}");
    let pages = out["pages"].as_array().expect("pages");
    assert_eq!(pages.len(), 3, "{out}");
    let mut seen: Vec<(String, i32)> = pages
        .iter()
        .flat_map(|p| p["topics"].as_array().expect("topics").clone())
        .flat_map(|t| {
            let name = t["name"].as_str().expect("name").to_string();
            t["partitions"]
                .as_array()
                .expect("partitions")
                .iter()
                .map(move |p| (name.clone(), p["partition_index"].as_i64().expect("index") as i32))
                .collect::<Vec<_>>()
        })
        .collect();
    seen.sort();
    assert_eq!(seen, want);
    assert_eq!(
        out["reassignments"],
        serde_json::json!({}),
        "no reassignment runs"
    );
    let dirs = out["log_dirs"].to_string();
    assert!(
        dirs.contains(&a) && dirs.contains(&b),
        "log dirs name both topics: {dirs}"
    );
    // One log directory: staying is a success, another directory is not found, a partition
    // the node does not host is not available.
    assert_eq!(
        out["moves"],
        serde_json::json!([[null], ["LogDirNotFoundError"], ["ReplicaNotAvailableError"]]),
        "{out}"
    );
    // A one-voter quorum led by the node.
    let quorum = &out["quorum"];
    let partition = &quorum["topics"][0]["partitions"][0];
    assert_eq!(partition["leader_id"], node, "{quorum}");
    assert_eq!(
        partition["current_voters"].as_array().map(Vec::len),
        Some(1),
        "{quorum}"
    );
    assert_eq!(partition["current_voters"][0]["replica_id"], node, "{quorum}");
    // Every topic and the broker, by type.
    let resources = &out["config_resources"];
    let listed = |t: &str, name: &str| {
        resources[t]
            .as_array()
            .is_some_and(|names| names.iter().any(|n| n == name))
    };
    assert!(listed("topic", &a) && listed("topic", &b), "{resources}");
    assert!(listed("broker", &node.to_string()), "{resources}");
}

#[test]
fn describe_log_dirs_reports_the_size_of_each_hosted_partition() {
    let broker = Broker::start();
    let bootstrap = broker.bootstrap();
    let topic = unique_topic("log-dirs");
    admin::create_topic(&bootstrap, &topic, 2, &[]);
    let mut c = admin::connect(&bootstrap);
    assert_eq!(admin::advertised_versions(&mut c, 35), Some((1, 4)));
    let value = vec![7u8; 10_000];
    for _ in 0..10 {
        admin::produce_values(&mut c, &topic, 0, &[&value]);
    }
    let ask = |c: &mut strand_compat_tests::raw::RawConn, version: i16, partitions: Vec<i32>| {
        let resp = c
            .request(
                version,
                &DescribeLogDirsRequest::default().with_topics(Some(vec![DescribableLogDirTopic::default()
                    .with_topic(topic_name(&topic))
                    .with_partitions(partitions)])),
            )
            .expect("DescribeLogDirs");
        admin::assert_ok(resp.error_code, "DescribeLogDirs");
        assert_eq!(resp.results.len(), 1, "one log directory");
        resp.results.into_iter().next().unwrap()
    };
    let dir = ask(&mut c, 4, vec![0, 1, 0, 7]);
    admin::assert_ok(dir.error_code, "log dir");
    assert!(
        std::path::Path::new(dir.log_dir.as_str()).is_absolute(),
        "{:?}",
        dir.log_dir
    );
    assert!(
        dir.total_bytes > 0 && (0..=dir.total_bytes).contains(&dir.usable_bytes),
        "{dir:?}"
    );
    assert_eq!(dir.topics.len(), 1);
    let sizes: Vec<(i32, i64)> = dir.topics[0]
        .partitions
        .iter()
        .map(|p| (p.partition_index, p.partition_size))
        .collect();
    // Partition 7 does not exist and partition 0 is named twice: two partitions, once each.
    assert_eq!(sizes.len(), 2, "{sizes:?}");
    let size = |p: i32| sizes.iter().find(|(i, _)| *i == p).expect("partition").1;
    // Ten batches of one 10,000-byte record each, with their headers.
    assert!(
        (100_000..101_500).contains(&size(0)),
        "partition 0 holds {} bytes",
        size(0)
    );
    assert_eq!(size(1), 0, "nothing was written to partition 1");
    // v3 has no space fields: they stay unknown.
    let v3 = ask(&mut c, 3, vec![1]);
    assert_eq!((v3.total_bytes, v3.usable_bytes), (-1, -1));

    // No topics named: every partition of the node, internal ones included.
    let all = c
        .request(4, &DescribeLogDirsRequest::default().with_topics(None))
        .expect("DescribeLogDirs");
    let named: BTreeSet<String> = all.results[0].topics.iter().map(|t| t.name.to_string()).collect();
    assert!(named.contains(&topic), "{named:?}");
}

#[test]
fn describes_report_every_operation_when_asked_as_kafka_without_an_authorizer() {
    let broker = Broker::start();
    let bootstrap = broker.bootstrap();
    let topic = unique_topic("authz-ops");
    admin::create_topic(&bootstrap, &topic, 1, &[]);
    let mut c = admin::connect(&bootstrap);
    for (version, include, topic_ops, cluster_ops) in [
        (10, true, 3576, 8096),
        (10, false, i32::MIN, i32::MIN),
        (12, true, 3576, i32::MIN), // v11+ has no cluster operations
    ] {
        let md = c
            .request(
                version,
                &MetadataRequest::default()
                    .with_topics(Some(vec![
                        metadata_request::MetadataRequestTopic::default().with_name(Some(topic_name(&topic)))
                    ]))
                    .with_include_topic_authorized_operations(include)
                    .with_include_cluster_authorized_operations(include && version <= 10),
            )
            .expect("Metadata");
        assert_eq!(md.topics[0].topic_authorized_operations, topic_ops, "v{version}");
        assert_eq!(md.cluster_authorized_operations, cluster_ops, "v{version}");
    }
    let dc = c
        .request(
            1,
            &DescribeClusterRequest::default()
                .with_include_cluster_authorized_operations(true)
                .with_endpoint_type(1),
        )
        .expect("DescribeCluster");
    assert_eq!(dc.cluster_authorized_operations, 8096);

    let out = clients::python_client(
        PythonClient::ConfluentKafka,
        &["authorized-operations".to_string()],
        &serde_json::json!({"bootstrap": bootstrap, "topic": topic}),
        Duration::from_secs(60),
    );
    eprintln!("[confluent-kafka] {out}");
    let names = |key: &str| -> Vec<String> {
        out[key]
            .as_array()
            .expect("operations")
            .iter()
            .map(|v| v.as_str().expect("name").to_string())
            .collect()
    };
    assert_eq!(
        names("topic"),
        [
            "ALTER",
            "ALTER_CONFIGS",
            "CREATE",
            "DELETE",
            "DESCRIBE",
            "DESCRIBE_CONFIGS",
            "READ",
            "WRITE"
        ]
    );
    assert_eq!(
        names("cluster"),
        [
            "ALTER",
            "ALTER_CONFIGS",
            "CLUSTER_ACTION",
            "CREATE",
            "DESCRIBE",
            "DESCRIBE_CONFIGS",
            "IDEMPOTENT_WRITE"
        ]
    );
}
