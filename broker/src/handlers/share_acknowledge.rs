//! ShareAcknowledge (79), KIP-932: a share consumer's acknowledgements without a fetch
//! (ACCEPT, RELEASE, REJECT, GAP per offset range). Epoch -1 closes the share session and
//! releases what the member still holds.

use std::rc::Rc;

use futures::FutureExt;
use kafka_protocol::messages::share_acknowledge_response::{
    LeaderIdAndEpoch, NodeEndpoint, PartitionData, ShareAcknowledgeTopicResponse,
};
use kafka_protocol::messages::{ApiKey, BrokerId, ShareAcknowledgeRequest, ShareAcknowledgeResponse};
use kafka_protocol::ResponseError;
use strand_protocol::types::TopicId;

use super::{str_bytes, Handler, Reply, RequestCtx};
use crate::queue::doors::kafka_share::{self, Named};
use crate::shard::LEADER_EPOCH;

pub(crate) struct ShareAcknowledge;

fn refuse(code: ResponseError, message: &str) -> ShareAcknowledgeResponse {
    ShareAcknowledgeResponse::default()
        .with_error_code(code.code())
        .with_error_message(super::msg(message))
}

impl Handler for ShareAcknowledge {
    const KEY: ApiKey = ApiKey::ShareAcknowledge;
    const MIN: i16 = 1;
    const MAX: i16 = 1;
    type Request = ShareAcknowledgeRequest;
    type Response = ShareAcknowledgeResponse;

    async fn handle(ctx: Rc<RequestCtx>, req: ShareAcknowledgeRequest) -> Reply<ShareAcknowledgeResponse> {
        let shard = ctx.shard.clone();
        let (group, member) =
            match kafka_share::group_and_member(req.group_id.as_ref(), req.member_id.as_ref()) {
                Ok(gm) => gm,
                Err(e) => return Reply::Now(refuse(e, "group id and member id are required")),
            };
        // ShareAcknowledge never opens a session (epoch 0 is INVALID_SHARE_SESSION_EPOCH), so the
        // session vouches for the member: it goes when the member is fenced.
        let release = match ctx.subsystems.share_sessions.sessions.borrow_mut().acknowledge(
            &group,
            &member,
            req.share_session_epoch,
            shard.now_ms(),
        ) {
            Ok(r) => r,
            Err(code) => return Reply::Now(refuse(code, "share session refused")),
        };
        let named: Vec<Named> = req
            .topics
            .iter()
            .flat_map(|t| {
                t.partitions.iter().map(move |p| {
                    let batches = p.acknowledgement_batches.iter();
                    let acks = batches.map(|b| (b.first_offset, b.last_offset, &b.acknowledge_types[..]));
                    Named::new(TopicId(t.topic_id), p.partition_index, acks)
                })
            })
            .collect();
        let node = shard.config.node_id.0;
        let advertised = ctx.advertised();
        Reply::Later(
            async move {
                let outcomes = kafka_share::run(&shard, &group, &member, &named, &[], false, 0, 0, 0).await;
                kafka_share::release(&shard, &group, &member, &release).await;
                let mut topics: Vec<ShareAcknowledgeTopicResponse> = Vec::new();
                for o in outcomes {
                    if topics.last().is_none_or(|t| t.topic_id != o.topic_id.0) {
                        topics.push(ShareAcknowledgeTopicResponse::default().with_topic_id(o.topic_id.0));
                    }
                    let code = if o.result.error != 0 {
                        o.result.error
                    } else {
                        o.result.ack_error
                    };
                    let data = PartitionData::default()
                        .with_partition_index(o.partition)
                        .with_error_code(code)
                        .with_current_leader(
                            LeaderIdAndEpoch::default()
                                .with_leader_id(node)
                                .with_leader_epoch(LEADER_EPOCH),
                        );
                    if let Some(t) = topics.last_mut() {
                        t.partitions.push(data);
                    }
                }
                ShareAcknowledgeResponse::default()
                    .with_responses(topics)
                    .with_node_endpoints(vec![NodeEndpoint::default()
                        .with_node_id(BrokerId(node))
                        .with_host(str_bytes(&advertised.host))
                        .with_port(i32::from(advertised.port))])
            }
            .boxed_local(),
        )
    }

    fn error_codes(resp: &ShareAcknowledgeResponse, out: &mut Vec<i16>) {
        out.push(resp.error_code);
        for t in &resp.responses {
            for p in &t.partitions {
                out.push(p.error_code);
            }
        }
    }
}
