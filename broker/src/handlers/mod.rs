//! One module per Kafka API. Each handler declares the versions it serves (`MIN`/`MAX`, checked
//! against the schema's range by a `const` assertion in `run`); the registry at the bottom of
//! this file builds both request dispatch and the ApiVersions answer from the same list, so they
//! cannot disagree. Handlers stay thin: decode (done here), call the domain (shards,
//! controller, storage), encode (done here). The request paths several handlers share are
//! here too: [`per_partition`] (a per-partition operation on the owning shards) and
//! [`to_coordinator`] (a group request forwarded to its coordinator shard).

mod alter_configs;
mod alter_replica_log_dirs;
mod alter_share_group_offsets;
mod api_versions;
mod cluster_view;
pub(crate) mod conn_info;
mod consumer_group_describe;
mod consumer_group_heartbeat;
mod create_partitions;
mod create_topics;
mod delete_groups;
mod delete_records;
mod delete_share_group_offsets;
mod delete_topics;
mod describe_cluster;
mod describe_configs;
mod describe_groups;
mod describe_log_dirs;
mod describe_quorum;
mod describe_share_group_offsets;
mod describe_topic_partitions;
mod fetch;
mod find_coordinator;
mod heartbeat;
mod init_producer_id;
mod join_group;
mod leave_group;
mod list_config_resources;
mod list_groups;
mod list_offsets;
mod list_partition_reassignments;
mod metadata;
mod offset_commit;
mod offset_delete;
mod offset_fetch;
mod offset_for_leader_epoch;
mod produce;
mod share_acknowledge;
mod share_fetch;
mod share_group_describe;
mod share_group_heartbeat;
mod sync_group;

use std::future::Future;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use futures::future::LocalBoxFuture;
use futures::FutureExt;
use kafka_protocol::messages::ApiKey;
use kafka_protocol::protocol::{Decodable, Encodable, Message};
use strand_protocol::fetch_frame::Piece;
use strand_protocol::header::{decode_body, encode_response, EncodeError};
use strand_storage::FileRegion;

use crate::group::ForCoordinator;
use crate::shard::{AdvertisedListener, Shard};

/// Everything a handler knows about its request.
pub(crate) struct RequestCtx {
    /// The shard core of the connection's shard.
    pub(crate) shard: Rc<Shard>,
    /// Its subsystems.
    pub(crate) subsystems: Rc<crate::subsystems::Subsystems>,
    pub(crate) conn: Rc<conn_info::ConnInfo>,
    pub(crate) api: ApiKey,
    pub(crate) version: i16,
    pub(crate) correlation_id: i32,
    pub(crate) client_id: Option<String>,
    /// When the request's frame had been read.
    pub(crate) arrived: Instant,
}

impl RequestCtx {
    /// What the group coordinator knows of the request beyond its body.
    pub(crate) fn group_meta(&self) -> crate::group::RequestMeta {
        crate::group::RequestMeta {
            version: self.version,
            client_id: self.client_id.clone().unwrap_or_default(),
            client_host: self.conn.peer.map(|p| format!("/{}", p.ip())).unwrap_or_default(),
        }
    }

    /// The address this connection's listener advertises.
    pub(crate) fn advertised(&self) -> AdvertisedListener {
        self.shard
            .listeners
            .get(self.conn.listener)
            .or_else(|| self.shard.listeners.first())
            .cloned()
            .unwrap_or(AdvertisedListener {
                host: "localhost".into(),
                port: 9092,
            })
    }
}

/// What a handler gives back.
pub(crate) enum Reply<R> {
    /// The response, complete.
    Now(R),
    /// The response, once this future completes (runs concurrently with later requests).
    Later(LocalBoxFuture<'static, R>),
    /// No response at all (Produce with acks=0), once this future completes: the request's
    /// memory stays reserved until then.
    None(LocalBoxFuture<'static, ()>),
}

/// A Kafka API handler.
pub(crate) trait Handler {
    const KEY: ApiKey;
    /// Versions decoded and answered.
    const MIN: i16;
    const MAX: i16;
    /// Lowest version listed in ApiVersions. Produce lists 0 although it serves 3+ because
    /// librdkafka needs it (KAFKA-18659); Kafka 4 does the same.
    const ADVERTISED_MIN: i16 = Self::MIN;
    type Request: Decodable + Message + 'static;
    type Response: Encodable + Message + 'static;

    /// Handles a decoded request. Work that must follow request order on the connection (appends)
    /// happens before the returned future first yields to a later request's.
    fn handle(ctx: Rc<RequestCtx>, req: Self::Request) -> impl Future<Output = Reply<Self::Response>>;

    /// The error codes in a response (top level and per partition), for metrics.
    fn error_codes(resp: &Self::Response, out: &mut Vec<i16>);

    /// Encodes the response frame, as segments to be written one after the other.
    fn encode(correlation_id: i32, version: i16, resp: Self::Response) -> Result<Frame, EncodeError> {
        encode_response(correlation_id, Self::KEY, version, &resp).map(|b| vec![Piece::Bytes(b)])
    }
}

/// An encoded response frame: pieces written in order, one after the other; a Fetch answer's
/// records may be a region of a segment file the connection sends as it is.
pub(crate) type Frame = Vec<Piece<Arc<FileRegion>>>;

/// The outcome of dispatching one request.
pub(crate) enum Dispatched {
    /// The encoded response frame, once ready (`None`: encoding failed; close).
    Response(LocalBoxFuture<'static, Option<Frame>>),
    /// Nothing to send, once this future completes (the request's memory stays reserved until
    /// then).
    NoResponse(LocalBoxFuture<'static, ()>),
    /// Close the connection, as Kafka does for requests it cannot parse.
    Close(&'static str),
}

async fn run<H: Handler>(ctx: Rc<RequestCtx>, body: Bytes) -> Dispatched {
    const {
        assert!(
            H::MIN >= <H::Request as Message>::VERSIONS.min
                && H::MAX <= <H::Request as Message>::VERSIONS.max
        );
        assert!(H::ADVERTISED_MIN <= H::MIN && H::MIN <= H::MAX);
    }
    if ctx.version < H::MIN || ctx.version > H::MAX {
        tracing::warn!(api = ?H::KEY, version = ctx.version, client = ?ctx.client_id, "unsupported request version; closing the connection");
        return Dispatched::Close("unsupported version");
    }
    let req: H::Request = match decode_body(body, H::KEY, ctx.version) {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(error = %e, peer = ?ctx.conn.peer, client = ?ctx.client_id, "malformed request; closing the connection");
            return Dispatched::Close("malformed request");
        }
    };
    ctx.shard.metrics.request(H::KEY as i16, ctx.version);
    let started = Instant::now();
    let reply = H::handle(ctx.clone(), req).await;
    let finish = move |resp: H::Response| -> Option<Frame> {
        let mut codes = Vec::new();
        H::error_codes(&resp, &mut codes);
        for c in codes {
            ctx.shard.metrics.error(H::KEY as i16, ctx.version, c);
        }
        ctx.shard
            .metrics
            .duration(H::KEY as i16, started.elapsed().as_secs_f64());
        match H::encode(ctx.correlation_id, ctx.version, resp) {
            Ok(b) => Some(b),
            Err(e) => {
                tracing::error!(api = ?H::KEY, version = ctx.version, error = %e, "cannot encode response");
                None
            }
        }
    };
    match reply {
        Reply::Now(resp) => {
            let out = finish(resp);
            Dispatched::Response(async move { out }.boxed_local())
        }
        Reply::Later(fut) => Dispatched::Response(async move { finish(fut.await) }.boxed_local()),
        Reply::None(work) => Dispatched::NoResponse(work),
    }
}

macro_rules! registry {
    ($($handler:ty),* $(,)?) => {
        /// `(api key, advertised min, max)` of every served API, for ApiVersions.
        pub(crate) const SUPPORTED: &[(i16, i16, i16)] = &[
            $((<$handler as Handler>::KEY as i16, <$handler as Handler>::ADVERTISED_MIN, <$handler as Handler>::MAX)),*
        ];

        /// Runs the handler of `ctx.api`; an API without a handler closes the connection.
        pub(crate) async fn dispatch(ctx: Rc<RequestCtx>, body: Bytes) -> Dispatched {
            $(
                if ctx.api == <$handler as Handler>::KEY {
                    return run::<$handler>(ctx, body).await;
                }
            )*
            Dispatched::Close("unsupported api")
        }
    };
}

registry![
    produce::Produce,
    fetch::Fetch,
    list_offsets::ListOffsets,
    metadata::Metadata,
    offset_for_leader_epoch::OffsetForLeaderEpoch,
    api_versions::ApiVersions,
    create_topics::CreateTopics,
    delete_topics::DeleteTopics,
    delete_records::DeleteRecords,
    describe_configs::DescribeConfigs,
    create_partitions::CreatePartitions,
    describe_cluster::DescribeCluster,
    describe_topic_partitions::DescribeTopicPartitions,
    describe_log_dirs::DescribeLogDirs,
    alter_replica_log_dirs::AlterReplicaLogDirs,
    describe_quorum::DescribeQuorum,
    list_partition_reassignments::ListPartitionReassignments,
    list_config_resources::ListConfigResources,
    alter_configs::IncrementalAlterConfigs,
    alter_configs::AlterConfigs,
    find_coordinator::FindCoordinator,
    init_producer_id::InitProducerId,
    join_group::JoinGroup,
    sync_group::SyncGroup,
    heartbeat::Heartbeat,
    leave_group::LeaveGroup,
    offset_commit::OffsetCommit,
    offset_fetch::OffsetFetch,
    offset_delete::OffsetDelete,
    list_groups::ListGroups,
    describe_groups::DescribeGroups,
    delete_groups::DeleteGroups,
    consumer_group_heartbeat::ConsumerGroupHeartbeat,
    consumer_group_describe::ConsumerGroupDescribe,
    share_group_heartbeat::ShareGroupHeartbeat,
    share_group_describe::ShareGroupDescribe,
    share_fetch::ShareFetch,
    share_acknowledge::ShareAcknowledge,
    describe_share_group_offsets::DescribeShareGroupOffsets,
    delete_share_group_offsets::DeleteShareGroupOffsets,
    alter_share_group_offsets::AlterShareGroupOffsets,
];

/// The ApiVersions answer for a request with a version this broker does not know: v0 format,
/// UNSUPPORTED_VERSION, and the supported APIs, so the client can pick a version (KIP-511).
pub(crate) fn api_versions_fallback(correlation_id: i32) -> Option<Frame> {
    api_versions::fallback(correlation_id).map(|b| vec![Piece::Bytes(b)])
}

/// The highest ApiVersions version served.
pub(crate) const API_VERSIONS_MAX: i16 = <api_versions::ApiVersions as Handler>::MAX;

/// Runs a per-partition operation for the partitions a request names, topic by topic, and
/// answers in the same shape: partitions of unknown topics (or out of range) get `unknown`;
/// the others go to their owning shards in parallel (`make` builds one shard's request, `take`
/// extracts its answers), and an owner that does not answer yields `fallback`.
pub(crate) async fn per_partition<T, R: Clone>(
    ctx: &RequestCtx,
    requested: Vec<(&str, Vec<(i32, T)>)>,
    unknown: R,
    make: impl Fn(Vec<(crate::shard::ops::PartRef, T)>) -> crate::shard::ops::ShardRequest,
    take: impl Fn(crate::shard::ops::ShardResponse) -> Option<Vec<R>>,
    fallback: R,
) -> Vec<Vec<R>> {
    let md = ctx.shard.metadata();
    let mut known = Vec::new();
    let mut slots: Vec<Vec<Option<usize>>> = Vec::with_capacity(requested.len());
    for (topic, partitions) in requested {
        let meta = md.topic(topic);
        let mut topic_slots = Vec::with_capacity(partitions.len());
        for (partition, t) in partitions {
            match meta {
                Some(m) if partition >= 0 && partition < m.partitions => {
                    topic_slots.push(Some(known.len()));
                    known.push((
                        crate::shard::ops::PartRef {
                            topic: m.name.clone(),
                            partition,
                        },
                        t,
                    ));
                }
                _ => topic_slots.push(None),
            }
        }
        slots.push(topic_slots);
    }
    let answers = crate::shard::scatter(&ctx.shard, known, make, take, fallback.clone()).await;
    slots
        .into_iter()
        .map(|topic_slots| {
            topic_slots
                .into_iter()
                .map(|slot| match slot {
                    Some(i) => answers.get(i).cloned().unwrap_or_else(|| fallback.clone()),
                    None => unknown.clone(),
                })
                .collect()
        })
        .collect()
}

/// Forwards a request to the coordinator of the group it names; `unavailable` is the answer
/// when none comes. Sending happens now, in request order; the answer may come later (a
/// JoinGroup's when its rebalance completes).
pub(crate) async fn to_coordinator<R: ForCoordinator>(
    ctx: &RequestCtx,
    req: R,
    unavailable: R::Response,
) -> Reply<R::Response>
where
    R::Response: 'static,
{
    let group = req.group_id().to_owned();
    let answer =
        crate::group::route::forward(&ctx.shard, ctx.group_meta(), &group, req.into_group_request()).await;
    Reply::Later(
        async move {
            answer
                .await
                .and_then(R::from_group_response)
                .unwrap_or(unavailable)
        }
        .boxed_local(),
    )
}

/// Wraps an error message for responses.
pub(crate) fn msg(s: impl Into<String>) -> Option<kafka_protocol::protocol::StrBytes> {
    Some(kafka_protocol::protocol::StrBytes::from_string(s.into()))
}

pub(crate) fn str_bytes(s: &str) -> kafka_protocol::protocol::StrBytes {
    kafka_protocol::protocol::StrBytes::from_string(s.to_owned())
}
