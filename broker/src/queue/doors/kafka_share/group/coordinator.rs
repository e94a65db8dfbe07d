//! The share group coordinator of one shard: membership, epochs and assignments of the share
//! groups it coordinates, as a sans-I/O state machine (see the module documentation of
//! [`crate::queue::doors::kafka_share::group`] for the protocol and where Strand differs from Kafka).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use kafka_protocol::messages::list_groups_response::ListedGroup;
use kafka_protocol::messages::share_group_describe_response::{
    Assignment as DescAssignment, DescribedGroup, Member, TopicPartitions as DescTopicPartitions,
};
use kafka_protocol::messages::share_group_heartbeat_response::{
    Assignment as RespAssignment, TopicPartitions as RespTopicPartitions,
};
use kafka_protocol::messages::{GroupId, ShareGroupHeartbeatRequest, ShareGroupHeartbeatResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use strand_protocol::types::TopicId;

use super::assignor::{self, AssignMember, Assignment};
use crate::config::{SHARE_HEARTBEAT_INTERVAL_MS, SHARE_SESSION_TIMEOUT_MS};

/// The member epoch of a leave request.
pub(crate) const LEAVE_GROUP_EPOCH: i32 = -1;
/// Longest member id accepted (Kafka's limit for consumer groups; share groups have none).
const MAX_MEMBER_ID_LEN: usize = 255;
/// Most topic names one member may subscribe to.
const MAX_SUBSCRIBED_TOPICS: usize = 10_000;
/// The protocol type and group type of share groups in ListGroups.
pub(crate) const SHARE: &str = "share";

/// Coordinator settings, with Kafka's names.
#[derive(Debug, Clone)]
pub(crate) struct ShareCoordinatorConfig {
    /// `group.share.session.timeout.ms`.
    pub(crate) session_timeout_ms: i32,
    /// `group.share.heartbeat.interval.ms`.
    pub(crate) heartbeat_interval_ms: i32,
    /// `group.share.max.size`.
    pub(crate) max_size: usize,
    /// Share groups this coordinator keeps (a Strand bound): empty groups are forgotten first,
    /// the longest empty first.
    pub(crate) max_groups: usize,
}

impl Default for ShareCoordinatorConfig {
    fn default() -> Self {
        ShareCoordinatorConfig {
            session_timeout_ms: 45_000,
            heartbeat_interval_ms: 5_000,
            max_size: 200,
            max_groups: 10_000,
        }
    }
}

/// The topics as the coordinator needs them: a snapshot of the shard's metadata replica.
pub(crate) trait ShareTopics {
    /// Changes whenever topics change (the metadata version).
    fn version(&self) -> u64;
    /// The id and partition count of a topic.
    fn topic_by_name(&self, name: &str) -> Option<(TopicId, i32)>;
    /// The name of a topic.
    fn topic_name(&self, id: TopicId) -> Option<String>;
    /// The group's override of an integer group config (`share.session.timeout.ms`, ...), as
    /// stored; `None` without one.
    fn group_config_int(&self, _group: &str, _key: &str) -> Option<i32> {
        None
    }
}

impl ShareTopics for crate::metadata::ClusterMetadata {
    fn version(&self) -> u64 {
        self.version
    }

    fn topic_by_name(&self, name: &str) -> Option<(TopicId, i32)> {
        self.topic(name).map(|t| (t.id, t.partitions))
    }

    fn topic_name(&self, id: TopicId) -> Option<String> {
        self.topic_by_id(id).map(|t| t.name.clone())
    }

    fn group_config_int(&self, group: &str, key: &str) -> Option<i32> {
        self.group_config(group).and_then(|g| g.int(key))
    }
}

/// About a request beyond its body.
#[derive(Debug, Clone, Default)]
pub(crate) struct ShareMeta {
    pub(crate) client_id: String,
    /// As Kafka shows it: `/` followed by the peer address.
    pub(crate) client_host: String,
}

/// Whether a group of another type (classic or consumer, in `crate::group`) has the id of a
/// share group being created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OtherGroup {
    /// Not checked, or no such group.
    None,
    /// A classic or consumer group has this id.
    Exists,
    /// The group coordinator could not tell (loading, failed): this error is answered.
    Unknown(ResponseError),
}

/// What the coordinator asks the caller to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Action {
    /// A member left, or was removed when its session expired: its acquired records are to be
    /// released ([`crate::queue::doors::kafka_share::group::events::member_gone`]).
    MemberGone { group: String, member: String },
    /// Call `tick` no later than this.
    WakeAt(i64),
}

/// A member in good standing, as ShareFetch/ShareAcknowledge check it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MemberInfo {
    pub(crate) member_epoch: i32,
    /// The partitions the member was last told it is assigned, in (topic id, partition) order.
    pub(crate) assigned: Vec<(TopicId, i32)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ShareMember {
    pub(crate) member_id: String,
    pub(crate) rack_id: Option<String>,
    pub(crate) client_id: String,
    pub(crate) client_host: String,
    /// Sorted, without duplicates.
    pub(crate) subscribed_topic_names: Vec<String>,
    pub(crate) member_epoch: i32,
    pub(crate) previous_member_epoch: i32,
    /// What the member was last told.
    pub(crate) assigned: Assignment,
}

impl ShareMember {
    fn new(member_id: String) -> Self {
        ShareMember {
            member_id,
            rack_id: None,
            client_id: String::new(),
            client_host: String::new(),
            subscribed_topic_names: Vec::new(),
            member_epoch: 0,
            previous_member_epoch: -1,
            assigned: Assignment::new(),
        }
    }
}

#[derive(Debug, Clone, Default)]
pub(crate) struct ShareGroup {
    pub(crate) group_epoch: i32,
    pub(crate) assignment_epoch: i32,
    pub(crate) members: BTreeMap<String, ShareMember>,
    /// The target assignment at `assignment_epoch`.
    pub(crate) target: BTreeMap<String, Assignment>,
    /// The subscribed topics that exist: name → (id, partition count), as last read.
    pub(crate) subscribed: BTreeMap<String, (TopicId, i32)>,
    /// The metadata version `subscribed` was read at; `None`: read again at the next heartbeat.
    metadata_version: Option<u64>,
    /// When the group last became empty (for forgetting empty groups first).
    empty_since_ms: Option<i64>,
}

impl ShareGroup {
    /// Kafka's share group states: Empty or Stable (a share group has no rebalance phases).
    pub(crate) fn state_name(&self) -> &'static str {
        if self.members.is_empty() {
            "Empty"
        } else {
            "Stable"
        }
    }

    fn bump_epoch(&mut self) {
        self.group_epoch = self.group_epoch.saturating_add(1);
    }

    /// Re-reads the subscribed topics if the metadata changed since the last read (or a
    /// subscription changed); true if they differ from before.
    fn refresh_metadata(&mut self, topics: &dyn ShareTopics, force: bool) -> bool {
        let version = topics.version();
        if !force && self.metadata_version == Some(version) {
            return false;
        }
        self.metadata_version = Some(version);
        let names: BTreeSet<&String> = self
            .members
            .values()
            .flat_map(|m| m.subscribed_topic_names.iter())
            .collect();
        let subscribed: BTreeMap<String, (TopicId, i32)> = names
            .into_iter()
            .filter_map(|n| topics.topic_by_name(n).map(|v| (n.clone(), v)))
            .collect();
        let changed = subscribed != self.subscribed;
        self.subscribed = subscribed;
        changed
    }

    /// Computes the target assignment at the group epoch.
    fn compute_target(&mut self) {
        let partitions: BTreeMap<TopicId, i32> = self.subscribed.values().copied().collect();
        let specs: Vec<AssignMember<'_>> = self
            .members
            .values()
            .map(|m| AssignMember {
                id: &m.member_id,
                topics: m
                    .subscribed_topic_names
                    .iter()
                    .filter_map(|n| self.subscribed.get(n).map(|(id, _)| *id))
                    .collect(),
                previous: self.target.get(&m.member_id),
            })
            .collect();
        self.target = assignor::assign(&specs, &partitions);
        self.assignment_epoch = self.group_epoch;
    }
}

/// Session deadlines, keyed so that rescheduling replaces the previous deadline.
#[derive(Default)]
struct Sessions {
    deadlines: HashMap<(String, String), i64>,
    queue: BTreeSet<(i64, String, String)>,
}

impl Sessions {
    fn schedule(&mut self, group: &str, member: &str, deadline: i64) {
        let key = (group.to_string(), member.to_string());
        if let Some(old) = self.deadlines.insert(key.clone(), deadline) {
            self.queue.remove(&(old, key.0.clone(), key.1.clone()));
        }
        self.queue.insert((deadline, key.0, key.1));
    }

    fn cancel(&mut self, group: &str, member: &str) {
        if let Some(old) = self.deadlines.remove(&(group.to_string(), member.to_string())) {
            self.queue.remove(&(old, group.to_string(), member.to_string()));
        }
    }

    fn pop_due(&mut self, now: i64) -> Option<(String, String)> {
        let first = self.queue.first()?.clone();
        if first.0 > now {
            return None;
        }
        self.queue.remove(&first);
        self.deadlines.remove(&(first.1.clone(), first.2.clone()));
        Some((first.1, first.2))
    }

    fn next_deadline(&self) -> Option<i64> {
        self.queue.first().map(|(d, _, _)| *d)
    }
}

fn sb(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_owned())
}

/// Java's `String.trim().isEmpty()`.
fn blank(s: &str) -> bool {
    s.trim().is_empty()
}

fn error_response(code: ResponseError, message: String) -> ShareGroupHeartbeatResponse {
    ShareGroupHeartbeatResponse::default()
        .with_error_code(code.code())
        .with_error_message(Some(sb(&message)))
}

/// Kafka's `throwIfShareGroupHeartbeatRequestIsInvalid`, plus Strand's bounds.
fn validate_request(req: &ShareGroupHeartbeatRequest) -> Result<(), (ResponseError, String)> {
    let invalid = |m: &str| Err((ResponseError::InvalidRequest, m.to_string()));
    if blank(&req.member_id) {
        return invalid("MemberId can't be empty.");
    }
    if blank(&req.group_id) {
        return invalid("GroupId can't be empty.");
    }
    if req.rack_id.as_deref().is_some_and(blank) {
        return invalid("RackId can't be empty.");
    }
    if req.member_epoch == 0 {
        if req.subscribed_topic_names.as_ref().is_none_or(Vec::is_empty) {
            return invalid("SubscribedTopicNames must be set in first request.");
        }
    } else if req.member_epoch < LEAVE_GROUP_EPOCH {
        return invalid("MemberEpoch is invalid.");
    }
    if req.member_id.len() > MAX_MEMBER_ID_LEN {
        return invalid("MemberId can't be longer than 255 characters.");
    }
    if req
        .subscribed_topic_names
        .as_ref()
        .is_some_and(|t| t.len() > MAX_SUBSCRIBED_TOPICS)
    {
        return invalid("SubscribedTopicNames has more than 10000 topics.");
    }
    Ok(())
}

/// Kafka's `throwIfShareGroupMemberEpochIsInvalid`, accepting epoch 0 (a rejoin).
fn validate_epoch(m: &ShareMember, received: i32) -> Result<(), (ResponseError, String)> {
    if received == 0 {
        return Ok(());
    }
    if received > m.member_epoch {
        return Err((
            ResponseError::FencedMemberEpoch,
            format!(
                "The share group member has a greater member epoch ({received}) than the one known by \
                 the group coordinator ({}). The member must abandon all its partitions and rejoin.",
                m.member_epoch
            ),
        ));
    }
    if received < m.member_epoch && received != m.previous_member_epoch {
        return Err((
            ResponseError::FencedMemberEpoch,
            format!(
                "The share group member has a smaller member epoch ({received}) than the one known by \
                 the group coordinator ({}), and it does not match the previous member epoch ({}). The \
                 member must abandon all its partitions and rejoin.",
                m.member_epoch, m.previous_member_epoch
            ),
        ));
    }
    Ok(())
}

fn response_assignment(a: &Assignment) -> RespAssignment {
    RespAssignment::default().with_topic_partitions(
        a.iter()
            .map(|(t, ps)| {
                RespTopicPartitions::default()
                    .with_topic_id(t.0)
                    .with_partitions(ps.iter().copied().collect())
            })
            .collect(),
    )
}

/// The share group coordinator of one shard.
pub(crate) struct ShareCoordinator {
    pub(crate) config: ShareCoordinatorConfig,
    pub(crate) groups: BTreeMap<String, ShareGroup>,
    sessions: Sessions,
    out: Vec<Action>,
}

impl ShareCoordinator {
    pub(crate) fn new(config: ShareCoordinatorConfig) -> Self {
        ShareCoordinator {
            config,
            groups: BTreeMap::new(),
            sessions: Sessions::default(),
            out: Vec::new(),
        }
    }

    /// Whether a share group with this id exists here.
    pub(crate) fn is_share_group(&self, group: &str) -> bool {
        self.groups.contains_key(group)
    }

    /// DeleteGroups of a share group: forgets it, if it has no members. `Err`:
    /// GROUP_ID_NOT_FOUND (no share group of that id here) or NON_EMPTY_GROUP. Its share state
    /// (the queue engines) is the caller's to delete.
    pub(crate) fn delete(&mut self, group: &str) -> Result<(), ResponseError> {
        match self.groups.get(group) {
            None => Err(ResponseError::GroupIdNotFound),
            Some(g) if !g.members.is_empty() => Err(ResponseError::NonEmptyGroup),
            Some(_) => {
                self.groups.remove(group);
                Ok(())
            }
        }
    }

    /// Whether answering `req` needs to know first if a classic or consumer group has its group
    /// id: a valid join that would create the share group.
    pub(crate) fn needs_other_group_check(&self, req: &ShareGroupHeartbeatRequest) -> bool {
        req.member_epoch == 0
            && validate_request(req).is_ok()
            && !self.groups.contains_key(req.group_id.as_str())
    }

    /// Handles a ShareGroupHeartbeat (v1). `other` says whether a classic or consumer group has
    /// the group id ([`OtherGroup::None`] if not checked; see
    /// [`ShareCoordinator::needs_other_group_check`]).
    pub(crate) fn heartbeat(
        &mut self,
        now_ms: i64,
        meta: &ShareMeta,
        req: &ShareGroupHeartbeatRequest,
        topics: &dyn ShareTopics,
        other: OtherGroup,
    ) -> (ShareGroupHeartbeatResponse, Vec<Action>) {
        let result = validate_request(req).and_then(|()| {
            if req.member_epoch == LEAVE_GROUP_EPOCH {
                self.leave(now_ms, req)
            } else {
                self.join_or_heartbeat(now_ms, meta, req, topics, other)
            }
        });
        let resp = match result {
            Ok(r) => r,
            Err((e, m)) => error_response(e, m),
        };
        (resp, self.finish())
    }

    fn leave(
        &mut self,
        now_ms: i64,
        req: &ShareGroupHeartbeatRequest,
    ) -> Result<ShareGroupHeartbeatResponse, (ResponseError, String)> {
        let group_id = req.group_id.as_str();
        let member_id = req.member_id.as_str();
        let Some(g) = self.groups.get(group_id) else {
            return Err((
                ResponseError::GroupIdNotFound,
                format!("Group {group_id} not found."),
            ));
        };
        if !g.members.contains_key(member_id) {
            return Err((
                ResponseError::UnknownMemberId,
                format!("Member {member_id} is not a member of group {group_id}."),
            ));
        }
        self.remove_member(now_ms, group_id, member_id);
        Ok(ShareGroupHeartbeatResponse::default()
            .with_member_id(Some(sb(member_id)))
            .with_member_epoch(LEAVE_GROUP_EPOCH))
    }

    /// Removes a member (left, or its session expired): the group epoch goes up so that the
    /// others take over its partitions, and its records are to be released.
    fn remove_member(&mut self, now_ms: i64, group_id: &str, member_id: &str) {
        let Some(g) = self.groups.get_mut(group_id) else {
            return;
        };
        if g.members.remove(member_id).is_none() {
            return;
        }
        g.target.remove(member_id);
        g.bump_epoch();
        // The subscribed topics may have shrunk: read them again at the next heartbeat.
        g.metadata_version = None;
        if g.members.is_empty() {
            g.assignment_epoch = g.group_epoch;
            g.target.clear();
            g.subscribed.clear();
            g.empty_since_ms = Some(now_ms);
        }
        self.sessions.cancel(group_id, member_id);
        self.out.push(Action::MemberGone {
            group: group_id.to_string(),
            member: member_id.to_string(),
        });
    }

    /// Makes room for one more group: forgets the longest-empty group if at the bound.
    fn make_room(&mut self) -> bool {
        if self.groups.len() < self.config.max_groups {
            return true;
        }
        let victim = self
            .groups
            .iter()
            .filter(|(_, g)| g.members.is_empty())
            .min_by_key(|(id, g)| (g.empty_since_ms.unwrap_or(i64::MIN), (*id).clone()))
            .map(|(id, _)| id.clone());
        match victim {
            Some(id) => {
                self.groups.remove(&id);
                true
            }
            None => false,
        }
    }

    fn join_or_heartbeat(
        &mut self,
        now_ms: i64,
        meta: &ShareMeta,
        req: &ShareGroupHeartbeatRequest,
        topics: &dyn ShareTopics,
        other: OtherGroup,
    ) -> Result<ShareGroupHeartbeatResponse, (ResponseError, String)> {
        let group_id = req.group_id.as_str();
        let member_id = req.member_id.as_str();
        let joining = req.member_epoch == 0;
        if !self.groups.contains_key(group_id) {
            if !joining {
                // Kafka answers GROUP_ID_NOT_FOUND, which clients treat as fatal; Strand keeps
                // share groups in memory, so after a restart the member must be able to rejoin.
                return Err((
                    ResponseError::UnknownMemberId,
                    format!("Member {member_id} is not a member of group {group_id}."),
                ));
            }
            match other {
                OtherGroup::Exists => {
                    return Err((
                        ResponseError::GroupIdNotFound,
                        format!("Group {group_id} is not a share group."),
                    ))
                }
                OtherGroup::Unknown(e) => {
                    return Err((e, format!("The coordinator cannot serve group {group_id} now.")))
                }
                OtherGroup::None => {}
            }
            if !self.make_room() {
                return Err((
                    ResponseError::GroupMaxSizeReached,
                    format!(
                        "The coordinator has reached its maximum of {} share groups.",
                        self.config.max_groups
                    ),
                ));
            }
            self.groups.insert(group_id.to_string(), ShareGroup::default());
        }
        let max_size = self.config.max_size;
        // The group's configs, else the broker's (Kafka's `shareGroupSessionTimeoutMs(groupId)`).
        let session_ms = i64::from(
            topics
                .group_config_int(group_id, SHARE_SESSION_TIMEOUT_MS)
                .unwrap_or(self.config.session_timeout_ms),
        );
        let interval = topics
            .group_config_int(group_id, SHARE_HEARTBEAT_INTERVAL_MS)
            .unwrap_or(self.config.heartbeat_interval_ms);
        let Some(g) = self.groups.get_mut(group_id) else {
            return Err((ResponseError::UnknownServerError, "group vanished".into()));
        };
        let before = match g.members.get(member_id) {
            Some(m) => {
                validate_epoch(m, req.member_epoch)?;
                Some(m.clone())
            }
            None if !joining => {
                return Err((
                    ResponseError::UnknownMemberId,
                    format!("Member {member_id} is not a member of group {group_id}."),
                ))
            }
            None => {
                if g.members.len() >= max_size {
                    if g.members.is_empty() {
                        // Just created (only with a max size of 0, which the config refuses).
                        self.groups.remove(group_id);
                    }
                    return Err((
                        ResponseError::GroupMaxSizeReached,
                        format!("The share group has reached its maximum capacity of {max_size} members."),
                    ));
                }
                None
            }
        };
        let mut member = before
            .clone()
            .unwrap_or_else(|| ShareMember::new(member_id.to_string()));
        if let Some(r) = &req.rack_id {
            member.rack_id = Some(r.to_string());
        }
        if let Some(names) = &req.subscribed_topic_names {
            let mut v: Vec<String> = names.iter().map(|n| n.to_string()).collect();
            v.sort_unstable();
            v.dedup();
            member.subscribed_topic_names = v;
        }
        member.client_id = meta.client_id.clone();
        member.client_host = meta.client_host.clone();
        let subscription_changed = before
            .as_ref()
            .is_none_or(|b| b.subscribed_topic_names != member.subscribed_topic_names);
        g.members.insert(member_id.to_string(), member);
        g.empty_since_ms = None;

        // 1. The group epoch goes up when a subscription or the subscribed topics change.
        let metadata_changed = g.refresh_metadata(topics, subscription_changed);
        if subscription_changed || metadata_changed {
            g.bump_epoch();
        }
        // 2. A new target assignment for a new group epoch.
        if g.group_epoch > g.assignment_epoch {
            g.compute_target();
        }
        // 3. The member moves to the target at once: a share group revokes nothing, since a
        // partition may be shared.
        let Some(m) = g.members.get_mut(member_id) else {
            return Err((ResponseError::UnknownServerError, "member vanished".into()));
        };
        let previous_assignment = m.assigned.clone();
        if m.member_epoch != g.assignment_epoch {
            m.previous_member_epoch = m.member_epoch;
            m.member_epoch = g.assignment_epoch;
            m.assigned = g.target.get(member_id).cloned().unwrap_or_default();
        }
        let full_request = req.subscribed_topic_names.is_some();
        let include = joining || full_request || m.assigned != previous_assignment;
        let resp = ShareGroupHeartbeatResponse::default()
            .with_member_id(Some(sb(member_id)))
            .with_member_epoch(m.member_epoch)
            .with_heartbeat_interval_ms(interval)
            .with_assignment(include.then(|| response_assignment(&m.assigned)));
        self.sessions.schedule(group_id, member_id, now_ms + session_ms);
        Ok(resp)
    }

    /// Runs the session timeouts due at `now_ms`.
    pub(crate) fn tick(&mut self, now_ms: i64) -> Vec<Action> {
        // A bound guards against a deadline rescheduled at `now` forever (none is).
        for _ in 0..1_000_000 {
            let Some((group, member)) = self.sessions.pop_due(now_ms) else {
                break;
            };
            self.remove_member(now_ms, &group, &member);
        }
        self.finish()
    }

    /// The earliest time `tick` must be called, if any.
    pub(crate) fn next_wake(&self) -> Option<i64> {
        self.sessions.next_deadline()
    }

    /// ShareFetch / ShareAcknowledge: is `member` a member of share group `group`?
    pub(crate) fn check_member(&self, group: &str, member: &str) -> Result<MemberInfo, ResponseError> {
        let g = self.groups.get(group).ok_or(ResponseError::GroupIdNotFound)?;
        let m = g.members.get(member).ok_or(ResponseError::UnknownMemberId)?;
        Ok(MemberInfo {
            member_epoch: m.member_epoch,
            assigned: m
                .assigned
                .iter()
                .flat_map(|(t, ps)| ps.iter().map(move |p| (*t, *p)))
                .collect(),
        })
    }

    /// ShareGroupDescribe (v1) of the groups named, in order.
    pub(crate) fn describe(
        &self,
        group_ids: &[String],
        include_authorized_operations: bool,
        topics: &dyn ShareTopics,
    ) -> Vec<DescribedGroup> {
        let ops = strand_protocol::acl::authorized(
            include_authorized_operations,
            strand_protocol::acl::GROUP_OPERATIONS,
        );
        let describe = |a: &Assignment| {
            DescAssignment::default().with_topic_partitions(
                a.iter()
                    .filter_map(|(t, ps)| {
                        let name = topics.topic_name(*t)?;
                        Some(
                            DescTopicPartitions::default()
                                .with_topic_id(t.0)
                                .with_topic_name(TopicName(sb(&name)))
                                .with_partitions(ps.iter().copied().collect()),
                        )
                    })
                    .collect(),
            )
        };
        group_ids
            .iter()
            .map(|id| {
                let d = DescribedGroup::default()
                    .with_group_id(GroupId(sb(id)))
                    .with_authorized_operations(ops);
                match self.groups.get(id) {
                    None => d
                        .with_error_code(ResponseError::GroupIdNotFound.code())
                        .with_error_message(Some(sb(&format!("Group {id} not found.")))),
                    Some(g) => d
                        .with_group_state(sb(g.state_name()))
                        .with_group_epoch(g.group_epoch)
                        .with_assignment_epoch(g.assignment_epoch)
                        .with_assignor_name(sb(assignor::NAME))
                        .with_members(
                            g.members
                                .values()
                                .map(|m| {
                                    Member::default()
                                        .with_member_id(sb(&m.member_id))
                                        .with_rack_id(m.rack_id.as_deref().map(sb))
                                        .with_member_epoch(m.member_epoch)
                                        .with_client_id(sb(&m.client_id))
                                        .with_client_host(sb(&m.client_host))
                                        .with_subscribed_topic_names(
                                            m.subscribed_topic_names
                                                .iter()
                                                .map(|n| TopicName(sb(n)))
                                                .collect(),
                                        )
                                        .with_assignment(describe(&m.assigned))
                                })
                                .collect(),
                        ),
                }
            })
            .collect()
    }

    /// The share groups for ListGroups, with its state and type filters (lower-cased; empty:
    /// no filter). `version` shapes the entries (state from v4, type from v5).
    pub(crate) fn list(&self, states: &[String], types: &[String], version: i16) -> Vec<ListedGroup> {
        let states: BTreeSet<String> = states.iter().map(|s| s.to_lowercase()).collect();
        let types: BTreeSet<String> = types.iter().map(|s| s.to_lowercase()).collect();
        if !types.is_empty() && !types.contains(SHARE) {
            return Vec::new();
        }
        self.groups
            .iter()
            .filter(|(_, g)| states.is_empty() || states.contains(&g.state_name().to_lowercase()))
            .map(|(id, g)| {
                ListedGroup::default()
                    .with_group_id(GroupId(sb(id)))
                    .with_protocol_type(sb(SHARE))
                    .with_group_state(if version >= 4 {
                        sb(g.state_name())
                    } else {
                        StrBytes::default()
                    })
                    .with_group_type(if version >= 5 {
                        sb(SHARE)
                    } else {
                        StrBytes::default()
                    })
            })
            .collect()
    }

    fn finish(&mut self) -> Vec<Action> {
        let mut out = std::mem::take(&mut self.out);
        if let Some(t) = self.sessions.next_deadline() {
            out.push(Action::WakeAt(t));
        }
        out
    }
}
