//! Incremental fetch sessions (KIP-227), sans-I/O.
//!
//! A client that opens a session (epoch 0) sends its partition list once; later fetches carry
//! only changes (epoch n), and the broker answers only with partitions that have something new:
//! records, an error, or a moved high watermark, last stable offset or log start offset.
//!
//! Sessions live in the cache of the shard that served the fetch; a client that reconnects to
//! another shard gets FETCH_SESSION_ID_NOT_FOUND and starts a new session, as Kafka clients do
//! after any session loss. The cache is bounded; the least recently used session is evicted.
//! A connection that moves to another shard (see `crate::connection`) takes the sessions it used
//! along ([`FetchSessionCache::take`], [`FetchSessionCache::adopt`]). Session ids of different
//! shards start far apart, and a moved session whose id the other shard already uses is
//! dropped there: the client is told it is unknown and opens a new one.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

use futures::future::LocalBoxFuture;
use futures::FutureExt;

use kafka_protocol::ResponseError;
use strand_protocol::types::{ShardId, TopicId};

use crate::metadata::MetadataDelta;
use crate::shard::service::ShardHooks;

/// A partition in a session, with what the client was last told about it.
#[derive(Debug, Clone)]
pub(crate) struct SessionPartition {
    /// Shared by the request's partitions of this topic.
    pub(crate) topic: Arc<str>,
    pub(crate) topic_id: TopicId,
    pub(crate) partition: i32,
    pub(crate) fetch_offset: i64,
    pub(crate) max_bytes: i32,
    pub(crate) current_leader_epoch: i32,
    last_hw: i64,
    last_lso: i64,
    last_log_start: i64,
}

impl SessionPartition {
    pub(crate) fn new(
        topic: impl Into<Arc<str>>,
        topic_id: TopicId,
        partition: i32,
        fetch_offset: i64,
        max_bytes: i32,
        current_leader_epoch: i32,
    ) -> Self {
        SessionPartition {
            topic: topic.into(),
            topic_id,
            partition,
            fetch_offset,
            max_bytes,
            current_leader_epoch,
            last_hw: -1,
            last_lso: -1,
            last_log_start: -1,
        }
    }
}

/// What the broker observed for a partition in this fetch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Observed {
    pub(crate) error: i16,
    pub(crate) high_watermark: i64,
    pub(crate) last_stable_offset: i64,
    pub(crate) log_start_offset: i64,
    pub(crate) has_records: bool,
}

struct Session {
    epoch: i32,
    partitions: Vec<SessionPartition>,
    last_used: u64,
}

/// A session on its way to another shard, with the connection that uses it.
#[derive(Debug)]
pub(crate) struct MovedSession {
    id: i32,
    epoch: i32,
    partitions: Vec<SessionPartition>,
}

impl MovedSession {
    pub(crate) fn id(&self) -> i32 {
        self.id
    }
}

/// How to serve one fetch request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SessionMode {
    /// No session: answer every requested partition; session id 0.
    Sessionless,
    /// A new session: answer every partition; report its id.
    Full { session_id: i32 },
    /// An existing session: answer only partitions with news.
    Incremental { session_id: i32 },
}

/// The per-shard session cache.
pub(crate) struct FetchSessionCache {
    max_sessions: usize,
    sessions: HashMap<i32, Session>,
    tick: u64,
    next_id: u32,
}

/// A requested partition change (add or update) in an incremental fetch.
pub(crate) type Requested = SessionPartition;

impl FetchSessionCache {
    pub(crate) fn new(shard: ShardId, max_sessions: usize) -> Self {
        FetchSessionCache {
            max_sessions,
            sessions: HashMap::new(),
            tick: 0,
            // Spread ids of different shards apart; any non-zero positive id is valid.
            next_id: u32::from(shard.0) << 20,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.sessions.len()
    }

    fn new_id(&mut self) -> i32 {
        loop {
            self.next_id = self.next_id.wrapping_add(1) & 0x7fff_ffff;
            let id = self.next_id as i32;
            if id != 0 && !self.sessions.contains_key(&id) {
                return id;
            }
        }
    }

    /// Starts serving a fetch: decides the mode and returns the partitions to read, in order.
    /// `requested` are the partitions in the request; `forgotten` those it removes.
    pub(crate) fn begin(
        &mut self,
        session_id: i32,
        epoch: i32,
        requested: Vec<Requested>,
        forgotten: &[(String, i32)],
    ) -> Result<(SessionMode, Vec<SessionPartition>), ResponseError> {
        self.tick += 1;
        match (session_id, epoch) {
            (_, -1) => {
                // FINAL_EPOCH: a sessionless full fetch, closing the session if one was named.
                if session_id != 0 {
                    self.sessions.remove(&session_id);
                }
                Ok((SessionMode::Sessionless, requested))
            }
            (_, 0) => {
                if session_id != 0 {
                    self.sessions.remove(&session_id);
                }
                if self.sessions.len() >= self.max_sessions {
                    self.evict_one();
                }
                if self.sessions.len() >= self.max_sessions {
                    return Ok((SessionMode::Sessionless, requested));
                }
                let id = self.new_id();
                self.sessions.insert(
                    id,
                    Session {
                        epoch: 1,
                        partitions: requested.clone(),
                        last_used: self.tick,
                    },
                );
                Ok((SessionMode::Full { session_id: id }, requested))
            }
            (0, _) => Err(ResponseError::InvalidFetchSessionEpoch),
            (id, e) => {
                let Some(session) = self.sessions.get_mut(&id) else {
                    return Err(ResponseError::FetchSessionIdNotFound);
                };
                if session.epoch != e {
                    return Err(ResponseError::InvalidFetchSessionEpoch);
                }
                session.epoch = if session.epoch == i32::MAX {
                    1
                } else {
                    session.epoch + 1
                };
                session.last_used = self.tick;
                for r in requested {
                    match session
                        .partitions
                        .iter_mut()
                        .find(|p| p.topic == r.topic && p.partition == r.partition)
                    {
                        Some(p) => {
                            p.fetch_offset = r.fetch_offset;
                            p.max_bytes = r.max_bytes;
                            p.current_leader_epoch = r.current_leader_epoch;
                            p.topic_id = r.topic_id;
                        }
                        None => session.partitions.push(r),
                    }
                }
                session.partitions.retain(|p| {
                    !forgotten
                        .iter()
                        .any(|(t, n)| t.as_str() == &*p.topic && *n == p.partition)
                });
                Ok((
                    SessionMode::Incremental { session_id: id },
                    session.partitions.clone(),
                ))
            }
        }
    }

    /// Records what the fetch observed and returns, per partition, whether the response must
    /// include it. In an incremental session the fetch offset the client will send next is
    /// unknown, so only what the client was told is remembered.
    ///
    /// After an incremental fetch, the partitions that answered records move to the end of the
    /// session's order, keeping their relative order, as Kafka does: a fetch reads partitions
    /// in that order until `max_bytes` is used up, so without the move the first partitions of
    /// a busy session would take every answer and starve the rest.
    pub(crate) fn finish(&mut self, mode: &SessionMode, observed: &[Observed]) -> Vec<bool> {
        let session_id = match mode {
            SessionMode::Sessionless => return vec![true; observed.len()],
            SessionMode::Full { session_id } | SessionMode::Incremental { session_id } => *session_id,
        };
        let full = matches!(mode, SessionMode::Full { .. });
        let Some(session) = self.sessions.get_mut(&session_id) else {
            return vec![true; observed.len()];
        };
        let include = session
            .partitions
            .iter_mut()
            .zip(observed)
            .map(|(p, o)| {
                let changed = o.error != 0
                    || o.has_records
                    || o.high_watermark != p.last_hw
                    || o.last_stable_offset != p.last_lso
                    || o.log_start_offset != p.last_log_start;
                p.last_hw = o.high_watermark;
                p.last_lso = o.last_stable_offset;
                p.last_log_start = o.log_start_offset;
                full || changed
            })
            .collect();
        if !full && session.partitions.len() == observed.len() && observed.iter().any(|o| o.has_records) {
            let (quiet, served): (Vec<_>, Vec<_>) = std::mem::take(&mut session.partitions)
                .into_iter()
                .zip(observed)
                .partition(|(_, o)| !o.has_records);
            session.partitions = quiet.into_iter().chain(served).map(|(p, _)| p).collect();
        }
        include
    }

    /// Removes session `id` (if it is here) to hand it to another shard.
    pub(crate) fn take(&mut self, id: i32) -> Option<MovedSession> {
        self.sessions.remove(&id).map(|s| MovedSession {
            id,
            epoch: s.epoch,
            partitions: s.partitions,
        })
    }

    /// Serves a session taken on another shard from now on, as the least recently used
    /// session's place if the cache is full. `false` if its id is taken here: the client is
    /// then told the session is unknown and opens a new one, as after an eviction.
    pub(crate) fn adopt(&mut self, moved: MovedSession) -> bool {
        if moved.id <= 0 || self.sessions.contains_key(&moved.id) || self.max_sessions == 0 {
            return false;
        }
        self.tick += 1;
        if self.sessions.len() >= self.max_sessions {
            self.evict_one();
        }
        self.sessions.insert(
            moved.id,
            Session {
                epoch: moved.epoch,
                partitions: moved.partitions,
                last_used: self.tick,
            },
        );
        true
    }

    /// Drops partitions of a deleted topic from every session.
    pub(crate) fn forget_topic(&mut self, id: TopicId) {
        for s in self.sessions.values_mut() {
            s.partitions.retain(|p| p.topic_id != id || id.is_zero());
        }
    }

    fn evict_one(&mut self) {
        if let Some((&id, _)) = self.sessions.iter().min_by_key(|(_, s)| s.last_used) {
            self.sessions.remove(&id);
        }
    }
}

/// A shard's fetch sessions: the cache, kept in step with topic deletions.
pub(crate) struct FetchSessions {
    pub(crate) cache: RefCell<FetchSessionCache>,
}

impl FetchSessions {
    /// The sessions of shard `shard` of `shards`: 1,000 per broker, at least 16 per shard.
    pub(crate) fn new(shard: ShardId, shards: u16) -> Self {
        let max_sessions = (1000 / usize::from(shards.max(1))).max(16);
        FetchSessions {
            cache: RefCell::new(FetchSessionCache::new(shard, max_sessions)),
        }
    }
}

impl ShardHooks for FetchSessions {
    fn metadata_preparing<'a>(&'a self, delta: &'a MetadataDelta) -> LocalBoxFuture<'a, ()> {
        if let MetadataDelta::DeleteTopic { id, .. } = delta {
            self.cache.borrow_mut().forget_topic(*id);
        }
        async {}.boxed_local()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(t: &str, p: i32, offset: i64) -> SessionPartition {
        SessionPartition::new(t, TopicId::ZERO, p, offset, 1 << 20, -1)
    }

    fn obs(hw: i64, records: bool) -> Observed {
        Observed {
            error: 0,
            high_watermark: hw,
            last_stable_offset: hw,
            log_start_offset: 0,
            has_records: records,
        }
    }

    #[test]
    fn a_taken_session_continues_where_it_is_adopted() {
        let mut a = FetchSessionCache::new(ShardId(0), 2);
        let mut b = FetchSessionCache::new(ShardId(1), 1);
        let (mode, _) = a.begin(0, 0, vec![part("t", 0, 5)], &[]).unwrap();
        let SessionMode::Full { session_id } = mode else {
            panic!("a full fetch opens a session: {mode:?}")
        };
        a.finish(&mode, &[obs(10, true)]);
        // b is full: the adopted session takes the place of b's least recently used one.
        let (other, _) = b.begin(0, 0, vec![part("u", 0, 0)], &[]).unwrap();
        let moved = a.take(session_id).expect("the session is on a");
        assert_eq!(a.len(), 0);
        assert!(b.adopt(moved));
        assert_eq!(b.len(), 1);
        assert!(!matches!(other, SessionMode::Full { session_id: id } if id == session_id));
        // The next epoch continues on b, with the session's partitions.
        let (mode, parts) = b.begin(session_id, 1, vec![], &[]).unwrap();
        assert_eq!(mode, SessionMode::Incremental { session_id });
        assert_eq!(parts.len(), 1);
        assert_eq!(parts[0].fetch_offset, 5);
        // a no longer knows it; an id already in use is refused.
        assert_eq!(
            a.begin(session_id, 2, vec![], &[]).unwrap_err(),
            ResponseError::FetchSessionIdNotFound
        );
        let again = b.take(session_id).unwrap();
        let (mode, _) = b.begin(0, 0, vec![part("v", 0, 0)], &[]).unwrap();
        let SessionMode::Full { session_id: taken } = mode else {
            panic!("{mode:?}")
        };
        let clash = MovedSession { id: taken, ..again };
        assert!(!b.adopt(clash));
    }

    #[test]
    fn session_lifecycle() {
        let mut c = FetchSessionCache::new(ShardId(0), 2);
        let (mode, parts) = c
            .begin(0, 0, vec![part("a", 0, 0), part("a", 1, 0)], &[])
            .unwrap();
        let SessionMode::Full { session_id } = mode else {
            panic!("{mode:?}")
        };
        assert_eq!(parts.len(), 2);
        assert_eq!(c.finish(&mode, &[obs(5, true), obs(0, false)]), vec![true, true]);

        // Incremental: nothing new on p1, new data on p0.
        let (mode, parts) = c.begin(session_id, 1, vec![part("a", 0, 5)], &[]).unwrap();
        assert_eq!(mode, SessionMode::Incremental { session_id });
        assert_eq!(parts.len(), 2, "the session still fetches both");
        assert_eq!(parts[0].fetch_offset, 5);
        assert_eq!(c.finish(&mode, &[obs(7, true), obs(0, false)]), vec![true, false]);

        // p0 answered records in an incremental fetch, so it is read after p1 from now on.
        // HW moved on p1 without data for this fetch: included.
        let (mode, parts) = c.begin(session_id, 2, vec![], &[]).unwrap();
        assert_eq!(parts.iter().map(|p| p.partition).collect::<Vec<_>>(), vec![1, 0]);
        assert_eq!(
            c.finish(&mode, &[obs(3, false), obs(7, false)]),
            vec![true, false]
        );

        // Wrong epoch, unknown id, forgotten partitions.
        assert_eq!(
            c.begin(session_id, 9, vec![], &[]).unwrap_err(),
            ResponseError::InvalidFetchSessionEpoch
        );
        assert_eq!(
            c.begin(12345, 1, vec![], &[]).unwrap_err(),
            ResponseError::FetchSessionIdNotFound
        );
        let (_, parts) = c.begin(session_id, 3, vec![], &[("a".into(), 0)]).unwrap();
        assert_eq!(parts.len(), 1);

        // Closing.
        let (mode, _) = c.begin(session_id, -1, vec![part("a", 0, 0)], &[]).unwrap();
        assert_eq!(mode, SessionMode::Sessionless);
        assert_eq!(c.len(), 0);
    }

    /// A session whose first partitions always have more data than `max_bytes` must still
    /// serve the others: the partitions that answered records go to the back of the order.
    #[test]
    fn partitions_that_answered_records_are_read_last_next_time() {
        let mut c = FetchSessionCache::new(ShardId(0), 1);
        let all: Vec<_> = (0..4).map(|p| part("t", p, 0)).collect();
        let (mode, parts) = c.begin(0, 0, all, &[]).unwrap();
        let SessionMode::Full { session_id } = mode else {
            panic!("{mode:?}")
        };
        let order = |parts: &[SessionPartition]| parts.iter().map(|p| p.partition).collect::<Vec<_>>();
        assert_eq!(order(&parts), vec![0, 1, 2, 3]);
        // A full fetch keeps the request's order (as Kafka's full fetch context does).
        c.finish(&mode, &[obs(9, true), obs(9, true), obs(0, false), obs(0, false)]);
        let (mode, parts) = c.begin(session_id, 1, vec![], &[]).unwrap();
        assert_eq!(order(&parts), vec![0, 1, 2, 3]);
        // 0 and 1 answered records: they go to the back, in their order.
        c.finish(
            &mode,
            &[obs(20, true), obs(20, true), obs(0, false), obs(5, false)],
        );
        let (mode, parts) = c.begin(session_id, 2, vec![], &[]).unwrap();
        assert_eq!(order(&parts), vec![2, 3, 0, 1]);
        // Now 2 and 0 answer; 3 and 1 come first.
        c.finish(
            &mode,
            &[obs(4, true), obs(5, false), obs(30, true), obs(20, false)],
        );
        let (mode, parts) = c.begin(session_id, 3, vec![part("t", 3, 5)], &[]).unwrap();
        assert_eq!(order(&parts), vec![3, 1, 2, 0]);
        assert_eq!(parts[0].fetch_offset, 5, "an update keeps the partition's place");
        // Nothing answered: the order stays.
        c.finish(
            &mode,
            &[obs(5, false), obs(20, false), obs(4, false), obs(30, false)],
        );
        let (_, parts) = c.begin(session_id, 4, vec![], &[]).unwrap();
        assert_eq!(order(&parts), vec![3, 1, 2, 0]);
    }

    #[test]
    fn cache_is_bounded() {
        let mut c = FetchSessionCache::new(ShardId(3), 2);
        let mut ids = Vec::new();
        for _ in 0..3 {
            let (mode, _) = c.begin(0, 0, vec![part("a", 0, 0)], &[]).unwrap();
            let SessionMode::Full { session_id } = mode else {
                panic!()
            };
            ids.push(session_id);
        }
        assert_eq!(c.len(), 2);
        assert_eq!(
            c.begin(ids[0], 1, vec![], &[]).unwrap_err(),
            ResponseError::FetchSessionIdNotFound
        );
        assert!(c.begin(ids[2], 1, vec![], &[]).is_ok());
    }
}
