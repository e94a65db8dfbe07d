//! ListOffsets (2): earliest (-2), latest (-1), max timestamp (-3), earliest local (-4),
//! earliest pending upload (-5), latest tiered (-6), or the first offset at or after a timestamp.

use std::rc::Rc;

use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use kafka_protocol::messages::{ApiKey, ListOffsetsRequest, ListOffsetsResponse};
use kafka_protocol::ResponseError;

use super::{per_partition, Handler, Reply, RequestCtx};
use crate::shard::ops::{ListOffsetsOutcome, ListOffsetsPart, ShardRequest, ShardResponse};

pub(crate) struct ListOffsets;

impl Handler for ListOffsets {
    const KEY: ApiKey = ApiKey::ListOffsets;
    const MIN: i16 = 1;
    const MAX: i16 = 10;
    type Request = ListOffsetsRequest;
    type Response = ListOffsetsResponse;

    async fn handle(ctx: Rc<RequestCtx>, req: ListOffsetsRequest) -> Reply<ListOffsetsResponse> {
        let version = ctx.version;
        let fail = |e: ResponseError| ListOffsetsOutcome {
            error: e.code(),
            timestamp: -1,
            offset: -1,
            leader_epoch: -1,
        };
        let requested = req
            .topics
            .iter()
            .map(|t| {
                let parts = t.partitions.iter();
                let parts = parts.map(|p| (p.partition_index, (p.timestamp, p.current_leader_epoch)));
                (t.name.0.as_str(), parts.collect())
            })
            .collect();
        let answers = per_partition(
            &ctx,
            requested,
            fail(ResponseError::UnknownTopicOrPartition),
            |list| {
                ShardRequest::ListOffsets(
                    list.into_iter()
                        .map(|(part, (timestamp, current_leader_epoch))| ListOffsetsPart {
                            part,
                            timestamp,
                            current_leader_epoch,
                        })
                        .collect(),
                )
            },
            |r| match r {
                ShardResponse::ListOffsets(v) => Some(v),
                _ => None,
            },
            fail(ResponseError::UnknownServerError),
        )
        .await;
        let topics = req
            .topics
            .iter()
            .zip(answers)
            .map(|(t, answers)| {
                let partitions = t.partitions.iter().zip(answers).map(|(p, o)| {
                    ListOffsetsPartitionResponse::default()
                        .with_partition_index(p.partition_index)
                        .with_error_code(o.error)
                        .with_timestamp(o.timestamp)
                        .with_offset(o.offset)
                        .with_leader_epoch(if version >= 4 { o.leader_epoch } else { -1 })
                });
                ListOffsetsTopicResponse::default()
                    .with_name(t.name.clone())
                    .with_partitions(partitions.collect())
            })
            .collect();
        Reply::Now(ListOffsetsResponse::default().with_topics(topics))
    }

    fn error_codes(resp: &ListOffsetsResponse, out: &mut Vec<i16>) {
        for t in &resp.topics {
            for p in &t.partitions {
                out.push(p.error_code);
            }
        }
    }
}
