//! DeleteGroups (42): deletes empty groups and their offsets, per coordinator shard. A share
//! group (KIP-932; `kafka-share-groups.sh --delete` sends DeleteGroups) is deleted by its share
//! coordinator, if it has no members (NON_EMPTY_GROUP otherwise), and then its share state goes
//! on every shard, as DeleteShareGroupOffsets of every topic would remove it.

use std::rc::Rc;

use kafka_protocol::messages::{ApiKey, DeleteGroupsRequest, DeleteGroupsResponse};
use kafka_protocol::ResponseError;

use super::describe_share_group_offsets::on_every_shard;
use super::{Handler, Reply, RequestCtx};
use crate::group::route::per_group;
use crate::queue::doors::kafka_share::group::{ShareAnswer, ShareOp};
use crate::queue::host::QueueOp;

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
            r.error_code = delete_share_group(&ctx, r.group_id.0.as_str()).await;
        }
        Reply::Now(DeleteGroupsResponse::default().with_results(results))
    }

    fn error_codes(resp: &DeleteGroupsResponse, out: &mut Vec<i16>) {
        out.extend(resp.results.iter().map(|g| g.error_code));
    }
}

/// Deletes share group `group` and its share state; the error code of its result
/// (GROUP_ID_NOT_FOUND if there is no share group of that id either).
async fn delete_share_group(ctx: &RequestCtx, group: &str) -> i16 {
    let shard = &ctx.shard;
    let owner = crate::queue::doors::kafka_share::group::coordinator_of(shard, group);
    let op = ShareOp::Delete {
        group: group.to_owned(),
    };
    match crate::queue::doors::kafka_share::group::call(shard, owner, op)
        .await
        .await
    {
        Some(ShareAnswer::Deleted(Ok(()))) => {}
        Some(ShareAnswer::Deleted(Err(e))) => return e.code(),
        _ => return ResponseError::CoordinatorNotAvailable.code(),
    }
    let topics: Vec<String> = shard.metadata().topics().map(|t| t.name.clone()).collect();
    let done = on_every_shard(shard, || QueueOp::ShareDeleteState {
        group: group.to_owned(),
        topics: topics.clone(),
    })
    .await;
    tracing::info!(group, "share group deleted");
    match done {
        Some(_) => 0,
        // The group is gone; some state may be left (a retry answers GROUP_ID_NOT_FOUND, and
        // DeleteShareGroupOffsets needs a group): say so rather than claim success.
        None => ResponseError::CoordinatorNotAvailable.code(),
    }
}
