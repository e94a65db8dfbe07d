//! SyncGroup (14): the leader hands out assignments; followers wait for them.

use std::rc::Rc;

use futures::FutureExt;
use kafka_protocol::messages::{ApiKey, SyncGroupRequest, SyncGroupResponse};
use kafka_protocol::ResponseError;

use super::{group_call, Handler, Reply, RequestCtx};
use crate::group::{GroupRequest, GroupResponse};

pub(crate) struct SyncGroup;

impl Handler for SyncGroup {
    const KEY: ApiKey = ApiKey::SyncGroup;
    const MIN: i16 = 0;
    const MAX: i16 = 5;
    type Request = SyncGroupRequest;
    type Response = SyncGroupResponse;

    async fn handle(ctx: Rc<RequestCtx>, req: SyncGroupRequest) -> Reply<SyncGroupResponse> {
        let group = req.group_id.0.as_str().to_owned();
        let fallback =
            SyncGroupResponse::default().with_error_code(ResponseError::CoordinatorNotAvailable.code());
        let answer = group_call(&ctx, &group, GroupRequest::SyncGroup(req)).await;
        Reply::Later(
            async move {
                match answer.await {
                    Some(GroupResponse::SyncGroup(r)) => r,
                    _ => fallback,
                }
            }
            .boxed_local(),
        )
    }

    fn error_codes(resp: &SyncGroupResponse, out: &mut Vec<i16>) {
        out.push(resp.error_code);
    }
}
