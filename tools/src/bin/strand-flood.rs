//! `strand-flood`: many connections each send one large request at once, again and again, while
//! the broker's resident memory is sampled; prints the peak against the broker's request-memory
//! budget. See `strand_tools::flood`.
//!
//! ```text
//! strand-flood --spawn target/release/strand --kind produce --connections 40 --request-mb 100
//! strand-flood --kafka 127.0.0.1:9092 --pid 1234 --kind garbage
//! ```

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Parser, ValueEnum};
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::{CreateTopicsRequest, TopicName};
use kafka_protocol::protocol::StrBytes;
use strand_tools::broker::BrokerProcess;
use strand_tools::flood::{run_flood, FloodOptions, FloodRequest};
use strand_tools::kafka_wire::RawConn;
use strand_tools::run::exit_on_error;

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Kind {
    /// A Produce of one valid batch to each partition of the topic.
    Produce,
    /// A Produce header followed by garbage.
    Garbage,
    /// A Produce naming partitions 0, 1, 2, … without records.
    ManyPartitions,
    /// An HTTP publish of a JSON body of messages.
    Http,
}

#[derive(Parser, Debug)]
#[command(
    name = "strand-flood",
    version,
    about = "Floods a broker with large requests and reports its peak resident memory."
)]
struct Cli {
    /// Start this strand binary (fresh data directory, ephemeral ports) instead of using a running broker.
    #[arg(long)]
    spawn: Option<PathBuf>,
    /// Extra --override KEY=VALUE for the spawned broker (repeatable).
    #[arg(long = "override", value_name = "KEY=VALUE")]
    overrides: Vec<String>,
    /// Shards of the spawned broker.
    #[arg(long, default_value_t = 2)]
    shards: usize,
    /// A running broker's Kafka listener.
    #[arg(long)]
    kafka: Option<String>,
    /// A running broker's HTTP listener.
    #[arg(long)]
    http: Option<String>,
    /// A running broker's process id.
    #[arg(long)]
    pid: Option<u32>,
    #[arg(long, value_enum, default_value = "produce")]
    kind: Kind,
    #[arg(long, default_value_t = 40)]
    connections: usize,
    /// Size of each request, MiB.
    #[arg(long, default_value_t = 100.0)]
    request_mb: f64,
    /// Partitions of the flood's topic (created if missing); a produce sends one batch to each.
    #[arg(long, default_value_t = 100)]
    partitions: i32,
    /// Requests each connection sends one after the other.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Payload bytes of each HTTP message.
    #[arg(long, default_value_t = 100_000)]
    message_bytes: usize,
    /// Seconds to keep sampling after the flood.
    #[arg(long, default_value_t = 2)]
    settle_secs: u64,
    /// Where the spawned broker's data and log go (default: a temporary directory).
    #[arg(long)]
    dir: Option<PathBuf>,
}

const TOPIC: &str = "flood";

fn run(cli: Cli) -> Result<ExitCode> {
    let tmp = tempfile::tempdir()?;
    let dir = cli.dir.clone().unwrap_or_else(|| tmp.path().to_path_buf());
    let spawned = match &cli.spawn {
        Some(binary) => {
            let mut args = vec!["--override".to_owned(), format!("strand.shards={}", cli.shards)];
            for o in &cli.overrides {
                args.push("--override".into());
                args.push(o.clone());
            }
            Some(BrokerProcess::spawn_strand(
                binary,
                &dir,
                &args,
                Duration::from_secs(60),
            )?)
        }
        None => None,
    };
    let (kafka, http, pid) = match &spawned {
        Some(b) => (b.bootstrap.clone(), b.http.clone(), b.pid),
        None => (
            cli.kafka.clone().context("--kafka or --spawn")?,
            cli.http.clone(),
            cli.pid.context("--pid or --spawn")?,
        ),
    };
    create_topic(&kafka, cli.partitions)?;
    let bytes = (cli.request_mb * 1048576.0) as usize;
    let request = match cli.kind {
        Kind::Produce => FloodRequest::produce(TOPIC, cli.partitions, bytes)?,
        Kind::Garbage => FloodRequest::garbage_produce(bytes)?,
        Kind::ManyPartitions => FloodRequest::many_partitions(TOPIC, bytes)?,
        Kind::Http => FloodRequest::http_publish(TOPIC, bytes, cli.message_bytes),
    };
    let options = FloodOptions {
        kafka_addr: kafka,
        http_addr: http,
        pid,
        connections: cli.connections,
        rounds: cli.rounds,
        answer_timeout: Duration::from_secs(120),
        sample_every: Duration::from_millis(10),
        settle: Duration::from_secs(cli.settle_secs),
    };
    let report = run_flood(&request, &options)?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", report.summary())?;
    writeln!(out, "{}", serde_json::to_string(&report)?)?;
    if let Some(mut b) = spawned {
        if !b.is_running() {
            bail!("the broker died:{}", b.log_tail());
        }
        let _ = b.stop(Duration::from_secs(10));
    }
    Ok(ExitCode::SUCCESS)
}

fn create_topic(addr: &str, partitions: i32) -> Result<()> {
    let mut conn = RawConn::connect(addr)?;
    let req = CreateTopicsRequest::default()
        .with_timeout_ms(30_000)
        .with_topics(vec![CreatableTopic::default()
            .with_name(TopicName(StrBytes::from_static_str(TOPIC)))
            .with_num_partitions(partitions)
            .with_replication_factor(1)]);
    let resp = conn.request(5, &req)?;
    for t in resp.topics {
        if t.error_code != 0 && t.error_code != 36 {
            bail!("creating {TOPIC}: error {}", t.error_code);
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    exit_on_error("strand-flood", ExitCode::FAILURE, || run(cli))
}
