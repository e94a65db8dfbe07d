//! DeleteGroups (42): deletes empty groups and their offsets, per coordinator shard. A share
//! group (KIP-932; `kafka-share-groups.sh --delete` sends DeleteGroups) is deleted by its share
//! coordinator, if it has no members (NON_EMPTY_GROUP otherwise), and then its share state goes
//! on every shard, as DeleteShareGroupOffsets of every topic would remove it.

use std::rc::Rc;

use kafka_protocol::messages::{ApiKey, DeleteGroupsRequest, DeleteGroupsResponse};
use kafka_protocol::ResponseError;

use super::{Handler, Reply, RequestCtx};
use crate::group::route::per_group;
use crate::queue::doors::kafka_share::delete_group;

pub(crate) struct DeleteGroups;

impl Handler for DeleteGroups {
    const KEY: ApiKey = ApiKey::DeleteGroups;
    const MIN: i16 = 0;
    const MAX: i16 = 2;
    type Request = DeleteGroupsRequest;
    type Response = DeleteGroupsResponse;

    async fn handle(ctx: Rc<RequestCtx>, req: DeleteGroupsRequest) -> Reply<DeleteGroupsResponse> {
        let mut results = per_group(&ctx.shard, &ctx.group_meta(), &req).await;
        // Not a classic or consumer group: perhaps a share group.
        for r in results
            .iter_mut()
            .filter(|r| r.error_code == ResponseError::GroupIdNotFound.code())
        {
            r.error_code = delete_group(&ctx.shard, r.group_id.0.as_str()).await;
        }
        Reply::Now(DeleteGroupsResponse::default().with_results(results))
    }

    fn error_codes(resp: &DeleteGroupsResponse, out: &mut Vec<i16>) {
        out.extend(resp.results.iter().map(|g| g.error_code));
    }
}
