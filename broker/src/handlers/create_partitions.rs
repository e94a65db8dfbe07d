//! CreatePartitions (37): adds partitions to a topic (never removes); on a node of a
//! KRaft-configured cluster the active controller decides, wherever it runs.

use std::rc::Rc;

use kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
use kafka_protocol::messages::{ApiKey, CreatePartitionsRequest, CreatePartitionsResponse};
use kafka_protocol::ResponseError;

use super::{msg, Handler, Reply, RequestCtx};
use strand_protocol::types::NodeId;

use crate::controller::{self, ControllerOp, PartitionIncrease};
use crate::metadata::AdminError;

pub(crate) struct CreatePartitions;

impl Handler for CreatePartitions {
    const KEY: ApiKey = ApiKey::CreatePartitions;
    const MIN: i16 = 0;
    const MAX: i16 = 3;
    type Request = CreatePartitionsRequest;
    type Response = CreatePartitionsResponse;

    async fn handle(ctx: Rc<RequestCtx>, req: CreatePartitionsRequest) -> Reply<CreatePartitionsResponse> {
        if !ctx.shard.config.cluster.is_standalone() {
            let mut results = Vec::with_capacity(req.topics.len());
            for t in &req.topics {
                let r = CreatePartitionsTopicResult::default().with_name(t.name.clone());
                let name = t.name.0.as_str();
                let outcome = match crate::internal_topics::refuse_create_partitions(name) {
                    Some(m) => Err(AdminError::new(ResponseError::InvalidRequest, m)),
                    None if req.validate_only => Ok(()),
                    None => {
                        let assignments = t.assignments.as_ref().map(|a| {
                            a.iter()
                                .map(|x| x.broker_ids.iter().map(|b| NodeId(b.0)).collect())
                                .collect()
                        });
                        crate::topic_admin::create_partitions_in_cluster(
                            &ctx.shard,
                            name,
                            t.count,
                            assignments,
                        )
                        .await
                    }
                };
                results.push(match outcome {
                    Ok(()) => r,
                    Err(e) => r
                        .with_error_code(e.code.code())
                        .with_error_message(msg(e.message)),
                });
            }
            return Reply::Now(CreatePartitionsResponse::default().with_results(results));
        }
        let topics = req
            .topics
            .iter()
            .map(|t| PartitionIncrease {
                topic: t.name.0.as_str().to_owned(),
                count: t.count,
                assignments: t.assignments.as_ref().map(|a| {
                    a.iter()
                        .map(|x| x.broker_ids.iter().map(|b| b.0).collect())
                        .collect()
                }),
            })
            .collect();
        let reply = controller::call(
            &ctx.shard,
            ControllerOp::CreatePartitions {
                topics,
                validate_only: req.validate_only,
            },
        )
        .await;
        let mut answers = reply.results.into_iter();
        let results = req
            .topics
            .iter()
            .map(|t| {
                let r = CreatePartitionsTopicResult::default().with_name(t.name.clone());
                match answers.next() {
                    Some(a) => match a.error {
                        Some(e) => r
                            .with_error_code(e.code.code())
                            .with_error_message(msg(e.message)),
                        None => r,
                    },
                    None => r.with_error_code(ResponseError::NotController.code()),
                }
            })
            .collect();
        Reply::Now(CreatePartitionsResponse::default().with_results(results))
    }

    fn error_codes(resp: &CreatePartitionsResponse, out: &mut Vec<i16>) {
        for t in &resp.results {
            out.push(t.error_code);
        }
    }
}
