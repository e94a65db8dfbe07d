//! JoinGroup (11): classic group membership; the answer comes when the rebalance completes.

use std::rc::Rc;

use kafka_protocol::messages::{ApiKey, JoinGroupRequest, JoinGroupResponse};
use kafka_protocol::ResponseError;

use super::{to_coordinator, Handler, Reply, RequestCtx};

pub(crate) struct JoinGroup;

impl Handler for JoinGroup {
    const KEY: ApiKey = ApiKey::JoinGroup;
    const MIN: i16 = 0;
    const MAX: i16 = 9;
    type Request = JoinGroupRequest;
    type Response = JoinGroupResponse;

    async fn handle(ctx: Rc<RequestCtx>, req: JoinGroupRequest) -> Reply<JoinGroupResponse> {
        let fallback = JoinGroupResponse::default()
            .with_error_code(ResponseError::CoordinatorNotAvailable.code())
            .with_generation_id(-1);
        to_coordinator(&ctx, req, fallback).await
    }

    fn error_codes(resp: &JoinGroupResponse, out: &mut Vec<i16>) {
        out.push(resp.error_code);
    }
}
