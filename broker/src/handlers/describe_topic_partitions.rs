//! DescribeTopicPartitions (75, KIP-966): what Metadata says of topics, in pages: at most
//! `max.request.partition.size.limit` partitions (or the client's smaller limit) per answer,
//! and a cursor naming the topic and partition the next page starts at.
//!
//! As Kafka's handler: the topics are taken in name order, from the cursor's topic on; no
//! topics named means every topic (the unknown ones are then not reported); a cursor naming a
//! topic the request does not list is INVALID_REQUEST. A page that ends inside a topic sets
//! the cursor to its next partition; one that ends after a topic with more topics left sets it
//! to the next topic's partition 0. Leaders, epochs, replicas and ISR are Metadata's
//! ([`super::metadata`], [`super::cluster_view`]); there are no eligible leader replicas
//! (KIP-966's ELR is not kept), so those lists are empty.

use std::rc::Rc;

use kafka_protocol::messages::describe_topic_partitions_response::{
    Cursor, DescribeTopicPartitionsResponsePartition, DescribeTopicPartitionsResponseTopic,
};
use kafka_protocol::messages::metadata_response::MetadataResponseTopic;
use kafka_protocol::messages::{
    ApiKey, DescribeTopicPartitionsRequest, DescribeTopicPartitionsResponse, TopicName,
};
use kafka_protocol::ResponseError;
use strand_protocol::acl;
use strand_protocol::types::validate_topic_name;

use super::{cluster_view, str_bytes, Handler, Reply, RequestCtx};

pub(crate) struct DescribeTopicPartitions;

/// The Metadata version whose topic description this answer converts (ids, epochs, offline
/// replicas).
const METADATA_VERSION: i16 = 12;

impl Handler for DescribeTopicPartitions {
    const KEY: ApiKey = ApiKey::DescribeTopicPartitions;
    const MIN: i16 = 0;
    const MAX: i16 = 0;
    type Request = DescribeTopicPartitionsRequest;
    type Response = DescribeTopicPartitionsResponse;

    async fn handle(
        ctx: Rc<RequestCtx>,
        req: DescribeTopicPartitionsRequest,
    ) -> Reply<DescribeTopicPartitionsResponse> {
        let shard = &ctx.shard;
        let all = req.topics.is_empty();
        let requested: Vec<String> = req.topics.iter().map(|t| t.name.0.to_string()).collect();
        let cursor = req
            .cursor
            .as_ref()
            .map(|c| (c.topic_name.0.to_string(), c.partition_index));
        if let Some((topic, _)) = &cursor {
            if !all && !requested.contains(topic) {
                let mut resp = DescribeTopicPartitionsResponse::default();
                resp.topics = requested
                    .iter()
                    .map(|n| topic_error(n, ResponseError::InvalidRequest))
                    .collect();
                return Reply::Now(resp);
            }
        }
        let limit = usize::try_from(req.response_partition_limit)
            .unwrap_or(0)
            .min(shard.config.max_request_partition_size_limit)
            .max(1);
        let resp = if shard.config.cluster.is_standalone() {
            let md = shard.metadata();
            let node = shard.config.node_id.0;
            let names = if all {
                md.topics().map(|t| t.name.clone()).collect()
            } else {
                requested
            };
            page(names, cursor, limit, all, |name| {
                md.topic(name)
                    .map(|t| super::metadata::describe_topic(t, node, METADATA_VERSION))
                    .ok_or(ResponseError::UnknownTopicOrPartition)
            })
        } else {
            let state = shard.cluster_state().unwrap_or_default();
            let newer = cluster_view::newer_leaders(&ctx);
            let live = state.live_brokers().any(|b| b.id == shard.config.node_id);
            let names = if all {
                state.topics().map(|t| t.name.clone()).collect()
            } else {
                requested
            };
            page(names, cursor, limit, all, |name| {
                match state.topic_by_name(name) {
                    Some(t) => Ok(cluster_view::describe_topic(&state, t, METADATA_VERSION, &newer)),
                    // Its view may be behind (see Metadata): retriable.
                    None if !live => Err(ResponseError::LeaderNotAvailable),
                    None => Err(ResponseError::UnknownTopicOrPartition),
                }
            })
        };
        Reply::Now(resp)
    }

    fn error_codes(resp: &DescribeTopicPartitionsResponse, out: &mut Vec<i16>) {
        for t in &resp.topics {
            out.push(t.error_code);
            out.extend(t.partitions.iter().map(|p| p.error_code));
        }
    }
}

fn topic_error(name: &str, code: ResponseError) -> DescribeTopicPartitionsResponseTopic {
    let code = if code == ResponseError::UnknownTopicOrPartition && validate_topic_name(name).is_err() {
        ResponseError::InvalidTopicException
    } else {
        code
    };
    DescribeTopicPartitionsResponseTopic::default()
        .with_error_code(code.code())
        .with_name(Some(TopicName(str_bytes(name))))
        .with_is_internal(crate::internal_topics::is_internal(name))
        .with_topic_authorized_operations(acl::TOPIC_OPERATIONS)
}

/// One page of the answer: `names` in order from the cursor on, at most `limit` partitions;
/// `describe` gives a topic as Metadata does, or why it cannot. With `all`, topics that cannot
/// be described are left out.
fn page(
    mut names: Vec<String>,
    cursor: Option<(String, i32)>,
    limit: usize,
    all: bool,
    describe: impl Fn(&str) -> Result<MetadataResponseTopic, ResponseError>,
) -> DescribeTopicPartitionsResponse {
    names.sort_unstable();
    names.dedup();
    if let Some((from, _)) = &cursor {
        names.retain(|n| n >= from);
    }
    let mut resp = DescribeTopicPartitionsResponse::default();
    let mut remaining = limit;
    for name in names {
        if remaining == 0 {
            resp.next_cursor = Some(Cursor::default().with_topic_name(TopicName(str_bytes(&name))));
            break;
        }
        let topic = match describe(&name) {
            Ok(t) => t,
            Err(_) if all => continue,
            Err(code) => {
                resp.topics.push(topic_error(&name, code));
                continue;
            }
        };
        let start = match &cursor {
            Some((from, partition)) if *from == name => *partition,
            _ => 0,
        };
        let mut partitions: Vec<_> = topic
            .partitions
            .into_iter()
            .filter(|p| p.partition_index >= start)
            .collect();
        partitions.sort_unstable_by_key(|p| p.partition_index);
        let next = partitions.get(remaining).map(|p| p.partition_index);
        partitions.truncate(remaining);
        remaining -= partitions.len();
        resp.topics.push(
            DescribeTopicPartitionsResponseTopic::default()
                .with_name(topic.name)
                .with_topic_id(topic.topic_id)
                .with_is_internal(topic.is_internal)
                .with_topic_authorized_operations(acl::TOPIC_OPERATIONS)
                .with_partitions(
                    partitions
                        .into_iter()
                        .map(|p| {
                            DescribeTopicPartitionsResponsePartition::default()
                                .with_error_code(p.error_code)
                                .with_partition_index(p.partition_index)
                                .with_leader_id(p.leader_id)
                                .with_leader_epoch(p.leader_epoch)
                                .with_replica_nodes(p.replica_nodes)
                                .with_isr_nodes(p.isr_nodes)
                                .with_eligible_leader_replicas(Some(Vec::new()))
                                .with_last_known_elr(Some(Vec::new()))
                                .with_offline_replicas(p.offline_replicas)
                        })
                        .collect(),
                ),
        );
        if let Some(partition) = next {
            resp.next_cursor = Some(
                Cursor::default()
                    .with_topic_name(TopicName(str_bytes(&name)))
                    .with_partition_index(partition),
            );
            break;
        }
    }
    resp
}

#[cfg(test)]
mod tests {
    use kafka_protocol::messages::metadata_response::MetadataResponsePartition;

    use super::*;

    fn topics(name: &str) -> Result<MetadataResponseTopic, ResponseError> {
        let count = match name {
            "a" => 3,
            "b" => 2,
            "c" => 1,
            _ => return Err(ResponseError::UnknownTopicOrPartition),
        };
        Ok(MetadataResponseTopic::default()
            .with_name(Some(TopicName(str_bytes(name))))
            .with_partitions(
                (0..count)
                    .map(|p| MetadataResponsePartition::default().with_partition_index(p))
                    .collect(),
            ))
    }

    /// (topic, partitions, error) per topic, and the next cursor.
    type Summary = (Vec<(String, Vec<i32>, i16)>, Option<(String, i32)>);

    fn summary(r: &DescribeTopicPartitionsResponse) -> Summary {
        (
            r.topics
                .iter()
                .map(|t| {
                    (
                        t.name.as_ref().unwrap().0.to_string(),
                        t.partitions.iter().map(|p| p.partition_index).collect(),
                        t.error_code,
                    )
                })
                .collect(),
            r.next_cursor
                .as_ref()
                .map(|c| (c.topic_name.0.to_string(), c.partition_index)),
        )
    }

    fn names(n: &[&str]) -> Vec<String> {
        n.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn pages_cut_inside_a_topic_and_resume_at_the_cursor() {
        let all = names(&["c", "a", "b"]);
        let first = page(all.clone(), None, 2, true, topics);
        assert_eq!(
            summary(&first),
            (vec![("a".into(), vec![0, 1], 0)], Some(("a".into(), 2)))
        );
        let second = page(all.clone(), Some(("a".into(), 2)), 2, true, topics);
        assert_eq!(
            summary(&second),
            (
                vec![("a".into(), vec![2], 0), ("b".into(), vec![0], 0)],
                Some(("b".into(), 1))
            )
        );
        let third = page(all, Some(("b".into(), 1)), 2, true, topics);
        assert_eq!(
            summary(&third),
            (vec![("b".into(), vec![1], 0), ("c".into(), vec![0], 0)], None)
        );
    }

    #[test]
    fn a_page_full_at_a_topics_end_points_at_the_next_topic() {
        let first = page(names(&["a", "b"]), None, 3, false, topics);
        assert_eq!(
            summary(&first),
            (vec![("a".into(), vec![0, 1, 2], 0)], Some(("b".into(), 0)))
        );
        // Nothing after the last topic: no cursor.
        let last = page(names(&["b"]), None, 2, false, topics);
        assert_eq!(summary(&last), (vec![("b".into(), vec![0, 1], 0)], None));
    }

    #[test]
    fn unknown_topics_are_reported_when_named_and_skipped_when_listing_all() {
        let unknown = ResponseError::UnknownTopicOrPartition.code();
        let named = page(names(&["zz", "c", "bad/name"]), None, 10, false, topics);
        assert_eq!(
            summary(&named),
            (
                vec![
                    (
                        "bad/name".into(),
                        vec![],
                        ResponseError::InvalidTopicException.code()
                    ),
                    ("c".into(), vec![0], 0),
                    ("zz".into(), vec![], unknown)
                ],
                None
            )
        );
        let listed = page(names(&["zz", "c"]), None, 10, true, topics);
        assert_eq!(summary(&listed), (vec![("c".into(), vec![0], 0)], None));
    }
}
