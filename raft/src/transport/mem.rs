//! An in-memory network of nodes for tests and the simulation.
//!
//! [`MemNetwork`] holds every node's [`Server`]; [`MemNetwork::connection`] gives a node its
//! [`Connection`] to the others. A request is encoded with the codec, decoded as the peer
//! would, handed to the peer's server, and its answer encoded and decoded back, so everything
//! that crosses it has been through the wire format. Links can be cut and healed per pair of
//! nodes (both directions): a request over a cut link is unreachable, and an answer whose link
//! was cut while the request was handled is lost. An observer sees every request that
//! arrives. Delays and reordering are the runtime's business (the simulation runtime decides
//! when each task runs).

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;

use openraft::AsyncRuntime;

use super::codec::{Codec, Frame, Message, RequestId};
use super::network::{Connection, ConnectionError, GroupRafts, Server};
use crate::partition::BrokerId;

/// Sees each request as the receiving node decoded it: `(from, to, message)`.
pub type Observer = Box<dyn FnMut(BrokerId, BrokerId, &Message)>;

struct Inner<Rt, G> {
    codec: Codec,
    servers: RefCell<BTreeMap<BrokerId, Rc<Server<Rt, G>>>>,
    cut: RefCell<BTreeSet<(BrokerId, BrokerId)>>,
    observer: RefCell<Option<Observer>>,
}

/// The nodes of an in-memory cluster and the links between them.
pub struct MemNetwork<Rt, G> {
    inner: Rc<Inner<Rt, G>>,
}

impl<Rt, G> Clone for MemNetwork<Rt, G> {
    fn clone(&self) -> Self {
        MemNetwork {
            inner: Rc::clone(&self.inner),
        }
    }
}

fn link(a: BrokerId, b: BrokerId) -> (BrokerId, BrokerId) {
    (a.min(b), a.max(b))
}

impl<Rt: AsyncRuntime, G: GroupRafts<Rt>> MemNetwork<Rt, G> {
    pub fn new(codec: Codec) -> Self {
        MemNetwork {
            inner: Rc::new(Inner {
                codec,
                servers: RefCell::new(BTreeMap::new()),
                cut: RefCell::new(BTreeSet::new()),
                observer: RefCell::new(None),
            }),
        }
    }

    /// Node `id` answers requests with `server` (replacing a previous one: a restart).
    pub fn add_server(&self, id: BrokerId, server: Rc<Server<Rt, G>>) {
        self.inner.servers.borrow_mut().insert(id, server);
    }

    /// Node `id` is gone: requests to it are unreachable.
    pub fn remove_server(&self, id: BrokerId) {
        self.inner.servers.borrow_mut().remove(&id);
    }

    pub fn server(&self, id: BrokerId) -> Option<Rc<Server<Rt, G>>> {
        self.inner.servers.borrow().get(&id).cloned()
    }

    /// Cuts the link between `a` and `b`, both directions.
    pub fn cut(&self, a: BrokerId, b: BrokerId) {
        self.inner.cut.borrow_mut().insert(link(a, b));
    }

    pub fn heal(&self, a: BrokerId, b: BrokerId) {
        self.inner.cut.borrow_mut().remove(&link(a, b));
    }

    pub fn is_cut(&self, a: BrokerId, b: BrokerId) -> bool {
        self.inner.cut.borrow().contains(&link(a, b))
    }

    pub fn set_observer(&self, observer: Observer) {
        *self.inner.observer.borrow_mut() = Some(observer);
    }

    /// Node `local`'s connection to the others.
    pub fn connection(&self, local: BrokerId) -> MemConnection<Rt, G> {
        MemConnection {
            local,
            net: self.clone(),
            next_request: Cell::new(0),
        }
    }
}

/// One node's [`Connection`] on a [`MemNetwork`].
pub struct MemConnection<Rt, G> {
    local: BrokerId,
    net: MemNetwork<Rt, G>,
    next_request: Cell<u64>,
}

fn wire_error(e: impl std::fmt::Display) -> ConnectionError {
    ConnectionError::Network(e.to_string())
}

impl<Rt: AsyncRuntime, G: GroupRafts<Rt>> Connection for MemConnection<Rt, G> {
    async fn call(&self, peer: BrokerId, request: Message) -> Result<Message, ConnectionError> {
        let net = &self.net;
        let request_id = RequestId(self.next_request.get());
        self.next_request.set(request_id.0.wrapping_add(1));
        if net.is_cut(self.local, peer) {
            return Err(ConnectionError::Unreachable(format!(
                "link {}-{peer} is cut",
                self.local
            )));
        }
        let server = net
            .server(peer)
            .ok_or_else(|| ConnectionError::Unreachable(format!("no node {peer}")))?;
        let codec = net.inner.codec;
        let wire = codec
            .encode_to_bytes(&Frame {
                request_id,
                message: request,
            })
            .map_err(wire_error)?;
        let frame = codec.decode_prefixed(wire).map_err(wire_error)?;
        if let Some(observe) = net.inner.observer.borrow_mut().as_mut() {
            observe(self.local, peer, &frame.message);
        }
        let answer = server.handle(self.local, frame.message).await;
        if net.is_cut(self.local, peer) {
            return Err(ConnectionError::Network(format!(
                "the answer from {peer} was lost"
            )));
        }
        let wire = codec
            .encode_to_bytes(&Frame {
                request_id: frame.request_id,
                message: answer,
            })
            .map_err(wire_error)?;
        let back = codec.decode_prefixed(wire).map_err(wire_error)?;
        assert_eq!(back.request_id, request_id, "an answer carries its request's id");
        Ok(back.message)
    }
}
