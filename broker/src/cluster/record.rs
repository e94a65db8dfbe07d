//! The records of the cluster metadata log: the entries the controller quorum's Raft group
//! replicates, and their byte encoding.
//!
//! Each record is framed as `[type: u8][version: u8][body]`, big-endian like Kafka's wire format.
//! Decoding bounds every length and count before allocating and returns an error, never a
//! panic, on anything malformed: the bytes come from disk and from other nodes. A record of a
//! version this code does not know is refused rather than half-read, so an old node never
//! applies a record it would misunderstand.

#![cfg_attr(not(test), deny(clippy::indexing_slicing))]

use std::fmt;

use strand_protocol::types::{LeaderEpoch, NodeId, PartitionId, ShardId, TopicId};

/// The epoch of one broker registration. It is the [`MetadataOffset`] of the registration's
/// own `RegisterBroker` record, so it only grows (as Kafka's broker epoch is the metadata log
/// offset of the registration), and a broker that has applied records up to it has seen its
/// own registration.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default)]
pub struct BrokerEpoch(pub i64);

/// Bumped by every change to a partition's registration (KIP-497's partition epoch): an
/// AlterPartition from a leader that has not seen the latest change is refused.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default)]
pub struct PartitionEpoch(pub i32);

/// A record's position in the metadata log: records are numbered densely from 0 in the order
/// they are applied (Raft-internal entries take no offset).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default)]
pub struct MetadataOffset(pub u64);

/// Chosen at random by a broker process when it starts: a registration with a new incarnation
/// is a new process (a restart), one with the same incarnation a retry of the same process.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default)]
pub struct IncarnationId(pub uuid::Uuid);

/// How a listener of a broker is reached (`advertised.listeners`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// The listener name (`PLAINTEXT`, `CONTROLLER`, ...).
    pub listener: String,
    pub host: String,
    pub port: u16,
}

/// A broker process registers (or re-registers).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegisterBroker {
    pub broker: NodeId,
    pub incarnation: IncarnationId,
    pub epoch: BrokerEpoch,
    pub endpoints: Vec<Endpoint>,
    pub rack: Option<String>,
    /// The broker's shard (core) count: replicas are placed on shards below it.
    pub shards: u16,
}

/// A replica: the broker that holds it and the shard of that broker that owns it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Replica {
    pub broker: NodeId,
    pub shard: ShardId,
}

/// A partition as it is created.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartitionRecord {
    pub topic: TopicId,
    pub partition: PartitionId,
    /// In preference order: the first is the preferred leader.
    pub replicas: Vec<Replica>,
    pub isr: Vec<NodeId>,
    /// `None` is Kafka's leader -1: the partition is offline.
    pub leader: Option<NodeId>,
    pub leader_epoch: LeaderEpoch,
    pub partition_epoch: PartitionEpoch,
}

/// A partition's new leader, ISR and epochs, as absolute values (the record is checked
/// against the state it applies to: the partition epoch must be the next one).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartitionChange {
    pub topic: TopicId,
    pub partition: PartitionId,
    pub leader: Option<NodeId>,
    pub isr: Vec<NodeId>,
    pub leader_epoch: LeaderEpoch,
    pub partition_epoch: PartitionEpoch,
    /// New shards of the replicas, in replica order, when a replica moves between the shards of
    /// its broker (its broker came back with fewer shards). `None`: unchanged.
    pub shards: Option<Vec<ShardId>>,
}

/// What a config record configures.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ConfigResource {
    /// A topic's overrides (Kafka resource type TOPIC), by name as Kafka keys them.
    Topic(String),
    /// A consumer or share group's overrides (resource type GROUP).
    Group(String),
    /// A Strand queue's overrides.
    Queue(String),
}

/// Config changes of one resource: `None` removes the key (back to the default).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigRecord {
    pub resource: ConfigResource,
    pub entries: Vec<(String, Option<String>)>,
}

/// One entry of the cluster metadata log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    RegisterBroker(RegisterBroker),
    /// The broker may lead nothing and is in no live ISR (its partitions were moved first).
    BrokerFenced {
        broker: NodeId,
        epoch: BrokerEpoch,
    },
    BrokerUnfenced {
        broker: NodeId,
        epoch: BrokerEpoch,
    },
    /// The broker entered controlled shutdown (KIP-841): it leads nothing any more and may not
    /// join an ISR; it is fenced once every live broker has seen the moves.
    BrokerShutdown {
        broker: NodeId,
        epoch: BrokerEpoch,
    },
    Topic {
        name: String,
        id: TopicId,
    },
    Partition(PartitionRecord),
    PartitionChange(PartitionChange),
    Config(ConfigRecord),
    RemoveTopic {
        id: TopicId,
    },
    /// A block of producer ids was handed to a broker (KIP-730): ids below `next_producer_id`
    /// are never handed out again.
    ProducerIds {
        broker: NodeId,
        broker_epoch: BrokerEpoch,
        next_producer_id: i64,
    },
}

/// The most replicas one partition may have.
pub const MAX_REPLICAS: usize = 64;
/// The most endpoints one broker may register.
pub const MAX_ENDPOINTS: usize = 64;
/// The most entries one config record may carry.
pub const MAX_CONFIG_ENTRIES: usize = 1024;
/// The longest string in a record (names, hosts, config values).
pub const MAX_STRING_BYTES: usize = 32 * 1024;

const VERSION: u8 = 0;

mod tag {
    pub(super) const REGISTER_BROKER: u8 = 1;
    pub(super) const BROKER_FENCED: u8 = 2;
    pub(super) const BROKER_UNFENCED: u8 = 3;
    pub(super) const BROKER_SHUTDOWN: u8 = 4;
    pub(super) const TOPIC: u8 = 5;
    pub(super) const PARTITION: u8 = 6;
    pub(super) const PARTITION_CHANGE: u8 = 7;
    pub(super) const CONFIG: u8 = 8;
    pub(super) const REMOVE_TOPIC: u8 = 9;
    pub(super) const PRODUCER_IDS: u8 = 10;
}

/// Why bytes are not a record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError(pub String);

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "bad metadata record: {}", self.0)
    }
}

impl std::error::Error for DecodeError {}

pub(super) fn bad(what: impl Into<String>) -> DecodeError {
    DecodeError(what.into())
}

impl Record {
    /// The record's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer(Vec::with_capacity(64));
        match self {
            Record::RegisterBroker(r) => {
                w.head(tag::REGISTER_BROKER);
                w.node(r.broker);
                w.uuid(r.incarnation.0);
                w.i64(r.epoch.0);
                w.endpoints(&r.endpoints);
                w.opt_str(r.rack.as_deref());
                w.u16(r.shards);
            }
            Record::BrokerFenced { broker, epoch } => {
                w.head(tag::BROKER_FENCED);
                w.node(*broker);
                w.i64(epoch.0);
            }
            Record::BrokerUnfenced { broker, epoch } => {
                w.head(tag::BROKER_UNFENCED);
                w.node(*broker);
                w.i64(epoch.0);
            }
            Record::BrokerShutdown { broker, epoch } => {
                w.head(tag::BROKER_SHUTDOWN);
                w.node(*broker);
                w.i64(epoch.0);
            }
            Record::Topic { name, id } => {
                w.head(tag::TOPIC);
                w.str(name);
                w.uuid(id.0);
            }
            Record::Partition(p) => {
                w.head(tag::PARTITION);
                w.uuid(p.topic.0);
                w.i32(p.partition.0);
                w.replicas(&p.replicas);
                w.nodes(&p.isr);
                w.leader(p.leader);
                w.i32(p.leader_epoch.0);
                w.i32(p.partition_epoch.0);
            }
            Record::PartitionChange(c) => {
                w.head(tag::PARTITION_CHANGE);
                w.uuid(c.topic.0);
                w.i32(c.partition.0);
                w.leader(c.leader);
                w.nodes(&c.isr);
                w.i32(c.leader_epoch.0);
                w.i32(c.partition_epoch.0);
                match &c.shards {
                    None => w.u8(0),
                    Some(shards) => {
                        w.u8(1);
                        w.count(shards.len());
                        for s in shards {
                            w.u16(s.0);
                        }
                    }
                }
            }
            Record::Config(c) => {
                w.head(tag::CONFIG);
                let (kind, name) = match &c.resource {
                    ConfigResource::Topic(n) => (0, n),
                    ConfigResource::Group(n) => (1, n),
                    ConfigResource::Queue(n) => (2, n),
                };
                w.u8(kind);
                w.str(name);
                w.count(c.entries.len());
                for (k, v) in &c.entries {
                    w.str(k);
                    w.opt_str(v.as_deref());
                }
            }
            Record::RemoveTopic { id } => {
                w.head(tag::REMOVE_TOPIC);
                w.uuid(id.0);
            }
            Record::ProducerIds {
                broker,
                broker_epoch,
                next_producer_id,
            } => {
                w.head(tag::PRODUCER_IDS);
                w.node(*broker);
                w.i64(broker_epoch.0);
                w.i64(*next_producer_id);
            }
        }
        w.0
    }

    /// Reads one record; every byte must belong to it.
    pub fn decode(bytes: &[u8]) -> Result<Record, DecodeError> {
        let mut r = Reader(bytes);
        let kind = r.u8()?;
        let version = r.u8()?;
        if version != VERSION {
            return Err(bad(format!("record type {kind} has unknown version {version}")));
        }
        let record = match kind {
            tag::REGISTER_BROKER => {
                let broker = r.node()?;
                let incarnation = IncarnationId(r.uuid()?);
                let epoch = BrokerEpoch(r.i64()?);
                let n = r.count(MAX_ENDPOINTS, "endpoints")?;
                let mut endpoints = Vec::with_capacity(n);
                for _ in 0..n {
                    endpoints.push(r.endpoint()?);
                }
                let rack = r.opt_str()?;
                let shards = r.u16()?;
                Record::RegisterBroker(RegisterBroker {
                    broker,
                    incarnation,
                    epoch,
                    endpoints,
                    rack,
                    shards,
                })
            }
            tag::BROKER_FENCED => Record::BrokerFenced {
                broker: r.node()?,
                epoch: BrokerEpoch(r.i64()?),
            },
            tag::BROKER_UNFENCED => Record::BrokerUnfenced {
                broker: r.node()?,
                epoch: BrokerEpoch(r.i64()?),
            },
            tag::BROKER_SHUTDOWN => Record::BrokerShutdown {
                broker: r.node()?,
                epoch: BrokerEpoch(r.i64()?),
            },
            tag::TOPIC => Record::Topic {
                name: r.str()?,
                id: TopicId(r.uuid()?),
            },
            tag::PARTITION => {
                let topic = TopicId(r.uuid()?);
                let partition = PartitionId(r.i32()?);
                let replicas = r.replicas()?;
                Record::Partition(PartitionRecord {
                    topic,
                    partition,
                    replicas,
                    isr: r.nodes()?,
                    leader: r.leader()?,
                    leader_epoch: LeaderEpoch(r.i32()?),
                    partition_epoch: PartitionEpoch(r.i32()?),
                })
            }
            tag::PARTITION_CHANGE => {
                let topic = TopicId(r.uuid()?);
                let partition = PartitionId(r.i32()?);
                let leader = r.leader()?;
                let isr = r.nodes()?;
                let leader_epoch = LeaderEpoch(r.i32()?);
                let partition_epoch = PartitionEpoch(r.i32()?);
                let shards = match r.u8()? {
                    0 => None,
                    1 => {
                        let n = r.count(MAX_REPLICAS, "shards")?;
                        let mut shards = Vec::with_capacity(n);
                        for _ in 0..n {
                            shards.push(ShardId(r.u16()?));
                        }
                        Some(shards)
                    }
                    other => return Err(bad(format!("shards flag {other}"))),
                };
                Record::PartitionChange(PartitionChange {
                    topic,
                    partition,
                    leader,
                    isr,
                    leader_epoch,
                    partition_epoch,
                    shards,
                })
            }
            tag::CONFIG => {
                let kind = r.u8()?;
                let name = r.str()?;
                let resource = match kind {
                    0 => ConfigResource::Topic(name),
                    1 => ConfigResource::Group(name),
                    2 => ConfigResource::Queue(name),
                    other => return Err(bad(format!("config resource type {other}"))),
                };
                let n = r.count(MAX_CONFIG_ENTRIES, "config entries")?;
                let mut entries = Vec::with_capacity(n);
                for _ in 0..n {
                    entries.push((r.str()?, r.opt_str()?));
                }
                Record::Config(ConfigRecord { resource, entries })
            }
            tag::REMOVE_TOPIC => Record::RemoveTopic {
                id: TopicId(r.uuid()?),
            },
            tag::PRODUCER_IDS => Record::ProducerIds {
                broker: r.node()?,
                broker_epoch: BrokerEpoch(r.i64()?),
                next_producer_id: r.i64()?,
            },
            other => return Err(bad(format!("unknown record type {other}"))),
        };
        if !r.0.is_empty() {
            return Err(bad(format!("{} bytes after the record", r.0.len())));
        }
        Ok(record)
    }
}

/// The most records one batch (one decision, one Raft entry) may hold.
pub const MAX_BATCH_RECORDS: u32 = 1 << 20;

/// The records of one controller decision as one Raft entry: `[u32 count]` then each record as
/// `[u32 length][record]`. A decision's records are committed together or not at all: between
/// two records of one decision the state may be one no decision leaves (a partition offline
/// while the broker about to be fenced still counts as alive), and a new controller must never
/// find it so.
pub fn encode_batch(records: &[Record]) -> Vec<u8> {
    let mut w = Writer(Vec::with_capacity(16 + 64 * records.len()));
    let count = u32::try_from(records.len());
    assert!(
        count.as_ref().is_ok_and(|c| *c <= MAX_BATCH_RECORDS),
        "metadata batch too long"
    );
    w.u32(count.unwrap_or(u32::MAX));
    for r in records {
        let bytes = r.encode();
        w.u32(u32::try_from(bytes.len()).unwrap_or(u32::MAX));
        w.0.extend_from_slice(&bytes);
    }
    w.0
}

/// Reads one batch; every byte must belong to it.
pub fn decode_batch(bytes: &[u8]) -> Result<Vec<Record>, DecodeError> {
    let mut r = Reader(bytes);
    let count = r.u32()?;
    if count > MAX_BATCH_RECORDS {
        return Err(bad(format!(
            "{count} records in a batch, above the limit of {MAX_BATCH_RECORDS}"
        )));
    }
    let mut records = Vec::new();
    for _ in 0..count {
        let len = usize::try_from(r.u32()?).unwrap_or(usize::MAX);
        let Some((one, rest)) = r.0.split_at_checked(len) else {
            return Err(bad("truncated batch"));
        };
        records.push(Record::decode(one)?);
        r.0 = rest;
    }
    if !r.0.is_empty() {
        return Err(bad(format!("{} bytes after the batch", r.0.len())));
    }
    Ok(records)
}

pub(super) struct Writer(pub(super) Vec<u8>);

impl Writer {
    pub(super) fn head(&mut self, kind: u8) {
        self.u8(kind);
        self.u8(VERSION);
    }
    pub(super) fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    pub(super) fn u16(&mut self, v: u16) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    pub(super) fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    pub(super) fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    pub(super) fn i32(&mut self, v: i32) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    pub(super) fn i64(&mut self, v: i64) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    pub(super) fn uuid(&mut self, v: uuid::Uuid) {
        self.0.extend_from_slice(v.as_bytes());
    }
    pub(super) fn node(&mut self, v: NodeId) {
        self.i32(v.0);
    }
    pub(super) fn leader(&mut self, v: Option<NodeId>) {
        self.i32(v.map_or(-1, |n| n.0));
    }
    /// Counts are bounded by the producers of records (asserted here: a bug otherwise).
    pub(super) fn count(&mut self, n: usize) {
        let n = u16::try_from(n);
        assert!(n.is_ok(), "metadata record list too long");
        self.u16(n.unwrap_or(u16::MAX));
    }
    pub(super) fn str(&mut self, s: &str) {
        assert!(s.len() <= MAX_STRING_BYTES, "metadata record string too long");
        self.count(s.len());
        self.0.extend_from_slice(s.as_bytes());
    }
    pub(super) fn opt_str(&mut self, s: Option<&str>) {
        match s {
            None => self.u8(0),
            Some(s) => {
                self.u8(1);
                self.str(s);
            }
        }
    }
    pub(super) fn endpoints(&mut self, endpoints: &[Endpoint]) {
        self.count(endpoints.len());
        for e in endpoints {
            self.str(&e.listener);
            self.str(&e.host);
            self.u16(e.port);
        }
    }
    pub(super) fn replicas(&mut self, replicas: &[Replica]) {
        self.count(replicas.len());
        for r in replicas {
            self.node(r.broker);
            self.u16(r.shard.0);
        }
    }
    pub(super) fn nodes(&mut self, nodes: &[NodeId]) {
        self.count(nodes.len());
        for n in nodes {
            self.node(*n);
        }
    }
}

pub(super) struct Reader<'a>(pub(super) &'a [u8]);

impl Reader<'_> {
    pub(super) fn take<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let Some((head, rest)) = self.0.split_first_chunk::<N>() else {
            return Err(bad("truncated"));
        };
        self.0 = rest;
        Ok(*head)
    }
    pub(super) fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take::<1>()?[0])
    }
    pub(super) fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_be_bytes(self.take()?))
    }
    pub(super) fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_be_bytes(self.take()?))
    }
    pub(super) fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_be_bytes(self.take()?))
    }
    pub(super) fn i32(&mut self) -> Result<i32, DecodeError> {
        Ok(i32::from_be_bytes(self.take()?))
    }
    pub(super) fn i64(&mut self) -> Result<i64, DecodeError> {
        Ok(i64::from_be_bytes(self.take()?))
    }
    pub(super) fn uuid(&mut self) -> Result<uuid::Uuid, DecodeError> {
        Ok(uuid::Uuid::from_bytes(self.take()?))
    }
    pub(super) fn node(&mut self) -> Result<NodeId, DecodeError> {
        let n = self.i32()?;
        if n < 0 {
            return Err(bad(format!("broker id {n}")));
        }
        Ok(NodeId(n))
    }
    pub(super) fn leader(&mut self) -> Result<Option<NodeId>, DecodeError> {
        match self.i32()? {
            -1 => Ok(None),
            n if n >= 0 => Ok(Some(NodeId(n))),
            n => Err(bad(format!("leader {n}"))),
        }
    }
    pub(super) fn count(&mut self, max: usize, what: &str) -> Result<usize, DecodeError> {
        let n = usize::from(self.u16()?);
        if n > max {
            return Err(bad(format!("{n} {what}, above the limit of {max}")));
        }
        Ok(n)
    }
    pub(super) fn str(&mut self) -> Result<String, DecodeError> {
        let n = self.count(MAX_STRING_BYTES, "string bytes")?;
        let Some((s, rest)) = self.0.split_at_checked(n) else {
            return Err(bad("truncated string"));
        };
        self.0 = rest;
        String::from_utf8(s.to_vec()).map_err(|_| bad("string is not UTF-8"))
    }
    pub(super) fn opt_str(&mut self) -> Result<Option<String>, DecodeError> {
        match self.u8()? {
            0 => Ok(None),
            1 => Ok(Some(self.str()?)),
            other => Err(bad(format!("optional string flag {other}"))),
        }
    }
    pub(super) fn endpoint(&mut self) -> Result<Endpoint, DecodeError> {
        Ok(Endpoint {
            listener: self.str()?,
            host: self.str()?,
            port: self.u16()?,
        })
    }
    pub(super) fn replicas(&mut self) -> Result<Vec<Replica>, DecodeError> {
        let n = self.count(MAX_REPLICAS, "replicas")?;
        let mut replicas = Vec::with_capacity(n);
        for _ in 0..n {
            replicas.push(Replica {
                broker: self.node()?,
                shard: ShardId(self.u16()?),
            });
        }
        Ok(replicas)
    }
    pub(super) fn nodes(&mut self) -> Result<Vec<NodeId>, DecodeError> {
        let n = self.count(MAX_REPLICAS, "brokers")?;
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            v.push(self.node()?);
        }
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples() -> Vec<Record> {
        let t = TopicId(uuid::Uuid::from_bytes([7; 16]));
        vec![
            Record::RegisterBroker(RegisterBroker {
                broker: NodeId(2),
                incarnation: IncarnationId(uuid::Uuid::from_bytes([1; 16])),
                epoch: BrokerEpoch(17),
                endpoints: vec![Endpoint {
                    listener: "PLAINTEXT".into(),
                    host: "broker-2".into(),
                    port: 19092,
                }],
                rack: Some("eu-1a".into()),
                shards: 4,
            }),
            Record::BrokerFenced {
                broker: NodeId(2),
                epoch: BrokerEpoch(17),
            },
            Record::BrokerUnfenced {
                broker: NodeId(2),
                epoch: BrokerEpoch(17),
            },
            Record::BrokerShutdown {
                broker: NodeId(2),
                epoch: BrokerEpoch(17),
            },
            Record::Topic {
                name: "orders".into(),
                id: t,
            },
            Record::Partition(PartitionRecord {
                topic: t,
                partition: PartitionId(3),
                replicas: vec![
                    Replica {
                        broker: NodeId(1),
                        shard: ShardId(0),
                    },
                    Replica {
                        broker: NodeId(2),
                        shard: ShardId(3),
                    },
                ],
                isr: vec![NodeId(1), NodeId(2)],
                leader: Some(NodeId(1)),
                leader_epoch: LeaderEpoch(0),
                partition_epoch: PartitionEpoch(0),
            }),
            Record::PartitionChange(PartitionChange {
                topic: t,
                partition: PartitionId(3),
                leader: None,
                isr: vec![NodeId(1)],
                leader_epoch: LeaderEpoch(5),
                partition_epoch: PartitionEpoch(9),
                shards: Some(vec![ShardId(1), ShardId(0)]),
            }),
            Record::Config(ConfigRecord {
                resource: ConfigResource::Group("g".into()),
                entries: vec![("a".into(), Some("1".into())), ("b".into(), None)],
            }),
            Record::RemoveTopic { id: t },
            Record::ProducerIds {
                broker: NodeId(2),
                broker_epoch: BrokerEpoch(17),
                next_producer_id: 2000,
            },
        ]
    }

    #[test]
    fn every_record_round_trips() {
        for r in samples() {
            let bytes = r.encode();
            assert_eq!(Record::decode(&bytes).unwrap(), r, "{r:?}");
        }
    }

    #[test]
    fn truncated_or_padded_bytes_are_refused_without_panic() {
        for r in samples() {
            let bytes = r.encode();
            for cut in 0..bytes.len() {
                assert!(Record::decode(&bytes[..cut]).is_err(), "{r:?} cut at {cut}");
            }
            let mut long = bytes.clone();
            long.push(0);
            assert!(Record::decode(&long).is_err());
        }
    }

    #[test]
    fn unknown_type_version_and_oversized_counts_are_refused() {
        assert!(Record::decode(&[99, 0]).is_err());
        let mut bytes = samples()[0].encode();
        bytes[1] = 1;
        assert!(Record::decode(&bytes).unwrap_err().0.contains("version"));
        // A partition record claiming 65 replicas.
        let mut p = vec![tag::PARTITION, 0];
        p.extend_from_slice(&[0; 16]);
        p.extend_from_slice(&0i32.to_be_bytes());
        p.extend_from_slice(&65u16.to_be_bytes());
        assert!(Record::decode(&p).unwrap_err().0.contains("limit"));
        // A negative leader other than -1.
        let mut c = Record::PartitionChange(PartitionChange {
            topic: TopicId::ZERO,
            partition: PartitionId(0),
            leader: None,
            isr: vec![],
            leader_epoch: LeaderEpoch(0),
            partition_epoch: PartitionEpoch(0),
            shards: None,
        })
        .encode();
        c[2 + 16 + 4..2 + 16 + 8].copy_from_slice(&(-2i32).to_be_bytes());
        assert!(Record::decode(&c).is_err());
    }

    #[test]
    fn batches_round_trip_and_refuse_bad_bytes() {
        let records = samples();
        let bytes = encode_batch(&records);
        assert_eq!(decode_batch(&bytes).unwrap(), records);
        assert_eq!(decode_batch(&encode_batch(&[])).unwrap(), vec![]);
        for cut in 0..bytes.len() {
            assert!(decode_batch(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut long = bytes.clone();
        long.push(0);
        assert!(decode_batch(&long).is_err());
        assert!(decode_batch(&u32::MAX.to_be_bytes())
            .unwrap_err()
            .0
            .contains("limit"));
        // A record length that runs past the end.
        let mut b = 1u32.to_be_bytes().to_vec();
        b.extend_from_slice(&1000u32.to_be_bytes());
        b.extend_from_slice(&[5, 0]);
        assert!(decode_batch(&b).is_err());
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let len = (x % 48) as usize;
            let mut bytes: Vec<u8> = (0..len).map(|i| (x >> (i % 8 * 8)) as u8).collect();
            if let Some(b) = bytes.get_mut(0) {
                *b = (*b % 11).max(1);
            }
            if let Some(b) = bytes.get_mut(1) {
                *b = 0;
            }
            let _ = Record::decode(&bytes);
        }
    }
}
