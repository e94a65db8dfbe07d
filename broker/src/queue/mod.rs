//! The queue subsystem: delivery state kept beside the log (leases, generations, retries, dead
//! letters, delays, dedup tokens), one engine per (topic, partition, group).
//!
//! - [`engine`]: [`engine::QueuePartition`], the sans-I/O state machine of one engine, and its
//!   seeded simulation. Its module documentation is the design.
//! - [`host`]: [`host::QueueHost`], which runs a shard's engines: their state logs, loading
//!   from the message log, payload reads, dead-letter appends, timers, retention floors. It is
//!   the shard's queue service: other shards reach its engines through [`host::QueueOp`]s.
//! - [`doors`]: the HTTP queue API and Kafka share groups, both onto the same engines.
//!
//! Layers point one way: doors → host → engine, and the host → the shard core.

pub(crate) mod doors;
pub(crate) mod engine;
pub(crate) mod host;
