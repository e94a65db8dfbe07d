//! The node-to-node layer of partition replication: how the Raft groups of many partitions
//! talk between brokers.
//!
//! - [`codec`]: the binary frames every Raft message of a partition group travels in, each
//!   tagged with its group and a request id.
//! - [`heartbeat`]: heartbeat coalescing per node pair: the heartbeats of all groups a node
//!   leads, bound for one peer, leave in one frame per tick, and the peer answers them in one
//!   frame (sans I/O).
//! - [`network`]: openraft's `RaftNetworkFactory`/`RaftNetworkV2` for partition groups over a
//!   small [`network::Connection`] trait (send a request to a peer, await its answer), and the
//!   receiving [`network::Server`] that hands requests to the groups' Rafts.
//! - [`mem`]: an in-memory network of nodes for tests and the simulation; every request and
//!   answer goes through the codec; links can be cut and healed.
//! - [`tcp`]: a connection over glommio TCP, for the broker: one connection per peer node and
//!   target shard (named in the hello), multiplexed by request id, reconnecting with backoff;
//!   and the accepting side.
//!
//! The broker's replication subsystem creates a [`network::NodeNetwork`] per shard, calls its
//! `tick` every few milliseconds, gives each group's `Raft` the group's factory, and hands the
//! connections its Kafka listeners recognise as a node's to a [`network::Server`].
//!
//! The broker's controller quorum runs its metadata group over this layer too, and sends its
//! controller requests as control messages (kinds 14 and 15), which this layer carries without
//! decoding.
//!
//! # Wire format
//!
//! A connection carries requests from the node that opened it, and their answers back, in
//! frames. All integers are big-endian.
//!
//! | field        | bytes | meaning                                                              |
//! |--------------|-------|----------------------------------------------------------------------|
//! | length       | 4     | bytes after this field; at most the frame bound (16 MiB by default)  |
//! | version      | 1     | `1`; anything else closes the connection                             |
//! | kind         | 1     | the message kind, below                                              |
//! | request id   | 8     | chosen by the requester; a response repeats its request's            |
//! | body         | rest  | per kind, below; nothing may follow it                               |
//!
//! | kind | message               | body                                                                      |
//! |------|-----------------------|---------------------------------------------------------------------------|
//! | 1    | vote                  | group, vote, last log id?, leadership transfer (bool)                     |
//! | 2    | pre-vote              | as vote                                                                   |
//! | 3    | vote reply            | group, vote, granted (bool), last log id?                                 |
//! | 4    | append entries        | group, vote, prev log id?, leader commit?, u32 count, entries             |
//! | 5    | append reply          | group, append reply                                                       |
//! | 6    | snapshot chunk        | group, vote, snapshot meta, next offset (i64), chunk index (u32), last (bool), u32 count, batches, u32 count, side records (index u64, term u64, keep-from u64, u32 length, bytes) |
//! | 7    | snapshot reply        | group, vote                                                               |
//! | 8    | transfer leader       | group, from-leader vote, target node (u64), last log id?                  |
//! | 9    | transfer-leader reply | group, tag (0 ok; 1 vote changed: expected vote, actual vote; 2 log not flushed: expected log id?, actual log id?) |
//! | 10   | heartbeats            | u32 count, heartbeat entries (group, vote, prev log id?, leader commit?)  |
//! | 11   | heartbeat replies     | u32 count, (group, append reply) pairs                                    |
//! | 12   | refused               | group, reason (1 unknown group, 2 unavailable, 3 unsupported, 4 invalid)  |
//! | 13   | hello                 | node id (u64), shard (u16): first request on a connection, and its answer |
//! | 14   | control request       | type (u16), u32 length, bytes: a request of the layer above, opaque here  |
//! | 15   | control reply         | tag 0 (this node serves no control requests) or 1, u32 length, bytes      |
//!
//! | field          | encoding                                                                      |
//! |----------------|-------------------------------------------------------------------------------|
//! | group          | topic id (16-byte uuid), partition index (i32)                                |
//! | vote           | term (u64), voted-for node (u64), committed (bool)                            |
//! | log id         | term (u64), index (u64)                                                       |
//! | `x?`           | tag byte 0 (absent) or 1 followed by `x`                                      |
//! | bool           | one byte, 0 or 1                                                              |
//! | entry          | log id, payload tag: 0 blank; 1 Kafka batch (u32 length, bytes); 2 membership; 3 side record (keep-from u64, u32 length, bytes) |
//! | membership     | u32 config count (≤ 2), each a u32 count of node ids (u64); u32 count of all node ids (voters and learners) |
//! | snapshot meta  | last log id?, membership log id?, membership                                  |
//! | batch          | base offset (i64), term (u64), u32 length, bytes                              |
//! | append reply   | tag: 0 success; 1 partial success, log id?; 2 conflict; 3 higher vote, vote   |
//!
//! Decoding never panics and never trusts a length: a frame longer than the bound is refused
//! from its prefix alone, and every count is checked against the bytes left in the frame
//! before anything is allocated for it. Kafka batches are decoded as slices of the received
//! frame (`Bytes`), not copied.
//!
//! # Heartbeats
//!
//! openraft gives heartbeats a client of their own (`RaftNetworkFactory::new_heartbeat_client`):
//! each group's leader sends, per follower and heartbeat interval, an append-entries without
//! entries. Sent one by one, a node leading 1,000 groups sends 1,000 frames to each follower per
//! interval. Here a heartbeat is queued in a per-peer [`heartbeat::HeartbeatOutbox`] instead,
//! and each tick turns a peer's queue into one `heartbeats` frame of lightweight entries (group,
//! vote, the log id the leader believes the follower holds, commit log id); the follower hands
//! each entry to its group as an empty append-entries and merges the answers into one
//! `heartbeat replies` frame ([`heartbeat::ReplyMerger`]), which the outbox splits back to the
//! waiting heartbeat workers. A group missing from the answer (the follower does not know it)
//! is reported as no reply; a lost frame fails all its heartbeats, which openraft retries at the
//! next interval. Redpanda's heartbeat manager batches the same way, one request per target
//! node; it sends only the group id for caught-up followers, where openraft's heartbeat check
//! also needs the leader's vote and matching log id, so those travel too.

pub mod codec;
pub mod heartbeat;
pub mod mem;
pub mod network;
pub mod tcp;

pub use codec::{Codec, DecodeError, EncodeError, Frame, GroupId, Message, RequestId};
