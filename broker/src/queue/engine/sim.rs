//! Deterministic simulation of the engine: every run is a pure function of its seed.
//!
//! A seeded generator interleaves publishes (delayed, with dedup tokens, poison messages that
//! always fail), leases, acks, nacks, extends, rejects, retried acks, acks with stale leases,
//! clock jumps (lease expiries), state-log confirmations, dead-letter appends (confirmed,
//! failed, or left unconfirmed), window loads, consumers that die holding leases or release
//! them, snapshots, redrives of dead-lettered messages, and crashes. A crash drops the engine
//! and rebuilds it from the confirmed writes plus a random prefix of the unconfirmed ones (the
//! state log is written in order; an unconfirmed write may or may not have reached the disk),
//! then re-feeds the log as the caller does on start-up.
//!
//! An oracle follows every reply *in the order the engine received the requests* (replies are
//! released later than the decisions that produced them) and checks after every step:
//! - no message lost: every published copy is acked, dead-lettered, or still held by the engine
//!   (or in the log beyond the window);
//! - at most one valid lease per message; a lease is never granted while an earlier one is
//!   valid, and a valid lease is never refused;
//! - stale leases are refused;
//! - dead-letter only after `max_attempts` attempts or a reject, with the right context;
//! - attempt counts and generations never go backwards (generations also across crashes);
//! - an acked message is never delivered again, and an answered ack survives crashes;
//! - no message is leased before its not-before time (publish delay, answered nack delay);
//! - `ordering=key`: never two messages of one key leased at once, never one before an earlier
//!   message of its key is done;
//! - dedup: a token within its window always answers the first id, also across crashes;
//! - the engine's own index invariants (`check_invariants`).
//!
//! A final drain (no more faults) must finish every message: acked or dead-lettered.
//!
//! `STRAND_QUEUE_SIM_SEEDS=n` (default 300) seeds, `STRAND_QUEUE_SIM_STEPS=n` (default 700)
//! steps; a failure prints `STRAND_QUEUE_SIM_SEED=<seed>`, which replays that seed alone
//! (`STRAND_QUEUE_SIM_TRACE=1` prints every step).

use std::collections::{BTreeMap, HashMap, HashSet};

use strand_protocol::types::{Offset, PartitionId};

use super::tests::{Caller, LogEntry};
use super::*;
use crate::testkit::SplitMix64;

const P: PartitionId = PartitionId(3);
const CONSUMERS: usize = 4;
const KEYS: u8 = 4;

/// The crate's simulation generator, with ranges and odds.
struct Rng(SplitMix64);

impl Rng {
    /// A number below `n`; 0, drawing nothing, when `n` is 0.
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.0.below(n)
        }
    }

    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Pending,
    Acked,
    DeadLettered,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ValidLease {
    gen: u64,
    owner: usize,
    expiry: i64,
    attempt: u32,
}

/// The oracle's view of one copy of a message (one log offset).
#[derive(Debug, Clone)]
struct CopyView {
    id: MessageId,
    poison: bool,
    key: Option<u8>,
    status: Status,
    acked_gen: u64,
    /// Life in which the dead-letter copy was (last) appended.
    dl_life: u32,
    last_gen: u64,
    last_attempt: u32,
    valid: Option<ValidLease>,
    not_before: i64,
    reject_requested: bool,
    /// An ack was sent in this life and its outcome not yet processed.
    acks_in_flight: u32,
    ack_life: u32,
    /// A dead-letter confirmation was given to the engine in this life, not yet processed.
    dl_confirm_in_flight: bool,
    dl_appends: u32,
    ack_sent: bool,
    /// The generations acks of this copy named (any life).
    ack_gens: Vec<u64>,
    /// Whether `acked_gen` is known: not when a crash found the message acked and below the
    /// start (its ack durable, unanswered, the record forgotten); the engine's answer to a
    /// retried ack must then name one of `ack_gens`, and pins it.
    acked_gen_known: bool,
    /// Could have been in the delayed state (which alone lets the start pass a pending message).
    ever_delayed: bool,
}

impl CopyView {
    /// Counts an ack sent in `life` (those of an earlier life went with it).
    fn ack_sent_in(&mut self, life: u32, gen: u64) {
        if self.ack_life != life {
            self.acks_in_flight = 0;
        }
        self.ack_life = life;
        self.acks_in_flight += 1;
        self.ack_sent = true;
        if !self.ack_gens.contains(&gen) {
            self.ack_gens.push(gen);
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Held {
    offset: i64,
    id: MessageId,
    gen: u64,
    attempt: u32,
    expiry: i64,
}

impl Held {
    /// A settle of this lease, fenced by its generation.
    fn settle(&self, op: SettleOp, reason: Option<String>) -> SettleItem {
        SettleItem {
            target: MessageRef::Id(self.id),
            fence: Fence::Generation(Generation(self.gen)),
            op,
            reason,
        }
    }

    /// What the oracle expects of a settle of this lease by `owner`.
    fn spec(&self, owner: usize, op: SettleOp, by_owner: bool) -> SettleSpec {
        SettleSpec {
            offset: self.offset,
            gen: self.gen,
            owner,
            op,
            by_owner,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct SettleSpec {
    offset: i64,
    gen: u64,
    owner: usize,
    op: SettleOp,
    by_owner: bool,
}

#[derive(Debug)]
enum CallKind {
    Lease { consumer: usize },
    Settle { items: Vec<SettleSpec> },
    Release { consumer: usize },
    DeadLetterConfirm { offset: i64 },
}

#[derive(Debug)]
struct Call {
    kind: CallKind,
    at: i64,
    reply: Option<Result<Reply, QueueError>>,
    /// Immediate calls have no reply to wait for.
    immediate: bool,
    lost: bool,
}

#[derive(Debug)]
struct Write {
    id: WriteId,
    records: Vec<Vec<u8>>,
    snapshot: bool,
}

#[derive(Default, Debug, Clone, Copy)]
struct Stats {
    published: u64,
    duplicates: u64,
    acked: u64,
    dead_lettered: u64,
    dead_letter_duplicates: u64,
    redrives: u64,
    crashes: u64,
    stale_refused: u64,
    expiries: u64,
    delayed_leased: u64,
    key_blocked: u64,
    /// Steps at which a leased message was below the start (`detach_leases`).
    leases_detached: u64,
    gated_replies: u64,
    snapshots: u64,
    steps: u64,
}

impl Stats {
    fn add(&mut self, o: &Stats) {
        self.published += o.published;
        self.duplicates += o.duplicates;
        self.acked += o.acked;
        self.dead_lettered += o.dead_lettered;
        self.dead_letter_duplicates += o.dead_letter_duplicates;
        self.redrives += o.redrives;
        self.crashes += o.crashes;
        self.stale_refused += o.stale_refused;
        self.expiries += o.expiries;
        self.delayed_leased += o.delayed_leased;
        self.key_blocked += o.key_blocked;
        self.leases_detached += o.leases_detached;
        self.gated_replies += o.gated_replies;
        self.snapshots += o.snapshots;
        self.steps += o.steps;
    }
}

struct Sim {
    rng: Rng,
    config: QueueConfig,
    q: QueuePartition,
    now: i64,
    life: u32,
    /// The partition's leader epoch as this engine last saw it (raised on some restarts).
    epoch: u32,
    trace: bool,
    log: Vec<LogEntry>,
    copies: BTreeMap<i64, CopyView>,
    latest_copy: HashMap<MessageId, i64>,
    tokens: HashMap<Vec<u8>, (MessageId, i64, i64)>,
    recent_tokens: Vec<Vec<u8>>,
    next_token: u64,
    held: Vec<Vec<Held>>,
    stale: Vec<(usize, Held)>,
    answered_acks: Vec<(usize, Held)>,
    next_request: u64,
    calls: BTreeMap<u64, Call>,
    request_seq: HashMap<RequestId, u64>,
    next_seq: u64,
    writes: Vec<Write>,
    unconfirmed_from: usize,
    dead_letters: Vec<DeadLetterRequest>,
    dl_appended_unconfirmed: Vec<DeadLetterRequest>,
    /// Set while applying the replies released just before a crash, after a request whose
    /// reply was lost: the engine applied that request, the oracle cannot know how, so the
    /// lease-validity checks of the following settles are relaxed until the resync.
    uncertain: bool,
    stats: Stats,
}

macro_rules! check {
    ($sim:expr, $cond:expr, $($arg:tt)*) => {
        if !$cond {
            panic!("invariant violated at t={} life={}: {}", $sim.now, $sim.life, format!($($arg)*));
        }
    };
}

impl Sim {
    fn new(seed: u64) -> Sim {
        let mut rng = Rng(SplitMix64(seed));
        let ordering = if rng.chance(40) {
            Ordering::Key
        } else {
            Ordering::None
        };
        let max_visibility_ms = 10_000;
        let config = QueueConfig {
            max_attempts: rng.range(1, 4) as u32,
            min_visibility_ms: 100,
            default_visibility_ms: 1_000,
            max_visibility_ms,
            max_lease_lifetime_ms: 20_000,
            backoff: Backoff {
                base_ms: rng.range(0, 1) * rng.range(1, 500),
                multiplier: 2.0,
                max_ms: 2_000,
            },
            expiry_backoff: rng.chance(50),
            ordering,
            dead_letter: DeadLetterMode::Topic,
            lease_durability: if rng.chance(60) {
                LeaseDurability::BeforeReply
            } else {
                LeaseDurability::Lazy
            },
            max_window: rng.range(4, 32) as u32,
            max_leased_per_partition: rng.range(6, 32) as u32,
            max_leased_per_consumer: rng.range(2, 8) as u32,
            max_lease_batch: 4,
            max_delay_ms: 10_000,
            max_delayed: if rng.chance(30) {
                rng.range(1, 6) as u32
            } else {
                1_000
            },
            detach_leases: rng.chance(50),
            dedup_window_ms: rng.range(2_000, 20_000),
            max_dedup_entries: 1_000,
            max_message_bytes: 1_000,
            delay_bucket_ms: rng.range(1, 1_000),
            generation_block: rng.range(2, 64),
            dead_letter_retry_ms: 500,
        };
        let now = 1_700_000_000_000;
        let q = QueuePartition::new(config.clone(), P, Offset(0), now).unwrap();
        Sim {
            rng,
            config,
            q,
            now,
            life: 0,
            epoch: 0,
            trace: std::env::var("STRAND_QUEUE_SIM_TRACE").is_ok(),
            log: Vec::new(),
            copies: BTreeMap::new(),
            latest_copy: HashMap::new(),
            tokens: HashMap::new(),
            recent_tokens: Vec::new(),
            next_token: 0,
            held: vec![Vec::new(); CONSUMERS],
            stale: Vec::new(),
            answered_acks: Vec::new(),
            next_request: 0,
            calls: BTreeMap::new(),
            request_seq: HashMap::new(),
            next_seq: 0,
            writes: Vec::new(),
            unconfirmed_from: 0,
            dead_letters: Vec::new(),
            dl_appended_unconfirmed: Vec::new(),
            uncertain: false,
            stats: Stats::default(),
        }
    }

    fn t(&self, what: impl FnOnce() -> String) {
        if self.trace {
            eprintln!("[t={} life={}] {}", self.now, self.life, what());
        }
    }

    fn consumer_id(c: usize) -> ConsumerId {
        ConsumerId::new(format!("consumer-{c}"))
    }

    // ----- the caller's side: actions ------------------------------------------------------

    fn on_dead_letter(&mut self, req: DeadLetterRequest) {
        self.t(|| format!("dead-letter request {req:?}"));
        let life = self.life;
        let max = self.config.max_attempts;
        let c = self.copies.get(&req.offset.0).cloned();
        let Some(c) = c else {
            panic!("dead-letter of unknown offset {:?}", req.offset)
        };
        check!(self, req.id == c.id, "dead-letter id {:?} != {:?}", req.id, c.id);
        check!(
            self,
            c.status != Status::Acked,
            "dead-lettering acked message at {:?}",
            req.offset
        );
        check!(
            self,
            c.status != Status::DeadLettered || c.dl_life < life,
            "dead-lettered twice in one life: {:?}",
            req.offset
        );
        match req.cause {
            DeadLetterCause::MaxAttempts => {
                check!(
                    self,
                    req.attempts == max,
                    "dead-letter after {} attempts, max {max}",
                    req.attempts
                )
            }
            DeadLetterCause::Rejected => check!(self, c.reject_requested, "rejected without a reject"),
        }
        check!(
            self,
            req.attempts >= 1 && req.first_delivery_ms.is_some(),
            "dead-letter of a message never delivered"
        );
        self.dead_letters.push(req);
    }

    /// Applies replies to the oracle in the order the engine took the requests.
    fn process_calls(&mut self) {
        while let Some(entry) = self.calls.first_entry() {
            let ready = entry.get().immediate || entry.get().reply.is_some() || entry.get().lost;
            if !ready {
                break;
            }
            let seq = *entry.key();
            let call = entry.remove();
            self.t(|| {
                format!(
                    "apply call #{seq} {:?} at {} lost {}",
                    call.kind, call.at, call.lost
                )
            });
            self.apply_call(call);
        }
    }

    fn apply_call(&mut self, call: Call) {
        let at = call.at;
        self.uncertain |= call.lost;
        match call.kind {
            CallKind::Lease { consumer } => {
                let leases = match call.reply {
                    Some(Ok(Reply::Leases(l))) => l,
                    Some(other) => panic!("unexpected lease reply {other:?}"),
                    None => return, // lost in a crash: nobody got those leases
                };
                for l in leases {
                    self.check_grant(consumer, &l, at);
                }
            }
            CallKind::Settle { items } => match call.reply {
                Some(Ok(Reply::Settled(results))) => {
                    check!(self, results.len() == items.len(), "settle results");
                    for (spec, r) in items.iter().zip(results) {
                        self.check_settled(spec, r, at);
                    }
                }
                Some(other) => panic!("unexpected settle reply {other:?}"),
                None => {
                    // Lost: the engine may have applied it. Treat the leases named as gone.
                    for spec in &items {
                        if let Some(c) = self.copies.get_mut(&spec.offset) {
                            let named = c.valid.is_some_and(|v| {
                                if spec.by_owner {
                                    v.owner == spec.owner
                                } else {
                                    v.gen == spec.gen
                                }
                            });
                            // Even an extension may have shortened the lease.
                            if named {
                                c.valid = None;
                            }
                            // A lost ack stays "in flight" (maybe applied) until the crash
                            // resynchronizes the oracle with what is durable.
                        }
                    }
                }
            },
            CallKind::Release { consumer } => {
                for c in self.copies.values_mut() {
                    if c.valid.is_some_and(|v| v.owner == consumer) {
                        c.valid = None;
                    }
                }
            }
            CallKind::DeadLetterConfirm { offset } => {
                let life = self.life;
                if let Some(c) = self.copies.get_mut(&offset) {
                    c.dl_confirm_in_flight = false;
                    if c.status == Status::Pending {
                        self.stats.dead_lettered += 1;
                    }
                    c.status = Status::DeadLettered;
                    c.dl_life = life;
                    c.valid = None;
                }
            }
        }
    }

    fn check_grant(&mut self, consumer: usize, l: &Lease, at: i64) {
        let off = l.offset.0;
        let max = self.config.max_attempts;
        let by_key = self.config.ordering == Ordering::Key;
        let c = self
            .copies
            .get(&off)
            .cloned()
            .unwrap_or_else(|| panic!("lease of unknown offset {off}"));
        self.t(|| {
            format!(
                "grant {off} gen {} attempt {} to {consumer}",
                l.generation.0, l.attempt
            )
        });
        check!(self, l.id == c.id, "lease id {:?} != {:?}", l.id, c.id);
        check!(
            self,
            c.status != Status::Acked,
            "acked message {off} delivered again"
        );
        check!(
            self,
            c.status != Status::DeadLettered,
            "dead-lettered message {off} delivered again"
        );
        check!(
            self,
            l.generation.0 > c.last_gen,
            "generation went backwards at {off}: {} after {}",
            l.generation.0,
            c.last_gen
        );
        check!(
            self,
            l.attempt > c.last_attempt,
            "attempt count went backwards at {off}: {} after {}",
            l.attempt,
            c.last_attempt
        );
        check!(self, l.attempt <= max, "attempt {} beyond max {max}", l.attempt);
        check!(
            self,
            at >= c.not_before,
            "leased at {at} before its time {}",
            c.not_before
        );
        if let Some(v) = c.valid {
            check!(
                self,
                v.expiry <= at,
                "two valid leases of {off}: gen {} (expires {}) and gen {}",
                v.gen,
                v.expiry,
                l.generation.0
            );
        }
        if let (true, Some(k)) = (by_key, c.key) {
            for (o, other) in self.copies.iter() {
                if *o == off || other.key != Some(k) {
                    continue;
                }
                if let Some(v) = other.valid {
                    check!(self, v.expiry <= at, "key {k}: {off} leased while {o} is leased");
                }
                if *o < off && self.trace && other.status == Status::Pending {
                    eprintln!(
                        "  earlier {o}: {:?} engine {:?}",
                        other,
                        self.q.inspect(Offset(*o))
                    );
                }
                if *o < off {
                    let done = other.status != Status::Pending
                        || other.acks_in_flight > 0
                        || other.dl_confirm_in_flight;
                    check!(
                        self,
                        done,
                        "key {k}: {off} leased before earlier {o} is done ({:?})",
                        other.status
                    );
                }
            }
        }
        if c.not_before > 0 && c.last_attempt == 0 {
            self.stats.delayed_leased += 1;
        }
        let c = self.copies.get_mut(&off).unwrap();
        c.last_gen = l.generation.0;
        c.last_attempt = l.attempt;
        c.valid = Some(ValidLease {
            gen: l.generation.0,
            owner: consumer,
            expiry: l.expiry_ms,
            attempt: l.attempt,
        });
        self.held[consumer].push(Held {
            offset: off,
            id: l.id,
            gen: l.generation.0,
            attempt: l.attempt,
            expiry: l.expiry_ms,
        });
    }

    fn check_settled(&mut self, spec: &SettleSpec, r: Result<Settled, QueueError>, at: i64) {
        let off = spec.offset;
        let max = self.config.max_attempts;
        let backoff = self.config.backoff;
        let c = self.copies.get(&off).cloned().expect("settle of unknown copy");
        let valid_now = c.valid.filter(|v| {
            v.expiry > at
                && if spec.by_owner {
                    v.owner == spec.owner
                } else {
                    v.gen == spec.gen
                }
        });
        // Whether the engine may take a settle that needs a valid lease.
        let may_settle = valid_now.is_some() || self.uncertain;
        self.t(|| {
            format!(
                "settled {off} gen {} {:?}: {r:?} (valid now {valid_now:?}, oracle {:?}, engine {:?})",
                spec.gen,
                spec.op,
                c.valid,
                self.q.inspect(Offset(off)).map(|v| v.state)
            )
        });
        if spec.op == SettleOp::Ack {
            let c = self.copies.get_mut(&off).unwrap();
            c.acks_in_flight = c.acks_in_flight.saturating_sub(1);
        }
        match r {
            Ok(s) => {
                check!(
                    self,
                    s.id == c.id && s.offset.0 == off,
                    "settled the wrong message"
                );
                match (spec.op, s.outcome) {
                    (SettleOp::Ack, Outcome::Acked) => {
                        let retry = c.status == Status::Acked
                            && (c.acked_gen == spec.gen
                                || (!c.acked_gen_known && c.ack_gens.contains(&spec.gen)));
                        check!(
                            self,
                            valid_now.is_some() || retry || self.uncertain,
                            "ack of {off} gen {} accepted without a valid lease",
                            spec.gen
                        );
                        let c = self.copies.get_mut(&off).unwrap();
                        if c.status == Status::Pending {
                            self.stats.acked += 1;
                        }
                        check!(
                            self,
                            c.status != Status::DeadLettered,
                            "acked a dead-lettered message"
                        );
                        c.status = Status::Acked;
                        c.acked_gen = valid_now.map_or(spec.gen, |v| v.gen);
                        c.acked_gen_known = true;
                        c.valid = None;
                    }
                    (
                        SettleOp::Nack { delay_ms },
                        Outcome::Retry {
                            not_before_ms,
                            attempts,
                        },
                    ) => {
                        check!(self, may_settle, "nack of {off} accepted without a valid lease");
                        let attempt = valid_now.map_or(attempts, |v| v.attempt);
                        check!(
                            self,
                            attempts == attempt && attempts < max,
                            "retry after attempt {attempts} (max {max})"
                        );
                        let expect = at + delay_ms.unwrap_or_else(|| backoff.delay_ms(attempts)) as i64;
                        check!(
                            self,
                            not_before_ms == expect,
                            "not-before {not_before_ms} != {expect}"
                        );
                        let c = self.copies.get_mut(&off).unwrap();
                        c.not_before = c.not_before.max(not_before_ms);
                        c.valid = None;
                    }
                    (SettleOp::Nack { .. }, Outcome::DeadLettered { cause, attempts }) => {
                        check!(self, may_settle, "nack of {off} accepted without a valid lease");
                        let attempt = valid_now.map_or(attempts, |v| v.attempt);
                        check!(
                            self,
                            cause == DeadLetterCause::MaxAttempts && attempts == max && attempt == max,
                            "dead-lettered by nack after {attempts} attempts (max {max})"
                        );
                        self.copies.get_mut(&off).unwrap().valid = None;
                    }
                    (SettleOp::Reject, Outcome::DeadLettered { cause, .. }) => {
                        check!(self, may_settle, "reject of {off} accepted without a valid lease");
                        check!(
                            self,
                            cause == DeadLetterCause::Rejected,
                            "reject dead-lettered as {cause:?}"
                        );
                        self.copies.get_mut(&off).unwrap().valid = None;
                    }
                    (SettleOp::Extend { visibility_ms }, Outcome::Extended { expiry_ms }) => {
                        check!(self, may_settle, "extend of {off} accepted without a valid lease");
                        check!(self, expiry_ms == at + visibility_ms as i64, "extended expiry");
                        let c = self.copies.get_mut(&off).unwrap();
                        if let Some(v) = c.valid.as_mut() {
                            v.expiry = expiry_ms;
                        }
                        for h in self.held[spec.owner]
                            .iter_mut()
                            .filter(|h| h.offset == off && h.gen == spec.gen)
                        {
                            h.expiry = expiry_ms;
                        }
                    }
                    (op, outcome) => panic!("outcome {outcome:?} for {op:?}"),
                }
            }
            Err(QueueError::LeaseLifetimeExceeded { .. }) if matches!(spec.op, SettleOp::Extend { .. }) => {}
            Err(e) => {
                let retry_of_ack = spec.op == SettleOp::Ack && c.status == Status::Acked;
                check!(
                    self,
                    valid_now.is_none() || retry_of_ack || self.uncertain,
                    "valid lease of {off} gen {} refused: {e}",
                    spec.gen
                );
                check!(
                    self,
                    matches!(
                        e,
                        QueueError::StaleGeneration { .. }
                            | QueueError::NotLeased { .. }
                            | QueueError::AlreadyDone
                            | QueueError::NotOwner
                            | QueueError::NotFound
                    ),
                    "unexpected error {e:?}"
                );
                self.stats.stale_refused += 1;
            }
        }
    }

    // ----- steps ---------------------------------------------------------------------------

    fn publish(&mut self) {
        if self.rng.chance(3) {
            // A transaction marker: an offset without a message.
            self.log.push(LogEntry {
                gap: true,
                key: None,
                timestamp_ms: self.now,
                deliver_at_ms: 0,
                token: None,
                message_id: None,
            });
            self.q.set_log_end(Offset(self.log.len() as i64));
            return;
        }
        let key = self.rng.chance(60).then(|| self.rng.below(u64::from(KEYS)) as u8);
        let poison = self.rng.chance(10);
        let delay = if self.rng.chance(20) {
            self.rng.range(1, 5_000)
        } else {
            0
        };
        let token = if self.rng.chance(30) {
            if !self.recent_tokens.is_empty() && self.rng.chance(40) {
                let i = self.rng.below(self.recent_tokens.len() as u64) as usize;
                Some(self.recent_tokens[i].clone())
            } else {
                self.next_token += 1;
                let t = format!("token-{}", self.next_token).into_bytes();
                self.recent_tokens.push(t.clone());
                if self.recent_tokens.len() > 8 {
                    self.recent_tokens.remove(0);
                }
                Some(t)
            }
        } else {
            None
        };
        let known = token
            .as_ref()
            .and_then(|t| self.tokens.get(t).copied())
            .filter(|(_, _, ts)| self.now < ts + self.config.dedup_window_ms as i64);
        let req = PublishRequest {
            size_bytes: 100,
            delay_ms: delay,
            dedup_token: token.as_deref(),
            redrive_of: None,
        };
        match self.q.admit_publish(&req, self.now) {
            Ok(Admission::Duplicate { id, offset }) => {
                let (kid, koff, _) =
                    known.unwrap_or_else(|| panic!("dedup answered {id:?} for an unknown token"));
                check!(
                    self,
                    (id, offset.0) == (kid, koff),
                    "dedup answered {id:?}@{offset:?}, first was {kid:?}@{koff}"
                );
                self.stats.duplicates += 1;
            }
            Ok(Admission::Append { deliver_at_ms }) => {
                check!(
                    self,
                    known.is_none(),
                    "token {:?} within its window was appended again",
                    token
                );
                let off = self.log.len() as i64;
                let id = MessageId::new(P, Offset(off));
                self.log.push(LogEntry {
                    gap: false,
                    key: key.map(|k| vec![b'k', k]),
                    timestamp_ms: self.now,
                    deliver_at_ms,
                    token: token.clone(),
                    message_id: None,
                });
                if let Some(t) = token {
                    self.tokens.insert(t, (id, off, self.now));
                }
                self.add_copy(off, id, poison, key, deliver_at_ms);
                self.feed(Offset(off));
                self.stats.published += 1;
                self.t(|| format!("published {off} key {key:?} delay {delay} poison {poison}"));
            }
            Err(QueueError::TooManyDelayed { .. }) if delay > 0 => {}
            Err(e) => panic!("publish refused: {e}"),
        }
    }

    fn add_copy(&mut self, off: i64, id: MessageId, poison: bool, key: Option<u8>, deliver_at: i64) {
        // Any lease of it may expire into a backoff delay.
        let expiry_delays = self.config.expiry_backoff && self.config.backoff.base_ms > 0;
        self.copies.insert(
            off,
            CopyView {
                id,
                poison,
                key,
                status: Status::Pending,
                acked_gen: 0,
                dl_life: 0,
                last_gen: 0,
                last_attempt: 0,
                valid: None,
                not_before: deliver_at,
                reject_requested: false,
                acks_in_flight: 0,
                ack_life: 0,
                dl_confirm_in_flight: false,
                dl_appends: 0,
                ack_sent: false,
                ack_gens: Vec::new(),
                acked_gen_known: true,
                ever_delayed: deliver_at > 0 || expiry_delays,
            },
        );
        self.latest_copy.insert(id, off);
    }

    fn redrive(&mut self) {
        let candidates: Vec<(MessageId, i64)> = self
            .latest_copy
            .iter()
            .filter(|(_, off)| self.copies[*off].status == Status::DeadLettered)
            .map(|(id, off)| (*id, *off))
            .collect();
        if candidates.is_empty() {
            return;
        }
        let mut candidates = candidates;
        candidates.sort();
        let (id, old) = candidates[self.rng.below(candidates.len() as u64) as usize];
        let req = PublishRequest {
            size_bytes: 100,
            delay_ms: 0,
            dedup_token: None,
            redrive_of: Some(id),
        };
        match self.q.admit_publish(&req, self.now) {
            Ok(Admission::Append { .. }) => {
                let off = self.log.len() as i64;
                let (poison, key) = (self.copies[&old].poison, self.copies[&old].key);
                self.log.push(LogEntry {
                    gap: false,
                    key: key.map(|k| vec![b'k', k]),
                    timestamp_ms: self.now,
                    deliver_at_ms: 0,
                    token: None,
                    message_id: Some(id),
                });
                self.add_copy(off, id, poison, key, 0);
                self.feed(Offset(off));
                self.stats.redrives += 1;
                self.t(|| format!("redrove {id:?} from {old} to {off}"));
            }
            // After a crash the old copy may be waiting for its dead-letter append again.
            Err(QueueError::AlreadyLive(_)) => {
                let states: Vec<_> = self
                    .copies
                    .iter()
                    .filter(|(_, c)| c.id == id)
                    .map(|(o, _)| self.q.inspect(Offset(*o)).map(|v| v.state))
                    .collect();
                check!(
                    self,
                    states
                        .iter()
                        .any(|s| matches!(s, Some(DeliveryState::DeadLetterPending { .. }))),
                    "redrive of {id:?} refused, its copies are {states:?}"
                );
            }
            other => panic!("redrive: {other:?}"),
        }
    }

    fn call(&mut self, kind: CallKind, request: Option<RequestId>) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let immediate = request.is_none();
        self.t(|| format!("call #{seq} {kind:?} request {request:?}"));
        if let Some(r) = request {
            self.request_seq.insert(r, seq);
        }
        self.calls.insert(
            seq,
            Call {
                kind,
                at: self.now,
                reply: None,
                immediate,
                lost: false,
            },
        );
    }

    fn request_id(&mut self) -> RequestId {
        self.next_request += 1;
        RequestId(self.next_request)
    }

    fn lease(&mut self, consumer: usize, n: u32, vis: u64) {
        let r = self.request_id();
        match self.q.lease(r, &Self::consumer_id(consumer), n, vis, self.now) {
            Ok(()) => {
                self.call(CallKind::Lease { consumer }, Some(r));
                let seq = self.next_seq - 1;
                self.pump();
                if self.calls.get(&seq).is_some_and(|c| c.reply.is_none()) {
                    self.stats.gated_replies += 1;
                }
            }
            Err(QueueError::ConsumerLeaseLimit { .. } | QueueError::PartitionLeaseLimit { .. }) => {}
            Err(e) => panic!("lease refused: {e}"),
        }
    }

    fn settle(&mut self, consumer: usize, leases: Vec<Held>, stale: bool) {
        if leases.is_empty() {
            return;
        }
        let mut items = Vec::new();
        let mut specs = Vec::new();
        for h in leases {
            let poison = self.copies[&h.offset].poison;
            let op = if poison {
                if self.rng.chance(15) {
                    SettleOp::Reject
                } else {
                    SettleOp::Nack {
                        delay_ms: self.rng.chance(50).then(|| self.rng.range(0, 2_000)),
                    }
                }
            } else {
                match self.rng.below(100) {
                    0..=74 => SettleOp::Ack,
                    75..=84 => SettleOp::Nack {
                        delay_ms: self.rng.chance(50).then(|| self.rng.range(0, 2_000)),
                    },
                    85..=96 => SettleOp::Extend {
                        visibility_ms: self.rng.range(100, 5_000),
                    },
                    _ => SettleOp::Reject,
                }
            };
            let by_owner = !stale && self.rng.chance(20);
            let base_ms = self.config.backoff.base_ms;
            let c = self.copies.get_mut(&h.offset).unwrap();
            if let SettleOp::Nack { delay_ms } = op {
                c.ever_delayed |= delay_ms.unwrap_or(base_ms) > 0;
            }
            if op == SettleOp::Reject {
                c.reject_requested = true;
            }
            if op == SettleOp::Ack {
                c.ack_sent_in(self.life, h.gen);
            }
            let mut item = h.settle(op, Some(format!("consumer {consumer} says {op:?}")));
            if by_owner {
                item.target = MessageRef::Offset(Offset(h.offset));
                item.fence = Fence::Owner(Self::consumer_id(consumer));
            }
            items.push(item);
            specs.push(h.spec(consumer, op, by_owner));
            if op == SettleOp::Ack {
                self.answered_acks.push((consumer, h));
                if self.answered_acks.len() > 16 {
                    self.answered_acks.remove(0);
                }
            }
            if let SettleOp::Extend { .. } = op {
                // Keep holding it.
                self.held[consumer].push(h);
            } else {
                self.stale.push((consumer, h));
                if self.stale.len() > 32 {
                    self.stale.remove(0);
                }
            }
        }
        let r = self.request_id();
        self.t(|| format!("consumer {consumer} sends {specs:?}"));
        self.q.settle(r, &items, self.now).unwrap();
        self.call(CallKind::Settle { items: specs }, Some(r));
        self.pump();
    }

    fn step(&mut self) {
        self.stats.steps += 1;
        match self.rng.below(1000) {
            0..=219 => self.publish(),
            220..=239 => self.redrive(),
            240..=419 => {
                let c = self.rng.below(CONSUMERS as u64) as usize;
                let n = self.rng.range(1, 4) as u32;
                let vis = self.rng.range(100, 5_000);
                self.lease(c, n, vis);
            }
            420..=619 => {
                let c = self.rng.below(CONSUMERS as u64) as usize;
                let k = self.rng.range(1, 3) as usize;
                let mut take = Vec::new();
                for _ in 0..k {
                    if self.held[c].is_empty() {
                        break;
                    }
                    let i = self.rng.below(self.held[c].len() as u64) as usize;
                    take.push(self.held[c].remove(i));
                }
                self.settle(c, take, false);
            }
            620..=639 => {
                // A late or duplicate settle with a lease the consumer no longer holds.
                if let Some((c, h)) = (!self.stale.is_empty()).then(|| {
                    let i = self.rng.below(self.stale.len() as u64) as usize;
                    self.stale[i]
                }) {
                    self.settle(c, vec![h], true);
                }
            }
            640..=649 => {
                if let Some((c, h)) = (!self.answered_acks.is_empty()).then(|| {
                    let i = self.rng.below(self.answered_acks.len() as u64) as usize;
                    self.answered_acks[i]
                }) {
                    // A retried ack: same generation, Ack again.
                    let r = self.request_id();
                    self.copies
                        .get_mut(&h.offset)
                        .unwrap()
                        .ack_sent_in(self.life, h.gen);
                    let item = h.settle(SettleOp::Ack, None);
                    self.q.settle(r, &[item], self.now).unwrap();
                    let spec = h.spec(c, SettleOp::Ack, false);
                    self.call(CallKind::Settle { items: vec![spec] }, Some(r));
                    self.pump();
                }
            }
            650..=789 => {
                let dt = if self.rng.chance(10) {
                    self.rng.range(5_000, 15_000)
                } else {
                    self.rng.range(1, 1_500)
                };
                let before = self.q.metrics().counters.lease_expiries;
                self.now += dt as i64;
                // The caller's timer may fire late: the next command must see the time anyway.
                if self.rng.chance(50) {
                    self.q.tick(self.now);
                }
                self.stats.expiries += self.q.metrics().counters.lease_expiries - before;
                self.pump();
            }
            790..=889 => {
                let outstanding = self.writes.len() - self.unconfirmed_from;
                let n = self.rng.range(0, outstanding as u64) as usize;
                self.confirm(n);
            }
            890..=939 => self.dead_letter_step(),
            940..=969 => self.load(),
            970..=979 => {
                // A consumer dies holding its leases: they will expire.
                let c = self.rng.below(CONSUMERS as u64) as usize;
                let dropped: Vec<Held> = std::mem::take(&mut self.held[c]);
                self.stale.extend(dropped.into_iter().map(|h| (c, h)));
            }
            980..=984 => {
                let c = self.rng.below(CONSUMERS as u64) as usize;
                let n = self.q.release_owner(&Self::consumer_id(c), self.now);
                self.t(|| format!("consumer {c} released {n} leases"));
                self.call(CallKind::Release { consumer: c }, None);
                let dropped: Vec<Held> = std::mem::take(&mut self.held[c]);
                self.stale.extend(dropped.into_iter().map(|h| (c, h)));
                self.pump();
            }
            985..=989 => {
                if self.q.wants_snapshot() || self.rng.chance(20) {
                    self.q.snapshot();
                    self.stats.snapshots += 1;
                    self.pump();
                }
            }
            _ => self.crash(),
        }
    }

    /// Confirms the next `n` unconfirmed writes, in order.
    fn confirm(&mut self, n: usize) {
        if n == 0 {
            return;
        }
        let upto = self.unconfirmed_from + n;
        let last = self.writes[upto - 1].id;
        // A durable snapshot makes every earlier write deletable: delete them.
        if let Some(s) = (self.unconfirmed_from..upto)
            .rev()
            .find(|i| self.writes[*i].snapshot)
        {
            self.writes.drain(..s);
            self.unconfirmed_from = upto - s;
        } else {
            self.unconfirmed_from = upto;
        }
        self.t(|| format!("persisted up to {last:?}"));
        self.q.persisted(last);
        self.pump();
    }

    fn dead_letter_step(&mut self) {
        if !self.dl_appended_unconfirmed.is_empty() && self.rng.chance(50) {
            let req = self.dl_appended_unconfirmed.remove(0);
            self.confirm_dead_letter(req);
            return;
        }
        if self.dead_letters.is_empty() {
            return;
        }
        let i = self.rng.below(self.dead_letters.len() as u64) as usize;
        let req = self.dead_letters.remove(i);
        match self.rng.below(100) {
            0..=69 => {
                self.append_dead_letter(&req);
                self.confirm_dead_letter(req);
            }
            70..=84 => {
                self.append_dead_letter(&req);
                self.dl_appended_unconfirmed.push(req);
            }
            _ => {
                self.q.dead_letter_failed(req.offset, self.now);
                self.pump();
            }
        }
    }

    fn append_dead_letter(&mut self, req: &DeadLetterRequest) {
        let life = self.life;
        let c = self.copies.get_mut(&req.offset.0).unwrap();
        c.dl_appends += 1;
        if c.dl_appends > 1 {
            self.stats.dead_letter_duplicates += 1;
        }
        c.dl_life = life;
        c.dl_confirm_in_flight = true;
    }

    fn confirm_dead_letter(&mut self, req: DeadLetterRequest) {
        self.q.dead_letter_appended(req.offset, self.now);
        self.call(CallKind::DeadLetterConfirm { offset: req.offset.0 }, None);
        self.pump();
    }

    fn crash(&mut self) {
        self.stats.crashes += 1;
        // Requests in flight are lost; replies already released are applied first.
        for call in self.calls.values_mut() {
            if call.reply.is_none() && !call.immediate {
                call.lost = true;
            }
        }
        self.process_calls();
        self.uncertain = false;
        self.request_seq.clear();
        // The durable prefix: confirmed writes and some of the unconfirmed ones.
        let survive = self
            .rng
            .range(0, (self.writes.len() - self.unconfirmed_from) as u64) as usize;
        self.writes.truncate(self.unconfirmed_from + survive);
        if let Some(s) = self.writes.iter().rposition(|w| w.snapshot) {
            self.writes.drain(..s);
        }
        self.unconfirmed_from = self.writes.len();
        let records: Vec<StateRecord> = self
            .writes
            .iter()
            .flat_map(|w| w.records.iter())
            .map(|b| StateRecord::decode(b).expect("a durable record does not decode"))
            .collect();
        self.t(|| {
            format!(
                "CRASH: recovering from {} records ({} writes)",
                records.len(),
                self.writes.len()
            )
        });
        self.life += 1;
        self.dead_letters.clear();
        self.dl_appended_unconfirmed.clear();
        self.recover(self.config.clone(), P, records);
        // Resynchronize the oracle with what survived.
        let lazy = self.config.lease_durability == LeaseDurability::Lazy;
        let start = self.q.start().0;
        let offsets: Vec<i64> = self.copies.keys().copied().collect();
        for off in offsets {
            let view = self.q.inspect(Offset(off));
            let c = self.copies.get_mut(&off).unwrap();
            c.acks_in_flight = 0;
            c.dl_confirm_in_flight = false;
            let state = view.as_ref().map(|v| v.state.clone());
            let pending_in_engine = state
                .as_ref()
                .is_some_and(|s| !matches!(s, DeliveryState::Done(_)));
            if lazy {
                // An unrecorded lease is void: attempts restart from what is durable.
                c.last_attempt = view.as_ref().map_or(0, |v| v.attempts);
            } else if c.status == Status::Pending && pending_in_engine {
                let v = view.as_ref().unwrap();
                assert!(
                    v.attempts >= c.last_attempt,
                    "an answered lease of {off} (attempt {}) was not durable: recovered attempts {}",
                    c.last_attempt,
                    v.attempts
                );
            }
            match (&state, c.status) {
                (Some(DeliveryState::Done(DoneOutcome::Acked)), Status::Pending) => {
                    // An ack that was never answered, but is durable.
                    assert!(c.ack_sent, "{off} acked but nobody acked it");
                    c.status = Status::Acked;
                    c.acked_gen = view.as_ref().unwrap().generation.0;
                    self.stats.acked += 1;
                }
                (None, Status::Pending) if off < start => {
                    assert!(
                        c.ack_sent,
                        "{off} lost: below the start, never acked nor dead-lettered"
                    );
                    c.status = Status::Acked;
                    c.acked_gen_known = false;
                    self.stats.acked += 1;
                }
                (Some(DeliveryState::Done(DoneOutcome::Archived)), Status::Pending) => {
                    panic!("{off} archived without a confirmed dead-letter append")
                }
                (Some(s), Status::Acked) if !matches!(s, DeliveryState::Done(DoneOutcome::Acked)) => {
                    panic!("answered ack of {off} undone by the crash: {s:?}")
                }
                _ => {}
            }
            c.valid = match (&state, c.status) {
                (Some(DeliveryState::Leased { owner, expiry_ms, .. }), Status::Pending)
                    if *expiry_ms > self.now =>
                {
                    let v = view.as_ref().unwrap();
                    // With lazy leases an answered lease may be lost while the lease it replaced
                    // (its settle unanswered) is durable and valid again.
                    assert!(
                        lazy || v.generation.0 >= c.last_gen,
                        "recovered lease of {off} is older than an answered one ({:?} < {})",
                        v.generation,
                        c.last_gen
                    );
                    let o: usize = owner.as_str().trim_start_matches("consumer-").parse().unwrap();
                    Some(ValidLease {
                        gen: v.generation.0,
                        owner: o,
                        expiry: *expiry_ms,
                        attempt: v.attempts,
                    })
                }
                _ => None,
            };
        }
        // Half the restarts are this node leading the partition again in a newer epoch (a
        // cluster's fail-over and back): generations rise to the epoch's floor.
        if self.rng.chance(50) {
            self.epoch += 1;
            self.t(|| "a new leader epoch".to_string());
            self.q.raise_generations(u64::from(self.epoch) << 32);
        }
        self.pump();
    }

    /// No message lost: every pending copy is still held by the engine, or in the log beyond
    /// the window, or has an outcome in flight.
    fn check_nothing_lost(&self) {
        let start = self.q.start().0;
        let loaded_end = self.q.loaded_end().0;
        for (off, c) in &self.copies {
            if c.status != Status::Pending {
                continue;
            }
            if *off >= loaded_end {
                continue; // in the log, not loaded yet
            }
            let in_flight = c.acks_in_flight > 0 || c.dl_confirm_in_flight;
            let state = self.q.inspect(Offset(*off)).map(|v| v.state);
            if *off < start && !c.ever_delayed && !self.config.detach_leases {
                // Only a delayed message may leave the window while pending (KIP-932: the start
                // offset never passes an in-flight record), unless leases detach too.
                check!(
                    self,
                    !matches!(
                        state,
                        Some(DeliveryState::Leased { .. } | DeliveryState::Available)
                    ),
                    "the start {start} passed in-flight message {off} ({state:?})"
                );
            }
            match state {
                Some(DeliveryState::Done(_)) | None if in_flight => {}
                None => check!(self, false, "message {off} lost (below start {start}, no record)"),
                Some(DeliveryState::Done(o)) => {
                    check!(self, false, "message {off} done ({o:?}) without an outcome")
                }
                Some(_) => {}
            }
        }
    }

    fn check_step(&mut self) {
        if let Err(e) = self.q.check_invariants() {
            panic!("engine invariant: {e}");
        }
        self.check_nothing_lost();
        let start = self.q.start();
        if self.copies.range(..start.0).any(|(off, _)| {
            matches!(
                self.q.inspect(Offset(*off)).map(|v| v.state),
                Some(DeliveryState::Leased { .. })
            )
        }) {
            self.stats.leases_detached += 1;
        }
        // ordering=key: at most one valid lease per key, now.
        if self.config.ordering == Ordering::Key {
            let mut per_key: HashMap<u8, i64> = HashMap::new();
            for (off, c) in &self.copies {
                if let (Some(k), Some(v)) = (c.key, c.valid) {
                    if v.expiry > self.now {
                        if let Some(other) = per_key.insert(k, *off) {
                            check!(self, false, "key {k} leased twice: {other} and {off}");
                        }
                    }
                }
            }
            let m = self.q.metrics();
            let ready = m.available - (m.log_end.0 - m.loaded_end.0) as u64;
            if !self.q.has_leasable() && ready > 0 {
                self.stats.key_blocked += 1;
            }
        }
    }

    /// No more faults: serve everything until every message is acked or dead-lettered.
    fn drain(&mut self) {
        for round in 0..5_000 {
            let outstanding = self.writes.len() - self.unconfirmed_from;
            self.confirm(outstanding);
            for req in std::mem::take(&mut self.dl_appended_unconfirmed) {
                self.confirm_dead_letter(req);
            }
            for req in std::mem::take(&mut self.dead_letters) {
                self.append_dead_letter(&req);
                self.confirm_dead_letter(req);
            }
            self.load();
            for c in 0..CONSUMERS {
                let held = std::mem::take(&mut self.held[c]);
                let mut items = Vec::new();
                let mut specs = Vec::new();
                for h in held {
                    let op = if self.copies[&h.offset].poison {
                        SettleOp::Nack { delay_ms: None }
                    } else {
                        SettleOp::Ack
                    };
                    let base_ms = self.config.backoff.base_ms;
                    if op != SettleOp::Ack {
                        self.copies.get_mut(&h.offset).unwrap().ever_delayed |= base_ms > 0;
                    }
                    if op == SettleOp::Ack {
                        self.copies
                            .get_mut(&h.offset)
                            .unwrap()
                            .ack_sent_in(self.life, h.gen);
                    }
                    items.push(h.settle(op, Some("drain".into())));
                    specs.push(h.spec(c, op, false));
                }
                for (items, specs) in items.chunks(4).zip(specs.chunks(4)) {
                    let r = self.request_id();
                    self.q.settle(r, items, self.now).unwrap();
                    self.call(
                        CallKind::Settle {
                            items: specs.to_vec(),
                        },
                        Some(r),
                    );
                    self.pump();
                }
                self.lease(c, 4, 2_000);
            }
            let outstanding = self.writes.len() - self.unconfirmed_from;
            self.confirm(outstanding);
            self.check_step();
            if self.copies.values().all(|c| c.status != Status::Pending) {
                self.t(|| format!("drained after {round} rounds"));
                return;
            }
            self.now += 500;
            self.q.tick(self.now);
            self.pump();
        }
        let pending: Vec<_> = self
            .copies
            .iter()
            .filter(|(_, c)| c.status == Status::Pending)
            .map(|(o, c)| (*o, c.clone(), self.q.inspect(Offset(*o))))
            .take(5)
            .collect();
        panic!("drain did not finish: {pending:?}");
    }

    fn final_checks(&self) {
        for (off, c) in &self.copies {
            check!(self, c.status != Status::Pending, "message {off} never finished");
            if c.poison && c.status == Status::Acked {
                panic!("poison message {off} acked");
            }
        }
        // Every message id ends acked or dead-lettered (its latest copy).
        for (id, off) in &self.latest_copy {
            check!(
                self,
                self.copies[off].status != Status::Pending,
                "{id:?} unfinished"
            );
        }
        check!(self, self.stats.acked > 0, "the run acked nothing");
    }
}

/// The caller's side: writes are kept until a step confirms them, replies go to the oracle in
/// the order the engine took the requests.
impl Caller for Sim {
    fn parts(&mut self) -> (&mut QueuePartition, &[LogEntry], i64) {
        (&mut self.q, &self.log, self.now)
    }

    fn persist(&mut self, write_id: WriteId, records: Vec<StateRecord>, snapshot: bool) {
        self.t(|| {
            format!(
                "persist {write_id:?} ({} records, snapshot {snapshot})",
                records.len()
            )
        });
        self.writes.push(Write {
            id: write_id,
            records: records.iter().map(StateRecord::to_bytes).collect(),
            snapshot,
        });
    }

    fn reply(&mut self, request: RequestId, reply: Result<Reply, QueueError>) {
        let seq = self
            .request_seq
            .remove(&request)
            .expect("reply to an unknown request");
        let call = self.calls.get_mut(&seq).expect("reply to a forgotten call");
        check!(self, call.reply.is_none(), "two replies to one request");
        call.reply = Some(reply);
    }

    fn dead_letter(&mut self, req: DeadLetterRequest) {
        self.on_dead_letter(req);
    }

    /// The clock steps tick the engine themselves, or leave it to the next command as a late
    /// timer would: no wake-up is kept.
    fn wake_at(&mut self, _at_ms: i64) {}

    fn pump(&mut self) {
        self.handle_actions();
        self.process_calls();
    }
}

fn run(seed: u64, steps: u64) -> Stats {
    let mut sim = Sim::new(seed);
    sim.t(|| format!("config {:?}", sim.config));
    sim.pump();
    sim.confirm(sim.writes.len());
    for _ in 0..steps {
        sim.step();
        sim.check_step();
    }
    sim.drain();
    sim.final_checks();
    sim.stats
}

fn run_caught(seed: u64, steps: u64) -> Stats {
    match std::panic::catch_unwind(|| run(seed, steps)) {
        Ok(s) => s,
        Err(e) => {
            let msg = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            panic!("queue simulation failed with seed {seed} (replay: STRAND_QUEUE_SIM_SEED={seed}): {msg}");
        }
    }
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|s| s.parse().ok())
}

#[test]
fn simulated_queue_keeps_its_guarantees() {
    if let Some(seed) = env_u64("STRAND_QUEUE_SIM_SEED") {
        let stats = run_caught(seed, env_u64("STRAND_QUEUE_SIM_STEPS").unwrap_or(700));
        eprintln!("seed {seed}: {stats:?}");
        return;
    }
    let seeds = env_u64("STRAND_QUEUE_SIM_SEEDS").unwrap_or(300);
    let steps = env_u64("STRAND_QUEUE_SIM_STEPS").unwrap_or(700);
    let mut total = Stats::default();
    let mut keyed = 0;
    for seed in 0..seeds {
        let s = run_caught(seed, steps);
        if Sim::new(seed).config.ordering == Ordering::Key {
            keyed += 1;
        }
        total.add(&s);
    }
    eprintln!("{seeds} seeds x {steps} steps: {total:?}");
    // The guard: a run that exercised nothing proves nothing.
    let exercised = [
        ("acks", total.acked),
        ("dedup duplicates", total.duplicates),
        ("dead letters", total.dead_lettered),
        (
            "duplicate dead-letter appends after crashes",
            total.dead_letter_duplicates,
        ),
        ("redrives", total.redrives),
        ("crashes", total.crashes),
        ("stale settles refused", total.stale_refused),
        ("lease expiries", total.expiries),
        ("delayed messages leased", total.delayed_leased),
        ("replies held for durability", total.gated_replies),
        ("snapshots", total.snapshots),
        ("ordering=key runs", keyed),
        ("key-blocked moments", total.key_blocked),
        ("leases below the start", total.leases_detached),
    ];
    for (what, n) in exercised {
        assert!(
            n > 0,
            "the simulation exercised no {what} over {seeds} seeds: {total:?}"
        );
    }
}

#[test]
fn the_simulation_is_deterministic() {
    let a = run(7, 300);
    let b = run(7, 300);
    assert_eq!(format!("{a:?}"), format!("{b:?}"));
}

/// The guard itself must fail when the oracle catches a bug: a deliberately broken caller that
/// acks with a stale generation and expects success trips the checks.
#[test]
fn the_oracle_catches_a_wrong_answer() {
    let r = std::panic::catch_unwind(|| {
        let mut sim = Sim::new(1);
        sim.pump();
        sim.confirm(sim.writes.len());
        while sim.held[0].is_empty() {
            sim.publish();
            sim.load();
            sim.lease(0, 1, 1_000);
            sim.confirm(sim.writes.len() - sim.unconfirmed_from);
        }
        let h = sim.held[0][0];
        // Pretend the engine had answered a lease of the same message to consumer 1 now.
        let l = Lease {
            offset: Offset(h.offset),
            id: h.id,
            generation: Generation(h.gen + 1),
            attempt: h.attempt + 1,
            expiry_ms: sim.now + 1_000,
            first_delivery_ms: sim.now,
        };
        let at = sim.now;
        sim.check_grant(1, &l, at);
    });
    let msg = r.expect_err("two valid leases must be caught");
    let text = msg.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(text.contains("two valid leases"), "{text}");
}

#[test]
fn distinct_ids_only_once() {
    // Sanity of the oracle's bookkeeping: ids are unique per first copy.
    let mut sim = Sim::new(3);
    for _ in 0..50 {
        sim.publish();
    }
    let ids: HashSet<MessageId> = sim.copies.values().map(|c| c.id).collect();
    assert_eq!(ids.len(), sim.copies.len());
}
