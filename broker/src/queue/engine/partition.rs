//! [`QueuePartition`]: the delivery state of one queue (or share group) on one partition.
//! See the module documentation (`queue/engine/mod.rs`) for the model, the protocol with the caller
//! and the persistence rules.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use strand_protocol::types::{Offset, PartitionId};

use super::config::{
    ConfigError, DeadLetterMode, LeaseDurability, Ordering, QueueConfig, MAX_CONSUMER_ID_BYTES,
    MAX_DEDUP_TOKEN_BYTES, MAX_REASON_BYTES, REASON_LEASE_EXPIRED, REMEMBERED_ACKS,
};
use super::dead_letter::{DeadLetterCause, DeadLetterRequest};
use super::dedup::{DedupEntry, DedupTable};
use super::delay::DelayIndex;
use super::error::QueueError;
use super::metrics::{Counters, PartitionMetrics, MAX_LATENCY_SAMPLES};
use super::record::{DedupRecord, DeliveryRecord, DoneOutcome, RecordedState, StateRecord};
use super::types::{ConsumerId, Generation, KeyHash, MessageId, RequestId, WriteId};

/// Reason recorded when a consumer's leases are released for it (member left, consumer closed).
pub(crate) const REASON_RELEASED: &str = "released";

/// A publish about to be appended, as the publish path sees it.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct PublishRequest<'a> {
    /// Payload + key + headers, measured by the caller.
    pub(crate) size_bytes: u64,
    pub(crate) delay_ms: u64,
    pub(crate) dedup_token: Option<&'a [u8]>,
    /// Set when redriving a dead-lettered message: its id, kept by the new copy.
    pub(crate) redrive_of: Option<MessageId>,
}

/// What the publish path must do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admission {
    /// Append the message, stamping `deliver_at_ms` (when delayed), the dedup token and the
    /// redrive id in its headers, then call [`QueuePartition::appended`] before yielding.
    Append { deliver_at_ms: i64 },
    /// Append nothing: answer with the first message's id once `offset` is durable in the log.
    Duplicate { id: MessageId, offset: Offset },
}

/// A message present in the log: fed live by the publish path, and again when loading the
/// window or recovering. Idempotent by offset.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AppendedMessage<'a> {
    pub(crate) offset: Offset,
    pub(crate) key: Option<&'a [u8]>,
    /// The record's timestamp (publish time).
    pub(crate) timestamp_ms: i64,
    /// Not deliverable before this (the `strand-deliver-at-ms` header); 0 when absent.
    pub(crate) deliver_at_ms: i64,
    pub(crate) dedup_token: Option<&'a [u8]>,
    /// The `strand-message-id` header of a redriven copy; `None` for a first publish.
    pub(crate) message_id: Option<MessageId>,
}

/// "Read the log from `from` and feed up to `max_records` messages to
/// [`QueuePartition::appended`] (offsets without a deliverable message to
/// [`QueuePartition::log_gap`])."
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LoadRequest {
    pub(crate) from: Offset,
    pub(crate) max_records: u64,
}

/// One leased message. The caller reads payload, key and headers from the log at `offset`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Lease {
    pub(crate) offset: Offset,
    pub(crate) id: MessageId,
    pub(crate) generation: Generation,
    /// 1 on the first delivery (Kafka's delivery count).
    pub(crate) attempt: u32,
    pub(crate) expiry_ms: i64,
    pub(crate) first_delivery_ms: i64,
}

impl Lease {
    /// Share groups: consecutive offsets with the same delivery count, as ShareFetch's
    /// `AcquiredRecords {FirstOffset, LastOffset, DeliveryCount}`. `leases` in offset order.
    pub(crate) fn acquired_ranges(leases: &[Lease]) -> Vec<(Offset, Offset, u32)> {
        let mut out: Vec<(Offset, Offset, u32)> = Vec::new();
        for l in leases {
            match out.last_mut() {
                Some((_, last, count)) if last.0 + 1 == l.offset.0 && *count == l.attempt => *last = l.offset,
                _ => out.push((l.offset, l.offset, l.attempt)),
            }
        }
        out
    }
}

/// Which message a settle names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum MessageRef {
    /// HTTP: by message id.
    Id(MessageId),
    /// Share groups: by offset.
    Offset(Offset),
}

/// What proves the caller holds the lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Fence {
    /// HTTP: the generation handed out with the lease.
    Generation(Generation),
    /// Share groups: the member that acquired the record.
    Owner(ConsumerId),
}

/// What to do with a leased message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SettleOp {
    /// Done (Kafka ACCEPT).
    Ack,
    /// Failed attempt: retry after `delay_ms`, or the queue's backoff when `None`; dead-letter if
    /// the attempts are exhausted (Kafka RELEASE = `Nack { delay_ms: Some(0) }`).
    Nack { delay_ms: Option<u64> },
    /// Dead-letter now (Kafka REJECT).
    Reject,
    /// Keep the lease for `visibility_ms` from now (Kafka RENEW).
    Extend { visibility_ms: u64 },
}

/// One item of a settle request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SettleItem {
    pub(crate) target: MessageRef,
    pub(crate) fence: Fence,
    pub(crate) op: SettleOp,
    /// Failure reason kept with the message (nack, reject).
    pub(crate) reason: Option<String>,
}

/// The result of one settled item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Settled {
    pub(crate) offset: Offset,
    pub(crate) id: MessageId,
    pub(crate) outcome: Outcome,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Acked,
    /// The message will be delivered again, not before `not_before_ms`.
    Retry {
        not_before_ms: i64,
        attempts: u32,
    },
    /// Dead-lettered (or archived) after `attempts` attempts.
    DeadLettered {
        cause: DeadLetterCause,
        attempts: u32,
    },
    Extended {
        expiry_ms: i64,
    },
}

/// A reply to a request, released by the engine when it is safe to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reply {
    Leases(Vec<Lease>),
    /// One result per item, in request order.
    Settled(Vec<Result<Settled, QueueError>>),
}

/// What the caller must do. Drain with [`QueuePartition::poll_actions`] after every call.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Action {
    /// Append `records` to this partition's state log, in emission order, as one atomic write
    /// (one record batch), then call [`QueuePartition::persisted`]. When `snapshot` is set, the
    /// records describe the whole state: once durable, every earlier write may be deleted.
    Persist {
        write_id: WriteId,
        records: Vec<StateRecord>,
        snapshot: bool,
    },
    /// Send this reply to the request.
    Reply {
        request: RequestId,
        reply: Result<Reply, QueueError>,
    },
    /// Append the message to the dead-letter topic, then call
    /// [`QueuePartition::dead_letter_appended`] (or `dead_letter_failed`).
    DeadLetter(DeadLetterRequest),
    /// Call [`QueuePartition::tick`] no later than this time (the same as
    /// [`QueuePartition::next_deadline`]; emitted when it changes, the last one counts).
    WakeAt(i64),
}

/// A message's state, as [`QueuePartition::inspect`] shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DeliveryState {
    Available,
    Delayed {
        not_before_ms: i64,
    },
    Leased {
        owner: ConsumerId,
        expiry_ms: i64,
        leased_at_ms: i64,
    },
    DeadLetterPending {
        cause: DeadLetterCause,
    },
    Done(DoneOutcome),
}

impl DeliveryState {
    fn name(&self) -> &'static str {
        match self {
            DeliveryState::Available => "available",
            DeliveryState::Delayed { .. } => "delayed",
            DeliveryState::Leased { .. } => "leased",
            DeliveryState::DeadLetterPending { .. } => "being dead-lettered",
            DeliveryState::Done(DoneOutcome::Acked) => "acknowledged",
            DeliveryState::Done(DoneOutcome::Archived) => "dead-lettered",
        }
    }

    #[cfg(test)]
    /// KIP-932 record state: available 0, acquired 1, acknowledged 2, archived 4.
    pub(crate) fn kafka_record_state(&self) -> i8 {
        match self {
            DeliveryState::Available | DeliveryState::Delayed { .. } => 0,
            DeliveryState::Leased { .. } | DeliveryState::DeadLetterPending { .. } => 1,
            DeliveryState::Done(DoneOutcome::Acked) => 2,
            DeliveryState::Done(DoneOutcome::Archived) => 4,
        }
    }
}

#[cfg(test)]
/// A message's delivery record, as [`QueuePartition::inspect`] shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DeliveryView {
    pub(crate) offset: Offset,
    pub(crate) id: MessageId,
    pub(crate) key: Option<KeyHash>,
    pub(crate) enqueued_at_ms: i64,
    pub(crate) attempts: u32,
    pub(crate) generation: Generation,
    pub(crate) first_delivery_ms: Option<i64>,
    pub(crate) last_delivery_ms: Option<i64>,
    pub(crate) last_reason: Option<String>,
    pub(crate) state: DeliveryState,
}

/// Delivery record of one message (in memory).
#[derive(Debug, Clone)]
struct Delivery {
    id: MessageId,
    key: Option<KeyHash>,
    enqueued_at: i64,
    attempts: u32,
    generation: Generation,
    first_delivery: Option<i64>,
    last_delivery: Option<i64>,
    last_reason: Option<String>,
    state: DeliveryState,
}

impl Delivery {
    fn is_done(&self) -> bool {
        matches!(self.state, DeliveryState::Done(_))
    }

    /// Occupies its key under `ordering=key`: leased, being dead-lettered, or waiting for a retry.
    /// (Given the head rule, and state records that are durable in order, only the head of a key
    /// can be busy; the count is a second line of defence, e.g. against a state log that lost a
    /// write in the middle.)
    fn key_busy(&self) -> bool {
        match self.state {
            DeliveryState::Leased { .. } | DeliveryState::DeadLetterPending { .. } => true,
            DeliveryState::Delayed { .. } => self.attempts > 0,
            _ => false,
        }
    }

    fn to_record(&self, offset: Offset) -> Option<StateRecord> {
        let state = match &self.state {
            DeliveryState::Available => RecordedState::Available,
            DeliveryState::Delayed { not_before_ms } => RecordedState::Delayed {
                not_before_ms: *not_before_ms,
            },
            DeliveryState::Leased {
                owner,
                expiry_ms,
                leased_at_ms,
            } => RecordedState::Leased {
                owner: owner.clone(),
                expiry_ms: *expiry_ms,
                leased_at_ms: *leased_at_ms,
            },
            DeliveryState::DeadLetterPending { cause } => RecordedState::DeadLetterPending { cause: *cause },
            DeliveryState::Done(outcome) => {
                return Some(StateRecord::Done {
                    offset,
                    generation: self.generation,
                    outcome: *outcome,
                })
            }
        };
        Some(StateRecord::Delivery(DeliveryRecord {
            offset,
            id: self.id,
            key: self.key,
            enqueued_at_ms: self.enqueued_at,
            attempts: self.attempts,
            generation: self.generation,
            first_delivery_ms: self.first_delivery,
            last_delivery_ms: self.last_delivery,
            state,
            last_reason: self.last_reason.clone(),
        }))
    }

    fn from_record(r: DeliveryRecord) -> Delivery {
        let state = match r.state {
            RecordedState::Available => DeliveryState::Available,
            RecordedState::Delayed { not_before_ms } => DeliveryState::Delayed { not_before_ms },
            RecordedState::Leased {
                owner,
                expiry_ms,
                leased_at_ms,
            } => DeliveryState::Leased {
                owner,
                expiry_ms,
                leased_at_ms,
            },
            RecordedState::DeadLetterPending { cause } => DeliveryState::DeadLetterPending { cause },
        };
        Delivery {
            id: r.id,
            key: r.key,
            enqueued_at: r.enqueued_at_ms,
            attempts: r.attempts,
            generation: r.generation,
            first_delivery: r.first_delivery_ms,
            last_delivery: r.last_delivery_ms,
            last_reason: r.last_reason,
            state,
        }
    }
}

#[derive(Debug, Default)]
struct KeyState {
    /// Not-done messages with this key.
    pending: BTreeSet<Offset>,
    /// How many of them are [`Delivery::key_busy`].
    busy: u32,
}

/// Everything derived from the delivery records; maintained by [`Index::add`]/[`Index::remove`]
/// around every state change, and checked by `check_invariants`.
#[derive(Debug)]
struct Index {
    /// Available messages (leasable if below the load frontier and not blocked by their key).
    ready: BTreeSet<Offset>,
    delays: DelayIndex,
    delayed: usize,
    expiries: BTreeSet<(i64, Offset)>,
    leased: usize,
    consumers: HashMap<ConsumerId, u32>,
    dead_letter_pending: usize,
    /// Only with `ordering=key`.
    keys: HashMap<KeyHash, KeyState>,
    by_key: bool,
}

impl Index {
    fn new(config: &QueueConfig) -> Index {
        Index {
            ready: BTreeSet::new(),
            delays: DelayIndex::new(config.delay_bucket_ms),
            delayed: 0,
            expiries: BTreeSet::new(),
            leased: 0,
            consumers: HashMap::new(),
            dead_letter_pending: 0,
            keys: HashMap::new(),
            by_key: config.ordering == Ordering::Key,
        }
    }

    fn add(&mut self, off: Offset, d: &Delivery) {
        match &d.state {
            DeliveryState::Available => {
                self.ready.insert(off);
            }
            DeliveryState::Delayed { not_before_ms } => {
                self.delays.insert(*not_before_ms, off);
                self.delayed += 1;
            }
            DeliveryState::Leased { owner, expiry_ms, .. } => {
                self.expiries.insert((*expiry_ms, off));
                self.leased += 1;
                *self.consumers.entry(owner.clone()).or_insert(0) += 1;
            }
            DeliveryState::DeadLetterPending { .. } => self.dead_letter_pending += 1,
            DeliveryState::Done(_) => {}
        }
        if let (true, Some(k), false) = (self.by_key, d.key, d.is_done()) {
            let ks = self.keys.entry(k).or_default();
            ks.pending.insert(off);
            if d.key_busy() {
                ks.busy += 1;
            }
        }
    }

    /// Inverse of [`Index::add`]. A delay-index entry stays behind as a stale hint.
    fn remove(&mut self, off: Offset, d: &Delivery) {
        match &d.state {
            DeliveryState::Available => {
                self.ready.remove(&off);
            }
            DeliveryState::Delayed { .. } => self.delayed -= 1,
            DeliveryState::Leased { owner, expiry_ms, .. } => {
                self.expiries.remove(&(*expiry_ms, off));
                self.leased -= 1;
                if let Some(n) = self.consumers.get_mut(owner) {
                    *n -= 1;
                    if *n == 0 {
                        self.consumers.remove(owner);
                    }
                }
            }
            DeliveryState::DeadLetterPending { .. } => self.dead_letter_pending -= 1,
            DeliveryState::Done(_) => {}
        }
        if let (true, Some(k), false) = (self.by_key, d.key, d.is_done()) {
            if let Some(ks) = self.keys.get_mut(&k) {
                ks.pending.remove(&off);
                if d.key_busy() {
                    ks.busy -= 1;
                }
                if ks.pending.is_empty() {
                    self.keys.remove(&k);
                }
            }
        }
    }

    /// `ordering=key`: whether the available message at `off` may be leased now.
    fn key_allows(&self, off: Offset, key: Option<KeyHash>) -> bool {
        match (self.by_key, key) {
            (true, Some(k)) => self
                .keys
                .get(&k)
                .is_some_and(|ks| ks.busy == 0 && ks.pending.first() == Some(&off)),
            _ => true,
        }
    }
}

/// The delivery state of one queue (consumer group) on one partition. Sans-I/O: every input is
/// a method call with `now_ms`; every output is an [`Action`].
#[derive(Debug)]
pub(crate) struct QueuePartition {
    config: QueueConfig,
    partition: PartitionId,
    now: i64,
    records: BTreeMap<Offset, Delivery>,
    /// Done watermark (Kafka's SPSO): every offset below is done, or has a (detached) record.
    start: Offset,
    /// Load frontier (Kafka's SPEO + 1): every offset below has been fed.
    loaded_end: Offset,
    /// Log end as far as the engine was told.
    log_end: Offset,
    /// Records below `start` (delayed messages that left the window, and what became of them).
    detached: usize,
    idx: Index,
    /// Redriven copies: id -> offset of the copy (ids whose origin is another offset).
    by_id: HashMap<MessageId, Offset>,
    /// The last [`REMEMBERED_ACKS`] acknowledgements, oldest first: (id, generation of the
    /// acked lease, offset). Generations are unique in a partition, so an entry is proof that
    /// this very lease was acknowledged, whatever became of the record since.
    recent_acks: VecDeque<(MessageId, Generation, Offset)>,
    dedup: DedupTable,
    /// Failed dead-letter appends to re-emit: (when, offset).
    dead_letter_retry: BTreeSet<(i64, Offset)>,
    gen_next: u64,
    gen_reserved: u64,
    gen_durable: u64,
    gen_reservations: VecDeque<(WriteId, u64)>,
    out: Vec<Action>,
    pending_records: Vec<StateRecord>,
    open_write: Option<WriteId>,
    last_write: WriteId,
    persisted: WriteId,
    gated: BTreeMap<WriteId, Vec<Action>>,
    start_dirty: bool,
    last_wake: Option<i64>,
    failed: bool,
    records_since_snapshot: u64,
    counters: Counters,
    latency_samples: VecDeque<u64>,
}

impl QueuePartition {
    /// A queue partition with no state yet, starting at `start` (Kafka `share.auto.offset.reset`:
    /// the log start offset for `earliest`, the log end offset for `latest`). Emits a `Reset`.
    pub(crate) fn new(
        config: QueueConfig,
        partition: PartitionId,
        start: Offset,
        now_ms: i64,
    ) -> Result<QueuePartition, ConfigError> {
        let mut q = QueuePartition::empty(config, partition, now_ms)?;
        q.start = start;
        q.loaded_end = start;
        q.log_end = start;
        q.emit(StateRecord::Reset { start });
        Ok(q)
    }

    fn empty(
        config: QueueConfig,
        partition: PartitionId,
        now_ms: i64,
    ) -> Result<QueuePartition, ConfigError> {
        config.validate()?;
        Ok(QueuePartition {
            idx: Index::new(&config),
            config,
            partition,
            now: now_ms,
            records: BTreeMap::new(),
            start: Offset(0),
            loaded_end: Offset(0),
            log_end: Offset(0),
            detached: 0,
            by_id: HashMap::new(),
            recent_acks: VecDeque::new(),
            dedup: DedupTable::default(),
            dead_letter_retry: BTreeSet::new(),
            gen_next: 1,
            gen_reserved: 0,
            gen_durable: 0,
            gen_reservations: VecDeque::new(),
            out: Vec::new(),
            pending_records: Vec::new(),
            open_write: None,
            last_write: WriteId(0),
            persisted: WriteId(0),
            gated: BTreeMap::new(),
            start_dirty: false,
            last_wake: None,
            failed: false,
            records_since_snapshot: 0,
            counters: Counters::default(),
            latency_samples: VecDeque::new(),
        })
    }

    /// Rebuilds the state from the durable records of the state log, in the order written.
    /// Afterwards the caller re-feeds the log (see the module documentation, "Recovery").
    /// Dead-letter appends that were pending are emitted again.
    pub(crate) fn recover(
        config: QueueConfig,
        partition: PartitionId,
        records: impl IntoIterator<Item = StateRecord>,
        now_ms: i64,
    ) -> Result<QueuePartition, ConfigError> {
        let mut q = QueuePartition::empty(config, partition, now_ms)?;
        let mut max_gen = 0u64;
        let mut reserved = 0u64;
        // Every acknowledgement replayed, in write order (a snapshot repeats some).
        let mut acks: Vec<(MessageId, Generation, Offset)> = Vec::new();
        for rec in records {
            match rec {
                StateRecord::Reset { start } => {
                    q.records.clear();
                    q.start = start;
                }
                StateRecord::Start { start } => q.start = q.start.max(start),
                StateRecord::Generation { reserved_up_to } => reserved = reserved.max(reserved_up_to.0),
                StateRecord::Delivery(r) => {
                    max_gen = max_gen.max(r.generation.0);
                    let off = r.offset;
                    if q.records.get(&off).is_some_and(Delivery::is_done) {
                        continue; // terminal
                    }
                    q.records.insert(off, Delivery::from_record(r));
                }
                StateRecord::Done {
                    offset,
                    generation,
                    outcome,
                } => {
                    max_gen = max_gen.max(generation.0);
                    let natural = MessageId::new(partition, offset);
                    let d = q.records.entry(offset).or_insert_with(|| Delivery {
                        id: natural,
                        key: None,
                        enqueued_at: 0,
                        attempts: 0,
                        generation,
                        first_delivery: None,
                        last_delivery: None,
                        last_reason: None,
                        state: DeliveryState::Done(outcome),
                    });
                    d.state = DeliveryState::Done(outcome);
                    d.generation = d.generation.max(generation);
                    if outcome == DoneOutcome::Acked {
                        acks.push((d.id, generation, offset));
                    }
                }
                StateRecord::Dedup(r) => {
                    q.dedup.insert(
                        &r.token,
                        DedupEntry {
                            id: r.id,
                            offset: r.offset,
                            expires_at_ms: r.expires_at_ms,
                        },
                        now_ms,
                    );
                }
            }
        }
        // The most recent distinct acknowledgements, oldest first.
        let mut seen = std::collections::HashSet::new();
        let mut recent: Vec<_> = acks
            .into_iter()
            .rev()
            .filter(|(_, g, _)| seen.insert(*g))
            .take(REMEMBERED_ACKS)
            .collect();
        recent.reverse();
        q.recent_acks = recent.into();
        let start = q.start;
        q.records.retain(|off, d| *off >= start || !d.is_done());
        q.loaded_end = start;
        q.log_end = start;
        q.rebuild_index();
        // Saturating: the values come from disk (a corrupt but CRC-valid record must not panic).
        q.gen_reserved = reserved.max(max_gen);
        q.gen_next = q.gen_reserved.saturating_add(1);
        q.gen_durable = q.gen_reserved;
        let pending: Vec<Offset> = q
            .records
            .iter()
            .filter(|(_, d)| matches!(d.state, DeliveryState::DeadLetterPending { .. }))
            .map(|(o, _)| *o)
            .collect();
        for off in pending {
            if let Some(req) = q.dead_letter_request(off) {
                q.out.push(Action::DeadLetter(req));
            }
        }
        Ok(q)
    }

    fn rebuild_index(&mut self) {
        self.idx = Index::new(&self.config);
        self.by_id.clear();
        self.detached = 0;
        for (off, d) in &self.records {
            self.idx.add(*off, d);
            if *off < self.start {
                self.detached += 1;
            }
            if d.id != MessageId::new(self.partition, *off) && !d.is_done() {
                // Two live copies of one id only after a crash (one being dead-lettered again):
                // the id names the deliverable one.
                let replace = match self.by_id.get(&d.id).and_then(|o| self.records.get(o)) {
                    Some(other) => matches!(other.state, DeliveryState::DeadLetterPending { .. }),
                    None => true,
                };
                if replace {
                    self.by_id.insert(d.id, *off);
                }
            }
        }
    }

    /// Applies new settings (PUT /v1/queues/{queue}, IncrementalAlterConfigs). Existing leases
    /// keep their expiry; new limits apply to new requests.
    pub(crate) fn reconfigure(&mut self, config: QueueConfig) -> Result<(), ConfigError> {
        config.validate()?;
        self.config = config;
        self.rebuild_index();
        Ok(())
    }

    pub(crate) fn config(&self) -> &QueueConfig {
        &self.config
    }

    pub(crate) fn partition(&self) -> PartitionId {
        self.partition
    }

    /// Done watermark (Kafka's share-partition start offset).
    pub(crate) fn start(&self) -> Offset {
        self.start
    }

    #[cfg(test)]
    /// Every offset below has been fed (Kafka's share-partition end offset + 1).
    pub(crate) fn loaded_end(&self) -> Offset {
        self.loaded_end
    }

    /// Lowest offset whose message the engine may still need from the log (delivery or
    /// dead-lettering). Retention must not delete at or above it.
    pub(crate) fn retention_floor(&self) -> Offset {
        self.records
            .keys()
            .next()
            .map_or(self.start, |o| (*o).min(self.start))
    }

    // ----- time -------------------------------------------------------------------------------

    fn clock(&mut self, now_ms: i64) -> i64 {
        // Time never goes backwards inside the engine, whatever the wall clock does.
        self.now = self.now.max(now_ms);
        self.now
    }

    /// Runs what is due at `now_ms`: lease expiries, promotion of delayed messages, dead-letter
    /// retries, dedup expiry. Every command does this first; call it at [`Self::next_deadline`].
    pub(crate) fn tick(&mut self, now_ms: i64) {
        if self.failed {
            return;
        }
        let now = self.clock(now_ms);
        self.run_timers(now);
    }

    /// When [`Self::tick`] next has something to do.
    pub(crate) fn next_deadline(&self) -> Option<i64> {
        [
            self.idx.expiries.first().map(|(t, _)| *t),
            self.idx.delays.next_due(),
            self.dead_letter_retry.first().map(|(t, _)| *t),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    fn run_timers(&mut self, now: i64) {
        while let Some(&(expiry, off)) = self.idx.expiries.first() {
            if expiry > now {
                break;
            }
            self.counters.lease_expiries += 1;
            let delay = if self.config.expiry_backoff { None } else { Some(0) };
            self.fail_attempt(off, Some(REASON_LEASE_EXPIRED.to_string()), delay, now);
        }
        let mut due = Vec::new();
        self.idx.delays.pop_due(now, &mut due);
        for (nb, off) in due {
            let is_due = matches!(
                self.records.get(&off).map(|d| &d.state),
                Some(DeliveryState::Delayed { not_before_ms }) if *not_before_ms == nb
            );
            if is_due {
                // No record: a `Delayed` record whose time has passed replays as available.
                self.transition(off, |d| d.state = DeliveryState::Available);
            }
        }
        while let Some(&(at, off)) = self.dead_letter_retry.first() {
            if at > now {
                break;
            }
            self.dead_letter_retry.remove(&(at, off));
            if let Some(req) = self.dead_letter_request(off) {
                self.out.push(Action::DeadLetter(req));
            }
        }
        self.dedup.expire(now);
    }

    // ----- outbox ----------------------------------------------------------------------------

    /// Takes the actions to perform, in order. Closes the current state-log write.
    pub(crate) fn poll_actions(&mut self) -> Vec<Action> {
        self.close_write();
        let wake = if self.failed { None } else { self.next_deadline() };
        if let (Some(at), true) = (wake, wake != self.last_wake) {
            self.out.push(Action::WakeAt(at));
        }
        self.last_wake = wake;
        std::mem::take(&mut self.out)
    }

    fn current_write(&mut self) -> WriteId {
        match self.open_write {
            Some(w) => w,
            None => {
                let w = WriteId(self.last_write.0 + 1);
                self.last_write = w;
                self.open_write = Some(w);
                w
            }
        }
    }

    fn close_write(&mut self) {
        if self.start_dirty {
            self.start_dirty = false;
            let start = self.start;
            self.emit(StateRecord::Start { start });
        }
        if let Some(w) = self.open_write.take() {
            let records = std::mem::take(&mut self.pending_records);
            self.out.push(Action::Persist {
                write_id: w,
                records,
                snapshot: false,
            });
        }
    }

    fn emit(&mut self, rec: StateRecord) {
        self.current_write();
        self.pending_records.push(rec);
        self.records_since_snapshot += 1;
    }

    fn emit_state(&mut self, off: Offset) {
        if let Some(rec) = self.records.get(&off).and_then(|d| d.to_record(off)) {
            self.emit(rec);
        }
    }

    /// Queues `action`, to be released once write `gate` is durable (at once if `None`).
    fn release_after(&mut self, gate: Option<WriteId>, action: Action) {
        match gate {
            Some(w) if w > self.persisted => self.gated.entry(w).or_default().push(action),
            _ => self.out.push(action),
        }
    }

    /// The latest write, if not yet durable: reporting state that may have been written by it.
    fn latest_unpersisted_write(&self) -> Option<WriteId> {
        (self.last_write > self.persisted).then_some(self.last_write)
    }

    /// The caller made every write up to `write_id` durable. Releases the replies and
    /// dead-letter requests that waited for it.
    pub(crate) fn persisted(&mut self, write_id: WriteId) {
        if self.failed || write_id <= self.persisted {
            return;
        }
        debug_assert!(write_id <= self.last_write, "persisted a write never emitted");
        self.persisted = write_id.min(self.last_write);
        let later = self.gated.split_off(&WriteId(self.persisted.0 + 1));
        for (_, actions) in std::mem::replace(&mut self.gated, later) {
            self.out.extend(actions);
        }
        while let Some(&(w, r)) = self.gen_reservations.front() {
            if w > self.persisted {
                break;
            }
            self.gen_durable = self.gen_durable.max(r);
            self.gen_reservations.pop_front();
        }
    }

    /// A state-log write failed. The engine answers every waiting and future request with
    /// [`QueueError::Unavailable`]; the caller must rebuild it with [`Self::recover`] from what
    /// is durable (in-memory state may be ahead of the disk).
    pub(crate) fn persist_failed(&mut self, _write_id: WriteId) {
        if self.failed {
            return;
        }
        self.failed = true;
        for (_, actions) in std::mem::take(&mut self.gated) {
            for a in actions {
                if let Action::Reply { request, .. } = a {
                    self.out.push(Action::Reply {
                        request,
                        reply: Err(QueueError::Unavailable),
                    });
                }
            }
        }
        self.pending_records.clear();
        self.open_write = None;
    }

    fn usable(&self) -> Result<(), QueueError> {
        if self.failed {
            Err(QueueError::Unavailable)
        } else {
            Ok(())
        }
    }

    /// Whether the state log has grown enough that a [`Self::snapshot`] is worth writing.
    pub(crate) fn wants_snapshot(&self) -> bool {
        let live = (self.records.len() + self.dedup.len() + self.recent_acks.len()) as u64;
        self.records_since_snapshot >= 1024.max(2 * live)
    }

    /// Writes the whole state as one write flagged `snapshot` (absolute records: `Generation`,
    /// `Start`, one per live or in-window message, one per dedup entry). Once it is durable the
    /// caller may delete every earlier write of the state log.
    pub(crate) fn snapshot(&mut self) {
        self.snapshot_with_reset(false);
    }

    fn snapshot_with_reset(&mut self, reset: bool) {
        if self.failed {
            return;
        }
        self.close_write();
        let w = self.current_write();
        let mut recs = Vec::with_capacity(self.records.len() + self.dedup.len() + 3);
        if reset {
            // Only inside one atomic write: replay drops what came before, then rebuilds.
            recs.push(StateRecord::Reset { start: self.start });
        }
        recs.push(StateRecord::Generation {
            reserved_up_to: Generation(self.gen_reserved),
        });
        recs.push(StateRecord::Start { start: self.start });
        // Remembered acknowledgements of messages that left the window (the others are written
        // with their records below): a redriven copy's with its id first.
        for &(id, generation, offset) in &self.recent_acks {
            if offset >= self.start || self.records.contains_key(&offset) {
                continue;
            }
            if id != MessageId::new(self.partition, offset) {
                recs.push(StateRecord::Delivery(DeliveryRecord {
                    offset,
                    id,
                    key: None,
                    enqueued_at_ms: 0,
                    attempts: 0,
                    generation,
                    first_delivery_ms: None,
                    last_delivery_ms: None,
                    state: RecordedState::Available,
                    last_reason: None,
                }));
            }
            recs.push(StateRecord::Done {
                offset,
                generation,
                outcome: DoneOutcome::Acked,
            });
        }
        for (off, d) in &self.records {
            if let Some(r) = d.to_record(*off) {
                recs.push(r);
            }
        }
        for (token, e) in self.dedup.iter() {
            recs.push(StateRecord::Dedup(DedupRecord {
                token: token.to_vec(),
                id: e.id,
                offset: e.offset,
                expires_at_ms: e.expires_at_ms,
            }));
        }
        self.open_write = None;
        self.start_dirty = false;
        self.records_since_snapshot = 0;
        self.out.push(Action::Persist {
            write_id: w,
            records: recs,
            snapshot: true,
        });
    }

    // ----- publish side ----------------------------------------------------------------------

    /// Checks a publish before the caller appends it. Dedup: a live token answers with the
    /// first message. The caller must append and call [`Self::appended`] without yielding in
    /// between, so that a concurrent duplicate sees the token.
    pub(crate) fn admit_publish(
        &mut self,
        req: &PublishRequest<'_>,
        now_ms: i64,
    ) -> Result<Admission, QueueError> {
        self.usable()?;
        let now = self.clock(now_ms);
        if req.size_bytes > u64::from(self.config.max_message_bytes) {
            return Err(QueueError::MessageTooLarge {
                size: req.size_bytes,
                max: self.config.max_message_bytes,
            });
        }
        if req.delay_ms > self.config.max_delay_ms {
            return Err(QueueError::DelayOutOfRange {
                given_ms: req.delay_ms,
                max_ms: self.config.max_delay_ms,
            });
        }
        if let Some(token) = req.dedup_token {
            if token.is_empty() || token.len() > MAX_DEDUP_TOKEN_BYTES {
                return Err(QueueError::BadDedupToken {
                    max: MAX_DEDUP_TOKEN_BYTES,
                });
            }
        }
        if let Some(id) = req.redrive_of {
            if id.partition != self.partition {
                return Err(QueueError::WrongPartition(id));
            }
            if self.is_live(id) {
                return Err(QueueError::AlreadyLive(id));
            }
        }
        if self.config.dedup_window_ms > 0 {
            if let Some(token) = req.dedup_token {
                self.dedup.expire(now);
                if let Some(e) = self.dedup.get(token, now) {
                    self.counters.duplicates += 1;
                    return Ok(Admission::Duplicate {
                        id: e.id,
                        offset: e.offset,
                    });
                }
                if self.dedup.len() >= self.config.max_dedup_entries as usize {
                    return Err(QueueError::DedupTableFull {
                        max: self.config.max_dedup_entries,
                    });
                }
            }
        }
        if req.delay_ms > 0 && self.idx.delayed >= self.config.max_delayed as usize {
            return Err(QueueError::TooManyDelayed {
                max: self.config.max_delayed,
            });
        }
        let deliver_at_ms = if req.delay_ms > 0 {
            now.saturating_add(req.delay_ms as i64)
        } else {
            0
        };
        Ok(Admission::Append { deliver_at_ms })
    }

    /// Whether a message with this id is pending in this partition (redrive refusal).
    fn is_live(&self, id: MessageId) -> bool {
        if let Some(off) = self.by_id.get(&id) {
            if self.records.get(off).is_some_and(|d| !d.is_done()) {
                return true;
            }
        }
        if id.offset >= self.log_end {
            return false;
        }
        match self.records.get(&id.offset) {
            Some(d) if d.id == id => !d.is_done(),
            Some(_) => false,
            // Not materialized: below the start it is done; above, not yet delivered.
            None => id.offset >= self.start,
        }
    }

    /// A message is in the log at `m.offset` (published now, or read back while loading or
    /// recovering). Registers its dedup token, and adds it to the window when it is the next
    /// offset to load and the window has room. Idempotent by offset.
    pub(crate) fn appended(&mut self, m: &AppendedMessage<'_>, now_ms: i64) {
        if self.failed || m.offset.0 < 0 {
            return;
        }
        let now = self.clock(now_ms);
        let off = m.offset;
        if off >= self.log_end {
            self.counters.published += 1;
            self.log_end = off.plus(1);
        }
        let id = m.message_id.unwrap_or(MessageId::new(self.partition, off));
        if let (true, Some(token)) = (self.config.dedup_window_ms > 0, m.dedup_token) {
            if !token.is_empty() && token.len() <= MAX_DEDUP_TOKEN_BYTES {
                let expires_at_ms = m.timestamp_ms.saturating_add(self.config.dedup_window_ms as i64);
                if self.dedup.insert(
                    token,
                    DedupEntry {
                        id,
                        offset: off,
                        expires_at_ms,
                    },
                    now,
                ) {
                    self.emit(StateRecord::Dedup(DedupRecord {
                        token: token.to_vec(),
                        id,
                        offset: off,
                        expires_at_ms,
                    }));
                }
            }
        }
        if off != self.loaded_end || self.window_full() {
            return; // already loaded, or to be loaded later (wants_load)
        }
        self.materialize(off, id, m, now);
        self.loaded_end = off.plus(1);
        self.run_timers(now);
        self.advance_start();
    }

    /// Offsets `[from, until)` hold no deliverable message (control records, aborted
    /// transactions, a compacted-away range). Moves the load frontier over them.
    pub(crate) fn log_gap(&mut self, from: Offset, until: Offset) {
        if self.failed || from > self.loaded_end || until <= self.loaded_end {
            return;
        }
        self.loaded_end = until;
        self.log_end = self.log_end.max(until);
        let now = self.now;
        self.run_timers(now);
        self.advance_start();
    }

    /// The log end offset, when the publish path appended past the window.
    pub(crate) fn set_log_end(&mut self, log_end: Offset) {
        self.log_end = self.log_end.max(log_end);
    }

    /// Start-up, right after [`Self::recover`]: the log's end offset as recovered by storage.
    /// State records about offsets at or beyond it describe appends that never became durable
    /// (a crash between the log write and the state write can only go the other way if the two
    /// are not in one journal): they are dropped, and if anything was dropped the corrected
    /// state is written as one replacing write (`Reset` + snapshot).
    pub(crate) fn recovered_log_end(&mut self, log_end: Offset) {
        let dropped = self.records.split_off(&log_end);
        let dedup_dropped = self.dedup.retain_below(log_end);
        let clamped = self.start > log_end;
        self.start = self.start.min(log_end);
        self.loaded_end = self.start;
        self.log_end = log_end;
        if dropped.is_empty() && dedup_dropped == 0 && !clamped {
            return;
        }
        self.rebuild_index();
        self.snapshot_with_reset(true);
    }

    /// The log range to read and feed, when the window has room and the log has more.
    pub(crate) fn wants_load(&self) -> Option<LoadRequest> {
        if self.failed || self.loaded_end >= self.log_end || self.window_full() {
            return None;
        }
        let room = (i64::from(self.config.max_window) - self.window_span()).max(0);
        let max_records = room.min(self.log_end.0 - self.loaded_end.0);
        Some(LoadRequest {
            from: self.loaded_end,
            max_records: max_records as u64,
        })
    }

    fn window_span(&self) -> i64 {
        self.loaded_end.0 - self.start.0
    }

    fn window_full(&self) -> bool {
        self.window_span() >= i64::from(self.config.max_window)
    }

    /// Whether a message of the window (not below it) is available.
    fn window_has_ready(&self) -> bool {
        self.idx.ready.range(self.start..self.loaded_end).next().is_some()
    }

    fn materialize(&mut self, off: Offset, id: MessageId, m: &AppendedMessage<'_>, now: i64) {
        if self.records.contains_key(&off) {
            return; // known from the state log: its recorded state wins
        }
        let natural = MessageId::new(self.partition, off);
        // The header comes from the log (any Kafka producer can write it): bound the delay.
        let deliver_at = m
            .deliver_at_ms
            .min(m.timestamp_ms.saturating_add(self.config.max_delay_ms as i64));
        let mut d = Delivery {
            id,
            key: m.key.map(KeyHash::of),
            enqueued_at: m.timestamp_ms.max(deliver_at),
            attempts: 0,
            generation: Generation(0),
            first_delivery: None,
            last_delivery: None,
            last_reason: None,
            state: if deliver_at > now {
                DeliveryState::Delayed {
                    not_before_ms: deliver_at,
                }
            } else {
                DeliveryState::Available
            },
        };
        if id != natural {
            // Another deliverable copy with this id: two redrives of one dead-letter entry raced
            // while the first copy was not loaded. (A copy being dead-lettered again after a
            // crash does not count: it will not be delivered.)
            let other_deliverable = self
                .by_id
                .get(&id)
                .and_then(|o| self.records.get(o))
                .is_some_and(|o| !o.is_done() && !matches!(o.state, DeliveryState::DeadLetterPending { .. }));
            if other_deliverable {
                // A second copy of a message already redriven: same id, same message.
                self.counters.duplicate_redrives += 1;
                d.state = DeliveryState::Done(DoneOutcome::Archived);
                self.records.insert(off, d);
                self.emit_state(off);
                return;
            }
            self.by_id.insert(id, off);
        }
        let delayed = matches!(d.state, DeliveryState::Delayed { .. });
        self.idx.add(off, &d);
        self.records.insert(off, d);
        if delayed {
            // The delay-topic entry: small, no payload. Lets the start move past the message.
            self.emit_state(off);
        }
    }

    // ----- consumer side ---------------------------------------------------------------------

    /// Leases up to `max_messages` available messages to `consumer` for `visibility_ms`: lowest
    /// offsets first, skipping messages whose key is busy under `ordering=key`. The reply (maybe
    /// empty) comes as an [`Action::Reply`].
    pub(crate) fn lease(
        &mut self,
        request: RequestId,
        consumer: &ConsumerId,
        max_messages: u32,
        visibility_ms: u64,
        now_ms: i64,
    ) -> Result<(), QueueError> {
        self.usable()?;
        check_consumer(consumer)?;
        if max_messages == 0 {
            return Err(QueueError::EmptyBatch);
        }
        if max_messages > self.config.max_lease_batch {
            return Err(QueueError::BatchTooLarge {
                requested: max_messages as usize,
                max: self.config.max_lease_batch,
            });
        }
        self.check_visibility(visibility_ms)?;
        let now = self.clock(now_ms);
        self.run_timers(now);
        let held = self.idx.consumers.get(consumer).copied().unwrap_or(0);
        if held >= self.config.max_leased_per_consumer {
            return Err(QueueError::ConsumerLeaseLimit {
                max: self.config.max_leased_per_consumer,
            });
        }
        if self.idx.leased >= self.config.max_leased_per_partition as usize {
            return Err(QueueError::PartitionLeaseLimit {
                max: self.config.max_leased_per_partition,
            });
        }
        let room = (max_messages)
            .min(self.config.max_leased_per_consumer - held)
            .min(self.config.max_leased_per_partition - self.idx.leased as u32) as usize;
        let chosen: Vec<Offset> = self
            .idx
            .ready
            .range(..self.loaded_end)
            .filter(|off| {
                self.idx
                    .key_allows(**off, self.records.get(off).and_then(|d| d.key))
            })
            .take(room)
            .copied()
            .collect();
        let mut leases = Vec::with_capacity(chosen.len());
        let mut gate: Option<WriteId> = None;
        let expiry_ms = now.saturating_add(visibility_ms as i64);
        for off in chosen {
            let (generation, gen_gate) = self.next_generation();
            gate = gate.max(gen_gate);
            let owner = consumer.clone();
            self.transition(off, |d| {
                d.attempts = d.attempts.saturating_add(1);
                d.generation = generation;
                d.first_delivery.get_or_insert(now);
                d.last_delivery = Some(now);
                d.state = DeliveryState::Leased {
                    owner,
                    expiry_ms,
                    leased_at_ms: now,
                };
            });
            self.emit_state(off);
            if let Some(d) = self.records.get(&off) {
                leases.push(Lease {
                    offset: off,
                    id: d.id,
                    generation,
                    attempt: d.attempts,
                    expiry_ms,
                    first_delivery_ms: d.first_delivery.unwrap_or(now),
                });
            }
        }
        if self.config.detach_leases && !leases.is_empty() && self.window_full() && !self.window_has_ready() {
            self.advance_start();
        }
        if self.config.lease_durability == LeaseDurability::BeforeReply && !leases.is_empty() {
            gate = Some(self.current_write());
        }
        self.release_after(
            gate,
            Action::Reply {
                request,
                reply: Ok(Reply::Leases(leases)),
            },
        );
        Ok(())
    }

    /// Whether a lease request would get at least one message now.
    pub(crate) fn has_leasable(&self) -> bool {
        !self.failed
            && self.idx.ready.range(..self.loaded_end).any(|off| {
                self.idx
                    .key_allows(*off, self.records.get(off).and_then(|d| d.key))
            })
    }

    /// Generations handed out from now on are at least `floor`. A cluster node's engine that
    /// starts leading a partition raises them to a floor of its leader epoch, so that they
    /// never repeat a generation an earlier leader handed out (whose state this engine may not
    /// have): an ack naming a lease of an earlier leader is then stale here, never taken for
    /// a lease of this one. The reservation is written like any other.
    pub(crate) fn raise_generations(&mut self, floor: u64) {
        if self.failed || self.gen_next >= floor {
            return;
        }
        let reserved_up_to = floor - 1;
        self.gen_next = floor;
        self.gen_reserved = self.gen_reserved.max(reserved_up_to);
        let w = self.current_write();
        self.gen_reservations.push_back((w, reserved_up_to));
        self.emit(StateRecord::Generation {
            reserved_up_to: Generation(reserved_up_to),
        });
    }

    /// Hands out the next generation, reserving a new block ahead of time. Returns the write a
    /// reply must wait for so that the generation is covered by a durable reservation.
    fn next_generation(&mut self) -> (Generation, Option<WriteId>) {
        let g = self.gen_next;
        self.gen_next = self.gen_next.saturating_add(1);
        let block = self.config.generation_block;
        if g.saturating_add(block / 2) > self.gen_reserved {
            let reserved_up_to = self.gen_reserved.max(g).saturating_add(block);
            self.gen_reserved = reserved_up_to;
            let w = self.current_write();
            self.gen_reservations.push_back((w, reserved_up_to));
            self.emit(StateRecord::Generation {
                reserved_up_to: Generation(reserved_up_to),
            });
        }
        let gate = if g <= self.gen_durable {
            None
        } else {
            self.gen_reservations
                .iter()
                .find(|(_, r)| *r >= g)
                .map(|(w, _)| *w)
        };
        (Generation(g), gate)
    }

    fn check_visibility(&self, visibility_ms: u64) -> Result<(), QueueError> {
        if visibility_ms < self.config.min_visibility_ms || visibility_ms > self.config.max_visibility_ms {
            return Err(QueueError::VisibilityOutOfRange {
                given_ms: visibility_ms,
                min_ms: self.config.min_visibility_ms,
                max_ms: self.config.max_visibility_ms,
            });
        }
        Ok(())
    }

    /// Acks, nacks, rejects or extends leased messages. The reply comes as an
    /// [`Action::Reply`], after the records that make it true are durable.
    pub(crate) fn settle(
        &mut self,
        request: RequestId,
        items: &[SettleItem],
        now_ms: i64,
    ) -> Result<(), QueueError> {
        self.usable()?;
        if items.is_empty() {
            return Err(QueueError::EmptyBatch);
        }
        if items.len() > self.config.max_lease_batch as usize {
            return Err(QueueError::BatchTooLarge {
                requested: items.len(),
                max: self.config.max_lease_batch,
            });
        }
        let now = self.clock(now_ms);
        self.run_timers(now);
        let mut results = Vec::with_capacity(items.len());
        let mut durable = false;
        for item in items {
            let r = self.settle_one(item, now);
            if let Ok(s) = &r {
                durable |= !matches!(s.outcome, Outcome::Extended { .. });
            }
            results.push(r);
        }
        let gate = if durable {
            self.latest_unpersisted_write()
        } else {
            None
        };
        self.release_after(
            gate,
            Action::Reply {
                request,
                reply: Ok(Reply::Settled(results)),
            },
        );
        Ok(())
    }

    fn resolve(&self, target: &MessageRef) -> Result<Offset, QueueError> {
        match target {
            MessageRef::Offset(o) => Ok(*o),
            MessageRef::Id(id) => {
                if id.partition != self.partition {
                    return Err(QueueError::WrongPartition(*id));
                }
                Ok(self.by_id.get(id).copied().unwrap_or(id.offset))
            }
        }
    }

    fn settle_one(&mut self, item: &SettleItem, now: i64) -> Result<Settled, QueueError> {
        if item.reason.as_ref().is_some_and(|r| r.len() > MAX_REASON_BYTES) {
            return Err(QueueError::ReasonTooLong {
                max: MAX_REASON_BYTES,
            });
        }
        match item.op {
            SettleOp::Nack { delay_ms: Some(d) } if d > self.config.max_delay_ms => {
                return Err(QueueError::DelayOutOfRange {
                    given_ms: d,
                    max_ms: self.config.max_delay_ms,
                });
            }
            SettleOp::Extend { visibility_ms } => self.check_visibility(visibility_ms)?,
            _ => {}
        }
        let off = self.resolve(&item.target)?;
        if let (SettleOp::Ack, Fence::Generation(g), MessageRef::Id(id)) =
            (&item.op, &item.fence, &item.target)
        {
            let remembered = self.recent_acks.iter().find(|(i, gen, _)| i == id && gen == g);
            // Still done (a reset may have made an offset deliverable again).
            let done = |o: &Offset| self.records.get(o).map_or(*o < self.start, Delivery::is_done);
            if let Some(&(id, _, offset)) = remembered.filter(|(_, _, o)| done(o)) {
                // A retried ack (lost response) of an acknowledged lease: the same answer, once
                // the first one is durable.
                return Ok(Settled {
                    offset,
                    id,
                    outcome: Outcome::Acked,
                });
            }
        }
        let Some(d) = self.records.get(&off) else {
            return Err(if off < self.start {
                QueueError::AlreadyDone
            } else if off < self.log_end {
                QueueError::NotLeased { state: "available" }
            } else {
                QueueError::NotFound
            });
        };
        if let MessageRef::Id(id) = &item.target {
            if d.id != *id {
                return Err(QueueError::NotFound);
            }
        }
        let id = d.id;
        let generation = d.generation;
        let leased_at = match (&d.state, &item.fence) {
            (DeliveryState::Leased { leased_at_ms, .. }, Fence::Generation(g)) if *g == d.generation => {
                *leased_at_ms
            }
            (DeliveryState::Leased { .. }, Fence::Generation(g)) => {
                return Err(QueueError::stale(*g, d.generation))
            }
            (
                DeliveryState::Leased {
                    owner, leased_at_ms, ..
                },
                Fence::Owner(o),
            ) if owner == o => *leased_at_ms,
            (DeliveryState::Leased { .. }, Fence::Owner(_)) => return Err(QueueError::NotOwner),
            (DeliveryState::Done(DoneOutcome::Acked), Fence::Generation(g))
                if *g == d.generation && item.op == SettleOp::Ack =>
            {
                // A retried ack (lost response): same answer, once the first one is durable.
                return Ok(Settled {
                    offset: off,
                    id,
                    outcome: Outcome::Acked,
                });
            }
            (_, Fence::Generation(g)) if *g < d.generation => {
                return Err(QueueError::stale(*g, d.generation))
            }
            (DeliveryState::Done(_), _) => return Err(QueueError::AlreadyDone),
            (state, _) => return Err(QueueError::NotLeased { state: state.name() }),
        };
        let outcome = match item.op {
            SettleOp::Ack => {
                self.counters.acked += 1;
                self.push_latency(now.saturating_sub(leased_at).max(0) as u64);
                if self.recent_acks.len() >= REMEMBERED_ACKS {
                    self.recent_acks.pop_front();
                }
                self.recent_acks.push_back((id, generation, off));
                self.finish(off, DoneOutcome::Acked);
                Outcome::Acked
            }
            SettleOp::Nack { delay_ms } => {
                self.counters.nacked += 1;
                self.fail_attempt(off, item.reason.clone(), delay_ms, now)
            }
            SettleOp::Reject => {
                self.counters.rejected += 1;
                if let Some(r) = &item.reason {
                    self.transition(off, |d| d.last_reason = Some(r.clone()));
                }
                self.dead_letter(off, DeadLetterCause::Rejected, now)
            }
            SettleOp::Extend { visibility_ms } => {
                let expiry_ms = now.saturating_add(visibility_ms as i64);
                let lifetime_ms = expiry_ms.saturating_sub(leased_at).max(0) as u64;
                if lifetime_ms > self.config.max_lease_lifetime_ms {
                    return Err(QueueError::LeaseLifetimeExceeded {
                        lifetime_ms,
                        max_ms: self.config.max_lease_lifetime_ms,
                    });
                }
                self.transition(off, |d| {
                    if let DeliveryState::Leased { expiry_ms: e, .. } = &mut d.state {
                        *e = expiry_ms;
                    }
                });
                // Written, never waited for: a lost extension only makes the lease end earlier,
                // and an ended lease is fenced.
                self.emit_state(off);
                Outcome::Extended { expiry_ms }
            }
        };
        Ok(Settled {
            offset: off,
            id,
            outcome,
        })
    }

    /// Releases every lease `owner` holds, as failed attempts without delay (a share-group
    /// member left; an HTTP consumer closed). Returns how many.
    pub(crate) fn release_owner(&mut self, owner: &ConsumerId, now_ms: i64) -> usize {
        if self.failed {
            return 0;
        }
        let now = self.clock(now_ms);
        self.run_timers(now);
        let held: Vec<Offset> = self
            .idx
            .expiries
            .iter()
            .map(|(_, o)| *o)
            .filter(|o| {
                matches!(self.records.get(o).map(|d| &d.state),
                    Some(DeliveryState::Leased { owner: x, .. }) if x == owner)
            })
            .collect();
        for off in &held {
            self.fail_attempt(*off, Some(REASON_RELEASED.to_string()), Some(0), now);
        }
        held.len()
    }

    /// A failed attempt of a leased message: retry after the delay, or dead-letter when the
    /// attempts are exhausted.
    fn fail_attempt(
        &mut self,
        off: Offset,
        reason: Option<String>,
        delay_ms: Option<u64>,
        now: i64,
    ) -> Outcome {
        let Some(d) = self.records.get(&off) else {
            debug_assert!(false, "failing an unknown message");
            return Outcome::Acked;
        };
        let attempts = d.attempts;
        if attempts >= self.config.max_attempts {
            if reason.is_some() {
                self.transition(off, |d| d.last_reason = reason);
            }
            return self.dead_letter(off, DeadLetterCause::MaxAttempts, now);
        }
        let delay = delay_ms.unwrap_or_else(|| self.config.backoff.delay_ms(attempts));
        let not_before_ms = now.saturating_add(delay as i64);
        self.transition(off, |d| {
            if reason.is_some() {
                d.last_reason = reason;
            }
            d.state = if delay > 0 {
                DeliveryState::Delayed { not_before_ms }
            } else {
                DeliveryState::Available
            };
        });
        self.counters.retries += 1;
        self.emit_state(off);
        self.advance_start();
        Outcome::Retry {
            not_before_ms,
            attempts,
        }
    }

    fn dead_letter(&mut self, off: Offset, cause: DeadLetterCause, now: i64) -> Outcome {
        let attempts = self.records.get(&off).map_or(0, |d| d.attempts);
        self.counters.dead_lettered += 1;
        match self.config.dead_letter {
            DeadLetterMode::Archive => self.finish(off, DoneOutcome::Archived),
            DeadLetterMode::Topic => {
                self.transition(off, |d| d.state = DeliveryState::DeadLetterPending { cause });
                self.emit_state(off);
                if let Some(mut req) = self.dead_letter_request(off) {
                    req.dead_lettered_at_ms = now;
                    let gate = Some(self.current_write());
                    self.release_after(gate, Action::DeadLetter(req));
                }
            }
        }
        Outcome::DeadLettered { cause, attempts }
    }

    fn dead_letter_request(&self, off: Offset) -> Option<DeadLetterRequest> {
        let d = self.records.get(&off)?;
        let DeliveryState::DeadLetterPending { cause } = d.state else {
            return None;
        };
        Some(DeadLetterRequest {
            partition: self.partition,
            offset: off,
            id: d.id,
            attempts: d.attempts,
            cause,
            last_reason: d.last_reason.clone(),
            first_delivery_ms: d.first_delivery,
            last_delivery_ms: d.last_delivery,
            dead_lettered_at_ms: self.now,
        })
    }

    /// The dead-letter append of the message at `offset` is durable: the message is done.
    pub(crate) fn dead_letter_appended(&mut self, offset: Offset, now_ms: i64) {
        if self.failed {
            return;
        }
        self.clock(now_ms);
        if matches!(
            self.records.get(&offset).map(|d| &d.state),
            Some(DeliveryState::DeadLetterPending { .. })
        ) {
            self.finish(offset, DoneOutcome::Archived);
        }
    }

    /// The dead-letter append failed; it is emitted again after `dead_letter_retry_ms`.
    pub(crate) fn dead_letter_failed(&mut self, offset: Offset, now_ms: i64) {
        if self.failed {
            return;
        }
        let now = self.clock(now_ms);
        if matches!(
            self.records.get(&offset).map(|d| &d.state),
            Some(DeliveryState::DeadLetterPending { .. })
        ) {
            let at = now.saturating_add(self.config.dead_letter_retry_ms as i64);
            self.dead_letter_retry.insert((at, offset));
        }
    }

    /// Marks a message done, writes it, forgets it if it is below the start.
    fn finish(&mut self, off: Offset, outcome: DoneOutcome) {
        self.transition(off, |d| d.state = DeliveryState::Done(outcome));
        self.emit_state(off);
        if off < self.start {
            self.forget(off);
        } else {
            self.advance_start();
        }
    }

    /// Forgets a done record below the start.
    fn forget(&mut self, off: Offset) {
        debug_assert!(off < self.start);
        if self.drop_record(off) {
            self.detached -= 1;
        }
    }

    fn drop_record(&mut self, off: Offset) -> bool {
        let Some(d) = self.records.remove(&off) else {
            return false;
        };
        self.idx.remove(off, &d);
        if self.by_id.get(&d.id) == Some(&off) {
            self.by_id.remove(&d.id);
        }
        true
    }

    /// Moves the start over done messages (forgetting them) and delayed ones (detaching them, up
    /// to `max_delayed`), and with `detach_leases` over leased ones while the window is full with
    /// nothing available in it (up to `max_leased_per_partition` more), up to the first message
    /// still in flight.
    fn advance_start(&mut self) {
        let old = self.start;
        let max_detached_leases = if self.config.detach_leases {
            self.config.max_delayed as usize + self.config.max_leased_per_partition as usize
        } else {
            0
        };
        loop {
            let next = self
                .records
                .range(self.start..self.loaded_end)
                .next()
                .map(|(o, d)| (*o, d));
            let Some((off, d)) = next else {
                self.start = self.loaded_end;
                break;
            };
            match d.state {
                DeliveryState::Done(_) => {
                    self.start = off.plus(1);
                    self.drop_record(off);
                }
                DeliveryState::Delayed { .. } if self.detached < self.config.max_delayed as usize => {
                    self.start = off.plus(1);
                    self.detached += 1;
                }
                // Only when it holds something back: the window is full and has nothing left
                // to lease (a window full of a backlog needs no room).
                DeliveryState::Leased { .. }
                    if self.detached < max_detached_leases
                        && self.window_full()
                        && !self.window_has_ready() =>
                {
                    self.start = off.plus(1);
                    self.detached += 1;
                }
                _ => {
                    self.start = off;
                    break;
                }
            }
        }
        if self.start != old {
            self.start_dirty = true;
            self.current_write();
        }
    }

    /// Applies `f` to the record at `off`, keeping every index in step.
    fn transition(&mut self, off: Offset, f: impl FnOnce(&mut Delivery)) {
        let Some(mut d) = self.records.remove(&off) else {
            return;
        };
        self.idx.remove(off, &d);
        f(&mut d);
        self.idx.add(off, &d);
        self.records.insert(off, d);
    }

    fn push_latency(&mut self, ms: u64) {
        if self.latency_samples.len() >= MAX_LATENCY_SAMPLES {
            self.latency_samples.pop_front();
            self.counters.latency_samples_dropped += 1;
        }
        self.latency_samples.push_back(ms);
    }

    #[cfg(test)]
    /// Forgets every delivery record and starts over at `start` (AlterShareGroupOffsets, or a
    /// queue purge). Refused while messages are leased or being dead-lettered. Dedup entries
    /// stay (they belong to the publish side).
    pub(crate) fn reset(&mut self, start: Offset, now_ms: i64) -> Result<(), QueueError> {
        self.usable()?;
        self.clock(now_ms);
        if self.idx.leased > 0 || self.idx.dead_letter_pending > 0 {
            return Err(QueueError::Busy);
        }
        self.reset_state(start);
        Ok(())
    }

    /// [`QueuePartition::reset`] for AlterShareGroupOffsets on a share group without members:
    /// leases still held (records acquired by members that left, whose locks have not expired;
    /// an HTTP worker of the same group) go with the rest of the state, as Kafka discards a
    /// share partition's state; a late acknowledgement of one finds no record. Dead letters being
    /// written still refuse it (Busy): they must land first.
    pub(crate) fn reset_discarding_leases(&mut self, start: Offset, now_ms: i64) -> Result<(), QueueError> {
        self.usable()?;
        self.clock(now_ms);
        if self.idx.dead_letter_pending > 0 {
            return Err(QueueError::Busy);
        }
        self.reset_state(start);
        Ok(())
    }

    fn reset_state(&mut self, start: Offset) {
        self.records.clear();
        self.by_id.clear();
        self.dead_letter_retry.clear();
        self.start = start;
        self.loaded_end = start;
        self.log_end = self.log_end.max(start);
        self.rebuild_index();
        self.start_dirty = false;
        self.emit(StateRecord::Reset { start });
    }

    // ----- observation -----------------------------------------------------------------------

    #[cfg(test)]
    /// The delivery record at `offset`, if the engine holds one.
    pub(crate) fn inspect(&self, offset: Offset) -> Option<DeliveryView> {
        let d = self.records.get(&offset)?;
        Some(DeliveryView {
            offset,
            id: d.id,
            key: d.key,
            enqueued_at_ms: d.enqueued_at,
            attempts: d.attempts,
            generation: d.generation,
            first_delivery_ms: d.first_delivery,
            last_delivery_ms: d.last_delivery,
            last_reason: d.last_reason.clone(),
            state: d.state.clone(),
        })
    }

    #[cfg(test)]
    /// Where the message with `id` currently lives in this partition.
    pub(crate) fn locate(&self, id: MessageId) -> Option<Offset> {
        let off = self.resolve(&MessageRef::Id(id)).ok()?;
        match self.records.get(&off) {
            Some(d) if d.id == id => Some(off),
            Some(_) => None,
            None => (off < self.log_end).then_some(off),
        }
    }

    /// Gauges and counters for the caller to publish.
    pub(crate) fn metrics(&self) -> PartitionMetrics {
        let oldest = self
            .records
            .values()
            .filter(|d| !d.is_done())
            .map(|d| d.enqueued_at)
            .min();
        PartitionMetrics {
            available: self.idx.ready.len() as u64 + (self.log_end.0 - self.loaded_end.0).max(0) as u64,
            leased: self.idx.leased as u64,
            delayed: self.idx.delayed as u64,
            dead_letter_pending: self.idx.dead_letter_pending as u64,
            oldest_unacked_age_ms: oldest.map(|t| self.now.saturating_sub(t).max(0) as u64),
            start: self.start,
            loaded_end: self.loaded_end,
            log_end: self.log_end,
            detached: self.detached as u64,
            dedup_entries: self.dedup.len() as u64,
            consumers: self.idx.consumers.len() as u64,
            counters: self.counters,
        }
    }

    /// Lease-to-ack latencies (ms) since the last call, at most `MAX_LATENCY_SAMPLES`.
    pub(crate) fn take_latency_samples(&mut self) -> Vec<u64> {
        self.latency_samples.drain(..).collect()
    }

    #[cfg(test)]
    /// Checks every derived structure against the records (tests and debug tooling; O(state)).
    pub(crate) fn check_invariants(&self) -> Result<(), String> {
        macro_rules! ensure {
            ($c:expr, $($a:tt)*) => { if !$c { return Err(format!($($a)*)); } };
        }
        ensure!(
            self.start <= self.loaded_end && self.loaded_end <= self.log_end,
            "start {:?} <= loaded_end {:?} <= log_end {:?}",
            self.start,
            self.loaded_end,
            self.log_end
        );
        ensure!(
            self.recent_acks.len() <= REMEMBERED_ACKS,
            "{} remembered acks",
            self.recent_acks.len()
        );
        let mut expect = Index::new(&self.config);
        let mut detached = 0;
        for (off, d) in &self.records {
            expect.add(*off, d);
            if *off < self.start {
                detached += 1;
                ensure!(!d.is_done(), "done record {off:?} below the start");
            }
            ensure!(
                d.generation.0 < self.gen_next,
                "generation {:?} not below next {}",
                d.generation,
                self.gen_next
            );
            if let DeliveryState::Leased { .. } = d.state {
                ensure!(
                    d.attempts >= 1 && d.generation.0 >= 1,
                    "leased {off:?} without attempt/generation"
                );
            }
        }
        ensure!(
            detached == self.detached,
            "detached {} != {}",
            self.detached,
            detached
        );
        ensure!(expect.ready == self.idx.ready, "ready set differs");
        ensure!(expect.expiries == self.idx.expiries, "expiry index differs");
        ensure!(expect.leased == self.idx.leased, "leased count differs");
        ensure!(expect.consumers == self.idx.consumers, "consumer counts differ");
        ensure!(expect.delayed == self.idx.delayed, "delayed count differs");
        ensure!(
            self.idx.delays.len() >= self.idx.delayed,
            "delay index lost entries"
        );
        ensure!(
            expect.dead_letter_pending == self.idx.dead_letter_pending,
            "dead-letter count differs"
        );
        ensure!(expect.keys.len() == self.idx.keys.len(), "key index differs");
        for (k, ks) in &expect.keys {
            let got = self.idx.keys.get(k).ok_or("key missing")?;
            ensure!(
                got.pending == ks.pending && got.busy == ks.busy,
                "key {k:?} differs"
            );
            let leased = ks
                .pending
                .iter()
                .filter(|o| {
                    matches!(
                        self.records.get(o).map(|d| &d.state),
                        Some(DeliveryState::Leased { .. })
                    )
                })
                .count();
            ensure!(leased <= 1, "key {k:?} has {leased} leased messages");
        }
        if let Some((off, d)) = self.records.range(self.start..self.loaded_end).next() {
            ensure!(
                !d.is_done(),
                "the start {:?} stops before done message {off:?}",
                self.start
            );
        }
        for (id, off) in &self.by_id {
            ensure!(
                self.records.get(off).is_some_and(|d| d.id == *id),
                "by_id {id:?} -> {off:?} dangling"
            );
        }
        ensure!(self.gen_durable <= self.gen_reserved, "generation reservations");
        ensure!(
            self.gen_next <= self.gen_reserved.saturating_add(1),
            "generation {} beyond reservation {}",
            self.gen_next,
            self.gen_reserved
        );
        Ok(())
    }
}

fn check_consumer(c: &ConsumerId) -> Result<(), QueueError> {
    if c.0.is_empty() || c.0.len() > MAX_CONSUMER_ID_BYTES {
        return Err(QueueError::BadConsumerId {
            max: MAX_CONSUMER_ID_BYTES,
        });
    }
    Ok(())
}
