//! The Kafka error codes of the queue's domain errors, for ShareFetch, ShareAcknowledge and
//! AlterShareGroupOffsets. The only place that chooses Kafka error codes for the queue.

use kafka_protocol::ResponseError;

use crate::queue::engine::QueueError;
use crate::queue::host::QueueFailure;

/// The Kafka error of a share-group acknowledgement or acquisition the engine refused.
pub(crate) fn kafka_error(e: &QueueError) -> ResponseError {
    use QueueError::*;
    match e {
        StaleGeneration { .. } | NotOwner | NotLeased { .. } | AlreadyDone | AlreadyLive(_) | Busy => {
            ResponseError::InvalidRecordState
        }
        NotFound | WrongPartition(_) | EmptyBatch | BatchTooLarge { .. } => ResponseError::InvalidRequest,
        MessageTooLarge { .. } => ResponseError::MessageTooLarge,
        Unavailable => ResponseError::CoordinatorLoadInProgress,
        _ => ResponseError::InvalidRequest,
    }
}

/// The Kafka error of a partition of a share fetch or acknowledgement that failed.
pub(crate) fn share_error(f: &QueueFailure) -> ResponseError {
    match f {
        QueueFailure::Engine(e) => kafka_error(e),
        QueueFailure::UnknownQueue(_) => ResponseError::UnknownTopicOrPartition,
        QueueFailure::Invalid(_) | QueueFailure::BadGroup(_) => ResponseError::InvalidRequest,
        QueueFailure::Storage(_) | QueueFailure::Unavailable(_) => ResponseError::KafkaStorageError,
        QueueFailure::NotLeader(_) => ResponseError::NotLeaderOrFollower,
    }
}

/// The Kafka error of a partition whose share start offset could not be altered.
pub(crate) fn alter_error(f: &QueueFailure) -> ResponseError {
    match f {
        QueueFailure::Engine(QueueError::Busy) => ResponseError::NonEmptyGroup,
        QueueFailure::Engine(_) => ResponseError::UnknownServerError,
        QueueFailure::Storage(_) => ResponseError::KafkaStorageError,
        QueueFailure::NotLeader(_) => ResponseError::NotLeaderOrFollower,
        QueueFailure::UnknownQueue(_)
        | QueueFailure::Unavailable(_)
        | QueueFailure::Invalid(_)
        | QueueFailure::BadGroup(_) => ResponseError::UnknownTopicOrPartition,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_answer_kafkas_codes() {
        let stale = QueueError::StaleGeneration { given: 1, current: 2 };
        assert_eq!(kafka_error(&stale), ResponseError::InvalidRecordState);
        assert_eq!(kafka_error(&QueueError::NotFound), ResponseError::InvalidRequest);
        assert_eq!(
            share_error(&QueueFailure::UnknownQueue("t".into())),
            ResponseError::UnknownTopicOrPartition
        );
        assert_eq!(
            alter_error(&QueueFailure::Engine(QueueError::Busy)),
            ResponseError::NonEmptyGroup
        );
    }
}
