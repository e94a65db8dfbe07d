//! DeleteRecords (21): moves partitions' log start offsets forward (-1: to the high watermark);
//! whole segments below the new start are deleted.

use std::rc::Rc;

use kafka_protocol::messages::delete_records_response::{
    DeleteRecordsPartitionResult, DeleteRecordsTopicResult,
};
use kafka_protocol::messages::{ApiKey, DeleteRecordsRequest, DeleteRecordsResponse};
use kafka_protocol::ResponseError;

use super::{per_partition, Handler, Reply, RequestCtx};
use crate::shard::ops::{ShardRequest, ShardResponse};

pub(crate) struct DeleteRecords;

impl Handler for DeleteRecords {
    const KEY: ApiKey = ApiKey::DeleteRecords;
    const MIN: i16 = 0;
    const MAX: i16 = 2;
    type Request = DeleteRecordsRequest;
    type Response = DeleteRecordsResponse;

    async fn handle(ctx: Rc<RequestCtx>, req: DeleteRecordsRequest) -> Reply<DeleteRecordsResponse> {
        let unknown = (ResponseError::UnknownTopicOrPartition.code(), -1i64);
        // -1 means the high watermark; the owner refuses other negative offsets (out of range).
        let requested = req
            .topics
            .iter()
            .map(|t| {
                let parts = t.partitions.iter().map(|p| (p.partition_index, p.offset));
                (t.name.0.as_str(), parts.collect())
            })
            .collect();
        let answers = per_partition(
            &ctx,
            requested,
            unknown,
            ShardRequest::DeleteRecords,
            |r| match r {
                ShardResponse::DeleteRecords(v) => Some(v),
                _ => None,
            },
            (ResponseError::UnknownServerError.code(), -1),
        )
        .await;
        let topics = req
            .topics
            .iter()
            .zip(answers)
            .map(|(t, answers)| {
                let partitions = t.partitions.iter().zip(answers).map(|(p, (error, low))| {
                    DeleteRecordsPartitionResult::default()
                        .with_partition_index(p.partition_index)
                        .with_error_code(error)
                        .with_low_watermark(low)
                });
                DeleteRecordsTopicResult::default()
                    .with_name(t.name.clone())
                    .with_partitions(partitions.collect())
            })
            .collect();
        Reply::Now(DeleteRecordsResponse::default().with_topics(topics))
    }

    fn error_codes(resp: &DeleteRecordsResponse, out: &mut Vec<i16>) {
        for t in &resp.topics {
            for p in &t.partitions {
                out.push(p.error_code);
            }
        }
    }
}
