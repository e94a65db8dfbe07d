//! Tests of the whole HTTP stack: bytes in, bytes out through the real connection loop
//! ([`io::serve`]) over an in-memory stream with a fake [`QueueApi`]; property tests that
//! arbitrary bytes never panic; and one test over a real socket on a glommio executor.

use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures::{AsyncRead, AsyncWrite};
use glommio::sync::Semaphore;
use proptest::prelude::*;
use serde_json::{json, Value};
use strand_protocol::types::{Offset, PartitionId, TopicId};

use super::io::{self, CloseReason, Closed, Sleeper};
use super::session::{Event, Session};
use super::types::*;
use super::*;

// ------------------------------------------------------------------------------------------
// A fake queue service

#[derive(Debug, Clone, PartialEq)]
enum Call {
    Put(String, PutQueue),
    Get(String),
    Publish(String, Vec<PublishMessage>),
    Lease(String, LeaseRequest, String),
    Settle(String, SettleRequest),
    Redrive(String, RedriveRequest),
}

#[derive(Default)]
struct FakeApi {
    calls: RefCell<Vec<Call>>,
    /// What [`QueueApi::observe`] was told: endpoint label and status.
    observed: RefCell<Vec<(&'static str, u16)>>,
    /// [`QueueApi::ready`] refuses (a cluster node without the cluster metadata yet).
    not_ready: bool,
}

fn info(name: &str) -> QueueInfo {
    let mut groups = BTreeMap::new();
    groups.insert(
        "default".to_owned(),
        GroupStats {
            available: 120,
            leased: 8,
            delayed: 3,
            dead_lettered: 2,
            oldest_unacked_age_ms: 5400,
        },
    );
    QueueInfo {
        name: name.to_owned(),
        topic_id: TopicId(uuid::Uuid::from_u128(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef)),
        partitions: 4,
        config: QueueSettings {
            max_attempts: 5,
            visibility_timeout_ms: 30_000,
            backoff_base_ms: 1000,
            backoff_multiplier: 2.0,
            backoff_max_ms: 900_000,
            dead_letter_topic: format!("{name}.dlq"),
            ordering: QueueOrdering::None,
            dedup_window_ms: 300_000,
        },
        groups,
    }
}

impl QueueApi for FakeApi {
    fn ready(&self) -> Result<(), ApiError> {
        if self.not_ready {
            return Err(ApiError::unavailable("no cluster metadata yet"));
        }
        Ok(())
    }

    async fn put_queue(&self, queue: &str, req: PutQueue) -> Result<(bool, QueueInfo), ApiError> {
        self.calls.borrow_mut().push(Call::Put(queue.into(), req.clone()));
        if queue == "exists" {
            if req.partitions == Some(1) {
                return Err(ApiError::conflict(
                    "partitions_cannot_shrink",
                    "4 partitions, cannot shrink to 1",
                ));
            }
            return Ok((false, info(queue)));
        }
        Ok((true, info(queue)))
    }

    async fn get_queue(&self, queue: &str) -> Result<QueueInfo, ApiError> {
        self.calls.borrow_mut().push(Call::Get(queue.into()));
        if queue == "missing" {
            return Err(ApiError::queue_not_found(queue));
        }
        Ok(info(queue))
    }

    async fn publish(&self, queue: &str, msgs: Vec<PublishMessage>) -> Result<Vec<Published>, ApiError> {
        self.calls
            .borrow_mut()
            .push(Call::Publish(queue.into(), msgs.clone()));
        if queue == "missing" {
            return Err(ApiError::queue_not_found(queue));
        }
        Ok(msgs
            .iter()
            .enumerate()
            .map(|(i, m)| Published {
                id: format!("id{i}"),
                partition: PartitionId(2),
                offset: Offset(40 + i as i64),
                duplicate: m.dedup_token.as_deref() == Some("dup"),
            })
            .collect())
    }

    async fn lease(
        &self,
        queue: &str,
        req: LeaseRequest,
        connection_consumer: &str,
        gone: &PeerGone,
    ) -> Result<Vec<LeasedMessage>, ApiError> {
        self.calls
            .borrow_mut()
            .push(Call::Lease(queue.into(), req.clone(), connection_consumer.into()));
        // "poll": a long poll that leases nothing if the client goes within LONG_POLL_TURNS
        // turns of the executor, else finds messages. "slow": answers after a few turns.
        let turns = match queue {
            "poll" => LONG_POLL_TURNS,
            "slow" => 3,
            _ => 0,
        };
        for _ in 0..turns {
            if queue == "poll" && gone.is_set() {
                return Ok(Vec::new());
            }
            yield_now().await;
        }
        let text = LeasedMessage {
            id: "m1".into(),
            generation: 7,
            attempt: 2,
            lease_expires_at_ms: 1_796_000_000_000,
            partition: PartitionId(2),
            offset: Offset(41),
            published_at_ms: 1_795_999_990_000,
            key: Some(Bytes::from_static(b"customer-7")),
            payload: Bytes::from_static(b"text"),
            headers: vec![("trace".into(), Bytes::from_static(b"abc"))],
        };
        let binary = LeasedMessage {
            id: "m2".into(),
            generation: 8,
            attempt: 1,
            key: Some(Bytes::from_static(&[0xff, 0x00])),
            payload: Bytes::from_static(&[0x00, 0x01, 0xfe]),
            headers: vec![
                ("bin".into(), Bytes::from_static(&[0xc3])),
                ("txt".into(), Bytes::from_static(b"ok")),
            ],
            ..text.clone()
        };
        let no_key = LeasedMessage {
            id: "m3".into(),
            key: None,
            headers: vec![],
            ..text.clone()
        };
        Ok([text, binary, no_key]
            .into_iter()
            .take(req.max_messages as usize)
            .collect())
    }

    async fn settle(&self, message_id: &str, req: SettleRequest) -> Result<Settled, ApiError> {
        self.calls
            .borrow_mut()
            .push(Call::Settle(message_id.into(), req.clone()));
        if message_id == "unknown" {
            return Err(ApiError::message_not_found(message_id));
        }
        if req.generation == 1 {
            return Err(ApiError::stale_generation(
                "generation 1 is not the current lease (2)",
            ));
        }
        let (state, lease_expires_at_ms) = match req.action {
            SettleAction::Ack => (SettledState::Acknowledged, None),
            SettleAction::Nack { .. } => (SettledState::Delayed, None),
            SettleAction::Reject { .. } => (SettledState::DeadLettered, None),
            SettleAction::Extend { .. } => (SettledState::Leased, Some(1_796_000_060_000)),
        };
        Ok(Settled {
            id: message_id.into(),
            action: req.action.kind(),
            state,
            lease_expires_at_ms,
            available_at_ms: None,
            attempts: None,
        })
    }

    async fn settle_batch(&self, batch: SettleBatch) -> Result<Vec<SettleOutcome>, ApiError> {
        let mut out = Vec::new();
        for (id, req) in batch.items {
            out.push(match self.settle(&id, req).await {
                Ok(s) => SettleOutcome::Done(s),
                Err(error) => SettleOutcome::Failed { id, error },
            });
        }
        Ok(out)
    }

    async fn redrive(&self, queue: &str, req: RedriveRequest) -> Result<Redriven, ApiError> {
        self.calls
            .borrow_mut()
            .push(Call::Redrive(queue.into(), req.clone()));
        Ok(Redriven {
            redriven: u64::from(req.max_messages.min(42)),
        })
    }

    fn observe(&self, endpoint: &'static str, status: u16, seconds: f64) {
        assert!(seconds >= 0.0);
        self.observed.borrow_mut().push((endpoint, status));
    }
}

/// Turns of the executor a fake long poll waits for its client to go.
const LONG_POLL_TURNS: usize = 100;

/// Pending once (waking itself at once): another future in a `select` gets its turn.
async fn yield_now() {
    let mut yielded = false;
    std::future::poll_fn(|cx| {
        if yielded {
            Poll::Ready(())
        } else {
            yielded = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    })
    .await
}

// ------------------------------------------------------------------------------------------
// An in-memory connection

/// Reads hand out the input pieces one by one (fragmentation as sent); then EOF, or nothing
/// ever again (`hang`). Writes are collected.
struct MemStream {
    input: VecDeque<Vec<u8>>,
    hang: bool,
    output: Vec<u8>,
    write_closed: bool,
}

impl AsyncRead for MemStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.input.pop_front() {
            Some(mut piece) => {
                let n = piece.len().min(buf.len());
                buf[..n].copy_from_slice(&piece[..n]);
                if n < piece.len() {
                    self.input.push_front(piece.split_off(n));
                }
                Poll::Ready(Ok(n))
            }
            None if self.hang => Poll::Pending,
            None => Poll::Ready(Ok(0)),
        }
    }
}

impl AsyncWrite for MemStream {
    fn poll_write(mut self: Pin<&mut Self>, _: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        assert!(!self.write_closed, "write after close");
        self.output.extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_close(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.write_closed = true;
        Poll::Ready(Ok(()))
    }
}

/// Fires at once: with a hanging stream, every wait for the client times out.
struct Immediate;

impl Sleeper for Immediate {
    async fn sleep(&self, _: Duration) {}
}

fn limits() -> HttpLimits {
    HttpLimits {
        max_body_bytes: 256 * 1024,
        ..HttpLimits::default()
    }
}

struct Exchange {
    output: Vec<u8>,
    closed: Closed,
    write_closed: bool,
    calls: Vec<Call>,
    observed: Vec<(&'static str, u16)>,
}

fn exchange_with(pieces: Vec<Vec<u8>>, hang: bool, limits: &HttpLimits) -> Exchange {
    exchange_within(pieces, hang, limits, &std::rc::Rc::new(Semaphore::new(1 << 30)))
}

/// [`exchange_with`] with the shard's request memory given.
fn exchange_within(
    pieces: Vec<Vec<u8>>,
    hang: bool,
    limits: &HttpLimits,
    body_memory: &std::rc::Rc<Semaphore>,
) -> Exchange {
    exchange_on(FakeApi::default(), pieces, hang, limits, body_memory)
}

/// [`exchange_within`] against `api`.
fn exchange_on(
    api: FakeApi,
    pieces: Vec<Vec<u8>>,
    hang: bool,
    limits: &HttpLimits,
    body_memory: &std::rc::Rc<Semaphore>,
) -> Exchange {
    let mut stream = MemStream {
        input: pieces.into(),
        hang,
        output: Vec::new(),
        write_closed: false,
    };
    let closed = futures::executor::block_on(io::serve(
        &api,
        &mut stream,
        limits,
        body_memory,
        "conn-1",
        &Immediate,
    ));
    Exchange {
        output: stream.output,
        closed,
        write_closed: stream.write_closed,
        calls: api.calls.into_inner(),
        observed: api.observed.into_inner(),
    }
}

fn exchange(input: &[u8]) -> Exchange {
    exchange_with(vec![input.to_vec()], false, &limits())
}

#[derive(Debug)]
struct Resp {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Resp {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("{e}: {:?}", String::from_utf8_lossy(&self.body)))
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The error code of an error answer.
    fn code(&self) -> String {
        self.json()["error"].as_str().unwrap().to_owned()
    }
}

/// Splits a byte stream of answers (none to a HEAD request) into answers; `None` if the last
/// one is incomplete.
fn parse_responses(mut out: &[u8]) -> Option<Vec<Resp>> {
    let mut all = Vec::new();
    while !out.is_empty() {
        let end = out.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
        let head = std::str::from_utf8(&out[..end]).unwrap();
        let mut lines = head.split("\r\n");
        let status_line = lines.next().unwrap();
        assert!(status_line.starts_with("HTTP/1.1 "), "{status_line}");
        let status: u16 = status_line[9..12].parse().unwrap();
        let headers: Vec<(String, String)> = lines
            .filter(|l| !l.is_empty())
            .map(|l| {
                let (n, v) = l.split_once(": ").unwrap();
                (n.to_owned(), v.to_owned())
            })
            .collect();
        let len = if status == 100 {
            0
        } else {
            let cl = headers
                .iter()
                .find(|(n, _)| n == "Content-Length")
                .expect("Content-Length");
            assert_eq!(
                headers
                    .iter()
                    .find(|(n, _)| n == "Content-Type")
                    .map(|(_, v)| v.as_str()),
                Some("application/json")
            );
            cl.1.parse::<usize>().unwrap()
        };
        let body = out.get(end..end + len)?.to_vec();
        all.push(Resp {
            status,
            headers,
            body,
        });
        out = &out[end + len..];
    }
    Some(all)
}

fn responses(out: &[u8]) -> Vec<Resp> {
    parse_responses(out).unwrap_or_else(|| panic!("incomplete answer: {:?}", String::from_utf8_lossy(out)))
}

fn request(method: &str, path: &str, body: &str) -> Vec<u8> {
    let mut r = format!("{method} {path} HTTP/1.1\r\nHost: test\r\n");
    if method == "POST" || method == "PUT" || !body.is_empty() {
        r += &format!("Content-Length: {}\r\n", body.len());
    }
    r += "\r\n";
    r += body;
    r.into_bytes()
}

/// One request on its own connection: its answer and the calls it made.
fn one(method: &str, path: &str, body: &str) -> (Resp, Vec<Call>) {
    let ex = exchange(&request(method, path, body));
    let mut rs = responses(&ex.output);
    assert_eq!(rs.len(), 1, "{:?}", String::from_utf8_lossy(&ex.output));
    (rs.remove(0), ex.calls)
}

/// The answer to a request that must be refused with `status` and `code` before the service
/// is called.
fn refused(method: &str, path: &str, body: &str, status: u16, code: &str) -> String {
    let (r, calls) = one(method, path, body);
    assert_eq!(
        (r.status, r.code().as_str()),
        (status, code),
        "{method} {path} {body}"
    );
    assert!(calls.is_empty(), "{calls:?}");
    r.json()["message"].as_str().unwrap().to_owned()
}

// ------------------------------------------------------------------------------------------
// Routing

#[test]
fn ready() {
    let (r, _) = one("GET", "/v1/status/ready", "");
    assert_eq!(r.status, 200);
    assert_eq!(r.json(), json!({"status": "ready"}));
}

#[test]
fn a_node_that_cannot_answer_for_queues_yet_says_so_on_every_endpoint() {
    let api = FakeApi {
        not_ready: true,
        ..FakeApi::default()
    };
    let input = [
        request("GET", "/v1/status/ready", ""),
        request("GET", "/v1/queues/orders", ""),
        request("POST", "/v1/messages/abc/ack", r#"{"generation": 1}"#),
    ]
    .concat();
    let ex = exchange_on(
        api,
        vec![input],
        false,
        &limits(),
        &std::rc::Rc::new(Semaphore::new(1 << 30)),
    );
    let rs = responses(&ex.output);
    assert_eq!(rs.len(), 3);
    for r in &rs {
        // Not 404: the queue or message may well exist; another node, or this one soon, knows.
        assert_eq!((r.status, r.code().as_str()), (503, "unavailable"));
    }
    assert!(ex.calls.is_empty(), "{:?}", ex.calls);
}

#[test]
fn unknown_paths_and_methods() {
    assert_eq!(refused("GET", "/nope", "", 404, "not_found"), "no such endpoint");
    refused("GET", "/v1/queues/", "", 404, "not_found");
    refused("POST", "/v1/queues/q/other", "{}", 404, "not_found");
    let cases = [
        ("DELETE", "/v1/queues/q", "GET, HEAD, PUT"),
        ("POST", "/v1/queues/q", "GET, HEAD, PUT"),
        ("GET", "/v1/queues/q/messages", "POST"),
        ("PUT", "/v1/queues/q/leases", "POST"),
        ("GET", "/v1/queues/q/redrive", "POST"),
        ("GET", "/v1/messages/x/ack", "POST"),
        ("POST", "/v1/status/ready", "GET, HEAD"),
        ("get", "/v1/queues/q", "GET, HEAD, PUT"),
    ];
    for (method, path, allow) in cases {
        let (r, calls) = one(method, path, "");
        assert_eq!(
            (r.status, r.code().as_str()),
            (405, "method_not_allowed"),
            "{method} {path}"
        );
        assert_eq!(r.header("Allow"), Some(allow));
        assert!(calls.is_empty());
    }
}

/// Every request the router answers is reported once, with its endpoint label and status;
/// framing errors (answered before routing) are not.
#[test]
fn requests_are_observed_by_endpoint_and_status() {
    let input: Vec<u8> = [
        request("GET", "/v1/status/ready", ""),
        request("PUT", "/v1/queues/q", "{}"),
        request("GET", "/v1/queues/missing", ""),
        request(
            "POST",
            "/v1/queues/q/messages",
            r#"{"messages": [{"payload": "x"}]}"#,
        ),
        request("POST", "/v1/queues/q/leases", "{}"),
        request("POST", "/v1/queues/q/leases", r#"{"max_messages": 0}"#),
        request(
            "POST",
            "/v1/messages/m1/ack",
            r#"{"generation": 7, "action": "ack"}"#,
        ),
        request("POST", "/v1/messages/ack", r#"{"messages": []}"#), // refused: empty
        request("POST", "/v1/queues/q/redrive", "{}"),
        request("GET", "/v1/queues/q/leases", ""),
        request("GET", "/nope", ""),
        b"GET / HTTP/9.9\r\n\r\n".to_vec(),
    ]
    .concat();
    let ex = exchange(&input);
    assert_eq!(
        ex.observed,
        vec![
            ("ready", 200),
            ("queue_put", 201),
            ("queue_get", 404),
            ("publish", 200),
            ("lease", 200),
            ("lease", 400),
            ("ack", 200),
            ("ack_batch", 400),
            ("redrive", 200),
            ("lease", 405),
            ("unknown", 404),
        ],
        "{}",
        String::from_utf8_lossy(&ex.output)
    );
    assert_eq!(ex.closed.reason, CloseReason::BadRequest(505));
}

#[test]
fn queue_names() {
    refused("GET", "/v1/queues/bad%20name", "", 400, "invalid_queue_name");
    refused("GET", "/v1/queues/..", "", 400, "invalid_queue_name");
    refused("GET", "/v1/queues/a%2Fb", "", 400, "invalid_queue_name");
    refused(
        "POST",
        "/v1/queues/%C3%A9/messages",
        r#"{"payload":"x"}"#,
        400,
        "invalid_queue_name",
    );
    refused(
        "GET",
        &format!("/v1/queues/{}", "x".repeat(250)),
        "",
        400,
        "invalid_queue_name",
    );
    refused("GET", "/v1/queues/%zz", "", 400, "bad_request");
    let (r, calls) = one("GET", &format!("/v1/queues/{}", "x".repeat(249)), "");
    assert_eq!(r.status, 200);
    assert_eq!(calls, vec![Call::Get("x".repeat(249))]);
    // Percent-encoded valid names are decoded; the query string is ignored.
    let (r, calls) = one("GET", "/v1/queues/%6Frders.v1_a-b?verbose=1", "");
    assert_eq!(r.status, 200);
    assert_eq!(calls, vec![Call::Get("orders.v1_a-b".into())]);
}

// ------------------------------------------------------------------------------------------
// Queues

#[test]
fn put_queue() {
    let body = r#"{"partitions": 4, "max_attempts": 5, "visibility_timeout_ms": 30000,
        "backoff_base_ms": 1000, "backoff_multiplier": 2.0, "backoff_max_ms": 900000,
        "dead_letter_topic": "orders.dlq", "ordering": "key", "dedup_window_ms": 300000}"#;
    let (r, calls) = one("PUT", "/v1/queues/orders", body);
    assert_eq!(r.status, 201);
    assert_eq!(
        calls,
        vec![Call::Put(
            "orders".into(),
            PutQueue {
                partitions: Some(4),
                max_attempts: Some(5),
                visibility_timeout_ms: Some(30_000),
                backoff_base_ms: Some(1000),
                backoff_multiplier: Some(2.0),
                backoff_max_ms: Some(900_000),
                dead_letter_topic: Some("orders.dlq".into()),
                ordering: Some(QueueOrdering::Key),
                dedup_window_ms: Some(300_000),
            }
        )]
    );
    assert_eq!(r.json()["name"], "orders");
    // An update answers 200; an empty body is `{}` (every setting unchanged / default).
    let (r, calls) = one("PUT", "/v1/queues/exists", "");
    assert_eq!(r.status, 200);
    assert_eq!(calls, vec![Call::Put("exists".into(), PutQueue::default())]);
    // The service's refusals come through.
    let (r, _) = one("PUT", "/v1/queues/exists", r#"{"partitions": 1}"#);
    assert_eq!((r.status, r.code().as_str()), (409, "partitions_cannot_shrink"));
}

#[test]
fn put_queue_validation() {
    let msg = refused(
        "PUT",
        "/v1/queues/q",
        r#"{"partitons": 4}"#,
        400,
        "invalid_request",
    );
    assert!(msg.contains("unknown field `partitons`"), "{msg}");
    let bad = [
        (r#"{"partitions": 0}"#, "partitions"),
        (r#"{"partitions": -1}"#, "-1"),
        (r#"{"partitions": 4294967295}"#, "partitions"),
        (r#"{"partitions": "4"}"#, "invalid type"),
        (r#"{"max_attempts": 0}"#, "max_attempts"),
        (r#"{"max_attempts": 1001}"#, "max_attempts"),
        (r#"{"visibility_timeout_ms": 999}"#, "visibility_timeout_ms"),
        (r#"{"visibility_timeout_ms": 43200001}"#, "visibility_timeout_ms"),
        (r#"{"backoff_base_ms": 7776000001}"#, "backoff_base_ms"),
        (
            r#"{"backoff_base_ms": 10, "backoff_max_ms": 5}"#,
            "backoff_base_ms",
        ),
        (r#"{"backoff_multiplier": 0.5}"#, "backoff_multiplier"),
        (r#"{"backoff_multiplier": 101}"#, "backoff_multiplier"),
        (r#"{"dead_letter_topic": "bad name"}"#, "dead_letter_topic"),
        (r#"{"dead_letter_topic": "q"}"#, "dead_letter_topic"),
        (r#"{"ordering": "fifo"}"#, "unknown variant `fifo`"),
        (r#"{"dedup_window_ms": 86400001}"#, "dedup_window_ms"),
        (r#"{"partitions": 4"#, "EOF"),
        (r#"[]"#, "must be a JSON object"),
        (r#"[4, 5]"#, "must be a JSON object"),
        (r#""x""#, "must be a JSON object"),
        (r#"{} {}"#, "trailing"),
        ("\u{0}", "must be a JSON object"),
        ("{\u{0}}", "key must be a string"),
    ];
    for (body, needle) in bad {
        let msg = refused("PUT", "/v1/queues/q", body, 400, "invalid_request");
        assert!(msg.contains(needle), "{body}: {msg}");
    }
    // The bounds themselves are accepted.
    for body in [
        r#"{"max_attempts": 1000, "visibility_timeout_ms": 1000, "backoff_multiplier": 1}"#,
        r#"{"visibility_timeout_ms": 43200000, "dedup_window_ms": 0, "backoff_max_ms": 7776000000}"#,
    ] {
        assert_eq!(one("PUT", "/v1/queues/q", body).0.status, 201, "{body}");
    }
}

#[test]
fn get_queue() {
    let (r, _) = one("GET", "/v1/queues/orders", "");
    assert_eq!(r.status, 200);
    assert_eq!(
        r.json(),
        json!({
            "name": "orders",
            "topic_id": "01234567-89ab-cdef-0123-456789abcdef",
            "partitions": 4,
            "config": {
                "max_attempts": 5, "visibility_timeout_ms": 30000, "backoff_base_ms": 1000,
                "backoff_multiplier": 2.0, "backoff_max_ms": 900000, "dead_letter_topic": "orders.dlq",
                "ordering": "none", "dedup_window_ms": 300000
            },
            "groups": {"default": {"available": 120, "leased": 8, "delayed": 3, "dead_lettered": 2,
                                   "oldest_unacked_age_ms": 5400}}
        })
    );
    let (r, _) = one("GET", "/v1/queues/missing", "");
    assert_eq!((r.status, r.code().as_str()), (404, "queue_not_found"));
}

#[test]
fn head_is_get_without_body() {
    let ex = exchange(
        b"HEAD /v1/queues/orders HTTP/1.1\r\nHost: h\r\n\r\nGET /v1/status/ready HTTP/1.1\r\nHost: h\r\n\r\n",
    );
    let text = String::from_utf8(ex.output).unwrap();
    let (head, rest) = text.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    assert!(!head.contains("Content-Length: 0"), "{head}");
    assert!(
        rest.starts_with("HTTP/1.1 200 OK\r\n"),
        "the next answer follows at once: {rest}"
    );
}

// ------------------------------------------------------------------------------------------
// Publish

fn published(body: &str) -> (Resp, Vec<PublishMessage>) {
    let (r, calls) = one("POST", "/v1/queues/orders/messages", body);
    let msgs = match calls.as_slice() {
        [Call::Publish(q, msgs)] => {
            assert_eq!(q, "orders");
            msgs.clone()
        }
        [] => Vec::new(),
        other => panic!("{other:?}"),
    };
    (r, msgs)
}

#[test]
fn publish_one() {
    let (r, msgs) = published(
        r#"{"payload": "text", "key": "customer-7", "headers": {"trace": "abc", "b": "2"},
            "delay_ms": 5000, "dedup_token": "order-991"}"#,
    );
    assert_eq!(r.status, 200);
    assert_eq!(
        msgs,
        vec![PublishMessage {
            payload: Bytes::from_static(b"text"),
            key: Some(Bytes::from_static(b"customer-7")),
            headers: vec![
                ("trace".into(), Bytes::from_static(b"abc")),
                ("b".into(), Bytes::from_static(b"2")),
            ],
            delay_ms: 5000,
            dedup_token: Some("order-991".into()),
        }]
    );
    assert_eq!(
        r.json(),
        json!({"messages": [{"id": "id0", "partition": 2, "offset": 40, "duplicate": false}]})
    );
}

#[test]
fn publish_batch() {
    let (r, msgs) = published(
        r#"{"messages": [
            {"payload": "text", "dedup_token": "dup"},
            {"payload_base64": "AAEC", "delay_ms": 5000},
            {"payload_base64": "AAE"},
            {"payload": ""}
        ]}"#,
    );
    assert_eq!(r.status, 200);
    let payloads: Vec<&[u8]> = msgs.iter().map(|m| &m.payload[..]).collect();
    assert_eq!(
        payloads,
        vec![&b"text"[..], &[0, 1, 2][..], &[0, 1][..], &b""[..]]
    );
    assert_eq!(msgs[1].delay_ms, 5000);
    assert_eq!(msgs[0].key, None);
    assert!(msgs[0].headers.is_empty());
    let answer = r.json();
    assert_eq!(answer["messages"].as_array().unwrap().len(), 4);
    assert_eq!(answer["messages"][0]["duplicate"], true);
    assert_eq!(answer["messages"][3]["offset"], 43);
    // Exactly 1000 is fine.
    let batch = format!(
        r#"{{"messages": [{}]}}"#,
        vec![r#"{"payload":"x"}"#; 1000].join(",")
    );
    let (r, msgs) = published(&batch);
    assert_eq!((r.status, msgs.len()), (200, 1000));
    // The service's errors come through.
    let (r, _) = one("POST", "/v1/queues/missing/messages", r#"{"payload":"x"}"#);
    assert_eq!((r.status, r.code().as_str()), (404, "queue_not_found"));
}

#[test]
fn publish_validation() {
    let path = "/v1/queues/orders/messages";
    let bad = [
        (
            r#"{}"#.to_owned(),
            "exactly one of `payload` and `payload_base64`",
        ),
        (
            r#"{"payload": "a", "payload_base64": "AA=="}"#.to_owned(),
            "exactly one",
        ),
        (r#"{"payload": null}"#.to_owned(), "exactly one"),
        (
            r#"{"payload_base64": "not base64!"}"#.to_owned(),
            "not valid base64",
        ),
        (r#"{"payload_base64": "AAEC\n"}"#.to_owned(), "not valid base64"),
        (r#"{"payload": 5}"#.to_owned(), "invalid type"),
        (
            r#"{"payload": "x", "colour": "red"}"#.to_owned(),
            "unknown field `colour`",
        ),
        (r#"{"payload": "x", "delay_ms": -1}"#.to_owned(), "invalid value"),
        (
            r#"{"payload": "x", "delay_ms": 7776000001}"#.to_owned(),
            "delay_ms",
        ),
        (r#"{"payload": "x", "dedup_token": ""}"#.to_owned(), "dedup_token"),
        (
            format!(r#"{{"payload": "x", "dedup_token": "{}"}}"#, "t".repeat(129)),
            "dedup_token",
        ),
        (
            r#"{"payload": "x", "headers": {"a": 1}}"#.to_owned(),
            "invalid type",
        ),
        (r#"{"payload": "x", "headers": ["a"]}"#.to_owned(), "invalid type"),
        (
            r#"{"payload": "x", "headers": {"a": "1", "a": "2"}}"#.to_owned(),
            "duplicate header",
        ),
        (
            r#"{"payload": "x", "headers": {"": "1"}}"#.to_owned(),
            "header name is empty",
        ),
        (
            r#"{"payload": "x", "headers": {"Strand-Message-Id": "1"}}"#.to_owned(),
            "reserved",
        ),
        (r#"{"payload": "x", "key": 7}"#.to_owned(), "invalid type"),
        (r#"{"messages": []}"#.to_owned(), "1..=1000"),
        (r#"{"messages": {}}"#.to_owned(), "invalid type"),
        (
            r#"{"messages": [{"payload": "x"}], "key": "k"}"#.to_owned(),
            "`key` cannot stand beside",
        ),
        (
            r#"{"messages": [{"payload": "x"}, {}]}"#.to_owned(),
            "messages[1]: exactly one",
        ),
        (
            r#"{"messages": [{"payload": "x", "extra": 1}]}"#.to_owned(),
            "unknown field `extra`",
        ),
        (
            r#"{"messages": [["x"]]}"#.to_owned(),
            "invalid type: sequence, expected a map",
        ),
        (
            r#"{"messages": [{"payload": "x"}, {"payload": 1}]}"#.to_owned(),
            "messages[1]: invalid type",
        ),
        (
            format!(
                r#"{{"messages": [{}]}}"#,
                vec![r#"{"payload":"x"}"#; 1001].join(",")
            ),
            "more than 1000 messages",
        ),
        (
            format!(
                r#"{{"payload": "x", "headers": {{{}}}}}"#,
                (0..101)
                    .map(|i| format!(r#""h{i}": "v""#))
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            "more than 100 headers",
        ),
    ];
    for (body, needle) in bad {
        let msg = refused("POST", path, &body, 400, "invalid_request");
        assert!(msg.contains(needle), "{body}: {msg}");
    }
    // 128 bytes of dedup token is the limit.
    let (r, msgs) = published(&format!(
        r#"{{"payload": "x", "dedup_token": "{}"}}"#,
        "t".repeat(128)
    ));
    assert_eq!((r.status, msgs.len()), (200, 1));
}

// ------------------------------------------------------------------------------------------
// Leases

#[test]
fn lease_defaults_and_consumer() {
    let (r, calls) = one("POST", "/v1/queues/orders/leases", "{}");
    assert_eq!(r.status, 200);
    let want = LeaseRequest {
        max_messages: 1,
        visibility_timeout_ms: None,
        wait_ms: 0,
        group: "default".into(),
        consumer: None,
    };
    assert_eq!(
        calls,
        vec![Call::Lease("orders".into(), want.clone(), "conn-1".into())]
    );
    assert_eq!(want.consumer_or("conn-1"), "conn-1");
    let (_, calls) = one(
        "POST",
        "/v1/queues/orders/leases",
        r#"{"max_messages": 10, "visibility_timeout_ms": 60000, "wait_ms": 20000, "group": "g",
            "consumer": "worker-3"}"#,
    );
    let Call::Lease(_, req, _) = &calls[0] else {
        panic!()
    };
    assert_eq!(
        *req,
        LeaseRequest {
            max_messages: 10,
            visibility_timeout_ms: Some(60_000),
            wait_ms: 20_000,
            group: "g".into(),
            consumer: Some("worker-3".into()),
        }
    );
    assert_eq!(req.consumer_or("conn-1"), "worker-3");
}

#[test]
fn lease_rendering() {
    let (r, _) = one("POST", "/v1/queues/orders/leases", r#"{"max_messages": 3}"#);
    assert_eq!(
        r.json(),
        json!({"messages": [
            {"id": "m1", "generation": 7, "attempt": 2, "lease_expires_at_ms": 1_796_000_000_000i64,
             "partition": 2, "offset": 41, "published_at_ms": 1_795_999_990_000i64,
             "key": "customer-7", "payload": "text", "payload_base64": "dGV4dA==",
             "headers": {"trace": "abc"}},
            {"id": "m2", "generation": 8, "attempt": 1, "lease_expires_at_ms": 1_796_000_000_000i64,
             "partition": 2, "offset": 41, "published_at_ms": 1_795_999_990_000i64,
             "key_base64": "/wA=", "payload_base64": "AAH+",
             "headers": {"txt": "ok"}, "headers_base64": {"bin": "ww=="}},
            {"id": "m3", "generation": 7, "attempt": 2, "lease_expires_at_ms": 1_796_000_000_000i64,
             "partition": 2, "offset": 41, "published_at_ms": 1_795_999_990_000i64,
             "payload": "text", "payload_base64": "dGV4dA==", "headers": {}}
        ]})
    );
}

/// A client that sends a long poll and goes (end of stream) is noticed while the lease waits:
/// the lease ends leasing nothing, instead of leasing messages nobody will see. A client that
/// stays gets them.
#[test]
fn a_long_poll_ends_when_its_client_goes() {
    let body = r#"{"max_messages": 3, "wait_ms": 20000}"#;
    let ex = exchange(&request("POST", "/v1/queues/poll/leases", body));
    assert_eq!(ex.closed.reason, CloseReason::PeerClosed);
    assert_eq!(ex.closed.client_gone, 1);
    assert_eq!(ex.calls.len(), 1, "{:?}", ex.calls);
    // The answer is still written (a client may only have shut down its sending side).
    let rs = responses(&ex.output);
    assert_eq!(rs.len(), 1);
    assert_eq!(rs[0].json(), json!({"messages": []}));

    // The same request from a client that keeps its connection open finds the messages.
    let ex = exchange_with(
        vec![request("POST", "/v1/queues/poll/leases", body)],
        true,
        &limits(),
    );
    let rs = responses(&ex.output);
    assert_eq!(rs.len(), 1);
    assert_eq!(rs[0].json()["messages"].as_array().map(Vec::len), Some(3));
    assert_eq!(ex.closed.client_gone, 0);
}

/// Bytes that arrive while a request is served (a pipelined request) are kept, not lost to
/// the watch for the client going, and answered in order.
#[test]
fn a_request_pipelined_behind_a_slow_one_is_answered() {
    let ex = exchange_with(
        vec![
            request("POST", "/v1/queues/slow/leases", r#"{"max_messages": 1}"#),
            request("GET", "/v1/queues/after", ""),
        ],
        false,
        &limits(),
    );
    let rs = responses(&ex.output);
    assert_eq!(rs.len(), 2, "{:?}", String::from_utf8_lossy(&ex.output));
    assert_eq!(rs[0].json()["messages"][0]["id"], "m1");
    assert_eq!(rs[1].json()["name"], "after");
    assert_eq!(ex.closed.reason, CloseReason::PeerClosed);
    assert_eq!(ex.closed.requests, 2);
    // The second request was answered before the end of stream was read.
    assert_eq!(ex.closed.client_gone, 0);
}

#[test]
fn lease_validation() {
    let path = "/v1/queues/orders/leases";
    for (body, needle) in [
        (r#"{"max_messages": 0}"#, "max_messages"),
        (r#"{"max_messages": 1001}"#, "max_messages"),
        (r#"{"wait_ms": 20001}"#, "wait_ms"),
        (r#"{"visibility_timeout_ms": 999}"#, "visibility_timeout_ms"),
        (r#"{"group": ""}"#, "group"),
        (r#"{"consumer": ""}"#, "consumer"),
        (r#"{"max_messages": 1.5}"#, "invalid type"),
        (r#"{"limit": 1}"#, "unknown field `limit`"),
    ] {
        let msg = refused("POST", path, body, 400, "invalid_request");
        assert!(msg.contains(needle), "{body}: {msg}");
    }
    let long = format!(r#"{{"consumer": "{}"}}"#, "c".repeat(256));
    refused("POST", path, &long, 400, "invalid_request");
    let ok = format!(r#"{{"consumer": "{}", "max_messages": 1000}}"#, "c".repeat(255));
    assert_eq!(one("POST", path, &ok).0.status, 200);
}

// ------------------------------------------------------------------------------------------
// Settle

#[test]
fn settle_actions() {
    let cases = [
        (
            r#"{"generation": 7, "action": "ack"}"#,
            SettleAction::Ack,
            "acknowledged",
        ),
        (
            r#"{"generation": 7, "action": "nack", "delay_ms": 60000, "reason": "upstream timeout"}"#,
            SettleAction::Nack {
                delay_ms: Some(60_000),
                reason: Some("upstream timeout".into()),
            },
            "delayed",
        ),
        (
            r#"{"generation": 7, "action": "nack"}"#,
            SettleAction::Nack {
                delay_ms: None,
                reason: None,
            },
            "delayed",
        ),
        (
            r#"{"generation": 7, "action": "reject", "reason": "unparseable", "group": "g"}"#,
            SettleAction::Reject {
                reason: Some("unparseable".into()),
            },
            "dead_lettered",
        ),
        (
            r#"{"generation": 7, "action": "extend", "visibility_timeout_ms": 60000}"#,
            SettleAction::Extend {
                visibility_timeout_ms: Some(60_000),
            },
            "leased",
        ),
    ];
    for (body, action, state) in cases {
        let (r, calls) = one("POST", "/v1/messages/abc%31/ack", body);
        assert_eq!(r.status, 200, "{body}");
        let Call::Settle(id, req) = &calls[0] else {
            panic!()
        };
        assert_eq!(id, "abc1");
        assert_eq!(req.generation, 7);
        assert_eq!(req.action, action);
        assert_eq!(req.group, if body.contains("\"g\"") { "g" } else { "default" });
        let answer = r.json();
        assert_eq!(answer["state"], state);
        assert_eq!(answer["action"], req.action.kind().name());
        assert_eq!(answer["id"], "abc1");
    }
    // The whole answer: fields without a value are left out.
    let answers = [
        (
            r#"{"generation": 7, "action": "extend"}"#,
            json!({"id": "x", "action": "extend", "state": "leased", "lease_expires_at_ms": 1_796_000_060_000i64}),
        ),
        (
            r#"{"generation": 7, "action": "ack"}"#,
            json!({"id": "x", "action": "ack", "state": "acknowledged"}),
        ),
    ];
    for (body, answer) in answers {
        let (r, _) = one("POST", "/v1/messages/x/ack", body);
        assert_eq!(r.json(), answer, "{body}");
    }
}

#[test]
fn batch_settle() {
    let body = r#"{"group": "g", "messages": [
        {"id": "a", "generation": 7, "action": "ack"},
        {"id": "b", "generation": 1, "action": "nack", "reason": "r"},
        {"id": "unknown", "generation": 7, "action": "reject"}
    ]}"#;
    let (r, calls) = one("POST", "/v1/messages/ack", body);
    assert_eq!(r.status, 200);
    assert_eq!(calls.len(), 3);
    let Call::Settle(id, req) = &calls[1] else {
        panic!()
    };
    assert_eq!((id.as_str(), req.group.as_str(), req.generation), ("b", "g", 1));
    assert_eq!(
        r.json(),
        json!({"messages": [
            {"id": "a", "action": "ack", "state": "acknowledged"},
            {"id": "b", "status": 409, "error": "stale_generation",
             "message": "generation 1 is not the current lease (2)"},
            {"id": "unknown", "status": 404, "error": "message_not_found",
             "message": "message \"unknown\" does not exist"}
        ]})
    );
    // Refused as a whole, before the service: empty, too many, malformed items.
    refused(
        "POST",
        "/v1/messages/ack",
        r#"{"messages": []}"#,
        400,
        "invalid_request",
    );
    refused("POST", "/v1/messages/ack", r#"{}"#, 400, "invalid_request");
    let item = r#"{"id": "a", "generation": 7, "action": "ack"}"#;
    let many = format!(r#"{{"messages": [{}]}}"#, vec![item; 1001].join(","));
    let msg = refused("POST", "/v1/messages/ack", &many, 400, "invalid_request");
    assert!(msg.contains("more than 1000"), "{msg}");
    let msg = refused(
        "POST",
        "/v1/messages/ack",
        r#"{"messages": [{"id": "a", "generation": 7, "action": "ack", "delay_ms": 5}]}"#,
        400,
        "invalid_request",
    );
    assert!(msg.contains("messages[0]"), "{msg}");
    refused(
        "POST",
        "/v1/messages/ack",
        r#"{"messages": [["a", 7, "ack"]]}"#,
        400,
        "invalid_request",
    );
    refused(
        "POST",
        "/v1/messages/ack",
        r#"{"messages": [{"id": "", "generation": 7, "action": "ack"}]}"#,
        400,
        "invalid_request",
    );
}

#[test]
fn settle_errors() {
    let path = "/v1/messages/x/ack";
    for (body, needle) in [
        (r#"{"action": "ack"}"#, "missing field `generation`"),
        (r#"{"generation": 7}"#, "missing field `action`"),
        (r#"{"generation": 7, "action": "done"}"#, "unknown variant `done`"),
        (r#"{"generation": -1, "action": "ack"}"#, "invalid value"),
        (
            r#"{"generation": 7, "action": "ack", "delay_ms": 5}"#,
            "`delay_ms` is not valid with action \"ack\"",
        ),
        (r#"{"generation": 7, "action": "ack", "reason": "r"}"#, "`reason`"),
        (
            r#"{"generation": 7, "action": "extend", "delay_ms": 5}"#,
            "`delay_ms`",
        ),
        (
            r#"{"generation": 7, "action": "nack", "visibility_timeout_ms": 5000}"#,
            "visibility_timeout_ms",
        ),
        (
            r#"{"generation": 7, "action": "extend", "visibility_timeout_ms": 5}"#,
            "1000..=",
        ),
        (
            r#"{"generation": 7, "action": "nack", "delay_ms": 7776000001}"#,
            "delay_ms",
        ),
        (
            r#"{"generation": 7, "action": "ack", "generaton": 7}"#,
            "unknown field `generaton`",
        ),
    ] {
        let msg = refused("POST", path, body, 400, "invalid_request");
        assert!(msg.contains(needle), "{body}: {msg}");
    }
    let reason = format!(
        r#"{{"generation": 7, "action": "reject", "reason": "{}"}}"#,
        "r".repeat(1025)
    );
    refused("POST", path, &reason, 400, "invalid_request");
    let long_id = format!("/v1/messages/{}/ack", "a".repeat(129));
    refused(
        "POST",
        &long_id,
        r#"{"generation": 7, "action": "ack"}"#,
        404,
        "message_not_found",
    );
    let (r, _) = one(
        "POST",
        "/v1/messages/unknown/ack",
        r#"{"generation": 7, "action": "ack"}"#,
    );
    assert_eq!((r.status, r.code().as_str()), (404, "message_not_found"));
    let (r, _) = one(
        "POST",
        "/v1/messages/x/ack",
        r#"{"generation": 1, "action": "ack"}"#,
    );
    assert_eq!((r.status, r.code().as_str()), (409, "stale_generation"));
}

// ------------------------------------------------------------------------------------------
// Redrive

#[test]
fn redrive() {
    let (r, calls) = one("POST", "/v1/queues/orders/redrive", "");
    assert_eq!(r.json(), json!({"redriven": 42}));
    assert_eq!(
        calls,
        vec![Call::Redrive(
            "orders".into(),
            RedriveRequest {
                max_messages: 1000,
                group: "default".into()
            }
        )]
    );
    let (_, calls) = one(
        "POST",
        "/v1/queues/orders/redrive",
        r#"{"max_messages": 5, "group": "g"}"#,
    );
    assert_eq!(
        calls,
        vec![Call::Redrive(
            "orders".into(),
            RedriveRequest {
                max_messages: 5,
                group: "g".into()
            }
        )]
    );
    refused(
        "POST",
        "/v1/queues/orders/redrive",
        r#"{"max_messages": 0}"#,
        400,
        "invalid_request",
    );
    refused(
        "POST",
        "/v1/queues/orders/redrive",
        r#"{"max_messages": 100001}"#,
        400,
        "invalid_request",
    );
}

// ------------------------------------------------------------------------------------------
// The connection loop

const READY: &[u8] = b"GET /v1/status/ready HTTP/1.1\r\nHost: h\r\n\r\n";

#[test]
fn keep_alive_and_pipelining() {
    let mut input = Vec::new();
    input.extend_from_slice(READY);
    input.extend_from_slice(&request("POST", "/v1/queues/a/messages", r#"{"payload":"1"}"#));
    input.extend_from_slice(&request("GET", "/nope", ""));
    input.extend_from_slice(&request("POST", "/v1/queues/b/messages", r#"{"payload":"2"}"#));
    // All in one write, and byte by byte: the same answers, in order.
    for pieces in [vec![input.clone()], input.iter().map(|b| vec![*b]).collect()] {
        let ex = exchange_with(pieces, false, &limits());
        let rs = responses(&ex.output);
        let statuses: Vec<u16> = rs.iter().map(|r| r.status).collect();
        assert_eq!(statuses, vec![200, 200, 404, 200]);
        assert!(rs.iter().all(|r| r.header("Connection").is_none()));
        assert_eq!(
            ex.closed,
            Closed {
                requests: 4,
                reason: CloseReason::PeerClosed,
                client_gone: 0
            }
        );
        let queues: Vec<&str> = ex
            .calls
            .iter()
            .map(|c| match c {
                Call::Publish(q, _) => q.as_str(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(queues, vec!["a", "b"]);
    }
}

#[test]
fn connection_close() {
    let mut input = b"GET /v1/status/ready HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n".to_vec();
    input.extend_from_slice(&request("POST", "/v1/queues/a/messages", r#"{"payload":"1"}"#));
    let ex = exchange(&input);
    let rs = responses(&ex.output);
    assert_eq!(
        rs.len(),
        1,
        "the pipelined request after `Connection: close` is not served"
    );
    assert_eq!(rs[0].header("Connection"), Some("close"));
    assert!(ex.calls.is_empty());
    assert!(ex.write_closed);
    assert_eq!(ex.closed.reason, CloseReason::NotKeptAlive);
}

#[test]
fn http10() {
    // Closed after one answer by default.
    let ex = exchange(b"GET /v1/status/ready HTTP/1.0\r\n\r\nGET /v1/status/ready HTTP/1.0\r\n\r\n");
    let rs = responses(&ex.output);
    assert_eq!(rs.len(), 1);
    assert_eq!(rs[0].header("Connection"), Some("close"));
    // Kept alive on request.
    let ex = exchange(
        b"GET /v1/status/ready HTTP/1.0\r\nConnection: keep-alive\r\n\r\n\
          POST /v1/queues/q/leases HTTP/1.0\r\nContent-Length: 2\r\n\r\n{}",
    );
    let rs = responses(&ex.output);
    assert_eq!(rs.len(), 2);
    assert_eq!(rs[0].header("Connection"), Some("keep-alive"));
    assert_eq!(rs[1].header("Connection"), Some("close"));
    assert_eq!(rs[1].status, 200);
}

#[test]
fn expect_continue() {
    let head = b"POST /v1/queues/q/messages HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 15\r\n\r\n";
    let ex = exchange_with(
        vec![head.to_vec(), br#"{"payload":"x"}"#.to_vec()],
        false,
        &limits(),
    );
    let rs = responses(&ex.output);
    assert_eq!(rs.iter().map(|r| r.status).collect::<Vec<_>>(), vec![100, 200]);
    // Too large: refused at once, no 100, body never read.
    let head = b"POST /v1/queues/q/messages HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 262145\r\n\r\n";
    let ex = exchange_with(vec![head.to_vec()], true, &limits());
    let rs = responses(&ex.output);
    assert_eq!(rs.len(), 1);
    assert_eq!((rs[0].status, rs[0].code().as_str()), (413, "body_too_large"));
    assert_eq!(rs[0].header("Connection"), Some("close"));
    assert_eq!(ex.closed.reason, CloseReason::BadRequest(413));
}

#[test]
fn chunked_request_through_the_stack() {
    let input = b"POST /v1/queues/q/messages HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n\
        5\r\n{\"pay\r\n9;ext\r\nload\":\"x\"\r\n1\r\n}\r\n0\r\nX-Trailer: 1\r\n\r\n";
    let mut both = input.to_vec();
    both.extend_from_slice(READY);
    let ex = exchange_with(both.chunks(3).map(<[u8]>::to_vec).collect(), false, &limits());
    let rs = responses(&ex.output);
    assert_eq!(rs.iter().map(|r| r.status).collect::<Vec<_>>(), vec![200, 200]);
    let Call::Publish(_, msgs) = &ex.calls[0] else {
        panic!()
    };
    assert_eq!(msgs[0].payload, Bytes::from_static(b"x"));
}

#[test]
fn framing_errors_close_the_connection() {
    let cases: &[(&[u8], u16, &str)] = &[
        (
            b"POST /v1/queues/q/messages HTTP/1.1\r\nHost: h\r\n\r\n",
            411,
            "length_required",
        ),
        (
            b"PUT /v1/queues/q HTTP/1.1\r\nHost: h\r\n\r\n",
            411,
            "length_required",
        ),
        (
            b"GET / HTTP/2.0\r\nHost: h\r\n\r\n",
            505,
            "http_version_not_supported",
        ),
        (b"GET / HTTP/1.1\r\n\r\n", 400, "bad_request"),
        (
            b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n",
            400,
            "bad_request",
        ),
        (
            b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
            400,
            "bad_request",
        ),
        (
            b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            501,
            "not_implemented",
        ),
        (
            b"GET / HTTP/1.1\r\nHost: h\r\nExpect: 200-ok\r\n\r\n",
            417,
            "expectation_failed",
        ),
    ];
    for (input, status, code) in cases {
        let mut with_next = input.to_vec();
        with_next.extend_from_slice(READY);
        let ex = exchange(&with_next);
        let rs = responses(&ex.output);
        assert_eq!(rs.len(), 1, "{:?}", String::from_utf8_lossy(input));
        assert_eq!((rs[0].status, rs[0].code().as_str()), (*status, *code));
        assert_eq!(rs[0].header("Connection"), Some("close"));
        assert_eq!(ex.closed.reason, CloseReason::BadRequest(*status));
        assert!(ex.write_closed);
    }
}

#[test]
fn header_limits() {
    let l = limits();
    let mut big = b"GET /v1/status/ready HTTP/1.1\r\nHost: h\r\nX: ".to_vec();
    big.extend(vec![b'x'; l.max_header_bytes]);
    big.extend_from_slice(b"\r\n\r\n");
    let rs = responses(&exchange(&big).output);
    assert_eq!((rs[0].status, rs[0].code().as_str()), (431, "headers_too_large"));
    // A request line alone over the limit, never finished.
    let mut line = b"GET /".to_vec();
    line.extend(vec![b'a'; l.max_header_bytes + 1]);
    let rs = responses(&exchange_with(vec![line], true, &l).output);
    assert_eq!(rs[0].status, 431);
    // Too many headers.
    let mut many = b"GET /v1/status/ready HTTP/1.1\r\nHost: h\r\n".to_vec();
    for i in 0..l.max_headers {
        many.extend_from_slice(format!("X-{i}: y\r\n").as_bytes());
    }
    many.extend_from_slice(b"\r\n");
    let rs = responses(&exchange(&many).output);
    assert_eq!(rs[0].status, 431);
}

#[test]
fn body_limit() {
    let l = HttpLimits {
        max_body_bytes: 20,
        ..limits()
    };
    let ok = request("POST", "/v1/queues/q/messages", r#"{"payload":"1234"}"#);
    let rs = responses(&exchange_with(vec![ok], false, &l).output);
    assert_eq!(rs[0].status, 200);
    let big = request("POST", "/v1/queues/q/messages", r#"{"payload":"1234567"}"#);
    let rs = responses(&exchange_with(vec![big], false, &l).output);
    assert_eq!((rs.len(), rs[0].status), (1, 413));
    let chunked = b"POST /v1/queues/q/messages HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n\
        10\r\n0123456789abcdef\r\n10\r\n0123456789abcdef\r\n0\r\n\r\n";
    let ex = exchange_with(vec![chunked.to_vec()], false, &l);
    let rs = responses(&ex.output);
    assert_eq!((rs.len(), rs[0].status), (1, 413));
    assert!(ex.calls.is_empty());
}

/// A body is read only once the shard's request memory holds room for it, and the room is given
/// back once the answer is written; a request that gets none within the request read time is
/// answered 408 and never reaches the queues.
#[test]
fn bodies_wait_for_the_shards_request_memory() {
    let body = r#"{"payload":"0123456789"}"#;
    let post = request("POST", "/v1/queues/q/messages", body);
    let split = post.len() - body.len();
    let pieces = vec![post[..split].to_vec(), post[split..].to_vec()];
    let memory = std::rc::Rc::new(Semaphore::new(1000));

    let held = memory
        .try_acquire_static_permit(1000 - body.len() as u64 + 1)
        .unwrap();
    let ex = exchange_within(pieces.clone(), false, &limits(), &memory);
    let rs = responses(&ex.output);
    assert_eq!(rs.iter().map(|r| r.status).collect::<Vec<_>>(), vec![408]);
    assert_eq!(ex.closed.reason, CloseReason::RequestTimeout);
    assert!(ex.calls.is_empty(), "{:?}", ex.calls);
    // A request without a body needs none.
    let ex = exchange_within(vec![READY.to_vec()], false, &limits(), &memory);
    assert_eq!(responses(&ex.output)[0].status, 200);

    drop(held);
    // Room for exactly one body: the second request on the connection gets it back from the
    // first once that one is answered.
    let held = memory
        .try_acquire_static_permit(1000 - body.len() as u64)
        .unwrap();
    let ex = exchange_within([pieces.clone(), pieces].concat(), false, &limits(), &memory);
    let rs = responses(&ex.output);
    assert_eq!(rs.iter().map(|r| r.status).collect::<Vec<_>>(), vec![200, 200]);
    assert_eq!(ex.calls.len(), 2);
    drop(held);
    assert_eq!(memory.available(), 1000);

    // Shutting down closes the memory: a connection waiting for it ends.
    memory.close();
    let post = request("POST", "/v1/queues/q/messages", body);
    let ex = exchange_within(
        vec![post[..split].to_vec(), post[split..].to_vec()],
        false,
        &limits(),
        &memory,
    );
    assert_eq!(ex.closed.reason, CloseReason::ShuttingDown);
    assert!(ex.calls.is_empty());
}

#[test]
fn timeouts() {
    // Idle: no answer, just closed.
    let ex = exchange_with(vec![READY.to_vec()], true, &limits());
    assert_eq!(responses(&ex.output).len(), 1);
    assert_eq!(
        ex.closed,
        Closed {
            requests: 1,
            reason: CloseReason::IdleTimeout,
            client_gone: 0
        }
    );
    assert!(ex.write_closed);
    // Mid-head or mid-body: 408.
    for partial in [
        &b"GET /v1/status/re"[..],
        b"POST /v1/queues/q/leases HTTP/1.1\r\nHost: h\r\nContent-Length: 9\r\n\r\n{",
    ] {
        let ex = exchange_with(vec![READY.to_vec(), partial.to_vec()], true, &limits());
        let rs = responses(&ex.output);
        assert_eq!(rs.iter().map(|r| r.status).collect::<Vec<_>>(), vec![200, 408]);
        assert_eq!(rs[1].code(), "request_timeout");
        assert_eq!(ex.closed.reason, CloseReason::RequestTimeout);
    }
    // The client closing mid-request gets no answer.
    let ex = exchange_with(vec![b"GET /v1/status/re".to_vec()], false, &limits());
    assert!(ex.output.is_empty());
    assert_eq!(ex.closed.reason, CloseReason::PeerClosedMidRequest);
}

#[test]
fn request_read_timeout_is_a_deadline() {
    // A slow client sending a byte at a time is cut at the deadline (a zero timeout: at once),
    // even though every read makes progress.
    let l = HttpLimits {
        request_read_timeout: Duration::ZERO,
        ..limits()
    };
    let pieces: Vec<Vec<u8>> = READY.iter().map(|b| vec![*b]).collect();
    let ex = exchange_with(pieces, false, &l);
    let rs = responses(&ex.output);
    assert_eq!(rs.iter().map(|r| r.status).collect::<Vec<_>>(), vec![408]);
}

#[test]
fn default_consumer_names_are_unique() {
    let peer = "127.0.0.1:4000".parse().ok();
    let a = io::default_consumer_name(peer);
    let b = io::default_consumer_name(peer);
    assert_ne!(a, b);
    assert!(a.starts_with("http-127.0.0.1:4000-"), "{a}");
    assert!(a.len() <= MAX_CONSUMER_BYTES);
    let v6 = "[ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff]:65535".parse().ok();
    assert!(io::default_consumer_name(v6).len() <= MAX_CONSUMER_BYTES);
}

#[test]
fn limits_agree_with_the_engine() {
    assert_eq!(MAX_DEDUP_TOKEN_BYTES, crate::queue::engine::MAX_DEDUP_TOKEN_BYTES);
    assert_eq!(MAX_CONSUMER_BYTES, crate::queue::engine::MAX_CONSUMER_ID_BYTES);
    assert_eq!(MAX_REASON_BYTES, crate::queue::engine::MAX_REASON_BYTES);
}

// ------------------------------------------------------------------------------------------
// Hostile input

/// Statuses the parser may refuse a request with.
const REFUSALS: &[u16] = &[400, 411, 413, 417, 431, 501, 505];

fn small_limits() -> HttpLimits {
    limits_of(64, 256, 8)
}

/// The default limits but for the body, the head and the number of headers; the parser's and
/// the session's tests use it too.
pub(super) fn limits_of(max_body_bytes: usize, max_header_bytes: usize, max_headers: usize) -> HttpLimits {
    HttpLimits {
        max_body_bytes,
        max_header_bytes,
        max_headers,
        ..HttpLimits::default()
    }
}

/// Feeds `pieces` to a session; every event is a request, a 100 or a refusal.
fn session_events(pieces: &[Vec<u8>]) -> Vec<Event> {
    let mut s = Session::new(small_limits());
    let mut events = Vec::new();
    for p in pieces {
        s.push(p);
        loop {
            match s.poll() {
                Event::NeedMore => break,
                Event::Error(e) => {
                    assert!(REFUSALS.contains(&e.status), "{e}");
                    events.push(Event::Error(e));
                    return events;
                }
                e => events.push(e),
            }
        }
        assert!(s.buffered() <= 256 + 64 + p.len(), "bounded buffer");
    }
    events
}

/// Pieces of a plausible request, to mutate.
fn request_like() -> impl Strategy<Value = Vec<u8>> {
    let parts = prop::collection::vec(
        prop_oneof![
            Just(b"GET ".to_vec()),
            Just(b"POST ".to_vec()),
            Just(b"/v1/queues/q/messages ".to_vec()),
            Just(b"HTTP/1.1\r\n".to_vec()),
            Just(b"HTTP/1.0\r\n".to_vec()),
            Just(b"Host: h\r\n".to_vec()),
            Just(b"Content-Length: 5\r\n".to_vec()),
            Just(b"Content-Length: 99999\r\n".to_vec()),
            Just(b"Transfer-Encoding: chunked\r\n".to_vec()),
            Just(b"Expect: 100-continue\r\n".to_vec()),
            Just(b"Connection: close\r\n".to_vec()),
            Just(b"\r\n".to_vec()),
            Just(b"\n".to_vec()),
            Just(b"5\r\nhello\r\n".to_vec()),
            Just(b"0\r\n\r\n".to_vec()),
            Just(b"{\"payload\":\"x\"}".to_vec()),
            prop::collection::vec(any::<u8>(), 0..8),
        ],
        0..24,
    );
    parts.prop_map(|p| p.concat())
}

fn split_randomly(bytes: &[u8], cuts: &[usize]) -> Vec<Vec<u8>> {
    let mut points: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
    points.push(0);
    points.push(bytes.len());
    points.sort_unstable();
    points.windows(2).map(|w| bytes[w[0]..w[1]].to_vec()).collect()
}

proptest! {
    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..600), cuts in prop::collection::vec(any::<usize>(), 0..6)) {
        session_events(&split_randomly(&bytes, &cuts));
    }

    #[test]
    fn request_like_bytes_never_panic(bytes in request_like(), cuts in prop::collection::vec(any::<usize>(), 0..6)) {
        session_events(&split_randomly(&bytes, &cuts));
    }

    /// The whole stack: whatever arrives, the answers are well-formed HTTP, and the loop ends.
    #[test]
    fn the_server_always_answers_well_formed(bytes in request_like(), hang in any::<bool>()) {
        let ex = exchange_with(vec![bytes], hang, &small_limits());
        let rs = responses(&ex.output);
        for r in &rs {
            prop_assert!(r.status == 100 || r.body.starts_with(b"{"), "{:?}", r);
        }
        if let CloseReason::BadRequest(status) = ex.closed.reason {
            prop_assert!(REFUSALS.contains(&status));
            prop_assert_eq!(rs.last().map(|r| r.status), Some(status));
        }
    }

    /// JSON bodies of any shape never panic the decoders.
    #[test]
    fn random_json_bodies(body in "[\\[\\]{}\":,0-9a-z_ \\-.]{0,80}") {
        for path in ["/v1/queues/q", "/v1/queues/q/messages", "/v1/queues/q/leases",
                     "/v1/queues/q/redrive", "/v1/messages/x/ack"] {
            let (r, _) = one(if path == "/v1/queues/q" { "PUT" } else { "POST" }, path, &body);
            prop_assert!(matches!(r.status, 200 | 201 | 400 | 404 | 409), "{} {}", r.status, body);
        }
    }
}

// ------------------------------------------------------------------------------------------
// A real socket

#[test]
fn real_socket_keep_alive_pipelining_and_idle_timeout() {
    use std::io::{Read, Write};
    use std::rc::Rc;

    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let server = std::thread::spawn(move || {
        glommio::LocalExecutorBuilder::default()
            .spawn(move || async move {
                let listener = glommio::net::TcpListener::bind("127.0.0.1:0").unwrap();
                addr_tx.send(listener.local_addr().unwrap()).unwrap();
                let limits = HttpLimits {
                    idle_timeout: Duration::from_millis(300),
                    ..HttpLimits::default()
                };
                let api = Rc::new(FakeApi::default());
                let mut closes = Vec::new();
                for _ in 0..2 {
                    let stream = listener.accept().await.unwrap();
                    let memory = Rc::new(glommio::sync::Semaphore::new(1 << 20));
                    closes.push(serve_connection(api.clone(), stream, limits.clone(), memory).await);
                }
                let calls = api.calls.borrow().len();
                (closes, calls)
            })
            .unwrap()
            .join()
            .unwrap()
    });
    let addr = addr_rx.recv_timeout(Duration::from_secs(10)).unwrap();

    // Connection 1: three pipelined requests in one write, then one more after the answers,
    // then silence until the idle timeout closes the connection.
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut batch = READY.to_vec();
    batch.extend_from_slice(&request("POST", "/v1/queues/a/messages", r#"{"payload":"1"}"#));
    batch.extend_from_slice(&request("POST", "/v1/queues/a/leases", r#"{"max_messages":2}"#));
    c.write_all(&batch).unwrap();
    let read_answers = |c: &mut std::net::TcpStream, n: usize| {
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            if let Some(rs) = parse_responses(&got) {
                if rs.len() == n {
                    return rs;
                }
            }
            let k = c.read(&mut buf).unwrap();
            assert!(k > 0, "closed early: {:?}", String::from_utf8_lossy(&got));
            got.extend_from_slice(&buf[..k]);
        }
    };
    let rs = read_answers(&mut c, 3);
    assert_eq!(
        rs.iter().map(|r| r.status).collect::<Vec<_>>(),
        vec![200, 200, 200]
    );
    assert_eq!(rs[2].json()["messages"].as_array().unwrap().len(), 2);
    c.write_all(&request("GET", "/v1/queues/missing", "")).unwrap();
    let rs = read_answers(&mut c, 1);
    assert_eq!(rs[0].status, 404);
    let started = std::time::Instant::now();
    let mut rest = Vec::new();
    c.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty());
    assert!(
        started.elapsed() >= Duration::from_millis(250),
        "{:?}",
        started.elapsed()
    );
    drop(c);

    // Connection 2: `Connection: close` is answered, then the server closes.
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(b"GET /v1/status/ready HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut all = Vec::new();
    c.read_to_end(&mut all).unwrap();
    let rs = responses(&all);
    assert_eq!(rs.len(), 1);
    assert_eq!(rs[0].header("Connection"), Some("close"));

    let (closes, calls) = server.join().unwrap();
    assert_eq!(
        closes,
        vec![
            Closed {
                requests: 4,
                reason: CloseReason::IdleTimeout,
                client_gone: 0
            },
            Closed {
                requests: 1,
                reason: CloseReason::NotKeptAlive,
                client_gone: 0
            },
        ]
    );
    assert_eq!(calls, 3);
}
