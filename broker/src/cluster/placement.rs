//! Replica placement for new partitions: which brokers hold a partition's replicas, which of
//! them is the preferred leader, and which shard of each broker owns its replica.
//!
//! Only active brokers (unfenced, not shutting down) receive replicas. For one topic, the
//! preferred leaders go round-robin over an order of the brokers, so each broker leads within
//! one of an even share of the topic. The order puts the brokers that lead fewest partitions
//! first (so the topic's extra partitions go to them and the whole cluster stays within one of
//! even when every broker is up), and among equally loaded brokers alternates racks (so
//! consecutive partitions lead from different racks). The followers of a partition are the
//! brokers after its leader in that order, shifted once per round over the brokers (Kafka's
//! replica shift, so that the same pairs of brokers are not always together), taking brokers of
//! racks the partition does not use yet before doubling up on a rack.
//!
//! Shards: each replica is given the shard of its broker that owns the fewest preferred
//! leaderships (for the preferred leader) or the fewest replicas (for a follower) at that
//! moment, so leaders spread over each broker's cores across all topics. The controller records
//! the shard in the partition rather than leaving it to the broker's own rule
//! ([`crate::metadata::owner_shard`]: round-robin over shards from a per-topic hashed start).
//! That rule spreads one topic's partitions over shards, but the partitions one broker leads are
//! every n-th partition (n brokers, leaders round-robin), and when n and the shard count share a
//! factor they fall on a fraction of the shards (3 brokers of 3 shards: all of a broker's leaders
//! of a topic on one shard). Only the controller sees every broker's load, so only it can keep
//! leaders even per core across topics; and with the shard in the metadata, a node sending a
//! partition's Raft messages to another addresses the right shard there directly. A broker that
//! returns with fewer shards has its replicas on missing shards moved when it registers: the
//! partition logs are not per shard and start-up replays every shard's journal before any
//! shard opens a log, so across a restart a move is only a change of owner. Kafka records where
//! on a broker a replica lives in the same place (the log directory of each replica, KIP-858).

use std::collections::BTreeMap;

use kafka_protocol::ResponseError;
use strand_protocol::types::{NodeId, ShardId};

use super::record::Replica;
use super::state::ClusterState;
use crate::metadata::AdminError;

/// Per-broker and per-shard counts of preferred leaders and replicas, as placement sees them.
#[derive(Debug, Default, Clone)]
pub struct Load {
    /// Preferred leaderships per broker.
    leaders: BTreeMap<NodeId, u64>,
    /// (preferred leaderships, replicas) per shard of each broker.
    shards: BTreeMap<NodeId, Vec<(u64, u64)>>,
}

impl Load {
    pub fn of(state: &ClusterState) -> Load {
        let mut load = Load::default();
        for b in state.brokers() {
            load.shards.insert(b.id, vec![(0, 0); usize::from(b.shards)]);
        }
        for (_, _, p) in state.partitions() {
            for (k, r) in p.replicas.iter().enumerate() {
                load.count(r.broker, r.shard, k == 0);
            }
        }
        load
    }

    fn count(&mut self, broker: NodeId, shard: ShardId, leader: bool) {
        if leader {
            *self.leaders.entry(broker).or_default() += 1;
        }
        if let Some(s) = self
            .shards
            .get_mut(&broker)
            .and_then(|v| v.get_mut(shard.index()))
        {
            s.1 += 1;
            if leader {
                s.0 += 1;
            }
        }
    }

    fn uncount(&mut self, broker: NodeId, shard: ShardId, leader: bool) {
        if let Some(s) = self
            .shards
            .get_mut(&broker)
            .and_then(|v| v.get_mut(shard.index()))
        {
            s.1 = s.1.saturating_sub(1);
            if leader {
                s.0 = s.0.saturating_sub(1);
            }
        }
    }

    /// The shard of `broker` to give a new replica, below `shards`, and counts it.
    pub fn take_shard(&mut self, broker: NodeId, shards: u16, leader: bool) -> ShardId {
        let counts = self.shards.entry(broker).or_default();
        counts.resize(usize::from(shards.max(1)), (0, 0));
        let best = counts
            .iter()
            .enumerate()
            .take(usize::from(shards.max(1)))
            .min_by_key(|(i, (l, r))| if leader { (*l, *r, *i) } else { (*r, *l, *i) })
            .map_or(0, |(i, _)| i);
        let shard = ShardId(u16::try_from(best).unwrap_or(0));
        self.count(broker, shard, leader);
        shard
    }

    /// Moves a replica's count from one shard to another chosen by [`Load::take_shard`].
    pub fn move_shard(&mut self, broker: NodeId, from: ShardId, shards: u16, leader: bool) -> ShardId {
        self.uncount(broker, from, leader);
        self.take_shard(broker, shards, leader)
    }
}

/// The replicas of `partitions` new partitions of `replication_factor` replicas each, the first
/// of each the preferred leader.
pub fn place(
    state: &ClusterState,
    partitions: u32,
    replication_factor: u16,
) -> Result<Vec<Vec<Replica>>, AdminError> {
    let usable: Vec<_> = state.brokers().filter(|b| b.is_active()).collect();
    let rf = usize::from(replication_factor);
    if rf == 0 {
        return Err(AdminError::new(
            ResponseError::InvalidReplicationFactor,
            "Replication factor must be larger than 0.",
        ));
    }
    if rf > usable.len() {
        return Err(AdminError::new(
            ResponseError::InvalidReplicationFactor,
            format!(
                "Unable to replicate the partition {rf} time(s): The target replication factor of {rf} cannot be \
                 reached because only {} broker(s) are registered and alive.",
                usable.len()
            ),
        ));
    }
    let mut load = Load::of(state);
    // Racks alternate among equally loaded brokers: position within its rack, then rack.
    let mut by_rack: BTreeMap<Option<&str>, Vec<NodeId>> = BTreeMap::new();
    for b in &usable {
        by_rack.entry(b.rack.as_deref()).or_default().push(b.id);
    }
    let leaders_of = |load: &Load, b: NodeId| load.leaders.get(&b).copied().unwrap_or(0);
    let mut slot: BTreeMap<NodeId, (usize, usize)> = BTreeMap::new();
    for (rack_index, ids) in by_rack.values_mut().enumerate() {
        ids.sort_by_key(|b| (leaders_of(&load, *b), *b));
        for (i, b) in ids.iter().enumerate() {
            slot.insert(*b, (i, rack_index));
        }
    }
    let mut order: Vec<NodeId> = usable.iter().map(|b| b.id).collect();
    order.sort_by_key(|b| (leaders_of(&load, *b), slot.get(b).copied().unwrap_or_default()));
    let rack_of = |b: NodeId| state.broker(b).and_then(|r| r.rack.as_deref());
    let shards_of = |b: NodeId| state.broker(b).map_or(1, |r| r.shards);
    let n = order.len();
    let mut out = Vec::with_capacity(partitions as usize);
    for p in 0..partitions as usize {
        let first = p % n;
        let shift = if n > 1 { (p / n) % (n - 1) } else { 0 };
        let mut chosen: Vec<NodeId> = vec![order[first]];
        let candidates: Vec<NodeId> = (0..n - 1)
            .map(|k| order[(first + 1 + (shift + k) % (n - 1)) % n])
            .collect();
        // First racks the partition does not use yet, then any.
        for pass in 0..2 {
            for c in &candidates {
                if chosen.len() == rf {
                    break;
                }
                if chosen.contains(c) {
                    continue;
                }
                if pass == 0 && chosen.iter().any(|o| rack_of(*o) == rack_of(*c)) {
                    continue;
                }
                chosen.push(*c);
            }
        }
        debug_assert_eq!(chosen.len(), rf);
        let replicas = chosen
            .iter()
            .enumerate()
            .map(|(k, b)| Replica {
                broker: *b,
                shard: load.take_shard(*b, shards_of(*b), k == 0),
            })
            .collect();
        out.push(replicas);
    }
    Ok(out)
}
