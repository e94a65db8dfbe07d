//! `strand`: the broker binary.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

/// mimalloc keeps freed memory for reuse: the produce path allocates a staging buffer per
/// batch, and glibc returned each large one to the kernel (munmap, TLB shootdowns, fresh
/// zeroed pages on the next allocation).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
use strand_broker::config;
use strand_broker::server::{self, ServerOptions};

/// The environment variable that sets mimalloc's purge delay: how long freed memory waits
/// before it goes back to the kernel.
const PURGE_DELAY_VAR: &str = "MIMALLOC_PURGE_DELAY";
/// The broker's purge delay, in milliseconds.
const PURGE_DELAY_MS: std::ffi::c_long = 10_000;
/// mimalloc's `mi_option_purge_delay` (its option enum in `mimalloc.h`, which the Rust binding
/// does not name); a test checks that it is the option `MIMALLOC_PURGE_DELAY` sets.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Makes mimalloc keep the memory the broker frees for 10 s instead of 1 s (its default)
/// before returning it to the kernel: the produce path stages every byte in fresh buffers,
/// kept as recent writes and freed a fraction of a second later, and memory taken back from
/// the kernel comes as new pages it must zero (a fault per page, and a VM exit where the host
/// backs them lazily), which cost ~7 % of the broker's CPU at one partition's peak. 10 s gains
/// as much as never returning memory, and a burst's memory still goes back once the load is
/// gone. A delay the user set with `MIMALLOC_PURGE_DELAY` is left alone. Returns the delay in
/// effect, in milliseconds (-1: never).
///
/// Call it first thing in `main`, before any other thread starts: mimalloc's option calls are
/// not thread-safe. (Only memory freed before it runs follows mimalloc's default: none to speak
/// of, the broker has not started.)
fn keep_freed_memory() -> std::ffi::c_long {
    let user_set = std::env::var_os(PURGE_DELAY_VAR).is_some();
    // SAFETY: both functions take and return plain integers (no pointers), and
    // `MI_OPTION_PURGE_DELAY` is a valid option (checked by a test). mimalloc's option calls
    // must not race with one another; this runs on the main thread before it has started any
    // other, so nothing else calls into mimalloc meanwhile.
    #[allow(unsafe_code)]
    unsafe {
        if !user_set {
            libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS);
        }
        libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY)
    }
}

/// Strand: a Kafka-compatible broker and durable work queue.
///
/// Configuration comes, highest precedence first, from --override/flags, KAFKA_* and STRAND_*
/// environment variables (mapped as the apache/kafka image does), a server.properties file,
/// and built-in defaults. With no configuration at all, Kafka listens on 127.0.0.1:9092 and
/// data goes to ./strand-data.
#[derive(Parser, Debug)]
#[command(name = "strand", version, about, long_about = None)]
struct Cli {
    /// A Kafka-style server.properties file.
    config_file: Option<PathBuf>,
    /// Set a configuration key, e.g. --override log.retention.ms=60000 (repeatable).
    #[arg(long = "override", value_name = "KEY=VALUE")]
    overrides: Vec<String>,
    /// Shorthand for --override listeners=...
    #[arg(long)]
    listeners: Option<String>,
    /// Shorthand for --override advertised.listeners=...
    #[arg(long)]
    advertised_listeners: Option<String>,
    /// Shorthand for --override log.dirs=...
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Shorthand for --override strand.admin.listener=... (admin HTTP: /metrics).
    #[arg(long, value_name = "HOST:PORT")]
    admin_listener: Option<String>,
    /// Shorthand for --override strand.http.listener=... (the HTTP queue API).
    #[arg(long, value_name = "HOST:PORT")]
    http_listener: Option<String>,
    /// Shorthand for --override strand.shards=... (0: one per core).
    #[arg(long)]
    shards: Option<usize>,
    /// Shorthand for --override node.id=...
    #[arg(long)]
    node_id: Option<i32>,
    /// Log filter (tracing syntax): error, warn, info, debug, trace, or per module.
    /// Defaults to STRAND_LOG or "info,openraft=error": openraft logs each partition group's
    /// votes and every failed heartbeat, which a cluster of many partitions turns into a flood;
    /// Strand logs what an operator needs (leadership, ISR, fencing) itself.
    #[arg(long, value_name = "LEVEL")]
    log_level: Option<String>,
    /// Write a JSON file with the bound addresses once the broker is ready to serve.
    #[arg(long, value_name = "PATH")]
    ready_file: Option<PathBuf>,
}

/// See `--log-level`.
const DEFAULT_LOG_FILTER: &str = "info,openraft=error";

fn main() -> ExitCode {
    let purge_delay_ms = keep_freed_memory();
    let cli = Cli::parse();
    let filter = cli
        .log_level
        .clone()
        .or_else(|| std::env::var("STRAND_LOG").ok())
        .unwrap_or_else(|| DEFAULT_LOG_FILTER.to_owned());
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    tracing::debug!(
        purge_delay_ms,
        "the allocator returns freed memory to the kernel after this delay"
    );
    // A panic is a bug; in a thread-per-core broker a dead shard would leave its partitions
    // (and a start-up waiting for it) hanging. Stop the whole process instead: acknowledged
    // data is recovered on restart.
    raise_open_files_limit();
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        tracing::error!(panic = %info, "a thread panicked; stopping the broker");
        default_hook(info);
        std::process::exit(101);
    }));

    let mut overrides = Vec::new();
    if let Some(v) = &cli.listeners {
        overrides.push(format!("listeners={v}"));
    }
    if let Some(v) = &cli.advertised_listeners {
        overrides.push(format!("advertised.listeners={v}"));
    }
    if let Some(v) = &cli.data_dir {
        overrides.push(format!("log.dirs={}", v.display()));
    }
    if let Some(v) = &cli.http_listener {
        overrides.push(format!("strand.http.listener={v}"));
    }
    if let Some(v) = &cli.admin_listener {
        overrides.push(format!("strand.admin.listener={v}"));
    }
    if let Some(v) = cli.shards {
        overrides.push(format!("strand.shards={v}"));
    }
    if let Some(v) = cli.node_id {
        overrides.push(format!("node.id={v}"));
    }
    overrides.extend(cli.overrides.iter().cloned());

    let loaded = match config::load(cli.config_file.as_deref(), config::process_env(), &overrides) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("strand: configuration error: {e}");
            return ExitCode::from(2);
        }
    };
    match server::run(
        loaded.config,
        ServerOptions {
            ready_file: cli.ready_file,
        },
    ) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("strand: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Raises the soft limit on open files to the hard limit: every non-empty partition keeps its
/// active segment open, and running out takes a shard's storage offline for writes. Logs the
/// limit it ends with.
fn raise_open_files_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let limit = getrlimit(Resource::Nofile);
    if limit.current.is_some() && limit.current != limit.maximum {
        let raised = Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        };
        if let Err(e) = setrlimit(Resource::Nofile, raised) {
            tracing::warn!(error = %e, "cannot raise the open-files limit");
        }
    }
    let now = getrlimit(Resource::Nofile);
    let soft = now
        .current
        .map_or_else(|| "unlimited".to_owned(), |n| n.to_string());
    tracing::info!(
        open_files_limit = %soft,
        "open-files limit (one per partition with data)"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Set in the child processes of the test below: the delay it must find.
    const CHILD_VAR: &str = "STRAND_TEST_PURGE_DELAY_MS";

    /// Without `MIMALLOC_PURGE_DELAY` the broker's delay is in effect; with it, the user's
    /// (which also shows that `MI_OPTION_PURGE_DELAY` is the option that variable sets, since
    /// mimalloc read the variable as the process started). Each case runs in a process of its
    /// own, running only this test, since mimalloc reads the variable once.
    #[test]
    fn the_purge_delay_is_the_brokers_unless_the_environment_sets_one() {
        if let Ok(want) = std::env::var(CHILD_VAR) {
            assert_eq!(keep_freed_memory().to_string(), want);
            return;
        }
        let name = "tests::the_purge_delay_is_the_brokers_unless_the_environment_sets_one";
        for (set, want) in [(None, "10000"), (Some("1234"), "1234"), (Some("-1"), "-1")] {
            let mut child = std::process::Command::new(std::env::current_exe().unwrap());
            child
                .args(["--exact", name, "--test-threads=1"])
                .env(CHILD_VAR, want);
            match set {
                Some(value) => child.env(PURGE_DELAY_VAR, value),
                None => child.env_remove(PURGE_DELAY_VAR),
            };
            let out = child.output().unwrap();
            assert!(
                out.status.success(),
                "{PURGE_DELAY_VAR}={set:?}: expected a delay of {want} ms\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            let ran = String::from_utf8_lossy(&out.stdout);
            assert!(ran.contains("1 passed"), "the child ran no test: {ran}");
        }
    }
}
