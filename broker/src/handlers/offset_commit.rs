//! OffsetCommit (8): stores a group's consumed offsets in `__consumer_offsets`; answered once
//! durable.

use std::rc::Rc;

use kafka_protocol::messages::{ApiKey, OffsetCommitRequest, OffsetCommitResponse};
use kafka_protocol::ResponseError;

use super::{to_coordinator, Handler, Reply, RequestCtx};
use crate::group::every_partition_refused;

pub(crate) struct OffsetCommit;

impl Handler for OffsetCommit {
    const KEY: ApiKey = ApiKey::OffsetCommit;
    const MIN: i16 = 2;
    const MAX: i16 = 9;
    type Request = OffsetCommitRequest;
    type Response = OffsetCommitResponse;

    async fn handle(ctx: Rc<RequestCtx>, req: OffsetCommitRequest) -> Reply<OffsetCommitResponse> {
        // Without a coordinator answer every partition gets COORDINATOR_NOT_AVAILABLE.
        let fallback = every_partition_refused(&req, ResponseError::CoordinatorNotAvailable.code());
        to_coordinator(&ctx, req, fallback).await
    }

    fn error_codes(resp: &OffsetCommitResponse, out: &mut Vec<i16>) {
        out.extend(
            resp.topics
                .iter()
                .flat_map(|t| t.partitions.iter().map(|p| p.error_code)),
        );
    }
}
