//! How subsystems plug into the shard core.
//!
//! The core carries requests between shards and keeps a shard's partitions; it knows no
//! subsystem. A subsystem that answers requests from other shards (the group coordinator, the
//! queue engines, the controller, connection hand-over, ...) implements [`Service`]: its request
//! and response types are its own, and the core carries them as opaque boxes
//! ([`ServiceCall`]). Each shard registers its instance once at start-up ([`Shard::serve`]);
//! [`Shard::call`] sends a request to the instance on another shard, or starts it here, in
//! order with every other request this shard sends to that shard.
//!
//! A subsystem that reacts to what the core does (a metadata change, a retention pass, the
//! gauges' refresh) implements [`ShardHooks`] and registers with [`Shard::hook`].
//!
//! Between nodes of a cluster, a subsystem's requests travel as opaque bytes of a kind it owns:
//! it answers its kind with a [`NodeService`] ([`Shard::serve_node_kind`]) and sends with
//! [`Shard::call_node`], over the [`NodeLink`] the replication subsystem registers (it owns the
//! node-to-node transport and hands inbound requests to [`Shard::serve_node`]).
//!
//! The core holds registered subsystems weakly: they hold the core, and the server keeps them
//! alive (in `crate::subsystems::Subsystems`) for as long as the shard runs.

use std::any::{Any, TypeId};
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::{Rc, Weak};

use bytes::Bytes;
use futures::future::LocalBoxFuture;
use futures::FutureExt;
use strand_protocol::types::{NodeId, ShardId};

use super::ops::{ServiceAnswer, ServiceCall, ShardRequest, ShardResponse};
use super::router::RouterError;
use super::Shard;
use crate::cluster::ClusterState;
use crate::metadata::MetadataDelta;

/// A subsystem's endpoint on each shard.
pub(crate) trait Service: 'static {
    /// What other shards send it. Crosses threads, hence `Send`.
    type Request: Send + 'static;
    /// What it answers.
    type Response: Send + 'static;

    /// Starts `req` on this shard. Side effects that must follow arrival order happen before
    /// this returns; the future finishes the work.
    fn start(self: Rc<Self>, req: Self::Request) -> LocalBoxFuture<'static, Self::Response>;
}

/// A registered service, its types erased.
trait Endpoint {
    fn start(&self, body: Box<dyn Any + Send>) -> LocalBoxFuture<'static, ServiceAnswer>;
    fn as_any(&self) -> &dyn Any;
}

struct Registered<S: Service>(Weak<S>);

impl<S: Service> Endpoint for Registered<S> {
    fn start(&self, body: Box<dyn Any + Send>) -> LocalBoxFuture<'static, ServiceAnswer> {
        let (Some(service), Ok(req)) = (self.0.upgrade(), body.downcast::<S::Request>()) else {
            return async { ServiceAnswer::NONE }.boxed_local();
        };
        let answer = service.start(*req);
        async move { ServiceAnswer::new(Box::new(answer.await)) }.boxed_local()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// What a subsystem may do when the core does something. Every method has a default that does
/// nothing.
pub(crate) trait ShardHooks {
    /// Phase 1 of a metadata change, once per delta, after the core has taken it into its own
    /// tables and before it removes the logs of a deleted topic.
    fn metadata_preparing<'a>(&'a self, _delta: &'a MetadataDelta) -> LocalBoxFuture<'a, ()> {
        async {}.boxed_local()
    }

    /// Phase 2 of a metadata change: this shard's metadata replica has taken `deltas`.
    fn metadata_committed(&self, _deltas: &[MetadataDelta]) {}

    /// A retention pass is about to run over this shard's logs (retention floors).
    fn before_retention(&self) {}

    /// The shard refreshes its gauges.
    fn publish_gauges(&self) {}

    /// In a cluster, this shard has taken a newer applied state of the cluster metadata
    /// ([`Shard::cluster_state`]); `state` is it.
    fn cluster_changed(&self, _state: &Rc<ClusterState>) {}
}

/// The carrier of requests between nodes, registered by the subsystem that owns the
/// node-to-node transport (replication, in a cluster).
pub(crate) trait NodeLink {
    /// Sends a request of `kind` to shard `shard` of node `node`; resolves with its answer, or
    /// why none came within `timeout` (unreachable, refused, no service of that kind there).
    fn call(
        &self,
        node: NodeId,
        shard: ShardId,
        kind: u16,
        body: Bytes,
        timeout: std::time::Duration,
    ) -> LocalBoxFuture<'static, Result<Bytes, String>>;
}

/// A subsystem's answer to requests of one kind from other nodes ([`NodeLink`]).
pub(crate) trait NodeService {
    /// Answers one request; `None` when the body does not decode (the caller is told).
    fn serve(&self, body: Bytes) -> LocalBoxFuture<'static, Option<Bytes>>;
}

/// The services and hooks registered on one shard.
#[derive(Default)]
pub(crate) struct Registry {
    services: RefCell<HashMap<TypeId, Rc<dyn Endpoint>>>,
    hooks: RefCell<Vec<Weak<dyn ShardHooks>>>,
    node_link: RefCell<Option<Weak<dyn NodeLink>>>,
    node_services: RefCell<HashMap<u16, Weak<dyn NodeService>>>,
}

impl Registry {
    /// The live hooks, in registration order.
    pub(crate) fn hooks(&self) -> Vec<Rc<dyn ShardHooks>> {
        self.hooks.borrow().iter().filter_map(Weak::upgrade).collect()
    }
}

impl Shard {
    /// Registers this shard's instance of a service (once per service type).
    pub(crate) fn serve<S: Service>(&self, service: &Rc<S>) {
        let previous = self
            .registry
            .services
            .borrow_mut()
            .insert(TypeId::of::<S>(), Rc::new(Registered(Rc::downgrade(service))));
        debug_assert!(previous.is_none(), "a service registered twice on one shard");
    }

    /// Registers a subsystem's hooks.
    pub(crate) fn hook(&self, hooks: Rc<dyn ShardHooks>) {
        self.registry.hooks.borrow_mut().push(Rc::downgrade(&hooks));
    }

    /// Registers the carrier of requests between nodes (held weakly).
    pub(crate) fn set_node_link(&self, link: Rc<dyn NodeLink>) {
        *self.registry.node_link.borrow_mut() = Some(Rc::downgrade(&link));
    }

    /// Registers a subsystem's answer to node requests of `kind` (held weakly; once per kind).
    pub(crate) fn serve_node_kind(&self, kind: u16, service: Rc<dyn NodeService>) {
        let previous = self
            .registry
            .node_services
            .borrow_mut()
            .insert(kind, Rc::downgrade(&service));
        debug_assert!(previous.is_none(), "a node service registered twice on one shard");
    }

    /// Sends a request of `kind` to shard `shard` of node `node` over the node link; gives up
    /// after `timeout`.
    pub(crate) fn call_node(
        &self,
        node: NodeId,
        shard: ShardId,
        kind: u16,
        body: Bytes,
        timeout: std::time::Duration,
    ) -> LocalBoxFuture<'static, Result<Bytes, String>> {
        let link = self.registry.node_link.borrow().as_ref().and_then(Weak::upgrade);
        match link {
            Some(link) => link.call(node, shard, kind, body, timeout),
            None => async { Err("this node has no link to other nodes".to_owned()) }.boxed_local(),
        }
    }

    /// Answers a request of `kind` another node sent this shard; `None` when no service of that
    /// kind is registered or the body does not decode.
    pub(crate) fn serve_node(&self, kind: u16, body: Bytes) -> LocalBoxFuture<'static, Option<Bytes>> {
        let service = self
            .registry
            .node_services
            .borrow()
            .get(&kind)
            .and_then(Weak::upgrade);
        match service {
            Some(s) => s.serve(body),
            None => async { None }.boxed_local(),
        }
    }

    /// Takes a newer applied state of the cluster metadata and tells the hooks. Older states
    /// (a lower metadata offset than the one held) are ignored, so states may arrive from more
    /// than one path.
    pub(crate) fn set_cluster_state(&self, state: Rc<ClusterState>) {
        {
            let mut held = self.cluster.borrow_mut();
            if held
                .as_ref()
                .is_some_and(|h| h.next_offset() > state.next_offset())
            {
                return;
            }
            *held = Some(Rc::clone(&state));
        }
        for h in self.registry.hooks() {
            h.cluster_changed(&state);
        }
    }

    /// The newest applied cluster metadata this shard has, in a cluster (`None` on a
    /// standalone node, and before a cluster node's first state arrives).
    pub(crate) fn cluster_state(&self) -> Option<Rc<ClusterState>> {
        self.cluster.borrow().clone()
    }

    /// This shard's instance of service `S`, if registered and alive.
    fn local_service<S: Service>(&self) -> Option<Rc<S>> {
        let services = self.registry.services.borrow();
        let endpoint = services.get(&TypeId::of::<S>())?;
        endpoint.as_any().downcast_ref::<Registered<S>>()?.0.upgrade()
    }

    /// Sends `req` to service `S` on shard `owner` (or starts it here) and returns the answer's
    /// future. Calls made one after another reach each shard in that order, whatever service
    /// or core operation they are for.
    pub(crate) async fn call<S: Service>(
        self: &Rc<Self>,
        owner: ShardId,
        req: S::Request,
    ) -> Result<LocalBoxFuture<'static, Result<S::Response, RouterError>>, RouterError> {
        if owner == self.id {
            let Some(service) = self.local_service::<S>() else {
                return Err(RouterError::NoService(owner.0));
            };
            let answer = service.start(req);
            return Ok(async move { Ok(answer.await) }.boxed_local());
        }
        let call = ServiceCall::new(TypeId::of::<S>(), Box::new(req));
        let answer = self.router.start_call(owner, ShardRequest::Service(call)).await?;
        Ok(async move {
            match answer.await? {
                ShardResponse::Service(answer) => answer
                    .into_body()
                    .ok_or(RouterError::NoService(owner.0))?
                    .downcast::<S::Response>()
                    .map(|b| *b)
                    .map_err(|_| RouterError::NoService(owner.0)),
                _ => Err(RouterError::NoService(owner.0)),
            }
        }
        .boxed_local())
    }

    /// Sends `req` to service `S` on shard `owner` and waits for the answer; `None` if none came.
    pub(crate) async fn ask<S: Service>(
        self: &Rc<Self>,
        owner: ShardId,
        req: S::Request,
    ) -> Option<S::Response> {
        match self.call::<S>(owner, req).await {
            Ok(answer) => answer.await.ok(),
            Err(_) => None,
        }
    }

    /// Starts a service call that arrived from another shard.
    pub(crate) fn start_service(&self, call: ServiceCall) -> LocalBoxFuture<'static, ShardResponse> {
        let (service, body) = call.into_parts();
        let endpoint = self.registry.services.borrow().get(&service).cloned();
        match endpoint {
            Some(e) => {
                let answer = e.start(body);
                async move { ShardResponse::Service(answer.await) }.boxed_local()
            }
            None => async { ShardResponse::Service(ServiceAnswer::NONE) }.boxed_local(),
        }
    }
}
