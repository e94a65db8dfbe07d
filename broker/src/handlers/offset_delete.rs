//! OffsetDelete (47): removes a group's committed offsets of some partitions.

use std::rc::Rc;

use futures::FutureExt;
use kafka_protocol::messages::{ApiKey, OffsetDeleteRequest, OffsetDeleteResponse};
use kafka_protocol::ResponseError;

use super::{group_call, Handler, Reply, RequestCtx};
use crate::group::{GroupRequest, GroupResponse};

pub(crate) struct OffsetDelete;

impl Handler for OffsetDelete {
    const KEY: ApiKey = ApiKey::OffsetDelete;
    const MIN: i16 = 0;
    const MAX: i16 = 0;
    type Request = OffsetDeleteRequest;
    type Response = OffsetDeleteResponse;

    async fn handle(ctx: Rc<RequestCtx>, req: OffsetDeleteRequest) -> Reply<OffsetDeleteResponse> {
        let group = req.group_id.0.as_str().to_owned();
        let fallback =
            OffsetDeleteResponse::default().with_error_code(ResponseError::CoordinatorNotAvailable.code());
        let answer = group_call(&ctx, &group, GroupRequest::OffsetDelete(req)).await;
        Reply::Later(
            async move {
                match answer.await {
                    Some(GroupResponse::OffsetDelete(r)) => r,
                    _ => fallback,
                }
            }
            .boxed_local(),
        )
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
