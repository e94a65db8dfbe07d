//! ConsumerGroupDescribe (69): KIP-848 groups with their members and assignments, per
//! coordinator shard, merged in request order.

use std::rc::Rc;

use kafka_protocol::messages::{ApiKey, ConsumerGroupDescribeRequest, ConsumerGroupDescribeResponse};

use super::{Handler, Reply, RequestCtx};
use crate::group::route::per_group;

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
        let groups = per_group(&ctx.shard, &ctx.group_meta(), &req).await;
        Reply::Now(ConsumerGroupDescribeResponse::default().with_groups(groups))
    }

    fn error_codes(resp: &ConsumerGroupDescribeResponse, out: &mut Vec<i16>) {
        out.extend(resp.groups.iter().map(|g| g.error_code));
    }
}
