//! ListGroups (16): every shard's coordinator lists its groups (with the state and type filters
//! of v4/v5); the lists are concatenated.

use std::rc::Rc;

use kafka_protocol::messages::{ApiKey, ListGroupsRequest, ListGroupsResponse};
use kafka_protocol::ResponseError;

use super::{group_scatter, Handler, Reply, RequestCtx};
use crate::group::{GroupRequest, GroupResponse};

pub(crate) struct ListGroups;

impl Handler for ListGroups {
    const KEY: ApiKey = ApiKey::ListGroups;
    const MIN: i16 = 0;
    const MAX: i16 = 5;
    type Request = ListGroupsRequest;
    type Response = ListGroupsResponse;

    async fn handle(ctx: Rc<RequestCtx>, req: ListGroupsRequest) -> Reply<ListGroupsResponse> {
        let parts = group_scatter(&ctx, Vec::new(), true, |_| GroupRequest::ListGroups(req.clone())).await;
        let mut resp = ListGroupsResponse::default();
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
        Reply::Now(resp)
    }

    fn error_codes(resp: &ListGroupsResponse, out: &mut Vec<i16>) {
        out.push(resp.error_code);
    }
}
