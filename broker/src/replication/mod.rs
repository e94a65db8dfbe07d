//! Partition replication: each partition replica this shard hosts is a Raft group
//! (`strand_raft::partition`) over the partition's log in the shard's store.
//!
//! - **Groups follow the cluster metadata.** On every applied [`ClusterState`]
//!   (`ShardHooks::cluster_changed`), the [`GroupManager`] starts a group for every replica the
//!   metadata places on this node and shard (`ClusterState::hosted_by`) whose log the core has
//!   open, and shuts down the groups of replicas it no longer places here. A group is the
//!   replica log over the partition's log (`ShardReplicaLog`, its Raft state in a side file in
//!   the log's directory), the replica store over it, and an openraft `Raft` whose network is
//!   the shard's [`NodeNetwork`]. Its handle is attached to the core's partition
//!   ([`Shard::attach_replica`]), which from then on proposes writes to it and caps clients'
//!   reads at its commit offset. At most [`ReplicationSettings::max_groups`] groups per shard.
//! - **Who initializes a group.** Membership is the partition's replica set. The first replica
//!   of the assignment (the preferred leader) calls openraft's `initialize` with all replicas,
//!   once, when its replica holds no Raft state; the others wait to be written to, and
//!   initialize only if their replica still holds no Raft state after
//!   [`FOLLOWER_INIT_WAIT_ELECTIONS`] election timeouts (the first replica died before the
//!   group formed). openraft refuses `initialize` on a node with any log or vote
//!   (`NotAllowed`), so a restart never initializes again. Every replica proposes the same
//!   first entry: the membership entry at index 0 of term 0, whose log id carries no node
//!   (`leader_id_std`), from the same replica set. Letting the first replica go first avoids
//!   split votes at creation. Once the metadata shows an elected leader (leader epoch above 0)
//!   no replica initializes: one without Raft state lost it (a wiped disk) and waits for the
//!   leader, whose replication to it starts over (`allow_log_reversion`). Until it has caught
//!   up, such a replica's vote is given on an empty log: a second fault in that window (the
//!   other holder of an entry lost) can elect a replica without it.
//! - **Commit offset.** As the replica store applies committed entries it tells the store's
//!   commit cap of the log the replica's high watermark (the Kafka offset after the last
//!   committed batch), before the writers are answered, which wakes waiting fetches.
//! - **Leaders.** A watcher task per group follows its leader and term. When this node wins an
//!   election it reports it ([`LeaderReports`]); the active controller records it as the
//!   partition's leader with the term as its leader epoch. A report is sent again while no
//!   controller answers, and whenever an applied state does not show a leadership this node
//!   holds. Until the record, every shard of the node knows the leader its replica saw elected
//!   ([`leaders`]), and Metadata answers with it.
//! - **ISR.** Every [`ISR_CHECK_INTERVAL_MS`] a leader compares its followers' progress with
//!   the registration's ISR: a follower is in sync while it reached, within
//!   `replica.lag.time.max.ms`, the log end the leader had at the previous check; a difference
//!   goes to the controller as AlterPartition. The ISR is what Metadata reports; commits need a
//!   Raft majority whatever it says.
//! - **Preferred leaders.** Every `leader.imbalance.check.interval.seconds` (unless
//!   `auto.leader.rebalance.enable` is off) a leader hands each group whose preferred replica
//!   (the first of its replicas) is active, in the ISR and holds the whole log to that replica,
//!   with a Raft leadership transfer (`GroupManager::balance_leaders`).
//! - **Timers.** Heartbeats every 100 ms (none to a follower that acknowledged a write sent
//!   within 200 ms), elections after 600–1,200 ms of silence, checked on a 50 ms tick; the
//!   followers refuse other candidates for a lease of 600 ms after the leader was last heard,
//!   so the first follower whose timer runs out is elected, and a lost leader is replaced some
//!   0.6–1.3 s later. Groups idle for
//!   [`ReplicationSettings`]'s `quiesce.idle_after_ms` stop their timers (`Quiescer`); peers'
//!   liveness is what the shard hears from them (any request, and a ping every [`PING_INTERVAL_MS`] to each peer
//!   shard it shares a group with). A quiesced group whose leader is lost (its node silent or
//!   restarted, or it stopped writing and heartbeating sooner after its last write than a
//!   leader quiesces) or unknown stays quiesced and is elected by the host: the first live
//!   replica in preference order campaigns at once (once its leader lease, `leader_lease_ms`,
//!   has run out: within it openraft would skip the campaign), the next one a window later, at most
//!   `quiesce.max_campaigns` in flight per shard (`Quiescer::campaigns`). An awake follower
//!   that has not heard its leader for the peer timeout does not quiesce (its election timer is
//!   electing); one with no leader quiesces after `quiesce.idle_after_ms` and is the host's to
//!   elect. A replica whose Raft knows no leader follows the leader the metadata names.
//! - **Transport** ([`net`]): heartbeats coalesced for up to [`TICK_MS`], one connection
//!   per peer shard, inbound connections recognised on the Kafka listeners.
//! - **Writes** ([`Handle::propose`]): `client_write`; acks=all is answered at commit, acks=1
//!   once the batch is durable in the leader's log (the replica store's flushed-append
//!   observer, matching the proposal by the identity of its bytes). A leader without a lease
//!   (new, or just woken) has its writes wait, within [`LEASE_WAIT`], for a round of
//!   heartbeats rather than refusing them.
//! - **Shutdown**: [`GroupManager::shut_down`] first hands the leadership of the groups the
//!   shard leads to the followers furthest along (bounded; a Raft leadership transfer, so the
//!   leader proposes nothing more and the target takes its last entry before it campaigns),
//!   then stops every group; a deleted topic's groups stop before the core removes their logs
//!   (`ShardHooks::metadata_preparing`).
//!
//! What the manager relies on: the core has a hosted replica's log open on the shard the
//! metadata places it on (`Shard::owner` follows the metadata once the cluster state is set)
//! by the time `cluster_changed` names it; a replica whose log is not open yet is retried once
//! the core has opened new partitions (`ShardHooks::metadata_committed`) and at the next state. Membership is fixed at creation: a changed replica set (reassignment) is
//! not applied to a running group.

pub(crate) mod leaders;
pub(crate) mod net;

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::rc::{Rc, Weak};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::future::LocalBoxFuture;
use futures::{FutureExt, StreamExt};
use glommio::net::TcpStream;
use openraft::async_runtime::WatchReceiver;
use openraft::errors::{ClientWriteError, ForwardReason, InitializeError, RaftError};
use openraft::Raft;
use strand_protocol::types::{LeaderEpoch, NodeId, PartitionId, ShardId, TopicId};
use strand_raft::partition::quiesce::{self, QuiesceConfig, Quiescer};
use strand_raft::partition::shard_log::ShardReplicaLog;
use strand_raft::partition::{
    Applied, BrokerId, EntryData, KafkaBatch, PartitionRaft, ReplicaLog, ReplicaStore, SideLogSpec,
    SideRecord,
};
use strand_raft::rt::GlommioRuntime;
use strand_raft::transport::codec::{GroupId, Message};
use strand_raft::transport::network::{GroupRafts, NetworkConfig, NodeNetwork, Server, ServerLimits};
use strand_raft::transport::tcp::{serve_stream, TcpConfig};
use strand_storage::fs_glommio::GlommioFs;
use strand_storage::{LogId, LogKey, ShardStore};

use self::leaders::{LeaderView, SeenLeader};
use self::net::{Directory, PeerShards};
use crate::cluster::{BrokerEpoch, ClusterState, IncarnationId};
use crate::internal_topics::{side_log_config, side_log_dir_name};
use crate::metadata::MetadataDelta;
use crate::shard::replica::{Acks, Leadership, ProposeError, ReplicaHandle, SideRecordsRead};
use crate::shard::service::{NodeLink, Service, ShardHooks};
use crate::shard::Shard;

type C = PartitionRaft<GlommioRuntime>;
type Store = ReplicaStore<GlommioRuntime, ShardReplicaLog<GlommioFs>>;
type GroupRaft = Raft<C, Store>;

/// How long a heartbeat waits for others to leave with it in one frame per peer.
pub(crate) const TICK_MS: u64 = 5;
/// How often the shard's replication loop runs its periodic duties (quiescing, liveness, ISR,
/// balance) when no heartbeat wakes it sooner.
const IDLE_TICK_MS: u64 = 100;
/// How often each peer shard sharing a group is pinged (liveness for quiesced groups).
pub(crate) const PING_INTERVAL_MS: u64 = 250;
/// How long a proposal waits for its commit before its outcome is reported unknown.
const PROPOSE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a controlled shutdown waits for its groups' leadership to move.
const TRANSFER_WAIT: Duration = Duration::from_secs(2);
/// acks=1 writes a group waits for at once; more are answered at commit.
const MAX_LOCAL_ACKS: usize = 4_096;
/// How long a new or just-woken leader's writes wait for its lease (a round of heartbeats).
const LEASE_WAIT: Duration = Duration::from_secs(2);
/// How often a leader compares its followers' progress with the ISR.
const ISR_CHECK_INTERVAL_MS: u64 = 1_000;
/// Groups a shard starts or stops at once (a start reads its replica's files, a stop waits for
/// the group's Raft tasks to end).
const GROUPS_AT_ONCE: usize = 32;
/// Leadership transfers one balancing round of a shard starts at most.
const MAX_BALANCE_TRANSFERS: usize = 64;
/// How often an election report that found no controller is sent again, and how many times.
const REPORT_RETRY: Duration = Duration::from_millis(250);
const REPORT_ATTEMPTS: usize = 120;
/// Election timeouts a replica other than the first waits to be written to before it forms
/// its group itself (see `GroupManager::start_group`).
const FOLLOWER_INIT_WAIT_ELECTIONS: u64 = 2;

/// How this shard's elections reach the active controller (the cluster link implements it;
/// the controller records the winner as the partition's leader, `cluster::control::leader_elected`).
pub(crate) trait LeaderReports {
    /// This node won the election of `term` (its leader epoch) of `partition` of `topic`.
    fn leader_elected(
        &self,
        topic: TopicId,
        partition: PartitionId,
        term: i32,
    ) -> LocalBoxFuture<'static, Report>;
    /// This node, leading `partition` of `topic` in `term`, asks for the ISR `isr` (members
    /// with the broker epochs it saw) over the registration at `partition_epoch` (AlterPartition).
    fn alter_isr(
        &self,
        topic: TopicId,
        partition: PartitionId,
        term: i32,
        partition_epoch: i32,
        isr: Vec<(NodeId, BrokerEpoch)>,
    ) -> LocalBoxFuture<'static, Report>;
}

/// What became of an election report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Report {
    /// Recorded: the partition's registration is at this partition epoch.
    Recorded { partition_epoch: i32 },
    /// Refused by the controller (an election overtook it, or this broker is fenced): sent
    /// again at the next applied state that still does not show the leadership.
    Refused(String),
    /// No controller answered: sent again.
    Unreachable(String),
}

/// What the manager needs of the shard that hosts it (the core; a test's stand-in).
pub(crate) trait Host {
    /// The open log of a replica this shard hosts, and its directory; `None` if not open.
    fn open_log(
        &self,
        state: &ClusterState,
        topic: TopicId,
        partition: PartitionId,
    ) -> Option<(LogId, PathBuf)>;
    /// Attaches (or detaches, with `None`) a replica's handle to the partition.
    fn attach(
        &self,
        state: &ClusterState,
        topic: TopicId,
        partition: PartitionId,
        handle: Option<Rc<dyn ReplicaHandle>>,
    );
    /// Tells the node's other shards of leaderships seen here that the cluster state does not
    /// show yet ([`leaders`]).
    fn tell_shards(&self, seen: Vec<SeenLeader>);
    /// Answers another node's request of `kind` for the subsystems above (`Message::Control`
    /// on a node connection); `None`: nothing here answers it.
    fn serve_node(&self, _kind: u16, _body: Bytes) -> LocalBoxFuture<'static, Option<Bytes>> {
        async { None }.boxed_local()
    }
}

/// Settings of a shard's replication.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReplicationSettings {
    pub(crate) max_groups: usize,
    pub(crate) heartbeat_interval_ms: u64,
    /// How often a group's Raft checks its timers. Every check is a turn of the group's Raft
    /// loop, and an awake group's ticks were most of what 1,000 of them cost a node: a longer
    /// tick makes heartbeats (sent at the first tick past their interval) and election
    /// timeouts coarser by at most this much. At most `heartbeat_interval_ms`.
    pub(crate) tick_interval_ms: u64,
    /// A leader sends no heartbeat to a follower that acknowledged a write sent within this
    /// long: under writes the appends prove what heartbeats would. `heartbeat_interval_ms +
    /// heartbeat_min_interval_ms + tick_interval_ms` must stay below `election_timeout_min_ms`.
    pub(crate) heartbeat_min_interval_ms: u64,
    pub(crate) election_timeout_min_ms: u64,
    pub(crate) election_timeout_max_ms: u64,
    /// How long a follower that heard its leader refuses other candidates (openraft's leader
    /// lease), which is also how long a lost leader keeps its followers from electing another.
    /// The shortest election timeout: a follower whose timer runs out first is granted its
    /// election by the others, whose leases have run out too, rather than refused and made to
    /// wait another timeout. Longer than the longest gap between heartbeats
    /// (`heartbeat_interval_ms + heartbeat_min_interval_ms + tick_interval_ms`).
    pub(crate) leader_lease_ms: u64,
    pub(crate) quiesce: QuiesceConfig,
    pub(crate) tcp: TcpConfig,
    /// A follower that has not reached the leader's log end for this long leaves the ISR
    /// (`replica.lag.time.max.ms`).
    pub(crate) replica_lag_time_max_ms: u64,
    /// How often a leader hands its partitions back to their preferred replicas; `None`: never
    /// (`auto.leader.rebalance.enable`, `leader.imbalance.check.interval.seconds`).
    pub(crate) leader_balance_interval_ms: Option<u64>,
}

impl Default for ReplicationSettings {
    fn default() -> Self {
        let election_timeout_max_ms = 1_200;
        let leader_lease_ms = 600;
        ReplicationSettings {
            max_groups: 20_000,
            heartbeat_interval_ms: 100,
            tick_interval_ms: 50,
            heartbeat_min_interval_ms: 200,
            election_timeout_min_ms: 600,
            election_timeout_max_ms,
            leader_lease_ms,
            quiesce: QuiesceConfig {
                idle_after_ms: 2_000,
                peer_timeout_ms: 1_000,
                // The longest election timeout: a campaign that has not produced a leader by
                // then has failed (its candidate's log was behind, or its votes were lost).
                campaign_window_ms: election_timeout_max_ms,
                leader_lease_ms,
                // Per shard. An election is a few messages and a vote write on each replica,
                // and a decided campaign frees its place at the next quiesce tick (100 ms):
                // enough to keep a small machine busy electing, few enough that a campaign is
                // decided within its window; many more, and on two cores they time out and
                // overtake each other again.
                max_campaigns: 128,
            },
            tcp: TcpConfig::default(),
            replica_lag_time_max_ms: 30_000,
            leader_balance_interval_ms: Some(300_000),
        }
    }
}

impl ReplicationSettings {
    fn raft_config(&self) -> Arc<openraft::Config> {
        let config = openraft::Config {
            cluster_name: "strand-partition".into(),
            heartbeat_interval: self.heartbeat_interval_ms,
            tick_interval: Some(self.tick_interval_ms),
            heartbeat_min_interval: Some(self.heartbeat_min_interval_ms),
            election_timeout_min: self.election_timeout_min_ms,
            election_timeout_max: self.election_timeout_max_ms,
            leader_lease: Some(self.leader_lease_ms),
            // A replica that restarts, or stops hearing the leader for a moment, asks before it
            // campaigns: a campaign the others would refuse (its log behind, the leader alive)
            // would still end the leader's term and leave the partition leaderless for an
            // election timeout or more.
            enable_pre_vote: Some(true),
            // A replica whose disk was wiped rejoins with an empty log. openraft's leader, which
            // had it matched far ahead, would otherwise send it the same position again and
            // again (a conflict each time, thousands a second) and never catch it up; allowed,
            // it starts that follower's replication over from its log start (or a snapshot).
            allow_log_reversion: Some(true),
            // openraft keeps a ring of recent log-stage timings per group for its runtime
            // statistics, which Strand does not read: 1,024 entries per stage by default, about
            // 150 KiB per group, a gigabyte on a node with thousands of replicas.
            log_stage_capacity: Some(1),
            // A partition group's membership is fixed at creation, so no leader is ever removed
            // from it: openraft's watcher for that case would be one idle task per group.
            removed_leader_step_down: openraft::StepDownPolicy::Never,
            ..Default::default()
        };
        #[allow(clippy::expect_used)]
        Arc::new(config.validate().expect("the replication Raft config is valid"))
    }
}

/// Forms a group whose replica holds no Raft state yet: openraft's `initialize` with the
/// partition's replicas as voters. A replica already written to (or voted by) refuses it,
/// which is the usual outcome for all but the first replica.
async fn initialize_group(group: &Group, members: BTreeSet<BrokerId>) {
    match group.raft.is_initialized().await {
        Ok(false) => match group.raft.initialize(members).await {
            Ok(()) => tracing::debug!(group = %group.id, "formed the partition group"),
            Err(RaftError::APIError(InitializeError::NotAllowed(_))) => {}
            Err(e) => tracing::warn!(group = %group.id, error = %e, "initializing a partition group"),
        },
        Ok(true) => {}
        Err(e) => tracing::warn!(group = %group.id, error = %e, "a partition group stopped"),
    }
}

/// One hosted replica's group.
struct Group {
    id: GroupId,
    local: BrokerId,
    /// The shard's manager, whose quiescer knows which peers it hears
    /// ([`ReplicaHandle::hears_a_majority`]).
    manager: Weak<GroupManager>,
    raft: GroupRaft,
    replica: Store,
    /// Set when the group is shut down: its watcher ends.
    stopped: Cell<bool>,
    /// Writes since the quiescer last looked (it wakes the group).
    active: Cell<bool>,
    /// acks=1 writes waiting for their batch to be durable here ([`LocalAck`]).
    local_acks: RefCell<HashMap<(usize, usize), futures::channel::oneshot::Sender<i64>>>,
    /// Proposal order (see [`commit`]): the next proposal's ticket, the latest ticket handed
    /// to Raft, the tickets below which a refused proposal is not sent again, and the proposal
    /// waiting for the leader's lease.
    tickets: Cell<u64>,
    last_submitted: Cell<u64>,
    barrier: Cell<u64>,
    lease_waiter: Cell<Option<u64>>,
    /// An election report is on its way.
    reporting: Cell<bool>,
    /// The term last reported and the partition epoch the controller answered (or saw, when it
    /// refused): not reported again until the registration moves past it.
    reported: Cell<Option<(i32, i32)>>,
    /// While leading: when each follower last reached the leader's log end as it was at the
    /// previous ISR check ([`GroupManager::check_isr`]), and that log end.
    caught_up_ms: RefCell<BTreeMap<BrokerId, u64>>,
    isr_mark: Cell<Option<u64>>,
    /// An ISR change is on its way, or was refused at this partition epoch.
    isr_reporting: Cell<bool>,
    isr_refused_at: Cell<Option<i32>>,
    /// The leader the metadata named when the group started here, another node: the quiescer
    /// takes it for the leader until Raft knows one or the group wakes (see
    /// `strand_raft::partition::quiesce`).
    believed_leader: Cell<Option<BrokerId>>,
    /// The leader as the group's Raft last reported it (kept by its watcher, so that the
    /// quiescer's tick over every group reads a cell rather than the Raft's metrics).
    known_leader: Cell<Option<BrokerId>>,
}

impl Group {
    fn leadership(&self) -> Leadership {
        let m = self.raft.metrics();
        let m = m.borrow_watched();
        let leader = m.current_leader.and_then(BrokerId::as_node_id);
        Leadership {
            leader,
            epoch: i32::try_from(m.current_term).unwrap_or(i32::MAX),
            is_local: m.current_leader == Some(self.local),
        }
    }
}

/// How long a leader waits for a majority to confirm its leadership
/// ([`ReplicaHandle::confirm_leadership`]): the longest election timeout, after which a
/// silent majority has most likely elected another.
const CONFIRM_TIMEOUT: Duration = Duration::from_millis(1_200);

/// The handle the core holds.
struct Handle(Rc<Group>);

impl ReplicaHandle for Handle {
    fn leadership(&self) -> Leadership {
        self.0.leadership()
    }

    fn propose(&self, batch: Bytes, acks: Acks) -> LocalBoxFuture<'static, Result<i64, ProposeError>> {
        let group = Rc::clone(&self.0);
        group.active.set(true);
        // The ticket is taken now, in the order the core decides its proposals.
        let ticket = group.tickets.get();
        group.tickets.set(ticket + 1);
        async move {
            let local = match acks {
                Acks::Leader => LocalAck::register(&group, &batch),
                Acks::All => None,
            };
            let committed = async {
                match commit(Rc::clone(&group), KafkaBatch(batch).into(), ticket).await? {
                    Applied::Batch { base_offset } => Ok(base_offset.0),
                    other => Err(ProposeError::Unknown(format!("a batch answered as {other:?}"))),
                }
            };
            let Some(mut local) = local else {
                return committed.await;
            };
            futures::pin_mut!(committed);
            match futures::future::select(committed, &mut local.rx).await {
                futures::future::Either::Left((result, _)) => result,
                futures::future::Either::Right((Ok(base_offset), _)) => Ok(base_offset),
                // The group dropped the waiter (stopped): the commit's outcome decides.
                futures::future::Either::Right((Err(_), committed)) => committed.await,
            }
        }
        .boxed_local()
    }

    fn propose_side(
        &self,
        keep_from: u64,
        data: Bytes,
    ) -> LocalBoxFuture<'static, Result<u64, ProposeError>> {
        let group = Rc::clone(&self.0);
        group.active.set(true);
        let ticket = group.tickets.get();
        group.tickets.set(ticket + 1);
        async move {
            match commit(Rc::clone(&group), SideRecord { keep_from, data }.into(), ticket).await? {
                Applied::Side { index } => Ok(index),
                other => Err(ProposeError::Unknown(format!(
                    "a side record answered as {other:?}"
                ))),
            }
        }
        .boxed_local()
    }

    fn side_records(&self) -> SideRecordsRead {
        let log = self.0.replica.with_log(|l| l.clone());
        async move {
            log.side_records(0, u64::MAX)
                .await
                .map(|rs| rs.into_iter().map(|r| (r.index, r.record.data)).collect())
                .map_err(|e| e.to_string())
        }
        .boxed_local()
    }

    fn confirm_leadership(&self) -> LocalBoxFuture<'static, bool> {
        let raft = self.0.raft.clone();
        async move {
            let round = raft.get_read_linearizer(openraft::ReadPolicy::ReadIndex);
            let timer = glommio::timer::sleep(CONFIRM_TIMEOUT);
            futures::pin_mut!(round);
            futures::pin_mut!(timer);
            match futures::future::select(round, timer).await {
                futures::future::Either::Left((answer, _)) => answer.is_ok(),
                futures::future::Either::Right(_) => false,
            }
        }
        .boxed_local()
    }

    fn hears_a_majority(&self) -> bool {
        let group = &self.0;
        let Some(manager) = group.manager.upgrade() else {
            return false;
        };
        let now_ms = manager.now_ms();
        let q = manager.quiescer.borrow();
        let m = group.raft.metrics();
        let m = m.borrow_watched();
        // The node's peers (pings every `PING_INTERVAL_MS`), or, for a leader elected before
        // its node has heard its peers' pings, a majority acknowledging its own appends.
        q.hears_majority(group.local, m.membership_config.membership().voter_ids(), now_ms)
            || m.last_quorum_acked
                .as_ref()
                .is_some_and(|at| at.elapsed() <= Duration::from_millis(q.peer_timeout_ms()))
    }
}

/// An acks=1 write's wait for its batch to be durable in the leader's log: the group's
/// flushed-append observer finds it by the identity of its bytes (the very `Bytes` proposed).
struct LocalAck {
    group: Rc<Group>,
    key: (usize, usize),
    rx: futures::channel::oneshot::Receiver<i64>,
}

impl LocalAck {
    /// `None` when the group has too many acks=1 writes waiting (the write is answered at
    /// commit instead).
    fn register(group: &Rc<Group>, batch: &Bytes) -> Option<LocalAck> {
        let key = (batch.as_ptr() as usize, batch.len());
        let mut waiting = group.local_acks.borrow_mut();
        if waiting.len() >= MAX_LOCAL_ACKS || waiting.contains_key(&key) {
            return None;
        }
        let (tx, rx) = futures::channel::oneshot::channel();
        waiting.insert(key, tx);
        Some(LocalAck {
            group: Rc::clone(group),
            key,
            rx,
        })
    }
}

impl Drop for LocalAck {
    fn drop(&mut self) {
        self.group.local_acks.borrow_mut().remove(&self.key);
    }
}

/// Proposes `batch` and waits for its commit (bounded), waiting for a new leader's lease.
///
/// Proposals reach Raft in the order the core decided them (it checked each idempotent
/// producer's sequence against the ones before): a proposal Raft refuses before appending it
/// (no lease yet, not the leader) is sent again after a round of heartbeats only while no later
/// proposal has been handed to Raft; otherwise it, and every proposal issued before the refusal
/// that Raft has not taken either, is answered as not written (retriable, not persisted), so
/// that no batch is appended behind a later one of the same producer.
async fn commit(group: Rc<Group>, data: EntryData, ticket: u64) -> Result<Applied, ProposeError> {
    let started = std::time::Instant::now();
    // `submitted`: Raft refused this proposal after it was handed over, so every one issued
    // before now must not be handed over again. A proposal refused before it was handed over
    // (behind a lease waiter) leaves the waiter its retry.
    let refuse = |group: &Group, f: Option<openraft::errors::ForwardToLeader<C>>, submitted: bool| {
        if submitted {
            group.barrier.set(group.tickets.get());
        }
        let mut l = group.leadership();
        if let Some(id) = f.and_then(|f| f.leader_id) {
            l.leader = id.as_node_id();
            l.is_local = id == group.local;
        }
        if l.is_local {
            // Leading but not writable (lease, transfer): the client retries.
            l.is_local = false;
            l.leader = None;
        }
        ProposeError::NotLeader(l)
    };
    loop {
        if ticket < group.barrier.get() || group.lease_waiter.get().is_some_and(|w| w < ticket) {
            return Err(refuse(&group, None, false));
        }
        group.last_submitted.set(group.last_submitted.get().max(ticket));
        let write = group.raft.client_write(data.clone());
        let timer = glommio::timer::sleep(PROPOSE_TIMEOUT);
        futures::pin_mut!(write);
        futures::pin_mut!(timer);
        let result = match futures::future::select(write, timer).await {
            futures::future::Either::Left((r, _)) => r,
            futures::future::Either::Right(_) => {
                return Err(ProposeError::Unknown(
                    "the write was not committed in time".into(),
                ))
            }
        };
        match result {
            Ok(resp) => return Ok(resp.data),
            // A new or just-woken leader: its lease comes with the next acknowledged round of
            // heartbeats. Ask for one and wait, within a bound, unless a later proposal went
            // to Raft meanwhile.
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f)))
                if f.reason == ForwardReason::LeaseExpired
                    && started.elapsed() < LEASE_WAIT
                    && group.last_submitted.get() == ticket
                    && ticket >= group.barrier.get() =>
            {
                group.lease_waiter.set(Some(ticket));
                let _ = group.raft.trigger().heartbeat().await;
                glommio::timer::sleep(Duration::from_millis(20)).await;
                if group.lease_waiter.get() == Some(ticket) {
                    group.lease_waiter.set(None);
                }
            }
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
                return Err(refuse(&group, Some(f), true))
            }
            Err(e) => return Err(ProposeError::Unknown(e.to_string())),
        }
    }
}

/// The groups of a shard, as the transport server finds them.
#[derive(Clone, Default)]
struct Groups(Rc<RefCell<BTreeMap<GroupId, Rc<Group>>>>);

impl GroupRafts<GlommioRuntime> for Groups {
    type StateMachine = Store;

    fn raft(&self, group: GroupId) -> Option<GroupRaft> {
        self.0.borrow().get(&group).map(|g| g.raft.clone())
    }
}

/// A shard's partition groups (see the module documentation).
pub(crate) struct GroupManager {
    local: BrokerId,
    node: NodeId,
    shard: ShardId,
    store: Rc<ShardStore<GlommioFs>>,
    host: Rc<dyn Host>,
    directory: Rc<Directory>,
    network: Rc<NodeNetwork<GlommioRuntime, PeerShards>>,
    server: Rc<Server<GlommioRuntime, Groups>>,
    groups: Groups,
    settings: ReplicationSettings,
    config: Arc<openraft::Config>,
    quiescer: RefCell<Quiescer<GroupId>>,
    /// The groups that sent entries to a follower since the last quiescing tick: a leader
    /// replicating (a catch-up included) is active, so that it heartbeats for the idle time
    /// after the last write any follower received, which is what a follower counts on to tell
    /// a leader that quiesced from one that is gone (`Quiescer::tick`).
    replicated: Rc<RefCell<BTreeSet<GroupId>>>,
    /// Each peer's incarnation as the metadata last showed it: a new one is a restart, which
    /// the quiescer must hear of ([`Quiescer::peer_restarted`]).
    incarnations: RefCell<BTreeMap<NodeId, IncarnationId>>,
    reports: RefCell<Option<Rc<dyn LeaderReports>>>,
    /// The leaderships seen on this node that the cluster state does not show yet.
    leaders: LeaderView,
    /// Those seen on this shard and not yet told to the others (sent once per turn).
    seen_untold: RefCell<Vec<SeenLeader>>,
    /// One reconciliation at a time; the newest state waits in `next`.
    reconciling: Cell<bool>,
    next: RefCell<Option<Rc<ClusterState>>>,
    epoch: std::time::Instant,
    closed: Cell<bool>,
}

impl GroupManager {
    /// The manager of shard `shard` of node `node`, whose peers are reached on the listener
    /// `inter_broker_listener`. Call [`GroupManager::run`] to start its timers.
    pub(crate) fn new(
        node: NodeId,
        shard: ShardId,
        store: Rc<ShardStore<GlommioFs>>,
        host: Rc<dyn Host>,
        inter_broker_listener: String,
        settings: ReplicationSettings,
    ) -> Rc<Self> {
        let local = BrokerId::from_node_id(node).unwrap_or_default();
        let directory = Rc::new(Directory::new(inter_broker_listener));
        let replicated = Rc::new(RefCell::new(BTreeSet::new()));
        let conns = PeerShards::new(node, Rc::clone(&directory), settings.tcp, Rc::clone(&replicated));
        let network = NodeNetwork::new(local, conns, NetworkConfig::default());
        let groups = Groups::default();
        let server = Rc::new(Server::new(groups.clone(), ServerLimits::default()));
        Rc::new(GroupManager {
            local,
            node,
            shard,
            store,
            host,
            directory,
            network,
            server,
            groups,
            config: settings.raft_config(),
            settings,
            quiescer: RefCell::new(Quiescer::new(settings.quiesce)),
            replicated,
            incarnations: RefCell::new(BTreeMap::new()),
            reports: RefCell::new(None),
            leaders: LeaderView::default(),
            seen_untold: RefCell::new(Vec::new()),
            reconciling: Cell::new(false),
            next: RefCell::new(None),
            epoch: std::time::Instant::now(),
            closed: Cell::new(false),
        })
    }

    /// Where leadership changes go from now on.
    pub(crate) fn set_reports(&self, reports: Rc<dyn LeaderReports>) {
        *self.reports.borrow_mut() = Some(reports);
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Starts the shard's transport tick, quiescing and pings; they end with [`Self::close`].
    pub(crate) fn run(self: &Rc<Self>) {
        let me = Rc::downgrade(self);
        glommio::spawn_local(async move {
            let mut last_quiesce = 0u64;
            let mut last_ping = 0u64;
            let mut last_isr = 0u64;
            let mut last_balance = 0u64;
            loop {
                // Heartbeats wait up to a tick in the outbox, so that they leave coalesced; with
                // none queued (every group quiesced) the loop wakes only for its periodic duties.
                let network = match me.upgrade() {
                    Some(m) => Rc::clone(&m.network),
                    None => return,
                };
                futures_lite::future::or(
                    async move {
                        network.heartbeats_queued().await;
                        glommio::timer::sleep(Duration::from_millis(TICK_MS)).await;
                    },
                    glommio::timer::sleep(Duration::from_millis(IDLE_TICK_MS)),
                )
                .await;
                let Some(m) = me.upgrade() else { return };
                if m.closed.get() {
                    return;
                }
                m.network.tick();
                let now = m.now_ms();
                if now.saturating_sub(last_quiesce) >= IDLE_TICK_MS {
                    last_quiesce = now;
                    m.quiesce_tick(now).await;
                }
                if now.saturating_sub(last_isr) >= ISR_CHECK_INTERVAL_MS {
                    last_isr = now;
                    m.check_isr(now);
                }
                if let Some(every) = m.settings.leader_balance_interval_ms {
                    if now.saturating_sub(last_balance) >= every {
                        last_balance = now;
                        m.balance_leaders();
                    }
                }
                if now.saturating_sub(last_ping) >= PING_INTERVAL_MS {
                    last_ping = now;
                    m.ping_peers();
                    let dir = Rc::clone(&m.directory);
                    glommio::spawn_local(async move { dir.refresh().await }).detach();
                }
            }
        })
        .detach();
    }

    async fn quiesce_tick(&self, now: u64) {
        let groups: Vec<Rc<Group>> = self.groups.0.borrow().values().cloned().collect();
        let mut actions = Vec::new();
        let elect;
        {
            let mut q = self.quiescer.borrow_mut();
            let replicated = std::mem::take(&mut *self.replicated.borrow_mut());
            for g in &groups {
                if g.active.replace(false) || replicated.contains(&g.id) {
                    if let Some(a) = q.activity(g.id, now) {
                        actions.push((g.id, a));
                    }
                }
            }
            let leaders: BTreeMap<GroupId, Option<BrokerId>> = groups
                .iter()
                .map(|g| (g.id, g.known_leader.get().or(g.believed_leader.get())))
                .collect();
            actions.extend(q.tick(now, self.local, |id| leaders.get(&id).copied().flatten()));
            // Groups without a leader elect when the quiescer says this node's turn has come
            // (the first live replica in preference order at once, the next ones later, a
            // bounded number at a time), not by their own election timers.
            let state = self.directory.state.borrow().clone();
            elect = q.campaigns(now, self.local, |id| {
                state
                    .as_ref()
                    .and_then(|s| s.partition(id.topic, id.partition))
                    .map(|p| p.replica_brokers().filter_map(BrokerId::from_node_id).collect())
                    .unwrap_or_default()
            });
            let shard = [("shard", self.shard.0.to_string())];
            let led = leaders.values().filter(|l| **l == Some(self.local)).count();
            let leaderless = leaders.values().filter(|l| l.is_none()).count();
            metrics::gauge!("strand_replication_groups", &shard).set(groups.len() as f64);
            metrics::gauge!("strand_replication_groups_quiesced", &shard).set(q.quiesced_count() as f64);
            metrics::gauge!("strand_replication_groups_led", &shard).set(led as f64);
            metrics::gauge!("strand_replication_groups_leaderless", &shard).set(leaderless as f64);
            metrics::gauge!("strand_replication_leaders_unrecorded", &shard).set(self.leaders.len() as f64);
            metrics::gauge!("strand_replication_campaigns_in_flight", &shard)
                .set(q.campaigns_in_flight(now) as f64);
            let lost = elect
                .iter()
                .filter(|id| leaders.get(id).copied().flatten().is_some())
                .count();
            metrics::counter!("strand_replication_campaigns_total", "shard" => self.shard.0.to_string(), "leader" => "lost")
                .increment(lost as u64);
            metrics::counter!("strand_replication_campaigns_total", "shard" => self.shard.0.to_string(), "leader" => "unknown")
                .increment((elect.len() - lost) as u64);
        }
        for (id, action) in actions {
            let group = self.groups.0.borrow().get(&id).cloned();
            if let Some(g) = group {
                if action == quiesce::Action::Wake {
                    g.believed_leader.set(None);
                }
                quiesce::apply(&g.raft, action).await;
            }
        }
        if !elect.is_empty() {
            tracing::debug!(groups = elect.len(), "campaigning for groups without a leader");
        }
        for id in elect {
            let group = self.groups.0.borrow().get(&id).cloned();
            if let Some(g) = group {
                // The leader it believed in, if any, did not lead when this node's turn came.
                g.believed_leader.set(None);
                let _ = g.raft.trigger().elect(true).await;
            }
        }
    }

    /// A hello to every peer shard this shard shares a group with; an answer counts as hearing
    /// from the peer.
    fn ping_peers(self: &Rc<Self>) {
        let Some(state) = self.directory.state.borrow().clone() else {
            return;
        };
        let mut targets = BTreeSet::new();
        for id in self.groups.0.borrow().keys() {
            if let Some(p) = state.partition(id.topic, id.partition) {
                for r in &p.replicas {
                    if r.broker != self.node {
                        targets.insert((r.broker, r.shard.0));
                    }
                }
            }
        }
        for (node, shard) in targets {
            let Some(peer) = BrokerId::from_node_id(node) else {
                continue;
            };
            let me = Rc::clone(self);
            glommio::spawn_local(async move {
                let hello = Message::Hello {
                    node: me.local,
                    shard,
                };
                let conns = me.network.connection();
                if let Ok(Message::Hello { .. }) = conns.call_shard(peer, shard, hello).await {
                    me.quiescer.borrow_mut().peer_heard(peer, me.now_ms());
                }
            })
            .detach();
        }
    }

    /// Serves a peer's connection (its hello is at the front of `received`).
    pub(crate) async fn serve_peer(self: &Rc<Self>, stream: TcpStream, received: BytesMut) {
        let me = Rc::downgrade(self);
        let handler = Rc::new(move |from: BrokerId, request: Message| {
            let me: Weak<GroupManager> = me.clone();
            async move {
                // A closed manager answers nothing useful: its peers must not take it for alive.
                let Some(m) = me.upgrade().filter(|m| !m.closed.get()) else {
                    return Message::HeartbeatReplies(Vec::new());
                };
                {
                    let now = m.now_ms();
                    let mut q = m.quiescer.borrow_mut();
                    q.peer_heard(from, now);
                    match &request {
                        Message::Append { group, req } if !req.entries.is_empty() => {
                            q.leader_wrote(*group, now)
                        }
                        Message::Append { group, .. } => q.leader_heard(*group, now),
                        Message::Heartbeats(beats) => {
                            for b in beats {
                                q.leader_heard(b.group, now);
                            }
                        }
                        _ => {}
                    }
                }
                if let Message::Control { kind, body } = request {
                    return Message::ControlReply(m.host.serve_node(kind, body).await);
                }
                m.server.handle(from, request).await
            }
        });
        serve_stream(stream, received, self.local, self.settings.tcp, handler).await;
    }

    /// The groups whose Raft leader is this node.
    fn led_groups(&self) -> Vec<Rc<Group>> {
        self.groups
            .0
            .borrow()
            .values()
            .filter(|g| g.leadership().is_local)
            .cloned()
            .collect()
    }

    /// The groups this shard runs.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn group_count(&self) -> usize {
        self.groups.0.borrow().len()
    }

    /// Takes a newer cluster state: starts and stops groups to match it (in the background;
    /// states arriving meanwhile are taken in turn, the newest last).
    pub(crate) fn cluster_changed(self: &Rc<Self>, state: &Rc<ClusterState>) {
        self.note_restarts(state);
        self.leaders.state_changed(state);
        // At once, not after the reconciliation: a restarting node is busy starting its groups
        // for seconds, and those it started under its own stale metadata would campaign.
        self.follow_named_leaders(state);
        *self.directory.state.borrow_mut() = Some(Rc::clone(state));
        *self.next.borrow_mut() = Some(Rc::clone(state));
        if self.reconciling.replace(true) {
            return;
        }
        let me = Rc::clone(self);
        glommio::spawn_local(async move {
            loop {
                let next = me.next.borrow_mut().take();
                let Some(state) = next else { break };
                me.reconcile(&state).await;
            }
            me.reconciling.set(false);
        })
        .detach();
    }

    /// Follows the metadata's leaders where Raft knows none.
    fn follow_named_leaders(&self, state: &ClusterState) {
        // A replica whose Raft knows no leader takes the one the metadata names (another node,
        // elected: epoch above 0) for its leader, and stops believing in one the metadata no
        // longer names (the controller took the leadership away, or another node reported an
        // election). A leader elected while this node was away, quiesced since, sends nothing
        // here: without the metadata's word the replica would campaign against it when its
        // turn came. And two replicas that each started under a leadership the other no
        // longer holds would otherwise both stay quiet, and a partition whose only up-to-date
        // replicas are quiet would never elect. The quiescer still doubts a named leader
        // whose node is silent or restarted.
        for g in self.groups.0.borrow().values() {
            if g.known_leader.get().is_some() {
                continue;
            }
            let named = state
                .partition(g.id.topic, g.id.partition)
                .filter(|p| p.leader_epoch.0 > 0)
                .and_then(|p| p.leader)
                .and_then(BrokerId::from_node_id)
                .filter(|l| *l != self.local);
            let believed = g.believed_leader.get();
            if named != believed {
                tracing::debug!(group = %g.id, ?believed, ?named, "a replica without a known leader takes the metadata's");
                g.believed_leader.set(named);
            }
        }
    }

    /// Tells the quiescer of the peers that registered with a new incarnation (a new process)
    /// since the last state: the groups they led here may have lost their leader.
    fn note_restarts(&self, state: &ClusterState) {
        let now = self.now_ms();
        let mut known = self.incarnations.borrow_mut();
        for b in state.brokers().filter(|b| b.id != self.node) {
            let before = known.insert(b.id, b.incarnation);
            if before.is_some_and(|i| i != b.incarnation) {
                if let Some(peer) = BrokerId::from_node_id(b.id) {
                    tracing::debug!(peer = %b.id, "a peer restarted; the groups it led are suspect");
                    self.quiescer.borrow_mut().peer_restarted(peer, now);
                }
            }
        }
    }

    /// Reconciles again with the newest state: the core has opened logs that an earlier
    /// reconciliation found closed (a new topic's partitions open after the state naming them).
    pub(crate) fn logs_opened(self: &Rc<Self>) {
        let state = self.directory.state.borrow().clone();
        if let Some(state) = state {
            self.cluster_changed(&state);
        }
    }

    /// Reconciles the running groups with `state` now (tests await it).
    pub(crate) async fn reconcile(self: &Rc<Self>, state: &Rc<ClusterState>) {
        if self.closed.get() {
            return;
        }
        *self.directory.state.borrow_mut() = Some(Rc::clone(state));
        let mut wanted: Vec<GroupId> = state
            .hosted_by(self.node)
            .filter(|h| h.shard == self.shard)
            .map(|h| GroupId {
                topic: h.topic,
                partition: h.partition,
            })
            .collect();
        if wanted.len() > self.settings.max_groups {
            tracing::error!(
                wanted = wanted.len(),
                limit = self.settings.max_groups,
                "more partition replicas placed on this shard than it runs groups for; the rest are not served"
            );
            wanted.truncate(self.settings.max_groups);
        }
        let wanted_set: BTreeSet<GroupId> = wanted.iter().copied().collect();
        let gone: Vec<Rc<Group>> = self
            .groups
            .0
            .borrow()
            .values()
            .filter(|g| !wanted_set.contains(&g.id))
            .cloned()
            .collect();
        // Starting or stopping a group rarely waits for I/O, so a topic of a thousand partitions
        // would hold the shard for a second or more (its other groups' heartbeats, elections
        // and writes waiting behind): the loops give way whenever the shard's time slice is up.
        for g in gone {
            self.stop_group(state, &g).await;
            glommio::yield_if_needed().await;
        }
        // A start waits for reads of the replica's files; started one after another, a node
        // restarting with 10,000 replicas spent most of a minute waiting for them.
        let starting: Vec<GroupId> = wanted
            .into_iter()
            .filter(|id| !self.groups.0.borrow().contains_key(id))
            .collect();
        futures::stream::iter(starting)
            .for_each_concurrent(GROUPS_AT_ONCE, |id| async move {
                glommio::yield_if_needed().await;
                if self.closed.get() || self.groups.0.borrow().contains_key(&id) {
                    return;
                }
                match self.start_group(state, id).await {
                    Ok(true) => {}
                    Ok(false) => {
                        tracing::debug!(group = %id, "a partition group waits for the core to open its log")
                    }
                    Err(e) => {
                        tracing::warn!(group = %id, error = %e, "cannot start a partition group; retried at the next metadata change")
                    }
                }
            })
            .await;
        if self.closed.get() {
            return;
        }
        // Elections the state does not show yet (a report lost, refused while this broker was
        // fenced, or overtaken by the controller taking the leadership away).
        let led = self.led_groups();
        for g in led {
            self.report_election(&g);
        }
    }

    async fn stop_group(&self, state: &ClusterState, g: &Rc<Group>) {
        self.host.attach(state, g.id.topic, g.id.partition, None);
        self.groups.0.borrow_mut().remove(&g.id);
        self.quiescer.borrow_mut().remove(g.id);
        g.stopped.set(true);
        if let Err(e) = g.raft.shutdown().await {
            tracing::warn!(group = %g.id, error = ?e, "a partition group did not shut down cleanly");
        }
        tracing::info!(group = %g.id, "partition group stopped");
    }

    /// Starts the group of a hosted replica: `Ok(false)` when the core has not opened its log
    /// yet.
    async fn start_group(self: &Rc<Self>, state: &ClusterState, id: GroupId) -> Result<bool, String> {
        let Some(registration) = state.partition(id.topic, id.partition) else {
            return Err("not in the metadata".into());
        };
        let Some((log, dir)) = self.host.open_log(state, id.topic, id.partition) else {
            return Ok(false);
        };
        let epoch = self.epoch;
        let now_ms: Rc<dyn Fn() -> i64> =
            Rc::new(move || i64::try_from(epoch.elapsed().as_millis()).unwrap_or(i64::MAX));
        let Some(topic) = state.topic(id.topic) else {
            return Err("not in the metadata".into());
        };
        let replica_log = ShardReplicaLog::open(Rc::clone(&self.store), log, dir, now_ms)
            .await
            .map_err(|e| format!("replica log: {e}"))?
            .with_side_log(SideLogSpec {
                key: LogKey {
                    dir_name: side_log_dir_name(&topic.name, id.partition.0),
                    incarnation: *id.topic.0.as_bytes(),
                },
                config: side_log_config(),
            });
        let replica = Store::open(replica_log)
            .await
            .map_err(|e| format!("replica store: {e}"))?;
        // Nothing above the committed offset is shown to clients, from the start.
        let cap = self
            .store
            .with_log(log, |l| l.commit_cap())
            .map_err(|e| e.to_string())?
            .unwrap_or(0)
            .max(replica.high_watermark().0);
        self.store
            .set_commit_cap(log, Some(cap))
            .map_err(|e| e.to_string())?;
        // What consumers are shown follows the commit as each apply moves the high watermark,
        // before the writers are answered.
        let store = Rc::clone(&self.store);
        replica.set_on_high_watermark(Rc::new(move |hw| {
            let moved = store
                .with_log(log, |l| l.commit_cap().is_none_or(|c| c < hw.0))
                .unwrap_or(false);
            if moved {
                let _ = store.set_commit_cap(log, Some(hw.0));
            }
        }));
        let raft = Raft::new(
            self.local,
            Arc::clone(&self.config),
            self.network.factory(id),
            replica.clone(),
            replica.clone(),
        )
        .await
        .map_err(|e| format!("raft: {e}"))?;
        let group = Rc::new(Group {
            id,
            local: self.local,
            manager: Rc::downgrade(self),
            raft,
            replica,
            stopped: Cell::new(false),
            active: Cell::new(false),
            local_acks: RefCell::new(HashMap::new()),
            tickets: Cell::new(0),
            last_submitted: Cell::new(0),
            barrier: Cell::new(0),
            lease_waiter: Cell::new(None),
            reporting: Cell::new(false),
            reported: Cell::new(None),
            caught_up_ms: RefCell::new(BTreeMap::new()),
            isr_mark: Cell::new(None),
            isr_reporting: Cell::new(false),
            isr_refused_at: Cell::new(None),
            believed_leader: Cell::new(None),
            known_leader: Cell::new(None),
        });
        let weak = Rc::downgrade(&group);
        group.replica.set_on_flushed(Rc::new(move |batches| {
            let Some(g) = weak.upgrade() else { return };
            let mut waiting = g.local_acks.borrow_mut();
            if waiting.is_empty() {
                return;
            }
            for (bytes, base) in batches {
                if let Some(tx) = waiting.remove(&(bytes.as_ptr() as usize, bytes.len())) {
                    let _ = tx.send(base.0);
                }
            }
        }));
        self.groups.0.borrow_mut().insert(id, Rc::clone(&group));
        // The newest state, not the one this reconciliation started from: a node restarting
        // starts its groups for seconds, under metadata that may be its own stale copy.
        let newest = self.directory.state.borrow().clone();
        let registration = newest
            .as_deref()
            .and_then(|s| s.partition(id.topic, id.partition))
            .unwrap_or(registration);
        // Every replica starts quiet, and the quiescer elects a group without a leader when
        // this node's turn comes, rather than every replica's election timer, which on a node
        // starting thousands of groups would run out for all of them together. A replica of a
        // group another node was elected to lead takes it for its leader: that leader,
        // quiesced, sends nothing until the group's next write, and the replica would otherwise
        // campaign against a live group; the host elects it if the leader's node goes silent
        // or restarts. (A leader of epoch 0 is only placement's choice: the group may not have
        // formed.) The leader it names itself lost its leadership with the restart: it
        // campaigns last.
        let named_leader = registration
            .leader
            .filter(|l| *l != self.node && registration.leader_epoch.0 > 0)
            .and_then(BrokerId::from_node_id);
        group.believed_leader.set(named_leader);
        let led_here = registration.leader == Some(self.node) && registration.leader_epoch.0 > 0;
        if led_here {
            self.quiescer
                .borrow_mut()
                .add_former_leader(id, self.now_ms(), self.local);
        } else {
            self.quiescer.borrow_mut().add_quiesced(id, self.now_ms());
        }
        quiesce::apply(&group.raft, quiesce::Action::Quiesce).await;
        self.spawn_watcher(Rc::clone(&group));
        let members: BTreeSet<BrokerId> = registration
            .replica_brokers()
            .filter_map(BrokerId::from_node_id)
            .collect();
        // A group that has elected before (the leader epoch is the term of an election) is
        // formed: a replica here without Raft state lost it (a wiped disk) and waits to be
        // written to, with no first entry of its own.
        let formed = registration.leader_epoch.0 > 0;
        if formed {
            tracing::debug!(group = %id, "joining a formed group");
        } else if registration.preferred_leader() == Some(self.node) {
            initialize_group(&group, members).await;
        } else {
            // The others wait to be written to; one that still holds no Raft state after
            // `FOLLOWER_INIT_WAIT_ELECTIONS` election timeouts forms the group itself, with the
            // same membership (its entry at index 0 equals the first replica's), so that a
            // partition whose first replica died before the group formed still gets a leader.
            let g = Rc::clone(&group);
            let wait =
                Duration::from_millis(self.settings.election_timeout_max_ms * FOLLOWER_INIT_WAIT_ELECTIONS);
            glommio::spawn_local(async move {
                glommio::timer::sleep(wait).await;
                if !g.stopped.get() {
                    initialize_group(&g, members).await;
                }
            })
            .detach();
        }
        let handle: Rc<dyn ReplicaHandle> = Rc::new(Handle(Rc::clone(&group)));
        self.host.attach(state, id.topic, id.partition, Some(handle));
        tracing::debug!(group = %id, "partition group started");
        Ok(true)
    }

    /// Follows a group's leadership and reports its changes. It wakes on openraft's server
    /// metrics, which change with the vote, the server state and the leader, not on the full
    /// metrics, which change at every turn of the group's Raft loop (every tick).
    fn spawn_watcher(self: &Rc<Self>, group: Rc<Group>) {
        let me = Rc::downgrade(self);
        glommio::spawn_local(async move {
            let mut server = group.raft.server_metrics();
            let metrics = group.raft.metrics();
            let mut last: Option<(Option<BrokerId>, u64)> = None;
            loop {
                if group.stopped.get() {
                    return;
                }
                // The full metrics are sent after the server metrics, in the same step.
                let (leader, term) = {
                    let m = metrics.borrow_watched();
                    (m.current_leader, m.current_term)
                };
                let Some(manager) = me.upgrade() else { return };
                group.known_leader.set(leader);
                if last != Some((leader, term)) {
                    let was_leader = last.is_some_and(|(l, _)| l == Some(group.local));
                    // The first look is the state the group started in, not a change: a
                    // replica that started quiesced stays so. A new term without a leader is
                    // a campaign (this replica's or another's, which it voted in): it does
                    // not wake the group, whose election timer would campaign too, but it
                    // moves the other replicas' turns to campaign later (see the quiescer).
                    if last.is_some() {
                        if leader.is_some() {
                            group.active.set(true);
                        } else {
                            let now = manager.now_ms();
                            manager.quiescer.borrow_mut().campaign_seen(group.id, now);
                        }
                    }
                    last = Some((leader, term));
                    let epoch = i32::try_from(term).unwrap_or(i32::MAX);
                    if let Some(leader) = leader.and_then(BrokerId::as_node_id) {
                        manager.leader_seen(SeenLeader {
                            topic: group.id.topic,
                            partition: group.id.partition,
                            leader,
                            epoch: LeaderEpoch(epoch),
                        });
                    }
                    if leader == Some(group.local) {
                        tracing::info!(group = %group.id, epoch, "leading a partition");
                        // A new leader gives every follower a full lag window, as Kafka does.
                        let now = manager.now_ms();
                        group.caught_up_ms.borrow_mut().clear();
                        if let Some(p) = manager
                            .directory
                            .state
                            .borrow()
                            .as_ref()
                            .and_then(|s| s.partition(group.id.topic, group.id.partition).cloned())
                        {
                            for b in p.replica_brokers().filter_map(BrokerId::from_node_id) {
                                group.caught_up_ms.borrow_mut().insert(b, now);
                            }
                        }
                        group.isr_mark.set(None);
                        manager.report_election(&group);
                    } else if was_leader {
                        tracing::info!(group = %group.id, ?leader, epoch, "no longer leading a partition");
                    }
                }
                drop(manager);
                if server.changed().await.is_err() {
                    return;
                }
            }
        })
        .detach();
    }

    /// A group here saw `seen` (a leader elected): kept and told to the other
    /// shards if the cluster state does not show it yet. The shards are told once per turn of
    /// this one, so that the elections of many groups at once travel together.
    fn leader_seen(self: &Rc<Self>, seen: SeenLeader) {
        let state = self.directory.state.borrow().clone();
        if !self.leaders.seen(seen, state.as_deref()) {
            return;
        }
        let first = {
            let mut untold = self.seen_untold.borrow_mut();
            untold.push(seen);
            untold.len() == 1
        };
        if first {
            let me = Rc::downgrade(self);
            glommio::spawn_local(async move {
                futures_lite::future::yield_now().await;
                let Some(m) = me.upgrade() else { return };
                let seen = std::mem::take(&mut *m.seen_untold.borrow_mut());
                m.host.tell_shards(seen);
            })
            .detach();
        }
    }

    /// Another shard of this node saw these leaderships.
    pub(crate) fn leaders_seen(&self, seen: &[SeenLeader]) {
        let state = self.directory.state.borrow().clone();
        for s in seen {
            let _ = self.leaders.seen(*s, state.as_deref());
        }
    }

    /// The leader and epoch Metadata answers for a partition whose state records `recorded`,
    /// when a replica on this node has seen a newer leadership ([`leaders`]).
    pub(crate) fn newer_leader(
        &self,
        topic: TopicId,
        partition: PartitionId,
        recorded: LeaderEpoch,
    ) -> Option<(NodeId, LeaderEpoch)> {
        self.leaders.newer(topic, partition, recorded)
    }

    /// Reports the group's election to the controller when this node leads it and the cluster
    /// state does not say so yet: once per term and registration, again while no controller
    /// answers (every [`REPORT_RETRY`], within [`REPORT_ATTEMPTS`]), one report at a time.
    fn report_election(self: &Rc<Self>, group: &Rc<Group>) {
        if group.reporting.get() || self.reports.borrow().is_none() {
            return;
        }
        group.reporting.set(true);
        let me = Rc::downgrade(self);
        let group = Rc::clone(group);
        glommio::spawn_local(async move {
            for _ in 0..REPORT_ATTEMPTS {
                let Some(m) = me.upgrade() else { break };
                let l = group.leadership();
                if group.stopped.get() || m.closed.get() || !l.is_local {
                    break;
                }
                let seen = m.directory.state.borrow().as_ref().and_then(|s| {
                    s.partition(group.id.topic, group.id.partition)
                        .map(|p| (p.leader, p.leader_epoch.0, p.partition_epoch.0))
                });
                let Some((leader, epoch, partition_epoch)) = seen else { break };
                if leader == Some(m.node) && epoch == l.epoch {
                    break;
                }
                if group
                    .reported
                    .get()
                    .is_some_and(|(term, pe)| term == l.epoch && pe >= partition_epoch)
                {
                    break;
                }
                let Some(reports) = m.reports.borrow().clone() else { break };
                drop(m);
                match reports.leader_elected(group.id.topic, group.id.partition, l.epoch).await {
                    Report::Recorded { partition_epoch } => {
                        group.reported.set(Some((l.epoch, partition_epoch)));
                        break;
                    }
                    // Not remembered: a refusal for this broker being fenced (a restarted
                    // leader that is still catching up with the metadata) no longer holds once
                    // it is unfenced, which changes the state and brings the next report.
                    Report::Refused(why) => {
                        tracing::info!(group = %group.id, epoch = l.epoch, %why, "the controller refused an election report");
                        break;
                    }
                    Report::Unreachable(why) => {
                        tracing::debug!(group = %group.id, %why, "an election report found no controller; retrying");
                        glommio::timer::sleep(REPORT_RETRY).await;
                    }
                }
            }
            group.reporting.set(false);
        })
        .detach();
    }

    /// The ISR as the leaders of this shard's groups see it (Kafka's rule): a follower is in
    /// sync while it reached, within `replica.lag.time.max.ms`, the log end the leader had at
    /// the previous check. Where the registration differs (a follower fell behind or caught up
    /// again, a restarted broker is back), and the registration names this node as leader in
    /// its term, the leader asks the controller for the change (AlterPartition).
    fn check_isr(self: &Rc<Self>, now: u64) {
        let Some(state) = self.directory.state.borrow().clone() else {
            return;
        };
        let Some(reports) = self.reports.borrow().clone() else {
            return;
        };
        let led = self.led_groups();
        let under_replicated = led
            .iter()
            .filter_map(|g| state.partition(g.id.topic, g.id.partition))
            .filter(|p| p.leader == Some(self.node) && p.isr.len() < p.replicas.len())
            .count();
        metrics::gauge!("strand_under_replicated_partitions", "shard" => self.shard.0.to_string())
            .set(under_replicated as f64);
        for g in led {
            let Some(part) = state.partition(g.id.topic, g.id.partition) else {
                continue;
            };
            let (last, term, matched): (u64, i32, Vec<(BrokerId, u64)>) = {
                let m = g.raft.metrics();
                let m = m.borrow_watched();
                let matched = m
                    .replication
                    .as_ref()
                    .map(|r| {
                        r.iter()
                            .map(|(id, l)| (*id, l.as_ref().map_or(0, |l| l.index)))
                            .collect()
                    })
                    .unwrap_or_default();
                (
                    m.last_log_index.unwrap_or(0),
                    i32::try_from(m.current_term).unwrap_or(i32::MAX),
                    matched,
                )
            };
            let mark = g.isr_mark.replace(Some(last)).unwrap_or(last);
            {
                let mut caught = g.caught_up_ms.borrow_mut();
                for (id, index) in &matched {
                    if *id != g.local && *index >= mark {
                        caught.insert(*id, now);
                    }
                }
            }
            if part.leader != Some(self.node) || part.leader_epoch.0 != term || g.isr_reporting.get() {
                continue;
            }
            if g.isr_refused_at.get() == Some(part.partition_epoch.0) {
                continue;
            }
            let lag = self.settings.replica_lag_time_max_ms;
            let caught = g.caught_up_ms.borrow();
            let isr: Vec<(NodeId, BrokerEpoch)> = part
                .replica_brokers()
                .filter(|b| {
                    *b == self.node
                        || BrokerId::from_node_id(*b)
                            .and_then(|id| caught.get(&id))
                            .is_some_and(|at| now.saturating_sub(*at) <= lag)
                })
                .filter_map(|b| state.broker(b).filter(|r| r.is_active()).map(|r| (b, r.epoch)))
                .collect();
            drop(caught);
            let wanted: BTreeSet<NodeId> = isr.iter().map(|(b, _)| *b).collect();
            let current: BTreeSet<NodeId> = part.isr.iter().copied().collect();
            if wanted == current || !wanted.contains(&self.node) {
                continue;
            }
            g.isr_reporting.set(true);
            let (reports, g, partition_epoch) = (Rc::clone(&reports), Rc::clone(&g), part.partition_epoch.0);
            glommio::spawn_local(async move {
                let outcome = reports
                    .alter_isr(g.id.topic, g.id.partition, term, partition_epoch, isr)
                    .await;
                match outcome {
                    Report::Recorded { .. } => {
                        tracing::info!(group = %g.id, isr = ?wanted, "ISR changed");
                    }
                    Report::Refused(why) => {
                        tracing::info!(group = %g.id, %why, "the controller refused an ISR change");
                        g.isr_refused_at.set(Some(partition_epoch));
                    }
                    Report::Unreachable(why) => {
                        tracing::debug!(group = %g.id, %why, "an ISR change found no controller");
                    }
                }
                g.isr_reporting.set(false);
            })
            .detach();
        }
    }

    /// Hands the groups this shard leads back to their preferred replicas (the first of each
    /// partition's replicas, where placement spread the leaders), as Kafka's automatic leader
    /// rebalance does: when the registration shows this node leading in its term, and the
    /// preferred replica is active, in the ISR and holds the whole log (a leadership transfer
    /// to it then loses no time). At most [`MAX_BALANCE_TRANSFERS`] per round.
    fn balance_leaders(&self) {
        let Some(state) = self.directory.state.borrow().clone() else {
            return;
        };
        let mut started = 0;
        for g in self.led_groups() {
            if started >= MAX_BALANCE_TRANSFERS {
                break;
            }
            let Some(part) = state.partition(g.id.topic, g.id.partition) else {
                continue;
            };
            let Some(preferred) = part.preferred_leader() else {
                continue;
            };
            let Some(to) = BrokerId::from_node_id(preferred) else {
                continue;
            };
            let eligible = preferred != self.node
                && part.leader == Some(self.node)
                && part.isr.contains(&preferred)
                && state.broker(preferred).is_some_and(|b| b.is_active());
            if !eligible {
                continue;
            }
            let caught_up = {
                let m = g.raft.metrics();
                let m = m.borrow_watched();
                i32::try_from(m.current_term).ok() == Some(part.leader_epoch.0)
                    && m.replication.as_ref().is_some_and(|r| {
                        r.get(&to)
                            .is_some_and(|matched| matched.as_ref().map(|l| l.index) == m.last_log_index)
                    })
            };
            if !caught_up {
                continue;
            }
            started += 1;
            tracing::info!(group = %g.id, to = %preferred, "handing leadership back to the preferred replica");
            let raft = g.raft.clone();
            glommio::spawn_local(async move {
                if let Err(e) = raft.trigger().transfer_leader(to).await {
                    tracing::debug!(error = %e, "a leadership transfer did not start");
                }
            })
            .detach();
        }
    }

    /// Stops the groups of topic `topic` (its logs are about to be removed).
    pub(crate) async fn stop_topic(&self, topic: TopicId) {
        let groups: Vec<Rc<Group>> = self
            .groups
            .0
            .borrow()
            .values()
            .filter(|g| g.id.topic == topic)
            .cloned()
            .collect();
        let logs: Vec<ShardReplicaLog<GlommioFs>> =
            groups.iter().map(|g| g.replica.with_log(|l| l.clone())).collect();
        self.stop_groups(groups).await;
        // The side logs go with the topic (the core removes the partition logs).
        for log in logs {
            if let Err(e) = log.remove_side_log().await {
                tracing::warn!(error = %e, "cannot remove a deleted partition's side log");
            }
        }
    }

    /// A controlled shutdown: the groups this shard leads hand leadership to a caught-up
    /// follower first (waiting at most [`TRANSFER_WAIT`] for all), so that clients find a
    /// writable leader at once; then every group stops, as [`GroupManager::close`].
    pub(crate) async fn shut_down(&self) -> ShutdownMoves {
        let led = self.led_groups();
        let count = led.len();
        let transfers = led.into_iter().map(|g| async move {
            // The follower furthest along: under writes none may hold the leader's last entry
            // at this instant, and the leader, once transferring, proposes nothing more while
            // the target waits (openraft, up to the shortest election timeout) for that entry
            // before it campaigns.
            let target = {
                let m = g.raft.metrics();
                let m = m.borrow_watched();
                m.replication.as_ref().and_then(|r| {
                    r.iter()
                        .filter(|(id, _)| **id != g.local)
                        .max_by_key(|(_, matched)| matched.map(|l| l.index))
                        .map(|(id, _)| *id)
                })
            };
            let Some(to) = target else { return false };
            if g.raft.trigger().transfer_leader(to).await.is_err() {
                return false;
            }
            let mut metrics = g.raft.metrics();
            let moved = async {
                while metrics.borrow_watched().current_leader == Some(g.local) {
                    if metrics.changed().await.is_err() {
                        return;
                    }
                }
            };
            let timer = glommio::timer::sleep(TRANSFER_WAIT);
            futures::pin_mut!(moved);
            futures::pin_mut!(timer);
            matches!(
                futures::future::select(moved, timer).await,
                futures::future::Either::Left(_)
            )
        });
        let moved = futures::future::join_all(transfers)
            .await
            .into_iter()
            .filter(|m| *m)
            .count();
        self.close().await;
        ShutdownMoves { led: count, moved }
    }

    /// Stops every group and the timers at once (a crash, as far as the peers can tell).
    pub(crate) async fn close(&self) {
        self.closed.set(true);
        let groups: Vec<Rc<Group>> = self.groups.0.borrow().values().cloned().collect();
        self.stop_groups(groups).await;
    }

    /// Stops `groups`, [`GROUPS_AT_ONCE`] at a time: each stop waits for its group's Raft tasks
    /// to end, and one after another a node of 10,000 groups took 15-16 s to stop, longer than
    /// Docker's 10 s stop timeout.
    async fn stop_groups(&self, groups: Vec<Rc<Group>>) {
        let state = self.directory.state.borrow().clone().unwrap_or_default();
        futures::stream::iter(groups)
            .for_each_concurrent(GROUPS_AT_ONCE, |g| {
                let state = &state;
                async move { self.stop_group(state, &g).await }
            })
            .await;
    }
}

/// What a controlled shutdown did with the shard's leaderships.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ShutdownMoves {
    /// Groups the shard led.
    pub led: usize,
    /// Those whose leadership moved to another replica before they stopped.
    pub moved: usize,
}

/// The core as the manager's host.
struct CoreHost(Weak<Shard>);

impl Host for CoreHost {
    fn open_log(
        &self,
        state: &ClusterState,
        topic: TopicId,
        partition: PartitionId,
    ) -> Option<(LogId, PathBuf)> {
        let core = self.0.upgrade()?;
        let name = &state.topic(topic)?.name;
        core.open_log_of(name, partition.0, topic)
    }

    fn attach(
        &self,
        state: &ClusterState,
        topic: TopicId,
        partition: PartitionId,
        handle: Option<Rc<dyn ReplicaHandle>>,
    ) {
        let Some(core) = self.0.upgrade() else { return };
        let Some(t) = state.topic(topic) else { return };
        core.attach_replica(&t.name, partition.0, topic, handle);
    }

    fn serve_node(&self, kind: u16, body: Bytes) -> LocalBoxFuture<'static, Option<Bytes>> {
        match self.0.upgrade() {
            Some(core) => core.serve_node(kind, body),
            None => async { None }.boxed_local(),
        }
    }

    fn tell_shards(&self, seen: Vec<SeenLeader>) {
        let Some(core) = self.0.upgrade() else { return };
        for shard in (0..core.shards).map(ShardId).filter(|s| *s != core.id) {
            let core = Rc::clone(&core);
            let seen = seen.clone();
            glommio::spawn_local(async move {
                let call = core.call::<Replication>(shard, ReplicationCall::LeadersSeen(seen));
                if let Err(e) = call.await {
                    tracing::debug!(%shard, error = ?e, "cannot tell a shard of the leaders seen here");
                }
            })
            .detach();
        }
    }
}

/// The replication subsystem of one shard: its group manager, fed by the core's cluster
/// state. Absent on a standalone node.
pub(crate) struct Replication {
    pub(crate) manager: Rc<GroupManager>,
}

impl Replication {
    /// The subsystem of `core`'s shard, in a cluster whose inter-broker listener is
    /// `inter_broker_listener`; registers its hooks.
    pub(crate) fn new(core: &Rc<Shard>, inter_broker_listener: String) -> Rc<Self> {
        let host: Rc<dyn Host> = Rc::new(CoreHost(Rc::downgrade(core)));
        let manager = GroupManager::new(
            core.config.node_id,
            core.id,
            Rc::clone(&core.store),
            host,
            inter_broker_listener,
            ReplicationSettings {
                replica_lag_time_max_ms: core.config.cluster.replica_lag_time_max_ms,
                leader_balance_interval_ms: core.config.cluster.leader_balance_interval_ms,
                ..ReplicationSettings::default()
            },
        );
        manager.run();
        let me = Rc::new(Replication { manager });
        core.hook(me.clone());
        core.serve(&me);
        core.set_node_link(me.clone());
        me
    }
}

impl NodeLink for Replication {
    fn call(
        &self,
        node: NodeId,
        shard: ShardId,
        kind: u16,
        body: Bytes,
        timeout: Duration,
    ) -> LocalBoxFuture<'static, Result<Bytes, String>> {
        let manager = Rc::clone(&self.manager);
        async move {
            let peer = BrokerId::from_node_id(node).ok_or_else(|| format!("no node {}", node.0))?;
            let call = async {
                manager
                    .network
                    .connection()
                    .call_shard(peer, shard.0, Message::Control { kind, body })
                    .await
            };
            let answer = futures_lite::future::or(async { Some(call.await) }, async {
                glommio::timer::sleep(timeout).await;
                None
            })
            .await;
            match answer {
                None => Err(format!("node {} did not answer within {timeout:?}", node.0)),
                Some(Ok(Message::ControlReply(Some(b)))) => Ok(b),
                Some(Ok(Message::ControlReply(None))) => Err(format!("node {} refused the request", node.0)),
                Some(Ok(other)) => Err(format!("node {} answered {other:?}", node.0)),
                Some(Err(e)) => Err(format!("node {}: {e}", node.0)),
            }
        }
        .boxed_local()
    }
}

/// A node's replication connection accepted by another shard, for this one (its hello named
/// it): a duplicate of the socket and the bytes read from it.
pub(crate) struct PeerConnection {
    pub(crate) fd: std::os::fd::OwnedFd,
    pub(crate) received: Vec<u8>,
}

/// What a shard's replication is sent by the node's other shards.
pub(crate) enum ReplicationCall {
    /// A node's replication connection for this shard.
    Peer(Box<PeerConnection>),
    /// Leaderships another shard's groups saw that the cluster state does not show yet.
    LeadersSeen(Vec<SeenLeader>),
}

impl Service for Replication {
    type Request = ReplicationCall;
    /// Whether it was taken.
    type Response = bool;

    fn start(self: Rc<Self>, call: ReplicationCall) -> LocalBoxFuture<'static, bool> {
        let c = match call {
            ReplicationCall::Peer(c) => c,
            ReplicationCall::LeadersSeen(seen) => {
                self.manager.leaders_seen(&seen);
                return async { true }.boxed_local();
            }
        };
        let PeerConnection { fd, received } = *c;
        let stream = TcpStream::from(socket2::Socket::from(std::net::TcpStream::from(fd)));
        let manager = Rc::clone(&self.manager);
        glommio::spawn_local(async move {
            manager.serve_peer(stream, BytesMut::from(&received[..])).await;
        })
        .detach();
        async { true }.boxed_local()
    }
}

impl ShardHooks for Replication {
    fn cluster_changed(&self, state: &Rc<ClusterState>) {
        self.manager.cluster_changed(state);
    }

    /// New partitions' logs are open now: their groups can start.
    fn metadata_committed(&self, deltas: &[MetadataDelta]) {
        let opened = deltas.iter().any(|d| {
            matches!(
                d,
                MetadataDelta::CreateTopic(_) | MetadataDelta::SetPartitionCount { .. }
            )
        });
        if opened {
            self.manager.logs_opened();
        }
    }

    /// A deleted topic's groups stop before the core removes their logs.
    fn metadata_preparing<'a>(&'a self, delta: &'a MetadataDelta) -> LocalBoxFuture<'a, ()> {
        async move {
            if let MetadataDelta::DeleteTopic { id, .. } = delta {
                self.manager.stop_topic(*id).await;
            }
        }
        .boxed_local()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]
mod tests;
