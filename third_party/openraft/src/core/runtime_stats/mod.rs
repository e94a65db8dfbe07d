//! Runtime statistics collection.
//!
//! Everything here is reachable only through `Raft::runtime_stats`, which exists only under the
//! `runtime-stats` feature. With the feature off the whole module is legitimately unreachable, so
//! the allow below is conditioned on that rather than applied outright: with the feature on, dead
//! code here is real dead code and still warns.
#![cfg_attr(not(feature = "runtime-stats"), allow(dead_code))]

mod display_mode;
#[allow(clippy::module_inception)]
mod runtime_stats;
mod runtime_stats_display;

pub mod log_stage;

pub use self::display_mode::DisplayMode;
pub use self::runtime_stats::RuntimeStats;
pub use self::runtime_stats_display::RuntimeStatsDisplay;

/// A histogram for the runtime statistics.
///
/// STRAND PATCH 3: every Raft group records these statistics, whether or not the
/// `runtime-stats` feature that reads them is on. At the default width a histogram keeps 252
/// buckets (2 KiB), and a group has fifteen: 30 KiB per group. Without the feature the
/// statistics cannot be read, so they are kept at width 1 (one bucket per power of two).
pub(crate) fn new_histogram<T>() -> base2histogram::Histogram<T> {
    if cfg!(feature = "runtime-stats") {
        base2histogram::Histogram::new()
    } else {
        base2histogram::Histogram::with_log_scale(1, 1)
    }
}
