//! Network namespaces for the nodes (`strand-chaos --netns`, iproute2's `ip netns`; needs
//! root): each node runs in a namespace of its own, so that the harness can cut the traffic
//! between nodes while its clients, in the harness's own namespace, still reach every node.
//!
//! The network: a switch namespace holding a bridge; each node's namespace has one veth link
//! to the bridge, with the address `10.213.<net>.<node>`; the harness's namespace has one too,
//! with `10.213.<net>.254` (the only thing added outside the run's own namespaces, and deleted
//! with them). `<net>` is the first free /24 from one derived from the process id, so that
//! concurrent runs do not collide. Everything is layer 2 inside the switch namespace: the
//! host's forwarding and firewall are not involved.
//!
//! Isolation ([`Net::isolate`]): blackhole routes inside the namespaces, from the isolated node
//! to each other node and from each other node to it; the client's path (the harness's address)
//! is untouched, so clients keep writing to both sides. [`Net::heal`] removes them.
//!
//! A node is started through a small script, `exec ip netns exec <ns> <strand> "$@"`, so the
//! process the harness signals is the broker itself.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

use super::checker::NodeNo;

/// Runs `ip <args>`; fails with its stderr.
fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running ip {}", args.join(" ")))?;
    if !out.status.success() {
        bail!(
            "ip {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

fn ip_output(args: &[&str]) -> Result<String> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running ip {}", args.join(" ")))?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The namespaces and links of one run; deleted when dropped.
pub struct Net {
    prefix: String,
    net: u8,
    nodes: u32,
    namespaces: Vec<String>,
    /// Blackhole routes in place: (namespace, destination).
    blackholes: Vec<(String, String)>,
}

impl Net {
    /// Creates the switch, the harness's link and one namespace per node (1..=`nodes`).
    pub fn create(nodes: u32) -> Result<Self> {
        if !(1..=250).contains(&nodes) {
            bail!("--netns takes 1 to 250 nodes");
        }
        if !rustix::process::geteuid().is_root() {
            bail!("--netns needs root (it creates network namespaces with ip netns)");
        }
        let pid = std::process::id();
        let routes = ip_output(&["-4", "route", "show"])?;
        let start = (pid % 200) as u8 + 20;
        let net = (0..200u8)
            .map(|i| start.wrapping_add(i))
            .filter(|n| (20..=250).contains(n))
            .find(|n| !routes.contains(&format!("10.213.{n}.")))
            .context("no free 10.213.x.0/24 for the nodes' network")?;
        let mut me = Self {
            prefix: format!("sc{pid}"),
            net,
            nodes,
            namespaces: Vec::new(),
            blackholes: Vec::new(),
        };
        me.build().context("creating the nodes' network namespaces")?;
        Ok(me)
    }

    fn switch(&self) -> String {
        format!("{}-sw", self.prefix)
    }

    /// The namespace of `node`.
    pub fn namespace(&self, node: NodeNo) -> String {
        format!("{}-n{}", self.prefix, node.0)
    }

    /// The address of `node`.
    pub fn host(&self, node: NodeNo) -> String {
        format!("10.213.{}.{}", self.net, node.0)
    }

    fn add_namespace(&mut self, name: &str) -> Result<()> {
        ip(&["netns", "add", name])?;
        self.namespaces.push(name.to_string());
        ip(&["-n", name, "link", "set", "lo", "up"])
    }

    fn build(&mut self) -> Result<()> {
        let sw = self.switch();
        self.add_namespace(&sw)?;
        ip(&["-n", &sw, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &sw, "link", "set", "br0", "up"])?;
        // The harness's own link: created in its namespace, its peer in the switch.
        let host_link = format!("{}-h", self.prefix);
        ip(&[
            "link", "add", &host_link, "type", "veth", "peer", "name", "h0", "netns", &sw,
        ])?;
        let host_addr = format!("10.213.{}.254/24", self.net);
        ip(&["addr", "add", &host_addr, "dev", &host_link])?;
        ip(&["link", "set", &host_link, "up"])?;
        ip(&["-n", &sw, "link", "set", "h0", "master", "br0"])?;
        ip(&["-n", &sw, "link", "set", "h0", "up"])?;
        for n in 1..=self.nodes {
            let ns = self.namespace(NodeNo(n));
            self.add_namespace(&ns)?;
            let port = format!("p{n}");
            ip(&[
                "-n", &ns, "link", "add", "eth0", "type", "veth", "peer", "name", &port, "netns", &sw,
            ])?;
            let addr = format!("{}/24", self.host(NodeNo(n)));
            ip(&["-n", &ns, "addr", "add", &addr, "dev", "eth0"])?;
            ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
            ip(&["-n", &sw, "link", "set", &port, "master", "br0"])?;
            ip(&["-n", &sw, "link", "set", &port, "up"])?;
        }
        Ok(())
    }

    /// Writes `dir/strand-in-netns`, which runs `strand` in `node`'s namespace, and returns it.
    pub fn wrapper(&self, node: NodeNo, strand: &Path, dir: &Path) -> Result<PathBuf> {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let path = dir.join("strand-in-netns");
        let strand = fs::canonicalize(strand).with_context(|| format!("resolving {}", strand.display()))?;
        let script = format!(
            "#!/bin/sh\nexec ip netns exec '{}' '{}' \"$@\"\n",
            self.namespace(node),
            strand.display()
        );
        fs::write(&path, script).with_context(|| format!("writing {}", path.display()))?;
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755))?;
        Ok(path)
    }

    /// Cuts `node` off from every other node, both ways (the harness still reaches it).
    pub fn isolate(&mut self, node: NodeNo) -> Result<()> {
        for other in (1..=self.nodes).map(NodeNo).filter(|o| *o != node) {
            for (from, to) in [(node, other), (other, node)] {
                let (ns, dest) = (self.namespace(from), format!("{}/32", self.host(to)));
                ip(&["-n", &ns, "route", "add", "blackhole", &dest])?;
                self.blackholes.push((ns, dest));
            }
        }
        Ok(())
    }

    /// Removes every isolation.
    pub fn heal(&mut self) -> Result<()> {
        for (ns, dest) in std::mem::take(&mut self.blackholes) {
            ip(&["-n", &ns, "route", "del", "blackhole", &dest])?;
        }
        Ok(())
    }
}

impl Drop for Net {
    /// Deleting a namespace deletes its links, and with them their peers (the harness's link
    /// too, whose peer is in the switch).
    fn drop(&mut self) {
        for ns in self.namespaces.drain(..).rev() {
            let _ = ip(&["netns", "del", &ns]);
        }
    }
}
