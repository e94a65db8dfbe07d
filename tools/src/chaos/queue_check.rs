//! The queue recorder's checker: a pure function of what the HTTP clients of a queue run saw
//! ([`QueueHistory`]) and what the dead-letter topic holds afterwards ([`DeadLetter`]).
//!
//! Every message of the run is published with a dedup token naming its index in the run's
//! [`MessagePlan`], and its payload names that index too, so a lease says which message it is
//! without the checker trusting the broker's ids. The verdict counts:
//!
//! - **lost**: a message whose publish was answered, not poison, and never acknowledged (no
//!   `200` to an ack of it, nor `409 already_done` to the retry of an ack whose answer was
//!   lost); or poison and absent from the dead-letter topic;
//! - **delivered after its ack**: a lease of a message with a higher generation than one that
//!   was acknowledged, or sent after that acknowledgement was answered (a new leader that lost
//!   the state would hand it out again with a fresh generation);
//! - **generation regressions**: a lease sent after another lease of the same message was
//!   answered, with a generation not above it;
//! - **stale settles accepted**: a settle answered `200` for a generation older than a lease of
//!   the same message answered before the settle was sent, and any answer but `409
//!   stale_generation` to the late ack of a deliberately abandoned lease, sent by the holder of
//!   the message's next lease;
//! - **valid leases refused**: a settle of the lease a worker holds, sent well before the lease
//!   expires, refused with `409` or `404` (the lease did not survive the fail-over);
//! - **early deliveries**: a delayed message leased before its delay was over (broker clock);
//! - **dedup failures**: two publishes of one index answered with different ids, or a lease of
//!   an index under an id its publishes were not answered with (a duplicate append);
//! - **unexpected dead letters**: a message that was not poison found in the dead-letter topic,
//!   or a poison message dead-lettered for another cause than the one the worker gave;
//! - **foreign**: a leased payload that is not the run's.

use std::collections::{BTreeMap, HashMap, HashSet};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use super::checker::{Micros, PartitionNo};

/// Examples of each kind of violation kept verbatim.
pub const MAX_EXAMPLES: usize = 8;
/// How far before its lease's expiry (by the worker's wall clock against the broker's) a settle
/// must be sent for a refusal to count as a lost lease: the clocks are one machine's, the
/// margin covers the request's own transit.
pub const VALID_LEASE_MARGIN_MS: i64 = 500;

/// What a message of the run is and what the workers do with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// Acknowledged on its first delivery.
    Plain,
    /// Published with a delay (ms), acknowledged on its first delivery.
    Delayed(u64),
    /// Nacked (with a short delay) on its first delivery, acknowledged on the next.
    Flaky,
    /// Nacked on every delivery until the queue dead-letters it (`max-attempts`).
    PoisonNack,
    /// Rejected on its first delivery (`rejected`).
    PoisonReject,
    /// Its first lease is abandoned: not settled, left to expire; the worker that leases it
    /// again acks that old generation (which must be refused `409 stale_generation`), then
    /// acknowledges its own.
    Abandon,
}

impl Kind {
    pub fn is_poison(self) -> bool {
        matches!(self, Kind::PoisonNack | Kind::PoisonReject)
    }

    /// The `strand-dlq-cause` a poison message must be dead-lettered with.
    pub fn dead_letter_cause(self) -> Option<&'static str> {
        match self {
            Kind::PoisonNack => Some("max-attempts"),
            Kind::PoisonReject => Some("rejected"),
            _ => None,
        }
    }

    pub fn delay_ms(self) -> u64 {
        match self {
            Kind::Delayed(ms) => ms,
            _ => 0,
        }
    }
}

/// How many of every 1,000 messages are of each kind (the rest are [`Kind::Plain`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Mix {
    pub delayed: u32,
    pub flaky: u32,
    pub poison_nack: u32,
    pub poison_reject: u32,
    pub abandon: u32,
    /// Delays are drawn from this range, ms (inclusive).
    pub delay_ms: (u64, u64),
}

impl Default for Mix {
    fn default() -> Self {
        Mix {
            delayed: 50,
            flaky: 80,
            poison_nack: 10,
            poison_reject: 10,
            abandon: 10,
            delay_ms: (500, 3000),
        }
    }
}

/// The kind of every message of a run, by index: a pure function of the seed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessagePlan {
    pub kinds: Vec<Kind>,
}

impl MessagePlan {
    pub fn new(seed: u64, messages: u64, mix: Mix) -> Self {
        assert!(
            mix.delayed + mix.flaky + mix.poison_nack + mix.poison_reject + mix.abandon <= 1000,
            "a mix is per 1,000 messages"
        );
        assert!(mix.delay_ms.0 <= mix.delay_ms.1, "empty delay range");
        // Another stream than the fault schedule's, so that the two do not move together.
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x71e3_5a6d_0c2b_94f1);
        let kinds = (0..messages)
            .map(|_| {
                let mut r = rng.gen_range(0..1000u32);
                let mut take = |n: u32| {
                    let hit = r < n;
                    r = r.saturating_sub(n);
                    hit
                };
                if take(mix.delayed) {
                    Kind::Delayed(rng.gen_range(mix.delay_ms.0..=mix.delay_ms.1))
                } else if take(mix.flaky) {
                    Kind::Flaky
                } else if take(mix.poison_nack) {
                    Kind::PoisonNack
                } else if take(mix.poison_reject) {
                    Kind::PoisonReject
                } else if take(mix.abandon) {
                    Kind::Abandon
                } else {
                    Kind::Plain
                }
            })
            .collect();
        MessagePlan { kinds }
    }

    pub fn kind(&self, index: u64) -> Option<Kind> {
        usize::try_from(index)
            .ok()
            .and_then(|i| self.kinds.get(i))
            .copied()
    }
}

const PAYLOAD_PREFIX: &str = "strand-chaos-queue ";

/// The payload of message `index` of run `run`: `strand-chaos-queue <run> <index>;` then `.` up
/// to `bytes` (never shorter than the prefix).
pub fn encode_payload(run: u64, index: u64, bytes: usize) -> String {
    let mut s = format!("{PAYLOAD_PREFIX}{run:x} {index};");
    while s.len() < bytes {
        s.push('.');
    }
    s
}

/// The index a payload of run `run` names, or `None` for anything else.
pub fn decode_payload(run: u64, payload: &str) -> Option<u64> {
    let rest = payload.strip_prefix(PAYLOAD_PREFIX)?;
    let (head, _) = rest.split_once(';')?;
    let (r, index) = head.split_once(' ')?;
    (u64::from_str_radix(r, 16).ok()? == run).then_some(())?;
    index.parse().ok()
}

/// A publish answered `200` (one entry per message of the batch).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PublishOp {
    pub index: u64,
    pub id: String,
    pub partition: PartitionNo,
    pub duplicate: bool,
    pub sent: Micros,
    pub answered: Micros,
}

/// A message in a lease answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LeaseOp {
    pub id: String,
    /// What the payload names (`None`: not the run's).
    pub index: Option<u64>,
    pub generation: u64,
    pub attempt: u32,
    pub partition: PartitionNo,
    pub sent: Micros,
    pub answered: Micros,
    /// Broker clock, ms since the epoch.
    pub published_at_ms: i64,
    pub lease_expires_at_ms: i64,
    /// The lease length asked for: the lease began at `lease_expires_at_ms` minus this.
    pub visibility_timeout_ms: u64,
}

impl LeaseOp {
    /// When the broker leased it (its clock).
    pub fn leased_at_ms(&self) -> i64 {
        self.lease_expires_at_ms - self.visibility_timeout_ms as i64
    }
}

/// What a settle asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SettleAction {
    Ack,
    Nack,
    Reject,
}

impl SettleAction {
    pub fn as_str(self) -> &'static str {
        match self {
            SettleAction::Ack => "ack",
            SettleAction::Nack => "nack",
            SettleAction::Reject => "reject",
        }
    }
}

/// How a settle ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SettleResult {
    /// `200` with this state (`acknowledged`, `delayed`, `available`, `dead_lettered`).
    Settled { state: String },
    /// An HTTP refusal of the item (or of the whole request).
    Refused { status: u16, code: String },
    /// No answer (connection lost, timed out): it may or may not have been applied.
    Unknown,
}

/// One attempt to settle one message (a retried request is another attempt).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SettleOp {
    pub id: String,
    pub index: Option<u64>,
    pub generation: u64,
    pub action: SettleAction,
    /// The late ack of an abandoned lease, sent after that lease expired, by the holder of the
    /// message's next lease.
    pub late: bool,
    /// An earlier attempt of this settle got no answer or a `5xx`: it may have been applied, so
    /// a `409` to this one (`already_done`, or a retried nack's) proves nothing.
    pub retry: bool,
    pub partition: PartitionNo,
    pub sent: Micros,
    /// The worker's wall clock when it sent it, ms since the epoch.
    pub sent_wall_ms: i64,
    pub answered: Micros,
    /// When the lease named expires (broker clock).
    pub lease_expires_at_ms: i64,
    pub result: SettleResult,
}

/// Everything the clients saw.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct QueueHistory {
    pub publishes: Vec<PublishOp>,
    pub leases: Vec<LeaseOp>,
    pub settles: Vec<SettleOp>,
}

/// A record of the dead-letter topic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeadLetter {
    /// Its `strand-message-id` header (`None`: absent).
    pub message_id: Option<String>,
    pub cause: Option<String>,
    pub attempts: Option<u32>,
}

/// Sums over the run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct QueueTotals {
    pub planned: u64,
    /// Distinct messages whose publish was answered.
    pub published: u64,
    pub publish_answers: u64,
    pub leases: u64,
    pub settles: u64,
    /// Distinct messages acknowledged (`200` to an ack).
    pub acknowledged: u64,
    pub nacks_settled: u64,
    pub rejects_settled: u64,
    pub settles_unanswered: u64,
    /// Late acks of abandoned leases sent, and how they were refused (code → count).
    pub late_acks: u64,
    pub late_refusals: BTreeMap<String, u64>,
    /// Other settles refused (code → count).
    pub refusals: BTreeMap<String, u64>,
    /// Acks whose answer was lost, retried and refused `409 already_done` (counted as
    /// acknowledged).
    pub acks_confirmed_by_retry: u64,
    pub poison: u64,
    pub dead_letter_records: u64,
    /// Poison messages found more than once in the dead-letter topic (at-least-once appends).
    pub dead_lettered_twice: u64,
    /// Deliveries of a message after its first (nacks, expiries, abandoned leases).
    pub redeliveries: u64,
    /// Delayed messages leased, and how long after their due time (broker clock).
    pub delayed_leased: u64,
    pub delay_lateness_max_ms: Option<i64>,
    pub delay_lateness_p99_ms: Option<i64>,
}

/// The verdict.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct QueueVerdict {
    pub totals: QueueTotals,
    pub lost: u64,
    pub delivered_after_ack: u64,
    pub generation_regressions: u64,
    pub stale_settles_accepted: u64,
    pub valid_leases_refused: u64,
    pub early_deliveries: u64,
    pub dedup_failures: u64,
    pub unexpected_dead_letters: u64,
    pub foreign: u64,
    /// Up to [`MAX_EXAMPLES`] of each violation, verbatim.
    pub examples: BTreeMap<&'static str, Vec<String>>,
}

impl QueueVerdict {
    pub fn violations(&self) -> u64 {
        self.lost
            + self.delivered_after_ack
            + self.generation_regressions
            + self.stale_settles_accepted
            + self.valid_leases_refused
            + self.early_deliveries
            + self.dedup_failures
            + self.unexpected_dead_letters
            + self.foreign
    }

    fn note(&mut self, what: &'static str, example: String) {
        let v = self.examples.entry(what).or_default();
        if v.len() < MAX_EXAMPLES {
            v.push(example);
        }
    }
}

/// Checks `history` and the dead-letter topic's `dead_letters` against `plan`.
pub fn check(plan: &MessagePlan, history: &QueueHistory, dead_letters: &[DeadLetter]) -> QueueVerdict {
    let mut v = QueueVerdict::default();
    v.totals.planned = plan.kinds.len() as u64;
    v.totals.poison = plan.kinds.iter().filter(|k| k.is_poison()).count() as u64;
    v.totals.publish_answers = history.publishes.len() as u64;
    v.totals.leases = history.leases.len() as u64;
    v.totals.settles = history.settles.len() as u64;
    v.totals.dead_letter_records = dead_letters.len() as u64;

    // Publishes: one id per index.
    let mut id_of: HashMap<u64, &str> = HashMap::new();
    for p in &history.publishes {
        match id_of.get(&p.index) {
            Some(&id) if id != p.id => {
                v.dedup_failures += 1;
                v.note(
                    "dedup_failures",
                    format!("message {} published as {id} and as {}", p.index, p.id),
                );
            }
            Some(_) => {}
            None => {
                id_of.insert(p.index, &p.id);
            }
        }
    }
    v.totals.published = id_of.len() as u64;

    // Leases, by message id.
    let mut leases_of: HashMap<&str, Vec<&LeaseOp>> = HashMap::new();
    let mut lateness = Vec::new();
    for l in &history.leases {
        let Some(index) = l.index.filter(|i| plan.kind(*i).is_some()) else {
            v.foreign += 1;
            v.note(
                "foreign",
                format!("lease of {} with a payload not of this run", l.id),
            );
            continue;
        };
        if id_of.get(&index).is_some_and(|&id| id != l.id) {
            v.dedup_failures += 1;
            v.note(
                "dedup_failures",
                format!(
                    "message {index} leased as {} but published as {}",
                    l.id, id_of[&index]
                ),
            );
        }
        if l.attempt > 1 {
            v.totals.redeliveries += 1;
        }
        leases_of.entry(l.id.as_str()).or_default().push(l);
        if let Some(Kind::Delayed(delay_ms)) = plan.kind(index) {
            if l.attempt == 1 {
                v.totals.delayed_leased += 1;
                let due = l.published_at_ms + delay_ms as i64;
                let late = l.leased_at_ms() - due;
                if late < 0 {
                    v.early_deliveries += 1;
                    v.note(
                        "early_deliveries",
                        format!(
                            "message {index} ({}) leased {} ms before its delay of {delay_ms} ms was over",
                            l.id, -late
                        ),
                    );
                } else {
                    lateness.push(late);
                }
            }
        }
    }
    lateness.sort_unstable();
    v.totals.delay_lateness_max_ms = lateness.last().copied();
    v.totals.delay_lateness_p99_ms =
        (!lateness.is_empty()).then(|| lateness[(lateness.len() - 1) * 99 / 100]);

    for leases in leases_of.values_mut() {
        leases.sort_by_key(|l| (l.answered, l.generation));
        for (i, later) in leases.iter().enumerate() {
            if let Some(earlier) = leases[..i]
                .iter()
                .find(|e| e.answered < later.sent && e.generation >= later.generation)
            {
                v.generation_regressions += 1;
                v.note(
                    "generation_regressions",
                    format!(
                        "{} leased with generation {} after a lease with generation {} was answered",
                        later.id, later.generation, earlier.generation
                    ),
                );
            }
        }
    }

    // Settles.
    let mut acked: HashMap<&str, (u64, Micros)> = HashMap::new();
    let mut dead_lettered_by_worker: HashSet<&str> = HashSet::new();
    for s in &history.settles {
        let leases = leases_of.get(s.id.as_str()).map(Vec::as_slice).unwrap_or(&[]);
        let newer = leases
            .iter()
            .find(|l| l.answered < s.sent && l.generation > s.generation);
        match &s.result {
            SettleResult::Settled { state } => {
                match s.action {
                    SettleAction::Ack => {}
                    SettleAction::Nack => v.totals.nacks_settled += 1,
                    SettleAction::Reject => v.totals.rejects_settled += 1,
                }
                if state == "dead_lettered" {
                    dead_lettered_by_worker.insert(&s.id);
                }
                if s.late {
                    v.totals.late_acks += 1;
                    v.stale_settles_accepted += 1;
                    v.note(
                        "stale_settles_accepted",
                        format!(
                            "the late ack of {} generation {} (an abandoned lease, expired) answered 200",
                            s.id, s.generation
                        ),
                    );
                } else if let Some(l) = newer {
                    v.stale_settles_accepted += 1;
                    v.note(
                        "stale_settles_accepted",
                        format!(
                            "{} of {} generation {} answered 200 after generation {} was leased",
                            s.action.as_str(),
                            s.id,
                            s.generation,
                            l.generation
                        ),
                    );
                }
                if s.action == SettleAction::Ack && state == "acknowledged" {
                    let e = acked.entry(&s.id).or_insert((s.generation, s.answered));
                    e.0 = e.0.max(s.generation);
                    e.1 = e.1.min(s.answered);
                }
            }
            SettleResult::Refused { status, code } => {
                let key = format!("{status} {code}");
                // The retry of an ack whose answer was lost, refused as already done: the lost
                // attempt acknowledged it, and the partition no longer remembers that ack
                // (docs/http-api.md: the last 1,000 per partition). A message dead-lettered
                // instead would be in the dead-letter topic, which is checked below.
                if s.action == SettleAction::Ack
                    && s.retry
                    && !s.late
                    && *status == 409
                    && code == "already_done"
                {
                    v.totals.acks_confirmed_by_retry += 1;
                    let e = acked.entry(&s.id).or_insert((s.generation, s.answered));
                    e.0 = e.0.max(s.generation);
                    e.1 = e.1.min(s.answered);
                }
                if s.late {
                    v.totals.late_acks += 1;
                    *v.totals.late_refusals.entry(key).or_default() += 1;
                    // A 5xx is retried (another node, once the partition has a leader); a retry
                    // of one that may have been applied is not judged.
                    if *status < 500 && !(*status == 409 && code == "stale_generation") && !s.retry {
                        v.stale_settles_accepted += 1;
                        v.note(
                            "stale_settles_accepted",
                            format!(
                                "the late ack of {} generation {} was answered {status} {code}, not 409 stale_generation",
                                s.id, s.generation
                            ),
                        );
                    }
                    continue;
                }
                *v.totals.refusals.entry(key).or_default() += 1;
                let in_time = s.sent_wall_ms + VALID_LEASE_MARGIN_MS < s.lease_expires_at_ms;
                if (*status == 409 || *status == 404) && in_time && newer.is_none() && !s.retry {
                    v.valid_leases_refused += 1;
                    v.note(
                        "valid_leases_refused",
                        format!(
                            "{} of {} generation {} sent {} ms before its lease expired: {status} {code}",
                            s.action.as_str(),
                            s.id,
                            s.generation,
                            s.lease_expires_at_ms - s.sent_wall_ms
                        ),
                    );
                }
            }
            SettleResult::Unknown => {
                v.totals.settles_unanswered += 1;
                if s.late {
                    v.totals.late_acks += 1;
                }
            }
        }
    }
    v.totals.acknowledged = acked.len() as u64;

    for (id, (generation, at)) in &acked {
        let Some(leases) = leases_of.get(id) else {
            continue;
        };
        if let Some(l) = leases.iter().find(|l| l.generation > *generation || l.sent > *at) {
            v.delivered_after_ack += 1;
            v.note(
                "delivered_after_ack",
                format!(
                    "{id} acknowledged at generation {generation} ({:.0} ms) and leased again: generation {} attempt {} at {:.0} ms",
                    at.as_ms(),
                    l.generation,
                    l.attempt,
                    l.answered.as_ms()
                ),
            );
        }
    }

    // Dead letters.
    let mut in_dlq: HashMap<&str, Vec<&DeadLetter>> = HashMap::new();
    for d in dead_letters {
        match &d.message_id {
            Some(id) => in_dlq.entry(id.as_str()).or_default().push(d),
            None => {
                v.foreign += 1;
                v.note("foreign", "a dead letter without strand-message-id".into());
            }
        }
    }
    let index_of: HashMap<&str, u64> = id_of.iter().map(|(i, id)| (*id, *i)).collect();
    for (id, copies) in &in_dlq {
        let Some(kind) = index_of.get(id).and_then(|i| plan.kind(*i)) else {
            v.foreign += 1;
            v.note("foreign", format!("dead letter {id} is no message of this run"));
            continue;
        };
        if copies.len() > 1 {
            v.totals.dead_lettered_twice += 1;
        }
        let expected = kind.dead_letter_cause();
        for d in copies {
            if expected.is_none() || d.cause.as_deref() != expected {
                v.unexpected_dead_letters += 1;
                v.note(
                    "unexpected_dead_letters",
                    format!(
                        "{id} ({kind:?}) dead-lettered with cause {:?} after {:?} attempts",
                        d.cause, d.attempts
                    ),
                );
                break;
            }
        }
    }

    // Lost: every published message must be acknowledged, or (poison) dead-lettered.
    let mut lost: Vec<(u64, &str, Kind)> = Vec::new();
    for (&index, &id) in &id_of {
        let Some(kind) = plan.kind(index) else {
            continue;
        };
        let done = if kind.is_poison() {
            in_dlq.contains_key(id)
        } else {
            acked.contains_key(id)
        };
        if !done {
            lost.push((index, id, kind));
        }
    }
    lost.sort_unstable_by_key(|(index, _, _)| *index);
    v.lost = lost.len() as u64;
    for (index, id, kind) in lost {
        let leases = leases_of.get(id).map_or(0, Vec::len);
        let worker = if dead_lettered_by_worker.contains(id) {
            ", the worker was told it was dead-lettered"
        } else {
            ""
        };
        v.note(
            "lost",
            format!("message {index} ({kind:?}, {id}): leased {leases} times{worker}"),
        );
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(kinds: &[Kind]) -> MessagePlan {
        MessagePlan {
            kinds: kinds.to_vec(),
        }
    }

    fn publish(index: u64, id: &str, at: u64) -> PublishOp {
        PublishOp {
            index,
            id: id.into(),
            partition: PartitionNo(0),
            duplicate: false,
            sent: Micros(at),
            answered: Micros(at + 1),
        }
    }

    fn lease(index: u64, id: &str, generation: u64, attempt: u32, at: u64) -> LeaseOp {
        LeaseOp {
            id: id.into(),
            index: Some(index),
            generation,
            attempt,
            partition: PartitionNo(0),
            sent: Micros(at),
            answered: Micros(at + 10),
            published_at_ms: 1_000,
            lease_expires_at_ms: 1_000 + at as i64 / 1000 + 10_000,
            visibility_timeout_ms: 10_000,
        }
    }

    fn settle(id: &str, generation: u64, action: SettleAction, at: u64, result: SettleResult) -> SettleOp {
        SettleOp {
            id: id.into(),
            index: None,
            generation,
            action,
            late: false,
            retry: false,
            partition: PartitionNo(0),
            sent: Micros(at),
            sent_wall_ms: 1_000 + at as i64 / 1000,
            answered: Micros(at + 10),
            lease_expires_at_ms: 1_000 + at as i64 / 1000 + 9_000,
            result,
        }
    }

    fn ok(state: &str) -> SettleResult {
        SettleResult::Settled { state: state.into() }
    }

    fn refused(code: &str) -> SettleResult {
        SettleResult::Refused {
            status: 409,
            code: code.into(),
        }
    }

    #[test]
    fn payloads_name_their_run_and_index() {
        let p = encode_payload(0xabc, 42, 64);
        assert_eq!(p.len(), 64);
        assert_eq!(decode_payload(0xabc, &p), Some(42));
        assert_eq!(decode_payload(0xabd, &p), None);
        assert_eq!(decode_payload(0xabc, "hello"), None);
        assert!(encode_payload(1, 123_456, 4).len() > 4);
    }

    #[test]
    fn a_plan_replays_from_its_seed_and_follows_the_mix() {
        let a = MessagePlan::new(3, 20_000, Mix::default());
        assert_eq!(a, MessagePlan::new(3, 20_000, Mix::default()));
        assert_ne!(a, MessagePlan::new(4, 20_000, Mix::default()));
        let count = |f: &dyn Fn(&Kind) -> bool| a.kinds.iter().filter(|k| f(k)).count();
        let delayed = count(&|k| matches!(k, Kind::Delayed(_)));
        assert!((800..1200).contains(&delayed), "{delayed}");
        assert!((100..300).contains(&count(&|k| *k == Kind::PoisonReject)));
        assert!(a
            .kinds
            .iter()
            .all(|k| !matches!(k, Kind::Delayed(ms) if !(500..=3000).contains(ms))));
    }

    #[test]
    fn a_clean_run_passes() {
        let p = plan(&[Kind::Plain, Kind::Flaky, Kind::PoisonReject, Kind::Abandon]);
        let h = QueueHistory {
            publishes: vec![
                publish(0, "a", 0),
                publish(1, "b", 0),
                publish(2, "c", 0),
                publish(3, "d", 0),
            ],
            leases: vec![
                lease(0, "a", 1, 1, 100),
                lease(1, "b", 1, 1, 100),
                lease(2, "c", 1, 1, 100),
                lease(3, "d", 1, 1, 100),
                lease(1, "b", 2, 2, 500),
                lease(3, "d", 2, 2, 20_000),
            ],
            settles: vec![
                settle("a", 1, SettleAction::Ack, 200, ok("acknowledged")),
                settle("b", 1, SettleAction::Nack, 200, ok("delayed")),
                settle("c", 1, SettleAction::Reject, 200, ok("dead_lettered")),
                settle("b", 2, SettleAction::Ack, 600, ok("acknowledged")),
                // A retried ack answered again.
                settle("b", 2, SettleAction::Ack, 700, ok("acknowledged")),
                // An ack without an answer, retried after the partition forgot it.
                SettleOp {
                    result: SettleResult::Unknown,
                    ..settle("a2", 1, SettleAction::Ack, 200, ok("-"))
                },
                SettleOp {
                    retry: true,
                    ..settle("a2", 1, SettleAction::Ack, 3_000, refused("already_done"))
                },
                settle("d", 2, SettleAction::Ack, 20_100, ok("acknowledged")),
                SettleOp {
                    late: true,
                    ..settle("d", 1, SettleAction::Ack, 21_000, refused("stale_generation"))
                },
            ],
        };
        let dlq = [DeadLetter {
            message_id: Some("c".into()),
            cause: Some("rejected".into()),
            attempts: Some(1),
        }];
        let v = check(&p, &h, &dlq);
        assert_eq!(v.violations(), 0, "{v:#?}");
        assert_eq!(v.totals.acknowledged, 4);
        assert_eq!(v.totals.acks_confirmed_by_retry, 1);
        assert_eq!(v.totals.late_acks, 1);
        assert_eq!(v.totals.late_refusals["409 stale_generation"], 1);
        assert_eq!(v.totals.redeliveries, 2);
    }

    #[test]
    fn every_violation_is_counted() {
        let p = plan(&[
            Kind::Plain,
            Kind::Plain,
            Kind::PoisonNack,
            Kind::Delayed(1000),
            Kind::Abandon,
            Kind::Plain,
        ]);
        let mut early = lease(3, "d", 1, 1, 100);
        early.lease_expires_at_ms = early.published_at_ms + 500 + 10_000;
        let h = QueueHistory {
            publishes: vec![
                publish(0, "a", 0),
                publish(1, "b", 0),
                publish(2, "c", 0),
                publish(3, "d", 0),
                publish(4, "e", 0),
                publish(5, "f", 0),
                // The retry of index 5 appended a second copy.
                publish(5, "f2", 50),
            ],
            leases: vec![
                lease(0, "a", 1, 1, 100),
                // Acknowledged, then leased again by a leader that forgot it (generation 1).
                lease(0, "a", 1, 1, 1_000),
                lease(1, "b", 1, 1, 100),
                early,
                lease(4, "e", 1, 1, 100),
                lease(4, "e", 2, 2, 20_000),
                lease(9, "zz", 1, 1, 100),
            ],
            settles: vec![
                settle("a", 1, SettleAction::Ack, 200, ok("acknowledged")),
                // A valid lease refused: sent 9 s before its expiry.
                settle("b", 1, SettleAction::Ack, 200, refused("not_leased")),
                settle("d", 1, SettleAction::Ack, 200, ok("acknowledged")),
                settle("e", 2, SettleAction::Ack, 20_100, ok("acknowledged")),
                SettleOp {
                    late: true,
                    ..settle("e", 1, SettleAction::Ack, 21_000, ok("acknowledged"))
                },
            ],
        };
        // "c" (poison) is missing from the DLQ, "d" is there though it is no poison.
        let dlq = [DeadLetter {
            message_id: Some("d".into()),
            cause: Some("max-attempts".into()),
            attempts: Some(5),
        }];
        let v = check(&p, &h, &dlq);
        assert_eq!(v.delivered_after_ack, 1, "{v:#?}");
        assert_eq!(v.generation_regressions, 1, "{v:#?}");
        assert_eq!(v.valid_leases_refused, 1, "{v:#?}");
        assert_eq!(v.stale_settles_accepted, 1, "{v:#?}");
        assert_eq!(v.early_deliveries, 1, "{v:#?}");
        assert_eq!(v.dedup_failures, 1, "{v:#?}");
        assert_eq!(v.unexpected_dead_letters, 1, "{v:#?}");
        assert_eq!(v.foreign, 1, "{v:#?}");
        // b (never acknowledged), c (poison not dead-lettered), f (never leased).
        assert_eq!(v.lost, 3, "{v:#?}");
        assert!(v.examples["lost"][0].contains("message 1"));
    }

    #[test]
    fn an_ack_that_became_stale_before_it_was_sent_is_no_lost_lease() {
        let p = plan(&[Kind::Plain]);
        let mut late = settle("a", 1, SettleAction::Ack, 200, refused("stale_generation"));
        // Sent after its lease expired (the worker retried through a fail-over for too long).
        late.sent_wall_ms = late.lease_expires_at_ms + 10;
        let h = QueueHistory {
            publishes: vec![publish(0, "a", 0)],
            leases: vec![lease(0, "a", 1, 1, 100), lease(0, "a", 2, 2, 15_000)],
            settles: vec![
                late,
                settle("a", 2, SettleAction::Ack, 15_100, ok("acknowledged")),
            ],
        };
        let v = check(&p, &h, &[]);
        assert_eq!(v.violations(), 0, "{v:#?}");
        assert_eq!(v.totals.refusals["409 stale_generation"], 1);
    }
}
