//! Produce (0): validate each partition's batch (CRC, magic, size, timestamps) on the
//! connection's shard, send the valid ones to their owning shards in request order, and answer
//! once they are durable (acks=1/all) or not at all (acks=0).

use std::collections::BTreeMap;
use std::rc::Rc;

use futures::future::join_all;
use futures::FutureExt;
use kafka_protocol::messages::produce_response::{
    LeaderIdAndEpoch, NodeEndpoint, PartitionProduceResponse, TopicProduceResponse,
};
use kafka_protocol::messages::{ApiKey, BrokerId, ProduceRequest, ProduceResponse, TopicName};
use kafka_protocol::ResponseError;
use strand_protocol::batch::validate_produce_batch;
use strand_protocol::types::{ShardId, TopicId};

use super::{cluster_view, msg, str_bytes, Handler, Reply, RequestCtx};
use crate::config::{LogSettings, TimestampType};
use crate::internal_topics::refuse_client_append;
use crate::shard::ops::{PartRef, ProduceOutcome, ProducePart, ShardRequest, ShardResponse};

pub(crate) struct Produce;

/// A topic of the request: name, id, and each partition's index and slot, in request order.
type TopicLayout = (String, TopicId, Vec<(i32, Slot)>);

/// Where each partition of the request stands.
enum Slot {
    Done(ProduceOutcome),
    /// Sent to a shard: (index into that shard's answer list).
    Sent(ShardId, usize),
}

fn check_timestamps(settings: &LogSettings, base: i64, max: i64, now: i64) -> Result<(), String> {
    if settings.timestamp_type != TimestampType::CreateTime {
        return Ok(());
    }
    // Kafka checks every record; a batch's records lie between its base and max timestamps.
    if max > now.saturating_add(settings.message_timestamp_after_max_ms) {
        return Err(format!(
            "Timestamp {max} of a record is more than {} ms in the future (message.timestamp.after.max.ms)",
            settings.message_timestamp_after_max_ms
        ));
    }
    if base >= 0 && base < now.saturating_sub(settings.message_timestamp_before_max_ms) {
        return Err(format!(
            "Timestamp {base} of a record is more than {} ms in the past (message.timestamp.before.max.ms)",
            settings.message_timestamp_before_max_ms
        ));
    }
    Ok(())
}

impl Handler for Produce {
    const KEY: ApiKey = ApiKey::Produce;
    const MIN: i16 = 3;
    const MAX: i16 = 13;
    const ADVERTISED_MIN: i16 = 0;
    type Request = ProduceRequest;
    type Response = ProduceResponse;

    async fn handle(ctx: Rc<RequestCtx>, req: ProduceRequest) -> Reply<ProduceResponse> {
        let shard = ctx.shard.clone();
        let acks = req.acks;
        let md = shard.metadata();
        let now = shard.now_ms();
        let valid_acks = matches!(acks, -1..=1);
        // Topic names (or ids, v13+) and partition indexes, in request order.
        let mut layout: Vec<TopicLayout> = Vec::with_capacity(req.topic_data.len());
        let mut per_shard: BTreeMap<ShardId, Vec<ProducePart>> = BTreeMap::new();
        for topic in req.topic_data {
            let (name, meta) = if ctx.version >= 13 {
                let m = md.topic_by_id(TopicId(topic.topic_id));
                (m.map(|m| m.name.clone()).unwrap_or_default(), m)
            } else {
                let n = topic.name.0.as_str().to_owned();
                let m = md.topic(&n);
                (n, m)
            };
            let settings = meta.and_then(|m| shard.topic_settings(&m.name));
            let refused = meta.and_then(|m| refuse_client_append(&m.name));
            let mut slots = Vec::with_capacity(topic.partition_data.len());
            for p in topic.partition_data {
                let fail = |e: ResponseError, m: Option<String>| Slot::Done(ProduceOutcome::error(e, m));
                let slot = if !valid_acks {
                    fail(ResponseError::InvalidRequiredAcks, None)
                } else if req.transactional_id.is_some() {
                    fail(
                        ResponseError::TransactionalIdAuthorizationFailed,
                        Some("transactions are not supported yet".into()),
                    )
                } else {
                    match (meta, &settings) {
                        (None, _) if ctx.version >= 13 => fail(ResponseError::UnknownTopicId, None),
                        (Some(m), Some(_)) if refused.is_some() && p.index >= 0 && p.index < m.partitions => {
                            fail(ResponseError::InvalidTopicException, refused.clone())
                        }
                        (Some(m), Some(settings)) if p.index >= 0 && p.index < m.partitions => {
                            let records = p.records.unwrap_or_default();
                            match validate_produce_batch(&records, settings.max_message_bytes as usize) {
                                Err(e) => fail(e.kafka_error(), Some(e.to_string())),
                                Ok(h) if h.is_control() => fail(
                                    ResponseError::InvalidRecord,
                                    Some("clients may not produce control batches".into()),
                                ),
                                // Transactional batches need a transaction, which needs a
                                // transactional id; none can exist yet.
                                Ok(h) if h.is_transactional() => fail(
                                    ResponseError::InvalidTxnState,
                                    Some("transactional batch without an ongoing transaction".into()),
                                ),
                                Ok(h) => {
                                    match check_timestamps(settings, h.base_timestamp, h.max_timestamp, now) {
                                        Err(m) => fail(ResponseError::InvalidTimestamp, Some(m)),
                                        Ok(()) => {
                                            let owner = shard.owner(&m.name, p.index);
                                            let list = per_shard.entry(owner).or_default();
                                            list.push(ProducePart {
                                                part: PartRef {
                                                    topic: m.name.clone(),
                                                    partition: p.index,
                                                },
                                                records,
                                            });
                                            Slot::Sent(owner, list.len() - 1)
                                        }
                                    }
                                }
                            }
                        }
                        _ => fail(ResponseError::UnknownTopicOrPartition, None),
                    }
                };
                slots.push((p.index, slot));
            }
            layout.push((name, TopicId(topic.topic_id), slots));
        }

        // Send to owners in a fixed order; sends are awaited one by one so that this
        // connection's requests reach each shard in the order they arrived. Owners answer once
        // the appends are durable, with acks=0 too: nobody is told, but the request's memory
        // stays reserved until then, so a flood of acks=0 produces cannot stage more than the
        // request-memory budget ahead of the disk.
        ctx.conn.affinity.produced(per_shard.keys().copied(), acks);
        let mut pending = Vec::with_capacity(per_shard.len());
        for (owner, parts) in per_shard {
            let n = parts.len();
            let request = ShardRequest::Produce {
                parts,
                wait: true,
                acks,
                arrived: Some(ctx.arrived),
            };
            match shard.dispatch(owner, request).await {
                Ok(fut) => pending.push((owner, n, Some(fut))),
                Err(_) => pending.push((owner, n, None)),
            }
        }
        if acks == 0 {
            // Kafka sends no response to acks=0; appends are staged already.
            let appended = join_all(pending.into_iter().filter_map(|(_, _, fut)| fut));
            return Reply::None(appended.map(drop).boxed_local());
        }
        let version = ctx.version;
        let ctx = ctx.clone();
        Reply::Later(
            async move {
                let mut answers: BTreeMap<ShardId, Vec<ProduceOutcome>> = BTreeMap::new();
                let futs = pending.into_iter().map(|(owner, n, fut)| async move {
                    let out = match fut {
                        Some(f) => match f.await {
                            Ok(ShardResponse::Produce(v)) if v.len() == n => v,
                            _ => vec![ProduceOutcome::error(ResponseError::UnknownServerError, None); n],
                        },
                        None => vec![ProduceOutcome::error(ResponseError::UnknownServerError, None); n],
                    };
                    (owner, out)
                });
                for (owner, out) in join_all(futs).await {
                    answers.insert(owner, out);
                }
                let mut leaders = Vec::new();
                let responses = layout
                    .into_iter()
                    .map(|(name, id, slots)| {
                        let partitions = slots
                            .into_iter()
                            .map(|(index, slot)| {
                                let o = match slot {
                                    Slot::Done(o) => o,
                                    Slot::Sent(owner, i) => {
                                        answers.get(&owner).and_then(|v| v.get(i)).cloned().unwrap_or(
                                            ProduceOutcome::error(ResponseError::UnknownServerError, None),
                                        )
                                    }
                                };
                                if let Some((leader, _)) = o.current_leader {
                                    leaders.push(leader);
                                }
                                if o.cut_off {
                                    ctx.conn.hang_up();
                                }
                                let mut current = LeaderIdAndEpoch::default();
                                if version >= 10 {
                                    if let Some((leader, epoch)) = o.current_leader {
                                        current =
                                            current.with_leader_id(BrokerId(leader)).with_leader_epoch(epoch);
                                    }
                                }
                                PartitionProduceResponse::default()
                                    .with_current_leader(current)
                                    .with_index(index)
                                    .with_error_code(o.error)
                                    .with_error_message(if version >= 8 {
                                        o.message.and_then(msg)
                                    } else {
                                        None
                                    })
                                    .with_base_offset(o.base_offset)
                                    .with_log_append_time_ms(o.log_append_time_ms)
                                    .with_log_start_offset(if version >= 5 { o.log_start_offset } else { -1 })
                            })
                            .collect();
                        let mut t = TopicProduceResponse::default().with_partition_responses(partitions);
                        if version >= 13 {
                            t.topic_id = id.0;
                        } else {
                            t.name = TopicName(str_bytes(&name));
                        }
                        t
                    })
                    .collect();
                let mut resp = ProduceResponse::default().with_responses(responses);
                if version >= 10 {
                    resp.node_endpoints = cluster_view::leader_endpoints(&ctx, leaders)
                        .into_iter()
                        .map(|e| {
                            NodeEndpoint::default()
                                .with_node_id(BrokerId(e.node))
                                .with_host(str_bytes(&e.host))
                                .with_port(i32::from(e.port))
                                .with_rack(e.rack.as_deref().map(str_bytes))
                        })
                        .collect();
                }
                resp
            }
            .boxed_local(),
        )
    }

    fn error_codes(resp: &ProduceResponse, out: &mut Vec<i16>) {
        for t in &resp.responses {
            for p in &t.partition_responses {
                out.push(p.error_code);
            }
        }
    }
}
