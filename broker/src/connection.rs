//! One Kafka connection: read frames, start each request in arrival order, run them
//! concurrently, and write responses in request order (clients pipeline and match responses by
//! order as well as by correlation id). Starting a produce request includes sending its appends
//! to the owner shards, so a client's appends to a partition follow its send order whichever
//! shard owns it.
//!
//! Bounds: a frame larger than `socket.request.max.bytes` closes the connection before its body
//! is read, and a frame's memory (twice its size for a Produce) is reserved from the shard's
//! request-memory budget (`strand.request.memory.bytes`, which HTTP bodies share) before its
//! body is read, into a buffer of exactly its size (see [`read_loop`]); at most
//! `strand.max.inflight.requests.per.connection` responses are pending, after which the
//! connection stops reading; at most one Fetch or ShareFetch is between its decoding and the end
//! of writing its answer (a pipelined one waits, and the connection's reading with it, as in
//! Kafka), so a shard holds at most one answer of up to `fetch.max.bytes` per connection; at
//! most `strand.max.connections.per.shard` connections per shard.
//!
//! **Responses** are lists of pieces written one after the other. A piece that is a region of a
//! segment file (a Fetch's records far behind the log's end, `strand.fetch.sendfile`) goes out
//! with `sendfile(2)` on the shard's blocking thread ([`send_region`]), so the shard never waits
//! for the disk; the thread's result comes back through glommio's own channel, whose result slot
//! has a mutex that only that thread and the shard touch, one after the other.
//!
//! **Migration.** The kernel spreads connections over shards (SO_REUSEPORT) without knowing
//! which partitions they will use, so a producer or consumer of one partition lands on another
//! shard half the time with two shards, and each of its requests then crosses shards twice:
//! there and back, waking both executors every time. A connection whose last
//! [`MIGRATE_AFTER_REQUESTS`] produce (acks ≠ 0) or fetch requests were all for partitions of
//! one other shard moves there ([`Affinity`]; BENCHMARKS.md#connection-migration): it stops
//! reading, writes every pending response, and hands a duplicate of its socket's descriptor
//! (`pidfd_getfd` on this process: no `unsafe`) and the bytes it read but did not serve to that
//! shard over the router, behind every request it sent there before ([`hand_over`]); that shard
//! serves the connection from then on. The fetch sessions (KIP-227) the connection used leave
//! this shard's cache with it and join the other shard's, so consumers that open sessions move
//! too. Connections stay where they are once they used an API that keeps state on the
//! connection's shard or that this rule does not know (share sessions, group requests: see
//! [`Affinity::request`]), or produced with acks=0 (nothing tells when their appends reached the
//! owner, so a move could reorder them). A connection moves at most 16 times. If a move fails
//! (the other shard refuses, the descriptor cannot be duplicated), the connection stays for
//! good, perhaps without its fetch sessions (the client is told they are unknown and opens new
//! ones); if the other shard's answer never comes, the connection is closed here, since that
//! shard may be serving it. `strand_connection_migrations_total` counts the moves.

use std::cell::{Cell, RefCell};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use futures::{AsyncWrite, AsyncWriteExt};
use glommio::channels::local_channel;
use glommio::net::TcpStream;
use glommio::sync::{Semaphore, StaticPermit};
use kafka_protocol::messages::ApiKey;
use strand_protocol::fetch_frame::Piece;
use strand_protocol::frame::{peek_frame_size, FrameError, MIN_REQUEST_FRAME_BYTES};
use strand_protocol::header::{decode_request_header, RawHeader};
use strand_storage::FileRegion;

use futures::future::LocalBoxFuture;
use futures::FutureExt;
use strand_protocol::types::ShardId;

use crate::config::Config;
use crate::fetch_session::MovedSession;
use crate::handlers::conn_info::{Affinity, ConnInfo, MIGRATE_AFTER_REQUESTS};
use crate::handlers::{self, Dispatched, RequestCtx};
use crate::shard::service::Service;
use crate::shard::Shard;
use crate::subsystems::Subsystems;

/// Half of a TCP stream shared by the connection's reader and writer tasks. Both run on one
/// thread and borrow the stream only inside a poll call, so the `RefCell` never conflicts.
struct Half(Rc<RefCell<TcpStream>>);

impl Half {
    /// Reads at most `max` bytes onto the end of `buf` without zeroing the space first (a
    /// patched glommio call): zeroing it cost a `memset` of every received byte, ~6 % of the
    /// broker's CPU at one partition's produce peak (BENCHMARKS.md#read-into-spare-capacity).
    async fn read_buf(&mut self, buf: &mut BytesMut, max: usize) -> io::Result<usize> {
        futures::future::poll_fn(|cx| self.0.borrow_mut().poll_read_buf(cx, buf, max)).await
    }
}

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

const READ_CHUNK_BYTES: usize = 64 * 1024;

/// A response slot: the task computing the encoded response frame, and for a fetch the
/// connection's fetch slot, held until the response is written.
struct Pending {
    response: glommio::task::JoinHandle<Option<handlers::Frame>>,
    _fetch_slot: Option<StaticPermit>,
}

/// APIs whose answers can be as large as `fetch.max.bytes`: a connection has at most one of
/// them between decoding and the end of writing its answer, as in Kafka, which reads no
/// further request from a connection until its answer is sent. Pipelined fetches wait (and
/// so does the connection's reading), so the answers a shard holds stay within one per
/// connection however many requests a client sends without reading.
fn needs_fetch_slot(api: ApiKey) -> bool {
    matches!(api, ApiKey::Fetch | ApiKey::ShareFetch)
}

/// A shard's Kafka connections: how many are open, the memory their requests may hold, and the
/// subsystems their requests reach. Its service takes over connections other shards hand over.
pub(crate) struct Connections {
    subsystems: Rc<Subsystems>,
    live: Cell<usize>,
    max: usize,
    request_memory: Rc<Semaphore>,
}

impl Connections {
    pub(crate) fn new(subsystems: Rc<Subsystems>) -> Self {
        let config = &subsystems.core.config;
        Connections {
            live: Cell::new(0),
            max: config.max_connections_per_shard as usize,
            request_memory: Rc::new(Semaphore::new(request_memory_bytes(config))),
            subsystems,
        }
    }

    fn core(&self) -> &Rc<Shard> {
        &self.subsystems.core
    }

    /// The shard's request memory, which HTTP bodies share.
    pub(crate) fn request_memory(&self) -> Rc<Semaphore> {
        self.request_memory.clone()
    }

    /// Refuses further request memory (shutdown): waiting readers end.
    pub(crate) fn close(&self) {
        self.request_memory.close();
    }
}

/// The request bytes all connections of a shard may hold, Kafka frames and HTTP bodies together
/// (`strand.request.memory.bytes`), and at least what the largest request of either needs.
fn request_memory_bytes(config: &Config) -> u64 {
    config
        .request_memory_bytes
        .max(2 * u64::from(config.socket_request_max_bytes))
        .max(u64::from(config.http_max_body_bytes))
}

/// The request memory a Kafka frame of `size` bytes reserves: a Produce's records are copied
/// into the owners' staging buffers while the request waits for its answer, and its frame is
/// freed only once every copy is made, so it counts twice.
fn frame_charge(api_key: i16, size: usize) -> u64 {
    let size = size as u64;
    if api_key == ApiKey::Produce as i16 {
        2 * size
    } else {
        size
    }
}

/// A connection handed to another shard: its socket and the bytes read but not yet served.
pub(crate) struct Migrating {
    fd: OwnedFd,
    listener: usize,
    received: Vec<u8>,
    moves: u32,
    /// The fetch sessions it used, taken from this shard's cache.
    sessions: Vec<MovedSession>,
}

/// Received bytes: `buf` holds the bytes read from the socket but not yet taken as frames;
/// reads append to it, into its spare capacity.
struct Input {
    buf: BytesMut,
}

impl Input {
    fn new(received: &[u8]) -> Self {
        let mut buf = BytesMut::with_capacity(READ_CHUNK_BYTES.max(received.len()));
        buf.extend_from_slice(received);
        Input { buf }
    }
}

/// Why the read loop stopped.
enum ReadEnd {
    /// The peer closed (`None`) or the connection must close for this reason.
    Close(Option<&'static str>),
    /// Hand the connection to this shard.
    Move(ShardId),
    /// Another node's replication transport (its hello is at the front of the input).
    Peer,
}

/// Serves one accepted connection until the peer closes it or sends something unacceptable.
pub(crate) async fn accepted(conns: Rc<Connections>, stream: TcpStream, listener: usize) {
    if conns.live.get() >= conns.max {
        tracing::warn!(
            limit = conns.max,
            "connection limit reached; refusing a connection"
        );
        conns.core().metrics.bad_request("connection limit");
        return;
    }
    let _ = stream.set_nodelay(true);
    serve(conns, stream, listener, Vec::new(), 0, Vec::new()).await;
}

impl Service for Connections {
    type Request = Box<Migrating>;
    /// Whether the connection was taken over.
    type Response = bool;

    fn start(self: Rc<Self>, m: Box<Migrating>) -> LocalBoxFuture<'static, bool> {
        let adopted = adopt(&self, *m);
        async move { adopted }.boxed_local()
    }
}

/// Takes over a connection another shard handed over (see the module docs); `false` if this
/// shard cannot (connection limit, shutting down), and the other shard keeps serving it.
fn adopt(conns: &Rc<Connections>, m: Migrating) -> bool {
    let shard = conns.core();
    if shard.shutting_down.get() || conns.live.get() >= conns.max {
        return false;
    }
    let Migrating {
        fd,
        listener,
        received,
        moves,
        sessions,
    } = m;
    let stream = TcpStream::from(socket2::Socket::from(std::net::TcpStream::from(fd)));
    let mut ids = Vec::with_capacity(sessions.len());
    {
        let mut cache = conns.subsystems.fetch_sessions.cache.borrow_mut();
        for s in sessions {
            let id = s.id();
            if cache.adopt(s) {
                ids.push(id);
            }
        }
        shard.metrics.fetch_sessions(cache.len());
    }
    glommio::spawn_local(serve(conns.clone(), stream, listener, received, moves, ids)).detach();
    true
}

async fn serve(
    conns: Rc<Connections>,
    stream: TcpStream,
    listener: usize,
    received: Vec<u8>,
    moves: u32,
    sessions: Vec<i32>,
) {
    let peer = stream.peer_addr().ok();
    let shard = conns.core();
    shard.metrics.connection_opened();
    let connections = &conns;
    connections.live.set(connections.live.get() + 1);
    let stream = Rc::new(RefCell::new(stream));
    let conn = Rc::new(ConnInfo::new(
        listener,
        peer,
        Affinity::new(MIGRATE_AFTER_REQUESTS, moves),
        sessions,
    ));
    let inflight = usize::try_from(shard.config.max_inflight_requests_per_connection)
        .unwrap_or(256)
        .max(1);
    let mut input = Input::new(&received);
    drop(received);
    loop {
        let (tx, rx) = local_channel::new_bounded::<Pending>(inflight);
        let writer = glommio::spawn_local(write_loop(shard.clone(), Half(stream.clone()), rx));
        let end = read_loop(&conns, Half(stream.clone()), &conn, &tx, &mut input).await;
        drop(tx);
        // Every pending response is written before the connection closes or moves.
        let written = writer.await;
        match end {
            ReadEnd::Close(reason) => {
                if let Some(reason) = reason {
                    tracing::debug!(?peer, reason, "closing connection");
                }
                break;
            }
            ReadEnd::Peer => {
                serve_peer(&conns, stream, &input).await;
                connections.live.set(connections.live.get().saturating_sub(1));
                shard.metrics.connection_closed();
                return;
            }
            ReadEnd::Move(_) if !written => break,
            ReadEnd::Move(to) => match hand_over(&conns, &stream, to, listener, &conn, &input).await {
                Handover::Moved => {
                    tracing::debug!(?peer, from = shard.id.0, to = to.0, "connection moved");
                    shard.metrics.connection_migrated();
                    break;
                }
                Handover::Stays(e) => {
                    tracing::debug!(?peer, to = to.0, error = %e, "cannot move a connection; it stays");
                    conn.affinity.pin();
                }
                Handover::Unknown(e) => {
                    // The other shard may be serving it: closing here is the only safe move.
                    tracing::warn!(?peer, to = to.0, error = %e, "connection hand-over unanswered; closing it here");
                    break;
                }
            },
        }
    }
    // Dropping the last handle closes this descriptor (a moved connection lives on in the
    // other shard's duplicate).
    drop(stream);
    connections.live.set(connections.live.get().saturating_sub(1));
    shard.metrics.connection_closed();
}

/// Hands a node's replication connection to the replication subsystem of the shard its hello
/// names: this one, or another through the router (the socket's duplicate and the bytes read).
async fn serve_peer(conns: &Rc<Connections>, stream: Rc<RefCell<TcpStream>>, input: &Input) {
    let shard = conns.core();
    let Some(replication) = conns.subsystems.replication.clone() else {
        tracing::warn!("a node connected for replication, but this node is not in a cluster; closing it");
        return;
    };
    let codec = strand_raft::transport::codec::Codec::default();
    let Some((node, target)) = crate::replication::net::peek_hello(&input.buf, codec) else {
        tracing::warn!("closing a node connection whose hello does not decode");
        return;
    };
    let Ok(stream) = Rc::try_unwrap(stream).map(RefCell::into_inner) else {
        tracing::warn!("a node connection's socket is still shared; closing it");
        return;
    };
    let received = BytesMut::from(&input.buf[..]);
    if target == shard.id.0 {
        replication.manager.serve_peer(stream, received).await;
        return;
    }
    if target >= shard.shards {
        tracing::warn!(node = %node, target, "a node asked for a shard this node does not have; closing it");
        return;
    }
    let fd = match duplicate(stream.as_raw_fd()) {
        Ok(fd) => fd,
        Err(e) => {
            tracing::warn!(error = %e, "cannot hand a node connection to its shard; closing it");
            return;
        }
    };
    let m = Box::new(crate::replication::PeerConnection {
        fd,
        received: received.to_vec(),
    });
    match shard
        .call::<crate::replication::Replication>(
            ShardId(target),
            crate::replication::ReplicationCall::Peer(m),
        )
        .await
    {
        Ok(answer) => {
            if !matches!(answer.await, Ok(true)) {
                tracing::warn!(target, "the shard did not take a node connection");
            }
        }
        Err(e) => tracing::warn!(target, error = ?e, "cannot hand a node connection to its shard"),
    }
}

/// How a hand-over ended.
enum Handover {
    /// The other shard serves the connection now.
    Moved,
    /// It stays here (the other shard refused, or the descriptor could not be duplicated).
    Stays(String),
    /// Sent, but no answer came back: the other shard may or may not serve it.
    Unknown(String),
}

/// Set when this process cannot duplicate descriptors (`pidfd_getfd` refused, e.g. by a seccomp
/// profile without CAP_SYS_PTRACE): connections stop trying to move.
static MOVES_UNAVAILABLE: AtomicBool = AtomicBool::new(false);

/// A duplicate of our own descriptor `raw`: pidfd_getfd on this process. No `unsafe`, and a
/// wrong number could only name another of our descriptors, never memory.
fn duplicate(raw: i32) -> Result<OwnedFd, String> {
    use rustix::process::{getpid, pidfd_getfd, pidfd_open, PidfdFlags, PidfdGetfdFlags};
    let dup = pidfd_open(getpid(), PidfdFlags::empty())
        .map_err(|e| format!("pidfd_open: {e}"))
        .and_then(|me| {
            pidfd_getfd(&me, raw, PidfdGetfdFlags::empty()).map_err(|e| format!("pidfd_getfd: {e}"))
        });
    if let Err(e) = &dup {
        if !MOVES_UNAVAILABLE.swap(true, Ordering::Relaxed) {
            tracing::warn!(error = %e, "cannot duplicate socket descriptors; connections will stay on the shard that accepted them");
        }
    }
    dup
}

/// Gives the connection to shard `to`: a duplicate of the socket's descriptor and the bytes read
/// but not served. Sent through the router, behind every request this shard sent there before.
async fn hand_over(
    conns: &Rc<Connections>,
    stream: &Rc<RefCell<TcpStream>>,
    to: ShardId,
    listener: usize,
    conn: &ConnInfo,
    input: &Input,
) -> Handover {
    let shard = conns.core();
    let fd = match duplicate(stream.borrow().as_raw_fd()) {
        Ok(fd) => fd,
        Err(e) => return Handover::Stays(e),
    };
    let received = input.buf.to_vec();
    // Its fetch sessions go with it. Should the other shard refuse the connection, they are
    // lost: the client is told its session is unknown and opens a new one.
    let sessions = {
        let mut cache = conns.subsystems.fetch_sessions.cache.borrow_mut();
        let taken = conn
            .sessions
            .take()
            .into_iter()
            .filter_map(|id| cache.take(id))
            .collect();
        shard.metrics.fetch_sessions(cache.len());
        taken
    };
    let m = Box::new(Migrating {
        fd,
        listener,
        received,
        moves: conn.affinity.moves.saturating_add(1),
        sessions,
    });
    // A failed send drops the message, and with it the duplicate: nobody else has the socket.
    let answer = match shard.call::<Connections>(to, m).await {
        Ok(fut) => fut.await,
        Err(e) => return Handover::Stays(format!("{e:?}")),
    };
    match answer {
        Ok(true) => Handover::Moved,
        Ok(false) => Handover::Stays("the shard refused it".into()),
        Err(e) => Handover::Unknown(format!("{e:?}")),
    }
}

/// Reads and starts requests until the connection closes or should move.
///
/// Every frame's memory is reserved from the shard's request memory before its body is read or
/// copied, and every frame is a buffer of exactly its own size: a small frame (up to
/// [`SMALL_FRAME_BYTES`]) is copied out of the connection's input buffer, so no request in
/// flight keeps that buffer alive; a larger one is read straight into a buffer allocated for it
/// once its memory is reserved. The input buffer never grows, so a connection holds
/// [`READ_CHUNK_BYTES`] besides its reserved frames, waiting for memory or not.
async fn read_loop(
    conns: &Rc<Connections>,
    mut reader: Half,
    conn: &Rc<ConnInfo>,
    tx: &local_channel::LocalSender<Pending>,
    input: &mut Input,
) -> ReadEnd {
    let shard = conns.core();
    let max_frame = shard.config.socket_request_max_bytes as usize;
    let request_memory = &conns.request_memory;
    let Input { buf } = input;
    let fetch_slot = Rc::new(Semaphore::new(1));
    let mut first = true;
    loop {
        loop {
            // A node's replication transport, not a Kafka client: its hello frame reads as
            // api key 0x010D, which no Kafka API has (see `replication::net`).
            if first
                && buf.len() >= 6
                && crate::replication::net::is_node_hello(buf.get(4..).unwrap_or_default())
            {
                match peek_frame_size(buf, PEER_HELLO_MAX_BYTES) {
                    Ok(Some(size)) if buf.len() >= 4 + size => return ReadEnd::Peer,
                    Ok(_) => break,
                    Err(_) => return ReadEnd::Close(Some("oversized node hello")),
                }
            }
            // A cluster node serves clients once it has the cluster metadata, as a Kafka broker
            // enables its client listeners once it has caught up with the metadata log: a node
            // that just restarted would answer that it knows no topic, and clients connected
            // to it would keep asking it rather than the nodes that know.
            if first
                && buf.len() >= 6
                && conns.subsystems.replication.is_some()
                && shard.cluster_state().is_none()
            {
                metrics::counter!("strand_connections_refused_total", "reason" => "no cluster metadata yet")
                    .increment(1);
                return ReadEnd::Close(Some("no cluster metadata yet"));
            }
            // Its next request is not served: the client is to ask other nodes for metadata.
            if conn.hung_up() {
                metrics::counter!("strand_connections_closed_total", "reason" => "leader cut off")
                    .increment(1);
                return ReadEnd::Close(Some("a partition leader here is cut off from its replicas"));
            }
            if shard.leaderships_handed_over.get() && buf.len() >= 6 {
                metrics::counter!("strand_connections_closed_total", "reason" => "shutting down")
                    .increment(1);
                return ReadEnd::Close(Some("leaderships handed over on shutdown"));
            }
            if let Some(to) = conn
                .affinity
                .move_to(shard.id, !MOVES_UNAVAILABLE.load(Ordering::Relaxed))
            {
                return ReadEnd::Move(to);
            }
            // An oversized frame is refused from its size prefix, before any of its body is read.
            let size = match peek_frame_size(buf, max_frame) {
                Ok(Some(size)) => size,
                Ok(None) => break,
                Err(e) => return ReadEnd::Close(Some(frame_error(shard, conn, e))),
            };
            // A frame is charged once its header has arrived: a small one whole, a large one's
            // api key (its body is read only once the charge is reserved).
            let needed = if size <= SMALL_FRAME_BYTES {
                4 + size
            } else {
                4 + MIN_REQUEST_FRAME_BYTES
            };
            if buf.len() < needed {
                break;
            }
            let api_key = buf.get(4..).and_then(RawHeader::peek).map_or(-1, |h| h.api_key);
            let charge = frame_charge(api_key, size);
            let permit = match request_memory.acquire_static_permit(charge).await {
                Ok(p) => p,
                Err(_) => return ReadEnd::Close(Some("shutting down")),
            };
            buf.advance(4);
            let frame = if size <= SMALL_FRAME_BYTES {
                // A copy: a slice would keep the whole input buffer alive while it is served.
                let frame = Bytes::copy_from_slice(buf.get(..size).unwrap_or_default());
                buf.advance(size);
                frame
            } else {
                match read_large_frame(&mut reader, buf, size).await {
                    Ok(frame) => frame,
                    Err(end) => return end,
                }
            };
            first = false;
            match start_request(conns, conn, frame, permit, &fetch_slot).await {
                Ok(Some(pending)) => {
                    if tx.send(pending).await.is_err() {
                        return ReadEnd::Close(Some("writer gone"));
                    }
                }
                Ok(None) => {}
                Err(reason) => return ReadEnd::Close(Some(reason)),
            }
        }
        // Read more into the input buffer: what is left of it holds less than one small frame,
        // so there is room.
        make_room(buf);
        debug_assert!(buf.len() < READ_CHUNK_BYTES);
        let n = match reader
            .read_buf(buf, READ_CHUNK_BYTES.saturating_sub(buf.len()))
            .await
        {
            Ok(n) => n,
            Err(_) => return ReadEnd::Close(Some("read error")),
        };
        if n == 0 {
            return ReadEnd::Close(None);
        }
    }
}

/// A node hello is a few bytes; a larger frame that starts like one closes the connection.
const PEER_HELLO_MAX_BYTES: usize = 64;

/// Frames up to this size are read into the connection's input buffer (with their size prefix)
/// and copied out; larger ones get a buffer of their own.
const SMALL_FRAME_BYTES: usize = READ_CHUNK_BYTES - 4;

/// Moves what `buf` holds (less than [`READ_CHUNK_BYTES`]) to the front of its allocation, or
/// into a new one of [`READ_CHUNK_BYTES`] where that would overlap, so that it can take
/// [`READ_CHUNK_BYTES`] in all without growing.
fn make_room(buf: &mut BytesMut) {
    let want = READ_CHUNK_BYTES.saturating_sub(buf.len());
    if buf.capacity() - buf.len() >= want || buf.try_reclaim(want) {
        return;
    }
    let mut fresh = BytesMut::with_capacity(READ_CHUNK_BYTES.max(buf.len()));
    fresh.extend_from_slice(buf);
    *buf = fresh;
}

/// Reads the body of a frame larger than [`SMALL_FRAME_BYTES`] (its size prefix is at the front
/// of `buf`, already consumed by the caller) into a buffer of exactly `size` bytes: first what
/// `buf` holds of it, then straight from the socket, never past the frame's end.
async fn read_large_frame(reader: &mut Half, buf: &mut BytesMut, size: usize) -> Result<Bytes, ReadEnd> {
    let mut frame = BytesMut::with_capacity(size);
    let have = buf.len().min(size);
    frame.extend_from_slice(buf.get(..have).unwrap_or_default());
    buf.advance(have);
    while frame.len() < size {
        let rest = size - frame.len();
        match reader.read_buf(&mut frame, rest).await {
            Ok(0) => return Err(ReadEnd::Close(None)),
            Ok(_) => {}
            Err(_) => return Err(ReadEnd::Close(Some("read error"))),
        }
    }
    Ok(frame.freeze())
}

fn frame_error(shard: &Shard, conn: &ConnInfo, e: FrameError) -> &'static str {
    let reason = match e {
        FrameError::TooLarge { .. } => "frame too large",
        FrameError::Negative(_) => "negative frame size",
        FrameError::TooShort(_) => "frame too short",
    };
    tracing::warn!(peer = ?conn.peer, error = %e, "bad frame; closing the connection");
    shard.metrics.bad_request(reason);
    reason
}

/// Decodes a frame's header and starts its request. `Ok(None)`: no response is due.
async fn start_request(
    conns: &Rc<Connections>,
    conn: &Rc<ConnInfo>,
    frame: Bytes,
    permit: StaticPermit,
    fetch_slot: &Rc<Semaphore>,
) -> Result<Option<Pending>, &'static str> {
    let shard = conns.core();
    let arrived = std::time::Instant::now();
    let Some(raw) = RawHeader::peek(&frame) else {
        shard.metrics.bad_request("short header");
        return Err("short header");
    };
    let Ok(api) = ApiKey::try_from(raw.api_key) else {
        tracing::warn!(peer = ?conn.peer, api_key = raw.api_key, "unknown API key; closing the connection");
        shard.metrics.bad_request("unknown api key");
        return Err("unknown api key");
    };
    // KIP-511: an ApiVersions request newer than we know gets a v0 answer listing our versions.
    if api == ApiKey::ApiVersions && raw.api_version > handlers::API_VERSIONS_MAX {
        shard.metrics.request(raw.api_key, raw.api_version);
        shard.metrics.error(
            raw.api_key,
            raw.api_version,
            kafka_protocol::ResponseError::UnsupportedVersion.code(),
        );
        let resp = handlers::api_versions_fallback(raw.correlation_id);
        return Ok(Some(Pending {
            response: glommio::spawn_local(async move { resp }).detach(),
            _fetch_slot: None,
        }));
    }
    // `permit` holds request memory for the frame until its response is ready.
    let (header, body) = match decode_request_header(frame, api) {
        Ok(x) => x,
        Err(e) => {
            tracing::warn!(peer = ?conn.peer, error = %e, "malformed request header; closing the connection");
            shard.metrics.bad_request("malformed header");
            return Err("malformed header");
        }
    };
    conn.affinity.request(api);
    let fetch_slot = if needs_fetch_slot(api) {
        match fetch_slot.acquire_static_permit(1).await {
            Ok(p) => Some(p),
            Err(_) => return Err("shutting down"),
        }
    } else {
        None
    };
    let ctx = Rc::new(RequestCtx {
        shard: shard.clone(),
        subsystems: conns.subsystems.clone(),
        conn: conn.clone(),
        api,
        version: header.request_api_version,
        correlation_id: header.correlation_id,
        client_id: header.client_id.map(|c| c.as_str().to_owned()),
        arrived,
    });
    match handlers::dispatch(ctx, body).await {
        Dispatched::Response(fut) => Ok(Some(Pending {
            response: glommio::spawn_local(async move {
                let out = fut.await;
                drop(permit);
                out
            })
            .detach(),
            _fetch_slot: fetch_slot,
        })),
        Dispatched::NoResponse(work) => {
            glommio::spawn_local(async move {
                work.await;
                drop(permit);
            })
            .detach();
            Ok(None)
        }
        Dispatched::Close(reason) => {
            shard.metrics.bad_request(reason);
            Err(reason)
        }
    }
}

/// Writes responses in request order; `true` if every one was written.
async fn write_loop(shard: Rc<Shard>, mut writer: Half, rx: local_channel::LocalReceiver<Pending>) -> bool {
    let mut socket: Option<Arc<OwnedFd>> = None;
    while let Some(pending) = rx.recv().await {
        let Some(Some(frame)) = pending.response.await else {
            // Encoding failed (logged): the client cannot be answered correctly any more.
            let _ = writer.close().await;
            return false;
        };
        for piece in frame {
            let written = match piece {
                Piece::Bytes(bytes) => writer.write_all(&bytes).await,
                Piece::External(region) => send_region(&shard, &mut writer, &mut socket, region).await,
            };
            if written.is_err() {
                return false;
            }
        }
    }
    writer.flush().await.is_ok()
}

/// Waits for room on the socket this many times before a region's rest is copied instead.
const SENDFILE_TRIES: u32 = 64;

/// Sends a region of a segment file with `sendfile(2)`, run on the shard's blocking thread, so
/// that the shard never waits if the file's pages must come from the disk. The socket is
/// non-blocking for it (glommio's own writes and reads pass `MSG_DONTWAIT` and poll, so they
/// behave the same), so that the thread never waits for the client: when the socket is full
/// the shard waits for room, then sends on. A region the socket keeps refusing, or a
/// connection whose descriptor cannot be duplicated, gets the rest read and written like any
/// other bytes.
async fn send_region(
    shard: &Shard,
    writer: &mut Half,
    socket: &mut Option<Arc<OwnedFd>>,
    region: Arc<FileRegion>,
) -> io::Result<()> {
    if socket.is_none() {
        let raw = writer.0.borrow().as_raw_fd();
        *socket = duplicate(raw)
            .ok()
            .and_then(|fd| non_blocking(fd).ok())
            .map(Arc::new);
    }
    let mut sent = 0usize;
    let mut waits = 0;
    if let Some(socket) = socket.as_ref() {
        for _ in 0..SENDFILE_TRIES {
            let (s, r) = (Arc::clone(socket), Arc::clone(&region));
            sent += glommio::executor()
                .spawn_blocking(move || sendfile_from(&s, &r, sent))
                .await?;
            if sent == region.len {
                break;
            }
            let half = &writer.0;
            futures::future::poll_fn(|cx| half.borrow_mut().poll_writable(cx)).await?;
            waits += 1;
        }
    }
    let rest = region.len - sent;
    shard.metrics.region_sent(sent, rest, waits);
    if rest > 0 {
        let r = Arc::clone(&region);
        let bytes = glommio::executor()
            .spawn_blocking(move || read_region(&r, sent))
            .await?;
        writer.write_all(&bytes).await?;
    }
    Ok(())
}

fn non_blocking(fd: OwnedFd) -> rustix::io::Result<OwnedFd> {
    use rustix::fs::{fcntl_getfl, fcntl_setfl, OFlags};
    fcntl_setfl(&fd, fcntl_getfl(&fd)? | OFlags::NONBLOCK)?;
    Ok(fd)
}

/// Sends `region` from byte `from` on until the socket is full or it is all sent; returns the
/// bytes sent.
fn sendfile_from(socket: &OwnedFd, region: &FileRegion, from: usize) -> io::Result<usize> {
    let end = region.pos + region.len as u64;
    let mut at = region.pos + from as u64;
    while at < end {
        let want = usize::try_from(end - at).unwrap_or(usize::MAX);
        match rustix::fs::sendfile(socket, &region.fd, Some(&mut at), want) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "segment file ends before its region",
                ))
            }
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(rustix::io::Errno::AGAIN) => break,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(usize::try_from(at - region.pos).unwrap_or(0).saturating_sub(from))
}

/// The bytes of `region` from byte `from` on.
fn read_region(region: &FileRegion, from: usize) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; region.len - from];
    let mut filled = 0;
    while filled < buf.len() {
        let Some(rest) = buf.get_mut(filled..) else { break };
        match rustix::io::pread(&region.fd, rest, region.pos + (from + filled) as u64) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "segment file ends before its region",
                ))
            }
            Ok(n) => filled += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use strand_storage::FileRegions;

    /// sendfile sends a region until the socket is full and then nothing more; reading the rest
    /// from the file completes it, byte for byte.
    #[test]
    fn a_region_goes_out_by_sendfile_until_the_socket_is_full_and_the_rest_is_read() {
        use std::io::{Read, Write};
        let data: Vec<u8> = (0..8usize << 20).map(|i| (i * 7 % 251) as u8).collect();
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(&data).unwrap();
        let (pos, len) = (1000, data.len() - 5000);
        let regions = FileRegions::for_process(2);
        let region = regions.region(OwnedFd::from(file), pos as u64, len).unwrap();
        let (tx, mut rx) = std::os::unix::net::UnixStream::pair().unwrap();
        tx.set_nonblocking(true).unwrap();
        let tx = OwnedFd::from(tx);
        let sent = sendfile_from(&tx, &region, 0).unwrap();
        assert!(
            sent > 0 && sent < len,
            "sent {sent} of {len} into a socket that holds less"
        );
        assert_eq!(
            sendfile_from(&tx, &region, sent).unwrap(),
            0,
            "a full socket took more"
        );
        let mut got = vec![0u8; sent];
        rx.read_exact(&mut got).unwrap();
        let more = sendfile_from(&tx, &region, sent).unwrap();
        assert!(more > 0, "room again, nothing sent");
        let mut next = vec![0u8; more];
        rx.read_exact(&mut next).unwrap();
        got.extend_from_slice(&next);
        got.extend_from_slice(&read_region(&region, sent + more).unwrap());
        assert!(
            got[..] == data[pos..pos + len],
            "the region's bytes differ from the file's"
        );
        let past_the_end = regions
            .region(region.fd.try_clone().unwrap(), (data.len() - 10) as u64, 20)
            .unwrap();
        assert!(
            read_region(&past_the_end, 0).is_err(),
            "a region past the file's end read"
        );
    }

    #[test]
    fn received_bytes_carry_over() {
        let input = Input::new(b"\0\0\0\x02hi\0\0");
        assert_eq!(&input.buf[..], &b"\0\0\0\x02hi\0\0"[..]);
        assert!(Input::new(&[]).buf.is_empty());
    }
}
