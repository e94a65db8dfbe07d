//! Deterministic tests of the share group coordinator: every path of ShareGroupHeartbeat, the
//! assignment as members and topics come and go, sessions, ShareGroupDescribe, ListGroups and the
//! member check; and a seeded simulation checking the assignment invariants.

use std::collections::{BTreeMap, BTreeSet};

use kafka_protocol::messages::{GroupId, ShareGroupHeartbeatRequest, ShareGroupHeartbeatResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use strand_protocol::types::TopicId;

use super::coordinator::{
    Action, OtherGroup, ShareCoordinator, ShareCoordinatorConfig, ShareMeta, ShareTopics,
};
use crate::testkit::{self, SplitMix64};

const SESSION: i64 = 45_000;

/// A topic view whose version goes up with every change, like the metadata's.
#[derive(Default)]
struct Topics {
    version: u64,
    topics: BTreeMap<String, (TopicId, i32)>,
    next_id: u8,
    /// Group config overrides by (group, key).
    group_configs: BTreeMap<(String, String), i32>,
}

impl Topics {
    fn with(topics: &[(&str, i32)]) -> Self {
        let mut t = Topics::default();
        for (name, n) in topics {
            t.create(name, *n);
        }
        t
    }

    fn create(&mut self, name: &str, partitions: i32) -> TopicId {
        self.next_id += 1;
        let id = TopicId(uuid::Uuid::from_bytes([self.next_id; 16]));
        self.topics.insert(name.to_string(), (id, partitions));
        self.version += 1;
        id
    }

    fn delete(&mut self, name: &str) {
        self.topics.remove(name);
        self.version += 1;
    }

    fn grow(&mut self, name: &str, partitions: i32) {
        if let Some(t) = self.topics.get_mut(name) {
            t.1 = partitions;
        }
        self.version += 1;
    }

    fn id(&self, name: &str) -> TopicId {
        self.topics[name].0
    }
}

impl ShareTopics for Topics {
    fn version(&self) -> u64 {
        self.version
    }

    fn topic_by_name(&self, name: &str) -> Option<(TopicId, i32)> {
        self.topics.get(name).copied()
    }

    fn topic_name(&self, id: TopicId) -> Option<String> {
        self.topics
            .iter()
            .find(|(_, v)| v.0 == id)
            .map(|(k, _)| k.clone())
    }

    fn group_config_int(&self, group: &str, key: &str) -> Option<i32> {
        self.group_configs
            .get(&(group.to_string(), key.to_string()))
            .copied()
    }
}

fn sb(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_owned())
}

fn req(group: &str, member: &str, epoch: i32, topics: Option<&[&str]>) -> ShareGroupHeartbeatRequest {
    ShareGroupHeartbeatRequest::default()
        .with_group_id(GroupId(sb(group)))
        .with_member_id(sb(member))
        .with_member_epoch(epoch)
        .with_subscribed_topic_names(topics.map(|t| t.iter().map(|n| TopicName(sb(n))).collect()))
}

fn meta() -> ShareMeta {
    ShareMeta {
        client_id: "client-1".into(),
        client_host: "/127.0.0.1".into(),
    }
}

struct Harness {
    c: ShareCoordinator,
    topics: Topics,
    now: i64,
    actions: Vec<Action>,
}

impl Harness {
    fn new(topics: &[(&str, i32)]) -> Self {
        Self::with_config(topics, ShareCoordinatorConfig::default())
    }

    fn with_config(topics: &[(&str, i32)], config: ShareCoordinatorConfig) -> Self {
        Harness {
            c: ShareCoordinator::new(config),
            topics: Topics::with(topics),
            now: 1_000,
            actions: Vec::new(),
        }
    }

    fn send(&mut self, r: ShareGroupHeartbeatRequest) -> ShareGroupHeartbeatResponse {
        self.send_with(r, OtherGroup::None)
    }

    fn send_with(&mut self, r: ShareGroupHeartbeatRequest, other: OtherGroup) -> ShareGroupHeartbeatResponse {
        let (resp, actions) = self.c.heartbeat(self.now, &meta(), &r, &self.topics, other);
        self.actions.extend(actions);
        resp
    }

    /// Joins and returns the new epoch.
    fn join(&mut self, group: &str, member: &str, topics: &[&str]) -> i32 {
        let r = self.send(req(group, member, 0, Some(topics)));
        assert_eq!(r.error_code, 0, "{:?}", r.error_message);
        assert!(r.assignment.is_some());
        r.member_epoch
    }

    fn heartbeat(&mut self, group: &str, member: &str, epoch: i32) -> ShareGroupHeartbeatResponse {
        self.send(req(group, member, epoch, None))
    }

    fn epoch_of(&self, group: &str, member: &str) -> i32 {
        self.c.groups[group].members[member].member_epoch
    }

    /// Every member heartbeats until no epoch changes: the group is reconciled.
    fn settle(&mut self, group: &str) {
        for _ in 0..10 {
            let members: Vec<String> = self.c.groups[group].members.keys().cloned().collect();
            let mut changed = false;
            for m in members {
                let e = self.epoch_of(group, &m);
                let r = self.heartbeat(group, &m, e);
                assert_eq!(r.error_code, 0, "{:?}", r.error_message);
                changed |= r.member_epoch != e;
            }
            if !changed {
                return;
            }
        }
        panic!("group {group} did not settle");
    }

    fn tick_to(&mut self, now: i64) {
        self.now = now;
        let a = self.c.tick(now);
        self.actions.extend(a);
    }

    fn gone(&mut self) -> Vec<(String, String)> {
        let gone = self
            .actions
            .iter()
            .filter_map(|a| match a {
                Action::MemberGone { group, member } => Some((group.clone(), member.clone())),
                Action::WakeAt(_) => None,
            })
            .collect();
        self.actions.clear();
        gone
    }

    /// Assigned partitions per member, as the members were told.
    fn assigned(&self, group: &str) -> BTreeMap<String, BTreeSet<(TopicId, i32)>> {
        self.c.groups[group]
            .members
            .iter()
            .map(|(id, m)| {
                (
                    id.clone(),
                    m.assigned
                        .iter()
                        .flat_map(|(t, ps)| ps.iter().map(move |p| (*t, *p)))
                        .collect(),
                )
            })
            .collect()
    }
}

fn code(r: &ShareGroupHeartbeatResponse) -> ResponseError {
    ResponseError::try_from_code(r.error_code).unwrap_or(ResponseError::UnknownServerError)
}

fn partitions_of(r: &ShareGroupHeartbeatResponse) -> BTreeSet<(uuid::Uuid, i32)> {
    r.assignment
        .iter()
        .flat_map(|a| a.topic_partitions.iter())
        .flat_map(|tp| tp.partitions.iter().map(move |p| (tp.topic_id, *p)))
        .collect()
}

#[test]
fn join_then_heartbeat() {
    let mut h = Harness::new(&[("t", 4)]);
    let r = h.send(req("g", "m1", 0, Some(&["t"])));
    assert_eq!(r.error_code, 0);
    assert_eq!(r.error_message, None);
    assert_eq!(r.member_id.as_deref(), Some("m1"));
    assert_eq!(r.member_epoch, 1);
    assert_eq!(r.heartbeat_interval_ms, 5_000);
    let t = h.topics.id("t").0;
    assert_eq!(partitions_of(&r), (0..4).map(|p| (t, p)).collect());
    // A plain heartbeat: same epoch, no assignment (nothing changed).
    let r = h.heartbeat("g", "m1", 1);
    assert_eq!((r.error_code, r.member_epoch), (0, 1));
    assert!(r.assignment.is_none());
    // A full request (subscription set) gets the assignment again, without a new epoch.
    let r = h.send(req("g", "m1", 1, Some(&["t"])));
    assert_eq!((r.error_code, r.member_epoch), (0, 1));
    assert_eq!(partitions_of(&r).len(), 4);
    let g = &h.c.groups["g"];
    assert_eq!((g.group_epoch, g.assignment_epoch), (1, 1));
    let m = &g.members["m1"];
    assert_eq!(
        (m.client_id.as_str(), m.client_host.as_str()),
        ("client-1", "/127.0.0.1")
    );
    assert!(h.gone().is_empty());
}

#[test]
fn invalid_requests() {
    let mut h = Harness::new(&[("t", 1)]);
    let cases: Vec<(ShareGroupHeartbeatRequest, &str)> = vec![
        (req("g", "", 0, Some(&["t"])), "MemberId can't be empty."),
        (req("g", "  ", 0, Some(&["t"])), "MemberId can't be empty."),
        (req("", "m", 0, Some(&["t"])), "GroupId can't be empty."),
        (
            req("g", "m", 0, Some(&["t"])).with_rack_id(Some(sb(" "))),
            "RackId can't be empty.",
        ),
        (
            req("g", "m", 0, None),
            "SubscribedTopicNames must be set in first request.",
        ),
        (
            req("g", "m", 0, Some(&[])),
            "SubscribedTopicNames must be set in first request.",
        ),
        (req("g", "m", -2, None), "MemberEpoch is invalid."),
        (
            req("g", &"x".repeat(256), 0, Some(&["t"])),
            "MemberId can't be longer than 255 characters.",
        ),
    ];
    for (r, message) in cases {
        let resp = h.send(r);
        assert_eq!(code(&resp), ResponseError::InvalidRequest, "{message}");
        assert_eq!(resp.error_message.as_deref(), Some(message));
    }
    let many: Vec<String> = (0..10_001).map(|i| format!("t{i}")).collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    assert_eq!(
        code(&h.send(req("g", "m", 0, Some(&many)))),
        ResponseError::InvalidRequest
    );
    // Nothing was created.
    assert!(h.c.groups.is_empty());
    assert_eq!(h.c.next_wake(), None);
}

#[test]
fn fencing_and_lost_answers() {
    let mut h = Harness::new(&[("t", 2)]);
    assert_eq!(h.join("g", "m1", &["t"]), 1);
    assert_eq!(h.join("g", "m2", &["t"]), 2);
    // m1 moves to epoch 2 at its next heartbeat; its previous epoch is 1.
    let r = h.heartbeat("g", "m1", 1);
    assert_eq!((r.error_code, r.member_epoch), (0, 2));
    assert!(r.assignment.is_some(), "its assignment changed");
    // The answer was lost: the member retries with its previous epoch, which is accepted.
    let r = h.heartbeat("g", "m1", 1);
    assert_eq!((r.error_code, r.member_epoch), (0, 2));
    // An epoch from the future.
    let r = h.heartbeat("g", "m1", 3);
    assert_eq!(code(&r), ResponseError::FencedMemberEpoch);
    assert!(r.error_message.unwrap().contains("greater member epoch (3)"));
    // An epoch older than the previous one.
    h.join("g", "m3", &["t"]);
    h.heartbeat("g", "m1", 2);
    assert_eq!(h.epoch_of("g", "m1"), 3);
    let r = h.heartbeat("g", "m1", 1);
    assert_eq!(code(&r), ResponseError::FencedMemberEpoch);
    assert!(r.error_message.unwrap().contains("smaller member epoch (1)"));
    // A fenced member stays a member (its session runs on) and may rejoin with epoch 0.
    let r = h.send(req("g", "m1", 0, Some(&["t"])));
    assert_eq!((r.error_code, r.member_epoch), (0, 3));
    assert!(r.assignment.is_some());
    assert!(h.gone().is_empty());
}

#[test]
fn unknown_members_and_groups() {
    let mut h = Harness::new(&[("t", 1)]);
    // A heartbeat for a group that does not exist (a restart lost it): rejoin.
    let r = h.heartbeat("g", "m1", 5);
    assert_eq!(code(&r), ResponseError::UnknownMemberId);
    assert_eq!(
        r.error_message.as_deref(),
        Some("Member m1 is not a member of group g.")
    );
    assert!(h.c.groups.is_empty(), "no group is created by a heartbeat");
    h.join("g", "m1", &["t"]);
    assert_eq!(code(&h.heartbeat("g", "m2", 1)), ResponseError::UnknownMemberId);
    // Leaving: unknown group, unknown member.
    let r = h.send(req("nope", "m1", -1, None));
    assert_eq!(code(&r), ResponseError::GroupIdNotFound);
    assert_eq!(r.error_message.as_deref(), Some("Group nope not found."));
    assert_eq!(
        code(&h.send(req("g", "m2", -1, None))),
        ResponseError::UnknownMemberId
    );
    assert!(h.gone().is_empty());
}

#[test]
fn leaving_releases_and_reassigns() {
    let mut h = Harness::new(&[("t", 4)]);
    h.join("g", "m1", &["t"]);
    h.join("g", "m2", &["t"]);
    h.settle("g");
    assert!(h.assigned("g").values().all(|a| a.len() == 2));
    let epoch = h.c.groups["g"].group_epoch;
    let r = h.send(req("g", "m1", h.epoch_of("g", "m1"), None).with_member_epoch(-1));
    assert_eq!(r.error_code, 0);
    assert_eq!(r.member_epoch, -1);
    assert_eq!(r.member_id.as_deref(), Some("m1"));
    assert_eq!(h.gone(), vec![("g".to_string(), "m1".to_string())]);
    assert_eq!(h.c.groups["g"].group_epoch, epoch + 1);
    // m2 takes every partition at its next heartbeat.
    let e = h.epoch_of("g", "m2");
    let r = h.heartbeat("g", "m2", e);
    assert_eq!(r.member_epoch, epoch + 1);
    assert_eq!(partitions_of(&r).len(), 4);
    // The last member leaves: the group is Empty, and stays.
    let e = h.epoch_of("g", "m2");
    assert_eq!(
        h.send(req("g", "m2", e, None).with_member_epoch(-1)).error_code,
        0
    );
    assert_eq!(h.c.groups["g"].state_name(), "Empty");
    assert_eq!(h.c.next_wake(), None, "no sessions left");
    // A leave is not a heartbeat: m2 is unknown now.
    assert_eq!(code(&h.heartbeat("g", "m2", e)), ResponseError::UnknownMemberId);
}

/// DeleteGroups of a share group: refused while it has members, then it is forgotten; a join
/// afterwards starts a new group (epoch 1 again).
#[test]
fn delete_needs_an_empty_group() {
    let mut h = Harness::new(&[("t", 2)]);
    assert_eq!(h.c.delete("g"), Err(ResponseError::GroupIdNotFound));
    h.join("g", "m1", &["t"]);
    assert_eq!(h.c.delete("g"), Err(ResponseError::NonEmptyGroup));
    assert!(h.c.is_share_group("g"));
    let e = h.epoch_of("g", "m1");
    assert_eq!(
        h.send(req("g", "m1", e, None).with_member_epoch(-1)).error_code,
        0
    );
    assert_eq!(h.c.delete("g"), Ok(()));
    assert!(!h.c.is_share_group("g"));
    assert!(h.c.list(&[], &[], 5).is_empty(), "a deleted group is not listed");
    assert_eq!(h.c.delete("g"), Err(ResponseError::GroupIdNotFound));
    assert_eq!(h.c.next_wake(), None);
    assert_eq!(h.join("g", "m2", &["t"]), 1, "a new group starts at epoch 1");
}

#[test]
fn sessions_expire_by_tick() {
    let mut h = Harness::new(&[("t", 2)]);
    h.join("g", "m1", &["t"]);
    h.now += 10_000;
    h.join("g", "m2", &["t"]);
    let wakes: Vec<i64> = h
        .actions
        .iter()
        .filter_map(|a| match a {
            Action::WakeAt(t) => Some(*t),
            Action::MemberGone { .. } => None,
        })
        .collect();
    assert_eq!(wakes, vec![1_000 + SESSION, 1_000 + SESSION]);
    assert_eq!(h.c.next_wake(), Some(1_000 + SESSION));
    // m2 heartbeats; m1 does not.
    h.now = 1_000 + SESSION - 1;
    let e = h.epoch_of("g", "m2");
    h.heartbeat("g", "m2", e);
    h.tick_to(1_000 + SESSION - 1);
    assert!(h.gone().is_empty(), "not due yet");
    h.tick_to(1_000 + SESSION);
    assert_eq!(h.gone(), vec![("g".to_string(), "m1".to_string())]);
    assert!(!h.c.groups["g"].members.contains_key("m1"));
    assert_eq!(h.c.next_wake(), Some(1_000 + SESSION - 1 + SESSION));
    // The expired member is unknown; it may join again.
    assert_eq!(code(&h.heartbeat("g", "m1", 1)), ResponseError::UnknownMemberId);
    h.join("g", "m1", &["t"]);
    // Both expire at their own deadlines.
    h.tick_to(10_000_000);
    let mut gone = h.gone();
    gone.sort();
    assert_eq!(gone, vec![("g".into(), "m1".into()), ("g".into(), "m2".into())]);
    assert_eq!(h.c.groups["g"].state_name(), "Empty");
    assert_eq!(h.c.next_wake(), None);
}

/// The assignment properties for `partitions` partitions and `members` members.
fn check_assignment(partitions: i32, members: usize) {
    let mut h = Harness::new(&[("t", partitions)]);
    for i in 0..members {
        h.join("g", &format!("m{i}"), &["t"]);
    }
    h.settle("g");
    let g = &h.c.groups["g"];
    assert!(g.members.values().all(|m| m.member_epoch == g.group_epoch));
    let assigned = h.assigned("g");
    let mut holders: BTreeMap<(TopicId, i32), usize> = BTreeMap::new();
    for a in assigned.values() {
        assert!(
            !a.is_empty(),
            "{partitions} partitions, {members} members: a member has nothing"
        );
        for tp in a {
            *holders.entry(*tp).or_default() += 1;
        }
    }
    assert_eq!(holders.len(), partitions as usize, "every partition is assigned");
    let p = partitions as usize;
    if members <= p {
        assert!(
            holders.values().all(|n| *n == 1),
            "no sharing needed: {holders:?}"
        );
        let sizes: BTreeSet<usize> = assigned.values().map(BTreeSet::len).collect();
        assert!(
            sizes.iter().max().unwrap() - sizes.iter().min().unwrap() <= 1,
            "{sizes:?}"
        );
    } else {
        assert!(assigned.values().all(|a| a.len() == 1), "{assigned:?}");
        let most = holders.values().max().unwrap();
        let least = holders.values().min().unwrap();
        assert!(most - least <= 1, "shared evenly: {holders:?}");
    }
}

#[test]
fn assignment_with_one_and_four_partitions() {
    for partitions in [1, 4] {
        for members in 1..=5 {
            check_assignment(partitions, members);
        }
    }
}

#[test]
fn topic_growth_creation_and_deletion_update_assignments() {
    let mut h = Harness::new(&[("a", 2)]);
    // Subscribed to a topic that does not exist yet.
    h.join("g", "m1", &["a", "b"]);
    h.join("g", "m2", &["a", "b"]);
    h.settle("g");
    let a = h.topics.id("a");
    assert_eq!(h.assigned("g").values().map(BTreeSet::len).sum::<usize>(), 2);
    // Growth: a goes to 4 partitions; the next heartbeat notices.
    let epoch = h.c.groups["g"].group_epoch;
    h.topics.grow("a", 4);
    let e = h.epoch_of("g", "m1");
    let r = h.heartbeat("g", "m1", e);
    assert_eq!(r.member_epoch, epoch + 1);
    assert!(r.assignment.is_some());
    h.settle("g");
    let all: BTreeSet<(TopicId, i32)> = h.assigned("g").values().flatten().copied().collect();
    assert_eq!(all, (0..4).map(|p| (a, p)).collect());
    // Creation of b.
    let b = h.topics.create("b", 2);
    h.settle("g");
    let all: BTreeSet<(TopicId, i32)> = h.assigned("g").values().flatten().copied().collect();
    assert_eq!(all.len(), 6);
    assert!(all.contains(&(b, 0)) && all.contains(&(b, 1)));
    // Deletion of a: only b's partitions remain.
    h.topics.delete("a");
    h.settle("g");
    let all: BTreeSet<(TopicId, i32)> = h.assigned("g").values().flatten().copied().collect();
    assert_eq!(all, BTreeSet::from([(b, 0), (b, 1)]));
    assert!(h.assigned("g").values().all(|x| x.len() == 1));
    // An unrelated topic change bumps nothing.
    let epoch = h.c.groups["g"].group_epoch;
    h.topics.create("other", 3);
    h.settle("g");
    assert_eq!(h.c.groups["g"].group_epoch, epoch);
}

#[test]
fn subscription_changes() {
    let mut h = Harness::new(&[("a", 1), ("b", 1)]);
    h.join("g", "m1", &["a"]);
    let epoch = h.c.groups["g"].group_epoch;
    // The same subscription again: no new epoch.
    let r = h.send(req("g", "m1", 1, Some(&["a", "a"])));
    assert_eq!(r.member_epoch, epoch);
    // A new subscription: new epoch and assignment.
    let r = h.send(req("g", "m1", 1, Some(&["b", "a"])));
    assert_eq!(r.member_epoch, epoch + 1);
    assert_eq!(partitions_of(&r).len(), 2);
    assert_eq!(
        h.c.groups["g"].members["m1"].subscribed_topic_names,
        vec!["a", "b"]
    );
    // An empty subscription after joining is allowed: nothing assigned.
    let r = h.send(req("g", "m1", epoch + 1, Some(&[])));
    assert_eq!(r.error_code, 0);
    assert_eq!(partitions_of(&r).len(), 0);
    assert!(r.assignment.is_some());
}

/// A coordinator of topic "t" under the default configuration with one bound set by `bound`, where
/// the (group, member)s of `joins` join, and one more join, which the bound refuses: the harness
/// and that join's answer.
fn filled_to_the_bound(
    bound: impl FnOnce(&mut ShareCoordinatorConfig),
    joins: [(&str, &str); 2],
    (group, member): (&str, &str),
) -> (Harness, ShareGroupHeartbeatResponse) {
    let mut config = ShareCoordinatorConfig::default();
    bound(&mut config);
    let mut h = Harness::with_config(&[("t", 1)], config);
    for (g, m) in joins {
        h.join(g, m, &["t"]);
    }
    let r = h.send(req(group, member, 0, Some(&["t"])));
    assert_eq!(code(&r), ResponseError::GroupMaxSizeReached);
    (h, r)
}

#[test]
fn max_size() {
    let max_size = |c: &mut ShareCoordinatorConfig| c.max_size = 2;
    let (mut h, r) = filled_to_the_bound(max_size, [("g", "m1"), ("g", "m2")], ("g", "m3"));
    assert_eq!(
        r.error_message.as_deref(),
        Some("The share group has reached its maximum capacity of 2 members.")
    );
    // Members already in keep going, and rejoin.
    assert_eq!(h.heartbeat("g", "m1", 1).error_code, 0);
    assert_eq!(h.send(req("g", "m2", 0, Some(&["t"]))).error_code, 0);
    // After a leave there is room.
    let e = h.epoch_of("g", "m2");
    h.send(req("g", "m2", e, None).with_member_epoch(-1));
    h.join("g", "m3", &["t"]);
}

#[test]
fn bounded_number_of_groups() {
    let max_groups = |c: &mut ShareCoordinatorConfig| c.max_groups = 2;
    let (mut h, _) = filled_to_the_bound(max_groups, [("g1", "m"), ("g2", "m")], ("g3", "m"));
    // An empty group makes room: it is forgotten.
    h.send(req("g1", "m", 1, None).with_member_epoch(-1));
    h.join("g3", "m", &["t"]);
    assert!(!h.c.is_share_group("g1"));
    assert!(h.c.is_share_group("g2") && h.c.is_share_group("g3"));
}

#[test]
fn group_ids_of_other_group_types() {
    let mut h = Harness::new(&[("t", 1)]);
    let join = req("cg", "m", 0, Some(&["t"]));
    assert!(h.c.needs_other_group_check(&join));
    let r = h.send_with(join.clone(), OtherGroup::Exists);
    assert_eq!(code(&r), ResponseError::GroupIdNotFound);
    assert_eq!(r.error_message.as_deref(), Some("Group cg is not a share group."));
    let r = h.send_with(
        join.clone(),
        OtherGroup::Unknown(ResponseError::CoordinatorLoadInProgress),
    );
    assert_eq!(code(&r), ResponseError::CoordinatorLoadInProgress);
    assert!(!h.c.is_share_group("cg"));
    // Once the share group exists, no more checks; invalid requests and heartbeats need none.
    h.send(join.clone());
    assert!(h.c.is_share_group("cg"));
    assert!(!h.c.needs_other_group_check(&join));
    assert!(!h.c.needs_other_group_check(&req("x", "m", 1, None)));
    assert!(!h.c.needs_other_group_check(&req("x", "", 0, Some(&["t"]))));
}

#[test]
fn describe_groups() {
    let mut h = Harness::new(&[("t", 2), ("u", 1)]);
    h.join("g", "m1", &["t"]);
    h.send(req("g", "m2", 0, Some(&["t", "u"])).with_rack_id(Some(sb("rack-a"))));
    h.settle("g");
    h.join("e", "m", &["t"]);
    h.send(req("e", "m", 1, None).with_member_epoch(-1));
    let d =
        h.c.describe(&["g".into(), "nope".into(), "e".into()], true, &h.topics);
    assert_eq!(d.len(), 3);
    let g = &d[0];
    assert_eq!((g.error_code, g.group_id.as_str()), (0, "g"));
    assert_eq!(g.group_state.as_str(), "Stable");
    assert_eq!(g.assignor_name.as_str(), "simple");
    assert_eq!((g.group_epoch, g.assignment_epoch), (2, 2));
    assert_eq!(g.authorized_operations, (1 << 3) | (1 << 6) | (1 << 8));
    assert_eq!(g.members.len(), 2);
    let m2 = g.members.iter().find(|m| m.member_id.as_str() == "m2").unwrap();
    assert_eq!(m2.rack_id.as_deref(), Some("rack-a"));
    assert_eq!(m2.member_epoch, 2);
    assert_eq!(
        (m2.client_id.as_str(), m2.client_host.as_str()),
        ("client-1", "/127.0.0.1")
    );
    let subs: Vec<&str> = m2.subscribed_topic_names.iter().map(|n| n.as_str()).collect();
    assert_eq!(subs, vec!["t", "u"]);
    let described: usize = g
        .members
        .iter()
        .flat_map(|m| m.assignment.topic_partitions.iter())
        .map(|tp| {
            assert!(["t", "u"].contains(&tp.topic_name.as_str()));
            assert_eq!(TopicId(tp.topic_id), h.topics.id(tp.topic_name.as_str()));
            tp.partitions.len()
        })
        .sum();
    assert_eq!(described, 3);
    let nope = &d[1];
    assert_eq!(nope.error_code, ResponseError::GroupIdNotFound.code());
    assert_eq!(nope.error_message.as_deref(), Some("Group nope not found."));
    let e = &d[2];
    assert_eq!((e.error_code, e.group_state.as_str()), (0, "Empty"));
    assert!(e.members.is_empty());
    // Without authorized operations.
    let d = h.c.describe(&["g".into()], false, &h.topics);
    assert_eq!(d[0].authorized_operations, i32::MIN);
}

#[test]
fn list_groups_with_filters() {
    let mut h = Harness::new(&[("t", 1)]);
    h.join("stable", "m", &["t"]);
    h.join("empty", "m", &["t"]);
    h.send(req("empty", "m", 1, None).with_member_epoch(-1));
    let names = |l: &[kafka_protocol::messages::list_groups_response::ListedGroup]| -> Vec<String> {
        l.iter().map(|g| g.group_id.as_str().to_string()).collect()
    };
    let all = h.c.list(&[], &[], 5);
    assert_eq!(names(&all), vec!["empty", "stable"]);
    assert!(all
        .iter()
        .all(|g| g.protocol_type.as_str() == "share" && g.group_type.as_str() == "share"));
    assert_eq!(all[0].group_state.as_str(), "Empty");
    assert_eq!(all[1].group_state.as_str(), "Stable");
    assert_eq!(names(&h.c.list(&["STABLE".into()], &[], 5)), vec!["stable"]);
    assert_eq!(
        names(&h.c.list(&[], &["Share".into()], 5)),
        vec!["empty", "stable"]
    );
    assert!(h
        .c
        .list(&[], &["consumer".into(), "classic".into()], 5)
        .is_empty());
    assert!(h.c.list(&["dead".into()], &[], 5).is_empty());
    // Older versions: no state before v4, no type before v5.
    let v3 = h.c.list(&[], &[], 3);
    assert!(v3
        .iter()
        .all(|g| g.group_state.is_empty() && g.group_type.is_empty()));
    let v4 = h.c.list(&[], &[], 4);
    assert!(v4
        .iter()
        .all(|g| !g.group_state.is_empty() && g.group_type.is_empty()));
}

#[test]
fn member_checks_for_share_fetch() {
    let mut h = Harness::new(&[("t", 2)]);
    h.join("g", "m1", &["t"]);
    let t = h.topics.id("t");
    let info = h.c.check_member("g", "m1").unwrap();
    assert_eq!(info.member_epoch, 1);
    assert_eq!(info.assigned, vec![(t, 0), (t, 1)]);
    assert_eq!(
        h.c.check_member("nope", "m1"),
        Err(ResponseError::GroupIdNotFound)
    );
    assert_eq!(h.c.check_member("g", "m2"), Err(ResponseError::UnknownMemberId));
    h.send(req("g", "m1", 1, None).with_member_epoch(-1));
    assert_eq!(h.c.check_member("g", "m1"), Err(ResponseError::UnknownMemberId));
}

/// Members join, heartbeat, leave and go silent, topics appear, grow and vanish, time passes; a
/// member's epoch never goes down and never passes the group epoch, and whenever every member
/// has heartbeated since the last change, every subscribed partition has a member and every
/// member with an existing subscribed topic has a partition. Replay a failure with
/// `STRAND_SHARE_SIM_SEED=<seed>`.
#[test]
fn seeded_simulation() {
    let mut checks = 0usize;
    for seed in testkit::seeds("STRAND_SHARE_SIM_SEED", 40) {
        checks += simulate(seed);
    }
    assert!(checks > 100, "the simulation checked too little ({checks})");
}

fn simulate(seed: u64) -> usize {
    let mut rng = SplitMix64(seed);
    let names = ["a", "b", "c"];
    let mut h = Harness::new(&[("a", 3)]);
    let mut epochs: BTreeMap<String, i32> = BTreeMap::new();
    let mut subs: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    let mut checks = 0;
    for step in 0..400 {
        let ctx = format!("seed {seed} step {step}");
        match rng.below(10) {
            0..=1 => {
                let m = format!("m{}", rng.below(8));
                let mut s: Vec<&str> = names.iter().copied().filter(|_| rng.below(2) == 0).collect();
                if s.is_empty() {
                    s.push("a");
                }
                let r = h.send(req("g", &m, 0, Some(&s)));
                assert_eq!(r.error_code, 0, "{ctx}: {:?}", r.error_message);
                epochs.insert(m.clone(), r.member_epoch);
                subs.insert(m, s);
            }
            2..=5 => {
                if let Some((m, e)) = epochs.iter().nth(rng.below(epochs.len() as u64) as usize) {
                    let (m, e) = (m.clone(), *e);
                    let r = h.heartbeat("g", &m, e);
                    if r.error_code == 0 {
                        assert!(r.member_epoch >= e, "{ctx}: epoch went down");
                        assert!(r.member_epoch <= h.c.groups["g"].group_epoch, "{ctx}");
                        epochs.insert(m, r.member_epoch);
                    } else {
                        // Only a member whose session expired is refused.
                        assert_eq!(code(&r), ResponseError::UnknownMemberId, "{ctx}");
                        epochs.remove(&m);
                    }
                }
            }
            6 => {
                if let Some(m) = epochs
                    .keys()
                    .nth(rng.below(epochs.len() as u64) as usize)
                    .cloned()
                {
                    let e = epochs[&m];
                    let r = h.send(req("g", &m, e, None).with_member_epoch(-1));
                    assert_eq!(r.error_code, 0, "{ctx}");
                    epochs.remove(&m);
                }
            }
            7 => {
                let t = names[rng.below(3) as usize];
                match h.topics.topic_by_name(t) {
                    None => {
                        h.topics.create(t, 1 + rng.below(4) as i32);
                    }
                    Some((_, n)) if rng.below(2) == 0 => h.topics.grow(t, n + 1),
                    Some(_) => h.topics.delete(t),
                }
            }
            _ => {
                h.now += rng.below(20_000) as i64;
                let now = h.now;
                h.tick_to(now);
                for (_, m) in h.gone() {
                    epochs.remove(&m);
                }
            }
        }
        // Quiescent check: every live member heartbeats until settled.
        if step % 25 == 24 && h.c.groups.get("g").is_some_and(|g| !g.members.is_empty()) {
            h.settle("g");
            for (m, e) in epochs.iter_mut() {
                *e = h.epoch_of("g", m);
            }
            let g = &h.c.groups["g"];
            let assigned = h.assigned("g");
            let covered: BTreeSet<(TopicId, i32)> = assigned.values().flatten().copied().collect();
            for (m, member) in &g.members {
                let mut wanted = 0;
                for t in &member.subscribed_topic_names {
                    if let Some((id, n)) = h.topics.topic_by_name(t) {
                        wanted += n;
                        for p in 0..n {
                            assert!(covered.contains(&(id, p)), "{ctx}: {t}-{p} has no member");
                        }
                    }
                }
                assert_eq!(wanted > 0, !assigned[m].is_empty(), "{ctx}: {m} {assigned:?}");
                assert_eq!(member.member_epoch, g.group_epoch, "{ctx}");
                assert!(
                    assigned[m].iter().all(|(t, _)| h.topics.topic_name(*t).is_some()),
                    "{ctx}: an assignment names a deleted topic"
                );
            }
            checks += 1;
        }
    }
    checks
}

#[test]
fn group_configs_set_the_heartbeat_interval_and_the_session_timeout() {
    use crate::config::{SHARE_HEARTBEAT_INTERVAL_MS, SHARE_SESSION_TIMEOUT_MS};
    let mut h = Harness::new(&[("t", 2)]);
    for (key, value) in [
        (SHARE_HEARTBEAT_INTERVAL_MS, 7_000),
        (SHARE_SESSION_TIMEOUT_MS, 50_000),
    ] {
        h.topics
            .group_configs
            .insert(("g".to_string(), key.to_string()), value);
    }
    let r = h.send(req("g", "m1", 0, Some(&["t"])));
    assert_eq!((r.error_code, r.heartbeat_interval_ms), (0, 7_000));
    // Another group keeps the broker's.
    let r = h.send(req("other", "m1", 0, Some(&["t"])));
    assert_eq!(
        r.heartbeat_interval_ms,
        ShareCoordinatorConfig::default().heartbeat_interval_ms
    );
    let wakes: Vec<i64> = h
        .actions
        .iter()
        .filter_map(|a| match a {
            Action::WakeAt(t) => Some(*t),
            Action::MemberGone { .. } => None,
        })
        .collect();
    assert_eq!(
        wakes,
        vec![1_000 + 50_000, 1_000 + SESSION],
        "each group's session"
    );
    h.tick_to(1_000 + SESSION);
    assert_eq!(h.gone(), vec![("other".to_string(), "m1".to_string())]);
    h.tick_to(1_000 + 50_000);
    assert_eq!(h.gone(), vec![("g".to_string(), "m1".to_string())]);
}
