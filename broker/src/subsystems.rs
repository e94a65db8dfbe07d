//! One shard's subsystems, assembled on its core: what the handlers and connections reach.
//!
//! Each subsystem owns its state, its cross-shard messages (a [`Service`] registered with the
//! core) and its reactions to the core ([`ShardHooks`]). It holds the core and the subsystems
//! below it; the core holds them only weakly, through its registry, and this struct keeps them
//! alive for as long as the shard runs.
//!
//! Layers: the shard core ← controller, fetch sessions, consumer groups ← queues (host, then
//! the HTTP and Kafka share doors) ← handlers ← connections.
//!
//! [`Service`]: crate::shard::service::Service
//! [`ShardHooks`]: crate::shard::service::ShardHooks

use std::path::PathBuf;
use std::rc::Rc;

use crate::controller::{Controller, CONTROLLER_SHARD};
use crate::fetch_session::FetchSessions;
use crate::group::host::GroupHost;
use crate::metadata::ClusterMetadata;
use crate::queue::doors::kafka_share::group::ShareHost;
use crate::queue::doors::kafka_share::session::SessionsHost;
use crate::queue::host::QueueHost;
use crate::replication::Replication;
use crate::shard::Shard;

pub(crate) struct Subsystems {
    pub(crate) core: Rc<Shard>,
    /// The controller, on [`CONTROLLER_SHARD`] only (reached through `controller::call`).
    _controller: Option<Rc<Controller>>,
    /// KIP-227 fetch sessions of the connections on this shard.
    pub(crate) fetch_sessions: Rc<FetchSessions>,
    /// The coordinator of the groups of this shard's `__consumer_offsets` partitions.
    pub(crate) groups: Rc<GroupHost>,
    /// The queue engines of this shard's partitions.
    pub(crate) queues: Rc<QueueHost>,
    /// The coordinator of the share groups whose coordinator shard this is.
    _shares: Rc<ShareHost>,
    /// KIP-932 share sessions of the connections on this shard.
    pub(crate) share_sessions: Rc<SessionsHost>,
    /// In a cluster, the partition groups of this shard's replicas.
    pub(crate) replication: Option<Rc<Replication>>,
}

impl Subsystems {
    /// Builds the subsystems of `core`'s shard and registers their services and hooks.
    /// `metadata` is the cluster metadata as loaded at start-up (the controller's state).
    pub(crate) fn new(core: &Rc<Shard>, metadata: ClusterMetadata, log_dir: PathBuf) -> Rc<Self> {
        let controller = (core.id == CONTROLLER_SHARD).then(|| {
            Rc::new(Controller::new(
                core.clone(),
                metadata,
                log_dir,
                core.config.node_id.0,
            ))
        });
        if let Some(c) = &controller {
            core.serve(c);
        }

        let fetch_sessions = Rc::new(FetchSessions::new(core.id, core.shards));
        core.hook(fetch_sessions.clone());

        let groups = GroupHost::new(core.clone());
        core.serve(&groups);
        core.hook(groups.clone());

        let queues = QueueHost::new(core.clone());
        core.serve(&queues);
        core.hook(queues.clone());
        core.serve_node_kind(crate::queue::host::wire::QUEUE_OP_KIND, queues.clone());

        let shares = ShareHost::new(core.clone(), groups.clone());
        core.serve(&shares);
        // One group id names one group: the group coordinator refuses share groups' ids.
        let other_groups: Rc<dyn crate::group::host::OtherGroups> = shares.clone();
        groups.set_other_groups(Rc::downgrade(&other_groups));

        let share_sessions = Rc::new(SessionsHost::new());
        core.serve(&share_sessions);

        let replication = match (
            &core.config.cluster.inter_broker_listener,
            core.config.cluster.is_standalone(),
        ) {
            (Some(l), false) => Some(Replication::new(core, l.name.clone())),
            _ => None,
        };

        Rc::new(Subsystems {
            core: core.clone(),
            _controller: controller,
            fetch_sessions,
            groups,
            queues,
            _shares: shares,
            share_sessions,
            replication,
        })
    }

    /// Loads what the subsystems keep beside the logs (group state, queue engines), once the
    /// shard's partitions are open.
    pub(crate) async fn start(&self) {
        self.groups.start().await;
        self.queues.start().await;
    }
}
