//! The cluster a node belongs to, from the settings a Kafka (KRaft) user already writes:
//! `process.roles`, `node.id`, `controller.quorum.voters` or
//! `controller.quorum.bootstrap.servers`, `controller.listener.names` with its listener in
//! `listeners`, `inter.broker.listener.name` (or `security.inter.broker.protocol`),
//! `advertised.listeners` and `cluster.id` (`CLUSTER_ID`), plus the replication and liveness
//! settings. [`ClusterConfig`] is the one typed value that says all of it.
//!
//! Two modes:
//! - **Standalone**: `process.roles` absent or empty, as with no configuration at all. The node
//!   is a broker and the only voter of its own controller quorum ([`Quorum::Standalone`]); no
//!   controller traffic leaves it. The cluster keys are checked for syntax only, and
//!   `cluster.id` keeps its default.
//! - **KRaft**: `process.roles` set. The combination is validated as Kafka's `KafkaConfig`
//!   validates it (`validateValues`, Kafka 3.9): `node.id` required; voters or bootstrap servers
//!   required; a controller is one of the voters and has its controller listener in `listeners`;
//!   a broker-only node is not a voter and has no controller listener in `listeners`; the
//!   inter-broker listener is one of the node's client listeners; a controller-only node has no
//!   other listener; `inter.broker.listener.name` and `security.inter.broker.protocol` are not
//!   both set. `cluster.id` must be set unless the node is the only voter of its quorum (as in
//!   Kafka's sample `server.properties`, whose id Kafka takes from `kafka-storage format`;
//!   Strand has no format step, so such a node keeps the standalone default): it is what keeps
//!   nodes of different clusters apart, and the apache/kafka image refuses a KRaft node without
//!   `CLUSTER_ID`.
//!
//! Where Kafka 3.9 accepts, so does Strand: a controller listener named in
//! `advertised.listeners` is the controller's advertised address (KIP-853) and is never
//! advertised to clients; duplicate voter ids keep the last entry (with a warning); voters and
//! bootstrap servers may both be given (the voters are the quorum); any non-empty cluster id is
//! accepted, a 22-character base64 UUID (what `kafka-storage random-uuid` prints) being the
//! usual form ([`ClusterId::uuid`]); a controller listener name missing from
//! `listener.security.protocol.map` is PLAINTEXT (Kafka assumes so only when the map is not
//! set). Strand is stricter only where Kafka would start and then
//! fail: a voter id must be a valid node id (0 or more) and a voter host routable (not
//! `0.0.0.0`, which Kafka refuses when its Raft client starts); the controller listener must be
//! PLAINTEXT, like every listener Strand serves.

use std::collections::BTreeMap;
use std::fmt;

use base64::alphabet;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use base64::Engine as _;
use strand_protocol::types::NodeId;

use super::listeners::{self, HostPort, Resolved, SecurityProtocol};
use super::{ConfigError, Resolver, I32_MAX};

/// The roles a node plays (`process.roles`). At least one is set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcessRoles {
    /// Serves Kafka clients and holds partition replicas.
    pub broker: bool,
    /// A voter of the controller quorum, which holds the cluster metadata.
    pub controller: bool,
}

impl ProcessRoles {
    /// `broker,controller`: Kafka's combined mode, and the standalone node's roles.
    pub const COMBINED: ProcessRoles = ProcessRoles {
        broker: true,
        controller: true,
    };
    /// `broker` only.
    pub const BROKER: ProcessRoles = ProcessRoles {
        broker: true,
        controller: false,
    };
    /// `controller` only.
    pub const CONTROLLER: ProcessRoles = ProcessRoles {
        broker: false,
        controller: true,
    };
}

impl fmt::Display for ProcessRoles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match (self.broker, self.controller) {
            (true, true) => "broker,controller",
            (true, false) => "broker",
            (false, true) => "controller",
            (false, false) => "none",
        })
    }
}

/// Who the controller quorum's voters are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Quorum {
    /// No `process.roles`: this node is the only voter, and nobody else takes part.
    Standalone,
    /// `controller.quorum.voters`: the voters and the address each listens on for the quorum.
    Voters(BTreeMap<NodeId, HostPort>),
    /// `controller.quorum.bootstrap.servers` without voters: controllers to ask for the quorum
    /// (the voters are learned from them).
    Bootstrap(Vec<HostPort>),
}

/// A cluster id (`cluster.id`, `CLUSTER_ID`): the same on every node of a cluster.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ClusterId(String);

/// Kafka's `Uuid.fromString`: URL-safe base64, padding optional.
const UUID_BASE64: GeneralPurpose = GeneralPurpose::new(
    &alphabet::URL_SAFE,
    GeneralPurposeConfig::new()
        .with_decode_padding_mode(DecodePaddingMode::Indifferent)
        .with_decode_allow_trailing_bits(true),
);

impl ClusterId {
    /// A cluster id as given (`load` checks configured ones: non-empty, at most 255
    /// characters, no control characters).
    pub fn new(id: impl Into<String>) -> ClusterId {
        ClusterId(id.into())
    }

    /// The id as configured.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The 16 bytes of the id if it is a base64 UUID as `kafka-storage random-uuid` prints it
    /// (22 characters, or 24 with padding), as Kafka's `Uuid.fromString` reads it.
    pub fn uuid(&self) -> Option<[u8; 16]> {
        if self.0.len() > 24 {
            return None;
        }
        let bytes = UUID_BASE64.decode(self.0.as_bytes()).ok()?;
        <[u8; 16]>::try_from(bytes.as_slice()).ok()
    }
}

impl fmt::Display for ClusterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The listener this node's controller serves the quorum on: the first name of
/// `controller.listener.names`, found in `listeners`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ControllerListener {
    /// Upper-case listener name, e.g. `CONTROLLER`.
    pub name: String,
    /// Its security protocol (always PLAINTEXT today).
    pub security_protocol: SecurityProtocol,
    /// Bind address; an empty host in the config becomes `0.0.0.0`.
    pub bind: HostPort,
    /// Its entry in `advertised.listeners` if any (KIP-853), else the bind address, a wildcard
    /// host replaced by the machine's host name.
    pub advertised: HostPort,
}

/// The client listener other brokers use to reach this one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InterBrokerListener {
    /// `inter.broker.listener.name`, or the name of `security.inter.broker.protocol`.
    pub name: String,
    /// The listener's advertised address. Port 0 means the port actually bound.
    pub advertised: HostPort,
}

/// The cluster this node belongs to and its part in it. Built by [`load`](super::load) as
/// [`Config::cluster`](super::Config::cluster).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterConfig {
    /// `node.id` (alias `broker.id`).
    pub node_id: NodeId,
    /// `process.roles`; broker and controller for a standalone node.
    pub roles: ProcessRoles,
    /// The controller quorum.
    pub quorum: Quorum,
    /// The first name of `controller.listener.names`: the listener controllers serve the quorum
    /// on (a broker-only node connects to the voters with its security protocol).
    pub controller_listener_name: Option<String>,
    /// This node's controller listener: set on a KRaft node with the controller role.
    pub controller_listener: Option<ControllerListener>,
    /// The listener other brokers reach this one on: set on a KRaft node with the broker role,
    /// and on a standalone node that has a listener of that name.
    pub inter_broker_listener: Option<InterBrokerListener>,
    /// `cluster.id` (`CLUSTER_ID`).
    pub cluster_id: ClusterId,
    /// `broker.rack`.
    pub rack: Option<String>,
    /// `replica.lag.time.max.ms`: a follower that has not caught up with the leader's log end
    /// for this long leaves the ISR.
    pub replica_lag_time_max_ms: u64,
    /// `default.replication.factor`: replicas of auto-created topics and of CreateTopics
    /// asking for -1.
    pub default_replication_factor: u16,
    /// `offsets.topic.replication.factor`: replicas of `__consumer_offsets` when the cluster
    /// creates it; `None`: min(3, the registered brokers).
    pub offsets_topic_replication_factor: Option<u16>,
    /// `min.insync.replicas`: in-sync replicas an acks=all produce needs.
    pub min_insync_replicas: u32,
    /// `broker.session.timeout.ms`: a broker whose heartbeats stop for this long is fenced.
    pub broker_session_timeout_ms: u32,
    /// `broker.heartbeat.interval.ms`: how often a broker heartbeats to the controller.
    pub broker_heartbeat_interval_ms: u32,
    /// `controller.quorum.election.timeout.ms`.
    pub quorum_election_timeout_ms: u32,
    /// `controller.quorum.fetch.timeout.ms`.
    pub quorum_fetch_timeout_ms: u32,
    /// How often leaders move back to their partitions' preferred replicas
    /// (`leader.imbalance.check.interval.seconds`); `None` when `auto.leader.rebalance.enable`
    /// is off.
    pub leader_balance_interval_ms: Option<u64>,
}

impl ClusterConfig {
    /// Whether `process.roles` was absent: the zero-config single node.
    pub fn is_standalone(&self) -> bool {
        self.quorum == Quorum::Standalone
    }

    /// The voters known from the configuration: this node alone when standalone, none when
    /// they are to be learned from bootstrap servers.
    pub fn static_voter_ids(&self) -> Vec<NodeId> {
        match &self.quorum {
            Quorum::Standalone => vec![self.node_id],
            Quorum::Voters(voters) => voters.keys().copied().collect(),
            Quorum::Bootstrap(_) => Vec::new(),
        }
    }
}

impl fmt::Display for ClusterConfig {
    /// One line for the start-up log.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cluster {}: node {}, ", self.cluster_id, self.node_id)?;
        match &self.quorum {
            Quorum::Standalone => {
                f.write_str("standalone (no process.roles: broker and the only controller voter)")?
            }
            Quorum::Voters(voters) => {
                write!(f, "roles {}, voters ", self.roles)?;
                for (i, (id, addr)) in voters.iter().enumerate() {
                    write!(f, "{}{id}@{addr}", if i == 0 { "" } else { "," })?;
                }
            }
            Quorum::Bootstrap(servers) => {
                write!(f, "roles {}, controller bootstrap servers ", self.roles)?;
                for (i, addr) in servers.iter().enumerate() {
                    write!(f, "{}{addr}", if i == 0 { "" } else { "," })?;
                }
            }
        }
        if let Some(c) = &self.controller_listener {
            write!(
                f,
                ", controller listener {}://{} (advertised {})",
                c.name, c.bind, c.advertised
            )?;
        } else if let (false, Some(name)) = (self.is_standalone(), &self.controller_listener_name) {
            write!(f, ", controller listener name {name}")?;
        }
        if let Some(ib) = &self.inter_broker_listener {
            write!(f, ", inter-broker listener {} ({})", ib.name, ib.advertised)?;
        }
        if let Some(rack) = &self.rack {
            write!(f, ", rack {rack}")?;
        }
        Ok(())
    }
}

/// Parses `process.roles`; `None` for an empty list. Roles are matched case-insensitively
/// (Kafka wants lower case); a role given twice is refused, as Kafka refuses it.
pub(super) fn parse_roles(text: &str) -> Result<Option<ProcessRoles>, String> {
    let mut roles = ProcessRoles {
        broker: false,
        controller: false,
    };
    for role in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let slot = if role.eq_ignore_ascii_case("broker") {
            &mut roles.broker
        } else if role.eq_ignore_ascii_case("controller") {
            &mut roles.controller
        } else {
            return Err(format!(
                "unknown process role `{role}`: expected broker, controller or broker,controller"
            ));
        };
        if *slot {
            return Err(format!("role `{role}` is given twice"));
        }
        *slot = true;
    }
    Ok((roles.broker || roles.controller).then_some(roles))
}

/// A `host:port` of the quorum: a host is required.
fn parse_quorum_address(text: &str, form: &str) -> Result<HostPort, String> {
    let addr =
        listeners::parse_host_port(text).map_err(|e| format!("`{text}`: {e}; each entry is {form}"))?;
    if addr.host.is_empty() {
        return Err(format!("`{text}` has no host; each entry is {form}"));
    }
    Ok(addr)
}

/// Parses `controller.quorum.voters` (`{id}@{host}:{port}`, comma-separated) into the voters and
/// warnings. A repeated id keeps its last entry, as Kafka does.
pub(super) fn parse_voters(text: &str) -> Result<(BTreeMap<NodeId, HostPort>, Vec<String>), String> {
    const FORM: &str = "{id}@{host}:{port}";
    let mut voters = BTreeMap::new();
    let mut warnings = Vec::new();
    for entry in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let mut parts = entry.split('@');
        let (Some(id), Some(addr), None) = (parts.next(), parts.next(), parts.next()) else {
            return Err(format!("`{entry}` is not of the form {FORM}"));
        };
        let id = super::parse_int(id.trim(), 0, I32_MAX)
            .map_err(|e| format!("`{entry}`: the voter id must be a node id: {e}"))?;
        let id = NodeId(i32::try_from(id).map_err(|_| format!("`{entry}`: voter id out of range"))?);
        let addr = parse_quorum_address(addr, FORM)?;
        if addr.host == "0.0.0.0" || addr.host == "::" {
            return Err(format!(
                "`{entry}`: {} is not a routable address; give the host other nodes reach voter {id} at",
                addr.host
            ));
        }
        if let Some(previous) = voters.insert(id, addr.clone()) {
            if previous != addr {
                warnings.push(format!(
                    "controller.quorum.voters names voter {id} twice ({previous} and {addr}); using {addr}"
                ));
            }
        }
    }
    Ok((voters, warnings))
}

/// Parses `controller.quorum.bootstrap.servers` (`{host}:{port}`, comma-separated).
pub(super) fn parse_bootstrap_servers(text: &str) -> Result<Vec<HostPort>, String> {
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|entry| parse_quorum_address(entry, "{host}:{port}"))
        .collect()
}

/// Why a controller listener name without a listener is refused on a controller.
fn missing_listener(name: &str) -> String {
    format!(
        "{name} is not one of `listeners`: with the controller role, each controller listener name must have a \
         listener (e.g. {name}://:9093)"
    )
}

/// Everything [`build`] needs that the rest of the configuration has already read.
pub(super) struct Inputs<'a> {
    pub(super) node_id: NodeId,
    pub(super) cluster_id: &'a str,
    pub(super) roles: Option<ProcessRoles>,
    pub(super) protocol_map: &'a BTreeMap<String, SecurityProtocol>,
    pub(super) controller_names: &'a [String],
    pub(super) listeners: &'a Resolved,
    /// `strand.http.listener` and `strand.admin.listener`, which a controller listener must not
    /// share a port with.
    pub(super) other_sockets: [(&'static str, &'a HostPort); 2],
}

/// Reads the cluster keys and checks the combination (see the module docs).
pub(super) fn build(
    r: &mut Resolver,
    inputs: Inputs<'_>,
    warnings: &mut Vec<String>,
    notes: &mut Vec<String>,
) -> Result<ClusterConfig, ConfigError> {
    let Inputs {
        node_id,
        cluster_id,
        roles,
        protocol_map,
        controller_names,
        listeners: resolved,
        other_sockets,
    } = inputs;

    // The syntax of every key, whatever the mode.
    let voters = r.parse("controller.quorum.voters", |s| {
        Ok((parse_voters(s)?, s.to_string()))
    })?;
    let voters = voters.map(|(voters, voter_warnings)| {
        warnings.extend(voter_warnings);
        voters
    });
    let voters = voters.filter(|v| !v.is_empty());
    let bootstrap = r.parse("controller.quorum.bootstrap.servers", |s| {
        Ok((parse_bootstrap_servers(s)?, s.to_string()))
    })?;
    let bootstrap = bootstrap.filter(|b| !b.is_empty());
    let inter_broker_name = r.parse("inter.broker.listener.name", |s| {
        match listeners::parse_names(s)?.as_slice() {
            [name] => Ok((name.clone(), name.clone())),
            _ => Err("expected one listener name".to_string()),
        }
    })?;
    let inter_broker_protocol = r.required("security.inter.broker.protocol", |s| {
        let protocol = SecurityProtocol::from_name(s)
            .ok_or_else(|| "expected PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL".to_string())?;
        Ok((protocol, protocol.name().to_string()))
    })?;
    let rack = r.parse("broker.rack", |s| {
        if s.len() > 255 || s.chars().any(char::is_control) {
            Err("expected a rack id of at most 255 characters".to_string())
        } else {
            Ok(((!s.is_empty()).then(|| s.to_string()), s.to_string()))
        }
    })?;
    let rack = rack.flatten();
    let replica_lag_time_max_ms = r.int("replica.lag.time.max.ms", 1, i64::MAX)?;
    let default_replication_factor = r.int("default.replication.factor", 1, i64::from(i16::MAX))?;
    let offsets_topic_replication_factor =
        r.opt_int("offsets.topic.replication.factor", 1, i64::from(i16::MAX))?;
    let min_insync_replicas = r.int("min.insync.replicas", 1, I32_MAX)?;
    let broker_session_timeout_ms = r.int("broker.session.timeout.ms", 1, I32_MAX)?;
    let broker_heartbeat_interval_ms = r.int("broker.heartbeat.interval.ms", 1, I32_MAX)?;
    let quorum_election_timeout_ms = r.int("controller.quorum.election.timeout.ms", 1, I32_MAX)?;
    let quorum_fetch_timeout_ms = r.int("controller.quorum.fetch.timeout.ms", 1, I32_MAX)?;
    let auto_leader_rebalance = r.boolean("auto.leader.rebalance.enable")?;
    let leader_imbalance_check_secs: u64 =
        r.int("leader.imbalance.check.interval.seconds", 1, i64::from(u32::MAX))?;

    let inter_broker_name_effective = inter_broker_name
        .clone()
        .unwrap_or_else(|| inter_broker_protocol.name().to_string());
    let inter_broker_listener = resolved
        .listeners
        .iter()
        .find(|l| l.name == inter_broker_name_effective)
        .map(|l| InterBrokerListener {
            name: l.name.clone(),
            advertised: l.advertised.clone(),
        });
    let mut config = ClusterConfig {
        node_id,
        roles: ProcessRoles::COMBINED,
        quorum: Quorum::Standalone,
        controller_listener_name: controller_names.first().cloned(),
        controller_listener: None,
        inter_broker_listener,
        cluster_id: ClusterId(cluster_id.to_string()),
        rack,
        replica_lag_time_max_ms,
        default_replication_factor,
        offsets_topic_replication_factor,
        min_insync_replicas,
        broker_session_timeout_ms,
        broker_heartbeat_interval_ms,
        quorum_election_timeout_ms,
        quorum_fetch_timeout_ms,
        leader_balance_interval_ms: auto_leader_rebalance
            .then(|| leader_imbalance_check_secs.saturating_mul(1_000)),
    };

    let Some(roles) = roles else {
        for key in ["controller.quorum.voters", "controller.quorum.bootstrap.servers"] {
            if let Some(origin) = r.explicit.get(key).map(|e| &e.origin) {
                notes.push(format!(
                    "`{key}` (from {origin}) has no effect without process.roles: this node is its own one-voter quorum"
                ));
            }
        }
        return Ok(config);
    };
    config.roles = roles;

    // KRaft: the checks of Kafka's KafkaConfig.validateValues.
    if !r.explicit.contains_key("node.id") {
        return Err(r.blame(
            "node.id",
            format!(
                "node.id (or broker.id) must be set when process.roles is set ({roles}): each node of a cluster needs its own id"
            ),
        ));
    }
    config.quorum = match (voters, bootstrap) {
        (Some(voters), _) => Quorum::Voters(voters),
        (None, Some(servers)) => Quorum::Bootstrap(servers),
        (None, None) => {
            return Err(r.blame(
                "controller.quorum.voters",
                format!(
                    "process.roles is set ({roles}): either controller.quorum.voters must list the controller quorum \
                     ({{id}}@{{host}}:{{port}},...) or controller.quorum.bootstrap.servers must list controllers \
                     ({{host}}:{{port}},...)"
                ),
            ))
        }
    };
    let alone = match &config.quorum {
        Quorum::Voters(voters) => roles.controller && voters.len() == 1 && voters.contains_key(&node_id),
        _ => false,
    };
    if !alone && !r.explicit.contains_key("cluster.id") {
        return Err(r.blame(
            "cluster.id",
            "must be set (CLUSTER_ID or cluster.id) on a node of a cluster of several nodes: every node carries the \
             same id, which keeps nodes of different clusters apart (e.g. one printed by `kafka-storage random-uuid`)"
                .to_string(),
        ));
    }
    if let Quorum::Voters(voters) = &config.quorum {
        let ids = || {
            voters
                .keys()
                .map(|id| id.to_string())
                .collect::<Vec<_>>()
                .join(",")
        };
        if roles.controller && !voters.contains_key(&node_id) {
            return Err(r.blame(
                "controller.quorum.voters",
                format!(
                    "process.roles contains the controller role, so node id {node_id} must be one of the voters ({})",
                    ids()
                ),
            ));
        }
        if !roles.controller && voters.contains_key(&node_id) {
            return Err(r.blame(
                "controller.quorum.voters",
                format!(
                    "process.roles is just broker, so node id {node_id} must not be one of the voters ({})",
                    ids()
                ),
            ));
        }
    }

    // The security protocol of a listener name: its entry in listener.security.protocol.map, or
    // the protocol it is named after. A controller listener name in neither is PLAINTEXT: Kafka
    // assumes so when the map is not set and nothing uses SSL or SASL; Strand serves nothing
    // else, so it assumes so always.
    let protocol_of = |name: &str| {
        protocol_map
            .get(name)
            .copied()
            .or_else(|| SecurityProtocol::from_name(name))
    };
    let controller_protocol = |name: &str| protocol_of(name).unwrap_or(SecurityProtocol::Plaintext);

    let Some(first_controller_name) = controller_names.first().cloned() else {
        return Err(r.blame(
            "controller.listener.names",
            if roles.controller {
                "must name the controller listener, one of `listeners`, when process.roles contains the controller role"
            } else {
                "must name the controllers' listener when process.roles is just broker"
            }
            .to_string(),
        ));
    };
    let protocol = controller_protocol(&first_controller_name);
    if protocol != SecurityProtocol::Plaintext {
        return Err(r.blame(
            "listener.security.protocol.map",
            format!(
                "controller listener {first_controller_name} uses security protocol {protocol}: SSL/SASL listeners \
                 are not supported yet (only PLAINTEXT)"
            ),
        ));
    }
    if roles.controller {
        if let Some(missing) = controller_names
            .iter()
            .find(|n| !resolved.controller.iter().any(|c| &&c.configured.name == n))
        {
            return Err(r.blame("controller.listener.names", missing_listener(missing)));
        }
        if roles == ProcessRoles::CONTROLLER {
            if let Some(other) = resolved.listeners.first() {
                return Err(r.blame(
                    "listeners",
                    format!(
                        "process.roles is just controller, so listeners may only hold controller listeners (those in \
                         controller.listener.names); {} is not one",
                        other.name
                    ),
                ));
            }
        }
        let Some(endpoint) = resolved
            .controller
            .iter()
            .find(|c| c.configured.name == first_controller_name)
        else {
            return Err(r.blame(
                "controller.listener.names",
                missing_listener(&first_controller_name),
            ));
        };
        let clash = resolved
            .listeners
            .iter()
            .find(|l| listeners::conflicts(&endpoint.bind, &l.bind))
            .map(|l| (l.name.clone(), l.bind.port))
            .or_else(|| {
                other_sockets
                    .iter()
                    .find(|(_, addr)| listeners::conflicts(&endpoint.bind, addr))
                    .map(|(key, addr)| (key.to_string(), addr.port))
            });
        if let Some((other, port)) = clash {
            return Err(r.blame(
                "listeners",
                format!("controller listener {first_controller_name} and {other} both bind port {port}"),
            ));
        }
        config.controller_listener = Some(ControllerListener {
            name: first_controller_name.clone(),
            security_protocol: protocol,
            bind: endpoint.bind.clone(),
            advertised: endpoint.advertised.clone(),
        });
    } else {
        if let Some(c) = resolved.controller.first() {
            return Err(r.blame(
                "listeners",
                format!(
                    "process.roles is just broker, so listeners must not hold a controller listener ({}, named in \
                     controller.listener.names): only controllers serve it",
                    c.configured
                ),
            ));
        }
        if controller_names.len() > 1 {
            warnings.push(format!(
                "controller.listener.names has several names ({}); a broker-only node uses only the first, {first_controller_name}",
                controller_names.join(",")
            ));
        }
    }

    // The inter-broker listener.
    if inter_broker_name.is_some() && r.explicit.contains_key("security.inter.broker.protocol") {
        return Err(r.blame(
            "inter.broker.listener.name",
            "only one of inter.broker.listener.name and security.inter.broker.protocol may be set"
                .to_string(),
        ));
    }
    if protocol_of(&inter_broker_name_effective).is_none() {
        return Err(r.blame(
            "inter.broker.listener.name",
            format!("listener {inter_broker_name_effective} is not in listener.security.protocol.map"),
        ));
    }
    if roles.broker {
        if config.inter_broker_listener.is_none() {
            let key = if inter_broker_name.is_some() {
                "inter.broker.listener.name"
            } else {
                "security.inter.broker.protocol"
            };
            let names: Vec<&str> = resolved.listeners.iter().map(|l| l.name.as_str()).collect();
            return Err(r.blame(
                key,
                format!(
                    "the inter-broker listener {inter_broker_name_effective} must be one of the advertised client \
                     listeners ({}); set inter.broker.listener.name to one of them",
                    names.join(",")
                ),
            ));
        }
    } else {
        config.inter_broker_listener = None;
    }
    if let Some(origin) = r
        .explicit
        .get("controller.quorum.bootstrap.servers")
        .map(|e| &e.origin)
    {
        if matches!(config.quorum, Quorum::Voters(_)) {
            notes.push(format!(
                "controller.quorum.bootstrap.servers (from {origin}) is not used: controller.quorum.voters is set"
            ));
        }
    }
    if r.explicit.contains_key("cluster.id") && config.cluster_id.uuid().is_none() {
        notes.push(format!(
            "cluster id `{}` is not a base64 UUID as `kafka-storage random-uuid` prints; Kafka before 3.9 refuses it",
            config.cluster_id
        ));
    }
    Ok(config)
}

#[cfg(test)]
mod tests;
