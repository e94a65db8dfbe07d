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
use crate::cluster::record::ConfigResource;
use crate::cluster::rpc::ControlRequest;
use crate::config::{GroupConfig, TopicConfig};
use crate::controller::{self, ConfigEdit, ControllerOp};
use crate::metadata::AdminError;

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
        return match alter_in_cluster(ctx, op).await {
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

/// The config record entries that turn the overrides `old` into `new`: a changed or added key
/// with its value, a removed one with none.
fn changes(old: &[(&'static str, String)], new: &[(&'static str, String)]) -> Vec<(String, Option<String>)> {
    let mut out: Vec<(String, Option<String>)> = new
        .iter()
        .filter(|(k, v)| !old.iter().any(|(ok, ov)| ok == k && ov == v))
        .map(|(k, v)| ((*k).to_owned(), Some(v.clone())))
        .collect();
    out.extend(
        old.iter()
            .filter(|(k, _)| !new.iter().any(|(nk, _)| nk == k))
            .map(|(k, _)| ((*k).to_owned(), None)),
    );
    out
}

/// A config change on a node of a KRaft-configured cluster: the edits applied to the overrides
/// the cluster state holds and checked here (values, internal-topic rules, group bounds), the
/// resulting changes decided by the active controller.
async fn alter_in_cluster(ctx: &RequestCtx, op: ControllerOp) -> Result<(), AdminError> {
    let state = ctx.shard.cluster_state().unwrap_or_default();
    let (resource, entries, validate_only) = match op {
        ControllerOp::AlterTopicConfig {
            name,
            edits,
            replace,
            validate_only,
        } => {
            if state.topic_by_name(&name).is_none() {
                return Err(AdminError::new(
                    ResponseError::UnknownTopicOrPartition,
                    format!("The topic '{name}' does not exist."),
                ));
            }
            let resource = ConfigResource::Topic(name.clone());
            let pairs = state.configs(&resource).into_iter().flatten();
            let old = TopicConfig::from_pairs(pairs.map(|(k, v)| (k.as_str(), v.as_str())))
                .map_err(|e| AdminError::new(ResponseError::InvalidConfig, e.to_string()))?;
            let new = controller::apply_edits(&old, &edits, replace)?;
            controller::check_topic_config(&name, Some(&old), &new)?;
            (
                resource,
                changes(&old.overrides(), &new.overrides()),
                validate_only,
            )
        }
        ControllerOp::AlterGroupConfig {
            group,
            edits,
            replace,
            validate_only,
        } => {
            let resource = ConfigResource::Group(group);
            let mut old = GroupConfig::default();
            for (k, v) in state.configs(&resource).into_iter().flatten() {
                old.set(k, v)
                    .map_err(|e| AdminError::new(ResponseError::InvalidConfig, e.to_string()))?;
            }
            let new = controller::apply_group_edits(&old, &edits, replace, &ctx.shard.config)?;
            (
                resource,
                changes(&old.overrides(), &new.overrides()),
                validate_only,
            )
        }
        _ => {
            return Err(AdminError::new(
                ResponseError::InvalidRequest,
                "not a config change",
            ))
        }
    };
    if validate_only || entries.is_empty() {
        return Ok(());
    }
    crate::cluster_link::decide(&ctx.shard, ControlRequest::AlterConfigs { resource, entries })
        .await
        .map(|_| ())
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

#[cfg(test)]
mod tests {
    use super::changes;

    #[test]
    fn config_changes_name_what_is_set_changed_or_removed() {
        let old = vec![
            ("retention.ms", "1".to_owned()),
            ("segment.bytes", "9".to_owned()),
        ];
        let new = vec![
            ("retention.ms", "2".to_owned()),
            ("cleanup.policy", "compact".to_owned()),
        ];
        let mut c = changes(&old, &new);
        c.sort();
        assert_eq!(
            c,
            vec![
                ("cleanup.policy".to_owned(), Some("compact".to_owned())),
                ("retention.ms".to_owned(), Some("2".to_owned())),
                ("segment.bytes".to_owned(), None),
            ]
        );
        assert!(changes(&old, &old).is_empty());
    }
}
