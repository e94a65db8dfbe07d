//! LeaveGroup (13): members leave a classic group (several at once from v3).

use std::rc::Rc;

use futures::FutureExt;
use kafka_protocol::messages::{ApiKey, LeaveGroupRequest, LeaveGroupResponse};
use kafka_protocol::ResponseError;

use super::{group_call, Handler, Reply, RequestCtx};
use crate::group::{GroupRequest, GroupResponse};

pub(crate) struct LeaveGroup;

impl Handler for LeaveGroup {
    const KEY: ApiKey = ApiKey::LeaveGroup;
    const MIN: i16 = 0;
    const MAX: i16 = 5;
    type Request = LeaveGroupRequest;
    type Response = LeaveGroupResponse;

    async fn handle(ctx: Rc<RequestCtx>, req: LeaveGroupRequest) -> Reply<LeaveGroupResponse> {
        let group = req.group_id.0.as_str().to_owned();
        let fallback =
            LeaveGroupResponse::default().with_error_code(ResponseError::CoordinatorNotAvailable.code());
        let answer = group_call(&ctx, &group, GroupRequest::LeaveGroup(req)).await;
        Reply::Later(
            async move {
                match answer.await {
                    Some(GroupResponse::LeaveGroup(r)) => r,
                    _ => fallback,
                }
            }
            .boxed_local(),
        )
    }

    fn error_codes(resp: &LeaveGroupResponse, out: &mut Vec<i16>) {
        out.push(resp.error_code);
        out.extend(resp.members.iter().map(|m| m.error_code));
    }
}
