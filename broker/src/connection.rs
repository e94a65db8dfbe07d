//! One Kafka connection: read frames, start each request in arrival order, run them
//! concurrently, and write responses in request order (clients pipeline and match responses by
//! order as well as by correlation id).
//!
//! Bounds: a frame larger than `socket.request.max.bytes` closes the connection before its body
//! is read; at most `strand.max.inflight.requests.per.connection` responses are pending, after
//! which the connection stops reading; request bytes held by all connections of a shard are
//! bounded by the shard's request-memory semaphore.

use std::cell::RefCell;
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use futures::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use glommio::channels::local_channel;
use glommio::net::TcpStream;
use glommio::sync::{Semaphore, StaticPermit};
use kafka_protocol::messages::ApiKey;
use strand_protocol::frame::{peek_frame_size, split_received_frame, FrameError};
use strand_protocol::header::{decode_request_header, RawHeader};

use crate::handlers::{self, ConnInfo, Dispatched, RequestCtx};
use crate::shard::Shard;

/// Half of a TCP stream shared by the connection's reader and writer tasks. Both run on one
/// thread and borrow the stream only inside a poll call, so the `RefCell` never conflicts.
struct Half(Rc<RefCell<TcpStream>>);

impl AsyncRead for Half {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut [u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.0.borrow_mut()).poll_read(cx, buf)
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

/// A response slot: the task computing the encoded response frame.
type Pending = glommio::task::JoinHandle<Option<Bytes>>;

/// Serves one accepted connection until the peer closes it or sends something unacceptable.
pub(crate) async fn serve(
    shard: Rc<Shard>,
    stream: TcpStream,
    listener: usize,
    request_memory: Rc<Semaphore>,
) {
    let peer = stream.peer_addr().ok();
    let _ = stream.set_nodelay(true);
    shard.metrics.connection_opened();
    let stream = Rc::new(RefCell::new(stream));
    let conn = Rc::new(ConnInfo { listener, peer });
    let inflight = usize::try_from(shard.config.max_inflight_requests_per_connection)
        .unwrap_or(256)
        .max(1);
    let (tx, rx) = local_channel::new_bounded::<Pending>(inflight);
    let writer = glommio::spawn_local(write_loop(Half(stream.clone()), rx));
    let reason = read_loop(&shard, Half(stream.clone()), &conn, &tx, &request_memory).await;
    if let Some(reason) = reason {
        tracing::debug!(?peer, reason, "closing connection");
    }
    drop(tx);
    writer.await;
    // Dropping the last handle closes the socket.
    drop(stream);
    shard.metrics.connection_closed();
}

/// Reads and starts requests; returns why it stopped (`None`: the peer closed).
async fn read_loop(
    shard: &Rc<Shard>,
    mut reader: Half,
    conn: &Rc<ConnInfo>,
    tx: &local_channel::LocalSender<Pending>,
    request_memory: &Rc<Semaphore>,
) -> Option<&'static str> {
    let max_frame = shard.config.socket_request_max_bytes as usize;
    // `buf[..filled]` holds received bytes; the rest of `buf` is zeroed space for the next
    // reads. Kept across reads, so each byte is zeroed once, not once per read of a large frame.
    let mut buf = BytesMut::with_capacity(READ_CHUNK_BYTES);
    let mut filled = 0usize;
    // Request memory reserved for the frame at the front of `buf`, taken before its body is read.
    let mut reserved: Option<StaticPermit> = None;
    loop {
        loop {
            let frame = match split_received_frame(&mut buf, &mut filled, max_frame) {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(e) => return Some(frame_error(shard, conn, e)),
            };
            let permit = match reserved.take() {
                Some(p) => p,
                None => match request_memory.acquire_static_permit(frame.len() as u64).await {
                    Ok(p) => p,
                    Err(_) => return Some("shutting down"),
                },
            };
            match start_request(shard, conn, frame, permit).await {
                Ok(Some(pending)) => {
                    if tx.send(pending).await.is_err() {
                        return Some("writer gone");
                    }
                }
                Ok(None) => {}
                Err(reason) => return Some(reason),
            }
        }
        // Read more: as much as the frame at the front needs, in bounded chunks.
        let need = match peek_frame_size(buf.get(..filled).unwrap_or_default(), max_frame) {
            Ok(Some(size)) => {
                if reserved.is_none() && size > READ_CHUNK_BYTES {
                    // A large frame: hold its memory before reading its body, so the bytes all
                    // connections of a shard buffer stay within the shard's budget.
                    match request_memory.acquire_static_permit(size as u64).await {
                        Ok(p) => reserved = Some(p),
                        Err(_) => return Some("shutting down"),
                    }
                }
                (4 + size).saturating_sub(filled)
            }
            Ok(None) => READ_CHUNK_BYTES,
            Err(e) => return Some(frame_error(shard, conn, e)),
        };
        let chunk = need.clamp(READ_CHUNK_BYTES, 4 << 20);
        if buf.len() < filled + chunk {
            buf.resize(filled + chunk, 0);
        }
        let n = match reader
            .read(buf.get_mut(filled..filled + chunk).unwrap_or_default())
            .await
        {
            Ok(n) => n,
            Err(_) => return Some("read error"),
        };
        if n == 0 {
            return None;
        }
        filled += n;
    }
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
    shard: &Rc<Shard>,
    conn: &Rc<ConnInfo>,
    frame: Bytes,
    permit: StaticPermit,
) -> Result<Option<Pending>, &'static str> {
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
        return Ok(Some(glommio::spawn_local(async move { resp }).detach()));
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
    let ctx = Rc::new(RequestCtx {
        shard: shard.clone(),
        conn: conn.clone(),
        api,
        version: header.request_api_version,
        correlation_id: header.correlation_id,
        client_id: header.client_id.map(|c| c.as_str().to_owned()),
    });
    match handlers::dispatch(ctx, body).await {
        Dispatched::Response(fut) => Ok(Some(
            glommio::spawn_local(async move {
                let out = fut.await;
                drop(permit);
                out
            })
            .detach(),
        )),
        Dispatched::NoResponse => Ok(None),
        Dispatched::Close(reason) => {
            shard.metrics.bad_request(reason);
            Err(reason)
        }
    }
}

/// Writes responses in request order.
async fn write_loop(mut writer: Half, rx: local_channel::LocalReceiver<Pending>) {
    while let Some(pending) = rx.recv().await {
        let Some(Some(frame)) = pending.await else {
            // Encoding failed (logged): the client cannot be answered correctly any more.
            let _ = writer.close().await;
            return;
        };
        if writer.write_all(&frame).await.is_err() {
            return;
        }
    }
    let _ = writer.flush().await;
}
