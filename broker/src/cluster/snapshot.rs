//! A [`ClusterState`] as bytes: what the controller quorum's Raft snapshot holds, so that the
//! metadata log can be purged behind it and a node far behind can be sent the state instead of
//! every record.
//!
//! The layout (big-endian, strings and lists as in [`super::record`]): a format byte, the next
//! offset and the next producer id, then the brokers, the topics with their partitions, and the configs, each list
//! preceded by a `u32` count. Reading bounds every count, allocates only as bytes arrive, and
//! checks every invariant of the result: a snapshot that decodes into a state the records
//! could not have produced is refused with an error, never served and never a panic.

#![cfg_attr(not(test), deny(clippy::indexing_slicing))]

use std::collections::BTreeMap;

use strand_protocol::types::{validate_topic_name, LeaderEpoch, TopicId};

use super::record::{
    bad, BrokerEpoch, ConfigResource, DecodeError, IncarnationId, MetadataOffset, PartitionEpoch, Reader,
    Writer, MAX_CONFIG_ENTRIES, MAX_ENDPOINTS,
};
use super::state::{BrokerRegistration, ClusterState, PartitionRegistration, TopicState};
use crate::metadata::MAX_PARTITIONS_PER_TOPIC;

const FORMAT: u8 = 0;
/// The most brokers a snapshot may hold.
pub const MAX_SNAPSHOT_BROKERS: u32 = 1 << 16;
/// The most topics (and config resources) a snapshot may hold.
pub const MAX_SNAPSHOT_TOPICS: u32 = 1 << 20;

fn count(w: &mut Writer, n: usize) {
    let n = u32::try_from(n);
    assert!(n.is_ok(), "snapshot list too long");
    w.u32(n.unwrap_or(u32::MAX));
}

fn read_count(r: &mut Reader<'_>, max: u32, what: &str) -> Result<u32, DecodeError> {
    let n = r.u32()?;
    if n > max {
        return Err(bad(format!(
            "{n} {what} in the snapshot, above the limit of {max}"
        )));
    }
    Ok(n)
}

impl ClusterState {
    /// The state as snapshot bytes.
    pub fn to_snapshot(&self) -> Vec<u8> {
        let mut w = Writer(Vec::with_capacity(1024));
        w.u8(FORMAT);
        w.u64(self.next_offset.0);
        w.i64(self.next_producer_id);
        count(&mut w, self.brokers.len());
        for b in self.brokers.values() {
            w.node(b.id);
            w.uuid(b.incarnation.0);
            w.i64(b.epoch.0);
            w.endpoints(&b.endpoints);
            w.opt_str(b.rack.as_deref());
            w.u16(b.shards);
            w.u8(u8::from(b.fenced));
            w.u8(u8::from(b.in_controlled_shutdown));
        }
        count(&mut w, self.topics.len());
        for t in self.topics.values() {
            w.str(&t.name);
            w.uuid(t.id.0);
            count(&mut w, t.partitions.len());
            for p in &t.partitions {
                w.replicas(&p.replicas);
                w.nodes(&p.isr);
                w.leader(p.leader);
                w.i32(p.leader_epoch.0);
                w.i32(p.partition_epoch.0);
            }
        }
        count(&mut w, self.configs.len());
        for (resource, entries) in &self.configs {
            let (kind, name) = match resource {
                ConfigResource::Topic(n) => (0, n),
                ConfigResource::Group(n) => (1, n),
                ConfigResource::Queue(n) => (2, n),
            };
            w.u8(kind);
            w.str(name);
            w.count(entries.len());
            for (k, v) in entries {
                w.str(k);
                w.str(v);
            }
        }
        w.0
    }

    /// Reads snapshot bytes, refusing any that do not make a valid state.
    pub fn from_snapshot(bytes: &[u8]) -> Result<ClusterState, DecodeError> {
        let mut r = Reader(bytes);
        let format = r.u8()?;
        if format != FORMAT {
            return Err(bad(format!("unknown snapshot format {format}")));
        }
        let mut state = ClusterState {
            next_offset: MetadataOffset(r.u64()?),
            next_producer_id: r.i64()?,
            ..ClusterState::default()
        };
        for _ in 0..read_count(&mut r, MAX_SNAPSHOT_BROKERS, "brokers")? {
            let id = r.node()?;
            let incarnation = IncarnationId(r.uuid()?);
            let epoch = BrokerEpoch(r.i64()?);
            let mut endpoints = Vec::new();
            for _ in 0..r.count(MAX_ENDPOINTS, "endpoints")? {
                endpoints.push(r.endpoint()?);
            }
            let rack = r.opt_str()?;
            let shards = r.u16()?;
            let fenced = flag(&mut r)?;
            let in_controlled_shutdown = flag(&mut r)?;
            let b = BrokerRegistration {
                id,
                incarnation,
                epoch,
                endpoints,
                rack,
                shards,
                fenced,
                in_controlled_shutdown,
            };
            if state.brokers.insert(id, b).is_some() {
                return Err(bad(format!("broker {id} twice in the snapshot")));
            }
        }
        for _ in 0..read_count(&mut r, MAX_SNAPSHOT_TOPICS, "topics")? {
            let name = r.str()?;
            validate_topic_name(&name).map_err(|e| bad(format!("topic {name:?}: {e}")))?;
            let id = TopicId(r.uuid()?);
            if id.is_zero() {
                return Err(bad(format!("topic {name} with the zero id")));
            }
            let max = MAX_PARTITIONS_PER_TOPIC.unsigned_abs();
            let mut partitions = Vec::new();
            for _ in 0..read_count(&mut r, max, "partitions")? {
                partitions.push(std::sync::Arc::new(PartitionRegistration {
                    replicas: r.replicas()?,
                    isr: r.nodes()?,
                    leader: r.leader()?,
                    leader_epoch: LeaderEpoch(r.i32()?),
                    partition_epoch: PartitionEpoch(r.i32()?),
                }));
            }
            if state.topics_by_name.insert(name.clone(), id).is_some() {
                return Err(bad(format!("topic {name} twice in the snapshot")));
            }
            if state
                .topics
                .insert(id, TopicState { name, id, partitions })
                .is_some()
            {
                return Err(bad(format!("topic id {id} twice in the snapshot")));
            }
        }
        for _ in 0..read_count(&mut r, MAX_SNAPSHOT_TOPICS, "config resources")? {
            let kind = r.u8()?;
            let name = r.str()?;
            let resource = match kind {
                0 => ConfigResource::Topic(name),
                1 => ConfigResource::Group(name),
                2 => ConfigResource::Queue(name),
                other => return Err(bad(format!("config resource type {other}"))),
            };
            let mut entries = BTreeMap::new();
            for _ in 0..r.count(MAX_CONFIG_ENTRIES, "config entries")? {
                let k = r.str()?;
                if entries.insert(k.clone(), r.str()?).is_some() {
                    return Err(bad(format!("config {k} twice for {resource:?}")));
                }
            }
            if state.configs.insert(resource.clone(), entries).is_some() {
                return Err(bad(format!("configs of {resource:?} twice in the snapshot")));
            }
        }
        if !r.0.is_empty() {
            return Err(bad(format!("{} bytes after the snapshot", r.0.len())));
        }
        if let Some(v) = state.invariant_violation() {
            return Err(bad(format!("the snapshot's state is invalid: {v}")));
        }
        Ok(state)
    }
}

fn flag(r: &mut Reader<'_>) -> Result<bool, DecodeError> {
    match r.u8()? {
        0 => Ok(false),
        1 => Ok(true),
        other => Err(bad(format!("flag {other}"))),
    }
}

#[cfg(test)]
mod tests {
    use strand_protocol::types::NodeId;

    use super::*;
    use crate::cluster::tests::Harness;
    use crate::cluster::{alter_configs, Record};

    fn busy_state() -> ClusterState {
        let mut h = Harness::new();
        h.join(1, Some("a"), 2);
        h.join(2, Some("b"), 3);
        h.join(3, None, 1);
        h.create("orders", 1, 5, 3).unwrap();
        h.create("audit", 2, 2, 2).unwrap();
        let records = alter_configs(
            &h.state,
            ConfigResource::Topic("orders".into()),
            vec![("retention.ms".into(), Some("1000".into()))],
        )
        .unwrap();
        h.commit(&records);
        h.commit(
            &alter_configs(
                &h.state,
                ConfigResource::Queue("jobs".into()),
                vec![("x".into(), Some("y".into()))],
            )
            .unwrap(),
        );
        // A fenced broker, one in controlled shutdown, and an offline partition.
        h.beat(3, true, false).unwrap();
        h.beat(2, false, true).unwrap();
        h.state
    }

    #[test]
    fn a_snapshot_restores_the_same_state_that_keeps_applying_records() {
        let state = busy_state();
        let bytes = state.to_snapshot();
        let mut restored = ClusterState::from_snapshot(&bytes).unwrap();
        assert_eq!(restored, state);
        // The restored state goes on from the same offset: a new registration's epoch is it.
        let offset = restored.next_offset();
        restored.apply(&Record::RegisterBroker(crate::cluster::RegisterBroker {
            broker: NodeId(9),
            incarnation: IncarnationId(uuid::Uuid::from_u128(99)),
            epoch: BrokerEpoch(offset.0 as i64),
            endpoints: vec![],
            rack: None,
            shards: 1,
        }));
        restored.check_invariants();
        assert_eq!(
            ClusterState::from_snapshot(&ClusterState::default().to_snapshot()).unwrap(),
            ClusterState::default()
        );
    }

    #[test]
    fn truncated_padded_or_invalid_snapshots_are_refused_without_panic() {
        let bytes = busy_state().to_snapshot();
        for cut in 0..bytes.len() {
            assert!(
                ClusterState::from_snapshot(&bytes[..cut]).is_err(),
                "cut at {cut}"
            );
        }
        let mut long = bytes.clone();
        long.push(0);
        assert!(ClusterState::from_snapshot(&long).is_err());
        // Flip every byte in turn: whatever decodes must be a valid state.
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x5a;
            if let Ok(s) = ClusterState::from_snapshot(&b) {
                s.check_invariants();
            }
        }
        // A state that breaks an invariant: a partition led by a fenced broker.
        let mut bad_state = busy_state();
        let fenced = bad_state.brokers().find(|b| b.fenced).map(|b| b.id).unwrap();
        let t = bad_state.topics.values_mut().next().unwrap();
        let p = std::sync::Arc::make_mut(&mut t.partitions[0]);
        if !p.has_replica(fenced) {
            p.replicas[0].broker = fenced;
        }
        p.leader = Some(fenced);
        p.isr = vec![fenced];
        let e = ClusterState::from_snapshot(&bad_state.to_snapshot()).unwrap_err();
        assert!(e.0.contains("invalid"), "{e}");
    }
}
