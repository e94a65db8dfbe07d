//! OffsetFetch (9): a group's committed offsets. Up to v7 one group per request; from v8 several,
//! split by coordinator shard and merged in request order.

use std::rc::Rc;

use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponsePartition, OffsetFetchResponseTopic,
};
use kafka_protocol::messages::{ApiKey, OffsetFetchRequest, OffsetFetchResponse};
use kafka_protocol::ResponseError;

use super::{to_coordinator, Handler, Reply, RequestCtx};
use crate::group::route::per_group;

pub(crate) struct OffsetFetch;

impl Handler for OffsetFetch {
    const KEY: ApiKey = ApiKey::OffsetFetch;
    const MIN: i16 = 1;
    const MAX: i16 = 9;
    type Request = OffsetFetchRequest;
    type Response = OffsetFetchResponse;

    async fn handle(ctx: Rc<RequestCtx>, req: OffsetFetchRequest) -> Reply<OffsetFetchResponse> {
        let unavailable = ResponseError::CoordinatorNotAvailable.code();
        if ctx.version < 8 {
            // v1 has no top-level error code: the fallback names each requested partition.
            let fallback = if ctx.version >= 2 {
                OffsetFetchResponse::default().with_error_code(unavailable)
            } else {
                OffsetFetchResponse::default().with_topics(
                    req.topics
                        .iter()
                        .flatten()
                        .map(|t| {
                            OffsetFetchResponseTopic::default()
                                .with_name(t.name.clone())
                                .with_partitions(
                                    t.partition_indexes
                                        .iter()
                                        .map(|p| {
                                            OffsetFetchResponsePartition::default()
                                                .with_partition_index(*p)
                                                .with_committed_offset(-1)
                                                .with_error_code(unavailable)
                                        })
                                        .collect(),
                                )
                        })
                        .collect(),
                )
            };
            return to_coordinator(&ctx, req, fallback).await;
        }
        let groups = per_group(&ctx.shard, &ctx.group_meta(), &req).await;
        Reply::Now(OffsetFetchResponse::default().with_groups(groups))
    }

    fn error_codes(resp: &OffsetFetchResponse, out: &mut Vec<i16>) {
        out.push(resp.error_code);
        out.extend(
            resp.topics
                .iter()
                .flat_map(|t| t.partitions.iter().map(|p| p.error_code)),
        );
        for g in &resp.groups {
            out.push(g.error_code);
            out.extend(
                g.topics
                    .iter()
                    .flat_map(|t| t.partitions.iter().map(|p| p.error_code)),
            );
        }
    }
}
