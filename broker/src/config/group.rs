//! Group configs (config resource type GROUP, KIP-848/KIP-932/KIP-1191): per-group overrides of
//! share-group settings over the broker's `group.share.*` defaults, and the effective
//! [`ShareSettings`] the share-group machinery takes.
//!
//! Values are checked on their own when set ([`GroupConfig::set`]) and against the broker's
//! bounds when altered ([`GroupConfig::check_bounds`]: the record lock duration within
//! `group.share.{min,max}.record.lock.duration.ms`, the dead-letter topic under
//! `errors.deadletterqueue.topic.name.prefix`). A stored value that a later broker config puts out
//! of bounds is clamped when used, never refused at load.
//!
//! The session timeout and heartbeat interval of a group's members (`consumer.*` for KIP-848
//! groups, `share.*` for share groups) are held to the broker's
//! `group.{consumer,share}.{min,max}.*` bounds when altered, the interval below the timeout
//! (either may come from the broker default), and used by the coordinators at each heartbeat
//! as Kafka uses them: as stored.

use std::collections::BTreeMap;

use super::entry::{
    apply_overrides_text, override_entries, overrides_text, ConfigEntry, ConfigSource, ConfigType, KeyView,
    Unit,
};
use super::Config;

/// `share.record.lock.duration.ms`: how long a delivered record stays acquired.
pub(crate) const SHARE_RECORD_LOCK_DURATION_MS: &str = "share.record.lock.duration.ms";
/// `share.delivery.count.limit`: deliveries before a record is archived (or dead-lettered).
pub(crate) const SHARE_DELIVERY_COUNT_LIMIT: &str = "share.delivery.count.limit";
/// `share.partition.max.record.locks`: records acquired at once per share-partition.
pub(crate) const SHARE_PARTITION_MAX_RECORD_LOCKS: &str = "share.partition.max.record.locks";
/// `share.auto.offset.reset`: where a share-partition starts.
pub(crate) const SHARE_AUTO_OFFSET_RESET: &str = "share.auto.offset.reset";
/// `share.isolation.level`.
pub(crate) const SHARE_ISOLATION_LEVEL: &str = "share.isolation.level";
/// `errors.deadletterqueue.topic.name` (KIP-1191): the group's dead-letter topic; empty: none.
pub(crate) const DLQ_TOPIC_NAME: &str = "errors.deadletterqueue.topic.name";
/// `consumer.session.timeout.ms`: session timeout of the KIP-848 group's members.
pub(crate) const CONSUMER_SESSION_TIMEOUT_MS: &str = "consumer.session.timeout.ms";
/// `consumer.heartbeat.interval.ms`: heartbeat interval of the KIP-848 group's members.
pub(crate) const CONSUMER_HEARTBEAT_INTERVAL_MS: &str = "consumer.heartbeat.interval.ms";
/// `share.session.timeout.ms`: session timeout of the share group's members.
pub(crate) const SHARE_SESSION_TIMEOUT_MS: &str = "share.session.timeout.ms";
/// `share.heartbeat.interval.ms`: heartbeat interval of the share group's members.
pub(crate) const SHARE_HEARTBEAT_INTERVAL_MS: &str = "share.heartbeat.interval.ms";

/// Bounds of `share.delivery.count.limit` (Kafka's `group.share.delivery.count.limit` range).
const DELIVERY_COUNT_LIMIT_RANGE: (i64, i64) = (2, 10);
/// Bounds of `share.partition.max.record.locks` (Kafka's broker key range).
const MAX_RECORD_LOCKS_RANGE: (i64, i64) = (100, 10_000);
/// Smallest `share.record.lock.duration.ms` (Kafka: `atLeast(1000)`); the broker bounds apply too.
const MIN_RECORD_LOCK_DURATION_MS: i64 = 1_000;
/// Largest duration `by_duration:` accepts: about 292 million years in ms would overflow
/// arithmetic elsewhere; ten thousand years is plenty.
const MAX_BY_DURATION_MS: i64 = 10_000 * 365 * 24 * 3_600_000;

/// Where a share-partition starts reading when the group first uses it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AutoOffsetReset {
    /// The high watermark (Kafka's default).
    Latest,
    /// The log start offset.
    Earliest,
    /// The first record with a timestamp at or after `now - ms`.
    ByDuration {
        /// The duration, in milliseconds.
        ms: i64,
    },
}

/// `share.isolation.level`. Strand has no transactional producers, so both levels read the same
/// records; the value is stored and reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IsolationLevel {
    /// `read_uncommitted` (default).
    ReadUncommitted,
    /// `read_committed`.
    ReadCommitted,
}

/// The effective settings of a share group: its group configs over the broker defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShareSettings {
    /// Acquisition lock of a delivered record.
    pub record_lock_duration_ms: u32,
    /// Deliveries before a record is archived (or dead-lettered).
    pub delivery_count_limit: u32,
    /// Records acquired at once per share-partition.
    pub max_record_locks: u32,
    /// Where a share-partition starts.
    pub auto_offset_reset: AutoOffsetReset,
    /// Isolation level (no effect without transactions).
    pub isolation_level: IsolationLevel,
    /// The dead-letter topic (KIP-1191); `None`: exhausted and rejected records are archived.
    pub dead_letter_topic: Option<String>,
}

/// Why a group config key or value was refused (INVALID_CONFIG); Display is Kafka's wording.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GroupConfigError {
    /// Not a group config Strand knows.
    #[error("Unknown group config name: {0}")]
    UnknownKey(String),
    /// The value does not fit the key.
    #[error("Invalid value {value} for configuration {key}: {reason}")]
    InvalidValue {
        /// The key.
        key: String,
        /// The value as given.
        value: String,
        /// What is wrong.
        reason: String,
    },
    /// The value is outside what the broker configuration allows.
    #[error("{0}")]
    OutOfBounds(String),
    /// A line of persisted group config text is not `key=value`.
    #[error("Invalid group config line: {0}")]
    BadLine(String),
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    Integer { min: i64, max: i64 },
    AutoOffsetReset,
    IsolationLevel,
    TopicName,
}

struct GroupKey {
    name: &'static str,
    ty: ConfigType,
    kind: Kind,
    /// Broker keys whose explicit setting makes the default STATIC_BROKER_CONFIG.
    synonyms: &'static [&'static str],
    default: fn(&Config) -> String,
    unit: Unit,
    doc: &'static str,
}

static GROUP_KEYS: &[GroupKey] = &[
    GroupKey {
        name: CONSUMER_HEARTBEAT_INTERVAL_MS,
        ty: ConfigType::Int,
        unit: Unit::Milliseconds,
        kind: Kind::Integer {
            min: 1,
            max: i32::MAX as i64,
        },
        synonyms: &["group.consumer.heartbeat.interval.ms"],
        default: |c| c.group_consumer_heartbeat_interval_ms.to_string(),
        doc: "Heartbeat interval of this consumer group's members (KIP-848).",
    },
    GroupKey {
        name: CONSUMER_SESSION_TIMEOUT_MS,
        ty: ConfigType::Int,
        unit: Unit::Milliseconds,
        kind: Kind::Integer {
            min: 1,
            max: i32::MAX as i64,
        },
        synonyms: &["group.consumer.session.timeout.ms"],
        default: |c| c.group_consumer_session_timeout_ms.to_string(),
        doc: "Session timeout of this consumer group's members (KIP-848).",
    },
    GroupKey {
        name: DLQ_TOPIC_NAME,
        ty: ConfigType::String,
        unit: Unit::None,
        kind: Kind::TopicName,
        synonyms: &[],
        default: |_| String::new(),
        doc: "The dead-letter topic of this share group; empty: none.",
    },
    GroupKey {
        name: SHARE_AUTO_OFFSET_RESET,
        ty: ConfigType::String,
        unit: Unit::None,
        kind: Kind::AutoOffsetReset,
        synonyms: &[],
        default: |_| "latest".to_string(),
        doc: "Where a share-partition starts: latest, earliest or by_duration:<ISO-8601 duration>.",
    },
    GroupKey {
        name: SHARE_DELIVERY_COUNT_LIMIT,
        ty: ConfigType::Int,
        unit: Unit::Count("deliveries"),
        kind: Kind::Integer {
            min: DELIVERY_COUNT_LIMIT_RANGE.0,
            max: DELIVERY_COUNT_LIMIT_RANGE.1,
        },
        synonyms: &["group.share.delivery.count.limit"],
        default: |c| c.group_share_delivery_count_limit.to_string(),
        doc: "Delivery attempts of a record before it is archived.",
    },
    GroupKey {
        name: SHARE_HEARTBEAT_INTERVAL_MS,
        ty: ConfigType::Int,
        unit: Unit::Milliseconds,
        kind: Kind::Integer {
            min: 1,
            max: i32::MAX as i64,
        },
        synonyms: &["group.share.heartbeat.interval.ms"],
        default: |c| c.group_share_heartbeat_interval_ms.to_string(),
        doc: "Heartbeat interval of this share group's members.",
    },
    GroupKey {
        name: SHARE_ISOLATION_LEVEL,
        ty: ConfigType::String,
        unit: Unit::None,
        kind: Kind::IsolationLevel,
        synonyms: &[],
        default: |_| "read_uncommitted".to_string(),
        doc: "read_uncommitted or read_committed (the same without transactions).",
    },
    GroupKey {
        name: SHARE_PARTITION_MAX_RECORD_LOCKS,
        ty: ConfigType::Int,
        unit: Unit::Count("records"),
        kind: Kind::Integer {
            min: MAX_RECORD_LOCKS_RANGE.0,
            max: MAX_RECORD_LOCKS_RANGE.1,
        },
        synonyms: &["group.share.partition.max.record.locks"],
        default: |c| c.group_share_partition_max_record_locks.to_string(),
        doc: "Records acquired at once per share-partition.",
    },
    GroupKey {
        name: SHARE_RECORD_LOCK_DURATION_MS,
        ty: ConfigType::Int,
        unit: Unit::Milliseconds,
        kind: Kind::Integer {
            min: MIN_RECORD_LOCK_DURATION_MS,
            max: i32::MAX as i64,
        },
        synonyms: &["group.share.record.lock.duration.ms"],
        default: |c| c.group_share_record_lock_duration_ms.to_string(),
        doc: "Acquisition lock duration of a delivered record.",
    },
    GroupKey {
        name: SHARE_SESSION_TIMEOUT_MS,
        ty: ConfigType::Int,
        unit: Unit::Milliseconds,
        kind: Kind::Integer {
            min: 1,
            max: i32::MAX as i64,
        },
        synonyms: &["group.share.session.timeout.ms"],
        default: |c| c.group_share_session_timeout_ms.to_string(),
        doc: "Session timeout of this share group's members.",
    },
];

/// The keys, as DescribeConfigs answers them and `docs/configuration.md` lists them.
pub(super) fn key_views() -> impl Iterator<Item = KeyView> {
    GROUP_KEYS.iter().map(|k| KeyView {
        name: k.name,
        ty: k.ty,
        unit: k.unit,
        doc: k.doc,
        synonyms: k.synonyms,
        default: k.default,
    })
}

fn find_key(name: &str) -> Option<&'static GroupKey> {
    GROUP_KEYS.iter().find(|k| k.name == name)
}

/// Parses the ISO-8601 durations Java's `Duration.parse` reads, without signs: `PnD`, `PTnH`,
/// `PTnM`, `PTn.nS` and combinations (`P1DT2H30M`, `PT0.5S`), case-insensitive. Milliseconds.
pub fn parse_iso_duration(text: &str) -> Option<i64> {
    let upper = text.to_ascii_uppercase();
    let rest = upper.strip_prefix('P')?;
    let (date, time) = match rest.split_once('T') {
        Some((d, t)) => {
            if t.is_empty() {
                return None;
            }
            (d, Some(t))
        }
        None => (rest, None),
    };
    let mut total: i64 = 0;
    let mut any = false;
    let add = |total: &mut i64, n: i64, unit_ms: i64| -> Option<()> {
        *total = total.checked_add(n.checked_mul(unit_ms)?)?;
        Some(())
    };
    let number = |s: &str| -> Option<i64> {
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        s.parse::<i64>().ok()
    };
    if !date.is_empty() {
        let days = number(date.strip_suffix('D')?)?;
        add(&mut total, days, 86_400_000)?;
        any = true;
    }
    if let Some(mut t) = time {
        for (unit, unit_ms) in [('H', 3_600_000i64), ('M', 60_000)] {
            if let Some(i) = t.find(unit) {
                let (n, after) = t.split_at(i);
                // The unit letter must follow digits only (rejects `1S2H` orders).
                add(&mut total, number(n)?, unit_ms)?;
                t = after.get(1..)?;
                any = true;
            }
        }
        if !t.is_empty() {
            let secs = t.strip_suffix('S')?;
            let (whole, frac) = match secs.split_once(['.', ',']) {
                Some((w, f)) => (w, Some(f)),
                None => (secs, None),
            };
            add(&mut total, number(whole)?, 1_000)?;
            if let Some(f) = frac {
                if f.is_empty() || f.len() > 9 || !f.bytes().all(|b| b.is_ascii_digit()) {
                    return None;
                }
                let ms: String = f.chars().chain(std::iter::repeat('0')).take(3).collect();
                add(&mut total, ms.parse::<i64>().ok()?, 1)?;
            }
            any = true;
        }
    }
    (any && total <= MAX_BY_DURATION_MS).then_some(total)
}

/// Parses a `share.auto.offset.reset` value.
pub fn parse_auto_offset_reset(text: &str) -> Option<AutoOffsetReset> {
    let t = text.trim();
    if t.eq_ignore_ascii_case("latest") {
        return Some(AutoOffsetReset::Latest);
    }
    if t.eq_ignore_ascii_case("earliest") {
        return Some(AutoOffsetReset::Earliest);
    }
    let prefix = "by_duration:";
    let head = t.get(..prefix.len())?;
    if !head.eq_ignore_ascii_case(prefix) {
        return None;
    }
    let ms = parse_iso_duration(t.get(prefix.len()..)?.trim())?;
    Some(AutoOffsetReset::ByDuration { ms })
}

/// Checks `value` for `key`; returns its normalised text.
fn check(key: &GroupKey, value: &str) -> Result<String, GroupConfigError> {
    let trimmed = value.trim();
    let invalid = |reason: String| GroupConfigError::InvalidValue {
        key: key.name.to_string(),
        value: value.to_string(),
        reason,
    };
    match key.kind {
        Kind::Integer { min, max } => {
            let v = trimmed
                .parse::<i64>()
                .ok()
                .filter(|v| *v <= i64::from(i32::MAX) && *v >= i64::from(i32::MIN))
                .ok_or_else(|| invalid(format!("Not a number of type {}", key.ty.name())))?;
            if v < min {
                return Err(invalid(format!("Value must be at least {min}")));
            }
            if v > max {
                return Err(invalid(format!("Value must be no more than {max}")));
            }
            Ok(v.to_string())
        }
        Kind::AutoOffsetReset => match parse_auto_offset_reset(trimmed) {
            Some(AutoOffsetReset::Latest) => Ok("latest".to_string()),
            Some(AutoOffsetReset::Earliest) => Ok("earliest".to_string()),
            Some(AutoOffsetReset::ByDuration { .. }) => Ok(trimmed.to_string()),
            None => Err(invalid(
                "the value must be either 'earliest', 'latest', or of the format \
                 'by_duration:<PnDTnHnMn.nS>' with a non-negative duration"
                    .to_string(),
            )),
        },
        Kind::IsolationLevel => match trimmed {
            "read_uncommitted" | "read_committed" => Ok(trimmed.to_string()),
            _ => Err(invalid(
                "String must be one of: read_committed, read_uncommitted".to_string(),
            )),
        },
        Kind::TopicName => {
            if !trimmed.is_empty() {
                strand_protocol::types::validate_topic_name(trimmed)
                    .map_err(|e| invalid(format!("Not a valid topic name: {e}")))?;
                if trimmed.starts_with("__") {
                    return Err(invalid(
                        "Internal topics cannot be dead-letter topics".to_string(),
                    ));
                }
            }
            Ok(trimmed.to_string())
        }
    }
}

/// Per-group overrides, validated. Keys absent here take the broker default.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GroupConfig {
    overrides: BTreeMap<&'static str, String>,
}

impl GroupConfig {
    /// Whether `key` is a group config Strand knows.
    pub fn is_known_key(key: &str) -> bool {
        find_key(key).is_some()
    }

    /// Sets (validates and stores) one override; broker bounds are checked separately
    /// ([`GroupConfig::check_bounds`]).
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), GroupConfigError> {
        let def = find_key(key).ok_or_else(|| GroupConfigError::UnknownKey(key.to_string()))?;
        let value = check(def, value)?;
        self.overrides.insert(def.name, value);
        Ok(())
    }

    /// Removes an override. Returns whether one was present.
    pub fn remove(&mut self, key: &str) -> Result<bool, GroupConfigError> {
        let def = find_key(key).ok_or_else(|| GroupConfigError::UnknownKey(key.to_string()))?;
        Ok(self.overrides.remove(def.name).is_some())
    }

    /// The override for `key`, if any.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.overrides.get(key).map(String::as_str)
    }

    /// All overrides in key order.
    pub fn overrides(&self) -> Vec<(&'static str, String)> {
        self.overrides.iter().map(|(k, v)| (*k, v.clone())).collect()
    }

    /// Whether there are no overrides.
    pub fn is_empty(&self) -> bool {
        self.overrides.is_empty()
    }

    /// Checks the overrides against the broker's bounds (Kafka's `GroupConfig.validateValues`).
    pub fn check_bounds(&self, broker: &Config) -> Result<(), GroupConfigError> {
        if let Some(v) = self.long(SHARE_RECORD_LOCK_DURATION_MS) {
            if v < i64::from(broker.group_share_min_record_lock_duration_ms) {
                return Err(GroupConfigError::OutOfBounds(format!(
                    "{SHARE_RECORD_LOCK_DURATION_MS} must be greater than or equal to \
                     group.share.min.record.lock.duration.ms ({})",
                    broker.group_share_min_record_lock_duration_ms
                )));
            }
            if v > i64::from(broker.group_share_max_record_lock_duration_ms) {
                return Err(GroupConfigError::OutOfBounds(format!(
                    "{SHARE_RECORD_LOCK_DURATION_MS} must be less than or equal to \
                     group.share.max.record.lock.duration.ms ({})",
                    broker.group_share_max_record_lock_duration_ms
                )));
            }
        }
        for (session_key, heartbeat_key, session, heartbeat, prefix) in [
            (
                CONSUMER_SESSION_TIMEOUT_MS,
                CONSUMER_HEARTBEAT_INTERVAL_MS,
                (
                    broker.group_consumer_session_timeout_ms,
                    broker.group_consumer_session_timeout_bounds_ms,
                ),
                (
                    broker.group_consumer_heartbeat_interval_ms,
                    broker.group_consumer_heartbeat_interval_bounds_ms,
                ),
                "group.consumer",
            ),
            (
                SHARE_SESSION_TIMEOUT_MS,
                SHARE_HEARTBEAT_INTERVAL_MS,
                (
                    broker.group_share_session_timeout_ms,
                    broker.group_share_session_timeout_bounds_ms,
                ),
                (
                    broker.group_share_heartbeat_interval_ms,
                    broker.group_share_heartbeat_interval_bounds_ms,
                ),
                "group.share",
            ),
        ] {
            let within = |key: &str, (default, (min, max)): (i32, (i32, i32)), what: &str| {
                let Some(v) = self.long(key) else {
                    return Ok(i64::from(default));
                };
                if v < i64::from(min) {
                    return Err(GroupConfigError::OutOfBounds(format!(
                        "{key} must be greater than or equal to {prefix}.min.{what} ({min})"
                    )));
                }
                if v > i64::from(max) {
                    return Err(GroupConfigError::OutOfBounds(format!(
                        "{key} must be less than or equal to {prefix}.max.{what} ({max})"
                    )));
                }
                Ok(v)
            };
            let session_ms = within(session_key, session, "session.timeout.ms")?;
            let heartbeat_ms = within(heartbeat_key, heartbeat, "heartbeat.interval.ms")?;
            if heartbeat_ms >= session_ms {
                return Err(GroupConfigError::OutOfBounds(format!(
                    "{heartbeat_key} ({heartbeat_ms}) must be less than {session_key} ({session_ms})"
                )));
            }
        }
        if let Some(topic) = self.get(DLQ_TOPIC_NAME).filter(|t| !t.is_empty()) {
            let prefix = &broker.errors_deadletterqueue_topic_name_prefix;
            if !topic.starts_with(prefix.as_str()) {
                return Err(GroupConfigError::OutOfBounds(format!(
                    "{DLQ_TOPIC_NAME} must start with errors.deadletterqueue.topic.name.prefix \
                     ({prefix}): {topic}"
                )));
            }
        }
        Ok(())
    }

    fn long(&self, key: &str) -> Option<i64> {
        self.overrides.get(key).and_then(|v| v.parse().ok())
    }

    /// An override of an integer key (`consumer.session.timeout.ms`, ...), as stored.
    pub fn int(&self, key: &str) -> Option<i32> {
        self.long(key).and_then(|v| i32::try_from(v).ok())
    }

    /// The effective share-group settings: overrides over the broker defaults, the lock duration
    /// clamped to the broker's current bounds.
    pub fn share_settings(&self, broker: &Config) -> ShareSettings {
        let u32_or = |key: &str, default: i32| {
            self.long(key)
                .and_then(|v| u32::try_from(v).ok())
                .or_else(|| u32::try_from(default).ok())
                .unwrap_or(1)
        };
        let min = u32::try_from(broker.group_share_min_record_lock_duration_ms).unwrap_or(1_000);
        let max = u32::try_from(broker.group_share_max_record_lock_duration_ms)
            .unwrap_or(u32::MAX)
            .max(min);
        ShareSettings {
            record_lock_duration_ms: u32_or(
                SHARE_RECORD_LOCK_DURATION_MS,
                broker.group_share_record_lock_duration_ms,
            )
            .clamp(min, max),
            delivery_count_limit: u32_or(
                SHARE_DELIVERY_COUNT_LIMIT,
                broker.group_share_delivery_count_limit,
            ),
            max_record_locks: u32_or(
                SHARE_PARTITION_MAX_RECORD_LOCKS,
                broker.group_share_partition_max_record_locks,
            ),
            auto_offset_reset: self
                .get(SHARE_AUTO_OFFSET_RESET)
                .and_then(parse_auto_offset_reset)
                .unwrap_or(AutoOffsetReset::Latest),
            isolation_level: match self.get(SHARE_ISOLATION_LEVEL) {
                Some("read_committed") => IsolationLevel::ReadCommitted,
                _ => IsolationLevel::ReadUncommitted,
            },
            dead_letter_topic: self
                .get(DLQ_TOPIC_NAME)
                .filter(|t| !t.is_empty())
                .map(str::to_owned),
        }
    }

    /// DescribeConfigs rows for a GROUP resource: every group key with its effective value.
    /// Overrides are GROUP_CONFIG (8); defaults are STATIC_BROKER_CONFIG when the broker key
    /// behind them was set explicitly, DEFAULT_CONFIG otherwise.
    pub fn entries(&self, broker: &Config) -> Vec<ConfigEntry> {
        override_entries(
            key_views(),
            |name| self.overrides.get(name).cloned(),
            ConfigSource::DynamicGroupConfig,
            broker,
        )
    }

    /// Stable text form: one `key=value` line per override, in key order.
    pub fn to_text(&self) -> String {
        overrides_text(&self.overrides)
    }

    /// Parses [`GroupConfig::to_text`] output (blank lines and `#` comments are skipped); every pair
    /// is validated again (broker bounds are not: they are applied when the settings are used).
    pub fn from_text(text: &str) -> Result<GroupConfig, GroupConfigError> {
        let mut config = GroupConfig::default();
        apply_overrides_text(text, GroupConfigError::BadLine, |k, v| config.set(k, v))?;
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::load;

    fn broker(overrides: &[&str]) -> Config {
        let args: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
        load(None, Vec::new(), &args).unwrap().config
    }

    fn invalid(key: &str, value: &str) -> String {
        GroupConfig::default().set(key, value).unwrap_err().to_string()
    }

    #[test]
    fn defaults_come_from_the_broker() {
        let c = broker(&[]);
        let s = GroupConfig::default().share_settings(&c);
        assert_eq!(
            s,
            ShareSettings {
                record_lock_duration_ms: 30_000,
                delivery_count_limit: 5,
                max_record_locks: 2_000,
                auto_offset_reset: AutoOffsetReset::Latest,
                isolation_level: IsolationLevel::ReadUncommitted,
                dead_letter_topic: None,
            }
        );
        let c = broker(&[
            "group.share.record.lock.duration.ms=20000",
            "group.share.delivery.count.limit=3",
            "group.share.partition.max.record.locks=500",
        ]);
        let s = GroupConfig::default().share_settings(&c);
        assert_eq!(
            (
                s.record_lock_duration_ms,
                s.delivery_count_limit,
                s.max_record_locks
            ),
            (20_000, 3, 500)
        );
        let e = GroupConfig::default().entries(&c);
        let lock = e
            .iter()
            .find(|e| e.name == SHARE_RECORD_LOCK_DURATION_MS)
            .unwrap();
        assert_eq!(lock.value.as_deref(), Some("20000"));
        assert_eq!(lock.source, ConfigSource::StaticBrokerConfig);
        let reset = e.iter().find(|e| e.name == SHARE_AUTO_OFFSET_RESET).unwrap();
        assert_eq!(reset.value.as_deref(), Some("latest"));
        assert_eq!(reset.source, ConfigSource::DefaultConfig);
    }

    #[test]
    fn overrides_win_and_are_reported_as_group_configs() {
        let c = broker(&[]);
        let mut g = GroupConfig::default();
        g.set(SHARE_RECORD_LOCK_DURATION_MS, "45000").unwrap();
        g.set(SHARE_DELIVERY_COUNT_LIMIT, " 2 ").unwrap();
        g.set(SHARE_PARTITION_MAX_RECORD_LOCKS, "10000").unwrap();
        g.set(SHARE_AUTO_OFFSET_RESET, "EARLIEST").unwrap();
        g.set(SHARE_ISOLATION_LEVEL, "read_committed").unwrap();
        g.set(DLQ_TOPIC_NAME, "dlq.orders").unwrap();
        g.check_bounds(&c).unwrap();
        let s = g.share_settings(&c);
        assert_eq!(
            s,
            ShareSettings {
                record_lock_duration_ms: 45_000,
                delivery_count_limit: 2,
                max_record_locks: 10_000,
                auto_offset_reset: AutoOffsetReset::Earliest,
                isolation_level: IsolationLevel::ReadCommitted,
                dead_letter_topic: Some("dlq.orders".into()),
            }
        );
        assert_eq!(g.get(SHARE_AUTO_OFFSET_RESET), Some("earliest"));
        let e = g.entries(&c);
        assert_eq!(e.len(), GROUP_KEYS.len(), "every key, overridden or not");
        let overridden: Vec<&str> = e
            .iter()
            .filter(|e| e.source == ConfigSource::DynamicGroupConfig)
            .map(|e| e.name)
            .collect();
        assert_eq!(overridden.len(), 6, "{overridden:?}");
        assert_eq!(ConfigSource::DynamicGroupConfig.code(), 8);
        // Back to the default.
        assert!(g.remove(DLQ_TOPIC_NAME).unwrap());
        assert!(!g.remove(DLQ_TOPIC_NAME).unwrap());
        assert_eq!(g.share_settings(&c).dead_letter_topic, None);
        // An empty name is "no dead-letter topic".
        g.set(DLQ_TOPIC_NAME, "").unwrap();
        assert_eq!(g.share_settings(&c).dead_letter_topic, None);
    }

    #[test]
    fn validation_messages() {
        assert_eq!(
            invalid("streams.session.timeout.ms", "1"),
            "Unknown group config name: streams.session.timeout.ms"
        );
        assert_eq!(
            invalid(SHARE_RECORD_LOCK_DURATION_MS, "999"),
            "Invalid value 999 for configuration share.record.lock.duration.ms: Value must be at least 1000"
        );
        assert_eq!(
            invalid(SHARE_RECORD_LOCK_DURATION_MS, "abc"),
            "Invalid value abc for configuration share.record.lock.duration.ms: Not a number of type INT"
        );
        assert_eq!(
            invalid(SHARE_RECORD_LOCK_DURATION_MS, "4294967296"),
            "Invalid value 4294967296 for configuration share.record.lock.duration.ms: Not a number of type INT"
        );
        assert_eq!(
            invalid(SHARE_DELIVERY_COUNT_LIMIT, "1"),
            "Invalid value 1 for configuration share.delivery.count.limit: Value must be at least 2"
        );
        assert_eq!(
            invalid(SHARE_DELIVERY_COUNT_LIMIT, "11"),
            "Invalid value 11 for configuration share.delivery.count.limit: Value must be no more than 10"
        );
        assert!(invalid(SHARE_PARTITION_MAX_RECORD_LOCKS, "99").contains("at least 100"));
        assert!(invalid(SHARE_PARTITION_MAX_RECORD_LOCKS, "10001").contains("no more than 10000"));
        for bad in [
            "",
            "none",
            "by_duration:",
            "by_duration:P",
            "by_duration:PT",
            "by_duration:-PT1H",
            "by_duration:PT-1H",
            "by_duration:1H",
            "by_duration:PT1S1H",
            "by_duration:P1H",
        ] {
            assert!(
                invalid(SHARE_AUTO_OFFSET_RESET, bad).contains("by_duration:<PnDTnHnMn.nS>"),
                "{bad}"
            );
        }
        assert!(invalid(SHARE_ISOLATION_LEVEL, "READ_COMMITTED").contains("read_committed, read_uncommitted"));
        assert!(invalid(DLQ_TOPIC_NAME, "bad name").contains("Not a valid topic name"));
        assert!(invalid(DLQ_TOPIC_NAME, "__consumer_offsets").contains("Internal topics"));
    }

    #[test]
    fn session_timeouts_and_heartbeat_intervals_keep_to_the_broker_bounds() {
        let c = broker(&[]);
        let check = |pairs: &[(&str, &str)], c: &Config| {
            let mut g = GroupConfig::default();
            for (k, v) in pairs {
                g.set(k, v).unwrap();
            }
            g.check_bounds(c).map_err(|e| e.to_string())
        };
        // Kafka's default bounds: sessions 45-60 s, intervals 5-15 s.
        assert_eq!(
            check(&[(CONSUMER_SESSION_TIMEOUT_MS, "44999")], &c).unwrap_err(),
            "consumer.session.timeout.ms must be greater than or equal to \
             group.consumer.min.session.timeout.ms (45000)"
        );
        assert_eq!(
            check(&[(SHARE_HEARTBEAT_INTERVAL_MS, "15001")], &c).unwrap_err(),
            "share.heartbeat.interval.ms must be less than or equal to \
             group.share.max.heartbeat.interval.ms (15000)"
        );
        assert!(check(
            &[
                (CONSUMER_SESSION_TIMEOUT_MS, "60000"),
                (CONSUMER_HEARTBEAT_INTERVAL_MS, "15000")
            ],
            &c
        )
        .is_ok());
        // The interval stays below the timeout, the other one from the broker.
        let c = broker(&[
            "group.share.min.session.timeout.ms=1000",
            "group.share.min.heartbeat.interval.ms=1000",
        ]);
        assert_eq!(
            check(&[(SHARE_SESSION_TIMEOUT_MS, "5000")], &c).unwrap_err(),
            "share.heartbeat.interval.ms (5000) must be less than share.session.timeout.ms (5000)"
        );
        assert!(check(
            &[
                (SHARE_SESSION_TIMEOUT_MS, "5000"),
                (SHARE_HEARTBEAT_INTERVAL_MS, "1000")
            ],
            &c
        )
        .is_ok());
        let mut g = GroupConfig::default();
        g.set(CONSUMER_SESSION_TIMEOUT_MS, " 50000 ").unwrap();
        assert_eq!(g.int(CONSUMER_SESSION_TIMEOUT_MS), Some(50_000));
        assert_eq!(g.int(SHARE_SESSION_TIMEOUT_MS), None);
    }

    #[test]
    fn broker_bounds() {
        let c = broker(&[]);
        let bounds = |key: &str, v: &str, c: &Config| {
            let mut g = GroupConfig::default();
            g.set(key, v).unwrap();
            g.check_bounds(c).map_err(|e| e.to_string())
        };
        assert_eq!(
            bounds(SHARE_RECORD_LOCK_DURATION_MS, "14999", &c).unwrap_err(),
            "share.record.lock.duration.ms must be greater than or equal to \
             group.share.min.record.lock.duration.ms (15000)"
        );
        assert!(bounds(SHARE_RECORD_LOCK_DURATION_MS, "15000", &c).is_ok());
        assert!(bounds(SHARE_RECORD_LOCK_DURATION_MS, "60000", &c).is_ok());
        assert!(bounds(SHARE_RECORD_LOCK_DURATION_MS, "60001", &c)
            .unwrap_err()
            .contains("less than or equal to group.share.max.record.lock.duration.ms (60000)"));
        let wide = broker(&[
            "group.share.min.record.lock.duration.ms=1000",
            "group.share.max.record.lock.duration.ms=3600000",
        ]);
        assert!(bounds(SHARE_RECORD_LOCK_DURATION_MS, "1000", &wide).is_ok());
        assert!(bounds(SHARE_RECORD_LOCK_DURATION_MS, "3600000", &wide).is_ok());
        // A stored value the broker bounds no longer allow is clamped when used.
        let mut g = GroupConfig::default();
        g.set(SHARE_RECORD_LOCK_DURATION_MS, "1000").unwrap();
        assert_eq!(g.share_settings(&c).record_lock_duration_ms, 15_000);
        g.set(SHARE_RECORD_LOCK_DURATION_MS, "3600000").unwrap();
        assert_eq!(g.share_settings(&c).record_lock_duration_ms, 60_000);
        // Dead-letter topics carry the broker's prefix.
        assert!(bounds(DLQ_TOPIC_NAME, "orders.dlq", &c)
            .unwrap_err()
            .contains("must start with"));
        assert!(bounds(DLQ_TOPIC_NAME, "dlq.orders", &c).is_ok());
        let any = broker(&["errors.deadletterqueue.topic.name.prefix="]);
        assert!(bounds(DLQ_TOPIC_NAME, "orders.dlq", &any).is_ok());
    }

    #[test]
    fn broker_keys() {
        let c = broker(&[]);
        assert_eq!(
            (
                c.group_share_session_timeout_ms,
                c.group_share_heartbeat_interval_ms,
                c.group_share_max_size,
                c.group_share_min_record_lock_duration_ms,
                c.group_share_max_record_lock_duration_ms,
                c.errors_deadletterqueue_topic_name_prefix.as_str(),
            ),
            (45_000, 5_000, 200, 15_000, 60_000, "dlq.")
        );
        let err = |args: &[&str]| {
            let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
            load(None, Vec::new(), &args).unwrap_err().to_string()
        };
        assert!(err(&[
            "group.share.max.heartbeat.interval.ms=50000",
            "group.share.heartbeat.interval.ms=45000"
        ])
        .contains("must be less than group.share.session.timeout.ms (45000)"));
        assert!(err(&[
            "group.share.min.session.timeout.ms=1000",
            "group.share.session.timeout.ms=5000"
        ])
        .contains("must be greater than group.share.heartbeat.interval.ms (5000)"));
        assert!(err(&["group.share.max.size=1001"]).contains("group.share.max.size"));
        assert!(err(&["group.share.delivery.count.limit=1"]).contains("from 2 to 10"));
        assert!(err(&["group.share.record.lock.duration.ms=10000"])
            .contains("must be between group.share.min.record.lock.duration.ms (15000)"));
        assert!(err(&["group.share.min.record.lock.duration.ms=999"]).contains("from 1000 to 30000"));
        assert!(err(&["errors.deadletterqueue.topic.name.prefix=a b"]).contains("topic name prefix"));
        let c = broker(&[
            "group.share.record.lock.duration.ms=10000",
            "group.share.min.record.lock.duration.ms=5000",
        ]);
        assert_eq!(
            GroupConfig::default().share_settings(&c).record_lock_duration_ms,
            10_000
        );
        // The broker keys are listed by DescribeConfigs on the BROKER resource.
        let names: Vec<&str> = c.broker_entries().iter().map(|e| e.name).collect();
        for k in [
            "group.share.session.timeout.ms",
            "group.share.max.size",
            "errors.deadletterqueue.topic.name.prefix",
        ] {
            assert!(names.contains(&k), "{k}");
        }
    }

    #[test]
    fn iso_durations() {
        assert_eq!(parse_iso_duration("PT1H"), Some(3_600_000));
        assert_eq!(parse_iso_duration("pt1h"), Some(3_600_000));
        assert_eq!(parse_iso_duration("P1D"), Some(86_400_000));
        assert_eq!(
            parse_iso_duration("P1DT2H30M"),
            Some(86_400_000 + 2 * 3_600_000 + 30 * 60_000)
        );
        assert_eq!(parse_iso_duration("PT0.5S"), Some(500));
        assert_eq!(parse_iso_duration("PT1,25S"), Some(1_250));
        assert_eq!(parse_iso_duration("PT0S"), Some(0));
        assert_eq!(parse_iso_duration("PT10M5S"), Some(605_000));
        for bad in [
            "",
            "P",
            "PT",
            "T1H",
            "PT1",
            "PT1H1H",
            "P-1D",
            "PT1.S",
            "PT1.1234567890S",
            "P99999999999999D",
        ] {
            assert_eq!(parse_iso_duration(bad), None, "{bad}");
        }
        assert_eq!(
            parse_auto_offset_reset("by_duration:PT15M"),
            Some(AutoOffsetReset::ByDuration { ms: 900_000 })
        );
        assert_eq!(
            parse_auto_offset_reset("BY_DURATION:P1D"),
            Some(AutoOffsetReset::ByDuration { ms: 86_400_000 })
        );
    }

    #[test]
    fn text_round_trip() {
        let mut g = GroupConfig::default();
        g.set(SHARE_DELIVERY_COUNT_LIMIT, "7").unwrap();
        g.set(SHARE_AUTO_OFFSET_RESET, "by_duration:PT1H").unwrap();
        g.set(DLQ_TOPIC_NAME, "dlq.x").unwrap();
        let text = g.to_text();
        assert_eq!(
            text,
            "errors.deadletterqueue.topic.name=dlq.x\nshare.auto.offset.reset=by_duration:PT1H\n\
             share.delivery.count.limit=7\n"
        );
        assert_eq!(GroupConfig::from_text(&text).unwrap(), g);
        assert!(matches!(
            GroupConfig::from_text("nonsense"),
            Err(GroupConfigError::BadLine(_))
        ));
        assert!(matches!(
            GroupConfig::from_text("share.delivery.count.limit=99"),
            Err(GroupConfigError::InvalidValue { .. })
        ));
    }
}
