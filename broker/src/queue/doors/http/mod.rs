//! The HTTP queue API (docs/http-api.md): an HTTP/1.1 server on each shard's glommio executor
//! and the routing and JSON of the queue endpoints, in front of a [`QueueApi`] implemented by
//! the shards.
//!
//! Layers, each testable alone:
//!
//! - [`parse`]: sans-I/O parsing of a request head and of a chunked body, over a byte buffer.
//! - [`session`]: sans-I/O connection state machine: bytes in, [`session::Event`]s out
//!   (a complete request, "send 100 Continue", or an error that ends the connection).
//! - [`route`]: a complete request -> a [`response::Response`], calling the [`QueueApi`].
//! - [`types`]: the JSON request bodies with their validation, the answers, [`ApiError`].
//! - [`io`]: the I/O loop ([`serve_connection`]) over a glommio `TcpStream`; generic over the
//!   stream and the timer so tests drive it in memory too.
//!
//! # Protocol decisions
//!
//! - One request at a time per connection: a request is read, answered, and only then is the
//!   next one parsed. Pipelined requests are therefore answered in order, and the bytes a
//!   connection buffers are bounded by one request (head + body) plus one read chunk.
//! - Keep-alive is HTTP/1.1's default; `Connection: close` ends the connection after the
//!   answer. HTTP/1.0 requests are served too, kept alive only with `Connection: keep-alive`.
//! - Bodies: `Content-Length`, or `Transfer-Encoding: chunked` (HTTP/1.1 only; chunk
//!   extensions ignored, trailers read and dropped, all within the same limits). A request with
//!   both is refused (400, request smuggling); another transfer coding is 501. POST and PUT
//!   without either are 411. An empty body reads as `{}`.
//! - `Expect: 100-continue` is answered with `100 Continue` before the body is read, unless
//!   the head already decides the answer (413, 411, ...), in which case the final answer is sent
//!   at once and the connection is closed without reading the body. Other expectations: 417.
//! - Limits ([`HttpLimits`]): head bytes (request line + headers; 431), header count (431),
//!   body bytes (413, checked from `Content-Length` before reading, and while decoding chunks;
//!   a body still to be read is first reserved from the shard's request memory, shared with the
//!   Kafka listener, and given back once its answer is written: 408 if it waits past the
//!   request read time),
//!   idle time between requests (the connection is closed), time to read one whole request
//!   (408, then close), time to write an answer (close).
//! - Every error caused by the request's framing closes the connection after its answer (the
//!   stream cannot be resynchronized); errors of a well-framed request (404, 400 on the JSON,
//!   409, ...) keep it open. A connection is closed with a lingering close (write side shut,
//!   what the client still sends is drained for a bounded time) so that the client reads the
//!   answer instead of a reset.
//! - Nothing decoded from the network panics: no `unwrap`, no indexing on input; every length
//!   is checked before it is used.
//!
//! # Not here
//!
//! Binding the listener, accepting connections, counting them, and the queue service itself:
//! the shards do that and implement [`QueueApi`].

// The futures of `QueueApi` are neither `Send` nor meant to be (thread-per-core).
#![allow(async_fn_in_trait)]

pub(crate) mod errors;
pub(crate) mod io;
pub(crate) mod parse;
pub(crate) mod response;
pub(crate) mod route;
pub(crate) mod service;
pub(crate) mod session;
pub(crate) mod types;

#[cfg(test)]
mod tests;

use std::cell::Cell;
use std::future::poll_fn;
use std::rc::Rc;
use std::task::{Poll, Waker};
use std::time::Duration;

pub(crate) use io::serve_connection;

use crate::shard::Shard;
pub(crate) use types::{
    ApiError, GroupStats, LeaseRequest, LeasedMessage, PublishMessage, Published, PutQueue, QueueInfo,
    QueueOrdering, QueueSettings, RedriveRequest, Redriven, SettleAction, SettleBatch, SettleOutcome,
    SettleRequest, Settled, SettledState,
};

/// The queue service behind the HTTP API, implemented by the shards. Arguments are already
/// validated against the static ranges of docs/http-api.md (queue names are valid topic names,
/// numbers within their documented ranges, payloads decoded); what depends on the queue (its
/// existence, `max.message.bytes`, its maximum delay, ...) is the implementation's to check,
/// answering an [`ApiError`] built with its constructors.
///
/// Each future runs on the connection's shard; the connection waits for it (a long-polling lease
/// holds the connection for at most its `wait_ms`, which the implementation must honour).
pub(crate) trait QueueApi {
    /// `PUT /v1/queues/{queue}`: creates the queue (`Ok((true, _))`, answered 201) or changes its
    /// settings (`Ok((false, _))`, 200). The answer is the queue as `GET` shows it.
    async fn put_queue(&self, queue: &str, req: PutQueue) -> Result<(bool, QueueInfo), ApiError>;

    /// `GET /v1/queues/{queue}`.
    async fn get_queue(&self, queue: &str) -> Result<QueueInfo, ApiError>;

    /// `POST /v1/queues/{queue}/messages`: 1..=1000 messages, answered once all are durable, one
    /// [`Published`] per message in request order.
    async fn publish(&self, queue: &str, msgs: Vec<PublishMessage>) -> Result<Vec<Published>, ApiError>;

    /// `POST /v1/queues/{queue}/leases`. `connection_consumer` is the lease owner when
    /// `req.consumer` is `None` (see [`LeaseRequest::consumer_or`]): one name per connection.
    /// A long poll ends at once, leasing nothing, when `gone` is set (the client went away
    /// while it waited), so that no message is leased to a client that will never see it.
    async fn lease(
        &self,
        queue: &str,
        req: LeaseRequest,
        connection_consumer: &str,
        gone: &PeerGone,
    ) -> Result<Vec<LeasedMessage>, ApiError>;

    /// `POST /v1/messages/{id}/ack`. `message_id` is the path segment, percent-decoded, not
    /// otherwise checked (1..=[`types::MAX_MESSAGE_ID_BYTES`] bytes): an id that does not parse
    /// is [`ApiError::message_not_found`].
    async fn settle(&self, message_id: &str, req: SettleRequest) -> Result<Settled, ApiError>;

    /// `POST /v1/messages/ack`: settles many messages; one outcome per item, in request order
    /// (the request as a whole fails only when it cannot be served at all).
    async fn settle_batch(&self, batch: SettleBatch) -> Result<Vec<SettleOutcome>, ApiError>;

    /// `POST /v1/queues/{queue}/redrive`.
    async fn redrive(&self, queue: &str, req: RedriveRequest) -> Result<Redriven, ApiError>;

    /// Whether this node can answer for queues now; every endpoint (the readiness probe
    /// included) answers the error while it cannot. Default: always.
    fn ready(&self) -> Result<(), ApiError> {
        Ok(())
    }

    /// Called once per request answered by the router: its endpoint (a fixed label, see
    /// [`route::endpoint_label`]), the answer's status, and the time from the whole request
    /// having been read to its answer being ready. Default: nothing.
    fn observe(&self, _endpoint: &'static str, _status: u16, _seconds: f64) {}
}

/// Bounds of the HTTP server, per connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HttpLimits {
    /// Largest request body (`strand.http.max.body.bytes`), decoded size for chunked bodies.
    pub(crate) max_body_bytes: usize,
    /// Largest request head: request line and header lines, with their line ends. Also bounds
    /// the trailer section of a chunked body.
    pub(crate) max_header_bytes: usize,
    /// Most header lines in a head (and trailer lines in a chunked body).
    pub(crate) max_headers: usize,
    /// How long a connection may sit between requests (no byte of a next request) before it is
    /// closed.
    pub(crate) idle_timeout: Duration,
    /// How long reading one request may take, from its first byte to the end of its body;
    /// then 408 and close. Bounds slow clients (one byte every few seconds).
    pub(crate) request_read_timeout: Duration,
    /// How long writing one answer may take (a client that does not read); then close.
    pub(crate) write_timeout: Duration,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            max_body_bytes: 10 * 1024 * 1024,
            max_header_bytes: 16 * 1024,
            max_headers: 100,
            idle_timeout: Duration::from_secs(60),
            request_read_timeout: Duration::from_secs(30),
            write_timeout: Duration::from_secs(30),
        }
    }
}

/// Set by the connection loop when the client's side of the connection ends (end of stream or
/// an error) while one of its requests is being served. Only a long-polling lease looks at it;
/// every other request runs to its end, and its answer is still written (a client that only
/// shut down its sending side still reads it).
#[derive(Default)]
pub(crate) struct PeerGone {
    gone: Cell<bool>,
    waker: Cell<Option<Waker>>,
}

impl PeerGone {
    pub(crate) fn set(&self) {
        self.gone.set(true);
        if let Some(w) = self.waker.take() {
            w.wake();
        }
    }

    pub(crate) fn is_set(&self) -> bool {
        self.gone.get()
    }

    /// Resolves once [`PeerGone::set`] has been called (one waiter at a time).
    pub(crate) async fn wait(&self) {
        poll_fn(|cx| {
            if self.gone.get() {
                Poll::Ready(())
            } else {
                self.waker.set(Some(cx.waker().clone()));
                Poll::Pending
            }
        })
        .await
    }
}

/// Accepts HTTP queue API connections on this shard; their bodies share `body_memory` with
/// the shard's Kafka requests.
pub(crate) async fn accept(
    shard: Rc<Shard>,
    body_memory: Rc<glommio::sync::Semaphore>,
    socket: glommio::net::TcpListener,
) {
    let api = Rc::new(service::ShardQueues::new(shard.clone()));
    let limits = HttpLimits {
        max_body_bytes: shard.config.http_max_body_bytes as usize,
        ..Default::default()
    };
    let max_conns = shard.config.max_connections_per_shard as usize;
    let live = Rc::new(std::cell::Cell::new(0usize));
    loop {
        match socket.accept().await {
            Ok(stream) => {
                if live.get() >= max_conns {
                    tracing::warn!(
                        limit = max_conns,
                        "HTTP connection limit reached; refusing a connection"
                    );
                    shard.metrics.bad_request("http connection limit");
                    drop(stream);
                    continue;
                }
                live.set(live.get() + 1);
                let live = live.clone();
                let api = api.clone();
                let limits = limits.clone();
                let body_memory = body_memory.clone();
                let shard = shard.clone();
                glommio::spawn_local(async move {
                    let closed = serve_connection(api, stream, limits, body_memory).await;
                    live.set(live.get() - 1);
                    shard
                        .metrics
                        .http_closed(closed.reason.as_str(), closed.client_gone);
                })
                .detach();
            }
            Err(e) => {
                tracing::warn!(error = %e, "HTTP accept failed");
                glommio::timer::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}
