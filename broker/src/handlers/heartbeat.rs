//! Heartbeat (12): keeps a classic member alive and tells it about rebalances.

use std::rc::Rc;

use kafka_protocol::messages::{ApiKey, HeartbeatRequest, HeartbeatResponse};
use kafka_protocol::ResponseError;

use super::{to_coordinator, Handler, Reply, RequestCtx};

pub(crate) struct Heartbeat;

impl Handler for Heartbeat {
    const KEY: ApiKey = ApiKey::Heartbeat;
    const MIN: i16 = 0;
    const MAX: i16 = 4;
    type Request = HeartbeatRequest;
    type Response = HeartbeatResponse;

    async fn handle(ctx: Rc<RequestCtx>, req: HeartbeatRequest) -> Reply<HeartbeatResponse> {
        let fallback =
            HeartbeatResponse::default().with_error_code(ResponseError::CoordinatorNotAvailable.code());
        to_coordinator(&ctx, req, fallback).await
    }

    fn error_codes(resp: &HeartbeatResponse, out: &mut Vec<i16>) {
        out.push(resp.error_code);
    }
}
