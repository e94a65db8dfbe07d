//! LeaveGroup (13): members leave a classic group (several at once from v3).

use std::rc::Rc;

use kafka_protocol::messages::{ApiKey, LeaveGroupRequest, LeaveGroupResponse};
use kafka_protocol::ResponseError;

use super::{to_coordinator, Handler, Reply, RequestCtx};

pub(crate) struct LeaveGroup;

impl Handler for LeaveGroup {
    const KEY: ApiKey = ApiKey::LeaveGroup;
    const MIN: i16 = 0;
    const MAX: i16 = 5;
    type Request = LeaveGroupRequest;
    type Response = LeaveGroupResponse;

    async fn handle(ctx: Rc<RequestCtx>, req: LeaveGroupRequest) -> Reply<LeaveGroupResponse> {
        let fallback =
            LeaveGroupResponse::default().with_error_code(ResponseError::CoordinatorNotAvailable.code());
        to_coordinator(&ctx, req, fallback).await
    }

    fn error_codes(resp: &LeaveGroupResponse, out: &mut Vec<i16>) {
        out.push(resp.error_code);
        out.extend(resp.members.iter().map(|m| m.error_code));
    }
}
