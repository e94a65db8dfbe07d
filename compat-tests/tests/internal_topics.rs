//! Internal topics and reserved names, end to end, with Kafka's answers (Kafka's
//! `ReplicaManager` refuses appends to and DeleteRecords on internal topics with
//! INVALID_TOPIC_EXCEPTION; its controller refuses to create `__cluster_metadata` with
//! INVALID_REQUEST) and Strand's own rules where Kafka relies on ACLs Strand does not have:
//!
//! * no client write reaches an internal topic: a queue's dead-letter topic must be a topic
//!   clients may produce to, over HTTP and over every Kafka config API, so the forged-offset
//!   sequence (publish an OffsetCommit record, reject it into `__consumer_offsets`, restart) is
//!   refused at its first step; and a dead-letter setting stored before that check existed
//!   leaves the message waiting to be dead-lettered instead of appending it;
//! * DeleteRecords, changes of `cleanup.policy`/`retention.ms`/`retention.bytes`, DeleteTopics
//!   and CreatePartitions on internal topics are refused;
//! * reserved names (the internal topics, `__cluster_metadata`, `__queue_state`) cannot be
//!   created by CreateTopics, Metadata auto-creation or the HTTP queue API, while other names
//!   starting with `__` are ordinary topics.

use std::time::Duration;

use kafka_protocol::messages::delete_records_request::{DeleteRecordsPartition, DeleteRecordsTopic};
use kafka_protocol::messages::delete_topics_request::DeleteTopicState;
use kafka_protocol::messages::incremental_alter_configs_request::{AlterConfigsResource, AlterableConfig};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::Compression;
use kafka_protocol::ResponseError;
use rdkafka::admin::{
    AdminClient, AdminOptions, NewPartitions, NewTopic, ResourceSpecifier, TopicReplication,
};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};
use serde_json::{json, Value};
use strand_compat_tests::admin::{self, errors, versions};
use strand_compat_tests::queue_client::{encode_segment, LeaseOptions, OutMessage, QueueClient};
use strand_compat_tests::raw::{self, RawConn};
use strand_compat_tests::{clients, metric_sum_where, share, unique_topic, wait_for, Broker};

const OFFSETS: &str = "__consumer_offsets";
/// Every name a client may neither create nor write: Kafka's internal topics, Kafka's metadata
/// log, and the directory of Strand's queue state.
const RESERVED: [&str; 5] = [
    OFFSETS,
    "__transaction_state",
    "__share_group_state",
    "__cluster_metadata",
    "__queue_state",
];
const TOPIC_RESOURCE: i8 = 2;
/// IncrementalAlterConfigs operations.
const SET: i8 = 0;
const DELETE: i8 = 1;
const APPEND: i8 = 2;
const SUBTRACT: i8 = 3;
const DLQ_KEY: &str = "strand.queue.dead.letter.topic";

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

fn code(e: ResponseError) -> i16 {
    e.code()
}

fn start_broker() -> Broker {
    Broker::builder()
        .needs_spawned("the HTTP queue API's address is read from the broker's ready file")
        // Share-group dead-letter topics without a prefix, so that only the internal-topic rule
        // can refuse one.
        .config("errors.deadletterqueue.topic.name.prefix", "")
        .config("group.initial.rebalance.delay.ms", 0)
        .start()
}

fn admin_client(bootstrap: &str) -> AdminClient<DefaultClientContext> {
    clients::base_config(bootstrap)
        .create()
        .expect("rdkafka admin client")
}

fn admin_options() -> AdminOptions {
    AdminOptions::new().request_timeout(Some(Duration::from_secs(15)))
}

/// A consumer of `group` that commits by hand.
fn group_consumer(bootstrap: &str, group: &str) -> BaseConsumer {
    clients::base_config(bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
        .expect("rdkafka consumer")
}

/// Commits `offset` for `group` on `topic`/0 (a simple commit, no membership).
fn commit(bootstrap: &str, group: &str, topic: &str, offset: i64) {
    let consumer = group_consumer(bootstrap, group);
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Offset(offset))
        .expect("offset");
    consumer
        .commit(&tpl, CommitMode::Sync)
        .unwrap_or_else(|e| panic!("commit {group} {topic}/0 at {offset}: {e}"));
}

/// `group`'s committed offset of `topic`/0 as rdkafka sees it (retried while the coordinator
/// loads after a restart).
fn committed(bootstrap: &str, group: &str, topic: &str) -> Offset {
    let consumer = group_consumer(bootstrap, group);
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(topic, 0);
    wait_for(Duration::from_secs(30), "the committed offset", || {
        let got = consumer
            .committed_offsets(tpl.clone(), Duration::from_secs(10))
            .ok()?;
        got.elements().first().map(|e| e.offset())
    })
}

/// The log end of every partition of `__consumer_offsets`.
fn offsets_log_ends(c: &mut RawConn) -> Vec<i64> {
    let (_, partitions) = admin::topic_info(c, OFFSETS);
    (0..partitions as i32)
        .map(|p| admin::latest(c, OFFSETS, p))
        .collect()
}

/// One IncrementalAlterConfigs resource: `(key, operation, value)` edits. Returns the
/// resource's (error code, message).
fn incremental_alter(
    c: &mut RawConn,
    resource_type: i8,
    name: &str,
    edits: &[(&str, i8, Option<&str>)],
    validate_only: bool,
) -> (i16, String) {
    let req = IncrementalAlterConfigsRequest::default()
        .with_resources(vec![AlterConfigsResource::default()
            .with_resource_type(resource_type)
            .with_resource_name(s(name))
            .with_configs(
                edits
                    .iter()
                    .map(|(k, op, v)| {
                        AlterableConfig::default()
                            .with_name(s(k))
                            .with_config_operation(*op)
                            .with_value(v.map(s))
                    })
                    .collect(),
            )])
        .with_validate_only(validate_only);
    let resp = c
        .request(1, &req)
        .unwrap_or_else(|e| panic!("IncrementalAlterConfigs {name}: {e}"));
    let r = &resp.responses[0];
    (
        r.error_code,
        r.error_message
            .as_ref()
            .map(|m| m.to_string())
            .unwrap_or_default(),
    )
}

/// Legacy AlterConfigs of topic `name` (every override it leaves out is removed), raw: rdkafka's
/// `alter_configs` drops the per-resource errors. Returns the resource's (error code, message).
fn legacy_alter(c: &mut RawConn, name: &str, configs: &[(&str, &str)]) -> (i16, String) {
    use kafka_protocol::messages::alter_configs_request::{AlterConfigsResource, AlterableConfig};
    let req = AlterConfigsRequest::default().with_resources(vec![AlterConfigsResource::default()
        .with_resource_type(TOPIC_RESOURCE)
        .with_resource_name(s(name))
        .with_configs(
            configs
                .iter()
                .map(|(k, v)| AlterableConfig::default().with_name(s(k)).with_value(Some(s(v))))
                .collect(),
        )]);
    let resp = c
        .request(2, &req)
        .unwrap_or_else(|e| panic!("AlterConfigs {name}: {e}"));
    let r = &resp.responses[0];
    (
        r.error_code,
        r.error_message
            .as_ref()
            .map(|m| m.to_string())
            .unwrap_or_default(),
    )
}

/// The value of `key` in DescribeConfigs of topic `topic` (rdkafka's admin API).
fn describe_topic_config(bootstrap: &str, topic: &str, key: &str) -> Option<String> {
    let admin = admin_client(bootstrap);
    let results = futures::executor::block_on(
        admin.describe_configs(&[ResourceSpecifier::Topic(topic)], &admin_options()),
    )
    .expect("rdkafka describe_configs");
    let resource = results
        .into_iter()
        .next()
        .expect("one resource")
        .unwrap_or_else(|e| panic!("describe_configs {topic}: {e:?}"));
    resource.get(key).and_then(|e| e.value.clone())
}

/// The error of one rdkafka admin result, as its error code.
fn admin_error<T: std::fmt::Debug>(r: &Result<T, (String, RDKafkaErrorCode)>) -> Option<RDKafkaErrorCode> {
    r.as_ref().err().map(|(_, e)| *e)
}

fn http_status(q: &mut QueueClient, method: &str, path: &str, body: Option<&Value>) -> (u16, String, String) {
    let r = q
        .call(method, path, body)
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
    (r.status, r.error_code().unwrap_or_default(), r.text())
}

// ------------------------------------------------------------------------------------------
// Dead-letter targets

/// The forged-offset sequence over HTTP, refused at its first step: a queue whose dead-letter
/// topic is an internal topic (or a reserved name) cannot be created, and an existing queue
/// cannot be switched to one.
#[test]
fn a_queue_cannot_dead_letter_into_an_internal_topic() {
    let broker = start_broker();
    let bootstrap = broker.bootstrap();
    let mut q = QueueClient::new(&broker.http_addr());
    let existing = unique_topic("q-existing");
    let (status, _) = q.put_queue(&existing, &json!({})).expect("create a queue");
    assert_eq!(status, 201);
    for name in RESERVED {
        let q9 = unique_topic("q9");
        let (status, code, text) = http_status(
            &mut q,
            "PUT",
            &format!("/v1/queues/{}", encode_segment(&q9)),
            Some(&json!({ "dead_letter_topic": name })),
        );
        assert_eq!(
            (status, code.as_str()),
            (400, "invalid_setting"),
            "PUT /v1/queues/{q9} with dead_letter_topic {name}: {text}"
        );
        assert!(text.contains(name), "the refusal names the topic: {text}");
        let (status, _, _) = http_status(&mut q, "GET", &format!("/v1/queues/{q9}"), None);
        assert_eq!(status, 404, "the refused PUT created queue {q9}");

        let (status, code, text) = http_status(
            &mut q,
            "PUT",
            &format!("/v1/queues/{existing}"),
            Some(&json!({ "dead_letter_topic": name, "max_attempts": 2 })),
        );
        assert_eq!(
            (status, code.as_str()),
            (400, "invalid_setting"),
            "switching {existing} to dead_letter_topic {name}: {text}"
        );
    }
    let v = q.get_queue(&existing).expect("GET the queue");
    assert_eq!(
        v["config"]["dead_letter_topic"].as_str(),
        Some(format!("{existing}.dlq").as_str()),
        "refused PUTs changed the queue: {v}"
    );
    assert_eq!(v["config"]["max_attempts"].as_u64(), Some(5), "{v}");
    // An ordinary dead-letter topic is still accepted (the refusals are not of every change).
    let (status, _) = q
        .put_queue(&existing, &json!({ "dead_letter_topic": "__ordinary-dlq" }))
        .expect("an ordinary dead-letter topic");
    assert_eq!(status, 200);
    // None of this created a topic with a reserved name.
    let mut c = admin::connect(&bootstrap);
    for name in &RESERVED[1..] {
        assert_eq!(
            admin::metadata(&mut c, &[name], false).topics[0].error_code,
            errors::UNKNOWN_TOPIC_OR_PARTITION,
            "{name} exists"
        );
    }
    broker.assert_never_panicked("internal dead-letter topics over HTTP");
}

/// The same rule over the Kafka config APIs: IncrementalAlterConfigs and AlterConfigs (raw),
/// CreateTopics (rdkafka's admin API, and raw), for the queue setting and for a share group's
/// `errors.deadletterqueue.topic.name`: INVALID_CONFIG, nothing changed.
#[test]
fn kafka_config_apis_refuse_internal_dead_letter_topics() {
    let broker = start_broker();
    let bootstrap = broker.bootstrap();
    let mut c = admin::connect(&bootstrap);
    let admin = admin_client(&bootstrap);
    let topic = admin::new_topic(&bootstrap, "dlq-config", 1);
    let group = unique_topic("dlq-group");
    let dlq_before = describe_topic_config(&bootstrap, &topic, DLQ_KEY);
    for name in RESERVED {
        for validate_only in [true, false] {
            let (err, message) = incremental_alter(
                &mut c,
                TOPIC_RESOURCE,
                &topic,
                &[(DLQ_KEY, SET, Some(name))],
                validate_only,
            );
            assert_eq!(
                err,
                code(ResponseError::InvalidConfig),
                "IncrementalAlterConfigs {DLQ_KEY}={name} (validate_only {validate_only}): {}: {message}",
                admin::err_name(err)
            );
            assert!(message.contains(name), "{message}");
        }

        let (err, message) = legacy_alter(&mut c, &topic, &[(DLQ_KEY, name)]);
        assert_eq!(
            err,
            code(ResponseError::InvalidConfig),
            "AlterConfigs {DLQ_KEY}={name}: {}: {message}",
            admin::err_name(err)
        );

        let created = unique_topic("dlq-create");
        let new = NewTopic::new(&created, 1, TopicReplication::Fixed(1)).set(DLQ_KEY, name);
        let results = futures::executor::block_on(admin.create_topics(&[new], &admin_options()))
            .expect("rdkafka create_topics");
        assert_eq!(
            admin_error(&results[0]),
            Some(RDKafkaErrorCode::InvalidConfig),
            "CreateTopics with {DLQ_KEY}={name}"
        );
        let resp = c
            .request(
                versions::CREATE_TOPICS,
                &admin::create_topics_request(&created, 1, &[(DLQ_KEY, name)], true),
            )
            .expect("CreateTopics");
        assert_eq!(
            resp.topics[0].error_code,
            code(ResponseError::InvalidConfig),
            "CreateTopics (validate_only) with {DLQ_KEY}={name}: {:?}",
            resp.topics[0].error_message
        );
        assert_eq!(
            admin::metadata(&mut c, &[&created], false).topics[0].error_code,
            errors::UNKNOWN_TOPIC_OR_PARTITION,
            "a refused CreateTopics created {created}"
        );

        let (err, message) = share::alter_group_configs(
            &bootstrap,
            &group,
            &[("errors.deadletterqueue.topic.name", Some(name))],
        );
        assert_eq!(
            err,
            code(ResponseError::InvalidConfig),
            "group config errors.deadletterqueue.topic.name={name}: {message:?}"
        );
    }
    assert_eq!(
        describe_topic_config(&bootstrap, &topic, DLQ_KEY),
        dlq_before,
        "refused changes changed {DLQ_KEY} of {topic}"
    );
    // The control: an ordinary topic is a fine dead-letter topic, by every path.
    let (err, message) = incremental_alter(
        &mut c,
        TOPIC_RESOURCE,
        &topic,
        &[(DLQ_KEY, SET, Some("failures"))],
        false,
    );
    assert_eq!(err, 0, "{message}");
    let (err, message) = share::alter_group_configs(
        &bootstrap,
        &group,
        &[("errors.deadletterqueue.topic.name", Some("failures"))],
    );
    assert_eq!(err, 0, "{message:?}");
    broker.assert_never_panicked("internal dead-letter topics over the config APIs");
}

/// A data directory from before the dead-letter check: a queue whose stored dead-letter topic is
/// `__consumer_offsets`. Rejecting a forged OffsetCommit record appends nothing to
/// `__consumer_offsets` (the append is refused and logged), the message waits to be
/// dead-lettered, and once the setting is corrected it reaches the new dead-letter topic;
/// after a restart the group's committed offset is what the group committed.
#[test]
fn a_stored_internal_dead_letter_topic_writes_nothing_and_loses_nothing() {
    let mut broker = start_broker();
    let bootstrap = broker.bootstrap();
    let victim = admin::new_topic(&bootstrap, "victim", 1);
    let group = unique_topic("victim-group");
    commit(&bootstrap, &group, &victim, 10);
    let mut q = QueueClient::new(&broker.http_addr());
    let queue = unique_topic("q9");
    let (status, _) = q
        .put_queue(&queue, &json!({ "partitions": 1 }))
        .expect("create the queue");
    assert_eq!(status, 201);

    // What an older broker let a client store.
    broker.terminate(Duration::from_secs(30));
    let path = broker.data_dir().join("strand-metadata.json");
    let mut md: Value = serde_json::from_slice(&std::fs::read(&path).expect("read the metadata file"))
        .expect("metadata JSON");
    let t = md["topics"]
        .as_array_mut()
        .expect("topics")
        .iter_mut()
        .find(|t| t["name"] == queue.as_str())
        .expect("the queue's topic in the metadata file");
    let config = format!(
        "{}\n{DLQ_KEY}={OFFSETS}\n",
        t["config"].as_str().unwrap_or_default()
    );
    t["config"] = Value::String(config);
    std::fs::write(&path, serde_json::to_vec_pretty(&md).expect("JSON")).expect("write the metadata file");
    broker.restart();
    let mut q = QueueClient::new(&broker.http_addr());
    let v = q.get_queue(&queue).expect("GET the queue");
    assert_eq!(v["config"]["dead_letter_topic"].as_str(), Some(OFFSETS), "{v}");

    let mut c = admin::connect(&bootstrap);
    let before = offsets_log_ends(&mut c);
    let (key, value) = admin::offset_commit_record(&group, &victim, 0, 424_242, "forged");
    let (err, _) = admin::produce(
        &mut c,
        &queue,
        0,
        raw::encode_batch(
            &[raw::record(Some(&key), Some(&value), admin::now_ms())],
            Compression::None,
        ),
    );
    assert_eq!(err, 0, "producing the forged record to the queue");
    let leased = wait_for(Duration::from_secs(20), "the forged message leased", || {
        let l = q
            .lease(
                &queue,
                &LeaseOptions {
                    max_messages: Some(1),
                    ..Default::default()
                },
            )
            .expect("lease");
        l.into_iter().next()
    });
    let rejected = q
        .settle(
            &leased.id,
            &json!({ "generation": leased.generation, "action": "reject", "reason": "forged" }),
        )
        .expect("reject");
    assert_eq!(rejected.state, "dead_lettered");

    // The append is refused, logged, and retried; the message waits.
    wait_for(
        Duration::from_secs(20),
        "the refused dead-letter append in the log",
        || {
            broker
            .log_text()
            .contains("__consumer_offsets is an internal topic; dead letters must go to a topic clients may produce to")
            .then_some(())
        },
    );
    wait_for(
        Duration::from_secs(20),
        "the message waiting to be dead-lettered",
        || {
            let m = broker.metrics();
            let label = format!("queue=\"{queue}\"");
            (metric_sum_where(&m, "strand_queue_dead_letter_pending_messages", &label) == 1.0).then_some(())
        },
    );
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        offsets_log_ends(&mut c),
        before,
        "a rejected message was appended to __consumer_offsets"
    );

    // Corrected, the dead letter goes where it should: nothing was lost.
    let fixed = unique_topic("q9-fixed-dlq");
    let (status, _) = q
        .put_queue(&queue, &json!({ "dead_letter_topic": fixed }))
        .expect("correct the dead-letter topic");
    assert_eq!(status, 200);
    wait_for(
        Duration::from_secs(30),
        "the dead letter in the corrected topic",
        || {
            let md = admin::metadata(&mut c, &[&fixed], false);
            if md.topics[0].error_code != 0 {
                return None;
            }
            (admin::latest(&mut c, &fixed, 0) == 1).then_some(())
        },
    );
    let f = admin::fetch(&mut c, &fixed, 0, 0, 1 << 20);
    assert_eq!(
        f.records.first().map(|r| (r.1.as_deref(), r.2.as_deref())),
        Some((Some(&key[..]), Some(&value[..]))),
        "the dead letter's key and payload"
    );
    assert_eq!(offsets_log_ends(&mut c), before);

    broker.kill9();
    broker.restart();
    assert_eq!(
        committed(&bootstrap, &group, &victim),
        Offset::Offset(10),
        "the group's committed offset after a restart"
    );
    broker.assert_never_panicked("a stored internal dead-letter topic");
}

// ------------------------------------------------------------------------------------------
// Operations on internal topics

/// DeleteRecords on `__consumer_offsets` answers INVALID_TOPIC_EXCEPTION for every partition
/// (Kafka's `ReplicaManager.deleteRecordsOnLocalLog`), raw and through rdkafka's admin API,
/// and deletes nothing: committed offsets survive a restart.
#[test]
fn delete_records_on_internal_topics_is_refused() {
    let mut broker = start_broker();
    let bootstrap = broker.bootstrap();
    let topic = admin::new_topic(&bootstrap, "kept-offsets", 1);
    let group = unique_topic("kept-group");
    commit(&bootstrap, &group, &topic, 42);
    let mut c = admin::connect(&bootstrap);
    let ends = offsets_log_ends(&mut c);
    let req = DeleteRecordsRequest::default()
        .with_topics(vec![DeleteRecordsTopic::default()
            .with_name(admin::topic_name(OFFSETS))
            .with_partitions(
                (0..ends.len() as i32)
                    .map(|p| {
                        DeleteRecordsPartition::default()
                            .with_partition_index(p)
                            .with_offset(-1)
                    })
                    .collect(),
            )])
        .with_timeout_ms(30_000);
    let resp = c.request(versions::DELETE_RECORDS, &req).expect("DeleteRecords");
    let answers: Vec<(i32, i16, i64)> = resp.topics[0]
        .partitions
        .iter()
        .map(|p| (p.partition_index, p.error_code, p.low_watermark))
        .collect();
    assert_eq!(answers.len(), ends.len());
    for (p, err, low) in answers {
        assert_eq!(
            (err, low),
            (errors::INVALID_TOPIC_EXCEPTION, -1),
            "DeleteRecords {OFFSETS}/{p}: {}",
            admin::err_name(err)
        );
    }

    let admin = admin_client(&bootstrap);
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(OFFSETS, 0, Offset::End).expect("offset");
    let result = futures::executor::block_on(admin.delete_records(&tpl, &admin_options()));
    let refused = match result {
        Ok(list) => list.elements().first().and_then(|e| e.error().err()),
        Err(e) => Some(e),
    };
    assert!(
        matches!(
            refused,
            Some(KafkaError::AdminOp(RDKafkaErrorCode::InvalidTopic))
                | Some(KafkaError::OffsetFetch(RDKafkaErrorCode::InvalidTopic))
        ),
        "rdkafka delete_records on {OFFSETS}/0: {refused:?}"
    );
    for p in 0..ends.len() as i32 {
        assert_eq!(
            admin::earliest(&mut c, OFFSETS, p),
            0,
            "{OFFSETS}/{p} lost records"
        );
    }
    // An ordinary topic still accepts DeleteRecords (the refusal is not of every topic).
    admin::produce_values(&mut c, &topic, 0, &[b"a", b"b"]);
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&topic, 0, Offset::Offset(1))
        .expect("offset");
    let list = futures::executor::block_on(admin.delete_records(&tpl, &admin_options()))
        .expect("delete_records on an ordinary topic");
    assert_eq!(list.elements()[0].error(), Ok(()));
    assert_eq!(admin::earliest(&mut c, &topic, 0), 1);

    broker.kill9();
    broker.restart();
    assert_eq!(committed(&bootstrap, &group, &topic), Offset::Offset(42));
    broker.assert_never_panicked("DeleteRecords on internal topics");
}

/// The settings that decide when an internal topic's records are deleted (`cleanup.policy`,
/// `retention.ms`, `retention.bytes`) cannot be changed, by any operation of
/// IncrementalAlterConfigs nor by AlterConfigs (whose omitted keys are removed):
/// POLICY_VIOLATION. Other settings of internal topics can.
#[test]
fn destructive_config_changes_on_internal_topics_are_refused() {
    let broker = start_broker();
    let bootstrap = broker.bootstrap();
    let mut c = admin::connect(&bootstrap);
    let refused: Vec<(&str, i8, Option<&str>)> = vec![
        ("retention.ms", SET, Some("1")),
        ("retention.ms", SET, Some("-1")),
        ("retention.bytes", SET, Some("1")),
        ("cleanup.policy", SET, Some("delete")),
        ("cleanup.policy", SET, Some("compact,delete")),
        ("cleanup.policy", DELETE, None),
        ("cleanup.policy", APPEND, Some("delete")),
        ("cleanup.policy", SUBTRACT, Some("compact")),
    ];
    for edit in &refused {
        for validate_only in [true, false] {
            let (err, message) = incremental_alter(&mut c, TOPIC_RESOURCE, OFFSETS, &[*edit], validate_only);
            assert_eq!(
                err,
                code(ResponseError::PolicyViolation),
                "IncrementalAlterConfigs {edit:?} on {OFFSETS} (validate_only {validate_only}): {}: {message}",
                admin::err_name(err)
            );
            assert!(message.contains(edit.0), "{message}");
        }
    }
    // Legacy AlterConfigs replaces every override: leaving cleanup.policy out would remove it.
    let (err, message) = legacy_alter(&mut c, OFFSETS, &[("segment.bytes", "52428800")]);
    assert_eq!(
        err,
        code(ResponseError::PolicyViolation),
        "AlterConfigs on {OFFSETS} without cleanup.policy: {}: {message}",
        admin::err_name(err)
    );
    assert_eq!(
        describe_topic_config(&bootstrap, OFFSETS, "cleanup.policy").as_deref(),
        Some("compact")
    );
    assert_eq!(
        describe_topic_config(&bootstrap, OFFSETS, "segment.bytes").as_deref(),
        Some("104857600")
    );
    // What does not delete records may change, by both APIs.
    let (err, message) = incremental_alter(
        &mut c,
        TOPIC_RESOURCE,
        OFFSETS,
        &[("segment.bytes", SET, Some("52428800"))],
        false,
    );
    assert_eq!(err, 0, "segment.bytes of {OFFSETS}: {message}");
    let (err, message) = legacy_alter(
        &mut c,
        OFFSETS,
        &[("cleanup.policy", "compact"), ("segment.bytes", "104857600")],
    );
    assert_eq!(err, 0, "AlterConfigs keeping cleanup.policy: {message}");
    assert_eq!(
        describe_topic_config(&bootstrap, OFFSETS, "segment.bytes").as_deref(),
        Some("104857600")
    );
    // An ordinary topic takes every one of the refused edits.
    let topic = admin::new_topic(&bootstrap, "ordinary-configs", 1);
    for edit in &refused[..5] {
        let (err, message) = incremental_alter(&mut c, TOPIC_RESOURCE, &topic, &[*edit], false);
        assert_eq!(err, 0, "{edit:?} on {topic}: {message}");
    }
    broker.assert_never_panicked("config changes on internal topics");
}

/// DeleteTopics of `__consumer_offsets` answers TOPIC_DELETION_DISABLED, and CreatePartitions
/// of it POLICY_VIOLATION: groups map to its partitions by their count, so more partitions
/// would hide every group's committed offsets after the next start.
#[test]
fn internal_topics_can_be_neither_deleted_nor_grown() {
    let broker = start_broker();
    let bootstrap = broker.bootstrap();
    let mut c = admin::connect(&bootstrap);
    let (id, partitions) = admin::topic_info(&mut c, OFFSETS);
    let req = DeleteTopicsRequest::default()
        .with_topics(vec![
            DeleteTopicState::default().with_name(Some(admin::topic_name(OFFSETS))),
            DeleteTopicState::default().with_topic_id(id),
        ])
        .with_timeout_ms(30_000);
    let resp = c.request(versions::DELETE_TOPICS, &req).expect("DeleteTopics");
    for r in &resp.responses {
        assert_eq!(
            r.error_code,
            code(ResponseError::TopicDeletionDisabled),
            "DeleteTopics {OFFSETS}: {r:?}"
        );
    }
    let admin = admin_client(&bootstrap);
    let results = futures::executor::block_on(admin.delete_topics(&[OFFSETS], &admin_options()))
        .expect("rdkafka delete_topics");
    assert_eq!(
        admin_error(&results[0]),
        Some(RDKafkaErrorCode::TopicDeletionDisabled)
    );

    for validate_only in [true, false] {
        let req = admin::create_partitions_request(OFFSETS, partitions as i32 + 1, validate_only);
        let resp = c
            .request(versions::CREATE_PARTITIONS, &req)
            .expect("CreatePartitions");
        let r = &resp.results[0];
        assert_eq!(
            r.error_code,
            code(ResponseError::PolicyViolation),
            "CreatePartitions of {OFFSETS} (validate_only {validate_only}): {}: {:?}",
            admin::err_name(r.error_code),
            r.error_message
        );
    }
    let grow = NewPartitions::new(OFFSETS, partitions + 1);
    let results = futures::executor::block_on(admin.create_partitions(&[grow], &admin_options()))
        .expect("rdkafka create_partitions");
    assert_eq!(admin_error(&results[0]), Some(RDKafkaErrorCode::PolicyViolation));
    assert_eq!(admin::topic_info(&mut c, OFFSETS), (id, partitions));
    broker.assert_never_panicked("DeleteTopics and CreatePartitions of internal topics");
}

// ------------------------------------------------------------------------------------------
// Reserved names

/// No client creates a topic with a reserved name: CreateTopics answers INVALID_REQUEST ("Creation
/// of internal topic ... is prohibited.", Kafka's answer for `__cluster_metadata`; an existing
/// `__consumer_offsets` is TOPIC_ALREADY_EXISTS), Metadata auto-creation answers
/// UNKNOWN_TOPIC_OR_PARTITION (as Kafka's KRaft broker does when its controller refuses), the
/// HTTP queue API 400. Other names starting with `__` are ordinary topics: created, written,
/// listed as not internal, deleted.
#[test]
fn reserved_topic_names_cannot_be_created() {
    let broker = start_broker();
    let bootstrap = broker.bootstrap();
    let mut c = admin::connect(&bootstrap);
    let admin = admin_client(&bootstrap);
    let mut q = QueueClient::new(&broker.http_addr());
    for name in RESERVED {
        for validate_only in [true, false] {
            let resp = c
                .request(
                    versions::CREATE_TOPICS,
                    &admin::create_topics_request(name, 1, &[], validate_only),
                )
                .expect("CreateTopics");
            let t = &resp.topics[0];
            if name == OFFSETS {
                assert_eq!(t.error_code, errors::TOPIC_ALREADY_EXISTS, "{t:?}");
            } else {
                assert_eq!(
                    (t.error_code, t.error_message.as_ref().map(|m| m.to_string())),
                    (
                        code(ResponseError::InvalidRequest),
                        Some(format!("Creation of internal topic {name} is prohibited."))
                    ),
                    "CreateTopics {name} (validate_only {validate_only})"
                );
            }
        }
        let new = NewTopic::new(name, 1, TopicReplication::Fixed(1));
        let results = futures::executor::block_on(admin.create_topics(&[new], &admin_options()))
            .expect("rdkafka create_topics");
        let want = if name == OFFSETS {
            RDKafkaErrorCode::TopicAlreadyExists
        } else {
            RDKafkaErrorCode::InvalidRequest
        };
        assert_eq!(
            admin_error(&results[0]),
            Some(want),
            "rdkafka create_topics {name}"
        );

        let (status, err, text) = http_status(&mut q, "PUT", &format!("/v1/queues/{name}"), Some(&json!({})));
        assert_eq!(
            (status, err.as_str()),
            (400, "invalid_queue_name"),
            "PUT /v1/queues/{name}: {text}"
        );
        if name == OFFSETS {
            continue;
        }
        let md = admin::metadata(&mut c, &[name], true);
        assert_eq!(
            md.topics[0].error_code,
            errors::UNKNOWN_TOPIC_OR_PARTITION,
            "Metadata with auto-creation of {name}"
        );
        let (err, _) = admin::produce(
            &mut c,
            name,
            0,
            raw::encode_batch(
                &[raw::record(None, Some(b"x"), admin::now_ms())],
                Compression::None,
            ),
        );
        assert_eq!(err, errors::UNKNOWN_TOPIC_OR_PARTITION, "Produce to {name}");
    }
    let listed: Vec<(String, bool)> = admin::metadata(&mut c, &[], false)
        .topics
        .iter()
        .filter_map(|t| t.name.as_ref().map(|n| (n.to_string(), t.is_internal)))
        .filter(|(n, _)| RESERVED.contains(&n.as_str()))
        .collect();
    assert_eq!(
        listed,
        vec![(OFFSETS.to_string(), true)],
        "reserved names in Metadata"
    );

    // `__` alone reserves nothing: Kafka's internal topics are a fixed list.
    let ordinary = format!("__{}", unique_topic("ordinary"));
    admin::create_topic(&bootstrap, &ordinary, 1, &[]);
    let md = admin::metadata(&mut c, &[&ordinary], false);
    assert!(!md.topics[0].is_internal, "{ordinary} listed as internal");
    admin::produce_values(&mut c, &ordinary, 0, &[b"ordinary"]);
    let results = futures::executor::block_on(admin.delete_topics(&[&ordinary], &admin_options()))
        .expect("rdkafka delete_topics");
    assert!(results[0].is_ok(), "deleting {ordinary}: {:?}", results[0]);
    broker.assert_never_panicked("reserved topic names");
}

/// A queue consumer cannot be pointed at an internal topic either: leases, publishes and redrives
/// of `__consumer_offsets` answer 400 `invalid_queue_name`.
#[test]
fn internal_topics_are_not_queues() {
    let broker = start_broker();
    let mut q = QueueClient::new(&broker.http_addr());
    let path = format!("/v1/queues/{OFFSETS}");
    let forged = OutMessage::new("x");
    for (method, path, body) in [
        (
            "POST",
            format!("{path}/messages"),
            json!({ "messages": [forged.to_json()] }),
        ),
        ("POST", format!("{path}/leases"), json!({ "max_messages": 1 })),
        ("POST", format!("{path}/redrive"), json!({ "max_messages": 1 })),
        ("GET", path.clone(), Value::Null),
    ] {
        let body = (!body.is_null()).then_some(&body);
        let (status, err, text) = http_status(&mut q, method, &path, body);
        assert_eq!(
            (status, err.as_str()),
            (400, "invalid_queue_name"),
            "{method} {path}: {text}"
        );
    }
}
