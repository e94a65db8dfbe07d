//! Dead-lettering: the request the engine hands to the caller, and the failure-context headers
//! the dead-letter copy carries (plain UTF-8 text, so `kcat -f '%h'` shows them).

use strand_protocol::types::{Offset, PartitionId, TopicId};

use super::types::{ExternalMessageId, MessageId};

/// Header carrying the message id on a dead-letter copy and on a redriven copy
/// ([`ExternalMessageId`] text). The publish path reads it back on redrive.
pub(crate) const HEADER_MESSAGE_ID: &str = "strand-message-id";
/// Header with the absolute time (ms) before which a published message is not delivered.
pub(crate) const HEADER_DELIVER_AT: &str = "strand-deliver-at-ms";
/// Header with the publish dedup token.
pub(crate) const HEADER_DEDUP_TOKEN: &str = "strand-dedup-token";
pub(crate) const HEADER_SOURCE_TOPIC: &str = "strand-dlq-source-topic";
pub(crate) const HEADER_SOURCE_PARTITION: &str = "strand-dlq-source-partition";
pub(crate) const HEADER_SOURCE_OFFSET: &str = "strand-dlq-source-offset";
pub(crate) const HEADER_ATTEMPTS: &str = "strand-dlq-attempts";
pub(crate) const HEADER_CAUSE: &str = "strand-dlq-cause";
pub(crate) const HEADER_REASON: &str = "strand-dlq-reason";
pub(crate) const HEADER_FIRST_DELIVERY: &str = "strand-dlq-first-delivery-ms";
pub(crate) const HEADER_LAST_DELIVERY: &str = "strand-dlq-last-delivery-ms";
pub(crate) const HEADER_DEAD_LETTERED_AT: &str = "strand-dlq-time-ms";

/// Why a message was dead-lettered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DeadLetterCause {
    /// Its attempts reached `max_attempts` (Kafka: delivery count limit).
    MaxAttempts,
    /// A consumer rejected it (Kafka: REJECT).
    Rejected,
}

impl DeadLetterCause {
    pub(crate) fn code(self) -> u8 {
        match self {
            DeadLetterCause::MaxAttempts => 1,
            DeadLetterCause::Rejected => 2,
        }
    }

    pub(crate) fn from_code(code: u8) -> Option<Self> {
        match code {
            1 => Some(DeadLetterCause::MaxAttempts),
            2 => Some(DeadLetterCause::Rejected),
            _ => None,
        }
    }

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            DeadLetterCause::MaxAttempts => "max-attempts",
            DeadLetterCause::Rejected => "rejected",
        }
    }
}

/// "Append the message at (`partition`, `offset`) of the source topic — its payload, key and
/// headers — to the dead-letter topic, adding [`DeadLetterRequest::context_headers`]; then call
/// [`QueuePartition::dead_letter_appended`] (or `dead_letter_failed`)." The engine does not hold
/// payloads: the caller reads the record from the log.
///
/// Delivery into the dead-letter topic is at-least-once: a crash after the append but before
/// the engine's `Done` record is durable re-emits the request on recovery. Copies are
/// recognizable by their message id header.
///
/// [`QueuePartition::dead_letter_appended`]: super::QueuePartition::dead_letter_appended
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DeadLetterRequest {
    pub(crate) partition: PartitionId,
    pub(crate) offset: Offset,
    pub(crate) id: MessageId,
    pub(crate) attempts: u32,
    pub(crate) cause: DeadLetterCause,
    pub(crate) last_reason: Option<String>,
    pub(crate) first_delivery_ms: Option<i64>,
    pub(crate) last_delivery_ms: Option<i64>,
    pub(crate) dead_lettered_at_ms: i64,
}

impl DeadLetterRequest {
    /// The failure-context headers to add to the dead-letter copy (after the original headers,
    /// replacing any of the same names).
    pub(crate) fn context_headers(
        &self,
        source_topic: &str,
        topic_id: TopicId,
    ) -> Vec<(&'static str, Vec<u8>)> {
        let text = |s: String| s.into_bytes();
        let mut h = vec![
            (
                HEADER_MESSAGE_ID,
                text(
                    ExternalMessageId {
                        topic: topic_id,
                        id: self.id,
                    }
                    .to_string(),
                ),
            ),
            (HEADER_SOURCE_TOPIC, source_topic.as_bytes().to_vec()),
            (HEADER_SOURCE_PARTITION, text(self.partition.0.to_string())),
            (HEADER_SOURCE_OFFSET, text(self.offset.0.to_string())),
            (HEADER_ATTEMPTS, text(self.attempts.to_string())),
            (HEADER_CAUSE, self.cause.as_str().as_bytes().to_vec()),
            (
                HEADER_DEAD_LETTERED_AT,
                text(self.dead_lettered_at_ms.to_string()),
            ),
        ];
        if let Some(r) = &self.last_reason {
            h.push((HEADER_REASON, r.as_bytes().to_vec()));
        }
        if let Some(t) = self.first_delivery_ms {
            h.push((HEADER_FIRST_DELIVERY, text(t.to_string())));
        }
        if let Some(t) = self.last_delivery_ms {
            h.push((HEADER_LAST_DELIVERY, text(t.to_string())));
        }
        h
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_headers_carry_the_failure_context() {
        let req = DeadLetterRequest {
            partition: PartitionId(2),
            offset: Offset(40),
            id: MessageId::new(PartitionId(2), Offset(7)),
            attempts: 5,
            cause: DeadLetterCause::MaxAttempts,
            last_reason: Some("timeout calling payments".into()),
            first_delivery_ms: Some(1_000),
            last_delivery_ms: Some(9_000),
            dead_lettered_at_ms: 9_500,
        };
        let h = req.context_headers("orders", TopicId(uuid::Uuid::from_u128(1)));
        let get = |name: &str| {
            h.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| String::from_utf8(v.clone()).unwrap())
        };
        assert_eq!(get(HEADER_SOURCE_TOPIC).as_deref(), Some("orders"));
        assert_eq!(get(HEADER_SOURCE_PARTITION).as_deref(), Some("2"));
        assert_eq!(get(HEADER_SOURCE_OFFSET).as_deref(), Some("40"));
        assert_eq!(get(HEADER_ATTEMPTS).as_deref(), Some("5"));
        assert_eq!(get(HEADER_CAUSE).as_deref(), Some("max-attempts"));
        assert_eq!(get(HEADER_REASON).as_deref(), Some("timeout calling payments"));
        assert_eq!(get(HEADER_FIRST_DELIVERY).as_deref(), Some("1000"));
        assert_eq!(get(HEADER_LAST_DELIVERY).as_deref(), Some("9000"));
        let id: ExternalMessageId = get(HEADER_MESSAGE_ID).unwrap().parse().unwrap();
        assert_eq!(id.id, req.id);
        for code in 0..=255u8 {
            if let Some(c) = DeadLetterCause::from_code(code) {
                assert_eq!(c.code(), code);
            }
        }
    }
}
