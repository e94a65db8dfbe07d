//! Kafka share groups (KIP-932) driven by a real client: confluent-kafka's `ShareConsumer`
//! members in child processes, what they report, group configs, raw share requests and the
//! dead-letter topic as kcat shows it.
//!
//! A member ([`ShareMember`]) runs `compat-tests/python/share_client.py member --spec
//! '<ShareSpec as JSON>'`. It polls and acknowledges as its [`ShareSpec`] says and writes
//! [`ShareEvent`]s as JSON lines (the protocol is in the script's docstring), collected
//! with the member's name in one [`ShareLog`] per test. Each event carries the member's
//! wall-clock time in ms (`time.time()`), the same clock as [`now_ms`], so holds of one
//! record by different members (or by an HTTP worker) can be compared. It stops at EOF on stdin
//! ([`ShareMember::stop`]: commit, `close()`, which leaves the group) or dies by SIGKILL
//! ([`ShareMember::kill9`]: no acknowledgement, no leave). A *stepped* member polls only
//! when told ([`ShareMember::step`]).

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::process::Command;
use std::time::Duration;

use kafka_protocol::messages::incremental_alter_configs_request::{AlterConfigsResource, AlterableConfig};
use kafka_protocol::messages::share_fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{
    share_acknowledge_request, share_fetch_request, GroupId, IncrementalAlterConfigsRequest,
    ShareAcknowledgeRequest, ShareAcknowledgeResponse, ShareFetchRequest, ShareFetchResponse,
    ShareGroupDescribeRequest, ShareGroupDescribeResponse, ShareGroupHeartbeatRequest,
    ShareGroupHeartbeatResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use raw::RawConn;
use serde::Serialize;
use serde_json::Value;

use crate::members::{self, ChildMember, MemberEvent, MemberLog};
use crate::{admin, raw, tools};

pub mod versions;

/// Config resource type GROUP (KIP-848 group configs).
pub const RESOURCE_GROUP: i8 = 32;

/// Milliseconds since the Unix epoch, the clock the members' event times use.
pub fn now_ms() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64() * 1000.0)
        .unwrap_or(0.0)
}

/// What a member does (the `--spec` of `share_client.py member`; see its docstring).
#[derive(Clone, Debug, Serialize)]
pub struct ShareSpec {
    /// `bootstrap.servers`.
    pub bootstrap: String,
    /// `group.id`.
    pub group: String,
    /// Subscribed topics.
    pub topics: Vec<String>,
    /// librdkafka settings, applied last.
    pub config: BTreeMap<String, String>,
    /// `explicit` or `implicit` (`share.acknowledgement.mode`).
    pub mode: String,
    /// `"<partition>:<offset>"` -> action at delivery count 1, 2, ... (the last repeats).
    pub actions: BTreeMap<String, Vec<String>>,
    /// `accept`, `release`, `reject` or `hold`.
    pub default_action: String,
    /// Partition (as text) -> first offset held by default.
    pub hold_from: BTreeMap<String, i64>,
    /// `sync` (commit_sync after each poll's acknowledgements) or `none`.
    pub commit: String,
    /// Stop polling after this many polls that returned records.
    pub max_polls: Option<u64>,
    /// Simulated work per record, before acknowledging.
    pub work_ms_per_record: f64,
    /// Poll timeout.
    pub poll_timeout_ms: u64,
    /// Poll only on [`ShareMember::step`].
    pub stepped: bool,
    /// How long a step polls for records at most.
    pub step_timeout_ms: u64,
}

impl ShareSpec {
    /// Explicit acknowledgement, every record accepted and committed at once.
    pub fn new(bootstrap: &str, group: &str, topic: &str) -> ShareSpec {
        ShareSpec {
            bootstrap: bootstrap.to_string(),
            group: group.to_string(),
            topics: vec![topic.to_string()],
            config: BTreeMap::new(),
            mode: "explicit".into(),
            actions: BTreeMap::new(),
            default_action: "accept".into(),
            hold_from: BTreeMap::new(),
            commit: "sync".into(),
            max_polls: None,
            work_ms_per_record: 0.0,
            poll_timeout_ms: 100,
            stepped: false,
            step_timeout_ms: 10_000,
        }
    }

    /// A librdkafka setting.
    pub fn set(mut self, key: &str, value: impl ToString) -> ShareSpec {
        self.config.insert(key.to_string(), value.to_string());
        self
    }

    /// What to do with record (`partition`, `offset`) at delivery count 1, 2, ...
    pub fn on(mut self, partition: i32, offset: i64, actions: &[AckType]) -> ShareSpec {
        self.actions.insert(
            format!("{partition}:{offset}"),
            actions.iter().map(|a| a.name().to_string()).collect(),
        );
        self
    }

    /// Records of `partition` at or after `offset` are held (never acknowledged).
    pub fn hold_from(mut self, partition: i32, offset: i64) -> ShareSpec {
        self.hold_from.insert(partition.to_string(), offset);
        self
    }

    /// Holds every record it gets (and so stops polling after its first records).
    pub fn hold_all(mut self) -> ShareSpec {
        self.default_action = "hold".into();
        self
    }

    /// Implicit acknowledgement (records accepted on the next poll / commit).
    pub fn implicit(mut self) -> ShareSpec {
        self.mode = "implicit".into();
        self
    }

    /// Acknowledges without committing: the acknowledgements go with the next poll or close.
    pub fn no_commit(mut self) -> ShareSpec {
        self.commit = "none".into();
        self
    }

    /// Stops polling after `n` polls that returned records.
    pub fn max_polls(mut self, n: u64) -> ShareSpec {
        self.max_polls = Some(n);
        self
    }

    /// Simulated work per record.
    pub fn work_ms_per_record(mut self, ms: f64) -> ShareSpec {
        self.work_ms_per_record = ms;
        self
    }

    /// Polls only on [`ShareMember::step`].
    pub fn stepped(mut self) -> ShareSpec {
        self.stepped = true;
        self
    }
}

/// An acknowledgement type (KIP-932: 1 accept, 2 release, 3 reject).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AckType {
    /// ACCEPT: done.
    Accept,
    /// RELEASE: available again (counts as a delivery).
    Release,
    /// REJECT: archived (dead-lettered when the group has a dead-letter topic).
    Reject,
}

impl AckType {
    /// The script's name.
    pub fn name(self) -> &'static str {
        match self {
            AckType::Accept => "accept",
            AckType::Release => "release",
            AckType::Reject => "reject",
        }
    }

    /// Parses the script's name.
    pub fn parse(s: &str) -> Option<AckType> {
        match s {
            "accept" => Some(AckType::Accept),
            "release" => Some(AckType::Release),
            "reject" => Some(AckType::Reject),
            _ => None,
        }
    }

    /// The protocol's `AcknowledgeTypes` value.
    pub fn code(self) -> i8 {
        match self {
            AckType::Accept => 1,
            AckType::Release => 2,
            AckType::Reject => 3,
        }
    }
}

/// A record a poll returned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Acquired {
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
    /// `Message.delivery_count()` (0 when the client gave none).
    pub delivery_count: i32,
    /// The value as lossy UTF-8.
    pub value: String,
}

/// One thing that happened to a member (see the script's docstring). `t_ms`: the member's
/// clock, ms since the Unix epoch.
#[derive(Clone, Debug, PartialEq)]
pub enum ShareEvent {
    /// Subscribed; `client` names the client library versions.
    Subscribed { t_ms: f64, client: String },
    /// A poll returned these records.
    Acquired { t_ms: f64, records: Vec<Acquired> },
    /// Acknowledgements about to be sent.
    AcksSent {
        t_ms: f64,
        acks: Vec<(i32, i64, AckType)>,
    },
    /// The broker's answer to acknowledgements of one partition.
    AckResult {
        t_ms: f64,
        partition: i32,
        offsets: Vec<i64>,
        error: Option<String>,
    },
    /// commit_sync returned: per partition, its error.
    Commit {
        t_ms: f64,
        results: Vec<(i32, Option<String>)>,
    },
    /// Records kept without acknowledgement; the member stopped polling.
    Holding { t_ms: f64, records: Vec<(i32, i64)> },
    /// A step (stepped member) was served; how many records it returned.
    StepDone { t_ms: f64, records: usize },
    /// A client error.
    Error(String),
    /// Diagnostics.
    Note(String),
    /// close() returned.
    Closed { t_ms: f64 },
}

fn f(v: &Value, k: &str) -> Result<f64, String> {
    v.get(k)
        .and_then(Value::as_f64)
        .ok_or_else(|| format!("missing {k} in {v}"))
}

/// The array `key` of a JSON event, each element read by `item` (`what` names an element in
/// errors).
fn array<T>(v: &Value, key: &str, what: &str, item: impl Fn(&Value) -> Option<T>) -> Result<Vec<T>, String> {
    v.get(key)
        .and_then(Value::as_array)
        .ok_or_else(|| format!("missing {key} in {v}"))?
        .iter()
        .map(|x| item(x).ok_or_else(|| format!("bad {what} {x}")))
        .collect()
}

/// A (partition, offset) pair.
fn pair(r: &Value) -> Option<(i32, i64)> {
    Some((r.get(0)?.as_i64()? as i32, r.get(1)?.as_i64()?))
}

impl MemberEvent for ShareEvent {
    type Counts = ShareCounts;

    /// Parses the JSON-lines form.
    fn from_json(v: &Value) -> Result<ShareEvent, String> {
        let text = |key: &str| members::text(v, key);
        let opt_text = |x: Option<&Value>| x.and_then(Value::as_str).map(str::to_string);
        match v.get("ev").and_then(Value::as_str) {
            Some("subscribed") => Ok(ShareEvent::Subscribed {
                t_ms: f(v, "t")?,
                client: text("client")?,
            }),
            Some("acquired") => Ok(ShareEvent::Acquired {
                t_ms: f(v, "t")?,
                records: array(v, "records", "record", |r| {
                    let (partition, offset) = pair(r)?;
                    Some(Acquired {
                        partition,
                        offset,
                        delivery_count: r.get(2)?.as_i64().unwrap_or(0) as i32,
                        value: r.get(3)?.as_str()?.to_string(),
                    })
                })?,
            }),
            Some("acks_sent") => Ok(ShareEvent::AcksSent {
                t_ms: f(v, "t")?,
                acks: array(v, "acks", "ack", |a| {
                    let (p, o) = pair(a)?;
                    Some((p, o, AckType::parse(a.get(2)?.as_str()?)?))
                })?,
            }),
            Some("ack_result") => Ok(ShareEvent::AckResult {
                t_ms: f(v, "t")?,
                partition: v
                    .get("partition")
                    .and_then(Value::as_i64)
                    .ok_or_else(|| format!("missing partition in {v}"))? as i32,
                offsets: array(v, "offsets", "offset", Value::as_i64)?,
                error: opt_text(v.get("error")),
            }),
            Some("commit") => Ok(ShareEvent::Commit {
                t_ms: f(v, "t")?,
                results: array(v, "results", "result", |r| {
                    Some((r.get(0)?.as_i64()? as i32, opt_text(r.get(1))))
                })?,
            }),
            Some("holding") => Ok(ShareEvent::Holding {
                t_ms: f(v, "t")?,
                records: array(v, "records", "record", pair)?,
            }),
            Some("step_done") => Ok(ShareEvent::StepDone {
                t_ms: f(v, "t")?,
                records: v.get("records").and_then(Value::as_u64).unwrap_or(0) as usize,
            }),
            Some("error") => Ok(ShareEvent::Error(text("error")?)),
            Some("note") => Ok(ShareEvent::Note(text("note")?)),
            Some("closed") => Ok(ShareEvent::Closed { t_ms: f(v, "t")? }),
            _ => Err(format!("unknown event {v}")),
        }
    }

    fn unreadable(message: String) -> ShareEvent {
        ShareEvent::Error(message)
    }

    fn count(&self, m: &mut ShareCounts) -> Option<String> {
        match self {
            ShareEvent::Acquired { records, .. } => m.acquired += records.len(),
            ShareEvent::AckResult { offsets, error, .. } => {
                if error.is_some() {
                    m.ack_failures += offsets.len();
                    return Some(format!("ack failed: {error:?}"));
                }
                m.acked += offsets.len();
            }
            ShareEvent::Holding { records, .. } => return Some(format!("holding {}", records.len())),
            ShareEvent::Error(e) => return Some(e.clone()),
            ShareEvent::Note(n) => return Some(n.clone()),
            ShareEvent::Closed { .. } => return Some("closed".into()),
            _ => {}
        }
        None
    }

    fn counts_line(m: &ShareCounts) -> String {
        format!(
            "{} records acquired, {} acknowledged, {} acknowledgements failed",
            m.acquired, m.acked, m.ack_failures
        )
    }

    /// librdkafka's warning that its share consumer is a preview, on every start.
    fn quiet(stderr_line: &str) -> bool {
        stderr_line.contains("is in \"Preview\"")
    }
}

/// A member's line in a log summary.
#[derive(Default)]
pub struct ShareCounts {
    acquired: usize,
    acked: usize,
    ack_failures: usize,
}

/// An event with the member that reported it.
pub type Logged = members::Logged<ShareEvent>;

/// Every member's events in arrival order (per member: in the member's order).
pub type ShareLog = MemberLog<ShareEvent>;

/// Every record acquired: (member, time, record), in log order.
pub fn acquired(log: &[Logged]) -> Vec<(&str, f64, &Acquired)> {
    let mut out = Vec::new();
    for l in log {
        if let ShareEvent::Acquired { t_ms, records } = &l.event {
            out.extend(records.iter().map(|r| (l.member.as_str(), *t_ms, r)));
        }
    }
    out
}

/// What the broker answered to a member's acknowledgements.
#[derive(Clone, Debug, Default)]
pub struct AckResults {
    /// (partition, offset) confirmed (any acknowledgement type).
    pub ok: BTreeSet<(i32, i64)>,
    /// (partition, offset) whose acknowledgement failed, with the error.
    pub failed: BTreeMap<(i32, i64), String>,
}

/// The broker's answers to `member`'s acknowledgements.
pub fn ack_results(log: &[Logged], member: &str) -> AckResults {
    let mut out = AckResults::default();
    for l in log.iter().filter(|l| l.member == member) {
        if let ShareEvent::AckResult {
            partition,
            offsets,
            error,
            ..
        } = &l.event
        {
            for o in offsets {
                match error {
                    None => {
                        out.ok.insert((*partition, *o));
                    }
                    Some(e) => {
                        out.failed.insert((*partition, *o), e.clone());
                    }
                }
            }
        }
    }
    out
}

/// The client errors and notes a member reported.
pub fn errors(log: &[Logged], member: &str) -> Vec<String> {
    log.iter()
        .filter(|l| l.member == member)
        .filter_map(|l| match &l.event {
            ShareEvent::Error(e) => Some(e.clone()),
            _ => None,
        })
        .collect()
}

/// A member: `share_client.py member` in a child process. Dropping it kills the child.
pub struct ShareMember {
    child: ChildMember,
}

impl ShareMember {
    /// Starts a member; its events go to `log` under `name`.
    pub fn start(name: &str, spec: &ShareSpec, log: &ShareLog) -> ShareMember {
        let mut cmd = Command::new(tools::python());
        cmd.arg(tools::python_scripts_dir().join("share_client.py"))
            .arg("member")
            .arg("--spec")
            .arg(serde_json::to_string(spec).expect("spec as JSON"))
            .env_remove("LD_LIBRARY_PATH");
        ShareMember {
            child: ChildMember::spawn(name, cmd, log),
        }
    }

    /// Its name in the [`ShareLog`].
    pub fn name(&self) -> &str {
        &self.child.name
    }

    /// The child's process id.
    pub fn pid(&self) -> u32 {
        self.child.pid()
    }

    /// A stepped member polls until it gets records (or its step timeout passes).
    pub fn step(&mut self) {
        let name = self.child.name.clone();
        let stdin = self.child.stdin();
        writeln!(stdin, "poll")
            .and_then(|()| stdin.flush())
            .unwrap_or_else(|e| panic!("cannot tell member {name} to poll: {e}"));
    }

    /// SIGKILLs the member and waits for it and the end of its output. Panics if it had
    /// already exited.
    pub fn kill9(&mut self) {
        self.child.kill9();
    }

    /// Closes its stdin (it commits, closes the consumer, leaves) and waits up to `timeout`.
    /// Panics if it does not end in time or fails.
    pub fn stop(mut self, timeout: Duration) {
        self.child.stop(timeout);
    }
}

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

/// IncrementalAlterConfigs on group `group` (resource type GROUP): `Some(value)` sets,
/// `None` deletes. Returns the resource's error code and message.
pub fn alter_group_configs(
    bootstrap: &str,
    group: &str,
    configs: &[(&str, Option<&str>)],
) -> (i16, Option<String>) {
    let mut c = admin::connect(bootstrap);
    let req = IncrementalAlterConfigsRequest::default().with_resources(vec![AlterConfigsResource::default()
        .with_resource_type(RESOURCE_GROUP)
        .with_resource_name(s(group))
        .with_configs(
            configs
                .iter()
                .map(|(k, v)| {
                    AlterableConfig::default()
                        .with_name(s(k))
                        .with_config_operation(if v.is_some() { 0 } else { 1 })
                        .with_value(v.map(s))
                })
                .collect(),
        )]);
    let resp = c
        .request(versions::INCREMENTAL_ALTER_CONFIGS, &req)
        .unwrap_or_else(|e| panic!("IncrementalAlterConfigs on group {group}: {e}"));
    let r = resp
        .responses
        .first()
        .unwrap_or_else(|| panic!("IncrementalAlterConfigs on group {group}: no resource in the answer"));
    (r.error_code, r.error_message.as_ref().map(|m| m.to_string()))
}

/// Sets group configs of `group`, failing the test unless the broker accepts them.
pub fn set_group_configs(bootstrap: &str, group: &str, configs: &[(&str, &str)]) {
    let configs: Vec<(&str, Option<&str>)> = configs.iter().map(|(k, v)| (*k, Some(*v))).collect();
    let (code, message) = alter_group_configs(bootstrap, group, &configs);
    assert_eq!(
        code, 0,
        "setting group configs {configs:?} of {group}: error {code} ({message:?})"
    );
}

/// ShareGroupHeartbeat: `topics` is the subscription (`None`: unchanged).
pub fn heartbeat(
    c: &mut RawConn,
    group: &str,
    member: &str,
    epoch: i32,
    topics: Option<&[&str]>,
) -> ShareGroupHeartbeatResponse {
    let req = ShareGroupHeartbeatRequest::default()
        .with_group_id(GroupId(s(group)))
        .with_member_id(s(member))
        .with_member_epoch(epoch)
        .with_subscribed_topic_names(topics.map(|ts| ts.iter().map(|t| TopicName(s(t))).collect()));
    c.request(versions::HEARTBEAT, &req)
        .unwrap_or_else(|e| panic!("ShareGroupHeartbeat {group}/{member}: {e}"))
}

/// ShareGroupDescribe of `groups`.
pub fn describe(c: &mut RawConn, groups: &[&str]) -> ShareGroupDescribeResponse {
    let req =
        ShareGroupDescribeRequest::default().with_group_ids(groups.iter().map(|g| GroupId(s(g))).collect());
    c.request(versions::DESCRIBE, &req)
        .unwrap_or_else(|e| panic!("ShareGroupDescribe {groups:?}: {e}"))
}

/// DescribeShareGroupOffsets v0 of one group: `topics` (name, partitions), `None`: every
/// topic the group has share state for.
pub fn describe_offsets(
    c: &mut RawConn,
    group: &str,
    topics: Option<&[(&str, &[i32])]>,
) -> kafka_protocol::messages::DescribeShareGroupOffsetsResponse {
    use kafka_protocol::messages::describe_share_group_offsets_request::{
        DescribeShareGroupOffsetsRequestGroup, DescribeShareGroupOffsetsRequestTopic,
    };
    let req = kafka_protocol::messages::DescribeShareGroupOffsetsRequest::default().with_groups(vec![
        DescribeShareGroupOffsetsRequestGroup::default()
            .with_group_id(GroupId(s(group)))
            .with_topics(topics.map(|ts| {
                ts.iter()
                    .map(|(t, ps)| {
                        DescribeShareGroupOffsetsRequestTopic::default()
                            .with_topic_name(TopicName(s(t)))
                            .with_partitions(ps.to_vec())
                    })
                    .collect()
            })),
    ]);
    c.request(0, &req)
        .unwrap_or_else(|e| panic!("DescribeShareGroupOffsets {group}: {e}"))
}

/// DeleteShareGroupOffsets v0 of `group` for `topics`.
pub fn delete_offsets(
    c: &mut RawConn,
    group: &str,
    topics: &[&str],
) -> kafka_protocol::messages::DeleteShareGroupOffsetsResponse {
    use kafka_protocol::messages::delete_share_group_offsets_request::DeleteShareGroupOffsetsRequestTopic;
    let req = kafka_protocol::messages::DeleteShareGroupOffsetsRequest::default()
        .with_group_id(GroupId(s(group)))
        .with_topics(
            topics
                .iter()
                .map(|t| DeleteShareGroupOffsetsRequestTopic::default().with_topic_name(TopicName(s(t))))
                .collect(),
        );
    c.request(0, &req)
        .unwrap_or_else(|e| panic!("DeleteShareGroupOffsets {group}: {e}"))
}

/// AlterShareGroupOffsets v0 of `group`: (topic, [(partition, start offset)]).
pub fn alter_offsets(
    c: &mut RawConn,
    group: &str,
    topics: &[(&str, &[(i32, i64)])],
) -> kafka_protocol::messages::AlterShareGroupOffsetsResponse {
    use kafka_protocol::messages::alter_share_group_offsets_request::{
        AlterShareGroupOffsetsRequestPartition, AlterShareGroupOffsetsRequestTopic,
    };
    let req = kafka_protocol::messages::AlterShareGroupOffsetsRequest::default()
        .with_group_id(GroupId(s(group)))
        .with_topics(
            topics
                .iter()
                .map(|(t, ps)| {
                    AlterShareGroupOffsetsRequestTopic::default()
                        .with_topic_name(TopicName(s(t)))
                        .with_partitions(
                            ps.iter()
                                .map(|(p, o)| {
                                    AlterShareGroupOffsetsRequestPartition::default()
                                        .with_partition_index(*p)
                                        .with_start_offset(*o)
                                })
                                .collect(),
                        )
                })
                .collect(),
        );
    c.request(0, &req)
        .unwrap_or_else(|e| panic!("AlterShareGroupOffsets {group}: {e}"))
}

/// Acknowledgement batches of one partition: (first, last, types).
pub type AckBatches = Vec<(i64, i64, Vec<i8>)>;

/// `parts` (topic id, partition, acknowledgement batches) by topic, topics in the order they
/// first appear.
fn by_topic(parts: &[(uuid::Uuid, i32, AckBatches)]) -> Vec<(uuid::Uuid, Vec<(i32, &AckBatches)>)> {
    let mut topics: Vec<(uuid::Uuid, Vec<(i32, &AckBatches)>)> = Vec::new();
    for (topic_id, p, acks) in parts {
        match topics.iter_mut().find(|(id, _)| id == topic_id) {
            Some((_, ps)) => ps.push((*p, acks)),
            None => topics.push((*topic_id, vec![(*p, acks)])),
        }
    }
    topics
}

/// A ShareFetch request: `parts` are (topic id, partition, acknowledgement batches).
pub fn fetch_request(
    group: &str,
    member: &str,
    epoch: i32,
    parts: &[(uuid::Uuid, i32, AckBatches)],
    max_records: i32,
    max_wait_ms: i32,
) -> ShareFetchRequest {
    let partition = |(p, acks): (i32, &AckBatches)| {
        let batches = acks.iter().map(|(a, b, t)| {
            share_fetch_request::AcknowledgementBatch::default()
                .with_first_offset(*a)
                .with_last_offset(*b)
                .with_acknowledge_types(t.clone())
        });
        FetchPartition::default()
            .with_partition_index(p)
            .with_partition_max_bytes(1 << 20)
            .with_acknowledgement_batches(batches.collect())
    };
    let topics = by_topic(parts).into_iter().map(|(id, ps)| {
        FetchTopic::default()
            .with_topic_id(id)
            .with_partitions(ps.into_iter().map(partition).collect())
    });
    ShareFetchRequest::default()
        .with_group_id(Some(GroupId(s(group))))
        .with_member_id(Some(s(member)))
        .with_share_session_epoch(epoch)
        .with_max_wait_ms(max_wait_ms)
        .with_min_bytes(1)
        .with_max_bytes(8 << 20)
        .with_max_records(max_records)
        .with_batch_size(max_records.max(1))
        .with_topics(topics.collect())
}

/// Sends a ShareFetch.
pub fn fetch(c: &mut RawConn, req: &ShareFetchRequest) -> ShareFetchResponse {
    c.request(versions::FETCH, req)
        .unwrap_or_else(|e| panic!("ShareFetch: {e}"))
}

/// A ShareAcknowledge: `parts` are (topic id, partition, acknowledgement batches).
pub fn acknowledge_request(
    group: &str,
    member: &str,
    epoch: i32,
    parts: &[(uuid::Uuid, i32, AckBatches)],
) -> ShareAcknowledgeRequest {
    use share_acknowledge_request::{AcknowledgePartition, AcknowledgeTopic, AcknowledgementBatch};
    let partition = |(p, acks): (i32, &AckBatches)| {
        let batches = acks.iter().map(|(a, b, t)| {
            AcknowledgementBatch::default()
                .with_first_offset(*a)
                .with_last_offset(*b)
                .with_acknowledge_types(t.clone())
        });
        AcknowledgePartition::default()
            .with_partition_index(p)
            .with_acknowledgement_batches(batches.collect())
    };
    let topics = by_topic(parts).into_iter().map(|(id, ps)| {
        AcknowledgeTopic::default()
            .with_topic_id(id)
            .with_partitions(ps.into_iter().map(partition).collect())
    });
    ShareAcknowledgeRequest::default()
        .with_group_id(Some(GroupId(s(group))))
        .with_member_id(Some(s(member)))
        .with_share_session_epoch(epoch)
        .with_topics(topics.collect())
}

/// Sends a ShareAcknowledge.
pub fn acknowledge(c: &mut RawConn, req: &ShareAcknowledgeRequest) -> ShareAcknowledgeResponse {
    c.request(versions::ACKNOWLEDGE, req)
        .unwrap_or_else(|e| panic!("ShareAcknowledge: {e}"))
}

/// The acquired ranges of a ShareFetch answer: (topic id, partition, first, last, delivery
/// count).
pub fn acquired_ranges(resp: &ShareFetchResponse) -> Vec<(uuid::Uuid, i32, i64, i64, i16)> {
    let mut out = Vec::new();
    for t in &resp.responses {
        for p in &t.partitions {
            for a in &p.acquired_records {
                out.push((
                    t.topic_id,
                    p.partition_index,
                    a.first_offset,
                    a.last_offset,
                    a.delivery_count,
                ));
            }
        }
    }
    out
}

/// The records of `topic` with their headers, as `kcat -C -e -f '%p|%o|%s|%h\n'` prints
/// them: (partition, offset, value, header name -> value). Headers are `name=value` pairs
/// joined by commas, so values must not contain commas.
pub fn kcat_records(bootstrap: &str, topic: &str) -> Vec<(i32, i64, String, BTreeMap<String, String>)> {
    let mut cmd = tools::kcat_command();
    cmd.args(["-b", bootstrap, "-C", "-t", topic, "-o", "beginning", "-e", "-q"])
        .args(["-f", "%p|%o|%s|%h\\n"]);
    let desc = format!("{cmd:?}");
    let (status, out, err) = tools::run_with_input(cmd, b"", Duration::from_secs(30));
    assert!(
        status.success(),
        "{desc} failed with {status}; stderr:\n{}",
        String::from_utf8_lossy(&err)
    );
    String::from_utf8_lossy(&out)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let mut it = line.splitn(4, '|');
            let (p, o, v, h) = (it.next(), it.next(), it.next(), it.next());
            let parse = || -> Option<(i32, i64, String, BTreeMap<String, String>)> {
                let headers = h?
                    .split(',')
                    .filter(|kv| !kv.is_empty())
                    .map(|kv| {
                        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
                        (k.to_string(), v.to_string())
                    })
                    .collect();
                Some((p?.parse().ok()?, o?.parse().ok()?, v?.to_string(), headers))
            };
            parse().unwrap_or_else(|| panic!("{desc}: cannot parse the line {line:?}"))
        })
        .collect()
}
