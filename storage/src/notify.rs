//! A single-threaded broadcast notification, independent of the async runtime.
//!
//! Waiters capture a sequence number when they start waiting; every `notify_all` bumps it and
//! wakes everyone. Create the wait future *before* checking the condition it guards, then await
//! it: a notification between the check and the await is not lost.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

#[derive(Default, Debug)]
pub struct Notify {
    seq: Cell<u64>,
    wakers: RefCell<Vec<Waker>>,
}

impl Notify {
    pub fn new() -> Self {
        Self::default()
    }

    /// Wakes every current waiter.
    pub fn notify_all(&self) {
        self.seq.set(self.seq.get().wrapping_add(1));
        let wakers = std::mem::take(&mut *self.wakers.borrow_mut());
        for w in wakers {
            w.wake();
        }
    }

    /// A future that completes at the next `notify_all` after this call.
    pub fn wait(&self) -> Wait<'_> {
        Wait {
            notify: self,
            seq: self.seq.get(),
        }
    }

    /// Number of registered wakers (for tests and gauges).
    pub fn waiters(&self) -> usize {
        self.wakers.borrow().len()
    }
}

/// See [`Notify::wait`].
#[derive(Debug)]
pub struct Wait<'a> {
    notify: &'a Notify,
    seq: u64,
}

impl Future for Wait<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.notify.seq.get() != self.seq {
            return Poll::Ready(());
        }
        let mut wakers = self.notify.wakers.borrow_mut();
        if !wakers.iter().any(|w| w.will_wake(cx.waker())) {
            wakers.push(cx.waker().clone());
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_lite::future;

    #[test]
    fn wait_created_before_notify_completes() {
        let n = Notify::new();
        let w = n.wait();
        n.notify_all();
        future::block_on(w);
        let mut w2 = std::pin::pin!(n.wait());
        assert!(future::block_on(future::poll_once(&mut w2)).is_none());
        assert_eq!(n.waiters(), 1);
        n.notify_all();
        assert!(future::block_on(future::poll_once(&mut w2)).is_some());
    }
}
