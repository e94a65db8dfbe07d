//! A KRaft-configured node's part in the cluster, on shard 0: the controller quorum (with the
//! controller role), the controller RPCs, and the broker's registration, heartbeats and
//! metadata (with the broker role).
//!
//! - **The quorum.** The metadata log is `__cluster_metadata-0`, a partition log on shard 0's
//!   store ([`METADATA_DIR`], incarnation [`METADATA_TOPIC_ID`], never subject to retention),
//!   wrapped as a Raft replica log (`ShardReplicaLog`). The [`Controller`] runs on the glommio
//!   runtime over a [`NodeNetwork`] of TCP connections ([`TcpConnections`]) to the voters'
//!   `controller.quorum.voters` addresses, whose heartbeats are coalesced for up to
//!   [`TICK_MS`]. The first start initializes the Raft membership with the static voter set on
//!   every voter: openraft allows this when every voter proposes the same membership (each
//!   writes it as its first entry; the election then picks one log), and answers `NotAllowed`
//!   on a node that already has a log or a vote, which is how a restart is told apart.
//! - **Serving.** The controller listener (`controller.listener.names`' listener) is bound on
//!   shard 0 only; a busy address is retried every second, so the node starts and keeps trying.
//!   Its Raft stands for election (and initializes the quorum) only once the listener is bound:
//!   a voter that can call the others but cannot be called would win elections and then never
//!   hear the brokers.
//!   Raft messages go to the metadata group's Raft; control requests ([`super::rpc`]) are
//!   answered here: decisions through [`Controller::decide`] with the functions of
//!   [`super::control`], metadata fetches from the applier (the records after the requester's
//!   offset while the applier keeps them, else a snapshot of the state). A controller that is
//!   not the quorum leader answers `NotController` with the leader it knows of.
//! - **Calling the controller** ([`ControlClient`]): a request goes to the leader last heard
//!   of, or the voters in turn; `NotController` redirects it, a failure moves on to the next
//!   voter after a backoff (50 ms doubling to 1 s), a bounded number of times. A node that is
//!   itself a controller asks its own controller directly, not over TCP.
//! - **The broker.** With the broker role, the node registers (a fresh incarnation id per
//!   process, its advertised client listeners, its shard count), heartbeats every
//!   `broker.heartbeat.interval.ms` (every [`FENCED_HEARTBEAT_MS`] while it is fenced, so that
//!   it is unfenced as soon as it has caught up), and re-registers when told its epoch is stale. A combined
//!   node reads the committed state from its own controller's applier; a broker-only node
//!   fetches it from the quorum every [`FETCH_INTERVAL_MS`] (records after its offset, or a
//!   whole snapshot when it is too far behind), as Kafka brokers fetch `__cluster_metadata`.
//!   Every newer state is handed to `publish` (the server gives it to every shard). On SIGTERM
//!   ([`ClusterNode::shutdown`]) the broker stops its heartbeats and asks to shut down
//!   (Kafka's controlled shutdown: it leaves every ISR, its partition groups have handed their
//!   leaderships over already, then it is fenced and leaves Metadata), for a bounded time, and
//!   the controller's Raft stops.
//! - **Timers of the active controller.** Every second it fences the brokers whose last
//!   heartbeat is `broker.session.timeout.ms` old. On the other controllers the decision is
//!   refused as `NotController` at once. (Leaders are the partition groups' to elect; the
//!   replication subsystem balances them.)

use std::cell::{Cell, RefCell};
use std::collections::BTreeSet;
use std::net::{SocketAddr, ToSocketAddrs};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::ResponseError;
use strand_protocol::types::{NodeId, PartitionId, TopicId};
use strand_raft::partition::shard_log::ShardReplicaLog;
use strand_raft::partition::{BrokerId, PartitionRaft, ReplicaStore};
use strand_raft::rt::GlommioRuntime;
use strand_raft::transport::network::{
    Connection, GroupRafts, NetworkConfig, NodeNetwork, Server, ServerLimits,
};
use strand_raft::transport::tcp::{self, TcpConfig, TcpConnections};
use strand_raft::transport::{GroupId, Message};
use strand_storage::fs_glommio::GlommioFs;
use strand_storage::notify::Notify;
use strand_storage::{LogConfig, LogKey, ShardStore};

use super::control::{
    allocate_producer_ids, alter_configs, alter_partition, create_partitions, create_topic, delete_topic,
    fence_stale_brokers, heartbeat, leader_elected, register_broker, BrokerRegistrationRequest,
    ControllerConfig, Heartbeat,
};
use super::quorum::{Controller, ControllerError};
use super::record::{BrokerEpoch, Endpoint, IncarnationId, MetadataOffset};
use super::rpc::{ControlReply, ControlRequest, MAX_FETCH_BYTES};
use super::state::ClusterState;
use crate::config::{Config, Quorum};
use crate::metadata::AdminError;

/// The metadata log's directory on shard 0's store.
pub const METADATA_DIR: &str = "__cluster_metadata-0";
/// The metadata topic's id, as Kafka fixes it (`Uuid.METADATA_TOPIC_ID`, 0 and 1).
pub const METADATA_TOPIC_ID: TopicId = TopicId(uuid::Uuid::from_u64_pair(0, 1));
/// How long a queued heartbeat waits for others to leave with it (a fifth of the Raft
/// heartbeat interval).
pub const TICK_MS: u64 = 20;
/// The Raft heartbeat interval of the metadata group.
const RAFT_HEARTBEAT_MS: u64 = 100;
/// How often a broker heartbeats while it is fenced (Kafka's heartbeats while starting are
/// as frequent).
const FENCED_HEARTBEAT_MS: u64 = 50;
/// How often a broker-only node fetches the metadata.
pub const FETCH_INTERVAL_MS: u64 = 200;
/// How often the active controller looks for brokers whose session expired.
const FENCE_CHECK_INTERVAL_MS: u64 = 1_000;
/// Records one metadata fetch answer carries at most.
const MAX_FETCH_RECORDS: usize = 1_024;
/// How long one attempt of a control request may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// Attempts of one control request before the caller gets an error.
const MAX_ATTEMPTS: u32 = 12;

type Rt = GlommioRuntime;
/// The metadata log: a partition log of shard 0's store as a Raft replica log.
pub type MetadataLog = ShardReplicaLog<GlommioFs>;
/// A controller of this process.
pub type NodeController = Controller<Rt, MetadataLog>;
type Network = NodeNetwork<Rt, TcpConnections>;

/// The metadata log's Raft group.
pub fn metadata_group() -> GroupId {
    GroupId {
        topic: METADATA_TOPIC_ID,
        partition: PartitionId(0),
    }
}

/// The metadata log's key in the shard journal (journal replay and start-up know it).
pub fn metadata_log_key() -> LogKey {
    LogKey {
        dir_name: METADATA_DIR.to_owned(),
        incarnation: *METADATA_TOPIC_ID.0.as_bytes(),
    }
}

/// The metadata log's storage settings: kept whole (no retention; Raft snapshots do not purge
/// it yet).
pub fn metadata_log_config() -> LogConfig {
    LogConfig {
        retention_ms: None,
        retention_bytes: None,
        ..LogConfig::default()
    }
}

fn broker_id(n: NodeId) -> BrokerId {
    BrokerId(u64::try_from(n.0).unwrap_or(0))
}

fn node_id(b: BrokerId) -> Option<NodeId> {
    i32::try_from(b.0).ok().map(NodeId)
}

/// The metadata group is the only group a controller serves.
struct MetadataGroup(Rc<RefCell<Option<Rc<NodeController>>>>);

impl GroupRafts<Rt> for MetadataGroup {
    type StateMachine = ReplicaStore<Rt, MetadataLog>;

    fn raft(&self, group: GroupId) -> Option<openraft::Raft<PartitionRaft<Rt>, Self::StateMachine>> {
        if group != metadata_group() {
            return None;
        }
        self.0.borrow().as_ref().map(|c| c.raft().clone())
    }
}

/// What the broker side registers with.
pub struct BrokerInfo {
    pub endpoints: Vec<Endpoint>,
    pub rack: Option<String>,
    pub shards: u16,
}

/// This node's part in the cluster (see the module documentation).
pub struct ClusterNode {
    id: NodeId,
    config: Rc<Config>,
    network: Rc<Network>,
    controller: Rc<RefCell<Option<Rc<NodeController>>>>,
    client: ControlClient,
    /// A broker-only node's copy of the committed state.
    fetched: RefCell<ClusterState>,
    /// Notified when `fetched` changes or the controller starts (then its applier notifies).
    changed: Notify,
    /// The epoch of this process's registration, once registered.
    epoch: Cell<Option<BrokerEpoch>>,
    /// Set by [`ClusterNode::shutdown`]: the broker's own heartbeats stop (one that did not
    /// want shutdown would unfence it again).
    stopping: Cell<bool>,
    now_ms: Rc<dyn Fn() -> i64>,
}

impl ClusterNode {
    /// Starts the node's cluster tasks on the current (shard 0's) executor; returns at once,
    /// the quorum and the broker keep trying in the background. `publish` is called with every
    /// newer committed state.
    pub fn start(
        config: Rc<Config>,
        store: Rc<ShardStore<GlommioFs>>,
        broker: BrokerInfo,
        now_ms: Rc<dyn Fn() -> i64>,
        publish: Rc<dyn Fn(&ClusterState)>,
    ) -> Rc<ClusterNode> {
        let cluster = &config.cluster;
        let id = cluster.node_id;
        let voters: Vec<(NodeId, String, u16)> = match &cluster.quorum {
            Quorum::Voters(v) => v.iter().map(|(id, hp)| (*id, hp.host.clone(), hp.port)).collect(),
            // Bootstrap servers without voters and standalone nodes run no quorum here.
            Quorum::Bootstrap(_) | Quorum::Standalone => Vec::new(),
        };
        let addrs = voters.clone();
        let resolve: tcp::Resolve = Box::new(move |peer: BrokerId| {
            let (_, host, port) = addrs.iter().find(|(id, _, _)| broker_id(*id) == peer)?;
            (host.as_str(), *port)
                .to_socket_addrs()
                .ok()?
                .next()
                .map(|a: SocketAddr| a)
        });
        let conns = TcpConnections::new(
            broker_id(id),
            resolve,
            Rc::new(Instant::now),
            TcpConfig::default(),
        );
        let network = NodeNetwork::<Rt, _>::new(broker_id(id), conns, NetworkConfig::default());
        let controller = Rc::new(RefCell::new(None));
        let node = Rc::new(ClusterNode {
            id,
            client: ControlClient {
                voters: voters.iter().map(|(id, _, _)| *id).collect(),
                leader: Cell::new(None),
                next_voter: Cell::new(0),
                network: Rc::clone(&network),
                local: Rc::clone(&controller),
                local_id: id,
                now_ms: Rc::clone(&now_ms),
            },
            config: Rc::clone(&config),
            network,
            controller,
            fetched: RefCell::new(ClusterState::default()),
            changed: Notify::new(),
            epoch: Cell::new(None),
            stopping: Cell::new(false),
            now_ms,
        });
        let ticker = Rc::clone(&node.network);
        glommio::spawn_local(async move {
            loop {
                // Heartbeats wait up to a tick to leave together; none queued, no wake-up.
                ticker.heartbeats_queued().await;
                glommio::timer::sleep(Duration::from_millis(TICK_MS)).await;
                ticker.tick();
            }
        })
        .detach();
        if cluster.roles.controller {
            let n = Rc::clone(&node);
            let voter_ids: BTreeSet<BrokerId> = voters.iter().map(|(id, _, _)| broker_id(*id)).collect();
            glommio::spawn_local(async move { n.run_controller(store, voter_ids).await }).detach();
        }
        if cluster.roles.broker {
            let n = Rc::clone(&node);
            glommio::spawn_local(async move { n.run_broker(broker).await }).detach();
        }
        let n = Rc::clone(&node);
        glommio::spawn_local(async move { n.run_publisher(publish).await }).detach();
        node
    }

    /// The controller of this node, once it runs.
    pub fn controller(&self) -> Option<Rc<NodeController>> {
        self.controller.borrow().clone()
    }

    /// Calls the active controller.
    pub fn client(&self) -> &ControlClient {
        &self.client
    }

    /// This node's id.
    pub fn id(&self) -> NodeId {
        self.id
    }

    /// This process's broker epoch, once registered.
    pub fn broker_epoch(&self) -> Option<BrokerEpoch> {
        self.epoch.get()
    }

    /// The committed state this node knows (its controller's, or the one it fetched).
    pub fn state(&self) -> ClusterState {
        match self.controller() {
            Some(c) => c.state().clone(),
            None => self.fetched.borrow().clone(),
        }
    }

    /// This broker, registered at `epoch`, is unfenced in the state it holds.
    fn live_at(&self, epoch: BrokerEpoch) -> bool {
        let live = |s: &ClusterState| s.broker(self.id).is_some_and(|b| b.epoch == epoch && !b.fenced);
        match self.controller() {
            Some(c) => live(&c.state()),
            None => live(&self.fetched.borrow()),
        }
    }

    fn next_offset(&self) -> MetadataOffset {
        match self.controller() {
            Some(c) => c.next_offset(),
            None => self.fetched.borrow().next_offset(),
        }
    }

    /// A clean stop (SIGTERM): the broker asks the active controller to let it shut down
    /// (heartbeats wanting shutdown, as Kafka's controlled shutdown: its leaderships move away
    /// where another replica can take them, then it is fenced, so it leaves Metadata at once),
    /// for at most `timeout`; then the controller's Raft stops.
    pub async fn shutdown(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        self.stopping.set(true);
        if let Some(epoch) = self.epoch.get() {
            while Instant::now() < deadline {
                let hb = ControlRequest::Heartbeat(Heartbeat {
                    broker: self.id,
                    epoch,
                    metadata_offset: self.next_offset(),
                    want_fence: false,
                    want_shutdown: true,
                });
                let remaining = deadline.saturating_duration_since(Instant::now());
                let answer =
                    glommio::timer::timeout(remaining, async { Ok(self.client.call(&hb).await) }).await;
                if let Ok(Ok(ControlReply::Heartbeat(r))) = answer {
                    if r.should_shut_down {
                        tracing::info!("the controller quorum let this broker stop");
                        break;
                    }
                }
                glommio::timer::sleep(Duration::from_millis(100)).await;
            }
        }
        if let Some(c) = self.controller() {
            if let Err(e) = c.raft().shutdown().await {
                tracing::warn!(error = %e, "the controller's Raft did not stop cleanly");
            }
        }
    }

    async fn run_controller(self: Rc<Self>, store: Rc<ShardStore<GlommioFs>>, voters: BTreeSet<BrokerId>) {
        let controller = loop {
            match self.open_controller(&store).await {
                Ok(c) => break c,
                Err(e) => {
                    tracing::error!(error = %e, "cannot start the controller; retrying");
                    glommio::timer::sleep(Duration::from_secs(1)).await;
                }
            }
        };
        *self.controller.borrow_mut() = Some(Rc::clone(&controller));
        self.changed.notify_all();
        let Some(socket) = self.bind_controller_listener().await else {
            return;
        };
        // Serve before initializing: the other voters' votes need an answer.
        let me = Rc::clone(&self);
        glommio::spawn_local(async move { me.serve(socket).await }).detach();
        // Only a voter the others can reach stands for election: one that could call out but
        // not be called would win and then never hear the brokers (see `open_controller`).
        controller.raft().runtime_config().elect(true);
        match controller.raft().is_initialized().await {
            Ok(true) => {}
            Ok(false) => match controller.raft().initialize(voters.clone()).await {
                Ok(()) => tracing::info!(?voters, "initialized the controller quorum"),
                Err(e) => tracing::info!(error = %e, "the controller quorum was initialized already"),
            },
            Err(e) => tracing::error!(error = %e, "the controller's Raft failed"),
        }
        let me = Rc::clone(&self);
        glommio::spawn_local(async move { me.run_timers().await }).detach();
    }

    async fn open_controller(
        &self,
        store: &Rc<ShardStore<GlommioFs>>,
    ) -> std::io::Result<Rc<NodeController>> {
        let now = (self.now_ms)();
        let (log_id, _) = store
            .open_log(metadata_log_key(), metadata_log_config(), now)
            .await
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        let dir = store.root().join(METADATA_DIR);
        let now_ms = Rc::clone(&self.now_ms);
        let log = ShardReplicaLog::open(Rc::clone(store), log_id, dir, Rc::new(move || now_ms())).await?;
        let election_ms =
            u64::from(self.config.cluster.quorum_election_timeout_ms).max(4 * RAFT_HEARTBEAT_MS);
        let raft_config = openraft::Config {
            cluster_name: self.config.cluster.cluster_id.to_string(),
            heartbeat_interval: RAFT_HEARTBEAT_MS,
            election_timeout_min: election_ms,
            election_timeout_max: election_ms * 2,
            // As the partition groups (`replication::ReplicationSettings::leader_lease_ms`): a
            // voter refuses other candidates for the shortest election timeout after it heard
            // the active controller, so the first voter whose timer runs out is elected.
            leader_lease: Some(election_ms),
            // Until the controller listener is bound (`run_controller`).
            enable_elect: false,
            // As the partition groups (`replication::ReplicationSettings`): a voter that cannot
            // win does not end the active controller's term.
            enable_pre_vote: Some(true),
            // A voter whose disk was wiped comes back with an empty log: the leader starts its
            // replication over (see `replication::ReplicationSettings`) instead of retrying the
            // position it had reached, which the voter answers with a conflict forever.
            allow_log_reversion: Some(true),
            ..Default::default()
        }
        .validate()
        .map_err(|e| std::io::Error::other(e.to_string()))?;
        let factory = self.network.factory(metadata_group());
        let c = Controller::start(broker_id(self.id), Arc::new(raft_config), factory, log).await?;
        Ok(Rc::new(c))
    }

    /// Binds the controller listener, retrying every second while its address is busy.
    async fn bind_controller_listener(&self) -> Option<glommio::net::TcpListener> {
        let Some(listener) = self.config.cluster.controller_listener.as_ref() else {
            tracing::error!("a controller without a controller listener");
            return None;
        };
        let host = if listener.bind.host.is_empty() {
            "0.0.0.0"
        } else {
            listener.bind.host.as_str()
        };
        let addr = format!("{}:{}", host, listener.bind.port);
        let socket = loop {
            match glommio::net::TcpListener::bind(addr.as_str()) {
                Ok(s) => break s,
                Err(e) => {
                    tracing::warn!(%addr, error = %e, "cannot bind the controller listener; retrying");
                    glommio::timer::sleep(Duration::from_secs(1)).await;
                }
            }
        };
        tracing::info!(%addr, listener = %listener.name, "controller listener bound");
        Some(socket)
    }

    /// Answers peers on the bound controller listener.
    async fn serve(self: Rc<Self>, socket: glommio::net::TcpListener) {
        let server = Rc::new(Server::<Rt, _>::new(
            MetadataGroup(Rc::clone(&self.controller)),
            ServerLimits::default(),
        ));
        let me = Rc::clone(&self);
        let handler = Rc::new(move |from: BrokerId, m: Message| {
            let me = Rc::clone(&me);
            let server = Rc::clone(&server);
            Box::pin(async move {
                match m {
                    Message::Control { kind, body } => {
                        let reply = match ControlRequest::decode(kind, &body) {
                            Ok(req) => me.handle(req).await,
                            Err(e) => ControlReply::refused(&AdminError::new(
                                ResponseError::InvalidRequest,
                                format!("control request from node {from}: {e}"),
                            )),
                        };
                        Message::ControlReply(Some(Bytes::from(reply.encode())))
                    }
                    other => server.handle(from, other).await,
                }
            }) as futures::future::LocalBoxFuture<'static, Message>
        });
        let e = tcp::serve(socket, broker_id(self.id), TcpConfig::default(), handler).await;
        tracing::error!(error = %e, "the controller listener stopped accepting");
    }

    /// Answers a control request as this node's controller.
    pub async fn handle(&self, req: ControlRequest) -> ControlReply {
        let Some(ctl) = self.controller() else {
            return ControlReply::NotController { leader: None };
        };
        handle_on(&ctl, (self.now_ms)(), req).await
    }

    async fn run_timers(self: Rc<Self>) {
        loop {
            glommio::timer::sleep(Duration::from_millis(FENCE_CHECK_INTERVAL_MS)).await;
            let Some(ctl) = self.controller() else { continue };
            let now = (self.now_ms)();
            let now_u = u64::try_from(now).unwrap_or(0);
            let config = ControllerConfig {
                session_timeout_ms: u64::from(self.config.cluster.broker_session_timeout_ms),
            };
            let fenced = ctl
                .decide(now, move |s, l| {
                    let records = fence_stale_brokers(s, l, &config, now_u);
                    let n = records.len();
                    Ok((records, n))
                })
                .await;
            if let Ok(n) = fenced {
                if n > 0 {
                    tracing::info!(records = n, "fenced brokers whose session expired");
                }
            }
        }
    }

    /// Registers, then heartbeats; re-registers when the epoch went stale.
    async fn run_broker(self: Rc<Self>, info: BrokerInfo) {
        let incarnation = IncarnationId(uuid::Uuid::new_v4());
        let interval =
            Duration::from_millis(u64::from(self.config.cluster.broker_heartbeat_interval_ms).max(10));
        if self.controller().is_none() && !self.config.cluster.roles.controller {
            let me = Rc::clone(&self);
            glommio::spawn_local(async move { me.run_fetcher().await }).detach();
        }
        while !self.stopping.get() {
            let req = ControlRequest::RegisterBroker(BrokerRegistrationRequest {
                broker: self.id,
                incarnation,
                endpoints: info.endpoints.clone(),
                rack: info.rack.clone(),
                shards: info.shards,
            });
            let epoch = match self.client.call(&req).await {
                Ok(ControlReply::Registered { epoch }) => epoch,
                other => {
                    tracing::warn!(answer = ?other, "broker registration failed; retrying");
                    glommio::timer::sleep(interval).await;
                    continue;
                }
            };
            tracing::info!(epoch = epoch.0, "registered with the controller quorum");
            self.epoch.set(Some(epoch));
            loop {
                // Until it is unfenced, a (re)started broker heartbeats often, as Kafka's does
                // while starting: the heartbeat that shows it caught up unfences it, and until
                // then it can lead nothing (a restarted replica's partition groups wait on it).
                let pause = if self.live_at(epoch) {
                    interval
                } else {
                    interval.min(Duration::from_millis(FENCED_HEARTBEAT_MS))
                };
                glommio::timer::sleep(pause).await;
                if self.stopping.get() {
                    return;
                }
                let hb = ControlRequest::Heartbeat(Heartbeat {
                    broker: self.id,
                    epoch,
                    metadata_offset: self.next_offset(),
                    want_fence: false,
                    want_shutdown: false,
                });
                match self.client.call(&hb).await {
                    Ok(ControlReply::Heartbeat(_)) => {}
                    Ok(ControlReply::Refused { code, message })
                        if code == ResponseError::StaleBrokerEpoch.code() =>
                    {
                        tracing::warn!(%message, "the broker registration went stale; registering again");
                        self.epoch.set(None);
                        break;
                    }
                    other => tracing::debug!(answer = ?other, "heartbeat not answered"),
                }
            }
        }
    }

    /// A broker-only node's metadata: fetched from the quorum.
    async fn run_fetcher(self: Rc<Self>) {
        loop {
            glommio::timer::sleep(Duration::from_millis(FETCH_INTERVAL_MS)).await;
            let from = self.fetched.borrow().next_offset();
            match self.client.call(&ControlRequest::FetchMetadata { from }).await {
                Ok(ControlReply::Records { base, records }) if base == from => {
                    if records.is_empty() {
                        continue;
                    }
                    let applied = self.fetched.borrow_mut().try_apply_batch(&records);
                    self.changed.notify_all();
                    if let Err(e) = applied {
                        // Records that break the state's invariants came over the network:
                        // the state (part-applied) is dropped and fetched afresh, which from
                        // offset 0 is a snapshot, validated whole.
                        tracing::error!(offset = from.0, error = %e, "fetched metadata records refused; fetching a snapshot");
                        metrics::counter!("strand_metadata_records_refused_total").increment(1);
                        *self.fetched.borrow_mut() = ClusterState::default();
                    }
                }
                Ok(ControlReply::Snapshot(bytes)) => match ClusterState::from_snapshot(&bytes) {
                    Ok(s) if s.next_offset() >= from => {
                        *self.fetched.borrow_mut() = s;
                        self.changed.notify_all();
                    }
                    Ok(_) => tracing::warn!("a metadata snapshot older than the state held"),
                    Err(e) => tracing::warn!(error = %e, "an undecodable metadata snapshot"),
                },
                other => tracing::debug!(answer = ?other, "metadata fetch not answered"),
            }
        }
    }

    /// Hands every newer committed state to `publish`.
    async fn run_publisher(self: Rc<Self>, publish: Rc<dyn Fn(&ClusterState)>) {
        let mut published: Option<MetadataOffset> = None;
        loop {
            let controller = self.controller();
            let changed = self.changed.wait();
            let applied = controller.as_ref().map(|c| c.applier().applied().wait());
            let next = self.next_offset();
            if published != Some(next) && next != MetadataOffset(0) {
                published = Some(next);
                publish(&self.state());
            }
            // Wait for the next change; states that arrive together are published once.
            match applied {
                Some(applied) => futures_lite::future::or(changed, applied).await,
                None => changed.await,
            }
            glommio::timer::sleep(Duration::from_millis(TICK_MS)).await;
        }
    }
}

/// Answers `req` with controller `ctl`.
async fn handle_on(ctl: &NodeController, now_ms: i64, req: ControlRequest) -> ControlReply {
    let now_u = u64::try_from(now_ms).unwrap_or(0);
    let answer = match req {
        ControlRequest::RegisterBroker(r) => ctl
            .decide(now_ms, move |s, l| register_broker(s, l, &r, now_u))
            .await
            .map(|epoch| ControlReply::Registered { epoch }),
        ControlRequest::Heartbeat(h) => {
            // Alive now, however long its decision waits.
            ctl.touch(h.broker, h.epoch, now_ms);
            ctl.decide(now_ms, move |s, l| heartbeat(s, l, &h, now_u))
                .await
                .map(ControlReply::Heartbeat)
        }
        ControlRequest::CreateTopic(t) => ctl
            .decide(now_ms, move |s, _| create_topic(s, &t).map(|r| (r, ())))
            .await
            .map(|()| ControlReply::Done),
        ControlRequest::DeleteTopic { name } => ctl
            .decide(now_ms, move |s, _| {
                let Some(t) = s.topic_by_name(&name) else {
                    return Err(AdminError::new(
                        ResponseError::UnknownTopicOrPartition,
                        format!("The topic '{name}' does not exist."),
                    ));
                };
                delete_topic(s, t.id).map(|r| (r, ()))
            })
            .await
            .map(|()| ControlReply::Done),
        ControlRequest::CreatePartitions {
            name,
            count,
            assignments,
        } => ctl
            .decide(now_ms, move |s, _| {
                create_partitions(s, &name, count, assignments.as_deref()).map(|r| (r, ()))
            })
            .await
            .map(|()| ControlReply::Done),
        ControlRequest::AlterConfigs { resource, entries } => ctl
            .decide(now_ms, move |s, _| {
                alter_configs(s, resource, entries).map(|r| (r, ()))
            })
            .await
            .map(|()| ControlReply::Done),
        ControlRequest::AlterPartition(a) => ctl
            .decide(now_ms, move |s, _| alter_partition(s, &a))
            .await
            .map(ControlReply::AlterPartition),
        ControlRequest::LeaderElected(e) => ctl
            .decide(now_ms, move |s, _| leader_elected(s, &e))
            .await
            .map(ControlReply::AlterPartition),
        ControlRequest::AllocateProducerIds { broker, broker_epoch } => ctl
            .decide(now_ms, move |s, _| allocate_producer_ids(s, broker, broker_epoch))
            .await
            .map(ControlReply::ProducerIds),
        ControlRequest::FetchMetadata { from } => return fetch_reply(ctl, from),
        ControlRequest::DescribeQuorum => ctl.describe(now_ms).map(ControlReply::Quorum),
    };
    match answer {
        Ok(reply) => reply,
        Err(ControllerError::NotController { leader }) => ControlReply::NotController {
            leader: leader.and_then(node_id),
        },
        Err(ControllerError::Refused(e)) => ControlReply::refused(&e),
        Err(ControllerError::Failed(message)) => ControlReply::Failed { message },
    }
}

/// The committed metadata from `from` on, as this controller has applied it.
fn fetch_reply(ctl: &NodeController, from: MetadataOffset) -> ControlReply {
    if let Some(mut records) = ctl.applier().records_from(from, MAX_FETCH_RECORDS) {
        // Bounded by bytes too: drop records from the end until the encoding fits.
        while !records.is_empty() && super::record::encode_batch(&records).len() > MAX_FETCH_BYTES {
            records.truncate(records.len() / 2);
        }
        return ControlReply::Records { base: from, records };
    }
    let snapshot = ctl.state().to_snapshot();
    if snapshot.len() > MAX_FETCH_BYTES {
        return ControlReply::Failed {
            message: format!(
                "the metadata snapshot ({} bytes) exceeds the fetch bound",
                snapshot.len()
            ),
        };
    }
    ControlReply::Snapshot(snapshot)
}

/// Calls the active controller: the leader last heard of, else the voters in turn (see the
/// module documentation).
pub struct ControlClient {
    voters: Vec<NodeId>,
    leader: Cell<Option<NodeId>>,
    next_voter: Cell<usize>,
    network: Rc<Network>,
    local: Rc<RefCell<Option<Rc<NodeController>>>>,
    local_id: NodeId,
    now_ms: Rc<dyn Fn() -> i64>,
}

impl ControlClient {
    fn target(&self) -> Option<NodeId> {
        if let Some(l) = self.leader.get() {
            return Some(l);
        }
        if self.voters.is_empty() {
            return None;
        }
        let i = self.next_voter.get() % self.voters.len();
        self.next_voter.set(i + 1);
        self.voters.get(i).copied()
    }

    /// Sends `req` to the active controller and returns its answer; `Err` after
    /// [`MAX_ATTEMPTS`] attempts that found no controller able to answer.
    pub async fn call(&self, req: &ControlRequest) -> Result<ControlReply, String> {
        let (kind, body) = req.encode();
        let body = Bytes::from(body);
        let mut backoff = Duration::from_millis(50);
        let mut last = String::from("no controller voters");
        for _ in 0..MAX_ATTEMPTS {
            let Some(target) = self.target() else { break };
            let local = if target == self.local_id {
                self.local.borrow().clone()
            } else {
                None
            };
            let reply = match local {
                Some(ctl) => {
                    // A decision waits for a commit: bounded as a remote call is.
                    let decided = handle_on(&ctl, (self.now_ms)(), req.clone());
                    match glommio::timer::timeout(CALL_TIMEOUT, async { Ok(decided.await) }).await {
                        Ok(reply) => Ok(reply),
                        Err(e) => Err(format!("node {target} (this node): {e}")),
                    }
                }
                None => {
                    let request = Message::Control {
                        kind,
                        body: body.clone(),
                    };
                    let call = self.network.connection().call(broker_id(target), request);
                    match glommio::timer::timeout(CALL_TIMEOUT, async { Ok(call.await) }).await {
                        Ok(Ok(Message::ControlReply(Some(b)))) => {
                            ControlReply::decode(&b).map_err(|e| format!("node {target}: {e}"))
                        }
                        Ok(Ok(other)) => Err(format!("node {target} answered {other:?}")),
                        Ok(Err(e)) => Err(format!("node {target}: {e}")),
                        Err(e) => Err(format!("node {target}: {e}")),
                    }
                }
            };
            match reply {
                Ok(ControlReply::NotController { leader }) => {
                    let redirect = leader.filter(|l| *l != target);
                    self.leader.set(redirect);
                    last = format!("node {target} is not the active controller");
                    if redirect.is_some() {
                        continue;
                    }
                }
                Ok(ControlReply::Failed { message }) => {
                    self.leader.set(None);
                    last = message;
                }
                Ok(reply) => {
                    self.leader.set(Some(target));
                    return Ok(reply);
                }
                Err(e) => {
                    self.leader.set(None);
                    last = e;
                }
            }
            glommio::timer::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(1));
        }
        tracing::warn!(request = kind, "no active controller answered: {last}");
        Err(last)
    }
}
