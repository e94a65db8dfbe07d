//! Test harness for Strand's compatibility suite: real Kafka clients against the real `strand`
//! binary.
//!
//! # What the harness gives a test
//!
//! * [`Broker`]: a `strand` process on ephemeral ports with its own temporary data directory
//!   (kept across [`Broker::restart`]), started through [`Broker::builder`] / [`BrokerBuilder`].
//!   It can be stopped with [`Broker::kill9`] (SIGKILL) or [`Broker::terminate`] (SIGTERM, graceful)
//!   and restarted on the same data directory and the same ports. Dropping it kills the process.
//!   Each process instance logs (stderr and stdout) to its own file in the test's temporary
//!   directory; when a test panics, the tail of the current log is printed.
//! * [`raw`]: a tiny blocking Kafka client over `std::net::TcpStream` that encodes and decodes with
//!   the `kafka-protocol` crate, and can also send arbitrary bytes and detect a closed connection
//!   (for the bad-input tests). [`admin`] builds the usual admin calls on top of it.
//! * [`clients`]: helpers around `rdkafka` (bundled librdkafka) for producing and consuming with
//!   exact offsets, plus [`clients::python_client`] which drives the `confluent-kafka` and
//!   `kafka-python` scripts in `compat-tests/python/`.
//! * [`group`]: consumer-group members (rdkafka on a thread, or a child process that can be
//!   SIGKILLed: the crate's `strand-group-consumer` binary or a Python script's `group` mode),
//!   all reporting assignments, records and commits as events into one log.
//! * [`tools`]: finding `kcat` and the Python venv; a missing tool fails the test with a message
//!   saying how to install it (the test command `tools/run-tests` installs both).
//! * [`data`]: deterministic test records ([`data::TestRecord`]) and what a consumer read
//!   ([`data::Consumed`]), with a JSON form shared with the Python scripts.
//!
//! # Which broker
//!
//! * By default each test spawns its own broker. The binary is `$STRAND_BIN` if set, otherwise
//!   it is built once per test process with `cargo build --release -p strand-broker --bin strand`
//!   (release, because the round trips move hundreds of thousands of messages).
//! * `STRAND_TEST_BOOTSTRAP=host:port` points the whole suite at an already running broker
//!   (another Kafka-compatible broker, for comparison). Tests that need to kill, restart or
//!   configure the broker, or to look at its files, declare it with
//!   [`BrokerBuilder::needs_spawned`]; they then FAIL with a message saying so (they do not skip).
//!   Every test uses topics with unique names, so the suite can share one external broker.
//!
//! # Other environment variables
//!
//! * `STRAND_PYTHON`: the Python interpreter of the venv with the pinned clients (default
//!   `<repo>/.venv/bin/python`).
//! * `STRAND_TEST_LOG_LEVEL`: the broker's `--log-level` (default `info`).
//! * `STRAND_TEST_START_TIMEOUT_SECS`: how long to wait for the ready file (default 60).
//! * `STRAND_TEST_KEEP_DIRS=1`: keep every broker's temporary directory (data and logs); by
//!   default it is kept only when the test panicked, and its path is printed.
//!
//! # Broker contract the harness relies on
//!
//! `strand [CONFIG_FILE] [--override KEY=VALUE]... [--log-level LEVEL] [--ready-file PATH]`.
//! Once the broker has recovered its data and bound every listener it writes (atomically) the
//! ready file: `{"pid": 1234, "kafka": [{"name": "PLAINTEXT", "addr": "127.0.0.1:41234"}],
//! "admin": "127.0.0.1:45678"}`. The admin HTTP server serves `/metrics`. On restart the harness
//! asks for the same ports again, so the listeners must be bound with `SO_REUSEADDR`.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde::Deserialize;

/// The HTTP queue API client (shared with the queue benchmark).
pub use strand_tools::queue_client;

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

/// A topic name no other test (nor an earlier run against the same external broker) uses.
pub fn unique_topic(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let salt: u32 = rand::random();
    format!("{prefix}-{}-{n}-{salt:08x}", std::process::id())
}

/// An append-only list shared by threads (child-process readers push, the test waits on it):
/// the event logs of consumer-group and share-group members.
pub struct SharedLog<L> {
    inner: std::sync::Arc<(std::sync::Mutex<Vec<L>>, std::sync::Condvar)>,
}

impl<L> Clone for SharedLog<L> {
    fn clone(&self) -> Self {
        SharedLog {
            inner: self.inner.clone(),
        }
    }
}

impl<L> Default for SharedLog<L> {
    fn default() -> Self {
        SharedLog {
            inner: std::sync::Arc::default(),
        }
    }
}

impl<L: Clone> SharedLog<L> {
    /// Appends `item` and wakes the waiters.
    pub fn push(&self, item: L) {
        let (lock, cv) = &*self.inner;
        lock.lock().unwrap_or_else(|e| e.into_inner()).push(item);
        cv.notify_all();
    }

    /// A copy of everything so far.
    pub fn snapshot(&self) -> Vec<L> {
        self.inner.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Waits until `check` (run on the whole list after each push, and at least every 100 ms)
    /// returns `Some`; panics after `timeout` with `what` and `summarize` of the list.
    pub fn wait_for<T>(
        &self,
        timeout: Duration,
        what: &str,
        mut check: impl FnMut(&[L]) -> Option<T>,
        summarize: impl Fn(&[L]) -> String,
    ) -> T {
        let deadline = Instant::now() + timeout;
        let (lock, cv) = &*self.inner;
        let mut v = lock.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(t) = check(&v) {
                return t;
            }
            let now = Instant::now();
            if now >= deadline {
                let summary = summarize(&v);
                drop(v);
                panic!("timed out after {timeout:?} waiting for {what}; members so far:\n{summary}");
            }
            let wait = (deadline - now).min(Duration::from_millis(100));
            v = cv.wait_timeout(v, wait).unwrap_or_else(|e| e.into_inner()).0;
        }
    }
}

/// Polls `check` every 50 ms until it returns `Some`, or panics with `what` after `timeout`.
pub fn wait_for<T>(timeout: Duration, what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
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

/// What the broker writes to `--ready-file` once it serves.
#[derive(Clone, Debug, Deserialize)]
pub struct ReadyFile {
    /// Process id of the broker.
    pub pid: u32,
    /// Bound Kafka listeners, in configuration order.
    pub kafka: Vec<ReadyListener>,
    /// Bound address of the admin HTTP server (`/metrics`), if any.
    #[serde(default)]
    pub admin: Option<String>,
    /// Bound address of the HTTP queue API, if any.
    #[serde(default)]
    pub http: Option<String>,
}

/// One bound Kafka listener in the ready file.
#[derive(Clone, Debug, Deserialize)]
pub struct ReadyListener {
    /// Listener name, e.g. `PLAINTEXT`.
    pub name: String,
    /// Bound address, `host:port`.
    pub addr: String,
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

/// The sum of `series` over all its label sets in a Prometheus text body ([`Broker::metrics`]);
/// 0 if the series is absent.
pub fn metric_sum(text: &str, series: &str) -> f64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(series)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// [`metric_sum`] over the label sets of `series` that contain `label` (`key="value"`).
pub fn metric_sum_where(text: &str, series: &str, label: &str) -> f64 {
    text.lines()
        .filter(|l| l.strip_prefix(series).is_some_and(|rest| rest.starts_with('{')) && l.contains(label))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// A plain HTTP/1.0 GET; returns the body of a `200` answer.
pub fn http_get(addr: &str, path: &str) -> Result<String, String> {
    let mut s = TcpStream::connect(addr).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    write!(
        s,
        "GET {path} HTTP/1.0\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).map_err(|e| format!("read: {e}"))?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("no HTTP header end: {text:?}"))?;
    let status = head.lines().next().unwrap_or_default();
    if status.split_whitespace().nth(1) != Some("200") {
        return Err(format!("status line {status:?}"));
    }
    Ok(body.to_string())
}

/// Finding the external tools the tests drive.
pub mod tools {
    use super::*;

    /// `kcat` on `PATH`; fails the test with install instructions when missing.
    pub fn kcat() -> PathBuf {
        let path = std::env::var_os("PATH").unwrap_or_default();
        for dir in std::env::split_paths(&path) {
            let candidate = dir.join("kcat");
            if candidate.is_file() {
                return candidate;
            }
        }
        panic!("kcat not found: run tools/run-tests, which installs it with `apt-get install -y kcat`");
    }

    /// A `kcat` command (see [`kcat`]) that runs as a user would run it: with the system's
    /// librdkafka. `cargo test` puts the bundled librdkafka of `rdkafka-sys` on
    /// `LD_LIBRARY_PATH`, which Debian's dynamically linked kcat would otherwise pick up.
    pub fn kcat_command() -> Command {
        let mut c = Command::new(kcat());
        c.env_remove("LD_LIBRARY_PATH");
        c
    }

    /// The Python interpreter with `confluent-kafka` and `kafka-python`: `$STRAND_PYTHON` or
    /// `<repo>/.venv/bin/python`. Checked once per process; fails the test with install
    /// instructions when missing.
    pub fn python() -> PathBuf {
        static PY: OnceLock<Result<PathBuf, String>> = OnceLock::new();
        let hint = "run tools/run-tests, which creates .venv with confluent-kafka==2.16.1 and \
                    kafka-python==3.0.12 (pip install -r compat-tests/python/requirements.txt)";
        let py = PY.get_or_init(|| {
            let py = match std::env::var_os("STRAND_PYTHON") {
                Some(p) => PathBuf::from(p),
                None => repo_root().join(".venv").join("bin").join("python"),
            };
            if !py.exists() {
                return Err(format!("Python venv not found at {}: {hint}", py.display()));
            }
            let out = Command::new(&py)
                .args(["-c", "import confluent_kafka, kafka"])
                .output()
                .map_err(|e| format!("cannot run {}: {e}: {hint}", py.display()))?;
            if !out.status.success() {
                return Err(format!(
                    "{} cannot import confluent_kafka and kafka ({}): {hint}",
                    py.display(),
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
            Ok(py)
        });
        match py {
            Ok(p) => p.clone(),
            Err(e) => panic!("{e}"),
        }
    }

    /// Directory of the Python client scripts.
    pub fn python_scripts_dir() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("python")
    }

    /// Runs `cmd` feeding `stdin`, with a time limit; returns (status, stdout, stderr).
    /// Panics if the command cannot be started or exceeds `timeout` (it is killed then).
    pub fn run_with_input(
        mut cmd: Command,
        stdin: &[u8],
        timeout: Duration,
    ) -> (ExitStatus, Vec<u8>, Vec<u8>) {
        let desc = format!("{cmd:?}");
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {desc}: {e}"));
        let mut child_stdin = child.stdin.take().expect("stdin pipe");
        let input = stdin.to_vec();
        let writer = std::thread::spawn(move || {
            let r = child_stdin.write_all(&input);
            drop(child_stdin);
            r
        });
        let mut out_pipe = child.stdout.take().expect("stdout pipe");
        let mut err_pipe = child.stderr.take().expect("stderr pipe");
        let out_reader = std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = out_pipe.read_to_end(&mut v);
            v
        });
        let err_reader = std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = err_pipe.read_to_end(&mut v);
            v
        });
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Some(status) = child.try_wait().expect("try_wait") {
                break status;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                let err = err_reader.join().unwrap_or_default();
                let err = String::from_utf8_lossy(&err);
                let lines: Vec<&str> = err.lines().collect();
                panic!(
                    "{desc} did not finish within {timeout:?}; the end of its stderr:\n{}",
                    lines[lines.len().saturating_sub(30)..].join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let write_result = writer.join().expect("stdin writer thread");
        let out = out_reader.join().expect("stdout reader thread");
        let err = err_reader.join().expect("stderr reader thread");
        if let Err(e) = write_result {
            if status.success() {
                panic!("{desc}: writing its stdin failed although it succeeded: {e}");
            }
        }
        (status, out, err)
    }
}

/// Test data: records to produce and what consumers read, with the JSON form shared with the
/// Python scripts (bytes as lowercase hex, `null` for null).
pub mod data {
    use serde_json::{json, Value};

    /// A record to produce.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct TestRecord {
        /// Target partition.
        pub partition: i32,
        /// Key (`None` = null key).
        pub key: Option<Vec<u8>>,
        /// Value (`None` = null value, a tombstone).
        pub value: Option<Vec<u8>>,
        /// Headers in order; duplicate names allowed; `None` = null header value.
        pub headers: Vec<(String, Option<Vec<u8>>)>,
        /// CreateTime timestamp in ms (`None` = let the client pick "now").
        pub timestamp: Option<i64>,
    }

    /// A record as a consumer read it.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct Consumed {
        /// Partition it was read from.
        pub partition: i32,
        /// Its offset.
        pub offset: i64,
        /// Key.
        pub key: Option<Vec<u8>>,
        /// Value.
        pub value: Option<Vec<u8>>,
        /// Headers in order.
        pub headers: Vec<(String, Option<Vec<u8>>)>,
        /// Timestamp in ms, if the client reported one.
        pub timestamp: Option<i64>,
    }

    impl Consumed {
        /// Whether key, value and headers equal those of `r` (and the partition matches).
        pub fn same_content(&self, r: &TestRecord) -> bool {
            self.partition == r.partition
                && self.key == r.key
                && self.value == r.value
                && self.headers == r.headers
        }
    }

    /// Lowercase hex.
    pub fn hex(bytes: &[u8]) -> String {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut s = String::with_capacity(bytes.len() * 2);
        for b in bytes {
            s.push(DIGITS[(b >> 4) as usize] as char);
            s.push(DIGITS[(b & 15) as usize] as char);
        }
        s
    }

    /// Parses lowercase or uppercase hex; `None` if malformed.
    pub fn unhex(s: &str) -> Option<Vec<u8>> {
        if s.len() & 1 == 1 {
            return None;
        }
        let digit = |c: u8| match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            b'A'..=b'F' => Some(c - b'A' + 10),
            _ => None,
        };
        s.as_bytes()
            .chunks(2)
            .map(|p| Some(digit(p[0])? << 4 | digit(p[1])?))
            .collect()
    }

    fn opt_hex(b: &Option<Vec<u8>>) -> Value {
        match b {
            Some(b) => Value::String(hex(b)),
            None => Value::Null,
        }
    }

    fn headers_json(h: &[(String, Option<Vec<u8>>)]) -> Value {
        Value::Array(h.iter().map(|(k, v)| json!([k, opt_hex(v)])).collect())
    }

    /// JSON form of a record to produce.
    pub fn record_to_json(r: &TestRecord) -> Value {
        json!({
            "partition": r.partition,
            "key": opt_hex(&r.key),
            "value": opt_hex(&r.value),
            "headers": headers_json(&r.headers),
            "timestamp": r.timestamp,
        })
    }

    fn field_opt_bytes(v: &Value, name: &str) -> Result<Option<Vec<u8>>, String> {
        match v.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => unhex(s).map(Some).ok_or_else(|| format!("{name}: bad hex {s:?}")),
            Some(other) => Err(format!("{name}: expected hex string or null, got {other}")),
        }
    }

    /// Parses a consumed record from the scripts' JSON.
    pub fn consumed_from_json(v: &Value) -> Result<Consumed, String> {
        let int = |name: &str| {
            v.get(name)
                .and_then(Value::as_i64)
                .ok_or_else(|| format!("missing {name} in {v}"))
        };
        let mut headers = Vec::new();
        for h in v
            .get("headers")
            .and_then(Value::as_array)
            .ok_or_else(|| format!("missing headers in {v}"))?
        {
            let pair = h
                .as_array()
                .filter(|a| a.len() == 2)
                .ok_or_else(|| format!("bad header {h}"))?;
            let name = pair[0]
                .as_str()
                .ok_or_else(|| format!("bad header name {h}"))?
                .to_string();
            let value = match &pair[1] {
                Value::Null => None,
                Value::String(s) => Some(unhex(s).ok_or_else(|| format!("bad header hex {h}"))?),
                other => return Err(format!("bad header value {other}")),
            };
            headers.push((name, value));
        }
        Ok(Consumed {
            partition: int("partition")? as i32,
            offset: int("offset")?,
            key: field_opt_bytes(v, "key")?,
            value: field_opt_bytes(v, "value")?,
            headers,
            timestamp: v.get("timestamp").and_then(Value::as_i64),
        })
    }

    /// A small deterministic generator (splitmix64), so failures are reproducible.
    #[derive(Clone, Debug)]
    pub struct Gen(u64);

    impl Gen {
        /// A generator from a seed.
        pub fn new(seed: u64) -> Gen {
            Gen(seed)
        }

        /// Next 64 random bits.
        pub fn next_u64(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }

        /// Uniform in `0..n` (n > 0).
        pub fn below(&mut self, n: u64) -> u64 {
            self.next_u64() % n
        }

        /// `len` random bytes, none of them in `excluded`.
        pub fn bytes(&mut self, len: usize, excluded: &[u8]) -> Vec<u8> {
            let mut v = Vec::with_capacity(len);
            while v.len() < len {
                let b = self.next_u64() as u8;
                if !excluded.contains(&b) {
                    v.push(b);
                }
            }
            v
        }
    }

    /// `n` records over `partitions` partitions with every corner the clients must keep apart:
    /// binary keys and values (all byte values), empty vs null key and value, null header
    /// values, duplicate header names, explicit timestamps. Record `i` goes to partition
    /// `i % partitions` and its key starts with `i` in decimal, so it is easy to identify.
    pub fn varied_records(n: usize, partitions: i32, seed: u64) -> Vec<TestRecord> {
        let mut g = Gen::new(seed);
        let base_ts = 1_700_000_000_000i64;
        (0..n)
            .map(|i| {
                let mut key = format!("key-{i}-").into_bytes();
                let klen = g.below(24) as usize;
                key.extend(g.bytes(klen, &[]));
                let vlen = g.below(300) as usize;
                let mut value = format!("value-{i}:").into_bytes();
                value.extend(g.bytes(vlen, &[]));
                let (key, value) = match i % 10 {
                    3 => (None, Some(value)),
                    4 => (Some(key), None),
                    5 => (Some(Vec::new()), Some(Vec::new())),
                    _ => (Some(key), Some(value)),
                };
                let mut headers = vec![("seq".to_string(), Some(i.to_string().into_bytes()))];
                match i % 7 {
                    1 => headers.push(("nullable".to_string(), None)),
                    2 => {
                        headers.push(("dup".to_string(), Some(b"first".to_vec())));
                        headers.push(("dup".to_string(), Some(b"second".to_vec())));
                    }
                    3 => headers.push(("bin".to_string(), Some(g.bytes(16, &[])))),
                    4 => headers.push(("empty".to_string(), Some(Vec::new()))),
                    _ => {}
                }
                TestRecord {
                    partition: (i as i32) % partitions,
                    key,
                    value,
                    headers,
                    timestamp: Some(base_ts + i as i64),
                }
            })
            .collect()
    }

    /// Checks that `got` is exactly `expected` produced at `offsets` (same order as
    /// `expected`): every record read once, at its offset, byte-identical, timestamps equal
    /// when `check_timestamps`. Returns a description of the first differences.
    pub fn compare_read_back(
        who: &str,
        expected: &[TestRecord],
        offsets: &[i64],
        got: &[Consumed],
        check_timestamps: bool,
    ) -> Result<(), String> {
        assert_eq!(expected.len(), offsets.len());
        let mut problems = Vec::new();
        let mut by_pos = std::collections::BTreeMap::new();
        for c in got {
            if by_pos.insert((c.partition, c.offset), c).is_some() {
                problems.push(format!(
                    "{who}: read partition {} offset {} twice",
                    c.partition, c.offset
                ));
            }
        }
        if got.len() != expected.len() {
            problems.push(format!(
                "{who}: read {} records, expected {}",
                got.len(),
                expected.len()
            ));
        }
        for (r, &off) in expected.iter().zip(offsets) {
            match by_pos.get(&(r.partition, off)) {
                None => problems.push(format!("{who}: missing partition {} offset {off}", r.partition)),
                Some(c) => {
                    if !c.same_content(r) {
                        problems.push(format!(
                            "{who}: partition {} offset {off} differs:\n  expected key={:?} value={:?} headers={:?}\n  got      key={:?} value={:?} headers={:?}",
                            r.partition, r.key.as_deref().map(hex), r.value.as_deref().map(hex), r.headers,
                            c.key.as_deref().map(hex), c.value.as_deref().map(hex), c.headers
                        ));
                    } else if check_timestamps && r.timestamp.is_some() && c.timestamp != r.timestamp {
                        problems.push(format!(
                            "{who}: partition {} offset {off}: timestamp {:?}, expected {:?}",
                            r.partition, c.timestamp, r.timestamp
                        ));
                    }
                }
            }
            if problems.len() > 10 {
                break;
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("\n"))
        }
    }
}

/// A minimal blocking Kafka client for exact-protocol and bad-input tests.
///
/// [`raw::RawConn::request`] sends one typed request (any version the `kafka-protocol` crate
/// knows) and decodes the answer, checking the correlation id and that the whole frame was
/// consumed. [`raw::RawConn::raw_request`] sends any encodable body under any API key and
/// returns the answer undecoded; [`raw::RawConn::send_frame`] / [`raw::RawConn::send_bytes`] put
/// arbitrary bytes on the wire and [`raw::RawConn::expect_closed`] checks that the broker closed
/// the connection.
pub mod raw {
    use super::*;
    use bytes::{Buf, BufMut, Bytes, BytesMut};
    use kafka_protocol::messages::{ApiKey, RequestHeader, ResponseHeader};
    use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, Request, StrBytes};
    use kafka_protocol::records::{
        Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
    };

    /// Client id the raw connections send.
    pub const CLIENT_ID: &str = "strand-compat-raw";
    /// Largest answer the raw client accepts.
    pub const MAX_RESPONSE: usize = 256 * 1024 * 1024;

    /// One TCP connection speaking the Kafka protocol.
    pub struct RawConn {
        stream: TcpStream,
        next_correlation_id: i32,
        /// Peer address.
        pub addr: String,
    }

    /// An undecoded answer: the frame after its length prefix.
    #[derive(Clone, Debug)]
    pub struct ResponseBytes {
        /// The whole frame (correlation id, header tagged fields if any, body).
        pub frame: Bytes,
        /// The correlation id read from the first four bytes.
        pub correlation_id: i32,
    }

    impl ResponseBytes {
        /// Decodes header and body as the answer of version `version`, requiring that nothing
        /// is left over.
        pub fn decode<Resp: Decodable + HeaderVersion>(&self, version: i16) -> anyhow::Result<Resp> {
            let mut buf = self.frame.clone();
            let _header = ResponseHeader::decode(&mut buf, Resp::header_version(version))?;
            let resp = Resp::decode(&mut buf, version)?;
            anyhow::ensure!(
                buf.remaining() == 0,
                "{} bytes left over after decoding the response as version {version}",
                buf.remaining()
            );
            Ok(resp)
        }
    }

    impl RawConn {
        /// Connects with a 15 s read timeout.
        pub fn connect(addr: &str) -> std::io::Result<RawConn> {
            let stream = TcpStream::connect(addr)?;
            stream.set_read_timeout(Some(Duration::from_secs(15)))?;
            stream.set_nodelay(true)?;
            Ok(RawConn {
                stream,
                next_correlation_id: 1,
                addr: addr.to_string(),
            })
        }

        /// Changes the read timeout.
        pub fn set_read_timeout(&mut self, t: Duration) -> std::io::Result<()> {
            self.stream.set_read_timeout(Some(t))
        }

        /// Encodes a request frame (length prefix included) with the given header version.
        pub fn encode_frame<Req: Encodable>(
            api_key: i16,
            version: i16,
            header_version: i16,
            correlation_id: i32,
            req: &Req,
        ) -> anyhow::Result<BytesMut> {
            let header = RequestHeader::default()
                .with_request_api_key(api_key)
                .with_request_api_version(version)
                .with_correlation_id(correlation_id)
                .with_client_id(Some(StrBytes::from_static_str(CLIENT_ID)));
            let mut body = BytesMut::new();
            header.encode(&mut body, header_version)?;
            req.encode(&mut body, version)?;
            let mut frame = BytesMut::with_capacity(body.len() + 4);
            frame.put_i32(i32::try_from(body.len())?);
            frame.put_slice(&body);
            Ok(frame)
        }

        fn take_correlation_id(&mut self) -> i32 {
            let id = self.next_correlation_id;
            self.next_correlation_id += 1;
            id
        }

        /// Sends a typed request and decodes its answer.
        pub fn request<R: Request>(&mut self, version: i16, req: &R) -> anyhow::Result<R::Response> {
            let corr = self.send_request(version, req)?;
            let resp = self.read_response()?;
            anyhow::ensure!(
                resp.correlation_id == corr,
                "correlation id {} in the answer, expected {corr}",
                resp.correlation_id
            );
            resp.decode::<R::Response>(version)
        }

        /// Sends a typed request without reading the answer; returns its correlation id.
        pub fn send_request<R: Request>(&mut self, version: i16, req: &R) -> anyhow::Result<i32> {
            let corr = self.take_correlation_id();
            let frame = Self::encode_frame(R::KEY, version, R::header_version(version), corr, req)?;
            self.stream.write_all(&frame)?;
            Ok(corr)
        }

        /// Sends `req` encoded as version `version` under `api_key` (known or not; an unknown
        /// key gets request header v1) and returns the answer undecoded.
        pub fn raw_request<Req: Encodable>(
            &mut self,
            api_key: i16,
            version: i16,
            req: &Req,
        ) -> anyhow::Result<ResponseBytes> {
            let header_version = ApiKey::try_from(api_key)
                .map(|k| k.request_header_version(version))
                .unwrap_or(1);
            let corr = self.take_correlation_id();
            let frame = Self::encode_frame(api_key, version, header_version, corr, req)?;
            self.stream.write_all(&frame)?;
            let resp = self.read_response()?;
            anyhow::ensure!(
                resp.correlation_id == corr,
                "correlation id {} != {corr}",
                resp.correlation_id
            );
            Ok(resp)
        }

        /// Writes `payload` with a 4-byte big-endian length prefix.
        pub fn send_frame(&mut self, payload: &[u8]) -> std::io::Result<()> {
            let mut frame = Vec::with_capacity(payload.len() + 4);
            frame.extend_from_slice(&(payload.len() as i32).to_be_bytes());
            frame.extend_from_slice(payload);
            self.stream.write_all(&frame)
        }

        /// Writes raw bytes, nothing added.
        pub fn send_bytes(&mut self, bytes: &[u8]) -> std::io::Result<()> {
            self.stream.write_all(bytes)
        }

        /// Reads one answer frame. An error of kind `UnexpectedEof` means the broker closed.
        pub fn read_response(&mut self) -> anyhow::Result<ResponseBytes> {
            match self.read_frame()? {
                Some(frame) => {
                    anyhow::ensure!(frame.len() >= 4, "answer frame of {} bytes", frame.len());
                    let correlation_id = i32::from_be_bytes([frame[0], frame[1], frame[2], frame[3]]);
                    Ok(ResponseBytes {
                        frame,
                        correlation_id,
                    })
                }
                None => Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the broker closed the connection",
                )
                .into()),
            }
        }

        /// Reads one frame; `Ok(None)` when the peer closed (EOF or reset) before its first byte.
        pub fn read_frame(&mut self) -> std::io::Result<Option<Bytes>> {
            let mut len = [0u8; 4];
            match read_full(&mut self.stream, &mut len)? {
                0 => return Ok(None),
                4 => {}
                n => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        format!("closed after {n} bytes of a length prefix"),
                    ))
                }
            }
            let len = i32::from_be_bytes(len);
            if len < 0 || len as usize > MAX_RESPONSE {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("answer frame length {len}"),
                ));
            }
            let mut buf = vec![0u8; len as usize];
            let n = read_full(&mut self.stream, &mut buf)?;
            if n != buf.len() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!("closed after {n} of {len} bytes of an answer"),
                ));
            }
            Ok(Some(Bytes::from(buf)))
        }

        /// Checks that the broker closes the connection within `within` without sending
        /// anything. Returns a description of what happened otherwise.
        pub fn expect_closed(&mut self, within: Duration) -> Result<(), String> {
            self.stream
                .set_read_timeout(Some(within))
                .map_err(|e| e.to_string())?;
            let mut buf = [0u8; 4096];
            match self.stream.read(&mut buf) {
                Ok(0) => Ok(()),
                Ok(n) => Err(format!(
                    "the broker answered ({n} bytes: {:02x?}) instead of closing",
                    &buf[..n.min(64)]
                )),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => Ok(()),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    Err(format!("the connection was still open after {within:?}"))
                }
                Err(e) => Err(format!("read error {e} (neither a close nor an answer)")),
            }
        }
    }

    /// Reads until `buf` is full or EOF; returns the bytes read. A connection reset before any
    /// byte counts as EOF.
    fn read_full(stream: &mut TcpStream, buf: &mut [u8]) -> std::io::Result<usize> {
        let mut n = 0;
        while n < buf.len() {
            match stream.read(&mut buf[n..]) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset && n == 0 => break,
                Err(e) => return Err(e),
            }
        }
        Ok(n)
    }

    /// A record for [`encode_batch`]: key, value, headers, timestamp.
    pub fn record(key: Option<&[u8]>, value: Option<&[u8]>, timestamp: i64) -> Record {
        Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: -1,
            producer_id: -1,
            producer_epoch: -1,
            timestamp_type: TimestampType::Creation,
            offset: 0,
            sequence: -1,
            timestamp,
            key: key.map(Bytes::copy_from_slice),
            value: value.map(Bytes::copy_from_slice),
            headers: Default::default(),
        }
    }

    /// Encodes records as exactly one v2 record batch (base offset 0, offset deltas 0..n, no
    /// producer id, base sequence -1), as Produce v3+ requires.
    pub fn encode_batch(records: &[Record], compression: Compression) -> Bytes {
        let records: Vec<Record> = records
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let mut r = r.clone();
                r.offset = i as i64;
                // The encoder starts a new batch whenever `offset - sequence` changes; keep it
                // constant while the batch's base sequence stays -1 (no idempotence).
                r.sequence = i as i32 - 1;
                r
            })
            .collect();
        let mut buf = BytesMut::new();
        RecordBatchEncoder::encode(
            &mut buf,
            &records,
            &RecordEncodeOptions {
                version: 2,
                compression,
            },
        )
        .expect("encode a record batch");
        buf.freeze()
    }

    /// Encodes records as exactly one v2 record batch of an idempotent producer: producer id
    /// `producer_id`, epoch `producer_epoch`, sequences `base_sequence..base_sequence + n`
    /// (base offset 0, offset deltas 0..n, not transactional).
    pub fn encode_idempotent_batch(
        records: &[Record],
        compression: Compression,
        producer_id: i64,
        producer_epoch: i16,
        base_sequence: i32,
    ) -> Bytes {
        let records: Vec<Record> = records
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let mut r = r.clone();
                r.offset = i as i64;
                r.producer_id = producer_id;
                r.producer_epoch = producer_epoch;
                r.sequence = base_sequence.wrapping_add(i as i32);
                r
            })
            .collect();
        let mut buf = BytesMut::new();
        RecordBatchEncoder::encode(
            &mut buf,
            &records,
            &RecordEncodeOptions {
                version: 2,
                compression,
            },
        )
        .expect("encode a record batch");
        buf.freeze()
    }

    /// One record batch's position in a log segment file, as walked by [`walk_batches`].
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct BatchPos {
        /// Byte position of the batch in the file.
        pub position: u64,
        /// Total size (12-byte prefix + length).
        pub size: u64,
        /// Base offset.
        pub base_offset: i64,
        /// Last offset (base offset + last offset delta).
        pub last_offset: i64,
    }

    /// Walks the complete v2 record batches at the start of a segment file (8-byte base
    /// offset, 4-byte length, ..., CRC-32C over attributes..end). Stops at the first incomplete,
    /// implausible or CRC-failing batch (a torn tail, zero pre-allocation); returns the valid
    /// batches and the byte length they cover.
    pub fn walk_batches(file: &[u8]) -> (Vec<BatchPos>, u64) {
        let mut out = Vec::new();
        let mut pos = 0usize;
        while pos + 61 <= file.len() {
            let b = &file[pos..];
            let base_offset = i64::from_be_bytes(b[0..8].try_into().expect("8 bytes"));
            let length = i32::from_be_bytes(b[8..12].try_into().expect("4 bytes"));
            let magic = b[16];
            if length < 49 || magic != 2 || base_offset < 0 {
                break;
            }
            let size = 12 + length as usize;
            if pos + size > file.len() {
                break;
            }
            let crc = u32::from_be_bytes(b[17..21].try_into().expect("4 bytes"));
            if crc32c::crc32c(&b[21..size]) != crc {
                break;
            }
            let last_delta = i32::from_be_bytes(b[23..27].try_into().expect("4 bytes"));
            out.push(BatchPos {
                position: pos as u64,
                size: size as u64,
                base_offset,
                last_offset: base_offset + i64::from(last_delta),
            });
            pos += size;
        }
        (out, pos as u64)
    }
}

/// Admin and data-plane calls over [`raw::RawConn`], with the versions the suite uses.
pub mod admin {
    use super::raw::RawConn;
    use super::*;
    use bytes::Bytes;
    use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
    use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
    use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
    use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
    use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
    use kafka_protocol::messages::*;
    use kafka_protocol::protocol::StrBytes;
    use kafka_protocol::records::{Compression, RecordBatchDecoder};

    /// Request versions the suite uses (all within Kafka 4.x's supported ranges and still
    /// addressing topics by name).
    pub mod versions {
        /// ApiVersions.
        pub const API_VERSIONS: i16 = 3;
        /// Metadata.
        pub const METADATA: i16 = 12;
        /// Produce.
        pub const PRODUCE: i16 = 9;
        /// Fetch (last version with topic names).
        pub const FETCH: i16 = 12;
        /// ListOffsets (max-timestamp needs v7+).
        pub const LIST_OFFSETS: i16 = 8;
        /// CreateTopics.
        pub const CREATE_TOPICS: i16 = 7;
        /// DeleteTopics (v6 deletes by topic id too).
        pub const DELETE_TOPICS: i16 = 6;
        /// CreatePartitions.
        pub const CREATE_PARTITIONS: i16 = 3;
        /// DescribeConfigs.
        pub const DESCRIBE_CONFIGS: i16 = 4;
        /// DeleteRecords.
        pub const DELETE_RECORDS: i16 = 2;
        /// DescribeCluster.
        pub const DESCRIBE_CLUSTER: i16 = 1;
        /// InitProducerId (v3+ carries the current producer id and epoch, KIP-360; v4 is what
        /// Kafka 2.7+ clients send for idempotence).
        pub const INIT_PRODUCER_ID: i16 = 4;
    }

    /// `ListOffsets` special timestamps.
    pub const LATEST: i64 = -1;
    /// Earliest offset (log start).
    pub const EARLIEST: i64 = -2;
    /// Offset of the record with the largest timestamp.
    pub const MAX_TIMESTAMP: i64 = -3;

    /// Kafka error codes used by the suite.
    pub mod errors {
        /// NONE.
        pub const NONE: i16 = 0;
        /// OFFSET_OUT_OF_RANGE.
        pub const OFFSET_OUT_OF_RANGE: i16 = 1;
        /// CORRUPT_MESSAGE.
        pub const CORRUPT_MESSAGE: i16 = 2;
        /// UNKNOWN_TOPIC_OR_PARTITION.
        pub const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
        /// MESSAGE_TOO_LARGE.
        pub const MESSAGE_TOO_LARGE: i16 = 10;
        /// INVALID_TOPIC_EXCEPTION.
        pub const INVALID_TOPIC_EXCEPTION: i16 = 17;
        /// INVALID_REQUIRED_ACKS.
        pub const INVALID_REQUIRED_ACKS: i16 = 21;
        /// UNSUPPORTED_VERSION.
        pub const UNSUPPORTED_VERSION: i16 = 35;
        /// TOPIC_ALREADY_EXISTS.
        pub const TOPIC_ALREADY_EXISTS: i16 = 36;
        /// INVALID_PARTITIONS.
        pub const INVALID_PARTITIONS: i16 = 37;
        /// INVALID_CONFIG.
        pub const INVALID_CONFIG: i16 = 40;
        /// OUT_OF_ORDER_SEQUENCE_NUMBER.
        pub const OUT_OF_ORDER_SEQUENCE_NUMBER: i16 = 45;
        /// DUPLICATE_SEQUENCE_NUMBER.
        pub const DUPLICATE_SEQUENCE_NUMBER: i16 = 46;
        /// INVALID_PRODUCER_EPOCH.
        pub const INVALID_PRODUCER_EPOCH: i16 = 47;
        /// KAFKA_STORAGE_ERROR.
        pub const KAFKA_STORAGE_ERROR: i16 = 56;
        /// UNKNOWN_PRODUCER_ID.
        pub const UNKNOWN_PRODUCER_ID: i16 = 59;
        /// PRODUCER_FENCED.
        pub const PRODUCER_FENCED: i16 = 90;
        /// UNKNOWN_TOPIC_ID.
        pub const UNKNOWN_TOPIC_ID: i16 = 100;
    }

    fn s(v: &str) -> StrBytes {
        StrBytes::from_string(v.to_string())
    }

    /// A topic name for requests.
    pub fn topic_name(name: &str) -> TopicName {
        TopicName(s(name))
    }

    /// Connects, failing the test on error.
    pub fn connect(bootstrap: &str) -> RawConn {
        RawConn::connect(bootstrap).unwrap_or_else(|e| panic!("connect to {bootstrap}: {e}"))
    }

    /// A CreateTopics request for one topic.
    pub fn create_topics_request(
        name: &str,
        partitions: i32,
        configs: &[(&str, &str)],
        validate_only: bool,
    ) -> CreateTopicsRequest {
        let topic = CreatableTopic::default()
            .with_name(topic_name(name))
            .with_num_partitions(partitions)
            .with_replication_factor(-1)
            .with_configs(
                configs
                    .iter()
                    .map(|(k, v)| {
                        CreatableTopicConfig::default()
                            .with_name(s(k))
                            .with_value(Some(s(v)))
                    })
                    .collect(),
            );
        CreateTopicsRequest::default()
            .with_topics(vec![topic])
            .with_timeout_ms(30_000)
            .with_validate_only(validate_only)
    }

    /// Creates a topic (error code must be NONE) and waits until Metadata shows all its
    /// partitions with a leader. Returns the topic id from the CreateTopics answer.
    pub fn create_topic(
        bootstrap: &str,
        name: &str,
        partitions: i32,
        configs: &[(&str, &str)],
    ) -> uuid::Uuid {
        let mut c = connect(bootstrap);
        let resp = c
            .request(
                versions::CREATE_TOPICS,
                &create_topics_request(name, partitions, configs, false),
            )
            .unwrap_or_else(|e| panic!("CreateTopics {name}: {e}"));
        let t = resp
            .topics
            .first()
            .unwrap_or_else(|| panic!("CreateTopics {name}: no topic in the answer"));
        assert_eq!(
            t.error_code, 0,
            "CreateTopics {name} failed with error {} ({:?})",
            t.error_code, t.error_message
        );
        wait_for(
            Duration::from_secs(15),
            &format!("topic {name} to appear in Metadata"),
            || {
                let md = metadata(&mut c, &[name], false);
                let mt = md.topics.first()?;
                (mt.error_code == 0
                    && mt.partitions.len() == partitions as usize
                    && mt
                        .partitions
                        .iter()
                        .all(|p| p.error_code == 0 && p.leader_id.0 >= 0))
                .then_some(())
            },
        );
        t.topic_id
    }

    /// ApiVersions (v3), asserting no error.
    pub fn api_versions(c: &mut RawConn) -> ApiVersionsResponse {
        let resp = c
            .request(
                versions::API_VERSIONS,
                &ApiVersionsRequest::default()
                    .with_client_software_name(s("strand-compat"))
                    .with_client_software_version(s("0")),
            )
            .unwrap_or_else(|e| panic!("ApiVersions: {e}"));
        assert_eq!(resp.error_code, 0, "ApiVersions error {}", resp.error_code);
        resp
    }

    /// The `(min, max)` versions the broker advertises for `api_key`, or `None`.
    pub fn advertised_versions(c: &mut RawConn, api_key: i16) -> Option<(i16, i16)> {
        api_versions(c)
            .api_keys
            .iter()
            .find(|k| k.api_key == api_key)
            .map(|k| (k.min_version, k.max_version))
    }

    /// InitProducerId for an idempotent producer (no transactional id) at
    /// [`versions::INIT_PRODUCER_ID`], with the current `producer_id`/`producer_epoch` (-1/-1
    /// for a new producer; KIP-360 epoch bump otherwise).
    pub fn init_producer_id(
        c: &mut RawConn,
        producer_id: i64,
        producer_epoch: i16,
    ) -> InitProducerIdResponse {
        let req = InitProducerIdRequest::default()
            .with_transactional_id(None)
            .with_transaction_timeout_ms(60_000)
            .with_producer_id(ProducerId(producer_id))
            .with_producer_epoch(producer_epoch);
        c.request(versions::INIT_PRODUCER_ID, &req)
            .unwrap_or_else(|e| panic!("InitProducerId: {e}"))
    }

    /// Metadata for `topics` (all topics if empty).
    pub fn metadata(c: &mut RawConn, topics: &[&str], allow_auto_create: bool) -> MetadataResponse {
        let req = MetadataRequest::default()
            .with_topics(if topics.is_empty() {
                None
            } else {
                Some(
                    topics
                        .iter()
                        .map(|t| MetadataRequestTopic::default().with_name(Some(topic_name(t))))
                        .collect(),
                )
            })
            .with_allow_auto_topic_creation(allow_auto_create);
        c.request(versions::METADATA, &req)
            .unwrap_or_else(|e| panic!("Metadata: {e}"))
    }

    /// A Produce request carrying one batch per (partition, batch).
    pub fn produce_request(topic: &str, acks: i16, batches: Vec<(i32, Bytes)>) -> ProduceRequest {
        ProduceRequest::default()
            .with_acks(acks)
            .with_timeout_ms(30_000)
            .with_topic_data(vec![TopicProduceData::default()
                .with_name(topic_name(topic))
                .with_partition_data(
                    batches
                        .into_iter()
                        .map(|(p, b)| {
                            PartitionProduceData::default()
                                .with_index(p)
                                .with_records(Some(b))
                        })
                        .collect(),
                )])
    }

    /// Produces one batch with acks=-1; returns (error code, base offset) of that partition.
    pub fn produce(c: &mut RawConn, topic: &str, partition: i32, batch: Bytes) -> (i16, i64) {
        let resp = c
            .request(
                versions::PRODUCE,
                &produce_request(topic, -1, vec![(partition, batch)]),
            )
            .unwrap_or_else(|e| panic!("Produce to {topic}/{partition}: {e}"));
        let p = produce_answer(&resp, partition);
        (p.error_code, p.base_offset)
    }

    /// The answer for `partition` in a Produce response; panics if it has none.
    pub fn produce_answer(
        resp: &ProduceResponse,
        partition: i32,
    ) -> &produce_response::PartitionProduceResponse {
        resp.responses
            .iter()
            .flat_map(|t| t.partition_responses.iter())
            .find(|p| p.index == partition)
            .unwrap_or_else(|| panic!("Produce answer lacks partition {partition}: {resp:?}"))
    }

    /// Produces plain records `values` (key = None) in one uncompressed batch; asserts success and
    /// returns the base offset.
    pub fn produce_values(c: &mut RawConn, topic: &str, partition: i32, values: &[&[u8]]) -> i64 {
        let records: Vec<_> = values
            .iter()
            .map(|v| raw::record(None, Some(v), now_ms()))
            .collect();
        let (err, base) = produce(
            c,
            topic,
            partition,
            raw::encode_batch(&records, Compression::None),
        );
        assert_eq!(err, 0, "Produce to {topic}/{partition} failed with error {err}");
        base
    }

    /// Current time in ms since the epoch.
    pub fn now_ms() -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0)
    }

    /// The answer for one partition of a Fetch.
    #[derive(Debug)]
    pub struct FetchResult {
        /// Partition error code.
        pub error_code: i16,
        /// High watermark.
        pub high_watermark: i64,
        /// Log start offset.
        pub log_start_offset: i64,
        /// Decoded records (offset, key, value, timestamp) with offset >= the fetch offset.
        pub records: Vec<(i64, Option<Bytes>, Option<Bytes>, i64)>,
    }

    /// The request [`fetch`] sends: sessionless, one partition from `offset`, `max_bytes` for the
    /// partition and the whole answer, `min_bytes=1`, `max_wait_ms=500`.
    pub fn fetch_request(topic: &str, partition: i32, offset: i64, max_bytes: i32) -> FetchRequest {
        FetchRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_max_wait_ms(500)
            .with_min_bytes(1)
            .with_max_bytes(max_bytes)
            .with_isolation_level(0)
            .with_session_id(0)
            .with_session_epoch(-1)
            .with_topics(vec![FetchTopic::default()
                .with_topic(topic_name(topic))
                .with_partitions(vec![FetchPartition::default()
                    .with_partition(partition)
                    .with_current_leader_epoch(-1)
                    .with_fetch_offset(offset)
                    .with_last_fetched_epoch(-1)
                    .with_log_start_offset(-1)
                    .with_partition_max_bytes(max_bytes)])])
    }

    /// Fetches one partition from `offset`, decoding the records. A sessionless fetch with
    /// `min_bytes=1` and `max_wait_ms=500`: it answers at once when there is data or an error,
    /// and after 500 ms with no records at the log end.
    pub fn fetch(c: &mut RawConn, topic: &str, partition: i32, offset: i64, max_bytes: i32) -> FetchResult {
        let req = fetch_request(topic, partition, offset, max_bytes);
        let resp = c
            .request(versions::FETCH, &req)
            .unwrap_or_else(|e| panic!("Fetch {topic}/{partition}: {e}"));
        assert_eq!(resp.error_code, 0, "Fetch top-level error {}", resp.error_code);
        let p = resp
            .responses
            .iter()
            .flat_map(|t| t.partitions.iter())
            .find(|p| p.partition_index == partition)
            .unwrap_or_else(|| panic!("Fetch answer lacks partition {partition}"));
        let mut records = Vec::new();
        if let Some(mut bytes) = p.records.clone() {
            // A partial batch at the end (cut by max_bytes) is allowed by the protocol; a
            // complete batch that does not check out is the broker's fault.
            let (_, complete) = raw::walk_batches(&bytes);
            let rest = &bytes[complete as usize..];
            if rest.len() >= 12 {
                let len = i32::from_be_bytes([rest[8], rest[9], rest[10], rest[11]]);
                assert!(
                    len < 0 || 12 + len as usize > rest.len(),
                    "{topic}/{partition}: the fetch answer holds a complete but invalid batch (bad CRC, magic \
                     or length) at byte {complete}"
                );
            }
            bytes.truncate(complete as usize);
            if !bytes.is_empty() {
                let sets = RecordBatchDecoder::decode_all(&mut bytes)
                    .unwrap_or_else(|e| panic!("decode fetched batches of {topic}/{partition}: {e}"));
                for set in sets {
                    for r in set.records {
                        if r.offset >= offset {
                            records.push((r.offset, r.key, r.value, r.timestamp));
                        }
                    }
                }
            }
        }
        FetchResult {
            error_code: p.error_code,
            high_watermark: p.high_watermark,
            log_start_offset: p.log_start_offset,
            records,
        }
    }

    /// Fetches `from..to` of one partition with as many Fetch requests as needed (a broker may
    /// answer from one segment at a time, as Kafka does); panics on an error or when a fetch
    /// makes no progress. Returns (offset, key, value, timestamp) in offset order.
    pub fn fetch_range(
        c: &mut RawConn,
        topic: &str,
        partition: i32,
        from: i64,
        to: i64,
    ) -> Vec<(i64, Option<Bytes>, Option<Bytes>, i64)> {
        let mut out = Vec::new();
        let mut next = from;
        while next < to {
            let f = fetch(c, topic, partition, next, 1 << 20);
            assert_eq!(
                f.error_code, 0,
                "Fetch {topic}/{partition} at {next}: error {}",
                f.error_code
            );
            let before = out.len();
            out.extend(f.records.into_iter().filter(|r| r.0 < to));
            assert!(
                out.len() > before,
                "Fetch {topic}/{partition} at {next} returned nothing (end {to})"
            );
            next = out.last().map(|r| r.0 + 1).unwrap_or(next);
        }
        out
    }

    /// ListOffsets for one partition and timestamp; returns (error code, offset, timestamp).
    pub fn list_offset(c: &mut RawConn, topic: &str, partition: i32, timestamp: i64) -> (i16, i64, i64) {
        let req = ListOffsetsRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_isolation_level(0)
            .with_topics(vec![ListOffsetsTopic::default()
                .with_name(topic_name(topic))
                .with_partitions(vec![ListOffsetsPartition::default()
                    .with_partition_index(partition)
                    .with_current_leader_epoch(-1)
                    .with_timestamp(timestamp)])]);
        let resp = c
            .request(versions::LIST_OFFSETS, &req)
            .unwrap_or_else(|e| panic!("ListOffsets {topic}/{partition}@{timestamp}: {e}"));
        let p = resp
            .topics
            .iter()
            .flat_map(|t| t.partitions.iter())
            .find(|p| p.partition_index == partition)
            .unwrap_or_else(|| panic!("ListOffsets answer lacks partition {partition}"));
        (p.error_code, p.offset, p.timestamp)
    }

    /// Earliest offset (log start), asserting no error.
    pub fn earliest(c: &mut RawConn, topic: &str, partition: i32) -> i64 {
        let (e, o, _) = list_offset(c, topic, partition, EARLIEST);
        assert_eq!(e, 0, "ListOffsets(earliest) {topic}/{partition}: error {e}");
        o
    }

    /// Latest offset (log end / high watermark), asserting no error.
    pub fn latest(c: &mut RawConn, topic: &str, partition: i32) -> i64 {
        let (e, o, _) = list_offset(c, topic, partition, LATEST);
        assert_eq!(e, 0, "ListOffsets(latest) {topic}/{partition}: error {e}");
        o
    }

    /// Checks the broker still serves a fresh client: Metadata, CreateTopics (or auto-create),
    /// Produce and Fetch of a unique value on a new connection. Panics otherwise.
    pub fn assert_broker_serves(bootstrap: &str) {
        let mut c = RawConn::connect(bootstrap)
            .unwrap_or_else(|e| panic!("the broker no longer accepts connections at {bootstrap}: {e}"));
        let topic = unique_topic("alive");
        let mut create = c
            .request(
                versions::CREATE_TOPICS,
                &create_topics_request(&topic, 1, &[], false),
            )
            .unwrap_or_else(|e| panic!("the broker no longer serves CreateTopics: {e}"));
        let created = create.topics.pop().expect("a topic in the CreateTopics answer");
        assert_eq!(
            created.error_code, 0,
            "CreateTopics of a probe topic failed: {created:?}"
        );
        wait_for(Duration::from_secs(15), "the probe topic in Metadata", || {
            let md = metadata(&mut c, &[&topic], false);
            md.topics
                .first()
                .filter(|t| t.error_code == 0 && !t.partitions.is_empty())
                .map(|_| ())
        });
        let value = format!("still-alive-{}", rand::random::<u64>());
        let base = produce_values(&mut c, &topic, 0, &[value.as_bytes()]);
        assert_eq!(base, 0, "first record of a new topic got offset {base}");
        let f = fetch(&mut c, &topic, 0, 0, 1 << 20);
        assert_eq!(
            f.error_code, 0,
            "Fetch of the probe record: error {}",
            f.error_code
        );
        let got: Vec<_> = f.records.iter().map(|r| (r.0, r.2.clone())).collect();
        assert_eq!(
            got,
            vec![(0, Some(Bytes::from(value)))],
            "probe record read back wrong"
        );
    }

    /// Topic metadata for one topic (asserting it exists): (topic id, partition count).
    pub fn topic_info(c: &mut RawConn, topic: &str) -> (uuid::Uuid, usize) {
        let md = metadata(c, &[topic], false);
        let t = md
            .topics
            .first()
            .unwrap_or_else(|| panic!("Metadata answer lacks {topic}"));
        assert_eq!(t.error_code, 0, "Metadata {topic}: error {}", t.error_code);
        (t.topic_id, t.partitions.len())
    }

    /// Maps a config list to name -> (value, source).
    pub fn config_map(
        configs: &[describe_configs_response::DescribeConfigsResourceResult],
    ) -> BTreeMap<String, (Option<String>, i8)> {
        configs
            .iter()
            .map(|c| {
                (
                    c.name.to_string(),
                    (c.value.as_ref().map(|v| v.to_string()), c.config_source),
                )
            })
            .collect()
    }
}

/// Helpers around rdkafka (bundled librdkafka) and the Python client scripts.
pub mod clients {
    use super::data::{Consumed, TestRecord};
    use super::*;
    use rdkafka::client::ClientContext;
    use rdkafka::config::ClientConfig;
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::error::KafkaError;
    use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
    use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
    use rdkafka::types::RDKafkaErrorCode;
    use rdkafka::{Offset, TopicPartitionList};
    use std::sync::{Arc, Mutex};

    /// Base rdkafka configuration for `bootstrap`: no idempotence (the broker need not support
    /// InitProducerId yet), quick reconnects.
    pub fn base_config(bootstrap: &str) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", bootstrap)
            .set("broker.address.family", "v4")
            .set("reconnect.backoff.ms", "50")
            .set("reconnect.backoff.max.ms", "500");
        c
    }

    /// rdkafka headers from a test record's.
    pub fn owned_headers(h: &[(String, Option<Vec<u8>>)]) -> OwnedHeaders {
        let mut headers = OwnedHeaders::new_with_capacity(h.len());
        for (k, v) in h {
            headers = headers.insert(Header {
                key: k,
                value: v.as_deref(),
            });
        }
        headers
    }

    /// Where a message ended up, as its delivery report said.
    pub type Delivery = Result<(i32, i64), String>;

    /// A producer context recording every delivery report by message index (the opaque).
    #[derive(Clone, Default)]
    pub struct DeliveryLog {
        /// Index -> report. Shared so another thread can watch acknowledgements arrive.
        pub reports: Arc<Mutex<BTreeMap<usize, Delivery>>>,
    }

    impl ClientContext for DeliveryLog {}

    impl ProducerContext for DeliveryLog {
        type DeliveryOpaque = usize;

        fn delivery(&self, result: &DeliveryResult<'_>, index: usize) {
            let report = match result {
                Ok(m) => Ok((m.partition(), m.offset())),
                Err((e, _)) => Err(e.to_string()),
            };
            if let Ok(mut reports) = self.reports.lock() {
                reports.insert(index, report);
            }
        }
    }

    /// An rdkafka producer with acks=all whose deliveries are recorded in a [`DeliveryLog`].
    /// `extra` settings are applied last.
    pub fn logged_producer(bootstrap: &str, extra: &[(&str, &str)]) -> BaseProducer<DeliveryLog> {
        let mut config = base_config(bootstrap);
        config
            .set("acks", "all")
            .set("enable.idempotence", "false")
            .set("linger.ms", "5")
            .set("message.timeout.ms", "30000");
        for (k, v) in extra {
            config.set(*k, *v);
        }
        config
            .create_with_context(DeliveryLog::default())
            .unwrap_or_else(|e| panic!("create rdkafka producer: {e}"))
    }

    /// Queues one record (index `index` in the delivery log), polling while the queue is full.
    pub fn send_record(producer: &BaseProducer<DeliveryLog>, topic: &str, index: usize, r: &TestRecord) {
        let mut rec: BaseRecord<'_, [u8], [u8], usize> = BaseRecord::with_opaque_to(topic, index)
            .partition(r.partition)
            .headers(owned_headers(&r.headers));
        if let Some(k) = &r.key {
            rec = rec.key(k.as_slice());
        }
        if let Some(v) = &r.value {
            rec = rec.payload(v.as_slice());
        }
        if let Some(ts) = r.timestamp {
            rec = rec.timestamp(ts);
        }
        loop {
            match producer.send(rec) {
                Ok(()) => return,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    rec = back;
                    producer.poll(Duration::from_millis(10));
                }
                Err((e, _)) => panic!("rdkafka send failed: {e}"),
            }
        }
    }

    /// Produces `records` to `topic` with rdkafka (acks=all) and waits for every delivery.
    /// Returns the offsets in input order; panics on any delivery failure or when a record
    /// landed in another partition than asked.
    pub fn rdkafka_produce(bootstrap: &str, topic: &str, records: &[TestRecord]) -> Vec<i64> {
        rdkafka_produce_with(bootstrap, topic, records, &[])
    }

    /// [`rdkafka_produce`] with extra producer settings.
    pub fn rdkafka_produce_with(
        bootstrap: &str,
        topic: &str,
        records: &[TestRecord],
        config: &[(&str, &str)],
    ) -> Vec<i64> {
        let producer = logged_producer(bootstrap, config);
        for (i, r) in records.iter().enumerate() {
            send_record(&producer, topic, i, r);
            producer.poll(Duration::ZERO);
        }
        producer
            .flush(Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("rdkafka flush: {e}"));
        let reports = producer.context().reports.lock().expect("delivery log").clone();
        records
            .iter()
            .enumerate()
            .map(|(i, r)| match reports.get(&i) {
                None => panic!("no delivery report for record {i}"),
                Some(Err(e)) => panic!("rdkafka delivery of record {i} failed: {e}"),
                Some(Ok((p, o))) => {
                    assert_eq!(*p, r.partition, "record {i} delivered to partition {p}");
                    *o
                }
            })
            .collect()
    }

    /// Reads `topic`/`partition` with an rdkafka consumer assigned at `start` until `count`
    /// records were read (or `timeout`). Uses assign (no consumer group).
    pub fn rdkafka_consume(
        bootstrap: &str,
        topic: &str,
        partition: i32,
        start: Offset,
        count: usize,
        timeout: Duration,
    ) -> Vec<Consumed> {
        let consumer = assign_consumer(bootstrap);
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, partition, start)
            .expect("add partition");
        consumer.assign(&tpl).expect("assign");
        poll_records(&consumer, count, timeout)
    }

    /// An rdkafka consumer for assign/seek use: no commits, `auto.offset.reset=error`.
    ///
    /// librdkafka refuses `assign` without a `group.id` ("Unknown group"), so one is set; no
    /// group protocol is used, but librdkafka still looks the coordinator up (FindCoordinator)
    /// in the background and reports failures of that as non-fatal errors.
    pub fn assign_consumer(bootstrap: &str) -> BaseConsumer {
        base_config(bootstrap)
            .set("group.id", "strand-compat-assign-only")
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "error")
            .set("enable.partition.eof", "false")
            .create()
            .unwrap_or_else(|e| panic!("create rdkafka consumer: {e}"))
    }

    /// Polls `consumer` until `count` records were read; panics on a partition error (offset out
    /// of range, unknown partition...) or timeout. Other errors (e.g. about the unused group
    /// coordinator) are logged and polling goes on.
    pub fn poll_records(consumer: &BaseConsumer, count: usize, timeout: Duration) -> Vec<Consumed> {
        let deadline = Instant::now() + timeout;
        let mut out = Vec::with_capacity(count);
        while out.len() < count {
            assert!(
                Instant::now() < deadline,
                "rdkafka consumer read {} of {count} records within {timeout:?}",
                out.len()
            );
            match consumer.poll(Duration::from_millis(100)) {
                None => {}
                Some(Err(KafkaError::MessageConsumption(code)))
                    if !matches!(
                        code,
                        RDKafkaErrorCode::OffsetOutOfRange
                            | RDKafkaErrorCode::AutoOffsetReset
                            | RDKafkaErrorCode::UnknownTopicOrPartition
                            | RDKafkaErrorCode::UnknownPartition
                            | RDKafkaErrorCode::UnknownTopic
                            | RDKafkaErrorCode::InvalidMessage
                            | RDKafkaErrorCode::BadMessage
                    ) =>
                {
                    eprintln!(
                        "[rdkafka consumer] non-fatal error after {} records: {code:?}",
                        out.len()
                    );
                }
                Some(Err(e)) => panic!("rdkafka consumer error after {} records: {e}", out.len()),
                Some(Ok(m)) => out.push(consumed_from_rdkafka(&m)),
            }
        }
        out
    }

    /// Converts an rdkafka message.
    pub fn consumed_from_rdkafka<M: Message>(m: &M) -> Consumed {
        let headers = m
            .headers()
            .map(|h| {
                h.iter()
                    .map(|h| (h.key.to_string(), h.value.map(|v| v.to_vec())))
                    .collect()
            })
            .unwrap_or_default();
        Consumed {
            partition: m.partition(),
            offset: m.offset(),
            key: m.key().map(|k| k.to_vec()),
            value: m.payload().map(|v| v.to_vec()),
            headers,
            timestamp: m.timestamp().to_millis(),
        }
    }

    /// Which Python client library a script uses.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum PythonClient {
        /// `confluent-kafka` (librdkafka underneath).
        ConfluentKafka,
        /// `kafka-python` (pure Python).
        KafkaPython,
    }

    impl PythonClient {
        /// The script's file name in [`tools::python_scripts_dir`].
        pub fn script(self) -> &'static str {
            match self {
                PythonClient::ConfluentKafka => "confluent_client.py",
                PythonClient::KafkaPython => "kafka_python_client.py",
            }
        }
    }

    /// Runs a Python client script: `<script> <args...>` with `input` as JSON on stdin; returns
    /// its JSON answer (stdout). Panics with its stderr on failure.
    pub fn python_client(
        client: PythonClient,
        args: &[String],
        input: &serde_json::Value,
        timeout: Duration,
    ) -> serde_json::Value {
        let py = tools::python();
        let script = tools::python_scripts_dir().join(client.script());
        let mut cmd = Command::new(&py);
        cmd.arg(&script).args(args).env_remove("LD_LIBRARY_PATH");
        let (status, out, err) =
            tools::run_with_input(cmd, serde_json::to_vec(input).expect("json").as_slice(), timeout);
        let err = String::from_utf8_lossy(&err);
        assert!(
            status.success(),
            "{} {args:?} failed with {status}; stderr:\n{err}",
            script.display()
        );
        let answer: serde_json::Value = serde_json::from_slice(&out).unwrap_or_else(|e| {
            panic!(
                "{} printed no valid JSON ({e}); stdout:\n{}\nstderr:\n{err}",
                script.display(),
                String::from_utf8_lossy(&out)
            )
        });
        if let Some(name) = answer.get("client").and_then(|c| c.as_str()) {
            eprintln!(
                "[{name}] {}",
                args.first().map(String::as_str).unwrap_or_default()
            );
        }
        answer
    }

    /// Python: produce `records` to `topic` with acks=all; returns the offsets in input order.
    pub fn python_produce(
        client: PythonClient,
        bootstrap: &str,
        topic: &str,
        records: &[TestRecord],
    ) -> Vec<i64> {
        python_produce_with(client, bootstrap, topic, records, &[], Duration::from_secs(120)).0
    }

    /// Like [`python_produce`], with extra `produce` options for the script (e.g.
    /// `--idempotence default`, `--chunk 50 --pause-ms 20`; see `common.py`) and a time limit.
    /// Returns the offsets in input order and the script's whole JSON answer.
    pub fn python_produce_with(
        client: PythonClient,
        bootstrap: &str,
        topic: &str,
        records: &[TestRecord],
        options: &[&str],
        timeout: Duration,
    ) -> (Vec<i64>, serde_json::Value) {
        let input = serde_json::json!({
            "records": records.iter().map(data::record_to_json).collect::<Vec<_>>()
        });
        let mut args: Vec<String> = vec![
            "produce".into(),
            "--bootstrap".into(),
            bootstrap.into(),
            "--topic".into(),
            topic.into(),
        ];
        args.extend(options.iter().map(|o| o.to_string()));
        let out = python_client(client, &args, &input, timeout);
        let results = out
            .get("results")
            .and_then(|r| r.as_array())
            .expect("results array");
        assert_eq!(
            results.len(),
            records.len(),
            "{client:?} reported {} results",
            results.len()
        );
        let offsets = results
            .iter()
            .zip(records)
            .enumerate()
            .map(|(i, (r, rec))| {
                if let Some(e) = r.get("error").filter(|e| !e.is_null()) {
                    panic!("{client:?} delivery of record {i} failed: {e}");
                }
                let p = r
                    .get("partition")
                    .and_then(|v| v.as_i64())
                    .unwrap_or_else(|| panic!("{client:?} reported no partition for record {i}: {r}"));
                assert_eq!(
                    p,
                    i64::from(rec.partition),
                    "{client:?} delivered record {i} to another partition"
                );
                // confluent-kafka reports a negative (invalid) offset as null.
                r.get("offset")
                    .and_then(|v| v.as_i64())
                    .unwrap_or_else(|| panic!("{client:?} reported no valid offset for record {i}: {r}"))
            })
            .collect();
        (offsets, out)
    }

    /// Python: read each partition `p` in `ends` from `start` up to (excluding) `ends[p]` with
    /// assign/seek; returns what it read.
    pub fn python_consume(
        client: PythonClient,
        bootstrap: &str,
        topic: &str,
        start: i64,
        ends: &BTreeMap<i32, i64>,
    ) -> Vec<Consumed> {
        let ends_arg = ends
            .iter()
            .map(|(p, e)| format!("{p}={e}"))
            .collect::<Vec<_>>()
            .join(",");
        let out = python_client(
            client,
            &[
                "consume".into(),
                "--bootstrap".into(),
                bootstrap.into(),
                "--topic".into(),
                topic.into(),
                "--start".into(),
                start.to_string(),
                "--ends".into(),
                ends_arg,
            ],
            &serde_json::json!({}),
            Duration::from_secs(120),
        );
        out.get("messages")
            .and_then(|m| m.as_array())
            .expect("messages array")
            .iter()
            .map(|m| data::consumed_from_json(m).unwrap_or_else(|e| panic!("{client:?} output: {e}")))
            .collect()
    }
}

/// Consumer groups driven by real clients: group members, what they report, and a log of it.
///
/// A *member* is one group consumer ([`group::Member`]):
///
/// * an `rdkafka` consumer (`BaseConsumer`, `subscribe`) polled on its own thread of the test
///   process ([`group::Member::rdkafka_thread`]);
/// * a child process ([`group::Member::child`]) running the same `rdkafka` loop (the crate's
///   `strand-group-consumer` binary, see [`group::rdkafka_child_command`]) or the `group` mode of
///   a Python script ([`group::python_group_command`]). A child can be killed with SIGKILL
///   ([`group::Member::kill9`]): a real crash, which sends no LeaveGroup and no last commit.
///
/// Every member reports what happens to it as [`group::Event`]s, collected with the member's
/// name and arrival time in one [`group::EventLog`] per test. A child writes them on stdout as
/// JSON lines (one object per line, flushed at once):
///
/// ```text
/// {"ev": "assigned", "partitions": [0, 3]}                    whole current assignment, after each change
/// {"ev": "records", "records": [[partition, offset, "value"], ...]}  consumed, in order (value as UTF-8)
/// {"ev": "committed", "offsets": [[partition, next_offset], ...]}    a synchronous commit succeeded
/// {"ev": "commit_failed", "offsets": [[partition, next_offset], ...], "error": "..."}
/// {"ev": "error", "error": "..."}                             a client error (non-fatal)
/// {"ev": "note", "note": "..."}
/// {"ev": "closed"}                                            the consumer was closed (LeaveGroup sent)
/// ```
///
/// and stops when its stdin reaches EOF ([`group::Member::stop`] closes it). Its stderr goes to the
/// test's stderr, prefixed with the member's name.
///
/// Commit discipline, the same for every client: auto-commit off; a member commits what it has
/// consumed synchronously every [`group::MemberSpec::commit_interval_ms`], and in the revocation
/// callback for the partitions it gives up (so a graceful rebalance hands partitions over without
/// re-delivery); on stop it commits what it consumed and closes its consumer (LeaveGroup).
/// [`group::MemberSpec::freeze_commits_after`] stops every commit once the member has consumed
/// that many records, which leaves an uncommitted tail behind a crash.
pub mod group {
    use super::*;
    use rdkafka::config::ClientConfig;
    use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
    use rdkafka::message::Message;
    use rdkafka::{ClientContext, Offset, TopicPartitionList};
    use serde::Serialize;
    use serde_json::{json, Value};
    use std::collections::BTreeSet;
    use std::io::BufRead;
    use std::sync::atomic::AtomicBool;
    use std::sync::{Arc, Mutex};
    use std::thread::JoinHandle;

    /// One thing that happened to a member.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub enum Event {
        /// The member's whole current assignment (sorted partitions), after each change.
        Assigned(Vec<i32>),
        /// Records consumed, in order: (partition, offset, value as lossy UTF-8).
        Records(Vec<(i32, i64, String)>),
        /// A synchronous commit of these next-offsets succeeded.
        Committed(BTreeMap<i32, i64>),
        /// A commit failed.
        CommitFailed {
            /// What it tried to commit.
            offsets: BTreeMap<i32, i64>,
            /// The client's error.
            error: String,
        },
        /// A client error (the member goes on).
        Error(String),
        /// Diagnostics.
        Note(String),
        /// The consumer was closed (a LeaveGroup was sent).
        Closed,
    }

    fn pairs(m: &BTreeMap<i32, i64>) -> Value {
        Value::Array(m.iter().map(|(p, o)| json!([p, o])).collect())
    }

    fn parse_pairs(v: Option<&Value>) -> Result<BTreeMap<i32, i64>, String> {
        let arr = v
            .and_then(Value::as_array)
            .ok_or_else(|| "missing offsets".to_string())?;
        arr.iter()
            .map(|pair| {
                let p = pair.get(0).and_then(Value::as_i64);
                let o = pair.get(1).and_then(Value::as_i64);
                match (p, o) {
                    (Some(p), Some(o)) => Ok((p as i32, o)),
                    _ => Err(format!("bad offset pair {pair}")),
                }
            })
            .collect()
    }

    impl Event {
        /// The JSON-lines form (see the module documentation).
        pub fn to_json(&self) -> Value {
            match self {
                Event::Assigned(ps) => json!({"ev": "assigned", "partitions": ps}),
                Event::Records(rs) => json!({
                    "ev": "records",
                    "records": rs.iter().map(|(p, o, v)| json!([p, o, v])).collect::<Vec<_>>()
                }),
                Event::Committed(m) => json!({"ev": "committed", "offsets": pairs(m)}),
                Event::CommitFailed { offsets, error } => {
                    json!({"ev": "commit_failed", "offsets": pairs(offsets), "error": error})
                }
                Event::Error(e) => json!({"ev": "error", "error": e}),
                Event::Note(n) => json!({"ev": "note", "note": n}),
                Event::Closed => json!({"ev": "closed"}),
            }
        }

        /// Parses the JSON-lines form.
        pub fn from_json(v: &Value) -> Result<Event, String> {
            let text = |name: &str| {
                v.get(name)
                    .and_then(Value::as_str)
                    .map(str::to_string)
                    .ok_or_else(|| format!("missing {name} in {v}"))
            };
            match v.get("ev").and_then(Value::as_str) {
                Some("assigned") => {
                    let mut ps: Vec<i32> = v
                        .get("partitions")
                        .and_then(Value::as_array)
                        .ok_or_else(|| format!("missing partitions in {v}"))?
                        .iter()
                        .map(|p| {
                            p.as_i64()
                                .map(|p| p as i32)
                                .ok_or_else(|| format!("bad partition {p}"))
                        })
                        .collect::<Result<_, _>>()?;
                    ps.sort_unstable();
                    Ok(Event::Assigned(ps))
                }
                Some("records") => v
                    .get("records")
                    .and_then(Value::as_array)
                    .ok_or_else(|| format!("missing records in {v}"))?
                    .iter()
                    .map(|r| {
                        let p = r.get(0).and_then(Value::as_i64);
                        let o = r.get(1).and_then(Value::as_i64);
                        let val = r.get(2).map(|x| x.as_str().unwrap_or("").to_string());
                        match (p, o, val) {
                            (Some(p), Some(o), Some(val)) => Ok((p as i32, o, val)),
                            _ => Err(format!("bad record {r}")),
                        }
                    })
                    .collect::<Result<_, _>>()
                    .map(Event::Records),
                Some("committed") => Ok(Event::Committed(parse_pairs(v.get("offsets"))?)),
                Some("commit_failed") => Ok(Event::CommitFailed {
                    offsets: parse_pairs(v.get("offsets"))?,
                    error: text("error")?,
                }),
                Some("error") => Ok(Event::Error(text("error")?)),
                Some("note") => Ok(Event::Note(text("note")?)),
                Some("closed") => Ok(Event::Closed),
                _ => Err(format!("unknown event {v}")),
            }
        }
    }

    /// An event with the member that reported it and when the test process received it.
    #[derive(Clone, Debug)]
    pub struct Logged {
        /// The member's name.
        pub member: String,
        /// Arrival time.
        pub at: Instant,
        /// The event.
        pub event: Event,
    }

    /// Every member's events, in arrival order; shared by the members' threads.
    #[derive(Clone, Default)]
    pub struct EventLog {
        inner: crate::SharedLog<Logged>,
    }

    impl EventLog {
        /// An empty log.
        pub fn new() -> EventLog {
            EventLog::default()
        }

        /// Appends an event of `member`.
        pub fn push(&self, member: &str, event: Event) {
            self.inner.push(Logged {
                member: member.to_string(),
                at: Instant::now(),
                event,
            });
        }

        /// A copy of everything so far.
        pub fn snapshot(&self) -> Vec<Logged> {
            self.inner.snapshot()
        }

        /// Waits until `check` (called on the whole log after each new event, and at least every
        /// 100 ms) returns `Some`; panics after `timeout` with `what` and a summary of the log.
        pub fn wait_for<T>(
            &self,
            timeout: Duration,
            what: &str,
            check: impl FnMut(&[Logged]) -> Option<T>,
        ) -> T {
            self.inner.wait_for(timeout, what, check, summarize)
        }

        /// A per-member summary (assignment, records, last commit, errors) for failure messages.
        pub fn summary(&self) -> String {
            summarize(&self.snapshot())
        }
    }

    /// The latest assignment each member reported.
    pub fn assignments(log: &[Logged]) -> BTreeMap<String, Vec<i32>> {
        let mut out = BTreeMap::new();
        for l in log {
            if let Event::Assigned(ps) = &l.event {
                out.insert(l.member.clone(), ps.clone());
            }
        }
        out
    }

    /// Every record consumed: (member, arrival, partition, offset, value), in arrival order.
    pub fn records(log: &[Logged]) -> Vec<(&str, Instant, i32, i64, &str)> {
        let mut out = Vec::new();
        for l in log {
            if let Event::Records(rs) = &l.event {
                for (p, o, v) in rs {
                    out.push((l.member.as_str(), l.at, *p, *o, v.as_str()));
                }
            }
        }
        out
    }

    #[derive(Default)]
    struct MemberSummary {
        assignment: Vec<i32>,
        records: usize,
        committed: BTreeMap<i32, i64>,
        notes: Vec<String>,
    }

    fn summarize(log: &[Logged]) -> String {
        let mut members: BTreeMap<&str, MemberSummary> = BTreeMap::new();
        for l in log {
            let m = members.entry(l.member.as_str()).or_default();
            match &l.event {
                Event::Assigned(ps) => m.assignment = ps.clone(),
                Event::Records(rs) => m.records += rs.len(),
                Event::Committed(c) => m.committed.extend(c),
                Event::CommitFailed { error, .. } => m.notes.push(format!("commit failed: {error}")),
                Event::Error(e) => m.notes.push(e.clone()),
                Event::Note(n) => m.notes.push(n.clone()),
                Event::Closed => m.notes.push("closed".into()),
            }
        }
        members
            .iter()
            .map(|(name, m)| {
                let last: Vec<&String> = m.notes.iter().rev().take(5).collect();
                format!(
                    "  {name}: assignment {:?}, {} records, committed {:?}, last errors/notes {last:?}",
                    m.assignment, m.records, m.committed
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// What a member does; also the command-line argument of the child programs (as JSON).
    #[derive(Clone, Debug, Serialize, serde::Deserialize)]
    pub struct MemberSpec {
        /// `bootstrap.servers`.
        pub bootstrap: String,
        /// `group.id`.
        pub group: String,
        /// The one topic it subscribes to.
        pub topic: String,
        /// Client settings, applied last. librdkafka names for rdkafka and confluent-kafka; for
        /// kafka-python, `KafkaConsumer` keyword arguments (numbers are converted;
        /// `partition_assignment_strategy` is a comma-separated list of assignor names).
        pub config: BTreeMap<String, String>,
        /// Commit what was consumed this often (0: only on revocation and stop).
        pub commit_interval_ms: u64,
        /// Stop committing (periodic, on revocation and on stop) once this many records were
        /// consumed.
        pub freeze_commits_after: Option<u64>,
    }

    impl MemberSpec {
        /// A spec with no extra settings, committing every 200 ms.
        pub fn new(bootstrap: &str, group: &str, topic: &str) -> MemberSpec {
            MemberSpec {
                bootstrap: bootstrap.to_string(),
                group: group.to_string(),
                topic: topic.to_string(),
                config: BTreeMap::new(),
                commit_interval_ms: 200,
                freeze_commits_after: None,
            }
        }

        /// Adds a client setting.
        pub fn set(mut self, key: &str, value: impl ToString) -> MemberSpec {
            self.config.insert(key.to_string(), value.to_string());
            self
        }
    }

    /// Where a member's events go.
    pub type Emit = Arc<dyn Fn(Event) + Send + Sync>;

    #[derive(Default)]
    struct MemberState {
        /// Next offset per partition consumed since the last commit of that partition.
        pending: BTreeMap<i32, i64>,
        buffered: Vec<(i32, i64, String)>,
        consumed: u64,
        frozen: bool,
        last_assignment: Option<Vec<i32>>,
    }

    struct MemberCtx {
        topic: String,
        emit: Emit,
        state: Mutex<MemberState>,
    }

    impl MemberCtx {
        fn lock(&self) -> std::sync::MutexGuard<'_, MemberState> {
            self.state.lock().unwrap_or_else(|e| e.into_inner())
        }

        fn flush_records(&self, st: &mut MemberState) {
            if !st.buffered.is_empty() {
                (self.emit)(Event::Records(std::mem::take(&mut st.buffered)));
            }
        }

        /// Commits (synchronously) the pending offsets of `only` (all if `None`); removes the
        /// partitions of `only` from the pending set whatever the outcome.
        fn commit(&self, consumer: &BaseConsumer<MemberCtx>, only: Option<&BTreeSet<i32>>) {
            let offsets: BTreeMap<i32, i64> = {
                let mut st = self.lock();
                self.flush_records(&mut st);
                let chosen: BTreeMap<i32, i64> = st
                    .pending
                    .iter()
                    .filter(|(p, _)| only.is_none_or(|o| o.contains(p)))
                    .map(|(p, o)| (*p, *o))
                    .collect();
                if let Some(only) = only {
                    st.pending.retain(|p, _| !only.contains(p));
                }
                if st.frozen {
                    return;
                }
                chosen
            };
            if offsets.is_empty() {
                return;
            }
            let mut tpl = TopicPartitionList::new();
            for (p, o) in &offsets {
                if let Err(e) = tpl.add_partition_offset(&self.topic, *p, Offset::Offset(*o)) {
                    (self.emit)(Event::Error(format!("building the commit: {e}")));
                    return;
                }
            }
            match consumer.commit(&tpl, CommitMode::Sync) {
                Ok(()) => {
                    let mut st = self.lock();
                    for (p, o) in &offsets {
                        if st.pending.get(p) == Some(o) {
                            st.pending.remove(p);
                        }
                    }
                    drop(st);
                    (self.emit)(Event::Committed(offsets));
                }
                Err(e) => (self.emit)(Event::CommitFailed {
                    offsets,
                    error: e.to_string(),
                }),
            }
        }

        fn report_assignment(&self, consumer: &BaseConsumer<MemberCtx>) {
            match consumer.assignment() {
                Ok(tpl) => {
                    let mut ps: Vec<i32> = tpl.elements().iter().map(|e| e.partition()).collect();
                    ps.sort_unstable();
                    let mut st = self.lock();
                    if st.last_assignment.as_ref() != Some(&ps) {
                        self.flush_records(&mut st);
                        st.last_assignment = Some(ps.clone());
                        drop(st);
                        (self.emit)(Event::Assigned(ps));
                    }
                }
                Err(e) => (self.emit)(Event::Error(format!("assignment(): {e}"))),
            }
        }
    }

    impl ClientContext for MemberCtx {
        fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
            (self.emit)(Event::Error(format!("{error}: {reason}")));
        }
    }

    impl ConsumerContext for MemberCtx {
        fn pre_rebalance(&self, consumer: &BaseConsumer<MemberCtx>, rebalance: &Rebalance<'_>) {
            match rebalance {
                Rebalance::Revoke(tpl) => {
                    let revoked: BTreeSet<i32> = tpl.elements().iter().map(|e| e.partition()).collect();
                    self.commit(consumer, Some(&revoked));
                }
                Rebalance::Error(e) => (self.emit)(Event::Error(format!("rebalance error: {e}"))),
                Rebalance::Assign(_) => {}
            }
        }

        fn post_rebalance(&self, consumer: &BaseConsumer<MemberCtx>, _rebalance: &Rebalance<'_>) {
            self.report_assignment(consumer);
        }
    }

    /// The rdkafka member loop: subscribes, polls until `stop`, commits as the module documentation
    /// says, then commits what it consumed and closes the consumer (bounded: 15 s).
    pub fn run_rdkafka_member(spec: &MemberSpec, stop: &AtomicBool, emit: Emit) {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", &spec.bootstrap)
            .set("broker.address.family", "v4")
            .set("group.id", &spec.group)
            .set("enable.auto.commit", "false")
            .set("auto.offset.reset", "earliest")
            .set("enable.partition.eof", "false");
        for (k, v) in &spec.config {
            config.set(k, v);
        }
        let ctx = MemberCtx {
            topic: spec.topic.clone(),
            emit: emit.clone(),
            state: Mutex::new(MemberState::default()),
        };
        let consumer: BaseConsumer<MemberCtx> = match config.create_with_context(ctx) {
            Ok(c) => c,
            Err(e) => {
                emit(Event::Error(format!("cannot create the consumer: {e}")));
                return;
            }
        };
        if let Err(e) = consumer.subscribe(&[&spec.topic]) {
            emit(Event::Error(format!("subscribe: {e}")));
            return;
        }
        let ctx = consumer.context();
        let commit_interval = Duration::from_millis(spec.commit_interval_ms);
        let mut last_commit = Instant::now();
        let mut last_flush = Instant::now();
        while !stop.load(Ordering::Relaxed) {
            match consumer.poll(Duration::from_millis(50)) {
                None => {}
                Some(Ok(m)) => {
                    let value = String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned();
                    let mut st = ctx.lock();
                    st.buffered.push((m.partition(), m.offset(), value));
                    st.pending.insert(m.partition(), m.offset() + 1);
                    st.consumed += 1;
                    if spec.freeze_commits_after.is_some_and(|n| st.consumed >= n) && !st.frozen {
                        st.frozen = true;
                        ctx.flush_records(&mut st);
                        drop(st);
                        emit(Event::Note("commits frozen".into()));
                    }
                }
                Some(Err(e)) => emit(Event::Error(format!("poll: {e}"))),
            }
            if last_flush.elapsed() >= Duration::from_millis(20) || ctx.lock().buffered.len() >= 500 {
                let mut st = ctx.lock();
                ctx.flush_records(&mut st);
                last_flush = Instant::now();
            }
            if !commit_interval.is_zero() && last_commit.elapsed() >= commit_interval {
                ctx.commit(&consumer, None);
                last_commit = Instant::now();
            }
        }
        ctx.commit(&consumer, None);
        // A bounded close (BaseConsumer's Drop would wait for it without a limit).
        match consumer.close_queue() {
            Ok(()) => {
                let deadline = Instant::now() + Duration::from_secs(15);
                while !consumer.closed() && Instant::now() < deadline {
                    let _ = consumer.poll(Duration::from_millis(100));
                }
                if consumer.closed() {
                    emit(Event::Closed);
                } else {
                    emit(Event::Error("the consumer did not close within 15 s".into()));
                }
            }
            Err(e) => emit(Event::Error(format!("close: {e}"))),
        }
    }

    /// The `strand-group-consumer` child program: `<program> '<MemberSpec as JSON>'`; events on
    /// stdout as JSON lines; stops at EOF on stdin.
    pub fn child_main() -> i32 {
        let Some(arg) = std::env::args().nth(1) else {
            eprintln!("usage: strand-group-consumer '<member spec as JSON>'");
            return 2;
        };
        let spec: MemberSpec = match serde_json::from_str(&arg) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("bad member spec: {e}");
                return 2;
            }
        };
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        std::thread::spawn(move || {
            let mut sink = Vec::new();
            let _ = std::io::stdin().read_to_end(&mut sink);
            stop2.store(true, Ordering::Relaxed);
        });
        let emit: Emit = Arc::new(|ev: Event| {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{}", ev.to_json());
            let _ = out.flush();
        });
        run_rdkafka_member(&spec, &stop, emit);
        0
    }

    enum Kind {
        Thread {
            stop: Arc<AtomicBool>,
            handle: Option<JoinHandle<()>>,
        },
        Child {
            child: Child,
            reader: Option<JoinHandle<()>>,
        },
    }

    /// A running member (see the module documentation). Dropping it stops a thread member (without
    /// waiting) and kills a child.
    pub struct Member {
        /// Its name in the [`EventLog`].
        pub name: String,
        kind: Kind,
    }

    impl Member {
        /// An rdkafka member on a thread of this process.
        pub fn rdkafka_thread(name: &str, spec: MemberSpec, log: &EventLog) -> Member {
            let stop = Arc::new(AtomicBool::new(false));
            let (stop2, log2, name2) = (stop.clone(), log.clone(), name.to_string());
            let emit: Emit = Arc::new(move |ev| log2.push(&name2, ev));
            let handle = std::thread::Builder::new()
                .name(format!("member-{name}"))
                .spawn(move || run_rdkafka_member(&spec, &stop2, emit))
                .expect("spawn a member thread");
            Member {
                name: name.to_string(),
                kind: Kind::Thread {
                    stop,
                    handle: Some(handle),
                },
            }
        }

        /// A member in a child process that speaks the JSON-lines protocol.
        pub fn child(name: &str, mut cmd: Command, log: &EventLog) -> Member {
            cmd.stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            let mut child = cmd
                .spawn()
                .unwrap_or_else(|e| panic!("cannot start member {name} ({cmd:?}): {e}"));
            let stdout = child.stdout.take().expect("stdout pipe");
            let stderr = child.stderr.take().expect("stderr pipe");
            let (log2, name2) = (log.clone(), name.to_string());
            let reader = std::thread::spawn(move || {
                for line in std::io::BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    if line.trim().is_empty() {
                        continue;
                    }
                    let ev = serde_json::from_str::<Value>(&line)
                        .map_err(|e| e.to_string())
                        .and_then(|v| Event::from_json(&v))
                        .unwrap_or_else(|e| Event::Error(format!("unparsable line {line:?}: {e}")));
                    log2.push(&name2, ev);
                }
            });
            let name3 = name.to_string();
            std::thread::spawn(move || {
                for line in std::io::BufReader::new(stderr).lines() {
                    let Ok(line) = line else { break };
                    eprintln!("[{name3}] {line}");
                }
            });
            Member {
                name: name.to_string(),
                kind: Kind::Child {
                    child,
                    reader: Some(reader),
                },
            }
        }

        /// The child's process id (`None` for a thread member).
        pub fn pid(&self) -> Option<u32> {
            match &self.kind {
                Kind::Child { child, .. } => Some(child.id()),
                Kind::Thread { .. } => None,
            }
        }

        /// SIGKILLs a child member and waits for it and for the end of its output. Panics for a
        /// thread member or a child that already exited.
        pub fn kill9(&mut self) {
            let name = self.name.clone();
            match &mut self.kind {
                Kind::Child { child, reader } => {
                    if let Ok(Some(status)) = child.try_wait() {
                        panic!("member {name} exited by itself ({status}) before it was killed");
                    }
                    child.kill().expect("SIGKILL the member");
                    child.wait().expect("wait for the killed member");
                    if let Some(r) = reader.take() {
                        let _ = r.join();
                    }
                }
                Kind::Thread { .. } => panic!("member {name} is a thread; only a child can be killed"),
            }
        }

        /// Asks the member to stop (commit, close) and waits up to `timeout` for it. Panics if it
        /// does not end in time or a child fails.
        pub fn stop(mut self, timeout: Duration) {
            let name = self.name.clone();
            let deadline = Instant::now() + timeout;
            match &mut self.kind {
                Kind::Thread { stop, handle } => {
                    stop.store(true, Ordering::Relaxed);
                    if let Some(h) = handle.take() {
                        while !h.is_finished() {
                            assert!(
                                Instant::now() < deadline,
                                "member {name} did not stop within {timeout:?}"
                            );
                            std::thread::sleep(Duration::from_millis(20));
                        }
                        if h.join().is_err() {
                            panic!("member {name}'s thread panicked");
                        }
                    }
                }
                Kind::Child { child, reader } => {
                    drop(child.stdin.take());
                    let status = loop {
                        if let Some(s) = child.try_wait().expect("try_wait on a member") {
                            break s;
                        }
                        if Instant::now() >= deadline {
                            let _ = child.kill();
                            let _ = child.wait();
                            panic!("member {name} did not stop within {timeout:?}");
                        }
                        std::thread::sleep(Duration::from_millis(20));
                    };
                    if let Some(r) = reader.take() {
                        let _ = r.join();
                    }
                    assert!(status.success(), "member {name} exited with {status}");
                }
            }
        }
    }

    impl Drop for Member {
        fn drop(&mut self) {
            match &mut self.kind {
                Kind::Thread { stop, .. } => stop.store(true, Ordering::Relaxed),
                Kind::Child { child, .. } => {
                    let _ = child.kill();
                    let _ = child.wait();
                }
            }
        }
    }

    /// The command of an rdkafka child member: `bin` is the `strand-group-consumer` binary
    /// (`env!("CARGO_BIN_EXE_strand-group-consumer")` in this crate's integration tests).
    pub fn rdkafka_child_command(bin: &Path, spec: &MemberSpec) -> Command {
        let mut cmd = Command::new(bin);
        cmd.arg(serde_json::to_string(spec).expect("spec as JSON"));
        cmd
    }

    /// The command of a Python member: `<script> group --spec '<MemberSpec as JSON>'`.
    pub fn python_group_command(client: clients::PythonClient, spec: &MemberSpec) -> Command {
        let mut cmd = Command::new(tools::python());
        cmd.arg(tools::python_scripts_dir().join(client.script()))
            .arg("group")
            .arg("--spec")
            .arg(serde_json::to_string(spec).expect("spec as JSON"))
            .env_remove("LD_LIBRARY_PATH");
        cmd
    }
}

// =============================================================================================
// Share groups (KIP-932): `pub mod share`. A self-contained section; nothing above depends on it.
// =============================================================================================

/// Kafka share groups (KIP-932) driven by a real client: confluent-kafka's `ShareConsumer`
/// members in child processes, what they report, group configs, raw share requests and the
/// dead-letter topic as kcat shows it.
///
/// A member ([`share::ShareMember`]) runs `compat-tests/python/share_client.py member --spec
/// '<ShareSpec as JSON>'`. It polls and acknowledges as its [`share::ShareSpec`] says and writes
/// [`share::ShareEvent`]s as JSON lines (the protocol is in the script's docstring), collected
/// with the member's name in one [`share::ShareLog`] per test. Each event carries the member's
/// wall-clock time in ms (`time.time()`), the same clock as [`share::now_ms`], so holds of one
/// record by different members (or by an HTTP worker) can be compared. It stops at EOF on stdin
/// ([`share::ShareMember::stop`]: commit, `close()`, which leaves the group) or dies by SIGKILL
/// ([`share::ShareMember::kill9`]: no acknowledgement, no leave). A *stepped* member polls only
/// when told ([`share::ShareMember::step`]).
pub mod share {
    use super::*;
    use kafka_protocol::messages::incremental_alter_configs_request::{
        AlterConfigsResource, AlterableConfig,
    };
    use kafka_protocol::messages::share_fetch_request::{FetchPartition, FetchTopic};
    use kafka_protocol::messages::{
        share_acknowledge_request, share_fetch_request, GroupId, IncrementalAlterConfigsRequest,
        ShareAcknowledgeRequest, ShareAcknowledgeResponse, ShareFetchRequest, ShareFetchResponse,
        ShareGroupDescribeRequest, ShareGroupDescribeResponse, ShareGroupHeartbeatRequest,
        ShareGroupHeartbeatResponse, TopicName,
    };
    use kafka_protocol::protocol::StrBytes;
    use raw::RawConn;
    use serde::Serialize;
    use serde_json::Value;
    use std::collections::BTreeSet;
    use std::io::BufRead;
    use std::thread::JoinHandle;

    /// Request versions (KIP-932 v1, what Kafka 4.1 and librdkafka 2.16 use).
    pub mod versions {
        /// ShareGroupHeartbeat.
        pub const HEARTBEAT: i16 = 1;
        /// ShareGroupDescribe.
        pub const DESCRIBE: i16 = 1;
        /// ShareFetch.
        pub const FETCH: i16 = 1;
        /// ShareAcknowledge.
        pub const ACKNOWLEDGE: i16 = 1;
        /// IncrementalAlterConfigs.
        pub const INCREMENTAL_ALTER_CONFIGS: i16 = 1;
    }

    /// Config resource type GROUP (KIP-848 group configs).
    pub const RESOURCE_GROUP: i8 = 32;

    /// Milliseconds since the Unix epoch, the clock the members' event times use.
    pub fn now_ms() -> f64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64() * 1000.0)
            .unwrap_or(0.0)
    }

    /// What a member does (the `--spec` of `share_client.py member`; see its docstring).
    #[derive(Clone, Debug, Serialize)]
    pub struct ShareSpec {
        /// `bootstrap.servers`.
        pub bootstrap: String,
        /// `group.id`.
        pub group: String,
        /// Subscribed topics.
        pub topics: Vec<String>,
        /// librdkafka settings, applied last.
        pub config: BTreeMap<String, String>,
        /// `explicit` or `implicit` (`share.acknowledgement.mode`).
        pub mode: String,
        /// `"<partition>:<offset>"` -> action at delivery count 1, 2, ... (the last repeats).
        pub actions: BTreeMap<String, Vec<String>>,
        /// `accept`, `release`, `reject` or `hold`.
        pub default_action: String,
        /// Partition (as text) -> first offset held by default.
        pub hold_from: BTreeMap<String, i64>,
        /// `sync` (commit_sync after each poll's acknowledgements) or `none`.
        pub commit: String,
        /// Stop polling after this many polls that returned records.
        pub max_polls: Option<u64>,
        /// Simulated work per record, before acknowledging.
        pub work_ms_per_record: f64,
        /// Poll timeout.
        pub poll_timeout_ms: u64,
        /// Poll only on [`ShareMember::step`].
        pub stepped: bool,
        /// How long a step polls for records at most.
        pub step_timeout_ms: u64,
    }

    impl ShareSpec {
        /// Explicit acknowledgement, every record accepted and committed at once.
        pub fn new(bootstrap: &str, group: &str, topic: &str) -> ShareSpec {
            ShareSpec {
                bootstrap: bootstrap.to_string(),
                group: group.to_string(),
                topics: vec![topic.to_string()],
                config: BTreeMap::new(),
                mode: "explicit".into(),
                actions: BTreeMap::new(),
                default_action: "accept".into(),
                hold_from: BTreeMap::new(),
                commit: "sync".into(),
                max_polls: None,
                work_ms_per_record: 0.0,
                poll_timeout_ms: 100,
                stepped: false,
                step_timeout_ms: 10_000,
            }
        }

        /// A librdkafka setting.
        pub fn set(mut self, key: &str, value: impl ToString) -> ShareSpec {
            self.config.insert(key.to_string(), value.to_string());
            self
        }

        /// What to do with record (`partition`, `offset`) at delivery count 1, 2, ...
        pub fn on(mut self, partition: i32, offset: i64, actions: &[AckType]) -> ShareSpec {
            self.actions.insert(
                format!("{partition}:{offset}"),
                actions.iter().map(|a| a.name().to_string()).collect(),
            );
            self
        }

        /// Records of `partition` at or after `offset` are held (never acknowledged).
        pub fn hold_from(mut self, partition: i32, offset: i64) -> ShareSpec {
            self.hold_from.insert(partition.to_string(), offset);
            self
        }

        /// Holds every record it gets (and so stops polling after its first records).
        pub fn hold_all(mut self) -> ShareSpec {
            self.default_action = "hold".into();
            self
        }

        /// Implicit acknowledgement (records accepted on the next poll / commit).
        pub fn implicit(mut self) -> ShareSpec {
            self.mode = "implicit".into();
            self
        }

        /// Acknowledges without committing: the acknowledgements go with the next poll or close.
        pub fn no_commit(mut self) -> ShareSpec {
            self.commit = "none".into();
            self
        }

        /// Stops polling after `n` polls that returned records.
        pub fn max_polls(mut self, n: u64) -> ShareSpec {
            self.max_polls = Some(n);
            self
        }

        /// Simulated work per record.
        pub fn work_ms_per_record(mut self, ms: f64) -> ShareSpec {
            self.work_ms_per_record = ms;
            self
        }

        /// Polls only on [`ShareMember::step`].
        pub fn stepped(mut self) -> ShareSpec {
            self.stepped = true;
            self
        }
    }

    /// An acknowledgement type (KIP-932: 1 accept, 2 release, 3 reject).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
    pub enum AckType {
        /// ACCEPT: done.
        Accept,
        /// RELEASE: available again (counts as a delivery).
        Release,
        /// REJECT: archived (dead-lettered when the group has a dead-letter topic).
        Reject,
    }

    impl AckType {
        /// The script's name.
        pub fn name(self) -> &'static str {
            match self {
                AckType::Accept => "accept",
                AckType::Release => "release",
                AckType::Reject => "reject",
            }
        }

        /// Parses the script's name.
        pub fn parse(s: &str) -> Option<AckType> {
            match s {
                "accept" => Some(AckType::Accept),
                "release" => Some(AckType::Release),
                "reject" => Some(AckType::Reject),
                _ => None,
            }
        }

        /// The protocol's `AcknowledgeTypes` value.
        pub fn code(self) -> i8 {
            match self {
                AckType::Accept => 1,
                AckType::Release => 2,
                AckType::Reject => 3,
            }
        }
    }

    /// A record a poll returned.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct Acquired {
        /// Partition.
        pub partition: i32,
        /// Offset.
        pub offset: i64,
        /// `Message.delivery_count()` (0 when the client gave none).
        pub delivery_count: i32,
        /// The value as lossy UTF-8.
        pub value: String,
    }

    /// One thing that happened to a member (see the script's docstring). `t_ms`: the member's
    /// clock, ms since the Unix epoch.
    #[derive(Clone, Debug, PartialEq)]
    pub enum ShareEvent {
        /// Subscribed; `client` names the client library versions.
        Subscribed { t_ms: f64, client: String },
        /// A poll returned these records.
        Acquired { t_ms: f64, records: Vec<Acquired> },
        /// Acknowledgements about to be sent.
        AcksSent {
            t_ms: f64,
            acks: Vec<(i32, i64, AckType)>,
        },
        /// The broker's answer to acknowledgements of one partition.
        AckResult {
            t_ms: f64,
            partition: i32,
            offsets: Vec<i64>,
            error: Option<String>,
        },
        /// commit_sync returned: per partition, its error.
        Commit {
            t_ms: f64,
            results: Vec<(i32, Option<String>)>,
        },
        /// Records kept without acknowledgement; the member stopped polling.
        Holding { t_ms: f64, records: Vec<(i32, i64)> },
        /// A step (stepped member) was served; how many records it returned.
        StepDone { t_ms: f64, records: usize },
        /// A client error.
        Error(String),
        /// Diagnostics.
        Note(String),
        /// close() returned.
        Closed { t_ms: f64 },
    }

    fn f(v: &Value, k: &str) -> Result<f64, String> {
        v.get(k)
            .and_then(Value::as_f64)
            .ok_or_else(|| format!("missing {k} in {v}"))
    }

    fn pairs(v: Option<&Value>) -> Result<Vec<(i32, i64)>, String> {
        v.and_then(Value::as_array)
            .ok_or_else(|| "missing records".to_string())?
            .iter()
            .map(
                |r| match (r.get(0).and_then(Value::as_i64), r.get(1).and_then(Value::as_i64)) {
                    (Some(p), Some(o)) => Ok((p as i32, o)),
                    _ => Err(format!("bad record {r}")),
                },
            )
            .collect()
    }

    impl ShareEvent {
        /// Parses the JSON-lines form.
        pub fn from_json(v: &Value) -> Result<ShareEvent, String> {
            let text = |k: &str| {
                v.get(k)
                    .and_then(Value::as_str)
                    .map(str::to_string)
                    .ok_or_else(|| format!("missing {k} in {v}"))
            };
            let opt_text = |x: Option<&Value>| x.and_then(Value::as_str).map(str::to_string);
            match v.get("ev").and_then(Value::as_str) {
                Some("subscribed") => Ok(ShareEvent::Subscribed {
                    t_ms: f(v, "t")?,
                    client: text("client")?,
                }),
                Some("acquired") => Ok(ShareEvent::Acquired {
                    t_ms: f(v, "t")?,
                    records: v
                        .get("records")
                        .and_then(Value::as_array)
                        .ok_or_else(|| format!("missing records in {v}"))?
                        .iter()
                        .map(|r| {
                            match (
                                r.get(0).and_then(Value::as_i64),
                                r.get(1).and_then(Value::as_i64),
                                r.get(2),
                                r.get(3).and_then(Value::as_str),
                            ) {
                                (Some(p), Some(o), Some(dc), Some(val)) => Ok(Acquired {
                                    partition: p as i32,
                                    offset: o,
                                    delivery_count: dc.as_i64().unwrap_or(0) as i32,
                                    value: val.to_string(),
                                }),
                                _ => Err(format!("bad record {r}")),
                            }
                        })
                        .collect::<Result<_, _>>()?,
                }),
                Some("acks_sent") => Ok(ShareEvent::AcksSent {
                    t_ms: f(v, "t")?,
                    acks: v
                        .get("acks")
                        .and_then(Value::as_array)
                        .ok_or_else(|| format!("missing acks in {v}"))?
                        .iter()
                        .map(|a| {
                            match (
                                a.get(0).and_then(Value::as_i64),
                                a.get(1).and_then(Value::as_i64),
                                a.get(2).and_then(Value::as_str).and_then(AckType::parse),
                            ) {
                                (Some(p), Some(o), Some(t)) => Ok((p as i32, o, t)),
                                _ => Err(format!("bad ack {a}")),
                            }
                        })
                        .collect::<Result<_, _>>()?,
                }),
                Some("ack_result") => Ok(ShareEvent::AckResult {
                    t_ms: f(v, "t")?,
                    partition: v
                        .get("partition")
                        .and_then(Value::as_i64)
                        .ok_or_else(|| format!("missing partition in {v}"))?
                        as i32,
                    offsets: v
                        .get("offsets")
                        .and_then(Value::as_array)
                        .ok_or_else(|| format!("missing offsets in {v}"))?
                        .iter()
                        .map(|o| o.as_i64().ok_or_else(|| format!("bad offset {o}")))
                        .collect::<Result<_, _>>()?,
                    error: opt_text(v.get("error")),
                }),
                Some("commit") => Ok(ShareEvent::Commit {
                    t_ms: f(v, "t")?,
                    results: v
                        .get("results")
                        .and_then(Value::as_array)
                        .ok_or_else(|| format!("missing results in {v}"))?
                        .iter()
                        .map(|r| match r.get(0).and_then(Value::as_i64) {
                            Some(p) => Ok((p as i32, opt_text(r.get(1)))),
                            None => Err(format!("bad result {r}")),
                        })
                        .collect::<Result<_, _>>()?,
                }),
                Some("holding") => Ok(ShareEvent::Holding {
                    t_ms: f(v, "t")?,
                    records: pairs(v.get("records"))?,
                }),
                Some("step_done") => Ok(ShareEvent::StepDone {
                    t_ms: f(v, "t")?,
                    records: v.get("records").and_then(Value::as_u64).unwrap_or(0) as usize,
                }),
                Some("error") => Ok(ShareEvent::Error(text("error")?)),
                Some("note") => Ok(ShareEvent::Note(text("note")?)),
                Some("closed") => Ok(ShareEvent::Closed { t_ms: f(v, "t")? }),
                _ => Err(format!("unknown event {v}")),
            }
        }
    }

    /// An event with the member that reported it.
    #[derive(Clone, Debug)]
    pub struct Logged {
        /// The member's name.
        pub member: String,
        /// The event.
        pub event: ShareEvent,
    }

    /// Every member's events in arrival order (per member: in the member's order).
    #[derive(Clone, Default)]
    pub struct ShareLog {
        inner: crate::SharedLog<Logged>,
    }

    impl ShareLog {
        /// An empty log.
        pub fn new() -> ShareLog {
            ShareLog::default()
        }

        /// Appends an event of `member`.
        pub fn push(&self, member: &str, event: ShareEvent) {
            self.inner.push(Logged {
                member: member.to_string(),
                event,
            });
        }

        /// A copy of everything so far.
        pub fn snapshot(&self) -> Vec<Logged> {
            self.inner.snapshot()
        }

        /// Waits until `check` (run on the whole log after each event, and at least every 100 ms)
        /// returns `Some`; panics after `timeout` with `what` and a summary of the log.
        pub fn wait_for<T>(
            &self,
            timeout: Duration,
            what: &str,
            check: impl FnMut(&[Logged]) -> Option<T>,
        ) -> T {
            self.inner.wait_for(timeout, what, check, summarize)
        }

        /// Per member: records acquired, acknowledgements, last errors (for failure messages).
        pub fn summary(&self) -> String {
            summarize(&self.snapshot())
        }
    }

    /// Every record acquired: (member, time, record), in log order.
    pub fn acquired(log: &[Logged]) -> Vec<(&str, f64, &Acquired)> {
        let mut out = Vec::new();
        for l in log {
            if let ShareEvent::Acquired { t_ms, records } = &l.event {
                out.extend(records.iter().map(|r| (l.member.as_str(), *t_ms, r)));
            }
        }
        out
    }

    /// What the broker answered to a member's acknowledgements.
    #[derive(Clone, Debug, Default)]
    pub struct AckResults {
        /// (partition, offset) confirmed (any acknowledgement type).
        pub ok: BTreeSet<(i32, i64)>,
        /// (partition, offset) whose acknowledgement failed, with the error.
        pub failed: BTreeMap<(i32, i64), String>,
    }

    /// The broker's answers to `member`'s acknowledgements.
    pub fn ack_results(log: &[Logged], member: &str) -> AckResults {
        let mut out = AckResults::default();
        for l in log.iter().filter(|l| l.member == member) {
            if let ShareEvent::AckResult {
                partition,
                offsets,
                error,
                ..
            } = &l.event
            {
                for o in offsets {
                    match error {
                        None => {
                            out.ok.insert((*partition, *o));
                        }
                        Some(e) => {
                            out.failed.insert((*partition, *o), e.clone());
                        }
                    }
                }
            }
        }
        out
    }

    /// The client errors and notes a member reported.
    pub fn errors(log: &[Logged], member: &str) -> Vec<String> {
        log.iter()
            .filter(|l| l.member == member)
            .filter_map(|l| match &l.event {
                ShareEvent::Error(e) => Some(e.clone()),
                _ => None,
            })
            .collect()
    }

    fn summarize(log: &[Logged]) -> String {
        #[derive(Default)]
        struct S {
            acquired: usize,
            acked: usize,
            ack_failures: usize,
            notes: Vec<String>,
        }
        let mut members: BTreeMap<&str, S> = BTreeMap::new();
        for l in log {
            let m = members.entry(l.member.as_str()).or_default();
            match &l.event {
                ShareEvent::Acquired { records, .. } => m.acquired += records.len(),
                ShareEvent::AckResult { offsets, error, .. } => {
                    if error.is_some() {
                        m.ack_failures += offsets.len();
                        m.notes.push(format!("ack failed: {error:?}"));
                    } else {
                        m.acked += offsets.len();
                    }
                }
                ShareEvent::Holding { records, .. } => m.notes.push(format!("holding {}", records.len())),
                ShareEvent::Error(e) => m.notes.push(e.clone()),
                ShareEvent::Note(n) => m.notes.push(n.clone()),
                ShareEvent::Closed { .. } => m.notes.push("closed".into()),
                _ => {}
            }
        }
        members
            .iter()
            .map(|(name, m)| {
                let last: Vec<&String> = m.notes.iter().rev().take(5).collect();
                format!(
                    "  {name}: {} records acquired, {} acknowledged, {} acknowledgements failed, last \
                     errors/notes {last:?}",
                    m.acquired, m.acked, m.ack_failures
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// A member: `share_client.py member` in a child process. Dropping it kills the child.
    pub struct ShareMember {
        /// Its name in the [`ShareLog`].
        pub name: String,
        child: Child,
        reader: Option<JoinHandle<()>>,
    }

    impl ShareMember {
        /// Starts a member; its events go to `log` under `name`.
        pub fn start(name: &str, spec: &ShareSpec, log: &ShareLog) -> ShareMember {
            let mut cmd = Command::new(tools::python());
            cmd.arg(tools::python_scripts_dir().join("share_client.py"))
                .arg("member")
                .arg("--spec")
                .arg(serde_json::to_string(spec).expect("spec as JSON"))
                .env_remove("LD_LIBRARY_PATH")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            let mut child = cmd
                .spawn()
                .unwrap_or_else(|e| panic!("cannot start share member {name} ({cmd:?}): {e}"));
            let stdout = child.stdout.take().expect("stdout pipe");
            let stderr = child.stderr.take().expect("stderr pipe");
            let (log2, name2) = (log.clone(), name.to_string());
            let reader = std::thread::spawn(move || {
                for line in std::io::BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    if line.trim().is_empty() {
                        continue;
                    }
                    let ev = serde_json::from_str::<Value>(&line)
                        .map_err(|e| e.to_string())
                        .and_then(|v| ShareEvent::from_json(&v))
                        .unwrap_or_else(|e| ShareEvent::Error(format!("unparsable line {line:?}: {e}")));
                    log2.push(&name2, ev);
                }
            });
            let name3 = name.to_string();
            std::thread::spawn(move || {
                for line in std::io::BufReader::new(stderr).lines() {
                    let Ok(line) = line else { break };
                    // librdkafka's warning that its share consumer is a preview, on every start.
                    if !line.contains("is in \"Preview\"") {
                        eprintln!("[{name3}] {line}");
                    }
                }
            });
            ShareMember {
                name: name.to_string(),
                child,
                reader: Some(reader),
            }
        }

        /// The child's process id.
        pub fn pid(&self) -> u32 {
            self.child.id()
        }

        /// A stepped member polls until it gets records (or its step timeout passes).
        pub fn step(&mut self) {
            let name = self.name.clone();
            let stdin = self
                .child
                .stdin
                .as_mut()
                .unwrap_or_else(|| panic!("member {name} was already stopped"));
            writeln!(stdin, "poll")
                .and_then(|()| stdin.flush())
                .unwrap_or_else(|e| panic!("cannot tell member {name} to poll: {e}"));
        }

        /// SIGKILLs the member and waits for it and the end of its output. Panics if it had
        /// already exited.
        pub fn kill9(&mut self) {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "share member {} exited by itself ({status}) before it was killed",
                    self.name
                );
            }
            self.child.kill().expect("SIGKILL the member");
            self.child.wait().expect("wait for the killed member");
            if let Some(r) = self.reader.take() {
                let _ = r.join();
            }
        }

        /// Closes its stdin (it commits, closes the consumer, leaves) and waits up to `timeout`.
        /// Panics if it does not end in time or fails.
        pub fn stop(mut self, timeout: Duration) {
            drop(self.child.stdin.take());
            let deadline = Instant::now() + timeout;
            let status = loop {
                if let Some(s) = self.child.try_wait().expect("try_wait on a member") {
                    break s;
                }
                if Instant::now() >= deadline {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    panic!("share member {} did not stop within {timeout:?}", self.name);
                }
                std::thread::sleep(Duration::from_millis(20));
            };
            if let Some(r) = self.reader.take() {
                let _ = r.join();
            }
            assert!(
                status.success(),
                "share member {} exited with {status}",
                self.name
            );
        }
    }

    impl Drop for ShareMember {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    fn s(v: &str) -> StrBytes {
        StrBytes::from_string(v.to_string())
    }

    /// IncrementalAlterConfigs on group `group` (resource type GROUP): `Some(value)` sets,
    /// `None` deletes. Returns the resource's error code and message.
    pub fn alter_group_configs(
        bootstrap: &str,
        group: &str,
        configs: &[(&str, Option<&str>)],
    ) -> (i16, Option<String>) {
        let mut c = admin::connect(bootstrap);
        let req =
            IncrementalAlterConfigsRequest::default().with_resources(vec![AlterConfigsResource::default()
                .with_resource_type(RESOURCE_GROUP)
                .with_resource_name(s(group))
                .with_configs(
                    configs
                        .iter()
                        .map(|(k, v)| {
                            AlterableConfig::default()
                                .with_name(s(k))
                                .with_config_operation(if v.is_some() { 0 } else { 1 })
                                .with_value(v.map(s))
                        })
                        .collect(),
                )]);
        let resp = c
            .request(versions::INCREMENTAL_ALTER_CONFIGS, &req)
            .unwrap_or_else(|e| panic!("IncrementalAlterConfigs on group {group}: {e}"));
        let r = resp
            .responses
            .first()
            .unwrap_or_else(|| panic!("IncrementalAlterConfigs on group {group}: no resource in the answer"));
        (r.error_code, r.error_message.as_ref().map(|m| m.to_string()))
    }

    /// Sets group configs of `group`, failing the test unless the broker accepts them.
    pub fn set_group_configs(bootstrap: &str, group: &str, configs: &[(&str, &str)]) {
        let configs: Vec<(&str, Option<&str>)> = configs.iter().map(|(k, v)| (*k, Some(*v))).collect();
        let (code, message) = alter_group_configs(bootstrap, group, &configs);
        assert_eq!(
            code, 0,
            "setting group configs {configs:?} of {group}: error {code} ({message:?})"
        );
    }

    /// ShareGroupHeartbeat: `topics` is the subscription (`None`: unchanged).
    pub fn heartbeat(
        c: &mut RawConn,
        group: &str,
        member: &str,
        epoch: i32,
        topics: Option<&[&str]>,
    ) -> ShareGroupHeartbeatResponse {
        let req = ShareGroupHeartbeatRequest::default()
            .with_group_id(GroupId(s(group)))
            .with_member_id(s(member))
            .with_member_epoch(epoch)
            .with_subscribed_topic_names(topics.map(|ts| ts.iter().map(|t| TopicName(s(t))).collect()));
        c.request(versions::HEARTBEAT, &req)
            .unwrap_or_else(|e| panic!("ShareGroupHeartbeat {group}/{member}: {e}"))
    }

    /// ShareGroupDescribe of `groups`.
    pub fn describe(c: &mut RawConn, groups: &[&str]) -> ShareGroupDescribeResponse {
        let req = ShareGroupDescribeRequest::default()
            .with_group_ids(groups.iter().map(|g| GroupId(s(g))).collect());
        c.request(versions::DESCRIBE, &req)
            .unwrap_or_else(|e| panic!("ShareGroupDescribe {groups:?}: {e}"))
    }

    /// DescribeShareGroupOffsets v0 of one group: `topics` (name, partitions), `None`: every
    /// topic the group has share state for.
    pub fn describe_offsets(
        c: &mut RawConn,
        group: &str,
        topics: Option<&[(&str, &[i32])]>,
    ) -> kafka_protocol::messages::DescribeShareGroupOffsetsResponse {
        use kafka_protocol::messages::describe_share_group_offsets_request::{
            DescribeShareGroupOffsetsRequestGroup, DescribeShareGroupOffsetsRequestTopic,
        };
        let req = kafka_protocol::messages::DescribeShareGroupOffsetsRequest::default().with_groups(vec![
            DescribeShareGroupOffsetsRequestGroup::default()
                .with_group_id(GroupId(s(group)))
                .with_topics(topics.map(|ts| {
                    ts.iter()
                        .map(|(t, ps)| {
                            DescribeShareGroupOffsetsRequestTopic::default()
                                .with_topic_name(TopicName(s(t)))
                                .with_partitions(ps.to_vec())
                        })
                        .collect()
                })),
        ]);
        c.request(0, &req)
            .unwrap_or_else(|e| panic!("DescribeShareGroupOffsets {group}: {e}"))
    }

    /// DeleteShareGroupOffsets v0 of `group` for `topics`.
    pub fn delete_offsets(
        c: &mut RawConn,
        group: &str,
        topics: &[&str],
    ) -> kafka_protocol::messages::DeleteShareGroupOffsetsResponse {
        use kafka_protocol::messages::delete_share_group_offsets_request::DeleteShareGroupOffsetsRequestTopic;
        let req = kafka_protocol::messages::DeleteShareGroupOffsetsRequest::default()
            .with_group_id(GroupId(s(group)))
            .with_topics(
                topics
                    .iter()
                    .map(|t| DeleteShareGroupOffsetsRequestTopic::default().with_topic_name(TopicName(s(t))))
                    .collect(),
            );
        c.request(0, &req)
            .unwrap_or_else(|e| panic!("DeleteShareGroupOffsets {group}: {e}"))
    }

    /// AlterShareGroupOffsets v0 of `group`: (topic, [(partition, start offset)]).
    pub fn alter_offsets(
        c: &mut RawConn,
        group: &str,
        topics: &[(&str, &[(i32, i64)])],
    ) -> kafka_protocol::messages::AlterShareGroupOffsetsResponse {
        use kafka_protocol::messages::alter_share_group_offsets_request::{
            AlterShareGroupOffsetsRequestPartition, AlterShareGroupOffsetsRequestTopic,
        };
        let req = kafka_protocol::messages::AlterShareGroupOffsetsRequest::default()
            .with_group_id(GroupId(s(group)))
            .with_topics(
                topics
                    .iter()
                    .map(|(t, ps)| {
                        AlterShareGroupOffsetsRequestTopic::default()
                            .with_topic_name(TopicName(s(t)))
                            .with_partitions(
                                ps.iter()
                                    .map(|(p, o)| {
                                        AlterShareGroupOffsetsRequestPartition::default()
                                            .with_partition_index(*p)
                                            .with_start_offset(*o)
                                    })
                                    .collect(),
                            )
                    })
                    .collect(),
            );
        c.request(0, &req)
            .unwrap_or_else(|e| panic!("AlterShareGroupOffsets {group}: {e}"))
    }

    /// Acknowledgement batches of one partition: (first, last, types).
    pub type AckBatches = Vec<(i64, i64, Vec<i8>)>;

    /// A ShareFetch request: `parts` are (topic id, partition, acknowledgement batches).
    pub fn fetch_request(
        group: &str,
        member: &str,
        epoch: i32,
        parts: &[(uuid::Uuid, i32, AckBatches)],
        max_records: i32,
        max_wait_ms: i32,
    ) -> ShareFetchRequest {
        let mut topics: Vec<FetchTopic> = Vec::new();
        for (topic_id, p, acks) in parts {
            let part = FetchPartition::default()
                .with_partition_index(*p)
                .with_partition_max_bytes(1 << 20)
                .with_acknowledgement_batches(
                    acks.iter()
                        .map(|(a, b, t)| {
                            share_fetch_request::AcknowledgementBatch::default()
                                .with_first_offset(*a)
                                .with_last_offset(*b)
                                .with_acknowledge_types(t.clone())
                        })
                        .collect(),
                );
            match topics.iter_mut().find(|t| t.topic_id == *topic_id) {
                Some(t) => t.partitions.push(part),
                None => topics.push(
                    FetchTopic::default()
                        .with_topic_id(*topic_id)
                        .with_partitions(vec![part]),
                ),
            }
        }
        ShareFetchRequest::default()
            .with_group_id(Some(GroupId(s(group))))
            .with_member_id(Some(s(member)))
            .with_share_session_epoch(epoch)
            .with_max_wait_ms(max_wait_ms)
            .with_min_bytes(1)
            .with_max_bytes(8 << 20)
            .with_max_records(max_records)
            .with_batch_size(max_records.max(1))
            .with_topics(topics)
    }

    /// Sends a ShareFetch.
    pub fn fetch(c: &mut RawConn, req: &ShareFetchRequest) -> ShareFetchResponse {
        c.request(versions::FETCH, req)
            .unwrap_or_else(|e| panic!("ShareFetch: {e}"))
    }

    /// A ShareAcknowledge: `parts` are (topic id, partition, acknowledgement batches).
    pub fn acknowledge_request(
        group: &str,
        member: &str,
        epoch: i32,
        parts: &[(uuid::Uuid, i32, AckBatches)],
    ) -> ShareAcknowledgeRequest {
        let mut topics: Vec<share_acknowledge_request::AcknowledgeTopic> = Vec::new();
        for (topic_id, p, acks) in parts {
            let part = share_acknowledge_request::AcknowledgePartition::default()
                .with_partition_index(*p)
                .with_acknowledgement_batches(
                    acks.iter()
                        .map(|(a, b, t)| {
                            share_acknowledge_request::AcknowledgementBatch::default()
                                .with_first_offset(*a)
                                .with_last_offset(*b)
                                .with_acknowledge_types(t.clone())
                        })
                        .collect(),
                );
            match topics.iter_mut().find(|t| t.topic_id == *topic_id) {
                Some(t) => t.partitions.push(part),
                None => topics.push(
                    share_acknowledge_request::AcknowledgeTopic::default()
                        .with_topic_id(*topic_id)
                        .with_partitions(vec![part]),
                ),
            }
        }
        ShareAcknowledgeRequest::default()
            .with_group_id(Some(GroupId(s(group))))
            .with_member_id(Some(s(member)))
            .with_share_session_epoch(epoch)
            .with_topics(topics)
    }

    /// Sends a ShareAcknowledge.
    pub fn acknowledge(c: &mut RawConn, req: &ShareAcknowledgeRequest) -> ShareAcknowledgeResponse {
        c.request(versions::ACKNOWLEDGE, req)
            .unwrap_or_else(|e| panic!("ShareAcknowledge: {e}"))
    }

    /// The acquired ranges of a ShareFetch answer: (topic id, partition, first, last, delivery
    /// count).
    pub fn acquired_ranges(resp: &ShareFetchResponse) -> Vec<(uuid::Uuid, i32, i64, i64, i16)> {
        let mut out = Vec::new();
        for t in &resp.responses {
            for p in &t.partitions {
                for a in &p.acquired_records {
                    out.push((
                        t.topic_id,
                        p.partition_index,
                        a.first_offset,
                        a.last_offset,
                        a.delivery_count,
                    ));
                }
            }
        }
        out
    }

    /// The records of `topic` with their headers, as `kcat -C -e -f '%p|%o|%s|%h\n'` prints
    /// them: (partition, offset, value, header name -> value). Headers are `name=value` pairs
    /// joined by commas, so values must not contain commas.
    pub fn kcat_records(bootstrap: &str, topic: &str) -> Vec<(i32, i64, String, BTreeMap<String, String>)> {
        let mut cmd = tools::kcat_command();
        cmd.args(["-b", bootstrap, "-C", "-t", topic, "-o", "beginning", "-e", "-q"])
            .args(["-f", "%p|%o|%s|%h\\n"]);
        let desc = format!("{cmd:?}");
        let (status, out, err) = tools::run_with_input(cmd, b"", Duration::from_secs(30));
        assert!(
            status.success(),
            "{desc} failed with {status}; stderr:\n{}",
            String::from_utf8_lossy(&err)
        );
        String::from_utf8_lossy(&out)
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|line| {
                let mut it = line.splitn(4, '|');
                let (p, o, v, h) = (it.next(), it.next(), it.next(), it.next());
                let parse = || -> Option<(i32, i64, String, BTreeMap<String, String>)> {
                    let headers = h?
                        .split(',')
                        .filter(|kv| !kv.is_empty())
                        .map(|kv| {
                            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
                            (k.to_string(), v.to_string())
                        })
                        .collect();
                    Some((p?.parse().ok()?, o?.parse().ok()?, v?.to_string(), headers))
                };
                parse().unwrap_or_else(|| panic!("{desc}: cannot parse the line {line:?}"))
            })
            .collect()
    }
}

// ============================== end of the share-group section ==============================

#[cfg(test)]
mod tests {
    use super::data::*;
    use super::raw::*;
    use kafka_protocol::records::Compression;

    fn batch_at(base: i64, n: usize, compression: Compression) -> Vec<u8> {
        let recs: Vec<_> = (0..n)
            .map(|i| record(None, Some(format!("v{i}").as_bytes()), 1000))
            .collect();
        let mut b = encode_batch(&recs, compression).to_vec();
        b[0..8].copy_from_slice(&base.to_be_bytes());
        b
    }

    #[test]
    fn walk_batches_finds_complete_batches_and_stops_at_a_torn_tail() {
        let a = batch_at(0, 3, Compression::None);
        let b = batch_at(3, 5, Compression::Gzip);
        let c = batch_at(8, 1, Compression::None);
        let mut file = [a.clone(), b.clone(), c.clone()].concat();
        let (batches, complete) = walk_batches(&file);
        assert_eq!(complete as usize, file.len());
        let got: Vec<(u64, u64, i64, i64)> = batches
            .iter()
            .map(|x| (x.position, x.size, x.base_offset, x.last_offset))
            .collect();
        let (la, lb, lc) = (a.len() as u64, b.len() as u64, c.len() as u64);
        assert_eq!(got, vec![(0, la, 0, 2), (la, lb, 3, 7), (la + lb, lc, 8, 8)]);

        // A torn last batch and zero pre-allocation are not batches.
        file.truncate(file.len() - 5);
        file.extend_from_slice(&[0u8; 4096]);
        let (batches, complete) = walk_batches(&file);
        assert_eq!(batches.len(), 2);
        assert_eq!(complete, la + lb);
        assert_eq!(walk_batches(&[0u8; 100]).0, vec![]);
    }

    #[test]
    fn hex_round_trips_and_rejects_garbage() {
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(unhex(&hex(&all)), Some(all));
        assert_eq!(hex(b"\x00\xff"), "00ff");
        assert_eq!(unhex("0"), None);
        assert_eq!(unhex("zz"), None);
    }

    #[test]
    fn consumed_json_distinguishes_null_and_empty() {
        let v = serde_json::json!({
            "partition": 2, "offset": 7, "key": null, "value": "",
            "headers": [["a", null], ["a", "01"], ["b", ""]], "timestamp": 5
        });
        let c = consumed_from_json(&v).expect("parse");
        assert_eq!(c.key, None);
        assert_eq!(c.value, Some(vec![]));
        assert_eq!(
            c.headers,
            vec![
                ("a".to_string(), None),
                ("a".to_string(), Some(vec![1])),
                ("b".to_string(), Some(vec![]))
            ]
        );
        assert_eq!((c.partition, c.offset, c.timestamp), (2, 7, Some(5)));
        assert!(consumed_from_json(&serde_json::json!({"partition": 1})).is_err());
    }

    #[test]
    fn varied_records_are_deterministic_and_cover_the_corners() {
        let a = varied_records(200, 3, 9);
        assert_eq!(a, varied_records(200, 3, 9));
        assert_ne!(a, varied_records(200, 3, 10));
        assert!(a.iter().any(|r| r.key.is_none()));
        assert!(a.iter().any(|r| r.value.is_none()));
        assert!(a.iter().any(|r| r.value.as_deref() == Some(&[][..])));
        assert!(a.iter().any(|r| r.headers.iter().any(|h| h.1.is_none())));
        assert!(a
            .iter()
            .any(|r| r.headers.iter().filter(|h| h.0 == "dup").count() == 2));
        assert!(a.iter().all(|r| r.key.is_some() || r.value.is_some()));
        assert_eq!(a.iter().filter(|r| r.partition == 2).count(), 66);
    }

    #[test]
    fn compare_read_back_catches_every_kind_of_difference() {
        let recs = varied_records(6, 2, 1);
        let offsets = vec![0, 0, 1, 1, 2, 2];
        let good: Vec<Consumed> = recs
            .iter()
            .zip(&offsets)
            .map(|(r, &o)| Consumed {
                partition: r.partition,
                offset: o,
                key: r.key.clone(),
                value: r.value.clone(),
                headers: r.headers.clone(),
                timestamp: r.timestamp,
            })
            .collect();
        assert!(compare_read_back("t", &recs, &offsets, &good, true).is_ok());
        let mut changed = good.clone();
        changed[3].value = Some(b"other".to_vec());
        assert!(compare_read_back("t", &recs, &offsets, &changed, true).is_err());
        let mut changed = good.clone();
        changed[1].headers.reverse();
        changed[1].headers.push(("x".into(), None));
        assert!(compare_read_back("t", &recs, &offsets, &changed, true).is_err());
        let mut changed = good.clone();
        changed[2].timestamp = Some(1);
        assert!(compare_read_back("t", &recs, &offsets, &changed, true).is_err());
        assert!(compare_read_back("t", &recs, &offsets, &changed, false).is_ok());
        assert!(compare_read_back("t", &recs, &offsets, &good[1..], true).is_err());
        let mut dup = good.clone();
        dup.push(good[0].clone());
        assert!(compare_read_back("t", &recs, &offsets, &dup, true).is_err());
    }

    #[test]
    fn metric_sum_adds_label_sets_of_one_series_only() {
        let text = "# HELP strand_x_total x\nstrand_x_total{shard=\"0\"} 2\nstrand_x_total{shard=\"1\"} 3\n\
                    strand_x_total_more{shard=\"0\"} 100\nstrand_y 7\n";
        assert_eq!(crate::metric_sum(text, "strand_x_total"), 5.0);
        assert_eq!(crate::metric_sum(text, "strand_y"), 7.0);
        assert_eq!(crate::metric_sum(text, "strand_z"), 0.0);
    }

    #[test]
    fn group_events_round_trip_through_json_lines() {
        use super::group::Event;
        let events = vec![
            Event::Assigned(vec![0, 3]),
            Event::Assigned(vec![]),
            Event::Records(vec![(1, 7, "1:7".into()), (2, 0, String::new())]),
            Event::Committed([(0, 5), (3, 9)].into_iter().collect()),
            Event::CommitFailed {
                offsets: [(1, 2)].into_iter().collect(),
                error: "REBALANCE_IN_PROGRESS".into(),
            },
            Event::Error("boom".into()),
            Event::Note("commits frozen".into()),
            Event::Closed,
        ];
        for e in events {
            let line = e.to_json().to_string();
            let back = Event::from_json(&serde_json::from_str(&line).expect("json")).expect("event");
            assert_eq!(back, e, "{line}");
        }
        // The Python scripts write assignments unsorted at times; the parser sorts them.
        let v = serde_json::json!({"ev": "assigned", "partitions": [3, 0]});
        assert_eq!(Event::from_json(&v), Ok(Event::Assigned(vec![0, 3])));
        assert!(Event::from_json(&serde_json::json!({"ev": "what"})).is_err());
        assert!(Event::from_json(&serde_json::json!({"ev": "committed", "offsets": [[1]]})).is_err());
    }

    #[test]
    fn ready_file_parses_the_documented_format() {
        let r: super::ReadyFile = serde_json::from_str(
            r#"{"pid": 1234, "kafka": [{"name": "PLAINTEXT", "addr": "127.0.0.1:41234"}], "admin": "127.0.0.1:45678"}"#,
        )
        .expect("parse");
        assert_eq!(
            (r.pid, r.kafka[0].name.as_str(), r.kafka[0].addr.as_str()),
            (1234, "PLAINTEXT", "127.0.0.1:41234")
        );
        assert_eq!(r.admin.as_deref(), Some("127.0.0.1:45678"));
    }
}
