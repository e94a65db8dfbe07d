//! Environment variables to config keys, as the apache/kafka Docker image maps them.

/// Variables of the Kafka image (and of Strand's own tooling) that are not config keys.
/// They are ignored silently.
const IGNORED_VARS: &[&str] = &[
    "KAFKA_VERSION",
    "KAFKA_HOME",
    "KAFKA_HEAP_OPTS",
    "KAFKA_OPTS",
    "KAFKA_JMX_OPTS",
    "KAFKA_JMX_PORT",
    "KAFKA_JMX_HOSTNAME",
    "KAFKA_LOG4J_OPTS",
    "KAFKA_LOG4J_LOGGERS",
    "KAFKA_LOG4J_ROOT_LOGLEVEL",
    "KAFKA_TOOLS_LOG4J_LOGLEVEL",
    "KAFKA_GC_LOG_OPTS",
    "KAFKA_JVM_PERFORMANCE_OPTS",
    "KAFKA_DEBUG",
    "KAFKA_DEBUG_SUSPEND_FLAG",
    "KAFKA_JAVA_OPTS",
    "KAFKA_CLASSPATH",
    "STRAND_LOG",
    "STRAND_BIN",
    "STRAND_PYTHON",
    "STRAND_WRITE_CONFIG_DOC",
];

/// Prefixes of variables that are ignored silently (test, fuzzing and simulation settings: the
/// test command exports some of them to every broker it starts).
const IGNORED_PREFIXES: &[&str] = &[
    "STRAND_TEST_",
    "STRAND_FUZZ_",
    "STRAND_SIM_",
    "STRAND_QUEUE_SIM_",
    "STRAND_SHARE_SIM_",
];

/// What an environment variable means for the configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum EnvVar {
    /// A config key (which may still turn out to be unknown).
    Key(String),
    /// A known non-config variable of the Kafka image or of Strand's tooling.
    Ignored,
    /// Not a Kafka/Strand variable at all (`PATH`, `HOME`, ...).
    Unrelated,
}

/// Classifies one variable name. Names are case-sensitive, as in the Kafka image.
pub(super) fn classify(name: &str) -> EnvVar {
    if name == "CLUSTER_ID" {
        return EnvVar::Key("cluster.id".to_string());
    }
    if IGNORED_VARS.contains(&name) || IGNORED_PREFIXES.iter().any(|p| name.starts_with(p)) {
        return EnvVar::Ignored;
    }
    if let Some(rest) = name.strip_prefix("KAFKA_") {
        return EnvVar::Key(key_from_env(rest));
    }
    if name.starts_with("STRAND_") {
        return EnvVar::Key(key_from_env(name));
    }
    EnvVar::Unrelated
}

/// Lower-cases, then maps `___` to `-`, `__` to `_` and `_` to `.`, left to right — the same
/// result as the image's `sed -e 's/___/-/g' -e 's/__/@/g' -e 's/_/./g' -e 's/@/_/g'`.
pub(super) fn key_from_env(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut run = 0usize;
    let flush = |out: &mut String, run: &mut usize| {
        while *run >= 3 {
            out.push('-');
            *run -= 3;
        }
        match *run {
            2 => out.push('_'),
            1 => out.push('.'),
            _ => {}
        }
        *run = 0;
    };
    for c in name.chars() {
        if c == '_' {
            run += 1;
        } else {
            flush(&mut out, &mut run);
            out.extend(c.to_lowercase());
        }
    }
    flush(&mut out, &mut run);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> EnvVar {
        EnvVar::Key(name.to_string())
    }

    #[test]
    fn kafka_names() {
        assert_eq!(
            classify("KAFKA_ADVERTISED_LISTENERS"),
            key("advertised.listeners")
        );
        assert_eq!(classify("KAFKA_LOG_RETENTION_MS"), key("log.retention.ms"));
        assert_eq!(classify("KAFKA_NODE_ID"), key("node.id"));
        assert_eq!(classify("CLUSTER_ID"), key("cluster.id"));
        // `__` is a literal underscore and `___` a dash.
        assert_eq!(classify("KAFKA_FOO__BAR"), key("foo_bar"));
        assert_eq!(classify("KAFKA_FOO___BAR_BAZ"), key("foo-bar.baz"));
        assert_eq!(classify("KAFKA_A____B"), key("a-.b"));
        assert_eq!(classify("KAFKA_A_____B"), key("a-_b"));
        assert_eq!(
            classify("KAFKA_CONFLUENT_SUPPORT_METRICS_ENABLE"),
            key("confluent.support.metrics.enable")
        );
    }

    #[test]
    fn strand_names_keep_prefix() {
        assert_eq!(classify("STRAND_HTTP_LISTENER"), key("strand.http.listener"));
        assert_eq!(
            classify("STRAND_MAX_CONNECTIONS_PER_SHARD"),
            key("strand.max.connections.per.shard")
        );
    }

    #[test]
    fn image_and_tool_variables_are_ignored() {
        for name in IGNORED_VARS {
            assert_eq!(classify(name), EnvVar::Ignored, "{name}");
        }
        for name in [
            "STRAND_TEST_KCAT",
            "STRAND_FUZZ_SEED",
            "STRAND_SIM_SEEDS",
            "STRAND_QUEUE_SIM_SEEDS",
        ] {
            assert_eq!(classify(name), EnvVar::Ignored, "{name}");
        }
        assert_eq!(classify("KAFKA_LOG_DIRS"), key("log.dirs"));
        assert_eq!(classify("PATH"), EnvVar::Unrelated);
        assert_eq!(classify("kafka_node_id"), EnvVar::Unrelated);
        assert_eq!(classify("STRAND"), EnvVar::Unrelated);
    }
}
