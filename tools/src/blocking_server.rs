//! What the blocking, thread-per-connection TCP servers of the tools (`faultproxy`,
//! `null_broker`) share: stopping the accept thread, and waiting for connection threads.

use std::net::{Ipv6Addr, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Wakes a thread blocked in `accept` on `local` by connecting to it (an unspecified address is
/// reached on loopback) and joins it. The loop must check its stop flag after each accept.
pub(crate) fn stop_accept_thread(local: SocketAddr, thread: JoinHandle<()>) {
    let wake = match local {
        SocketAddr::V4(a) if a.ip().is_unspecified() => SocketAddr::from(([127, 0, 0, 1], a.port())),
        SocketAddr::V6(a) if a.ip().is_unspecified() => SocketAddr::from((Ipv6Addr::LOCALHOST, a.port())),
        a => a,
    };
    let _ = TcpStream::connect_timeout(&wake, Duration::from_secs(1));
    let _ = thread.join();
}

/// Waits until `active` (connection threads still running) is 0, for at most `within`.
pub(crate) fn wait_for_connection_threads(active: &AtomicU64, within: Duration) {
    let deadline = Instant::now() + within;
    while active.load(Ordering::Relaxed) > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
}
