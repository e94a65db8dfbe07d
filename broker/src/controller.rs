//! The controller: validates and applies topic administration (create, delete, add partitions,
//! config changes) one operation at a time, persists the metadata, and broadcasts the change to
//! every shard. It lives on shard 0; other shards forward admin requests to it.

use std::cell::RefCell;
use std::path::PathBuf;
use std::rc::Rc;

use kafka_protocol::ResponseError;
use strand_protocol::types::TopicId;
use strand_storage::fs::Fs;
use strand_storage::fs_glommio::GlommioFs;

use crate::metadata::{AdminError, ClusterMetadata, MetadataDelta, NewTopic, TopicMeta};
use crate::shard::{broadcast_metadata, Shard};

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
    /// A new idempotent producer id (InitProducerId).
    AllocateProducerId,
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
                let mut items = config.get(k).map(|c| split(&c)).unwrap_or_default();
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
                if items.is_empty() {
                    config.remove(k).map_err(|e| invalid(e.to_string()))?;
                } else {
                    config
                        .set(k, &items.join(","))
                        .map_err(|e| invalid(e.to_string()))?;
                }
            }
        }
    }
    Ok(config)
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

/// Producer ids are reserved in blocks of this size: one metadata write per block.
const PRODUCER_ID_BLOCK: i64 = 1000;

pub(crate) struct Controller {
    lock: glommio::sync::Semaphore,
    state: RefCell<ClusterMetadata>,
    path: PathBuf,
    node_id: i32,
    /// Next producer id to hand out; below `state.producer_id_block_end`.
    next_producer_id: std::cell::Cell<i64>,
}

impl Controller {
    pub(crate) fn new(state: ClusterMetadata, log_dir: PathBuf, node_id: i32) -> Self {
        Controller {
            lock: glommio::sync::Semaphore::new(1),
            // Ids of a block reserved before a restart may have been used: start after it.
            next_producer_id: std::cell::Cell::new(state.producer_id_block_end),
            state: RefCell::new(state),
            path: log_dir.join(METADATA_FILE),
            node_id,
        }
    }

    /// Runs one admin operation to completion; operations never interleave.
    pub(crate) async fn run(&self, shard: &Rc<Shard>, op: ControllerOp) -> ControllerReply {
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
            | ControllerOp::AlterTopicConfig { validate_only, .. } => *validate_only,
            ControllerOp::DeleteTopics { .. } | ControllerOp::AllocateProducerId => false,
        };
        match op {
            ControllerOp::CreateTopics { topics, .. } => {
                for t in topics {
                    let id = TopicId(uuid::Uuid::new_v4());
                    let default_partitions = i32::try_from(shard.config.num_partitions).unwrap_or(1);
                    match scratch.plan_create(&t, default_partitions, self.node_id, id) {
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
                            name: Some(t.name.clone()),
                            id: t.id,
                            error: Some(AdminError::new(
                                ResponseError::TopicDeletionDisabled,
                                "Internal topics cannot be deleted.",
                            )),
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
                for PartitionIncrease {
                    topic: name,
                    count,
                    assignments,
                } in topics
                {
                    match scratch.plan_create_partitions(&name, count, assignments.as_deref(), self.node_id) {
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
            ControllerOp::AlterTopicConfig {
                name, edits, replace, ..
            } => {
                let result = match scratch.topic(&name).cloned() {
                    None => Err(AdminError::new(
                        ResponseError::UnknownTopicOrPartition,
                        format!("Topic {name} does not exist."),
                    )),
                    Some(t) => apply_edits(&t.config, &edits, replace).map(|config| (t, config)),
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
        if let Err(e) = GlommioFs.write_file_atomic(&self.path, scratch.to_json()).await {
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
            GlommioFs
                .write_file_atomic(&self.path, next.to_json())
                .await
                .map_err(|e| format!("cannot persist the producer id block: {e}"))?;
            self.state.borrow_mut().producer_id_block_end = next.producer_id_block_end;
        }
        self.next_producer_id.set(id + 1);
        Ok(id)
    }
}

/// Sends an admin operation to the controller (shard 0) and waits for its result.
pub(crate) async fn call(shard: &Rc<Shard>, op: ControllerOp) -> ControllerReply {
    let reply = match shard
        .dispatch(
            strand_protocol::types::ShardId(0),
            crate::ops::ShardRequest::Controller(op),
        )
        .await
    {
        Ok(fut) => fut.await,
        Err(e) => Err(e),
    };
    match reply {
        Ok(crate::ops::ShardResponse::Controller(r)) => r,
        _ => ControllerReply::not_controller(),
    }
}
