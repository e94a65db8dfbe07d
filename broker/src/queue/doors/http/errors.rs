//! The HTTP answers to the queue's domain errors: each [`QueueFailure`] (and the engine's
//! [`QueueError`] inside it) gets its status and the API's machine-readable code
//! (docs/http-api.md). The only place that chooses HTTP statuses for the queue.

use crate::queue::engine::QueueError;
use crate::queue::host::QueueFailure;

use super::ApiError;

/// The answer to a failed queue operation.
pub(crate) fn api_error(e: QueueFailure) -> ApiError {
    ApiError::new(status(&e), code(&e), e.to_string())
}

/// The HTTP status of a failure.
pub(crate) fn status(e: &QueueFailure) -> u16 {
    match e {
        QueueFailure::Engine(e) => engine_status(e),
        QueueFailure::UnknownQueue(_) => 404,
        QueueFailure::BadGroup(_) | QueueFailure::Invalid(_) => 400,
        QueueFailure::Storage(_) | QueueFailure::Unavailable(_) | QueueFailure::NotLeader(_) => 503,
    }
}

/// The HTTP status of an engine's refusal.
pub(crate) fn engine_status(e: &QueueError) -> u16 {
    use QueueError::*;
    match e {
        NotFound => 404,
        StaleGeneration { .. } | NotOwner | NotLeased { .. } | AlreadyDone | AlreadyLive(_) | Busy => 409,
        WrongPartition(_)
        | EmptyBatch
        | BatchTooLarge { .. }
        | VisibilityOutOfRange { .. }
        | DelayOutOfRange { .. }
        | LeaseLifetimeExceeded { .. }
        | BadConsumerId { .. }
        | ReasonTooLong { .. }
        | BadDedupToken { .. } => 400,
        MessageTooLarge { .. } => 413,
        ConsumerLeaseLimit { .. }
        | PartitionLeaseLimit { .. }
        | TooManyDelayed { .. }
        | DedupTableFull { .. } => 429,
        Unavailable => 503,
    }
}

/// The machine-readable error code of the HTTP API.
pub(crate) fn code(e: &QueueFailure) -> &'static str {
    use QueueError as E;
    match e {
        QueueFailure::Engine(e) => match e {
            E::NotFound => "message_not_found",
            E::StaleGeneration { .. } => "stale_generation",
            E::NotOwner => "not_owner",
            E::NotLeased { .. } => "not_leased",
            E::AlreadyDone => "already_done",
            E::AlreadyLive(_) => "already_live",
            E::WrongPartition(_) => "wrong_partition",
            E::EmptyBatch | E::BatchTooLarge { .. } => "bad_batch",
            E::VisibilityOutOfRange { .. } | E::LeaseLifetimeExceeded { .. } => "bad_visibility_timeout",
            E::DelayOutOfRange { .. } => "bad_delay",
            E::BadConsumerId { .. } => "bad_consumer",
            E::ReasonTooLong { .. } => "reason_too_long",
            E::BadDedupToken { .. } => "bad_dedup_token",
            E::MessageTooLarge { .. } => "message_too_large",
            E::ConsumerLeaseLimit { .. } | E::PartitionLeaseLimit { .. } => "lease_limit",
            E::TooManyDelayed { .. } => "too_many_delayed",
            E::DedupTableFull { .. } => "dedup_table_full",
            E::Busy => "busy",
            E::Unavailable => "unavailable",
        },
        QueueFailure::UnknownQueue(_) => "queue_not_found",
        QueueFailure::BadGroup(_) => "bad_group",
        QueueFailure::Storage(_) => "storage_error",
        QueueFailure::Unavailable(_) => "unavailable",
        QueueFailure::NotLeader(_) => "not_leader",
        QueueFailure::Invalid(_) => "bad_request",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_refusals_answer_the_documented_statuses() {
        let cases = [
            (
                QueueError::StaleGeneration { given: 1, current: 2 },
                409,
                "stale_generation",
            ),
            (QueueError::NotFound, 404, "message_not_found"),
            (QueueError::Unavailable, 503, "unavailable"),
            (QueueError::PartitionLeaseLimit { max: 3 }, 429, "lease_limit"),
            (
                QueueError::MessageTooLarge {
                    size: 1_001,
                    max: 1_000,
                },
                413,
                "message_too_large",
            ),
            (
                QueueError::DelayOutOfRange {
                    given_ms: 2,
                    max_ms: 1,
                },
                400,
                "bad_delay",
            ),
        ];
        for (e, want_status, want_code) in cases {
            let f = QueueFailure::Engine(e);
            assert_eq!((status(&f), code(&f)), (want_status, want_code), "{f:?}");
        }
        let f = QueueFailure::UnknownQueue("q".into());
        assert_eq!((status(&f), code(&f)), (404, "queue_not_found"));
        let f = QueueFailure::Storage("disk".into());
        assert_eq!((status(&f), code(&f)), (503, "storage_error"));
    }
}
