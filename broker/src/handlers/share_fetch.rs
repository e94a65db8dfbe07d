//! ShareFetch (78), KIP-932: a share consumer's fetch. Acknowledges what the request carries,
//! then acquires records for the member from its share session's partitions (locks with the
//! group's `share.record.lock.duration.ms`), answering the stored batches that hold them with
//! the acquired ranges and their delivery counts; long-polls up to `max_wait_ms`.

use std::rc::Rc;

use futures::FutureExt;
use kafka_protocol::messages::share_fetch_response::{
    AcquiredRecords, LeaderIdAndEpoch, NodeEndpoint, PartitionData, ShareFetchableTopicResponse,
};
use kafka_protocol::messages::{ApiKey, BrokerId, ShareFetchRequest, ShareFetchResponse};
use kafka_protocol::ResponseError;
use strand_protocol::types::TopicId;

use super::{str_bytes, Handler, Reply, RequestCtx};
use crate::queue::doors::kafka_share::{self, Named};
use crate::shard::LEADER_EPOCH;

pub(crate) struct ShareFetch;

fn refuse(code: ResponseError, message: &str) -> ShareFetchResponse {
    ShareFetchResponse::default()
        .with_error_code(code.code())
        .with_error_message(super::msg(message))
}

impl Handler for ShareFetch {
    const KEY: ApiKey = ApiKey::ShareFetch;
    const MIN: i16 = 1;
    const MAX: i16 = 1;
    type Request = ShareFetchRequest;
    type Response = ShareFetchResponse;

    async fn handle(ctx: Rc<RequestCtx>, req: ShareFetchRequest) -> Reply<ShareFetchResponse> {
        let shard = ctx.shard.clone();
        let (group, member) =
            match kafka_share::group_and_member(req.group_id.as_ref(), req.member_id.as_ref()) {
                Ok(gm) => gm,
                Err(e) => return Reply::Now(refuse(e, "group id and member id are required")),
            };
        // Opening a session needs a member of the group; later requests are vouched for by the
        // session, which goes when the member leaves or is fenced. On a cluster, only the
        // group's coordinator knows its members: a partition leader elsewhere serves the
        // session as Kafka's share-partition leaders do, without asking (records a member
        // leaves unacknowledged come back when their locks time out).
        let coordinator_elsewhere = ctx.shard.cluster_state().is_some_and(|state| {
            !matches!(
                super::cluster_view::group_coordinator_of(&ctx, &state, &group),
                super::cluster_view::GroupCoordinator::At(node, _) if node == ctx.shard.config.node_id
            )
        });
        if req.share_session_epoch == 0 && !coordinator_elsewhere {
            if let Err(code) = crate::queue::doors::kafka_share::check_member(&shard, &group, &member).await {
                return Reply::Now(refuse(code, "not a member of the share group"));
            }
        }
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
        let has_acks = named.iter().any(|n| !n.acks.is_empty());
        let final_request = req.share_session_epoch == -1;
        // A final request only acknowledges: the partitions it names are not added.
        let add: Vec<(TopicId, i32)> = if final_request {
            Vec::new()
        } else {
            named.iter().map(|n| (n.topic_id, n.partition)).collect()
        };
        let forget: Vec<(TopicId, i32)> = req
            .forgotten_topics_data
            .iter()
            .flat_map(|f| f.partitions.iter().map(move |p| (TopicId(f.topic_id), *p)))
            .collect();
        let update = ctx.subsystems.share_sessions.sessions.borrow_mut().fetch(
            &group,
            &member,
            req.share_session_epoch,
            &add,
            &forget,
            has_acks,
            shard.now_ms(),
        );
        let update = match update {
            Ok(u) => u,
            Err(code) => return Reply::Now(refuse(code, "share session refused")),
        };
        let lock_ms = kafka_share::settings(&shard, &group).record_lock_duration_ms;
        let node = shard.config.node_id.0;
        let advertised = ctx.advertised();
        Reply::Later(
            async move {
                let outcomes = kafka_share::run(
                    &shard,
                    &group,
                    &member,
                    &named,
                    &update.partitions,
                    !final_request,
                    req.max_records,
                    req.max_bytes,
                    req.max_wait_ms,
                )
                .await;
                // Closed session or forgotten partitions: what the member still holds there goes
                // back (after its acknowledgements above).
                kafka_share::release(&shard, &group, &member, &update.release).await;
                let mut topics: Vec<ShareFetchableTopicResponse> = Vec::new();
                for o in outcomes {
                    if topics.last().is_none_or(|t| t.topic_id != o.topic_id.0) {
                        topics.push(ShareFetchableTopicResponse::default().with_topic_id(o.topic_id.0));
                    }
                    let r = o.result;
                    let data = PartitionData::default()
                        .with_partition_index(o.partition)
                        .with_error_code(r.error)
                        .with_acknowledge_error_code(r.ack_error)
                        .with_current_leader(
                            LeaderIdAndEpoch::default()
                                .with_leader_id(node)
                                .with_leader_epoch(LEADER_EPOCH),
                        )
                        .with_acquired_records(
                            r.acquired
                                .iter()
                                .map(|(a, b, n)| {
                                    AcquiredRecords::default()
                                        .with_first_offset(*a)
                                        .with_last_offset(*b)
                                        .with_delivery_count(*n)
                                })
                                .collect(),
                        )
                        .with_records(kafka_share::records_or_empty(r.records));
                    if let Some(t) = topics.last_mut() {
                        t.partitions.push(data);
                    }
                }
                ShareFetchResponse::default()
                    .with_acquisition_lock_timeout_ms(i32::try_from(lock_ms).unwrap_or(i32::MAX))
                    .with_responses(topics)
                    .with_node_endpoints(vec![NodeEndpoint::default()
                        .with_node_id(BrokerId(node))
                        .with_host(str_bytes(&advertised.host))
                        .with_port(i32::from(advertised.port))])
            }
            .boxed_local(),
        )
    }

    fn error_codes(resp: &ShareFetchResponse, out: &mut Vec<i16>) {
        out.push(resp.error_code);
        for t in &resp.responses {
            for p in &t.partitions {
                out.push(p.error_code);
                out.push(p.acknowledge_error_code);
            }
        }
    }
}
