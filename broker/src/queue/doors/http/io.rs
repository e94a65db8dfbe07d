//! The I/O loop of one HTTP connection: read into the [`Session`], answer each request through
//! [`route::handle`], write the answers in order. One task, sequential: request, answer, next
//! request; pipelined requests wait in the session's buffer.
//!
//! Timeouts (glommio timers in production, any [`Sleeper`] in tests): `idle_timeout` while no
//! byte of a next request has arrived (then the connection is closed without an answer),
//! `request_read_timeout` from a request's first byte to its last (then 408), `write_timeout`
//! per answer (then the connection is dropped). The queue service's own time (a long-polling
//! lease) is not bounded here, but while it runs the loop keeps one read open: the end of the
//! client's stream sets [`PeerGone`], which ends a long poll (see [`watch_peer`]).

use std::future::Future;
use std::net::SocketAddr;
use std::pin::pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::future::{select, Either};
use futures::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use glommio::sync::{Semaphore, StaticPermit};

use super::parse::Version;
use super::response::{Response, CONTINUE};
use super::route;
use super::session::{Event, Session};
use super::types::ApiError;
use super::{HttpLimits, PeerGone, QueueApi};

/// Bytes asked of one read.
const READ_CHUNK_BYTES: usize = 64 * 1024;
/// Lingering close: how long, and how many bytes, to drain after the last answer.
const LINGER: Duration = Duration::from_secs(2);
const LINGER_MAX_BYTES: usize = 1024 * 1024;

/// A timer. Production uses glommio's; tests use timers that fire at once or never.
pub(crate) trait Sleeper {
    async fn sleep(&self, duration: Duration);
}

/// glommio's timer; must run on a glommio executor.
pub(crate) struct GlommioSleeper;

impl Sleeper for GlommioSleeper {
    async fn sleep(&self, duration: Duration) {
        glommio::timer::sleep(duration).await;
    }
}

/// Runs `fut` for at most `duration`: `None` when the time ran out first.
async fn within<T>(sleeper: &impl Sleeper, duration: Duration, fut: impl Future<Output = T>) -> Option<T> {
    let fut = pin!(fut);
    let timer = pin!(sleeper.sleep(duration));
    match select(fut, timer).await {
        Either::Left((v, _)) => Some(v),
        Either::Right(((), _)) => None,
    }
}

/// Why a connection ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CloseReason {
    /// The client closed between requests.
    PeerClosed,
    /// The client closed in the middle of a request.
    PeerClosedMidRequest,
    /// The request or answer did not keep the connection alive (`Connection: close`, HTTP/1.0).
    NotKeptAlive,
    IdleTimeout,
    /// A request was not read in time (answered 408).
    RequestTimeout,
    /// The request's framing was refused (answered with this status).
    BadRequest(u16),
    ReadError,
    /// Writing an answer failed or timed out.
    WriteFailed,
    /// The shard's request memory was closed: the broker is shutting down.
    ShuttingDown,
}

impl CloseReason {
    /// A label for logs and metrics.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            CloseReason::PeerClosed => "peer closed",
            CloseReason::PeerClosedMidRequest => "peer closed mid-request",
            CloseReason::NotKeptAlive => "not kept alive",
            CloseReason::IdleTimeout => "idle timeout",
            CloseReason::RequestTimeout => "request timeout",
            CloseReason::BadRequest(_) => "bad request",
            CloseReason::ReadError => "read error",
            CloseReason::WriteFailed => "write failed",
            CloseReason::ShuttingDown => "shutting down",
        }
    }
}

/// How a connection ended: requests answered (not counting a final error answer) and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Closed {
    pub(crate) requests: u64,
    pub(crate) reason: CloseReason,
    /// Requests whose client went away while they were served (see [`PeerGone`]).
    pub(crate) client_gone: u64,
}

/// The default consumer name of a connection: `http-<peer>-<n>`, `n` unique in the process.
pub(crate) fn default_consumer_name(peer: Option<SocketAddr>) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    match peer {
        Some(p) => format!("http-{p}-{n}"),
        None => format!("http-{n}"),
    }
}

/// Serves one accepted connection until it ends; never panics on what the client sends.
pub(crate) async fn serve_connection<A: QueueApi>(
    api: Rc<A>,
    mut stream: glommio::net::TcpStream,
    limits: HttpLimits,
    body_memory: Rc<Semaphore>,
) -> Closed {
    let peer = stream.peer_addr().ok();
    let _ = stream.set_nodelay(true);
    let consumer = default_consumer_name(peer);
    let closed = serve(
        &*api,
        &mut stream,
        &limits,
        &body_memory,
        &consumer,
        &GlommioSleeper,
    )
    .await;
    tracing::debug!(
        ?peer,
        requests = closed.requests,
        reason = closed.reason.as_str(),
        client_gone = closed.client_gone,
        "http connection closed"
    );
    closed
}

/// The connection loop over any byte stream and timer. A body is read only once its bytes are
/// reserved from `body_memory` (the shard's request memory, shared with the Kafka listener),
/// and they stay reserved until its answer is written: the bodies a shard buffers stay within
/// that budget however many connections send at once. A request whose reservation does not
/// come within the request read time is answered 408.
pub(crate) async fn serve<A, S, T>(
    api: &A,
    stream: &mut S,
    limits: &HttpLimits,
    body_memory: &Rc<Semaphore>,
    consumer: &str,
    sleeper: &T,
) -> Closed
where
    A: QueueApi,
    S: AsyncRead + AsyncWrite + Unpin,
    T: Sleeper,
{
    let mut session = Session::new(limits.clone());
    let mut chunk = vec![0u8; READ_CHUNK_BYTES];
    let mut out = Vec::new();
    let mut requests = 0u64;
    let mut request_started: Option<Instant> = None;
    let mut body_reserved: Option<StaticPermit> = None;
    let client_gone = std::cell::Cell::new(0u64);
    let closed = |requests, reason| Closed {
        requests,
        reason,
        client_gone: client_gone.get(),
    };
    loop {
        match session.poll() {
            Event::NeedMore => {
                if body_reserved.is_none() {
                    if let Some(n) = session.body_bytes_expected().filter(|n| *n > 0) {
                        let started = *request_started.get_or_insert_with(Instant::now);
                        let wait = limits.request_read_timeout.saturating_sub(started.elapsed());
                        match within(sleeper, wait, body_memory.acquire_static_permit(n as u64)).await {
                            Some(Ok(p)) => body_reserved = Some(p),
                            Some(Err(_)) => return closed(requests, CloseReason::ShuttingDown),
                            None => {
                                let e = ApiError::request_timeout();
                                answer_error(stream, sleeper, limits, &e, &mut out, &mut chunk).await;
                                return closed(requests, CloseReason::RequestTimeout);
                            }
                        }
                    }
                }
                let in_request = session.in_request();
                let wait = if in_request {
                    let started = *request_started.get_or_insert_with(Instant::now);
                    limits.request_read_timeout.saturating_sub(started.elapsed())
                } else {
                    limits.idle_timeout
                };
                let read = if wait.is_zero() {
                    None
                } else {
                    within(sleeper, wait, stream.read(&mut chunk)).await
                };
                match read {
                    Some(Ok(0)) if in_request => return closed(requests, CloseReason::PeerClosedMidRequest),
                    Some(Ok(0)) => return closed(requests, CloseReason::PeerClosed),
                    Some(Ok(n)) => {
                        session.push(chunk.get(..n).unwrap_or_default());
                        if request_started.is_none() && session.in_request() {
                            request_started = Some(Instant::now());
                        }
                    }
                    Some(Err(_)) => return closed(requests, CloseReason::ReadError),
                    None if in_request => {
                        let e = ApiError::request_timeout();
                        answer_error(stream, sleeper, limits, &e, &mut out, &mut chunk).await;
                        return closed(requests, CloseReason::RequestTimeout);
                    }
                    None => {
                        linger(stream, sleeper, &mut chunk).await;
                        return closed(requests, CloseReason::IdleTimeout);
                    }
                }
            }
            Event::Continue => {
                if !write(stream, sleeper, limits, CONTINUE).await {
                    return closed(requests, CloseReason::WriteFailed);
                }
            }
            Event::Request(req) => {
                // This request's body memory, given back at the end of this arm: answered.
                let _body_reserved = body_reserved.take();
                requests += 1;
                request_started = None;
                let response = {
                    let gone = PeerGone::default();
                    let handled = pin!(route::handle(api, &req, consumer, &gone));
                    let response = watch_peer(stream, &mut session, &mut chunk, &gone, handled).await;
                    if gone.is_set() {
                        client_gone.set(client_gone.get() + 1);
                    }
                    response
                };
                out.clear();
                response.encode(req.method == "HEAD", req.keep_alive, req.version, &mut out);
                if !write(stream, sleeper, limits, &out).await {
                    return closed(requests, CloseReason::WriteFailed);
                }
                if out.capacity() > READ_CHUNK_BYTES {
                    // Do not keep a large answer's buffer for the life of the connection.
                    out = Vec::new();
                }
                if !req.keep_alive {
                    linger(stream, sleeper, &mut chunk).await;
                    return closed(requests, CloseReason::NotKeptAlive);
                }
            }
            Event::Error(e) => {
                tracing::debug!(error = %e, "refusing an HTTP request");
                answer_error(stream, sleeper, limits, &e, &mut out, &mut chunk).await;
                return closed(requests, CloseReason::BadRequest(e.status));
            }
        }
    }
}

/// Runs `handled` (one request) to its end while watching the connection: if the client's side
/// ends (end of stream, or an error such as a reset) `gone` is set, and a long-polling lease
/// stops waiting. Bytes that arrive meanwhile (a pipelined request) go into the session, and
/// the watch stops there, so at most one read's worth is buffered ahead. Dropping a pending
/// read loses nothing: the stream reads only once the socket is ready.
async fn watch_peer<S, F>(
    stream: &mut S,
    session: &mut Session,
    chunk: &mut [u8],
    gone: &PeerGone,
    mut handled: std::pin::Pin<&mut F>,
) -> Response
where
    S: AsyncRead + Unpin,
    F: Future<Output = Response>,
{
    let read = pin!(stream.read(chunk));
    match select(handled.as_mut(), read).await {
        Either::Left((response, _)) => return response,
        Either::Right((Ok(n), _)) if n > 0 => {
            // `n` came from this read of `chunk`; the read future is gone, so `chunk` is free.
            session.push(chunk.get(..n).unwrap_or_default());
        }
        Either::Right(_) => gone.set(),
    }
    handled.await
}

/// Writes `bytes` within the write timeout; `false` if that failed.
async fn write<S: AsyncWrite + Unpin>(
    stream: &mut S,
    sleeper: &impl Sleeper,
    limits: &HttpLimits,
    bytes: &[u8],
) -> bool {
    let fut = async {
        stream.write_all(bytes).await?;
        stream.flush().await
    };
    matches!(within(sleeper, limits.write_timeout, fut).await, Some(Ok(())))
}

/// Answers an error with `Connection: close` and closes the connection.
async fn answer_error<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    sleeper: &impl Sleeper,
    limits: &HttpLimits,
    e: &ApiError,
    out: &mut Vec<u8>,
    chunk: &mut [u8],
) {
    out.clear();
    Response::error(e).encode(false, false, Version::Http11, out);
    if write(stream, sleeper, limits, out).await {
        linger(stream, sleeper, chunk).await;
    }
}

/// Closes the write side, then drains what the client still sends (bounded in time and bytes),
/// so that closing does not reset the connection before the client has read the last answer.
async fn linger<S: AsyncRead + AsyncWrite + Unpin>(stream: &mut S, sleeper: &impl Sleeper, chunk: &mut [u8]) {
    if !matches!(within(sleeper, LINGER, stream.close()).await, Some(Ok(()))) {
        return;
    }
    let deadline = Instant::now() + LINGER;
    let mut drained = 0usize;
    while drained < LINGER_MAX_BYTES {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        match within(sleeper, left, stream.read(chunk)).await {
            Some(Ok(n)) if n > 0 => drained += n,
            _ => return,
        }
    }
}
