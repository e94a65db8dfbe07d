//! Routing: a complete request -> an answer, through the [`QueueApi`].
//!
//! | path | methods |
//! |---|---|
//! | `/v1/status/ready` | GET |
//! | `/v1/queues/{queue}` | GET, PUT |
//! | `/v1/queues/{queue}/messages` | POST |
//! | `/v1/queues/{queue}/leases` | POST |
//! | `/v1/queues/{queue}/redrive` | POST |
//! | `/v1/messages/{id}/ack` | POST |
//! | `/v1/messages/ack` | POST (many messages) |
//!
//! HEAD is served wherever GET is (same headers, no body). Any other path is 404 `not_found`;
//! a known path with another method is 405 with `Allow`. Path segments are percent-decoded
//! (an invalid escape or non-UTF-8 result is a 400); a queue must be a valid Kafka topic name
//! and not a reserved one (`crate::internal_topics`) (400 `invalid_queue_name`).

use serde::{Deserialize, Serialize};
use strand_protocol::types::validate_topic_name;

use super::response::Response;
use super::session::Request;
use super::types::{
    ApiError, LeaseBody, LeasedMessage, PublishBody, Published, PutQueue, RedriveBody, SettleBatchBody,
    SettleBody, SettleOutcome, MAX_MESSAGE_ID_BYTES,
};
use super::{PeerGone, QueueApi};

/// Most segments a known path has; longer paths are 404 without decoding them all.
const MAX_SEGMENTS: usize = 4;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Endpoint {
    Ready,
    Queue(String),
    Messages(String),
    Leases(String),
    Redrive(String),
    Ack(String),
    AckBatch,
}

impl Endpoint {
    /// The methods it serves, as the `Allow` header lists them.
    fn allow(&self) -> &'static str {
        match self {
            Endpoint::Ready => "GET, HEAD",
            Endpoint::Queue(_) => "GET, HEAD, PUT",
            _ => "POST",
        }
    }

    fn allows(&self, method: &str) -> bool {
        self.allow().split(", ").any(|m| m == method)
    }
}

/// Decodes `%XX` escapes of a path segment.
pub(crate) fn percent_decode(segment: &str) -> Result<String, ApiError> {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        if b == b'%' {
            let hex = |j: usize| bytes.get(j).and_then(|&c| (c as char).to_digit(16));
            match (hex(i + 1), hex(i + 2)) {
                (Some(hi), Some(lo)) => out.push((hi * 16 + lo) as u8),
                _ => return Err(ApiError::bad_request("invalid percent-encoding in the path")),
            }
            i += 3;
        } else {
            out.push(b);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| ApiError::bad_request("the path is not UTF-8 once percent-decoded"))
}

fn resolve(path: &str) -> Result<Endpoint, ApiError> {
    let Some(rest) = path.strip_prefix('/') else {
        return Err(ApiError::not_found());
    };
    if rest.split('/').count() > MAX_SEGMENTS {
        return Err(ApiError::not_found());
    }
    if rest.split('/').any(str::is_empty) {
        return Err(ApiError::not_found());
    }
    let segments = rest
        .split('/')
        .map(percent_decode)
        .collect::<Result<Vec<_>, _>>()?;
    let s: Vec<&str> = segments.iter().map(String::as_str).collect();
    let owned = |x: &str| x.to_owned();
    Ok(match s.as_slice() {
        ["v1", "status", "ready"] => Endpoint::Ready,
        ["v1", "queues", q] => Endpoint::Queue(owned(q)),
        ["v1", "queues", q, "messages"] => Endpoint::Messages(owned(q)),
        ["v1", "queues", q, "leases"] => Endpoint::Leases(owned(q)),
        ["v1", "queues", q, "redrive"] => Endpoint::Redrive(owned(q)),
        ["v1", "messages", id, "ack"] => Endpoint::Ack(owned(id)),
        ["v1", "messages", "ack"] => Endpoint::AckBatch,
        _ => return Err(ApiError::not_found()),
    })
}

/// A queue is a topic clients may create and write: a valid topic name, not a reserved one.
fn check_queue(queue: &str) -> Result<(), ApiError> {
    validate_topic_name(queue).map_err(|e| ApiError::invalid_queue_name(format!("{queue:?}: {e}")))?;
    if crate::internal_topics::is_reserved(queue) {
        return Err(ApiError::invalid_queue_name(format!(
            "{queue} is reserved for the broker's internal state"
        )));
    }
    Ok(())
}

/// Parses a JSON object body; an empty (or all-whitespace) body reads as `{}`. Anything but an
/// object is refused (serde's derived structs would also take an array of the fields in order).
fn json<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, ApiError> {
    let body: &[u8] = match body.iter().find(|b| !b.is_ascii_whitespace()) {
        None => b"{}",
        Some(b'{') => body,
        Some(_) => return Err(ApiError::invalid_request("the body must be a JSON object")),
    };
    serde_json::from_slice(body).map_err(|e| ApiError::invalid_request(format!("invalid body: {e}")))
}

#[derive(Serialize)]
struct PublishedList<'a> {
    messages: &'a [Published],
}

#[derive(Serialize)]
struct LeasedList<'a> {
    messages: &'a [LeasedMessage],
}

#[derive(Serialize)]
struct SettledList<'a> {
    messages: &'a [SettleOutcome],
}

#[derive(Serialize)]
struct Ready {
    status: &'static str,
}

/// The metrics label of a request: its endpoint (`queue_get` and `queue_put` apart), or
/// `unknown` for a path no endpoint serves.
pub(crate) fn endpoint_label(endpoint: Option<&Endpoint>, method: &str) -> &'static str {
    match endpoint {
        None => "unknown",
        Some(Endpoint::Ready) => "ready",
        Some(Endpoint::Queue(_)) if method == "PUT" => "queue_put",
        Some(Endpoint::Queue(_)) => "queue_get",
        Some(Endpoint::Messages(_)) => "publish",
        Some(Endpoint::Leases(_)) => "lease",
        Some(Endpoint::Redrive(_)) => "redrive",
        Some(Endpoint::Ack(_)) => "ack",
        Some(Endpoint::AckBatch) => "ack_batch",
    }
}

/// Answers one request, and reports it to [`QueueApi::observe`]. `consumer` is the
/// connection's default consumer name; `gone` tells a long-polling lease that the client went
/// away.
pub(crate) async fn handle<A: QueueApi>(api: &A, req: &Request, consumer: &str, gone: &PeerGone) -> Response {
    let started = std::time::Instant::now();
    let endpoint = resolve(&req.path);
    let label = endpoint_label(endpoint.as_ref().ok(), &req.method);
    let response = answer(api, req, endpoint, consumer, gone).await;
    api.observe(label, response.status, started.elapsed().as_secs_f64());
    response
}

async fn answer<A: QueueApi>(
    api: &A,
    req: &Request,
    endpoint: Result<Endpoint, ApiError>,
    consumer: &str,
    gone: &PeerGone,
) -> Response {
    let endpoint = match endpoint {
        Ok(e) => e,
        Err(e) => return Response::error(&e),
    };
    let method = if req.method == "HEAD" {
        "GET"
    } else {
        req.method.as_str()
    };
    if !endpoint.allows(&req.method) {
        let mut r = Response::error(&ApiError::method_not_allowed(&req.method));
        r.allow = Some(endpoint.allow());
        return r;
    }
    if let Err(e) = api.ready() {
        return Response::error(&e);
    }
    match serve(api, endpoint, method, &req.body, consumer, gone).await {
        Ok(r) => r,
        Err(e) => Response::error(&e),
    }
}

async fn serve<A: QueueApi>(
    api: &A,
    endpoint: Endpoint,
    method: &str,
    body: &[u8],
    consumer: &str,
    gone: &PeerGone,
) -> Result<Response, ApiError> {
    Ok(match endpoint {
        Endpoint::Ready => Response::json(200, &Ready { status: "ready" }),
        Endpoint::Queue(q) => {
            check_queue(&q)?;
            if method == "PUT" {
                let req: PutQueue = json(body)?;
                req.validate(&q)?;
                let (created, info) = api.put_queue(&q, req).await?;
                Response::json(if created { 201 } else { 200 }, &info)
            } else {
                Response::json(200, &api.get_queue(&q).await?)
            }
        }
        Endpoint::Messages(q) => {
            check_queue(&q)?;
            let msgs = json::<PublishBody>(body)?.into_messages()?;
            let published = api.publish(&q, msgs).await?;
            Response::json(200, &PublishedList { messages: &published })
        }
        Endpoint::Leases(q) => {
            check_queue(&q)?;
            let req = json::<LeaseBody>(body)?.validate()?;
            let leased = api.lease(&q, req, consumer, gone).await?;
            Response::json(200, &LeasedList { messages: &leased })
        }
        Endpoint::Redrive(q) => {
            check_queue(&q)?;
            let req = json::<RedriveBody>(body)?.validate()?;
            Response::json(200, &api.redrive(&q, req).await?)
        }
        Endpoint::Ack(id) => {
            if id.is_empty() || id.len() > MAX_MESSAGE_ID_BYTES {
                return Err(ApiError::message_not_found(&id));
            }
            let req = json::<SettleBody>(body)?.validate()?;
            Response::json(200, &api.settle(&id, req).await?)
        }
        Endpoint::AckBatch => {
            let batch = json::<SettleBatchBody>(body)?.validate()?;
            let outcomes = api.settle_batch(batch).await?;
            Response::json(200, &SettledList { messages: &outcomes })
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_decoding() {
        assert_eq!(percent_decode("a%20b%2Fc").unwrap(), "a b/c");
        assert_eq!(percent_decode("%e2%82%ac").unwrap(), "\u{20ac}");
        assert_eq!(percent_decode("plain+").unwrap(), "plain+");
        for bad in ["%", "%2", "%zz", "%2g", "a%", "%ff", "%c3"] {
            assert_eq!(percent_decode(bad).unwrap_err().status, 400, "{bad}");
        }
    }

    #[test]
    fn resolving() {
        assert_eq!(resolve("/v1/status/ready"), Ok(Endpoint::Ready));
        assert_eq!(resolve("/v1/queues/orders"), Ok(Endpoint::Queue("orders".into())));
        assert_eq!(resolve("/v1/%71ueues/a%2Fb"), Ok(Endpoint::Queue("a/b".into())));
        assert_eq!(
            resolve("/v1/queues/o/messages"),
            Ok(Endpoint::Messages("o".into()))
        );
        assert_eq!(resolve("/v1/queues/o/leases"), Ok(Endpoint::Leases("o".into())));
        assert_eq!(resolve("/v1/queues/o/redrive"), Ok(Endpoint::Redrive("o".into())));
        assert_eq!(resolve("/v1/messages/abc/ack"), Ok(Endpoint::Ack("abc".into())));
        assert_eq!(resolve("/v1/messages/ack"), Ok(Endpoint::AckBatch));
        for p in [
            "/",
            "",
            "/v1",
            "/v1/queues",
            "/v1/queues/",
            "/v1/queues/o/",
            "/v1/queues/o/other",
            "/v1/queues/o/messages/x",
            "/v2/queues/o",
            "/v1/messages/x",
            "//v1/queues/o",
            "/v1/queues/o/messages/x/y/z/w/v",
        ] {
            assert_eq!(resolve(p), Err(ApiError::not_found()), "{p}");
        }
        assert_eq!(resolve("/v1/queues/%zz").unwrap_err().status, 400);
    }
}
