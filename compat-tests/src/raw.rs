//! A minimal blocking Kafka client for exact-protocol and bad-input tests.
//!
//! [`RawConn::request`] sends one typed request (any version the `kafka-protocol` crate
//! knows) and decodes the answer, checking the correlation id and that the whole frame was
//! consumed. [`RawConn::raw_request`] sends any encodable body under any API key and
//! returns the answer undecoded; [`RawConn::send_frame`] / [`RawConn::send_bytes`] put
//! arbitrary bytes on the wire and [`RawConn::expect_closed`] checks that the broker closed
//! the connection.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, RequestHeader, ResponseHeader};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, Request, StrBytes};
use kafka_protocol::records::{Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType};

/// Client id the raw connections send.
pub const CLIENT_ID: &str = "strand-compat-raw";
/// Largest answer the raw client accepts.
pub const MAX_RESPONSE: usize = 256 * 1024 * 1024;

/// One TCP connection speaking the Kafka protocol.
pub struct RawConn {
    stream: TcpStream,
    next_correlation_id: i32,
    /// Peer address.
    pub addr: String,
}

/// An undecoded answer: the frame after its length prefix.
#[derive(Clone, Debug)]
pub struct ResponseBytes {
    /// The whole frame (correlation id, header tagged fields if any, body).
    pub frame: Bytes,
    /// The correlation id read from the first four bytes.
    pub correlation_id: i32,
}

impl ResponseBytes {
    /// Decodes header and body as the answer of version `version`, requiring that nothing
    /// is left over.
    pub fn decode<Resp: Decodable + HeaderVersion>(&self, version: i16) -> anyhow::Result<Resp> {
        let mut buf = self.frame.clone();
        let _header = ResponseHeader::decode(&mut buf, Resp::header_version(version))?;
        let resp = Resp::decode(&mut buf, version)?;
        anyhow::ensure!(
            buf.remaining() == 0,
            "{} bytes left over after decoding the response as version {version}",
            buf.remaining()
        );
        Ok(resp)
    }
}

impl RawConn {
    /// Connects with a 15 s read timeout.
    pub fn connect(addr: &str) -> std::io::Result<RawConn> {
        let stream = TcpStream::connect(addr)?;
        stream.set_read_timeout(Some(Duration::from_secs(15)))?;
        stream.set_nodelay(true)?;
        Ok(RawConn {
            stream,
            next_correlation_id: 1,
            addr: addr.to_string(),
        })
    }

    /// Changes the read timeout.
    pub fn set_read_timeout(&mut self, t: Duration) -> std::io::Result<()> {
        self.stream.set_read_timeout(Some(t))
    }

    /// Encodes a request frame (length prefix included) with the given header version.
    pub fn encode_frame<Req: Encodable>(
        api_key: i16,
        version: i16,
        header_version: i16,
        correlation_id: i32,
        req: &Req,
    ) -> anyhow::Result<BytesMut> {
        let header = RequestHeader::default()
            .with_request_api_key(api_key)
            .with_request_api_version(version)
            .with_correlation_id(correlation_id)
            .with_client_id(Some(StrBytes::from_static_str(CLIENT_ID)));
        let mut body = BytesMut::new();
        header.encode(&mut body, header_version)?;
        req.encode(&mut body, version)?;
        let mut frame = BytesMut::with_capacity(body.len() + 4);
        frame.put_i32(i32::try_from(body.len())?);
        frame.put_slice(&body);
        Ok(frame)
    }

    fn take_correlation_id(&mut self) -> i32 {
        let id = self.next_correlation_id;
        self.next_correlation_id += 1;
        id
    }

    /// Sends a typed request and decodes its answer.
    pub fn request<R: Request>(&mut self, version: i16, req: &R) -> anyhow::Result<R::Response> {
        let corr = self.send_request(version, req)?;
        let resp = self.read_response()?;
        anyhow::ensure!(
            resp.correlation_id == corr,
            "correlation id {} in the answer, expected {corr}",
            resp.correlation_id
        );
        resp.decode::<R::Response>(version)
    }

    /// Sends a typed request without reading the answer; returns its correlation id.
    pub fn send_request<R: Request>(&mut self, version: i16, req: &R) -> anyhow::Result<i32> {
        let corr = self.take_correlation_id();
        let frame = Self::encode_frame(R::KEY, version, R::header_version(version), corr, req)?;
        self.stream.write_all(&frame)?;
        Ok(corr)
    }

    /// Sends `req` encoded as version `version` under `api_key` (known or not; an unknown
    /// key gets request header v1) and returns the answer undecoded.
    pub fn raw_request<Req: Encodable>(
        &mut self,
        api_key: i16,
        version: i16,
        req: &Req,
    ) -> anyhow::Result<ResponseBytes> {
        let header_version = ApiKey::try_from(api_key)
            .map(|k| k.request_header_version(version))
            .unwrap_or(1);
        let corr = self.take_correlation_id();
        let frame = Self::encode_frame(api_key, version, header_version, corr, req)?;
        self.stream.write_all(&frame)?;
        let resp = self.read_response()?;
        anyhow::ensure!(
            resp.correlation_id == corr,
            "correlation id {} != {corr}",
            resp.correlation_id
        );
        Ok(resp)
    }

    /// Writes `payload` with a 4-byte big-endian length prefix.
    pub fn send_frame(&mut self, payload: &[u8]) -> std::io::Result<()> {
        let mut frame = Vec::with_capacity(payload.len() + 4);
        frame.extend_from_slice(&(payload.len() as i32).to_be_bytes());
        frame.extend_from_slice(payload);
        self.stream.write_all(&frame)
    }

    /// Writes raw bytes, nothing added.
    pub fn send_bytes(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.stream.write_all(bytes)
    }

    /// Reads one answer frame. An error of kind `UnexpectedEof` means the broker closed.
    pub fn read_response(&mut self) -> anyhow::Result<ResponseBytes> {
        match self.read_frame()? {
            Some(frame) => {
                anyhow::ensure!(frame.len() >= 4, "answer frame of {} bytes", frame.len());
                let correlation_id = i32::from_be_bytes([frame[0], frame[1], frame[2], frame[3]]);
                Ok(ResponseBytes {
                    frame,
                    correlation_id,
                })
            }
            None => Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the broker closed the connection",
            )
            .into()),
        }
    }

    /// Reads one frame; `Ok(None)` when the peer closed (EOF or reset) before its first byte.
    pub fn read_frame(&mut self) -> std::io::Result<Option<Bytes>> {
        let mut len = [0u8; 4];
        match read_full(&mut self.stream, &mut len)? {
            0 => return Ok(None),
            4 => {}
            n => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!("closed after {n} bytes of a length prefix"),
                ))
            }
        }
        let len = i32::from_be_bytes(len);
        if len < 0 || len as usize > MAX_RESPONSE {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("answer frame length {len}"),
            ));
        }
        let mut buf = vec![0u8; len as usize];
        let n = read_full(&mut self.stream, &mut buf)?;
        if n != buf.len() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("closed after {n} of {len} bytes of an answer"),
            ));
        }
        Ok(Some(Bytes::from(buf)))
    }

    /// Checks that the broker closes the connection within `within` without sending
    /// anything. Returns a description of what happened otherwise.
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
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => Ok(()),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                Err(format!("the connection was still open after {within:?}"))
            }
            Err(e) => Err(format!("read error {e} (neither a close nor an answer)")),
        }
    }
}

/// Reads until `buf` is full or EOF; returns the bytes read. A connection reset before any
/// byte counts as EOF.
fn read_full(stream: &mut TcpStream, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match stream.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset && n == 0 => break,
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// A record for [`encode_batch`]: key, value, headers, timestamp.
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
    let records: Vec<Record> = records
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let mut r = r.clone();
            r.offset = i as i64;
            // The encoder starts a new batch whenever `offset - sequence` changes; keep it
            // constant while the batch's base sequence stays -1 (no idempotence).
            r.sequence = i as i32 - 1;
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

/// Encodes records as exactly one v2 record batch of an idempotent producer: producer id
/// `producer_id`, epoch `producer_epoch`, sequences `base_sequence..base_sequence + n`
/// (base offset 0, offset deltas 0..n, not transactional).
pub fn encode_idempotent_batch(
    records: &[Record],
    compression: Compression,
    producer_id: i64,
    producer_epoch: i16,
    base_sequence: i32,
) -> Bytes {
    let records: Vec<Record> = records
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let mut r = r.clone();
            r.offset = i as i64;
            r.producer_id = producer_id;
            r.producer_epoch = producer_epoch;
            r.sequence = base_sequence.wrapping_add(i as i32);
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

/// One record batch's position in a log segment file, as walked by [`walk_batches`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchPos {
    /// Byte position of the batch in the file.
    pub position: u64,
    /// Total size (12-byte prefix + length).
    pub size: u64,
    /// Base offset.
    pub base_offset: i64,
    /// Last offset (base offset + last offset delta).
    pub last_offset: i64,
}

/// Walks the complete v2 record batches at the start of a segment file (8-byte base
/// offset, 4-byte length, ..., CRC-32C over attributes..end). Stops at the first incomplete,
/// implausible or CRC-failing batch (a torn tail, zero pre-allocation); returns the valid
/// batches and the byte length they cover.
pub fn walk_batches(file: &[u8]) -> (Vec<BatchPos>, u64) {
    let mut out = Vec::new();
    let mut pos = 0usize;
    while pos + 61 <= file.len() {
        let b = &file[pos..];
        let base_offset = i64::from_be_bytes(b[0..8].try_into().expect("8 bytes"));
        let length = i32::from_be_bytes(b[8..12].try_into().expect("4 bytes"));
        let magic = b[16];
        if length < 49 || magic != 2 || base_offset < 0 {
            break;
        }
        let size = 12 + length as usize;
        if pos + size > file.len() {
            break;
        }
        let crc = u32::from_be_bytes(b[17..21].try_into().expect("4 bytes"));
        if crc32c::crc32c(&b[21..size]) != crc {
            break;
        }
        let last_delta = i32::from_be_bytes(b[23..27].try_into().expect("4 bytes"));
        out.push(BatchPos {
            position: pos as u64,
            size: size as u64,
            base_offset,
            last_offset: base_offset + i64::from(last_delta),
        });
        pos += size;
    }
    (out, pos as u64)
}
