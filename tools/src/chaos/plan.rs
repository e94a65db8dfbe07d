//! The seeded schedule of a run: which faults, on which victims, after how much load, for how
//! long. A pure function of the seed and the parameters, so a failing seed replays the same
//! schedule (not the same interleaving of the nodes' threads with the clients: a failing seed
//! is a scenario to rerun, not an exact replay).

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use super::checker::{NodeNo, PartitionNo};

/// What a run does to the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Scenario {
    /// kill -9 the leader of a seed-chosen partition, restart it after a seeded while; repeat.
    LeaderKill,
    /// SIGTERM and restart every node in a seed-chosen order, one at a time, under load; each
    /// cycle is one round over all nodes.
    RollingRestart,
    /// kill -9 a seed-chosen node, remove its data directory, restart it under the same id.
    WipedDisk,
    /// Cut the leader of a seed-chosen partition off from the other nodes while clients write
    /// to both sides, then heal.
    IsolateLeader,
}

impl Scenario {
    /// Cycles of the full run when `--cycles` is not given.
    pub fn default_cycles(self) -> u32 {
        match self {
            Scenario::LeaderKill => 20,
            Scenario::RollingRestart => 2,
            Scenario::WipedDisk => 3,
            Scenario::IsolateLeader => 5,
        }
    }
}

/// What one step does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// SIGKILL the node leading this partition at that moment, restart it.
    KillLeaderOf(PartitionNo),
    /// SIGTERM this node (a controlled shutdown), restart it.
    Restart(NodeNo),
    /// SIGKILL this node, remove its data directory, restart it under the same id.
    WipeAndRestart(NodeNo),
    /// Isolate the node leading this partition from the other nodes, heal.
    IsolateLeaderOf(PartitionNo),
}

/// One step: load for `load_ms`, then the fault; the node stays down (or isolated) for
/// `down_ms` before it is restarted (or healed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Step {
    pub cycle: u32,
    pub load_ms: u64,
    pub action: Action,
    pub down_ms: u64,
}

/// The ranges the seed draws timings from, in ms (inclusive).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Timings {
    pub load_ms: (u64, u64),
    pub down_ms: (u64, u64),
}

/// The schedule of `cycles` cycles of `scenario` on `nodes` nodes (numbered from 1) and
/// `partitions` partitions.
pub fn plan(
    scenario: Scenario,
    seed: u64,
    cycles: u32,
    nodes: u32,
    partitions: i32,
    t: Timings,
) -> Vec<Step> {
    assert!(
        nodes >= 1 && partitions >= 1,
        "a plan needs a node and a partition"
    );
    assert!(
        t.load_ms.0 <= t.load_ms.1 && t.down_ms.0 <= t.down_ms.1,
        "empty timing range"
    );
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut steps = Vec::new();
    for cycle in 0..cycles {
        let actions: Vec<Action> = match scenario {
            Scenario::LeaderKill => vec![Action::KillLeaderOf(PartitionNo(rng.gen_range(0..partitions)))],
            Scenario::IsolateLeader => {
                vec![Action::IsolateLeaderOf(PartitionNo(rng.gen_range(0..partitions)))]
            }
            Scenario::WipedDisk => vec![Action::WipeAndRestart(NodeNo(rng.gen_range(1..=nodes)))],
            Scenario::RollingRestart => {
                let mut order: Vec<u32> = (1..=nodes).collect();
                order.shuffle(&mut rng);
                order.into_iter().map(|n| Action::Restart(NodeNo(n))).collect()
            }
        };
        for action in actions {
            steps.push(Step {
                cycle,
                load_ms: rng.gen_range(t.load_ms.0..=t.load_ms.1),
                action,
                down_ms: rng.gen_range(t.down_ms.0..=t.down_ms.1),
            });
        }
    }
    steps
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Timings = Timings {
        load_ms: (100, 900),
        down_ms: (0, 50),
    };

    #[test]
    fn a_seed_replays_and_another_differs() {
        let a = plan(Scenario::LeaderKill, 7, 20, 3, 8, T);
        assert_eq!(a, plan(Scenario::LeaderKill, 7, 20, 3, 8, T));
        assert_ne!(a, plan(Scenario::LeaderKill, 8, 20, 3, 8, T));
        assert_eq!(a.len(), 20);
        assert!(a
            .iter()
            .all(|s| (100..=900).contains(&s.load_ms) && s.down_ms <= 50));
        assert!(a
            .iter()
            .all(|s| matches!(s.action, Action::KillLeaderOf(PartitionNo(p)) if (0..8).contains(&p))));
        // The victims vary over 20 cycles.
        let first = a[0].action;
        assert!(a.iter().any(|s| s.action != first));
    }

    #[test]
    fn a_rolling_restart_restarts_every_node_once_per_cycle() {
        let p = plan(Scenario::RollingRestart, 3, 2, 3, 4, T);
        assert_eq!(p.len(), 6);
        for cycle in 0..2 {
            let mut nodes: Vec<u32> = p
                .iter()
                .filter(|s| s.cycle == cycle)
                .map(|s| match s.action {
                    Action::Restart(n) => n.0,
                    other => panic!("{other:?}"),
                })
                .collect();
            nodes.sort_unstable();
            assert_eq!(nodes, vec![1, 2, 3]);
        }
    }

    #[test]
    fn wiped_disk_picks_existing_nodes() {
        let p = plan(Scenario::WipedDisk, 11, 10, 1, 4, T);
        assert!(p.iter().all(|s| s.action == Action::WipeAndRestart(NodeNo(1))));
        let p = plan(Scenario::WipedDisk, 11, 30, 3, 4, T);
        assert!(p
            .iter()
            .all(|s| matches!(s.action, Action::WipeAndRestart(NodeNo(n)) if (1..=3).contains(&n))));
    }
}
