//! The cluster metadata that the controller quorum replicates, as a deterministic, sans-I/O
//! state machine modelled on Kafka's KRaft controller.
//!
//! - [`record`]: the records of the metadata log ([`Record`]) and their versioned encoding; the
//!   records of one controller decision form one Raft entry ([`encode_batch`]), committed
//!   together.
//! - [`state`]: [`ClusterState`], built by applying records in log order; the queries Metadata
//!   and DescribeCluster need (live brokers and their endpoints per listener; each partition's
//!   leader, leader epoch, replicas, ISR and offline replicas).
//! - [`snapshot`]: the state as bytes, for the quorum's Raft snapshots.
//! - [`control`]: the active controller's decisions, functions from the state, the soft
//!   liveness state and a `now_ms` to the records the quorum leader proposes: broker
//!   registration, heartbeats and fencing, topic creation with replica placement
//!   ([`placement`]), leaders as the partitions' Raft groups elect and report them (taken
//!   away on fencing and controlled shutdown), AlterPartition ISR changes, CreatePartitions,
//!   producer-id blocks.
//!
//! - [`quorum`]: the Raft group of the controllers that orders the records: the metadata log,
//!   stored as a Kafka partition log, and the active controller's decisions run on it.
//! - [`rpc`]: the controller RPCs' bodies (registration, heartbeat, topic decisions,
//!   AlterPartition, metadata fetch), carried as the transport's opaque control messages.
//! - [`node`]: a KRaft-configured node's cluster part on shard 0: the quorum over TCP, the
//!   controller RPCs' server and client, the broker's registration, heartbeats and metadata,
//!   and the active controller's timers. (`crate::cluster_link` carries it to the shards.)
//!
//! Apart from [`quorum`] and [`node`], no I/O, no clock, no randomness: time comes in as
//! `now_ms`, topic ids from the caller, and placement is a function of the state.

pub mod control;
pub mod node;
pub mod placement;
pub mod quorum;
pub mod record;
pub mod rpc;
pub mod snapshot;
pub mod state;

#[cfg(test)]
mod sim;
#[cfg(test)]
mod tests;

pub use control::{
    allocate_producer_ids, alter_configs, alter_partition, create_partitions, create_topic, delete_topic,
    fence_stale_brokers, heartbeat, leader_elected, register_broker, AlterPartition, AlterPartitionReply,
    BrokerRegistrationRequest, ControllerConfig, CreateTopic, Heartbeat, HeartbeatReply, IsrMember,
    LeaderElected, Liveness, ProducerIdBlock, DEFAULT_SESSION_TIMEOUT_MS, PRODUCER_ID_BLOCK_SIZE,
};
pub use record::{
    decode_batch, encode_batch, BrokerEpoch, ConfigRecord, ConfigResource, Endpoint, IncarnationId,
    MetadataOffset, PartitionChange, PartitionEpoch, PartitionRecord, Record, RegisterBroker, Replica,
};
pub use state::{
    BrokerRegistration, ClusterState, HostedReplica, PartitionRegistration, PartitionView, TopicState,
};
