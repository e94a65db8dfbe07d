//! The replication transport of one shard.
//!
//! **Outbound** ([`PeerShards`]): a group's peer replica lives on one shard of its node
//! (`PartitionRegistration::shard_of` in the cluster metadata), and a connection serves one
//! shard: its hello names it. So a shard keeps one `TcpConnections` per target shard (each one
//! connection per peer node, multiplexed), and sends each message to the shard that holds its
//! group; a coalesced heartbeat frame is split by target shard, the parts sent at once and the
//! answers merged (a part that fails leaves its groups unanswered, which openraft takes as no
//! reply). Peers are reached on their inter-broker listener's endpoint.
//!
//! **Inbound**: node connections arrive on the Kafka listeners (no extra port). The first
//! frame of the transport, a hello, reads as a Kafka request header with api key `0x010D`
//! (version byte 1, kind 13), which no Kafka API uses; [`is_node_hello`] tells it apart, and
//! the connection is handed to the replication subsystem of the shard its hello names.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::net::{SocketAddr, ToSocketAddrs};
use std::rc::Rc;

use futures::future::join_all;
use strand_protocol::types::NodeId;
use strand_raft::partition::BrokerId;
use strand_raft::transport::codec::{Codec, GroupId, Message};
use strand_raft::transport::network::{Connection, ConnectionError};
use strand_raft::transport::tcp::{TcpConfig, TcpConnections};

use crate::cluster::ClusterState;

/// The api key a transport hello frame reads as (version byte 1, hello kind 13).
pub(crate) const NODE_HELLO_API_KEY: i16 = 0x010D;

/// Whether a connection's first bytes (after the 4-byte size) start a transport hello rather
/// than a Kafka request.
pub(crate) fn is_node_hello(after_size: &[u8]) -> bool {
    matches!(after_size, [a, b, ..] if i16::from_be_bytes([*a, *b]) == NODE_HELLO_API_KEY)
}

/// The node and target shard a buffered hello frame names (size prefix included), without
/// consuming it: `None` if the frame is incomplete or not a hello.
pub(crate) fn peek_hello(buf: &[u8], codec: Codec) -> Option<(BrokerId, u16)> {
    let mut copy = bytes::BytesMut::from(buf);
    match codec.decode_from(&mut copy) {
        Ok(Some(frame)) => match frame.message {
            Message::Hello { node, shard } => Some((node, shard)),
            _ => None,
        },
        _ => None,
    }
}

/// A peer's endpoint as resolved (host, port), and its address.
pub(crate) type Resolved = ((String, u16), SocketAddr);

/// Where peers are, from the newest cluster metadata this shard has.
pub(crate) struct Directory {
    pub(crate) state: RefCell<Option<Rc<ClusterState>>>,
    /// The inter-broker listener's name.
    pub(crate) listener: String,
    /// Peers' endpoints resolved to addresses: (host, port) as resolved, and the address.
    /// Host names are resolved on the shard's blocking thread ([`Directory::refresh`]), never
    /// on the shard itself.
    pub(crate) resolved: RefCell<BTreeMap<NodeId, Resolved>>,
    /// A refresh is running (one at a time).
    pub(crate) refreshing: std::cell::Cell<bool>,
}

impl Directory {
    pub(crate) fn new(listener: String) -> Directory {
        Directory {
            state: RefCell::new(None),
            listener,
            resolved: RefCell::new(BTreeMap::new()),
            refreshing: std::cell::Cell::new(false),
        }
    }
}

impl Directory {
    fn shard_of(&self, peer: BrokerId, group: GroupId) -> Option<u16> {
        let state = self.state.borrow();
        let node = peer.as_node_id()?;
        state
            .as_ref()?
            .partition(group.topic, group.partition)?
            .shard_of(node)
            .map(|s| s.0)
    }

    /// A peer's address: its endpoint's, if an IP address, or as last resolved.
    fn address(&self, peer: BrokerId) -> Option<SocketAddr> {
        let node = peer.as_node_id()?;
        let state = self.state.borrow();
        let e = state.as_ref()?.broker(node)?.endpoint(&self.listener)?;
        if let Ok(ip) = e.host.parse::<std::net::IpAddr>() {
            return Some(SocketAddr::new(ip, e.port));
        }
        let resolved = self.resolved.borrow();
        let (at, addr) = resolved.get(&node)?;
        (at.0 == e.host && at.1 == e.port).then_some(*addr)
    }

    /// Resolves the host names of peers' endpoints that are not resolved (or changed), on the
    /// shard's blocking thread.
    pub(crate) async fn refresh(&self) {
        if self.refreshing.replace(true) {
            return;
        }
        self.resolve_missing().await;
        self.refreshing.set(false);
    }

    async fn resolve_missing(&self) {
        let wanted: Vec<(NodeId, String, u16)> = {
            let state = self.state.borrow();
            let Some(state) = state.as_ref() else { return };
            let resolved = self.resolved.borrow();
            state
                .brokers()
                .filter_map(|b| {
                    let e = b.endpoint(&self.listener)?;
                    let current = resolved
                        .get(&b.id)
                        .is_some_and(|(at, _)| at.0 == e.host && at.1 == e.port);
                    (e.host.parse::<std::net::IpAddr>().is_err() && !current)
                        .then(|| (b.id, e.host.clone(), e.port))
                })
                .collect()
        };
        for (node, host, port) in wanted {
            let h = host.clone();
            let addr = glommio::executor()
                .spawn_blocking(move || {
                    (h.as_str(), port)
                        .to_socket_addrs()
                        .ok()
                        .and_then(|mut a| a.next())
                })
                .await;
            match addr {
                Some(addr) => {
                    self.resolved.borrow_mut().insert(node, ((host, port), addr));
                }
                None => tracing::debug!(node = node.0, host, "cannot resolve a peer's address yet"),
            }
        }
    }
}

/// A shard's connections to the shards of its peers (see the module documentation).
pub(crate) struct PeerShards {
    local: BrokerId,
    directory: Rc<Directory>,
    config: TcpConfig,
    by_shard: RefCell<BTreeMap<u16, Rc<TcpConnections>>>,
    /// The groups that sent entries to a follower since the manager last took them (a
    /// leader's replication, catch-up included, is activity for the quiescer).
    replicated: Rc<RefCell<BTreeSet<GroupId>>>,
}

impl PeerShards {
    /// `replicated` collects the groups that send entries (see the field).
    pub(crate) fn new(
        local: NodeId,
        directory: Rc<Directory>,
        config: TcpConfig,
        replicated: Rc<RefCell<BTreeSet<GroupId>>>,
    ) -> Self {
        PeerShards {
            local: BrokerId::from_node_id(local).unwrap_or_default(),
            directory,
            config,
            by_shard: RefCell::new(BTreeMap::new()),
            replicated,
        }
    }

    /// Sends `request` to shard `shard` of `peer` (pings).
    pub(crate) async fn call_shard(
        &self,
        peer: BrokerId,
        shard: u16,
        request: Message,
    ) -> Result<Message, ConnectionError> {
        self.to_shard(shard).call(peer, request).await
    }

    fn to_shard(&self, shard: u16) -> Rc<TcpConnections> {
        let mut map = self.by_shard.borrow_mut();
        Rc::clone(map.entry(shard).or_insert_with(|| {
            let dir = Rc::clone(&self.directory);
            Rc::new(
                TcpConnections::new(
                    self.local,
                    Box::new(move |peer| dir.address(peer)),
                    Rc::new(std::time::Instant::now),
                    self.config,
                )
                .with_target_shard(shard),
            )
        }))
    }
}

fn group_of(m: &Message) -> Option<GroupId> {
    match m {
        Message::Vote { group, .. }
        | Message::PreVote { group, .. }
        | Message::Append { group, .. }
        | Message::Snapshot { group, .. }
        | Message::TransferLeader { group, .. } => Some(*group),
        _ => None,
    }
}

impl Connection for PeerShards {
    async fn call(&self, peer: BrokerId, request: Message) -> Result<Message, ConnectionError> {
        match request {
            Message::Heartbeats(hs) => {
                let mut parts: BTreeMap<u16, Vec<_>> = BTreeMap::new();
                for h in hs {
                    // A group the metadata no longer places on the peer gets no answer.
                    if let Some(shard) = self.directory.shard_of(peer, h.group) {
                        parts.entry(shard).or_default().push(h);
                    }
                }
                let calls = parts.into_iter().map(|(shard, hs)| {
                    let conns = self.to_shard(shard);
                    async move { conns.call(peer, Message::Heartbeats(hs)).await }
                });
                let mut replies = Vec::new();
                let mut failure = None;
                let mut answered = false;
                for r in join_all(calls).await {
                    match r {
                        Ok(Message::HeartbeatReplies(rs)) => {
                            answered = true;
                            replies.extend(rs);
                        }
                        Ok(other) => {
                            failure = Some(ConnectionError::Network(format!("unexpected answer {other:?}")))
                        }
                        Err(e) => failure = Some(e),
                    }
                }
                match failure {
                    Some(e) if !answered => Err(e),
                    _ => Ok(Message::HeartbeatReplies(replies)),
                }
            }
            other => {
                let group =
                    group_of(&other).ok_or_else(|| ConnectionError::Network("not a group request".into()))?;
                let shard = self.directory.shard_of(peer, group).ok_or_else(|| {
                    ConnectionError::Unreachable(format!("node {peer} holds no replica of {group}"))
                })?;
                if let Message::Append { req, .. } = &other {
                    if !req.entries.is_empty() {
                        self.replicated.borrow_mut().insert(group);
                    }
                }
                self.to_shard(shard).call(peer, other).await
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::BytesMut;
    use strand_raft::transport::codec::{Frame, RequestId};

    use super::*;

    #[test]
    fn peers_are_reached_at_ip_endpoints_at_once_and_at_host_names_once_resolved() {
        use crate::cluster::record::{BrokerEpoch, Endpoint, IncarnationId, Record, RegisterBroker};
        glommio::LocalExecutorBuilder::default()
            .spawn(|| async move {
                let mut state = ClusterState::default();
                for (id, host) in [(1, "127.0.0.1"), (2, "localhost")] {
                    state.apply(&Record::RegisterBroker(RegisterBroker {
                        broker: NodeId(id),
                        incarnation: IncarnationId(uuid::Uuid::from_u128(id as u128)),
                        epoch: BrokerEpoch(i64::from(id - 1)),
                        endpoints: vec![Endpoint {
                            listener: "INTERNAL".into(),
                            host: host.into(),
                            port: 9000 + id as u16,
                        }],
                        rack: None,
                        shards: 1,
                    }));
                }
                let dir = Directory::new("INTERNAL".into());
                *dir.state.borrow_mut() = Some(Rc::new(state));
                assert_eq!(dir.address(BrokerId(1)), Some("127.0.0.1:9001".parse().unwrap()));
                assert_eq!(dir.address(BrokerId(2)), None, "not resolved on the shard");
                assert_eq!(dir.address(BrokerId(3)), None, "unknown");
                dir.refresh().await;
                let resolved = dir.address(BrokerId(2)).expect("localhost resolves");
                assert!(resolved.ip().is_loopback());
                assert_eq!(resolved.port(), 9002);
            })
            .unwrap()
            .join()
            .unwrap();
    }

    #[test]
    fn a_hello_is_told_from_kafka_requests_by_its_first_two_bytes() {
        let codec = Codec::default();
        let hello = codec
            .encode_to_bytes(&Frame {
                request_id: RequestId(0),
                message: Message::Hello {
                    node: BrokerId(2),
                    shard: 1,
                },
            })
            .expect("a hello encodes");
        assert!(is_node_hello(&hello[4..]));
        assert_eq!(i16::from_be_bytes([hello[4], hello[5]]), NODE_HELLO_API_KEY);
        assert!(kafka_protocol::messages::ApiKey::try_from(NODE_HELLO_API_KEY).is_err());
        assert_eq!(peek_hello(&hello, codec), Some((BrokerId(2), 1)));
        // A partial hello names nothing yet; a Kafka request header is not a hello.
        assert_eq!(peek_hello(&hello[..hello.len() - 1], codec), None);
        assert!(!is_node_hello(&[0, 18, 0, 3]));
        let mut garbage = BytesMut::from(&[0u8, 0, 0, 4, 1, 13, 0, 0][..]);
        assert_eq!(peek_hello(&garbage.split(), codec), None);
    }
}
