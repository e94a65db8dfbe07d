//! `strand-faultproxy`: a Kafka-aware TCP proxy that drops a fraction of Produce responses.
//!
//! See `strand_tools::faultproxy` for the design. Prints `listening on <addr>` on stdout once
//! bound, optional periodic counters on stderr, and one final `summary: ...` line on stdout when
//! it stops (SIGINT, SIGTERM, or `--duration-secs`).

use std::io::Write;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Parser;
use strand_tools::run::exit_on_error;

use strand_tools::faultproxy::{
    DropMode, FaultProxy, ProxyConfig, DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_FRAME_BYTES,
};

#[derive(Parser, Debug)]
#[command(
    name = "strand-faultproxy",
    version,
    about = "Fault-injecting Kafka proxy: forwards client connections to a broker and drops a \
             seeded fraction of Produce responses, either closing the connection (close) or \
             withholding the response (silent).",
    after_help = "The broker must advertise the proxy's address, or clients will bypass it after \
      their first Metadata request:\n  \
      strand-faultproxy --listen 127.0.0.1:19092 --upstream 127.0.0.1:9092 --drop-rate 0.05 --mode close &\n  \
      strand --override listeners=PLAINTEXT://127.0.0.1:9092 \\\n         \
      --override advertised.listeners=PLAINTEXT://127.0.0.1:19092"
)]
struct Cli {
    /// Address to listen on (port 0: an ephemeral port, printed on stdout).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: String,
    /// The broker to forward to, host:port.
    #[arg(long)]
    upstream: String,
    /// Fraction of Produce responses to drop, 0..=1.
    #[arg(long, default_value_t = 0.05, value_parser = parse_rate)]
    drop_rate: f64,
    /// What to do with a dropped response: `close` the connection, or `silent`ly withhold it.
    #[arg(long, default_value = "close")]
    mode: DropMode,
    /// Seed of the drop decisions (same seed, same order of responses: same drops).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Largest frame forwarded; a larger one closes the connection.
    #[arg(long, default_value_t = DEFAULT_MAX_FRAME_BYTES)]
    max_frame_bytes: usize,
    /// Largest number of concurrent client connections.
    #[arg(long, default_value_t = DEFAULT_MAX_CONNECTIONS)]
    max_connections: usize,
    /// Time limit for connecting to the upstream, in milliseconds.
    #[arg(long, default_value_t = 5000)]
    connect_timeout_ms: u64,
    /// Stop after this many seconds (default: run until SIGINT/SIGTERM).
    #[arg(long)]
    duration_secs: Option<u64>,
    /// Print the counters on stderr every this many seconds.
    #[arg(long)]
    stats_interval_secs: Option<u64>,
    /// Log connections, drops and errors on stderr.
    #[arg(long, short)]
    verbose: bool,
}

fn parse_rate(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|e| format!("{e}"))?;
    if (0.0..=1.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("{v} is not within 0..=1"))
    }
}

fn run(cli: Cli) -> Result<()> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone()).context("installing a signal handler")?;
    }
    let mut proxy = FaultProxy::start(ProxyConfig {
        listen: cli.listen.clone(),
        upstream: Some(cli.upstream.clone()),
        drop_rate: cli.drop_rate,
        mode: cli.mode,
        seed: cli.seed,
        max_frame_bytes: cli.max_frame_bytes,
        max_connections: cli.max_connections,
        connect_timeout: Duration::from_millis(cli.connect_timeout_ms),
        verbose: cli.verbose,
    })
    .with_context(|| format!("cannot listen on {}", cli.listen))?;
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "listening on {}", proxy.local_addr()).context("writing to stdout")?;
    stdout.flush().context("writing to stdout")?;
    eprintln!(
        "strand-faultproxy: {} -> {}, dropping {} of Produce responses ({} mode, seed {})",
        proxy.local_addr(),
        cli.upstream,
        cli.drop_rate,
        cli.mode,
        cli.seed
    );
    let started = Instant::now();
    let deadline = cli.duration_secs.map(|s| started + Duration::from_secs(s));
    let interval = cli.stats_interval_secs.map(|s| Duration::from_secs(s.max(1)));
    let mut next_stats = interval.map(|i| started + i);
    while !stop.load(Ordering::Relaxed) && deadline.is_none_or(|d| Instant::now() < d) {
        std::thread::sleep(Duration::from_millis(50));
        if let (Some(at), Some(every)) = (next_stats, interval) {
            if Instant::now() >= at {
                eprintln!("strand-faultproxy: {}", proxy.stats());
                next_stats = Some(at + every);
            }
        }
    }
    let stats = proxy.shutdown();
    writeln!(
        stdout,
        "summary: elapsed_secs={:.1} {stats}",
        started.elapsed().as_secs_f64()
    )
    .context("writing to stdout")?;
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    exit_on_error("strand-faultproxy", ExitCode::FAILURE, || {
        run(cli).map(|()| ExitCode::SUCCESS)
    })
}
