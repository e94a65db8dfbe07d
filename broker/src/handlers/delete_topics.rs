//! DeleteTopics (20): by name, or by topic id (v6+). The controller removes the topic from the
//! metadata, then every owning shard deletes the partitions' logs.

use std::rc::Rc;

use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kafka_protocol::messages::{ApiKey, DeleteTopicsRequest, DeleteTopicsResponse, TopicName};
use kafka_protocol::ResponseError;
use strand_protocol::types::TopicId;

use super::{msg, str_bytes, Handler, Reply, RequestCtx};
use crate::cluster::rpc::ControlRequest;
use crate::controller::{self, ControllerOp, TopicRef};
use crate::metadata::AdminError;

pub(crate) struct DeleteTopics;

/// One topic on a node of a KRaft-configured cluster: resolved in the cluster state (an id to
/// its name), internal topics refused here, the deletion decided by the active controller.
async fn delete_in_cluster(ctx: &RequestCtx, r: TopicRef, version: i16) -> DeletableTopicResult {
    let state = ctx.shard.cluster_state().unwrap_or_default();
    let found = match &r {
        TopicRef::Name(n) => state.topic_by_name(n),
        TopicRef::Id(id) => state.topic(*id),
    };
    let (name, id, result) = match found {
        None => match r {
            TopicRef::Name(n) => (
                Some(n),
                TopicId::ZERO,
                Err(AdminError::new(
                    ResponseError::UnknownTopicOrPartition,
                    "This server does not host this topic-partition.",
                )),
            ),
            TopicRef::Id(id) => (
                None,
                id,
                Err(AdminError::new(
                    ResponseError::UnknownTopicId,
                    "This server does not host this topic ID.",
                )),
            ),
        },
        Some(t) => {
            let result = match crate::internal_topics::refuse_delete_topic(&t.name) {
                Some(m) => Err(AdminError::new(ResponseError::TopicDeletionDisabled, m)),
                None => crate::cluster_link::decide(
                    &ctx.shard,
                    ControlRequest::DeleteTopic { name: t.name.clone() },
                )
                .await
                .map(|_| ()),
            };
            (Some(t.name.clone()), t.id, result)
        }
    };
    let mut d = DeletableTopicResult::default()
        .with_name(name.map(|n| TopicName(str_bytes(&n))))
        .with_topic_id(if version >= 6 { id.0 } else { uuid::Uuid::nil() });
    if let Err(e) = result {
        d = d.with_error_code(e.code.code());
        if version >= 5 {
            d = d.with_error_message(msg(e.message));
        }
    }
    d
}

impl Handler for DeleteTopics {
    const KEY: ApiKey = ApiKey::DeleteTopics;
    const MIN: i16 = 1;
    const MAX: i16 = 6;
    type Request = DeleteTopicsRequest;
    type Response = DeleteTopicsResponse;

    async fn handle(ctx: Rc<RequestCtx>, req: DeleteTopicsRequest) -> Reply<DeleteTopicsResponse> {
        let refs: Vec<TopicRef> = if ctx.version >= 6 {
            req.topics
                .iter()
                .map(|t| match &t.name {
                    Some(n) => TopicRef::Name(n.0.as_str().to_owned()),
                    None => TopicRef::Id(TopicId(t.topic_id)),
                })
                .collect()
        } else {
            req.topic_names
                .iter()
                .map(|n| TopicRef::Name(n.0.as_str().to_owned()))
                .collect()
        };
        let n = refs.len();
        let version = ctx.version;
        if !ctx.shard.config.cluster.is_standalone() {
            let mut responses = Vec::with_capacity(n);
            for r in refs {
                responses.push(delete_in_cluster(&ctx, r, version).await);
            }
            return Reply::Now(DeleteTopicsResponse::default().with_responses(responses));
        }
        let reply = controller::call(&ctx.shard, ControllerOp::DeleteTopics { topics: refs }).await;
        let mut responses: Vec<DeletableTopicResult> = reply
            .results
            .into_iter()
            .map(|r| {
                let mut d = DeletableTopicResult::default()
                    .with_name(r.name.map(|n| TopicName(str_bytes(&n))))
                    .with_topic_id(if version >= 6 { r.id.0 } else { uuid::Uuid::nil() });
                if let Some(e) = r.error {
                    d = d.with_error_code(e.code.code());
                    if version >= 5 {
                        d = d.with_error_message(msg(e.message));
                    }
                }
                d
            })
            .collect();
        if responses.len() != n {
            responses = (0..n)
                .map(|_| DeletableTopicResult::default().with_error_code(ResponseError::NotController.code()))
                .collect();
        }
        Reply::Now(DeleteTopicsResponse::default().with_responses(responses))
    }

    fn error_codes(resp: &DeleteTopicsResponse, out: &mut Vec<i16>) {
        for t in &resp.responses {
            out.push(t.error_code);
        }
    }
}
