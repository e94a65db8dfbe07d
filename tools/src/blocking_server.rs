//! What the blocking, thread-per-connection TCP servers of the tools (`faultproxy`,
//! `null_broker`) share: the accept loop with its connection limit and counters, and the
//! shutdown (stop accepting, close every connection, wait for their threads).

use std::io;
use std::net::{Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Writes `field=value` for each named field of `stats`, separated by spaces: how the servers'
/// counters print (their `Display`).
macro_rules! write_fields {
    ($f:expr, $stats:expr, $first:ident $(, $field:ident)* $(,)?) => {
        write!(
            $f,
            concat!(stringify!($first), "={}" $(, " ", stringify!($field), "={}")*),
            $stats.$first $(, $stats.$field)*
        )
    };
}
pub(crate) use write_fields;

/// Locks a mutex, ignoring poisoning (a panicking connection thread must not stop the server).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// How many connections a server accepted, refused (too many open) and has open.
#[derive(Default)]
pub(crate) struct ConnectionCounters {
    pub(crate) accepted: AtomicU64,
    pub(crate) rejected: AtomicU64,
    /// Connection threads still running.
    pub(crate) active: AtomicU64,
    next_id: AtomicU64,
}

/// The state every such server keeps for its accept loop and its shutdown.
pub(crate) struct ServerCore {
    stopping: AtomicBool,
    /// Most connections open at once; a new one beyond is closed at once.
    max_connections: usize,
    pub(crate) connections: ConnectionCounters,
}

impl ServerCore {
    pub(crate) fn new(max_connections: usize) -> ServerCore {
        ServerCore {
            stopping: AtomicBool::new(false),
            max_connections,
            connections: ConnectionCounters::default(),
        }
    }

    /// Whether the server is shutting down (the accept loop ends at its next connection).
    pub(crate) fn stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// Starts the shutdown: [`Self::stopping`] is true from now on.
    pub(crate) fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
    }
}

/// A blocking server with a thread per connection, as its accept loop and its shutdown see it.
pub(crate) trait ThreadPerConnection: Send + Sync + Sized + 'static {
    /// Name prefix of the connection threads (`<prefix>-<id>`).
    const THREAD_PREFIX: &'static str;

    fn core(&self) -> &ServerCore;

    /// Starts the shutdown ([`ServerCore::stop`]); a server may wake its own waiters too.
    fn stop(&self) {
        self.core().stop();
    }

    /// Something the server's log should say (an accept error, a thread that did not start).
    fn note(&self, message: String);

    /// A new connection was closed at once: `active` connections are open already.
    fn refused(&self, _active: u64) {}

    /// On the accept thread, before connection `id`'s thread starts.
    fn opened(&self, _id: u64, _stream: &TcpStream) {}

    /// Serves connection `id` on its own thread, until it ends.
    fn serve(server: &Arc<Self>, id: u64, stream: TcpStream);

    /// After connection `id`'s thread ended, or when it could not start.
    fn closed(&self, _id: u64) {}

    /// Closes every open connection (the shutdown, after the accept loop ended).
    fn close_connections(&self);
}

/// Accepts connections until the server is [stopping](ServerCore::stopping), each
/// served on a thread of its own.
fn accept_loop<S: ThreadPerConnection>(listener: TcpListener, server: Arc<S>) {
    let core = server.core();
    let counters = &core.connections;
    for conn in listener.incoming() {
        if core.stopping() {
            break;
        }
        let stream = match conn {
            Ok(s) => s,
            Err(e) => {
                server.note(format!("accept failed: {e}"));
                // E.g. EMFILE: do not spin.
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        let active = counters.active.load(Ordering::Relaxed);
        if active >= core.max_connections as u64 {
            counters.rejected.fetch_add(1, Ordering::Relaxed);
            server.refused(active);
            continue;
        }
        counters.accepted.fetch_add(1, Ordering::Relaxed);
        counters.active.fetch_add(1, Ordering::Relaxed);
        let id = counters.next_id.fetch_add(1, Ordering::Relaxed);
        server.opened(id, &stream);
        let conn_server = Arc::clone(&server);
        let spawned = std::thread::Builder::new()
            .name(format!("{}-{id}", S::THREAD_PREFIX))
            .spawn(move || {
                S::serve(&conn_server, id, stream);
                conn_server.closed(id);
                conn_server
                    .core()
                    .connections
                    .active
                    .fetch_sub(1, Ordering::Relaxed);
            });
        if let Err(e) = spawned {
            server.closed(id);
            counters.active.fetch_sub(1, Ordering::Relaxed);
            server.note(format!("cannot start a connection thread: {e}"));
        }
    }
}

/// A server accepting connections on a thread of its own; dropping it shuts it down.
pub(crate) struct Running<S: ThreadPerConnection> {
    /// The server's state, shared with its threads.
    pub(crate) shared: Arc<S>,
    local_addr: SocketAddr,
    accept_thread: Option<JoinHandle<()>>,
}

impl<S: ThreadPerConnection> Running<S> {
    /// Starts the accept loop of `shared` on `listener`, on a thread named `thread_name`.
    pub(crate) fn start(listener: TcpListener, shared: Arc<S>, thread_name: &str) -> io::Result<Running<S>> {
        let local_addr = listener.local_addr()?;
        let accept_shared = Arc::clone(&shared);
        let accept_thread = std::thread::Builder::new()
            .name(thread_name.into())
            .spawn(move || accept_loop(listener, accept_shared))?;
        Ok(Running {
            shared,
            local_addr,
            accept_thread: Some(accept_thread),
        })
    }

    /// The bound address (with the actual port when the listener asked for port 0).
    pub(crate) fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops the server (the first time; later calls do nothing): no new connections, every
    /// open one closed, their threads waited for (up to 5 s).
    pub(crate) fn shut_down(&mut self) {
        if let Some(thread) = self.accept_thread.take() {
            self.shared.stop();
            stop_accept_thread(self.local_addr, thread);
            self.shared.close_connections();
            wait_for_connection_threads(&self.shared.core().connections.active, Duration::from_secs(5));
        }
    }
}

impl<S: ThreadPerConnection> Drop for Running<S> {
    fn drop(&mut self) {
        self.shut_down();
    }
}

/// Wakes a thread blocked in `accept` on `local` by connecting to it (an unspecified address is
/// reached on loopback) and joins it. The loop must check its stop flag after each accept.
fn stop_accept_thread(local: SocketAddr, thread: JoinHandle<()>) {
    let wake = match local {
        SocketAddr::V4(a) if a.ip().is_unspecified() => SocketAddr::from(([127, 0, 0, 1], a.port())),
        SocketAddr::V6(a) if a.ip().is_unspecified() => SocketAddr::from((Ipv6Addr::LOCALHOST, a.port())),
        a => a,
    };
    let _ = TcpStream::connect_timeout(&wake, Duration::from_secs(1));
    let _ = thread.join();
}

/// Waits until `active` (connection threads still running) is 0, for at most `within`.
fn wait_for_connection_threads(active: &AtomicU64, within: Duration) {
    let deadline = Instant::now() + within;
    while active.load(Ordering::Relaxed) > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
}
