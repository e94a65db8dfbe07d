//! DescribeGroups (15): state, protocol and members of classic groups, per coordinator shard,
//! merged in request order. A share group answers as Kafka answers for a group that is not
//! classic: state Dead, and from v6 GROUP_ID_NOT_FOUND ("Group `<id>` is not a classic group.").

use std::rc::Rc;

use kafka_protocol::messages::describe_groups_response::DescribedGroup;
use kafka_protocol::messages::{ApiKey, DescribeGroupsRequest, DescribeGroupsResponse};
use kafka_protocol::ResponseError;

use super::{str_bytes, Handler, Reply, RequestCtx};
use crate::group::route::per_group;
use crate::queue::doors::kafka_share::group::{ShareAnswer, ShareOp};

pub(crate) struct DescribeGroups;

impl Handler for DescribeGroups {
    const KEY: ApiKey = ApiKey::DescribeGroups;
    const MIN: i16 = 0;
    const MAX: i16 = 6;
    type Request = DescribeGroupsRequest;
    type Response = DescribeGroupsResponse;

    async fn handle(ctx: Rc<RequestCtx>, req: DescribeGroupsRequest) -> Reply<DescribeGroupsResponse> {
        let mut groups = per_group(&ctx.shard, &ctx.group_meta(), &req).await;
        if ctx.version >= 6 {
            not_classic_messages(&ctx, &mut groups).await;
        }
        Reply::Now(DescribeGroupsResponse::default().with_groups(groups))
    }

    fn error_codes(resp: &DescribeGroupsResponse, out: &mut Vec<i16>) {
        out.extend(resp.groups.iter().map(|g| g.error_code));
    }
}

/// Groups answered GROUP_ID_NOT_FOUND that are share groups get Kafka's message for a group of
/// another type ("Group `<id>` is not a classic group.") instead of "not found".
async fn not_classic_messages(ctx: &RequestCtx, groups: &mut [DescribedGroup]) {
    let mut by_owner: std::collections::BTreeMap<strand_protocol::types::ShardId, Vec<String>> =
        Default::default();
    for g in groups
        .iter()
        .filter(|g| g.error_code == ResponseError::GroupIdNotFound.code())
    {
        let id = g.group_id.0.as_str().to_owned();
        by_owner
            .entry(crate::queue::doors::kafka_share::group::coordinator_of(
                &ctx.shard, &id,
            ))
            .or_default()
            .push(id);
    }
    let mut calls = Vec::new();
    for (owner, ids) in by_owner {
        calls.push(
            crate::queue::doors::kafka_share::group::call(
                &ctx.shard,
                owner,
                ShareOp::ShareGroups { groups: ids },
            )
            .await,
        );
    }
    for answer in futures::future::join_all(calls).await {
        let Some(ShareAnswer::ShareGroups(share)) = answer else {
            continue;
        };
        for g in groups
            .iter_mut()
            .filter(|g| share.iter().any(|s| s == g.group_id.0.as_str()))
        {
            g.error_message = Some(str_bytes(&format!(
                "Group {} is not a classic group.",
                g.group_id.0.as_str()
            )));
        }
    }
}
