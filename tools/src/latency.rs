//! Latency histograms (HdrHistogram, microseconds) and their summary.

use hdrhistogram::Histogram;
use serde::Serialize;

/// Highest latency a histogram tracks: one hour, in microseconds. Larger values are clamped.
const MAX_TRACKABLE_US: u64 = 3_600_000_000;

/// A histogram of latencies in microseconds, 3 significant digits, 1 µs to 1 h.
pub fn histogram() -> Histogram<u64> {
    // The bounds are constants that satisfy HdrHistogram's preconditions (low >= 1,
    // high >= 2 * low, sigfig <= 5); failure here is a bug, not an operating error.
    Histogram::new_with_bounds(1, MAX_TRACKABLE_US, 3).expect("constant histogram bounds are valid")
}

/// Records one latency given in nanoseconds (rounded down to whole microseconds, at least 1).
pub fn record_ns(histogram: &mut Histogram<u64>, nanos: u64) {
    histogram.saturating_record((nanos / 1_000).clamp(1, MAX_TRACKABLE_US));
}

/// Percentiles of one latency distribution, in microseconds.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct LatencySummary {
    /// Number of samples.
    pub samples: u64,
    pub min_us: u64,
    pub mean_us: f64,
    pub p50_us: u64,
    pub p90_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    pub max_us: u64,
}

impl LatencySummary {
    /// Summarises a histogram; an empty histogram gives all zeros and `samples == 0`.
    pub fn of(histogram: &Histogram<u64>) -> Self {
        if histogram.is_empty() {
            return Self::default();
        }
        Self {
            samples: histogram.len(),
            min_us: histogram.min(),
            mean_us: histogram.mean(),
            p50_us: histogram.value_at_quantile(0.50),
            p90_us: histogram.value_at_quantile(0.90),
            p99_us: histogram.value_at_quantile(0.99),
            p999_us: histogram.value_at_quantile(0.999),
            max_us: histogram.max(),
        }
    }
}

/// Formats a microsecond figure for people: `850 µs`, `4.21 ms`, `1.30 s`.
pub fn human_us(us: u64) -> String {
    if us < 1_000 {
        format!("{us} µs")
    } else if us < 1_000_000 {
        format!("{:.2} ms", us as f64 / 1e3)
    } else {
        format!("{:.2} s", us as f64 / 1e6)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_of_known_distribution() {
        let mut h = histogram();
        for us in 1..=1000u64 {
            record_ns(&mut h, us * 1_000);
        }
        let s = LatencySummary::of(&h);
        assert_eq!(s.samples, 1000);
        assert_eq!(s.min_us, 1);
        assert_eq!(s.max_us, 1000);
        assert_eq!(s.p50_us, 500);
        assert_eq!(s.p99_us, 990);
        assert!((s.mean_us - 500.5).abs() < 1.0);
    }

    #[test]
    fn empty_and_sub_microsecond() {
        assert_eq!(LatencySummary::of(&histogram()).samples, 0);
        let mut h = histogram();
        record_ns(&mut h, 10);
        assert_eq!(LatencySummary::of(&h).min_us, 1);
    }

    #[test]
    fn human_units() {
        assert_eq!(human_us(850), "850 µs");
        assert_eq!(human_us(4_210), "4.21 ms");
        assert_eq!(human_us(1_300_000), "1.30 s");
    }
}
