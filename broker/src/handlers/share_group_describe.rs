//! ShareGroupDescribe (77): share groups with their members and assignments, per coordinator
//! shard, merged in request order.

use std::collections::BTreeMap;
use std::rc::Rc;

use futures::future::join_all;
use kafka_protocol::messages::share_group_describe_response::DescribedGroup;
use kafka_protocol::messages::{ApiKey, GroupId, ShareGroupDescribeRequest, ShareGroupDescribeResponse};
use kafka_protocol::ResponseError;
use strand_protocol::types::ShardId;

use super::{msg, str_bytes, Handler, Reply, RequestCtx};
use crate::queue::doors::kafka_share::group::{ShareAnswer, ShareOp};

pub(crate) struct ShareGroupDescribe;

impl Handler for ShareGroupDescribe {
    const KEY: ApiKey = ApiKey::ShareGroupDescribe;
    const MIN: i16 = 1;
    const MAX: i16 = 1;
    type Request = ShareGroupDescribeRequest;
    type Response = ShareGroupDescribeResponse;

    async fn handle(
        ctx: Rc<RequestCtx>,
        req: ShareGroupDescribeRequest,
    ) -> Reply<ShareGroupDescribeResponse> {
        let order: Vec<String> = req.group_ids.iter().map(|g| g.as_str().to_owned()).collect();
        let mut by_owner: BTreeMap<ShardId, Vec<String>> = BTreeMap::new();
        for g in order.iter().filter(|g| !g.is_empty()) {
            by_owner
                .entry(crate::queue::doors::kafka_share::group::coordinator_of(
                    &ctx.shard, g,
                ))
                .or_default()
                .push(g.clone());
        }
        let mut calls = Vec::new();
        for (owner, groups) in by_owner {
            let op = ShareOp::Describe {
                groups: groups.clone(),
                include_authorized_operations: req.include_authorized_operations,
            };
            let fut = crate::queue::doors::kafka_share::group::call(&ctx.shard, owner, op).await;
            calls.push(async move { (groups, fut.await) });
        }
        let mut answered: Vec<DescribedGroup> = Vec::new();
        for (groups, answer) in join_all(calls).await {
            match answer {
                Some(ShareAnswer::Describe(r)) => answered.extend(r),
                _ => answered.extend(groups.into_iter().map(|g| {
                    DescribedGroup::default()
                        .with_group_id(GroupId(str_bytes(&g)))
                        .with_error_code(ResponseError::CoordinatorNotAvailable.code())
                })),
            }
        }
        let groups = order
            .iter()
            .map(|g| {
                if g.is_empty() {
                    return DescribedGroup::default()
                        .with_group_id(GroupId(str_bytes(g)))
                        .with_error_code(ResponseError::InvalidGroupId.code())
                        .with_error_message(msg("The group id is empty."));
                }
                match answered.iter().position(|a| a.group_id.as_str() == g) {
                    Some(i) => answered.swap_remove(i),
                    None => DescribedGroup::default()
                        .with_group_id(GroupId(str_bytes(g)))
                        .with_error_code(ResponseError::CoordinatorNotAvailable.code()),
                }
            })
            .collect();
        Reply::Now(ShareGroupDescribeResponse::default().with_groups(groups))
    }

    fn error_codes(resp: &ShareGroupDescribeResponse, out: &mut Vec<i16>) {
        out.extend(resp.groups.iter().map(|g| g.error_code));
    }
}
