//! The broker under test: a `strand` process spawned on ephemeral ports with its own data
//! directory, or an external broker named by `STRAND_TEST_BOOTSTRAP` (see the crate docs).

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub use strand_tools::broker::{ReadyFile, ReadyListener};

use crate::metrics::http_get;

/// The repository root (the Cargo workspace root).
pub fn repo_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

/// `STRAND_TEST_BOOTSTRAP`, when the suite is pointed at an external broker.
pub fn external_bootstrap() -> Option<String> {
    std::env::var("STRAND_TEST_BOOTSTRAP")
        .ok()
        .filter(|s| !s.trim().is_empty())
}

fn cargo_target_dir(root: &Path) -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => {
            let dir = PathBuf::from(dir);
            if dir.is_absolute() {
                dir
            } else {
                root.join(dir)
            }
        }
        None => root.join("target"),
    }
}

/// The `strand` binary: `$STRAND_BIN`, or built once per test process in release mode.
///
/// Panics (failing the test) when the binary cannot be found or built.
pub fn broker_binary() -> PathBuf {
    static BIN: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let bin = BIN.get_or_init(|| {
        if let Some(bin) = std::env::var_os("STRAND_BIN") {
            let bin = PathBuf::from(bin);
            return if bin.is_file() {
                Ok(bin)
            } else {
                Err(format!("STRAND_BIN={} is not a file", bin.display()))
            };
        }
        let root = repo_root();
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| OsString::from("cargo"));
        eprintln!("[harness] building the broker: cargo build --release -p strand-broker --bin strand");
        let status = Command::new(cargo)
            .args(["build", "--release", "-p", "strand-broker", "--bin", "strand"])
            .current_dir(&root)
            .stdin(Stdio::null())
            .status()
            .map_err(|e| format!("cannot run cargo: {e}"))?;
        if !status.success() {
            return Err(format!(
                "`cargo build --release -p strand-broker --bin strand` failed: {status}"
            ));
        }
        let bin = cargo_target_dir(&root).join("release").join("strand");
        if bin.is_file() {
            Ok(bin)
        } else {
            Err(format!(
                "cargo build succeeded but {} does not exist",
                bin.display()
            ))
        }
    });
    match bin {
        Ok(bin) => bin.clone(),
        Err(e) => panic!("no strand binary: {e}"),
    }
}

/// Configures and starts a [`Broker`].
///
/// Defaults: Kafka listener `PLAINTEXT://127.0.0.1:0` (advertised the same, so clients see the bound
/// port), admin listener `127.0.0.1:0`, `node.id=1`, `strand.shards=2` (to exercise cross-shard
/// routing), `log.dirs=<tempdir>/data`, everything else at the broker's defaults (Kafka's).
/// These go into a `server.properties` file; [`BrokerBuilder::config`] entries are passed as
/// `--override KEY=VALUE`, so both configuration paths are used.
///
/// A test may advertise another address than the bound one, e.g. a fault-injecting proxy's:
/// `.config("advertised.listeners", "PLAINTEXT://127.0.0.1:<proxy port>")`. [`Broker::bootstrap`]
/// still returns the *bound* address (from the ready file), so the test can reach the broker
/// directly, and [`Broker::restart`] binds the same port again but keeps the configured advertised
/// address.
#[derive(Clone, Debug)]
pub struct BrokerBuilder {
    configs: Vec<(String, String)>,
    env: Vec<(String, String)>,
    shards: u32,
    node_id: i32,
    log_level: String,
    needs_spawned: Option<String>,
    data_dir_limit_bytes: Option<u64>,
}

impl Default for BrokerBuilder {
    fn default() -> Self {
        BrokerBuilder {
            configs: Vec::new(),
            env: Vec::new(),
            shards: 2,
            node_id: 1,
            log_level: std::env::var("STRAND_TEST_LOG_LEVEL").unwrap_or_else(|_| "info".to_string()),
            needs_spawned: None,
            data_dir_limit_bytes: None,
        }
    }
}

impl BrokerBuilder {
    /// A broker configuration key (Kafka's name), passed as `--override KEY=VALUE`.
    ///
    /// Against an external broker these are not applied; [`Broker::config_value`] then returns
    /// `None`. A test whose checks depend on the value must also call [`Self::needs_spawned`],
    /// or fall back to Kafka's default when `config_value` is `None`.
    pub fn config(mut self, key: &str, value: impl ToString) -> Self {
        self.configs.push((key.to_string(), value.to_string()));
        self
    }

    /// An environment variable for the broker process (e.g. `KAFKA_NUM_PARTITIONS`). The harness
    /// removes every inherited `KAFKA_*` and `STRAND_*` variable, so only these reach the broker.
    pub fn env(mut self, key: &str, value: impl ToString) -> Self {
        self.env.push((key.to_string(), value.to_string()));
        self
    }

    /// Number of thread-per-core shards (`strand.shards`, default 2).
    pub fn shards(mut self, shards: u32) -> Self {
        self.shards = shards;
        self
    }

    /// `node.id` (default 1).
    pub fn node_id(mut self, node_id: i32) -> Self {
        self.node_id = node_id;
        self
    }

    /// The broker's `--log-level` (default `$STRAND_TEST_LOG_LEVEL` or `info`).
    pub fn log_level(mut self, level: &str) -> Self {
        self.log_level = level.to_string();
        self
    }

    /// Puts the data directory on a file system of `bytes` bytes, so that the broker runs into a
    /// full disk (`ENOSPC`). The broker runs in its own user and mount namespace
    /// (`unshare --user --map-root-user --mount`) with a tmpfs mounted over its data directory;
    /// this needs `unshare` (util-linux) and either root or unprivileged user namespaces. The
    /// data lives only as long as that process: such a broker cannot be restarted with its data.
    pub fn data_dir_limit(mut self, bytes: u64) -> Self {
        self.data_dir_limit_bytes = Some(bytes);
        self.needs_spawned("puts the data directory on a small file system")
    }

    /// A data directory that fills up after a few MiB: [`Self::data_dir_limit`] of 16 MiB, one
    /// shard, journal files of 1 MiB (`strand.journal.segment.bytes`).
    pub fn small_disk(self) -> Self {
        self.data_dir_limit(16 << 20)
            .shards(1)
            .config("strand.journal.segment.bytes", 1 << 20)
    }

    /// Declares that the test needs a broker spawned by the harness (kill, restart, special
    /// configuration, access to the data directory). With `STRAND_TEST_BOOTSTRAP` set, `start`
    /// then fails the test with `reason`.
    pub fn needs_spawned(mut self, reason: &str) -> Self {
        self.needs_spawned = Some(reason.to_string());
        self
    }

    /// Starts the broker (or attaches to `STRAND_TEST_BOOTSTRAP`) and waits until it is ready.
    pub fn start(self) -> Broker {
        if let Some(bootstrap) = external_bootstrap() {
            if let Some(reason) = &self.needs_spawned {
                panic!(
                    "this test needs a broker spawned by the harness ({reason}); it cannot run against \
                     STRAND_TEST_BOOTSTRAP={bootstrap}. Unset STRAND_TEST_BOOTSTRAP to run it."
                );
            }
            return Broker {
                mode: Mode::External { bootstrap },
            };
        }
        let mut spawned = Spawned::new(self);
        spawned.launch(None);
        Broker {
            mode: Mode::Spawned(Box::new(spawned)),
        }
    }

    /// Spawns the broker expecting it to exit on its own (e.g. because of an invalid
    /// configuration) within `timeout`; returns its exit status and its log. Panics if it
    /// becomes ready or keeps running. Needs a spawned broker.
    pub fn start_expecting_exit(self, timeout: Duration) -> (ExitStatus, String) {
        if let Some(bootstrap) = external_bootstrap() {
            panic!(
                "this test needs a broker spawned by the harness (it checks start-up failures); it \
                 cannot run against STRAND_TEST_BOOTSTRAP={bootstrap}"
            );
        }
        let mut spawned = Spawned::new(self);
        let mut child = spawned.spawn_child(None);
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = child.try_wait().expect("try_wait on the broker") {
                return (status, spawned.log_text());
            }
            if spawned.ready_path.exists() {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "the broker became ready although it was expected to refuse to start; log tail:\n{}",
                    spawned.stderr_tail(40)
                );
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "the broker neither exited nor became ready within {timeout:?}; log tail:\n{}",
                    spawned.stderr_tail(40)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A running broker: spawned by the harness or external (`STRAND_TEST_BOOTSTRAP`).
///
/// Dropping it kills a spawned process (SIGKILL) and removes its temporary directory, unless
/// the test is panicking or `STRAND_TEST_KEEP_DIRS=1`.
pub struct Broker {
    mode: Mode,
}

enum Mode {
    External { bootstrap: String },
    Spawned(Box<Spawned>),
}

impl Broker {
    /// A builder with the defaults described on [`BrokerBuilder`].
    pub fn builder() -> BrokerBuilder {
        BrokerBuilder::default()
    }

    /// Starts a broker with the default configuration.
    pub fn start() -> Broker {
        BrokerBuilder::default().start()
    }

    /// Whether this broker was spawned by the harness (as opposed to `STRAND_TEST_BOOTSTRAP`).
    pub fn is_spawned(&self) -> bool {
        matches!(self.mode, Mode::Spawned(_))
    }

    fn spawned(&self, what: &str) -> &Spawned {
        match &self.mode {
            Mode::Spawned(s) => s,
            Mode::External { bootstrap } => panic!(
                "{what} needs a broker spawned by the harness, not STRAND_TEST_BOOTSTRAP={bootstrap} \
                 (declare it with BrokerBuilder::needs_spawned)"
            ),
        }
    }

    fn spawned_mut(&mut self, what: &str) -> &mut Spawned {
        match &mut self.mode {
            Mode::Spawned(s) => s,
            Mode::External { bootstrap } => panic!(
                "{what} needs a broker spawned by the harness, not STRAND_TEST_BOOTSTRAP={bootstrap} \
                 (declare it with BrokerBuilder::needs_spawned)"
            ),
        }
    }

    /// `host:port` of the Kafka listener, for `bootstrap.servers`.
    pub fn bootstrap(&self) -> String {
        match &self.mode {
            Mode::External { bootstrap } => bootstrap.clone(),
            Mode::Spawned(s) => s
                .ready()
                .kafka
                .first()
                .map(|l| l.addr.clone())
                .unwrap_or_else(|| panic!("the broker's ready file lists no Kafka listener")),
        }
    }

    /// The node id the broker was configured with (spawned), or `None` for an external broker.
    pub fn node_id(&self) -> Option<i32> {
        match &self.mode {
            Mode::External { .. } => None,
            Mode::Spawned(s) => Some(s.builder.node_id),
        }
    }

    /// The value a test configured with [`BrokerBuilder::config`] (last one wins), or `None` for
    /// an external broker or a key that was not set.
    pub fn config_value(&self, key: &str) -> Option<String> {
        match &self.mode {
            Mode::External { .. } => None,
            Mode::Spawned(s) => s
                .builder
                .configs
                .iter()
                .rev()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.clone()),
        }
    }

    /// The ready file of the current process instance.
    pub fn ready(&self) -> ReadyFile {
        self.spawned("reading the ready file").ready().clone()
    }

    /// `log.dirs` of the spawned broker.
    pub fn data_dir(&self) -> PathBuf {
        self.spawned("data_dir()").data_dir.clone()
    }

    /// The data directory as the running broker sees it, through `/proc/<pid>/root`: with
    /// [`BrokerBuilder::data_dir_limit`], on the small file system mounted over it in the
    /// broker's own mount namespace, where a test can take space and give it back.
    pub fn data_dir_seen_by_broker(&self) -> PathBuf {
        let pid = self
            .pid()
            .unwrap_or_else(|| panic!("data_dir_seen_by_broker(): the broker is not running"));
        let dir = self.data_dir();
        let relative = dir.strip_prefix("/").unwrap_or(&dir);
        PathBuf::from(format!("/proc/{pid}/root")).join(relative)
    }

    /// The directory of one partition's log: `<log.dirs>/<topic>-<partition>` (Kafka's layout).
    pub fn partition_dir(&self, topic: &str, partition: i32) -> PathBuf {
        self.data_dir().join(format!("{topic}-{partition}"))
    }

    /// Process id of the current broker process, if running.
    pub fn pid(&self) -> Option<u32> {
        self.spawned("pid()").child.as_ref().map(|c| c.id())
    }

    /// Kills the broker with SIGKILL and waits for it. Panics if it already exited on its own.
    pub fn kill9(&mut self) {
        self.spawned_mut("kill9()").kill9();
    }

    /// Sends SIGTERM and waits up to `timeout` for a graceful exit; returns the exit status.
    /// Panics (after a SIGKILL) if the broker does not exit in time.
    pub fn terminate(&mut self, timeout: Duration) -> ExitStatus {
        self.spawned_mut("terminate()").terminate(timeout)
    }

    /// Starts the broker again on the same data directory and the same ports, after
    /// [`Self::kill9`] or [`Self::terminate`]. Removes the old ready file first and waits for the
    /// new one.
    pub fn restart(&mut self) {
        self.spawned_mut("restart()").restart();
    }

    /// Sets a configuration key (as [`BrokerBuilder::config`] does) for the next
    /// [`Self::restart`]: an operator changing `server.properties` between two runs. Replaces the
    /// earlier value of that key.
    pub fn set_config_for_restart(&mut self, key: &str, value: impl ToString) {
        let s = self.spawned_mut("set_config_for_restart()");
        s.builder.configs.retain(|(k, _)| k != key);
        s.builder.configs.push((key.to_string(), value.to_string()));
    }

    /// `host:port` of the HTTP queue API (from the ready file).
    pub fn http_addr(&self) -> String {
        self.spawned("http_addr()")
            .ready()
            .http
            .clone()
            .unwrap_or_else(|| panic!("the ready file has no http address"))
    }

    /// The body of `GET /metrics` on the admin listener (Prometheus text format). Panics unless
    /// the answer is `200`.
    pub fn metrics(&self) -> String {
        let admin = self
            .spawned("metrics()")
            .ready()
            .admin
            .clone()
            .unwrap_or_else(|| panic!("the ready file has no admin address"));
        http_get(&admin, "/metrics").unwrap_or_else(|e| panic!("GET http://{admin}/metrics: {e}"))
    }

    /// The last `lines` lines of the current process instance's log (stderr and stdout).
    pub fn stderr_tail(&self, lines: usize) -> String {
        match &self.mode {
            Mode::External { .. } => "(external broker: no log)".to_string(),
            Mode::Spawned(s) => s.stderr_tail(lines),
        }
    }

    /// Fails the test if the current process instance logged a panic (an external broker's log
    /// cannot be read, so there it checks nothing).
    pub fn assert_never_panicked(&self, context: &str) {
        if let Mode::Spawned(s) = &self.mode {
            assert!(
                !s.log_text().contains("panicked"),
                "{context}: the broker panicked:\n{}",
                s.stderr_tail(60)
            );
        }
    }

    /// The complete log of the current process instance.
    pub fn log_text(&self) -> String {
        self.spawned("log_text()").log_text()
    }

    /// Path of the current process instance's log file.
    pub fn log_path(&self) -> PathBuf {
        self.spawned("log_path()").log_path()
    }

    /// Panics with the log tail if the spawned process has exited (no-op for an external broker).
    pub fn assert_running(&mut self) {
        if let Mode::Spawned(s) = &mut self.mode {
            s.assert_running();
        }
    }
}

struct Spawned {
    builder: BrokerBuilder,
    bin: PathBuf,
    dir: Option<tempfile::TempDir>,
    dir_path: PathBuf,
    data_dir: PathBuf,
    config_path: PathBuf,
    ready_path: PathBuf,
    child: Option<Child>,
    /// Kills the broker if this test process dies without dropping it (see [`watchdog`]).
    watchdog: Option<Child>,
    generation: u32,
    ready: Option<ReadyFile>,
}

/// Starts a tiny shell loop that SIGKILLs `broker_pid` once this test process is gone. A test
/// process killed by a signal (a test runner's timeout, Ctrl-C) runs no destructors, and the
/// broker would otherwise outlive it and keep eating the machine. Ends by itself when the broker
/// exits.
fn watchdog(broker_pid: u32) -> Option<Child> {
    let me = std::process::id();
    let script = format!(
        "while kill -0 {me} 2>/dev/null && kill -0 {broker_pid} 2>/dev/null; do sleep 0.5; done; \
         kill -0 {me} 2>/dev/null || kill -9 {broker_pid} 2>/dev/null"
    );
    Command::new("sh")
        .args(["-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()
}

impl Spawned {
    fn new(builder: BrokerBuilder) -> Spawned {
        let bin = broker_binary();
        let dir = tempfile::Builder::new()
            .prefix("strand-test-")
            .tempdir()
            .expect("create a temp dir");
        let dir_path = dir.path().to_path_buf();
        let data_dir = dir_path.join("data");
        fs::create_dir_all(&data_dir).expect("create the data dir");
        let config_path = dir_path.join("server.properties");
        let properties = format!(
            "# written by strand-compat-tests\n\
             listeners=PLAINTEXT://127.0.0.1:0\n\
             advertised.listeners=PLAINTEXT://127.0.0.1:0\n\
             log.dirs={}\n\
             node.id={}\n\
             strand.admin.listener=127.0.0.1:0\n\
             strand.http.listener=127.0.0.1:0\n\
             strand.shards={}\n",
            data_dir.display(),
            builder.node_id,
            builder.shards
        );
        fs::write(&config_path, properties).expect("write server.properties");
        let ready_path = dir_path.join("ready.json");
        Spawned {
            builder,
            bin,
            dir: Some(dir),
            dir_path,
            data_dir,
            config_path,
            ready_path,
            child: None,
            watchdog: None,
            generation: 0,
            ready: None,
        }
    }

    fn log_path(&self) -> PathBuf {
        self.dir_path.join(format!("broker-{}.log", self.generation))
    }

    fn ready(&self) -> &ReadyFile {
        self.ready
            .as_ref()
            .unwrap_or_else(|| panic!("the broker is not running (no ready file)"))
    }

    /// Spawns the process; `pinned` = (kafka addr, admin addr, http addr) to bind again on restart.
    fn spawn_child(&mut self, pinned: Option<(String, Option<String>, Option<String>)>) -> Child {
        let log = fs::File::create(self.log_path()).expect("create the broker log file");
        let log2 = log.try_clone().expect("clone the log file handle");
        let mut cmd = match self.builder.data_dir_limit_bytes {
            None => Command::new(&self.bin),
            Some(bytes) => {
                // A small tmpfs over the data directory, in a private mount namespace; `exec` keeps
                // the broker's pid the one the harness waits for and kills.
                let mut c = Command::new("unshare");
                c.args(["--user", "--map-root-user", "--mount", "sh", "-c"])
                    .arg(format!(
                        "mount -t tmpfs -o size={bytes} strand-test-tmpfs \"$1\" || {{ echo 'cannot mount a \
                         tmpfs in a user namespace: the disk-full test needs root or unprivileged user \
                         namespaces (sysctl kernel.unprivileged_userns_clone=1)' >&2; exit 97; }}; \
                         shift; exec \"$@\""
                    ))
                    .arg("strand-in-namespace")
                    .arg(&self.data_dir)
                    .arg(&self.bin);
                c
            }
        };
        cmd.arg(&self.config_path);
        for (k, v) in &self.builder.configs {
            cmd.arg("--override").arg(format!("{k}={v}"));
        }
        if let Some((kafka, admin, http)) = pinned {
            if let Some(http) = http {
                cmd.arg("--override").arg(format!("strand.http.listener={http}"));
            }
            cmd.arg("--override")
                .arg(format!("listeners=PLAINTEXT://{kafka}"));
            // A test that configured its own advertised address (e.g. a proxy's) keeps it.
            if !self
                .builder
                .configs
                .iter()
                .any(|(k, _)| k == "advertised.listeners")
            {
                cmd.arg("--override")
                    .arg(format!("advertised.listeners=PLAINTEXT://{kafka}"));
            }
            if let Some(admin) = admin {
                cmd.arg("--override")
                    .arg(format!("strand.admin.listener={admin}"));
            }
        }
        cmd.arg("--log-level").arg(&self.builder.log_level);
        cmd.arg("--ready-file").arg(&self.ready_path);
        for (k, _) in std::env::vars_os() {
            let name = k.to_string_lossy();
            // The broker reads KAFKA_* and STRAND_* variables as configuration; the test
            // process's own (STRAND_BIN, STRAND_PYTHON, ...) must not reach it.
            if name.starts_with("KAFKA_") || name.starts_with("STRAND_") {
                cmd.env_remove(k);
            }
        }
        cmd.env_remove("LD_LIBRARY_PATH");
        cmd.env("RUST_BACKTRACE", "1");
        for (k, v) in &self.builder.env {
            cmd.env(k, v);
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::from(log2))
            .stderr(Stdio::from(log));
        cmd.spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", self.bin.display()))
    }

    fn launch(&mut self, pinned: Option<(String, Option<String>, Option<String>)>) {
        match fs::remove_file(&self.ready_path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => panic!("cannot remove the old ready file: {e}"),
        }
        self.ready = None;
        let child = self.spawn_child(pinned);
        let pid = child.id();
        self.child = Some(child);
        self.stop_watchdog();
        self.watchdog = watchdog(pid);
        let timeout = Duration::from_secs(
            std::env::var("STRAND_TEST_START_TIMEOUT_SECS")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(60),
        );
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Some(status) = child.try_wait().expect("try_wait on the broker") {
                    self.child = None;
                    panic!(
                        "the broker exited with {status} before it was ready; log tail ({}):\n{}",
                        self.log_path().display(),
                        self.stderr_tail(60)
                    );
                }
            }
            if let Ok(text) = fs::read_to_string(&self.ready_path) {
                match serde_json::from_str::<ReadyFile>(&text) {
                    Ok(ready) => {
                        assert_eq!(ready.pid, pid, "the ready file names another process: {text}");
                        assert!(
                            !ready.kafka.is_empty(),
                            "the ready file lists no Kafka listener: {text}"
                        );
                        self.ready = Some(ready);
                        return;
                    }
                    Err(e) => {
                        // Written atomically (rename), so a parse error is the broker's fault.
                        panic!("the ready file is not valid: {e}: {text:?}");
                    }
                }
            }
            if Instant::now() >= deadline {
                self.kill_quietly();
                panic!(
                    "the broker did not write its ready file within {timeout:?}; log tail ({}):\n{}",
                    self.log_path().display(),
                    self.stderr_tail(60)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn assert_running(&mut self) {
        let Some(child) = self.child.as_mut() else {
            panic!("the broker is not running");
        };
        if let Some(status) = child.try_wait().expect("try_wait on the broker") {
            self.child = None;
            panic!(
                "the broker exited unexpectedly with {status}; log tail:\n{}",
                self.stderr_tail(60)
            );
        }
    }

    fn kill9(&mut self) {
        self.assert_running();
        if let Some(mut child) = self.child.take() {
            child.kill().expect("SIGKILL the broker");
            child.wait().expect("wait for the killed broker");
        }
    }

    fn stop_watchdog(&mut self) {
        if let Some(mut w) = self.watchdog.take() {
            let _ = w.kill();
            let _ = w.wait();
        }
    }

    fn kill_quietly(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn terminate(&mut self, timeout: Duration) -> ExitStatus {
        self.assert_running();
        let Some(mut child) = self.child.take() else {
            panic!("the broker is not running");
        };
        let status = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .expect("run kill -TERM");
        assert!(status.success(), "kill -TERM {} failed", child.id());
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = child.try_wait().expect("try_wait on the broker") {
                return status;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "the broker did not exit within {timeout:?} after SIGTERM; log tail:\n{}",
                    self.stderr_tail(60)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn restart(&mut self) {
        if let Some(child) = self.child.as_mut() {
            if child.try_wait().expect("try_wait on the broker").is_none() {
                panic!("restart() while the broker is still running: call kill9() or terminate() first");
            }
            self.child = None;
        }
        let ready = self.ready().clone();
        let kafka = ready.kafka.first().map(|l| l.addr.clone()).unwrap_or_default();
        self.generation += 1;
        self.launch(Some((kafka, ready.admin, ready.http)));
    }

    fn log_text(&self) -> String {
        let bytes = fs::read(self.log_path()).unwrap_or_default();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    fn stderr_tail(&self, lines: usize) -> String {
        let text = self.log_text();
        let all: Vec<&str> = text.lines().collect();
        let start = all.len().saturating_sub(lines);
        all[start..].join("\n")
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        self.kill_quietly();
        self.stop_watchdog();
        let keep = std::thread::panicking()
            || std::env::var("STRAND_TEST_KEEP_DIRS")
                .map(|v| v == "1")
                .unwrap_or(false);
        if std::thread::panicking() {
            eprintln!(
                "[harness] broker log tail ({}):\n{}\n[harness] end of broker log",
                self.log_path().display(),
                self.stderr_tail(40)
            );
        }
        if keep {
            if let Some(dir) = self.dir.take() {
                let path = dir.keep();
                eprintln!("[harness] kept the broker's directory: {}", path.display());
            }
        }
    }
}
