//! Heartbeat (12): keeps a classic member alive and tells it about rebalances.

use std::rc::Rc;

use futures::FutureExt;
use kafka_protocol::messages::{ApiKey, HeartbeatRequest, HeartbeatResponse};
use kafka_protocol::ResponseError;

use super::{group_call, Handler, Reply, RequestCtx};
use crate::group::{GroupRequest, GroupResponse};

pub(crate) struct Heartbeat;

impl Handler for Heartbeat {
    const KEY: ApiKey = ApiKey::Heartbeat;
    const MIN: i16 = 0;
    const MAX: i16 = 4;
    type Request = HeartbeatRequest;
    type Response = HeartbeatResponse;

    async fn handle(ctx: Rc<RequestCtx>, req: HeartbeatRequest) -> Reply<HeartbeatResponse> {
        let group = req.group_id.0.as_str().to_owned();
        let fallback =
            HeartbeatResponse::default().with_error_code(ResponseError::CoordinatorNotAvailable.code());
        let answer = group_call(&ctx, &group, GroupRequest::Heartbeat(req)).await;
        Reply::Later(
            async move {
                match answer.await {
                    Some(GroupResponse::Heartbeat(r)) => r,
                    _ => fallback,
                }
            }
            .boxed_local(),
        )
    }

    fn error_codes(resp: &HeartbeatResponse, out: &mut Vec<i16>) {
        out.push(resp.error_code);
    }
}
