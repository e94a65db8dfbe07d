//! DescribeQuorum (55): the controller quorum, `__cluster_metadata` partition 0.
//!
//! On a KRaft-configured node the request goes to the active controller, as Kafka's brokers
//! forward it ([`crate::cluster::quorum::Controller::describe`]): its id and Raft term (the
//! leader epoch), the high watermark (the offset after the last committed metadata record) and
//! each voter's progress, from the leader's replication state: the offset after what the voter
//! is known to hold, when it last acknowledged the leader, and that time again if it holds
//! everything the leader does (else -1: when it last did is not kept). Observers (brokers
//! without the controller role, which fetch the metadata through the controller RPC rather
//! than the Raft log) are not listed. v2's nodes are the voters' controller endpoints, from
//! `controller.quorum.voters`.
//!
//! The zero-config standalone node is a one-voter quorum that keeps its metadata in a file,
//! not a log: it is the leader in epoch 0, and its offsets are the number of metadata changes
//! it has applied (the file's version).
//!
//! As Kafka: a topic or partition other than `__cluster_metadata`-0 is
//! UNKNOWN_TOPIC_OR_PARTITION; no controller answering is NOT_LEADER_OR_FOLLOWER (retriable).

use std::rc::Rc;

use kafka_protocol::messages::describe_quorum_response::{
    Listener, Node, PartitionData, ReplicaState, TopicData,
};
use kafka_protocol::messages::{ApiKey, BrokerId, DescribeQuorumRequest, DescribeQuorumResponse};
use kafka_protocol::ResponseError;

use super::{str_bytes, Handler, Reply, RequestCtx};
use crate::cluster::quorum::{QuorumView, ReplicaProgress, METADATA_TOPIC};
use crate::cluster::rpc::{ControlReply, ControlRequest};
use crate::config::Quorum;

pub(crate) struct DescribeQuorum;

impl Handler for DescribeQuorum {
    const KEY: ApiKey = ApiKey::DescribeQuorum;
    const MIN: i16 = 0;
    const MAX: i16 = 2;
    type Request = DescribeQuorumRequest;
    type Response = DescribeQuorumResponse;

    async fn handle(ctx: Rc<RequestCtx>, req: DescribeQuorumRequest) -> Reply<DescribeQuorumResponse> {
        let asks_for_the_log = req.topics.len() == 1
            && req.topics.iter().all(|t| {
                t.topic_name.0.as_str() == METADATA_TOPIC
                    && t.partitions.len() == 1
                    && t.partitions.iter().all(|p| p.partition_index == 0)
            });
        let partition = if !asks_for_the_log {
            Err((
                ResponseError::UnknownTopicOrPartition,
                format!("DescribeQuorum describes {METADATA_TOPIC} partition 0 only"),
            ))
        } else if ctx.shard.config.cluster.is_standalone() {
            let version = ctx.shard.metadata().version;
            let offset = i64::try_from(version).unwrap_or(i64::MAX);
            Ok(QuorumView {
                leader: ctx.shard.config.node_id,
                term: 0,
                high_watermark: offset,
                voters: vec![ReplicaProgress {
                    id: ctx.shard.config.node_id,
                    log_end_offset: offset,
                    last_fetch_ms: ctx.shard.now_ms(),
                    last_caught_up_ms: ctx.shard.now_ms(),
                }],
            })
        } else {
            match crate::cluster_link::control(&ctx.shard, ControlRequest::DescribeQuorum).await {
                Ok(ControlReply::Quorum(q)) => Ok(q),
                Ok(other) => Err((
                    ResponseError::NotLeaderOrFollower,
                    format!("no active controller described the quorum ({other:?})"),
                )),
                Err(e) => Err((ResponseError::NotLeaderOrFollower, e)),
            }
        };
        let data = match partition {
            Ok(q) => describe(&q, ctx.version),
            Err((code, message)) => {
                tracing::debug!(%message, "DescribeQuorum refused");
                PartitionData::default()
                    .with_error_code(code.code())
                    .with_error_message((ctx.version >= 2).then(|| str_bytes(&message)))
                    .with_leader_id(BrokerId(-1))
                    .with_leader_epoch(-1)
                    .with_high_watermark(-1)
            }
        };
        let mut resp = DescribeQuorumResponse::default().with_topics(vec![TopicData::default()
            .with_topic_name(kafka_protocol::messages::TopicName(str_bytes(METADATA_TOPIC)))
            .with_partitions(vec![data])]);
        if ctx.version >= 2 {
            resp.nodes = voter_nodes(&ctx);
        }
        Reply::Now(resp)
    }

    fn error_codes(resp: &DescribeQuorumResponse, out: &mut Vec<i16>) {
        out.push(resp.error_code);
        for t in &resp.topics {
            out.extend(t.partitions.iter().map(|p| p.error_code));
        }
    }
}

fn describe(q: &QuorumView, version: i16) -> PartitionData {
    let state = |v: &ReplicaProgress| {
        let mut s = ReplicaState::default()
            .with_replica_id(BrokerId(v.id.0))
            .with_log_end_offset(v.log_end_offset);
        if version >= 1 {
            s.last_fetch_timestamp = v.last_fetch_ms;
            s.last_caught_up_timestamp = v.last_caught_up_ms;
        }
        s
    };
    PartitionData::default()
        .with_leader_id(BrokerId(q.leader.0))
        .with_leader_epoch(i32::try_from(q.term).unwrap_or(i32::MAX))
        .with_high_watermark(q.high_watermark)
        .with_current_voters(q.voters.iter().map(state).collect())
}

/// The voters' controller endpoints (v2), as configured; this node's own listener when it is
/// the standalone node's one voter.
fn voter_nodes(ctx: &RequestCtx) -> Vec<Node> {
    let cluster = &ctx.shard.config.cluster;
    let name = cluster
        .controller_listener_name
        .clone()
        .unwrap_or_else(|| "CONTROLLER".to_string());
    match &cluster.quorum {
        Quorum::Voters(voters) => voters
            .iter()
            .map(|(id, at)| {
                Node::default()
                    .with_node_id(BrokerId(id.0))
                    .with_listeners(vec![Listener::default()
                        .with_name(str_bytes(&name))
                        .with_host(str_bytes(&at.host))
                        .with_port(at.port)])
            })
            .collect(),
        Quorum::Standalone => {
            let adv = ctx.advertised();
            vec![Node::default()
                .with_node_id(BrokerId(ctx.shard.config.node_id.0))
                .with_listeners(vec![Listener::default()
                    .with_name(str_bytes(super::cluster_view::listener_name(ctx)))
                    .with_host(str_bytes(&adv.host))
                    .with_port(adv.port)])]
        }
        Quorum::Bootstrap(_) => Vec::new(),
    }
}
