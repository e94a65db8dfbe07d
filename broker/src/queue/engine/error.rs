//! Operating errors of the queue engine. A refused command changes nothing.

use super::types::{Generation, MessageId};

/// Why a command (or one item of a settle batch) was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum QueueError {
    /// No such message in this partition (never published, or beyond the log end).
    #[error("no such message")]
    NotFound,
    /// The lease named is not the current one: it expired and the message was leased again, or
    /// it was settled already. Fences late acks from a previous owner.
    #[error("stale lease generation {given}: the message's current generation is {current}")]
    StaleGeneration { given: u64, current: u64 },
    /// Share groups (fenced by member): the record is acquired by another member.
    #[error("the message is leased by another consumer")]
    NotOwner,
    /// The message is not leased at all (available, delayed, being dead-lettered).
    #[error("the message is not leased (it is {state})")]
    NotLeased { state: &'static str },
    /// The message was acknowledged or dead-lettered, and its state has been forgotten.
    #[error("the message was already acknowledged or dead-lettered")]
    AlreadyDone,
    /// A redrive of a message that is still pending in the queue.
    #[error("message {0:?} is still pending in the queue")]
    AlreadyLive(MessageId),
    /// A redrive or ack naming a message of another partition.
    #[error("message {0:?} belongs to another partition")]
    WrongPartition(MessageId),
    #[error("at least one message must be requested")]
    EmptyBatch,
    #[error("batch of {requested} exceeds the limit of {max}")]
    BatchTooLarge { requested: usize, max: u32 },
    #[error("visibility timeout {given_ms} ms is outside {min_ms}..={max_ms} ms")]
    VisibilityOutOfRange { given_ms: u64, min_ms: u64, max_ms: u64 },
    #[error("delay {given_ms} ms exceeds the limit of {max_ms} ms")]
    DelayOutOfRange { given_ms: u64, max_ms: u64 },
    #[error("the lease would last {lifetime_ms} ms since its grant, more than the limit of {max_ms} ms")]
    LeaseLifetimeExceeded { lifetime_ms: u64, max_ms: u64 },
    #[error("a consumer id is 1..={max} bytes")]
    BadConsumerId { max: usize },
    #[error("a failure reason is at most {max} bytes")]
    ReasonTooLong { max: usize },
    #[error("a dedup token is 1..={max} bytes")]
    BadDedupToken { max: usize },
    #[error("message of {size} bytes exceeds the limit of {max} bytes")]
    MessageTooLarge { size: u64, max: u32 },
    #[error("the consumer already holds {max} leases in this partition")]
    ConsumerLeaseLimit { max: u32 },
    #[error("the partition already has {max} leased messages")]
    PartitionLeaseLimit { max: u32 },
    #[error("the partition already holds {max} delayed messages")]
    TooManyDelayed { max: u32 },
    #[error("the dedup window already holds {max} tokens")]
    DedupTableFull { max: u32 },
    /// `reset` while messages are leased or being dead-lettered.
    #[error("the queue partition has leased messages")]
    Busy,
    /// A state-log write failed; the engine must be rebuilt from the durable records.
    #[error("the queue partition is unavailable (state log write failed)")]
    Unavailable,
}

impl QueueError {
    pub(crate) fn stale(given: Generation, current: Generation) -> QueueError {
        QueueError::StaleGeneration {
            given: given.0,
            current: current.0,
        }
    }
}
