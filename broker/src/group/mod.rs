//! The group coordinator: consumer groups (classic protocol and KIP-848) and committed offsets,
//! as a sans-I/O state machine.
//!
//! One [`GroupCoordinator`] holds every group of the `__consumer_offsets` partitions its shard
//! owns. It does no I/O, never sleeps and reads no clock: time comes in as `now_ms` arguments,
//! member ids come from a seeded generator, and everything it wants done comes out as
//! [`Action`]s:
//!
//! - [`Action::Persist`]: append these records, as one batch, to `__consumer_offsets`
//!   partition `partition` ([`records::build_batch`] builds it); when durable, call
//!   [`GroupCoordinator::persisted`] with the `write_id`.
//! - [`Action::Respond`]: send this response for the request `token`. A response is released only
//!   once every write issued before it on its group's partition is durable, so no client sees
//!   state that a crash could take back. Delayed answers (JoinGroup waits for the rebalance,
//!   SyncGroup followers for the leader) come out of later calls.
//! - [`Action::WakeAt`]: call [`GroupCoordinator::tick`] no later than this time (session
//!   timeouts, rebalance timeouts, the initial rebalance delay, offsets retention). The last
//!   `WakeAt` of a returned list is the one that counts.
//!
//! ## Wiring
//!
//! - Requests: [`GroupCoordinator::handle`] with the decoded Kafka request ([`GroupRequest`]), its
//!   version and client (in [`RequestMeta`]) and a view of topic metadata ([`TopicMetadata`]).
//!   Responses are shaped for that version (fields a version lacks keep their defaults), so they
//!   can be encoded as they are.
//! - Ownership: [`partition_for`] (Kafka's `abs(groupId.hashCode()) % partitions`, with the
//!   partition count of `__consumer_offsets` as it exists) gives a group's partition; the caller
//!   routes the request to the shard owning it. A group of a partition this coordinator does not
//!   hold gets NOT_COORDINATOR; one of a partition being loaded gets COORDINATOR_LOAD_IN_PROGRESS.
//!   Requests naming several groups (DescribeGroups, DeleteGroups, OffsetFetch v8+,
//!   ConsumerGroupDescribe) are answered per group: split them by owner and merge the answers;
//!   ListGroups lists this coordinator's groups only.
//! - Loading: [`GroupCoordinator::begin_load`], then [`GroupCoordinator::replay`] with the
//!   partition's records in log order ([`records::batch_records`] extracts them from stored batches),
//!   then [`GroupCoordinator::end_load`]. The last value of a key wins; a tombstone deletes it.
//! - A failed write ([`GroupCoordinator::persisted`] with `Err`) fails every response waiting on
//!   that partition with COORDINATOR_NOT_AVAILABLE and drops the partition's in-memory state (it
//!   may hold changes the log does not): the partition then answers COORDINATOR_NOT_AVAILABLE
//!   until it is loaded again from the log.
//! - A client that disconnects: [`GroupCoordinator::cancel`] drops what waits for its token.
//! - Deleted topics: [`GroupCoordinator::topics_deleted`] removes every group's committed offsets
//!   of them (with tombstones), as Kafka's `onPartitionsDeleted` does; the caller reports each
//!   deletion, and after a load the topics with offsets that no longer exist (a deletion whose
//!   tombstones a crash or a failed write lost).
//!
//! ## What is stored
//!
//! See [`records`]: Kafka's own key and value schemas, so a `__consumer_offsets` written by Strand
//! reads like Kafka's.
//!
//! ## Where Strand differs from Kafka 4.1
//!
//! - State changes apply in memory at once and their answers wait for durability; Kafka applies
//!   them to a timeline it reverts on a failed write. Strand drops the partition's state instead
//!   (see above), which gives the same outcome once reloaded.
//! - Groups are either classic or consumer: a classic member cannot join a consumer group with
//!   members (INCONSISTENT_GROUP_PROTOCOL) and a KIP-848 member cannot join a classic group with
//!   members (GROUP_ID_NOT_FOUND); Kafka's online migration between the two is absent. Empty
//!   groups convert either way, as in Kafka.
//! - A member rejoining with epoch 0 and its member id is accepted (Kafka's KAFKA-19233 fix).
//! - Offsets expire only in empty groups (Kafka also expires, in non-empty classic groups, the
//!   offsets of topics no member subscribes to), counted from the later of the commit and the
//!   moment the group became empty.
//! - No transactional offsets yet: `require_stable` has nothing to wait for.
//! - Regular expressions: the subset documented in [`regex`]; matched topics are re-derived on
//!   load rather than read from ConsumerGroupRegularExpression records.
//! - Sizes are bounded: `classic_max_size` / `consumer_max_size` members (pending member ids
//!   included), regular expressions of 1 KiB.

mod admin;
mod assignor;
mod classic;
mod consumer;
pub(crate) mod host;
mod offsets;
pub(crate) mod records;
mod regex;
pub(crate) mod route;
mod timers;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, HashMap};

use bytes::Bytes;
use kafka_protocol::messages::{
    ConsumerGroupDescribeRequest, ConsumerGroupDescribeResponse, ConsumerGroupHeartbeatRequest,
    ConsumerGroupHeartbeatResponse, DeleteGroupsRequest, DeleteGroupsResponse, DescribeGroupsRequest,
    DescribeGroupsResponse, HeartbeatRequest, HeartbeatResponse, JoinGroupRequest, JoinGroupResponse,
    LeaveGroupRequest, LeaveGroupResponse, ListGroupsRequest, ListGroupsResponse, OffsetCommitRequest,
    OffsetCommitResponse, OffsetDeleteRequest, OffsetDeleteResponse, OffsetFetchRequest, OffsetFetchResponse,
    SyncGroupRequest, SyncGroupResponse,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use strand_protocol::types::TopicId;

pub(crate) use offsets::every_partition_refused;
pub(crate) use records::partition_for;

use records::{OffsetValue, RecordKey};
use timers::{TimerKey, Timers};

/// Coordinator settings, with Kafka's names and defaults.
#[derive(Debug, Clone)]
pub(crate) struct GroupConfig {
    /// The partition count of `__consumer_offsets`: `offsets.topic.num.partitions` only sizes the
    /// topic when it is created; groups map to the partitions of the topic as it exists.
    pub(crate) offsets_partitions: i32,
    /// `group.min.session.timeout.ms`.
    pub(crate) min_session_timeout_ms: i32,
    /// `group.max.session.timeout.ms`.
    pub(crate) max_session_timeout_ms: i32,
    /// `group.initial.rebalance.delay.ms`.
    pub(crate) initial_rebalance_delay_ms: i32,
    /// `group.max.size` (classic groups). Kafka's default is unbounded; Strand bounds it.
    pub(crate) classic_max_size: usize,
    /// `group.consumer.max.size` (KIP-848 groups).
    pub(crate) consumer_max_size: usize,
    /// `group.consumer.session.timeout.ms`.
    pub(crate) consumer_session_timeout_ms: i32,
    /// `group.consumer.heartbeat.interval.ms`.
    pub(crate) consumer_heartbeat_interval_ms: i32,
    /// `offsets.retention.minutes`, in milliseconds.
    pub(crate) offsets_retention_ms: i64,
    /// `offsets.retention.check.interval.ms`.
    pub(crate) offsets_retention_check_interval_ms: i64,
    /// `offset.metadata.max.bytes`.
    pub(crate) offset_metadata_max_bytes: usize,
    /// How often a KIP-848 group re-reads the metadata of the topics it subscribes to (partition
    /// counts, topics matching its regular expressions) on a heartbeat.
    pub(crate) consumer_metadata_refresh_ms: i64,
}

impl Default for GroupConfig {
    fn default() -> Self {
        GroupConfig {
            offsets_partitions: 50,
            min_session_timeout_ms: 6_000,
            max_session_timeout_ms: 1_800_000,
            initial_rebalance_delay_ms: 3_000,
            classic_max_size: 10_000,
            consumer_max_size: 10_000,
            consumer_session_timeout_ms: 45_000,
            consumer_heartbeat_interval_ms: 5_000,
            offsets_retention_ms: 10_080 * 60_000,
            offsets_retention_check_interval_ms: 600_000,
            offset_metadata_max_bytes: 4096,
            consumer_metadata_refresh_ms: 10_000,
        }
    }
}

/// Identifies a request to the caller; chosen by the caller, opaque to the coordinator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct RequestToken(pub(crate) u64);

/// About the request beyond its body.
#[derive(Debug, Clone, Default)]
pub(crate) struct RequestMeta {
    /// The request's API version; the response is shaped for it.
    pub(crate) version: i16,
    pub(crate) client_id: String,
    /// As Kafka shows it: `/` followed by the peer address.
    pub(crate) client_host: String,
}

/// The group APIs, decoded.
#[derive(Debug, Clone)]
pub(crate) enum GroupRequest {
    JoinGroup(JoinGroupRequest),
    SyncGroup(SyncGroupRequest),
    Heartbeat(HeartbeatRequest),
    LeaveGroup(LeaveGroupRequest),
    OffsetCommit(OffsetCommitRequest),
    OffsetFetch(OffsetFetchRequest),
    OffsetDelete(OffsetDeleteRequest),
    ListGroups(ListGroupsRequest),
    DescribeGroups(DescribeGroupsRequest),
    DeleteGroups(DeleteGroupsRequest),
    ConsumerGroupHeartbeat(ConsumerGroupHeartbeatRequest),
    ConsumerGroupDescribe(ConsumerGroupDescribeRequest),
}

/// The answers, ready to encode at the request's version.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum GroupResponse {
    JoinGroup(JoinGroupResponse),
    SyncGroup(SyncGroupResponse),
    Heartbeat(HeartbeatResponse),
    LeaveGroup(LeaveGroupResponse),
    OffsetCommit(OffsetCommitResponse),
    OffsetFetch(OffsetFetchResponse),
    OffsetDelete(OffsetDeleteResponse),
    ListGroups(ListGroupsResponse),
    DescribeGroups(DescribeGroupsResponse),
    DeleteGroups(DeleteGroupsResponse),
    ConsumerGroupHeartbeat(ConsumerGroupHeartbeatResponse),
    ConsumerGroupDescribe(ConsumerGroupDescribeResponse),
}

/// A Kafka request that goes whole to the coordinator of the one group it names.
pub(crate) trait ForCoordinator: Sized {
    type Response;
    fn group_id(&self) -> &str;
    fn into_group_request(self) -> GroupRequest;
    /// The answer, if `r` answers this kind of request.
    fn from_group_response(r: GroupResponse) -> Option<Self::Response>;
}

macro_rules! for_coordinator {
    ($($variant:ident: $req:ty => $resp:ty, $group:ident;)*) => {$(
        impl ForCoordinator for $req {
            type Response = $resp;
            fn group_id(&self) -> &str {
                self.$group.as_str()
            }
            fn into_group_request(self) -> GroupRequest {
                GroupRequest::$variant(self)
            }
            fn from_group_response(r: GroupResponse) -> Option<$resp> {
                match r {
                    GroupResponse::$variant(r) => Some(r),
                    _ => None,
                }
            }
        }
    )*};
}

for_coordinator! {
    JoinGroup: JoinGroupRequest => JoinGroupResponse, group_id;
    SyncGroup: SyncGroupRequest => SyncGroupResponse, group_id;
    Heartbeat: HeartbeatRequest => HeartbeatResponse, group_id;
    LeaveGroup: LeaveGroupRequest => LeaveGroupResponse, group_id;
    OffsetCommit: OffsetCommitRequest => OffsetCommitResponse, group_id;
    OffsetDelete: OffsetDeleteRequest => OffsetDeleteResponse, group_id;
    ConsumerGroupHeartbeat: ConsumerGroupHeartbeatRequest => ConsumerGroupHeartbeatResponse, group_id;
    OffsetFetch: OffsetFetchRequest => OffsetFetchResponse, group_id;
}

/// One `__consumer_offsets` record: key and value (`None`: a tombstone).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    pub(crate) key: Bytes,
    pub(crate) value: Option<Bytes>,
}

/// What the coordinator asks the caller to do.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Action {
    Respond {
        token: RequestToken,
        response: GroupResponse,
    },
    /// Append `records` as one batch to `__consumer_offsets` partition `partition`; when durable
    /// (or failed), call `persisted(write_id, ...)`.
    Persist {
        write_id: u64,
        partition: i32,
        records: Vec<Record>,
    },
    /// Call `tick` no later than this.
    WakeAt(i64),
}

/// Topic metadata as the coordinator needs it (KIP-848 assignment, regex subscriptions, commit
/// validation).
pub(crate) trait TopicMetadata {
    /// The id and partition count of a topic.
    fn topic_by_name(&self, name: &str) -> Option<(TopicId, i32)>;
    /// The name and partition count of a topic.
    fn topic_by_id(&self, id: TopicId) -> Option<(String, i32)>;
    /// Every topic name (to resolve regular expressions).
    fn topic_names(&self) -> Vec<String>;
    /// The group's override of an integer group config (`consumer.session.timeout.ms`, ...),
    /// as stored; `None` without one.
    fn group_config_int(&self, _group: &str, _key: &str) -> Option<i32> {
        None
    }
}

/// Counts from a partition load.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct LoadStats {
    pub(crate) records: usize,
    pub(crate) undecodable: usize,
    pub(crate) groups: usize,
    pub(crate) offsets: usize,
}

enum PartitionStatus {
    /// Records seen so far: last value per key.
    Loading(BTreeMap<Bytes, Bytes>, LoadStats),
    Active,
    /// A write failed; the state was dropped until the partition is loaded again.
    Failed,
}

struct PartitionState {
    status: PartitionStatus,
    /// Writes issued and not yet durable, in order.
    pending: BTreeSet<u64>,
    /// Topics deleted while the partition was loading: their offsets, replayed from records written
    /// before the deletion, are removed when the load ends.
    deleted_topics: BTreeSet<String>,
}

/// A response that waits for writes to become durable.
struct Deferred {
    token: RequestToken,
    version: i16,
    response: GroupResponse,
    waits: Vec<u64>,
}

/// A group and its committed offsets.
pub(crate) struct GroupEntry {
    pub(crate) partition: i32,
    /// Committed offsets by (topic, partition).
    pub(crate) offsets: BTreeMap<(String, i32), OffsetValue>,
    pub(crate) kind: GroupKind,
}

pub(crate) enum GroupKind {
    Classic(classic::ClassicGroup),
    Consumer(consumer::ConsumerGroup),
}

impl GroupEntry {
    fn is_empty_group(&self) -> bool {
        match &self.kind {
            GroupKind::Classic(g) => g.is_empty(),
            GroupKind::Consumer(g) => g.members.is_empty(),
        }
    }
}

/// Deterministic id generator (splitmix64).
struct IdGen(u64);

impl IdGen {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn uuid(&mut self) -> uuid::Uuid {
        let hi = self.next_u64();
        let lo = self.next_u64();
        uuid::Builder::from_random_bytes(((u128::from(hi) << 64) | u128::from(lo)).to_be_bytes()).into_uuid()
    }

    /// A classic member id, as Kafka makes them: `<client id>-<UUID>`.
    fn classic_member_id(&mut self, client_id: &str) -> String {
        format!("{client_id}-{}", self.uuid().hyphenated())
    }

    /// A KIP-848 member id, as Kafka's `Uuid.toString()`: URL-safe base64 without padding.
    fn kafka_uuid(&mut self) -> String {
        base64_url(self.uuid().as_bytes())
    }
}

fn base64_url(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::with_capacity(bytes.len() * 4 / 3 + 2);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk.first().copied().unwrap_or(0),
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        let chars = chunk.len() + 1;
        for i in 0..chars {
            let idx = ((n >> (18 - 6 * i)) & 63) as usize;
            out.push(char::from(ALPHABET.get(idx).copied().unwrap_or(b'A')));
        }
    }
    out
}

pub(crate) fn sb(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_owned())
}

/// The coordinator of the groups of some `__consumer_offsets` partitions.
pub(crate) struct GroupCoordinator {
    pub(crate) config: GroupConfig,
    partitions: BTreeMap<i32, PartitionState>,
    pub(crate) groups: BTreeMap<String, GroupEntry>,
    timers: Timers,
    ids: IdGen,
    next_write_id: u64,
    /// Pending write id → partition.
    writes: BTreeMap<u64, i32>,
    deferred: Vec<Deferred>,
    /// Tokens of requests parked in a group (JoinGroup, SyncGroup) → group id, for `cancel`.
    parked: HashMap<RequestToken, String>,
    /// Tokens whose connection went away while parked: their answers are dropped.
    cancelled: BTreeSet<RequestToken>,
    out: Vec<Action>,
}

impl GroupCoordinator {
    /// A coordinator holding no partition yet. `seed` drives member id generation.
    pub(crate) fn new(config: GroupConfig, seed: u64) -> Self {
        GroupCoordinator {
            config,
            partitions: BTreeMap::new(),
            groups: BTreeMap::new(),
            timers: Timers::default(),
            ids: IdGen(seed),
            next_write_id: 1,
            writes: BTreeMap::new(),
            deferred: Vec::new(),
            parked: HashMap::new(),
            cancelled: BTreeSet::new(),
            out: Vec::new(),
        }
    }

    /// The `__consumer_offsets` partition of a group.
    pub(crate) fn partition_of(&self, group_id: &str) -> i32 {
        partition_for(group_id, self.config.offsets_partitions)
    }

    /// Whether this coordinator holds (or is loading) the partition of `group_id`.
    #[cfg(test)]
    pub(crate) fn owns(&self, group_id: &str) -> bool {
        self.partitions.contains_key(&self.partition_of(group_id))
    }

    /// Handles one request. Its answer may come now or from a later call.
    pub(crate) fn handle(
        &mut self,
        now_ms: i64,
        token: RequestToken,
        meta: &RequestMeta,
        request: GroupRequest,
        topics: &dyn TopicMetadata,
    ) -> Vec<Action> {
        self.cancelled.remove(&token);
        match request {
            GroupRequest::JoinGroup(r) => self.join_group(now_ms, token, meta, r),
            GroupRequest::SyncGroup(r) => self.sync_group(now_ms, token, meta, r),
            GroupRequest::Heartbeat(r) => self.heartbeat(now_ms, token, meta, r),
            GroupRequest::LeaveGroup(r) => self.leave_group(now_ms, token, meta, r),
            GroupRequest::OffsetCommit(r) => self.offset_commit(now_ms, token, meta, r, topics),
            GroupRequest::OffsetFetch(r) => self.offset_fetch(token, meta, r),
            GroupRequest::OffsetDelete(r) => self.offset_delete(token, meta, r),
            GroupRequest::ListGroups(r) => self.list_groups(token, meta, r),
            GroupRequest::DescribeGroups(r) => self.describe_groups(token, meta, r),
            GroupRequest::DeleteGroups(r) => self.delete_groups(token, meta, r),
            GroupRequest::ConsumerGroupHeartbeat(r) => {
                self.consumer_heartbeat(now_ms, token, meta, r, topics)
            }
            GroupRequest::ConsumerGroupDescribe(r) => self.consumer_group_describe(token, meta, r, topics),
        }
        self.run_timers(now_ms);
        self.finish()
    }

    /// Runs the timers due at `now_ms`.
    pub(crate) fn tick(&mut self, now_ms: i64) -> Vec<Action> {
        self.run_timers(now_ms);
        self.finish()
    }

    /// The earliest time `tick` must be called, if any.
    pub(crate) fn next_wake(&self) -> Option<i64> {
        self.timers.next_deadline()
    }

    /// Reports the outcome of a [`Action::Persist`].
    pub(crate) fn persisted(
        &mut self,
        now_ms: i64,
        write_id: u64,
        result: Result<(), String>,
    ) -> Vec<Action> {
        if let Some(partition) = self.writes.remove(&write_id) {
            if let Some(p) = self.partitions.get_mut(&partition) {
                p.pending.remove(&write_id);
            }
            match result {
                Ok(()) => self.release_deferred(),
                Err(_) => {
                    self.fail_writes(&[write_id]);
                    self.drop_partition(partition, ResponseError::CoordinatorNotAvailable.code());
                    if let Some(p) = self.partitions.get_mut(&partition) {
                        p.status = PartitionStatus::Failed;
                    }
                }
            }
        }
        self.run_timers(now_ms);
        self.finish()
    }

    /// The connection of `token` went away: drop what waits for it. A parked JoinGroup keeps its
    /// member in the rebalance (as in Kafka, where the answer would be sent to a closed socket).
    /// Not called by the broker yet: a closed connection is not reported across shards, so an
    /// answer for it is computed and dropped, which is harmless.
    #[cfg(test)]
    pub(crate) fn cancel(&mut self, token: RequestToken) -> Vec<Action> {
        self.deferred.retain(|d| d.token != token);
        if self.parked.remove(&token).is_some() {
            self.cancelled.insert(token);
        }
        self.finish()
    }

    /// Starts loading a partition: its groups answer COORDINATOR_LOAD_IN_PROGRESS until
    /// [`GroupCoordinator::end_load`].
    pub(crate) fn begin_load(&mut self, partition: i32) {
        if let Some(old) = self.partitions.get(&partition) {
            if matches!(old.status, PartitionStatus::Active) {
                self.drop_partition(partition, ResponseError::NotCoordinator.code());
            }
        }
        self.partitions.insert(
            partition,
            PartitionState {
                status: PartitionStatus::Loading(BTreeMap::new(), LoadStats::default()),
                pending: BTreeSet::new(),
                deleted_topics: BTreeSet::new(),
            },
        );
    }

    /// Feeds records of a loading partition, in log order.
    pub(crate) fn replay(&mut self, partition: i32, records: impl IntoIterator<Item = Record>) {
        let Some(PartitionState {
            status: PartitionStatus::Loading(map, stats),
            ..
        }) = self.partitions.get_mut(&partition)
        else {
            return;
        };
        for r in records {
            stats.records += 1;
            match r.value {
                Some(v) => {
                    map.insert(r.key, v);
                }
                None => {
                    map.remove(&r.key);
                }
            }
        }
    }

    /// Ends loading a partition: builds its groups from the records replayed.
    pub(crate) fn end_load(&mut self, now_ms: i64, partition: i32) -> (LoadStats, Vec<Action>) {
        let Some(state) = self.partitions.get_mut(&partition) else {
            return (LoadStats::default(), self.finish());
        };
        let PartitionStatus::Loading(map, mut stats) =
            std::mem::replace(&mut state.status, PartitionStatus::Active)
        else {
            return (LoadStats::default(), self.finish());
        };
        let deleted_topics = std::mem::take(&mut state.deleted_topics);
        let mut decoded: Vec<(RecordKey, Bytes)> = Vec::with_capacity(map.len());
        for (k, v) in map {
            match RecordKey::decode(&k) {
                Ok(key) => decoded.push((key, v)),
                Err(_) => stats.undecodable += 1,
            }
        }
        decoded.sort_by(|a, b| a.0.load_rank().cmp(&b.0.load_rank()).then_with(|| a.0.cmp(&b.0)));
        for (key, value) in decoded {
            if !self.load_record(partition, &key, &value) {
                stats.undecodable += 1;
            } else if matches!(key, RecordKey::Offset { .. }) {
                stats.offsets += 1;
            }
        }
        let removed = self.remove_topic_offsets(Some(partition), &deleted_topics);
        stats.offsets = stats.offsets.saturating_sub(removed);
        let loaded: Vec<String> = self
            .groups
            .iter()
            .filter(|(_, g)| g.partition == partition)
            .map(|(id, _)| id.clone())
            .collect();
        stats.groups = loaded.len();
        for id in loaded {
            self.finish_load_group(now_ms, &id);
        }
        if self.timers.deadline(&TimerKey::OffsetsExpiration).is_none() {
            self.timers.schedule(
                TimerKey::OffsetsExpiration,
                now_ms + self.config.offsets_retention_check_interval_ms,
            );
        }
        (stats, self.finish())
    }

    /// Topics were deleted (Kafka's `onPartitionsDeleted`): every group's committed offsets of
    /// their partitions are removed, with tombstones so that they stay removed after a restart. A
    /// topic created again under the same name then starts without committed offsets, as in Kafka.
    /// Partitions being loaded remove them when their load ends. A group left empty and without
    /// offsets goes at the next retention check, as in Kafka.
    pub(crate) fn topics_deleted(&mut self, now_ms: i64, topics: &BTreeSet<String>) -> Vec<Action> {
        if !topics.is_empty() {
            for state in self.partitions.values_mut() {
                if matches!(state.status, PartitionStatus::Loading(..)) {
                    state.deleted_topics.extend(topics.iter().cloned());
                }
            }
            self.remove_topic_offsets(None, topics);
        }
        self.run_timers(now_ms);
        self.finish()
    }

    /// After loading `partition`: the committed offsets of topics that no longer exist are removed
    /// as in [`GroupCoordinator::topics_deleted`]. They are left by a deletion whose tombstones
    /// were lost (a crash before they were durable, a failed write); OffsetCommit accepts existing
    /// topics only, so no other offsets name a missing topic. Returns the topics removed.
    pub(crate) fn remove_offsets_of_missing_topics(
        &mut self,
        now_ms: i64,
        partition: i32,
        topics: &dyn TopicMetadata,
    ) -> (BTreeSet<String>, Vec<Action>) {
        let missing: BTreeSet<String> = if self.check_partition_active(partition) {
            self.groups
                .values()
                .filter(|g| g.partition == partition)
                .flat_map(|g| g.offsets.keys().map(|(t, _)| t))
                .filter(|t| topics.topic_by_name(t).is_none())
                .cloned()
                .collect()
        } else {
            BTreeSet::new()
        };
        let actions = self.topics_deleted(now_ms, &missing);
        (missing, actions)
    }

    /// Gives up a partition (another coordinator takes it): its waiting requests get
    /// NOT_COORDINATOR.
    pub(crate) fn unload(&mut self, partition: i32) -> Vec<Action> {
        self.drop_partition(partition, ResponseError::NotCoordinator.code());
        self.partitions.remove(&partition);
        self.finish()
    }

    fn load_record(&mut self, partition: i32, key: &RecordKey, value: &[u8]) -> bool {
        match key {
            RecordKey::Offset {
                group,
                topic,
                partition: p,
            } => match OffsetValue::decode(value) {
                Ok(v) => {
                    let entry = self.groups.entry(group.clone()).or_insert_with(|| GroupEntry {
                        partition,
                        offsets: BTreeMap::new(),
                        kind: GroupKind::Classic(classic::ClassicGroup::new_simple()),
                    });
                    entry.offsets.insert((topic.clone(), *p), v);
                    true
                }
                Err(_) => false,
            },
            RecordKey::GroupMetadata { group } => self.load_classic(partition, group, value),
            RecordKey::ConsumerGroup { .. }
            | RecordKey::ConsumerMember { .. }
            | RecordKey::TargetMetadata { .. }
            | RecordKey::TargetMember { .. }
            | RecordKey::CurrentAssignment { .. } => self.load_consumer(partition, key, value),
            RecordKey::Other { .. } => true,
        }
    }

    fn finish_load_group(&mut self, now_ms: i64, group_id: &str) {
        let is_classic = matches!(
            self.groups.get(group_id).map(|g| &g.kind),
            Some(GroupKind::Classic(_))
        );
        if is_classic {
            self.classic_loaded(now_ms, group_id);
        } else {
            self.consumer_loaded(now_ms, group_id);
        }
    }

    /// Checks that `group_id` belongs to an active partition of this coordinator.
    fn check_group(&self, group_id: &str) -> Result<i32, ResponseError> {
        let partition = self.partition_of(group_id);
        match self.partitions.get(&partition).map(|p| &p.status) {
            None => Err(ResponseError::NotCoordinator),
            Some(PartitionStatus::Loading(..)) => Err(ResponseError::CoordinatorLoadInProgress),
            Some(PartitionStatus::Failed) => Err(ResponseError::CoordinatorNotAvailable),
            Some(PartitionStatus::Active) => Ok(partition),
        }
    }

    fn any_loading(&self) -> bool {
        self.partitions
            .values()
            .any(|p| matches!(p.status, PartitionStatus::Loading(..)))
    }

    /// Issues a write of `records` to `partition`; returns its id (`None` if there is nothing to
    /// write).
    fn write(&mut self, partition: i32, records: Vec<Record>) -> Option<u64> {
        if records.is_empty() {
            return None;
        }
        let id = self.next_write_id;
        self.next_write_id += 1;
        self.writes.insert(id, partition);
        if let Some(p) = self.partitions.get_mut(&partition) {
            p.pending.insert(id);
        }
        self.out.push(Action::Persist {
            write_id: id,
            partition,
            records,
        });
        Some(id)
    }

    /// Sends `response` once every write issued so far on `partitions` is durable.
    fn respond(&mut self, token: RequestToken, version: i16, response: GroupResponse, partitions: &[i32]) {
        if self.cancelled.remove(&token) {
            return;
        }
        let waits: Vec<u64> = partitions
            .iter()
            .filter_map(|p| self.partitions.get(p).and_then(|s| s.pending.last().copied()))
            .collect();
        if waits.is_empty() {
            self.out.push(Action::Respond { token, response });
        } else {
            self.deferred.push(Deferred {
                token,
                version,
                response,
                waits,
            });
        }
    }

    fn release_deferred(&mut self) {
        let writes = &self.writes;
        let (ready, waiting): (Vec<Deferred>, Vec<Deferred>) = std::mem::take(&mut self.deferred)
            .into_iter()
            .partition(|d| d.waits.iter().all(|w| !writes.contains_key(w)));
        self.deferred = waiting;
        for d in ready {
            self.out.push(Action::Respond {
                token: d.token,
                response: d.response,
            });
        }
    }

    /// Fails the responses waiting on any of `ids` (and on later writes of their partitions).
    fn fail_writes(&mut self, ids: &[u64]) {
        let failed: BTreeSet<u64> = ids.iter().copied().collect();
        let (bad, good): (Vec<Deferred>, Vec<Deferred>) = std::mem::take(&mut self.deferred)
            .into_iter()
            .partition(|d| d.waits.iter().any(|w| failed.contains(w)));
        self.deferred = good;
        for d in bad {
            let response = error_response(
                d.response,
                d.version,
                ResponseError::CoordinatorNotAvailable.code(),
            );
            self.out.push(Action::Respond {
                token: d.token,
                response,
            });
        }
    }

    /// Drops the in-memory state of a partition: pending writes and their waiting responses
    /// fail, parked requests get `error`.
    fn drop_partition(&mut self, partition: i32, error: i16) {
        let pending: Vec<u64> = self
            .partitions
            .get_mut(&partition)
            .map(|p| std::mem::take(&mut p.pending).into_iter().collect())
            .unwrap_or_default();
        for id in &pending {
            self.writes.remove(id);
        }
        self.fail_writes(&pending);
        let ids: Vec<String> = self
            .groups
            .iter()
            .filter(|(_, g)| g.partition == partition)
            .map(|(id, _)| id.clone())
            .collect();
        for id in ids {
            self.abort_parked(&id, error);
            self.timers.cancel_group(&id);
            self.groups.remove(&id);
        }
    }

    fn run_timers(&mut self, now_ms: i64) {
        // Each timer runs once per deadline; a bound guards against a timer rescheduling itself
        // at `now` forever.
        for _ in 0..100_000 {
            let Some(key) = self.timers.pop_due(now_ms) else {
                break;
            };
            self.on_timer(now_ms, key);
        }
    }

    fn on_timer(&mut self, now_ms: i64, key: TimerKey) {
        match key {
            TimerKey::ClassicHeartbeat { group, member } => {
                self.classic_heartbeat_expired(now_ms, &group, &member)
            }
            TimerKey::ClassicPending { group, member } => {
                self.classic_pending_expired(now_ms, &group, &member)
            }
            TimerKey::ClassicJoin { group } => self.classic_join_timer(now_ms, &group),
            TimerKey::ClassicSync { group } => self.classic_sync_expired(now_ms, &group),
            TimerKey::ConsumerSession { group, member } => {
                self.consumer_session_expired(now_ms, &group, &member)
            }
            TimerKey::ConsumerRevocation { group, member } => {
                self.consumer_revocation_expired(now_ms, &group, &member)
            }
            TimerKey::OffsetsExpiration => {
                self.expire_offsets(now_ms);
                self.timers.schedule(
                    TimerKey::OffsetsExpiration,
                    now_ms + self.config.offsets_retention_check_interval_ms.max(1),
                );
            }
        }
    }

    fn finish(&mut self) -> Vec<Action> {
        let mut out = std::mem::take(&mut self.out);
        if let Some(t) = self.timers.next_deadline() {
            out.push(Action::WakeAt(t));
        }
        out
    }

    /// Deletes a group and its records: tombstones for its offsets and its group records.
    fn delete_group_records(&mut self, group_id: &str) -> Vec<Record> {
        let mut out = Vec::new();
        let Some(entry) = self.groups.remove(group_id) else {
            return out;
        };
        for (topic, partition) in entry.offsets.keys() {
            out.push(records::tombstone(RecordKey::Offset {
                group: group_id.to_string(),
                topic: topic.clone(),
                partition: *partition,
            }));
        }
        match &entry.kind {
            GroupKind::Classic(_) => {
                out.push(records::tombstone(RecordKey::GroupMetadata {
                    group: group_id.to_string(),
                }));
            }
            GroupKind::Consumer(g) => {
                for m in g.members.keys() {
                    out.extend(consumer::member_tombstones(group_id, m));
                }
                out.push(records::tombstone(RecordKey::TargetMetadata {
                    group: group_id.to_string(),
                }));
                out.push(records::tombstone(RecordKey::ConsumerGroup {
                    group: group_id.to_string(),
                }));
            }
        }
        self.timers.cancel_group(group_id);
        out
    }
}

/// Turns a response into the same response failed with `code` (its write did not become
/// durable).
fn error_response(response: GroupResponse, version: i16, code: i16) -> GroupResponse {
    match response {
        GroupResponse::JoinGroup(r) => {
            GroupResponse::JoinGroup(classic::join_error(version, code, r.member_id.as_str()))
        }
        GroupResponse::SyncGroup(_) => GroupResponse::SyncGroup(classic::sync_error(version, code)),
        GroupResponse::Heartbeat(mut r) => {
            r.error_code = code;
            GroupResponse::Heartbeat(r)
        }
        GroupResponse::LeaveGroup(mut r) => {
            r.error_code = code;
            for m in &mut r.members {
                m.error_code = code;
            }
            GroupResponse::LeaveGroup(r)
        }
        GroupResponse::OffsetCommit(mut r) => {
            for t in &mut r.topics {
                for p in &mut t.partitions {
                    p.error_code = code;
                }
            }
            GroupResponse::OffsetCommit(r)
        }
        GroupResponse::OffsetFetch(r) => GroupResponse::OffsetFetch(offsets::fetch_error(r, version, code)),
        GroupResponse::OffsetDelete(mut r) => {
            r.error_code = code;
            r.topics.clear();
            GroupResponse::OffsetDelete(r)
        }
        GroupResponse::DeleteGroups(mut r) => {
            for g in &mut r.results {
                g.error_code = code;
            }
            GroupResponse::DeleteGroups(r)
        }
        GroupResponse::ConsumerGroupHeartbeat(r) => GroupResponse::ConsumerGroupHeartbeat(
            ConsumerGroupHeartbeatResponse::default()
                .with_error_code(code)
                .with_error_message(None)
                .with_member_id(r.member_id)
                .with_member_epoch(r.member_epoch),
        ),
        GroupResponse::ListGroups(mut r) => {
            r.error_code = code;
            GroupResponse::ListGroups(r)
        }
        GroupResponse::DescribeGroups(mut r) => {
            for g in &mut r.groups {
                g.error_code = code;
                g.members.clear();
            }
            GroupResponse::DescribeGroups(r)
        }
        GroupResponse::ConsumerGroupDescribe(mut r) => {
            for g in &mut r.groups {
                g.error_code = code;
                g.members.clear();
            }
            GroupResponse::ConsumerGroupDescribe(r)
        }
    }
}
