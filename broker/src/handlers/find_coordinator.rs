//! FindCoordinator (10): the coordinator of a group, transactional id or share group. On one
//! node it is always this broker; on a cluster node, one live broker per key
//! ([`super::cluster_view::coordinator`]). (librdkafka also reads this API's presence as the sign that a
//! broker supports LZ4 — without it, lz4 producers silently send uncompressed batches.)

use std::rc::Rc;

use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::{ApiKey, BrokerId, FindCoordinatorRequest, FindCoordinatorResponse};
use kafka_protocol::ResponseError;

use super::{cluster_view, msg, str_bytes, Handler, Reply, RequestCtx};
use crate::shard::AdvertisedListener;

pub(crate) struct FindCoordinator;

/// Key types: 0 group, 1 transaction, 2 share group.
const MAX_KEY_TYPE: i8 = 2;

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
        let coordinator_of = |key: &str| -> (BrokerId, AdvertisedListener) {
            match state
                .as_ref()
                .and_then(|s| cluster_view::coordinator(s, listener, key))
            {
                Some((id, e)) => (
                    BrokerId(id.0),
                    AdvertisedListener {
                        host: e.host,
                        port: e.port,
                    },
                ),
                None => own.clone(),
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
                    match check(k.as_str()) {
                        Ok(()) => {
                            let (node, adv) = coordinator_of(k.as_str());
                            c.with_node_id(node)
                                .with_host(str_bytes(&adv.host))
                                .with_port(i32::from(adv.port))
                        }
                        Err((e, m)) => c
                            .with_node_id(BrokerId(-1))
                            .with_port(-1)
                            .with_error_code(e.code())
                            .with_error_message(msg(m)),
                    }
                })
                .collect();
        } else {
            match check(req.key.as_str()) {
                Ok(()) => {
                    let (node, adv) = coordinator_of(req.key.as_str());
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
        Reply::Now(resp)
    }

    fn error_codes(resp: &FindCoordinatorResponse, out: &mut Vec<i16>) {
        out.push(resp.error_code);
        for c in &resp.coordinators {
            out.push(c.error_code);
        }
    }
}
