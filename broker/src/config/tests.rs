use std::path::Path;

use super::*;

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn args(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

fn load_env(pairs: &[(&str, &str)]) -> Loaded {
    load(None, env(pairs), &[]).unwrap()
}

fn load_args(items: &[&str]) -> Loaded {
    load(None, Vec::new(), &args(items)).unwrap()
}

fn load_err(items: &[&str]) -> String {
    load(None, Vec::new(), &args(items)).unwrap_err().to_string()
}

fn write_file(dir: &tempfile::TempDir, text: &str) -> std::path::PathBuf {
    let path = dir.path().join("server.properties");
    std::fs::write(&path, text).unwrap();
    path
}

fn hp(host: &str, port: u16) -> HostPort {
    HostPort {
        host: host.to_string(),
        port,
    }
}

fn entry(config: &Config, name: &str) -> ConfigEntry {
    config
        .broker_entries()
        .into_iter()
        .find(|e| e.name == name)
        .unwrap()
}

#[test]
fn defaults() {
    let loaded = load(None, Vec::new(), &[]).unwrap();
    assert!(loaded.warnings.is_empty() && loaded.notes.is_empty());
    let c = loaded.config;
    assert_eq!(c, Config::default());
    assert_eq!(c.node_id, NodeId(1));
    assert_eq!(c.cluster_id, "strand-local-cluster");
    assert_eq!(
        c.listeners,
        vec![Listener {
            name: "PLAINTEXT".into(),
            security_protocol: SecurityProtocol::Plaintext,
            bind: hp("127.0.0.1", 9092),
            advertised: hp("127.0.0.1", 9092),
        }]
    );
    assert!(c.controller_listeners.is_empty());
    assert_eq!(c.log_dir, Path::new("./strand-data"));
    assert_eq!(c.num_partitions, 1);
    assert!(c.auto_create_topics_enable);
    assert_eq!(c.retention_ms, Some(168 * 3_600_000));
    assert_eq!(c.retention_bytes, None);
    assert_eq!(c.segment_bytes, 1_073_741_824);
    assert_eq!(c.segment_ms, 168 * 3_600_000);
    assert_eq!(c.index_interval_bytes, 4096);
    assert_eq!(c.index_size_max_bytes, 10_485_760);
    assert_eq!(c.retention_check_interval_ms, 300_000);
    assert_eq!(c.message_max_bytes, 1_048_588);
    assert_eq!(c.socket_request_max_bytes, 104_857_600);
    assert_eq!(c.fetch_max_bytes, 31_457_280);
    assert!(c.fetch_sendfile);
    assert_eq!(c.max_connections, 2_147_483_647);
    assert_eq!(c.max_connections_per_shard, 10_000);
    assert_eq!(c.max_inflight_requests_per_connection, 256);
    assert_eq!(c.request_memory_bytes, 512 << 20);
    let cores = std::thread::available_parallelism()
        .unwrap()
        .get()
        .min(MAX_SHARDS);
    assert_eq!(c.shards, cores);
    assert_eq!(c.http_listener, hp("127.0.0.1", 8080));
    assert_eq!(c.admin_listener, hp("127.0.0.1", 9644));
    assert_eq!(c.journal_segment_bytes, 134_217_728);
    assert_eq!(c.journal_recycle_files, 2);
    assert_eq!(c.group_min_session_timeout_ms, 6000);
    assert_eq!(c.group_max_session_timeout_ms, 1_800_000);
    assert_eq!(c.offsets_retention_minutes, 10_080);
    assert_eq!(
        (
            c.max_partitions,
            c.max_partitions_per_topic,
            c.max_partitions_per_request
        ),
        (15_000, 10_000, 10_000)
    );
    assert!(c
        .broker_entries()
        .iter()
        .all(|e| e.source == ConfigSource::DefaultConfig));
}

#[test]
fn table_defaults_round_trip_as_explicit_values() {
    // Setting every key to its documented default changes nothing but the sources.
    let overrides: Vec<String> = BROKER_KEYS
        .iter()
        .filter_map(|k| match k.default {
            Text(text) => Some(format!("{}={text}", k.name)),
            _ => None,
        })
        .collect();
    let loaded = load(None, Vec::new(), &overrides).unwrap();
    assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
    let defaults = Config::default();
    let mut explicit = loaded.config.clone();
    explicit.explicit.clear();
    assert_eq!(explicit, defaults);
    for (e, d) in loaded
        .config
        .broker_entries()
        .iter()
        .zip(defaults.broker_entries())
    {
        assert_eq!((e.name, &e.value), (d.name, &d.value));
        if e.value.is_some() {
            assert_eq!(e.source, ConfigSource::StaticBrokerConfig, "{}", e.name);
        }
    }
}

#[test]
fn precedence_override_env_file_default() {
    let dir = tempfile::tempdir().unwrap();
    let file = write_file(
        &dir,
        "num.partitions=2\nmessage.max.bytes=2000\nfetch.max.bytes=3000\n",
    );
    let env = env(&[("KAFKA_NUM_PARTITIONS", "3"), ("KAFKA_MESSAGE_MAX_BYTES", "4000")]);
    let loaded = load(Some(&file), env, &args(&["num.partitions=4"])).unwrap();
    let c = &loaded.config;
    assert_eq!(c.num_partitions, 4, "override beats env and file");
    assert_eq!(c.message_max_bytes, 4000, "env beats file");
    assert_eq!(c.fetch_max_bytes, 3000, "file beats default");
    assert_eq!(c.socket_request_max_bytes, 104_857_600, "default");
    assert_eq!(c.origin("num.partitions"), Some(&Origin::Override));
    assert_eq!(
        c.origin("message.max.bytes"),
        Some(&Origin::Env {
            var: "KAFKA_MESSAGE_MAX_BYTES".into()
        })
    );
    assert_eq!(
        c.origin("fetch.max.bytes"),
        Some(&Origin::File {
            path: file.clone(),
            line: 3
        })
    );
    assert_eq!(c.origin("socket.request.max.bytes"), None);
    // Later overrides win over earlier ones.
    assert_eq!(
        load_args(&["num.partitions=5", "num.partitions=6"])
            .config
            .num_partitions,
        6
    );
}

#[test]
fn environment_mapping() {
    let loaded = load_env(&[
        ("KAFKA_LOG_RETENTION_MS", "1000"),
        ("STRAND_HTTP_LISTENER", "0.0.0.0:18080"),
        ("STRAND_MAX_INFLIGHT_REQUESTS_PER_CONNECTION", "8"),
        ("CLUSTER_ID", "MkU3OEVBNTcwNTJENDM2Qk"),
        ("KAFKA_SOME___DASHED_KEY", "1"),
        ("KAFKA_SOME__UNDERSCORED_KEY", "1"),
        ("PATH", "/usr/bin"),
        ("HOME", "/root"),
    ]);
    let c = &loaded.config;
    assert_eq!(c.retention_ms, Some(1000));
    assert_eq!(c.http_listener, hp("0.0.0.0", 18080));
    assert_eq!(c.max_inflight_requests_per_connection, 8);
    assert_eq!(c.cluster_id, "MkU3OEVBNTcwNTJENDM2Qk");
    assert_eq!(loaded.warnings.len(), 2, "{:?}", loaded.warnings);
    assert!(loaded
        .warnings
        .iter()
        .any(|w| w.contains("`some-dashed.key`") && w.contains("KAFKA_SOME___DASHED_KEY")));
    assert!(loaded
        .warnings
        .iter()
        .any(|w| w.contains("`some_underscored.key`")));
}

#[test]
fn two_variables_for_one_key_warn_and_resolve_deterministically() {
    let loaded = load_env(&[("KAFKA_CLUSTER_ID", "b"), ("CLUSTER_ID", "a")]);
    assert_eq!(loaded.config.cluster_id, "b");
    assert_eq!(loaded.warnings.len(), 1);
    assert!(loaded.warnings[0].contains("CLUSTER_ID") && loaded.warnings[0].contains("KAFKA_CLUSTER_ID"));
}

#[test]
fn image_and_tool_variables_are_ignored_silently() {
    let loaded = load_env(&[
        ("KAFKA_VERSION", "3.9.0"),
        ("KAFKA_HOME", "/opt/kafka"),
        ("KAFKA_HEAP_OPTS", "-Xmx1G"),
        ("KAFKA_OPTS", "-Dx=y"),
        ("KAFKA_JMX_OPTS", "x"),
        ("KAFKA_JMX_PORT", "9999"),
        ("KAFKA_LOG4J_OPTS", "x"),
        ("KAFKA_LOG4J_LOGGERS", "kafka=WARN"),
        ("KAFKA_LOG4J_ROOT_LOGLEVEL", "WARN"),
        ("KAFKA_TOOLS_LOG4J_LOGLEVEL", "ERROR"),
        ("KAFKA_GC_LOG_OPTS", "x"),
        ("KAFKA_JVM_PERFORMANCE_OPTS", "x"),
        ("KAFKA_DEBUG", "y"),
        ("KAFKA_DEBUG_SUSPEND_FLAG", "n"),
        ("KAFKA_JAVA_OPTS", "x"),
        ("KAFKA_CLASSPATH", "/x"),
        ("STRAND_LOG", "debug"),
        ("STRAND_BIN", "/target/strand"),
        ("STRAND_TEST_PYTHON", "/venv/bin/python"),
    ]);
    assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
    assert!(loaded.notes.is_empty(), "{:?}", loaded.notes);
    assert_eq!(loaded.config, Config::default());
}

#[test]
fn kraft_keys_are_accepted_without_warning() {
    let mut overrides: Vec<String> = IGNORED_KEYS.iter().map(|k| format!("{k}=whatever")).collect();
    overrides.push("confluent.support.metrics.enable=false".to_string());
    let loaded = load(None, Vec::new(), &overrides).unwrap();
    assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
    assert_eq!(loaded.notes.len(), overrides.len(), "{:?}", loaded.notes);
    assert!(loaded
        .notes
        .iter()
        .any(|n| n.contains("transaction.state.log.replication.factor")));
}

#[test]
fn unknown_keys_warn() {
    let dir = tempfile::tempdir().unwrap();
    let file = write_file(&dir, "# x\nno.such.key=1\n");
    let loaded = load(
        Some(&file),
        env(&[("STRAND_NO_SUCH", "1")]),
        &args(&["Num.Partitions=3"]),
    )
    .unwrap();
    assert_eq!(loaded.warnings.len(), 3, "{:?}", loaded.warnings);
    let all = loaded.warnings.join("\n");
    assert!(all.contains("`no.such.key`") && all.contains("line 2"), "{all}");
    assert!(
        all.contains("`strand.no.such`") && all.contains("STRAND_NO_SUCH"),
        "{all}"
    );
    assert!(
        all.contains("`Num.Partitions`") && all.contains("command-line override"),
        "{all}"
    );
    assert_eq!(loaded.config.num_partitions, 1);
}

#[test]
fn invalid_values_name_key_value_and_source() {
    let cases: &[(&str, &str, &str)] = &[
        ("node.id", "-1", "integer from 0"),
        ("node.id", "abc", "decimal"),
        ("broker.id", "x", "decimal"),
        ("cluster.id", "", "non-empty"),
        ("listeners", "localhost:9092", "NAME://host:port"),
        ("listeners", "SSL://:9093", "not supported yet"),
        ("advertised.listeners", "PLAINTEXT://host", "host:port"),
        (
            "listener.security.protocol.map",
            "PLAINTEXT:TLS",
            "security protocol",
        ),
        ("controller.listener.names", "A B", "listener name"),
        ("log.dirs", "/a,/b", "JBOD"),
        ("log.dir", " , ", "directory"),
        ("num.partitions", "0", "from 1"),
        ("num.partitions", "2147483648", "from 1 to 2147483647"),
        ("auto.create.topics.enable", "yes", "true or false"),
        ("log.retention.ms", "-2", ">= -1"),
        ("log.retention.ms", "1e3", "no units"),
        ("log.retention.minutes", "x", "decimal"),
        ("log.retention.hours", "1.5", "decimal"),
        ("log.retention.bytes", "10GB", "no units"),
        ("log.segment.bytes", "13", "from 14"),
        ("log.roll.ms", "0", ">= 1"),
        ("log.roll.hours", "0", "from 1"),
        ("log.index.interval.bytes", "-1", "from 0"),
        ("log.index.size.max.bytes", "3", "from 4"),
        ("log.retention.check.interval.ms", "0", ">= 1"),
        ("message.max.bytes", "1_000", "decimal"),
        ("socket.request.max.bytes", "0", "from 1"),
        ("fetch.max.bytes", "1023", "from 1024"),
        ("max.connections", "-5", "from 0"),
        ("strand.max.connections.per.shard", "0", "from 1"),
        ("strand.max.inflight.requests.per.connection", "0", "from 1"),
        ("strand.request.memory.bytes", "0", ">= 1"),
        ("strand.shards", "100000", "from 0 to 1024"),
        ("strand.http.listener", "8080", "host:port"),
        ("strand.admin.listener", "[::1:9644", "]"),
        ("strand.journal.segment.bytes", "1000", ">= 1048576"),
        ("strand.journal.recycle.files", "65", "from 0 to 64"),
        ("group.min.session.timeout.ms", "x", "decimal"),
        (
            "group.max.session.timeout.ms",
            "100",
            "at least group.min.session.timeout.ms (6000)",
        ),
        ("offsets.retention.minutes", "0", "from 1"),
        ("strand.max.partitions", "0", "from 1"),
        (
            "strand.max.partitions",
            "49",
            "at least offsets.topic.num.partitions (50)",
        ),
        ("strand.max.partitions.per.topic", "100001", "from 1 to 100000"),
        ("strand.max.partitions.per.request", "0", "from 1"),
    ];
    let dir = tempfile::tempdir().unwrap();
    for (key, value, expected) in cases {
        // As an override.
        let msg = load_err(&[&format!("{key}={value}")]);
        let canonical = key;
        assert!(msg.contains(&format!("`{canonical}`")), "{key}: {msg}");
        assert!(msg.contains("command-line override"), "{key}: {msg}");
        assert!(msg.contains(expected), "{key}: {msg}");
        assert!(msg.contains(&format!("`{}`", value.trim())), "{key}: {msg}");
        // From the environment.
        let var = format!("KAFKA_{}", key.replace('.', "_").to_ascii_uppercase());
        let var = var.replace("KAFKA_STRAND_", "STRAND_");
        let msg = load(None, env(&[(&var, value)]), &[]).unwrap_err().to_string();
        assert!(
            msg.contains(&format!("`{canonical}`")) && msg.contains(&var),
            "{key}: {msg}"
        );
        // From the file.
        let file = write_file(&dir, &format!("\n{key}={value}\n"));
        let msg = load(Some(&file), Vec::new(), &[]).unwrap_err().to_string();
        assert!(msg.contains(&format!("`{canonical}`")), "{key}: {msg}");
        assert!(
            msg.contains(&file.display().to_string()) && msg.contains("line 2"),
            "{key}: {msg}"
        );
    }
}

#[test]
fn integers_are_strict_but_allow_sign_and_spaces() {
    assert_eq!(load_args(&["num.partitions= 7 "]).config.num_partitions, 7);
    assert_eq!(load_args(&["num.partitions=+7"]).config.num_partitions, 7);
    assert_eq!(
        entry(&load_args(&["num.partitions=007"]).config, "num.partitions")
            .value
            .as_deref(),
        Some("7")
    );
    for bad in ["", "7.0", "0x10", "1e3", "10MB", "1 000", "--1"] {
        assert!(
            load(None, Vec::new(), &args(&[&format!("num.partitions={bad}")])).is_err(),
            "{bad}"
        );
    }
}

#[test]
fn retention_precedence() {
    let c = |items: &[&str]| load_args(items).config;
    assert_eq!(c(&["log.retention.hours=2"]).retention_ms, Some(7_200_000));
    assert_eq!(
        c(&["log.retention.hours=2", "log.retention.minutes=3"]).retention_ms,
        Some(180_000)
    );
    assert_eq!(
        c(&[
            "log.retention.hours=2",
            "log.retention.minutes=3",
            "log.retention.ms=4"
        ])
        .retention_ms,
        Some(4)
    );
    assert_eq!(c(&["log.retention.ms=0"]).retention_ms, Some(0));
    assert_eq!(
        c(&["log.retention.ms=-1", "log.retention.hours=1"]).retention_ms,
        None
    );
    assert_eq!(c(&["log.retention.minutes=-1"]).retention_ms, None);
    assert_eq!(c(&["log.retention.hours=-1"]).retention_ms, None);
    assert_eq!(c(&["log.retention.bytes=-1"]).retention_bytes, None);
    assert_eq!(c(&["log.retention.bytes=0"]).retention_bytes, Some(0));
    assert_eq!(c(&["log.roll.hours=1"]).segment_ms, 3_600_000);
    assert_eq!(c(&["log.roll.hours=1", "log.roll.ms=5"]).segment_ms, 5);

    // Across sources, the higher-precedence source decides, whatever unit it uses.
    let dir = tempfile::tempdir().unwrap();
    let file = write_file(&dir, "log.retention.ms=1000\nlog.roll.ms=77\n");
    let loaded = load(Some(&file), env(&[("KAFKA_LOG_RETENTION_HOURS", "1")]), &[]).unwrap();
    assert_eq!(loaded.config.retention_ms, Some(3_600_000));
    assert_eq!(loaded.config.segment_ms, 77);
    assert!(loaded.warnings.is_empty());
    assert!(loaded
        .notes
        .iter()
        .any(|n| n.contains("log.retention.ms") && n.contains("KAFKA_LOG_RETENTION_HOURS")));
    // The overridden spelling is not reported as set.
    let e = entry(&loaded.config, "log.retention.ms");
    assert_eq!((e.value, e.source), (None, ConfigSource::DefaultConfig));
    let e = entry(&loaded.config, "log.retention.hours");
    assert_eq!(
        (e.value.as_deref(), e.source),
        (Some("1"), ConfigSource::StaticBrokerConfig)
    );
}

#[test]
fn aliases() {
    let c = load_args(&["broker.id=7", "log.dir=/data"]).config;
    assert_eq!(c.node_id, NodeId(7));
    assert_eq!(c.log_dir, Path::new("/data"));
    assert!(c.is_set("node.id") && c.is_set("log.dirs"));
    assert_eq!(entry(&c, "broker.id").value.as_deref(), Some("7"));
    assert_eq!(entry(&c, "broker.id").source, ConfigSource::StaticBrokerConfig);
    assert_eq!(entry(&c, "log.dir").value.as_deref(), Some("/data"));

    // Same source: node.id and broker.id must agree; log.dirs wins over log.dir.
    let msg = load_err(&["node.id=1", "broker.id=2"]);
    assert!(msg.contains("`broker.id`") && msg.contains("node.id"), "{msg}");
    assert_eq!(load_args(&["node.id=3", "broker.id=3"]).config.node_id, NodeId(3));
    let loaded = load_args(&["log.dirs=/a", "log.dir=/b"]);
    assert_eq!(loaded.config.log_dir, Path::new("/a"));
    assert!(loaded.warnings.is_empty());

    // Different sources: the higher-precedence one wins, whichever spelling it uses.
    let dir = tempfile::tempdir().unwrap();
    let file = write_file(&dir, "broker.id=0\nlog.dirs=/tmp/kafka-logs\n");
    let loaded = load(
        Some(&file),
        env(&[("KAFKA_NODE_ID", "5"), ("KAFKA_LOG_DIR", "/var/lib/strand")]),
        &[],
    )
    .unwrap();
    assert_eq!(loaded.config.node_id, NodeId(5));
    assert_eq!(loaded.config.log_dir, Path::new("/var/lib/strand"));
    assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
}

#[test]
fn listeners_through_load() {
    let c = load_args(&["listeners=PLAINTEXT://:0", "strand.http.listener=:0"]).config;
    assert_eq!(c.listeners[0].bind, hp("0.0.0.0", 0));
    assert_eq!(c.http_listener, hp("0.0.0.0", 0));

    let c = load_args(&["listeners=PLAINTEXT://[::1]:9092"]).config;
    assert_eq!(c.listeners[0].bind, hp("::1", 9092));
    assert_eq!(c.listeners[0].advertised, hp("::1", 9092));

    // Wildcard advertised hosts become the machine's host name (HOSTNAME from the given env).
    let loaded = load(
        None,
        env(&[
            ("HOSTNAME", "box7"),
            ("KAFKA_LISTENERS", "PLAINTEXT://0.0.0.0:9092"),
        ]),
        &[],
    );
    let c = loaded.unwrap().config;
    assert_eq!(c.listeners[0].advertised, hp("box7", 9092));
    let c = load(
        None,
        env(&[("HOSTNAME", "box7")]),
        &args(&[
            "listeners=PLAINTEXT://127.0.0.1:0",
            "advertised.listeners=PLAINTEXT://:0",
        ]),
    )
    .unwrap()
    .config;
    assert_eq!(
        c.listeners[0].advertised,
        hp("box7", 0),
        "port 0 = the bound port"
    );
    // Without HOSTNAME, /proc or "localhost" supplies a non-empty name.
    let c = load_args(&["listeners=PLAINTEXT://:9092"]).config;
    assert!(!c.listeners[0].advertised.host.is_empty() && !c.listeners[0].advertised.is_wildcard());

    let msg = load_err(&["listeners=PLAINTEXT://:9092,PLAINTEXT://:9093"]);
    assert!(msg.contains("`listeners`") && msg.contains("unique"), "{msg}");
    let msg = load_err(&["listeners=SASL_PLAINTEXT://:9092"]);
    assert!(msg.contains("SSL/SASL listeners are not supported yet"), "{msg}");
    let msg = load_err(&["listeners=CLIENT://:9092"]);
    assert!(msg.contains("listener.security.protocol.map"), "{msg}");
    let msg = load_err(&[
        "listeners=CLIENT://:9092",
        "listener.security.protocol.map=CLIENT:SASL_SSL",
    ]);
    assert!(msg.contains("not supported yet"), "{msg}");
    let msg = load_err(&["advertised.listeners=OTHER://h:1"]);
    assert!(
        msg.contains("`advertised.listeners`") && msg.contains("OTHER"),
        "{msg}"
    );
    let msg = load_err(&["listeners=PLAINTEXT://:8080"]);
    assert!(
        msg.contains("`strand.http.listener`") && msg.contains("8080"),
        "{msg}"
    );
    let msg = load_err(&["strand.admin.listener=127.0.0.1:8080"]);
    assert!(msg.contains("`strand.admin.listener`"), "{msg}");
}

#[test]
fn controller_listener_is_excluded() {
    let loaded = load_args(&[
        "listeners=PLAINTEXT://:9092,CONTROLLER://:9093",
        "controller.listener.names=CONTROLLER",
        "advertised.listeners=PLAINTEXT://localhost:9092",
    ]);
    let c = &loaded.config;
    assert_eq!(c.listeners.len(), 1);
    assert_eq!(c.listeners[0].name, "PLAINTEXT");
    assert_eq!(c.controller_listeners, vec!["CONTROLLER://:9093".to_string()]);
    assert!(loaded.notes.iter().any(|n| n.contains("CONTROLLER://:9093")));
    assert!(loaded.warnings.is_empty());
}

#[test]
fn compose_single_listener() {
    let loaded = load_env(&[
        ("KAFKA_NODE_ID", "1"),
        ("KAFKA_PROCESS_ROLES", "broker,controller"),
        ("KAFKA_LISTENERS", "PLAINTEXT://:9092,CONTROLLER://:9093"),
        ("KAFKA_ADVERTISED_LISTENERS", "PLAINTEXT://localhost:9092"),
        ("KAFKA_CONTROLLER_LISTENER_NAMES", "CONTROLLER"),
        (
            "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP",
            "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        ),
        ("KAFKA_CONTROLLER_QUORUM_VOTERS", "1@localhost:9093"),
        ("KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR", "1"),
        ("KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR", "1"),
        ("KAFKA_TRANSACTION_STATE_LOG_MIN_ISR", "1"),
        ("KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS", "0"),
        ("KAFKA_NUM_PARTITIONS", "3"),
        ("CLUSTER_ID", "MkU3OEVBNTcwNTJENDM2Qk"),
        // What the image and the shell put there too.
        ("KAFKA_VERSION", "3.9.0"),
        ("HOSTNAME", "3f2a1b"),
        ("PATH", "/usr/local/sbin:/usr/local/bin"),
    ]);
    assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
    let c = &loaded.config;
    assert_eq!(c.node_id, NodeId(1));
    assert_eq!(c.cluster_id, "MkU3OEVBNTcwNTJENDM2Qk");
    assert_eq!(c.num_partitions, 3);
    assert_eq!(
        c.listeners,
        vec![Listener {
            name: "PLAINTEXT".into(),
            security_protocol: SecurityProtocol::Plaintext,
            bind: hp("0.0.0.0", 9092),
            advertised: hp("localhost", 9092),
        }]
    );
}

#[test]
fn compose_two_listeners() {
    let loaded = load_env(&[
        ("KAFKA_NODE_ID", "1"),
        ("KAFKA_PROCESS_ROLES", "broker,controller"),
        (
            "KAFKA_LISTENERS",
            "PLAINTEXT://0.0.0.0:29092,PLAINTEXT_HOST://0.0.0.0:9092,CONTROLLER://0.0.0.0:9093",
        ),
        (
            "KAFKA_ADVERTISED_LISTENERS",
            "PLAINTEXT://kafka:29092,PLAINTEXT_HOST://localhost:9092",
        ),
        (
            "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP",
            "PLAINTEXT:PLAINTEXT,PLAINTEXT_HOST:PLAINTEXT",
        ),
        ("KAFKA_CONTROLLER_LISTENER_NAMES", "CONTROLLER"),
        ("KAFKA_INTER_BROKER_LISTENER_NAME", "PLAINTEXT"),
        ("KAFKA_CONTROLLER_QUORUM_VOTERS", "1@kafka:9093"),
        ("KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR", "1"),
        ("CLUSTER_ID", "MkU3OEVBNTcwNTJENDM2Qk"),
    ]);
    assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
    let l = &loaded.config.listeners;
    assert_eq!(l.len(), 2);
    assert_eq!(
        (l[0].name.as_str(), &l[0].bind, &l[0].advertised),
        ("PLAINTEXT", &hp("0.0.0.0", 29092), &hp("kafka", 29092))
    );
    assert_eq!(
        (l[1].name.as_str(), &l[1].bind, &l[1].advertised),
        ("PLAINTEXT_HOST", &hp("0.0.0.0", 9092), &hp("localhost", 9092))
    );
    assert!(l
        .iter()
        .all(|l| l.security_protocol == SecurityProtocol::Plaintext));
}

/// The KRaft sample `config/kraft/server.properties` shipped with Apache Kafka 3.x (comments cut).
const KAFKA_SAMPLE: &str = "\
# Licensed to the Apache Software Foundation (ASF) under one or more
############################# Server Basics #############################

# The role of this server. Setting this puts us in KRaft mode
process.roles=broker,controller

# The node id associated with this instance's roles
node.id=1

# The connect string for the controller quorum
controller.quorum.voters=1@localhost:9093

############################# Socket Server Settings #############################
#   FORMAT:
#     listeners = listener_name://host_name:port
listeners=PLAINTEXT://:9092,CONTROLLER://:9093
inter.broker.listener.name=PLAINTEXT
advertised.listeners=PLAINTEXT://localhost:9092
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL
num.network.threads=3
num.io.threads=8
socket.send.buffer.bytes=102400
socket.receive.buffer.bytes=102400
socket.request.max.bytes=104857600

############################# Log Basics #############################
log.dirs=/tmp/kraft-combined-logs
num.partitions=1
num.recovery.threads.per.data.dir=1
offsets.topic.replication.factor=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
#log.flush.interval.messages=10000
#log.flush.interval.ms=1000
log.retention.hours=168
#log.retention.bytes=1073741824
log.segment.bytes=1073741824
log.retention.check.interval.ms=300000
";

#[test]
fn kafka_sample_properties_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = write_file(&dir, KAFKA_SAMPLE);
    let loaded = load(Some(&file), Vec::new(), &[]).unwrap();
    assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
    let c = &loaded.config;
    assert_eq!(c.log_dir, Path::new("/tmp/kraft-combined-logs"));
    assert_eq!(c.listeners.len(), 1);
    assert_eq!(c.listeners[0].advertised, hp("localhost", 9092));
    assert_eq!(c.retention_ms, Some(168 * 3_600_000));
    let e = entry(c, "log.segment.bytes");
    assert_eq!(e.source, ConfigSource::StaticBrokerConfig);
    assert_eq!(
        c.origin("log.dirs"),
        Some(&Origin::File {
            path: file.clone(),
            line: 28
        })
    );
}

#[test]
fn file_errors() {
    let missing = Path::new("/nonexistent/strand/server.properties");
    let msg = load(Some(missing), Vec::new(), &[]).unwrap_err().to_string();
    assert!(msg.contains("/nonexistent/strand/server.properties"), "{msg}");
    let dir = tempfile::tempdir().unwrap();
    let file = write_file(&dir, "a=1\nb=\\uZZZZ\n");
    let err = load(Some(&file), Vec::new(), &[]).unwrap_err();
    assert!(matches!(err, ConfigError::Syntax { line: 2, .. }), "{err}");
    std::fs::write(&file, [b'a', b'=', 0xff, b'\n']).unwrap();
    assert!(load(Some(&file), Vec::new(), &[])
        .unwrap_err()
        .to_string()
        .contains("UTF-8"));
    std::fs::write(&file, vec![b'#'; (MAX_FILE_BYTES + 1) as usize]).unwrap();
    assert!(load(Some(&file), Vec::new(), &[])
        .unwrap_err()
        .to_string()
        .contains("larger than"));
}

#[test]
fn override_syntax() {
    for bad in ["num.partitions", "=3", " =3", ""] {
        let err = load(None, Vec::new(), &args(&[bad])).unwrap_err();
        assert!(matches!(err, ConfigError::Override { .. }), "{bad}: {err}");
    }
    assert_eq!(load_args(&["cluster.id=a=b"]).config.cluster_id, "a=b");
}

#[test]
fn shards() {
    assert_eq!(load_args(&["strand.shards=3"]).config.shards, 3);
    assert!(load_args(&["strand.shards=0"]).config.shards >= 1);
}

#[test]
fn broker_entries_report_values_and_sources() {
    let c = load_args(&[
        "num.partitions=3",
        "auto.create.topics.enable=FALSE",
        "listeners=PLAINTEXT://:9092",
    ])
    .config;
    let entries = c.broker_entries();
    assert_eq!(entries.len(), BROKER_KEYS.len());
    assert!(
        entries.windows(2).all(|w| w[0].name < w[1].name),
        "sorted by name"
    );
    assert!(entries
        .iter()
        .all(|e| e.read_only && !e.sensitive && !e.documentation.is_empty()));
    let e = entry(&c, "num.partitions");
    assert_eq!(e.value.as_deref(), Some("3"));
    assert_eq!(e.source, ConfigSource::StaticBrokerConfig);
    assert_eq!(e.source.code(), 4);
    assert_eq!(e.config_type, ConfigType::Int);
    assert_eq!(e.config_type.code(), 3);
    let e = entry(&c, "auto.create.topics.enable");
    assert_eq!(
        (e.value.as_deref(), e.config_type),
        (Some("false"), ConfigType::Boolean)
    );
    assert_eq!(entry(&c, "listeners").value.as_deref(), Some("PLAINTEXT://:9092"));
    let e = entry(&c, "log.retention.hours");
    assert_eq!(
        (e.value.as_deref(), e.source),
        (Some("168"), ConfigSource::DefaultConfig)
    );
    assert_eq!(e.source.code(), 5);
    assert!(e.source.is_default());
    let e = entry(&c, "log.retention.ms");
    assert_eq!((e.value, e.config_type), (None, ConfigType::Long));
    assert_eq!(entry(&c, "advertised.listeners").value, None);
    assert_eq!(entry(&c, "broker.id").value.as_deref(), Some("1"));
    assert_eq!(ConfigSource::DynamicTopicConfig.code(), 1);
}

#[test]
fn default_log_settings_match_broker() {
    let c = load_args(&["log.segment.bytes=100", "log.retention.bytes=1000"]).config;
    let s = c.default_log_settings();
    assert_eq!(s.segment_bytes, 100);
    assert_eq!(s.retention_bytes, Some(1000));
    assert_eq!(s.retention_ms, c.retention_ms);
}

#[test]
fn group_session_bounds() {
    let c = load_args(&[
        "group.min.session.timeout.ms=10",
        "group.max.session.timeout.ms=20",
    ])
    .config;
    assert_eq!(
        (c.group_min_session_timeout_ms, c.group_max_session_timeout_ms),
        (10, 20)
    );
    let msg = load_err(&[
        "group.min.session.timeout.ms=30",
        "group.max.session.timeout.ms=20",
    ]);
    assert!(
        msg.contains("`group.min.session.timeout.ms`") && msg.contains("(20)"),
        "{msg}"
    );
}

#[test]
fn partition_limits() {
    let c = load_args(&[
        "strand.max.partitions=100",
        "strand.max.partitions.per.topic=20",
        "strand.max.partitions.per.request=30",
        "num.partitions=20",
    ])
    .config;
    assert_eq!(
        (
            c.max_partitions,
            c.max_partitions_per_topic,
            c.max_partitions_per_request
        ),
        (100, 20, 30)
    );
    // num.partitions must fit a topic.
    let msg = load_err(&["strand.max.partitions.per.topic=20", "num.partitions=21"]);
    assert!(
        msg.contains("`num.partitions`") && msg.contains("strand.max.partitions.per.topic (20)"),
        "{msg}"
    );
    // The node's limit counts __consumer_offsets.
    let c = load_args(&["strand.max.partitions=3", "offsets.topic.num.partitions=3"]).config;
    assert_eq!(c.max_partitions, 3);
}

#[test]
fn group_session_timeouts_and_heartbeat_intervals_are_checked_against_their_bounds() {
    // As Kafka's GroupCoordinatorConfig: a value outside its bounds fails start-up, naming it.
    let e = load_err(&["group.consumer.session.timeout.ms=10000"]);
    assert!(
        e.contains("group.consumer.session.timeout.ms")
            && e.contains("group.consumer.min.session.timeout.ms (45000)"),
        "{e}"
    );
    let e = load_err(&["group.share.heartbeat.interval.ms=500"]);
    assert!(e.contains("group.share.heartbeat.interval.ms"), "{e}");
    let e = load_err(&["group.consumer.min.heartbeat.interval.ms=20000"]);
    assert!(
        e.contains("group.consumer.min.heartbeat.interval.ms (20000) must be at most"),
        "{e}"
    );
    // Lowered bounds let low values through; the interval must stay below the timeout.
    let c = load_args(&[
        "group.consumer.min.session.timeout.ms=6000",
        "group.consumer.session.timeout.ms=6000",
        "group.consumer.min.heartbeat.interval.ms=500",
        "group.consumer.heartbeat.interval.ms=500",
    ])
    .config;
    assert_eq!(
        (
            c.group_consumer_session_timeout_ms,
            c.group_consumer_heartbeat_interval_ms,
            c.group_consumer_session_timeout_bounds_ms,
            c.group_consumer_heartbeat_interval_bounds_ms,
        ),
        (6000, 500, (6000, 60_000), (500, 15_000))
    );
    let e = load_err(&[
        "group.share.min.session.timeout.ms=1000",
        "group.share.session.timeout.ms=5000",
        "group.share.min.heartbeat.interval.ms=1000",
        "group.share.heartbeat.interval.ms=5000",
    ]);
    assert!(
        e.contains("group.share.heartbeat.interval.ms")
            && e.contains("must be less than group.share.session.timeout.ms (5000)"),
        "{e}"
    );
}
