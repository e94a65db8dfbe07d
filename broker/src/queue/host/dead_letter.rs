//! Dead letters: a message the engine gives up on is appended, with its failure context, to
//! the queue's dead-letter topic (a Produce to its owner shard; in a cluster, to its leader,
//! through another node if it leads), then reported back.

use super::ops::{QueueAnswer, QueueOp};
use super::read::read_offsets;
use super::route::{forward, route, Route};
use super::Engine;
use super::QueueHost;
use crate::metadata::TopicMeta;
use crate::queue::engine::dead_letter::HEADER_DEDUP_TOKEN;
use crate::queue::engine::dead_letter::HEADER_DELIVER_AT;
use crate::queue::engine::DeadLetterRequest;
use crate::shard::ops::PartRef;
use crate::shard::ops::ProducePart;
use crate::shard::ops::ShardRequest;
use crate::shard::ops::ShardResponse;
use crate::shard::Shard;
use bytes::Bytes;
use std::rc::Rc;

/// Dead-letters one message: reads it, appends it with its failure context to the queue's
/// dead-letter topic, then tells the engine (or that it failed, to retry later).
pub(super) async fn dead_letter(host: Rc<QueueHost>, engine: Rc<Engine>, req: DeadLetterRequest) {
    let shard = &host.core;
    let result = dead_letter_append(shard, &engine, &req).await;
    let now = shard.now_ms();
    match result {
        Ok(()) => engine.q.borrow_mut().dead_letter_appended(req.offset, now),
        Err(e) => {
            tracing::warn!(topic = %engine.key.topic, partition = engine.key.partition, offset = req.offset.0, error = %e, "dead-letter append failed; will retry");
            engine.q.borrow_mut().dead_letter_failed(req.offset, now);
        }
    }
    if !engine.closed.get() {
        host.drain(&engine);
    }
}

pub(super) async fn dead_letter_append(
    shard: &Rc<Shard>,
    engine: &Engine,
    req: &DeadLetterRequest,
) -> Result<(), String> {
    let md = shard.metadata();
    let source = md
        .topic(&engine.key.topic)
        .ok_or_else(|| "the queue was deleted".to_string())?;
    let share_dlq = engine
        .share
        .borrow()
        .as_ref()
        .and_then(|s| s.dead_letter_topic.clone());
    let dlq_name =
        share_dlq.unwrap_or_else(|| source.config.queue_settings().dead_letter_topic_of(&source.name));
    // Stored before dead-letter targets were checked, or a share group's setting: the message
    // waits (retried) until the setting names a topic clients may produce to.
    if let Some(m) = crate::internal_topics::refuse_dead_letter_target(&dlq_name) {
        return Err(m);
    }
    let dlq = match md.topic(&dlq_name) {
        Some(t) => t.clone(),
        None => create_dead_letter_topic(shard, &dlq_name, source.partitions).await?,
    };
    let records = read_offsets(shard, engine.log, &[req.offset.0]).await;
    let record = records.get(&req.offset.0);
    let context = req.context_headers(&source.name, source.id);
    let mut headers: Vec<(String, Bytes)> = record
        .map(|r| {
            r.headers
                .iter()
                .filter_map(|(k, v)| {
                    let k = std::str::from_utf8(k).ok()?;
                    // Publish bookkeeping stays behind; context headers are replaced.
                    if k == HEADER_DELIVER_AT
                        || k == HEADER_DEDUP_TOKEN
                        || context.iter().any(|(c, _)| *c == k)
                    {
                        return None;
                    }
                    Some((k.to_owned(), v.clone().unwrap_or_default()))
                })
                .collect()
        })
        .unwrap_or_default();
    headers.extend(context.into_iter().map(|(k, v)| (k.to_owned(), Bytes::from(v))));
    let key = record.and_then(|r| r.key.clone());
    let value = record.and_then(|r| r.value.clone());
    let header_refs: Vec<(&str, Option<&[u8]>)> =
        headers.iter().map(|(k, v)| (k.as_str(), Some(&v[..]))).collect();
    let rec = strand_protocol::batch::build::TestRecord {
        key: key.as_deref(),
        value: value.as_deref(),
        headers: header_refs,
        timestamp_delta: 0,
    };
    let batch = strand_protocol::batch::build::batch(&[rec], shard.now_ms());
    let partition = req.partition.0.rem_euclid(dlq.partitions.max(1));
    let batch = Bytes::from(batch);
    match route(shard, &dlq.name, partition) {
        Route::Shard(_) => append_here(shard, &dlq.name, partition, batch).await,
        Route::Node(node, target) => {
            let op = QueueOp::AppendDeadLetter {
                topic: dlq.name.clone(),
                partition,
                batch,
            };
            match forward(shard, node, target, op).await {
                Ok(QueueAnswer::Appended(r)) => r.map_err(|e| e.to_string()),
                Ok(_) => Err("unexpected answer".into()),
                Err(e) => Err(e.to_string()),
            }
        }
        Route::Leaderless => Err(format!("{dlq_name}-{partition} has no leader")),
    }
}

/// Appends a dead letter (`batch`, built here) to `topic`-`partition` through the produce path
/// of this node (acks=all): its leader in a cluster.
pub(super) async fn append_here(
    shard: &Rc<Shard>,
    topic: &str,
    partition: i32,
    batch: Bytes,
) -> Result<(), String> {
    let part = PartRef {
        topic: topic.to_owned(),
        partition,
    };
    let owner = shard.owner(&part.topic, part.partition);
    let call = shard
        .dispatch(
            owner,
            ShardRequest::Produce {
                parts: vec![ProducePart { part, records: batch }],
                wait: true,
                acks: -1,
                arrived: None,
            },
        )
        .await
        .map_err(|e| e.to_string())?;
    match call.await.map_err(|e| e.to_string())? {
        ShardResponse::Produce(outcomes) => match outcomes.first() {
            Some(o) if o.error == 0 => Ok(()),
            Some(o) => Err(format!(
                "dead-letter topic {topic} refused the append (error {}: {})",
                o.error,
                o.message.clone().unwrap_or_default()
            )),
            None => Err("no produce answer".into()),
        },
        _ => Err("unexpected answer".into()),
    }
}

/// Creates a dead-letter topic with the source queue's partition count.
pub(crate) async fn create_dead_letter_topic(
    shard: &Rc<Shard>,
    name: &str,
    partitions: i32,
) -> Result<TopicMeta, String> {
    let reply = crate::topic_admin::call(
        shard,
        crate::controller::ControllerOp::CreateTopics {
            topics: vec![crate::metadata::NewTopic {
                name: name.to_owned(),
                num_partitions: partitions.max(1),
                replication_factor: -1,
                assignments: vec![],
                configs: vec![],
            }],
            validate_only: false,
        },
    )
    .await;
    let md = shard.metadata();
    if let Some(t) = md.topic(name) {
        return Ok(t.clone());
    }
    match reply.results.first() {
        Some(r) => match (&r.topic, &r.error) {
            (Some(t), _) => Ok(t.clone()),
            (None, Some(e)) if e.code == kafka_protocol::ResponseError::TopicAlreadyExists => shard
                .metadata()
                .topic(name)
                .cloned()
                .ok_or_else(|| e.message.clone()),
            (None, Some(e)) => Err(format!("cannot create dead-letter topic {name}: {}", e.message)),
            (None, None) => Err(format!("cannot create dead-letter topic {name}")),
        },
        None => Err(format!("cannot create dead-letter topic {name}: no controller")),
    }
}
