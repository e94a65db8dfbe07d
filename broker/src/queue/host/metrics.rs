//! The `/metrics` handles of the queue engines (their descriptions are registered with the
//! broker's others, in `crate::metrics::describe`).

use metrics::{counter, gauge, histogram, Counter, Gauge, Histogram};

use crate::queue::engine::{Counters, PartitionMetrics};

/// `/metrics` handles of one queue engine (queue, group, partition).
pub(crate) struct QueueMetrics {
    available: Gauge,
    leased: Gauge,
    delayed: Gauge,
    dead_letter_pending: Gauge,
    oldest_age: Gauge,
    published: Counter,
    duplicates: Counter,
    acked: Counter,
    retries: Counter,
    expiries: Counter,
    dead_lettered: Counter,
    lease_to_ack: Histogram,
    /// Counter values already added.
    last: Counters,
}

impl QueueMetrics {
    pub(crate) fn new(queue: &str, group: &str, partition: i32) -> Self {
        let part = [
            ("queue", queue.to_owned()),
            ("group", group.to_owned()),
            ("partition", partition.to_string()),
        ];
        let q = [("queue", queue.to_owned()), ("group", group.to_owned())];
        QueueMetrics {
            available: gauge!("strand_queue_available_messages", &part),
            leased: gauge!("strand_queue_leased_messages", &part),
            delayed: gauge!("strand_queue_delayed_messages", &part),
            dead_letter_pending: gauge!("strand_queue_dead_letter_pending_messages", &part),
            oldest_age: gauge!("strand_queue_oldest_unacked_age_seconds", &part),
            published: counter!("strand_queue_published_total", &q),
            duplicates: counter!("strand_queue_duplicates_total", &q),
            acked: counter!("strand_queue_acked_total", &q),
            retries: counter!("strand_queue_retries_total", &q),
            expiries: counter!("strand_queue_lease_expiries_total", &q),
            dead_lettered: counter!("strand_queue_dead_lettered_total", &q),
            lease_to_ack: histogram!("strand_queue_lease_to_ack_seconds", &q),
            last: Default::default(),
        }
    }

    /// Publishes gauges and the counters' growth since the last call.
    pub(crate) fn update(&mut self, m: &PartitionMetrics, lease_to_ack_ms: &[u64]) {
        self.available.set(m.available as f64);
        self.leased.set(m.leased as f64);
        self.delayed.set(m.delayed as f64);
        self.dead_letter_pending.set(m.dead_letter_pending as f64);
        self.oldest_age
            .set(m.oldest_unacked_age_ms.map_or(0.0, |ms| ms as f64 / 1000.0));
        let c = &m.counters;
        let l = &self.last;
        self.published.increment(c.published.saturating_sub(l.published));
        self.duplicates
            .increment(c.duplicates.saturating_sub(l.duplicates));
        self.acked.increment(c.acked.saturating_sub(l.acked));
        self.retries.increment(c.retries.saturating_sub(l.retries));
        self.expiries
            .increment(c.lease_expiries.saturating_sub(l.lease_expiries));
        self.dead_lettered
            .increment(c.dead_lettered.saturating_sub(l.dead_lettered));
        self.last = *c;
        for ms in lease_to_ack_ms {
            self.lease_to_ack.record(*ms as f64 / 1000.0);
        }
    }

    /// The engine is gone: its gauges read zero.
    pub(crate) fn zero(&self) {
        for g in [
            &self.available,
            &self.leased,
            &self.delayed,
            &self.dead_letter_pending,
            &self.oldest_age,
        ] {
            g.set(0.0);
        }
    }
}
