//! KIP-848 consumer groups: ConsumerGroupHeartbeat with member epochs, server-side assignment and
//! Kafka's reconciliation (`CurrentAssignmentBuilder`): a member first revokes what it must give
//! up (staying at its epoch, UNREVOKED_PARTITIONS), then moves to the target epoch and gets the
//! partitions that are free; a partition still owned by another member (assigned or pending
//! revocation) is handed out only after that owner's heartbeat shows it released it
//! (UNRELEASED_PARTITIONS until then). So no partition is ever assigned to two members at once.
//!
//! Metadata: a group re-reads the topics it subscribes to (and what its regular expressions
//! match) when a subscription changes and at most every `consumer_metadata_refresh_ms` on a
//! heartbeat; a change bumps the group epoch. After a restart the first read is taken as it is
//! (Kafka compares a stored metadata hash; Strand does not store it), so a partition count that
//! changed while the broker was down is noticed at the next subscription change.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use kafka_protocol::messages::consumer_group_heartbeat_request::TopicPartitions as ReqTopicPartitions;
use kafka_protocol::messages::consumer_group_heartbeat_response::{
    Assignment as RespAssignment, TopicPartitions,
};
use kafka_protocol::messages::{ConsumerGroupHeartbeatRequest, ConsumerGroupHeartbeatResponse};
use kafka_protocol::ResponseError;
use strand_protocol::types::TopicId;

use super::assignor::{self, AssignMember, ASSIGNORS};
use super::records::{
    self, decode_epoch_value, decode_target_member, encode_epoch_value, encode_target_member, Assignment,
    ConsumerMemberValue, CurrentAssignmentValue, RecordKey,
};
use super::regex::Regex;
use super::timers::TimerKey;
use super::{
    sb, GroupCoordinator, GroupEntry, GroupKind, GroupResponse, Record, RequestMeta, RequestToken,
    TopicMetadata,
};
use crate::config::{CONSUMER_HEARTBEAT_INTERVAL_MS, CONSUMER_SESSION_TIMEOUT_MS};

pub(crate) const LEAVE_GROUP_EPOCH: i32 = -1;
pub(crate) const STATIC_LEAVE_EPOCH: i32 = -2;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MemberState {
    Stable,
    UnrevokedPartitions,
    UnreleasedPartitions,
}

impl MemberState {
    fn code(self) -> i8 {
        match self {
            MemberState::Stable => 0,
            MemberState::UnrevokedPartitions => 1,
            MemberState::UnreleasedPartitions => 2,
        }
    }
    fn from_code(c: i8) -> MemberState {
        match c {
            1 => MemberState::UnrevokedPartitions,
            2 => MemberState::UnreleasedPartitions,
            _ => MemberState::Stable,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ConsumerMember {
    pub(crate) member_id: String,
    pub(crate) instance_id: Option<String>,
    pub(crate) rack_id: Option<String>,
    pub(crate) client_id: String,
    pub(crate) client_host: String,
    pub(crate) subscribed_topic_names: Vec<String>,
    pub(crate) subscribed_topic_regex: Option<String>,
    pub(crate) rebalance_timeout_ms: i32,
    pub(crate) server_assignor: Option<String>,
    pub(crate) member_epoch: i32,
    pub(crate) previous_member_epoch: i32,
    pub(crate) state: MemberState,
    pub(crate) assigned: Assignment,
    pub(crate) pending_revocation: Assignment,
}

impl ConsumerMember {
    fn new(member_id: String) -> Self {
        ConsumerMember {
            member_id,
            instance_id: None,
            rack_id: None,
            client_id: String::new(),
            client_host: String::new(),
            subscribed_topic_names: Vec::new(),
            subscribed_topic_regex: None,
            rebalance_timeout_ms: -1,
            server_assignor: None,
            member_epoch: 0,
            previous_member_epoch: -1,
            state: MemberState::Stable,
            assigned: Assignment::new(),
            pending_revocation: Assignment::new(),
        }
    }

    fn metadata_value(&self) -> ConsumerMemberValue {
        ConsumerMemberValue {
            instance_id: self.instance_id.clone(),
            rack_id: self.rack_id.clone(),
            client_id: self.client_id.clone(),
            client_host: self.client_host.clone(),
            subscribed_topic_names: self.subscribed_topic_names.clone(),
            subscribed_topic_regex: self.subscribed_topic_regex.clone(),
            rebalance_timeout_ms: self.rebalance_timeout_ms,
            server_assignor: self.server_assignor.clone(),
        }
    }

    fn assignment_value(&self) -> CurrentAssignmentValue {
        CurrentAssignmentValue {
            member_epoch: self.member_epoch,
            previous_member_epoch: self.previous_member_epoch,
            state: self.state.code(),
            assigned: self.assigned.clone(),
            pending_revocation: self.pending_revocation.clone(),
        }
    }

    fn update_epoch(&mut self, epoch: i32) {
        self.previous_member_epoch = self.member_epoch;
        self.member_epoch = epoch;
    }

    /// Every partition this member holds: assigned and pending revocation.
    pub(crate) fn owned_partitions(&self) -> impl Iterator<Item = (TopicId, i32)> + '_ {
        self.assigned
            .iter()
            .chain(self.pending_revocation.iter())
            .flat_map(|(t, ps)| ps.iter().map(move |p| (*t, *p)))
    }
}

#[derive(Debug, Clone, Default)]
pub(crate) struct ConsumerGroup {
    pub(crate) group_epoch: i32,
    pub(crate) assignment_epoch: i32,
    pub(crate) members: BTreeMap<String, ConsumerMember>,
    pub(crate) target: BTreeMap<String, Assignment>,
    /// Who holds each partition (assigned or pending revocation). Never two members.
    pub(crate) owners: HashMap<(TopicId, i32), String>,
    /// Subscribed topics as last read: name → (id, partition count). `None` until read.
    pub(crate) subscribed: Option<BTreeMap<String, (TopicId, i32)>>,
    /// Regular expression → topic names it matched at the last read.
    pub(crate) resolved_regex: BTreeMap<String, BTreeSet<String>>,
    pub(crate) metadata_refresh_at: i64,
    static_members: HashMap<String, String>,
}

impl ConsumerGroup {
    /// Kafka's consumer group states.
    pub(crate) fn state_name(&self) -> &'static str {
        if self.members.is_empty() {
            "Empty"
        } else if self.group_epoch > self.assignment_epoch {
            "Assigning"
        } else if self
            .members
            .values()
            .any(|m| m.member_epoch != self.assignment_epoch || m.state != MemberState::Stable)
        {
            "Reconciling"
        } else {
            "Stable"
        }
    }

    /// The assignor the members prefer (most votes; default `uniform`).
    pub(crate) fn assignor(&self) -> &'static str {
        let mut votes: BTreeMap<&'static str, usize> = BTreeMap::new();
        for m in self.members.values() {
            if let Some(a) = m.server_assignor.as_deref() {
                if let Some(name) = ASSIGNORS.iter().find(|n| **n == a) {
                    *votes.entry(name).or_default() += 1;
                }
            }
        }
        votes
            .into_iter()
            .max_by(|a, b| a.1.cmp(&b.1).then_with(|| b.0.cmp(a.0)))
            .map(|(n, _)| n)
            .unwrap_or(ASSIGNORS[0])
    }

    /// Topic names a member subscribes to (names and regex matches as last resolved).
    pub(crate) fn member_topic_names(&self, m: &ConsumerMember) -> BTreeSet<String> {
        let mut out: BTreeSet<String> = m.subscribed_topic_names.iter().cloned().collect();
        if let Some(r) = &m.subscribed_topic_regex {
            if let Some(names) = self.resolved_regex.get(r) {
                out.extend(names.iter().cloned());
            }
        }
        out
    }

    fn member_topic_ids(&self, m: &ConsumerMember) -> BTreeSet<TopicId> {
        let subscribed = self.subscribed.as_ref();
        self.member_topic_names(m)
            .iter()
            .filter_map(|n| subscribed.and_then(|s| s.get(n)).map(|(id, _)| *id))
            .collect()
    }

    /// Kafka's `ConsumerGroup.validateOffsetCommit`.
    pub(crate) fn validate_offset_commit(
        &self,
        member_id: &str,
        epoch: i32,
        version: i16,
    ) -> Result<(), ResponseError> {
        if epoch < 0 && self.members.is_empty() {
            return Ok(());
        }
        let m = self
            .members
            .get(member_id)
            .ok_or(ResponseError::UnknownMemberId)?;
        if version < 9 {
            return Err(ResponseError::UnsupportedVersion);
        }
        if epoch != m.member_epoch {
            return Err(ResponseError::StaleMemberEpoch);
        }
        Ok(())
    }

    /// Kafka's `ConsumerGroup.validateOffsetFetch` for a fetch that names a member.
    pub(crate) fn validate_offset_fetch(&self, member_id: &str, epoch: i32) -> Result<(), ResponseError> {
        let m = self
            .members
            .get(member_id)
            .ok_or(ResponseError::UnknownMemberId)?;
        if epoch != m.member_epoch {
            return Err(ResponseError::StaleMemberEpoch);
        }
        Ok(())
    }

    /// Sets a member, keeping `owners` in step. A conflict (a partition owned by another member)
    /// is a bug: the reconciliation never hands out an owned partition.
    fn put_member(&mut self, m: ConsumerMember) {
        if let Some(old) = self.members.get(&m.member_id) {
            let mine: Vec<(TopicId, i32)> = old.owned_partitions().collect();
            for tp in mine {
                if self.owners.get(&tp) == Some(&m.member_id) {
                    self.owners.remove(&tp);
                }
            }
        }
        for tp in m.owned_partitions() {
            let previous = self.owners.insert(tp, m.member_id.clone());
            debug_assert!(
                previous.as_ref().is_none_or(|p| *p == m.member_id),
                "partition {tp:?} given to {} while owned by {previous:?}",
                m.member_id
            );
        }
        if let Some(i) = &m.instance_id {
            self.static_members.insert(i.clone(), m.member_id.clone());
        }
        self.members.insert(m.member_id.clone(), m);
    }

    fn remove_member(&mut self, member_id: &str) -> Option<ConsumerMember> {
        let m = self.members.remove(member_id)?;
        for tp in m.owned_partitions() {
            if self.owners.get(&tp).map(String::as_str) == Some(member_id) {
                self.owners.remove(&tp);
            }
        }
        self.target.remove(member_id);
        if let Some(i) = &m.instance_id {
            if self.static_members.get(i).map(String::as_str) == Some(member_id) {
                self.static_members.remove(i);
            }
        }
        Some(m)
    }

    /// Re-reads the subscribed topics; true if they changed (and were known before).
    fn refresh_metadata(&mut self, topics: &dyn TopicMetadata) -> bool {
        let mut regexes: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        let mut names: BTreeSet<String> = BTreeSet::new();
        let distinct: BTreeSet<String> = self
            .members
            .values()
            .filter_map(|m| m.subscribed_topic_regex.clone())
            .collect();
        let all = if distinct.is_empty() {
            Vec::new()
        } else {
            topics.topic_names()
        };
        for r in distinct {
            let matched: BTreeSet<String> = match Regex::new(&r) {
                Ok(re) => all
                    .iter()
                    .filter(|t| !crate::internal_topics::is_internal(t) && re.is_full_match(t))
                    .cloned()
                    .collect(),
                Err(_) => BTreeSet::new(),
            };
            names.extend(matched.iter().cloned());
            regexes.insert(r, matched);
        }
        for m in self.members.values() {
            names.extend(m.subscribed_topic_names.iter().cloned());
        }
        let subscribed: BTreeMap<String, (TopicId, i32)> = names
            .into_iter()
            .filter_map(|n| topics.topic_by_name(&n).map(|v| (n, v)))
            .collect();
        // The first read after a load is taken as it is.
        let changed = self
            .subscribed
            .as_ref()
            .is_some_and(|old| *old != subscribed || self.resolved_regex != regexes);
        self.subscribed = Some(subscribed);
        self.resolved_regex = regexes;
        changed
    }

    /// Computes the target assignment of every member at the group epoch; returns the records.
    fn compute_target(&mut self, group_id: &str) -> Vec<Record> {
        let partitions: BTreeMap<TopicId, i32> = self
            .subscribed
            .iter()
            .flat_map(|s| s.values())
            .map(|(id, n)| (*id, *n))
            .collect();
        let specs: Vec<AssignMember<'_>> = self
            .members
            .values()
            .map(|m| AssignMember {
                id: &m.member_id,
                topics: self.member_topic_ids(m),
                previous: self.target.get(&m.member_id),
            })
            .collect();
        let new_target = assignor::assign(self.assignor(), &specs, &partitions);
        let mut out = Vec::new();
        for (id, a) in &new_target {
            if self.target.get(id) != Some(a) {
                out.push(records::put(
                    RecordKey::TargetMember {
                        group: group_id.to_string(),
                        member: id.clone(),
                    },
                    encode_target_member(a),
                ));
            }
        }
        tracing::debug!(
            group = group_id,
            group_epoch = self.group_epoch,
            members = self.members.len(),
            changed = out.len(),
            "consumer group: new target assignment"
        );
        self.target = new_target;
        self.assignment_epoch = self.group_epoch;
        out.push(records::put(
            RecordKey::TargetMetadata {
                group: group_id.to_string(),
            },
            encode_epoch_value(self.assignment_epoch),
        ));
        out
    }

    /// Kafka's `CurrentAssignmentBuilder.build`.
    fn reconcile(&self, m: &ConsumerMember, owned: Option<&Assignment>) -> ConsumerMember {
        let owns_any = |revoked: &Assignment| -> bool {
            match owned {
                None => true,
                Some(o) => o
                    .iter()
                    .any(|(t, ps)| revoked.get(t).is_some_and(|r| ps.iter().any(|p| r.contains(p)))),
            }
        };
        match m.state {
            MemberState::Stable if m.member_epoch == self.assignment_epoch => m.clone(),
            MemberState::UnrevokedPartitions if owns_any(&m.pending_revocation) => m.clone(),
            _ => self.compute_next(m, &owns_any),
        }
    }

    fn compute_next(&self, m: &ConsumerMember, owns_any: &dyn Fn(&Assignment) -> bool) -> ConsumerMember {
        let empty = Assignment::new();
        let target = self.target.get(&m.member_id).unwrap_or(&empty);
        let subscribed = self.member_topic_ids(m);
        let mut assigned = Assignment::new();
        let mut revoke = Assignment::new();
        let mut to_assign = Assignment::new();
        let mut unreleased = false;
        let topics: BTreeSet<TopicId> = target.keys().chain(m.assigned.keys()).copied().collect();
        let none = BTreeSet::new();
        for t in topics {
            let tgt = if subscribed.contains(&t) {
                target.get(&t).unwrap_or(&none)
            } else {
                &none
            };
            let cur = m.assigned.get(&t).unwrap_or(&none);
            let keep: BTreeSet<i32> = cur.intersection(tgt).copied().collect();
            let rev: BTreeSet<i32> = cur.difference(&keep).copied().collect();
            let mut add = BTreeSet::new();
            for &p in tgt.difference(&keep) {
                let mine_pending = m.pending_revocation.get(&t).is_some_and(|s| s.contains(&p));
                match self.owners.get(&(t, p)) {
                    Some(owner) if *owner != m.member_id && !mine_pending => unreleased = true,
                    _ => {
                        add.insert(p);
                    }
                }
            }
            if !keep.is_empty() {
                assigned.insert(t, keep);
            }
            if !rev.is_empty() {
                revoke.insert(t, rev);
            }
            if !add.is_empty() {
                to_assign.insert(t, add);
            }
        }
        let mut next = m.clone();
        if !revoke.is_empty() && owns_any(&revoke) {
            next.state = MemberState::UnrevokedPartitions;
            next.update_epoch(m.member_epoch);
            next.assigned = assigned;
            next.pending_revocation = revoke;
        } else {
            for (t, ps) in to_assign {
                assigned.entry(t).or_default().extend(ps);
            }
            next.state = if unreleased {
                MemberState::UnreleasedPartitions
            } else {
                MemberState::Stable
            };
            next.update_epoch(self.assignment_epoch);
            next.assigned = assigned;
            next.pending_revocation = Assignment::new();
        }
        next
    }
}

/// The tombstones removing a member's records.
pub(crate) fn member_tombstones(group_id: &str, member_id: &str) -> Vec<Record> {
    vec![
        records::tombstone(RecordKey::CurrentAssignment {
            group: group_id.to_string(),
            member: member_id.to_string(),
        }),
        records::tombstone(RecordKey::TargetMember {
            group: group_id.to_string(),
            member: member_id.to_string(),
        }),
        records::tombstone(RecordKey::ConsumerMember {
            group: group_id.to_string(),
            member: member_id.to_string(),
        }),
    ]
}

/// The tombstones removing an (empty) consumer group's own records.
pub(crate) fn group_tombstones(group_id: &str) -> Vec<Record> {
    vec![
        records::tombstone(RecordKey::TargetMetadata {
            group: group_id.to_string(),
        }),
        records::tombstone(RecordKey::ConsumerGroup {
            group: group_id.to_string(),
        }),
    ]
}

/// An assignment for debug lines: partitions per topic, the topic id shortened.
fn show(a: &Assignment) -> String {
    let mut out = String::new();
    for (t, ps) in a {
        let id = t.to_string();
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(&format!("{}:{ps:?}", id.get(..8).unwrap_or(&id)));
    }
    out
}

fn to_assignment(parts: &[ReqTopicPartitions]) -> Assignment {
    let mut a = Assignment::new();
    for tp in parts {
        let set: BTreeSet<i32> = tp.partitions.iter().copied().collect();
        if !set.is_empty() {
            a.entry(TopicId(tp.topic_id)).or_default().extend(set);
        }
    }
    a
}

fn is_subset(owned: Option<&Assignment>, assigned: &Assignment) -> bool {
    let Some(owned) = owned else { return true };
    owned
        .iter()
        .all(|(t, ps)| assigned.get(t).is_some_and(|a| ps.is_subset(a)))
}

/// Kafka's `throwIfConsumerGroupMemberEpochIsInvalid`, with KAFKA-19233 (epoch 0 rejoins).
fn validate_epoch(
    m: &ConsumerMember,
    received: i32,
    owned: Option<&Assignment>,
) -> Result<(), (ResponseError, String)> {
    if received == 0 {
        return Ok(());
    }
    if received > m.member_epoch {
        return Err((
            ResponseError::FencedMemberEpoch,
            format!(
                "The consumer group member has a greater member epoch ({received}) than the one known by the group coordinator ({}). The member must abandon all its partitions and rejoin.",
                m.member_epoch
            ),
        ));
    }
    if received < m.member_epoch && (received != m.previous_member_epoch || !is_subset(owned, &m.assigned)) {
        return Err((
            ResponseError::FencedMemberEpoch,
            format!(
                "The consumer group member has a smaller member epoch ({received}) than the one known by the group coordinator ({}). The member must abandon all its partitions and rejoin.",
                m.member_epoch
            ),
        ));
    }
    Ok(())
}

/// Request checks of Kafka's `throwIfConsumerGroupHeartbeatRequestIsInvalid`.
fn validate_request(
    req: &ConsumerGroupHeartbeatRequest,
    version: i16,
) -> Result<(), (ResponseError, String)> {
    let invalid = |m: &str| Err((ResponseError::InvalidRequest, m.to_string()));
    if req.group_id.is_empty() {
        return invalid("GroupId can't be empty.");
    }
    if req.instance_id.as_ref().is_some_and(|i| i.is_empty()) {
        return invalid("InstanceId can't be empty.");
    }
    if req.rack_id.as_ref().is_some_and(|r| r.is_empty()) {
        return invalid("RackId can't be empty.");
    }
    let epoch = req.member_epoch;
    if (version >= 1 || epoch > 0 || epoch == LEAVE_GROUP_EPOCH || epoch == STATIC_LEAVE_EPOCH)
        && req.member_id.is_empty()
    {
        return invalid("MemberId can't be empty.");
    }
    if req.member_id.len() > 255 {
        return invalid("MemberId can't be longer than 255 characters.");
    }
    if epoch == 0 {
        if req.rebalance_timeout_ms == -1 {
            return invalid("RebalanceTimeoutMs must be provided in first request.");
        }
        if req.topic_partitions.as_ref().is_none_or(|t| !t.is_empty()) {
            return invalid("TopicPartitions must be empty when (re-)joining.");
        }
        if req.subscribed_topic_names.is_none() && req.subscribed_topic_regex.is_none() {
            return invalid("SubscribedTopicNames or SubscribedTopicRegex must be set in first request.");
        }
    } else if epoch == STATIC_LEAVE_EPOCH {
        if req.instance_id.is_none() {
            return invalid("InstanceId can't be null.");
        }
    } else if epoch < STATIC_LEAVE_EPOCH {
        return invalid("MemberEpoch is invalid.");
    }
    if let Some(a) = &req.server_assignor {
        if !ASSIGNORS.contains(&a.as_str()) {
            return Err((
                ResponseError::UnsupportedAssignor,
                format!(
                    "ServerAssignor {a} is not supported. Supported assignors: {}.",
                    ASSIGNORS.join(", ")
                ),
            ));
        }
    }
    if let Some(r) = req.subscribed_topic_regex.as_ref().filter(|r| !r.is_empty()) {
        if let Err(e) = Regex::new(r) {
            return Err((
                ResponseError::InvalidRegularExpression,
                format!("SubscribedTopicRegex `{r}` is not a valid regular expression: {e}."),
            ));
        }
    }
    Ok(())
}

fn error_response(code: ResponseError, message: String) -> ConsumerGroupHeartbeatResponse {
    ConsumerGroupHeartbeatResponse::default()
        .with_error_code(code.code())
        .with_error_message(Some(sb(&message)))
}

/// How a regular heartbeat's member was found.
enum Resolved {
    Existing,
    New,
    /// A static member rejoining with a new member id takes over the member `previous`.
    Replaces(String),
}

impl GroupCoordinator {
    pub(crate) fn consumer_heartbeat(
        &mut self,
        now: i64,
        token: RequestToken,
        meta: &RequestMeta,
        req: ConsumerGroupHeartbeatRequest,
        topics: &dyn TopicMetadata,
    ) {
        let version = meta.version;
        if let Err((e, m)) = validate_request(&req, version) {
            return self.respond(
                token,
                version,
                GroupResponse::ConsumerGroupHeartbeat(error_response(e, m)),
                &[],
            );
        }
        let group_id = req.group_id.to_string();
        let partition = match self.check_group(&group_id) {
            Ok(p) => p,
            Err(e) => {
                let msg = format!("The coordinator cannot serve group {group_id} now.");
                return self.respond(
                    token,
                    version,
                    GroupResponse::ConsumerGroupHeartbeat(error_response(e, msg)),
                    &[],
                );
            }
        };
        let (records, result) =
            if req.member_epoch == LEAVE_GROUP_EPOCH || req.member_epoch == STATIC_LEAVE_EPOCH {
                self.consumer_leave(now, &group_id, &req)
            } else {
                self.consumer_join_or_heartbeat(now, partition, &group_id, &req, meta, topics)
            };
        self.write(partition, records);
        let resp = match result {
            Ok(r) => r,
            Err((e, m)) => error_response(e, m),
        };
        self.respond(
            token,
            version,
            GroupResponse::ConsumerGroupHeartbeat(resp),
            &[partition],
        );
    }

    fn consumer_leave(
        &mut self,
        now: i64,
        group_id: &str,
        req: &ConsumerGroupHeartbeatRequest,
    ) -> (
        Vec<Record>,
        Result<ConsumerGroupHeartbeatResponse, (ResponseError, String)>,
    ) {
        let member_id = req.member_id.to_string();
        let Some(GroupEntry {
            kind: GroupKind::Consumer(g),
            ..
        }) = self.groups.get_mut(group_id)
        else {
            return (
                Vec::new(),
                Err((
                    ResponseError::GroupIdNotFound,
                    format!("Group {group_id} not found."),
                )),
            );
        };
        let mut epoch = LEAVE_GROUP_EPOCH;
        match &req.instance_id {
            None => {
                if !g.members.contains_key(&member_id) {
                    return (
                        Vec::new(),
                        Err((
                            ResponseError::UnknownMemberId,
                            format!("Member::default().with_member_id(member_id) is not a member of group {group_id}."),
                        )),
                    );
                }
            }
            Some(instance) => {
                let instance = instance.to_string();
                match g.static_members.get(&instance) {
                    None => {
                        return (
                            Vec::new(),
                            Err((ResponseError::UnknownMemberId, format!("Instance id {instance} is unknown."))),
                        )
                    }
                    Some(id) if *id != member_id => {
                        return (
                            Vec::new(),
                            Err((
                                ResponseError::FencedInstanceId,
                                format!("Static member {member_id} with instance id {instance} was fenced by member {id}."),
                            )),
                        )
                    }
                    Some(_) => {}
                }
                if req.member_epoch == STATIC_LEAVE_EPOCH {
                    epoch = STATIC_LEAVE_EPOCH;
                }
            }
        }
        let records = if epoch == STATIC_LEAVE_EPOCH {
            // The static member leaves for a while: it keeps its partitions until its session
            // expires or a new instance with the same instance id takes its place.
            let mut m = g.members.get(&member_id).cloned();
            let mut out = Vec::new();
            if let Some(m) = m.as_mut() {
                m.update_epoch(STATIC_LEAVE_EPOCH);
                out.push(records::put(
                    RecordKey::CurrentAssignment {
                        group: group_id.to_string(),
                        member: member_id.clone(),
                    },
                    m.assignment_value().encode(),
                ));
            }
            if let Some(m) = m {
                g.put_member(m);
            }
            self.timers.cancel(&TimerKey::ConsumerRevocation {
                group: group_id.to_string(),
                member: member_id.clone(),
            });
            out
        } else {
            self.fence_member(now, group_id, &member_id, "left")
        };
        (
            records,
            Ok(ConsumerGroupHeartbeatResponse::default()
                .with_member_id(Some(sb(&member_id)))
                .with_member_epoch(epoch)),
        )
    }

    /// Removes a member (left, session expired, or did not revoke in time) and bumps the group
    /// epoch so the others get its partitions.
    fn fence_member(&mut self, _now: i64, group_id: &str, member_id: &str, reason: &str) -> Vec<Record> {
        let Some(GroupEntry {
            kind: GroupKind::Consumer(g),
            ..
        }) = self.groups.get_mut(group_id)
        else {
            return Vec::new();
        };
        let Some(removed) = g.remove_member(member_id) else {
            return Vec::new();
        };
        tracing::debug!(
            group = group_id,
            member = member_id,
            reason,
            epoch = removed.member_epoch,
            state = ?removed.state,
            assigned = show(&removed.assigned).as_str(),
            pending_revocation = show(&removed.pending_revocation).as_str(),
            group_epoch = g.group_epoch + 1,
            "consumer group: member removed"
        );
        let mut out = member_tombstones(group_id, member_id);
        g.group_epoch += 1;
        out.push(records::put(
            RecordKey::ConsumerGroup {
                group: group_id.to_string(),
            },
            encode_epoch_value(g.group_epoch),
        ));
        if g.members.is_empty() {
            g.assignment_epoch = g.group_epoch;
            out.push(records::put(
                RecordKey::TargetMetadata {
                    group: group_id.to_string(),
                },
                encode_epoch_value(g.assignment_epoch),
            ));
        }
        for key in [
            TimerKey::ConsumerSession {
                group: group_id.to_string(),
                member: member_id.to_string(),
            },
            TimerKey::ConsumerRevocation {
                group: group_id.to_string(),
                member: member_id.to_string(),
            },
        ] {
            self.timers.cancel(&key);
        }
        out
    }

    fn consumer_join_or_heartbeat(
        &mut self,
        now: i64,
        partition: i32,
        group_id: &str,
        req: &ConsumerGroupHeartbeatRequest,
        meta: &RequestMeta,
        topics: &dyn TopicMetadata,
    ) -> (
        Vec<Record>,
        Result<ConsumerGroupHeartbeatResponse, (ResponseError, String)>,
    ) {
        let joining = req.member_epoch == 0;
        let mut out = Vec::new();
        match self.groups.get(group_id).map(|g| &g.kind) {
            None => {
                if !joining {
                    let m = format!(
                        "Member {} is not a member of group {group_id}.",
                        req.member_id.as_str()
                    );
                    return (out, Err((ResponseError::UnknownMemberId, m)));
                }
                self.groups.insert(
                    group_id.to_string(),
                    GroupEntry {
                        partition,
                        offsets: BTreeMap::new(),
                        kind: GroupKind::Consumer(ConsumerGroup::default()),
                    },
                );
            }
            Some(GroupKind::Classic(cg)) => {
                if !joining || !cg.is_empty() || cg.has_pending_members() {
                    return (
                        out,
                        Err((
                            ResponseError::GroupIdNotFound,
                            format!("Group {group_id} is not a consumer group."),
                        )),
                    );
                }
                // An empty classic group becomes a consumer group (Kafka's upgrade of empty groups).
                out.push(records::tombstone(RecordKey::GroupMetadata {
                    group: group_id.to_string(),
                }));
                self.timers.cancel_group(group_id);
                if let Some(e) = self.groups.get_mut(group_id) {
                    e.kind = GroupKind::Consumer(ConsumerGroup::default());
                }
            }
            Some(GroupKind::Consumer(_)) => {}
        }
        let max_size = self.config.consumer_max_size;
        // The group's configs, else the broker's (Kafka's `consumerGroupSessionTimeoutMs(groupId)`).
        let session_ms = i64::from(
            topics
                .group_config_int(group_id, CONSUMER_SESSION_TIMEOUT_MS)
                .unwrap_or(self.config.consumer_session_timeout_ms),
        );
        let refresh_ms = self.config.consumer_metadata_refresh_ms;
        let interval = topics
            .group_config_int(group_id, CONSUMER_HEARTBEAT_INTERVAL_MS)
            .unwrap_or(self.config.consumer_heartbeat_interval_ms);
        let member_id = if req.member_id.is_empty() {
            self.ids.kafka_uuid()
        } else {
            req.member_id.to_string()
        };
        let GroupCoordinator { groups, timers, .. } = self;
        let Some(GroupEntry {
            kind: GroupKind::Consumer(g),
            ..
        }) = groups.get_mut(group_id)
        else {
            return (
                out,
                Err((ResponseError::UnknownServerError, "group vanished".into())),
            );
        };
        if g.members.len() >= max_size && !g.members.contains_key(&member_id) {
            return (
                out,
                Err((
                    ResponseError::GroupMaxSizeReached,
                    format!("The consumer group has reached its maximum capacity of {max_size} members."),
                )),
            );
        }
        let owned = req.topic_partitions.as_deref().map(to_assignment);
        // Find the member.
        let resolved = match &req.instance_id {
            None => match g.members.get(&member_id) {
                Some(m) => validate_epoch(m, req.member_epoch, owned.as_ref()).map(|()| Resolved::Existing),
                None if joining => Ok(Resolved::New),
                None => Err((
                    ResponseError::UnknownMemberId,
                    format!(
                        "Member::default().with_member_id(member_id) is not a member of group {group_id}."
                    ),
                )),
            },
            Some(instance) => {
                let instance = instance.as_str();
                let current = g.static_members.get(instance).cloned();
                if joining {
                    match current {
                        None if g.members.contains_key(&member_id) => Ok(Resolved::Existing),
                        None => Ok(Resolved::New),
                        Some(id) if id == member_id => Ok(Resolved::Existing),
                        Some(id) => {
                            if g.members
                                .get(&id)
                                .is_some_and(|m| m.member_epoch != STATIC_LEAVE_EPOCH)
                            {
                                Err((
                                    ResponseError::UnreleasedInstanceId,
                                    format!("Static member {member_id} with instance id {instance} cannot join the group because the instance id is owned by {id} member."),
                                ))
                            } else {
                                Ok(Resolved::Replaces(id))
                            }
                        }
                    }
                } else {
                    match current {
                        None => Err((ResponseError::UnknownMemberId, format!("Instance id {instance} is unknown."))),
                        Some(id) if id != member_id => Err((
                            ResponseError::FencedInstanceId,
                            format!("Static member {member_id} with instance id {instance} was fenced by member {id}."),
                        )),
                        Some(id) => match g.members.get(&id) {
                            Some(m) => validate_epoch(m, req.member_epoch, owned.as_ref()).map(|()| Resolved::Existing),
                            None => Err((ResponseError::UnknownMemberId, format!("Instance id {instance} is unknown."))),
                        },
                    }
                }
            }
        };
        let resolved = match resolved {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(
                    group = group_id,
                    member = member_id.as_str(),
                    req_epoch = req.member_epoch,
                    owned = owned.as_ref().map(show).as_deref().unwrap_or("-"),
                    known_epoch = g.members.get(&member_id).map_or(-1, |m| m.member_epoch),
                    error = ?e.0,
                    "consumer group: heartbeat refused"
                );
                return (out, Err(e));
            }
        };
        let (before, is_new) = match &resolved {
            Resolved::Existing => (g.members.get(&member_id).cloned(), false),
            Resolved::New => (None, true),
            Resolved::Replaces(previous) => {
                let prev = g.members.get(previous).cloned();
                let prev_target = g.target.get(previous).cloned();
                // The new member takes over the previous one's partitions and target.
                let _ = g.remove_member(previous);
                out.extend(member_tombstones(group_id, previous));
                for key in [
                    TimerKey::ConsumerSession {
                        group: group_id.to_string(),
                        member: previous.clone(),
                    },
                    TimerKey::ConsumerRevocation {
                        group: group_id.to_string(),
                        member: previous.clone(),
                    },
                ] {
                    timers.cancel(&key);
                }
                let inherited = prev.map(|mut p| {
                    p.member_id = member_id.clone();
                    p.member_epoch = 0;
                    p.previous_member_epoch = 0;
                    p
                });
                if let Some(t) = prev_target {
                    out.push(records::put(
                        RecordKey::TargetMember {
                            group: group_id.to_string(),
                            member: member_id.clone(),
                        },
                        encode_target_member(&t),
                    ));
                    g.target.insert(member_id.clone(), t);
                }
                if let Some(m) = &inherited {
                    g.put_member(m.clone());
                }
                (inherited, false)
            }
        };
        let fresh = !matches!(resolved, Resolved::Existing);
        let mut member = before
            .clone()
            .unwrap_or_else(|| ConsumerMember::new(member_id.clone()));
        if let Some(i) = &req.instance_id {
            member.instance_id = Some(i.to_string());
        }
        if let Some(r) = &req.rack_id {
            member.rack_id = Some(r.to_string());
        }
        if req.rebalance_timeout_ms != -1 {
            member.rebalance_timeout_ms = req.rebalance_timeout_ms;
        }
        if let Some(names) = &req.subscribed_topic_names {
            let mut v: Vec<String> = names.iter().map(|n| n.to_string()).collect();
            v.sort_unstable();
            v.dedup();
            member.subscribed_topic_names = v;
        }
        if let Some(r) = &req.subscribed_topic_regex {
            member.subscribed_topic_regex = Some(r.to_string()).filter(|r| !r.is_empty());
        }
        if let Some(a) = &req.server_assignor {
            member.server_assignor = Some(a.to_string());
        }
        member.client_id = meta.client_id.clone();
        member.client_host = meta.client_host.clone();
        let subscription_changed = is_new
            || before.as_ref().is_some_and(|b| {
                b.subscribed_topic_names != member.subscribed_topic_names
                    || b.subscribed_topic_regex != member.subscribed_topic_regex
            });
        if fresh
            || before
                .as_ref()
                .is_some_and(|b| b.metadata_value() != member.metadata_value())
        {
            out.push(records::put(
                RecordKey::ConsumerMember {
                    group: group_id.to_string(),
                    member: member_id.clone(),
                },
                member.metadata_value().encode(),
            ));
        }
        g.put_member(member.clone());
        let mut bump = subscription_changed;
        if subscription_changed || g.subscribed.is_none() || now >= g.metadata_refresh_at {
            bump |= g.refresh_metadata(topics);
            g.metadata_refresh_at = now + refresh_ms;
        }
        if bump {
            g.group_epoch += 1;
            out.push(records::put(
                RecordKey::ConsumerGroup {
                    group: group_id.to_string(),
                },
                encode_epoch_value(g.group_epoch),
            ));
        }
        if g.group_epoch > g.assignment_epoch {
            out.extend(g.compute_target(group_id));
        }
        let reconciled = g.reconcile(&member, owned.as_ref());
        let assignment_changed = reconciled.assigned != member.assigned;
        let state_changed = reconciled.member_epoch != member.member_epoch
            || reconciled.previous_member_epoch != member.previous_member_epoch
            || reconciled.state != member.state
            || assignment_changed
            || reconciled.pending_revocation != member.pending_revocation;
        if state_changed || fresh {
            out.push(records::put(
                RecordKey::CurrentAssignment {
                    group: group_id.to_string(),
                    member: member_id.clone(),
                },
                reconciled.assignment_value().encode(),
            ));
        }
        if state_changed || fresh || bump {
            tracing::debug!(
                group = group_id,
                member = member_id.as_str(),
                req_epoch = req.member_epoch,
                owned = owned.as_ref().map(show).as_deref().unwrap_or("-"),
                group_epoch = g.group_epoch,
                assignment_epoch = g.assignment_epoch,
                epoch = format!("{}->{}", member.member_epoch, reconciled.member_epoch).as_str(),
                state = format!("{:?}->{:?}", member.state, reconciled.state).as_str(),
                assigned = show(&reconciled.assigned).as_str(),
                pending_revocation = show(&reconciled.pending_revocation).as_str(),
                target = g.target.get(&member_id).map(show).as_deref().unwrap_or("-"),
                "consumer group: member reconciled"
            );
        }
        let was_unrevoked = member.state == MemberState::UnrevokedPartitions;
        g.put_member(reconciled.clone());
        timers.schedule(
            TimerKey::ConsumerSession {
                group: group_id.to_string(),
                member: member_id.clone(),
            },
            now + session_ms,
        );
        let revocation = TimerKey::ConsumerRevocation {
            group: group_id.to_string(),
            member: member_id.clone(),
        };
        if reconciled.state == MemberState::UnrevokedPartitions {
            if !was_unrevoked || timers.deadline(&revocation).is_none() {
                timers.schedule(
                    revocation,
                    now + i64::from(reconciled.rebalance_timeout_ms.max(0)),
                );
            }
        } else {
            timers.cancel(&revocation);
        }
        let include = req.topic_partitions.is_some() || joining || assignment_changed || fresh;
        let assignment = include.then(|| {
            RespAssignment::default().with_topic_partitions(
                reconciled
                    .assigned
                    .iter()
                    .map(|(t, ps)| {
                        TopicPartitions::default()
                            .with_topic_id(t.0)
                            .with_partitions(ps.iter().copied().collect())
                    })
                    .collect(),
            )
        });
        (
            out,
            Ok(ConsumerGroupHeartbeatResponse::default()
                .with_member_id(Some(sb(&member_id)))
                .with_member_epoch(reconciled.member_epoch)
                .with_heartbeat_interval_ms(interval)
                .with_assignment(assignment)),
        )
    }

    pub(crate) fn consumer_session_expired(&mut self, now: i64, group_id: &str, member_id: &str) {
        self.expire_consumer(now, group_id, member_id, "session expired");
    }

    fn expire_consumer(&mut self, now: i64, group_id: &str, member_id: &str, reason: &str) {
        let Some(partition) = self.groups.get(group_id).map(|g| g.partition) else {
            return;
        };
        let records = self.fence_member(now, group_id, member_id, reason);
        self.write(partition, records);
    }

    pub(crate) fn consumer_revocation_expired(&mut self, now: i64, group_id: &str, member_id: &str) {
        let still_revoking = matches!(
            self.groups.get(group_id).map(|g| &g.kind),
            Some(GroupKind::Consumer(g)) if g.members.get(member_id).is_some_and(|m| m.state == MemberState::UnrevokedPartitions)
        );
        if still_revoking {
            self.expire_consumer(now, group_id, member_id, "revocation timed out");
        }
    }

    pub(crate) fn load_consumer(&mut self, partition: i32, key: &RecordKey, value: &[u8]) -> bool {
        let Some(group_id) = key.group() else { return true };
        let entry = self
            .groups
            .entry(group_id.to_string())
            .or_insert_with(|| GroupEntry {
                partition,
                offsets: BTreeMap::new(),
                kind: GroupKind::Consumer(ConsumerGroup::default()),
            });
        if !matches!(entry.kind, GroupKind::Consumer(_)) {
            entry.kind = GroupKind::Consumer(ConsumerGroup::default());
        }
        let GroupKind::Consumer(g) = &mut entry.kind else {
            return false;
        };
        let member = |g: &mut ConsumerGroup, id: &str| -> ConsumerMember {
            g.members
                .get(id)
                .cloned()
                .unwrap_or_else(|| ConsumerMember::new(id.to_string()))
        };
        match key {
            RecordKey::ConsumerGroup { .. } => match decode_epoch_value(value) {
                Ok(e) => g.group_epoch = e,
                Err(_) => return false,
            },
            RecordKey::TargetMetadata { .. } => match decode_epoch_value(value) {
                Ok(e) => g.assignment_epoch = e,
                Err(_) => return false,
            },
            RecordKey::ConsumerMember { member: id, .. } => match ConsumerMemberValue::decode(value) {
                Ok(v) => {
                    let mut m = member(g, id);
                    m.instance_id = v.instance_id;
                    m.rack_id = v.rack_id;
                    m.client_id = v.client_id;
                    m.client_host = v.client_host;
                    m.subscribed_topic_names = v.subscribed_topic_names;
                    m.subscribed_topic_regex = v.subscribed_topic_regex;
                    m.rebalance_timeout_ms = v.rebalance_timeout_ms;
                    m.server_assignor = v.server_assignor;
                    g.members.insert(id.clone(), m);
                }
                Err(_) => return false,
            },
            RecordKey::TargetMember { member: id, .. } => match decode_target_member(value) {
                Ok(a) => {
                    g.target.insert(id.clone(), a);
                }
                Err(_) => return false,
            },
            RecordKey::CurrentAssignment { member: id, .. } => match CurrentAssignmentValue::decode(value) {
                Ok(v) => {
                    let mut m = member(g, id);
                    m.member_epoch = v.member_epoch;
                    m.previous_member_epoch = v.previous_member_epoch;
                    m.state = MemberState::from_code(v.state);
                    m.assigned = v.assigned;
                    m.pending_revocation = v.pending_revocation;
                    g.members.insert(id.clone(), m);
                }
                Err(_) => return false,
            },
            _ => {}
        }
        true
    }

    pub(crate) fn consumer_loaded(&mut self, now: i64, group_id: &str) {
        let session_ms = i64::from(self.config.consumer_session_timeout_ms);
        let GroupCoordinator { groups, timers, .. } = self;
        let Some(GroupEntry {
            kind: GroupKind::Consumer(g),
            ..
        }) = groups.get_mut(group_id)
        else {
            return;
        };
        g.target.retain(|id, _| g.members.contains_key(id));
        g.owners.clear();
        g.static_members.clear();
        let members: Vec<ConsumerMember> = g.members.values().cloned().collect();
        for m in members {
            for tp in m.owned_partitions() {
                g.owners.entry(tp).or_insert_with(|| m.member_id.clone());
            }
            if let Some(i) = &m.instance_id {
                g.static_members.insert(i.clone(), m.member_id.clone());
            }
            timers.schedule(
                TimerKey::ConsumerSession {
                    group: group_id.to_string(),
                    member: m.member_id.clone(),
                },
                now + session_ms,
            );
            if m.state == MemberState::UnrevokedPartitions {
                timers.schedule(
                    TimerKey::ConsumerRevocation {
                        group: group_id.to_string(),
                        member: m.member_id.clone(),
                    },
                    now + i64::from(m.rebalance_timeout_ms.max(0)),
                );
            }
        }
        g.subscribed = None;
        g.metadata_refresh_at = now;
    }
}
