//! DescribeGroups (15): state, protocol and members of classic groups, per coordinator shard,
//! merged in request order.

use std::rc::Rc;

use kafka_protocol::messages::describe_groups_response::DescribedGroup;
use kafka_protocol::messages::{ApiKey, DescribeGroupsRequest, DescribeGroupsResponse, GroupId};
use kafka_protocol::ResponseError;

use super::{group_scatter, str_bytes, Handler, Reply, RequestCtx};
use crate::group::{GroupRequest, GroupResponse};

pub(crate) struct DescribeGroups;

impl Handler for DescribeGroups {
    const KEY: ApiKey = ApiKey::DescribeGroups;
    const MIN: i16 = 0;
    const MAX: i16 = 6;
    type Request = DescribeGroupsRequest;
    type Response = DescribeGroupsResponse;

    async fn handle(ctx: Rc<RequestCtx>, req: DescribeGroupsRequest) -> Reply<DescribeGroupsResponse> {
        let order: Vec<String> = req.groups.iter().map(|g| g.0.as_str().to_owned()).collect();
        let parts = group_scatter(&ctx, order.clone(), false, |subset| {
            let mut sub = req.clone();
            sub.groups = subset.iter().map(|g| GroupId(str_bytes(g))).collect();
            GroupRequest::DescribeGroups(sub)
        })
        .await;
        let mut answered: Vec<DescribedGroup> = Vec::new();
        for (subset, answer) in parts {
            match answer {
                Some(GroupResponse::DescribeGroups(r)) => answered.extend(r.groups),
                _ => answered.extend(subset.into_iter().map(|g| {
                    DescribedGroup::default()
                        .with_group_id(GroupId(str_bytes(&g)))
                        .with_error_code(ResponseError::CoordinatorNotAvailable.code())
                })),
            }
        }
        let groups = order
            .iter()
            .filter_map(|g| {
                answered
                    .iter()
                    .position(|a| a.group_id.0.as_str() == g)
                    .map(|i| answered.swap_remove(i))
            })
            .collect();
        Reply::Now(DescribeGroupsResponse::default().with_groups(groups))
    }

    fn error_codes(resp: &DescribeGroupsResponse, out: &mut Vec<i16>) {
        out.extend(resp.groups.iter().map(|g| g.error_code));
    }
}
