//! AlterShareGroupOffsets (91, KIP-932): starts a share group's share state of the partitions
//! named over at the start offsets given (records below are done, those above available with
//! fresh delivery counts), durably before answering. The group must be a share group with no
//! members (NON_EMPTY_GROUP). An unknown topic or partition is answered
//! UNKNOWN_TOPIC_OR_PARTITION; a negative offset INVALID_REQUEST; an offset below the log start
//! starts at the log start.

use std::rc::Rc;

use kafka_protocol::messages::alter_share_group_offsets_response::{
    AlterShareGroupOffsetsResponsePartition, AlterShareGroupOffsetsResponseTopic,
};
use kafka_protocol::messages::{AlterShareGroupOffsetsRequest, AlterShareGroupOffsetsResponse, ApiKey};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use super::{msg, Handler, Reply, RequestCtx};
use crate::queue::doors::kafka_share::errors::alter_error;
use crate::queue::doors::kafka_share::group::require_empty_share_group;
use crate::queue::host::{QueueAnswer, QueueOp};

pub(crate) struct AlterShareGroupOffsets;

impl Handler for AlterShareGroupOffsets {
    const KEY: ApiKey = ApiKey::AlterShareGroupOffsets;
    const MIN: i16 = 0;
    const MAX: i16 = 0;
    type Request = AlterShareGroupOffsetsRequest;
    type Response = AlterShareGroupOffsetsResponse;

    async fn handle(
        ctx: Rc<RequestCtx>,
        req: AlterShareGroupOffsetsRequest,
    ) -> Reply<AlterShareGroupOffsetsResponse> {
        let shard = &ctx.shard;
        let group = req.group_id.as_str().to_owned();
        let refused = |e: ResponseError, m: Option<String>| {
            Reply::Now(
                AlterShareGroupOffsetsResponse::default()
                    .with_error_code(e.code())
                    .with_error_message(m.map(StrBytes::from_string)),
            )
        };
        if let Err((e, m)) = require_empty_share_group(shard, &group).await {
            return refused(e, m);
        }
        let md = shard.metadata();
        let mut responses = Vec::with_capacity(req.topics.len());
        for t in req.topics {
            let name = t.topic_name.as_str().to_owned();
            let meta = md.topic(&name);
            let mut row = AlterShareGroupOffsetsResponseTopic::default().with_topic_name(t.topic_name);
            if let Some(m) = meta {
                row = row.with_topic_id(m.id.0);
            }
            for p in t.partitions {
                let part = AlterShareGroupOffsetsResponsePartition::default()
                    .with_partition_index(p.partition_index);
                let error = match meta {
                    None => Some((
                        ResponseError::UnknownTopicOrPartition,
                        "The topic does not exist.".into(),
                    )),
                    Some(m) if p.partition_index < 0 || p.partition_index >= m.partitions => Some((
                        ResponseError::UnknownTopicOrPartition,
                        "The partition does not exist.".into(),
                    )),
                    Some(_) if p.start_offset < 0 => Some((
                        ResponseError::InvalidRequest,
                        format!("Start offset {} is negative.", p.start_offset),
                    )),
                    Some(_) => {
                        let owner = shard.owner(&name, p.partition_index);
                        let op = QueueOp::ShareAlter {
                            group: group.clone(),
                            topic: name.clone(),
                            partition: p.partition_index,
                            start_offset: p.start_offset,
                        };
                        match crate::queue::doors::kafka_share::call(shard, owner, op).await {
                            Some(QueueAnswer::ShareAltered(Ok(()))) => None,
                            Some(QueueAnswer::ShareAltered(Err(e))) => Some((alter_error(&e), e.to_string())),
                            _ => Some((
                                ResponseError::CoordinatorNotAvailable,
                                "The partition's shard did not answer.".into(),
                            )),
                        }
                    }
                };
                row.partitions.push(match error {
                    None => part,
                    Some((code, text)) => part.with_error_code(code.code()).with_error_message(msg(text)),
                });
            }
            responses.push(row);
        }
        Reply::Now(AlterShareGroupOffsetsResponse::default().with_responses(responses))
    }

    fn error_codes(resp: &AlterShareGroupOffsetsResponse, out: &mut Vec<i16>) {
        out.push(resp.error_code);
        for t in &resp.responses {
            out.extend(t.partitions.iter().map(|p| p.error_code));
        }
    }
}
