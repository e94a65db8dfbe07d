//! Runs a shard's [`ShareCoordinator`]: feeds it [`ShareOp`]s and timer ticks and carries out its
//! actions. Before a join creates a share group it asks the shard's group coordinator
//! ([`crate::group`], read-only) whether a classic or consumer group has that id; both
//! coordinators of a group id live on the same shard.

use std::cell::{Cell, RefCell};
use std::rc::{Rc, Weak};

use futures::future::LocalBoxFuture;
use futures::FutureExt;
use kafka_protocol::messages::{ConsumerGroupDescribeRequest, DescribeGroupsRequest, GroupId};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use super::coordinator::{Action, OtherGroup, ShareCoordinator};
use super::{events, ShareAnswer, ShareOp};
use crate::group::host::{GroupHost, OtherGroups};
use crate::group::{GroupRequest, GroupResponse, RequestMeta};
use crate::shard::service::Service;
use crate::shard::tasks::{tick_loop, Ticked};
use crate::shard::Shard;

pub(crate) struct ShareHost {
    me: Weak<ShareHost>,
    core: Rc<Shard>,
    /// This shard's group coordinator, asked whether a classic or consumer group has an id.
    groups: Rc<GroupHost>,
    coordinator: RefCell<ShareCoordinator>,
    /// Wakes the timer task when the coordinator asks for an earlier tick.
    wake: strand_storage::notify::Notify,
    /// Whether the timer task runs (it starts with the first operation).
    started: Cell<bool>,
}

impl ShareHost {
    pub(crate) fn new(core: Rc<Shard>, groups: Rc<GroupHost>) -> Rc<Self> {
        Rc::new_cyclic(|me| ShareHost {
            me: me.clone(),
            coordinator: RefCell::new(ShareCoordinator::new(super::coordinator_config(&core.config))),
            core,
            groups,
            wake: strand_storage::notify::Notify::new(),
            started: Cell::new(false),
        })
    }

    /// Whether share group `group` exists on this shard (which must be its coordinator shard).
    /// For the group coordinator: a classic or consumer group request naming a share group is
    /// refused (JoinGroup: INCONSISTENT_GROUP_PROTOCOL; ConsumerGroupHeartbeat and the describe
    /// APIs: GROUP_ID_NOT_FOUND, "Group <id> is not a consumer/classic group.").
    pub(crate) fn is_share_group(&self, group: &str) -> bool {
        self.coordinator.borrow().is_share_group(group)
    }

    /// Runs one operation on this shard (the coordinator shard of the groups it names).
    fn run_op(self: Rc<Self>, op: ShareOp) -> LocalBoxFuture<'static, ShareAnswer> {
        if !self.started.replace(true) {
            glommio::spawn_local(tick_loop(self.me.clone())).detach();
        }
        let md = self.core.metadata();
        match op {
            ShareOp::Heartbeat { meta, req } => {
                let needs_check = self.coordinator.borrow().needs_other_group_check(&req);
                async move {
                    let other = if needs_check {
                        other_group(&self.groups, req.group_id.as_str()).await
                    } else {
                        OtherGroup::None
                    };
                    let md = self.core.metadata();
                    let (resp, actions) =
                        self.coordinator
                            .borrow_mut()
                            .heartbeat(self.core.now_ms(), &meta, &req, &*md, other);
                    self.run(actions);
                    ShareAnswer::Heartbeat(Box::new(resp))
                }
                .boxed_local()
            }
            ShareOp::Describe {
                groups,
                include_authorized_operations,
            } => {
                let answer = self
                    .coordinator
                    .borrow()
                    .describe(&groups, include_authorized_operations, &*md);
                async move { ShareAnswer::Describe(answer) }.boxed_local()
            }
            ShareOp::List {
                states,
                types,
                version,
            } => {
                let answer = self.coordinator.borrow().list(&states, &types, version);
                async move { ShareAnswer::List(answer) }.boxed_local()
            }
            ShareOp::ShareGroups { groups } => {
                let c = self.coordinator.borrow();
                let answer = groups.into_iter().filter(|g| c.is_share_group(g)).collect();
                async move { ShareAnswer::ShareGroups(answer) }.boxed_local()
            }
            ShareOp::CheckMember { group, member_id } => {
                let answer = self.coordinator.borrow().check_member(&group, &member_id);
                async move { ShareAnswer::Member(answer) }.boxed_local()
            }
            ShareOp::Delete { group } => {
                let answer = self.coordinator.borrow_mut().delete(&group);
                async move { ShareAnswer::Deleted(answer) }.boxed_local()
            }
        }
    }

    /// Carries out the coordinator's actions.
    fn run(&self, actions: Vec<Action>) {
        for action in actions {
            match action {
                Action::MemberGone { group, member } => events::member_gone(&self.core, &group, &member),
                Action::WakeAt(_) => self.wake.notify_all(),
            }
        }
    }
}

impl Service for ShareHost {
    type Request = ShareOp;
    type Response = ShareAnswer;

    fn start(self: Rc<Self>, op: ShareOp) -> LocalBoxFuture<'static, ShareAnswer> {
        self.run_op(op)
    }
}

impl OtherGroups for ShareHost {
    fn is_other_group(&self, group_id: &str) -> bool {
        self.is_share_group(group_id)
    }
}

/// Asks the shard's group coordinator whether a classic or consumer group has id `group`
/// (DescribeGroups v5 shows a classic group in a state other than Dead; ConsumerGroupDescribe
/// finds a consumer group). Read-only.
async fn other_group(groups: &GroupHost, group: &str) -> OtherGroup {
    let id = GroupId(StrBytes::from_string(group.to_owned()));
    let meta = |version| RequestMeta {
        version,
        client_id: String::new(),
        client_host: String::new(),
    };
    let classic = groups.submit(
        meta(5),
        GroupRequest::DescribeGroups(DescribeGroupsRequest::default().with_groups(vec![id.clone()])),
    );
    let consumer = groups.submit(
        meta(0),
        GroupRequest::ConsumerGroupDescribe(ConsumerGroupDescribeRequest::default().with_group_ids(vec![id])),
    );
    let unavailable = OtherGroup::Unknown(ResponseError::CoordinatorNotAvailable);
    match classic.await {
        Ok(GroupResponse::DescribeGroups(r)) => match r.groups.first() {
            Some(g) if g.error_code != 0 => {
                return OtherGroup::Unknown(
                    ResponseError::try_from_code(g.error_code)
                        .unwrap_or(ResponseError::CoordinatorNotAvailable),
                )
            }
            Some(g) if g.group_state.as_str() != "Dead" => return OtherGroup::Exists,
            Some(_) => {}
            None => return unavailable,
        },
        _ => return unavailable,
    }
    match consumer.await {
        Ok(GroupResponse::ConsumerGroupDescribe(r)) => match r.groups.first() {
            Some(g) if g.error_code == 0 => OtherGroup::Exists,
            Some(g) if g.error_code == ResponseError::GroupIdNotFound.code() => OtherGroup::None,
            Some(g) => OtherGroup::Unknown(
                ResponseError::try_from_code(g.error_code).unwrap_or(ResponseError::CoordinatorNotAvailable),
            ),
            None => unavailable,
        },
        _ => unavailable,
    }
}

impl Ticked for ShareHost {
    fn core(&self) -> &Shard {
        &self.core
    }

    fn next_wake_ms(&self) -> Option<i64> {
        self.coordinator.borrow().next_wake()
    }

    fn wake(&self) -> &strand_storage::notify::Notify {
        &self.wake
    }

    fn tick(&self, now_ms: i64) {
        let actions = self.coordinator.borrow_mut().tick(now_ms);
        self.run(actions);
    }
}
