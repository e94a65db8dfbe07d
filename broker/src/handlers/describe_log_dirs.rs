//! DescribeLogDirs (35): the node's one log directory (`log.dirs`), the partitions it holds a
//! replica of (leader's or follower's) with their sizes on disk, and (v4) the file system's
//! total and usable bytes.
//!
//! As Kafka: no topics named means every partition on this node; partitions named that the node
//! holds no replica of are left out; `offset_lag` is 0 (there are no future replicas, which is
//! what it measures) and `is_future_key` false.

use std::collections::BTreeMap;
use std::rc::Rc;

use kafka_protocol::messages::describe_log_dirs_response::{
    DescribeLogDirsPartition, DescribeLogDirsResult, DescribeLogDirsTopic,
};
use kafka_protocol::messages::{ApiKey, DescribeLogDirsRequest, DescribeLogDirsResponse, TopicName};
use strand_storage::fs::Fs;

use super::{str_bytes, Handler, Reply, RequestCtx};
use crate::shard::ops::{PartRef, ShardRequest, ShardResponse};

pub(crate) struct DescribeLogDirs;

impl Handler for DescribeLogDirs {
    const KEY: ApiKey = ApiKey::DescribeLogDirs;
    const MIN: i16 = 1;
    const MAX: i16 = 4;
    type Request = DescribeLogDirsRequest;
    type Response = DescribeLogDirsResponse;

    async fn handle(ctx: Rc<RequestCtx>, req: DescribeLogDirsRequest) -> Reply<DescribeLogDirsResponse> {
        let shard = &ctx.shard;
        let parts: Vec<(PartRef, ())> = {
            let md = shard.metadata();
            let mut listed: Vec<PartRef> = match &req.topics {
                None => md
                    .topics()
                    .flat_map(|t| {
                        (0..t.partitions).map(|p| PartRef {
                            topic: t.name.clone(),
                            partition: p,
                        })
                    })
                    .collect(),
                Some(topics) => topics
                    .iter()
                    .flat_map(|t| {
                        let known = md.topic(t.topic.0.as_str()).map_or(0, |m| m.partitions);
                        t.partitions
                            .iter()
                            .filter(move |p| (0..known).contains(*p))
                            .map(move |p| PartRef {
                                topic: t.topic.0.to_string(),
                                partition: *p,
                            })
                    })
                    .collect(),
            };
            // A partition named twice is described once.
            let mut seen = std::collections::HashSet::new();
            listed.retain(|p| seen.insert(p.clone()));
            listed.into_iter().map(|p| (p, ())).collect()
        };
        let names: Vec<PartRef> = parts.iter().map(|(p, _)| p.clone()).collect();
        let sizes = crate::shard::scatter(
            shard,
            parts,
            |list| ShardRequest::LogSizes(list.into_iter().map(|(p, ())| p).collect()),
            |r| match r {
                ShardResponse::LogSizes(v) => Some(v),
                _ => None,
            },
            None,
        )
        .await;
        let mut topics: BTreeMap<String, Vec<DescribeLogDirsPartition>> = BTreeMap::new();
        for (part, size) in names.into_iter().zip(sizes) {
            let Some(size) = size else { continue };
            topics.entry(part.topic).or_default().push(
                DescribeLogDirsPartition::default()
                    .with_partition_index(part.partition)
                    .with_partition_size(i64::try_from(size).unwrap_or(i64::MAX)),
            );
        }
        let dir = std::path::absolute(&shard.config.log_dir).unwrap_or_else(|_| shard.config.log_dir.clone());
        let mut result = DescribeLogDirsResult::default()
            .with_log_dir(str_bytes(&dir.to_string_lossy()))
            .with_topics(
                topics
                    .into_iter()
                    .map(|(name, partitions)| {
                        DescribeLogDirsTopic::default()
                            .with_name(TopicName(str_bytes(&name)))
                            .with_partitions(partitions)
                    })
                    .collect(),
            );
        if ctx.version >= 4 {
            // Unknown (-1, the field's default) if the file system cannot be asked.
            match shard.store.fs().space(shard.store.root()).await {
                Ok(space) => {
                    result.total_bytes = i64::try_from(space.total_bytes).unwrap_or(i64::MAX);
                    result.usable_bytes = i64::try_from(space.available_bytes).unwrap_or(i64::MAX);
                }
                Err(e) => tracing::warn!(error = %e, "DescribeLogDirs: cannot read the file system's space"),
            }
        }
        Reply::Now(DescribeLogDirsResponse::default().with_results(vec![result]))
    }

    fn error_codes(resp: &DescribeLogDirsResponse, out: &mut Vec<i16>) {
        out.push(resp.error_code);
        out.extend(resp.results.iter().map(|r| r.error_code));
    }
}
