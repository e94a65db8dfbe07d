//! Three controllers on the simulation runtime, over in-memory metadata logs that lose what was
//! not flushed when their node crashes.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use openraft::{AsyncRuntime, Config, Raft};
use strand_protocol::types::{NodeId, Offset, TopicId};
use strand_raft::partition::local_net::{Hops, LocalNet};
use strand_raft::partition::{BrokerId, MemReplicaLog, PartitionRaft, ReplicaStore};
use strand_raft::rt::{Sim, SimRuntime, TaskGroup};

use super::*;
use crate::cluster::control::{
    create_topic, heartbeat, register_broker, BrokerRegistrationRequest, CreateTopic, Heartbeat,
};
use crate::cluster::record::{Endpoint, IncarnationId};

type Rt = SimRuntime;
type Ctl = Controller<Rt, MemReplicaLog>;

struct Node {
    log: MemReplicaLog,
    controller: Option<Rc<Ctl>>,
    group: TaskGroup,
}

struct Quorum {
    sim: Rc<Sim>,
    config: Arc<Config>,
    nodes: RefCell<BTreeMap<BrokerId, Node>>,
}

impl Hops for Quorum {
    type Sm = ReplicaStore<Rt, MemReplicaLog>;
    type Rt = Rt;

    fn hop(
        self: &Rc<Self>,
        _from: BrokerId,
        to: BrokerId,
    ) -> Pin<Box<dyn Future<Output = Result<(), String>>>> {
        let me = Rc::clone(self);
        Box::pin(async move {
            Rt::sleep(Duration::from_millis(2)).await;
            if me.nodes.borrow().get(&to).is_some_and(|n| n.controller.is_some()) {
                Ok(())
            } else {
                Err(format!("{to} is down"))
            }
        })
    }

    fn raft(&self, id: BrokerId) -> Option<Raft<PartitionRaft<Rt>, Self::Sm>> {
        self.nodes
            .borrow()
            .get(&id)?
            .controller
            .as_ref()
            .map(|c| c.raft().clone())
    }
}

impl Quorum {
    fn new(seed: u64) -> Rc<Quorum> {
        let sim = Rc::new(Sim::new(seed));
        let config = Config {
            heartbeat_interval: 50,
            election_timeout_min: 300,
            election_timeout_max: 600,
            ..Default::default()
        };
        let q = Rc::new(Quorum {
            sim,
            config: Arc::new(config.validate().expect("valid")),
            nodes: RefCell::new(BTreeMap::new()),
        });
        for i in 1..=3 {
            let group = q.sim.new_group();
            q.nodes.borrow_mut().insert(
                BrokerId(i),
                Node {
                    log: MemReplicaLog::new(Offset(0)),
                    controller: None,
                    group,
                },
            );
            q.start(BrokerId(i));
        }
        let first = q.controller(BrokerId(1));
        let members: BTreeSet<BrokerId> = (1..=3).map(BrokerId).collect();
        let init = q.sim.spawn(async move { first.raft().initialize(members).await });
        q.sim.block_on(init).expect("not killed").expect("initialized");
        q
    }

    fn start(self: &Rc<Self>, id: BrokerId) {
        let group = self.sim.new_group();
        let log = self.nodes.borrow()[&id].log.clone();
        let net = LocalNet::new(Rc::clone(self), id);
        let config = Arc::clone(&self.config);
        let handle = self.sim.spawn_in(
            group,
            async move { Controller::start(id, config, net, log).await },
        );
        let controller = self.sim.block_on(handle).expect("not killed").expect("starts");
        let mut nodes = self.nodes.borrow_mut();
        let node = nodes.get_mut(&id).expect("known");
        node.group = group;
        node.controller = Some(Rc::new(controller));
    }

    fn crash(&self, id: BrokerId) {
        let group = {
            let mut nodes = self.nodes.borrow_mut();
            let node = nodes.get_mut(&id).expect("known");
            node.controller = None;
            node.group
        };
        self.sim.kill_group(group);
        self.nodes.borrow()[&id].log.crash();
    }

    fn controller(&self, id: BrokerId) -> Rc<Ctl> {
        Rc::clone(self.nodes.borrow()[&id].controller.as_ref().expect("up"))
    }

    /// Runs `decide` on whichever controller leads, retrying until one accepts it.
    fn decide<T: 'static>(
        self: &Rc<Self>,
        decide: impl Fn(&ClusterState, &mut Liveness) -> Result<(Vec<Record>, T), AdminError> + 'static,
    ) -> T {
        let me = Rc::clone(self);
        let task = self.sim.spawn(async move {
            let decide = Rc::new(decide);
            for _ in 0..200 {
                let ids: Vec<BrokerId> = me.nodes.borrow().keys().copied().collect();
                for id in ids {
                    let Some(c) = me.nodes.borrow()[&id].controller.clone() else {
                        continue;
                    };
                    let d = Rc::clone(&decide);
                    match c.decide(0, move |s, l| d(s, l)).await {
                        Ok(v) => return v,
                        Err(ControllerError::NotController { .. }) => continue,
                        Err(e) => panic!("decision failed: {e:?}"),
                    }
                }
                Rt::sleep(Duration::from_millis(50)).await;
            }
            panic!("no controller took the decision");
        });
        self.sim.block_on(task).expect("not killed")
    }

    fn states(&self) -> Vec<ClusterState> {
        self.nodes
            .borrow()
            .values()
            .filter_map(|n| n.controller.as_ref().map(|c| c.state().clone()))
            .collect()
    }
}

fn registration(id: i32) -> BrokerRegistrationRequest {
    BrokerRegistrationRequest {
        broker: NodeId(id),
        incarnation: IncarnationId(uuid::Uuid::from_u128(id as u128)),
        endpoints: vec![Endpoint {
            listener: "PLAINTEXT".into(),
            host: format!("broker-{id}"),
            port: 9092,
        }],
        rack: None,
        shards: 2,
    }
}

fn topic(name: &str, n: u128) -> CreateTopic {
    CreateTopic {
        name: name.into(),
        id: TopicId(uuid::Uuid::from_u128(n)),
        partitions: 6,
        replication_factor: 3,
        assignments: Vec::new(),
        configs: Vec::new(),
    }
}

/// Registers brokers 1 to 3 and brings them out of fencing.
fn register_all(q: &Rc<Quorum>) {
    for id in 1..=3 {
        let epoch = q.decide(move |s, l| register_broker(s, l, &registration(id), 0));
        // A registered broker is fenced until a heartbeat shows it has caught up.
        let reply = q.decide(move |s, l| {
            let hb = Heartbeat {
                broker: NodeId(id),
                epoch,
                metadata_offset: s.next_offset(),
                want_fence: false,
                want_shutdown: false,
            };
            heartbeat(s, l, &hb, 0)
        });
        assert!(!reply.is_fenced, "{reply:?}");
    }
}

#[test]
fn controllers_agree_on_the_state_across_crashes_and_a_leader_change() {
    let q = Quorum::new(3);
    register_all(&q);
    q.decide(|s, _| create_topic(s, &topic("orders", 1)).map(|r| (r, ())));
    q.sim.run_for(Duration::from_secs(1));
    let states = q.states();
    assert_eq!(states.len(), 3);
    assert!(
        states.windows(2).all(|w| w[0] == w[1]),
        "controllers disagree: {states:#?}"
    );
    assert_eq!(states[0].brokers().count(), 3);
    let orders = states[0].topic_by_name("orders").expect("the topic exists");
    let before = states[0].clone();

    // A follower crashes (losing what it had not flushed) and comes back: replaying its log
    // rebuilds the same state.
    let leader = q.sim.block_on({
        let c = q.controller(BrokerId(1));
        q.sim.spawn(async move { c.raft().current_leader().await })
    });
    let leader = leader.expect("not killed").expect("a leader");
    let follower = (1..=3)
        .map(BrokerId)
        .find(|id| *id != leader)
        .expect("a follower");
    q.crash(follower);
    q.start(follower);
    q.sim.run_for(Duration::from_secs(1));
    assert_eq!(
        *q.controller(follower).state(),
        before,
        "the restarted controller rebuilt another state"
    );

    // The leader crashes: another takes over and its decisions continue the same log.
    q.crash(leader);
    q.sim.run_for(Duration::from_secs(3));
    q.decide(|s, _| create_topic(s, &topic("payments", 2)).map(|r| (r, ())));
    q.start(leader);
    q.sim.run_for(Duration::from_secs(2));
    let states = q.states();
    assert_eq!(states.len(), 3);
    assert!(
        states.windows(2).all(|w| w[0] == w[1]),
        "controllers disagree after the leader change"
    );
    assert!(states[0].topic_by_name("payments").is_some());
    assert_eq!(states[0].topic_by_name("orders"), Some(orders));
    assert!(states[0].next_offset() > before.next_offset());
}

#[test]
fn decisions_asked_together_commit_as_one_entry_each_seeing_those_before_it() {
    let q = Quorum::new(5);
    register_all(&q);
    q.decide(|s, _| create_topic(s, &topic("orders", 1)).map(|r| (r, ())));
    q.sim.run_for(Duration::from_secs(1));
    let leader = (1..=3)
        .map(BrokerId)
        .find(|id| {
            let c = q.controller(*id);
            q.sim
                .block_on(q.sim.spawn(async move { c.raft().current_leader().await }))
                .expect("not killed")
                == Some(*id)
        })
        .expect("a leader");
    let c = q.controller(leader);
    let last_log = || {
        use openraft::async_runtime::WatchReceiver;
        c.raft().metrics().borrow_watched().last_log_index
    };
    let (before_log, before_offset) = (last_log(), c.next_offset());

    // Five decisions asked at once (polled together, before the round's task runs): three new
    // topics, one that names a topic an earlier decision of the same round creates, and one
    // that refuses outright.
    let ctl = Rc::clone(&c);
    let asked = q.sim.spawn(async move {
        let mut asked: Vec<futures::future::LocalBoxFuture<'_, Result<(), String>>> = Vec::new();
        for (i, name) in ["a", "b", "c", "b"].into_iter().enumerate() {
            let n = 10 + i as u128;
            let d = ctl.decide(0, move |s, _| create_topic(s, &topic(name, n)).map(|r| (r, ())));
            asked.push(Box::pin(async move { d.await.map_err(|e| format!("{e:?}")) }));
        }
        let refused = ctl.decide(0, |_, _| -> Result<(Vec<Record>, ()), AdminError> {
            Err(AdminError::new(
                kafka_protocol::ResponseError::InvalidRequest,
                "no",
            ))
        });
        asked.push(Box::pin(
            async move { refused.await.map_err(|e| format!("{e:?}")) },
        ));
        futures::future::join_all(asked).await
    });
    let answers = q.sim.block_on(asked).expect("not killed");
    assert!(answers[..3].iter().all(Result::is_ok), "{answers:?}");
    assert!(
        answers[3]
            .as_ref()
            .is_err_and(|e| e.contains("TopicAlreadyExists")),
        "the second `b` saw the first: {answers:?}"
    );
    assert!(
        answers[4].as_ref().is_err_and(|e| e.contains("InvalidRequest")),
        "{answers:?}"
    );

    // One Raft entry (one metadata batch) for the three topics.
    assert_eq!(last_log(), before_log.map(|i| i + 1), "one round, one entry");
    assert!(c.next_offset() > before_offset);
    q.sim.run_for(Duration::from_secs(1));
    let states = q.states();
    assert!(states.windows(2).all(|w| w[0] == w[1]), "controllers disagree");
    for name in ["orders", "a", "b", "c"] {
        assert!(states[0].topic_by_name(name).is_some(), "{name} is missing");
    }
}

#[test]
fn a_decision_batch_reads_back_as_its_records_and_junk_is_refused() {
    let state = ClusterState::default();
    let (records, _) =
        register_broker(&state, &mut Liveness::default(), &registration(7), 0).expect("registers");
    let batch = decision_batch(&records, 1_700_000_000_000);
    assert_eq!(decision_records(&batch).expect("decodes"), records);
    assert!(decision_records(&Bytes::from_static(b"not a batch")).is_err());
    let applier = MetadataApplier::default();
    assert!(
        applier.apply(Offset(5), &batch).is_err(),
        "a batch at the wrong metadata offset is refused"
    );
    applier.apply(Offset(0), &batch).expect("applies at offset 0");
    assert_eq!(applier.state().brokers().count(), 1);
}
