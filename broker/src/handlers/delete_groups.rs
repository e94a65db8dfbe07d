//! DeleteGroups (42): deletes empty groups and their offsets, per coordinator shard.

use std::rc::Rc;

use kafka_protocol::messages::delete_groups_response::DeletableGroupResult;
use kafka_protocol::messages::{ApiKey, DeleteGroupsRequest, DeleteGroupsResponse, GroupId};
use kafka_protocol::ResponseError;

use super::{group_scatter, str_bytes, Handler, Reply, RequestCtx};
use crate::group::{GroupRequest, GroupResponse};

pub(crate) struct DeleteGroups;

impl Handler for DeleteGroups {
    const KEY: ApiKey = ApiKey::DeleteGroups;
    const MIN: i16 = 0;
    const MAX: i16 = 2;
    type Request = DeleteGroupsRequest;
    type Response = DeleteGroupsResponse;

    async fn handle(ctx: Rc<RequestCtx>, req: DeleteGroupsRequest) -> Reply<DeleteGroupsResponse> {
        let order: Vec<String> = req.groups_names.iter().map(|g| g.0.as_str().to_owned()).collect();
        let parts = group_scatter(&ctx, order.clone(), false, |subset| {
            let mut sub = req.clone();
            sub.groups_names = subset.iter().map(|g| GroupId(str_bytes(g))).collect();
            GroupRequest::DeleteGroups(sub)
        })
        .await;
        let mut answered: Vec<DeletableGroupResult> = Vec::new();
        for (subset, answer) in parts {
            match answer {
                Some(GroupResponse::DeleteGroups(r)) => answered.extend(r.results),
                _ => answered.extend(subset.into_iter().map(|g| {
                    DeletableGroupResult::default()
                        .with_group_id(GroupId(str_bytes(&g)))
                        .with_error_code(ResponseError::CoordinatorNotAvailable.code())
                })),
            }
        }
        let results = order
            .iter()
            .filter_map(|g| {
                answered
                    .iter()
                    .position(|a| a.group_id.0.as_str() == g)
                    .map(|i| answered.swap_remove(i))
            })
            .collect();
        Reply::Now(DeleteGroupsResponse::default().with_results(results))
    }

    fn error_codes(resp: &DeleteGroupsResponse, out: &mut Vec<i16>) {
        out.extend(resp.results.iter().map(|g| g.error_code));
    }
}
