//! Where a partition's queue engines run, and how another node's are reached: on a standalone
//! node, the shard that owns the partition; on a cluster node, the shard of the partition's
//! leader, on this node or another. An operation for another node's engines crosses the node
//! link ([`Shard::call_node`]) encoded by [`super::wire`], and that node's shard runs it as its
//! own.

use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use strand_protocol::types::{NodeId, PartitionId, ShardId};

use super::ops::{QueueAnswer, QueueFailure, QueueOp};
use super::wire;
use crate::shard::replica::Leadership;
use crate::shard::Shard;

/// Where a partition's queue engines run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    /// A shard of this node.
    Shard(ShardId),
    /// A shard of another node, which leads the partition (a cluster).
    Node(NodeId, ShardId),
    /// No leader is known (a cluster partition between leaders, or offline).
    Leaderless,
}

/// How long a forwarded operation may take beyond its own wait.
const FORWARD_TIMEOUT: Duration = Duration::from_secs(15);
/// The longest wait for leasable messages one forwarded call makes (the long poll repeats it).
const MAX_FORWARDED_WAIT_MS: u64 = 5_000;
/// Payload bytes a forwarded lease answers with at most (the node link's frames are 16 MiB).
const FORWARDED_LEASE_BYTES: u64 = 8 << 20;
/// The largest operation forwarded (a publish of a larger body is refused).
const MAX_FORWARDED_BYTES: usize = 15 << 20;

/// Where the engines of `topic`-`partition` run: on a cluster node, with the leader as this
/// node's replica knows it (it hears of a new leader before the cluster metadata records it),
/// else as the cluster metadata records it.
pub(crate) fn route(shard: &Shard, topic: &str, partition: i32) -> Route {
    let Some(state) = shard.cluster_state() else {
        return Route::Shard(shard.owner(topic, partition));
    };
    let here = shard.config.node_id;
    let registration = state
        .topic_by_name(topic)
        .and_then(|t| t.partition(PartitionId(partition)));
    let leader = match shard.leadership(topic, partition) {
        Some(l) if l.is_local => Some(here),
        Some(Leadership { leader: Some(n), .. }) => Some(n),
        _ => registration.and_then(|r| r.leader),
    };
    match (leader, registration) {
        (Some(n), _) if n == here => Route::Shard(shard.owner(topic, partition)),
        (Some(n), Some(r)) => match r.shard_of(n) {
            Some(s) => Route::Node(n, s),
            None => Route::Leaderless,
        },
        _ => Route::Leaderless,
    }
}

/// Runs `op` on shard `target` of node `node` (which leads the partitions it names) and
/// waits for its answer.
pub(crate) async fn forward(
    shard: &Rc<Shard>,
    node: NodeId,
    target: ShardId,
    mut op: QueueOp,
) -> Result<QueueAnswer, QueueFailure> {
    // What crosses the node link fits one of its frames, and a wait ends before the call gives
    // up.
    let mut timeout = FORWARD_TIMEOUT;
    match &mut op {
        QueueOp::Lease { max_bytes, .. } => *max_bytes = (*max_bytes).min(FORWARDED_LEASE_BYTES),
        QueueOp::WaitLeasable { timeout_ms, .. } => {
            *timeout_ms = (*timeout_ms).min(MAX_FORWARDED_WAIT_MS);
            timeout += Duration::from_millis(*timeout_ms);
        }
        _ => {}
    }
    let body = wire::encode_op(&op)
        .ok_or_else(|| QueueFailure::Invalid("this operation is not forwarded between nodes".into()))?;
    if body.len() > MAX_FORWARDED_BYTES {
        return Err(QueueFailure::Invalid(format!(
            "the request is too large to forward to node {} ({} bytes, at most {MAX_FORWARDED_BYTES})",
            node.0,
            body.len()
        )));
    }
    let answer = shard
        .call_node(node, target, wire::QUEUE_OP_KIND, Bytes::from(body), timeout)
        .await
        .map_err(|e| QueueFailure::Unavailable(format!("cannot reach the partition's leader: {e}")))?;
    wire::decode_answer(&answer).map_err(|e| QueueFailure::Unavailable(e.to_string()))
}
