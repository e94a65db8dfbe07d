//! Committed offsets: OffsetCommit, OffsetFetch, OffsetDelete and the expiration of the offsets
//! of empty groups (`offsets.retention.minutes`).
//!
//! Transactional offsets do not exist yet, so `require_stable` never finds a pending commit.

use std::collections::{BTreeMap, BTreeSet};

use kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use kafka_protocol::messages::offset_delete_response::{
    OffsetDeleteResponsePartition, OffsetDeleteResponseTopic,
};
use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponseGroup, OffsetFetchResponsePartition, OffsetFetchResponsePartitions,
    OffsetFetchResponseTopic, OffsetFetchResponseTopics,
};
use kafka_protocol::messages::{
    OffsetCommitRequest, OffsetCommitResponse, OffsetDeleteRequest, OffsetDeleteResponse, OffsetFetchRequest,
    OffsetFetchResponse, TopicName,
};
use kafka_protocol::ResponseError;

use super::classic::{ClassicGroup, ClassicState};
use super::records::{self, OffsetValue, RecordKey};
use super::{
    sb, GroupCoordinator, GroupEntry, GroupKind, GroupResponse, Record, RequestMeta, RequestToken,
    TopicMetadata,
};

/// One partition's answer in an OffsetFetch.
struct Fetched {
    partition: i32,
    offset: i64,
    leader_epoch: i32,
    metadata: String,
    error: i16,
}

/// One group's answer in an OffsetFetch.
struct GroupFetch {
    error: i16,
    topics: Vec<(String, Vec<Fetched>)>,
}

fn topic_name(s: &str) -> TopicName {
    TopicName(sb(s))
}

/// The same OffsetFetch answer failed with `code`.
pub(crate) fn fetch_error(mut r: OffsetFetchResponse, version: i16, code: i16) -> OffsetFetchResponse {
    if version >= 8 {
        for g in &mut r.groups {
            g.error_code = code;
            g.topics.clear();
        }
    } else if version >= 2 {
        r.error_code = code;
        r.topics.clear();
    } else {
        for t in &mut r.topics {
            for p in &mut t.partitions {
                p.error_code = code;
            }
        }
    }
    r
}

impl GroupCoordinator {
    pub(crate) fn offset_commit(
        &mut self,
        now: i64,
        token: RequestToken,
        meta: &RequestMeta,
        req: OffsetCommitRequest,
        topics: &dyn TopicMetadata,
    ) {
        let version = meta.version;
        let all = |code: i16| every_partition_refused(&req, code);
        let group_id = req.group_id.to_string();
        if group_id.is_empty() {
            let r = all(ResponseError::InvalidGroupId.code());
            return self.respond(token, version, GroupResponse::OffsetCommit(r), &[]);
        }
        let partition = match self.check_group(&group_id) {
            Ok(p) => p,
            Err(e) => return self.respond(token, version, GroupResponse::OffsetCommit(all(e.code())), &[]),
        };
        let generation = req.generation_id_or_member_epoch;
        let member_id = req.member_id.to_string();
        let instance = if version >= 7 {
            req.group_instance_id.as_ref().map(|s| s.to_string())
        } else {
            None
        };
        let validation = match self.groups.get(&group_id).map(|g| &g.kind) {
            None if generation < 0 => {
                // A commit outside group management (assign-only consumers, admin tools) creates a
                // simple group.
                let mut g = ClassicGroup::new_simple();
                g.state_timestamp = Some(now);
                self.groups.insert(
                    group_id.clone(),
                    GroupEntry {
                        partition,
                        offsets: BTreeMap::new(),
                        kind: GroupKind::Classic(g),
                    },
                );
                Ok(false)
            }
            None if version >= 9 => Err(ResponseError::GroupIdNotFound),
            None => Err(ResponseError::IllegalGeneration),
            Some(GroupKind::Classic(g)) => g
                .validate_offset_commit(&member_id, instance.as_deref(), generation)
                .map(|()| g.members.contains_key(&member_id)),
            Some(GroupKind::Consumer(g)) => g
                .validate_offset_commit(&member_id, generation, version)
                .map(|()| false),
        };
        match validation {
            Err(e) => {
                tracing::debug!(
                    group = group_id.as_str(),
                    member = member_id.as_str(),
                    generation,
                    error = ?e,
                    "offset commit refused"
                );
                return self.respond(
                    token,
                    version,
                    GroupResponse::OffsetCommit(all(e.code())),
                    &[partition],
                );
            }
            Ok(true) => self.classic_touch(now, &group_id, &member_id),
            Ok(false) => {}
        }
        let expire_timestamp =
            (version <= 4 && req.retention_time_ms != -1).then(|| now + req.retention_time_ms);
        let max_metadata = self.config.offset_metadata_max_bytes;
        let mut out = Vec::new();
        let mut response = OffsetCommitResponse::default();
        let Some(entry) = self.groups.get_mut(&group_id) else {
            return;
        };
        for t in &req.topics {
            let name = t.name.to_string();
            let count = topics.topic_by_name(&name).map(|(_, n)| n);
            let mut rt = OffsetCommitResponseTopic::default().with_name(t.name.clone());
            for p in &t.partitions {
                let metadata = p
                    .committed_metadata
                    .as_ref()
                    .map(|m| m.to_string())
                    .unwrap_or_default();
                let error = if !count.is_some_and(|n| p.partition_index >= 0 && p.partition_index < n) {
                    ResponseError::UnknownTopicOrPartition.code()
                } else if metadata.len() > max_metadata {
                    ResponseError::OffsetMetadataTooLarge.code()
                } else {
                    let value = OffsetValue {
                        offset: p.committed_offset,
                        leader_epoch: if version >= 6 {
                            p.committed_leader_epoch
                        } else {
                            -1
                        },
                        metadata,
                        commit_timestamp: now,
                        expire_timestamp,
                    };
                    out.push(records::put(
                        RecordKey::Offset {
                            group: group_id.clone(),
                            topic: name.clone(),
                            partition: p.partition_index,
                        },
                        value.encode(),
                    ));
                    entry.offsets.insert((name.clone(), p.partition_index), value);
                    0
                };
                rt.partitions.push(
                    OffsetCommitResponsePartition::default()
                        .with_partition_index(p.partition_index)
                        .with_error_code(error),
                );
            }
            response.topics.push(rt);
        }
        self.write(partition, out);
        self.respond(
            token,
            version,
            GroupResponse::OffsetCommit(response),
            &[partition],
        );
    }

    fn fetch_group(
        &self,
        group_id: &str,
        requested: Option<Vec<(String, Vec<i32>)>>,
        member: Option<(String, i32)>,
    ) -> (GroupFetch, Option<i32>) {
        let fail = |error: i16| GroupFetch {
            error,
            topics: Vec::new(),
        };
        if group_id.is_empty() {
            return (fail(ResponseError::InvalidGroupId.code()), None);
        }
        let partition = match self.check_group(group_id) {
            Ok(p) => p,
            Err(e) => return (fail(e.code()), None),
        };
        let entry = self.groups.get(group_id);
        if let (Some(GroupKind::Consumer(g)), Some((member_id, epoch))) = (entry.map(|e| &e.kind), &member) {
            if *epoch >= 0 || !member_id.is_empty() {
                if let Err(e) = g.validate_offset_fetch(member_id, *epoch) {
                    return (fail(e.code()), Some(partition));
                }
            }
        }
        let lookup = |topic: &str, p: i32| -> Fetched {
            match entry.and_then(|e| e.offsets.get(&(topic.to_string(), p))) {
                Some(v) => Fetched {
                    partition: p,
                    offset: v.offset,
                    leader_epoch: v.leader_epoch,
                    metadata: v.metadata.clone(),
                    error: 0,
                },
                None => Fetched {
                    partition: p,
                    offset: -1,
                    leader_epoch: -1,
                    metadata: String::new(),
                    error: 0,
                },
            }
        };
        let topics = match requested {
            Some(list) => list
                .into_iter()
                .map(|(t, ps)| {
                    let fetched = ps.iter().map(|p| lookup(&t, *p)).collect();
                    (t, fetched)
                })
                .collect(),
            None => {
                let mut by_topic: BTreeMap<String, Vec<Fetched>> = BTreeMap::new();
                if let Some(e) = entry {
                    for (t, p) in e.offsets.keys() {
                        by_topic.entry(t.clone()).or_default().push(lookup(t, *p));
                    }
                }
                by_topic.into_iter().collect()
            }
        };
        (GroupFetch { error: 0, topics }, Some(partition))
    }

    pub(crate) fn offset_fetch(&mut self, token: RequestToken, meta: &RequestMeta, req: OffsetFetchRequest) {
        let version = meta.version;
        let mut partitions = BTreeSet::new();
        let mut response = OffsetFetchResponse::default();
        if version >= 8 {
            for g in &req.groups {
                let requested = g.topics.as_ref().map(|ts| {
                    ts.iter()
                        .map(|t| (t.name.to_string(), t.partition_indexes.clone()))
                        .collect::<Vec<_>>()
                });
                let member = (version >= 9).then(|| {
                    (
                        g.member_id.as_ref().map(|m| m.to_string()).unwrap_or_default(),
                        g.member_epoch,
                    )
                });
                let (fetched, p) = self.fetch_group(g.group_id.as_str(), requested, member);
                partitions.extend(p);
                response.groups.push(
                    OffsetFetchResponseGroup::default()
                        .with_group_id(g.group_id.clone())
                        .with_error_code(fetched.error)
                        .with_topics(
                            fetched
                                .topics
                                .into_iter()
                                .map(|(t, ps)| {
                                    OffsetFetchResponseTopics::default()
                                        .with_name(topic_name(&t))
                                        .with_partitions(
                                            ps.into_iter()
                                                .map(|f| {
                                                    OffsetFetchResponsePartitions::default()
                                                        .with_partition_index(f.partition)
                                                        .with_committed_offset(f.offset)
                                                        .with_committed_leader_epoch(f.leader_epoch)
                                                        .with_metadata(Some(sb(&f.metadata)))
                                                        .with_error_code(f.error)
                                                })
                                                .collect(),
                                        )
                                })
                                .collect(),
                        ),
                );
            }
        } else {
            let requested = req.topics.as_ref().map(|ts| {
                ts.iter()
                    .map(|t| (t.name.to_string(), t.partition_indexes.clone()))
                    .collect::<Vec<_>>()
            });
            let (mut fetched, p) = self.fetch_group(req.group_id.as_str(), requested.clone(), None);
            partitions.extend(p);
            if fetched.error != 0 && version < 2 {
                // v1 has no group error: every requested partition carries it.
                let code = fetched.error;
                fetched.topics = requested
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(t, ps)| {
                        let f = ps
                            .into_iter()
                            .map(|p| Fetched {
                                partition: p,
                                offset: -1,
                                leader_epoch: -1,
                                metadata: String::new(),
                                error: code,
                            })
                            .collect();
                        (t, f)
                    })
                    .collect();
            } else if version >= 2 {
                response.error_code = fetched.error;
            }
            response.topics = fetched
                .topics
                .into_iter()
                .map(|(t, ps)| {
                    OffsetFetchResponseTopic::default()
                        .with_name(topic_name(&t))
                        .with_partitions(
                            ps.into_iter()
                                .map(|f| {
                                    OffsetFetchResponsePartition::default()
                                        .with_partition_index(f.partition)
                                        .with_committed_offset(f.offset)
                                        .with_committed_leader_epoch(if version >= 5 {
                                            f.leader_epoch
                                        } else {
                                            -1
                                        })
                                        .with_metadata(Some(sb(&f.metadata)))
                                        .with_error_code(f.error)
                                })
                                .collect(),
                        )
                })
                .collect();
        }
        let partitions: Vec<i32> = partitions.into_iter().collect();
        self.respond(token, version, GroupResponse::OffsetFetch(response), &partitions);
    }

    pub(crate) fn offset_delete(
        &mut self,
        token: RequestToken,
        meta: &RequestMeta,
        req: OffsetDeleteRequest,
    ) {
        let version = meta.version;
        let top = |code: ResponseError| OffsetDeleteResponse::default().with_error_code(code.code());
        let group_id = req.group_id.to_string();
        if group_id.is_empty() {
            return self.respond(
                token,
                version,
                GroupResponse::OffsetDelete(top(ResponseError::InvalidGroupId)),
                &[],
            );
        }
        let partition = match self.check_group(&group_id) {
            Ok(p) => p,
            Err(e) => return self.respond(token, version, GroupResponse::OffsetDelete(top(e)), &[]),
        };
        let Some(entry) = self.groups.get_mut(&group_id) else {
            return self.respond(
                token,
                version,
                GroupResponse::OffsetDelete(top(ResponseError::GroupIdNotFound)),
                &[partition],
            );
        };
        // Which topics the group still consumes: None = all of them (unknown subscriptions).
        let subscribed: Result<Option<BTreeSet<String>>, ResponseError> = match &entry.kind {
            GroupKind::Classic(g) if g.state == ClassicState::Empty => Ok(Some(BTreeSet::new())),
            GroupKind::Classic(g) if g.protocol_type.as_deref() != Some("consumer") => {
                Err(ResponseError::NonEmptyGroup)
            }
            GroupKind::Classic(g) => Ok(g.subscribed_topics()),
            GroupKind::Consumer(g) => Ok(Some(
                g.members.values().flat_map(|m| g.member_topic_names(m)).collect(),
            )),
        };
        let subscribed = match subscribed {
            Ok(s) => s,
            Err(e) => return self.respond(token, version, GroupResponse::OffsetDelete(top(e)), &[partition]),
        };
        let mut out = Vec::new();
        let mut response = OffsetDeleteResponse::default();
        for t in &req.topics {
            let name = t.name.to_string();
            let busy = subscribed.as_ref().is_none_or(|s| s.contains(&name));
            let mut rt = OffsetDeleteResponseTopic::default().with_name(t.name.clone());
            for p in &t.partitions {
                let error = if busy {
                    ResponseError::GroupSubscribedToTopic.code()
                } else {
                    if entry.offsets.remove(&(name.clone(), p.partition_index)).is_some() {
                        out.push(records::tombstone(RecordKey::Offset {
                            group: group_id.clone(),
                            topic: name.clone(),
                            partition: p.partition_index,
                        }));
                    }
                    0
                };
                rt.partitions.push(
                    OffsetDeleteResponsePartition::default()
                        .with_partition_index(p.partition_index)
                        .with_error_code(error),
                );
            }
            response.topics.push(rt);
        }
        self.write(partition, out);
        self.respond(
            token,
            version,
            GroupResponse::OffsetDelete(response),
            &[partition],
        );
    }

    /// Expires the offsets of empty groups past the retention, and deletes empty groups left
    /// without offsets.
    pub(crate) fn expire_offsets(&mut self, now: i64) {
        let retention = self.config.offsets_retention_ms;
        let mut by_partition: BTreeMap<i32, Vec<Record>> = BTreeMap::new();
        let mut delete = Vec::new();
        let active: BTreeSet<i32> = self
            .groups
            .values()
            .map(|g| g.partition)
            .filter(|p| self.check_partition_active(*p))
            .collect();
        for (id, entry) in self.groups.iter_mut() {
            if !active.contains(&entry.partition) || !entry.is_empty_group() {
                continue;
            }
            let state_ts = match &entry.kind {
                GroupKind::Classic(g) if g.protocol_type.is_some() => g.state_timestamp,
                _ => None,
            };
            let expired: Vec<(String, i32)> = entry
                .offsets
                .iter()
                .filter(|(_, v)| match v.expire_timestamp {
                    Some(e) => now >= e,
                    // Kafka counts from when the group became empty (classic groups with a
                    // protocol) or from the commit; Strand takes the later of the two, so a commit
                    // made to an already empty group is kept for the full retention.
                    None => now - state_ts.unwrap_or(v.commit_timestamp).max(v.commit_timestamp) >= retention,
                })
                .map(|(k, _)| k.clone())
                .collect();
            for k in expired {
                entry.offsets.remove(&k);
                by_partition
                    .entry(entry.partition)
                    .or_default()
                    .push(records::tombstone(RecordKey::Offset {
                        group: id.clone(),
                        topic: k.0,
                        partition: k.1,
                    }));
            }
            let pending = matches!(&entry.kind, GroupKind::Classic(g) if g.has_pending_members());
            if entry.offsets.is_empty() && !pending {
                delete.push((id.clone(), entry.partition));
            }
        }
        for (id, partition) in delete {
            let records = self.delete_group_records(&id);
            by_partition.entry(partition).or_default().extend(records);
        }
        for (partition, records) in by_partition {
            self.write(partition, records);
        }
    }

    /// Removes the committed offsets of `topics` from the groups of active partitions (of
    /// `partition` only, if given) and writes their tombstones; returns how many were removed.
    pub(crate) fn remove_topic_offsets(
        &mut self,
        partition: Option<i32>,
        topics: &BTreeSet<String>,
    ) -> usize {
        if topics.is_empty() {
            return 0;
        }
        let mut removed = 0;
        let mut by_partition: BTreeMap<i32, Vec<Record>> = BTreeMap::new();
        let active: BTreeSet<i32> = self
            .partitions
            .keys()
            .copied()
            .filter(|p| partition.is_none_or(|only| only == *p) && self.check_partition_active(*p))
            .collect();
        for (id, entry) in self.groups.iter_mut() {
            if !active.contains(&entry.partition) {
                continue;
            }
            for topic in topics {
                let keys: Vec<(String, i32)> = entry
                    .offsets
                    .range((topic.clone(), i32::MIN)..=(topic.clone(), i32::MAX))
                    .map(|(k, _)| k.clone())
                    .collect();
                for (topic, p) in keys {
                    entry.offsets.remove(&(topic.clone(), p));
                    removed += 1;
                    by_partition
                        .entry(entry.partition)
                        .or_default()
                        .push(records::tombstone(RecordKey::Offset {
                            group: id.clone(),
                            topic,
                            partition: p,
                        }));
                }
            }
        }
        for (partition, records) in by_partition {
            self.write(partition, records);
        }
        removed
    }

    pub(crate) fn check_partition_active(&self, partition: i32) -> bool {
        matches!(
            self.partitions.get(&partition).map(|p| &p.status),
            Some(super::PartitionStatus::Active)
        )
    }
}

/// The answer to an OffsetCommit that fails as a whole: `code` for every partition it names.
pub(crate) fn every_partition_refused(req: &OffsetCommitRequest, code: i16) -> OffsetCommitResponse {
    let topics = req.topics.iter().map(|t| {
        let partitions = t.partitions.iter().map(|p| {
            OffsetCommitResponsePartition::default()
                .with_partition_index(p.partition_index)
                .with_error_code(code)
        });
        OffsetCommitResponseTopic::default()
            .with_name(t.name.clone())
            .with_partitions(partitions.collect())
    });
    OffsetCommitResponse::default().with_topics(topics.collect())
}
