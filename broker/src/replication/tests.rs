//! Three nodes in one process, each its own store in a temporary directory and its own group
//! manager, talking over TCP on 127.0.0.1 through the real transport; each node's listener
//! tells the hello apart as the Kafka listeners do and hands the connection to its manager.
//! Fed a hand-made cluster state with one RF=3 partition.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::rc::{Rc, Weak};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use glommio::net::TcpListener;
use glommio::LocalExecutorBuilder;
use strand_protocol::batch::build::{batch, TestRecord};
use strand_protocol::batch::BatchScanner;
use strand_protocol::types::{LeaderEpoch, NodeId, PartitionId, ShardId, TopicId};
use strand_raft::transport::codec::Codec;
use strand_storage::fs_glommio::{GlommioFs, GlommioFsConfig, SharedFs};
use strand_storage::{FileRegions, LogConfig, LogId, LogKey, ShardStore, StoreConfig};

use super::net::{is_node_hello, peek_hello};
use super::*;
use crate::cluster::record::{
    BrokerEpoch, Endpoint, IncarnationId, PartitionEpoch, PartitionRecord, Record, RegisterBroker, Replica,
};

pub(super) const TOPIC: TopicId = TopicId(uuid::Uuid::from_u128(0x7091c));
const LISTENER: &str = "INTERNAL";

struct TestHost {
    root: PathBuf,
    logs: RefCell<BTreeMap<(TopicId, PartitionId), LogId>>,
    handles: RefCell<BTreeMap<(TopicId, PartitionId), Rc<dyn ReplicaHandle>>>,
}

impl Host for TestHost {
    fn open_log(&self, _: &ClusterState, topic: TopicId, partition: PartitionId) -> Option<(LogId, PathBuf)> {
        let log = *self.logs.borrow().get(&(topic, partition))?;
        Some((log, self.root.join(format!("t-{}", partition.0))))
    }

    fn attach(
        &self,
        _: &ClusterState,
        topic: TopicId,
        partition: PartitionId,
        handle: Option<Rc<dyn ReplicaHandle>>,
    ) {
        match handle {
            Some(h) => self.handles.borrow_mut().insert((topic, partition), h),
            None => self.handles.borrow_mut().remove(&(topic, partition)),
        };
    }

    /// One shard per test node: no other shard to tell.
    fn tell_shards(&self, _: Vec<SeenLeader>) {}
}

struct Node {
    id: i32,
    _dir: tempfile::TempDir,
    store: Rc<ShardStore<GlommioFs>>,
    host: Rc<TestHost>,
    manager: Rc<GroupManager>,
    addr: SocketAddr,
    /// While set, the node's flusher makes nothing durable.
    paused: Rc<Cell<bool>>,
}

impl Node {
    fn handle(&self) -> Option<Rc<dyn ReplicaHandle>> {
        self.host.handles.borrow().get(&(TOPIC, PartitionId(0))).cloned()
    }

    fn log(&self) -> LogId {
        self.host.logs.borrow()[&(TOPIC, PartitionId(0))]
    }
}

async fn start_node(id: i32, shared: &'static SharedFs) -> Node {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    let fs = GlommioFs::new(GlommioFsConfig::default(), shared);
    let store = Rc::new(
        ShardStore::open(fs, root.clone(), 0, StoreConfig::default())
            .await
            .unwrap(),
    );
    let key = LogKey {
        dir_name: "t-0".into(),
        incarnation: *TOPIC.0.as_bytes(),
    };
    let (log, _) = store.open_log(key, LogConfig::default(), 0).await.unwrap();
    // The shard's flusher.
    let paused = Rc::new(Cell::new(false));
    crate::shard::spawn_test_flusher(Rc::clone(&store), Rc::clone(&paused));
    let host = Rc::new(TestHost {
        root,
        logs: RefCell::new(BTreeMap::from([((TOPIC, PartitionId(0)), log)])),
        handles: RefCell::new(BTreeMap::new()),
    });
    let manager = GroupManager::new(
        NodeId(id),
        ShardId(0),
        Rc::clone(&store),
        host.clone(),
        LISTENER.into(),
        ReplicationSettings::default(),
    );
    manager.run();
    // The listener: a connection whose first frame is a node hello goes to the manager.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let m = Rc::downgrade(&manager);
    glommio::spawn_local(async move {
        while let Ok(stream) = listener.accept().await {
            let m = m.clone();
            glommio::spawn_local(async move {
                let mut buf = BytesMut::with_capacity(64);
                let mut stream = stream;
                let mut chunk = [0u8; 64];
                while peek_hello(&buf, Codec::default()).is_none() && buf.len() < 64 {
                    use futures::AsyncReadExt;
                    match stream.read(&mut chunk).await {
                        Ok(n) if n > 0 => buf.extend_from_slice(&chunk[..n]),
                        _ => return,
                    }
                }
                assert!(
                    is_node_hello(&buf[4..]),
                    "a node's first frame reads as its hello"
                );
                if let Some(m) = m.upgrade() {
                    m.serve_peer(stream, buf).await;
                }
            })
            .detach();
        }
    })
    .detach();
    Node {
        id,
        _dir: dir,
        store,
        host,
        manager,
        addr,
        paused,
    }
}

/// Three registered, unfenced brokers and one RF=3 partition led (in the metadata) by node 1.
fn cluster(nodes: &[Node]) -> Rc<ClusterState> {
    let members: Vec<(i32, SocketAddr)> = nodes.iter().map(|n| (n.id, n.addr)).collect();
    cluster_of(&members)
}

/// Registered, unfenced brokers (id and listener address) and one partition replicated on
/// all of them, the first its preferred leader.
pub(super) fn cluster_of(nodes: &[(i32, SocketAddr)]) -> Rc<ClusterState> {
    let mut state = ClusterState::default();
    let mut offset = 0i64;
    for &(id, addr) in nodes {
        state.apply(&Record::RegisterBroker(RegisterBroker {
            broker: NodeId(id),
            incarnation: IncarnationId(uuid::Uuid::from_u128(id as u128)),
            epoch: BrokerEpoch(offset),
            endpoints: vec![Endpoint {
                listener: LISTENER.into(),
                host: addr.ip().to_string(),
                port: addr.port(),
            }],
            rack: None,
            shards: 1,
        }));
        state.apply(&Record::BrokerUnfenced {
            broker: NodeId(id),
            epoch: BrokerEpoch(offset),
        });
        offset += 2;
    }
    state.apply(&Record::Topic {
        name: "replicated".into(),
        id: TOPIC,
    });
    state.apply(&Record::Partition(PartitionRecord {
        topic: TOPIC,
        partition: PartitionId(0),
        replicas: nodes
            .iter()
            .map(|&(id, _)| Replica {
                broker: NodeId(id),
                shard: ShardId(0),
            })
            .collect(),
        isr: nodes.iter().map(|&(id, _)| NodeId(id)).collect(),
        leader: Some(NodeId(nodes[0].0)),
        leader_epoch: LeaderEpoch(0),
        partition_epoch: PartitionEpoch(0),
    }));
    Rc::new(state)
}

/// Waits (bounded) until one of `nodes` leads with an epoch above `above`; returns its index.
async fn leader_among(nodes: &[&Node], above: i32) -> (usize, Leadership) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        for (i, n) in nodes.iter().enumerate() {
            if let Some(h) = n.handle() {
                let l = h.leadership();
                if l.is_local && l.epoch > above {
                    return (i, l);
                }
            }
        }
        assert!(
            Instant::now() < deadline,
            "no leader with an epoch above {above} elected within 30 s"
        );
        glommio::timer::sleep(Duration::from_millis(20)).await;
    }
}

fn payload(n: u8, records: usize) -> Bytes {
    let value = [n; 16];
    let recs: Vec<TestRecord<'_>> = (0..records)
        .map(|_| TestRecord {
            value: Some(&value),
            ..Default::default()
        })
        .collect();
    Bytes::from(batch(&recs, 1_700_000_000_000))
}

/// What a client reads of a node's log (up to its visible end).
async fn client_read(node: &Node) -> Bytes {
    match node.store.plan_read(node.log(), 0, 1 << 20).unwrap() {
        Some(plan) => plan.execute().await.unwrap(),
        None => Bytes::new(),
    }
}

async fn wait_visible(node: &Node, offset: i64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while node.store.offsets(node.log()).unwrap().high_watermark < offset {
        assert!(
            Instant::now() < deadline,
            "node {} did not reach {offset}",
            node.id
        );
        glommio::timer::sleep(Duration::from_millis(10)).await;
    }
}

#[test]
fn three_nodes_replicate_a_partition_and_fail_over() {
    LocalExecutorBuilder::default()
        .spawn(|| async move {
            let shared = SharedFs::for_process(FileRegions::for_process(64));
            let mut nodes = Vec::new();
            for id in 1..=3 {
                nodes.push(start_node(id, shared).await);
            }
            let state = cluster(&nodes);
            for n in &nodes {
                n.manager.reconcile(&state).await;
                assert_eq!(n.manager.group_count(), 1);
                assert!(
                    n.handle().is_some(),
                    "node {}'s partition has its group attached",
                    n.id
                );
            }
            let all: Vec<&Node> = nodes.iter().collect();
            let (li, first) = leader_among(&all, 0).await;
            let leader = &nodes[li];

            // No controller records the election here: every node's Metadata answers with the
            // leader its replica saw elected, in the term it was elected in (`leaders`).
            for n in &nodes {
                let deadline = Instant::now() + Duration::from_secs(10);
                loop {
                    let seen = n.manager.newer_leader(TOPIC, PartitionId(0), LeaderEpoch(0));
                    if seen == Some((NodeId(leader.id), LeaderEpoch(first.epoch))) {
                        break;
                    }
                    assert!(Instant::now() < deadline, "node {} sees {seen:?}", n.id);
                    glommio::timer::sleep(Duration::from_millis(10)).await;
                }
                assert_eq!(
                    n.manager
                        .newer_leader(TOPIC, PartitionId(0), LeaderEpoch(first.epoch)),
                    None,
                    "a state that records the election answers for itself"
                );
            }

            // A proposal on the leader commits on a majority and is answered with its offset.
            let h = leader.handle().unwrap();
            assert_eq!(h.propose(payload(1, 3), Acks::All).await, Ok(0));
            assert_eq!(h.propose(payload(2, 2), Acks::Leader).await, Ok(3));
            // The acks=1 write was answered once durable on the leader; clients see it once
            // committed.
            wait_visible(leader, 5).await;
            assert_eq!(leader.store.offsets(leader.log()).unwrap().high_watermark, 5);

            // A follower refuses with the leader's id.
            let follower = nodes.iter().find(|n| n.id != leader.id).unwrap();
            wait_visible(follower, 5).await;
            let fl = follower.handle().unwrap().leadership();
            assert!(!fl.is_local);
            assert_eq!(fl.leader, Some(NodeId(leader.id)));
            match follower.handle().unwrap().propose(payload(9, 1), Acks::All).await {
                Err(ProposeError::NotLeader(l)) => assert_eq!(l.leader, Some(NodeId(leader.id))),
                other => panic!("a follower accepted a write: {other:?}"),
            }

            // Every replica holds the same bytes below the commit offset.
            let bytes = client_read(leader).await;
            assert_eq!(BatchScanner::new(&bytes, true).count(), 2);
            for n in &nodes {
                wait_visible(n, 5).await;
                assert_eq!(client_read(n).await, bytes, "node {} differs", n.id);
            }

            // With the followers' disks stalled, an acks=1 write is answered once durable on
            // the leader, but clients of the leader read only up to the commit offset; the
            // leader's replica reads all it holds.
            for n in nodes.iter().filter(|n| n.id != leader.id) {
                n.paused.set(true);
            }
            assert_eq!(h.propose(payload(4, 1), Acks::Leader).await, Ok(5));
            assert_eq!(leader.store.offsets(leader.log()).unwrap().high_watermark, 5);
            assert_eq!(
                client_read(leader).await,
                bytes,
                "a client read stops at the commit offset"
            );
            let held = leader
                .store
                .plan_replica_read(leader.log(), 0, 1 << 20)
                .unwrap()
                .unwrap()
                .execute()
                .await
                .unwrap();
            assert_eq!(BatchScanner::new(&held, true).count(), 3);
            for n in &nodes {
                n.paused.set(false);
            }
            for n in &nodes {
                wait_visible(n, 6).await;
            }
            let bytes = client_read(leader).await;
            for n in &nodes {
                assert_eq!(client_read(n).await, bytes, "node {} differs", n.id);
            }

            // Idle, the groups quiesce (no Raft timers); the followers' quiescers watch the
            // leader's node instead.
            let deadline = Instant::now() + Duration::from_secs(30);
            while nodes
                .iter()
                .any(|n| n.manager.quiescer.borrow().quiesced_count() == 0)
            {
                assert!(Instant::now() < deadline, "idle groups did not quiesce");
                glommio::timer::sleep(Duration::from_millis(100)).await;
            }

            // The leader's node stops: its silence wakes the others' groups, another is
            // elected with a higher epoch, and writes go on.
            leader.manager.close().await;
            let rest: Vec<&Node> = nodes.iter().filter(|n| n.id != leader.id).collect();
            let (ni, second) = leader_among(&rest, first.epoch).await;
            assert!(second.epoch > first.epoch);
            let h = rest[ni].handle().unwrap();
            assert_eq!(h.propose(payload(3, 1), Acks::All).await, Ok(6));
            for n in &rest {
                wait_visible(n, 7).await;
            }
            assert_eq!(client_read(rest[0]).await, client_read(rest[1]).await);
            let read = client_read(rest[ni]).await;
            let batches: Vec<_> = BatchScanner::new(&read, true).map(|b| b.header).collect();
            assert_eq!(batches.len(), 4);
            assert_eq!(
                batches[3].partition_leader_epoch, second.epoch,
                "the new batch carries the new epoch"
            );
            // A controlled shutdown with a write in flight (durable on the leader only, the
            // follower's disk stalled): the leadership still moves, to the follower furthest
            // along, which takes the leader's last entry before it campaigns. (One replica of
            // three left, it cannot commit it.)
            let follower = rest[1 - ni];
            follower.paused.set(true);
            assert_eq!(h.propose(payload(5, 1), Acks::Leader).await, Ok(7));
            let unpause = Rc::clone(&follower.paused);
            glommio::spawn_local(async move {
                glommio::timer::sleep(Duration::from_millis(100)).await;
                unpause.set(false);
            })
            .detach();
            let moves = rest[ni].manager.shut_down().await;
            assert_eq!(moves, ShutdownMoves { led: 1, moved: 1 });
            let (_, third) = leader_among(&[follower], second.epoch).await;
            assert!(third.epoch > second.epoch);
            assert_eq!(follower.store.offsets(follower.log()).unwrap().log_end_offset, 8);
            // A deleted topic's groups stop and their handles leave the partitions.
            for n in &rest {
                n.manager.stop_topic(TOPIC).await;
                assert_eq!(n.manager.group_count(), 0);
                assert!(n.handle().is_none());
                n.manager.close().await;
            }
        })
        .unwrap()
        .join()
        .unwrap();
}

/// A leader whose followers' nodes fall silent keeps its Raft leadership (nothing of a higher
/// term reaches it) but knows, within the peer timeout, that it no longer hears a majority.
#[test]
fn a_leader_cut_off_from_its_followers_knows_it() {
    LocalExecutorBuilder::default()
        .spawn(|| async move {
            let shared = SharedFs::for_process(FileRegions::for_process(64));
            let mut nodes = Vec::new();
            for id in 1..=3 {
                nodes.push(start_node(id, shared).await);
            }
            let state = cluster(&nodes);
            for n in &nodes {
                n.manager.reconcile(&state).await;
            }
            let all: Vec<&Node> = nodes.iter().collect();
            let (li, _) = leader_among(&all, 0).await;
            let leader = nodes[li].handle().unwrap();
            let deadline = Instant::now() + Duration::from_secs(10);
            while !leader.hears_a_majority() {
                assert!(Instant::now() < deadline, "a connected leader hears no majority");
                glommio::timer::sleep(Duration::from_millis(20)).await;
            }
            // Both followers' nodes stop.
            for n in nodes.iter().filter(|n| n.id != nodes[li].id) {
                n.manager.close().await;
            }
            let silent = Instant::now();
            let timeout = Duration::from_millis(ReplicationSettings::default().quiesce.peer_timeout_ms);
            while leader.hears_a_majority() {
                assert!(
                    silent.elapsed() < timeout + Duration::from_secs(2),
                    "the cut-off leader still believes it hears a majority"
                );
                glommio::timer::sleep(Duration::from_millis(20)).await;
            }
            assert!(leader.leadership().is_local, "still leader in its own eyes");
            nodes[li].manager.close().await;
        })
        .unwrap()
        .join()
        .unwrap();
}

#[test]
fn a_group_whose_first_replica_never_started_forms_without_it() {
    LocalExecutorBuilder::default()
        .spawn(|| async move {
            let shared = SharedFs::for_process(FileRegions::for_process(64));
            // Node 1, the first replica (it would initialize the group), never runs: its
            // address refuses connections.
            let gone = TcpListener::bind("127.0.0.1:0").unwrap();
            let gone_addr = gone.local_addr().unwrap();
            drop(gone);
            let mut nodes = Vec::new();
            for id in 2..=3 {
                nodes.push(start_node(id, shared).await);
            }
            let mut members = vec![(1, gone_addr)];
            members.extend(nodes.iter().map(|n| (n.id, n.addr)));
            let state = cluster_of(&members);
            for n in &nodes {
                n.manager.reconcile(&state).await;
                assert_eq!(n.manager.group_count(), 1);
            }
            let all: Vec<&Node> = nodes.iter().collect();
            let (li, _) = leader_among(&all, 0).await;
            let h = nodes[li].handle().unwrap();
            assert_eq!(h.propose(payload(1, 2), Acks::All).await, Ok(0));
            for n in &nodes {
                wait_visible(n, 2).await;
                n.manager.close().await;
            }
        })
        .unwrap()
        .join()
        .unwrap();
}

/// A test shard: its directory, store, host and manager.
type TestShard = (
    tempfile::TempDir,
    Rc<ShardStore<GlommioFs>>,
    Rc<TestHost>,
    Rc<GroupManager>,
);

/// A shard of a multi-shard node: its own store (partition logs `t-<p>` for `parts`), host and
/// manager, with a flusher.
async fn open_shard(id: i32, shard: u16, parts: &[i32], shared: &'static SharedFs) -> TestShard {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    let fs = GlommioFs::new(GlommioFsConfig::default(), shared);
    let store = Rc::new(
        ShardStore::open(fs, root.clone(), shard, StoreConfig::default())
            .await
            .unwrap(),
    );
    let mut logs = BTreeMap::new();
    for p in parts {
        let key = LogKey {
            dir_name: format!("t-{p}"),
            incarnation: *TOPIC.0.as_bytes(),
        };
        let (log, _) = store.open_log(key, LogConfig::default(), 0).await.unwrap();
        logs.insert((TOPIC, PartitionId(*p)), log);
    }
    crate::shard::spawn_test_flusher(Rc::clone(&store), Rc::new(Cell::new(false)));
    let host = Rc::new(TestHost {
        root,
        logs: RefCell::new(logs),
        handles: RefCell::new(BTreeMap::new()),
    });
    let manager = GroupManager::new(
        NodeId(id),
        ShardId(shard),
        Rc::clone(&store),
        host.clone(),
        LISTENER.into(),
        ReplicationSettings::default(),
    );
    manager.run();
    (dir, store, host, manager)
}

/// Replicas on different shards of their nodes: each message reaches the shard its hello
/// names, and the coalesced heartbeats of a shard's groups are split by target shard.
#[test]
fn groups_reach_their_replicas_on_other_shards() {
    LocalExecutorBuilder::default()
        .spawn(|| async move {
            let shared = SharedFs::for_process(FileRegions::for_process(64));
            // Partition 0 on (1, s0), (2, s1), (3, s0); partition 1 on (1, s0), (2, s0), (3, s1):
            // node 1's shard 0 hosts both, and its peers hold them on different shards.
            let placement: [[(i32, u16); 3]; 2] = [[(1, 0), (2, 1), (3, 0)], [(1, 0), (2, 0), (3, 1)]];
            let mut shards: BTreeMap<(i32, u16), TestShard> = BTreeMap::new();
            for id in 1..=3 {
                for shard in 0..2u16 {
                    let parts: Vec<i32> = (0..2)
                        .filter(|p| placement[*p as usize].contains(&(id, shard)))
                        .collect();
                    shards.insert((id, shard), open_shard(id, shard, &parts, shared).await);
                }
            }
            // One listener per node; a connection goes to the shard its hello names.
            let mut addrs = BTreeMap::new();
            for id in 1..=3 {
                let listener = TcpListener::bind("127.0.0.1:0").unwrap();
                addrs.insert(id, listener.local_addr().unwrap());
                let managers: Vec<Weak<GroupManager>> =
                    (0..2u16).map(|s| Rc::downgrade(&shards[&(id, s)].3)).collect();
                glommio::spawn_local(async move {
                    while let Ok(stream) = listener.accept().await {
                        let managers = managers.clone();
                        glommio::spawn_local(async move {
                            let mut buf = BytesMut::with_capacity(64);
                            let mut stream = stream;
                            let mut chunk = [0u8; 64];
                            let target = loop {
                                if let Some((_, shard)) = peek_hello(&buf, Codec::default()) {
                                    break shard;
                                }
                                use futures::AsyncReadExt;
                                match stream.read(&mut chunk).await {
                                    Ok(n) if n > 0 && buf.len() < 64 => buf.extend_from_slice(&chunk[..n]),
                                    _ => return,
                                }
                            };
                            if let Some(m) = managers.get(usize::from(target)).and_then(Weak::upgrade) {
                                m.serve_peer(stream, buf).await;
                            }
                        })
                        .detach();
                    }
                })
                .detach();
            }
            let mut state = ClusterState::default();
            for id in 1..=3 {
                let epoch = BrokerEpoch(i64::from(id - 1) * 2);
                state.apply(&Record::RegisterBroker(RegisterBroker {
                    broker: NodeId(id),
                    incarnation: IncarnationId(uuid::Uuid::from_u128(id as u128)),
                    epoch,
                    endpoints: vec![Endpoint {
                        listener: LISTENER.into(),
                        host: "127.0.0.1".into(),
                        port: addrs[&id].port(),
                    }],
                    rack: None,
                    shards: 2,
                }));
                state.apply(&Record::BrokerUnfenced {
                    broker: NodeId(id),
                    epoch,
                });
            }
            state.apply(&Record::Topic {
                name: "sharded".into(),
                id: TOPIC,
            });
            for (p, replicas) in placement.iter().enumerate() {
                state.apply(&Record::Partition(PartitionRecord {
                    topic: TOPIC,
                    partition: PartitionId(p as i32),
                    replicas: replicas
                        .iter()
                        .map(|(b, s)| Replica {
                            broker: NodeId(*b),
                            shard: ShardId(*s),
                        })
                        .collect(),
                    isr: replicas.iter().map(|(b, _)| NodeId(*b)).collect(),
                    leader: Some(NodeId(1)),
                    leader_epoch: LeaderEpoch(0),
                    partition_epoch: PartitionEpoch(0),
                }));
            }
            let state = Rc::new(state);
            for (_, _, _, m) in shards.values() {
                m.reconcile(&state).await;
            }
            for ((id, shard), (_, _, _, m)) in &shards {
                let expected = placement.iter().filter(|r| r.contains(&(*id, *shard))).count();
                assert_eq!(m.group_count(), expected, "node {id} shard {shard}");
            }
            for (p, replicas) in placement.iter().enumerate() {
                let part = (TOPIC, PartitionId(p as i32));
                // Whoever leads takes a write; every replica ends up with the same bytes.
                let deadline = Instant::now() + Duration::from_secs(30);
                let leader = loop {
                    let found = replicas.iter().find_map(|k| {
                        let h = shards[k].2.handles.borrow().get(&part).cloned()?;
                        h.leadership().is_local.then_some(h)
                    });
                    if let Some(h) = found {
                        break h;
                    }
                    assert!(Instant::now() < deadline, "partition {p} elected no leader");
                    glommio::timer::sleep(Duration::from_millis(20)).await;
                };
                assert_eq!(leader.propose(payload(p as u8, 2), Acks::All).await, Ok(0));
                let mut seen = Vec::new();
                for k in replicas {
                    let (_, store, host, _) = &shards[k];
                    let log = host.logs.borrow()[&part];
                    let deadline = Instant::now() + Duration::from_secs(30);
                    while store.offsets(log).unwrap().high_watermark < 2 {
                        assert!(
                            Instant::now() < deadline,
                            "replica {k:?} of partition {p} did not catch up"
                        );
                        glommio::timer::sleep(Duration::from_millis(10)).await;
                    }
                    seen.push(
                        store
                            .plan_read(log, 0, 1 << 20)
                            .unwrap()
                            .unwrap()
                            .execute()
                            .await
                            .unwrap(),
                    );
                }
                assert!(
                    seen.windows(2).all(|w| w[0] == w[1]),
                    "partition {p}'s replicas differ"
                );
            }
            // A controlled shutdown of node 1, which leads (or follows) both: its leadership
            // moves to a caught-up replica first, with a higher epoch, and writes go on there.
            let before: Vec<i32> = (0..2)
                .map(|p| {
                    let h = shards[&(2, 0)]
                        .2
                        .handles
                        .borrow()
                        .get(&(TOPIC, PartitionId(p)))
                        .cloned();
                    h.map_or(-1, |h| h.leadership().epoch)
                })
                .collect();
            shards[&(1, 0)].3.shut_down().await;
            for (p, replicas) in placement.iter().enumerate() {
                let part = (TOPIC, PartitionId(p as i32));
                let deadline = Instant::now() + Duration::from_secs(30);
                let leader = loop {
                    let found = replicas.iter().filter(|k| k.0 != 1).find_map(|k| {
                        let h = shards[k].2.handles.borrow().get(&part).cloned()?;
                        h.leadership().is_local.then_some(h)
                    });
                    if let Some(h) = found {
                        break h;
                    }
                    assert!(
                        Instant::now() < deadline,
                        "partition {p} has no leader after the shutdown"
                    );
                    glommio::timer::sleep(Duration::from_millis(20)).await;
                };
                assert!(leader.leadership().epoch > before[p].max(0));
                assert_eq!(leader.propose(payload(9, 1), Acks::All).await, Ok(2));
            }
            for (_, _, _, m) in shards.values() {
                m.close().await;
            }
        })
        .unwrap()
        .join()
        .unwrap();
}

/// The partition groups' timers make a config openraft accepts, and openraft (its vendored
/// patch 4) holds a set tick to its rules: within `1..=heartbeat_interval`, and counted in the
/// bound that keeps a suppressed heartbeat within the shortest election timeout.
#[test]
fn the_replication_timers_are_a_config_openraft_accepts() {
    let settings = ReplicationSettings::default();
    let config = settings.raft_config();
    assert_eq!(config.tick_interval, Some(settings.tick_interval_ms));
    assert_eq!(config.leader_lease, Some(settings.leader_lease_ms));
    assert!(
        settings.heartbeat_interval_ms + settings.heartbeat_min_interval_ms + settings.tick_interval_ms
            < settings.election_timeout_min_ms
    );
    // The first follower whose election timer runs out finds the others' leases run out too.
    assert!(settings.leader_lease_ms <= settings.election_timeout_min_ms);
    // An awake follower counts its leader silent before it would quiesce (it keeps electing).
    assert!(settings.quiesce.idle_after_ms > settings.quiesce.peer_timeout_ms);
    let with = |heartbeat: u64, tick: u64, min_interval: u64| openraft::Config {
        heartbeat_interval: heartbeat,
        election_timeout_min: 600,
        election_timeout_max: 1_200,
        tick_interval: Some(tick),
        heartbeat_min_interval: Some(min_interval),
        ..Default::default()
    };
    assert!(with(100, 50, 200).validate().is_ok());
    for tick in [0, 101] {
        assert!(matches!(
            with(100, tick, 200).validate(),
            Err(openraft::ConfigError::TickInterval { .. })
        ));
    }
    // 250 + 250 + a tick of 100 reaches 600: a suppressed heartbeat could come too late.
    assert!(matches!(
        with(250, 100, 250).validate(),
        Err(openraft::ConfigError::HeartbeatMinIntervalTooLarge { .. })
    ));
    assert!(with(250, 99, 250).validate().is_ok());
    // The lease must outlast the longest gap between heartbeats (100 + 200 + 50) and end by the
    // longest election timeout.
    let leased = |lease: u64| openraft::Config {
        leader_lease: Some(lease),
        ..with(100, 50, 200)
    };
    assert!(leased(600).validate().is_ok());
    assert!(leased(1_200).validate().is_ok());
    for lease in [350, 1_201] {
        assert!(matches!(
            leased(lease).validate(),
            Err(openraft::ConfigError::LeaderLease { .. })
        ));
    }
}

/// A replica that started quiet under the leader the metadata named stops believing in it once
/// the metadata names none, and believes the one it names next: without a leader it is the
/// quiescer's to elect, and kept believing, two replicas that each started under a leadership
/// the other no longer held stayed quiet for good, and their partition never elected; a
/// leader elected while this node was away, quiesced since, sends it nothing, and without the
/// metadata's word the replica would campaign against it.
#[test]
fn a_quiet_replica_believes_the_leader_the_metadata_names() {
    LocalExecutorBuilder::default()
        .spawn(|| async move {
            let shared = SharedFs::for_process(FileRegions::for_process(64));
            let n2 = start_node(2, shared).await;
            let n1_addr: SocketAddr = "127.0.0.1:9".parse().unwrap();
            // The partition's registration after each (leader, epoch) change in turn.
            let led_by = |changes: &[(Option<i32>, i32)]| {
                let mut state = (*cluster_of(&[(1, n1_addr), (2, n2.addr), (3, n1_addr)])).clone();
                for (i, (leader, epoch)) in changes.iter().enumerate() {
                    state.apply(&Record::PartitionChange(
                        crate::cluster::record::PartitionChange {
                            topic: TOPIC,
                            partition: PartitionId(0),
                            leader: leader.map(NodeId),
                            isr: vec![NodeId(1), NodeId(2), NodeId(3)],
                            leader_epoch: LeaderEpoch(*epoch),
                            partition_epoch: PartitionEpoch(i32::try_from(i).unwrap() + 1),
                            shards: None,
                        },
                    ));
                }
                Rc::new(state)
            };
            n2.manager.reconcile(&led_by(&[(Some(1), 5)])).await;
            let group = n2.manager.groups.0.borrow().values().next().cloned().unwrap();
            assert_eq!(
                group.believed_leader.get(),
                Some(BrokerId(1)),
                "started under node 1"
            );
            // Each later state is followed as it arrives.
            // The same leader named again: still believed.
            n2.manager.cluster_changed(&led_by(&[(Some(1), 5)]));
            assert_eq!(group.believed_leader.get(), Some(BrokerId(1)));
            // The controller took the leadership away: no leader is believed any more.
            n2.manager.cluster_changed(&led_by(&[(Some(1), 5), (None, 5)]));
            assert_eq!(group.believed_leader.get(), None);
            assert_eq!(group.known_leader.get(), None, "nothing elected meanwhile");
            // Node 3 was elected (elsewhere): the replica takes it for its leader.
            n2.manager
                .cluster_changed(&led_by(&[(Some(1), 5), (None, 5), (Some(3), 6)]));
            assert_eq!(group.believed_leader.get(), Some(BrokerId(3)));
        })
        .unwrap()
        .join()
        .unwrap();
}
