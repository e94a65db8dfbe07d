//! The two doors onto the queue engine: [`http`], the HTTP queue API (docs/http-api.md), and
//! [`kafka_share`], Kafka share groups (KIP-932). Each turns its protocol into
//! [`crate::queue::host::QueueOp`]s for the shards that own the partitions, and the host's
//! domain answers back into its protocol: HTTP status codes are chosen only in [`http`], Kafka
//! error codes only in [`kafka_share`].

pub(crate) mod http;
pub(crate) mod kafka_share;
