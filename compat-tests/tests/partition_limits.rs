//! Limits on the partitions a node holds and a request creates (`strand.max.partitions`,
//! `.per.topic`, `.per.request`), on every way partitions are created: CreateTopics (also
//! validate_only), CreatePartitions, auto-creation through Metadata, a real client's admin API
//! and the HTTP queue API; deleting a topic gives its partitions back, a restart keeps the
//! count, and every refusal is counted on `/metrics`.
//!
//! Kafka's answers: a request asking for more partitions than the per-request bound is refused
//! whole with POLICY_VIOLATION ("Excessively large number of partitions per request", Kafka's
//! bound being 10,000); a topic above the per-topic limit gets INVALID_PARTITIONS; the node's
//! limit answers POLICY_VIOLATION, as a CreateTopicPolicy would.

use std::time::Duration;

use kafka_protocol::messages::create_partitions_request::CreatePartitionsTopic;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::delete_topics_request::DeleteTopicState;
use kafka_protocol::messages::*;
use kafka_protocol::ResponseError;
use rdkafka::admin::{AdminClient, AdminOptions, NewPartitions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::types::RDKafkaErrorCode;
use serde_json::json;
use strand_compat_tests::admin::{self, errors, versions};
use strand_compat_tests::queue_client::QueueClient;
use strand_compat_tests::raw::RawConn;
use strand_compat_tests::{clients, metric_sum_where, unique_topic, wait_for, Broker, BrokerBuilder};

/// A broker whose limits are small enough to reach quickly: 100 partitions on the node, of
/// which `__consumer_offsets` takes 10; 20 per topic; 30 per request.
fn small_limits() -> BrokerBuilder {
    Broker::builder()
        .needs_spawned("sets the partition limits")
        .config("offsets.topic.num.partitions", 10)
        .config("strand.max.partitions", 100)
        .config("strand.max.partitions.per.topic", 20)
        .config("strand.max.partitions.per.request", 30)
}

/// CreateTopics of `(name, partitions)`; the answer's `(error code, message)` per topic.
fn create(c: &mut RawConn, topics: &[(&str, i32)], validate_only: bool) -> Vec<(i16, String)> {
    let req = CreateTopicsRequest::default()
        .with_topics(
            topics
                .iter()
                .map(|(name, partitions)| {
                    CreatableTopic::default()
                        .with_name(admin::topic_name(name))
                        .with_num_partitions(*partitions)
                        .with_replication_factor(-1)
                })
                .collect(),
        )
        .with_timeout_ms(30_000)
        .with_validate_only(validate_only);
    let resp: CreateTopicsResponse = c.request(versions::CREATE_TOPICS, &req).expect("CreateTopics");
    assert_eq!(resp.topics.len(), topics.len(), "one answer per topic");
    resp.topics
        .iter()
        .map(|t| answer(t.error_code, t.error_message.as_deref()))
        .collect()
}

/// CreatePartitions to `(name, new count)`; the answer's `(error code, message)` per topic.
fn grow(c: &mut RawConn, topics: &[(&str, i32)]) -> Vec<(i16, String)> {
    let req = CreatePartitionsRequest::default()
        .with_topics(
            topics
                .iter()
                .map(|(name, count)| {
                    CreatePartitionsTopic::default()
                        .with_name(admin::topic_name(name))
                        .with_count(*count)
                        .with_assignments(None)
                })
                .collect(),
        )
        .with_timeout_ms(30_000);
    let resp: CreatePartitionsResponse = c
        .request(versions::CREATE_PARTITIONS, &req)
        .expect("CreatePartitions");
    assert_eq!(resp.results.len(), topics.len(), "one answer per topic");
    resp.results
        .iter()
        .map(|t| answer(t.error_code, t.error_message.as_deref()))
        .collect()
}

/// A per-topic answer as `(error code, message)`.
fn answer(code: i16, message: Option<&str>) -> (i16, String) {
    (code, message.unwrap_or_default().to_owned())
}

/// Asserts every answer is `want` with a message naming `setting`.
fn assert_refused(answers: &[(i16, String)], want: ResponseError, setting: &str, what: &str) {
    for (code, message) in answers {
        admin::assert_code(*code, want, &format!("{what} ({message})"));
        assert!(
            message.contains(setting),
            "{what}: the message should name {setting}: {message}"
        );
    }
}

fn assert_created(answers: &[(i16, String)], what: &str) {
    for (code, message) in answers {
        admin::assert_ok(*code, &format!("{what} ({message})"));
    }
}

/// Partitions of `topic` in Metadata, 0 when it does not exist.
fn partitions_of(c: &mut RawConn, topic: &str) -> usize {
    let md = admin::metadata(c, &[topic], false);
    let t = &md.topics[0];
    if t.error_code == errors::UNKNOWN_TOPIC_OR_PARTITION {
        return 0;
    }
    admin::assert_ok(t.error_code, &format!("Metadata of {topic}"));
    t.partitions.len()
}

/// Waits until Metadata shows `topic` with `partitions` partitions.
fn wait_partitions(c: &mut RawConn, topic: &str, partitions: usize) {
    wait_for(
        Duration::from_secs(15),
        &format!("{topic} with {partitions} partitions in Metadata"),
        || (partitions_of(c, topic) == partitions).then_some(()),
    );
}

/// Partitions of all topics in Metadata, internal ones included.
fn node_partitions(c: &mut RawConn) -> usize {
    admin::metadata(c, &[], false)
        .topics
        .iter()
        .map(|t| t.partitions.len())
        .sum()
}

fn refusals(broker: &Broker, limit: &str) -> f64 {
    metric_sum_where(
        &broker.metrics(),
        "strand_partition_limit_refusals_total",
        &format!("limit=\"{limit}\""),
    )
}

/// The requests of the report, with the default limits: one topic of 10,001 partitions, two
/// topics of 5,001 in one request, a topic grown to 32,772 partitions. Kafka refuses each as
/// more than 10,000 partitions in one request.
#[test]
fn default_limits_refuse_oversized_requests() {
    let broker = Broker::builder()
        .needs_spawned("checks Strand's default partition limits")
        .start();
    let mut c = admin::connect(&broker.bootstrap());
    let big = unique_topic("limits-big");
    for validate_only in [true, false] {
        assert_refused(
            &create(&mut c, &[(&big, 10_001)], validate_only),
            ResponseError::PolicyViolation,
            "Excessively large number of partitions per request",
            &format!("CreateTopics of 10,001 partitions (validate_only={validate_only})"),
        );
    }
    let (a, b) = (unique_topic("limits-a"), unique_topic("limits-b"));
    assert_refused(
        &create(&mut c, &[(&a, 5_001), (&b, 5_001)], false),
        ResponseError::PolicyViolation,
        "strand.max.partitions.per.request",
        "CreateTopics of 2 x 5,001 partitions",
    );
    for t in [&big, &a, &b] {
        assert_eq!(partitions_of(&mut c, t), 0, "{t} was created");
    }

    let small = admin::new_topic(&broker.bootstrap(), "limits-grown", 1);
    assert_refused(
        &grow(&mut c, &[(&small, 32_772)]),
        ResponseError::PolicyViolation,
        "strand.max.partitions.per.request",
        "CreatePartitions 1 -> 32,772",
    );
    assert_eq!(
        partitions_of(&mut c, &small),
        1,
        "the refused growth changed the topic"
    );
    assert!(refusals(&broker, "request") >= 4.0, "refusals counted");
    broker.assert_never_panicked("oversized requests");
}

#[test]
fn partition_limits_hold_on_every_kafka_path() {
    let mut broker = small_limits().start();
    let bootstrap = broker.bootstrap();
    let mut c = admin::connect(&bootstrap);
    assert_eq!(node_partitions(&mut c), 10, "__consumer_offsets only");

    // Per topic: INVALID_PARTITIONS, for validate_only too.
    let wide = unique_topic("limits-wide");
    for validate_only in [true, false] {
        assert_refused(
            &create(&mut c, &[(&wide, 21)], validate_only),
            ResponseError::InvalidPartitions,
            "strand.max.partitions.per.topic",
            &format!("CreateTopics of 21 partitions (validate_only={validate_only})"),
        );
    }
    assert_eq!(partitions_of(&mut c, &wide), 0, "{wide} was created");

    // Per request: the whole request is refused, the topics that would fit included.
    let (a, b) = (unique_topic("limits-a"), unique_topic("limits-b"));
    assert_refused(
        &create(&mut c, &[(&a, 16), (&b, 15)], false),
        ResponseError::PolicyViolation,
        "strand.max.partitions.per.request",
        "CreateTopics of 31 partitions in one request",
    );
    assert_eq!((partitions_of(&mut c, &a), partitions_of(&mut c, &b)), (0, 0));
    assert_created(&create(&mut c, &[(&a, 15), (&b, 15)], false), "30 partitions");
    wait_partitions(&mut c, &a, 15);
    wait_partitions(&mut c, &b, 15);

    // CreatePartitions: above the topic's limit, and above the request's.
    assert_refused(
        &grow(&mut c, &[(&a, 21)]),
        ResponseError::InvalidPartitions,
        "strand.max.partitions.per.topic",
        "CreatePartitions 15 -> 21",
    );
    assert_created(&grow(&mut c, &[(&a, 20), (&b, 20)]), "growing by 10");
    wait_partitions(&mut c, &b, 20);
    let (d, e) = (unique_topic("limits-d"), unique_topic("limits-e"));
    assert_created(&create(&mut c, &[(&d, 1), (&e, 1)], false), "two small topics");
    assert_refused(
        &grow(&mut c, &[(&d, 20), (&e, 20)]),
        ResponseError::PolicyViolation,
        "strand.max.partitions.per.request",
        "CreatePartitions adding 38 in one request",
    );
    wait_partitions(&mut c, &e, 1);
    assert_eq!(partitions_of(&mut c, &d), 1, "the refused growth changed {d}");
    assert_eq!(node_partitions(&mut c), 52);

    // The node: 52 + 20 + 20 = 92 fit, 9 more do not (validate_only answers the same).
    let (f, g, h) = (
        unique_topic("limits-f"),
        unique_topic("limits-g"),
        unique_topic("limits-h"),
    );
    assert_created(&create(&mut c, &[(&f, 20)], false), "20 more");
    assert_created(&create(&mut c, &[(&g, 20)], false), "20 more");
    wait_partitions(&mut c, &g, 20);
    for validate_only in [true, false] {
        assert_refused(
            &create(&mut c, &[(&h, 9)], validate_only),
            ResponseError::PolicyViolation,
            "strand.max.partitions",
            &format!("CreateTopics beyond the node's limit (validate_only={validate_only})"),
        );
    }
    assert_created(&create(&mut c, &[(&h, 8)], false), "up to the node's limit");
    wait_partitions(&mut c, &h, 8);
    assert_eq!(node_partitions(&mut c), 100);
    assert_refused(
        &grow(&mut c, &[(&d, 2)]),
        ResponseError::PolicyViolation,
        "strand.max.partitions",
        "CreatePartitions beyond the node's limit",
    );

    // A real client's admin API gets the same answers.
    let rdkafka_admin: AdminClient<DefaultClientContext> = clients::base_config(&bootstrap)
        .create()
        .expect("rdkafka admin client");
    let options = AdminOptions::new().request_timeout(Some(Duration::from_secs(15)));
    let one_more = unique_topic("limits-rdkafka");
    let created = futures::executor::block_on(rdkafka_admin.create_topics(
        &[NewTopic::new(&one_more, 1, TopicReplication::Fixed(1))],
        &options,
    ))
    .expect("rdkafka create_topics");
    assert_eq!(
        created,
        vec![Err((one_more.clone(), RDKafkaErrorCode::PolicyViolation))],
        "rdkafka create_topics beyond the node's limit"
    );
    let grown =
        futures::executor::block_on(rdkafka_admin.create_partitions(&[NewPartitions::new(&d, 2)], &options))
            .expect("rdkafka create_partitions");
    assert_eq!(
        grown,
        vec![Err((d.clone(), RDKafkaErrorCode::PolicyViolation))],
        "rdkafka create_partitions beyond the node's limit"
    );

    // Auto-creation: the topic is not created and Metadata says why.
    let auto = unique_topic("limits-auto");
    let md = admin::metadata(&mut c, &[&auto], true);
    admin::assert_code(
        md.topics[0].error_code,
        ResponseError::PolicyViolation,
        "Metadata auto-creating beyond the node's limit",
    );
    assert_eq!(partitions_of(&mut c, &auto), 0, "{auto} was auto-created");

    // Deleting a topic gives its partitions back.
    let req = DeleteTopicsRequest::default()
        .with_topics(vec![
            DeleteTopicState::default().with_name(Some(admin::topic_name(&f)))
        ])
        .with_timeout_ms(30_000);
    let resp: DeleteTopicsResponse = c.request(versions::DELETE_TOPICS, &req).expect("DeleteTopics");
    admin::assert_ok(resp.responses[0].error_code, "DeleteTopics");
    wait_partitions(&mut c, &f, 0);
    let md = admin::metadata(&mut c, &[&auto], true);
    admin::assert_ok(md.topics[0].error_code, "auto-creation once there is room");
    assert_created(&create(&mut c, &[(&one_more, 19)], false), "the freed partitions");
    wait_partitions(&mut c, &one_more, 19);
    assert_eq!(node_partitions(&mut c), 100);

    for limit in ["node", "topic", "request"] {
        assert!(
            refusals(&broker, limit) > 0.0,
            "refusals by the {limit} limit counted"
        );
    }

    // A restart (after SIGKILL) counts the partitions it finds.
    broker.kill9();
    broker.restart();
    let mut c = admin::connect(&broker.bootstrap());
    assert_eq!(node_partitions(&mut c), 100);
    assert_refused(
        &create(&mut c, &[(&unique_topic("limits-after"), 1)], false),
        ResponseError::PolicyViolation,
        "strand.max.partitions",
        "CreateTopics beyond the node's limit after a restart",
    );
    broker.assert_never_panicked("partition limits");
}

#[test]
fn queue_api_refuses_partitions_beyond_the_limits() {
    let broker = small_limits().start();
    let bootstrap = broker.bootstrap();
    let mut c = admin::connect(&bootstrap);
    let mut q = QueueClient::new(&broker.http_addr());
    let put = |q: &mut QueueClient, queue: &str, partitions: i32| {
        q.put_queue(queue, &json!({ "partitions": partitions }))
    };
    // The node's limit answers 409 partition_limit_reached; the topic's and the request's 400
    // too_many_partitions.
    let refused = |q: &mut QueueClient, queue: &str, partitions: i32, setting: &str| {
        let want = if setting == "strand.max.partitions" {
            (409, "partition_limit_reached")
        } else {
            (400, "too_many_partitions")
        };
        match put(q, queue, partitions) {
            Err(e) => {
                assert_eq!(
                    e.status(),
                    Some(want),
                    "PUT {queue} with {partitions} partitions: {e}"
                );
                assert!(e.to_string().contains(setting), "the error names {setting}: {e}");
            }
            Ok((status, v)) => panic!("PUT {queue} with {partitions} partitions answered {status}: {v}"),
        }
    };

    // Above the topic's limit.
    let wide = unique_topic("limits-q-wide");
    refused(&mut q, &wide, 21, "strand.max.partitions.per.topic");
    // The queue and its dead-letter topic are one request: 2 x 16 is above 30.
    let pair = unique_topic("limits-q-pair");
    refused(&mut q, &pair, 16, "strand.max.partitions.per.request");
    for t in [
        wide.clone(),
        format!("{wide}.dlq"),
        pair.clone(),
        format!("{pair}.dlq"),
    ] {
        assert_eq!(partitions_of(&mut c, &t), 0, "{t} was created");
    }

    let grown = unique_topic("limits-q-grown");
    assert_eq!(put(&mut q, &grown, 15).expect("PUT 15 partitions").0, 201);
    wait_partitions(&mut c, &format!("{grown}.dlq"), 15);
    refused(&mut q, &grown, 21, "strand.max.partitions.per.topic");
    assert_eq!(put(&mut q, &grown, 20).expect("growing to 20").0, 200);
    wait_partitions(&mut c, &grown, 20);
    assert_eq!(node_partitions(&mut c), 45);

    // The node: 45 + 40 = 85; a queue of 8 needs 16 (its dead-letter topic too): nothing of it
    // is created. One of 7 fits exactly, after which a queue cannot grow by one.
    for _ in 0..2 {
        admin::new_topic(&bootstrap, "limits-q-fill", 20);
    }
    let last = unique_topic("limits-q-last");
    refused(&mut q, &last, 8, "strand.max.partitions");
    assert_eq!(partitions_of(&mut c, &last), 0, "{last} was created");
    assert_eq!(
        partitions_of(&mut c, &format!("{last}.dlq")),
        0,
        "{last}.dlq was created"
    );
    assert_eq!(put(&mut q, &last, 7).expect("PUT 7 partitions").0, 201);
    wait_partitions(&mut c, &format!("{last}.dlq"), 7);
    assert_eq!(node_partitions(&mut c), 99);
    assert_eq!(put(&mut q, &last, 8).expect("growing to the node's limit").0, 200);
    refused(&mut q, &last, 9, "strand.max.partitions");
    wait_partitions(&mut c, &last, 8);
    assert_eq!(node_partitions(&mut c), 100);

    for limit in ["node", "topic", "request"] {
        assert!(
            refusals(&broker, limit) > 0.0,
            "refusals by the {limit} limit counted"
        );
    }
    broker.assert_never_panicked("partition limits over HTTP");
}
