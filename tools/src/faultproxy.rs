//! A fault-injecting TCP proxy for the Kafka protocol, for tests.
//!
//! The proxy listens on one address and forwards every client connection to an upstream broker.
//! It understands Kafka framing in both directions (a 4-byte big-endian size, then the frame): it
//! reads each request's header (api key, version, correlation id) and matches each response to
//! its request by correlation id. A configurable fraction of **Produce responses** (api key 0)
//! is then not delivered, decided by a seeded generator, in one of two [`DropMode`]s:
//!
//! * [`DropMode::Close`]: the response is dropped and both sides of the connection are closed at
//!   once, as if the network failed right after the broker appended: the client sees a
//!   disconnect with requests in flight, reconnects and retries them.
//! * [`DropMode::Silent`]: the response is never delivered and the connection stays up; the
//!   client's request times out and it retries. (Clients that insist on in-order correlation ids,
//!   such as kafka-python and the Java client, close the connection at the next response.)
//!
//! The `k`-th Produce response that passes through the proxy (counted over all connections) is
//! dropped when `splitmix64(seed, k) mod 10^6 < rate * 10^6`, so the same seed and the same order
//! of responses give the same faults. [`FaultProxy::force_drop_next`] drops the next responses
//! regardless of the rate.
//!
//! Everything is bounded: frame sizes ([`ProxyConfig::max_frame_bytes`], default 100 MiB; a larger
//! or negative size closes the connection), concurrent connections
//! ([`ProxyConfig::max_connections`]; extra ones are closed at once) and requests awaiting a
//! response per connection ([`MAX_PENDING_REQUESTS`]). An upstream that refuses the connection
//! (a broker being restarted) just closes the client's connection; the proxy keeps running, and
//! [`FaultProxy::set_upstream`] can point it at a new address at any time (new connections use
//! it).
//!
//! It is a test tool: plain blocking sockets, two threads per proxied connection, no async
//! runtime. Counters ([`ProxyStats`]) say what it did, so a test can check that faults actually
//! happened.

use crate::blocking_server::{lock, write_fields, Running, ServerCore, ThreadPerConnection};
use crate::kafka_wire::read_size_prefix;
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::str::FromStr;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use strand_protocol::header::RawHeader;

/// Kafka's Produce api key: the responses the proxy drops.
pub const PRODUCE_API_KEY: i16 = 0;
/// Default bound on one frame (request or response), as Kafka's `socket.request.max.bytes` is
/// 100 MiB.
pub const DEFAULT_MAX_FRAME_BYTES: usize = 100 << 20;
/// Default bound on concurrent client connections.
pub const DEFAULT_MAX_CONNECTIONS: usize = 256;
/// Requests awaiting a response on one connection; beyond that the connection is closed.
pub const MAX_PENDING_REQUESTS: usize = 10_000;
/// One in a million: the unit of the drop rate.
const PPM: u64 = 1_000_000;

/// What happens to a Produce response chosen to be dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DropMode {
    /// Drop it and close the client's and the upstream connection at once.
    Close,
    /// Never deliver it; keep the connection open.
    Silent,
}

impl DropMode {
    fn as_u8(self) -> u8 {
        match self {
            DropMode::Close => 0,
            DropMode::Silent => 1,
        }
    }

    fn from_u8(v: u8) -> DropMode {
        if v == 1 {
            DropMode::Silent
        } else {
            DropMode::Close
        }
    }
}

impl FromStr for DropMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "close" => Ok(DropMode::Close),
            "silent" => Ok(DropMode::Silent),
            other => Err(format!(
                "unknown drop mode {other:?} (expected `close` or `silent`)"
            )),
        }
    }
}

impl fmt::Display for DropMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DropMode::Close => "close",
            DropMode::Silent => "silent",
        })
    }
}

/// How to run a [`FaultProxy`].
#[derive(Clone, Debug)]
pub struct ProxyConfig {
    /// Address to listen on, e.g. `127.0.0.1:0` (an ephemeral port; see [`FaultProxy::local_addr`]).
    pub listen: String,
    /// Broker to forward to (`host:port`); `None` until [`FaultProxy::set_upstream`] is called
    /// (connections arriving before that are closed).
    pub upstream: Option<String>,
    /// Fraction of Produce responses to drop, `0.0..=1.0` (resolution: one in a million).
    pub drop_rate: f64,
    /// What dropping means.
    pub mode: DropMode,
    /// Seed of the drop decisions.
    pub seed: u64,
    /// Largest frame forwarded in either direction; a larger one closes the connection.
    pub max_frame_bytes: usize,
    /// Largest number of concurrent client connections; more are closed on accept.
    pub max_connections: usize,
    /// Time limit for connecting to the upstream.
    pub connect_timeout: Duration,
    /// Log connections, drops and errors to stderr.
    pub verbose: bool,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            listen: "127.0.0.1:0".to_string(),
            upstream: None,
            drop_rate: 0.0,
            mode: DropMode::Close,
            seed: 0,
            max_frame_bytes: DEFAULT_MAX_FRAME_BYTES,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            connect_timeout: Duration::from_secs(5),
            verbose: false,
        }
    }
}

/// What the proxy did so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProxyStats {
    /// Client connections accepted and proxied (an upstream was tried for each).
    pub connections_accepted: u64,
    /// Client connections closed at once because `max_connections` were open.
    pub connections_rejected: u64,
    /// Client connections open now.
    pub connections_active: u64,
    /// Client connections closed because the upstream was unset or could not be reached.
    pub upstream_failures: u64,
    /// Request frames forwarded to the upstream.
    pub requests_forwarded: u64,
    /// Response frames forwarded to clients (Produce and others).
    pub responses_forwarded: u64,
    /// Produce responses forwarded to clients.
    pub produce_responses_forwarded: u64,
    /// Produce responses dropped (either mode).
    pub produce_responses_dropped: u64,
    /// Connections closed because of a drop in [`DropMode::Close`].
    pub fault_closes: u64,
    /// Framing problems: oversized or negative frame sizes, requests too short for a header,
    /// responses whose correlation id matches no request, too many pending requests.
    pub protocol_errors: u64,
}

impl fmt::Display for ProxyStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_fields!(
            f,
            self,
            connections_accepted,
            connections_rejected,
            connections_active,
            upstream_failures,
            requests_forwarded,
            responses_forwarded,
            produce_responses_forwarded,
            produce_responses_dropped,
            fault_closes,
            protocol_errors
        )
    }
}

#[derive(Default)]
struct Counters {
    upstream_failures: AtomicU64,
    requests_forwarded: AtomicU64,
    responses_forwarded: AtomicU64,
    produce_responses_forwarded: AtomicU64,
    produce_responses_dropped: AtomicU64,
    fault_closes: AtomicU64,
    protocol_errors: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// Both sockets of a proxied connection, kept so that the proxy can close them from outside.
struct ConnSockets {
    client: TcpStream,
    upstream: TcpStream,
}

impl ConnSockets {
    fn close(&self) {
        let _ = self.client.shutdown(Shutdown::Both);
        let _ = self.upstream.shutdown(Shutdown::Both);
    }
}

struct Shared {
    seed: u64,
    max_frame_bytes: usize,
    connect_timeout: Duration,
    verbose: bool,
    upstream: Mutex<Option<String>>,
    drop_ppm: AtomicU32,
    mode: AtomicU8,
    /// Index of the next Produce response's drop decision.
    decisions: AtomicU64,
    /// Produce responses to drop regardless of the rate.
    forced_drops: AtomicU64,
    core: ServerCore,
    counters: Counters,
    conns: Mutex<HashMap<u64, ConnSockets>>,
}

/// The splitmix64 finalizer over `seed` and `index`: the drop decision's random number.
pub fn decision_value(seed: u64, index: u64) -> u64 {
    let mut z = seed
        .wrapping_add(index.wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Whether the `index`-th Produce response is dropped at `drop_ppm` parts per million.
pub fn decides_drop(seed: u64, index: u64, drop_ppm: u32) -> bool {
    decision_value(seed, index) % PPM < u64::from(drop_ppm)
}

fn rate_to_ppm(rate: f64) -> u32 {
    if rate.is_nan() || rate <= 0.0 {
        0
    } else if rate >= 1.0 {
        PPM as u32
    } else {
        (rate * PPM as f64).round() as u32
    }
}

impl Shared {
    fn log(&self, msg: impl FnOnce() -> String) {
        if self.verbose {
            eprintln!("[faultproxy] {}", msg());
        }
    }

    /// Decides the fate of the next Produce response.
    fn should_drop(&self) -> bool {
        let index = self.decisions.fetch_add(1, Ordering::Relaxed);
        let forced = self
            .forced_drops
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok();
        forced || decides_drop(self.seed, index, self.drop_ppm.load(Ordering::Relaxed))
    }

    fn stats(&self) -> ProxyStats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ProxyStats {
            connections_accepted: get(&self.core.connections.accepted),
            connections_rejected: get(&self.core.connections.rejected),
            connections_active: get(&self.core.connections.active),
            upstream_failures: get(&c.upstream_failures),
            requests_forwarded: get(&c.requests_forwarded),
            responses_forwarded: get(&c.responses_forwarded),
            produce_responses_forwarded: get(&c.produce_responses_forwarded),
            produce_responses_dropped: get(&c.produce_responses_dropped),
            fault_closes: get(&c.fault_closes),
            protocol_errors: get(&c.protocol_errors),
        }
    }
}

impl ThreadPerConnection for Shared {
    const THREAD_PREFIX: &'static str = "faultproxy-conn";

    fn core(&self) -> &ServerCore {
        &self.core
    }

    fn note(&self, message: String) {
        self.log(|| message);
    }

    fn refused(&self, active: u64) {
        self.log(|| format!("{active} connections open: closing a new one"));
    }

    fn serve(server: &Arc<Self>, id: u64, stream: TcpStream) {
        proxy_connection(server, id, stream);
    }

    fn close_connections(&self) {
        for sockets in lock(&self.conns).values() {
            sockets.close();
        }
    }
}

/// A running proxy. Dropping it (or [`FaultProxy::shutdown`]) stops accepting and closes every
/// proxied connection.
pub struct FaultProxy {
    server: Running<Shared>,
}

impl FaultProxy {
    /// Binds `config.listen` and starts accepting connections in a background thread.
    pub fn start(config: ProxyConfig) -> io::Result<FaultProxy> {
        if !(0.0..=1.0).contains(&config.drop_rate) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("drop rate {} is not within 0..=1", config.drop_rate),
            ));
        }
        let listener = TcpListener::bind(&config.listen)?;
        let shared = Arc::new(Shared {
            seed: config.seed,
            max_frame_bytes: config.max_frame_bytes,
            connect_timeout: config.connect_timeout,
            verbose: config.verbose,
            upstream: Mutex::new(config.upstream.clone()),
            drop_ppm: AtomicU32::new(rate_to_ppm(config.drop_rate)),
            mode: AtomicU8::new(config.mode.as_u8()),
            decisions: AtomicU64::new(0),
            forced_drops: AtomicU64::new(0),
            core: ServerCore::new(config.max_connections.max(1)),
            counters: Counters::default(),
            conns: Mutex::new(HashMap::new()),
        });
        Ok(FaultProxy {
            server: Running::start(listener, shared, "faultproxy-accept")?,
        })
    }

    /// The address the proxy listens on (with the actual port when `listen` asked for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.server.local_addr()
    }

    /// Sets (or changes) the upstream broker address; connections accepted from now on use it.
    /// Connections already proxied keep their upstream.
    pub fn set_upstream(&self, addr: impl Into<String>) {
        let addr = addr.into();
        self.server.shared.log(|| format!("upstream is now {addr}"));
        *lock(&self.server.shared.upstream) = Some(addr);
    }

    /// The current upstream address.
    pub fn upstream(&self) -> Option<String> {
        lock(&self.server.shared.upstream).clone()
    }

    /// Changes the fraction of Produce responses dropped (`0.0..=1.0`, clamped).
    pub fn set_drop_rate(&self, rate: f64) {
        self.server
            .shared
            .drop_ppm
            .store(rate_to_ppm(rate), Ordering::Relaxed);
    }

    /// The current drop rate.
    pub fn drop_rate(&self) -> f64 {
        f64::from(self.server.shared.drop_ppm.load(Ordering::Relaxed)) / PPM as f64
    }

    /// Changes the drop mode.
    pub fn set_mode(&self, mode: DropMode) {
        self.server.shared.mode.store(mode.as_u8(), Ordering::Relaxed);
    }

    /// The current drop mode.
    pub fn mode(&self) -> DropMode {
        DropMode::from_u8(self.server.shared.mode.load(Ordering::Relaxed))
    }

    /// Drops the next `n` Produce responses whatever the rate (in the current mode).
    pub fn force_drop_next(&self, n: u64) {
        self.server.shared.forced_drops.fetch_add(n, Ordering::Relaxed);
    }

    /// Closes every proxied connection now (a network blip); the proxy keeps accepting.
    pub fn close_connections(&self) {
        self.server.shared.close_connections();
    }

    /// The counters so far.
    pub fn stats(&self) -> ProxyStats {
        self.server.shared.stats()
    }

    /// Stops accepting, closes every connection and waits (up to 5 s) for their threads to end.
    /// Returns the final counters. Dropping the proxy does the same.
    pub fn shutdown(&mut self) -> ProxyStats {
        self.server.shut_down();
        self.stats()
    }
}

fn connect_upstream(addr: &str, timeout: Duration) -> io::Result<TcpStream> {
    let mut last = io::Error::new(io::ErrorKind::NotFound, format!("{addr} resolves to nothing"));
    for a in addr.to_socket_addrs()? {
        match TcpStream::connect_timeout(&a, timeout) {
            Ok(s) => return Ok(s),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// A request that awaits its response.
#[derive(Clone, Copy, Debug)]
struct Pending {
    correlation_id: i32,
    api_key: i16,
}

type PendingQueue = Arc<Mutex<VecDeque<Pending>>>;

fn proxy_connection(shared: &Arc<Shared>, id: u64, client: TcpStream) {
    let peer = client.peer_addr().ok();
    let upstream_addr = lock(&shared.upstream).clone();
    let Some(upstream_addr) = upstream_addr else {
        bump(&shared.counters.upstream_failures);
        shared.log(|| format!("conn {id} from {peer:?}: no upstream set; closing"));
        let _ = client.shutdown(Shutdown::Both);
        return;
    };
    let upstream = match connect_upstream(&upstream_addr, shared.connect_timeout) {
        Ok(s) => s,
        Err(e) => {
            bump(&shared.counters.upstream_failures);
            shared.log(|| format!("conn {id} from {peer:?}: upstream {upstream_addr}: {e}; closing"));
            let _ = client.shutdown(Shutdown::Both);
            return;
        }
    };
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let clones = (|| -> io::Result<_> {
        Ok((
            client.try_clone()?,
            upstream.try_clone()?,
            client.try_clone()?,
            upstream.try_clone()?,
        ))
    })();
    let (client_reader, upstream_writer, client_reg, upstream_reg) = match clones {
        Ok(c) => c,
        Err(e) => {
            shared.log(|| format!("conn {id}: cannot clone sockets: {e}"));
            return;
        }
    };
    lock(&shared.conns).insert(
        id,
        ConnSockets {
            client: client_reg,
            upstream: upstream_reg,
        },
    );
    if shared.core.stopping() {
        // Shutdown raced with this connection's registration.
        if let Some(s) = lock(&shared.conns).remove(&id) {
            s.close();
        }
        return;
    }
    shared.log(|| format!("conn {id} from {peer:?} -> {upstream_addr}"));
    let pending: PendingQueue = Arc::new(Mutex::new(VecDeque::new()));
    let requests = {
        let (shared, pending) = (shared.clone(), pending.clone());
        std::thread::Builder::new()
            .name(format!("faultproxy-req-{id}"))
            .spawn(move || {
                let why = forward_requests(&shared, client_reader, upstream_writer, &pending);
                shared.log(|| format!("conn {id}: requests end: {why}"));
                if let Some(s) = lock(&shared.conns).get(&id) {
                    s.close();
                }
            })
    };
    let why = forward_responses(shared, upstream, client, &pending);
    shared.log(|| format!("conn {id}: responses end: {why}"));
    if let Some(s) = lock(&shared.conns).remove(&id) {
        s.close();
    }
    match requests {
        Ok(t) => {
            let _ = t.join();
        }
        Err(e) => shared.log(|| format!("conn {id}: cannot start the request thread: {e}")),
    }
}

/// Reads one frame (size prefix included in the result). `Ok(None)` when the peer closed (EOF,
/// or a reset) before the first byte; an error for a size that is negative or above `max`.
fn read_frame(stream: &mut TcpStream, max: usize) -> io::Result<Option<Vec<u8>>> {
    let Some(size) = read_size_prefix(stream)? else {
        return Ok(None);
    };
    let len = i32::from_be_bytes(size);
    let len = usize::try_from(len).ok().filter(|&l| l <= max).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame size {len} outside 0..={max}"),
        )
    })?;
    let mut frame = vec![0u8; 4 + len];
    frame[..4].copy_from_slice(&size);
    stream.read_exact(&mut frame[4..])?;
    Ok(Some(frame))
}

/// A bounds-checked reader over a request body.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.pos.checked_add(n)?;
        let s = self.buf.get(self.pos..end)?;
        self.pos = end;
        Some(s)
    }

    fn i16(&mut self) -> Option<i16> {
        Some(i16::from_be_bytes(self.take(2)?.try_into().ok()?))
    }

    fn uvarint(&mut self) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = *self.take(1)?.first()?;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }

    /// A nullable string with an i16 length.
    fn skip_string(&mut self) -> Option<()> {
        let len = self.i16()?;
        if len > 0 {
            self.take(len as usize)?;
        }
        Some(())
    }

    /// A compact nullable string (unsigned varint length + 1).
    fn skip_compact_string(&mut self) -> Option<()> {
        let len = self.uvarint()?;
        if len > 1 {
            self.take(usize::try_from(len - 1).ok()?)?;
        }
        Some(())
    }

    fn skip_tagged_fields(&mut self) -> Option<()> {
        let n = self.uvarint()?;
        for _ in 0..n {
            self.uvarint()?;
            let size = self.uvarint()?;
            self.take(usize::try_from(size).ok()?)?;
        }
        Some(())
    }
}

/// The `acks` of a Produce request body (after the size prefix), or `None` if it cannot be
/// parsed. Produce v9+ uses request header v2 (tagged fields) and a compact transactional id.
pub fn produce_acks(body: &[u8]) -> Option<i16> {
    let header = RawHeader::peek(body)?;
    if header.api_key != PRODUCE_API_KEY {
        return None;
    }
    let version = header.api_version;
    let mut c = Cursor { buf: body, pos: 8 };
    c.skip_string()?; // client id (always a non-compact nullable string)
    if version >= 9 {
        c.skip_tagged_fields()?;
        c.skip_compact_string()?; // transactional id
    } else if version >= 3 {
        c.skip_string()?; // transactional id
    }
    c.i16()
}

/// The next frame from `side` ("client" or "upstream"), or why the connection ends (a frame
/// that is too large or negative counts as a protocol error).
fn next_frame(shared: &Shared, stream: &mut TcpStream, side: &str) -> Result<Vec<u8>, String> {
    match read_frame(stream, shared.max_frame_bytes) {
        Ok(Some(f)) => Ok(f),
        Ok(None) => Err(format!("{side} closed")),
        Err(e) => {
            if e.kind() == io::ErrorKind::InvalidData {
                bump(&shared.counters.protocol_errors);
            }
            Err(format!("{side} read: {e}"))
        }
    }
}

/// Client -> upstream: forwards request frames, recording which ones await a response.
fn forward_requests(
    shared: &Shared,
    mut client: TcpStream,
    mut upstream: TcpStream,
    pending: &Mutex<VecDeque<Pending>>,
) -> String {
    loop {
        let frame = match next_frame(shared, &mut client, "client") {
            Ok(f) => f,
            Err(why) => return why,
        };
        let body = &frame[4..];
        let Some(RawHeader {
            api_key,
            correlation_id,
            ..
        }) = RawHeader::peek(body)
        else {
            bump(&shared.counters.protocol_errors);
            return format!("a request of {} bytes has no header", body.len());
        };
        let expects_response = !(api_key == PRODUCE_API_KEY && produce_acks(body) == Some(0));
        if expects_response {
            let mut q = lock(pending);
            if q.len() >= MAX_PENDING_REQUESTS {
                bump(&shared.counters.protocol_errors);
                return format!("{} requests await a response", q.len());
            }
            q.push_back(Pending {
                correlation_id,
                api_key,
            });
        }
        if let Err(e) = upstream.write_all(&frame) {
            return format!("upstream write: {e}");
        }
        bump(&shared.counters.requests_forwarded);
    }
}

/// Upstream -> client: forwards response frames, dropping the chosen Produce responses.
fn forward_responses(
    shared: &Shared,
    mut upstream: TcpStream,
    mut client: TcpStream,
    pending: &Mutex<VecDeque<Pending>>,
) -> String {
    loop {
        let frame = match next_frame(shared, &mut upstream, "upstream") {
            Ok(f) => f,
            Err(why) => return why,
        };
        let Some(correlation_id) = frame
            .get(4..8)
            .and_then(|b| b.try_into().ok())
            .map(i32::from_be_bytes)
        else {
            bump(&shared.counters.protocol_errors);
            return "a response too short for a correlation id".into();
        };
        // Responses come in request order; entries before the match got no response.
        let api_key = {
            let mut q = lock(pending);
            match q.iter().position(|p| p.correlation_id == correlation_id) {
                Some(i) => {
                    let p = q.get(i).map(|p| p.api_key);
                    q.drain(..=i);
                    p
                }
                None => None,
            }
        };
        let Some(api_key) = api_key else {
            // Not ours to judge: forward it, but count it.
            bump(&shared.counters.protocol_errors);
            shared.log(|| format!("response with unknown correlation id {correlation_id}"));
            if let Err(e) = client.write_all(&frame) {
                return format!("client write: {e}");
            }
            bump(&shared.counters.responses_forwarded);
            continue;
        };
        if api_key == PRODUCE_API_KEY && shared.should_drop() {
            bump(&shared.counters.produce_responses_dropped);
            match DropMode::from_u8(shared.mode.load(Ordering::Relaxed)) {
                DropMode::Close => {
                    bump(&shared.counters.fault_closes);
                    let _ = client.shutdown(Shutdown::Both);
                    let _ = upstream.shutdown(Shutdown::Both);
                    return format!("dropped the Produce response {correlation_id} and closed");
                }
                DropMode::Silent => {
                    shared.log(|| format!("silently dropped the Produce response {correlation_id}"));
                    continue;
                }
            }
        }
        if let Err(e) = client.write_all(&frame) {
            return format!("client write: {e}");
        }
        bump(&shared.counters.responses_forwarded);
        if api_key == PRODUCE_API_KEY {
            bump(&shared.counters.produce_responses_forwarded);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn stats_print_as_name_value_pairs() {
        let stats = ProxyStats {
            connections_accepted: 1,
            connections_rejected: 2,
            connections_active: 3,
            upstream_failures: 4,
            requests_forwarded: 5,
            responses_forwarded: 6,
            produce_responses_forwarded: 7,
            produce_responses_dropped: 8,
            fault_closes: 9,
            protocol_errors: 10,
        };
        assert_eq!(
            stats.to_string(),
            "connections_accepted=1 connections_rejected=2 connections_active=3 upstream_failures=4 \
             requests_forwarded=5 responses_forwarded=6 produce_responses_forwarded=7 \
             produce_responses_dropped=8 fault_closes=9 protocol_errors=10"
        );
    }

    /// A Produce request frame: header v1 (v3..v8) or v2 (v9+), transactional id null.
    fn produce_frame(version: i16, correlation_id: i32, acks: i16) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&PRODUCE_API_KEY.to_be_bytes());
        b.extend_from_slice(&version.to_be_bytes());
        b.extend_from_slice(&correlation_id.to_be_bytes());
        b.extend_from_slice(&4i16.to_be_bytes());
        b.extend_from_slice(b"test");
        if version >= 9 {
            b.extend_from_slice(&[1, 7, 2, 0xaa, 0xbb]); // one tagged field (tag 7, 2 bytes)
            b.push(0); // null compact transactional id
        } else {
            b.extend_from_slice(&(-1i16).to_be_bytes());
        }
        b.extend_from_slice(&acks.to_be_bytes());
        b.extend_from_slice(&30_000i32.to_be_bytes());
        b.extend_from_slice(&[0xde, 0xad]); // the rest is not looked at
        frame(&b)
    }

    fn other_frame(api_key: i16, correlation_id: i32) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&api_key.to_be_bytes());
        b.extend_from_slice(&3i16.to_be_bytes());
        b.extend_from_slice(&correlation_id.to_be_bytes());
        b.extend_from_slice(&(-1i16).to_be_bytes());
        frame(&b)
    }

    fn frame(body: &[u8]) -> Vec<u8> {
        let mut f = (body.len() as i32).to_be_bytes().to_vec();
        f.extend_from_slice(body);
        f
    }

    /// A fake broker: answers every request that expects an answer with
    /// `[correlation id]["resp:" api key]`, counts the requests it got.
    struct FakeBroker {
        addr: SocketAddr,
        requests: Arc<AtomicU64>,
    }

    fn fake_broker() -> FakeBroker {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(AtomicU64::new(0));
        let counter = requests.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { return };
                let counter = counter.clone();
                std::thread::spawn(move || {
                    while let Ok(Some(f)) = read_frame(&mut conn, 1 << 20) {
                        counter.fetch_add(1, Ordering::SeqCst);
                        let body = &f[4..];
                        let RawHeader {
                            api_key: key,
                            correlation_id: corr,
                            ..
                        } = RawHeader::peek(body).unwrap();
                        if key == PRODUCE_API_KEY && produce_acks(body) == Some(0) {
                            continue;
                        }
                        let mut r = corr.to_be_bytes().to_vec();
                        r.extend_from_slice(format!("resp:{key}").as_bytes());
                        if conn.write_all(&frame(&r)).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        FakeBroker { addr, requests }
    }

    fn start(upstream: Option<SocketAddr>, rate: f64, mode: DropMode) -> FaultProxy {
        FaultProxy::start(ProxyConfig {
            upstream: upstream.map(|a| a.to_string()),
            drop_rate: rate,
            mode,
            seed: 7,
            max_frame_bytes: 1 << 16,
            ..ProxyConfig::default()
        })
        .unwrap()
    }

    fn client(proxy: &FaultProxy) -> TcpStream {
        let c = TcpStream::connect(proxy.local_addr()).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        c
    }

    /// Reads one response: `Some(correlation id, rest)`, or `None` on EOF/reset.
    fn response(c: &mut TcpStream) -> Option<(i32, String)> {
        match read_frame(c, 1 << 20) {
            Ok(Some(f)) => Some((
                i32::from_be_bytes(f[4..8].try_into().unwrap()),
                String::from_utf8(f[8..].to_vec()).unwrap(),
            )),
            Ok(None) => None,
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => None,
            Err(e) => panic!("reading a response: {e}"),
        }
    }

    fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !f() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn produce_acks_are_read_from_every_header_version() {
        for v in [3, 7, 8, 9, 11, 13] {
            for acks in [-1, 0, 1] {
                let f = produce_frame(v, 5, acks);
                assert_eq!(produce_acks(&f[4..]), Some(acks), "v{v} acks={acks}");
            }
        }
        assert_eq!(produce_acks(&other_frame(18, 1)[4..]), None);
        // Truncated anywhere: no answer, no panic.
        let f = produce_frame(9, 5, 0);
        for n in 0..f.len() - 6 {
            let _ = produce_acks(&f[4..4 + n.min(f.len() - 4)]);
        }
        assert_eq!(produce_acks(&f[4..12]), None);
    }

    #[test]
    fn decisions_follow_the_seed_and_the_rate() {
        let a: Vec<bool> = (0..10_000).map(|i| decides_drop(1, i, 50_000)).collect();
        let b: Vec<bool> = (0..10_000).map(|i| decides_drop(1, i, 50_000)).collect();
        let c: Vec<bool> = (0..10_000).map(|i| decides_drop(2, i, 50_000)).collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
        let drops = a.iter().filter(|d| **d).count();
        assert!((400..600).contains(&drops), "{drops} of 10000 at 5%");
        assert!((0..1000).all(|i| !decides_drop(3, i, 0)));
        assert!((0..1000).all(|i| decides_drop(3, i, 1_000_000)));
        assert_eq!(rate_to_ppm(0.05), 50_000);
        assert_eq!(rate_to_ppm(2.0), 1_000_000);
        assert_eq!(rate_to_ppm(f64::NAN), 0);
    }

    #[test]
    fn forwards_everything_unchanged_without_drops() {
        let broker = fake_broker();
        let proxy = start(Some(broker.addr), 0.0, DropMode::Close);
        let mut c = client(&proxy);
        for corr in 0..20 {
            c.write_all(&produce_frame(9, corr, -1)).unwrap();
            c.write_all(&other_frame(3, 1000 + corr)).unwrap();
        }
        for corr in 0..20 {
            assert_eq!(response(&mut c), Some((corr, "resp:0".into())));
            assert_eq!(response(&mut c), Some((1000 + corr, "resp:3".into())));
        }
        // Counted after the write, so possibly just after the client read the last one.
        wait_until("the counters", || proxy.stats().responses_forwarded == 40);
        let s = proxy.stats();
        assert_eq!(
            (
                s.requests_forwarded,
                s.responses_forwarded,
                s.produce_responses_forwarded
            ),
            (40, 40, 20)
        );
        assert_eq!(
            (
                s.produce_responses_dropped,
                s.protocol_errors,
                s.connections_accepted
            ),
            (0, 0, 1)
        );
    }

    #[test]
    fn close_mode_drops_the_produce_response_and_closes_only_that_connection() {
        let broker = fake_broker();
        let proxy = start(Some(broker.addr), 0.0, DropMode::Close);
        let mut c = client(&proxy);
        c.write_all(&other_frame(18, 1)).unwrap();
        assert_eq!(response(&mut c), Some((1, "resp:18".into())));
        proxy.force_drop_next(1);
        c.write_all(&produce_frame(7, 2, 1)).unwrap();
        // The broker got the request (it "appended"), the client sees a disconnect.
        assert_eq!(response(&mut c), None);
        assert_eq!(broker.requests.load(Ordering::SeqCst), 2);
        // A new connection works, and the forced drop is used up.
        let mut c2 = client(&proxy);
        c2.write_all(&produce_frame(7, 3, 1)).unwrap();
        assert_eq!(response(&mut c2), Some((3, "resp:0".into())));
        wait_until("the counters", || proxy.stats().produce_responses_forwarded == 1);
        let s = proxy.stats();
        assert_eq!((s.produce_responses_dropped, s.fault_closes), (1, 1));
        assert_eq!((s.connections_accepted, s.produce_responses_forwarded), (2, 1));
        wait_until("the closed connection to be gone", || {
            proxy.stats().connections_active == 1
        });
    }

    #[test]
    fn silent_mode_swallows_the_produce_response_and_keeps_the_connection() {
        let broker = fake_broker();
        let proxy = start(Some(broker.addr), 1.0, DropMode::Silent);
        let mut c = client(&proxy);
        c.write_all(&produce_frame(9, 1, -1)).unwrap();
        c.write_all(&other_frame(18, 2)).unwrap();
        assert_eq!(response(&mut c), Some((2, "resp:18".into())));
        proxy.set_drop_rate(0.0);
        assert_eq!(proxy.drop_rate(), 0.0);
        c.write_all(&produce_frame(9, 3, -1)).unwrap();
        assert_eq!(response(&mut c), Some((3, "resp:0".into())));
        let s = proxy.stats();
        assert_eq!(
            (s.produce_responses_dropped, s.fault_closes, s.protocol_errors),
            (1, 0, 0)
        );
    }

    #[test]
    fn acks_0_produce_requests_await_no_response() {
        let broker = fake_broker();
        let proxy = start(Some(broker.addr), 1.0, DropMode::Close);
        let mut c = client(&proxy);
        for corr in 0..5 {
            c.write_all(&produce_frame(9, corr, 0)).unwrap();
        }
        c.write_all(&other_frame(18, 9)).unwrap();
        assert_eq!(response(&mut c), Some((9, "resp:18".into())));
        assert_eq!(proxy.stats().protocol_errors, 0);
        assert_eq!(broker.requests.load(Ordering::SeqCst), 6);
    }

    #[test]
    fn a_missing_upstream_closes_the_client_and_the_proxy_keeps_serving() {
        let proxy = start(None, 0.0, DropMode::Close);
        let mut c = client(&proxy);
        assert_eq!(response(&mut c), None, "no upstream set: closed");
        // An address nobody listens on: refused, closed.
        let dead = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        proxy.set_upstream(dead.to_string());
        let mut c = client(&proxy);
        let _ = c.write_all(&other_frame(18, 1));
        assert_eq!(response(&mut c), None, "upstream refused: closed");
        assert_eq!(proxy.stats().upstream_failures, 2);
        // Following a broker to its new address.
        let broker = fake_broker();
        proxy.set_upstream(broker.addr.to_string());
        assert_eq!(proxy.upstream(), Some(broker.addr.to_string()));
        let mut c = client(&proxy);
        c.write_all(&other_frame(18, 1)).unwrap();
        assert_eq!(response(&mut c), Some((1, "resp:18".into())));
    }

    #[test]
    fn oversized_and_negative_frames_close_the_connection() {
        let broker = fake_broker();
        let proxy = start(Some(broker.addr), 0.0, DropMode::Close);
        for size in [(1i32 << 16) + 1, -5] {
            let mut c = client(&proxy);
            c.write_all(&size.to_be_bytes()).unwrap();
            assert_eq!(response(&mut c), None);
        }
        wait_until("two protocol errors", || proxy.stats().protocol_errors == 2);
        assert_eq!(broker.requests.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn shutdown_closes_open_connections_and_stops_accepting() {
        let broker = fake_broker();
        let mut proxy = start(Some(broker.addr), 0.0, DropMode::Close);
        let addr = proxy.local_addr();
        let mut c = client(&proxy);
        c.write_all(&other_frame(18, 1)).unwrap();
        assert_eq!(response(&mut c), Some((1, "resp:18".into())));
        let stats = proxy.shutdown();
        assert_eq!(stats.connections_active, 0);
        assert_eq!(response(&mut c), None);
        assert!(
            TcpStream::connect(addr).is_err(),
            "still accepting after shutdown"
        );
    }

    #[test]
    fn too_many_connections_are_refused() {
        let broker = fake_broker();
        let proxy = FaultProxy::start(ProxyConfig {
            upstream: Some(broker.addr.to_string()),
            max_connections: 1,
            ..ProxyConfig::default()
        })
        .unwrap();
        let mut a = client(&proxy);
        a.write_all(&other_frame(18, 1)).unwrap();
        assert_eq!(response(&mut a), Some((1, "resp:18".into())));
        let mut b = client(&proxy);
        assert_eq!(response(&mut b), None);
        assert_eq!(proxy.stats().connections_rejected, 1);
    }
}
