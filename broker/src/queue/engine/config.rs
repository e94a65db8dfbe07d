//! Per-queue (per share group) settings of the engine, with their ranges.

use std::fmt;

/// Longest dedup token, in bytes.
pub(crate) const MAX_DEDUP_TOKEN_BYTES: usize = 128;
/// Longest consumer / member id, in bytes.
pub(crate) const MAX_CONSUMER_ID_BYTES: usize = 255;
/// Longest failure reason kept with a message, in bytes.
pub(crate) const MAX_REASON_BYTES: usize = 1024;
/// Reason recorded when a lease expires.
pub(crate) const REASON_LEASE_EXPIRED: &str = "lease expired";
/// Hard ceiling of any visibility timeout and of a lease's total lifetime (12 h, as SQS).
pub(crate) const MAX_VISIBILITY_MS: u64 = 12 * 3600 * 1000;
/// Hard ceiling of any delay (90 days).
pub(crate) const MAX_DELAY_MS: u64 = 90 * 24 * 3600 * 1000;
/// Hard ceiling of the dedup window (1 day).
pub(crate) const MAX_DEDUP_WINDOW_MS: u64 = 24 * 3600 * 1000;
/// Acknowledgements a partition remembers (per group) after their messages left the window, so
/// that a retried ack is answered `Acked` again: the most recent ones, kept across restarts.
pub(crate) const REMEMBERED_ACKS: usize = 1_000;

/// Whether a key's messages are delivered one at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ordering {
    /// First delivery in offset order per partition; retries may reorder; no key constraint.
    None,
    /// A message is not leased while another message with the same key in its partition is
    /// leased, waiting for retry or waiting for its dead-letter append, nor before every earlier
    /// message with its key is done (SQS FIFO message groups, Pulsar Key_Shared). Messages
    /// without a key are unconstrained.
    Key,
}

/// When a lease grant is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LeaseDurability {
    /// Leases are answered once their delivery record (generation, owner, expiry, attempt) is
    /// durable. A lease then survives a broker restart (its holder can still ack it) and
    /// attempt counts are exact: a poison message is delivered exactly `max_attempts` times.
    BeforeReply,
    /// Leases are answered at once; their records are written but nobody waits. After a crash
    /// an unrecorded lease is simply gone: its message is available again (never lost), the
    /// old holder is fenced (generations never repeat), and that one delivery may be
    /// uncounted. Saves one group-commit of latency per lease. No queue setting selects it
    /// yet; the unit tests and the simulation run it.
    #[cfg_attr(not(test), allow(dead_code))]
    Lazy,
}

/// What happens to a message that exhausted its attempts or was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DeadLetterMode {
    /// Emit [`Action::DeadLetter`](super::Action::DeadLetter); the message is done once the
    /// caller confirms the dead-letter append is durable.
    Topic,
    /// Archive at once (Kafka share groups without `errors.deadletterqueue.topic.name`).
    Archive,
}

/// Exponential retry backoff: `base_ms * multiplier^(attempts - 1)`, capped at `max_ms`.
/// `base_ms == 0` means "available again at once" (Kafka's RELEASE and lock timeout).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Backoff {
    pub(crate) base_ms: u64,
    pub(crate) multiplier: f64,
    pub(crate) max_ms: u64,
}

impl Backoff {
    /// Delay before the retry that follows failed attempt number `attempts` (1-based).
    pub(crate) fn delay_ms(&self, attempts: u32) -> u64 {
        if self.base_ms == 0 {
            return 0;
        }
        let exp = i32::try_from(attempts.saturating_sub(1)).unwrap_or(i32::MAX);
        let d = self.base_ms as f64 * self.multiplier.powi(exp);
        if d.is_finite() && d < self.max_ms as f64 {
            d as u64
        } else {
            self.max_ms
        }
    }
}

/// The settings. [`QueueConfig::default`] is the HTTP queue's default;
/// [`QueueConfig::share_group`] maps Kafka share-group configs.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct QueueConfig {
    /// Deliveries before a failing message is dead-lettered (SQS maxReceiveCount,
    /// `share.delivery.count.limit`). 1..=1000.
    pub(crate) max_attempts: u32,
    pub(crate) min_visibility_ms: u64,
    pub(crate) default_visibility_ms: u64,
    pub(crate) max_visibility_ms: u64,
    /// Longest a lease may be extended to, counted from its grant.
    pub(crate) max_lease_lifetime_ms: u64,
    pub(crate) backoff: Backoff,
    /// Whether an expired lease waits the backoff before the message is available again
    /// (`false`: at once, as Kafka's acquisition lock timeout).
    pub(crate) expiry_backoff: bool,
    pub(crate) ordering: Ordering,
    pub(crate) dead_letter: DeadLetterMode,
    pub(crate) lease_durability: LeaseDurability,
    /// Span of the in-flight window, from the start (done watermark, Kafka's SPSO) to the load
    /// frontier (SPEO + 1): `share.partition.max.record.locks`.
    pub(crate) max_window: u32,
    /// Leased messages in the partition at once.
    pub(crate) max_leased_per_partition: u32,
    /// Leased messages one consumer may hold in this partition at once.
    pub(crate) max_leased_per_consumer: u32,
    /// Messages in one lease request, and items in one settle request.
    pub(crate) max_lease_batch: u32,
    /// Longest publish delay or retry delay. 0 refuses delays.
    pub(crate) max_delay_ms: u64,
    /// Delayed messages kept outside the window (publish delays are refused beyond it; retry
    /// delays beyond it stay inside the window instead).
    pub(crate) max_delayed: u32,
    /// Whether a leased message leaves the window as a delayed one does (a *detached* record
    /// below the start, up to `max_leased_per_partition` of them besides the delayed ones), so
    /// that a long lease never holds back the messages behind it: a work queue's (as on SQS,
    /// one slow message does not stall the others). Not a share group's: KIP-932's start
    /// offset never passes a record in flight, and its window bounds what is acquired.
    pub(crate) detach_leases: bool,
    /// Dedup window; 0 turns dedup off (tokens are ignored).
    pub(crate) dedup_window_ms: u64,
    pub(crate) max_dedup_entries: u32,
    /// Largest message (payload + key + headers) the publish path accepts. The caller measures.
    pub(crate) max_message_bytes: u32,
    /// Granularity of the delay index.
    pub(crate) delay_bucket_ms: u64,
    /// Generations reserved per `Generation` record.
    pub(crate) generation_block: u64,
    /// Wait before re-emitting a dead-letter append the caller reported as failed.
    pub(crate) dead_letter_retry_ms: u64,
}

impl Default for QueueConfig {
    fn default() -> Self {
        QueueConfig {
            max_attempts: 5,
            min_visibility_ms: 1_000,
            default_visibility_ms: 30_000,
            max_visibility_ms: MAX_VISIBILITY_MS,
            max_lease_lifetime_ms: MAX_VISIBILITY_MS,
            backoff: Backoff {
                base_ms: 1_000,
                multiplier: 2.0,
                max_ms: 15 * 60 * 1000,
            },
            expiry_backoff: true,
            ordering: Ordering::None,
            dead_letter: DeadLetterMode::Topic,
            lease_durability: LeaseDurability::BeforeReply,
            max_window: 2_000,
            max_leased_per_partition: 2_000,
            max_leased_per_consumer: 1_000,
            max_lease_batch: 500,
            max_delay_ms: 24 * 3600 * 1000,
            max_delayed: 100_000,
            detach_leases: true,
            dedup_window_ms: 5 * 60 * 1000,
            max_dedup_entries: 100_000,
            max_message_bytes: 1024 * 1024,
            delay_bucket_ms: 1_000,
            generation_block: 4_096,
            dead_letter_retry_ms: 1_000,
        }
    }
}

/// The share-group configs that shape the engine (KIP-932 / KIP-1191 names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ShareGroupSettings {
    /// `share.delivery.count.limit` (Kafka: 2..=10, default 5).
    pub(crate) delivery_count_limit: u32,
    /// `share.record.lock.duration.ms` (Kafka default 30 s).
    pub(crate) record_lock_duration_ms: u64,
    /// `share.partition.max.record.locks` (Kafka default 2000).
    pub(crate) max_record_locks: u32,
    /// `errors.deadletterqueue.topic.name` is set.
    pub(crate) dead_letter_topic: bool,
}

impl QueueConfig {
    /// Kafka share-group semantics: RELEASE and lock timeout make a record available at once,
    /// no delays, no dedup, no key ordering, window = `share.partition.max.record.locks`.
    pub(crate) fn share_group(s: ShareGroupSettings) -> QueueConfig {
        QueueConfig {
            max_attempts: s.delivery_count_limit,
            min_visibility_ms: 1_000,
            default_visibility_ms: s.record_lock_duration_ms,
            max_visibility_ms: MAX_VISIBILITY_MS,
            backoff: Backoff {
                base_ms: 0,
                multiplier: 1.0,
                max_ms: 0,
            },
            expiry_backoff: false,
            ordering: Ordering::None,
            dead_letter: if s.dead_letter_topic {
                DeadLetterMode::Topic
            } else {
                DeadLetterMode::Archive
            },
            max_window: s.max_record_locks,
            max_leased_per_partition: s.max_record_locks,
            max_leased_per_consumer: s.max_record_locks,
            max_lease_batch: s.max_record_locks,
            max_delay_ms: 0,
            max_delayed: 0,
            detach_leases: false,
            dedup_window_ms: 0,
            ..QueueConfig::default()
        }
    }

    /// Checks every setting against its range.
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        fn check(ok: bool, what: &'static str) -> Result<(), ConfigError> {
            if ok {
                Ok(())
            } else {
                Err(ConfigError(what))
            }
        }
        check(
            (1..=1000).contains(&self.max_attempts),
            "max_attempts must be 1..=1000",
        )?;
        check(
            1 <= self.min_visibility_ms
                && self.min_visibility_ms <= self.default_visibility_ms
                && self.default_visibility_ms <= self.max_visibility_ms
                && self.max_visibility_ms <= MAX_VISIBILITY_MS,
            "visibility timeouts must satisfy 1 <= min <= default <= max <= 12 h",
        )?;
        check(
            self.max_visibility_ms <= self.max_lease_lifetime_ms
                && self.max_lease_lifetime_ms <= MAX_VISIBILITY_MS,
            "max_lease_lifetime_ms must be between max_visibility_ms and 12 h",
        )?;
        let b = &self.backoff;
        check(
            b.multiplier.is_finite() && (1.0..=100.0).contains(&b.multiplier),
            "backoff multiplier must be 1..=100",
        )?;
        check(
            b.base_ms <= b.max_ms && b.max_ms <= MAX_DELAY_MS,
            "backoff must satisfy base <= max <= 90 days",
        )?;
        check(
            (1..=100_000).contains(&self.max_window),
            "max_window must be 1..=100000",
        )?;
        check(
            (1..=100_000).contains(&self.max_leased_per_partition),
            "max_leased_per_partition must be 1..=100000",
        )?;
        check(
            (1..=100_000).contains(&self.max_leased_per_consumer),
            "max_leased_per_consumer must be 1..=100000",
        )?;
        check(
            (1..=10_000).contains(&self.max_lease_batch),
            "max_lease_batch must be 1..=10000",
        )?;
        check(
            self.max_delay_ms <= MAX_DELAY_MS,
            "max_delay_ms must be at most 90 days",
        )?;
        check(
            self.max_delayed <= 10_000_000,
            "max_delayed must be at most 10000000",
        )?;
        check(
            self.dedup_window_ms <= MAX_DEDUP_WINDOW_MS,
            "dedup_window_ms must be at most 1 day",
        )?;
        check(
            self.max_dedup_entries <= 10_000_000,
            "max_dedup_entries must be at most 10000000",
        )?;
        check(
            (1..=256 * 1024 * 1024).contains(&self.max_message_bytes),
            "max_message_bytes must be 1..=256 MiB",
        )?;
        check(
            (1..=3_600_000).contains(&self.delay_bucket_ms),
            "delay_bucket_ms must be 1..=3600000",
        )?;
        check(
            (2..=1 << 30).contains(&self.generation_block),
            "generation_block must be 2..=2^30",
        )?;
        check(
            (1..=3_600_000).contains(&self.dead_letter_retry_ms),
            "dead_letter_retry_ms must be 1..=3600000",
        )?;
        Ok(())
    }
}

/// A setting out of its range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ConfigError(pub(crate) &'static str);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_share_group_configs_are_valid() {
        QueueConfig::default().validate().unwrap();
        let s = ShareGroupSettings {
            delivery_count_limit: 5,
            record_lock_duration_ms: 30_000,
            max_record_locks: 2_000,
            dead_letter_topic: false,
        };
        let c = QueueConfig::share_group(s);
        c.validate().unwrap();
        assert_eq!(c.dead_letter, DeadLetterMode::Archive);
        assert_eq!(c.backoff.delay_ms(3), 0);
    }

    #[test]
    fn out_of_range_settings_are_refused() {
        fn backoff(base_ms: u64, multiplier: f64, max_ms: u64) -> Backoff {
            Backoff {
                base_ms,
                multiplier,
                max_ms,
            }
        }
        /// Sets a field of the defaults wrong.
        type Breaks = fn(&mut QueueConfig);
        let bad: [(&str, Breaks); 15] = [
            ("max_attempts", |c| c.max_attempts = 0),
            ("max_attempts", |c| c.max_attempts = 1001),
            ("visibility", |c| c.min_visibility_ms = 0),
            ("visibility", |c| c.default_visibility_ms = 500),
            ("visibility", |c| {
                c.max_visibility_ms = MAX_VISIBILITY_MS + 1;
                c.max_lease_lifetime_ms = MAX_VISIBILITY_MS + 1;
            }),
            ("lifetime", |c| c.max_lease_lifetime_ms = 1),
            ("backoff", |c| c.backoff = backoff(10, 0.5, 100)),
            ("backoff", |c| c.backoff = backoff(10, f64::NAN, 100)),
            ("backoff", |c| c.backoff = backoff(101, 2.0, 100)),
            ("max_window", |c| c.max_window = 0),
            ("max_lease_batch", |c| c.max_lease_batch = 0),
            ("max_delay_ms", |c| c.max_delay_ms = MAX_DELAY_MS + 1),
            ("dedup_window_ms", |c| c.dedup_window_ms = MAX_DEDUP_WINDOW_MS + 1),
            ("max_message_bytes", |c| c.max_message_bytes = 0),
            ("generation_block", |c| c.generation_block = 1),
        ];
        for (what, set) in bad {
            let mut c = QueueConfig::default();
            set(&mut c);
            assert!(c.validate().is_err(), "{what}: {c:?}");
        }
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        let b = Backoff {
            base_ms: 100,
            multiplier: 2.0,
            max_ms: 1_000,
        };
        assert_eq!(
            (1..=6).map(|a| b.delay_ms(a)).collect::<Vec<_>>(),
            vec![100, 200, 400, 800, 1_000, 1_000]
        );
        assert_eq!(b.delay_ms(u32::MAX), 1_000);
        assert_eq!(b.delay_ms(0), 100);
    }
}
