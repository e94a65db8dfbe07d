//! The queue engine: leases, generations, retries, dead letters, delays and dedup over a Kafka
//! log. Sans-I/O: a deterministic state machine per queue partition, driven by method calls
//! that carry `now_ms`, answering with [`Action`]s. It reads no log, writes no file, starts no
//! timer and draws no random number. The HTTP queue API and Kafka share groups (KIP-932) are
//! two doors to the same engine.
//!
//! # Model
//!
//! A queue is a topic (its log holds the messages; offsets are immutable) plus, per consumer
//! group and partition, one [`QueuePartition`]: the *delivery state*, kept apart from the log.
//! Each message has a delivery record: state (available, delayed, leased, being
//! dead-lettered, acknowledged, archived), attempts, lease generation, owner and expiry,
//! not-before time, first/last delivery time, last failure reason. The engine never holds
//! payloads; whoever needs one (lease reply, dead-letter copy) reads the log at the offset.
//!
//! **Message id** ([`MessageId`], text form [`ExternalMessageId`]): the partition and offset
//! where the message was first published, prefixed with the topic id in text. Stable across
//! retries (same offset), dead-lettering (the copy carries `strand-message-id`) and redrive
//! (the publish path puts the header back; the new copy, in the *same* partition, keeps the
//! id and the engine maps id → copy). Unique because offsets and topic ids are never reused.
//! Not secret. An HTTP ack is routed by it: topic id → queue, partition → owning shard.
//!
//! **The window** (Kafka's share-partition window). `start` (SPSO) is the done watermark:
//! every offset below is acknowledged/archived, except the few *detached* records kept below
//! it. `loaded_end` (SPEO + 1) is the load frontier: every offset below has been fed to the
//! engine. Messages in `[start, loaded_end)` have in-memory records; messages beyond are only
//! in the log and are loaded (read back by the caller, [`QueuePartition::wants_load`]) as the
//! window moves. `loaded_end - start <= max_window` (`share.partition.max.record.locks`), so
//! memory is bounded by the window + delayed messages + leased ones + dedup entries, not by the
//! backlog. On a work queue (`detach_leases`) a leased message leaves the window like a delayed
//! one (below): a lease held for its whole visibility timeout does not stop the messages
//! behind it once the window is full. A share group keeps KIP-932's rule instead: its start
//! never passes a record in flight.
//!
//! **Leases.** [`QueuePartition::lease`] hands out the lowest available offsets first (first
//! delivery in offset order; retries, which have lower offsets, come first and may reorder).
//! Each lease increments the attempt count and takes a new [`Generation`] from a
//! per-partition counter (so generations only grow, per message too). Ack, nack, reject and
//! extend name the generation ([`Fence::Generation`], HTTP) or the owner ([`Fence::Owner`],
//! share groups); anything else is refused: [`QueueError::StaleGeneration`] (HTTP 409), or
//! [`QueueError::NotFound`] (404) for an unknown id. An expired lease is a failed attempt with
//! reason `"lease expired"`. A retried ack (same generation, its answer lost) is answered again
//! while the message is still in the window, and after that for the last
//! [`config::REMEMBERED_ACKS`] acknowledgements of the partition (id, generation and offset,
//! kept across restarts as `Done` records in snapshots); beyond that it is
//! [`QueueError::AlreadyDone`] (409). Generations being unique in a partition, a remembered
//! (id, generation) proves that very lease was acknowledged: an ack is never answered for a
//! message that was dead-lettered instead.
//!
//! **Retries and dead letters.** A nack retries after its `delay_ms` or the queue's
//! exponential [`Backoff`]. When a failed attempt was the `max_attempts`-th, or on reject, the
//! message is dead-lettered: the engine writes it as *being dead-lettered* and emits
//! [`Action::DeadLetter`] (read the message, append it with the failure-context headers of
//! [`DeadLetterRequest::context_headers`] to the dead-letter topic); only when the caller
//! reports the append durable ([`QueuePartition::dead_letter_appended`]) is the message done.
//! With [`DeadLetterMode::Archive`] (a share group without a DLQ topic) it is archived at once.
//! **Redrive**: publish the dead-letter copy back to the source queue's origin partition with
//! [`PublishRequest::redrive_of`] = its id (and the `strand-message-id` header); it is a new
//! copy with fresh attempts and the same id. Refused with [`QueueError::AlreadyLive`] while
//! the id is pending; a redrive task should also use a dedup token derived from the
//! dead-letter position so that a re-run redrive appends nothing.
//!
//! **Delays** (publish `delay_ms`, retry delays). A delayed message waits in a
//! time-bucketed [`delay::DelayIndex`] that promotes due messages without scanning anything.
//! A delayed message does not occupy the window: the start moves past it (it becomes a
//! *detached* record below the start, up to `max_delayed` of them; beyond that it waits inside
//! the window). Persistence: the "delay topic" is the state log itself — a delayed message
//! costs one `Delivery` record (~60 bytes: offset, id, key hash, times, attempts), never a
//! copy of the payload, which stays in the queue's log at its offset. The records survive
//! restarts and the payload is retained because retention stops at
//! [`QueuePartition::retention_floor`].
//!
//! **Dedup.** [`QueuePartition::admit_publish`] answers a token seen within
//! `dedup_window_ms` (default 5 min) with the first message's id and offset; nothing is
//! appended. Tokens live in the message (`strand-dedup-token` header) *and* in `Dedup`
//! records, so they survive restarts (see Recovery). Dedup is per partition: the publish path
//! must route a message with a token and no key by the token's hash, so that a retry lands on
//! the same partition. If several groups read one topic, only the queue's primary group's
//! engine is asked to admit publishes (the others get `appended` and ignore tokens, or run
//! with `dedup_window_ms = 0`).
//!
//! **Ordering.** First delivery in offset order per partition; retries may reorder. With
//! [`Ordering::Key`], a message is leased only when it is the lowest not-done message of its
//! key and no message of its key is leased, waiting for a retry or being dead-lettered — one
//! message per key in flight, in offset order (SQS FIFO groups, Pulsar Key_Shared). Keys are
//! compared by a stable 64-bit hash; a collision only serializes two keys. A hot or stuck key
//! can fill the window (a delayed message also holds back later messages of its key).
//!
//! **Bounds**, each a distinct [`QueueError`] (HTTP status from [`QueueError::http_status`]):
//! leased per partition and per consumer (per partition; the HTTP layer splits a queue-wide
//! limit), lease batch size, visibility timeout range and total lease lifetime (12 h), max
//! attempts range (config), delay range, delayed messages, dedup entries and token length,
//! message size (the caller measures, the engine knows the limit), consumer id and reason
//! length, window span; and, without an error, the remembered acknowledgements.
//!
//! # The protocol with the caller
//!
//! Every method that changes state may queue actions; after each call the caller drains
//! [`QueuePartition::poll_actions`] and performs them in order:
//!
//! - [`Action::Persist`] `{ write_id, records }`: append the records to this partition's state
//!   log as one atomic write (one Kafka record batch; its CRC-32C protects the records, see
//!   [`record`]), in emission order, and call [`QueuePartition::persisted`]`(write_id)` once it
//!   is durable (confirming `n` confirms every write `<= n`; the state log is written in order,
//!   so this is natural). A failed write → [`QueuePartition::persist_failed`], then rebuild.
//! - [`Action::Reply`] `{ request, reply }`: send it. Requests that take a [`RequestId`]
//!   (`lease`, `settle`) answer only through this action, and only when safe: an ack, nack or
//!   reject is answered after its record is durable, so an answered ack is never undone by a
//!   crash. Errors that refuse a whole request are returned directly, and change nothing.
//! - [`Action::DeadLetter`]: append to the dead-letter topic, then
//!   `dead_letter_appended(offset)` (or `dead_letter_failed`, retried after
//!   `dead_letter_retry_ms`). Emitted only after the *being dead-lettered* record is durable.
//! - [`Action::WakeAt`]: call [`QueuePartition::tick`] no later than then (lease expiries,
//!   due delays, dead-letter retries); the last one counts. Every command also runs what is
//!   due, so a late timer only delays expiries, it never lets a stale lease through.
//!
//! After appends, settles and ticks, [`QueuePartition::has_leasable`]
//! tells a long-polling lease whether to retry. Loading: whenever
//! [`QueuePartition::wants_load`] says so, read the log and feed [`QueuePartition::appended`]
//! (and [`QueuePartition::log_gap`] for offsets without a deliverable message).
//!
//! Publish path: `admit_publish` → (`Duplicate` → wait until that offset is durable in the log,
//! answer its id) or (`Append` → append with headers `strand-deliver-at-ms`,
//! `strand-dedup-token`, `strand-message-id` for redrives → `appended(offset, ...)` *before
//! yielding* → answer once the log append is durable). The publish answer waits only for the
//! log: every fact the engine learns from an append is in the message's headers, so recovery
//! re-reads it from the log.
//!
//! # Persistence and recovery
//!
//! Records ([`record::StateRecord`]) are absolute facts, so a snapshot replays on top of
//! older records harmlessly. Written: every state change a reply depends on (ack → `Done`,
//! nack → `Delivery` with its not-before, reject/exhaustion → `Delivery` *being
//! dead-lettered*, dead-letter confirmed → `Done`), delayed messages (`Delivery`, which lets
//! the start pass them), dedup entries (`Dedup`), the start (`Start`, once per write), and
//! generation reservations (`Generation`, one per `generation_block` leases, written *before*
//! a generation of the block is handed out — so generations never repeat after a crash even
//! if lease records are lost). Leases and extensions are written too; whether a lease reply
//! waits for its record is [`LeaseDurability`] (default `BeforeReply`: leases survive restarts
//! and attempt counts are exact; `Lazy`: an unrecorded lease is simply void after a crash —
//! the message is available again, never lost, and the old holder is fenced). Extensions are
//! never waited for: a lost extension only ends a lease earlier, and an ended lease is fenced.
//!
//! Compaction: [`QueuePartition::snapshot`] (when [`QueuePartition::wants_snapshot`]) writes
//! the whole state as one write flagged `snapshot`; once durable, every earlier write may be
//! deleted (prefix truncation of the state log). That is the "compacted" state topic.
//!
//! Recovery: (1) [`QueuePartition::recover`]`(records)` with every durable record in write
//! order; dead-letter appends that were pending are emitted again (so dead-letter delivery is
//! at-least-once; copies share the message id). (2)
//! [`QueuePartition::recovered_log_end`]`(log end offset)`: drops records about offsets the log
//! does not have (appends that never became durable; cannot happen if the state log and the
//! message log share the shard journal with the state write after the append it refers to,
//! but cheap to guard). (3) Feed `appended` for the messages in `[start, log_end)` whose timestamp is within the dedup window
//! (use the time index; all of them if unsure) — this restores tokens of publishes whose
//! `Dedup` record was not yet durable; messages that fit the window are loaded on the way.
//! (4) Keep serving `wants_load`. Messages appended after the last durable record are thus
//! recovered from the log; `appended` is idempotent by offset; a message with a record keeps
//! its recorded state. Leases recorded durably are still valid after the restart (their
//! holders can ack); expired ones count as failed attempts.
//!
//! # Kafka share groups (KIP-932, KIP-1191) on this engine
//!
//! One `QueuePartition` per (share group, topic partition), configured with
//! [`QueueConfig::share_group`]; the lease owner is the member id.
//!
//! | KIP-932 | engine |
//! |---|---|
//! | share-partition start offset (SPSO) / end offset (SPEO) | [`QueuePartition::start`] / `loaded_end - 1` |
//! | `share.partition.max.record.locks` | `max_window` (and the leased limits) |
//! | `share.auto.offset.reset` earliest / latest | `QueuePartition::new(start = log start / log end)` |
//! | AlterShareGroupOffsets | [`QueuePartition::reset`] (refused while records are acquired) |
//! | ShareFetch acquisition, `AcquisitionLockTimeoutMs` | [`QueuePartition::lease`]`(member, max, share.record.lock.duration.ms)`; [`Lease::acquired_ranges`] gives `AcquiredRecords {FirstOffset, LastOffset, DeliveryCount}` |
//! | delivery count | `Lease::attempt` (incremented on acquisition) |
//! | ACCEPT / RELEASE / REJECT / RENEW | `SettleOp::Ack` / `Nack { delay_ms: Some(0) }` (counts toward the limit) / `Reject` / `Extend`, with `MessageRef::Offset` + `Fence::Owner(member)` |
//! | GAP | offsets fed with [`QueuePartition::log_gap`] are never delivered; acks of them are ignored by the share layer |
//! | lock timeout | lease expiry, available at once (`expiry_backoff = false`) |
//! | `share.delivery.count.limit` → ARCHIVED | `max_attempts`; [`DeadLetterMode::Archive`] |
//! | KIP-1191 `errors.deadletterqueue.topic.name` | [`DeadLetterMode::Topic`]: written to the DLQ, then archived |
//! | record states available 0 / acquired 1 / acknowledged 2 / archived 4 | [`DeliveryState::kafka_record_state`] (being dead-lettered reads as acquired) |
//! | member leaves | [`QueuePartition::release_owner`] |
//! | INVALID_RECORD_STATE etc. | [`QueueError::kafka_error`] |
//!
//! # Tests
//!
//! `tests.rs`: one test per feature and per bound's error, including the same scenario with
//! dedup off and with `ordering=key` off showing the violation the feature prevents, and a
//! property test feeding arbitrary records to recovery. `sim.rs`: the seeded simulation
//! (random publishes, leases, settles, expiries, crashes with partially durable state logs,
//! redrives; an oracle checks the guarantees after every step; a failing seed prints
//! `STRAND_QUEUE_SIM_SEED=<n>` to replay it; a guard fails a run that exercised nothing).
//! `record.rs`: byte snapshots, round trips and hostile-input tests of the record format.
//!
//! # Not here
//!
//! No I/O, no clock, no randomness (backoff has no jitter; an explicit `delay_ms` can add it).
//! No cross-partition state: per-consumer limits are per partition. The engine is not `Send`
//! by design (one shard owns a partition).

mod config;
pub(crate) mod dead_letter;
mod dedup;
pub(crate) mod delay;
mod error;
mod metrics;
mod partition;
pub(crate) mod record;
mod types;

#[cfg(test)]
mod sim;
#[cfg(test)]
mod tests;

pub(crate) use config::{Backoff, Ordering, QueueConfig, ShareGroupSettings};
pub(crate) use dead_letter::DeadLetterRequest;
pub(crate) use error::QueueError;
pub(crate) use metrics::{Counters, PartitionMetrics};
pub(crate) use partition::{
    Action, Admission, AppendedMessage, Fence, Lease, LoadRequest, MessageRef, Outcome, PublishRequest,
    QueuePartition, Reply, SettleItem, SettleOp, Settled,
};
pub(crate) use record::StateRecord;
pub(crate) use types::{ConsumerId, ExternalMessageId, Generation, MessageId, RequestId, WriteId};

// What the unit tests and the simulation look at beyond the host's needs.
#[cfg(test)]
pub(crate) use config::{
    DeadLetterMode, LeaseDurability, MAX_CONSUMER_ID_BYTES, MAX_DEDUP_TOKEN_BYTES, MAX_REASON_BYTES,
};
#[cfg(test)]
pub(crate) use dead_letter::DeadLetterCause;
#[cfg(test)]
pub(crate) use partition::DeliveryState;
#[cfg(test)]
pub(crate) use record::DoneOutcome;
#[cfg(test)]
pub(crate) use types::KeyHash;
