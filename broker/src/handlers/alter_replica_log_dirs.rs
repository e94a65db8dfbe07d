//! AlterReplicaLogDirs (34): moves replicas between the broker's log directories. A node has
//! one log directory (`log.dirs`), so, as Kafka with one directory: a replica asked to stay
//! where it is succeeds (nothing moves), another directory is LOG_DIR_NOT_FOUND, and a
//! partition this node holds no replica of is REPLICA_NOT_AVAILABLE.

use std::path::{Component, Path, PathBuf};
use std::rc::Rc;

use kafka_protocol::messages::alter_replica_log_dirs_response::{
    AlterReplicaLogDirPartitionResult, AlterReplicaLogDirTopicResult,
};
use kafka_protocol::messages::{AlterReplicaLogDirsRequest, AlterReplicaLogDirsResponse, ApiKey};
use kafka_protocol::ResponseError;

use super::{Handler, Reply, RequestCtx};
use crate::shard::ops::{PartRef, ShardRequest, ShardResponse};

pub(crate) struct AlterReplicaLogDirs;

/// `path` made absolute, with `.` and `..` and trailing separators resolved without touching
/// the file system.
fn normal(path: &Path) -> PathBuf {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut out = PathBuf::new();
    for c in absolute.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

impl Handler for AlterReplicaLogDirs {
    const KEY: ApiKey = ApiKey::AlterReplicaLogDirs;
    const MIN: i16 = 1;
    const MAX: i16 = 2;
    type Request = AlterReplicaLogDirsRequest;
    type Response = AlterReplicaLogDirsResponse;

    async fn handle(
        ctx: Rc<RequestCtx>,
        req: AlterReplicaLogDirsRequest,
    ) -> Reply<AlterReplicaLogDirsResponse> {
        let ours = normal(&ctx.shard.config.log_dir);
        // Each partition with whether its destination is this node's directory.
        let mut asked: Vec<(PartRef, bool)> = Vec::new();
        for dir in &req.dirs {
            let here = normal(Path::new(dir.path.as_str())) == ours;
            for t in &dir.topics {
                for p in &t.partitions {
                    asked.push((
                        PartRef {
                            topic: t.name.0.to_string(),
                            partition: *p,
                        },
                        here,
                    ));
                }
            }
        }
        let hosted = crate::shard::scatter(
            &ctx.shard,
            asked.iter().map(|(p, _)| (p.clone(), ())).collect(),
            |list| ShardRequest::LogSizes(list.into_iter().map(|(p, ())| p).collect()),
            |r| match r {
                ShardResponse::LogSizes(v) => Some(v),
                _ => None,
            },
            None,
        )
        .await;
        let mut resp = AlterReplicaLogDirsResponse::default();
        for ((part, here), size) in asked.into_iter().zip(hosted) {
            let code = if !here {
                ResponseError::LogDirNotFound.code()
            } else if size.is_none() {
                ResponseError::ReplicaNotAvailable.code()
            } else {
                0
            };
            let result = AlterReplicaLogDirPartitionResult::default()
                .with_partition_index(part.partition)
                .with_error_code(code);
            match resp
                .results
                .iter_mut()
                .find(|t| t.topic_name.0.as_str() == part.topic)
            {
                Some(t) => t.partitions.push(result),
                None => resp.results.push(
                    AlterReplicaLogDirTopicResult::default()
                        .with_topic_name(kafka_protocol::messages::TopicName(super::str_bytes(&part.topic)))
                        .with_partitions(vec![result]),
                ),
            }
        }
        Reply::Now(resp)
    }

    fn error_codes(resp: &AlterReplicaLogDirsResponse, out: &mut Vec<i16>) {
        for t in &resp.results {
            out.extend(t.partitions.iter().map(|p| p.error_code));
        }
    }
}
