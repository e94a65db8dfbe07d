//! DescribeShareGroupOffsets (90, KIP-932): per share group, the share-partition start offset
//! of each partition asked for (every partition the group has share state for when the request
//! names no topics). The group must be a share group its coordinator knows; the offsets are the
//! queue engines' start offsets, asked of every shard.

use std::collections::BTreeMap;
use std::rc::Rc;

use futures::future::join_all;
use kafka_protocol::messages::describe_share_group_offsets_request::DescribeShareGroupOffsetsRequestGroup;
use kafka_protocol::messages::describe_share_group_offsets_response::{
    DescribeShareGroupOffsetsResponseGroup, DescribeShareGroupOffsetsResponsePartition,
    DescribeShareGroupOffsetsResponseTopic,
};
use kafka_protocol::messages::{
    ApiKey, DescribeShareGroupOffsetsRequest, DescribeShareGroupOffsetsResponse, GroupId, TopicName,
};
use kafka_protocol::ResponseError;

use super::{msg, str_bytes, Handler, Reply, RequestCtx};
use crate::queue::doors::kafka_share::group::{share_group_members, GroupError};
use crate::queue::doors::kafka_share::on_every_shard;
use crate::queue::host::{QueueAnswer, QueueOp};
use crate::shard::{Shard, LEADER_EPOCH};

pub(crate) struct DescribeShareGroupOffsets;

impl Handler for DescribeShareGroupOffsets {
    const KEY: ApiKey = ApiKey::DescribeShareGroupOffsets;
    const MIN: i16 = 0;
    const MAX: i16 = 0;
    type Request = DescribeShareGroupOffsetsRequest;
    type Response = DescribeShareGroupOffsetsResponse;

    async fn handle(
        ctx: Rc<RequestCtx>,
        req: DescribeShareGroupOffsetsRequest,
    ) -> Reply<DescribeShareGroupOffsetsResponse> {
        let groups = join_all(req.groups.into_iter().map(|g| describe_group(&ctx.shard, g))).await;
        Reply::Now(DescribeShareGroupOffsetsResponse::default().with_groups(groups))
    }

    fn error_codes(resp: &DescribeShareGroupOffsetsResponse, out: &mut Vec<i16>) {
        for g in &resp.groups {
            out.push(g.error_code);
            for t in &g.topics {
                out.extend(t.partitions.iter().map(|p| p.error_code));
            }
        }
    }
}

async fn describe_group(
    shard: &Rc<Shard>,
    req: DescribeShareGroupOffsetsRequestGroup,
) -> DescribeShareGroupOffsetsResponseGroup {
    let group = req.group_id.as_str().to_owned();
    let out = DescribeShareGroupOffsetsResponseGroup::default().with_group_id(GroupId(str_bytes(&group)));
    let refused = |(e, m): GroupError| {
        out.clone()
            .with_error_code(e.code())
            .with_error_message(m.map(kafka_protocol::protocol::StrBytes::from_string))
    };
    if let Err(e) = share_group_members(shard, &group).await {
        return refused(e);
    }
    let names: Option<Vec<String>> = req
        .topics
        .as_ref()
        .map(|ts| ts.iter().map(|t| t.topic_name.as_str().to_owned()).collect());
    let Some(answers) = on_every_shard(shard, || QueueOp::ShareOffsets {
        group: group.clone(),
        topics: names.clone(),
    })
    .await
    else {
        return refused((ResponseError::CoordinatorNotAvailable, None));
    };
    let mut starts: BTreeMap<(String, i32), i64> = BTreeMap::new();
    for a in answers {
        if let QueueAnswer::ShareOffsets(v) = a {
            starts.extend(v.into_iter().map(|(t, p, s)| ((t, p), s)));
        }
    }
    let md = shard.metadata();
    let known = |partition: i32, start: i64| {
        DescribeShareGroupOffsetsResponsePartition::default()
            .with_partition_index(partition)
            .with_start_offset(start)
            .with_leader_epoch(LEADER_EPOCH)
    };
    let unknown = |partition: i32| {
        DescribeShareGroupOffsetsResponsePartition::default()
            .with_partition_index(partition)
            .with_start_offset(-1)
            .with_leader_epoch(-1)
            .with_error_code(ResponseError::UnknownTopicOrPartition.code())
            .with_error_message(msg(ResponseError::UnknownTopicOrPartition.to_string()))
    };
    let topics = match req.topics {
        // Every topic the group has share state for (still in the metadata), in name order.
        None => {
            let mut by_topic: BTreeMap<String, Vec<DescribeShareGroupOffsetsResponsePartition>> =
                BTreeMap::new();
            for ((t, p), s) in starts {
                if md.topic(&t).is_some() {
                    by_topic.entry(t).or_default().push(known(p, s));
                }
            }
            by_topic
                .into_iter()
                .filter_map(|(t, partitions)| {
                    let id = md.topic(&t)?.id.0;
                    Some(
                        DescribeShareGroupOffsetsResponseTopic::default()
                            .with_topic_name(TopicName(str_bytes(&t)))
                            .with_topic_id(id)
                            .with_partitions(partitions),
                    )
                })
                .collect()
        }
        Some(requested) => requested
            .into_iter()
            .map(|t| {
                let name = t.topic_name.as_str().to_owned();
                let meta = md.topic(&name);
                let partitions = t
                    .partitions
                    .iter()
                    .map(|&p| match meta {
                        Some(m) if p >= 0 && p < m.partitions => {
                            known(p, starts.get(&(name.clone(), p)).copied().unwrap_or(-1))
                        }
                        _ => unknown(p),
                    })
                    .collect();
                DescribeShareGroupOffsetsResponseTopic::default()
                    .with_topic_name(t.topic_name)
                    .with_topic_id(meta.map(|m| m.id.0).unwrap_or_default())
                    .with_partitions(partitions)
            })
            .collect(),
    };
    out.with_topics(topics)
}
