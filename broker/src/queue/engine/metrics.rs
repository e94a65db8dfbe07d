//! What the engine exposes for the caller to publish on `/metrics` (per queue partition; the
//! caller sums partitions per queue and group).

use strand_protocol::types::Offset;

/// Lease-to-ack latency samples kept between two [`take_latency_samples`] calls.
///
/// [`take_latency_samples`]: super::QueuePartition::take_latency_samples
pub(crate) const MAX_LATENCY_SAMPLES: usize = 4096;

/// Monotonic counters since this engine instance was built (Prometheus counters reset on
/// restart too).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Counters {
    /// Offsets first seen (publishes, redrives), counted once per instance.
    pub(crate) published: u64,
    /// Publishes answered with an earlier message's id.
    pub(crate) duplicates: u64,
    pub(crate) acked: u64,
    pub(crate) nacked: u64,
    pub(crate) rejected: u64,
    /// Failed attempts that will be retried (nacks, expiries, releases).
    pub(crate) retries: u64,
    pub(crate) lease_expiries: u64,
    /// Messages sent to the dead-letter topic or archived (max attempts or reject).
    pub(crate) dead_lettered: u64,
    /// Redriven copies found to duplicate a copy already in the queue (dropped).
    pub(crate) duplicate_redrives: u64,
    pub(crate) latency_samples_dropped: u64,
}

/// Gauges at one instant, plus the counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PartitionMetrics {
    /// Leasable now or waiting in the log beyond the window.
    pub(crate) available: u64,
    pub(crate) leased: u64,
    /// Waiting for a publish delay or a retry delay.
    pub(crate) delayed: u64,
    /// Waiting for the caller's dead-letter append.
    pub(crate) dead_letter_pending: u64,
    /// Age of the oldest message not yet acknowledged or dead-lettered, counted from when it
    /// became deliverable (publish time, or its delivery time for delayed publishes). `None` when
    /// nothing is pending in memory (messages beyond the window are younger).
    pub(crate) oldest_unacked_age_ms: Option<u64>,
    pub(crate) start: Offset,
    pub(crate) loaded_end: Offset,
    pub(crate) log_end: Offset,
    pub(crate) detached: u64,
    pub(crate) dedup_entries: u64,
    pub(crate) consumers: u64,
    pub(crate) counters: Counters,
}
