//! OffsetDelete (47): removes a group's committed offsets of some partitions.

use std::rc::Rc;

use kafka_protocol::messages::{ApiKey, OffsetDeleteRequest, OffsetDeleteResponse};
use kafka_protocol::ResponseError;

use super::{to_coordinator, Handler, Reply, RequestCtx};

pub(crate) struct OffsetDelete;

impl Handler for OffsetDelete {
    const KEY: ApiKey = ApiKey::OffsetDelete;
    const MIN: i16 = 0;
    const MAX: i16 = 0;
    type Request = OffsetDeleteRequest;
    type Response = OffsetDeleteResponse;

    async fn handle(ctx: Rc<RequestCtx>, req: OffsetDeleteRequest) -> Reply<OffsetDeleteResponse> {
        let fallback =
            OffsetDeleteResponse::default().with_error_code(ResponseError::CoordinatorNotAvailable.code());
        to_coordinator(&ctx, req, fallback).await
    }

    fn error_codes(resp: &OffsetDeleteResponse, out: &mut Vec<i16>) {
        out.push(resp.error_code);
        out.extend(
            resp.topics
                .iter()
                .flat_map(|t| t.partitions.iter().map(|p| p.error_code)),
        );
    }
}
