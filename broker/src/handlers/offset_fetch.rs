//! OffsetFetch (9): a group's committed offsets. Up to v7 one group per request; from v8 several,
//! split by coordinator shard and merged in request order.

use std::rc::Rc;

use futures::FutureExt;
use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponseGroup, OffsetFetchResponsePartition, OffsetFetchResponseTopic,
};
use kafka_protocol::messages::{ApiKey, OffsetFetchRequest, OffsetFetchResponse};
use kafka_protocol::ResponseError;

use super::{group_call, group_scatter, Handler, Reply, RequestCtx};
use crate::group::{GroupRequest, GroupResponse};

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
            let group = req.group_id.0.as_str().to_owned();
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
            let answer = group_call(&ctx, &group, GroupRequest::OffsetFetch(req)).await;
            return Reply::Later(
                async move {
                    match answer.await {
                        Some(GroupResponse::OffsetFetch(r)) => r,
                        _ => fallback,
                    }
                }
                .boxed_local(),
            );
        }
        let order: Vec<String> = req
            .groups
            .iter()
            .map(|g| g.group_id.0.as_str().to_owned())
            .collect();
        let parts = group_scatter(&ctx, order.clone(), false, |subset| {
            let mut sub = req.clone();
            sub.groups
                .retain(|g| subset.iter().any(|s| s.as_str() == g.group_id.0.as_str()));
            GroupRequest::OffsetFetch(sub)
        })
        .await;
        let mut answered: Vec<OffsetFetchResponseGroup> = Vec::new();
        for (subset, answer) in parts {
            match answer {
                Some(GroupResponse::OffsetFetch(r)) => answered.extend(r.groups),
                _ => answered.extend(subset.into_iter().map(|g| {
                    OffsetFetchResponseGroup::default()
                        .with_group_id(kafka_protocol::messages::GroupId(super::str_bytes(&g)))
                        .with_error_code(unavailable)
                })),
            }
        }
        let groups = order
            .iter()
            .filter_map(|g| {
                answered
                    .iter()
                    .position(|a| a.group_id.0.as_str() == g)
                    .map(|i| answered.swap_remove(i))
            })
            .collect();
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
