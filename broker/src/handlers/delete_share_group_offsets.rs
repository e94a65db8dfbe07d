//! DeleteShareGroupOffsets (92, KIP-932): removes a share group's share state (queue engines and
//! their state logs) for the topics named, on every shard; the next ShareFetch of such a
//! partition starts again per `share.auto.offset.reset`. The group must be a share group with no
//! members (NON_EMPTY_GROUP). An unknown topic is answered UNKNOWN_TOPIC_OR_PARTITION; a known
//! topic without share state, NONE.

use std::rc::Rc;

use kafka_protocol::messages::delete_share_group_offsets_response::DeleteShareGroupOffsetsResponseTopic;
use kafka_protocol::messages::{ApiKey, DeleteShareGroupOffsetsRequest, DeleteShareGroupOffsetsResponse};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use super::{msg, Handler, Reply, RequestCtx};
use crate::queue::doors::kafka_share::group::require_empty_share_group;
use crate::queue::doors::kafka_share::on_every_shard;
use crate::queue::host::QueueOp;

pub(crate) struct DeleteShareGroupOffsets;

impl Handler for DeleteShareGroupOffsets {
    const KEY: ApiKey = ApiKey::DeleteShareGroupOffsets;
    const MIN: i16 = 0;
    const MAX: i16 = 0;
    type Request = DeleteShareGroupOffsetsRequest;
    type Response = DeleteShareGroupOffsetsResponse;

    async fn handle(
        ctx: Rc<RequestCtx>,
        req: DeleteShareGroupOffsetsRequest,
    ) -> Reply<DeleteShareGroupOffsetsResponse> {
        let shard = &ctx.shard;
        let group = req.group_id.as_str().to_owned();
        let refused = |e: ResponseError, m: Option<String>| {
            Reply::Now(
                DeleteShareGroupOffsetsResponse::default()
                    .with_error_code(e.code())
                    .with_error_message(m.map(StrBytes::from_string)),
            )
        };
        if let Err((e, m)) = require_empty_share_group(shard, &group).await {
            return refused(e, m);
        }
        let md = shard.metadata();
        let mut doomed: Vec<String> = Vec::new();
        let mut responses = Vec::with_capacity(req.topics.len());
        for t in req.topics {
            let name = t.topic_name.as_str().to_owned();
            let row = DeleteShareGroupOffsetsResponseTopic::default().with_topic_name(t.topic_name);
            match md.topic(&name) {
                Some(m) => {
                    responses.push(row.with_topic_id(m.id.0));
                    if !doomed.contains(&name) {
                        doomed.push(name);
                    }
                }
                None => responses.push(
                    row.with_error_code(ResponseError::UnknownTopicOrPartition.code())
                        .with_error_message(msg("The topic does not exist.")),
                ),
            }
        }
        if !doomed.is_empty() {
            let done = on_every_shard(shard, || QueueOp::ShareDeleteState {
                group: group.clone(),
                topics: doomed.clone(),
            })
            .await;
            if done.is_none() {
                for r in responses.iter_mut().filter(|r| r.error_code == 0) {
                    r.error_code = ResponseError::CoordinatorNotAvailable.code();
                }
            }
        }
        Reply::Now(DeleteShareGroupOffsetsResponse::default().with_responses(responses))
    }

    fn error_codes(resp: &DeleteShareGroupOffsetsResponse, out: &mut Vec<i16>) {
        out.push(resp.error_code);
        out.extend(resp.responses.iter().map(|r| r.error_code));
    }
}
