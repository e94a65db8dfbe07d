//! The nodes of a run: N `strand` processes on 127.0.0.1 … 127.0.0.N (or, with `--netns`,
//! each in a network namespace of its own: [`super::netns`]), each with its own data
//! directory, configured as the apache/kafka image is, through the environment
//! (`KAFKA_NODE_ID`, `KAFKA_LISTENERS`, …); started, killed with SIGKILL, stopped with SIGTERM,
//! wiped and restarted under the same id and addresses; and asked, through Metadata, which
//! node leads a partition.
//!
//! One node runs standalone (no `KAFKA_PROCESS_ROLES`: Strand's zero-configuration single
//! node). Several run in KRaft combined mode with the environment of apache/kafka's three-node
//! combined-mode compose example (every node `broker,controller`, a PLAINTEXT and a CONTROLLER
//! listener, the voters `1@…,2@…,3@…`, one `CLUSTER_ID`), with the container host names
//! replaced by loopback addresses: every node listens on the same two ports, each on its own
//! address, as the containers do. Once started, [`Nodes::await_cluster`] waits until every
//! node's Metadata lists every node.

use std::collections::BTreeMap;
use std::fs;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use serde::Serialize;

use super::checker::{NodeNo, PartitionNo};
use super::netns::Net;
use crate::broker::{BrokerProcess, Stopped};

/// The cluster id every node of a multi-node run gets (the one of apache/kafka's examples).
pub const CLUSTER_ID: &str = "4L6g3nShT-eMCtK--X86sw";

/// Where one node lives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeSpec {
    pub id: NodeNo,
    /// Its loopback address, 127.0.0.<id>.
    pub host: String,
    pub kafka_port: u16,
    pub controller_port: u16,
    /// Its HTTP queue API port (`strand.http.listener`), the same across restarts.
    pub http_port: u16,
    /// Its directory: ready file, log.
    pub dir: PathBuf,
    /// Its data directory (`log.dirs`), under `dir`.
    pub data: PathBuf,
}

impl NodeSpec {
    pub fn bootstrap(&self) -> String {
        format!("{}:{}", self.host, self.kafka_port)
    }

    /// The address of its HTTP queue API.
    pub fn http(&self) -> String {
        format!("{}:{}", self.host, self.http_port)
    }
}

/// The layout of `count` nodes under `root`, listening on `kafka_port`, `controller_port` and
/// (HTTP) `http_port`.
pub fn layout(
    root: &Path,
    count: u32,
    kafka_port: u16,
    controller_port: u16,
    http_port: u16,
) -> Vec<NodeSpec> {
    (1..=count)
        .map(|id| {
            let dir = root.join(format!("node-{id}"));
            NodeSpec {
                id: NodeNo(id),
                host: format!("127.0.0.{id}"),
                kafka_port,
                controller_port,
                http_port,
                data: dir.join("data"),
                dir,
            }
        })
        .collect()
}

/// The environment of `node` in a cluster of `all`: as apache/kafka's combined-mode compose
/// example configures its containers, with loopback addresses for host names. A single node
/// gets only its id and listener (standalone).
pub fn environment(node: &NodeSpec, all: &[NodeSpec]) -> Vec<(String, String)> {
    let mut env = vec![
        ("KAFKA_NODE_ID".to_string(), node.id.0.to_string()),
        (
            "KAFKA_ADVERTISED_LISTENERS".into(),
            format!("PLAINTEXT://{}", node.bootstrap()),
        ),
    ];
    if all.len() == 1 {
        env.push((
            "KAFKA_LISTENERS".into(),
            format!("PLAINTEXT://{}", node.bootstrap()),
        ));
        return env;
    }
    let voters: Vec<String> = all
        .iter()
        .map(|n| format!("{}@{}:{}", n.id.0, n.host, n.controller_port))
        .collect();
    let rf = all.len().min(3).to_string();
    env.extend([
        ("KAFKA_PROCESS_ROLES".to_string(), "broker,controller".to_string()),
        (
            "KAFKA_LISTENERS".into(),
            format!(
                "PLAINTEXT://{},CONTROLLER://{}:{}",
                node.bootstrap(),
                node.host,
                node.controller_port
            ),
        ),
        (
            "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP".into(),
            "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT".into(),
        ),
        ("KAFKA_CONTROLLER_QUORUM_VOTERS".into(), voters.join(",")),
        ("KAFKA_CONTROLLER_LISTENER_NAMES".into(), "CONTROLLER".into()),
        ("KAFKA_INTER_BROKER_LISTENER_NAME".into(), "PLAINTEXT".into()),
        ("CLUSTER_ID".into(), CLUSTER_ID.into()),
        ("KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR".into(), rf.clone()),
        ("KAFKA_DEFAULT_REPLICATION_FACTOR".into(), rf),
        ("KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS".into(), "0".into()),
    ]);
    env
}

/// A port free on every one of `hosts` a moment ago, below the kernel's ephemeral range
/// (32768 and up by default): a listener there cannot collide with the source port of an
/// outgoing connection to the same loopback address (the kernel picks the destination's
/// 127.0.0.x as the source), which a restarted node would then fail to bind.
pub fn free_port_on(hosts: &[String]) -> Result<u16> {
    if hosts.is_empty() {
        bail!("no hosts");
    }
    // Successive calls start from different candidates (and differ between processes).
    static CALLS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let start = (std::process::id()
        .wrapping_mul(31)
        .wrapping_add(call.wrapping_mul(613)))
        % 12_000;
    for k in 0..2_000u32 {
        let port = u16::try_from(20_000 + (start + k * 7) % 12_000).unwrap_or(20_000);
        if hosts
            .iter()
            .all(|h| TcpListener::bind((h.as_str(), port)).is_ok())
        {
            return Ok(port);
        }
    }
    bail!("no port below 32000 free on all of {hosts:?}")
}

/// Something that happened to a node, for the report.
#[derive(Debug, Clone, Serialize)]
pub struct NodeEvent {
    pub node: NodeNo,
    pub at_ms: f64,
    pub what: String,
}

/// What starts a node: the program, its environment, its arguments.
type Launch = (PathBuf, Vec<(String, String)>, Vec<String>);

/// The running nodes.
pub struct Nodes {
    pub specs: Vec<NodeSpec>,
    /// Declared before `net`: the processes are killed before their namespaces go.
    procs: BTreeMap<NodeNo, BrokerProcess>,
    /// The nodes' network namespaces (`--netns`), if they run in some.
    net: Option<Net>,
    binary: PathBuf,
    extra_args: Vec<String>,
    ready_timeout: Duration,
    started: Instant,
    pub events: Vec<NodeEvent>,
}

impl Nodes {
    /// Nodes laid out under `root` (not started); `extra_args` go to every start of every
    /// node. With `netns`, each node runs in a network namespace of its own ([`Net`]).
    pub fn new(
        binary: &Path,
        root: &Path,
        count: u32,
        netns: bool,
        extra_args: &[String],
        ready_timeout: Duration,
        started: Instant,
    ) -> Result<Self> {
        let (specs, net) = if netns {
            let net = Net::create(count)?;
            // Every namespace is a network stack of its own: any port is free there.
            let mut specs = layout(root, count, 9092, 9093, 8080);
            for s in &mut specs {
                s.host = net.host(s.id);
            }
            (specs, Some(net))
        } else {
            let hosts: Vec<String> = (1..=count).map(|i| format!("127.0.0.{i}")).collect();
            let kafka = free_port_on(&hosts)?;
            let mut controller = free_port_on(&hosts)?;
            while controller == kafka {
                controller = free_port_on(&hosts)?;
            }
            let mut http = free_port_on(&hosts)?;
            while http == kafka || http == controller {
                http = free_port_on(&hosts)?;
            }
            (layout(root, count, kafka, controller, http), None)
        };
        Ok(Self {
            specs,
            procs: BTreeMap::new(),
            net,
            binary: binary.to_path_buf(),
            extra_args: extra_args.to_vec(),
            ready_timeout,
            started,
            events: Vec::new(),
        })
    }

    fn spec(&self, node: NodeNo) -> Result<&NodeSpec> {
        self.specs
            .iter()
            .find(|s| s.id == node)
            .with_context(|| format!("no node {}", node.0))
    }

    fn event(&mut self, node: NodeNo, what: String) {
        self.events.push(NodeEvent {
            node,
            at_ms: self.started.elapsed().as_secs_f64() * 1000.0,
            what,
        });
    }

    /// The bootstrap list of every node.
    pub fn bootstrap(&self) -> String {
        self.specs
            .iter()
            .map(NodeSpec::bootstrap)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// What starts `spec`'s node: the program, its environment, its arguments.
    fn launch(&self, spec: &NodeSpec) -> Result<Launch> {
        let program = match &self.net {
            Some(net) => net.wrapper(spec.id, &self.binary, &spec.dir)?,
            None => self.binary.clone(),
        };
        let mut args = vec![
            "--override".to_string(),
            format!("strand.admin.listener={}:0", spec.host),
            "--override".into(),
            format!("strand.http.listener={}", spec.http()),
            "--override".into(),
            // The harness creates its topic; a client must not create it again with the
            // default partition count after a wipe.
            "auto.create.topics.enable=false".into(),
        ];
        args.extend(self.extra_args.iter().cloned());
        Ok((program, environment(spec, &self.specs), args))
    }

    /// Starts `node` on its data directory and waits for its ready file.
    pub fn start(&mut self, node: NodeNo) -> Result<()> {
        if self.procs.contains_key(&node) {
            bail!("node {} is already running", node.0);
        }
        let spec = self.spec(node)?.clone();
        let (program, env, args) = self.launch(&spec)?;
        let p =
            BrokerProcess::spawn_strand_env(&program, &spec.data, &spec.dir, &env, &args, self.ready_timeout)
                .with_context(|| format!("starting node {}", node.0))?;
        self.event(
            node,
            format!(
                "ready after {:.0} ms (pid {})",
                p.ready_after.as_secs_f64() * 1000.0,
                p.pid
            ),
        );
        self.procs.insert(node, p);
        Ok(())
    }

    /// Starts every node at once (a cluster's nodes wait for one another) and waits for their
    /// ready files.
    pub fn start_all(&mut self) -> Result<()> {
        let specs = self.specs.clone();
        let launches = specs
            .iter()
            .map(|spec| self.launch(spec))
            .collect::<Result<Vec<_>>>()?;
        let timeout = self.ready_timeout;
        let started: Vec<(NodeNo, Result<BrokerProcess>)> = thread::scope(|s| {
            let handles: Vec<_> = specs
                .iter()
                .zip(launches)
                .map(|(spec, (program, env, args))| {
                    (
                        spec.id,
                        s.spawn(move || {
                            BrokerProcess::spawn_strand_env(
                                &program, &spec.data, &spec.dir, &env, &args, timeout,
                            )
                        }),
                    )
                })
                .collect();
            handles
                .into_iter()
                .map(|(id, h)| {
                    (
                        id,
                        h.join()
                            .unwrap_or_else(|_| Err(anyhow::anyhow!("start thread panicked"))),
                    )
                })
                .collect()
        });
        let mut first_error = None;
        for (id, r) in started {
            match r {
                Ok(p) => {
                    self.event(
                        id,
                        format!(
                            "ready after {:.0} ms (pid {})",
                            p.ready_after.as_secs_f64() * 1000.0,
                            p.pid
                        ),
                    );
                    self.procs.insert(id, p);
                }
                Err(e) => {
                    first_error.get_or_insert(e.context(format!("starting node {}", id.0)));
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// SIGKILL `node` (a crash: nothing flushed).
    pub fn kill(&mut self, node: NodeNo) -> Result<Stopped> {
        let p = self
            .procs
            .remove(&node)
            .with_context(|| format!("node {} is not running", node.0))?;
        let stopped = p.kill()?;
        self.event(node, stopped.how.clone());
        Ok(stopped)
    }

    /// SIGTERM `node`, SIGKILL after `grace`.
    pub fn stop(&mut self, node: NodeNo, grace: Duration) -> Result<Stopped> {
        let p = self
            .procs
            .remove(&node)
            .with_context(|| format!("node {} is not running", node.0))?;
        let stopped = p.terminate(grace)?;
        self.event(node, stopped.how.clone());
        Ok(stopped)
    }

    /// Cuts `node` off from the other nodes (the clients still reach every node); needs the
    /// nodes in network namespaces.
    pub fn isolate(&mut self, node: NodeNo) -> Result<()> {
        let net = self
            .net
            .as_mut()
            .context("isolating a node needs the nodes in network namespaces (--netns)")?;
        net.isolate(node)?;
        self.event(node, "isolated from the other nodes".into());
        Ok(())
    }

    /// Removes every isolation (of `node`, for the record).
    pub fn heal(&mut self, node: NodeNo) -> Result<()> {
        if let Some(net) = self.net.as_mut() {
            net.heal()?;
            self.event(node, "isolation healed".into());
        }
        Ok(())
    }

    /// The network namespace `node` runs in, if the nodes run in some.
    pub fn namespace_of(&self, node: NodeNo) -> Option<String> {
        self.net.as_ref().map(|n| n.namespace(node))
    }

    /// Removes a stopped node's data directory (its disk wiped).
    pub fn wipe(&mut self, node: NodeNo) -> Result<()> {
        if self.procs.contains_key(&node) {
            bail!("node {} is running: stop it before wiping its disk", node.0);
        }
        let data = self.spec(node)?.data.clone();
        match fs::remove_dir_all(&data) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("removing {}", data.display())),
        }
        self.event(node, format!("data directory {} removed", data.display()));
        Ok(())
    }

    /// Stops every running node with SIGTERM (`grace` each).
    pub fn stop_all(&mut self, grace: Duration) -> Vec<String> {
        let running: Vec<NodeNo> = self.procs.keys().copied().collect();
        running
            .into_iter()
            .filter_map(|n| {
                self.stop(n, grace)
                    .err()
                    .map(|e| format!("stopping node {}: {e:#}", n.0))
            })
            .collect()
    }

    /// Whether `node` runs (and has not exited by itself).
    pub fn is_running(&mut self, node: NodeNo) -> bool {
        self.procs.get_mut(&node).is_some_and(BrokerProcess::is_running)
    }

    /// Nodes whose process exited by itself.
    pub fn exited(&mut self) -> Vec<(NodeNo, String)> {
        self.procs
            .iter_mut()
            .filter_map(|(n, p)| (!p.is_running()).then(|| (*n, p.log_tail())))
            .collect()
    }

    /// Waits until every running node's Metadata lists every node of the layout: the cluster
    /// has formed. Fails after `timeout` saying what each node sees.
    pub fn await_cluster(&self, timeout: Duration) -> Result<()> {
        let want: Vec<i32> = self.specs.iter().map(|s| s.id.0 as i32).collect();
        let deadline = Instant::now() + timeout;
        loop {
            let mut seen = Vec::new();
            for spec in self.specs.iter().filter(|s| self.procs.contains_key(&s.id)) {
                let brokers = metadata_brokers(&spec.bootstrap()).unwrap_or_default();
                seen.push((spec.id.0, brokers));
            }
            if seen.iter().all(|(_, b)| {
                let mut b = b.clone();
                b.sort_unstable();
                b == want
            }) {
                return Ok(());
            }
            if Instant::now() > deadline {
                let what: Vec<String> = seen
                    .iter()
                    .map(|(n, b)| format!("node {n} lists brokers {b:?}"))
                    .collect();
                bail!(
                    "the {} nodes did not form a cluster within {timeout:?}: {} (want {want:?})",
                    self.specs.len(),
                    what.join("; ")
                );
            }
            thread::sleep(Duration::from_millis(200));
        }
    }

    /// The leaders of `topic`'s partitions, asked of the running nodes in turn (the first that
    /// answers); a partition without a leader, or led by a node not in the layout, is absent.
    pub fn leaders(&self, topic: &str, timeout: Duration) -> Result<BTreeMap<PartitionNo, NodeNo>> {
        let mut last_error = None;
        for spec in self.specs.iter().filter(|s| self.procs.contains_key(&s.id)) {
            match partition_leaders(&spec.bootstrap(), topic, timeout) {
                Ok(map) => {
                    return Ok(map
                        .into_iter()
                        .filter(|(_, n)| self.specs.iter().any(|s| s.id == *n))
                        .collect())
                }
                Err(e) => last_error = Some(e),
            }
        }
        Err(last_error.unwrap_or_else(|| anyhow::anyhow!("no node is running")))
    }

    /// The leader of `partition`, waiting up to `timeout` for one.
    pub fn leader_of(&self, topic: &str, partition: PartitionNo, timeout: Duration) -> Result<NodeNo> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(map) = self.leaders(topic, Duration::from_secs(5)) {
                if let Some(n) = map.get(&partition) {
                    return Ok(*n);
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "partition {} of {topic} has no leader after {timeout:?}",
                    partition.0
                );
            }
            thread::sleep(Duration::from_millis(100));
        }
    }

    /// The log tail of every node (for errors).
    pub fn log_tails(&self) -> String {
        self.specs
            .iter()
            .map(|s| {
                let log = s.dir.join("broker.log");
                let text = fs::read_to_string(&log).unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                format!(
                    "node {} ({}):\n{}",
                    s.id.0,
                    log.display(),
                    lines[lines.len().saturating_sub(10)..].join("\n")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

fn metadata_client(bootstrap: &str) -> Result<BaseConsumer> {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("broker.address.family", "v4")
        .set("log_level", "0")
        .set("topic.metadata.refresh.interval.ms", "-1")
        .create()
        .context("creating a metadata client")
}

/// The broker ids `bootstrap`'s Metadata lists.
fn metadata_brokers(bootstrap: &str) -> Result<Vec<i32>> {
    let c = metadata_client(bootstrap)?;
    let md = c
        .fetch_metadata(None, Duration::from_secs(3))
        .with_context(|| format!("Metadata from {bootstrap}"))?;
    Ok(md.brokers().iter().map(|b| b.id()).collect())
}

/// Partition → leader, from `bootstrap`'s Metadata of `topic`.
fn partition_leaders(
    bootstrap: &str,
    topic: &str,
    timeout: Duration,
) -> Result<BTreeMap<PartitionNo, NodeNo>> {
    let c = metadata_client(bootstrap)?;
    let md = c
        .fetch_metadata(Some(topic), timeout)
        .with_context(|| format!("Metadata of {topic} from {bootstrap}"))?;
    let t = md
        .topics()
        .iter()
        .find(|t| t.name() == topic)
        .with_context(|| format!("{bootstrap} does not list {topic}"))?;
    if let Some(e) = t.error() {
        bail!("{bootstrap}: topic {topic}: {e:?}");
    }
    Ok(t.partitions()
        .iter()
        .filter(|p| p.error().is_none() && p.leader() >= 0)
        .filter_map(|p| Some((PartitionNo(p.id()), NodeNo(u32::try_from(p.leader()).ok()?))))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_map(env: &[(String, String)]) -> BTreeMap<&str, &str> {
        env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
    }

    #[test]
    fn one_node_runs_standalone() {
        let specs = layout(Path::new("/r"), 1, 9092, 9093, 8080);
        assert_eq!(specs[0].data, Path::new("/r/node-1/data"));
        let env = environment(&specs[0], &specs);
        let m = env_map(&env);
        assert_eq!(m["KAFKA_NODE_ID"], "1");
        assert_eq!(m["KAFKA_LISTENERS"], "PLAINTEXT://127.0.0.1:9092");
        assert!(!m.contains_key("KAFKA_PROCESS_ROLES") && !m.contains_key("CLUSTER_ID"));
    }

    #[test]
    fn three_nodes_get_the_combined_mode_compose_environment() {
        let specs = layout(Path::new("/r"), 3, 19092, 29093, 18080);
        let env = environment(&specs[1], &specs);
        let m = env_map(&env);
        assert_eq!(m["KAFKA_NODE_ID"], "2");
        assert_eq!(m["KAFKA_PROCESS_ROLES"], "broker,controller");
        assert_eq!(
            m["KAFKA_CONTROLLER_QUORUM_VOTERS"],
            "1@127.0.0.1:29093,2@127.0.0.2:29093,3@127.0.0.3:29093"
        );
        assert_eq!(
            m["KAFKA_LISTENERS"],
            "PLAINTEXT://127.0.0.2:19092,CONTROLLER://127.0.0.2:29093"
        );
        assert_eq!(m["KAFKA_ADVERTISED_LISTENERS"], "PLAINTEXT://127.0.0.2:19092");
        assert_eq!(m["KAFKA_CONTROLLER_LISTENER_NAMES"], "CONTROLLER");
        assert_eq!(m["KAFKA_INTER_BROKER_LISTENER_NAME"], "PLAINTEXT");
        assert_eq!(m["CLUSTER_ID"], CLUSTER_ID);
        assert_eq!(m["KAFKA_DEFAULT_REPLICATION_FACTOR"], "3");
    }

    #[test]
    fn a_free_port_is_free_on_every_loopback_address() {
        let hosts: Vec<String> = (1..=3).map(|i| format!("127.0.0.{i}")).collect();
        let port = free_port_on(&hosts).unwrap();
        for h in &hosts {
            drop(TcpListener::bind((h.as_str(), port)).unwrap());
        }
    }
}
