//! Waiting for a condition: polling a check, or watching a log that other threads append to.

use std::time::{Duration, Instant};

/// An append-only list shared by threads (child-process readers push, the test waits on it):
/// the event logs of consumer-group and share-group members.
pub struct SharedLog<L> {
    inner: std::sync::Arc<(std::sync::Mutex<Vec<L>>, std::sync::Condvar)>,
}

impl<L> Clone for SharedLog<L> {
    fn clone(&self) -> Self {
        SharedLog {
            inner: self.inner.clone(),
        }
    }
}

impl<L> Default for SharedLog<L> {
    fn default() -> Self {
        SharedLog {
            inner: std::sync::Arc::default(),
        }
    }
}

impl<L: Clone> SharedLog<L> {
    /// Appends `item` and wakes the waiters.
    pub fn push(&self, item: L) {
        let (lock, cv) = &*self.inner;
        lock.lock().unwrap_or_else(|e| e.into_inner()).push(item);
        cv.notify_all();
    }

    /// A copy of everything so far.
    pub fn snapshot(&self) -> Vec<L> {
        self.inner.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Waits until `check` (run on the whole list after each push, and at least every 100 ms)
    /// returns `Some`; panics after `timeout` with `what` and `summarize` of the list.
    pub fn wait_for<T>(
        &self,
        timeout: Duration,
        what: &str,
        mut check: impl FnMut(&[L]) -> Option<T>,
        summarize: impl Fn(&[L]) -> String,
    ) -> T {
        let deadline = Instant::now() + timeout;
        let (lock, cv) = &*self.inner;
        let mut v = lock.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(t) = check(&v) {
                return t;
            }
            let now = Instant::now();
            if now >= deadline {
                let summary = summarize(&v);
                drop(v);
                panic!("timed out after {timeout:?} waiting for {what}; members so far:\n{summary}");
            }
            let wait = (deadline - now).min(Duration::from_millis(100));
            v = cv.wait_timeout(v, wait).unwrap_or_else(|e| e.into_inner()).0;
        }
    }
}

/// Polls `check` every 50 ms until it returns `Some`, or panics with `what` after `timeout`.
pub fn wait_for<T>(timeout: Duration, what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
