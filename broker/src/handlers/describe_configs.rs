//! DescribeConfigs (32): the real values of broker configs (BROKER resource, named by node id),
//! topic configs (TOPIC resource, overrides over broker defaults) and group configs (GROUP
//! resource: every group config, overrides over the broker's `group.share.*` defaults; a group
//! needs not exist, as in Kafka).

use std::rc::Rc;

use kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult, DescribeConfigsSynonym,
};
use kafka_protocol::messages::{ApiKey, DescribeConfigsRequest, DescribeConfigsResponse};
use kafka_protocol::ResponseError;

use super::{msg, str_bytes, Handler, Reply, RequestCtx};
use crate::config::ConfigEntry;

pub(crate) struct DescribeConfigs;

const TOPIC: i8 = 2;
const BROKER: i8 = 4;
const BROKER_LOGGER: i8 = 8;
const GROUP: i8 = 32;

fn render(
    entries: Vec<ConfigEntry>,
    keys: &Option<Vec<String>>,
    synonyms: bool,
    docs: bool,
    version: i16,
) -> Vec<DescribeConfigsResourceResult> {
    entries
        .into_iter()
        .filter(|e| keys.as_ref().is_none_or(|k| k.iter().any(|k| k == e.name)))
        .map(|e| {
            let value = e.value.as_deref().map(str_bytes);
            let mut r = DescribeConfigsResourceResult::default()
                .with_name(str_bytes(e.name))
                .with_value(value.clone())
                .with_read_only(e.read_only)
                .with_config_source(e.source.code())
                .with_is_sensitive(e.sensitive)
                .with_config_type(if version >= 3 { e.config_type.code() } else { 0 });
            if synonyms {
                r.synonyms = vec![DescribeConfigsSynonym::default()
                    .with_name(str_bytes(e.name))
                    .with_value(value)
                    .with_source(e.source.code())];
            }
            if docs && version >= 3 {
                r.documentation = Some(str_bytes(e.documentation));
            }
            r
        })
        .collect()
}

impl Handler for DescribeConfigs {
    const KEY: ApiKey = ApiKey::DescribeConfigs;
    const MIN: i16 = 1;
    const MAX: i16 = 4;
    type Request = DescribeConfigsRequest;
    type Response = DescribeConfigsResponse;

    async fn handle(ctx: Rc<RequestCtx>, req: DescribeConfigsRequest) -> Reply<DescribeConfigsResponse> {
        let shard = &ctx.shard;
        let md = shard.metadata();
        let node = shard.config.node_id.0.to_string();
        let results = req
            .resources
            .iter()
            .map(|res| {
                let name = res.resource_name.as_str();
                let keys: Option<Vec<String>> = res
                    .configuration_keys
                    .as_ref()
                    .map(|k| k.iter().map(|s| s.as_str().to_owned()).collect());
                let base = DescribeConfigsResult::default()
                    .with_resource_type(res.resource_type)
                    .with_resource_name(res.resource_name.clone());
                let fail = |e: ResponseError, m: String| {
                    base.clone().with_error_code(e.code()).with_error_message(msg(m))
                };
                match res.resource_type {
                    TOPIC => match md.topic(name) {
                        Some(t) => base.clone().with_configs(render(
                            t.config.entries(&shard.config),
                            &keys,
                            req.include_synonyms,
                            req.include_documentation,
                            ctx.version,
                        )),
                        None => fail(
                            ResponseError::UnknownTopicOrPartition,
                            format!("Topic '{name}' does not exist."),
                        ),
                    },
                    BROKER if name.is_empty() || name == node => base.clone().with_configs(render(
                        shard.config.broker_entries(),
                        &keys,
                        req.include_synonyms,
                        req.include_documentation,
                        ctx.version,
                    )),
                    BROKER => fail(
                        ResponseError::InvalidRequest,
                        format!("Unexpected broker id, expected {node} or empty string, but received {name}"),
                    ),
                    BROKER_LOGGER => base.clone(),
                    GROUP if name.is_empty() => fail(
                        ResponseError::InvalidRequest,
                        "Group name must not be empty.".to_string(),
                    ),
                    GROUP => base.clone().with_configs(render(
                        md.group_config(name)
                            .cloned()
                            .unwrap_or_default()
                            .entries(&shard.config),
                        &keys,
                        req.include_synonyms,
                        req.include_documentation,
                        ctx.version,
                    )),
                    other => fail(
                        ResponseError::InvalidRequest,
                        format!("Unsupported resource type {other}"),
                    ),
                }
            })
            .collect();
        Reply::Now(DescribeConfigsResponse::default().with_results(results))
    }

    fn error_codes(resp: &DescribeConfigsResponse, out: &mut Vec<i16>) {
        for r in &resp.results {
            out.push(r.error_code);
        }
    }
}
