//! DeleteTopics (20): by name, or by topic id (v6+). The controller removes the topic from the
//! metadata, then every owning shard deletes the partitions' logs.

use std::rc::Rc;

use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kafka_protocol::messages::{ApiKey, DeleteTopicsRequest, DeleteTopicsResponse, TopicName};
use kafka_protocol::ResponseError;
use strand_protocol::types::TopicId;

use super::{msg, str_bytes, Handler, Reply, RequestCtx};
use crate::controller::{self, ControllerOp, TopicRef};

pub(crate) struct DeleteTopics;

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
