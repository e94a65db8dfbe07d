//! FindCoordinator (10): the coordinator of a group, transactional id or share group. On one
//! node it is always this broker. On a cluster node a group's is the leader of its partition of
//! `__consumer_offsets` ([`super::cluster_view::group_coordinator`]; COORDINATOR_NOT_AVAILABLE
//! while it has none, and while the cluster creates the topic, which the first such request
//! asks for, as Kafka does); other keys', one live broker per key
//! ([`super::cluster_view::coordinator`]). (librdkafka also reads this API's presence as the sign that a
//! broker supports LZ4 — without it, lz4 producers silently send uncompressed batches.)

use std::rc::Rc;

use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::{ApiKey, BrokerId, FindCoordinatorRequest, FindCoordinatorResponse};
use kafka_protocol::ResponseError;

use super::cluster_view::GroupCoordinator;
use super::{cluster_view, msg, str_bytes, Handler, Reply, RequestCtx};
use crate::internal_topics::CONSUMER_OFFSETS as OFFSETS_TOPIC;
use crate::shard::AdvertisedListener;

pub(crate) struct FindCoordinator;

/// Key types: 0 group, 1 transaction, 2 share group.
const MAX_KEY_TYPE: i8 = 2;
const GROUP_KEY: i8 = 0;

thread_local! {
    /// A creation of `__consumer_offsets` asked for by this shard is in flight.
    static CREATING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Asks the cluster to create `__consumer_offsets`, once at a time per shard; a failure (too
/// few live brokers for its replication factor) is logged, and the next FindCoordinator asks
/// again.
fn start_offsets_topic_creation(shard: &Rc<crate::shard::Shard>) {
    if CREATING.with(|c| c.replace(true)) {
        return;
    }
    let shard = Rc::clone(shard);
    glommio::spawn_local(async move {
        if let Err(e) = crate::cluster_link::create_offsets_topic(&shard).await {
            tracing::warn!(error = %e.message, code = ?e.code, "cannot create {OFFSETS_TOPIC} yet");
        }
        CREATING.with(|c| c.set(false));
    })
    .detach();
}

impl Handler for FindCoordinator {
    const KEY: ApiKey = ApiKey::FindCoordinator;
    const MIN: i16 = 0;
    const MAX: i16 = 6;
    type Request = FindCoordinatorRequest;
    type Response = FindCoordinatorResponse;

    async fn handle(ctx: Rc<RequestCtx>, req: FindCoordinatorRequest) -> Reply<FindCoordinatorResponse> {
        let own = (BrokerId(ctx.shard.config.node_id.0), ctx.advertised());
        let state = (!ctx.shard.config.cluster.is_standalone())
            .then(|| ctx.shard.cluster_state().unwrap_or_default());
        let listener = cluster_view::listener_name(&ctx);
        let mut create_offsets_topic = false;
        let mut coordinator_of =
            |key: &str| -> Result<(BrokerId, AdvertisedListener), (ResponseError, String)> {
                let Some(state) = state.as_ref() else {
                    return Ok(own.clone());
                };
                let at = |id: strand_protocol::types::NodeId, e: crate::cluster::record::Endpoint| {
                    (
                        BrokerId(id.0),
                        AdvertisedListener {
                            host: e.host,
                            port: e.port,
                        },
                    )
                };
                if req.key_type != GROUP_KEY {
                    return Ok(cluster_view::coordinator(state, listener, key)
                        .map_or_else(|| own.clone(), |(id, e)| at(id, e)));
                }
                match cluster_view::group_coordinator_of(&ctx, state, key) {
                    GroupCoordinator::At(id, e) => Ok(at(id, e)),
                    GroupCoordinator::NoTopic => {
                        create_offsets_topic = true;
                        Err((
                            ResponseError::CoordinatorNotAvailable,
                            format!("{OFFSETS_TOPIC} is being created"),
                        ))
                    }
                    GroupCoordinator::NoLeader => Err((
                        ResponseError::CoordinatorNotAvailable,
                        format!("The partition of {OFFSETS_TOPIC} that holds the group has no live leader"),
                    )),
                }
            };
        let check = |key: &str| -> Result<(), (ResponseError, String)> {
            if !(0..=MAX_KEY_TYPE).contains(&req.key_type) {
                return Err((
                    ResponseError::InvalidRequest,
                    format!("Unknown coordinator key type {}", req.key_type),
                ));
            }
            if key.is_empty() {
                return Err((
                    ResponseError::InvalidRequest,
                    "The coordinator key must not be empty".into(),
                ));
            }
            Ok(())
        };
        let mut resp = FindCoordinatorResponse::default();
        if ctx.version >= 4 {
            resp.coordinators = req
                .coordinator_keys
                .iter()
                .map(|k| {
                    let c = Coordinator::default().with_key(k.clone());
                    match check(k.as_str()).and_then(|()| coordinator_of(k.as_str())) {
                        Ok((node, adv)) => c
                            .with_node_id(node)
                            .with_host(str_bytes(&adv.host))
                            .with_port(i32::from(adv.port)),
                        Err((e, m)) => c
                            .with_node_id(BrokerId(-1))
                            .with_port(-1)
                            .with_error_code(e.code())
                            .with_error_message(msg(m)),
                    }
                })
                .collect();
        } else {
            match check(req.key.as_str()).and_then(|()| coordinator_of(req.key.as_str())) {
                Ok((node, adv)) => {
                    resp.node_id = node;
                    resp.host = str_bytes(&adv.host);
                    resp.port = i32::from(adv.port);
                }
                Err((e, m)) => {
                    resp.error_code = e.code();
                    resp.node_id = BrokerId(-1);
                    resp.port = -1;
                    if ctx.version >= 1 {
                        resp.error_message = msg(m);
                    }
                }
            }
        }
        if create_offsets_topic {
            start_offsets_topic_creation(&ctx.shard);
        }
        Reply::Now(resp)
    }

    fn error_codes(resp: &FindCoordinatorResponse, out: &mut Vec<i16>) {
        out.push(resp.error_code);
        for c in &resp.coordinators {
            out.push(c.error_code);
        }
    }
}
