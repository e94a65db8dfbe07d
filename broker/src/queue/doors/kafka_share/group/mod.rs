//! Share groups (KIP-932, "Queues for Kafka"): the group coordinator side — membership, member
//! and group epochs, server-side assignment — and the group configs of share groups.
//!
//! Records of a share group are delivered by the queue engine ([`crate::queue`], run by
//! [`crate::queue::host`]): ShareFetch acquires records under a lock, ShareAcknowledge settles
//! them. This module decides who is a member and which partitions each member fetches from.
//!
//! ## Pieces
//!
//! - [`coordinator`]: [`ShareCoordinator`], one per shard, a sans-I/O state machine driven by
//!   requests (ShareGroupHeartbeat, ShareGroupDescribe, ListGroups, member checks) and by `tick`
//!   with an injected `now_ms`; it answers with responses and [`Action`]s (a member is gone, wake
//!   me at t).
//! - [`assignor`]: the "simple" assignor (every subscribed partition to at least one member,
//!   sharing only when members outnumber partitions).
//! - [`host`]: [`ShareHost`], which runs a shard's coordinator: timers, the group-type check
//!   against [`crate::group`] (both ways: it tells the group coordinator which ids are share
//!   groups), and [`events`] for the share sessions.
//! - [`events`]: what the coordinator tells the rest of the broker (a member is gone), through
//!   the share sessions' service on every shard.
//! - Group configs live in [`crate::config::GroupConfig`], persisted cluster-wide in
//!   [`crate::metadata::ClusterMetadata`]; [`share_group_settings`] gives their effective values.
//!
//! ## Ownership
//!
//! A share group lives on the shard [`crate::group::host::coordinator_shard`] names for its id,
//! the same shard as a consumer group of that id would, so one group id names one thing and the
//! group-type checks are local calls. Requests about a group are routed there as [`ShareOp`]s,
//! the service of [`ShareHost`] on every shard ([`call`]).
//!
//! ## The protocol (ShareGroupHeartbeat v1)
//!
//! - The client generates its member id (required, non-empty) and joins with member epoch 0 and
//!   its subscribed topic names. Every heartbeat re-arms the member's session
//!   (`group.share.session.timeout.ms`); the answer carries `group.share.heartbeat.interval.ms`.
//! - The group epoch goes up when a member joins, leaves, is removed, changes its subscription,
//!   or when a subscribed topic is created, deleted or grows (the metadata version is compared at
//!   every heartbeat, so topic changes are noticed at the next heartbeat of any member). A new
//!   group epoch gets a new target assignment.
//! - A member moves straight to the target assignment and the current assignment epoch: unlike a
//!   consumer group there is nothing to revoke, since a partition may be shared. The answer
//!   carries the assignment when the member joins, sends a full request (subscribed topic names
//!   set) or its assignment changed.
//! - A member heartbeating with an epoch newer than its own, or older than its own and not its
//!   previous one (a lost answer), gets FENCED_MEMBER_EPOCH. Epoch -1 leaves. A member whose
//!   session expires is removed. Either way [`events::member_gone`] stops its share sessions from
//!   acquiring; what it holds is settled by its last acknowledgements or its lock timeout.
//! - `group.share.max.size` members per group (GROUP_MAX_SIZE_REACHED).
//!
//! ## Where Strand differs from Kafka 4.1
//!
//! - Share group membership is kept in memory, not in `__consumer_offsets`: after a restart
//!   groups are gone until a member joins again. So a heartbeat (epoch > 0) naming an unknown
//!   group gets UNKNOWN_MEMBER_ID (the client rejoins), where Kafka answers GROUP_ID_NOT_FOUND
//!   (which clients treat as fatal, but Kafka never loses the group). The delivery state of the
//!   records (the share-partitions) is durable: it is the queue engine's.
//! - A member rejoining with epoch 0 under its member id is accepted, as consumer groups accept
//!   it (Kafka's KAFKA-19233 fix); Kafka 4.1 fences such a share member unless 0 is its previous
//!   epoch.
//! - A heartbeat with epoch > 0 from a member unknown in a full group gets UNKNOWN_MEMBER_ID
//!   (Kafka checks the size first and answers GROUP_MAX_SIZE_REACHED).
//! - Topic changes are noticed through the metadata version at the next heartbeat (Kafka
//!   marks subscribed groups when a new metadata image arrives, then also waits for a heartbeat).
//! - Kafka initializes share-group state (the share coordinator's `__share_group_state`) before
//!   assigning partitions; the queue engine creates its state on first use instead.
//! - Bounds: 10 000 share groups per shard (empty groups are forgotten first, the longest empty
//!   first), 255-character member ids, 10 000 subscribed topics per member.

pub(crate) mod assignor;
pub(crate) mod coordinator;
pub(crate) mod events;
mod host;

#[cfg(test)]
mod tests;

use std::rc::Rc;

use futures::future::LocalBoxFuture;
use futures::FutureExt;
use kafka_protocol::messages::list_groups_response::ListedGroup;
use kafka_protocol::messages::share_group_describe_response::DescribedGroup;
use kafka_protocol::messages::{ShareGroupHeartbeatRequest, ShareGroupHeartbeatResponse};
use kafka_protocol::ResponseError;
use strand_protocol::types::ShardId;

pub(crate) use crate::config::ShareSettings;
pub(crate) use coordinator::{MemberInfo, ShareMeta};
pub(crate) use host::ShareHost;

use crate::config::Config;
use crate::metadata::ClusterMetadata;
use crate::shard::Shard;

/// A share-group operation for the coordinator shard of `group`
/// ([`crate::group::host::coordinator_shard`]); [`ShareAnswer`] carries the answer. Everything
/// here is `Send`: it crosses shards.
#[derive(Debug)]
pub(crate) enum ShareOp {
    /// ShareGroupHeartbeat v1 → [`ShareAnswer::Heartbeat`].
    Heartbeat {
        meta: ShareMeta,
        req: Box<ShareGroupHeartbeatRequest>,
    },
    /// ShareGroupDescribe v1 of groups this shard coordinates → [`ShareAnswer::Describe`], in
    /// order.
    Describe {
        groups: Vec<String>,
        include_authorized_operations: bool,
    },
    /// ListGroups: this shard's share groups, filtered (lower-case states and types; empty: no
    /// filter), shaped for `version` → [`ShareAnswer::List`].
    List {
        states: Vec<String>,
        types: Vec<String>,
        version: i16,
    },
    /// Which of these group ids are share groups here → [`ShareAnswer::ShareGroups`].
    ShareGroups { groups: Vec<String> },
    /// For ShareFetch / ShareAcknowledge: is `member_id` a member of share group `group`? →
    /// [`ShareAnswer::Member`]: its epoch and assigned partitions, or GROUP_ID_NOT_FOUND /
    /// UNKNOWN_MEMBER_ID.
    CheckMember { group: String, member_id: String },
    /// DeleteGroups of a share group: forgets `group` if it has no members →
    /// [`ShareAnswer::Deleted`]. The caller then deletes the group's share state.
    Delete { group: String },
}

/// The coordinator shard's answer to a [`ShareOp`].
#[derive(Debug)]
pub(crate) enum ShareAnswer {
    Heartbeat(Box<ShareGroupHeartbeatResponse>),
    Describe(Vec<DescribedGroup>),
    List(Vec<ListedGroup>),
    ShareGroups(Vec<String>),
    Member(Result<MemberInfo, ResponseError>),
    /// `Err`: GROUP_ID_NOT_FOUND (no share group of that id) or NON_EMPTY_GROUP.
    Deleted(Result<(), ResponseError>),
}

/// The effective settings of share group `group`: its group configs (IncrementalAlterConfigs on
/// the GROUP resource) over the broker's `group.share.*` defaults. Any shard can answer: group
/// configs are in every shard's metadata replica.
pub(crate) fn share_group_settings(md: &ClusterMetadata, config: &Config, group: &str) -> ShareSettings {
    match md.group_config(group) {
        Some(g) => g.share_settings(config),
        None => crate::config::GroupConfig::default().share_settings(config),
    }
}

/// The coordinator settings from the broker configuration.
pub(crate) fn coordinator_config(config: &Config) -> coordinator::ShareCoordinatorConfig {
    coordinator::ShareCoordinatorConfig {
        session_timeout_ms: config.group_share_session_timeout_ms,
        heartbeat_interval_ms: config.group_share_heartbeat_interval_ms,
        max_size: config.group_share_max_size as usize,
        ..coordinator::ShareCoordinatorConfig::default()
    }
}

/// The shard coordinating share group `group` (the same as for a consumer group of that id).
pub(crate) fn coordinator_of(shard: &Shard, group: &str) -> ShardId {
    crate::group::host::coordinator_shard(group, shard)
}

/// Sends `op` to the share coordinator of shard `owner`. Sending happens now; the returned
/// future waits for the answer (`None`: no answer could be had).
pub(crate) async fn call(
    shard: &Rc<Shard>,
    owner: ShardId,
    op: ShareOp,
) -> LocalBoxFuture<'static, Option<ShareAnswer>> {
    match shard.call::<ShareHost>(owner, op).await {
        Ok(answer) => async move { answer.await.ok() }.boxed_local(),
        Err(_) => async { None }.boxed_local(),
    }
}

/// For ShareFetch / ShareAcknowledge: whether `member_id` is a member of share group `group`,
/// asked of the group's coordinator shard. `Err`: GROUP_ID_NOT_FOUND, UNKNOWN_MEMBER_ID, or
/// COORDINATOR_NOT_AVAILABLE when the coordinator shard did not answer.
pub(crate) async fn check_member(
    shard: &Rc<Shard>,
    group: &str,
    member_id: &str,
) -> Result<MemberInfo, ResponseError> {
    let op = ShareOp::CheckMember {
        group: group.to_string(),
        member_id: member_id.to_string(),
    };
    match call(shard, coordinator_of(shard, group), op).await.await {
        Some(ShareAnswer::Member(r)) => r,
        _ => Err(ResponseError::CoordinatorNotAvailable),
    }
}

/// A group-level refusal: the error and its message.
pub(crate) type GroupError = (ResponseError, Option<String>);

/// How many members share group `group` has, asked of its coordinator shard (ShareGroupDescribe
/// there). `Err`: INVALID_GROUP_ID for an empty id, GROUP_ID_NOT_FOUND for an id that is not a
/// share group (unknown, or a classic or consumer group), COORDINATOR_NOT_AVAILABLE when the
/// coordinator shard did not answer.
pub(crate) async fn share_group_members(shard: &Rc<Shard>, group: &str) -> Result<usize, GroupError> {
    if group.is_empty() {
        return Err((
            ResponseError::InvalidGroupId,
            Some("The group id is empty.".into()),
        ));
    }
    let op = ShareOp::Describe {
        groups: vec![group.to_owned()],
        include_authorized_operations: false,
    };
    let answer = call(shard, coordinator_of(shard, group), op).await.await;
    match answer {
        Some(ShareAnswer::Describe(groups)) => match groups.into_iter().next() {
            Some(g) if g.error_code == 0 => Ok(g.members.len()),
            Some(g) => Err((
                ResponseError::try_from_code(g.error_code).unwrap_or(ResponseError::CoordinatorNotAvailable),
                g.error_message.map(|m| m.to_string()),
            )),
            None => Err((ResponseError::CoordinatorNotAvailable, None)),
        },
        _ => Err((ResponseError::CoordinatorNotAvailable, None)),
    }
}

/// For Alter and Delete: the group must exist and have no members (NON_EMPTY_GROUP otherwise).
pub(crate) async fn require_empty_share_group(shard: &Rc<Shard>, group: &str) -> Result<(), GroupError> {
    match share_group_members(shard, group).await? {
        0 => Ok(()),
        n => Err((
            ResponseError::NonEmptyGroup,
            Some(format!("The group {group} is not empty (it has {n} members).")),
        )),
    }
}
