//! openraft's runtime on glommio: the production adapter.
//!
//! A Raft group lives on one shard, so everything here is local to the shard's executor:
//! - `spawn` is `glommio::spawn_local` on the executor the caller runs on, detached at once; the
//!   handle still yields the output when awaited, and dropping it leaves the task running
//!   (tokio's semantics, which openraft relies on). A handle resolves to an error only if the
//!   task was dropped unfinished, i.e. its executor ended first; a panicking task propagates out
//!   of the executor, as every other shard task's does.
//! - Time is `std::time::Instant`; sleeps and timeouts are glommio timers (`timer::Timer`), which
//!   the reactor fires, with their deadlines moved up to a grid common to the thread
//!   ([`TIMER_GRID`]) so that the timers of a shard's many groups fire together. Like `spawn`,
//!   they must be called on a thread whose executor runs (glommio panics otherwise); openraft
//!   calls them only from its own tasks.
//! - Randomness is rand's thread-local generator.
//! - Channels and the lock are the single-threaded ones of [`super::sync`].
//!
//! [`AsyncRuntime::new`] builds a `LocalExecutor` on the calling thread and
//! [`AsyncRuntime::block_on`] runs a future on it: for tests. In the broker the shard's
//! executor already runs, and openraft is only handed the type.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use glommio::timer::Timer;
use openraft::rt::{AsyncRuntime, OptionalSend};

use super::sync::{Elapsed, LocalMpsc, LocalMutex, LocalOneshot, LocalWatch, Timeout};

/// openraft's [`AsyncRuntime`] on the current glommio executor.
pub struct GlommioRuntime {
    executor: glommio::LocalExecutor,
}

impl fmt::Debug for GlommioRuntime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GlommioRuntime")
            .field("executor_id", &self.executor.id())
            .finish()
    }
}

/// The task was dropped before it finished (its executor stopped).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GlommioJoinError;

impl fmt::Display for GlommioJoinError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("glommio task was dropped before it finished")
    }
}

impl std::error::Error for GlommioJoinError {}

/// Awaits a detached glommio task's output. Dropping it does not cancel the task.
pub struct GlommioJoinHandle<T>(glommio::task::JoinHandle<T>);

impl<T> Future for GlommioJoinHandle<T> {
    type Output = Result<T, GlommioJoinError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0)
            .poll(cx)
            .map(|out| out.ok_or(GlommioJoinError))
    }
}

/// A glommio timer that ends with `()`.
pub struct GlommioSleep(Timer);

impl Future for GlommioSleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        Pin::new(&mut self.0).poll(cx).map(|_| ())
    }
}

/// The spacing of the grid that every openraft deadline on a thread is moved up to.
///
/// Each group's Raft keeps timers of its own (a tick every tick interval, a heartbeat worker
/// per follower), each started at its own phase: a shard of a thousand awake groups woke its
/// reactor for each one apart, thousands of times a second, and the sleeps and wakes cost more
/// than the ticks (half a core per node of 1,000 awake replicas, a sixth on the grid). On the
/// grid, the timers due within one spacing fire in one wake, each up to one spacing late: a
/// twentieth of the 100 ms heartbeat interval, a 120th of the shortest election timeout.
pub const TIMER_GRID: Duration = Duration::from_millis(5);

thread_local! {
    /// Where the thread's grid starts: its first timer.
    static GRID_ORIGIN: Instant = Instant::now();
}

/// `deadline` moved up to the next line of a `grid`-spaced grid that starts at `origin`; a
/// deadline already due (not after `now`), on a line, or before the origin stays as it is.
fn on_grid(origin: Instant, grid: Duration, now: Instant, deadline: Instant) -> Instant {
    let grid_ns = grid.as_nanos();
    if deadline <= now || grid_ns == 0 {
        return deadline;
    }
    let Some(since) = deadline.checked_duration_since(origin) else {
        return deadline;
    };
    let behind_ns = since.as_nanos() % grid_ns;
    if behind_ns == 0 {
        return deadline;
    }
    // Below `grid_ns`, which is a `Duration`'s worth of nanoseconds of a few milliseconds.
    let up_ns = u64::try_from(grid_ns - behind_ns).unwrap_or(0);
    deadline + Duration::from_nanos(up_ns)
}

/// A timer for `deadline`, on the thread's grid.
fn timer_until(deadline: Instant) -> GlommioSleep {
    let now = Instant::now();
    let origin = GRID_ORIGIN.with(|o| *o);
    let at = on_grid(origin, TIMER_GRID, now, deadline);
    GlommioSleep(Timer::new(at.saturating_duration_since(now)))
}

impl AsyncRuntime for GlommioRuntime {
    type JoinError = GlommioJoinError;
    type JoinHandle<T: OptionalSend + 'static> = GlommioJoinHandle<T>;
    type Sleep = GlommioSleep;
    type Instant = Instant;
    type TimeoutError = Elapsed;
    type Timeout<R, T: Future<Output = R> + OptionalSend> = Timeout<T, GlommioSleep>;
    type ThreadLocalRng = rand010::rngs::ThreadRng;

    fn spawn<T>(future: T) -> GlommioJoinHandle<T::Output>
    where
        T: Future + OptionalSend + 'static,
        T::Output: OptionalSend + 'static,
    {
        GlommioJoinHandle(glommio::spawn_local(future).detach())
    }

    fn sleep(duration: Duration) -> GlommioSleep {
        timer_until(Instant::now() + duration)
    }

    fn sleep_until(deadline: Instant) -> GlommioSleep {
        timer_until(deadline)
    }

    fn timeout<R, F: Future<Output = R> + OptionalSend>(
        duration: Duration,
        future: F,
    ) -> Timeout<F, GlommioSleep> {
        Timeout::new(future, Self::sleep(duration))
    }

    fn timeout_at<R, F: Future<Output = R> + OptionalSend>(
        deadline: Instant,
        future: F,
    ) -> Timeout<F, GlommioSleep> {
        Timeout::new(future, Self::sleep_until(deadline))
    }

    fn is_panic(_join_error: &GlommioJoinError) -> bool {
        // glommio does not catch a task's panic: it unwinds out of the executor instead.
        false
    }

    fn thread_rng() -> rand010::rngs::ThreadRng {
        rand010::rng()
    }

    type Mpsc = LocalMpsc;
    type Watch = LocalWatch;
    type Oneshot = LocalOneshot;
    type Mutex<T: OptionalSend + 'static> = LocalMutex<T>;

    fn new(_threads: usize) -> Self {
        let executor = glommio::LocalExecutorBuilder::default()
            .make()
            .expect("a glommio executor could not be built on this thread");
        GlommioRuntime { executor }
    }

    fn block_on<F, T>(&mut self, future: F) -> T
    where
        F: Future<Output = T>,
    {
        self.executor.run(future)
    }
}

#[cfg(test)]
mod tests {
    use openraft::rt::{Oneshot, OneshotSender};

    use super::*;

    #[test]
    fn openraft_conformance_suite() {
        openraft::rt::testing::Suite::<GlommioRuntime>::test_all();
    }

    /// A dropped join handle leaves its task running; an awaited one yields the output.
    #[test]
    fn dropping_a_join_handle_does_not_cancel_the_task() {
        let mut rt = GlommioRuntime::new(1);
        rt.block_on(async {
            let (tx, rx) = LocalOneshot::channel::<u32>();
            drop(GlommioRuntime::spawn(async move {
                GlommioRuntime::sleep(Duration::from_millis(5)).await;
                tx.send(5).unwrap();
            }));
            let h = GlommioRuntime::spawn(async { 7 });
            assert_eq!(h.await, Ok(7));
            // Would fail (sender dropped) had the first task been cancelled with its handle.
            assert_eq!(rx.await, Ok(5));
        });
    }

    /// A deadline moves up to the next grid line, never earlier and less than one spacing
    /// later; one on a line, already due, or before the grid's origin stays.
    #[test]
    fn deadlines_move_up_to_the_grid() {
        let origin = Instant::now();
        let grid = Duration::from_millis(5);
        let ms = Duration::from_millis;
        let us = Duration::from_micros;
        let now = origin + ms(1);
        assert_eq!(on_grid(origin, grid, now, origin + ms(7)), origin + ms(10));
        assert_eq!(on_grid(origin, grid, now, origin + ms(10)), origin + ms(10));
        assert_eq!(
            on_grid(origin, grid, now, origin + ms(10) + us(1)),
            origin + ms(15)
        );
        assert_eq!(on_grid(origin, grid, now, origin + us(4_999)), origin + ms(5));
        // Already due: fires at once, not at the next line.
        assert_eq!(on_grid(origin, grid, now, origin + us(500)), origin + us(500));
        assert_eq!(on_grid(origin, grid, now, now), now);
        // No grid.
        assert_eq!(
            on_grid(origin, Duration::ZERO, now, origin + ms(7)),
            origin + ms(7)
        );
        // Deadlines spread over a period land on a few lines, each within a spacing of it.
        let mut lines = std::collections::BTreeSet::new();
        for i in 1..=1_000u64 {
            let deadline = now + us(37 * i);
            let at = on_grid(origin, grid, now, deadline);
            assert!(
                at >= deadline && at - deadline < grid,
                "{i}: {at:?} vs {deadline:?}"
            );
            lines.insert(at);
        }
        assert_eq!(
            lines.len(),
            8,
            "37 ms of deadlines after 1 ms fall on the 8 lines from 5 to 40 ms"
        );
    }

    /// `sleep_until` a past instant ends at once.
    #[test]
    fn sleeping_until_the_past_ends_at_once() {
        let mut rt = GlommioRuntime::new(1);
        rt.block_on(async {
            let past = Instant::now();
            GlommioRuntime::sleep(Duration::from_millis(2)).await;
            let t = Instant::now();
            GlommioRuntime::sleep_until(past).await;
            assert!(t.elapsed() < Duration::from_secs(5));
        });
    }
}
