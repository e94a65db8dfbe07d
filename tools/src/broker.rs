//! Brokers the benchmark starts itself: Strand (through its ready file) or any command that
//! listens on a port it is given (a peer such as Tansu). Also reads a process's memory and open
//! files, and this process's open-file limit (which a spawned broker inherits).

use std::fs::{self, File};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
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

/// Open file descriptors of `pid` (entries of /proc/<pid>/fd).
pub fn open_files_of(pid: u32) -> Result<usize> {
    let path = format!("/proc/{pid}/fd");
    let entries = fs::read_dir(&path).with_context(|| format!("listing {path}"))?;
    Ok(entries.count())
}

/// The open-file limit (`RLIMIT_NOFILE`, what `ulimit -n` sets) of this process, which every
/// broker it spawns inherits.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct OpenFilesLimit {
    /// The soft limit, in effect; `None` for unlimited.
    pub soft: Option<u64>,
    /// The hard limit, up to which `ulimit -n` may raise the soft one without privileges.
    pub hard: Option<u64>,
}

/// Reads this process's open-file limit from /proc/self/limits.
pub fn open_files_limit() -> Result<OpenFilesLimit> {
    let text = fs::read_to_string("/proc/self/limits").context("reading /proc/self/limits")?;
    parse_open_files_limit(&text).context("no `Max open files` line in /proc/self/limits")
}

fn parse_open_files_limit(limits: &str) -> Option<OpenFilesLimit> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    let mut values = line["Max open files".len()..].split_whitespace();
    let value = |v: Option<&str>| -> Option<Option<u64>> {
        match v? {
            "unlimited" => Some(None),
            n => n.parse().ok().map(Some),
        }
    };
    Some(OpenFilesLimit {
        soft: value(values.next())?,
        hard: value(values.next())?,
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
    /// When the process was spawned.
    pub spawned_at: Instant,
    /// From spawn until the broker said it was ready (Strand: its ready file was seen, polled every
    /// 20 ms; a command: its port accepted a connection).
    pub ready_after: Duration,
}

/// How a broker process ended when it was stopped.
#[derive(Debug, Clone)]
pub struct Stopped {
    /// In words, for reports.
    pub how: String,
    /// True if it exited by itself after SIGTERM (not killed after the grace period).
    pub by_sigterm: bool,
    /// Its exit status.
    pub status: ExitStatus,
    /// From the signal until the process was reaped.
    pub elapsed: Duration,
}

impl BrokerProcess {
    /// Starts `strand` with a fresh data directory under `dir` on ephemeral ports and waits for
    /// its ready file.
    pub fn spawn_strand(binary: &Path, dir: &Path, extra_args: &[String], timeout: Duration) -> Result<Self> {
        Self::spawn_strand_at(binary, &dir.join("log"), dir, extra_args, timeout)
    }

    /// Starts `strand` on the data directory `log_dirs` (kept as it is: a restart) on ephemeral
    /// ports, with its ready file and `broker.log` in `dir`, and waits for its ready file. A
    /// ready file left in `dir` by an earlier start is removed first. `extra_args` come last, so
    /// an `--override` there wins (e.g. a fixed `listeners=` port).
    pub fn spawn_strand_at(
        binary: &Path,
        log_dirs: &Path,
        dir: &Path,
        extra_args: &[String],
        timeout: Duration,
    ) -> Result<Self> {
        let mut args = vec![
            "--override".to_string(),
            "listeners=PLAINTEXT://127.0.0.1:0".into(),
            "--override".into(),
            "strand.admin.listener=127.0.0.1:0".into(),
            "--override".into(),
            "strand.http.listener=127.0.0.1:0".into(),
        ];
        args.extend(extra_args.iter().cloned());
        Self::spawn_strand_env(binary, log_dirs, dir, &[], &args, timeout)
    }

    /// Starts `strand` on the data directory `log_dirs` with the environment variables `env`
    /// added to this process's (how a Kafka container is configured: `KAFKA_LISTENERS`, …) and
    /// `args` after `--override log.dirs=…` (overrides there beat the environment), its ready
    /// file and `broker.log` in `dir`, and waits for its ready file.
    pub fn spawn_strand_env(
        binary: &Path,
        log_dirs: &Path,
        dir: &Path,
        env: &[(String, String)],
        args: &[String],
        timeout: Duration,
    ) -> Result<Self> {
        fs::create_dir_all(log_dirs).with_context(|| format!("creating {}", log_dirs.display()))?;
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let ready = dir.join("ready.json");
        match fs::remove_file(&ready) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("removing the old {}", ready.display())),
        }
        let mut command = vec![
            binary.display().to_string(),
            "--override".into(),
            format!("log.dirs={}", log_dirs.display()),
            "--ready-file".into(),
            ready.display().to_string(),
        ];
        command.extend(args.iter().cloned());
        let log_path = dir.join("broker.log");
        let mut child = start_with_env(&command, env, &log_path)?;
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
                        spawned_at: started,
                        ready_after: started.elapsed(),
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
            spawned_at: started,
            ready_after: started.elapsed(),
        })
    }

    /// Resident memory now.
    pub fn memory(&self) -> Result<Memory> {
        memory_of(self.pid)
    }

    /// SIGTERM, then SIGKILL after `grace`. Returns how the process ended.
    pub fn stop(self, grace: Duration) -> Result<String> {
        self.terminate(grace).map(|s| s.how)
    }

    /// SIGTERM, then SIGKILL after `grace`; says how the process ended and how long it took.
    pub fn terminate(mut self, grace: Duration) -> Result<Stopped> {
        let signalled = Instant::now();
        if let Some(exited) = self.exited_already()? {
            return Ok(exited);
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
                return Ok(Stopped {
                    how: format!("stopped by SIGTERM: {status}"),
                    by_sigterm: true,
                    status,
                    elapsed: signalled.elapsed(),
                });
            }
            thread::sleep(Duration::from_millis(5));
        }
        self.kill_and_reap(signalled, |status| {
            format!("killed after {grace:?} without exiting on SIGTERM: {status}")
        })
    }

    /// SIGKILL (no chance to flush or checkpoint: a crash), then reaps the process.
    pub fn kill(mut self) -> Result<Stopped> {
        let signalled = Instant::now();
        if let Some(exited) = self.exited_already()? {
            return Ok(exited);
        }
        self.kill_and_reap(signalled, |status| format!("killed by SIGKILL: {status}"))
    }

    /// How the process ended, if it has already (there is nothing to stop then).
    fn exited_already(&mut self) -> Result<Option<Stopped>> {
        let status = self.child.try_wait().context("polling the broker process")?;
        Ok(status.map(|status| Stopped {
            how: format!("had already exited: {status}"),
            by_sigterm: false,
            status,
            elapsed: Duration::ZERO,
        }))
    }

    /// SIGKILL, then waits for the process; `how` words its exit status.
    fn kill_and_reap(
        &mut self,
        signalled: Instant,
        how: impl FnOnce(ExitStatus) -> String,
    ) -> Result<Stopped> {
        self.child.kill().context("killing the broker")?;
        let status = self.child.wait().context("waiting for the broker")?;
        Ok(Stopped {
            how: how(status),
            by_sigterm: false,
            status,
            elapsed: signalled.elapsed(),
        })
    }

    /// Open file descriptors now.
    pub fn open_files(&self) -> Result<usize> {
        open_files_of(self.pid)
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
    start_with_env(command, &[], log_path)
}

/// Starts `command` with `env` added, its output to `log_path`: truncated when there is no
/// environment to add (what the benchmarks expect: one log per start), appended to otherwise
/// (a node restarted on its directory keeps the logs of its earlier starts).
fn start_with_env(command: &[String], env: &[(String, String)], log_path: &Path) -> Result<Child> {
    let (program, args) = command
        .split_first()
        .ok_or_else(|| anyhow!("empty broker command"))?;
    let log = if env.is_empty() {
        File::create(log_path)
    } else {
        fs::OpenOptions::new().create(true).append(true).open(log_path)
    }
    .with_context(|| format!("opening {}", log_path.display()))?;
    let log_err = log.try_clone().context("duplicating the broker log handle")?;
    Command::new(program)
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
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
    fn open_files_limit_parses() {
        let text = "Limit                     Soft Limit           Hard Limit           Units     \n\
                    Max processes             95893                95893                processes \n\
                    Max open files            20000                524288               files     \n";
        assert_eq!(
            parse_open_files_limit(text),
            Some(OpenFilesLimit {
                soft: Some(20_000),
                hard: Some(524_288)
            })
        );
        let unlimited = "Max open files            unlimited            unlimited            files\n";
        assert_eq!(
            parse_open_files_limit(unlimited),
            Some(OpenFilesLimit {
                soft: None,
                hard: None
            })
        );
        assert_eq!(parse_open_files_limit("Max processes 1 1 processes\n"), None);
        assert!(open_files_limit().is_ok());
        assert!(open_files_of(std::process::id()).unwrap() >= 3);
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

        let b = BrokerProcess::spawn_command(template, dir.path(), Duration::from_secs(20)).unwrap();
        assert!(b.ready_after > Duration::ZERO && b.open_files().unwrap() >= 3);
        let killed = b.kill().unwrap();
        assert!(!killed.by_sigterm && !killed.status.success(), "{}", killed.how);
        assert!(killed.how.contains("SIGKILL"), "{}", killed.how);
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
