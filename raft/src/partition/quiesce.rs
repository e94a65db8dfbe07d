//! Quiescing idle groups: a node hosting thousands of partition groups cannot afford each one's
//! timers. A group with no activity (no write, no log change) for `idle_after_ms` stops its
//! Raft ticker (no heartbeats, no election timer, no wake-ups); activity wakes it again. What a
//! quiesced follower would have learned from its leader's heartbeats, that the leader is gone,
//! it learns from node liveness instead: each node hears from each peer on a per-node-pair
//! channel (one message per pair and interval, whatever the number of groups), and when a peer
//! has been silent for `peer_timeout_ms` the groups it leads here wake with elections on.
//!
//! A peer that restarted is not silent, but it no longer leads what it led (a restarted replica
//! must win an election again, see `ReplicaStore::read_vote`): when the host learns of a
//! restart (a new incarnation in the cluster metadata), the groups that peer leads here are
//! *suspect* until an append or heartbeat of the group arrives after it. A suspect group wakes
//! and does not quiesce, so that its election timer runs and it elects a leader.
//!
//! A replica that starts (its node restarted) while another node leads its group starts
//! quiesced ([`Quiescer::add_quiesced`]), taking the leader the metadata names for its leader
//! until Raft knows one: its election timer would otherwise run out before the leader, whose
//! group is quiesced, heartbeats to it, and it would take the leadership of a live group. (The
//! leader does not wake its groups when a node returns: on a node with thousands of them, the
//! heartbeats of all of them at once are what overloads the machine while other groups elect.)
//! The host stops taking that node for the leader once the metadata no longer names it (the
//! controller took the leadership away, or another node reported an election): the group then
//! has no leader here and wakes to elect. This is a mitigation, not a guarantee: a replica whose node starts from metadata that still
//! names an old leader, or none, campaigns, and a quiesced follower, hearing no heartbeats,
//! holds no leader lease with which to refuse it.
//!
//! Sans-I/O: the host feeds it activity, peers heard from and the time, and applies the
//! [`Action`]s it returns to the groups' Rafts ([`apply`]).

use std::collections::BTreeMap;

use openraft::storage::RaftStateMachine;
use openraft::{AsyncRuntime, Raft};

use super::types::{BrokerId, PartitionRaft};

/// When groups quiesce and when a silent peer counts as gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuiesceConfig {
    /// A group with no activity for this long quiesces. Longer than a heartbeat interval, so
    /// that the last commit index has reached the followers.
    pub idle_after_ms: u64,
    /// A peer not heard from for this long is taken for gone: the quiesced groups it leads
    /// here wake and elect. An awake follower that has not heard its leader for this long does
    /// not quiesce (it is electing), which takes `idle_after_ms` longer than this.
    pub peer_timeout_ms: u64,
}

/// What to do to a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Stop its ticker.
    Quiesce,
    /// Start its ticker again (a leader also renews its lease at once). `leader_lost`: the
    /// leader this node knew of no longer leads (its node silent, restarted, or it stopped
    /// writing and heartbeating sooner than a leader quiesces), so the group must elect.
    Wake { leader_lost: Option<BrokerId> },
}

#[derive(Debug, Clone, Copy)]
struct GroupState {
    last_activity_ms: u64,
    /// When an append or heartbeat of the group last arrived (or it was added).
    leader_heard_ms: u64,
    /// When an append carrying entries (a write) last arrived, if one did since the group was
    /// added or last woke.
    leader_wrote_ms: Option<u64>,
    quiesced: bool,
}

/// Why a group's leader, as the host knows it, may no longer lead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Doubt {
    /// No leader known.
    Unknown,
    /// Its node is silent, or restarted and not heard from as the leader since.
    Lost(BrokerId),
}

/// The quiescing state of the groups one node hosts.
#[derive(Debug, Clone)]
pub struct Quiescer<G> {
    config: QuiesceConfig,
    groups: BTreeMap<G, GroupState>,
    peers: BTreeMap<BrokerId, u64>,
    /// When the host learned that each peer restarted.
    restarted: BTreeMap<BrokerId, u64>,
}

impl<G: Ord + Copy> Quiescer<G> {
    pub fn new(config: QuiesceConfig) -> Self {
        Quiescer {
            config,
            groups: BTreeMap::new(),
            peers: BTreeMap::new(),
            restarted: BTreeMap::new(),
        }
    }

    /// A group the node hosts from now on, active.
    pub fn add(&mut self, group: G, now_ms: u64) {
        self.groups.insert(
            group,
            GroupState {
                last_activity_ms: now_ms,
                leader_heard_ms: now_ms,
                leader_wrote_ms: None,
                quiesced: false,
            },
        );
    }

    /// A group the node hosts from now on, quiesced: a replica whose leader, as the host
    /// believes, is another node (see the module documentation).
    pub fn add_quiesced(&mut self, group: G, now_ms: u64) {
        self.groups.insert(
            group,
            GroupState {
                last_activity_ms: now_ms,
                leader_heard_ms: now_ms,
                leader_wrote_ms: None,
                quiesced: true,
            },
        );
    }

    pub fn remove(&mut self, group: G) {
        self.groups.remove(&group);
    }

    /// Something happened in `group` (a write, a change of its log or leader): it stays or
    /// becomes active. Returns [`Action::Wake`] if it was quiesced.
    pub fn activity(&mut self, group: G, now_ms: u64) -> Option<Action> {
        let g = self.groups.get_mut(&group)?;
        g.last_activity_ms = g.last_activity_ms.max(now_ms);
        if g.quiesced {
            g.quiesced = false;
            g.leader_wrote_ms = None;
            return Some(Action::Wake { leader_lost: None });
        }
        None
    }

    /// A message from `peer` arrived.
    pub fn peer_heard(&mut self, peer: BrokerId, now_ms: u64) {
        let at = self.peers.entry(peer).or_insert(now_ms);
        *at = (*at).max(now_ms);
    }

    /// `peer` is a new process (it registered again with another incarnation): the groups it
    /// leads here are suspect until they hear from their leader ([`Quiescer::leader_heard`]).
    pub fn peer_restarted(&mut self, peer: BrokerId, now_ms: u64) {
        let at = self.restarted.entry(peer).or_insert(now_ms);
        *at = (*at).max(now_ms);
    }

    /// An append or a heartbeat of `group` arrived (only a leader sends them).
    pub fn leader_heard(&mut self, group: G, now_ms: u64) {
        if let Some(g) = self.groups.get_mut(&group) {
            g.leader_heard_ms = g.leader_heard_ms.max(now_ms);
        }
    }

    /// An append carrying entries of `group` arrived: its leader writes.
    pub fn leader_wrote(&mut self, group: G, now_ms: u64) {
        if let Some(g) = self.groups.get_mut(&group) {
            g.leader_heard_ms = g.leader_heard_ms.max(now_ms);
            g.leader_wrote_ms = Some(g.leader_wrote_ms.map_or(now_ms, |w| w.max(now_ms)));
        }
    }

    /// Whether `peer` was heard from within the peer timeout.
    pub fn peer_live(&self, peer: BrokerId, now_ms: u64) -> bool {
        self.peers
            .get(&peer)
            .is_some_and(|&at| now_ms.saturating_sub(at) <= self.config.peer_timeout_ms)
    }

    pub fn is_quiesced(&self, group: G) -> bool {
        self.groups.get(&group).is_some_and(|g| g.quiesced)
    }

    pub fn quiesced_count(&self) -> usize {
        self.groups.values().filter(|g| g.quiesced).count()
    }

    /// The actions due at `now_ms`. `leader_of` says who leads each group as this node knows it
    /// (`None`: no leader known); `me` is this node.
    ///
    /// A quiesced group wakes when its leader may be gone: none is known, its node is silent,
    /// or restarted and not heard from since, or it stopped writing and heartbeating sooner
    /// after its last write than a leader quiesces (`idle_after_ms`, heartbeating until then;
    /// the host counts a leader's sending of entries, a catch-up included, as its activity):
    /// a quiesced follower has no election timer to find that out, and a node that restarted at
    /// once answers pings. An awake group quiesces once idle for `idle_after_ms`, unless it is
    /// a follower that has not heard its leader for the peer timeout (its election timer is
    /// finding the leader gone).
    pub fn tick(
        &mut self,
        now_ms: u64,
        me: BrokerId,
        leader_of: impl Fn(G) -> Option<BrokerId>,
    ) -> Vec<(G, Action)> {
        let config = self.config;
        let mut actions = Vec::new();
        // Each peer's silence, worked out once per tick (a node has few peers, many groups). A
        // peer never heard from counts as alive until the timeout has passed since the first
        // tick that asked.
        let mut silent: Vec<(BrokerId, bool)> = Vec::new();
        for (id, g) in self.groups.iter_mut() {
            let leader = leader_of(*id);
            let doubt = match leader {
                Some(l) if l == me => None,
                Some(l) => {
                    let gone = match silent.iter().find(|(p, _)| *p == l) {
                        Some((_, s)) => *s,
                        None => {
                            let at = *self.peers.entry(l).or_insert(now_ms);
                            let s = now_ms.saturating_sub(at) > config.peer_timeout_ms;
                            silent.push((l, s));
                            s
                        }
                    };
                    let restarted = self.restarted.get(&l).is_some_and(|&at| at >= g.leader_heard_ms);
                    (gone || restarted).then_some(Doubt::Lost(l))
                }
                None => Some(Doubt::Unknown),
            };
            let leader_quiet = now_ms.saturating_sub(g.leader_heard_ms) > config.peer_timeout_ms;
            if g.quiesced {
                // A leader heartbeats for `idle_after_ms` after its last write before it
                // quiesces; one that went quiet within half of that is not quiescing.
                let abandoned = leader.filter(|l| *l != me).filter(|_| {
                    leader_quiet
                        && g.leader_wrote_ms
                            .is_some_and(|w| g.leader_heard_ms < w.saturating_add(config.idle_after_ms / 2))
                });
                let leader_lost = match doubt {
                    Some(Doubt::Lost(l)) => Some(Some(l)),
                    Some(Doubt::Unknown) => Some(None),
                    None => abandoned.map(Some),
                };
                if let Some(leader_lost) = leader_lost {
                    g.quiesced = false;
                    g.last_activity_ms = now_ms;
                    g.leader_wrote_ms = None;
                    actions.push((*id, Action::Wake { leader_lost }));
                }
            } else if doubt.is_none()
                && now_ms.saturating_sub(g.last_activity_ms) >= config.idle_after_ms
                && (leader == Some(me) || !leader_quiet)
            {
                // An awake follower that has not heard its leader for the peer timeout stays
                // awake: its election timer is how it finds a lost leader gone.
                g.quiesced = true;
                actions.push((*id, Action::Quiesce));
            }
        }
        actions
    }
}

/// Applies an action to a group's Raft.
pub async fn apply<Rt, Sm>(raft: &Raft<PartitionRaft<Rt>, Sm>, action: Action)
where
    Rt: AsyncRuntime,
    Sm: RaftStateMachine<PartitionRaft<Rt>>,
{
    match action {
        Action::Quiesce => raft.runtime_config().tick(false),
        Action::Wake { .. } => {
            raft.runtime_config().tick(true);
            // A leader whose lease lapsed while quiesced takes writes again once a round of
            // heartbeats is acknowledged; start that round now rather than at the next tick.
            // A node that is shutting down has nothing to renew.
            let _ = raft.trigger().heartbeat().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFIG: QuiesceConfig = QuiesceConfig {
        idle_after_ms: 500,
        peer_timeout_ms: 1_000,
    };

    /// As the broker has them: idle for longer than a peer takes to count as silent.
    const BROKER_CONFIG: QuiesceConfig = QuiesceConfig {
        idle_after_ms: 2_000,
        peer_timeout_ms: 1_000,
    };

    fn lost(node: u64) -> Action {
        Action::Wake {
            leader_lost: Some(BrokerId(node)),
        }
    }

    #[test]
    fn idle_groups_quiesce_and_activity_wakes_them() {
        let mut q = Quiescer::new(CONFIG);
        q.add(1u32, 0);
        q.add(2u32, 0);
        let me = BrokerId(1);
        assert!(q.tick(400, me, |_| Some(me)).is_empty());
        q.activity(2, 400);
        assert_eq!(q.tick(500, me, |_| Some(me)), vec![(1, Action::Quiesce)]);
        assert_eq!(q.tick(900, me, |_| Some(me)), vec![(2, Action::Quiesce)]);
        assert_eq!(q.activity(1, 1_000), Some(Action::Wake { leader_lost: None }));
        assert_eq!(q.activity(1, 1_001), None);
        assert_eq!(q.quiesced_count(), 1);
    }

    #[test]
    fn groups_led_by_a_restarted_peer_stay_awake_until_they_hear_from_it() {
        let mut q = Quiescer::new(CONFIG);
        let me = BrokerId(1);
        q.add(1u32, 0);
        q.add(2u32, 0);
        let leader = |_: u32| Some(BrokerId(2));
        q.peer_heard(BrokerId(2), 0);
        assert_eq!(q.tick(600, me, leader).len(), 2, "both quiesce");
        // Node 2 restarted: alive, but its groups here are suspect.
        q.peer_heard(BrokerId(2), 700);
        q.peer_restarted(BrokerId(2), 700);
        assert_eq!(q.tick(700, me, leader), vec![(1, lost(2)), (2, lost(2))]);
        // Group 1 hears from its leader (it still leads); group 2 does not (it lost its log).
        q.leader_heard(1, 750);
        q.peer_heard(BrokerId(2), 1_200);
        assert_eq!(q.tick(1_200, me, leader), vec![(1, Action::Quiesce)]);
        q.peer_heard(BrokerId(2), 5_000);
        assert!(
            q.tick(5_000, me, leader).is_empty(),
            "a suspect group does not quiesce, however idle"
        );
        // Another node wins group 2's election: the suspicion was of node 2 only.
        let new_leader = |g: u32| Some(if g == 1 { BrokerId(2) } else { BrokerId(3) });
        q.peer_heard(BrokerId(3), 5_000);
        q.activity(2, 5_000);
        q.leader_heard(2, 5_000);
        assert_eq!(q.tick(5_600, me, new_leader), vec![(2, Action::Quiesce)]);
    }

    /// A quiesced follower whose leader stops in the middle of its writes wakes to elect,
    /// though the leader's node answers pings (it restarted at once); one whose leader
    /// quiesced after its writes, heartbeating until then, stays quiet.
    #[test]
    fn a_quiesced_follower_whose_leader_stops_writing_at_once_wakes_to_elect() {
        let mut q = Quiescer::new(BROKER_CONFIG);
        let me = BrokerId(1);
        let leader = |_: u32| Some(BrokerId(2));
        q.add_quiesced(1u32, 0);
        q.add_quiesced(2u32, 0);
        // Both leaders write until 1,000.
        for now in (100..=1_000).step_by(100) {
            q.peer_heard(BrokerId(2), now);
            q.leader_wrote(1, now);
            q.leader_wrote(2, now);
            assert!(q.tick(now, me, leader).is_empty());
        }
        // Group 1's leader is gone at once; group 2's heartbeats for 2 s, then quiesces.
        for now in (1_100..=6_000).step_by(100) {
            q.peer_heard(BrokerId(2), now);
            if now <= 3_000 {
                q.leader_heard(2, now);
            }
            let actions = q.tick(now, me, leader);
            let expected = if now == 2_100 { vec![(1, lost(2))] } else { vec![] };
            assert_eq!(actions, expected, "at {now}");
        }
        assert!(q.is_quiesced(2));
    }

    /// A follower that stopped hearing its leader is electing (its Raft's timer runs): it does
    /// not quiesce, however idle, while its leader's node answers pings (a restarted node
    /// does, and leads nothing any more). Quiesced, it would have waited for the metadata to
    /// report the restart, which takes a controller.
    #[test]
    fn an_awake_follower_that_stopped_hearing_its_leader_does_not_quiesce() {
        let mut q = Quiescer::new(BROKER_CONFIG);
        let me = BrokerId(1);
        let leader = |_: u32| Some(BrokerId(2));
        q.add(1u32, 0);
        q.add(2u32, 0);
        // Writes to both until 400; then group 1's leader is gone, group 2's heartbeats on.
        q.activity(1, 400);
        q.activity(2, 400);
        q.leader_heard(1, 400);
        for now in (500..=5_000).step_by(100) {
            q.peer_heard(BrokerId(2), now);
            q.leader_heard(2, now);
            let actions = q.tick(now, me, leader);
            assert!(
                actions.iter().all(|(g, _)| *g != 1),
                "group 1 stays awake at {now}"
            );
            assert_eq!(
                actions.contains(&(2, Action::Quiesce)),
                now == 2_400,
                "group 2 quiesces once idle, at {now}"
            );
        }
        assert!(!q.is_quiesced(1));
        // Once the group hears a leader again it quiesces as usual.
        q.leader_heard(1, 5_000);
        assert_eq!(q.tick(5_100, me, leader), vec![(1, Action::Quiesce)]);
    }

    #[test]
    fn a_peer_is_live_within_the_timeout_of_its_last_message() {
        let mut q: Quiescer<u32> = Quiescer::new(CONFIG);
        let peer = BrokerId(2);
        assert!(!q.peer_live(peer, 0), "never heard from");
        q.peer_heard(peer, 0);
        assert!(q.peer_live(peer, 1_000) && !q.peer_live(peer, 1_001));
        q.peer_heard(peer, 900);
        assert!(q.peer_live(peer, 1_900));
    }

    #[test]
    fn a_replica_added_quiesced_stays_so_while_its_believed_leader_is_heard() {
        let mut q = Quiescer::new(CONFIG);
        let me = BrokerId(1);
        let leader = BrokerId(2);
        q.add_quiesced(1u32, 0);
        assert!(q.is_quiesced(1));
        q.peer_heard(leader, 0);
        assert!(q.tick(900, me, |_| Some(leader)).is_empty(), "no election timer");
        q.peer_heard(leader, 1_500);
        assert!(q.tick(2_000, me, |_| Some(leader)).is_empty());
        // The leader stops answering: the replica wakes to elect.
        assert_eq!(q.tick(2_600, me, |_| Some(leader)), vec![(1, lost(2))]);
        // Raft names no leader and none is believed: it wakes at once.
        q.add_quiesced(2u32, 2_600);
        assert_eq!(
            q.tick(2_700, me, |_| None),
            vec![(2, Action::Wake { leader_lost: None })]
        );
    }

    #[test]
    fn groups_led_by_a_silent_peer_wake_to_elect() {
        let mut q = Quiescer::new(CONFIG);
        let me = BrokerId(1);
        q.add(1u32, 0);
        q.add(2u32, 0);
        let leader = |g: u32| Some(if g == 1 { BrokerId(2) } else { BrokerId(3) });
        q.peer_heard(BrokerId(2), 0);
        q.peer_heard(BrokerId(3), 0);
        assert_eq!(q.tick(600, me, leader).len(), 2, "both quiesce");
        q.peer_heard(BrokerId(3), 1_200);
        // Node 2 has been silent for 1,100 ms: the group it leads wakes; node 3's stays.
        assert_eq!(q.tick(1_100, me, leader), vec![(1, lost(2))]);
        assert!(q.is_quiesced(2));
        // A group with no known leader never quiesces.
        q.add(3u32, 1_100);
        assert!(q
            .tick(5_000, me, |g| if g == 3 { None } else { leader(g) })
            .iter()
            .all(|(g, _)| *g != 3));
    }
}
