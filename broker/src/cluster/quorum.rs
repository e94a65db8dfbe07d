//! The controller quorum: the metadata log as a Raft group of the controllers.
//!
//! The log is stored as KRaft stores it, as a Kafka partition log (`__cluster_metadata-0`),
//! through the same replica storage as every partition (`strand_raft::partition`): one
//! controller decision is one Kafka batch holding one record per metadata [`Record`] (its value
//! the record's encoding), so the decision commits or is lost whole, and the log's Kafka offsets
//! are the metadata offsets [`ClusterState`] numbers records with. The group's applier
//! ([`MetadataApplier`]) builds the state from the committed batches, replaying the log from its
//! start when a controller opens it.
//!
//! Decisions run in rounds on the leader ([`Controller::decide`]), one round at a time: a round
//! takes every decision queued (group commit), first waits until the state has applied
//! everything committed before it (a read index, so a new leader never decides on a state that
//! misses its predecessor's last records) and everything in the leader's own log (a leader
//! restarted in its own term holds entries it appended before), decides them in order, each on
//! the state the ones before it leave, then commits all their records as one batch and answers
//! each once they are applied. A committed decision whose partition
//! changes were built on an older state is skipped whole by every node alike
//! ([`ClusterState::try_apply_batch`]). [`super::node`] runs it in the broker and carries
//! requests to it ([`super::rpc`]). The applier keeps the last [`RECENT_RECORDS`] records, which
//! brokers that fetch the metadata are sent.

use std::cell::{Cell, Ref, RefCell};
use std::collections::VecDeque;
use std::io;
use std::rc::Rc;
use std::sync::Arc;

use bytes::Bytes;
use futures::channel::oneshot;
use openraft::async_runtime::WatchReceiver;
use openraft::error::{ClientWriteError, LinearizableReadError, RaftError};
use openraft::network::RaftNetworkFactory;
use openraft::{AsyncRuntime, Config, Instant, Raft, ReadPolicy};
use strand_protocol::batch::build::{batch, TestRecord};
use strand_protocol::records::decode_records;
use strand_protocol::types::{NodeId, Offset};
use strand_raft::partition::{
    Applied, Applier, BrokerId, KafkaBatch, PartitionRaft, ReplicaLog, ReplicaStore,
};
use strand_storage::notify::Notify;

use super::control::Liveness;
use super::record::{BrokerEpoch, MetadataOffset, Record};
use super::state::ClusterState;
use crate::metadata::AdminError;

/// The metadata log's topic, as Kafka names it.
pub const METADATA_TOPIC: &str = "__cluster_metadata";
/// The most one decision's batch may decompress to when it is read back.
const MAX_DECISION_BYTES: usize = 64 << 20;

/// One decision's records as one Kafka batch: a record per metadata record.
pub fn decision_batch(records: &[Record], now_ms: i64) -> Bytes {
    let encoded: Vec<Vec<u8>> = records.iter().map(Record::encode).collect();
    let kafka: Vec<TestRecord<'_>> = encoded
        .iter()
        .map(|v| TestRecord {
            value: Some(v),
            ..TestRecord::default()
        })
        .collect();
    Bytes::from(batch(&kafka, now_ms))
}

/// The metadata records of one decision's batch.
pub fn decision_records(batch: &Bytes) -> Result<Vec<Record>, String> {
    let records = decode_records(batch, MAX_DECISION_BYTES).map_err(|e| format!("metadata batch: {e}"))?;
    records
        .iter()
        .map(|r| {
            let value = r.value.as_ref().ok_or("a metadata record without a value")?;
            Record::decode(value).map_err(|e| format!("metadata record: {e}"))
        })
        .collect()
}

/// Records the applier keeps after they are applied, for brokers that fetch the metadata
/// (a broker further behind gets a snapshot of the state).
pub const RECENT_RECORDS: usize = 4_096;

/// Builds the cluster state from the metadata log's committed batches, and keeps the most
/// recent records for brokers that fetch them ([`MetadataApplier::records_from`]).
#[derive(Default)]
pub struct MetadataApplier {
    state: RefCell<ClusterState>,
    /// The last records applied (at most [`RECENT_RECORDS`]), the last at `next_offset - 1`.
    recent: RefCell<std::collections::VecDeque<Record>>,
    /// Notified after each applied batch.
    applied: Notify,
}

impl MetadataApplier {
    pub fn state(&self) -> Ref<'_, ClusterState> {
        self.state.borrow()
    }

    /// Notified after each applied batch.
    pub fn applied(&self) -> &Notify {
        &self.applied
    }

    /// Up to `max` applied records from `from` on, if they are still kept (`Some(empty)` for a
    /// requester that is up to date, `None` when it is too far behind or ahead).
    pub fn records_from(&self, from: MetadataOffset, max: usize) -> Option<Vec<Record>> {
        let next = self.state.borrow().next_offset().0;
        let recent = self.recent.borrow();
        let first = next - recent.len() as u64;
        if from.0 < first || from.0 > next {
            return None;
        }
        let skip = usize::try_from(from.0 - first).ok()?;
        Some(recent.iter().skip(skip).take(max).cloned().collect())
    }
}

impl Applier for MetadataApplier {
    fn apply(&self, base_offset: Offset, batch: &Bytes) -> Result<(), String> {
        let records = decision_records(batch)?;
        let mut state = self.state.borrow_mut();
        let expected = state.next_offset();
        if u64::try_from(base_offset.0).ok() != Some(expected.0) {
            return Err(format!(
                "metadata batch at offset {} but the state expects {}",
                base_offset.0, expected.0
            ));
        }
        state.apply_batch(&records);
        let mut recent = self.recent.borrow_mut();
        recent.extend(records);
        while recent.len() > RECENT_RECORDS {
            recent.pop_front();
        }
        drop((state, recent));
        self.applied.notify_all();
        Ok(())
    }
}

/// Why a decision did not commit.
#[derive(Debug, Clone)]
pub enum ControllerError {
    /// The decision itself refused (an error code for the client).
    Refused(AdminError),
    /// This controller is not the quorum's leader (`leader`: the one it knows of).
    NotController { leader: Option<BrokerId> },
    /// The quorum failed to commit (shut down, storage error).
    Failed(String),
}

/// How long a decision waits for the active controller's own log to be applied (see
/// [`Controller::decide`]); then it is refused as NotController, which callers retry.
const LOG_APPLIED_WAIT: std::time::Duration = std::time::Duration::from_secs(3);
/// How long a decision waits for a quorum to confirm the controller's leadership (a ReadIndex
/// heartbeat round); then it is refused as NotController, which callers retry.
const READ_INDEX_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Decisions one round commits at most (one Raft entry, one metadata batch).
const MAX_ROUND_DECISIONS: usize = 1_024;

/// One controller of the quorum.
pub struct Controller<Rt: AsyncRuntime, L: ReplicaLog> {
    rounds: Rc<Rounds<Rt, L>>,
    /// The metadata log's replica store (also Raft's): its Raft index to offset map.
    store: ReplicaStore<Rt, L>,
}

/// What a round of decisions needs, and the decisions waiting for the next one.
struct Rounds<Rt: AsyncRuntime, L: ReplicaLog> {
    id: BrokerId,
    raft: Raft<PartitionRaft<Rt>, ReplicaStore<Rt, L>>,
    applier: Rc<MetadataApplier>,
    /// The soft state the active controller keeps beside the log (heartbeat times), and the
    /// term it was started in: a controller that becomes active starts it afresh.
    liveness: RefCell<(u64, Liveness)>,
    queue: RefCell<VecDeque<Box<dyn Pending>>>,
    /// A task is running rounds (it stops when the queue is empty).
    running: Cell<bool>,
    /// The time the last decision was asked at: the timestamp of the next round's batch.
    now_ms: Cell<i64>,
}

/// A decision waiting for its round. Type-erased: each answers its own caller.
trait Pending {
    /// Decides on `state` (the records of the round's earlier decisions applied); returns the
    /// records to commit, none when it refused or changes nothing.
    fn decide(&mut self, state: &ClusterState, liveness: &mut Liveness) -> Vec<Record>;
    /// Answers the caller: the round's records are applied (`Ok`), or not.
    fn finish(self: Box<Self>, round: Result<(), ControllerError>);
}

struct Decision<T, F> {
    decide: Option<F>,
    outcome: Option<Result<T, AdminError>>,
    answer: oneshot::Sender<Result<T, ControllerError>>,
}

impl<T, F> Pending for Decision<T, F>
where
    F: FnOnce(&ClusterState, &mut Liveness) -> Result<(Vec<Record>, T), AdminError>,
{
    fn decide(&mut self, state: &ClusterState, liveness: &mut Liveness) -> Vec<Record> {
        let Some(decide) = self.decide.take() else {
            return Vec::new();
        };
        match decide(state, liveness) {
            Ok((records, value)) => {
                self.outcome = Some(Ok(value));
                records
            }
            Err(refused) => {
                self.outcome = Some(Err(refused));
                Vec::new()
            }
        }
    }

    fn finish(self: Box<Self>, round: Result<(), ControllerError>) {
        let answer = match (self.outcome, round) {
            // Refused on the state it was shown: true whatever became of the round.
            (Some(Err(refused)), _) => Err(ControllerError::Refused(refused)),
            (Some(Ok(value)), Ok(())) => Ok(value),
            (_, Err(e)) => Err(e),
            (None, Ok(())) => Err(ControllerError::Failed("the decision was not run".into())),
        };
        let _ = self.answer.send(answer);
    }
}

impl<Rt: AsyncRuntime, L: ReplicaLog> Controller<Rt, L> {
    /// Opens the metadata log `log` and starts the controller's Raft node.
    pub async fn start<N>(id: BrokerId, config: Arc<Config>, network: N, log: L) -> io::Result<Self>
    where
        N: RaftNetworkFactory<PartitionRaft<Rt>>,
        N::Network: openraft::network::NetSnapshot<
            PartitionRaft<Rt>,
            SnapshotData = strand_raft::partition::PartitionSnapshot,
        >,
    {
        let applier = Rc::new(MetadataApplier::default());
        let dyn_applier: Rc<dyn Applier> = applier.clone();
        let store = ReplicaStore::<Rt, L>::open_with(log, Some(dyn_applier)).await?;
        let raft = Raft::new(id, config, network, store.clone(), store.clone())
            .await
            .map_err(|e| io::Error::other(e.to_string()))?;
        Ok(Controller {
            store,
            rounds: Rc::new(Rounds {
                id,
                raft,
                applier,
                liveness: RefCell::new((0, Liveness::default())),
                queue: RefCell::new(VecDeque::new()),
                running: Cell::new(false),
                now_ms: Cell::new(0),
            }),
        })
    }

    pub fn raft(&self) -> &Raft<PartitionRaft<Rt>, ReplicaStore<Rt, L>> {
        &self.rounds.raft
    }

    /// The state as applied here (a follower's may lag the leader's).
    pub fn state(&self) -> Ref<'_, ClusterState> {
        self.rounds.applier.state()
    }

    /// Runs `decide` on the current state and commits the records it returns; answers its
    /// value once they are applied. Only the quorum's leader decides.
    ///
    /// Decisions are group-committed: they queue, and a task runs them in rounds, each round
    /// taking what is queued (up to [`MAX_ROUND_DECISIONS`]), deciding it in order on one
    /// state (each decision sees the records of those before it) and committing all their
    /// records as one entry. A node's thousands of partition elections after a restart are a
    /// few rounds, not thousands of leadership checks and commits one after another. The round
    /// runs to its end even when callers stop waiting (an RPC deadline): the next one must not
    /// be decided on a state without records that may still commit, which would put two
    /// decisions built on the same state in the log.
    pub async fn decide<T: 'static>(
        &self,
        now_ms: i64,
        decide: impl FnOnce(&ClusterState, &mut Liveness) -> Result<(Vec<Record>, T), AdminError> + 'static,
    ) -> Result<T, ControllerError> {
        let (answer, answered) = oneshot::channel();
        self.rounds.queue.borrow_mut().push_back(Box::new(Decision {
            decide: Some(decide),
            outcome: None,
            answer,
        }));
        self.rounds.now_ms.set(now_ms);
        if !self.rounds.running.replace(true) {
            let rounds = Rc::clone(&self.rounds);
            drop(Rt::spawn(rounds.run()));
        }
        answered.await.unwrap_or_else(|_| {
            Err(ControllerError::Failed(
                "the decision round ended unanswered".into(),
            ))
        })
    }

    /// Records that `broker`'s heartbeat at `epoch` arrived now (see [`Liveness::touch`]),
    /// before its decision waits for a round.
    pub fn touch(&self, broker: NodeId, epoch: BrokerEpoch, now_ms: i64) {
        let state = self.rounds.applier.state();
        let mut liveness = self.rounds.liveness.borrow_mut();
        liveness
            .1
            .touch(&state, broker, epoch, u64::try_from(now_ms).unwrap_or(0));
    }

    /// The applier, for brokers that fetch the metadata.
    pub fn applier(&self) -> &MetadataApplier {
        &self.rounds.applier
    }

    /// The offset the next metadata record takes here.
    pub fn next_offset(&self) -> MetadataOffset {
        self.rounds.applier.state().next_offset()
    }

    /// The quorum as its leader sees it (DescribeQuorum); a controller that is not the leader
    /// refuses with the leader it knows of. `now_ms`: the wall clock now.
    pub fn describe(&self, now_ms: i64) -> Result<QuorumView, ControllerError> {
        let m = self.rounds.raft.metrics();
        let m = m.borrow_watched();
        if m.current_leader != Some(self.rounds.id) {
            return Err(ControllerError::NotController {
                leader: m.current_leader,
            });
        }
        let replication = m.replication.clone().unwrap_or_default();
        let heartbeat = m.heartbeat.clone().unwrap_or_default();
        let last_index = m.last_log_index;
        // The wall-clock time of something `ago`; -1 when unknown.
        let wall = |ago: Option<std::time::Duration>| {
            ago.map_or(-1, |ago| {
                now_ms.saturating_sub(i64::try_from(ago.as_millis()).unwrap_or(i64::MAX))
            })
        };
        let offset = |index: Option<u64>| index.and_then(|i| self.store.offset_after(i)).map_or(-1, |o| o.0);
        let voters = m
            .membership_config
            .membership()
            .voter_ids()
            .filter_map(|id| Some((id, NodeId(i32::try_from(id.0).ok()?))))
            .map(|(id, node)| {
                if id == self.rounds.id {
                    return ReplicaProgress {
                        id: node,
                        log_end_offset: self.store.log_end_offset().0,
                        last_fetch_ms: now_ms,
                        last_caught_up_ms: now_ms,
                    };
                }
                let matched = replication.get(&id).copied().flatten().map(|l| l.index);
                let heard = wall(
                    heartbeat
                        .get(&id)
                        .and_then(|at| at.as_ref())
                        .map(|at| at.elapsed()),
                );
                ReplicaProgress {
                    id: node,
                    log_end_offset: offset(matched),
                    last_fetch_ms: heard,
                    last_caught_up_ms: if matched.is_some() && matched == last_index {
                        heard
                    } else {
                        -1
                    },
                }
            })
            .collect();
        Ok(QuorumView {
            leader: NodeId(i32::try_from(self.rounds.id.0).unwrap_or(-1)),
            term: m.current_term,
            high_watermark: self.store.high_watermark().0,
            voters,
        })
    }
}

/// The quorum as its leader describes it (DescribeQuorum).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuorumView {
    pub leader: NodeId,
    /// The leader's Raft term: the quorum's leader epoch.
    pub term: u64,
    /// The offset after the last committed metadata record.
    pub high_watermark: i64,
    pub voters: Vec<ReplicaProgress>,
}

/// A voter's progress as the leader knows it; -1 where it does not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaProgress {
    pub id: NodeId,
    /// The offset after the last record the leader knows the voter holds.
    pub log_end_offset: i64,
    /// When the voter last acknowledged the leader's appends or heartbeats (ms since the epoch).
    pub last_fetch_ms: i64,
    /// When it last did so holding everything the leader holds; -1 if it does not now.
    pub last_caught_up_ms: i64,
}

impl<Rt: AsyncRuntime, L: ReplicaLog> Rounds<Rt, L> {
    /// Runs rounds until nothing is queued.
    async fn run(self: Rc<Self>) {
        loop {
            let mut round: Vec<Box<dyn Pending>> = {
                let mut queue = self.queue.borrow_mut();
                let n = queue.len().min(MAX_ROUND_DECISIONS);
                queue.drain(..n).collect()
            };
            if round.is_empty() {
                self.running.set(false);
                return;
            }
            metrics::histogram!("strand_controller_round_decisions").record(round.len() as f64);
            let started = std::time::Instant::now();
            let outcome = self.round(&mut round).await;
            metrics::histogram!("strand_controller_round_seconds").record(started.elapsed().as_secs_f64());
            for pending in round {
                pending.finish(outcome.clone());
            }
        }
    }

    /// Decides `round` and commits its records.
    async fn round(&self, round: &mut [Box<dyn Pending>]) -> Result<(), ControllerError> {
        // Bounded: the decisions wait on this round, and a leadership check that is never
        // answered (a quorum acknowledgement that does not come) must not stop them all.
        let confirmed = Rt::timeout(
            READ_INDEX_WAIT,
            self.raft.ensure_linearizable(ReadPolicy::ReadIndex),
        )
        .await
        .map_err(|_| {
            tracing::warn!(
                "controller {}: a quorum did not confirm its leadership within {READ_INDEX_WAIT:?}",
                self.id
            );
            ControllerError::NotController { leader: None }
        })?;
        confirmed.map_err(|e| match e {
            RaftError::APIError(LinearizableReadError::ForwardToLeader(f)) => {
                ControllerError::NotController { leader: f.leader_id }
            }
            // No quorum to confirm leadership: another controller may lead.
            RaftError::APIError(LinearizableReadError::QuorumNotEnough(_)) => {
                ControllerError::NotController { leader: None }
            }
            RaftError::Fatal(f) => ControllerError::Failed(f.to_string()),
        })?;
        // A controller newly elected holds entries of earlier terms that may not be applied yet
        // (its own from before a restart among them), and the read index may not cover them: a
        // decision made now would be built on a state older than entries that will commit
        // before it. Its whole log is applied first.
        let (term, last_log) = {
            use openraft::async_runtime::WatchReceiver;
            let m = self.raft.metrics();
            let m = m.borrow_watched();
            (m.current_term, m.last_log_index)
        };
        self.raft
            .wait(Some(LOG_APPLIED_WAIT))
            .applied_index_at_least(last_log, "the controller's log applied")
            .await
            .map_err(|_| ControllerError::NotController { leader: None })?;
        let records = {
            let state = self.applier.state();
            let mut liveness = self.liveness.borrow_mut();
            if liveness.0 != term {
                *liveness = (
                    term,
                    Liveness::activate(&state, u64::try_from(self.now_ms.get()).unwrap_or(0)),
                );
            }
            // Each decision is shown the state with the records of those before it applied
            // (a copy taken at the first record: a round of heartbeats copies nothing).
            let mut scratch: Option<ClusterState> = None;
            let mut records = Vec::new();
            for pending in round.iter_mut() {
                let decided = pending.decide(scratch.as_ref().unwrap_or(&state), &mut liveness.1);
                if decided.is_empty() {
                    continue;
                }
                let s = scratch.get_or_insert_with(|| state.clone());
                for r in &decided {
                    s.apply(r);
                }
                records.extend(decided);
            }
            if cfg!(debug_assertions) {
                if let Some(s) = &scratch {
                    s.check_invariants();
                }
            }
            records
        };
        if records.is_empty() {
            return Ok(());
        }
        let expected = self.applier.state().next_offset();
        let batch = KafkaBatch(decision_batch(&records, self.now_ms.get()));
        let written = self.raft.client_write(batch.into()).await.map_err(|e| match e {
            RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => {
                ControllerError::NotController { leader: f.leader_id }
            }
            RaftError::APIError(e) => ControllerError::Failed(e.to_string()),
            RaftError::Fatal(f) => ControllerError::Failed(f.to_string()),
        })?;
        match written.data {
            Applied::Batch { base_offset } if u64::try_from(base_offset.0).ok() == Some(expected.0) => Ok(()),
            other => Err(ControllerError::Failed(format!(
                "controller {}: the decision landed at {other:?}, expected metadata offset {}",
                self.id, expected.0
            ))),
        }
    }
}

#[cfg(test)]
mod tests;
