//! Brokers the benchmark starts itself: Strand (through its ready file) or any command that
//! listens on a port it is given (a peer such as Tansu). Also reads a process's memory.

use std::fs::{self, File};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::host::proc_kib_field;

/// The JSON Strand writes to `--ready-file` once it is serving.
#[derive(Debug, Clone, Deserialize)]
pub struct ReadyFile {
    pub pid: u32,
    pub kafka: Vec<ReadyListener>,
    #[serde(default)]
    pub admin: Option<String>,
    /// The HTTP queue API.
    #[serde(default)]
    pub http: Option<String>,
}

/// One Kafka listener in the ready file.
#[derive(Debug, Clone, Deserialize)]
pub struct ReadyListener {
    pub name: String,
    pub addr: String,
}

impl ReadyFile {
    /// The PLAINTEXT listener's address (or the first listener's if none is named so).
    pub fn bootstrap(&self) -> Option<&str> {
        self.kafka
            .iter()
            .find(|l| l.name.eq_ignore_ascii_case("PLAINTEXT"))
            .or_else(|| self.kafka.first())
            .map(|l| l.addr.as_str())
    }
}

/// Resident memory of a process, from /proc/<pid>/status.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct Memory {
    /// VmRSS: resident now.
    pub rss_kib: u64,
    /// VmHWM: the peak resident size so far.
    pub hwm_kib: u64,
}

/// Reads VmRSS and VmHWM of `pid`.
pub fn memory_of(pid: u32) -> Result<Memory> {
    let path = format!("/proc/{pid}/status");
    let status = fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    let field = |name: &str| proc_kib_field(&status, name).with_context(|| format!("no {name} in {path}"));
    Ok(Memory {
        rss_kib: field("VmRSS:")?,
        hwm_kib: field("VmHWM:")?,
    })
}

/// Runs `<program> --version` and returns its first non-empty output line.
pub fn binary_version(program: &Path) -> Result<String> {
    let out = Command::new(program)
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {} --version", program.display()))?;
    let text = if out.stdout.iter().any(|b| !b.is_ascii_whitespace()) {
        out.stdout
    } else {
        out.stderr
    };
    let text = String::from_utf8_lossy(&text);
    let line = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or_default()
        .to_string();
    if !out.status.success() || line.is_empty() {
        bail!("{} --version failed ({}): {line}", program.display(), out.status);
    }
    Ok(line)
}

/// A broker process this benchmark started; killed when dropped.
pub struct BrokerProcess {
    child: Child,
    /// The pid whose memory is reported (the broker's own, from the ready file for Strand).
    pub pid: u32,
    /// `host:port` of the Kafka listener.
    pub bootstrap: String,
    /// Strand's admin listener, if the ready file named one.
    pub admin: Option<String>,
    /// Strand's HTTP queue API, if the ready file named one.
    pub http: Option<String>,
    /// Where the broker's stdout and stderr go.
    pub log_path: PathBuf,
    /// The command line, for the report.
    pub command: Vec<String>,
}

impl BrokerProcess {
    /// Starts `strand` with a fresh data directory under `dir` on ephemeral ports and waits for
    /// its ready file.
    pub fn spawn_strand(binary: &Path, dir: &Path, extra_args: &[String], timeout: Duration) -> Result<Self> {
        let log_dirs = dir.join("log");
        fs::create_dir_all(&log_dirs).with_context(|| format!("creating {}", log_dirs.display()))?;
        let ready = dir.join("ready.json");
        let mut command = vec![
            binary.display().to_string(),
            "--override".into(),
            format!("log.dirs={}", log_dirs.display()),
            "--override".into(),
            "listeners=PLAINTEXT://127.0.0.1:0".into(),
            "--override".into(),
            "strand.admin.listener=127.0.0.1:0".into(),
            "--override".into(),
            "strand.http.listener=127.0.0.1:0".into(),
            "--ready-file".into(),
            ready.display().to_string(),
        ];
        command.extend(extra_args.iter().cloned());
        let log_path = dir.join("broker.log");
        let mut child = start(&command, &log_path)?;
        let started = Instant::now();
        loop {
            if let Some(status) = child.try_wait().context("polling the broker process")? {
                bail!(
                    "{} exited during start-up ({status}){}",
                    command[0],
                    log_tail(&log_path)
                );
            }
            // The file may be mid-write: retry until it parses.
            if let Ok(text) = fs::read_to_string(&ready) {
                if let Ok(parsed) = serde_json::from_str::<ReadyFile>(&text) {
                    let bootstrap = parsed
                        .bootstrap()
                        .with_context(|| format!("ready file {} lists no Kafka listener", ready.display()))?
                        .to_string();
                    return Ok(Self {
                        child,
                        pid: parsed.pid,
                        bootstrap,
                        admin: parsed.admin.clone(),
                        http: parsed.http.clone(),
                        log_path,
                        command,
                    });
                }
            }
            if started.elapsed() > timeout {
                let _ = child.kill();
                bail!(
                    "{} wrote no valid ready file {} within {timeout:?}{}",
                    command[0],
                    ready.display(),
                    log_tail(&log_path)
                );
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts `sh -c "exec <template>"` with `{port}` replaced by a free 127.0.0.1 port and
    /// `{dir}` by `dir`, then waits until the port accepts connections.
    pub fn spawn_command(template: &str, dir: &Path, timeout: Duration) -> Result<Self> {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let port = free_port()?;
        let expanded = template
            .replace("{port}", &port.to_string())
            .replace("{dir}", &dir.display().to_string());
        let command = vec!["sh".to_string(), "-c".to_string(), format!("exec {expanded}")];
        let log_path = dir.join("broker.log");
        let mut child = start(&command, &log_path)?;
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let started = Instant::now();
        loop {
            if let Some(status) = child.try_wait().context("polling the peer process")? {
                bail!(
                    "peer `{expanded}` exited during start-up ({status}){}",
                    log_tail(&log_path)
                );
            }
            if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                break;
            }
            if started.elapsed() > timeout {
                let _ = child.kill();
                bail!(
                    "peer `{expanded}` did not listen on {addr} within {timeout:?}{}",
                    log_tail(&log_path)
                );
            }
            thread::sleep(Duration::from_millis(20));
        }
        // `exec` makes the shell's pid the broker's.
        let pid = child.id();
        Ok(Self {
            child,
            pid,
            bootstrap: addr.to_string(),
            admin: None,
            http: None,
            log_path,
            command,
        })
    }

    /// Resident memory now.
    pub fn memory(&self) -> Result<Memory> {
        memory_of(self.pid)
    }

    /// SIGTERM, then SIGKILL after `grace`. Returns how the process ended.
    pub fn stop(mut self, grace: Duration) -> Result<String> {
        if let Some(status) = self.child.try_wait().context("polling the broker process")? {
            return Ok(format!("had already exited: {status}"));
        }
        // std offers only SIGKILL; `kill` gives the broker a chance to shut down cleanly.
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let until = Instant::now() + grace;
        while Instant::now() < until {
            if let Some(status) = self.child.try_wait().context("polling the broker process")? {
                return Ok(format!("stopped by SIGTERM: {status}"));
            }
            thread::sleep(Duration::from_millis(20));
        }
        self.child.kill().context("killing the broker")?;
        let status = self.child.wait().context("waiting for the broker")?;
        Ok(format!(
            "killed after {grace:?} without exiting on SIGTERM: {status}"
        ))
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// The last lines of the broker's log, for error messages.
    pub fn log_tail(&self) -> String {
        log_tail(&self.log_path)
    }
}

impl Drop for BrokerProcess {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn start(command: &[String], log_path: &Path) -> Result<Child> {
    let (program, args) = command
        .split_first()
        .ok_or_else(|| anyhow!("empty broker command"))?;
    let log = File::create(log_path).with_context(|| format!("creating {}", log_path.display()))?;
    let log_err = log.try_clone().context("duplicating the broker log handle")?;
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err)
        .spawn()
        .with_context(|| format!("starting {}", command.join(" ")))
}

/// A port that was free a moment ago (bind to :0, read it, release it).
fn free_port() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(listener.local_addr().context("reading the free port")?.port())
}

fn log_tail(path: &Path) -> String {
    let Ok(text) = fs::read_to_string(path) else {
        return String::new();
    };
    let lines: Vec<&str> = text.lines().collect();
    let tail = lines[lines.len().saturating_sub(20)..].join("\n");
    if tail.is_empty() {
        String::new()
    } else {
        format!("\nlast lines of {}:\n{tail}", path.display())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_file_parses_and_picks_plaintext() {
        let r: ReadyFile = serde_json::from_str(
            r#"{"pid":42,"kafka":[{"name":"INTERNAL","addr":"127.0.0.1:1"},
                {"name":"PLAINTEXT","addr":"127.0.0.1:41234"}],"admin":"127.0.0.1:45678"}"#,
        )
        .unwrap();
        assert_eq!(r.pid, 42);
        assert_eq!(r.bootstrap(), Some("127.0.0.1:41234"));
        assert_eq!(r.admin.as_deref(), Some("127.0.0.1:45678"));
    }

    #[test]
    fn own_memory_is_readable() {
        let m = memory_of(std::process::id()).unwrap();
        assert!(m.rss_kib > 0 && m.hwm_kib >= m.rss_kib);
    }

    #[test]
    fn spawn_command_waits_for_the_port_and_stops() {
        let dir = tempfile::tempdir_in(".").unwrap();
        // A Python one-liner that listens on {port}: stands in for a peer broker.
        let template = "python3 -c 'import socket,time; s=socket.socket(); \
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); \
            s.bind((\"127.0.0.1\", {port})); s.listen(); time.sleep(60)'";
        let b = BrokerProcess::spawn_command(template, dir.path(), Duration::from_secs(20)).unwrap();
        assert!(b.bootstrap.starts_with("127.0.0.1:"));
        assert!(b.memory().unwrap().rss_kib > 0);
        let how = b.stop(Duration::from_secs(5)).unwrap();
        assert!(how.contains("SIGTERM"), "{how}");
    }

    #[test]
    fn a_command_that_exits_is_reported_with_its_log() {
        let dir = tempfile::tempdir_in(".").unwrap();
        let err = BrokerProcess::spawn_command(
            "sh -c 'echo boom >&2; exit 3'",
            dir.path(),
            Duration::from_secs(5),
        )
        .err()
        .unwrap();
        let msg = format!("{err:#}");
        assert!(
            msg.contains("exited during start-up") && msg.contains("boom"),
            "{msg}"
        );
    }
}
