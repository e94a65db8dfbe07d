//! JoinGroup (11): classic group membership; the answer comes when the rebalance completes.

use std::rc::Rc;

use futures::FutureExt;
use kafka_protocol::messages::{ApiKey, JoinGroupRequest, JoinGroupResponse};
use kafka_protocol::ResponseError;

use super::{group_call, Handler, Reply, RequestCtx};
use crate::group::{GroupRequest, GroupResponse};

pub(crate) struct JoinGroup;

impl Handler for JoinGroup {
    const KEY: ApiKey = ApiKey::JoinGroup;
    const MIN: i16 = 0;
    const MAX: i16 = 9;
    type Request = JoinGroupRequest;
    type Response = JoinGroupResponse;

    async fn handle(ctx: Rc<RequestCtx>, req: JoinGroupRequest) -> Reply<JoinGroupResponse> {
        let group = req.group_id.0.as_str().to_owned();
        let fallback = JoinGroupResponse::default()
            .with_error_code(ResponseError::CoordinatorNotAvailable.code())
            .with_generation_id(-1);
        let answer = group_call(&ctx, &group, GroupRequest::JoinGroup(req)).await;
        Reply::Later(
            async move {
                match answer.await {
                    Some(GroupResponse::JoinGroup(r)) => r,
                    _ => fallback,
                }
            }
            .boxed_local(),
        )
    }

    fn error_codes(resp: &JoinGroupResponse, out: &mut Vec<i16>) {
        out.push(resp.error_code);
    }
}
