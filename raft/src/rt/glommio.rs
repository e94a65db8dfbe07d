//! openraft's runtime on glommio: the production adapter.
//!
//! A Raft group lives on one shard, so everything here is local to the shard's executor:
//! - `spawn` is `glommio::spawn_local` on the executor the caller runs on, detached at once; the
//!   handle still yields the output when awaited, and dropping it leaves the task running
//!   (tokio's semantics, which openraft relies on). A handle resolves to an error only if the
//!   task was dropped unfinished, i.e. its executor ended first; a panicking task propagates out
//!   of the executor, as every other shard task's does.
//! - Time is `std::time::Instant`; sleeps and timeouts are glommio timers (`timer::Timer`), which
//!   the reactor fires. Like `spawn`, they must be called on a thread whose executor runs
//!   (glommio panics otherwise); openraft calls them only from its own tasks.
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
        GlommioSleep(Timer::new(duration))
    }

    fn sleep_until(deadline: Instant) -> GlommioSleep {
        GlommioSleep(Timer::new(deadline.saturating_duration_since(Instant::now())))
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
