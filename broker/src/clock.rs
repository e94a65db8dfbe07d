//! Time as the broker sees it. Components take a [`Clock`] so that state machines can be driven
//! by a simulated clock in tests.

/// Wall-clock milliseconds since the Unix epoch (Kafka timestamps).
pub(crate) trait Clock {
    fn now_ms(&self) -> i64;
}

/// The system clock.
pub(crate) struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0)
    }
}
