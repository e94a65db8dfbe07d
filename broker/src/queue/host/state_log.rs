//! State logs: one storage log per engine under `__queue_state/{topic}-{partition}/{group}`
//! (the group percent-encoded), named, configured and cleaned up here.

use super::ops::QueueFailure;
use std::path::Path;
use strand_storage::LogConfig;

/// Directory (under the log directory) of the engines' state logs: a reserved name, which no
/// topic may take.
pub(crate) const STATE_DIR: &str = crate::internal_topics::QUEUE_STATE;

/// Longest encoded group name in a directory name.
pub(super) const MAX_GROUP_DIR_BYTES: usize = 200;

/// Checks an HTTP/Kafka group name and gives its directory form: bytes outside
/// `[A-Za-z0-9_-]` are percent-encoded.
pub(crate) fn group_dir_name(group: &str) -> Result<String, QueueFailure> {
    if group.is_empty() {
        return Err(QueueFailure::BadGroup("a group name is not empty".into()));
    }
    let mut out = String::with_capacity(group.len());
    for b in group.bytes() {
        if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    if out.len() > MAX_GROUP_DIR_BYTES {
        return Err(QueueFailure::BadGroup(format!(
            "group name too long (at most {MAX_GROUP_DIR_BYTES} bytes once encoded)"
        )));
    }
    Ok(out)
}

pub(super) fn parse_group_dir_name(name: &str) -> Option<String> {
    let b = name.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            c if c.is_ascii_alphanumeric() || c == b'_' || c == b'-' => {
                out.push(c);
                i += 1;
            }
            _ => return None,
        }
    }
    let s = String::from_utf8(out).ok()?;
    (!s.is_empty()).then_some(s)
}

/// The storage directory name of a state log: `__queue_state/{topic}-{partition}/{group}`.
pub(crate) fn state_log_dir_name(topic: &str, partition: i32, group: &str) -> Result<String, QueueFailure> {
    Ok(format!(
        "{STATE_DIR}/{topic}-{partition}/{}",
        group_dir_name(group)?
    ))
}

/// Parses [`state_log_dir_name`] output: (topic, partition, group).
pub(crate) fn parse_state_log_dir_name(name: &str) -> Option<(&str, i32, String)> {
    let rest = name.strip_prefix(STATE_DIR)?.strip_prefix('/')?;
    let (part_dir, group) = rest.split_once('/')?;
    let (topic, p) = part_dir.rsplit_once('-')?;
    if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    strand_protocol::types::validate_topic_name(topic).ok()?;
    Some((topic, p.parse().ok()?, parse_group_dir_name(group)?))
}

/// Storage settings of every state log (see [`crate::internal_topics::side_log_config`]).
pub(crate) fn state_log_config() -> LogConfig {
    crate::internal_topics::side_log_config()
}

/// Removes `__queue_state/{topic}-{partition}` directories for which `doomed` says so (a
/// deleted topic; at start-up, topics that no longer exist).
pub(crate) fn remove_state_dirs(log_dir: &Path, doomed: impl Fn(&str, i32) -> bool) {
    let root = log_dir.join(STATE_DIR);
    let Ok(entries) = std::fs::read_dir(&root) else {
        return;
    };
    for e in entries.flatten() {
        let Some(name) = e.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        let Some((topic, p)) = name.rsplit_once('-') else {
            continue;
        };
        let Ok(p) = p.parse::<i32>() else { continue };
        if doomed(topic, p) {
            if let Err(err) = std::fs::remove_dir_all(e.path()) {
                tracing::warn!(dir = %e.path().display(), error = %err, "cannot remove queue state");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_log_names_round_trip() {
        for group in ["default", "workers.eu-1", "a/b c", "ü", "%41"] {
            let name = state_log_dir_name("orders", 3, group).unwrap();
            assert!(name.starts_with("__queue_state/orders-3/"));
            let (t, p, g) = parse_state_log_dir_name(&name).unwrap();
            assert_eq!((t, p, g.as_str()), ("orders", 3, group));
            // Never mistaken for a partition directory.
            assert!(!name.contains('.') || group.contains('.'));
        }
        assert_eq!(group_dir_name("workers.eu-1").unwrap(), "workers%2Eeu-1");
        assert!(group_dir_name("").is_err());
        assert!(group_dir_name(&"x".repeat(201)).is_err());
        assert!(parse_state_log_dir_name("orders-3").is_none());
        assert!(parse_state_log_dir_name("__queue_state/orders-x/default").is_none());
        assert!(parse_state_log_dir_name("__queue_state/orders-1/bad.name").is_none());
    }
}
