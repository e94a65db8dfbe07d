//! Broker configuration, loaded the way Kafka operators expect.
//!
//! Sources, highest precedence first:
//! 1. command-line overrides (`key=value` strings),
//! 2. the environment, mapped like the apache/kafka Docker image (`KAFKA_LOG_RETENTION_MS` ->
//!    `log.retention.ms`; `STRAND_HTTP_LISTENER` -> `strand.http.listener`; `CLUSTER_ID`),
//! 3. a `server.properties` file,
//! 4. built-in defaults.
//!
//! Alternative spellings of one setting (`node.id`/`broker.id`, `log.dirs`/`log.dir`,
//! `log.retention.{ms,minutes,hours}`, `log.roll.{ms,hours}`) are resolved as one setting: the
//! spellings given by the highest-precedence source are used, and within that source Kafka's own
//! order applies (`node.id` over `broker.id`, `log.dirs` over `log.dir`, ms over minutes over
//! hours).
//!
//! Unknown keys warn; keys of a Kafka cluster that Strand does not read are accepted silently
//! (an info note); an invalid value of a known key is an error naming key, value, source and what
//! is expected. [`load`] takes all inputs explicitly and touches the process only to read the
//! file and, if an advertised host must be derived, the machine's host name.
//!
//! The cluster keys (`process.roles`, `node.id`, `controller.quorum.voters`, ...) make
//! [`Config::cluster`], a [`ClusterConfig`]: without `process.roles` a standalone node, with it
//! a node of a KRaft-style cluster, the combination checked as Kafka checks it (module
//! `cluster`). [`load`] logs it in one line.
//!
//! The module also describes configs for DescribeConfigs ([`Config::broker_entries`],
//! [`TopicConfig::entries`]) and holds per-topic overrides ([`TopicConfig`]) and the effective
//! storage settings of a topic ([`LogSettings`]).
//!
//! The key tables (broker, topic, group and queue keys, and the keys accepted and ignored) are
//! the one source of the keys' documentation: DescribeConfigs reports it, and
//! `docs/configuration.md` is generated from them ([`configuration_markdown`]); a test fails when
//! the two differ.

mod cluster;
mod doc;
mod entry;
mod env;
mod group;
mod listeners;
mod properties;
mod topic;

pub use cluster::{ClusterConfig, ClusterId, ControllerListener, InterBrokerListener, ProcessRoles, Quorum};
pub use doc::configuration_markdown;
pub use entry::{ConfigEntry, ConfigSource, ConfigType, Unit};
pub use group::{
    parse_auto_offset_reset, parse_iso_duration, AutoOffsetReset, GroupConfig, GroupConfigError,
    IsolationLevel, ShareSettings,
};
pub(crate) use group::{
    CONSUMER_HEARTBEAT_INTERVAL_MS, CONSUMER_SESSION_TIMEOUT_MS, SHARE_HEARTBEAT_INTERVAL_MS,
    SHARE_SESSION_TIMEOUT_MS,
};
pub use listeners::{HostPort, Listener, SecurityProtocol};
pub use topic::{
    CleanupPolicy, CompressionType, LogSettings, QueueSettings, TimestampType, TopicConfig, TopicConfigError,
    CLEANUP_POLICY_DEFAULT, DEAD_LETTER_SUFFIX, QUEUE_KEYS,
};

use std::collections::BTreeMap;
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};

use strand_protocol::types::NodeId;

use self::env::EnvVar;
use self::listeners::Blame;

/// Largest `server.properties` read (sample files are a few KiB).
const MAX_FILE_BYTES: u64 = 1 << 20;
/// Upper bound of `strand.shards` (and of the core count used when it is 0).
const MAX_SHARDS: usize = 1024;
/// Longest accepted `cluster.id`.
const MAX_CLUSTER_ID_LEN: usize = 255;
const I32_MAX: i64 = i32::MAX as i64;
const MIB: i64 = 1 << 20;
/// Most partitions a topic may have, whatever `strand.max.partitions.per.topic` says (a bound,
/// not a Kafka limit).
pub const MAX_PARTITIONS_PER_TOPIC: i32 = 100_000;

/// Where a configuration value came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// A line of the properties file.
    File {
        /// The file.
        path: PathBuf,
        /// 1-based line where the entry starts.
        line: usize,
    },
    /// An environment variable.
    Env {
        /// The variable's name, e.g. `KAFKA_NUM_PARTITIONS`.
        var: String,
    },
    /// A command-line `key=value` override.
    Override,
    /// The built-in default.
    Default,
}

impl Origin {
    /// Precedence: higher wins.
    fn rank(&self) -> u8 {
        match self {
            Origin::Default => 0,
            Origin::File { .. } => 1,
            Origin::Env { .. } => 2,
            Origin::Override => 3,
        }
    }
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::File { path, line } => write!(f, "file {} line {line}", path.display()),
            Origin::Env { var } => write!(f, "environment variable {var}"),
            Origin::Override => f.write_str("command-line override"),
            Origin::Default => f.write_str("built-in default"),
        }
    }
}

/// Why the configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The properties file could not be read.
    #[error("cannot read config file {}: {message}", path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// The properties file is malformed.
    #[error("config file {} line {line}: {message}", path.display())]
    Syntax {
        /// The file.
        path: PathBuf,
        /// 1-based line.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// A command-line override is not `key=value`.
    #[error("invalid command-line override `{arg}`: expected key=value")]
    Override {
        /// The argument as given.
        arg: String,
    },
    /// A known key has a value Strand cannot use.
    #[error("invalid value `{value}` for `{key}` (from {origin}): {reason}")]
    Invalid {
        /// The key.
        key: String,
        /// The value as given.
        value: String,
        /// Where it came from.
        origin: Origin,
        /// What is expected, or why it is not supported.
        reason: String,
    },
}

/// The typed broker configuration. Build it with [`load`] (or `Config::default()` for the
/// built-in defaults).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// `node.id` (alias `broker.id`).
    pub node_id: NodeId,
    /// `cluster.id`.
    pub cluster_id: String,
    /// Kafka client listeners from `listeners`/`advertised.listeners` (controller listeners
    /// excluded). Empty only on a controller-only node (`process.roles=controller`); every one
    /// is PLAINTEXT.
    pub listeners: Vec<Listener>,
    /// Listeners named in `controller.listener.names`, as configured (`NAME://host:port`).
    /// Served only as [`ClusterConfig::controller_listener`], by a node with the controller role.
    pub controller_listeners: Vec<String>,
    /// The cluster this node belongs to: `process.roles`, `node.id`, the controller quorum,
    /// the controller and inter-broker listeners, `cluster.id` and the replication settings.
    pub cluster: ClusterConfig,
    /// `log.dirs` (alias `log.dir`): the single data directory.
    pub log_dir: PathBuf,
    /// `num.partitions`: partitions of auto-created topics and of CreateTopics with -1.
    pub num_partitions: u32,
    /// `auto.create.topics.enable`.
    pub auto_create_topics_enable: bool,
    /// `log.retention.{ms,minutes,hours}`; `None` = unlimited.
    pub retention_ms: Option<i64>,
    /// `log.retention.bytes`; `None` = unlimited.
    pub retention_bytes: Option<u64>,
    /// `log.segment.bytes`.
    pub segment_bytes: u32,
    /// `log.roll.{ms,hours}`.
    pub segment_ms: i64,
    /// `log.index.interval.bytes`.
    pub index_interval_bytes: u32,
    /// `log.index.size.max.bytes`.
    pub index_size_max_bytes: u32,
    /// `log.retention.check.interval.ms`.
    pub retention_check_interval_ms: i64,
    /// `message.max.bytes`: largest record batch accepted.
    pub message_max_bytes: u32,
    /// `socket.request.max.bytes`: largest request frame accepted.
    pub socket_request_max_bytes: u32,
    /// `fetch.max.bytes`: broker-side cap on a fetch response.
    pub fetch_max_bytes: u32,
    /// `strand.fetch.sendfile`: Fetch answers send large runs of records far behind a segment's
    /// end straight from the file (`sendfile`).
    pub fetch_sendfile: bool,
    /// `max.connections`: total client connections.
    pub max_connections: u32,
    /// `strand.max.connections.per.shard`.
    pub max_connections_per_shard: u32,
    /// `strand.http.max.body.bytes`: largest HTTP request body.
    pub http_max_body_bytes: u32,
    /// `strand.request.memory.bytes`: each shard's memory for the requests it has read and not
    /// yet answered (see `Connections::new` for the budget in effect).
    pub request_memory_bytes: u64,
    /// `strand.max.inflight.requests.per.connection`.
    pub max_inflight_requests_per_connection: u32,
    /// `strand.shards` resolved: 0 in the config means one per available core. Always >= 1.
    pub shards: usize,
    /// `strand.http.listener`: the HTTP queue API.
    pub http_listener: HostPort,
    /// `strand.admin.listener`: admin API and `/metrics`.
    pub admin_listener: HostPort,
    /// `strand.journal.segment.bytes`: size at which a shard journal rotates and checkpoints.
    pub journal_segment_bytes: u64,
    /// `strand.journal.recycle.files`: checkpointed journal files a shard keeps to overwrite
    /// instead of deleting (0: delete them all).
    pub journal_recycle_files: usize,
    /// `strand.journal.direct.min.log.bytes`: rounds with more logs skip the journal too when
    /// their logs carry at least this many bytes each on average (0: never by bytes).
    pub journal_direct_min_log_bytes: usize,
    /// `strand.log.drop.behind.bytes`: after a segment file is fsynced, its pages more than this
    /// many bytes behind its end are dropped from the page cache (0: kept, as Kafka does).
    pub log_drop_behind_bytes: u64,
    /// `strand.log.direct.writes`: segment files write their whole pages with `O_DIRECT`.
    pub log_direct_writes: bool,
    /// `strand.log.direct.cache.bytes`: with direct writes, each shard's budget for segments'
    /// most recent writes kept in memory to serve reads of them.
    pub log_direct_cache_bytes: usize,
    /// `strand.storage.resume.free.bytes`: after a full disk, a shard takes writes again once
    /// its data directory's file system has this many bytes available.
    pub storage_resume_free_bytes: u64,
    /// `group.min.session.timeout.ms`.
    pub group_min_session_timeout_ms: i32,
    /// `group.max.session.timeout.ms`.
    pub group_max_session_timeout_ms: i32,
    /// `offsets.retention.minutes`.
    pub offsets_retention_minutes: u32,
    /// `offsets.topic.num.partitions`: partitions of `__consumer_offsets` (fixed once created).
    pub offsets_topic_num_partitions: u32,
    /// `group.initial.rebalance.delay.ms`: how long a new classic group waits for more members.
    pub group_initial_rebalance_delay_ms: i32,
    /// `group.max.size`: members of a classic group (Kafka: unbounded; bounded here).
    pub group_max_size: u32,
    /// `max.request.partition.size.limit`: partitions per DescribeTopicPartitions answer.
    pub max_request_partition_size_limit: usize,
    /// `group.consumer.max.size`: members of a KIP-848 group.
    pub group_consumer_max_size: u32,
    /// `group.consumer.session.timeout.ms`.
    pub group_consumer_session_timeout_ms: i32,
    /// `group.consumer.heartbeat.interval.ms`.
    pub group_consumer_heartbeat_interval_ms: i32,
    /// `group.share.session.timeout.ms`: session timeout of share group members.
    pub group_share_session_timeout_ms: i32,
    /// `group.share.heartbeat.interval.ms`: heartbeat interval of share group members.
    pub group_share_heartbeat_interval_ms: i32,
    /// Bounds of the `consumer.session.timeout.ms` group config:
    /// `group.consumer.{min,max}.session.timeout.ms`.
    pub group_consumer_session_timeout_bounds_ms: (i32, i32),
    /// Bounds of `consumer.heartbeat.interval.ms`: `group.consumer.{min,max}.heartbeat.interval.ms`.
    pub group_consumer_heartbeat_interval_bounds_ms: (i32, i32),
    /// Bounds of `share.session.timeout.ms`: `group.share.{min,max}.session.timeout.ms`.
    pub group_share_session_timeout_bounds_ms: (i32, i32),
    /// Bounds of `share.heartbeat.interval.ms`: `group.share.{min,max}.heartbeat.interval.ms`.
    pub group_share_heartbeat_interval_bounds_ms: (i32, i32),
    /// `group.share.max.size`: members of a share group.
    pub group_share_max_size: u32,
    /// `group.share.record.lock.duration.ms`: default acquisition lock of a share group record.
    pub group_share_record_lock_duration_ms: i32,
    /// `group.share.min.record.lock.duration.ms`: lowest `share.record.lock.duration.ms` allowed.
    pub group_share_min_record_lock_duration_ms: i32,
    /// `group.share.max.record.lock.duration.ms`: highest `share.record.lock.duration.ms` allowed.
    pub group_share_max_record_lock_duration_ms: i32,
    /// `group.share.delivery.count.limit`: default delivery attempts of a share group record.
    pub group_share_delivery_count_limit: i32,
    /// `group.share.partition.max.record.locks`: default records acquired at once per
    /// share-partition.
    pub group_share_partition_max_record_locks: i32,
    /// `errors.deadletterqueue.topic.name.prefix` (KIP-1191): a share group's dead-letter topic
    /// must start with it.
    pub errors_deadletterqueue_topic_name_prefix: String,
    /// `offsets.retention.check.interval.ms`.
    pub offsets_retention_check_interval_ms: i64,
    /// `offset.metadata.max.bytes`: longest metadata string of a committed offset.
    pub offset_metadata_max_bytes: u32,
    /// `producer.id.expiration.ms`: an idempotent producer's state is dropped after this long
    /// without a batch.
    pub producer_id_expiration_ms: i64,
    /// `strand.max.producers.per.partition`: bound on producer states kept per partition; the
    /// least recently active are dropped first.
    pub max_producers_per_partition: u32,
    /// `strand.max.partitions`: partitions the node holds in all, internal topics included.
    pub max_partitions: u32,
    /// `strand.max.partitions.per.topic`: partitions of one topic.
    pub max_partitions_per_topic: u32,
    /// `strand.max.partitions.per.request`: partitions one request creates.
    pub max_partitions_per_request: u32,
    /// Keys set explicitly (any source), with their normalised text, for DescribeConfigs.
    explicit: BTreeMap<&'static str, Explicit>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Explicit {
    text: String,
    origin: Origin,
}

/// The result of [`load`]: the config plus what the operator should be told.
#[derive(Clone, Debug)]
pub struct Loaded {
    /// The configuration.
    pub config: Config,
    /// Warnings (unknown keys, conflicting variables), already logged with `tracing::warn!`.
    pub warnings: Vec<String>,
    /// Informational notes (accepted keys that have no effect, set-aside controller listeners),
    /// already logged with `tracing::info!`.
    pub notes: Vec<String>,
}

/// Default value of a broker key as DescribeConfigs prints it.
#[derive(Clone, Copy, Debug)]
enum DefaultValue {
    Text(&'static str),
    /// Kafka's `null`: not set and no default.
    Null,
    /// An alias: reports the value and source of the named key.
    Mirror(&'static str),
}

/// One typed broker key.
struct BrokerKey {
    name: &'static str,
    ty: ConfigType,
    default: DefaultValue,
    unit: Unit,
    /// What the key does, and for Strand's own keys why one would change it: DescribeConfigs
    /// reports it, and `docs/configuration.md` is generated from it.
    doc: &'static str,
}

const fn key(
    name: &'static str,
    ty: ConfigType,
    default: DefaultValue,
    unit: Unit,
    doc: &'static str,
) -> BrokerKey {
    BrokerKey {
        name,
        ty,
        default,
        unit,
        doc,
    }
}

use ConfigType::{Boolean, Int, Long, String as Str};
use DefaultValue::{Mirror, Null, Text};
use Unit::{Bytes, Count, Hours, Milliseconds as Ms, Minutes};

/// The broker keys Strand reads. Defaults are parsed by the same code as configured values.
#[rustfmt::skip]
static BROKER_KEYS: &[BrokerKey] = &[
    key("node.id", Int, Text("1"), Unit::None, "The id of this node."),
    key("broker.id", Int, Mirror("node.id"), Unit::None, "Alias of node.id."),
    key("cluster.id", Str, Text("strand-local-cluster"), Unit::None, "The cluster id reported to clients."),
    key("listeners", Str, Text("PLAINTEXT://127.0.0.1:9092"), Unit::None,
        "Kafka listeners: NAME://host:port, comma-separated. Only PLAINTEXT listeners are served."),
    key("advertised.listeners", Str, Null, Unit::None,
        "Addresses given to clients, per listener name; defaults to listeners (a wildcard host is advertised as the machine's host name)."),
    key("listener.security.protocol.map", Str, Text(listeners::DEFAULT_PROTOCOL_MAP), Unit::None,
        "Security protocol of each listener name, NAME:PROTOCOL, comma-separated."),
    key("controller.listener.names", Str, Null, Unit::None,
        "Listener names of the controller quorum, comma-separated; the first is the one used. With the controller role its listener must be in listeners, and the node serves the quorum on it (its Raft messages and the controller requests of brokers), bound by shard 0 and retried while the address is busy; a broker-only node must not have it in listeners."),
    key("process.roles", Str, Null, Unit::None,
        "broker, controller or broker,controller, as in a KRaft cluster. Unset: a standalone node, a broker and the only voter of its own controller quorum. Set: node.id and controller.quorum.voters (or controller.quorum.bootstrap.servers) are required, so is cluster.id unless the node is the only voter, and the listener settings are checked as Kafka checks them. With the controller role the node is a voter of the controller quorum; with the broker role it registers with the active controller, heartbeats, and serves the topics the cluster metadata places on it. Each partition is a Raft group of its replicas: acks=all is answered once a majority of them holds the batch."),
    key("controller.quorum.voters", Str, Null, Unit::None,
        "The controller quorum: {id}@{host}:{port}, comma-separated, each voter's node id and the address of its controller listener. A node with the controller role must be one of them; a broker-only node must not. The quorum runs over these addresses, and brokers send their controller requests to them."),
    key("controller.quorum.bootstrap.servers", Str, Null, Unit::None,
        "Controllers to learn the quorum from, {host}:{port}, comma-separated, when controller.quorum.voters is not given. Checked, not used yet: a node joins a cluster only with controller.quorum.voters."),
    key("inter.broker.listener.name", Str, Null, Unit::None,
        "The client listener other brokers reach this one on (its advertised address); one of listeners. Defaults to the listener named after security.inter.broker.protocol. Partition replicas reach each other on the addresses brokers advertise for it."),
    key("security.inter.broker.protocol", Str, Text("PLAINTEXT"), Unit::None,
        "Names the inter-broker listener when inter.broker.listener.name is not set (only one of the two may be set)."),
    key("broker.rack", Str, Null, Unit::None, "The rack (or zone) of this node, registered with the controller quorum and shown in Metadata and DescribeCluster."),
    key("replica.lag.time.max.ms", Long, Text("30000"), Ms,
        "A follower that has not caught up with its leader's log end for this long leaves the in-sync replicas. Lower it to drop slow followers sooner, so acks=all waits less on them; raise it on a network with long pauses, so followers are not dropped and re-added."),
    key("default.replication.factor", Int, Text("1"), Count("replicas"),
        "Replicas of auto-created topics and of CreateTopics asking for -1. Set 3 on a three-node cluster so a topic survives the loss of a node. On a cluster node the replicas are placed over the live brokers (INVALID_REPLICATION_FACTOR above their count)."),
    key("offsets.topic.replication.factor", Int, Null, Count("replicas"),
        "Replicas of __consumer_offsets on a cluster node, where the cluster creates the topic at the first FindCoordinator for a consumer group and each group's coordinator is the leader of the group's partition of it (a lost coordinator's groups move with that leadership, committed offsets and all). Unset: min(3, the brokers registered with the cluster). Set: the topic waits for that many live brokers (clients see COORDINATOR_NOT_AVAILABLE meanwhile), as in Kafka. Fixed once the topic exists. A single node keeps its own __consumer_offsets and ignores it."),
    key("auto.leader.rebalance.enable", Boolean, Text("true"), Unit::None,
        "Leaders move back to each partition's preferred replica (the first of its replicas, where placement spread them) once it is in sync and caught up, checked every leader.imbalance.check.interval.seconds, as Kafka's controller moves them (Strand moves every such partition, with no leader.imbalance.per.broker.percentage threshold). Turn it off to keep leaders where fail-overs put them."),
    key("leader.imbalance.check.interval.seconds", Long, Text("300"), Count("seconds"),
        "How often leaders are moved back to their preferred replicas (auto.leader.rebalance.enable). Lower it to restore the spread of leaders sooner after a node returns."),
    key("min.insync.replicas", Int, Text("1"), Count("replicas"),
        "The default of the topic config min.insync.replicas: in-sync replicas an acks=all produce needs. With replication factor 3, 2 keeps writes safe while one node is down. An acks=all produce to a partition with fewer in-sync replicas is refused with NOT_ENOUGH_REPLICAS."),
    key("broker.session.timeout.ms", Int, Text("9000"), Ms,
        "A broker whose heartbeats to the controller quorum stop for this long is fenced. Lower it for faster fail-over, at the risk of fencing a broker that only paused. The active controller checks once a second."),
    key("broker.heartbeat.interval.ms", Int, Text("2000"), Ms,
        "How often a broker heartbeats to the controller quorum; well below broker.session.timeout.ms."),
    key("controller.quorum.election.timeout.ms", Int, Text("1000"), Ms,
        "How long a controller voter waits without hearing from a leader before it starts an election. Lower it for faster fail-over of the controller, raise it on a slow network to avoid needless elections. The quorum's Raft election timeout is drawn between this and twice this."),
    key("controller.quorum.fetch.timeout.ms", Int, Text("2000"), Ms,
        "How long a controller voter goes without a successful fetch from the leader before it becomes a candidate; a leader that hears from no majority for this long resigns. Not used yet."),
    key("log.dirs", Str, Text("./strand-data"), Unit::None, "The data directory (exactly one)."),
    key("log.dir", Str, Mirror("log.dirs"), Unit::None, "Alias of log.dirs."),
    key("num.partitions", Int, Text("1"), Count("partitions"),
        "Partitions of auto-created topics, and of CreateTopics asking for -1."),
    key("auto.create.topics.enable", Boolean, Text("true"), Unit::None,
        "Create unknown topics when a client asks for them in Metadata or Produce."),
    key("log.retention.ms", Long, Null, Ms, "Time retention; -1 unlimited. Wins over minutes and hours."),
    key("log.retention.minutes", Int, Null, Minutes, "Time retention; -1 unlimited. Wins over hours."),
    key("log.retention.hours", Int, Text("168"), Hours, "Time retention; -1 unlimited."),
    key("log.retention.bytes", Long, Text("-1"), Bytes, "Size retention per partition; -1 unlimited."),
    key("log.segment.bytes", Int, Text("1073741824"), Bytes, "Roll a log segment at this size."),
    key("log.roll.ms", Long, Null, Ms, "Roll a log segment this old. Wins over log.roll.hours."),
    key("log.roll.hours", Int, Text("168"), Hours, "Roll a log segment this old."),
    key("log.index.interval.bytes", Int, Text("4096"), Bytes, "Bytes of log between offset index entries."),
    key("log.index.size.max.bytes", Int, Text("10485760"), Bytes,
        "Largest offset index of a segment; a full index rolls the segment."),
    key("log.retention.check.interval.ms", Long, Text("300000"), Ms, "How often retention is enforced."),
    key("message.max.bytes", Int, Text("1048588"), Bytes, "Largest record batch accepted."),
    key("socket.request.max.bytes", Int, Text("104857600"), Bytes, "Largest request accepted."),
    key("fetch.max.bytes", Int, Text("31457280"), Bytes,
        "Largest fetch response. Below Kafka's 57671680 because librdkafka holds each answer in one allocation, which glibc maps afresh every time above 32 MiB: with 1,000 partitions a log was read a quarter to twice as fast. Set 57671680 for Kafka's bound."),
    key("strand.fetch.sendfile", Boolean, Text("true"), Unit::None,
        "Fetch answers send runs of records of at least 64 KiB that lie far behind a segment's written end straight from the file with sendfile(2), as Kafka does. Set false to copy them through the broker instead: a lone consumer of a partition may read faster that way, for up to twice the broker's CPU."),
    key("max.connections", Int, Text("2147483647"), Count("connections"), "Most client connections in total."),
    key("strand.max.connections.per.shard", Int, Text("10000"), Count("connections"),
        "Most Kafka connections, and most HTTP connections, each shard serves; more are refused. Each holds buffers and a descriptor: lower it to protect a small machine, raise it for more clients."),
    key("strand.max.inflight.requests.per.connection", Int, Text("256"), Count("requests"),
        "Requests a connection may have in flight before the broker stops reading from it, which bounds the memory one pipelining client holds. Raise it only for clients that pipeline more deeply."),
    key("strand.shards", Int, Text("0"), Count("shards"),
        "Executor threads, each pinned to a core and owning its share of the partitions; 0 means one per available core. Set fewer to leave cores to other processes."),
    key("strand.http.listener", Str, Text("127.0.0.1:8080"), Unit::None,
        "host:port of the HTTP queue API (docs/http-api.md)."),
    key("strand.http.max.body.bytes", Int, Text("10485760"), Bytes,
        "Largest HTTP queue API request body; larger ones are refused with 413. Raise it to publish larger messages over HTTP."),
    key("strand.request.memory.bytes", Long, Text("536870912"), Bytes,
        "Each shard's memory for the requests it has read and not yet answered: Kafka request frames (a Produce counts twice its size: its records are copied for writing while it waits for its answer) and HTTP queue API bodies sent with a Content-Length. A request's memory is reserved, from its size prefix or Content-Length, before its body is read; a Kafka connection waiting for memory holds only its 64 KiB input buffer, and a frame larger than socket.request.max.bytes closes its connection unread. At least twice socket.request.max.bytes and strand.http.max.body.bytes are always allowed. Under Kafka requests of any size, the broker's resident memory stays below strand.shards x (this + strand.log.direct.cache.bytes) + 128 MiB + 64 KiB per open connection, apart from fetch answers (up to fetch.max.bytes per fetching connection) and the decoded form of requests naming very many partitions (about 50 bytes per partition named, not counted). Lower it on a small machine (large requests then wait for one another); raise it to serve more large requests at once."),
    key("strand.admin.listener", Str, Text("127.0.0.1:9644"), Unit::None,
        "host:port of the admin API: /metrics (Prometheus) and readiness."),
    key("strand.journal.segment.bytes", Long, Text("134217728"), Bytes,
        "Each shard's journal is checkpointed and rotated at this size. Smaller takes less disk and shortens the replay after a crash; larger checkpoints less often under heavy writes."),
    key("strand.journal.recycle.files", Int, Text("2"), Count("files"),
        "Checkpointed journal files each shard keeps, up to strand.journal.segment.bytes each, to overwrite instead of creating new ones, which makes a journal write's fsync cheaper. Set 0 to give that disk space back; kept files are also removed at shutdown."),
    key("strand.journal.direct.min.log.bytes", Int, Text("16384"), Bytes,
        "Flush rounds of several partitions carrying at least this many bytes per partition on average skip the journal: one syncfs of the data directory's file system makes their segments durable, and checkpoints of many partitions sync it too. syncfs also writes back whatever else that file system holds unsynced: on a file system shared with other busy writers, set 0 to keep such rounds journaled and checkpoints per file."),
    key("strand.log.drop.behind.bytes", Long, Text("0"), Bytes,
        "After a segment written through the page cache is fsynced, its pages more than this far behind its end are dropped from the page cache; 0 keeps them, as Kafka does. Set it where new page-cache pages are expensive (a VM whose free memory goes back to the host); reads of dropped data then come from the disk."),
    key("strand.log.direct.writes", Boolean, Text("true"), Unit::None,
        "Segment writes of 64 KiB or more go to the disk with O_DIRECT, so a growing log takes no page-cache pages, and its most recent writes are served from memory (strand.log.direct.cache.bytes). Set false to write through the page cache as Kafka does, on a host with memory to spare whose consumers lag further behind than that memory holds: they then read from the page cache instead of the disk."),
    key("strand.log.direct.cache.bytes", Long, Text("268435456"), Bytes,
        "With strand.log.direct.writes, each shard's memory for its segments' most recent writes, which serve consumers at the log's end. Lower it on a machine with little memory; raise it to serve consumers further behind from memory."),
    key("strand.storage.resume.free.bytes", Long, Text("67108864"), Bytes,
        "When a write fails because the disk is full, the shard refuses writes (KAFKA_STORAGE_ERROR, HTTP 503 storage_error) and checks every second for free space; once the data directory's file system has at least this much available, it cuts what the failed write left and takes writes again by itself, without a restart. Other I/O errors keep writes refused until a restart."),
    key("group.min.session.timeout.ms", Int, Text("6000"), Ms, "Smallest consumer session timeout allowed."),
    key("group.max.session.timeout.ms", Int, Text("1800000"), Ms, "Largest consumer session timeout allowed."),
    key("offsets.retention.minutes", Int, Text("10080"), Minutes, "Committed offsets of an empty group are kept this long."),
    key("offsets.topic.num.partitions", Int, Text("50"), Count("partitions"),
        "Partitions of __consumer_offsets (fixed once it exists)."),
    key("group.initial.rebalance.delay.ms", Int, Text("3000"), Ms, "A new classic group waits this long for more members."),
    key("group.max.size", Int, Text("10000"), Count("members"), "Most members of a classic consumer group."),
    key("max.request.partition.size.limit", Int, Text("2000"), Count("partitions"),
        "Most partitions one DescribeTopicPartitions answer describes (a client may ask for fewer); the client asks for the rest page by page. Lower it to bound the size of such answers on a broker with many partitions."),
    key("group.consumer.max.size", Int, Text("10000"), Count("members"), "Most members of a consumer (KIP-848) group."),
    key("group.consumer.session.timeout.ms", Int, Text("45000"), Ms, "Session timeout of KIP-848 members."),
    key("group.consumer.heartbeat.interval.ms", Int, Text("5000"), Ms, "Heartbeat interval of KIP-848 members."),
    key("group.share.session.timeout.ms", Int, Text("45000"), Ms, "Session timeout of share group members."),
    key("group.share.heartbeat.interval.ms", Int, Text("5000"), Ms, "Heartbeat interval of share group members."),
    key("group.consumer.min.session.timeout.ms", Int, Text("45000"), Ms,
        "Lowest session timeout of KIP-848 members: group.consumer.session.timeout.ms and the consumer.session.timeout.ms group config may not be lower."),
    key("group.consumer.max.session.timeout.ms", Int, Text("60000"), Ms,
        "Highest session timeout of KIP-848 members: group.consumer.session.timeout.ms and the consumer.session.timeout.ms group config may not be higher."),
    key("group.consumer.min.heartbeat.interval.ms", Int, Text("5000"), Ms,
        "Lowest heartbeat interval of KIP-848 members (group.consumer.heartbeat.interval.ms and the consumer.heartbeat.interval.ms group config)."),
    key("group.consumer.max.heartbeat.interval.ms", Int, Text("15000"), Ms,
        "Highest heartbeat interval of KIP-848 members (group.consumer.heartbeat.interval.ms and the consumer.heartbeat.interval.ms group config)."),
    key("group.share.min.session.timeout.ms", Int, Text("45000"), Ms,
        "Lowest session timeout of share group members (group.share.session.timeout.ms and the share.session.timeout.ms group config)."),
    key("group.share.max.session.timeout.ms", Int, Text("60000"), Ms,
        "Highest session timeout of share group members (group.share.session.timeout.ms and the share.session.timeout.ms group config)."),
    key("group.share.min.heartbeat.interval.ms", Int, Text("5000"), Ms,
        "Lowest heartbeat interval of share group members (group.share.heartbeat.interval.ms and the share.heartbeat.interval.ms group config)."),
    key("group.share.max.heartbeat.interval.ms", Int, Text("15000"), Ms,
        "Highest heartbeat interval of share group members (group.share.heartbeat.interval.ms and the share.heartbeat.interval.ms group config)."),
    key("group.share.max.size", Int, Text("200"), Count("members"), "Most members of a share group."),
    key("group.share.record.lock.duration.ms", Int, Text("30000"), Ms, "Default acquisition lock of a share group record."),
    key("group.share.min.record.lock.duration.ms", Int, Text("15000"), Ms, "Lowest share.record.lock.duration.ms allowed."),
    key("group.share.max.record.lock.duration.ms", Int, Text("60000"), Ms, "Highest share.record.lock.duration.ms allowed."),
    key("group.share.delivery.count.limit", Int, Text("5"), Count("deliveries"),
        "Default delivery attempts of a share group record."),
    key("group.share.partition.max.record.locks", Int, Text("2000"), Count("records"),
        "Default records acquired at once per share-partition."),
    key("errors.deadletterqueue.topic.name.prefix", Str, Text("dlq."), Unit::None,
        "Required prefix of share group dead-letter topics."),
    key("offsets.retention.check.interval.ms", Long, Text("600000"), Ms, "How often expired offsets are removed."),
    key("offset.metadata.max.bytes", Int, Text("4096"), Bytes, "Longest metadata string of a committed offset."),
    key("producer.id.expiration.ms", Int, Text("86400000"), Ms,
        "An idempotent producer's state is dropped after this long without a batch."),
    key("strand.max.producers.per.partition", Int, Text("10000"), Count("producers"),
        "Most idempotent producers whose state each partition keeps; the least recently active go first. Raise it if more producers write to one partition, at a little memory each."),
    key("strand.max.partitions", Int, Text("15000"), Count("partitions"),
        "Most partitions the node holds, internal topics included (__consumer_offsets takes offsets.topic.num.partitions). Creating more is refused with POLICY_VIOLATION (HTTP 409 partition_limit_reached), whether by CreateTopics, CreatePartitions, auto-creation through Metadata or the HTTP queue API; deleting topics makes room. Each partition holds a file descriptor, about 5 KiB of memory when idle, and adds to the time a restart takes before the node serves (at 15,000 on a busy 2-core VM: 1.2 s after a clean stop, 2.4 s after SIGKILL; BENCHMARKS.md#partition-limits). Raise it on a machine with more cores, memory and open files; lower it on a small one."),
    key("strand.max.partitions.per.topic", Int, Text("10000"), Count("partitions"),
        "Most partitions one topic may have, at most 100000; creating or growing a topic beyond it is refused with INVALID_PARTITIONS (HTTP 400 too_many_partitions). All of a topic's partitions are listed in one Metadata answer and spread over one group's members: raise it for a topic that needs more, lower it to keep one topic from taking the node's whole budget."),
    key("strand.max.partitions.per.request", Int, Text("10000"), Count("partitions"),
        "Most partitions one request may create, summed over its topics (CreateTopics, CreatePartitions; for an HTTP PUT, the queue's and its dead-letter topic's when that is created too). A request asking for more is refused whole with POLICY_VIOLATION (HTTP 400 too_many_partitions), as Kafka refuses a request of more than 10,000. Lower it to bound the work of one admin request."),
];

/// Keys of Kafka/compose configs Strand accepts with no effect (threads it does not have,
/// transactions and internal topics it does not run yet, ZooKeeper). Extend here. (`confluent.*` keys are accepted too.)
const IGNORED_KEYS: &[&str] = &[
    "transactional.id.expiration.ms",
    "transaction.max.timeout.ms",
    "transaction.state.log.replication.factor",
    "transaction.state.log.min.isr",
    "num.network.threads",
    "num.io.threads",
    "num.recovery.threads.per.data.dir",
    "socket.send.buffer.bytes",
    "socket.receive.buffer.bytes",
    "log.flush.interval.messages",
    "log.flush.interval.ms",
    "zookeeper.connect",
    "unclean.leader.election.enable",
    "delete.topic.enable",
    "metadata.log.dir",
    "share.coordinator.state.topic.replication.factor",
    "share.coordinator.state.topic.min.isr",
    "group.coordinator.rebalance.protocols",
    "unstable.api.versions.enable",
    "log.cleaner.enable",
];

/// Prefixes of keys accepted with no effect.
const IGNORED_KEY_PREFIXES: &[&str] = &["confluent."];

fn broker_key(name: &str) -> Option<&'static BrokerKey> {
    BROKER_KEYS.iter().find(|k| k.name == name)
}

fn is_ignored_key(name: &str) -> bool {
    IGNORED_KEYS.contains(&name) || IGNORED_KEY_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// Several spellings of one setting.
enum Group {
    /// `alias` means the same as `canonical`; `canonical` wins within a source. With `must_match`,
    /// both given in one source with different values is an error (Kafka's rule for broker.id).
    Alias {
        canonical: &'static str,
        alias: &'static str,
        must_match: bool,
    },
    /// Units of one setting, most precise first; the first present wins within a source.
    Units(&'static [&'static str]),
}

const GROUPS: &[Group] = &[
    Group::Alias {
        canonical: "node.id",
        alias: "broker.id",
        must_match: true,
    },
    Group::Alias {
        canonical: "log.dirs",
        alias: "log.dir",
        must_match: false,
    },
    Group::Units(&["log.retention.ms", "log.retention.minutes", "log.retention.hours"]),
    Group::Units(&["log.roll.ms", "log.roll.hours"]),
];

/// A value, the key as the source spelled it (an alias keeps its spelling), and its origin.
#[derive(Clone, Debug)]
struct Raw {
    key: String,
    value: String,
    origin: Origin,
}

/// Reads the process environment for [`load`], skipping variables that are not valid UTF-8.
pub fn process_env() -> Vec<(String, String)> {
    std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .collect()
}

/// Loads the configuration from an optional properties file, environment variables and
/// command-line `key=value` overrides (see the module docs for precedence). Warnings and notes
/// are logged and returned.
pub fn load(
    file: Option<&Path>,
    env: impl IntoIterator<Item = (String, String)>,
    overrides: &[String],
) -> Result<Loaded, ConfigError> {
    let loaded = load_quietly(file, env, overrides)?;
    for warning in &loaded.warnings {
        tracing::warn!("{warning}");
    }
    for note in &loaded.notes {
        tracing::info!("{note}");
    }
    tracing::info!("{}", loaded.config.cluster);
    Ok(loaded)
}

fn load_quietly(
    file: Option<&Path>,
    env: impl IntoIterator<Item = (String, String)>,
    overrides: &[String],
) -> Result<Loaded, ConfigError> {
    let mut warnings = Vec::new();
    let mut notes = Vec::new();
    let mut settings: BTreeMap<String, Raw> = BTreeMap::new();

    if let Some(path) = file {
        for prop in read_properties(path)? {
            let origin = Origin::File {
                path: path.to_path_buf(),
                line: prop.line,
            };
            let raw = Raw {
                key: prop.key.clone(),
                value: prop.value.trim().to_string(),
                origin,
            };
            settings.insert(prop.key, raw);
        }
    }

    // Sorted so that two variables mapping to one key resolve the same way every time.
    let mut env: Vec<(String, String)> = env.into_iter().collect();
    env.sort();
    let mut env_hostname = None;
    let mut from_env: BTreeMap<String, Raw> = BTreeMap::new();
    for (name, value) in env {
        if name == "HOSTNAME" {
            env_hostname = Some(value.clone());
        }
        let EnvVar::Key(key) = env::classify(&name) else {
            continue;
        };
        let value = value.trim().to_string();
        if let Some(prev) = from_env.get(&key) {
            if prev.value != value {
                warnings.push(format!(
                    "`{key}` is set by both {} and {name}; using {name}",
                    prev.origin
                ));
            }
        }
        from_env.insert(
            key.clone(),
            Raw {
                key,
                value,
                origin: Origin::Env { var: name },
            },
        );
    }
    settings.extend(from_env);

    for arg in overrides {
        let Some((key, value)) = arg.split_once('=').filter(|(k, _)| !k.trim().is_empty()) else {
            return Err(ConfigError::Override { arg: arg.clone() });
        };
        let key = key.trim().to_string();
        let raw = Raw {
            key: key.clone(),
            value: value.trim().to_string(),
            origin: Origin::Override,
        };
        settings.insert(key, raw);
    }

    let mut known = BTreeMap::new();
    for (key, raw) in settings {
        if broker_key(&key).is_some() {
            known.insert(key, raw);
        } else if is_ignored_key(&key) {
            notes.push(format!(
                "`{key}` (from {}) has no effect in Strand; ignored",
                raw.origin
            ));
        } else {
            warnings.push(format!(
                "unknown configuration key `{key}` (from {}) ignored",
                raw.origin
            ));
        }
    }
    resolve_groups(&mut known, &mut notes)?;

    let mut hostname = || machine_hostname(env_hostname.as_deref());
    let config = build(
        Resolver {
            known,
            explicit: BTreeMap::new(),
        },
        &mut hostname,
        &mut warnings,
        &mut notes,
    )?;
    if config.cluster.is_standalone() {
        for controller in &config.controller_listeners {
            notes.push(format!(
                "controller listener {controller} is not served: without process.roles this is a standalone node"
            ));
        }
    }
    Ok(Loaded {
        config,
        warnings,
        notes,
    })
}

fn read_properties(path: &Path) -> Result<Vec<properties::Property>, ConfigError> {
    let file_error = |message: String| ConfigError::File {
        path: path.to_path_buf(),
        message,
    };
    let file = std::fs::File::open(path).map_err(|e| file_error(e.to_string()))?;
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| file_error(e.to_string()))?;
    if u64::try_from(bytes.len()).unwrap_or(u64::MAX) > MAX_FILE_BYTES {
        return Err(file_error(format!("larger than {MAX_FILE_BYTES} bytes")));
    }
    let text = String::from_utf8(bytes).map_err(|_| file_error("not valid UTF-8".to_string()))?;
    properties::parse(&text).map_err(|e| ConfigError::Syntax {
        path: path.to_path_buf(),
        line: e.line,
        message: e.message,
    })
}

/// Applies [`GROUPS`]: drops spellings from lower-precedence sources and folds aliases into
/// their canonical key.
fn resolve_groups(known: &mut BTreeMap<String, Raw>, notes: &mut Vec<String>) -> Result<(), ConfigError> {
    for group in GROUPS {
        let pair;
        let members: &[&str] = match group {
            Group::Alias { canonical, alias, .. } => {
                pair = [*canonical, *alias];
                &pair
            }
            Group::Units(members) => members,
        };
        let Some(top) = members
            .iter()
            .filter_map(|m| known.get(*m))
            .map(|r| r.origin.rank())
            .max()
        else {
            continue;
        };
        let winner = members
            .iter()
            .find(|m| known.get(**m).is_some_and(|r| r.origin.rank() == top))
            .and_then(|m| known.get(*m).map(|r| format!("`{m}` from {}", r.origin)))
            .unwrap_or_default();
        for member in members {
            if let Some(raw) = known.get(*member).filter(|r| r.origin.rank() < top) {
                notes.push(format!(
                    "`{member}` from {} is overridden by {winner}",
                    raw.origin
                ));
                known.remove(*member);
            }
        }
        let Group::Alias {
            canonical,
            alias,
            must_match,
        } = group
        else {
            continue;
        };
        let Some(alias_raw) = known.remove(*alias) else {
            continue;
        };
        match known.get(*canonical) {
            None => {
                known.insert(canonical.to_string(), alias_raw);
            }
            Some(canonical_raw) => {
                let same = alias_raw.value == canonical_raw.value
                    || matches!(
                        (alias_raw.value.parse::<i64>(), canonical_raw.value.parse::<i64>()),
                        (Ok(a), Ok(c)) if a == c
                    );
                if *must_match && !same {
                    return Err(ConfigError::Invalid {
                        key: alias.to_string(),
                        value: alias_raw.value,
                        origin: alias_raw.origin,
                        reason: format!(
                            "must equal {canonical} ({}, from {})",
                            canonical_raw.value, canonical_raw.origin
                        ),
                    });
                }
                if !same {
                    notes.push(format!(
                        "`{alias}` from {} is ignored because `{canonical}` is set",
                        alias_raw.origin
                    ));
                }
            }
        }
    }
    Ok(())
}

/// The machine's host name for advertising wildcard listeners: `HOSTNAME` from the given
/// environment, else `/proc/sys/kernel/hostname`, else `localhost`.
fn machine_hostname(env_hostname: Option<&str>) -> String {
    let valid = |h: &str| !h.is_empty() && !h.contains(char::is_whitespace);
    if let Some(h) = env_hostname.map(str::trim).filter(|h| valid(h)) {
        return h.to_string();
    }
    match std::fs::read_to_string("/proc/sys/kernel/hostname") {
        Ok(h) if valid(h.trim()) => h.trim().to_string(),
        _ => "localhost".to_string(),
    }
}

/// "an integer >= 1" / "an integer from 1 to 2147483647".
fn range_text(min: i64, max: i64) -> String {
    if max == i64::MAX {
        format!("an integer >= {min}")
    } else {
        format!("an integer from {min} to {max}")
    }
}

/// Parses a plain decimal integer (optional sign, digits only) within `[min, max]`.
fn parse_int(text: &str, min: i64, max: i64) -> Result<i64, String> {
    let digits = text.strip_prefix(['-', '+']).unwrap_or(text);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "expected {}, written as plain decimal digits (no units, exponents or separators)",
            range_text(min, max)
        ));
    }
    match text.parse::<i64>() {
        Ok(v) if (min..=max).contains(&v) => Ok(v),
        _ => Err(format!("expected {}", range_text(min, max))),
    }
}

/// Reads typed values out of the merged settings, remembering which keys were set explicitly.
struct Resolver {
    known: BTreeMap<String, Raw>,
    explicit: BTreeMap<&'static str, Explicit>,
}

/// An error about `raw`, named by the key as the source spelled it.
fn invalid(raw: &Raw, reason: String) -> ConfigError {
    ConfigError::Invalid {
        key: raw.key.clone(),
        value: raw.value.clone(),
        origin: raw.origin.clone(),
        reason,
    }
}

impl Resolver {
    /// The configured value of `key`, else its default; `None` if neither.
    fn raw(&self, key: &str) -> Option<Raw> {
        if let Some(raw) = self.known.get(key) {
            return Some(raw.clone());
        }
        match broker_key(key).map(|k| k.default) {
            Some(Text(text)) => Some(Raw {
                key: key.to_string(),
                value: text.to_string(),
                origin: Origin::Default,
            }),
            _ => None,
        }
    }

    /// Parses `key` with `f` (which returns the value and its normalised text).
    fn parse<T>(
        &mut self,
        key: &'static str,
        f: impl FnOnce(&str) -> Result<(T, String), String>,
    ) -> Result<Option<T>, ConfigError> {
        let Some(raw) = self.raw(key) else {
            return Ok(None);
        };
        let (value, text) = f(&raw.value).map_err(|reason| invalid(&raw, reason))?;
        if raw.origin != Origin::Default {
            self.explicit.insert(
                key,
                Explicit {
                    text,
                    origin: raw.origin,
                },
            );
        }
        Ok(Some(value))
    }

    /// Like [`Resolver::parse`] for keys that always have a default.
    fn required<T>(
        &mut self,
        key: &'static str,
        f: impl FnOnce(&str) -> Result<(T, String), String>,
    ) -> Result<T, ConfigError> {
        self.parse(key, f)?.ok_or_else(|| ConfigError::Invalid {
            key: key.to_string(),
            value: String::new(),
            origin: Origin::Default,
            reason: "no value and no default (a bug in the key table)".to_string(),
        })
    }

    fn opt_int<T: TryFrom<i64>>(
        &mut self,
        key: &'static str,
        min: i64,
        max: i64,
    ) -> Result<Option<T>, ConfigError> {
        self.parse(key, |s| {
            let v = parse_int(s, min, max)?;
            let t = T::try_from(v).map_err(|_| format!("expected {}", range_text(min, max)))?;
            Ok((t, v.to_string()))
        })
    }

    fn int<T: TryFrom<i64>>(&mut self, key: &'static str, min: i64, max: i64) -> Result<T, ConfigError> {
        self.opt_int(key, min, max)?.ok_or_else(|| ConfigError::Invalid {
            key: key.to_string(),
            value: String::new(),
            origin: Origin::Default,
            reason: "no value and no default (a bug in the key table)".to_string(),
        })
    }

    fn boolean(&mut self, key: &'static str) -> Result<bool, ConfigError> {
        self.required(key, |s| {
            if s.eq_ignore_ascii_case("true") {
                Ok((true, "true".to_string()))
            } else if s.eq_ignore_ascii_case("false") {
                Ok((false, "false".to_string()))
            } else {
                Err("expected true or false".to_string())
            }
        })
    }

    fn host_port(&mut self, key: &'static str) -> Result<HostPort, ConfigError> {
        self.required(key, |s| {
            let mut hp = listeners::parse_host_port(s)?;
            if hp.host.is_empty() {
                hp.host = "0.0.0.0".to_string();
            }
            Ok((hp, s.to_string()))
        })
    }

    /// Blames `key`'s current value for a cross-key problem.
    fn blame(&self, key: &str, reason: String) -> ConfigError {
        match self.raw(key) {
            Some(raw) => invalid(&raw, reason),
            None => ConfigError::Invalid {
                key: key.to_string(),
                value: String::new(),
                origin: Origin::Default,
                reason,
            },
        }
    }
}

/// A kind of group's session timeout and heartbeat interval, each as (value, (min, max)).
struct SessionSettings {
    session: (i32, (i32, i32)),
    heartbeat: (i32, (i32, i32)),
}

/// Reads a session timeout and a heartbeat interval with their bounds (`[value, min, max]` key
/// names each) and checks them as Kafka's `GroupCoordinatorConfig` does: min <= max, each value
/// within its bounds, the interval below the timeout. The key set explicitly is blamed.
fn session_settings(
    r: &mut Resolver,
    session_keys: [&'static str; 3],
    heartbeat_keys: [&'static str; 3],
) -> Result<SessionSettings, ConfigError> {
    let mut read = |[value, min, max]: [&'static str; 3]| -> Result<(i32, (i32, i32)), ConfigError> {
        let (v, lo, hi): (i32, i32, i32) = (
            r.int(value, 1, I32_MAX)?,
            r.int(min, 1, I32_MAX)?,
            r.int(max, 1, I32_MAX)?,
        );
        if lo > hi {
            let blamed = if r.explicit.contains_key(max) { max } else { min };
            return Err(r.blame(blamed, format!("{min} ({lo}) must be at most {max} ({hi})")));
        }
        if v < lo || v > hi {
            return Err(r.blame(value, format!("must be between {min} ({lo}) and {max} ({hi})")));
        }
        Ok((v, (lo, hi)))
    };
    let session = read(session_keys)?;
    let heartbeat = read(heartbeat_keys)?;
    let [session_key, ..] = session_keys;
    let [heartbeat_key, ..] = heartbeat_keys;
    if heartbeat.0 >= session.0 {
        return Err(if r.explicit.contains_key(heartbeat_key) {
            r.blame(
                heartbeat_key,
                format!("must be less than {session_key} ({})", session.0),
            )
        } else {
            r.blame(
                session_key,
                format!("must be greater than {heartbeat_key} ({})", heartbeat.0),
            )
        });
    }
    Ok(SessionSettings { session, heartbeat })
}

fn build(
    mut r: Resolver,
    hostname: &mut dyn FnMut() -> String,
    warnings: &mut Vec<String>,
    notes: &mut Vec<String>,
) -> Result<Config, ConfigError> {
    let node_id = NodeId(r.int("node.id", 0, I32_MAX)?);
    let cluster_id = r.required("cluster.id", |s| {
        if s.is_empty() || s.len() > MAX_CLUSTER_ID_LEN || s.chars().any(char::is_control) {
            Err(format!(
                "expected a non-empty id of at most {MAX_CLUSTER_ID_LEN} characters"
            ))
        } else {
            Ok((s.to_string(), s.to_string()))
        }
    })?;

    let log_dir = r.required("log.dirs", |s| {
        let dirs: Vec<&str> = s.split(',').map(str::trim).filter(|d| !d.is_empty()).collect();
        match dirs.as_slice() {
            [dir] => Ok((PathBuf::from(dir), s.to_string())),
            [] => Err("expected a directory".to_string()),
            _ => Err(
                "expected exactly one directory: JBOD (several log directories) is not supported yet"
                    .to_string(),
            ),
        }
    })?;
    let num_partitions = r.int("num.partitions", 1, I32_MAX)?;
    let auto_create_topics_enable = r.boolean("auto.create.topics.enable")?;

    let retention_ms_key: Option<i64> = r.opt_int("log.retention.ms", -1, i64::MAX)?;
    let retention_minutes: Option<i64> = r.opt_int("log.retention.minutes", -1, I32_MAX)?;
    let retention_hours: i64 = r.int("log.retention.hours", -1, I32_MAX)?;
    let retention = match (retention_ms_key, retention_minutes) {
        (Some(ms), _) => ms,
        (None, Some(minutes)) => minutes.saturating_mul(60_000),
        (None, None) => retention_hours.saturating_mul(3_600_000),
    };
    let retention_ms = (retention >= 0).then_some(retention);
    let retention_bytes: i64 = r.int("log.retention.bytes", -1, i64::MAX)?;
    let retention_bytes = u64::try_from(retention_bytes).ok();
    let segment_bytes = r.int("log.segment.bytes", 14, I32_MAX)?;
    let roll_ms: Option<i64> = r.opt_int("log.roll.ms", 1, i64::MAX)?;
    let roll_hours: i64 = r.int("log.roll.hours", 1, I32_MAX)?;
    let segment_ms = roll_ms.unwrap_or(roll_hours.saturating_mul(3_600_000));
    let index_interval_bytes = r.int("log.index.interval.bytes", 0, I32_MAX)?;
    let index_size_max_bytes = r.int("log.index.size.max.bytes", 4, I32_MAX)?;
    let retention_check_interval_ms = r.int("log.retention.check.interval.ms", 1, i64::MAX)?;
    let message_max_bytes = r.int("message.max.bytes", 0, I32_MAX)?;
    let socket_request_max_bytes = r.int("socket.request.max.bytes", 1, I32_MAX)?;
    let fetch_max_bytes = r.int("fetch.max.bytes", 1024, I32_MAX)?;
    let fetch_sendfile = r.boolean("strand.fetch.sendfile")?;
    let max_connections = r.int("max.connections", 0, I32_MAX)?;
    let max_connections_per_shard = r.int("strand.max.connections.per.shard", 1, I32_MAX)?;
    let http_max_body_bytes = r.int("strand.http.max.body.bytes", 1024, I32_MAX)?;
    let request_memory_bytes = r.int("strand.request.memory.bytes", 1, i64::MAX)?;
    let max_inflight_requests_per_connection =
        r.int("strand.max.inflight.requests.per.connection", 1, I32_MAX)?;
    let shards_configured: usize = r.int("strand.shards", 0, MAX_SHARDS as i64)?;
    let shards = match shards_configured {
        0 => std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(MAX_SHARDS),
        n => n,
    };
    let http_listener = r.host_port("strand.http.listener")?;
    let admin_listener = r.host_port("strand.admin.listener")?;
    let journal_segment_bytes = r.int("strand.journal.segment.bytes", MIB, i64::MAX)?;
    let journal_recycle_files = r.int("strand.journal.recycle.files", 0, 64)?;
    let journal_direct_min_log_bytes = r.int("strand.journal.direct.min.log.bytes", 0, I32_MAX)?;
    let log_drop_behind_bytes = r.int("strand.log.drop.behind.bytes", 0, i64::MAX)?;
    let log_direct_writes = r.boolean("strand.log.direct.writes")?;
    let log_direct_cache_bytes = r.int("strand.log.direct.cache.bytes", 0, i64::MAX)?;
    let storage_resume_free_bytes = r.int("strand.storage.resume.free.bytes", 0, i64::MAX)?;
    let producer_id_expiration_ms = r.int("producer.id.expiration.ms", 1, I32_MAX)?;
    let offsets_topic_num_partitions = r.int("offsets.topic.num.partitions", 1, 1000)?;
    let group_initial_rebalance_delay_ms = r.int("group.initial.rebalance.delay.ms", 0, I32_MAX)?;
    let group_max_size = r.int("group.max.size", 1, I32_MAX)?;
    let max_request_partition_size_limit = r.int("max.request.partition.size.limit", 1, I32_MAX)?;
    let group_consumer_max_size = r.int("group.consumer.max.size", 1, I32_MAX)?;
    let consumer_sessions = session_settings(
        &mut r,
        [
            "group.consumer.session.timeout.ms",
            "group.consumer.min.session.timeout.ms",
            "group.consumer.max.session.timeout.ms",
        ],
        [
            "group.consumer.heartbeat.interval.ms",
            "group.consumer.min.heartbeat.interval.ms",
            "group.consumer.max.heartbeat.interval.ms",
        ],
    )?;
    let share_sessions = session_settings(
        &mut r,
        [
            "group.share.session.timeout.ms",
            "group.share.min.session.timeout.ms",
            "group.share.max.session.timeout.ms",
        ],
        [
            "group.share.heartbeat.interval.ms",
            "group.share.min.heartbeat.interval.ms",
            "group.share.max.heartbeat.interval.ms",
        ],
    )?;
    let group_share_max_size = r.int("group.share.max.size", 1, 1000)?;
    let group_share_min_record_lock_duration_ms: i32 =
        r.int("group.share.min.record.lock.duration.ms", 1000, 30_000)?;
    let group_share_max_record_lock_duration_ms: i32 =
        r.int("group.share.max.record.lock.duration.ms", 30_000, 3_600_000)?;
    let group_share_record_lock_duration_ms: i32 =
        r.int("group.share.record.lock.duration.ms", 1000, 3_600_000)?;
    if group_share_record_lock_duration_ms < group_share_min_record_lock_duration_ms
        || group_share_record_lock_duration_ms > group_share_max_record_lock_duration_ms
    {
        return Err(r.blame(
            "group.share.record.lock.duration.ms",
            format!(
                "must be between group.share.min.record.lock.duration.ms ({group_share_min_record_lock_duration_ms}) \
                 and group.share.max.record.lock.duration.ms ({group_share_max_record_lock_duration_ms})"
            ),
        ));
    }
    let group_share_delivery_count_limit = r.int("group.share.delivery.count.limit", 2, 10)?;
    let group_share_partition_max_record_locks =
        r.int("group.share.partition.max.record.locks", 100, 10_000)?;
    let errors_deadletterqueue_topic_name_prefix =
        r.required("errors.deadletterqueue.topic.name.prefix", |s| {
            if s.len() > 200
                || !s
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
            {
                Err(
                    "expected a topic name prefix: ASCII alphanumerics, '.', '_' and '-', at most 200"
                        .to_string(),
                )
            } else {
                Ok((s.to_string(), s.to_string()))
            }
        })?;
    let offsets_retention_check_interval_ms = r.int("offsets.retention.check.interval.ms", 1, i64::MAX)?;
    let offset_metadata_max_bytes = r.int("offset.metadata.max.bytes", 0, I32_MAX)?;
    let max_producers_per_partition = r.int("strand.max.producers.per.partition", 1, I32_MAX)?;
    let max_partitions: u32 = r.int("strand.max.partitions", 1, I32_MAX)?;
    if max_partitions < offsets_topic_num_partitions {
        return Err(r.blame(
            "strand.max.partitions",
            format!(
                "must be at least offsets.topic.num.partitions ({offsets_topic_num_partitions}): __consumer_offsets counts too"
            ),
        ));
    }
    let max_partitions_per_topic: u32 = r.int(
        "strand.max.partitions.per.topic",
        1,
        i64::from(MAX_PARTITIONS_PER_TOPIC),
    )?;
    // Only an explicit num.partitions can be above it (the default is 1).
    if num_partitions > max_partitions_per_topic {
        return Err(r.blame(
            "num.partitions",
            format!("must not exceed strand.max.partitions.per.topic ({max_partitions_per_topic})"),
        ));
    }
    let max_partitions_per_request = r.int("strand.max.partitions.per.request", 1, I32_MAX)?;
    let group_min_session_timeout_ms: i32 = r.int("group.min.session.timeout.ms", 0, I32_MAX)?;
    let group_max_session_timeout_ms: i32 = r.int("group.max.session.timeout.ms", 0, I32_MAX)?;
    if group_min_session_timeout_ms > group_max_session_timeout_ms {
        // Blame the key the operator set (the max one if only it was set).
        return Err(if r.explicit.contains_key("group.min.session.timeout.ms") {
            r.blame(
                "group.min.session.timeout.ms",
                format!("must not exceed group.max.session.timeout.ms ({group_max_session_timeout_ms})"),
            )
        } else {
            r.blame(
                "group.max.session.timeout.ms",
                format!("must be at least group.min.session.timeout.ms ({group_min_session_timeout_ms})"),
            )
        });
    }
    let offsets_retention_minutes = r.int("offsets.retention.minutes", 1, I32_MAX)?;

    // Listeners and the cluster.
    let roles = r
        .parse("process.roles", |s| Ok((cluster::parse_roles(s)?, s.to_string())))?
        .flatten();
    let protocol_map = r.required("listener.security.protocol.map", |s| {
        Ok((listeners::parse_protocol_map(s)?, s.to_string()))
    })?;
    let controller_names = r.parse("controller.listener.names", |s| {
        Ok((listeners::parse_names(s)?, s.to_string()))
    })?;
    let endpoints = r.required("listeners", |s| {
        Ok((listeners::parse_endpoints(s)?, s.to_string()))
    })?;
    let advertised = r.parse("advertised.listeners", |s| {
        Ok((listeners::parse_endpoints(s)?, s.to_string()))
    })?;
    let resolved = listeners::resolve(
        endpoints,
        advertised,
        &protocol_map,
        &controller_names.clone().unwrap_or_default(),
        roles.is_none_or(|roles| roles.broker),
        hostname,
    )
    .map_err(|(blame, reason)| match blame {
        Blame::Listeners => r.blame("listeners", reason),
        Blame::Advertised => r.blame("advertised.listeners", reason),
    })?;
    for (key, addr) in [
        ("strand.http.listener", &http_listener),
        ("strand.admin.listener", &admin_listener),
    ] {
        let clash = resolved
            .listeners
            .iter()
            .find(|l| listeners::conflicts(addr, &l.bind))
            .map(|l| l.name.clone());
        let clash = clash.or_else(|| {
            (key == "strand.admin.listener" && listeners::conflicts(addr, &http_listener))
                .then(|| "strand.http.listener".to_string())
        });
        if let Some(other) = clash {
            return Err(r.blame(key, format!("port {} is already used by {other}", addr.port)));
        }
    }
    let controller_names = controller_names.unwrap_or_default();
    let cluster = cluster::build(
        &mut r,
        cluster::Inputs {
            node_id,
            cluster_id: &cluster_id,
            roles,
            protocol_map: &protocol_map,
            controller_names: &controller_names,
            listeners: &resolved,
            other_sockets: [
                ("strand.http.listener", &http_listener),
                ("strand.admin.listener", &admin_listener),
            ],
        },
        warnings,
        notes,
    )?;
    let controller_listeners = resolved
        .controller
        .iter()
        .map(|c| c.configured.to_string())
        .collect();

    Ok(Config {
        node_id,
        cluster_id,
        listeners: resolved.listeners,
        controller_listeners,
        cluster,
        log_dir,
        num_partitions,
        auto_create_topics_enable,
        retention_ms,
        retention_bytes,
        segment_bytes,
        segment_ms,
        index_interval_bytes,
        index_size_max_bytes,
        retention_check_interval_ms,
        message_max_bytes,
        socket_request_max_bytes,
        fetch_max_bytes,
        fetch_sendfile,
        max_connections,
        max_connections_per_shard,
        http_max_body_bytes,
        request_memory_bytes,
        max_inflight_requests_per_connection,
        shards,
        http_listener,
        admin_listener,
        journal_segment_bytes,
        journal_recycle_files,
        journal_direct_min_log_bytes,
        log_drop_behind_bytes,
        log_direct_writes,
        log_direct_cache_bytes,
        storage_resume_free_bytes,
        group_min_session_timeout_ms,
        group_max_session_timeout_ms,
        offsets_retention_minutes,
        producer_id_expiration_ms,
        max_producers_per_partition,
        max_partitions,
        max_partitions_per_topic,
        max_partitions_per_request,
        offsets_topic_num_partitions,
        group_initial_rebalance_delay_ms,
        group_max_size,
        max_request_partition_size_limit,
        group_consumer_max_size,
        group_consumer_session_timeout_ms: consumer_sessions.session.0,
        group_consumer_heartbeat_interval_ms: consumer_sessions.heartbeat.0,
        group_share_session_timeout_ms: share_sessions.session.0,
        group_share_heartbeat_interval_ms: share_sessions.heartbeat.0,
        group_consumer_session_timeout_bounds_ms: consumer_sessions.session.1,
        group_consumer_heartbeat_interval_bounds_ms: consumer_sessions.heartbeat.1,
        group_share_session_timeout_bounds_ms: share_sessions.session.1,
        group_share_heartbeat_interval_bounds_ms: share_sessions.heartbeat.1,
        group_share_max_size,
        group_share_record_lock_duration_ms,
        group_share_min_record_lock_duration_ms,
        group_share_max_record_lock_duration_ms,
        group_share_delivery_count_limit,
        group_share_partition_max_record_locks,
        errors_deadletterqueue_topic_name_prefix,
        offsets_retention_check_interval_ms,
        offset_metadata_max_bytes,
        explicit: r.explicit,
    })
}

impl Default for Config {
    /// The built-in defaults (no file, no environment, no overrides).
    fn default() -> Config {
        match load_quietly(None, Vec::new(), &[]) {
            Ok(loaded) => loaded.config,
            // The defaults are fixed text checked by a unit test: failing here is a bug.
            Err(e) => panic!("built-in config defaults are invalid: {e}"),
        }
    }
}

impl Config {
    /// Whether `key` was set explicitly (file, environment or override) and is in effect.
    /// Aliases are reported under their canonical key (`node.id`, `log.dirs`).
    pub fn is_set(&self, key: &str) -> bool {
        self.explicit.contains_key(key)
    }

    /// Where an explicitly set key came from.
    pub fn origin(&self, key: &str) -> Option<&Origin> {
        self.explicit.get(key).map(|e| &e.origin)
    }

    /// DescribeConfigs rows for the BROKER resource, sorted by name. Every key is read-only
    /// (there is no dynamic broker config yet); values are as loaded.
    pub fn broker_entries(&self) -> Vec<ConfigEntry> {
        let mut entries: Vec<ConfigEntry> = BROKER_KEYS
            .iter()
            .map(|key| {
                let lookup = match key.default {
                    Mirror(target) => target,
                    _ => key.name,
                };
                let (value, source) = match (self.explicit.get(lookup), broker_key(lookup).map(|k| k.default))
                {
                    (Some(e), _) => (Some(e.text.clone()), ConfigSource::StaticBrokerConfig),
                    (None, Some(Text(text))) => (Some(text.to_string()), ConfigSource::DefaultConfig),
                    (None, _) => (None, ConfigSource::DefaultConfig),
                };
                ConfigEntry {
                    name: key.name,
                    value,
                    source,
                    read_only: true,
                    sensitive: false,
                    config_type: key.ty,
                    documentation: key.doc,
                }
            })
            .collect();
        entries.sort_by_key(|e| e.name);
        entries
    }

    /// The storage settings of a topic without overrides.
    pub fn default_log_settings(&self) -> LogSettings {
        TopicConfig::default().log_settings(self)
    }
}

#[cfg(test)]
mod tests;
