//! State records: the durable form of the delivery state, written to the queue's state log.
//!
//! Each record is self-describing: `version: u8 = 1`, `kind: u8`, then fixed-width big-endian
//! fields; byte strings are `u16` length + bytes; optional fields are a `0`/`1` byte followed by
//! the value. A decoder refuses an unknown version or kind, a short or over-long record, a
//! length above its field's limit, and invalid UTF-8 — it never panics.
//!
//! Integrity: there is no per-record CRC. Records are meant to be stored as the values of Kafka
//! records in a record batch of an internal state log, one [`Action::Persist`] per batch, so the
//! batch's CRC-32C (checked by storage on recovery and by the read path) covers them, and a torn
//! batch is dropped whole. If the wiring stores them in a container without a checksum, it must
//! add one.
//!
//! Every record is *absolute* ("offset X is now in state S", "the start is now N"), never a
//! delta, so replaying a record twice, or a snapshot on top of the log it summarizes, yields the
//! same state. Record kinds (`kind` byte):
//!
//! | kind | record | fields |
//! |---|---|---|
//! | 1 | `Reset` | `start: i64` — forget every delivery record; the window starts at `start` |
//! | 2 | `Start` | `start: i64` — every offset below is done, except delivery records below it |
//! | 3 | `Generation` | `reserved_up_to: u64` — generations up to here may have been handed out |
//! | 4 | `Delivery` | `offset: i64, id: (i32, i64), key: opt u64, enqueued_at: i64, attempts: u32, generation: u64, first_delivery: opt i64, last_delivery: opt i64, state, last_reason: opt str` |
//! | 5 | `Done` | `offset: i64, generation: u64, outcome: u8` (1 acked, 2 archived) |
//! | 6 | `Dedup` | `token: bytes, id: (i32, i64), offset: i64, expires_at: i64` |
//!
//! A delivery `state` is a tag byte: 0 available; 1 delayed `not_before: i64`; 2 leased
//! `owner: str, expiry: i64, leased_at: i64`; 3 dead-letter pending `cause: u8` (1 max
//! attempts, 2 rejected).
//!
//! [`Action::Persist`]: super::Action::Persist

use std::fmt;

use strand_protocol::types::{Offset, PartitionId};

use super::config::{MAX_CONSUMER_ID_BYTES, MAX_DEDUP_TOKEN_BYTES, MAX_REASON_BYTES};
use super::dead_letter::DeadLetterCause;
use super::types::{ConsumerId, Generation, KeyHash, MessageId};

/// The record format version written by this code.
pub(crate) const RECORD_VERSION: u8 = 1;

const KIND_RESET: u8 = 1;
const KIND_START: u8 = 2;
const KIND_GENERATION: u8 = 3;
const KIND_DELIVERY: u8 = 4;
const KIND_DONE: u8 = 5;
const KIND_DEDUP: u8 = 6;

/// One durable fact about a queue partition's delivery state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StateRecord {
    Reset {
        start: Offset,
    },
    Start {
        start: Offset,
    },
    Generation {
        reserved_up_to: Generation,
    },
    Delivery(DeliveryRecord),
    Done {
        offset: Offset,
        generation: Generation,
        outcome: DoneOutcome,
    },
    Dedup(DedupRecord),
}

/// The full delivery state of one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DeliveryRecord {
    pub(crate) offset: Offset,
    pub(crate) id: MessageId,
    pub(crate) key: Option<KeyHash>,
    pub(crate) enqueued_at_ms: i64,
    pub(crate) attempts: u32,
    pub(crate) generation: Generation,
    pub(crate) first_delivery_ms: Option<i64>,
    pub(crate) last_delivery_ms: Option<i64>,
    pub(crate) state: RecordedState,
    pub(crate) last_reason: Option<String>,
}

/// The non-terminal states a delivery record can carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RecordedState {
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
}

/// How a message ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DoneOutcome {
    Acked,
    /// Dead-lettered (append confirmed) or archived.
    Archived,
}

/// A publish dedup entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DedupRecord {
    pub(crate) token: Vec<u8>,
    pub(crate) id: MessageId,
    pub(crate) offset: Offset,
    pub(crate) expires_at_ms: i64,
}

/// Why a record does not decode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DecodeError {
    Truncated,
    TrailingBytes,
    UnknownVersion(u8),
    UnknownKind(u8),
    Invalid(&'static str),
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Truncated => f.write_str("record is truncated"),
            DecodeError::TrailingBytes => f.write_str("record has trailing bytes"),
            DecodeError::UnknownVersion(v) => write!(f, "unknown record version {v}"),
            DecodeError::UnknownKind(k) => write!(f, "unknown record kind {k}"),
            DecodeError::Invalid(what) => write!(f, "invalid record: {what}"),
        }
    }
}

impl StateRecord {
    /// Appends the encoded record to `out`.
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        out.push(RECORD_VERSION);
        match self {
            StateRecord::Reset { start } => {
                out.push(KIND_RESET);
                put_i64(out, start.0);
            }
            StateRecord::Start { start } => {
                out.push(KIND_START);
                put_i64(out, start.0);
            }
            StateRecord::Generation { reserved_up_to } => {
                out.push(KIND_GENERATION);
                put_u64(out, reserved_up_to.0);
            }
            StateRecord::Delivery(d) => {
                out.push(KIND_DELIVERY);
                put_i64(out, d.offset.0);
                put_id(out, d.id);
                match d.key {
                    Some(k) => {
                        out.push(1);
                        put_u64(out, k.0);
                    }
                    None => out.push(0),
                }
                put_i64(out, d.enqueued_at_ms);
                out.extend_from_slice(&d.attempts.to_be_bytes());
                put_u64(out, d.generation.0);
                put_opt_i64(out, d.first_delivery_ms);
                put_opt_i64(out, d.last_delivery_ms);
                match &d.state {
                    RecordedState::Available => out.push(0),
                    RecordedState::Delayed { not_before_ms } => {
                        out.push(1);
                        put_i64(out, *not_before_ms);
                    }
                    RecordedState::Leased {
                        owner,
                        expiry_ms,
                        leased_at_ms,
                    } => {
                        out.push(2);
                        put_bytes(out, owner.as_str().as_bytes());
                        put_i64(out, *expiry_ms);
                        put_i64(out, *leased_at_ms);
                    }
                    RecordedState::DeadLetterPending { cause } => {
                        out.push(3);
                        out.push(cause.code());
                    }
                }
                match &d.last_reason {
                    Some(r) => {
                        out.push(1);
                        put_bytes(out, r.as_bytes());
                    }
                    None => out.push(0),
                }
            }
            StateRecord::Done {
                offset,
                generation,
                outcome,
            } => {
                out.push(KIND_DONE);
                put_i64(out, offset.0);
                put_u64(out, generation.0);
                out.push(match outcome {
                    DoneOutcome::Acked => 1,
                    DoneOutcome::Archived => 2,
                });
            }
            StateRecord::Dedup(d) => {
                out.push(KIND_DEDUP);
                put_bytes(out, &d.token);
                put_id(out, d.id);
                put_i64(out, d.offset.0);
                put_i64(out, d.expires_at_ms);
            }
        }
    }

    pub(crate) fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        self.encode(&mut out);
        out
    }

    /// Decodes exactly one record occupying all of `bytes`.
    pub(crate) fn decode(bytes: &[u8]) -> Result<StateRecord, DecodeError> {
        let mut r = Reader { buf: bytes };
        let version = r.u8()?;
        if version != RECORD_VERSION {
            return Err(DecodeError::UnknownVersion(version));
        }
        let kind = r.u8()?;
        let rec = match kind {
            KIND_RESET => StateRecord::Reset { start: r.offset()? },
            KIND_START => StateRecord::Start { start: r.offset()? },
            KIND_GENERATION => StateRecord::Generation {
                reserved_up_to: Generation(r.u64()?),
            },
            KIND_DELIVERY => {
                let offset = r.offset()?;
                let id = r.id()?;
                let key = match r.flag()? {
                    true => Some(KeyHash(r.u64()?)),
                    false => None,
                };
                let enqueued_at_ms = r.i64()?;
                let attempts = r.u32()?;
                let generation = Generation(r.u64()?);
                let first_delivery_ms = r.opt_i64()?;
                let last_delivery_ms = r.opt_i64()?;
                let state = match r.u8()? {
                    0 => RecordedState::Available,
                    1 => RecordedState::Delayed {
                        not_before_ms: r.i64()?,
                    },
                    2 => {
                        let owner = r.string(MAX_CONSUMER_ID_BYTES)?;
                        if owner.is_empty() {
                            return Err(DecodeError::Invalid("empty lease owner"));
                        }
                        RecordedState::Leased {
                            owner: ConsumerId(owner),
                            expiry_ms: r.i64()?,
                            leased_at_ms: r.i64()?,
                        }
                    }
                    3 => RecordedState::DeadLetterPending {
                        cause: DeadLetterCause::from_code(r.u8()?)
                            .ok_or(DecodeError::Invalid("unknown dead-letter cause"))?,
                    },
                    _ => return Err(DecodeError::Invalid("unknown delivery state")),
                };
                let last_reason = match r.flag()? {
                    true => Some(r.string(MAX_REASON_BYTES)?),
                    false => None,
                };
                StateRecord::Delivery(DeliveryRecord {
                    offset,
                    id,
                    key,
                    enqueued_at_ms,
                    attempts,
                    generation,
                    first_delivery_ms,
                    last_delivery_ms,
                    state,
                    last_reason,
                })
            }
            KIND_DONE => {
                let offset = r.offset()?;
                let generation = Generation(r.u64()?);
                let outcome = match r.u8()? {
                    1 => DoneOutcome::Acked,
                    2 => DoneOutcome::Archived,
                    _ => return Err(DecodeError::Invalid("unknown done outcome")),
                };
                StateRecord::Done {
                    offset,
                    generation,
                    outcome,
                }
            }
            KIND_DEDUP => {
                let token = r.bytes(MAX_DEDUP_TOKEN_BYTES)?.to_vec();
                if token.is_empty() {
                    return Err(DecodeError::Invalid("empty dedup token"));
                }
                StateRecord::Dedup(DedupRecord {
                    token,
                    id: r.id()?,
                    offset: r.offset()?,
                    expires_at_ms: r.i64()?,
                })
            }
            k => return Err(DecodeError::UnknownKind(k)),
        };
        if !r.buf.is_empty() {
            return Err(DecodeError::TrailingBytes);
        }
        Ok(rec)
    }
}

fn put_i64(out: &mut Vec<u8>, v: i64) {
    out.extend_from_slice(&v.to_be_bytes());
}

fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_be_bytes());
}

fn put_opt_i64(out: &mut Vec<u8>, v: Option<i64>) {
    match v {
        Some(v) => {
            out.push(1);
            put_i64(out, v);
        }
        None => out.push(0),
    }
}

fn put_id(out: &mut Vec<u8>, id: MessageId) {
    out.extend_from_slice(&id.partition.0.to_be_bytes());
    put_i64(out, id.offset.0);
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    // Every byte string has a limit far below u16::MAX (checked where it enters the engine).
    debug_assert!(b.len() <= usize::from(u16::MAX));
    let len = u16::try_from(b.len()).unwrap_or(u16::MAX);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(b.get(..usize::from(len)).unwrap_or(b));
}

struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let (head, rest) = self.buf.split_first_chunk::<N>().ok_or(DecodeError::Truncated)?;
        self.buf = rest;
        Ok(*head)
    }

    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take::<1>()?[0])
    }

    fn flag(&mut self) -> Result<bool, DecodeError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(DecodeError::Invalid("flag byte is neither 0 nor 1")),
        }
    }

    fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_be_bytes(self.take()?))
    }

    fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_be_bytes(self.take()?))
    }

    fn i64(&mut self) -> Result<i64, DecodeError> {
        Ok(i64::from_be_bytes(self.take()?))
    }

    fn opt_i64(&mut self) -> Result<Option<i64>, DecodeError> {
        match self.flag()? {
            true => Ok(Some(self.i64()?)),
            false => Ok(None),
        }
    }

    fn offset(&mut self) -> Result<Offset, DecodeError> {
        let v = self.i64()?;
        if v < 0 {
            return Err(DecodeError::Invalid("negative offset"));
        }
        Ok(Offset(v))
    }

    fn id(&mut self) -> Result<MessageId, DecodeError> {
        let partition = i32::from_be_bytes(self.take()?);
        if partition < 0 {
            return Err(DecodeError::Invalid("negative partition"));
        }
        Ok(MessageId::new(PartitionId(partition), self.offset()?))
    }

    fn bytes(&mut self, max: usize) -> Result<&'a [u8], DecodeError> {
        let len = usize::from(u16::from_be_bytes(self.take()?));
        if len > max {
            return Err(DecodeError::Invalid("byte string longer than its limit"));
        }
        if self.buf.len() < len {
            return Err(DecodeError::Truncated);
        }
        let (head, rest) = self.buf.split_at(len);
        self.buf = rest;
        Ok(head)
    }

    fn string(&mut self, max: usize) -> Result<String, DecodeError> {
        let b = self.bytes(max)?;
        String::from_utf8(b.to_vec()).map_err(|_| DecodeError::Invalid("string is not UTF-8"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> Vec<StateRecord> {
        let id = MessageId::new(PartitionId(3), Offset(17));
        vec![
            StateRecord::Reset { start: Offset(0) },
            StateRecord::Start { start: Offset(42) },
            StateRecord::Generation {
                reserved_up_to: Generation(4096),
            },
            StateRecord::Delivery(DeliveryRecord {
                offset: Offset(17),
                id,
                key: Some(KeyHash(9)),
                enqueued_at_ms: 1_700_000_000_000,
                attempts: 2,
                generation: Generation(77),
                first_delivery_ms: Some(1),
                last_delivery_ms: Some(2),
                state: RecordedState::Leased {
                    owner: ConsumerId::new("worker-1"),
                    expiry_ms: 30_000,
                    leased_at_ms: 0,
                },
                last_reason: Some("boom".into()),
            }),
            StateRecord::Delivery(DeliveryRecord {
                offset: Offset(18),
                id: MessageId::new(PartitionId(3), Offset(18)),
                key: None,
                enqueued_at_ms: 5,
                attempts: 0,
                generation: Generation(0),
                first_delivery_ms: None,
                last_delivery_ms: None,
                state: RecordedState::Delayed { not_before_ms: 99 },
                last_reason: None,
            }),
            StateRecord::Delivery(DeliveryRecord {
                offset: Offset(19),
                id,
                key: None,
                enqueued_at_ms: 5,
                attempts: 5,
                generation: Generation(3),
                first_delivery_ms: None,
                last_delivery_ms: None,
                state: RecordedState::DeadLetterPending {
                    cause: DeadLetterCause::Rejected,
                },
                last_reason: None,
            }),
            StateRecord::Done {
                offset: Offset(17),
                generation: Generation(77),
                outcome: DoneOutcome::Acked,
            },
            StateRecord::Dedup(DedupRecord {
                token: b"order-1".to_vec(),
                id,
                offset: Offset(17),
                expires_at_ms: 300_000,
            }),
        ]
    }

    #[test]
    fn records_round_trip() {
        for rec in sample() {
            let bytes = rec.to_bytes();
            assert_eq!(StateRecord::decode(&bytes), Ok(rec.clone()), "{rec:?}");
        }
    }

    /// Byte snapshot: the format is persisted, so it must not drift silently.
    #[test]
    fn encoding_is_stable() {
        let hex = |r: &StateRecord| {
            r.to_bytes()
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        };
        let s = sample();
        assert_eq!(hex(&s[1]), "0102000000000000002a");
        assert_eq!(hex(&s[6]), "01050000000000000011000000000000004d01");
        assert_eq!(
            hex(&s[7]),
            "010600076f726465722d31000000030000000000000011000000000000001100000000000493e0"
        );
    }

    #[test]
    fn every_truncation_and_extension_is_refused() {
        for rec in sample() {
            let bytes = rec.to_bytes();
            for cut in 0..bytes.len() {
                assert!(
                    StateRecord::decode(&bytes[..cut]).is_err(),
                    "{rec:?} cut at {cut}"
                );
            }
            let mut longer = bytes.clone();
            longer.push(0);
            assert_eq!(StateRecord::decode(&longer), Err(DecodeError::TrailingBytes));
        }
        assert_eq!(StateRecord::decode(&[2, 1]), Err(DecodeError::UnknownVersion(2)));
        assert_eq!(StateRecord::decode(&[1, 99]), Err(DecodeError::UnknownKind(99)));
    }

    proptest! {
        #[test]
        fn hostile_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = StateRecord::decode(&bytes);
        }

        #[test]
        fn mutated_records_never_panic(idx in 0usize..8, pos in 0usize..200, val in any::<u8>()) {
            let mut bytes = sample()[idx].to_bytes();
            let p = pos % bytes.len();
            bytes[p] = val;
            if let Ok(rec) = StateRecord::decode(&bytes) {
                // Whatever decodes re-encodes to the same bytes.
                prop_assert_eq!(rec.to_bytes(), bytes);
            }
        }
    }
}
