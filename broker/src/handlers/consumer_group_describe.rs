//! ConsumerGroupDescribe (69): KIP-848 groups with their members and assignments, per
//! coordinator shard, merged in request order.

use std::rc::Rc;

use kafka_protocol::messages::consumer_group_describe_response::DescribedGroup;
use kafka_protocol::messages::{
    ApiKey, ConsumerGroupDescribeRequest, ConsumerGroupDescribeResponse, GroupId,
};
use kafka_protocol::ResponseError;

use super::{group_scatter, str_bytes, Handler, Reply, RequestCtx};
use crate::group::{GroupRequest, GroupResponse};

pub(crate) struct ConsumerGroupDescribe;

impl Handler for ConsumerGroupDescribe {
    const KEY: ApiKey = ApiKey::ConsumerGroupDescribe;
    const MIN: i16 = 0;
    const MAX: i16 = 1;
    type Request = ConsumerGroupDescribeRequest;
    type Response = ConsumerGroupDescribeResponse;

    async fn handle(
        ctx: Rc<RequestCtx>,
        req: ConsumerGroupDescribeRequest,
    ) -> Reply<ConsumerGroupDescribeResponse> {
        let order: Vec<String> = req.group_ids.iter().map(|g| g.0.as_str().to_owned()).collect();
        let parts = group_scatter(&ctx, order.clone(), false, |subset| {
            let mut sub = req.clone();
            sub.group_ids = subset.iter().map(|g| GroupId(str_bytes(g))).collect();
            GroupRequest::ConsumerGroupDescribe(sub)
        })
        .await;
        let mut answered: Vec<DescribedGroup> = Vec::new();
        for (subset, answer) in parts {
            match answer {
                Some(GroupResponse::ConsumerGroupDescribe(r)) => answered.extend(r.groups),
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
        Reply::Now(ConsumerGroupDescribeResponse::default().with_groups(groups))
    }

    fn error_codes(resp: &ConsumerGroupDescribeResponse, out: &mut Vec<i16>) {
        out.extend(resp.groups.iter().map(|g| g.error_code));
    }
}
