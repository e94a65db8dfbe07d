//! ConsumerGroupHeartbeat (68): KIP-848 membership with server-side assignment.

use std::rc::Rc;

use kafka_protocol::messages::{ApiKey, ConsumerGroupHeartbeatRequest, ConsumerGroupHeartbeatResponse};
use kafka_protocol::ResponseError;

use super::{to_coordinator, Handler, Reply, RequestCtx};

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
        let fallback = ConsumerGroupHeartbeatResponse::default()
            .with_error_code(ResponseError::CoordinatorNotAvailable.code());
        to_coordinator(&ctx, req, fallback).await
    }

    fn error_codes(resp: &ConsumerGroupHeartbeatResponse, out: &mut Vec<i16>) {
        out.push(resp.error_code);
    }
}
