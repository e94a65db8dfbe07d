//! A small blocking client of the HTTP queue API (docs/http-api.md): the end-to-end tests and
//! the queue benchmark use it.
//!
//! * [`HttpConn`]: one HTTP/1.1 keep-alive connection over `std::net::TcpStream`, requests with
//!   `Content-Length` bodies, answers read by `Content-Length` (the broker always sends one). It
//!   connects lazily and forgets its connection after any I/O error or a `Connection: close`
//!   answer, so the next request connects again: a caller retries through a broker restart by
//!   simply calling again. [`HttpConn::send_raw`] sends arbitrary bytes (malformed requests).
//! * [`QueueClient`]: the queue endpoints with JSON bodies (`serde_json`) on top of it, answering
//!   [`CallError::Io`] for a connection failure (the request may or may not have been applied)
//!   and [`CallError::Status`] for an HTTP error answer (with the body's `error` code).
//!
//! No retries here: what a retry means (a publish with dedup tokens, an ack with the same
//! generation) is the test's business.

use std::collections::BTreeMap;
use std::fmt;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// Longest answer head the client accepts.
const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Largest answer body the client accepts.
const MAX_BODY_BYTES: usize = 256 * 1024 * 1024;

/// An HTTP answer.
#[derive(Clone, Debug)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// Header lines in order, names as sent.
    pub headers: Vec<(String, String)>,
    /// The body (`Content-Length` bytes).
    pub body: Vec<u8>,
}

impl Response {
    /// The first header of that name (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The body as (lossy) text, for messages.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON.
    pub fn json(&self) -> Result<Value, String> {
        serde_json::from_slice(&self.body)
            .map_err(|e| format!("answer {} is not JSON ({e}): {:?}", self.status, self.text()))
    }

    /// The `error` code of an error answer's JSON body.
    pub fn error_code(&self) -> Option<String> {
        self.json()
            .ok()?
            .get("error")
            .and_then(Value::as_str)
            .map(str::to_owned)
    }

    /// Whether the server said it closes the connection after this answer.
    pub fn closes(&self) -> bool {
        self.header("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"))
    }
}

/// One keep-alive HTTP/1.1 connection to `addr`, (re)connected on demand.
pub struct HttpConn {
    addr: String,
    stream: Option<BufReader<TcpStream>>,
    read_timeout: Duration,
    connect_timeout: Duration,
}

impl HttpConn {
    /// A connection to `addr` (`host:port`); nothing is connected until the first request.
    /// The read timeout (default 60 s) bounds the wait for an answer.
    pub fn new(addr: &str) -> HttpConn {
        HttpConn {
            addr: addr.to_owned(),
            stream: None,
            read_timeout: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(5),
        }
    }

    /// The address this connection goes to.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// How long to wait for (each read of) an answer. Applies to the next connection too.
    pub fn set_read_timeout(&mut self, timeout: Duration) {
        self.read_timeout = timeout;
        if let Some(s) = &self.stream {
            let _ = s.get_ref().set_read_timeout(Some(timeout));
        }
    }

    /// Whether a connection is currently open (as far as the client knows).
    pub fn is_connected(&self) -> bool {
        self.stream.is_some()
    }

    /// Drops the connection (the server sees the peer close it).
    pub fn disconnect(&mut self) {
        if let Some(s) = self.stream.take() {
            let _ = s.get_ref().shutdown(std::net::Shutdown::Both);
        }
    }

    fn connect(&mut self) -> io::Result<&mut BufReader<TcpStream>> {
        if self.stream.is_none() {
            let mut last = io::Error::new(
                io::ErrorKind::NotFound,
                format!("{} resolves to nothing", self.addr),
            );
            let addrs = std::net::ToSocketAddrs::to_socket_addrs(&self.addr.as_str())?;
            for a in addrs {
                match TcpStream::connect_timeout(&a, self.connect_timeout) {
                    Ok(s) => {
                        s.set_nodelay(true)?;
                        s.set_read_timeout(Some(self.read_timeout))?;
                        s.set_write_timeout(Some(Duration::from_secs(30)))?;
                        self.stream = Some(BufReader::new(s));
                        break;
                    }
                    Err(e) => last = e,
                }
            }
            if self.stream.is_none() {
                return Err(last);
            }
        }
        self.stream
            .as_mut()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotConnected, "not connected"))
    }

    /// Sends one request with an optional body (`Content-Length`, `Content-Type:
    /// application/json`) and reads its answer. On any I/O error the connection is dropped
    /// (the next call connects again) and the error is returned: the request may or may not
    /// have reached the server.
    pub fn request(&mut self, method: &str, path: &str, body: Option<&[u8]>) -> io::Result<Response> {
        let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {}\r\n", self.addr);
        if let Some(b) = body {
            head.push_str(&format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n",
                b.len()
            ));
        }
        head.push_str("\r\n");
        let mut bytes = head.into_bytes();
        if let Some(b) = body {
            bytes.extend_from_slice(b);
        }
        let result = self.exchange(&bytes, method == "HEAD");
        self.settle_connection(&result);
        result
    }

    /// Writes `bytes` as they are (a request of the caller's making, possibly malformed or with a
    /// body the server refuses to read) and reads one answer. The bytes are written by a second
    /// thread while this one reads, so an answer the server sends before reading everything (413
    /// on `Content-Length`) is read even if the server then closes the connection.
    pub fn send_raw(&mut self, bytes: &[u8]) -> io::Result<Response> {
        let result = (|| {
            let stream = self.connect()?;
            let mut writer = stream.get_ref().try_clone()?;
            let data = bytes.to_vec();
            let handle = std::thread::spawn(move || {
                let r = writer.write_all(&data).and_then(|()| writer.flush());
                r.is_ok()
            });
            let r = read_response(stream, false);
            let _ = handle.join();
            r
        })();
        self.settle_connection(&result);
        result
    }

    fn exchange(&mut self, bytes: &[u8], head_only: bool) -> io::Result<Response> {
        let stream = self.connect()?;
        stream.get_mut().write_all(bytes)?;
        stream.get_mut().flush()?;
        read_response(stream, head_only)
    }

    fn settle_connection(&mut self, result: &io::Result<Response>) {
        match result {
            Ok(r) if !r.closes() => {}
            _ => self.disconnect(),
        }
    }
}

fn bad_data(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

/// Reads a line of an answer head into `line`; the end of the stream is an error that says
/// `where_` it came.
fn read_head_line(stream: &mut BufReader<TcpStream>, line: &mut String, where_: &str) -> io::Result<()> {
    if stream.read_line(line)? == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("the server closed the connection {where_}"),
        ));
    }
    Ok(())
}

/// Reads one answer (skipping `100 Continue`).
fn read_response(stream: &mut BufReader<TcpStream>, head_only: bool) -> io::Result<Response> {
    loop {
        let mut head_bytes = 0usize;
        let mut status_line = String::new();
        read_head_line(stream, &mut status_line, "before answering")?;
        head_bytes += status_line.len();
        let mut parts = status_line.trim_end().splitn(3, ' ');
        let version = parts.next().unwrap_or_default();
        if !version.starts_with("HTTP/1.") {
            return Err(bad_data(format!("bad status line {status_line:?}")));
        }
        let status: u16 = parts
            .next()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| bad_data(format!("bad status line {status_line:?}")))?;
        let mut headers = Vec::new();
        loop {
            let mut line = String::new();
            read_head_line(stream, &mut line, "in an answer head")?;
            head_bytes += line.len();
            if head_bytes > MAX_HEAD_BYTES {
                return Err(bad_data("answer head too large"));
            }
            let line = line.trim_end_matches(['\r', '\n']);
            if line.is_empty() {
                break;
            }
            let (k, v) = line
                .split_once(':')
                .ok_or_else(|| bad_data(format!("bad header line {line:?}")))?;
            headers.push((k.trim().to_owned(), v.trim().to_owned()));
        }
        if status == 100 {
            continue;
        }
        let mut response = Response {
            status,
            headers,
            body: Vec::new(),
        };
        if head_only {
            return Ok(response);
        }
        if response
            .header("transfer-encoding")
            .is_some_and(|v| !v.eq_ignore_ascii_case("identity"))
        {
            return Err(bad_data("chunked answers are not supported by this client"));
        }
        let len: usize = match response.header("content-length") {
            Some(v) => v
                .parse()
                .map_err(|_| bad_data(format!("bad Content-Length {v:?}")))?,
            None => return Err(bad_data("an answer without Content-Length")),
        };
        if len > MAX_BODY_BYTES {
            return Err(bad_data(format!("answer body of {len} bytes")));
        }
        let mut body = vec![0u8; len];
        stream.read_exact(&mut body)?;
        response.body = body;
        return Ok(response);
    }
}

/// Why a queue API call failed.
#[derive(Debug)]
pub enum CallError {
    /// The connection failed (refused, reset, closed, timed out): the request may or may not
    /// have been applied.
    Io(io::Error),
    /// An HTTP error answer.
    Status {
        /// HTTP status.
        status: u16,
        /// The body's `error` code (empty if the body had none).
        code: String,
        /// The whole body, as text.
        body: String,
    },
    /// A success answer whose body is not what the contract says.
    Decode(String),
}

impl CallError {
    /// Whether this is a connection failure (worth retrying).
    pub fn is_io(&self) -> bool {
        matches!(self, CallError::Io(_))
    }

    /// `(status, code)` of an HTTP error answer.
    pub fn status(&self) -> Option<(u16, &str)> {
        match self {
            CallError::Status { status, code, .. } => Some((*status, code.as_str())),
            _ => None,
        }
    }
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CallError::Io(e) => write!(f, "connection error: {e}"),
            CallError::Status { status, body, .. } => write!(f, "HTTP {status}: {body}"),
            CallError::Decode(e) => write!(f, "unexpected answer: {e}"),
        }
    }
}

impl std::error::Error for CallError {}

/// One message to publish (`POST /v1/queues/{queue}/messages`); what is absent is not sent.
#[derive(Clone, Debug, Default, Serialize)]
pub struct OutMessage {
    /// UTF-8 payload (`payload`).
    pub payload: String,
    /// `key`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// `headers`, sent as one object.
    #[serde(skip_serializing_if = "Vec::is_empty", serialize_with = "as_object")]
    pub headers: Vec<(String, String)>,
    /// `delay_ms`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<u64>,
    /// `dedup_token`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dedup_token: Option<String>,
}

/// Name-value pairs as one JSON object (a name given twice: the last value).
fn as_object<S: serde::Serializer>(pairs: &[(String, String)], s: S) -> Result<S::Ok, S::Error> {
    s.collect_map(pairs.iter().map(|(k, v)| (k, v)))
}

impl OutMessage {
    /// A message with this payload and nothing else.
    pub fn new(payload: impl Into<String>) -> OutMessage {
        OutMessage {
            payload: payload.into(),
            ..OutMessage::default()
        }
    }

    /// With a key.
    pub fn key(mut self, key: impl Into<String>) -> OutMessage {
        self.key = Some(key.into());
        self
    }

    /// With a header.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> OutMessage {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// With a delay.
    pub fn delay_ms(mut self, ms: u64) -> OutMessage {
        self.delay_ms = Some(ms);
        self
    }

    /// With a dedup token.
    pub fn dedup_token(mut self, token: impl Into<String>) -> OutMessage {
        self.dedup_token = Some(token.into());
        self
    }

    /// The JSON object of this message.
    pub fn to_json(&self) -> Value {
        json!(self)
    }
}

/// One entry of a publish answer.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct Published {
    /// Message id.
    pub id: String,
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
    /// Whether the dedup token named an earlier message.
    pub duplicate: bool,
}

/// One leased message. (Here and in the answers below, a field of type `Option` that the answer
/// leaves out reads as `None`.)
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct Leased {
    /// Message id.
    pub id: String,
    /// The lease's generation.
    pub generation: u64,
    /// Delivery count, 1 on the first delivery.
    pub attempt: u32,
    /// When the lease ends (broker clock, ms since the epoch).
    pub lease_expires_at_ms: i64,
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
    /// When it was published (broker clock).
    pub published_at_ms: i64,
    /// Key, when UTF-8.
    pub key: Option<String>,
    /// Payload, when UTF-8.
    pub payload: Option<String>,
    /// Payload, always.
    pub payload_base64: String,
    /// UTF-8 headers.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
}

/// Lease request options (`POST /v1/queues/{queue}/leases`); what is absent is not sent.
#[derive(Clone, Debug, Default, Serialize)]
pub struct LeaseOptions {
    /// `max_messages`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_messages: Option<u32>,
    /// `visibility_timeout_ms`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub visibility_timeout_ms: Option<u64>,
    /// `wait_ms`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wait_ms: Option<u64>,
    /// `group`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// `consumer`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub consumer: Option<String>,
}

impl LeaseOptions {
    /// The JSON body.
    pub fn to_json(&self) -> Value {
        json!(self)
    }
}

/// The answer of a settle (`POST /v1/messages/{id}/ack`).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct Settled {
    /// Message id.
    pub id: String,
    /// The action.
    pub action: String,
    /// `acknowledged`, `available`, `delayed`, `dead_lettered` or `leased`.
    pub state: String,
    /// For `extend`.
    pub lease_expires_at_ms: Option<i64>,
    /// For a delayed retry.
    pub available_at_ms: Option<i64>,
    /// Deliveries so far (nack, reject).
    pub attempts: Option<u32>,
}

/// One item's result of a batch settle (`POST /v1/messages/ack`): the single settle's answer, or
/// (`status` set) the refusal of that item.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct BatchSettled {
    /// Message id.
    pub id: String,
    /// The action (absent on a refused item).
    pub action: Option<String>,
    /// The state after the settle (absent on a refused item).
    pub state: Option<String>,
    /// For `extend`.
    pub lease_expires_at_ms: Option<i64>,
    /// For a delayed retry.
    pub available_at_ms: Option<i64>,
    /// Deliveries so far (nack, reject).
    pub attempts: Option<u32>,
    /// HTTP status of a refused item (e.g. 409).
    pub status: Option<u16>,
    /// Error code of a refused item (e.g. `stale_generation`).
    pub error: Option<String>,
    /// Human text of a refused item.
    pub message: Option<String>,
}

impl BatchSettled {
    /// Whether this item was settled (not refused).
    pub fn is_settled(&self) -> bool {
        self.status.is_none() && self.error.is_none()
    }
}

#[derive(Deserialize)]
struct BatchSettledAnswer {
    messages: Vec<BatchSettled>,
}

#[derive(Serialize)]
struct AckItem<'a> {
    id: &'a str,
    generation: u64,
    action: &'static str,
}

#[derive(Serialize)]
struct AckBatchBody<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    group: Option<&'a str>,
    messages: Vec<AckItem<'a>>,
}

/// A 2xx answer, or the [`CallError::Status`] of any other.
fn success(r: Response) -> Result<Response, CallError> {
    if (200..300).contains(&r.status) {
        return Ok(r);
    }
    Err(CallError::Status {
        status: r.status,
        code: r.error_code().unwrap_or_default(),
        body: r.text(),
    })
}

/// The queue API over one [`HttpConn`].
pub struct QueueClient {
    /// The connection (public for raw requests on the same connection).
    pub conn: HttpConn,
}

/// Percent-encodes a path segment (everything but unreserved characters).
pub fn encode_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

impl QueueClient {
    /// A client of the queue API at `addr` (`host:port`, e.g. `Broker::http_addr()`).
    pub fn new(addr: &str) -> QueueClient {
        QueueClient {
            conn: HttpConn::new(addr),
        }
    }

    /// Sends a request with a JSON body (or none) and returns the answer whatever its status.
    pub fn call(&mut self, method: &str, path: &str, body: Option<&Value>) -> Result<Response, CallError> {
        let bytes = body.map(|b| b.to_string().into_bytes());
        self.conn
            .request(method, path, bytes.as_deref())
            .map_err(CallError::Io)
    }

    /// Like [`Self::call`], but an answer other than 2xx is a [`CallError::Status`], and the body
    /// of a 2xx answer is returned as JSON.
    pub fn call_ok(
        &mut self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(u16, Value), CallError> {
        let r = success(self.call(method, path, body)?)?;
        let v = r.json().map_err(CallError::Decode)?;
        Ok((r.status, v))
    }

    /// `PUT /v1/queues/{queue}`: `(status, queue as GET shows it)`.
    pub fn put_queue(&mut self, queue: &str, settings: &Value) -> Result<(u16, Value), CallError> {
        self.call_ok(
            "PUT",
            &format!("/v1/queues/{}", encode_segment(queue)),
            Some(settings),
        )
    }

    /// `GET /v1/queues/{queue}`.
    pub fn get_queue(&mut self, queue: &str) -> Result<Value, CallError> {
        self.call_ok("GET", &format!("/v1/queues/{}", encode_segment(queue)), None)
            .map(|(_, v)| v)
    }

    /// `POST /v1/queues/{queue}/messages` with a batch under `messages`.
    pub fn publish(&mut self, queue: &str, messages: &[OutMessage]) -> Result<Vec<Published>, CallError> {
        let body = json!({ "messages": messages.iter().map(OutMessage::to_json).collect::<Vec<_>>() });
        let (_, v) = self.call_ok(
            "POST",
            &format!("/v1/queues/{}/messages", encode_segment(queue)),
            Some(&body),
        )?;
        let list: Vec<Published> = serde_json::from_value(v.get("messages").cloned().unwrap_or(Value::Null))
            .map_err(|e| CallError::Decode(format!("publish answer: {e}: {v}")))?;
        if list.len() != messages.len() {
            return Err(CallError::Decode(format!(
                "publish of {} messages answered {} entries: {v}",
                messages.len(),
                list.len()
            )));
        }
        Ok(list)
    }

    /// `POST /v1/queues/{queue}/leases`.
    pub fn lease(&mut self, queue: &str, opts: &LeaseOptions) -> Result<Vec<Leased>, CallError> {
        let (_, v) = self.call_ok(
            "POST",
            &format!("/v1/queues/{}/leases", encode_segment(queue)),
            Some(&opts.to_json()),
        )?;
        serde_json::from_value(v.get("messages").cloned().unwrap_or(Value::Null))
            .map_err(|e| CallError::Decode(format!("lease answer: {e}: {v}")))
    }

    /// `POST /v1/messages/{id}/ack` with `body` (`generation`, `action`, ...).
    pub fn settle(&mut self, id: &str, body: &Value) -> Result<Settled, CallError> {
        let (_, v) = self.call_ok(
            "POST",
            &format!("/v1/messages/{}/ack", encode_segment(id)),
            Some(body),
        )?;
        serde_json::from_value(v.clone()).map_err(|e| CallError::Decode(format!("settle answer: {e}: {v}")))
    }

    /// Acks `id` leased with `generation`.
    pub fn ack(&mut self, id: &str, generation: u64) -> Result<Settled, CallError> {
        self.settle(id, &json!({ "generation": generation, "action": "ack" }))
    }

    /// Nacks `id` leased with `generation`, with a reason (retry after the queue's backoff).
    pub fn nack(&mut self, id: &str, generation: u64, reason: &str) -> Result<Settled, CallError> {
        self.settle(
            id,
            &json!({ "generation": generation, "action": "nack", "reason": reason }),
        )
    }

    /// Sends `body` (JSON text already encoded) and decodes a 2xx answer's body straight into `T`
    /// (no intermediate [`Value`]: the benchmark's path); an answer other than 2xx is a
    /// [`CallError::Status`]. `what` names the call in decode errors.
    pub fn call_bytes_ok<T: DeserializeOwned>(
        &mut self,
        method: &str,
        path: &str,
        body: Option<&[u8]>,
        what: &str,
    ) -> Result<T, CallError> {
        let r = success(self.conn.request(method, path, body).map_err(CallError::Io)?)?;
        serde_json::from_slice(&r.body)
            .map_err(|e| CallError::Decode(format!("{what} answer {}: {e}: {:?}", r.status, r.text())))
    }

    /// `POST /v1/messages/ack` with `body` (`group`, `messages`): one result per item, in order.
    pub fn settle_batch(&mut self, body: &Value) -> Result<Vec<BatchSettled>, CallError> {
        let bytes = body.to_string().into_bytes();
        let answer: BatchSettledAnswer =
            self.call_bytes_ok("POST", "/v1/messages/ack", Some(&bytes), "batch settle")?;
        Ok(answer.messages)
    }

    /// Acks every `(id, generation)` in one `POST /v1/messages/ack` (1..=1000 items), in `group`
    /// (the broker's default when `None`). One result per item, in order; a refused item is in
    /// the list (see [`BatchSettled::is_settled`]), not an error. A list of the wrong length is
    /// [`CallError::Decode`].
    pub fn ack_batch(
        &mut self,
        group: Option<&str>,
        items: &[(&str, u64)],
    ) -> Result<Vec<BatchSettled>, CallError> {
        let body = AckBatchBody {
            group,
            messages: items
                .iter()
                .map(|&(id, generation)| AckItem {
                    id,
                    generation,
                    action: "ack",
                })
                .collect(),
        };
        let bytes =
            serde_json::to_vec(&body).map_err(|e| CallError::Decode(format!("encoding a batch ack: {e}")))?;
        let answer: BatchSettledAnswer =
            self.call_bytes_ok("POST", "/v1/messages/ack", Some(&bytes), "batch ack")?;
        if answer.messages.len() != items.len() {
            return Err(CallError::Decode(format!(
                "batch ack of {} items answered {} results",
                items.len(),
                answer.messages.len()
            )));
        }
        Ok(answer.messages)
    }

    /// `POST /v1/queues/{queue}/redrive`: how many messages moved.
    pub fn redrive(&mut self, queue: &str, body: &Value) -> Result<u64, CallError> {
        let (_, v) = self.call_ok(
            "POST",
            &format!("/v1/queues/{}/redrive", encode_segment(queue)),
            Some(body),
        )?;
        v.get("redriven")
            .and_then(Value::as_u64)
            .ok_or_else(|| CallError::Decode(format!("redrive answer: {v}")))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::net::TcpListener;

    /// Serves one request on a local port with `answer_body` (200) and returns the request's body.
    pub(crate) fn one_shot(answer_body: &'static str) -> (String, std::thread::JoinHandle<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let h = std::thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            let mut r = BufReader::new(s);
            let mut len = 0usize;
            loop {
                let mut line = String::new();
                r.read_line(&mut line).unwrap();
                if line == "\r\n" {
                    break;
                }
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    len = v.trim().parse().unwrap();
                }
            }
            let mut body = vec![0u8; len];
            r.read_exact(&mut body).unwrap();
            let answer = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{answer_body}",
                answer_body.len()
            );
            r.get_mut().write_all(answer.as_bytes()).unwrap();
            String::from_utf8(body).unwrap()
        });
        (addr, h)
    }

    #[test]
    fn request_bodies_leave_out_what_is_absent() {
        assert_eq!(OutMessage::new("p").to_json(), json!({ "payload": "p" }));
        let full = OutMessage::new("p")
            .key("k")
            .header("a", "1")
            .header("b", "2")
            .header("a", "3")
            .delay_ms(5)
            .dedup_token("t");
        assert_eq!(
            full.to_json(),
            json!({
                "payload": "p", "key": "k", "headers": { "a": "3", "b": "2" },
                "delay_ms": 5, "dedup_token": "t"
            })
        );
        assert_eq!(LeaseOptions::default().to_json(), json!({}));
        let lease = LeaseOptions {
            max_messages: Some(10),
            wait_ms: Some(0),
            group: Some("g".into()),
            ..LeaseOptions::default()
        };
        assert_eq!(
            lease.to_json(),
            json!({ "max_messages": 10, "wait_ms": 0, "group": "g" })
        );
    }

    #[test]
    fn ack_batch_sends_one_request_and_reads_each_result() {
        let (addr, h) = one_shot(
            r#"{"messages":[{"id":"a1","action":"ack","state":"acknowledged"},
                {"id":"b2","status":409,"error":"stale_generation","message":"leased again"}]}"#,
        );
        let mut c = QueueClient::new(&addr);
        let r = c.ack_batch(Some("g"), &[("a1", 7), ("b2", 3)]).unwrap();
        let sent: Value = serde_json::from_str(&h.join().unwrap()).unwrap();
        assert_eq!(
            sent,
            json!({"group": "g", "messages": [
                {"id": "a1", "generation": 7, "action": "ack"},
                {"id": "b2", "generation": 3, "action": "ack"}]})
        );
        assert!(r[0].is_settled() && r[0].state.as_deref() == Some("acknowledged"));
        assert!(!r[1].is_settled());
        assert_eq!(
            (r[1].status, r[1].error.as_deref()),
            (Some(409), Some("stale_generation"))
        );
    }

    #[test]
    fn answers_without_their_optional_fields_decode() {
        let leased: Leased = serde_json::from_value(json!({
            "id": "a1", "generation": 1, "attempt": 1, "lease_expires_at_ms": 5, "partition": 0,
            "offset": 3, "published_at_ms": 4, "payload_base64": ""
        }))
        .unwrap();
        assert_eq!((leased.key, leased.payload), (None, None));
        assert!(leased.headers.is_empty());
        let settled: Settled =
            serde_json::from_value(json!({ "id": "a1", "action": "ack", "state": "acknowledged" })).unwrap();
        assert_eq!(
            (
                settled.lease_expires_at_ms,
                settled.available_at_ms,
                settled.attempts
            ),
            (None, None, None)
        );
        assert!(serde_json::from_value::<Settled>(json!({ "id": "a1", "action": "ack" })).is_err());
    }

    #[test]
    fn ack_batch_refuses_a_short_answer() {
        let (addr, h) = one_shot(r#"{"messages":[]}"#);
        let mut c = QueueClient::new(&addr);
        let e = c.ack_batch(None, &[("a1", 7)]).unwrap_err();
        let sent: Value = serde_json::from_str(&h.join().unwrap()).unwrap();
        assert!(sent.get("group").is_none());
        assert!(matches!(e, CallError::Decode(_)), "{e}");
    }
}
