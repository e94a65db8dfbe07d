//! DeleteRecords (21): moves partitions' log start offsets forward (-1: to the high watermark);
//! whole segments below the new start are deleted.

use std::rc::Rc;

use kafka_protocol::messages::delete_records_response::{
    DeleteRecordsPartitionResult, DeleteRecordsTopicResult,
};
use kafka_protocol::messages::{ApiKey, DeleteRecordsRequest, DeleteRecordsResponse};
use kafka_protocol::ResponseError;

use super::{Handler, Reply, RequestCtx};
use crate::ops::{PartRef, ShardRequest, ShardResponse};
use crate::shard::scatter;

pub(crate) struct DeleteRecords;

impl Handler for DeleteRecords {
    const KEY: ApiKey = ApiKey::DeleteRecords;
    const MIN: i16 = 0;
    const MAX: i16 = 2;
    type Request = DeleteRecordsRequest;
    type Response = DeleteRecordsResponse;

    async fn handle(ctx: Rc<RequestCtx>, req: DeleteRecordsRequest) -> Reply<DeleteRecordsResponse> {
        let md = ctx.shard.metadata();
        let unknown = (ResponseError::UnknownTopicOrPartition.code(), -1i64);
        let mut items = Vec::new();
        let mut slots = Vec::new();
        for t in &req.topics {
            let meta = md.topic(t.name.0.as_str());
            for p in &t.partitions {
                match meta {
                    Some(m) if p.partition_index >= 0 && p.partition_index < m.partitions => {
                        if p.offset < -1 {
                            slots.push(Err((ResponseError::OffsetOutOfRange.code(), -1)));
                            continue;
                        }
                        slots.push(Ok(items.len()));
                        items.push((
                            PartRef {
                                topic: m.name.clone(),
                                partition: p.partition_index,
                            },
                            p.offset,
                        ));
                    }
                    _ => slots.push(Err(unknown)),
                }
            }
        }
        let answers = scatter(
            &ctx.shard,
            items,
            ShardRequest::DeleteRecords,
            |r| match r {
                ShardResponse::DeleteRecords(v) => Some(v),
                _ => None,
            },
            (ResponseError::UnknownServerError.code(), -1),
        )
        .await;
        let mut slots = slots.into_iter();
        let topics = req
            .topics
            .iter()
            .map(|t| {
                let partitions = t
                    .partitions
                    .iter()
                    .map(|p| {
                        let (error, low) = match slots.next() {
                            Some(Ok(i)) => answers.get(i).copied().unwrap_or(unknown),
                            Some(Err(e)) => e,
                            None => unknown,
                        };
                        DeleteRecordsPartitionResult::default()
                            .with_partition_index(p.partition_index)
                            .with_error_code(error)
                            .with_low_watermark(low)
                    })
                    .collect();
                DeleteRecordsTopicResult::default()
                    .with_name(t.name.clone())
                    .with_partitions(partitions)
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
