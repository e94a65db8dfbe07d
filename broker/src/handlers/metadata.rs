//! Metadata (3): brokers, topics (with ids), partition leaders; creates topics on demand when
//! `auto.create.topics.enable` and the client allow it.

use std::collections::HashMap;
use std::rc::Rc;

use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::{ApiKey, BrokerId, MetadataRequest, MetadataResponse, TopicName};
use kafka_protocol::ResponseError;
use strand_protocol::acl;
use strand_protocol::types::{validate_topic_name, TopicId};

use super::{cluster_view, str_bytes, Handler, Reply, RequestCtx};
use crate::controller::{self, ControllerOp};
use crate::internal_topics::is_reserved;
use crate::metadata::{NewTopic, TopicMeta};
use crate::shard::LEADER_EPOCH;

pub(crate) struct Metadata;

/// A topic as Metadata describes it: one node leads every partition.
/// Fields a version does not have keep their defaults (the encoder refuses anything else).
pub(crate) fn describe_topic(t: &TopicMeta, node_id: i32, version: i16) -> MetadataResponseTopic {
    let node = BrokerId(node_id);
    MetadataResponseTopic::default()
        .with_name(Some(TopicName(str_bytes(&t.name))))
        .with_topic_id(if version >= 10 { t.id.0 } else { uuid::Uuid::nil() })
        .with_is_internal(version >= 1 && t.internal)
        .with_topic_authorized_operations(acl::NOT_REQUESTED)
        .with_partitions(
            (0..t.partitions)
                .map(|p| {
                    MetadataResponsePartition::default()
                        .with_partition_index(p)
                        .with_leader_id(node)
                        .with_leader_epoch(if version >= 7 { LEADER_EPOCH } else { -1 })
                        .with_replica_nodes(vec![node])
                        .with_isr_nodes(vec![node])
                })
                .collect(),
        )
}

fn topic_error(
    name: Option<String>,
    id: TopicId,
    code: ResponseError,
    version: i16,
) -> MetadataResponseTopic {
    MetadataResponseTopic::default()
        .with_error_code(code.code())
        .with_name(name.map(|n| TopicName(str_bytes(&n))))
        .with_topic_id(if version >= 10 { id.0 } else { uuid::Uuid::nil() })
        .with_topic_authorized_operations(acl::NOT_REQUESTED)
}

/// Metadata on a node of a KRaft-configured cluster: from the committed cluster state
/// ([`super::cluster_view`]); missing topics are auto-created through the active controller and
/// answered LEADER_NOT_AVAILABLE until this node has the state that holds them, and so are
/// topics it does not know while it is not live in its own state (its view may be behind).
async fn cluster_metadata(ctx: &RequestCtx, req: MetadataRequest) -> MetadataResponse {
    let shard = &ctx.shard;
    let state = shard.cluster_state().unwrap_or_default();
    let newer = cluster_view::newer_leaders(ctx);
    let listener = cluster_view::listener_name(ctx);
    let mut resp = MetadataResponse::default()
        .with_brokers(cluster_view::metadata_brokers(
            &state,
            listener,
            ctx.version,
            (
                shard.config.node_id,
                cluster_view::missing_self(&state, shard.config.node_id, &ctx.advertised()),
            ),
        ))
        .with_cluster_id((ctx.version >= 2).then(|| str_bytes(&shard.config.cluster_id)))
        .with_controller_id(BrokerId(if ctx.version >= 1 {
            cluster_view::controller_id(&state, shard.config.node_id)
        } else {
            -1
        }))
        .with_cluster_authorized_operations(acl::NOT_REQUESTED);
    let requested = match req.topics {
        None => None,
        Some(t) if t.is_empty() && ctx.version == 0 => None,
        Some(t) => Some(t),
    };
    let Some(requested) = requested else {
        resp.topics = state
            .topics()
            .map(|t| cluster_view::describe_topic(&state, t, ctx.version, &newer))
            .collect();
        return resp;
    };
    let live = state.live_brokers().any(|b| b.id == shard.config.node_id);
    let allow_create =
        shard.config.auto_create_topics_enable && (ctx.version < 4 || req.allow_auto_topic_creation);
    for t in requested {
        let name = t.name.as_ref().map(|n| n.0.as_str().to_owned());
        let id = TopicId(t.topic_id);
        let entry = match &name {
            Some(n) => match state.topic_by_name(n) {
                Some(topic) => cluster_view::describe_topic(&state, topic, ctx.version, &newer),
                None if validate_topic_name(n).is_err() => topic_error(
                    name.clone(),
                    TopicId::ZERO,
                    ResponseError::InvalidTopicException,
                    ctx.version,
                ),
                None if allow_create && !is_reserved(n) => {
                    let code = match crate::cluster_link::auto_create(shard, n).await {
                        Ok(()) => ResponseError::LeaderNotAvailable,
                        Err(e) if e.code == ResponseError::TopicAlreadyExists => {
                            ResponseError::LeaderNotAvailable
                        }
                        Err(e) => {
                            tracing::warn!(topic = %n, error = %e.message, "auto-creating topic failed");
                            e.code
                        }
                    };
                    topic_error(name.clone(), TopicId::ZERO, code, ctx.version)
                }
                // A node not live in the state it has (starting, catching up, fenced) may not
                // know the topic yet: retriable, so that clients keep what they queued for it
                // and ask again, rather than taking it for absent.
                None if !live => topic_error(
                    name.clone(),
                    TopicId::ZERO,
                    ResponseError::LeaderNotAvailable,
                    ctx.version,
                ),
                None => topic_error(
                    name.clone(),
                    TopicId::ZERO,
                    ResponseError::UnknownTopicOrPartition,
                    ctx.version,
                ),
            },
            None => match state.topic(id) {
                Some(topic) => cluster_view::describe_topic(&state, topic, ctx.version, &newer),
                None => topic_error(None, id, ResponseError::UnknownTopicId, ctx.version),
            },
        };
        resp.topics.push(entry);
    }
    resp
}

impl Handler for Metadata {
    const KEY: ApiKey = ApiKey::Metadata;
    const MIN: i16 = 0;
    const MAX: i16 = 13;
    type Request = MetadataRequest;
    type Response = MetadataResponse;

    async fn handle(ctx: Rc<RequestCtx>, req: MetadataRequest) -> Reply<MetadataResponse> {
        let (topic_ops, cluster_ops) = (
            acl::authorized(req.include_topic_authorized_operations, acl::TOPIC_OPERATIONS),
            acl::authorized(req.include_cluster_authorized_operations, acl::CLUSTER_OPERATIONS),
        );
        let mut resp = if ctx.shard.config.cluster.is_standalone() {
            standalone_metadata(&ctx, req).await
        } else {
            cluster_metadata(&ctx, req).await
        };
        // No authorizer: every operation is allowed (KIP-430), to whoever asks.
        resp.cluster_authorized_operations = cluster_ops;
        for t in &mut resp.topics {
            t.topic_authorized_operations = topic_ops;
        }
        Reply::Now(resp)
    }

    fn error_codes(resp: &MetadataResponse, out: &mut Vec<i16>) {
        out.push(resp.error_code);
        for t in &resp.topics {
            out.push(t.error_code);
        }
    }
}

/// Metadata on the zero-config single node: this node leads every partition.
async fn standalone_metadata(ctx: &RequestCtx, req: MetadataRequest) -> MetadataResponse {
    let shard = &ctx.shard;
    let node_id = shard.config.node_id.0;
    let adv = ctx.advertised();
    let mut resp = MetadataResponse::default()
        .with_brokers(vec![MetadataResponseBroker::default()
            .with_node_id(BrokerId(node_id))
            .with_host(str_bytes(&adv.host))
            .with_port(i32::from(adv.port))])
        .with_cluster_id((ctx.version >= 2).then(|| str_bytes(&shard.config.cluster_id)))
        .with_controller_id(BrokerId(if ctx.version >= 1 { node_id } else { -1 }))
        .with_cluster_authorized_operations(acl::NOT_REQUESTED);

    // v0: an empty list means all topics; v1+: null means all topics.
    let requested = match req.topics {
        None => None,
        Some(t) if t.is_empty() && ctx.version == 0 => None,
        Some(t) => Some(t),
    };
    let Some(requested) = requested else {
        let md = shard.metadata();
        resp.topics = md
            .topics()
            .map(|t| describe_topic(t, node_id, ctx.version))
            .collect();
        return resp;
    };

    // Auto-create what is missing, if allowed (v4+ lets the client say no).
    let allow_create =
        shard.config.auto_create_topics_enable && (ctx.version < 4 || req.allow_auto_topic_creation);
    // Why a topic could not be auto-created (a partition limit, say): answered instead of a
    // retriable error, so that a client stops asking for a creation that cannot succeed.
    // (Kafka creates in the background and answers LEADER_NOT_AVAILABLE meanwhile, whatever
    // the outcome.)
    let mut refused: HashMap<String, ResponseError> = HashMap::new();
    if allow_create {
        let md = shard.metadata();
        let missing: Vec<NewTopic> = requested
            .iter()
            .filter_map(|t| t.name.as_ref().map(|n| n.0.as_str().to_owned()))
            // A reserved name is never auto-created: it reads as a missing topic.
            .filter(|n| md.topic(n).is_none() && validate_topic_name(n).is_ok() && !is_reserved(n))
            .map(|name| NewTopic {
                name,
                num_partitions: -1,
                replication_factor: -1,
                assignments: vec![],
                configs: vec![],
            })
            .collect();
        if !missing.is_empty() {
            let reply = controller::call(
                shard,
                ControllerOp::CreateTopics {
                    topics: missing,
                    validate_only: false,
                },
            )
            .await;
            for r in reply.results {
                if let (Some(name), Some(e)) = (r.name, r.error) {
                    if e.code != ResponseError::TopicAlreadyExists {
                        tracing::warn!(topic = %name, error = %e.message, "auto-creating topic failed");
                        refused.insert(name, e.code);
                    }
                }
            }
        }
    }

    let md = shard.metadata();
    for t in requested {
        let name = t.name.as_ref().map(|n| n.0.as_str().to_owned());
        let id = TopicId(t.topic_id);
        let entry = match &name {
            Some(n) => match md.topic(n) {
                Some(meta) => describe_topic(meta, node_id, ctx.version),
                None if validate_topic_name(n).is_err() => topic_error(
                    name.clone(),
                    TopicId::ZERO,
                    ResponseError::InvalidTopicException,
                    ctx.version,
                ),
                None if allow_create && !is_reserved(n) => topic_error(
                    name.clone(),
                    TopicId::ZERO,
                    // Else the creation raced with a deletion: retriable.
                    refused
                        .get(n)
                        .copied()
                        .unwrap_or(ResponseError::LeaderNotAvailable),
                    ctx.version,
                ),
                None => topic_error(
                    name.clone(),
                    TopicId::ZERO,
                    ResponseError::UnknownTopicOrPartition,
                    ctx.version,
                ),
            },
            None => match md.topic_by_id(id) {
                Some(meta) => describe_topic(meta, node_id, ctx.version),
                None => topic_error(None, id, ResponseError::UnknownTopicId, ctx.version),
            },
        };
        resp.topics.push(entry);
    }
    resp
}
