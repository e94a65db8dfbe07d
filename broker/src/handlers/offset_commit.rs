//! OffsetCommit (8): stores a group's consumed offsets in `__consumer_offsets`; answered once
//! durable.

use std::rc::Rc;

use futures::FutureExt;
use kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use kafka_protocol::messages::{ApiKey, OffsetCommitRequest, OffsetCommitResponse};
use kafka_protocol::ResponseError;

use super::{group_call, Handler, Reply, RequestCtx};
use crate::group::{GroupRequest, GroupResponse};

pub(crate) struct OffsetCommit;

impl Handler for OffsetCommit {
    const KEY: ApiKey = ApiKey::OffsetCommit;
    const MIN: i16 = 2;
    const MAX: i16 = 9;
    type Request = OffsetCommitRequest;
    type Response = OffsetCommitResponse;

    async fn handle(ctx: Rc<RequestCtx>, req: OffsetCommitRequest) -> Reply<OffsetCommitResponse> {
        let group = req.group_id.0.as_str().to_owned();
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
        let answer = group_call(&ctx, &group, GroupRequest::OffsetCommit(req)).await;
        Reply::Later(
            async move {
                match answer.await {
                    Some(GroupResponse::OffsetCommit(r)) => r,
                    _ => fallback,
                }
            }
            .boxed_local(),
        )
    }

    fn error_codes(resp: &OffsetCommitResponse, out: &mut Vec<i16>) {
        out.extend(
            resp.topics
                .iter()
                .flat_map(|t| t.partitions.iter().map(|p| p.error_code)),
        );
    }
}
