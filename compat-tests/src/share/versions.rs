//! Request versions (KIP-932 v1, what Kafka 4.1 and librdkafka 2.16 use).

/// ShareGroupHeartbeat.
pub const HEARTBEAT: i16 = 1;
/// ShareGroupDescribe.
pub const DESCRIBE: i16 = 1;
/// ShareFetch.
pub const FETCH: i16 = 1;
/// ShareAcknowledge.
pub const ACKNOWLEDGE: i16 = 1;
/// IncrementalAlterConfigs.
pub const INCREMENTAL_ALTER_CONFIGS: i16 = 1;
