//! A follower's snapshot install that its log and apply progress have overtaken.
//!
//! openraft decides to install a snapshot when the snapshot is above what the follower knows
//! committed, and queues the install behind the commands already queued; log writes and
//! applies run from cursors that can be past the snapshot by the time the install runs. These
//! tests drive one follower through openraft's public API (`append_entries`,
//! `install_full_snapshot`, as a leader would send them; there is no leader and no network) on
//! the simulation runtime, over the partition's `ReplicaStore`, with a state machine that
//! records what it is given and can hold an install back:
//!
//! - a snapshot below log entries the same leader already had written (the replication
//!   simulation's seeds 26 and 52): the install must not move openraft's log I/O cursor back;
//! - a snapshot install queued behind a command that waits, while a commit moves past the
//!   snapshot: no apply may reach the state machine before the install, and nothing may take
//!   the state machine back.
//!
//! Both exercise the patches in `third_party/openraft/STRAND-PATCHES.md`. Without them, with
//! debug assertions, the follower's Raft task panics on the log I/O cursor in both; without
//! debug assertions the cursor goes back and the follower stops applying at the snapshot (both
//! tests then fail waiting for the apply of 10). With only the first patch, the second test's
//! apply runs before the queued install and its Raft task panics on a log id openraft has
//! already forgotten (an `unwrap`, in every build).

use std::cell::{Cell, RefCell};
use std::collections::BTreeSet;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, TryStreamExt};
use openraft::async_runtime::WatchReceiver;
use openraft::raft::AppendEntriesRequest;
use openraft::storage::{EntryResponder, RaftStateMachine};
use openraft::type_config::alias::SnapshotOf;
use openraft::{
    AsyncRuntime, Config, EntryPayload, Membership, OptionalSend, Raft, SnapshotMeta, SnapshotPolicy,
    StoredMembership,
};
use strand_protocol::types::Offset;
use strand_raft::partition::local_net::{Hops, LocalNet};
use strand_raft::partition::{
    BrokerId, MemReplicaLog, PartitionLogId, PartitionRaft, PartitionSnapshot, ReplicaStore,
};
use strand_raft::rt::sim::SimJoinHandle;
use strand_raft::rt::{Sim, SimRuntime};
use strand_raft::transport::codec::{PartitionEntry, PartitionVote};

type C = PartitionRaft<SimRuntime>;
type Store = ReplicaStore<SimRuntime, MemReplicaLog>;
type Node = Raft<C, Watched>;

const FOLLOWER: BrokerId = BrokerId(2);
const LEADER: BrokerId = BrokerId(1);

/// What the state machine was given, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Given {
    /// Entries `first..=last` applied.
    Apply { first: u64, last: u64 },
    /// A snapshot up to `last` installed.
    Install { last: u64 },
}

/// The partition's state machine, recording what it is given; an install waits while the
/// gate is shut.
#[derive(Clone)]
struct Watched {
    store: Store,
    given: Rc<RefCell<Vec<Given>>>,
    gate_open: Rc<Cell<bool>>,
}

impl RaftStateMachine<C> for Watched {
    type SnapshotData = PartitionSnapshot;
    type SnapshotBuilder = Store;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<PartitionLogId>, StoredMembership<Clid, BrokerId, ()>), io::Error> {
        self.store.applied_state().await
    }

    async fn apply<Strm>(&mut self, entries: Strm) -> Result<(), io::Error>
    where
        Strm: Stream<Item = Result<EntryResponder<C>, io::Error>> + Unpin + OptionalSend,
    {
        let entries: Vec<EntryResponder<C>> = entries.try_collect().await?;
        if let (Some(first), Some(last)) = (entries.first(), entries.last()) {
            self.given.borrow_mut().push(Given::Apply {
                first: first.0.log_id.index,
                last: last.0.log_id.index,
            });
        }
        self.store
            .apply(futures::stream::iter(entries.into_iter().map(Ok)))
            .await
    }

    async fn get_snapshot_builder(&mut self) -> Store {
        self.store.clone()
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<Clid, BrokerId, ()>,
        snapshot: PartitionSnapshot,
    ) -> Result<(), io::Error> {
        while !self.gate_open.get() {
            SimRuntime::sleep(Duration::from_millis(1)).await;
        }
        let last = meta.last_log_id.map_or(0, |l| l.index);
        self.given.borrow_mut().push(Given::Install { last });
        self.store.install_snapshot(meta, snapshot).await
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<SnapshotOf<C, PartitionSnapshot>>, io::Error> {
        self.store.get_current_snapshot().await
    }
}

type Clid = openraft::vote::leader_id_std::CommittedLeaderId<u64>;

/// No network: the follower never needs to send (elections are off).
struct NoNet;

impl Hops for NoNet {
    type Sm = Watched;
    type Rt = SimRuntime;

    fn hop(
        self: &Rc<Self>,
        _from: BrokerId,
        _to: BrokerId,
    ) -> Pin<Box<dyn Future<Output = Result<(), String>>>> {
        Box::pin(async { Err("no network in this test".to_owned()) })
    }

    fn raft(&self, _id: BrokerId) -> Option<Raft<C, Watched>> {
        None
    }
}

struct Follower {
    sim: Sim,
    raft: Node,
    given: Rc<RefCell<Vec<Given>>>,
    gate_open: Rc<Cell<bool>>,
}

fn log_id(term: u64, index: u64) -> PartitionLogId {
    PartitionLogId::new_term_index(term, index)
}

fn vote() -> PartitionVote {
    PartitionVote::new_committed(1, LEADER)
}

fn membership() -> Membership<BrokerId, ()> {
    let voters: BTreeSet<BrokerId> = [1, 2, 3].into_iter().map(BrokerId).collect();
    Membership::new_with_defaults(vec![voters.clone()], voters)
}

/// The leader's log: its membership at index 0, then blank entries of term 1 up to `last`.
fn entries(last: u64) -> Vec<PartitionEntry> {
    let mut v = vec![PartitionEntry {
        log_id: log_id(0, 0),
        payload: EntryPayload::Membership(membership()),
    }];
    v.extend((1..=last).map(|i| PartitionEntry {
        log_id: log_id(1, i),
        payload: EntryPayload::Blank,
    }));
    v
}

/// The leader's snapshot up to `last` (its log holds no batches, so the snapshot none either).
fn snapshot(last: u64) -> SnapshotOf<C, PartitionSnapshot> {
    openraft::Snapshot {
        meta: SnapshotMeta {
            last_log_id: Some(log_id(1, last)),
            last_membership: StoredMembership::new(Some(log_id(0, 0)), membership()),
        },
        snapshot: PartitionSnapshot {
            next_offset: Offset(0),
            batches: Vec::new(),
            side: Vec::new(),
        },
    }
}

impl Follower {
    fn start() -> Follower {
        let sim = Sim::new(7);
        let store = sim
            .block_on(Store::open(MemReplicaLog::new(Offset(0))))
            .expect("the replica opens");
        let given = Rc::new(RefCell::new(Vec::new()));
        let gate_open = Rc::new(Cell::new(true));
        let sm = Watched {
            store: store.clone(),
            given: Rc::clone(&given),
            gate_open: Rc::clone(&gate_open),
        };
        let config = Config {
            cluster_name: "snapshot-install-order".into(),
            heartbeat_interval: 50,
            election_timeout_min: 300,
            election_timeout_max: 600,
            enable_elect: false,
            snapshot_policy: SnapshotPolicy::Never,
            ..Default::default()
        };
        let config = Arc::new(config.validate().expect("a valid Raft config"));
        let net = LocalNet::new(Rc::new(NoNet), FOLLOWER);
        let raft = sim
            .block_on(async move { Raft::new(FOLLOWER, config, net, store, sm).await })
            .expect("the follower starts");
        Follower {
            sim,
            raft,
            given,
            gate_open,
        }
    }

    /// Sends the follower an append as the leader would; the task ends with its answer.
    fn send_append(
        &self,
        prev: Option<PartitionLogId>,
        entries: Vec<PartitionEntry>,
        commit: u64,
    ) -> SimJoinHandle<()> {
        let raft = self.raft.clone();
        let rpc = AppendEntriesRequest {
            vote: vote(),
            prev_log_id: prev,
            leader_commit: Some(log_id(1, commit)),
            entries,
        };
        self.sim.spawn(async move {
            let resp = raft
                .append_entries(rpc)
                .await
                .expect("the follower answers the append");
            assert!(resp.is_success(), "the follower takes the append: {resp:?}");
        })
    }

    /// Sends the follower an append as the leader would, and waits for its answer.
    fn append(&self, prev: Option<PartitionLogId>, entries: Vec<PartitionEntry>, commit: u64) {
        let sent = self.send_append(prev, entries, commit);
        self.sim.block_on(sent).expect("the append task ran");
    }

    /// Runs until the follower has applied (or installed) up to `index`.
    fn wait_applied(&self, index: u64) {
        let raft = self.raft.clone();
        let deadline = self.sim.now() + Duration::from_secs(5);
        let done = self.sim.run_until_condition(deadline, || {
            raft.metrics()
                .borrow_watched()
                .last_applied
                .is_some_and(|l| l.index >= index)
        });
        assert!(
            done,
            "the follower applies up to {index}: {:?}",
            self.given.borrow()
        );
    }

    /// Checks that the state machine was given everything once, in order, never going back:
    /// each apply starts right after what was applied or installed before it, and each install
    /// is above it.
    fn check_in_order(&self, upto: u64) {
        let given = self.given.borrow();
        let mut at: Option<u64> = None;
        for g in given.iter() {
            match *g {
                Given::Apply { first, last } => {
                    assert_eq!(
                        Some(first),
                        Some(at.map_or(0, |a| a + 1)),
                        "an apply continues where the state machine is: {given:?}"
                    );
                    at = Some(last);
                }
                Given::Install { last } => {
                    assert!(
                        at.is_none_or(|a| last > a),
                        "an install never takes the state machine back: {given:?}"
                    );
                    at = Some(last);
                }
            }
        }
        assert_eq!(at, Some(upto), "the state machine reaches {upto}: {given:?}");
    }
}

/// The replication simulation's seeds 26 and 52: the follower holds the leader's entries up to
/// 10, written and flushed, knows 5 committed, and is sent a snapshot up to 8 by the same
/// leader (whose view of the follower was stale). 8 is above the commit, so openraft installs
/// it; the entries 9 and 10 stay, and are applied after it.
#[test]
fn a_snapshot_below_the_written_log_is_installed_and_the_log_after_it_kept() {
    let f = Follower::start();
    f.append(None, entries(10), 5);
    f.wait_applied(5);

    let raft = f.raft.clone();
    let install = f
        .sim
        .block_on(async move { raft.install_full_snapshot(vote(), snapshot(8)).await });
    install.expect("the follower installs the snapshot");
    f.wait_applied(8);

    // Nothing is sent again: the commit alone carries the follower on past the snapshot.
    f.append(Some(log_id(1, 10)), Vec::new(), 10);
    f.wait_applied(10);
    f.check_in_order(10);
    assert_eq!(
        *f.given.borrow(),
        vec![
            Given::Apply { first: 0, last: 5 },
            Given::Install { last: 8 },
            Given::Apply { first: 9, last: 10 },
        ]
    );
}

/// Two snapshots in a row while the state machine is slow to install the first: openraft
/// queues the second install behind the first one's purge, which waits until the first is
/// installed. A commit up to 10 arrives meanwhile. The apply of 9..=10 must wait for the second
/// install; run before it, it would be followed by an install taking the state machine back
/// to 8.
#[test]
fn no_apply_overtakes_a_queued_snapshot_install() {
    let f = Follower::start();
    f.append(None, entries(10), 2);
    f.wait_applied(2);

    f.gate_open.set(false);
    let (r4, r8) = (f.raft.clone(), f.raft.clone());
    let first = f
        .sim
        .spawn(async move { r4.install_full_snapshot(vote(), snapshot(4)).await });
    f.sim.run_for(Duration::from_millis(20));
    let second = f
        .sim
        .spawn(async move { r8.install_full_snapshot(vote(), snapshot(8)).await });
    f.sim.run_for(Duration::from_millis(20));
    // The follower answers this append only once the queue moves on (its answer is queued
    // behind the waiting purge), so it is not waited for here.
    let commit = f.send_append(Some(log_id(1, 10)), Vec::new(), 10);
    f.sim.run_for(Duration::from_millis(20));
    assert_eq!(
        *f.given.borrow(),
        vec![Given::Apply { first: 0, last: 2 }],
        "nothing reaches the state machine while the first install waits"
    );

    f.gate_open.set(true);
    f.wait_applied(10);
    f.sim.block_on(commit).expect("the append task ran");
    for (name, task) in [("first", first), ("second", second)] {
        f.sim
            .block_on(task)
            .expect("the install task ran")
            .unwrap_or_else(|e| panic!("the {name} snapshot is installed: {e}"));
    }
    f.check_in_order(10);
    assert_eq!(
        *f.given.borrow(),
        vec![
            Given::Apply { first: 0, last: 2 },
            Given::Install { last: 4 },
            Given::Install { last: 8 },
            Given::Apply { first: 9, last: 10 },
        ]
    );
}
