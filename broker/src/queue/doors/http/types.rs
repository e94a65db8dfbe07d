//! The JSON of the queue API (docs/http-api.md): request bodies with their validation, the
//! answers, and [`ApiError`].
//!
//! Request bodies are deserialized strictly (`deny_unknown_fields`: an unknown field is a 400
//! naming it; a field of the wrong type is a 400 with its position) into wire structs, then
//! checked against the documented ranges and converted into the types the [`QueueApi`] takes
//! (payloads decoded, defaults filled in). What depends on a queue's settings (its maximum
//! delay, `max.message.bytes`, ...) is checked by the service.
//!
//! [`QueueApi`]: super::QueueApi

use std::collections::{BTreeMap, HashSet};
use std::fmt;

use base64::Engine as _;
use bytes::Bytes;
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};
use strand_protocol::types::{validate_topic_name, Offset, PartitionId, TopicId};

/// Most messages in one publish request.
pub(crate) const MAX_PUBLISH_BATCH: usize = 1000;
/// Most messages one lease request asks for.
pub(crate) const MAX_LEASE_MESSAGES: u32 = 1000;
/// Most items in one batch settle (`POST /v1/messages/ack`).
pub(crate) const MAX_SETTLE_BATCH: usize = 1000;
/// Longest long poll of a lease request.
pub(crate) const MAX_WAIT_MS: u64 = 20_000;
/// Shortest visibility timeout (1 s).
pub(crate) const MIN_VISIBILITY_MS: u64 = 1_000;
/// Longest visibility timeout (12 h), the engine's `MAX_VISIBILITY_MS`.
pub(crate) const MAX_VISIBILITY_MS: u64 = 12 * 3600 * 1000;
/// Longest publish delay, nack delay and backoff (90 days), the engine's `MAX_DELAY_MS`. A queue
/// may allow less; the service checks that.
pub(crate) const MAX_DELAY_MS: u64 = 90 * 24 * 3600 * 1000;
/// Longest dedup window (1 day), the engine's `MAX_DEDUP_WINDOW_MS`.
pub(crate) const MAX_DEDUP_WINDOW_MS: u64 = 24 * 3600 * 1000;
/// Longest dedup token, in bytes (the engine's `MAX_DEDUP_TOKEN_BYTES`).
pub(crate) const MAX_DEDUP_TOKEN_BYTES: usize = 128;
/// Longest consumer name, in bytes (the engine's `MAX_CONSUMER_ID_BYTES`).
pub(crate) const MAX_CONSUMER_BYTES: usize = 255;
/// Longest group name, in bytes.
pub(crate) const MAX_GROUP_BYTES: usize = 255;
/// Longest failure reason, in bytes (the engine's `MAX_REASON_BYTES`).
pub(crate) const MAX_REASON_BYTES: usize = 1024;
/// Longest message id accepted in a path (ids are 56 hex digits; anything longer is unknown).
pub(crate) const MAX_MESSAGE_ID_BYTES: usize = 128;
/// Most headers on one published message.
pub(crate) const MAX_MESSAGE_HEADERS: usize = 100;
/// Range of `max_attempts`.
pub(crate) const MAX_ATTEMPTS: u32 = 1000;
/// Range of `backoff_multiplier`.
pub(crate) const MAX_BACKOFF_MULTIPLIER: f64 = 100.0;
/// Most messages one redrive request moves.
pub(crate) const MAX_REDRIVE_MESSAGES: u32 = 100_000;
/// Redrive's default `max_messages`.
pub(crate) const DEFAULT_REDRIVE_MESSAGES: u32 = 1000;
/// The group when a request names none.
pub(crate) const DEFAULT_GROUP: &str = "default";
/// Header names starting with this (any case) are the broker's own (`strand-message-id`,
/// `strand-deliver-at-ms`, `strand-dedup-token`, dead-letter context): refused on publish.
pub(crate) const RESERVED_HEADER_PREFIX: &str = "strand-";

const BASE64: base64::engine::GeneralPurpose = base64::engine::GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    base64::engine::GeneralPurposeConfig::new()
        .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
);

// ------------------------------------------------------------------------------------------
// Errors

/// An error answer: `status` with body `{"error": code, "message": message}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ApiError {
    pub(crate) status: u16,
    pub(crate) code: &'static str,
    pub(crate) message: String,
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: {}", self.status, self.code, self.message)
    }
}

impl ApiError {
    pub(crate) fn new(status: u16, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }

    // --- HTTP framing (answered by the server; all but 404/405 close the connection)

    /// 400 `bad_request`: the request line, a header, the framing or the path is malformed.
    pub(crate) fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(400, "bad_request", message)
    }

    /// 404 `not_found`: no such endpoint.
    pub(crate) fn not_found() -> ApiError {
        ApiError::new(404, "not_found", "no such endpoint")
    }

    /// 405 `method_not_allowed` (the answer carries `Allow`).
    pub(crate) fn method_not_allowed(method: &str) -> ApiError {
        ApiError::new(
            405,
            "method_not_allowed",
            format!("method {method} is not allowed here"),
        )
    }

    /// 408 `request_timeout`: the request was not read within the read timeout.
    pub(crate) fn request_timeout() -> ApiError {
        ApiError::new(408, "request_timeout", "the request was not received in time")
    }

    /// 411 `length_required`: a body without `Content-Length` (or chunked encoding).
    pub(crate) fn length_required() -> ApiError {
        ApiError::new(
            411,
            "length_required",
            "a request with a body needs Content-Length or Transfer-Encoding: chunked",
        )
    }

    /// 413 `body_too_large`: the body is above the server's limit.
    pub(crate) fn body_too_large(max: usize) -> ApiError {
        ApiError::new(
            413,
            "body_too_large",
            format!("the request body is larger than {max} bytes"),
        )
    }

    /// 417 `expectation_failed`: an `Expect` other than `100-continue`.
    pub(crate) fn expectation_failed() -> ApiError {
        ApiError::new(
            417,
            "expectation_failed",
            "only the expectation 100-continue is supported",
        )
    }

    /// 431 `headers_too_large`: the head is above the limit, or has too many headers.
    pub(crate) fn headers_too_large(message: impl Into<String>) -> ApiError {
        ApiError::new(431, "headers_too_large", message)
    }

    /// 501 `not_implemented`: a transfer coding other than chunked.
    pub(crate) fn not_implemented(message: impl Into<String>) -> ApiError {
        ApiError::new(501, "not_implemented", message)
    }

    /// 505 `http_version_not_supported`: not HTTP/1.x.
    pub(crate) fn version_not_supported() -> ApiError {
        ApiError::new(
            505,
            "http_version_not_supported",
            "only HTTP/1.0 and HTTP/1.1 are supported",
        )
    }

    // --- Request bodies and paths

    /// 400 `invalid_request`: malformed JSON, an unknown or missing field, a value out of range.
    pub(crate) fn invalid_request(message: impl Into<String>) -> ApiError {
        ApiError::new(400, "invalid_request", message)
    }

    /// 400 `invalid_queue_name`: not a valid Kafka topic name.
    pub(crate) fn invalid_queue_name(message: impl Into<String>) -> ApiError {
        ApiError::new(400, "invalid_queue_name", message)
    }

    // --- The queue service's answers

    /// 404 `queue_not_found`.
    pub(crate) fn queue_not_found(queue: &str) -> ApiError {
        ApiError::new(404, "queue_not_found", format!("queue {queue:?} does not exist"))
    }

    /// 404 `message_not_found` (also for an id that does not parse).
    pub(crate) fn message_not_found(id: &str) -> ApiError {
        ApiError::new(404, "message_not_found", format!("message {id:?} does not exist"))
    }

    /// 409 `stale_generation`: the generation is not the message's current lease.
    #[cfg(test)]
    pub(crate) fn stale_generation(message: impl Into<String>) -> ApiError {
        ApiError::new(409, "stale_generation", message)
    }

    /// 409 with another code (`partitions_cannot_shrink`, `not_leased`, `already_live`, ...).
    pub(crate) fn conflict(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError::new(409, code, message)
    }

    /// 400 `invalid_setting`: a queue setting the queue's configuration refuses.
    pub(crate) fn invalid_setting(message: impl Into<String>) -> ApiError {
        ApiError::new(400, "invalid_setting", message)
    }

    /// 400 `too_many_partitions`: the queue would have more partitions than one topic may
    /// (`strand.max.partitions.per.topic`), or the PUT would create more than one request may
    /// (`strand.max.partitions.per.request`).
    pub(crate) fn too_many_partitions(message: impl Into<String>) -> ApiError {
        ApiError::new(400, "too_many_partitions", message)
    }

    /// 409 `partition_limit_reached`: the node would hold more partitions than
    /// `strand.max.partitions` allows.
    pub(crate) fn partition_limit_reached(message: impl Into<String>) -> ApiError {
        ApiError::new(409, "partition_limit_reached", message)
    }

    /// 503 `unavailable`: the queue cannot serve now (state log failed, shutting down).
    pub(crate) fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError::new(503, "unavailable", message)
    }

    /// 500 `internal_error`.
    pub(crate) fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(500, "internal_error", message)
    }

    /// The JSON body: `{"error": code, "message": message}`.
    pub(crate) fn to_json(&self) -> Vec<u8> {
        #[derive(Serialize)]
        struct Body<'a> {
            error: &'a str,
            message: &'a str,
        }
        serde_json::to_vec(&Body {
            error: self.code,
            message: &self.message,
        })
        .unwrap_or_else(|_| br#"{"error":"internal_error","message":"unencodable error"}"#.to_vec())
    }
}

// ------------------------------------------------------------------------------------------
// Helpers

fn check(ok: bool, message: impl FnOnce() -> String) -> Result<(), ApiError> {
    if ok {
        Ok(())
    } else {
        Err(ApiError::invalid_request(message()))
    }
}

fn check_group(group: Option<String>) -> Result<String, ApiError> {
    let group = group.unwrap_or_else(|| DEFAULT_GROUP.to_owned());
    check(!group.is_empty() && group.len() <= MAX_GROUP_BYTES, || {
        format!("`group` must be 1..={MAX_GROUP_BYTES} bytes")
    })?;
    Ok(group)
}

fn check_visibility(field: &str, v: Option<u64>) -> Result<(), ApiError> {
    match v {
        Some(ms) => check((MIN_VISIBILITY_MS..=MAX_VISIBILITY_MS).contains(&ms), || {
            format!("`{field}` must be {MIN_VISIBILITY_MS}..={MAX_VISIBILITY_MS} (1 s to 12 h)")
        }),
        None => Ok(()),
    }
}

fn check_delay(field: &str, v: Option<u64>) -> Result<(), ApiError> {
    match v {
        Some(ms) => check(ms <= MAX_DELAY_MS, || {
            format!("`{field}` must be 0..={MAX_DELAY_MS} (90 days)")
        }),
        None => Ok(()),
    }
}

fn check_reason(reason: &Option<String>) -> Result<(), ApiError> {
    match reason {
        Some(r) => check(r.len() <= MAX_REASON_BYTES, || {
            format!("`reason` must be at most {MAX_REASON_BYTES} bytes")
        }),
        None => Ok(()),
    }
}

/// A JSON array of at most `MAX_PUBLISH_BATCH` items: the limit is enforced while decoding,
/// so a body of a million tiny messages is refused before it is all in memory.
/// `messages` of a batch settle: JSON objects (not arrays of fields), at most
/// [`MAX_SETTLE_BATCH`] of them, bounded while decoding.
fn bounded_settles<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<SettleItemJson>, D::Error> {
    struct V;
    impl<'de> Visitor<'de> for V {
        type Value = Vec<SettleItemJson>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "an array of 1..={MAX_SETTLE_BATCH} settle items")
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            while let Some(object) = seq.next_element::<serde_json::Map<String, serde_json::Value>>()? {
                if out.len() == MAX_SETTLE_BATCH {
                    return Err(de::Error::custom(format!(
                        "`messages` holds more than {MAX_SETTLE_BATCH} items"
                    )));
                }
                let m = SettleItemJson::deserialize(serde_json::Value::Object(object))
                    .map_err(|e| de::Error::custom(format!("messages[{}]: {e}", out.len())))?;
                out.push(m);
            }
            Ok(out)
        }
    }
    d.deserialize_seq(V)
}

fn bounded_messages<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<MessageJson>>, D::Error> {
    struct V;
    impl<'de> Visitor<'de> for V {
        type Value = Option<Vec<MessageJson>>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "an array of 1..={MAX_PUBLISH_BATCH} messages")
        }

        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            // Each message must be a JSON object: serde's derived structs would also take an
            // array of the fields in order, which the API does not allow.
            while let Some(object) = seq.next_element::<serde_json::Map<String, serde_json::Value>>()? {
                if out.len() == MAX_PUBLISH_BATCH {
                    return Err(de::Error::custom(format!(
                        "`messages` holds more than {MAX_PUBLISH_BATCH} messages"
                    )));
                }
                let m = MessageJson::deserialize(serde_json::Value::Object(object))
                    .map_err(|e| de::Error::custom(format!("messages[{}]: {e}", out.len())))?;
                out.push(m);
            }
            Ok(Some(out))
        }
    }
    d.deserialize_any(V)
}

/// A JSON object of string header values, in order, at most `MAX_MESSAGE_HEADERS` entries,
/// names unique.
fn string_headers<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<(String, String)>>, D::Error> {
    struct V;
    impl<'de> Visitor<'de> for V {
        type Value = Option<Vec<(String, String)>>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("an object of header names to string values")
        }

        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            let mut seen = HashSet::new();
            while let Some((name, value)) = map.next_entry::<String, String>()? {
                if out.len() == MAX_MESSAGE_HEADERS {
                    return Err(de::Error::custom(format!(
                        "`headers` holds more than {MAX_MESSAGE_HEADERS} headers"
                    )));
                }
                if !seen.insert(name.clone()) {
                    return Err(de::Error::custom(format!("duplicate header {name:?}")));
                }
                out.push((name, value));
            }
            Ok(Some(out))
        }
    }
    d.deserialize_any(V)
}

// ------------------------------------------------------------------------------------------
// PUT /v1/queues/{queue}

/// `ordering` of a queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum QueueOrdering {
    None,
    Key,
}

/// The body of `PUT /v1/queues/{queue}`: every field optional (absent: the default on creation,
/// unchanged on update). Ranges checked by [`PutQueue::validate`].
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PutQueue {
    pub(crate) partitions: Option<u32>,
    pub(crate) max_attempts: Option<u32>,
    pub(crate) visibility_timeout_ms: Option<u64>,
    pub(crate) backoff_base_ms: Option<u64>,
    pub(crate) backoff_multiplier: Option<f64>,
    pub(crate) backoff_max_ms: Option<u64>,
    pub(crate) dead_letter_topic: Option<String>,
    pub(crate) ordering: Option<QueueOrdering>,
    pub(crate) dedup_window_ms: Option<u64>,
}

impl PutQueue {
    /// Checks the static ranges. `base <= max` of the backoff is checked here when both are
    /// given; against the queue's current values by the service.
    pub(crate) fn validate(&self, queue: &str) -> Result<(), ApiError> {
        if let Some(p) = self.partitions {
            check(p >= 1 && i32::try_from(p).is_ok(), || {
                format!("`partitions` must be 1..={}", i32::MAX)
            })?;
        }
        if let Some(a) = self.max_attempts {
            check((1..=MAX_ATTEMPTS).contains(&a), || {
                format!("`max_attempts` must be 1..={MAX_ATTEMPTS}")
            })?;
        }
        check_visibility("visibility_timeout_ms", self.visibility_timeout_ms)?;
        check_delay("backoff_base_ms", self.backoff_base_ms)?;
        check_delay("backoff_max_ms", self.backoff_max_ms)?;
        if let (Some(base), Some(max)) = (self.backoff_base_ms, self.backoff_max_ms) {
            check(base <= max, || {
                "`backoff_base_ms` must not exceed `backoff_max_ms`".to_owned()
            })?;
        }
        if let Some(m) = self.backoff_multiplier {
            check(
                m.is_finite() && (1.0..=MAX_BACKOFF_MULTIPLIER).contains(&m),
                || format!("`backoff_multiplier` must be 1..={MAX_BACKOFF_MULTIPLIER}"),
            )?;
        }
        if let Some(dlq) = &self.dead_letter_topic {
            validate_topic_name(dlq)
                .map_err(|e| ApiError::invalid_request(format!("`dead_letter_topic`: {e}")))?;
            check(dlq != queue, || {
                "`dead_letter_topic` must differ from the queue".to_owned()
            })?;
            if let Some(m) = crate::internal_topics::refuse_dead_letter_target(dlq) {
                return Err(ApiError::invalid_setting(format!("`dead_letter_topic`: {m}")));
            }
        }
        if let Some(w) = self.dedup_window_ms {
            check(w <= MAX_DEDUP_WINDOW_MS, || {
                format!("`dedup_window_ms` must be 0..={MAX_DEDUP_WINDOW_MS} (1 day)")
            })?;
        }
        Ok(())
    }
}

/// A queue's settings as `GET` shows them (the effective values).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct QueueSettings {
    pub(crate) max_attempts: u32,
    pub(crate) visibility_timeout_ms: u64,
    pub(crate) backoff_base_ms: u64,
    pub(crate) backoff_multiplier: f64,
    pub(crate) backoff_max_ms: u64,
    pub(crate) dead_letter_topic: String,
    pub(crate) ordering: QueueOrdering,
    pub(crate) dedup_window_ms: u64,
}

/// Delivery statistics of one group of a queue.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub(crate) struct GroupStats {
    pub(crate) available: u64,
    pub(crate) leased: u64,
    pub(crate) delayed: u64,
    pub(crate) dead_lettered: u64,
    /// Age of the oldest message not yet acknowledged; 0 when there is none.
    pub(crate) oldest_unacked_age_ms: u64,
}

/// The answer of `GET /v1/queues/{queue}` (and of `PUT`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct QueueInfo {
    pub(crate) name: String,
    pub(crate) topic_id: TopicId,
    pub(crate) partitions: u32,
    pub(crate) config: QueueSettings,
    pub(crate) groups: BTreeMap<String, GroupStats>,
}

impl Serialize for QueueInfo {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(5))?;
        m.serialize_entry("name", &self.name)?;
        m.serialize_entry("topic_id", &self.topic_id.to_string())?;
        m.serialize_entry("partitions", &self.partitions)?;
        m.serialize_entry("config", &self.config)?;
        m.serialize_entry("groups", &self.groups)?;
        m.end()
    }
}

// ------------------------------------------------------------------------------------------
// POST /v1/queues/{queue}/messages

/// One message of a publish body, as sent.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MessageJson {
    payload: Option<String>,
    payload_base64: Option<String>,
    key: Option<String>,
    #[serde(default, deserialize_with = "string_headers")]
    headers: Option<Vec<(String, String)>>,
    delay_ms: Option<u64>,
    dedup_token: Option<String>,
}

/// A publish body: one message, or `{"messages": [...]}` (then no other field).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PublishBody {
    #[serde(default, deserialize_with = "bounded_messages")]
    messages: Option<Vec<MessageJson>>,
    payload: Option<String>,
    payload_base64: Option<String>,
    key: Option<String>,
    #[serde(default, deserialize_with = "string_headers")]
    headers: Option<Vec<(String, String)>>,
    delay_ms: Option<u64>,
    dedup_token: Option<String>,
}

/// A message to publish, decoded and checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PublishMessage {
    pub(crate) payload: Bytes,
    pub(crate) key: Option<Bytes>,
    /// In request order; names unique, none starting with `strand-`.
    pub(crate) headers: Vec<(String, Bytes)>,
    /// 0 = leasable at once; at most [`MAX_DELAY_MS`] (the queue may allow less).
    pub(crate) delay_ms: u64,
    /// 1..=[`MAX_DEDUP_TOKEN_BYTES`] bytes.
    pub(crate) dedup_token: Option<String>,
}

impl PublishBody {
    /// The messages, decoded and checked: 1..=[`MAX_PUBLISH_BATCH`] of them.
    pub(crate) fn into_messages(self) -> Result<Vec<PublishMessage>, ApiError> {
        let single = MessageJson {
            payload: self.payload,
            payload_base64: self.payload_base64,
            key: self.key,
            headers: self.headers,
            delay_ms: self.delay_ms,
            dedup_token: self.dedup_token,
        };
        let Some(batch) = self.messages else {
            return Ok(vec![single.decode().map_err(ApiError::invalid_request)?]);
        };
        let stray = [
            ("payload", single.payload.is_some()),
            ("payload_base64", single.payload_base64.is_some()),
            ("key", single.key.is_some()),
            ("headers", single.headers.is_some()),
            ("delay_ms", single.delay_ms.is_some()),
            ("dedup_token", single.dedup_token.is_some()),
        ];
        if let Some((field, _)) = stray.iter().find(|(_, present)| *present) {
            return Err(ApiError::invalid_request(format!(
                "`{field}` cannot stand beside `messages`: put it in each message"
            )));
        }
        check(!batch.is_empty() && batch.len() <= MAX_PUBLISH_BATCH, || {
            format!("`messages` must hold 1..={MAX_PUBLISH_BATCH} messages")
        })?;
        batch
            .into_iter()
            .enumerate()
            .map(|(i, m)| {
                m.decode()
                    .map_err(|e| ApiError::invalid_request(format!("messages[{i}]: {e}")))
            })
            .collect()
    }
}

impl MessageJson {
    fn decode(self) -> Result<PublishMessage, String> {
        let payload = match (self.payload, self.payload_base64) {
            (Some(text), None) => Bytes::from(text.into_bytes()),
            (None, Some(b64)) => match BASE64.decode(b64.as_bytes()) {
                Ok(bytes) => Bytes::from(bytes),
                Err(e) => return Err(format!("`payload_base64` is not valid base64: {e}")),
            },
            _ => return Err("exactly one of `payload` and `payload_base64` is required".to_owned()),
        };
        let delay_ms = self.delay_ms.unwrap_or(0);
        if delay_ms > MAX_DELAY_MS {
            return Err(format!("`delay_ms` must be 0..={MAX_DELAY_MS} (90 days)"));
        }
        if let Some(t) = &self.dedup_token {
            if t.is_empty() || t.len() > MAX_DEDUP_TOKEN_BYTES {
                return Err(format!("`dedup_token` must be 1..={MAX_DEDUP_TOKEN_BYTES} bytes"));
            }
        }
        let mut headers = Vec::new();
        for (name, value) in self.headers.unwrap_or_default() {
            if name.is_empty() {
                return Err("a header name is empty".to_owned());
            }
            let reserved = name
                .get(..RESERVED_HEADER_PREFIX.len())
                .is_some_and(|p| p.eq_ignore_ascii_case(RESERVED_HEADER_PREFIX));
            if reserved {
                return Err(format!(
                    "header {name:?}: names starting with {RESERVED_HEADER_PREFIX:?} are reserved"
                ));
            }
            headers.push((name, Bytes::from(value.into_bytes())));
        }
        Ok(PublishMessage {
            payload,
            key: self.key.map(|k| Bytes::from(k.into_bytes())),
            headers,
            delay_ms,
            dedup_token: self.dedup_token,
        })
    }
}

/// Where a published message is (or, for a duplicate, the first one with its token).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Published {
    pub(crate) id: String,
    pub(crate) partition: PartitionId,
    pub(crate) offset: Offset,
    pub(crate) duplicate: bool,
}

impl Serialize for Published {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(4))?;
        m.serialize_entry("id", &self.id)?;
        m.serialize_entry("partition", &self.partition.0)?;
        m.serialize_entry("offset", &self.offset.0)?;
        m.serialize_entry("duplicate", &self.duplicate)?;
        m.end()
    }
}

// ------------------------------------------------------------------------------------------
// POST /v1/queues/{queue}/leases

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct LeaseBody {
    max_messages: Option<u32>,
    visibility_timeout_ms: Option<u64>,
    wait_ms: Option<u64>,
    group: Option<String>,
    consumer: Option<String>,
}

/// A lease request, checked, defaults filled in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LeaseRequest {
    /// 1..=[`MAX_LEASE_MESSAGES`], default 1.
    pub(crate) max_messages: u32,
    /// 1 s..=12 h; `None`: the queue's default.
    pub(crate) visibility_timeout_ms: Option<u64>,
    /// 0..=[`MAX_WAIT_MS`], default 0: how long to wait for at least one message.
    pub(crate) wait_ms: u64,
    /// 1..=255 bytes, default `"default"`.
    pub(crate) group: String,
    /// 1..=255 bytes; `None`: the connection's consumer name.
    pub(crate) consumer: Option<String>,
}

impl LeaseRequest {
    /// The lease owner: the named consumer, else the connection's.
    pub(crate) fn consumer_or<'a>(&'a self, connection_consumer: &'a str) -> &'a str {
        self.consumer.as_deref().unwrap_or(connection_consumer)
    }
}

impl LeaseBody {
    pub(crate) fn validate(self) -> Result<LeaseRequest, ApiError> {
        let max_messages = self.max_messages.unwrap_or(1);
        check((1..=MAX_LEASE_MESSAGES).contains(&max_messages), || {
            format!("`max_messages` must be 1..={MAX_LEASE_MESSAGES}")
        })?;
        check_visibility("visibility_timeout_ms", self.visibility_timeout_ms)?;
        let wait_ms = self.wait_ms.unwrap_or(0);
        check(wait_ms <= MAX_WAIT_MS, || {
            format!("`wait_ms` must be 0..={MAX_WAIT_MS}")
        })?;
        if let Some(c) = &self.consumer {
            check(!c.is_empty() && c.len() <= MAX_CONSUMER_BYTES, || {
                format!("`consumer` must be 1..={MAX_CONSUMER_BYTES} bytes")
            })?;
        }
        Ok(LeaseRequest {
            max_messages,
            visibility_timeout_ms: self.visibility_timeout_ms,
            wait_ms,
            group: check_group(self.group)?,
            consumer: self.consumer,
        })
    }
}

/// A leased message, as the service hands it out; rendered by [`LeasedMessage`]'s `Serialize`:
/// `payload` when the bytes are UTF-8 and `payload_base64` always; `key` when UTF-8, else
/// `key_base64`; `headers` with the UTF-8 values and `headers_base64` (present only when
/// needed) with the others.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LeasedMessage {
    pub(crate) id: String,
    pub(crate) generation: u64,
    /// 1 on the first delivery.
    pub(crate) attempt: u32,
    pub(crate) lease_expires_at_ms: i64,
    pub(crate) partition: PartitionId,
    pub(crate) offset: Offset,
    pub(crate) published_at_ms: i64,
    pub(crate) key: Option<Bytes>,
    pub(crate) payload: Bytes,
    /// Without the broker's own `strand-*` headers (the service filters them).
    pub(crate) headers: Vec<(String, Bytes)>,
}

/// Header values rendered as a JSON object, in order.
struct HeaderMap<'a>(Vec<(&'a str, String)>);

impl Serialize for HeaderMap<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            m.serialize_entry(k, v)?;
        }
        m.end()
    }
}

impl Serialize for LeasedMessage {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("id", &self.id)?;
        m.serialize_entry("generation", &self.generation)?;
        m.serialize_entry("attempt", &self.attempt)?;
        m.serialize_entry("lease_expires_at_ms", &self.lease_expires_at_ms)?;
        m.serialize_entry("partition", &self.partition.0)?;
        m.serialize_entry("offset", &self.offset.0)?;
        m.serialize_entry("published_at_ms", &self.published_at_ms)?;
        if let Some(key) = &self.key {
            match std::str::from_utf8(key) {
                Ok(text) => m.serialize_entry("key", text)?,
                Err(_) => m.serialize_entry("key_base64", &BASE64.encode(key))?,
            }
        }
        if let Ok(text) = std::str::from_utf8(&self.payload) {
            m.serialize_entry("payload", text)?;
        }
        m.serialize_entry("payload_base64", &BASE64.encode(&self.payload))?;
        let mut text = Vec::new();
        let mut binary = Vec::new();
        for (name, value) in &self.headers {
            match std::str::from_utf8(value) {
                Ok(v) => text.push((name.as_str(), v.to_owned())),
                Err(_) => binary.push((name.as_str(), BASE64.encode(value))),
            }
        }
        m.serialize_entry("headers", &HeaderMap(text))?;
        if !binary.is_empty() {
            m.serialize_entry("headers_base64", &HeaderMap(binary))?;
        }
        m.end()
    }
}

// ------------------------------------------------------------------------------------------
// POST /v1/messages/{id}/ack

/// The `action` of a settle request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum SettleActionKind {
    Ack,
    Nack,
    Reject,
    Extend,
}

impl SettleActionKind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            SettleActionKind::Ack => "ack",
            SettleActionKind::Nack => "nack",
            SettleActionKind::Reject => "reject",
            SettleActionKind::Extend => "extend",
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SettleBody {
    generation: u64,
    action: SettleActionKind,
    group: Option<String>,
    delay_ms: Option<u64>,
    reason: Option<String>,
    visibility_timeout_ms: Option<u64>,
}

/// What to do with a leased message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SettleAction {
    /// Done.
    Ack,
    /// Failed attempt: available again after `delay_ms` (0..=90 days; the queue may allow
    /// less), or the queue's backoff when `None`.
    Nack {
        delay_ms: Option<u64>,
        reason: Option<String>,
    },
    /// Dead-letter now.
    Reject { reason: Option<String> },
    /// The lease ends `visibility_timeout_ms` (1 s..=12 h) from now; `None`: the queue's
    /// visibility timeout.
    Extend { visibility_timeout_ms: Option<u64> },
}

impl SettleAction {
    pub(crate) fn kind(&self) -> SettleActionKind {
        match self {
            SettleAction::Ack => SettleActionKind::Ack,
            SettleAction::Nack { .. } => SettleActionKind::Nack,
            SettleAction::Reject { .. } => SettleActionKind::Reject,
            SettleAction::Extend { .. } => SettleActionKind::Extend,
        }
    }
}

/// A settle request, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SettleRequest {
    /// The lease generation the client holds.
    pub(crate) generation: u64,
    /// Default `"default"`.
    pub(crate) group: String,
    pub(crate) action: SettleAction,
}

impl SettleBody {
    pub(crate) fn validate(self) -> Result<SettleRequest, ApiError> {
        use SettleActionKind as K;
        let misplaced = [
            ("delay_ms", self.delay_ms.is_some(), self.action == K::Nack),
            (
                "reason",
                self.reason.is_some(),
                matches!(self.action, K::Nack | K::Reject),
            ),
            (
                "visibility_timeout_ms",
                self.visibility_timeout_ms.is_some(),
                self.action == K::Extend,
            ),
        ];
        if let Some((field, _, _)) = misplaced
            .iter()
            .find(|(_, present, allowed)| *present && !*allowed)
        {
            return Err(ApiError::invalid_request(format!(
                "`{field}` is not valid with action \"{}\"",
                self.action.name()
            )));
        }
        check_delay("delay_ms", self.delay_ms)?;
        check_reason(&self.reason)?;
        check_visibility("visibility_timeout_ms", self.visibility_timeout_ms)?;
        let action = match self.action {
            K::Ack => SettleAction::Ack,
            K::Nack => SettleAction::Nack {
                delay_ms: self.delay_ms,
                reason: self.reason,
            },
            K::Reject => SettleAction::Reject { reason: self.reason },
            K::Extend => SettleAction::Extend {
                visibility_timeout_ms: self.visibility_timeout_ms,
            },
        };
        Ok(SettleRequest {
            generation: self.generation,
            group: check_group(self.group)?,
            action,
        })
    }
}

/// One item of `POST /v1/messages/ack`: a settle body plus the message id.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SettleItemJson {
    id: String,
    generation: u64,
    action: SettleActionKind,
    delay_ms: Option<u64>,
    reason: Option<String>,
    visibility_timeout_ms: Option<u64>,
}

/// The body of `POST /v1/messages/ack`: settles of many messages (any queues) in one request.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SettleBatchBody {
    group: Option<String>,
    #[serde(deserialize_with = "bounded_settles")]
    messages: Vec<SettleItemJson>,
}

/// A batch settle, checked: one (message id, request) per item, in request order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SettleBatch {
    pub(crate) items: Vec<(String, SettleRequest)>,
}

impl SettleBatchBody {
    pub(crate) fn validate(self) -> Result<SettleBatch, ApiError> {
        check(!self.messages.is_empty(), || {
            format!("`messages` must hold 1..={MAX_SETTLE_BATCH} items")
        })?;
        let group = self.group;
        let items = self
            .messages
            .into_iter()
            .enumerate()
            .map(|(i, m)| {
                if m.id.is_empty() || m.id.len() > MAX_MESSAGE_ID_BYTES {
                    return Err(ApiError::invalid_request(format!("messages[{i}]: invalid `id`")));
                }
                let req = SettleBody {
                    generation: m.generation,
                    action: m.action,
                    group: group.clone(),
                    delay_ms: m.delay_ms,
                    reason: m.reason,
                    visibility_timeout_ms: m.visibility_timeout_ms,
                }
                .validate()
                .map_err(|e| ApiError::new(e.status, e.code, format!("messages[{i}]: {}", e.message)))?;
                Ok((m.id, req))
            })
            .collect::<Result<Vec<_>, ApiError>>()?;
        Ok(SettleBatch { items })
    }
}

/// One result of a batch settle: the settle's answer, or its error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SettleOutcome {
    Done(Settled),
    Failed { id: String, error: ApiError },
}

impl Serialize for SettleOutcome {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            SettleOutcome::Done(settled) => settled.serialize(s),
            SettleOutcome::Failed { id, error } => {
                let mut m = s.serialize_map(Some(4))?;
                m.serialize_entry("id", id)?;
                m.serialize_entry("status", &error.status)?;
                m.serialize_entry("error", error.code)?;
                m.serialize_entry("message", &error.message)?;
                m.end()
            }
        }
    }
}

/// The message's state after a settle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum SettledState {
    /// Ack.
    Acknowledged,
    /// Nack: leasable again now.
    Available,
    /// Nack: leasable again after a delay (`available_at_ms`).
    Delayed,
    /// Reject, or a nack of the last attempt: dead-lettered (the copy in the dead-letter topic
    /// may still be on its way; the message is done once it is durable).
    DeadLettered,
    /// Extend: still leased, until `lease_expires_at_ms`.
    Leased,
}

/// The answer of a settle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Settled {
    pub(crate) id: String,
    pub(crate) action: SettleActionKind,
    pub(crate) state: SettledState,
    /// For `extend`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) lease_expires_at_ms: Option<i64>,
    /// For a nack retried later.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) available_at_ms: Option<i64>,
    /// Deliveries so far (nack, reject).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) attempts: Option<u32>,
}

// ------------------------------------------------------------------------------------------
// POST /v1/queues/{queue}/redrive

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RedriveBody {
    max_messages: Option<u32>,
    group: Option<String>,
}

/// A redrive request, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RedriveRequest {
    /// 1..=[`MAX_REDRIVE_MESSAGES`], default [`DEFAULT_REDRIVE_MESSAGES`].
    pub(crate) max_messages: u32,
    /// Default `"default"`.
    pub(crate) group: String,
}

impl RedriveBody {
    pub(crate) fn validate(self) -> Result<RedriveRequest, ApiError> {
        let max_messages = self.max_messages.unwrap_or(DEFAULT_REDRIVE_MESSAGES);
        check((1..=MAX_REDRIVE_MESSAGES).contains(&max_messages), || {
            format!("`max_messages` must be 1..={MAX_REDRIVE_MESSAGES}")
        })?;
        Ok(RedriveRequest {
            max_messages,
            group: check_group(self.group)?,
        })
    }
}

/// The answer of a redrive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub(crate) struct Redriven {
    pub(crate) redriven: u64,
}
