//! A request-memory flood: many connections each send one large request at the same moment,
//! again and again, while a sampler reads the broker's resident memory (`/proc/<pid>/status`)
//! every few milliseconds; a bystander connection meanwhile asks for metadata, to see that the
//! broker keeps serving other clients. `strand-flood` runs it from the command line and the
//! compatibility suite's memory test runs it against a broker with a small budget.
//!
//! Requests ([`FloodRequest`]) are built once and shared by every connection (the flood's own
//! memory does not grow with the number of connections):
//!
//! * [`FloodRequest::produce`]: a Produce of one valid batch to each partition of a topic;
//! * [`FloodRequest::garbage_produce`]: a valid Produce header followed by random bytes;
//! * [`FloodRequest::many_partitions`]: a Produce naming a million partitions with no records
//!   (what its decoded form costs, not its bytes);
//! * [`FloodRequest::http_publish`]: an HTTP publish of one JSON body of messages.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{ApiKey, MetadataRequest, ProduceRequest, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::Compression;
use serde::Serialize;

use crate::broker::memory_of;
use crate::kafka_wire::{encode_batch, read_size_prefix, record, request_frame, ConnOptions, RawConn};

/// Produce version of the flood's requests (non-flexible: the partition list is a plain array).
const PRODUCE_VERSION: i16 = 7;

/// Where a request goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Door {
    /// The Kafka listener: a size-prefixed frame, answered by a frame (or a close).
    Kafka,
    /// The HTTP queue API: one request, answered by one HTTP answer (or a close).
    Http,
}

/// One request, as bytes, that every connection of the flood sends.
#[derive(Clone)]
pub struct FloodRequest {
    /// What it is, for reports.
    pub name: String,
    pub door: Door,
    /// The bytes on the wire, whole.
    pub bytes: Arc<Bytes>,
}

impl FloodRequest {
    /// A Produce (acks=1) of about `total_bytes`: one batch (of one record) to each partition
    /// `0..partitions` of `topic`, as Produce v3+ requires.
    pub fn produce(topic: &str, partitions: i32, total_bytes: usize) -> Result<FloodRequest> {
        let partitions = partitions.max(1);
        let batch_bytes = total_bytes / partitions as usize;
        let value = vec![0x5a_u8; batch_bytes.saturating_sub(100).max(1)];
        let batch = encode_batch(&[record(None, Some(&value), now_ms())], Compression::None);
        let data = (0..partitions)
            .map(|p| {
                PartitionProduceData::default()
                    .with_index(p)
                    .with_records(Some(batch.clone()))
            })
            .collect();
        kafka_produce(
            topic,
            data,
            format!("produce of {partitions} batches of {} bytes", batch.len()),
        )
    }

    /// A frame of `total_bytes` (size prefix included) that starts as a Produce request (of no
    /// partitions) and goes on with pseudo-random bytes, which the broker reads and ignores.
    pub fn garbage_produce(total_bytes: usize) -> Result<FloodRequest> {
        let mut frame = BytesMut::from(&produce_frame(&ProduceRequest::default().with_acks(1))?[..]);
        let head = frame.len();
        let mut x = 0x9e37_79b9_7f4a_7c15_u64;
        while frame.len() < total_bytes {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            frame.put_u64(x);
        }
        frame.truncate(total_bytes.max(head));
        set_frame_size(&mut frame)?;
        Ok(FloodRequest {
            name: format!("produce header + {} bytes of garbage", frame.len()),
            door: Door::Kafka,
            bytes: Arc::new(frame.freeze()),
        })
    }

    /// A Produce (acks=1) of about `total_bytes` naming partition indexes 0, 1, 2, … of `topic`
    /// with null records: tiny on the wire, each a struct and an answer in the broker.
    pub fn many_partitions(topic: &str, total_bytes: usize) -> Result<FloodRequest> {
        // Each partition is 8 bytes on the wire at this version: index, records length -1.
        let n = (total_bytes / 8).max(1);
        let data = (0..n)
            .map(|i| PartitionProduceData::default().with_index(i as i32))
            .collect();
        kafka_produce(
            topic,
            data,
            format!("produce naming {n} partitions without records"),
        )
    }

    /// An HTTP publish to `queue` of one JSON body of about `total_bytes`: messages of about
    /// `message_bytes` of text payload each.
    pub fn http_publish(queue: &str, total_bytes: usize, message_bytes: usize) -> FloodRequest {
        let payload = "x".repeat(message_bytes.max(1));
        let one = format!("{{\"payload\":\"{payload}\"}}");
        let count = (total_bytes / (one.len() + 1)).max(1);
        let mut body = String::with_capacity(total_bytes + 32);
        body.push_str("{\"messages\":[");
        for i in 0..count {
            if i > 0 {
                body.push(',');
            }
            body.push_str(&one);
        }
        body.push_str("]}");
        let mut bytes = format!(
            "POST /v1/queues/{queue}/messages HTTP/1.1\r\nHost: flood\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        bytes.extend_from_slice(body.as_bytes());
        FloodRequest {
            name: format!("HTTP publish of {count} messages of {message_bytes} bytes"),
            door: Door::Http,
            bytes: Arc::new(Bytes::from(bytes)),
        }
    }
}

/// A Produce (acks=1) of `data` to `topic`, as a flood request named `name`.
fn kafka_produce(topic: &str, data: Vec<PartitionProduceData>, name: String) -> Result<FloodRequest> {
    let req = ProduceRequest::default()
        .with_acks(1)
        .with_timeout_ms(60_000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(TopicName(StrBytes::from_string(topic.to_owned())))
            .with_partition_data(data)]);
    Ok(FloodRequest {
        name,
        door: Door::Kafka,
        bytes: Arc::new(produce_frame(&req)?),
    })
}

fn produce_frame(req: &ProduceRequest) -> Result<Bytes> {
    let frame = request_frame("strand-flood", ApiKey::Produce as i16, PRODUCE_VERSION, 1, 1, req)?;
    Ok(frame.freeze())
}

fn set_frame_size(frame: &mut BytesMut) -> Result<()> {
    let len = i32::try_from(frame.len() - 4).context("frame too large")?;
    frame[..4].copy_from_slice(&len.to_be_bytes());
    Ok(())
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// How to run a flood.
#[derive(Clone, Debug)]
pub struct FloodOptions {
    /// The broker's Kafka listener (`host:port`).
    pub kafka_addr: String,
    /// The broker's HTTP queue listener, for HTTP requests.
    pub http_addr: Option<String>,
    /// The broker's process id, whose memory is sampled.
    pub pid: u32,
    /// Connections sending at once.
    pub connections: usize,
    /// Requests each connection sends, one after the other.
    pub rounds: usize,
    /// How long to wait for an answer (or a close) to each request.
    pub answer_timeout: Duration,
    /// How often the broker's memory is read.
    pub sample_every: Duration,
    /// How long to keep sampling after the last answer (memory the broker keeps afterwards).
    pub settle: Duration,
}

/// What a flood saw.
#[derive(Clone, Debug, Default, Serialize)]
pub struct FloodReport {
    pub request: String,
    pub connections: usize,
    pub rounds: usize,
    pub request_bytes: usize,
    /// Resident memory before the flood, KiB.
    pub rss_before_kib: u64,
    /// The highest resident memory sampled during the flood and the settling time, KiB.
    pub rss_peak_kib: u64,
    /// Resident memory at the end of the settling time, KiB.
    pub rss_after_kib: u64,
    /// The process's own high-water mark (VmHWM) at the end, KiB: it covers moments between
    /// samples, and everything before the flood too.
    pub hwm_kib: u64,
    /// Requests answered (any answer: an error answer counts).
    pub answered: u64,
    /// Requests after which the broker closed the connection without an answer.
    pub closed: u64,
    /// Requests that failed otherwise (a write or read error, a timeout).
    pub failed: u64,
    /// Bystander metadata requests answered during the flood, and the slowest of them.
    pub bystander_answered: u64,
    pub bystander_failed: u64,
    pub bystander_slowest_ms: u64,
    pub elapsed_ms: u64,
}

impl FloodReport {
    /// One line for people.
    pub fn summary(&self) -> String {
        format!(
            "{} connections x {} rounds of {} ({} MB): RSS {} MB before, peak {} MB, {} MB after (VmHWM {} MB); answered {}, closed {}, failed {}; bystander {} answered, {} failed, slowest {} ms; {:.1} s",
            self.connections,
            self.rounds,
            self.request,
            self.request_bytes >> 20,
            self.rss_before_kib >> 10,
            self.rss_peak_kib >> 10,
            self.rss_after_kib >> 10,
            self.hwm_kib >> 10,
            self.answered,
            self.closed,
            self.failed,
            self.bystander_answered,
            self.bystander_failed,
            self.bystander_slowest_ms,
            self.elapsed_ms as f64 / 1000.0,
        )
    }
}

/// How one request ended.
enum Outcome {
    Answered,
    Closed,
    Failed,
}

/// Runs the flood: `options.connections` threads each connect, wait for the others, and send
/// `request` `options.rounds` times (reconnecting after a close), while the broker's memory is
/// sampled and a bystander asks for metadata.
pub fn run_flood(request: &FloodRequest, options: &FloodOptions) -> Result<FloodReport> {
    let before = memory_of(options.pid)?;
    let stop = Arc::new(AtomicBool::new(false));
    let peak = Arc::new(AtomicU64::new(before.rss_kib));
    let sampler = {
        let (stop, peak, pid, every) = (stop.clone(), peak.clone(), options.pid, options.sample_every);
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if let Ok(m) = memory_of(pid) {
                    peak.fetch_max(m.rss_kib, Ordering::Relaxed);
                }
                std::thread::sleep(every);
            }
        })
    };
    let flooding = Arc::new(AtomicBool::new(true));
    let bystander = {
        let (flooding, addr) = (flooding.clone(), options.kafka_addr.clone());
        std::thread::spawn(move || bystander(&addr, &flooding))
    };
    let started = Instant::now();
    let barrier = Arc::new(Barrier::new(options.connections));
    let addr = match request.door {
        Door::Kafka => options.kafka_addr.clone(),
        Door::Http => options
            .http_addr
            .clone()
            .context("an HTTP flood needs the HTTP listener's address")?,
    };
    let threads: Vec<_> = (0..options.connections)
        .map(|_| {
            let (request, barrier, addr) = (request.clone(), barrier.clone(), addr.clone());
            let (rounds, timeout) = (options.rounds, options.answer_timeout);
            std::thread::spawn(move || {
                let mut outcomes = Vec::with_capacity(rounds);
                let mut stream = connect(&addr, timeout).ok();
                barrier.wait();
                for _ in 0..rounds {
                    let s = match stream.take() {
                        Some(s) => s,
                        None => match connect(&addr, timeout) {
                            Ok(s) => s,
                            Err(_) => {
                                outcomes.push(Outcome::Failed);
                                continue;
                            }
                        },
                    };
                    let (outcome, keep) = send_one(s, &request);
                    outcomes.push(outcome);
                    stream = keep;
                }
                outcomes
            })
        })
        .collect();
    let mut report = FloodReport {
        request: request.name.clone(),
        connections: options.connections,
        rounds: options.rounds,
        request_bytes: request.bytes.len(),
        rss_before_kib: before.rss_kib,
        ..FloodReport::default()
    };
    for t in threads {
        for o in t.join().unwrap_or_default() {
            match o {
                Outcome::Answered => report.answered += 1,
                Outcome::Closed => report.closed += 1,
                Outcome::Failed => report.failed += 1,
            }
        }
    }
    report.elapsed_ms = started.elapsed().as_millis() as u64;
    flooding.store(false, Ordering::Relaxed);
    let (answered, failed, slowest) = bystander.join().unwrap_or((0, 1, Duration::ZERO));
    report.bystander_answered = answered;
    report.bystander_failed = failed;
    report.bystander_slowest_ms = slowest.as_millis() as u64;
    std::thread::sleep(options.settle);
    stop.store(true, Ordering::Relaxed);
    let _ = sampler.join();
    let after = memory_of(options.pid)?;
    report.rss_peak_kib = peak.load(Ordering::Relaxed).max(after.rss_kib);
    report.rss_after_kib = after.rss_kib;
    report.hwm_kib = after.hwm_kib;
    Ok(report)
}

fn connect(addr: &str, timeout: Duration) -> io::Result<TcpStream> {
    let s = TcpStream::connect(addr)?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    Ok(s)
}

/// Sends the request and reads its answer; gives the connection back if it can take another.
fn send_one(mut s: TcpStream, request: &FloodRequest) -> (Outcome, Option<TcpStream>) {
    if s.write_all(&request.bytes).and_then(|()| s.flush()).is_err() {
        // The broker may have answered and closed before taking everything (a refused frame).
        let _ = s.shutdown(Shutdown::Write);
        return match read_answer(&mut s, request.door) {
            Ok(true) => (Outcome::Answered, None),
            Ok(false) => (Outcome::Closed, None),
            Err(_) => (Outcome::Closed, None),
        };
    }
    match read_answer(&mut s, request.door) {
        Ok(true) => (Outcome::Answered, Some(s)),
        Ok(false) => (Outcome::Closed, None),
        Err(_) => (Outcome::Failed, None),
    }
}

/// Reads one answer: `Ok(true)` if one came, `Ok(false)` if the peer closed first.
fn read_answer(s: &mut TcpStream, door: Door) -> io::Result<bool> {
    match door {
        Door::Kafka => {
            let Some(prefix) = read_size_prefix(s)? else {
                return Ok(false);
            };
            let size = u32::from_be_bytes(prefix) as u64;
            let n = io::copy(&mut (&mut *s).take(size), &mut io::sink())?;
            if n < size {
                return Ok(false);
            }
            Ok(true)
        }
        Door::Http => {
            let mut reader = BufReader::new(s);
            let mut line = String::new();
            let mut length = 0u64;
            let mut first = true;
            loop {
                line.clear();
                if reader.read_line(&mut line)? == 0 {
                    return Ok(!first);
                }
                if first && !line.starts_with("HTTP/") {
                    return Ok(false);
                }
                first = false;
                let l = line.trim_end();
                if l.is_empty() {
                    break;
                }
                if let Some((k, v)) = l.split_once(':') {
                    if k.eq_ignore_ascii_case("content-length") {
                        length = v.trim().parse().unwrap_or(0);
                    }
                }
            }
            io::copy(&mut reader.take(length), &mut io::sink())?;
            Ok(true)
        }
    }
}

/// Asks for metadata every 100 ms while `flooding`; returns (answered, failed, slowest).
fn bystander(addr: &str, flooding: &AtomicBool) -> (u64, u64, Duration) {
    let (mut answered, mut failed, mut slowest) = (0, 0, Duration::ZERO);
    let options = ConnOptions {
        read_timeout: Duration::from_secs(60),
        ..ConnOptions::default()
    };
    let mut conn = None;
    while flooding.load(Ordering::Relaxed) {
        let started = Instant::now();
        let ok = (|| -> Result<()> {
            if conn.is_none() {
                conn = Some(RawConn::connect_with(addr, &options)?);
            }
            let c = conn.as_mut().context("connected")?;
            c.request(12, &MetadataRequest::default().with_topics(Some(Vec::new())))?;
            Ok(())
        })();
        match ok {
            Ok(()) => answered += 1,
            Err(_) => {
                failed += 1;
                conn = None;
            }
        }
        slowest = slowest.max(started.elapsed());
        std::thread::sleep(Duration::from_millis(100));
    }
    (answered, failed, slowest)
}
