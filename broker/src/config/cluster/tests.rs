use std::collections::BTreeMap;

use strand_protocol::types::NodeId;

use super::super::{load, ConfigError, HostPort, Loaded, SecurityProtocol};
use super::*;

fn hp(host: &str, port: u16) -> HostPort {
    HostPort {
        host: host.to_string(),
        port,
    }
}

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn load_env(pairs: &[(&str, &str)]) -> Loaded {
    match load(None, env(pairs), &[]) {
        Ok(loaded) => loaded,
        Err(e) => panic!("refused: {e}"),
    }
}

/// `base` with `changes` applied: `Some` sets a variable, `None` removes it.
fn changed(base: &[(&str, &str)], changes: &[(&str, Option<&str>)]) -> Vec<(String, String)> {
    let mut map: BTreeMap<String, String> = env(base).into_iter().collect();
    for (k, v) in changes {
        match v {
            Some(v) => map.insert(k.to_string(), v.to_string()),
            None => map.remove(*k),
        };
    }
    map.into_iter().collect()
}

/// The error `base` with `changes` gets; it must blame `key`.
fn refused(base: &[(&str, &str)], changes: &[(&str, Option<&str>)], key: &str) -> String {
    match load(None, changed(base, changes), &[]) {
        Ok(loaded) => panic!("accepted: {}", loaded.config.cluster),
        Err(e @ ConfigError::Invalid { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains(&format!("for `{key}`")), "{msg}");
            msg
        }
        Err(e) => panic!("unexpected error: {e}"),
    }
}

fn voters(entries: &[(i32, &str, u16)]) -> Quorum {
    Quorum::Voters(
        entries
            .iter()
            .map(|(id, host, port)| (NodeId(*id), hp(host, *port)))
            .collect(),
    )
}

const CLUSTER_ID: &str = "4L6g3nShT-eMCtK--X86sw";
const MAP: &str = "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,PLAINTEXT_HOST:PLAINTEXT";

// apache/kafka docker/examples/docker-compose-files/cluster/combined/plaintext/docker-compose.yml:
// the environment of service kafka-1, with the HOSTNAME Docker sets from `hostname:`.
const COMBINED_1: &[(&str, &str)] = &[
    ("KAFKA_NODE_ID", "1"),
    ("KAFKA_PROCESS_ROLES", "broker,controller"),
    ("KAFKA_LISTENER_SECURITY_PROTOCOL_MAP", MAP),
    (
        "KAFKA_CONTROLLER_QUORUM_VOTERS",
        "1@kafka-1:9093,2@kafka-2:9093,3@kafka-3:9093",
    ),
    (
        "KAFKA_LISTENERS",
        "PLAINTEXT://:19092,CONTROLLER://:9093,PLAINTEXT_HOST://:9092",
    ),
    ("KAFKA_INTER_BROKER_LISTENER_NAME", "PLAINTEXT"),
    (
        "KAFKA_ADVERTISED_LISTENERS",
        "PLAINTEXT://kafka-1:19092,PLAINTEXT_HOST://localhost:29092",
    ),
    ("KAFKA_CONTROLLER_LISTENER_NAMES", "CONTROLLER"),
    ("CLUSTER_ID", CLUSTER_ID),
    ("KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR", "1"),
    ("KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS", "0"),
    ("KAFKA_TRANSACTION_STATE_LOG_MIN_ISR", "1"),
    ("KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR", "1"),
    ("KAFKA_LOG_DIRS", "/tmp/kraft-combined-logs"),
    ("HOSTNAME", "kafka-1"),
];

#[test]
fn combined_mode_three_nodes() {
    for (id, host_port) in [(1, 29092), (2, 39092), (3, 49092)] {
        let host = format!("kafka-{id}");
        let node_id = id.to_string();
        let advertised = format!("PLAINTEXT://{host}:19092,PLAINTEXT_HOST://localhost:{host_port}");
        let loaded = load(
            None,
            changed(
                COMBINED_1,
                &[
                    ("KAFKA_NODE_ID", Some(&node_id)),
                    ("KAFKA_ADVERTISED_LISTENERS", Some(&advertised)),
                    ("HOSTNAME", Some(&host)),
                ],
            ),
            &[],
        )
        .unwrap();
        assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
        let c = &loaded.config.cluster;
        assert_eq!(c.node_id, NodeId(id));
        assert_eq!(c.roles, ProcessRoles::COMBINED);
        assert!(!c.is_standalone());
        assert_eq!(
            c.quorum,
            voters(&[(1, "kafka-1", 9093), (2, "kafka-2", 9093), (3, "kafka-3", 9093)])
        );
        assert_eq!(c.static_voter_ids(), vec![NodeId(1), NodeId(2), NodeId(3)]);
        assert_eq!(c.controller_listener_name.as_deref(), Some("CONTROLLER"));
        assert_eq!(
            c.controller_listener,
            Some(ControllerListener {
                name: "CONTROLLER".into(),
                security_protocol: SecurityProtocol::Plaintext,
                bind: hp("0.0.0.0", 9093),
                advertised: hp(&host, 9093),
            })
        );
        assert_eq!(
            c.inter_broker_listener,
            Some(InterBrokerListener {
                name: "PLAINTEXT".into(),
                advertised: hp(&host, 19092),
            })
        );
        assert_eq!(c.cluster_id.as_str(), CLUSTER_ID);
        assert!(c.cluster_id.uuid().is_some());
        assert_eq!(c.rack, None);
        // The client listeners are what they were before the cluster keys were read.
        let l = &loaded.config.listeners;
        assert_eq!(
            l.iter()
                .map(|l| (l.name.as_str(), l.bind.clone(), l.advertised.clone()))
                .collect::<Vec<_>>(),
            vec![
                ("PLAINTEXT", hp("0.0.0.0", 19092), hp(&host, 19092)),
                ("PLAINTEXT_HOST", hp("0.0.0.0", 9092), hp("localhost", host_port)),
            ]
        );
    }
}

// apache/kafka docker/examples/docker-compose-files/cluster/isolated/plaintext/docker-compose.yml:
// services controller-1..3 (no `hostname:`, so Docker's HOSTNAME is the container id) and
// kafka-1..3.
fn isolated_controller(id: &str) -> Vec<(String, String)> {
    env(&[
        ("KAFKA_NODE_ID", id),
        ("KAFKA_PROCESS_ROLES", "controller"),
        (
            "KAFKA_CONTROLLER_QUORUM_VOTERS",
            "1@controller-1:9093,2@controller-2:9093,3@controller-3:9093",
        ),
        ("KAFKA_INTER_BROKER_LISTENER_NAME", "PLAINTEXT"),
        ("KAFKA_CONTROLLER_LISTENER_NAMES", "CONTROLLER"),
        ("KAFKA_LISTENERS", "CONTROLLER://:9093"),
        ("CLUSTER_ID", CLUSTER_ID),
        ("KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR", "1"),
        ("KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS", "0"),
        ("KAFKA_TRANSACTION_STATE_LOG_MIN_ISR", "1"),
        ("KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR", "1"),
        ("KAFKA_LOG_DIRS", "/tmp/kraft-combined-logs"),
        ("HOSTNAME", "0d3c2b1a9f8e"),
    ])
}

fn isolated_broker(id: &str, host: &str, host_port: &str) -> Vec<(String, String)> {
    let advertised = format!("PLAINTEXT://{host}:19092,PLAINTEXT_HOST://localhost:{host_port}");
    env(&[
        ("KAFKA_NODE_ID", id),
        ("KAFKA_PROCESS_ROLES", "broker"),
        (
            "KAFKA_CONTROLLER_QUORUM_VOTERS",
            "1@controller-1:9093,2@controller-2:9093,3@controller-3:9093",
        ),
        ("KAFKA_LISTENERS", "PLAINTEXT://:19092,PLAINTEXT_HOST://:9092"),
        ("KAFKA_LISTENER_SECURITY_PROTOCOL_MAP", MAP),
        ("KAFKA_INTER_BROKER_LISTENER_NAME", "PLAINTEXT"),
        ("KAFKA_ADVERTISED_LISTENERS", &advertised),
        ("KAFKA_CONTROLLER_LISTENER_NAMES", "CONTROLLER"),
        ("CLUSTER_ID", CLUSTER_ID),
        ("KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR", "1"),
        ("KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS", "0"),
        ("KAFKA_TRANSACTION_STATE_LOG_MIN_ISR", "1"),
        ("KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR", "1"),
        ("KAFKA_LOG_DIRS", "/tmp/kraft-combined-logs"),
        ("HOSTNAME", host),
    ])
}

#[test]
fn isolated_mode_three_controllers() {
    let quorum = voters(&[
        (1, "controller-1", 9093),
        (2, "controller-2", 9093),
        (3, "controller-3", 9093),
    ]);
    for id in 1..=3 {
        let loaded = load(None, isolated_controller(&id.to_string()), &[]).unwrap();
        assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
        assert!(
            loaded.config.listeners.is_empty(),
            "a controller serves no clients"
        );
        let c = &loaded.config.cluster;
        assert_eq!(c.node_id, NodeId(id));
        assert_eq!(c.roles, ProcessRoles::CONTROLLER);
        assert_eq!(c.quorum, quorum);
        assert_eq!(
            c.controller_listener,
            Some(ControllerListener {
                name: "CONTROLLER".into(),
                security_protocol: SecurityProtocol::Plaintext,
                bind: hp("0.0.0.0", 9093),
                advertised: hp("0d3c2b1a9f8e", 9093),
            })
        );
        assert_eq!(c.inter_broker_listener, None);
        assert_eq!(c.cluster_id.as_str(), CLUSTER_ID);
    }
}

#[test]
fn isolated_mode_three_brokers() {
    for (id, host, host_port) in [
        (4, "kafka-1", "29092"),
        (5, "kafka-2", "39092"),
        (6, "kafka-3", "49092"),
    ] {
        let loaded = load(None, isolated_broker(&id.to_string(), host, host_port), &[]).unwrap();
        assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
        let c = &loaded.config.cluster;
        assert_eq!(c.node_id, NodeId(id));
        assert_eq!(c.roles, ProcessRoles::BROKER);
        assert_eq!(
            c.quorum,
            voters(&[
                (1, "controller-1", 9093),
                (2, "controller-2", 9093),
                (3, "controller-3", 9093),
            ])
        );
        assert_eq!(c.controller_listener_name.as_deref(), Some("CONTROLLER"));
        assert_eq!(c.controller_listener, None);
        assert_eq!(
            c.inter_broker_listener,
            Some(InterBrokerListener {
                name: "PLAINTEXT".into(),
                advertised: hp(host, 19092),
            })
        );
        assert_eq!(loaded.config.listeners.len(), 2);
    }
}

// apache/kafka docker/examples/docker-compose-files/single-node/plaintext/docker-compose.yml.
const SINGLE_NODE: &[(&str, &str)] = &[
    ("KAFKA_NODE_ID", "1"),
    ("KAFKA_LISTENER_SECURITY_PROTOCOL_MAP", MAP),
    (
        "KAFKA_ADVERTISED_LISTENERS",
        "PLAINTEXT_HOST://localhost:9092,PLAINTEXT://broker:19092",
    ),
    ("KAFKA_PROCESS_ROLES", "broker,controller"),
    ("KAFKA_CONTROLLER_QUORUM_VOTERS", "1@broker:29093"),
    (
        "KAFKA_LISTENERS",
        "CONTROLLER://:29093,PLAINTEXT_HOST://:9092,PLAINTEXT://:19092",
    ),
    ("KAFKA_INTER_BROKER_LISTENER_NAME", "PLAINTEXT"),
    ("KAFKA_CONTROLLER_LISTENER_NAMES", "CONTROLLER"),
    ("CLUSTER_ID", CLUSTER_ID),
    ("KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR", "1"),
    ("KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS", "0"),
    ("KAFKA_TRANSACTION_STATE_LOG_MIN_ISR", "1"),
    ("KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR", "1"),
    ("KAFKA_LOG_DIRS", "/tmp/kraft-combined-logs"),
    ("HOSTNAME", "broker"),
];

#[test]
fn single_node_example() {
    let loaded = load_env(SINGLE_NODE);
    assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
    let c = &loaded.config.cluster;
    assert_eq!(c.node_id, NodeId(1));
    assert_eq!(c.roles, ProcessRoles::COMBINED);
    assert_eq!(c.quorum, voters(&[(1, "broker", 29093)]));
    let controller = c.controller_listener.as_ref().unwrap();
    assert_eq!(
        (controller.bind.clone(), controller.advertised.clone()),
        (hp("0.0.0.0", 29093), hp("broker", 29093))
    );
    assert_eq!(
        c.inter_broker_listener,
        Some(InterBrokerListener {
            name: "PLAINTEXT".into(),
            advertised: hp("broker", 19092),
        })
    );
}

#[test]
fn single_node_variants_seen_in_the_wild() {
    // Listeners bound to the container's host name.
    let loaded = load(
        None,
        changed(
            SINGLE_NODE,
            &[(
                "KAFKA_LISTENERS",
                Some("CONTROLLER://broker:29093,PLAINTEXT_HOST://broker:9092,PLAINTEXT://broker:19092"),
            )],
        ),
        &[],
    )
    .unwrap();
    let c = &loaded.config.cluster;
    assert_eq!(c.controller_listener.as_ref().unwrap().bind, hp("broker", 29093));
    assert_eq!(loaded.config.listeners[0].bind, hp("broker", 9092));

    // Hosts left empty, no advertised listeners: the machine's name is advertised.
    let loaded = load(
        None,
        changed(
            SINGLE_NODE,
            &[
                ("KAFKA_LISTENERS", Some("PLAINTEXT://:9092,CONTROLLER://:9093")),
                ("KAFKA_ADVERTISED_LISTENERS", None),
                ("KAFKA_CONTROLLER_QUORUM_VOTERS", Some("1@localhost:9093")),
                ("HOSTNAME", Some("3f2a1b")),
            ],
        ),
        &[],
    )
    .unwrap();
    let c = &loaded.config.cluster;
    assert_eq!(c.quorum, voters(&[(1, "localhost", 9093)]));
    assert_eq!(
        c.controller_listener
            .as_ref()
            .map(|l| (l.bind.clone(), l.advertised.clone())),
        Some((hp("0.0.0.0", 9093), hp("3f2a1b", 9093)))
    );
    assert_eq!(
        c.inter_broker_listener.as_ref().map(|l| l.advertised.clone()),
        Some(hp("3f2a1b", 9092))
    );

    // Unquoted integers in YAML reach the environment as the same text; padding spaces are
    // trimmed; broker.id is node.id.
    let loaded = load(
        None,
        changed(
            SINGLE_NODE,
            &[("KAFKA_NODE_ID", None), ("KAFKA_BROKER_ID", Some(" 1 "))],
        ),
        &[],
    )
    .unwrap();
    assert_eq!(loaded.config.cluster.node_id, NodeId(1));
}

#[test]
fn zero_config_is_a_standalone_node() {
    let loaded = load(None, Vec::new(), &[]).unwrap();
    assert!(loaded.notes.is_empty(), "{:?}", loaded.notes);
    let c = &loaded.config.cluster;
    assert_eq!(c.node_id, NodeId(1));
    assert!(c.is_standalone());
    assert_eq!(c.roles, ProcessRoles::COMBINED);
    assert_eq!(c.quorum, Quorum::Standalone);
    assert_eq!(c.static_voter_ids(), vec![NodeId(1)]);
    assert_eq!(c.controller_listener_name, None);
    assert_eq!(c.controller_listener, None);
    assert_eq!(
        c.inter_broker_listener,
        Some(InterBrokerListener {
            name: "PLAINTEXT".into(),
            advertised: hp("127.0.0.1", 9092),
        })
    );
    assert_eq!(c.cluster_id.as_str(), "strand-local-cluster");
    assert_eq!(c.cluster_id.uuid(), None);
    assert_eq!(
        (
            c.replica_lag_time_max_ms,
            c.default_replication_factor,
            c.min_insync_replicas,
            c.broker_session_timeout_ms,
            c.broker_heartbeat_interval_ms,
            c.quorum_election_timeout_ms,
            c.quorum_fetch_timeout_ms,
        ),
        (30_000, 1, 1, 9000, 2000, 1000, 2000)
    );
    assert_eq!(
        c.to_string(),
        "cluster strand-local-cluster: node 1, standalone (no process.roles: broker and the only controller voter), \
         inter-broker listener PLAINTEXT (127.0.0.1:9092)"
    );
}

#[test]
fn standalone_checks_cluster_keys_for_syntax_only() {
    // Without process.roles nothing is cross-checked: a listener named nowhere as the
    // inter-broker one, voters that do not include this node, and no cluster.id are fine.
    let loaded = load(
        None,
        env(&[
            ("KAFKA_LISTENERS", "CLIENT://127.0.0.1:9092"),
            ("KAFKA_LISTENER_SECURITY_PROTOCOL_MAP", "CLIENT:PLAINTEXT"),
            ("KAFKA_CONTROLLER_QUORUM_VOTERS", "2@elsewhere:9093"),
        ]),
        &[],
    )
    .unwrap();
    let c = &loaded.config.cluster;
    assert!(c.is_standalone());
    assert_eq!(c.inter_broker_listener, None);
    assert!(
        loaded
            .notes
            .iter()
            .any(|n| n.contains("controller.quorum.voters") && n.contains("no effect without process.roles")),
        "{:?}",
        loaded.notes
    );
    // Syntax is still checked.
    let msg = refused(
        &[],
        &[("KAFKA_CONTROLLER_QUORUM_VOTERS", Some("2:9093"))],
        "controller.quorum.voters",
    );
    assert!(msg.contains("{id}@{host}:{port}"), "{msg}");
}

#[test]
fn the_other_settings() {
    let loaded = load_env(&[
        ("KAFKA_BROKER_RACK", "eu-west-1a"),
        ("KAFKA_REPLICA_LAG_TIME_MAX_MS", "10000"),
        ("KAFKA_DEFAULT_REPLICATION_FACTOR", "3"),
        ("KAFKA_MIN_INSYNC_REPLICAS", "2"),
        ("KAFKA_BROKER_SESSION_TIMEOUT_MS", "3000"),
        ("KAFKA_BROKER_HEARTBEAT_INTERVAL_MS", "500"),
        ("KAFKA_CONTROLLER_QUORUM_ELECTION_TIMEOUT_MS", "500"),
        ("KAFKA_CONTROLLER_QUORUM_FETCH_TIMEOUT_MS", "1500"),
    ]);
    assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
    let c = &loaded.config.cluster;
    assert_eq!(c.rack.as_deref(), Some("eu-west-1a"));
    assert_eq!(
        (
            c.replica_lag_time_max_ms,
            c.default_replication_factor,
            c.min_insync_replicas,
            c.broker_session_timeout_ms,
            c.broker_heartbeat_interval_ms,
            c.quorum_election_timeout_ms,
            c.quorum_fetch_timeout_ms,
        ),
        (10_000, 3, 2, 3000, 500, 500, 1500)
    );
    for (var, value) in [
        ("KAFKA_REPLICA_LAG_TIME_MAX_MS", "0"),
        ("KAFKA_DEFAULT_REPLICATION_FACTOR", "0"),
        ("KAFKA_DEFAULT_REPLICATION_FACTOR", "32768"),
        ("KAFKA_MIN_INSYNC_REPLICAS", "0"),
        ("KAFKA_BROKER_SESSION_TIMEOUT_MS", "-1"),
        ("KAFKA_SECURITY_INTER_BROKER_PROTOCOL", "TLS"),
    ] {
        assert!(load(None, env(&[(var, value)]), &[]).is_err(), "{var}={value}");
    }
}

#[test]
fn bootstrap_servers_instead_of_voters() {
    let loaded = load(
        None,
        changed(
            COMBINED_1,
            &[
                ("KAFKA_CONTROLLER_QUORUM_VOTERS", None),
                (
                    "KAFKA_CONTROLLER_QUORUM_BOOTSTRAP_SERVERS",
                    Some("kafka-1:9093, kafka-2:9093,kafka-3:9093"),
                ),
            ],
        ),
        &[],
    )
    .unwrap();
    let c = &loaded.config.cluster;
    assert_eq!(
        c.quorum,
        Quorum::Bootstrap(vec![
            hp("kafka-1", 9093),
            hp("kafka-2", 9093),
            hp("kafka-3", 9093)
        ])
    );
    assert!(c.static_voter_ids().is_empty());
    // Both: the voters are the quorum.
    let loaded = load(
        None,
        changed(
            COMBINED_1,
            &[("KAFKA_CONTROLLER_QUORUM_BOOTSTRAP_SERVERS", Some("kafka-1:9093"))],
        ),
        &[],
    )
    .unwrap();
    assert!(matches!(loaded.config.cluster.quorum, Quorum::Voters(_)));
    assert!(
        loaded.notes.iter().any(|n| n.contains("is not used")),
        "{:?}",
        loaded.notes
    );
}

#[test]
fn kafka_accepts_so_strand_does() {
    // A controller listener in advertised.listeners: the controller's advertised address
    // (KIP-853), never a client listener.
    let loaded = load(
        None,
        changed(
            COMBINED_1,
            &[(
                "KAFKA_ADVERTISED_LISTENERS",
                Some("PLAINTEXT://kafka-1:19092,PLAINTEXT_HOST://localhost:29092,CONTROLLER://kafka-1.example:9093"),
            )],
        ),
        &[],
    )
    .unwrap();
    assert_eq!(
        loaded
            .config
            .cluster
            .controller_listener
            .as_ref()
            .unwrap()
            .advertised,
        hp("kafka-1.example", 9093)
    );
    assert_eq!(loaded.config.listeners.len(), 2);
    // The same on a broker-only node: ignored.
    let mut broker = isolated_broker("4", "kafka-1", "29092");
    broker.retain(|(k, _)| k != "KAFKA_ADVERTISED_LISTENERS");
    broker.push((
        "KAFKA_ADVERTISED_LISTENERS".into(),
        "PLAINTEXT://kafka-1:19092,CONTROLLER://kafka-1:9093".into(),
    ));
    let loaded = load(None, broker, &[]).unwrap();
    assert_eq!(loaded.config.cluster.controller_listener, None);
    // Process roles in any order and case; a repeated voter keeps its last address, with a
    // warning; a cluster id that is not a UUID is noted.
    let loaded = load(
        None,
        changed(
            COMBINED_1,
            &[
                ("KAFKA_PROCESS_ROLES", Some("Controller, broker")),
                (
                    "KAFKA_CONTROLLER_QUORUM_VOTERS",
                    Some("1@old:9093,2@kafka-2:9093,1@kafka-1:9093"),
                ),
                ("CLUSTER_ID", Some("my-cluster")),
            ],
        ),
        &[],
    )
    .unwrap();
    let c = &loaded.config.cluster;
    assert_eq!(c.roles, ProcessRoles::COMBINED);
    assert_eq!(c.quorum, voters(&[(1, "kafka-1", 9093), (2, "kafka-2", 9093)]));
    assert!(
        loaded.warnings.iter().any(|w| w.contains("voter 1 twice")),
        "{:?}",
        loaded.warnings
    );
    assert!(loaded
        .notes
        .iter()
        .any(|n| n.contains("`my-cluster` is not a base64 UUID")));
    // security.inter.broker.protocol alone names the inter-broker listener.
    let loaded = load(
        None,
        changed(
            COMBINED_1,
            &[
                ("KAFKA_INTER_BROKER_LISTENER_NAME", None),
                ("KAFKA_SECURITY_INTER_BROKER_PROTOCOL", Some("plaintext")),
            ],
        ),
        &[],
    )
    .unwrap();
    assert_eq!(
        loaded.config.cluster.inter_broker_listener.map(|l| l.name),
        Some("PLAINTEXT".to_string())
    );
    // A controller listener name missing from an explicit protocol map is PLAINTEXT.
    let loaded = load(
        None,
        changed(
            COMBINED_1,
            &[(
                "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP",
                Some("PLAINTEXT:PLAINTEXT,PLAINTEXT_HOST:PLAINTEXT"),
            )],
        ),
        &[],
    )
    .unwrap();
    assert_eq!(
        loaded
            .config
            .cluster
            .controller_listener
            .map(|l| l.security_protocol),
        Some(SecurityProtocol::Plaintext)
    );
}

#[test]
fn start_up_line() {
    let c = load_env(COMBINED_1).config.cluster;
    assert_eq!(
        c.to_string(),
        "cluster 4L6g3nShT-eMCtK--X86sw: node 1, roles broker,controller, voters \
         1@kafka-1:9093,2@kafka-2:9093,3@kafka-3:9093, controller listener CONTROLLER://0.0.0.0:9093 \
         (advertised kafka-1:9093), inter-broker listener PLAINTEXT (kafka-1:19092)"
    );
}

// One test per refusal; each names the setting to fix.

#[test]
fn refuses_an_unknown_role() {
    let msg = refused(
        COMBINED_1,
        &[("KAFKA_PROCESS_ROLES", Some("broker,zookeeper"))],
        "process.roles",
    );
    assert!(msg.contains("unknown process role `zookeeper`"), "{msg}");
}

#[test]
fn refuses_a_repeated_role() {
    let msg = refused(
        COMBINED_1,
        &[("KAFKA_PROCESS_ROLES", Some("broker,broker"))],
        "process.roles",
    );
    assert!(msg.contains("twice"), "{msg}");
}

#[test]
fn refuses_kraft_without_node_id() {
    let msg = refused(COMBINED_1, &[("KAFKA_NODE_ID", None)], "node.id");
    assert!(msg.contains("must be set when process.roles is set"), "{msg}");
}

#[test]
fn refuses_a_cluster_of_several_nodes_without_cluster_id() {
    let msg = refused(COMBINED_1, &[("CLUSTER_ID", None)], "cluster.id");
    assert!(msg.contains("CLUSTER_ID"), "{msg}");
    // A one-voter quorum of itself (Kafka's sample server.properties) keeps the default.
    let loaded = load(
        None,
        changed(
            SINGLE_NODE,
            &[
                ("CLUSTER_ID", None),
                ("KAFKA_CONTROLLER_QUORUM_VOTERS", Some("1@localhost:29093")),
            ],
        ),
        &[],
    )
    .unwrap();
    assert_eq!(loaded.config.cluster.cluster_id.as_str(), "strand-local-cluster");
    assert!(
        loaded.notes.iter().all(|n| !n.contains("base64")),
        "{:?}",
        loaded.notes
    );
    // A broker-only node always belongs to a cluster of several nodes.
    let broker = isolated_broker("4", "kafka-1", "29092");
    let base: Vec<(&str, &str)> = broker.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    refused(
        &base,
        &[
            ("CLUSTER_ID", None),
            ("KAFKA_CONTROLLER_QUORUM_VOTERS", Some("1@controller-1:9093")),
        ],
        "cluster.id",
    );
}

#[test]
fn refuses_kraft_without_voters_or_bootstrap_servers() {
    let msg = refused(
        COMBINED_1,
        &[("KAFKA_CONTROLLER_QUORUM_VOTERS", None)],
        "controller.quorum.voters",
    );
    assert!(msg.contains("controller.quorum.bootstrap.servers"), "{msg}");
}

#[test]
fn refuses_malformed_voters() {
    for (voters, expect) in [
        ("1@kafka-1", "port"),
        ("kafka-1:9093", "{id}@{host}:{port}"),
        ("1@2@kafka-1:9093", "{id}@{host}:{port}"),
        ("x@kafka-1:9093", "node id"),
        ("-1@kafka-1:9093", "node id"),
        ("1@:9093", "no host"),
        ("1@0.0.0.0:9093", "not a routable address"),
    ] {
        let msg = refused(
            COMBINED_1,
            &[("KAFKA_CONTROLLER_QUORUM_VOTERS", Some(voters))],
            "controller.quorum.voters",
        );
        assert!(msg.contains(expect), "{voters}: {msg}");
    }
}

#[test]
fn refuses_malformed_bootstrap_servers() {
    let msg = refused(
        COMBINED_1,
        &[
            ("KAFKA_CONTROLLER_QUORUM_VOTERS", None),
            (
                "KAFKA_CONTROLLER_QUORUM_BOOTSTRAP_SERVERS",
                Some("kafka-1:9093,:9093"),
            ),
        ],
        "controller.quorum.bootstrap.servers",
    );
    assert!(msg.contains("no host"), "{msg}");
}

#[test]
fn refuses_a_controller_that_is_not_a_voter() {
    let msg = refused(
        COMBINED_1,
        &[("KAFKA_NODE_ID", Some("4"))],
        "controller.quorum.voters",
    );
    assert!(
        msg.contains("node id 4 must be one of the voters (1,2,3)"),
        "{msg}"
    );
}

#[test]
fn refuses_a_broker_only_node_that_is_a_voter() {
    let msg = refused(
        &isolated_broker("4", "kafka-1", "29092")
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect::<Vec<_>>(),
        &[("KAFKA_NODE_ID", Some("2"))],
        "controller.quorum.voters",
    );
    assert!(msg.contains("must not be one of the voters"), "{msg}");
}

#[test]
fn refuses_a_broker_only_node_without_controller_listener_names() {
    let broker = isolated_broker("4", "kafka-1", "29092");
    let base: Vec<(&str, &str)> = broker.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let msg = refused(
        &base,
        &[("KAFKA_CONTROLLER_LISTENER_NAMES", None)],
        "controller.listener.names",
    );
    assert!(msg.contains("just broker"), "{msg}");
}

#[test]
fn refuses_a_controller_without_controller_listener_names() {
    let msg = refused(
        COMBINED_1,
        &[
            ("KAFKA_CONTROLLER_LISTENER_NAMES", None),
            (
                "KAFKA_LISTENERS",
                Some("PLAINTEXT://:19092,PLAINTEXT_HOST://:9092"),
            ),
        ],
        "controller.listener.names",
    );
    assert!(msg.contains("controller role"), "{msg}");
}

#[test]
fn refuses_a_controller_whose_controller_listener_is_not_in_listeners() {
    let msg = refused(
        COMBINED_1,
        &[(
            "KAFKA_LISTENERS",
            Some("PLAINTEXT://:19092,PLAINTEXT_HOST://:9092"),
        )],
        "controller.listener.names",
    );
    assert!(msg.contains("CONTROLLER is not one of `listeners`"), "{msg}");
}

#[test]
fn refuses_a_broker_only_node_with_a_controller_listener() {
    let broker = isolated_broker("4", "kafka-1", "29092");
    let base: Vec<(&str, &str)> = broker.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let msg = refused(
        &base,
        &[(
            "KAFKA_LISTENERS",
            Some("PLAINTEXT://:19092,PLAINTEXT_HOST://:9092,CONTROLLER://:9093"),
        )],
        "listeners",
    );
    assert!(msg.contains("must not hold a controller listener"), "{msg}");
}

#[test]
fn refuses_a_controller_only_node_with_a_client_listener() {
    let mut controller = isolated_controller("1");
    controller.retain(|(k, _)| k != "KAFKA_LISTENERS");
    controller.push((
        "KAFKA_LISTENERS".into(),
        "CONTROLLER://:9093,PLAINTEXT://:9092".into(),
    ));
    let err = load(None, controller, &[]).unwrap_err().to_string();
    assert!(
        err.contains("for `listeners`") && err.contains("PLAINTEXT is not one"),
        "{err}"
    );
}

#[test]
fn refuses_a_controller_listener_that_is_not_plaintext() {
    let msg = refused(
        COMBINED_1,
        &[(
            "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP",
            Some("CONTROLLER:SSL,PLAINTEXT:PLAINTEXT,PLAINTEXT_HOST:PLAINTEXT"),
        )],
        "listener.security.protocol.map",
    );
    assert!(msg.contains("not supported yet"), "{msg}");
}

#[test]
fn refuses_a_broker_only_node_whose_controllers_are_not_plaintext() {
    let broker = isolated_broker("4", "kafka-1", "29092");
    let base: Vec<(&str, &str)> = broker.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let msg = refused(
        &base,
        &[(
            "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP",
            Some("CONTROLLER:SASL_SSL,PLAINTEXT:PLAINTEXT,PLAINTEXT_HOST:PLAINTEXT"),
        )],
        "listener.security.protocol.map",
    );
    assert!(
        msg.contains("SASL_SSL") && msg.contains("not supported yet"),
        "{msg}"
    );
}

#[test]
fn a_broker_only_node_uses_the_first_controller_listener_name() {
    let mut broker = isolated_broker("4", "kafka-1", "29092");
    broker.retain(|(k, _)| k != "KAFKA_CONTROLLER_LISTENER_NAMES");
    broker.push((
        "KAFKA_CONTROLLER_LISTENER_NAMES".into(),
        "CONTROLLER,CONTROLLER2".into(),
    ));
    let loaded = load(None, broker, &[]).unwrap();
    assert_eq!(
        loaded.config.cluster.controller_listener_name.as_deref(),
        Some("CONTROLLER")
    );
    assert!(
        loaded
            .warnings
            .iter()
            .any(|w| w.contains("uses only the first, CONTROLLER")),
        "{:?}",
        loaded.warnings
    );
}

#[test]
fn refuses_a_controller_listener_sharing_a_port() {
    let msg = refused(
        COMBINED_1,
        &[(
            "KAFKA_LISTENERS",
            Some("PLAINTEXT://:19092,CONTROLLER://:9092,PLAINTEXT_HOST://127.0.0.1:9092"),
        )],
        "listeners",
    );
    assert!(msg.contains("both bind port 9092"), "{msg}");
    let msg = refused(
        COMBINED_1,
        &[(
            "KAFKA_LISTENERS",
            Some("PLAINTEXT://:19092,CONTROLLER://:8080,PLAINTEXT_HOST://:9092"),
        )],
        "listeners",
    );
    assert!(msg.contains("strand.http.listener"), "{msg}");
}

#[test]
fn refuses_both_inter_broker_listener_name_and_protocol() {
    let msg = refused(
        COMBINED_1,
        &[("KAFKA_SECURITY_INTER_BROKER_PROTOCOL", Some("PLAINTEXT"))],
        "inter.broker.listener.name",
    );
    assert!(msg.contains("only one of"), "{msg}");
}

#[test]
fn refuses_an_inter_broker_listener_that_is_not_a_client_listener() {
    let msg = refused(
        COMBINED_1,
        &[
            ("KAFKA_INTER_BROKER_LISTENER_NAME", Some("INTERNAL")),
            (
                "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP",
                Some("CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,PLAINTEXT_HOST:PLAINTEXT,INTERNAL:PLAINTEXT"),
            ),
        ],
        "inter.broker.listener.name",
    );
    assert!(msg.contains("PLAINTEXT,PLAINTEXT_HOST"), "{msg}");
    // Named by security.inter.broker.protocol, which then takes the blame.
    let msg = refused(
        COMBINED_1,
        &[
            ("KAFKA_INTER_BROKER_LISTENER_NAME", None),
            (
                "KAFKA_LISTENERS",
                Some("INTERNAL://:19092,CONTROLLER://:9093,PLAINTEXT_HOST://:9092"),
            ),
            (
                "KAFKA_ADVERTISED_LISTENERS",
                Some("INTERNAL://kafka-1:19092,PLAINTEXT_HOST://localhost:29092"),
            ),
            (
                "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP",
                Some("CONTROLLER:PLAINTEXT,INTERNAL:PLAINTEXT,PLAINTEXT_HOST:PLAINTEXT"),
            ),
        ],
        "security.inter.broker.protocol",
    );
    assert!(msg.contains("inter-broker listener PLAINTEXT"), "{msg}");
}

#[test]
fn refuses_an_inter_broker_listener_without_a_protocol() {
    let mut controller = isolated_controller("1");
    controller.push((
        "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP".into(),
        "CONTROLLER:PLAINTEXT".into(),
    ));
    controller.retain(|(k, _)| k != "KAFKA_INTER_BROKER_LISTENER_NAME");
    controller.push(("KAFKA_INTER_BROKER_LISTENER_NAME".into(), "INTERNAL".into()));
    let err = load(None, controller, &[]).unwrap_err().to_string();
    assert!(
        err.contains("for `inter.broker.listener.name`")
            && err.contains("not in listener.security.protocol.map"),
        "{err}"
    );
}

// The parsers on their own.

#[test]
fn role_lists() {
    assert_eq!(parse_roles("broker,controller"), Ok(Some(ProcessRoles::COMBINED)));
    assert_eq!(
        parse_roles(" controller , broker "),
        Ok(Some(ProcessRoles::COMBINED))
    );
    assert_eq!(parse_roles("BROKER"), Ok(Some(ProcessRoles::BROKER)));
    assert_eq!(parse_roles("controller,"), Ok(Some(ProcessRoles::CONTROLLER)));
    assert_eq!(parse_roles(""), Ok(None));
    assert_eq!(parse_roles(" , "), Ok(None));
    assert!(parse_roles("brokers").is_err());
    assert!(parse_roles("controller,Controller").is_err());
    assert_eq!(ProcessRoles::COMBINED.to_string(), "broker,controller");
}

#[test]
fn voter_lists() {
    let (v, warnings) = parse_voters("1@a:9093, 2@[::1]:9093,3@10.0.0.3:1,").unwrap();
    assert!(warnings.is_empty());
    assert_eq!(
        v.into_iter().collect::<Vec<_>>(),
        vec![
            (NodeId(1), hp("a", 9093)),
            (NodeId(2), hp("::1", 9093)),
            (NodeId(3), hp("10.0.0.3", 1)),
        ]
    );
    let (v, warnings) = parse_voters("1@a:1,1@a:1").unwrap();
    assert_eq!(v.len(), 1);
    assert!(warnings.is_empty(), "the same entry twice is harmless");
    assert!(parse_voters("").unwrap().0.is_empty());
    for bad in ["1@[::]:9093", "2147483648@a:1", "1@a:99999", "1@a b:1", "@a:1"] {
        assert!(parse_voters(bad).is_err(), "{bad}");
    }
}

#[test]
fn bootstrap_server_lists() {
    assert_eq!(
        parse_bootstrap_servers("a:1,[::1]:2"),
        Ok(vec![hp("a", 1), hp("::1", 2)])
    );
    assert!(parse_bootstrap_servers("a").is_err());
}

#[test]
fn cluster_id_uuids() {
    let id = ClusterId::new;
    assert!(id(CLUSTER_ID).uuid().is_some());
    assert!(id("MkU3OEVBNTcwNTJENDM2Qk").uuid().is_some());
    assert_eq!(
        id("AAAAAAAAAAAAAAAAAAAAAQ").uuid(),
        Some([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1])
    );
    assert_eq!(
        id("AAAAAAAAAAAAAAAAAAAAAQ==").uuid(),
        id("AAAAAAAAAAAAAAAAAAAAAQ").uuid()
    );
    assert_eq!(id("strand-local-cluster").uuid(), None, "15 bytes");
    assert_eq!(
        id("4L6g3nShT+eMCtK//X86sw").uuid(),
        None,
        "not the URL-safe alphabet"
    );
    assert_eq!(id("AAAAAAAAAAAAAAAAAAAAAAAAA").uuid(), None);
}

#[test]
fn topics_take_min_insync_replicas_from_the_broker() {
    use super::super::{ConfigSource, TopicConfig};
    let entry = |config: &super::super::Config| {
        TopicConfig::default()
            .entries(config)
            .into_iter()
            .find(|e| e.name == "min.insync.replicas")
            .unwrap()
    };
    let default = entry(&load_env(&[]).config);
    assert_eq!(
        (default.value.as_deref(), default.source),
        (Some("1"), ConfigSource::DefaultConfig)
    );
    let loaded = load_env(&[("KAFKA_MIN_INSYNC_REPLICAS", "2")]).config;
    let set = entry(&loaded);
    assert_eq!(
        (set.value.as_deref(), set.source),
        (Some("2"), ConfigSource::StaticBrokerConfig)
    );
    // What produce checks: the broker's default, unless the topic overrides it.
    assert_eq!(
        TopicConfig::default().log_settings(&loaded).min_insync_replicas,
        2
    );
}

#[test]
fn leader_rebalance_is_on_every_five_minutes_unless_turned_off() {
    let interval = |env: &[(&str, &str)]| load_env(env).config.cluster.leader_balance_interval_ms;
    assert_eq!(interval(&[]), Some(300_000));
    assert_eq!(
        interval(&[("KAFKA_LEADER_IMBALANCE_CHECK_INTERVAL_SECONDS", "2")]),
        Some(2_000)
    );
    assert_eq!(interval(&[("KAFKA_AUTO_LEADER_REBALANCE_ENABLE", "false")]), None);
}
