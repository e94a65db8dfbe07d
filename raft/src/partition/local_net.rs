//! An in-process network between partition-group replicas: each message goes straight to the
//! target's `Raft` handle, after a hop that the owner decides (a delay, a loss, a cut link).
//! For simulations and tests of groups that run in one process; the broker's network is
//! `transport`.

use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;

use openraft::error::{RPCError, ReplicationClosed, StreamingError, Unreachable};
use openraft::network::{RPCOption, RaftNetworkFactory, RaftNetworkV2};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, VoteRequest, VoteResponse,
};
use openraft::storage::RaftStateMachine;
use openraft::type_config::alias::{SnapshotOf, VoteOf};
use openraft::{AsyncRuntime, Raft};

use super::store::PartitionSnapshot;
use super::types::{BrokerId, PartitionRaft};

type C<Rt> = PartitionRaft<Rt>;

/// What the owner of the network decides for each message.
pub trait Hops: 'static {
    /// The state machine type of the groups' Rafts.
    type Sm: RaftStateMachine<C<Self::Rt>, SnapshotData = PartitionSnapshot>;
    type Rt: AsyncRuntime;

    /// Carries a message from `from` to `to`: waits as long as it takes, or fails (lost, cut).
    fn hop(
        self: &Rc<Self>,
        from: BrokerId,
        to: BrokerId,
    ) -> Pin<Box<dyn Future<Output = Result<(), String>>>>;

    /// The running Raft of node `id`, if it is up.
    fn raft(&self, id: BrokerId) -> Option<Raft<C<Self::Rt>, Self::Sm>>;
}

/// Node `from`'s view of the network: openraft's network factory.
pub struct LocalNet<H> {
    hops: Rc<H>,
    from: BrokerId,
}

impl<H> LocalNet<H> {
    pub fn new(hops: Rc<H>, from: BrokerId) -> Self {
        LocalNet { hops, from }
    }
}

/// The link from one node to another.
pub struct LocalLink<H> {
    hops: Rc<H>,
    from: BrokerId,
    to: BrokerId,
}

impl<H: Hops> RaftNetworkFactory<C<H::Rt>> for LocalNet<H> {
    type Network = LocalLink<H>;

    async fn new_client(&mut self, target: BrokerId, _node: &()) -> LocalLink<H> {
        LocalLink {
            hops: Rc::clone(&self.hops),
            from: self.from,
            to: target,
        }
    }
}

fn unreachable<Rt: AsyncRuntime>(msg: String) -> RPCError<C<Rt>> {
    RPCError::Unreachable(Unreachable::from_string(msg))
}

impl<H: Hops> LocalLink<H> {
    async fn target(&self) -> Result<Raft<C<H::Rt>, H::Sm>, String> {
        self.hops.hop(self.from, self.to).await?;
        self.hops
            .raft(self.to)
            .ok_or_else(|| format!("{} is down", self.to))
    }

    async fn back(&self) -> Result<(), String> {
        self.hops.hop(self.to, self.from).await
    }
}

impl<H: Hops> RaftNetworkV2<C<H::Rt>> for LocalLink<H> {
    type SnapshotData = PartitionSnapshot;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<C<H::Rt>>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<C<H::Rt>>, RPCError<C<H::Rt>>> {
        let node = self.target().await.map_err(unreachable::<H::Rt>)?;
        let resp = node
            .append_entries(rpc)
            .await
            .map_err(|e| unreachable::<H::Rt>(e.to_string()))?;
        self.back().await.map_err(unreachable::<H::Rt>)?;
        Ok(resp)
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<C<H::Rt>>,
        _option: RPCOption,
    ) -> Result<VoteResponse<C<H::Rt>>, RPCError<C<H::Rt>>> {
        let node = self.target().await.map_err(unreachable::<H::Rt>)?;
        let resp = node
            .vote(rpc)
            .await
            .map_err(|e| unreachable::<H::Rt>(e.to_string()))?;
        self.back().await.map_err(unreachable::<H::Rt>)?;
        Ok(resp)
    }

    async fn full_snapshot(
        &mut self,
        vote: VoteOf<C<H::Rt>>,
        snapshot: SnapshotOf<C<H::Rt>, PartitionSnapshot>,
        _cancel: impl Future<Output = ReplicationClosed> + 'static,
        _option: RPCOption,
    ) -> Result<SnapshotResponse<C<H::Rt>>, StreamingError<C<H::Rt>>> {
        let stream_err = |m: String| StreamingError::Unreachable(Unreachable::from_string(m));
        let node = self.target().await.map_err(stream_err)?;
        let resp = node
            .install_full_snapshot(vote, snapshot)
            .await
            .map_err(|e| stream_err(e.to_string()))?;
        self.back().await.map_err(stream_err)?;
        Ok(resp)
    }
}
