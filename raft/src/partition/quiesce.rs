//! Quiescing idle groups, and electing those without a leader: a node hosting thousands of
//! partition groups cannot afford each one's timers. A group with no activity (no write, no
//! log change, no new leader) for `idle_after_ms` stops its Raft ticker (no heartbeats, no
//! election timer, no wake-ups); activity wakes it again. What a quiesced follower would have
//! learned from its leader's heartbeats, that the leader is gone, it learns from node liveness
//! instead: each node hears from each peer on a per-node-pair channel (one message per pair
//! and interval, whatever the number of groups), and when a peer has been silent for
//! `peer_timeout_ms` the groups it leads here have lost their leader.
//!
//! A peer that restarted is not silent, but it no longer leads what it led (a restarted replica
//! must win an election again, see `ReplicaStore::read_vote`): when the host learns of a
//! restart (a new incarnation in the cluster metadata), the groups that peer leads here are
//! *suspect* until an append or heartbeat of the group arrives after it.
//!
//! **Elections are the host's, not the election timers'.** A quiesced group without a leader
//! (none known, or the known one lost) stays quiesced, and the host campaigns for it (Raft's
//! `elect`, with a pre-vote) when this node's turn comes ([`Quiescer::campaigns`]): the
//! replicas rank the candidates alike (preference order, less the lost leader and silent
//! peers), the first campaigns at once and each next one a campaign window later, and a node
//! has at most `max_campaigns` campaigns in flight. A replica that heard its leader within the
//! leader lease is not due yet (its Raft would skip the campaign): it campaigns once the lease
//! has run out. An awake group that loses its leader keeps
//! its election timer (a follower under writes finds a dead leader fastest that way) for
//! `idle_after_ms`, then quiesces and is the host's to elect. Thousands of groups left
//! leaderless at once (a node's restart, a whole cluster's) thus cost a bounded number of
//! campaigns at a time; with every replica's timer running, a small machine spent its time
//! ticking them, and their campaigns timed out and overtook each other without end. A term
//! without a leader seen on a replica (a campaign under way, maybe one it voted in) moves the
//! turns of the others later ([`Quiescer::campaign_seen`]), so that a slow election is not
//! split by the next candidate.
//!
//! A replica that starts (its node restarted) starts quiesced: under the leader the metadata
//! names, if another node was elected ([`Quiescer::add_quiesced`]; its election timer would
//! otherwise run out before the leader, quiesced, heartbeats to it, and it would take the
//! leadership of a live group), or leaderless. One that the metadata names the leader, a
//! leadership the restart ended, ranks itself last ([`Quiescer::add_former_leader`]): the
//! others have most likely elected a leader it has not heard from yet. (The leader does not
//! wake its groups when a node returns: on a node with thousands of them, the heartbeats of
//! all of them at once are what overloads the machine while other groups elect.) The host
//! follows the metadata for a replica whose Raft knows no leader. This is a mitigation, not a
//! guarantee: a quiesced follower, hearing no heartbeats, holds no leader lease with which to
//! refuse a campaign against a live leader it has not heard from.
//!
//! Sans-I/O: the host feeds it activity, peers heard from and the time, applies the
//! [`Action`]s it returns to the groups' Rafts ([`apply`]) and campaigns where it says.

use std::collections::BTreeMap;

use openraft::storage::RaftStateMachine;
use openraft::{AsyncRuntime, Raft};

use super::types::{BrokerId, PartitionRaft};

/// When groups quiesce, when a silent peer counts as gone, and how elections are paced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuiesceConfig {
    /// A group with no activity for this long quiesces. Longer than a heartbeat interval, so
    /// that the last commit index has reached the followers. An awake group that has known no
    /// leader for this long quiesces too, and its elections are the host's from then on.
    pub idle_after_ms: u64,
    /// A peer not heard from for this long is taken for gone: the quiesced groups it leads
    /// here elect. An awake follower that has not heard its leader for this long does not
    /// quiesce (its election timer is electing).
    pub peer_timeout_ms: u64,
    /// How long a campaign has to produce a leader before the next replica in line campaigns
    /// ([`Quiescer::campaigns`]). About the longest election timeout.
    pub campaign_window_ms: u64,
    /// How long a replica that heard its leader refuses to campaign (openraft's leader lease,
    /// within which it skips the pre-vote it is asked for): the host does not count a campaign
    /// for a group whose leader was heard within it, and campaigns once it has run out. A
    /// campaign made inside it did nothing and still took the replica's turn, so the next
    /// replica in line campaigned a whole window later.
    pub leader_lease_ms: u64,
    /// Campaigns of one host started within the last window and not yet decided, at most:
    /// thousands of groups that lose their leader at once elect in rounds of this many, not
    /// all together, which on a small machine times every one of them out.
    pub max_campaigns: usize,
}

/// What to do to a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Stop its ticker.
    Quiesce,
    /// Start its ticker again (a leader also renews its lease at once).
    Wake,
}

#[derive(Debug, Clone, Copy)]
struct GroupState {
    last_activity_ms: u64,
    /// When an append or heartbeat of the group last arrived (or it was added).
    leader_heard_ms: u64,
    /// When one last arrived, if one did: the start of the replica's leader lease.
    lease_from_ms: Option<u64>,
    /// When an append carrying entries (a write) last arrived, if one did since the group was
    /// added or last woke.
    leader_wrote_ms: Option<u64>,
    quiesced: bool,
    /// Since when the group has had no leader, as far as this node can tell (none known, or
    /// the known one lost), and which leader was lost.
    leaderless: Option<Leaderless>,
}

#[derive(Debug, Clone, Copy)]
struct Leaderless {
    since_ms: u64,
    lost: Option<BrokerId>,
    /// When this node last campaigned for the group.
    campaigned_ms: Option<u64>,
}

/// Why a group's leader, as the host knows it, may no longer lead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Doubt {
    /// No leader known.
    Unknown,
    /// Its node is silent, or restarted and not heard from as the leader since, or it
    /// stopped writing and heartbeating sooner than a leader quiesces.
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
        self.insert(group, now_ms, false);
    }

    /// A group the node hosts from now on, quiesced: a replica whose leader, as the host
    /// believes, is another node, or a replica of a group with no leader, which the host
    /// elects ([`Quiescer::campaigns`]) rather than its election timer (see the module
    /// documentation).
    pub fn add_quiesced(&mut self, group: G, now_ms: u64) {
        self.insert(group, now_ms, true);
    }

    /// A group the node hosts from now on, quiesced, that the node led before it restarted:
    /// it no longer does, and another replica has most likely been elected since. It takes its
    /// turn to campaign last ([`Quiescer::campaigns`]), after the other live replicas had
    /// theirs, so that it does not depose a leader it has not heard from yet.
    pub fn add_former_leader(&mut self, group: G, now_ms: u64, me: BrokerId) {
        self.insert(group, now_ms, true);
        if let Some(g) = self.groups.get_mut(&group) {
            g.leaderless = Some(Leaderless {
                since_ms: now_ms,
                lost: Some(me),
                campaigned_ms: None,
            });
        }
    }

    fn insert(&mut self, group: G, now_ms: u64, quiesced: bool) {
        self.groups.insert(
            group,
            GroupState {
                last_activity_ms: now_ms,
                leader_heard_ms: now_ms,
                lease_from_ms: None,
                leader_wrote_ms: None,
                quiesced,
                leaderless: None,
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
            return Some(Action::Wake);
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
            g.lease_from_ms = Some(g.lease_from_ms.map_or(now_ms, |l| l.max(now_ms)));
        }
    }

    /// An append carrying entries of `group` arrived: its leader writes.
    pub fn leader_wrote(&mut self, group: G, now_ms: u64) {
        if let Some(g) = self.groups.get_mut(&group) {
            g.leader_heard_ms = g.leader_heard_ms.max(now_ms);
            g.lease_from_ms = Some(g.lease_from_ms.map_or(now_ms, |l| l.max(now_ms)));
            g.leader_wrote_ms = Some(g.leader_wrote_ms.map_or(now_ms, |w| w.max(now_ms)));
        }
    }

    /// A campaign for `group` is under way (its Raft moved to a new term without a leader):
    /// the replicas' turns to campaign ([`Quiescer::campaigns`]) count from now, so that a
    /// slow election is not overtaken by the next candidate in line, which would split it.
    pub fn campaign_seen(&mut self, group: G, now_ms: u64) {
        if let Some(g) = self.groups.get_mut(&group) {
            match g.leaderless.as_mut() {
                Some(l) => l.since_ms = l.since_ms.max(now_ms),
                None => {
                    g.leaderless = Some(Leaderless {
                        since_ms: now_ms,
                        lost: None,
                        campaigned_ms: None,
                    })
                }
            }
        }
    }

    /// How long a peer may be silent before it is taken for lost.
    pub fn peer_timeout_ms(&self) -> u64 {
        self.config.peer_timeout_ms
    }

    /// Whether `peer` was heard from within the peer timeout.
    pub fn peer_live(&self, peer: BrokerId, now_ms: u64) -> bool {
        self.peers
            .get(&peer)
            .is_some_and(|&at| now_ms.saturating_sub(at) <= self.config.peer_timeout_ms)
    }

    /// Whether `me` and the nodes of `voters` it heard from within the peer timeout are a
    /// majority of `voters`: what a leader that must not act alone (a coordinator answering
    /// from memory) checks, since a Raft leader cut off from its followers stays leader in its
    /// own eyes until a higher term reaches it. Quiesced groups send no heartbeats, so the
    /// node's liveness stands for theirs, as it does for their followers.
    pub fn hears_majority(
        &self,
        me: BrokerId,
        voters: impl IntoIterator<Item = BrokerId>,
        now_ms: u64,
    ) -> bool {
        let (mut heard, mut all) = (0usize, 0usize);
        for v in voters {
            all += 1;
            if v == me || self.peer_live(v, now_ms) {
                heard += 1;
            }
        }
        heard * 2 > all
    }

    pub fn is_quiesced(&self, group: G) -> bool {
        self.groups.get(&group).is_some_and(|g| g.quiesced)
    }

    pub fn quiesced_count(&self) -> usize {
        self.groups.values().filter(|g| g.quiesced).count()
    }

    /// Quiesced groups without a leader that this node campaigned for within the last
    /// campaign window.
    pub fn campaigns_in_flight(&self, now_ms: u64) -> usize {
        let window = self.config.campaign_window_ms;
        self.groups
            .values()
            .filter(|g| g.quiesced)
            .filter_map(|g| g.leaderless)
            .filter(|l| l.campaigned_ms.is_some_and(|c| now_ms.saturating_sub(c) < window))
            .count()
    }

    /// The actions due at `now_ms`. `leader_of` says who leads each group as this node knows it
    /// (`None`: no leader known); `me` is this node.
    ///
    /// A group may have lost its leader: none is known, the leader's node is silent, or
    /// restarted and not heard from since, or the leader stopped writing and heartbeating
    /// sooner after its last write than a leader quiesces (`idle_after_ms`, heartbeating until
    /// then; the host counts a leader's sending of entries, a catch-up included, as its
    /// activity). A quiesced group that lost its leader stays quiesced: it has no election
    /// timer, and the host campaigns for it when its turn comes ([`Quiescer::campaigns`]). An
    /// awake one keeps its election timer for `idle_after_ms`, then quiesces and is the
    /// host's to elect too. An awake group with a leader quiesces once idle for
    /// `idle_after_ms`, unless it is a follower that has not heard its leader for the peer
    /// timeout (its election timer is finding the leader gone).
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
            let leader_quiet = now_ms.saturating_sub(g.leader_heard_ms) > config.peer_timeout_ms;
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
                    // A leader heartbeats for `idle_after_ms` after its last write before it
                    // quiesces; one that went quiet within half of that is not quiescing. (An
                    // awake follower's election timer finds that out itself.)
                    let abandoned = g.quiesced
                        && leader_quiet
                        && g.leader_wrote_ms
                            .is_some_and(|w| g.leader_heard_ms < w.saturating_add(config.idle_after_ms / 2));
                    (gone || restarted || abandoned).then_some(Doubt::Lost(l))
                }
                None => Some(Doubt::Unknown),
            };
            match doubt {
                Some(d) => {
                    let lost = match d {
                        Doubt::Lost(l) => Some(l),
                        Doubt::Unknown => None,
                    };
                    let l = g.leaderless.get_or_insert(Leaderless {
                        since_ms: now_ms,
                        lost,
                        campaigned_ms: None,
                    });
                    l.lost = lost.or(l.lost);
                    if !g.quiesced && now_ms.saturating_sub(l.since_ms) >= config.idle_after_ms {
                        g.quiesced = true;
                        actions.push((*id, Action::Quiesce));
                    }
                }
                None => {
                    g.leaderless = None;
                    if !g.quiesced
                        && now_ms.saturating_sub(g.last_activity_ms) >= config.idle_after_ms
                        && (leader == Some(me) || !leader_quiet)
                    {
                        // An awake follower that has not heard its leader for the peer timeout
                        // stays awake: its election timer is how it finds a lost leader gone.
                        g.quiesced = true;
                        actions.push((*id, Action::Quiesce));
                    }
                }
            }
        }
        actions
    }

    /// The quiesced groups without a leader that this node campaigns for now (the host calls
    /// Raft's `elect` on them). `replicas_of` lists a group's replicas in preference order.
    ///
    /// Every replica ranks the candidates alike: the replicas in preference order, less the
    /// lost leader and the peers silent for the peer timeout (a peer never heard from counts
    /// as alive until the timeout has passed since it was first asked about; a restarted
    /// former leader ranks itself last). The first
    /// campaigns at once, the next one campaign window after the group lost its leader if it
    /// still has none, and so on; each campaigns again every window times the number of
    /// candidates, so that two of them do not campaign together and split the votes. At most
    /// `max_campaigns` campaigns are in flight (started within the window, the group still
    /// leaderless); the rest wait for the next tick, in group order, so that the nodes
    /// campaign for the same groups at about the same time.
    pub fn campaigns(
        &mut self,
        now_ms: u64,
        me: BrokerId,
        replicas_of: impl Fn(G) -> Vec<BrokerId>,
    ) -> Vec<G> {
        let config = self.config;
        let window = config.campaign_window_ms.max(1);
        let mut budget = config
            .max_campaigns
            .saturating_sub(self.campaigns_in_flight(now_ms));
        let mut due = Vec::new();
        let peers = &mut self.peers;
        for (id, g) in self.groups.iter_mut() {
            if budget == 0 {
                break;
            }
            if !g.quiesced {
                continue;
            }
            let Some(l) = g.leaderless.as_mut() else {
                continue;
            };
            if l.campaigned_ms.is_some_and(|c| now_ms.saturating_sub(c) < window) {
                continue;
            }
            // Within its lease the replica's Raft would skip the campaign.
            if g.lease_from_ms
                .is_some_and(|h| now_ms.saturating_sub(h) < config.leader_lease_ms)
            {
                continue;
            }
            let mut rank = None;
            let mut candidates = 0u64;
            // A lost leader is no candidate, unless it is this node (a restarted leader),
            // which comes last.
            let last = l.lost == Some(me);
            for r in replicas_of(*id) {
                if Some(r) == l.lost {
                    continue;
                }
                if r != me {
                    let heard = *peers.entry(r).or_insert(now_ms);
                    if now_ms.saturating_sub(heard) > config.peer_timeout_ms {
                        continue;
                    }
                } else {
                    rank = Some(candidates);
                }
                candidates += 1;
            }
            if last {
                rank = Some(candidates);
                candidates += 1;
            }
            let Some(rank) = rank else { continue };
            if now_ms.saturating_sub(l.since_ms) < rank.saturating_mul(window) {
                continue;
            }
            if l.campaigned_ms
                .is_some_and(|c| now_ms.saturating_sub(c) < candidates.saturating_mul(window))
            {
                continue;
            }
            l.campaigned_ms = Some(now_ms);
            due.push(*id);
            budget -= 1;
        }
        due
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
        Action::Wake => {
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
        campaign_window_ms: 1_000,
        leader_lease_ms: 300,
        max_campaigns: 100,
    };

    /// As the broker has them: idle for longer than a peer takes to count as silent.
    const BROKER_CONFIG: QuiesceConfig = QuiesceConfig {
        idle_after_ms: 2_000,
        peer_timeout_ms: 1_000,
        campaign_window_ms: 1_200,
        leader_lease_ms: 600,
        max_campaigns: 100,
    };

    /// Every group's replicas in preference order: 2, then 1 (this node), then 3.
    fn two_one_three(_: u32) -> Vec<BrokerId> {
        vec![BrokerId(2), BrokerId(1), BrokerId(3)]
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
        assert_eq!(q.activity(1, 1_000), Some(Action::Wake));
        assert_eq!(q.activity(1, 1_001), None);
        assert_eq!(q.quiesced_count(), 1);
    }

    #[test]
    fn groups_led_by_a_restarted_peer_are_elected_until_they_hear_from_it() {
        let mut q = Quiescer::new(CONFIG);
        let me = BrokerId(1);
        q.add(1u32, 0);
        q.add(2u32, 0);
        let leader = |_: u32| Some(BrokerId(2));
        q.peer_heard(BrokerId(2), 0);
        q.peer_heard(BrokerId(3), 0);
        assert_eq!(q.tick(600, me, leader).len(), 2, "both quiesce");
        // Node 2 restarted: alive, but its groups here are suspect; they stay quiesced, and
        // this node, the first live replica after the lost leader, campaigns for both.
        q.peer_heard(BrokerId(2), 700);
        q.peer_heard(BrokerId(3), 700);
        q.peer_restarted(BrokerId(2), 700);
        assert!(q.tick(700, me, leader).is_empty());
        assert_eq!(q.campaigns(700, me, two_one_three), vec![1, 2]);
        assert_eq!(q.campaigns_in_flight(700), 2);
        // Group 1 hears from its leader (it still leads); group 2 does not (it lost its log).
        q.leader_heard(1, 750);
        q.peer_heard(BrokerId(2), 1_200);
        q.peer_heard(BrokerId(3), 1_200);
        assert!(q.tick(1_200, me, leader).is_empty());
        assert_eq!(q.campaigns_in_flight(1_200), 1, "group 1 has its leader");
        // Group 2 is campaigned for again once every candidate had its window (two here).
        q.peer_heard(BrokerId(2), 2_600);
        q.peer_heard(BrokerId(3), 2_600);
        assert!(q.tick(2_600, me, leader).is_empty());
        assert!(q.campaigns(2_600, me, two_one_three).is_empty());
        assert!(q.tick(2_700, me, leader).is_empty());
        assert_eq!(q.campaigns(2_700, me, two_one_three), vec![2]);
        // Another node wins group 2's election: the suspicion was of node 2 only.
        let new_leader = |g: u32| Some(if g == 1 { BrokerId(2) } else { BrokerId(3) });
        q.activity(2, 2_750);
        q.leader_heard(2, 2_750);
        assert!(q.tick(2_800, me, new_leader).is_empty());
        assert_eq!(q.campaigns_in_flight(2_800), 0);
        q.peer_heard(BrokerId(3), 3_300);
        assert_eq!(q.tick(3_300, me, new_leader), vec![(2, Action::Quiesce)]);
        assert!(q.campaigns(3_300, me, two_one_three).is_empty());
    }

    /// A quiesced follower whose leader stops in the middle of its writes is elected, though
    /// the leader's node answers pings (it restarted at once); one whose leader quiesced after
    /// its writes, heartbeating until then, stays quiet.
    #[test]
    fn a_quiesced_follower_whose_leader_stops_writing_at_once_is_elected() {
        let mut q = Quiescer::new(BROKER_CONFIG);
        let me = BrokerId(1);
        let leader = |_: u32| Some(BrokerId(2));
        q.add_quiesced(1u32, 0);
        q.add_quiesced(2u32, 0);
        // Both leaders write until 1,000.
        for now in (100..=1_000).step_by(100) {
            q.peer_heard(BrokerId(2), now);
            q.peer_heard(BrokerId(3), now);
            q.leader_wrote(1, now);
            q.leader_wrote(2, now);
            assert!(q.tick(now, me, leader).is_empty());
            assert!(q.campaigns(now, me, two_one_three).is_empty());
        }
        // Group 1's leader is gone at once; group 2's heartbeats for 2 s, then quiesces.
        for now in (1_100..=6_000).step_by(100) {
            q.peer_heard(BrokerId(2), now);
            q.peer_heard(BrokerId(3), now);
            if now <= 3_000 {
                q.leader_heard(2, now);
            }
            assert!(q.tick(now, me, leader).is_empty(), "at {now}");
            let expected = if now == 2_100 || now == 4_500 {
                vec![1]
            } else {
                vec![]
            };
            assert_eq!(q.campaigns(now, me, two_one_three), expected, "at {now}");
        }
        assert!(q.is_quiesced(1) && q.is_quiesced(2));
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
        assert!(q.campaigns(900, me, two_one_three).is_empty());
        q.peer_heard(leader, 1_500);
        assert!(q.tick(2_000, me, |_| Some(leader)).is_empty());
        // The leader stops answering: this node, next in line, campaigns.
        assert!(q.tick(2_600, me, |_| Some(leader)).is_empty());
        assert_eq!(q.campaigns(2_600, me, two_one_three), vec![1]);
        // Raft names no leader and none is believed: the first replica in preference order
        // campaigns at once, the next one window later.
        q.add_quiesced(2u32, 2_600);
        q.add_quiesced(3u32, 2_600);
        // (Group 1's leader answers again, and counts as its leader.)
        let none = |g: u32| (g == 1).then_some(leader);
        let replicas = |g: u32| match g {
            2 => vec![BrokerId(1), BrokerId(2)],
            _ => vec![BrokerId(2), BrokerId(1)],
        };
        q.peer_heard(leader, 2_700);
        assert!(q.tick(2_700, me, none).is_empty());
        assert_eq!(q.campaigns(2_700, me, replicas), vec![2]);
        q.peer_heard(leader, 3_600);
        assert!(q.tick(3_600, me, none).is_empty());
        assert!(q.campaigns(3_600, me, replicas).is_empty());
        assert!(q.tick(3_700, me, none).is_empty());
        assert_eq!(q.campaigns(3_700, me, replicas), vec![3]);
    }

    #[test]
    fn groups_led_by_a_silent_peer_are_elected() {
        let mut q = Quiescer::new(CONFIG);
        let me = BrokerId(1);
        q.add(1u32, 0);
        q.add(2u32, 0);
        let leader = |g: u32| Some(if g == 1 { BrokerId(2) } else { BrokerId(3) });
        q.peer_heard(BrokerId(2), 0);
        q.peer_heard(BrokerId(3), 0);
        assert_eq!(q.tick(600, me, leader).len(), 2, "both quiesce");
        q.peer_heard(BrokerId(3), 1_200);
        // Node 2 has been silent for 1,100 ms: the group it leads is campaigned for; node 3's
        // is not.
        assert!(q.tick(1_100, me, leader).is_empty());
        assert_eq!(q.campaigns(1_100, me, two_one_three), vec![1]);
        assert!(q.is_quiesced(1) && q.is_quiesced(2));
        // An awake group with no known leader keeps its election timer for the idle time, then
        // quiesces and is the host's to elect.
        q.add(3u32, 1_100);
        let with_3 = |g: u32| if g == 3 { None } else { leader(g) };
        assert!(q.tick(1_200, me, with_3).is_empty());
        assert!(q.tick(1_600, me, with_3).is_empty());
        assert_eq!(q.tick(1_700, me, with_3), vec![(3, Action::Quiesce)]);
        let one_first = |_: u32| vec![BrokerId(1), BrokerId(2), BrokerId(3)];
        assert_eq!(q.campaigns(1_700, me, one_first), vec![3]);
    }

    /// A restarted node that led a group campaigns for it last: the others, which have most
    /// likely elected a leader it has not heard from yet, have their turns first.
    #[test]
    fn a_restarted_former_leader_campaigns_last() {
        let mut q = Quiescer::new(CONFIG);
        let me = BrokerId(1);
        q.add_former_leader(1u32, 0, me);
        q.add_quiesced(2u32, 0);
        let one_first = |_: u32| vec![BrokerId(1), BrokerId(2), BrokerId(3)];
        for now in [0, 100, 1_900] {
            q.peer_heard(BrokerId(2), now);
            q.peer_heard(BrokerId(3), now);
            assert!(q.tick(now, me, |_| None).is_empty());
            let expected = if now == 0 { vec![2] } else { vec![] };
            assert_eq!(q.campaigns(now, me, one_first), expected, "at {now}");
        }
        q.peer_heard(BrokerId(2), 2_000);
        q.peer_heard(BrokerId(3), 2_000);
        assert!(q.tick(2_000, me, |_| None).is_empty());
        assert_eq!(q.campaigns(2_000, me, one_first), vec![1], "third of three");
    }

    /// A replica that heard its leader within the lease does not campaign (its Raft would skip
    /// the pre-vote, and the campaign would take its turn for nothing); it campaigns at the
    /// first tick after the lease has run out. (Seen under `strand-chaos`: the leader killed and
    /// restarted within 400 ms, the first replica in line asked 574 ms after its last append,
    /// openraft skipped it, and the next one campaigned a window later: 1.2 s lost.)
    #[test]
    fn a_majority_is_this_node_and_the_peers_heard_within_the_timeout() {
        let q0 = Quiescer::<u32>::new(BROKER_CONFIG);
        let me = BrokerId(1);
        let three = [BrokerId(1), BrokerId(2), BrokerId(3)];
        assert!(
            q0.hears_majority(me, [me], 0),
            "a replica of its own is a majority"
        );
        assert!(!q0.hears_majority(me, three, 0), "no peer heard");
        let mut q = Quiescer::<u32>::new(BROKER_CONFIG);
        q.peer_heard(BrokerId(2), 1_000);
        assert!(q.hears_majority(me, three, 1_000));
        let timeout = BROKER_CONFIG.peer_timeout_ms;
        assert!(q.hears_majority(me, three, 1_000 + timeout));
        assert!(
            !q.hears_majority(me, three, 1_001 + timeout),
            "the peer went silent"
        );
        // Not a voter itself (its replica removed): only the voters count.
        assert!(!q.hears_majority(BrokerId(4), three, 1_000));
        q.peer_heard(BrokerId(3), 1_000);
        assert!(q.hears_majority(BrokerId(4), three, 1_000));
    }

    #[test]
    fn no_campaign_within_the_leader_lease() {
        let mut q = Quiescer::new(BROKER_CONFIG);
        let me = BrokerId(2);
        let leader = BrokerId(1);
        q.add_quiesced(7u32, 0);
        for now in [0, 100, 200, 300] {
            q.peer_heard(leader, now);
            q.peer_heard(BrokerId(3), now);
        }
        // The leader's last append, then its node restarts: the group is suspect.
        q.leader_wrote(7, 300);
        q.peer_restarted(leader, 400);
        for now in (400..=800).step_by(100) {
            q.peer_heard(leader, now);
            q.peer_heard(BrokerId(3), now);
            let _ = q.tick(now, me, |_| Some(leader));
            // Replicas 1 (lost), 2 (this node), 3: this node is first in line, but within the
            // lease until 900.
            assert!(
                q.campaigns(now, me, |_| vec![leader, me, BrokerId(3)]).is_empty(),
                "at {now}"
            );
        }
        q.peer_heard(leader, 900);
        q.peer_heard(BrokerId(3), 900);
        let _ = q.tick(900, me, |_| Some(leader));
        assert_eq!(q.campaigns(900, me, |_| vec![leader, me, BrokerId(3)]), vec![7]);
        // Added without having heard a leader: no lease to wait for.
        let mut fresh = Quiescer::new(BROKER_CONFIG);
        fresh.add_quiesced(8u32, 0);
        fresh.peer_heard(BrokerId(3), 0);
        assert!(fresh.tick(0, me, |_| None).is_empty());
        assert_eq!(fresh.campaigns(0, me, |_| vec![me, BrokerId(3)]), vec![8]);
    }

    /// Thousands of groups without a leader are campaigned for a bounded number at a time; a
    /// decided campaign frees its place at once, an undecided one after the window.
    #[test]
    fn campaigns_in_flight_are_bounded() {
        let config = QuiesceConfig {
            max_campaigns: 3,
            ..CONFIG
        };
        let mut q = Quiescer::new(config);
        let me = BrokerId(1);
        for g in 0..10u32 {
            q.add_quiesced(g, 0);
        }
        let mut leaders: BTreeMap<u32, BrokerId> = BTreeMap::new();
        let one_first = |_: u32| vec![BrokerId(1), BrokerId(2)];
        q.peer_heard(BrokerId(2), 100);
        assert!(q.tick(100, me, |g| leaders.get(&g).copied()).is_empty());
        assert_eq!(q.campaigns(100, me, one_first), vec![0, 1, 2]);
        assert!(q.campaigns(200, me, one_first).is_empty(), "three in flight");
        // Two are won; the third times out after the window.
        leaders.insert(0, me);
        leaders.insert(1, me);
        assert!(q.tick(300, me, |g| leaders.get(&g).copied()).is_empty());
        assert_eq!(q.campaigns(300, me, one_first), vec![3, 4]);
        q.peer_heard(BrokerId(2), 1_100);
        assert!(q.tick(1_150, me, |g| leaders.get(&g).copied()).is_empty());
        assert_eq!(q.campaigns(1_150, me, one_first), vec![5]);
        assert_eq!(q.campaigns_in_flight(1_150), 3);
    }
}
