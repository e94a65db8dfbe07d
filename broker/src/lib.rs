//! The Strand broker: a Kafka-protocol-compatible broker, thread-per-core on glommio.
//!
//! Code map (see ARCHITECTURE.md): [`server`] starts everything; each shard ([`shard`]) owns a
//! set of partitions and their storage; [`connection`] reads requests and writes responses in
//! order; [`handlers`] has one module per Kafka API; [`router`] carries requests between shards;
//! [`controller`] applies topic administration; [`metadata`] is the topic state; [`config`] loads
//! Kafka-style configuration.
#![deny(clippy::unwrap_used, clippy::expect_used)]
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

mod admin;
mod clock;
pub mod config;
mod connection;
mod controller;
mod fetch_session;
mod group;
mod handlers;
pub mod metadata;
mod metrics;
mod queue;
pub mod server;
mod shard;
mod subsystems;
#[cfg(test)]
mod testkit;
