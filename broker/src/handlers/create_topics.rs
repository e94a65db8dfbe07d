//! CreateTopics (19): validated and applied by the controller; the answer (v5+) carries the new
//! topic's partition count, replication factor and configs.

use std::collections::HashMap;
use std::rc::Rc;

use kafka_protocol::messages::create_topics_response::{CreatableTopicConfigs, CreatableTopicResult};
use kafka_protocol::messages::{ApiKey, CreateTopicsRequest, CreateTopicsResponse, TopicName};
use kafka_protocol::ResponseError;
use strand_protocol::types::{NodeId, TopicId};

use super::{msg, str_bytes, Handler, Reply, RequestCtx};
use crate::cluster::control::CreateTopic;
use crate::cluster::rpc::ControlRequest;
use crate::config::{Config, TopicConfig};
use crate::controller::{self, ControllerOp};
use crate::metadata::{AdminError, NewTopic, PartitionLimits};

pub(crate) struct CreateTopics;

fn refusal(name: &str, e: AdminError) -> CreatableTopicResult {
    CreatableTopicResult::default()
        .with_name(TopicName(str_bytes(name)))
        .with_error_code(e.code.code())
        .with_error_message(msg(e.message))
        .with_num_partitions(-1)
        .with_replication_factor(-1)
}

/// One topic on a node of a KRaft-configured cluster: names, config values and limits are
/// checked here, defaults resolved (`num.partitions`; `default.replication.factor` for -1), the
/// replication factor checked against the live brokers, and the creation decided by the active
/// controller, wherever it runs.
async fn create_in_cluster(ctx: &RequestCtx, t: NewTopic, validate_only: bool) -> CreatableTopicResult {
    let shard = &ctx.shard;
    let config = &shard.config;
    let state = shard.cluster_state().unwrap_or_default();
    let name = t.name.clone();
    if let Some(m) = crate::internal_topics::refuse_client_create(&name) {
        if state.topic_by_name(&name).is_none() {
            return refusal(&name, AdminError::new(ResponseError::InvalidRequest, m));
        }
    }
    if let Err(m) = strand_protocol::types::validate_topic_name(&name) {
        return refusal(&name, AdminError::new(ResponseError::InvalidTopicException, m));
    }
    let mut topic_config = TopicConfig::default();
    let mut configs = Vec::with_capacity(t.configs.len());
    for (k, v) in &t.configs {
        let Some(v) = v else {
            return refusal(
                &name,
                AdminError::new(
                    ResponseError::InvalidConfig,
                    format!("Null value not supported for topic configs: {k}"),
                ),
            );
        };
        if let Err(e) = topic_config.set(k, v) {
            return refusal(
                &name,
                AdminError::new(ResponseError::InvalidConfig, e.to_string()),
            );
        }
        configs.push((k.clone(), v.clone()));
    }
    if let Err(e) = controller::check_topic_config(&name, None, &topic_config) {
        return refusal(&name, e);
    }
    let manual = !t.assignments.is_empty();
    let (partitions, rf) = if manual {
        if t.num_partitions != -1 || t.replication_factor != -1 {
            return refusal(
                &name,
                AdminError::new(
                    ResponseError::InvalidRequest,
                    "Both numPartitions or replicationFactor and replicasAssignments were set. Both cannot be used at the same time.",
                ),
            );
        }
        let rf = t.assignments.first().map_or(0, |(_, r)| r.len());
        (
            i32::try_from(t.assignments.len()).unwrap_or(i32::MAX),
            i16::try_from(rf).unwrap_or(i16::MAX),
        )
    } else {
        let partitions = if t.num_partitions == -1 {
            i32::try_from(config.num_partitions).unwrap_or(1)
        } else {
            t.num_partitions
        };
        if partitions <= 0 {
            return refusal(
                &name,
                AdminError::new(
                    ResponseError::InvalidPartitions,
                    "Number of partitions must be larger than 0.",
                ),
            );
        }
        let rf = if t.replication_factor == -1 {
            i16::try_from(config.cluster.default_replication_factor).unwrap_or(i16::MAX)
        } else {
            t.replication_factor
        };
        if rf <= 0 {
            return refusal(
                &name,
                AdminError::new(
                    ResponseError::InvalidReplicationFactor,
                    "Replication factor must be larger than 0.",
                ),
            );
        }
        // Whether enough brokers are alive is the active controller's to say (placement), after
        // whether the topic exists: this node's view of the cluster may be behind (a node that
        // just restarted has none), and an existing topic is TOPIC_ALREADY_EXISTS whatever
        // the factor.
        (partitions, rf)
    };
    if let Err(e) = PartitionLimits::of(config).check_request(u64::try_from(partitions).unwrap_or(0)) {
        return refusal(&name, e);
    }
    let id = TopicId(uuid::Uuid::new_v4());
    if !validate_only {
        let req = ControlRequest::CreateTopic(CreateTopic {
            name: name.clone(),
            id,
            partitions: if manual { -1 } else { partitions },
            replication_factor: if manual { -1 } else { rf },
            assignments: t
                .assignments
                .iter()
                .map(|(p, r)| (*p, r.iter().map(|b| NodeId(*b)).collect()))
                .collect(),
            configs,
        });
        if let Err(e) = crate::cluster_link::decide(&ctx.shard, req).await {
            return refusal(&name, e);
        }
    }
    let base = CreatableTopicResult::default().with_name(TopicName(str_bytes(&name)));
    if ctx.version < 5 {
        return base;
    }
    let entries = created_configs(&topic_config, config);
    base.with_topic_id(if ctx.version >= 7 { id.0 } else { uuid::Uuid::nil() })
        .with_num_partitions(partitions)
        .with_replication_factor(rf)
        .with_configs(Some(entries))
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
                let base = CreatableTopicResult::default().with_name(t.name.clone());
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
