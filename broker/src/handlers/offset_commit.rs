//! OffsetCommit (8): stores a group's consumed offsets in `__consumer_offsets`; answered once
//! durable.

use std::rc::Rc;

use kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use kafka_protocol::messages::{ApiKey, OffsetCommitRequest, OffsetCommitResponse};
use kafka_protocol::ResponseError;

use super::{to_coordinator, Handler, Reply, RequestCtx};

pub(crate) struct OffsetCommit;

impl Handler for OffsetCommit {
    const KEY: ApiKey = ApiKey::OffsetCommit;
    const MIN: i16 = 2;
    const MAX: i16 = 9;
    type Request = OffsetCommitRequest;
    type Response = OffsetCommitResponse;

    async fn handle(ctx: Rc<RequestCtx>, req: OffsetCommitRequest) -> Reply<OffsetCommitResponse> {
        // Without a coordinator answer every partition gets COORDINATOR_NOT_AVAILABLE.
        let fallback = OffsetCommitResponse::default().with_topics(
            req.topics
                .iter()
                .map(|t| {
                    OffsetCommitResponseTopic::default()
                        .with_name(t.name.clone())
                        .with_partitions(
                            t.partitions
                                .iter()
                                .map(|p| {
                                    OffsetCommitResponsePartition::default()
                                        .with_partition_index(p.partition_index)
                                        .with_error_code(ResponseError::CoordinatorNotAvailable.code())
                                })
                                .collect(),
                        )
                })
                .collect(),
        );
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
