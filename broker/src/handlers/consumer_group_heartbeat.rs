//! ConsumerGroupHeartbeat (68): KIP-848 membership with server-side assignment.

use std::rc::Rc;

use futures::FutureExt;
use kafka_protocol::messages::{ApiKey, ConsumerGroupHeartbeatRequest, ConsumerGroupHeartbeatResponse};
use kafka_protocol::ResponseError;

use super::{group_call, Handler, Reply, RequestCtx};
use crate::group::{GroupRequest, GroupResponse};

pub(crate) struct ConsumerGroupHeartbeat;

impl Handler for ConsumerGroupHeartbeat {
    const KEY: ApiKey = ApiKey::ConsumerGroupHeartbeat;
    const MIN: i16 = 0;
    const MAX: i16 = 1;
    type Request = ConsumerGroupHeartbeatRequest;
    type Response = ConsumerGroupHeartbeatResponse;

    async fn handle(
        ctx: Rc<RequestCtx>,
        req: ConsumerGroupHeartbeatRequest,
    ) -> Reply<ConsumerGroupHeartbeatResponse> {
        let group = req.group_id.0.as_str().to_owned();
        let fallback = ConsumerGroupHeartbeatResponse::default()
            .with_error_code(ResponseError::CoordinatorNotAvailable.code());
        let answer = group_call(&ctx, &group, GroupRequest::ConsumerGroupHeartbeat(req)).await;
        Reply::Later(
            async move {
                match answer.await {
                    Some(GroupResponse::ConsumerGroupHeartbeat(r)) => r,
                    _ => fallback,
                }
            }
            .boxed_local(),
        )
    }

    fn error_codes(resp: &ConsumerGroupHeartbeatResponse, out: &mut Vec<i16>) {
        out.push(resp.error_code);
    }
}
