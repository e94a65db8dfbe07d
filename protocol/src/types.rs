//! Typed ids and positions. Convert to and from raw integers only at the wire boundary.

use std::fmt;

macro_rules! newtype {
    ($(#[$m:meta])* $name:ident($inner:ty)) => {
        $(#[$m])*
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
        pub struct $name(pub $inner);

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({})", stringify!($name), self.0)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.0, f)
            }
        }
    };
}

newtype!(
    /// A record's position in a partition log. Offsets are assigned once and never reused.
    Offset(i64)
);
newtype!(
    /// The leader epoch stamped into every stored batch (`partitionLeaderEpoch`).
    /// With Raft replication this becomes the Raft term of the entry.
    LeaderEpoch(i32)
);
newtype!(
    /// A partition index within a topic.
    PartitionId(i32)
);
newtype!(
    /// A broker id (`node.id`).
    NodeId(i32)
);
newtype!(
    /// One thread-per-core executor. Every partition is owned by exactly one shard.
    ShardId(u16)
);
newtype!(
    /// Kafka producer id (idempotent and transactional producers).
    ProducerId(i64)
);
newtype!(
    /// Kafka producer epoch.
    ProducerEpoch(i16)
);

impl Offset {
    pub const ZERO: Offset = Offset(0);

    /// The offset `n` records after this one.
    pub fn plus(self, n: i64) -> Offset {
        Offset(self.0 + n)
    }
}

impl ShardId {
    pub fn index(self) -> usize {
        usize::from(self.0)
    }
}

/// A topic's stable id (KIP-516). Kept for the topic's whole life; a re-created topic gets a new one.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TopicId(pub uuid::Uuid);

impl TopicId {
    pub const ZERO: TopicId = TopicId(uuid::Uuid::nil());

    pub fn is_zero(self) -> bool {
        self.0.is_nil()
    }
}

impl fmt::Debug for TopicId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TopicId({})", self.0)
    }
}

impl fmt::Display for TopicId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// A topic name checked against Kafka's rules: 1–249 characters of `[a-zA-Z0-9._-]`,
/// not `.` or `..`.
pub fn validate_topic_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        return Err("topic name is empty");
    }
    if name == "." || name == ".." {
        return Err("topic name cannot be '.' or '..'");
    }
    if name.len() > 249 {
        return Err("topic name is longer than 249 characters");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
    {
        return Err("topic name contains a character other than ASCII alphanumerics, '.', '_' and '-'");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_names() {
        assert!(validate_topic_name("orders.v1_a-b").is_ok());
        assert!(validate_topic_name("").is_err());
        assert!(validate_topic_name(".").is_err());
        assert!(validate_topic_name("..").is_err());
        assert!(validate_topic_name("a b").is_err());
        assert!(validate_topic_name("ü").is_err());
        assert!(validate_topic_name(&"x".repeat(249)).is_ok());
        assert!(validate_topic_name(&"x".repeat(250)).is_err());
    }
}
