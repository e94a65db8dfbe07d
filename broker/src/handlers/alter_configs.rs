//! IncrementalAlterConfigs (44) and AlterConfigs (33) for TOPIC and GROUP resources (group configs
//! of KIP-848/KIP-932, persisted cluster-wide by the controller). Broker configs are static in
//! Strand (read-only), so BROKER resources are refused.

use std::rc::Rc;

use kafka_protocol::messages::alter_configs_response::AlterConfigsResourceResponse as LegacyResourceResponse;
use kafka_protocol::messages::incremental_alter_configs_response::AlterConfigsResourceResponse;
use kafka_protocol::messages::{
    AlterConfigsRequest, AlterConfigsResponse, ApiKey, IncrementalAlterConfigsRequest,
    IncrementalAlterConfigsResponse,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use super::{msg, Handler, Reply, RequestCtx};
use crate::controller::{self, ConfigEdit, ControllerOp};

const TOPIC: i8 = 2;
const BROKER: i8 = 4;
const GROUP: i8 = 32;

/// Applies one resource's edits; returns (error code, message).
async fn alter(
    ctx: &Rc<RequestCtx>,
    resource_type: i8,
    name: &StrBytes,
    edits: Result<Vec<ConfigEdit>, String>,
    replace: bool,
    validate_only: bool,
) -> (i16, Option<String>) {
    let edits = match edits {
        Ok(e) => e,
        Err(m) => return (ResponseError::InvalidConfig.code(), Some(m)),
    };
    let op =
        match resource_type {
            TOPIC => ControllerOp::AlterTopicConfig {
                name: name.as_str().to_owned(),
                edits,
                replace,
                validate_only,
            },
            GROUP => ControllerOp::AlterGroupConfig {
                group: name.as_str().to_owned(),
                edits,
                replace,
                validate_only,
            },
            BROKER => return (
                ResponseError::InvalidRequest.code(),
                Some(
                    "broker configs are static in Strand: set them in server.properties or the environment"
                        .into(),
                ),
            ),
            other => {
                return (
                    ResponseError::InvalidRequest.code(),
                    Some(format!("Unsupported resource type {other}")),
                )
            }
        };
    if !ctx.shard.config.cluster.is_standalone() {
        return match crate::topic_admin::alter_in_cluster(&ctx.shard, op).await {
            Ok(()) => (0, None),
            Err(e) => (e.code.code(), Some(e.message)),
        };
    }
    let reply = controller::call(&ctx.shard, op).await;
    match reply.results.into_iter().next() {
        Some(r) => match r.error {
            Some(e) => (e.code.code(), Some(e.message)),
            None => (0, None),
        },
        None => (
            ResponseError::NotController.code(),
            Some("the controller did not answer".into()),
        ),
    }
}

pub(crate) struct IncrementalAlterConfigs;

impl Handler for IncrementalAlterConfigs {
    const KEY: ApiKey = ApiKey::IncrementalAlterConfigs;
    const MIN: i16 = 0;
    const MAX: i16 = 1;
    type Request = IncrementalAlterConfigsRequest;
    type Response = IncrementalAlterConfigsResponse;

    async fn handle(
        ctx: Rc<RequestCtx>,
        req: IncrementalAlterConfigsRequest,
    ) -> Reply<IncrementalAlterConfigsResponse> {
        let mut responses = Vec::with_capacity(req.resources.len());
        for r in &req.resources {
            let edits: Result<Vec<ConfigEdit>, String> = r
                .configs
                .iter()
                .map(|c| {
                    let key = c.name.as_str().to_owned();
                    let value = c.value.as_ref().map(|v| v.as_str().to_owned());
                    match (c.config_operation, value) {
                        (0, Some(v)) => Ok(ConfigEdit::Set(key, v)),
                        (0, None) => Err(format!("Null value not supported for : {key}")),
                        (1, _) => Ok(ConfigEdit::Delete(key)),
                        (2, Some(v)) => Ok(ConfigEdit::Append(key, v)),
                        (3, Some(v)) => Ok(ConfigEdit::Subtract(key, v)),
                        (op, _) => Err(format!("Unknown or invalid config operation {op} for {key}")),
                    }
                })
                .collect();
            let (code, message) = alter(
                &ctx,
                r.resource_type,
                &r.resource_name,
                edits,
                false,
                req.validate_only,
            )
            .await;
            responses.push(
                AlterConfigsResourceResponse::default()
                    .with_error_code(code)
                    .with_error_message(message.and_then(msg))
                    .with_resource_type(r.resource_type)
                    .with_resource_name(r.resource_name.clone()),
            );
        }
        Reply::Now(IncrementalAlterConfigsResponse::default().with_responses(responses))
    }

    fn error_codes(resp: &IncrementalAlterConfigsResponse, out: &mut Vec<i16>) {
        for r in &resp.responses {
            out.push(r.error_code);
        }
    }
}

pub(crate) struct AlterConfigs;

impl Handler for AlterConfigs {
    const KEY: ApiKey = ApiKey::AlterConfigs;
    const MIN: i16 = 0;
    const MAX: i16 = 2;
    type Request = AlterConfigsRequest;
    type Response = AlterConfigsResponse;

    async fn handle(ctx: Rc<RequestCtx>, req: AlterConfigsRequest) -> Reply<AlterConfigsResponse> {
        let mut responses = Vec::with_capacity(req.resources.len());
        for r in &req.resources {
            let edits: Result<Vec<ConfigEdit>, String> = r
                .configs
                .iter()
                .map(|c| {
                    let key = c.name.as_str().to_owned();
                    match &c.value {
                        Some(v) => Ok(ConfigEdit::Set(key, v.as_str().to_owned())),
                        None => Err(format!("Null value not supported for : {key}")),
                    }
                })
                .collect();
            let (code, message) = alter(
                &ctx,
                r.resource_type,
                &r.resource_name,
                edits,
                true,
                req.validate_only,
            )
            .await;
            responses.push(
                LegacyResourceResponse::default()
                    .with_error_code(code)
                    .with_error_message(message.and_then(msg))
                    .with_resource_type(r.resource_type)
                    .with_resource_name(r.resource_name.clone()),
            );
        }
        Reply::Now(AlterConfigsResponse::default().with_responses(responses))
    }

    fn error_codes(resp: &AlterConfigsResponse, out: &mut Vec<i16>) {
        for r in &resp.responses {
            out.push(r.error_code);
        }
    }
}
