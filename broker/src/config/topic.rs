//! Per-topic configuration overrides (`retention.ms`, `segment.bytes`, ...) over broker defaults,
//! and the effective [`LogSettings`] the storage layer takes.

use std::collections::BTreeMap;
use std::fmt;

use super::entry::{
    apply_overrides_text, override_entries, overrides_text, ConfigEntry, ConfigSource, ConfigType, KeyView,
    Unit,
};
use super::Config;

/// Which timestamp a partition stores for each batch (`message.timestamp.type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TimestampType {
    /// The producer's timestamp.
    CreateTime,
    /// The broker's clock at append.
    LogAppendTime,
}

/// `cleanup.policy`. Compaction is not implemented: a compacting policy is stored and reported,
/// and the log is only deleted by retention when the policy includes `delete`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CleanupPolicy {
    /// An empty list (Kafka 4.2, KAFKA-19112): neither; the log is kept until DeleteRecords
    /// moves its start.
    Neither,
    /// `delete`: retention by time and size.
    Delete,
    /// `compact` (not implemented: the log is kept whole).
    Compact,
    /// `compact,delete` (compaction not implemented; retention applies).
    CompactDelete,
}

impl CleanupPolicy {
    /// Whether retention deletes old segments under this policy.
    pub fn deletes(self) -> bool {
        matches!(self, CleanupPolicy::Delete | CleanupPolicy::CompactDelete)
    }

    /// Whether the policy asks for compaction (which Strand does not do yet).
    pub fn compacts(self) -> bool {
        matches!(self, CleanupPolicy::Compact | CleanupPolicy::CompactDelete)
    }

    fn from_text(text: &str) -> Option<CleanupPolicy> {
        match text {
            "" => Some(CleanupPolicy::Neither),
            "delete" => Some(CleanupPolicy::Delete),
            "compact" => Some(CleanupPolicy::Compact),
            "compact,delete" | "delete,compact" => Some(CleanupPolicy::CompactDelete),
            _ => None,
        }
    }
}

/// `compression.type` of a topic: `producer` keeps what the producer sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CompressionType {
    /// Keep the producer's compression.
    Producer,
    /// Store uncompressed.
    Uncompressed,
    /// gzip.
    Gzip,
    /// Snappy.
    Snappy,
    /// LZ4.
    Lz4,
    /// Zstandard.
    Zstd,
}

/// The effective storage and append settings of one topic: its overrides over broker defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogSettings {
    /// Delete segments older than this; `None` = unlimited. Applies only if `cleanup_policy.deletes()`.
    pub retention_ms: Option<i64>,
    /// Delete old segments beyond this partition size; `None` = unlimited. Applies only if
    /// `cleanup_policy.deletes()`.
    pub retention_bytes: Option<u64>,
    /// Roll a segment when it reaches this size.
    pub segment_bytes: u64,
    /// Roll a segment when its first batch is this old.
    pub segment_ms: i64,
    /// Maximum size of a segment's offset index.
    pub segment_index_bytes: u64,
    /// Add an index entry every this many bytes of log.
    pub index_interval_bytes: u64,
    /// Largest record batch accepted (after compression).
    pub max_message_bytes: u32,
    /// `delete`, `compact` or both (compaction not implemented).
    pub cleanup_policy: CleanupPolicy,
    /// CreateTime or LogAppendTime.
    pub timestamp_type: TimestampType,
    /// Compression applied on append (`Producer` = as sent).
    pub compression_type: CompressionType,
    /// Delay before a deleted segment's files are removed.
    pub file_delete_delay_ms: i64,
    /// Largest allowed distance of a CreateTime timestamp into the past.
    pub message_timestamp_before_max_ms: i64,
    /// Largest allowed distance of a CreateTime timestamp into the future.
    pub message_timestamp_after_max_ms: i64,
    /// In-sync replicas an acks=all produce to a replicated partition needs.
    pub min_insync_replicas: u32,
}

/// Why a topic config key or value was refused. Reported to clients as INVALID_CONFIG; the
/// Display text is the Kafka-style error message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TopicConfigError {
    /// The key is not a topic config Strand knows.
    #[error("Unknown topic config name: {0}")]
    UnknownKey(String),
    /// The value does not fit the key.
    #[error("Invalid value {value} for configuration {key}: {reason}")]
    InvalidValue {
        /// The key.
        key: String,
        /// The value as given.
        value: String,
        /// What is wrong (Kafka's wording).
        reason: String,
    },
    /// A line of persisted topic config text is not `key=value`.
    #[error("Invalid topic config line: {0}")]
    BadLine(String),
}

/// A validated override value.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Value {
    Long(i64),
    Bool(bool),
    /// One of a fixed set of strings (normalised).
    Text(&'static str),
    /// Free text (a topic name), or a number kept in its normalised text form (a double).
    Str(String),
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Long(v) => write!(f, "{v}"),
            Value::Bool(v) => write!(f, "{v}"),
            Value::Text(v) => f.write_str(v),
            Value::Str(v) => f.write_str(v),
        }
    }
}

/// How a topic key's value is checked.
#[derive(Clone, Copy, Debug)]
enum Kind {
    /// A decimal integer within `[min, max]`.
    Integer {
        min: i64,
        max: i64,
    },
    Bool,
    /// One of these strings (case-sensitive, as in Kafka).
    OneOf(&'static [&'static str]),
    /// `cleanup.policy`: a list of `compact`/`delete`.
    Policy,
    /// A finite decimal number within `[min, max]`.
    Double {
        min: f64,
        max: f64,
    },
    /// A topic name, or empty for "the default".
    TopicName,
}

/// One topic config key.
struct TopicKey {
    name: &'static str,
    ty: ConfigType,
    kind: Kind,
    /// Broker keys that set this key's default (a topic default reported as STATIC_BROKER_CONFIG
    /// when any of them was set explicitly).
    synonyms: &'static [&'static str],
    /// The default as Kafka prints it, given the broker config.
    default: fn(&Config) -> String,
    unit: Unit,
    doc: &'static str,
}

const I32_MAX: i64 = i32::MAX as i64;

const RETENTION_MS: &str = "retention.ms";
const RETENTION_BYTES: &str = "retention.bytes";
const SEGMENT_BYTES: &str = "segment.bytes";
const SEGMENT_MS: &str = "segment.ms";
const SEGMENT_INDEX_BYTES: &str = "segment.index.bytes";
const INDEX_INTERVAL_BYTES: &str = "index.interval.bytes";
const MAX_MESSAGE_BYTES: &str = "max.message.bytes";
const CLEANUP_POLICY: &str = "cleanup.policy";
/// `cleanup.policy` when a topic does not set it.
pub const CLEANUP_POLICY_DEFAULT: &str = "delete";
const TIMESTAMP_TYPE: &str = "message.timestamp.type";
const COMPRESSION_TYPE: &str = "compression.type";
const FILE_DELETE_DELAY_MS: &str = "file.delete.delay.ms";
const TIMESTAMP_BEFORE_MAX_MS: &str = "message.timestamp.before.max.ms";
const TIMESTAMP_AFTER_MAX_MS: &str = "message.timestamp.after.max.ms";
const MIN_INSYNC_REPLICAS: &str = "min.insync.replicas";

const QUEUE_MAX_ATTEMPTS: &str = "strand.queue.max.attempts";
const QUEUE_VISIBILITY_MS: &str = "strand.queue.visibility.timeout.ms";
const QUEUE_BACKOFF_BASE_MS: &str = "strand.queue.backoff.base.ms";
const QUEUE_BACKOFF_MULTIPLIER: &str = "strand.queue.backoff.multiplier";
const QUEUE_BACKOFF_MAX_MS: &str = "strand.queue.backoff.max.ms";
const QUEUE_DEAD_LETTER_TOPIC: &str = "strand.queue.dead.letter.topic";
const QUEUE_ORDERING: &str = "strand.queue.ordering";
const QUEUE_DEDUP_WINDOW_MS: &str = "strand.queue.dedup.window.ms";

/// The topic config keys of a queue (their values are a [`QueueSettings`]).
pub const QUEUE_KEYS: &[&str] = &[
    QUEUE_MAX_ATTEMPTS,
    QUEUE_VISIBILITY_MS,
    QUEUE_BACKOFF_BASE_MS,
    QUEUE_BACKOFF_MULTIPLIER,
    QUEUE_BACKOFF_MAX_MS,
    QUEUE_DEAD_LETTER_TOPIC,
    QUEUE_ORDERING,
    QUEUE_DEDUP_WINDOW_MS,
];

const NINETY_DAYS_MS: i64 = 90 * 24 * 3600 * 1000;
const ORDERING_NAMES: &[&str] = &["none", "key"];

/// A topic's queue settings (`strand.queue.*` topic configs): how the queue engine delivers
/// its messages over HTTP. Ranges are checked per key; combinations (base <= max) by the engine.
#[derive(Clone, Debug, PartialEq)]
pub struct QueueSettings {
    /// Deliveries before a failing message is dead-lettered.
    pub max_attempts: u32,
    /// Default lease length.
    pub visibility_timeout_ms: u64,
    /// Retry backoff: `min(max, base * multiplier^(attempt-1))`.
    pub backoff_base_ms: u64,
    pub backoff_multiplier: f64,
    pub backoff_max_ms: u64,
    /// Where dead letters go; `None` = `{topic}.dlq`.
    pub dead_letter_topic: Option<String>,
    /// `ordering=key`: one message per key in flight, in offset order.
    pub ordering_by_key: bool,
    /// How long a dedup token is remembered; 0 disables dedup.
    pub dedup_window_ms: u64,
}

impl Default for QueueSettings {
    fn default() -> Self {
        QueueSettings {
            max_attempts: 5,
            visibility_timeout_ms: 30_000,
            backoff_base_ms: 1_000,
            backoff_multiplier: 2.0,
            backoff_max_ms: 900_000,
            dead_letter_topic: None,
            ordering_by_key: false,
            dedup_window_ms: 300_000,
        }
    }
}

impl QueueSettings {
    /// The dead-letter topic of queue `topic`.
    pub fn dead_letter_topic_of(&self, topic: &str) -> String {
        self.dead_letter_topic
            .clone()
            .unwrap_or_else(|| format!("{topic}{DEAD_LETTER_SUFFIX}"))
    }
}

/// Suffix of a queue's default dead-letter topic.
pub const DEAD_LETTER_SUFFIX: &str = ".dlq";

const DEFAULT_FILE_DELETE_DELAY_MS: i64 = 60_000;
const DEFAULT_TIMESTAMP_AFTER_MAX_MS: i64 = 3_600_000;

const COMPRESSION_NAMES: &[&str] = &["uncompressed", "zstd", "lz4", "snappy", "gzip", "producer"];
const TIMESTAMP_NAMES: &[&str] = &["CreateTime", "LogAppendTime"];

/// The topic config keys Strand accepts. Extend here.
static TOPIC_KEYS: &[TopicKey] = &[
    TopicKey {
        name: RETENTION_MS,
        ty: ConfigType::Long,
        unit: Unit::Milliseconds,
        kind: Kind::Integer {
            min: -1,
            max: i64::MAX,
        },
        synonyms: &["log.retention.ms", "log.retention.minutes", "log.retention.hours"],
        default: |b| b.retention_ms.unwrap_or(-1).to_string(),
        doc: "Delete log segments older than this many milliseconds; -1 means no time limit.",
    },
    TopicKey {
        name: RETENTION_BYTES,
        ty: ConfigType::Long,
        unit: Unit::Bytes,
        kind: Kind::Integer {
            min: -1,
            max: i64::MAX,
        },
        synonyms: &["log.retention.bytes"],
        default: |b| {
            b.retention_bytes
                .map_or_else(|| "-1".to_string(), |v| v.to_string())
        },
        doc: "Delete old log segments when a partition is larger than this; -1 means no size limit.",
    },
    TopicKey {
        name: SEGMENT_BYTES,
        ty: ConfigType::Int,
        unit: Unit::Bytes,
        kind: Kind::Integer {
            min: 14,
            max: I32_MAX,
        },
        synonyms: &["log.segment.bytes"],
        default: |b| b.segment_bytes.to_string(),
        doc: "Roll a new log segment when the active one reaches this size.",
    },
    TopicKey {
        name: SEGMENT_MS,
        ty: ConfigType::Long,
        unit: Unit::Milliseconds,
        kind: Kind::Integer {
            min: 1,
            max: i64::MAX,
        },
        synonyms: &["log.roll.ms", "log.roll.hours"],
        default: |b| b.segment_ms.to_string(),
        doc: "Roll a new log segment after this many milliseconds even if it is not full.",
    },
    TopicKey {
        name: SEGMENT_INDEX_BYTES,
        ty: ConfigType::Int,
        unit: Unit::Bytes,
        kind: Kind::Integer { min: 4, max: I32_MAX },
        synonyms: &["log.index.size.max.bytes"],
        default: |b| b.index_size_max_bytes.to_string(),
        doc: "Maximum size of a segment's offset index.",
    },
    TopicKey {
        name: INDEX_INTERVAL_BYTES,
        ty: ConfigType::Int,
        unit: Unit::Bytes,
        kind: Kind::Integer { min: 0, max: I32_MAX },
        synonyms: &["log.index.interval.bytes"],
        default: |b| b.index_interval_bytes.to_string(),
        doc: "Add an offset index entry every this many bytes of log.",
    },
    TopicKey {
        name: MAX_MESSAGE_BYTES,
        ty: ConfigType::Int,
        unit: Unit::Bytes,
        kind: Kind::Integer { min: 0, max: I32_MAX },
        synonyms: &["message.max.bytes"],
        default: |b| b.message_max_bytes.to_string(),
        doc: "Largest record batch size accepted, after compression.",
    },
    TopicKey {
        name: CLEANUP_POLICY,
        ty: ConfigType::List,
        unit: Unit::None,
        kind: Kind::Policy,
        synonyms: &[],
        default: |_| CLEANUP_POLICY_DEFAULT.to_string(),
        doc: "delete, compact, compact,delete, or empty for neither (the log is then kept until DeleteRecords moves its start). Compaction is not implemented yet.",
    },
    TopicKey {
        name: TIMESTAMP_TYPE,
        ty: ConfigType::String,
        unit: Unit::None,
        kind: Kind::OneOf(TIMESTAMP_NAMES),
        synonyms: &[],
        default: |_| "CreateTime".to_string(),
        doc: "CreateTime keeps the producer's timestamp; LogAppendTime uses the broker's clock.",
    },
    TopicKey {
        name: MIN_INSYNC_REPLICAS,
        ty: ConfigType::Int,
        unit: Unit::Count("replicas"),
        kind: Kind::Integer { min: 1, max: I32_MAX },
        synonyms: &["min.insync.replicas"],
        default: |b| b.cluster.min_insync_replicas.to_string(),
        doc: "In-sync replicas an acks=all produce to a replicated partition needs, else NOT_ENOUGH_REPLICAS (a standalone node's partitions are not replicated: not applied).",
    },
    TopicKey {
        name: COMPRESSION_TYPE,
        ty: ConfigType::String,
        unit: Unit::None,
        kind: Kind::OneOf(COMPRESSION_NAMES),
        synonyms: &[],
        default: |_| "producer".to_string(),
        doc: "Compression of stored batches; producer keeps what the producer sent.",
    },
    TopicKey {
        name: FILE_DELETE_DELAY_MS,
        ty: ConfigType::Long,
        unit: Unit::Milliseconds,
        kind: Kind::Integer {
            min: 0,
            max: i64::MAX,
        },
        synonyms: &[],
        default: |_| DEFAULT_FILE_DELETE_DELAY_MS.to_string(),
        doc: "Wait this long before removing the files of a deleted segment.",
    },
    TopicKey {
        name: "flush.messages",
        ty: ConfigType::Long,
        unit: Unit::Count("messages"),
        kind: Kind::Integer {
            min: 1,
            max: i64::MAX,
        },
        synonyms: &[],
        default: |_| i64::MAX.to_string(),
        doc: "Accepted for compatibility; Strand fsyncs before every acknowledgement.",
    },
    TopicKey {
        name: "flush.ms",
        ty: ConfigType::Long,
        unit: Unit::Milliseconds,
        kind: Kind::Integer {
            min: 0,
            max: i64::MAX,
        },
        synonyms: &[],
        default: |_| i64::MAX.to_string(),
        doc: "Accepted for compatibility; Strand fsyncs before every acknowledgement.",
    },
    TopicKey {
        name: "unclean.leader.election.enable",
        ty: ConfigType::Boolean,
        unit: Unit::None,
        kind: Kind::Bool,
        synonyms: &[],
        default: |_| "false".to_string(),
        doc: "Accepted for compatibility; a single node has no out-of-sync replicas.",
    },
    TopicKey {
        name: TIMESTAMP_BEFORE_MAX_MS,
        ty: ConfigType::Long,
        unit: Unit::Milliseconds,
        kind: Kind::Integer {
            min: 0,
            max: i64::MAX,
        },
        synonyms: &[],
        default: |_| i64::MAX.to_string(),
        doc: "Reject CreateTime timestamps further than this in the past.",
    },
    TopicKey {
        name: TIMESTAMP_AFTER_MAX_MS,
        ty: ConfigType::Long,
        unit: Unit::Milliseconds,
        kind: Kind::Integer {
            min: 0,
            max: i64::MAX,
        },
        synonyms: &[],
        default: |_| DEFAULT_TIMESTAMP_AFTER_MAX_MS.to_string(),
        doc: "Reject CreateTime timestamps further than this in the future.",
    },
    TopicKey {
        name: QUEUE_MAX_ATTEMPTS,
        ty: ConfigType::Int,
        unit: Unit::Count("deliveries"),
        kind: Kind::Integer { min: 1, max: 1000 },
        synonyms: &[],
        default: |_| QueueSettings::default().max_attempts.to_string(),
        doc: "Queue: deliveries before a failing message is dead-lettered.",
    },
    TopicKey {
        name: QUEUE_VISIBILITY_MS,
        ty: ConfigType::Long,
        unit: Unit::Milliseconds,
        kind: Kind::Integer {
            min: 1_000,
            max: 12 * 3600 * 1000,
        },
        synonyms: &[],
        default: |_| QueueSettings::default().visibility_timeout_ms.to_string(),
        doc: "Queue: default lease (visibility timeout) length.",
    },
    TopicKey {
        name: QUEUE_BACKOFF_BASE_MS,
        ty: ConfigType::Long,
        unit: Unit::Milliseconds,
        kind: Kind::Integer {
            min: 0,
            max: NINETY_DAYS_MS,
        },
        synonyms: &[],
        default: |_| QueueSettings::default().backoff_base_ms.to_string(),
        doc: "Queue: retry delay after the first failed attempt (0: retry at once).",
    },
    TopicKey {
        name: QUEUE_BACKOFF_MULTIPLIER,
        ty: ConfigType::Double,
        unit: Unit::Factor,
        kind: Kind::Double { min: 1.0, max: 100.0 },
        synonyms: &[],
        default: |_| format_double(QueueSettings::default().backoff_multiplier),
        doc: "Queue: factor between the retry delays of consecutive attempts.",
    },
    TopicKey {
        name: QUEUE_BACKOFF_MAX_MS,
        ty: ConfigType::Long,
        unit: Unit::Milliseconds,
        kind: Kind::Integer {
            min: 0,
            max: NINETY_DAYS_MS,
        },
        synonyms: &[],
        default: |_| QueueSettings::default().backoff_max_ms.to_string(),
        doc: "Queue: longest retry delay.",
    },
    TopicKey {
        name: QUEUE_DEAD_LETTER_TOPIC,
        ty: ConfigType::String,
        unit: Unit::None,
        kind: Kind::TopicName,
        synonyms: &[],
        default: |_| String::new(),
        doc: "Queue: topic that receives dead letters; empty means <topic>.dlq. Must be a topic clients may produce to, not an internal topic or a reserved name.",
    },
    TopicKey {
        name: QUEUE_ORDERING,
        ty: ConfigType::String,
        unit: Unit::None,
        kind: Kind::OneOf(ORDERING_NAMES),
        synonyms: &[],
        default: |_| "none".to_string(),
        doc: "Queue: none, or key (one message per key in flight, in offset order).",
    },
    TopicKey {
        name: QUEUE_DEDUP_WINDOW_MS,
        ty: ConfigType::Long,
        unit: Unit::Milliseconds,
        kind: Kind::Integer {
            min: 0,
            max: 24 * 3600 * 1000,
        },
        synonyms: &[],
        default: |_| QueueSettings::default().dedup_window_ms.to_string(),
        doc: "Queue: how long a publish dedup token is remembered; 0 disables dedup.",
    },
];

/// The keys, as DescribeConfigs answers them and `docs/configuration.md` lists them.
pub(super) fn key_views() -> impl Iterator<Item = KeyView> {
    TOPIC_KEYS.iter().map(|k| KeyView {
        name: k.name,
        ty: k.ty,
        unit: k.unit,
        doc: k.doc,
        synonyms: k.synonyms,
        default: k.default,
    })
}

fn find_key(name: &str) -> Option<&'static TopicKey> {
    TOPIC_KEYS.iter().find(|k| k.name == name)
}

/// Checks `value` for `key` and returns its normalised form.
fn check(key: &TopicKey, value: &str) -> Result<Value, TopicConfigError> {
    let trimmed = value.trim();
    let invalid = |reason: String| TopicConfigError::InvalidValue {
        key: key.name.to_string(),
        value: value.to_string(),
        reason,
    };
    match key.kind {
        Kind::Integer { min, max } => {
            let v = trimmed
                .parse::<i64>()
                .ok()
                .filter(|v| *v <= max)
                .ok_or_else(|| invalid(format!("Not a number of type {}", key.ty.name())))?;
            if v < min {
                return Err(invalid(format!("Value must be at least {min}")));
            }
            Ok(Value::Long(v))
        }
        Kind::Bool => {
            if trimmed.eq_ignore_ascii_case("true") {
                Ok(Value::Bool(true))
            } else if trimmed.eq_ignore_ascii_case("false") {
                Ok(Value::Bool(false))
            } else {
                Err(invalid("Expected value to be either true or false".to_string()))
            }
        }
        Kind::OneOf(names) => names
            .iter()
            .find(|n| **n == trimmed)
            .map(|n| Value::Text(n))
            .ok_or_else(|| invalid(format!("String must be one of: {}", names.join(", ")))),
        // An empty list is neither policy (Kafka 4.2, KAFKA-19112).
        Kind::Policy if trimmed.is_empty() => Ok(Value::Text("")),
        Kind::Policy => {
            let refused = || invalid("String must be one of: compact, delete".to_string());
            let (mut compact, mut delete) = (false, false);
            // An empty item ("delete,") is refused.
            for item in trimmed.split(',').map(str::trim) {
                match item {
                    "compact" => compact = true,
                    "delete" => delete = true,
                    _ => return Err(refused()),
                }
            }
            // Both: in the order given, as Kafka keeps a list.
            match (compact, delete) {
                (true, true) if trimmed.starts_with("compact") => Ok(Value::Text("compact,delete")),
                (true, true) => Ok(Value::Text("delete,compact")),
                (true, false) => Ok(Value::Text("compact")),
                (false, true) => Ok(Value::Text("delete")),
                (false, false) => Err(refused()),
            }
        }
        Kind::Double { min, max } => {
            let v = trimmed
                .parse::<f64>()
                .ok()
                .filter(|v| v.is_finite())
                .ok_or_else(|| invalid("Not a number of type DOUBLE".to_string()))?;
            if v < min {
                return Err(invalid(format!("Value must be at least {min}")));
            }
            if v > max {
                return Err(invalid(format!("Value must be no more than {max}")));
            }
            Ok(Value::Str(format_double(v)))
        }
        Kind::TopicName => {
            if !trimmed.is_empty() {
                strand_protocol::types::validate_topic_name(trimmed)
                    .map_err(|e| invalid(format!("Not a valid topic name: {e}")))?;
            }
            Ok(Value::Str(trimmed.to_string()))
        }
    }
}

/// A double as Kafka prints it (`2.0`, `1.5`).
fn format_double(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{v:.1}")
    } else {
        format!("{v}")
    }
}

/// Per-topic overrides of broker defaults, validated. Keys absent here take the broker default.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TopicConfig {
    overrides: BTreeMap<&'static str, Value>,
}

impl TopicConfig {
    /// Whether `key` is a topic config key Strand knows.
    pub fn is_known_key(key: &str) -> bool {
        find_key(key).is_some()
    }

    /// Validates one (key, value) pair as CreateTopics/AlterConfigs must. Errors carry Kafka's
    /// wording and map to INVALID_CONFIG.
    pub fn validate(key: &str, value: &str) -> Result<(), TopicConfigError> {
        let def = find_key(key).ok_or_else(|| TopicConfigError::UnknownKey(key.to_string()))?;
        check(def, value).map(|_| ())
    }

    /// Builds overrides from (key, value) pairs, e.g. the configs of a CreateTopics request.
    pub fn from_pairs<'a>(
        pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<TopicConfig, TopicConfigError> {
        let mut config = TopicConfig::default();
        for (key, value) in pairs {
            config.set(key, value)?;
        }
        Ok(config)
    }

    /// Sets (validates and stores) one override.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), TopicConfigError> {
        let def = find_key(key).ok_or_else(|| TopicConfigError::UnknownKey(key.to_string()))?;
        let value = check(def, value)?;
        self.overrides.insert(def.name, value);
        Ok(())
    }

    /// Removes an override (back to the broker default). Returns whether one was present.
    pub fn remove(&mut self, key: &str) -> Result<bool, TopicConfigError> {
        let def = find_key(key).ok_or_else(|| TopicConfigError::UnknownKey(key.to_string()))?;
        Ok(self.overrides.remove(def.name).is_some())
    }

    /// The override for `key`, normalised as Kafka prints it, if there is one.
    pub fn get(&self, key: &str) -> Option<String> {
        self.overrides.get(key).map(Value::to_string)
    }

    /// All overrides in key order.
    pub fn overrides(&self) -> Vec<(&'static str, String)> {
        self.overrides.iter().map(|(k, v)| (*k, v.to_string())).collect()
    }

    /// Whether there are no overrides.
    pub fn is_empty(&self) -> bool {
        self.overrides.is_empty()
    }

    fn long(&self, key: &str) -> Option<i64> {
        match self.overrides.get(key) {
            Some(Value::Long(v)) => Some(*v),
            _ => None,
        }
    }

    fn text(&self, key: &str) -> Option<&'static str> {
        match self.overrides.get(key) {
            Some(Value::Text(v)) => Some(v),
            _ => None,
        }
    }

    fn string(&self, key: &str) -> Option<&str> {
        match self.overrides.get(key) {
            Some(Value::Str(v)) => Some(v),
            _ => None,
        }
    }

    /// The queue settings of this topic (`strand.queue.*`), for the queue engine.
    pub fn queue_settings(&self) -> QueueSettings {
        let d = QueueSettings::default();
        let u64_or = |key: &str, default: u64| {
            self.long(key)
                .and_then(|v| u64::try_from(v).ok())
                .unwrap_or(default)
        };
        QueueSettings {
            max_attempts: self
                .long(QUEUE_MAX_ATTEMPTS)
                .and_then(|v| u32::try_from(v).ok())
                .unwrap_or(d.max_attempts),
            visibility_timeout_ms: u64_or(QUEUE_VISIBILITY_MS, d.visibility_timeout_ms),
            backoff_base_ms: u64_or(QUEUE_BACKOFF_BASE_MS, d.backoff_base_ms),
            backoff_multiplier: self
                .string(QUEUE_BACKOFF_MULTIPLIER)
                .and_then(|v| v.parse().ok())
                .unwrap_or(d.backoff_multiplier),
            backoff_max_ms: u64_or(QUEUE_BACKOFF_MAX_MS, d.backoff_max_ms),
            dead_letter_topic: self
                .string(QUEUE_DEAD_LETTER_TOPIC)
                .filter(|t| !t.is_empty())
                .map(str::to_owned),
            ordering_by_key: self.text(QUEUE_ORDERING) == Some("key"),
            dedup_window_ms: u64_or(QUEUE_DEDUP_WINDOW_MS, d.dedup_window_ms),
        }
    }

    /// The effective storage settings: overrides over the broker's defaults.
    pub fn log_settings(&self, broker: &Config) -> LogSettings {
        let u32_or = |key: &str, default: u32| {
            self.long(key)
                .and_then(|v| u32::try_from(v).ok())
                .unwrap_or(default)
        };
        let u64_or = |key: &str, default: u32| u64::from(u32_or(key, default));
        let timestamp_type = match self.text(TIMESTAMP_TYPE) {
            Some("LogAppendTime") => TimestampType::LogAppendTime,
            _ => TimestampType::CreateTime,
        };
        let compression_type = match self.text(COMPRESSION_TYPE) {
            Some("uncompressed") => CompressionType::Uncompressed,
            Some("gzip") => CompressionType::Gzip,
            Some("snappy") => CompressionType::Snappy,
            Some("lz4") => CompressionType::Lz4,
            Some("zstd") => CompressionType::Zstd,
            _ => CompressionType::Producer,
        };
        LogSettings {
            retention_ms: match self.long(RETENTION_MS) {
                Some(v) => (v >= 0).then_some(v),
                None => broker.retention_ms,
            },
            retention_bytes: match self.long(RETENTION_BYTES) {
                Some(v) => u64::try_from(v).ok(),
                None => broker.retention_bytes,
            },
            segment_bytes: u64_or(SEGMENT_BYTES, broker.segment_bytes),
            segment_ms: self.long(SEGMENT_MS).unwrap_or(broker.segment_ms),
            segment_index_bytes: u64_or(SEGMENT_INDEX_BYTES, broker.index_size_max_bytes),
            index_interval_bytes: u64_or(INDEX_INTERVAL_BYTES, broker.index_interval_bytes),
            max_message_bytes: u32_or(MAX_MESSAGE_BYTES, broker.message_max_bytes),
            cleanup_policy: self
                .text(CLEANUP_POLICY)
                .and_then(CleanupPolicy::from_text)
                .unwrap_or(CleanupPolicy::Delete),
            timestamp_type,
            compression_type,
            file_delete_delay_ms: self
                .long(FILE_DELETE_DELAY_MS)
                .unwrap_or(DEFAULT_FILE_DELETE_DELAY_MS),
            message_timestamp_before_max_ms: self.long(TIMESTAMP_BEFORE_MAX_MS).unwrap_or(i64::MAX),
            message_timestamp_after_max_ms: self
                .long(TIMESTAMP_AFTER_MAX_MS)
                .unwrap_or(DEFAULT_TIMESTAMP_AFTER_MAX_MS),
            min_insync_replicas: u32_or(MIN_INSYNC_REPLICAS, broker.cluster.min_insync_replicas),
        }
    }

    /// DescribeConfigs rows for a TOPIC resource: every topic key with its effective value.
    /// Overrides are DYNAMIC_TOPIC_CONFIG; defaults are STATIC_BROKER_CONFIG when the broker key
    /// behind them was set explicitly, DEFAULT_CONFIG otherwise.
    pub fn entries(&self, broker: &Config) -> Vec<ConfigEntry> {
        override_entries(
            key_views(),
            |name| self.overrides.get(name).map(|v| v.to_string()),
            ConfigSource::DynamicTopicConfig,
            broker,
        )
    }

    /// Stable text form: one `key=value` line per override, in key order.
    pub fn to_text(&self) -> String {
        overrides_text(&self.overrides)
    }

    /// Parses [`TopicConfig::to_text`] output (blank lines and `#` comments are skipped); every pair
    /// is validated again.
    pub fn from_text(text: &str) -> Result<TopicConfig, TopicConfigError> {
        let mut config = TopicConfig::default();
        apply_overrides_text(text, TopicConfigError::BadLine, |k, v| config.set(k, v))?;
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::load;

    fn broker(overrides: &[&str]) -> Config {
        let overrides: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
        load(None, Vec::new(), &overrides).unwrap().config
    }

    #[test]
    fn validation_messages() {
        assert_eq!(TopicConfig::validate("retention.ms", "1000"), Ok(()));
        assert_eq!(TopicConfig::validate("retention.ms", "-1"), Ok(()));
        let cases = [
            ("no.such.key", "1", "Unknown topic config name: no.such.key"),
            (
                "retention.ms",
                "abc",
                "Invalid value abc for configuration retention.ms: Not a number of type LONG",
            ),
            (
                "retention.ms",
                "-2",
                "Invalid value -2 for configuration retention.ms: Value must be at least -1",
            ),
            ("retention.ms", "1e3", "Not a number of type LONG"),
            ("segment.bytes", "13", "Value must be at least 14"),
            ("segment.bytes", "2147483648", "Not a number of type INT"),
            ("segment.ms", "0", "Value must be at least 1"),
            (
                "cleanup.policy",
                "remove",
                "String must be one of: compact, delete",
            ),
            (
                "cleanup.policy",
                "delete,",
                "String must be one of: compact, delete",
            ),
            (
                "message.timestamp.type",
                "createtime",
                "String must be one of: CreateTime, LogAppendTime",
            ),
            (
                "compression.type",
                "brotli",
                "String must be one of: uncompressed, zstd, lz4, snappy, gzip, producer",
            ),
            (
                "unclean.leader.election.enable",
                "yes",
                "Expected value to be either true or false",
            ),
            ("min.insync.replicas", "0", "Value must be at least 1"),
            ("flush.messages", "0", "Value must be at least 1"),
            ("message.timestamp.after.max.ms", "-1", "Value must be at least 0"),
        ];
        for (key, value, expected) in cases {
            let err = TopicConfig::validate(key, value).unwrap_err().to_string();
            assert!(err.contains(expected), "{key}={value}: {err}");
        }
    }

    #[test]
    fn every_key_accepts_its_default() {
        let b = broker(&[]);
        for key in TOPIC_KEYS {
            let default = (key.default)(&b);
            assert_eq!(
                TopicConfig::validate(key.name, &default),
                Ok(()),
                "{}={default}",
                key.name
            );
        }
    }

    #[test]
    fn effective_settings_follow_broker_then_overrides() {
        let b = broker(&[
            "log.retention.hours=1",
            "log.segment.bytes=1024",
            "log.retention.bytes=5000",
        ]);
        let defaults = TopicConfig::default().log_settings(&b);
        assert_eq!(defaults.retention_ms, Some(3_600_000));
        assert_eq!(defaults.retention_bytes, Some(5000));
        assert_eq!(defaults.segment_bytes, 1024);
        assert_eq!(defaults.segment_ms, 168 * 3_600_000);
        assert_eq!(defaults.index_interval_bytes, 4096);
        assert_eq!(defaults.segment_index_bytes, 10_485_760);
        assert_eq!(defaults.max_message_bytes, 1_048_588);
        assert_eq!(defaults.cleanup_policy, CleanupPolicy::Delete);
        assert_eq!(defaults.timestamp_type, TimestampType::CreateTime);
        assert_eq!(defaults.compression_type, CompressionType::Producer);
        assert_eq!(defaults.file_delete_delay_ms, 60_000);
        assert_eq!(defaults.message_timestamp_before_max_ms, i64::MAX);
        assert_eq!(defaults.message_timestamp_after_max_ms, 3_600_000);
        assert_eq!(defaults.min_insync_replicas, 1);

        let t = TopicConfig::from_pairs([
            ("retention.ms", "-1"),
            ("retention.bytes", "-1"),
            ("segment.bytes", "14"),
            ("segment.ms", "1000"),
            ("cleanup.policy", " delete , compact "),
            ("message.timestamp.type", "LogAppendTime"),
            ("compression.type", "zstd"),
            ("max.message.bytes", "100"),
        ])
        .unwrap();
        let s = t.log_settings(&b);
        assert_eq!(s.retention_ms, None);
        assert_eq!(s.retention_bytes, None);
        assert_eq!(s.segment_bytes, 14);
        assert_eq!(s.segment_ms, 1000);
        assert_eq!(s.cleanup_policy, CleanupPolicy::CompactDelete);
        assert!(s.cleanup_policy.deletes() && s.cleanup_policy.compacts());
        assert_eq!(s.timestamp_type, TimestampType::LogAppendTime);
        assert_eq!(s.compression_type, CompressionType::Zstd);
        assert_eq!(s.max_message_bytes, 100);
        // A list in the order given, trimmed, as Kafka prints it.
        assert_eq!(t.get("cleanup.policy").as_deref(), Some("delete,compact"));

        let compact = TopicConfig::from_pairs([("cleanup.policy", "compact")])
            .unwrap()
            .log_settings(&b);
        assert!(!compact.cleanup_policy.deletes());
        // An empty list: neither policy, so retention deletes nothing (Kafka 4.2).
        let neither = TopicConfig::from_pairs([("cleanup.policy", " ")]).unwrap();
        assert_eq!(neither.get("cleanup.policy").as_deref(), Some(""));
        let neither = neither.log_settings(&b);
        assert_eq!(neither.cleanup_policy, CleanupPolicy::Neither);
        assert!(!neither.cleanup_policy.deletes() && !neither.cleanup_policy.compacts());
        // Unlimited broker retention stays unlimited for topics without overrides.
        let unlimited = broker(&["log.retention.ms=-1"]);
        assert_eq!(TopicConfig::default().log_settings(&unlimited).retention_ms, None);
    }

    #[test]
    fn entries_report_sources() {
        let b = broker(&["log.retention.hours=1"]);
        let mut t = TopicConfig::default();
        t.set("segment.bytes", "1048576").unwrap();
        let entries = t.entries(&b);
        assert_eq!(entries.len(), TOPIC_KEYS.len());
        let get = |name: &str| entries.iter().find(|e| e.name == name).unwrap().clone();
        let seg = get("segment.bytes");
        assert_eq!(seg.value.as_deref(), Some("1048576"));
        assert_eq!(seg.source, ConfigSource::DynamicTopicConfig);
        assert_eq!(seg.config_type, ConfigType::Int);
        assert!(!seg.read_only && !seg.sensitive);
        let ret = get("retention.ms");
        assert_eq!(ret.value.as_deref(), Some("3600000"));
        assert_eq!(ret.source, ConfigSource::StaticBrokerConfig);
        let policy = get("cleanup.policy");
        assert_eq!(
            (policy.value.as_deref(), policy.source),
            (Some("delete"), ConfigSource::DefaultConfig)
        );
        let rb = get("retention.bytes");
        assert_eq!(
            (rb.value.as_deref(), rb.source),
            (Some("-1"), ConfigSource::DefaultConfig)
        );
        assert_eq!(
            get("message.timestamp.after.max.ms").value.as_deref(),
            Some("3600000")
        );
        assert_eq!(get("flush.ms").value.as_deref(), Some("9223372036854775807"));
    }

    #[test]
    fn set_remove_and_text_round_trip() {
        let mut t = TopicConfig::default();
        assert!(t.is_empty());
        t.set("retention.ms", " 1000 ").unwrap();
        t.set("cleanup.policy", "compact").unwrap();
        t.set("unclean.leader.election.enable", "TRUE").unwrap();
        assert_eq!(
            t.set("bogus", "1"),
            Err(TopicConfigError::UnknownKey("bogus".into()))
        );
        assert!(t.set("retention.ms", "x").is_err());
        assert_eq!(
            t.get("retention.ms").as_deref(),
            Some("1000"),
            "a failed set keeps the old value"
        );
        let text = t.to_text();
        assert_eq!(
            text,
            "cleanup.policy=compact\nretention.ms=1000\nunclean.leader.election.enable=true\n"
        );
        assert_eq!(TopicConfig::from_text(&text).unwrap(), t);
        assert_eq!(TopicConfig::from_text("").unwrap(), TopicConfig::default());
        assert_eq!(
            TopicConfig::from_text("\n# c\nretention.ms=5\n")
                .unwrap()
                .get("retention.ms")
                .as_deref(),
            Some("5")
        );
        assert!(matches!(
            TopicConfig::from_text("retention.ms"),
            Err(TopicConfigError::BadLine(_))
        ));
        assert!(matches!(
            TopicConfig::from_text("retention.ms=x"),
            Err(TopicConfigError::InvalidValue { .. })
        ));
        assert_eq!(t.remove("retention.ms"), Ok(true));
        assert_eq!(t.remove("retention.ms"), Ok(false));
        assert!(t.remove("bogus").is_err());
        assert_eq!(
            t.overrides(),
            vec![
                ("cleanup.policy", "compact".to_string()),
                ("unclean.leader.election.enable", "true".to_string())
            ]
        );
    }

    #[test]
    fn queue_settings_are_topic_configs() {
        let b = broker(&[]);
        let d = TopicConfig::default().queue_settings();
        assert_eq!(d, QueueSettings::default());
        assert_eq!(d.dead_letter_topic_of("orders"), "orders.dlq");
        let c = TopicConfig::from_pairs([
            ("strand.queue.max.attempts", "3"),
            ("strand.queue.visibility.timeout.ms", "5000"),
            ("strand.queue.backoff.multiplier", "1.5"),
            ("strand.queue.dead.letter.topic", "failures"),
            ("strand.queue.ordering", "key"),
            ("strand.queue.dedup.window.ms", "0"),
        ])
        .unwrap();
        let q = c.queue_settings();
        assert_eq!(q.max_attempts, 3);
        assert_eq!(q.visibility_timeout_ms, 5000);
        assert_eq!(q.backoff_multiplier, 1.5);
        assert_eq!(q.dead_letter_topic_of("orders"), "failures");
        assert!(q.ordering_by_key);
        assert_eq!(q.dedup_window_ms, 0);
        // Doubles print as Kafka prints them; DescribeConfigs shows every queue key.
        let c = TopicConfig::from_pairs([("strand.queue.backoff.multiplier", "2")]).unwrap();
        assert_eq!(c.get("strand.queue.backoff.multiplier").as_deref(), Some("2.0"));
        let names: Vec<&str> = c.entries(&b).iter().map(|e| e.name).collect();
        for k in QUEUE_KEYS {
            assert!(names.contains(k), "{k} missing from DescribeConfigs");
        }
        // Round trip through the persisted text form.
        let text = TopicConfig::from_pairs([("strand.queue.dead.letter.topic", "x.dlq")])
            .unwrap()
            .to_text();
        assert_eq!(
            TopicConfig::from_text(&text)
                .unwrap()
                .queue_settings()
                .dead_letter_topic
                .as_deref(),
            Some("x.dlq")
        );
        // Ranges and kinds.
        for (k, v) in [
            ("strand.queue.max.attempts", "0"),
            ("strand.queue.max.attempts", "1001"),
            ("strand.queue.visibility.timeout.ms", "999"),
            ("strand.queue.backoff.multiplier", "0.5"),
            ("strand.queue.backoff.multiplier", "NaN"),
            ("strand.queue.backoff.multiplier", "abc"),
            ("strand.queue.dead.letter.topic", "bad name"),
            ("strand.queue.ordering", "fifo"),
            ("strand.queue.dedup.window.ms", "86400001"),
        ] {
            assert!(TopicConfig::validate(k, v).is_err(), "{k}={v} accepted");
        }
    }
}
