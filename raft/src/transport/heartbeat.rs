//! Heartbeat coalescing per node pair, sans I/O.
//!
//! A node leads many groups and most of them follow the same few peers. openraft sends each
//! group's heartbeat (an append-entries without entries) from a heartbeat worker per follower;
//! sent as they come, 1,000 groups cost 1,000 frames per heartbeat interval to each peer.
//! Instead each heartbeat is pushed into a [`HeartbeatOutbox`], and once per tick
//! [`HeartbeatOutbox::drain_for_tick`] turns everything queued for a peer into one
//! [`Message::Heartbeats`](super::Message::Heartbeats) frame of "lightweight" entries (group id,
//! leader vote, the follower's matching log id, commit log id: at most 71 bytes each; Redpanda's
//! heartbeat manager batches the same way). The receiver hands each entry to its group and merges the
//! answers into one [`Message::HeartbeatReplies`](super::Message::HeartbeatReplies)
//! ([`ReplyMerger`]); [`HeartbeatOutbox::on_response`] splits them back to the waiting workers.
//!
//! Bounds: a peer's queue holds at most one heartbeat per group (a newer one for the same group
//! replaces the queued one, whose waiter is handed back as superseded) and at most
//! `max_queued_per_peer` groups; a frame carries at most `max_per_frame` entries (more make more
//! frames); at most `max_in_flight_per_peer` frames await an answer per peer, and a peer at that
//! bound gets nothing new until an answer or a failure frees a slot (its heartbeats stay queued
//! and keep being replaced by newer ones).
//!
//! The waiter type `W` is whatever the caller uses to wake a worker (a oneshot sender in the
//! network adapter, a plain id in tests). Everything here is ordered (no hash-map iteration),
//! so a seeded simulation replays the same frames and answers in the same order.

use std::collections::{BTreeMap, VecDeque};

use super::codec::{AppendReply, GroupId, Heartbeat, HeartbeatReply};
use crate::partition::BrokerId;

/// Identifies one coalesced frame of the outbox until its answer or failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BatchId(pub u64);

/// Limits of a [`HeartbeatOutbox`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutboxLimits {
    pub max_queued_per_peer: usize,
    pub max_per_frame: usize,
    pub max_in_flight_per_peer: usize,
}

impl Default for OutboxLimits {
    fn default() -> Self {
        // 4,096 entries of at most 71 bytes: about 290 KiB, far below the frame bound.
        OutboxLimits {
            max_queued_per_peer: 16_384,
            max_per_frame: 4_096,
            max_in_flight_per_peer: 8,
        }
    }
}

/// One frame to send: the heartbeats of many groups to one peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutgoingBatch {
    pub batch: BatchId,
    pub peer: BrokerId,
    pub heartbeats: Vec<Heartbeat>,
}

/// What a heartbeat's worker learns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeartbeatOutcome {
    /// The follower's group answered.
    Reply(AppendReply),
    /// The frame was answered but not for this group (the follower has no such group).
    NoReply,
    /// The frame was lost: the connection failed or timed out.
    Failed,
}

/// Why a heartbeat was not queued.
#[derive(Debug, PartialEq, Eq)]
pub enum PushError<W> {
    /// The peer's queue is at its bound; the waiter is handed back.
    Full(W),
}

struct Queued<W> {
    heartbeat: Heartbeat,
    waiter: W,
}

struct PeerQueue<W> {
    /// Groups in arrival order, each once; `queued` holds their heartbeats.
    order: VecDeque<GroupId>,
    queued: BTreeMap<GroupId, Queued<W>>,
    in_flight: usize,
}

struct InFlight<W> {
    peer: BrokerId,
    waiters: BTreeMap<GroupId, W>,
}

/// The sending side of heartbeat coalescing: queues per peer, one frame per peer per tick.
pub struct HeartbeatOutbox<W> {
    limits: OutboxLimits,
    peers: BTreeMap<BrokerId, PeerQueue<W>>,
    in_flight: BTreeMap<BatchId, InFlight<W>>,
    next_batch: u64,
}

impl<W> HeartbeatOutbox<W> {
    pub fn new(limits: OutboxLimits) -> Self {
        assert!(
            limits.max_queued_per_peer > 0 && limits.max_per_frame > 0 && limits.max_in_flight_per_peer > 0,
            "heartbeat outbox limits must be positive"
        );
        HeartbeatOutbox {
            limits,
            peers: BTreeMap::new(),
            in_flight: BTreeMap::new(),
            next_batch: 0,
        }
    }

    /// Queues `heartbeat` for `peer`. A heartbeat of the same group still queued is replaced;
    /// its waiter is returned (`Ok(Some(old))`) for the caller to answer as superseded.
    pub fn push(
        &mut self,
        peer: BrokerId,
        heartbeat: Heartbeat,
        waiter: W,
    ) -> Result<Option<W>, PushError<W>> {
        let queue = self.peers.entry(peer).or_insert_with(|| PeerQueue {
            order: VecDeque::new(),
            queued: BTreeMap::new(),
            in_flight: 0,
        });
        let group = heartbeat.group;
        if let Some(old) = queue.queued.get_mut(&group) {
            old.heartbeat = heartbeat;
            return Ok(Some(std::mem::replace(&mut old.waiter, waiter)));
        }
        if queue.queued.len() >= self.limits.max_queued_per_peer {
            return Err(PushError::Full(waiter));
        }
        queue.order.push_back(group);
        queue.queued.insert(group, Queued { heartbeat, waiter });
        Ok(None)
    }

    /// Heartbeats queued and not yet sent, over all peers.
    pub fn queued(&self) -> usize {
        self.peers.values().map(|q| q.queued.len()).sum()
    }

    /// Frames sent and not yet answered or failed, over all peers.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Everything to send this tick: per peer, its queued heartbeats in as few frames as the
    /// per-frame bound allows, within the peer's in-flight bound.
    pub fn drain_for_tick(&mut self) -> Vec<OutgoingBatch> {
        let mut out = Vec::new();
        for (peer, queue) in &mut self.peers {
            while !queue.order.is_empty() && queue.in_flight < self.limits.max_in_flight_per_peer {
                let take = queue.order.len().min(self.limits.max_per_frame);
                let mut heartbeats = Vec::with_capacity(take);
                let mut waiters = BTreeMap::new();
                for group in queue.order.drain(..take) {
                    let queued = queue.queued.remove(&group);
                    assert!(queued.is_some(), "a queued group without its heartbeat");
                    if let Some(q) = queued {
                        heartbeats.push(q.heartbeat);
                        waiters.insert(group, q.waiter);
                    }
                }
                let batch = BatchId(self.next_batch);
                self.next_batch += 1;
                queue.in_flight += 1;
                self.in_flight.insert(batch, InFlight { peer: *peer, waiters });
                out.push(OutgoingBatch {
                    batch,
                    peer: *peer,
                    heartbeats,
                });
            }
            debug_assert_eq!(queue.order.len(), queue.queued.len());
        }
        out
    }

    /// The answer to a frame: each waiter gets its group's reply, or [`HeartbeatOutcome::NoReply`]
    /// when the answer lacks its group. Replies for groups the frame did not carry are ignored.
    /// An unknown batch (already failed) gives nothing.
    pub fn on_response(
        &mut self,
        batch: BatchId,
        replies: Vec<HeartbeatReply>,
    ) -> Vec<(W, HeartbeatOutcome)> {
        let Some(mut flight) = self.finish(batch) else {
            return Vec::new();
        };
        let mut out = Vec::with_capacity(flight.waiters.len());
        for r in replies {
            if let Some(w) = flight.waiters.remove(&r.group) {
                out.push((w, HeartbeatOutcome::Reply(r.reply)));
            }
        }
        out.extend(
            flight
                .waiters
                .into_values()
                .map(|w| (w, HeartbeatOutcome::NoReply)),
        );
        out
    }

    /// The frame was lost (connection failed, timed out, or refused it): its waiters, each to
    /// be answered [`HeartbeatOutcome::Failed`].
    pub fn on_failure(&mut self, batch: BatchId) -> Vec<W> {
        match self.finish(batch) {
            Some(flight) => flight.waiters.into_values().collect(),
            None => Vec::new(),
        }
    }

    fn finish(&mut self, batch: BatchId) -> Option<InFlight<W>> {
        let flight = self.in_flight.remove(&batch)?;
        if let Some(queue) = self.peers.get_mut(&flight.peer) {
            assert!(queue.in_flight > 0, "a peer's in-flight count below its frames");
            queue.in_flight -= 1;
        }
        Some(flight)
    }
}

/// The receiving side: collects the answers of the groups of one [`Message::Heartbeats`]
/// (handled each by its own group, in any order) into one reply.
///
/// [`Message::Heartbeats`]: super::Message::Heartbeats
#[derive(Debug)]
pub struct ReplyMerger {
    expected: BTreeMap<GroupId, bool>,
    replies: Vec<HeartbeatReply>,
}

impl ReplyMerger {
    /// Splits a received frame's heartbeats: the merger, and the heartbeats to hand each to its
    /// group. A group named twice in one frame is handled once (the later entry).
    pub fn split(heartbeats: Vec<Heartbeat>) -> (ReplyMerger, Vec<Heartbeat>) {
        let mut latest: BTreeMap<GroupId, Heartbeat> = BTreeMap::new();
        for h in heartbeats {
            latest.insert(h.group, h);
        }
        let expected = latest.keys().map(|g| (*g, false)).collect();
        let replies = Vec::with_capacity(latest.len());
        (ReplyMerger { expected, replies }, latest.into_values().collect())
    }

    /// Records a group's answer. Answers for groups the frame did not carry, and second
    /// answers, are dropped (returns false).
    pub fn add(&mut self, group: GroupId, reply: AppendReply) -> bool {
        match self.expected.get_mut(&group) {
            Some(answered @ false) => {
                *answered = true;
                self.replies.push(HeartbeatReply { group, reply });
                true
            }
            _ => false,
        }
    }

    /// Whether every group of the frame has answered.
    pub fn is_complete(&self) -> bool {
        self.replies.len() == self.expected.len()
    }

    /// The merged answers (groups that did not answer are left out; the sender reads that as
    /// no reply).
    pub fn finish(self) -> Vec<HeartbeatReply> {
        self.replies
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partition::PartitionLogId;
    use crate::transport::codec::tests::group;
    use crate::transport::codec::{Codec, Frame, Message, PartitionVote, RequestId};

    fn hb(g: GroupId, commit: u64) -> Heartbeat {
        Heartbeat {
            group: g,
            vote: PartitionVote::new_committed(3, BrokerId(1)),
            prev_log_id: Some(PartitionLogId::new_term_index(3, commit)),
            leader_commit: Some(PartitionLogId::new_term_index(3, commit)),
        }
    }

    fn groups(n: u32) -> Vec<GroupId> {
        (0..n).map(|i| group((i % 251) as u8, i as i32)).collect()
    }

    #[test]
    fn a_thousand_groups_to_two_peers_make_two_frames() {
        let mut outbox = HeartbeatOutbox::new(OutboxLimits::default());
        for (i, g) in groups(1000).into_iter().enumerate() {
            for peer in [BrokerId(2), BrokerId(3)] {
                assert_eq!(outbox.push(peer, hb(g, 10), (peer, i)), Ok(None));
            }
        }
        let frames = outbox.drain_for_tick();
        assert_eq!(frames.len(), 2);
        assert_eq!(
            frames.iter().map(|f| f.peer).collect::<Vec<_>>(),
            vec![BrokerId(2), BrokerId(3)]
        );
        assert!(frames.iter().all(|f| f.heartbeats.len() == 1000));
        assert_eq!(outbox.queued(), 0);
        // Each frame fits the codec's frame bound.
        let codec = Codec::default();
        for f in &frames {
            let msg = Message::Heartbeats(f.heartbeats.clone());
            assert!(codec.encoded_len(&msg) <= codec.max_frame_bytes() as usize);
        }
        // Nothing left for the next tick.
        assert!(outbox.drain_for_tick().is_empty());
    }

    #[test]
    fn answers_are_split_back_to_their_waiters() {
        let mut outbox = HeartbeatOutbox::new(OutboxLimits::default());
        let gs = groups(3);
        for (i, g) in gs.iter().enumerate() {
            outbox.push(BrokerId(2), hb(*g, i as u64), i).unwrap();
        }
        let frame = outbox.drain_for_tick().pop().unwrap();

        // The receiver: split, each group answers (out of order), merge.
        let (mut merger, to_groups) = ReplyMerger::split(frame.heartbeats);
        assert_eq!(to_groups.len(), 3);
        assert!(merger.add(gs[2], AppendReply::Conflict));
        assert!(merger.add(gs[0], AppendReply::Success));
        assert!(
            !merger.add(gs[0], AppendReply::Conflict),
            "a second answer is dropped"
        );
        assert!(
            !merger.add(group(200, 0), AppendReply::Success),
            "a group not asked is dropped"
        );
        assert!(!merger.is_complete());
        let replies = merger.finish(); // gs[1] never answered

        let mut got = outbox.on_response(frame.batch, replies);
        got.sort_by_key(|(w, _)| *w);
        assert_eq!(
            got,
            vec![
                (0, HeartbeatOutcome::Reply(AppendReply::Success)),
                (1, HeartbeatOutcome::NoReply),
                (2, HeartbeatOutcome::Reply(AppendReply::Conflict)),
            ]
        );
        assert_eq!(outbox.in_flight(), 0);
        assert!(
            outbox.on_response(frame.batch, vec![]).is_empty(),
            "a late duplicate answer"
        );
    }

    #[test]
    fn a_newer_heartbeat_replaces_the_queued_one() {
        let mut outbox = HeartbeatOutbox::new(OutboxLimits::default());
        let g = group(1, 0);
        assert_eq!(outbox.push(BrokerId(2), hb(g, 1), "old"), Ok(None));
        assert_eq!(outbox.push(BrokerId(2), hb(g, 2), "new"), Ok(Some("old")));
        let frames = outbox.drain_for_tick();
        assert_eq!(frames.len(), 1);
        assert_eq!(frames[0].heartbeats, vec![hb(g, 2)]);
        let got = outbox.on_failure(frames[0].batch);
        assert_eq!(got, vec!["new"]);
    }

    #[test]
    fn queues_frames_and_in_flight_are_bounded() {
        let limits = OutboxLimits {
            max_queued_per_peer: 5,
            max_per_frame: 2,
            max_in_flight_per_peer: 2,
        };
        let mut outbox = HeartbeatOutbox::new(limits);
        let gs = groups(6);
        for (i, g) in gs.iter().take(5).enumerate() {
            assert_eq!(outbox.push(BrokerId(2), hb(*g, 1), i), Ok(None));
        }
        assert_eq!(outbox.push(BrokerId(2), hb(gs[5], 1), 5), Err(PushError::Full(5)));

        // Two frames of two; the fifth heartbeat waits for an in-flight slot.
        let first = outbox.drain_for_tick();
        assert_eq!(
            first.iter().map(|f| f.heartbeats.len()).collect::<Vec<_>>(),
            vec![2, 2]
        );
        assert_eq!(outbox.queued(), 1);
        assert!(outbox.drain_for_tick().is_empty());

        // A failure frees a slot.
        let mut failed = outbox.on_failure(first[0].batch);
        failed.sort();
        assert_eq!(failed, vec![0, 1]);
        let second = outbox.drain_for_tick();
        assert_eq!(second.len(), 1);
        assert_eq!(second[0].heartbeats, vec![hb(gs[4], 1)]);
    }

    #[test]
    fn splitting_and_answering_follow_group_order() {
        // Given in reverse group order, with one group twice.
        let mut gs = groups(100);
        gs.sort();
        let mut frame: Vec<Heartbeat> = gs.iter().rev().map(|g| hb(*g, 1)).collect();
        frame.push(hb(gs[7], 2));
        let (_, to_groups) = ReplyMerger::split(frame);
        assert_eq!(to_groups.iter().map(|h| h.group).collect::<Vec<_>>(), gs);
        assert_eq!(
            to_groups[7],
            hb(gs[7], 2),
            "the later entry of a repeated group wins"
        );

        let mut outbox = HeartbeatOutbox::new(OutboxLimits::default());
        for (i, g) in gs.iter().enumerate().rev() {
            outbox.push(BrokerId(2), hb(*g, 1), i).unwrap();
        }
        let frame = outbox.drain_for_tick().pop().unwrap();
        let waiters: Vec<usize> = outbox
            .on_response(frame.batch, vec![])
            .into_iter()
            .map(|(w, _)| w)
            .collect();
        assert_eq!(waiters, (0..100).collect::<Vec<_>>());
    }

    #[test]
    fn merged_replies_travel_in_one_frame() {
        let gs = groups(1000);
        let (mut merger, to_groups) = ReplyMerger::split(gs.iter().map(|g| hb(*g, 5)).collect());
        for h in &to_groups {
            merger.add(h.group, AppendReply::Success);
        }
        assert!(merger.is_complete());
        let frame = Frame {
            request_id: RequestId(4),
            message: Message::HeartbeatReplies(merger.finish()),
        };
        let codec = Codec::default();
        let decoded = codec
            .decode_prefixed(codec.encode_to_bytes(&frame).unwrap())
            .unwrap();
        let Message::HeartbeatReplies(replies) = decoded.message else {
            panic!("not heartbeat replies");
        };
        assert_eq!(replies.len(), 1000);
    }
}
