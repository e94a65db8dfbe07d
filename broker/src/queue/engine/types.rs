//! Typed ids of the queue engine. Convert to raw integers only at the wire and record boundaries.

use std::fmt;
use std::str::FromStr;

use strand_protocol::types::{Offset, PartitionId, TopicId};

/// A message's stable id within its queue: the partition and offset where the message was
/// *first* published (its origin).
///
/// The id never changes: retries keep it (the offset is immutable), the dead-letter copy carries
/// it in a header, and a redrive publishes a new copy at a new offset of the *same* partition
/// that keeps the id (the engine maps it to the copy's offset). Offsets are never reused, so the
/// id is unique within the topic; with the topic id in front ([`ExternalMessageId`]) it is unique
/// across topics and topic re-creations. Ids are not secret: they are positions.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct MessageId {
    pub(crate) partition: PartitionId,
    pub(crate) offset: Offset,
}

impl MessageId {
    pub(crate) fn new(partition: PartitionId, offset: Offset) -> Self {
        MessageId { partition, offset }
    }
}

impl fmt::Debug for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MessageId({}:{})", self.partition.0, self.offset.0)
    }
}

/// The id as clients see it (HTTP `/v1/messages/{id}`, the `strand-message-id` header): the
/// topic id, the origin partition and the origin offset, as 56 lowercase hex digits
/// (32 + 8 + 16). The HTTP layer routes an ack by it: topic id -> queue, partition -> shard.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) struct ExternalMessageId {
    pub(crate) topic: TopicId,
    pub(crate) id: MessageId,
}

/// Length of [`ExternalMessageId`]'s text form.
pub(crate) const EXTERNAL_ID_LEN: usize = 56;

impl fmt::Display for ExternalMessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}{:08x}{:016x}",
            self.topic.0.simple(),
            self.id.partition.0 as u32,
            self.id.offset.0 as u64
        )
    }
}

/// Why a text message id does not parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BadMessageId;

impl fmt::Display for BadMessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a message id is {EXTERNAL_ID_LEN} hexadecimal digits")
    }
}

impl FromStr for ExternalMessageId {
    type Err = BadMessageId;

    fn from_str(s: &str) -> Result<Self, BadMessageId> {
        if s.len() != EXTERNAL_ID_LEN || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(BadMessageId);
        }
        // All ASCII, so these byte ranges are character boundaries.
        let topic = u128::from_str_radix(s.get(0..32).ok_or(BadMessageId)?, 16).map_err(|_| BadMessageId)?;
        let partition =
            u32::from_str_radix(s.get(32..40).ok_or(BadMessageId)?, 16).map_err(|_| BadMessageId)?;
        let offset = u64::from_str_radix(s.get(40..56).ok_or(BadMessageId)?, 16).map_err(|_| BadMessageId)?;
        let (partition, offset) = (partition as i32, offset as i64);
        if partition < 0 || offset < 0 {
            return Err(BadMessageId);
        }
        Ok(ExternalMessageId {
            topic: TopicId(uuid::Uuid::from_u128(topic)),
            id: MessageId::new(PartitionId(partition), Offset(offset)),
        })
    }
}

/// A lease generation. Drawn from a per-partition counter that only grows (also across restarts,
/// see `Generation` records), so it is also monotonic per message. 0 means "never leased".
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub(crate) struct Generation(pub(crate) u64);

impl fmt::Debug for Generation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Generation({})", self.0)
    }
}

/// Who holds a lease: the HTTP consumer id, or the share-group member id.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct ConsumerId(pub(crate) String);

impl ConsumerId {
    pub(crate) fn new(s: impl Into<String>) -> Self {
        ConsumerId(s.into())
    }

    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ConsumerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ConsumerId({:?})", self.0)
    }
}

/// One state-log write (an [`Action::Persist`](super::Action::Persist)). Numbered from 1 in
/// emission order within one engine instance; confirming `n` confirms every write `<= n`.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub(crate) struct WriteId(pub(crate) u64);

/// The caller's handle for a request whose reply comes back as an
/// [`Action::Reply`](super::Action::Reply). The engine never interprets it.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub(crate) struct RequestId(pub(crate) u64);

/// Stable 64-bit hash of a message key (FNV-1a), used for `ordering=key` and persisted in
/// delivery records. A collision only serializes two keys more than needed; it never breaks
/// a guarantee.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub(crate) struct KeyHash(pub(crate) u64);

impl KeyHash {
    pub(crate) fn of(key: &[u8]) -> KeyHash {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in key {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        KeyHash(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn external_ids_round_trip() {
        let topic = TopicId(uuid::Uuid::from_u128(0x0123_4567_89ab_cdef_0011_2233_4455_6677));
        let ext = ExternalMessageId {
            topic,
            id: MessageId::new(PartitionId(7), Offset(123_456_789)),
        };
        let text = ext.to_string();
        assert_eq!(text.len(), EXTERNAL_ID_LEN);
        assert_eq!(text, "0123456789abcdef00112233445566770000000700000000075bcd15");
        assert_eq!(text.parse::<ExternalMessageId>(), Ok(ext));
        assert_eq!(text.to_uppercase().parse::<ExternalMessageId>(), Ok(ext));
    }

    #[test]
    fn bad_external_ids_are_refused() {
        for bad in [
            "",
            "xyz",
            &"0".repeat(55),
            &"0".repeat(57),
            &format!("{}g", "0".repeat(55)),
            // negative partition / offset
            &format!("{}{}{}", "0".repeat(32), "ffffffff", "0".repeat(16)),
            &format!("{}{}{}", "0".repeat(32), "00000000", "f".repeat(16)),
            // multibyte characters with the right byte length
            &format!("{}é", "0".repeat(54)),
        ] {
            assert_eq!(bad.parse::<ExternalMessageId>(), Err(BadMessageId), "{bad:?}");
        }
    }

    #[test]
    fn key_hash_is_stable() {
        // Persisted in records: must never change between versions.
        assert_eq!(KeyHash::of(b""), KeyHash(0xcbf2_9ce4_8422_2325));
        assert_eq!(KeyHash::of(b"a"), KeyHash(0xaf63_dc4c_8601_ec8c));
    }
}
