// A three-node openraft cluster in one thread, for the runtime `Rt` named by the including
// module: an in-memory log store and state machine (the least that openraft's storage traits
// accept) and an in-process network that calls the target node's `Raft` handle. Test-only.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::future::Future;
use std::io;
use std::ops::RangeBounds;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use openraft::error::{
    ClientWriteError, RPCError, RaftError, ReplicationClosed, StreamingError, Unreachable,
};
use openraft::network::RPCOption;
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, VoteRequest, VoteResponse,
};
use openraft::rt::AsyncRuntime as _;
use openraft::storage::{
    EntryResponder, IOFlushed, LogState, RaftLogReader, RaftLogStorage, RaftSnapshotBuilder, RaftStateMachine,
};
use openraft::type_config::alias::{
    EntryOf, LogIdOf, SnapshotMetaOf, SnapshotOf, StoredMembershipOf, VoteOf,
};
use openraft::{
    BasicNode, Config, EntryPayload, OptionalSend, Raft, RaftNetworkFactory, RaftNetworkV2, Snapshot,
    SnapshotMeta, StoredMembership,
};

openraft::declare_raft_types!(
    pub Tc:
        D = String,
        R = String,
        AsyncRuntime = Rt,
);

type Node = Raft<Tc, StateMachine>;

#[derive(Default)]
struct LogInner {
    vote: Option<VoteOf<Tc>>,
    committed: Option<LogIdOf<Tc>>,
    last_purged: Option<LogIdOf<Tc>>,
    log: BTreeMap<u64, EntryOf<Tc>>,
}

/// The log and vote, in memory; every write is "flushed" at once.
#[derive(Clone, Default)]
struct LogStore(Rc<RefCell<LogInner>>);

impl RaftLogReader<Tc> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<EntryOf<Tc>>, io::Error> {
        Ok(self.0.borrow().log.range(range).map(|(_, e)| e.clone()).collect())
    }

    async fn read_vote(&mut self) -> Result<Option<VoteOf<Tc>>, io::Error> {
        Ok(self.0.borrow().vote)
    }
}

impl RaftLogStorage<Tc> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<Tc>, io::Error> {
        let inner = self.0.borrow();
        let last = inner.log.values().next_back().map(|e| e.log_id);
        Ok(LogState {
            last_purged_log_id: inner.last_purged,
            last_log_id: last.or(inner.last_purged),
        })
    }

    async fn get_log_reader(&mut self) -> LogStore {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &VoteOf<Tc>) -> Result<(), io::Error> {
        self.0.borrow_mut().vote = Some(*vote);
        Ok(())
    }

    async fn save_committed(&mut self, committed: Option<LogIdOf<Tc>>) -> Result<(), io::Error> {
        self.0.borrow_mut().committed = committed;
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogIdOf<Tc>>, io::Error> {
        Ok(self.0.borrow().committed)
    }

    async fn append<I>(&mut self, entries: I, callback: IOFlushed<Tc>) -> Result<(), io::Error>
    where
        I: IntoIterator<Item = EntryOf<Tc>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        {
            let mut inner = self.0.borrow_mut();
            for e in entries {
                inner.log.insert(e.log_id.index, e);
            }
        }
        callback.io_completed(Ok(()));
        Ok(())
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogIdOf<Tc>>) -> Result<(), io::Error> {
        let from = last_log_id.map_or(0, |l| l.index + 1);
        let removed = self.0.borrow_mut().log.split_off(&from);
        drop(removed);
        Ok(())
    }

    async fn purge(&mut self, log_id: LogIdOf<Tc>) -> Result<(), io::Error> {
        let mut inner = self.0.borrow_mut();
        inner.last_purged = Some(log_id);
        let kept = inner.log.split_off(&(log_id.index + 1));
        inner.log = kept;
        Ok(())
    }
}

#[derive(Default)]
struct SmState {
    last_applied: Option<LogIdOf<Tc>>,
    membership: StoredMembershipOf<Tc>,
    /// The application data applied, in order.
    applied: Vec<String>,
    snapshot: Option<(SnapshotMetaOf<Tc>, Vec<String>)>,
}

/// Applies entries by appending their data to a list.
#[derive(Clone, Default)]
struct StateMachine(Rc<RefCell<SmState>>);

impl RaftSnapshotBuilder<Tc> for StateMachine {
    type SnapshotData = Vec<String>;

    async fn build_snapshot(&mut self) -> Result<SnapshotOf<Tc, Vec<String>>, io::Error> {
        let mut s = self.0.borrow_mut();
        let meta = SnapshotMeta {
            last_log_id: s.last_applied,
            last_membership: s.membership.clone(),
        };
        let data = s.applied.clone();
        s.snapshot = Some((meta.clone(), data.clone()));
        Ok(Snapshot { meta, snapshot: data })
    }
}

impl RaftStateMachine<Tc> for StateMachine {
    type SnapshotData = Vec<String>;
    type SnapshotBuilder = StateMachine;

    async fn applied_state(&mut self) -> Result<(Option<LogIdOf<Tc>>, StoredMembershipOf<Tc>), io::Error> {
        let s = self.0.borrow();
        Ok((s.last_applied, s.membership.clone()))
    }

    async fn apply<Strm>(&mut self, mut entries: Strm) -> Result<(), io::Error>
    where
        Strm: Stream<Item = Result<EntryResponder<Tc>, io::Error>> + Unpin + OptionalSend,
    {
        while let Some(item) = entries.next().await {
            let (entry, responder) = item?;
            let response = {
                let mut s = self.0.borrow_mut();
                s.last_applied = Some(entry.log_id);
                match entry.payload {
                    EntryPayload::Blank => String::new(),
                    EntryPayload::Normal(data) => {
                        s.applied.push(data.clone());
                        data
                    }
                    EntryPayload::Membership(m) => {
                        s.membership = StoredMembership::new(Some(entry.log_id), m);
                        String::new()
                    }
                }
            };
            if let Some(r) = responder {
                r.send(response);
            }
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> StateMachine {
        self.clone()
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMetaOf<Tc>,
        snapshot: Vec<String>,
    ) -> Result<(), io::Error> {
        let mut s = self.0.borrow_mut();
        s.last_applied = meta.last_log_id;
        s.membership = meta.last_membership.clone();
        s.applied = snapshot.clone();
        s.snapshot = Some((meta.clone(), snapshot));
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<SnapshotOf<Tc, Vec<String>>>, io::Error> {
        Ok(self
            .0
            .borrow()
            .snapshot
            .clone()
            .map(|(meta, snapshot)| Snapshot { meta, snapshot }))
    }
}

/// Delivers RPCs by calling the target's `Raft` handle, after `latency` of the runtime's time.
#[derive(Clone, Default)]
struct Router {
    nodes: Rc<RefCell<BTreeMap<u64, Node>>>,
    latency: Duration,
}

struct Conn {
    target: u64,
    router: Router,
}

impl RaftNetworkFactory<Tc> for Router {
    type Network = Conn;

    async fn new_client(&mut self, target: u64, _node: &BasicNode) -> Conn {
        Conn {
            target,
            router: self.clone(),
        }
    }
}

impl Conn {
    async fn target(&self) -> Result<Node, Unreachable<Tc>> {
        if !self.router.latency.is_zero() {
            Rt::sleep(self.router.latency).await;
        }
        let node = self.router.nodes.borrow().get(&self.target).cloned();
        node.ok_or_else(|| Unreachable::from_string(format!("no node {}", self.target)))
    }
}

impl RaftNetworkV2<Tc> for Conn {
    type SnapshotData = Vec<String>;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<Tc>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<Tc>, RPCError<Tc>> {
        let node = self.target().await?;
        node.append_entries(rpc)
            .await
            .map_err(|e| RPCError::Unreachable(Unreachable::new(&e)))
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<Tc>,
        _option: RPCOption,
    ) -> Result<VoteResponse<Tc>, RPCError<Tc>> {
        let node = self.target().await?;
        node.vote(rpc)
            .await
            .map_err(|e| RPCError::Unreachable(Unreachable::new(&e)))
    }

    async fn full_snapshot(
        &mut self,
        vote: VoteOf<Tc>,
        snapshot: SnapshotOf<Tc, Vec<String>>,
        _cancel: impl Future<Output = ReplicationClosed> + OptionalSend + 'static,
        _option: RPCOption,
    ) -> Result<SnapshotResponse<Tc>, StreamingError<Tc>> {
        let node = self.target().await?;
        node.install_full_snapshot(vote, snapshot)
            .await
            .map_err(|e| StreamingError::Unreachable(Unreachable::new(&e)))
    }
}

/// Heartbeats every 50 ms, elections after 150–300 ms of silence.
fn test_config() -> Arc<Config> {
    let config = Config {
        heartbeat_interval: 50,
        election_timeout_min: 150,
        election_timeout_max: 300,
        ..Default::default()
    };
    Arc::new(config.validate().expect("a valid config"))
}

/// Waits until `node` sees a leader other than `not`, then until that leader's lease holds;
/// returns the leader.
async fn await_leader(
    nodes: &BTreeMap<u64, Node>,
    via: u64,
    not: Option<u64>,
    wait_timeout: Duration,
) -> u64 {
    let metrics = nodes[&via]
        .wait(Some(wait_timeout))
        .metrics(
            |m| m.current_leader.is_some() && m.current_leader != not,
            "a leader is elected",
        )
        .await
        .expect("a leader within the timeout");
    let leader = metrics.current_leader.expect("waited for it");
    // A new leader takes writes once a quorum has acknowledged it (its lease).
    nodes[&leader]
        .wait(Some(wait_timeout))
        .leader_with_quorum_acked(None, "the leader's lease")
        .await
        .expect("a quorum acknowledges the leader");
    leader
}

/// Writes `data` through `leader`; returns the entry's index. A leader whose lease lapsed (a
/// busy machine can stall a real-time run) or that lost its office answers ForwardToLeader
/// before appending anything: find the leader again and retry, as a client would.
async fn write(nodes: &BTreeMap<u64, Node>, leader: &mut u64, data: &str, wait_timeout: Duration) -> u64 {
    for _ in 0..100 {
        match nodes[&*leader].client_write(data.to_string()).await {
            Ok(response) => {
                assert_eq!(response.data, data, "the state machine's response comes back");
                return response.log_id.index;
            }
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(_))) => {
                Rt::sleep(Duration::from_millis(50)).await;
                *leader = await_leader(nodes, *leader, None, wait_timeout).await;
            }
            Err(e) => panic!("the write of {data:?} failed: {e}"),
        }
    }
    panic!("no leader took the write of {data:?}");
}

/// Waits until every node in `nodes` has applied `index`; returns whom each then follows.
async fn await_applied(
    nodes: &BTreeMap<u64, Node>,
    index: u64,
    wait_timeout: Duration,
) -> BTreeMap<u64, Option<u64>> {
    let mut followed = BTreeMap::new();
    for (id, raft) in nodes {
        let m = raft
            .wait(Some(wait_timeout))
            .applied_index_at_least(Some(index), "the writes are applied")
            .await
            .expect("every node applies the writes");
        followed.insert(*id, m.current_leader);
    }
    followed
}

/// What a smoke run observed.
#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    leader: u64,
    /// Whom each node followed once it had applied the writes.
    followed: BTreeMap<u64, Option<u64>>,
    /// Each node's applied data, by node id.
    applied: BTreeMap<u64, Vec<String>>,
}

/// Starts three nodes, initializes the cluster on node 1, waits for a leader, writes three
/// entries through it and waits until every node has applied them. `wait_timeout` bounds each
/// wait in the runtime's time.
async fn smoke(latency: Duration, wait_timeout: Duration) -> Outcome {
    let config = test_config();
    let router = Router {
        latency,
        ..Router::default()
    };
    let mut machines = BTreeMap::new();
    for id in 1..=3u64 {
        let sm = StateMachine::default();
        let raft = Raft::new(
            id,
            config.clone(),
            router.clone(),
            LogStore::default(),
            sm.clone(),
        )
        .await
        .expect("a node starts");
        router.nodes.borrow_mut().insert(id, raft);
        machines.insert(id, sm);
    }
    let nodes: BTreeMap<u64, Node> = router.nodes.borrow().clone();

    nodes[&1]
        .initialize(BTreeMap::from([1u64, 2, 3].map(|id| (id, BasicNode::new("")))))
        .await
        .expect("the cluster initializes");
    let mut leader = await_leader(&nodes, 1, None, wait_timeout).await;
    let mut last_index = 0;
    for data in ["a", "b", "c"] {
        last_index = write(&nodes, &mut leader, data, wait_timeout).await;
    }
    let followed = await_applied(&nodes, last_index, wait_timeout).await;
    let applied = machines
        .iter()
        .map(|(id, sm)| (*id, sm.0.borrow().applied.clone()))
        .collect();

    for raft in nodes.values() {
        raft.shutdown().await.expect("a clean shutdown");
    }
    router.nodes.borrow_mut().clear();
    Outcome {
        leader,
        followed,
        applied,
    }
}

fn assert_all_applied(outcome: &Outcome) {
    let expected: Vec<String> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
    assert_eq!(outcome.applied.len(), 3);
    for (id, data) in &outcome.applied {
        assert_eq!(data, &expected, "node {id} applied the writes in order");
    }
}
