//! What a handler knows of the connection its request arrived on, and what it tells it: where
//! the connection's work went ([`Affinity`]), which decides whether the connection moves to
//! another shard (see `crate::connection`).

use std::cell::Cell;
use std::net::SocketAddr;

use kafka_protocol::messages::ApiKey;
use strand_protocol::types::ShardId;

/// The connection a request arrived on.
pub(crate) struct ConnInfo {
    /// Index of the listener in `Shard::listeners`.
    pub(crate) listener: usize,
    pub(crate) peer: Option<SocketAddr>,
    /// Where its work goes, and whether it may move to that shard.
    pub(crate) affinity: Affinity,
    /// Ids of the fetch sessions it used (most recent last, at most [`MAX_CONN_SESSIONS`]):
    /// they move with it to another shard.
    pub(crate) sessions: std::cell::RefCell<Vec<i32>>,
    /// Set by [`Self::hang_up`].
    hang_up: Cell<bool>,
}

/// Fetch sessions a connection carries along when it moves; clients use one per connection.
pub(crate) const MAX_CONN_SESSIONS: usize = 4;

impl ConnInfo {
    pub(crate) fn new(
        listener: usize,
        peer: Option<SocketAddr>,
        affinity: Affinity,
        sessions: Vec<i32>,
    ) -> Self {
        ConnInfo {
            listener,
            peer,
            affinity,
            sessions: std::cell::RefCell::new(sessions),
            hang_up: Cell::new(false),
        }
    }

    /// Closes the connection once the requests read so far are answered: a partition leader
    /// cut off from its replicas refused a request on it. A client asks the brokers it is
    /// connected to for metadata, and this one would name itself leader again; closed, it
    /// asks the others, which know the leader they elected.
    pub(crate) fn hang_up(&self) {
        self.hang_up.set(true);
    }

    /// Whether [`Self::hang_up`] was called.
    pub(crate) fn hung_up(&self) -> bool {
        self.hang_up.get()
    }

    /// The connection's fetch used session `id`.
    pub(crate) fn used_session(&self, id: i32) {
        let mut ids = self.sessions.borrow_mut();
        if ids.last() == Some(&id) {
            return;
        }
        ids.retain(|&i| i != id);
        if ids.len() >= MAX_CONN_SESSIONS {
            ids.remove(0);
        }
        ids.push(id);
    }
}

/// Moves one connection may make in its life: each needs a full run of requests for the new
/// shard, so this only bounds a producer that keeps switching partitions.
const MAX_MOVES: u32 = 16;

/// Requests in a row for partitions of one other shard after which a connection moves there
/// (see `crate::connection`). Moving costs one hand-over; staying costs two cross-shard hops per
/// request for the connection's life: with moves, a producer and a consumer of one partition
/// took a third less broker CPU and had a lower produce p99 than without, and peak throughput
/// did not change.
pub(crate) const MIGRATE_AFTER_REQUESTS: u32 = 8;

/// Which shard a connection's work goes to, and whether it may move there (see `crate::connection`).
pub(crate) struct Affinity {
    /// Requests in a row for partitions of `target` needed to move (at least 1).
    after: u32,
    /// It used an API whose state stays on this shard, or an acks=0 produce.
    pinned: Cell<bool>,
    target: Cell<Option<ShardId>>,
    streak: Cell<u32>,
    /// Moves this connection made before (it came from another shard).
    pub(crate) moves: u32,
}

impl Affinity {
    pub(crate) fn new(after: u32, moves: u32) -> Self {
        Affinity {
            after,
            pinned: Cell::new(false),
            target: Cell::new(None),
            streak: Cell::new(0),
            moves,
        }
    }

    /// A request of `api` arrived. Produce and fetch requests report their shards with
    /// [`Self::produced`] and [`Self::fetched`]; the other APIs allowed here keep no state on the
    /// connection's shard. Anything else pins the connection.
    pub(crate) fn request(&self, api: ApiKey) {
        match api {
            ApiKey::Produce
            | ApiKey::Fetch
            | ApiKey::ApiVersions
            | ApiKey::Metadata
            | ApiKey::InitProducerId
            | ApiKey::ListOffsets
            | ApiKey::OffsetForLeaderEpoch
            | ApiKey::FindCoordinator
            | ApiKey::DescribeCluster => {}
            _ => self.pinned.set(true),
        }
    }

    /// A produce request with `acks` went to partitions of these shards.
    pub(crate) fn produced(&self, shards: impl IntoIterator<Item = ShardId>, acks: i16) {
        if acks == 0 {
            self.pinned.set(true);
            return;
        }
        self.worked_on(shards);
    }

    /// A fetch request read partitions of these shards. A fetch session (KIP-227) the
    /// connection uses moves with it ([`ConnInfo::used_session`]).
    pub(crate) fn fetched(&self, shards: impl IntoIterator<Item = ShardId>) {
        self.worked_on(shards);
    }

    fn worked_on(&self, shards: impl IntoIterator<Item = ShardId>) {
        let mut shards = shards.into_iter();
        let (Some(first), None) = (shards.next(), shards.next()) else {
            // None (every partition refused) or several shards: no single place to be.
            self.streak.set(0);
            return;
        };
        if self.target.get() == Some(first) {
            self.streak.set(self.streak.get().saturating_add(1));
        } else {
            self.target.set(Some(first));
            self.streak.set(1);
        }
    }

    /// The shard this connection, now on `here`, should move to now, if any (`moves_available`:
    /// whether this process can hand connections over at all).
    pub(crate) fn move_to(&self, here: ShardId, moves_available: bool) -> Option<ShardId> {
        let target = self.target.get()?;
        (!self.pinned.get()
            && moves_available
            && target != here
            && self.streak.get() >= self.after
            && self.moves < MAX_MOVES)
            .then_some(target)
    }

    /// Stay on this shard for good (a move failed).
    pub(crate) fn pin(&self) {
        self.pinned.set(true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HERE: ShardId = ShardId(0);
    const THERE: ShardId = ShardId(1);

    #[test]
    fn a_run_of_produce_requests_for_one_other_shard_moves_the_connection() {
        let a = Affinity::new(3, 0);
        a.request(ApiKey::ApiVersions);
        a.request(ApiKey::Metadata);
        a.request(ApiKey::InitProducerId);
        for _ in 0..2 {
            a.request(ApiKey::Produce);
            a.produced([THERE], -1);
            assert_eq!(a.move_to(HERE, true), None, "not before the run is long enough");
        }
        a.produced([THERE], 1);
        assert_eq!(a.move_to(HERE, true), Some(THERE));
        // Already on the owner: nowhere to go.
        assert_eq!(a.move_to(THERE, true), None);
    }

    #[test]
    fn fetches_count_like_produce_requests() {
        let a = Affinity::new(3, 0);
        a.request(ApiKey::ListOffsets);
        a.request(ApiKey::Fetch);
        a.fetched([THERE]);
        a.produced([THERE], 1);
        assert_eq!(a.move_to(HERE, true), None);
        a.request(ApiKey::Fetch);
        a.fetched([THERE]);
        assert_eq!(a.move_to(HERE, true), Some(THERE));
    }

    #[test]
    fn mixed_or_changing_shards_restart_the_run() {
        let a = Affinity::new(2, 0);
        a.produced([THERE], -1);
        a.produced([HERE, THERE], -1);
        a.produced([THERE], -1);
        assert_eq!(
            a.move_to(HERE, true),
            None,
            "a request for two shards broke the run"
        );
        a.produced([ShardId(2)], -1);
        a.produced([THERE], -1);
        assert_eq!(
            a.move_to(HERE, true),
            None,
            "a request for a third shard broke the run"
        );
        a.produced([THERE], -1);
        assert_eq!(a.move_to(HERE, true), Some(THERE));
        a.produced(std::iter::empty(), -1);
        assert_eq!(
            a.move_to(HERE, true),
            None,
            "a request whose partitions were all refused"
        );
    }

    #[test]
    fn state_on_this_shard_acks_0_or_a_failed_move_keep_the_connection() {
        for api in [
            ApiKey::OffsetCommit,
            ApiKey::ShareFetch,
            ApiKey::ShareAcknowledge,
            ApiKey::JoinGroup,
        ] {
            let a = Affinity::new(1, 0);
            a.request(api);
            a.produced([THERE], -1);
            assert_eq!(a.move_to(HERE, true), None, "{api:?} pins the connection");
        }
        let a = Affinity::new(1, 0);
        a.produced([THERE], 0);
        a.produced([THERE], -1);
        assert_eq!(a.move_to(HERE, true), None, "acks=0 pins the connection");
        let a = Affinity::new(1, 0);
        a.produced([THERE], -1);
        a.pin();
        assert_eq!(a.move_to(HERE, true), None, "a failed move pins the connection");
        let a = Affinity::new(1, MAX_MOVES);
        a.produced([THERE], -1);
        assert_eq!(
            a.move_to(HERE, true),
            None,
            "a connection moves at most MAX_MOVES times"
        );
    }
}
