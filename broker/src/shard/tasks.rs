//! The shard core's own tasks: the group-commit flusher, the stall probe, and housekeeping
//! (retention, idle producers, taking writes again after a full disk, gauges), which the server spawns on each shard; and the timer
//! loop that drives a subsystem's sans-I/O state machine ([`Ticked`], [`tick_loop`]).

use std::rc::{Rc, Weak};
use std::time::{Duration, Instant};

use strand_storage::notify::Notify;
use strand_storage::ResumeOutcome;

use super::Shard;

/// How often a checkpoint runs when the journal has not filled up (Kafka's
/// `log.flush.offset.checkpoint.interval.ms` default).
const CHECKPOINT_INTERVAL: Duration = Duration::from_secs(60);
/// How often idle idempotent-producer state is expired.
const PRODUCER_EXPIRY_CHECK: Duration = Duration::from_secs(60);

/// How often the stall probe checks a busy executor.
const STALL_PROBE_PERIOD: Duration = Duration::from_millis(10);
/// How often it checks an idle one: stalls shorter than this may then go unseen.
const STALL_PROBE_IDLE_PERIOD: Duration = Duration::from_millis(100);
/// An executor that ran tasks for less than this share of a probe period, in thousandths, is
/// idle.
const STALL_PROBE_BUSY_PERMILLE: u128 = 10;
/// A stall this long is logged.
const STALL_WARN: Duration = Duration::from_millis(50);

/// Measures how late the shard's executor runs a timer: the time in which it could serve
/// nothing (a blocking call, a long computation between awaits, the thread not scheduled).
/// Produce latency tails that flush rounds do not explain show up here.
///
/// It looks every [`STALL_PROBE_PERIOD`] while the executor is busy, and every
/// [`STALL_PROBE_IDLE_PERIOD`] once it was idle for a period: each look is a wake-up, and an
/// idle node's CPU is mostly its wake-ups (a node of thousands of quiesced partitions).
pub(crate) async fn stall_probe(shard: Rc<Shard>) {
    // glommio's executor stats count from the last time they were read (reading takes them);
    // nothing else on the shard reads them.
    let _ = glommio::executor().executor_stats();
    let mut period = STALL_PROBE_PERIOD;
    loop {
        let asked = Instant::now();
        glommio::timer::sleep(period).await;
        let elapsed = asked.elapsed();
        let lag = elapsed.saturating_sub(period);
        shard.metrics.stall(lag);
        if lag >= STALL_WARN {
            tracing::warn!(
                shard = shard.id.0,
                stall_ms = lag.as_millis() as u64,
                "shard executor stalled"
            );
        }
        if shard.shutting_down.get() {
            return;
        }
        let ran = glommio::executor().executor_stats().executor_runtime();
        period = if ran.as_micros() * 1_000 >= elapsed.as_micros() * STALL_PROBE_BUSY_PERMILLE {
            STALL_PROBE_PERIOD
        } else {
            STALL_PROBE_IDLE_PERIOD
        };
    }
}

/// Flush rounds the flusher runs before it looks at checkpoints again.
const ROUNDS_PER_FLUSH_PASS: usize = 32;

/// The group-commit loop: flush rounds whenever something is staged; directory syncs, journal
/// rotation and checkpoints between them. A checkpoint follows a journal rotation, when the
/// journal reached `strand.journal.segment.bytes` or every [`CHECKPOINT_INTERVAL`] if anything
/// changed, and runs in a task of its own while rounds go on. The loop ends once shutdown
/// begins, leaving the last flush and checkpoint to `ShardStore::shutdown`; when staged work
/// cannot be flushed yet (the store waits for a checkpoint, say) it backs off for
/// [`FLUSHER_BACKOFF`] rather than loop without yielding.
pub(crate) async fn flusher(shard: Rc<Shard>) {
    let mut next_checkpoint = Instant::now() + CHECKPOINT_INTERVAL;
    loop {
        {
            let work = shard.store.wait_for_work();
            let tick = glommio::timer::sleep(next_checkpoint.saturating_duration_since(Instant::now()));
            futures::pin_mut!(work);
            futures::pin_mut!(tick);
            futures::future::select(work, tick).await;
        }
        if shard.store.is_closing() {
            // `shutdown` flushes what is left; staying would spin on work we may not take.
            return;
        }
        let mut progressed = true;
        if shard.store.has_pending() {
            let rounds = std::cell::Cell::new(0usize);
            shard
                .store
                .flush_pending(ROUNDS_PER_FLUSH_PASS, |stats| {
                    rounds.set(rounds.get() + 1);
                    shard.metrics.round(stats)
                })
                .await;
            // A new topic or a segment roll: sync the directory now rather than journal every
            // byte of the log until the next checkpoint.
            let synced = shard.store.sync_changed_dirs().await;
            shard.metrics.dir_syncs(synced);
            progressed = rounds.get() > 0 || synced > 0;
        }
        let due = Instant::now() >= next_checkpoint;
        if shard.store.wants_checkpoint() || (due && shard.store.has_uncheckpointed_changes()) {
            progressed = true;
            next_checkpoint = Instant::now() + CHECKPOINT_INTERVAL;
            if let Err(e) = shard.store.rotate_journal().await {
                tracing::error!(error = %e, "journal rotation failed");
                continue;
            }
            let s = shard.clone();
            glommio::spawn_local(async move {
                match s.store.checkpoint().await {
                    Ok(stats) => s.metrics.checkpoint(&stats),
                    Err(e) => tracing::error!(error = %e, "checkpoint failed; the journal is kept"),
                }
            })
            .detach();
        } else if due {
            next_checkpoint = Instant::now() + CHECKPOINT_INTERVAL;
        }
        if !progressed {
            // Work is staged but nothing may be flushed yet (the store waits for something
            // else, such as a running checkpoint): back off instead of looping without ever
            // yielding, which would starve that very checkpoint and the whole shard.
            tracing::debug!("flusher made no progress; backing off");
            glommio::timer::sleep(FLUSHER_BACKOFF).await;
        }
    }
}

/// How long the flusher waits when a pass could flush nothing although work is staged.
const FLUSHER_BACKOFF: Duration = Duration::from_millis(1);

/// Retention passes, idle producers, the probe for free space after a full disk (every
/// second), and gauges.
pub(crate) async fn housekeeping(shard: Rc<Shard>) {
    let retention_every =
        Duration::from_millis(u64::try_from(shard.config.retention_check_interval_ms).unwrap_or(300_000));
    let mut next_retention = Instant::now() + retention_every;
    let mut next_producer_expiry = Instant::now() + PRODUCER_EXPIRY_CHECK;
    let mut told_waiting = false;
    loop {
        glommio::timer::sleep(Duration::from_millis(1000).min(retention_every)).await;
        if Instant::now() >= next_retention {
            shard.retention_pass().await;
            next_retention = Instant::now() + retention_every;
        }
        if Instant::now() >= next_producer_expiry {
            shard.expire_producers();
            next_producer_expiry = Instant::now() + PRODUCER_EXPIRY_CHECK;
        }
        if shard.store.offline().is_some_and(|o| o.disk_full) {
            resume_storage(&shard, &mut told_waiting).await;
        }
        shard.update_partition_gauges();
    }
}

/// After a full disk took the shard's storage offline for writes: takes writes again once the
/// file system has `strand.storage.resume.free.bytes` free (see `ShardStore::try_resume`).
/// `told_waiting`: whether the wait for space was logged since the store went offline.
async fn resume_storage(shard: &Shard, told_waiting: &mut bool) {
    match shard.store.try_resume().await {
        ResumeOutcome::Resumed {
            offline_for,
            logs_cut,
            space,
        } => {
            *told_waiting = false;
            shard.metrics.storage_resumed();
            tracing::warn!(
                shard = shard.id.0,
                offline_ms = offline_for.as_millis() as u64,
                logs_cut,
                available_bytes = space.available_bytes,
                "the disk has space again: storage of this shard takes writes again"
            );
        }
        ResumeOutcome::WaitingForSpace(space) => {
            if !std::mem::replace(told_waiting, true) {
                tracing::warn!(
                    shard = shard.id.0,
                    available_bytes = space.available_bytes,
                    available_inodes = space.available_inodes,
                    needed_bytes = shard.config.storage_resume_free_bytes,
                    "storage of this shard refuses writes until the disk has space again"
                );
            }
        }
        ResumeOutcome::Failed(e) => {
            tracing::warn!(shard = shard.id.0, error = %e, "could not take writes again after a full disk");
        }
        ResumeOutcome::Online | ResumeOutcome::NotResumable | ResumeOutcome::Busy => {}
    }
}

/// A host of a sans-I/O state machine that asks to be woken at a time (the coordinators).
pub(crate) trait Ticked {
    fn core(&self) -> &Shard;
    /// When the machine wants its next tick (`None`: no deadline).
    fn next_wake_ms(&self) -> Option<i64>;
    /// Notified when the machine asks for an earlier wake-up than the one the loop sleeps to.
    fn wake(&self) -> &Notify;
    /// Ticks the machine and carries out what it asks.
    fn tick(&self, now_ms: i64);
}

/// Longest sleep of [`tick_loop`] between looks at the machine's deadline.
const TICK_LOOP_MAX_SLEEP: Duration = Duration::from_secs(1);

/// Ticks `host`'s machine when it asked to be woken (and looks at least every second), until
/// the host is gone or the shard shuts down.
pub(crate) async fn tick_loop<T: Ticked>(host: Weak<T>) {
    let max_ms = TICK_LOOP_MAX_SLEEP.as_millis() as i64;
    loop {
        let Some(host) = host.upgrade() else { return };
        let now = host.core().now_ms();
        let next = host.next_wake_ms().unwrap_or(now + max_ms);
        let wait_ms = next.saturating_sub(now).clamp(0, max_ms);
        {
            let woken = host.wake().wait();
            let timer = glommio::timer::sleep(Duration::from_millis(wait_ms as u64));
            futures::pin_mut!(woken);
            futures::pin_mut!(timer);
            futures::future::select(woken, timer).await;
        }
        if host.core().shutting_down.get() {
            return;
        }
        let now = host.core().now_ms();
        if host.next_wake_ms().is_some_and(|t| t <= now) {
            host.tick(now);
        }
    }
}
