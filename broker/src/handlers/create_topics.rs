//! CreateTopics (19): validated and applied by the controller; the answer (v5+) carries the new
//! topic's partition count, replication factor and configs.

use std::collections::HashMap;
use std::rc::Rc;

use super::{msg, str_bytes, Handler, Reply, RequestCtx};
use crate::config::{Config, TopicConfig};
use crate::controller::{self, ControllerOp};
use crate::metadata::{AdminError, NewTopic};
use crate::topic_admin;
use kafka_protocol::messages::create_topics_response::{CreatableTopicConfigs, CreatableTopicResult};
use kafka_protocol::messages::{ApiKey, CreateTopicsRequest, CreateTopicsResponse, TopicName};
use kafka_protocol::ResponseError;

pub(crate) struct CreateTopics;

fn refusal(name: &str, e: AdminError) -> CreatableTopicResult {
    CreatableTopicResult::default()
        .with_name(TopicName(str_bytes(name)))
        .with_error_code(e.code.code())
        .with_error_message(msg(e.message))
        .with_num_partitions(-1)
        .with_replication_factor(-1)
}

/// The start of a created topic's result: Kafka's `error_message` is null on success (the
/// generated default is an empty string, which clients such as aiokafka take for an error).
fn success(name: &str) -> CreatableTopicResult {
    CreatableTopicResult::default()
        .with_name(TopicName(str_bytes(name)))
        .with_error_message(None)
}

/// One topic on a node of a KRaft-configured cluster, decided by the active controller
/// ([`topic_admin::create_in_cluster`]).
async fn create_in_cluster(ctx: &RequestCtx, t: NewTopic, validate_only: bool) -> CreatableTopicResult {
    let name = t.name.clone();
    match topic_admin::create_in_cluster(&ctx.shard, t, validate_only).await {
        Err(e) => refusal(&name, e),
        Ok(created) => {
            let base = success(&name);
            if ctx.version < 5 {
                return base;
            }
            let entries = created_configs(&created.config, &ctx.shard.config);
            base.with_topic_id(if ctx.version >= 7 {
                created.id.0
            } else {
                uuid::Uuid::nil()
            })
            .with_num_partitions(created.partitions)
            .with_replication_factor(created.replication_factor)
            .with_configs(Some(entries))
        }
    }
}

/// A created topic's configs as CreateTopics v5+ answers them.
fn created_configs(topic: &TopicConfig, broker: &Config) -> Vec<CreatableTopicConfigs> {
    topic
        .entries(broker)
        .into_iter()
        .map(|e| {
            CreatableTopicConfigs::default()
                .with_name(str_bytes(e.name))
                .with_value(e.value.map(|v| str_bytes(&v)))
                .with_read_only(e.read_only)
                .with_config_source(e.source.code())
                .with_is_sensitive(e.sensitive)
        })
        .collect()
}

impl Handler for CreateTopics {
    const KEY: ApiKey = ApiKey::CreateTopics;
    const MIN: i16 = 2;
    const MAX: i16 = 7;
    type Request = CreateTopicsRequest;
    type Response = CreateTopicsResponse;

    async fn handle(ctx: Rc<RequestCtx>, req: CreateTopicsRequest) -> Reply<CreateTopicsResponse> {
        // Kafka refuses every copy of a name listed twice.
        let mut counts: HashMap<&str, usize> = HashMap::new();
        for t in &req.topics {
            *counts.entry(t.name.0.as_str()).or_default() += 1;
        }
        let mut results: Vec<Option<CreatableTopicResult>> = Vec::with_capacity(req.topics.len());
        let mut to_create = Vec::new();
        for t in &req.topics {
            let name = t.name.0.as_str();
            if counts.get(name).copied().unwrap_or(0) > 1 {
                results.push(Some(
                    CreatableTopicResult::default()
                        .with_name(t.name.clone())
                        .with_error_code(ResponseError::InvalidRequest.code())
                        .with_error_message(msg(format!(
                            "Create topics request from client contains multiple entries for topic {name}"
                        )))
                        .with_num_partitions(-1)
                        .with_replication_factor(-1),
                ));
                continue;
            }
            results.push(None);
            to_create.push(NewTopic {
                name: name.to_owned(),
                num_partitions: t.num_partitions,
                replication_factor: t.replication_factor,
                assignments: t
                    .assignments
                    .iter()
                    .map(|a| (a.partition_index, a.broker_ids.iter().map(|b| b.0).collect()))
                    .collect(),
                configs: t
                    .configs
                    .iter()
                    .map(|c| {
                        (
                            c.name.as_str().to_owned(),
                            c.value.as_ref().map(|v| v.as_str().to_owned()),
                        )
                    })
                    .collect(),
            });
        }
        if !ctx.shard.config.cluster.is_standalone() {
            let mut created = Vec::with_capacity(to_create.len());
            for t in to_create {
                created.push(create_in_cluster(&ctx, t, req.validate_only).await);
            }
            let mut created = created.into_iter();
            let out = req
                .topics
                .iter()
                .zip(results)
                .filter_map(|(_, done)| done.or_else(|| created.next()))
                .collect();
            return Reply::Now(CreateTopicsResponse::default().with_topics(out));
        }
        let reply = if to_create.is_empty() {
            controller::ControllerReply::not_controller()
        } else {
            controller::call(
                &ctx.shard,
                ControllerOp::CreateTopics {
                    topics: to_create,
                    validate_only: req.validate_only,
                },
            )
            .await
        };
        let mut answers = reply.results.into_iter();
        let config = &ctx.shard.config;
        let version = ctx.version;
        let out = req
            .topics
            .iter()
            .zip(results)
            .map(|(t, done)| {
                if let Some(r) = done {
                    return r;
                }
                let base = success(&t.name);
                match answers.next() {
                    Some(r) => match (r.error, r.topic) {
                        (Some(e), _) => base
                            .with_error_code(e.code.code())
                            .with_error_message(msg(e.message))
                            .with_num_partitions(-1)
                            .with_replication_factor(-1),
                        (None, Some(topic)) => {
                            let configs = created_configs(&topic.config, config);
                            if version >= 5 {
                                base.with_topic_id(if version >= 7 {
                                    topic.id.0
                                } else {
                                    uuid::Uuid::nil()
                                })
                                .with_num_partitions(topic.partitions)
                                .with_replication_factor(1)
                                .with_configs(Some(configs))
                            } else {
                                base
                            }
                        }
                        (None, None) => base
                            .with_error_code(ResponseError::UnknownServerError.code())
                            .with_num_partitions(-1)
                            .with_replication_factor(-1),
                    },
                    None => base
                        .with_error_code(ResponseError::NotController.code())
                        .with_error_message(msg("the controller did not answer"))
                        .with_num_partitions(-1)
                        .with_replication_factor(-1),
                }
            })
            .collect();
        Reply::Now(CreateTopicsResponse::default().with_topics(out))
    }

    fn error_codes(resp: &CreateTopicsResponse, out: &mut Vec<i16>) {
        for t in &resp.topics {
            out.push(t.error_code);
        }
    }
}
