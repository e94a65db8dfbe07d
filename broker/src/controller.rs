//! The controller: validates and applies topic administration (create, delete, add partitions,
//! config changes) one operation at a time, persists the metadata, and broadcasts the change to
//! every shard. It lives on shard 0, as a service of the shard core
//! ([`crate::shard::service`]); [`call`] sends it an operation from any shard.
//!
//! An operation is validated against a copy of the [`ClusterMetadata`], which turns it into
//! deltas; the new state is written to `strand-metadata.json` before any shard sees it (a crash
//! then finds the old state or the new one, and start-up removes the logs of deleted topics),
//! and a change that cannot be written fails whole. Then every shard applies the deltas in two
//! phases ([`broadcast_metadata`]): each opens its new logs and removes deleted ones, and only
//! then does each take the new metadata into its replica. Group configs (resource type
//! GROUP, the share groups' among them) are cluster metadata too, changed here. The controller
//! also hands out idempotent producer ids, in blocks that cost one metadata write each.

use std::cell::RefCell;
use std::path::PathBuf;
use std::rc::Rc;

use kafka_protocol::ResponseError;
use strand_protocol::types::TopicId;
use strand_storage::fs::Fs;
use strand_storage::fs_glommio::GlommioFs;

use crate::metadata::{
    partitions_u64, AdminError, ClusterMetadata, MetadataDelta, NewTopic, PartitionLimit, PartitionLimits,
    TopicMeta,
};
use crate::shard::service::Service;
use crate::shard::{broadcast_metadata, Shard};

use futures::future::LocalBoxFuture;
use futures::FutureExt;
use strand_protocol::types::ShardId;

/// Name of the metadata file in the log directory.
pub(crate) const METADATA_FILE: &str = "strand-metadata.json";

/// A topic named by name or by id (DeleteTopics v6).
#[derive(Debug, Clone)]
pub(crate) enum TopicRef {
    Name(String),
    Id(TopicId),
}

/// An admin operation.
#[derive(Debug, Clone)]
pub(crate) enum ControllerOp {
    CreateTopics {
        topics: Vec<NewTopic>,
        validate_only: bool,
    },
    DeleteTopics {
        topics: Vec<TopicRef>,
    },
    CreatePartitions {
        topics: Vec<PartitionIncrease>,
        validate_only: bool,
    },
    /// Edit a topic's config overrides: IncrementalAlterConfigs, or AlterConfigs with `replace`
    /// (all overrides not set by the edits are removed).
    AlterTopicConfig {
        name: String,
        edits: Vec<ConfigEdit>,
        replace: bool,
        validate_only: bool,
    },
    /// Edit a group's config overrides (resource type GROUP): IncrementalAlterConfigs, or
    /// AlterConfigs with `replace`. The group need not exist (Kafka allows configuring a group
    /// before its first member joins).
    AlterGroupConfig {
        group: String,
        edits: Vec<ConfigEdit>,
        replace: bool,
        validate_only: bool,
    },
    /// A new idempotent producer id (InitProducerId).
    AllocateProducerId,
}

/// Most groups with config overrides (a bound, not a Kafka limit).
pub(crate) const MAX_GROUP_CONFIGS: usize = 10_000;

/// Applies edits to a group config and checks the result against the broker's bounds; Kafka's
/// error messages on failure. No group config is a list, so APPEND and SUBTRACT are refused.
pub(crate) fn apply_group_edits(
    current: &crate::config::GroupConfig,
    edits: &[ConfigEdit],
    replace: bool,
    broker: &crate::config::Config,
) -> Result<crate::config::GroupConfig, AdminError> {
    let invalid = |m: String| AdminError::new(ResponseError::InvalidConfig, m);
    let mut config = if replace {
        crate::config::GroupConfig::default()
    } else {
        current.clone()
    };
    for e in edits {
        match e {
            ConfigEdit::Set(k, v) => config.set(k, v).map_err(|e| invalid(e.to_string()))?,
            ConfigEdit::Delete(k) => {
                config.remove(k).map_err(|e| invalid(e.to_string()))?;
            }
            ConfigEdit::Append(k, _) | ConfigEdit::Subtract(k, _) => {
                if !crate::config::GroupConfig::is_known_key(k) {
                    return Err(invalid(format!("Unknown group config name: {k}")));
                }
                return Err(invalid(format!(
                    "Config value append/subtract is not allowed for config key {k}, which is not a list"
                )));
            }
        }
    }
    config.check_bounds(broker).map_err(|e| invalid(e.to_string()))?;
    Ok(config)
}

/// CreatePartitions entry: topic, new total count, optional replica assignments.
#[derive(Debug, Clone)]
pub(crate) struct PartitionIncrease {
    pub(crate) topic: String,
    pub(crate) count: i32,
    pub(crate) assignments: Option<Vec<Vec<i32>>>,
}

/// One change to a topic config override (IncrementalAlterConfigs operations).
#[derive(Debug, Clone)]
pub(crate) enum ConfigEdit {
    Set(String, String),
    Delete(String),
    Append(String, String),
    Subtract(String, String),
}

/// Applies edits to a topic config; Kafka's error messages on failure.
pub(crate) fn apply_edits(
    current: &crate::config::TopicConfig,
    edits: &[ConfigEdit],
    replace: bool,
) -> Result<crate::config::TopicConfig, AdminError> {
    use crate::config::TopicConfig;
    let invalid = |m: String| AdminError::new(ResponseError::InvalidConfig, m);
    let mut config = if replace {
        TopicConfig::default()
    } else {
        current.clone()
    };
    let split = |v: &str| -> Vec<String> {
        v.split(',')
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .collect()
    };
    for e in edits {
        match e {
            ConfigEdit::Set(k, v) => config.set(k, v).map_err(|e| invalid(e.to_string()))?,
            ConfigEdit::Delete(k) => {
                config.remove(k).map_err(|e| invalid(e.to_string()))?;
            }
            ConfigEdit::Append(k, v) | ConfigEdit::Subtract(k, v) => {
                if k != "cleanup.policy" {
                    return Err(invalid(format!(
                        "Config value append/subtract is not allowed for config key {k}, which is not a list"
                    )));
                }
                // Kafka appends to and subtracts from the value in force: the override, or
                // else the default (APPEND compact to the default gives delete,compact).
                let current = config
                    .get(k)
                    .unwrap_or_else(|| crate::config::CLEANUP_POLICY_DEFAULT.to_string());
                let mut items = split(&current);
                let given = split(v);
                if matches!(e, ConfigEdit::Append(..)) {
                    for g in given {
                        if !items.contains(&g) {
                            items.push(g);
                        }
                    }
                } else {
                    items.retain(|i| !given.contains(i));
                }
                // What is left is set even when empty: an explicit empty list, as Kafka sets
                // it, not the default.
                config
                    .set(k, &items.join(","))
                    .map_err(|e| invalid(e.to_string()))?;
            }
        }
    }
    Ok(config)
}

/// Refuses a topic config the internal-topic rules forbid ([`crate::internal_topics`]): a
/// change of a setting that decides when an internal topic's records are deleted
/// (POLICY_VIOLATION), and a queue dead-letter topic clients may not produce to
/// (INVALID_CONFIG). `old` is `None` for a topic being created. Only what changes is checked,
/// so a setting stored before these rules can still be corrected.
pub(crate) fn check_topic_config(
    topic: &str,
    old: Option<&crate::config::TopicConfig>,
    new: &crate::config::TopicConfig,
) -> Result<(), AdminError> {
    use crate::internal_topics::{refuse_config_change, refuse_dead_letter_target, PROTECTED_CONFIGS};
    if let Some(old) = old {
        for key in PROTECTED_CONFIGS {
            if old.get(key) != new.get(key) {
                if let Some(m) = refuse_config_change(topic, key) {
                    return Err(AdminError::new(ResponseError::PolicyViolation, m));
                }
            }
        }
    }
    let dlq = new.queue_settings().dead_letter_topic;
    if dlq != old.and_then(|o| o.queue_settings().dead_letter_topic) {
        if let Some(m) = dlq.as_deref().and_then(refuse_dead_letter_target) {
            return Err(AdminError::new(ResponseError::InvalidConfig, m));
        }
    }
    Ok(())
}

/// Per-topic result, in request order.
#[derive(Debug, Clone)]
pub(crate) struct TopicResult {
    pub(crate) name: Option<String>,
    pub(crate) id: TopicId,
    pub(crate) error: Option<AdminError>,
    /// The topic as created or changed.
    pub(crate) topic: Option<TopicMeta>,
}

#[derive(Debug, Clone)]
pub(crate) struct ControllerReply {
    pub(crate) results: Vec<TopicResult>,
    /// For `AllocateProducerId`: the new id, or why there is none.
    pub(crate) producer_id: Option<Result<i64, String>>,
}

impl ControllerReply {
    pub(crate) fn not_controller() -> Self {
        ControllerReply {
            results: Vec::new(),
            producer_id: None,
        }
    }

    fn topics(results: Vec<TopicResult>) -> Self {
        ControllerReply {
            results,
            producer_id: None,
        }
    }
}

/// A refusal by a partition limit: which limit, and Kafka's answer.
pub(crate) type LimitRefusal = (PartitionLimit, AdminError);

/// Counts and logs a refusal by a partition limit.
fn refused((limit, e): LimitRefusal) -> LimitRefusal {
    metrics::counter!("strand_partition_limit_refusals_total", "limit" => limit.label()).increment(1);
    tracing::warn!(limit = limit.label(), error = %e.message, "partitions refused");
    (limit, e)
}

/// Checks that a topic may have `topic_partitions` and that the node may hold `added` more.
fn check_added(
    md: &ClusterMetadata,
    limits: &PartitionLimits,
    topic_partitions: i32,
    added: u64,
) -> Result<(), LimitRefusal> {
    limits
        .check_topic(topic_partitions)
        .map_err(|e| (PartitionLimit::Topic, e))?;
    md.check_node_partitions(added, limits)
        .map_err(|e| (PartitionLimit::Node, e))
}

/// The partition limits checked, against this shard's copy of the metadata, for a request that
/// makes several controller operations (an HTTP PUT that creates a queue and its dead-letter
/// topic): it may add `added` partitions in all and leave a topic with `topic_partitions`.
/// Checking before the first operation keeps the request from being refused half done; each
/// operation is checked again by the controller. A refusal is counted and logged.
pub(crate) fn check_partitions_added(
    shard: &Shard,
    topic_partitions: i32,
    added: u64,
) -> Result<(), LimitRefusal> {
    let limits = PartitionLimits::of(&shard.config);
    limits
        .check_topic(topic_partitions)
        .map_err(|e| (PartitionLimit::Topic, e))
        .and_then(|()| {
            limits
                .check_request(added)
                .map_err(|e| (PartitionLimit::Request, e))
        })
        .and_then(|()| check_added(&shard.metadata(), &limits, topic_partitions, added))
        .map_err(refused)
}

/// Producer ids are reserved in blocks of this size: one metadata write per block.
const PRODUCER_ID_BLOCK: i64 = 1000;

pub(crate) struct Controller {
    core: Rc<Shard>,
    lock: glommio::sync::Semaphore,
    state: RefCell<ClusterMetadata>,
    /// The shard's file system, which writes the metadata file.
    fs: GlommioFs,
    path: PathBuf,
    node_id: i32,
    /// Next producer id to hand out; below `state.producer_id_block_end`.
    next_producer_id: std::cell::Cell<i64>,
}

impl Controller {
    /// The controller of shard 0 (`core`), with the metadata as loaded at start-up.
    pub(crate) fn new(core: Rc<Shard>, state: ClusterMetadata, log_dir: PathBuf, node_id: i32) -> Self {
        Controller {
            fs: core.store.fs().clone(),
            core,
            lock: glommio::sync::Semaphore::new(1),
            // Ids of a block reserved before a restart may have been used: start after it.
            next_producer_id: std::cell::Cell::new(state.producer_id_block_end),
            state: RefCell::new(state),
            path: log_dir.join(METADATA_FILE),
            node_id,
        }
    }

    /// Runs one admin operation to completion; operations never interleave.
    async fn run(&self, op: ControllerOp) -> ControllerReply {
        let shard = &self.core;
        let Ok(_permit) = self.lock.acquire_permit(1).await else {
            return ControllerReply::not_controller();
        };
        if let ControllerOp::AllocateProducerId = op {
            return ControllerReply {
                results: Vec::new(),
                producer_id: Some(self.allocate_producer_id().await),
            };
        }
        let mut scratch = self.state.borrow().clone();
        let mut results = Vec::new();
        let mut deltas = Vec::new();
        let validate_only = match &op {
            ControllerOp::CreateTopics { validate_only, .. }
            | ControllerOp::CreatePartitions { validate_only, .. }
            | ControllerOp::AlterTopicConfig { validate_only, .. }
            | ControllerOp::AlterGroupConfig { validate_only, .. } => *validate_only,
            ControllerOp::DeleteTopics { .. } | ControllerOp::AllocateProducerId => false,
        };
        let limits = PartitionLimits::of(&shard.config);
        match op {
            ControllerOp::CreateTopics { topics, .. } => {
                let default_partitions = i32::try_from(shard.config.num_partitions).unwrap_or(1);
                // Kafka refuses the whole request first when it asks for too many partitions.
                let requested = topics
                    .iter()
                    .map(|t| t.requested_partitions(default_partitions))
                    .fold(0u64, u64::saturating_add);
                let too_many = limits
                    .check_request(requested)
                    .err()
                    .map(|e| refused((PartitionLimit::Request, e)).1);
                for t in topics {
                    let id = TopicId(uuid::Uuid::new_v4());
                    let planned = match crate::internal_topics::refuse_client_create(&t.name) {
                        // An existing one is TOPIC_ALREADY_EXISTS, as in Kafka.
                        Some(m) if scratch.topic(&t.name).is_none() => {
                            Err(AdminError::new(ResponseError::InvalidRequest, m))
                        }
                        _ => match &too_many {
                            Some(e) => Err(e.clone()),
                            None => scratch
                                .plan_create(&t, default_partitions, self.node_id, id)
                                .and_then(|delta| {
                                    if let MetadataDelta::CreateTopic(m) = &delta {
                                        check_topic_config(&m.name, None, &m.config)?;
                                        check_added(
                                            &scratch,
                                            &limits,
                                            m.partitions,
                                            partitions_u64(m.partitions),
                                        )
                                        .map_err(|r| refused(r).1)?;
                                    }
                                    Ok(delta)
                                }),
                        },
                    };
                    match planned {
                        Ok(delta) => {
                            scratch.apply(&delta);
                            let topic = match &delta {
                                MetadataDelta::CreateTopic(m) => Some(m.clone()),
                                _ => None,
                            };
                            deltas.push(delta);
                            results.push(TopicResult {
                                name: Some(t.name),
                                id,
                                error: None,
                                topic,
                            });
                        }
                        Err(e) => results.push(TopicResult {
                            name: Some(t.name),
                            id: TopicId::ZERO,
                            error: Some(e),
                            topic: None,
                        }),
                    }
                }
            }
            ControllerOp::DeleteTopics { topics } => {
                for r in topics {
                    let found = match &r {
                        TopicRef::Name(n) => scratch.topic(n).cloned(),
                        TopicRef::Id(id) => scratch.topic_by_id(*id).cloned(),
                    };
                    match found {
                        Some(t) if t.internal => results.push(TopicResult {
                            error: Some(AdminError::new(
                                ResponseError::TopicDeletionDisabled,
                                crate::internal_topics::refuse_delete_topic(&t.name).unwrap_or_default(),
                            )),
                            name: Some(t.name),
                            id: t.id,
                            topic: None,
                        }),
                        Some(t) => {
                            let delta = MetadataDelta::DeleteTopic {
                                name: t.name.clone(),
                                id: t.id,
                            };
                            scratch.apply(&delta);
                            deltas.push(delta);
                            results.push(TopicResult {
                                name: Some(t.name.clone()),
                                id: t.id,
                                error: None,
                                topic: Some(t),
                            });
                        }
                        None => {
                            let (name, id, code) = match r {
                                TopicRef::Name(n) => {
                                    (Some(n), TopicId::ZERO, ResponseError::UnknownTopicOrPartition)
                                }
                                TopicRef::Id(id) => (None, id, ResponseError::UnknownTopicId),
                            };
                            results.push(TopicResult {
                                name,
                                id,
                                error: Some(AdminError::new(code, "This server does not host this topic.")),
                                topic: None,
                            });
                        }
                    }
                }
            }
            ControllerOp::CreatePartitions { topics, .. } => {
                let requested = topics
                    .iter()
                    .map(|t| {
                        scratch
                            .topic(&t.topic)
                            .map_or(0, |m| partitions_u64(t.count.saturating_sub(m.partitions)))
                    })
                    .fold(0u64, u64::saturating_add);
                let too_many = limits
                    .check_request(requested)
                    .err()
                    .map(|e| refused((PartitionLimit::Request, e)).1);
                for PartitionIncrease {
                    topic: name,
                    count,
                    assignments,
                } in topics
                {
                    let planned = match crate::internal_topics::refuse_create_partitions(&name) {
                        Some(m) => Err(AdminError::new(ResponseError::PolicyViolation, m)),
                        None => match &too_many {
                            Some(e) => Err(e.clone()),
                            None => {
                                let current = scratch.topic(&name).map_or(0, |m| m.partitions);
                                scratch
                                    .plan_create_partitions(
                                        &name,
                                        count,
                                        assignments.as_deref(),
                                        self.node_id,
                                    )
                                    .and_then(|delta| {
                                        check_added(
                                            &scratch,
                                            &limits,
                                            count,
                                            partitions_u64(count - current),
                                        )
                                        .map_err(|r| refused(r).1)?;
                                        Ok(delta)
                                    })
                            }
                        },
                    };
                    match planned {
                        Ok(delta) => {
                            scratch.apply(&delta);
                            deltas.push(delta);
                            results.push(TopicResult {
                                id: scratch.topic(&name).map_or(TopicId::ZERO, |t| t.id),
                                topic: scratch.topic(&name).cloned(),
                                name: Some(name),
                                error: None,
                            });
                        }
                        Err(e) => results.push(TopicResult {
                            name: Some(name),
                            id: TopicId::ZERO,
                            error: Some(e),
                            topic: None,
                        }),
                    }
                }
            }
            // Answered above, before any topic work.
            ControllerOp::AllocateProducerId => {}
            ControllerOp::AlterGroupConfig {
                group,
                edits,
                replace,
                ..
            } => {
                let current = scratch.group_config(&group).cloned().unwrap_or_default();
                let result = if group.is_empty() {
                    Err(AdminError::new(
                        ResponseError::InvalidRequest,
                        "Group name must not be empty.",
                    ))
                } else {
                    apply_group_edits(&current, &edits, replace, &shard.config).and_then(|config| {
                        let adds = current.is_empty() && !config.is_empty();
                        if adds && scratch.group_config_count() >= MAX_GROUP_CONFIGS {
                            Err(AdminError::new(
                                ResponseError::PolicyViolation,
                                format!("At most {MAX_GROUP_CONFIGS} groups may have config overrides."),
                            ))
                        } else {
                            Ok(config)
                        }
                    })
                };
                match result {
                    Ok(config) => {
                        if config != current {
                            let delta = MetadataDelta::SetGroupConfig {
                                group: group.clone(),
                                config,
                            };
                            scratch.apply(&delta);
                            deltas.push(delta);
                        }
                        results.push(TopicResult {
                            name: Some(group),
                            id: TopicId::ZERO,
                            error: None,
                            topic: None,
                        });
                    }
                    Err(e) => results.push(TopicResult {
                        name: Some(group),
                        id: TopicId::ZERO,
                        error: Some(e),
                        topic: None,
                    }),
                }
            }
            ControllerOp::AlterTopicConfig {
                name, edits, replace, ..
            } => {
                let result = match scratch.topic(&name).cloned() {
                    None => Err(AdminError::new(
                        ResponseError::UnknownTopicOrPartition,
                        format!("Topic {name} does not exist."),
                    )),
                    Some(t) => apply_edits(&t.config, &edits, replace).and_then(|config| {
                        check_topic_config(&name, Some(&t.config), &config).map(|()| (t, config))
                    }),
                };
                match result {
                    Ok((t, config)) => {
                        let delta = MetadataDelta::SetTopicConfig {
                            name: name.clone(),
                            config,
                        };
                        scratch.apply(&delta);
                        deltas.push(delta);
                        results.push(TopicResult {
                            name: Some(name.clone()),
                            id: t.id,
                            error: None,
                            topic: scratch.topic(&name).cloned(),
                        });
                    }
                    Err(e) => results.push(TopicResult {
                        name: Some(name),
                        id: TopicId::ZERO,
                        error: Some(e),
                        topic: None,
                    }),
                }
            }
        }
        if validate_only || deltas.is_empty() {
            return ControllerReply::topics(results);
        }
        // Persist before anyone sees the change: a crash now finds either the old state or the
        // new one, and logs of deleted topics are cleaned up at start-up.
        if let Err(e) = self.fs.write_file_atomic(&self.path, scratch.to_json()).await {
            tracing::error!(error = %e, "cannot persist metadata");
            for r in &mut results {
                if r.error.is_none() {
                    r.error = Some(AdminError::new(
                        ResponseError::KafkaStorageError,
                        format!("cannot persist metadata: {e}"),
                    ));
                    r.topic = None;
                }
            }
            return ControllerReply::topics(results);
        }
        *self.state.borrow_mut() = scratch;
        let problems = broadcast_metadata(shard, deltas).await;
        for p in &problems {
            tracing::error!(problem = %p, "applying a metadata change");
        }
        ControllerReply::topics(results)
    }

    /// Hands out the next producer id, reserving (persisting) a new block when the current one
    /// is used up. Runs under the controller lock.
    async fn allocate_producer_id(&self) -> Result<i64, String> {
        let id = self.next_producer_id.get();
        if id >= self.state.borrow().producer_id_block_end {
            let mut next = self.state.borrow().clone();
            next.producer_id_block_end = id + PRODUCER_ID_BLOCK;
            self.fs
                .write_file_atomic(&self.path, next.to_json())
                .await
                .map_err(|e| format!("cannot persist the producer id block: {e}"))?;
            self.state.borrow_mut().producer_id_block_end = next.producer_id_block_end;
        }
        self.next_producer_id.set(id + 1);
        Ok(id)
    }
}

impl Service for Controller {
    type Request = ControllerOp;
    type Response = ControllerReply;

    fn start(self: Rc<Self>, op: ControllerOp) -> LocalBoxFuture<'static, ControllerReply> {
        async move { self.run(op).await }.boxed_local()
    }
}

/// The shard the controller lives on.
pub(crate) const CONTROLLER_SHARD: ShardId = ShardId(0);

/// Sends an admin operation to the controller and waits for its result.
pub(crate) async fn call(shard: &Rc<Shard>, op: ControllerOp) -> ControllerReply {
    shard
        .ask::<Controller>(CONTROLLER_SHARD, op)
        .await
        .unwrap_or_else(ControllerReply::not_controller)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, GroupConfig};

    fn set(k: &str, v: &str) -> ConfigEdit {
        ConfigEdit::Set(k.into(), v.into())
    }

    #[test]
    fn an_operation_is_checked_against_the_topic_then_the_node() {
        let limits = PartitionLimits {
            node: 20,
            topic: 8,
            request: 100,
        };
        let mut md = ClusterMetadata::default();
        let offsets = NewTopic {
            name: "__consumer_offsets".into(),
            num_partitions: 10,
            replication_factor: -1,
            assignments: vec![],
            configs: vec![],
        };
        md.apply(
            &md.plan_create(&offsets, 1, 1, TopicId(uuid::Uuid::from_u128(1)))
                .unwrap(),
        );
        assert_eq!(check_added(&md, &limits, 8, 10), Ok(()));
        let refusal = |r: Result<(), LimitRefusal>| {
            let (limit, e) = r.unwrap_err();
            (limit, e.code)
        };
        assert_eq!(
            refusal(check_added(&md, &limits, 9, 1)),
            (PartitionLimit::Topic, ResponseError::InvalidPartitions)
        );
        assert_eq!(
            refusal(check_added(&md, &limits, 8, 11)),
            (PartitionLimit::Node, ResponseError::PolicyViolation)
        );
        assert_eq!(
            refusal(check_added(&md, &limits, 9, 11)),
            (PartitionLimit::Topic, ResponseError::InvalidPartitions)
        );
    }

    /// APPEND and SUBTRACT work on the value in force, the default when the topic sets none,
    /// and SUBTRACT may leave an explicit empty list, as Kafka's ConfigAdminManager does.
    #[test]
    fn list_edits_start_from_the_default_and_may_leave_an_empty_list() {
        use crate::config::{CleanupPolicy, TopicConfig};
        let b = Config::default();
        let append = |c: &TopicConfig, v: &str| {
            apply_edits(c, &[ConfigEdit::Append("cleanup.policy".into(), v.into())], false).unwrap()
        };
        let subtract = |c: &TopicConfig, v: &str| {
            apply_edits(
                c,
                &[ConfigEdit::Subtract("cleanup.policy".into(), v.into())],
                false,
            )
            .unwrap()
        };
        let none = TopicConfig::default();
        let both = append(&none, "compact");
        assert_eq!(both.get("cleanup.policy").as_deref(), Some("delete,compact"));
        assert_eq!(both.log_settings(&b).cleanup_policy, CleanupPolicy::CompactDelete);
        // Appending what is there changes nothing.
        assert_eq!(
            append(&none, "delete").get("cleanup.policy").as_deref(),
            Some("delete")
        );
        let empty = subtract(&none, "delete");
        assert_eq!(
            empty.get("cleanup.policy").as_deref(),
            Some(""),
            "explicit, not the default"
        );
        assert_eq!(empty.log_settings(&b).cleanup_policy, CleanupPolicy::Neither);
        assert_eq!(
            subtract(&both, "delete").get("cleanup.policy").as_deref(),
            Some("compact")
        );
        assert_eq!(
            append(&empty, "compact").get("cleanup.policy").as_deref(),
            Some("compact")
        );
        // Not a list: refused.
        let e = apply_edits(
            &none,
            &[ConfigEdit::Append("retention.ms".into(), "1".into())],
            false,
        )
        .unwrap_err();
        assert_eq!(e.code, ResponseError::InvalidConfig);
    }

    #[test]
    fn group_config_edits() {
        let broker = Config::default();
        let none = GroupConfig::default();
        let g = apply_group_edits(
            &none,
            &[
                set("share.record.lock.duration.ms", "20000"),
                set("share.delivery.count.limit", "3"),
            ],
            false,
            &broker,
        )
        .unwrap();
        assert_eq!(g.get("share.record.lock.duration.ms"), Some("20000"));
        // Incremental: other overrides stay; DELETE removes one.
        let g2 = apply_group_edits(
            &g,
            &[ConfigEdit::Delete("share.delivery.count.limit".into())],
            false,
            &broker,
        )
        .unwrap();
        assert_eq!(
            g2.overrides(),
            vec![("share.record.lock.duration.ms", "20000".to_string())]
        );
        // Replace (legacy AlterConfigs): only what is set survives.
        let g3 = apply_group_edits(&g, &[set("share.auto.offset.reset", "earliest")], true, &broker).unwrap();
        assert_eq!(
            g3.overrides(),
            vec![("share.auto.offset.reset", "earliest".to_string())]
        );
        // Errors: INVALID_CONFIG with Kafka's wording.
        let fail = |edits: &[ConfigEdit]| apply_group_edits(&none, edits, false, &broker).unwrap_err();
        let e = fail(&[set("no.such.key", "1")]);
        assert_eq!(e.code, ResponseError::InvalidConfig);
        assert_eq!(e.message, "Unknown group config name: no.such.key");
        let e = fail(&[ConfigEdit::Append(
            "share.delivery.count.limit".into(),
            "3".into(),
        )]);
        assert!(e
            .message
            .contains("not allowed for config key share.delivery.count.limit"));
        let e = fail(&[ConfigEdit::Subtract("nope".into(), "3".into())]);
        assert_eq!(e.message, "Unknown group config name: nope");
        let e = fail(&[set("share.record.lock.duration.ms", "70000")]);
        assert_eq!(e.code, ResponseError::InvalidConfig);
        assert!(e.message.contains("group.share.max.record.lock.duration.ms"));
        let e = fail(&[set("errors.deadletterqueue.topic.name", "orders-dlq")]);
        assert!(e.message.contains("must start with"));
        // Deleting an override that is not there is fine.
        assert!(apply_group_edits(
            &none,
            &[ConfigEdit::Delete("share.isolation.level".into())],
            false,
            &broker
        )
        .unwrap()
        .is_empty());
    }
}
