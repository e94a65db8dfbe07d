//! ListGroups (16): every shard's group coordinator lists its classic and consumer groups and
//! every shard's share coordinator its share groups (type "share"), with the state and type
//! filters of v4/v5; the lists are concatenated.

use std::rc::Rc;

use kafka_protocol::messages::{ApiKey, ListGroupsRequest, ListGroupsResponse};
use kafka_protocol::ResponseError;

use super::{Handler, Reply, RequestCtx};
use crate::group::{GroupRequest, GroupResponse};
use crate::queue::doors::kafka_share::group::{ShareAnswer, ShareOp};
use strand_protocol::types::ShardId;

pub(crate) struct ListGroups;

impl Handler for ListGroups {
    const KEY: ApiKey = ApiKey::ListGroups;
    const MIN: i16 = 0;
    const MAX: i16 = 5;
    type Request = ListGroupsRequest;
    type Response = ListGroupsResponse;

    async fn handle(ctx: Rc<RequestCtx>, req: ListGroupsRequest) -> Reply<ListGroupsResponse> {
        let states: Vec<String> = if ctx.version >= 4 {
            req.states_filter.iter().map(|s| s.to_lowercase()).collect()
        } else {
            Vec::new()
        };
        let types: Vec<String> = if ctx.version >= 5 {
            req.types_filter.iter().map(|s| s.to_lowercase()).collect()
        } else {
            Vec::new()
        };
        Reply::Now(list(&ctx, &req, states, types).await)
    }

    fn error_codes(resp: &ListGroupsResponse, out: &mut Vec<i16>) {
        out.push(resp.error_code);
    }
}

/// The groups of every coordinator on this node (classic, consumer and share), sorted by id,
/// with the filters given (lower case; empty: all), answered as ListGroups of the request's
/// version.
pub(super) async fn list(
    ctx: &RequestCtx,
    req: &ListGroupsRequest,
    states: Vec<String>,
    types: Vec<String>,
) -> ListGroupsResponse {
    let mut share_calls = Vec::new();
    for s in 0..ctx.shard.shards {
        let op = ShareOp::List {
            states: states.clone(),
            types: types.clone(),
            version: ctx.version,
        };
        share_calls.push(crate::queue::doors::kafka_share::group::call(&ctx.shard, ShardId(s), op).await);
    }
    let parts = crate::group::route::scatter(&ctx.shard, &ctx.group_meta(), Vec::new(), true, |_| {
        GroupRequest::ListGroups(req.clone())
    })
    .await;
    let mut resp = ListGroupsResponse::default();
    for answer in futures::future::join_all(share_calls).await {
        match answer {
            Some(ShareAnswer::List(groups)) => resp.groups.extend(groups),
            _ => {
                if resp.error_code == 0 {
                    resp.error_code = ResponseError::CoordinatorNotAvailable.code();
                }
            }
        }
    }
    for (_, answer) in parts {
        match answer {
            Some(GroupResponse::ListGroups(r)) => {
                if resp.error_code == 0 {
                    resp.error_code = r.error_code;
                }
                resp.groups.extend(r.groups);
            }
            _ => {
                if resp.error_code == 0 {
                    resp.error_code = ResponseError::CoordinatorNotAvailable.code();
                }
            }
        }
    }
    resp.groups
        .sort_by(|a, b| a.group_id.0.as_str().cmp(b.group_id.0.as_str()));
    resp
}
