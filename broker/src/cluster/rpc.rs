//! The controller RPCs: what brokers ask the active controller, and its answers, as the bodies
//! of the node-to-node transport's opaque control messages (`Message::Control`, a type and
//! bytes; `Message::ControlReply`). The raft crate carries them without knowing them.
//!
//! Requests, one per control type ([`ControlRequest`]): broker registration, broker heartbeat,
//! the topic administration decisions (create topic, delete topic, create partitions, alter
//! configs), AlterPartition (a partition leader reports its ISR), LeaderElected (a partition
//! group's election), AllocateProducerIds, a metadata fetch (the committed state after an offset) and a
//! description of the quorum (DescribeQuorum). Every answer ([`ControlReply`]) may instead be
//! `NotController` with the leader the answering controller knows of: the caller retries there
//! ([`super::node::ControlClient`]).
//!
//! Encoding: big-endian, as the metadata records (`record.rs`), whose field encoders it reuses.
//! Decoding never panics and bounds every count by its limit and by the bytes left before
//! allocating: the bytes come from other nodes.

#![cfg_attr(not(test), deny(clippy::indexing_slicing))]

use kafka_protocol::ResponseError;
use strand_protocol::types::{LeaderEpoch, NodeId, PartitionId, TopicId};

use super::control::{
    AlterPartition, AlterPartitionReply, BrokerRegistrationRequest, CreateTopic, Heartbeat, HeartbeatReply,
    IsrMember, LeaderElected, ProducerIdBlock,
};
use super::quorum::{QuorumView, ReplicaProgress};
use super::record::{
    bad, decode_batch, encode_batch, BrokerEpoch, ConfigResource, DecodeError, IncarnationId, MetadataOffset,
    PartitionEpoch, Reader, Record, Writer, MAX_CONFIG_ENTRIES, MAX_ENDPOINTS,
};
use crate::metadata::AdminError;

/// The most partitions one request names (manual assignments), as the broker's own limit.
pub const MAX_RPC_PARTITIONS: usize = 1 << 20;
/// The most bytes of records or snapshot one metadata fetch answer carries (a snapshot larger
/// than this cannot be fetched; the frame bound is 16 MiB).
pub const MAX_FETCH_BYTES: usize = 8 << 20;

/// A request to the active controller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ControlRequest {
    RegisterBroker(BrokerRegistrationRequest),
    Heartbeat(Heartbeat),
    CreateTopic(CreateTopic),
    DeleteTopic {
        name: String,
    },
    CreatePartitions {
        name: String,
        count: i32,
        assignments: Option<Vec<Vec<NodeId>>>,
    },
    AlterConfigs {
        resource: ConfigResource,
        entries: Vec<(String, Option<String>)>,
    },
    AlterPartition(AlterPartition),
    /// A partition group elected this broker (answered as AlterPartition is).
    LeaderElected(LeaderElected),
    /// The next block of producer ids for this broker (KIP-730).
    AllocateProducerIds {
        broker: NodeId,
        broker_epoch: BrokerEpoch,
    },
    /// The committed metadata from `from` on (the requester's next offset).
    FetchMetadata {
        from: MetadataOffset,
    },
    /// The quorum's leader, epoch, high watermark and voters' progress (DescribeQuorum).
    DescribeQuorum,
}

/// What the controller answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ControlReply {
    /// The answering node is not the active controller; `leader` is the one it knows of.
    NotController {
        leader: Option<NodeId>,
    },
    /// The decision refused the request (a Kafka error code and message for the client).
    Refused {
        code: i16,
        message: String,
    },
    /// The request failed for a reason that is not the client's (the quorum did not commit).
    Failed {
        message: String,
    },
    Registered {
        epoch: BrokerEpoch,
    },
    Heartbeat(HeartbeatReply),
    /// A decision without a value committed.
    Done,
    AlterPartition(AlterPartitionReply),
    /// The records from `base` on (possibly none: the requester is up to date).
    Records {
        base: MetadataOffset,
        records: Vec<Record>,
    },
    /// The whole state (`ClusterState::to_snapshot`): the requester is too far behind.
    Snapshot(Vec<u8>),
    /// A block of producer ids.
    ProducerIds(ProducerIdBlock),
    /// The quorum as its leader sees it.
    Quorum(QuorumView),
}

impl ControlReply {
    /// The reply for a refused decision.
    pub fn refused(e: &AdminError) -> ControlReply {
        ControlReply::Refused {
            code: e.code.code(),
            message: e.message.clone(),
        }
    }

    /// A refusal as the broker's error type (an unknown code becomes UNKNOWN_SERVER_ERROR).
    pub fn admin_error(code: i16, message: &str) -> AdminError {
        AdminError::new(
            ResponseError::try_from_code(code).unwrap_or(ResponseError::UnknownServerError),
            message,
        )
    }
}

mod kind {
    pub(super) const REGISTER: u16 = 1;
    pub(super) const HEARTBEAT: u16 = 2;
    pub(super) const CREATE_TOPIC: u16 = 3;
    pub(super) const DELETE_TOPIC: u16 = 4;
    pub(super) const CREATE_PARTITIONS: u16 = 5;
    pub(super) const ALTER_CONFIGS: u16 = 6;
    pub(super) const ALTER_PARTITION: u16 = 7;
    pub(super) const FETCH_METADATA: u16 = 8;
    pub(super) const LEADER_ELECTED: u16 = 9;
    pub(super) const ALLOCATE_PRODUCER_IDS: u16 = 10;
    pub(super) const DESCRIBE_QUORUM: u16 = 11;
}

/// The most voters a quorum description lists (the voters are configured, a handful).
const MAX_VOTERS: usize = 1024;

fn w_big_count(w: &mut Writer, n: usize) {
    let n = u32::try_from(n);
    assert!(n.is_ok(), "control message list too long");
    w.u32(n.unwrap_or(u32::MAX));
}

/// A count of items at least `min_bytes` each, bounded by `max` and by the bytes left.
fn r_big_count(r: &mut Reader<'_>, max: usize, min_bytes: usize, what: &str) -> Result<usize, DecodeError> {
    let n = r.u32()? as usize;
    if n > max || n.saturating_mul(min_bytes.max(1)) > r.0.len() {
        return Err(bad(format!("{n} {what}, above the limit or the bytes left")));
    }
    Ok(n)
}

fn w_bytes(w: &mut Writer, b: &[u8]) {
    w_big_count(w, b.len());
    w.0.extend_from_slice(b);
}

fn r_bytes(r: &mut Reader<'_>, max: usize, what: &str) -> Result<Vec<u8>, DecodeError> {
    let n = r_big_count(r, max, 1, what)?;
    let Some((b, rest)) = r.0.split_at_checked(n) else {
        return Err(bad(format!("truncated {what}")));
    };
    r.0 = rest;
    Ok(b.to_vec())
}

fn w_bool(w: &mut Writer, b: bool) {
    w.u8(u8::from(b));
}

fn r_bool(r: &mut Reader<'_>) -> Result<bool, DecodeError> {
    match r.u8()? {
        0 => Ok(false),
        1 => Ok(true),
        n => Err(bad(format!("bool {n}"))),
    }
}

fn w_resource(w: &mut Writer, resource: &ConfigResource) {
    let (tag, name) = match resource {
        ConfigResource::Topic(n) => (0, n),
        ConfigResource::Group(n) => (1, n),
        ConfigResource::Queue(n) => (2, n),
    };
    w.u8(tag);
    w.str(name);
}

fn r_resource(r: &mut Reader<'_>) -> Result<ConfigResource, DecodeError> {
    let tag = r.u8()?;
    let name = r.str()?;
    match tag {
        0 => Ok(ConfigResource::Topic(name)),
        1 => Ok(ConfigResource::Group(name)),
        2 => Ok(ConfigResource::Queue(name)),
        n => Err(bad(format!("config resource type {n}"))),
    }
}

impl ControlRequest {
    /// The control type and body.
    pub fn encode(&self) -> (u16, Vec<u8>) {
        let mut w = Writer(Vec::new());
        let kind = match self {
            ControlRequest::RegisterBroker(r) => {
                w.node(r.broker);
                w.uuid(r.incarnation.0);
                w.endpoints(&r.endpoints);
                w.opt_str(r.rack.as_deref());
                w.u16(r.shards);
                kind::REGISTER
            }
            ControlRequest::Heartbeat(h) => {
                w.node(h.broker);
                w.i64(h.epoch.0);
                w.u64(h.metadata_offset.0);
                w_bool(&mut w, h.want_fence);
                w_bool(&mut w, h.want_shutdown);
                kind::HEARTBEAT
            }
            ControlRequest::CreateTopic(t) => {
                w.str(&t.name);
                w.uuid(t.id.0);
                w.i32(t.partitions);
                w.u16(t.replication_factor as u16);
                w_big_count(&mut w, t.assignments.len());
                for (p, nodes) in &t.assignments {
                    w.i32(*p);
                    w.nodes(nodes);
                }
                w_big_count(&mut w, t.configs.len());
                for (k, v) in &t.configs {
                    w.str(k);
                    w.str(v);
                }
                kind::CREATE_TOPIC
            }
            ControlRequest::DeleteTopic { name } => {
                w.str(name);
                kind::DELETE_TOPIC
            }
            ControlRequest::CreatePartitions {
                name,
                count,
                assignments,
            } => {
                w.str(name);
                w.i32(*count);
                match assignments {
                    None => w.u8(0),
                    Some(a) => {
                        w.u8(1);
                        w_big_count(&mut w, a.len());
                        for nodes in a {
                            w.nodes(nodes);
                        }
                    }
                }
                kind::CREATE_PARTITIONS
            }
            ControlRequest::AlterConfigs { resource, entries } => {
                w_resource(&mut w, resource);
                w_big_count(&mut w, entries.len());
                for (k, v) in entries {
                    w.str(k);
                    w.opt_str(v.as_deref());
                }
                kind::ALTER_CONFIGS
            }
            ControlRequest::AlterPartition(a) => {
                w.node(a.broker);
                w.i64(a.broker_epoch.0);
                w.uuid(a.topic.0);
                w.i32(a.partition.0);
                w.i32(a.leader_epoch.0);
                w.i32(a.partition_epoch.0);
                w.count(a.new_isr.len());
                for m in &a.new_isr {
                    w.node(m.broker);
                    w.i64(m.epoch.map_or(-1, |e| e.0));
                }
                kind::ALTER_PARTITION
            }
            ControlRequest::LeaderElected(e) => {
                w.node(e.broker);
                w.i64(e.broker_epoch.0);
                w.uuid(e.topic.0);
                w.i32(e.partition.0);
                w.i32(e.leader_epoch.0);
                kind::LEADER_ELECTED
            }
            ControlRequest::AllocateProducerIds { broker, broker_epoch } => {
                w.node(*broker);
                w.i64(broker_epoch.0);
                kind::ALLOCATE_PRODUCER_IDS
            }
            ControlRequest::FetchMetadata { from } => {
                w.u64(from.0);
                kind::FETCH_METADATA
            }
            ControlRequest::DescribeQuorum => kind::DESCRIBE_QUORUM,
        };
        (kind, w.0)
    }

    /// Decodes a request of control type `kind`.
    pub fn decode(kind: u16, body: &[u8]) -> Result<ControlRequest, DecodeError> {
        let mut r = Reader(body);
        let req = match kind {
            kind::REGISTER => ControlRequest::RegisterBroker(BrokerRegistrationRequest {
                broker: r.node()?,
                incarnation: IncarnationId(r.uuid()?),
                endpoints: {
                    let n = r.count(MAX_ENDPOINTS, "endpoints")?;
                    let mut v = Vec::with_capacity(n);
                    for _ in 0..n {
                        v.push(r.endpoint()?);
                    }
                    v
                },
                rack: r.opt_str()?,
                shards: r.u16()?,
            }),
            kind::HEARTBEAT => ControlRequest::Heartbeat(Heartbeat {
                broker: r.node()?,
                epoch: BrokerEpoch(r.i64()?),
                metadata_offset: MetadataOffset(r.u64()?),
                want_fence: r_bool(&mut r)?,
                want_shutdown: r_bool(&mut r)?,
            }),
            kind::CREATE_TOPIC => {
                let name = r.str()?;
                let id = TopicId(r.uuid()?);
                let partitions = r.i32()?;
                let replication_factor = r.u16()? as i16;
                let n = r_big_count(&mut r, MAX_RPC_PARTITIONS, 6, "assignments")?;
                let mut assignments = Vec::with_capacity(n);
                for _ in 0..n {
                    assignments.push((r.i32()?, r.nodes()?));
                }
                let n = r_big_count(&mut r, MAX_CONFIG_ENTRIES, 4, "configs")?;
                let mut configs = Vec::with_capacity(n);
                for _ in 0..n {
                    configs.push((r.str()?, r.str()?));
                }
                ControlRequest::CreateTopic(CreateTopic {
                    name,
                    id,
                    partitions,
                    replication_factor,
                    assignments,
                    configs,
                })
            }
            kind::DELETE_TOPIC => ControlRequest::DeleteTopic { name: r.str()? },
            kind::CREATE_PARTITIONS => {
                let name = r.str()?;
                let count = r.i32()?;
                let assignments = match r.u8()? {
                    0 => None,
                    1 => {
                        let n = r_big_count(&mut r, MAX_RPC_PARTITIONS, 2, "assignments")?;
                        let mut a = Vec::with_capacity(n);
                        for _ in 0..n {
                            a.push(r.nodes()?);
                        }
                        Some(a)
                    }
                    n => return Err(bad(format!("assignments flag {n}"))),
                };
                ControlRequest::CreatePartitions {
                    name,
                    count,
                    assignments,
                }
            }
            kind::ALTER_CONFIGS => {
                let resource = r_resource(&mut r)?;
                let n = r_big_count(&mut r, MAX_CONFIG_ENTRIES, 3, "configs")?;
                let mut entries = Vec::with_capacity(n);
                for _ in 0..n {
                    entries.push((r.str()?, r.opt_str()?));
                }
                ControlRequest::AlterConfigs { resource, entries }
            }
            kind::ALTER_PARTITION => {
                let broker = r.node()?;
                let broker_epoch = BrokerEpoch(r.i64()?);
                let topic = TopicId(r.uuid()?);
                let partition = PartitionId(r.i32()?);
                let leader_epoch = LeaderEpoch(r.i32()?);
                let partition_epoch = PartitionEpoch(r.i32()?);
                let n = r.count(super::record::MAX_REPLICAS, "ISR members")?;
                let mut new_isr = Vec::with_capacity(n);
                for _ in 0..n {
                    let broker = r.node()?;
                    let epoch = match r.i64()? {
                        -1 => None,
                        e if e >= 0 => Some(BrokerEpoch(e)),
                        e => return Err(bad(format!("broker epoch {e}"))),
                    };
                    new_isr.push(IsrMember { broker, epoch });
                }
                ControlRequest::AlterPartition(AlterPartition {
                    broker,
                    broker_epoch,
                    topic,
                    partition,
                    leader_epoch,
                    partition_epoch,
                    new_isr,
                })
            }
            kind::LEADER_ELECTED => ControlRequest::LeaderElected(LeaderElected {
                broker: r.node()?,
                broker_epoch: BrokerEpoch(r.i64()?),
                topic: TopicId(r.uuid()?),
                partition: PartitionId(r.i32()?),
                leader_epoch: LeaderEpoch(r.i32()?),
            }),
            kind::ALLOCATE_PRODUCER_IDS => ControlRequest::AllocateProducerIds {
                broker: r.node()?,
                broker_epoch: BrokerEpoch(r.i64()?),
            },
            kind::FETCH_METADATA => ControlRequest::FetchMetadata {
                from: MetadataOffset(r.u64()?),
            },
            kind::DESCRIBE_QUORUM => ControlRequest::DescribeQuorum,
            k => return Err(bad(format!("control request type {k}"))),
        };
        if !r.0.is_empty() {
            return Err(bad(format!("{} bytes after a control request", r.0.len())));
        }
        Ok(req)
    }
}

impl ControlReply {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer(Vec::new());
        match self {
            ControlReply::NotController { leader } => {
                w.u8(0);
                w.leader(*leader);
            }
            ControlReply::Refused { code, message } => {
                w.u8(1);
                w.u16(*code as u16);
                w.str(message);
            }
            ControlReply::Failed { message } => {
                w.u8(2);
                w.str(message);
            }
            ControlReply::Registered { epoch } => {
                w.u8(3);
                w.i64(epoch.0);
            }
            ControlReply::Heartbeat(h) => {
                w.u8(4);
                w_bool(&mut w, h.is_caught_up);
                w_bool(&mut w, h.is_fenced);
                w_bool(&mut w, h.should_shut_down);
            }
            ControlReply::Done => w.u8(5),
            ControlReply::AlterPartition(a) => {
                w.u8(6);
                w.leader(a.leader);
                w.nodes(&a.isr);
                w.i32(a.leader_epoch.0);
                w.i32(a.partition_epoch.0);
            }
            ControlReply::Records { base, records } => {
                w.u8(7);
                w.u64(base.0);
                w_bytes(&mut w, &encode_batch(records));
            }
            ControlReply::Snapshot(bytes) => {
                w.u8(8);
                w_bytes(&mut w, bytes);
            }
            ControlReply::ProducerIds(b) => {
                w.u8(9);
                w.i64(b.first);
                w.i64(b.len);
            }
            ControlReply::Quorum(q) => {
                w.u8(10);
                w.node(q.leader);
                w.u64(q.term);
                w.i64(q.high_watermark);
                w_big_count(&mut w, q.voters.len());
                for v in &q.voters {
                    w.node(v.id);
                    w.i64(v.log_end_offset);
                    w.i64(v.last_fetch_ms);
                    w.i64(v.last_caught_up_ms);
                }
            }
        }
        w.0
    }

    pub fn decode(body: &[u8]) -> Result<ControlReply, DecodeError> {
        let mut r = Reader(body);
        let reply = match r.u8()? {
            0 => ControlReply::NotController { leader: r.leader()? },
            1 => ControlReply::Refused {
                code: r.u16()? as i16,
                message: r.str()?,
            },
            2 => ControlReply::Failed { message: r.str()? },
            3 => ControlReply::Registered {
                epoch: BrokerEpoch(r.i64()?),
            },
            4 => ControlReply::Heartbeat(HeartbeatReply {
                is_caught_up: r_bool(&mut r)?,
                is_fenced: r_bool(&mut r)?,
                should_shut_down: r_bool(&mut r)?,
            }),
            5 => ControlReply::Done,
            6 => ControlReply::AlterPartition(AlterPartitionReply {
                leader: r.leader()?,
                isr: r.nodes()?,
                leader_epoch: LeaderEpoch(r.i32()?),
                partition_epoch: PartitionEpoch(r.i32()?),
            }),
            7 => {
                let base = MetadataOffset(r.u64()?);
                let bytes = r_bytes(&mut r, MAX_FETCH_BYTES, "records")?;
                ControlReply::Records {
                    base,
                    records: decode_batch(&bytes)?,
                }
            }
            8 => ControlReply::Snapshot(r_bytes(&mut r, MAX_FETCH_BYTES, "snapshot")?),
            9 => {
                let first = r.i64()?;
                let len = r.i64()?;
                if first < 0 || len <= 0 || first.checked_add(len).is_none() {
                    return Err(bad(format!("producer id block {first} + {len}")));
                }
                ControlReply::ProducerIds(ProducerIdBlock { first, len })
            }
            10 => {
                let leader = r.node()?;
                let term = r.u64()?;
                let high_watermark = r.i64()?;
                let n = r_big_count(&mut r, MAX_VOTERS, 28, "voters")?;
                let mut voters = Vec::with_capacity(n);
                for _ in 0..n {
                    voters.push(ReplicaProgress {
                        id: r.node()?,
                        log_end_offset: r.i64()?,
                        last_fetch_ms: r.i64()?,
                        last_caught_up_ms: r.i64()?,
                    });
                }
                ControlReply::Quorum(QuorumView {
                    leader,
                    term,
                    high_watermark,
                    voters,
                })
            }
            k => return Err(bad(format!("control reply type {k}"))),
        };
        if !r.0.is_empty() {
            return Err(bad(format!("{} bytes after a control reply", r.0.len())));
        }
        Ok(reply)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use strand_protocol::types::ShardId;

    use super::*;
    use crate::cluster::record::{Endpoint, PartitionChange};

    fn samples() -> Vec<ControlRequest> {
        vec![
            ControlRequest::RegisterBroker(BrokerRegistrationRequest {
                broker: NodeId(3),
                incarnation: IncarnationId(uuid::Uuid::from_u128(9)),
                endpoints: vec![Endpoint {
                    listener: "PLAINTEXT".into(),
                    host: "broker-3".into(),
                    port: 9092,
                }],
                rack: Some("r1".into()),
                shards: 4,
            }),
            ControlRequest::Heartbeat(Heartbeat {
                broker: NodeId(1),
                epoch: BrokerEpoch(17),
                metadata_offset: MetadataOffset(40),
                want_fence: false,
                want_shutdown: true,
            }),
            ControlRequest::CreateTopic(CreateTopic {
                name: "orders".into(),
                id: TopicId(uuid::Uuid::from_u128(5)),
                partitions: -1,
                replication_factor: -1,
                assignments: vec![(0, vec![NodeId(1), NodeId(2)]), (1, vec![NodeId(2)])],
                configs: vec![("retention.ms".into(), "1000".into())],
            }),
            ControlRequest::DeleteTopic {
                name: "orders".into(),
            },
            ControlRequest::CreatePartitions {
                name: "orders".into(),
                count: 8,
                assignments: Some(vec![vec![NodeId(1)], vec![NodeId(2)]]),
            },
            ControlRequest::CreatePartitions {
                name: "orders".into(),
                count: 8,
                assignments: None,
            },
            ControlRequest::AlterConfigs {
                resource: ConfigResource::Group("g".into()),
                entries: vec![("a".into(), Some("1".into())), ("b".into(), None)],
            },
            ControlRequest::AlterPartition(AlterPartition {
                broker: NodeId(2),
                broker_epoch: BrokerEpoch(4),
                topic: TopicId(uuid::Uuid::from_u128(5)),
                partition: PartitionId(3),
                leader_epoch: LeaderEpoch(7),
                partition_epoch: PartitionEpoch(9),
                new_isr: vec![
                    IsrMember {
                        broker: NodeId(2),
                        epoch: Some(BrokerEpoch(4)),
                    },
                    IsrMember {
                        broker: NodeId(1),
                        epoch: None,
                    },
                ],
            }),
            ControlRequest::LeaderElected(LeaderElected {
                broker: NodeId(3),
                broker_epoch: BrokerEpoch(6),
                topic: TopicId(uuid::Uuid::from_u128(5)),
                partition: PartitionId(2),
                leader_epoch: LeaderEpoch(11),
            }),
            ControlRequest::AllocateProducerIds {
                broker: NodeId(2),
                broker_epoch: BrokerEpoch(7),
            },
            ControlRequest::FetchMetadata {
                from: MetadataOffset(12),
            },
            ControlRequest::DescribeQuorum,
        ]
    }

    fn reply_samples() -> Vec<ControlReply> {
        vec![
            ControlReply::NotController { leader: None },
            ControlReply::NotController {
                leader: Some(NodeId(2)),
            },
            ControlReply::Refused {
                code: ResponseError::TopicAlreadyExists.code(),
                message: "exists".into(),
            },
            ControlReply::Failed {
                message: "down".into(),
            },
            ControlReply::Registered {
                epoch: BrokerEpoch(8),
            },
            ControlReply::Heartbeat(HeartbeatReply {
                is_caught_up: true,
                is_fenced: false,
                should_shut_down: false,
            }),
            ControlReply::Done,
            ControlReply::ProducerIds(ProducerIdBlock {
                first: 3000,
                len: 1000,
            }),
            ControlReply::AlterPartition(AlterPartitionReply {
                leader: Some(NodeId(1)),
                isr: vec![NodeId(1), NodeId(3)],
                leader_epoch: LeaderEpoch(2),
                partition_epoch: PartitionEpoch(5),
            }),
            ControlReply::Records {
                base: MetadataOffset(3),
                records: vec![
                    Record::BrokerUnfenced {
                        broker: NodeId(1),
                        epoch: BrokerEpoch(0),
                    },
                    Record::PartitionChange(PartitionChange {
                        topic: TopicId(uuid::Uuid::from_u128(5)),
                        partition: PartitionId(0),
                        leader: Some(NodeId(1)),
                        isr: vec![NodeId(1)],
                        leader_epoch: LeaderEpoch(1),
                        partition_epoch: PartitionEpoch(1),
                        shards: Some(vec![ShardId(0)]),
                    }),
                ],
            },
            ControlReply::Records {
                base: MetadataOffset(3),
                records: vec![],
            },
            ControlReply::Snapshot(crate::cluster::ClusterState::default().to_snapshot()),
            ControlReply::Quorum(QuorumView {
                leader: NodeId(2),
                term: 7,
                high_watermark: 120,
                voters: vec![
                    ReplicaProgress {
                        id: NodeId(1),
                        log_end_offset: 118,
                        last_fetch_ms: 1_700_000_000_000,
                        last_caught_up_ms: -1,
                    },
                    ReplicaProgress {
                        id: NodeId(2),
                        log_end_offset: 120,
                        last_fetch_ms: 1_700_000_000_100,
                        last_caught_up_ms: 1_700_000_000_100,
                    },
                ],
            }),
        ]
    }

    #[test]
    fn every_request_and_reply_round_trips() {
        for req in samples() {
            let (kind, body) = req.encode();
            assert_eq!(ControlRequest::decode(kind, &body), Ok(req));
        }
        for reply in reply_samples() {
            assert_eq!(ControlReply::decode(&reply.encode()), Ok(reply));
        }
    }

    #[test]
    fn truncated_padded_or_mistyped_bodies_are_refused() {
        for req in samples() {
            let (kind, body) = req.encode();
            for cut in 0..body.len() {
                assert!(
                    ControlRequest::decode(kind, &body[..cut]).is_err(),
                    "{req:?} cut at {cut}"
                );
            }
            let mut padded = body.clone();
            padded.push(0);
            assert!(ControlRequest::decode(kind, &padded).is_err());
        }
        assert!(ControlRequest::decode(0, &[]).is_err());
        assert!(ControlRequest::decode(99, &[]).is_err());
        for reply in reply_samples() {
            let body = reply.encode();
            for cut in 0..body.len() {
                assert!(
                    ControlReply::decode(&body[..cut]).is_err(),
                    "{reply:?} cut at {cut}"
                );
            }
        }
        assert!(ControlReply::decode(&[9]).is_err());
    }

    #[test]
    fn a_count_beyond_the_bytes_is_refused_before_allocating() {
        // A create-topic announcing four billion assignments in a few bytes.
        let mut w = Writer(Vec::new());
        w.str("t");
        w.uuid(uuid::Uuid::nil());
        w.i32(1);
        w.u16(1);
        w.u32(u32::MAX);
        let e = ControlRequest::decode(kind::CREATE_TOPIC, &w.0).unwrap_err();
        assert!(e.0.contains("assignments"), "{e}");
        // A snapshot reply announcing more than the fetch bound.
        let mut w = Writer(Vec::new());
        w.u8(8);
        w.u32(u32::try_from(MAX_FETCH_BYTES + 1).unwrap());
        assert!(ControlReply::decode(&w.0).is_err());
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(kind in 0u16..12, bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = ControlRequest::decode(kind, &bytes);
            let _ = ControlReply::decode(&bytes);
        }

        #[test]
        fn corrupted_requests_never_panic(
            which in 0usize..9,
            flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        ) {
            let req = samples().swap_remove(which);
            let (kind, mut body) = req.encode();
            for (i, b) in flips {
                let i = i.index(body.len());
                body[i] = b;
            }
            let _ = ControlRequest::decode(kind, &body);
        }
    }
}
