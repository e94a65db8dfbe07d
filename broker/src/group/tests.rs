//! Deterministic tests of the coordinator: every response is also encoded at its request version
//! (the encoder refuses fields a version lacks), and every write is fed back as durable unless a
//! test holds it.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::consumer_group_heartbeat_request::TopicPartitions as HbTopicPartitions;
use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
use kafka_protocol::messages::leave_group_request::MemberIdentity;
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::offset_delete_request::{
    OffsetDeleteRequestPartition, OffsetDeleteRequestTopic,
};
use kafka_protocol::messages::offset_fetch_request::{OffsetFetchRequestGroup, OffsetFetchRequestTopic};
use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::Encodable;
use kafka_protocol::ResponseError;
use strand_protocol::types::TopicId;

use super::records::{batch_records, build_batch, RecordKey};
use super::*;
use crate::testkit::{self, SplitMix64};

const GROUP: &str = "g1";

/// Topics, and group config overrides by (group, key).
struct Topics(BTreeMap<String, (TopicId, i32)>, BTreeMap<(String, String), i32>);

impl TopicMetadata for Topics {
    fn topic_by_name(&self, name: &str) -> Option<(TopicId, i32)> {
        self.0.get(name).copied()
    }
    fn topic_by_id(&self, id: TopicId) -> Option<(String, i32)> {
        self.0
            .iter()
            .find(|(_, v)| v.0 == id)
            .map(|(k, v)| (k.clone(), v.1))
    }
    fn topic_names(&self) -> Vec<String> {
        self.0.keys().cloned().collect()
    }
    fn group_config_int(&self, group: &str, key: &str) -> Option<i32> {
        self.1.get(&(group.to_string(), key.to_string())).copied()
    }
}

fn tid(n: u128) -> TopicId {
    TopicId(uuid::Uuid::from_u128(n))
}

struct H {
    c: GroupCoordinator,
    now: i64,
    next_token: u64,
    topics: Topics,
    /// Every record made durable, in order, per partition.
    log: BTreeMap<i32, Vec<Record>>,
    responses: HashMap<u64, GroupResponse>,
    versions: HashMap<u64, (ApiKey, i16)>,
    /// Writes not yet acknowledged (when `hold` is set).
    held: Vec<(u64, i32, Vec<Record>)>,
    hold: bool,
    wake: Option<i64>,
}

fn config() -> GroupConfig {
    GroupConfig {
        initial_rebalance_delay_ms: 0,
        ..GroupConfig::default()
    }
}

impl H {
    fn new() -> H {
        H::with_config(config())
    }

    fn with_config(cfg: GroupConfig) -> H {
        let mut c = GroupCoordinator::new(cfg, 42);
        for p in 0..c.config.offsets_partitions {
            c.begin_load(p);
            let _ = c.end_load(0, p);
        }
        let topics = Topics(
            [
                ("orders".to_string(), (tid(1), 6)),
                ("audit".to_string(), (tid(2), 3)),
            ]
            .into_iter()
            .collect(),
            BTreeMap::new(),
        );
        H {
            c,
            now: 1_000_000,
            next_token: 1,
            topics,
            log: BTreeMap::new(),
            responses: HashMap::new(),
            versions: HashMap::new(),
            held: Vec::new(),
            hold: false,
            wake: None,
        }
    }

    fn process(&mut self, actions: Vec<Action>) {
        let mut queue = actions;
        while !queue.is_empty() {
            let mut next = Vec::new();
            for a in queue {
                match a {
                    Action::Respond { token, response } => {
                        let (api, version) = self.versions[&token.0];
                        check_encodes(api, version, &response);
                        assert!(
                            self.responses.insert(token.0, response).is_none(),
                            "two responses for token {}",
                            token.0
                        );
                    }
                    Action::Persist {
                        write_id,
                        partition,
                        records,
                    } => {
                        assert!(!records.is_empty());
                        if self.hold {
                            self.held.push((write_id, partition, records));
                        } else {
                            self.log.entry(partition).or_default().extend(records);
                            next.extend(self.c.persisted(self.now, write_id, Ok(())));
                        }
                    }
                    Action::WakeAt(t) => self.wake = Some(t),
                }
            }
            queue = next;
        }
    }

    fn release_held(&mut self) {
        let held = std::mem::take(&mut self.held);
        for (id, partition, records) in held {
            self.log.entry(partition).or_default().extend(records);
            let a = self.c.persisted(self.now, id, Ok(()));
            self.process(a);
        }
    }

    fn send(&mut self, api: ApiKey, version: i16, client: &str, req: GroupRequest) -> u64 {
        let token = self.next_token;
        self.next_token += 1;
        self.versions.insert(token, (api, version));
        let meta = RequestMeta {
            version,
            client_id: client.to_string(),
            client_host: "/127.0.0.1".to_string(),
        };
        let a = self
            .c
            .handle(self.now, RequestToken(token), &meta, req, &self.topics);
        self.process(a);
        token
    }

    fn take(&mut self, token: u64) -> Option<GroupResponse> {
        self.responses.remove(&token)
    }

    /// The answer to a request of type `R`, if it has come.
    fn take_answer<R: ForCoordinator>(&mut self, token: u64) -> Option<R::Response> {
        let r = self.take(token)?;
        let expected = std::any::type_name::<R>();
        Some(R::from_group_response(r).unwrap_or_else(|| panic!("not an answer to a {expected}")))
    }

    /// Sends `req` from `client` and returns its answer, which must come at once.
    fn answer<R: ForCoordinator>(&mut self, api: ApiKey, version: i16, client: &str, req: R) -> R::Response {
        let t = self.send(api, version, client, req.into_group_request());
        self.take_answer::<R>(t)
            .unwrap_or_else(|| panic!("{api:?}: no answer"))
    }

    /// A KIP-848 heartbeat (v1, client "c"); its answer.
    fn consumer_heartbeat(&mut self, req: ConsumerGroupHeartbeatRequest) -> ConsumerGroupHeartbeatResponse {
        self.answer(ApiKey::ConsumerGroupHeartbeat, 1, "c", req)
    }

    fn advance(&mut self, ms: i64) {
        self.now += ms;
        let a = self.c.tick(self.now);
        self.process(a);
    }

    // --- classic helpers ---

    fn join(
        &mut self,
        version: i16,
        member_id: &str,
        instance: Option<&str>,
        protocols: &[(&str, &[u8])],
    ) -> u64 {
        let req = JoinGroupRequest::default()
            .with_group_id(GroupId(sb(GROUP)))
            .with_session_timeout_ms(10_000)
            .with_rebalance_timeout_ms(30_000)
            .with_member_id(sb(member_id))
            .with_group_instance_id(instance.map(sb))
            .with_protocol_type(sb("consumer"))
            .with_protocols(protocols.iter().map(|(n, m)| protocol(n, m)).collect());
        self.send(ApiKey::JoinGroup, version, "client", GroupRequest::JoinGroup(req))
    }

    fn join_resp(&mut self, token: u64) -> Option<JoinGroupResponse> {
        self.take_answer::<JoinGroupRequest>(token)
    }

    /// A v5 member joins with a member id (or gets one with MEMBER_ID_REQUIRED first).
    fn join_new(&mut self) -> String {
        let t = self.join(5, "", None, &[("range", b"m")]);
        let r = self.join_resp(t).expect("MEMBER_ID_REQUIRED comes at once");
        assert_eq!(r.error_code, ResponseError::MemberIdRequired.code());
        r.member_id.to_string()
    }

    /// A new member gets its id and joins (v5, "range" with `metadata`): its id and the token of
    /// its JoinGroup.
    fn join_newcomer(&mut self, metadata: &[u8]) -> (String, u64) {
        let id = self.join_new();
        let t = self.join(5, &id, None, &[("range", metadata)]);
        (id, t)
    }

    fn sync(&mut self, member_id: &str, generation: i32, assignments: &[(&str, &[u8])]) -> u64 {
        let req = SyncGroupRequest::default()
            .with_group_id(GroupId(sb(GROUP)))
            .with_generation_id(generation)
            .with_member_id(sb(member_id))
            .with_protocol_type(Some(sb("consumer")))
            .with_protocol_name(Some(sb("range")))
            .with_assignments(assignments.iter().map(|(m, a)| assignment(m, a)).collect());
        self.send(ApiKey::SyncGroup, 5, "client", GroupRequest::SyncGroup(req))
    }

    fn sync_resp(&mut self, token: u64) -> Option<SyncGroupResponse> {
        self.take_answer::<SyncGroupRequest>(token)
    }

    fn heartbeat(&mut self, member_id: &str, generation: i32, instance: Option<&str>) -> i16 {
        let req = HeartbeatRequest::default()
            .with_group_id(GroupId(sb(GROUP)))
            .with_generation_id(generation)
            .with_member_id(sb(member_id))
            .with_group_instance_id(instance.map(sb));
        let t = self.send(ApiKey::Heartbeat, 4, "client", GroupRequest::Heartbeat(req));
        match self.take(t) {
            Some(GroupResponse::Heartbeat(r)) => r.error_code,
            other => panic!("heartbeat: {other:?}"),
        }
    }

    fn commit(
        &mut self,
        version: i16,
        member_id: &str,
        generation: i32,
        offsets: &[(&str, i32, i64, &str)],
    ) -> u64 {
        let mut topics: BTreeMap<&str, Vec<OffsetCommitRequestPartition>> = BTreeMap::new();
        for (t, p, o, m) in offsets {
            topics.entry(t).or_default().push(
                OffsetCommitRequestPartition::default()
                    .with_partition_index(*p)
                    .with_committed_offset(*o)
                    .with_committed_leader_epoch(if version >= 6 { 5 } else { -1 })
                    .with_committed_metadata(Some(sb(m))),
            );
        }
        let topics = topics.into_iter().map(|(t, ps)| commit_topic(t, ps)).collect();
        let req = commit_request(GROUP, member_id, generation, topics);
        self.send(
            ApiKey::OffsetCommit,
            version,
            "client",
            GroupRequest::OffsetCommit(req),
        )
    }

    /// Commits `offsets` and checks that every one is accepted at once.
    fn commit_ok(
        &mut self,
        version: i16,
        member_id: &str,
        generation: i32,
        offsets: &[(&str, i32, i64, &str)],
    ) {
        let t = self.commit(version, member_id, generation, offsets);
        assert_eq!(self.commit_errors(t), vec![0; offsets.len()]);
    }

    fn commit_errors(&mut self, token: u64) -> Vec<i16> {
        match self.take(token) {
            Some(GroupResponse::OffsetCommit(r)) => r
                .topics
                .iter()
                .flat_map(|t| t.partitions.iter().map(|p| p.error_code))
                .collect(),
            other => panic!("commit: {other:?}"),
        }
    }

    /// OffsetFetch v7 of `topic` partitions: (offset, leader epoch, metadata, error).
    fn fetch(&mut self, topic: &str, partitions: &[i32]) -> (i16, Vec<(i64, i32, String, i16)>) {
        let req = fetch_request(GROUP, topic, partitions);
        let r = self.answer(ApiKey::OffsetFetch, 7, "client", req);
        let parts = r.topics.iter().flat_map(|t| {
            t.partitions.iter().map(|p| {
                let metadata = p.metadata.as_ref().map(|m| m.to_string()).unwrap_or_default();
                (
                    p.committed_offset,
                    p.committed_leader_epoch,
                    metadata,
                    p.error_code,
                )
            })
        });
        (r.error_code, parts.collect())
    }

    fn group_state(&self) -> Option<&'static str> {
        match &self.c.groups.get(GROUP)?.kind {
            GroupKind::Classic(g) => Some(g.state.name()),
            GroupKind::Consumer(g) => Some(g.state_name()),
        }
    }
}

fn protocol(name: &str, metadata: &[u8]) -> JoinGroupRequestProtocol {
    JoinGroupRequestProtocol::default()
        .with_name(sb(name))
        .with_metadata(Bytes::copy_from_slice(metadata))
}

fn assignment(member: &str, assignment: &[u8]) -> SyncGroupRequestAssignment {
    SyncGroupRequestAssignment::default()
        .with_member_id(sb(member))
        .with_assignment(Bytes::copy_from_slice(assignment))
}

/// An OffsetCommit request of `group` from `member` at `generation` (or member epoch).
fn commit_request(
    group: &str,
    member: &str,
    generation: i32,
    topics: Vec<OffsetCommitRequestTopic>,
) -> OffsetCommitRequest {
    OffsetCommitRequest::default()
        .with_group_id(GroupId(sb(group)))
        .with_generation_id_or_member_epoch(generation)
        .with_member_id(sb(member))
        .with_topics(topics)
}

fn commit_topic(name: &str, partitions: Vec<OffsetCommitRequestPartition>) -> OffsetCommitRequestTopic {
    OffsetCommitRequestTopic::default()
        .with_name(TopicName(sb(name)))
        .with_partitions(partitions)
}

/// An OffsetFetch request (the single-group form) of `topic` partitions.
fn fetch_request(group: &str, topic: &str, partitions: &[i32]) -> OffsetFetchRequest {
    OffsetFetchRequest::default()
        .with_group_id(GroupId(sb(group)))
        .with_topics(Some(vec![OffsetFetchRequestTopic::default()
            .with_name(TopicName(sb(topic)))
            .with_partition_indexes(partitions.to_vec())]))
}

/// An OffsetDelete request of partition 0 of each of `topics`.
fn offset_delete_request(topics: &[&str]) -> OffsetDeleteRequest {
    let topic = |name: &str| {
        OffsetDeleteRequestTopic::default()
            .with_name(TopicName(sb(name)))
            .with_partitions(vec![
                OffsetDeleteRequestPartition::default().with_partition_index(0)
            ])
    };
    OffsetDeleteRequest::default()
        .with_group_id(GroupId(sb(GROUP)))
        .with_topics(topics.iter().map(|t| topic(t)).collect())
}

fn check_encodes(api: ApiKey, version: i16, r: &GroupResponse) {
    macro_rules! encode {
        ($($variant:ident),*) => {
            match r {
                $(GroupResponse::$variant(x) => x.encode(&mut BytesMut::new(), version),)*
            }
        };
    }
    let res = encode!(
        JoinGroup,
        SyncGroup,
        Heartbeat,
        LeaveGroup,
        OffsetCommit,
        OffsetFetch,
        OffsetDelete,
        ListGroups,
        DescribeGroups,
        DeleteGroups,
        ConsumerGroupHeartbeat,
        ConsumerGroupDescribe
    );
    if let Err(e) = res {
        panic!("{api:?} v{version} response does not encode: {e}: {r:?}");
    }
}

/// Sends `joins` (member id, instance id, "range" metadata) as v5 JoinGroups with a 100 ms initial
/// rebalance delay, so that they all make the first generation; returns their answers. The delay
/// stays at 100 ms.
fn join_delayed(h: &mut H, joins: &[(&str, Option<&str>, &[u8])]) -> Vec<JoinGroupResponse> {
    h.c.config.initial_rebalance_delay_ms = 100;
    let tokens: Vec<u64> = joins
        .iter()
        .map(|(id, instance, metadata)| h.join(5, id, *instance, &[("range", metadata)]))
        .collect();
    h.advance(100);
    h.advance(100);
    tokens
        .iter()
        .map(|t| h.join_resp(*t).expect("join answered"))
        .collect()
}

/// Joins `ids` together (see [`join_delayed`]); returns their answers.
fn join_all(h: &mut H, ids: &[String]) -> Vec<JoinGroupResponse> {
    let joins: Vec<(&str, Option<&str>, &[u8])> =
        ids.iter().map(|id| (id.as_str(), None, &b"m"[..])).collect();
    let answers = join_delayed(h, &joins);
    h.c.config.initial_rebalance_delay_ms = 0;
    answers
}

/// Two new members join together (see [`join_all`]): their answers, the leader's id and the
/// follower's.
fn join_pair(h: &mut H) -> (Vec<JoinGroupResponse>, String, String) {
    let (a, b) = (h.join_new(), h.join_new());
    let answers = join_all(h, &[a.clone(), b.clone()]);
    let leader = answers[0].leader.to_string();
    let follower = if leader == a { b } else { a };
    (answers, leader, follower)
}

/// Two static members, inst-a and inst-b, join an empty group together (see [`join_delayed`]).
fn join_static_pair(h: &mut H) -> (JoinGroupResponse, JoinGroupResponse) {
    let mut answers = join_delayed(h, &[("", Some("inst-a"), b"a"), ("", Some("inst-b"), b"b")]);
    let rb = answers.pop().expect("two answers");
    (answers.pop().expect("two answers"), rb)
}

/// Joins `n` members (v5 with MEMBER_ID_REQUIRED) and completes the rebalance: returns the
/// member ids (leader first) and the generation.
fn stable_group(h: &mut H, n: usize) -> (Vec<String>, i32) {
    let ids: Vec<String> = (0..n).map(|_| h.join_new()).collect();
    let tokens = join_all(h, &ids);
    let mut gen = -1;
    let mut leader = String::new();
    for r in tokens {
        assert_eq!(r.error_code, 0);
        gen = r.generation_id;
        leader = r.leader.to_string();
    }
    let syncs: Vec<u64> = ids
        .iter()
        .filter(|id| **id != leader)
        .map(|id| h.sync(id, gen, &[]))
        .collect();
    let assignments: Vec<(String, Vec<u8>)> = ids
        .iter()
        .map(|id| (id.clone(), id.as_bytes().to_vec()))
        .collect();
    let refs: Vec<(&str, &[u8])> = assignments
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_slice()))
        .collect();
    let lt = h.sync(&leader, gen, &refs);
    for t in syncs.iter().chain([&lt]) {
        let r = h.sync_resp(*t).expect("sync answered");
        assert_eq!(r.error_code, 0);
    }
    let mut ordered = vec![leader.clone()];
    ordered.extend(ids.into_iter().filter(|i| *i != leader));
    (ordered, gen)
}

#[test]
fn classic_three_members_join_sync_and_one_leaves() {
    let mut h = H::new();
    // First member: MEMBER_ID_REQUIRED, then joins; completes on its own.
    let m1 = h.join_new();
    let t1 = h.join(5, &m1, None, &[("range", b"meta1"), ("roundrobin", b"rr1")]);
    h.advance(0);
    let r1 = h.join_resp(t1).unwrap();
    assert_eq!(
        (r1.error_code, r1.generation_id, r1.leader.as_str()),
        (0, 1, m1.as_str())
    );
    assert_eq!(r1.protocol_name.as_deref(), Some("range"));
    assert_eq!(r1.members.len(), 1);
    let s1 = h.sync(&m1, 1, &[(&m1, b"a1")]);
    assert_eq!(h.sync_resp(s1).unwrap().assignment.as_ref(), b"a1");
    assert_eq!(h.group_state(), Some("Stable"));

    // Two more join: the group rebalances; m1 learns it from its heartbeat.
    let m2 = h.join_new();
    let m3 = h.join_new();
    let t2 = h.join(5, &m2, None, &[("roundrobin", b"rr2"), ("range", b"meta2")]);
    let t3 = h.join(5, &m3, None, &[("range", b"meta3")]);
    assert_eq!(h.group_state(), Some("PreparingRebalance"));
    assert!(
        h.join_resp(t2).is_none() && h.join_resp(t3).is_none(),
        "joins wait for the rebalance"
    );
    assert_eq!(
        h.heartbeat(&m1, 1, None),
        ResponseError::RebalanceInProgress.code()
    );
    let t1 = h.join(5, &m1, None, &[("range", b"meta1"), ("roundrobin", b"rr1")]);
    let (r1, r2, r3) = (
        h.join_resp(t1).unwrap(),
        h.join_resp(t2).unwrap(),
        h.join_resp(t3).unwrap(),
    );
    assert_eq!((r1.generation_id, r2.generation_id, r3.generation_id), (2, 2, 2));
    assert_eq!(r2.leader.as_str(), m1, "the leader stays the leader");
    // m3 supports only range: range is the common protocol.
    assert_eq!(r2.protocol_name.as_deref(), Some("range"));
    assert_eq!(r1.members.len(), 3, "the leader gets every member's metadata");
    assert!(r1
        .members
        .iter()
        .any(|m| m.member_id.as_str() == m3 && m.metadata.as_ref() == b"meta3"));
    assert!(r2.members.is_empty() && r3.members.is_empty());

    // Followers wait for the leader's SyncGroup.
    let s2 = h.sync(&m2, 2, &[]);
    assert!(h.sync_resp(s2).is_none());
    let s1 = h.sync(&m1, 2, &[(&m1, b"x1"), (&m2, b"x2"), (&m3, b"x3")]);
    assert_eq!(h.sync_resp(s1).unwrap().assignment.as_ref(), b"x1");
    assert_eq!(h.sync_resp(s2).unwrap().assignment.as_ref(), b"x2");
    let s3 = h.sync(&m3, 2, &[]);
    assert_eq!(
        h.sync_resp(s3).unwrap().assignment.as_ref(),
        b"x3",
        "late follower gets it at once"
    );
    for m in [&m1, &m2, &m3] {
        assert_eq!(h.heartbeat(m, 2, None), 0);
    }

    // m2 leaves (v3 batch form): the others rebalance into generation 3.
    let leave = LeaveGroupRequest::default()
        .with_group_id(GroupId(sb(GROUP)))
        .with_members(vec![MemberIdentity::default().with_member_id(sb(&m2))]);
    let r = h.answer(ApiKey::LeaveGroup, 4, "client", leave);
    assert_eq!(r.error_code, 0);
    assert_eq!(r.members.len(), 1);
    assert_eq!(r.members[0].error_code, 0);
    assert_eq!(
        h.heartbeat(&m1, 2, None),
        ResponseError::RebalanceInProgress.code()
    );
    assert_eq!(h.heartbeat(&m2, 2, None), ResponseError::UnknownMemberId.code());
    let t1 = h.join(5, &m1, None, &[("range", b"meta1")]);
    let t3 = h.join(5, &m3, None, &[("range", b"meta3")]);
    let (r1, r3) = (h.join_resp(t1).unwrap(), h.join_resp(t3).unwrap());
    assert_eq!((r1.generation_id, r3.generation_id), (3, 3));
    assert_eq!(r1.members.len(), 2);
    // The group metadata record of generation 2 was written when the leader synced.
    let groups = records_of(&h, |k| matches!(k, RecordKey::GroupMetadata { .. }));
    assert!(!groups.is_empty());
}

/// The join storm of the compat tests (`join_storm_cooperative_sticky`), in the order that hung
/// it: when the last JoinGroup a join phase waits for comes from a *new* member (the holder of a
/// pending member id from MEMBER_ID_REQUIRED) rather than from a member rejoining, the phase must
/// complete on that JoinGroup, as Kafka's `maybePrepareRebalanceOrCompleteJoin` does. It used to
/// wait for the rebalance timeout (rdkafka's `max.poll.interval.ms`: 300 s).
#[test]
fn join_phase_completes_when_the_last_member_to_join_is_new() {
    let mut h = H::new();
    // a and b get their ids at once; a joins first and makes generation 1 alone (no initial delay).
    let a = h.join_new();
    let b = h.join_new();
    let ta = h.join(5, &a, None, &[("range", b"a")]);
    let ra = h.join_resp(ta).expect("a alone completes generation 1");
    assert_eq!(
        (ra.error_code, ra.generation_id, ra.leader.as_str()),
        (0, 1, a.as_str())
    );
    // b joins (a new member in CompletingRebalance): a rebalance starts, waiting for a and for
    // the pending member c, which got its id meanwhile.
    let tb = h.join(5, &b, None, &[("range", b"b")]);
    let c = h.join_new();
    assert_eq!(h.group_state(), Some("PreparingRebalance"));
    let sa = h.sync(&a, 1, &[(&a, b"x")]);
    assert_eq!(
        h.sync_resp(sa).unwrap().error_code,
        ResponseError::RebalanceInProgress.code()
    );
    // a rejoins before c: every member has joined, but c is still pending.
    let ta = h.join(5, &a, None, &[("range", b"a")]);
    assert!(h.join_resp(ta).is_none() && h.join_resp(tb).is_none());
    // c, a new member, is the last to join: the join phase completes now, with no time passing.
    let tc = h.join(5, &c, None, &[("range", b"c")]);
    let (ra, rb, rc) = (
        h.join_resp(ta).expect("a answered when the last member joined"),
        h.join_resp(tb).expect("b answered when the last member joined"),
        h.join_resp(tc).expect("c answered when it joined"),
    );
    assert_eq!((ra.error_code, rb.error_code, rc.error_code), (0, 0, 0));
    assert_eq!((ra.generation_id, rb.generation_id, rc.generation_id), (2, 2, 2));
    assert_eq!(ra.leader.as_str(), a, "the leader rejoined and stays the leader");
    assert_eq!(ra.members.len(), 3);
    assert_eq!(h.group_state(), Some("CompletingRebalance"));

    // The generation completes as usual.
    let sync_b = h.sync(&b, 2, &[]);
    let sync_c = h.sync(&c, 2, &[]);
    let sync_a = h.sync(&a, 2, &[(&a, b"xa"), (&b, b"xb"), (&c, b"xc")]);
    for (t, want) in [(sync_a, b"xa"), (sync_b, b"xb"), (sync_c, b"xc")] {
        let r = h.sync_resp(t).expect("sync answered");
        assert_eq!((r.error_code, r.assignment.as_ref()), (0, &want[..]));
    }
    assert_eq!(h.group_state(), Some("Stable"));
}

fn records_of(h: &H, f: impl Fn(&RecordKey) -> bool) -> Vec<Record> {
    h.log
        .values()
        .flatten()
        .filter(|r| RecordKey::decode(&r.key).map(|k| f(&k)).unwrap_or(false))
        .cloned()
        .collect()
}

#[test]
fn member_id_required_flow_and_pending_expiry() {
    let mut h = H::new();
    let t = h.join(4, "", None, &[("range", b"m")]);
    let r = h.join_resp(t).unwrap();
    assert_eq!(r.error_code, ResponseError::MemberIdRequired.code());
    assert!(
        r.member_id.starts_with("client-"),
        "member id is <client id>-<uuid>: {}",
        r.member_id.as_str()
    );
    let id = r.member_id.to_string();
    // v3 and older get no MEMBER_ID_REQUIRED.
    let t_old = h.join(3, "", None, &[("range", b"m")]);
    // A pending member that never comes back expires after its session timeout.
    h.advance(10_001);
    let r_old = h.join_resp(t_old).unwrap();
    assert_eq!(
        r_old.error_code, 0,
        "the v3 member joined alone once the pending one expired"
    );
    assert_eq!(r_old.generation_id, 1);
    let t = h.join(4, &id, None, &[("range", b"m")]);
    let r = h.join_resp(t);
    // The expired pending id is now unknown.
    assert_eq!(
        r.map(|r| r.error_code),
        Some(ResponseError::UnknownMemberId.code())
    );
    // Empty group id, bad session timeout.
    for (group, session_timeout_ms, version, error) in [
        ("", 10_000, 5, ResponseError::InvalidGroupId),
        ("other", 10, 0, ResponseError::InvalidSessionTimeout),
    ] {
        let bad = JoinGroupRequest::default()
            .with_group_id(GroupId(sb(group)))
            .with_session_timeout_ms(session_timeout_ms)
            .with_protocol_type(sb("consumer"));
        let r = h.answer(ApiKey::JoinGroup, version, "c", bad);
        assert_eq!(r.error_code, error.code(), "group {group:?}");
    }
    // Inconsistent protocol type in a non-empty group. (The v3 member never heartbeated: its
    // session expired and the group is empty again.)
    assert_eq!(h.group_state(), Some("Empty"));
    let _ = stable_group(&mut h, 1);
    let other = JoinGroupRequest::default()
        .with_group_id(GroupId(sb(GROUP)))
        .with_session_timeout_ms(10_000)
        .with_protocol_type(sb("connect"))
        .with_protocols(vec![JoinGroupRequestProtocol::default().with_name(sb("range"))]);
    assert_eq!(
        h.answer(ApiKey::JoinGroup, 2, "c", other).error_code,
        ResponseError::InconsistentGroupProtocol.code()
    );
}

#[test]
fn rebalance_timeout_removes_members_that_do_not_rejoin() {
    let mut h = H::new();
    let (ids, gen) = stable_group(&mut h, 3);
    let (_, tn) = h.join_newcomer(b"n");
    // Only ids[0] rejoins; the rebalance timeout (30 s) ends the join phase without the others.
    let t0 = h.join(5, &ids[0], None, &[("range", b"m")]);
    h.advance(9_000);
    assert!(h.join_resp(t0).is_none(), "the join waits for the silent members");
    // The silent members are not in the join phase: their sessions (10 s) expire before the
    // rebalance timeout (30 s), which removes them and completes the join.
    h.advance(1_001);
    let (r0, rn) = (h.join_resp(t0), h.join_resp(tn));
    assert!(
        r0.is_some() && rn.is_some(),
        "the join completed once silent members expired"
    );
    let (r0, rn) = (r0.unwrap(), rn.unwrap());
    assert_eq!((r0.generation_id, rn.generation_id), (gen + 1, gen + 1));
    let leader_view = if r0.members.is_empty() { &rn } else { &r0 };
    assert_eq!(
        leader_view.members.len(),
        2,
        "the two silent members were removed"
    );
    let unknown = ResponseError::UnknownMemberId.code();
    assert_eq!(h.heartbeat(&ids[1], gen, None), unknown);
}

#[test]
fn rebalance_timeout_when_members_keep_heartbeating() {
    let mut h = H::new();
    let (ids, gen) = stable_group(&mut h, 2);
    let (_, tn) = h.join_newcomer(b"n");
    let rebalancing = ResponseError::RebalanceInProgress.code();
    // ids[1] keeps heartbeating (REBALANCE_IN_PROGRESS) but never rejoins; ids[0] rejoins late.
    for _ in 0..5 {
        h.advance(5_000);
        assert_eq!(h.heartbeat(&ids[1], gen, None), rebalancing);
        assert_eq!(h.heartbeat(&ids[0], gen, None), rebalancing);
    }
    h.advance(4_000);
    let t0 = h.join(5, &ids[0], None, &[("range", b"m")]);
    assert!(h.join_resp(t0).is_none());
    assert_eq!(h.heartbeat(&ids[1], gen, None), rebalancing);
    h.advance(1_001); // past the 30 s rebalance timeout
    let r0 = h.join_resp(t0).expect("answered at the rebalance timeout");
    assert!(h.join_resp(tn).is_some());
    assert_eq!(r0.generation_id, gen + 1);
    let unknown = ResponseError::UnknownMemberId.code();
    assert_eq!(h.heartbeat(&ids[1], gen, None), unknown);
}

#[test]
fn join_during_sync_and_heartbeat_after_session_expiry() {
    let mut h = H::new();
    let (answers, leader, follower) = join_pair(&mut h);
    assert_eq!((answers[0].generation_id, answers[1].generation_id), (1, 1));
    // The follower waits for the leader; a new member joins meanwhile.
    let sf = h.sync(&follower, 1, &[]);
    assert!(h.sync_resp(sf).is_none());
    let (c, tc) = h.join_newcomer(b"c");
    assert_eq!(
        h.sync_resp(sf).unwrap().error_code,
        ResponseError::RebalanceInProgress.code(),
        "a waiting follower must rejoin"
    );
    let sl = h.sync(&leader, 1, &[(&leader, b"x"), (&follower, b"y")]);
    assert_eq!(
        h.sync_resp(sl).unwrap().error_code,
        ResponseError::RebalanceInProgress.code()
    );
    assert!(h.join_resp(tc).is_none());

    // Nobody rejoins: their sessions expire; a heartbeat afterwards is UNKNOWN_MEMBER_ID.
    h.advance(10_001);
    assert_eq!(
        h.heartbeat(&follower, 1, None),
        ResponseError::UnknownMemberId.code()
    );
    let rc = h
        .join_resp(tc)
        .expect("the newcomer's join completes once the others are gone");
    assert_eq!(rc.error_code, 0);
    assert_eq!(rc.members.len(), 1);
    // A stale generation.
    assert_eq!(
        h.heartbeat(&c, rc.generation_id - 1, None),
        ResponseError::IllegalGeneration.code()
    );
}

#[test]
fn static_member_replacement_and_fencing() {
    let mut h = H::new();
    // Static members join without MEMBER_ID_REQUIRED.
    let (ra, rb) = join_static_pair(&mut h);
    h.c.config.initial_rebalance_delay_ms = 0;
    assert_eq!(ra.error_code, 0);
    let (a, b) = (ra.member_id.to_string(), rb.member_id.to_string());
    let gen = ra.generation_id;
    let leader = ra.leader.to_string();
    assert_eq!(leader, a);
    let s = h.sync(&b, gen, &[]);
    let sl = h.sync(&a, gen, &[(&a, b"pa"), (&b, b"pb")]);
    assert_eq!(h.sync_resp(s).unwrap().assignment.as_ref(), b"pb");
    let _ = h.sync_resp(sl);

    // inst-b restarts: a new member id replaces b without a rebalance.
    let tb2 = h.join(5, "", Some("inst-b"), &[("range", b"b")]);
    let rb2 = h
        .join_resp(tb2)
        .expect("answered after the group record is durable");
    assert_eq!(rb2.error_code, 0);
    assert_eq!(rb2.generation_id, gen, "no rebalance");
    assert_ne!(rb2.member_id.as_str(), b);
    assert_eq!(h.group_state(), Some("Stable"));
    let b2 = rb2.member_id.to_string();
    let s = h.sync(&b2, gen, &[]);
    assert_eq!(
        h.sync_resp(s).unwrap().assignment.as_ref(),
        b"pb",
        "the assignment is kept"
    );
    // The old instance is fenced.
    assert_eq!(
        h.heartbeat(&b, gen, Some("inst-b")),
        ResponseError::FencedInstanceId.code()
    );
    assert_eq!(h.heartbeat(&b2, gen, Some("inst-b")), 0);

    // The static leader restarts with JoinGroup v5: told the old leader id (acts as follower).
    let ta2 = h.join(5, "", Some("inst-a"), &[("range", b"a")]);
    let ra2 = h.join_resp(ta2).unwrap();
    assert_eq!(ra2.leader.as_str(), a);
    assert_ne!(ra2.member_id.as_str(), a);
    assert!(ra2.members.is_empty());
    // ... and with v9 it is told it is the leader but must skip the assignment.
    let ta3 = h.join(9, "", Some("inst-a"), &[("range", b"a")]);
    let ra3 = h.join_resp(ta3).unwrap();
    assert_eq!(ra3.leader, ra3.member_id);
    assert!(ra3.skip_assignment);
    assert_eq!(ra3.members.len(), 2);
    assert_eq!(ra3.generation_id, gen);
}

#[test]
fn static_member_joining_during_rebalance_fences_the_old_waiting_join() {
    let mut h = H::new();
    let (ra, _rb) = join_static_pair(&mut h);
    let a = ra.member_id.to_string();
    // a rejoins (rebalance), then inst-a joins again with a new id: the old join is fenced.
    let sa = h.sync(&a, 1, &[]);
    let _ = sa;
    let (_, tc) = h.join_newcomer(b"c");
    let ta_old = h.join(5, &a, Some("inst-a"), &[("range", b"a")]);
    let ta_new = h.join(5, "", Some("inst-a"), &[("range", b"a")]);
    let old = h.join_resp(ta_old).unwrap();
    assert_eq!(old.error_code, ResponseError::FencedInstanceId.code());
    let _ = (tc, ta_new);
}

#[test]
fn offset_commit_generation_checks() {
    let mut h = H::new();
    let (ids, gen) = stable_group(&mut h, 2);
    h.commit_ok(8, &ids[0], gen, &[("orders", 0, 10, "m")]);
    let t = h.commit(8, &ids[0], gen - 1, &[("orders", 0, 11, "")]);
    assert_eq!(
        h.commit_errors(t),
        vec![ResponseError::IllegalGeneration.code()],
        "stale generation"
    );
    let t = h.commit(8, "nobody", gen, &[("orders", 0, 11, "")]);
    assert_eq!(h.commit_errors(t), vec![ResponseError::UnknownMemberId.code()]);
    let t = h.commit(8, "", -1, &[("orders", 0, 11, "")]);
    assert_eq!(
        h.commit_errors(t),
        vec![ResponseError::UnknownMemberId.code()],
        "a simple commit to a non-empty group"
    );
    // During CompletingRebalance a commit with the new generation gets REBALANCE_IN_PROGRESS.
    let (_, tc) = h.join_newcomer(b"c");
    // While preparing, the current generation can still commit.
    h.commit_ok(8, &ids[1], gen, &[("orders", 1, 20, "")]);
    let t0 = h.join(5, &ids[0], None, &[("range", b"m")]);
    let t1 = h.join(5, &ids[1], None, &[("range", b"m")]);
    let r = h.join_resp(t0).unwrap();
    let _ = (h.join_resp(t1), h.join_resp(tc));
    let t = h.commit(8, &ids[0], r.generation_id, &[("orders", 0, 12, "")]);
    assert_eq!(
        h.commit_errors(t),
        vec![ResponseError::RebalanceInProgress.code()]
    );
    // Unknown topic / partition, and metadata too large.
    let big = "x".repeat(5000);
    let t = h.commit(
        8,
        "",
        -1,
        &[("nope", 0, 1, ""), ("orders", 99, 1, ""), ("audit", 0, 1, &big)],
    );
    let errs = h.commit_errors(t);
    assert!(errs.iter().all(|e| *e != 0));
    // v9 to a group that does not exist with a generation: GROUP_ID_NOT_FOUND (v8: ILLEGAL_GENERATION).
    let orders = commit_topic("orders", vec![OffsetCommitRequestPartition::default()]);
    let req = commit_request("missing", "m", 3, vec![orders]);
    for (version, error) in [
        (9, ResponseError::GroupIdNotFound),
        (8, ResponseError::IllegalGeneration),
    ] {
        let t = h.send(
            ApiKey::OffsetCommit,
            version,
            "c",
            GroupRequest::OffsetCommit(req.clone()),
        );
        assert_eq!(h.commit_errors(t), vec![error.code()], "v{version}");
    }
}

#[test]
fn offset_commit_fetch_round_trip_and_simple_commits() {
    let mut h = H::new();
    // An assign-only consumer commits with generation -1 and an empty member id.
    h.commit_ok(2, "", -1, &[("orders", 0, 100, "meta-0"), ("orders", 3, 300, "")]);
    h.commit_ok(8, "", -1, &[("orders", 1, 150, "m1")]);
    let (err, parts) = h.fetch("orders", &[0, 1, 2, 3]);
    assert_eq!(err, 0);
    assert_eq!(parts[0], (100, -1, "meta-0".to_string(), 0));
    assert_eq!(parts[1], (150, 5, "m1".to_string(), 0), "leader epoch from v6+");
    assert_eq!(parts[2], (-1, -1, String::new(), 0), "nothing committed");
    assert_eq!(parts[3].0, 300);
    assert_eq!(h.group_state(), Some("Empty"));

    // All partitions (topics null), v1 and v8 multi-group forms.
    let req = OffsetFetchRequest::default()
        .with_group_id(GroupId(sb(GROUP)))
        .with_topics(None);
    let r = h.answer(ApiKey::OffsetFetch, 3, "c", req);
    assert_eq!(r.topics.iter().map(|t| t.partitions.len()).sum::<usize>(), 3);
    let req = OffsetFetchRequest::default().with_groups(vec![
        OffsetFetchRequestGroup::default()
            .with_group_id(GroupId(sb(GROUP)))
            .with_topics(None),
        OffsetFetchRequestGroup::default()
            .with_group_id(GroupId(sb("unknown-group")))
            .with_topics(None),
    ]);
    let r = h.answer(ApiKey::OffsetFetch, 8, "c", req);
    assert_eq!(r.groups.len(), 2);
    assert_eq!(r.groups[0].topics[0].partitions.len(), 3);
    assert!(r.groups[1].topics.is_empty());
    assert_eq!(r.groups[1].error_code, 0);
    let r = h.answer(ApiKey::OffsetFetch, 1, "c", fetch_request(GROUP, "orders", &[0]));
    assert_eq!(r.topics[0].partitions[0].committed_offset, 100);
    // The records are Kafka's: OffsetCommitKey + OffsetCommitValue v3.
    let offsets = records_of(&h, |k| matches!(k, RecordKey::Offset { .. }));
    assert_eq!(offsets.len(), 3);
    assert_eq!(offsets[0].value.as_ref().unwrap()[..2], [0, 3]);
}

#[test]
fn responses_wait_for_durability_and_fail_with_the_write() {
    let mut h = H::new();
    h.hold = true;
    let t = h.commit(8, "", -1, &[("orders", 0, 7, "")]);
    assert!(h.take(t).is_none(), "no answer before the write is durable");
    // A fetch issued meanwhile waits too (it would read the pending commit).
    let req = OffsetFetchRequest::default()
        .with_group_id(GroupId(sb(GROUP)))
        .with_topics(None);
    let tf = h.send(ApiKey::OffsetFetch, 7, "c", GroupRequest::OffsetFetch(req));
    assert!(h.take(tf).is_none());
    h.release_held();
    assert_eq!(h.commit_errors(t), vec![0]);
    assert!(h.take(tf).is_some());

    // A failed write fails its answer and drops the partition's state until reloaded.
    let t = h.commit(8, "", -1, &[("orders", 0, 8, "")]);
    let (id, partition, _) = h.held.pop().unwrap();
    let a = h.c.persisted(h.now, id, Err("disk full".into()));
    h.process(a);
    assert_eq!(
        h.commit_errors(t),
        vec![ResponseError::CoordinatorNotAvailable.code()]
    );
    h.hold = false;
    let (err, _) = h.fetch("orders", &[0]);
    assert_eq!(err, ResponseError::CoordinatorNotAvailable.code());
    // Reload from the log: the durable commit (7) is back, the failed one (8) is not.
    h.c.begin_load(partition);
    let (err, _) = h.fetch("orders", &[0]);
    assert_eq!(err, ResponseError::CoordinatorLoadInProgress.code());
    h.c.replay(partition, h.log.get(&partition).cloned().unwrap_or_default());
    let (_, a) = h.c.end_load(h.now, partition);
    h.process(a);
    let (_, parts) = h.fetch("orders", &[0]);
    assert_eq!(parts[0].0, 7);
}

#[test]
fn not_coordinator_and_loading() {
    let mut c = GroupCoordinator::new(config(), 1);
    let topics = Topics(BTreeMap::new(), BTreeMap::new());
    let p = c.partition_of(GROUP);
    let meta = RequestMeta {
        version: 4,
        ..Default::default()
    };
    let hb = || {
        GroupRequest::Heartbeat(
            HeartbeatRequest::default()
                .with_group_id(GroupId(sb(GROUP)))
                .with_member_id(sb("m")),
        )
    };
    let code = |a: Vec<Action>| match a.into_iter().next() {
        Some(Action::Respond {
            response: GroupResponse::Heartbeat(r),
            ..
        }) => r.error_code,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        code(c.handle(0, RequestToken(1), &meta, hb(), &topics)),
        ResponseError::NotCoordinator.code()
    );
    c.begin_load(p);
    // Kafka answers heartbeats blindly while loading.
    assert_eq!(code(c.handle(0, RequestToken(2), &meta, hb(), &topics)), 0);
    let _ = c.end_load(0, p);
    assert_eq!(
        code(c.handle(0, RequestToken(3), &meta, hb(), &topics)),
        ResponseError::UnknownMemberId.code()
    );
    assert!(c.owns(GROUP));
}

#[test]
fn describe_list_delete_groups() {
    let mut h = H::new();
    let (ids, _gen) = stable_group(&mut h, 2);
    let t = h.commit(2, "", -1, &[("orders", 0, 1, "")]);
    assert_eq!(h.commit_errors(t), vec![ResponseError::UnknownMemberId.code()]);
    // A second, simple group with an offset.
    let orders = commit_topic(
        "orders",
        vec![OffsetCommitRequestPartition::default().with_committed_offset(5)],
    );
    let req = commit_request("simple", "", -1, vec![orders]);
    let t = h.send(ApiKey::OffsetCommit, 8, "c", GroupRequest::OffsetCommit(req));
    assert_eq!(h.commit_errors(t), vec![0]);

    for version in [0, 3, 4, 5] {
        let req = ListGroupsRequest::default();
        let t = h.send(ApiKey::ListGroups, version, "c", GroupRequest::ListGroups(req));
        match h.take(t) {
            Some(GroupResponse::ListGroups(r)) => {
                assert_eq!(r.groups.len(), 2);
                let g = r.groups.iter().find(|g| g.group_id.as_str() == GROUP).unwrap();
                assert_eq!(g.protocol_type.as_str(), "consumer");
                if version >= 4 {
                    assert_eq!(g.group_state.as_str(), "Stable");
                }
            }
            other => panic!("{other:?}"),
        }
    }
    let req = ListGroupsRequest::default().with_states_filter(vec![sb("empty")]);
    let t = h.send(ApiKey::ListGroups, 4, "c", GroupRequest::ListGroups(req));
    match h.take(t) {
        Some(GroupResponse::ListGroups(r)) => {
            assert_eq!(r.groups.len(), 1);
            assert_eq!(r.groups[0].group_id.as_str(), "simple");
        }
        other => panic!("{other:?}"),
    }
    let req = ListGroupsRequest::default().with_types_filter(vec![sb("consumer")]);
    let t = h.send(ApiKey::ListGroups, 5, "c", GroupRequest::ListGroups(req));
    assert!(matches!(h.take(t), Some(GroupResponse::ListGroups(r)) if r.groups.is_empty()));

    for version in [0, 4, 5, 6] {
        let req = DescribeGroupsRequest::default()
            .with_groups(vec![GroupId(sb(GROUP)), GroupId(sb("nope"))])
            .with_include_authorized_operations(version >= 3);
        let t = h.send(
            ApiKey::DescribeGroups,
            version,
            "c",
            GroupRequest::DescribeGroups(req),
        );
        match h.take(t) {
            Some(GroupResponse::DescribeGroups(r)) => {
                let g = &r.groups[0];
                assert_eq!((g.error_code, g.group_state.as_str()), (0, "Stable"));
                assert_eq!(g.protocol_data.as_str(), "range");
                assert_eq!(g.members.len(), 2);
                assert!(g
                    .members
                    .iter()
                    .any(|m| m.member_assignment.as_ref() == ids[0].as_bytes()));
                let missing = &r.groups[1];
                if version >= 6 {
                    assert_eq!(missing.error_code, ResponseError::GroupIdNotFound.code());
                } else {
                    assert_eq!((missing.error_code, missing.group_state.as_str()), (0, "Dead"));
                }
            }
            other => panic!("{other:?}"),
        }
    }

    let req = DeleteGroupsRequest::default().with_groups_names(vec![
        GroupId(sb(GROUP)),
        GroupId(sb("simple")),
        GroupId(sb("nope")),
        GroupId(sb("")),
    ]);
    let t = h.send(ApiKey::DeleteGroups, 2, "c", GroupRequest::DeleteGroups(req));
    match h.take(t) {
        Some(GroupResponse::DeleteGroups(r)) => {
            let codes: Vec<i16> = r.results.iter().map(|g| g.error_code).collect();
            assert_eq!(
                codes,
                vec![
                    ResponseError::NonEmptyGroup.code(),
                    0,
                    ResponseError::GroupIdNotFound.code(),
                    ResponseError::InvalidGroupId.code()
                ]
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(!h.c.groups.contains_key("simple"));
    let tombstones = records_of(&h, |k| k.group() == Some("simple"));
    assert!(tombstones.iter().any(|r| r.value.is_none()));
}

#[test]
fn offset_delete_rules() {
    let mut h = H::new();
    let (ids, gen) = stable_group(&mut h, 1);
    h.commit_ok(8, &ids[0], gen, &[("orders", 0, 1, ""), ("audit", 0, 1, "")]);
    let delete_audit = offset_delete_request(&["audit"]);
    // The members' metadata ("m") is not a consumer-protocol subscription: every topic counts as
    // subscribed.
    let r = h.answer(ApiKey::OffsetDelete, 0, "c", delete_audit.clone());
    let subscribed = ResponseError::GroupSubscribedToTopic.code();
    assert_eq!(r.topics[0].partitions[0].error_code, subscribed);
    // Once the group is empty, offsets can be deleted.
    let leave = LeaveGroupRequest::default()
        .with_group_id(GroupId(sb(GROUP)))
        .with_member_id(sb(&ids[0]));
    assert_eq!(h.answer(ApiKey::LeaveGroup, 1, "c", leave).error_code, 0);
    assert_eq!(h.group_state(), Some("Empty"));
    let r = h.answer(ApiKey::OffsetDelete, 0, "c", delete_audit);
    assert_eq!(r.topics[0].partitions[0].error_code, 0);
    let (_, parts) = h.fetch("audit", &[0]);
    assert_eq!(parts[0].0, -1);
    let req = OffsetDeleteRequest::default().with_group_id(GroupId(sb("nope")));
    let r = h.answer(ApiKey::OffsetDelete, 0, "c", req);
    assert_eq!(r.error_code, ResponseError::GroupIdNotFound.code());
}

#[test]
fn offsets_retention_expires_offsets_of_empty_groups() {
    let mut cfg = config();
    cfg.offsets_retention_ms = 60_000;
    cfg.offsets_retention_check_interval_ms = 10_000;
    let mut h = H::with_config(cfg);
    h.commit_ok(8, "", -1, &[("orders", 0, 1, "")]);
    h.advance(30_000);
    assert_eq!(h.fetch("orders", &[0]).1[0].0, 1);
    for _ in 0..4 {
        h.advance(10_000);
    }
    assert_eq!(h.fetch("orders", &[0]).1[0].0, -1, "expired");
    assert!(
        !h.c.groups.contains_key(GROUP),
        "the empty group without offsets is deleted"
    );
    let tomb = records_of(&h, |k| matches!(k, RecordKey::Offset { .. }));
    assert!(tomb.last().unwrap().value.is_none(), "a tombstone was written");

    // A stable group's offsets do not expire.
    let (ids, gen) = stable_group(&mut h, 1);
    h.commit_ok(8, &ids[0], gen, &[("orders", 2, 9, "")]);
    for _ in 0..10 {
        h.advance(5_000);
        assert_eq!(h.heartbeat(&ids[0], gen, None), 0);
    }
    assert_eq!(h.fetch("orders", &[2]).1[0].0, 9);
}

#[test]
fn restart_replays_offsets_and_groups() {
    let mut h = H::new();
    let (ids, gen) = stable_group(&mut h, 2);
    h.commit_ok(8, &ids[0], gen, &[("orders", 0, 42, "meta")]);
    let t = h.commit(2, "", -1, &[]);
    let _ = h.take(t);
    // A KIP-848 group on the same coordinator.
    let mut sim = Sim::new(&mut h, "cg");
    sim.join(&mut h, "c1");
    sim.join(&mut h, "c2");
    for _ in 0..4 {
        sim.heartbeat_all(&mut h);
    }
    sim.check(&h);
    let before = assignments(&h, "cg");

    // Restart: a fresh coordinator loads every partition from batches of the log.
    let mut fresh = GroupCoordinator::new(config(), 7);
    for p in 0..fresh.config.offsets_partitions {
        fresh.begin_load(p);
        for chunk in h.log.get(&p).cloned().unwrap_or_default().chunks(3) {
            let batch = build_batch(chunk, 0);
            fresh.replay(p, batch_records(&Bytes::from(batch), 1 << 20).unwrap());
        }
        let (stats, _) = fresh.end_load(h.now, p);
        assert_eq!(stats.undecodable, 0);
    }
    h.c = fresh;
    let (_, parts) = h.fetch("orders", &[0]);
    assert_eq!(parts[0], (42, 5, "meta".to_string(), 0));
    assert_eq!(h.group_state(), Some("Stable"));
    // The members are back with their generation and assignment.
    assert_eq!(h.heartbeat(&ids[1], gen, None), 0);
    let s = h.sync(&ids[1], gen, &[]);
    assert_eq!(h.sync_resp(s).unwrap().assignment.as_ref(), ids[1].as_bytes());
    assert_eq!(assignments(&h, "cg"), before, "KIP-848 assignments are back");
    // The consumer group members keep heartbeating with their epochs.
    for _ in 0..3 {
        sim.heartbeat_all(&mut h);
    }
    sim.check(&h);
    assert!(
        sim.clients.iter().all(|c| c.fenced == 0),
        "no member was fenced by the restart"
    );
}

fn assignments(h: &H, group: &str) -> BTreeMap<String, Assignment> {
    match h.c.groups.get(group).map(|g| &g.kind) {
        Some(GroupKind::Consumer(g)) => g
            .members
            .iter()
            .map(|(k, m)| (k.clone(), m.assigned.clone()))
            .collect(),
        _ => BTreeMap::new(),
    }
}

use super::records::Assignment;

// ---------------------------------------------------------------------------------------------
// KIP-848

/// A simulated KIP-848 client.
struct Client {
    name: String,
    member_id: String,
    epoch: i32,
    owned: BTreeSet<(TopicId, i32)>,
    /// Partitions the server asked back that the client has not released yet.
    revoking: BTreeSet<(TopicId, i32)>,
    alive: bool,
    last_heartbeat: i64,
    fenced: usize,
    instance: Option<String>,
}

struct Sim {
    group: String,
    clients: Vec<Client>,
    handovers: usize,
}

impl Sim {
    fn new(_h: &mut H, group: &str) -> Sim {
        Sim {
            group: group.to_string(),
            clients: Vec::new(),
            handovers: 0,
        }
    }

    fn join(&mut self, h: &mut H, name: &str) -> usize {
        let id = format!("{name}-{}", self.clients.len());
        self.clients.push(Client {
            name: name.to_string(),
            member_id: id,
            epoch: 0,
            owned: BTreeSet::new(),
            revoking: BTreeSet::new(),
            alive: true,
            last_heartbeat: h.now,
            fenced: 0,
            instance: None,
        });
        let i = self.clients.len() - 1;
        self.heartbeat(h, i);
        i
    }

    fn request(&self, i: usize) -> ConsumerGroupHeartbeatRequest {
        let c = &self.clients[i];
        let mut by_topic: BTreeMap<TopicId, Vec<i32>> = BTreeMap::new();
        for (t, p) in &c.owned {
            by_topic.entry(*t).or_default().push(*p);
        }
        let owned: Vec<HbTopicPartitions> = by_topic
            .into_iter()
            .map(|(t, ps)| {
                HbTopicPartitions::default()
                    .with_topic_id(t.0)
                    .with_partitions(ps)
            })
            .collect();
        ConsumerGroupHeartbeatRequest::default()
            .with_group_id(GroupId(sb(&self.group)))
            .with_member_id(sb(&c.member_id))
            .with_member_epoch(c.epoch)
            .with_instance_id(c.instance.as_deref().map(sb))
            .with_rebalance_timeout_ms(60_000)
            .with_subscribed_topic_names(Some(vec![TopicName(sb("orders"))]))
            .with_topic_partitions(Some(owned))
    }

    fn heartbeat(&mut self, h: &mut H, i: usize) -> i16 {
        let req = self.request(i);
        let name = self.clients[i].name.clone();
        let r = h.answer(ApiKey::ConsumerGroupHeartbeat, 1, &name, req);
        self.apply(h, i, &r);
        r.error_code
    }

    fn apply(&mut self, h: &H, i: usize, r: &ConsumerGroupHeartbeatResponse) {
        let c = &mut self.clients[i];
        c.last_heartbeat = h.now;
        if r.error_code == ResponseError::FencedMemberEpoch.code()
            || r.error_code == ResponseError::UnknownMemberId.code()
        {
            // The member must abandon all its partitions and rejoin.
            c.owned.clear();
            c.revoking.clear();
            c.epoch = 0;
            c.fenced += 1;
            return;
        }
        assert_eq!(r.error_code, 0, "heartbeat error: {r:?}");
        c.epoch = r.member_epoch;
        if let Some(a) = &r.assignment {
            let new: BTreeSet<(TopicId, i32)> = a
                .topic_partitions
                .iter()
                .flat_map(|t| t.partitions.iter().map(move |p| (TopicId(t.topic_id), *p)))
                .collect();
            for tp in c.owned.difference(&new) {
                c.revoking.insert(*tp);
            }
            for tp in new.difference(&c.owned) {
                c.revoking.remove(tp);
                self.handovers += 1;
            }
            let keep: BTreeSet<_> = c
                .owned
                .iter()
                .copied()
                .filter(|tp| new.contains(tp) || c.revoking.contains(tp))
                .collect();
            c.owned = keep.union(&new).copied().collect();
        }
    }

    /// Releases what the client was asked to revoke.
    fn finish_revocation(&mut self, i: usize) {
        let c = &mut self.clients[i];
        for tp in std::mem::take(&mut c.revoking) {
            c.owned.remove(&tp);
        }
    }

    fn heartbeat_all(&mut self, h: &mut H) {
        for i in 0..self.clients.len() {
            if self.clients[i].alive {
                self.finish_revocation(i);
                self.heartbeat(h, i);
            }
        }
    }

    fn leave(&mut self, h: &mut H, i: usize) {
        let mut req = self.request(i);
        req.member_epoch = -1;
        let r = h.consumer_heartbeat(req);
        assert_eq!((r.error_code, r.member_epoch), (0, -1));
        let c = &mut self.clients[i];
        c.alive = false;
        c.owned.clear();
        c.revoking.clear();
    }

    /// No partition is held by two clients, nor by two members on the server.
    fn check(&self, h: &H) {
        let mut seen: BTreeMap<(TopicId, i32), &str> = BTreeMap::new();
        for c in self.clients.iter().filter(|c| c.alive) {
            for tp in &c.owned {
                if let Some(other) = seen.insert(*tp, &c.member_id) {
                    panic!("partition {tp:?} owned by {other} and {} at once", c.member_id);
                }
            }
        }
        if let Some(GroupKind::Consumer(g)) = h.c.groups.get(&self.group).map(|g| &g.kind) {
            let mut server: BTreeMap<(TopicId, i32), &str> = BTreeMap::new();
            for m in g.members.values() {
                for tp in m.owned_partitions() {
                    if let Some(other) = server.insert(tp, &m.member_id) {
                        panic!("server: partition {tp:?} held by {other} and {}", m.member_id);
                    }
                    assert_eq!(g.owners.get(&tp).map(String::as_str), Some(m.member_id.as_str()));
                }
            }
            assert_eq!(server.len(), g.owners.len(), "owners map matches the members");
        }
    }

    fn counts(&self) -> Vec<usize> {
        self.clients
            .iter()
            .filter(|c| c.alive)
            .map(|c| c.owned.len())
            .collect()
    }
}

/// A KIP-848 group of one member, "a", after a round of heartbeats.
fn group_of_one() -> (H, Sim) {
    let mut h = H::new();
    let mut sim = Sim::new(&mut h, GROUP);
    sim.join(&mut h, "a");
    sim.heartbeat_all(&mut h);
    (h, sim)
}

#[test]
fn kip848_three_members_join_one_at_a_time_and_converge() {
    let mut h = H::new();
    let mut sim = Sim::new(&mut h, GROUP);
    sim.join(&mut h, "a");
    sim.check(&h);
    assert_eq!(sim.counts(), vec![6]);
    sim.join(&mut h, "b");
    sim.check(&h);
    for _ in 0..3 {
        sim.heartbeat_all(&mut h);
        sim.check(&h);
    }
    assert_eq!(sim.counts(), vec![3, 3]);
    sim.join(&mut h, "c");
    for _ in 0..3 {
        // One client at a time, checking after every step.
        for i in 0..3 {
            sim.finish_revocation(i);
            sim.heartbeat(&mut h, i);
            sim.check(&h);
        }
    }
    assert_eq!(sim.counts(), vec![2, 2, 2]);
    assert_eq!(h.group_state(), Some("Stable"));

    // Describe.
    let req =
        ConsumerGroupDescribeRequest::default().with_group_ids(vec![GroupId(sb(GROUP)), GroupId(sb("nope"))]);
    let t = h.send(
        ApiKey::ConsumerGroupDescribe,
        1,
        "c",
        GroupRequest::ConsumerGroupDescribe(req),
    );
    match h.take(t) {
        Some(GroupResponse::ConsumerGroupDescribe(r)) => {
            let g = &r.groups[0];
            assert_eq!(
                (g.error_code, g.group_state.as_str(), g.assignor_name.as_str()),
                (0, "Stable", "uniform")
            );
            assert_eq!(g.members.len(), 3);
            assert!(g
                .members
                .iter()
                .all(|m| m.assignment.topic_partitions[0].topic_name.as_str() == "orders"));
            assert_eq!(r.groups[1].error_code, ResponseError::GroupIdNotFound.code());
        }
        other => panic!("{other:?}"),
    }

    // b leaves: a and c share its partitions.
    sim.leave(&mut h, 1);
    for _ in 0..3 {
        sim.heartbeat_all(&mut h);
        sim.check(&h);
    }
    assert_eq!(sim.counts(), vec![3, 3]);

    // c dies (no heartbeat): its session expires; a gets everything.
    sim.clients[2].alive = false;
    sim.clients[2].owned.clear();
    for _ in 0..10 {
        h.advance(5_000);
        sim.heartbeat_all(&mut h);
        sim.check(&h);
    }
    assert_eq!(sim.counts(), vec![6]);
    assert!(sim.handovers > 6);
}

#[test]
fn kip848_revocation_before_reassignment() {
    let mut h = H::new();
    let mut sim = Sim::new(&mut h, GROUP);
    sim.join(&mut h, "a");
    sim.join(&mut h, "b");
    // b is assigned nothing yet: a still owns all six.
    assert_eq!(sim.counts(), vec![6, 0]);
    // a learns it must revoke three but does not release them yet.
    sim.heartbeat(&mut h, 0);
    assert_eq!(sim.clients[0].revoking.len(), 3);
    for _ in 0..3 {
        sim.heartbeat(&mut h, 1);
        sim.check(&h);
        assert!(
            sim.clients[1].owned.is_empty(),
            "b gets nothing while a still holds them"
        );
        sim.heartbeat(&mut h, 0);
        sim.check(&h);
    }
    sim.finish_revocation(0);
    sim.heartbeat(&mut h, 0);
    sim.heartbeat(&mut h, 1);
    sim.check(&h);
    assert_eq!(sim.counts(), vec![3, 3]);

    // A member that never revokes is fenced after its rebalance timeout (60 s).
    sim.join(&mut h, "c");
    sim.heartbeat(&mut h, 0);
    sim.heartbeat(&mut h, 1);
    let stuck = sim.clients[0].revoking.len() + sim.clients[1].revoking.len();
    assert!(stuck > 0);
    for _ in 0..13 {
        h.advance(5_000);
        for i in 0..3 {
            sim.heartbeat(&mut h, i);
            sim.check(&h);
        }
    }
    assert!(
        sim.clients[0].fenced + sim.clients[1].fenced > 0,
        "the member that kept its partitions was fenced"
    );
}

/// librdkafka reports its owned partitions only in full heartbeats and in the one acknowledging a
/// reconciliation; its regular heartbeats carry none. Such heartbeats never release a partition the
/// member was asked to revoke: the next owner waits for the acknowledgement, and the revoking
/// member commits the revoked partitions at its unchanged epoch in between.
#[test]
fn kip848_heartbeats_without_owned_partitions_release_nothing() {
    let (mut h, mut sim) = group_of_one();
    assert_eq!(sim.counts(), vec![6]);
    let epoch = sim.clients[0].epoch;
    sim.join(&mut h, "b");
    let regular = |sim: &mut Sim, h: &mut H, i: usize| {
        let mut req = sim.request(i);
        req.topic_partitions = None;
        let r = h.consumer_heartbeat(req);
        sim.apply(h, i, &r);
        r
    };
    // a is asked to revoke three partitions and stays at its epoch.
    let r = regular(&mut sim, &mut h, 0);
    assert_eq!((r.error_code, r.member_epoch), (0, epoch));
    assert_eq!(sim.clients[0].revoking.len(), 3);
    let revoked: Vec<i32> = sim.clients[0].revoking.iter().map(|(_, p)| *p).collect();
    for _ in 0..3 {
        // Its revocation callback runs: regular heartbeats go on meanwhile.
        let r = regular(&mut sim, &mut h, 0);
        assert_eq!((r.error_code, r.member_epoch), (0, epoch));
        sim.heartbeat(&mut h, 1);
        sim.check(&h);
        assert!(
            sim.clients[1].owned.is_empty(),
            "b gets nothing before a acknowledges"
        );
    }
    // The callback commits the revoked partitions at a's epoch.
    let id = sim.clients[0].member_id.clone();
    let offsets: Vec<(&str, i32, i64, &str)> = revoked.iter().map(|p| ("orders", *p, 7, "")).collect();
    h.commit_ok(9, &id, epoch, &offsets);
    // The acknowledgement (owned partitions without the revoked ones) releases them.
    sim.finish_revocation(0);
    assert_eq!(sim.heartbeat(&mut h, 0), 0);
    assert!(sim.clients[0].epoch > epoch);
    sim.heartbeat(&mut h, 1);
    sim.check(&h);
    assert_eq!(sim.counts(), vec![3, 3]);
    let got: Vec<i32> = sim.clients[1].owned.iter().map(|(_, p)| *p).collect();
    assert_eq!(got, revoked, "b gets exactly what a released");
    // A commit still carrying the epoch from before the acknowledgement is now stale (Kafka
    // before KIP-1251 refuses it the same way).
    let t = h.commit(9, &id, epoch, &offsets);
    assert_eq!(
        h.commit_errors(t),
        vec![ResponseError::StaleMemberEpoch.code(); revoked.len()]
    );
}

#[test]
fn kip848_fenced_and_stale_epochs() {
    let (mut h, mut sim) = group_of_one();
    let epoch = sim.clients[0].epoch;
    assert!(epoch > 0);
    // A greater epoch than known: fenced.
    let mut req = sim.request(0);
    req.member_epoch = epoch + 5;
    assert_eq!(
        h.consumer_heartbeat(req).error_code,
        ResponseError::FencedMemberEpoch.code()
    );
    // Commit with the current epoch works (v9); a stale epoch is STALE_MEMBER_EPOCH; v8 is refused.
    let id = sim.clients[0].member_id.clone();
    h.commit_ok(9, &id, epoch, &[("orders", 0, 5, "")]);
    sim.join(&mut h, "b");
    sim.heartbeat_all(&mut h);
    sim.heartbeat_all(&mut h);
    let t = h.commit(9, &id, epoch, &[("orders", 0, 6, "")]);
    assert_eq!(h.commit_errors(t), vec![ResponseError::StaleMemberEpoch.code()]);
    let t = h.commit(8, &id, sim.clients[0].epoch, &[("orders", 0, 6, "")]);
    assert_eq!(h.commit_errors(t), vec![ResponseError::UnsupportedVersion.code()]);
    let t = h.commit(9, "ghost", 1, &[("orders", 0, 6, "")]);
    assert_eq!(h.commit_errors(t), vec![ResponseError::UnknownMemberId.code()]);
    // A fenced member rejoins with epoch 0 and its member id (KAFKA-19233).
    sim.clients[0].epoch = 0;
    sim.clients[0].owned.clear();
    assert_eq!(sim.heartbeat(&mut h, 0), 0);
    sim.heartbeat_all(&mut h);
    sim.heartbeat_all(&mut h);
    sim.check(&h);
    assert_eq!(sim.counts(), vec![3, 3]);
    // Unknown member with a positive epoch.
    let mut req = sim.request(0);
    req.member_id = sb("ghost");
    assert_eq!(
        h.consumer_heartbeat(req).error_code,
        ResponseError::UnknownMemberId.code()
    );
    // Invalid requests.
    let mut req = sim.request(0);
    req.member_epoch = 0;
    req.topic_partitions = Some(vec![]);
    req.server_assignor = Some(sb("sticky"));
    assert_eq!(
        h.consumer_heartbeat(req).error_code,
        ResponseError::UnsupportedAssignor.code()
    );
    let mut req = sim.request(0);
    req.member_id = sb("");
    assert_eq!(
        h.consumer_heartbeat(req).error_code,
        ResponseError::InvalidRequest.code()
    );
    // A classic join to a consumer group with members.
    let t = h.join(5, "", None, &[("range", b"m")]);
    assert_eq!(
        h.join_resp(t).unwrap().error_code,
        ResponseError::InconsistentGroupProtocol.code()
    );
    // A KIP-848 heartbeat to a classic group with members.
    let mut h2 = H::new();
    let _ = stable_group(&mut h2, 1);
    let mut sim2 = Sim::new(&mut h2, GROUP);
    sim2.clients.push(Client {
        name: "x".into(),
        member_id: "x".into(),
        epoch: 0,
        owned: BTreeSet::new(),
        revoking: BTreeSet::new(),
        alive: true,
        last_heartbeat: 0,
        fenced: 0,
        instance: None,
    });
    let req = sim2.request(0);
    assert_eq!(
        h2.consumer_heartbeat(req).error_code,
        ResponseError::GroupIdNotFound.code()
    );
}

/// How many partitions a heartbeat's answer assigns.
fn assigned_count(r: &ConsumerGroupHeartbeatResponse) -> usize {
    let assignment = r.assignment.as_ref().expect("an assignment");
    assignment
        .topic_partitions
        .iter()
        .map(|t| t.partitions.len())
        .sum()
}

#[test]
fn kip848_v0_member_ids_static_members_and_regex() {
    let mut h = H::new();
    // v0: the coordinator makes the member id.
    let req = ConsumerGroupHeartbeatRequest::default()
        .with_group_id(GroupId(sb(GROUP)))
        .with_member_epoch(0)
        .with_instance_id(Some(sb("inst")))
        .with_rebalance_timeout_ms(60_000)
        .with_subscribed_topic_names(Some(vec![]))
        .with_topic_partitions(Some(vec![]));
    let mut with_regex = req.clone();
    with_regex.subscribed_topic_regex = Some(sb("ord.*|aud[a-z]+"));
    let r = h.consumer_heartbeat(with_regex.clone());
    assert_eq!(
        r.error_code,
        ResponseError::InvalidRequest.code(),
        "v1 needs a client member id"
    );
    let r = h.answer(ApiKey::ConsumerGroupHeartbeat, 0, "c", with_regex.clone());
    assert_eq!(r.error_code, 0);
    let member = r.member_id.clone().unwrap().to_string();
    assert_eq!(member.len(), 22, "Kafka's Uuid string");
    assert_eq!(
        assigned_count(&r),
        9,
        "the regex matches orders (6) and audit (3)"
    );
    // A second instance with the same instance id: UNRELEASED_INSTANCE_ID.
    let mut other = with_regex.clone();
    other.member_id = sb("other");
    assert_eq!(
        h.consumer_heartbeat(other.clone()).error_code,
        ResponseError::UnreleasedInstanceId.code()
    );
    // The static member leaves temporarily (epoch -2); the new instance takes its assignment.
    let mut leave = with_regex.clone();
    leave.member_id = sb(&member);
    leave.member_epoch = -2;
    assert_eq!(h.consumer_heartbeat(leave).member_epoch, -2);
    let r = h.consumer_heartbeat(other);
    assert_eq!(r.error_code, 0);
    assert_eq!(assigned_count(&r), 9, "the replacement keeps the partitions");
    // The old id is fenced now.
    let mut old = with_regex;
    old.member_id = sb(&member);
    old.member_epoch = 3;
    assert_eq!(
        h.consumer_heartbeat(old).error_code,
        ResponseError::FencedInstanceId.code()
    );
    // Bad regex.
    let mut bad = req;
    bad.member_id = sb("z");
    bad.subscribed_topic_regex = Some(sb("(unclosed"));
    assert_eq!(
        h.consumer_heartbeat(bad).error_code,
        ResponseError::InvalidRegularExpression.code()
    );
}

fn simulate(seed: u64) -> Result<usize, String> {
    testkit::catch(|| {
        let mut h = H::new();
        let mut rng = SplitMix64(seed);
        let mut sim = Sim::new(&mut h, GROUP);
        for step in 0..400 {
            let alive: Vec<usize> = (0..sim.clients.len()).filter(|i| sim.clients[*i].alive).collect();
            match rng.below(10) {
                0 if alive.len() < 5 => {
                    sim.join(&mut h, &format!("s{step}"));
                }
                1 if !alive.is_empty() && rng.below(4) == 0 => {
                    let i = alive[rng.below(alive.len() as u64) as usize];
                    if rng.below(2) == 0 {
                        sim.leave(&mut h, i);
                    } else {
                        // Crash: stops heartbeating; its session expires later.
                        sim.clients[i].alive = false;
                        sim.clients[i].owned.clear();
                    }
                }
                2 | 3 if !alive.is_empty() => {
                    let i = alive[rng.below(alive.len() as u64) as usize];
                    sim.finish_revocation(i);
                }
                4 => h.advance(rng.below(3_000) as i64),
                _ if !alive.is_empty() => {
                    let i = alive[rng.below(alive.len() as u64) as usize];
                    sim.heartbeat(&mut h, i);
                }
                _ => {}
            }
            // Live clients heartbeat well within their session timeout.
            for i in 0..sim.clients.len() {
                if sim.clients[i].alive && h.now - sim.clients[i].last_heartbeat > 20_000 {
                    sim.heartbeat(&mut h, i);
                }
            }
            sim.check(&h);
        }
        // Quiesce: everyone releases and heartbeats until stable; then all 6 partitions are owned
        // and balanced.
        // Crashed members hold their partitions until their session (45 s) expires.
        for _ in 0..12 {
            h.advance(5_000);
            sim.heartbeat_all(&mut h);
            sim.check(&h);
        }
        let counts = sim.counts();
        if !counts.is_empty() {
            let total: usize = counts.iter().sum();
            assert_eq!(total, 6, "all partitions owned at the end: {counts:?}");
            let (min, max) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
            assert!(max - min <= 1, "balanced at the end: {counts:?}");
        }
        sim.handovers
    })
}

#[test]
fn kip848_random_interleavings_never_two_owners() {
    let mut handovers = 0;
    for seed in testkit::seeds("STRAND_SIM_SEED", 40) {
        match simulate(seed) {
            Ok(n) => handovers += n,
            Err(e) => panic!("simulation failed with seed {seed} (replay: STRAND_SIM_SEED={seed}): {e}"),
        }
    }
    assert!(
        handovers > 100,
        "the simulation moved partitions around ({handovers} handovers)"
    );
}

#[test]
fn offset_delete_of_a_stable_consumer_group_checks_its_subscriptions() {
    use kafka_protocol::messages::ConsumerProtocolSubscription;
    let mut h = H::new();
    let mut meta = BytesMut::new();
    meta.extend_from_slice(&1i16.to_be_bytes());
    ConsumerProtocolSubscription::default()
        .with_topics(vec![sb("orders")])
        .encode(&mut meta, 1)
        .unwrap();
    let id = h.join_new();
    let t = h.join(5, &id, None, &[("range", &meta)]);
    let r = h.join_resp(t).unwrap();
    let s = h.sync(&id, r.generation_id, &[(&id, b"")]);
    assert_eq!(h.sync_resp(s).unwrap().error_code, 0);
    let t = h.commit(
        8,
        &id,
        r.generation_id,
        &[("orders", 0, 1, ""), ("audit", 0, 1, "")],
    );
    assert_eq!(h.commit_errors(t), vec![0, 0]);
    let r = h.answer(
        ApiKey::OffsetDelete,
        0,
        "c",
        offset_delete_request(&["orders", "audit"]),
    );
    assert_eq!(r.error_code, 0);
    let subscribed = ResponseError::GroupSubscribedToTopic.code();
    assert_eq!(r.topics[0].partitions[0].error_code, subscribed);
    assert_eq!(r.topics[1].partitions[0].error_code, 0);
    assert_eq!(h.fetch("orders", &[0]).1[0].0, 1);
    assert_eq!(h.fetch("audit", &[0]).1[0].0, -1);
}

#[test]
fn cancel_drops_parked_and_deferred_answers() {
    let mut h = H::new();
    let (_, leader, follower) = join_pair(&mut h);
    let s = h.sync(&follower, 1, &[]);
    let a = h.c.cancel(RequestToken(s));
    h.process(a);
    let sl = h.sync(&leader, 1, &[]);
    assert!(h.sync_resp(sl).is_some());
    assert!(h.take(s).is_none(), "the cancelled SyncGroup gets no answer");
    h.hold = true;
    let t = h.commit(8, "", -1, &[]);
    let _ = t;
    let t = h.commit(8, &leader, 1, &[("orders", 0, 1, "")]);
    let a = h.c.cancel(RequestToken(t));
    h.process(a);
    h.release_held();
    assert!(h.take(t).is_none());
}

// ---------------------------------------------------------------------------------------------
// Deleted topics

/// OffsetCommit v9 of `offsets` (topic, partition, offset) for any group; the error codes.
fn commit_to(h: &mut H, group: &str, member: &str, epoch: i32, offsets: &[(&str, i32, i64)]) -> Vec<i16> {
    let partition = |p: i32, o: i64| {
        OffsetCommitRequestPartition::default()
            .with_partition_index(p)
            .with_committed_offset(o)
    };
    let topics = offsets
        .iter()
        .map(|(t, p, o)| commit_topic(t, vec![partition(*p, *o)]));
    let req = commit_request(group, member, epoch, topics.collect());
    let t = h.send(ApiKey::OffsetCommit, 9, "c", GroupRequest::OffsetCommit(req));
    h.commit_errors(t)
}

/// The committed offset of one partition for any group (-1: none).
fn committed_of(h: &mut H, group: &str, topic: &str, partition: i32) -> i64 {
    let r = h.answer(
        ApiKey::OffsetFetch,
        7,
        "c",
        fetch_request(group, topic, &[partition]),
    );
    assert_eq!(r.error_code, 0);
    r.topics[0].partitions[0].committed_offset
}

/// A restart: a fresh coordinator loads every partition from what the log holds.
fn restart(h: &mut H) {
    let mut fresh = GroupCoordinator::new(config(), 9);
    for p in 0..fresh.config.offsets_partitions {
        fresh.begin_load(p);
        fresh.replay(p, h.log.get(&p).cloned().unwrap_or_default());
        let (stats, a) = fresh.end_load(h.now, p);
        assert_eq!(stats.undecodable, 0);
        assert!(!a.iter().any(|a| matches!(a, Action::Persist { .. })));
    }
    h.c = fresh;
}

/// The offset tombstones written to the log for `topic`, as (group, partition).
fn offset_tombstones(h: &H, topic: &str) -> BTreeSet<(String, i32)> {
    h.log
        .values()
        .flatten()
        .filter(|r| r.value.is_none())
        .filter_map(|r| match RecordKey::decode(&r.key) {
            Ok(RecordKey::Offset {
                group,
                topic: t,
                partition,
            }) if t == topic => Some((group, partition)),
            _ => None,
        })
        .collect()
}

#[test]
fn deleting_a_topic_deletes_the_offsets_of_every_kind_of_group() {
    let mut h = H::new();
    // A classic group with a member, a simple group (commits only) and a KIP-848 group.
    let (ids, gen) = stable_group(&mut h, 1);
    assert_eq!(
        commit_to(
            &mut h,
            GROUP,
            &ids[0],
            gen,
            &[("orders", 0, 10), ("orders", 5, 15), ("audit", 0, 1)]
        ),
        vec![0, 0, 0]
    );
    assert_eq!(
        commit_to(&mut h, "simple", "", -1, &[("orders", 2, 20), ("audit", 1, 2)]),
        vec![0, 0]
    );
    let mut sim = Sim::new(&mut h, "cg");
    sim.join(&mut h, "c1");
    sim.heartbeat_all(&mut h);
    let (member, epoch) = (sim.clients[0].member_id.clone(), sim.clients[0].epoch);
    assert_eq!(
        commit_to(
            &mut h,
            "cg",
            &member,
            epoch,
            &[("orders", 1, 30), ("audit", 2, 3)]
        ),
        vec![0, 0]
    );

    // The topic goes from the metadata, then the coordinator hears of it.
    h.topics.0.remove("orders");
    let a = h.c.topics_deleted(h.now, &BTreeSet::from(["orders".to_string()]));
    h.process(a);
    for (group, p) in [(GROUP, 0), (GROUP, 5), ("simple", 2), ("cg", 1)] {
        assert_eq!(committed_of(&mut h, group, "orders", p), -1, "{group} orders-{p}");
    }
    for (group, p, o) in [(GROUP, 0, 1), ("simple", 1, 2), ("cg", 2, 3)] {
        assert_eq!(committed_of(&mut h, group, "audit", p), o, "{group} audit-{p}");
    }
    assert_eq!(
        offset_tombstones(&h, "orders"),
        BTreeSet::from([
            (GROUP.to_string(), 0),
            (GROUP.to_string(), 5),
            ("simple".to_string(), 2),
            ("cg".to_string(), 1)
        ]),
        "a tombstone per deleted offset"
    );
    assert!(offset_tombstones(&h, "audit").is_empty());
    // The groups themselves stay (the members are still there).
    assert_eq!(h.group_state(), Some("Stable"));
    assert!(h.c.groups.contains_key("cg"));

    // After a restart the offsets stay deleted, and the topic created again has none.
    restart(&mut h);
    h.topics.0.insert("orders".to_string(), (tid(9), 6));
    for (group, p) in [(GROUP, 0), (GROUP, 5), ("simple", 2), ("cg", 1)] {
        assert_eq!(
            committed_of(&mut h, group, "orders", p),
            -1,
            "{group} orders-{p} after a restart"
        );
    }
    assert_eq!(committed_of(&mut h, "cg", "audit", 2), 3);
}

/// A coordinator where GROUP committed, as a simple group, offset 10 of orders-0 and 1 of audit-0.
fn simple_offsets() -> H {
    let mut h = H::new();
    let offsets = [("orders", 0, 10), ("audit", 0, 1)];
    assert_eq!(commit_to(&mut h, GROUP, "", -1, &offsets), vec![0, 0]);
    h
}

#[test]
fn a_topic_deleted_while_a_partition_loads_loses_its_offsets_when_the_load_ends() {
    let mut h = simple_offsets();
    let p = h.c.partition_of(GROUP);
    // The partition is being loaded again (after a failed write) when the topic is deleted: the
    // records read so far, and those still to come, hold the topic's offsets.
    let log = h.log.get(&p).cloned().unwrap_or_default();
    h.c.begin_load(p);
    h.c.replay(p, log[..1].to_vec());
    h.topics.0.remove("orders");
    let a = h.c.topics_deleted(h.now, &BTreeSet::from(["orders".to_string()]));
    h.process(a);
    h.c.replay(p, log[1..].to_vec());
    let (stats, a) = h.c.end_load(h.now, p);
    h.process(a);
    assert_eq!(stats.offsets, 1, "only the offset of audit is loaded");
    assert_eq!(committed_of(&mut h, GROUP, "orders", 0), -1);
    assert_eq!(committed_of(&mut h, GROUP, "audit", 0), 1);
    assert_eq!(
        offset_tombstones(&h, "orders"),
        BTreeSet::from([(GROUP.to_string(), 0)])
    );
    restart(&mut h);
    h.topics.0.insert("orders".to_string(), (tid(9), 6));
    assert_eq!(committed_of(&mut h, GROUP, "orders", 0), -1);
    assert_eq!(committed_of(&mut h, GROUP, "audit", 0), 1);
}

#[test]
fn a_load_removes_the_offsets_of_topics_deleted_before_their_tombstones_were_durable() {
    let mut h = simple_offsets();
    assert_eq!(commit_to(&mut h, "other", "", -1, &[("orders", 3, 7)]), vec![0]);
    // The topic is deleted and the broker crashes before the tombstones are written: the log
    // still holds the offsets.
    h.topics.0.remove("orders");
    restart(&mut h);
    let mut removed = BTreeSet::new();
    for p in 0..h.c.config.offsets_partitions {
        let (gone, a) = h.c.remove_offsets_of_missing_topics(h.now, p, &h.topics);
        h.process(a);
        removed.extend(gone);
    }
    assert_eq!(removed, BTreeSet::from(["orders".to_string()]));
    assert_eq!(
        offset_tombstones(&h, "orders"),
        BTreeSet::from([(GROUP.to_string(), 0), ("other".to_string(), 3)])
    );
    // The topic created again has no committed offsets, now or after another restart.
    h.topics.0.insert("orders".to_string(), (tid(9), 6));
    assert_eq!(committed_of(&mut h, GROUP, "orders", 0), -1);
    assert_eq!(committed_of(&mut h, "other", "orders", 3), -1);
    assert_eq!(committed_of(&mut h, GROUP, "audit", 0), 1);
    restart(&mut h);
    assert_eq!(committed_of(&mut h, GROUP, "orders", 0), -1);
    assert_eq!(committed_of(&mut h, "other", "orders", 3), -1);
    // Offsets of existing topics are left alone.
    for p in 0..h.c.config.offsets_partitions {
        let (gone, a) = h.c.remove_offsets_of_missing_topics(h.now, p, &h.topics);
        assert!(gone.is_empty());
        assert!(!a.iter().any(|a| matches!(a, Action::Persist { .. })));
    }
    assert_eq!(committed_of(&mut h, GROUP, "audit", 0), 1);
}

#[test]
fn kip848_group_configs_set_the_heartbeat_interval_and_the_session_timeout() {
    use crate::config::{CONSUMER_HEARTBEAT_INTERVAL_MS, CONSUMER_SESSION_TIMEOUT_MS};
    let mut h = H::new();
    let join = |member: &str| {
        ConsumerGroupHeartbeatRequest::default()
            .with_group_id(GroupId(sb(GROUP)))
            .with_member_id(sb(member))
            .with_member_epoch(0)
            .with_rebalance_timeout_ms(60_000)
            .with_subscribed_topic_names(Some(vec![TopicName(sb("orders"))]))
            .with_topic_partitions(Some(vec![]))
    };
    // The broker's (the coordinator config's) values without an override.
    let r = h.consumer_heartbeat(join("a"));
    assert_eq!(r.error_code, 0);
    assert_eq!(r.heartbeat_interval_ms, h.c.config.consumer_heartbeat_interval_ms);
    let default_session = i64::from(h.c.config.consumer_session_timeout_ms);
    // The group's overrides from the next heartbeat on.
    for (key, value) in [
        (CONSUMER_HEARTBEAT_INTERVAL_MS, 7_000),
        (CONSUMER_SESSION_TIMEOUT_MS, 90_000),
    ] {
        h.topics.1.insert((GROUP.to_string(), key.to_string()), value);
    }
    let r = h.consumer_heartbeat(join("b"));
    assert_eq!((r.error_code, r.heartbeat_interval_ms), (0, 7_000));
    // "a" stops heartbeating: it outlives the broker's session timeout only if its last
    // heartbeat armed the group's; it did not (it came before the override), "b"'s did.
    h.advance(default_session + 1_000);
    let mut again = join("b");
    again.member_epoch = r.member_epoch;
    let r = h.consumer_heartbeat(again.clone());
    assert_eq!(r.error_code, 0, "b's session is the group's 90 s");
    let mut stale = join("a");
    stale.member_epoch = 1;
    assert_eq!(
        h.consumer_heartbeat(stale).error_code,
        ResponseError::UnknownMemberId.code(),
        "a's session was the broker's"
    );
    h.advance(90_000 - 1_000);
    again.member_epoch = r.member_epoch;
    assert_eq!(
        h.consumer_heartbeat(again).error_code,
        0,
        "b heartbeats within 90 s"
    );
}
