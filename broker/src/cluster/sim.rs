//! A seeded simulation of the controller: random registrations, restarts, heartbeats (some
//! lagging behind the log), crashes, controlled shutdowns, time advances with session-timeout
//! fencing, topic creations and growth, producer-id blocks, ISR changes (some with stale
//! epochs), partition groups' election reports (some stale, some from fenced or foreign
//! brokers), controller fail-overs and topic deletions, with every invariant checked after every
//! step, a second node applying the decoded records, and a snapshot restoring the same state.
//! Each run ends by bringing every broker back and letting the groups elect: every partition
//! must then be online and fully in sync.
//!
//! Every run is a function of its seed. `STRAND_CLUSTER_SIM_SEED=<n>` runs that seed alone,
//! `STRAND_CLUSTER_SIM_SEEDS=<count>` sets how many seeds the default run covers and
//! `STRAND_CLUSTER_SIM_STEPS=<n>` the steps of each; a failure names its seed.

use std::collections::BTreeMap;

use kafka_protocol::ResponseError;
use strand_protocol::types::{LeaderEpoch, NodeId, PartitionId, TopicId};

use super::tests::{n, tid, Harness};
use super::*;

/// SplitMix64: small, seeded, and the same on every platform.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> Option<T> {
        if items.is_empty() {
            None
        } else {
            items.get(self.below(items.len() as u64) as usize).copied()
        }
    }
}

/// A broker process as the simulation runs it.
#[derive(Clone, Copy, Debug)]
struct Process {
    /// The process runs (heartbeats); a crashed or stopped one does not.
    running: bool,
    /// It asked for a controlled shutdown and keeps asking until told to stop.
    stopping: bool,
    /// How far it has applied the metadata log (it may lag behind the controller).
    applied: MetadataOffset,
    /// When it stopped running.
    stopped_ms: u64,
}

/// What a run did, so that a run that did nothing fails.
#[derive(Debug, Default)]
struct Counts {
    topics: u32,
    refused_rf: u32,
    fenced_by_timeout: u32,
    unfenced: u32,
    controlled_shutdowns: u32,
    isr_changes: u32,
    refused_alters: u32,
    elections: u32,
    refused_elections: u32,
    offline_seen: u32,
    restarts: u32,
    balanced_checks: u32,
    grown: u32,
    producer_blocks: u32,
    settled: u32,
}

struct Sim {
    rng: Rng,
    h: Harness,
    processes: BTreeMap<NodeId, Process>,
    shards: BTreeMap<NodeId, u16>,
    racks: BTreeMap<NodeId, Option<String>>,
    /// Previous epochs per partition and per broker, to check they never go back.
    partition_epochs: BTreeMap<(TopicId, PartitionId), (Option<NodeId>, LeaderEpoch, PartitionEpoch)>,
    broker_epochs: BTreeMap<NodeId, BrokerEpoch>,
    next_topic: u128,
    /// No topic was deleted and no broker changed its shard count: leaders must stay within
    /// one of even over each broker's shards.
    pristine_shards: bool,
    /// No topic was deleted and every topic was created while every broker was active:
    /// preferred leaders must be within one of even over the brokers.
    pristine_brokers: bool,
    counts: Counts,
}

impl Sim {
    fn new(seed: u64) -> Sim {
        let mut rng = Rng(seed);
        let brokers = 3 + rng.below(3) as i32;
        let racks = rng.below(3);
        let mut h = Harness::new();
        h.config.session_timeout_ms = 1_000 + rng.below(8_001);
        let mut sim = Sim {
            rng,
            h,
            processes: BTreeMap::new(),
            shards: BTreeMap::new(),
            racks: BTreeMap::new(),
            partition_epochs: BTreeMap::new(),
            broker_epochs: BTreeMap::new(),
            next_topic: 1,
            pristine_shards: true,
            pristine_brokers: true,
            counts: Counts::default(),
        };
        for id in 0..brokers {
            let shards = 1 + sim.rng.below(4) as u16;
            sim.shards.insert(n(id), shards);
            let rack = (racks > 0).then(|| format!("rack-{}", id as u64 % (racks + 1)));
            sim.racks.insert(n(id), rack);
            sim.processes.insert(
                n(id),
                Process {
                    running: false,
                    stopping: false,
                    applied: MetadataOffset(0),
                    stopped_ms: 0,
                },
            );
        }
        sim
    }

    fn commit(&mut self, records: &[Record]) {
        self.h.commit(records);
    }

    fn ids(&self) -> Vec<NodeId> {
        self.processes.keys().copied().collect()
    }

    fn running(&self) -> Vec<NodeId> {
        self.processes
            .iter()
            .filter(|(_, p)| p.running)
            .map(|(b, _)| *b)
            .collect()
    }

    fn start(&mut self, b: NodeId) {
        if self.rng.chance(10) {
            let shards = 1 + self.rng.below(4) as u16;
            if shards != self.shards[&b] {
                self.pristine_shards = false;
            }
            self.shards.insert(b, shards);
        }
        let rack = self.racks[&b].clone();
        let shards = self.shards[&b];
        let restart = self.h.state.broker(b).is_some();
        let epoch = self.h.register_with(b.0, rack.as_deref(), shards);
        let epoch = match epoch {
            Ok(e) => e,
            Err(e) => panic!("registration refused: {e:?}"),
        };
        if let Some(old) = self.broker_epochs.insert(b, epoch) {
            assert!(epoch > old, "broker {b} epoch went from {old:?} to {epoch:?}");
        }
        let p = self.processes.entry(b).or_insert(Process {
            running: true,
            stopping: false,
            applied: MetadataOffset(0),
            stopped_ms: 0,
        });
        p.running = true;
        p.stopping = false;
        p.applied = MetadataOffset(0);
        if restart {
            self.counts.restarts += 1;
        }
    }

    fn beat(&mut self, b: NodeId) {
        let Some(p) = self.processes.get(&b).copied() else {
            return;
        };
        if !p.running {
            return;
        }
        // The broker has applied some prefix of the log, never less than before.
        let head = self.h.state.next_offset().0;
        let applied = if self.rng.chance(70) {
            head
        } else {
            p.applied.0 + self.rng.below(head - p.applied.0 + 1)
        };
        let want_fence = self.rng.chance(2);
        let was_fenced = self.h.state.broker(b).is_none_or(|r| r.fenced);
        let Some((_, epoch)) = self.h.epochs.get(&b).copied() else {
            return;
        };
        let hb = Heartbeat {
            broker: b,
            epoch,
            metadata_offset: MetadataOffset(applied),
            want_fence,
            want_shutdown: p.stopping,
        };
        let result = heartbeat(&self.h.state, &mut self.h.liveness, &hb, self.h.now_ms);
        let (records, reply) = match result {
            Ok(x) => x,
            Err(e) => panic!("heartbeat of a running broker refused: {e:?}"),
        };
        self.commit(&records);
        let reg = self
            .h
            .state
            .broker(b)
            .map(|r| (r.fenced, r.in_controlled_shutdown));
        assert_eq!(reply.is_fenced, reg.is_none_or(|r| r.0));
        assert_eq!(reply.is_caught_up, applied as i64 > epoch.0);
        if was_fenced && !reply.is_fenced {
            assert!(reply.is_caught_up, "unfenced before applying its registration");
            self.counts.unfenced += 1;
        }
        if reg.is_some_and(|r| r.1) {
            assert_eq!(
                self.h.state.leader_count(b),
                0,
                "a broker in controlled shutdown leads"
            );
        }
        if let Some(p) = self.processes.get_mut(&b) {
            p.applied = MetadataOffset(applied);
            if reply.should_shut_down {
                assert!(reply.is_fenced);
                assert_eq!(self.h.state.leader_count(b), 0, "told to stop while leading");
                if p.stopping {
                    self.counts.controlled_shutdowns += 1;
                }
                p.running = false;
                p.stopping = false;
                p.stopped_ms = self.h.now_ms;
            }
        }
    }

    fn advance(&mut self) {
        self.h.now_ms += self.rng.below(self.h.config.session_timeout_ms / 2 + 1);
        let fenced_before: Vec<_> = self
            .h
            .state
            .brokers()
            .filter(|b| b.fenced)
            .map(|b| b.id)
            .collect();
        let records = fence_stale_brokers(&self.h.state, &self.h.liveness, &self.h.config, self.h.now_ms);
        self.commit(&records);
        for b in self.h.state.brokers().filter(|b| b.fenced) {
            if !fenced_before.contains(&b.id) {
                self.counts.fenced_by_timeout += 1;
            }
        }
        // Every broker silent for a whole session is fenced now.
        for b in self.h.state.brokers() {
            let last = self.h.liveness.last_contact_ms(b.id).unwrap_or(0);
            if self.h.now_ms.saturating_sub(last) >= self.h.config.session_timeout_ms {
                assert!(
                    b.fenced,
                    "broker {} silent since {last} not fenced at {}",
                    b.id, self.h.now_ms
                );
            }
        }
    }

    fn crash(&mut self, b: NodeId) {
        if let Some(p) = self.processes.get_mut(&b) {
            p.running = false;
            p.stopping = false;
            p.stopped_ms = self.h.now_ms;
        }
    }

    fn create(&mut self) {
        let partitions = 1 + self.rng.below(8) as i32;
        let rf = 1 + self.rng.below(4) as i16;
        let k = self.next_topic;
        self.next_topic += 1;
        let active: Vec<NodeId> = self
            .h
            .state
            .brokers()
            .filter(|b| b.is_active())
            .map(|b| b.id)
            .collect();
        let req = CreateTopic {
            name: format!("topic-{k}"),
            id: tid(k),
            partitions,
            replication_factor: rf,
            assignments: vec![],
            configs: vec![],
        };
        match create_topic(&self.h.state, &req) {
            Ok(records) => {
                assert!(rf as usize <= active.len());
                self.commit(&records);
                self.counts.topics += 1;
                if active.len() != self.processes.len() {
                    self.pristine_brokers = false;
                }
                // The topic's leaders are within one of even over the active brokers.
                let mut leaders: BTreeMap<NodeId, i32> = active.iter().map(|b| (*b, 0)).collect();
                for p in 0..partitions {
                    let part = self.h.part(tid(k), p);
                    assert_eq!(part.isr.len(), rf as usize);
                    *leaders.entry(part.leader.unwrap_or(NodeId(-1))).or_default() += 1;
                }
                let max = leaders.values().max().copied().unwrap_or(0);
                let min = leaders.values().min().copied().unwrap_or(0);
                assert!(max - min <= 1, "topic-{k} leaders uneven: {leaders:?}");
                assert_eq!(leaders.len(), active.len(), "a leader outside the active brokers");
            }
            Err(e) => {
                assert_eq!(e.code, ResponseError::InvalidReplicationFactor, "{e:?}");
                assert!(rf as usize > active.len());
                self.counts.refused_rf += 1;
            }
        }
    }

    fn grow(&mut self) {
        let topics: Vec<(String, usize, usize)> = self
            .h
            .state
            .topics()
            .map(|t| {
                (
                    t.name.clone(),
                    t.partitions.len(),
                    t.partitions.first().map_or(0, |p| p.replicas.len()),
                )
            })
            .collect();
        let Some(k) = self.rng.pick(&(0..topics.len()).collect::<Vec<_>>()) else {
            return;
        };
        let (name, current, rf) = topics[k].clone();
        let count = (current + 1 + self.rng.below(4) as usize) as i32;
        let active = self.h.state.brokers().filter(|b| b.is_active()).count();
        match create_partitions(&self.h.state, &name, count, None) {
            Ok(records) => {
                assert!(rf <= active);
                self.commit(&records);
                if active != self.processes.len() {
                    self.pristine_brokers = false;
                }
                self.counts.grown += 1;
            }
            Err(e) => {
                assert_eq!(e.code, ResponseError::InvalidReplicationFactor, "{e:?}");
                assert!(rf > active);
            }
        }
    }

    fn allocate(&mut self) {
        let Some(b) = self.rng.pick(&self.running()) else {
            return;
        };
        let Some((_, epoch)) = self.h.epochs.get(&b).copied() else {
            return;
        };
        let before = self.h.state.next_producer_id();
        let (records, block) = match allocate_producer_ids(&self.h.state, b, epoch) {
            Ok(x) => x,
            Err(e) => panic!("producer ids refused to a registered broker: {e:?}"),
        };
        self.commit(&records);
        assert_eq!(block.first, before, "a block must start where the last one ended");
        assert_eq!(self.h.state.next_producer_id(), before + block.len);
        self.counts.producer_blocks += 1;
    }

    fn alter(&mut self) {
        let led: Vec<(TopicId, PartitionId)> = self
            .h
            .state
            .partitions()
            .filter(|(_, _, p)| p.leader.is_some())
            .map(|(t, i, _)| (t, i))
            .collect();
        let Some((t, i)) = self.rng.pick(&led) else { return };
        let part = self.h.part(t, i.0);
        let Some(leader) = part.leader else { return };
        let mut isr = vec![leader];
        for r in part.replica_brokers() {
            // Mostly live brokers (a leader adds only caught-up followers), sometimes any.
            if r != leader && self.rng.chance(50) && (self.h.state.is_active(r) || self.rng.chance(10)) {
                isr.push(r);
            }
        }
        let stale = self.rng.chance(10);
        let req = AlterPartition {
            broker: leader,
            broker_epoch: self.h.epochs[&leader].1,
            topic: t,
            partition: i,
            leader_epoch: part.leader_epoch,
            partition_epoch: PartitionEpoch(part.partition_epoch.0 - i32::from(stale)),
            new_isr: isr
                .iter()
                .map(|b| IsrMember {
                    broker: *b,
                    epoch: None,
                })
                .collect(),
        };
        match alter_partition(&self.h.state, &req) {
            Ok((records, reply)) => {
                assert!(!stale, "a stale partition epoch was accepted");
                assert!(isr.iter().all(|b| self.h.state.is_active(*b)));
                self.commit(&records);
                assert_eq!(reply.isr, isr);
                assert_eq!(reply.leader, Some(leader));
                if !records.is_empty() {
                    self.counts.isr_changes += 1;
                }
            }
            Err(e) => {
                let expected = if stale {
                    ResponseError::InvalidUpdateVersion
                } else {
                    ResponseError::IneligibleReplica
                };
                assert_eq!(e.code, expected, "{e:?}");
                assert!(stale || isr.iter().any(|b| !self.h.state.is_active(*b)));
                self.counts.refused_alters += 1;
            }
        }
    }

    /// A partition group's election report: a random replica (or, rarely, a broker that is
    /// none) in a term around the partition's epoch, as a late or stale report would be.
    fn elect(&mut self) {
        let parts: Vec<(TopicId, PartitionId)> = self.h.state.partitions().map(|(t, p, _)| (t, p)).collect();
        let Some((t, p)) = self.rng.pick(&parts) else {
            return;
        };
        let part = self.h.part(t, p.0);
        let candidates: Vec<NodeId> = if self.rng.chance(5) {
            self.ids()
        } else {
            part.replica_brokers().collect()
        };
        let Some(b) = self.rng.pick(&candidates) else {
            return;
        };
        let Some((_, broker_epoch)) = self.h.epochs.get(&b).copied() else {
            return;
        };
        let term = LeaderEpoch(part.leader_epoch.0 + i32::try_from(self.rng.below(3)).unwrap_or(0) - 1)
            .max(LeaderEpoch(0));
        let req = LeaderElected {
            broker: b,
            broker_epoch,
            topic: t,
            partition: p,
            leader_epoch: term,
        };
        let eligible = self.h.state.is_active(b) && part.has_replica(b);
        let newer = term > part.leader_epoch
            || (term == part.leader_epoch && (part.leader.is_none() || part.leader == Some(b)));
        match leader_elected(&self.h.state, &req) {
            Ok((records, reply)) => {
                assert!(eligible && newer, "{t}-{p}: {req:?} recorded over {part:?}");
                self.commit(&records);
                let now = self.h.part(t, p.0);
                assert_eq!((now.leader, now.leader_epoch), (Some(b), term));
                assert!(now.isr.contains(&b));
                assert_eq!(reply.partition_epoch, now.partition_epoch);
                self.counts.elections += 1;
            }
            Err(e) => {
                assert!(
                    !eligible || !newer,
                    "{t}-{p}: {req:?} refused ({e:?}) over {part:?}"
                );
                self.counts.refused_elections += 1;
            }
        }
    }

    fn delete(&mut self) {
        let ids: Vec<TopicId> = self.h.state.topics().map(|t| t.id).collect();
        if let Some(id) = self.rng.pick(&ids) {
            let records = delete_topic(&self.h.state, id).unwrap_or_default();
            self.commit(&records);
            self.pristine_shards = false;
            self.pristine_brokers = false;
        }
    }

    /// The checks after every step, beyond the state's own invariants.
    fn check(&mut self) {
        self.h.state.check_invariants();
        // A node restored from a snapshot taken now holds the same state.
        let restored = ClusterState::from_snapshot(&self.h.state.to_snapshot());
        assert_eq!(
            restored.as_ref(),
            Ok(&self.h.state),
            "the snapshot does not restore the state"
        );
        let mut seen = BTreeMap::new();
        for (t, p, part) in self.h.state.partitions() {
            if let Some((leader, le, pe)) = self.partition_epochs.get(&(t, p)).copied() {
                assert!(part.leader_epoch >= le, "{t}-{p}: leader epoch went back");
                assert!(part.partition_epoch >= pe, "{t}-{p}: partition epoch went back");
                if part.leader.is_some() && leader.is_some() && part.leader != leader {
                    assert!(part.leader_epoch > le, "{t}-{p}: new leader, same epoch");
                }
                if part.leader.is_none() {
                    assert_eq!(
                        part.leader_epoch, le,
                        "{t}-{p}: a leader taken away keeps its epoch"
                    );
                }
            }
            if let Some(l) = part.leader {
                let b = self.h.state.broker(l);
                assert!(b.is_some_and(|b| !b.fenced), "{t}-{p} led by fenced broker {l}");
            } else {
                self.counts.offline_seen += 1;
            }
            seen.insert((t, p), (part.leader, part.leader_epoch, part.partition_epoch));
        }
        self.partition_epochs = seen;
        for b in self.h.state.brokers() {
            assert_eq!(self.broker_epochs.get(&b.id), Some(&b.epoch));
            assert_eq!(b.shards, self.shards[&b.id]);
        }
        if self.pristine_brokers {
            let mut per_broker: BTreeMap<NodeId, i32> = self.ids().into_iter().map(|b| (b, 0)).collect();
            for (_, _, part) in self.h.state.partitions() {
                if let Some(b) = part.preferred_leader() {
                    *per_broker.entry(b).or_default() += 1;
                }
            }
            let max = per_broker.values().max().copied().unwrap_or(0);
            let min = per_broker.values().min().copied().unwrap_or(0);
            assert!(max - min <= 1, "preferred leaders over brokers: {per_broker:?}");
            self.counts.balanced_checks += 1;
        }
        if self.pristine_shards {
            let mut per_shard: BTreeMap<NodeId, Vec<i32>> = self
                .h
                .state
                .brokers()
                .map(|b| (b.id, vec![0; usize::from(b.shards)]))
                .collect();
            for (_, _, part) in self.h.state.partitions() {
                if let Some(r) = part.replicas.first() {
                    if let Some(c) = per_shard
                        .get_mut(&r.broker)
                        .and_then(|v| v.get_mut(r.shard.index()))
                    {
                        *c += 1;
                    }
                }
            }
            for (b, counts) in per_shard {
                let spread = counts.iter().max().unwrap_or(&0) - counts.iter().min().unwrap_or(&0);
                assert!(
                    spread <= 1,
                    "preferred leaders over broker {b}'s shards: {counts:?}"
                );
            }
        }
    }

    fn step(&mut self) {
        let ids = self.ids();
        let roll = self.rng.below(100);
        match roll {
            0..=9 => {
                // Start a stopped broker, or restart a running one (a crash and quick return).
                if let Some(b) = self.rng.pick(&ids) {
                    let running = self.processes[&b].running;
                    if !running || self.rng.chance(20) {
                        self.start(b);
                    }
                }
            }
            10..=44 => {
                for b in self.running() {
                    if self.rng.chance(80) {
                        self.beat(b);
                    }
                }
            }
            45..=59 => self.advance(),
            60..=63 => {
                if let Some(b) = self.rng.pick(&self.running()) {
                    self.crash(b);
                }
            }
            64..=67 => {
                if let Some(b) = self.rng.pick(&self.running()) {
                    if let Some(p) = self.processes.get_mut(&b) {
                        p.stopping = true;
                    }
                }
            }
            68..=73 => self.create(),
            74..=75 => self.grow(),
            76..=77 => self.allocate(),
            78..=89 => self.alter(),
            90..=94 => self.elect(),
            95..=97 => {
                // Controller fail-over: the new active controller starts fresh sessions.
                self.h.liveness = Liveness::activate(&self.h.state, self.h.now_ms);
            }
            _ => {
                if self.rng.chance(30) {
                    self.delete();
                }
            }
        }
        self.check();
    }
}

impl Sim {
    /// Brings every broker back and lets the cluster heal: every leaderless group elects its
    /// first ISR member in the next term; afterwards every partition must be online and have
    /// every replica in its ISR.
    fn settle(&mut self) {
        for p in self.processes.values_mut() {
            p.stopping = false;
        }
        for _ in 0..4 {
            for b in self.ids() {
                if !self.processes[&b].running {
                    self.start(b);
                }
            }
            for b in self.ids() {
                let Some((_, epoch)) = self.h.epochs.get(&b).copied() else {
                    continue;
                };
                let hb = Heartbeat {
                    broker: b,
                    epoch,
                    metadata_offset: self.h.state.next_offset(),
                    want_fence: false,
                    want_shutdown: false,
                };
                let (records, reply) =
                    match heartbeat(&self.h.state, &mut self.h.liveness, &hb, self.h.now_ms) {
                        Ok(x) => x,
                        Err(e) => panic!("settling heartbeat refused: {e:?}"),
                    };
                self.commit(&records);
                if reply.should_shut_down {
                    // It was in controlled shutdown: it stops, and comes back next round.
                    self.crash(b);
                }
            }
            self.check();
        }
        for b in self.h.state.brokers() {
            assert!(
                b.is_active(),
                "broker {} still not active after settling: {b:?}",
                b.id
            );
        }
        let parts: Vec<(TopicId, PartitionId)> = self.h.state.partitions().map(|(t, p, _)| (t, p)).collect();
        for (t, p) in parts {
            let mut part = self.h.part(t, p.0);
            if part.leader.is_none() {
                let winner = part.isr[0];
                let req = LeaderElected {
                    broker: winner,
                    broker_epoch: self.h.epochs[&winner].1,
                    topic: t,
                    partition: p,
                    leader_epoch: LeaderEpoch(part.leader_epoch.0 + 1),
                };
                match leader_elected(&self.h.state, &req) {
                    Ok((records, _)) => self.commit(&records),
                    Err(e) => panic!("{t}-{p}: the election of {winner} refused: {e:?}"),
                }
                part = self.h.part(t, p.0);
            }
            let Some(leader) = part.leader else {
                panic!("{t}-{p} offline with every broker back: {part:?}");
            };
            let req = AlterPartition {
                broker: leader,
                broker_epoch: self.h.epochs[&leader].1,
                topic: t,
                partition: p,
                leader_epoch: part.leader_epoch,
                partition_epoch: part.partition_epoch,
                new_isr: part
                    .replica_brokers()
                    .map(|b| IsrMember {
                        broker: b,
                        epoch: Some(self.h.epochs[&b].1),
                    })
                    .collect(),
            };
            match alter_partition(&self.h.state, &req) {
                Ok((records, _)) => self.commit(&records),
                Err(e) => panic!("{t}-{p}: expanding the ISR refused: {e:?}"),
            }
        }
        self.check();
        for (t, p, part) in self.h.state.partitions() {
            assert!(part.leader.is_some(), "{t}-{p}");
            assert_eq!(part.isr.len(), part.replicas.len(), "{t}-{p}");
        }
        self.counts.settled += 1;
    }
}

fn run(seed: u64, steps: u32) -> Counts {
    let mut sim = Sim::new(seed);
    // Everyone starts at once, as a cluster does.
    for b in sim.ids() {
        sim.start(b);
    }
    for _ in 0..steps {
        sim.step();
    }
    sim.settle();
    sim.counts
}

/// Steps per run: `STRAND_CLUSTER_SIM_STEPS`, 400 by default.
fn steps() -> u32 {
    std::env::var("STRAND_CLUSTER_SIM_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(400)
}

fn seeds() -> Vec<u64> {
    if let Some(seed) = std::env::var("STRAND_CLUSTER_SIM_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        return vec![seed];
    }
    let count = std::env::var("STRAND_CLUSTER_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(120u64);
    (0..count).collect()
}

#[test]
fn simulation_keeps_every_invariant() {
    let mut total = Counts::default();
    let steps = steps();
    for seed in seeds() {
        let counts = match std::panic::catch_unwind(|| run(seed, steps)) {
            Ok(c) => c,
            Err(e) => {
                let msg = e
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                panic!(
                    "seed {seed} failed (replay: STRAND_CLUSTER_SIM_SEED={seed} STRAND_CLUSTER_SIM_STEPS={steps}): {msg}"
                );
            }
        };
        total.topics += counts.topics;
        total.refused_rf += counts.refused_rf;
        total.fenced_by_timeout += counts.fenced_by_timeout;
        total.unfenced += counts.unfenced;
        total.controlled_shutdowns += counts.controlled_shutdowns;
        total.isr_changes += counts.isr_changes;
        total.refused_alters += counts.refused_alters;
        total.elections += counts.elections;
        total.refused_elections += counts.refused_elections;
        total.offline_seen += counts.offline_seen;
        total.restarts += counts.restarts;
        total.balanced_checks += counts.balanced_checks;
        total.grown += counts.grown;
        total.producer_blocks += counts.producer_blocks;
        total.settled += counts.settled;
    }
    eprintln!("{total:?}");
    // A run that exercised nothing proves nothing.
    let c = &total;
    for (what, v) in [
        ("topics", c.topics),
        ("refused_rf", c.refused_rf),
        ("fenced_by_timeout", c.fenced_by_timeout),
        ("unfenced", c.unfenced),
        ("controlled_shutdowns", c.controlled_shutdowns),
        ("isr_changes", c.isr_changes),
        ("refused_alters", c.refused_alters),
        ("elections", c.elections),
        ("refused_elections", c.refused_elections),
        ("offline_seen", c.offline_seen),
        ("restarts", c.restarts),
        ("balanced_checks", c.balanced_checks),
        ("grown", c.grown),
        ("producer_blocks", c.producer_blocks),
        ("settled", c.settled),
    ] {
        assert!(v > 0, "the simulation never exercised {what}: {c:?}");
    }
}

#[test]
fn the_same_seed_gives_the_same_run() {
    let a = Sim::new(7);
    let b = Sim::new(7);
    assert_eq!(a.shards, b.shards);
    let mut a = a;
    let mut b = b;
    for s in [&mut a, &mut b] {
        for id in s.ids() {
            s.start(id);
        }
        for _ in 0..300 {
            s.step();
        }
    }
    assert_eq!(a.h.state, b.h.state);
    assert_eq!(a.h.now_ms, b.h.now_ms);
}
