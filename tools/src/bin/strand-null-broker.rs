//! `strand-null-broker`: a Kafka broker that does the least work any broker could do, so that
//! `strand-bench --peer-null` can measure what the client (librdkafka) reaches on this machine.
//!
//! See `strand_tools::null_broker` for what it serves and how. Prints `listening on <addr>` on
//! stderr once bound (and writes `--ready-file` if asked), and one `summary: ...` line with its
//! counters on stderr when it stops (SIGINT or SIGTERM).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Parser;
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;
use strand_tools::run::exit_on_error;

use strand_tools::null_broker::{
    NullBroker, NullBrokerConfig, DEFAULT_FETCH_MAX_BYTES, DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_FRAME_BYTES,
    DEFAULT_RECENT_BYTES, DEFAULT_TEMPLATE_BUDGET_BYTES,
};

#[derive(Parser, Debug)]
#[command(
    name = "strand-null-broker",
    version,
    about = "A Kafka broker that stores no records: produce only advances offsets, fetch serves \
             copies of the first batch of each shape with the offsets patched. The client's \
             ceiling on this machine, for strand-bench --peer-null.",
    after_help = "Serves ApiVersions 0-3, Metadata 1-9, CreateTopics 2-5, Produce 3-9, Fetch 4-12, \
      ListOffsets 1-7 and FindCoordinator 0-3; anything else closes the connection.\n  \
      strand-null-broker --port 9092 --ready-file /tmp/null.json"
)]
struct Cli {
    /// Port to listen on, on 127.0.0.1 (0: an ephemeral port; see --ready-file).
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Write `{"pid":..,"kafka":[{"name":"PLAINTEXT","addr":"127.0.0.1:PORT"}]}` here once
    /// listening (the shape of strand's ready file).
    #[arg(long, value_name = "PATH")]
    ready_file: Option<PathBuf>,
    /// Node id in Metadata and FindCoordinator.
    #[arg(long, default_value_t = 0)]
    node_id: i32,
    /// Bound on template memory, in MiB; past it a new batch shape reuses the closest template
    /// with the same record count.
    #[arg(long, value_name = "MIB", default_value_t = DEFAULT_TEMPLATE_BUDGET_BYTES >> 20)]
    template_budget_mib: u64,
    /// The most recent batches kept as produced (served to consumers at the head), in MiB.
    #[arg(long, value_name = "MIB", default_value_t = DEFAULT_RECENT_BYTES >> 20)]
    recent_mib: u64,
    /// Largest request frame; a larger one closes the connection.
    #[arg(long, default_value_t = DEFAULT_MAX_FRAME_BYTES)]
    max_frame_bytes: usize,
    /// Largest number of concurrent connections.
    #[arg(long, default_value_t = DEFAULT_MAX_CONNECTIONS)]
    max_connections: usize,
    /// Bound on a fetch response's record bytes (below the request's `max_bytes`), as a broker's
    /// `fetch.max.bytes`; the default is Strand's.
    #[arg(long, default_value_t = DEFAULT_FETCH_MAX_BYTES)]
    fetch_max_bytes: i32,
}

fn run(cli: Cli) -> Result<()> {
    // Installed before anything is served, so that SIGTERM always ends with the summary.
    let mut signals = Signals::new([SIGINT, SIGTERM]).context("installing signal handlers")?;
    let listen = format!("127.0.0.1:{}", cli.port);
    let mut broker = NullBroker::start(NullBrokerConfig {
        listen: listen.clone(),
        node_id: cli.node_id,
        template_budget_bytes: cli.template_budget_mib.saturating_mul(1 << 20),
        recent_bytes: cli.recent_mib.saturating_mul(1 << 20),
        max_frame_bytes: cli.max_frame_bytes,
        max_connections: cli.max_connections,
        fetch_max_bytes: cli.fetch_max_bytes,
    })
    .with_context(|| format!("cannot listen on {listen}"))?;
    let addr = broker.local_addr();
    if let Some(path) = &cli.ready_file {
        write_ready_file(path, &addr.to_string())?;
    }
    eprintln!(
        "strand-null-broker: listening on {addr} (node id {}, templates up to {} MiB, recent window {} MiB)",
        cli.node_id, cli.template_budget_mib, cli.recent_mib
    );
    let signal = signals.forever().next();
    let stats = broker.shutdown();
    eprintln!("strand-null-broker: stopping on signal {signal:?}");
    eprintln!("summary: {stats}");
    Ok(())
}

/// Written to a temporary name and renamed, so that a reader never sees half of it.
fn write_ready_file(path: &Path, addr: &str) -> Result<()> {
    let json = serde_json::json!({
        "pid": std::process::id(),
        "kafka": [{"name": "PLAINTEXT", "addr": addr}],
    });
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, format!("{json}\n")).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    exit_on_error("strand-null-broker", ExitCode::FAILURE, || {
        run(cli).map(|()| ExitCode::SUCCESS)
    })
}
