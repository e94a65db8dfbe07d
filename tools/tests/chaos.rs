//! The fault-injection harness, short: a single node killed with SIGKILL and restarted under
//! idempotent acks=all load for a few cycles (nothing acknowledged may be lost, duplicated or
//! reordered, and the node's segment files must hold what the read-back returned), and a
//! single node whose disk is wiped (the checker must report the acknowledged records lost).
//! `strand-chaos --scenario leader-kill` (20 cycles) is the long version. And a queue on three
//! nodes whose leaders are killed while HTTP workers lease and settle 100,000 messages
//! (`strand-chaos --workload queue` is the long version).
//!
//! Needs `STRAND_BIN` (the release broker; the test command exports it); fails, saying so,
//! without it. No assertion on time: recoveries are awaited (up to 30 s each) and reported,
//! not timed.

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use strand_tools::chaos::checker::NodeNo;
use strand_tools::chaos::harness::{run, FaultKind, Options, Report};
use strand_tools::chaos::nodes::Nodes;
use strand_tools::chaos::plan::{Scenario, Timings};
use strand_tools::chaos::queue_run::{self, QueueOptions};

fn strand_bin() -> PathBuf {
    let bin = std::env::var_os("STRAND_BIN").map(PathBuf::from).expect(
        "STRAND_BIN must name the release broker (cargo build --release -p strand-broker --bin strand)",
    );
    assert!(bin.is_file(), "STRAND_BIN={} is not a file", bin.display());
    bin
}

fn short(scenario: Scenario, seed: u64, cycles: u32, root: &std::path::Path) -> Report {
    short_on(1, scenario, seed, cycles, root)
}

/// The options of a short run on `nodes` nodes (more than one: a KRaft cluster, replication
/// factor 3): one shard per node, 3 partitions at 200 records/s, faults of up to 200 ms.
fn short_options(nodes: u32, scenario: Scenario, seed: u64, cycles: u32, root: &std::path::Path) -> Options {
    let mut opts = Options::new(strand_bin(), root.to_path_buf(), scenario, seed, nodes);
    opts.cycles = cycles;
    opts.partitions = 3;
    opts.rate_per_sec = 200;
    opts.timings = Timings {
        load_ms: (300, 800),
        down_ms: (0, 200),
    };
    opts.strand_args = vec!["--override".into(), "strand.shards=1".into()];
    opts.message_timeout_ms = 30_000;
    opts.recover_timeout = Duration::from_secs(30);
    opts
}

/// Runs `opts`, printing its progress and report.
fn run_printed(opts: &Options) -> Report {
    let report = run(opts, |line| eprintln!("{line}")).unwrap_or_else(|e| panic!("{e:#}"));
    eprintln!("{}", report.render());
    report
}

/// A short run on `nodes` nodes ([`short_options`]).
fn short_on(nodes: u32, scenario: Scenario, seed: u64, cycles: u32, root: &std::path::Path) -> Report {
    run_printed(&short_options(nodes, scenario, seed, cycles, root))
}

#[test]
fn a_killed_node_loses_nothing_it_acknowledged() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let r = short(Scenario::LeaderKill, 5, 3, dir.path());
    assert_eq!(r.cycles_run, 3, "{r:#?}");
    assert_eq!(r.faults.len(), 3);
    assert!(r
        .faults
        .iter()
        .all(|f| f.kind == FaultKind::Kill9 && f.partitions_led.len() == 3));
    assert!(r.problems.is_empty(), "{:?}", r.problems);
    let t = &r.verdict.totals;
    assert!(t.acked > 0 && t.records_read >= t.acked, "{t:?}");
    assert_eq!(r.verdict.violations(), 0, "{}", r.render());
    // One node, one replica: nothing to compare between replicas, but its segment files were
    // read and hold what the read-back returned.
    assert!(r
        .verdict
        .partitions
        .iter()
        .all(|p| p.replicas.replicas == 1 && p.replicas.problems.is_empty()));
    // Every kill recovered (the harness waited for it) and has a gap.
    let u = &r.verdict.unavailability;
    assert_eq!((u.kills.len(), u.never_recovered), (3, 0), "{u:?}");
    assert!(u.max_ms.is_some() && u.median_ms <= u.max_ms);
}

#[test]
fn a_node_restarted_with_sigterm_loses_nothing_it_acknowledged() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let r = short(Scenario::RollingRestart, 2, 1, dir.path());
    assert_eq!((r.cycles_run, r.faults.len()), (1, 1), "{r:#?}");
    assert_eq!(r.faults[0].kind, FaultKind::Sigterm);
    assert!(r.faults[0].how.contains("SIGTERM"), "{}", r.faults[0].how);
    assert!(r.problems.is_empty(), "{:?}", r.problems);
    assert!(r.verdict.totals.acked > 0);
    assert_eq!(r.verdict.violations(), 0, "{}", r.render());
    assert_eq!(r.sigterm_unavailability.kills.len(), 1);
}

#[test]
fn a_wiped_disk_on_one_node_is_reported_as_loss() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let r = short(Scenario::WipedDisk, 9, 1, dir.path());
    assert_eq!(r.cycles_run, 1, "{r:#?}");
    assert_eq!(r.faults[0].kind, FaultKind::WipedDisk);
    // Every partition acknowledged writes before the wipe (the load waits for that before the
    // first fault), and the wipe took the only copy.
    let lost: Vec<u64> = r.verdict.partitions.iter().map(|p| p.lost).collect();
    assert!(lost.iter().all(|&l| l > 0), "{}", r.render());
    assert!(r.failures() > 0);
}

/// In a cluster a wiped node's partitions have other replicas: it rejoins under its id, the
/// groups it led elect another leader (their followers do not wait for the restarted node,
/// which holds nothing), it catches up, and nothing acknowledged is lost.
#[test]
fn a_wiped_disk_in_a_three_node_cluster_loses_nothing() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let r = short_on(3, Scenario::WipedDisk, 1, 1, dir.path());
    assert_eq!(r.cycles_run, 1, "{r:#?}");
    assert_eq!(r.faults[0].kind, FaultKind::WipedDisk);
    assert!(r.problems.is_empty(), "{:?}", r.problems);
    assert!(r.verdict.totals.acked > 0);
    assert_eq!(r.verdict.violations(), 0, "{}", r.render());
    assert!(
        r.verdict.partitions.iter().all(|p| p.replicas.replicas == 3),
        "{}",
        r.render()
    );
}

/// Whether a TCP connection from inside `namespace` to `host`:9092 opens within 2 s.
fn reaches(namespace: &str, host: &str) -> bool {
    Command::new("ip")
        .args(["netns", "exec", namespace, "timeout", "2", "bash", "-c"])
        .arg(format!("exec 3<>/dev/tcp/{host}/9092"))
        .status()
        .is_ok_and(|s| s.success())
}

fn client_reaches(host: &str) -> bool {
    let addr = format!("{host}:9092").parse().unwrap();
    TcpStream::connect_timeout(&addr, Duration::from_secs(2)).is_ok()
}

/// The plumbing of isolate-leader: three nodes, each in its own network namespace (they run
/// standalone until nodes form a cluster); one is cut off from the other two both ways while
/// the harness, a client, still reaches all three; healed, they reach one another again; a
/// node in a namespace is killed and restarted like any other; the namespaces go with the
/// nodes.
#[test]
#[ignore = "needs root and iproute2 (creates network namespaces): run with -- --ignored as root"]
fn nodes_in_namespaces_can_be_isolated_from_one_another_but_not_from_clients() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let args = vec!["--override".to_string(), "strand.shards=1".into()];
    let mut nodes = Nodes::new(
        &strand_bin(),
        dir.path(),
        3,
        true,
        &args,
        Duration::from_secs(60),
        Instant::now(),
    )
    .unwrap_or_else(|e| panic!("{e:#}"));
    nodes.start_all().unwrap_or_else(|e| panic!("{e:#}"));
    let (h1, h2, h3) = (
        nodes.specs[0].host.clone(),
        nodes.specs[1].host.clone(),
        nodes.specs[2].host.clone(),
    );
    let namespaces: Vec<String> = (1..=3).map(|n| nodes.namespace_of(NodeNo(n)).unwrap()).collect();
    let ns = |n: usize| namespaces[n - 1].as_str();
    assert!(h1.starts_with("10.213.") && h1 != h2, "{h1} {h2}");
    for h in [&h1, &h2, &h3] {
        assert!(client_reaches(h), "the harness reaches {h}");
    }
    assert!(reaches(ns(2), &h1) && reaches(ns(1), &h3) && reaches(ns(3), &h2));

    nodes.isolate(NodeNo(1)).unwrap();
    assert!(
        !reaches(ns(2), &h1) && !reaches(ns(3), &h1),
        "others reach the isolated node"
    );
    assert!(
        !reaches(ns(1), &h2) && !reaches(ns(1), &h3),
        "the isolated node reaches others"
    );
    assert!(reaches(ns(2), &h3), "the others still reach one another");
    for h in [&h1, &h2, &h3] {
        assert!(client_reaches(h), "the harness still reaches {h}");
    }
    nodes.heal(NodeNo(1)).unwrap();
    assert!(reaches(ns(2), &h1) && reaches(ns(1), &h3));

    let killed = nodes.kill(NodeNo(2)).unwrap();
    assert!(killed.how.contains("SIGKILL"), "{}", killed.how);
    // The listener closes with the process, though not at once: the kernel tears a dead
    // process's io_uring down (and the sockets it holds) asynchronously.
    let deadline = Instant::now() + Duration::from_secs(10);
    while client_reaches(&h2) {
        assert!(
            Instant::now() < deadline,
            "node 2 still listens 10 s after its SIGKILL"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    nodes.start(NodeNo(2)).unwrap_or_else(|e| panic!("{e:#}"));
    assert!(client_reaches(&h2));

    let prefix = ns(1);
    let prefix = prefix.trim_end_matches("-n1").to_string();
    drop(nodes);
    let list = Command::new("ip").args(["netns", "list"]).output().unwrap();
    assert!(
        !String::from_utf8_lossy(&list.stdout).contains(&prefix),
        "namespaces left behind"
    );
}

/// A leader cut off from the other two nodes (which the clients still reach) for 7–8 s: the
/// others elect leaders of its partitions, and its clients, refused and disconnected by it
/// once it finds itself cut off, write to the new leaders well before the isolation ends.
/// Nothing acknowledged is lost or duplicated on either side.
#[test]
#[ignore = "needs root and iproute2 (creates network namespaces): run with -- --ignored as root"]
fn an_isolated_leaders_clients_go_on_with_the_others_while_it_is_cut_off() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let mut opts = short_options(3, Scenario::IsolateLeader, 1, 2, dir.path());
    opts.netns = true;
    opts.timings = Timings {
        load_ms: (1_000, 2_000),
        down_ms: (7_000, 8_000),
    };
    opts.message_timeout_ms = 60_000;
    let r = run_printed(&opts);
    assert_eq!(r.cycles_run, 2, "{r:#?}");
    assert!(r.problems.is_empty(), "{:?}", r.problems);
    assert_eq!(r.verdict.violations(), 0, "{}", r.render());
    for f in &r.faults {
        assert_eq!(f.kind, FaultKind::Isolation);
        let recovered = f.recovered_after_ms.unwrap_or(f64::MAX);
        // Not a speed target: an isolated leader that kept its clients would leave them
        // waiting for the whole isolation (the 7 s down time).
        assert!(
            recovered < f.down_ms as f64 - 2_000.0,
            "the partitions of node {} took writes again only {recovered} ms after it was cut off for {} ms",
            f.node.0,
            f.down_ms
        );
    }
}

/// HTTP workers lease and settle 100,000 messages (acks, nacks, delays, poison, abandoned
/// leases) on a queue of three nodes while the leader of a seed-chosen partition is killed with
/// SIGKILL and restarted, again and again: the recorder finds nothing lost, nothing delivered
/// after its ack, every late ack of an abandoned lease refused `409 stale_generation`, every
/// poison message in the dead-letter topic, no delay fired early.
#[test]
fn a_queue_keeps_its_promises_when_its_leaders_are_killed() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let mut opts = Options::new(strand_bin(), dir.path().to_path_buf(), Scenario::LeaderKill, 3, 3);
    opts.cycles = 3;
    opts.partitions = 3;
    opts.producers = 2;
    opts.rate_per_sec = 4_000;
    opts.timings = Timings {
        load_ms: (3_000, 5_000),
        down_ms: (0, 300),
    };
    opts.strand_args = vec!["--override".into(), "strand.shards=1".into()];
    opts.recover_timeout = Duration::from_secs(30);
    let q = QueueOptions {
        messages: 100_000,
        quiet_secs: 20.0,
        ..QueueOptions::default()
    };
    let r = queue_run::run(&opts, &q, |line| eprintln!("{line}")).unwrap_or_else(|e| panic!("{e:#}"));
    eprintln!("{}", r.render());
    assert!(r.problems.is_empty(), "{:?}", r.problems);
    assert_eq!(r.verdict.violations(), 0, "{}", r.render());
    // The kills came while messages were being published, each of a partition's leader.
    assert!(r.cycles_run >= 2, "{}", r.render());
    assert!(r
        .faults
        .iter()
        .all(|f| f.kind == FaultKind::Kill9 && !f.partitions_led.is_empty()));
    let u = &r.kill_unavailability;
    assert_eq!(u.never_recovered, 0, "{u:?}");
    // What the recorder saw: every kind of message, exercised.
    let t = &r.verdict.totals;
    assert_eq!((t.planned, t.published), (100_000, 100_000), "{t:?}");
    assert_eq!(t.acknowledged + t.poison, t.published, "{t:?}");
    assert!(t.poison > 0 && t.dead_letter_records >= t.poison, "{t:?}");
    assert!(
        t.delayed_leased > 0 && t.nacks_settled > 0 && t.rejects_settled > 0,
        "{t:?}"
    );
    assert!(
        t.late_refusals.get("409 stale_generation").copied().unwrap_or(0) > 0,
        "{t:?}"
    );
}
