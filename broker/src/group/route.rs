//! The way to the group coordinator from any shard: a request about one group goes to the shard
//! that coordinates it ([`forward`]); a request naming several groups is split by coordinator
//! shard and its answers merged back in the request's order ([`per_group`]). What the handlers
//! of the group APIs call.

use std::collections::BTreeMap;
use std::rc::Rc;

use futures::future::LocalBoxFuture;
use futures::FutureExt;
use kafka_protocol::messages::consumer_group_describe_response::DescribedGroup as ConsumerDescribed;
use kafka_protocol::messages::delete_groups_response::DeletableGroupResult;
use kafka_protocol::messages::describe_groups_response::DescribedGroup as ClassicDescribed;
use kafka_protocol::messages::offset_fetch_response::OffsetFetchResponseGroup;
use kafka_protocol::messages::{
    ConsumerGroupDescribeRequest, DeleteGroupsRequest, DescribeGroupsRequest, GroupId, OffsetFetchRequest,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use strand_protocol::types::ShardId;

use super::host::{coordinator_shard, GroupCall, GroupHost};
use super::{GroupRequest, GroupResponse, RequestMeta};
use crate::shard::Shard;

/// Sends a request about `group_id` to its coordinator. Sending happens now; the returned
/// future waits for the answer (a JoinGroup's comes when its rebalance completes). `None`: no
/// answer could be had.
pub(crate) async fn forward(
    core: &Rc<Shard>,
    meta: RequestMeta,
    group_id: &str,
    req: GroupRequest,
) -> LocalBoxFuture<'static, Option<GroupResponse>> {
    let owner = coordinator_shard(group_id, core);
    let call = GroupCall {
        meta,
        req: Box::new(req),
    };
    match core.call::<GroupHost>(owner, call).await {
        Ok(answer) => async move { answer.await.ok().flatten() }.boxed_local(),
        Err(_) => async { None }.boxed_local(),
    }
}

/// Sends `make(subset)` to the coordinator shard of each subset of `groups` (to every shard,
/// with an empty subset where it coordinates none of them, if `all_shards`); each subset with
/// its answer.
pub(crate) async fn scatter(
    core: &Rc<Shard>,
    meta: &RequestMeta,
    groups: Vec<String>,
    all_shards: bool,
    make: impl Fn(&[String]) -> GroupRequest,
) -> Vec<(Vec<String>, Option<GroupResponse>)> {
    let mut by_owner: BTreeMap<ShardId, Vec<String>> = BTreeMap::new();
    if all_shards {
        by_owner.extend((0..core.shards).map(|s| (ShardId(s), Vec::new())));
    }
    for g in groups {
        let owner = coordinator_shard(&g, core);
        by_owner.entry(owner).or_default().push(g);
    }
    let mut calls = Vec::new();
    for (owner, subset) in by_owner {
        let call = GroupCall {
            meta: meta.clone(),
            req: Box::new(make(&subset)),
        };
        let answer = core.call::<GroupHost>(owner, call).await;
        calls.push(async move {
            let answer = match answer {
                Ok(a) => a.await.ok().flatten(),
                Err(_) => None,
            };
            (subset, answer)
        });
    }
    futures::future::join_all(calls).await
}

/// A request naming several groups whose answer has one item per group.
pub(crate) trait PerGroup {
    /// What the answer holds per group.
    type Item;
    /// The groups named, in order.
    fn groups(&self) -> Vec<String>;
    /// The same request for `subset` of its groups.
    fn for_groups(&self, subset: &[String]) -> GroupRequest;
    /// The items of an answer to this kind of request.
    fn items(r: GroupResponse) -> Option<Vec<Self::Item>>;
    fn item_group(item: &Self::Item) -> &str;
    /// The item of a group whose coordinator did not answer.
    fn unavailable(group: &str) -> Self::Item;
}

/// Runs `req` on the coordinators of its groups; one item per group, in the request's order
/// (a group named twice is answered once).
pub(crate) async fn per_group<R: PerGroup>(core: &Rc<Shard>, meta: &RequestMeta, req: &R) -> Vec<R::Item> {
    let order = req.groups();
    let parts = scatter(core, meta, order.clone(), false, |subset| req.for_groups(subset)).await;
    let mut answered: Vec<R::Item> = Vec::new();
    for (subset, answer) in parts {
        match answer.and_then(R::items) {
            Some(items) => answered.extend(items),
            None => answered.extend(subset.iter().map(|g| R::unavailable(g))),
        }
    }
    order
        .iter()
        .filter_map(|g| {
            answered
                .iter()
                .position(|a| R::item_group(a) == g)
                .map(|i| answered.swap_remove(i))
        })
        .collect()
}

fn group_id(g: &str) -> GroupId {
    GroupId(StrBytes::from_string(g.to_owned()))
}

const UNAVAILABLE: i16 = ResponseError::CoordinatorNotAvailable.code();

macro_rules! per_group {
    ($req:ty, $variant:ident, $names:ident => $item:ty, $items:ident) => {
        impl PerGroup for $req {
            type Item = $item;
            fn groups(&self) -> Vec<String> {
                self.$names.iter().map(|g| g.as_str().to_owned()).collect()
            }
            fn for_groups(&self, subset: &[String]) -> GroupRequest {
                let mut sub = self.clone();
                sub.$names = subset.iter().map(|g| group_id(g)).collect();
                GroupRequest::$variant(sub)
            }
            fn items(r: GroupResponse) -> Option<Vec<$item>> {
                match r {
                    GroupResponse::$variant(r) => Some(r.$items),
                    _ => None,
                }
            }
            fn item_group(item: &$item) -> &str {
                item.group_id.as_str()
            }
            fn unavailable(group: &str) -> $item {
                <$item>::default()
                    .with_group_id(group_id(group))
                    .with_error_code(UNAVAILABLE)
            }
        }
    };
}

per_group!(DescribeGroupsRequest, DescribeGroups, groups => ClassicDescribed, groups);
per_group!(ConsumerGroupDescribeRequest, ConsumerGroupDescribe, group_ids => ConsumerDescribed, groups);
per_group!(DeleteGroupsRequest, DeleteGroups, groups_names => DeletableGroupResult, results);

/// OffsetFetch v8 and later (a list of groups, each with its topics).
impl PerGroup for OffsetFetchRequest {
    type Item = OffsetFetchResponseGroup;
    fn groups(&self) -> Vec<String> {
        self.groups
            .iter()
            .map(|g| g.group_id.as_str().to_owned())
            .collect()
    }
    fn for_groups(&self, subset: &[String]) -> GroupRequest {
        let mut sub = self.clone();
        sub.groups
            .retain(|g| subset.iter().any(|s| s.as_str() == g.group_id.as_str()));
        GroupRequest::OffsetFetch(sub)
    }
    fn items(r: GroupResponse) -> Option<Vec<OffsetFetchResponseGroup>> {
        match r {
            GroupResponse::OffsetFetch(r) => Some(r.groups),
            _ => None,
        }
    }
    fn item_group(item: &OffsetFetchResponseGroup) -> &str {
        item.group_id.as_str()
    }
    fn unavailable(group: &str) -> OffsetFetchResponseGroup {
        OffsetFetchResponseGroup::default()
            .with_group_id(group_id(group))
            .with_error_code(UNAVAILABLE)
    }
}
