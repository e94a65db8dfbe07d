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
// STRAND PATCH 5: without the feature the core records into `UnreadStats`.
#[cfg(feature = "runtime-stats")]
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

/// What a group's `RaftCore` records its runtime statistics into.
///
/// STRAND PATCH 5: without the `runtime-stats` feature nothing can read the statistics
/// (`RaftMsg::GetRuntimeStats` exists only under it), yet every group kept fifteen histograms
/// and three counter vectors, ~9 KiB even at width 1 (patch 3): most of what a quiesced group
/// holds beside its log. Without the feature the core records into [`UnreadStats`], which has
/// the same recording calls and keeps nothing.
#[cfg(feature = "runtime-stats")]
pub(crate) type CoreStats<C> = RuntimeStats<C>;
#[cfg(not(feature = "runtime-stats"))]
pub(crate) type CoreStats<C> = UnreadStats<C>;

/// A histogram that keeps nothing (STRAND PATCH 5).
#[cfg(not(feature = "runtime-stats"))]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct UnreadHistogram;

#[cfg(not(feature = "runtime-stats"))]
impl UnreadHistogram {
    pub(crate) fn record(&mut self, _value: u64) {}
}

/// The core's runtime statistics when nothing can read them: the recording calls of
/// [`RuntimeStats`] that `RaftCore` makes, keeping nothing (STRAND PATCH 5).
#[cfg(not(feature = "runtime-stats"))]
#[derive(Debug, Default)]
pub(crate) struct UnreadStats<C> {
    pub(crate) apply_batch: UnreadHistogram,
    pub(crate) append_batch: UnreadHistogram,
    pub(crate) raft_msg_per_run: UnreadHistogram,
    pub(crate) write_batch: UnreadHistogram,
    pub(crate) raft_msg_budget: UnreadHistogram,
    pub(crate) notification_budget: UnreadHistogram,
    pub(crate) raft_msg_usage_permille: UnreadHistogram,
    pub(crate) notification_usage_permille: UnreadHistogram,
    _phantom: std::marker::PhantomData<fn() -> C>,
}

#[cfg(not(feature = "runtime-stats"))]
impl<C: crate::RaftTypeConfig> UnreadStats<C> {
    pub(crate) fn new(_config: &crate::Config) -> Self {
        UnreadStats {
            apply_batch: UnreadHistogram,
            append_batch: UnreadHistogram,
            raft_msg_per_run: UnreadHistogram,
            write_batch: UnreadHistogram,
            raft_msg_budget: UnreadHistogram,
            notification_budget: UnreadHistogram,
            raft_msg_usage_permille: UnreadHistogram,
            notification_usage_permille: UnreadHistogram,
            _phantom: std::marker::PhantomData,
        }
    }

    pub(crate) fn record_command(&mut self, _name: crate::engine::CommandName) {}

    pub(crate) fn record_raft_msg(&mut self, _name: crate::core::raft_msg::RaftMsgName) {}

    pub(crate) fn record_notification(&mut self, _name: crate::core::NotificationName) {}

    pub(crate) fn record_log_stage_now(&mut self, _stage: crate::core::stage::Stage, _index: u64) {}

    pub(crate) fn record_log_stage(
        &mut self,
        _stage: crate::core::stage::Stage,
        _index: u64,
        _now: crate::type_config::alias::InstantOf<C>,
    ) {
    }
}
