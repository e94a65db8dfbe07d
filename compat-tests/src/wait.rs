//! Waiting for a condition by polling it (a member log waits for events itself, see
//! [`crate::members::MemberLog::wait_for`]).

use std::time::{Duration, Instant};

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
