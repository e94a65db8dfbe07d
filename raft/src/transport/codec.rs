//! The binary codec of the node-to-node protocol: frames, messages, and their encoding.
//!
//! See the [module docs](super) for the wire format. Decoding works on one whole frame held in
//! a [`Bytes`]: the Kafka batches of append entries and snapshot chunks come out as slices of
//! that frame (reference-counted, not copied). Every length and count is checked against the
//! bytes left in the frame before anything is allocated for it, and no vector reserves more
//! up front than the bytes left; a decoded message holds at most a constant factor of its
//! frame's size (an entry's in-memory form is larger than its 17 bytes on the wire).

#![deny(clippy::unwrap_used, clippy::indexing_slicing)]

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use openraft::impls::leader_id_std;
use openraft::{EntryPayload, Membership, SnapshotMeta, StoredMembership};
use strand_protocol::types::{Offset, PartitionId, TopicId};

use crate::partition::{
    BrokerId, EntryData, KafkaBatch, PartitionLogId, SideRecord, StoredBatch, StoredSide,
};
use crate::Term;

/// The only protocol version this codec speaks.
pub const WIRE_VERSION: u8 = 1;

/// Bytes of the length prefix.
pub const LENGTH_PREFIX_BYTES: usize = 4;

/// Bytes of the header after the length prefix: version, kind, request id.
pub const HEADER_BYTES: usize = 1 + 1 + 8;

/// The default bound on a frame (its length field): large enough for a few Kafka batches of the
/// default `message.max.bytes` (1 MiB) and for snapshot chunks, small enough to buffer per peer.
pub const DEFAULT_MAX_FRAME_BYTES: u32 = 16 << 20;

/// Joint configurations have two sub-configs; more is a hostile frame.
const MAX_MEMBERSHIP_CONFIGS: usize = 2;

/// A Raft vote of a partition group: `(term, voted-for node)` and whether a quorum granted it.
pub type PartitionVote = openraft::impls::Vote<leader_id_std::LeaderId<u64, BrokerId>>;
/// A log entry of a partition group.
pub type PartitionEntry =
    openraft::Entry<openraft::vote::leader_id_std::CommittedLeaderId<u64>, PartitionPayload>;
/// The payload of a partition group's entry.
pub type PartitionPayload = EntryPayload<EntryData, BrokerId, ()>;
/// A partition group's membership.
pub type PartitionMembership = Membership<BrokerId, ()>;
/// A partition group's snapshot metadata.
pub type PartitionSnapshotMeta =
    SnapshotMeta<openraft::vote::leader_id_std::CommittedLeaderId<u64>, BrokerId, ()>;

/// The Raft group a message belongs to: one Kafka partition, named by its topic's stable id
/// (a re-created topic is another group) and its index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GroupId {
    pub topic: TopicId,
    pub partition: PartitionId,
}

impl fmt::Display for GroupId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.topic, self.partition)
    }
}

/// Matches a response to its request on one connection. Chosen by the requester; a response
/// carries the id of the request it answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct RequestId(pub u64);

/// A vote or pre-vote request (openraft's `VoteRequest`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VoteMsg {
    pub vote: PartitionVote,
    pub last_log_id: Option<PartitionLogId>,
    pub leadership_transfer: bool,
}

/// The answer to a vote or pre-vote request (openraft's `VoteResponse`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VoteReply {
    pub vote: PartitionVote,
    pub granted: bool,
    pub last_log_id: Option<PartitionLogId>,
}

/// An append-entries request (openraft's `AppendEntriesRequest`).
#[derive(Debug, Clone, PartialEq)]
pub struct AppendMsg {
    pub vote: PartitionVote,
    pub prev_log_id: Option<PartitionLogId>,
    pub leader_commit: Option<PartitionLogId>,
    pub entries: Vec<PartitionEntry>,
}

/// The answer to an append-entries request (openraft's `AppendEntriesResponse`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AppendReply {
    Success,
    PartialSuccess(Option<PartitionLogId>),
    Conflict,
    HigherVote(PartitionVote),
}

/// One piece of a full snapshot. A snapshot travels as chunks `0..=n`, each in its own frame
/// and each acknowledged before the next is sent; the chunk with `last` set completes it. The
/// metadata rides in every chunk (it is small) so that a receiver can check the chunks belong
/// together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotChunk {
    /// The leader's vote, checked by the receiver before installing.
    pub vote: PartitionVote,
    pub meta: PartitionSnapshotMeta,
    /// The Kafka offset after the snapshot's last entry.
    pub next_offset: Offset,
    /// The chunk's position in the snapshot, from 0.
    pub chunk_index: u32,
    pub last: bool,
    pub batches: Vec<StoredBatch>,
    /// Side records (in the last chunk only, as the broker sends them; any chunk may carry some).
    pub side: Vec<StoredSide>,
}

/// The answer to a snapshot chunk: the receiver's vote (openraft's `SnapshotResponse`). For a
/// chunk that is not the last it acknowledges the chunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotReply {
    pub vote: PartitionVote,
}

/// A transfer-leader request (openraft's `TransferLeaderRequest`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransferLeaderMsg {
    pub from_leader: PartitionVote,
    pub to_node: BrokerId,
    pub last_log_id: Option<PartitionLogId>,
}

/// Why a transfer-leader request was rejected (openraft's `TransferLeaderError`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TransferLeaderRejected {
    VoteChanged {
        expected: PartitionVote,
        actual: PartitionVote,
    },
    LogNotFlushed {
        expected: Option<PartitionLogId>,
        actual: Option<PartitionLogId>,
    },
}

/// A "lightweight" heartbeat of one group: an append-entries request without entries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Heartbeat {
    pub group: GroupId,
    pub vote: PartitionVote,
    /// The last log id the leader knows the follower to hold; openraft checks it to detect a
    /// follower whose log went backwards.
    pub prev_log_id: Option<PartitionLogId>,
    pub leader_commit: Option<PartitionLogId>,
}

/// One group's answer inside a heartbeat batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeartbeatReply {
    pub group: GroupId,
    pub reply: AppendReply,
}

/// Why a node answered a request with [`Message::Refused`] instead of a Raft answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefuseReason {
    /// This node holds no replica of the group (not created yet, or deleted).
    UnknownGroup,
    /// The group's Raft is shutting down or failed.
    Unavailable,
    /// The node does not serve this kind of request.
    Unsupported,
    /// The request breaks Raft's rules (entries out of order, log ids beyond the leader's
    /// term): only a broken or hostile peer sends it, and it is not handed to the group.
    Invalid,
}

impl RefuseReason {
    fn code(self) -> u8 {
        match self {
            RefuseReason::UnknownGroup => 1,
            RefuseReason::Unavailable => 2,
            RefuseReason::Unsupported => 3,
            RefuseReason::Invalid => 4,
        }
    }

    fn from_code(code: u8) -> Result<Self, DecodeError> {
        match code {
            1 => Ok(RefuseReason::UnknownGroup),
            2 => Ok(RefuseReason::Unavailable),
            3 => Ok(RefuseReason::Unsupported),
            4 => Ok(RefuseReason::Invalid),
            _ => Err(DecodeError::BadTag {
                what: "refuse reason",
                tag: code,
            }),
        }
    }
}

/// Every message of the protocol. Requests and their answers are separate kinds.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    Vote {
        group: GroupId,
        req: VoteMsg,
    },
    PreVote {
        group: GroupId,
        req: VoteMsg,
    },
    VoteReply {
        group: GroupId,
        reply: VoteReply,
    },
    Append {
        group: GroupId,
        req: AppendMsg,
    },
    AppendReply {
        group: GroupId,
        reply: AppendReply,
    },
    Snapshot {
        group: GroupId,
        chunk: SnapshotChunk,
    },
    SnapshotReply {
        group: GroupId,
        reply: SnapshotReply,
    },
    TransferLeader {
        group: GroupId,
        req: TransferLeaderMsg,
    },
    TransferLeaderReply {
        group: GroupId,
        reply: Result<(), TransferLeaderRejected>,
    },
    /// The coalesced heartbeats of many groups from one leader node to one follower node.
    Heartbeats(Vec<Heartbeat>),
    /// The answers to a [`Message::Heartbeats`], one per heartbeat, in any order.
    HeartbeatReplies(Vec<HeartbeatReply>),
    /// The request could not be handed to the group; answers any per-group request.
    Refused {
        group: GroupId,
        reason: RefuseReason,
    },
    /// The first request on a connection names the node that opened it and the shard of the
    /// receiving node the connection is for (the shard that holds the groups it will name); the
    /// answer names the node that accepted it and repeats the shard.
    Hello {
        node: BrokerId,
        shard: u16,
    },
    /// A request of a layer above Raft (the broker's controller RPCs), opaque here: its type
    /// and its body, which the receiver decodes (bounded by the frame).
    Control {
        kind: u16,
        body: Bytes,
    },
    /// The answer to a [`Message::Control`]: its body, or `None` when the receiving node serves
    /// no control requests.
    ControlReply(Option<Bytes>),
}

impl Message {
    fn kind(&self) -> u8 {
        match self {
            Message::Vote { .. } => 1,
            Message::PreVote { .. } => 2,
            Message::VoteReply { .. } => 3,
            Message::Append { .. } => 4,
            Message::AppendReply { .. } => 5,
            Message::Snapshot { .. } => 6,
            Message::SnapshotReply { .. } => 7,
            Message::TransferLeader { .. } => 8,
            Message::TransferLeaderReply { .. } => 9,
            Message::Heartbeats(_) => 10,
            Message::HeartbeatReplies(_) => 11,
            Message::Refused { .. } => 12,
            Message::Hello { .. } => 13,
            Message::Control { .. } => 14,
            Message::ControlReply(_) => 15,
        }
    }
}

/// One frame: a message and the request id it carries (its own for a request, the request's
/// for a response).
#[derive(Debug, Clone, PartialEq)]
pub struct Frame {
    pub request_id: RequestId,
    pub message: Message,
}

/// Why a frame could not be encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EncodeError {
    /// The frame would exceed the frame bound.
    TooLarge {
        frame_bytes: usize,
        max_frame_bytes: u32,
    },
}

impl fmt::Display for EncodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EncodeError::TooLarge {
                frame_bytes,
                max_frame_bytes,
            } => write!(
                f,
                "frame of {frame_bytes} bytes exceeds the bound of {max_frame_bytes} bytes"
            ),
        }
    }
}

impl std::error::Error for EncodeError {}

/// Why bytes could not be decoded. Every variant is an operating error (a broken or hostile
/// peer): the connection that carried it is closed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// The length prefix announces more than the frame bound.
    FrameTooLarge {
        frame_bytes: u32,
        max_frame_bytes: u32,
    },
    /// The frame is shorter than its header or than what its fields announce.
    Truncated {
        what: &'static str,
    },
    UnsupportedVersion(u8),
    UnknownKind(u8),
    BadTag {
        what: &'static str,
        tag: u8,
    },
    /// A count cannot fit in the bytes left in the frame.
    BadCount {
        what: &'static str,
        count: u32,
    },
    /// Bytes left over after the message.
    TrailingBytes(usize),
    /// Fields that decode but do not make a valid value.
    Invalid(&'static str),
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::FrameTooLarge {
                frame_bytes,
                max_frame_bytes,
            } => write!(
                f,
                "frame of {frame_bytes} bytes exceeds the bound of {max_frame_bytes} bytes"
            ),
            DecodeError::Truncated { what } => write!(f, "frame ends inside {what}"),
            DecodeError::UnsupportedVersion(v) => write!(f, "unsupported wire version {v}"),
            DecodeError::UnknownKind(k) => write!(f, "unknown message kind {k}"),
            DecodeError::BadTag { what, tag } => write!(f, "bad {what} tag {tag}"),
            DecodeError::BadCount { what, count } => write!(f, "{what} count {count} exceeds the frame"),
            DecodeError::TrailingBytes(n) => write!(f, "{n} bytes after the message"),
            DecodeError::Invalid(what) => write!(f, "invalid {what}"),
        }
    }
}

impl std::error::Error for DecodeError {}

/// Encodes and decodes frames under one frame bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Codec {
    max_frame_bytes: u32,
}

impl Default for Codec {
    fn default() -> Self {
        Codec::new(DEFAULT_MAX_FRAME_BYTES)
    }
}

impl Codec {
    pub fn new(max_frame_bytes: u32) -> Self {
        assert!(
            max_frame_bytes as usize >= HEADER_BYTES,
            "a frame bound below the header size"
        );
        Codec { max_frame_bytes }
    }

    pub fn max_frame_bytes(&self) -> u32 {
        self.max_frame_bytes
    }

    /// Appends `frame`, length prefix included, to `out`. On error `out` is left as it was.
    pub fn encode(&self, frame: &Frame, out: &mut BytesMut) -> Result<(), EncodeError> {
        let frame_bytes = HEADER_BYTES + body_len(&frame.message);
        if frame_bytes > self.max_frame_bytes as usize {
            return Err(EncodeError::TooLarge {
                frame_bytes,
                max_frame_bytes: self.max_frame_bytes,
            });
        }
        let start = out.len();
        out.reserve(LENGTH_PREFIX_BYTES + frame_bytes);
        // Checked against the bound (a u32) above.
        out.put_u32(frame_bytes as u32);
        out.put_u8(WIRE_VERSION);
        out.put_u8(frame.message.kind());
        out.put_u64(frame.request_id.0);
        put_body(&frame.message, out);
        debug_assert_eq!(
            out.len() - start,
            LENGTH_PREFIX_BYTES + frame_bytes,
            "body_len disagrees with put_body"
        );
        Ok(())
    }

    /// Encodes `frame` into a buffer of its own.
    pub fn encode_to_bytes(&self, frame: &Frame) -> Result<Bytes, EncodeError> {
        let mut out = BytesMut::new();
        self.encode(frame, &mut out)?;
        Ok(out.freeze())
    }

    /// The frame's size on the wire (length prefix included), without encoding it.
    pub fn encoded_len(&self, message: &Message) -> usize {
        LENGTH_PREFIX_BYTES + HEADER_BYTES + body_len(message)
    }

    /// Takes one whole frame off the front of a stream buffer: `Ok(None)` while the frame is
    /// not complete. A length above the bound is an error as soon as the prefix is read, before
    /// any of the frame is buffered.
    pub fn decode_from(&self, buf: &mut BytesMut) -> Result<Option<Frame>, DecodeError> {
        let Some(prefix) = buf.get(..LENGTH_PREFIX_BYTES) else {
            return Ok(None);
        };
        let mut prefix = prefix;
        let frame_bytes = prefix.get_u32();
        self.check_len(frame_bytes)?;
        if buf.len() < LENGTH_PREFIX_BYTES + frame_bytes as usize {
            buf.reserve(LENGTH_PREFIX_BYTES + frame_bytes as usize - buf.len());
            return Ok(None);
        }
        buf.advance(LENGTH_PREFIX_BYTES);
        let frame = buf.split_to(frame_bytes as usize).freeze();
        self.decode_frame(frame).map(Some)
    }

    /// Decodes one frame given with its length prefix (a whole datagram or test vector).
    pub fn decode_prefixed(&self, mut bytes: Bytes) -> Result<Frame, DecodeError> {
        if bytes.len() < LENGTH_PREFIX_BYTES {
            return Err(DecodeError::Truncated {
                what: "length prefix",
            });
        }
        let frame_bytes = bytes.get_u32();
        self.check_len(frame_bytes)?;
        if bytes.len() < frame_bytes as usize {
            return Err(DecodeError::Truncated { what: "frame" });
        }
        if bytes.len() > frame_bytes as usize {
            return Err(DecodeError::TrailingBytes(bytes.len() - frame_bytes as usize));
        }
        self.decode_frame(bytes)
    }

    /// Decodes one frame given without its length prefix (what the length announced).
    pub fn decode_frame(&self, frame: Bytes) -> Result<Frame, DecodeError> {
        let len = u32::try_from(frame.len()).unwrap_or(u32::MAX);
        self.check_len(len)?;
        let mut r = Reader { buf: frame };
        let version = r.u8("version")?;
        if version != WIRE_VERSION {
            return Err(DecodeError::UnsupportedVersion(version));
        }
        let kind = r.u8("kind")?;
        let request_id = RequestId(r.u64("request id")?);
        let message = get_body(kind, &mut r)?;
        if r.buf.has_remaining() {
            return Err(DecodeError::TrailingBytes(r.buf.remaining()));
        }
        Ok(Frame { request_id, message })
    }

    fn check_len(&self, frame_bytes: u32) -> Result<(), DecodeError> {
        if frame_bytes > self.max_frame_bytes {
            return Err(DecodeError::FrameTooLarge {
                frame_bytes,
                max_frame_bytes: self.max_frame_bytes,
            });
        }
        Ok(())
    }
}

// ---- sizes --------------------------------------------------------------------------------

const GROUP_BYTES: usize = 16 + 4;
const VOTE_BYTES: usize = 8 + 8 + 1;
const LOG_ID_BYTES: usize = 8 + 8;
const OPT_LOG_ID_MIN_BYTES: usize = 1;
const ENTRY_MIN_BYTES: usize = LOG_ID_BYTES + 1;
const BATCH_MIN_BYTES: usize = 8 + 8 + 4;
/// A snapshot's side record: index, term, keep-from index, data length.
const SIDE_MIN_BYTES: usize = 8 + 8 + 8 + 4;
const HEARTBEAT_MIN_BYTES: usize = GROUP_BYTES + VOTE_BYTES + 2 * OPT_LOG_ID_MIN_BYTES;
const HEARTBEAT_REPLY_MIN_BYTES: usize = GROUP_BYTES + 1;

fn opt_log_id_len(id: &Option<PartitionLogId>) -> usize {
    1 + if id.is_some() { LOG_ID_BYTES } else { 0 }
}

fn membership_len(m: &PartitionMembership) -> usize {
    let configs: usize = m.get_joint_config().iter().map(|c| 4 + 8 * c.len()).sum();
    4 + configs + 4 + 8 * m.nodes().count()
}

pub(super) fn entry_len(e: &PartitionEntry) -> usize {
    LOG_ID_BYTES
        + 1
        + match &e.payload {
            EntryPayload::Blank => 0,
            EntryPayload::Normal(EntryData::Batch(batch)) => 4 + batch.0.len(),
            EntryPayload::Normal(EntryData::Side(r)) => 8 + 4 + r.data.len(),
            EntryPayload::Membership(m) => membership_len(m),
        }
}

fn meta_len(m: &PartitionSnapshotMeta) -> usize {
    opt_log_id_len(&m.last_log_id)
        + opt_log_id_len(m.last_membership.log_id())
        + membership_len(m.last_membership.membership())
}

fn vote_msg_len(m: &VoteMsg) -> usize {
    VOTE_BYTES + opt_log_id_len(&m.last_log_id) + 1
}

fn append_reply_len(r: &AppendReply) -> usize {
    1 + match r {
        AppendReply::Success | AppendReply::Conflict => 0,
        AppendReply::PartialSuccess(id) => opt_log_id_len(id),
        AppendReply::HigherVote(_) => VOTE_BYTES,
    }
}

fn heartbeat_len(h: &Heartbeat) -> usize {
    GROUP_BYTES + VOTE_BYTES + opt_log_id_len(&h.prev_log_id) + opt_log_id_len(&h.leader_commit)
}

fn body_len(message: &Message) -> usize {
    match message {
        Message::Vote { req, .. } | Message::PreVote { req, .. } => GROUP_BYTES + vote_msg_len(req),
        Message::VoteReply { reply, .. } => GROUP_BYTES + VOTE_BYTES + 1 + opt_log_id_len(&reply.last_log_id),
        Message::Append { req, .. } => {
            GROUP_BYTES
                + VOTE_BYTES
                + opt_log_id_len(&req.prev_log_id)
                + opt_log_id_len(&req.leader_commit)
                + 4
                + req.entries.iter().map(entry_len).sum::<usize>()
        }
        Message::AppendReply { reply, .. } => GROUP_BYTES + append_reply_len(reply),
        Message::Snapshot { chunk, .. } => {
            GROUP_BYTES
                + VOTE_BYTES
                + meta_len(&chunk.meta)
                + 8
                + 4
                + 1
                + 4
                + chunk
                    .batches
                    .iter()
                    .map(|b| BATCH_MIN_BYTES + b.bytes.len())
                    .sum::<usize>()
                + 4
                + chunk
                    .side
                    .iter()
                    .map(|s| SIDE_MIN_BYTES + s.record.data.len())
                    .sum::<usize>()
        }
        Message::SnapshotReply { .. } => GROUP_BYTES + VOTE_BYTES,
        Message::TransferLeader { req, .. } => {
            GROUP_BYTES + VOTE_BYTES + 8 + opt_log_id_len(&req.last_log_id)
        }
        Message::TransferLeaderReply { reply, .. } => {
            GROUP_BYTES
                + 1
                + match reply {
                    Ok(()) => 0,
                    Err(TransferLeaderRejected::VoteChanged { .. }) => 2 * VOTE_BYTES,
                    Err(TransferLeaderRejected::LogNotFlushed { expected, actual }) => {
                        opt_log_id_len(expected) + opt_log_id_len(actual)
                    }
                }
        }
        Message::Heartbeats(hs) => 4 + hs.iter().map(heartbeat_len).sum::<usize>(),
        Message::HeartbeatReplies(rs) => {
            4 + rs
                .iter()
                .map(|r| GROUP_BYTES + append_reply_len(&r.reply))
                .sum::<usize>()
        }
        Message::Refused { .. } => GROUP_BYTES + 1,
        Message::Hello { .. } => 10,
        Message::Control { body, .. } => 2 + 4 + body.len(),
        Message::ControlReply(body) => 1 + body.as_ref().map_or(0, |b| 4 + b.len()),
    }
}

// ---- encoding -----------------------------------------------------------------------------

fn put_group(g: &GroupId, out: &mut BytesMut) {
    out.put_slice(g.topic.0.as_bytes());
    out.put_i32(g.partition.0);
}

fn put_vote(v: &PartitionVote, out: &mut BytesMut) {
    out.put_u64(v.leader_id.term);
    out.put_u64(v.leader_id.voted_for.0);
    out.put_u8(u8::from(v.committed));
}

fn put_log_id(id: &PartitionLogId, out: &mut BytesMut) {
    out.put_u64(id.leader_id.term);
    out.put_u64(id.index);
}

fn put_opt_log_id(id: &Option<PartitionLogId>, out: &mut BytesMut) {
    match id {
        None => out.put_u8(0),
        Some(id) => {
            out.put_u8(1);
            put_log_id(id, out);
        }
    }
}

/// A count of items, each at least one byte, in a frame under the `u32` bound.
fn put_count(n: usize, out: &mut BytesMut) {
    out.put_u32(u32::try_from(n).expect("a count within a bounded frame fits a u32"));
}

fn put_bytes(b: &[u8], out: &mut BytesMut) {
    put_count(b.len(), out);
    out.put_slice(b);
}

fn put_membership(m: &PartitionMembership, out: &mut BytesMut) {
    let configs = m.get_joint_config();
    put_count(configs.len(), out);
    for c in configs {
        put_count(c.len(), out);
        for id in c {
            out.put_u64(id.0);
        }
    }
    put_count(m.nodes().count(), out);
    for (id, ()) in m.nodes() {
        out.put_u64(id.0);
    }
}

fn put_entry(e: &PartitionEntry, out: &mut BytesMut) {
    put_log_id(&e.log_id, out);
    match &e.payload {
        EntryPayload::Blank => out.put_u8(0),
        EntryPayload::Normal(EntryData::Batch(batch)) => {
            out.put_u8(1);
            put_bytes(&batch.0, out);
        }
        EntryPayload::Normal(EntryData::Side(r)) => {
            out.put_u8(3);
            out.put_u64(r.keep_from);
            put_bytes(&r.data, out);
        }
        EntryPayload::Membership(m) => {
            out.put_u8(2);
            put_membership(m, out);
        }
    }
}

fn put_meta(m: &PartitionSnapshotMeta, out: &mut BytesMut) {
    put_opt_log_id(&m.last_log_id, out);
    put_opt_log_id(m.last_membership.log_id(), out);
    put_membership(m.last_membership.membership(), out);
}

fn put_vote_msg(m: &VoteMsg, out: &mut BytesMut) {
    put_vote(&m.vote, out);
    put_opt_log_id(&m.last_log_id, out);
    out.put_u8(u8::from(m.leadership_transfer));
}

fn put_append_reply(r: &AppendReply, out: &mut BytesMut) {
    match r {
        AppendReply::Success => out.put_u8(0),
        AppendReply::PartialSuccess(id) => {
            out.put_u8(1);
            put_opt_log_id(id, out);
        }
        AppendReply::Conflict => out.put_u8(2),
        AppendReply::HigherVote(v) => {
            out.put_u8(3);
            put_vote(v, out);
        }
    }
}

fn put_body(message: &Message, out: &mut BytesMut) {
    match message {
        Message::Vote { group, req } | Message::PreVote { group, req } => {
            put_group(group, out);
            put_vote_msg(req, out);
        }
        Message::VoteReply { group, reply } => {
            put_group(group, out);
            put_vote(&reply.vote, out);
            out.put_u8(u8::from(reply.granted));
            put_opt_log_id(&reply.last_log_id, out);
        }
        Message::Append { group, req } => {
            put_group(group, out);
            put_vote(&req.vote, out);
            put_opt_log_id(&req.prev_log_id, out);
            put_opt_log_id(&req.leader_commit, out);
            put_count(req.entries.len(), out);
            for e in &req.entries {
                put_entry(e, out);
            }
        }
        Message::AppendReply { group, reply } => {
            put_group(group, out);
            put_append_reply(reply, out);
        }
        Message::Snapshot { group, chunk } => {
            put_group(group, out);
            put_vote(&chunk.vote, out);
            put_meta(&chunk.meta, out);
            out.put_i64(chunk.next_offset.0);
            out.put_u32(chunk.chunk_index);
            out.put_u8(u8::from(chunk.last));
            put_count(chunk.batches.len(), out);
            for b in &chunk.batches {
                out.put_i64(b.base_offset.0);
                out.put_u64(b.term.0);
                put_bytes(&b.bytes, out);
            }
            put_count(chunk.side.len(), out);
            for s in &chunk.side {
                out.put_u64(s.index);
                out.put_u64(s.term.0);
                out.put_u64(s.record.keep_from);
                put_bytes(&s.record.data, out);
            }
        }
        Message::SnapshotReply { group, reply } => {
            put_group(group, out);
            put_vote(&reply.vote, out);
        }
        Message::TransferLeader { group, req } => {
            put_group(group, out);
            put_vote(&req.from_leader, out);
            out.put_u64(req.to_node.0);
            put_opt_log_id(&req.last_log_id, out);
        }
        Message::TransferLeaderReply { group, reply } => {
            put_group(group, out);
            match reply {
                Ok(()) => out.put_u8(0),
                Err(TransferLeaderRejected::VoteChanged { expected, actual }) => {
                    out.put_u8(1);
                    put_vote(expected, out);
                    put_vote(actual, out);
                }
                Err(TransferLeaderRejected::LogNotFlushed { expected, actual }) => {
                    out.put_u8(2);
                    put_opt_log_id(expected, out);
                    put_opt_log_id(actual, out);
                }
            }
        }
        Message::Heartbeats(hs) => {
            put_count(hs.len(), out);
            for h in hs {
                put_group(&h.group, out);
                put_vote(&h.vote, out);
                put_opt_log_id(&h.prev_log_id, out);
                put_opt_log_id(&h.leader_commit, out);
            }
        }
        Message::HeartbeatReplies(rs) => {
            put_count(rs.len(), out);
            for r in rs {
                put_group(&r.group, out);
                put_append_reply(&r.reply, out);
            }
        }
        Message::Refused { group, reason } => {
            put_group(group, out);
            out.put_u8(reason.code());
        }
        Message::Hello { node, shard } => {
            out.put_u64(node.0);
            out.put_u16(*shard);
        }
        Message::Control { kind, body } => {
            out.put_u16(*kind);
            put_bytes(body, out);
        }
        Message::ControlReply(body) => match body {
            None => out.put_u8(0),
            Some(b) => {
                out.put_u8(1);
                put_bytes(b, out);
            }
        },
    }
}

// ---- decoding -----------------------------------------------------------------------------

/// Reads fields off the front of a frame. Every read checks the bytes left first.
struct Reader {
    buf: Bytes,
}

impl Reader {
    fn need(&self, n: usize, what: &'static str) -> Result<(), DecodeError> {
        if self.buf.remaining() < n {
            return Err(DecodeError::Truncated { what });
        }
        Ok(())
    }

    fn u8(&mut self, what: &'static str) -> Result<u8, DecodeError> {
        self.need(1, what)?;
        Ok(self.buf.get_u8())
    }

    fn u16(&mut self, what: &'static str) -> Result<u16, DecodeError> {
        self.need(2, what)?;
        Ok(self.buf.get_u16())
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, DecodeError> {
        self.need(4, what)?;
        Ok(self.buf.get_u32())
    }

    fn u64(&mut self, what: &'static str) -> Result<u64, DecodeError> {
        self.need(8, what)?;
        Ok(self.buf.get_u64())
    }

    fn i64(&mut self, what: &'static str) -> Result<i64, DecodeError> {
        self.need(8, what)?;
        Ok(self.buf.get_i64())
    }

    fn i32(&mut self, what: &'static str) -> Result<i32, DecodeError> {
        self.need(4, what)?;
        Ok(self.buf.get_i32())
    }

    fn bool(&mut self, what: &'static str) -> Result<bool, DecodeError> {
        match self.u8(what)? {
            0 => Ok(false),
            1 => Ok(true),
            tag => Err(DecodeError::BadTag { what, tag }),
        }
    }

    /// A count of items each at least `min_item_bytes` long: larger than the frame can hold
    /// is an error, so a `Vec` of it is bounded by the frame.
    fn count(&mut self, min_item_bytes: usize, what: &'static str) -> Result<usize, DecodeError> {
        let count = self.u32(what)?;
        let n = count as usize;
        if n.saturating_mul(min_item_bytes.max(1)) > self.buf.remaining() {
            return Err(DecodeError::BadCount { what, count });
        }
        Ok(n)
    }

    /// A vector for `n` decoded items, reserving no more memory up front than the bytes left
    /// in the frame (it grows only as items actually decode).
    fn vec<T>(&self, n: usize) -> Vec<T> {
        Vec::with_capacity(n.min(self.buf.remaining() / std::mem::size_of::<T>().max(1)))
    }

    /// A length-prefixed byte string, sliced out of the frame without copying.
    fn bytes(&mut self, what: &'static str) -> Result<Bytes, DecodeError> {
        let n = self.count(1, what)?;
        Ok(self.buf.split_to(n))
    }

    fn group(&mut self) -> Result<GroupId, DecodeError> {
        self.need(GROUP_BYTES, "group id")?;
        let mut uuid = [0u8; 16];
        self.buf.copy_to_slice(&mut uuid);
        let partition = self.i32("group id")?;
        Ok(GroupId {
            topic: TopicId(uuid::Uuid::from_bytes(uuid)),
            partition: PartitionId(partition),
        })
    }

    fn vote(&mut self) -> Result<PartitionVote, DecodeError> {
        let term = self.u64("vote")?;
        let node = BrokerId(self.u64("vote")?);
        let committed = self.bool("vote committed")?;
        Ok(if committed {
            PartitionVote::new_committed(term, node)
        } else {
            PartitionVote::new(term, node)
        })
    }

    fn log_id(&mut self) -> Result<PartitionLogId, DecodeError> {
        let term = self.u64("log id")?;
        let index = self.u64("log id")?;
        Ok(PartitionLogId::new_term_index(term, index))
    }

    fn opt_log_id(&mut self) -> Result<Option<PartitionLogId>, DecodeError> {
        if self.bool("log id presence")? {
            Ok(Some(self.log_id()?))
        } else {
            Ok(None)
        }
    }

    fn node_ids(&mut self, what: &'static str) -> Result<Vec<BrokerId>, DecodeError> {
        let n = self.count(8, what)?;
        let mut ids = self.vec(n);
        for _ in 0..n {
            ids.push(BrokerId(self.u64(what)?));
        }
        Ok(ids)
    }

    fn membership(&mut self) -> Result<PartitionMembership, DecodeError> {
        let n = self.count(4, "membership configs")?;
        if n > MAX_MEMBERSHIP_CONFIGS {
            return Err(DecodeError::Invalid("membership with more than two configs"));
        }
        let mut configs = self.vec(n);
        for _ in 0..n {
            let ids = self.node_ids("membership config")?;
            let set: BTreeSet<BrokerId> = ids.iter().copied().collect();
            if set.len() != ids.len() {
                return Err(DecodeError::Invalid("membership config with a repeated node"));
            }
            configs.push(set);
        }
        let ids = self.node_ids("membership nodes")?;
        let nodes: BTreeMap<BrokerId, ()> = ids.iter().map(|id| (*id, ())).collect();
        if nodes.len() != ids.len() {
            return Err(DecodeError::Invalid("membership nodes with a repeated node"));
        }
        Membership::new(configs, nodes).map_err(|_| DecodeError::Invalid("membership"))
    }

    fn entry(&mut self) -> Result<PartitionEntry, DecodeError> {
        let log_id = self.log_id()?;
        let payload = match self.u8("entry payload")? {
            0 => EntryPayload::Blank,
            1 => EntryPayload::Normal(EntryData::Batch(KafkaBatch(self.bytes("entry batch")?))),
            3 => {
                let keep_from = self.u64("side record")?;
                let data = self.bytes("side record")?;
                EntryPayload::Normal(EntryData::Side(SideRecord { keep_from, data }))
            }
            2 => EntryPayload::Membership(self.membership()?),
            tag => {
                return Err(DecodeError::BadTag {
                    what: "entry payload",
                    tag,
                });
            }
        };
        Ok(PartitionEntry { log_id, payload })
    }

    fn meta(&mut self) -> Result<PartitionSnapshotMeta, DecodeError> {
        let last_log_id = self.opt_log_id()?;
        let membership_log_id = self.opt_log_id()?;
        let membership = self.membership()?;
        Ok(PartitionSnapshotMeta {
            last_log_id,
            last_membership: StoredMembership::new(membership_log_id, membership),
        })
    }

    fn vote_msg(&mut self) -> Result<VoteMsg, DecodeError> {
        Ok(VoteMsg {
            vote: self.vote()?,
            last_log_id: self.opt_log_id()?,
            leadership_transfer: self.bool("leadership transfer")?,
        })
    }

    fn append_reply(&mut self) -> Result<AppendReply, DecodeError> {
        match self.u8("append reply")? {
            0 => Ok(AppendReply::Success),
            1 => Ok(AppendReply::PartialSuccess(self.opt_log_id()?)),
            2 => Ok(AppendReply::Conflict),
            3 => Ok(AppendReply::HigherVote(self.vote()?)),
            tag => Err(DecodeError::BadTag {
                what: "append reply",
                tag,
            }),
        }
    }
}

fn get_body(kind: u8, r: &mut Reader) -> Result<Message, DecodeError> {
    Ok(match kind {
        1 => Message::Vote {
            group: r.group()?,
            req: r.vote_msg()?,
        },
        2 => Message::PreVote {
            group: r.group()?,
            req: r.vote_msg()?,
        },
        3 => Message::VoteReply {
            group: r.group()?,
            reply: VoteReply {
                vote: r.vote()?,
                granted: r.bool("vote granted")?,
                last_log_id: r.opt_log_id()?,
            },
        },
        4 => {
            let group = r.group()?;
            let vote = r.vote()?;
            let prev_log_id = r.opt_log_id()?;
            let leader_commit = r.opt_log_id()?;
            let n = r.count(ENTRY_MIN_BYTES, "entries")?;
            let mut entries = r.vec(n);
            for _ in 0..n {
                entries.push(r.entry()?);
            }
            Message::Append {
                group,
                req: AppendMsg {
                    vote,
                    prev_log_id,
                    leader_commit,
                    entries,
                },
            }
        }
        5 => Message::AppendReply {
            group: r.group()?,
            reply: r.append_reply()?,
        },
        6 => {
            let group = r.group()?;
            let vote = r.vote()?;
            let meta = r.meta()?;
            let next_offset = Offset(r.i64("snapshot next offset")?);
            let chunk_index = r.u32("snapshot chunk index")?;
            let last = r.bool("snapshot last chunk")?;
            let n = r.count(BATCH_MIN_BYTES, "snapshot batches")?;
            let mut batches = r.vec(n);
            for _ in 0..n {
                let base_offset = Offset(r.i64("snapshot batch")?);
                let term = Term(r.u64("snapshot batch")?);
                let bytes = r.bytes("snapshot batch")?;
                batches.push(StoredBatch {
                    base_offset,
                    term,
                    bytes,
                });
            }
            let n = r.count(SIDE_MIN_BYTES, "snapshot side records")?;
            let mut side = r.vec(n);
            for _ in 0..n {
                let index = r.u64("snapshot side record")?;
                let term = Term(r.u64("snapshot side record")?);
                let keep_from = r.u64("snapshot side record")?;
                let data = r.bytes("snapshot side record")?;
                side.push(StoredSide {
                    index,
                    term,
                    record: SideRecord { keep_from, data },
                });
            }
            Message::Snapshot {
                group,
                chunk: SnapshotChunk {
                    vote,
                    meta,
                    next_offset,
                    chunk_index,
                    last,
                    batches,
                    side,
                },
            }
        }
        7 => Message::SnapshotReply {
            group: r.group()?,
            reply: SnapshotReply { vote: r.vote()? },
        },
        8 => Message::TransferLeader {
            group: r.group()?,
            req: TransferLeaderMsg {
                from_leader: r.vote()?,
                to_node: BrokerId(r.u64("transfer target")?),
                last_log_id: r.opt_log_id()?,
            },
        },
        9 => {
            let group = r.group()?;
            let reply = match r.u8("transfer-leader reply")? {
                0 => Ok(()),
                1 => Err(TransferLeaderRejected::VoteChanged {
                    expected: r.vote()?,
                    actual: r.vote()?,
                }),
                2 => Err(TransferLeaderRejected::LogNotFlushed {
                    expected: r.opt_log_id()?,
                    actual: r.opt_log_id()?,
                }),
                tag => {
                    return Err(DecodeError::BadTag {
                        what: "transfer-leader reply",
                        tag,
                    });
                }
            };
            Message::TransferLeaderReply { group, reply }
        }
        10 => {
            let n = r.count(HEARTBEAT_MIN_BYTES, "heartbeats")?;
            let mut hs = r.vec(n);
            for _ in 0..n {
                hs.push(Heartbeat {
                    group: r.group()?,
                    vote: r.vote()?,
                    prev_log_id: r.opt_log_id()?,
                    leader_commit: r.opt_log_id()?,
                });
            }
            Message::Heartbeats(hs)
        }
        11 => {
            let n = r.count(HEARTBEAT_REPLY_MIN_BYTES, "heartbeat replies")?;
            let mut rs = r.vec(n);
            for _ in 0..n {
                rs.push(HeartbeatReply {
                    group: r.group()?,
                    reply: r.append_reply()?,
                });
            }
            Message::HeartbeatReplies(rs)
        }
        12 => Message::Refused {
            group: r.group()?,
            reason: RefuseReason::from_code(r.u8("refuse reason")?)?,
        },
        13 => Message::Hello {
            node: BrokerId(r.u64("hello node")?),
            shard: r.u16("hello shard")?,
        },
        14 => Message::Control {
            kind: r.u16("control kind")?,
            body: r.bytes("control body")?,
        },
        15 => Message::ControlReply(match r.u8("control reply")? {
            0 => None,
            1 => Some(r.bytes("control reply body")?),
            tag => {
                return Err(DecodeError::BadTag {
                    what: "control reply",
                    tag,
                })
            }
        }),
        kind => return Err(DecodeError::UnknownKind(kind)),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
pub(crate) mod tests;
