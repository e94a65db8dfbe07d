//! Unit tests of the controller's decisions, each applied to a state as the quorum would.

use std::collections::BTreeMap;

use kafka_protocol::ResponseError;
use strand_protocol::types::{LeaderEpoch, NodeId, PartitionId, ShardId, TopicId};

use super::*;
use crate::metadata::AdminError;

/// A cluster as the quorum leader sees it: its state, its soft state, and a clock.
pub(super) struct Harness {
    pub(super) state: ClusterState,
    /// Another node applying the decoded records: must stay identical to `state`.
    replica: ClusterState,
    pub(super) liveness: Liveness,
    pub(super) config: ControllerConfig,
    pub(super) now_ms: u64,
    /// Each broker's current incarnation and epoch.
    pub(super) epochs: BTreeMap<NodeId, (IncarnationId, BrokerEpoch)>,
    incarnations: u128,
}

pub(super) fn n(id: i32) -> NodeId {
    NodeId(id)
}

pub(super) fn tid(k: u128) -> TopicId {
    TopicId(uuid::Uuid::from_u128(k))
}

impl Harness {
    pub(super) fn new() -> Harness {
        Harness {
            state: ClusterState::default(),
            replica: ClusterState::default(),
            liveness: Liveness::default(),
            config: ControllerConfig::default(),
            now_ms: 0,
            epochs: BTreeMap::new(),
            incarnations: 0,
        }
    }

    /// Applies a decision's records as the quorum would, checking every invariant afterwards,
    /// and applies them decoded from their batch bytes (the Raft entry) on a second node, which
    /// must end up identical.
    pub(super) fn commit(&mut self, records: &[Record]) {
        for r in records {
            self.state.apply(r);
        }
        match decode_batch(&encode_batch(records)) {
            Ok(decoded) => {
                assert_eq!(decoded, records);
                self.replica.apply_batch(&decoded);
            }
            Err(e) => panic!("{records:?} does not decode: {e}"),
        }
        self.state.check_invariants();
        assert_eq!(
            self.replica, self.state,
            "two nodes applied the same records differently"
        );
    }

    pub(super) fn register_with(
        &mut self,
        id: i32,
        rack: Option<&str>,
        shards: u16,
    ) -> Result<BrokerEpoch, AdminError> {
        self.incarnations += 1;
        let incarnation = IncarnationId(uuid::Uuid::from_u128(self.incarnations));
        let req = BrokerRegistrationRequest {
            broker: n(id),
            incarnation,
            endpoints: vec![Endpoint {
                listener: "PLAINTEXT".into(),
                host: format!("broker-{id}"),
                port: 9092,
            }],
            rack: rack.map(str::to_owned),
            shards,
        };
        let (records, epoch) = register_broker(&self.state, &mut self.liveness, &req, self.now_ms)?;
        self.commit(&records);
        self.epochs.insert(n(id), (incarnation, epoch));
        Ok(epoch)
    }

    /// Sends one heartbeat of a broker that has applied everything.
    pub(super) fn beat(
        &mut self,
        id: i32,
        want_fence: bool,
        want_shutdown: bool,
    ) -> Result<HeartbeatReply, AdminError> {
        let epoch = self.epochs.get(&n(id)).map_or(BrokerEpoch(-1), |e| e.1);
        let hb = Heartbeat {
            broker: n(id),
            epoch,
            metadata_offset: self.state.next_offset(),
            want_fence,
            want_shutdown,
        };
        let (records, reply) = heartbeat(&self.state, &mut self.liveness, &hb, self.now_ms)?;
        self.commit(&records);
        Ok(reply)
    }

    /// Registers a broker and unfences it.
    pub(super) fn join(&mut self, id: i32, rack: Option<&str>, shards: u16) {
        self.register_with(id, rack, shards).unwrap();
        let reply = self.beat(id, false, false).unwrap();
        assert!(!reply.is_fenced && reply.is_caught_up);
    }

    pub(super) fn create(
        &mut self,
        name: &str,
        k: u128,
        partitions: i32,
        rf: i16,
    ) -> Result<TopicId, AdminError> {
        let req = CreateTopic {
            name: name.into(),
            id: tid(k),
            partitions,
            replication_factor: rf,
            assignments: vec![],
            configs: vec![],
        };
        let records = create_topic(&self.state, &req)?;
        self.commit(&records);
        Ok(tid(k))
    }

    pub(super) fn fence_stale(&mut self) -> usize {
        let records = fence_stale_brokers(&self.state, &self.liveness, &self.config, self.now_ms);
        self.commit(&records);
        records.len()
    }

    pub(super) fn part(&self, t: TopicId, p: i32) -> PartitionRegistration {
        self.state.partition(t, PartitionId(p)).unwrap().clone()
    }

    pub(super) fn alter(
        &mut self,
        t: TopicId,
        p: i32,
        isr: &[i32],
    ) -> Result<AlterPartitionReply, AdminError> {
        let part = self.part(t, p);
        let leader = part.leader.unwrap();
        let req = AlterPartition {
            broker: leader,
            broker_epoch: self.epochs[&leader].1,
            topic: t,
            partition: PartitionId(p),
            leader_epoch: part.leader_epoch,
            partition_epoch: part.partition_epoch,
            new_isr: isr
                .iter()
                .map(|b| IsrMember {
                    broker: n(*b),
                    epoch: None,
                })
                .collect(),
        };
        let (records, reply) = alter_partition(&self.state, &req)?;
        self.commit(&records);
        Ok(reply)
    }
}

impl Harness {
    /// The partition group elected `broker` in `term`: its report.
    pub(super) fn elect(
        &mut self,
        t: TopicId,
        p: i32,
        broker: i32,
        term: i32,
    ) -> Result<AlterPartitionReply, AdminError> {
        let req = LeaderElected {
            broker: n(broker),
            broker_epoch: self.epochs[&n(broker)].1,
            topic: t,
            partition: PartitionId(p),
            leader_epoch: LeaderEpoch(term),
        };
        let (records, reply) = leader_elected(&self.state, &req)?;
        self.commit(&records);
        Ok(reply)
    }
}

fn three() -> Harness {
    let mut h = Harness::new();
    for id in 1..=3 {
        h.join(id, None, 2);
    }
    h
}

#[test]
fn registration_starts_fenced_and_unfences_once_caught_up() {
    let mut h = Harness::new();
    let epoch = h.register_with(1, None, 4).unwrap();
    assert_eq!(
        epoch,
        BrokerEpoch(0),
        "the epoch is the registration record's offset"
    );
    assert!(h.state.broker(n(1)).unwrap().fenced);
    assert_eq!(h.state.live_brokers().count(), 0);
    // A heartbeat from a broker that has not applied its registration keeps it fenced.
    let hb = Heartbeat {
        broker: n(1),
        epoch,
        metadata_offset: MetadataOffset(0),
        want_fence: false,
        want_shutdown: false,
    };
    let (records, reply) = heartbeat(&h.state, &mut h.liveness, &hb, 0).unwrap();
    assert!(records.is_empty());
    assert!(reply.is_fenced && !reply.is_caught_up);
    let reply = h.beat(1, false, false).unwrap();
    assert!(!reply.is_fenced && reply.is_caught_up);
    let live: Vec<_> = h
        .state
        .live_endpoints("PLAINTEXT")
        .map(|(id, e)| (id, e.host.clone()))
        .collect();
    assert_eq!(live, vec![(n(1), "broker-1".to_string())]);
    assert_eq!(h.state.live_endpoints("CONTROLLER").count(), 0);
}

#[test]
fn a_retry_keeps_the_epoch_and_a_new_incarnation_gets_a_new_one() {
    let mut h = three();
    let (inc, epoch) = h.epochs[&n(2)];
    let req = BrokerRegistrationRequest {
        broker: n(2),
        incarnation: inc,
        endpoints: h.state.broker(n(2)).unwrap().endpoints.clone(),
        rack: None,
        shards: 2,
    };
    let (records, again) = register_broker(&h.state, &mut h.liveness, &req, 0).unwrap();
    assert!(records.is_empty(), "an identical retry writes nothing");
    assert_eq!(again, epoch);
    let changed_shards = BrokerRegistrationRequest { shards: 3, ..req };
    let e = register_broker(&h.state, &mut h.liveness, &changed_shards, 0).unwrap_err();
    assert_eq!(e.code, ResponseError::InvalidRequest);
    let t = h.create("t", 1, 6, 3).unwrap();
    let led_by_2 = (0..6).filter(|p| h.part(t, *p).leader == Some(n(2))).count();
    assert_eq!(led_by_2, 2);
    // Broker 2 restarts: its old incarnation is fenced (leaders moved, ISRs shrunk) first.
    let new_epoch = h.register_with(2, None, 2).unwrap();
    assert!(new_epoch > epoch);
    assert!(h.state.broker(n(2)).unwrap().fenced);
    for p in 0..6 {
        let part = h.part(t, p);
        assert_ne!(part.leader, Some(n(2)));
        assert!(!part.isr.contains(&n(2)));
    }
    // Heartbeats of the old incarnation are refused.
    let hb = Heartbeat {
        broker: n(2),
        epoch,
        metadata_offset: h.state.next_offset(),
        want_fence: false,
        want_shutdown: false,
    };
    let e = heartbeat(&h.state, &mut h.liveness, &hb, 0).unwrap_err();
    assert_eq!(e.code, ResponseError::StaleBrokerEpoch);
}

#[test]
fn registration_refuses_bad_requests() {
    let mut h = Harness::new();
    let mut req = BrokerRegistrationRequest {
        broker: n(1),
        incarnation: IncarnationId(uuid::Uuid::from_u128(9)),
        endpoints: vec![],
        rack: None,
        shards: 0,
    };
    assert_eq!(
        register_broker(&h.state, &mut h.liveness, &req, 0)
            .unwrap_err()
            .code,
        ResponseError::InvalidRequest
    );
    req.shards = 1;
    let e = Endpoint {
        listener: "A".into(),
        host: "h".into(),
        port: 1,
    };
    req.endpoints = vec![e.clone(), e];
    assert_eq!(
        register_broker(&h.state, &mut h.liveness, &req, 0)
            .unwrap_err()
            .code,
        ResponseError::InvalidRequest
    );
}

#[test]
fn sessions_expire_after_the_timeout_and_leaderships_are_taken_away() {
    let mut h = three();
    h.config.session_timeout_ms = 2_000;
    let t = h.create("t", 1, 3, 3).unwrap();
    h.now_ms = 1_500;
    h.beat(1, false, false).unwrap();
    h.beat(2, false, false).unwrap();
    assert_eq!(h.fence_stale(), 0, "nobody is stale yet");
    h.now_ms = 2_000;
    assert!(h.fence_stale() > 0, "broker 3's session ended at 2000");
    assert!(h.state.broker(n(3)).unwrap().fenced);
    assert!(!h.state.broker(n(1)).unwrap().fenced);
    let mut led = None;
    for p in 0..3 {
        let part = h.part(t, p);
        assert_ne!(part.leader, Some(n(3)));
        assert_eq!(part.isr.len(), 2);
        assert_eq!(
            part.leader_epoch,
            LeaderEpoch(0),
            "only an election raises the epoch"
        );
        let view = h.state.partition_view(t, PartitionId(p)).unwrap();
        assert_eq!(view.offline_replicas, vec![n(3)]);
        if part.leader.is_none() {
            led = Some(p);
        }
    }
    // The partition broker 3 led waits for its group's election; the winner reports it.
    let p = led.expect("broker 3 led one partition");
    let winner = h.part(t, p).isr[0];
    h.elect(t, p, winner.0, 1).unwrap();
    assert_eq!(h.part(t, p).leader, Some(winner));
    assert_eq!(h.part(t, p).leader_epoch, LeaderEpoch(1));
    assert_eq!(h.state.live_brokers().count(), 2);
}

#[test]
fn a_heartbeat_touched_on_arrival_keeps_its_broker_alive_while_its_decision_waits() {
    let mut h = three();
    h.config.session_timeout_ms = 2_000;
    h.now_ms = 1_900;
    let epoch = h.state.broker(n(3)).unwrap().epoch;
    // Broker 3's heartbeat arrived at 1,900 but its decision has not run; a stale epoch's
    // touch and an unknown broker's count for nothing.
    h.liveness.touch(&h.state, n(3), epoch, 1_900);
    h.liveness
        .touch(&h.state, n(2), BrokerEpoch(epoch.0 + 1_000), 1_900);
    h.liveness.touch(&h.state, n(9), epoch, 1_900);
    h.beat(1, false, false).unwrap();
    h.now_ms = 2_000;
    assert!(h.fence_stale() > 0, "broker 2 is fenced");
    assert!(h.state.broker(n(2)).unwrap().fenced);
    assert!(!h.state.broker(n(3)).unwrap().fenced, "touched at 1,900");
    h.now_ms = 3_900;
    assert!(h.fence_stale() > 0);
    assert!(h.state.broker(n(3)).unwrap().fenced, "no heartbeat since 1,900");
}

#[test]
fn a_partition_without_a_live_isr_member_goes_offline_until_one_returns() {
    let mut h = three();
    let t = h.create("t", 1, 1, 2).unwrap();
    let part = h.part(t, 0);
    let (a, b) = (part.replicas[0].broker, part.replicas[1].broker);
    // The follower falls out of the ISR, then the leader dies.
    h.alter(t, 0, &[a.0]).unwrap();
    h.beat(a.0, true, false).unwrap();
    let part = h.part(t, 0);
    assert_eq!(part.leader, None);
    assert_eq!(part.isr, vec![a], "the last ISR member is kept");
    let view = h.state.partition_view(t, PartitionId(0)).unwrap();
    assert_eq!(view.leader, None);
    assert_eq!(view.offline_replicas, vec![a]);
    // A fenced broker's election is not recorded; once back it is, in the same or a later term.
    h.beat(b.0, false, false).unwrap();
    assert_eq!(
        h.elect(t, 0, a.0, 0).unwrap_err().code,
        ResponseError::IneligibleReplica
    );
    h.beat(a.0, false, false).unwrap();
    assert_eq!(h.part(t, 0).leader, None, "unfencing elects nothing");
    h.elect(t, 0, a.0, 0).unwrap();
    let part = h.part(t, 0);
    assert_eq!(part.leader, Some(a));
    assert_eq!(part.leader_epoch, LeaderEpoch(0));
}

#[test]
fn elections_are_recorded_in_term_order() {
    let mut h = three();
    let t = h.create("t", 1, 1, 3).unwrap();
    let first = h.part(t, 0).leader.unwrap();
    let other = h.part(t, 0).replicas[1].broker;
    let code = |h: &mut Harness, b: NodeId, term| h.elect(t, 0, b.0, term).unwrap_err().code;
    // The same leader reporting its term again changes nothing.
    let pe = h.part(t, 0).partition_epoch;
    h.elect(t, 0, first.0, 0).unwrap();
    assert_eq!(h.part(t, 0).partition_epoch, pe);
    // Another broker in the same term: an election cannot have two winners.
    assert_eq!(code(&mut h, other, 0), ResponseError::FencedLeaderEpoch);
    let reply = h.elect(t, 0, other.0, 3).unwrap();
    assert_eq!((reply.leader, reply.leader_epoch), (Some(other), LeaderEpoch(3)));
    // A report overtaken by a later election.
    assert_eq!(code(&mut h, first, 2), ResponseError::FencedLeaderEpoch);
    // A broker that is no replica, a stale broker epoch.
    let t2 = h.create("u", 2, 1, 1).unwrap();
    let outsider = [n(1), n(2), n(3)]
        .into_iter()
        .find(|b| !h.part(t2, 0).has_replica(*b))
        .unwrap();
    assert_eq!(
        h.elect(t2, 0, outsider.0, 5).unwrap_err().code,
        ResponseError::InvalidRequest
    );
    let req = LeaderElected {
        broker: first,
        broker_epoch: BrokerEpoch(h.epochs[&first].1 .0 + 100),
        topic: t,
        partition: PartitionId(0),
        leader_epoch: LeaderEpoch(9),
    };
    assert_eq!(
        leader_elected(&h.state, &req).unwrap_err().code,
        ResponseError::StaleBrokerEpoch
    );
    // A winner outside the ISR joins it.
    h.alter(t, 0, &[other.0]).unwrap();
    h.elect(t, 0, first.0, 4).unwrap();
    let part = h.part(t, 0);
    assert_eq!(part.leader, Some(first));
    assert!(part.isr.contains(&first) && part.isr.contains(&other));
}

#[test]
fn create_topic_spreads_leaders_and_refuses_too_high_a_replication_factor() {
    let mut h = three();
    let e = h.create("t", 1, 3, 4).unwrap_err();
    assert_eq!(e.code, ResponseError::InvalidReplicationFactor);
    assert!(e.message.contains("only 3 broker(s)"), "{}", e.message);
    assert_eq!(
        h.create("z", 1, 3, 0).unwrap_err().code,
        ResponseError::InvalidReplicationFactor
    );
    assert_eq!(
        h.create("z", 1, 0, 1).unwrap_err().code,
        ResponseError::InvalidPartitions
    );
    assert_eq!(
        h.create("bad name", 1, 1, 1).unwrap_err().code,
        ResponseError::InvalidTopicException
    );
    let t = h.create("t", 1, 7, 3).unwrap();
    assert_eq!(
        h.create("t", 2, 1, 1).unwrap_err().code,
        ResponseError::TopicAlreadyExists
    );
    assert_eq!(
        h.create("u", 1, 1, 1).unwrap_err().code,
        ResponseError::InvalidRequest,
        "id reused"
    );
    let mut leaders = BTreeMap::new();
    for p in 0..7 {
        let part = h.part(t, p);
        assert_eq!(part.replicas.len(), 3);
        assert_eq!(part.isr.len(), 3);
        assert_eq!(part.leader, part.preferred_leader());
        *leaders.entry(part.leader.unwrap()).or_insert(0) += 1;
    }
    let counts: Vec<i32> = leaders.values().copied().collect();
    assert_eq!(counts.iter().sum::<i32>(), 7);
    assert!(
        counts.iter().max().unwrap() - counts.iter().min().unwrap() <= 1,
        "{leaders:?}"
    );
    // A fenced broker takes no replicas: RF 3 needs three live brokers.
    h.beat(3, true, false).unwrap();
    assert_eq!(
        h.create("u", 3, 1, 3).unwrap_err().code,
        ResponseError::InvalidReplicationFactor
    );
    let u = h.create("u", 3, 4, 2).unwrap();
    for p in 0..4 {
        assert!(!h.part(u, p).has_replica(n(3)));
    }
}

#[test]
fn leaders_stay_even_over_brokers_and_shards_across_topics() {
    for racks in [[None, None, None], [Some("a"), Some("b"), Some("c")]] {
        leaders_even_with(racks);
    }
}

fn leaders_even_with(racks: [Option<&str>; 3]) {
    let mut h = Harness::new();
    for (id, rack) in (1..=3).zip(racks) {
        h.join(id, rack, 3);
    }
    // Topics of sizes that do not divide evenly; the extras go to the least loaded brokers.
    for (k, size) in [1, 2, 4, 5, 7, 1, 1, 2].iter().enumerate() {
        h.create(&format!("t{k}"), k as u128 + 1, *size, 2).unwrap();
    }
    let mut per_broker: BTreeMap<NodeId, i32> = BTreeMap::new();
    let mut per_shard: BTreeMap<(NodeId, ShardId), i32> = BTreeMap::new();
    for (_, _, p) in h.state.partitions() {
        let r = p.replicas[0];
        *per_broker.entry(r.broker).or_default() += 1;
        *per_shard.entry((r.broker, r.shard)).or_default() += 1;
    }
    let total: i32 = per_broker.values().sum();
    assert_eq!(total, 23);
    let spread = |v: Vec<i32>| v.iter().max().unwrap() - v.iter().min().unwrap();
    assert!(
        spread(per_broker.values().copied().collect()) <= 1,
        "{per_broker:?}"
    );
    for b in 1..=3 {
        let shards: Vec<i32> = (0..3)
            .map(|s| per_shard.get(&(n(b), ShardId(s))).copied().unwrap_or(0))
            .collect();
        assert!(spread(shards.clone()) <= 1, "broker {b}: {shards:?}");
    }
}

#[test]
fn replicas_prefer_distinct_racks() {
    let mut h = Harness::new();
    for (id, rack) in [(1, "a"), (2, "a"), (3, "b"), (4, "b"), (5, "c"), (6, "c")] {
        h.join(id, Some(rack), 1);
    }
    let t = h.create("t", 1, 12, 3).unwrap();
    for p in 0..12 {
        let part = h.part(t, p);
        let mut racks: Vec<_> = part
            .replica_brokers()
            .map(|b| h.state.broker(b).unwrap().rack.clone().unwrap())
            .collect();
        racks.sort();
        racks.dedup();
        assert_eq!(racks.len(), 3, "partition {p}: {part:?}");
    }
    // Consecutive partitions lead from different racks.
    for p in 0..11 {
        let rack = |p| {
            let l = h.part(t, p).leader.unwrap();
            h.state.broker(l).unwrap().rack.clone()
        };
        assert_ne!(rack(p), rack(p + 1), "partitions {p} and {}", p + 1);
    }
}

#[test]
fn alter_partition_shrinks_and_expands_with_epoch_checks() {
    let mut h = three();
    let t = h.create("t", 1, 1, 3).unwrap();
    let part = h.part(t, 0);
    let leader = part.leader.unwrap();
    let follower = part.replicas[2].broker;
    let keep: Vec<i32> = part.isr.iter().filter(|b| **b != follower).map(|b| b.0).collect();
    let reply = h.alter(t, 0, &keep).unwrap();
    assert_eq!(reply.isr.len(), 2);
    assert_eq!(reply.leader, Some(leader));
    assert_eq!(
        reply.leader_epoch,
        LeaderEpoch(0),
        "an ISR change keeps the leader epoch"
    );
    assert_eq!(reply.partition_epoch, PartitionEpoch(1));
    let base = AlterPartition {
        broker: leader,
        broker_epoch: h.epochs[&leader].1,
        topic: t,
        partition: PartitionId(0),
        leader_epoch: LeaderEpoch(0),
        partition_epoch: PartitionEpoch(1),
        new_isr: part
            .replicas
            .iter()
            .map(|r| IsrMember {
                broker: r.broker,
                epoch: None,
            })
            .collect(),
    };
    let code = |req: &AlterPartition, h: &Harness| alter_partition(&h.state, req).unwrap_err().code;
    // A stale partition epoch (the leader missed a change) is refused.
    let stale = AlterPartition {
        partition_epoch: PartitionEpoch(0),
        ..base.clone()
    };
    assert_eq!(code(&stale, &h), ResponseError::InvalidUpdateVersion);
    let future = AlterPartition {
        partition_epoch: PartitionEpoch(5),
        ..base.clone()
    };
    assert_eq!(code(&future, &h), ResponseError::NotController);
    let not_leader = AlterPartition {
        broker: follower,
        broker_epoch: h.epochs[&follower].1,
        ..base.clone()
    };
    assert_eq!(code(&not_leader, &h), ResponseError::InvalidRequest);
    let stale_broker = AlterPartition {
        broker_epoch: BrokerEpoch(999),
        ..base.clone()
    };
    assert_eq!(code(&stale_broker, &h), ResponseError::StaleBrokerEpoch);
    let without_leader = AlterPartition {
        new_isr: vec![IsrMember {
            broker: follower,
            epoch: None,
        }],
        ..base.clone()
    };
    assert_eq!(code(&without_leader, &h), ResponseError::InvalidRequest);
    let not_replica = AlterPartition {
        new_isr: vec![
            IsrMember {
                broker: leader,
                epoch: None,
            },
            IsrMember {
                broker: n(9),
                epoch: None,
            },
        ],
        ..base.clone()
    };
    assert_eq!(code(&not_replica, &h), ResponseError::InvalidRequest);
    let wrong_member_epoch = AlterPartition {
        new_isr: vec![
            IsrMember {
                broker: leader,
                epoch: None,
            },
            IsrMember {
                broker: follower,
                epoch: Some(BrokerEpoch(999)),
            },
        ],
        ..base.clone()
    };
    assert_eq!(code(&wrong_member_epoch, &h), ResponseError::IneligibleReplica);
    // A fenced follower cannot rejoin.
    h.beat(follower.0, true, false).unwrap();
    assert_eq!(code(&base, &h), ResponseError::IneligibleReplica);
    h.beat(follower.0, false, false).unwrap();
    let (records, reply) = alter_partition(&h.state, &base).unwrap();
    h.commit(&records);
    assert_eq!(reply.isr.len(), 3);
    assert_eq!(reply.partition_epoch, PartitionEpoch(2));
    // Unknown topic and partition.
    let unknown = AlterPartition {
        topic: tid(77),
        ..base.clone()
    };
    assert_eq!(code(&unknown, &h), ResponseError::UnknownTopicId);
    let no_partition = AlterPartition {
        partition: PartitionId(4),
        ..base.clone()
    };
    assert_eq!(code(&no_partition, &h), ResponseError::UnknownTopicOrPartition);
    // A leader that was replaced gets FENCED_LEADER_EPOCH.
    h.beat(leader.0, true, false).unwrap();
    h.beat(leader.0, false, false).unwrap();
    h.elect(t, 0, follower.0, 1).unwrap();
    let new = h.part(t, 0);
    assert_ne!(new.leader, Some(leader));
    let old_leader = AlterPartition {
        partition_epoch: new.partition_epoch,
        ..base
    };
    assert_eq!(code(&old_leader, &h), ResponseError::FencedLeaderEpoch);
}

#[test]
fn controlled_shutdown_moves_leadership_before_the_broker_stops() {
    let mut h = three();
    let t = h.create("t", 1, 6, 3).unwrap();
    assert_eq!(h.state.leader_count(n(2)), 2);
    let reply = h.beat(2, false, true).unwrap();
    assert!(!reply.should_shut_down, "the others have not seen the moves yet");
    assert!(!reply.is_fenced);
    let b = h.state.broker(n(2)).unwrap();
    assert!(b.in_controlled_shutdown && !b.fenced);
    assert_eq!(h.state.leader_count(n(2)), 0);
    for p in 0..6 {
        assert!(!h.part(t, p).isr.contains(&n(2)));
    }
    // Still listed to clients while it drains; takes no new replicas.
    assert_eq!(h.state.live_brokers().count(), 3);
    assert_eq!(
        h.create("u", 2, 1, 3).unwrap_err().code,
        ResponseError::InvalidReplicationFactor
    );
    // Once brokers 1 and 3 report having applied the moves, broker 2 may stop, fenced.
    let reply = h.beat(2, false, true).unwrap();
    assert!(!reply.should_shut_down);
    h.beat(1, false, false).unwrap();
    h.beat(3, false, false).unwrap();
    let reply = h.beat(2, false, true).unwrap();
    assert!(reply.should_shut_down && reply.is_fenced);
    assert!(h.state.broker(n(2)).unwrap().fenced);
    // A broker that leads nothing stops at once.
    h.beat(1, true, false).unwrap();
    h.beat(1, false, false).unwrap();
    assert_eq!(h.state.leader_count(n(1)), 0);
    let reply = h.beat(1, false, true).unwrap();
    assert!(reply.should_shut_down);
}

#[test]
fn a_broker_knows_what_it_hosts_and_leads() {
    let mut h = three();
    let t = h.create("t", 1, 4, 2).unwrap();
    let hosted: Vec<_> = h.state.hosted_by(n(1)).collect();
    let expected: Vec<i32> = (0..4).filter(|p| h.part(t, *p).has_replica(n(1))).collect();
    assert_eq!(hosted.iter().map(|r| r.partition.0).collect::<Vec<_>>(), expected);
    for r in &hosted {
        let part = h.part(t, r.partition.0);
        assert_eq!(Some(r.shard), part.shard_of(n(1)));
        assert_eq!(r.leader, part.leader == Some(n(1)));
    }
    assert_eq!(
        hosted.iter().filter(|r| r.leader).count(),
        h.state.leader_count(n(1))
    );
    assert_eq!(h.state.hosted_by(n(7)).count(), 0);
}

#[test]
fn restart_with_fewer_shards_moves_replicas_onto_existing_shards() {
    let mut h = Harness::new();
    for id in 1..=2 {
        h.join(id, None, 4);
    }
    let t = h.create("t", 1, 8, 2).unwrap();
    assert!((0..8).any(|p| h.part(t, p).shard_of(n(2)).unwrap().0 >= 2));
    h.register_with(2, None, 2).unwrap();
    for p in 0..8 {
        assert!(h.part(t, p).shard_of(n(2)).unwrap().0 < 2);
    }
}

#[test]
fn configs_and_topic_removal() {
    let mut h = three();
    let t = h.create("t", 1, 1, 1).unwrap();
    let topic = ConfigResource::Topic("t".into());
    let records = alter_configs(
        &h.state,
        topic.clone(),
        vec![("retention.ms".into(), Some("10".into()))],
    )
    .unwrap();
    h.commit(&records);
    assert_eq!(h.state.configs(&topic).unwrap()["retention.ms"], "10");
    let group = ConfigResource::Group("g".into());
    let records = alter_configs(
        &h.state,
        group.clone(),
        vec![("share.auto.offset.reset".into(), Some("earliest".into()))],
    )
    .unwrap();
    h.commit(&records);
    let records = alter_configs(
        &h.state,
        group.clone(),
        vec![("share.auto.offset.reset".into(), None)],
    )
    .unwrap();
    h.commit(&records);
    assert!(
        h.state.configs(&group).is_none(),
        "an emptied resource has no entry"
    );
    let e = alter_configs(
        &h.state,
        ConfigResource::Topic("nope".into()),
        vec![("a".into(), None)],
    )
    .unwrap_err();
    assert_eq!(e.code, ResponseError::UnknownTopicOrPartition);
    let records = delete_topic(&h.state, t).unwrap();
    h.commit(&records);
    assert!(h.state.topic_by_name("t").is_none());
    assert!(
        h.state.configs(&topic).is_none(),
        "a deleted topic's configs go with it"
    );
    assert_eq!(
        delete_topic(&h.state, t).unwrap_err().code,
        ResponseError::UnknownTopicId
    );
    // Created with configs: the config record comes with the topic.
    let req = CreateTopic {
        name: "c".into(),
        id: tid(5),
        partitions: 1,
        replication_factor: 1,
        assignments: vec![],
        configs: vec![("cleanup.policy".into(), "compact".into())],
    };
    let records = create_topic(&h.state, &req).unwrap();
    h.commit(&records);
    assert_eq!(
        h.state.configs(&ConfigResource::Topic("c".into())).unwrap()["cleanup.policy"],
        "compact"
    );
    let clash = CreateTopic {
        name: "c.x".into(),
        id: tid(6),
        ..req.clone()
    };
    h.commit(&create_topic(&h.state, &clash).unwrap());
    let clash2 = CreateTopic {
        name: "c_x".into(),
        id: tid(7),
        ..req
    };
    assert_eq!(
        create_topic(&h.state, &clash2).unwrap_err().code,
        ResponseError::InvalidTopicException
    );
}

#[test]
#[should_panic(expected = "a new leader has a newer epoch")]
fn apply_refuses_a_leader_change_without_a_new_epoch() {
    let mut h = three();
    let t = h.create("t", 1, 1, 3).unwrap();
    let part = h.part(t, 0);
    let other = part
        .isr
        .iter()
        .copied()
        .find(|b| Some(*b) != part.leader)
        .unwrap();
    h.state.apply(&Record::PartitionChange(PartitionChange {
        topic: t,
        partition: PartitionId(0),
        leader: Some(other),
        isr: part.isr.clone(),
        leader_epoch: part.leader_epoch,
        partition_epoch: PartitionEpoch(1),
        shards: None,
    }));
}

#[test]
#[should_panic(expected = "but leads")]
fn apply_refuses_fencing_a_broker_that_still_leads() {
    let mut h = three();
    let t = h.create("t", 1, 1, 3).unwrap();
    let leader = h.part(t, 0).leader.unwrap();
    h.state.apply(&Record::BrokerFenced {
        broker: leader,
        epoch: h.epochs[&leader].1,
    });
}

#[test]
#[should_panic(expected = "not in the ISR")]
fn apply_refuses_a_leader_outside_the_isr() {
    let mut h = three();
    let t = h.create("t", 1, 1, 3).unwrap();
    let part = h.part(t, 0);
    let leader = part.leader.unwrap();
    h.state.apply(&Record::PartitionChange(PartitionChange {
        topic: t,
        partition: PartitionId(0),
        leader: Some(leader),
        isr: part.isr.iter().copied().filter(|b| *b != leader).collect(),
        leader_epoch: part.leader_epoch,
        partition_epoch: PartitionEpoch(1),
        shards: None,
    }));
}

#[test]
fn controlled_shutdown_after_a_controller_fail_over_still_waits_for_the_others() {
    let mut h = three();
    h.create("t", 1, 3, 3).unwrap();
    let reply = h.beat(2, false, true).unwrap();
    assert!(!reply.should_shut_down);
    // A new active controller knows neither the shutdown's offset nor where the others are.
    h.liveness = Liveness::activate(&h.state, h.now_ms);
    let reply = h.beat(2, false, true).unwrap();
    assert!(
        !reply.should_shut_down,
        "released before the others were heard from"
    );
    h.beat(1, false, false).unwrap();
    h.beat(3, false, false).unwrap();
    assert!(h.beat(2, false, true).unwrap().should_shut_down);
}

#[test]
fn controlled_shutdown_after_a_fail_over_is_not_starved_by_new_records() {
    let mut h = three();
    h.create("t", 1, 3, 3).unwrap();
    assert!(!h.beat(2, false, true).unwrap().should_shut_down);
    h.liveness = Liveness::activate(&h.state, h.now_ms);
    assert!(!h.beat(2, false, true).unwrap().should_shut_down);
    h.beat(1, false, false).unwrap();
    h.beat(3, false, false).unwrap();
    // Metadata keeps changing: the others are behind the log end again, but past the point the
    // new controller waits for.
    h.create("u", 2, 1, 1).unwrap();
    assert!(h.beat(2, false, true).unwrap().should_shut_down);
}

#[test]
fn manual_assignments_are_checked_as_kafka_checks_them() {
    let mut h = three();
    h.beat(3, true, false).unwrap();
    let req = |assignments: Vec<(i32, Vec<i32>)>| CreateTopic {
        name: "m".into(),
        id: tid(9),
        partitions: -1,
        replication_factor: -1,
        assignments: assignments
            .into_iter()
            .map(|(p, r)| (p, r.into_iter().map(n).collect()))
            .collect(),
        configs: vec![],
    };
    let code = |h: &Harness, r: &CreateTopic| create_topic(&h.state, r).unwrap_err().code;
    assert_eq!(
        code(&h, &req(vec![(0, vec![1, 2]), (2, vec![2, 1])])),
        ResponseError::InvalidReplicaAssignment
    );
    assert_eq!(
        code(&h, &req(vec![(0, vec![1, 2]), (0, vec![2, 1])])),
        ResponseError::InvalidReplicaAssignment
    );
    assert_eq!(
        code(&h, &req(vec![(0, vec![1, 1])])),
        ResponseError::InvalidReplicaAssignment
    );
    assert_eq!(
        code(&h, &req(vec![(0, vec![1, 7])])),
        ResponseError::InvalidReplicaAssignment
    );
    assert_eq!(
        code(&h, &req(vec![(0, vec![1, 2]), (1, vec![1])])),
        ResponseError::InvalidReplicaAssignment
    );
    assert_eq!(
        code(&h, &req(vec![(0, vec![3])])),
        ResponseError::InvalidReplicaAssignment,
        "only fenced"
    );
    assert_eq!(
        code(&h, &req(vec![(0, vec![])])),
        ResponseError::InvalidReplicaAssignment
    );
    let both = CreateTopic {
        partitions: 1,
        ..req(vec![(0, vec![1])])
    };
    assert_eq!(code(&h, &both), ResponseError::InvalidRequest);
    // Broker 3 is fenced: it is a replica but not in the ISR, and does not lead.
    let records = create_topic(&h.state, &req(vec![(1, vec![2, 3]), (0, vec![3, 1])])).unwrap();
    h.commit(&records);
    let p0 = h.part(tid(9), 0);
    assert_eq!(p0.replica_brokers().collect::<Vec<_>>(), vec![n(3), n(1)]);
    assert_eq!(p0.isr, vec![n(1)]);
    assert_eq!(p0.leader, Some(n(1)));
    let p1 = h.part(tid(9), 1);
    assert_eq!(p1.leader, Some(n(2)));
    assert_eq!(p1.isr, vec![n(2)]);
    // When broker 3 returns, its group's election may make it the leader of partition 0.
    h.beat(3, false, false).unwrap();
    h.elect(tid(9), 0, 3, 1).unwrap();
    assert_eq!(h.part(tid(9), 0).leader, Some(n(3)));
}

#[test]
fn create_partitions_adds_placed_or_assigned_partitions() {
    let mut h = three();
    let t = h.create("t", 1, 2, 2).unwrap();
    let code = |h: &Harness, count, a: Option<&[Vec<NodeId>]>| {
        create_partitions(&h.state, "t", count, a).unwrap_err().code
    };
    assert_eq!(code(&h, 2, None), ResponseError::InvalidPartitions);
    assert_eq!(code(&h, 1, None), ResponseError::InvalidPartitions);
    assert_eq!(
        create_partitions(&h.state, "nope", 3, None).unwrap_err().code,
        ResponseError::UnknownTopicOrPartition
    );
    assert_eq!(
        code(&h, 4, Some(&[vec![n(1), n(2)]])),
        ResponseError::InvalidReplicaAssignment,
        "one short"
    );
    assert_eq!(
        code(&h, 3, Some(&[vec![n(1)]])),
        ResponseError::InvalidReplicaAssignment,
        "other RF"
    );
    let records = create_partitions(&h.state, "t", 5, None).unwrap();
    assert_eq!(records.len(), 3);
    h.commit(&records);
    for p in 2..5 {
        let part = h.part(t, p);
        assert_eq!(part.replicas.len(), 2, "the topic's replication factor");
        assert_eq!(part.leader, part.preferred_leader());
    }
    // The three new leaders went one to each broker (the topic had two partitions).
    let mut leaders: Vec<_> = (0..5).map(|p| h.part(t, p).leader.unwrap()).collect();
    leaders.sort();
    leaders.dedup();
    assert_eq!(leaders.len(), 3);
    let records = create_partitions(&h.state, "t", 6, Some(&[vec![n(3), n(1)]])).unwrap();
    h.commit(&records);
    assert_eq!(h.part(t, 5).leader, Some(n(3)));
}

#[test]
fn producer_id_blocks_never_overlap_and_survive_a_snapshot() {
    let mut h = three();
    let mut blocks = Vec::new();
    for b in [1, 2, 1, 3] {
        let (records, block) = allocate_producer_ids(&h.state, n(b), h.epochs[&n(b)].1).unwrap();
        h.commit(&records);
        blocks.push(block);
    }
    for w in blocks.windows(2) {
        assert_eq!(w[1].first, w[0].first + w[0].len);
    }
    assert_eq!(blocks[0].first, 0);
    assert_eq!(h.state.next_producer_id(), 4 * PRODUCER_ID_BLOCK_SIZE);
    let e = allocate_producer_ids(&h.state, n(1), BrokerEpoch(999)).unwrap_err();
    assert_eq!(e.code, ResponseError::StaleBrokerEpoch);
    let restored = ClusterState::from_snapshot(&h.state.to_snapshot()).unwrap();
    assert_eq!(restored.next_producer_id(), 4 * PRODUCER_ID_BLOCK_SIZE);
}

#[test]
fn a_fenced_broker_asking_to_shut_down_stops_at_once() {
    let mut h = three();
    h.create("t", 1, 3, 3).unwrap();
    h.beat(3, true, false).unwrap();
    let before = h.state.next_offset();
    let reply = h.beat(3, false, true).unwrap();
    assert!(reply.should_shut_down && reply.is_fenced);
    assert_eq!(
        h.state.next_offset(),
        before,
        "nothing to write: it was fenced already"
    );
    // An unfenced broker asking to be fenced and to stop: fenced, then stops.
    let reply = h.beat(2, true, true).unwrap();
    assert!(reply.should_shut_down && reply.is_fenced);
    assert_eq!(h.state.leader_count(n(2)), 0);
}

#[test]
fn fetched_records_that_break_the_state_are_refused_unapplied() {
    let mut h = three();
    let t = h.create("t", 1, 1, 3).unwrap();
    let leader = h.part(t, 0).leader.unwrap();
    let before = h.state.clone();
    // Each refused, with the state left as it was.
    let bad = [
        Record::BrokerFenced {
            broker: leader,
            epoch: h.epochs[&leader].1,
        },
        Record::BrokerUnfenced {
            broker: leader,
            epoch: BrokerEpoch(12_345),
        },
        Record::Topic {
            name: "t".into(),
            id: TopicId(uuid::Uuid::from_u128(77)),
        },
        Record::RemoveTopic {
            id: TopicId(uuid::Uuid::from_u128(78)),
        },
        Record::PartitionChange(PartitionChange {
            topic: t,
            partition: PartitionId(9),
            leader: None,
            isr: vec![],
            leader_epoch: LeaderEpoch(0),
            partition_epoch: PartitionEpoch(1),
            shards: None,
        }),
    ];
    for r in &bad {
        assert!(h.state.try_apply(r).is_err(), "{r:?} was applied");
        assert_eq!(h.state, before, "{r:?} changed the state");
    }
    // In a batch, the error names the record; good records before it stay applied.
    let good = Record::Config(ConfigRecord {
        resource: ConfigResource::Topic("t".into()),
        entries: vec![("retention.ms".into(), Some("1000".into()))],
    });
    let e = h.state.try_apply_batch(&[good, bad[0].clone()]).unwrap_err();
    assert!(e.contains("but leads"), "{e}");
    assert_eq!(h.state.next_offset().0, before.next_offset().0 + 1);
}

#[test]
fn a_decision_built_on_an_older_partition_state_is_skipped_whole() {
    let mut h = three();
    let t = h.create("t", 1, 1, 3).unwrap();
    let part = h.part(t, 0);
    let leader = part.leader.unwrap();
    // Taking the leadership away, then fencing the leader: one decision, built on the
    // partition as it is now.
    let decision = |p: &crate::cluster::PartitionRegistration| {
        vec![
            Record::PartitionChange(PartitionChange {
                topic: t,
                partition: PartitionId(0),
                leader: None,
                isr: p.isr.clone(),
                leader_epoch: p.leader_epoch,
                partition_epoch: PartitionEpoch(p.partition_epoch.0 + 1),
                shards: None,
            }),
            Record::BrokerFenced {
                broker: leader,
                epoch: h.epochs[&leader].1,
            },
        ]
    };
    let stale = decision(&part);
    // Another decision changes the partition first.
    let isr: Vec<NodeId> = part.isr.iter().copied().filter(|b| *b != leader).collect();
    h.state.apply(&Record::PartitionChange(PartitionChange {
        topic: t,
        partition: PartitionId(0),
        leader: None,
        isr,
        leader_epoch: part.leader_epoch,
        partition_epoch: PartitionEpoch(part.partition_epoch.0 + 1),
        shards: None,
    }));
    let before = h.state.clone();
    let applied = h.state.try_apply_batch(&stale);
    if cfg!(debug_assertions) {
        // Tests stop on it; nothing was applied.
        assert!(applied.unwrap_err().contains("change to partition epoch"));
        assert_eq!(h.state, before);
    } else {
        // Skipped whole: the broker is not fenced, the offsets move on.
        applied.unwrap();
        assert_eq!(h.state.next_offset().0, before.next_offset().0 + 2);
        assert!(!h.state.broker(leader).unwrap().fenced);
    }
}
