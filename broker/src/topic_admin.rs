//! Topic administration as the doors ask for it (the Kafka admin APIs, the HTTP queue API),
//! in domain terms. A standalone node's controller (`controller.rs`) checks and applies it; on
//! a node of a KRaft-configured cluster a request is checked here against the cluster state
//! (names, config values, limits, defaults) and decided by the active controller
//! (`cluster_link::decide`), wherever it runs. [`call`] takes either road.

use std::rc::Rc;
use std::time::{Duration, Instant};

use kafka_protocol::ResponseError;
use strand_protocol::types::{NodeId, TopicId};

use crate::cluster::control::CreateTopic;
use crate::cluster::record::ConfigResource;
use crate::cluster::rpc::ControlRequest;
use crate::config::{GroupConfig, TopicConfig};
use crate::controller::{self, ControllerOp, ControllerReply, PartitionIncrease, TopicResult};
use crate::metadata::{AdminError, NewTopic, PartitionLimits, TopicMeta};
use crate::shard::Shard;

/// How long [`call`] waits for a topic the cluster created to reach this node's metadata.
const CREATED_TOPIC_WAIT: Duration = Duration::from_secs(10);
/// How often it looks.
const CREATED_TOPIC_POLL: Duration = Duration::from_millis(20);

/// A topic the cluster's active controller created (or, validating only, would create).
#[derive(Debug, Clone)]
pub(crate) struct CreatedTopic {
    pub(crate) id: TopicId,
    pub(crate) partitions: i32,
    pub(crate) replication_factor: i16,
    pub(crate) config: TopicConfig,
}

/// One topic on a node of a KRaft-configured cluster: names, config values and limits are
/// checked here, defaults resolved (`num.partitions`; `default.replication.factor` for -1), the
/// replication factor checked against the live brokers, and the creation decided by the active
/// controller, wherever it runs.
pub(crate) async fn create_in_cluster(
    shard: &Rc<Shard>,
    t: NewTopic,
    validate_only: bool,
) -> Result<CreatedTopic, AdminError> {
    let config = &shard.config;
    let state = shard.cluster_state().unwrap_or_default();
    let name = t.name.clone();
    if let Some(m) = crate::internal_topics::refuse_client_create(&name) {
        if state.topic_by_name(&name).is_none() {
            return Err(AdminError::new(ResponseError::InvalidRequest, m));
        }
    }
    strand_protocol::types::validate_topic_name(&name)
        .map_err(|m| AdminError::new(ResponseError::InvalidTopicException, m))?;
    let mut topic_config = TopicConfig::default();
    let mut configs = Vec::with_capacity(t.configs.len());
    for (k, v) in &t.configs {
        let Some(v) = v else {
            return Err(AdminError::new(
                ResponseError::InvalidConfig,
                format!("Null value not supported for topic configs: {k}"),
            ));
        };
        topic_config
            .set(k, v)
            .map_err(|e| AdminError::new(ResponseError::InvalidConfig, e.to_string()))?;
        configs.push((k.clone(), v.clone()));
    }
    controller::check_topic_config(&name, None, &topic_config)?;
    let manual = !t.assignments.is_empty();
    let (partitions, rf) = if manual {
        if t.num_partitions != -1 || t.replication_factor != -1 {
            return Err(AdminError::new(
                ResponseError::InvalidRequest,
                "Both numPartitions or replicationFactor and replicasAssignments were set. Both cannot be used at the same time.",
            ));
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
            return Err(AdminError::new(
                ResponseError::InvalidPartitions,
                "Number of partitions must be larger than 0.",
            ));
        }
        let rf = if t.replication_factor == -1 {
            i16::try_from(config.cluster.default_replication_factor).unwrap_or(i16::MAX)
        } else {
            t.replication_factor
        };
        if rf <= 0 {
            return Err(AdminError::new(
                ResponseError::InvalidReplicationFactor,
                "Replication factor must be larger than 0.",
            ));
        }
        // Whether enough brokers are alive is the active controller's to say (placement), after
        // whether the topic exists: this node's view of the cluster may be behind (a node that
        // just restarted has none), and an existing topic is TOPIC_ALREADY_EXISTS whatever
        // the factor.
        (partitions, rf)
    };
    PartitionLimits::of(config).check_request(u64::try_from(partitions).unwrap_or(0))?;
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
        crate::cluster_link::decide(shard, req).await?;
    }
    Ok(CreatedTopic {
        id,
        partitions,
        replication_factor: rf,
        config: topic_config,
    })
}

/// Grows a topic on a node of a KRaft-configured cluster: the active controller decides.
pub(crate) async fn create_partitions_in_cluster(
    shard: &Rc<Shard>,
    name: &str,
    count: i32,
    assignments: Option<Vec<Vec<NodeId>>>,
) -> Result<(), AdminError> {
    if let Some(m) = crate::internal_topics::refuse_create_partitions(name) {
        return Err(AdminError::new(ResponseError::InvalidRequest, m));
    }
    let change = ControlRequest::CreatePartitions {
        name: name.to_owned(),
        count,
        assignments,
    };
    crate::cluster_link::decide(shard, change).await.map(|_| ())
}

/// The config record entries that turn the overrides `old` into `new`: a changed or added key
/// with its value, a removed one with none.
fn changes(old: &[(&'static str, String)], new: &[(&'static str, String)]) -> Vec<(String, Option<String>)> {
    let mut out: Vec<(String, Option<String>)> = new
        .iter()
        .filter(|(k, v)| !old.iter().any(|(ok, ov)| ok == k && ov == v))
        .map(|(k, v)| ((*k).to_owned(), Some(v.clone())))
        .collect();
    out.extend(
        old.iter()
            .filter(|(k, _)| !new.iter().any(|(nk, _)| nk == k))
            .map(|(k, _)| ((*k).to_owned(), None)),
    );
    out
}

/// A config change on a node of a KRaft-configured cluster: the edits applied to the overrides
/// the cluster state holds and checked here (values, internal-topic rules, group bounds), the
/// resulting changes decided by the active controller.
pub(crate) async fn alter_in_cluster(shard: &Rc<Shard>, op: ControllerOp) -> Result<(), AdminError> {
    let state = shard.cluster_state().unwrap_or_default();
    let (resource, entries, validate_only) = match op {
        ControllerOp::AlterTopicConfig {
            name,
            edits,
            replace,
            validate_only,
        } => {
            if state.topic_by_name(&name).is_none() {
                return Err(AdminError::new(
                    ResponseError::UnknownTopicOrPartition,
                    format!("The topic '{name}' does not exist."),
                ));
            }
            let resource = ConfigResource::Topic(name.clone());
            let pairs = state.configs(&resource).into_iter().flatten();
            let old = TopicConfig::from_pairs(pairs.map(|(k, v)| (k.as_str(), v.as_str())))
                .map_err(|e| AdminError::new(ResponseError::InvalidConfig, e.to_string()))?;
            let new = controller::apply_edits(&old, &edits, replace)?;
            controller::check_topic_config(&name, Some(&old), &new)?;
            (
                resource,
                changes(&old.overrides(), &new.overrides()),
                validate_only,
            )
        }
        ControllerOp::AlterGroupConfig {
            group,
            edits,
            replace,
            validate_only,
        } => {
            let resource = ConfigResource::Group(group);
            let mut old = GroupConfig::default();
            for (k, v) in state.configs(&resource).into_iter().flatten() {
                old.set(k, v)
                    .map_err(|e| AdminError::new(ResponseError::InvalidConfig, e.to_string()))?;
            }
            let new = controller::apply_group_edits(&old, &edits, replace, &shard.config)?;
            (
                resource,
                changes(&old.overrides(), &new.overrides()),
                validate_only,
            )
        }
        _ => {
            return Err(AdminError::new(
                ResponseError::InvalidRequest,
                "not a config change",
            ))
        }
    };
    if validate_only || entries.is_empty() {
        return Ok(());
    }
    crate::cluster_link::decide(shard, ControlRequest::AlterConfigs { resource, entries })
        .await
        .map(|_| ())
}

/// Waits (bounded) until this node's metadata holds `name` with at least `partitions`
/// partitions: the cluster's decisions reach a node as it applies the committed state.
async fn applied_here(shard: &Rc<Shard>, name: &str, partitions: i32) -> Option<TopicMeta> {
    let deadline = Instant::now() + CREATED_TOPIC_WAIT;
    loop {
        if let Some(t) = shard
            .metadata()
            .topic(name)
            .filter(|t| t.partitions >= partitions)
        {
            return Some(t.clone());
        }
        if Instant::now() >= deadline {
            return None;
        }
        glommio::timer::sleep(CREATED_TOPIC_POLL).await;
    }
}

fn result(name: &str, outcome: Result<Option<TopicMeta>, AdminError>) -> TopicResult {
    match outcome {
        Ok(topic) => TopicResult {
            name: Some(name.to_owned()),
            id: topic.as_ref().map_or(TopicId(uuid::Uuid::nil()), |t| t.id),
            error: None,
            topic,
        },
        Err(e) => TopicResult {
            name: Some(name.to_owned()),
            id: TopicId(uuid::Uuid::nil()),
            error: Some(e),
            topic: None,
        },
    }
}

/// A topic administration request from a door other than the Kafka admin APIs (the HTTP queue
/// API, dead-letter topics): the standalone controller, or in a cluster the active
/// controller's decision, answered once this node's metadata shows it (so the caller can use
/// the topic at once). Creation, growth and topic config changes; other operations go to
/// [`controller::call`].
pub(crate) async fn call(shard: &Rc<Shard>, op: ControllerOp) -> ControllerReply {
    if shard.config.cluster.is_standalone() {
        return controller::call(shard, op).await;
    }
    let results = match op {
        ControllerOp::CreateTopics {
            topics,
            validate_only,
        } => {
            let mut out = Vec::with_capacity(topics.len());
            for t in topics {
                let name = t.name.clone();
                let outcome = match create_in_cluster(shard, t, validate_only).await {
                    Ok(_) if validate_only => Ok(None),
                    Ok(c) => applied_here(shard, &name, c.partitions)
                        .await
                        .map(Some)
                        .ok_or_else(|| {
                            AdminError::new(
                                ResponseError::RequestTimedOut,
                                format!("{name} was created but has not reached this node yet"),
                            )
                        }),
                    Err(e) => Err(e),
                };
                out.push(result(&name, outcome));
            }
            out
        }
        ControllerOp::CreatePartitions {
            topics,
            validate_only,
        } => {
            let mut out = Vec::with_capacity(topics.len());
            for PartitionIncrease {
                topic,
                count,
                assignments,
            } in topics
            {
                let assignments = assignments.map(|a| {
                    a.into_iter()
                        .map(|r| r.into_iter().map(NodeId).collect())
                        .collect()
                });
                let outcome = if validate_only {
                    Ok(None)
                } else {
                    match create_partitions_in_cluster(shard, &topic, count, assignments).await {
                        Ok(()) => Ok(applied_here(shard, &topic, count).await),
                        Err(e) => Err(e),
                    }
                };
                out.push(result(&topic, outcome));
            }
            out
        }
        op @ (ControllerOp::AlterTopicConfig { .. } | ControllerOp::AlterGroupConfig { .. }) => {
            let name = match &op {
                ControllerOp::AlterTopicConfig { name, .. } => name.clone(),
                ControllerOp::AlterGroupConfig { group, .. } => group.clone(),
                _ => String::new(),
            };
            vec![result(&name, alter_in_cluster(shard, op).await.map(|()| None))]
        }
        other => return controller::call(shard, other).await,
    };
    ControllerReply {
        results,
        producer_id: None,
    }
}

#[cfg(test)]
mod tests {
    use super::changes;

    #[test]
    fn config_changes_name_what_is_set_changed_or_removed() {
        let old = vec![
            ("retention.ms", "1".to_owned()),
            ("segment.bytes", "9".to_owned()),
        ];
        let new = vec![
            ("retention.ms", "2".to_owned()),
            ("cleanup.policy", "compact".to_owned()),
        ];
        let mut c = changes(&old, &new);
        c.sort();
        assert_eq!(
            c,
            vec![
                ("cleanup.policy".to_owned(), Some("compact".to_owned())),
                ("retention.ms".to_owned(), Some("2".to_owned())),
                ("segment.bytes".to_owned(), None),
            ]
        );
        assert!(changes(&old, &old).is_empty());
    }
}
