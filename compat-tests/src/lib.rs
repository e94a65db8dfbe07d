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
//! * [`share`]: share-group (KIP-932) members (confluent-kafka's `ShareConsumer` in a child
//!   process), their event log, and the raw share-group requests.
//! * [`queue_client`]: the blocking HTTP client of the queue API (shared with the queue
//!   benchmark).
//! * [`data`]: deterministic test records ([`data::TestRecord`]) and what a consumer read
//!   ([`data::Consumed`]), with a JSON form shared with the Python scripts.
//! * [`members`]: what group and share-group members share: the log of their events (which a
//!   test waits on) and the child process a member runs in.
//! * [`wait_for`] waits for a condition; [`metric_sum`] reads the broker's `/metrics`;
//!   [`unique_topic`] names a topic no other test uses; [`scenario_tests!`] declares one test per
//!   case of a scenario.
//!
//! One file a module: `broker.rs` (the process), `raw.rs`, `admin.rs` (+ `admin/`),
//! `clients.rs`, `group.rs`, `share.rs` (+ `share/`), `members.rs`, `data.rs`, `tools.rs`,
//! `wait.rs`, `metrics.rs`; `tests.rs` holds the harness's own unit tests.
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

use std::sync::atomic::{AtomicU64, Ordering};

pub use broker::{
    broker_binary, external_bootstrap, repo_root, Broker, BrokerBuilder, ReadyFile, ReadyListener,
};
pub use metrics::{http_get, metric_sum, metric_sum_where};
/// The HTTP queue API client (shared with the queue benchmark).
pub use strand_tools::queue_client;
pub use wait::wait_for;

/// A topic name no other test (nor an earlier run against the same external broker) uses.
pub fn unique_topic(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let salt: u32 = rand::random();
    format!("{prefix}-{}-{n}-{salt:08x}", std::process::id())
}

/// One `#[test]` per case of a scenario taken over protocols, clients or codecs, each under its
/// own name (so that each case passes or fails, and is kept in a test history, on its own):
///
/// ```ignore
/// scenario_tests!(takeover {
///     takeover_range: Protocol::Classic("range");
///     takeover_kip848_consumer_protocol: Protocol::Consumer;
/// });
/// ```
///
/// declares `#[test] fn takeover_range() { takeover(Protocol::Classic("range")) }` and so on; a
/// case may pass several arguments, separated by commas.
#[macro_export]
macro_rules! scenario_tests {
    ($scenario:path { $($name:ident: $($arg:expr),+;)+ }) => {
        $(
            #[test]
            fn $name() {
                $scenario($($arg),+)
            }
        )+
    };
}

pub mod admin;
mod broker;
pub mod clients;
pub mod data;
pub mod group;
pub mod members;
mod metrics;
pub mod raw;
pub mod share;
pub mod tools;
mod wait;

#[cfg(test)]
mod tests;
