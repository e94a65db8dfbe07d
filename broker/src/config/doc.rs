//! `docs/configuration.md`, generated from the key tables ([`BROKER_KEYS`](super::BROKER_KEYS),
//! the topic, group and queue keys, [`IGNORED_KEYS`](super::IGNORED_KEYS)), so that what the
//! document says is what the code reads. A test fails when the two differ; to regenerate:
//! `STRAND_WRITE_CONFIG_DOC=1 cargo test -p strand-broker configuration_doc`.

use std::fmt::Write as _;

use super::entry::KeyView;
use super::{
    group, topic, Config, DefaultValue, BROKER_KEYS, IGNORED_KEYS, IGNORED_KEY_PREFIXES, QUEUE_KEYS,
};

/// The command that writes `docs/configuration.md`.
const REGENERATE: &str = "STRAND_WRITE_CONFIG_DOC=1 cargo test -p strand-broker configuration_doc";

const PREAMBLE: &str = "\
# Configuration

Strand reads Kafka's configuration keys, so a setup written for `apache/kafka` mostly carries
over. Sources, highest precedence first:

1. command-line overrides: `strand --override log.retention.ms=60000`, and shorthands such as
   `--listeners`, `--data-dir`, `--shards`, `--http-listener` (see `strand --help`);
2. environment variables, mapped as the apache/kafka image maps them: strip `KAFKA_`,
   lowercase, `___` becomes `-`, `__` becomes `_`, `_` becomes `.`
   (`KAFKA_ADVERTISED_LISTENERS` is `advertised.listeners`); `STRAND_*` variables keep their
   prefix (`STRAND_HTTP_LISTENER` is `strand.http.listener`); `CLUSTER_ID` is `cluster.id`;
3. a `server.properties` file given as the first argument: `strand server.properties`;
4. the defaults below.

An unknown key is reported with a warning; an invalid value stops start-up with a message
naming the key, the value and where it came from. Alternative spellings of one setting
(`node.id`/`broker.id`, `log.dirs`/`log.dir`, `log.retention.{ms,minutes,hours}`,
`log.roll.{ms,hours}`) resolve as one: the highest-precedence source wins, and within a source
Kafka's own order.
";

/// `docs/configuration.md`: every key Strand reads, with its default, unit and purpose.
pub fn configuration_markdown() -> String {
    let broker = Config::default();
    let mut out = String::new();
    out.push_str("<!-- Generated from broker/src/config by `");
    out.push_str(REGENERATE);
    out.push_str("`: edit the key tables there, not this file. -->\n\n");
    out.push_str(PREAMBLE);

    section(
        &mut out,
        "Broker",
        "Read at start-up; DescribeConfigs reports them, read-only.",
    );
    let broker_rows = BROKER_KEYS.iter().map(|k| {
        let default = match k.default {
            DefaultValue::Text(text) => code(text),
            DefaultValue::Null => "none".to_string(),
            DefaultValue::Mirror(target) => format!("that of `{target}`"),
        };
        [code(k.name), default, k.unit.text().to_string(), cell(k.doc)]
    });
    table(&mut out, &["Key", "Default", "Unit", "Description"], broker_rows);

    let (queue, topic): (Vec<KeyView>, Vec<KeyView>) =
        topic::key_views().partition(|k| QUEUE_KEYS.contains(&k.name));
    section(
        &mut out,
        "Topic",
        "Set per topic with CreateTopics or IncrementalAlterConfigs, and reported by \
         DescribeConfigs. A default that follows a broker key names it; the value shown is the \
         one that key's default gives.",
    );
    keyed_table(&mut out, &topic, &broker);

    section(
        &mut out,
        "Group and share group",
        "Set per group with IncrementalAlterConfigs (resource type GROUP), and reported by \
         DescribeConfigs.",
    );
    keyed_table(&mut out, &group::key_views().collect::<Vec<_>>(), &broker);

    section(
        &mut out,
        "Queue",
        "Topic configs of a queue: the HTTP `PUT /v1/queues/{queue}` sets them \
         ([http-api.md](http-api.md)), and so does IncrementalAlterConfigs like any topic \
         config.",
    );
    keyed_table(&mut out, &queue, &broker);

    section(
        &mut out,
        "Accepted and ignored",
        "Keys that compose files for `apache/kafka` set and Strand has no use for yet (thread \
         counts it does not have, the replication of internal topics and transactions it does \
         not run yet): accepted with an informational note, no effect.",
    );
    let ignored = IGNORED_KEYS.iter().map(|k| code(k)).chain(
        IGNORED_KEY_PREFIXES
            .iter()
            .map(|p| format!("{} (any key)", code(&format!("{p}*")))),
    );
    for key in ignored {
        let _ = writeln!(out, "- {key}");
    }
    out
}

fn section(out: &mut String, title: &str, intro: &str) {
    let _ = write!(out, "\n## {title}\n\n");
    // Wrapped as the rest of the document is, at 100 columns.
    let mut line = String::new();
    for word in intro.split_whitespace() {
        if !line.is_empty() && line.len() + 1 + word.len() > 100 {
            let _ = writeln!(out, "{line}");
            line.clear();
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    let _ = writeln!(out, "{line}\n");
}

/// Topic and group keys: their default under `broker`, and the broker keys that set it.
fn keyed_table(out: &mut String, keys: &[KeyView], broker: &Config) {
    let rows = keys.iter().map(|k| {
        let default = (k.default)(broker);
        let default = if default.is_empty() {
            "empty".to_string()
        } else {
            code(&default)
        };
        let from: Vec<String> = k.synonyms.iter().map(|b| code(b)).collect();
        [
            code(k.name),
            default,
            k.unit.text().to_string(),
            from.join(", "),
            cell(k.doc),
        ]
    });
    table(
        out,
        &["Key", "Default", "Unit", "Broker default", "Description"],
        rows,
    );
}

fn table<const N: usize>(out: &mut String, head: &[&str; N], rows: impl Iterator<Item = [String; N]>) {
    let _ = writeln!(out, "| {} |", head.join(" | "));
    let _ = writeln!(out, "|{}", " --- |".repeat(N));
    for row in rows {
        let _ = writeln!(out, "| {} |", row.join(" | "));
    }
}

/// `text` as inline code in a table cell.
fn code(text: &str) -> String {
    format!("`{}`", text.replace('|', "\\|"))
}

/// `text` as a table cell (`<topic>` is text, not an HTML tag).
fn cell(text: &str) -> String {
    text.replace('|', "\\|").replace('<', "&lt;").replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::super::entry::Unit;
    use super::*;

    /// Where the document lives, from the repository's root.
    const PATH: &str = "docs/configuration.md";

    /// `docs/configuration.md` is what the key tables generate; set `STRAND_WRITE_CONFIG_DOC`
    /// to write it.
    #[test]
    fn configuration_doc_matches_the_key_tables() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(PATH);
        let want = configuration_markdown();
        if std::env::var_os("STRAND_WRITE_CONFIG_DOC").is_some() {
            std::fs::write(&path, &want).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
            return;
        }
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        if have != want {
            let line = have
                .lines()
                .zip(want.lines())
                .position(|(h, w)| h != w)
                .unwrap_or_else(|| have.lines().count().min(want.lines().count()));
            panic!(
                "{PATH} differs from the key tables in broker/src/config (first at line {}); \
                 regenerate it: {REGENERATE}",
                line + 1
            );
        }
    }

    /// Every key is documented, and a key whose name states a unit has that unit.
    #[test]
    fn configuration_doc_states_every_keys_unit_and_purpose() {
        let mut keys: Vec<(&str, Unit, &str)> = BROKER_KEYS.iter().map(|k| (k.name, k.unit, k.doc)).collect();
        for k in topic::key_views().chain(group::key_views()) {
            keys.push((k.name, k.unit, k.doc));
        }
        for (name, unit, doc) in keys {
            assert!(
                doc.ends_with('.') && doc.len() > 10,
                "{name}: documentation {doc:?}"
            );
            let named = [
                (".ms", Unit::Milliseconds),
                (".bytes", Unit::Bytes),
                (".minutes", Unit::Minutes),
                (".hours", Unit::Hours),
            ];
            for (suffix, want) in named {
                if name.ends_with(suffix) {
                    assert_eq!(unit, want, "{name}");
                }
            }
        }
    }
}
