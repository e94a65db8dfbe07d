//! SyncGroup (14): the leader hands out assignments; followers wait for them.

use std::rc::Rc;

use kafka_protocol::messages::{ApiKey, SyncGroupRequest, SyncGroupResponse};
use kafka_protocol::ResponseError;

use super::{to_coordinator, Handler, Reply, RequestCtx};

pub(crate) struct SyncGroup;

impl Handler for SyncGroup {
    const KEY: ApiKey = ApiKey::SyncGroup;
    const MIN: i16 = 0;
    const MAX: i16 = 5;
    type Request = SyncGroupRequest;
    type Response = SyncGroupResponse;

    async fn handle(ctx: Rc<RequestCtx>, req: SyncGroupRequest) -> Reply<SyncGroupResponse> {
        let fallback =
            SyncGroupResponse::default().with_error_code(ResponseError::CoordinatorNotAvailable.code());
        to_coordinator(&ctx, req, fallback).await
    }

    fn error_codes(resp: &SyncGroupResponse, out: &mut Vec<i16>) {
        out.push(resp.error_code);
    }
}
