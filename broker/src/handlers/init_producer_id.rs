//! InitProducerId (22): producer ids for idempotent producers. Each call gets a new id with
//! epoch 0, as Kafka does for producers without a transactional id (also when the request names
//! an existing id and epoch, KIP-360). A standalone node hands out ids from its own persisted
//! block; a cluster node from blocks of the controller quorum (KIP-730). Transactional ids are refused until transactions exist.

use std::rc::Rc;

use kafka_protocol::messages::{ApiKey, InitProducerIdRequest, InitProducerIdResponse, ProducerId};
use kafka_protocol::ResponseError;

use super::{Handler, Reply, RequestCtx};
use crate::cluster_link;
use crate::controller::{self, ControllerOp};

pub(crate) struct InitProducerId;

impl Handler for InitProducerId {
    const KEY: ApiKey = ApiKey::InitProducerId;
    const MIN: i16 = 0;
    const MAX: i16 = 5;
    type Request = InitProducerIdRequest;
    type Response = InitProducerIdResponse;

    async fn handle(ctx: Rc<RequestCtx>, req: InitProducerIdRequest) -> Reply<InitProducerIdResponse> {
        let fail = |e: ResponseError| {
            InitProducerIdResponse::default()
                .with_error_code(e.code())
                .with_producer_id(ProducerId(-1))
                .with_producer_epoch(-1)
        };
        if req.transactional_id.as_ref().is_some_and(|t| !t.0.is_empty()) {
            // No transaction coordinator yet: refuse clearly rather than hand out an id the
            // transactional APIs could not honour.
            tracing::info!(client = ?ctx.client_id, "InitProducerId with a transactional id refused: transactions are not supported yet");
            return Reply::Now(fail(ResponseError::TransactionalIdAuthorizationFailed));
        }
        if !ctx.shard.config.cluster.is_standalone() {
            // A cluster node: ids come from the controller quorum's blocks.
            return Reply::Now(match cluster_link::producer_id(&ctx.shard).await {
                Ok(id) => InitProducerIdResponse::default()
                    .with_producer_id(ProducerId(id))
                    .with_producer_epoch(0),
                Err(e) => {
                    tracing::info!(error = %e.message, "no producer id block yet");
                    fail(e.code)
                }
            });
        }
        let reply = controller::call(&ctx.shard, ControllerOp::AllocateProducerId).await;
        Reply::Now(match reply.producer_id {
            Some(Ok(id)) => InitProducerIdResponse::default()
                .with_producer_id(ProducerId(id))
                .with_producer_epoch(0),
            Some(Err(e)) => {
                tracing::error!(error = %e, "producer id allocation failed");
                fail(ResponseError::KafkaStorageError)
            }
            None => fail(ResponseError::CoordinatorNotAvailable),
        })
    }

    fn error_codes(resp: &InitProducerIdResponse, out: &mut Vec<i16>) {
        out.push(resp.error_code);
    }
}
