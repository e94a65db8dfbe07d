//! openraft's network traits for partition groups, over any [`Connection`].
//!
//! Sending side: [`NodeNetwork`] is one per node and holds the node's [`Connection`] to its
//! peers and the [`HeartbeatOutbox`]. Each group gets a [`GroupNetworkFactory`] from it; the
//! factory's clients ([`GroupNetwork`]) turn openraft's requests into [`Message`]s and the
//! answers back. Clients made by `new_heartbeat_client` queue their (entry-less) append-entries
//! in the outbox instead of sending them; [`NodeNetwork::tick`] sends each peer's queue as one
//! frame. Append-entries larger than the frame bound are cut to the longest prefix of entries
//! that fits and answered `PartialSuccess` with the prefix's last log id, which openraft
//! continues from. A full snapshot goes out in chunks of at most `snapshot_chunk_bytes` of
//! batches, one frame each, each acknowledged before the next.
//!
//! Receiving side: [`Server::handle`] takes a request from a peer, hands it to the group's
//! [`Raft`] (found through [`GroupRafts`]) and returns the answer: a coalesced heartbeat frame
//! is split into one empty append-entries per group and the answers merged; snapshot chunks are
//! assembled per (peer, group) within a byte bound and installed when the last one arrives.
//! Appends and snapshots that break rules openraft assumes but does not check in release
//! builds (entries out of order, log ids beyond the leader's term) are refused before they
//! reach the group.
//!
//! The connection is the part that differs between the broker (TCP) and the simulation (an
//! in-memory network): anything that can send a request message to a peer and return its
//! answer.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::rc::Rc;
use std::time::Duration;

use futures_channel::oneshot;
use openraft::error::{NetworkError, RPCError, ReplicationClosed, StreamingError, Timeout, Unreachable};
use openraft::network::RPCOption;
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, TransferLeaderRequest,
    TransferLeaderResponse, VoteRequest, VoteResponse,
};
use openraft::storage::RaftStateMachine;
use openraft::{AsyncRuntime, EntryPayload, RPCTypes, Raft, RaftNetworkFactory, RaftNetworkV2, Snapshot};

use strand_storage::notify::Notify;

use super::codec::{
    AppendMsg, AppendReply, Codec, GroupId, Heartbeat, Message, PartitionVote, RefuseReason, SnapshotChunk,
    SnapshotReply, TransferLeaderMsg, TransferLeaderRejected, VoteMsg, VoteReply,
};
use super::heartbeat::{HeartbeatOutbox, HeartbeatOutcome, OutboxLimits, PushError, ReplyMerger};
use crate::partition::{
    BrokerId, EntryData, KafkaBatch, PartitionLogId, PartitionRaft, PartitionSnapshot, StoredBatch,
    StoredSide,
};

type C<Rt> = PartitionRaft<Rt>;

/// Why a request got no answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnectionError {
    /// The peer cannot be reached now (no connection, backing off): openraft waits before
    /// retrying.
    Unreachable(String),
    /// The request was sent but its answer was lost (connection broke, peer misbehaved).
    Network(String),
}

impl fmt::Display for ConnectionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConnectionError::Unreachable(why) => write!(f, "unreachable: {why}"),
            ConnectionError::Network(why) => write!(f, "network: {why}"),
        }
    }
}

impl std::error::Error for ConnectionError {}

/// A node's connections to its peers: send one request, await its answer. The implementation
/// frames the message with the [`Codec`], picks the request id and matches the answer by it.
pub trait Connection: 'static {
    fn call(
        &self,
        peer: BrokerId,
        request: Message,
    ) -> impl Future<Output = Result<Message, ConnectionError>>;
}

/// Settings of a node's network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetworkConfig {
    pub codec: Codec,
    pub heartbeats: OutboxLimits,
    /// How long a coalesced heartbeat frame may wait for its answer.
    pub heartbeat_timeout: Duration,
    /// Bytes of batches per snapshot chunk: a chunk holds up to this many, or one larger batch.
    /// Below half the frame bound.
    pub snapshot_chunk_bytes: usize,
}

impl Default for NetworkConfig {
    fn default() -> Self {
        NetworkConfig {
            codec: Codec::default(),
            heartbeats: OutboxLimits::default(),
            heartbeat_timeout: Duration::from_millis(1_000),
            snapshot_chunk_bytes: 4 << 20,
        }
    }
}

/// The sending side of one node: its connection and its heartbeat outbox, shared by the
/// network factories of all its groups.
pub struct NodeNetwork<Rt, Conn> {
    local: BrokerId,
    conn: Conn,
    config: NetworkConfig,
    heartbeats: RefCell<HeartbeatOutbox<oneshot::Sender<HeartbeatOutcome>>>,
    /// Notified when a heartbeat joins the outbox ([`Self::heartbeats_queued`]).
    heartbeat_queued: Notify,
    _rt: PhantomData<fn() -> Rt>,
}

impl<Rt: AsyncRuntime, Conn: Connection> NodeNetwork<Rt, Conn> {
    pub fn new(local: BrokerId, conn: Conn, config: NetworkConfig) -> Rc<Self> {
        assert!(
            config.snapshot_chunk_bytes > 0,
            "snapshot chunks must carry bytes"
        );
        Rc::new(NodeNetwork {
            local,
            conn,
            heartbeats: RefCell::new(HeartbeatOutbox::new(config.heartbeats)),
            heartbeat_queued: Notify::new(),
            config,
            _rt: PhantomData,
        })
    }

    /// The network factory of one of this node's groups.
    pub fn factory(self: &Rc<Self>, group: GroupId) -> GroupNetworkFactory<Rt, Conn> {
        GroupNetworkFactory {
            group,
            node: Rc::clone(self),
        }
    }

    pub fn connection(&self) -> &Conn {
        &self.conn
    }

    /// Completes once the heartbeat outbox holds a heartbeat (at once if it does now). A
    /// ticker waits on it between ticks, so that a node whose groups are all quiesced does not
    /// wake every tick for nothing.
    pub async fn heartbeats_queued(&self) {
        loop {
            let queued = self.heartbeat_queued.wait();
            if self.heartbeats.borrow().queued() > 0 {
                return;
            }
            queued.await;
        }
    }

    /// Sends everything the heartbeat outbox holds, one frame per peer (or more, past the
    /// per-frame bound), each in a task of its own. Returns the number of frames sent.
    ///
    /// Call it once per tick. A heartbeat waits in the outbox up to one tick, and openraft
    /// gives it three quarters of `heartbeat_interval` to be answered, so the tick must be a
    /// small fraction of the interval (the tests use a fifth).
    pub fn tick(self: &Rc<Self>) -> usize {
        let batches = self.heartbeats.borrow_mut().drain_for_tick();
        let sent = batches.len();
        for b in batches {
            let node = Rc::clone(self);
            let timeout = self.config.heartbeat_timeout;
            let _detached = Rt::spawn(async move {
                let call = node.conn.call(b.peer, Message::Heartbeats(b.heartbeats));
                let answer = Rt::timeout(timeout, call).await;
                let mut outbox = node.heartbeats.borrow_mut();
                match answer {
                    Ok(Ok(Message::HeartbeatReplies(replies))) => {
                        for (w, outcome) in outbox.on_response(b.batch, replies) {
                            let _ = w.send(outcome);
                        }
                    }
                    other => {
                        if let Ok(Ok(m)) = &other {
                            tracing::warn!(peer = %b.peer, "unexpected answer to heartbeats: {m:?}");
                        }
                        for w in outbox.on_failure(b.batch) {
                            let _ = w.send(HeartbeatOutcome::Failed);
                        }
                    }
                }
            });
        }
        sent
    }

    fn timeout_error(&self, action: RPCTypes, target: BrokerId, timeout: Duration) -> RPCError<C<Rt>> {
        RPCError::Timeout(Timeout {
            action,
            id: self.local,
            target,
            timeout,
        })
    }

    /// Sends one request within the option's soft deadline.
    async fn call(
        &self,
        action: RPCTypes,
        target: BrokerId,
        request: Message,
        option: &RPCOption,
    ) -> Result<Message, RPCError<C<Rt>>> {
        let ttl = option.soft_ttl();
        match Rt::timeout(ttl, self.conn.call(target, request)).await {
            Err(_) => Err(self.timeout_error(action, target, ttl)),
            Ok(Err(e)) => Err(connection_error(e)),
            Ok(Ok(m)) => Ok(m),
        }
    }
}

fn connection_error<Rt: AsyncRuntime>(e: ConnectionError) -> RPCError<C<Rt>> {
    match e {
        ConnectionError::Unreachable(_) => RPCError::Unreachable(Unreachable::new(&e)),
        ConnectionError::Network(_) => RPCError::Network(NetworkError::new(&e)),
    }
}

fn unexpected<Rt: AsyncRuntime>(group: GroupId, answer: &Message) -> RPCError<C<Rt>> {
    match answer {
        Message::Refused { reason, .. } => {
            let e = ConnectionError::Unreachable(format!("group {group} refused: {reason:?}"));
            RPCError::Unreachable(Unreachable::new(&e))
        }
        other => {
            let e = ConnectionError::Network(format!("unexpected answer for group {group}: {other:?}"));
            RPCError::Network(NetworkError::new(&e))
        }
    }
}

fn streaming<Rt: AsyncRuntime>(e: RPCError<C<Rt>>) -> StreamingError<C<Rt>> {
    match e {
        RPCError::Timeout(t) => StreamingError::Timeout(t),
        RPCError::Unreachable(u) => StreamingError::Unreachable(u),
        RPCError::Network(n) => StreamingError::Network(n),
        RPCError::RemoteError(r) => StreamingError::Network(NetworkError::new(&r)),
    }
}

/// openraft's network factory for one group on one node.
pub struct GroupNetworkFactory<Rt, Conn> {
    group: GroupId,
    node: Rc<NodeNetwork<Rt, Conn>>,
}

impl<Rt: AsyncRuntime, Conn: Connection> GroupNetworkFactory<Rt, Conn> {
    fn client(&self, target: BrokerId, heartbeat: bool) -> GroupNetwork<Rt, Conn> {
        GroupNetwork {
            group: self.group,
            target,
            heartbeat,
            node: Rc::clone(&self.node),
        }
    }
}

impl<Rt: AsyncRuntime, Conn: Connection> RaftNetworkFactory<C<Rt>> for GroupNetworkFactory<Rt, Conn> {
    type Network = GroupNetwork<Rt, Conn>;

    async fn new_client(&mut self, target: BrokerId, _node: &()) -> Self::Network {
        self.client(target, false)
    }

    async fn new_heartbeat_client(&mut self, target: BrokerId, _node: &()) -> Self::Network {
        self.client(target, true)
    }
}

/// openraft's client from one group's replica to the same group's replica on `target`.
pub struct GroupNetwork<Rt, Conn> {
    group: GroupId,
    target: BrokerId,
    /// Entry-less append-entries are coalesced (the client `new_heartbeat_client` made).
    heartbeat: bool,
    node: Rc<NodeNetwork<Rt, Conn>>,
}

impl<Rt: AsyncRuntime, Conn: Connection> GroupNetwork<Rt, Conn> {
    /// Sends a vote or pre-vote request and reads its answer.
    async fn ask_vote(
        &self,
        request: Message,
        option: &RPCOption,
    ) -> Result<VoteResponse<C<Rt>>, RPCError<C<Rt>>> {
        let answer = self
            .node
            .call(RPCTypes::Vote, self.target, request, option)
            .await?;
        match answer {
            Message::VoteReply { group, reply } if group == self.group => Ok(vote_response(reply)),
            other => Err(unexpected(self.group, &other)),
        }
    }

    async fn heartbeat(&self, req: AppendMsg, option: &RPCOption) -> Result<AppendReply, RPCError<C<Rt>>> {
        let (tx, rx) = oneshot::channel();
        let hb = Heartbeat {
            group: self.group,
            vote: req.vote,
            prev_log_id: req.prev_log_id,
            leader_commit: req.leader_commit,
        };
        let pushed = self.node.heartbeats.borrow_mut().push(self.target, hb, tx);
        match pushed {
            Ok(Some(superseded)) => {
                let _ = superseded.send(HeartbeatOutcome::Failed);
            }
            Ok(None) => self.node.heartbeat_queued.notify_all(),
            Err(PushError::Full(_)) => {
                let e = ConnectionError::Unreachable(format!("heartbeat queue to {} is full", self.target));
                return Err(RPCError::Unreachable(Unreachable::new(&e)));
            }
        }
        let ttl = option.soft_ttl();
        match Rt::timeout(ttl, rx).await {
            Err(_) => Err(self.node.timeout_error(RPCTypes::AppendEntries, self.target, ttl)),
            Ok(Err(oneshot::Canceled)) | Ok(Ok(HeartbeatOutcome::Failed)) => {
                let e = ConnectionError::Network("heartbeat frame lost".into());
                Err(RPCError::Network(NetworkError::new(&e)))
            }
            Ok(Ok(HeartbeatOutcome::NoReply)) => {
                let e = ConnectionError::Unreachable(format!(
                    "{} did not answer for group {}",
                    self.target, self.group
                ));
                Err(RPCError::Unreachable(Unreachable::new(&e)))
            }
            Ok(Ok(HeartbeatOutcome::Reply(r))) => Ok(r),
        }
    }

    /// How many of `req`'s entries fit one frame (all of them, usually).
    fn entries_that_fit(&self, group: GroupId, req: &AppendMsg) -> usize {
        let codec = self.node.config.codec;
        let empty = Message::Append {
            group,
            req: AppendMsg {
                vote: req.vote,
                prev_log_id: req.prev_log_id,
                leader_commit: req.leader_commit,
                entries: Vec::new(),
            },
        };
        let mut size = codec.encoded_len(&empty) - super::codec::LENGTH_PREFIX_BYTES;
        let mut n = 0;
        for e in &req.entries {
            size += super::codec::entry_len(e);
            if size > codec.max_frame_bytes() as usize {
                break;
            }
            n += 1;
        }
        n
    }
}

impl<Rt: AsyncRuntime, Conn: Connection> RaftNetworkV2<C<Rt>> for GroupNetwork<Rt, Conn> {
    type SnapshotData = PartitionSnapshot;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<C<Rt>>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<C<Rt>>, RPCError<C<Rt>>> {
        let mut req = AppendMsg {
            vote: rpc.vote,
            prev_log_id: rpc.prev_log_id,
            leader_commit: rpc.leader_commit,
            entries: rpc.entries,
        };
        if self.heartbeat && req.entries.is_empty() {
            return self.heartbeat(req, &option).await.map(append_response);
        }
        let fit = self.entries_that_fit(self.group, &req);
        let cut = fit < req.entries.len();
        if cut {
            if fit == 0 {
                let e = ConnectionError::Network(format!(
                    "an entry of group {} does not fit a frame of {} bytes",
                    self.group,
                    self.node.config.codec.max_frame_bytes()
                ));
                return Err(RPCError::Network(NetworkError::new(&e)));
            }
            req.entries.truncate(fit);
        }
        let last = req.entries.last().map(|e| e.log_id);
        let request = Message::Append {
            group: self.group,
            req,
        };
        let answer = self
            .node
            .call(RPCTypes::AppendEntries, self.target, request, &option)
            .await?;
        match answer {
            Message::AppendReply { group, reply } if group == self.group => Ok(match reply {
                AppendReply::Success if cut => AppendEntriesResponse::PartialSuccess(last),
                r => append_response(r),
            }),
            other => Err(unexpected(self.group, &other)),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<C<Rt>>,
        option: RPCOption,
    ) -> Result<VoteResponse<C<Rt>>, RPCError<C<Rt>>> {
        let request = Message::Vote {
            group: self.group,
            req: vote_msg(rpc),
        };
        self.ask_vote(request, &option).await
    }

    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<C<Rt>>,
        option: RPCOption,
    ) -> Result<VoteResponse<C<Rt>>, RPCError<C<Rt>>> {
        let request = Message::PreVote {
            group: self.group,
            req: vote_msg(rpc),
        };
        self.ask_vote(request, &option).await
    }

    async fn full_snapshot(
        &mut self,
        vote: PartitionVote,
        snapshot: Snapshot<
            openraft::vote::leader_id_std::CommittedLeaderId<u64>,
            BrokerId,
            (),
            PartitionSnapshot,
        >,
        cancel: impl Future<Output = ReplicationClosed> + openraft::OptionalSend + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<C<Rt>>, StreamingError<C<Rt>>> {
        let chunks = snapshot_chunks(vote, snapshot, self.node.config.snapshot_chunk_bytes);
        let send = async {
            let total = chunks.len();
            let mut reply_vote = vote;
            for chunk in chunks {
                let last = chunk.last;
                let request = Message::Snapshot {
                    group: self.group,
                    chunk,
                };
                let answer = self
                    .node
                    .call(RPCTypes::InstallSnapshot, self.target, request, &option)
                    .await
                    .map_err(streaming)?;
                match answer {
                    Message::SnapshotReply { group, reply } if group == self.group => {
                        reply_vote = reply.vote;
                        // A receiver that saw a higher vote stops the transfer: openraft reads
                        // the vote and steps down.
                        if last || reply.vote > vote {
                            return Ok(SnapshotResponse::new(reply.vote));
                        }
                    }
                    other => return Err(streaming(unexpected(self.group, &other))),
                }
            }
            debug_assert!(total > 0, "a snapshot always has a last chunk");
            Ok(SnapshotResponse::new(reply_vote))
        };
        let cancel = std::pin::pin!(cancel);
        let send = std::pin::pin!(send);
        match futures::future::select(cancel, send).await {
            futures::future::Either::Left((closed, _)) => Err(StreamingError::Closed(closed)),
            futures::future::Either::Right((res, _)) => res,
        }
    }

    async fn transfer_leader(
        &mut self,
        req: TransferLeaderRequest<C<Rt>>,
        option: RPCOption,
    ) -> Result<TransferLeaderResponse<C<Rt>>, RPCError<C<Rt>>> {
        let request = Message::TransferLeader {
            group: self.group,
            req: TransferLeaderMsg {
                from_leader: *req.from_leader(),
                to_node: *req.to_node_id(),
                last_log_id: req.last_log_id().copied(),
            },
        };
        let answer = self
            .node
            .call(RPCTypes::TransferLeader, self.target, request, &option)
            .await?;
        match answer {
            Message::TransferLeaderReply { group, reply } if group == self.group => {
                Ok(reply.map_err(|r| match r {
                    TransferLeaderRejected::VoteChanged { expected, actual } => {
                        openraft::raft::TransferLeaderError::VoteChanged { expected, actual }
                    }
                    TransferLeaderRejected::LogNotFlushed { expected, actual } => {
                        openraft::raft::TransferLeaderError::LogNotFlushed { expected, actual }
                    }
                }))
            }
            other => Err(unexpected(self.group, &other)),
        }
    }
}

fn vote_msg<Rt: AsyncRuntime>(rpc: VoteRequest<C<Rt>>) -> VoteMsg {
    VoteMsg {
        vote: rpc.vote,
        last_log_id: rpc.last_log_id,
        leadership_transfer: rpc.leadership_transfer,
    }
}

fn vote_response<Rt: AsyncRuntime>(r: VoteReply) -> VoteResponse<C<Rt>> {
    VoteResponse {
        vote: r.vote,
        vote_granted: r.granted,
        last_log_id: r.last_log_id,
    }
}

fn append_response<Rt: AsyncRuntime>(r: AppendReply) -> AppendEntriesResponse<C<Rt>> {
    match r {
        AppendReply::Success => AppendEntriesResponse::Success,
        AppendReply::PartialSuccess(id) => AppendEntriesResponse::PartialSuccess(id),
        AppendReply::Conflict => AppendEntriesResponse::Conflict,
        AppendReply::HigherVote(v) => AppendEntriesResponse::HigherVote(v),
    }
}

fn append_reply<Rt: AsyncRuntime>(r: AppendEntriesResponse<C<Rt>>) -> AppendReply {
    match r {
        AppendEntriesResponse::Success => AppendReply::Success,
        AppendEntriesResponse::PartialSuccess(id) => AppendReply::PartialSuccess(id),
        AppendEntriesResponse::Conflict => AppendReply::Conflict,
        AppendEntriesResponse::HigherVote(v) => AppendReply::HigherVote(v),
    }
}

/// Cuts a snapshot into chunks of about `chunk_bytes` of batches each, then of side records (a
/// batch or record larger than that gets a chunk of its own); there is always at least one
/// chunk, the last.
fn snapshot_chunks(
    vote: PartitionVote,
    snapshot: Snapshot<
        openraft::vote::leader_id_std::CommittedLeaderId<u64>,
        BrokerId,
        (),
        PartitionSnapshot,
    >,
    chunk_bytes: usize,
) -> Vec<SnapshotChunk> {
    let Snapshot { meta, snapshot } = snapshot;
    let mut groups: Vec<(Vec<StoredBatch>, Vec<StoredSide>)> = vec![(Vec::new(), Vec::new())];
    let mut size = 0;
    let start_chunk =
        |size: &mut usize, len: usize, groups: &mut Vec<(Vec<StoredBatch>, Vec<StoredSide>)>| {
            if *size > 0 && *size + len > chunk_bytes {
                groups.push((Vec::new(), Vec::new()));
                *size = 0;
            }
            *size += len;
        };
    for b in snapshot.batches {
        start_chunk(&mut size, b.bytes.len(), &mut groups);
        if let Some(g) = groups.last_mut() {
            g.0.push(b);
        }
    }
    for r in snapshot.side {
        start_chunk(&mut size, r.record.data.len(), &mut groups);
        if let Some(g) = groups.last_mut() {
            g.1.push(r);
        }
    }
    let n = groups.len();
    groups
        .into_iter()
        .enumerate()
        .map(|(i, (batches, side))| SnapshotChunk {
            vote,
            meta: meta.clone(),
            next_offset: snapshot.next_offset,
            chunk_index: u32::try_from(i).unwrap_or(u32::MAX),
            last: i + 1 == n,
            batches,
            side,
        })
        .collect()
}

/// Finds the Raft of a group this node holds a replica of.
pub trait GroupRafts<Rt: AsyncRuntime>: 'static {
    type StateMachine: RaftStateMachine<C<Rt>, SnapshotData = PartitionSnapshot>;

    fn raft(&self, group: GroupId) -> Option<Raft<C<Rt>, Self::StateMachine>>;
}

/// Bounds of the receiving side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerLimits {
    /// Batch bytes of one snapshot being assembled.
    pub max_snapshot_bytes: usize,
    /// Snapshots being assembled at once (over all peers and groups); past it the oldest
    /// transfer is dropped (its sender gets a refusal at its next chunk and starts over).
    pub max_snapshot_assemblies: usize,
}

impl Default for ServerLimits {
    fn default() -> Self {
        ServerLimits {
            max_snapshot_bytes: 1 << 30,
            max_snapshot_assemblies: 16,
        }
    }
}

/// A snapshot being received: the first chunk, with the later chunks' batches appended.
struct Assembly {
    vote: PartitionVote,
    chunk: SnapshotChunk,
    next_index: u32,
    bytes: usize,
    /// Order of the first chunk's arrival, to evict the oldest transfer at the bound.
    started: u64,
}

/// The receiving side of one node: answers its peers' requests through the groups' Rafts.
pub struct Server<Rt, G> {
    groups: G,
    limits: ServerLimits,
    snapshots: RefCell<BTreeMap<(BrokerId, GroupId), Assembly>>,
    next_assembly: Cell<u64>,
    _rt: PhantomData<fn() -> Rt>,
}

impl<Rt: AsyncRuntime, G: GroupRafts<Rt>> Server<Rt, G> {
    pub fn new(groups: G, limits: ServerLimits) -> Self {
        Server {
            groups,
            limits,
            snapshots: RefCell::new(BTreeMap::new()),
            next_assembly: Cell::new(0),
            _rt: PhantomData,
        }
    }

    pub fn groups(&self) -> &G {
        &self.groups
    }

    /// Answers one request from `from`. Answers are never themselves requests; a message that
    /// is not a request is answered `Refused(Unsupported)`.
    pub async fn handle(&self, from: BrokerId, request: Message) -> Message {
        let refused = |group, reason| Message::Refused { group, reason };
        match request {
            Message::Vote { group, req } => self.vote(group, req, false).await,
            Message::PreVote { group, req } => self.vote(group, req, true).await,
            Message::Append { group, req } => {
                let Some(raft) = self.groups.raft(group) else {
                    return refused(group, RefuseReason::UnknownGroup);
                };
                if let Err(why) = check_append(&req) {
                    tracing::warn!(%group, "refusing an append from node {from}: {why}");
                    return refused(group, RefuseReason::Invalid);
                }
                match raft.append_entries(append_request(req)).await {
                    Ok(r) => Message::AppendReply {
                        group,
                        reply: append_reply(r),
                    },
                    Err(_) => refused(group, RefuseReason::Unavailable),
                }
            }
            Message::Heartbeats(heartbeats) => {
                let (mut merger, split) = ReplyMerger::split(heartbeats);
                let answers = futures::future::join_all(split.into_iter().map(|h| async move {
                    let raft = self.groups.raft(h.group)?;
                    let req = AppendMsg {
                        vote: h.vote,
                        prev_log_id: h.prev_log_id,
                        leader_commit: h.leader_commit,
                        entries: Vec::new(),
                    };
                    // An invalid heartbeat gets no answer (the sender reads it as none).
                    check_append(&req).ok()?;
                    let r = raft.append_entries(append_request(req)).await.ok()?;
                    Some((h.group, append_reply(r)))
                }))
                .await;
                for (group, reply) in answers.into_iter().flatten() {
                    merger.add(group, reply);
                }
                Message::HeartbeatReplies(merger.finish())
            }
            Message::Snapshot { group, chunk } => self.snapshot_chunk(from, group, chunk).await,
            Message::TransferLeader { group, req } => {
                let Some(raft) = self.groups.raft(group) else {
                    return refused(group, RefuseReason::UnknownGroup);
                };
                let req = TransferLeaderRequest::new(req.from_leader, req.to_node, req.last_log_id);
                match raft.handle_transfer_leader(req).await {
                    Ok(reply) => Message::TransferLeaderReply {
                        group,
                        reply: reply.map_err(|e| match e {
                            openraft::raft::TransferLeaderError::VoteChanged { expected, actual } => {
                                TransferLeaderRejected::VoteChanged { expected, actual }
                            }
                            openraft::raft::TransferLeaderError::LogNotFlushed { expected, actual } => {
                                TransferLeaderRejected::LogNotFlushed { expected, actual }
                            }
                        }),
                    },
                    Err(_) => refused(group, RefuseReason::Unavailable),
                }
            }
            Message::VoteReply { group, .. }
            | Message::AppendReply { group, .. }
            | Message::SnapshotReply { group, .. }
            | Message::TransferLeaderReply { group, .. }
            | Message::Refused { group, .. } => refused(group, RefuseReason::Unsupported),
            Message::HeartbeatReplies(_) => Message::HeartbeatReplies(Vec::new()),
            // Connections answer hellos themselves; a server has nothing to add.
            Message::Hello { node, shard } => Message::Hello { node, shard },
            // Control requests belong to the layer above, which answers them before they reach
            // the groups' server.
            Message::Control { .. } | Message::ControlReply(_) => Message::ControlReply(None),
        }
    }

    async fn vote(&self, group: GroupId, req: VoteMsg, pre: bool) -> Message {
        let Some(raft) = self.groups.raft(group) else {
            return Message::Refused {
                group,
                reason: RefuseReason::UnknownGroup,
            };
        };
        let rpc = VoteRequest {
            vote: req.vote,
            last_log_id: req.last_log_id,
            leadership_transfer: req.leadership_transfer,
        };
        let answer = if pre {
            raft.pre_vote(rpc).await
        } else {
            raft.vote(rpc).await
        };
        match answer {
            Ok(r) => Message::VoteReply {
                group,
                reply: VoteReply {
                    vote: r.vote,
                    granted: r.vote_granted,
                    last_log_id: r.last_log_id,
                },
            },
            Err(_) => Message::Refused {
                group,
                reason: RefuseReason::Unavailable,
            },
        }
    }

    async fn snapshot_chunk(&self, from: BrokerId, group: GroupId, chunk: SnapshotChunk) -> Message {
        let refused = |reason| Message::Refused { group, reason };
        let Some(raft) = self.groups.raft(group) else {
            return refused(RefuseReason::UnknownGroup);
        };
        if let Err(why) = check_snapshot(&chunk) {
            tracing::warn!(%group, "refusing a snapshot chunk from node {from}: {why}");
            self.snapshots.borrow_mut().remove(&(from, group));
            return refused(RefuseReason::Invalid);
        }
        let vote = chunk.vote;
        let key = (from, group);
        let complete = {
            let mut snapshots = self.snapshots.borrow_mut();
            let bytes: usize = chunk.batches.iter().map(|b| b.bytes.len()).sum::<usize>()
                + chunk.side.iter().map(|r| r.record.data.len()).sum::<usize>();
            if chunk.chunk_index == 0 {
                // A first chunk restarts the peer's transfer of this group.
                snapshots.remove(&key);
                if bytes > self.limits.max_snapshot_bytes {
                    return refused(RefuseReason::Unavailable);
                }
                if snapshots.len() >= self.limits.max_snapshot_assemblies {
                    // A transfer whose sender went away is never finished: the oldest gives way.
                    let oldest = snapshots.iter().min_by_key(|(_, a)| a.started).map(|(k, _)| *k);
                    if let Some(k) = oldest {
                        snapshots.remove(&k);
                    }
                }
                let started = self.next_assembly.get();
                self.next_assembly.set(started + 1);
                let last = chunk.last;
                let assembly = Assembly {
                    vote,
                    next_index: 1,
                    bytes,
                    started,
                    chunk,
                };
                if last {
                    Some(assembly)
                } else {
                    snapshots.insert(key, assembly);
                    None
                }
            } else {
                let Some(a) = snapshots.get_mut(&key) else {
                    return refused(RefuseReason::Unavailable);
                };
                let fits = a.bytes.saturating_add(bytes) <= self.limits.max_snapshot_bytes;
                if a.vote != vote || a.next_index != chunk.chunk_index || a.chunk.meta != chunk.meta || !fits
                {
                    snapshots.remove(&key);
                    return refused(RefuseReason::Unavailable);
                }
                a.bytes += bytes;
                a.next_index += 1;
                a.chunk.batches.extend(chunk.batches);
                a.chunk.side.extend(chunk.side);
                if chunk.last {
                    snapshots.remove(&key)
                } else {
                    None
                }
            }
        };
        let Some(a) = complete else {
            // Acknowledge the chunk; the receiver's vote is checked once, at install.
            return Message::SnapshotReply {
                group,
                reply: SnapshotReply { vote },
            };
        };
        let snapshot = Snapshot {
            meta: a.chunk.meta,
            snapshot: PartitionSnapshot {
                next_offset: a.chunk.next_offset,
                batches: a.chunk.batches,
                side: a.chunk.side,
            },
        };
        match raft.install_full_snapshot(a.vote, snapshot).await {
            Ok(r) => Message::SnapshotReply {
                group,
                reply: SnapshotReply { vote: r.vote },
            },
            Err(_) => refused(RefuseReason::Unavailable),
        }
    }

    /// Snapshots being assembled.
    pub fn snapshots_in_progress(&self) -> usize {
        self.snapshots.borrow().len()
    }
}

/// The leader's term bounds every log id it sends.
fn within_term(id: &Option<PartitionLogId>, vote: &PartitionVote) -> bool {
    id.is_none_or(|id| id.leader_id.term <= vote.leader_id.term)
}

/// What openraft assumes of an append-entries and does not check in release builds: entries
/// follow `prev_log_id` one index at a time, log ids never go backwards, and nothing is from a
/// term after the leader's.
fn check_append(req: &AppendMsg) -> Result<(), &'static str> {
    if !within_term(&req.prev_log_id, &req.vote) || !within_term(&req.leader_commit, &req.vote) {
        return Err("a log id beyond the leader's term");
    }
    let mut prev = req.prev_log_id;
    for e in &req.entries {
        let next_index = prev.map_or(0, |p| p.index.saturating_add(1));
        if e.log_id.index != next_index || prev.is_some_and(|p| p.leader_id.term > e.log_id.leader_id.term) {
            return Err("entries out of order");
        }
        if e.log_id.leader_id.term > req.vote.leader_id.term {
            return Err("an entry beyond the leader's term");
        }
        if let EntryPayload::Normal(EntryData::Batch(KafkaBatch(b))) = &e.payload {
            if !is_one_batch(b) {
                return Err("an entry that is not one valid record batch");
            }
        }
        prev = Some(e.log_id);
    }
    Ok(())
}

/// A batch a peer sent is stored as it is: it must be exactly one Kafka v2 batch whose CRC and
/// record count hold (the produce path's own check), or the replica's storage would fail on it.
fn is_one_batch(bytes: &[u8]) -> bool {
    strand_protocol::batch::validate_produce_batch(bytes, bytes.len()).is_ok()
}

/// A snapshot never holds log ids beyond its leader's term (openraft asserts it).
fn check_snapshot(chunk: &SnapshotChunk) -> Result<(), &'static str> {
    let meta = &chunk.meta;
    if !within_term(&meta.last_log_id, &chunk.vote)
        || !within_term(meta.last_membership.log_id(), &chunk.vote)
    {
        return Err("a snapshot log id beyond the leader's term");
    }
    if meta.last_membership.log_id() > &meta.last_log_id {
        return Err("a snapshot membership after its last log id");
    }
    if !chunk.batches.iter().all(|b| is_one_batch(&b.bytes)) {
        return Err("a snapshot batch that is not one valid record batch");
    }
    Ok(())
}

fn append_request<Rt: AsyncRuntime>(req: AppendMsg) -> AppendEntriesRequest<C<Rt>> {
    AppendEntriesRequest {
        vote: req.vote,
        prev_log_id: req.prev_log_id,
        entries: req.entries,
        leader_commit: req.leader_commit,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests;
