//! The replication simulation: real openraft partition groups on the simulation runtime, a
//! simulated network that loses, delays and reorders messages and cuts nodes off, and replica
//! logs that lose what was not flushed when their node crashes. After every step it checks:
//!
//! - **no acknowledged batch lost**: a batch whose write was answered (committed) is durable on
//!   a majority, and in every replica whose high watermark has passed it, at the offset it was
//!   answered with;
//! - **replicas agree below the high watermark**: two replicas hold byte-identical batches at
//!   every offset below both high watermarks;
//! - **no Kafka offset reused**: follows from the first, checked at every step, not only at the
//!   end; offsets are dense (each batch starts where the one before ended);
//! - **no acknowledged side record lost**: the clients also write side records (state kept
//!   beside the log, some asking to let earlier ones go); one answered committed is durable on a
//!   majority with its index and bytes, unless a record asked to let it go.
//!
//! At the end it heals everything and checks that all replicas converge to the same log and
//! the same side records.
//!
//! It runs three times: over the in-memory replica log; the same with the nodes talking
//! through the transport (every message encoded and decoded, heartbeats coalesced per node
//! pair, requests handled by each node's transport server); and over the storage engine itself
//! (a `ShardStore` on `MemFs` with its flusher and checkpoints, whose crash keeps what was
//! synced and a torn prefix of what was not, followed by the journal replay of a start-up).
//!
//! `STRAND_SIM_RAFT_SEEDS=N` runs seeds `0..N` (default 16); `STRAND_SIM_RAFT_SEED=S` replays
//! one seed; `STRAND_SIM_RAFT_SECS` sets the simulated seconds per seed (default 20).

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use openraft::async_runtime::WatchReceiver;
use openraft::{AsyncRuntime, Config, Raft, SnapshotPolicy};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use strand_protocol::batch::build::{batch, TestRecord};
use strand_protocol::types::Offset;
use strand_protocol::types::{PartitionId, TopicId};
use strand_raft::partition::local_net::{Hops, LocalNet};
use strand_raft::partition::shard_log::ShardReplicaLog;
use strand_raft::partition::{
    Applied, Applier, BrokerId, KafkaBatch, MemReplicaLog, PartitionRaft, ReplicaLog, ReplicaStore,
    SideLogSpec, SideRecord, StoredBatch, StoredSide,
};
use strand_raft::rt::{Sim, SimRuntime, TaskGroup};
use strand_raft::transport::codec::{Codec, Frame, GroupId, Message, RequestId};
use strand_raft::transport::network::{
    Connection, ConnectionError, GroupRafts, NetworkConfig, NodeNetwork, Server, ServerLimits,
};
use strand_storage::fs_mem::MemFs;
use strand_storage::log::LogConfig;
use strand_storage::store::{LogId, ShardStore, StoreConfig};
use strand_storage::{replay_journals, LogKey};

type C = PartitionRaft<SimRuntime>;
type Store<B> = ReplicaStore<SimRuntime, <B as Backend>::Log>;
type Node<B> = Raft<C, Store<B>>;

/// Where a simulated replica keeps its log, and what a crash of it keeps.
trait Backend: 'static {
    type Log: ReplicaLog + Clone;
    /// The log a (re)started replica opens its store over.
    fn log(&self) -> Self::Log;
    /// Tasks the storage needs while the node runs, spawned in the node's group.
    fn spawn_tasks(&self, sim: &Sim, group: TaskGroup);
    /// What the log holds, and what of it would survive a crash now.
    fn batches(&self, sim: &Sim) -> (Vec<StoredBatch>, Vec<StoredBatch>);
    /// The side records the log holds, and those of them that would survive a crash now.
    fn side(&self, sim: &Sim) -> (Vec<StoredSide>, Vec<StoredSide>);
    /// A power cut (the node's tasks are already gone), then what a start-up recovers.
    fn crash(&self, sim: &Sim, rng: &mut ChaCha8Rng);
    /// Checks what the log says of leader epochs against the terms its batches carry.
    fn check_epochs(&self, _sim: &Sim) -> Result<(), String> {
        Ok(())
    }
}

/// The in-memory replica log.
struct MemBackend(MemReplicaLog);

impl Backend for MemBackend {
    type Log = MemReplicaLog;

    fn log(&self) -> MemReplicaLog {
        self.0.clone()
    }

    fn spawn_tasks(&self, _sim: &Sim, _group: TaskGroup) {}

    fn batches(&self, _sim: &Sim) -> (Vec<StoredBatch>, Vec<StoredBatch>) {
        (self.0.batches(), self.0.durable_batches())
    }

    fn side(&self, _sim: &Sim) -> (Vec<StoredSide>, Vec<StoredSide>) {
        (self.0.side(), self.0.durable_side())
    }

    fn crash(&self, _sim: &Sim, _rng: &mut ChaCha8Rng) {
        self.0.crash();
    }
}

/// The storage engine: a shard store on `MemFs`, one partition log, its side file.
struct ShardBackend {
    fs: MemFs,
    store: RefCell<Rc<ShardStore<MemFs>>>,
    id: Cell<LogId>,
    log: RefCell<ShardReplicaLog<MemFs>>,
    /// Draws the device latency of each flush round.
    rng: Rc<RefCell<ChaCha8Rng>>,
}

const PARTITION_DIR: &str = "sim-0";
const SIDE_DIR: &str = "sim-0-side";

fn data_root() -> PathBuf {
    PathBuf::from("/data")
}

fn log_config() -> LogConfig {
    LogConfig {
        // Small segments, so that rolls, indexes and checkpoints of several segments happen.
        segment_bytes: 16 << 10,
        ..LogConfig::default()
    }
}

impl ShardBackend {
    fn open(sim: &Sim, fs: MemFs, seed: u64) -> ShardBackend {
        let (store, id, log) = sim.block_on(Self::recover(fs.clone()));
        ShardBackend {
            rng: Rc::new(RefCell::new(ChaCha8Rng::seed_from_u64(seed))),
            fs,
            store: RefCell::new(store),
            id: Cell::new(id),
            log: RefCell::new(log),
        }
    }

    /// Start-up: journal replay, the store, the partition's log and its replica log.
    async fn recover(fs: MemFs) -> (Rc<ShardStore<MemFs>>, LogId, ShardReplicaLog<MemFs>) {
        let report = replay_journals(&fs, &data_root(), |_| Some(log_config()), 0)
            .await
            .expect("journal replay");
        assert!(report.problems.is_empty(), "replay reported problems: {report:?}");
        let config = StoreConfig {
            journal_segment_bytes: 256 << 10,
            ..StoreConfig::default()
        };
        let store = Rc::new(
            ShardStore::open(fs, data_root(), 0, config)
                .await
                .expect("the store opens"),
        );
        let key = LogKey {
            dir_name: PARTITION_DIR.to_owned(),
            incarnation: [7; 16],
        };
        let (id, _) = store.open_log(key, log_config(), 0).await.expect("the log opens");
        let log = ShardReplicaLog::open(
            Rc::clone(&store),
            id,
            data_root().join(PARTITION_DIR),
            Rc::new(|| 0),
        )
        .await
        .expect("the replica log opens")
        .with_side_log(SideLogSpec {
            key: LogKey {
                dir_name: SIDE_DIR.to_owned(),
                incarnation: [8; 16],
            },
            config: log_config(),
        });
        (store, id, log)
    }
}

/// The shard's flusher, as the broker runs it: flush rounds, directory syncs, journal rotation
/// and checkpoints.
async fn flusher(store: Rc<ShardStore<MemFs>>, rng: Rc<RefCell<ChaCha8Rng>>) {
    loop {
        {
            let work = store.wait_for_work();
            let tick = SimRuntime::sleep(Duration::from_millis(500));
            futures::pin_mut!(work);
            futures::pin_mut!(tick);
            futures::future::select(work, tick).await;
        }
        if store.has_pending() {
            // The device's write latency: a crash meanwhile finds the round's writes unsynced.
            let latency = Duration::from_micros(rng.borrow_mut().gen_range(100..3_000));
            SimRuntime::sleep(latency).await;
            store.flush_pending(4, |_| {}).await;
            store.sync_changed_dirs().await;
        }
        if store.wants_checkpoint() || store.has_uncheckpointed_changes() {
            store.rotate_journal().await.expect("journal rotation");
            let s = Rc::clone(&store);
            SimRuntime::spawn(async move {
                s.checkpoint().await.expect("checkpoint");
            });
        }
        // Flush rounds and checkpoints take no virtual time: yield to the others.
        SimRuntime::sleep(Duration::from_micros(500)).await;
    }
}

impl Backend for ShardBackend {
    type Log = ShardReplicaLog<MemFs>;

    fn log(&self) -> ShardReplicaLog<MemFs> {
        self.log.borrow().clone()
    }

    fn spawn_tasks(&self, sim: &Sim, group: TaskGroup) {
        sim.spawn_in(
            group,
            flusher(Rc::clone(&self.store.borrow()), Rc::clone(&self.rng)),
        );
    }

    fn batches(&self, sim: &Sim) -> (Vec<StoredBatch>, Vec<StoredBatch>) {
        let log = self.log();
        let all = sim
            .block_on(log.read_batches(Offset(0), Offset(i64::MAX)))
            .expect("the log reads");
        let store = self.store.borrow();
        let durable_end = store
            .offsets(self.id.get())
            .expect("the log is open")
            .high_watermark;
        let durable = all
            .iter()
            .filter(|b| {
                let h = strand_protocol::batch::BatchHeader::parse(&b.bytes).expect("stored batches parse");
                h.next_offset() <= durable_end
            })
            .cloned()
            .collect();
        (all, durable)
    }

    fn side(&self, sim: &Sim) -> (Vec<StoredSide>, Vec<StoredSide>) {
        let log = self.log();
        let all = sim
            .block_on(log.side_records(0, u64::MAX))
            .expect("the side log reads");
        let durable_end = log.side_durable_index();
        let durable = all.iter().filter(|s| s.index <= durable_end).cloned().collect();
        (all, durable)
    }

    /// OffsetForLeaderEpoch's answer comes from the store's epoch cache: for every term its
    /// batches carry, the cache must end the term where the next term's first batch starts (or
    /// at the log end), through truncations and crashes. A term's blank entry takes no offset,
    /// so the cache needs no entry of its own for it.
    fn check_epochs(&self, sim: &Sim) -> Result<(), String> {
        let (all, _) = self.batches(sim);
        let store = self.store.borrow();
        let id = self.id.get();
        let log_end = store.offsets(id).map_err(|e| e.to_string())?.log_end_offset;
        let mut terms: Vec<(u64, i64)> = Vec::new();
        for b in &all {
            if terms.last().is_none_or(|(t, _)| *t != b.term.0) {
                terms.push((b.term.0, b.base_offset.0));
            }
        }
        // Every epoch from the first to one past the last: the answer is the largest term at or
        // below it that batches carry, ending where the next term's batches start.
        let (Some(first), Some(last)) = (terms.first(), terms.last()) else {
            return Ok(());
        };
        for epoch in first.0..=last.0 + 1 {
            let at = terms.partition_point(|(t, _)| *t <= epoch) - 1;
            let found = terms[at].0;
            let expected_end = terms.get(at + 1).map_or(log_end, |(_, start)| *start);
            let epoch = i32::try_from(epoch).map_err(|_| "term beyond an epoch")?;
            let expected = Some((
                i32::try_from(found).map_err(|_| "term beyond an epoch")?,
                expected_end,
            ));
            let got = store
                .with_log(id, |l| l.end_offset_for_epoch(epoch))
                .map_err(|e| e.to_string())?;
            if got != expected {
                return Err(format!(
                    "OffsetForLeaderEpoch({epoch}): the cache answers {got:?}, the batches say {expected:?}"
                ));
            }
        }
        Ok(())
    }

    fn crash(&self, sim: &Sim, rng: &mut ChaCha8Rng) {
        self.fs.crash(|n| rng.gen_range(0..=n));
        let (store, id, log) = sim.block_on(Self::recover(self.fs.clone()));
        *self.store.borrow_mut() = store;
        self.id.set(id);
        *self.log.borrow_mut() = log;
    }
}

const NODES: u64 = 3;
const CLIENTS: u64 = 4;

/// One simulated broker: its log survives crashes; its Raft node and tasks do not.
struct Replica<B: Backend> {
    backend: B,
    /// What this life of the node's state machine was given, in order.
    applied: Rc<Recorder>,
    store: Option<Store<B>>,
    raft: Option<Node<B>>,
    group: TaskGroup,
    /// Nodes this one cannot exchange messages with (a network partition).
    cut_off: bool,
}

/// A state machine beside the log that records every batch it is given.
#[derive(Default)]
struct Recorder(RefCell<Vec<(i64, Bytes)>>);

impl Applier for Recorder {
    fn apply(&self, base_offset: Offset, batch: &Bytes) -> Result<(), String> {
        self.0.borrow_mut().push((base_offset.0, batch.clone()));
        Ok(())
    }
}

/// An acknowledged write: what the client sent and where it was answered to be.
#[derive(Debug, Clone)]
struct Acked {
    base_offset: Offset,
    batch: Bytes,
}

struct World<B: Backend> {
    sim: Rc<Sim>,
    config: Arc<Config>,
    replicas: RefCell<BTreeMap<BrokerId, Replica<B>>>,
    rng: RefCell<ChaCha8Rng>,
    loss_percent: RefCell<u32>,
    acked: RefCell<Vec<Acked>>,
    /// Acknowledged side records: `(index, data)`.
    acked_side: RefCell<Vec<(u64, Bytes)>>,
    /// The highest keep-from index any side record proposed carried: acknowledged records
    /// below it may be gone.
    side_floor: Cell<u64>,
    /// Failed or unanswered writes (they may or may not have been committed).
    unanswered: RefCell<u64>,
    /// Whether nodes talk through the transport (codec, node networks, coalesced heartbeats,
    /// servers) rather than straight to each other's Rafts.
    wire: bool,
    servers: RefCell<BTreeMap<BrokerId, Rc<NodeServer<B>>>>,
}

impl<B: Backend> World<B> {
    fn link_up(&self, a: BrokerId, b: BrokerId) -> bool {
        let replicas = self.replicas.borrow();
        let up = |id: BrokerId| replicas.get(&id).is_some_and(|r| r.raft.is_some() && !r.cut_off);
        up(a) && up(b)
    }

    fn delay(&self) -> Duration {
        Duration::from_micros(self.rng.borrow_mut().gen_range(200..20_000))
    }

    fn lost(&self) -> bool {
        let loss = *self.loss_percent.borrow();
        loss > 0 && self.rng.borrow_mut().gen_range(0..100) < loss
    }

    fn raft_of(&self, id: BrokerId) -> Option<Node<B>> {
        self.replicas.borrow().get(&id).and_then(|r| r.raft.clone())
    }
}

/// The network between simulated nodes: each message is delayed (so messages reorder), may be
/// lost either way, and is not delivered across a cut.
impl<B: Backend> Hops for World<B> {
    type Sm = Store<B>;
    type Rt = SimRuntime;

    fn hop(
        self: &Rc<Self>,
        from: BrokerId,
        to: BrokerId,
    ) -> Pin<Box<dyn Future<Output = Result<(), String>>>> {
        let delay = self.delay();
        let world = Rc::clone(self);
        Box::pin(async move {
            SimRuntime::sleep(delay).await;
            // Decided on arrival: a node may have gone down meanwhile.
            if !world.link_up(from, to) {
                return Err(format!("{from} cannot reach {to}"));
            }
            if world.lost() {
                return Err(format!("message {from} -> {to} lost"));
            }
            Ok(())
        })
    }

    fn raft(&self, id: BrokerId) -> Option<Node<B>> {
        self.raft_of(id)
    }
}

/// A node's transport server.
type NodeServer<B> = Server<SimRuntime, OneGroup<B>>;

/// The group every simulated node replicates, as the transport names it.
const GROUP: GroupId = GroupId {
    topic: TopicId(uuid::Uuid::from_u128(0x5eed)),
    partition: PartitionId(0),
};

/// A node's group, for its transport server.
struct OneGroup<B: Backend> {
    world: Rc<World<B>>,
    id: BrokerId,
}

impl<B: Backend> GroupRafts<SimRuntime> for OneGroup<B> {
    type StateMachine = Store<B>;

    fn raft(&self, group: GroupId) -> Option<Node<B>> {
        if group != GROUP {
            return None;
        }
        self.world.raft_of(self.id)
    }
}

/// A node's connection to the others over the simulated network: each frame is encoded and
/// decoded with the codec, delayed, lost or cut like any other message, and handled by the
/// peer's transport server.
struct WireConn<B: Backend> {
    world: Rc<World<B>>,
    from: BrokerId,
    next_request: Cell<u64>,
}

impl<B: Backend> WireConn<B> {
    fn through_the_wire(&self, message: Message) -> Result<Message, ConnectionError> {
        let codec = Codec::default();
        let request_id = RequestId(self.next_request.get());
        self.next_request.set(request_id.0 + 1);
        let bytes = codec
            .encode_to_bytes(&Frame { request_id, message })
            .map_err(|e| ConnectionError::Network(e.to_string()))?;
        let frame = codec
            .decode_prefixed(bytes)
            .map_err(|e| ConnectionError::Network(e.to_string()))?;
        Ok(frame.message)
    }
}

impl<B: Backend> Connection for WireConn<B> {
    async fn call(&self, peer: BrokerId, request: Message) -> Result<Message, ConnectionError> {
        let request = self.through_the_wire(request)?;
        self.world
            .hop(self.from, peer)
            .await
            .map_err(ConnectionError::Unreachable)?;
        let server = self.world.servers.borrow().get(&peer).cloned();
        let server = server.ok_or_else(|| ConnectionError::Unreachable(format!("{peer} has no server")))?;
        let answer = server.handle(self.from, request).await;
        self.world
            .hop(peer, self.from)
            .await
            .map_err(ConnectionError::Network)?;
        self.through_the_wire(answer)
    }
}

fn config() -> Arc<Config> {
    let config = Config {
        cluster_name: "partition-sim".into(),
        heartbeat_interval: 50,
        election_timeout_min: 300,
        election_timeout_max: 600,
        // As the broker's partition groups.
        enable_pre_vote: Some(true),
        // Snapshots and purges often, so that followers behind the purge point are sent the log.
        snapshot_policy: SnapshotPolicy::LogsSinceLast(16),
        max_in_snapshot_log_to_keep: 4,
        purge_batch_size: 1,
        ..Default::default()
    };
    Arc::new(config.validate().expect("a valid Raft config"))
}

/// Starts (or restarts) node `id` over its log, in a fresh task group.
fn start<B: Backend>(world: &Rc<World<B>>, id: BrokerId) {
    let group = world.sim.new_group();
    let log = world.replicas.borrow()[&id].backend.log();
    world.replicas.borrow()[&id]
        .backend
        .spawn_tasks(&world.sim, group);
    let recorder = Rc::new(Recorder::default());
    let applier: Rc<dyn Applier> = recorder.clone();
    let store = world
        .sim
        .block_on(Store::<B>::open_with(log, Some(applier)))
        .expect("the replica log reopens");
    world
        .replicas
        .borrow_mut()
        .get_mut(&id)
        .expect("known node")
        .applied = recorder;
    let config = Arc::clone(&world.config);
    let s2 = store.clone();
    let handle = if world.wire {
        let network = NodeNetwork::<SimRuntime, _>::new(
            id,
            WireConn {
                world: Rc::clone(world),
                from: id,
                next_request: Cell::new(0),
            },
            NetworkConfig::default(),
        );
        let server = Server::new(
            OneGroup {
                world: Rc::clone(world),
                id,
            },
            ServerLimits::default(),
        );
        world.servers.borrow_mut().insert(id, Rc::new(server));
        // The node's heartbeat pump: a tick a fifth of the heartbeat interval.
        let pump = Rc::clone(&network);
        world.sim.spawn_in(group, async move {
            loop {
                SimRuntime::sleep(Duration::from_millis(10)).await;
                pump.tick();
            }
        });
        let net = network.factory(GROUP);
        world.sim.spawn_in(
            group,
            async move { Raft::new(id, config, net, s2.clone(), s2).await },
        )
    } else {
        let net = LocalNet::new(Rc::clone(world), id);
        world.sim.spawn_in(
            group,
            async move { Raft::new(id, config, net, s2.clone(), s2).await },
        )
    };
    world.sim.run_until_idle();
    let raft = world
        .sim
        .block_on(handle)
        .expect("not killed")
        .expect("Raft starts");
    let mut replicas = world.replicas.borrow_mut();
    let r = replicas.get_mut(&id).expect("known node");
    r.group = group;
    r.store = Some(store);
    r.raft = Some(raft);
}

/// A crash: the node's tasks die, unflushed writes are lost, the log stays.
fn crash<B: Backend>(world: &Rc<World<B>>, id: BrokerId) {
    let group = {
        let mut replicas = world.replicas.borrow_mut();
        let r = replicas.get_mut(&id).expect("known node");
        r.raft = None;
        r.store = None;
        r.group
    };
    world.sim.kill_group(group);
    let mut rng = world.rng.borrow_mut();
    world
        .replicas
        .borrow()
        .get(&id)
        .expect("known node")
        .backend
        .crash(&world.sim, &mut rng);
}

fn payload(n: u64, records: usize) -> Bytes {
    let value = n.to_be_bytes();
    let recs: Vec<TestRecord<'_>> = (0..records)
        .map(|_| TestRecord {
            value: Some(&value),
            ..Default::default()
        })
        .collect();
    Bytes::from(batch(&recs, 1_700_000_000_000))
}

/// The bytes of a stored batch that its producer chose (all but baseOffset and the epoch).
fn produced_part(b: &[u8]) -> (&[u8], &[u8]) {
    (&b[8..12], &b[16..])
}

/// A client that keeps writing to whichever node leads, one write at a time; several run at
/// once, so writes from different clients are in flight together.
async fn client<B: Backend>(world: Rc<World<B>>, id: u64) {
    let mut n = id << 32;
    loop {
        let pause = Duration::from_millis(world.rng.borrow_mut().gen_range(1..15));
        SimRuntime::sleep(pause).await;
        let leader = {
            let ids: Vec<BrokerId> = world.replicas.borrow().keys().copied().collect();
            let mut found = None;
            for id in ids {
                if let Some(raft) = world.raft_of(id) {
                    if raft.current_leader().await == Some(id) {
                        found = Some(raft);
                        break;
                    }
                }
            }
            found
        };
        let Some(leader) = leader else { continue };
        n += 1;
        if world.rng.borrow_mut().gen_ratio(1, 3) {
            // A side record; now and then one that lets an acknowledged one before it go.
            let keep_from = {
                let acked = world.acked_side.borrow();
                let mut rng = world.rng.borrow_mut();
                match acked.len() {
                    0 => 0,
                    len if rng.gen_ratio(1, 5) => acked[rng.gen_range(0..len)].0,
                    _ => 0,
                }
            };
            world.side_floor.set(world.side_floor.get().max(keep_from));
            let data = Bytes::copy_from_slice(&n.to_be_bytes());
            let write = leader.client_write(
                SideRecord {
                    keep_from,
                    data: data.clone(),
                }
                .into(),
            );
            match SimRuntime::timeout(Duration::from_secs(2), write).await {
                Ok(Ok(resp)) => match resp.data {
                    Applied::Side { index } => world.acked_side.borrow_mut().push((index, data)),
                    other => panic!("a side record was answered as {other:?}"),
                },
                _ => *world.unanswered.borrow_mut() += 1,
            }
            continue;
        }
        let records = world.rng.borrow_mut().gen_range(1..4);
        let bytes = payload(n, records);
        let write = leader.client_write(KafkaBatch(bytes.clone()).into());
        match SimRuntime::timeout(Duration::from_secs(2), write).await {
            Ok(Ok(resp)) => match resp.data {
                Applied::Batch { base_offset } => world.acked.borrow_mut().push(Acked {
                    base_offset,
                    batch: bytes,
                }),
                other => panic!("a batch was answered as {other:?}"),
            },
            _ => *world.unanswered.borrow_mut() += 1,
        }
    }
}

/// A replica as the checks see it: its id, what it holds, what survives a crash of it, and its
/// high watermark (-1 while it is down).
type View = (
    BrokerId,
    BTreeMap<i64, StoredBatch>,
    BTreeMap<i64, StoredBatch>,
    Offset,
);

fn batches_by_offset(bs: Vec<StoredBatch>) -> BTreeMap<i64, StoredBatch> {
    bs.into_iter().map(|b| (b.base_offset.0, b)).collect()
}

/// The invariants, checked between steps.
fn check<B: Backend>(world: &World<B>, seed: u64, when: &str) {
    let replicas = world.replicas.borrow();
    // What each replica holds (live, or what survives for a crashed one) and its high watermark.
    let views: Vec<View> = replicas
        .iter()
        .map(|(id, r)| {
            let hw = r.store.as_ref().map_or(Offset(-1), |s| s.high_watermark());
            let (all, durable) = r.backend.batches(&world.sim);
            (*id, batches_by_offset(all), batches_by_offset(durable), hw)
        })
        .collect();
    for (id, live, _, hw) in &views {
        // Dense offsets: each batch starts where the one before ended.
        let mut next: Option<i64> = None;
        for (o, b) in live {
            if let Some(n) = next {
                assert_eq!(
                    *o, n,
                    "seed {seed} {when}: node {id} has a gap or overlap at offset {o}"
                );
            }
            let header = strand_protocol::batch::BatchHeader::parse(&b.bytes).expect("stored batches parse");
            next = Some(o + header.offset_count());
        }
        if hw.0 >= 0 {
            assert!(
                next.unwrap_or(0) >= hw.0,
                "seed {seed} {when}: node {id}'s high watermark {hw:?} is past its log end"
            );
        }
    }
    for (id, r) in replicas.iter() {
        if let Err(e) = r.backend.check_epochs(&world.sim) {
            panic!("seed {seed} {when}: node {id}: {e}");
        }
    }
    // Each running state machine was given exactly its log below the high watermark, in order.
    for ((id, live, _, hw), r) in views.iter().zip(replicas.values()) {
        if hw.0 < 0 {
            continue;
        }
        let applied = r.applied.0.borrow();
        let expected: Vec<(&i64, &StoredBatch)> = live.range(..hw.0).collect();
        assert_eq!(
            applied.len(),
            expected.len(),
            "seed {seed} {when}: node {id}'s state machine was given {} batches, its log holds {} below the high watermark",
            applied.len(),
            expected.len()
        );
        for ((o, b), (ao, ab)) in expected.iter().zip(applied.iter()) {
            assert_eq!(
                **o, *ao,
                "seed {seed} {when}: node {id} applied offset {ao} where its log has {o}"
            );
            assert_eq!(
                produced_part(&b.bytes),
                produced_part(ab),
                "seed {seed} {when}: node {id} applied other bytes at {o}"
            );
        }
    }
    // Replicas agree below both high watermarks.
    for (a, la, _, ha) in &views {
        for (b, lb, _, hb) in &views {
            if a >= b {
                continue;
            }
            let below = ha.0.min(hb.0);
            for (o, ba) in la.range(..below) {
                let Some(bb) = lb.get(o) else {
                    panic!(
                        "seed {seed} {when}: offset {o} below both high watermarks is on {a} but not on {b}"
                    );
                };
                assert_eq!(
                    ba.bytes, bb.bytes,
                    "seed {seed} {when}: nodes {a} and {b} differ at offset {o}"
                );
            }
        }
    }
    // Acknowledged side records: durable on a majority, unless a record let them go.
    let sides: Vec<(BrokerId, Vec<StoredSide>)> = replicas
        .iter()
        .map(|(id, r)| (*id, r.backend.side(&world.sim).1))
        .collect();
    let live_sides: Vec<(BrokerId, Vec<u64>)> = replicas
        .iter()
        .map(|(id, r)| {
            (
                *id,
                r.backend.side(&world.sim).0.iter().map(|s| s.index).collect(),
            )
        })
        .collect();
    for (index, data) in world.acked_side.borrow().iter() {
        if *index < world.side_floor.get() {
            continue;
        }
        let durable_on = sides
            .iter()
            .filter(|(_, s)| s.iter().any(|r| r.index == *index && r.record.data == *data))
            .count();
        assert!(
            durable_on * 2 > sides.len(),
            "seed {seed} {when}: acknowledged side record {index} is durable on only {durable_on} of {} replicas: durable {:?}; live {live_sides:?}",
            sides.len(),
            sides.iter().map(|(id, s)| (id, s.iter().map(|r| r.index).collect::<Vec<_>>())).collect::<Vec<_>>()
        );
    }
    // Acknowledged batches: durable on a majority, and wherever a high watermark passed them.
    for acked in world.acked.borrow().iter() {
        let o = acked.base_offset.0;
        let mut durable_on = 0;
        for (id, live, durable, hw) in &views {
            let matches = |m: &BTreeMap<i64, StoredBatch>| {
                m.get(&o)
                    .is_some_and(|b| produced_part(&b.bytes) == produced_part(&acked.batch))
            };
            if matches(durable) {
                durable_on += 1;
            }
            if hw.0 > o {
                assert!(matches(live), "seed {seed} {when}: acknowledged batch at {o} missing or changed on {id} below its high watermark");
            }
        }
        assert!(
            durable_on * 2 > views.len(),
            "seed {seed} {when}: acknowledged batch at offset {o} is durable on only {durable_on} of {} replicas",
            views.len()
        );
    }
}

fn run_seed<B: Backend>(seed: u64, secs: u64, wire: bool, backend: impl Fn(&Rc<World<B>>) -> B) {
    let sim = Rc::new(Sim::new(seed));
    let world = Rc::new(World {
        sim: Rc::clone(&sim),
        config: config(),
        replicas: RefCell::new(BTreeMap::new()),
        rng: RefCell::new(ChaCha8Rng::seed_from_u64(seed ^ 0x5eed)),
        loss_percent: RefCell::new(0),
        acked: RefCell::new(Vec::new()),
        acked_side: RefCell::new(Vec::new()),
        side_floor: Cell::new(0),
        unanswered: RefCell::new(0),
        wire,
        servers: RefCell::new(BTreeMap::new()),
    });
    for i in 1..=NODES {
        let backend = sim.enter(|| backend(&world));
        world.replicas.borrow_mut().insert(
            BrokerId(i),
            Replica {
                backend,
                applied: Rc::new(Recorder::default()),
                store: None,
                raft: None,
                group: sim.new_group(),
                cut_off: false,
            },
        );
    }
    sim.enter(|| {
        for i in 1..=NODES {
            start(&world, BrokerId(i));
        }
        let members: BTreeSet<BrokerId> = (1..=NODES).map(BrokerId).collect();
        let first = world.raft_of(BrokerId(1)).expect("node 1 is up");
        let init = sim.spawn(async move { first.initialize(members).await });
        sim.block_on(init)
            .expect("not killed")
            .expect("the group initializes");
    });
    let clients = sim.new_group();
    for id in 0..CLIENTS {
        sim.spawn_in(clients, client(Rc::clone(&world), id));
    }

    let mut crashes = 0;
    let steps = secs * 5;
    for step in 0..steps {
        sim.run_for(Duration::from_millis(200));
        let when = format!("at step {step} ({:?} simulated)", sim.elapsed());
        check(&world, seed, &when);
        let roll: u32 = world.rng.borrow_mut().gen_range(0..100);
        let ids: Vec<BrokerId> = world.replicas.borrow().keys().copied().collect();
        let pick = ids[world.rng.borrow_mut().gen_range(0..ids.len())];
        let (down, cut): (Vec<BrokerId>, Vec<BrokerId>) = {
            let r = world.replicas.borrow();
            (
                ids.iter().copied().filter(|i| r[i].raft.is_none()).collect(),
                ids.iter().copied().filter(|i| r[i].cut_off).collect(),
            )
        };
        sim.enter(|| match roll {
            0..=7 if down.is_empty() => {
                crash(&world, pick);
                crashes += 1;
            }
            // Now and then a second node goes down too: the group stops until one returns.
            0..=2 if down.len() == 1 && !down.contains(&pick) => {
                crash(&world, pick);
                crashes += 1;
            }
            8..=29 if !down.is_empty() => start(&world, down[0]),
            30..=35 if cut.is_empty() => {
                world.replicas.borrow_mut().get_mut(&pick).expect("known").cut_off = true
            }
            36..=50 if !cut.is_empty() => {
                for id in cut {
                    world.replicas.borrow_mut().get_mut(&id).expect("known").cut_off = false;
                }
            }
            51..=55 => *world.loss_percent.borrow_mut() = [0, 5, 20][world.rng.borrow_mut().gen_range(0..3)],
            _ => {}
        });
    }
    // Stop writing, heal everything and let the group settle: every replica converges.
    sim.kill_group(clients);
    sim.enter(|| {
        let down: Vec<BrokerId> = world
            .replicas
            .borrow()
            .iter()
            .filter(|(_, r)| r.raft.is_none())
            .map(|(i, _)| *i)
            .collect();
        for id in down {
            start(&world, id);
        }
        for r in world.replicas.borrow_mut().values_mut() {
            r.cut_off = false;
        }
        *world.loss_percent.borrow_mut() = 0;
    });
    sim.run_for(Duration::from_secs(10));
    check(&world, seed, "after healing");
    let replicas = world.replicas.borrow();
    let states: Vec<String> = replicas
        .iter()
        .map(|(id, r)| {
            let m = r
                .raft
                .as_ref()
                .expect("all up")
                .metrics()
                .borrow_watched()
                .clone();
            let store = r.store.as_ref().expect("all up");
            format!(
                "node {id}: {:?}, last log {:?}, applied {:?}, purged {:?}, high watermark {}, log end {}",
                m.state,
                m.last_log_index,
                m.last_applied.map(|l| l.index),
                m.purged.map(|l| l.index),
                store.high_watermark().0,
                store.log_end_offset().0
            )
        })
        .collect();
    let hws: Vec<Offset> = replicas
        .values()
        .map(|r| r.store.as_ref().expect("all up").high_watermark())
        .collect();
    let logs: Vec<Vec<StoredBatch>> = replicas
        .values()
        .map(|r| r.backend.batches(&world.sim).0)
        .collect();
    let acked = world.acked.borrow();
    assert!(
        hws.windows(2).all(|w| w[0] == w[1]),
        "seed {seed}: high watermarks differ after healing: {states:#?}"
    );
    assert!(
        logs.windows(2).all(|w| w[0] == w[1]),
        "seed {seed}: logs differ after healing"
    );
    let sides: Vec<Vec<StoredSide>> = replicas.values().map(|r| r.backend.side(&world.sim).0).collect();
    // Replicas trim at their own purge points: they agree from the latest first record on.
    let common_from = sides
        .iter()
        .filter_map(|s| s.first().map(|r| r.index))
        .max()
        .unwrap_or(0);
    let common: Vec<Vec<&StoredSide>> = sides
        .iter()
        .map(|s| s.iter().filter(|r| r.index >= common_from).collect())
        .collect();
    assert!(
        common.windows(2).all(|w| w[0] == w[1]),
        "seed {seed}: side records differ after healing: {:?}",
        sides
            .iter()
            .map(|s| s.iter().map(|r| r.index).collect::<Vec<_>>())
            .collect::<Vec<_>>()
    );
    for (index, data) in world.acked_side.borrow().iter() {
        if *index >= world.side_floor.get() {
            assert!(
                sides[0]
                    .iter()
                    .any(|r| r.index == *index && r.record.data == *data),
                "seed {seed}: acknowledged side record {index} is gone after healing"
            );
        }
    }
    assert!(
        !acked.is_empty(),
        "seed {seed}: no write was acknowledged in {secs} simulated seconds"
    );
    eprintln!(
        "seed {seed}: {} acknowledged, {} side records acknowledged, {} unanswered, {crashes} crashes, high watermark {}",
        acked.len(),
        world.acked_side.borrow().len(),
        world.unanswered.borrow(),
        hws[0].0
    );
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

fn mem_backend(world: &Rc<World<MemBackend>>) -> MemBackend {
    let log = MemReplicaLog::new(Offset(0));
    let w = Rc::clone(world);
    log.set_flush_delay(Rc::new(move || {
        let d = Duration::from_micros(w.rng.borrow_mut().gen_range(100..3_000));
        Box::pin(SimRuntime::sleep(d))
    }));
    MemBackend(log)
}

fn shard_backend(world: &Rc<World<ShardBackend>>) -> ShardBackend {
    let seed = world.rng.borrow_mut().gen();
    ShardBackend::open(&world.sim, MemFs::new(), seed)
}

fn run_seeds<B: Backend>(wire: bool, backend: impl Fn(&Rc<World<B>>) -> B + Copy) {
    let secs = env_u64("STRAND_SIM_RAFT_SECS").unwrap_or(20);
    if let Some(seed) = env_u64("STRAND_SIM_RAFT_SEED") {
        run_seed(seed, secs, wire, backend);
        return;
    }
    for seed in 0..env_u64("STRAND_SIM_RAFT_SEEDS").unwrap_or(16) {
        run_seed(seed, secs, wire, backend);
    }
}

#[test]
fn replicas_never_lose_acknowledged_batches_and_agree_below_the_high_watermark() {
    run_seeds(false, mem_backend);
}

#[test]
fn the_same_holds_through_the_transport() {
    run_seeds(true, mem_backend);
}

#[test]
fn the_same_holds_over_the_storage_engine_with_power_cuts() {
    run_seeds(false, shard_backend);
}
