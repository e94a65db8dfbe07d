//! The adapter end to end: real openraft groups (on a test runtime) over an in-memory network
//! whose every request and answer is encoded and decoded by the codec.

use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use crate::rt::SimRuntime;
use bytes::Bytes;
use openraft::async_runtime::WatchReceiver;
use openraft::{Config, EntryPayload};
use strand_protocol::batch::build;
use strand_protocol::types::{Offset, PartitionId, TopicId};

use super::*;
use crate::partition::{
    EntryData, KafkaBatch, MemReplicaLog, PartitionLogId, ReplicaStore, SideRecord, StoredSide,
};
use crate::transport::codec::PartitionEntry;
use crate::transport::mem::MemNetwork;

type Rt = SimRuntime;
type Store = ReplicaStore<Rt, MemReplicaLog>;
type R = Raft<C<Rt>, Store>;

fn group(n: u8) -> GroupId {
    GroupId {
        topic: TopicId(uuid::Uuid::from_bytes([n; 16])),
        partition: PartitionId(i32::from(n)),
    }
}

#[derive(Clone, Default)]
struct Groups(Rc<RefCell<HashMap<GroupId, R>>>);

impl GroupRafts<Rt> for Groups {
    type StateMachine = Store;

    fn raft(&self, group: GroupId) -> Option<R> {
        self.0.borrow().get(&group).cloned()
    }
}

/// An in-memory network that records every request `(from, to, message)`.
#[derive(Clone)]
struct MemNet {
    net: MemNetwork<Rt, Groups>,
    requests: Rc<RefCell<Vec<(BrokerId, BrokerId, Message)>>>,
}

impl Default for MemNet {
    fn default() -> Self {
        let net = MemNetwork::new(Codec::default());
        let requests = Rc::new(RefCell::new(Vec::new()));
        let r = Rc::clone(&requests);
        net.set_observer(Box::new(move |from, to, m| {
            r.borrow_mut().push((from, to, m.clone()))
        }));
        MemNet { net, requests }
    }
}

struct Node {
    groups: Groups,
    logs: HashMap<GroupId, MemReplicaLog>,
}

fn raft_config() -> Arc<Config> {
    Arc::new(
        Config {
            heartbeat_interval: 50,
            election_timeout_min: 300,
            election_timeout_max: 600,
            ..Default::default()
        }
        .validate()
        .unwrap(),
    )
}

async fn start_node(net: &MemNet, id: BrokerId, groups: &[GroupId], config: NetworkConfig) -> Node {
    let network = NodeNetwork::<Rt, _>::new(id, net.net.connection(id), config);
    let rafts = Groups::default();
    let mut logs = HashMap::new();
    for g in groups {
        let log = MemReplicaLog::new(Offset(0));
        let store = Store::open(log.clone()).await.unwrap();
        let raft = Raft::new(id, raft_config(), network.factory(*g), store.clone(), store)
            .await
            .unwrap();
        rafts.0.borrow_mut().insert(*g, raft);
        logs.insert(*g, log);
    }
    net.net
        .add_server(id, Rc::new(Server::new(rafts.clone(), ServerLimits::default())));
    // The heartbeat pump, as the broker runs it: once heartbeats are queued, they wait a tick
    // (a fifth of the heartbeat interval) for others to leave with them.
    let pump = Rc::clone(&network);
    let _detached = Rt::spawn(async move {
        loop {
            pump.heartbeats_queued().await;
            Rt::sleep(Duration::from_millis(10)).await;
            pump.tick();
        }
    });
    Node { groups: rafts, logs }
}

fn batch(n: usize) -> KafkaBatch {
    KafkaBatch(Bytes::from(build::simple(n, 1_700_000_000_000)))
}

const WAIT: Option<Duration> = Some(Duration::from_secs(60));

/// The node that leads `g` in the highest term any node knows of, once one does (leadership
/// may move on a slow machine, and an isolated leader keeps believing in itself for a while;
/// the tests follow leadership rather than assume it).
async fn leader_of(nodes: &HashMap<u64, Node>, g: GroupId) -> u64 {
    for _ in 0..6_000 {
        let views: Vec<_> = nodes
            .values()
            .map(|n| n.groups.raft(g).unwrap().metrics().borrow_watched().clone())
            .collect();
        let newest = views
            .iter()
            .filter(|m| m.current_leader.is_some())
            .max_by_key(|m| m.current_term);
        if let Some(leader) = newest.and_then(|m| m.current_leader) {
            let own = views.iter().find(|m| m.id == leader);
            if own.is_some_and(|m| m.state == openraft::ServerState::Leader) {
                return leader.0;
            }
        }
        Rt::sleep(Duration::from_millis(10)).await;
    }
    panic!("no leader of {g}");
}

/// Proposes `b` to the group's leader, following leadership changes.
async fn write(nodes: &HashMap<u64, Node>, g: GroupId, b: KafkaBatch) {
    for _ in 0..1_000 {
        let leader = leader_of(nodes, g).await;
        match nodes[&leader]
            .groups
            .raft(g)
            .unwrap()
            .client_write(b.clone().into())
            .await
        {
            Ok(_) => return,
            Err(openraft::error::RaftError::APIError(
                openraft::error::ClientWriteError::ForwardToLeader(_),
            )) => {
                Rt::sleep(Duration::from_millis(10)).await;
            }
            Err(e) => panic!("write failed: {e}"),
        }
    }
    panic!("no leader took the write");
}

fn heartbeat_frames(net: &MemNet, from: u64, to: u64) -> usize {
    net.requests
        .borrow()
        .iter()
        .filter(|(f, t, m)| *f == BrokerId(from) && *t == BrokerId(to) && matches!(m, Message::Heartbeats(_)))
        .count()
}

#[test]
fn three_nodes_replicate_two_groups_with_coalesced_heartbeats() {
    let mut rt = Rt::new(1);
    rt.block_on(async {
        let net = MemNet::default();
        let gs = [group(1), group(2)];
        let mut nodes = HashMap::new();
        for id in 1..=3 {
            nodes.insert(
                id,
                start_node(&net, BrokerId(id), &gs, NetworkConfig::default()).await,
            );
        }
        let members: BTreeSet<BrokerId> = (1..=3).map(BrokerId).collect();
        for g in &gs {
            nodes[&1]
                .groups
                .raft(*g)
                .unwrap()
                .initialize(members.clone())
                .await
                .unwrap();
        }
        for g in &gs {
            for n in 1..=3 {
                write(&nodes, *g, batch(n)).await;
            }
        }
        // Every replica of every group holds the three batches (the initial membership is entry
        // 0, the leader's blank entry 1: entry 4 is the third batch).
        for node in nodes.values() {
            for g in &gs {
                let raft = node.groups.raft(*g).unwrap();
                raft.wait(WAIT)
                    .applied_index_at_least(Some(4), "replicated")
                    .await
                    .unwrap();
                let batches = node.logs[g].batches();
                assert_eq!(
                    batches.iter().map(|b| b.base_offset).collect::<Vec<_>>(),
                    vec![Offset(0), Offset(1), Offset(3)]
                );
            }
        }
        // Heartbeats go out as coalesced frames from the leader to both followers.
        let leader = leader_of(&nodes, gs[0]).await;
        let followers: Vec<u64> = (1..=3).filter(|n| *n != leader).collect();
        let before: Vec<usize> = followers
            .iter()
            .map(|f| heartbeat_frames(&net, leader, *f))
            .collect();
        let raft = nodes[&leader].groups.raft(gs[0]).unwrap();
        raft.trigger().heartbeat().await.unwrap();
        let sent = raft
            .wait(WAIT)
            .metrics(
                |_| {
                    followers
                        .iter()
                        .zip(&before)
                        .all(|(f, b)| heartbeat_frames(&net, leader, *f) > *b)
                },
                "heartbeat frames to both followers",
            )
            .await;
        assert!(sent.is_ok(), "no coalesced heartbeat frame was sent");
        for (_, _, m) in net.requests.borrow().iter() {
            if let Message::Heartbeats(hs) = m {
                assert!(
                    !hs.is_empty() && hs.len() <= 2,
                    "a heartbeat frame of {} groups",
                    hs.len()
                );
            }
        }
        for node in nodes.values() {
            for g in &gs {
                node.groups.raft(*g).unwrap().shutdown().await.unwrap();
            }
        }
    });
}

#[test]
fn an_isolated_leader_is_replaced_and_steps_down_when_the_link_heals() {
    let mut rt = Rt::new(1);
    rt.block_on(async {
        let net = MemNet::default();
        let g = group(3);
        let mut nodes = HashMap::new();
        for id in 1..=3 {
            nodes.insert(
                id,
                start_node(&net, BrokerId(id), &[g], NetworkConfig::default()).await,
            );
        }
        let members: BTreeSet<BrokerId> = (1..=3).map(BrokerId).collect();
        nodes[&1]
            .groups
            .raft(g)
            .unwrap()
            .initialize(members)
            .await
            .unwrap();
        write(&nodes, g, batch(1)).await;
        let old = leader_of(&nodes, g).await;
        let old_term = nodes[&old]
            .groups
            .raft(g)
            .unwrap()
            .metrics()
            .borrow_watched()
            .current_term;

        // Cut the leader off: the other two elect one of themselves in a later term.
        for n in (1..=3).filter(|n| *n != old) {
            net.net.cut(BrokerId(old), BrokerId(n));
        }
        let other = (1..=3).find(|n| *n != old).unwrap();
        let m = nodes[&other]
            .groups
            .raft(g)
            .unwrap()
            .wait(WAIT)
            .metrics(
                |m| m.current_term > old_term && m.current_leader.is_some_and(|l| l != BrokerId(old)),
                "a new leader",
            )
            .await
            .unwrap();
        let new = m.current_leader.unwrap().0;
        write(&nodes, g, batch(2)).await;

        // Healed, the old leader learns the higher term and follows; everyone has both batches.
        for n in 1..=3 {
            net.net.heal(BrokerId(old), BrokerId(n));
        }
        nodes[&old]
            .groups
            .raft(g)
            .unwrap()
            .wait(WAIT)
            .metrics(
                |m| m.current_leader == Some(BrokerId(new)),
                "the old leader follows",
            )
            .await
            .unwrap();
        write(&nodes, g, batch(3)).await;
        let leader = nodes[&leader_of(&nodes, g).await].groups.raft(g).unwrap();
        let applied = leader.metrics().borrow_watched().last_applied.map(|id| id.index);
        for node in nodes.values() {
            let raft = node.groups.raft(g).unwrap();
            raft.wait(WAIT)
                .applied_index_at_least(applied, "caught up")
                .await
                .unwrap();
            let offsets: Vec<Offset> = node.logs[&g].batches().iter().map(|b| b.base_offset).collect();
            assert_eq!(offsets, vec![Offset(0), Offset(1), Offset(3)]);
        }
        for node in nodes.values() {
            node.groups.raft(g).unwrap().shutdown().await.unwrap();
        }
    });
}

#[test]
fn a_new_replica_catches_up_from_a_snapshot_sent_in_chunks() {
    let mut rt = Rt::new(1);
    rt.block_on(async {
        let net = MemNet::default();
        let g = group(7);
        // One batch per chunk.
        let config = NetworkConfig {
            snapshot_chunk_bytes: 1,
            ..NetworkConfig::default()
        };
        let mut nodes = HashMap::new();
        nodes.insert(1, start_node(&net, BrokerId(1), &[g], config).await);
        let leader = nodes[&1].groups.raft(g).unwrap();
        leader.initialize(BTreeSet::from([BrokerId(1)])).await.unwrap();
        for n in 1..=3 {
            write(&nodes, g, batch(n)).await;
        }
        // Snapshot and purge the whole log: the new replica can only catch up from the snapshot.
        leader.trigger().snapshot().await.unwrap();
        leader
            .wait(WAIT)
            .snapshot(PartitionLogId::new_term_index(1, 4), "snapshot")
            .await
            .unwrap();
        leader.trigger().purge_log(4).await.unwrap();
        leader
            .wait(WAIT)
            .purged(Some(PartitionLogId::new_term_index(1, 4)), "purged")
            .await
            .unwrap();

        nodes.insert(2, start_node(&net, BrokerId(2), &[g], config).await);
        leader.add_learner(BrokerId(2), (), true).await.unwrap();
        let learner = nodes[&2].groups.raft(g).unwrap();
        learner
            .wait(WAIT)
            .applied_index_at_least(Some(4), "caught up")
            .await
            .unwrap();

        assert_eq!(nodes[&2].logs[&g].batches(), nodes[&1].logs[&g].batches());
        let chunks: Vec<(u32, bool, usize)> = net
            .requests
            .borrow()
            .iter()
            .filter_map(|(_, _, m)| match m {
                Message::Snapshot { chunk, .. } => Some((chunk.chunk_index, chunk.last, chunk.batches.len())),
                _ => None,
            })
            .collect();
        assert_eq!(chunks, vec![(0, false, 1), (1, false, 1), (2, true, 1)]);
        let server = net.net.server(BrokerId(2)).unwrap();
        assert_eq!(server.snapshots_in_progress(), 0);
        for node in nodes.values() {
            node.groups.raft(g).unwrap().shutdown().await.unwrap();
        }
    });
}

type Script = Box<dyn Fn(&Message) -> Result<Message, ConnectionError>>;

/// A connection that answers from a script and records what it was asked.
struct Scripted {
    asked: RefCell<Vec<(BrokerId, Message)>>,
    answer: Script,
}

impl Connection for Scripted {
    fn call(
        &self,
        peer: BrokerId,
        request: Message,
    ) -> impl Future<Output = Result<Message, ConnectionError>> {
        let answer = (self.answer)(&request);
        self.asked.borrow_mut().push((peer, request));
        async move { answer }
    }
}

fn scripted(answer: impl Fn(&Message) -> Result<Message, ConnectionError> + 'static) -> Scripted {
    Scripted {
        asked: RefCell::new(Vec::new()),
        answer: Box::new(answer),
    }
}

fn option() -> RPCOption {
    RPCOption::new(Duration::from_secs(60))
}

fn vote() -> PartitionVote {
    PartitionVote::new_committed(4, BrokerId(1))
}

fn data_entry(index: u64, bytes: usize) -> PartitionEntry {
    PartitionEntry {
        log_id: PartitionLogId::new_term_index(4, index),
        payload: EntryPayload::Normal(EntryData::Batch(KafkaBatch(Bytes::from(vec![0u8; bytes])))),
    }
}

#[test]
fn heartbeats_of_two_groups_to_one_peer_leave_in_one_frame() {
    let mut rt = Rt::new(1);
    rt.block_on(async {
        let conn = scripted(|m| match m {
            Message::Heartbeats(hs) => Ok(Message::HeartbeatReplies(
                hs.iter()
                    .filter(|h| h.group == group(1))
                    .map(|h| crate::transport::codec::HeartbeatReply {
                        group: h.group,
                        reply: AppendReply::Success,
                    })
                    .collect(),
            )),
            _ => Err(ConnectionError::Network("not a heartbeat".into())),
        });
        let network = NodeNetwork::<Rt, _>::new(BrokerId(1), conn, NetworkConfig::default());
        let waiting = Rc::clone(&network);
        let mut queued = Box::pin(async move { waiting.heartbeats_queued().await });
        assert!(futures::poll!(&mut queued).is_pending(), "nothing is queued yet");
        let mut clients = Vec::new();
        for g in [group(1), group(2)] {
            let mut f = network.factory(g);
            clients.push(f.new_heartbeat_client(BrokerId(2), &()).await);
        }
        let tasks: Vec<_> = clients
            .into_iter()
            .map(|mut c| {
                Rt::spawn(async move {
                    let hb = AppendEntriesRequest {
                        vote: vote(),
                        prev_log_id: Some(PartitionLogId::new_term_index(4, 9)),
                        entries: Vec::new(),
                        leader_commit: Some(PartitionLogId::new_term_index(4, 9)),
                    };
                    RaftNetworkV2::append_entries(&mut c, hb, option()).await
                })
            })
            .collect();
        queued.await;
        while network.heartbeats.borrow().queued() < 2 {
            Rt::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(network.tick(), 1, "one frame for one peer");
        let mut queued = Box::pin(network.heartbeats_queued());
        assert!(
            futures::poll!(&mut queued).is_pending(),
            "the tick took every queued heartbeat"
        );
        let mut results = Vec::new();
        for t in tasks {
            results.push(t.await.unwrap());
        }
        assert_eq!(network.connection().asked.borrow().len(), 1);
        assert!(matches!(results[0], Ok(AppendEntriesResponse::Success)));
        // The peer did not answer for the second group.
        assert!(
            matches!(results[1], Err(RPCError::Unreachable(_))),
            "{:?}",
            results[1]
        );
    });
}

#[test]
fn an_append_too_large_for_a_frame_is_cut_to_a_partial_success() {
    let mut rt = Rt::new(1);
    rt.block_on(async {
        let conn = scripted(|m| match m {
            Message::Append { group, .. } => Ok(Message::AppendReply {
                group: *group,
                reply: AppendReply::Success,
            }),
            _ => Err(ConnectionError::Network("not an append".into())),
        });
        let config = NetworkConfig {
            codec: Codec::new(1_000),
            snapshot_chunk_bytes: 100,
            ..NetworkConfig::default()
        };
        let network = NodeNetwork::<Rt, _>::new(BrokerId(1), conn, config);
        let mut client = network.factory(group(1)).new_client(BrokerId(2), &()).await;
        let entries: Vec<_> = (1..=5).map(|i| data_entry(i, 290)).collect();
        let rpc = AppendEntriesRequest {
            vote: vote(),
            prev_log_id: None,
            entries: entries.clone(),
            leader_commit: None,
        };
        let r = RaftNetworkV2::append_entries(&mut client, rpc, option())
            .await
            .unwrap();
        // Three entries of 290 bytes fit a frame of 1,000 bytes with the headers, four do not.
        assert_eq!(
            r,
            AppendEntriesResponse::PartialSuccess(Some(PartitionLogId::new_term_index(4, 3)))
        );
        {
            let asked = network.connection().asked.borrow();
            let Some((_, Message::Append { req, .. })) = asked.first() else {
                panic!("no append sent");
            };
            assert_eq!(req.entries, entries[..3].to_vec());
        }

        // A single entry larger than a frame cannot be sent at all.
        let rpc = AppendEntriesRequest {
            vote: vote(),
            prev_log_id: None,
            entries: vec![data_entry(1, 2_000)],
            leader_commit: None,
        };
        let r = RaftNetworkV2::append_entries(&mut client, rpc, option()).await;
        assert!(matches!(r, Err(RPCError::Network(_))));
    });
}

#[test]
fn a_refused_or_unreachable_peer_is_unreachable_to_openraft() {
    let mut rt = Rt::new(1);
    rt.block_on(async {
        let conn = scripted(|m| match m {
            Message::Vote { group, .. } => Ok(Message::Refused {
                group: *group,
                reason: RefuseReason::UnknownGroup,
            }),
            _ => Err(ConnectionError::Unreachable("down".into())),
        });
        let network = NodeNetwork::<Rt, _>::new(BrokerId(1), conn, NetworkConfig::default());
        let mut client = network.factory(group(1)).new_client(BrokerId(2), &()).await;
        let r = RaftNetworkV2::vote(&mut client, VoteRequest::new(vote(), None), option()).await;
        assert!(matches!(r, Err(RPCError::Unreachable(_))), "{r:?}");
        let r = RaftNetworkV2::pre_vote(&mut client, VoteRequest::new(vote(), None), option()).await;
        assert!(matches!(r, Err(RPCError::Unreachable(_))), "{r:?}");
    });
}

#[test]
fn snapshots_are_cut_into_chunks_with_their_metadata() {
    let meta = crate::transport::codec::PartitionSnapshotMeta {
        last_log_id: Some(PartitionLogId::new_term_index(2, 10)),
        last_membership: Default::default(),
    };
    let batches: Vec<StoredBatch> = (0..5)
        .map(|i| StoredBatch {
            base_offset: Offset(i),
            term: crate::Term(2),
            bytes: Bytes::from(vec![1u8; 100]),
        })
        .collect();
    let side: Vec<StoredSide> = (7..9)
        .map(|index| StoredSide {
            index,
            term: crate::Term(2),
            record: SideRecord {
                keep_from: 0,
                data: Bytes::from(vec![2u8; 100]),
            },
        })
        .collect();
    let snapshot = Snapshot {
        meta: meta.clone(),
        snapshot: PartitionSnapshot {
            next_offset: Offset(5),
            batches: batches.clone(),
            side: side.clone(),
        },
    };
    let chunks = snapshot_chunks(vote(), snapshot, 250);
    assert_eq!(
        chunks.iter().map(|c| c.batches.len()).collect::<Vec<_>>(),
        vec![2, 2, 1, 0]
    );
    assert_eq!(
        chunks.iter().map(|c| c.side.len()).collect::<Vec<_>>(),
        vec![0, 0, 1, 1],
        "side records follow the batches, in chunks of the same size"
    );
    assert_eq!(
        chunks.iter().map(|c| c.chunk_index).collect::<Vec<_>>(),
        vec![0, 1, 2, 3]
    );
    assert_eq!(
        chunks.iter().map(|c| c.last).collect::<Vec<_>>(),
        vec![false, false, false, true]
    );
    assert!(chunks
        .iter()
        .all(|c| c.meta == meta && c.next_offset == Offset(5)));
    let rejoined: Vec<_> = chunks.iter().flat_map(|c| c.batches.clone()).collect();
    assert_eq!(rejoined, batches);
    let rejoined: Vec<_> = chunks.into_iter().flat_map(|c| c.side).collect();
    assert_eq!(rejoined, side);

    // An empty snapshot is one last chunk.
    let empty = Snapshot {
        meta,
        snapshot: PartitionSnapshot::default(),
    };
    let chunks = snapshot_chunks(vote(), empty, 250);
    assert_eq!(chunks.len(), 1);
    assert!(chunks[0].last);
}

fn chunk(index: u32, last: bool, bytes: usize) -> SnapshotChunk {
    SnapshotChunk {
        vote: vote(),
        meta: crate::transport::codec::PartitionSnapshotMeta {
            last_log_id: Some(PartitionLogId::new_term_index(4, 10)),
            last_membership: Default::default(),
        },
        next_offset: Offset(10),
        chunk_index: index,
        last,
        batches: vec![StoredBatch {
            base_offset: Offset(i64::from(index)),
            term: crate::Term(4),
            bytes: valid_batch(bytes),
        }],
        side: Vec::new(),
    }
}

/// A valid one-record batch of `bytes` bytes, or the smallest there is if that is more.
fn valid_batch(bytes: usize) -> Bytes {
    let smallest = strand_protocol::batch::build::simple(1, 0);
    let value_len = bytes.saturating_sub(smallest.len());
    (value_len..value_len + 8)
        .map(|n| {
            let value = vec![7u8; n];
            let record = strand_protocol::batch::build::TestRecord {
                value: Some(&value),
                ..Default::default()
            };
            Bytes::from(strand_protocol::batch::build::batch(&[record], 0))
        })
        .find(|b| b.len() >= bytes)
        .expect("a batch that large")
}

#[test]
fn the_server_refuses_unknown_groups_and_bounds_snapshot_assembly() {
    let mut rt = Rt::new(1);
    rt.block_on(async {
        let net = MemNet::default();
        let node = start_node(&net, BrokerId(2), &[group(7), group(8)], NetworkConfig::default()).await;
        let limits = ServerLimits {
            max_snapshot_bytes: 250,
            max_snapshot_assemblies: 1,
        };
        let server = Server::new(node.groups.clone(), limits);
        let peer = BrokerId(1);
        let ack = |g| Message::SnapshotReply {
            group: g,
            reply: SnapshotReply { vote: vote() },
        };
        let refused = |g, reason| Message::Refused { group: g, reason };

        let req = VoteMsg {
            vote: vote(),
            last_log_id: None,
            leadership_transfer: false,
        };
        let answer = server.handle(peer, Message::Vote { group: group(9), req }).await;
        assert_eq!(answer, refused(group(9), RefuseReason::UnknownGroup));

        // A heartbeat frame naming an unknown group is answered for the known ones only.
        let hb = |g| Heartbeat {
            group: g,
            vote: vote(),
            prev_log_id: None,
            leader_commit: None,
        };
        let answer = server
            .handle(peer, Message::Heartbeats(vec![hb(group(9)), hb(group(7))]))
            .await;
        let Message::HeartbeatReplies(replies) = answer else {
            panic!("not heartbeat replies: {answer:?}");
        };
        assert_eq!(
            replies.iter().map(|r| r.group).collect::<Vec<_>>(),
            vec![group(7)]
        );

        // Chunks in order are acknowledged; a gap drops the transfer.
        let snap = |g, c| Message::Snapshot { group: g, chunk: c };
        assert_eq!(
            server.handle(peer, snap(group(7), chunk(0, false, 100))).await,
            ack(group(7))
        );
        assert_eq!(
            server.handle(peer, snap(group(7), chunk(1, false, 100))).await,
            ack(group(7))
        );
        assert_eq!(server.snapshots_in_progress(), 1);
        let gap = server.handle(peer, snap(group(7), chunk(3, false, 10))).await;
        assert_eq!(gap, refused(group(7), RefuseReason::Unavailable));
        assert_eq!(server.snapshots_in_progress(), 0);

        // The byte bound.
        assert_eq!(
            server.handle(peer, snap(group(7), chunk(0, false, 200))).await,
            ack(group(7))
        );
        let over = server.handle(peer, snap(group(7), chunk(1, false, 100))).await;
        assert_eq!(over, refused(group(7), RefuseReason::Unavailable));
        let too_big = server.handle(peer, snap(group(7), chunk(0, false, 300))).await;
        assert_eq!(too_big, refused(group(7), RefuseReason::Unavailable));

        // The assembly bound: a new transfer evicts the oldest.
        assert_eq!(
            server.handle(peer, snap(group(7), chunk(0, false, 10))).await,
            ack(group(7))
        );
        assert_eq!(
            server.handle(peer, snap(group(8), chunk(0, false, 10))).await,
            ack(group(8))
        );
        assert_eq!(server.snapshots_in_progress(), 1);
        let evicted = server.handle(peer, snap(group(7), chunk(1, false, 10))).await;
        assert_eq!(evicted, refused(group(7), RefuseReason::Unavailable));
        assert_eq!(
            server.handle(peer, snap(group(8), chunk(1, false, 10))).await,
            ack(group(8))
        );

        // Answers are not requests.
        let answer = server.handle(peer, ack(group(7))).await;
        assert_eq!(answer, refused(group(7), RefuseReason::Unsupported));
        for g in [group(7), group(8)] {
            node.groups.raft(g).unwrap().shutdown().await.unwrap();
        }
    });
}

fn entry_at(term: u64, index: u64) -> PartitionEntry {
    PartitionEntry {
        log_id: PartitionLogId::new_term_index(term, index),
        payload: EntryPayload::Blank,
    }
}

fn append(prev: Option<(u64, u64)>, entries: &[(u64, u64)]) -> AppendMsg {
    AppendMsg {
        vote: vote(), // term 4
        prev_log_id: prev.map(|(t, i)| PartitionLogId::new_term_index(t, i)),
        leader_commit: None,
        entries: entries.iter().map(|(t, i)| entry_at(*t, *i)).collect(),
    }
}

#[test]
fn appends_that_break_raft_rules_are_caught() {
    assert_eq!(check_append(&append(None, &[(1, 0), (1, 1), (4, 2)])), Ok(()));
    assert_eq!(check_append(&append(Some((2, 9)), &[(2, 10), (3, 11)])), Ok(()));
    assert_eq!(check_append(&append(Some((2, 9)), &[])), Ok(()));
    assert!(
        check_append(&append(None, &[(1, 1)])).is_err(),
        "not from index 0"
    );
    assert!(check_append(&append(Some((2, 9)), &[(2, 11)])).is_err(), "a gap");
    assert!(
        check_append(&append(Some((2, 9)), &[(2, 10), (2, 10)])).is_err(),
        "a repeat"
    );
    assert!(
        check_append(&append(Some((3, 9)), &[(2, 10)])).is_err(),
        "a term going back"
    );
    assert!(
        check_append(&append(Some((2, 9)), &[(5, 10)])).is_err(),
        "after the leader's term"
    );
    assert!(
        check_append(&append(Some((5, 9)), &[])).is_err(),
        "prev after the leader's term"
    );
    let mut commit_ahead = append(None, &[]);
    commit_ahead.leader_commit = Some(PartitionLogId::new_term_index(5, 1));
    assert!(
        check_append(&commit_ahead).is_err(),
        "commit after the leader's term"
    );
    assert!(
        check_append(&append(Some((2, u64::MAX)), &[(2, 0)])).is_err(),
        "index overflow"
    );
    let mut garbage = append(None, &[]);
    garbage.entries.push(data_entry(0, 100));
    assert!(
        check_append(&garbage).is_err(),
        "a payload that is not a record batch"
    );
    let mut good = append(None, &[]);
    good.entries.push(PartitionEntry {
        log_id: PartitionLogId::new_term_index(4, 0),
        payload: EntryPayload::Normal(EntryData::Batch(KafkaBatch(valid_batch(100)))),
    });
    assert_eq!(check_append(&good), Ok(()));
    let mut bad_chunk = chunk(0, true, 100);
    bad_chunk.batches[0].bytes = Bytes::from(vec![0u8; 100]);
    assert!(
        check_snapshot(&bad_chunk).is_err(),
        "a snapshot batch that is not a record batch"
    );
}

#[test]
fn the_server_refuses_invalid_requests_without_handing_them_to_the_group() {
    let mut rt = Rt::new(1);
    rt.block_on(async {
        let net = MemNet::default();
        let node = start_node(&net, BrokerId(2), &[group(7)], NetworkConfig::default()).await;
        let server = Server::new(node.groups.clone(), ServerLimits::default());
        let peer = BrokerId(1);
        let invalid = Message::Refused {
            group: group(7),
            reason: RefuseReason::Invalid,
        };
        let gap = Message::Append {
            group: group(7),
            req: append(None, &[(1, 0), (1, 2)]),
        };
        assert_eq!(server.handle(peer, gap).await, invalid);
        let mut c = chunk(0, true, 10);
        c.meta.last_log_id = Some(PartitionLogId::new_term_index(9, 10)); // the vote's term is 4
        assert_eq!(
            server
                .handle(
                    peer,
                    Message::Snapshot {
                        group: group(7),
                        chunk: c
                    }
                )
                .await,
            invalid
        );
        // The group saw none of it: it never learned of term 4.
        let raft = node.groups.raft(group(7)).unwrap();
        assert_eq!(raft.metrics().borrow_watched().current_term, 0);
        raft.shutdown().await.unwrap();
    });
}
