//! The Strand broker: a Kafka-protocol-compatible broker, thread-per-core on glommio.
//!
//! Code map (see ARCHITECTURE.md), bottom up: [`config`], [`metadata`], metrics and the clock;
//! the shard core (`shard`: the partitions a shard owns, its store, the router between shards
//! and the registry subsystems plug into); the subsystems (controller, fetch sessions, consumer
//! groups, queues with their HTTP and Kafka share-group doors), assembled per shard by
//! `subsystems`; `handlers`, one module per Kafka API; `connection`, one Kafka connection; and
//! [`server`], which starts everything.
#![deny(clippy::unwrap_used, clippy::expect_used)]
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

mod admin;
mod clock;
pub mod cluster;
mod cluster_link;
pub mod config;
mod connection;
mod controller;
mod fetch_session;
mod group;
mod handlers;
mod internal_topics;
pub mod metadata;
mod metrics;
mod queue;
mod replication;
pub mod server;
mod shard;
mod subsystems;
#[cfg(test)]
mod testkit;
mod topic_admin;
