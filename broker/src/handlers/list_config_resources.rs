//! ListConfigResources (74, KIP-1142): the resources whose configs can be described, by type:
//! topics (every topic), brokers and broker loggers (every live broker, by id), groups (those
//! this node coordinates and those with config overrides) and client metrics subscriptions
//! (none: Strand keeps none). v0 (formerly ListClientMetricsResources) lists client metrics
//! only; v1 lists the types asked for, all when none are. A type that has no configs is
//! refused with INVALID_REQUEST.

use std::collections::BTreeSet;
use std::rc::Rc;

use kafka_protocol::messages::list_config_resources_response::ConfigResource;
use kafka_protocol::messages::{
    ApiKey, ListConfigResourcesRequest, ListConfigResourcesResponse, ListGroupsRequest,
};
use kafka_protocol::ResponseError;

use super::{str_bytes, Handler, Reply, RequestCtx};

const TOPIC: i8 = 2;
const BROKER: i8 = 4;
const BROKER_LOGGER: i8 = 8;
const CLIENT_METRICS: i8 = 16;
const GROUP: i8 = 32;

pub(crate) struct ListConfigResources;

impl Handler for ListConfigResources {
    const KEY: ApiKey = ApiKey::ListConfigResources;
    const MIN: i16 = 0;
    const MAX: i16 = 1;
    type Request = ListConfigResourcesRequest;
    type Response = ListConfigResourcesResponse;

    async fn handle(
        ctx: Rc<RequestCtx>,
        req: ListConfigResourcesRequest,
    ) -> Reply<ListConfigResourcesResponse> {
        let mut resp = ListConfigResourcesResponse::default();
        let types: BTreeSet<i8> = if ctx.version == 0 {
            [CLIENT_METRICS].into()
        } else if req.resource_types.is_empty() {
            [TOPIC, BROKER, BROKER_LOGGER, CLIENT_METRICS, GROUP].into()
        } else {
            req.resource_types.iter().copied().collect()
        };
        if let Some(t) = types
            .iter()
            .find(|t| ![TOPIC, BROKER, BROKER_LOGGER, CLIENT_METRICS, GROUP].contains(t))
        {
            tracing::debug!(resource_type = t, "ListConfigResources: a type without configs");
            resp.error_code = ResponseError::InvalidRequest.code();
            return Reply::Now(resp);
        }
        let mut listed: Vec<(String, i8)> = Vec::new();
        if types.contains(&TOPIC) {
            listed.extend(ctx.shard.metadata().topics().map(|t| (t.name.clone(), TOPIC)));
        }
        let brokers: Vec<String> = if ctx.shard.config.cluster.is_standalone() {
            vec![ctx.shard.config.node_id.0.to_string()]
        } else {
            let state = ctx.shard.cluster_state().unwrap_or_default();
            state.live_brokers().map(|b| b.id.0.to_string()).collect()
        };
        for t in [BROKER, BROKER_LOGGER] {
            if types.contains(&t) {
                listed.extend(brokers.iter().map(|b| (b.clone(), t)));
            }
        }
        if types.contains(&GROUP) {
            let mut groups: BTreeSet<String> = ctx
                .shard
                .metadata()
                .group_configs()
                .map(|(g, _)| g.to_string())
                .collect();
            let coordinated =
                super::list_groups::list(&ctx, &ListGroupsRequest::default(), Vec::new(), Vec::new()).await;
            if coordinated.error_code != 0 {
                resp.error_code = coordinated.error_code;
                return Reply::Now(resp);
            }
            groups.extend(coordinated.groups.into_iter().map(|g| g.group_id.0.to_string()));
            listed.extend(groups.into_iter().map(|g| (g, GROUP)));
        }
        resp.config_resources = listed
            .into_iter()
            .map(|(name, t)| {
                ConfigResource::default()
                    .with_resource_name(str_bytes(&name))
                    .with_resource_type(if ctx.version >= 1 { t } else { CLIENT_METRICS })
            })
            .collect();
        Reply::Now(resp)
    }

    fn error_codes(resp: &ListConfigResourcesResponse, out: &mut Vec<i16>) {
        out.push(resp.error_code);
    }
}
