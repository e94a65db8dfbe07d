//! `strand` processes configured as apache/kafka's three-node example compose files (the same
//! environment variables) form one cluster, in combined mode (three `broker,controller` nodes)
//! and with separate roles (three controllers, two brokers): every broker lists every broker,
//! a topic created through one node is placed over the brokers, an acks=all producer and a
//! consumer reach each partition's leader, and a broker killed with `kill -9` is fenced and
//! leaves Metadata.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};
use strand_compat_tests::clients::{self, PythonClient};
use strand_compat_tests::data::{assert_read_back, ends_of};
use strand_compat_tests::{broker_binary, external_bootstrap, http_get, metric_sum_where};
use strand_compat_tests::{tools, unique_topic, wait_for};
use strand_tools::queue_client::{LeaseOptions, Leased, OutMessage as QueueMessage, QueueClient};

/// A deadline for what the cluster does by itself (elections, registrations, fencing): generous,
/// the machine may be busy.
const DEADLINE: Duration = Duration::from_secs(90);

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

struct Node {
    id: i32,
    /// `None` on a controller-only node.
    client_port: Option<u16>,
    /// The admin listener (`/metrics`).
    admin_port: u16,
    /// The HTTP queue API.
    http_port: u16,
    child: Option<Child>,
    dir: tempfile::TempDir,
    /// The environment it runs with (Kafka's compose variables).
    env: Vec<(String, String)>,
}

impl Node {
    /// Starts (or restarts, on the same data) the node's process.
    fn spawn(&mut self) {
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("strand.log"))
            .expect("a log file");
        let mut cmd = Command::new(broker_binary());
        for (k, _) in std::env::vars_os() {
            let name = k.to_string_lossy();
            if name.starts_with("KAFKA_") || name.starts_with("STRAND_") {
                cmd.env_remove(k);
            }
        }
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)))
            .env_remove("LD_LIBRARY_PATH")
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone().expect("clone the log handle")))
            .stderr(Stdio::from(log));
        self.child = Some(cmd.spawn().expect("the broker starts"));
    }

    fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.client_port.expect("a broker"))
    }

    /// A client of the node's HTTP queue API.
    fn queues(&self) -> QueueClient {
        QueueClient::new(&format!("127.0.0.1:{}", self.http_port))
    }

    /// The sum of a gauge's series (every shard) in the node's `/metrics`; `None` while the
    /// node does not answer or has not set it yet.
    fn gauge(&self, series: &str) -> Option<f64> {
        let text = http_get(&format!("127.0.0.1:{}", self.admin_port), "/metrics").ok()?;
        text.lines()
            .any(|l| l.starts_with(series))
            .then(|| metric_sum_where(&text, series, "shard"))
    }

    /// Kafka client connections the node closed at their first request because it had no
    /// cluster metadata yet.
    fn refused_without_metadata(&self) -> f64 {
        let text = http_get(&format!("127.0.0.1:{}", self.admin_port), "/metrics").unwrap_or_default();
        metric_sum_where(
            &text,
            "strand_connections_refused_total",
            "no cluster metadata yet",
        )
    }

    fn log(&self) -> String {
        fs::read_to_string(self.dir.path().join("strand.log")).unwrap_or_default()
    }

    /// SIGTERM, and waits for the process to exit.
    fn terminate(&mut self) -> std::process::ExitStatus {
        let mut c = self.child.take().expect("running");
        let _ = Command::new("kill").arg(c.id().to_string()).status();
        c.wait().expect("the broker exits")
    }

    /// SIGSTOP (`true`) or SIGCONT (`false`): the process stands still, as in a long pause or
    /// a frozen machine, and resumes with what it held.
    fn pause(&self, stop: bool) {
        let c = self.child.as_ref().expect("running");
        let signal = if stop { "-STOP" } else { "-CONT" };
        let done = Command::new("kill")
            .args([signal, &c.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(done.success(), "kill {signal}");
    }

    fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill9();
        if std::thread::panicking() {
            // A failed test shows what each node said: its directory goes with it.
            eprintln!("{}", tail_of(self, 200));
            if let Ok(dir) = std::env::var("CLUSTER_TEST_LOGS") {
                let _ = fs::copy(
                    self.dir.path().join("strand.log"),
                    format!("{dir}/node-{}.log", self.id),
                );
            }
        }
    }
}

/// Starts nodes with the environment of Kafka's compose examples: `roles` per node id (from 1),
/// each `"broker,controller"`, `"controller"` or `"broker"`; `"absent controller"` is a voter
/// that is never started.
fn start_cluster(roles: &[&str]) -> Vec<Node> {
    start_cluster_with(roles, &[])
}

/// [`start_cluster`] with more environment variables for every node.
fn start_cluster_with(roles: &[&str], extra: &[(&str, &str)]) -> Vec<Node> {
    start_cluster_from(1, roles, extra)
}

/// [`start_cluster_with`], node ids counted from `first_id`.
fn start_cluster_from(first_id: i32, roles: &[&str], extra: &[(&str, &str)]) -> Vec<Node> {
    let controller_ports: BTreeMap<i32, u16> = node_ids(first_id, roles.len())
        .into_iter()
        .zip(roles)
        .filter(|(_, r)| r.contains("controller"))
        .map(|(id, _)| (id, free_port()))
        .collect();
    start_with(first_id, roles, &controller_ports, extra)
}

fn node_ids(first_id: i32, count: usize) -> Vec<i32> {
    (0..i32::try_from(count).unwrap()).map(|i| first_id + i).collect()
}

/// [`start_cluster_from`] with the controllers' ports given.
fn start_with(
    first_id: i32,
    roles: &[&str],
    controller_ports: &BTreeMap<i32, u16>,
    extra: &[(&str, &str)],
) -> Vec<Node> {
    let ids = node_ids(first_id, roles.len());
    let voters = controller_ports
        .iter()
        .map(|(id, p)| format!("{id}@127.0.0.1:{p}"))
        .collect::<Vec<_>>()
        .join(",");
    let mut nodes = Vec::new();
    for (id, role) in ids.iter().zip(roles) {
        if role.starts_with("absent") {
            // A voter that never starts.
            continue;
        }
        let dir = tempfile::Builder::new()
            .prefix("strand-cluster-")
            .tempdir()
            .expect("a temp dir");
        let client_port = role.contains("broker").then(free_port);
        let admin_port = free_port();
        let http_port = free_port();
        let mut listeners = Vec::new();
        if let Some(p) = client_port {
            listeners.push(format!("PLAINTEXT://127.0.0.1:{p}"));
        }
        if let Some(p) = controller_ports.get(id) {
            listeners.push(format!("CONTROLLER://127.0.0.1:{p}"));
        }
        let data: PathBuf = dir.path().join("data");
        let mut env: Vec<(String, String)> = Vec::new();
        if let Some(p) = client_port {
            env.push((
                "KAFKA_ADVERTISED_LISTENERS".into(),
                format!("PLAINTEXT://127.0.0.1:{p}"),
            ));
        }
        for (k, v) in [
            ("KAFKA_NODE_ID", id.to_string()),
            ("KAFKA_PROCESS_ROLES", role.to_string()),
            ("KAFKA_CONTROLLER_QUORUM_VOTERS", voters.clone()),
            ("KAFKA_LISTENERS", listeners.join(",")),
            (
                "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP",
                "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT".into(),
            ),
            ("KAFKA_CONTROLLER_LISTENER_NAMES", "CONTROLLER".into()),
            ("KAFKA_INTER_BROKER_LISTENER_NAME", "PLAINTEXT".into()),
            ("CLUSTER_ID", "4L6g3nShT-eMCtK--X86sw".into()),
            ("KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR", "1".into()),
            ("KAFKA_LOG_DIRS", data.display().to_string()),
            ("KAFKA_STRAND_HTTP_LISTENER", format!("127.0.0.1:{http_port}")),
            ("KAFKA_STRAND_ADMIN_LISTENER", format!("127.0.0.1:{admin_port}")),
            ("KAFKA_STRAND_SHARDS", "2".into()),
            ("RUST_BACKTRACE", "1".into()),
        ] {
            env.push((k.into(), v));
        }
        env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        let mut node = Node {
            id: *id,
            client_port,
            admin_port,
            http_port,
            child: None,
            dir,
            env,
        };
        node.spawn();
        nodes.push(node);
    }
    nodes
}

/// Three combined-mode nodes, once each lists all three brokers.
fn three_combined_nodes() -> Vec<Node> {
    three_combined_nodes_with(&[])
}

/// [`three_combined_nodes`] with more environment variables for every node.
fn three_combined_nodes_with(extra: &[(&str, &str)]) -> Vec<Node> {
    let nodes = start_cluster_with(&["broker,controller"; 3], extra);
    let all: BTreeSet<i32> = [1, 2, 3].into();
    for n in &nodes {
        let b = n.bootstrap();
        wait_for(DEADLINE, "every broker listed", || {
            broker_ids(&b).filter(|ids| *ids == all)
        });
    }
    nodes
}

fn metadata_of(bootstrap: &str, topic: Option<&str>) -> Option<rdkafka::metadata::Metadata> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("topic.metadata.refresh.interval.ms", "-1")
        .create()
        .ok()?;
    consumer.fetch_metadata(topic, Duration::from_secs(5)).ok()
}

fn broker_ids(bootstrap: &str) -> Option<BTreeSet<i32>> {
    Some(
        metadata_of(bootstrap, None)?
            .brokers()
            .iter()
            .map(|b| b.id())
            .collect(),
    )
}

/// The last `lines` lines of a node's log, headed by its id.
fn tail_of(n: &Node, lines: usize) -> String {
    let log = n.log();
    let tail: Vec<&str> = log.lines().rev().take(lines).collect();
    format!(
        "--- node {} ---\n{}",
        n.id,
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    )
}

fn dump(nodes: &[Node]) -> String {
    nodes
        .iter()
        .map(|n| tail_of(n, 30))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn three_combined_nodes_form_a_cluster_serve_clients_and_fence_a_dead_node() {
    if external_bootstrap().is_some() {
        eprintln!("skipped: this test starts its own cluster");
        return;
    }
    scenario(start_cluster(&["broker,controller"; 3]));
}

#[test]
fn a_node_whose_controller_listener_is_busy_starts_and_joins_once_it_is_free() {
    if external_bootstrap().is_some() {
        eprintln!("skipped: this test starts its own cluster");
        return;
    }
    // Node 1's controller address is taken before it starts.
    let busy = TcpListener::bind("127.0.0.1:0").expect("a port to hold");
    let held = busy.local_addr().expect("its address").port();
    let ports: BTreeMap<i32, u16> = [(1, held), (2, free_port()), (3, free_port())].into();
    let nodes = start_with(1, &["broker,controller"; 3], &ports, &[]);
    let all: BTreeSet<i32> = [1, 2, 3].into();
    // The two others form the quorum.
    let b = nodes[1].bootstrap();
    wait_for(DEADLINE, "brokers 2 and 3 listed", || {
        broker_ids(&b).filter(|ids| ids.contains(&2) && ids.contains(&3))
    });
    // Node 1 serves no client until it has the cluster metadata, which comes from its own
    // controller, and no leader can reach that one yet.
    assert!(broker_ids(&nodes[0].bootstrap()).is_none(), "{}", dump(&nodes));
    assert!(nodes[0].refused_without_metadata() >= 1.0, "{}", dump(&nodes));
    assert!(
        nodes[0].log().contains("cannot bind the controller listener"),
        "{}",
        dump(&nodes)
    );
    // Freed, the address is bound on the next attempt.
    drop(busy);
    wait_for(DEADLINE, "the controller listener bound", || {
        nodes[0].log().contains("controller listener bound").then_some(())
    });
    for n in &nodes {
        let b = n.bootstrap();
        wait_for(DEADLINE, "every broker listed", || {
            broker_ids(&b).filter(|ids| *ids == all)
        });
    }
}

#[test]
fn a_node_whose_voters_are_unreachable_starts_and_keeps_trying() {
    if external_bootstrap().is_some() {
        eprintln!("skipped: this test starts its own cluster");
        return;
    }
    let nodes = start_cluster(&["broker,controller", "absent controller", "absent controller"]);
    // It keeps trying: no controller can decide without a quorum, so its registration is
    // retried.
    wait_for(DEADLINE, "registration retried", || {
        (nodes[0]
            .log()
            .matches("broker registration failed; retrying")
            .count()
            >= 2)
            .then_some(())
    });
    // Without the cluster metadata it serves no client, as a Kafka broker enables its client
    // listeners once it has caught up with the metadata log: a client's first request closes
    // its connection (a client asks the other brokers meanwhile).
    assert!(broker_ids(&nodes[0].bootstrap()).is_none(), "{}", dump(&nodes));
    assert!(nodes[0].refused_without_metadata() >= 1.0, "{}", dump(&nodes));
}

#[test]
fn a_node_stopped_with_sigterm_leaves_metadata_through_a_controlled_shutdown() {
    if external_bootstrap().is_some() {
        eprintln!("skipped: this test starts its own cluster");
        return;
    }
    let mut nodes = three_combined_nodes();
    let status = nodes[2].terminate();
    assert!(status.success(), "{status}\n{}", dump(&nodes));
    assert!(
        nodes[2]
            .log()
            .contains("the controller quorum let this broker stop"),
        "{}",
        dump(&nodes)
    );
    let rest: BTreeSet<i32> = [1, 2].into();
    let b = nodes[0].bootstrap();
    wait_for(DEADLINE, "the stopped node gone", || {
        broker_ids(&b).filter(|ids| *ids == rest)
    });
}

#[test]
fn three_controllers_and_two_brokers_form_a_cluster_serve_clients_and_fence_a_dead_broker() {
    if external_bootstrap().is_some() {
        eprintln!("skipped: this test starts its own cluster");
        return;
    }
    scenario(start_cluster(&[
        "controller",
        "controller",
        "controller",
        "broker",
        "broker",
    ]));
}

/// The checks, over the brokers of `nodes`: the last broker is the one killed.
fn scenario(mut nodes: Vec<Node>) {
    let brokers: Vec<usize> = (0..nodes.len())
        .filter(|i| nodes[*i].client_port.is_some())
        .collect();
    let all: BTreeSet<i32> = brokers.iter().map(|i| nodes[*i].id).collect();
    let first = brokers[0];
    let second = brokers[1];
    let last = *brokers.last().expect("brokers");

    // Every broker lists every broker.
    for i in &brokers {
        let n = &nodes[*i];
        let started = Instant::now();
        let b = n.bootstrap();
        let found = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            wait_for(DEADLINE, "every broker in Metadata", || {
                broker_ids(&b).filter(|ids| *ids == all)
            })
        }));
        assert!(
            found.is_ok(),
            "node {} never listed all brokers:\n{}",
            n.id,
            dump(&nodes)
        );
        eprintln!("node {} lists all brokers after {:?}", n.id, started.elapsed());
    }

    // A replication factor above the live brokers is refused; a topic created through one
    // broker has its leaders spread over all of them.
    let topic = strand_compat_tests::unique_topic("spread");
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", nodes[first].bootstrap())
        .create()
        .expect("an admin client");
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let too_many = i32::try_from(all.len() + 1).unwrap();
    let refused = futures::executor::block_on(admin.create_topics(
        &[NewTopic::new(&topic, 6, TopicReplication::Fixed(too_many))],
        &options,
    ))
    .expect("CreateTopics answered");
    assert!(
        matches!(
            &refused[0],
            Err((_, rdkafka::types::RDKafkaErrorCode::InvalidReplicationFactor))
        ),
        "{refused:?}"
    );
    let created = futures::executor::block_on(
        admin.create_topics(&[NewTopic::new(&topic, 6, TopicReplication::Fixed(1))], &options),
    )
    .expect("CreateTopics answered");
    assert!(created.iter().all(|r| r.is_ok()), "{created:?}");
    let other = nodes[last].bootstrap();
    let leaders: BTreeMap<i32, i32> = wait_for(DEADLINE, "the topic's leaders on another broker", || {
        let md = metadata_of(&other, Some(&topic))?;
        let t = md.topics().iter().find(|t| t.name() == topic)?;
        let leaders: BTreeMap<i32, i32> = t.partitions().iter().map(|p| (p.id(), p.leader())).collect();
        (leaders.len() == 6 && leaders.values().all(|l| *l > 0)).then_some(leaders)
    });
    let leader_set: BTreeSet<i32> = leaders.values().copied().collect();
    assert_eq!(leader_set, all, "leaders not spread: {leaders:?}");

    // acks=all to every partition, then everything read back, through the right leaders.
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", nodes[second].bootstrap())
        .set("acks", "all")
        .set("message.timeout.ms", "60000")
        .create()
        .expect("a producer");
    let per_partition = 20;
    for p in 0..6 {
        for i in 0..per_partition {
            let value = format!("p{p}-m{i}");
            producer
                .send(BaseRecord::<(), _>::to(&topic).partition(p).payload(&value))
                .expect("queued");
        }
    }
    producer
        .flush(Duration::from_secs(60))
        .expect("every record acknowledged");
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", nodes[last].bootstrap())
        .set("group.id", "cluster-test-unused")
        .set("enable.auto.commit", "false")
        .create()
        .expect("a consumer");
    let mut tpl = TopicPartitionList::new();
    for p in 0..6 {
        tpl.add_partition_offset(&topic, p, Offset::Beginning)
            .expect("a partition");
    }
    consumer.assign(&tpl).expect("assigned");
    let mut seen: BTreeMap<i32, Vec<String>> = BTreeMap::new();
    wait_for(DEADLINE, "every record read back", || {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) {
            let v = String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned();
            seen.entry(m.partition()).or_default().push(v);
        }
        (seen.values().map(Vec::len).sum::<usize>() >= 6 * per_partition).then_some(())
    });
    for p in 0..6 {
        let expected: Vec<String> = (0..per_partition).map(|i| format!("p{p}-m{i}")).collect();
        assert_eq!(seen.get(&p), Some(&expected), "partition {p}");
    }

    // Two members of one group, bootstrapped through different brokers, meet at one
    // coordinator (the leader of the group's partition of __consumer_offsets, which the first
    // FindCoordinator has the cluster create) and split the partitions.
    let group = strand_compat_tests::unique_topic("group");
    let coordinators: BTreeSet<i32> = brokers
        .iter()
        .map(|i| find_coordinator(&nodes[*i].bootstrap(), &group))
        .collect();
    assert_eq!(
        coordinators.len(),
        1,
        "the group has one coordinator: {coordinators:?}"
    );
    let member = |bootstrap: String| -> BaseConsumer {
        let c: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("group.id", &group)
            .set("enable.auto.commit", "false")
            .set("session.timeout.ms", "30000")
            .create()
            .expect("a member");
        c.subscribe(&[topic.as_str()]).expect("subscribed");
        c
    };
    let members = [member(nodes[first].bootstrap()), member(nodes[last].bootstrap())];
    wait_for(DEADLINE, "the partitions split between the two members", || {
        let mut owned: Vec<BTreeSet<i32>> = Vec::new();
        for m in &members {
            let _ = m.poll(Duration::from_millis(100));
            let a = m.assignment().ok()?;
            owned.push(a.elements().iter().map(|e| e.partition()).collect());
        }
        let both = owned.iter().all(|o| !o.is_empty());
        let disjoint = owned[0].is_disjoint(&owned[1]);
        let union: BTreeSet<i32> = owned.iter().flatten().copied().collect();
        (both && disjoint && union.len() == 6).then_some(())
    });
    drop(members);

    // A broker killed with kill -9 is fenced within the session timeout and leaves Metadata.
    let dead = nodes[last].id;
    nodes[last].kill9();
    let killed = Instant::now();
    let rest: BTreeSet<i32> = all.iter().copied().filter(|id| *id != dead).collect();
    let b = nodes[first].bootstrap();
    wait_for(DEADLINE, "the dead broker fenced", || {
        broker_ids(&b).filter(|ids| *ids == rest)
    });
    let gone = killed.elapsed();
    eprintln!("node {dead} left Metadata {gone:?} after kill -9");
    // broker.session.timeout.ms is 9 s; the bound leaves room for a busy machine (the
    // controller checks once a second, and the test's own metadata round trips).
    assert!(
        gone < Duration::from_secs(30),
        "node {dead} left Metadata only after {gone:?}"
    );
    for i in brokers.iter().filter(|i| **i != first && **i != last) {
        let b = nodes[*i].bootstrap();
        wait_for(DEADLINE, "the other brokers agree", || {
            broker_ids(&b).filter(|ids| *ids == rest)
        });
    }
}

/// The coordinator of `group` as the broker at `bootstrap` names it, once it names one (the
/// answer is COORDINATOR_NOT_AVAILABLE while `__consumer_offsets` is created and while the
/// group's partition of it has no leader).
fn find_coordinator(bootstrap: &str, group: &str) -> i32 {
    wait_for(DEADLINE, "FindCoordinator names a coordinator", || {
        let mut c = strand_compat_tests::admin::connect(bootstrap);
        let req = kafka_protocol::messages::FindCoordinatorRequest::default()
            .with_key(kafka_protocol::protocol::StrBytes::from_string(group.to_owned()));
        let resp = c.request(3, &req).expect("FindCoordinator answered");
        if resp.error_code != 0 {
            assert_eq!(resp.error_code, 15, "COORDINATOR_NOT_AVAILABLE or none: {resp:?}");
            std::thread::sleep(Duration::from_millis(200));
            return None;
        }
        Some(resp.node_id.0)
    })
}

/// Offsets `group` has committed for `partitions` of `topic`, read through `bootstrap`; `None`
/// while the group's coordinator cannot answer.
fn committed_offsets(
    bootstrap: &str,
    group: &str,
    topic: &str,
    partitions: i32,
) -> Option<BTreeMap<i32, i64>> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
        .ok()?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition(topic, p);
    }
    let got = consumer.committed_offsets(tpl, Duration::from_secs(5)).ok()?;
    got.elements()
        .iter()
        .map(|e| match e.offset() {
            Offset::Offset(o) => Some((e.partition(), o)),
            _ => None,
        })
        .collect()
}

/// Commits `offsets` of `topic` for `group` (a simple commit: no member), through `bootstrap`.
fn commit_offsets(bootstrap: &str, group: &str, topic: &str, offsets: &BTreeMap<i32, i64>) -> bool {
    let Ok(consumer) = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create::<BaseConsumer>()
    else {
        return false;
    };
    let mut tpl = TopicPartitionList::new();
    for (p, o) in offsets {
        if tpl.add_partition_offset(topic, *p, Offset::Offset(*o)).is_err() {
            return false;
        }
    }
    consumer.commit(&tpl, rdkafka::consumer::CommitMode::Sync).is_ok()
}

/// Issue 41: a group's committed offsets live in its partition of `__consumer_offsets`,
/// replicated like any partition, and its coordinator is that partition's leader. The node
/// coordinating a group is killed with kill -9: the group's offsets are served by the new
/// leader, new commits go there, and when the old coordinator returns and takes the leadership
/// back (it is the preferred replica) it serves the commits made while it was away, not the
/// state it had in memory.
#[test]
fn committed_offsets_survive_the_loss_of_their_coordinator() {
    if external_bootstrap().is_some() {
        eprintln!("skipped: this test starts its own cluster");
        return;
    }
    let mut nodes = three_combined_nodes_with(&[
        ("KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR", "3"),
        ("KAFKA_LEADER_IMBALANCE_CHECK_INTERVAL_SECONDS", "1"),
    ]);
    let topic = strand_compat_tests::unique_topic("offsets-failover");
    let partitions = 3;
    create_topics(
        &nodes[0],
        &[NewTopic::new(&topic, partitions, TopicReplication::Fixed(3))],
    );
    let group = strand_compat_tests::unique_topic("failover-group");
    find_coordinator(&nodes[0].bootstrap(), &group);
    // The group's partition of __consumer_offsets (Kafka's `abs(groupId.hashCode()) % 50`),
    // led by its preferred replica before the test goes on, so that the leadership comes back
    // to that node after its restart.
    let hash = group
        .encode_utf16()
        .fold(0i32, |h, c| h.wrapping_mul(31).wrapping_add(i32::from(c)));
    let offsets_partition = if hash == i32::MIN { 0 } else { hash.abs() } % 50;
    let all = nodes.iter().map(Node::bootstrap).collect::<Vec<_>>().join(",");
    let preferred = wait_for(
        DEADLINE,
        "the group's offsets partition on its preferred replica",
        || {
            let md = metadata_of(&all, Some("__consumer_offsets"))?;
            let t = md.topics().iter().find(|t| t.name() == "__consumer_offsets")?;
            let p = t.partitions().iter().find(|p| p.id() == offsets_partition)?;
            (p.replicas().len() == 3 && p.isr().len() == 3 && Some(&p.leader()) == p.replicas().first())
                .then_some(p.leader())
        },
    );
    let coordinator = wait_for(DEADLINE, "the preferred replica named coordinator", || {
        let c = find_coordinator(&nodes[0].bootstrap(), &group);
        (c == preferred).then_some(c)
    });
    for n in &nodes[1..] {
        assert_eq!(
            find_coordinator(&n.bootstrap(), &group),
            coordinator,
            "one coordinator"
        );
    }
    let at = |n: i64| -> BTreeMap<i32, i64> { (0..partitions).map(|p| (p, n + i64::from(p))).collect() };
    let first = at(10);
    let idx = nodes.iter().position(|n| n.id == coordinator).expect("its node");
    let other = nodes[(idx + 1) % 3].bootstrap();
    wait_for(DEADLINE, "the first commit", || {
        commit_offsets(&other, &group, &topic, &first).then_some(())
    });
    assert_eq!(
        committed_offsets(&other, &group, &topic, partitions),
        Some(first.clone())
    );

    // The coordinator dies: the group's partition is led elsewhere, and the offsets with it.
    nodes[idx].kill9();
    let killed = Instant::now();
    let read = wait_for(DEADLINE, "the offsets served by a new coordinator", || {
        committed_offsets(&other, &group, &topic, partitions).filter(|o| !o.is_empty())
    });
    eprintln!(
        "committed offsets served again {:?} after the coordinator's kill -9",
        killed.elapsed()
    );
    assert_eq!(
        read,
        first,
        "committed offsets lost or moved back: {}",
        dump(&nodes)
    );
    let moved = find_coordinator(&other, &group);
    assert_ne!(moved, coordinator);
    let second = at(20);
    wait_for(DEADLINE, "a commit to the new coordinator", || {
        commit_offsets(&other, &group, &topic, &second).then_some(())
    });
    assert_eq!(
        committed_offsets(&other, &group, &topic, partitions),
        Some(second.clone())
    );

    // The old coordinator returns, catches up and, as the preferred replica, takes its
    // leadership back: it answers with the commit it missed.
    nodes[idx].spawn();
    wait_for(DEADLINE, "the coordinator back on its preferred replica", || {
        (find_coordinator(&other, &group) == coordinator).then_some(())
    });
    let back = wait_for(DEADLINE, "the offsets served by the returned coordinator", || {
        committed_offsets(&nodes[idx].bootstrap(), &group, &topic, partitions).filter(|o| !o.is_empty())
    });
    assert_eq!(
        back,
        second,
        "the returned coordinator lost a commit: {}",
        dump(&nodes)
    );
}

/// Issue 41: a coordinator whose process stands still (SIGSTOP) while the others elect a new
/// leader for its group's partition and take a newer commit does not answer, once resumed,
/// with the commit it held in memory: a client asking it keeps getting errors or the newer
/// commit.
#[test]
fn a_resumed_coordinator_never_answers_from_what_it_held() {
    if external_bootstrap().is_some() {
        eprintln!("skipped: this test starts its own cluster");
        return;
    }
    let nodes = three_combined_nodes_with(&[("KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR", "3")]);
    let topic = strand_compat_tests::unique_topic("offsets-pause");
    let partitions = 3;
    create_topics(
        &nodes[0],
        &[NewTopic::new(&topic, partitions, TopicReplication::Fixed(3))],
    );
    let group = strand_compat_tests::unique_topic("paused-group");
    let coordinator = find_coordinator(&nodes[0].bootstrap(), &group);
    let idx = nodes.iter().position(|n| n.id == coordinator).expect("its node");
    let other = nodes[(idx + 1) % 3].bootstrap();
    let at = |n: i64| -> BTreeMap<i32, i64> { (0..partitions).map(|p| (p, n + i64::from(p))).collect() };
    let first = at(10);
    wait_for(DEADLINE, "the first commit", || {
        commit_offsets(&other, &group, &topic, &first).then_some(())
    });
    // Served once from the coordinator's memory, so that it holds the group.
    assert_eq!(
        committed_offsets(&nodes[idx].bootstrap(), &group, &topic, partitions),
        Some(first.clone())
    );

    nodes[idx].pause(true);
    let second = at(20);
    wait_for(DEADLINE, "a commit to a new coordinator", || {
        (find_coordinator(&other, &group) != coordinator && commit_offsets(&other, &group, &topic, &second))
            .then_some(())
    });
    nodes[idx].pause(false);
    // The resumed node itself is asked, over one connection, for a few seconds: it answers an
    // error (it no longer coordinates, or waits for a majority to confirm it) or the newer
    // commit, never the older one it held.
    let resumed = Instant::now();
    let mut c = strand_compat_tests::admin::connect(&nodes[idx].bootstrap());
    let req = kafka_protocol::messages::OffsetFetchRequest::default()
        .with_group_id(kafka_protocol::messages::GroupId(
            kafka_protocol::protocol::StrBytes::from_string(group.clone()),
        ))
        .with_topics(Some(vec![
            kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestTopic::default()
                .with_name(kafka_protocol::messages::TopicName(
                    kafka_protocol::protocol::StrBytes::from_string(topic.clone()),
                ))
                .with_partition_indexes((0..partitions).collect()),
        ]));
    let (mut refused, mut answered) = (0, 0);
    while resumed.elapsed() < Duration::from_secs(4) {
        let resp = c.request(5, &req).expect("OffsetFetch answered");
        if resp.error_code != 0 {
            refused += 1;
        } else {
            let got: BTreeMap<i32, i64> = resp
                .topics
                .iter()
                .flat_map(|t| t.partitions.iter())
                .filter(|p| p.error_code == 0)
                .map(|p| (p.partition_index, p.committed_offset))
                .collect();
            assert_ne!(
                got,
                first,
                "the resumed coordinator answered from what it held {:?} after resuming: {}",
                resumed.elapsed(),
                dump(&nodes)
            );
            answered += 1;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    eprintln!("the resumed node refused {refused} OffsetFetch requests and answered {answered}");
    assert_eq!(
        committed_offsets(&other, &group, &topic, partitions),
        Some(second),
        "{}",
        dump(&nodes)
    );
}

/// Issue 41: a group member consuming and committing (classic protocol, or KIP-848's with
/// `"consumer"`) while its coordinator is killed with kill -9 half-way: every record is
/// consumed at least once, no acknowledged commit is lost, and the committed offsets the
/// cluster answers never go back behind one acknowledged before the question.
fn a_consuming_group_keeps_its_commits_when_its_coordinator_is_killed(protocol: &str) {
    if external_bootstrap().is_some() {
        eprintln!("skipped: this test starts its own cluster");
        return;
    }
    let mut nodes = three_combined_nodes_with(&[("KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR", "3")]);
    let topic = strand_compat_tests::unique_topic("consume-failover");
    let partitions = 3;
    create_topics(
        &nodes[0],
        &[NewTopic::new(&topic, partitions, TopicReplication::Fixed(3))],
    );
    let all = nodes.iter().map(Node::bootstrap).collect::<Vec<_>>().join(",");
    let per_partition = 600;
    produce_acked(&all, &topic, partitions, "c", per_partition);
    let group = strand_compat_tests::unique_topic("consuming-group");
    let coordinator = find_coordinator(&nodes[0].bootstrap(), &group);
    let idx = nodes.iter().position(|n| n.id == coordinator).expect("its node");

    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &all)
        .set("group.id", &group)
        .set("group.protocol", protocol)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("max.partition.fetch.bytes", "2048")
        .create()
        .expect("a member");
    consumer.subscribe(&[topic.as_str()]).expect("subscribed");
    let total = per_partition * usize::try_from(partitions).unwrap();
    let mut consumed: BTreeMap<i32, BTreeSet<i64>> = BTreeMap::new();
    // The newest commit acknowledged, per partition: what the cluster must never answer less
    // than from then on.
    let mut acked: BTreeMap<i32, i64> = BTreeMap::new();
    let mut commits = 0usize;
    let mut failed_commits = 0usize;
    let mut killed: Option<Instant> = None;
    let mut first_commit_after_kill: Option<Duration> = None;
    let started = Instant::now();
    let count = |c: &BTreeMap<i32, BTreeSet<i64>>| c.values().map(BTreeSet::len).sum::<usize>();
    while count(&consumed) < total {
        assert!(
            started.elapsed() < DEADLINE,
            "consumed {} of {total} records ({commits} commits, {failed_commits} refused): {}",
            count(&consumed),
            dump(&nodes)
        );
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
            consumed.entry(m.partition()).or_default().insert(m.offset());
        }
        if killed.is_none() && count(&consumed) >= total / 3 {
            nodes[idx].kill9();
            killed = Some(Instant::now());
        }
        if count(&consumed) % 50 != 0 {
            continue;
        }
        let Ok(position) = consumer.position() else {
            continue;
        };
        let snapshot: BTreeMap<i32, i64> = position
            .elements()
            .iter()
            .filter_map(|e| match e.offset() {
                Offset::Offset(o) => Some((e.partition(), o)),
                _ => None,
            })
            .collect();
        if snapshot.is_empty() {
            continue;
        }
        match consumer.commit_consumer_state(rdkafka::consumer::CommitMode::Sync) {
            Ok(()) => {
                commits += 1;
                for (p, o) in snapshot {
                    let a = acked.entry(p).or_insert(o);
                    *a = (*a).max(o);
                }
                if let (Some(k), None) = (killed, first_commit_after_kill) {
                    first_commit_after_kill = Some(k.elapsed());
                }
            }
            Err(_) => failed_commits += 1,
        }
        // What the cluster answers now is at least what it acknowledged.
        if let Ok(c) = consumer.committed(Duration::from_secs(5)) {
            for e in c.elements() {
                if let (Offset::Offset(o), Some(a)) = (e.offset(), acked.get(&e.partition())) {
                    assert!(
                        o >= *a,
                        "partition {}: committed offset {o} behind the acknowledged {a}: {}",
                        e.partition(),
                        dump(&nodes)
                    );
                }
            }
        }
    }
    assert!(killed.is_some(), "the coordinator was never killed");
    for p in 0..partitions {
        let got = consumed.get(&p).map_or(0, BTreeSet::len);
        assert_eq!(got, per_partition, "partition {p}: a record never consumed");
    }
    // The last acknowledged commit is what a member of the group starts from.
    let last = wait_for(DEADLINE, "the group's committed offsets", || {
        committed_offsets(&all, &group, &topic, partitions).filter(|o| o.len() == acked.len())
    });
    assert_eq!(last, acked, "an acknowledged commit was lost: {}", dump(&nodes));
    eprintln!(
        "{protocol} group: {commits} commits acknowledged, {failed_commits} refused; the first \
         acknowledged {:?} after the coordinator's kill -9",
        first_commit_after_kill
    );
    assert!(
        first_commit_after_kill.is_some(),
        "no commit acknowledged after the kill"
    );
}

#[test]
fn a_classic_group_keeps_its_commits_when_its_coordinator_is_killed() {
    a_consuming_group_keeps_its_commits_when_its_coordinator_is_killed("classic");
}

#[test]
fn a_kip_848_group_keeps_its_commits_when_its_coordinator_is_killed() {
    a_consuming_group_keeps_its_commits_when_its_coordinator_is_killed("consumer");
}

/// Creates `topics` through `node` with an admin client; every one must be created.
fn create_topics(node: &Node, topics: &[NewTopic<'_>]) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", node.bootstrap())
        .create()
        .expect("an admin client");
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let created =
        futures::executor::block_on(admin.create_topics(topics, &options)).expect("CreateTopics answered");
    assert!(created.iter().all(|r| r.is_ok()), "{created:?}");
}

/// The leader of each partition of `topic` and its ISR size, as `bootstrap` answers.
fn leaders_of(bootstrap: &str, topic: &str) -> Option<BTreeMap<i32, (i32, usize)>> {
    let md = metadata_of(bootstrap, Some(topic))?;
    let t = md.topics().iter().find(|t| t.name() == topic)?;
    Some(
        t.partitions()
            .iter()
            .map(|p| (p.id(), (p.leader(), p.isr().len())))
            .collect(),
    )
}

/// Sends `count` records to each partition of `topic` with acks=all and idempotence, and
/// answers the values acknowledged per partition.
fn produce_acked(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    tag: &str,
    count: usize,
) -> BTreeMap<i32, Vec<String>> {
    use std::sync::{Arc, Mutex};
    struct Acks(Arc<Mutex<BTreeMap<i32, Vec<String>>>>);
    impl rdkafka::ClientContext for Acks {}
    impl rdkafka::producer::ProducerContext for Acks {
        type DeliveryOpaque = ();
        fn delivery(&self, r: &rdkafka::message::DeliveryResult<'_>, _: ()) {
            if let Ok(m) = r {
                let v = String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned();
                self.0.lock().unwrap().entry(m.partition()).or_default().push(v);
            }
        }
    }
    let acked = Arc::new(Mutex::new(BTreeMap::new()));
    let producer: BaseProducer<Acks> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("acks", "all")
        .set("enable.idempotence", "true")
        .set("message.timeout.ms", "60000")
        .set("linger.ms", "5")
        .create_with_context(Acks(Arc::clone(&acked)))
        .expect("a producer");
    for i in 0..count {
        for p in 0..partitions {
            let value = format!("{tag}-p{p}-m{i}");
            loop {
                match producer.send(BaseRecord::<(), _>::to(topic).partition(p).payload(&value)) {
                    Ok(()) => break,
                    Err((e, _)) => {
                        assert!(
                            matches!(
                                e.rdkafka_error_code(),
                                Some(rdkafka::types::RDKafkaErrorCode::QueueFull)
                            ),
                            "{e}"
                        );
                        producer.poll(Duration::from_millis(10));
                    }
                }
            }
        }
    }
    producer
        .flush(Duration::from_secs(90))
        .expect("every record answered");
    let acked = acked.lock().unwrap().clone();
    acked
}

/// Reads every partition of `topic` from the beginning until `expected` records arrived.
fn read_all(bootstrap: &str, topic: &str, partitions: i32, expected: usize) -> BTreeMap<i32, Vec<String>> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "cluster-test-unused")
        .set("enable.auto.commit", "false")
        .create()
        .expect("a consumer");
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .expect("a partition");
    }
    consumer.assign(&tpl).expect("assigned");
    let mut seen: BTreeMap<i32, Vec<String>> = BTreeMap::new();
    let started = Instant::now();
    let mut errors = Vec::new();
    while seen.values().map(Vec::len).sum::<usize>() < expected {
        let counts: BTreeMap<i32, usize> = seen.iter().map(|(p, v)| (*p, v.len())).collect();
        assert!(
            started.elapsed() < DEADLINE,
            "read {counts:?} of {expected}; errors: {errors:?}"
        );
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                let v = String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned();
                seen.entry(m.partition()).or_default().push(v);
            }
            Some(Err(e)) if errors.len() < 20 => errors.push(e.to_string()),
            _ => {}
        }
    }
    seen
}

#[test]
fn a_replicated_topic_keeps_every_acknowledged_record_when_its_leaders_are_killed() {
    if external_bootstrap().is_some() {
        eprintln!("skipped: this test starts its own cluster");
        return;
    }
    let mut nodes = three_combined_nodes();
    let topic = strand_compat_tests::unique_topic("rf3");
    let partitions = 3;
    create_topics(
        &nodes[0],
        &[NewTopic::new(&topic, partitions, TopicReplication::Fixed(3))],
    );
    // Every partition has an elected leader, and every broker says the same.
    let leaders = wait_for(DEADLINE, "every partition led, the same on every broker", || {
        let views: Vec<_> = nodes
            .iter()
            .map(|n| leaders_of(&n.bootstrap(), &topic))
            .collect::<Option<Vec<_>>>()?;
        let first = views[0].clone();
        let led = first.len() == 3 && first.values().all(|(l, isr)| *l > 0 && *isr == 3);
        (led && views.iter().all(|v| *v == first)).then_some(first)
    });
    eprintln!("leaders: {leaders:?}");
    wait_for(
        DEADLINE,
        "every node's groups counted, none under-replicated",
        || {
            let mut groups = 0.0;
            for n in &nodes {
                if n.gauge("strand_under_replicated_partitions")? != 0.0 {
                    return None;
                }
                groups += n.gauge("strand_replication_groups")?;
            }
            (groups == f64::from(3 * partitions)).then_some(())
        },
    );
    let bootstrap_all = nodes.iter().map(Node::bootstrap).collect::<Vec<_>>().join(",");

    let before = produce_acked(&bootstrap_all, &topic, partitions, "before", 100);
    assert_eq!(before.values().map(Vec::len).sum::<usize>(), 300, "{before:?}");

    // The leader of partition 0 dies; its partitions get new leaders among the others.
    let dead = leaders[&0].0;
    let idx = nodes
        .iter()
        .position(|n| n.id == dead)
        .expect("the leader's node");
    nodes[idx].kill9();
    let killed = Instant::now();
    let survivor = nodes[(idx + 1) % 3].bootstrap();
    wait_for(DEADLINE, "new leaders for the dead node's partitions", || {
        let l = leaders_of(&survivor, &topic)?;
        l.values()
            .all(|(leader, _)| *leader > 0 && *leader != dead)
            .then_some(())
    });
    eprintln!(
        "the dead leader's partitions were led again {:?} after kill -9",
        killed.elapsed()
    );

    // Writes go on with one node down; everything acknowledged, before and after, reads back
    // in order.
    let survivors = nodes
        .iter()
        .filter(|n| n.id != dead)
        .map(Node::bootstrap)
        .collect::<Vec<_>>()
        .join(",");
    let after = produce_acked(&survivors, &topic, partitions, "after", 100);
    assert_eq!(after.values().map(Vec::len).sum::<usize>(), 300, "{after:?}");
    let seen = read_all(&survivors, &topic, partitions, 600);
    for p in 0..partitions {
        let mut expected = before.get(&p).cloned().unwrap_or_default();
        expected.extend(after.get(&p).cloned().unwrap_or_default());
        assert_eq!(seen.get(&p), Some(&expected), "partition {p}\n{}", dump(&nodes));
    }

    // The dead node restarts on its data, catches up, and the leaders add it back to every
    // ISR; then another node dies, and the restarted one and the third serve everything.
    wait_for(DEADLINE, "the dead node out of every ISR", || {
        let l = leaders_of(&survivor, &topic)?;
        l.values().all(|(_, isr)| *isr == 2).then_some(())
    });
    // The leaders count their partitions as under-replicated (Kafka's UnderReplicatedPartitions).
    wait_for(
        DEADLINE,
        "every partition counted under-replicated by its leader",
        || {
            let mut sum = 0.0;
            for n in nodes.iter().filter(|n| n.id != dead) {
                sum += n.gauge("strand_under_replicated_partitions")?;
            }
            (sum == f64::from(partitions)).then_some(())
        },
    );
    nodes[idx].spawn();
    let back = Instant::now();
    wait_for(DEADLINE, "every ISR whole again", || {
        let l = leaders_of(&survivor, &topic)?;
        l.values()
            .all(|(leader, isr)| *leader > 0 && *isr == 3)
            .then_some(())
    });
    eprintln!(
        "the restarted node was back in every ISR {:?} after it started",
        back.elapsed()
    );
    let other = (idx + 1) % 3;
    nodes[other].kill9();
    let returned = nodes[idx].bootstrap();
    let last = read_all(&returned, &topic, partitions, 600);
    assert_eq!(last, seen, "read back after the second kill\n{}", dump(&nodes));
}

/// One record sent with `acks` and no retries: its delivery's error code, if any.
fn deliver_one(bootstrap: &str, topic: &str, acks: &str) -> Option<rdkafka::types::RDKafkaErrorCode> {
    let producer: rdkafka::producer::FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("acks", acks)
        .set("enable.idempotence", "false")
        .set("retries", "0")
        .set("message.timeout.ms", "30000")
        .create()
        .expect("a producer");
    let sent = futures::executor::block_on(producer.send(
        rdkafka::producer::FutureRecord::<(), str>::to(topic).payload("x"),
        Duration::from_secs(30),
    ));
    sent.err().map(|(e, _)| {
        e.rdkafka_error_code()
            .unwrap_or(rdkafka::types::RDKafkaErrorCode::Fail)
    })
}

#[test]
fn acks_all_needs_min_insync_replicas_in_the_isr() {
    if external_bootstrap().is_some() {
        eprintln!("skipped: this test starts its own cluster");
        return;
    }
    let nodes = three_combined_nodes();
    // One replica, two needed in sync (as Kafka answers such a topic); and three replicas.
    let lone = strand_compat_tests::unique_topic("min-isr-1");
    let three = strand_compat_tests::unique_topic("min-isr-3");
    create_topics(
        &nodes[0],
        &[
            NewTopic::new(&lone, 1, TopicReplication::Fixed(1)).set("min.insync.replicas", "2"),
            NewTopic::new(&three, 1, TopicReplication::Fixed(3)).set("min.insync.replicas", "2"),
        ],
    );
    let all = nodes.iter().map(Node::bootstrap).collect::<Vec<_>>().join(",");
    for (topic, isr) in [(&lone, 1), (&three, 3)] {
        wait_for(DEADLINE, "the topic led, its ISR full", || {
            let l = leaders_of(&all, topic)?;
            l.get(&0)
                .filter(|(leader, n)| *leader > 0 && *n == isr)
                .map(|_| ())
        });
    }
    assert_eq!(
        deliver_one(&all, &lone, "all"),
        Some(rdkafka::types::RDKafkaErrorCode::NotEnoughReplicas),
        "{}",
        dump(&nodes)
    );
    // acks=1 does not ask for it; a full ISR of three satisfies it.
    assert_eq!(deliver_one(&all, &lone, "1"), None, "{}", dump(&nodes));
    assert_eq!(deliver_one(&all, &three, "all"), None, "{}", dump(&nodes));
}

#[test]
fn leaders_go_back_to_their_preferred_replicas_once_a_restarted_node_is_in_sync() {
    if external_bootstrap().is_some() {
        eprintln!("skipped: this test starts its own cluster");
        return;
    }
    let mut nodes = three_combined_nodes_with(&[("KAFKA_LEADER_IMBALANCE_CHECK_INTERVAL_SECONDS", "1")]);
    let topic = strand_compat_tests::unique_topic("preferred");
    let partitions = 3;
    create_topics(
        &nodes[0],
        &[NewTopic::new(&topic, partitions, TopicReplication::Fixed(3))],
    );
    let all = nodes.iter().map(Node::bootstrap).collect::<Vec<_>>().join(",");
    // Each partition's preferred replica is the first of its replicas.
    let on_preferred = |bootstrap: &str| -> Option<BTreeMap<i32, i32>> {
        let md = metadata_of(bootstrap, Some(&topic))?;
        let t = md.topics().iter().find(|t| t.name() == topic)?;
        let preferred: BTreeMap<i32, i32> = t
            .partitions()
            .iter()
            .map(|p| (p.id(), p.replicas().first().copied().unwrap_or(-1)))
            .collect();
        let settled = t.partitions().len() == 3
            && t.partitions()
                .iter()
                .all(|p| p.isr().len() == 3 && Some(&p.leader()) == p.replicas().first());
        settled.then_some(preferred)
    };
    let preferred = wait_for(DEADLINE, "every partition led by its preferred replica", || {
        on_preferred(&all)
    });
    // The preferred leader of partition 0 dies and returns: its partitions move away, then back.
    let victim = preferred[&0];
    let idx = nodes.iter().position(|n| n.id == victim).expect("its node");
    nodes[idx].kill9();
    let survivor = nodes[(idx + 1) % 3].bootstrap();
    wait_for(DEADLINE, "partition 0 led elsewhere", || {
        let l = leaders_of(&survivor, &topic)?;
        l.get(&0)
            .filter(|(leader, _)| *leader > 0 && *leader != victim)
            .map(|_| ())
    });
    nodes[idx].spawn();
    let back = wait_for(DEADLINE, "leaders back on their preferred replicas", || {
        on_preferred(&survivor)
    });
    assert_eq!(back, preferred, "{}", dump(&nodes));
    let moved = nodes[(idx + 1) % 3]
        .log()
        .matches("handing leadership back")
        .count()
        + nodes[(idx + 2) % 3]
            .log()
            .matches("handing leadership back")
            .count();
    assert!(moved >= 1, "no leadership was handed back:\n{}", dump(&nodes));
}

/// The compat suite's other clients against three combined nodes: confluent-kafka and
/// kafka-python write to replicated topics (three partitions, replication factor 3) with
/// acks=all through the three nodes' addresses, and rdkafka, confluent-kafka, kafka-python and
/// kcat each read back exactly what was written, at the offsets it was given, from leaders
/// spread over the nodes.
#[test]
fn the_python_clients_and_kcat_write_and_read_through_the_cluster() {
    if external_bootstrap().is_some() {
        eprintln!("skipped: this test starts its own cluster");
        return;
    }
    let nodes = three_combined_nodes();
    let bootstrap = nodes.iter().map(Node::bootstrap).collect::<Vec<_>>().join(",");
    let from_confluent = unique_topic("cluster-ck");
    let from_kafka_python = unique_topic("cluster-kp");
    create_topics(
        &nodes[0],
        &[
            NewTopic::new(&from_confluent, 3, TopicReplication::Fixed(3)),
            NewTopic::new(&from_kafka_python, 3, TopicReplication::Fixed(3)),
        ],
    );
    for topic in [&from_confluent, &from_kafka_python] {
        wait_for(DEADLINE, "every partition led with its whole ISR", || {
            leaders_of(&bootstrap, topic)
                .filter(|l| l.len() == 3 && l.values().all(|(leader, isr)| *leader > 0 && *isr == 3))
        });
    }
    let leaders: BTreeSet<i32> = leaders_of(&bootstrap, &from_confluent)
        .unwrap_or_default()
        .values()
        .map(|(leader, _)| *leader)
        .collect();
    eprintln!("[cluster clients] leaders of {from_confluent}: {leaders:?}");

    let writes = clients::python_clients_write(&bootstrap, &from_confluent, &from_kafka_python, 300, 61);
    let (a, a_offsets) = writes.confluent;
    let (b, b_offsets) = writes.kafka_python;

    for (topic, records, offsets) in [
        (&from_confluent, &a, &a_offsets),
        (&from_kafka_python, &b, &b_offsets),
    ] {
        let ends = ends_of(records, 3);
        assert_read_back(
            &format!("rdkafka reading {topic}"),
            records,
            offsets,
            &clients::rdkafka_read_all(&bootstrap, topic, &ends),
        );
        for client in [PythonClient::ConfluentKafka, PythonClient::KafkaPython] {
            let got = clients::python_consume(client, &bootstrap, topic, 0, &ends);
            assert_read_back(&format!("{client:?} reading {topic}"), records, offsets, &got);
        }
        // kcat: every (partition, offset) once, with the value written there.
        let mut cmd = tools::kcat_command();
        cmd.args([
            "-b",
            &bootstrap,
            "-C",
            "-t",
            topic,
            "-e",
            "-o",
            "beginning",
            "-f",
            "%p:%o:%S\n",
        ]);
        let (status, out, err) = tools::run_with_input(cmd, b"", Duration::from_secs(60));
        assert!(
            status.success(),
            "kcat -C failed: {}",
            String::from_utf8_lossy(&err)
        );
        let got: BTreeMap<(i32, i64), usize> = String::from_utf8_lossy(&out)
            .lines()
            .map(|l| {
                let mut f = l.splitn(3, ':');
                let p = f.next().and_then(|p| p.parse().ok()).unwrap_or(-1);
                let o = f.next().and_then(|o| o.parse().ok()).unwrap_or(-1);
                let size = f.next().and_then(|s| s.parse::<i64>().ok()).unwrap_or(-2);
                ((p, o), usize::try_from(size.max(0)).unwrap_or(0))
            })
            .collect();
        let want: BTreeMap<(i32, i64), usize> = records
            .iter()
            .zip(offsets.iter())
            .map(|(r, o)| ((r.partition, *o), r.value.as_ref().map_or(0, Vec::len)))
            .collect();
        assert_eq!(
            got, want,
            "kcat read of {topic}: (partition, offset) -> value size"
        );
    }
}

/// One lease of at most `max` messages of `queue` (visibility `visibility_ms`, long poll 500 ms);
/// an error is printed and answered as nothing leased, after a pause (the caller retries).
fn try_lease(client: &mut QueueClient, queue: &str, max: u32, visibility_ms: u64) -> Vec<Leased> {
    match client.lease(
        queue,
        &LeaseOptions {
            max_messages: Some(max),
            visibility_timeout_ms: Some(visibility_ms),
            wait_ms: Some(500),
            ..LeaseOptions::default()
        },
    ) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("lease: {e:?}");
            std::thread::sleep(Duration::from_millis(200));
            Vec::new()
        }
    }
}

/// Leases and acks everything it can from `client` until every id of `want` is acked or the
/// deadline passes; returns (acked ids, deliveries per id).
fn lease_and_ack_all(
    client: &mut QueueClient,
    queue: &str,
    want: &BTreeSet<String>,
    deadline: Duration,
) -> (BTreeSet<String>, BTreeMap<String, u32>) {
    let mut acked = BTreeSet::new();
    let mut deliveries: BTreeMap<String, u32> = BTreeMap::new();
    let end = Instant::now() + deadline;
    while !want.is_subset(&acked) && Instant::now() < end {
        for m in try_lease(client, queue, 100, 60_000) {
            *deliveries.entry(m.id.clone()).or_default() += 1;
            match client.ack(&m.id, m.generation) {
                Ok(s) => {
                    assert_eq!(s.state, "acknowledged", "{s:?}");
                    acked.insert(m.id);
                }
                Err(e) => eprintln!("ack {}: {e:?}", m.id),
            }
        }
    }
    (acked, deliveries)
}

/// The HTTP queue API answers on every node of a cluster: a queue created through one node is
/// a replicated topic of the cluster; messages published through a second are appended by each
/// partition's leader (forwarded where the leader is another node); a third leases across
/// partitions led by different nodes and acks through the first. Each partition's engines run on
/// its leader only: no message is delivered twice. After the leader of a partition is killed,
/// publishing, leasing and acking go on through the survivors.
#[test]
fn the_http_queue_api_answers_on_every_node_of_a_cluster() {
    if external_bootstrap().is_some() {
        return;
    }
    let mut nodes = three_combined_nodes_with(&[("KAFKA_DEFAULT_REPLICATION_FACTOR", "3")]);
    let queue = unique_topic("cluster-queue");
    let (status, created) = nodes[0]
        .queues()
        .put_queue(&queue, &serde_json::json!({ "partitions": 3 }))
        .expect("PUT the queue");
    assert_eq!(status, 201, "{created}");
    // A replicated topic of the cluster: every broker shows it with three replicas per partition.
    let leaders = wait_for(DEADLINE, "the queue's partitions have leaders", || {
        leaders_of(&nodes[1].bootstrap(), &queue).filter(|l| l.len() == 3 && l.values().all(|(_, r)| *r == 3))
    });
    let led_by: BTreeSet<i32> = leaders.values().map(|(l, _)| *l).collect();
    eprintln!("partition leaders: {leaders:?}");
    for n in &nodes {
        let got = wait_for(DEADLINE, "every node shows the queue", || {
            n.queues().get_queue(&queue).ok()
        });
        assert_eq!(got["partitions"], 3, "{got}");
    }

    const FIRST: usize = 300;
    let mut publisher = nodes[1].queues();
    let mut published = BTreeSet::new();
    for chunk in 0..FIRST / 50 {
        let batch: Vec<QueueMessage> = (0..50)
            .map(|i| QueueMessage::new(format!("m{}", chunk * 50 + i)).key(format!("k{}", chunk * 50 + i)))
            .collect();
        let answer = wait_for(DEADLINE, "a publish", || publisher.publish(&queue, &batch).ok());
        published.extend(answer.into_iter().map(|p| p.id));
    }
    assert_eq!(published.len(), FIRST);

    // Leased through the third node (partitions led by several nodes), acked through it.
    let mut worker = nodes[2].queues();
    let (acked, deliveries) = lease_and_ack_all(&mut worker, &queue, &published, DEADLINE);
    assert_eq!(acked, published, "every published message acked once");
    let twice: Vec<_> = deliveries.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "delivered more than once: {twice:?}");
    // Nothing left to lease anywhere.
    for n in &nodes {
        let more = n
            .queues()
            .lease(
                &queue,
                &LeaseOptions {
                    max_messages: Some(10),
                    ..LeaseOptions::default()
                },
            )
            .expect("lease");
        assert!(
            more.is_empty(),
            "node {} leased acked messages again: {more:?}",
            n.id
        );
    }
    // The queue's statistics gather every partition's engine, wherever it runs.
    let info = nodes[0].queues().get_queue(&queue).expect("GET");
    assert_eq!(info["groups"]["default"]["available"], 0, "{info}");

    // Kill the leader of partition 0 (a node that is not the publisher's nor the worker's,
    // if the leaders allow): the others go on.
    let victim = leaders.get(&0).map(|(l, _)| *l).expect("a leader");
    // Messages waiting in every partition when the leader of partition 0 dies.
    let waiting: Vec<QueueMessage> = (0..30)
        .map(|i| QueueMessage::new(format!("w{i}")).key(format!("w{i}")))
        .collect();
    let waiting_in: BTreeSet<i32> = nodes[1]
        .queues()
        .publish(&queue, &waiting)
        .expect("publish")
        .iter()
        .map(|p| p.partition)
        .collect();
    eprintln!("killing node {victim} (leaders on {led_by:?})");
    let idx = nodes.iter().position(|n| n.id == victim).expect("the victim");
    nodes[idx].kill9();
    let survivors: Vec<usize> = (0..nodes.len()).filter(|i| *i != idx).collect();
    // At once, before partition 0 has a new leader: a lease through a survivor answers what
    // the partitions it reaches hold, not an error for the one it cannot.
    let reachable = waiting_in
        .iter()
        .any(|p| leaders.get(p).is_some_and(|(l, _)| *l != victim));
    let mut early = nodes[survivors[1]].queues();
    let got = early
        .lease(
            &queue,
            &LeaseOptions {
                max_messages: Some(30),
                visibility_timeout_ms: Some(60_000),
                wait_ms: Some(200),
                ..LeaseOptions::default()
            },
        )
        .expect("a lease while a partition has no leader answers the other partitions' messages");
    assert!(
        !reachable || !got.is_empty(),
        "nothing leased from the partitions led by survivors"
    );
    for m in &got {
        early.ack(&m.id, m.generation).expect("ack");
    }
    const SECOND: usize = 100;
    let killed = Instant::now();
    let mut publisher = nodes[survivors[0]].queues();
    // One batch over every partition: accepted once the killed leader's partition has a new one.
    let batch: Vec<QueueMessage> = (0..SECOND)
        .map(|i| QueueMessage::new(format!("after{i}")).key(format!("after{i}")))
        .collect();
    let answer = wait_for(DEADLINE, "a publish after the kill", || {
        publisher.publish(&queue, &batch).ok()
    });
    let publish_pause = killed.elapsed();
    let second: BTreeSet<String> = answer.iter().map(|p| p.id.clone()).collect();
    assert!(
        answer.iter().any(|p| p.partition == 0),
        "the batch covers partition 0"
    );
    let mut worker = nodes[survivors[1]].queues();
    let (acked, _) = lease_and_ack_all(&mut worker, &queue, &second, DEADLINE);
    eprintln!(
        "after killing the leader of partition 0: publishing to every partition resumed after \
         {publish_pause:?}, everything published since was leased and acked {:?} after the kill",
        killed.elapsed()
    );
    assert!(
        second.is_subset(&acked),
        "messages published after the kill are leased and acked: missing {:?}",
        second.difference(&acked).collect::<Vec<_>>()
    );
}

/// Leases `want` messages of `queue` (at most), with `visibility_ms`: `(id, generation, partition)`.
fn lease_n(
    client: &mut QueueClient,
    queue: &str,
    want: usize,
    visibility_ms: u64,
) -> Vec<(String, u64, i32)> {
    let mut got = Vec::new();
    let end = Instant::now() + DEADLINE;
    while got.len() < want && Instant::now() < end {
        let max = u32::try_from(want - got.len()).unwrap_or(100).min(100);
        got.extend(
            try_lease(client, queue, max, visibility_ms)
                .into_iter()
                .map(|m| (m.id, m.generation, m.partition)),
        );
    }
    got
}

/// A queue's delivery state fails over with its partitions (issue 41): its engines' records
/// are committed through each partition's Raft group, so the leader elected after the old one
/// is killed serves from the same state. Of messages leased before the kill, those acked are
/// never delivered again; leases still running stay valid with their generation (their acks
/// succeed through a survivor); leases that expire are delivered again with a higher
/// generation, and an ack naming the old one is refused as stale.
#[test]
fn a_queue_keeps_its_delivery_state_when_the_leader_of_its_partitions_is_killed() {
    if external_bootstrap().is_some() {
        return;
    }
    let mut nodes = three_combined_nodes_with(&[("KAFKA_DEFAULT_REPLICATION_FACTOR", "3")]);
    let queue = unique_topic("failover-queue");
    let (status, created) = nodes[0]
        .queues()
        .put_queue(&queue, &serde_json::json!({ "partitions": 3 }))
        .expect("PUT the queue");
    assert_eq!(status, 201, "{created}");
    let leaders = wait_for(DEADLINE, "the queue's partitions have leaders", || {
        leaders_of(&nodes[1].bootstrap(), &queue).filter(|l| l.len() == 3 && l.values().all(|(_, r)| *r == 3))
    });
    const N: usize = 300;
    let mut publisher = nodes[1].queues();
    for chunk in 0..N / 50 {
        let batch: Vec<QueueMessage> = (0..50)
            .map(|i| QueueMessage::new(format!("m{}", chunk * 50 + i)).key(format!("k{}", chunk * 50 + i)))
            .collect();
        wait_for(DEADLINE, "a publish", || publisher.publish(&queue, &batch).ok());
    }
    // 250 leased for a minute: most acked, some held across the kill; the last 50 leased for
    // two seconds, to expire around the fail-over.
    let mut worker = nodes[2].queues();
    let long = lease_n(&mut worker, &queue, 250, 60_000);
    assert_eq!(long.len(), 250, "leased before the kill");
    // Of each partition's leases, a fifth are held, the rest acked.
    let mut by_partition: BTreeMap<i32, Vec<(String, u64, i32)>> = BTreeMap::new();
    for l in &long {
        by_partition.entry(l.2).or_default().push(l.clone());
    }
    let mut acked = BTreeSet::new();
    let mut held = Vec::new();
    for leases in by_partition.values() {
        let keep = leases.len() / 5;
        for (i, (id, generation, partition)) in leases.iter().enumerate() {
            if i < keep {
                held.push((id.clone(), *generation, *partition));
                continue;
            }
            let s = worker.ack(id, *generation).expect("ack before the kill");
            assert_eq!(s.state, "acknowledged", "{s:?}");
            acked.insert(id.clone());
        }
    }
    let short = lease_n(&mut worker, &queue, 50, 2_000);
    assert_eq!(short.len(), 50, "the rest leased");
    let expiring: BTreeMap<String, u64> = short.iter().map(|(id, g, _)| (id.clone(), *g)).collect();

    let victim = leaders.get(&0).map(|(l, _)| *l).expect("a leader");
    let victim_led: BTreeSet<i32> = leaders
        .iter()
        .filter(|(_, (l, _))| *l == victim)
        .map(|(p, _)| *p)
        .collect();
    eprintln!("killing node {victim}, the leader of partitions {victim_led:?}");
    let idx = nodes.iter().position(|n| n.id == victim).expect("the victim");
    nodes[idx].kill9();
    let killed = Instant::now();
    let survivor = (0..nodes.len()).find(|i| *i != idx).expect("a survivor");
    let mut client = nodes[survivor].queues();

    // The held leases are still valid on the new leaders, with their generations.
    let mut resumed: Option<Duration> = None;
    for (id, generation, partition) in &held {
        let s = wait_for(
            DEADLINE,
            "an ack of a lease held across the kill",
            || {
                match client.ack(id, *generation) {
            Ok(s) => Some(s),
            Err(e) if e.status().is_some_and(|(st, _)| st == 503) || e.is_io() => None,
            Err(e) => panic!("the ack of {id} (partition {partition}, generation {generation}) held across the kill: {e}"),
        }
            },
        );
        assert_eq!(s.state, "acknowledged", "{s:?}");
        if victim_led.contains(partition) && resumed.is_none() {
            // The first ack on a partition the killed node led: its new leader serves.
            resumed = Some(killed.elapsed());
        }
        acked.insert(id.clone());
    }
    // What comes back is what expired, with a higher generation; nothing acked comes back.
    let end = Instant::now() + DEADLINE;
    let mut redelivered: BTreeMap<String, u64> = BTreeMap::new();
    let mut stale_refused = 0;
    while redelivered.len() < expiring.len() && Instant::now() < end {
        for m in try_lease(&mut client, &queue, 100, 60_000) {
            assert!(
                !acked.contains(&m.id),
                "{} was acknowledged before and is delivered again",
                m.id
            );
            let old = *expiring
                .get(&m.id)
                .unwrap_or_else(|| panic!("{} delivered again though its lease was never let go", m.id));
            assert!(
                m.generation > old,
                "{}: generation {} after {old}",
                m.id,
                m.generation
            );
            assert!(
                redelivered.insert(m.id.clone(), m.generation).is_none(),
                "{} leased twice",
                m.id
            );
            if stale_refused < 5 {
                let e = client
                    .ack(&m.id, old)
                    .expect_err("an ack naming the expired lease's generation");
                assert_eq!(e.status(), Some((409, "stale_generation")), "{e}");
                stale_refused += 1;
            }
            let s = client.ack(&m.id, m.generation).expect("ack of the new lease");
            assert_eq!(s.state, "acknowledged", "{s:?}");
        }
    }
    assert_eq!(
        redelivered.keys().collect::<BTreeSet<_>>(),
        expiring.keys().collect::<BTreeSet<_>>(),
        "every expired lease is delivered again"
    );
    let more = client
        .lease(
            &queue,
            &LeaseOptions {
                max_messages: Some(10),
                wait_ms: Some(1_000),
                ..LeaseOptions::default()
            },
        )
        .expect("lease");
    assert!(
        more.is_empty(),
        "leased again after everything was acked: {more:?}"
    );
    eprintln!(
        "queue fail-over: acks of leases held on the killed leader's partitions resumed {resumed:?} after the kill; \
         {} expired leases delivered again, {stale_refused} stale acks refused",
        redelivered.len()
    );
}

/// Kafka share consumers on a cluster: ShareFetch goes to each partition's leader, whichever
/// node coordinates the group. A confluent-kafka ShareConsumer that joined through one node
/// acquires and accepts the records of partitions led by all three; a second member of the
/// group then finds nothing to acquire (accepted records are not delivered again).
#[test]
fn share_consumers_fetch_from_every_partition_leader_of_a_cluster() {
    use strand_compat_tests::share::{self, ShareLog, ShareMember, ShareSpec};
    if external_bootstrap().is_some() {
        return;
    }
    let nodes = three_combined_nodes();
    let bootstrap = nodes[0].bootstrap();
    let topic = unique_topic("cluster-share");
    let group = unique_topic("cluster-share-g");
    create_topics(&nodes[0], &[NewTopic::new(&topic, 3, TopicReplication::Fixed(3))]);
    let leaders = wait_for(DEADLINE, "the topic's partitions have leaders", || {
        leaders_of(&bootstrap, &topic).filter(|l| l.len() == 3)
    });
    let led_by: BTreeSet<i32> = leaders.values().map(|(l, _)| *l).collect();
    eprintln!("partition leaders: {leaders:?}");
    let acked = produce_acked(&bootstrap, &topic, 3, "s", 20);
    let expected: BTreeSet<(i32, i64)> = (0..3).flat_map(|p| (0..20).map(move |o| (p, o))).collect();
    assert_eq!(acked.values().map(Vec::len).sum::<usize>(), expected.len());
    share::set_group_configs(
        &nodes[1].bootstrap(),
        &group,
        &[("share.auto.offset.reset", "earliest")],
    );

    let log = ShareLog::new();
    let first = ShareMember::start("a", &ShareSpec::new(&nodes[1].bootstrap(), &group, &topic), &log);
    log.wait_for(DEADLINE, "every record accepted", |snapshot| {
        let ok = share::ack_results(snapshot, "a").ok;
        expected.is_subset(&ok).then_some(())
    });
    first.stop(Duration::from_secs(30));
    let snapshot = log.snapshot();
    let errors = share::errors(&snapshot, "a");
    assert!(
        share::ack_results(&snapshot, "a").failed.is_empty(),
        "acknowledgements refused: {errors:?}"
    );

    let second = ShareMember::start("b", &ShareSpec::new(&nodes[2].bootstrap(), &group, &topic), &log);
    std::thread::sleep(Duration::from_secs(5));
    second.stop(Duration::from_secs(30));
    let again: Vec<_> = share::acquired(&log.snapshot())
        .into_iter()
        .filter(|(m, _, _)| *m == "b")
        .map(|(_, _, r)| (r.partition, r.offset))
        .collect();
    assert!(
        again.is_empty(),
        "accepted records delivered again: {again:?} (leaders on {led_by:?})"
    );
}

/// Share-group state fails over with its partition: a confluent-kafka ShareConsumer accepts the
/// first records of a replicated partition and holds the rest, then leaves (its held records are
/// released, each delivered once); the partition's leader is killed; a second member, through a
/// survivor, gets exactly the records the first did not accept, each on its second delivery (the
/// delivery counts carried over), and nothing accepted.
#[test]
fn share_consumers_keep_acknowledgements_and_delivery_counts_when_a_leader_is_killed() {
    use strand_compat_tests::share::{self, ShareLog, ShareMember, ShareSpec};
    if external_bootstrap().is_some() {
        return;
    }
    // The group's coordinator fails over too (apache/kafka's example gives __consumer_offsets one
    // replica).
    let mut nodes = three_combined_nodes_with(&[("KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR", "3")]);
    let bootstrap = nodes[0].bootstrap();
    let topic = unique_topic("failover-share");
    let group = unique_topic("failover-share-g");
    // One partition: the first member's first poll gets all its records.
    create_topics(&nodes[0], &[NewTopic::new(&topic, 1, TopicReplication::Fixed(3))]);
    let leaders = wait_for(DEADLINE, "the topic's partition has a leader", || {
        leaders_of(&bootstrap, &topic).filter(|l| l.len() == 1)
    });
    produce_acked(&bootstrap, &topic, 1, "s", 20);
    const ACCEPTED: i64 = 15;
    let accepted: BTreeSet<(i32, i64)> = (0..ACCEPTED).map(|o| (0, o)).collect();
    let held: BTreeSet<(i32, i64)> = (ACCEPTED..20).map(|o| (0, o)).collect();
    share::set_group_configs(
        &nodes[1].bootstrap(),
        &group,
        &[("share.auto.offset.reset", "earliest")],
    );
    let log = ShareLog::new();
    let spec = ShareSpec::new(&nodes[1].bootstrap(), &group, &topic).hold_from(0, ACCEPTED);
    let first = ShareMember::start("a", &spec, &log);
    log.wait_for(
        DEADLINE,
        "the first records accepted, the rest held",
        |snapshot| {
            let ok = share::ack_results(snapshot, "a").ok;
            let got: BTreeSet<(i32, i64)> = share::acquired(snapshot)
                .into_iter()
                .filter(|(m, _, _)| *m == "a")
                .map(|(_, _, r)| (r.partition, r.offset))
                .collect();
            (accepted.is_subset(&ok) && held.is_subset(&got)).then_some(())
        },
    );
    first.stop(Duration::from_secs(30));
    assert!(
        share::ack_results(&log.snapshot(), "a").failed.is_empty(),
        "acknowledgements refused: {:?}",
        share::errors(&log.snapshot(), "a")
    );

    let victim = leaders.get(&0).map(|(l, _)| *l).expect("a leader");
    let idx = nodes.iter().position(|n| n.id == victim).expect("the victim");
    nodes[idx].kill9();
    let killed = Instant::now();
    let survivor = (0..nodes.len()).find(|i| *i != idx).expect("a survivor");
    let coordinator_before = find_coordinator(&nodes[survivor].bootstrap(), &group);
    let coordinator = wait_for(DEADLINE, "a live coordinator", || {
        let c = find_coordinator(&nodes[survivor].bootstrap(), &group);
        (c != victim).then_some(c)
    });
    eprintln!(
        "coordinator {coordinator_before} -> {coordinator} after {:?} (killed {victim})",
        killed.elapsed()
    );
    let second = ShareMember::start(
        "b",
        &ShareSpec::new(&nodes[survivor].bootstrap(), &group, &topic),
        &log,
    );
    log.wait_for(DEADLINE, "the held records delivered again", |snapshot| {
        let got: BTreeSet<(i32, i64)> = share::acquired(snapshot)
            .into_iter()
            .filter(|(m, _, _)| *m == "b")
            .map(|(_, _, r)| (r.partition, r.offset))
            .collect();
        held.is_subset(&got).then_some(())
    });
    let resumed = killed.elapsed();
    std::thread::sleep(Duration::from_secs(2));
    second.stop(Duration::from_secs(30));
    let snapshot = log.snapshot();
    let again: Vec<(i32, i64, i32)> = share::acquired(&snapshot)
        .into_iter()
        .filter(|(m, _, _)| *m == "b")
        .map(|(_, _, r)| (r.partition, r.offset, r.delivery_count))
        .collect();
    let accepted_again: Vec<_> = again
        .iter()
        .filter(|(p, o, _)| accepted.contains(&(*p, *o)))
        .collect();
    assert!(
        accepted_again.is_empty(),
        "accepted records delivered again: {accepted_again:?}"
    );
    let counts: Vec<_> = again.iter().filter(|(_, _, c)| *c != 2).collect();
    assert!(
        counts.is_empty(),
        "held records delivered again not on their second delivery: {counts:?}"
    );
    eprintln!("share fail-over: the held records were acquired again {resumed:?} after the kill");
}

/// DescribeQuorum, DescribeLogDirs and DescribeTopicPartitions on a cluster (issue 44): every
/// node names the same active controller with every voter's progress, and reports the
/// replicas it hosts, followers' included, with their sizes.
#[test]
fn the_admin_views_describe_the_quorum_and_every_hosted_replica() {
    use kafka_protocol::messages::describe_log_dirs_request::DescribableLogDirTopic;
    use kafka_protocol::messages::describe_quorum_request::{PartitionData, TopicData};
    use kafka_protocol::messages::describe_topic_partitions_request::TopicRequest;
    use kafka_protocol::messages::{
        DescribeLogDirsRequest, DescribeQuorumRequest, DescribeTopicPartitionsRequest,
    };
    use strand_compat_tests::admin;

    let nodes = three_combined_nodes();
    let all: BTreeSet<i32> = [1, 2, 3].into();
    let quorum = |n: &Node| {
        let mut c = admin::connect(&n.bootstrap());
        let req = DescribeQuorumRequest::default().with_topics(vec![TopicData::default()
            .with_topic_name(admin::topic_name("__cluster_metadata"))
            .with_partitions(vec![PartitionData::default()])]);
        c.request(2, &req).expect("DescribeQuorum")
    };
    // Every node answers for the one active controller, once every voter has caught up.
    let leaders: BTreeSet<i32> = nodes
        .iter()
        .map(|n| {
            wait_for(DEADLINE, "every voter caught up in DescribeQuorum", || {
                let q = quorum(n);
                let p = &q.topics.first()?.partitions.first()?;
                let voters: BTreeSet<i32> = p.current_voters.iter().map(|v| v.replica_id.0).collect();
                let caught_up = p
                    .current_voters
                    .iter()
                    .all(|v| v.log_end_offset == p.high_watermark && v.last_fetch_timestamp > 0);
                let ok = p.error_code == 0
                    && voters == all
                    && p.high_watermark > 0
                    && p.leader_epoch >= 1
                    && caught_up
                    && q.nodes.len() == 3;
                ok.then_some(p.leader_id.0)
            })
        })
        .collect();
    assert_eq!(leaders.len(), 1, "one active controller: {leaders:?}");

    // A topic on every node: each one's DescribeLogDirs lists both partitions, and the
    // partition written to grows on the followers too.
    let topic = unique_topic("views");
    create_topics(&nodes[0], &[NewTopic::new(&topic, 2, TopicReplication::Fixed(3))]);
    let written = produce_acked(&nodes[0].bootstrap(), &topic, 1, "views", 2000);
    assert_eq!(written.get(&0).map(Vec::len), Some(2000));
    for n in &nodes {
        let mut c = admin::connect(&n.bootstrap());
        wait_for(DEADLINE, "every replica's size in DescribeLogDirs", || {
            let resp = c
                .request(
                    4,
                    &DescribeLogDirsRequest::default().with_topics(Some(vec![
                        DescribableLogDirTopic::default()
                            .with_topic(admin::topic_name(&topic))
                            .with_partitions(vec![0, 1]),
                    ])),
                )
                .ok()?;
            let t = resp.results.first()?.topics.first()?;
            let sizes: BTreeMap<i32, i64> = t
                .partitions
                .iter()
                .map(|p| (p.partition_index, p.partition_size))
                .collect();
            (sizes.len() == 2 && sizes[&0] > 10_000 && sizes[&1] == 0).then_some(())
        });
        let resp = c
            .request(
                0,
                &DescribeTopicPartitionsRequest::default()
                    .with_topics(vec![TopicRequest::default().with_name(admin::topic_name(&topic))])
                    .with_response_partition_limit(1),
            )
            .expect("DescribeTopicPartitions");
        let p = &resp.topics[0].partitions;
        assert_eq!(p.len(), 1, "one partition per page");
        assert_eq!(p[0].replica_nodes.len(), 3);
        assert_eq!(
            resp.next_cursor.map(|c| c.partition_index),
            Some(1),
            "the cursor points at partition 1"
        );
    }
}

/// Node ids from 0, as Testcontainers' and Bitnami's KRaft set-ups number them
/// (`KAFKA_NODE_ID=0`, `0@host:port` voters): a single combined node, then a cluster of three.
#[test]
fn nodes_numbered_from_zero_form_a_cluster() {
    for count in [1, 3] {
        let nodes = start_cluster_from(0, &vec!["broker,controller"; count], &[]);
        let all: BTreeSet<i32> = (0..i32::try_from(count).unwrap()).collect();
        for n in &nodes {
            let b = n.bootstrap();
            wait_for(DEADLINE, "every broker listed", || {
                broker_ids(&b).filter(|ids| *ids == all)
            });
        }
        let topic = unique_topic("from-zero");
        let replicas = i32::try_from(count).unwrap();
        create_topics(
            &nodes[0],
            &[NewTopic::new(&topic, 2, TopicReplication::Fixed(replicas))],
        );
        let acked = produce_acked(&nodes[count - 1].bootstrap(), &topic, 2, "zero", 50);
        assert_eq!(acked.values().map(Vec::len).sum::<usize>(), 100, "{count} nodes");
        let read = read_all(&nodes[0].bootstrap(), &topic, 2, 100);
        assert_eq!(read, acked, "{count} nodes: read back what was acknowledged");
    }
}
