//! Idle partition groups cost (almost) nothing, and still fail over: three simulated nodes
//! host many groups; once writes stop, the groups quiesce and the whole simulation's polls
//! fall to the nodes' liveness pings; when a node crashes, the groups it led elect new leaders
//! among the survivors within a bound, and every group takes writes again.
//!
//! `STRAND_SIM_RAFT_SEED` picks the seed (default 1).

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use openraft::async_runtime::WatchReceiver;
use openraft::{AsyncRuntime, Config, Raft};
use strand_protocol::batch::build::{batch, TestRecord};
use strand_protocol::types::Offset;
use strand_raft::partition::local_net::{Hops, LocalNet};
use strand_raft::partition::quiesce::{self, QuiesceConfig, Quiescer};
use strand_raft::partition::{BrokerId, KafkaBatch, MemReplicaLog, PartitionRaft, ReplicaStore};
use strand_raft::rt::{Sim, SimRuntime, TaskGroup};

type Rt = SimRuntime;
type Store = ReplicaStore<Rt, MemReplicaLog>;
type Node = Raft<PartitionRaft<Rt>, Store>;

const NODES: u64 = 3;
const GROUPS: usize = 30;
/// Groups in the whole-cluster restart: enough for several rounds of campaigns.
const STORM_GROUPS: usize = 120;
/// Campaigns in flight per node in the whole-cluster restart.
const STORM_CAMPAIGNS: usize = 4;
const TICK: Duration = Duration::from_millis(100);

struct Host {
    rafts: Vec<Option<Node>>,
    logs: Vec<MemReplicaLog>,
    quiescer: Quiescer<usize>,
    tasks: TaskGroup,
    up: bool,
}

struct World {
    sim: Rc<Sim>,
    config: Arc<Config>,
    hosts: RefCell<BTreeMap<BrokerId, Host>>,
    quiescing: bool,
    groups: usize,
    quiesce: QuiesceConfig,
    /// The most campaigns any node had in flight at one of its ticks.
    max_in_flight: std::cell::Cell<usize>,
}

/// The network of one group.
struct GroupNet {
    world: Rc<World>,
    group: usize,
}

impl Hops for GroupNet {
    type Sm = Store;
    type Rt = Rt;

    fn hop(
        self: &Rc<Self>,
        _from: BrokerId,
        to: BrokerId,
    ) -> Pin<Box<dyn Future<Output = Result<(), String>>>> {
        let world = Rc::clone(&self.world);
        Box::pin(async move {
            Rt::sleep(Duration::from_millis(1)).await;
            if world.up(to) {
                Ok(())
            } else {
                Err(format!("{to} is down"))
            }
        })
    }

    fn raft(&self, id: BrokerId) -> Option<Node> {
        self.world.hosts.borrow().get(&id)?.rafts.get(self.group)?.clone()
    }
}

impl World {
    fn up(&self, id: BrokerId) -> bool {
        self.hosts.borrow().get(&id).is_some_and(|h| h.up)
    }

    fn now_ms(&self) -> u64 {
        self.sim.elapsed().as_millis() as u64
    }

    fn start(self: &Rc<Self>, id: BrokerId) {
        let tasks = self.sim.new_group();
        let logs = self.hosts.borrow()[&id].logs.clone();
        let mut rafts = Vec::new();
        for (g, log) in logs.into_iter().enumerate() {
            let net = LocalNet::new(
                Rc::new(GroupNet {
                    world: Rc::clone(self),
                    group: g,
                }),
                id,
            );
            let config = Arc::clone(&self.config);
            let h = self.sim.spawn_in(tasks, async move {
                let store = Store::open(log).await.expect("opens");
                Raft::new(id, config, net, store.clone(), store)
                    .await
                    .expect("starts")
            });
            rafts.push(Some(self.sim.block_on(h).expect("not killed")));
        }
        let now = self.now_ms();
        {
            let mut hosts = self.hosts.borrow_mut();
            let host = hosts.get_mut(&id).expect("known");
            host.rafts = rafts;
            host.tasks = tasks;
            host.up = true;
            host.quiescer = Quiescer::new(self.quiesce);
            // As the broker starts them: quiet, without a leader, elected by the host (the
            // world without quiescing keeps every timer running instead).
            for g in 0..self.groups {
                if self.quiescing {
                    host.quiescer.add_quiesced(g, now);
                } else {
                    host.quiescer.add(g, now);
                }
            }
        }
        if self.quiescing {
            let rafts = self.hosts.borrow()[&id].rafts.clone();
            let t = self.sim.spawn_in(tasks, async move {
                for raft in rafts.iter().flatten() {
                    quiesce::apply(raft, quiesce::Action::Quiesce).await;
                }
            });
            self.sim.block_on(t).expect("not killed");
        }
        // The node's housekeeping: liveness pings to its peers (one per pair and tick, whatever
        // the number of groups), then the quiescer's actions.
        let world = Rc::clone(self);
        self.sim.spawn_in(tasks, async move {
            loop {
                Rt::sleep(TICK).await;
                let now = world.now_ms();
                for peer in (1..=NODES).map(BrokerId).filter(|p| *p != id) {
                    if world.up(peer) {
                        if let Some(h) = world.hosts.borrow_mut().get_mut(&peer) {
                            h.quiescer.peer_heard(id, now);
                        }
                    }
                }
                if !world.quiescing {
                    continue;
                }
                let (rafts, actions, campaigns) = {
                    let mut hosts = world.hosts.borrow_mut();
                    let host = hosts.get_mut(&id).expect("known");
                    let rafts = host.rafts.clone();
                    let leaders: Vec<Option<BrokerId>> = rafts
                        .iter()
                        .map(|r| {
                            r.as_ref()
                                .and_then(|r| r.metrics().borrow_watched().current_leader)
                        })
                        .collect();
                    let actions = host.quiescer.tick(now, id, |g| leaders[g]);
                    let campaigns = host.quiescer.campaigns(now, id, preference);
                    let in_flight = host.quiescer.campaigns_in_flight(now);
                    world.max_in_flight.set(world.max_in_flight.get().max(in_flight));
                    (rafts, actions, campaigns)
                };
                for (g, action) in actions {
                    if let Some(raft) = &rafts[g] {
                        quiesce::apply(raft, action).await;
                    }
                }
                for g in campaigns {
                    if let Some(raft) = &rafts[g] {
                        let _ = raft.trigger().elect(true).await;
                    }
                }
            }
        });
    }

    fn crash(&self, id: BrokerId) {
        let tasks = {
            let mut hosts = self.hosts.borrow_mut();
            let host = hosts.get_mut(&id).expect("known");
            host.up = false;
            for r in &mut host.rafts {
                *r = None;
            }
            host.tasks
        };
        self.sim.kill_group(tasks);
        for log in &self.hosts.borrow()[&id].logs {
            log.crash();
        }
    }

    /// Writes one batch to group `g` through whichever node leads it, waking it first.
    async fn write(self: &Rc<Self>, g: usize, n: u64) -> bool {
        let value = n.to_be_bytes();
        let bytes = Bytes::from(batch(
            &[TestRecord {
                value: Some(&value),
                ..Default::default()
            }],
            0,
        ));
        for _ in 0..100 {
            for id in (1..=NODES).map(BrokerId) {
                let raft = self
                    .hosts
                    .borrow()
                    .get(&id)
                    .and_then(|h| h.rafts.get(g).cloned().flatten());
                let Some(raft) = raft else { continue };
                if raft.metrics().borrow_watched().current_leader != Some(id) {
                    continue;
                }
                let wake = {
                    let now = self.now_ms();
                    self.hosts
                        .borrow_mut()
                        .get_mut(&id)
                        .and_then(|h| h.quiescer.activity(g, now))
                };
                if let Some(action) = wake {
                    quiesce::apply(&raft, action).await;
                }
                let w = raft.client_write(KafkaBatch(bytes.clone()).into());
                if let Ok(Ok(_)) = Rt::timeout(Duration::from_secs(1), w).await {
                    return true;
                }
            }
            Rt::sleep(Duration::from_millis(50)).await;
        }
        false
    }

    fn writes(self: &Rc<Self>, n: u64) {
        let me = Rc::clone(self);
        let t = self.sim.spawn(async move {
            let mut ok = 0;
            for g in 0..me.groups {
                if me.write(g, n).await {
                    ok += 1;
                }
            }
            ok
        });
        let ok = self.sim.block_on(t).expect("not killed");
        assert_eq!(ok, self.groups, "every group takes a write");
    }

    /// Groups whose leader, as every running node sees it, is a running node.
    fn led_groups(&self) -> usize {
        let hosts = self.hosts.borrow();
        (0..self.groups)
            .filter(|g| {
                let leaders: BTreeSet<Option<BrokerId>> = hosts
                    .values()
                    .filter(|h| h.up)
                    .map(|h| {
                        h.rafts[*g]
                            .as_ref()
                            .and_then(|r| r.metrics().borrow_watched().current_leader)
                    })
                    .collect();
                leaders.len() == 1
                    && leaders
                        .iter()
                        .next()
                        .copied()
                        .flatten()
                        .is_some_and(|l| hosts[&l].up)
            })
            .count()
    }
}

fn quiesce_config() -> QuiesceConfig {
    QuiesceConfig {
        idle_after_ms: 1_000,
        peer_timeout_ms: 1_000,
        campaign_window_ms: 1_000,
        // openraft's, unset: the longest election timeout.
        leader_lease_ms: 1_000,
        max_campaigns: 64,
    }
}

/// Group `g`'s replicas in preference order: the node that initialized it first.
fn preference(g: usize) -> Vec<BrokerId> {
    (0..NODES).map(|i| BrokerId((g as u64 + i) % NODES + 1)).collect()
}

fn world(seed: u64, quiescing: bool) -> Rc<World> {
    world_of(seed, quiescing, GROUPS, quiesce_config())
}

fn world_of(seed: u64, quiescing: bool, groups: usize, quiesce: QuiesceConfig) -> Rc<World> {
    let sim = Rc::new(Sim::new(seed));
    let config = Config {
        heartbeat_interval: 100,
        election_timeout_min: 500,
        election_timeout_max: 1_000,
        // As the broker's partition groups.
        enable_pre_vote: Some(true),
        ..Default::default()
    };
    let w = Rc::new(World {
        sim,
        config: Arc::new(config.validate().expect("valid")),
        hosts: RefCell::new(BTreeMap::new()),
        quiescing,
        groups,
        quiesce,
        max_in_flight: std::cell::Cell::new(0),
    });
    for id in (1..=NODES).map(BrokerId) {
        let tasks = w.sim.new_group();
        w.hosts.borrow_mut().insert(
            id,
            Host {
                rafts: Vec::new(),
                logs: (0..groups).map(|_| MemReplicaLog::new(Offset(0))).collect(),
                quiescer: Quiescer::new(quiesce),
                tasks,
                up: false,
            },
        );
    }
    w.sim.enter(|| {
        for id in (1..=NODES).map(BrokerId) {
            w.start(id);
        }
        // Leaders spread over the nodes: group g is initialized by node g % 3 + 1.
        for g in 0..groups {
            let first = BrokerId(g as u64 % NODES + 1);
            let raft = w.hosts.borrow()[&first].rafts[g].clone().expect("up");
            let members: BTreeSet<BrokerId> = (1..=NODES).map(BrokerId).collect();
            let t = w.sim.spawn(async move { raft.initialize(members).await });
            w.sim.block_on(t).expect("not killed").expect("initializes");
        }
    });
    w
}

/// Polls per simulated second, per group, over `secs` of idleness.
fn idle_polls_per_group_second(w: &World, secs: u64) -> f64 {
    let before = w.sim.polls();
    w.sim.run_for(Duration::from_secs(secs));
    (w.sim.polls() - before) as f64 / secs as f64 / GROUPS as f64
}

#[test]
fn idle_groups_quiesce_and_still_fail_over() {
    let seed = seed();

    // Without quiescing: every group's timers run.
    let busy = world(seed, false);
    busy.sim.enter(|| busy.writes(1));
    busy.sim.run_for(Duration::from_secs(3));
    let busy_polls = idle_polls_per_group_second(&busy, 10);

    let w = world(seed, true);
    w.sim.enter(|| w.writes(1));
    w.sim.run_for(Duration::from_secs(3));
    let quiet_polls = idle_polls_per_group_second(&w, 10);
    let quiesced: usize = w
        .hosts
        .borrow()
        .values()
        .map(|h| h.quiescer.quiesced_count())
        .sum();
    eprintln!(
        "{GROUPS} idle groups on {NODES} nodes: {busy_polls:.1} polls per group and second without quiescing, \
         {quiet_polls:.2} with ({quiesced} of {} replicas quiesced)",
        GROUPS * NODES as usize
    );
    assert_eq!(quiesced, GROUPS * NODES as usize, "every idle replica quiesced");
    assert!(
        quiet_polls * 20.0 < busy_polls,
        "quiescing cuts idle polls at least 20-fold: {busy_polls} -> {quiet_polls}"
    );

    // Node 1 crashes: the groups it led elect among the survivors, woken by its silence.
    w.sim.enter(|| w.crash(BrokerId(1)));
    let failed_over = w
        .until_every_group_led(Duration::from_secs(10))
        .expect("every group has a live leader within 10 s");
    eprintln!("every group led by a survivor {failed_over:?} after the crash");
    assert!(
        failed_over <= Duration::from_secs(3),
        "fail-over took {failed_over:?}"
    );

    // Every group takes writes, quiesced or not, and the crashed node catches up on return.
    w.sim.enter(|| w.writes(2));
    w.sim.enter(|| w.start(BrokerId(1)));
    w.sim.run_for(Duration::from_secs(5));
    assert_eq!(w.led_groups(), GROUPS);
}

/// `STRAND_SIM_RAFT_SEED`, or 1.
fn seed() -> u64 {
    std::env::var("STRAND_SIM_RAFT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1)
}

impl World {
    /// Runs until every group has a live leader, at most `limit`: how long that took.
    fn until_every_group_led(&self, limit: Duration) -> Option<Duration> {
        let from = self.sim.elapsed();
        while self.sim.elapsed() - from < limit {
            self.sim.run_for(Duration::from_millis(100));
            if self.led_groups() == self.groups {
                return Some(self.sim.elapsed() - from);
            }
        }
        None
    }

    /// Each group's term, the highest any node holding it sees.
    fn terms(&self) -> Vec<u64> {
        let hosts = self.hosts.borrow();
        (0..self.groups)
            .map(|g| {
                hosts
                    .values()
                    .filter_map(|h| h.rafts.get(g).cloned().flatten())
                    .map(|r| r.metrics().borrow_watched().current_term)
                    .max()
                    .unwrap_or(0)
            })
            .collect()
    }
}

/// Every node stops at once and starts again (a whole cluster's restart): every replica starts
/// quiet without a leader, and the hosts elect all the groups, no node with more than
/// `STORM_CAMPAIGNS` campaigns in flight, almost every group in one election.
#[test]
fn a_whole_cluster_restart_elects_every_group_a_bounded_number_at_a_time() {
    let seed = seed();
    let config = QuiesceConfig {
        max_campaigns: STORM_CAMPAIGNS,
        ..quiesce_config()
    };
    let w = world_of(seed, true, STORM_GROUPS, config);
    w.sim.enter(|| w.writes(1));
    w.sim.run_for(Duration::from_secs(3));
    assert_eq!(w.led_groups(), STORM_GROUPS);
    let before = w.terms();

    w.sim.enter(|| {
        for id in (1..=NODES).map(BrokerId) {
            w.crash(id);
        }
        for id in (1..=NODES).map(BrokerId) {
            w.start(id);
        }
    });
    w.max_in_flight.set(0);
    let elected = w
        .until_every_group_led(Duration::from_secs(30))
        .expect("every group has a leader within 30 s");
    let after = w.terms();
    let elections: u64 = before.iter().zip(&after).map(|(b, a)| a - b).sum();
    eprintln!(
        "{STORM_GROUPS} groups elected {elected:?} after a whole-cluster restart: {elections} terms, \
         at most {} campaigns in flight on a node",
        w.max_in_flight.get()
    );
    assert!(w.max_in_flight.get() <= STORM_CAMPAIGNS);
    // Rounds of at most 3 x STORM_CAMPAIGNS groups, a tick or so each.
    assert!(elected <= Duration::from_secs(10), "took {elected:?}");
    assert!(
        elections <= STORM_GROUPS as u64 * 3 / 2,
        "{elections} terms for {STORM_GROUPS} groups: campaigns overtook each other"
    );
    w.sim.enter(|| w.writes(2));
}
