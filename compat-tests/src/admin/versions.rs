//! Request versions the suite uses (all within Kafka 4.x's supported ranges and still
//! addressing topics by name).

/// ApiVersions.
pub const API_VERSIONS: i16 = 3;
/// Metadata.
pub const METADATA: i16 = 12;
/// Produce.
pub const PRODUCE: i16 = 9;
/// Fetch (last version with topic names).
pub const FETCH: i16 = 12;
/// ListOffsets (max-timestamp needs v7+).
pub const LIST_OFFSETS: i16 = 8;
/// CreateTopics.
pub const CREATE_TOPICS: i16 = 7;
/// DeleteTopics (v6 deletes by topic id too).
pub const DELETE_TOPICS: i16 = 6;
/// CreatePartitions.
pub const CREATE_PARTITIONS: i16 = 3;
/// DescribeConfigs.
pub const DESCRIBE_CONFIGS: i16 = 4;
/// DeleteRecords.
pub const DELETE_RECORDS: i16 = 2;
/// DescribeCluster.
pub const DESCRIBE_CLUSTER: i16 = 1;
/// InitProducerId (v3+ carries the current producer id and epoch, KIP-360; v4 is what
/// Kafka 2.7+ clients send for idempotence).
pub const INIT_PRODUCER_ID: i16 = 4;
