//! Deadlines of the coordinator, keyed so that rescheduling replaces the previous deadline.

use std::collections::{BTreeSet, HashMap};

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum TimerKey {
    /// A classic member's session (or, for a new member, its join timeout).
    ClassicHeartbeat { group: String, member: String },
    /// A member id handed out with MEMBER_ID_REQUIRED that has not joined yet.
    ClassicPending { group: String, member: String },
    /// The end of the join phase (rebalance timeout, or one step of the initial delay).
    ClassicJoin { group: String },
    /// Members that got a JoinGroup answer but have not sent SyncGroup yet.
    ClassicSync { group: String },
    /// A KIP-848 member's session.
    ConsumerSession { group: String, member: String },
    /// A KIP-848 member that must revoke partitions within its rebalance timeout.
    ConsumerRevocation { group: String, member: String },
    /// The periodic expiration of committed offsets.
    OffsetsExpiration,
}

#[derive(Default)]
pub(crate) struct Timers {
    deadlines: HashMap<TimerKey, i64>,
    queue: BTreeSet<(i64, TimerKey)>,
}

impl Timers {
    pub(crate) fn schedule(&mut self, key: TimerKey, deadline: i64) {
        if let Some(old) = self.deadlines.insert(key.clone(), deadline) {
            self.queue.remove(&(old, key.clone()));
        }
        self.queue.insert((deadline, key));
    }

    pub(crate) fn cancel(&mut self, key: &TimerKey) {
        if let Some(old) = self.deadlines.remove(key) {
            self.queue.remove(&(old, key.clone()));
        }
    }

    pub(crate) fn deadline(&self, key: &TimerKey) -> Option<i64> {
        self.deadlines.get(key).copied()
    }

    /// The earliest timer due at `now`, removed.
    pub(crate) fn pop_due(&mut self, now: i64) -> Option<TimerKey> {
        let first = self.queue.first()?.clone();
        if first.0 > now {
            return None;
        }
        self.queue.remove(&first);
        self.deadlines.remove(&first.1);
        Some(first.1)
    }

    pub(crate) fn next_deadline(&self) -> Option<i64> {
        self.queue.first().map(|(d, _)| *d)
    }

    /// Cancels every timer of `group`.
    pub(crate) fn cancel_group(&mut self, group: &str) {
        let keys: Vec<TimerKey> = self
            .deadlines
            .keys()
            .filter(|k| match k {
                TimerKey::ClassicHeartbeat { group: g, .. }
                | TimerKey::ClassicPending { group: g, .. }
                | TimerKey::ClassicJoin { group: g }
                | TimerKey::ClassicSync { group: g }
                | TimerKey::ConsumerSession { group: g, .. }
                | TimerKey::ConsumerRevocation { group: g, .. } => g == group,
                TimerKey::OffsetsExpiration => false,
            })
            .cloned()
            .collect();
        for k in keys {
            self.cancel(&k);
        }
    }
}
