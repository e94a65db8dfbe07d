//! The Kafka wire protocol by hand: one blocking client connection that encodes and decodes with
//! the `kafka-protocol` crate ([`RawConn`]), the record batches such a client sends, and the
//! frame reading the tools' own servers (`faultproxy`, `null_broker`) share with it.
//!
//! [`RawConn`] serves the share-group workload of `strand-queue-bench` and the compatibility
//! tests (which drive exact protocol versions and bad input with it):
//!
//! * [`RawConn::request`] sends one typed request (any version the crate knows) and decodes the
//!   answer, checking the correlation id and that the whole frame was consumed;
//!   [`RawConn::request_sized`] also returns the answer's size on the wire.
//! * [`RawConn::send_request`] and [`RawConn::read_response`] split the two, so that several
//!   requests can be in flight; [`ResponseBytes::decode`] decodes an answer later.
//! * [`RawConn::raw_request`] sends any encodable body under any API key and returns the answer
//!   undecoded; [`RawConn::send_frame`] and [`RawConn::send_bytes`] put arbitrary bytes on the
//!   wire, [`RawConn::read_frame`] reads one frame whatever it holds, and
//!   [`RawConn::expect_closed`] checks that the peer closed the connection; [`request_frame`]
//!   encodes a request for a test that writes it in pieces of its own choosing.
//!
//! Every answer is checked against a maximum size ([`ConnOptions::max_response_bytes`]) before
//! anything is allocated for it; reads (and, if asked, writes) time out.

use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use anyhow::{anyhow, ensure, Context, Result};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, RequestHeader, ResponseHeader};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, Request, StrBytes};
use kafka_protocol::records::{Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType};

/// Client id of a connection made with [`ConnOptions::default`].
pub const DEFAULT_CLIENT_ID: &str = "strand-raw-client";
/// Largest answer a connection made with [`ConnOptions::default`] accepts.
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 256 << 20;

/// How [`RawConn::connect_with`] connects, and what the connection accepts.
#[derive(Clone, Debug)]
pub struct ConnOptions {
    /// The client id of every request header.
    pub client_id: &'static str,
    /// Longest wait for the TCP connection, per resolved address.
    pub connect_timeout: Duration,
    /// Longest wait for any read (an answer's first byte, or the rest of it).
    pub read_timeout: Duration,
    /// Longest wait for a write; `None`: writes block until the peer takes the bytes.
    pub write_timeout: Option<Duration>,
    /// Largest answer frame accepted (after its size prefix); a larger one is an error.
    pub max_response_bytes: usize,
}

impl Default for ConnOptions {
    fn default() -> Self {
        ConnOptions {
            client_id: DEFAULT_CLIENT_ID,
            connect_timeout: Duration::from_secs(10),
            read_timeout: Duration::from_secs(15),
            write_timeout: None,
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
        }
    }
}

/// One blocking TCP connection speaking the Kafka protocol.
pub struct RawConn {
    stream: TcpStream,
    next_correlation_id: i32,
    client_id: &'static str,
    max_response_bytes: usize,
    /// Peer address, as given to `connect`.
    pub addr: String,
}

/// An undecoded answer: the frame after its size prefix.
#[derive(Clone, Debug)]
pub struct ResponseBytes {
    /// The whole frame (correlation id, header tagged fields if any, body).
    pub frame: Bytes,
    /// The correlation id read from the first four bytes.
    pub correlation_id: i32,
}

impl ResponseBytes {
    /// Decodes header and body as the answer of version `version`, requiring that nothing is
    /// left over.
    pub fn decode<Resp: Decodable + HeaderVersion>(&self, version: i16) -> Result<Resp> {
        let what = short_type_name::<Resp>();
        let mut buf = self.frame.clone();
        ResponseHeader::decode(&mut buf, Resp::header_version(version))
            .with_context(|| format!("decoding the {what} header"))?;
        let resp = Resp::decode(&mut buf, version).with_context(|| format!("decoding {what} v{version}"))?;
        ensure!(
            buf.remaining() == 0,
            "{} bytes left over after decoding {what} v{version}",
            buf.remaining()
        );
        Ok(resp)
    }
}

/// The last segment of a type's path (`ShareFetchRequest`), for error messages.
fn short_type_name<T>() -> &'static str {
    let name = std::any::type_name::<T>();
    name.rsplit("::").next().unwrap_or(name)
}

impl RawConn {
    /// Connects with [`ConnOptions::default`].
    pub fn connect(addr: &str) -> Result<RawConn> {
        RawConn::connect_with(addr, &ConnOptions::default())
    }

    /// Connects to the first address `addr` resolves to that accepts, with `options`.
    pub fn connect_with(addr: &str, options: &ConnOptions) -> Result<RawConn> {
        let mut last = None;
        let mut connected = None;
        for sock in addr
            .to_socket_addrs()
            .with_context(|| format!("resolving {addr}"))?
        {
            match TcpStream::connect_timeout(&sock, options.connect_timeout) {
                Ok(s) => {
                    connected = Some(s);
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        let stream = match (connected, last) {
            (Some(s), _) => s,
            (None, Some(e)) => return Err(e).with_context(|| format!("connecting to {addr}")),
            (None, None) => return Err(anyhow!("{addr} resolves to no address")),
        };
        stream.set_read_timeout(Some(options.read_timeout))?;
        stream.set_write_timeout(options.write_timeout)?;
        stream.set_nodelay(true)?;
        Ok(RawConn {
            stream,
            next_correlation_id: 1,
            client_id: options.client_id,
            max_response_bytes: options.max_response_bytes,
            addr: addr.to_string(),
        })
    }

    /// Changes the read timeout.
    pub fn set_read_timeout(&mut self, t: Duration) -> io::Result<()> {
        self.stream.set_read_timeout(Some(t))
    }

    fn take_correlation_id(&mut self) -> i32 {
        let id = self.next_correlation_id;
        self.next_correlation_id = id.wrapping_add(1).max(1);
        id
    }

    /// Sends a typed request and decodes its answer.
    pub fn request<R: Request>(&mut self, version: i16, req: &R) -> Result<R::Response> {
        self.request_sized(version, req).map(|(resp, _)| resp)
    }

    /// Sends a typed request and decodes its answer; also returns the answer's size in bytes
    /// (size prefix included).
    pub fn request_sized<R: Request>(&mut self, version: i16, req: &R) -> Result<(R::Response, usize)> {
        let what = short_type_name::<R>();
        let corr = self.send_request(version, req)?;
        let resp = self
            .read_response()
            .with_context(|| format!("reading the answer to {what} from {}", self.addr))?;
        ensure!(
            resp.correlation_id == corr,
            "the answer to {what} has correlation id {}, {corr} was sent",
            resp.correlation_id
        );
        Ok((resp.decode::<R::Response>(version)?, resp.frame.len() + 4))
    }

    /// Sends a typed request without reading the answer; returns its correlation id.
    pub fn send_request<R: Request>(&mut self, version: i16, req: &R) -> Result<i32> {
        let what = short_type_name::<R>();
        let corr = self.take_correlation_id();
        let frame = request_frame(
            self.client_id,
            R::KEY,
            version,
            R::header_version(version),
            corr,
            req,
        )
        .with_context(|| format!("encoding {what} v{version}"))?;
        self.stream
            .write_all(&frame)
            .with_context(|| format!("sending {what} to {}", self.addr))?;
        Ok(corr)
    }

    /// Sends `req` encoded as version `version` under `api_key` (known or not; an unknown key
    /// gets request header v1) and returns the answer undecoded.
    pub fn raw_request<Req: Encodable>(
        &mut self,
        api_key: i16,
        version: i16,
        req: &Req,
    ) -> Result<ResponseBytes> {
        let header_version = ApiKey::try_from(api_key)
            .map(|k| k.request_header_version(version))
            .unwrap_or(1);
        let corr = self.take_correlation_id();
        let frame = request_frame(self.client_id, api_key, version, header_version, corr, req)?;
        self.stream.write_all(&frame)?;
        let resp = self.read_response()?;
        ensure!(
            resp.correlation_id == corr,
            "correlation id {} != {corr}",
            resp.correlation_id
        );
        Ok(resp)
    }

    /// Writes `payload` with a 4-byte big-endian size prefix.
    pub fn send_frame(&mut self, payload: &[u8]) -> io::Result<()> {
        let mut frame = Vec::with_capacity(payload.len() + 4);
        frame.extend_from_slice(&(payload.len() as i32).to_be_bytes());
        frame.extend_from_slice(payload);
        self.stream.write_all(&frame)
    }

    /// Writes raw bytes, nothing added.
    pub fn send_bytes(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.stream.write_all(bytes)
    }

    /// Reads one answer frame. An error of kind `UnexpectedEof` means the peer closed.
    pub fn read_response(&mut self) -> Result<ResponseBytes> {
        let frame = self.read_frame()?.ok_or_else(|| {
            io::Error::new(io::ErrorKind::UnexpectedEof, "the broker closed the connection")
        })?;
        let head = frame
            .first_chunk::<4>()
            .ok_or_else(|| anyhow!("answer frame of {} bytes", frame.len()))?;
        let correlation_id = i32::from_be_bytes(*head);
        Ok(ResponseBytes {
            frame,
            correlation_id,
        })
    }

    /// Reads one frame; `Ok(None)` when the peer closed (EOF or reset) before its first byte.
    /// A size above the connection's maximum is an `InvalidData` error, before anything is
    /// allocated.
    pub fn read_frame(&mut self) -> io::Result<Option<Bytes>> {
        let Some(size) = read_size_prefix(&mut self.stream)? else {
            return Ok(None);
        };
        let len = i32::from_be_bytes(size);
        let len = usize::try_from(len)
            .ok()
            .filter(|n| *n <= self.max_response_bytes)
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("answer frame length {len} (at most {})", self.max_response_bytes),
                )
            })?;
        let mut buf = vec![0u8; len];
        let n = read_full(&mut self.stream, &mut buf)?;
        if n != len {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("closed after {n} of {len} bytes of an answer"),
            ));
        }
        Ok(Some(Bytes::from(buf)))
    }

    /// Checks that the peer closes the connection within `within` without sending anything.
    /// Returns a description of what happened otherwise.
    pub fn expect_closed(&mut self, within: Duration) -> Result<(), String> {
        self.stream
            .set_read_timeout(Some(within))
            .map_err(|e| e.to_string())?;
        let mut buf = [0u8; 4096];
        match self.stream.read(&mut buf) {
            Ok(0) => Ok(()),
            Ok(n) => Err(format!(
                "the broker answered ({n} bytes: {:02x?}) instead of closing",
                &buf[..n.min(64)]
            )),
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => Ok(()),
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                Err(format!("the connection was still open after {within:?}"))
            }
            Err(e) => Err(format!("read error {e} (neither a close nor an answer)")),
        }
    }
}

/// Encodes a request frame: size prefix, request header (version `header_version`, with
/// `client_id`), body.
pub fn request_frame<Req: Encodable>(
    client_id: &'static str,
    api_key: i16,
    version: i16,
    header_version: i16,
    correlation_id: i32,
    req: &Req,
) -> Result<BytesMut> {
    let header = RequestHeader::default()
        .with_request_api_key(api_key)
        .with_request_api_version(version)
        .with_correlation_id(correlation_id)
        .with_client_id(Some(StrBytes::from_static_str(client_id)));
    let mut frame = BytesMut::with_capacity(256);
    frame.put_i32(0);
    header.encode(&mut frame, header_version)?;
    req.encode(&mut frame, version)?;
    let len = i32::try_from(frame.len() - 4).context("request frame too large")?;
    frame[..4].copy_from_slice(&len.to_be_bytes());
    Ok(frame)
}

/// Reads the 4-byte size prefix of a frame. `Ok(None)` when the peer closed (EOF, or a
/// connection reset) before its first byte; `UnexpectedEof` when it closed within it.
pub fn read_size_prefix(stream: &mut impl Read) -> io::Result<Option<[u8; 4]>> {
    let mut size = [0u8; 4];
    match read_full(stream, &mut size)? {
        0 => Ok(None),
        4 => Ok(Some(size)),
        n => Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("closed after {n} bytes of a size prefix"),
        )),
    }
}

/// Reads until `buf` is full or EOF; returns the bytes read. A connection reset before any
/// byte counts as EOF.
fn read_full(stream: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match stream.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset && n == 0 => break,
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// A record for [`encode_batch`]: key, value, timestamp; no headers.
pub fn record(key: Option<&[u8]>, value: Option<&[u8]>, timestamp: i64) -> Record {
    Record {
        transactional: false,
        control: false,
        delete_horizon: false,
        partition_leader_epoch: -1,
        producer_id: -1,
        producer_epoch: -1,
        timestamp_type: TimestampType::Creation,
        offset: 0,
        sequence: -1,
        timestamp,
        key: key.map(Bytes::copy_from_slice),
        value: value.map(Bytes::copy_from_slice),
        headers: Default::default(),
    }
}

/// Encodes records as exactly one v2 record batch (base offset 0, offset deltas 0..n, no
/// producer id, base sequence -1), as Produce v3+ requires.
pub fn encode_batch(records: &[Record], compression: Compression) -> Bytes {
    encode_batch_at(0, records, compression)
}

/// [`encode_batch`] with base offset `base_offset` (a batch as a log or a fetch answer holds it).
pub fn encode_batch_at(base_offset: i64, records: &[Record], compression: Compression) -> Bytes {
    // The encoder starts a new batch whenever `offset - sequence` changes; keep it constant
    // while the batch's base sequence stays -1 (no idempotence).
    encode_one_batch(records, compression, |i, r| {
        r.offset = base_offset + i as i64;
        r.sequence = i as i32 - 1;
    })
}

/// Encodes records as exactly one v2 record batch of an idempotent producer: producer id
/// `producer_id`, epoch `producer_epoch`, sequences `base_sequence..base_sequence + n` (base
/// offset 0, offset deltas 0..n, not transactional).
pub fn encode_idempotent_batch(
    records: &[Record],
    compression: Compression,
    producer_id: i64,
    producer_epoch: i16,
    base_sequence: i32,
) -> Bytes {
    encode_one_batch(records, compression, |i, r| {
        r.offset = i as i64;
        r.producer_id = producer_id;
        r.producer_epoch = producer_epoch;
        r.sequence = base_sequence.wrapping_add(i as i32);
    })
}

/// Encodes `records`, each first adjusted by `place(index, record)`, as v2 record batches.
fn encode_one_batch(
    records: &[Record],
    compression: Compression,
    place: impl Fn(usize, &mut Record),
) -> Bytes {
    let records: Vec<Record> = records
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let mut r = r.clone();
            place(i, &mut r);
            r
        })
        .collect();
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut buf,
        &records,
        &RecordEncodeOptions {
            version: 2,
            compression,
        },
    )
    .expect("encode a record batch");
    buf.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::null_broker::{NullBroker, NullBrokerConfig};
    use kafka_protocol::messages::{ApiVersionsRequest, ApiVersionsResponse, MetadataRequest};
    use kafka_protocol::records::RecordBatchDecoder;

    fn null_broker() -> (NullBroker, String) {
        let broker = NullBroker::start(NullBrokerConfig::default()).unwrap();
        let addr = broker.local_addr().to_string();
        (broker, addr)
    }

    #[test]
    fn typed_requests_round_trip_and_count_their_bytes() {
        let (_broker, addr) = null_broker();
        let mut c = RawConn::connect(&addr).unwrap();
        let (resp, size) = c.request_sized(3, &ApiVersionsRequest::default()).unwrap();
        assert_eq!(resp.error_code, 0);
        assert!(size > 8, "{size}");
        // Pipelined: two in flight, answered in order, decoded later.
        let first = c.send_request(3, &ApiVersionsRequest::default()).unwrap();
        let second = c
            .send_request(9, &MetadataRequest::default().with_topics(None))
            .unwrap();
        let a = c.read_response().unwrap();
        let b = c.read_response().unwrap();
        assert_eq!((a.correlation_id, b.correlation_id), (first, second));
        let versions: ApiVersionsResponse = a.decode(3).unwrap();
        assert_eq!(versions.error_code, 0);
        // Decoding as the wrong version leaves bytes over, or fails.
        assert!(a.decode::<ApiVersionsResponse>(0).is_err());
    }

    #[test]
    fn an_answer_above_the_maximum_is_refused_before_it_is_read() {
        let (_broker, addr) = null_broker();
        let options = ConnOptions {
            max_response_bytes: 16,
            ..ConnOptions::default()
        };
        let mut c = RawConn::connect_with(&addr, &options).unwrap();
        let e = c.request(3, &ApiVersionsRequest::default()).unwrap_err();
        let io = e.downcast_ref::<io::Error>().map(io::Error::kind);
        assert_eq!(io, Some(io::ErrorKind::InvalidData), "{e:#}");
    }

    #[test]
    fn bad_input_closes_and_expect_closed_sees_it() {
        let (_broker, addr) = null_broker();
        let mut c = RawConn::connect(&addr).unwrap();
        c.send_bytes(&(-1i32).to_be_bytes()).unwrap();
        c.expect_closed(Duration::from_secs(5)).unwrap();
        let mut idle = RawConn::connect(&addr).unwrap();
        assert!(idle.expect_closed(Duration::from_millis(50)).is_err());
        // An unknown API key, sent undecoded, closes the connection too.
        let mut c = RawConn::connect(&addr).unwrap();
        assert!(c.raw_request(999, 0, &ApiVersionsRequest::default()).is_err());
    }

    #[test]
    fn size_prefixes_tell_a_close_from_a_torn_frame() {
        assert_eq!(read_size_prefix(&mut &[][..]).unwrap(), None);
        assert_eq!(
            read_size_prefix(&mut &[0, 0, 1, 0, 9][..]).unwrap(),
            Some([0, 0, 1, 0])
        );
        let e = read_size_prefix(&mut &[0, 0][..]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn batches_hold_their_offsets_and_producer() {
        let recs: Vec<Record> = (0..3u8).map(|i| record(None, Some(&[i]), 7)).collect();
        let mut plain = encode_batch_at(10, &recs, Compression::None);
        let set = RecordBatchDecoder::decode(&mut plain).unwrap();
        let offsets: Vec<i64> = set.records.iter().map(|r| r.offset).collect();
        assert_eq!(offsets, vec![10, 11, 12]);
        assert!(set.records.iter().all(|r| r.producer_id == -1));
        let mut idem = encode_idempotent_batch(&recs, Compression::None, 5, 1, 40);
        let set = RecordBatchDecoder::decode(&mut idem).unwrap();
        let seqs: Vec<(i64, i16, i32)> = set
            .records
            .iter()
            .map(|r| (r.producer_id, r.producer_epoch, r.sequence))
            .collect();
        assert_eq!(seqs, vec![(5, 1, 40), (5, 1, 41), (5, 1, 42)]);
    }
}
