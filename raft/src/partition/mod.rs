//! A Kafka partition as a Raft group: the partition's log is the Raft log.
//!
//! - [`types`]: the openraft type configuration (entries are Kafka record batches or side
//!   records kept beside the log, terms are leader epochs, standard one-leader-per-term log ids).
//! - [`entry_map`]: offset translation between Raft indexes and Kafka offsets.
//! - [`replica_log`]: what the group needs from the log underneath, and an in-memory log that
//!   loses unflushed writes on a simulated crash.
//! - [`side_state`]: the replica's Raft state beside its log (vote, snapshot record, purge
//!   point, install marker, internal entries), one small file written atomically.
//! - [`shard_log`]: the replica log over a shard store's partition log (the broker's), and
//!   [`side_log`] the log of its side records beside it.
//! - [`store`]: openraft's log storage and state machine over them.
//! - [`local_net`]: an in-process network between replicas, for simulations and tests.
//! - [`quiesce`]: idle groups stop their timers; node liveness stands in for their heartbeats.

pub mod entry_map;
pub mod local_net;
pub mod quiesce;
pub mod replica_log;
pub mod shard_log;
pub mod side_log;
pub mod side_state;
pub mod store;
pub mod types;

pub use entry_map::{Beside, EntryMap, PurgePoint, Slot};
pub use replica_log::{InternalEntry, MemReplicaLog, ReplicaLog, StoredBatch, StoredSide, StoredVote};
pub use side_log::SideLogSpec;
pub use store::{Applier, PartitionSnapshot, ReplicaStore};
pub use types::{Applied, BrokerId, EntryData, KafkaBatch, PartitionLogId, PartitionRaft, SideRecord};
