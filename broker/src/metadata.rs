//! Cluster metadata: topics, their ids, partition counts and config overrides, and the config
//! overrides of groups (resource type GROUP).
//!
//! Sans-I/O: the controller validates admin operations against a [`ClusterMetadata`] and turns
//! them into [`MetadataDelta`]s; every shard applies the same deltas to its own replica. The
//! controller persists the whole state as `strand-metadata.json` in the log directory (the
//! single-node stand-in for KRaft's metadata log; Raft replication will replace the file).

use std::collections::{BTreeMap, HashMap};

use kafka_protocol::ResponseError;
use serde::{Deserialize, Serialize};
use strand_protocol::types::{validate_topic_name, ShardId, TopicId};

use crate::config::{Config, GroupConfig, TopicConfig};

pub use crate::config::MAX_PARTITIONS_PER_TOPIC;

/// Which partition limit refused a creation: the label of `strand_partition_limit_refusals_total`
/// and the HTTP door's answer depend on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartitionLimit {
    /// `strand.max.partitions`: the node would hold too many.
    Node,
    /// `strand.max.partitions.per.topic`: one topic would have too many.
    Topic,
    /// `strand.max.partitions.per.request`: one request asks for too many.
    Request,
}

impl PartitionLimit {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            PartitionLimit::Node => "node",
            PartitionLimit::Topic => "topic",
            PartitionLimit::Request => "request",
        }
    }
}

/// The broker's limits on partitions (`strand.max.partitions`, `.per.topic`, `.per.request`),
/// which the controller applies to every way partitions are created: CreateTopics,
/// CreatePartitions, auto-creation and the HTTP queue API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionLimits {
    /// Partitions the node holds in all, internal topics included.
    pub node: u64,
    /// Partitions of one topic.
    pub topic: i32,
    /// Partitions one request creates.
    pub request: u64,
}

impl PartitionLimits {
    pub fn of(config: &Config) -> Self {
        PartitionLimits {
            node: u64::from(config.max_partitions),
            topic: i32::try_from(config.max_partitions_per_topic).unwrap_or(MAX_PARTITIONS_PER_TOPIC),
            request: u64::from(config.max_partitions_per_request),
        }
    }

    /// Refuses a request that would create `requested` partitions in all, with Kafka's error
    /// and words (Kafka refuses more than 10,000).
    pub fn check_request(&self, requested: u64) -> Result<(), AdminError> {
        if requested <= self.request {
            return Ok(());
        }
        Err(AdminError::new(
            ResponseError::PolicyViolation,
            format!(
                "Excessively large number of partitions per request: {requested} requested, \
                 limit {} (strand.max.partitions.per.request).",
                self.request
            ),
        ))
    }

    /// Refuses a topic of `partitions` partitions.
    pub fn check_topic(&self, partitions: i32) -> Result<(), AdminError> {
        if partitions <= self.topic {
            return Ok(());
        }
        Err(AdminError::new(
            ResponseError::InvalidPartitions,
            format!(
                "Number of partitions {partitions} is above the limit of {} partitions per topic \
                 (strand.max.partitions.per.topic).",
                self.topic
            ),
        ))
    }
}

/// One topic.
#[derive(Debug, Clone, PartialEq)]
pub struct TopicMeta {
    pub name: String,
    pub id: TopicId,
    pub partitions: i32,
    pub config: TopicConfig,
    /// Kafka's internal topics (`__consumer_offsets`, ...; [`crate::internal_topics`]): listed
    /// as internal in Metadata, written only by the broker.
    pub internal: bool,
}

impl TopicMeta {
    /// Directory name of a partition's log, as Kafka names it.
    pub fn dir_name(&self, partition: i32) -> String {
        format!("{}-{partition}", self.name)
    }
}

/// A change to the metadata, applied identically by every shard.
#[derive(Debug, Clone, PartialEq)]
pub enum MetadataDelta {
    CreateTopic(TopicMeta),
    DeleteTopic {
        name: String,
        id: TopicId,
    },
    SetPartitionCount {
        name: String,
        partitions: i32,
    },
    SetTopicConfig {
        name: String,
        config: TopicConfig,
    },
    /// Replaces a group's config overrides; an empty config removes the group's entry.
    SetGroupConfig {
        group: String,
        config: GroupConfig,
    },
}

/// The metadata state.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClusterMetadata {
    /// Bumped by every applied delta.
    pub version: u64,
    topics: BTreeMap<String, TopicMeta>,
    by_id: HashMap<TopicId, String>,
    /// Producer ids below this may have been handed out (InitProducerId); a restarted controller
    /// continues from here, so an id is never given twice.
    pub producer_id_block_end: i64,
    /// Config overrides per group id (IncrementalAlterConfigs on GROUP resources). A group
    /// needs no entry here to exist, and an entry does not make a group exist.
    group_configs: BTreeMap<String, GroupConfig>,
    /// Partitions of all topics, internal ones included: kept by [`ClusterMetadata::apply`].
    partitions: u64,
}

/// Why an admin operation is refused, with Kafka's error code and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminError {
    pub code: ResponseError,
    pub message: String,
}

impl AdminError {
    pub fn new(code: ResponseError, message: impl Into<String>) -> Self {
        AdminError {
            code,
            message: message.into(),
        }
    }
}

/// A CreateTopics entry after decoding.
#[derive(Debug, Clone)]
pub struct NewTopic {
    pub name: String,
    /// -1: the broker default (`num.partitions`).
    pub num_partitions: i32,
    /// -1: the broker default. Only 1 is possible on one node.
    pub replication_factor: i16,
    /// Manual assignment: partition -> broker ids. Empty when not given.
    pub assignments: Vec<(i32, Vec<i32>)>,
    pub configs: Vec<(String, Option<String>)>,
}

impl NewTopic {
    /// The partitions the entry asks for, counted as Kafka counts them against its per-request
    /// bound before any other check: the assignments when given, else the count (the default
    /// for -1), nothing for an invalid count.
    pub fn requested_partitions(&self, default_partitions: i32) -> u64 {
        if !self.assignments.is_empty() {
            return self.assignments.len() as u64;
        }
        let p = if self.num_partitions == -1 {
            default_partitions
        } else {
            self.num_partitions
        };
        partitions_u64(p)
    }
}

impl ClusterMetadata {
    pub fn topic(&self, name: &str) -> Option<&TopicMeta> {
        self.topics.get(name)
    }

    pub fn topic_by_id(&self, id: TopicId) -> Option<&TopicMeta> {
        self.by_id.get(&id).and_then(|n| self.topics.get(n))
    }

    pub fn topics(&self) -> impl Iterator<Item = &TopicMeta> {
        self.topics.values()
    }

    pub fn topic_count(&self) -> usize {
        self.topics.len()
    }

    /// Partitions of all topics, internal ones included.
    pub fn partition_count(&self) -> u64 {
        self.partitions
    }

    /// Refuses adding `added` partitions when the node would then hold more than its limit.
    pub fn check_node_partitions(&self, added: u64, limits: &PartitionLimits) -> Result<(), AdminError> {
        let total = self.partitions.saturating_add(added);
        if total <= limits.node {
            return Ok(());
        }
        Err(AdminError::new(
            ResponseError::PolicyViolation,
            format!(
                "Adding {added} partitions would bring the node to {total}, above its limit of {} \
                 (strand.max.partitions); it holds {}, internal topics included.",
                limits.node, self.partitions
            ),
        ))
    }

    /// The config overrides of a group, if it has any.
    pub fn group_config(&self, group: &str) -> Option<&GroupConfig> {
        self.group_configs.get(group)
    }

    /// The groups with config overrides, by name.
    pub fn group_configs(&self) -> impl Iterator<Item = (&str, &GroupConfig)> {
        self.group_configs.iter().map(|(g, c)| (g.as_str(), c))
    }

    /// How many groups have config overrides.
    pub fn group_config_count(&self) -> usize {
        self.group_configs.len()
    }

    pub fn apply(&mut self, delta: &MetadataDelta) {
        self.version += 1;
        match delta {
            MetadataDelta::CreateTopic(t) => {
                self.by_id.insert(t.id, t.name.clone());
                self.partitions += partitions_u64(t.partitions);
                if let Some(old) = self.topics.insert(t.name.clone(), t.clone()) {
                    self.partitions -= partitions_u64(old.partitions);
                }
            }
            MetadataDelta::DeleteTopic { name, id } => {
                if let Some(old) = self.topics.remove(name) {
                    self.partitions -= partitions_u64(old.partitions);
                }
                self.by_id.remove(id);
            }
            MetadataDelta::SetPartitionCount { name, partitions } => {
                if let Some(t) = self.topics.get_mut(name) {
                    self.partitions -= partitions_u64(t.partitions);
                    self.partitions += partitions_u64(*partitions);
                    t.partitions = *partitions;
                }
            }
            MetadataDelta::SetTopicConfig { name, config } => {
                if let Some(t) = self.topics.get_mut(name) {
                    t.config = config.clone();
                }
            }
            MetadataDelta::SetGroupConfig { group, config } => {
                if config.is_empty() {
                    self.group_configs.remove(group);
                } else {
                    self.group_configs.insert(group.clone(), config.clone());
                }
            }
        }
    }

    /// Validates a CreateTopics entry: name, partition count, replication factor, assignments,
    /// configs. Returns the delta to apply.
    pub fn plan_create(
        &self,
        t: &NewTopic,
        default_partitions: i32,
        node_id: i32,
        new_id: TopicId,
    ) -> Result<MetadataDelta, AdminError> {
        validate_topic_name(&t.name).map_err(|m| AdminError::new(ResponseError::InvalidTopicException, m))?;
        if self.topics.contains_key(&t.name) {
            return Err(AdminError::new(
                ResponseError::TopicAlreadyExists,
                format!("Topic '{}' already exists.", t.name),
            ));
        }
        if let Some(other) = self.colliding_topic(&t.name) {
            return Err(AdminError::new(
                ResponseError::InvalidTopicException,
                format!(
                    "Topic '{}' collides with existing topic: {other} ('.' and '_' are interchangeable in metric names)",
                    t.name
                ),
            ));
        }
        let partitions = if !t.assignments.is_empty() {
            if t.num_partitions != -1 || t.replication_factor != -1 {
                return Err(AdminError::new(
                    ResponseError::InvalidRequest,
                    "Both numPartitions or replicationFactor and replicasAssignments were set. Both cannot be used at the same time.",
                ));
            }
            let mut seen: Vec<i32> = t.assignments.iter().map(|(p, _)| *p).collect();
            seen.sort_unstable();
            let expected: Vec<i32> = (0..seen.len() as i32).collect();
            if seen != expected {
                return Err(AdminError::new(
                    ResponseError::InvalidReplicaAssignment,
                    "Partitions must be numbered consecutively from 0.",
                ));
            }
            for (p, replicas) in &t.assignments {
                if replicas.as_slice() != [node_id] {
                    return Err(AdminError::new(
                        ResponseError::InvalidReplicaAssignment,
                        format!("Partition {p}: replicas {replicas:?} are not [{node_id}], the only broker."),
                    ));
                }
            }
            seen.len() as i32
        } else {
            let p = if t.num_partitions == -1 {
                default_partitions
            } else {
                t.num_partitions
            };
            if p <= 0 {
                return Err(AdminError::new(
                    ResponseError::InvalidPartitions,
                    "Number of partitions must be larger than 0.",
                ));
            }
            match t.replication_factor {
                -1 | 1 => {}
                rf if rf <= 0 => {
                    return Err(AdminError::new(
                        ResponseError::InvalidReplicationFactor,
                        "Replication factor must be larger than 0.",
                    ))
                }
                rf => {
                    return Err(AdminError::new(
                        ResponseError::InvalidReplicationFactor,
                        format!("Unable to replicate the partition {rf} time(s): The target replication factor of {rf} cannot be reached because only 1 broker(s) are registered."),
                    ))
                }
            }
            p
        };
        if partitions > MAX_PARTITIONS_PER_TOPIC {
            return Err(AdminError::new(
                ResponseError::InvalidPartitions,
                format!(
                    "Number of partitions {partitions} is above the limit of {MAX_PARTITIONS_PER_TOPIC}."
                ),
            ));
        }
        let mut config = TopicConfig::default();
        for (k, v) in &t.configs {
            let Some(v) = v else {
                return Err(AdminError::new(
                    ResponseError::InvalidConfig,
                    format!("Null value not supported for topic configs: {k}"),
                ));
            };
            config
                .set(k, v)
                .map_err(|e| AdminError::new(ResponseError::InvalidConfig, e.to_string()))?;
        }
        Ok(MetadataDelta::CreateTopic(TopicMeta {
            name: t.name.clone(),
            id: new_id,
            partitions,
            config,
            internal: crate::internal_topics::is_internal(&t.name),
        }))
    }

    /// Kafka refuses topics whose names differ only in '.' vs '_' (metric name collisions).
    fn colliding_topic(&self, name: &str) -> Option<&str> {
        if !name.contains(['.', '_']) {
            return None;
        }
        let norm = name.replace('.', "_");
        self.topics
            .keys()
            .find(|existing| existing.as_str() != name && existing.replace('.', "_") == norm)
            .map(String::as_str)
    }

    /// Validates a CreatePartitions entry.
    pub fn plan_create_partitions(
        &self,
        name: &str,
        count: i32,
        assignments: Option<&[Vec<i32>]>,
        node_id: i32,
    ) -> Result<MetadataDelta, AdminError> {
        let Some(t) = self.topics.get(name) else {
            return Err(AdminError::new(
                ResponseError::UnknownTopicOrPartition,
                format!("The topic '{name}' does not exist."),
            ));
        };
        if count < t.partitions {
            return Err(AdminError::new(
                ResponseError::InvalidPartitions,
                format!(
                    "Topic currently has {} partitions, which is higher than the requested {count}.",
                    t.partitions
                ),
            ));
        }
        if count == t.partitions {
            return Err(AdminError::new(
                ResponseError::InvalidPartitions,
                format!("Topic already has {count} partitions."),
            ));
        }
        if count > MAX_PARTITIONS_PER_TOPIC {
            return Err(AdminError::new(
                ResponseError::InvalidPartitions,
                format!("Number of partitions {count} is above the limit of {MAX_PARTITIONS_PER_TOPIC}."),
            ));
        }
        if let Some(a) = assignments {
            if a.len() as i32 != count - t.partitions {
                return Err(AdminError::new(
                    ResponseError::InvalidReplicaAssignment,
                    format!(
                        "Increasing the number of partitions by {} but {} assignments provided.",
                        count - t.partitions,
                        a.len()
                    ),
                ));
            }
            if a.iter().any(|r| r.as_slice() != [node_id]) {
                return Err(AdminError::new(
                    ResponseError::InvalidReplicaAssignment,
                    format!("Replica assignments must be [{node_id}], the only broker."),
                ));
            }
        }
        Ok(MetadataDelta::SetPartitionCount {
            name: name.to_owned(),
            partitions: count,
        })
    }

    /// Serializes the state for the metadata file.
    pub fn to_json(&self) -> Vec<u8> {
        let file = MetadataFile {
            format: 1,
            version: self.version,
            producer_id_block_end: self.producer_id_block_end,
            topics: self
                .topics
                .values()
                .map(|t| TopicRecord {
                    name: t.name.clone(),
                    id: t.id.0.to_string(),
                    partitions: t.partitions,
                    config: t.config.to_text(),
                    internal: t.internal,
                })
                .collect(),
            group_configs: self
                .group_configs
                .iter()
                .map(|(group, config)| GroupConfigRecord {
                    group: group.clone(),
                    config: config.to_text(),
                })
                .collect(),
        };
        serde_json::to_vec_pretty(&file).unwrap_or_default()
    }

    /// Reads the metadata file's content.
    pub fn from_json(bytes: &[u8]) -> Result<Self, String> {
        let file: MetadataFile = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        if file.format != 1 {
            return Err(format!("unsupported metadata format {}", file.format));
        }
        let mut md = ClusterMetadata {
            version: file.version,
            producer_id_block_end: file.producer_id_block_end.max(0),
            ..Default::default()
        };
        for r in file.topics {
            let id = uuid::Uuid::parse_str(&r.id).map_err(|e| format!("topic {}: bad id: {e}", r.name))?;
            let config = TopicConfig::from_text(&r.config).map_err(|e| format!("topic {}: {e}", r.name))?;
            validate_topic_name(&r.name).map_err(|e| format!("topic {}: {e}", r.name))?;
            if r.partitions <= 0 {
                return Err(format!("topic {}: {} partitions", r.name, r.partitions));
            }
            md.by_id.insert(TopicId(id), r.name.clone());
            md.partitions += partitions_u64(r.partitions);
            let replaced = md.topics.insert(
                r.name.clone(),
                TopicMeta {
                    // From the name, not the file: older files marked every `__` name internal.
                    internal: crate::internal_topics::is_internal(&r.name),
                    name: r.name,
                    id: TopicId(id),
                    partitions: r.partitions,
                    config,
                },
            );
            if let Some(old) = replaced {
                md.partitions -= partitions_u64(old.partitions);
            }
        }
        for r in file.group_configs {
            let config = GroupConfig::from_text(&r.config).map_err(|e| format!("group {}: {e}", r.group))?;
            if !config.is_empty() {
                md.group_configs.insert(r.group, config);
            }
        }
        Ok(md)
    }
}

#[derive(Serialize, Deserialize)]
struct MetadataFile {
    format: u32,
    version: u64,
    topics: Vec<TopicRecord>,
    #[serde(default)]
    producer_id_block_end: i64,
    /// Absent in files written before group configs existed.
    #[serde(default)]
    group_configs: Vec<GroupConfigRecord>,
}

#[derive(Serialize, Deserialize)]
struct GroupConfigRecord {
    group: String,
    /// `key=value` lines of the group's config overrides.
    config: String,
}

#[derive(Serialize, Deserialize)]
struct TopicRecord {
    name: String,
    id: String,
    partitions: i32,
    /// `key=value` lines of the topic's config overrides.
    config: String,
    #[serde(default)]
    internal: bool,
}

/// A partition count as an unsigned number (validated counts are positive; others count 0).
pub fn partitions_u64(partitions: i32) -> u64 {
    u64::try_from(partitions).unwrap_or(0)
}

/// The shard that owns a partition: deterministic, spreads a topic's partitions over shards
/// round-robin from a per-topic starting point (FNV-1a of the name).
pub fn owner_shard(topic: &str, partition: i32, shards: u16) -> ShardId {
    TopicOwners::new(topic, shards).of(partition)
}

/// [`owner_shard`] for the partitions of one topic, with the name hashed once.
#[derive(Debug, Clone, Copy)]
pub struct TopicOwners {
    start: u64,
    shards: u64,
}

impl TopicOwners {
    pub fn new(topic: &str, shards: u16) -> Self {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in topic.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        let shards = u64::from(shards.max(1));
        TopicOwners {
            start: h % shards,
            shards,
        }
    }

    pub fn of(&self, partition: i32) -> ShardId {
        ShardId(((self.start + partition.max(0) as u64) % self.shards) as u16)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn new_topic(name: &str, p: i32) -> NewTopic {
        NewTopic {
            name: name.into(),
            num_partitions: p,
            replication_factor: -1,
            assignments: vec![],
            configs: vec![],
        }
    }

    fn id(n: u8) -> TopicId {
        TopicId(uuid::Uuid::from_bytes([n; 16]))
    }

    #[test]
    fn create_validations() {
        let mut md = ClusterMetadata::default();
        let d = md.plan_create(&new_topic("orders", -1), 3, 1, id(1)).unwrap();
        md.apply(&d);
        assert_eq!(md.topic("orders").unwrap().partitions, 3);
        assert_eq!(md.topic_by_id(id(1)).unwrap().name, "orders");
        let e = md.plan_create(&new_topic("orders", 1), 3, 1, id(2)).unwrap_err();
        assert_eq!(e.code, ResponseError::TopicAlreadyExists);
        let e = md
            .plan_create(&new_topic("bad name", 1), 3, 1, id(2))
            .unwrap_err();
        assert_eq!(e.code, ResponseError::InvalidTopicException);
        let e = md.plan_create(&new_topic("zero", 0), 3, 1, id(2)).unwrap_err();
        assert_eq!(e.code, ResponseError::InvalidPartitions);
        let mut rf3 = new_topic("rf", 1);
        rf3.replication_factor = 3;
        assert_eq!(
            md.plan_create(&rf3, 3, 1, id(2)).unwrap_err().code,
            ResponseError::InvalidReplicationFactor
        );
        let mut cfg = new_topic("cfg", 1);
        cfg.configs = vec![("retention.ms".into(), Some("abc".into()))];
        assert_eq!(
            md.plan_create(&cfg, 3, 1, id(2)).unwrap_err().code,
            ResponseError::InvalidConfig
        );
        cfg.configs = vec![("no.such.config".into(), Some("1".into()))];
        assert_eq!(
            md.plan_create(&cfg, 3, 1, id(2)).unwrap_err().code,
            ResponseError::InvalidConfig
        );
        let d = md.plan_create(&new_topic("a.b", 1), 3, 1, id(3)).unwrap();
        md.apply(&d);
        assert_eq!(
            md.plan_create(&new_topic("a_b", 1), 3, 1, id(4))
                .unwrap_err()
                .code,
            ResponseError::InvalidTopicException
        );
        let mut manual = new_topic("manual", -1);
        manual.assignments = vec![(0, vec![1]), (1, vec![1])];
        match md.plan_create(&manual, 3, 1, id(5)).unwrap() {
            MetadataDelta::CreateTopic(t) => assert_eq!(t.partitions, 2),
            other => panic!("{other:?}"),
        }
        manual.assignments = vec![(0, vec![2])];
        assert_eq!(
            md.plan_create(&manual, 3, 1, id(5)).unwrap_err().code,
            ResponseError::InvalidReplicaAssignment
        );
    }

    #[test]
    fn partitions_only_grow() {
        let mut md = ClusterMetadata::default();
        md.apply(&md.plan_create(&new_topic("t", 2), 1, 1, id(1)).unwrap());
        assert_eq!(
            md.plan_create_partitions("t", 1, None, 1).unwrap_err().code,
            ResponseError::InvalidPartitions
        );
        assert_eq!(
            md.plan_create_partitions("t", 2, None, 1).unwrap_err().code,
            ResponseError::InvalidPartitions
        );
        assert_eq!(
            md.plan_create_partitions("nope", 4, None, 1).unwrap_err().code,
            ResponseError::UnknownTopicOrPartition
        );
        let d = md.plan_create_partitions("t", 5, None, 1).unwrap();
        md.apply(&d);
        assert_eq!(md.topic("t").unwrap().partitions, 5);
    }

    fn limits(node: u64, topic: i32, request: u64) -> PartitionLimits {
        PartitionLimits { node, topic, request }
    }

    #[test]
    fn partition_count_follows_creates_deletes_growth_and_the_file() {
        let mut md = ClusterMetadata::default();
        assert_eq!(md.partition_count(), 0);
        // Internal topics count like any other.
        md.apply(
            &md.plan_create(&new_topic("__consumer_offsets", 50), 1, 1, id(1))
                .unwrap(),
        );
        md.apply(&md.plan_create(&new_topic("a", 3), 1, 1, id(2)).unwrap());
        md.apply(&md.plan_create(&new_topic("b", -1), 4, 1, id(3)).unwrap());
        assert_eq!(md.partition_count(), 57);
        md.apply(&md.plan_create_partitions("a", 10, None, 1).unwrap());
        assert_eq!(md.partition_count(), 64);
        // Deleting a topic gives its partitions back; deleting it again changes nothing.
        let delete_a = MetadataDelta::DeleteTopic {
            name: "a".into(),
            id: id(2),
        };
        md.apply(&delete_a);
        md.apply(&delete_a);
        assert_eq!(md.partition_count(), 54);
        // A growth of a topic that is gone changes nothing.
        md.apply(&MetadataDelta::SetPartitionCount {
            name: "a".into(),
            partitions: 99,
        });
        assert_eq!(md.partition_count(), 54);
        // A create that replaces a topic of the same name counts the new one only.
        let mut again = md.plan_create(&new_topic("c", 2), 1, 1, id(4)).unwrap();
        md.apply(&again);
        if let MetadataDelta::CreateTopic(t) = &mut again {
            t.partitions = 5;
        }
        md.apply(&again);
        assert_eq!(md.partition_count(), 59);
        // Loaded from the file: the same total.
        let back = ClusterMetadata::from_json(&md.to_json()).unwrap();
        assert_eq!(back.partition_count(), 59);
        assert_eq!(back, md);
    }

    #[test]
    fn node_limit_counts_internal_topics_and_deletion_frees_budget() {
        let l = limits(60, 100, 100);
        let mut md = ClusterMetadata::default();
        md.apply(
            &md.plan_create(&new_topic("__consumer_offsets", 50), 1, 1, id(1))
                .unwrap(),
        );
        assert_eq!(md.check_node_partitions(10, &l), Ok(()));
        let e = md.check_node_partitions(11, &l).unwrap_err();
        assert_eq!(e.code, ResponseError::PolicyViolation);
        assert!(
            e.message.contains("strand.max.partitions") && e.message.contains("it holds 50"),
            "{}",
            e.message
        );
        md.apply(&md.plan_create(&new_topic("t", 10), 1, 1, id(2)).unwrap());
        assert_eq!(
            md.check_node_partitions(1, &l).unwrap_err().code,
            ResponseError::PolicyViolation
        );
        assert_eq!(md.check_node_partitions(0, &l), Ok(()));
        md.apply(&MetadataDelta::DeleteTopic {
            name: "t".into(),
            id: id(2),
        });
        assert_eq!(md.check_node_partitions(10, &l), Ok(()));
        // No overflow on absurd requests.
        assert!(md.check_node_partitions(u64::MAX, &l).is_err());
    }

    #[test]
    fn topic_and_request_limits() {
        let l = limits(1000, 8, 12);
        assert_eq!(l.check_topic(8), Ok(()));
        let e = l.check_topic(9).unwrap_err();
        assert_eq!(e.code, ResponseError::InvalidPartitions);
        assert!(
            e.message.contains("strand.max.partitions.per.topic"),
            "{}",
            e.message
        );
        assert_eq!(l.check_request(12), Ok(()));
        let e = l.check_request(13).unwrap_err();
        assert_eq!(e.code, ResponseError::PolicyViolation);
        assert!(
            e.message
                .starts_with("Excessively large number of partitions per request"),
            "Kafka's words first: {}",
            e.message
        );
        let config = Config::default();
        assert_eq!(
            PartitionLimits::of(&config),
            limits(
                u64::from(config.max_partitions),
                config.max_partitions_per_topic as i32,
                u64::from(config.max_partitions_per_request)
            )
        );
    }

    #[test]
    fn requested_partitions_count_as_kafka_counts_them() {
        assert_eq!(new_topic("t", 7).requested_partitions(3), 7);
        assert_eq!(new_topic("t", -1).requested_partitions(3), 3);
        assert_eq!(new_topic("t", 0).requested_partitions(3), 0);
        assert_eq!(new_topic("t", -5).requested_partitions(3), 0);
        let mut manual = new_topic("t", -1);
        manual.assignments = vec![(0, vec![1]), (1, vec![1])];
        assert_eq!(manual.requested_partitions(3), 2);
    }

    #[test]
    fn json_round_trip() {
        let mut md = ClusterMetadata::default();
        let mut t = new_topic("t1", 4);
        t.configs = vec![("retention.ms".into(), Some("1000".into()))];
        md.apply(&md.plan_create(&t, 1, 1, id(7)).unwrap());
        md.apply(
            &md.plan_create(&new_topic("__consumer_offsets", 50), 1, 1, id(8))
                .unwrap(),
        );
        let back = ClusterMetadata::from_json(&md.to_json()).unwrap();
        assert_eq!(back, md);
        assert!(back.topic("__consumer_offsets").unwrap().internal);
        // A name starting with `__` is not internal by that alone (Kafka's list is fixed), also
        // when an older file marked it internal.
        md.apply(&md.plan_create(&new_topic("__mine", 1), 1, 1, id(9)).unwrap());
        assert!(!md.topic("__mine").unwrap().internal);
        let mut old: serde_json::Value = serde_json::from_slice(&md.to_json()).unwrap();
        for t in old["topics"].as_array_mut().unwrap() {
            t["internal"] = serde_json::Value::Bool(true);
        }
        let back = ClusterMetadata::from_json(old.to_string().as_bytes()).unwrap();
        assert!(!back.topic("__mine").unwrap().internal);
        assert!(back.topic("__consumer_offsets").unwrap().internal);
        assert_eq!(
            back.topic("t1").unwrap().config.get("retention.ms").as_deref(),
            Some("1000")
        );
    }

    #[test]
    fn group_configs_round_trip_and_old_files_load() {
        let mut md = ClusterMetadata::default();
        md.apply(&md.plan_create(&new_topic("t1", 1), 1, 1, id(7)).unwrap());
        let mut g = GroupConfig::default();
        g.set("share.record.lock.duration.ms", "20000").unwrap();
        g.set("errors.deadletterqueue.topic.name", "dlq.t1").unwrap();
        md.apply(&MetadataDelta::SetGroupConfig {
            group: "sg".into(),
            config: g.clone(),
        });
        assert_eq!(md.group_config("sg"), Some(&g));
        assert_eq!(md.group_config_count(), 1);
        let json = md.to_json();
        let back = ClusterMetadata::from_json(&json).unwrap();
        assert_eq!(back, md);
        assert_eq!(back.group_config("sg"), Some(&g));
        // An empty config removes the entry.
        md.apply(&MetadataDelta::SetGroupConfig {
            group: "sg".into(),
            config: GroupConfig::default(),
        });
        assert_eq!(md.group_config("sg"), None);
        assert_eq!(ClusterMetadata::from_json(&md.to_json()).unwrap(), md);

        // A file written before group configs existed (no `group_configs` field) still loads.
        let old = br#"{
  "format": 1,
  "version": 3,
  "topics": [
    { "name": "orders", "id": "0a0a0a0a-0a0a-0a0a-0a0a-0a0a0a0a0a0a", "partitions": 2,
      "config": "retention.ms=1000\n", "internal": false }
  ],
  "producer_id_block_end": 2000
}"#;
        let md = ClusterMetadata::from_json(old).unwrap();
        assert_eq!(md.version, 3);
        assert_eq!(md.topic("orders").unwrap().partitions, 2);
        assert_eq!(md.group_config_count(), 0);
        // And a bad group config in the file is refused, naming the group.
        let bad = br#"{"format": 1, "version": 1, "topics": [],
            "group_configs": [{"group": "g1", "config": "share.delivery.count.limit=99\n"}]}"#;
        assert!(ClusterMetadata::from_json(bad).unwrap_err().contains("group g1"));
    }

    #[test]
    fn ownership_is_deterministic_and_spread() {
        let mut counts = [0usize; 4];
        for p in 0..400 {
            let s = owner_shard("orders", p, 4);
            assert_eq!(s, owner_shard("orders", p, 4));
            counts[s.index()] += 1;
        }
        assert_eq!(counts, [100; 4]);
        assert_eq!(owner_shard("x", 3, 1), ShardId(0));
    }
}
