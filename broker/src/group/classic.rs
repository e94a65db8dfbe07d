//! Classic consumer groups: JoinGroup, SyncGroup, Heartbeat and LeaveGroup, with Kafka's group
//! states (Empty, PreparingRebalance, CompletingRebalance, Stable), member ids handed out with
//! MEMBER_ID_REQUIRED (KIP-394), static membership (KIP-345), the initial rebalance delay, and
//! session, rebalance and sync timeouts. Assignments are opaque bytes computed by the group
//! leader; the coordinator never looks inside them.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use bytes::Bytes;
use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use kafka_protocol::messages::leave_group_response::MemberResponse;
use kafka_protocol::messages::{
    HeartbeatRequest, HeartbeatResponse, JoinGroupRequest, JoinGroupResponse, LeaveGroupRequest,
    LeaveGroupResponse, SyncGroupRequest, SyncGroupResponse,
};
use kafka_protocol::ResponseError;

use super::records::{self, ClassicGroupValue, ClassicMemberValue, RecordKey};
use super::timers::{TimerKey, Timers};
use super::{
    sb, GroupConfig, GroupCoordinator, GroupEntry, GroupKind, GroupResponse, IdGen, Record, RequestMeta,
    RequestToken,
};

/// How long a new member may take to complete its first join (Kafka's
/// `GroupCoordinator.NewMemberJoinTimeoutMs`).
pub(crate) const NEW_MEMBER_JOIN_TIMEOUT_MS: i64 = 300_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ClassicState {
    Empty,
    PreparingRebalance,
    CompletingRebalance,
    Stable,
}

impl ClassicState {
    pub(crate) fn name(self) -> &'static str {
        match self {
            ClassicState::Empty => "Empty",
            ClassicState::PreparingRebalance => "PreparingRebalance",
            ClassicState::CompletingRebalance => "CompletingRebalance",
            ClassicState::Stable => "Stable",
        }
    }
}

/// A request parked in a group, or about to be answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Waiter {
    pub(crate) token: RequestToken,
    pub(crate) version: i16,
}

#[derive(Debug, Clone)]
pub(crate) struct ClassicMember {
    pub(crate) member_id: String,
    pub(crate) instance_id: Option<String>,
    pub(crate) client_id: String,
    pub(crate) client_host: String,
    pub(crate) rebalance_timeout_ms: i32,
    pub(crate) session_timeout_ms: i32,
    pub(crate) protocol_type: String,
    /// Protocols in preference order: (name, metadata).
    pub(crate) protocols: Vec<(String, Bytes)>,
    pub(crate) assignment: Bytes,
    join_waiter: Option<Waiter>,
    sync_waiter: Option<Waiter>,
    is_new: bool,
    seq: u64,
}

impl ClassicMember {
    pub(crate) fn metadata(&self, protocol: Option<&str>) -> Bytes {
        protocol
            .and_then(|p| self.protocols.iter().find(|(n, _)| n == p))
            .map(|(_, m)| m.clone())
            .unwrap_or_default()
    }
}

#[derive(Debug, Clone)]
pub(crate) struct ClassicGroup {
    pub(crate) state: ClassicState,
    pub(crate) state_timestamp: Option<i64>,
    pub(crate) protocol_type: Option<String>,
    pub(crate) protocol_name: Option<String>,
    pub(crate) generation: i32,
    pub(crate) leader: Option<String>,
    pub(crate) members: BTreeMap<String, ClassicMember>,
    static_members: HashMap<String, String>,
    pending_members: BTreeSet<String>,
    pending_sync: BTreeSet<String>,
    new_member_added: bool,
    /// While the initial delayed join runs: how much of the rebalance timeout is left.
    initial_remaining: Option<i64>,
    seq: u64,
}

/// What a group operation produces besides its state change.
pub(crate) struct Cx<'a> {
    pub(crate) now: i64,
    pub(crate) group_id: &'a str,
    pub(crate) timers: &'a mut Timers,
    pub(crate) config: &'a GroupConfig,
    pub(crate) ids: &'a mut IdGen,
    pub(crate) replies: Vec<(Waiter, GroupResponse)>,
    pub(crate) records: Vec<Record>,
    pub(crate) parked: Vec<RequestToken>,
}

impl Cx<'_> {
    fn heartbeat_key(&self, member: &str) -> TimerKey {
        TimerKey::ClassicHeartbeat {
            group: self.group_id.to_string(),
            member: member.to_string(),
        }
    }
    fn join_key(&self) -> TimerKey {
        TimerKey::ClassicJoin {
            group: self.group_id.to_string(),
        }
    }
    fn sync_key(&self) -> TimerKey {
        TimerKey::ClassicSync {
            group: self.group_id.to_string(),
        }
    }
    fn reply(&mut self, w: Waiter, r: GroupResponse) {
        self.replies.push((w, r));
    }
}

/// A JoinGroup answer with an error.
pub(crate) fn join_error(version: i16, code: i16, member_id: &str) -> JoinGroupResponse {
    JoinGroupResponse::default()
        .with_error_code(code)
        .with_generation_id(-1)
        .with_protocol_type(None)
        .with_protocol_name(if version >= 7 { None } else { Some(sb("")) })
        .with_leader(sb(""))
        .with_member_id(sb(member_id))
}

/// A SyncGroup answer with an error.
pub(crate) fn sync_error(_version: i16, code: i16) -> SyncGroupResponse {
    SyncGroupResponse::default().with_error_code(code)
}

fn join_err(w: Waiter, code: ResponseError, member_id: &str) -> (Waiter, GroupResponse) {
    (
        w,
        GroupResponse::JoinGroup(join_error(w.version, code.code(), member_id)),
    )
}

impl ClassicGroup {
    fn new(now: i64) -> Self {
        ClassicGroup {
            state: ClassicState::Empty,
            state_timestamp: Some(now),
            protocol_type: None,
            protocol_name: None,
            generation: 0,
            leader: None,
            members: BTreeMap::new(),
            static_members: HashMap::new(),
            pending_members: BTreeSet::new(),
            pending_sync: BTreeSet::new(),
            new_member_added: false,
            initial_remaining: None,
            seq: 0,
        }
    }

    /// A group known only by its offsets (loaded from offset records, or created by a commit with
    /// generation -1): empty, no protocol.
    pub(crate) fn new_simple() -> Self {
        let mut g = ClassicGroup::new(0);
        g.state_timestamp = None;
        g
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.state == ClassicState::Empty
    }

    pub(crate) fn has_pending_members(&self) -> bool {
        !self.pending_members.is_empty()
    }

    fn rebalance_timeout_ms(&self) -> i64 {
        self.members
            .values()
            .map(|m| i64::from(m.rebalance_timeout_ms))
            .max()
            .unwrap_or(0)
    }

    /// Protocols every member supports.
    fn candidate_protocols(&self) -> BTreeSet<&str> {
        let mut iter = self.members.values();
        let Some(first) = iter.next() else {
            return BTreeSet::new();
        };
        let mut set: BTreeSet<&str> = first.protocols.iter().map(|(n, _)| n.as_str()).collect();
        for m in iter {
            let names: BTreeSet<&str> = m.protocols.iter().map(|(n, _)| n.as_str()).collect();
            set = set.intersection(&names).copied().collect();
        }
        set
    }

    fn supports_protocols(&self, protocol_type: &str, protocols: &[(String, Bytes)]) -> bool {
        if self.members.is_empty() {
            !protocol_type.is_empty() && !protocols.is_empty()
        } else {
            let candidates = self.candidate_protocols();
            self.protocol_type.as_deref() == Some(protocol_type)
                && protocols.iter().any(|(n, _)| candidates.contains(n.as_str()))
        }
    }

    /// Each member votes for its most preferred candidate protocol; the most votes wins (ties go
    /// to the protocol the first member prefers).
    fn select_protocol(&self) -> Option<String> {
        let candidates = self.candidate_protocols();
        let mut votes: BTreeMap<&str, usize> = BTreeMap::new();
        for m in self.members.values() {
            if let Some((n, _)) = m.protocols.iter().find(|(n, _)| candidates.contains(n.as_str())) {
                *votes.entry(n.as_str()).or_default() += 1;
            }
        }
        let first = self.members_by_seq().into_iter().next();
        let rank = |name: &str| -> usize {
            first
                .and_then(|m| m.protocols.iter().position(|(n, _)| n == name))
                .unwrap_or(usize::MAX)
        };
        votes
            .into_iter()
            .max_by(|a, b| a.1.cmp(&b.1).then_with(|| rank(b.0).cmp(&rank(a.0))))
            .map(|(n, _)| n.to_string())
    }

    fn members_by_seq(&self) -> Vec<&ClassicMember> {
        let mut v: Vec<&ClassicMember> = self.members.values().collect();
        v.sort_by_key(|m| m.seq);
        v
    }

    /// Checks a member id (and instance id) of a request.
    fn validate_member(&self, member_id: &str, instance_id: Option<&str>) -> Result<(), ResponseError> {
        if let Some(instance) = instance_id {
            match self.static_members.get(instance) {
                None => return Err(ResponseError::UnknownMemberId),
                Some(existing) if existing != member_id => return Err(ResponseError::FencedInstanceId),
                Some(_) => {}
            }
        }
        if !self.members.contains_key(member_id) {
            return Err(ResponseError::UnknownMemberId);
        }
        Ok(())
    }

    fn all_members_joined(&self) -> bool {
        self.members.values().all(|m| m.join_waiter.is_some()) && self.pending_members.is_empty()
    }

    fn current_member_metadata(&self, version: i16) -> Vec<JoinGroupResponseMember> {
        let protocol = self.protocol_name.as_deref();
        self.members_by_seq()
            .into_iter()
            .map(|m| {
                JoinGroupResponseMember::default()
                    .with_member_id(sb(&m.member_id))
                    .with_group_instance_id(if version >= 5 {
                        m.instance_id.as_deref().map(sb)
                    } else {
                        None
                    })
                    .with_metadata(m.metadata(protocol))
            })
            .collect()
    }

    fn join_ok(
        &self,
        version: i16,
        member_id: &str,
        leader: Option<&str>,
        members: bool,
        skip: bool,
    ) -> JoinGroupResponse {
        JoinGroupResponse::default()
            .with_error_code(0)
            .with_generation_id(self.generation)
            .with_protocol_type(if version >= 7 {
                self.protocol_type.as_deref().map(sb)
            } else {
                None
            })
            .with_protocol_name(if version >= 7 {
                self.protocol_name.as_deref().map(sb)
            } else {
                Some(sb(self.protocol_name.as_deref().unwrap_or("")))
            })
            .with_leader(sb(leader.or(self.leader.as_deref()).unwrap_or("")))
            .with_skip_assignment(skip && version >= 9)
            .with_member_id(sb(member_id))
            .with_members(if members {
                self.current_member_metadata(version)
            } else {
                Vec::new()
            })
    }

    fn sync_ok(&self, version: i16, assignment: Bytes) -> SyncGroupResponse {
        SyncGroupResponse::default()
            .with_error_code(0)
            .with_protocol_type(if version >= 5 {
                self.protocol_type.as_deref().map(sb)
            } else {
                None
            })
            .with_protocol_name(if version >= 5 {
                self.protocol_name.as_deref().map(sb)
            } else {
                None
            })
            .with_assignment(assignment)
    }

    fn schedule_heartbeat(&self, cx: &mut Cx<'_>, member_id: &str) {
        if let Some(m) = self.members.get(member_id) {
            let timeout = if m.is_new {
                NEW_MEMBER_JOIN_TIMEOUT_MS
            } else {
                i64::from(m.session_timeout_ms)
            };
            let key = cx.heartbeat_key(member_id);
            cx.timers.schedule(key, cx.now + timeout);
        }
    }

    fn set_state(&mut self, state: ClassicState, now: i64) {
        self.state = state;
        self.state_timestamp = Some(now);
    }

    /// Members that have not rejoined during a join phase (what the phase waits for), and the
    /// pending member ids.
    fn waiting_for(&self) -> (usize, usize) {
        let not_joined = self.members.values().filter(|m| m.join_waiter.is_none()).count();
        (not_joined, self.pending_members.len())
    }

    /// A debug line about the group as it is now.
    fn trace(&self, cx: &Cx<'_>, event: &str) {
        if tracing::enabled!(tracing::Level::DEBUG) {
            let (not_joined, pending) = self.waiting_for();
            tracing::debug!(
                group = cx.group_id,
                state = self.state.name(),
                generation = self.generation,
                members = self.members.len(),
                not_joined,
                pending,
                pending_sync = self.pending_sync.len(),
                leader = self.leader.as_deref().unwrap_or(""),
                "classic group: {event}"
            );
        }
    }

    /// The GroupMetadata record of the group as it is.
    fn record(&self, group_id: &str) -> Record {
        let with_members = !matches!(self.state, ClassicState::Empty);
        let protocol = self.protocol_name.as_deref();
        let value = ClassicGroupValue {
            protocol_type: self.protocol_type.clone().unwrap_or_default(),
            generation: self.generation,
            protocol: self.protocol_name.clone(),
            leader: self.leader.clone(),
            current_state_timestamp: self.state_timestamp,
            members: if with_members {
                self.members_by_seq()
                    .into_iter()
                    .map(|m| ClassicMemberValue {
                        member_id: m.member_id.clone(),
                        group_instance_id: m.instance_id.clone(),
                        client_id: m.client_id.clone(),
                        client_host: m.client_host.clone(),
                        rebalance_timeout_ms: m.rebalance_timeout_ms,
                        session_timeout_ms: m.session_timeout_ms,
                        subscription: m.metadata(protocol),
                        assignment: m.assignment.clone(),
                    })
                    .collect()
            } else {
                Vec::new()
            },
        };
        records::put(
            RecordKey::GroupMetadata {
                group: group_id.to_string(),
            },
            value.encode(),
        )
    }

    fn add_member(&mut self, cx: &mut Cx<'_>, mut member: ClassicMember) {
        if self.state == ClassicState::PreparingRebalance && self.generation == 0 {
            self.new_member_added = true;
        }
        if self.members.is_empty() {
            self.protocol_type = Some(member.protocol_type.clone());
        }
        self.seq += 1;
        member.seq = self.seq;
        member.is_new = true;
        if self.leader.is_none() {
            self.leader = Some(member.member_id.clone());
        }
        if let Some(i) = &member.instance_id {
            self.static_members.insert(i.clone(), member.member_id.clone());
        }
        let id = member.member_id.clone();
        self.members.insert(id.clone(), member);
        self.schedule_heartbeat(cx, &id);
        self.maybe_prepare_rebalance_or_complete_join(cx);
    }

    /// Kafka's maybePrepareRebalanceOrCompleteJoin: starts a rebalance if the group can start one;
    /// in PreparingRebalance, the change (a member added or rejoining) may be the last one the join
    /// phase waits for, so it completes the phase if everybody is in. (A new member that happens to
    /// be the last to join must not leave the phase waiting for the rebalance timeout.)
    fn maybe_prepare_rebalance_or_complete_join(&mut self, cx: &mut Cx<'_>) {
        match self.state {
            ClassicState::Stable | ClassicState::CompletingRebalance | ClassicState::Empty => {
                self.prepare_rebalance(cx);
            }
            ClassicState::PreparingRebalance => self.maybe_complete_join(cx),
        }
    }

    fn prepare_rebalance(&mut self, cx: &mut Cx<'_>) {
        if self.state == ClassicState::CompletingRebalance {
            // Members waiting for the leader's assignment must rejoin.
            for m in self.members.values_mut() {
                m.assignment = Bytes::new();
                if let Some(w) = m.sync_waiter.take() {
                    cx.reply(
                        w,
                        GroupResponse::SyncGroup(sync_error(
                            w.version,
                            ResponseError::RebalanceInProgress.code(),
                        )),
                    );
                }
            }
        }
        let sync_key = cx.sync_key();
        cx.timers.cancel(&sync_key);
        self.pending_sync.clear();
        let key = cx.join_key();
        if self.state == ClassicState::Empty {
            let delay = i64::from(cx.config.initial_rebalance_delay_ms.max(0));
            self.initial_remaining = Some((self.rebalance_timeout_ms() - delay).max(0));
            self.new_member_added = false;
            cx.timers.schedule(key, cx.now + delay);
        } else {
            self.initial_remaining = None;
            cx.timers.schedule(key, cx.now + self.rebalance_timeout_ms());
        }
        self.set_state(ClassicState::PreparingRebalance, cx.now);
        self.trace(cx, "preparing rebalance");
        self.maybe_complete_join(cx);
    }

    fn maybe_complete_join(&mut self, cx: &mut Cx<'_>) {
        if self.state != ClassicState::PreparingRebalance {
            return;
        }
        if self.initial_remaining.is_none() && self.all_members_joined() {
            self.complete_join(cx);
        } else {
            self.trace(cx, "join phase waiting");
        }
    }

    /// The join phase timer fired.
    fn join_timer(&mut self, cx: &mut Cx<'_>) {
        if self.state != ClassicState::PreparingRebalance {
            return;
        }
        self.trace(cx, "join phase timer");
        if let Some(remaining) = self.initial_remaining {
            if self.new_member_added && remaining > 0 {
                // Kafka's InitialDelayedJoin: wait again while new members keep arriving, within
                // the rebalance timeout.
                self.new_member_added = false;
                let delay = i64::from(cx.config.initial_rebalance_delay_ms.max(0)).min(remaining);
                self.initial_remaining = Some(remaining - delay);
                let key = cx.join_key();
                cx.timers.schedule(key, cx.now + delay);
                return;
            }
        }
        self.complete_join(cx);
    }

    fn complete_join(&mut self, cx: &mut Cx<'_>) {
        let key = cx.join_key();
        cx.timers.cancel(&key);
        self.initial_remaining = None;
        // Dynamic members that did not rejoin in time are removed; static ones stay (their
        // session timeout removes them).
        let gone: Vec<String> = self
            .members
            .values()
            .filter(|m| m.join_waiter.is_none() && m.instance_id.is_none())
            .map(|m| m.member_id.clone())
            .collect();
        for id in gone {
            self.remove_member(cx, &id, ResponseError::UnknownMemberId);
        }
        // Keep the leader if it rejoined, else the first member that did.
        let leader_joined = self
            .leader
            .as_ref()
            .and_then(|l| self.members.get(l))
            .is_some_and(|m| m.join_waiter.is_some());
        if !leader_joined {
            if let Some(first) = self
                .members_by_seq()
                .into_iter()
                .find(|m| m.join_waiter.is_some())
            {
                self.leader = Some(first.member_id.clone());
            } else if !self.members.is_empty() {
                // Nobody rejoined: wait another rebalance timeout for the session timeouts to remove
                // the silent members.
                let key = cx.join_key();
                cx.timers.schedule(key, cx.now + self.rebalance_timeout_ms());
                self.trace(cx, "join phase ended with nobody rejoined; waiting again");
                return;
            }
        }
        self.generation += 1;
        if self.members.is_empty() {
            self.protocol_name = None;
            self.leader = None;
            self.set_state(ClassicState::Empty, cx.now);
            self.trace(cx, "join phase completed with no member");
            cx.records.push(self.record(cx.group_id));
            return;
        }
        self.protocol_name = self.select_protocol();
        self.set_state(ClassicState::CompletingRebalance, cx.now);
        self.trace(cx, "join phase completed");
        let leader = self.leader.clone();
        let ids: Vec<String> = self
            .members_by_seq()
            .iter()
            .map(|m| m.member_id.clone())
            .collect();
        for id in &ids {
            let is_leader = leader.as_deref() == Some(id.as_str());
            let waiter = self.members.get_mut(id).and_then(|m| {
                m.is_new = false;
                m.join_waiter.take()
            });
            if let Some(w) = waiter {
                let resp = self.join_ok(w.version, id, None, is_leader, false);
                cx.reply(w, GroupResponse::JoinGroup(resp));
            }
            self.schedule_heartbeat(cx, id);
            self.pending_sync.insert(id.clone());
        }
        let key = cx.sync_key();
        cx.timers.schedule(key, cx.now + self.rebalance_timeout_ms());
    }

    /// Removes a member: its parked requests get `error`.
    fn remove_member(&mut self, cx: &mut Cx<'_>, member_id: &str, error: ResponseError) {
        let Some(mut m) = self.members.remove(member_id) else {
            return;
        };
        tracing::debug!(
            group = cx.group_id,
            member = member_id,
            error = ?error,
            "classic group: member removed"
        );
        if let Some(w) = m.join_waiter.take() {
            cx.replies.push(join_err(w, error, member_id));
        }
        if let Some(w) = m.sync_waiter.take() {
            cx.reply(w, GroupResponse::SyncGroup(sync_error(w.version, error.code())));
        }
        if let Some(i) = &m.instance_id {
            if self.static_members.get(i).map(String::as_str) == Some(member_id) {
                self.static_members.remove(i);
            }
        }
        let key = cx.heartbeat_key(member_id);
        cx.timers.cancel(&key);
        self.pending_sync.remove(member_id);
        if self.leader.as_deref() == Some(member_id) {
            self.leader = self.members_by_seq().first().map(|m| m.member_id.clone());
        }
    }

    /// Kafka's removeMemberAndUpdateGroup.
    fn remove_member_and_update(&mut self, cx: &mut Cx<'_>, member_id: &str) {
        self.remove_member(cx, member_id, ResponseError::UnknownMemberId);
        match self.state {
            ClassicState::Stable | ClassicState::CompletingRebalance => {
                self.maybe_prepare_rebalance_or_complete_join(cx)
            }
            ClassicState::PreparingRebalance => self.maybe_complete_join(cx),
            ClassicState::Empty => {}
        }
    }

    /// Checks an OffsetCommit against the group (Kafka's `ClassicGroup.validateOffsetCommit`).
    pub(crate) fn validate_offset_commit(
        &self,
        member_id: &str,
        instance_id: Option<&str>,
        generation: i32,
    ) -> Result<(), ResponseError> {
        if generation < 0 && self.state == ClassicState::Empty {
            return Ok(());
        }
        if generation >= 0 || !member_id.is_empty() || instance_id.is_some() {
            self.validate_member(member_id, instance_id)?;
            if generation != self.generation {
                return Err(ResponseError::IllegalGeneration);
            }
        } else if self.state != ClassicState::Empty {
            return Err(ResponseError::UnknownMemberId);
        }
        if self.state == ClassicState::CompletingRebalance {
            return Err(ResponseError::RebalanceInProgress);
        }
        Ok(())
    }

    /// Topics the members subscribe to, from their consumer-protocol metadata; `None` if unknown
    /// (not the consumer protocol, or undecodable metadata).
    pub(crate) fn subscribed_topics(&self) -> Option<BTreeSet<String>> {
        if self.protocol_type.as_deref() != Some("consumer") {
            return None;
        }
        let mut out = BTreeSet::new();
        for m in self.members.values() {
            let meta = m.metadata(self.protocol_name.as_deref());
            out.extend(decode_subscription(&meta)?);
        }
        Some(out)
    }

    pub(crate) fn loaded(value: ClassicGroupValue) -> ClassicGroup {
        let mut g = ClassicGroup::new_simple();
        g.protocol_type = Some(value.protocol_type).filter(|t| !t.is_empty());
        g.generation = value.generation;
        g.protocol_name = value.protocol;
        g.leader = value.leader;
        g.state_timestamp = value.current_state_timestamp;
        for m in value.members {
            g.seq += 1;
            if let Some(i) = &m.group_instance_id {
                g.static_members.insert(i.clone(), m.member_id.clone());
            }
            let protocols = g
                .protocol_name
                .clone()
                .map(|p| vec![(p, m.subscription.clone())])
                .unwrap_or_default();
            g.members.insert(
                m.member_id.clone(),
                ClassicMember {
                    member_id: m.member_id,
                    instance_id: m.group_instance_id,
                    client_id: m.client_id,
                    client_host: m.client_host,
                    rebalance_timeout_ms: m.rebalance_timeout_ms.max(m.session_timeout_ms),
                    session_timeout_ms: m.session_timeout_ms,
                    protocol_type: g.protocol_type.clone().unwrap_or_default(),
                    protocols,
                    assignment: m.assignment,
                    join_waiter: None,
                    sync_waiter: None,
                    is_new: false,
                    seq: g.seq,
                },
            );
        }
        g.state = if g.members.is_empty() {
            ClassicState::Empty
        } else {
            ClassicState::Stable
        };
        if g.leader.as_ref().is_some_and(|l| !g.members.contains_key(l)) {
            g.leader = g.members_by_seq().first().map(|m| m.member_id.clone());
        }
        g
    }

    fn take_waiters(&mut self) -> Vec<(Waiter, bool)> {
        let mut out = Vec::new();
        for m in self.members.values_mut() {
            out.extend(m.join_waiter.take().map(|w| (w, false)));
            out.extend(m.sync_waiter.take().map(|w| (w, true)));
        }
        out
    }
}

/// The topics of a ConsumerProtocolSubscription (version prefix + v0–v3 body).
pub(crate) fn decode_subscription(meta: &[u8]) -> Option<Vec<String>> {
    use kafka_protocol::messages::ConsumerProtocolSubscription;
    use kafka_protocol::protocol::Decodable;
    let mut buf = Bytes::copy_from_slice(meta);
    if buf.len() < 2 {
        return None;
    }
    let version = i16::from_be_bytes([*meta.first()?, *meta.get(1)?]);
    let _ = bytes::Buf::get_i16(&mut buf);
    let version = version.clamp(0, 3);
    let sub = ConsumerProtocolSubscription::decode(&mut buf, version).ok()?;
    Some(sub.topics.into_iter().map(|t| t.to_string()).collect())
}

fn protocols_of(req: &JoinGroupRequest) -> Vec<(String, Bytes)> {
    req.protocols
        .iter()
        .map(|p| (p.name.to_string(), p.metadata.clone()))
        .collect()
}

impl GroupCoordinator {
    /// Runs `f` on the classic group `group_id`, then issues its writes and answers.
    fn with_classic<R>(
        &mut self,
        now: i64,
        group_id: &str,
        f: impl FnOnce(&mut ClassicGroup, &mut Cx<'_>) -> R,
    ) -> Option<R> {
        let GroupCoordinator {
            groups,
            timers,
            ids,
            config,
            ..
        } = self;
        let entry = groups.get_mut(group_id)?;
        let partition = entry.partition;
        let GroupKind::Classic(g) = &mut entry.kind else {
            return None;
        };
        let mut cx = Cx {
            now,
            group_id,
            timers,
            config,
            ids,
            replies: Vec::new(),
            records: Vec::new(),
            parked: Vec::new(),
        };
        let r = f(g, &mut cx);
        let Cx {
            replies,
            records,
            parked,
            ..
        } = cx;
        for t in parked {
            self.parked.insert(t, group_id.to_string());
        }
        self.write(partition, records);
        for (w, resp) in replies {
            self.answer(w, resp, partition);
        }
        Some(r)
    }

    /// Answers a (possibly parked) request.
    pub(crate) fn answer(&mut self, w: Waiter, resp: GroupResponse, partition: i32) {
        self.parked.remove(&w.token);
        self.respond(w.token, w.version, resp, &[partition]);
    }

    /// Answers every request parked in `group_id` with `error` (the group goes away).
    pub(crate) fn abort_parked(&mut self, group_id: &str, error: i16) {
        let Some(entry) = self.groups.get_mut(group_id) else {
            return;
        };
        let GroupKind::Classic(g) = &mut entry.kind else {
            return;
        };
        for (w, is_sync) in g.take_waiters() {
            self.parked.remove(&w.token);
            if self.cancelled.remove(&w.token) {
                continue;
            }
            let response = if is_sync {
                GroupResponse::SyncGroup(sync_error(w.version, error))
            } else {
                GroupResponse::JoinGroup(join_error(w.version, error, ""))
            };
            self.out.push(super::Action::Respond {
                token: w.token,
                response,
            });
        }
    }

    pub(crate) fn join_group(
        &mut self,
        now: i64,
        token: RequestToken,
        meta: &RequestMeta,
        req: JoinGroupRequest,
    ) {
        let w = Waiter {
            token,
            version: meta.version,
        };
        let group_id = req.group_id.to_string();
        let member_id = req.member_id.to_string();
        let fail = |this: &mut Self, code: ResponseError, partition: Option<i32>| {
            let (w, r) = join_err(w, code, &member_id);
            this.respond(w.token, w.version, r, partition.as_slice());
        };
        if group_id.is_empty() {
            return fail(self, ResponseError::InvalidGroupId, None);
        }
        let partition = match self.check_group(&group_id) {
            Ok(p) => p,
            Err(e) => return fail(self, e, None),
        };
        if req.session_timeout_ms < self.config.min_session_timeout_ms
            || req.session_timeout_ms > self.config.max_session_timeout_ms
        {
            return fail(self, ResponseError::InvalidSessionTimeout, Some(partition));
        }
        let unknown = member_id.is_empty();
        let mut converted = Vec::new();
        match self.groups.get(&group_id).map(|g| &g.kind) {
            None => {
                if !unknown {
                    return fail(self, ResponseError::UnknownMemberId, Some(partition));
                }
                self.groups.insert(
                    group_id.clone(),
                    GroupEntry {
                        partition,
                        offsets: BTreeMap::new(),
                        kind: GroupKind::Classic(ClassicGroup::new(now)),
                    },
                );
            }
            Some(GroupKind::Consumer(cg)) => {
                if !cg.members.is_empty() {
                    return fail(self, ResponseError::InconsistentGroupProtocol, Some(partition));
                }
                // An empty consumer group becomes a classic group (Kafka's downgrade of empty groups).
                converted = super::consumer::group_tombstones(&group_id);
                if let Some(entry) = self.groups.get_mut(&group_id) {
                    entry.kind = GroupKind::Classic(ClassicGroup::new(now));
                }
            }
            Some(GroupKind::Classic(_)) => {}
        }
        self.write(partition, converted);
        let instance = if meta.version >= 5 {
            req.group_instance_id.as_ref().map(|s| s.to_string())
        } else {
            None
        };
        let rebalance_timeout = if meta.version >= 1 {
            req.rebalance_timeout_ms
        } else {
            req.session_timeout_ms
        };
        let protocols = protocols_of(&req);
        let protocol_type = req.protocol_type.to_string();
        let meta = meta.clone();
        let max_size = self.config.classic_max_size;
        self.with_classic(now, &group_id, |g, cx| {
            tracing::debug!(
                group = cx.group_id,
                member = member_id.as_str(),
                version = w.version,
                state = g.state.name(),
                generation = g.generation,
                "classic group: JoinGroup"
            );
            // Kafka's acceptJoiningMember.
            let accept = match g.state {
                ClassicState::Empty => true,
                ClassicState::PreparingRebalance => {
                    g.members.get(&member_id).is_some_and(|m| m.join_waiter.is_some())
                        || g.members.values().filter(|m| m.join_waiter.is_some()).count() < max_size
                }
                _ => g.members.contains_key(&member_id) || g.members.len() < max_size,
            } && (g.members.contains_key(&member_id)
                || g.pending_members.contains(&member_id)
                || g.members.len() + g.pending_members.len() < max_size);
            if !accept {
                cx.replies
                    .push(join_err(w, ResponseError::GroupMaxSizeReached, &member_id));
                return;
            }
            if !g.supports_protocols(&protocol_type, &protocols) {
                cx.replies
                    .push(join_err(w, ResponseError::InconsistentGroupProtocol, &member_id));
                return;
            }
            let new_member = |id: String| ClassicMember {
                member_id: id,
                instance_id: instance.clone(),
                client_id: meta.client_id.clone(),
                client_host: meta.client_host.clone(),
                rebalance_timeout_ms: rebalance_timeout,
                session_timeout_ms: req.session_timeout_ms,
                protocol_type: protocol_type.clone(),
                protocols: protocols.clone(),
                assignment: Bytes::new(),
                join_waiter: Some(w),
                sync_waiter: None,
                is_new: true,
                seq: 0,
            };
            if unknown {
                let new_id = cx.ids.classic_member_id(&meta.client_id);
                if let Some(inst) = &instance {
                    if let Some(old) = g.static_members.get(inst).cloned() {
                        g.replace_static_member(cx, w, &old, &new_id, &req, rebalance_timeout, &protocols);
                        return;
                    }
                    cx.parked.push(w.token);
                    let m = new_member(new_id);
                    g.add_member(cx, m);
                } else if w.version >= 4 {
                    g.pending_members.insert(new_id.clone());
                    let key = TimerKey::ClassicPending {
                        group: cx.group_id.to_string(),
                        member: new_id.clone(),
                    };
                    cx.timers
                        .schedule(key, cx.now + i64::from(req.session_timeout_ms));
                    tracing::debug!(
                        group = cx.group_id,
                        member = new_id.as_str(),
                        "classic group: pending member (MEMBER_ID_REQUIRED)"
                    );
                    cx.replies
                        .push(join_err(w, ResponseError::MemberIdRequired, &new_id));
                } else {
                    cx.parked.push(w.token);
                    let m = new_member(new_id);
                    g.add_member(cx, m);
                }
                return;
            }
            if g.pending_members.remove(&member_id) {
                let key = TimerKey::ClassicPending {
                    group: cx.group_id.to_string(),
                    member: member_id.clone(),
                };
                cx.timers.cancel(&key);
                cx.parked.push(w.token);
                let m = new_member(member_id.clone());
                g.add_member(cx, m);
                return;
            }
            if let Err(e) = g.validate_member(&member_id, instance.as_deref()) {
                tracing::debug!(
                    group = cx.group_id,
                    member = member_id.as_str(),
                    error = ?e,
                    "classic group: JoinGroup refused"
                );
                cx.replies.push(join_err(w, e, &member_id));
                return;
            }
            let (matches, is_leader) = match g.members.get(&member_id) {
                Some(m) => (
                    m.protocols == protocols,
                    g.leader.as_deref() == Some(member_id.as_str()),
                ),
                None => (false, false),
            };
            match g.state {
                ClassicState::PreparingRebalance => {
                    g.update_member(
                        cx,
                        &member_id,
                        w,
                        rebalance_timeout,
                        req.session_timeout_ms,
                        protocols,
                    );
                    g.maybe_complete_join(cx);
                }
                ClassicState::CompletingRebalance if matches => {
                    let resp = g.join_ok(w.version, &member_id, None, is_leader, false);
                    cx.reply(w, GroupResponse::JoinGroup(resp));
                }
                ClassicState::Stable if matches && !is_leader => {
                    let resp = g.join_ok(w.version, &member_id, None, false, false);
                    g.schedule_heartbeat(cx, &member_id);
                    cx.reply(w, GroupResponse::JoinGroup(resp));
                }
                ClassicState::CompletingRebalance | ClassicState::Stable => {
                    g.update_member(
                        cx,
                        &member_id,
                        w,
                        rebalance_timeout,
                        req.session_timeout_ms,
                        protocols,
                    );
                    g.maybe_prepare_rebalance_or_complete_join(cx);
                }
                ClassicState::Empty => {
                    cx.replies
                        .push(join_err(w, ResponseError::UnknownMemberId, &member_id))
                }
            }
        });
        self.forget_if_unused(&group_id);
    }

    /// Drops a group that was created for a request that then failed and holds nothing.
    fn forget_if_unused(&mut self, group_id: &str) {
        let unused = self.groups.get(group_id).is_some_and(|e| {
            e.offsets.is_empty()
                && matches!(&e.kind, GroupKind::Classic(g) if g.state == ClassicState::Empty
                    && g.generation == 0 && g.members.is_empty() && g.pending_members.is_empty())
        });
        if unused {
            self.groups.remove(group_id);
            self.timers.cancel_group(group_id);
        }
    }

    pub(crate) fn sync_group(
        &mut self,
        now: i64,
        token: RequestToken,
        meta: &RequestMeta,
        req: SyncGroupRequest,
    ) {
        let w = Waiter {
            token,
            version: meta.version,
        };
        let group_id = req.group_id.to_string();
        let fail = |this: &mut Self, code: ResponseError, partitions: &[i32]| {
            this.respond(
                w.token,
                w.version,
                GroupResponse::SyncGroup(sync_error(w.version, code.code())),
                partitions,
            );
        };
        if group_id.is_empty() {
            return fail(self, ResponseError::InvalidGroupId, &[]);
        }
        let partition = match self.check_group(&group_id) {
            Ok(p) => p,
            Err(e) => return fail(self, e, &[]),
        };
        if !matches!(
            self.groups.get(&group_id).map(|g| &g.kind),
            Some(GroupKind::Classic(_))
        ) {
            return fail(self, ResponseError::UnknownMemberId, &[partition]);
        }
        let member_id = req.member_id.to_string();
        let instance = if meta.version >= 3 {
            req.group_instance_id.as_ref().map(|s| s.to_string())
        } else {
            None
        };
        self.with_classic(now, &group_id, |g, cx| {
            tracing::debug!(
                group = cx.group_id,
                member = member_id.as_str(),
                generation = req.generation_id,
                state = g.state.name(),
                group_generation = g.generation,
                "classic group: SyncGroup"
            );
            let err = |cx: &mut Cx<'_>, e: ResponseError| {
                tracing::debug!(
                    group = cx.group_id,
                    error = ?e,
                    "classic group: SyncGroup refused"
                );
                cx.reply(w, GroupResponse::SyncGroup(sync_error(w.version, e.code())));
            };
            if let Err(e) = g.validate_member(&member_id, instance.as_deref()) {
                return err(cx, e);
            }
            if req.generation_id != g.generation {
                return err(cx, ResponseError::IllegalGeneration);
            }
            if let Some(t) = &req.protocol_type {
                if g.protocol_type.as_deref() != Some(t.as_str()) {
                    return err(cx, ResponseError::InconsistentGroupProtocol);
                }
            }
            if let Some(n) = &req.protocol_name {
                if g.protocol_name.as_deref() != Some(n.as_str()) {
                    return err(cx, ResponseError::InconsistentGroupProtocol);
                }
            }
            match g.state {
                ClassicState::Empty => err(cx, ResponseError::UnknownMemberId),
                ClassicState::PreparingRebalance => err(cx, ResponseError::RebalanceInProgress),
                ClassicState::CompletingRebalance => {
                    if let Some(m) = g.members.get_mut(&member_id) {
                        if let Some(old) = m.sync_waiter.replace(w) {
                            cx.reply(
                                old,
                                GroupResponse::SyncGroup(sync_error(
                                    old.version,
                                    ResponseError::RebalanceInProgress.code(),
                                )),
                            );
                        }
                    }
                    cx.parked.push(w.token);
                    g.pending_sync.remove(&member_id);
                    if g.pending_sync.is_empty() {
                        let key = cx.sync_key();
                        cx.timers.cancel(&key);
                    }
                    g.schedule_heartbeat(cx, &member_id);
                    if g.leader.as_deref() == Some(member_id.as_str()) {
                        let given: HashMap<String, Bytes> = req
                            .assignments
                            .iter()
                            .map(|a| (a.member_id.to_string(), a.assignment.clone()))
                            .collect();
                        for m in g.members.values_mut() {
                            m.assignment = given.get(&m.member_id).cloned().unwrap_or_default();
                        }
                        g.set_state(ClassicState::Stable, cx.now);
                        g.trace(cx, "leader's assignment received");
                        cx.records.push(g.record(cx.group_id));
                        let ids: Vec<String> = g.members.keys().cloned().collect();
                        for id in ids {
                            let waiting = g.members.get_mut(&id).and_then(|m| m.sync_waiter.take());
                            if let Some(sw) = waiting {
                                let assignment = g
                                    .members
                                    .get(&id)
                                    .map(|m| m.assignment.clone())
                                    .unwrap_or_default();
                                let resp = g.sync_ok(sw.version, assignment);
                                cx.reply(sw, GroupResponse::SyncGroup(resp));
                            }
                        }
                    }
                }
                ClassicState::Stable => {
                    g.pending_sync.remove(&member_id);
                    if g.pending_sync.is_empty() {
                        let key = cx.sync_key();
                        cx.timers.cancel(&key);
                    }
                    g.schedule_heartbeat(cx, &member_id);
                    let assignment = g
                        .members
                        .get(&member_id)
                        .map(|m| m.assignment.clone())
                        .unwrap_or_default();
                    let resp = g.sync_ok(w.version, assignment);
                    cx.reply(w, GroupResponse::SyncGroup(resp));
                }
            }
        });
    }

    pub(crate) fn heartbeat(
        &mut self,
        now: i64,
        token: RequestToken,
        meta: &RequestMeta,
        req: HeartbeatRequest,
    ) {
        let version = meta.version;
        let reply = |this: &mut Self, code: i16, partitions: &[i32]| {
            this.respond(
                token,
                version,
                GroupResponse::Heartbeat(HeartbeatResponse::default().with_error_code(code)),
                partitions,
            );
        };
        let group_id = req.group_id.to_string();
        if group_id.is_empty() {
            return reply(self, ResponseError::InvalidGroupId.code(), &[]);
        }
        let partition = match self.check_group(&group_id) {
            Ok(p) => p,
            // Kafka answers heartbeats blindly while the group is loading.
            Err(ResponseError::CoordinatorLoadInProgress) => return reply(self, 0, &[]),
            Err(e) => return reply(self, e.code(), &[]),
        };
        let member_id = req.member_id.to_string();
        let instance = if version >= 3 {
            req.group_instance_id.as_ref().map(|s| s.to_string())
        } else {
            None
        };
        let result = self.with_classic(now, &group_id, |g, cx| {
            g.validate_member(&member_id, instance.as_deref())?;
            if req.generation_id != g.generation {
                return Err(ResponseError::IllegalGeneration);
            }
            match g.state {
                ClassicState::Empty => Err(ResponseError::UnknownMemberId),
                ClassicState::PreparingRebalance => {
                    g.schedule_heartbeat(cx, &member_id);
                    Err(ResponseError::RebalanceInProgress)
                }
                ClassicState::CompletingRebalance | ClassicState::Stable => {
                    g.schedule_heartbeat(cx, &member_id);
                    Ok(())
                }
            }
        });
        let code = match result {
            None => ResponseError::UnknownMemberId.code(),
            Some(Ok(())) => 0,
            Some(Err(e)) => e.code(),
        };
        if code != 0 {
            tracing::debug!(
                group = group_id.as_str(),
                member = member_id.as_str(),
                generation = req.generation_id,
                code,
                "classic group: Heartbeat answered with an error"
            );
        }
        reply(self, code, &[partition]);
    }

    pub(crate) fn leave_group(
        &mut self,
        now: i64,
        token: RequestToken,
        meta: &RequestMeta,
        req: LeaveGroupRequest,
    ) {
        let version = meta.version;
        let leaving: Vec<(String, Option<String>)> = if version >= 3 {
            req.members
                .iter()
                .map(|m| {
                    (
                        m.member_id.to_string(),
                        m.group_instance_id.as_ref().map(|s| s.to_string()),
                    )
                })
                .collect()
        } else {
            vec![(req.member_id.to_string(), None)]
        };
        let group_id = req.group_id.to_string();
        let respond = |this: &mut Self, top: i16, results: Vec<i16>, partitions: &[i32]| {
            let mut resp = LeaveGroupResponse::default().with_error_code(top);
            if version >= 3 {
                if top == 0 {
                    resp.members = leaving
                        .iter()
                        .zip(results)
                        .map(|((m, i), e)| {
                            MemberResponse::default()
                                .with_member_id(sb(m))
                                .with_group_instance_id(i.as_deref().map(sb))
                                .with_error_code(e)
                        })
                        .collect();
                }
            } else if top == 0 {
                resp.error_code = results.first().copied().unwrap_or(0);
            }
            this.respond(token, version, GroupResponse::LeaveGroup(resp), partitions);
        };
        if group_id.is_empty() {
            return respond(self, ResponseError::InvalidGroupId.code(), vec![], &[]);
        }
        let partition = match self.check_group(&group_id) {
            Ok(p) => p,
            Err(e) => return respond(self, e.code(), vec![], &[]),
        };
        let leaving2 = leaving.clone();
        let results = self.with_classic(now, &group_id, |g, cx| {
            let mut out = Vec::new();
            for (member_id, instance) in &leaving2 {
                let resolved = if member_id.is_empty() {
                    match instance.as_ref().and_then(|i| g.static_members.get(i)) {
                        Some(id) => Ok(id.clone()),
                        None => Err(ResponseError::UnknownMemberId),
                    }
                } else if g.pending_members.remove(member_id) {
                    let key = TimerKey::ClassicPending {
                        group: cx.group_id.to_string(),
                        member: member_id.clone(),
                    };
                    cx.timers.cancel(&key);
                    g.maybe_complete_join(cx);
                    out.push(0);
                    continue;
                } else {
                    match instance.as_ref().and_then(|i| g.static_members.get(i)) {
                        Some(id) if id != member_id => Err(ResponseError::FencedInstanceId),
                        _ if g.members.contains_key(member_id) => Ok(member_id.clone()),
                        _ => Err(ResponseError::UnknownMemberId),
                    }
                };
                match resolved {
                    Ok(id) => {
                        g.remove_member_and_update(cx, &id);
                        out.push(0);
                    }
                    Err(e) => out.push(e.code()),
                }
            }
            out
        });
        let results = results.unwrap_or_else(|| vec![ResponseError::UnknownMemberId.code(); leaving.len()]);
        respond(self, 0, results, &[partition]);
    }

    pub(crate) fn classic_heartbeat_expired(&mut self, now: i64, group_id: &str, member_id: &str) {
        self.with_classic(now, group_id, |g, cx| {
            let Some(m) = g.members.get(member_id) else { return };
            tracing::debug!(
                group = cx.group_id,
                member = member_id,
                is_new = m.is_new,
                "classic group: session expired"
            );
            if !m.is_new && (m.join_waiter.is_some() || m.sync_waiter.is_some()) {
                // Kafka keeps members that wait for the rebalance alive.
                g.schedule_heartbeat(cx, member_id);
                return;
            }
            g.remove_member_and_update(cx, member_id);
        });
    }

    pub(crate) fn classic_pending_expired(&mut self, now: i64, group_id: &str, member_id: &str) {
        self.with_classic(now, group_id, |g, cx| {
            if g.pending_members.remove(member_id) {
                tracing::debug!(
                    group = cx.group_id,
                    member = member_id,
                    "classic group: pending member expired"
                );
                g.maybe_complete_join(cx);
            }
        });
    }

    pub(crate) fn classic_join_timer(&mut self, now: i64, group_id: &str) {
        self.with_classic(now, group_id, |g, cx| g.join_timer(cx));
    }

    pub(crate) fn classic_sync_expired(&mut self, now: i64, group_id: &str) {
        self.with_classic(now, group_id, |g, cx| {
            if !matches!(g.state, ClassicState::CompletingRebalance | ClassicState::Stable)
                || g.pending_sync.is_empty()
            {
                return;
            }
            g.trace(cx, "sync phase timer: removing members that did not sync");
            let late: Vec<String> = g.pending_sync.iter().cloned().collect();
            for id in late {
                g.remove_member(cx, &id, ResponseError::UnknownMemberId);
            }
            g.prepare_rebalance(cx);
        });
    }

    /// Refreshes a member's session (a valid offset commit counts as a sign of life).
    pub(crate) fn classic_touch(&mut self, now: i64, group_id: &str, member_id: &str) {
        self.with_classic(now, group_id, |g, cx| {
            if g.members.contains_key(member_id) {
                g.schedule_heartbeat(cx, member_id);
            }
        });
    }

    pub(crate) fn load_classic(&mut self, partition: i32, group_id: &str, value: &[u8]) -> bool {
        let Ok(v) = ClassicGroupValue::decode(value) else {
            return false;
        };
        let g = ClassicGroup::loaded(v);
        match self.groups.get_mut(group_id) {
            Some(entry) => entry.kind = GroupKind::Classic(g),
            None => {
                self.groups.insert(
                    group_id.to_string(),
                    GroupEntry {
                        partition,
                        offsets: BTreeMap::new(),
                        kind: GroupKind::Classic(g),
                    },
                );
            }
        }
        true
    }

    pub(crate) fn classic_loaded(&mut self, now: i64, group_id: &str) {
        self.with_classic(now, group_id, |g, cx| {
            let ids: Vec<String> = g.members.keys().cloned().collect();
            for id in ids {
                g.schedule_heartbeat(cx, &id);
            }
        });
    }
}

impl ClassicGroup {
    fn update_member(
        &mut self,
        cx: &mut Cx<'_>,
        member_id: &str,
        w: Waiter,
        rebalance_timeout_ms: i32,
        session_timeout_ms: i32,
        protocols: Vec<(String, Bytes)>,
    ) {
        let Some(m) = self.members.get_mut(member_id) else {
            return;
        };
        m.protocols = protocols;
        m.rebalance_timeout_ms = rebalance_timeout_ms;
        m.session_timeout_ms = session_timeout_ms;
        if let Some(old) = m.join_waiter.replace(w) {
            cx.replies
                .push(join_err(old, ResponseError::RebalanceInProgress, member_id));
        }
        cx.parked.push(w.token);
    }

    /// A static member rejoins with an unknown member id: the new id replaces the old one, whose
    /// parked requests are fenced (Kafka's updateStaticMemberAndRebalance).
    #[allow(clippy::too_many_arguments)]
    fn replace_static_member(
        &mut self,
        cx: &mut Cx<'_>,
        w: Waiter,
        old_id: &str,
        new_id: &str,
        req: &JoinGroupRequest,
        rebalance_timeout_ms: i32,
        protocols: &[(String, Bytes)],
    ) {
        let previous_leader = self.leader.clone();
        let Some(mut m) = self.members.remove(old_id) else {
            return;
        };
        if let Some(old) = m.join_waiter.take() {
            cx.replies
                .push(join_err(old, ResponseError::FencedInstanceId, old_id));
        }
        if let Some(old) = m.sync_waiter.take() {
            cx.reply(
                old,
                GroupResponse::SyncGroup(sync_error(old.version, ResponseError::FencedInstanceId.code())),
            );
        }
        let key = cx.heartbeat_key(old_id);
        cx.timers.cancel(&key);
        if self.pending_sync.remove(old_id) {
            self.pending_sync.insert(new_id.to_string());
        }
        if self.leader.as_deref() == Some(old_id) {
            self.leader = Some(new_id.to_string());
        }
        m.member_id = new_id.to_string();
        m.protocols = protocols.to_vec();
        m.rebalance_timeout_ms = rebalance_timeout_ms;
        m.session_timeout_ms = req.session_timeout_ms;
        if let Some(i) = &m.instance_id {
            self.static_members.insert(i.clone(), new_id.to_string());
        }
        self.members.insert(new_id.to_string(), m);
        self.schedule_heartbeat(cx, new_id);
        match self.state {
            ClassicState::Stable => {
                if self.select_protocol() != self.protocol_name {
                    self.set_waiter(cx, new_id, w);
                    self.prepare_rebalance(cx);
                } else {
                    // Same generation, same assignment: persist the new member id and answer
                    // without a rebalance. A leader that cannot skip the assignment (JoinGroup
                    // v9) is told the old leader id, so it behaves as a follower.
                    let is_leader = self.leader.as_deref() == Some(new_id);
                    let resp = if is_leader && w.version >= 9 {
                        self.join_ok(w.version, new_id, Some(new_id), true, true)
                    } else if is_leader {
                        self.join_ok(w.version, new_id, previous_leader.as_deref(), false, false)
                    } else {
                        self.join_ok(w.version, new_id, None, false, false)
                    };
                    cx.records.push(self.record(cx.group_id));
                    cx.reply(w, GroupResponse::JoinGroup(resp));
                }
            }
            ClassicState::CompletingRebalance => {
                self.set_waiter(cx, new_id, w);
                self.prepare_rebalance(cx);
            }
            ClassicState::PreparingRebalance => {
                self.set_waiter(cx, new_id, w);
                self.maybe_complete_join(cx);
            }
            ClassicState::Empty => {
                self.set_waiter(cx, new_id, w);
                self.maybe_prepare_rebalance_or_complete_join(cx);
            }
        }
    }

    fn set_waiter(&mut self, cx: &mut Cx<'_>, member_id: &str, w: Waiter) {
        if let Some(m) = self.members.get_mut(member_id) {
            m.join_waiter = Some(w);
            cx.parked.push(w.token);
        }
    }
}
