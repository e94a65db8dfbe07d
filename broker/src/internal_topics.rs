//! Which topic names belong to the broker, and what clients may not do to them: the one
//! definition every path checks (the core's produce path, which Produce and dead-letter appends
//! take, and the queue's publish; redrive; DeleteRecords; the controller's CreateTopics, config
//! changes, CreatePartitions and DeleteTopics; Metadata's auto-creation and `is_internal`; the
//! HTTP queue names and dead-letter settings; KIP-848 regex subscriptions). A share group's
//! `errors.deadletterqueue.topic.name` has its own, stricter rule (no `__` name at all).
//!
//! - **Internal topics** are Kafka's (`Topic.INTERNAL_TOPICS`): `__consumer_offsets`,
//!   `__transaction_state`, `__share_group_state`. Only the broker writes them (Kafka's
//!   `ReplicaManager` refuses client appends and DeleteRecords with INVALID_TOPIC_EXCEPTION),
//!   Metadata lists them as internal, and regex subscriptions leave them out. A record a client
//!   put in `__consumer_offsets` would be replayed by the group coordinator at the next start.
//! - **Reserved names** are the internal topics plus the names of state the broker keeps
//!   elsewhere: `__cluster_metadata` (Kafka's metadata log; Kafka's controller refuses to create
//!   it with INVALID_REQUEST) and `__queue_state` (the directory of the queue engines' state
//!   logs). No client creates a topic of a reserved name, and none is a dead-letter target.
//!
//! Names merely starting with `__` are ordinary topics, as in Kafka (tools such as Debezium and
//! Confluent's create `__`-prefixed topics). The broker's other files in the log directory
//! (`strand-journal`, `strand-metadata.json`, `meta.properties`) need no reservation: a
//! partition's directory is always `{topic}-{partition}`, which none of them can be.

/// The group coordinator's topic.
pub(crate) const CONSUMER_OFFSETS: &str = "__consumer_offsets";
/// Kafka's transaction coordinator's topic (Strand has no transactions yet).
pub(crate) const TRANSACTION_STATE: &str = "__transaction_state";
/// Kafka's share coordinator's topic (Strand keeps share-group state in its queue state logs).
pub(crate) const SHARE_GROUP_STATE: &str = "__share_group_state";
/// Kafka's KRaft metadata log.
pub(crate) const CLUSTER_METADATA: &str = "__cluster_metadata";
/// The directory of the queue engines' state logs, under the log directory.
pub(crate) const QUEUE_STATE: &str = "__queue_state";

/// The side log of a replicated partition (its side records: the queue engines' delivery state,
/// replicated through the partition's Raft group) is `{QUEUE_STATE}/{topic}-{partition}/{SIDE_LOG}`:
/// a name no group's state log directory takes (those encode `%` only before two hex digits).
const SIDE_LOG: &str = "%replicated";

/// The storage directory name of a partition's side log.
pub(crate) fn side_log_dir_name(topic: &str, partition: i32) -> String {
    format!("{QUEUE_STATE}/{topic}-{partition}/{SIDE_LOG}")
}

/// Parses [`side_log_dir_name`] output: (topic, partition).
pub(crate) fn parse_side_log_dir_name(name: &str) -> Option<(&str, i32)> {
    let rest = name.strip_prefix(QUEUE_STATE)?.strip_prefix('/')?;
    let part_dir = rest.strip_suffix(SIDE_LOG)?.strip_suffix('/')?;
    let (topic, p) = part_dir.rsplit_once('-')?;
    if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    strand_protocol::types::validate_topic_name(topic).ok()?;
    Some((topic, p.parse().ok()?))
}

/// Storage settings of the queue engines' state: small segments (snapshots let old ones go),
/// no time or size retention. Standalone state logs and side logs alike.
pub(crate) fn side_log_config() -> strand_storage::LogConfig {
    strand_storage::LogConfig {
        segment_bytes: 8 << 20,
        segment_ms: 7 * 24 * 3600 * 1000,
        retention_ms: None,
        retention_bytes: None,
        index_interval_bytes: 4096,
        max_index_entries: (1 << 20) / 8,
    }
}

/// Kafka's `Topic.INTERNAL_TOPICS`.
const INTERNAL: [&str; 3] = [CONSUMER_OFFSETS, TRANSACTION_STATE, SHARE_GROUP_STATE];
/// Reserved besides the internal topics.
const RESERVED_OTHERS: [&str; 2] = [CLUSTER_METADATA, QUEUE_STATE];

/// Kafka's `Topic.isInternal`.
pub(crate) fn is_internal(topic: &str) -> bool {
    INTERNAL.contains(&topic)
}

/// Whether no client may create a topic of this name.
pub(crate) fn is_reserved(topic: &str) -> bool {
    is_internal(topic) || RESERVED_OTHERS.contains(&topic)
}

/// Why no client (Produce, the queue's publish, a dead-letter append or a redrive) may append
/// to `topic`, if none may: Kafka's message.
pub(crate) fn refuse_client_append(topic: &str) -> Option<String> {
    is_internal(topic).then(|| format!("Cannot append to internal topic {topic}"))
}

/// Why no client may delete records of `topic`, if none may: Kafka's message.
pub(crate) fn refuse_delete_records(topic: &str) -> Option<String> {
    is_internal(topic).then(|| format!("Cannot delete records of internal topic {topic}"))
}

/// Why no client may create a topic named `topic`, if none may: Kafka's message for
/// `__cluster_metadata` (answered with INVALID_REQUEST).
pub(crate) fn refuse_client_create(topic: &str) -> Option<String> {
    is_reserved(topic).then(|| format!("Creation of internal topic {topic} is prohibited."))
}

/// Why `topic` cannot receive dead letters (or be redriven from), if it cannot: a dead-letter
/// topic must be a topic clients may create and produce to.
pub(crate) fn refuse_dead_letter_target(topic: &str) -> Option<String> {
    let what = if is_internal(topic) {
        "an internal topic"
    } else if is_reserved(topic) {
        "a name reserved for the broker's internal state"
    } else {
        return None;
    };
    Some(format!(
        "{topic} is {what}; dead letters must go to a topic clients may produce to"
    ))
}

/// Topic configs that decide when an internal topic's records are deleted. Changing any of
/// them is refused: `__consumer_offsets` must stay compact-only (its records are the groups'
/// committed offsets, which the coordinator replays at start-up), and with `delete` in its
/// cleanup policy, `retention.ms` and `retention.bytes` would delete them.
pub(crate) const PROTECTED_CONFIGS: [&str; 3] = ["cleanup.policy", "retention.ms", "retention.bytes"];

/// Why no client may change config `key` of `topic`, if none may (answered with
/// POLICY_VIOLATION, what Kafka answers when its alter-config policy refuses a change).
pub(crate) fn refuse_config_change(topic: &str, key: &str) -> Option<String> {
    (is_internal(topic) && PROTECTED_CONFIGS.contains(&key)).then(|| {
        format!(
            "{key} of internal topic {topic} cannot be changed: the broker's state in it would be deleted"
        )
    })
}

/// Why no client may add partitions to `topic`, if none may: groups map to the partitions of
/// `__consumer_offsets` by their count, so more partitions would hide committed offsets.
pub(crate) fn refuse_create_partitions(topic: &str) -> Option<String> {
    is_internal(topic).then(|| format!("Cannot add partitions to internal topic {topic}"))
}

/// Why no client may delete `topic`, if none may (Kafka's tools refuse it with this message).
pub(crate) fn refuse_delete_topic(topic: &str) -> Option<String> {
    is_internal(topic)
        .then(|| format!("Topic {topic} is a kafka internal topic and is not allowed to be deleted."))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_topics_are_kafkas_list() {
        for t in ["__consumer_offsets", "__transaction_state", "__share_group_state"] {
            assert!(is_internal(t) && is_reserved(t), "{t}");
            assert_eq!(
                refuse_client_append(t),
                Some(format!("Cannot append to internal topic {t}"))
            );
            assert_eq!(
                refuse_delete_records(t),
                Some(format!("Cannot delete records of internal topic {t}"))
            );
            assert!(refuse_dead_letter_target(t).is_some_and(|m| m.contains("an internal topic")));
            assert!(refuse_delete_topic(t).is_some() && refuse_create_partitions(t).is_some());
            for key in ["cleanup.policy", "retention.ms", "retention.bytes"] {
                assert!(
                    refuse_config_change(t, key).is_some_and(|m| m.contains(key)),
                    "{t} {key}"
                );
            }
            assert_eq!(refuse_config_change(t, "segment.bytes"), None);
        }
        for t in ["__cluster_metadata", "__queue_state"] {
            assert!(!is_internal(t) && is_reserved(t), "{t}");
            assert_eq!(refuse_client_append(t), None);
            assert_eq!(
                refuse_client_create(t),
                Some(format!("Creation of internal topic {t} is prohibited."))
            );
            assert!(refuse_dead_letter_target(t).is_some_and(|m| m.contains("reserved")));
        }
        for t in [
            "orders",
            "__consumer_offsets2",
            "_consumer_offsets",
            "__my_topic",
            "strand-journal",
        ] {
            assert!(!is_internal(t) && !is_reserved(t), "{t}");
            assert_eq!(refuse_client_append(t), None);
            assert_eq!(refuse_delete_records(t), None);
            assert_eq!(refuse_client_create(t), None);
            assert_eq!(refuse_dead_letter_target(t), None);
            assert_eq!(refuse_delete_topic(t), None);
            assert_eq!(refuse_create_partitions(t), None);
            assert_eq!(refuse_config_change(t, "retention.ms"), None);
        }
    }
}
