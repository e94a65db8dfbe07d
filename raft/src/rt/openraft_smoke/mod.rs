//! Real openraft on both runtimes: a three-node cluster elects a leader, replicates three
//! writes, and every node applies them (`cluster.rs`, instantiated once per runtime). On the
//! simulation also: the leader crashes (its task group is killed) and the survivors elect a new
//! leader through their election timers, in virtual time, replayably.

mod on_sim {
    use crate::rt::{Sim, SimRuntime, TaskGroup};

    type Rt = SimRuntime;
    include!("cluster.rs");

    fn run(seed: u64) -> (Outcome, u64, Duration) {
        let sim = Sim::new(seed);
        let outcome = sim.block_on(smoke(Duration::from_millis(1), Duration::from_secs(30)));
        (outcome, sim.fingerprint(), sim.elapsed())
    }

    #[test]
    fn three_nodes_elect_replicate_and_apply() {
        let (outcome, _, elapsed) = run(1);
        assert_all_applied(&outcome);
        assert!(
            outcome.followed.values().all(|f| *f == Some(outcome.leader)),
            "every node follows the leader: {outcome:?}"
        );
        assert!(elapsed > Duration::ZERO, "virtual time passed: {elapsed:?}");
        assert!(
            elapsed < Duration::from_secs(30),
            "well within the waits: {elapsed:?}"
        );
    }

    /// The whole cluster run replays from its seed: the same polls at the same virtual times.
    #[test]
    fn a_cluster_run_replays_from_its_seed() {
        let a = run(7);
        let b = run(7);
        assert_eq!(a.0, b.0);
        assert_eq!(a.1, b.1, "same schedule");
        assert_eq!(a.2, b.2, "same virtual duration");
        let others: std::collections::HashSet<u64> = (8..11).map(|s| run(s).1).collect();
        assert!(
            others.iter().any(|f| *f != a.1),
            "other seeds schedule differently"
        );
    }

    /// What the crash scenario observed.
    #[derive(Debug, PartialEq, Eq)]
    struct Failover {
        old_leader: u64,
        new_leader: u64,
        /// Virtual time from the crash until the new leader's lease held.
        failover: Duration,
        /// The survivors' applied data.
        applied: BTreeMap<u64, Vec<String>>,
        fingerprint: u64,
    }

    /// Each node in its own task group; the leader's group is killed after three writes, the
    /// survivors elect a new leader through their election timers and take a fourth write.
    fn crash_the_leader(seed: u64) -> Failover {
        let sim = Sim::new(seed);
        let wait = Duration::from_secs(30);
        let config = test_config();
        let router = Router {
            latency: Duration::from_millis(1),
            ..Router::default()
        };
        let mut machines = BTreeMap::new();
        let mut groups: BTreeMap<u64, TaskGroup> = BTreeMap::new();
        for id in 1..=3u64 {
            let group = sim.new_group();
            let sm = StateMachine::default();
            let (config, r, s) = (config.clone(), router.clone(), sm.clone());
            // Raft::new spawns the node's tasks from a task of `group`, so they join it.
            let started = sim.spawn_in(group, async move {
                Raft::new(id, config, r, LogStore::default(), s)
                    .await
                    .expect("a node starts")
            });
            let raft = sim.block_on(started).expect("the start task ran");
            router.nodes.borrow_mut().insert(id, raft);
            machines.insert(id, sm);
            groups.insert(id, group);
        }
        let nodes: BTreeMap<u64, Node> = router.nodes.borrow().clone();
        let old_leader = sim.block_on(async {
            nodes[&1]
                .initialize(BTreeMap::from([1u64, 2, 3].map(|id| (id, BasicNode::new("")))))
                .await
                .expect("the cluster initializes");
            let mut leader = await_leader(&nodes, 1, None, wait).await;
            let mut last = 0;
            for data in ["a", "b", "c"] {
                last = write(&nodes, &mut leader, data, wait).await;
            }
            let followed = await_applied(&nodes, last, wait).await;
            assert!(
                followed.values().all(|f| *f == Some(leader)),
                "all follow {leader}: {followed:?}"
            );
            leader
        });
        let tasks_before = sim.group_task_count(groups[&old_leader]);
        assert!(tasks_before > 0, "the leader's tasks are in its group");
        assert_eq!(sim.kill_group(groups[&old_leader]), tasks_before);
        router.nodes.borrow_mut().remove(&old_leader);

        let survivors: BTreeMap<u64, Node> = nodes
            .iter()
            .filter(|(id, _)| **id != old_leader)
            .map(|(id, n)| (*id, n.clone()))
            .collect();
        let via = *survivors.keys().next().expect("two survivors");
        let crashed_at = sim.now();
        let (new_leader, failover) = sim.block_on(async {
            let mut leader = await_leader(&survivors, via, Some(old_leader), wait).await;
            let failover = sim.now() - crashed_at;
            let last = write(&survivors, &mut leader, "d", wait).await;
            let followed = await_applied(&survivors, last, wait).await;
            assert!(
                followed.values().all(|f| *f == Some(leader)),
                "all follow {leader}: {followed:?}"
            );
            (leader, failover)
        });
        for raft in survivors.values() {
            sim.block_on(raft.shutdown()).expect("a clean shutdown");
        }
        let applied = survivors
            .keys()
            .map(|id| (*id, machines[id].0.borrow().applied.clone()))
            .collect();
        Failover {
            old_leader,
            new_leader,
            failover,
            applied,
            fingerprint: sim.fingerprint(),
        }
    }

    #[test]
    fn survivors_elect_a_new_leader_when_the_leader_crashes() {
        let run = crash_the_leader(3);
        assert_ne!(run.new_leader, run.old_leader);
        let expected: Vec<String> = ["a", "b", "c", "d"].iter().map(|s| s.to_string()).collect();
        assert_eq!(run.applied.len(), 2);
        for (id, data) in &run.applied {
            assert_eq!(
                data, &expected,
                "survivor {id} kept the old writes and applied the new one"
            );
        }
        // Followers wait at least the minimum election timeout after the last heartbeat.
        assert!(
            run.failover >= Duration::from_millis(150) && run.failover < Duration::from_secs(5),
            "failover took {:?} of virtual time",
            run.failover
        );
    }

    /// The crash scenario replays from its seed, and the seed decides which survivor wins.
    #[test]
    fn the_failover_replays_from_its_seed() {
        assert_eq!(crash_the_leader(5), crash_the_leader(5));
        let winners: std::collections::BTreeSet<u64> =
            (0..8).map(|s| crash_the_leader(s).new_leader).collect();
        assert_eq!(winners.len(), 2, "either survivor can win, depending on the seed");
    }
}

mod on_glommio {
    use crate::rt::GlommioRuntime;

    type Rt = GlommioRuntime;
    include!("cluster.rs");

    #[test]
    fn three_nodes_elect_replicate_and_apply() {
        let mut rt = GlommioRuntime::new(1);
        let outcome = rt.block_on(smoke(Duration::ZERO, Duration::from_secs(60)));
        assert_all_applied(&outcome);
    }
}
