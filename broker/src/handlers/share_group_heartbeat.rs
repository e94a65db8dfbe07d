//! ShareGroupHeartbeat (76): KIP-932 share group membership, answered by the group's share
//! coordinator ([`crate::queue::doors::kafka_share::group`]).

use std::rc::Rc;

use futures::FutureExt;
use kafka_protocol::messages::{ApiKey, ShareGroupHeartbeatRequest, ShareGroupHeartbeatResponse};
use kafka_protocol::ResponseError;

use super::{Handler, Reply, RequestCtx};
use crate::queue::doors::kafka_share::group::{ShareAnswer, ShareMeta, ShareOp};

pub(crate) struct ShareGroupHeartbeat;

impl Handler for ShareGroupHeartbeat {
    const KEY: ApiKey = ApiKey::ShareGroupHeartbeat;
    const MIN: i16 = 1;
    const MAX: i16 = 1;
    type Request = ShareGroupHeartbeatRequest;
    type Response = ShareGroupHeartbeatResponse;

    async fn handle(
        ctx: Rc<RequestCtx>,
        req: ShareGroupHeartbeatRequest,
    ) -> Reply<ShareGroupHeartbeatResponse> {
        let owner =
            crate::queue::doors::kafka_share::group::coordinator_of(&ctx.shard, req.group_id.as_str());
        let meta = ShareMeta {
            client_id: ctx.client_id.clone().unwrap_or_default(),
            client_host: ctx.conn.peer.map(|p| format!("/{}", p.ip())).unwrap_or_default(),
        };
        let op = ShareOp::Heartbeat {
            meta,
            req: Box::new(req),
        };
        let answer = crate::queue::doors::kafka_share::group::call(&ctx.shard, owner, op).await;
        Reply::Later(
            async move {
                match answer.await {
                    Some(ShareAnswer::Heartbeat(r)) => *r,
                    _ => ShareGroupHeartbeatResponse::default()
                        .with_error_code(ResponseError::CoordinatorNotAvailable.code()),
                }
            }
            .boxed_local(),
        )
    }

    fn error_codes(resp: &ShareGroupHeartbeatResponse, out: &mut Vec<i16>) {
        out.push(resp.error_code);
    }
}
