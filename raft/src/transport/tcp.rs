//! The broker's [`Connection`]: glommio TCP, one connection per peer node, multiplexed.
//!
//! Outbound ([`TcpConnections`]): the first request to a peer opens a connection to the
//! address the resolver gives (the cluster metadata's), says [`Message::Hello`] with the local
//! node id and the peer's shard the connection is for (one `TcpConnections` per target shard),
//! and checks that the answer names the peer it meant to reach and repeats the shard (a node
//! restarted under another id at the same address is not talked to). Requests of all groups then share that
//! connection: each gets a request id, is queued whole for the connection's writer task (see
//! [`FrameWriter`]), and waits for the answer carrying its id, which a reader task routes back; answers arrive in any
//! order. At most `max_in_flight_per_peer` requests wait per connection; a request whose
//! caller gave up (openraft's timeout) stops waiting and frees its slot. When the connection
//! breaks, every waiting request fails and the next request reconnects. A connection that goes
//! quiet while requests wait is pinged (a hello, which the peer's handler answers: the node's
//! server answers it at once, with a hello, or with nothing of use once it is closing, which
//! still counts as hearing the connection) and taken for broken once it has read nothing for
//! `silence_timeout`: a peer
//! cut off by the network sends no reset, and without this its requests would wait out every
//! caller's own timeout (a forwarded queue call's 15 s) though its groups have long elected
//! leaders elsewhere. A connect that fails
//! makes the peer unreachable for a backoff that doubles per failed attempt, from
//! `backoff_min` to `backoff_max`, read from an injected clock; during it requests fail at once
//! without touching the network (openraft backs off on its own too).
//!
//! Inbound ([`serve`], or [`serve_stream`] for a connection accepted elsewhere, e.g. a Kafka
//! listener that recognised the hello): each connection must start with a hello; every later frame is
//! a request, handed to the handler (the node's [`Server`](super::network::Server)) in a task
//! of its own, at most `max_requests_per_connection` at once (past that the connection is not
//! read until one's answer is written), and its answer written back with the request's id.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures::future::Either;
use futures::io::{AsyncWrite, AsyncWriteExt};
use futures::lock::Mutex;
use futures::StreamExt;
use futures_channel::{mpsc, oneshot};
use glommio::net::{TcpListener, TcpStream};
use glommio::sync::Semaphore;

use super::codec::{Codec, Frame, Message, RequestId};
use super::network::{Connection, ConnectionError};
use crate::partition::BrokerId;

const READ_CHUNK_BYTES: usize = 64 * 1024;

/// Settings of a node's TCP connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpConfig {
    pub codec: Codec,
    pub connect_timeout: Duration,
    pub backoff_min: Duration,
    pub backoff_max: Duration,
    pub max_in_flight_per_peer: usize,
    pub max_requests_per_connection: usize,
    /// How long a connection with requests waiting may read nothing before it is taken for
    /// broken (its requests fail; the next one reconnects). It is pinged after a quarter of
    /// this, so a live peer always answers in time.
    pub silence_timeout: Duration,
}

impl Default for TcpConfig {
    fn default() -> Self {
        TcpConfig {
            codec: Codec::default(),
            connect_timeout: Duration::from_secs(1),
            backoff_min: Duration::from_millis(50),
            // A restarted peer is called again within this: its partitions' fail-over waits on
            // it (Kafka's `reconnect.backoff.max.ms` is 1 s). A connect attempt to a dead peer
            // twice a second costs nothing.
            backoff_max: Duration::from_millis(400),
            max_in_flight_per_peer: 4_096,
            max_requests_per_connection: 4_096,
            // Above any pause of a live peer's shard (a large fsync, a compaction of its
            // event loop), below the 10–15 s callers wait at most.
            silence_timeout: Duration::from_secs(3),
        }
    }
}

impl TcpConfig {
    /// How long a peer stays unreachable after its `failures`-th failed connect in a row.
    pub fn backoff(&self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(32);
        self.backoff_min
            .saturating_mul(1u32 << doublings.min(31))
            .min(self.backoff_max)
    }
}

/// Where a peer node listens, from the cluster metadata.
pub type Resolve = Box<dyn Fn(BrokerId) -> Option<SocketAddr>>;
/// The clock backoff is measured with.
pub type Clock = Rc<dyn Fn() -> Instant>;

/// Half of a TCP stream shared by a connection's reader and writers. All run on one thread and
/// borrow the stream only inside a poll call, so the `RefCell` never conflicts.
struct Half(Rc<RefCell<TcpStream>>);

impl AsyncWrite for Half {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.0.borrow_mut()).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0.borrow_mut()).poll_flush(cx)
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0.borrow_mut()).poll_close(cx)
    }
}

/// Reads what has arrived onto the end of `buf`: into its spare room if it has any, up to
/// [`READ_CHUNK_BYTES`], else into a new chunk of that size. The decoder reserves room for the
/// whole of a frame whose length it has read; reading past that room would move the frame (a
/// reallocation copying it, as large as an append of many entries) to make room for a chunk.
async fn read_some(stream: &Rc<RefCell<TcpStream>>, buf: &mut BytesMut) -> io::Result<usize> {
    let max = read_size(buf);
    futures::future::poll_fn(|cx| stream.borrow_mut().poll_read_buf(cx, buf, max)).await
}

/// How much [`read_some`] reads at most into `buf`.
fn read_size(buf: &BytesMut) -> usize {
    match buf.capacity() - buf.len() {
        0 => READ_CHUNK_BYTES,
        spare => spare.min(READ_CHUNK_BYTES),
    }
}

/// Frames at least this long are written as they are; shorter ones queued together are copied
/// into one buffer and leave in one write.
const COALESCE_BYTES: usize = 64 * 1024;

/// The writing side of a connection: frames are queued whole and written by one task. A caller
/// that gives up while its frame waits or is being written (openraft's RPC timeout drops the
/// request's future) cannot leave half a frame on the wire, after which the peer would read
/// the rest of the stream as garbage; and frames queued while a write is under way leave
/// together in the next one. The queue needs no bound of its own: what may wait in it is
/// bounded by the requests a connection lets in flight (`max_in_flight_per_peer`, each holding
/// its slot until answered) and by the answers it serves at once (`max_requests_per_connection`,
/// each holding its slot until written: [`FrameWriter::send`]'s `written`), so a peer that
/// stops reading cannot make it grow.
struct FrameWriter {
    queue: RefCell<Option<mpsc::UnboundedSender<Queued>>>,
}

/// A frame waiting to be written, and whom to tell once it is.
type Queued = (Bytes, Option<oneshot::Sender<()>>);

/// Tells the callers whose frames are written.
fn tell(written: &mut Vec<oneshot::Sender<()>>) {
    for done in written.drain(..) {
        let _ = done.send(());
    }
}

impl FrameWriter {
    /// Starts the writer task of `stream`; `on_error` runs once if a write fails.
    fn spawn(stream: Rc<RefCell<TcpStream>>, on_error: impl FnOnce() + 'static) -> FrameWriter {
        let (tx, mut rx) = mpsc::unbounded::<Queued>();
        glommio::spawn_local(async move {
            let mut w = Half(stream);
            let mut batch = BytesMut::new();
            let mut written: Vec<oneshot::Sender<()>> = Vec::new();
            while let Some(first) = rx.next().await {
                let mut next = Some(first);
                let result: io::Result<()> = async {
                    // `written` holds the callers of frames in `batch` or already written: each
                    // write that empties `batch` tells them.
                    while let Some((frame, done)) = next.take() {
                        if frame.len() >= COALESCE_BYTES {
                            if !batch.is_empty() {
                                w.write_all(&batch.split()).await?;
                            }
                            w.write_all(&frame).await?;
                            written.extend(done);
                            tell(&mut written);
                        } else {
                            batch.extend_from_slice(&frame);
                            written.extend(done);
                            if batch.len() >= COALESCE_BYTES {
                                w.write_all(&batch.split()).await?;
                                tell(&mut written);
                            }
                        }
                        next = rx.try_recv().ok();
                    }
                    if !batch.is_empty() {
                        w.write_all(&batch.split()).await?;
                    }
                    w.flush().await?;
                    tell(&mut written);
                    Ok(())
                }
                .await;
                if let Err(e) = result {
                    tracing::debug!(error = %e, "a raft connection's write failed");
                    on_error();
                    return;
                }
            }
        })
        .detach();
        FrameWriter {
            queue: RefCell::new(Some(tx)),
        }
    }

    /// Queues a whole frame, and tells `written` (if any) once it is on the socket (dropped
    /// unsent if the write fails); false if the writer has stopped (a failed write, or closed).
    fn send(&self, frame: Bytes, written: Option<oneshot::Sender<()>>) -> bool {
        self.queue
            .borrow()
            .as_ref()
            .is_some_and(|q| q.unbounded_send((frame, written)).is_ok())
    }

    /// Lets the writer end once what is queued is written.
    fn close(&self) {
        self.queue.borrow_mut().take();
    }
}

/// One open outbound connection.
struct Wire {
    stream: Rc<RefCell<TcpStream>>,
    writer: FrameWriter,
    pending: RefCell<HashMap<u64, oneshot::Sender<Message>>>,
    next_id: Cell<u64>,
    closed: Cell<bool>,
    /// Stops the reader task, which drops its hold on the socket.
    stop_reader: RefCell<Option<oneshot::Sender<()>>>,
    /// The last time something was read, or requests began waiting on an idle connection.
    heard: Cell<Instant>,
    clock: Clock,
}

impl Wire {
    /// Fails every waiting request (their senders are dropped), refuses new ones and stops the
    /// reader; the socket closes when the last request holding the connection is done.
    fn close(&self) {
        self.closed.set(true);
        self.writer.close();
        self.pending.borrow_mut().clear();
        if let Some(stop) = self.stop_reader.borrow_mut().take() {
            let _ = stop.send(());
        }
    }

    async fn request(&self, config: &TcpConfig, message: Message) -> Result<Message, ConnectionError> {
        if self.closed.get() {
            return Err(ConnectionError::Network("connection closed".into()));
        }
        if self.pending.borrow().len() >= config.max_in_flight_per_peer {
            return Err(ConnectionError::Unreachable("too many requests in flight".into()));
        }
        let id = self.next_id.get();
        self.next_id.set(id.wrapping_add(1));
        let bytes = config
            .codec
            .encode_to_bytes(&Frame {
                request_id: RequestId(id),
                message,
            })
            .map_err(|e| ConnectionError::Network(e.to_string()))?;
        let (tx, rx) = oneshot::channel();
        {
            let mut pending = self.pending.borrow_mut();
            if pending.is_empty() {
                // Silence is counted from now: an idle connection had nothing to hear.
                self.heard.set((self.clock)());
            }
            pending.insert(id, tx);
        }
        // Whether answered, failed or abandoned, the request leaves the table.
        let _forget = Forget { wire: self, id };
        if !self.writer.send(bytes, None) {
            self.close();
            return Err(ConnectionError::Network("the connection's writer stopped".into()));
        }
        rx.await
            .map_err(|_| ConnectionError::Network("connection closed".into()))
    }
}

/// Pings `wire` while requests wait on it and nothing is read, and closes it once it has read
/// nothing for `config.silence_timeout`; ends when the wire closes.
async fn watch_silence(
    wire: std::rc::Weak<Wire>,
    config: TcpConfig,
    peer: BrokerId,
    local: BrokerId,
    shard: u16,
) {
    let tick = (config.silence_timeout / 4).max(Duration::from_millis(10));
    let ping = config
        .codec
        .encode_to_bytes(&Frame {
            // Answers are routed by id; no request waits on this one.
            request_id: RequestId(u64::MAX),
            message: Message::Hello { node: local, shard },
        })
        .ok();
    loop {
        glommio::timer::sleep(tick).await;
        let Some(wire) = wire.upgrade() else {
            return;
        };
        if wire.closed.get() {
            return;
        }
        if wire.pending.borrow().is_empty() {
            continue;
        }
        let quiet = (wire.clock)().saturating_duration_since(wire.heard.get());
        if quiet >= config.silence_timeout {
            tracing::warn!(
                %peer,
                waiting = wire.pending.borrow().len(),
                quiet_ms = quiet.as_millis() as u64,
                "a node connection read nothing while requests waited; closing it"
            );
            wire.close();
            return;
        }
        if quiet >= tick {
            if let Some(ping) = &ping {
                let _ = wire.writer.send(ping.clone(), None);
            }
        }
    }
}

struct Forget<'a> {
    wire: &'a Wire,
    id: u64,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        self.wire.pending.borrow_mut().remove(&self.id);
    }
}

/// Routes answers to their requests until the connection breaks, sends garbage or is closed.
async fn read_answers(wire: Rc<Wire>, codec: Codec, mut stop: oneshot::Receiver<()>) {
    let mut buf = BytesMut::new();
    loop {
        loop {
            match codec.decode_from(&mut buf) {
                Ok(Some(frame)) => {
                    let waiter = wire.pending.borrow_mut().remove(&frame.request_id.0);
                    if let Some(tx) = waiter {
                        let _ = tx.send(frame.message);
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!("closing a raft connection: {e}");
                    wire.close();
                    return;
                }
            }
        }
        let read = std::pin::pin!(read_some(&wire.stream, &mut buf));
        match futures::future::select(read, &mut stop).await {
            Either::Left((Ok(n), _)) if n > 0 => wire.heard.set((wire.clock)()),
            Either::Left(_) | Either::Right(_) => {
                wire.close();
                return;
            }
        }
    }
}

#[derive(Default)]
struct Link {
    connect: Mutex<()>,
    up: RefCell<Option<Rc<Wire>>>,
    failures: Cell<u32>,
    retry_at: Cell<Option<Instant>>,
}

impl Link {
    /// The open connection; a closed one is let go.
    fn open_wire(&self) -> Option<Rc<Wire>> {
        let mut up = self.up.borrow_mut();
        if up.as_ref().is_some_and(|w| w.closed.get()) {
            *up = None;
        }
        up.clone()
    }
}

/// A node's outbound connections, one per peer.
pub struct TcpConnections {
    local: BrokerId,
    /// The peers' shard this node's connections are for (named in the hello).
    target_shard: u16,
    resolve: Resolve,
    clock: Clock,
    config: TcpConfig,
    links: RefCell<HashMap<BrokerId, Rc<Link>>>,
}

impl TcpConnections {
    pub fn new(local: BrokerId, resolve: Resolve, clock: Clock, config: TcpConfig) -> Self {
        assert!(config.max_in_flight_per_peer > 0, "requests need a slot");
        TcpConnections {
            local,
            target_shard: 0,
            resolve,
            clock,
            config,
            links: RefCell::new(HashMap::new()),
        }
    }

    /// Connections for the peers' shard `shard` (0 unless set).
    pub fn with_target_shard(mut self, shard: u16) -> Self {
        self.target_shard = shard;
        self
    }

    fn link(&self, peer: BrokerId) -> Rc<Link> {
        Rc::clone(self.links.borrow_mut().entry(peer).or_default())
    }

    fn backing_off(&self, link: &Link) -> bool {
        link.retry_at.get().is_some_and(|at| (self.clock)() < at)
    }

    async fn wire(&self, peer: BrokerId) -> Result<Rc<Wire>, ConnectionError> {
        let link = self.link(peer);
        if let Some(w) = link.open_wire() {
            return Ok(w);
        }
        if self.backing_off(&link) {
            return Err(ConnectionError::Unreachable(format!("backing off from {peer}")));
        }
        let _connecting = link.connect.lock().await;
        // Another request may have connected, or failed to, while this one waited.
        if let Some(w) = link.open_wire() {
            return Ok(w);
        }
        if self.backing_off(&link) {
            return Err(ConnectionError::Unreachable(format!("backing off from {peer}")));
        }
        match self.open(peer).await {
            Ok(w) => {
                link.failures.set(0);
                link.retry_at.set(None);
                *link.up.borrow_mut() = Some(Rc::clone(&w));
                Ok(w)
            }
            Err(why) => {
                let failures = link.failures.get().saturating_add(1);
                link.failures.set(failures);
                link.retry_at
                    .set(Some((self.clock)() + self.config.backoff(failures)));
                Err(ConnectionError::Unreachable(why))
            }
        }
    }

    async fn open(&self, peer: BrokerId) -> Result<Rc<Wire>, String> {
        let addr = (self.resolve)(peer).ok_or_else(|| format!("no address for node {peer}"))?;
        let stream = TcpStream::connect_timeout(addr, self.config.connect_timeout)
            .await
            .map_err(|e| format!("connecting to node {peer} at {addr}: {e}"))?;
        let _ = stream.set_nodelay(true);
        let (stop_tx, stop_rx) = oneshot::channel();
        let stream = Rc::new(RefCell::new(stream));
        let wire = Rc::new_cyclic(|me: &std::rc::Weak<Wire>| {
            let me = me.clone();
            Wire {
                writer: FrameWriter::spawn(Rc::clone(&stream), move || {
                    if let Some(w) = me.upgrade() {
                        w.close();
                    }
                }),
                stream,
                pending: RefCell::new(HashMap::new()),
                next_id: Cell::new(0),
                closed: Cell::new(false),
                stop_reader: RefCell::new(Some(stop_tx)),
                heard: Cell::new((self.clock)()),
                clock: Rc::clone(&self.clock),
            }
        });
        glommio::spawn_local(read_answers(Rc::clone(&wire), self.config.codec, stop_rx)).detach();
        glommio::spawn_local(watch_silence(
            Rc::downgrade(&wire),
            self.config,
            peer,
            self.local,
            self.target_shard,
        ))
        .detach();
        let hello = wire
            .request(
                &self.config,
                Message::Hello {
                    node: self.local,
                    shard: self.target_shard,
                },
            )
            .await;
        match hello {
            Ok(Message::Hello { node, shard }) if node == peer && shard == self.target_shard => Ok(wire),
            other => {
                wire.close();
                Err(format!("node {peer} at {addr} answered hello with {other:?}"))
            }
        }
    }
}

impl Connection for TcpConnections {
    async fn call(&self, peer: BrokerId, request: Message) -> Result<Message, ConnectionError> {
        let wire = self.wire(peer).await?;
        wire.request(&self.config, request).await
    }
}

/// Accepts peers' connections on `listener` and answers their requests with `handler`, until
/// accepting fails.
pub async fn serve<H, F>(
    listener: TcpListener,
    local: BrokerId,
    config: TcpConfig,
    handler: Rc<H>,
) -> io::Error
where
    H: Fn(BrokerId, Message) -> F + 'static,
    F: Future<Output = Message> + 'static,
{
    loop {
        match listener.accept().await {
            Ok(stream) => {
                glommio::spawn_local(serve_stream(
                    stream,
                    BytesMut::new(),
                    local,
                    config,
                    Rc::clone(&handler),
                ))
                .detach();
            }
            Err(e) => return io::Error::other(e.to_string()),
        }
    }
}

/// Serves one peer's connection, whose first `received` bytes were already read from it (a
/// listener that looked at the first frame to tell a peer from a Kafka client), until it
/// closes or sends something unacceptable. The hello is answered with the shard it named:
/// which shard serves a connection is the caller's choice.
pub async fn serve_stream<H, F>(
    stream: TcpStream,
    received: BytesMut,
    local: BrokerId,
    config: TcpConfig,
    handler: Rc<H>,
) where
    H: Fn(BrokerId, Message) -> F + 'static,
    F: Future<Output = Message> + 'static,
{
    let _ = stream.set_nodelay(true);
    let stream = Rc::new(RefCell::new(stream));
    // A failed write breaks the stream: the reads below fail then too, and the loop ends.
    let writer = Rc::new(FrameWriter::spawn(Rc::clone(&stream), || {}));
    let slots = Rc::new(Semaphore::new(config.max_requests_per_connection as u64));
    let codec = config.codec;
    let mut buf = received;
    let mut peer: Option<BrokerId> = None;
    loop {
        let frame = match codec.decode_from(&mut buf) {
            Ok(Some(frame)) => frame,
            Ok(None) => match read_some(&stream, &mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => continue,
            },
            Err(e) => {
                tracing::warn!("closing a raft connection from {peer:?}: {e}");
                return;
            }
        };
        let Some(from) = peer else {
            let Message::Hello { node, shard } = frame.message else {
                tracing::warn!("closing a raft connection that did not start with a hello");
                return;
            };
            peer = Some(node);
            let answer = Frame {
                request_id: frame.request_id,
                message: Message::Hello { node: local, shard },
            };
            let Ok(bytes) = codec.encode_to_bytes(&answer) else {
                return;
            };
            if !writer.send(bytes, None) {
                return;
            }
            continue;
        };
        let Ok(permit) = slots.acquire_static_permit(1).await else {
            return;
        };
        let handler = Rc::clone(&handler);
        let writer = Rc::clone(&writer);
        glommio::spawn_local(async move {
            let answer = handler(from, frame.message).await;
            let frame = Frame {
                request_id: frame.request_id,
                message: answer,
            };
            match codec.encode_to_bytes(&frame) {
                Ok(bytes) => {
                    // The slot is held until the answer is written: a peer that stops reading
                    // stops being served.
                    let (written_tx, written_rx) = oneshot::channel();
                    if writer.send(bytes, Some(written_tx)) {
                        let _ = written_rx.await;
                    }
                }
                Err(e) => tracing::warn!("an answer to node {from} does not fit a frame: {e}"),
            }
            drop(permit);
        })
        .detach();
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests;
