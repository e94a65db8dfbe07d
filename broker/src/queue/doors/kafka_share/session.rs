//! KIP-932 share sessions, sans-I/O: which partitions a share consumer (group, member) fetches
//! from, and the epoch that orders its ShareFetch / ShareAcknowledge requests.
//!
//! | request epoch | ShareFetch | ShareAcknowledge |
//! |---|---|---|
//! | 0 | full fetch: replaces any session of the member (its acquired records are released: a client opens a new session after losing its connection, and Kafka releases a session's records when its connection closes), new session at epoch 1; acknowledgements refused (INVALID_REQUEST) | INVALID_SHARE_SESSION_EPOCH |
//! | 1..=i32::MAX | incremental: SHARE_SESSION_NOT_FOUND / INVALID_SHARE_SESSION_EPOCH unless it is the session's epoch; adds and forgets partitions; epoch + 1 (wrapping to 1) | same checks; epoch + 1 |
//! | -1 | final: no partitions may be added or forgotten (INVALID_REQUEST); the session closes (its records are released) | the session closes |
//!
//! Forgetting a partition (a rebalance moved it) does not release the member's records there:
//! the consumer still acknowledges them. The session remembers every partition the member
//! fetched from (`held`), so the final request releases those records too.
//!
//! Sessions live on the shard whose connection opened them (a consumer keeps one connection to
//! the broker), at most `max_sessions` per shard (SHARE_SESSION_LIMIT_REACHED beyond; idle
//! sessions are evicted after `idle_timeout_ms`). [`SessionsHost`] keeps a shard's sessions.

use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};
use std::rc::Rc;

use futures::future::LocalBoxFuture;
use futures::FutureExt;
use kafka_protocol::ResponseError;
use strand_protocol::types::TopicId;

use crate::shard::service::Service;

/// A partition of a share session.
pub(crate) type SharePartition = (TopicId, i32);

#[derive(Debug)]
struct Session {
    epoch: i32,
    partitions: BTreeSet<SharePartition>,
    /// Every partition fetched from in this session (and the sessions it replaced): where the
    /// member may hold records.
    held: BTreeSet<SharePartition>,
    last_used_ms: i64,
    /// The member left its group: it may still acknowledge and close, not acquire.
    gone: bool,
}

/// What a request did to the member's session.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct SessionUpdate {
    /// Partitions to fetch from now (empty for a final request).
    pub(crate) partitions: Vec<SharePartition>,
    /// The session closed (final request, or a full fetch replaced an older session): release
    /// the member's acquired records in these partitions.
    pub(crate) release: Vec<SharePartition>,
}

#[derive(Debug)]
pub(crate) struct ShareSessions {
    sessions: HashMap<(String, String), Session>,
    max_sessions: usize,
    idle_timeout_ms: i64,
}

fn next_epoch(e: i32) -> i32 {
    if e == i32::MAX {
        1
    } else {
        e + 1
    }
}

impl ShareSessions {
    pub(crate) fn new(max_sessions: usize, idle_timeout_ms: i64) -> Self {
        ShareSessions {
            sessions: HashMap::new(),
            max_sessions,
            idle_timeout_ms,
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.sessions.len()
    }

    /// A ShareFetch with `epoch`, adding `add` and removing `forget`; `has_acks` says whether it
    /// carries acknowledgements.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn fetch(
        &mut self,
        group: &str,
        member: &str,
        epoch: i32,
        add: &[SharePartition],
        forget: &[SharePartition],
        has_acks: bool,
        now_ms: i64,
    ) -> Result<SessionUpdate, ResponseError> {
        let key = (group.to_owned(), member.to_owned());
        match epoch {
            0 => {
                if has_acks {
                    return Err(ResponseError::InvalidRequest);
                }
                let old = self.sessions.remove(&key);
                if old.is_none() {
                    self.evict_idle(now_ms);
                    if self.sessions.len() >= self.max_sessions {
                        return Err(ResponseError::ShareSessionLimitReached);
                    }
                }
                let partitions: BTreeSet<SharePartition> = add.iter().copied().collect();
                // A new session replaces the member's old one (a client does that after losing
                // its connection; Kafka releases a session's records when its connection closes).
                let held = partitions.clone();
                let update = SessionUpdate {
                    partitions: partitions.iter().copied().collect(),
                    release: old.map(|s| s.held.into_iter().collect()).unwrap_or_default(),
                };
                self.sessions.insert(
                    key,
                    Session {
                        epoch: 1,
                        partitions,
                        held,
                        last_used_ms: now_ms,
                        gone: false,
                    },
                );
                Ok(update)
            }
            -1 => {
                if !add.is_empty() || !forget.is_empty() {
                    return Err(ResponseError::InvalidRequest);
                }
                let s = self
                    .sessions
                    .remove(&key)
                    .ok_or(ResponseError::ShareSessionNotFound)?;
                Ok(SessionUpdate {
                    partitions: Vec::new(),
                    release: s.held.into_iter().collect(),
                })
            }
            e if e > 0 => {
                let s = self
                    .sessions
                    .get_mut(&key)
                    .ok_or(ResponseError::ShareSessionNotFound)?;
                if s.epoch != e {
                    return Err(ResponseError::InvalidShareSessionEpoch);
                }
                s.epoch = next_epoch(e);
                s.last_used_ms = now_ms;
                for p in forget {
                    s.partitions.remove(p);
                }
                s.partitions.extend(add.iter().copied());
                s.held.extend(add.iter().copied());
                Ok(SessionUpdate {
                    partitions: if s.gone {
                        Vec::new()
                    } else {
                        s.partitions.iter().copied().collect()
                    },
                    // Forgetting a partition keeps the member's acquired records (Kafka): a
                    // consumer that loses a partition in a rebalance still acknowledges them.
                    release: Vec::new(),
                })
            }
            _ => Err(ResponseError::InvalidShareSessionEpoch),
        }
    }

    /// A ShareAcknowledge with `epoch`: checks (and advances) the session; a final request
    /// closes it and returns the partitions whose records to release.
    pub(crate) fn acknowledge(
        &mut self,
        group: &str,
        member: &str,
        epoch: i32,
        now_ms: i64,
    ) -> Result<Vec<SharePartition>, ResponseError> {
        let key = (group.to_owned(), member.to_owned());
        match epoch {
            -1 => {
                let s = self
                    .sessions
                    .remove(&key)
                    .ok_or(ResponseError::ShareSessionNotFound)?;
                Ok(s.held.into_iter().collect())
            }
            e if e > 0 => {
                let s = self
                    .sessions
                    .get_mut(&key)
                    .ok_or(ResponseError::ShareSessionNotFound)?;
                if s.epoch != e {
                    return Err(ResponseError::InvalidShareSessionEpoch);
                }
                s.epoch = next_epoch(e);
                s.last_used_ms = now_ms;
                Ok(Vec::new())
            }
            _ => Err(ResponseError::InvalidShareSessionEpoch),
        }
    }

    /// A member left its group: its session (if any) may acknowledge and close, but acquires
    /// nothing more.
    pub(crate) fn member_gone(&mut self, group: &str, member: &str) {
        if let Some(s) = self.sessions.get_mut(&(group.to_owned(), member.to_owned())) {
            s.gone = true;
        }
    }

    /// Drops sessions idle longer than the timeout (their members' locks expire on their own).
    fn evict_idle(&mut self, now_ms: i64) {
        let timeout = self.idle_timeout_ms;
        self.sessions
            .retain(|_, s| now_ms.saturating_sub(s.last_used_ms) <= timeout);
    }
}

/// Share sessions one shard keeps (KIP-932 `group.share.max.share.sessions` is per broker).
const SHARE_SESSIONS_PER_SHARD: usize = 2_000;
/// A share session unused this long may be evicted to make room for a new one.
const SHARE_SESSION_IDLE_MS: i64 = 120_000;

/// The share sessions of the connections on one shard, and their service: a member gone from
/// its group ([`MemberGone`], sent to every shard by its group's coordinator).
pub(crate) struct SessionsHost {
    pub(crate) sessions: RefCell<ShareSessions>,
}

impl SessionsHost {
    pub(crate) fn new() -> Self {
        SessionsHost {
            sessions: RefCell::new(ShareSessions::new(
                SHARE_SESSIONS_PER_SHARD,
                SHARE_SESSION_IDLE_MS,
            )),
        }
    }
}

/// Member `member` of share group `group` is gone: its sessions acquire nothing more.
pub(crate) struct MemberGone {
    pub(crate) group: String,
    pub(crate) member: String,
}

impl Service for SessionsHost {
    type Request = MemberGone;
    type Response = ();

    fn start(self: Rc<Self>, gone: MemberGone) -> LocalBoxFuture<'static, ()> {
        self.sessions.borrow_mut().member_gone(&gone.group, &gone.member);
        async {}.boxed_local()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(n: u128) -> TopicId {
        TopicId(uuid::Uuid::from_u128(n))
    }

    #[test]
    fn epochs_follow_kip_932() {
        let mut s = ShareSessions::new(10, 60_000);
        let p0 = (t(1), 0);
        let p1 = (t(1), 1);
        // Incremental or final without a session.
        assert_eq!(
            s.fetch("g", "m", 1, &[], &[], false, 0),
            Err(ResponseError::ShareSessionNotFound)
        );
        assert_eq!(
            s.fetch("g", "m", -1, &[], &[], false, 0),
            Err(ResponseError::ShareSessionNotFound)
        );
        assert_eq!(
            s.acknowledge("g", "m", 1, 0),
            Err(ResponseError::ShareSessionNotFound)
        );
        // A full fetch cannot carry acknowledgements.
        assert_eq!(
            s.fetch("g", "m", 0, &[p0], &[], true, 0),
            Err(ResponseError::InvalidRequest)
        );
        let u = s.fetch("g", "m", 0, &[p0], &[], false, 0).unwrap();
        assert_eq!(u.partitions, vec![p0]);
        assert!(u.release.is_empty());
        // Wrong epoch, then the right one (which adds p1).
        assert_eq!(
            s.fetch("g", "m", 2, &[], &[], false, 0),
            Err(ResponseError::InvalidShareSessionEpoch)
        );
        let u = s.fetch("g", "m", 1, &[p1], &[], true, 0).unwrap();
        assert_eq!(u.partitions, vec![p0, p1]);
        // ShareAcknowledge shares the epoch sequence; epoch 0 is not for acknowledgements.
        assert_eq!(
            s.acknowledge("g", "m", 0, 0),
            Err(ResponseError::InvalidShareSessionEpoch)
        );
        assert_eq!(
            s.acknowledge("g", "m", 1, 0),
            Err(ResponseError::InvalidShareSessionEpoch)
        );
        assert_eq!(s.acknowledge("g", "m", 2, 0), Ok(vec![]));
        // Forgetting a partition releases nothing: the member may still acknowledge there.
        let u = s.fetch("g", "m", 3, &[], &[p0], false, 0).unwrap();
        assert_eq!((u.partitions, u.release), (vec![p1], vec![]));
        // A final fetch may not change partitions; then it closes and releases, also in the
        // forgotten partition.
        assert_eq!(
            s.fetch("g", "m", -1, &[p0], &[], false, 0),
            Err(ResponseError::InvalidRequest)
        );
        let u = s.fetch("g", "m", -1, &[], &[], true, 0).unwrap();
        assert_eq!((u.partitions, u.release), (vec![], vec![p0, p1]));
        assert_eq!(s.len(), 0);
        // A full fetch over an existing session replaces it and releases the old partitions,
        // forgotten ones included.
        s.fetch("g", "m", 0, &[p0], &[], false, 0).unwrap();
        s.fetch("g", "m", 1, &[p1], &[p0], false, 0).unwrap();
        let u = s.fetch("g", "m", 0, &[p1], &[], false, 0).unwrap();
        assert_eq!((u.partitions, u.release), (vec![p1], vec![p0, p1]));
        // A member that left may acknowledge and close, not acquire.
        s.member_gone("g", "m");
        let u = s.fetch("g", "m", 1, &[], &[], true, 0).unwrap();
        assert!(u.partitions.is_empty());
        assert_eq!(s.acknowledge("g", "m", -1, 0), Ok(vec![p1]));
        assert_eq!(
            s.fetch("g", "m", -7, &[], &[], false, 0),
            Err(ResponseError::InvalidShareSessionEpoch)
        );
    }

    #[test]
    fn epoch_wraps_and_sessions_are_bounded() {
        assert_eq!(next_epoch(i32::MAX), 1);
        let mut s = ShareSessions::new(2, 1_000);
        s.fetch("g", "a", 0, &[], &[], false, 0).unwrap();
        s.fetch("g", "b", 0, &[], &[], false, 0).unwrap();
        assert_eq!(
            s.fetch("g", "c", 0, &[], &[], false, 500),
            Err(ResponseError::ShareSessionLimitReached)
        );
        // Replacing one's own session is always possible.
        s.fetch("g", "a", 0, &[], &[], false, 500).unwrap();
        // Idle sessions make room.
        s.fetch("g", "a", 1, &[], &[], false, 1_400).unwrap();
        s.fetch("g", "c", 0, &[], &[], false, 1_600).unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(
            s.fetch("g", "b", 1, &[], &[], false, 1_700),
            Err(ResponseError::ShareSessionNotFound)
        );
    }
}
