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
//!   end; offsets are dense (each batch starts where the one before ended).
//!
//! At the end it heals everything and checks that all replicas converge to the same log.
//!
//! `STRAND_SIM_RAFT_SEEDS=N` runs seeds `0..N` (default 16); `STRAND_SIM_RAFT_SEED=S` replays
//! one seed; `STRAND_SIM_RAFT_SECS` sets the simulated seconds per seed (default 20).

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use openraft::async_runtime::WatchReceiver;
use openraft::error::{RPCError, StreamingError, Unreachable};
use openraft::network::{RPCOption, RaftNetworkFactory, RaftNetworkV2};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, VoteRequest, VoteResponse,
};
use openraft::{AsyncRuntime, Config, Raft, SnapshotPolicy};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use strand_protocol::batch::build::{batch, TestRecord};
use strand_protocol::types::Offset;
use strand_raft::partition::{
    Applied, BrokerId, KafkaBatch, MemReplicaLog, PartitionRaft, ReplicaStore, StoredBatch,
};
use strand_raft::rt::{Sim, SimRuntime, TaskGroup};

type C = PartitionRaft<SimRuntime>;
type Store = ReplicaStore<SimRuntime, MemReplicaLog>;
type Node = Raft<C, Store>;
type Vote = <C as openraft::RaftTypeConfig>::Vote;
type Snapshot = openraft::type_config::alias::SnapshotOf<C, strand_raft::partition::PartitionSnapshot>;

const NODES: u64 = 3;
const CLIENTS: u64 = 4;

/// One simulated broker: its log survives crashes; its Raft node and tasks do not.
struct Replica {
    log: MemReplicaLog,
    store: Option<Store>,
    raft: Option<Node>,
    group: TaskGroup,
    /// Nodes this one cannot exchange messages with (a network partition).
    cut_off: bool,
}

/// An acknowledged write: what the client sent and where it was answered to be.
#[derive(Debug, Clone)]
struct Acked {
    base_offset: Offset,
    batch: Bytes,
}

struct World {
    sim: Rc<Sim>,
    config: Arc<Config>,
    replicas: RefCell<BTreeMap<BrokerId, Replica>>,
    rng: RefCell<ChaCha8Rng>,
    loss_percent: RefCell<u32>,
    acked: RefCell<Vec<Acked>>,
    /// Failed or unanswered writes (they may or may not have been committed).
    unanswered: RefCell<u64>,
}

impl World {
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

    fn raft_of(&self, id: BrokerId) -> Option<Node> {
        self.replicas.borrow().get(&id).and_then(|r| r.raft.clone())
    }
}

/// The network between two simulated nodes: each message is delayed (so messages reorder),
/// may be lost either way, and is not delivered across a cut.
struct Link {
    world: Rc<World>,
    from: BrokerId,
    to: BrokerId,
}

impl Link {
    async fn hop(&self, a: BrokerId, b: BrokerId) -> Result<(), String> {
        let delay = self.world.delay();
        SimRuntime::sleep(delay).await;
        if !self.world.link_up(a, b) {
            return Err(format!("{a} cannot reach {b}"));
        }
        if self.world.lost() {
            return Err(format!("message {a} -> {b} lost"));
        }
        Ok(())
    }

    async fn target(&self) -> Result<Node, String> {
        self.hop(self.from, self.to).await?;
        self.world
            .raft_of(self.to)
            .ok_or_else(|| format!("{} is down", self.to))
    }
}

fn unreachable(msg: String) -> RPCError<C> {
    RPCError::Unreachable(Unreachable::from_string(msg))
}

impl RaftNetworkV2<C> for Link {
    type SnapshotData = strand_raft::partition::PartitionSnapshot;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<C>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<C>, RPCError<C>> {
        let node = self.target().await.map_err(unreachable)?;
        let resp = node
            .append_entries(rpc)
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        self.hop(self.to, self.from).await.map_err(unreachable)?;
        Ok(resp)
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<C>,
        _option: RPCOption,
    ) -> Result<VoteResponse<C>, RPCError<C>> {
        let node = self.target().await.map_err(unreachable)?;
        let resp = node.vote(rpc).await.map_err(|e| unreachable(e.to_string()))?;
        self.hop(self.to, self.from).await.map_err(unreachable)?;
        Ok(resp)
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: Snapshot,
        _cancel: impl std::future::Future<Output = openraft::error::ReplicationClosed> + 'static,
        _option: RPCOption,
    ) -> Result<SnapshotResponse<C>, StreamingError<C>> {
        let stream_err = |m: String| StreamingError::Unreachable(Unreachable::from_string(m));
        let node = self.target().await.map_err(stream_err)?;
        let resp = node
            .install_full_snapshot(vote, snapshot)
            .await
            .map_err(|e| stream_err(e.to_string()))?;
        self.hop(self.to, self.from).await.map_err(stream_err)?;
        Ok(resp)
    }
}

struct Net {
    world: Rc<World>,
    from: BrokerId,
}

impl RaftNetworkFactory<C> for Net {
    type Network = Link;

    async fn new_client(&mut self, target: BrokerId, _node: &()) -> Link {
        Link {
            world: Rc::clone(&self.world),
            from: self.from,
            to: target,
        }
    }
}

fn config() -> Arc<Config> {
    let config = Config {
        cluster_name: "partition-sim".into(),
        heartbeat_interval: 50,
        election_timeout_min: 300,
        election_timeout_max: 600,
        // Snapshots and purges often, so that followers behind the purge point are sent the log.
        snapshot_policy: SnapshotPolicy::LogsSinceLast(16),
        max_in_snapshot_log_to_keep: 4,
        purge_batch_size: 1,
        ..Default::default()
    };
    Arc::new(config.validate().expect("a valid Raft config"))
}

/// Starts (or restarts) node `id` over its log, in a fresh task group.
fn start(world: &Rc<World>, id: BrokerId) {
    let group = world.sim.new_group();
    let log = world.replicas.borrow()[&id].log.clone();
    let store = world
        .sim
        .block_on(Store::open(log))
        .expect("the replica log reopens");
    let net = Net {
        world: Rc::clone(world),
        from: id,
    };
    let config = Arc::clone(&world.config);
    let s2 = store.clone();
    let handle = world.sim.spawn_in(
        group,
        async move { Raft::new(id, config, net, s2.clone(), s2).await },
    );
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
fn crash(world: &Rc<World>, id: BrokerId) {
    let group = {
        let mut replicas = world.replicas.borrow_mut();
        let r = replicas.get_mut(&id).expect("known node");
        r.raft = None;
        r.store = None;
        r.group
    };
    world.sim.kill_group(group);
    world.replicas.borrow().get(&id).expect("known node").log.crash();
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
async fn client(world: Rc<World>, id: u64) {
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
        let records = world.rng.borrow_mut().gen_range(1..4);
        let bytes = payload(n, records);
        let write = leader.client_write(KafkaBatch(bytes.clone()));
        match SimRuntime::timeout(Duration::from_secs(2), write).await {
            Ok(Ok(resp)) => match resp.data {
                Applied::Batch { base_offset } => world.acked.borrow_mut().push(Acked {
                    base_offset,
                    batch: bytes,
                }),
                Applied::Internal => panic!("a batch was answered as an internal entry"),
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
fn check(world: &World, seed: u64, when: &str) {
    let replicas = world.replicas.borrow();
    // What each replica holds (live, or what survives for a crashed one) and its high watermark.
    let views: Vec<View> = replicas
        .iter()
        .map(|(id, r)| {
            let hw = r.store.as_ref().map_or(Offset(-1), |s| s.high_watermark());
            (
                *id,
                batches_by_offset(r.log.batches()),
                batches_by_offset(r.log.durable_batches()),
                hw,
            )
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

fn run_seed(seed: u64, secs: u64) {
    let sim = Rc::new(Sim::new(seed));
    let world = Rc::new(World {
        sim: Rc::clone(&sim),
        config: config(),
        replicas: RefCell::new(BTreeMap::new()),
        rng: RefCell::new(ChaCha8Rng::seed_from_u64(seed ^ 0x5eed)),
        loss_percent: RefCell::new(0),
        acked: RefCell::new(Vec::new()),
        unanswered: RefCell::new(0),
    });
    for i in 1..=NODES {
        let log = MemReplicaLog::new(Offset(0));
        let w = Rc::clone(&world);
        log.set_flush_delay(Rc::new(move || {
            let d = Duration::from_micros(w.rng.borrow_mut().gen_range(100..3_000));
            Box::pin(SimRuntime::sleep(d))
        }));
        world.replicas.borrow_mut().insert(
            BrokerId(i),
            Replica {
                log,
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
    let logs: Vec<Vec<StoredBatch>> = replicas.values().map(|r| r.log.batches()).collect();
    let acked = world.acked.borrow();
    assert!(
        hws.windows(2).all(|w| w[0] == w[1]),
        "seed {seed}: high watermarks differ after healing: {states:#?}"
    );
    assert!(
        logs.windows(2).all(|w| w[0] == w[1]),
        "seed {seed}: logs differ after healing"
    );
    assert!(
        !acked.is_empty(),
        "seed {seed}: no write was acknowledged in {secs} simulated seconds"
    );
    eprintln!(
        "seed {seed}: {} acknowledged, {} unanswered, {crashes} crashes, high watermark {}",
        acked.len(),
        world.unanswered.borrow(),
        hws[0].0
    );
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

#[test]
fn replicas_never_lose_acknowledged_batches_and_agree_below_the_high_watermark() {
    let secs = env_u64("STRAND_SIM_RAFT_SECS").unwrap_or(20);
    if let Some(seed) = env_u64("STRAND_SIM_RAFT_SEED") {
        run_seed(seed, secs);
        return;
    }
    for seed in 0..env_u64("STRAND_SIM_RAFT_SEEDS").unwrap_or(16) {
        run_seed(seed, secs);
    }
}
