//! Kafka wire protocol pieces that Strand needs beyond the `kafka-protocol` codec:
//! request framing, raw header peeking, record-batch validation and patching,
//! record iteration for timestamp lookups, and the typed ids used across the workspace.
//!
//! Architecture invariant: this crate does no I/O. Everything here is a pure function
//! of its input bytes, which is what makes it fuzzable and property-testable.
//! Nothing here may panic on input bytes: every length is checked before use.
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]
#![cfg_attr(
    test,
    allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)
)]

pub mod acl;
pub mod batch;
pub mod fetch_frame;
pub mod frame;
pub mod header;
pub mod partitioner;
pub mod records;
pub mod types;

pub use kafka_protocol;
