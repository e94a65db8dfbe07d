//! The records the coordinator writes to `__consumer_offsets`, in Kafka's own key/value schemas
//! (group-coordinator `common/message/*Key.json` / `*Value.json`), and the partition a group
//! lives in.
//!
//! Every key and value starts with an `int16`: for keys the record type (Kafka's "apiKey" of the
//! key schema), for values the value schema version. What is written:
//!
//! | type | key | value written |
//! |---|---|---|
//! | 1 | OffsetCommitKey (group, topic, partition) | OffsetCommitValue v3 (v1 when the commit carried a retention time) |
//! | 2 | GroupMetadataKey (group) | GroupMetadataValue v3 (classic groups) |
//! | 3 | ConsumerGroupMetadataKey (group) | ConsumerGroupMetadataValue v0 (group epoch) |
//! | 5 | ConsumerGroupMemberMetadataKey (group, member) | ConsumerGroupMemberMetadataValue v0 |
//! | 6 | ConsumerGroupTargetAssignmentMetadataKey (group) | ConsumerGroupTargetAssignmentMetadataValue v0 |
//! | 7 | ConsumerGroupTargetAssignmentMemberKey (group, member) | ConsumerGroupTargetAssignmentMemberValue v0 |
//! | 8 | ConsumerGroupCurrentMemberAssignmentKey (group, member) | ConsumerGroupCurrentMemberAssignmentValue v0 |
//!
//! Reading accepts OffsetCommitValue v0–v4 and GroupMetadataValue v0–v4 (what any Kafka since
//! 0.10 wrote), key type 0 as an offset key, and skips the types Strand does not write (4:
//! partition metadata, 16: resolved regular expressions, share and streams groups): those are
//! derived again from topic metadata. Tagged fields are skipped on read and none are written.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use strand_protocol::types::TopicId;

use super::Record;

/// Java's `String.hashCode` over UTF-16 code units, as Kafka computes it.
pub(crate) fn java_string_hash(s: &str) -> i32 {
    let mut h: i32 = 0;
    for unit in s.encode_utf16() {
        h = h.wrapping_mul(31).wrapping_add(i32::from(unit));
    }
    h
}

/// The `__consumer_offsets` partition of a group: `Utils.abs(groupId.hashCode()) % partitions`.
pub(crate) fn partition_for(group_id: &str, partitions: i32) -> i32 {
    let h = java_string_hash(group_id);
    // Kafka's Utils.abs maps Integer.MIN_VALUE to 0.
    let abs = if h == i32::MIN { 0 } else { h.abs() };
    if partitions <= 0 {
        0
    } else {
        abs % partitions
    }
}

/// Partitions of a topic, by topic id.
pub(crate) type Assignment = BTreeMap<TopicId, BTreeSet<i32>>;

pub(crate) const TYPE_OFFSET_V0: i16 = 0;
pub(crate) const TYPE_OFFSET: i16 = 1;
pub(crate) const TYPE_GROUP_METADATA: i16 = 2;
pub(crate) const TYPE_CONSUMER_GROUP: i16 = 3;
pub(crate) const TYPE_CONSUMER_MEMBER: i16 = 5;
pub(crate) const TYPE_TARGET_METADATA: i16 = 6;
pub(crate) const TYPE_TARGET_MEMBER: i16 = 7;
pub(crate) const TYPE_CURRENT_ASSIGNMENT: i16 = 8;

/// A decoded key.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum RecordKey {
    Offset {
        group: String,
        topic: String,
        partition: i32,
    },
    GroupMetadata {
        group: String,
    },
    ConsumerGroup {
        group: String,
    },
    ConsumerMember {
        group: String,
        member: String,
    },
    TargetMetadata {
        group: String,
    },
    TargetMember {
        group: String,
        member: String,
    },
    CurrentAssignment {
        group: String,
        member: String,
    },
    /// A record type Strand does not interpret.
    Other {
        record_type: i16,
    },
}

impl RecordKey {
    /// Order in which keys are applied at load: group records before member records before
    /// offsets, so every record finds what it belongs to.
    pub(crate) fn load_rank(&self) -> u8 {
        match self {
            RecordKey::GroupMetadata { .. } | RecordKey::ConsumerGroup { .. } => 0,
            RecordKey::TargetMetadata { .. } => 1,
            RecordKey::ConsumerMember { .. } => 2,
            RecordKey::TargetMember { .. } | RecordKey::CurrentAssignment { .. } => 3,
            RecordKey::Offset { .. } => 4,
            RecordKey::Other { .. } => 5,
        }
    }

    pub(crate) fn encode(&self) -> Bytes {
        let mut w = Writer::default();
        match self {
            RecordKey::Offset {
                group,
                topic,
                partition,
            } => {
                w.i16(TYPE_OFFSET);
                w.string(group);
                w.string(topic);
                w.i32(*partition);
            }
            RecordKey::GroupMetadata { group } => {
                w.i16(TYPE_GROUP_METADATA);
                w.string(group);
            }
            RecordKey::ConsumerGroup { group } => {
                w.i16(TYPE_CONSUMER_GROUP);
                w.string(group);
            }
            RecordKey::ConsumerMember { group, member } => {
                w.i16(TYPE_CONSUMER_MEMBER);
                w.string(group);
                w.string(member);
            }
            RecordKey::TargetMetadata { group } => {
                w.i16(TYPE_TARGET_METADATA);
                w.string(group);
            }
            RecordKey::TargetMember { group, member } => {
                w.i16(TYPE_TARGET_MEMBER);
                w.string(group);
                w.string(member);
            }
            RecordKey::CurrentAssignment { group, member } => {
                w.i16(TYPE_CURRENT_ASSIGNMENT);
                w.string(group);
                w.string(member);
            }
            RecordKey::Other { record_type } => w.i16(*record_type),
        }
        Bytes::from(w.buf)
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<RecordKey, DecodeError> {
        let mut r = Reader::new(bytes);
        let record_type = r.i16()?;
        let key = match record_type {
            TYPE_OFFSET_V0 | TYPE_OFFSET => RecordKey::Offset {
                group: r.string()?,
                topic: r.string()?,
                partition: r.i32()?,
            },
            TYPE_GROUP_METADATA => RecordKey::GroupMetadata { group: r.string()? },
            TYPE_CONSUMER_GROUP => RecordKey::ConsumerGroup { group: r.string()? },
            TYPE_CONSUMER_MEMBER => RecordKey::ConsumerMember {
                group: r.string()?,
                member: r.string()?,
            },
            TYPE_TARGET_METADATA => RecordKey::TargetMetadata { group: r.string()? },
            TYPE_TARGET_MEMBER => RecordKey::TargetMember {
                group: r.string()?,
                member: r.string()?,
            },
            TYPE_CURRENT_ASSIGNMENT => RecordKey::CurrentAssignment {
                group: r.string()?,
                member: r.string()?,
            },
            other => return Ok(RecordKey::Other { record_type: other }),
        };
        Ok(key)
    }

    /// The group a key belongs to.
    pub(crate) fn group(&self) -> Option<&str> {
        match self {
            RecordKey::Offset { group, .. }
            | RecordKey::GroupMetadata { group }
            | RecordKey::ConsumerGroup { group }
            | RecordKey::ConsumerMember { group, .. }
            | RecordKey::TargetMetadata { group }
            | RecordKey::TargetMember { group, .. }
            | RecordKey::CurrentAssignment { group, .. } => Some(group),
            RecordKey::Other { .. } => None,
        }
    }
}

/// Undecodable record bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DecodeError(pub(crate) String);

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// OffsetCommitValue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OffsetValue {
    pub(crate) offset: i64,
    pub(crate) leader_epoch: i32,
    pub(crate) metadata: String,
    pub(crate) commit_timestamp: i64,
    /// Set when the commit (OffsetCommit v2–v4) carried a retention time.
    pub(crate) expire_timestamp: Option<i64>,
}

impl OffsetValue {
    pub(crate) fn encode(&self) -> Bytes {
        let mut w = Writer::default();
        match self.expire_timestamp {
            Some(expire) => {
                w.i16(1);
                w.i64(self.offset);
                w.string(&self.metadata);
                w.i64(self.commit_timestamp);
                w.i64(expire);
            }
            None => {
                w.i16(3);
                w.i64(self.offset);
                w.i32(self.leader_epoch);
                w.string(&self.metadata);
                w.i64(self.commit_timestamp);
            }
        }
        Bytes::from(w.buf)
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<OffsetValue, DecodeError> {
        let mut r = Reader::new(bytes);
        let version = r.i16()?;
        let flexible = version >= 4;
        let offset = r.i64()?;
        let leader_epoch = if version >= 3 { r.i32()? } else { -1 };
        let metadata = if flexible {
            r.compact_string()?
        } else {
            r.string()?
        };
        let commit_timestamp = r.i64()?;
        let expire_timestamp = if version == 1 {
            Some(r.i64()?).filter(|t| *t >= 0)
        } else {
            None
        };
        if !(0..=4).contains(&version) {
            return Err(DecodeError(format!(
                "OffsetCommitValue version {version} is unknown"
            )));
        }
        Ok(OffsetValue {
            offset,
            leader_epoch,
            metadata,
            commit_timestamp,
            expire_timestamp,
        })
    }
}

/// GroupMetadataValue: a classic group.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct ClassicGroupValue {
    pub(crate) protocol_type: String,
    pub(crate) generation: i32,
    pub(crate) protocol: Option<String>,
    pub(crate) leader: Option<String>,
    pub(crate) current_state_timestamp: Option<i64>,
    pub(crate) members: Vec<ClassicMemberValue>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct ClassicMemberValue {
    pub(crate) member_id: String,
    pub(crate) group_instance_id: Option<String>,
    pub(crate) client_id: String,
    pub(crate) client_host: String,
    pub(crate) rebalance_timeout_ms: i32,
    pub(crate) session_timeout_ms: i32,
    pub(crate) subscription: Bytes,
    pub(crate) assignment: Bytes,
}

impl ClassicGroupValue {
    pub(crate) fn encode(&self) -> Bytes {
        let mut w = Writer::default();
        w.i16(3);
        w.string(&self.protocol_type);
        w.i32(self.generation);
        w.nullable_string(self.protocol.as_deref());
        w.nullable_string(self.leader.as_deref());
        w.i64(self.current_state_timestamp.unwrap_or(-1));
        w.i32(self.members.len() as i32);
        for m in &self.members {
            w.string(&m.member_id);
            w.nullable_string(m.group_instance_id.as_deref());
            w.string(&m.client_id);
            w.string(&m.client_host);
            w.i32(m.rebalance_timeout_ms);
            w.i32(m.session_timeout_ms);
            w.bytes(&m.subscription);
            w.bytes(&m.assignment);
        }
        Bytes::from(w.buf)
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<ClassicGroupValue, DecodeError> {
        let mut r = Reader::new(bytes);
        let version = r.i16()?;
        if !(0..=4).contains(&version) {
            return Err(DecodeError(format!(
                "GroupMetadataValue version {version} is unknown"
            )));
        }
        let flexible = version >= 4;
        let s = |r: &mut Reader<'_>| if flexible { r.compact_string() } else { r.string() };
        let ns = |r: &mut Reader<'_>| {
            if flexible {
                r.compact_nullable_string()
            } else {
                r.nullable_string()
            }
        };
        let protocol_type = s(&mut r)?;
        let generation = r.i32()?;
        let protocol = ns(&mut r)?;
        let leader = ns(&mut r)?;
        let current_state_timestamp = if version >= 2 {
            Some(r.i64()?).filter(|t| *t >= 0)
        } else {
            None
        };
        let count = if flexible { r.compact_len()? } else { r.len()? };
        let mut members = Vec::with_capacity(count.min(r.remaining()));
        for _ in 0..count {
            let member_id = s(&mut r)?;
            let group_instance_id = if version >= 3 { ns(&mut r)? } else { None };
            let client_id = s(&mut r)?;
            let client_host = s(&mut r)?;
            let rebalance_timeout_ms = if version >= 1 { r.i32()? } else { -1 };
            let session_timeout_ms = r.i32()?;
            let (subscription, assignment) = if flexible {
                (r.compact_bytes()?, r.compact_bytes()?)
            } else {
                (r.bytes()?, r.bytes()?)
            };
            if flexible {
                r.skip_tagged()?;
            }
            members.push(ClassicMemberValue {
                member_id,
                group_instance_id,
                client_id,
                client_host,
                rebalance_timeout_ms,
                session_timeout_ms,
                subscription,
                assignment,
            });
        }
        Ok(ClassicGroupValue {
            protocol_type,
            generation,
            protocol,
            leader,
            current_state_timestamp,
            members,
        })
    }
}

/// ConsumerGroupMetadataValue / ConsumerGroupTargetAssignmentMetadataValue: one epoch.
pub(crate) fn encode_epoch_value(epoch: i32) -> Bytes {
    let mut w = Writer::default();
    w.i16(0);
    w.i32(epoch);
    w.tags();
    Bytes::from(w.buf)
}

pub(crate) fn decode_epoch_value(bytes: &[u8]) -> Result<i32, DecodeError> {
    let mut r = Reader::new(bytes);
    let _version = r.i16()?;
    r.i32()
}

/// ConsumerGroupMemberMetadataValue.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct ConsumerMemberValue {
    pub(crate) instance_id: Option<String>,
    pub(crate) rack_id: Option<String>,
    pub(crate) client_id: String,
    pub(crate) client_host: String,
    pub(crate) subscribed_topic_names: Vec<String>,
    pub(crate) subscribed_topic_regex: Option<String>,
    pub(crate) rebalance_timeout_ms: i32,
    pub(crate) server_assignor: Option<String>,
}

impl ConsumerMemberValue {
    pub(crate) fn encode(&self) -> Bytes {
        let mut w = Writer::default();
        w.i16(0);
        w.compact_nullable_string(self.instance_id.as_deref());
        w.compact_nullable_string(self.rack_id.as_deref());
        w.compact_string(&self.client_id);
        w.compact_string(&self.client_host);
        w.compact_len(self.subscribed_topic_names.len());
        for t in &self.subscribed_topic_names {
            w.compact_string(t);
        }
        w.compact_nullable_string(self.subscribed_topic_regex.as_deref());
        w.i32(self.rebalance_timeout_ms);
        w.compact_nullable_string(self.server_assignor.as_deref());
        w.tags();
        Bytes::from(w.buf)
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<ConsumerMemberValue, DecodeError> {
        let mut r = Reader::new(bytes);
        let _version = r.i16()?;
        let instance_id = r.compact_nullable_string()?;
        let rack_id = r.compact_nullable_string()?;
        let client_id = r.compact_string()?;
        let client_host = r.compact_string()?;
        let n = r.compact_len()?;
        let mut subscribed_topic_names = Vec::with_capacity(n.min(r.remaining()));
        for _ in 0..n {
            subscribed_topic_names.push(r.compact_string()?);
        }
        let subscribed_topic_regex = r.compact_nullable_string()?;
        let rebalance_timeout_ms = r.i32()?;
        let server_assignor = r.compact_nullable_string()?;
        Ok(ConsumerMemberValue {
            instance_id,
            rack_id,
            client_id,
            client_host,
            subscribed_topic_names,
            subscribed_topic_regex,
            rebalance_timeout_ms,
            server_assignor,
        })
    }
}

fn put_assignment(w: &mut Writer, a: &Assignment) {
    let topics: Vec<_> = a.iter().filter(|(_, ps)| !ps.is_empty()).collect();
    w.compact_len(topics.len());
    for (topic, partitions) in topics {
        w.uuid(*topic);
        w.compact_len(partitions.len());
        for p in partitions {
            w.i32(*p);
        }
        w.tags();
    }
}

fn get_assignment(r: &mut Reader<'_>) -> Result<Assignment, DecodeError> {
    let n = r.compact_len()?;
    let mut out = Assignment::new();
    for _ in 0..n {
        let topic = r.uuid()?;
        let count = r.compact_len()?;
        let mut ps = BTreeSet::new();
        for _ in 0..count {
            ps.insert(r.i32()?);
        }
        r.skip_tagged()?;
        if !ps.is_empty() {
            out.entry(topic).or_default().extend(ps);
        }
    }
    Ok(out)
}

/// ConsumerGroupTargetAssignmentMemberValue.
pub(crate) fn encode_target_member(a: &Assignment) -> Bytes {
    let mut w = Writer::default();
    w.i16(0);
    put_assignment(&mut w, a);
    w.tags();
    Bytes::from(w.buf)
}

pub(crate) fn decode_target_member(bytes: &[u8]) -> Result<Assignment, DecodeError> {
    let mut r = Reader::new(bytes);
    let _version = r.i16()?;
    get_assignment(&mut r)
}

/// ConsumerGroupCurrentMemberAssignmentValue.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct CurrentAssignmentValue {
    pub(crate) member_epoch: i32,
    pub(crate) previous_member_epoch: i32,
    /// Kafka's MemberState: 0 stable, 1 unrevoked partitions, 2 unreleased partitions.
    pub(crate) state: i8,
    pub(crate) assigned: Assignment,
    pub(crate) pending_revocation: Assignment,
}

impl CurrentAssignmentValue {
    pub(crate) fn encode(&self) -> Bytes {
        let mut w = Writer::default();
        w.i16(0);
        w.i32(self.member_epoch);
        w.i32(self.previous_member_epoch);
        w.buf.push(self.state as u8);
        put_assignment(&mut w, &self.assigned);
        put_assignment(&mut w, &self.pending_revocation);
        w.tags();
        Bytes::from(w.buf)
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<CurrentAssignmentValue, DecodeError> {
        let mut r = Reader::new(bytes);
        let _version = r.i16()?;
        Ok(CurrentAssignmentValue {
            member_epoch: r.i32()?,
            previous_member_epoch: r.i32()?,
            state: r.i8()?,
            assigned: get_assignment(&mut r)?,
            pending_revocation: get_assignment(&mut r)?,
        })
    }
}

/// A record with a key and a value (or a tombstone).
pub(crate) fn record(key: RecordKey, value: Option<Bytes>) -> Record {
    Record {
        key: key.encode(),
        value,
    }
}

/// A record setting `key` to `value`.
pub(crate) fn put(key: RecordKey, value: Bytes) -> Record {
    record(key, Some(value))
}

/// A tombstone for `key`.
pub(crate) fn tombstone(key: RecordKey) -> Record {
    record(key, None)
}

/// The records of one `__consumer_offsets` batch, for replay: `(key, value)` pairs in order,
/// `None` values being tombstones. Checks the CRC, skips control batches (transaction markers)
/// and records without a key, and decompresses at most `max_decompressed_bytes`.
pub(crate) fn batch_records(batch: &Bytes, max_decompressed_bytes: usize) -> Result<Vec<Record>, String> {
    let header = strand_protocol::batch::BatchHeader::parse(batch).map_err(|e| e.to_string())?;
    if header.is_control() {
        return Ok(Vec::new());
    }
    let records =
        strand_protocol::records::decode_records(batch, max_decompressed_bytes).map_err(|e| e.to_string())?;
    Ok(records
        .into_iter()
        .filter_map(|r| {
            Some(Record {
                key: r.key?,
                value: r.value,
            })
        })
        .collect())
}

/// One uncompressed v2 batch holding `records` (base offset 0; storage assigns offsets).
pub(crate) fn build_batch(records: &[Record], timestamp_ms: i64) -> Vec<u8> {
    use strand_protocol::batch::build::{batch, TestRecord};
    let recs: Vec<TestRecord<'_>> = records
        .iter()
        .map(|r| TestRecord {
            key: Some(&r.key),
            value: r.value.as_deref(),
            headers: vec![],
            timestamp_delta: 0,
        })
        .collect();
    batch(&recs, timestamp_ms)
}

#[derive(Default)]
struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    fn i16(&mut self, v: i16) {
        self.buf.extend_from_slice(&v.to_be_bytes());
    }
    fn i32(&mut self, v: i32) {
        self.buf.extend_from_slice(&v.to_be_bytes());
    }
    fn i64(&mut self, v: i64) {
        self.buf.extend_from_slice(&v.to_be_bytes());
    }
    fn string(&mut self, s: &str) {
        let len = s.len().min(i16::MAX as usize);
        self.i16(len as i16);
        self.buf
            .extend_from_slice(s.as_bytes().get(..len).unwrap_or_default());
    }
    fn nullable_string(&mut self, s: Option<&str>) {
        match s {
            Some(s) => self.string(s),
            None => self.i16(-1),
        }
    }
    fn bytes(&mut self, b: &[u8]) {
        self.i32(b.len() as i32);
        self.buf.extend_from_slice(b);
    }
    fn uvarint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.buf.push((v as u8 & 0x7f) | 0x80);
            v >>= 7;
        }
        self.buf.push(v as u8);
    }
    fn compact_len(&mut self, n: usize) {
        self.uvarint(n as u64 + 1);
    }
    fn compact_string(&mut self, s: &str) {
        self.compact_len(s.len());
        self.buf.extend_from_slice(s.as_bytes());
    }
    fn compact_nullable_string(&mut self, s: Option<&str>) {
        match s {
            Some(s) => self.compact_string(s),
            None => self.uvarint(0),
        }
    }
    fn uuid(&mut self, id: TopicId) {
        self.buf.extend_from_slice(id.0.as_bytes());
    }
    /// An empty tagged-field section.
    fn tags(&mut self) {
        self.uvarint(0);
    }
}

struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Reader { buf }
    }
    fn remaining(&self) -> usize {
        self.buf.len()
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let data = self
            .buf
            .get(..n)
            .ok_or_else(|| DecodeError(format!("needed {n} bytes, {} left", self.buf.len())))?;
        self.buf = self.buf.get(n..).unwrap_or_default();
        Ok(data)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }
    fn i8(&mut self) -> Result<i8, DecodeError> {
        Ok(i8::from_be_bytes(self.array()?))
    }
    fn i16(&mut self) -> Result<i16, DecodeError> {
        Ok(i16::from_be_bytes(self.array()?))
    }
    fn i32(&mut self) -> Result<i32, DecodeError> {
        Ok(i32::from_be_bytes(self.array()?))
    }
    fn i64(&mut self) -> Result<i64, DecodeError> {
        Ok(i64::from_be_bytes(self.array()?))
    }
    fn utf8(&mut self, n: usize) -> Result<String, DecodeError> {
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| DecodeError("invalid UTF-8".into()))
    }
    fn nullable_string(&mut self) -> Result<Option<String>, DecodeError> {
        let len = self.i16()?;
        if len < 0 {
            return Ok(None);
        }
        Ok(Some(self.utf8(len as usize)?))
    }
    fn string(&mut self) -> Result<String, DecodeError> {
        self.nullable_string()?
            .ok_or_else(|| DecodeError("null in a non-nullable string".into()))
    }
    fn len(&mut self) -> Result<usize, DecodeError> {
        let n = self.i32()?;
        usize::try_from(n).map_err(|_| DecodeError(format!("negative array length {n}")))
    }
    fn bytes(&mut self) -> Result<Bytes, DecodeError> {
        let n = self.i32()?;
        if n < 0 {
            return Ok(Bytes::new());
        }
        Ok(Bytes::copy_from_slice(self.take(n as usize)?))
    }
    fn uvarint(&mut self) -> Result<u64, DecodeError> {
        let mut v: u64 = 0;
        for shift in (0..64).step_by(7) {
            let b = self.array::<1>()?[0];
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(DecodeError("varint too long".into()))
    }
    /// A compact length; `None` for null.
    fn compact_nullable_len(&mut self) -> Result<Option<usize>, DecodeError> {
        let v = self.uvarint()?;
        if v == 0 {
            return Ok(None);
        }
        let n = usize::try_from(v - 1).map_err(|_| DecodeError("length too large".into()))?;
        if n > self.buf.len().saturating_mul(8).saturating_add(16) {
            return Err(DecodeError(format!("length {n} exceeds the record")));
        }
        Ok(Some(n))
    }
    fn compact_len(&mut self) -> Result<usize, DecodeError> {
        Ok(self.compact_nullable_len()?.unwrap_or(0))
    }
    fn compact_nullable_string(&mut self) -> Result<Option<String>, DecodeError> {
        match self.compact_nullable_len()? {
            None => Ok(None),
            Some(n) => Ok(Some(self.utf8(n)?)),
        }
    }
    fn compact_string(&mut self) -> Result<String, DecodeError> {
        self.compact_nullable_string()?
            .ok_or_else(|| DecodeError("null in a non-nullable string".into()))
    }
    fn compact_bytes(&mut self) -> Result<Bytes, DecodeError> {
        match self.compact_nullable_len()? {
            None => Ok(Bytes::new()),
            Some(n) => Ok(Bytes::copy_from_slice(self.take(n)?)),
        }
    }
    fn uuid(&mut self) -> Result<TopicId, DecodeError> {
        Ok(TopicId(uuid::Uuid::from_bytes(self.array()?)))
    }
    fn skip_tagged(&mut self) -> Result<(), DecodeError> {
        let n = self.uvarint()?;
        for _ in 0..n {
            let _tag = self.uvarint()?;
            let size = usize::try_from(self.uvarint()?).map_err(|_| DecodeError("tag too large".into()))?;
            self.take(size)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn java_hash_and_partition() {
        // Values printed by Java's String.hashCode and Kafka's Utils.abs(h) % 50.
        assert_eq!(java_string_hash(""), 0);
        assert_eq!(java_string_hash("hello"), 99_162_322);
        assert_eq!(partition_for("hello", 50), 22);
        assert_eq!(java_string_hash("my-group"), -1_906_497_762);
        assert_eq!(partition_for("my-group", 50), 12);
        assert_eq!(partition_for("console-consumer-12345", 50), 6);
        // Non-BMP characters count as two UTF-16 units.
        assert_eq!(java_string_hash("\u{1F600}"), 1_772_899);
        assert_eq!(partition_for("\u{1F600}", 50), 49);
        // Integer.MIN_VALUE maps to partition 0: "polygenelubricants" hashes to MIN_VALUE.
        assert_eq!(java_string_hash("polygenelubricants"), i32::MIN);
        assert_eq!(partition_for("polygenelubricants", 50), 0);
    }

    fn roundtrip_key(k: RecordKey) {
        assert_eq!(RecordKey::decode(&k.encode()).unwrap(), k);
    }

    #[test]
    fn keys_roundtrip_and_bytes() {
        let k = RecordKey::Offset {
            group: "g".into(),
            topic: "t".into(),
            partition: 3,
        };
        assert_eq!(
            k.encode().as_ref(),
            &[0, 1, 0, 1, b'g', 0, 1, b't', 0, 0, 0, 3][..],
            "OffsetCommitKey: type 1, group, topic, partition"
        );
        roundtrip_key(k);
        roundtrip_key(RecordKey::GroupMetadata { group: "g".into() });
        roundtrip_key(RecordKey::ConsumerGroup { group: "g".into() });
        roundtrip_key(RecordKey::ConsumerMember {
            group: "g".into(),
            member: "m".into(),
        });
        roundtrip_key(RecordKey::TargetMetadata { group: "g".into() });
        roundtrip_key(RecordKey::TargetMember {
            group: "g".into(),
            member: "m".into(),
        });
        roundtrip_key(RecordKey::CurrentAssignment {
            group: "g".into(),
            member: "m".into(),
        });
        assert_eq!(
            RecordKey::decode(&[0, 16, 0, 1, b'g']).unwrap(),
            RecordKey::Other { record_type: 16 }
        );
        assert!(RecordKey::decode(&[0, 1, 0, 9, b'g']).is_err());
    }

    #[test]
    fn offset_value_v3_bytes_and_versions() {
        let v = OffsetValue {
            offset: 42,
            leader_epoch: 7,
            metadata: "m".into(),
            commit_timestamp: 1000,
            expire_timestamp: None,
        };
        let bytes = v.encode();
        let mut expected = vec![0, 3];
        expected.extend_from_slice(&42i64.to_be_bytes());
        expected.extend_from_slice(&7i32.to_be_bytes());
        expected.extend_from_slice(&[0, 1, b'm']);
        expected.extend_from_slice(&1000i64.to_be_bytes());
        assert_eq!(bytes.as_ref(), &expected[..]);
        assert_eq!(OffsetValue::decode(&bytes).unwrap(), v);
        let v1 = OffsetValue {
            expire_timestamp: Some(5000),
            leader_epoch: -1,
            ..v.clone()
        };
        assert_eq!(OffsetValue::decode(&v1.encode()).unwrap(), v1);
        // v4 (flexible) as Kafka may write it.
        let mut v4 = vec![0, 4];
        v4.extend_from_slice(&42i64.to_be_bytes());
        v4.extend_from_slice(&7i32.to_be_bytes());
        v4.extend_from_slice(&[2, b'm']);
        v4.extend_from_slice(&1000i64.to_be_bytes());
        v4.push(0);
        assert_eq!(OffsetValue::decode(&v4).unwrap(), v);
        assert!(OffsetValue::decode(&[0, 3, 1]).is_err());
    }

    #[test]
    fn group_values_roundtrip() {
        let g = ClassicGroupValue {
            protocol_type: "consumer".into(),
            generation: 4,
            protocol: Some("range".into()),
            leader: Some("m1".into()),
            current_state_timestamp: Some(99),
            members: vec![ClassicMemberValue {
                member_id: "m1".into(),
                group_instance_id: Some("i1".into()),
                client_id: "c".into(),
                client_host: "/127.0.0.1".into(),
                rebalance_timeout_ms: 300_000,
                session_timeout_ms: 45_000,
                subscription: Bytes::from_static(b"sub"),
                assignment: Bytes::from_static(b"asg"),
            }],
        };
        assert_eq!(ClassicGroupValue::decode(&g.encode()).unwrap(), g);
        let topic = TopicId(uuid::Uuid::from_u128(7));
        let mut a = Assignment::new();
        a.insert(topic, [0, 2, 5].into_iter().collect());
        let cur = CurrentAssignmentValue {
            member_epoch: 5,
            previous_member_epoch: 4,
            state: 1,
            assigned: a.clone(),
            pending_revocation: Assignment::new(),
        };
        assert_eq!(CurrentAssignmentValue::decode(&cur.encode()).unwrap(), cur);
        assert_eq!(decode_target_member(&encode_target_member(&a)).unwrap(), a);
        let m = ConsumerMemberValue {
            instance_id: None,
            rack_id: Some("r".into()),
            client_id: "c".into(),
            client_host: "h".into(),
            subscribed_topic_names: vec!["a".into(), "b".into()],
            subscribed_topic_regex: Some("x.*".into()),
            rebalance_timeout_ms: 1000,
            server_assignor: Some("range".into()),
        };
        assert_eq!(ConsumerMemberValue::decode(&m.encode()).unwrap(), m);
        assert_eq!(decode_epoch_value(&encode_epoch_value(12)).unwrap(), 12);
    }

    #[test]
    fn batch_roundtrip() {
        let recs = vec![
            record(RecordKey::GroupMetadata { group: "g".into() }, None),
            record(
                RecordKey::ConsumerGroup { group: "g".into() },
                Some(encode_epoch_value(1)),
            ),
        ];
        let batch = build_batch(&recs, 123);
        assert_eq!(batch_records(&Bytes::from(batch.clone()), 1 << 20).unwrap(), recs);
        let mut corrupt = batch;
        let last = corrupt.len() - 1;
        corrupt[last] ^= 0xff;
        assert!(batch_records(&Bytes::from(corrupt), 1 << 20).is_err());
    }
}
