//! Real openraft on both runtimes: a three-node cluster elects a leader, replicates three
//! writes, and every node applies them (`cluster.rs`, instantiated once per runtime).

mod on_sim {
    use crate::rt::{Sim, SimRuntime};

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
