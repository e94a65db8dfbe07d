//! OffsetForLeaderEpoch (23): the end offset of a leader epoch, which consumers use to check
//! their position after a leader change (KIP-320).

use std::rc::Rc;

use kafka_protocol::messages::offset_for_leader_epoch_response::{
    EpochEndOffset, OffsetForLeaderTopicResult,
};
use kafka_protocol::messages::{ApiKey, OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse};
use kafka_protocol::ResponseError;

use super::{per_partition, Handler, Reply, RequestCtx};
use crate::shard::ops::{EpochAnswer, EpochQuery, ShardRequest, ShardResponse};

pub(crate) struct OffsetForLeaderEpoch;

impl Handler for OffsetForLeaderEpoch {
    const KEY: ApiKey = ApiKey::OffsetForLeaderEpoch;
    const MIN: i16 = 2;
    const MAX: i16 = 4;
    type Request = OffsetForLeaderEpochRequest;
    type Response = OffsetForLeaderEpochResponse;

    async fn handle(
        ctx: Rc<RequestCtx>,
        req: OffsetForLeaderEpochRequest,
    ) -> Reply<OffsetForLeaderEpochResponse> {
        let fail = |e: ResponseError| EpochAnswer {
            error: e.code(),
            leader_epoch: -1,
            end_offset: -1,
        };
        let requested = req
            .topics
            .iter()
            .map(|t| {
                let parts = t.partitions.iter();
                let parts = parts.map(|p| (p.partition, (p.current_leader_epoch, p.leader_epoch)));
                (t.topic.0.as_str(), parts.collect())
            })
            .collect();
        let answers = per_partition(
            &ctx,
            requested,
            fail(ResponseError::UnknownTopicOrPartition),
            |list| {
                ShardRequest::EpochEndOffsets(
                    list.into_iter()
                        .map(|(part, (current_leader_epoch, leader_epoch))| EpochQuery {
                            part,
                            current_leader_epoch,
                            leader_epoch,
                        })
                        .collect(),
                )
            },
            |r| match r {
                ShardResponse::EpochEndOffsets(v) => Some(v),
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
                let partitions = t.partitions.iter().zip(answers).map(|(p, a)| {
                    EpochEndOffset::default()
                        .with_partition(p.partition)
                        .with_error_code(a.error)
                        .with_leader_epoch(a.leader_epoch)
                        .with_end_offset(a.end_offset)
                });
                OffsetForLeaderTopicResult::default()
                    .with_topic(t.topic.clone())
                    .with_partitions(partitions.collect())
            })
            .collect();
        Reply::Now(OffsetForLeaderEpochResponse::default().with_topics(topics))
    }

    fn error_codes(resp: &OffsetForLeaderEpochResponse, out: &mut Vec<i16>) {
        for t in &resp.topics {
            for p in &t.partitions {
                out.push(p.error_code);
            }
        }
    }
}
