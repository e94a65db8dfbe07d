//! `listeners`, `advertised.listeners`, `listener.security.protocol.map` and
//! `controller.listener.names`, and plain `host:port` socket settings.

use std::collections::BTreeMap;
use std::fmt;

/// A Kafka security protocol. Strand serves only [`SecurityProtocol::Plaintext`] for now.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SecurityProtocol {
    /// No TLS, no authentication.
    Plaintext,
    /// TLS.
    Ssl,
    /// SASL authentication without TLS.
    SaslPlaintext,
    /// SASL authentication over TLS.
    SaslSsl,
}

impl SecurityProtocol {
    const ALL: [SecurityProtocol; 4] = [
        SecurityProtocol::Plaintext,
        SecurityProtocol::Ssl,
        SecurityProtocol::SaslPlaintext,
        SecurityProtocol::SaslSsl,
    ];

    /// The Kafka name (`PLAINTEXT`, `SSL`, `SASL_PLAINTEXT`, `SASL_SSL`).
    pub fn name(self) -> &'static str {
        match self {
            SecurityProtocol::Plaintext => "PLAINTEXT",
            SecurityProtocol::Ssl => "SSL",
            SecurityProtocol::SaslPlaintext => "SASL_PLAINTEXT",
            SecurityProtocol::SaslSsl => "SASL_SSL",
        }
    }

    /// Parses a protocol name, case-insensitively as Kafka does.
    pub fn from_name(name: &str) -> Option<SecurityProtocol> {
        Self::ALL
            .into_iter()
            .find(|p| p.name().eq_ignore_ascii_case(name.trim()))
    }
}

impl fmt::Display for SecurityProtocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A host (name or IP literal, IPv6 without brackets) and a port.
///
/// Bind with `(host.as_str(), port)` through `ToSocketAddrs`, which resolves host names.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct HostPort {
    /// Host name or IP literal. IPv6 literals are stored without brackets.
    pub host: String,
    /// Port; 0 means "any free port" when binding and "the port actually bound" when advertising.
    pub port: u16,
}

impl HostPort {
    /// Whether the host is an all-interfaces address (`0.0.0.0`, `::`) or empty.
    pub fn is_wildcard(&self) -> bool {
        is_wildcard_host(&self.host)
    }
}

impl fmt::Display for HostPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

fn is_wildcard_host(host: &str) -> bool {
    host.is_empty() || host == "0.0.0.0" || host == "::"
}

/// A Kafka client listener: where to bind and what to tell clients in Metadata.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listener {
    /// Upper-case listener name, e.g. `PLAINTEXT` or `PLAINTEXT_HOST`.
    pub name: String,
    /// The listener's protocol (from `listener.security.protocol.map`); always PLAINTEXT today.
    pub security_protocol: SecurityProtocol,
    /// Bind address. An empty host in the config becomes `0.0.0.0`; port 0 is ephemeral.
    pub bind: HostPort,
    /// Address advertised to clients. Port 0 means "the port actually bound": the server
    /// fills it in after binding.
    pub advertised: HostPort,
}

/// One parsed `NAME://host:port` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Endpoint {
    pub(super) name: String,
    pub(super) addr: HostPort,
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}", self.name, self.addr)
    }
}

/// The default `listener.security.protocol.map`.
pub(super) const DEFAULT_PROTOCOL_MAP: &str =
    "PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL";

fn valid_listener_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.')
}

/// Parses a comma-separated `NAME://host:port` list. Names are upper-cased and must be unique.
pub(super) fn parse_endpoints(text: &str) -> Result<Vec<Endpoint>, String> {
    let mut out: Vec<Endpoint> = Vec::new();
    for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let Some((name, addr)) = item.split_once("://") else {
            return Err(format!("`{item}` is not of the form NAME://host:port"));
        };
        let name = name.trim().to_ascii_uppercase();
        if !valid_listener_name(&name) {
            return Err(format!(
                "`{item}` has an invalid listener name (letters, digits, `_`, `-`)"
            ));
        }
        let addr = parse_host_port(addr).map_err(|e| format!("`{item}`: {e}"))?;
        if out.iter().any(|e| e.name == name) {
            return Err(format!(
                "listener name {name} appears more than once; names must be unique"
            ));
        }
        out.push(Endpoint { name, addr });
    }
    if out.is_empty() {
        return Err("expected at least one NAME://host:port".to_string());
    }
    Ok(out)
}

/// Parses `host:port`, `:port` or `[ipv6]:port`. The host may be empty.
pub(super) fn parse_host_port(text: &str) -> Result<HostPort, String> {
    let text = text.trim();
    let (host, port) = if let Some(rest) = text.strip_prefix('[') {
        let Some((host, after)) = rest.split_once(']') else {
            return Err("missing `]` after an IPv6 address".to_string());
        };
        let Some(port) = after.strip_prefix(':') else {
            return Err("expected `:port` after `]`".to_string());
        };
        let (addr, zone) = host.split_once('%').unwrap_or((host, ""));
        let addr_ok = addr.contains(':')
            && addr
                .chars()
                .all(|c| c.is_ascii_hexdigit() || matches!(c, ':' | '.'));
        let zone_ok = zone
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
        if !addr_ok || !zone_ok {
            return Err(format!("`{host}` is not an IPv6 address"));
        }
        (host, port)
    } else {
        let Some((host, port)) = text.rsplit_once(':') else {
            return Err("expected host:port".to_string());
        };
        if host.contains(':') {
            return Err("an IPv6 address must be in brackets, e.g. [::1]:9092".to_string());
        }
        if !host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
        {
            return Err(format!("`{host}` is not a valid host name or IP address"));
        }
        (host, port)
    };
    let port = if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) {
        port.parse::<u16>().ok()
    } else {
        None
    };
    let Some(port) = port else {
        return Err("the port must be a number from 0 to 65535".to_string());
    };
    Ok(HostPort {
        host: host.to_string(),
        port,
    })
}

/// Parses `listener.security.protocol.map` (`NAME:PROTOCOL,...`; a later entry for a name wins).
pub(super) fn parse_protocol_map(text: &str) -> Result<BTreeMap<String, SecurityProtocol>, String> {
    let mut map = BTreeMap::new();
    for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let Some((name, protocol)) = item.split_once(':') else {
            return Err(format!("`{item}` is not of the form NAME:PROTOCOL"));
        };
        let name = name.trim().to_ascii_uppercase();
        if !valid_listener_name(&name) {
            return Err(format!("`{item}` has an invalid listener name"));
        }
        let Some(protocol) = SecurityProtocol::from_name(protocol) else {
            return Err(format!(
                "`{}` in `{item}` is not a security protocol (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL)",
                protocol.trim()
            ));
        };
        map.insert(name, protocol);
    }
    Ok(map)
}

/// Parses a comma-separated list of listener names (upper-cased).
pub(super) fn parse_names(text: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for name in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let name = name.to_ascii_uppercase();
        if !valid_listener_name(&name) {
            return Err(format!("`{name}` is not a valid listener name"));
        }
        out.push(name);
    }
    Ok(out)
}

/// Which setting a listener error is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Blame {
    Listeners,
    Advertised,
}

/// A listener of `listeners` named in `controller.listener.names`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct ControllerEndpoint {
    /// As configured (`NAME://host:port`, the host possibly empty).
    pub(super) configured: Endpoint,
    /// Bind address: an empty host becomes `0.0.0.0`.
    pub(super) bind: HostPort,
    /// From `advertised.listeners` if it names this listener, else the bind address; a wildcard
    /// host becomes `hostname()`.
    pub(super) advertised: HostPort,
}

/// The outcome of combining the listener settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Resolved {
    /// Kafka client listeners, in configuration order.
    pub(super) listeners: Vec<Listener>,
    /// Controller listeners, in configuration order: not client listeners; what they are for is
    /// the cluster configuration's business.
    pub(super) controller: Vec<ControllerEndpoint>,
}

/// Combines the listener settings into client listeners.
///
/// Controller listeners are set aside. Each client listener needs a protocol (from the map, or
/// its own name if that is a protocol name) and it must be PLAINTEXT. Advertised entries must
/// name a listener; a listener without one advertises its bind address; a wildcard advertised
/// host becomes `hostname()`. Without `client_listener_required` (a controller-only node) there
/// may be no client listener at all.
pub(super) fn resolve(
    endpoints: Vec<Endpoint>,
    advertised: Option<Vec<Endpoint>>,
    protocol_map: &BTreeMap<String, SecurityProtocol>,
    controller_names: &[String],
    client_listener_required: bool,
    hostname: &mut dyn FnMut() -> String,
) -> Result<Resolved, (Blame, String)> {
    let mut listeners: Vec<Listener> = Vec::new();
    let mut controller = Vec::new();
    for ep in endpoints {
        if controller_names.contains(&ep.name) {
            let mut bind = ep.addr.clone();
            if bind.host.is_empty() {
                bind.host = "0.0.0.0".to_string();
            }
            controller.push(ControllerEndpoint {
                advertised: bind.clone(),
                bind,
                configured: ep,
            });
            continue;
        }
        let protocol = protocol_map
            .get(&ep.name)
            .copied()
            .or_else(|| SecurityProtocol::from_name(&ep.name));
        let Some(protocol) = protocol else {
            return Err((
                Blame::Listeners,
                format!(
                    "no security protocol is defined for listener {0}: add it to \
                     listener.security.protocol.map (e.g. {0}:PLAINTEXT)",
                    ep.name
                ),
            ));
        };
        if protocol != SecurityProtocol::Plaintext {
            return Err((
                Blame::Listeners,
                format!(
                    "listener {} uses security protocol {protocol}: SSL/SASL listeners are not supported \
                     yet (only PLAINTEXT)",
                    ep.name
                ),
            ));
        }
        let mut bind = ep.addr.clone();
        if bind.host.is_empty() {
            bind.host = "0.0.0.0".to_string();
        }
        listeners.push(Listener {
            name: ep.name,
            security_protocol: protocol,
            advertised: bind.clone(),
            bind,
        });
    }
    if listeners.is_empty() && client_listener_required {
        return Err((
            Blame::Listeners,
            "no Kafka client listener: every listener is named in controller.listener.names".to_string(),
        ));
    }
    for (i, a) in listeners.iter().enumerate() {
        for b in listeners.iter().skip(i + 1) {
            if conflicts(&a.bind, &b.bind) {
                return Err((
                    Blame::Listeners,
                    format!(
                        "listeners {} and {} both bind port {}",
                        a.name, b.name, a.bind.port
                    ),
                ));
            }
        }
    }
    let mut advertised_by_name: BTreeMap<String, HostPort> = BTreeMap::new();
    for ep in advertised.unwrap_or_default() {
        if controller_names.contains(&ep.name) {
            if let Some(c) = controller.iter_mut().find(|c| c.configured.name == ep.name) {
                c.advertised = ep.addr;
            }
            continue;
        }
        if !listeners.iter().any(|l| l.name == ep.name) {
            return Err((
                Blame::Advertised,
                format!(
                    "advertised listener {} is not one of the listeners in `listeners`",
                    ep.name
                ),
            ));
        }
        advertised_by_name.insert(ep.name, ep.addr);
    }
    let mut host_cache: Option<String> = None;
    for l in &mut listeners {
        if let Some(addr) = advertised_by_name.remove(&l.name) {
            l.advertised = addr;
        }
        if l.advertised.is_wildcard() {
            l.advertised.host = host_cache.get_or_insert_with(&mut *hostname).clone();
        }
    }
    for c in &mut controller {
        if c.advertised.is_wildcard() {
            c.advertised.host = host_cache.get_or_insert_with(&mut *hostname).clone();
        }
    }
    Ok(Resolved {
        listeners,
        controller,
    })
}

/// Whether two bind addresses would collide (same non-zero port on the same or a wildcard host).
pub(super) fn conflicts(a: &HostPort, b: &HostPort) -> bool {
    a.port != 0 && a.port == b.port && (a.host == b.host || a.is_wildcard() || b.is_wildcard())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hp(host: &str, port: u16) -> HostPort {
        HostPort {
            host: host.to_string(),
            port,
        }
    }

    fn default_map() -> BTreeMap<String, SecurityProtocol> {
        parse_protocol_map(DEFAULT_PROTOCOL_MAP).unwrap()
    }

    fn resolve_str(
        listeners: &str,
        advertised: Option<&str>,
        map: &str,
        controller: &str,
    ) -> Result<Resolved, (Blame, String)> {
        resolve(
            parse_endpoints(listeners).unwrap(),
            advertised.map(|a| parse_endpoints(a).unwrap()),
            &parse_protocol_map(map).unwrap(),
            &parse_names(controller).unwrap(),
            true,
            &mut || "myhost".to_string(),
        )
    }

    #[test]
    fn host_port_forms() {
        assert_eq!(parse_host_port(":9092").unwrap(), hp("", 9092));
        assert_eq!(parse_host_port("0.0.0.0:0").unwrap(), hp("0.0.0.0", 0));
        assert_eq!(
            parse_host_port("kafka-1.example.com:29092").unwrap(),
            hp("kafka-1.example.com", 29092)
        );
        assert_eq!(parse_host_port("[::1]:9092").unwrap(), hp("::1", 9092));
        assert_eq!(parse_host_port("[::]:9092").unwrap(), hp("::", 9092));
        assert_eq!(
            parse_host_port("[fe80::1%eth0]:1").unwrap(),
            hp("fe80::1%eth0", 1)
        );
        assert_eq!(hp("::1", 9092).to_string(), "[::1]:9092");
        assert_eq!(hp("localhost", 9092).to_string(), "localhost:9092");
        for bad in [
            "9092",
            "host:",
            "host:65536",
            "host:-1",
            "host:+1",
            "::1:9092",
            "[::1]9092",
            "[::1",
            "h st:1",
            "[]:1",
            "[abc]:1",
            "[zz::1]:1",
        ] {
            assert!(parse_host_port(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn endpoint_lists() {
        let eps = parse_endpoints("plaintext://:9092, CONTROLLER://[::1]:9093,").unwrap();
        assert_eq!(eps.len(), 2);
        assert_eq!(
            eps[0],
            Endpoint {
                name: "PLAINTEXT".into(),
                addr: hp("", 9092)
            }
        );
        assert_eq!(eps[1].to_string(), "CONTROLLER://[::1]:9093");
        let dup = parse_endpoints("PLAINTEXT://:9092,plaintext://:9093").unwrap_err();
        assert!(dup.contains("PLAINTEXT") && dup.contains("unique"), "{dup}");
        assert!(parse_endpoints("").is_err());
        assert!(parse_endpoints("localhost:9092").is_err());
        assert!(parse_endpoints("://:9092").is_err());
    }

    #[test]
    fn protocol_map() {
        let map = parse_protocol_map("CONTROLLER:PLAINTEXT, plaintext_host:plaintext ,EXT:SASL_SSL").unwrap();
        assert_eq!(map.get("PLAINTEXT_HOST"), Some(&SecurityProtocol::Plaintext));
        assert_eq!(map.get("EXT"), Some(&SecurityProtocol::SaslSsl));
        assert!(parse_protocol_map("A:TLS").unwrap_err().contains("TLS"));
        assert!(parse_protocol_map("A").is_err());
        assert_eq!(default_map().len(), 4);
    }

    #[test]
    fn empty_host_binds_all_interfaces_and_advertises_hostname() {
        let r = resolve_str("PLAINTEXT://:9092", None, DEFAULT_PROTOCOL_MAP, "").unwrap();
        assert_eq!(r.listeners[0].bind, hp("0.0.0.0", 9092));
        assert_eq!(r.listeners[0].advertised, hp("myhost", 9092));
        let r = resolve_str("PLAINTEXT://127.0.0.1:0", None, DEFAULT_PROTOCOL_MAP, "").unwrap();
        assert_eq!(
            r.listeners[0].advertised,
            hp("127.0.0.1", 0),
            "port 0 = bound port"
        );
        let r = resolve_str(
            "PLAINTEXT://[::]:9092",
            Some("PLAINTEXT://:0"),
            DEFAULT_PROTOCOL_MAP,
            "",
        )
        .unwrap();
        assert_eq!(r.listeners[0].bind, hp("::", 9092));
        assert_eq!(r.listeners[0].advertised, hp("myhost", 0));
    }

    #[test]
    fn controller_listeners_are_set_aside() {
        let r = resolve_str(
            "PLAINTEXT://:9092,CONTROLLER://:9093",
            Some("PLAINTEXT://localhost:9092,CONTROLLER://localhost:9093"),
            "CONTROLLER:SASL_SSL,PLAINTEXT:PLAINTEXT",
            "CONTROLLER",
        )
        .unwrap();
        assert_eq!(r.listeners.len(), 1);
        assert_eq!(r.listeners[0].name, "PLAINTEXT");
        assert_eq!(r.controller.len(), 1);
        assert_eq!(r.controller[0].configured.to_string(), "CONTROLLER://:9093");
        assert_eq!(r.controller[0].bind, hp("0.0.0.0", 9093));
        assert_eq!(r.controller[0].advertised, hp("localhost", 9093));
        let (blame, msg) =
            resolve_str("CONTROLLER://:9093", None, DEFAULT_PROTOCOL_MAP, "CONTROLLER").unwrap_err();
        assert_eq!(blame, Blame::Listeners);
        assert!(msg.contains("no Kafka client listener"), "{msg}");
        // A controller-only node has no client listener; its controller listener advertises
        // the machine's name when bound to all interfaces.
        let r = resolve(
            parse_endpoints("CONTROLLER://:9093").unwrap(),
            None,
            &default_map(),
            &parse_names("CONTROLLER").unwrap(),
            false,
            &mut || "myhost".to_string(),
        )
        .unwrap();
        assert!(r.listeners.is_empty());
        assert_eq!(r.controller[0].advertised, hp("myhost", 9093));
    }

    #[test]
    fn protocol_rules() {
        let (_, msg) = resolve_str("SASL_PLAINTEXT://:9092", None, DEFAULT_PROTOCOL_MAP, "").unwrap_err();
        assert!(msg.contains("SSL/SASL listeners are not supported yet"), "{msg}");
        let (_, msg) = resolve_str("EXTERNAL://:9092", None, "EXTERNAL:SSL", "").unwrap_err();
        assert!(
            msg.contains("EXTERNAL") && msg.contains("not supported yet"),
            "{msg}"
        );
        let (_, msg) = resolve_str("INTERNAL://:9092", None, DEFAULT_PROTOCOL_MAP, "").unwrap_err();
        assert!(
            msg.contains("no security protocol") && msg.contains("INTERNAL"),
            "{msg}"
        );
        // A protocol name works as a listener name even when the map does not mention it.
        assert!(resolve_str("PLAINTEXT://:9092", None, "OTHER:SSL", "").is_ok());
    }

    #[test]
    fn advertised_rules() {
        let (blame, msg) =
            resolve_str("PLAINTEXT://:9092", Some("OTHER://h:1"), DEFAULT_PROTOCOL_MAP, "").unwrap_err();
        assert_eq!(blame, Blame::Advertised);
        assert!(msg.contains("OTHER"), "{msg}");
        let r = resolve_str(
            "PLAINTEXT://0.0.0.0:29092,PLAINTEXT_HOST://0.0.0.0:9092",
            Some("PLAINTEXT_HOST://localhost:9092"),
            "PLAINTEXT:PLAINTEXT,PLAINTEXT_HOST:PLAINTEXT",
            "",
        )
        .unwrap();
        assert_eq!(r.listeners[0].advertised, hp("myhost", 29092));
        assert_eq!(r.listeners[1].advertised, hp("localhost", 9092));
    }

    #[test]
    fn port_conflicts() {
        let (_, msg) = resolve_str(
            "A://:9092,B://127.0.0.1:9092",
            None,
            "A:PLAINTEXT,B:PLAINTEXT",
            "",
        )
        .unwrap_err();
        assert!(msg.contains("9092"), "{msg}");
        assert!(resolve_str(
            "A://127.0.0.1:9092,B://127.0.0.2:9092",
            None,
            "A:PLAINTEXT,B:PLAINTEXT",
            ""
        )
        .is_ok());
        assert!(resolve_str("A://:0,B://:0", None, "A:PLAINTEXT,B:PLAINTEXT", "").is_ok());
    }
}
