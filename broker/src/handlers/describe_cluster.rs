//! DescribeCluster (60): this node, as seen through the connection's listener; on a node of a
//! KRaft-configured cluster, every live broker ([`super::cluster_view`]).

use std::rc::Rc;

use kafka_protocol::messages::describe_cluster_response::DescribeClusterBroker;
use kafka_protocol::messages::{ApiKey, BrokerId, DescribeClusterRequest, DescribeClusterResponse};
use kafka_protocol::ResponseError;
use strand_protocol::acl;

use super::{cluster_view, msg, str_bytes, Handler, Reply, RequestCtx};

pub(crate) struct DescribeCluster;

impl Handler for DescribeCluster {
    const KEY: ApiKey = ApiKey::DescribeCluster;
    const MIN: i16 = 0;
    const MAX: i16 = 2;
    type Request = DescribeClusterRequest;
    type Response = DescribeClusterResponse;

    async fn handle(ctx: Rc<RequestCtx>, req: DescribeClusterRequest) -> Reply<DescribeClusterResponse> {
        let config = &ctx.shard.config;
        let adv = ctx.advertised();
        let mut resp = DescribeClusterResponse::default()
            .with_endpoint_type(req.endpoint_type)
            .with_cluster_id(str_bytes(&config.cluster_id))
            .with_controller_id(BrokerId(config.node_id.0))
            .with_cluster_authorized_operations(acl::authorized(
                req.include_cluster_authorized_operations,
                acl::CLUSTER_OPERATIONS,
            ));
        // Endpoint type 2 asks for controllers; brokers answer it with an error (KIP-919).
        if ctx.version >= 1 && req.endpoint_type == 2 {
            resp.error_code = ResponseError::UnsupportedEndpointType.code();
            resp.error_message = msg("The target broker only supports endpoint type BROKERS (1)");
            return Reply::Now(resp);
        }
        if !config.cluster.is_standalone() {
            let state = ctx.shard.cluster_state().unwrap_or_default();
            resp.controller_id = BrokerId(cluster_view::controller_id(&state, config.node_id));
            let me = (
                config.node_id,
                cluster_view::missing_self(&state, config.node_id, &adv),
            );
            resp.brokers = cluster_view::cluster_brokers(&state, cluster_view::listener_name(&ctx), me);
            return Reply::Now(resp);
        }
        resp.brokers = vec![DescribeClusterBroker::default()
            .with_broker_id(BrokerId(config.node_id.0))
            .with_host(str_bytes(&adv.host))
            .with_port(i32::from(adv.port))];
        Reply::Now(resp)
    }

    fn error_codes(resp: &DescribeClusterResponse, out: &mut Vec<i16>) {
        out.push(resp.error_code);
    }
}
