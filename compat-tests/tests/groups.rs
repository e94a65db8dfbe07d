//! Consumer groups with real clients against the real binary (issue 3, "What must show").
//!
//! * Three rdkafka members share a 6-partition topic, once per classic assignor (range,
//!   roundrobin, cooperative-sticky) and once with KIP-848 (`group.protocol=consumer`). One of them
//!   runs in a child process and is killed with SIGKILL (no LeaveGroup, no last commit); its
//!   partitions must move to the others within the session timeout, and consumption must resume
//!   from its last committed offsets.
//! * Committed offsets (with metadata), deleted groups and deleted offsets survive kill -9 and a
//!   restart; a consumer that rejoins continues where the group committed.
//! * `kcat -G`, and a group mixing rdkafka, confluent-kafka and kafka-python.
//! * Admin answers (ListGroups with filters, DescribeGroups, DeleteGroups, OffsetDelete,
//!   ConsumerGroupDescribe) at the protocol level, and as the clients' admin APIs show them.
//! * Error answers of the group protocols, with exact codes.
//!
//! Members, their events and the commit discipline: `strand_compat_tests::group`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::consumer_group_heartbeat_request::TopicPartitions as HbTopicPartitions;
use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
use kafka_protocol::messages::leave_group_request::MemberIdentity;
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::offset_delete_request::{
    OffsetDeleteRequestPartition, OffsetDeleteRequestTopic,
};
use kafka_protocol::messages::offset_fetch_request::{OffsetFetchRequestGroup, OffsetFetchRequestTopics};
use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use kafka_protocol::ResponseError;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use strand_compat_tests::admin::{self, topic_name};
use strand_compat_tests::clients::{self, PythonClient};
use strand_compat_tests::group::{self, Event, EventLog, Logged, Member, MemberSpec};
use strand_compat_tests::raw::RawConn;
use strand_compat_tests::{scenario_tests, tools, unique_topic, wait_for, Broker, BrokerBuilder};

/// The child-process rdkafka member (this crate's binary).
const MEMBER_BIN: &str = env!("CARGO_BIN_EXE_strand-group-consumer");

/// Session timeout the classic members ask for, and the KIP-848 one the broker is configured with.
const SESSION_MS: u64 = 6000;
/// Heartbeat interval, client side (classic) and broker side (KIP-848).
const HEARTBEAT_MS: u64 = 500;

// Request versions: the newest each API has in Kafka 4.1 that Strand serves.
const JOIN_V: i16 = 9;
const SYNC_V: i16 = 5;
const HEARTBEAT_V: i16 = 4;
const LEAVE_V: i16 = 5;
const COMMIT_V: i16 = 9;
const FETCH_OFFSETS_V: i16 = 9;
const LIST_GROUPS_V: i16 = 5;
const DESCRIBE_GROUPS_V: i16 = 6;
const DELETE_GROUPS_V: i16 = 2;
const OFFSET_DELETE_V: i16 = 0;
const CG_HEARTBEAT_V: i16 = 1;
const CG_DESCRIBE_V: i16 = 1;

fn code(e: ResponseError) -> i16 {
    e.code()
}

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

fn gid(v: &str) -> GroupId {
    GroupId(s(v))
}

/// The broker of most tests here: a new group's first rebalance starts at once.
fn group_broker() -> BrokerBuilder {
    // KIP-848 timings below Kafka's bounds need the bounds lowered, as Kafka does.
    Broker::builder()
        .config("group.initial.rebalance.delay.ms", 0)
        .config("group.consumer.min.session.timeout.ms", SESSION_MS)
        .config("group.consumer.min.heartbeat.interval.ms", HEARTBEAT_MS)
}

// ---------------------------------------------------------------------------------------------
// Data: values "<partition>:<offset>" so every consumed record can be checked where it stands.

/// Which (partition, offset) pairs the members consumed so far; updated incrementally.
#[derive(Default)]
struct Coverage {
    seen: BTreeSet<(i32, i64)>,
    processed: usize,
}

impl Coverage {
    fn update(&mut self, log: &[Logged]) {
        for l in &log[self.processed..] {
            if let Event::Records(rs) = &l.event {
                self.seen.extend(rs.iter().map(|(p, o, _)| (*p, *o)));
            }
        }
        self.processed = log.len();
    }

    fn covers(&self, partitions: i32, end: i64) -> bool {
        (0..partitions).all(|p| self.seen.range((p, 0)..(p, end)).count() as i64 == end)
    }
}

fn wait_consumed(log: &EventLog, partitions: i32, end: i64, timeout: Duration) {
    let mut cov = Coverage::default();
    log.wait_for(
        timeout,
        &format!("offsets 0..{end} of all {partitions} partitions to be consumed"),
        |l| {
            cov.update(l);
            cov.covers(partitions, end).then_some(())
        },
    );
}

/// True if the members' assignments are disjoint, cover `0..partitions`, and give each member
/// at least `min_each` partitions.
fn partitioned(
    assignments: &BTreeMap<String, Vec<i32>>,
    members: &[&str],
    partitions: i32,
    min_each: usize,
) -> bool {
    let mut all = Vec::new();
    for m in members {
        match assignments.get(*m) {
            Some(a) if a.len() >= min_each => all.extend(a.iter().copied()),
            _ => return false,
        }
    }
    all.sort_unstable();
    all == (0..partitions).collect::<Vec<_>>()
}

// ---------------------------------------------------------------------------------------------
// Raw protocol helpers.

fn subscription(topics: &[&str]) -> Bytes {
    let sub = ConsumerProtocolSubscription::default().with_topics(topics.iter().map(|t| s(t)).collect());
    let mut b = BytesMut::new();
    b.put_i16(1);
    sub.encode(&mut b, 1).expect("encode a subscription");
    b.freeze()
}

fn assignment_bytes(topic: &str, partitions: &[i32]) -> Bytes {
    let a = ConsumerProtocolAssignment::default().with_assigned_partitions(vec![
        consumer_protocol_assignment::TopicPartition::default()
            .with_topic(topic_name(topic))
            .with_partitions(partitions.to_vec()),
    ]);
    let mut b = BytesMut::new();
    b.put_i16(1);
    a.encode(&mut b, 1).expect("encode an assignment");
    b.freeze()
}

fn decode_assignment(bytes: &Bytes) -> BTreeMap<String, Vec<i32>> {
    let mut buf = bytes.clone();
    assert!(buf.len() >= 2, "assignment of {} bytes", buf.len());
    let version = i16::from_be_bytes([buf[0], buf[1]]);
    let _ = bytes::Buf::get_i16(&mut buf);
    let a = ConsumerProtocolAssignment::decode(&mut buf, version.min(3))
        .unwrap_or_else(|e| panic!("decode a member assignment (version {version}): {e}"));
    a.assigned_partitions
        .into_iter()
        .map(|tp| {
            let mut ps = tp.partitions;
            ps.sort_unstable();
            (tp.topic.0.to_string(), ps)
        })
        .collect()
}

fn join_request(
    group: &str,
    member_id: &str,
    instance: Option<&str>,
    session_ms: i32,
    topic: &str,
) -> JoinGroupRequest {
    JoinGroupRequest::default()
        .with_group_id(gid(group))
        .with_session_timeout_ms(session_ms)
        .with_rebalance_timeout_ms(10_000)
        .with_member_id(s(member_id))
        .with_group_instance_id(instance.map(s))
        .with_protocol_type(s("consumer"))
        .with_protocols(vec![JoinGroupRequestProtocol::default()
            .with_name(s("range"))
            .with_metadata(subscription(&[topic]))])
}

fn join(c: &mut RawConn, req: &JoinGroupRequest) -> JoinGroupResponse {
    c.request(JOIN_V, req)
        .unwrap_or_else(|e| panic!("JoinGroup: {e}"))
}

/// Whom a classic request speaks for: the group, a member id, its generation (or KIP-848 member
/// epoch) and static instance id.
#[derive(Clone, Copy, Debug)]
struct Who<'a> {
    group: &'a str,
    member: &'a str,
    generation: i32,
    instance: Option<&'a str>,
}

impl<'a> Who<'a> {
    fn new(group: &'a str, member: &'a str, generation: i32) -> Who<'a> {
        Who {
            group,
            member,
            generation,
            instance: None,
        }
    }

    /// No member: generation -1, as admin tools and assign-only consumers commit.
    fn simple(group: &'a str) -> Who<'a> {
        Who::new(group, "", -1)
    }

    fn instance(self, instance: &'a str) -> Who<'a> {
        Who {
            instance: Some(instance),
            ..self
        }
    }
}

fn sync(c: &mut RawConn, who: Who<'_>, assignments: Vec<(String, Bytes)>) -> SyncGroupResponse {
    let req = SyncGroupRequest::default()
        .with_group_id(gid(who.group))
        .with_generation_id(who.generation)
        .with_member_id(s(who.member))
        .with_group_instance_id(who.instance.map(s))
        .with_protocol_type(Some(s("consumer")))
        .with_protocol_name(Some(s("range")))
        .with_assignments(
            assignments
                .into_iter()
                .map(|(m, a)| {
                    SyncGroupRequestAssignment::default()
                        .with_member_id(s(&m))
                        .with_assignment(a)
                })
                .collect(),
        );
    c.request(SYNC_V, &req)
        .unwrap_or_else(|e| panic!("SyncGroup: {e}"))
}

/// SyncGroup of a leader that assigns `partitions` of `topic` to itself alone.
fn sync_alone(c: &mut RawConn, who: Who<'_>, topic: &str, partitions: &[i32]) -> SyncGroupResponse {
    let mine = vec![(who.member.to_string(), assignment_bytes(topic, partitions))];
    sync(c, who, mine)
}

fn heartbeat(c: &mut RawConn, who: Who<'_>) -> i16 {
    let req = HeartbeatRequest::default()
        .with_group_id(gid(who.group))
        .with_generation_id(who.generation)
        .with_member_id(s(who.member))
        .with_group_instance_id(who.instance.map(s));
    c.request(HEARTBEAT_V, &req)
        .unwrap_or_else(|e| panic!("Heartbeat: {e}"))
        .error_code
}

fn leave(c: &mut RawConn, group: &str, members: &[(&str, Option<&str>)]) -> LeaveGroupResponse {
    let req = LeaveGroupRequest::default()
        .with_group_id(gid(group))
        .with_members(
            members
                .iter()
                .map(|(m, i)| {
                    MemberIdentity::default()
                        .with_member_id(s(m))
                        .with_group_instance_id(i.map(s))
                })
                .collect(),
        );
    c.request(LEAVE_V, &req)
        .unwrap_or_else(|e| panic!("LeaveGroup: {e}"))
}

/// OffsetCommit at `version` of `offsets` (partition, offset, metadata) of `topic`; returns
/// each partition's error code.
fn commit(
    c: &mut RawConn,
    version: i16,
    who: Who<'_>,
    topic: &str,
    offsets: &[(i32, i64, Option<&str>)],
) -> BTreeMap<i32, i16> {
    let req = OffsetCommitRequest::default()
        .with_group_id(gid(who.group))
        .with_generation_id_or_member_epoch(who.generation)
        .with_member_id(s(who.member))
        .with_group_instance_id(who.instance.map(s))
        .with_retention_time_ms(-1)
        .with_topics(vec![OffsetCommitRequestTopic::default()
            .with_name(topic_name(topic))
            .with_partitions(
                offsets
                    .iter()
                    .map(|(p, o, m)| {
                        OffsetCommitRequestPartition::default()
                            .with_partition_index(*p)
                            .with_committed_offset(*o)
                            .with_committed_leader_epoch(-1)
                            .with_committed_metadata(m.map(s))
                    })
                    .collect(),
            )]);
    let resp = c
        .request(version, &req)
        .unwrap_or_else(|e| panic!("OffsetCommit v{version}: {e}"));
    resp.topics
        .iter()
        .flat_map(|t| t.partitions.iter().map(|p| (p.partition_index, p.error_code)))
        .collect()
}

/// OffsetCommit v9 of `offset` (no metadata) on partition 0 of `topic`: that partition's error
/// code.
fn commit_0(c: &mut RawConn, who: Who<'_>, topic: &str, offset: i64) -> i16 {
    commit(c, COMMIT_V, who, topic, &[(0, offset, None)])[&0]
}

/// A "simple" commit (generation -1, no member), as admin tools and assign-only consumers do.
fn simple_commit(c: &mut RawConn, group: &str, topic: &str, offsets: &[(i32, i64, Option<&str>)]) {
    let errs = commit(c, COMMIT_V, Who::simple(group), topic, offsets);
    assert!(
        errs.values().all(|e| *e == 0),
        "simple OffsetCommit to {group}: {errs:?}"
    );
}

/// What OffsetFetch says for one partition: (offset, metadata, error code).
type Fetched = (i64, Option<String>, i16);

/// OffsetFetch (v9, the groups form) of `partitions` of `topic`; returns (group error,
/// per-partition answers). Retries while the coordinator loads (COORDINATOR_LOAD_IN_PROGRESS,
/// NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE) for up to 30 s.
fn offset_fetch(
    c: &mut RawConn,
    group: &str,
    topic: &str,
    partitions: &[i32],
) -> (i16, BTreeMap<i32, Fetched>) {
    let req = OffsetFetchRequest::default()
        .with_groups(vec![OffsetFetchRequestGroup::default()
            .with_group_id(gid(group))
            .with_member_id(None)
            .with_member_epoch(-1)
            .with_topics(Some(vec![OffsetFetchRequestTopics::default()
                .with_name(topic_name(topic))
                .with_partition_indexes(partitions.to_vec())]))])
        .with_require_stable(false);
    let retriable = [
        code(ResponseError::CoordinatorLoadInProgress),
        code(ResponseError::NotCoordinator),
        code(ResponseError::CoordinatorNotAvailable),
    ];
    wait_for(
        Duration::from_secs(30),
        "OffsetFetch without a coordinator error",
        || {
            let resp = c
                .request(FETCH_OFFSETS_V, &req)
                .unwrap_or_else(|e| panic!("OffsetFetch: {e}"));
            let g = resp
                .groups
                .iter()
                .find(|g| g.group_id.0.as_str() == group)
                .unwrap_or_else(|| panic!("OffsetFetch answer lacks group {group}: {resp:?}"));
            if retriable.contains(&g.error_code) {
                return None;
            }
            let parts: BTreeMap<i32, Fetched> = g
                .topics
                .iter()
                .flat_map(|t| t.partitions.iter())
                .map(|p| {
                    (
                        p.partition_index,
                        (
                            p.committed_offset,
                            p.metadata.as_ref().map(|m| m.to_string()),
                            p.error_code,
                        ),
                    )
                })
                .collect();
            if parts.values().any(|p| retriable.contains(&p.2)) {
                return None;
            }
            Some((g.error_code, parts))
        },
    )
}

/// Committed offsets of `partitions` (asserting no error); -1 where none.
fn committed(c: &mut RawConn, group: &str, topic: &str, partitions: &[i32]) -> BTreeMap<i32, i64> {
    let (err, parts) = offset_fetch(c, group, topic, partitions);
    assert_eq!(
        err,
        0,
        "OffsetFetch {group}: group error {}",
        admin::err_name(err)
    );
    parts
        .into_iter()
        .map(|(p, (o, _, e))| {
            assert_eq!(
                e,
                0,
                "OffsetFetch {group}/{topic}/{p}: error {}",
                admin::err_name(e)
            );
            (p, o)
        })
        .collect()
}

/// Waits (up to 20 s) until `group`'s committed offsets of every partition in `partitions` are
/// `end`.
fn wait_committed(c: &mut RawConn, group: &str, topic: &str, partitions: &[i32], end: i64) {
    wait_for(
        Duration::from_secs(20),
        &format!("the commits of {group} to reach {end}"),
        || {
            committed(c, group, topic, partitions)
                .values()
                .all(|o| *o == end)
                .then_some(())
        },
    );
}

fn list_groups(c: &mut RawConn, version: i16, states: &[&str], types: &[&str]) -> ListGroupsResponse {
    let req = ListGroupsRequest::default()
        .with_states_filter(states.iter().map(|x| s(x)).collect())
        .with_types_filter(types.iter().map(|x| s(x)).collect());
    let resp: ListGroupsResponse = c
        .request(version, &req)
        .unwrap_or_else(|e| panic!("ListGroups v{version}: {e}"));
    assert_eq!(
        resp.error_code,
        0,
        "ListGroups error {}",
        admin::err_name(resp.error_code)
    );
    resp
}

fn listed<'a>(resp: &'a ListGroupsResponse, group: &str) -> Option<&'a list_groups_response::ListedGroup> {
    resp.groups.iter().find(|g| g.group_id.0.as_str() == group)
}

fn describe_groups(c: &mut RawConn, version: i16, groups: &[&str]) -> DescribeGroupsResponse {
    let req = DescribeGroupsRequest::default()
        .with_groups(groups.iter().map(|g| gid(g)).collect())
        .with_include_authorized_operations(version >= 3);
    c.request(version, &req)
        .unwrap_or_else(|e| panic!("DescribeGroups v{version}: {e}"))
}

fn describe_one(c: &mut RawConn, group: &str) -> describe_groups_response::DescribedGroup {
    let mut resp = describe_groups(c, DESCRIBE_GROUPS_V, &[group]);
    assert_eq!(resp.groups.len(), 1, "DescribeGroups of one group: {resp:?}");
    resp.groups.remove(0)
}

/// Waits (up to 10 s) until DescribeGroups shows `group` in `state`.
fn wait_for_state(c: &mut RawConn, group: &str, state: &str) {
    wait_for(
        Duration::from_secs(10),
        &format!("group {group} to be {state}"),
        || (describe_one(c, group).group_state.as_str() == state).then_some(()),
    );
}

fn delete_groups(c: &mut RawConn, groups: &[&str]) -> BTreeMap<String, i16> {
    let req = DeleteGroupsRequest::default().with_groups_names(groups.iter().map(|g| gid(g)).collect());
    let resp: DeleteGroupsResponse = c
        .request(DELETE_GROUPS_V, &req)
        .unwrap_or_else(|e| panic!("DeleteGroups: {e}"));
    resp.results
        .iter()
        .map(|r| (r.group_id.0.to_string(), r.error_code))
        .collect()
}

/// OffsetDelete: (top-level error, per-partition errors).
fn offset_delete(c: &mut RawConn, group: &str, topic: &str, partitions: &[i32]) -> (i16, BTreeMap<i32, i16>) {
    let req = OffsetDeleteRequest::default()
        .with_group_id(gid(group))
        .with_topics(vec![OffsetDeleteRequestTopic::default()
            .with_name(topic_name(topic))
            .with_partitions(
                partitions
                    .iter()
                    .map(|p| OffsetDeleteRequestPartition::default().with_partition_index(*p))
                    .collect(),
            )]);
    let resp: OffsetDeleteResponse = c
        .request(OFFSET_DELETE_V, &req)
        .unwrap_or_else(|e| panic!("OffsetDelete: {e}"));
    (
        resp.error_code,
        resp.topics
            .iter()
            .flat_map(|t| t.partitions.iter().map(|p| (p.partition_index, p.error_code)))
            .collect(),
    )
}

fn cg_describe(c: &mut RawConn, group: &str) -> consumer_group_describe_response::DescribedGroup {
    let req = ConsumerGroupDescribeRequest::default()
        .with_group_ids(vec![gid(group)])
        .with_include_authorized_operations(false);
    let mut resp: ConsumerGroupDescribeResponse = c
        .request(CG_DESCRIBE_V, &req)
        .unwrap_or_else(|e| panic!("ConsumerGroupDescribe: {e}"));
    assert_eq!(
        resp.groups.len(),
        1,
        "ConsumerGroupDescribe of one group: {resp:?}"
    );
    resp.groups.remove(0)
}

/// A KIP-848 heartbeat. `topics`: the subscription (None: unchanged); `owned`: the partitions the
/// member owns (None: unchanged).
fn cg_heartbeat(
    c: &mut RawConn,
    group: &str,
    member_id: &str,
    epoch: i32,
    topics: Option<&[&str]>,
    owned: Option<Vec<(uuid::Uuid, Vec<i32>)>>,
) -> ConsumerGroupHeartbeatResponse {
    let req = ConsumerGroupHeartbeatRequest::default()
        .with_group_id(gid(group))
        .with_member_id(s(member_id))
        .with_member_epoch(epoch)
        .with_rebalance_timeout_ms(if epoch == 0 { 10_000 } else { -1 })
        .with_subscribed_topic_names(topics.map(|ts| ts.iter().map(|t| topic_name(t)).collect()))
        .with_topic_partitions(owned.map(|o| {
            o.into_iter()
                .map(|(id, ps)| HbTopicPartitions::default().with_topic_id(id).with_partitions(ps))
                .collect()
        }));
    c.request(CG_HEARTBEAT_V, &req)
        .unwrap_or_else(|e| panic!("ConsumerGroupHeartbeat: {e}"))
}

fn hb_assignment(resp: &ConsumerGroupHeartbeatResponse) -> Option<Vec<(uuid::Uuid, Vec<i32>)>> {
    resp.assignment.as_ref().map(|a| {
        let mut v: Vec<(uuid::Uuid, Vec<i32>)> = a
            .topic_partitions
            .iter()
            .map(|tp| {
                let mut ps = tp.partitions.clone();
                ps.sort_unstable();
                (tp.topic_id, ps)
            })
            .collect();
        v.sort();
        v
    })
}

// ---------------------------------------------------------------------------------------------
// 1. Three rdkafka members; one crashes; its partitions move; nothing is lost.

#[derive(Clone, Copy, Debug)]
enum Protocol {
    /// The classic protocol with this `partition.assignment.strategy`.
    Classic(&'static str),
    /// KIP-848, `group.protocol=consumer` (server-side assignor).
    Consumer,
}

const PARTITIONS: i32 = 6;
/// Records per partition per phase: 2 phases x 6 partitions x 5,000 = 60,000 records.
const PHASE: i64 = 5_000;
/// Phase 1 comes in two parts: 1a (this many per partition), committed by every member, and 1b.
const FIRST_PART: i64 = 3_000;

/// The members' spec for `protocol`.
fn takeover_spec(protocol: Protocol, bootstrap: &str, group: &str, topic: &str) -> MemberSpec {
    let spec = MemberSpec::new(bootstrap, group, topic);
    match protocol {
        Protocol::Classic(assignor) => spec
            .set("partition.assignment.strategy", assignor)
            .set("session.timeout.ms", SESSION_MS)
            .set("heartbeat.interval.ms", HEARTBEAT_MS),
        // With KIP-848 the session timeout and heartbeat interval are the broker's, and the
        // assignor is chosen on the server.
        Protocol::Consumer => spec.set("group.protocol", "consumer"),
    }
}

/// The scenario (numbers in the constants):
///
/// 1. Members `a` and `b` (threads) and `victim` (child process) join; each must end up with 2
///    of the 6 partitions.
/// 2. Phase 1: 30,000 records (5,000 per partition) are produced and consumed, in two parts.
///    Every member commits what it consumed every 200 ms. Part 1a (3,000 per partition) is
///    consumed and committed by everyone (checked with OffsetFetch); in part 1b (2,000 per
///    partition) the victim stops committing with its first record: 4,000 of its records stay
///    uncommitted.
/// 3. The victim is SIGKILLed (no LeaveGroup). Its committed offsets are read at once (OffsetFetch);
///    phase 2 (another 30,000 records) is produced.
/// 4. Its partitions must move to `a` and `b` no earlier than the session timeout minus a
///    heartbeat interval and 1 s (the broker really waited for the session to expire) and no later
///    than the session timeout plus 3 s.
/// 5. All 60,000 records must be consumed; the group's committed offsets must reach the end.
///
/// "None twice in steady state", precisely: a record may be consumed twice only if the victim
/// consumed it before the crash at or after its last committed offset (its uncommitted tail),
/// and then only once more, by the member that took the partition over, after the crash. Every
/// other record, including across the graceful rebalances (joins, and for the eager assignors the
/// revocation of every partition at the takeover), is consumed exactly once. The new owner's
/// first record of each of the victim's partitions must be the last committed offset.
fn takeover(protocol: Protocol) {
    let started = Instant::now();
    let mut builder = group_broker();
    if let Protocol::Consumer = protocol {
        builder = builder
            .config("group.consumer.session.timeout.ms", SESSION_MS)
            .config("group.consumer.heartbeat.interval.ms", HEARTBEAT_MS);
    }
    let broker = builder.start();
    // Against an external broker, KIP-848 runs with that broker's timeouts (Kafka's defaults).
    let (session_ms, heartbeat_ms) = match protocol {
        Protocol::Classic(_) => (SESSION_MS, HEARTBEAT_MS),
        Protocol::Consumer => (
            broker
                .config_value("group.consumer.session.timeout.ms")
                .map_or(45_000, |v| v.parse().expect("a number")),
            broker
                .config_value("group.consumer.heartbeat.interval.ms")
                .map_or(5_000, |v| v.parse().expect("a number")),
        ),
    };
    let bootstrap = broker.bootstrap();
    let topic = admin::new_topic(&bootstrap, "takeover", PARTITIONS);
    let group_id = unique_topic("takeover-group");
    let mut conn = admin::connect(&bootstrap);

    let log = EventLog::new();
    let spec = takeover_spec(protocol, &bootstrap, &group_id, &topic);
    let a = Member::rdkafka_thread("a", spec.clone(), &log);
    let b = Member::rdkafka_thread("b", spec.clone(), &log);
    // The victim's share of phase 1a is 2 x FIRST_PART records: it commits those, then stops
    // committing with the first record of phase 1b.
    let victim_spec = MemberSpec {
        freeze_commits_after: Some(2 * FIRST_PART as u64 + 1),
        ..spec.clone()
    };
    let mut victim = Member::child(
        "victim",
        group::rdkafka_child_command(Path::new(MEMBER_BIN), &victim_spec),
        &log,
    );
    let members = ["a", "b", "victim"];
    let stable = log.wait_for(
        Duration::from_secs(45),
        "three members with two partitions each",
        |l| {
            let asg = group::assignments(l);
            partitioned(&asg, &members, PARTITIONS, 2).then_some(asg)
        },
    );
    let joined_after = started.elapsed();

    // Phase 1a, consumed and committed by everyone.
    let all: Vec<i32> = (0..PARTITIONS).collect();
    clients::produce_numbered(&bootstrap, &topic, PARTITIONS, 0, FIRST_PART);
    wait_consumed(&log, PARTITIONS, FIRST_PART, Duration::from_secs(60));
    wait_committed(&mut conn, &group_id, &topic, &all, FIRST_PART);
    // Phase 1b: the victim consumes its share without committing.
    clients::produce_numbered(&bootstrap, &topic, PARTITIONS, FIRST_PART, PHASE - FIRST_PART);
    wait_consumed(&log, PARTITIONS, PHASE, Duration::from_secs(60));
    let victim_parts = group::assignments(&log.snapshot())["victim"].clone();
    assert_eq!(
        victim_parts,
        stable["victim"],
        "the victim's assignment changed during phase 1 (a rebalance in steady state); log:\n{}",
        log.summary()
    );

    // The crash.
    let killed_at = Instant::now();
    victim.kill9();
    let at_kill = committed(&mut conn, &group_id, &topic, &victim_parts);
    let resume: BTreeMap<i32, i64> = at_kill.iter().map(|(p, o)| (*p, (*o).max(0))).collect();
    assert!(
        resume.values().all(|o| *o == FIRST_PART),
        "the victim's last commits were of phase 1a ({FIRST_PART} per partition), OffsetFetch says {at_kill:?}"
    );
    let tail: i64 = resume.values().map(|o| PHASE - o).sum();

    // Phase 2, while the group notices.
    clients::produce_numbered(&bootstrap, &topic, PARTITIONS, PHASE, PHASE);
    let survivors = ["a", "b"];
    let moved_at = log.wait_for(
        Duration::from_millis(session_ms + 15_000),
        "the victim's partitions to move to the survivors",
        |l| {
            let mut current: BTreeMap<String, Vec<i32>> = BTreeMap::new();
            for e in l {
                if let Event::Assigned(ps) = &e.event {
                    current.insert(e.member.clone(), ps.clone());
                    if e.at > killed_at && partitioned(&current, &survivors, PARTITIONS, 1) {
                        return Some(e.at);
                    }
                }
            }
            None
        },
    );
    let moved_after = moved_at - killed_at;
    wait_consumed(&log, PARTITIONS, 2 * PHASE, Duration::from_secs(90));
    wait_committed(&mut conn, &group_id, &topic, &all, 2 * PHASE);
    a.stop(Duration::from_secs(20));
    b.stop(Duration::from_secs(20));

    // Every member left: the group is empty (and its offsets stay).
    // DescribeGroups and ConsumerGroupDescribe answer with types of their own, alike in these
    // fields.
    macro_rules! wait_empty {
        ($describe:ident) => {
            wait_for(Duration::from_secs(10), "the group to become Empty", || {
                let d = $describe(&mut conn, &group_id);
                let summary = (d.error_code, d.members.is_empty(), format!("{d:?}"));
                (d.group_state.as_str() == "Empty").then_some(summary)
            })
        };
    }
    let (error, no_members, d) = match protocol {
        Protocol::Classic(_) => wait_empty!(describe_one),
        Protocol::Consumer => wait_empty!(cg_describe),
    };
    assert_eq!(error, 0);
    assert!(no_members, "an empty group lists members: {d}");

    // The analysis.
    let events = log.snapshot();
    let recs = group::records(&events);
    let mut seen: HashMap<(i32, i64), Vec<(&str, Instant)>> = HashMap::new();
    for (member, at, p, o, v) in &recs {
        assert_eq!(
            *v,
            format!("{p}:{o}"),
            "member {member} read a wrong value at {p}/{o}"
        );
        seen.entry((*p, *o)).or_default().push((member, *at));
    }
    let missing: Vec<(i32, i64)> = (0..PARTITIONS)
        .flat_map(|p| (0..2 * PHASE).map(move |o| (p, o)))
        .filter(|k| !seen.contains_key(k))
        .collect();
    assert!(
        missing.is_empty(),
        "{} records were never consumed, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(10)]
    );
    let mut bad = Vec::new();
    let mut redelivered = 0i64;
    for ((p, o), readers) in &seen {
        let in_tail = victim_parts.contains(p) && *o >= resume[p] && *o < PHASE;
        let ok = if in_tail {
            readers.len() == 2
                && readers[0].0 == "victim"
                && readers[0].1 <= killed_at
                && readers[1].0 != "victim"
                && readers[1].1 > killed_at
        } else {
            readers.len() == 1
        };
        if in_tail && ok {
            redelivered += 1;
        }
        if !ok {
            bad.push(format!(
                "{p}/{o} read by {:?}",
                readers.iter().map(|r| r.0).collect::<Vec<_>>()
            ));
        }
    }
    bad.sort();
    assert!(
        bad.is_empty(),
        "{} records broke the at-most-once-in-steady-state rule (tail of the victim: {resume:?} .. {PHASE} \
         on {victim_parts:?}), e.g.:\n{}",
        bad.len(),
        bad[..bad.len().min(15)].join("\n")
    );
    assert_eq!(redelivered, tail, "re-delivered records");
    for p in &victim_parts {
        let first = recs
            .iter()
            .find(|(m, at, rp, _, _)| *rp == *p && *m != "victim" && *at > killed_at)
            .map(|r| r.3);
        assert_eq!(
            first,
            Some(resume[p]),
            "the new owner of partition {p} must start at the last committed offset"
        );
    }
    let per_member: BTreeMap<&str, usize> = recs.iter().fold(BTreeMap::new(), |mut m, r| {
        *m.entry(r.0).or_default() += 1;
        m
    });
    eprintln!(
        "[takeover {protocol:?}] 3 members stable after {:.1}s; victim {victim_parts:?} killed with \
         {tail} uncommitted records; its partitions moved {:.2}s after the kill (session timeout \
         {session_ms} ms); records per member {per_member:?}; total {:.1}s",
        joined_after.as_secs_f64(),
        moved_after.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    let min = Duration::from_millis(session_ms.saturating_sub(heartbeat_ms + 1000));
    let max = Duration::from_millis(session_ms + 3000);
    assert!(
        moved_after >= min,
        "the partitions moved {moved_after:?} after the kill: before the session ({session_ms} ms) can \
         have expired"
    );
    assert!(
        moved_after <= max,
        "the partitions moved {moved_after:?} after the kill: more than the session timeout ({session_ms} ms) + 3 s"
    );
}

scenario_tests!(takeover {
    takeover_range: Protocol::Classic("range");
    takeover_roundrobin: Protocol::Classic("roundrobin");
    takeover_cooperative_sticky: Protocol::Classic("cooperative-sticky");
    takeover_kip848_consumer_protocol: Protocol::Consumer;
});

// ---------------------------------------------------------------------------------------------
// 2. Committed offsets survive kill -9.

fn group_consumer(bootstrap: &str, group: &str) -> BaseConsumer {
    clients::base_config(bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("enable.partition.eof", "false")
        .set("session.timeout.ms", SESSION_MS.to_string())
        .set("heartbeat.interval.ms", HEARTBEAT_MS.to_string())
        .create()
        .unwrap_or_else(|e| panic!("create an rdkafka group consumer: {e}"))
}

/// Polls until `count` records arrived; returns (partition, offset, value).
fn poll_n(consumer: &BaseConsumer, count: usize, timeout: Duration) -> Vec<(i32, i64, String)> {
    clients::poll_records(consumer, count, timeout)
        .into_iter()
        .map(|c| {
            (
                c.partition,
                c.offset,
                String::from_utf8_lossy(c.value.as_deref().unwrap_or_default()).into_owned(),
            )
        })
        .collect()
}

fn commit_with_metadata(consumer: &BaseConsumer, topic: &str, offsets: &[(i32, i64, &str)]) {
    let mut tpl = TopicPartitionList::new();
    for (p, o, m) in offsets {
        let mut e = tpl.add_partition(topic, *p);
        e.set_offset(Offset::Offset(*o)).expect("offset");
        e.set_metadata(m);
    }
    consumer
        .commit(&tpl, CommitMode::Sync)
        .unwrap_or_else(|e| panic!("rdkafka commit {offsets:?}: {e}"));
}

#[test]
fn committed_offsets_survive_kill9_and_restart() {
    let mut broker = group_broker()
        .needs_spawned("kills and restarts the broker")
        .start();
    let bootstrap = broker.bootstrap();
    let topic = admin::new_topic(&bootstrap, "durable-offsets", 3);
    clients::produce_numbered(&bootstrap, &topic, 3, 0, 100);
    let group_id = unique_topic("durable-group");
    let simple = unique_topic("durable-simple");
    let deleted = unique_topic("durable-deleted");
    let pruned = unique_topic("durable-pruned");
    let meta2 = "meta-2 \u{fc}\u{2713} {\"json\": true}";

    // A real member consumes everything and commits, several times for partition 0 (the last
    // value must win after the reload).
    let consumer = group_consumer(&bootstrap, &group_id);
    consumer.subscribe(&[&topic]).expect("subscribe");
    let got = poll_n(&consumer, 300, Duration::from_secs(60));
    assert_eq!(got.len(), 300);
    commit_with_metadata(&consumer, &topic, &[(0, 10, "first")]);
    commit_with_metadata(&consumer, &topic, &[(0, 20, "second")]);
    commit_with_metadata(
        &consumer,
        &topic,
        &[(0, 37, "meta-0"), (1, 50, ""), (2, 99, meta2)],
    );
    // The client-level view before the crash.
    let mut want_tpl = TopicPartitionList::new();
    for p in 0..3 {
        want_tpl.add_partition(&topic, p);
    }
    let seen = consumer
        .committed_offsets(want_tpl.clone(), Duration::from_secs(15))
        .expect("rdkafka committed_offsets");
    let seen: Vec<(i32, Offset, String)> = seen
        .elements()
        .iter()
        .map(|e| (e.partition(), e.offset(), e.metadata().to_string()))
        .collect();
    assert_eq!(
        seen,
        vec![
            (0, Offset::Offset(37), "meta-0".to_string()),
            (1, Offset::Offset(50), String::new()),
            (2, Offset::Offset(99), meta2.to_string())
        ]
    );
    drop(consumer);

    let mut c = admin::connect(&bootstrap);
    simple_commit(&mut c, &simple, &topic, &[(0, 5, Some("simple")), (2, 6, None)]);
    simple_commit(&mut c, &deleted, &topic, &[(0, 7, None)]);
    assert_eq!(
        delete_groups(&mut c, &[&deleted])[&deleted],
        0,
        "DeleteGroups of an empty group"
    );
    simple_commit(&mut c, &pruned, &topic, &[(0, 8, None), (1, 9, None)]);
    let (e, parts) = offset_delete(&mut c, &pruned, &topic, &[1]);
    assert_eq!(
        (e, parts.get(&1).copied()),
        (0, Some(0)),
        "OffsetDelete on an empty group"
    );
    let expected_main: BTreeMap<i32, Fetched> = BTreeMap::from([
        (0, (37, Some("meta-0".to_string()), 0)),
        (1, (50, Some(String::new()), 0)),
        (2, (99, Some(meta2.to_string()), 0)),
    ]);
    let before = offset_fetch(&mut c, &group_id, &topic, &[0, 1, 2]);
    assert_eq!(before, (0, expected_main.clone()), "OffsetFetch before the crash");

    // The crash: right after the last acknowledged write.
    broker.kill9();
    broker.restart();
    let mut c = admin::connect(&bootstrap);
    let after = offset_fetch(&mut c, &group_id, &topic, &[0, 1, 2]);
    assert_eq!(after, (0, expected_main), "OffsetFetch after kill -9 and restart");
    assert_eq!(
        committed(&mut c, &simple, &topic, &[0, 1, 2]),
        BTreeMap::from([(0, 5), (1, -1), (2, 6)]),
        "a simple (memberless) commit after the restart"
    );
    let (_, simple_meta) = offset_fetch(&mut c, &simple, &topic, &[0]);
    assert_eq!(simple_meta[&0].1.as_deref(), Some("simple"));
    assert_eq!(
        committed(&mut c, &deleted, &topic, &[0]),
        BTreeMap::from([(0, -1)]),
        "a deleted group's offsets came back after the restart"
    );
    assert_eq!(
        committed(&mut c, &pruned, &topic, &[0, 1]),
        BTreeMap::from([(0, 8), (1, -1)]),
        "a deleted offset came back after the restart"
    );
    let groups = list_groups(&mut c, LIST_GROUPS_V, &[], &[]);
    let g = listed(&groups, &group_id).unwrap_or_else(|| panic!("{group_id} not listed after the restart"));
    assert_eq!(
        (
            g.group_state.as_str(),
            g.protocol_type.as_str(),
            g.group_type.as_str()
        ),
        ("Empty", "consumer", "classic")
    );
    assert!(
        listed(&groups, &deleted).is_none(),
        "the deleted group is listed again"
    );

    // A member that joins after the restart continues exactly where the group committed.
    let consumer = group_consumer(&bootstrap, &group_id);
    consumer.subscribe(&[&topic]).expect("subscribe");
    let rest = poll_n(&consumer, 63 + 50 + 1, Duration::from_secs(60));
    let mut first: BTreeMap<i32, i64> = BTreeMap::new();
    let mut keys = BTreeSet::new();
    for (p, o, v) in &rest {
        first.entry(*p).or_insert(*o);
        assert_eq!(*v, format!("{p}:{o}"));
        assert!(keys.insert((*p, *o)), "{p}/{o} read twice after the restart");
    }
    assert_eq!(
        first,
        BTreeMap::from([(0, 37), (1, 50), (2, 99)]),
        "first offsets after the restart"
    );
    let extra = poll_n_or_none(&consumer, Duration::from_secs(1));
    assert!(extra.is_empty(), "records beyond the end: {extra:?}");
    commit_with_metadata(&consumer, &topic, &[(0, 100, ""), (1, 100, ""), (2, 100, "")]);
    drop(consumer);
    assert_eq!(
        committed(&mut c, &group_id, &topic, &[0, 1, 2]),
        BTreeMap::from([(0, 100), (1, 100), (2, 100)])
    );
}

/// Live members of a classic group and of a KIP-848 group keep consuming across a kill -9 and
/// restart of the broker: nothing is lost, and since everything consumed before the crash was
/// committed (and acknowledged), nothing is consumed twice either, whether the members keep their
/// membership or have to rejoin.
#[test]
fn live_groups_continue_across_broker_kill9() {
    let mut broker = group_broker()
        .config("group.consumer.session.timeout.ms", SESSION_MS)
        .config("group.consumer.heartbeat.interval.ms", HEARTBEAT_MS)
        .needs_spawned("kills and restarts the broker")
        .start();
    let bootstrap = broker.bootstrap();
    let topic = admin::new_topic(&bootstrap, "live-restart", 4);
    let classic = unique_topic("live-classic");
    let modern = unique_topic("live-modern");
    let log = EventLog::new();
    let classic_spec = MemberSpec::new(&bootstrap, &classic, &topic)
        .set("partition.assignment.strategy", "cooperative-sticky")
        .set("session.timeout.ms", SESSION_MS)
        .set("heartbeat.interval.ms", HEARTBEAT_MS);
    let modern_spec = MemberSpec::new(&bootstrap, &modern, &topic).set("group.protocol", "consumer");
    let members = [
        Member::rdkafka_thread("classic-1", classic_spec.clone(), &log),
        Member::rdkafka_thread("classic-2", classic_spec, &log),
        Member::rdkafka_thread("modern-1", modern_spec.clone(), &log),
        Member::rdkafka_thread("modern-2", modern_spec, &log),
    ];
    log.wait_for(
        Duration::from_secs(30),
        "both groups to share the partitions",
        |l| {
            let a = group::assignments(l);
            (partitioned(&a, &["classic-1", "classic-2"], 4, 2)
                && partitioned(&a, &["modern-1", "modern-2"], 4, 2))
            .then_some(())
        },
    );
    let mut c = admin::connect(&bootstrap);
    let all = [0, 1, 2, 3];
    let consumed_by = |l: &[Logged], prefix: &str, end: i64| {
        let seen: BTreeSet<(i32, i64)> = group::records(l)
            .into_iter()
            .filter(|r| r.0.starts_with(prefix))
            .map(|r| (r.2, r.3))
            .collect();
        (0..4).all(|p| seen.range((p, 0)..(p, end)).count() as i64 == end)
    };
    clients::produce_numbered(&bootstrap, &topic, 4, 0, 1000);
    log.wait_for(
        Duration::from_secs(60),
        "both groups to consume the first 4,000",
        |l| (consumed_by(l, "classic", 1000) && consumed_by(l, "modern", 1000)).then_some(()),
    );
    for g in [&classic, &modern] {
        wait_committed(&mut c, g, &topic, &all, 1000);
    }

    broker.kill9();
    let down_at = Instant::now();
    broker.restart();
    eprintln!(
        "[live restart] broker back after {:.2}s",
        down_at.elapsed().as_secs_f64()
    );
    clients::produce_numbered(&bootstrap, &topic, 4, 1000, 1000);
    log.wait_for(
        Duration::from_secs(60),
        "both groups to consume all 8,000 after the restart",
        |l| (consumed_by(l, "classic", 2000) && consumed_by(l, "modern", 2000)).then_some(()),
    );
    eprintln!(
        "[live restart] both groups caught up {:.2}s after the kill",
        down_at.elapsed().as_secs_f64()
    );
    let mut c = admin::connect(&bootstrap);
    for g in [&classic, &modern] {
        wait_committed(&mut c, g, &topic, &all, 2000);
    }
    for m in members {
        m.stop(Duration::from_secs(20));
    }
    let events = log.snapshot();
    for prefix in ["classic", "modern"] {
        let mut readers: HashMap<(i32, i64), Vec<&str>> = HashMap::new();
        for (member, _, p, o, v) in group::records(&events) {
            if member.starts_with(prefix) {
                assert_eq!(v, format!("{p}:{o}"));
                readers.entry((p, o)).or_default().push(member);
            }
        }
        let mut twice: Vec<_> = readers.iter().filter(|(_, r)| r.len() > 1).collect();
        twice.sort();
        assert!(
            twice.is_empty(),
            "{prefix} group: {} records consumed twice although everything was committed before the crash, \
             e.g. {:?}",
            twice.len(),
            &twice[..twice.len().min(10)]
        );
    }
    let failed: Vec<String> = events
        .iter()
        .filter_map(|l| match &l.event {
            Event::CommitFailed { error, .. } => Some(format!("{}: {error}", l.member)),
            _ => None,
        })
        .collect();
    eprintln!("[live restart] failed commits (retried later): {failed:?}");
}

/// Whatever arrives within `wait` (no errors expected).
fn poll_n_or_none(consumer: &BaseConsumer, wait: Duration) -> Vec<(i32, i64)> {
    let deadline = Instant::now() + wait;
    let mut out = Vec::new();
    while Instant::now() < deadline {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
            use rdkafka::Message;
            out.push((m.partition(), m.offset()));
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// 3. kcat -G, and three client stacks in one group.

/// Runs `kcat -G <group> <topic>` until it reaches the end of every assigned partition (`-e`);
/// returns (partition, offset, value).
fn kcat_group(bootstrap: &str, group: &str, topic: &str) -> Vec<(i32, i64, String)> {
    let mut cmd = tools::kcat_command();
    // `-o beginning` would override the committed offsets in kcat's -G mode; the reset policy
    // applies only where the group has none.
    cmd.args(["-b", bootstrap, "-G", group, "-e", "-q", "-f", "%p %o %s\\n"])
        .args([
            "-X",
            "broker.address.family=v4",
            "-X",
            "auto.offset.reset=earliest",
        ])
        .args(["-X", "session.timeout.ms=6000"])
        .arg(topic);
    let (status, out, err) = tools::run_with_input(cmd, b"", Duration::from_secs(60));
    assert!(
        status.success(),
        "kcat -G failed with {status}: {}",
        String::from_utf8_lossy(&err)
    );
    String::from_utf8_lossy(&out)
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| {
            let mut it = l.splitn(3, ' ');
            let p = it.next().and_then(|x| x.parse().ok());
            let o = it.next().and_then(|x| x.parse().ok());
            match (p, o, it.next()) {
                (Some(p), Some(o), Some(v)) => (p, o, v.to_string()),
                _ => panic!("unexpected kcat line {l:?}"),
            }
        })
        .collect()
}

#[test]
fn kcat_group_consumer_reads_once_and_resumes_from_its_commits() {
    let broker = group_broker().start();
    let bootstrap = broker.bootstrap();
    let topic = admin::new_topic(&bootstrap, "kcat-group", 3);
    let group_id = unique_topic("kcat-group-g");
    clients::produce_numbered(&bootstrap, &topic, 3, 0, 1000);

    let check = |got: &[(i32, i64, String)], from: i64, to: i64| {
        let mut keys = BTreeSet::new();
        for (p, o, v) in got {
            assert_eq!(*v, format!("{p}:{o}"), "kcat read a wrong value");
            assert!(keys.insert((*p, *o)), "kcat read {p}/{o} twice");
        }
        let want: BTreeSet<(i32, i64)> = (0..3).flat_map(|p| (from..to).map(move |o| (p, o))).collect();
        assert_eq!(
            keys.len(),
            want.len(),
            "kcat read {} records, expected {}",
            keys.len(),
            want.len()
        );
        assert_eq!(keys, want);
    };
    check(&kcat_group(&bootstrap, &group_id, &topic), 0, 1000);
    let mut c = admin::connect(&bootstrap);
    assert_eq!(
        committed(&mut c, &group_id, &topic, &[0, 1, 2]),
        BTreeMap::from([(0, 1000), (1, 1000), (2, 1000)]),
        "kcat commits what it consumed when it closes"
    );
    // Again: nothing new, then only the new records.
    check(&kcat_group(&bootstrap, &group_id, &topic), 0, 0);
    clients::produce_numbered(&bootstrap, &topic, 3, 1000, 100);
    check(&kcat_group(&bootstrap, &group_id, &topic), 1000, 1100);
    let d = describe_one(&mut c, &group_id);
    assert_eq!((d.error_code, d.group_state.as_str()), (0, "Empty"));
}

/// Client stacks sharing one group: each must get partitions and everything must be consumed
/// exactly once. `assignor`: a classic assignor all of them implement, or `None` for KIP-848
/// (rdkafka and confluent-kafka only: kafka-python has no KIP-848 consumer).
fn mixed_group(assignor: Option<&str>) {
    let broker = group_broker()
        .config("group.consumer.heartbeat.interval.ms", HEARTBEAT_MS)
        .start();
    let bootstrap = broker.bootstrap();
    let topic = admin::new_topic(&bootstrap, "mixed-group", PARTITIONS);
    let group_id = unique_topic("mixed-group-g");
    let log = EventLog::new();
    let base = MemberSpec::new(&bootstrap, &group_id, &topic);
    let mut members = Vec::new();
    match assignor {
        Some(assignor) => {
            let librdkafka_spec = base
                .clone()
                .set("partition.assignment.strategy", assignor)
                .set("session.timeout.ms", SESSION_MS)
                .set("heartbeat.interval.ms", HEARTBEAT_MS);
            let kafka_python_spec = base
                .set("partition_assignment_strategy", assignor)
                .set("session_timeout_ms", SESSION_MS)
                .set("heartbeat_interval_ms", HEARTBEAT_MS);
            members.push(Member::rdkafka_thread("rdkafka", librdkafka_spec.clone(), &log));
            members.push(Member::child(
                "confluent-kafka",
                group::python_group_command(PythonClient::ConfluentKafka, &librdkafka_spec),
                &log,
            ));
            members.push(Member::child(
                "kafka-python",
                group::python_group_command(PythonClient::KafkaPython, &kafka_python_spec),
                &log,
            ));
        }
        None => {
            let spec = base.set("group.protocol", "consumer");
            members.push(Member::rdkafka_thread("rdkafka", spec.clone(), &log));
            members.push(Member::child(
                "confluent-kafka",
                group::python_group_command(PythonClient::ConfluentKafka, &spec),
                &log,
            ));
        }
    }
    let names: Vec<String> = members.iter().map(|m| m.name.clone()).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let each = PARTITIONS as usize / names.len();
    log.wait_for(
        Duration::from_secs(60),
        &format!("{} members with {each} partitions each", names.len()),
        |l| partitioned(&group::assignments(l), &names, PARTITIONS, each).then_some(()),
    );
    let mut c = admin::connect(&bootstrap);
    if let Some(assignor) = assignor {
        let d = describe_one(&mut c, &group_id);
        assert_eq!(
            (
                d.group_state.as_str(),
                d.protocol_type.as_str(),
                d.protocol_data.as_str(),
                d.members.len()
            ),
            ("Stable", "consumer", assignor, 3),
            "DescribeGroups of the mixed group: {d:?}"
        );
        let clients: BTreeSet<String> = d.members.iter().map(|m| m.client_id.to_string()).collect();
        eprintln!("[mixed group {assignor}] client ids: {clients:?}");
    } else {
        let d = cg_describe(&mut c, &group_id);
        assert_eq!((d.group_state.as_str(), d.members.len()), ("Stable", 2), "{d:?}");
    }

    clients::produce_numbered(&bootstrap, &topic, PARTITIONS, 0, 1000);
    wait_consumed(&log, PARTITIONS, 1000, Duration::from_secs(60));
    let all: Vec<i32> = (0..PARTITIONS).collect();
    wait_committed(&mut c, &group_id, &topic, &all, 1000);
    for m in members {
        m.stop(Duration::from_secs(30));
    }

    let events = log.snapshot();
    let mut readers: HashMap<(i32, i64), Vec<&str>> = HashMap::new();
    for (member, _, p, o, v) in group::records(&events) {
        assert_eq!(v, format!("{p}:{o}"), "{member} read a wrong value");
        readers.entry((p, o)).or_default().push(member);
    }
    let twice: Vec<_> = readers.iter().filter(|(_, r)| r.len() > 1).take(10).collect();
    assert!(twice.is_empty(), "records consumed twice: {twice:?}");
    assert_eq!(readers.len(), (PARTITIONS as usize) * 1000);
    for name in &names {
        let n = readers.values().filter(|r| r[0] == *name).count();
        assert!(n > 0, "{name} consumed nothing");
        assert!(
            events
                .iter()
                .any(|l| l.member == *name && l.event == Event::Closed),
            "{name} did not close"
        );
    }
    if assignor.is_some() {
        let d = describe_one(&mut c, &group_id);
        assert_eq!((d.group_state.as_str(), d.members.len()), ("Empty", 0));
    } else {
        let d = cg_describe(&mut c, &group_id);
        assert_eq!((d.group_state.as_str(), d.members.len()), ("Empty", 0));
    }
}

scenario_tests!(mixed_group {
    rdkafka_confluent_kafka_and_kafka_python_share_a_group_range: Some("range");
    rdkafka_confluent_kafka_and_kafka_python_share_a_group_roundrobin: Some("roundrobin");
    rdkafka_and_confluent_kafka_share_a_kip848_group: None;
});

// ---------------------------------------------------------------------------------------------
// 4. Admin.

#[test]
fn admin_list_describe_delete_and_offset_delete() {
    let broker = group_broker().start();
    let bootstrap = broker.bootstrap();
    let topic = admin::new_topic(&bootstrap, "admin-groups", 4);
    let (topic_id, _) = admin::topic_info(&mut admin::connect(&bootstrap), &topic);
    let mut c = admin::connect(&bootstrap);

    // A classic group with a live rdkafka member (range), a KIP-848 group with a raw member, an
    // empty group holding only offsets, and several more classic groups so that both shards'
    // coordinators hold some (ListGroups must gather them all).
    let classic = unique_topic("admin-classic");
    let modern = unique_topic("admin-modern");
    let offsets_only = unique_topic("admin-offsets-only");
    let extra: Vec<String> = (0..6).map(|i| unique_topic(&format!("admin-extra{i}"))).collect();
    let consumer = group_consumer(&bootstrap, &classic);
    consumer.subscribe(&[&topic]).expect("subscribe");
    wait_for(Duration::from_secs(30), "the rdkafka member's assignment", || {
        let _ = consumer.poll(Duration::from_millis(100));
        consumer.assignment().ok().filter(|a| a.count() == 4).map(|_| ())
    });
    let modern_member = uuid::Uuid::new_v4().to_string();
    let hb = cg_heartbeat(&mut c, &modern, &modern_member, 0, Some(&[&topic]), Some(vec![]));
    admin::assert_ok(hb.error_code, "ConsumerGroupHeartbeat join");
    let mut epoch = hb.member_epoch;
    // The assignment comes in the answer that first carries it (not repeated afterwards).
    let assigned = match hb_assignment(&hb).filter(|a| !a.is_empty()) {
        Some(a) => a,
        None => wait_for(Duration::from_secs(10), "the KIP-848 member's assignment", || {
            let hb = cg_heartbeat(&mut c, &modern, &modern_member, epoch, None, None);
            admin::assert_ok(hb.error_code, "heartbeat");
            epoch = hb.member_epoch;
            hb_assignment(&hb).filter(|a| !a.is_empty())
        }),
    };
    assert_eq!(
        assigned,
        vec![(topic_id, vec![0, 1, 2, 3])],
        "a lone member gets every partition"
    );
    let hb = cg_heartbeat(
        &mut c,
        &modern,
        &modern_member,
        epoch,
        None,
        Some(assigned.clone()),
    );
    assert_eq!(hb.error_code, 0);
    let epoch = hb.member_epoch;
    simple_commit(&mut c, &offsets_only, &topic, &[(0, 1, None), (1, 2, None)]);
    for (i, g) in extra.iter().enumerate() {
        simple_commit(&mut c, g, &topic, &[(0, 30 + i as i64, None)]);
    }
    // One OffsetFetch naming every group (the broker splits it by coordinator and merges the
    // answers), in the request's order.
    let req = OffsetFetchRequest::default().with_groups(
        extra
            .iter()
            .chain([&offsets_only])
            .map(|g| {
                OffsetFetchRequestGroup::default()
                    .with_group_id(gid(g))
                    .with_member_epoch(-1)
                    .with_topics(Some(vec![OffsetFetchRequestTopics::default()
                        .with_name(topic_name(&topic))
                        .with_partition_indexes(vec![0])]))
            })
            .collect(),
    );
    let resp: OffsetFetchResponse = c.request(FETCH_OFFSETS_V, &req).expect("OffsetFetch of 7 groups");
    let got: Vec<(String, i16, i64)> = resp
        .groups
        .iter()
        .map(|g| {
            (
                g.group_id.to_string(),
                g.error_code,
                g.topics[0].partitions[0].committed_offset,
            )
        })
        .collect();
    let want: Vec<(String, i16, i64)> = extra
        .iter()
        .enumerate()
        .map(|(i, g)| (g.clone(), 0, 30 + i as i64))
        .chain([(offsets_only.clone(), 0, 1)])
        .collect();
    assert_eq!(got, want, "OffsetFetch of several groups at once");

    // ListGroups: all versions list all groups; v4+ filters by state, v5+ by type.
    let all = list_groups(&mut c, 3, &[], &[]);
    for g in [&classic, &modern, &offsets_only].into_iter().chain(&extra) {
        assert!(
            listed(&all, g).is_some(),
            "ListGroups v3 lacks {g}: {:?}",
            all.groups
        );
    }
    assert_eq!(
        listed(&all, &classic).map(|g| g.protocol_type.as_str()),
        Some("consumer")
    );
    let v5 = list_groups(&mut c, 5, &[], &[]);
    let state_type = |r: &ListGroupsResponse, g: &str| {
        listed(r, g).map(|l| {
            (
                l.group_state.to_string(),
                l.group_type.to_string(),
                l.protocol_type.to_string(),
            )
        })
    };
    assert_eq!(
        state_type(&v5, &classic),
        Some(("Stable".into(), "classic".into(), "consumer".into()))
    );
    assert_eq!(
        state_type(&v5, &modern),
        Some(("Stable".into(), "consumer".into(), "consumer".into()))
    );
    assert_eq!(
        state_type(&v5, &offsets_only),
        Some(("Empty".into(), "classic".into(), String::new()))
    );
    let stable = list_groups(&mut c, 4, &["Stable"], &[]);
    assert!(listed(&stable, &classic).is_some() && listed(&stable, &modern).is_some());
    assert!(
        listed(&stable, &offsets_only).is_none(),
        "states filter Stable lists an Empty group"
    );
    // Kafka compares states without regard to case.
    let empty = list_groups(&mut c, 4, &["empty"], &[]);
    assert!(listed(&empty, &offsets_only).is_some() && listed(&empty, &classic).is_none());
    let consumers = list_groups(&mut c, 5, &[], &["consumer"]);
    assert!(listed(&consumers, &modern).is_some());
    assert!(listed(&consumers, &classic).is_none() && listed(&consumers, &offsets_only).is_none());
    let classics = list_groups(&mut c, 5, &["Stable"], &["classic"]);
    assert!(listed(&classics, &classic).is_some());
    assert!(listed(&classics, &modern).is_none() && listed(&classics, &offsets_only).is_none());

    // DescribeGroups: the classic group with its member and assignment.
    let d = describe_one(&mut c, &classic);
    assert_eq!(
        (
            d.error_code,
            d.group_state.as_str(),
            d.protocol_type.as_str(),
            d.protocol_data.as_str()
        ),
        (0, "Stable", "consumer", "range")
    );
    assert_eq!(d.members.len(), 1, "{d:?}");
    let m = &d.members[0];
    assert!(m.member_id.starts_with("rdkafka-"), "member id {:?}", m.member_id);
    assert_eq!(m.client_id.as_str(), "rdkafka");
    assert_eq!(m.client_host.as_str(), "/127.0.0.1");
    assert_eq!(
        decode_assignment(&m.member_assignment),
        BTreeMap::from([(topic.clone(), vec![0, 1, 2, 3])])
    );
    let mut meta = m.member_metadata.clone();
    assert!(meta.len() > 2, "no subscription metadata");
    let sub_version = bytes::Buf::get_i16(&mut meta);
    let sub =
        ConsumerProtocolSubscription::decode(&mut meta, sub_version.min(3)).expect("decode the subscription");
    assert_eq!(
        sub.topics.iter().map(|t| t.to_string()).collect::<Vec<_>>(),
        vec![topic.clone()],
        "the member's subscription in DescribeGroups"
    );
    assert_ne!(
        d.authorized_operations,
        i32::MIN,
        "authorized operations were asked for"
    );
    // A KIP-848 group is not a classic group; an unknown one is Dead (GROUP_ID_NOT_FOUND from v6).
    for g in [&modern, &"no-such-group".to_string()] {
        let d = describe_one(&mut c, g);
        assert_eq!(
            (d.error_code, d.group_state.as_str()),
            (code(ResponseError::GroupIdNotFound), "Dead"),
            "DescribeGroups v6 of {g}"
        );
        let old = describe_groups(&mut c, 5, &[g]);
        assert_eq!(
            (old.groups[0].error_code, old.groups[0].group_state.as_str()),
            (0, "Dead"),
            "DescribeGroups v5 of {g}"
        );
    }
    let od = describe_one(&mut c, &offsets_only);
    assert_eq!(
        (od.error_code, od.group_state.as_str(), od.members.len()),
        (0, "Empty", 0)
    );

    // ConsumerGroupDescribe of the KIP-848 group.
    let cd = cg_describe(&mut c, &modern);
    assert_eq!((cd.error_code, cd.group_state.as_str()), (0, "Stable"), "{cd:?}");
    assert!(
        cd.group_epoch >= 1 && cd.assignment_epoch == cd.group_epoch,
        "{cd:?}"
    );
    assert_eq!(
        cd.assignor_name.as_str(),
        "uniform",
        "the default server assignor"
    );
    assert_eq!(cd.members.len(), 1);
    let cm = &cd.members[0];
    assert_eq!(cm.member_id.as_str(), modern_member);
    assert_eq!(cm.member_epoch, epoch);
    assert_eq!(cm.client_id.as_str(), strand_compat_tests::raw::CLIENT_ID);
    assert_eq!(cm.client_host.as_str(), "/127.0.0.1");
    assert_eq!(
        cm.subscribed_topic_names
            .iter()
            .map(|t| t.0.to_string())
            .collect::<Vec<_>>(),
        vec![topic.clone()]
    );
    let parts = |a: &consumer_group_describe_response::Assignment| {
        a.topic_partitions
            .iter()
            .map(|tp| (tp.topic_id, tp.topic_name.0.to_string(), tp.partitions.clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        parts(&cm.assignment),
        vec![(topic_id, topic.clone(), vec![0, 1, 2, 3])]
    );
    assert_eq!(parts(&cm.target_assignment), parts(&cm.assignment));
    for g in [&classic, &"no-such-group".to_string()] {
        let d = cg_describe(&mut c, g);
        assert_eq!(
            d.error_code,
            code(ResponseError::GroupIdNotFound),
            "ConsumerGroupDescribe of {g}"
        );
    }

    // The client-level view: librdkafka's group list (ListGroups + DescribeGroups).
    let list = consumer
        .fetch_group_list(Some(&classic), Duration::from_secs(15))
        .expect("rdkafka fetch_group_list");
    let info = list
        .groups()
        .iter()
        .find(|g| g.name() == classic)
        .unwrap_or_else(|| panic!("rdkafka's group list lacks {classic}"));
    assert_eq!(
        (
            info.state(),
            info.protocol_type(),
            info.protocol(),
            info.members().len()
        ),
        ("Stable", "consumer", "range", 1)
    );
    let everything = consumer
        .fetch_group_list(None, Duration::from_secs(15))
        .expect("rdkafka fetch_group_list (all)");
    let names: BTreeSet<&str> = everything.groups().iter().map(|g| g.name()).collect();
    for g in [&classic, &modern, &offsets_only].into_iter().chain(&extra) {
        assert!(
            names.contains(g.as_str()),
            "rdkafka's list of all groups lacks {g}: {names:?}"
        );
    }

    // OffsetDelete: refused for a topic the live group subscribes to, allowed in an empty group.
    commit_with_metadata(&consumer, &topic, &[(0, 5, ""), (1, 6, "")]);
    let (e, parts) = offset_delete(&mut c, &classic, &topic, &[0]);
    assert_eq!(
        (e, parts.get(&0).copied()),
        (0, Some(code(ResponseError::GroupSubscribedToTopic))),
        "OffsetDelete while subscribed"
    );
    let (e, parts) = offset_delete(&mut c, &modern, &topic, &[0]);
    assert_eq!(
        (e, parts.get(&0).copied()),
        (0, Some(code(ResponseError::GroupSubscribedToTopic))),
        "OffsetDelete in a KIP-848 group subscribed to the topic"
    );
    let (e, _) = offset_delete(&mut c, "no-such-group", &topic, &[0]);
    assert_eq!(
        e,
        code(ResponseError::GroupIdNotFound),
        "OffsetDelete of an unknown group"
    );
    let (e, parts) = offset_delete(&mut c, &offsets_only, &topic, &[0]);
    assert_eq!((e, parts.get(&0).copied()), (0, Some(0)));
    assert_eq!(
        committed(&mut c, &offsets_only, &topic, &[0, 1]),
        BTreeMap::from([(0, -1), (1, 2)])
    );

    // DeleteGroups: NON_EMPTY_GROUP while members exist, then success, then GROUP_ID_NOT_FOUND.
    let res = delete_groups(&mut c, &[&classic, &modern]);
    assert_eq!(
        (res[&classic], res[&modern]),
        (
            code(ResponseError::NonEmptyGroup),
            code(ResponseError::NonEmptyGroup)
        )
    );
    drop(consumer);
    let hb = cg_heartbeat(&mut c, &modern, &modern_member, -1, None, None);
    assert_eq!(hb.error_code, 0, "leaving heartbeat (epoch -1)");
    assert_eq!(hb.member_epoch, -1);
    wait_for(
        Duration::from_secs(10),
        "the classic group to become Empty",
        || (describe_one(&mut c, &classic).group_state.as_str() == "Empty").then_some(()),
    );
    let (e, parts) = offset_delete(&mut c, &classic, &topic, &[0]);
    assert_eq!(
        (e, parts.get(&0).copied()),
        (0, Some(0)),
        "OffsetDelete once the group is empty"
    );
    assert_eq!(
        committed(&mut c, &classic, &topic, &[0, 1]),
        BTreeMap::from([(0, -1), (1, 6)])
    );
    let res = delete_groups(&mut c, &[&classic, &modern, &offsets_only]);
    assert!(
        res.values().all(|e| *e == 0),
        "DeleteGroups of empty groups: {res:?}"
    );
    let res = delete_groups(&mut c, &[&classic, &modern]);
    assert!(
        res.values().all(|e| *e == code(ResponseError::GroupIdNotFound)),
        "DeleteGroups of deleted groups: {res:?}"
    );
    assert_eq!(
        committed(&mut c, &classic, &topic, &[1]),
        BTreeMap::from([(1, -1)])
    );
    let after = list_groups(&mut c, LIST_GROUPS_V, &[], &[]);
    for g in [&classic, &modern, &offsets_only] {
        assert!(
            listed(&after, g).is_none(),
            "{g} is still listed after DeleteGroups"
        );
    }
    for g in &extra {
        assert!(listed(&after, g).is_some(), "{g} disappeared");
    }

    // The rdkafka admin API deletes groups too.
    let admin_client: rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext> =
        clients::base_config(&bootstrap)
            .create()
            .expect("rdkafka admin client");
    let results = futures::executor::block_on(admin_client.delete_groups(
        &[&extra[0], "no-such-group"],
        &rdkafka::admin::AdminOptions::new().request_timeout(Some(Duration::from_secs(15))),
    ))
    .expect("rdkafka delete_groups");
    let results: Vec<Result<String, String>> = results
        .into_iter()
        .map(|r| r.map_err(|(g, e)| format!("{g}: {e:?}")))
        .collect();
    assert_eq!(results[0], Ok(extra[0].clone()));
    assert!(
        results[1].as_ref().is_err_and(|e| e.contains("GroupIdNotFound")),
        "rdkafka delete_groups of an unknown group: {:?}",
        results[1]
    );
}

/// The admin view of confluent-kafka (librdkafka 2.16, the Java Admin API's shape) and
/// kafka-python: list with state and type filters, describe (KIP-848 and classic), offsets,
/// delete offsets, delete groups.
#[test]
fn python_admin_clients_see_groups_as_kafka_tools_do() {
    let broker = group_broker().start();
    let bootstrap = broker.bootstrap();
    let topic = admin::new_topic(&bootstrap, "py-admin", 2);
    let classic = unique_topic("py-admin-classic");
    let modern = unique_topic("py-admin-modern");
    let empty = unique_topic("py-admin-empty");
    let log = EventLog::new();
    let spec = MemberSpec::new(&bootstrap, &classic, &topic)
        .set("partition.assignment.strategy", "roundrobin")
        .set("session.timeout.ms", SESSION_MS);
    let classic_member = Member::rdkafka_thread("classic", spec, &log);
    let modern_member = Member::rdkafka_thread(
        "modern",
        MemberSpec::new(&bootstrap, &modern, &topic).set("group.protocol", "consumer"),
        &log,
    );
    log.wait_for(
        Duration::from_secs(30),
        "both members to get both partitions",
        |l| {
            let a = group::assignments(l);
            (a.get("classic").map(Vec::len) == Some(2) && a.get("modern").map(Vec::len) == Some(2))
                .then_some(())
        },
    );
    let mut c = admin::connect(&bootstrap);
    simple_commit(&mut c, &empty, &topic, &[(0, 11, Some("m0")), (1, 12, None)]);

    let input = serde_json::json!({
        "bootstrap": bootstrap,
        "list": [
            {"states": [], "types": []},
            {"states": ["STABLE"], "types": []},
            {"states": ["EMPTY"], "types": []},
            {"states": [], "types": ["CONSUMER"]},
            {"states": [], "types": ["CLASSIC"]}
        ],
        "describe": [classic, modern, empty],
        "offsets": [empty],
        "topic": topic,
    });
    let out = clients::python_client(
        PythonClient::ConfluentKafka,
        &["groups-admin".to_string()],
        &input,
        Duration::from_secs(60),
    );
    eprintln!("[confluent-kafka admin] {out}");
    let lists = out["list"].as_array().expect("list results");
    let has = |i: usize, g: &str| {
        lists[i]["groups"]
            .as_array()
            .expect("groups")
            .iter()
            .any(|x| x["group_id"] == g)
    };
    assert!(
        has(0, &classic) && has(0, &modern) && has(0, &empty),
        "list all: {}",
        lists[0]
    );
    assert!(
        has(1, &classic) && has(1, &modern) && !has(1, &empty),
        "list Stable: {}",
        lists[1]
    );
    assert!(
        !has(2, &classic) && !has(2, &modern) && has(2, &empty),
        "list Empty: {}",
        lists[2]
    );
    assert!(
        !has(3, &classic) && has(3, &modern) && !has(3, &empty),
        "list consumer: {}",
        lists[3]
    );
    assert!(
        has(4, &classic) && !has(4, &modern) && has(4, &empty),
        "list classic: {}",
        lists[4]
    );
    assert!(
        lists
            .iter()
            .all(|l| l["errors"].as_array().is_some_and(|e| e.is_empty())),
        "{lists:?}"
    );
    let described = &out["describe"];
    for (group, what, group_type, assignor) in [
        (&classic, "describe classic", "CLASSIC", "roundrobin"),
        (&modern, "describe consumer group", "CONSUMER", "uniform"),
    ] {
        let d = &described[group];
        assert_eq!(d["error"], serde_json::Value::Null, "{what}: {d}");
        let shape = (
            d["state"].as_str(),
            d["type"].as_str(),
            d["partition_assignor"].as_str(),
        );
        assert_eq!(shape, (Some("STABLE"), Some(group_type), Some(assignor)), "{d}");
        let assigned = d["members"][0]["assignment"].as_array().map(Vec::len);
        assert_eq!(assigned, Some(2), "{d}");
    }
    let de = &described[&empty];
    assert_eq!(
        (de["state"].as_str(), de["members"].as_array().map(Vec::len)),
        (Some("EMPTY"), Some(0)),
        "{de}"
    );
    assert_eq!(
        out["offsets"][&empty],
        serde_json::json!([[0, 11], [1, 12]]),
        "list_consumer_group_offsets"
    );

    // kafka-python: delete a committed offset (OffsetDelete), then groups.
    let kp = clients::python_client(
        PythonClient::KafkaPython,
        &["groups-admin".to_string()],
        &serde_json::json!({
            "bootstrap": bootstrap,
            "topic": topic,
            "delete_offsets": [[empty, 0], [classic, 0]],
            "delete_groups": [empty, classic],
        }),
        Duration::from_secs(60),
    );
    eprintln!("[kafka-python admin] {kp}");
    assert_eq!(
        kp["delete_offsets"][0],
        serde_json::json!({"group": empty, "error": null}),
        "{kp}"
    );
    assert!(
        kp["delete_offsets"][1]["error"]
            .as_str()
            .is_some_and(|e| e.contains("GroupSubscribedToTopic")),
        "{kp}"
    );
    assert_eq!(kp["delete_groups"][&empty], serde_json::Value::Null, "{kp}");
    assert!(
        kp["delete_groups"][&classic]
            .as_str()
            .is_some_and(|e| e.contains("NonEmptyGroup")),
        "{kp}"
    );
    assert_eq!(
        committed(&mut c, &empty, &topic, &[0, 1]),
        BTreeMap::from([(0, -1), (1, -1)])
    );
    classic_member.stop(Duration::from_secs(20));
    modern_member.stop(Duration::from_secs(20));
}

// ---------------------------------------------------------------------------------------------
// 5. Errors at the protocol level.

#[test]
fn classic_protocol_errors() {
    let broker = group_broker().start();
    let bootstrap = broker.bootstrap();
    let topic = admin::new_topic(&bootstrap, "errors", 2);
    let group_id = unique_topic("errors-g");
    let mut c = admin::connect(&bootstrap);

    // FindCoordinator names this broker.
    let fc: FindCoordinatorResponse = c
        .request(
            6,
            &FindCoordinatorRequest::default()
                .with_key_type(0)
                .with_coordinator_keys(vec![s(&group_id)]),
        )
        .expect("FindCoordinator");
    assert_eq!(fc.coordinators.len(), 1);
    assert_eq!(fc.coordinators[0].error_code, 0);
    assert_eq!(
        format!("{}:{}", fc.coordinators[0].host, fc.coordinators[0].port),
        bootstrap
    );

    // KIP-394: v4+ without a member id gets MEMBER_ID_REQUIRED and an id; joining with it works.
    let first = join(&mut c, &join_request(&group_id, "", None, 10_000, &topic));
    assert_eq!(first.error_code, code(ResponseError::MemberIdRequired));
    let m1 = first.member_id.to_string();
    assert!(!m1.is_empty(), "MEMBER_ID_REQUIRED without a member id");
    assert!(
        m1.starts_with(strand_compat_tests::raw::CLIENT_ID),
        "member ids start with the client id, as Kafka's: {m1}"
    );
    let joined = join(&mut c, &join_request(&group_id, &m1, None, 10_000, &topic));
    admin::assert_ok(joined.error_code, "join with the given id");
    assert_eq!(joined.member_id.as_str(), m1);
    assert_eq!(joined.leader.as_str(), m1, "the only member leads");
    assert_eq!(
        joined.members.len(),
        1,
        "the leader gets the members' subscriptions"
    );
    assert_eq!(joined.protocol_name.as_ref().map(|p| p.as_str()), Some("range"));
    let gen1 = joined.generation_id;
    assert!(gen1 >= 1);
    let m1_gen1 = Who::new(&group_id, &m1, gen1);
    let synced = sync_alone(&mut c, m1_gen1, &topic, &[0, 1]);
    assert_eq!(synced.error_code, 0);
    assert_eq!(
        decode_assignment(&synced.assignment),
        BTreeMap::from([(topic.clone(), vec![0, 1])])
    );
    assert_eq!(heartbeat(&mut c, m1_gen1), 0);

    // Wrong generation, unknown member.
    let nobody = Who::new(&group_id, "nobody", gen1);
    let wrong_generation = heartbeat(&mut c, Who::new(&group_id, &m1, gen1 + 1));
    let unknown_heartbeat = heartbeat(&mut c, nobody);
    let unknown_sync = sync(&mut c, nobody, vec![]).error_code;
    let unknown_commit = commit(&mut c, 8, nobody, &topic, &[(0, 1, None)])[&0];
    let simple_commit_v8 = commit(&mut c, 8, Who::simple(&group_id), &topic, &[(0, 1, None)])[&0];
    let current_commit = commit(&mut c, 8, m1_gen1, &topic, &[(0, 3, Some("gen1"))])[&0];
    assert_eq!(
        wrong_generation,
        code(ResponseError::IllegalGeneration),
        "heartbeat with a wrong generation"
    );
    for (got, what) in [
        (unknown_heartbeat, "heartbeat of an unknown member"),
        (unknown_sync, "sync of an unknown member"),
        (unknown_commit, "commit of an unknown member"),
        (
            simple_commit_v8,
            "a simple commit (generation -1) into a group with members",
        ),
    ] {
        assert_eq!(got, code(ResponseError::UnknownMemberId), "{what}");
    }
    assert_eq!(current_commit, 0, "commit with the current generation");

    // A second member: the group rebalances; the first learns it from its heartbeat.
    let mut c2 = admin::connect(&bootstrap);
    let second = join(&mut c2, &join_request(&group_id, "", None, 10_000, &topic));
    assert_eq!(second.error_code, code(ResponseError::MemberIdRequired));
    let m2 = second.member_id.to_string();
    let pending_join = c2
        .send_request(JOIN_V, &join_request(&group_id, &m2, None, 10_000, &topic))
        .expect("send JoinGroup");
    // (The second member's JoinGroup travels on another connection: wait until it is in.)
    let mut c3 = admin::connect(&bootstrap);
    wait_for_state(&mut c3, &group_id, "PreparingRebalance");
    assert_eq!(
        heartbeat(&mut c, m1_gen1),
        code(ResponseError::RebalanceInProgress),
        "heartbeat of the first member while the group rebalances"
    );
    assert_eq!(
        commit(&mut c, 8, m1_gen1, &topic, &[(0, 4, None)])[&0],
        0,
        "a commit with the current generation while preparing the rebalance (Kafka accepts it)"
    );
    let rejoined = join(&mut c, &join_request(&group_id, &m1, None, 10_000, &topic));
    assert_eq!(rejoined.error_code, 0);
    let joined2 = c2.read_response().expect("JoinGroup answer of the second member");
    assert_eq!(joined2.correlation_id, pending_join);
    let joined2: JoinGroupResponse = joined2.decode(JOIN_V).expect("decode JoinGroup");
    assert_eq!(joined2.error_code, 0);
    let gen2 = rejoined.generation_id;
    assert_eq!(joined2.generation_id, gen2);
    assert_eq!(gen2, gen1 + 1);
    let leader = rejoined.leader.to_string();
    assert!(leader == m1 || leader == m2);
    let (lc, lm, fc2, fm) = if leader == m1 {
        (&mut c, &m1, &mut c2, &m2)
    } else {
        (&mut c2, &m2, &mut c, &m1)
    };
    // The follower's SyncGroup waits for the leader's.
    let pending_sync = fc2
        .send_request(
            SYNC_V,
            &SyncGroupRequest::default()
                .with_group_id(gid(&group_id))
                .with_generation_id(gen2)
                .with_member_id(s(fm))
                .with_protocol_type(Some(s("consumer")))
                .with_protocol_name(Some(s("range"))),
        )
        .expect("send SyncGroup");
    let ls = sync(
        lc,
        Who::new(&group_id, lm, gen2),
        vec![
            (m1.clone(), assignment_bytes(&topic, &[0])),
            (m2.clone(), assignment_bytes(&topic, &[1])),
        ],
    );
    assert_eq!(ls.error_code, 0);
    let fs = fc2.read_response().expect("SyncGroup answer of the follower");
    assert_eq!(fs.correlation_id, pending_sync);
    let fs: SyncGroupResponse = fs.decode(SYNC_V).expect("decode SyncGroup");
    assert_eq!(fs.error_code, 0);
    let want_follower = if fm == &m1 { vec![0] } else { vec![1] };
    assert_eq!(
        decode_assignment(&fs.assignment),
        BTreeMap::from([(topic.clone(), want_follower)])
    );

    // A commit with the previous generation: ILLEGAL_GENERATION.
    for (version, what) in [
        (8, "commit with a stale generation"),
        (COMMIT_V, "commit v9 with a stale generation"),
    ] {
        let errs = commit(&mut c, version, m1_gen1, &topic, &[(0, 5, None)]);
        assert_eq!(errs[&0], code(ResponseError::IllegalGeneration), "{what}");
    }
    assert_eq!(
        offset_fetch(&mut c, &group_id, &topic, &[0]).1[&0].0,
        4,
        "a refused commit changed the offset"
    );
    let m1_gen2 = Who::new(&group_id, &m1, gen2);
    assert_eq!(heartbeat(&mut c, m1_gen2), 0);

    // Session timeouts outside [group.min.session.timeout.ms, group.max.session.timeout.ms]
    // (Kafka's defaults 6 s and 30 min).
    for bad in [5_999, 1_800_001] {
        let r = join(&mut c, &join_request(&group_id, &m1, None, bad, &topic));
        assert_eq!(
            r.error_code,
            code(ResponseError::InvalidSessionTimeout),
            "session timeout {bad} ms"
        );
    }
    let lv = leave(&mut c, &group_id, &[(&m1, None), (&m2, None)]);
    assert_eq!(lv.error_code, 0);
    assert!(lv.members.iter().all(|m| m.error_code == 0), "{lv:?}");
    let lv = leave(&mut c, &group_id, &[(&m1, None)]);
    assert_eq!(
        lv.members.first().map(|m| m.error_code),
        Some(code(ResponseError::UnknownMemberId)),
        "leaving twice"
    );
    assert_eq!(
        commit(&mut c, 8, m1_gen2, &topic, &[(0, 9, None)])[&0],
        code(ResponseError::UnknownMemberId),
        "a commit with a generation by a member that has left (the group is empty)"
    );

    // KIP-345 static membership: a second join with the same instance id replaces the member;
    // the old member id is fenced.
    let static_group = unique_topic("errors-static");
    let static_join = join_request(&static_group, "", Some("instance-1"), 10_000, &topic);
    let s1 = join(&mut c, &static_join);
    admin::assert_ok(s1.error_code, "a static member joins without MEMBER_ID_REQUIRED");
    let old_id = s1.member_id.to_string();
    let old = Who::new(&static_group, &old_id, s1.generation_id).instance("instance-1");
    assert_eq!(sync_alone(&mut c, old, &topic, &[0, 1]).error_code, 0);
    let s2 = join(&mut c2, &static_join);
    admin::assert_ok(s2.error_code, "the static member restarts");
    let new_id = s2.member_id.to_string();
    assert_ne!(new_id, old_id);
    let fenced_heartbeat = heartbeat(&mut c, old);
    let fenced_commit = commit(&mut c, 8, old, &topic, &[(0, 1, None)])[&0];
    let lv = leave(&mut c, &static_group, &[(&old_id, Some("instance-1"))]);
    let fenced_leave = lv.members.first().map_or(-1, |m| m.error_code);
    for (got, what) in [
        (fenced_heartbeat, "heartbeat of the replaced static member"),
        (fenced_commit, "commit of the replaced static member"),
        (fenced_leave, "LeaveGroup of the replaced static member"),
    ] {
        assert_eq!(got, code(ResponseError::FencedInstanceId), "{what}: {lv:?}");
    }
}

#[test]
fn consumer_protocol_errors() {
    let broker = Broker::builder().start();
    let bootstrap = broker.bootstrap();
    let t1 = admin::new_topic(&bootstrap, "cg-errors-a", 2);
    let t2 = admin::new_topic(&bootstrap, "cg-errors-b", 2);
    let mut c = admin::connect(&bootstrap);
    let (id1, _) = admin::topic_info(&mut c, &t1);
    let (id2, _) = admin::topic_info(&mut c, &t2);
    let group_id = unique_topic("cg-errors-g");
    let member = uuid::Uuid::new_v4().to_string();

    // Join (epoch 0) subscribed to t1; the assignment arrives with epoch 1.
    let hb = cg_heartbeat(&mut c, &group_id, &member, 0, Some(&[&t1]), Some(vec![]));
    admin::assert_ok(hb.error_code, "join");
    assert_eq!(hb.member_id.as_ref().map(|m| m.as_str()), Some(member.as_str()));
    assert!(hb.heartbeat_interval_ms > 0);
    let e1 = hb.member_epoch;
    assert!(e1 >= 1, "epoch after joining: {e1}");
    let a1 = match hb_assignment(&hb) {
        Some(a) if !a.is_empty() => a,
        _ => wait_for(Duration::from_secs(10), "the first assignment", || {
            let hb = cg_heartbeat(&mut c, &group_id, &member, e1, None, None);
            assert_eq!(hb.error_code, 0);
            hb_assignment(&hb).filter(|a| !a.is_empty())
        }),
    };
    assert_eq!(a1, vec![(id1, vec![0, 1])]);
    let hb = cg_heartbeat(&mut c, &group_id, &member, e1, None, Some(a1.clone()));
    assert_eq!((hb.error_code, hb.member_epoch), (0, e1));

    // Commits need the current epoch.
    let member_e1 = Who::new(&group_id, &member, e1);
    assert_eq!(
        commit_0(&mut c, member_e1, &t1, 10),
        0,
        "commit with the current member epoch"
    );

    // Subscribing to t2 too bumps the epoch: the new partitions come with an epoch e2 > e1
    // (nothing to revoke, so at once or at the next heartbeat).
    let hb = cg_heartbeat(
        &mut c,
        &group_id,
        &member,
        e1,
        Some(&[&t1, &t2]),
        Some(a1.clone()),
    );
    admin::assert_ok(hb.error_code, "subscription change");
    let (e2, a2) = if hb.member_epoch > e1 {
        (hb.member_epoch, hb_assignment(&hb))
    } else {
        wait_for(Duration::from_secs(10), "the member epoch to move", || {
            let hb = cg_heartbeat(&mut c, &group_id, &member, e1, None, None);
            admin::assert_ok(hb.error_code, "heartbeat");
            (hb.member_epoch > e1).then(|| (hb.member_epoch, hb_assignment(&hb)))
        })
    };
    let mut want = vec![(id1, vec![0, 1]), (id2, vec![0, 1])];
    want.sort();
    assert_eq!(
        a2,
        Some(want.clone()),
        "assignment after subscribing to both topics"
    );
    let hb = cg_heartbeat(&mut c, &group_id, &member, e2, None, Some(want));
    assert_eq!((hb.error_code, hb.member_epoch), (0, e2));

    // OffsetCommit v9 with the old epoch: STALE_MEMBER_EPOCH; the current one works.
    assert_eq!(
        commit_0(&mut c, member_e1, &t1, 20),
        code(ResponseError::StaleMemberEpoch),
        "commit with an old member epoch"
    );
    let member_e2 = Who::new(&group_id, &member, e2);
    let current = commit_0(&mut c, member_e2, &t1, 21);
    assert_eq!(current, 0, "commit with the current member epoch");
    assert_eq!(offset_fetch(&mut c, &group_id, &t1, &[0]).1[&0].0, 21);
    assert_eq!(
        commit_0(&mut c, Who::new(&group_id, "nobody", e2), &t1, 22),
        code(ResponseError::UnknownMemberId),
        "commit of an unknown member"
    );
    // OffsetFetch v9 from a member checks its epoch too.
    for (who, epoch, want) in [
        (member.as_str(), e2, 0),
        (member.as_str(), e1, code(ResponseError::StaleMemberEpoch)),
        ("nobody", e2, code(ResponseError::UnknownMemberId)),
    ] {
        let req = OffsetFetchRequest::default().with_groups(vec![OffsetFetchRequestGroup::default()
            .with_group_id(gid(&group_id))
            .with_member_id(Some(s(who)))
            .with_member_epoch(epoch)
            .with_topics(Some(vec![OffsetFetchRequestTopics::default()
                .with_name(topic_name(&t1))
                .with_partition_indexes(vec![0])]))]);
        let resp: OffsetFetchResponse = c.request(FETCH_OFFSETS_V, &req).expect("OffsetFetch v9");
        assert_eq!(
            resp.groups[0].error_code,
            want,
            "OffsetFetch v9 by member {who} with epoch {epoch}: {}",
            admin::err_name(resp.groups[0].error_code)
        );
    }

    // A heartbeat with a future epoch is fenced (the member stays; Kafka changes nothing);
    // an unknown member is unknown.
    let hb = cg_heartbeat(&mut c, &group_id, &member, e2 + 5, None, None);
    assert_eq!(
        hb.error_code,
        code(ResponseError::FencedMemberEpoch),
        "heartbeat with a future epoch"
    );
    let other = uuid::Uuid::new_v4().to_string();
    let hb = cg_heartbeat(&mut c, &group_id, &other, 3, None, None);
    assert_eq!(
        hb.error_code,
        code(ResponseError::UnknownMemberId),
        "heartbeat of an unknown member"
    );
    let hb = cg_heartbeat(&mut c, &group_id, &member, e2, None, None);
    assert_eq!(
        (hb.error_code, hb.member_epoch),
        (0, e2),
        "the member's own epoch still works after a fenced heartbeat"
    );
    // A classic member cannot join a consumer group that has members.
    let j = join(&mut c, &join_request(&group_id, "", None, 10_000, &t1));
    admin::assert_code(
        j.error_code,
        ResponseError::InconsistentGroupProtocol,
        "JoinGroup into a KIP-848 group",
    );
}

/// Every version Strand advertises of the classic group APIs, of OffsetCommit/OffsetFetch and of
/// the admin APIs answers in that version's shape: a member joins (v0-v3 get a member id at once,
/// v4+ go through MEMBER_ID_REQUIRED), syncs, heartbeats, commits, fetches its offsets (with
/// metadata), is listed and described, and leaves.
#[test]
fn every_advertised_version_of_the_group_apis() {
    let broker = group_broker().start();
    let bootstrap = broker.bootstrap();
    let topic = admin::new_topic(&bootstrap, "versions", 2);
    let mut c = admin::connect(&bootstrap);
    let mut range = |key: ApiKey| {
        admin::advertised_versions(&mut c, key as i16).unwrap_or_else(|| panic!("{key:?} is not advertised"))
    };
    let (join_min, join_max) = range(ApiKey::JoinGroup);
    let (_, sync_max) = range(ApiKey::SyncGroup);
    let (_, hb_max) = range(ApiKey::Heartbeat);
    let (_, leave_max) = range(ApiKey::LeaveGroup);
    let (commit_min, commit_max) = range(ApiKey::OffsetCommit);
    let (fetch_min, fetch_max) = range(ApiKey::OffsetFetch);
    let (list_min, list_max) = range(ApiKey::ListGroups);
    let (desc_min, desc_max) = range(ApiKey::DescribeGroups);
    eprintln!(
        "[versions] JoinGroup {join_min}-{join_max}, SyncGroup -{sync_max}, Heartbeat -{hb_max}, LeaveGroup \
         -{leave_max}, OffsetCommit {commit_min}-{commit_max}, OffsetFetch {fetch_min}-{fetch_max}, ListGroups \
         {list_min}-{list_max}, DescribeGroups {desc_min}-{desc_max}"
    );
    for v in join_min..=join_max {
        let group_id = unique_topic(&format!("versions-v{v}"));
        let mut req = join_request(&group_id, "", None, 10_000, &topic).with_group_instance_id(None);
        if v < 1 {
            req.rebalance_timeout_ms = -1;
        }
        let first: JoinGroupResponse = c
            .request(v, &req)
            .unwrap_or_else(|e| panic!("JoinGroup v{v}: {e}"));
        let joined = if v >= 4 {
            assert_eq!(
                first.error_code,
                code(ResponseError::MemberIdRequired),
                "JoinGroup v{v}"
            );
            req.member_id = first.member_id.clone();
            c.request(v, &req)
                .unwrap_or_else(|e| panic!("JoinGroup v{v}: {e}"))
        } else {
            first
        };
        admin::assert_ok(joined.error_code, &format!("JoinGroup v{v}"));
        let member = joined.member_id.to_string();
        assert!(!member.is_empty(), "JoinGroup v{v}: no member id");
        assert_eq!(joined.leader.as_str(), member, "JoinGroup v{v}");
        assert_eq!(joined.generation_id, 1, "JoinGroup v{v}");
        assert_eq!(
            joined.members.len(),
            1,
            "JoinGroup v{v}: the leader gets the members"
        );
        assert_eq!(
            joined.members[0].metadata,
            subscription(&[&topic]),
            "JoinGroup v{v}"
        );
        assert_eq!(
            joined.protocol_name.as_ref().map(|p| p.to_string()),
            Some("range".to_string()),
            "JoinGroup v{v}"
        );

        let sv = v.min(sync_max);
        let mut sreq = SyncGroupRequest::default()
            .with_group_id(gid(&group_id))
            .with_generation_id(1)
            .with_member_id(s(&member))
            .with_assignments(vec![SyncGroupRequestAssignment::default()
                .with_member_id(s(&member))
                .with_assignment(assignment_bytes(&topic, &[0, 1]))]);
        if sv >= 5 {
            sreq = sreq
                .with_protocol_type(Some(s("consumer")))
                .with_protocol_name(Some(s("range")));
        }
        let synced: SyncGroupResponse = c
            .request(sv, &sreq)
            .unwrap_or_else(|e| panic!("SyncGroup v{sv}: {e}"));
        assert_eq!(synced.error_code, 0, "SyncGroup v{sv}");
        assert_eq!(
            decode_assignment(&synced.assignment),
            BTreeMap::from([(topic.clone(), vec![0, 1])]),
            "SyncGroup v{sv}"
        );

        let hv = v.min(hb_max);
        let hb: HeartbeatResponse = c
            .request(
                hv,
                &HeartbeatRequest::default()
                    .with_group_id(gid(&group_id))
                    .with_generation_id(1)
                    .with_member_id(s(&member)),
            )
            .unwrap_or_else(|e| panic!("Heartbeat v{hv}: {e}"));
        assert_eq!(hb.error_code, 0, "Heartbeat v{hv}");

        let lv = v.min(leave_max);
        let lreq = if lv >= 3 {
            LeaveGroupRequest::default()
                .with_group_id(gid(&group_id))
                .with_members(vec![MemberIdentity::default().with_member_id(s(&member))])
        } else {
            LeaveGroupRequest::default()
                .with_group_id(gid(&group_id))
                .with_member_id(s(&member))
        };
        let left: LeaveGroupResponse = c
            .request(lv, &lreq)
            .unwrap_or_else(|e| panic!("LeaveGroup v{lv}: {e}"));
        assert_eq!(left.error_code, 0, "LeaveGroup v{lv}");
        if lv >= 3 {
            assert_eq!(left.members.len(), 1, "LeaveGroup v{lv}");
            assert_eq!(left.members[0].error_code, 0, "LeaveGroup v{lv}");
            assert_eq!(left.members[0].member_id.as_str(), member, "LeaveGroup v{lv}");
        }
        let d = describe_one(&mut c, &group_id);
        assert_eq!(d.group_state.as_str(), "Empty", "after LeaveGroup v{lv}");
    }

    // OffsetCommit (simple commits into an empty group) and OffsetFetch, every version each.
    let group_id = unique_topic("versions-offsets");
    for v in commit_min..=commit_max {
        let offset = 100 + i64::from(v);
        let meta = format!("v{v}");
        let errs = commit(
            &mut c,
            v,
            Who::simple(&group_id),
            &topic,
            &[(0, offset, Some(&meta))],
        );
        assert_eq!(errs.get(&0), Some(&0), "OffsetCommit v{v}: {errs:?}");
        for fv in fetch_min..=fetch_max {
            let (o, m, e) = if fv >= 8 {
                offset_fetch_at(&mut c, fv, &group_id, &topic)
            } else {
                let req = OffsetFetchRequest::default()
                    .with_group_id(gid(&group_id))
                    .with_topics(Some(vec![
                        offset_fetch_request::OffsetFetchRequestTopic::default()
                            .with_name(topic_name(&topic))
                            .with_partition_indexes(vec![0]),
                    ]));
                let resp: OffsetFetchResponse = c
                    .request(fv, &req)
                    .unwrap_or_else(|e| panic!("OffsetFetch v{fv}: {e}"));
                assert_eq!(resp.error_code, 0, "OffsetFetch v{fv}");
                let p = &resp.topics[0].partitions[0];
                (
                    p.committed_offset,
                    p.metadata.as_ref().map(|m| m.to_string()),
                    p.error_code,
                )
            };
            assert_eq!(
                (o, m.as_deref(), e),
                (offset, Some(meta.as_str()), 0),
                "OffsetFetch v{fv} after OffsetCommit v{v}"
            );
        }
    }
    for v in list_min..=list_max {
        let resp = list_groups(&mut c, v, &[], &[]);
        let g = listed(&resp, &group_id).unwrap_or_else(|| panic!("ListGroups v{v} lacks {group_id}"));
        assert_eq!(g.protocol_type.as_str(), "", "ListGroups v{v}");
        if v >= 4 {
            assert_eq!(g.group_state.as_str(), "Empty", "ListGroups v{v}");
        }
    }
    for v in desc_min..=desc_max {
        let resp = describe_groups(&mut c, v, &[&group_id]);
        assert_eq!(
            (resp.groups[0].error_code, resp.groups[0].group_state.as_str()),
            (0, "Empty"),
            "DescribeGroups v{v}"
        );
    }
}

/// OffsetFetch of partition 0 at a version with the groups form (v8+): (offset, metadata, error).
fn offset_fetch_at(c: &mut RawConn, version: i16, group: &str, topic: &str) -> Fetched {
    let mut g = OffsetFetchRequestGroup::default()
        .with_group_id(gid(group))
        .with_topics(Some(vec![OffsetFetchRequestTopics::default()
            .with_name(topic_name(topic))
            .with_partition_indexes(vec![0])]));
    if version >= 9 {
        g = g.with_member_id(None).with_member_epoch(-1);
    }
    let resp: OffsetFetchResponse = c
        .request(version, &OffsetFetchRequest::default().with_groups(vec![g]))
        .unwrap_or_else(|e| panic!("OffsetFetch v{version}: {e}"));
    let g = &resp.groups[0];
    assert_eq!(g.error_code, 0, "OffsetFetch v{version}");
    let p = &g.topics[0].partitions[0];
    (
        p.committed_offset,
        p.metadata.as_ref().map(|m| m.to_string()),
        p.error_code,
    )
}

/// Rebalance corner cases of the classic protocol, as Kafka answers them.
#[test]
fn classic_rebalance_corner_cases() {
    let broker = group_broker()
        .config("group.max.size", 3)
        .needs_spawned("checks group.max.size = 3")
        .start();
    let bootstrap = broker.bootstrap();
    let topic = admin::new_topic(&bootstrap, "corners", 2);
    let mut c1 = admin::connect(&bootstrap);
    let mut c2 = admin::connect(&bootstrap);
    let mut admin_conn = admin::connect(&bootstrap);
    let join_as = |c: &mut RawConn, group: &str, member: &str, rebalance_ms: i32| {
        let mut req = join_request(group, member, None, 10_000, &topic);
        req.rebalance_timeout_ms = rebalance_ms;
        let r = join(c, &req);
        if member.is_empty() && r.error_code == code(ResponseError::MemberIdRequired) {
            req.member_id = r.member_id.clone();
            join(c, &req)
        } else {
            r
        }
    };

    // Empty group id; a protocol type or protocol list that does not match the group's.
    let r = join(&mut c1, &join_request("", "", None, 10_000, &topic));
    assert_eq!(
        r.error_code,
        code(ResponseError::InvalidGroupId),
        "JoinGroup with an empty group id"
    );
    let g = unique_topic("corners-a");
    let j1 = join_as(&mut c1, &g, "", 3_000);
    assert_eq!(j1.error_code, 0);
    let m1 = j1.member_id.to_string();
    let mut other_type = join_request(&g, "", None, 10_000, &topic);
    other_type.protocol_type = s("connect");
    let r = join(&mut c2, &other_type);
    assert_eq!(
        r.error_code,
        code(ResponseError::InconsistentGroupProtocol),
        "another protocol type"
    );
    let mut other_protocol = join_request(&g, "", None, 10_000, &topic);
    other_protocol.protocols[0].name = s("roundrobin");
    let r = join(&mut c2, &other_protocol);
    assert_eq!(
        r.error_code,
        code(ResponseError::InconsistentGroupProtocol),
        "no common protocol"
    );

    // Join during sync: the leader has its JoinGroup answer (CompletingRebalance) when another
    // member joins; the leader's SyncGroup of the old generation must be told to rejoin.
    let d = describe_one(&mut admin_conn, &g);
    assert_eq!(d.group_state.as_str(), "CompletingRebalance");
    let m1_j1 = Who::new(&g, &m1, j1.generation_id);
    assert_eq!(
        heartbeat(&mut c1, m1_j1),
        0,
        "a heartbeat while completing the rebalance is a normal heartbeat"
    );
    assert_eq!(
        commit_0(&mut c1, m1_j1, &topic, 1),
        code(ResponseError::RebalanceInProgress),
        "a commit before the member has its assignment (CompletingRebalance)"
    );
    let r2 = join(&mut c2, &join_request(&g, "", None, 10_000, &topic));
    assert_eq!(r2.error_code, code(ResponseError::MemberIdRequired));
    let m2 = r2.member_id.to_string();
    let mut j2req = join_request(&g, &m2, None, 10_000, &topic);
    j2req.rebalance_timeout_ms = 3_000;
    let pending = c2.send_request(JOIN_V, &j2req).expect("send JoinGroup");
    wait_for_state(&mut admin_conn, &g, "PreparingRebalance");
    assert_eq!(
        sync_alone(&mut c1, m1_j1, &topic, &[0, 1]).error_code,
        code(ResponseError::RebalanceInProgress),
        "SyncGroup of a generation that a join superseded"
    );
    let d = describe_one(&mut admin_conn, &g);
    assert_eq!(
        (d.group_state.as_str(), d.protocol_data.as_str(), d.members.len()),
        ("PreparingRebalance", "", 2),
        "DescribeGroups while rebalancing: {d:?}"
    );
    assert!(
        d.members
            .iter()
            .all(|m| m.member_metadata.is_empty() && m.member_assignment.is_empty()),
        "no metadata or assignment outside Stable: {d:?}"
    );

    // Rebalance timeout: the first member never rejoins; after its rebalance timeout (3 s) the
    // join completes without it and it is gone.
    let started = Instant::now();
    let j2 = c2.read_response().expect("the second member's JoinGroup answer");
    assert_eq!(j2.correlation_id, pending);
    let j2: JoinGroupResponse = j2.decode(JOIN_V).expect("decode JoinGroup");
    let waited = started.elapsed();
    admin::assert_ok(j2.error_code, "JoinGroup after the rebalance timeout");
    assert_eq!(
        j2.members.len(),
        1,
        "the member that did not rejoin is still in: {j2:?}"
    );
    assert_eq!(j2.leader.as_str(), m2);
    assert!(
        waited <= Duration::from_secs(6),
        "the join took {waited:?} (rebalance timeout 3 s)"
    );
    eprintln!(
        "[corners] the join completed {:.2}s after the rebalance began",
        waited.as_secs_f64()
    );
    assert_eq!(
        heartbeat(&mut c1, Who::new(&g, &m1, j2.generation_id)),
        code(ResponseError::UnknownMemberId),
        "the member removed by the rebalance timeout"
    );
    let sy = sync_alone(&mut c2, Who::new(&g, &m2, j2.generation_id), &topic, &[0, 1]);
    assert_eq!(sy.error_code, 0);
    // A member that leaves while the others wait in a rebalance completes it for them.
    let mut c3 = admin::connect(&bootstrap);
    let r3 = join(&mut c3, &join_request(&g, "", None, 10_000, &topic));
    let m3 = r3.member_id.to_string();
    let pending3 = c3
        .send_request(JOIN_V, &join_request(&g, &m3, None, 10_000, &topic))
        .expect("send JoinGroup");
    wait_for_state(&mut admin_conn, &g, "PreparingRebalance");
    let lv = leave(&mut c2, &g, &[(&m2, None)]);
    assert_eq!(lv.members.first().map(|m| m.error_code), Some(0));
    c3.set_read_timeout(Duration::from_secs(5)).expect("timeout");
    let j3 = c3
        .read_response()
        .expect("JoinGroup answer once the other member left");
    assert_eq!(j3.correlation_id, pending3);
    let j3: JoinGroupResponse = j3.decode(JOIN_V).expect("decode");
    assert_eq!(
        (j3.error_code, j3.leader.as_str(), j3.members.len()),
        (0, m3.as_str(), 1)
    );
    let sy = sync_alone(&mut c3, Who::new(&g, &m3, j3.generation_id), &topic, &[0, 1]);
    assert_eq!(sy.error_code, 0);

    // group.max.size = 3: a fourth member is refused.
    let big = unique_topic("corners-big");
    let mut conns: Vec<RawConn> = (0..4).map(|_| admin::connect(&bootstrap)).collect();
    let mut pendings = Vec::new();
    for (i, c) in conns.iter_mut().enumerate().take(3) {
        let r = join(c, &join_request(&big, "", None, 10_000, &topic));
        assert_eq!(r.error_code, code(ResponseError::MemberIdRequired), "member {i}");
        let req = join_request(&big, r.member_id.as_str(), None, 10_000, &topic);
        pendings.push(c.send_request(JOIN_V, &req).expect("send"));
    }
    let r = join(&mut conns[3], &join_request(&big, "", None, 10_000, &topic));
    assert_eq!(
        r.error_code,
        code(ResponseError::GroupMaxSizeReached),
        "a fourth member, group.max.size 3"
    );

    // Offsets: unknown topic, metadata too large, and OffsetFetch of every partition (no topics).
    let og = unique_topic("corners-offsets");
    let big_meta = "x".repeat(4097);
    for (commit_topic, partition, meta, want, what) in [
        (
            "no-such-topic",
            0,
            None,
            ResponseError::UnknownTopicOrPartition,
            "commit to an unknown topic",
        ),
        (
            topic.as_str(),
            5,
            None,
            ResponseError::UnknownTopicOrPartition,
            "commit to an unknown partition",
        ),
        (
            topic.as_str(),
            0,
            Some(big_meta.as_str()),
            ResponseError::OffsetMetadataTooLarge,
            "4097 bytes of metadata",
        ),
    ] {
        let errs = commit(
            &mut admin_conn,
            COMMIT_V,
            Who::simple(&og),
            commit_topic,
            &[(partition, 1, meta)],
        );
        assert_eq!(errs[&partition], code(want), "{what}");
    }
    simple_commit(&mut admin_conn, &og, &topic, &[(0, 7, None), (1, 8, Some("m"))]);
    let all: OffsetFetchResponse = admin_conn
        .request(
            FETCH_OFFSETS_V,
            &OffsetFetchRequest::default().with_groups(vec![OffsetFetchRequestGroup::default()
                .with_group_id(gid(&og))
                .with_member_epoch(-1)
                .with_topics(None)]),
        )
        .expect("OffsetFetch of all topics");
    let got: BTreeMap<(String, i32), i64> = all.groups[0]
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions
                .iter()
                .map(move |p| ((t.name.0.to_string(), p.partition_index), p.committed_offset))
        })
        .collect();
    assert_eq!(
        got,
        BTreeMap::from([((topic.clone(), 0), 7), ((topic.clone(), 1), 8)]),
        "OffsetFetch with topics=null lists every committed partition"
    );
}

fn cg_request(group: &str, member_id: &str, epoch: i32) -> ConsumerGroupHeartbeatRequest {
    ConsumerGroupHeartbeatRequest::default()
        .with_group_id(gid(group))
        .with_member_id(s(member_id))
        .with_member_epoch(epoch)
}

fn cg_send(c: &mut RawConn, req: &ConsumerGroupHeartbeatRequest) -> ConsumerGroupHeartbeatResponse {
    c.request(CG_HEARTBEAT_V, req)
        .unwrap_or_else(|e| panic!("ConsumerGroupHeartbeat: {e}"))
}

/// KIP-848 at the protocol level: request validation, revocation before reassignment, leaving,
/// and static members.
#[test]
fn consumer_protocol_corner_cases() {
    let broker = Broker::builder().start();
    let bootstrap = broker.bootstrap();
    let topic = admin::new_topic(&bootstrap, "cg-corners", 4);
    let mut c = admin::connect(&bootstrap);
    let (tid, _) = admin::topic_info(&mut c, &topic);
    let g = unique_topic("cg-corners-g");
    let invalid = code(ResponseError::InvalidRequest);
    let join_req = |member: &str| {
        cg_request(&g, member, 0)
            .with_rebalance_timeout_ms(10_000)
            .with_subscribed_topic_names(Some(vec![topic_name(&topic)]))
            .with_topic_partitions(Some(vec![]))
    };

    // Invalid requests (INVALID_REQUEST), as Kafka validates them.
    let cases: Vec<(&str, ConsumerGroupHeartbeatRequest)> = vec![
        ("v1 with an empty member id", join_req("")),
        (
            "a join without a rebalance timeout",
            join_req("m-x").with_rebalance_timeout_ms(-1),
        ),
        (
            "a join that claims partitions",
            join_req("m-x").with_topic_partitions(Some(vec![HbTopicPartitions::default()
                .with_topic_id(tid)
                .with_partitions(vec![0])])),
        ),
        (
            "a join without a subscription",
            join_req("m-x").with_subscribed_topic_names(None),
        ),
        ("epoch -3", cg_request(&g, "m-x", -3)),
        (
            "a static leave (epoch -2) without an instance id",
            cg_request(&g, "m-x", -2),
        ),
    ];
    for (what, req) in cases {
        let r = cg_send(&mut c, &req);
        assert_eq!(r.error_code, invalid, "{what}: {}", admin::err_name(r.error_code));
    }
    // Version 0 still lets the coordinator choose the member id (KIP-1082 moved that to the
    // client in v1).
    let v0_group = unique_topic("cg-corners-v0");
    let r: ConsumerGroupHeartbeatResponse = c
        .request(
            0,
            &cg_request(&v0_group, "", 0)
                .with_rebalance_timeout_ms(10_000)
                .with_subscribed_topic_names(Some(vec![topic_name(&topic)]))
                .with_topic_partitions(Some(vec![])),
        )
        .expect("ConsumerGroupHeartbeat v0");
    admin::assert_ok(r.error_code, "v0 join without a member id");
    assert!(
        r.member_id.as_ref().is_some_and(|m| !m.is_empty()),
        "v0: the coordinator gives a member id: {r:?}"
    );

    // Member A (static, instance "s1") gets all four partitions.
    let a = uuid::Uuid::new_v4().to_string();
    let ra = cg_send(&mut c, &join_req(&a).with_instance_id(Some(s("s1"))));
    admin::assert_ok(ra.error_code, "A joins");
    let ea = ra.member_epoch;
    assert_eq!(hb_assignment(&ra), Some(vec![(tid, vec![0, 1, 2, 3])]));
    let ra = cg_heartbeat(&mut c, &g, &a, ea, None, Some(vec![(tid, vec![0, 1, 2, 3])]));
    assert_eq!(ra.error_code, 0);
    // Another member with the same instance id while A is there.
    let r = cg_send(
        &mut c,
        &join_req(&uuid::Uuid::new_v4().to_string()).with_instance_id(Some(s("s1"))),
    );
    admin::assert_code(
        r.error_code,
        ResponseError::UnreleasedInstanceId,
        "a second member with a live instance id",
    );

    // Member B joins: A must first give up two partitions; B gets them only after A's
    // acknowledgement (revocation before reassignment).
    let b = uuid::Uuid::new_v4().to_string();
    let rb = cg_send(&mut c, &join_req(&b));
    assert_eq!(rb.error_code, 0);
    let eb = rb.member_epoch;
    let b_first = hb_assignment(&rb).unwrap_or_default();
    assert!(
        b_first.iter().all(|(_, ps)| ps.is_empty()),
        "B got partitions A still owns: {b_first:?}"
    );
    let ra = cg_heartbeat(&mut c, &g, &a, ea, None, None);
    assert_eq!(ra.error_code, 0);
    let a_kept = hb_assignment(&ra).expect("A is told to revoke");
    assert_eq!(a_kept.len(), 1);
    assert_eq!(a_kept[0].1.len(), 2, "A keeps two of four partitions: {a_kept:?}");
    assert_eq!(ra.member_epoch, ea, "A's epoch moves only once it revoked");
    let rb = cg_heartbeat(&mut c, &g, &b, eb, None, None);
    assert!(
        hb_assignment(&rb)
            .unwrap_or_default()
            .iter()
            .all(|(_, ps)| ps.is_empty()),
        "B got partitions before A revoked them: {rb:?}"
    );
    let ra = cg_heartbeat(&mut c, &g, &a, ea, None, Some(a_kept.clone()));
    assert_eq!(ra.error_code, 0);
    let ea2 = ra.member_epoch;
    assert!(ea2 > ea, "A's epoch after revoking: {ea} -> {ea2}");
    let rb = cg_heartbeat(&mut c, &g, &b, eb, None, None);
    assert_eq!(rb.error_code, 0);
    let b_parts = hb_assignment(&rb).expect("B's partitions once A revoked them");
    let mut union: Vec<i32> = a_kept[0].1.iter().chain(b_parts[0].1.iter()).copied().collect();
    union.sort_unstable();
    assert_eq!(union, vec![0, 1, 2, 3], "A {a_kept:?} and B {b_parts:?}");
    let eb2 = rb.member_epoch;
    let rb = cg_heartbeat(&mut c, &g, &b, eb2, None, Some(b_parts.clone()));
    assert_eq!(rb.error_code, 0);

    // A leaves temporarily as a static member (epoch -2); a new member with its instance id takes
    // its place and its partitions.
    let ra = cg_heartbeat(&mut c, &g, &a, -2, None, None);
    let ra2 = cg_send(&mut c, &cg_request(&g, &a, -2).with_instance_id(Some(s("s1"))));
    assert!(
        ra.error_code == invalid && ra2.error_code == 0,
        "static leave: without instance id {}, with {}",
        admin::err_name(ra.error_code),
        admin::err_name(ra2.error_code)
    );
    assert_eq!(ra2.member_epoch, -2);
    let a2 = uuid::Uuid::new_v4().to_string();
    let r = cg_send(&mut c, &join_req(&a2).with_instance_id(Some(s("s1"))));
    admin::assert_ok(r.error_code, "the static member comes back");
    assert_eq!(
        hb_assignment(&r),
        Some(a_kept.clone()),
        "it gets the partitions of its instance back"
    );
    let cd = cg_describe(&mut c, &g);
    let ids: BTreeSet<String> = cd.members.iter().map(|m| m.member_id.to_string()).collect();
    assert_eq!(ids, BTreeSet::from([a2.clone(), b.clone()]), "{cd:?}");

    // B leaves (epoch -1): its partitions go to A2.
    let rb = cg_heartbeat(&mut c, &g, &b, -1, None, None);
    assert_eq!((rb.error_code, rb.member_epoch), (0, -1), "leave");
    let ea3 = r.member_epoch;
    let all = wait_for(Duration::from_secs(10), "A2 to get B's partitions", || {
        let r = cg_heartbeat(&mut c, &g, &a2, ea3, None, None);
        assert_eq!(r.error_code, 0);
        hb_assignment(&r).filter(|a| a.first().is_some_and(|t| t.1.len() == 4))
    });
    assert_eq!(all, vec![(tid, vec![0, 1, 2, 3])]);
    let rb = cg_heartbeat(&mut c, &g, &b, eb2, None, None);
    assert_eq!(
        rb.error_code,
        code(ResponseError::UnknownMemberId),
        "the member that left"
    );
}

/// A member that dies while the group waits for it to rejoin is removed when its session expires
/// (6 s), not at the end of its much longer rebalance timeout (30 s), and the rebalance completes
/// for the others.
#[test]
fn session_expiry_during_a_rebalance_completes_it() {
    let broker = group_broker().start();
    let bootstrap = broker.bootstrap();
    let topic = admin::new_topic(&bootstrap, "expiry", 2);
    let (mut c1, mut c2) = (admin::connect(&bootstrap), admin::connect(&bootstrap));
    let g = unique_topic("expiry-g");
    let joined = |c: &mut RawConn| {
        let mut req = join_request(&g, "", None, SESSION_MS as i32, &topic);
        req.rebalance_timeout_ms = 30_000;
        let r = join(c, &req);
        assert_eq!(r.error_code, code(ResponseError::MemberIdRequired));
        req.member_id = r.member_id;
        req
    };
    let req1 = joined(&mut c1);
    let j1 = join(&mut c1, &req1);
    let m1 = j1.member_id.to_string();
    let m1_j1 = Who::new(&g, &m1, j1.generation_id);
    assert_eq!(sync_alone(&mut c1, m1_j1, &topic, &[0, 1]).error_code, 0);
    let last_heartbeat = Instant::now();
    assert_eq!(heartbeat(&mut c1, m1_j1), 0);
    // The first member now goes silent; the second joins and waits for it.
    let req2 = joined(&mut c2);
    c2.set_read_timeout(Duration::from_secs(40)).expect("timeout");
    let j2 = join(&mut c2, &req2);
    let waited = last_heartbeat.elapsed();
    eprintln!(
        "[expiry] the rebalance completed {:.2}s after the silent member's last heartbeat",
        waited.as_secs_f64()
    );
    assert_eq!(j2.error_code, 0);
    assert_eq!(
        (j2.leader.to_string(), j2.members.len()),
        (req2.member_id.to_string(), 1)
    );
    assert!(
        waited >= Duration::from_millis(SESSION_MS - 500)
            && waited <= Duration::from_millis(SESSION_MS + 2000),
        "the rebalance completed {waited:?} after the last heartbeat (session timeout {SESSION_MS} ms, \
         rebalance timeout 30 s)"
    );
    assert_eq!(
        heartbeat(&mut c1, m1_j1),
        code(ResponseError::UnknownMemberId),
        "the expired member"
    );
}

/// Deleting a topic deletes the groups' committed offsets of its partitions (Kafka's
/// `onPartitionsDeleted`): a topic created again under the same name starts with no committed
/// offsets, so a group consumer reads it from the reset position instead of skipping records.
#[test]
fn deleting_a_topic_deletes_its_committed_offsets() {
    let broker = group_broker().start();
    let bootstrap = broker.bootstrap();
    let topic = admin::new_topic(&bootstrap, "deleted-topic", 1);
    let group_id = unique_topic("deleted-topic-g");
    clients::produce_numbered(&bootstrap, &topic, 1, 0, 100);
    let mut c = admin::connect(&bootstrap);
    simple_commit(&mut c, &group_id, &topic, &[(0, 60, None)]);
    assert_eq!(
        committed(&mut c, &group_id, &topic, &[0]),
        BTreeMap::from([(0, 60)])
    );

    let resp: DeleteTopicsResponse = c
        .request(
            6,
            &DeleteTopicsRequest::default()
                .with_topics(vec![
                    delete_topics_request::DeleteTopicState::default().with_name(Some(topic_name(&topic)))
                ])
                .with_timeout_ms(30_000),
        )
        .expect("DeleteTopics");
    assert_eq!(resp.responses[0].error_code, 0, "DeleteTopics");
    wait_for(
        Duration::from_secs(10),
        "the deleted topic to leave Metadata",
        || {
            let md = admin::metadata(&mut c, &[&topic], false);
            (md.topics[0].error_code == code(ResponseError::UnknownTopicOrPartition)).then_some(())
        },
    );
    let after_delete = wait_for(
        Duration::from_secs(10),
        "the offsets of the deleted topic to go",
        || {
            let o = committed(&mut c, &group_id, &topic, &[0]);
            (o[&0] == -1).then_some(o)
        },
    );
    assert_eq!(after_delete, BTreeMap::from([(0, -1)]));

    // The same name again: a group member must read the new topic from the start.
    admin::create_topic(&bootstrap, &topic, 1, &[]);
    clients::produce_numbered(&bootstrap, &topic, 1, 0, 100);
    let consumer = group_consumer(&bootstrap, &group_id);
    consumer.subscribe(&[&topic]).expect("subscribe");
    let got = poll_n(&consumer, 100, Duration::from_secs(30));
    assert_eq!(
        got.first().map(|r| r.1),
        Some(0),
        "the first offset read of the new topic"
    );
}

/// Twenty members start at once (a join storm: joins arrive during syncs and rebalances
/// overlap) on a 40-partition topic: they must settle on two partitions each within 30 s, and
/// consume everything exactly once.
fn join_storm(protocol: Protocol) {
    const MEMBERS: usize = 20;
    const STORM_PARTITIONS: i32 = 40;
    let broker = group_broker()
        .config("group.consumer.heartbeat.interval.ms", HEARTBEAT_MS)
        // The coordinator's reconciliation lines are debug; ~90 KB per run, kept if it fails.
        .log_level("debug")
        .start();
    let bootstrap = broker.bootstrap();
    let topic = admin::new_topic(&bootstrap, "storm", STORM_PARTITIONS);
    let group_id = unique_topic("storm-g");
    let log = EventLog::new();
    let spec = takeover_spec(protocol, &bootstrap, &group_id, &topic);
    let started = Instant::now();
    let names: Vec<String> = (0..MEMBERS).map(|i| format!("m{i:02}")).collect();
    let members: Vec<Member> = names
        .iter()
        .map(|n| Member::rdkafka_thread(n, spec.clone(), &log))
        .collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    log.wait_for(
        Duration::from_secs(30),
        "20 members with 2 partitions each",
        |l| partitioned(&group::assignments(l), &refs, STORM_PARTITIONS, 2).then_some(()),
    );
    eprintln!(
        "[join storm {protocol:?}] 20 members settled after {:.2}s",
        started.elapsed().as_secs_f64()
    );
    clients::produce_numbered(&bootstrap, &topic, STORM_PARTITIONS, 0, 100);
    wait_consumed(&log, STORM_PARTITIONS, 100, Duration::from_secs(60));
    // Stop only once everything consumed is committed (members commit every 200 ms). Members
    // leaving one by one bump the group epoch; a stopping member's last commit can race its
    // own heartbeat and be refused STALE_MEMBER_EPOCH (Kafka up to 4.2 does the same, and
    // librdkafka does not retry it), and what it had not committed is then read again by the
    // next owner: at-least-once at shutdown, not a steady-state duplicate.
    let mut c = admin::connect(&bootstrap);
    let all: Vec<i32> = (0..STORM_PARTITIONS).collect();
    wait_for(
        Duration::from_secs(30),
        "every partition committed at 100",
        || {
            let offsets = committed(&mut c, &group_id, &topic, &all);
            (offsets.len() == all.len() && offsets.values().all(|o| *o == 100)).then_some(())
        },
    );
    for m in members {
        m.stop(Duration::from_secs(30));
    }
    let events = log.snapshot();
    let mut seen: HashMap<(i32, i64), Vec<(&str, Duration)>> = HashMap::new();
    for (member, at, p, o, v) in group::records(&events) {
        assert_eq!(v, format!("{p}:{o}"), "{member} read a wrong value");
        seen.entry((p, o))
            .or_default()
            .push((member, at.duration_since(started)));
    }
    let twice = seen.values().filter(|r| r.len() > 1).count();
    assert_eq!(
        twice,
        0,
        "{twice} records consumed more than once (the broker's debug log is kept):\n{}",
        duplicate_report(&seen)
    );
    assert_eq!(seen.len(), STORM_PARTITIONS as usize * 100);
}

/// Per partition with records read more than once: the offsets, and who read them when (first
/// and last time since the start), so that a rare failure can be matched with the broker's log.
fn duplicate_report(seen: &HashMap<(i32, i64), Vec<(&str, Duration)>>) -> String {
    let mut by_partition: BTreeMap<i32, Vec<i64>> = BTreeMap::new();
    let mut readers: BTreeMap<(i32, &str), (Duration, Duration)> = BTreeMap::new();
    for ((p, o), reads) in seen.iter().filter(|(_, r)| r.len() > 1) {
        by_partition.entry(*p).or_default().push(*o);
        for (member, at) in reads {
            let e = readers.entry((*p, member)).or_insert((*at, *at));
            e.0 = e.0.min(*at);
            e.1 = e.1.max(*at);
        }
    }
    let mut out = String::new();
    for (p, mut offsets) in by_partition {
        offsets.sort_unstable();
        let who: Vec<String> = readers
            .range((p, "")..)
            .take_while(|((rp, _), _)| *rp == p)
            .map(|((_, m), (a, b))| format!("{m} {:.3}-{:.3}s", a.as_secs_f64(), b.as_secs_f64()))
            .collect();
        out += &format!(
            "  partition {p}: {} offsets {}..={}, read by {}\n",
            offsets.len(),
            offsets[0],
            offsets[offsets.len() - 1],
            who.join(", ")
        );
    }
    out
}

scenario_tests!(join_storm {
    join_storm_cooperative_sticky: Protocol::Classic("cooperative-sticky");
    join_storm_kip848: Protocol::Consumer;
});

/// A full disk (a 16 MiB tmpfs, see `BrokerBuilder::small_disk`): group writes fail with a
/// retriable coordinator error (Kafka: NOT_COORDINATOR for a storage error; Strand answers
/// COORDINATOR_NOT_AVAILABLE), and the committed offsets stay what was acknowledged: a refused
/// commit never shows up, an acknowledged one never goes away.
#[test]
fn full_disk_fails_group_writes_without_losing_or_inventing_offsets() {
    let broker = group_broker().small_disk().start();
    let bootstrap = broker.bootstrap();
    let mut c = admin::connect(&bootstrap);
    let topic = admin::new_topic(&bootstrap, "full", 1);
    let g = unique_topic("full-g");
    simple_commit(&mut c, &g, &topic, &[(0, 10, Some("durable"))]);
    let value = vec![0x5au8; 128 * 1024];
    let mut refused = None;
    for i in 0..400 {
        let rec = strand_compat_tests::raw::record(None, Some(&value), 0);
        let batch =
            strand_compat_tests::raw::encode_batch(&[rec], kafka_protocol::records::Compression::None);
        let (err, _) = admin::produce(&mut c, &topic, 0, batch);
        if err != 0 {
            refused = Some((i, err));
            break;
        }
    }
    assert!(
        refused.is_some(),
        "400 batches of 128 KiB fitted on a 16 MiB file system"
    );
    // All three are retriable for Kafka clients. LOAD_IN_PROGRESS: after a failed write the
    // coordinator reloads the group partition from its log, and a request that arrives meanwhile
    // is told to come back.
    let retriable = [
        code(ResponseError::CoordinatorNotAvailable),
        code(ResponseError::NotCoordinator),
        code(ResponseError::CoordinatorLoadInProgress),
    ];
    for i in 0..3 {
        let errs = commit(
            &mut c,
            COMMIT_V,
            Who::simple(&g),
            &topic,
            &[(0, 20 + i, Some("refused"))],
        );
        assert!(
            retriable.contains(&errs[&0]),
            "a commit on a full disk: {}",
            admin::err_name(errs[&0])
        );
        let (e, parts) = offset_fetch(&mut c, &g, &topic, &[0]);
        assert_eq!(
            (e, parts[&0].clone()),
            (0, (10, Some("durable".to_string()), 0)),
            "the committed offset after a refused commit"
        );
    }
    // A new group cannot complete its first generation (its SyncGroup must persist it).
    let ng = unique_topic("full-new");
    let first = join(&mut c, &join_request(&ng, "", None, 10_000, &topic));
    let joined = join(
        &mut c,
        &join_request(&ng, first.member_id.as_str(), None, 10_000, &topic),
    );
    if joined.error_code == 0 {
        let m = joined.member_id.to_string();
        let sy = sync_alone(&mut c, Who::new(&ng, &m, joined.generation_id), &topic, &[0]);
        assert!(
            retriable.contains(&sy.error_code),
            "SyncGroup on a full disk: {}",
            admin::err_name(sy.error_code)
        );
    } else {
        assert!(
            retriable.contains(&joined.error_code),
            "JoinGroup on a full disk: {}",
            admin::err_name(joined.error_code)
        );
    }
    let res = delete_groups(&mut c, &[&g]);
    assert!(
        retriable.contains(&res[&g]),
        "DeleteGroups on a full disk: {}",
        admin::err_name(res[&g])
    );
    assert_eq!(
        committed(&mut c, &g, &topic, &[0]),
        BTreeMap::from([(0, 10)]),
        "after a refused delete"
    );
}

/// Only the coordinator writes `__consumer_offsets`. Kafka refuses a Produce to an internal topic
/// from any client but its own admin client (INVALID_TOPIC_EXCEPTION, "Cannot append to internal
/// topic"). Accepting one lets any client rewrite any group's committed offsets behind the
/// coordinator's back: the record changes nothing until the next start, which then replays it.
#[test]
fn producing_to_consumer_offsets_is_refused() {
    let mut broker = Broker::builder()
        .needs_spawned("restarts the broker to see what it replays")
        .start();
    let bootstrap = broker.bootstrap();
    let mut c = admin::connect(&bootstrap);
    let topic = admin::new_topic(&bootstrap, "internal", 1);
    let g = unique_topic("internal-g");
    simple_commit(&mut c, &g, &topic, &[(0, 10, Some("real"))]);
    // A well-formed OffsetCommit record of Kafka's schema (key v1, value v3) for that group,
    // offered to every partition of __consumer_offsets.
    let (key, value) = admin::offset_commit_record(&g, &topic, 0, 999, "injected");
    let mut answers = BTreeSet::new();
    for p in 0..50 {
        let rec = strand_compat_tests::raw::record(Some(&key), Some(&value), admin::now_ms());
        let batch =
            strand_compat_tests::raw::encode_batch(&[rec], kafka_protocol::records::Compression::None);
        answers.insert(admin::produce(&mut c, "__consumer_offsets", p, batch).0);
    }
    broker.kill9();
    broker.restart();
    let mut c = admin::connect(&bootstrap);
    let after = offset_fetch(&mut c, &g, &topic, &[0]);
    assert_eq!(
        after.1[&0],
        (10, Some("real".to_string()), 0),
        "a client's record in __consumer_offsets rewrote the group's committed offset (the produces \
         were answered {answers:?})"
    );
    assert_eq!(
        answers,
        BTreeSet::from([code(ResponseError::InvalidTopicException)]),
        "Produce to __consumer_offsets from a client"
    );
}

/// `offsets.topic.num.partitions` only sizes `__consumer_offsets` when it is created ("fixed once
/// created"). Kafka maps groups to partitions with the existing topic's partition count, so a
/// changed setting cannot hide groups. Here the broker restarts with the setting changed from 50
/// to 10: every group and committed offset must still be there.
#[test]
fn changing_offsets_topic_num_partitions_later_keeps_every_group() {
    let mut broker = Broker::builder()
        .needs_spawned("restarts the broker with another configuration")
        .start();
    let bootstrap = broker.bootstrap();
    let topic = admin::new_topic(&bootstrap, "offsets-partitions", 1);
    let mut c = admin::connect(&bootstrap);
    let groups: Vec<String> = (0..20).map(|i| unique_topic(&format!("op-g{i}"))).collect();
    for (i, g) in groups.iter().enumerate() {
        simple_commit(&mut c, g, &topic, &[(0, 100 + i as i64, None)]);
    }
    broker.terminate(Duration::from_secs(30));
    broker.set_config_for_restart("offsets.topic.num.partitions", 10);
    broker.restart();
    let mut c = admin::connect(&bootstrap);
    let listed_groups = list_groups(&mut c, LIST_GROUPS_V, &[], &[]);
    let missing: Vec<&String> = groups
        .iter()
        .filter(|g| listed(&listed_groups, g).is_none())
        .collect();
    let lost: Vec<(&String, i64)> = groups
        .iter()
        .enumerate()
        .filter_map(|(i, g)| {
            let o = committed(&mut c, g, &topic, &[0])[&0];
            (o != 100 + i as i64).then_some((g, o))
        })
        .collect();
    assert!(
        missing.is_empty() && lost.is_empty(),
        "after a restart with offsets.topic.num.partitions 50 -> 10, {} of 20 groups are not listed and \
         {} lost their committed offset (e.g. {:?})",
        missing.len(),
        lost.len(),
        lost.first()
    );
}

/// The session and heartbeat group configs (KIP-848's `consumer.*`, KIP-932's `share.*`):
/// IncrementalAlterConfigs holds them to the broker's bounds, DescribeConfigs reports them, and
/// a member joining after the change is told the group's heartbeat interval.
#[test]
fn group_configs_set_the_heartbeat_interval_members_are_told() {
    use strand_compat_tests::share;
    let broker = Broker::start();
    let bootstrap = broker.bootstrap();
    let topic = unique_topic("group-configs");
    admin::create_topic(&bootstrap, &topic, 2, &[]);
    let (consumer_group, share_group) = (unique_topic("cg"), unique_topic("sg"));

    // Kafka's default bounds: sessions 45-60 s, heartbeat intervals 5-15 s.
    let (code, message) = share::alter_group_configs(
        &bootstrap,
        &consumer_group,
        &[("consumer.session.timeout.ms", Some("30000"))],
    );
    admin::assert_code(code, ResponseError::InvalidConfig, "a session below the bound");
    assert!(
        message
            .as_deref()
            .is_some_and(|m| m.contains("group.consumer.min.session.timeout.ms")),
        "{message:?}"
    );
    share::set_group_configs(
        &bootstrap,
        &consumer_group,
        &[
            ("consumer.heartbeat.interval.ms", "6000"),
            ("consumer.session.timeout.ms", "50000"),
        ],
    );
    share::set_group_configs(
        &bootstrap,
        &share_group,
        &[("share.heartbeat.interval.ms", "8000")],
    );

    let mut c = admin::connect(&bootstrap);
    let join = cg_request(&consumer_group, "member-1", 0)
        .with_rebalance_timeout_ms(10_000)
        .with_subscribed_topic_names(Some(vec![topic_name(&topic)]))
        .with_topic_partitions(Some(vec![]));
    let r = cg_send(&mut c, &join);
    admin::assert_ok(r.error_code, "ConsumerGroupHeartbeat");
    assert_eq!(r.heartbeat_interval_ms, 6000, "the group's interval");
    let r = share::heartbeat(&mut c, &share_group, "member-1", 0, Some(&[&topic]));
    admin::assert_ok(r.error_code, "ShareGroupHeartbeat");
    assert_eq!(r.heartbeat_interval_ms, 8000, "the group's interval");
    // A group without overrides: the broker's.
    let r = share::heartbeat(&mut c, &unique_topic("sg-plain"), "member-1", 0, Some(&[&topic]));
    assert_eq!(r.heartbeat_interval_ms, 5000, "the broker's interval");
}
