//! The shape of one configuration entry as DescribeConfigs reports it.

/// Where a reported value comes from (`ConfigSource` of DescribeConfigs v1+; the Kafka codes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ConfigSource {
    /// A per-topic override (code 1).
    DynamicTopicConfig,
    /// Set explicitly in the broker's static configuration: file, environment or override (code 4).
    StaticBrokerConfig,
    /// Nothing set it: the built-in default (code 5).
    DefaultConfig,
    /// A per-group override, resource type GROUP (code 8, Kafka's GROUP_CONFIG).
    DynamicGroupConfig,
}

impl ConfigSource {
    /// The wire code used by DescribeConfigs.
    pub fn code(self) -> i8 {
        match self {
            ConfigSource::DynamicTopicConfig => 1,
            ConfigSource::StaticBrokerConfig => 4,
            ConfigSource::DefaultConfig => 5,
            ConfigSource::DynamicGroupConfig => 8,
        }
    }

    /// The `is_default` flag of DescribeConfigs v0.
    pub fn is_default(self) -> bool {
        self == ConfigSource::DefaultConfig
    }
}

/// The Kafka type of a config key (`ConfigType` of DescribeConfigs v3+; the Kafka codes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ConfigType {
    /// `true` or `false` (code 1).
    Boolean,
    /// Free text (code 2).
    String,
    /// A 32-bit integer (code 3).
    Int,
    /// A 16-bit integer (code 4).
    Short,
    /// A 64-bit integer (code 5).
    Long,
    /// A floating-point number (code 6).
    Double,
    /// A comma-separated list (code 7).
    List,
    /// A Java class name (code 8).
    Class,
    /// A secret (code 9).
    Password,
}

impl ConfigType {
    /// The wire code used by DescribeConfigs v3+.
    pub fn code(self) -> i8 {
        match self {
            ConfigType::Boolean => 1,
            ConfigType::String => 2,
            ConfigType::Int => 3,
            ConfigType::Short => 4,
            ConfigType::Long => 5,
            ConfigType::Double => 6,
            ConfigType::List => 7,
            ConfigType::Class => 8,
            ConfigType::Password => 9,
        }
    }

    /// The upper-case name Kafka uses in messages (`INT`, `LONG`, ...).
    pub fn name(self) -> &'static str {
        match self {
            ConfigType::Boolean => "BOOLEAN",
            ConfigType::String => "STRING",
            ConfigType::Int => "INT",
            ConfigType::Short => "SHORT",
            ConfigType::Long => "LONG",
            ConfigType::Double => "DOUBLE",
            ConfigType::List => "LIST",
            ConfigType::Class => "CLASS",
            ConfigType::Password => "PASSWORD",
        }
    }
}

/// The unit of a key's value, as `docs/configuration.md` states it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// A flag, a name, an address or one of a set of words.
    None,
    Bytes,
    Milliseconds,
    Minutes,
    Hours,
    /// A number of the things named (`"partitions"`, `"connections"`).
    Count(&'static str),
    /// A plain factor.
    Factor,
}

impl Unit {
    /// The unit as the documentation prints it (empty for [`Unit::None`]).
    pub fn text(self) -> &'static str {
        match self {
            Unit::None => "",
            Unit::Bytes => "bytes",
            Unit::Milliseconds => "ms",
            Unit::Minutes => "minutes",
            Unit::Hours => "hours",
            Unit::Count(things) => things,
            Unit::Factor => "factor",
        }
    }
}

/// One row of a DescribeConfigs answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigEntry {
    /// The Kafka key, e.g. `log.retention.ms`.
    pub name: &'static str,
    /// The value as Kafka prints it; `None` is Kafka's `null` (not set, no default).
    pub value: Option<String>,
    /// Where the value comes from.
    pub source: ConfigSource,
    /// Whether AlterConfigs may change it. All broker keys are read-only (no dynamic broker config).
    pub read_only: bool,
    /// Whether the value is secret. Nothing Strand has is.
    pub sensitive: bool,
    /// The Kafka type of the key.
    pub config_type: ConfigType,
    /// One line of documentation.
    pub documentation: &'static str,
}

/// The DescribeConfigs row of an overridable key (topic or group): the override if there is one
/// (reported as `dynamic`), else the default, STATIC_BROKER_CONFIG when a broker key behind it
/// (`synonyms`) was set explicitly and DEFAULT_CONFIG otherwise.
#[allow(clippy::too_many_arguments)]
pub(crate) fn override_entry(
    name: &'static str,
    config_type: ConfigType,
    documentation: &'static str,
    synonyms: &[&str],
    default: fn(&super::Config) -> String,
    overridden: Option<String>,
    dynamic: ConfigSource,
    broker: &super::Config,
) -> ConfigEntry {
    let (value, source) = match overridden {
        Some(v) => (v, dynamic),
        None if synonyms.iter().any(|s| broker.is_set(s)) => {
            (default(broker), ConfigSource::StaticBrokerConfig)
        }
        None => (default(broker), ConfigSource::DefaultConfig),
    };
    ConfigEntry {
        name,
        value: Some(value),
        source,
        read_only: false,
        sensitive: false,
        config_type,
        documentation,
    }
}

/// The `key=value` pairs of a stored override text (blank lines and `#` comments skipped, key
/// trimmed); a line without `=` is `Err(line)`.
pub(crate) fn override_pairs(text: &str) -> impl Iterator<Item = Result<(&str, &str), &str>> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|line| line.split_once('=').map(|(k, v)| (k.trim(), v)).ok_or(line))
}

/// A key of an override table (topic or group configs), as DescribeConfigs answers it and
/// `docs/configuration.md` lists it.
pub(crate) struct KeyView {
    pub(crate) name: &'static str,
    pub(crate) ty: ConfigType,
    pub(crate) unit: Unit,
    pub(crate) doc: &'static str,
    /// Broker keys that set this key's default (an explicit one makes the default
    /// STATIC_BROKER_CONFIG).
    pub(crate) synonyms: &'static [&'static str],
    /// The default given the broker's configuration, as DescribeConfigs prints it.
    pub(crate) default: fn(&super::Config) -> String,
}

/// DescribeConfigs rows for every key of a table, with the override `get` gives (its source
/// `dynamic`) or the default (see [`override_entry`]).
pub(crate) fn override_entries(
    keys: impl Iterator<Item = KeyView>,
    get: impl Fn(&str) -> Option<String>,
    dynamic: ConfigSource,
    broker: &super::Config,
) -> Vec<ConfigEntry> {
    keys.map(|k| {
        override_entry(
            k.name,
            k.ty,
            k.doc,
            k.synonyms,
            k.default,
            get(k.name),
            dynamic,
            broker,
        )
    })
    .collect()
}

/// The stable text form of overrides: one `key=value` line per override, in key order.
pub(crate) fn overrides_text<V: std::fmt::Display>(
    overrides: &std::collections::BTreeMap<&str, V>,
) -> String {
    overrides.iter().map(|(k, v)| format!("{k}={v}\n")).collect()
}

/// Applies every pair of an [`overrides_text`] with `set`, which validates it again; a line
/// without `=` is `bad_line`.
pub(crate) fn apply_overrides_text<E>(
    text: &str,
    bad_line: impl Fn(String) -> E,
    mut set: impl FnMut(&str, &str) -> Result<(), E>,
) -> Result<(), E> {
    for pair in override_pairs(text) {
        let (key, value) = pair.map_err(|line| bad_line(line.to_string()))?;
        set(key, value)?;
    }
    Ok(())
}
